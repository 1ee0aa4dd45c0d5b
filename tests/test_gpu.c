/* Tests for gpu/: the CPU backend's memory pool (capacity, high-water mark),
 * streams and events (real ordering across worker threads), determinism,
 * argument and sticky errors, and every op: forward against a float64
 * reference written here from the definitions, backward against central
 * finite differences of that reference in float64. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/nf4.h"  /* defines: zo_nf4_layout_of, zo_nf4_code, zo_nf4_absmax_map */
#include "gpu/device.h" /* defines: gpu_device_init_cpu, gpu_gemm, ... */
#include "gpu/ops_cpu.h" /* defines: cpu_gemm_naive, gpu_cpu_inject_faults */
#include "cpu_adam/cpu_adam.h" /* defines: adam_update_impl (the reference of gpu_adam_update) */
#include "tests/support/check.h" /* defines: check_close_f64 */

static gpu_device_t dev;
static gpu_stream_t S;

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double urand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static double *drand_array(size_t n, double scale)
{
    double *p = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) p[i] = urand() * scale;
    return p;
}

/* Round values to what `t` can store, so references see the same inputs. */
static void round_to(double *p, size_t n, zo_dtype t)
{
    for (size_t i = 0; i < n; i++) {
        float f = (float)p[i];
        uint16_t h;
        if (t == ZO_DTYPE_F16) {
            h = zo_f32_to_f16(f);
            f = zo_f16_to_f32(h);
        } else if (t == ZO_DTYPE_BF16) {
            h = zo_f32_to_bf16(f);
            f = zo_bf16_to_f32(h);
        }
        p[i] = f;
    }
}

/* A device buffer holding h[0..n) stored as `t`. */
static gpu_tensor dput(const double *h, size_t n, zo_dtype t)
{
    void *d = NULL;
    assert_int_equal(gpu_mem_alloc(dev, n * zo_dtype_size(t), &d), ZO_OK);
    void *tmp = malloc(n * zo_dtype_size(t));
    for (size_t i = 0; i < n; i++) zo_store_f32(tmp, t, i, (float)h[i]);
    assert_int_equal(gpu_memcpy_async(S, d, tmp, n * zo_dtype_size(t), GPU_COPY_HOST_TO_DEVICE), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
    free(tmp);
    return gpu_t(d, t);
}

static gpu_tensor dzeros(size_t n, zo_dtype t)
{
    void *d = NULL;
    assert_int_equal(gpu_mem_alloc(dev, n * zo_dtype_size(t), &d), ZO_OK);
    assert_int_equal(gpu_memset_async(S, d, 0, n * zo_dtype_size(t)), ZO_OK);
    return gpu_t(d, t);
}

/* Synchronize, then copy a device buffer back as doubles. */
static double *dget(gpu_tensor x, size_t n)
{
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
    void *tmp = malloc(n * zo_dtype_size(x.dtype));
    assert_int_equal(gpu_memcpy_async(S, tmp, x.data, n * zo_dtype_size(x.dtype), GPU_COPY_DEVICE_TO_HOST), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
    double *h = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) h[i] = zo_load_f32(tmp, x.dtype, i);
    free(tmp);
    return h;
}

static void dfree(gpu_tensor x) { gpu_mem_free(dev, x.data); }

/* ---- finite differences -----------------------------------------------------------
 * For out = f(in[0..n_in)), the gradient of L = sum_i g[i] * out[i] with
 * respect to input k by central differences in float64. */
typedef void (*ref_fn)(double *const *in, double *out, const void *cfg);

static double *fd_grad(ref_fn f, const void *cfg, double *const *in, int k, size_t in_n,
                       size_t out_n, const double *g)
{
    const double h = 1e-6;
    double *grad = malloc(in_n * sizeof(double)), *o1 = malloc(out_n * sizeof(double));
    double *o2 = malloc(out_n * sizeof(double));
    for (size_t e = 0; e < in_n; e++) {
        double save = in[k][e];
        in[k][e] = save + h;
        f(in, o1, cfg);
        in[k][e] = save - h;
        f(in, o2, cfg);
        in[k][e] = save;
        double s = 0.0;
        for (size_t i = 0; i < out_n; i++) s += g[i] * (o1[i] - o2[i]);
        grad[e] = s / (2 * h);
    }
    free(o1);
    free(o2);
    return grad;
}

/* ---- setup ------------------------------------------------------------------------ */

static int setup(void **state)
{
    (void)state;
    gpu_cpu_options opt = {.capacity = 0, .n_threads = 2};
    if (gpu_device_init_cpu(&opt, &dev) != ZO_OK) return -1;
    if (gpu_stream_create(dev, &S) != ZO_OK) return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    gpu_stream_destroy(S);
    gpu_mem_stats ms;
    gpu_mem_get_stats(dev, &ms);
    int leaked = ms.n_allocs != 0;
    if (leaked) printf("  %zu device allocations leaked\n", ms.n_allocs);
    gpu_device_free(dev);
    return leaked ? -1 : 0;
}

/* ---- memory ------------------------------------------------------------------------- */

static void test_capacity(void **state)
{
    (void)state;
    gpu_device_t d;
    gpu_cpu_options opt = {.capacity = 1 << 20, .n_threads = 1};
    assert_int_equal(gpu_device_init_cpu(&opt, &d), ZO_OK);
    void *a, *b, *c;
    assert_int_equal(gpu_mem_alloc(d, 600 << 10, &a), ZO_OK);
    assert_int_equal(gpu_mem_alloc(d, 300 << 10, &b), ZO_OK);
    zo_clear_error();
    assert_int_equal(gpu_mem_alloc(d, 200 << 10, &c), ZO_ERR_CAPACITY);
    assert_null(c);
    assert_non_null(strstr(zo_last_error(), "capacity"));
    gpu_mem_stats ms;
    gpu_mem_get_stats(d, &ms);
    assert_int_equal(ms.capacity, 1 << 20);
    assert_int_equal(ms.in_use, 900 << 10);
    assert_int_equal(ms.high_water, 900 << 10);
    assert_true(ms.high_water <= ms.capacity);
    gpu_mem_free(d, a);
    assert_int_equal(gpu_mem_alloc(d, 200 << 10, &c), ZO_OK); /* fits after the free */
    gpu_mem_get_stats(d, &ms);
    assert_int_equal(ms.in_use, 500 << 10);
    assert_int_equal(ms.high_water, 900 << 10);
    gpu_mem_reset_peak(d);
    gpu_mem_get_stats(d, &ms);
    assert_int_equal(ms.high_water, 500 << 10);
    /* rounding to the 256-byte granule is counted */
    void *e;
    assert_int_equal(gpu_mem_alloc(d, 1, &e), ZO_OK);
    gpu_mem_get_stats(d, &ms);
    assert_int_equal(ms.in_use, (500 << 10) + 256);
    assert_int_equal((uintptr_t)e % 256, 0);
    /* a stream-ordered free happens after the queued work */
    gpu_stream_t s;
    assert_int_equal(gpu_stream_create(d, &s), ZO_OK);
    assert_int_equal(gpu_memset_async(s, b, 7, 300 << 10), ZO_OK);
    assert_int_equal(gpu_mem_free_async(d, b, s), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
    gpu_mem_get_stats(d, &ms);
    assert_int_equal(ms.in_use, (200 << 10) + 256);
    gpu_mem_free(d, c);
    gpu_mem_free(d, e);
    void *p;
    assert_int_equal(gpu_host_alloc(d, 1000, &p), ZO_OK);
    gpu_mem_get_stats(d, &ms);
    assert_int_equal(ms.host_pinned, 1024);
    assert_int_equal(ms.in_use, 0);
    gpu_host_free(d, p);
    assert_int_equal(gpu_mem_alloc(d, 0, &p), ZO_ERR_INVALID);
    gpu_device_free(d); /* destroys the stream too */
}

/* Pages of [p, p + bytes) the kernel has not backed yet (mincore). */
static size_t pages_missing(const void *p, size_t bytes)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p / pg * pg, hi = ((uintptr_t)p + bytes + pg - 1) / pg * pg;
    size_t n = (hi - lo) / pg, missing = 0;
    unsigned char *v = malloc(n);
    assert_non_null(v);
    assert_int_equal(mincore((void *)lo, hi - lo, v), 0);
    for (size_t i = 0; i < n; i++) missing += !(v[i] & 1);
    free(v);
    return missing;
}

/* Device and pinned memory are backed when allocated, as cudaMalloc's and
 * cudaHostAlloc's are, not page by page at their first use (issue 29: the
 * faults landed in the first token's time). 40 MiB: past malloc's largest
 * mmap threshold, so each is a fresh mapping no earlier use has touched. */
static void test_memory_committed(void **state)
{
    (void)state;
    gpu_device_t d;
    gpu_cpu_options opt = {.n_threads = 1};
    assert_int_equal(gpu_device_init_cpu(&opt, &d), ZO_OK);
    size_t bytes = 40u << 20;
    void *dm, *hm;
    assert_int_equal(gpu_mem_alloc(d, bytes, &dm), ZO_OK);
    assert_int_equal(gpu_host_alloc(d, bytes, &hm), ZO_OK);
    assert_int_equal(pages_missing(dm, bytes), 0);
    assert_int_equal(pages_missing(hm, bytes), 0);
    gpu_mem_free(d, dm);
    gpu_host_free(d, hm);
    gpu_device_free(d);
}

/* Many threads allocate and free at once; the high-water mark never passes
 * the capacity and everything is returned. */
static void test_capacity_concurrent(void **state)
{
    (void)state;
    gpu_device_t d;
    gpu_cpu_options opt = {.capacity = 64 * 4096, .n_threads = 1};
    assert_int_equal(gpu_device_init_cpu(&opt, &d), ZO_OK);
    int fails = 0;
#pragma omp parallel for num_threads(4) reduction(+ : fails)
    for (int i = 0; i < 4000; i++) {
        void *p;
        zo_status st = gpu_mem_alloc(d, 4096 * (1 + i % 7), &p);
        if (st == ZO_OK)
            gpu_mem_free(d, p);
        else
            fails += st != ZO_ERR_CAPACITY;
    }
    assert_int_equal(fails, 0);
    gpu_mem_stats ms;
    gpu_mem_get_stats(d, &ms);
    assert_true(ms.high_water <= ms.capacity);
    assert_int_equal(ms.in_use, 0);
    gpu_device_free(d);
}

/* ---- streams and events ---------------------------------------------------------------- */

/* A GEMM on stream A fills C; stream B waits on an event recorded after it
 * and copies C to the host. Without the wait the copy would run at once on
 * B's worker and see stale data, so each round checks the ordering. */
static void test_events_order(void **state)
{
    (void)state;
    gpu_stream_t A, B;
    gpu_event_t ev;
    assert_int_equal(gpu_stream_create(dev, &A), ZO_OK);
    assert_int_equal(gpu_stream_create(dev, &B), ZO_OK);
    assert_int_equal(gpu_event_create(dev, &ev), ZO_OK);
    assert_int_equal(gpu_event_query(ev), 1); /* never recorded */
    const int m = 192, k = 192, n = 192;
    double *ha = drand_array((size_t)m * k, 1.0);
    gpu_tensor a = dput(ha, (size_t)m * k, ZO_DTYPE_F32);
    gpu_tensor ones = dzeros((size_t)k * n, ZO_DTYPE_F32);
    gpu_tensor c = dzeros((size_t)m * n, ZO_DTYPE_F32);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
    float *host = NULL;
    assert_int_equal(gpu_host_alloc(dev, (size_t)m * n * sizeof(float), (void **)&host), ZO_OK);
    int wrong = 0;
    for (int round = 0; round < 30; round++) {
        /* B = round * I-like: every column of op(B) is `round`, so
         * C[i,j] = round * sum_p A[i,p] */
        float v = (float)(round + 1);
        float *hb = malloc((size_t)k * n * sizeof(float));
        for (size_t i = 0; i < (size_t)k * n; i++) hb[i] = v;
        assert_int_equal(gpu_memcpy_async(A, ones.data, hb, (size_t)k * n * sizeof(float), GPU_COPY_HOST_TO_DEVICE), ZO_OK);
        gpu_gemm_desc g = {.m = m, .n = n, .k = k, .alpha = 1.0f, .beta = 0.0f, .a = a,
                           .b = ones, .c = c, .lda = k, .ldb = n, .ldc = n};
        assert_int_equal(gpu_gemm(A, &g), ZO_OK);
        assert_int_equal(gpu_gemm(A, &g), ZO_OK); /* twice: make A's work last */
        assert_int_equal(gpu_event_record(ev, A), ZO_OK);
        assert_int_equal(gpu_stream_wait_event(B, ev), ZO_OK);
        assert_int_equal(gpu_memcpy_async(B, host, c.data, (size_t)m * n * sizeof(float), GPU_COPY_DEVICE_TO_HOST), ZO_OK);
        assert_int_equal(gpu_stream_synchronize(B), ZO_OK);
        assert_int_equal(gpu_event_query(ev), 1);
        for (int i = 0; i < m; i++) {
            double s = 0.0;
            for (int p = 0; p < k; p++) s += ha[(size_t)i * k + p];
            if (fabs(host[(size_t)i * n + (i % n)] - v * s) > 1e-3 * (1 + fabs(v * s))) wrong++;
        }
        assert_int_equal(gpu_stream_synchronize(A), ZO_OK);
        free(hb);
    }
    assert_int_equal(wrong, 0);
    /* synchronizing on the event waits for the work recorded before it */
    assert_int_equal(gpu_event_record(ev, A), ZO_OK);
    assert_int_equal(gpu_event_synchronize(ev), ZO_OK);
    assert_int_equal(gpu_event_query(ev), 1);
    gpu_host_free(dev, host);
    dfree(a);
    dfree(ones);
    dfree(c);
    free(ha);
    gpu_event_destroy(ev);
    gpu_stream_destroy(A);
    gpu_stream_destroy(B);
}

/* gpu_launch_host_func: the function runs after the work enqueued before it
 * (it sees the GEMM's result) and work enqueued after it waits until it
 * returns (the memset has not run while the function blocks). */
typedef struct host_fn_ctx {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    const float *c;
    float seen;
    int entered, release;
} host_fn_ctx;

static void host_fn_block(void *arg)
{
    host_fn_ctx *h = arg;
    pthread_mutex_lock(&h->lock);
    h->seen = h->c[0];
    h->entered = 1;
    pthread_cond_broadcast(&h->cond);
    while (!h->release) pthread_cond_wait(&h->cond, &h->lock);
    pthread_mutex_unlock(&h->lock);
}

static void test_host_func(void **state)
{
    (void)state;
    const int m = 128, k = 128, n = 128;
    double *ha = drand_array((size_t)m * k, 1.0), *hb = drand_array((size_t)k * n, 1.0);
    gpu_tensor a = dput(ha, (size_t)m * k, ZO_DTYPE_F32), b = dput(hb, (size_t)k * n, ZO_DTYPE_F32);
    gpu_tensor c = dzeros((size_t)m * n, ZO_DTYPE_F32), flag = dzeros(16, ZO_DTYPE_F32);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
    host_fn_ctx h = {.c = c.data};
    pthread_mutex_init(&h.lock, NULL);
    pthread_cond_init(&h.cond, NULL);
    gpu_gemm_desc g = {.m = m, .n = n, .k = k, .alpha = 1.0f, .beta = 0.0f, .a = a, .b = b,
                       .c = c, .lda = k, .ldb = n, .ldc = n};
    assert_int_equal(gpu_gemm(S, &g), ZO_OK);
    assert_int_equal(gpu_launch_host_func(S, host_fn_block, &h), ZO_OK);
    assert_int_equal(gpu_memset_async(S, flag.data, 0x7f, 16 * sizeof(float)), ZO_OK);
    pthread_mutex_lock(&h.lock);
    while (!h.entered) pthread_cond_wait(&h.cond, &h.lock);
    unsigned char first;
    memcpy(&first, flag.data, 1);
    assert_int_equal(first, 0); /* the memset waits behind the blocked function */
    h.release = 1;
    pthread_cond_broadcast(&h.cond);
    pthread_mutex_unlock(&h.lock);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
    memcpy(&first, flag.data, 1);
    assert_int_equal(first, 0x7f);
    double ref = 0.0;
    for (int p = 0; p < k; p++) ref += ha[p] * hb[(size_t)p * n];
    assert_true(fabs(h.seen - ref) <= 1e-4 * (1.0 + fabs(ref)));
    assert_int_equal(gpu_launch_host_func(S, NULL, NULL), ZO_ERR_INVALID);
    pthread_cond_destroy(&h.cond);
    pthread_mutex_destroy(&h.lock);
    dfree(a);
    dfree(b);
    dfree(c);
    dfree(flag);
    free(ha);
    free(hb);
}

/* A round trip between two streams: B writes x[0] and records e1; C waits
 * for e1, writes x[1], records e2; B waits for e2 and reads both. B's work
 * before its wait must run first (or C would wait forever), and B's read
 * after it must see C's write. */
static void test_streams_concurrent(void **state)
{
    (void)state;
    gpu_stream_t B, C;
    gpu_event_t e1, e2;
    assert_int_equal(gpu_stream_create(dev, &B), ZO_OK);
    assert_int_equal(gpu_stream_create(dev, &C), ZO_OK);
    assert_int_equal(gpu_event_create(dev, &e1), ZO_OK);
    assert_int_equal(gpu_event_create(dev, &e2), ZO_OK);
    int32_t *buf;
    assert_int_equal(gpu_mem_alloc(dev, 64, (void **)&buf), ZO_OK);
    for (int round = 0; round < 50; round++) {
        int32_t one = 1, two = 2, got[2];
        /* B: x[0]=1; record e1; wait e2; copy x to host */
        assert_int_equal(gpu_memcpy_async(B, &buf[0], &one, 4, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
        assert_int_equal(gpu_event_record(e1, B), ZO_OK);
        /* C: wait e1; x[1] = x[0] + 1 via a copy from a host value; record e2 */
        assert_int_equal(gpu_stream_wait_event(C, e1), ZO_OK);
        assert_int_equal(gpu_memcpy_async(C, &buf[1], &two, 4, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
        assert_int_equal(gpu_event_record(e2, C), ZO_OK);
        assert_int_equal(gpu_stream_wait_event(B, e2), ZO_OK);
        assert_int_equal(gpu_memcpy_async(B, got, buf, 8, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
        assert_int_equal(gpu_stream_synchronize(B), ZO_OK);
        assert_int_equal(got[0], 1);
        assert_int_equal(got[1], 2);
        assert_int_equal(gpu_memset_async(B, buf, 0, 64), ZO_OK);
        assert_int_equal(gpu_stream_synchronize(B), ZO_OK);
        assert_int_equal(gpu_stream_synchronize(C), ZO_OK);
    }
    gpu_mem_free(dev, buf);
    gpu_event_destroy(e1);
    gpu_event_destroy(e2);
    gpu_stream_destroy(B);
    gpu_stream_destroy(C);
}

static void test_errors(void **state)
{
    (void)state;
    zo_clear_error();
    gpu_gemm_desc g = {.m = 4, .n = 4, .k = 4, .lda = 2, .ldb = 4, .ldc = 4, .alpha = 1};
    float x[16];
    g.a = g.b = g.c = gpu_t(x, ZO_DTYPE_F32);
    assert_int_equal(gpu_gemm(S, &g), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "lda"));
    gpu_attn_desc ad = {.b = 1, .t = 4, .hq = 3, .hkv = 2, .d = 4};
    float lse[12];
    assert_int_equal(gpu_attention_forward(S, &ad, gpu_t(x, ZO_DTYPE_F32), lse, gpu_t(x, ZO_DTYPE_F32)), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "hkv"));
    /* the sinks' gradient without sinks; a sinks' gradient asked of the cached attention */
    ad.hq = 2, ad.hkv = 1, ad.t = 2, ad.dsinks = lse;
    assert_int_equal(gpu_attention_backward(S, &ad, gpu_t(x, ZO_DTYPE_F32), gpu_t(x, ZO_DTYPE_F32),
                                            gpu_t(x, ZO_DTYPE_F32), gpu_t(x, ZO_DTYPE_F32), lse),
                     ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "dsinks without sinks"));
    ad.sinks = lse;
    int32_t pos0 = 0;
    assert_int_equal(gpu_attention_cached(S, &ad, gpu_t(x, ZO_DTYPE_F32), gpu_t(x, ZO_DTYPE_F32),
                                          gpu_t(x, ZO_DTYPE_F32), gpu_t(x, ZO_DTYPE_F32), &pos0, 2),
                     ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "gpu_attention_cached: dsinks"));
    ad.dsinks = NULL;
    /* heads that do not fit in a row: named with the row stride */
    assert_int_equal(gpu_head_norm_forward(S, gpu_t(x, ZO_DTYPE_F32), 7, gpu_t(NULL, 0), NULL,
                                           gpu_t(x, ZO_DTYPE_F32), 0, 2, 2, 4, 1e-6f, 0),
                     ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "ldx 7 < heads*d 8"));
    /* a weight neither shared nor a row a head; a kind neither RMSNorm nor LayerNorm */
    assert_int_equal(gpu_head_norm_forward(S, gpu_t(x, ZO_DTYPE_F32), 8, gpu_t(NULL, 0), NULL, gpu_t(x, ZO_DTYPE_F32),
                                           3, 2, 2, 4, 1e-6f, 1),
                     ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "w_stride 3 is neither 0"));
    assert_int_equal(gpu_head_norm_backward(S, gpu_t(x, ZO_DTYPE_F32), 8, gpu_t(NULL, 0), gpu_t(x, ZO_DTYPE_F32),
                                            gpu_t(x, ZO_DTYPE_F32), 4, lse, 2, 2, 4, 2),
                     ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "centered 2 must be 0 or 1"));
    assert_int_equal(gpu_gelu_forward(NULL, gpu_t(x, 0), gpu_t(x, 0), 4, 0), ZO_ERR_INVALID);
    assert_int_equal(gpu_cast(S, gpu_t(x, (zo_dtype)9), gpu_t(x, 0), 4), ZO_ERR_INVALID);
    /* an id out of range is found while running: a sticky stream error */
    int32_t *tok;
    assert_int_equal(gpu_mem_alloc(dev, 16, (void **)&tok), ZO_OK);
    int32_t ids[2] = {1, 7};
    assert_int_equal(gpu_memcpy_async(S, tok, ids, 8, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
    gpu_tensor wte = dzeros(4 * 4, ZO_DTYPE_F32), out = dzeros(2 * 4, ZO_DTYPE_F32);
    assert_int_equal(gpu_embedding_forward(S, out, tok, wte, gpu_t(NULL, 0), 2, 2, 4, 4), ZO_OK);
    zo_clear_error();
    assert_int_equal(gpu_stream_synchronize(S), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "tokens[1] = 7"));
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK); /* reported once */
    gpu_mem_free(dev, tok);
    dfree(wte);
    dfree(out);
}

/* ---- GEMM ------------------------------------------------------------------------------- */

typedef struct gemm_cfg {
    int ta, tb, m, n, k, lda, ldb, ldc, batch;
    long sa, sb, sc;
    double alpha, beta;
} gemm_cfg;

/* in[0] = A, in[1] = B, in[2] = C (old); out = new C (batch * sc). */
static void gemm_ref(double *const *in, double *out, const void *cfgp)
{
    const gemm_cfg *g = cfgp;
    memcpy(out, in[2], (size_t)g->batch * g->sc * sizeof(double));
    for (int bi = 0; bi < g->batch; bi++) {
        const double *A = in[0] + bi * g->sa, *B = in[1] + bi * g->sb, *C = in[2] + bi * g->sc;
        double *O = out + bi * g->sc;
        for (int i = 0; i < g->m; i++)
            for (int j = 0; j < g->n; j++) {
                double s = 0.0;
                for (int p = 0; p < g->k; p++) {
                    double a = g->ta ? A[(size_t)p * g->lda + i] : A[(size_t)i * g->lda + p];
                    double b = g->tb ? B[(size_t)j * g->ldb + p] : B[(size_t)p * g->ldb + j];
                    s += a * b;
                }
                O[(size_t)i * g->ldc + j] = g->alpha * s + g->beta * C[(size_t)i * g->ldc + j];
            }
    }
}

static int run_gemm_case(gemm_cfg g, zo_dtype dt, int naive)
{
    size_t a_rows = g.ta ? g.k : g.m, b_rows = g.tb ? g.n : g.k;
    if (!g.batch) g.batch = 1;
    if (!g.sa) g.sa = (long)(a_rows * g.lda);
    if (!g.sb) g.sb = (long)(b_rows * g.ldb);
    if (!g.sc) g.sc = (long)g.m * g.ldc;
    size_t na = g.batch * g.sa, nb = g.batch * g.sb, nc = g.batch * g.sc;
    double *A = drand_array(na, 1.0), *B = drand_array(nb, 1.0), *C = drand_array(nc, 1.0);
    round_to(A, na, dt);
    round_to(B, nb, dt);
    round_to(C, nc, dt);
    double *want = malloc(nc * sizeof(double));
    double *in[3] = {A, B, C};
    gemm_ref(in, want, &g);
    gpu_tensor a = dput(A, na, dt), b = dput(B, nb, dt), c = dput(C, nc, dt);
    gpu_gemm_desc d = {.trans_a = g.ta, .trans_b = g.tb, .m = g.m, .n = g.n, .k = g.k,
                       .alpha = (float)g.alpha, .beta = (float)g.beta, .a = a, .b = b, .c = c,
                       .lda = g.lda, .ldb = g.ldb, .ldc = g.ldc, .batch = g.batch,
                       .stride_a = g.sa, .stride_b = g.sb, .stride_c = g.sc};
    if (naive) {
        assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
        cpu_gemm_naive(&d);
    } else {
        assert_int_equal(gpu_gemm(S, &d), ZO_OK);
    }
    double *got = dget(c, nc);
    /* padding columns between n and ldc must stay as they were */
    double tol = dt == ZO_DTYPE_F32 ? 2e-5 * sqrt((double)g.k) : dt == ZO_DTYPE_F16 ? 2e-3 : 1e-2;
    int bad = check_close_f64("gemm", got, want, nc, tol, tol);
    free(A), free(B), free(C), free(want), free(got);
    dfree(a), dfree(b), dfree(c);
    return bad;
}

static void test_gemm(void **state)
{
    (void)state;
    int bad = 0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            /* edges of every blocking level: m > MC, n > NC, k > KC */
            gemm_cfg g = {.ta = ta, .tb = tb, .m = 197, .n = 270, .k = 300, .alpha = 1.0};
            g.lda = (ta ? g.m : g.k) + 3;
            g.ldb = (tb ? g.k : g.n) + 1;
            g.ldc = g.n + 2;
            bad += run_gemm_case(g, ZO_DTYPE_F32, 0);
            gemm_cfg s = {.ta = ta, .tb = tb, .m = 5, .n = 3, .k = 7, .alpha = 0.5, .beta = -2.0};
            s.lda = ta ? s.m : s.k;
            s.ldb = tb ? s.k : s.n;
            s.ldc = s.n;
            bad += run_gemm_case(s, ZO_DTYPE_F32, 0);
            bad += run_gemm_case(s, ZO_DTYPE_F32, 1);
        }
    /* strided batched, as attention uses it */
    gemm_cfg b = {.ta = 0, .tb = 1, .m = 17, .n = 19, .k = 16, .lda = 16, .ldb = 16, .ldc = 19,
                  .batch = 5, .alpha = 0.25, .beta = 1.0};
    bad += run_gemm_case(b, ZO_DTYPE_F32, 0);
    bad += run_gemm_case(b, ZO_DTYPE_F32, 1);
    /* 16-bit storage, fp32 accumulation */
    gemm_cfg h = {.ta = 0, .tb = 1, .m = 33, .n = 40, .k = 64, .lda = 64, .ldb = 64, .ldc = 40,
                  .alpha = 1.0};
    bad += run_gemm_case(h, ZO_DTYPE_F16, 0);
    bad += run_gemm_case(h, ZO_DTYPE_BF16, 0);
    assert_int_equal(bad, 0);
}

/* x to TF32's 11 significant bits (10 stored), to nearest with ties away
 * from zero: the significand scaled to [1024, 2048) and rounded by round(),
 * for values in fp32's normal range (the cases' are). */
static double tf32_of(double x)
{
    int e;
    double m = frexp(x, &e); /* x = m 2^e, 0.5 <= |m| < 1 */
    return ldexp(round(ldexp(m, 11)), e - 11);
}

/* A device opened with gpu_cpu_options.tf32: fp32 products round A and B
 * to TF32 and sum in fp32, C in fp32. Against the double loop over the
 * inputs rounded here (tf32_of), and away from the unrounded product by
 * far more than the tolerance (the rounding did happen). 16-bit storage
 * is left as it was. */
static void test_gemm_tf32(void **state)
{
    (void)state;
    gpu_device_t dev0 = dev;
    gpu_stream_t s0 = S;
    gpu_cpu_options opt = {.n_threads = 2, .tf32 = 1};
    assert_int_equal(gpu_device_init_cpu(&opt, &dev), ZO_OK);
    assert_int_equal(gpu_stream_create(dev, &S), ZO_OK);
    assert_true(cpu_tf32_round(1.0f + 0x1p-11f) == 1.0f + 0x1p-10f); /* a tie, away from 0 */
    assert_true(cpu_tf32_round(-(1.0f + 0x1p-11f)) == -(1.0f + 0x1p-10f));
    assert_true(cpu_tf32_round(1.0f + 0x1p-11f - 0x1p-23f) == 1.0f);
    assert_true(cpu_tf32_round(0x1.fffffep127f) == INFINITY);
    assert_true(isnan(cpu_tf32_round(NAN)));
    const gemm_cfg cases[] = {
        {.ta = 0, .tb = 1, .m = 67, .n = 45, .k = 300, .lda = 300, .ldb = 300, .ldc = 45,
         .alpha = 1.0},
        {.ta = 1, .tb = 0, .m = 20, .n = 33, .k = 129, .lda = 21, .ldb = 35, .ldc = 34,
         .alpha = 0.5, .beta = -2.0},
        {.ta = 0, .tb = 1, .m = 17, .n = 19, .k = 16, .lda = 16, .ldb = 16, .ldc = 19,
         .batch = 5, .alpha = 0.25, .beta = 1.0},
    };
    int bad = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        gemm_cfg g = cases[ci];
        if (!g.batch) g.batch = 1;
        g.sa = (long)((g.ta ? g.k : g.m) * g.lda);
        g.sb = (long)((g.tb ? g.n : g.k) * g.ldb);
        g.sc = (long)g.m * g.ldc;
        size_t na = g.batch * g.sa, nb = g.batch * g.sb, nc = g.batch * g.sc;
        double *A = drand_array(na, 1.0), *B = drand_array(nb, 1.0), *C = drand_array(nc, 1.0);
        round_to(A, na, ZO_DTYPE_F32);
        round_to(B, nb, ZO_DTYPE_F32);
        round_to(C, nc, ZO_DTYPE_F32);
        double *At = malloc(na * sizeof(double)), *Bt = malloc(nb * sizeof(double));
        for (size_t i = 0; i < na; i++) At[i] = tf32_of(A[i]);
        for (size_t i = 0; i < nb; i++) Bt[i] = tf32_of(B[i]);
        double *want = malloc(nc * sizeof(double)), *exact = malloc(nc * sizeof(double));
        double *in_t[3] = {At, Bt, C}, *in_x[3] = {A, B, C};
        gemm_ref(in_t, want, &g);
        gemm_ref(in_x, exact, &g);
        gpu_tensor a = dput(A, na, ZO_DTYPE_F32), b = dput(B, nb, ZO_DTYPE_F32);
        gpu_tensor c = dput(C, nc, ZO_DTYPE_F32);
        gpu_gemm_desc d = {.trans_a = g.ta, .trans_b = g.tb, .m = g.m, .n = g.n, .k = g.k,
                           .alpha = (float)g.alpha, .beta = (float)g.beta, .a = a, .b = b,
                           .c = c, .lda = g.lda, .ldb = g.ldb, .ldc = g.ldc, .batch = g.batch,
                           .stride_a = g.sa, .stride_b = g.sb, .stride_c = g.sc};
        assert_int_equal(gpu_gemm(S, &d), ZO_OK);
        double *got = dget(c, nc);
        /* fp32 sums of k products: a few ulp of the sum's size times
         * sqrt(k); TF32 moves a product by ~2^-11 of it, 2^13 times more */
        const double tol = 4e-6 * sqrt((double)g.k);
        bad += check_close_f64("gemm tf32", got, want, nc, tol, tol);
        double off = 0.0; /* how far TF32 moved the product */
        for (size_t i = 0; i < nc; i++) off = fmax(off, fabs(got[i] - exact[i]));
        if (off < 10 * tol) printf("  case %zu: %.3g from the unrounded product\n", ci, off);
        bad += off < 10 * tol;
        free(A), free(B), free(C), free(At), free(Bt), free(want), free(exact), free(got);
        dfree(a), dfree(b), dfree(c);
    }
    gpu_stream_destroy(S);
    gpu_device_free(dev);
    dev = dev0, S = s0;
    assert_int_equal(bad, 0);
}

/* The backward of C = A . B^T (a Linear layer) written as two GEMMs:
 * dA = dC . B, dB = dC^T . A, against finite differences. */
static void test_gemm_backward(void **state)
{
    (void)state;
    const int m = 6, n = 5, k = 7;
    gemm_cfg g = {.ta = 0, .tb = 1, .m = m, .n = n, .k = k, .lda = k, .ldb = k, .ldc = n,
                  .batch = 1, .sa = m * k, .sb = n * k, .sc = m * n, .alpha = 1.0, .beta = 0.0};
    double *A = drand_array(m * k, 1.0), *B = drand_array(n * k, 1.0), *C = calloc(m * n, 8);
    double *G = drand_array(m * n, 1.0);
    double *in[3] = {A, B, C};
    double *wa = fd_grad(gemm_ref, &g, in, 0, m * k, m * n, G);
    double *wb = fd_grad(gemm_ref, &g, in, 1, n * k, m * n, G);
    gpu_tensor a = dput(A, m * k, 0), b = dput(B, n * k, 0), dc = dput(G, m * n, 0);
    gpu_tensor da = dzeros(m * k, 0), db = dzeros(n * k, 0);
    gpu_gemm_desc d1 = {.m = m, .n = k, .k = n, .alpha = 1, .a = dc, .b = b, .c = da,
                        .lda = n, .ldb = k, .ldc = k};
    gpu_gemm_desc d2 = {.trans_a = 1, .m = n, .n = k, .k = m, .alpha = 1, .a = dc, .b = a,
                        .c = db, .lda = n, .ldb = k, .ldc = k};
    assert_int_equal(gpu_gemm(S, &d1), ZO_OK);
    assert_int_equal(gpu_gemm(S, &d2), ZO_OK);
    double *ga = dget(da, m * k), *gb = dget(db, n * k);
    assert_int_equal(check_close_f64("dA", ga, wa, m * k, 1e-5, 1e-4), 0);
    assert_int_equal(check_close_f64("dB", gb, wb, n * k, 1e-5, 1e-4), 0);
    free(A), free(B), free(C), free(G), free(wa), free(wb), free(ga), free(gb);
    dfree(a), dfree(b), dfree(dc), dfree(da), dfree(db);
}

/* ---- bias ------------------------------------------------------------------------------------ */

static void test_bias(void **state)
{
    (void)state;
    const int n = 9, c = 70, ld = 75;
    double *Y = drand_array(n * ld, 1.0), *Bv = drand_array(c, 1.0), *G = drand_array(n * ld, 1.0);
    gpu_tensor y = dput(Y, n * ld, 0), b = dput(Bv, c, 0), g = dput(G, n * ld, 0);
    gpu_tensor db = dput(Bv, c, 0); /* accumulates onto its old contents */
    assert_int_equal(gpu_bias_forward(S, y, b, n, c, ld), ZO_OK);
    assert_int_equal(gpu_bias_backward(S, db, g, n, c, ld), ZO_OK);
    double *gy = dget(y, n * ld), *gdb = dget(db, c);
    double *wy = malloc(n * ld * sizeof(double)), *wdb = malloc(c * sizeof(double));
    for (int r = 0; r < n; r++)
        for (int j = 0; j < ld; j++) wy[r * ld + j] = Y[r * ld + j] + (j < c ? Bv[j] : 0.0);
    for (int j = 0; j < c; j++) {
        wdb[j] = Bv[j];
        for (int r = 0; r < n; r++) wdb[j] += G[r * ld + j];
    }
    assert_int_equal(check_close_f64("bias y", gy, wy, n * ld, 1e-6, 1e-6), 0);
    assert_int_equal(check_close_f64("bias db", gdb, wdb, c, 1e-5, 1e-5), 0);
    free(Y), free(Bv), free(G), free(gy), free(gdb), free(wy), free(wdb);
    dfree(y), dfree(b), dfree(g), dfree(db);
}

/* ---- norms ------------------------------------------------------------------------------------- */

typedef struct norm_cfg {
    int n, c, rms;
    double eps;
} norm_cfg;

/* in: x [n,c], w [c], b [c] (LayerNorm only); out: y [n,c] */
static void norm_ref(double *const *in, double *out, const void *cfgp)
{
    const norm_cfg *g = cfgp;
    for (int r = 0; r < g->n; r++) {
        const double *x = in[0] + (size_t)r * g->c;
        double m = 0.0, v = 0.0;
        if (!g->rms) {
            for (int j = 0; j < g->c; j++) m += x[j];
            m /= g->c;
        }
        for (int j = 0; j < g->c; j++) v += (x[j] - m) * (x[j] - m);
        double rs = 1.0 / sqrt(v / g->c + g->eps);
        for (int j = 0; j < g->c; j++)
            out[(size_t)r * g->c + j] = (x[j] - m) * rs * in[1][j] + (g->rms ? 0.0 : in[2][j]);
    }
}

static void run_norm(int rms, zo_dtype dt)
{
    norm_cfg g = {.n = 7, .c = 83, .rms = rms, .eps = 1e-5};
    size_t nc = (size_t)g.n * g.c;
    double *X = drand_array(nc, 2.0), *W = drand_array(g.c, 1.0), *Bv = drand_array(g.c, 1.0);
    double *G = drand_array(nc, 1.0), *DX0 = drand_array(nc, 1.0);
    for (size_t i = 0; i < nc; i++) X[i] += 0.5; /* a non-zero mean */
    round_to(X, nc, dt), round_to(W, g.c, dt), round_to(Bv, g.c, dt), round_to(G, nc, dt);
    round_to(DX0, nc, dt);
    double *in[3] = {X, W, Bv};
    double *wy = malloc(nc * sizeof(double));
    norm_ref(in, wy, &g);
    double *wdx = fd_grad(norm_ref, &g, in, 0, nc, nc, G);
    double *wdw = fd_grad(norm_ref, &g, in, 1, g.c, nc, G);
    double *wdb = rms ? NULL : fd_grad(norm_ref, &g, in, 2, g.c, nc, G);
    for (size_t i = 0; i < nc; i++) wdx[i] += DX0[i]; /* dx += */

    gpu_tensor x = dput(X, nc, dt), w = dput(W, g.c, dt), b = dput(Bv, g.c, dt);
    gpu_tensor y = dzeros(nc, dt), dy = dput(G, nc, dt), dx = dput(DX0, nc, dt);
    gpu_tensor dw = dzeros(g.c, dt), db = dzeros(g.c, dt);
    float *mean, *rstd;
    assert_int_equal(gpu_mem_alloc(dev, g.n * 4, (void **)&mean), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, g.n * 4, (void **)&rstd), ZO_OK);
    if (rms) {
        assert_int_equal(gpu_rmsnorm_forward(S, y, rstd, x, w, g.n, g.c, (float)g.eps), ZO_OK);
        assert_int_equal(gpu_rmsnorm_backward(S, dx, dw, dy, x, w, rstd, g.n, g.c), ZO_OK);
    } else {
        assert_int_equal(gpu_layernorm_forward(S, y, mean, rstd, x, w, b, g.n, g.c, (float)g.eps), ZO_OK);
        assert_int_equal(gpu_layernorm_backward(S, dx, dw, db, dy, x, w, mean, rstd, g.n, g.c), ZO_OK);
    }
    double *gy = dget(y, nc), *gdx = dget(dx, nc), *gdw = dget(dw, g.c), *gdb = dget(db, g.c);
    double tol = dt == ZO_DTYPE_F32 ? 1e-4 : dt == ZO_DTYPE_F16 ? 4e-3 : 3e-2;
    assert_int_equal(check_close_f64("norm y", gy, wy, nc, tol, tol), 0);
    assert_int_equal(check_close_f64("norm dx", gdx, wdx, nc, tol, tol), 0);
    assert_int_equal(check_close_f64("norm dw", gdw, wdw, g.c, tol * 4, tol), 0);
    if (!rms) assert_int_equal(check_close_f64("norm db", gdb, wdb, g.c, tol * 4, tol), 0);
    free(X), free(W), free(Bv), free(G), free(DX0), free(wy), free(wdx), free(wdw), free(wdb);
    free(gy), free(gdx), free(gdw), free(gdb);
    dfree(x), dfree(w), dfree(b), dfree(y), dfree(dy), dfree(dx), dfree(dw), dfree(db);
    gpu_mem_free(dev, mean);
    gpu_mem_free(dev, rstd);
}

static void test_layernorm(void **state)
{
    (void)state;
    run_norm(0, ZO_DTYPE_F32);
    run_norm(0, ZO_DTYPE_BF16);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    run_norm(1, ZO_DTYPE_F32);
    run_norm(1, ZO_DTYPE_F16);
}

/* ---- attention ------------------------------------------------------------------------------------ */

/* in[0] = qkv [b,t,(hq+2hkv)d]; out [b,t,hq*d]; the full causal softmax. */
static void attn_ref(double *const *in, double *out, const void *cfgp)
{
    const gpu_attn_desc *a = cfgp;
    int ld = (a->hq + 2 * a->hkv) * a->d, grp = a->hq / a->hkv;
    double *p = malloc((size_t)a->t * sizeof(double));
    for (int b = 0; b < a->b; b++)
        for (int h = 0; h < a->hq; h++) {
            int g = h / grp;
            for (int i = 0; i < a->t; i++) {
                const double *q = in[0] + ((size_t)b * a->t + i) * ld + (size_t)h * a->d;
                double mx = -INFINITY, l = 0.0;
                for (int j = 0; j <= i; j++) {
                    const double *k = in[0] + ((size_t)b * a->t + j) * ld + (size_t)(a->hq + g) * a->d;
                    double s = 0.0;
                    for (int e = 0; e < a->d; e++) s += q[e] * k[e];
                    p[j] = s / sqrt((double)a->d);
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = 0; j <= i; j++) l += (p[j] = exp(p[j] - mx));
                double *o = out + ((size_t)b * a->t + i) * a->hq * a->d + (size_t)h * a->d;
                for (int e = 0; e < a->d; e++) {
                    double s = 0.0;
                    for (int j = 0; j <= i; j++)
                        s += p[j] / l *
                             in[0][((size_t)b * a->t + j) * ld + (size_t)(a->hq + a->hkv + g) * a->d + e];
                    o[e] = s;
                }
            }
        }
    free(p);
}

static void run_attention(gpu_attn_desc a, zo_dtype dt)
{
    size_t nq = (size_t)a.b * a.t * (a.hq + 2 * a.hkv) * a.d, no = (size_t)a.b * a.t * a.hq * a.d;
    double *Q = drand_array(nq, 1.5), *G = drand_array(no, 1.0);
    round_to(Q, nq, dt);
    round_to(G, no, dt);
    double *in[1] = {Q};
    double *wo = malloc(no * sizeof(double));
    attn_ref(in, wo, &a);
    double *wdq = fd_grad(attn_ref, &a, in, 0, nq, no, G);
    gpu_tensor qkv = dput(Q, nq, dt), out = dzeros(no, dt), dout = dput(G, no, dt);
    gpu_tensor dqkv = dzeros(nq, dt);
    float *lse;
    assert_int_equal(gpu_mem_alloc(dev, (size_t)a.b * a.hq * a.t * 4, (void **)&lse), ZO_OK);
    assert_int_equal(gpu_attention_forward(S, &a, out, lse, qkv), ZO_OK);
    assert_int_equal(gpu_attention_backward(S, &a, dqkv, dout, qkv, out, lse), ZO_OK);
    double *go = dget(out, no), *gdq = dget(dqkv, nq);
    double tol = dt == ZO_DTYPE_F32 ? 1e-4 : 1e-2;
    assert_int_equal(check_close_f64("attn out", go, wo, no, tol, tol), 0);
    assert_int_equal(check_close_f64("attn dqkv", gdq, wdq, nq, tol, tol), 0);
    free(Q), free(G), free(wo), free(wdq), free(go), free(gdq);
    dfree(qkv), dfree(out), dfree(dout), dfree(dqkv);
    gpu_mem_free(dev, lse);
}

static void test_attention(void **state)
{
    (void)state;
    run_attention((gpu_attn_desc){.b = 2, .t = 7, .hq = 2, .hkv = 2, .d = 8}, ZO_DTYPE_F32);
    run_attention((gpu_attn_desc){.b = 2, .t = 6, .hq = 4, .hkv = 2, .d = 4}, ZO_DTYPE_F32); /* GQA */
    run_attention((gpu_attn_desc){.b = 1, .t = 5, .hq = 3, .hkv = 1, .d = 6}, ZO_DTYPE_F32); /* MQA */
    run_attention((gpu_attn_desc){.b = 1, .t = 5, .hq = 2, .hkv = 1, .d = 8}, ZO_DTYPE_BF16);
    /* several query blocks (48 rows each), a head width off the 32-column panels */
    run_attention((gpu_attn_desc){.b = 1, .t = 101, .hq = 2, .hkv = 1, .d = 12}, ZO_DTYPE_F32);
}

/* ---- RoPE ------------------------------------------------------------------------------------------ */

typedef struct rope_cfg {
    int n, t, heads, d, ld, pos0;
    double theta, scale; /* scale: cos and sin's factor (longrope's attention scaling) */
} rope_cfg;

static void rope_ref(double *const *in, double *out, const void *cfgp)
{
    const rope_cfg *g = cfgp;
    memcpy(out, in[0], (size_t)g->n * g->ld * sizeof(double));
    int half = g->d / 2;
    for (int r = 0; r < g->n; r++)
        for (int h = 0; h < g->heads; h++) {
            const double *x = in[0] + (size_t)r * g->ld + (size_t)h * g->d;
            double *y = out + (size_t)r * g->ld + (size_t)h * g->d;
            for (int i = 0; i < g->d; i++) {
                /* HF: x * cos + rotate_half(x) * sin, rotate_half = cat(-x2, x1);
                 * frequency index i mod d/2 */
                double f = pow(g->theta, -2.0 * (i % half) / g->d);
                double ang = (g->pos0 + r % g->t) * f;
                double rot = i < half ? -x[i + half] : x[i - half];
                y[i] = g->scale * (x[i] * cos(ang) + rot * sin(ang));
            }
        }
}

static void test_rope(void **state)
{
    (void)state;
    /* scale 1, and a longrope attention scaling */
    for (int k = 0; k < 2; k++) {
        rope_cfg g = {.n = 10, .t = 5, .heads = 3, .d = 8, .ld = 40, .pos0 = 2, .theta = 10000.0,
                      .scale = k ? 1.190238 : 1.0};
        size_t n = (size_t)g.n * g.ld;
        double *X = drand_array(n, 1.0), *G = drand_array(n, 1.0);
        double *in[1] = {X};
        double *wy = malloc(n * sizeof(double));
        rope_ref(in, wy, &g);
        double *wdx = fd_grad(rope_ref, &g, in, 0, n, n, G);
        /* the backward acts only on the rotated heads; elements after them
         * pass their gradient through unchanged, which the caller keeps */
        gpu_tensor x = dput(X, n, 0), dx = dput(G, n, 0);
        assert_int_equal(gpu_rope_forward(S, x, g.n, g.t, g.heads, g.d, g.ld, g.d, (float)g.theta, g.pos0, NULL,
                                          (float)g.scale), ZO_OK);
        assert_int_equal(gpu_rope_backward(S, dx, g.n, g.t, g.heads, g.d, g.ld, g.d, (float)g.theta, g.pos0, NULL,
                                           (float)g.scale), ZO_OK);
        double *gy = dget(x, n), *gdx = dget(dx, n);
        assert_int_equal(check_close_f64("rope y", gy, wy, n, 1e-5, 1e-5), 0);
        assert_int_equal(check_close_f64("rope dx", gdx, wdx, n, 1e-5, 1e-5), 0);
        free(X), free(G), free(wy), free(wdx), free(gy), free(gdx);
        dfree(x), dfree(dx);
    }
}

/* ---- activations -------------------------------------------------------------------------------------- */

static size_t act_n = 300;

static void gelu_ref(double *const *in, double *out, const void *cfg)
{
    (void)cfg;
    for (size_t i = 0; i < act_n; i++) {
        double x = in[0][i];
        out[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    }
}

/* GELU's erf form: 0.5 x (1 + erf(x / sqrt 2)) */
static void gelu_erf_ref(double *const *in, double *out, const void *cfg)
{
    (void)cfg;
    for (size_t i = 0; i < act_n; i++) out[i] = 0.5 * in[0][i] * (1.0 + erf(in[0][i] / sqrt(2.0)));
}

static void swiglu_ref(double *const *in, double *out, const void *cfg)
{
    (void)cfg;
    for (size_t i = 0; i < act_n; i++) {
        double g = in[0][i];
        out[i] = g / (1.0 + exp(-g)) * in[1][i];
    }
}

/* The tanh form (exact 0), then the erf form (exact 1), against finite
 * differences of double-precision references. */
static void test_gelu(void **state)
{
    (void)state;
    for (int exact = 0; exact < 2; exact++) {
    size_t n = act_n;
    void (*ref)(double *const *, double *, const void *) = exact ? gelu_erf_ref : gelu_ref;
    double *X = drand_array(n, 4.0), *G = drand_array(n, 1.0);
    double *in[1] = {X};
    double *wy = malloc(n * sizeof(double));
    ref(in, wy, NULL);
    double *wdx = fd_grad(ref, NULL, in, 0, n, n, G);
    gpu_tensor x = dput(X, n, 0), y = dzeros(n, 0), dy = dput(G, n, 0), dx = dzeros(n, 0);
    assert_int_equal(gpu_gelu_forward(S, y, x, n, exact), ZO_OK);
    assert_int_equal(gpu_gelu_backward(S, dx, dy, x, n, exact), ZO_OK);
    double *gy = dget(y, n), *gdx = dget(dx, n);
    assert_int_equal(check_close_f64("gelu y", gy, wy, n, 1e-6, 1e-5), 0);
    assert_int_equal(check_close_f64("gelu dx", gdx, wdx, n, 1e-6, 1e-5), 0);
    free(X), free(G), free(wy), free(wdx), free(gy), free(gdx);
    dfree(x), dfree(y), dfree(dy), dfree(dx);
    }
}

static void test_swiglu(void **state)
{
    (void)state;
    size_t n = act_n;
    double *Gt = drand_array(n, 4.0), *U = drand_array(n, 2.0), *G = drand_array(n, 1.0);
    double *in[2] = {Gt, U};
    double *wy = malloc(n * sizeof(double));
    swiglu_ref(in, wy, NULL);
    double *wdg = fd_grad(swiglu_ref, NULL, in, 0, n, n, G);
    double *wdu = fd_grad(swiglu_ref, NULL, in, 1, n, n, G);
    gpu_tensor gt = dput(Gt, n, 0), u = dput(U, n, 0), y = dzeros(n, 0), dy = dput(G, n, 0);
    gpu_tensor dg = dzeros(n, 0), du = dzeros(n, 0);
    assert_int_equal(gpu_swiglu_forward(S, y, gt, u, n, 0), ZO_OK);
    assert_int_equal(gpu_swiglu_backward(S, dg, du, dy, gt, u, n, 0), ZO_OK);
    double *gy = dget(y, n), *gdg = dget(dg, n), *gdu = dget(du, n);
    assert_int_equal(check_close_f64("swiglu y", gy, wy, n, 1e-6, 1e-5), 0);
    assert_int_equal(check_close_f64("swiglu dgate", gdg, wdg, n, 1e-6, 1e-5), 0);
    assert_int_equal(check_close_f64("swiglu dup", gdu, wdu, n, 1e-6, 1e-5), 0);
    free(Gt), free(U), free(G), free(wy), free(wdg), free(wdu), free(gy), free(gdg), free(gdu);
    dfree(gt), dfree(u), dfree(y), dfree(dy), dfree(dg), dfree(du);
}

/* ---- embedding and cross-entropy ------------------------------------------------------------------------ */

typedef struct emb_cfg {
    int n, t, c, vocab;
    const int32_t *tok;
} emb_cfg;

static void emb_ref(double *const *in, double *out, const void *cfgp)
{
    const emb_cfg *g = cfgp;
    for (int r = 0; r < g->n; r++)
        for (int j = 0; j < g->c; j++)
            out[(size_t)r * g->c + j] =
                in[0][(size_t)g->tok[r] * g->c + j] + in[1][(size_t)(r % g->t) * g->c + j];
}

static void test_embedding(void **state)
{
    (void)state;
    int32_t tok[12] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}; /* repeats exercise the scatter-add */
    emb_cfg g = {.n = 12, .t = 4, .c = 70, .vocab = 10, .tok = tok};
    size_t nw = (size_t)g.vocab * g.c, np = (size_t)g.t * g.c, no = (size_t)g.n * g.c;
    double *W = drand_array(nw, 1.0), *P = drand_array(np, 1.0), *G = drand_array(no, 1.0);
    double *in[2] = {W, P};
    double *wo = malloc(no * sizeof(double));
    emb_ref(in, wo, &g);
    double *wdw = fd_grad(emb_ref, &g, in, 0, nw, no, G);
    double *wdp = fd_grad(emb_ref, &g, in, 1, np, no, G);
    int32_t *dtok;
    assert_int_equal(gpu_mem_alloc(dev, sizeof tok, (void **)&dtok), ZO_OK);
    assert_int_equal(gpu_memcpy_async(S, dtok, tok, sizeof tok, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
    gpu_tensor w = dput(W, nw, 0), p = dput(P, np, 0), out = dzeros(no, 0), dout = dput(G, no, 0);
    gpu_tensor dw = dzeros(nw, 0), dp = dzeros(np, 0);
    assert_int_equal(gpu_embedding_forward(S, out, dtok, w, p, g.n, g.t, g.c, g.vocab), ZO_OK);
    assert_int_equal(gpu_embedding_backward(S, dw, dp, dout, dtok, g.n, g.t, g.c, g.vocab), ZO_OK);
    double *go = dget(out, no), *gdw = dget(dw, nw), *gdp = dget(dp, np);
    assert_int_equal(check_close_f64("emb out", go, wo, no, 1e-6, 1e-6), 0);
    assert_int_equal(check_close_f64("emb dwte", gdw, wdw, nw, 1e-5, 1e-5), 0);
    assert_int_equal(check_close_f64("emb dwpe", gdp, wdp, np, 1e-5, 1e-5), 0);
    free(W), free(P), free(G), free(wo), free(wdw), free(wdp), free(go), free(gdw), free(gdp);
    dfree(w), dfree(p), dfree(out), dfree(dout), dfree(dw), dfree(dp);
    gpu_mem_free(dev, dtok);
}

typedef struct ce_cfg {
    int n, v;
    const int32_t *tgt;
} ce_cfg;

static void ce_ref(double *const *in, double *out, const void *cfgp)
{
    const ce_cfg *g = cfgp;
    for (int r = 0; r < g->n; r++) {
        const double *x = in[0] + (size_t)r * g->v;
        if (g->tgt[r] < 0) {
            out[r] = 0.0;
            continue;
        }
        double s = 0.0;
        for (int j = 0; j < g->v; j++) s += exp(x[j]);
        out[r] = log(s) - x[g->tgt[r]];
    }
}

static void test_cross_entropy(void **state)
{
    (void)state;
    int32_t tgt[6] = {0, 49, 7, -1, 13, 13};
    ce_cfg g = {.n = 6, .v = 50, .tgt = tgt};
    size_t nl = (size_t)g.n * g.v;
    double *L = drand_array(nl, 5.0);
    double *in[1] = {L};
    double wl[6], G[6];
    ce_ref(in, wl, &g);
    for (int r = 0; r < g.n; r++) G[r] = 1.0 / 5; /* mean over the 5 counted rows */
    double *wd = fd_grad(ce_ref, &g, in, 0, nl, g.n, G);
    int32_t *dt;
    float *losses;
    assert_int_equal(gpu_mem_alloc(dev, sizeof tgt, (void **)&dt), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, g.n * 4, (void **)&losses), ZO_OK);
    assert_int_equal(gpu_memcpy_async(S, dt, tgt, sizeof tgt, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
    gpu_tensor lg = dput(L, nl, 0);
    assert_int_equal(gpu_cross_entropy_forward(S, losses, lg, dt, g.n, g.v), ZO_OK);
    assert_int_equal(gpu_cross_entropy_backward(S, lg, lg, dt, 1.0f / 5, g.n, g.v), ZO_OK); /* in place */
    double *gl = dget(gpu_t(losses, ZO_DTYPE_F32), g.n), *gd = dget(lg, nl);
    assert_int_equal(check_close_f64("ce loss", gl, wl, g.n, 1e-5, 1e-5), 0);
    assert_int_equal(check_close_f64("ce dlogits", gd, wd, nl, 1e-6, 1e-4), 0);
    free(L), free(wd), free(gl), free(gd);
    dfree(lg);
    gpu_mem_free(dev, dt);
    gpu_mem_free(dev, losses);
}

/* ---- elementwise and reductions ----------------------------------------------------------------------------- */

static void test_elementwise(void **state)
{
    (void)state;
    size_t n = 100003;
    double *A = drand_array(n, 3.0), *B = drand_array(n, 3.0);
    round_to(A, n, ZO_DTYPE_BF16);
    gpu_tensor a = dput(A, n, ZO_DTYPE_BF16), b = dput(B, n, ZO_DTYPE_F32);
    gpu_tensor y = dzeros(n, ZO_DTYPE_F32), h = dzeros(n, ZO_DTYPE_F16);
    /* y = a + b (mixed storage), then y *= 0.5, then h = (fp16) y */
    assert_int_equal(gpu_add(S, y, a, b, n), ZO_OK);
    assert_int_equal(gpu_scale(S, y, 0.5f, n), ZO_OK);
    assert_int_equal(gpu_cast(S, h, y, n), ZO_OK);
    double *gy = dget(y, n), *gh = dget(h, n);
    double *wy = malloc(n * sizeof(double)), *wh = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        wy[i] = (A[i] + (float)B[i]) * 0.5;
        wh[i] = wy[i];
    }
    round_to(wh, n, ZO_DTYPE_F16);
    assert_int_equal(check_close_f64("add+scale", gy, wy, n, 1e-6, 1e-6), 0);
    assert_int_equal(check_close_f64("cast f16", gh, wh, n, 1e-6, 1e-3), 0);
    /* sum of squares accumulates onto *sum */
    double *sum;
    int32_t *flag;
    assert_int_equal(gpu_mem_alloc(dev, 8, (void **)&sum), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, 4, (void **)&flag), ZO_OK);
    double one = 1.0;
    assert_int_equal(gpu_memcpy_async(S, sum, &one, 8, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
    assert_int_equal(gpu_memset_async(S, flag, 0, 4), ZO_OK);
    assert_int_equal(gpu_sum_squares(S, sum, b, n), ZO_OK);
    assert_int_equal(gpu_check_finite(S, flag, b, n), ZO_OK);
    double want = 1.0;
    for (size_t i = 0; i < n; i++) want += (double)(float)B[i] * (float)B[i];
    double got_sum;
    int32_t got_flag;
    assert_int_equal(gpu_memcpy_async(S, &got_sum, sum, 8, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
    assert_int_equal(gpu_memcpy_async(S, &got_flag, flag, 4, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
    assert_true(fabs(got_sum - want) <= 1e-6 * want);
    assert_int_equal(got_flag, 0);
    /* one inf in fp16 storage, one nan in bf16 storage */
    double big = 1e6; /* overflows fp16 to inf */
    gpu_tensor h1 = dput(&big, 1, ZO_DTYPE_F16);
    double nanv = NAN;
    gpu_tensor b1 = dput(&nanv, 1, ZO_DTYPE_BF16);
    assert_int_equal(gpu_check_finite(S, flag, h, n), ZO_OK);
    assert_int_equal(gpu_memcpy_async(S, &got_flag, flag, 4, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
    assert_int_equal(got_flag, 0);
    assert_int_equal(gpu_check_finite(S, flag, h1, 1), ZO_OK);
    assert_int_equal(gpu_memcpy_async(S, &got_flag, flag, 4, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
    assert_int_equal(got_flag, 1);
    assert_int_equal(gpu_memset_async(S, flag, 0, 4), ZO_OK);
    assert_int_equal(gpu_check_finite(S, flag, b1, 1), ZO_OK);
    assert_int_equal(gpu_memcpy_async(S, &got_flag, flag, 4, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
    assert_int_equal(got_flag, 1);
    free(A), free(B), free(gy), free(gh), free(wy), free(wh);
    dfree(a), dfree(b), dfree(y), dfree(h), dfree(h1), dfree(b1);
    gpu_mem_free(dev, sum);
    gpu_mem_free(dev, flag);
}

/* An NF4 tensor of random bytes (any codes, any 8-bit constants) with
 * positive scales and an offset, as a device buffer; `host` keeps its bytes. */
static void *nf4_random(size_t n, uint8_t **host)
{
    zo_nf4_layout L;
    zo_nf4_layout_of(n, &L);
    uint8_t *h = malloc(L.bytes);
    for (size_t i = 0; i < L.bytes; i++) h[i] = (uint8_t)(urand() * 128 + 128);
    float offset = 0.75f, s;
    memcpy(h, &offset, 4);
    for (uint64_t j = 0; j < L.n_blocks2; j++) {
        s = (float)(0.25 + 0.2 * urand());
        memcpy(h + L.off_scale2 + 4 * j, &s, 4);
    }
    void *d;
    assert_int_equal(gpu_mem_alloc(dev, L.bytes, &d), ZO_OK);
    assert_int_equal(gpu_memcpy_async(S, d, h, L.bytes, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
    *host = h;
    return d;
}

/* gpu_nf4_dequantize against the definition, bit for bit in every output
 * type: w = code[c] * (map[absq] * scale2 + offset), fp32, then rounded. */
static void test_nf4_dequantize(void **state)
{
    (void)state;
    float map[256];
    zo_nf4_absmax_map(map);
    size_t ns[] = {1, 63, 64, 2 * 64 * 256 + 77};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        size_t n = ns[k];
        uint8_t *h;
        void *q = nf4_random(n, &h);
        zo_nf4_layout L;
        zo_nf4_layout_of(n, &L);
        for (int t = 0; t < ZO_DTYPE_COUNT; t++) {
            gpu_tensor out = dzeros(n, (zo_dtype)t);
            assert_int_equal(gpu_nf4_dequantize(S, out, q, n), ZO_OK);
            size_t es = zo_dtype_size((zo_dtype)t);
            uint8_t *got = malloc(n * es), *want = malloc(n * es);
            assert_int_equal(gpu_memcpy_async(S, got, out.data, n * es, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
            assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
            for (size_t i = 0; i < n; i++) {
                size_t b = i / 64;
                float offset, s;
                memcpy(&offset, h, 4);
                memcpy(&s, h + L.off_scale2 + 4 * (b / 256), 4);
                volatile float scaled = map[h[L.off_absq + b]] * s; /* rounded before the add */
                float a = scaled + offset;
                uint8_t byte = h[L.off_codes + i / 2];
                zo_store_f32(want, (zo_dtype)t, i, zo_nf4_code[i % 2 ? byte & 15 : byte >> 4] * a);
            }
            assert_memory_equal(got, want, n * es);
            free(got);
            free(want);
            dfree(out);
        }
        gpu_mem_free(dev, q);
        free(h);
    }
    /* arguments: n = 0 does nothing; a misaligned or NULL tensor is refused */
    gpu_tensor out = dzeros(8, ZO_DTYPE_F32);
    uint8_t *h;
    void *q = nf4_random(8, &h);
    assert_int_equal(gpu_nf4_dequantize(S, out, q, 0), ZO_OK);
    zo_clear_error();
    assert_int_equal(gpu_nf4_dequantize(S, out, (char *)q + 2, 8), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "aligned"));
    assert_int_equal(gpu_nf4_dequantize(S, out, NULL, 8), ZO_ERR_INVALID);
    assert_int_equal(gpu_nf4_dequantize(S, gpu_t(NULL, ZO_DTYPE_F32), q, 8), ZO_ERR_INVALID);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
    gpu_mem_free(dev, q);
    free(h);
    dfree(out);
}

/* Attention, GELU, cross-entropy and LayerNorm (forward and backward) on
 * devices with 1 and 2 threads give bit-identical results; shapes span
 * several attention query blocks and elementwise blocks. */
static void test_determinism_ops(void **state)
{
    (void)state;
    const gpu_attn_desc ad = {.b = 2, .t = 100, .hq = 4, .hkv = 2, .d = 16};
    const int nr = 200, c = 96; /* rows x width of the GELU / CE / LayerNorm inputs */
    const size_t nq = (size_t)ad.b * ad.t * (ad.hq + 2 * ad.hkv) * ad.d;
    const size_t no = (size_t)ad.b * ad.t * ad.hq * ad.d, nx = (size_t)nr * c;
    const size_t nlse = (size_t)ad.b * ad.hq * ad.t;
    /* inputs: qkv, dout, x, dy, w, b, targets; outputs: out, lse, dqkv, gelu y,
     * gelu dx, losses, dlogits, ln y, mean, rstd, ln dx, dw, db */
    const size_t n_in = nq + no + 2 * nx + 2 * (size_t)c + nr;
    const size_t n_out = no + nlse + nq + 2 * nx + nr + nx + nx + 2 * (size_t)nr + nx + 2 * (size_t)c;
    float *hin = malloc(n_in * 4), *res[2];
    for (size_t i = 0; i < n_in - nr; i++) hin[i] = (float)(urand() * 2.0);
    int32_t *htg = (int32_t *)(hin + n_in - nr);
    for (int i = 0; i < nr; i++) htg[i] = (i * 37 + 5) % c;
    for (int run = 0; run < 2; run++) {
        gpu_device_t d;
        gpu_stream_t s;
        gpu_cpu_options opt = {.n_threads = run + 1};
        assert_int_equal(gpu_device_init_cpu(&opt, &d), ZO_OK);
        assert_int_equal(gpu_stream_create(d, &s), ZO_OK);
        float *in, *out;
        assert_int_equal(gpu_mem_alloc(d, n_in * 4, (void **)&in), ZO_OK);
        assert_int_equal(gpu_mem_alloc(d, n_out * 4, (void **)&out), ZO_OK);
        assert_int_equal(gpu_memcpy_async(s, in, hin, n_in * 4, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
        assert_int_equal(gpu_memset_async(s, out, 0, n_out * 4), ZO_OK);
        const zo_dtype f = ZO_DTYPE_F32;
        float *qkv = in, *dout = qkv + nq, *x = dout + no, *dy = x + nx, *w = dy + nx, *bb = w + c;
        int32_t *tg = (int32_t *)(bb + c);
        float *ao = out, *lse = ao + no, *dqkv = lse + nlse, *gy = dqkv + nq, *gdx = gy + nx;
        float *loss = gdx + nx, *dlog = loss + nr, *ly = dlog + nx, *mean = ly + nx;
        float *rstd = mean + nr, *ldx = rstd + nr, *dw = ldx + nx, *db = dw + c;
        assert_int_equal(gpu_attention_forward(s, &ad, gpu_t(ao, f), lse, gpu_t(qkv, f)), ZO_OK);
        assert_int_equal(gpu_attention_backward(s, &ad, gpu_t(dqkv, f), gpu_t(dout, f),
                                                gpu_t(qkv, f), gpu_t(ao, f), lse), ZO_OK);
        assert_int_equal(gpu_gelu_forward(s, gpu_t(gy, f), gpu_t(x, f), nx, 0), ZO_OK);
        assert_int_equal(gpu_gelu_backward(s, gpu_t(gdx, f), gpu_t(dy, f), gpu_t(x, f), nx, 0), ZO_OK);
        assert_int_equal(gpu_cross_entropy_forward(s, loss, gpu_t(x, f), tg, nr, c), ZO_OK);
        assert_int_equal(gpu_cross_entropy_backward(s, gpu_t(dlog, f), gpu_t(x, f), tg, 0.25f, nr, c),
                         ZO_OK);
        assert_int_equal(gpu_layernorm_forward(s, gpu_t(ly, f), mean, rstd, gpu_t(x, f), gpu_t(w, f),
                                               gpu_t(bb, f), nr, c, 1e-5f), ZO_OK);
        assert_int_equal(gpu_layernorm_backward(s, gpu_t(ldx, f), gpu_t(dw, f), gpu_t(db, f),
                                                gpu_t(dy, f), gpu_t(x, f), gpu_t(w, f), mean, rstd,
                                                nr, c), ZO_OK);
        res[run] = malloc(n_out * 4);
        assert_int_equal(gpu_memcpy_async(s, res[run], out, n_out * 4, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
        assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
        gpu_mem_free(d, in);
        gpu_mem_free(d, out);
        gpu_device_free(d);
    }
    assert_memory_equal(res[0], res[1], n_out * 4);
    free(res[0]), free(res[1]), free(hin);
}

/* ---- fault injection: host memory running out ------------------------------------------------ */

/* Every op that needs scratch memory, on small shapes. The inputs live in
 * one device block and all outputs in another, so a run can be reset and
 * compared as a whole. */
enum { F_N = 8, F_C = 32, F_T = 8, F_HQ = 2, F_HKV = 1, F_D = 16, F_V = 16 };
#define F_QKV ((F_HQ + 2 * F_HKV) * F_D) /* 64 columns of qkv */

typedef struct fault_bufs {
    float *in, *out; /* device blocks */
    size_t in_n, out_n;
    float *x, *w, *b, *w2, *qkv, *dqkv_in, *wte, *wpe; /* inputs */
    int32_t *tok;
    float *y, *dx, *dw, *db, *mean, *rstd, *ao, *lse, *dqkv, *loss; /* outputs */
    double *sum;
} fault_bufs;

static const char *const fault_ops[] = {
    "gpu_gemm", "gpu_bias_forward", "gpu_layernorm_forward", "gpu_layernorm_backward",
    "gpu_rmsnorm_forward", "gpu_rmsnorm_backward", "gpu_attention_forward",
    "gpu_attention_backward", "gpu_rope", "gpu_embedding_forward",
    "gpu_cross_entropy_forward", "gpu_cross_entropy_backward", "gpu_sum_squares",
};
#define N_FAULT_OPS (int)(sizeof fault_ops / sizeof fault_ops[0])

/* Enqueue op k of fault_ops (reading fb's inputs, writing its outputs). */
static void fault_enqueue(const fault_bufs *fb, int k)
{
    const zo_dtype f = ZO_DTYPE_F32;
    gpu_attn_desc ad = {.b = 1, .t = F_T, .hq = F_HQ, .hkv = F_HKV, .d = F_D};
    gpu_gemm_desc g = {.m = F_N, .n = F_C, .k = F_C, .alpha = 1, .a = gpu_t(fb->x, f),
                       .b = gpu_t(fb->w2, f), .c = gpu_t(fb->y, f), .lda = F_C, .ldb = F_C,
                       .ldc = F_C};
    zo_status s = ZO_ERR_INTERNAL;
    switch (k) {
    case 0: s = gpu_gemm(S, &g); break;
    case 1:
        s = gpu_memcpy_async(S, fb->y, fb->x, F_N * F_C * 4, GPU_COPY_DEVICE_TO_DEVICE);
        if (s == ZO_OK) s = gpu_bias_forward(S, gpu_t(fb->y, f), gpu_t(fb->b, f), F_N, F_C, F_C);
        break;
    case 2:
        s = gpu_layernorm_forward(S, gpu_t(fb->y, f), fb->mean, fb->rstd, gpu_t(fb->x, f),
                                  gpu_t(fb->w, f), gpu_t(fb->b, f), F_N, F_C, 1e-5f);
        break;
    case 3:
        s = gpu_layernorm_forward(S, gpu_t(fb->y, f), fb->mean, fb->rstd, gpu_t(fb->x, f),
                                  gpu_t(fb->w, f), gpu_t(fb->b, f), F_N, F_C, 1e-5f);
        if (s == ZO_OK)
            s = gpu_layernorm_backward(S, gpu_t(fb->dx, f), gpu_t(fb->dw, f), gpu_t(fb->db, f),
                                       gpu_t(fb->w2, f), gpu_t(fb->x, f), gpu_t(fb->w, f),
                                       fb->mean, fb->rstd, F_N, F_C);
        break;
    case 4:
        s = gpu_rmsnorm_forward(S, gpu_t(fb->y, f), fb->rstd, gpu_t(fb->x, f), gpu_t(fb->w, f),
                                F_N, F_C, 1e-5f);
        break;
    case 5:
        s = gpu_rmsnorm_forward(S, gpu_t(fb->y, f), fb->rstd, gpu_t(fb->x, f), gpu_t(fb->w, f),
                                F_N, F_C, 1e-5f);
        if (s == ZO_OK)
            s = gpu_rmsnorm_backward(S, gpu_t(fb->dx, f), gpu_t(fb->dw, f), gpu_t(fb->w2, f),
                                     gpu_t(fb->x, f), gpu_t(fb->w, f), fb->rstd, F_N, F_C);
        break;
    case 6: s = gpu_attention_forward(S, &ad, gpu_t(fb->ao, f), fb->lse, gpu_t(fb->qkv, f)); break;
    case 7:
        s = gpu_attention_forward(S, &ad, gpu_t(fb->ao, f), fb->lse, gpu_t(fb->qkv, f));
        if (s == ZO_OK)
            s = gpu_attention_backward(S, &ad, gpu_t(fb->dqkv, f), gpu_t(fb->dqkv_in, f),
                                       gpu_t(fb->qkv, f), gpu_t(fb->ao, f), fb->lse);
        break;
    case 8:
        s = gpu_memcpy_async(S, fb->y, fb->x, F_N * F_C * 4, GPU_COPY_DEVICE_TO_DEVICE);
        if (s == ZO_OK) s = gpu_rope_forward(S, gpu_t(fb->y, f), F_N, F_T, 2, 16, F_C, 16, 1e4f, 0, NULL, 1.0f);
        break;
    case 9:
        s = gpu_embedding_forward(S, gpu_t(fb->y, f), fb->tok, gpu_t(fb->wte, f),
                                  gpu_t(fb->wpe, f), F_N, F_T, F_C, F_V);
        break;
    case 10:
        s = gpu_cross_entropy_forward(S, fb->loss, gpu_t(fb->x, f), fb->tok, F_N, F_C);
        break;
    case 11:
        s = gpu_cross_entropy_backward(S, gpu_t(fb->y, f), gpu_t(fb->x, f), fb->tok, 0.5f, F_N,
                                       F_C);
        break;
    case 12: s = gpu_sum_squares(S, fb->sum, gpu_t(fb->x, f), F_N * F_C); break;
    }
    assert_int_equal(s, ZO_OK); /* enqueuing succeeds; the failure comes while running */
}

/* Every scratch-using op reports ZO_ERR_NOMEM (naming itself) through
 * gpu_stream_synchronize when its scratch cannot be had, writes nothing,
 * and the same stream then runs it again to the same bits. Injected
 * device allocation failures return ZO_ERR_NOMEM and leave no trace. */
static void test_fault_injection(void **state)
{
    (void)state;
    fault_bufs fb = {0};
    const size_t nx = F_N * F_C, nq = (size_t)F_T * F_QKV;
    /* x, w, b, w2 (c x c), qkv, dout, wte, wpe, then the tokens */
    fb.in_n = nx + 2 * F_C + (size_t)F_C * F_C + 2 * nq + (size_t)(F_V + F_T) * F_C + F_N;
    /* y, dx, dw, db, mean, rstd, attention out, lse, dqkv, losses, sum */
    fb.out_n = 2 * nx + 2 * F_C + 2 * F_N + (size_t)F_T * F_HQ * F_D + F_HQ * F_T + nq + F_N + 3;
    assert_int_equal(gpu_mem_alloc(dev, fb.in_n * 4, (void **)&fb.in), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, fb.out_n * 4, (void **)&fb.out), ZO_OK);
    float *p = fb.in;
    fb.x = p, p += nx;
    fb.w = p, p += F_C;
    fb.b = p, p += F_C;
    fb.w2 = p, p += F_C * F_C;
    fb.qkv = p, p += nq;
    fb.dqkv_in = p, p += nq;
    fb.wte = p, p += F_V * F_C;
    fb.wpe = p, p += F_T * F_C;
    fb.tok = (int32_t *)p;
    for (float *q = fb.in; q < (float *)fb.tok; q++) *q = (float)urand();
    for (int i = 0; i < F_N; i++) fb.tok[i] = (i * 5 + 3) % F_V;
    p = fb.out;
    fb.y = p, p += nx;
    fb.dx = p, p += nx;
    fb.dw = p, p += F_C;
    fb.db = p, p += F_C;
    fb.mean = p, p += F_N;
    fb.rstd = p, p += F_N;
    fb.ao = p, p += F_T * F_HQ * F_D;
    fb.lse = p, p += F_HQ * F_T;
    fb.dqkv = p, p += nq;
    fb.loss = p, p += F_N;
    fb.sum = (double *)(p + (p - fb.out) % 2); /* (8-byte aligned) */
    float *want = malloc(fb.out_n * 4), *got = malloc(fb.out_n * 4);

    for (int k = 0; k < N_FAULT_OPS; k++) {
        /* a clean run gives the reference bits */
        assert_int_equal(gpu_memset_async(S, fb.out, 0, fb.out_n * 4), ZO_OK);
        fault_enqueue(&fb, k);
        assert_int_equal(gpu_memcpy_async(S, want, fb.out, fb.out_n * 4, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
        assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
        /* the last scratch reservation of the sequence fails (ops 3, 5, 7
         * run a forward first, which must succeed) */
        int skip = (k == 3 || k == 5 || k == 7) ? 1 : 0;
        gpu_cpu_faults fp = {.scratch_skip = skip, .scratch_fail = 1};
        assert_int_equal(gpu_cpu_inject_faults(dev, &fp), ZO_OK);
        assert_int_equal(gpu_memset_async(S, fb.out, 0, fb.out_n * 4), ZO_OK);
        fault_enqueue(&fb, k);
        zo_clear_error();
        zo_status st = gpu_stream_synchronize(S);
        if (st != ZO_ERR_NOMEM || !strstr(zo_last_error(), fault_ops[k]))
            printf("  %s: status %s, message \"%s\"\n", fault_ops[k], zo_status_name(st),
                   zo_last_error());
        assert_int_equal(st, ZO_ERR_NOMEM);
        assert_non_null(strstr(zo_last_error(), fault_ops[k]));
        assert_non_null(strstr(zo_last_error(), "bytes"));
        assert_int_equal(gpu_stream_synchronize(S), ZO_OK); /* reported once */
        /* the device is still usable: the same op runs to the same bits */
        assert_int_equal(gpu_memset_async(S, fb.out, 0, fb.out_n * 4), ZO_OK);
        fault_enqueue(&fb, k);
        assert_int_equal(gpu_memcpy_async(S, got, fb.out, fb.out_n * 4, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
        assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
        if (memcmp(got, want, fb.out_n * 4) != 0) printf("  %s: rerun differs\n", fault_ops[k]);
        assert_memory_equal(got, want, fb.out_n * 4);
    }

    /* device and pinned allocations: the second call fails, then all work */
    gpu_cpu_faults fa = {.alloc_skip = 1, .alloc_fail = 1};
    assert_int_equal(gpu_cpu_inject_faults(dev, &fa), ZO_OK);
    gpu_mem_stats before, after;
    gpu_mem_get_stats(dev, &before);
    void *p1 = NULL, *p2 = NULL, *p3 = NULL;
    assert_int_equal(gpu_mem_alloc(dev, 1000, &p1), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, 1000, &p2), ZO_ERR_NOMEM);
    assert_non_null(strstr(zo_last_error(), "gpu_mem_alloc"));
    assert_int_equal(gpu_host_alloc(dev, 1000, &p3), ZO_OK);
    gpu_mem_get_stats(dev, &after);
    assert_int_equal(after.n_allocs, before.n_allocs + 1); /* the failed one is not counted */
    gpu_cpu_faults fh = {.alloc_fail = 1};
    assert_int_equal(gpu_cpu_inject_faults(dev, &fh), ZO_OK);
    void *p4 = NULL;
    assert_int_equal(gpu_host_alloc(dev, 64, &p4), ZO_ERR_NOMEM);
    assert_non_null(strstr(zo_last_error(), "gpu_host_alloc"));
    gpu_mem_free(dev, p1);
    gpu_host_free(dev, p3);
    gpu_cpu_faults off = {0};
    assert_int_equal(gpu_cpu_inject_faults(dev, &off), ZO_OK);

    free(want);
    free(got);
    gpu_mem_free(dev, fb.in);
    gpu_mem_free(dev, fb.out);
}

/* ---- determinism ---------------------------------------------------------------------------------------------- */

/* The same ops on devices with 1 and 2 threads give bit-identical results. */
static void test_determinism(void **state)
{
    (void)state;
    const int m = 70, n = 300, k = 280;
    double *A = drand_array((size_t)m * k, 1.0), *B = drand_array((size_t)n * k, 1.0);
    float *res[2][3];
    for (int run = 0; run < 2; run++) {
        gpu_device_t d;
        gpu_stream_t s;
        gpu_cpu_options opt = {.n_threads = run + 1};
        assert_int_equal(gpu_device_init_cpu(&opt, &d), ZO_OK);
        assert_int_equal(gpu_stream_create(d, &s), ZO_OK);
        float *a, *b, *c, *dc;
        double *sum;
        float *ha = malloc((size_t)m * k * 4), *hb = malloc((size_t)n * k * 4);
        for (size_t i = 0; i < (size_t)m * k; i++) ha[i] = (float)A[i];
        for (size_t i = 0; i < (size_t)n * k; i++) hb[i] = (float)B[i];
        assert_int_equal(gpu_mem_alloc(d, (size_t)m * k * 4, (void **)&a), ZO_OK);
        assert_int_equal(gpu_mem_alloc(d, (size_t)n * k * 4, (void **)&b), ZO_OK);
        assert_int_equal(gpu_mem_alloc(d, (size_t)m * n * 4, (void **)&c), ZO_OK);
        assert_int_equal(gpu_mem_alloc(d, (size_t)n * 4, (void **)&dc), ZO_OK);
        assert_int_equal(gpu_mem_alloc(d, 8, (void **)&sum), ZO_OK);
        gpu_memcpy_async(s, a, ha, (size_t)m * k * 4, GPU_COPY_HOST_TO_DEVICE);
        gpu_memcpy_async(s, b, hb, (size_t)n * k * 4, GPU_COPY_HOST_TO_DEVICE);
        gpu_memset_async(s, dc, 0, (size_t)n * 4);
        gpu_memset_async(s, sum, 0, 8);
        gpu_gemm_desc g = {.trans_b = 1, .m = m, .n = n, .k = k, .alpha = 1, .a = gpu_t(a, 0),
                           .b = gpu_t(b, 0), .c = gpu_t(c, 0), .lda = k, .ldb = k, .ldc = n};
        assert_int_equal(gpu_gemm(s, &g), ZO_OK);
        assert_int_equal(gpu_bias_backward(s, gpu_t(dc, 0), gpu_t(c, 0), m, n, n), ZO_OK);
        assert_int_equal(gpu_sum_squares(s, sum, gpu_t(c, 0), (size_t)m * n), ZO_OK);
        res[run][0] = malloc((size_t)m * n * 4);
        res[run][1] = malloc((size_t)n * 4);
        res[run][2] = malloc(8);
        gpu_memcpy_async(s, res[run][0], c, (size_t)m * n * 4, GPU_COPY_DEVICE_TO_HOST);
        gpu_memcpy_async(s, res[run][1], dc, (size_t)n * 4, GPU_COPY_DEVICE_TO_HOST);
        gpu_memcpy_async(s, res[run][2], sum, 8, GPU_COPY_DEVICE_TO_HOST);
        assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
        gpu_mem_free(d, a), gpu_mem_free(d, b), gpu_mem_free(d, c), gpu_mem_free(d, dc);
        gpu_mem_free(d, sum);
        free(ha), free(hb);
        gpu_device_free(d);
    }
    assert_memory_equal(res[0][0], res[1][0], (size_t)m * n * 4);
    assert_memory_equal(res[0][1], res[1][1], (size_t)n * 4);
    assert_memory_equal(res[0][2], res[1][2], 8);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++) free(res[r][i]);
    free(A), free(B);
}

/* ---- optimizer -------------------------------------------------------------------- */

/* A device copy of n elements of host array h (any dtype). */
static void *adam_put(const void *h, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(gpu_mem_alloc(dev, bytes, &d), ZO_OK);
    assert_int_equal(gpu_memcpy_async(S, d, h, bytes, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
    return d;
}

static void adam_get(void *h, const void *d, size_t bytes)
{
    assert_int_equal(gpu_memcpy_async(S, h, d, bytes, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
}

/* Index of the first byte-level difference of two arrays of n elements of
 * `es` bytes, or -1. */
static long first_diff(const void *a, const void *b, size_t n, size_t es)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * es, (const char *)b + i * es, es)) return (long)i;
    return -1;
}

/* A step's gradients: n values of dtype gd over many magnitudes, with
 * zeros, so sqrt(v) spans a range. */
static void adam_grads(void *g, zo_dtype gd, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double mag = pow(10.0, -6.0 + 7.0 * (urand() * 0.5 + 0.5));
        zo_store_f32(g, gd, i, i % 97 == 0 ? 0.0f : (float)(urand() * mag));
    }
}

/* gpu_adam_update against cpu_adam (impl `ref`) over `steps` steps: params,
 * m, v and the 16-bit copy must be the same bits after every step. */
static void adam_case(adam_impl ref, size_t n, zo_dtype gd, adam_decay decay, zo_dtype od,
                      int with_out, int steps, float grad_mult)
{
    size_t gs = zo_dtype_size(gd), os = zo_dtype_size(od);
    float *p = malloc(4 * n), *m = calloc(n, 4), *v = calloc(n, 4);
    float *dp = malloc(4 * n), *dm = malloc(4 * n), *dv = malloc(4 * n);
    void *g = malloc(gs * n), *o = calloc(n, os), *dout = calloc(n, os);
    for (size_t i = 0; i < n; i++) p[i] = (float)(urand() * 2.0);
    float *dpar = adam_put(p, 4 * n), *dmom = adam_put(m, 4 * n), *dvar = adam_put(v, 4 * n);
    void *dgrad = NULL, *dout16 = with_out ? adam_put(o, os * n) : NULL;
    assert_int_equal(gpu_mem_alloc(dev, gs * n, &dgrad), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK); /* the copies of p have left p */
    adam_hparams hp = adam_hparams_default();
    hp.lr = 3e-3f;
    hp.beta2 = 0.95f;
    hp.weight_decay = 0.1f;
    hp.decay = decay;
    hp.grad_mult = grad_mult;
    for (int step = 1; step <= steps; step++) {
        adam_grads(g, gd, n);
        assert_int_equal(gpu_memcpy_async(S, dgrad, g, gs * n, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
        hp.step = step;
        gpu_adam_hparams gh = {.lr = hp.lr, .beta1 = hp.beta1, .beta2 = hp.beta2, .eps = hp.eps,
                               .weight_decay = hp.weight_decay,
                               .decay = decay == ADAM_DECAY_L2 ? GPU_ADAM_DECAY_L2
                                                               : GPU_ADAM_DECAY_ADAMW,
                               .step = step, .grad_mult = grad_mult};
        assert_int_equal(gpu_adam_update(S, &gh, n, dpar, gpu_t(dgrad, gd), dmom, dvar,
                                         gpu_t(dout16, od)),
                         ZO_OK);
        assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
        assert_int_equal(adam_update_impl(ref, &hp, n, p, g, gd, m, v, with_out ? o : NULL, od, 2),
                         ZO_OK);
        adam_get(dp, dpar, 4 * n);
        adam_get(dm, dmom, 4 * n);
        adam_get(dv, dvar, 4 * n);
        long dpi = first_diff(p, dp, n, 4), dmi = first_diff(m, dm, n, 4),
             dvi = first_diff(v, dv, n, 4), doi = -1;
        if (with_out) {
            adam_get(dout, dout16, os * n);
            doi = first_diff(o, dout, n, os);
        }
        if (dpi >= 0 || dmi >= 0 || dvi >= 0 || doi >= 0) {
            long i = dpi >= 0 ? dpi : dmi >= 0 ? dmi : dvi >= 0 ? dvi : doi;
            printf("  adam %s n=%zu grad %s decay %s step %d: first difference at %ld: "
                   "p %.9g vs %.9g, m %.9g vs %.9g, v %.9g vs %.9g\n",
                   adam_impl_name(ref), n, zo_dtype_name(gd), decay == ADAM_DECAY_L2 ? "l2" : "adamw",
                   step, i, p[i], dp[i], m[i], dm[i], v[i], dv[i]);
        }
        assert_int_equal(dpi, -1);
        assert_int_equal(dmi, -1);
        assert_int_equal(dvi, -1);
        assert_int_equal(doi, -1);
    }
    gpu_mem_free(dev, dpar);
    gpu_mem_free(dev, dmom);
    gpu_mem_free(dev, dvar);
    gpu_mem_free(dev, dgrad);
    gpu_mem_free(dev, dout16);
    free(p), free(m), free(v), free(dp), free(dm), free(dv), free(g), free(o), free(dout);
}

static void test_adam_update(void **state)
{
    (void)state;
    const zo_dtype gds[3] = {ZO_DTYPE_F32, ZO_DTYPE_F16, ZO_DTYPE_BF16};
    for (int gi = 0; gi < 3; gi++)
        for (int dec = 0; dec < 2; dec++) {
            adam_decay decay = dec ? ADAM_DECAY_L2 : ADAM_DECAY_ADAMW;
            zo_dtype od = gi == 2 ? ZO_DTYPE_BF16 : ZO_DTYPE_F16;
            /* the scalar reference; step 1 is the strongest bias correction */
            adam_case(ADAM_IMPL_SCALAR, 1003, gds[gi], decay, od, 1, 3, 1.0f);
            /* the loss-scaled, clipped gradient of a real step, no 16-bit copy */
            adam_case(ADAM_IMPL_SCALAR, 517, gds[gi], decay, od, 0, 2, 0.7f / 65536.0f);
        }
    /* the vectorized cpu_adam the runtime really calls, and a team of threads here */
    adam_case(ADAM_IMPL_AUTO, 70001, ZO_DTYPE_F32, ADAM_DECAY_ADAMW, ZO_DTYPE_BF16, 1, 2, 0.5f);
    adam_case(ADAM_IMPL_AUTO, 70001, ZO_DTYPE_F16, ADAM_DECAY_L2, ZO_DTYPE_F16, 1, 2, 1.0f);
}

/* gpu_adam_state_update against cpu_adam's adam_state_update over `steps`
 * steps, the whole state in one call (decay everywhere): the state buffer's
 * every byte, the fp32 master and the 16-bit copy the same bits after each
 * step (the encodings' one sequence; the layout one buffer's). */
static void adam_state_case(adam_state_kind kind, size_t n, zo_dtype gd, int steps)
{
    size_t gs = zo_dtype_size(gd), sb = (size_t)adam_state_bytes(kind, n);
    float *p = malloc(4 * n), *dp = malloc(4 * n);
    void *g = malloc(gs * n), *st = aligned_alloc(64, (sb + 63) / 64 * 64), *dst_host = malloc(sb);
    uint16_t *o = calloc(n, 2), *dout = calloc(n, 2);
    for (size_t i = 0; i < n; i++) p[i] = (float)(urand() * 2.0);
    assert_int_equal(adam_state_init(kind, st, n, 1), ZO_OK);
    float *dpar = adam_put(p, 4 * n);
    void *dstate = adam_put(st, sb), *dout16 = adam_put(o, 2 * n), *dgrad = NULL;
    assert_int_equal(gpu_mem_alloc(dev, gs * n, &dgrad), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
    adam_hparams hp = adam_hparams_default();
    hp.lr = 3e-3f;
    hp.beta2 = 0.95f;
    hp.weight_decay = 0.1f;
    gpu_adam_state_desc d = {.type = kind.type == ADAM_STATE_Q8 ? GPU_ADAM_STATE_Q8 : GPU_ADAM_STATE_BF16,
                             .block = kind.block, .total = n, .first = 0, .n_decay = -1};
    for (int step = 1; step <= steps; step++) {
        adam_grads(g, gd, n);
        assert_int_equal(gpu_memcpy_async(S, dgrad, g, gs * n, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
        hp.step = step;
        assert_int_equal(gpu_adam_state_update(S, &hp, &d, n, gpu_t(dpar, ZO_DTYPE_F32), gpu_t(dgrad, gd), dstate,
                                               gpu_t(dout16, ZO_DTYPE_BF16)),
                         ZO_OK);
        assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
        assert_int_equal(adam_state_update_impl(ADAM_IMPL_SCALAR, &hp, kind, n, p, g, gd, st, o, ZO_DTYPE_BF16, 2),
                         ZO_OK);
        adam_get(dp, dpar, 4 * n);
        adam_get(dst_host, dstate, sb);
        adam_get(dout, dout16, 2 * n);
        long dpi = first_diff(p, dp, n, 4), dsi = first_diff(st, dst_host, sb, 1), doi = first_diff(o, dout, n, 2);
        if (dpi >= 0 || dsi >= 0 || doi >= 0)
            printf("  adam state %s n=%zu grad %s step %d: first difference: param %ld, state byte %ld, out16 %ld\n",
                   adam_state_name(kind), n, zo_dtype_name(gd), step, dpi, dsi, doi);
        assert_int_equal(dpi, -1);
        assert_int_equal(dsi, -1);
        assert_int_equal(doi, -1);
    }
    gpu_mem_free(dev, dpar);
    gpu_mem_free(dev, dstate);
    gpu_mem_free(dev, dout16);
    gpu_mem_free(dev, dgrad);
    free(p), free(dp), free(g), free(st), free(dst_host), free(o), free(dout);
}

static void test_adam_state_update(void **state)
{
    (void)state;
    /* around the 8-bit block, bf16 anywhere; 3 steps from the zero state */
    const size_t sizes[3] = {2047, 2049, 6145};
    for (int k = 0; k < 3; k++) {
        adam_state_case(adam_state_q8(ADAM_Q8_BLOCK), sizes[k], k == 1 ? ZO_DTYPE_BF16 : ZO_DTYPE_F32, 3);
        adam_state_case(adam_state_bf16(), sizes[k], k == 2 ? ZO_DTYPE_F16 : ZO_DTYPE_F32, 3);
    }
    /* refused: a q8 call not on whole blocks, a bf16 state with a block,
     * fp16 weights, too many decay ranges, a rounding that does not fit */
    size_t n = 4096, sb = (size_t)adam_state_bytes(adam_state_q8(ADAM_Q8_BLOCK), n);
    void *buf = NULL;
    assert_int_equal(gpu_mem_alloc(dev, sb + 8 * n, &buf), ZO_OK);
    float *P = (float *)buf, *G = P + n;
    void *state_buf = (char *)buf + 8 * n;
    gpu_adam_hparams hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .decay = GPU_ADAM_DECAY_ADAMW,
                           .step = 1, .grad_mult = 1.0f};
    gpu_tensor pt = gpu_t(P, ZO_DTYPE_F32), gt = gpu_t(G, ZO_DTYPE_F32), none = gpu_t(NULL, ZO_DTYPE_BF16);
    gpu_adam_state_desc d = {.type = GPU_ADAM_STATE_Q8, .block = 2048, .total = n, .first = 1024, .n_decay = -1};
    assert_int_equal(gpu_adam_state_update(S, &hp, &d, 1024, pt, gt, state_buf, none), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "not whole blocks"));
    d = (gpu_adam_state_desc){.type = GPU_ADAM_STATE_BF16, .block = 64, .total = n, .n_decay = -1};
    assert_int_equal(gpu_adam_state_update(S, &hp, &d, n, pt, gt, state_buf, none), ZO_ERR_INVALID);
    d.block = 0;
    assert_int_equal(gpu_adam_state_update(S, &hp, &d, n, gpu_t(P, ZO_DTYPE_F16), gt, state_buf, none),
                     ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "param dtype"));
    d.n_decay = GPU_ADAM_DECAY_RANGES + 1;
    assert_int_equal(gpu_adam_state_update(S, &hp, &d, n, pt, gt, state_buf, none), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "decay ranges"));
    /* ... and without a master: stochastic or Kahan rounding of an fp32
     * param, Kahan without its compensation, a compensation without Kahan */
    d.n_decay = -1;
    d.round = GPU_ADAM_ROUND_STOCHASTIC;
    assert_int_equal(gpu_adam_state_update(S, &hp, &d, n, pt, gt, state_buf, none), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "fp32 param"));
    gpu_tensor wt = gpu_t(P, ZO_DTYPE_BF16);
    d.round = GPU_ADAM_ROUND_KAHAN;
    assert_int_equal(gpu_adam_state_update(S, &hp, &d, n, wt, gt, state_buf, none), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "comp NULL"));
    d.round = GPU_ADAM_ROUND_NEAREST;
    d.comp = (uint16_t *)(void *)(P + n / 2);
    assert_int_equal(gpu_adam_state_update(S, &hp, &d, n, wt, gt, state_buf, none), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "comp given"));
    d.round = GPU_ADAM_ROUND_KAHAN;
    d.comp = (uint16_t *)(void *)P; /* the weights themselves */
    assert_int_equal(gpu_adam_state_update(S, &hp, &d, n, wt, gt, state_buf, none), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "overlap"));
    gpu_mem_free(dev, buf);
}

static void test_adam_errors(void **state)
{
    (void)state;
    size_t n = 64;
    float *buf = NULL;
    assert_int_equal(gpu_mem_alloc(dev, 4 * 4 * n, (void **)&buf), ZO_OK);
    float *p = buf, *m = buf + n, *v = buf + 2 * n, *g = buf + 3 * n;
    gpu_adam_hparams hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                           .weight_decay = 0.0f, .decay = GPU_ADAM_DECAY_ADAMW, .step = 1,
                           .grad_mult = 1.0f};
    gpu_tensor gt = gpu_t(g, ZO_DTYPE_F32), none = gpu_t(NULL, ZO_DTYPE_F16);
    assert_int_equal(gpu_adam_update(S, NULL, n, p, gt, m, v, none), ZO_ERR_INVALID);
    gpu_adam_hparams bad = hp;
    bad.step = 0;
    assert_int_equal(gpu_adam_update(S, &bad, n, p, gt, m, v, none), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "step"));
    bad = hp;
    bad.grad_mult = 0.0f;
    assert_int_equal(gpu_adam_update(S, &bad, n, p, gt, m, v, none), ZO_ERR_INVALID);
    bad = hp;
    bad.beta2 = 1.0f;
    assert_int_equal(gpu_adam_update(S, &bad, n, p, gt, m, v, none), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "beta2"));
    assert_int_equal(gpu_adam_update(S, &hp, n, NULL, gt, m, v, none), ZO_ERR_INVALID);
    assert_int_equal(gpu_adam_update(S, &hp, n, p, gpu_t(NULL, ZO_DTYPE_F32), m, v, none),
                     ZO_ERR_INVALID);
    /* a 16-bit copy must be 16-bit */
    assert_int_equal(gpu_adam_update(S, &hp, n, p, gt, m, v, gpu_t(g, ZO_DTYPE_F32)),
                     ZO_ERR_INVALID);
    /* overlapping buffers: m shares its end with v */
    assert_int_equal(gpu_adam_update(S, &hp, n, p, gt, m + 1, v, none), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "overlap"));
    assert_int_equal(gpu_adam_update(S, &hp, 0, NULL, gt, NULL, NULL, none), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(S), ZO_OK);
    gpu_mem_free(dev, buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_memory_committed),
        cmocka_unit_test(test_capacity_concurrent),
        cmocka_unit_test(test_events_order),
        cmocka_unit_test(test_host_func),
        cmocka_unit_test(test_streams_concurrent),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_gemm_backward),
        cmocka_unit_test(test_gemm_tf32),
        cmocka_unit_test(test_bias),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_nf4_dequantize),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_determinism_ops),
        cmocka_unit_test(test_fault_injection),
        cmocka_unit_test(test_adam_update),
        cmocka_unit_test(test_adam_errors),
        cmocka_unit_test(test_adam_state_update),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
