/* Private: the table of functions a backend fills, and the structs behind
 * the opaque handles. Only device.c and the backends include this.
 *
 * device.c checks arguments once for every backend, then calls the entry;
 * entries may assume valid arguments. Entries marked (optional) may be NULL:
 * device.c then falls back to a synchronous path. */
#ifndef ZO_GPU_DEVICE_IMPL_H
#define ZO_GPU_DEVICE_IMPL_H

#include "gpu/device.h"

/* The loop-invariant scalars of one gpu_adam_update, computed once by
 * device.c (in double, rounded to float, as cpu_adam does) so that every
 * backend uses the very same values. */
typedef zo_adam_consts gpu_adam_consts; /* common/adam_math.h */

typedef struct gpu_backend_iface {
    const char *name;
    void (*free)(gpu_device_t dev);
    zo_status (*synchronize)(gpu_device_t dev);

    /* memory */
    zo_status (*mem_alloc)(gpu_device_t dev, size_t bytes, void **out);
    void (*mem_free)(gpu_device_t dev, void *p);
    /* (optional) NULL: synchronize the stream, then mem_free */
    zo_status (*mem_free_async)(gpu_device_t dev, void *p, gpu_stream_t s);
    void (*mem_get_stats)(gpu_device_t dev, gpu_mem_stats *out);
    void (*mem_reset_peak)(gpu_device_t dev);
    zo_status (*host_alloc)(gpu_device_t dev, size_t bytes, void **out);
    void (*host_free)(gpu_device_t dev, void *p);

    /* streams and events: create fills s->impl / ev->impl */
    zo_status (*stream_create)(gpu_device_t dev, gpu_stream_t s);
    void (*stream_destroy)(gpu_stream_t s);
    zo_status (*stream_synchronize)(gpu_stream_t s);
    zo_status (*event_create)(gpu_device_t dev, gpu_event_t ev);
    void (*event_destroy)(gpu_event_t ev);
    zo_status (*event_record)(gpu_event_t ev, gpu_stream_t s);
    zo_status (*stream_wait_event)(gpu_stream_t s, gpu_event_t ev);
    int (*event_query)(gpu_event_t ev);
    zo_status (*event_synchronize)(gpu_event_t ev);
    /* (optional) NULL: synchronize the stream, then call fn on the caller's thread */
    zo_status (*launch_host_func)(gpu_stream_t s, gpu_host_fn fn, void *arg);

    /* copies */
    zo_status (*memcpy_async)(gpu_stream_t s, void *dst, const void *src, size_t bytes,
                              gpu_copy_kind kind);
    zo_status (*memset_async)(gpu_stream_t s, void *dst, int value, size_t bytes);

    /* ops: same meaning as the public functions of the same name */
    zo_status (*gemm)(gpu_stream_t s, const gpu_gemm_desc *d);
    zo_status (*bias_forward)(gpu_stream_t s, gpu_tensor y, gpu_tensor bias, int n, int c,
                              int64_t ldy);
    zo_status (*bias_backward)(gpu_stream_t s, gpu_tensor dbias, gpu_tensor dy, int n, int c,
                               int64_t lddy);
    zo_status (*layernorm_forward)(gpu_stream_t s, gpu_tensor y, float *mean, float *rstd,
                                   gpu_tensor x, gpu_tensor w, gpu_tensor b, int n, int c,
                                   float eps);
    zo_status (*layernorm_backward)(gpu_stream_t s, gpu_tensor dx, gpu_tensor dw, gpu_tensor db,
                                    gpu_tensor dy, gpu_tensor x, gpu_tensor w,
                                    const float *mean, const float *rstd, int n, int c);
    zo_status (*rmsnorm_forward)(gpu_stream_t s, gpu_tensor y, float *rstd, gpu_tensor x,
                                 gpu_tensor w, int n, int c, float eps);
    zo_status (*rmsnorm_backward)(gpu_stream_t s, gpu_tensor dx, gpu_tensor dw, gpu_tensor dy,
                                  gpu_tensor x, gpu_tensor w, const float *rstd, int n, int c);
    zo_status (*attention_forward)(gpu_stream_t s, const gpu_attn_desc *a, gpu_tensor out,
                                   float *lse, gpu_tensor qkv);
    zo_status (*attention_backward)(gpu_stream_t s, const gpu_attn_desc *a, gpu_tensor dqkv,
                                    gpu_tensor dout, gpu_tensor qkv, gpu_tensor out,
                                    const float *lse);
    zo_status (*rope)(gpu_stream_t s, gpu_tensor x, int n, int t, int n_heads, int d,
                      int64_t ldx, float theta, int pos0, int inverse);
    zo_status (*gelu_forward)(gpu_stream_t s, gpu_tensor y, gpu_tensor x, size_t n);
    zo_status (*gelu_backward)(gpu_stream_t s, gpu_tensor dx, gpu_tensor dy, gpu_tensor x,
                               size_t n);
    zo_status (*swiglu_forward)(gpu_stream_t s, gpu_tensor y, gpu_tensor gate, gpu_tensor up,
                                size_t n);
    zo_status (*swiglu_backward)(gpu_stream_t s, gpu_tensor dgate, gpu_tensor dup,
                                 gpu_tensor dy, gpu_tensor gate, gpu_tensor up, size_t n);
    zo_status (*embedding_forward)(gpu_stream_t s, gpu_tensor out, const int32_t *tokens,
                                   gpu_tensor wte, gpu_tensor wpe, int n, int t, int c,
                                   int vocab);
    zo_status (*embedding_backward)(gpu_stream_t s, gpu_tensor dwte, gpu_tensor dwpe,
                                    gpu_tensor dout, const int32_t *tokens, int n, int t, int c,
                                    int vocab);
    zo_status (*cross_entropy_forward)(gpu_stream_t s, float *losses, gpu_tensor logits,
                                       const int32_t *targets, int n, int v);
    zo_status (*cross_entropy_backward)(gpu_stream_t s, gpu_tensor dlogits, gpu_tensor logits,
                                        const int32_t *targets, float dloss, int n, int v);
    zo_status (*add)(gpu_stream_t s, gpu_tensor y, gpu_tensor a, gpu_tensor b, size_t n);
    zo_status (*scale)(gpu_stream_t s, gpu_tensor x, float alpha, size_t n);
    zo_status (*cast)(gpu_stream_t s, gpu_tensor dst, gpu_tensor src, size_t n);
    zo_status (*check_finite)(gpu_stream_t s, int32_t *flag, gpu_tensor x, size_t n);
    zo_status (*sum_squares)(gpu_stream_t s, float *sum, gpu_tensor x, size_t n);
    zo_status (*nf4_dequantize)(gpu_stream_t s, gpu_tensor out, const void *nf4, size_t n);
    /* gpu_adam_update with the per-step scalars already computed */
    zo_status (*adam_update)(gpu_stream_t s, const gpu_adam_consts *c, size_t n,
                             float *param, gpu_tensor grad, float *m, float *v, gpu_tensor out16);
} gpu_backend_iface;

/* Live streams and events are kept on lists so gpu_device_free can end them. */
struct gpu_stream {
    gpu_device_t dev;
    void *impl;
    struct gpu_stream *next;
};

struct gpu_event {
    gpu_device_t dev;
    void *impl;
    struct gpu_event *next;
};

struct gpu_device {
    const gpu_backend_iface *iface;
    void *ctx;
    struct gpu_stream *streams;
    struct gpu_event *events;
    void *list_lock; /* pthread_mutex_t *, guards the two lists */
};

/* Called by a backend's init: allocate the handle around its context. */
zo_status gpu_device_wrap(const gpu_backend_iface *iface, void *ctx, gpu_device_t *out);

#endif
