/* The CUDA backend: device memory from the device's own stream-ordered pool
 * (cudaMemPool + cudaMallocFromPoolAsync) counted against a capacity with a
 * high-water mark, pinned host memory (cudaHostAlloc, or a mapping
 * registered with cudaHostRegister for large ones), CUDA streams and
 * events, cudaMemcpyAsync, and the ops: cuBLASLt GEMMs and the kernels of
 * gpu/cuda/<family>.cu. Every CUDA and cuBLAS call is checked; a failure
 * becomes a zo_status whose message names the call. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gpu/cuda/cuda_impl.h"   /* defines: cuda_ctx, cuda_stream, launchers */
#include "gpu/cuda/device_cuda.h" /* defines: gpu_cuda_options, cuda_device_init */
#include "gpu/cuda/ops_cuda.h"    /* defines: cuda_exec, cuda_ops */

#define POOL_ALIGN 256u

/* ---- checks -------------------------------------------------------------------- */

zo_status cuda_status(cudaError_t e, const char *call)
{
    if (e == cudaSuccess) return ZO_OK;
    (void)cudaGetLastError(); /* handled here: keep it from the next launch check */
    zo_status s = e == cudaErrorMemoryAllocation ? ZO_ERR_CAPACITY : ZO_ERR_DEVICE;
    return zo_error(s, "%s: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

zo_status cuda_blas_status(cublasStatus_t e, const char *call)
{
    if (e == CUBLAS_STATUS_SUCCESS) return ZO_OK;
    return zo_error(ZO_ERR_DEVICE, "%s: %s", call, cublasLtGetStatusString(e));
}

zo_status cuda_launch_check(const char *kernel)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return ZO_OK;
    return zo_error(ZO_ERR_DEVICE, "launch of %s: %s (%s)", kernel, cudaGetErrorString(e),
                    cudaGetErrorName(e));
}

/* The call's text names it in the message. */
#define CU(call) cuda_status((call), #call)

/* ---- the stopwatch of the attention's tuning (cuda_impl.h) ----------------------------- */

static void stopwatch_destroy(cuda_stopwatch *w)
{
    if (w->start) cudaEventDestroy(w->start);
    if (w->stop) cudaEventDestroy(w->stop);
    w->start = w->stop = NULL;
}

zo_status cuda_stopwatch_start(cudaStream_t st, cuda_stopwatch *w)
{
    *w = (cuda_stopwatch){0};
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    zo_status s = CU(cudaStreamIsCapturing(st, &cap));
    if (s != ZO_OK) return s;
    if (cap != cudaStreamCaptureStatusNone)
        return zo_error(ZO_ERR_UNSUPPORTED, "cuda_stopwatch_start: the stream is being captured into a graph");
    if ((s = CU(cudaEventCreate(&w->start))) == ZO_OK && (s = CU(cudaEventCreate(&w->stop))) == ZO_OK)
        s = CU(cudaEventRecord(w->start, st));
    if (s != ZO_OK) stopwatch_destroy(w);
    return s;
}

zo_status cuda_stopwatch_stop(cudaStream_t st, cuda_stopwatch *w, double *us)
{
    float ms = 0.0f;
    zo_status s = CU(cudaEventRecord(w->stop, st));
    if (s == ZO_OK) s = CU(cudaEventSynchronize(w->stop));
    if (s == ZO_OK) s = CU(cudaEventElapsedTime(&ms, w->start, w->stop));
    stopwatch_destroy(w);
    *us = (double)ms * 1e3;
    return s;
}

static cuda_ctx *ctx_of(gpu_device_t dev) { return dev->ctx; }

/* Make the context's device current on the calling thread. */
static zo_status use_device(const cuda_ctx *c)
{
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == c->device) return ZO_OK;
    return CU(cudaSetDevice(c->device));
}

static void lock(cuda_ctx *c) { pthread_mutex_lock(c->lock); }
static void unlock(cuda_ctx *c) { pthread_mutex_unlock(c->lock); }

/* ---- the allocation map: pointer -> rounded size ---------------------------------- */

struct cuda_alloc_node {
    void *p;
    size_t bytes;
    int host; /* pinned host memory, not device memory */
    size_t mapped; /* host: the bytes of its mapping, registered (0: cudaHostAlloc's) */
    cuda_ctx *ctx;
    cuda_alloc_node *next;
};

static size_t bucket_of(const void *p)
{
    uintptr_t u = (uintptr_t)p >> 8;
    return (size_t)((u ^ (u >> 13)) % CUDA_ALLOC_BUCKETS);
}

/* Call with the lock held. */
static void map_insert(cuda_ctx *c, cuda_alloc_node *n)
{
    size_t b = bucket_of(n->p);
    n->next = c->buckets[b];
    c->buckets[b] = n;
}

/* Unlink and return the node of p (of the given kind), NULL when p is not
 * ours. Call with the lock held. */
static cuda_alloc_node *map_remove(cuda_ctx *c, const void *p, int host)
{
    for (cuda_alloc_node **pp = &c->buckets[bucket_of(p)]; *pp; pp = &(*pp)->next)
        if ((*pp)->p == p && (*pp)->host == host) {
            cuda_alloc_node *n = *pp;
            *pp = n->next;
            return n;
        }
    return NULL;
}

/* ---- device memory -------------------------------------------------------------------- */

static zo_status cuda_mem_alloc(gpu_device_t dev, size_t bytes, void **out)
{
    cuda_ctx *c = ctx_of(dev);
    zo_status s;
    if (bytes > SIZE_MAX - 2 * POOL_ALIGN)
        return zo_error(ZO_ERR_CAPACITY, "gpu_mem_alloc: %zu bytes is too large", bytes);
    size_t rounded = (bytes + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
    cuda_alloc_node *n = calloc(1, sizeof *n);
    if (!n) return zo_error(ZO_ERR_NOMEM, "gpu_mem_alloc: out of host memory");

    lock(c);
    if (c->capacity && c->in_use + rounded > c->capacity) {
        size_t in_use = c->in_use;
        unlock(c);
        free(n);
        return zo_error(ZO_ERR_CAPACITY,
                        "device memory (cuda:%d): allocating %zu bytes would exceed the capacity "
                        "of %zu bytes (%zu in use, %zu free)",
                        c->device, rounded, c->capacity, in_use, c->capacity - in_use);
    }
    c->in_use += rounded; /* reserve first so racing threads see it */
    if (c->in_use > c->high_water) c->high_water = c->in_use;
    c->n_allocs++;
    unlock(c);

    void *p = NULL;
    if ((s = use_device(c)) != ZO_OK) goto out_unreserve;
    if ((s = CU(cudaMallocFromPoolAsync(&p, rounded, c->pool, c->alloc_stream))) != ZO_OK)
        goto out_unreserve;
    /* complete before any other stream may use it */
    if ((s = CU(cudaStreamSynchronize(c->alloc_stream))) != ZO_OK) goto out_free_mem;
    if ((uintptr_t)p % POOL_ALIGN) {
        s = zo_error(ZO_ERR_INTERNAL, "gpu_mem_alloc: the CUDA pool returned %p, not %u-byte "
                                      "aligned", p, POOL_ALIGN);
        goto out_free_mem;
    }
    n->p = p;
    n->bytes = rounded;
    n->ctx = c;
    lock(c);
    map_insert(c, n);
    unlock(c);
    *out = p;
    return ZO_OK;

out_free_mem:
    (void)cudaFreeAsync(p, c->alloc_stream);
out_unreserve:
    lock(c);
    c->in_use -= rounded;
    c->n_allocs--;
    unlock(c);
    free(n);
    return zo_error_wrap(s, "gpu_mem_alloc(%zu bytes)", bytes);
}

static void release_node(cuda_alloc_node *n)
{
    cuda_ctx *c = n->ctx;
    lock(c);
    c->in_use -= n->bytes;
    c->n_allocs--;
    unlock(c);
    free(n);
}

static void cuda_mem_free(gpu_device_t dev, void *p)
{
    cuda_ctx *c = ctx_of(dev);
    lock(c);
    cuda_alloc_node *n = map_remove(c, p, 0);
    unlock(c);
    if (!n) return; /* not ours, or freed twice: ignore (as the cpu backend) */
    /* No queued work uses p (the caller's promise), so returning it to the
     * pool in the order of the allocation stream is immediate. */
    if (use_device(c) == ZO_OK) (void)CU(cudaFreeAsync(p, c->alloc_stream));
    release_node(n);
}

/* Runs in stream order after the free: the bytes leave the count only then,
 * as with the cpu backend. Calls no CUDA function (not allowed here). */
static void CUDART_CB release_in_order(void *arg) { release_node(arg); }

static zo_status cuda_mem_free_async(gpu_device_t dev, void *p, gpu_stream_t s)
{
    cuda_ctx *c = ctx_of(dev);
    cuda_stream *cs = s->impl;
    zo_status st;
    lock(c);
    cuda_alloc_node *n = map_remove(c, p, 0);
    unlock(c);
    if (!n)
        return zo_error(ZO_ERR_INVALID, "gpu_mem_free_async: %p is not a live allocation of "
                                        "cuda:%d", p, c->device);
    if ((st = use_device(c)) != ZO_OK) goto out_release;
    if ((st = CU(cudaFreeAsync(p, cs->stream))) != ZO_OK) goto out_release;
    if ((st = CU(cudaLaunchHostFunc(cs->stream, release_in_order, n))) != ZO_OK)
        goto out_release;
    return ZO_OK;

out_release:
    release_node(n);
    return st;
}

static void cuda_mem_get_stats(gpu_device_t dev, gpu_mem_stats *out)
{
    cuda_ctx *c = ctx_of(dev);
    lock(c);
    out->capacity = c->capacity;
    out->in_use = c->in_use;
    out->high_water = c->high_water;
    out->n_allocs = c->n_allocs;
    out->host_pinned = c->host_pinned;
    unlock(c);
}

static void cuda_mem_reset_peak(gpu_device_t dev)
{
    cuda_ctx *c = ctx_of(dev);
    lock(c);
    c->high_water = c->in_use;
    unlock(c);
}

/* ---- pinned host memory ------------------------------------------------------------------- */

/* Pinned host memory of HOST_MAP_MIN bytes and more is an anonymous
 * mapping whose pages a team of threads touches first, then registered
 * whole (cudaHostRegister): cudaHostAlloc faults and zeroes every page on
 * the calling thread, seconds per ten gigabytes, and a 13B model's weights
 * and buffers are tens of them. Smaller requests, a mapping or a
 * registration that fails, and ZO_CUDA_PINNED=alloc (to compare the two)
 * take cudaHostAlloc. The bytes start as zeros either way (fresh pages). */
#define HOST_MAP_MIN ((size_t)64 << 20)
#define HOST_TOUCH_MAX 32 /* threads */

typedef struct touch_run {
    char *p;
    size_t bytes;
} touch_run;

static void *touch(void *arg)
{
    const touch_run *r = arg;
    memset(r->p, 0, r->bytes);
    return NULL;
}

/* Every page of [p, p + bytes) (whole pages) backed now: a contiguous run
 * per thread, a thread per online core up to HOST_TOUCH_MAX; a thread that
 * cannot start has its run done by this one. */
static void touch_pages(char *p, size_t bytes)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = cores < 1 ? 1 : cores > HOST_TOUCH_MAX ? HOST_TOUCH_MAX : (int)cores;
    size_t page = 4096, pages = bytes / page;
    touch_run run[HOST_TOUCH_MAX];
    pthread_t th[HOST_TOUCH_MAX];
    int started[HOST_TOUCH_MAX] = {0};
    for (int t = 0; t < nt; t++) {
        size_t lo = pages * (size_t)t / (size_t)nt * page, hi = pages * (size_t)(t + 1) / (size_t)nt * page;
        run[t] = (touch_run){.p = p + lo, .bytes = hi - lo};
        if (t > 0) started[t] = pthread_create(&th[t], NULL, touch, &run[t]) == 0;
    }
    for (int t = 0; t < nt; t++)
        if (!started[t]) touch(&run[t]);
    for (int t = 1; t < nt; t++)
        if (started[t]) pthread_join(th[t], NULL);
}

/* The mapped way (above): the pointer, or NULL to take cudaHostAlloc. */
static void *host_map(size_t bytes, size_t *mapped)
{
    const char *how = getenv("ZO_CUDA_PINNED");
    if (bytes < HOST_MAP_MIN || (how && !strcmp(how, "alloc"))) return NULL;
    size_t len = (bytes + 4095) / 4096 * 4096;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    (void)madvise(p, len, MADV_DONTFORK); /* a child never shares pages the device reads */
    touch_pages(p, len);
    if (cudaHostRegister(p, len, cudaHostRegisterPortable) != cudaSuccess) {
        (void)cudaGetLastError(); /* (not sticky: cudaHostAlloc is tried next) */
        munmap(p, len);
        return NULL;
    }
    *mapped = len;
    return p;
}

static zo_status cuda_host_alloc(gpu_device_t dev, size_t bytes, void **out)
{
    cuda_ctx *c = ctx_of(dev);
    zo_status s;
    if (bytes > SIZE_MAX - 2 * POOL_ALIGN)
        return zo_error(ZO_ERR_NOMEM, "gpu_host_alloc: %zu bytes is too large", bytes);
    size_t rounded = (bytes + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
    cuda_alloc_node *n = calloc(1, sizeof *n);
    if (!n) return zo_error(ZO_ERR_NOMEM, "gpu_host_alloc: out of host memory");
    void *p = NULL;
    if ((s = use_device(c)) != ZO_OK) goto out_free_node;
    /* portable: usable for copies with every device, not only this one */
    p = host_map(rounded, &n->mapped);
    if (!p && (s = CU(cudaHostAlloc(&p, rounded, cudaHostAllocPortable))) != ZO_OK) {
        if (s == ZO_ERR_CAPACITY) s = ZO_ERR_NOMEM; /* host memory has no capacity here */
        goto out_free_node;
    }
    n->p = p;
    n->bytes = rounded;
    n->host = 1;
    n->ctx = c;
    lock(c);
    map_insert(c, n);
    c->host_pinned += rounded;
    unlock(c);
    *out = p;
    return ZO_OK;

out_free_node:
    free(n);
    return zo_error_wrap(s, "gpu_host_alloc(%zu bytes)", bytes);
}

static void cuda_host_free(gpu_device_t dev, void *p)
{
    cuda_ctx *c = ctx_of(dev);
    lock(c);
    cuda_alloc_node *n = map_remove(c, p, 1);
    if (n) c->host_pinned -= n->bytes;
    unlock(c);
    if (!n) return;
    if (n->mapped) {
        (void)CU(cudaHostUnregister(p));
        munmap(p, n->mapped);
    } else {
        (void)CU(cudaFreeHost(p));
    }
    free(n);
}

/* ---- streams ----------------------------------------------------------------------------- */

static zo_status cuda_stream_create(gpu_device_t dev, gpu_stream_t s)
{
    cuda_ctx *c = ctx_of(dev);
    zo_status st;
    cuda_stream *cs = calloc(1, sizeof *cs);
    if (!cs) return zo_error(ZO_ERR_NOMEM, "gpu_stream_create: out of host memory");
    if ((st = use_device(c)) != ZO_OK) goto out_free_cs;
    /* non-blocking: no implicit ordering with the legacy default stream */
    if ((st = CU(cudaStreamCreateWithFlags(&cs->stream, cudaStreamNonBlocking))) != ZO_OK)
        goto out_free_cs;
    if ((st = CU(cudaMalloc((void **)&cs->err_dev, sizeof(cuda_err_rec)))) != ZO_OK)
        goto out_destroy_stream;
    if ((st = CU(cudaHostAlloc((void **)&cs->err_host, sizeof(cuda_err_rec),
                               cudaHostAllocDefault))) != ZO_OK)
        goto out_free_err_dev;
    if ((st = CU(cudaMalloc((void **)&cs->partials, CUDA_SUMSQ_BLOCKS * sizeof(double)))) != ZO_OK)
        goto out_free_err_host;
    /* the cuBLASLt workspace comes with the stream's first op that needs it
     * (stream_workspace): copy and optimizer streams never hold one, and the
     * device holds one per computing stream, as memplan counts */
    memset(cs->err_host, 0, sizeof(cuda_err_rec));
    if ((st = CU(cudaMemsetAsync(cs->err_dev, 0, sizeof(cuda_err_rec), cs->stream))) != ZO_OK)
        goto out_free_partials;
    if ((st = CU(cudaStreamSynchronize(cs->stream))) != ZO_OK) goto out_free_partials;
    s->impl = cs;
    return ZO_OK;

out_free_partials:
    cudaFree(cs->partials);
out_free_err_host:
    cudaFreeHost(cs->err_host);
out_free_err_dev:
    cudaFree(cs->err_dev);
out_destroy_stream:
    cudaStreamDestroy(cs->stream);
    (void)cudaGetLastError(); /* st already says what failed */
out_free_cs:
    free(cs);
    return zo_error_wrap(st, "gpu_stream_create (cuda)");
}

static const char *err_op_name(int code, const char **what)
{
    switch (code) {
    case CUDA_ERR_EMBEDDING_FORWARD: *what = "tokens"; return "gpu_embedding_forward";
    case CUDA_ERR_EMBEDDING_BACKWARD: *what = "tokens"; return "gpu_embedding_backward";
    case CUDA_ERR_CE_FORWARD: *what = "targets"; return "gpu_cross_entropy_forward";
    case CUDA_ERR_CE_BACKWARD: *what = "targets"; return "gpu_cross_entropy_backward";
    case CUDA_ERR_ATTN_CACHED: *what = "pos"; return "gpu_attention_cached";
    case CUDA_ERR_ROPE_SEQ: *what = "pos"; return "gpu_rope_forward_seq";
    case CUDA_ERR_EMBEDDING_POS: *what = "pos"; return "gpu_embedding_forward_seq";
    default: *what = "id"; return "a kernel";
    }
}

static zo_status cuda_stream_synchronize(gpu_stream_t s)
{
    cuda_ctx *c = ctx_of(s->dev);
    cuda_stream *cs = s->impl;
    zo_status st;
    if ((st = use_device(c)) != ZO_OK) return st;
    /* the error record comes back in stream order, after the work so far */
    zo_status cp = CU(cudaMemcpyAsync(cs->err_host, cs->err_dev, sizeof(cuda_err_rec),
                                      cudaMemcpyDeviceToHost, cs->stream));
    if ((st = CU(cudaStreamSynchronize(cs->stream))) != ZO_OK)
        return zo_error_wrap(st, "stream error");
    if (cp != ZO_OK) return cp;
    cuda_err_rec rec = *cs->err_host;
    if (rec.code == CUDA_ERR_NONE) return ZO_OK;
    /* clear the sticky error: the host copy now, the record before any later work */
    memset(cs->err_host, 0, sizeof rec);
    if ((st = CU(cudaMemsetAsync(cs->err_dev, 0, sizeof rec, cs->stream))) != ZO_OK) return st;
    const char *what, *op = err_op_name(rec.code, &what);
    return zo_error(ZO_ERR_INVALID, "stream error: %s: %s[%d] = %d outside [0, %d)", op, what,
                    rec.index, rec.value, rec.limit);
}

static void cuda_stream_destroy(gpu_stream_t s)
{
    cuda_stream *cs = s->impl;
    (void)cuda_stream_synchronize(s);
    cudaFree(cs->workspace);
    cudaFree(cs->partials);
    cudaFreeHost(cs->err_host);
    cudaFree(cs->err_dev);
    cudaStreamDestroy(cs->stream);
    (void)cudaGetLastError(); /* a failure above must not fail a later launch check */
    free(cs);
}

static zo_status cuda_synchronize(gpu_device_t dev)
{
    cuda_ctx *c = ctx_of(dev);
    zo_status first = ZO_OK;
    pthread_mutex_lock(dev->list_lock);
    for (gpu_stream_t s = dev->streams; s; s = s->next) {
        zo_status st = cuda_stream_synchronize(s);
        if (st != ZO_OK && first == ZO_OK) first = st;
    }
    pthread_mutex_unlock(dev->list_lock);
    zo_status st = use_device(c);
    if (st == ZO_OK) st = CU(cudaStreamSynchronize(c->alloc_stream));
    return first != ZO_OK ? first : st;
}

/* ---- events ------------------------------------------------------------------------------------ */

static zo_status cuda_event_create(gpu_device_t dev, gpu_event_t ev)
{
    cuda_ctx *c = ctx_of(dev);
    zo_status st;
    cuda_event *ce = calloc(1, sizeof *ce);
    if (!ce) return zo_error(ZO_ERR_NOMEM, "gpu_event_create: out of host memory");
    if ((st = use_device(c)) != ZO_OK) goto out_free_ce;
    /* a timed event (gpu/profile.h) keeps its time; others need not */
    if ((st = CU(cudaEventCreateWithFlags(&ce->event, ev->timed ? cudaEventDefault : cudaEventDisableTiming))) !=
        ZO_OK)
        goto out_free_ce;
    ev->impl = ce;
    return ZO_OK;

out_free_ce:
    free(ce);
    return st;
}

static void cuda_event_destroy(gpu_event_t ev)
{
    cuda_event *ce = ev->impl;
    cudaEventDestroy(ce->event); /* resources go once a pending record completes */
    (void)cudaGetLastError();    /* a failure must not fail a later launch check */
    free(ce);
}

static zo_status cuda_event_record(gpu_event_t ev, gpu_stream_t s)
{
    cuda_event *ce = ev->impl;
    cuda_stream *cs = s->impl;
    zo_status st = use_device(ctx_of(s->dev));
    if (st != ZO_OK) return st;
    return CU(cudaEventRecord(ce->event, cs->stream));
}

static zo_status cuda_stream_wait_event(gpu_stream_t s, gpu_event_t ev)
{
    /* device.c lets a stream wait on another device's event; ev->impl is a
     * cuda_event only when that device is a CUDA one too (another CUDA
     * device is fine: cudaStreamWaitEvent works across devices) */
    if (ev->dev->iface != s->dev->iface)
        return zo_error(ZO_ERR_INVALID, "gpu_stream_wait_event: a cuda stream cannot wait on an "
                                        "event of the %s backend", ev->dev->iface->name);
    cuda_event *ce = ev->impl;
    cuda_stream *cs = s->impl;
    zo_status st = use_device(ctx_of(s->dev));
    if (st != ZO_OK) return st;
    /* a never-recorded event counts as complete: no wait, as documented */
    return CU(cudaStreamWaitEvent(cs->stream, ce->event, 0));
}

static int cuda_event_query(gpu_event_t ev)
{
    cuda_event *ce = ev->impl;
    cudaError_t e = cudaEventQuery(ce->event);
    if (e == cudaErrorNotReady) return 0;
    if (e != cudaSuccess) (void)cudaGetLastError(); /* reported by the next synchronize */
    return 1;
}

static zo_status cuda_event_synchronize(gpu_event_t ev)
{
    cuda_event *ce = ev->impl;
    return CU(cudaEventSynchronize(ce->event));
}

static zo_status cuda_event_elapsed(gpu_event_t start, gpu_event_t end, double *ms)
{
    cuda_event *a = start->impl, *b = end->impl;
    float t = 0.0f;
    zo_status st = CU(cudaEventElapsedTime(&t, a->event, b->event));
    *ms = t;
    return st;
}

/* ---- copies -------------------------------------------------------------------------------------- */

static zo_status cuda_launch_host_func(gpu_stream_t s, gpu_host_fn fn, void *arg)
{
    cuda_stream *cs = s->impl;
    zo_status st = use_device(ctx_of(s->dev));
    if (st != ZO_OK) return st;
    return CU(cudaLaunchHostFunc(cs->stream, fn, arg));
}

static zo_status cuda_memcpy_async(gpu_stream_t s, void *dst, const void *src, size_t bytes,
                                   gpu_copy_kind kind)
{
    (void)kind; /* unified addressing: the runtime tells host from device itself */
    cuda_stream *cs = s->impl;
    zo_status st = use_device(ctx_of(s->dev));
    if (st != ZO_OK) return st;
    return CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cs->stream));
}

static zo_status cuda_memset_async(gpu_stream_t s, void *dst, int value, size_t bytes)
{
    cuda_stream *cs = s->impl;
    zo_status st = use_device(ctx_of(s->dev));
    if (st != ZO_OK) return st;
    return CU(cudaMemsetAsync(dst, value, bytes, cs->stream));
}

/* ---- ops: make the device current, then launch on the stream -------------------------------------- */

/* The stream's cuBLASLt workspace, allocated by the first op that uses one:
 * the GEMM (cuBLASLt's scratch), attention (its GEMM path), the embedding
 * backward (its sort), the norms' backwards (their parameter gradients'
 * partials) and the router's forward (its statistics' partial sums). */
static zo_status stream_workspace(cuda_stream *cs, gpu_op_id id)
{
    if (cs->workspace || (id != GPU_OP_GEMM && id != GPU_OP_EMBEDDING_BACKWARD &&
                          id != GPU_OP_ATTENTION_FORWARD && id != GPU_OP_ATTENTION_BACKWARD &&
                          id != GPU_OP_LAYERNORM_BACKWARD && id != GPU_OP_RMSNORM_BACKWARD &&
                          id != GPU_OP_HEAD_NORM_BACKWARD && id != GPU_OP_MOE_ROUTER_FORWARD))
        return ZO_OK;
    return CU(cudaMalloc(&cs->workspace, CUDA_LT_WORKSPACE));
}

/* Every op: the CUDA column of the op table (ops_cuda.c) on the stream. */
static zo_status cuda_op(gpu_stream_t s, gpu_op_id id, const gpu_op_args *a)
{
    cuda_stream *cs = s->impl;
    cuda_ctx *c = ctx_of(s->dev);
    zo_status st = use_device(c);
    if (st == ZO_OK) st = stream_workspace(cs, id);
    if (st != ZO_OK) return st;
    cuda_exec e = {.stream = cs->stream, .err = cs->err_dev, .partials = cs->partials,
                   .workspace = cs->workspace, .ws_bytes = CUDA_LT_WORKSPACE, .lt = c->lt,
                   .pool = c->pool, .tune = c->attn_tune};
    return cuda_ops[id](&e, a);
}

/* ---- the device ------------------------------------------------------------------------------------ */

static void cuda_free(gpu_device_t dev)
{
    cuda_ctx *c = ctx_of(dev);
    if (use_device(c) == ZO_OK) (void)cudaStreamSynchronize(c->alloc_stream);
    /* allocations the caller did not free (a bug of its own): release them */
    for (size_t b = 0; b < CUDA_ALLOC_BUCKETS; b++)
        while (c->buckets[b]) {
            cuda_alloc_node *n = c->buckets[b];
            c->buckets[b] = n->next;
            if (n->host)
                cudaFreeHost(n->p);
            else
                cudaFreeAsync(n->p, c->alloc_stream);
            free(n);
        }
    (void)cudaStreamSynchronize(c->alloc_stream);
    cublasLtDestroy(c->lt);
    cudaStreamDestroy(c->alloc_stream);
    cudaMemPoolDestroy(c->pool);
    (void)cudaGetLastError();
    cuda_attn_tune_free(c->attn_tune);
    free(c->attn_tune);
    pthread_mutex_destroy(c->lock);
    free(c->lock);
    free(c);
}

static const gpu_backend_iface cuda_iface = {
    .name = "cuda",
    .free = cuda_free,
    .synchronize = cuda_synchronize,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .mem_free_async = cuda_mem_free_async,
    .mem_get_stats = cuda_mem_get_stats,
    .mem_reset_peak = cuda_mem_reset_peak,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_synchronize = cuda_stream_synchronize,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .event_elapsed = cuda_event_elapsed,
    .launch_host_func = cuda_launch_host_func,
    .memcpy_async = cuda_memcpy_async,
    .memset_async = cuda_memset_async,
    .op = cuda_op,
};

/* CUDA devices usable here: 0 without a driver or a device (never an error). */
int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* gpu_device_init_cuda, as the module's table hands it out (gpu/device_open.c
 * forwards to it). */
zo_status cuda_device_init(const gpu_cuda_options *opt, gpu_device_t *out)
{
    if (!out) return zo_error(ZO_ERR_INVALID, "gpu_device_init_cuda: NULL output");
    *out = NULL;
    int ordinal = opt ? opt->device : 0, count = 0, pools = 0;
    zo_status st;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return zo_error(ZO_ERR_NOT_FOUND, "gpu_device_init_cuda(cuda:%d): cudaGetDeviceCount: %s",
                        ordinal, cudaGetErrorString(e));
    }
    if (ordinal < 0 || ordinal >= count)
        return zo_error(ZO_ERR_NOT_FOUND, "gpu_device_init_cuda: no device cuda:%d (%d present)",
                        ordinal, count);
    if ((st = CU(cudaSetDevice(ordinal))) != ZO_OK) return st;
    if ((st = CU(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, ordinal))) !=
        ZO_OK)
        return st;
    if (!pools)
        return zo_error(ZO_ERR_UNSUPPORTED, "gpu_device_init_cuda: cuda:%d has no stream-ordered "
                                            "memory pools", ordinal);

    cuda_ctx *c = calloc(1, sizeof *c);
    pthread_mutex_t *mu = malloc(sizeof *mu);
    cuda_attn_tune *tune = malloc(sizeof *tune);
    if (!c || !mu || !tune) {
        free(c);
        free(mu);
        free(tune);
        return zo_error(ZO_ERR_NOMEM, "gpu_device_init_cuda: out of host memory");
    }
    pthread_mutex_init(mu, NULL);
    cuda_attn_tune_init(tune);
    c->lock = mu;
    c->attn_tune = tune;
    c->device = ordinal;
    c->capacity = opt ? opt->capacity : 0;
    if (!c->capacity) {
        size_t free_b = 0, total_b = 0;
        if ((st = CU(cudaMemGetInfo(&free_b, &total_b))) != ZO_OK) goto out_free_ctx;
        c->capacity = free_b;
    }

    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = ordinal;
    if ((st = CU(cudaMemPoolCreate(&c->pool, &props))) != ZO_OK) goto out_free_ctx;
    /* keep freed memory in the pool: no release to the driver at each sync */
    uint64_t keep = UINT64_MAX;
    if ((st = CU(cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &keep))) !=
        ZO_OK)
        goto out_destroy_pool;
    if ((st = CU(cudaStreamCreateWithFlags(&c->alloc_stream, cudaStreamNonBlocking))) != ZO_OK)
        goto out_destroy_pool;
    if ((st = cuda_blas_status(cublasLtCreate(&c->lt), "cublasLtCreate")) != ZO_OK)
        goto out_destroy_stream;
    if ((st = gpu_device_wrap(&cuda_iface, c, out)) != ZO_OK) goto out_destroy_lt;
    return ZO_OK;

out_destroy_lt:
    cublasLtDestroy(c->lt);
out_destroy_stream:
    cudaStreamDestroy(c->alloc_stream);
out_destroy_pool:
    cudaMemPoolDestroy(c->pool);
out_free_ctx:
    cuda_attn_tune_free(tune);
    free(tune);
    pthread_mutex_destroy(mu);
    free(mu);
    free(c);
    return zo_error_wrap(st, "gpu_device_init_cuda(cuda:%d)", ordinal);
}
