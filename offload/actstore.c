/* Activation checkpoints: the boundary activations between blocks, kept
 * from a block's forward to its successor's backward (actstore.h).
 *
 *   device   every boundary in a device buffer of its own: the blocks read
 *            and write them in place
 *   pass     (forward only) two device buffers the boundaries take in turn
 *   host     every boundary in pinned host memory, through a ring of two
 *            device buffers: a boundary goes out on the d2h stream after
 *            the block that wrote it, and comes back on the h2d stream one
 *            block ahead of the backward that reads it (with recompute,
 *            only block inputs are kept)
 *
 * Every cross-stream dependency is an event. */
#include "offload/actstore.h"

#include <stdlib.h>

/* ---- on the device ---------------------------------------------------------------------- */

typedef struct dev_acts {
    actstore base;
    void **bnd;            /* [n_bnd] device buffers, or NULL (no boundaries) */
    int n_bnd;             /* nb - 1; forward only: 2 at most, boundary k in bnd[k % 2] */
} dev_acts;

static zo_status dev_forward(actstore *as, gpu_stream_t s, int b, offload_block_io *io)
{
    void **bnd = ((dev_acts *)as)->bnd;
    (void)s;
    io->in = bnd && b > 0 ? bnd[b - 1] : NULL;
    io->out = bnd && b < as->nb - 1 ? bnd[b] : NULL;
    return ZO_OK;
}

static zo_status dev_backward(actstore *as, gpu_stream_t s, int b, offload_block_io *io)
{
    void **bnd = ((dev_acts *)as)->bnd;
    (void)s;
    io->in = bnd && b > 0 ? bnd[b - 1] : NULL;
    io->out = NULL;
    return ZO_OK;
}

static zo_status dev_done(actstore *as, gpu_stream_t s, int b)
{
    (void)as, (void)s, (void)b;
    return ZO_OK;
}

static void dev_pass_begin(actstore *as) { (void)as; }

static void dev_free(actstore *as)
{
    dev_acts *d = (dev_acts *)as;
    if (d->bnd)
        for (int k = 0; k < d->n_bnd; k++) gpu_mem_free(as->env->dev, d->bnd[k]);
    free(d->bnd);
    free(d);
}

static const actstore_ops dev_ops = {
    .forward = dev_forward, .forward_done = dev_done, .backward = dev_backward, .backward_done = dev_done,
    .pass_begin = dev_pass_begin, .free = dev_free,
};

/* ---- forward only: two device buffers in turn ------------------------------------------------
 * A forward keeps no boundary for a backward: block b reads the buffer
 * block b-1 wrote and writes the other, which block b-1's input held (the
 * compute stream orders them). */

static zo_status pass_forward(actstore *as, gpu_stream_t s, int b, offload_block_io *io)
{
    void **bnd = ((dev_acts *)as)->bnd;
    (void)s;
    io->in = bnd && b > 0 ? bnd[(b - 1) % 2] : NULL;
    io->out = bnd && b < as->nb - 1 ? bnd[b % 2] : NULL;
    return ZO_OK;
}

static zo_status pass_backward(actstore *as, gpu_stream_t s, int b, offload_block_io *io)
{
    (void)as, (void)s, (void)io;
    return zo_error(ZO_ERR_INVALID, "offload: block %d: a forward-only runtime keeps nothing for a backward", b);
}

static const actstore_ops pass_ops = {
    .forward = pass_forward, .forward_done = dev_done, .backward = pass_backward, .backward_done = dev_done,
    .pass_begin = dev_pass_begin, .free = dev_free,
};

static zo_status dev_create(actstore *as)
{
    dev_acts *d = (dev_acts *)as;
    size_t nbnd = (size_t)(as->nb - 1);
    zo_status st;
    if (as->ops == &pass_ops && nbnd > 2) nbnd = 2;
    d->n_bnd = (int)nbnd;
    if (!nbnd || !as->bytes) return ZO_OK;
    if (!(d->bnd = calloc(nbnd, sizeof(void *)))) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    for (size_t k = 0; k < nbnd; k++)
        if ((st = gpu_mem_alloc(as->env->dev, as->bytes, &d->bnd[k])) != ZO_OK)
            return zo_error_wrap(st, "offload_init: activation checkpoint %zu of %zu on the device", k + 1, nbnd);
    return ZO_OK;
}

/* ---- in host memory ------------------------------------------------------------------------ */

/* A device buffer of the ring. */
typedef struct ring_buf {
    void *buf;
    int holds;          /* boundary index it holds, -1 none */
    gpu_event_t used;   /* compute stream: the last block reading or writing it */
    gpu_event_t filled; /* h2d stream: a boundary was loaded into it */
    gpu_event_t saved;  /* d2h stream: its boundary reached host memory */
    int has_used, has_filled, has_saved;
} ring_buf;

typedef struct host_acts {
    actstore base;
    void **host;           /* [nb - 1] pinned, or NULL (no boundaries) */
    ring_buf ring[2];
} host_acts;

/* The ring buffer of boundary k. */
static ring_buf *ring_of(actstore *as, int k) { return &((host_acts *)as)->ring[k & 1]; }

static zo_status host_forward(actstore *as, gpu_stream_t s, int b, offload_block_io *io)
{
    zo_status st;
    io->in = NULL;
    io->out = NULL;
    if (!as->bytes) return ZO_OK;
    if (b > 0) io->in = ring_of(as, b - 1)->buf;
    if (b < as->nb - 1) {
        ring_buf *r = ring_of(as, b);
        /* overwritten only once its previous boundary reached the host */
        if (r->has_saved && (st = gpu_stream_wait_event(s, r->saved)) != ZO_OK) return st;
        io->out = r->buf;
        r->holds = b;
    }
    return ZO_OK;
}

/* After forward of block b: boundary b to host memory. */
static zo_status host_forward_done(actstore *as, gpu_stream_t s, int b)
{
    zo_status st;
    gpu_stream_t d2h = as->env->d2h;
    if (!as->bytes || b >= as->nb - 1) return ZO_OK;
    ring_buf *r = ring_of(as, b);
    if ((st = gpu_event_record(r->used, s)) != ZO_OK) return st;
    r->has_used = 1;
    if ((st = gpu_stream_wait_event(d2h, r->used)) != ZO_OK ||
        (st = gpu_memcpy_async(d2h, ((host_acts *)as)->host[b], r->buf, as->bytes, GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
        (st = gpu_event_record(r->saved, d2h)) != ZO_OK)
        return st;
    r->has_saved = 1;
    offload_add_bytes(as->env->acct, OFFLOAD_BYTES_D2H, as->bytes);
    if (b > 0) { /* the input was read by this block too */
        ring_buf *ri = ring_of(as, b - 1);
        if ((st = gpu_event_record(ri->used, s)) != ZO_OK) return st;
        ri->has_used = 1;
    }
    return ZO_OK;
}

/* Boundary k into its ring buffer. */
static zo_status host_load(actstore *as, int k)
{
    zo_status st;
    gpu_stream_t h2d = as->env->h2d;
    ring_buf *r = ring_of(as, k);
    if (r->holds == k) return ZO_OK;
    if (r->has_used && (st = gpu_stream_wait_event(h2d, r->used)) != ZO_OK) return st;
    if ((st = gpu_memcpy_async(h2d, r->buf, ((host_acts *)as)->host[k], as->bytes, GPU_COPY_HOST_TO_DEVICE)) !=
            ZO_OK ||
        (st = gpu_event_record(r->filled, h2d)) != ZO_OK)
        return st;
    r->has_filled = 1;
    r->holds = k;
    offload_add_bytes(as->env->acct, OFFLOAD_BYTES_H2D, as->bytes);
    return ZO_OK;
}

/* Backward of block b reads boundary b-1. */
static zo_status host_backward(actstore *as, gpu_stream_t s, int b, offload_block_io *io)
{
    zo_status st;
    io->in = NULL;
    io->out = NULL;
    if (!as->bytes || b == 0) return ZO_OK;
    ring_buf *r = ring_of(as, b - 1);
    if ((st = host_load(as, b - 1)) != ZO_OK) return st;
    if (r->has_filled && (st = gpu_stream_wait_event(s, r->filled)) != ZO_OK) return st;
    io->in = r->buf;
    return ZO_OK;
}

/* After backward of block b: its input buffer is free; the input of block
 * b-1 (boundary b-2) comes into the other one. */
static zo_status host_backward_done(actstore *as, gpu_stream_t s, int b)
{
    zo_status st;
    if (!as->bytes || b == 0) return ZO_OK;
    ring_buf *r = ring_of(as, b - 1);
    if ((st = gpu_event_record(r->used, s)) != ZO_OK) return st;
    r->has_used = 1;
    return b >= 2 ? host_load(as, b - 2) : ZO_OK;
}

/* The ring is empty. */
static void host_pass_begin(actstore *as)
{
    for (int k = 0; k < 2; k++) ((host_acts *)as)->ring[k].holds = -1;
}

static void host_free(actstore *as)
{
    host_acts *h = (host_acts *)as;
    gpu_device_t d = as->env->dev;
    for (int k = 0; k < 2; k++) {
        ring_buf *r = &h->ring[k];
        gpu_mem_free(d, r->buf);
        if (r->used) gpu_event_destroy(r->used);
        if (r->filled) gpu_event_destroy(r->filled);
        if (r->saved) gpu_event_destroy(r->saved);
    }
    if (h->host)
        for (int k = 0; k < as->nb - 1; k++) offload_host_free(as->env, h->host[k], as->bytes, 1);
    free(h->host);
    free(h);
}

static const actstore_ops host_ops = {
    .forward = host_forward, .forward_done = host_forward_done, .backward = host_backward,
    .backward_done = host_backward_done, .pass_begin = host_pass_begin, .free = host_free,
};

static zo_status host_create(actstore *as)
{
    host_acts *h = (host_acts *)as;
    const offload_env *env = as->env;
    size_t nbnd = (size_t)(as->nb - 1);
    zo_status st;
    for (int k = 0; k < 2; k++) h->ring[k].holds = -1;
    if (!nbnd || !as->bytes) return ZO_OK;
    if (!(h->host = calloc(nbnd, sizeof(void *)))) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    for (size_t k = 0; k < nbnd; k++)
        if ((st = offload_host_alloc(env, as->bytes, 1, &h->host[k])) != ZO_OK)
            return zo_error_wrap(st, "offload_init: activation checkpoints in host memory");
    for (int k = 0; k < 2; k++) {
        ring_buf *r = &h->ring[k];
        if ((st = gpu_mem_alloc(env->dev, as->bytes, &r->buf)) != ZO_OK)
            return zo_error_wrap(st, "offload_init: activation ring on the device");
        if ((st = gpu_event_create(env->dev, &r->used)) != ZO_OK ||
            (st = gpu_event_create(env->dev, &r->filled)) != ZO_OK ||
            (st = gpu_event_create(env->dev, &r->saved)) != ZO_OK)
            return st;
    }
    return ZO_OK;
}

/* ---- life cycle ---------------------------------------------------------------------------- */

zo_status actstore_create(const offload_env *env, int nb, size_t bytes, offload_tier on, actstore **out)
{
    *out = NULL;
    int host = on == OFFLOAD_CPU;
    actstore *as = calloc(1, host ? sizeof(host_acts) : sizeof(dev_acts));
    if (!as) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    *as = (actstore){.ops = host ? &host_ops : on == ACTSTORE_PASS ? &pass_ops : &dev_ops, .env = env, .nb = nb,
                     .bytes = bytes};
    zo_status st = host ? host_create(as) : dev_create(as);
    if (st != ZO_OK) {
        actstore_free(as);
        return st;
    }
    *out = as;
    return ZO_OK;
}

void actstore_free(actstore *as)
{
    if (as) as->ops->free(as);
}
