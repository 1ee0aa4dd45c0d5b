/* Private: the table of functions a backend fills, and the structs behind
 * the opaque handles. Only device.c and the backends include this.
 *
 * device.c and ops.c check arguments once for every backend, then call the
 * entry; entries may assume valid arguments. Entries marked (optional) may be NULL:
 * device.c then falls back to a synchronous path. */
#ifndef ZO_GPU_DEVICE_IMPL_H
#define ZO_GPU_DEVICE_IMPL_H

#include "gpu/device.h"
#include "gpu/ops.h" /* defines: gpu_op_id, gpu_op_args */

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
    /* ms between two completed records of timed events (ev->timed: create
     * keeps the completion time); device.c has checked both are timed, of
     * this device, and complete */
    zo_status (*event_elapsed)(gpu_event_t start, gpu_event_t end, double *ms);
    /* (optional) NULL: synchronize the stream, then call fn on the caller's thread */
    zo_status (*launch_host_func)(gpu_stream_t s, gpu_host_fn fn, void *arg);

    /* copies */
    zo_status (*memcpy_async)(gpu_stream_t s, void *dst, const void *src, size_t bytes,
                              gpu_copy_kind kind);
    zo_status (*memset_async)(gpu_stream_t s, void *dst, int value, size_t bytes);

    /* ops: run op `id` (gpu/ops.h) with arguments gpu_op_run has checked;
     * each backend dispatches on the id to its column of the op table */
    zo_status (*op)(gpu_stream_t s, gpu_op_id id, const gpu_op_args *a);
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
    int timed; /* gpu_event_create_timed: set before the backend's create */
    int recorded; /* a timed event's first record was made (gpu_event_record) */
    struct gpu_event *next;
};

struct gpu_profile;

struct gpu_device {
    const gpu_backend_iface *iface;
    void *ctx;
    struct gpu_stream *streams;
    struct gpu_event *events;
    void *list_lock; /* pthread_mutex_t *, guards the two lists */
    /* the op profile (gpu/profile.h) while one is attached, else NULL: read
     * with __atomic_load_n by every thread that enqueues; NULL costs the
     * ops and copies one load and a branch */
    struct gpu_profile *prof;
};

/* Called by a backend's init: allocate the handle around its context. */
zo_status gpu_device_wrap(const gpu_backend_iface *iface, void *ctx, gpu_device_t *out);

#endif
