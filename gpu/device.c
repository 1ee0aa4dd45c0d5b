/* The public device functions: check arguments once for every backend, then
 * call the backend's table. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "gpu/device_impl.h" /* defines: gpu_backend_iface, struct gpu_device */
#include "gpu/profile_impl.h" /* defines: gpu_profile_copy, gpu_profile_memset */

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

static zo_status event_create(gpu_device_t dev, int timed, gpu_event_t *out)
{
    if (!dev || !out) return zo_error(ZO_ERR_INVALID, "gpu_event_create: NULL argument");
    gpu_event_t ev = calloc(1, sizeof *ev);
    if (!ev) return zo_error(ZO_ERR_NOMEM, "gpu_event_create: out of host memory");
    ev->dev = dev;
    ev->timed = timed;
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

zo_status gpu_event_create(gpu_device_t dev, gpu_event_t *out) { return event_create(dev, 0, out); }

zo_status gpu_event_create_timed(gpu_device_t dev, gpu_event_t *out) { return event_create(dev, 1, out); }

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
    zo_status st = s->dev->iface->event_record(ev, s);
    if (st == ZO_OK && ev->timed) ev->recorded = 1; /* gpu_event_elapsed's check */
    return st;
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

zo_status gpu_event_elapsed(gpu_event_t start, gpu_event_t end, double *ms)
{
    const char *op = __func__;
    if (!start || !end || !ms) return zo_error(ZO_ERR_INVALID, "%s: NULL argument", op);
    if (start->dev != end->dev) return zo_error(ZO_ERR_INVALID, "%s: events of two devices", op);
    if (!start->timed || !end->timed)
        return zo_error(ZO_ERR_INVALID, "%s: the %s event is not timed (gpu_event_create_timed)", op,
                        start->timed ? "end" : "start");
    gpu_device_t dev = start->dev;
    if (!start->recorded || !end->recorded)
        return zo_error(ZO_ERR_INVALID, "%s: the %s event was never recorded", op, start->recorded ? "end" : "start");
    if (!dev->iface->event_query(start) || !dev->iface->event_query(end))
        return zo_error(ZO_ERR_INVALID, "%s: a record has not completed", op);
    return dev->iface->event_elapsed(start, end, ms);
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

/* ---- copies ------------------------------------------------------------------------ */

zo_status gpu_memcpy_async(gpu_stream_t s, void *dst, const void *src, size_t bytes,
                           gpu_copy_kind kind)
{
    const char *op = __func__;
    if (!s) return zo_error(ZO_ERR_INVALID, "%s: NULL stream", op);
    if (!bytes) return ZO_OK;
    if (!dst || !src) return zo_error(ZO_ERR_INVALID, "%s: %s is NULL", op, dst ? "src" : "dst");
    if (kind < GPU_COPY_HOST_TO_DEVICE || kind > GPU_COPY_HOST_TO_HOST)
        return zo_error(ZO_ERR_INVALID, "%s: unknown copy kind %d", op, (int)kind);
    gpu_profile *prof = __atomic_load_n(&s->dev->prof, __ATOMIC_ACQUIRE);
    if (prof) return gpu_profile_copy(prof, s, dst, src, bytes, kind);
    return s->dev->iface->memcpy_async(s, dst, src, bytes, kind);
}

zo_status gpu_memset_async(gpu_stream_t s, void *dst, int value, size_t bytes)
{
    const char *op = __func__;
    if (!s) return zo_error(ZO_ERR_INVALID, "%s: NULL stream", op);
    if (!bytes) return ZO_OK;
    if (!dst) return zo_error(ZO_ERR_INVALID, "%s: dst is NULL", op);
    gpu_profile *prof = __atomic_load_n(&s->dev->prof, __ATOMIC_ACQUIRE);
    if (prof) return gpu_profile_memset(prof, s, dst, value, bytes);
    return s->dev->iface->memset_async(s, dst, value, bytes);
}

/* ---- ops: each packs its arguments into the slots its row of the op table
 * names (gpu/ops.h); gpu_op_run checks them and calls the backend ---------------- */

#define RUN(ID, ...) return gpu_op_run(s, GPU_OP_##ID, &(gpu_op_args){__VA_ARGS__})

zo_status gpu_gemm(gpu_stream_t s, const gpu_gemm_desc *d)
{
    if (!d) return zo_error(ZO_ERR_INVALID, "gpu_gemm: desc is NULL");
    RUN(GEMM, .t = {d->a, d->b, d->c}, .d.gemm = *d);
}

zo_status gpu_bias_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor bias, int n, int c,
                           int64_t ldy)
{
    RUN(BIAS_FORWARD, .t = {y, bias}, .i = {n, c, ldy});
}

zo_status gpu_bias_backward(gpu_stream_t s, gpu_tensor dbias, gpu_tensor dy, int n, int c,
                            int64_t lddy)
{
    RUN(BIAS_BACKWARD, .t = {dbias, dy}, .i = {n, c, lddy});
}

zo_status gpu_layernorm_forward(gpu_stream_t s, gpu_tensor y, float *mean, float *rstd,
                                gpu_tensor x, gpu_tensor w, gpu_tensor b, int n, int c,
                                float eps)
{
    RUN(LAYERNORM_FORWARD, .t = {y, x, w, b}, .p = {mean, rstd}, .i = {n, c}, .f = {eps});
}

zo_status gpu_layernorm_backward(gpu_stream_t s, gpu_tensor dx, gpu_tensor dw, gpu_tensor db,
                                 gpu_tensor dy, gpu_tensor x, gpu_tensor w, const float *mean,
                                 const float *rstd, int n, int c)
{
    RUN(LAYERNORM_BACKWARD, .t = {dx, dw, db, dy, x, w}, .p = {(void *)mean, (void *)rstd},
        .i = {n, c});
}

zo_status gpu_rmsnorm_forward(gpu_stream_t s, gpu_tensor y, float *rstd, gpu_tensor x,
                              gpu_tensor w, int n, int c, float eps)
{
    RUN(RMSNORM_FORWARD, .t = {y, x, w}, .p = {rstd}, .i = {n, c}, .f = {eps});
}

zo_status gpu_rmsnorm_backward(gpu_stream_t s, gpu_tensor dx, gpu_tensor dw, gpu_tensor dy,
                               gpu_tensor x, gpu_tensor w, const float *rstd, int n, int c)
{
    RUN(RMSNORM_BACKWARD, .t = {dx, dw, dy, x, w}, .p = {(void *)rstd}, .i = {n, c});
}

zo_status gpu_head_norm_forward(gpu_stream_t s, gpu_tensor x, int64_t ldx, gpu_tensor saved, float *rstd,
                                gpu_tensor w, int64_t w_stride, int n, int heads, int d, float eps, int centered)
{
    RUN(HEAD_NORM_FORWARD, .t = {x, w, saved}, .p = {rstd}, .i = {n, heads, d, ldx, w_stride, centered},
        .f = {eps});
}

zo_status gpu_head_norm_backward(gpu_stream_t s, gpu_tensor dx, int64_t ldx, gpu_tensor dw, gpu_tensor saved,
                                 gpu_tensor w, int64_t w_stride, const float *rstd, int n, int heads, int d,
                                 int centered)
{
    RUN(HEAD_NORM_BACKWARD, .t = {dx, dw, saved, w}, .p = {(void *)rstd},
        .i = {n, heads, d, ldx, w_stride, centered});
}

zo_status gpu_attention_forward(gpu_stream_t s, const gpu_attn_desc *a, gpu_tensor out,
                                float *lse, gpu_tensor qkv)
{
    if (!a) return zo_error(ZO_ERR_INVALID, "gpu_attention_forward: desc is NULL");
    RUN(ATTENTION_FORWARD, .t = {out, qkv}, .p = {lse, (void *)a->sinks}, .d.attn = *a);
}

zo_status gpu_attention_backward(gpu_stream_t s, const gpu_attn_desc *a, gpu_tensor dqkv,
                                 gpu_tensor dout, gpu_tensor qkv, gpu_tensor out,
                                 const float *lse)
{
    if (!a) return zo_error(ZO_ERR_INVALID, "gpu_attention_backward: desc is NULL");
    RUN(ATTENTION_BACKWARD, .t = {dqkv, dout, qkv, out}, .p = {(void *)lse, (void *)a->sinks, a->dsinks},
        .d.attn = *a);
}

zo_status gpu_attention_cached(gpu_stream_t s, const gpu_attn_desc *a, gpu_tensor out,
                               gpu_tensor qkv, gpu_tensor k_cache, gpu_tensor v_cache,
                               const int32_t *pos, int tc)
{
    if (!a) return zo_error(ZO_ERR_INVALID, "gpu_attention_cached: desc is NULL");
    if (a->dsinks) return zo_error(ZO_ERR_INVALID, "gpu_attention_cached: dsinks given (the cached attention has no backward)");
    RUN(ATTENTION_CACHED, .t = {out, qkv, k_cache, v_cache}, .p = {(void *)pos, (void *)a->sinks}, .i = {tc},
        .d.attn = *a);
}

zo_status gpu_rope_forward(gpu_stream_t s, gpu_tensor x, int n, int t, int n_heads, int d,
                           int64_t ldx, int64_t ldh, float theta, int pos0, const double *inv_freq, float scale)
{
    RUN(ROPE_FORWARD, .t = {x}, .p = {(void *)inv_freq}, .i = {n, t, n_heads, d, ldx, pos0, ldh},
        .f = {theta, scale});
}

zo_status gpu_rope_forward_seq(gpu_stream_t s, gpu_tensor x, int n, int t, int n_heads, int d,
                               int64_t ldx, int64_t ldh, float theta, const int32_t *pos, int n_pos,
                               const double *inv_freq, float scale)
{
    if (!pos) return zo_error(ZO_ERR_INVALID, "gpu_rope_forward_seq: pos is NULL");
    RUN(ROPE_FORWARD, .t = {x}, .p = {(void *)inv_freq, (void *)pos},
        .i = {n, t, n_heads, d, ldx, 0, ldh, n_pos}, .f = {theta, scale});
}

zo_status gpu_rope_backward(gpu_stream_t s, gpu_tensor dx, int n, int t, int n_heads, int d,
                            int64_t ldx, int64_t ldh, float theta, int pos0, const double *inv_freq, float scale)
{
    RUN(ROPE_BACKWARD, .t = {dx}, .p = {(void *)inv_freq}, .i = {n, t, n_heads, d, ldx, pos0, ldh},
        .f = {theta, scale});
}

zo_status gpu_gelu_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor x, size_t n, int form)
{
    RUN(GELU_FORWARD, .t = {y, x}, .i = {form}, .n = n);
}

zo_status gpu_gelu_backward(gpu_stream_t s, gpu_tensor dx, gpu_tensor dy, gpu_tensor x, size_t n, int form)
{
    RUN(GELU_BACKWARD, .t = {dx, dy, x}, .i = {form}, .n = n);
}

zo_status gpu_swiglu_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor gate, gpu_tensor up,
                             size_t n, int gelu)
{
    RUN(SWIGLU_FORWARD, .t = {y, gate, up}, .i = {gelu}, .n = n);
}

zo_status gpu_swiglu_backward(gpu_stream_t s, gpu_tensor dgate, gpu_tensor dup, gpu_tensor dy,
                              gpu_tensor gate, gpu_tensor up, size_t n, int gelu)
{
    RUN(SWIGLU_BACKWARD, .t = {dgate, dup, dy, gate, up}, .i = {gelu}, .n = n);
}

zo_status gpu_swiglu_clamped_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor gate, gpu_tensor up, size_t n,
                                     float limit, float alpha)
{
    RUN(SWIGLU_FORWARD, .t = {y, gate, up}, .i = {GPU_GLU_CLAMPED}, .f = {limit, alpha}, .n = n);
}

zo_status gpu_swiglu_clamped_backward(gpu_stream_t s, gpu_tensor dgate, gpu_tensor dup, gpu_tensor dy,
                                      gpu_tensor gate, gpu_tensor up, size_t n, float limit, float alpha)
{
    RUN(SWIGLU_BACKWARD, .t = {dgate, dup, dy, gate, up}, .i = {GPU_GLU_CLAMPED}, .f = {limit, alpha}, .n = n);
}

zo_status gpu_embedding_forward(gpu_stream_t s, gpu_tensor out, const int32_t *tokens,
                                gpu_tensor wte, gpu_tensor wpe, int n, int t, int c, int vocab)
{
    RUN(EMBEDDING_FORWARD, .t = {out, wte, wpe}, .p = {(void *)tokens}, .i = {n, t, c, vocab});
}

zo_status gpu_embedding_forward_seq(gpu_stream_t s, gpu_tensor out, const int32_t *tokens, gpu_tensor wte,
                                    gpu_tensor wpe, const int32_t *pos, int n_pos, int n, int t, int c, int vocab)
{
    if (!pos) return zo_error(ZO_ERR_INVALID, "gpu_embedding_forward_seq: pos is NULL");
    RUN(EMBEDDING_FORWARD, .t = {out, wte, wpe}, .p = {(void *)tokens, (void *)pos},
        .i = {n, t, c, vocab, n_pos});
}

zo_status gpu_embedding_backward(gpu_stream_t s, gpu_tensor dwte, gpu_tensor dwpe,
                                 gpu_tensor dout, const int32_t *tokens, int n, int t, int c,
                                 int vocab)
{
    RUN(EMBEDDING_BACKWARD, .t = {dwte, dwpe, dout}, .p = {(void *)tokens},
        .i = {n, t, c, vocab});
}

zo_status gpu_cross_entropy_forward_cap(gpu_stream_t s, float *losses, gpu_tensor logits,
                                        const int32_t *targets, int n, int v, float cap)
{
    RUN(CROSS_ENTROPY_FORWARD, .t = {logits}, .p = {losses, (void *)targets}, .i = {n, v}, .f = {cap});
}

zo_status gpu_cross_entropy_backward_cap(gpu_stream_t s, gpu_tensor dlogits, gpu_tensor logits,
                                         const int32_t *targets, float dloss, int n, int v, float cap)
{
    RUN(CROSS_ENTROPY_BACKWARD, .t = {dlogits, logits}, .p = {(void *)targets}, .i = {n, v},
        .f = {dloss, cap});
}

zo_status gpu_cross_entropy_forward(gpu_stream_t s, float *losses, gpu_tensor logits,
                                    const int32_t *targets, int n, int v)
{
    return gpu_cross_entropy_forward_cap(s, losses, logits, targets, n, v, 0.0f);
}

zo_status gpu_cross_entropy_backward(gpu_stream_t s, gpu_tensor dlogits, gpu_tensor logits,
                                     const int32_t *targets, float dloss, int n, int v)
{
    return gpu_cross_entropy_backward_cap(s, dlogits, logits, targets, dloss, n, v, 0.0f);
}

zo_status gpu_add(gpu_stream_t s, gpu_tensor y, gpu_tensor a, gpu_tensor b, size_t n)
{
    RUN(ADD, .t = {y, a, b}, .n = n);
}

zo_status gpu_scale(gpu_stream_t s, gpu_tensor x, float alpha, size_t n)
{
    RUN(SCALE, .t = {x}, .f = {alpha}, .n = n);
}

zo_status gpu_softcap(gpu_stream_t s, gpu_tensor x, float cap, size_t n)
{
    if (!(cap > 0.0f)) return zo_error(ZO_ERR_INVALID, "gpu_softcap: cap %g must be > 0", cap);
    RUN(SOFTCAP, .t = {x}, .f = {cap}, .n = n);
}

zo_status gpu_cast(gpu_stream_t s, gpu_tensor dst, gpu_tensor src, size_t n)
{
    RUN(CAST, .t = {dst, src}, .n = n);
}

zo_status gpu_head_copy(gpu_stream_t s, gpu_tensor y, gpu_tensor x, int n, int heads, int w, int fill,
                        int64_t ldy, int64_t hsy, int64_t ldx, int64_t hsx)
{
    RUN(HEAD_COPY, .t = {y, x}, .i = {n, heads, w, fill, ldy, hsy, ldx, hsx});
}

zo_status gpu_check_finite(gpu_stream_t s, int32_t *flag, gpu_tensor x, size_t n)
{
    RUN(CHECK_FINITE, .t = {x}, .p = {flag}, .n = n);
}

zo_status gpu_sum_squares(gpu_stream_t s, double *sum, gpu_tensor x, size_t n)
{
    RUN(SUM_SQUARES, .t = {x}, .p = {sum}, .n = n);
}

zo_status gpu_nf4_dequantize(gpu_stream_t s, gpu_tensor out, const void *nf4, size_t n)
{
    RUN(NF4_DEQUANTIZE, .t = {out}, .p = {(void *)nf4}, .n = n);
}

/* The hyperparameters are checked and their per-step scalars computed here
 * (in double, rounded to float, as cpu_adam does), so every backend uses the
 * very same values. */
zo_status gpu_adam_update(gpu_stream_t s, const gpu_adam_hparams *hp, size_t n, float *param,
                          gpu_tensor grad, float *m, float *v, gpu_tensor out16)
{
    zo_status st;
    if (!s) return zo_error(ZO_ERR_INVALID, "gpu_adam_update: NULL stream");
    if ((st = zo_adam_check_hparams("gpu_adam_update", hp)) != ZO_OK) return st;
    RUN(ADAM_UPDATE, .t = {grad, out16}, .p = {param, m, v}, .n = n,
        .d.adam = zo_adam_consts_make(hp));
}

/* The descriptor as the kernels take it: the step's scalars (as
 * gpu_adam_update's) and the offsets of the state's parts; gpu_op_run
 * checks the rest (gpu_check_adam_state). */
zo_status gpu_adam_state_update(gpu_stream_t s, const gpu_adam_hparams *hp,
                                const gpu_adam_state_desc *d, size_t n, gpu_tensor param,
                                gpu_tensor grad, void *state, gpu_tensor out16)
{
    const char *who = "gpu_adam_state_update";
    zo_status st;
    if (!s) return zo_error(ZO_ERR_INVALID, "%s: NULL stream", who);
    if (!d) return zo_error(ZO_ERR_INVALID, "%s: desc is NULL", who);
    if ((st = zo_adam_check_hparams(who, hp)) != ZO_OK) return st;
    if (d->n_decay > GPU_ADAM_DECAY_RANGES)
        return zo_error(ZO_ERR_INVALID, "%s: %d decay ranges (at most %d)", who, d->n_decay,
                        GPU_ADAM_DECAY_RANGES);
    uint64_t es = d->type == GPU_ADAM_STATE_F32 ? 4 : d->type == GPU_ADAM_STATE_BF16 ? 2 : 1;
    uint64_t nb = d->type == GPU_ADAM_STATE_Q8 && d->block ? (d->total + d->block - 1) / d->block : 0;
    zo_adam_state_offsets o = zo_adam_state_offsets_of(es, d->total, nb);
    gpu_adam_state_args x = {.c = zo_adam_consts_make(hp), .type = d->type, .block = d->block,
                             .total = d->total, .first = d->first, .off_m = o.m, .off_v = o.v,
                             .off_am = o.absmax_m, .off_av = o.absmax_v, .n_decay = d->n_decay,
                             .round = d->round, .sr_step = d->sr_step, .sr_block = d->sr_block,
                             .sr_first = d->sr_first};
    for (int k = 0; k < d->n_decay; k++) x.decay[k][0] = d->decay[k][0], x.decay[k][1] = d->decay[k][1];
    RUN(ADAM_STATE_UPDATE, .t = {param, grad, out16}, .p = {state, d->comp}, .n = n, .d.astate = x);
}

zo_status gpu_moe_router_forward(gpu_stream_t s, gpu_tensor weights, gpu_tensor logits,
                                 float *stats, uint8_t *order, int n, int e, int k,
                                 const gpu_moe_gate *gate, int group_rows)
{
    if (!gate) return zo_error(ZO_ERR_INVALID, "gpu_moe_router_forward: no gate");
    /* (the mode as an int: the enum is unsigned, and a mode of -1 would
     * reach the check, and its message, as 4294967295) */
    RUN(MOE_ROUTER_FORWARD, .t = {weights, logits}, .p = {stats, order, (void *)gate->bias},
        .i = {n, e, k, (int)gate->mode, group_rows, gate->groups, gate->topk_groups},
        .f = {0.0f, gate->eps, gate->scale});
}

zo_status gpu_moe_router_backward(gpu_stream_t s, gpu_tensor dlogits, gpu_tensor dweights,
                                  gpu_tensor logits, const float *stats, int n, int e, int k,
                                  const gpu_moe_gate *gate, int layers, int group_rows,
                                  float aux_scale)
{
    if (!gate) return zo_error(ZO_ERR_INVALID, "gpu_moe_router_backward: no gate");
    RUN(MOE_ROUTER_BACKWARD, .t = {dlogits, dweights, logits}, .p = {(void *)stats, (void *)gate->bias},
        .i = {n, e, k, (int)gate->mode, layers, group_rows, gate->groups, gate->topk_groups},
        .f = {aux_scale, gate->eps, gate->scale});
}

zo_status gpu_moe_scale_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor x, const float *scale,
                                int n, int c, int64_t lds, int sigmoid)
{
    RUN(MOE_SCALE_FORWARD, .t = {y, x}, .p = {(void *)scale}, .i = {n, c, lds, sigmoid});
}

zo_status gpu_moe_scale_backward(gpu_stream_t s, gpu_tensor dx, float *dscale, gpu_tensor dy,
                                 gpu_tensor x, const float *scale, int n, int c, int64_t lds,
                                 int sigmoid)
{
    RUN(MOE_SCALE_BACKWARD, .t = {dx, dy, x}, .p = {dscale, (void *)scale},
        .i = {n, c, lds, sigmoid});
}

zo_status gpu_moe_gather(gpu_stream_t s, gpu_tensor y, gpu_tensor x, const int32_t *idx, int n, int c)
{
    RUN(MOE_GATHER, .t = {y, x}, .p = {(void *)idx}, .i = {n, c});
}

zo_status gpu_moe_scatter_add(gpu_stream_t s, gpu_tensor y, gpu_tensor x, const int32_t *idx, int n,
                              int c, int64_t ldy)
{
    RUN(MOE_SCATTER_ADD, .t = {y, x}, .p = {(void *)idx}, .i = {n, c, ldy});
}
