#include "calibrate.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include <omp.h>

#include "common/clock.h"
#include "common/dtype.h"
#include "cpu_adam/cpu_adam.h" /* adam_update, adam_hparams_default */
#ifdef ZO_HAVE_NVME_ENGINE
#include "nvme/nvme_engine.h" /* nvme_engine_init, nvme_buf_alloc */
#include "nvme/nvme_store.h"  /* nvme_store_init, nvme_store_read */
#endif

void plan_calibrate_defaults(plan_calibrate_opts *o)
{
    memset(o, 0, sizeof *o);
    o->base = "h100-80gb";
    o->seconds = 0.5;
    o->nvme_bytes = 512u << 20;
}

void plan_calibrate_sizes(plan_calibrate_opts *o, uint64_t llc)
{
    uint64_t ws = PLAN_CALIBRATE_LLC_TIMES * llc;
    if (!o->stream_bytes) {
        uint64_t b = ws > (64u << 20) ? (ws + 4095) / 4096 * 4096 : 64u << 20;
        o->stream_bytes = (size_t)b;
    }
    if (!o->adam_params) {
        uint64_t n = (ws + 15) / 16; /* p, m, v, g fp32; w bf16 (18 bytes: past the cache too) */
        o->adam_params = (size_t)(n > (16u << 20) ? n : 16u << 20);
    }
}

uint64_t plan_calibrate_llc_bytes(void)
{
    uint64_t best = 0;
    for (int i = 0; i < 16; i++) {
        char path[96], type[32] = "";
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        FILE *f = fopen(path, "r");
        if (!f) break;
        int ok = fscanf(f, "%31s", type) == 1;
        fclose(f);
        if (!ok || !strcmp(type, "Instruction")) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!(f = fopen(path, "r"))) continue;
        unsigned long long v = 0;
        char unit = 0;
        int k = fscanf(f, "%llu%c", &v, &unit);
        fclose(f);
        if (k < 1) continue;
        uint64_t bytes = v * (unit == 'K' ? 1024ull : unit == 'M' ? 1024ull * 1024 : unit == 'G' ? 1ull << 30 : 1);
        if (bytes > best) best = bytes;
    }
#ifdef _SC_LEVEL3_CACHE_SIZE
    /* and glibc's, where larger: on an AMD EPYC guest sysfs gave its 32 MiB
     * L3 slice and sysconf 256 MiB (the package's), which the process may
     * also reach */
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    uint64_t glibc = l3 > 0 ? (uint64_t)l3 : l2 > 0 ? (uint64_t)l2 : 0;
    if (glibc > best) best = glibc;
#endif
    return best;
}

/* a[i] = b[i] + s * c[i]: 3 arrays of n floats, 3 x 4n bytes moved (the
 * write's read-for-ownership not counted, as STREAM does). */
static void triad(float *a, const float *b, const float *c, size_t n, float s, int threads)
{
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

static zo_status measure_bw(const plan_calibrate_opts *o, int threads, double *bw)
{
    size_t n = o->stream_bytes / sizeof(float);
    zo_status st = ZO_OK;
    float *a = aligned_alloc(64, n * sizeof(float));
    float *b = aligned_alloc(64, n * sizeof(float));
    float *c = aligned_alloc(64, n * sizeof(float));
    if (!a || !b || !c) {
        st = zo_error(ZO_ERR_NOMEM, "calibrate: %zu bytes for the bandwidth arrays", 3 * n * sizeof(float));
        goto out_free;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < n; i++) a[i] = 0, b[i] = 1, c[i] = 2; /* first touch per thread */
    double best = INFINITY, t_end = zo_now() + o->seconds;
    for (int rep = 0; rep < 3 || zo_now() < t_end; rep++) {
        double t0 = zo_now();
        triad(a, b, c, n, 0.5f, threads);
        double dt = zo_now() - t0;
        if (dt < best) best = dt;
        if (rep > 1000) break;
    }
    *bw = 3.0 * n * sizeof(float) / best;
    if (a[n / 2] != 2.0f) st = zo_error(ZO_ERR_INTERNAL, "calibrate: the triad computed %g, not 2", a[n / 2]);
out_free:
    free(a);
    free(b);
    free(c);
    return st;
}

/* AdamW as the runtime's host step runs it: the gradient is the fp32 sum
 * of the host's gradient sums (offload/grads.c), not the 16-bit gradient
 * the device computed, so 30 bytes a parameter move (ADAM_BYTES). */
static zo_status measure_adam(const plan_calibrate_opts *o, int threads, double *rate)
{
    size_t n = o->adam_params;
    zo_status st = ZO_OK;
    float *p = aligned_alloc(64, n * 4), *m = aligned_alloc(64, n * 4), *v = aligned_alloc(64, n * 4);
    float *g = aligned_alloc(64, n * 4);
    uint16_t *w = aligned_alloc(64, n * 2);
    if (!p || !m || !v || !g || !w) {
        st = zo_error(ZO_ERR_NOMEM, "calibrate: %zu bytes for the AdamW state", n * 18);
        goto out_free;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < n; i++) {
        p[i] = 0.01f * (float)(i % 97);
        m[i] = v[i] = 0;
        g[i] = 1e-3f * (float)(i % 13) - 6e-3f;
    }
    adam_hparams hp = adam_hparams_default();
    double best = INFINITY, t_end = zo_now() + o->seconds;
    for (int rep = 0; rep < 3 || zo_now() < t_end; rep++) {
        hp.step = rep + 1;
        double t0 = zo_now();
        st = adam_update(&hp, n, p, g, ZO_DTYPE_F32, m, v, w, ZO_DTYPE_BF16, threads);
        double dt = zo_now() - t0;
        if (st) {
            st = zo_error_wrap(st, "calibrate: adam_update");
            goto out_free;
        }
        if (dt < best) best = dt;
        if (rep > 1000) break;
    }
    *rate = (double)n / best;
out_free:
    free(p);
    free(m);
    free(v);
    free(g);
    free(w);
    return st;
}

#ifdef ZO_HAVE_NVME_ENGINE
#ifdef ZO_HAVE_NVME_ENGINE
/* A compute load for the cores while the disk is read (the busy read
 * rate): the triad on `threads` OpenMP threads, over and over, until told
 * to stop. Memory-bound, as a generated token's forward is. */
typedef struct busy_load {
    float *a, *b, *c;
    size_t n;
    int threads;
    atomic_int stop;
} busy_load;

static void *busy_run(void *arg)
{
    busy_load *l = arg;
    while (!atomic_load(&l->stop)) triad(l->a, l->b, l->c, l->n, 0.5f, l->threads);
    return NULL;
}

/* Read every tensor `passes` times: bytes/s of all of them over all the time. */
static zo_status read_passes(nvme_store_t *s, const int *ids, size_t n, size_t tensor, int passes, void *buf,
                             double *rd)
{
    zo_status st = ZO_OK;
    double t0 = zo_now();
    for (int pass = 0; pass < passes; pass++)
        for (size_t i = 0; i < n && !st; i++) st = nvme_store_read(s, ids[i], buf);
    *rd = (double)passes * (double)(n * tensor) / (zo_now() - t0);
    return st;
}
#endif

/* Write `nvme_bytes` to a swap store under dir as tensors of
 * `nvme_tensor_bytes`, then read them back one tensor at a time: the way the
 * runtime's weight store (offload/wstore.c) moves a block. Same engine
 * defaults (1 MiB requests, NVME_DEFAULT_QUEUE_DEPTH in flight, O_DIRECT),
 * same store (striped in the engine's block size, checksums verified on
 * each read); bytes/s of each, the read sustained over nvme_reads passes
 * (all their bytes over all their time: what a run reading the weights
 * token after token gets from a disk whose rate swings pass to pass, not
 * its best pass); then as many passes again while the triad runs on
 * `threads` threads (*rd_busy: the rate a read gets beside a forward, the
 * reading thread and its checksums sharing the cores with the compute).
 * The buffer is the engine's (4 KiB aligned), so every request is O_DIRECT:
 * the disk's rate, not the page cache's. */
static zo_status measure_nvme(const plan_calibrate_opts *o, int threads, double *rd, double *rd_busy, double *wr,
                              int *direct)
{
    nvme_engine_t *e = NULL;
    nvme_store_t *s = NULL;
    nvme_engine_config cfg = {0};
    void *buf = NULL;
    size_t tensor = o->nvme_tensor_bytes ? o->nvme_tensor_bytes : 64u << 20;
    tensor = (tensor + NVME_ALIGN - 1) / NVME_ALIGN * NVME_ALIGN;
    size_t n = (o->nvme_bytes + tensor - 1) / tensor;
    if (!n) n = 1;
    size_t *bytes = calloc(n, sizeof *bytes);
    int *ids = calloc(n, sizeof *ids);
    char(*names)[32] = calloc(n, sizeof *names);
    const char **np = calloc(n, sizeof *np);
    zo_status st = ZO_OK;
    if (!bytes || !ids || !names || !np) {
        st = zo_error(ZO_ERR_NOMEM, "calibrate: out of host memory");
        goto out_free;
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "calibrate.%zu", i);
        np[i] = names[i];
        bytes[i] = tensor;
    }
    if ((st = nvme_engine_init(&e, &cfg)) != ZO_OK) {
        st = zo_error_wrap(st, "calibrate: NVMe engine");
        goto out_free;
    }
    /* a file of its own, created exclusively and removed at the end (nvme_store.h) */
    const char *dirs[1] = {o->nvme_dir};
    nvme_store_config sc = {.dirs = dirs, .ndirs = 1, .prefix = "memplan-calibrate"};
    if ((st = nvme_store_init(&s, e, &sc)) != ZO_OK) goto out_engine;
    if ((st = nvme_store_add(s, n, np, bytes, ids)) != ZO_OK) goto out_store;
    *direct = nvme_file_is_direct(e, nvme_store_file_id(s, 0));
    if ((st = nvme_buf_alloc(e, tensor, &buf)) != ZO_OK) goto out_store;
    memset(buf, 0x5a, tensor);
    double t0 = zo_now();
    for (size_t i = 0; i < n && !st; i++) st = nvme_store_write(s, ids[i], buf);
    if (st) goto out_buf;
    *wr = (double)(n * tensor) / (zo_now() - t0);
    int passes = o->nvme_reads > 1 ? o->nvme_reads : 1;
    if ((st = read_passes(s, ids, n, tensor, passes, buf, rd)) != ZO_OK) goto out_buf;
    /* the same passes beside the triad on every thread */
    busy_load l = {.n = o->stream_bytes / sizeof(float), .threads = threads};
    l.a = aligned_alloc(64, l.n * sizeof(float));
    l.b = aligned_alloc(64, l.n * sizeof(float));
    l.c = aligned_alloc(64, l.n * sizeof(float));
    pthread_t load;
    int rc = -1;
    if (l.a && l.b && l.c) {
        for (size_t i = 0; i < l.n; i++) l.a[i] = 0, l.b[i] = 1, l.c[i] = 2;
        rc = pthread_create(&load, NULL, busy_run, &l);
    }
    if (rc) {
        st = zo_error(ZO_ERR_NOMEM, "calibrate: the compute load beside the NVMe reads (%zu bytes, a thread)",
                      3 * l.n * sizeof(float));
    } else {
        st = read_passes(s, ids, n, tensor, passes, buf, rd_busy);
        atomic_store(&l.stop, 1);
        pthread_join(load, NULL);
    }
    free(l.a);
    free(l.b);
    free(l.c);
    if (st) goto out_buf;
    if (((unsigned char *)buf)[tensor - 1] != 0x5a)
        st = zo_error(ZO_ERR_CHECKSUM, "calibrate: %s read back other bytes than written",
                      nvme_file_path(e, nvme_store_file_id(s, 0)));
out_buf:
    nvme_buf_free(e, buf);
out_store:
    nvme_store_free(s);
out_engine:
    nvme_engine_free(e);
out_free:
    free(bytes);
    free(ids);
    free(names);
    free(np);
    return st ? zo_error_wrap(st, "calibrate --nvme-dir %s", o->nvme_dir) : ZO_OK;
}
#endif

zo_status plan_calibrate_run(const plan_calibrate_opts *o, plan_hw *hw)
{
    zo_status st = plan_hw_find(o->base, hw);
    if (st) return zo_error_wrap(st, "calibrate --base");
    plan_calibrate_opts sized = *o;
    plan_calibrate_sizes(&sized, plan_calibrate_llc_bytes());
    o = &sized;
    if (o->adam_params < 1024 || o->stream_bytes < 4096 || !(o->seconds > 0))
        return zo_error(ZO_ERR_INVALID, "calibrate: --adam-params >= 1024, --stream-bytes >= 4096 "
                                        "and --seconds > 0");
    int threads = o->threads > 0 ? o->threads : omp_get_max_threads();
    struct sysinfo si;
    if (sysinfo(&si)) return zo_error(ZO_ERR_IO, "calibrate: sysinfo failed");
    char base_name[48];
    snprintf(base_name, sizeof base_name, "%s", hw->name);
    snprintf(hw->name, sizeof hw->name, "local");
    hw->gpus = hw->gpus_per_node = 1;
    hw->cpu_mem = (uint64_t)si.totalram * si.mem_unit;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    hw->cpu_cores = cores > 0 ? (int)cores : 1;
    if ((st = measure_bw(o, threads, &hw->cpu_mem_bw)) != ZO_OK) return st;
    if ((st = measure_adam(o, threads, &hw->cpu_adam_rate)) != ZO_OK) return st;
    /* one thread: the optimizer's rate on the threads a plan sets aside
     * (plan_hw_cpu_adam_rate_threads) */
    if ((st = measure_adam(o, 1, &hw->cpu_adam_thread_rate)) != ZO_OK) return st;
    if (o->nvme_dir) {
        struct statvfs vs;
        if (statvfs(o->nvme_dir, &vs))
            return zo_error(ZO_ERR_IO, "calibrate --nvme-dir %s: statvfs failed", o->nvme_dir);
        hw->nvme = (uint64_t)vs.f_bavail * vs.f_frsize;
    }
    char nvme_note[96];
    snprintf(nvme_note, sizeof nvme_note, "NVMe rates from %s (no --nvme-dir)", base_name);
    if (o->nvme_dir) {
#ifdef ZO_HAVE_NVME_ENGINE
        int direct = 0;
        if ((st = measure_nvme(o, threads, &hw->nvme_read_bw, &hw->nvme_read_bw_busy, &hw->nvme_write_bw,
                               &direct)) != ZO_OK)
            return st;
        snprintf(nvme_note, sizeof nvme_note, "NVMe rates measured in %s%s", o->nvme_dir,
                 direct ? " (O_DIRECT)" : " (buffered: the file system refused O_DIRECT)");
#else
        snprintf(nvme_note, sizeof nvme_note, "NVMe rates from %s (built without liburing)",
                 base_name);
#endif
    }
    hw->measured = 1;
    int gpu = access("/dev/nvidia0", F_OK) == 0;
    snprintf(hw->note, sizeof hw->note, "%s; %s",
             gpu ? "GPU present: its rates from the base preset (not measured)"
                 : "no GPU: GPU and PCIe rates from the base preset",
             nvme_note);
    return ZO_OK;
}
