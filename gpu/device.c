/* The public device functions: check arguments once for every backend, then
 * call the backend's table. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/nf4.h"      /* defines: ZO_NF4_ALIGN */
#include "gpu/device_impl.h" /* defines: gpu_backend_iface, struct gpu_device */

zo_status gpu_device_wrap(const gpu_backend_iface *iface, void *ctx, gpu_device_t *out)
{
    gpu_device_t dev = calloc(1, sizeof *dev);
    pthread_mutex_t *lock = malloc(sizeof *lock);
    if (!dev || !lock) {
        free(dev);
        free(lock);
        return zo_error(ZO_ERR_NOMEM, "gpu_device_wrap: out of host memory");
    }
    pthread_mutex_init(lock, NULL);
    dev->iface = iface;
    dev->ctx = ctx;
    dev->list_lock = lock;
    *out = dev;
    return ZO_OK;
}

void gpu_device_free(gpu_device_t dev)
{
    if (!dev) return;
    while (dev->streams) gpu_stream_destroy(dev->streams);
    while (dev->events) gpu_event_destroy(dev->events);
    dev->iface->free(dev);
    pthread_mutex_destroy(dev->list_lock);
    free(dev->list_lock);
    free(dev);
}

const char *gpu_device_name(gpu_device_t dev) { return dev ? dev->iface->name : "(null)"; }

zo_status gpu_device_synchronize(gpu_device_t dev)
{
    if (!dev) return zo_error(ZO_ERR_INVALID, "gpu_device_synchronize: NULL device");
    return dev->iface->synchronize(dev);
}

/* ---- memory ---------------------------------------------------------------- */

zo_status gpu_mem_alloc(gpu_device_t dev, size_t bytes, void **out)
{
    if (!dev || !out) return zo_error(ZO_ERR_INVALID, "gpu_mem_alloc: NULL argument");
    *out = NULL;
    if (bytes == 0) return zo_error(ZO_ERR_INVALID, "gpu_mem_alloc: size 0");
    return dev->iface->mem_alloc(dev, bytes, out);
}

void gpu_mem_free(gpu_device_t dev, void *p)
{
    if (dev && p) dev->iface->mem_free(dev, p);
}

zo_status gpu_mem_free_async(gpu_device_t dev, void *p, gpu_stream_t s)
{
    if (!dev || !s) return zo_error(ZO_ERR_INVALID, "gpu_mem_free_async: NULL argument");
    if (!p) return ZO_OK;
    if (dev->iface->mem_free_async) return dev->iface->mem_free_async(dev, p, s);
    zo_status st = gpu_stream_synchronize(s);
    dev->iface->mem_free(dev, p);
    return st;
}

void gpu_mem_get_stats(gpu_device_t dev, gpu_mem_stats *out) { dev->iface->mem_get_stats(dev, out); }
void gpu_mem_reset_peak(gpu_device_t dev) { dev->iface->mem_reset_peak(dev); }

zo_status gpu_host_alloc(gpu_device_t dev, size_t bytes, void **out)
{
    if (!dev || !out) return zo_error(ZO_ERR_INVALID, "gpu_host_alloc: NULL argument");
    *out = NULL;
    if (bytes == 0) return zo_error(ZO_ERR_INVALID, "gpu_host_alloc: size 0");
    return dev->iface->host_alloc(dev, bytes, out);
}

void gpu_host_free(gpu_device_t dev, void *p)
{
    if (dev && p) dev->iface->host_free(dev, p);
}

/* ---- streams and events -------------------------------------------------------- */

zo_status gpu_stream_create(gpu_device_t dev, gpu_stream_t *out)
{
    if (!dev || !out) return zo_error(ZO_ERR_INVALID, "gpu_stream_create: NULL argument");
    gpu_stream_t s = calloc(1, sizeof *s);
    if (!s) return zo_error(ZO_ERR_NOMEM, "gpu_stream_create: out of host memory");
    s->dev = dev;
    zo_status st = dev->iface->stream_create(dev, s);
    if (st != ZO_OK) {
        free(s);
        return st;
    }
    pthread_mutex_lock(dev->list_lock);
    s->next = dev->streams;
    dev->streams = s;
    pthread_mutex_unlock(dev->list_lock);
    *out = s;
    return ZO_OK;
}

void gpu_stream_destroy(gpu_stream_t s)
{
    if (!s) return;
    gpu_device_t dev = s->dev;
    pthread_mutex_lock(dev->list_lock);
    for (gpu_stream_t *pp = &dev->streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    pthread_mutex_unlock(dev->list_lock);
    dev->iface->stream_destroy(s);
    free(s);
}

zo_status gpu_stream_synchronize(gpu_stream_t s)
{
    if (!s) return zo_error(ZO_ERR_INVALID, "gpu_stream_synchronize: NULL stream");
    return s->dev->iface->stream_synchronize(s);
}

gpu_device_t gpu_stream_device(gpu_stream_t s) { return s ? s->dev : NULL; }

zo_status gpu_event_create(gpu_device_t dev, gpu_event_t *out)
{
    if (!dev || !out) return zo_error(ZO_ERR_INVALID, "gpu_event_create: NULL argument");
    gpu_event_t ev = calloc(1, sizeof *ev);
    if (!ev) return zo_error(ZO_ERR_NOMEM, "gpu_event_create: out of host memory");
    ev->dev = dev;
    zo_status st = dev->iface->event_create(dev, ev);
    if (st != ZO_OK) {
        free(ev);
        return st;
    }
    pthread_mutex_lock(dev->list_lock);
    ev->next = dev->events;
    dev->events = ev;
    pthread_mutex_unlock(dev->list_lock);
    *out = ev;
    return ZO_OK;
}

void gpu_event_destroy(gpu_event_t ev)
{
    if (!ev) return;
    gpu_device_t dev = ev->dev;
    pthread_mutex_lock(dev->list_lock);
    for (gpu_event_t *pp = &dev->events; *pp; pp = &(*pp)->next)
        if (*pp == ev) {
            *pp = ev->next;
            break;
        }
    pthread_mutex_unlock(dev->list_lock);
    dev->iface->event_destroy(ev);
    free(ev);
}

zo_status gpu_event_record(gpu_event_t ev, gpu_stream_t s)
{
    if (!ev || !s) return zo_error(ZO_ERR_INVALID, "gpu_event_record: NULL argument");
    if (ev->dev != s->dev)
        return zo_error(ZO_ERR_INVALID, "gpu_event_record: event and stream on different devices");
    return s->dev->iface->event_record(ev, s);
}

zo_status gpu_stream_wait_event(gpu_stream_t s, gpu_event_t ev)
{
    if (!ev || !s) return zo_error(ZO_ERR_INVALID, "gpu_stream_wait_event: NULL argument");
    return s->dev->iface->stream_wait_event(s, ev);
}

int gpu_event_query(gpu_event_t ev) { return ev ? ev->dev->iface->event_query(ev) : 1; }

zo_status gpu_event_synchronize(gpu_event_t ev)
{
    if (!ev) return zo_error(ZO_ERR_INVALID, "gpu_event_synchronize: NULL event");
    return ev->dev->iface->event_synchronize(ev);
}

zo_status gpu_launch_host_func(gpu_stream_t s, gpu_host_fn fn, void *arg)
{
    if (!s || !fn) return zo_error(ZO_ERR_INVALID, "gpu_launch_host_func: NULL argument");
    if (s->dev->iface->launch_host_func) return s->dev->iface->launch_host_func(s, fn, arg);
    zo_status st = gpu_stream_synchronize(s);
    if (st != ZO_OK) return st;
    fn(arg);
    return ZO_OK;
}

/* ---- argument checks ----------------------------------------------------------- */

static int dtype_ok(zo_dtype t) { return t >= ZO_DTYPE_F32 && t < ZO_DTYPE_COUNT; }

static zo_status check_tensor(const char *op, const char *name, gpu_tensor t)
{
    if (!t.data) return zo_error(ZO_ERR_INVALID, "%s: tensor %s is NULL", op, name);
    if (!dtype_ok(t.dtype))
        return zo_error(ZO_ERR_INVALID, "%s: tensor %s has unknown dtype %d", op, name,
                        (int)t.dtype);
    return ZO_OK;
}

static zo_status check_stream(const char *op, gpu_stream_t s)
{
    if (!s) return zo_error(ZO_ERR_INVALID, "%s: NULL stream", op);
    return ZO_OK;
}

/* One argument of an op, as the checks see it. */
typedef enum arg_kind {
    ARG_TENSOR,     /* data not NULL, a known dtype */
    ARG_TENSOR_OPT, /* the same, when data is not NULL (an optional tensor) */
    ARG_PTR,        /* not NULL */
    ARG_DIM,        /* > 0 */
    ARG_COUNT,      /* elements or bytes: 0 makes the op do nothing */
} arg_kind;

typedef struct op_arg {
    arg_kind kind;
    const char *name; /* as the messages name it */
    gpu_tensor t;
    const void *p;
    long long v;
} op_arg;

/* Each names the argument after the expression: TENSOR(y) is "tensor y". */
#define TENSOR(x) ((op_arg){ARG_TENSOR, #x, .t = (x)})
#define TENSOR_OPT(x) ((op_arg){ARG_TENSOR_OPT, #x, .t = (x)})
#define PTR(x) ((op_arg){ARG_PTR, #x, .p = (x)})
#define DIM(x) ((op_arg){ARG_DIM, #x, .v = (x)})
/* a descriptor's fields, named as the field */
#define DIM_OF(desc, f) ((op_arg){ARG_DIM, #f, .v = (desc)->f})
#define TENSOR_OF(desc, f) ((op_arg){ARG_TENSOR, #f, .t = (desc)->f})
#define COUNT(x) ((op_arg){ARG_COUNT, #x, .v = (x) != 0})
/* The list an op passes to op_check: the array and its length. */
#define ARGS(...)                                                                           \
    (const op_arg[]){__VA_ARGS__}, (int)(sizeof((op_arg[]){__VA_ARGS__}) / sizeof(op_arg))

/* Check an op's stream, then its arguments in the order given. Returns 1
 * when the op is to run; 0 when it is to return *st at once: the first
 * failed check, or ZO_OK when a COUNT is 0 (nothing to do: the arguments
 * after it are not checked). */
static int op_check(zo_status *st, gpu_stream_t s, const char *op, const op_arg *a, int n)
{
    if ((*st = check_stream(op, s)) != ZO_OK) return 0;
    for (int i = 0; i < n; i++) {
        switch (a[i].kind) {
        case ARG_COUNT:
            if (!a[i].v) return 0;
            break;
        case ARG_TENSOR_OPT:
            if (a[i].t.data) *st = check_tensor(op, a[i].name, a[i].t);
            break;
        case ARG_TENSOR:
            *st = check_tensor(op, a[i].name, a[i].t);
            break;
        case ARG_PTR:
            if (!a[i].p) *st = zo_error(ZO_ERR_INVALID, "%s: %s is NULL", op, a[i].name);
            break;
        case ARG_DIM:
            if (a[i].v <= 0)
                *st = zo_error(ZO_ERR_INVALID, "%s: %s must be > 0 (got %lld)", op, a[i].name,
                               a[i].v);
            break;
        }
        if (*st != ZO_OK) return 0;
    }
    return 1;
}

/* ---- copies ------------------------------------------------------------------------ */

zo_status gpu_memcpy_async(gpu_stream_t s, void *dst, const void *src, size_t bytes,
                           gpu_copy_kind kind)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(COUNT(bytes), PTR(dst), PTR(src)))) return st;
    if (kind < GPU_COPY_HOST_TO_DEVICE || kind > GPU_COPY_HOST_TO_HOST)
        return zo_error(ZO_ERR_INVALID, "gpu_memcpy_async: unknown copy kind %d", (int)kind);
    return s->dev->iface->memcpy_async(s, dst, src, bytes, kind);
}

zo_status gpu_memset_async(gpu_stream_t s, void *dst, int value, size_t bytes)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(COUNT(bytes), PTR(dst)))) return st;
    return s->dev->iface->memset_async(s, dst, value, bytes);
}

/* ---- ops ------------------------------------------------------------------------------ */

zo_status gpu_gemm(gpu_stream_t s, const gpu_gemm_desc *desc)
{
    const char *op = __func__;
    const gpu_gemm_desc *d = desc;
    zo_status st;
    if (!op_check(&st, s, op, ARGS(PTR(desc))) ||
        !op_check(&st, s, op, ARGS(DIM_OF(d, m), DIM_OF(d, n), DIM_OF(d, k), TENSOR_OF(d, a),
                                   TENSOR_OF(d, b), TENSOR_OF(d, c))))
        return st;
    int64_t a_cols = d->trans_a ? d->m : d->k, b_cols = d->trans_b ? d->k : d->n;
    if (d->lda < a_cols)
        return zo_error(ZO_ERR_INVALID, "%s: lda %lld < %lld columns of a", op,
                        (long long)d->lda, (long long)a_cols);
    if (d->ldb < b_cols)
        return zo_error(ZO_ERR_INVALID, "%s: ldb %lld < %lld columns of b", op,
                        (long long)d->ldb, (long long)b_cols);
    if (d->ldc < d->n)
        return zo_error(ZO_ERR_INVALID, "%s: ldc %lld < n %d", op, (long long)d->ldc, d->n);
    if (d->batch < 0) return zo_error(ZO_ERR_INVALID, "%s: batch %d < 0", op, d->batch);
    return s->dev->iface->gemm(s, d);
}

zo_status gpu_bias_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor bias, int n, int c,
                           int64_t ldy)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(TENSOR(y), TENSOR(bias), DIM(n), DIM(c)))) return st;
    if (ldy < c)
        return zo_error(ZO_ERR_INVALID, "%s: ldy %lld < c %d", __func__, (long long)ldy, c);
    return s->dev->iface->bias_forward(s, y, bias, n, c, ldy);
}

zo_status gpu_bias_backward(gpu_stream_t s, gpu_tensor dbias, gpu_tensor dy, int n, int c,
                            int64_t lddy)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(TENSOR(dbias), TENSOR(dy), DIM(n), DIM(c)))) return st;
    if (lddy < c)
        return zo_error(ZO_ERR_INVALID, "%s: lddy %lld < c %d", __func__, (long long)lddy, c);
    return s->dev->iface->bias_backward(s, dbias, dy, n, c, lddy);
}

zo_status gpu_layernorm_forward(gpu_stream_t s, gpu_tensor y, float *mean, float *rstd,
                                gpu_tensor x, gpu_tensor w, gpu_tensor b, int n, int c,
                                float eps)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(TENSOR(y), TENSOR(x), TENSOR(w), TENSOR_OPT(b),
                                         PTR(mean), PTR(rstd), DIM(n), DIM(c))))
        return st;
    return s->dev->iface->layernorm_forward(s, y, mean, rstd, x, w, b, n, c, eps);
}

zo_status gpu_layernorm_backward(gpu_stream_t s, gpu_tensor dx, gpu_tensor dw, gpu_tensor db,
                                 gpu_tensor dy, gpu_tensor x, gpu_tensor w, const float *mean,
                                 const float *rstd, int n, int c)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(TENSOR(dx), TENSOR(dw), TENSOR_OPT(db), TENSOR(dy),
                                         TENSOR(x), TENSOR(w), PTR(mean), PTR(rstd), DIM(n),
                                         DIM(c))))
        return st;
    return s->dev->iface->layernorm_backward(s, dx, dw, db, dy, x, w, mean, rstd, n, c);
}

zo_status gpu_rmsnorm_forward(gpu_stream_t s, gpu_tensor y, float *rstd, gpu_tensor x,
                              gpu_tensor w, int n, int c, float eps)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(TENSOR(y), TENSOR(x), TENSOR(w), PTR(rstd), DIM(n),
                                         DIM(c))))
        return st;
    return s->dev->iface->rmsnorm_forward(s, y, rstd, x, w, n, c, eps);
}

zo_status gpu_rmsnorm_backward(gpu_stream_t s, gpu_tensor dx, gpu_tensor dw, gpu_tensor dy,
                               gpu_tensor x, gpu_tensor w, const float *rstd, int n, int c)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(TENSOR(dx), TENSOR(dw), TENSOR(dy), TENSOR(x),
                                         TENSOR(w), PTR(rstd), DIM(n), DIM(c))))
        return st;
    return s->dev->iface->rmsnorm_backward(s, dx, dw, dy, x, w, rstd, n, c);
}

/* The stream and the attention descriptor: 1 when they are usable, else 0
 * with the failure in *st. */
static int attn_check(zo_status *st, gpu_stream_t s, const char *op, const gpu_attn_desc *desc)
{
    const gpu_attn_desc *a = desc;
    if (!op_check(st, s, op, ARGS(PTR(desc))) ||
        !op_check(st, s, op, ARGS(DIM_OF(a, b), DIM_OF(a, t), DIM_OF(a, hq), DIM_OF(a, hkv),
                                  DIM_OF(a, d))))
        return 0;
    if (a->hq % a->hkv) {
        *st = zo_error(ZO_ERR_INVALID, "%s: hkv %d does not divide hq %d", op, a->hkv, a->hq);
        return 0;
    }
    return 1;
}

zo_status gpu_attention_forward(gpu_stream_t s, const gpu_attn_desc *a, gpu_tensor out,
                                float *lse, gpu_tensor qkv)
{
    zo_status st;
    if (!attn_check(&st, s, __func__, a) ||
        !op_check(&st, s, __func__, ARGS(TENSOR(out), TENSOR(qkv), PTR(lse))))
        return st;
    return s->dev->iface->attention_forward(s, a, out, lse, qkv);
}

zo_status gpu_attention_backward(gpu_stream_t s, const gpu_attn_desc *a, gpu_tensor dqkv,
                                 gpu_tensor dout, gpu_tensor qkv, gpu_tensor out,
                                 const float *lse)
{
    zo_status st;
    if (!attn_check(&st, s, __func__, a) ||
        !op_check(&st, s, __func__, ARGS(TENSOR(dqkv), TENSOR(dout), TENSOR(qkv), TENSOR(out),
                                         PTR(lse))))
        return st;
    return s->dev->iface->attention_backward(s, a, dqkv, dout, qkv, out, lse);
}

static zo_status rope_common(const char *op, gpu_stream_t s, gpu_tensor x, int n, int t,
                             int n_heads, int d, int64_t ldx, float theta, int pos0, int inverse)
{
    zo_status st;
    if (!op_check(&st, s, op, ARGS(TENSOR(x), DIM(n), DIM(t), DIM(n_heads), DIM(d)))) return st;
    if (d % 2) return zo_error(ZO_ERR_INVALID, "%s: head dim %d is odd", op, d);
    if (ldx < (int64_t)n_heads * d)
        return zo_error(ZO_ERR_INVALID, "%s: ldx %lld < n_heads*d %lld", op, (long long)ldx,
                        (long long)n_heads * d);
    if (!(theta > 0.0f)) return zo_error(ZO_ERR_INVALID, "%s: theta must be > 0", op);
    if (pos0 < 0) return zo_error(ZO_ERR_INVALID, "%s: pos0 %d < 0", op, pos0);
    return s->dev->iface->rope(s, x, n, t, n_heads, d, ldx, theta, pos0, inverse);
}

zo_status gpu_rope_forward(gpu_stream_t s, gpu_tensor x, int n, int t, int n_heads, int d,
                           int64_t ldx, float theta, int pos0)
{
    return rope_common(__func__, s, x, n, t, n_heads, d, ldx, theta, pos0, 0);
}

zo_status gpu_rope_backward(gpu_stream_t s, gpu_tensor dx, int n, int t, int n_heads, int d,
                            int64_t ldx, float theta, int pos0)
{
    return rope_common(__func__, s, dx, n, t, n_heads, d, ldx, theta, pos0, 1);
}

zo_status gpu_gelu_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor x, size_t n)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(COUNT(n), TENSOR(y), TENSOR(x)))) return st;
    return s->dev->iface->gelu_forward(s, y, x, n);
}

zo_status gpu_gelu_backward(gpu_stream_t s, gpu_tensor dx, gpu_tensor dy, gpu_tensor x, size_t n)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(COUNT(n), TENSOR(dx), TENSOR(dy), TENSOR(x)))) return st;
    return s->dev->iface->gelu_backward(s, dx, dy, x, n);
}

zo_status gpu_swiglu_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor gate, gpu_tensor up,
                             size_t n)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(COUNT(n), TENSOR(y), TENSOR(gate), TENSOR(up))))
        return st;
    return s->dev->iface->swiglu_forward(s, y, gate, up, n);
}

zo_status gpu_swiglu_backward(gpu_stream_t s, gpu_tensor dgate, gpu_tensor dup, gpu_tensor dy,
                              gpu_tensor gate, gpu_tensor up, size_t n)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(COUNT(n), TENSOR(dgate), TENSOR(dup), TENSOR(dy),
                                         TENSOR(gate), TENSOR(up))))
        return st;
    return s->dev->iface->swiglu_backward(s, dgate, dup, dy, gate, up, n);
}

zo_status gpu_embedding_forward(gpu_stream_t s, gpu_tensor out, const int32_t *tokens,
                                gpu_tensor wte, gpu_tensor wpe, int n, int t, int c, int vocab)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(TENSOR(out), TENSOR(wte), TENSOR_OPT(wpe), PTR(tokens),
                                         DIM(n), DIM(t), DIM(c), DIM(vocab))))
        return st;
    return s->dev->iface->embedding_forward(s, out, tokens, wte, wpe, n, t, c, vocab);
}

zo_status gpu_embedding_backward(gpu_stream_t s, gpu_tensor dwte, gpu_tensor dwpe,
                                 gpu_tensor dout, const int32_t *tokens, int n, int t, int c,
                                 int vocab)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(TENSOR(dwte), TENSOR_OPT(dwpe), TENSOR(dout),
                                         PTR(tokens), DIM(n), DIM(t), DIM(c), DIM(vocab))))
        return st;
    return s->dev->iface->embedding_backward(s, dwte, dwpe, dout, tokens, n, t, c, vocab);
}

zo_status gpu_cross_entropy_forward(gpu_stream_t s, float *losses, gpu_tensor logits,
                                    const int32_t *targets, int n, int v)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(PTR(losses), TENSOR(logits), PTR(targets), DIM(n),
                                         DIM(v))))
        return st;
    return s->dev->iface->cross_entropy_forward(s, losses, logits, targets, n, v);
}

zo_status gpu_cross_entropy_backward(gpu_stream_t s, gpu_tensor dlogits, gpu_tensor logits,
                                     const int32_t *targets, float dloss, int n, int v)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(TENSOR(dlogits), TENSOR(logits), PTR(targets), DIM(n),
                                         DIM(v))))
        return st;
    if (dlogits.data == logits.data && dlogits.dtype != logits.dtype)
        return zo_error(ZO_ERR_INVALID, "%s: in place needs one dtype", __func__);
    return s->dev->iface->cross_entropy_backward(s, dlogits, logits, targets, dloss, n, v);
}

zo_status gpu_add(gpu_stream_t s, gpu_tensor y, gpu_tensor a, gpu_tensor b, size_t n)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(COUNT(n), TENSOR(y), TENSOR(a), TENSOR(b)))) return st;
    return s->dev->iface->add(s, y, a, b, n);
}

zo_status gpu_scale(gpu_stream_t s, gpu_tensor x, float alpha, size_t n)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(COUNT(n), TENSOR(x)))) return st;
    return s->dev->iface->scale(s, x, alpha, n);
}

zo_status gpu_cast(gpu_stream_t s, gpu_tensor dst, gpu_tensor src, size_t n)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(COUNT(n), TENSOR(dst), TENSOR(src)))) return st;
    return s->dev->iface->cast(s, dst, src, n);
}

zo_status gpu_check_finite(gpu_stream_t s, int32_t *flag, gpu_tensor x, size_t n)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(PTR(flag), COUNT(n), TENSOR(x)))) return st;
    return s->dev->iface->check_finite(s, flag, x, n);
}

zo_status gpu_sum_squares(gpu_stream_t s, float *sum, gpu_tensor x, size_t n)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(PTR(sum), COUNT(n), TENSOR(x)))) return st;
    return s->dev->iface->sum_squares(s, sum, x, n);
}

zo_status gpu_nf4_dequantize(gpu_stream_t s, gpu_tensor out, const void *nf4, size_t n)
{
    zo_status st;
    if (!op_check(&st, s, __func__, ARGS(COUNT(n), TENSOR(out), PTR(nf4)))) return st;
    if ((uintptr_t)nf4 % ZO_NF4_ALIGN)
        return zo_error(ZO_ERR_INVALID, "%s: nf4 is not %d-byte aligned", __func__, ZO_NF4_ALIGN);
    return s->dev->iface->nf4_dequantize(s, out, nf4, n);
}

/* ---- ops: optimizer ----------------------------------------------------------------- */

/* Whether [a, a + na) and [b, b + nb) share a byte. */
static int bytes_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

zo_status gpu_adam_update(gpu_stream_t s, const gpu_adam_hparams *hp, size_t n, float *param,
                          gpu_tensor grad, float *m, float *v, gpu_tensor out16)
{
    zo_status st;
    const char *op = __func__;
    if ((st = check_stream(op, s)) != ZO_OK) return st;
    if ((st = zo_adam_check_hparams(op, hp)) != ZO_OK) return st;
    if (!dtype_ok(grad.dtype))
        return zo_error(ZO_ERR_INVALID, "%s: grad has unknown dtype %d", op, (int)grad.dtype);
    if (out16.data && out16.dtype != ZO_DTYPE_F16 && out16.dtype != ZO_DTYPE_BF16)
        return zo_error(ZO_ERR_INVALID, "%s: out16 dtype %d is not fp16 or bf16", op,
                        (int)out16.dtype);
    if (!op_check(&st, s, op, ARGS(COUNT(n), PTR(param), PTR(m), PTR(v), TENSOR(grad))))
        return st;
    if (n > SIZE_MAX / 4) return zo_error(ZO_ERR_INVALID, "%s: n = %zu too large", op, n);
    const void *arr[5] = {param, m, v, grad.data, out16.data};
    size_t len[5] = {4 * n, 4 * n, 4 * n, zo_dtype_size(grad.dtype) * n,
                     out16.data ? zo_dtype_size(out16.dtype) * n : 0};
    const char *name[5] = {"param", "m", "v", "grad", "out16"};
    for (int a = 0; a < 5; a++)
        for (int b = a + 1; b < 5; b++)
            if (arr[b] && bytes_overlap(arr[a], len[a], arr[b], len[b]))
                return zo_error(ZO_ERR_INVALID, "%s: buffers %s and %s overlap", op, name[a],
                                name[b]);
    if (!s->dev->iface->adam_update)
        return zo_error(ZO_ERR_UNSUPPORTED, "%s: backend \"%s\" has no Adam op", op,
                        s->dev->iface->name);
    gpu_adam_consts c = zo_adam_consts_make(hp);
    return s->dev->iface->adam_update(s, &c, n, param, grad, m, v, out16);
}
