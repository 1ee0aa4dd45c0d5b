/* Open a device by name, whichever backends this build has, and the CUDA
 * backend's module (gpu/cuda_module.h), opened the first time a CUDA device
 * is asked for. Built in every build, so programs can take a device name on
 * their command line without build-time guards of their own. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"    /* defines: zo_now */
#include "common/nf4.h"      /* defines: zo_nf4_code, zo_nf4_absmax_map, zo_nf4_layout_of */
#include "common/units.h"    /* defines: zo_parse_int */
#include "gpu/cuda_module.h" /* defines: gpu_cuda_module, ZO_CUDA_MODULE_SYMBOL */
#include "gpu/device.h"      /* defines: gpu_device_open, gpu_device_init_cpu */
#include "gpu/device_impl.h" /* defines: gpu_device_wrap */

#if defined(ZO_HAVE_CUDA) && ZO_HAVE_CUDA
/* What the module calls in the program (resolved through --export-dynamic):
 * named here so the linker keeps their objects in every program that can
 * open the module. */
__attribute__((used)) static void *const module_needs[] = {
    (void *)gpu_device_wrap,   (void *)gpu_mem_alloc,          (void *)gpu_mem_free,
    (void *)gpu_stream_create, (void *)gpu_stream_destroy,     (void *)gpu_stream_synchronize,
    (void *)gpu_event_record,  (void *)gpu_stream_wait_event,  (void *)zo_error,
    (void *)zo_error_wrap,     (void *)zo_dtype_size,          (void *)zo_now,
    (void *)zo_nf4_code,       (void *)zo_nf4_absmax_map,      (void *)zo_nf4_layout_of,
};

static struct {
    pthread_once_t once;
    const gpu_cuda_module *mod;
    char why[1024]; /* when it could not be opened */
} cuda_mod = {PTHREAD_ONCE_INIT, NULL, ""};

/* dlopen's message for `path`, or NULL when it opened (into *handle). */
static const char *try_open(const char *path, void **handle)
{
    *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    return *handle ? NULL : dlerror();
}

static void open_module(void)
{
    void *h;
    const char *env = getenv("ZO_CUDA_MODULE");
    const char *paths[4] = {env, NULL, NULL, NULL};
    char beside[600]; /* an installed tree moved elsewhere: <prefix>/bin/.. /lib/zoffload */
    if (!env) {
        paths[0] = ZO_CUDA_MODULE_BUILD; /* the build tree's */
        paths[1] = ZO_CUDA_MODULE_INSTALL; /* the configured install prefix's */
        ssize_t n = readlink("/proc/self/exe", beside, sizeof beside - 1);
        char *slash = n > 0 ? (beside[n] = '\0', strrchr(beside, '/')) : NULL;
        if (slash && (size_t)(slash - beside) + sizeof "/../" ZO_CUDA_MODULE_RELATIVE < sizeof beside) {
            strcpy(slash, "/../" ZO_CUDA_MODULE_RELATIVE);
            paths[2] = beside;
        }
        paths[3] = ZO_CUDA_MODULE_FILE; /* the loader's search path */
    }
    char tried[1024] = "";
    const gpu_cuda_module *m = NULL;
    for (int i = 0; i < 4 && !m; i++) {
        if (!paths[i]) continue;
        if (strchr(paths[i], '/') && access(paths[i], F_OK) != 0) { /* not there: the next */
            size_t len = strlen(tried);
            snprintf(tried + len, sizeof tried - len, "%s%s", len ? ", " : "", paths[i]);
            continue;
        }
        const char *err = try_open(paths[i], &h);
        if (err) { /* there but not loadable: its message names the library it lacks */
            snprintf(cuda_mod.why, sizeof cuda_mod.why, "the CUDA backend module %s cannot be loaded: %s",
                     paths[i], err);
            return;
        }
        m = dlsym(h, ZO_CUDA_MODULE_SYMBOL);
        if (!m || m->abi != ZO_CUDA_MODULE_ABI) {
            snprintf(cuda_mod.why, sizeof cuda_mod.why,
                     "the CUDA backend module %s is not this build's (%s; rebuild it, or point "
                     "ZO_CUDA_MODULE at the right one)",
                     paths[i], m ? "another interface version" : "no " ZO_CUDA_MODULE_SYMBOL);
            dlclose(h);
            return;
        }
    }
    if (!m) {
        snprintf(cuda_mod.why, sizeof cuda_mod.why, "the CUDA backend module %s was not found (tried %s%s)",
                 ZO_CUDA_MODULE_FILE, tried, env ? "" : ", then the loader's search path");
        return;
    }
    /* then the driver: the module's libraries (cudart) load without it, and
     * its absence is the common case on a machine without a GPU */
    if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) {
        snprintf(cuda_mod.why, sizeof cuda_mod.why,
                 "the NVIDIA driver's library libcuda.so.1 cannot be loaded (%s): is a GPU driver "
                 "installed?",
                 dlerror());
        return;
    }
    cuda_mod.mod = m;
}

zo_status gpu_cuda_module_get(const gpu_cuda_module **out)
{
    pthread_once(&cuda_mod.once, open_module);
    *out = cuda_mod.mod;
    if (cuda_mod.mod) return ZO_OK;
    return zo_error(ZO_ERR_UNSUPPORTED, "%s", cuda_mod.why);
}
#else
zo_status gpu_cuda_module_get(const gpu_cuda_module **out)
{
    *out = NULL;
    return zo_error(ZO_ERR_UNSUPPORTED, "this build has no CUDA backend (no nvcc at configure time)");
}
#endif

int gpu_cuda_device_count(void)
{
    const gpu_cuda_module *m;
    if (gpu_cuda_module_get(&m) != ZO_OK) {
        zo_clear_error(); /* no module, libraries or driver: no device usable */
        return 0;
    }
    return m->device_count();
}

zo_status gpu_device_init_cuda(const gpu_cuda_options *opt, gpu_device_t *out)
{
    if (!out) return zo_error(ZO_ERR_INVALID, "gpu_device_init_cuda: NULL output");
    *out = NULL;
    const gpu_cuda_module *m;
    zo_status st = gpu_cuda_module_get(&m);
    if (st != ZO_OK) return zo_error_wrap(st, "gpu_device_init_cuda(cuda:%d)", opt ? opt->device : 0);
    return m->open(opt, out);
}

zo_status gpu_device_open(const char *name, size_t capacity, gpu_device_t *out)
{
    if (!name || !out) return zo_error(ZO_ERR_INVALID, "gpu_device_open: NULL argument");
    *out = NULL;
    if (strcmp(name, "cpu") == 0) {
        gpu_cpu_options o = {.capacity = capacity, .n_threads = 0};
        return gpu_device_init_cpu(&o, out);
    }
    if (strncmp(name, "cuda", 4) != 0 || (name[4] != '\0' && name[4] != ':'))
        return zo_error(ZO_ERR_INVALID, "gpu_device_open: unknown device \"%s\" (expected cpu, "
                                        "cuda or cuda:N)", name);
    long ordinal = 0;
    if (name[4] == ':') {
        zo_status s = zo_parse_int(name + 5, "device ordinal", 0, 1 << 20, &ordinal);
        if (s != ZO_OK) return zo_error_wrap(s, "gpu_device_open(\"%s\")", name);
    }
    const gpu_cuda_module *m;
    zo_status st = gpu_cuda_module_get(&m);
    if (st != ZO_OK) return zo_error_wrap(st, "gpu_device_open(\"%s\")", name);
    gpu_cuda_options o = {.device = (int)ordinal, .capacity = capacity};
    return m->open(&o, out);
}
