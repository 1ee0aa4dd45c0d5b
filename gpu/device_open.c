/* Open a device by name, whichever backends this build has. Built in every
 * build (with or without CUDA), so programs can take a device name on their
 * command line without build-time guards of their own. */
#include <string.h>

#include "common/units.h"         /* defines: zo_parse_int */
#include "gpu/device.h"           /* defines: gpu_device_open, gpu_device_init_cpu */

#if defined(ZO_HAVE_CUDA) && ZO_HAVE_CUDA
#include <cuda_runtime_api.h>     /* defines: cudaGetDeviceCount */
#include "gpu/cuda/device_cuda.h" /* defines: gpu_device_init_cuda */
#endif

int gpu_cuda_device_count(void)
{
#if defined(ZO_HAVE_CUDA) && ZO_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver or no device: none usable */
        return 0;
    }
    return n;
#else
    return 0;
#endif
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
#if defined(ZO_HAVE_CUDA) && ZO_HAVE_CUDA
    gpu_cuda_options o = {.device = (int)ordinal, .capacity = capacity};
    return gpu_device_init_cuda(&o, out);
#else
    return zo_error(ZO_ERR_UNSUPPORTED, "gpu_device_open: \"%s\": this build has no CUDA "
                                        "backend (no nvcc at configure time)", name);
#endif
}
