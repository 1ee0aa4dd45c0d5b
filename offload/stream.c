/* One micro-batch: blocks forward in order and backward in reverse, their
 * weights streamed through the device slots, their gradients streamed back
 * to the host, the activations between blocks kept on the device or in host
 * memory.
 *
 * Streams: the caller's compute stream `s`, the runtime's h2d stream (weights
 * and activation checkpoints coming in) and d2h stream (gradients and
 * checkpoints going out). Every cross-stream dependency is an event; the host
 * waits only on single events, timed as the part they belong to. */
#include "offload/offload_impl.h"

#include <stdio.h>
#include <string.h>

#define TRY(expr)                                                                           \
    do {                                                                                    \
        zo_status try_s_ = (expr);                                                          \
        if (try_s_ != ZO_OK) return try_s_;                                                 \
    } while (0)

/* Host wait on one event, added to a part of the time split. */
static zo_status timed_wait(offload_t *rt, gpu_event_t ev, offload_time_part part)
{
    double t0 = offload_now();
    zo_status st = gpu_event_synchronize(ev);
    rt->time[part] += offload_now() - t0;
    return st;
}

/* ---- weights --------------------------------------------------------------------- */

static const void *resident_params(offload_t *rt, int b)
{
    return (const char *)rt->store_dev + rt->off[b] * rt->es;
}

static int slot_of(offload_t *rt, int block)
{
    for (int i = 0; i < rt->n_slots; i++)
        if (rt->slots[i].block == block) return i;
    return -1;
}

/* Whether `block` is needed by schedule positions [from, to). */
static int needed_soon(offload_t *rt, int block, int from, int to)
{
    for (int p = from; p < to && p < rt->n_sched; p++) {
        int b = rt->sched[p];
        if (b == block || rt->dep[b] == block) return 1;
    }
    return 0;
}

/* Start loading `block` into a free slot; -1 when none can be taken now
 * (every free slot holds a block needed before this one). */
static zo_status load_block(offload_t *rt, int block, int horizon_end, int *slot_out)
{
    *slot_out = -1;
    int best = -1;
    for (int i = 0; i < rt->n_slots; i++) {
        offload_slot *sl = &rt->slots[i];
        if (sl->busy) continue;
        if (sl->block >= 0 && needed_soon(rt, sl->block, rt->pos, horizon_end)) continue;
        if (best < 0 || sl->released < rt->slots[best].released) best = i;
    }
    if (best < 0) return ZO_OK;
    offload_slot *sl = &rt->slots[best];
    size_t bytes = rt->numel[block] * rt->es;
    /* the copy overwrites the slot after the last block that used it has run */
    if (sl->used) TRY(gpu_stream_wait_event(rt->h2d, sl->freed));
    const void *src;
    if (rt->cfg.params_on == OFFLOAD_CPU) {
        src = (const char *)rt->store_host + rt->off[block] * rt->es;
    } else {
        /* NVMe: read into a pinned buffer of the ring, whose last copy must be done */
        int r = rt->par_ring_next;
        rt->par_ring_next = (r + 1) % rt->n_slots;
        if (rt->par_ring_used[r]) TRY(timed_wait(rt, rt->par_ring_ev[r], OFFLOAD_TIME_WEIGHTS));
        double t0 = offload_now();
        zo_status st = offload_par_read(rt, block, rt->par_ring[r]);
        rt->time[OFFLOAD_TIME_DISK] += offload_now() - t0;
        if (st != ZO_OK) return st;
        rt->bytes_disk_read += bytes;
        src = rt->par_ring[r];
        TRY(gpu_memcpy_async(rt->h2d, sl->buf, src, bytes, GPU_COPY_HOST_TO_DEVICE));
        TRY(gpu_event_record(rt->par_ring_ev[r], rt->h2d));
        rt->par_ring_used[r] = 1;
        goto loaded;
    }
    if (bytes) TRY(gpu_memcpy_async(rt->h2d, sl->buf, src, bytes, GPU_COPY_HOST_TO_DEVICE));
loaded:
    TRY(gpu_event_record(sl->ready, rt->h2d));
    rt->bytes_h2d += bytes;
    sl->block = block;
    *slot_out = best;
    return ZO_OK;
}

/* Issue loads for the blocks of schedule positions [pos, pos + depth]. */
static zo_status prefetch(offload_t *rt)
{
    int end = rt->pos + rt->cfg.prefetch_depth + 1;
    if (end > rt->n_sched) end = rt->n_sched;
    for (int p = rt->pos; p < end; p++) {
        int need[2] = {rt->sched[p], rt->dep[rt->sched[p]]};
        for (int k = 0; k < 2; k++) {
            if (need[k] < 0 || slot_of(rt, need[k]) >= 0) continue;
            int s;
            TRY(load_block(rt, need[k], p + 1, &s));
            if (s < 0) return ZO_OK; /* no slot free: later positions wait too */
        }
    }
    return ZO_OK;
}

/* Make block b's weights (and its dependency's) usable on `s`: the device
 * waits for their copies by event. */
static zo_status acquire(offload_t *rt, gpu_stream_t s, int b, const void **params,
                         const void **dep_params)
{
    int dep = rt->dep[b];
    *dep_params = NULL;
    /* wait until the previous block has run: the compute part of the split */
    if (rt->has_prev) TRY(timed_wait(rt, rt->prev_done, OFFLOAD_TIME_COMPUTE));
    if (rt->cfg.params_on == OFFLOAD_DEVICE) {
        *params = resident_params(rt, b);
        if (dep >= 0) *dep_params = resident_params(rt, dep);
        return ZO_OK;
    }
    TRY(prefetch(rt));
    int ids[2] = {b, dep};
    for (int k = 0; k < 2; k++) {
        if (ids[k] < 0) continue;
        int i = slot_of(rt, ids[k]);
        if (i < 0) {
            TRY(load_block(rt, ids[k], rt->pos + 1, &i));
            if (i < 0)
                return zo_error(ZO_ERR_INTERNAL, "offload: no device slot free for block %d (%d slots)",
                                ids[k], rt->n_slots);
        }
        offload_slot *sl = &rt->slots[i];
        sl->busy = 1;
        /* the time the weights were late by */
        TRY(timed_wait(rt, sl->ready, OFFLOAD_TIME_WEIGHTS));
        TRY(gpu_stream_wait_event(s, sl->ready));
        if (k == 0) *params = sl->buf;
        else *dep_params = sl->buf;
    }
    return ZO_OK;
}

/* Block b's work is enqueued on s: mark its slots reusable after it. */
static zo_status release(offload_t *rt, gpu_stream_t s, int b)
{
    TRY(gpu_event_record(rt->prev_done, s));
    rt->has_prev = 1;
    rt->pos++;
    if (rt->cfg.params_on == OFFLOAD_DEVICE) return ZO_OK;
    int ids[2] = {b, rt->dep[b]};
    for (int k = 0; k < 2; k++) {
        if (ids[k] < 0) continue;
        int i = slot_of(rt, ids[k]);
        if (i < 0) continue;
        offload_slot *sl = &rt->slots[i];
        TRY(gpu_event_record(sl->freed, s));
        sl->used = 1;
        sl->busy = 0;
        sl->released = ++rt->tick;
    }
    return ZO_OK;
}

/* ---- gradients ------------------------------------------------------------------------- */

/* Add the gradients of gradient slot k (on the host once its copy is done)
 * into the fp32 sum. */
static zo_status grads_accumulate(offload_t *rt, int k)
{
    offload_gslot *g = &rt->gs[k];
    if (g->block < 0) return ZO_OK;
    TRY(timed_wait(rt, g->copied, OFFLOAD_TIME_GRADS));
    double t0 = offload_now();
    int b = g->block;
    size_t n = rt->numel[b];
    float *acc = rt->grad + rt->off[b];
    const void *src = g->host;
    switch (rt->m.dtype) {
    case ZO_DTYPE_F32: {
        const float *x = src;
        for (size_t i = 0; i < n; i++) acc[i] += x[i];
        break;
    }
    case ZO_DTYPE_F16: {
        const uint16_t *x = src;
        for (size_t i = 0; i < n; i++) acc[i] += zo_f16_to_f32(x[i]);
        break;
    }
    default: {
        const uint16_t *x = src;
        for (size_t i = 0; i < n; i++) acc[i] += zo_bf16_to_f32(x[i]);
        break;
    }
    }
    g->block = -1;
    rt->time[OFFLOAD_TIME_GRADS] += offload_now() - t0;
    return ZO_OK;
}

zo_status offload_grads_drain(offload_t *rt)
{
    for (int k = 0; k < OFFLOAD_GRAD_SLOTS; k++) TRY(grads_accumulate(rt, k));
    return ZO_OK;
}

/* A free gradient slot, zeroed on s; `avoid` is a slot already taken. */
static zo_status grads_take(offload_t *rt, gpu_stream_t s, int avoid, int *out)
{
    int k = -1;
    for (int i = 0; i < OFFLOAD_GRAD_SLOTS; i++)
        if (i != avoid && rt->gs[i].block < 0) {
            k = i;
            break;
        }
    if (k < 0) {
        k = avoid == 0 ? 1 : 0;
        TRY(grads_accumulate(rt, k));
    }
    /* the device buffer is free once its last copy out has run */
    TRY(gpu_stream_wait_event(s, rt->gs[k].copied));
    TRY(gpu_memset_async(s, rt->gs[k].dev, 0, rt->slot_bytes));
    *out = k;
    return ZO_OK;
}

/* Backward of a block wrote slot k's gradients for `block`: copy them out,
 * or, for a block of the optimizer's device share, add them to its fp32 sum
 * on the device (the same fp32 additions as the host's, so the same bits). */
static zo_status grads_send(offload_t *rt, gpu_stream_t s, int k, int block)
{
    offload_gslot *g = &rt->gs[k];
    size_t bytes = rt->numel[block] * rt->es;
    if (block >= rt->dev_block) {
        float *acc = rt->d_grad + (rt->off[block] - rt->dev_first);
        size_t n = rt->numel[block];
        /* acc [n] fp32 += slot [n] model dtype, in stream order after backward;
         * the slot is zeroed for its next block later on the same stream */
        if (n) TRY(gpu_add(s, gpu_t(acc, ZO_DTYPE_F32), gpu_t(acc, ZO_DTYPE_F32),
                           gpu_t(g->dev, rt->m.dtype), n));
        g->block = -1;
        return ZO_OK;
    }
    TRY(gpu_event_record(g->done, s));
    TRY(gpu_stream_wait_event(rt->d2h, g->done));
    if (bytes) TRY(gpu_memcpy_async(rt->d2h, g->host, g->dev, bytes, GPU_COPY_DEVICE_TO_HOST));
    TRY(gpu_event_record(g->copied, rt->d2h));
    rt->bytes_d2h += bytes;
    g->block = block;
    return ZO_OK;
}

/* ---- activation boundaries ----------------------------------------------------------- */

/* Host-memory checkpoints: the ring slot of boundary k. */
static offload_ring *ring_of(offload_t *rt, int k) { return &rt->ring[k & 1]; }

/* Forward of block b: its input boundary b-1 and output boundary b. */
static zo_status bounds_forward(offload_t *rt, gpu_stream_t s, int b, offload_block_io *io)
{
    int last = rt->nb - 1;
    io->in = NULL;
    io->out = NULL;
    if (!rt->m.boundary_bytes) return ZO_OK;
    if (rt->bnd) {
        if (b > 0) io->in = rt->bnd[b - 1];
        if (b < last) io->out = rt->bnd[b];
        return ZO_OK;
    }
    if (b > 0) io->in = ring_of(rt, b - 1)->buf;
    if (b < last) {
        offload_ring *r = ring_of(rt, b);
        /* overwritten only once its previous boundary reached the host */
        if (r->has_saved) TRY(gpu_stream_wait_event(s, r->saved));
        io->out = r->buf;
        r->holds = b;
    }
    return ZO_OK;
}

/* After forward of block b: send boundary b to host memory. */
static zo_status bounds_forward_done(offload_t *rt, gpu_stream_t s, int b)
{
    if (rt->bnd || !rt->m.boundary_bytes || b >= rt->nb - 1) return ZO_OK;
    offload_ring *r = ring_of(rt, b);
    TRY(gpu_event_record(r->used, s));
    r->has_used = 1;
    TRY(gpu_stream_wait_event(rt->d2h, r->used));
    TRY(gpu_memcpy_async(rt->d2h, rt->bnd_host[b], r->buf, rt->m.boundary_bytes,
                         GPU_COPY_DEVICE_TO_HOST));
    TRY(gpu_event_record(r->saved, rt->d2h));
    r->has_saved = 1;
    rt->bytes_d2h += rt->m.boundary_bytes;
    if (b > 0) { /* the input was read by this block too */
        offload_ring *ri = ring_of(rt, b - 1);
        TRY(gpu_event_record(ri->used, s));
        ri->has_used = 1;
    }
    return ZO_OK;
}

/* Load boundary k into its ring slot (host-memory checkpoints). */
static zo_status bounds_load(offload_t *rt, int k)
{
    offload_ring *r = ring_of(rt, k);
    if (r->holds == k) return ZO_OK;
    if (r->has_used) TRY(gpu_stream_wait_event(rt->h2d, r->used));
    TRY(gpu_memcpy_async(rt->h2d, r->buf, rt->bnd_host[k], rt->m.boundary_bytes,
                         GPU_COPY_HOST_TO_DEVICE));
    TRY(gpu_event_record(r->filled, rt->h2d));
    r->has_filled = 1;
    r->holds = k;
    rt->bytes_h2d += rt->m.boundary_bytes;
    return ZO_OK;
}

/* Backward of block b reads boundary b-1. */
static zo_status bounds_backward(offload_t *rt, gpu_stream_t s, int b, offload_block_io *io)
{
    io->in = NULL;
    io->out = NULL;
    if (!rt->m.boundary_bytes || b == 0) return ZO_OK;
    if (rt->bnd) {
        io->in = rt->bnd[b - 1];
        return ZO_OK;
    }
    offload_ring *r = ring_of(rt, b - 1);
    TRY(bounds_load(rt, b - 1));
    if (r->has_filled) TRY(gpu_stream_wait_event(s, r->filled));
    io->in = r->buf;
    return ZO_OK;
}

/* After backward of block b: its input slot is free; prefetch the input of
 * block b-1 (boundary b-2) into the other slot. */
static zo_status bounds_backward_done(offload_t *rt, gpu_stream_t s, int b)
{
    if (rt->bnd || !rt->m.boundary_bytes || b == 0) return ZO_OK;
    offload_ring *r = ring_of(rt, b - 1);
    TRY(gpu_event_record(r->used, s));
    r->has_used = 1;
    if (b >= 2) TRY(bounds_load(rt, b - 2));
    return ZO_OK;
}

/* ---- the micro-batch ------------------------------------------------------------------- */

/* Forward of every block in order. */
static zo_status forward_blocks(offload_t *rt, gpu_stream_t s)
{
    for (int b = 0; b < rt->nb; b++) {
        offload_block_io io = {0};
        TRY(acquire(rt, s, b, &io.params, &io.dep_params));
        TRY(bounds_forward(rt, s, b, &io));
        TRY(rt->m.forward(rt->m.user, b, &io, s));
        TRY(bounds_forward_done(rt, s, b));
        TRY(release(rt, s, b));
    }
    return ZO_OK;
}

static zo_status micro_batch_run(offload_t *rt, gpu_stream_t s, double t_start)
{
    int nb = rt->nb;
    rt->pos = 0;
    rt->has_prev = 0;
    if (rt->micro == 0) {
        if (rt->dev_first) memset(rt->grad, 0, rt->dev_first * sizeof(float));
        if (rt->d_grad)
            TRY(gpu_memset_async(s, rt->d_grad, 0, (rt->n - rt->dev_first) * sizeof(float)));
    }
    /* the activations ring starts empty each micro-batch */
    for (int k = 0; k < 2; k++) rt->ring[k].holds = -1;

    TRY(forward_blocks(rt, s));
    for (int b = nb - 1; b >= 0; b--) {
        offload_block_io io = {0};
        TRY(acquire(rt, s, b, &io.params, &io.dep_params));
        TRY(bounds_backward(rt, s, b, &io));
        int k, kd = -1, dep = rt->dep[b];
        TRY(grads_take(rt, s, -1, &k));
        io.grads = rt->gs[k].dev;
        if (dep >= 0) {
            TRY(grads_take(rt, s, k, &kd));
            io.dep_grads = rt->gs[kd].dev;
        }
        if (rt->cfg.recompute) TRY(rt->m.recompute(rt->m.user, b, &io, s));
        TRY(rt->m.backward(rt->m.user, b, &io, rt->loss_scale, s));
        /* the dependency's share first: the same order whatever the placement */
        if (kd >= 0) TRY(grads_send(rt, s, kd, dep));
        TRY(grads_send(rt, s, k, b));
        TRY(bounds_backward_done(rt, s, b));
        TRY(release(rt, s, b));
        /* add the previous block's gradients while the device runs this one */
        for (int i = 0; i < OFFLOAD_GRAD_SLOTS; i++)
            if (i != k && i != kd) TRY(grads_accumulate(rt, i));
    }
    /* the compute of the last block, then its gradients */
    TRY(timed_wait(rt, rt->prev_done, OFFLOAD_TIME_COMPUTE));
    TRY(offload_grads_drain(rt));
    rt->has_prev = 0;
    rt->micro++;
    rt->n_micro++;
    offload_device_peak(rt);
    rt->total_s += offload_now() - t_start;
    return ZO_OK;
}

/* After a failure part-way: let the work already queued (the model's ops on
 * `s`, the runtime's copies) finish, so that nothing in flight uses the
 * runtime's buffers when it returns (the caller may free it next), and
 * forget the step's gradients, which now hold part of a micro-batch; the
 * slots are free again, so the runtime can go on. */
static void micro_batch_abandon(offload_t *rt, gpu_stream_t s)
{
    gpu_stream_synchronize(s);
    gpu_stream_synchronize(rt->h2d);
    gpu_stream_synchronize(rt->d2h);
    for (int i = 0; i < rt->n_slots; i++) rt->slots[i].busy = 0;
    for (int k = 0; k < OFFLOAD_GRAD_SLOTS; k++) rt->gs[k].block = -1;
    rt->has_prev = 0;
    rt->micro = 0;
}

static zo_status forward_run(offload_t *rt, gpu_stream_t s)
{
    rt->pos = 0;
    rt->has_prev = 0;
    for (int k = 0; k < 2; k++) rt->ring[k].holds = -1;
    TRY(forward_blocks(rt, s));
    TRY(timed_wait(rt, rt->prev_done, OFFLOAD_TIME_COMPUTE));
    rt->has_prev = 0;
    return ZO_OK;
}

zo_status offload_forward(offload_t *rt, gpu_stream_t s)
{
    int micro = rt->micro;
    zo_status st = forward_run(rt, s);
    if (st != ZO_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", zo_last_error());
        micro_batch_abandon(rt, s);
        rt->micro = micro; /* the step's gradients are untouched by a forward */
        st = zo_error(st, "%s", msg);
    }
    return st;
}

zo_status offload_micro_batch(offload_t *rt, gpu_stream_t s)
{
    double t_start = offload_now();
    zo_status st = micro_batch_run(rt, s, t_start);
    if (st != ZO_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", zo_last_error());
        micro_batch_abandon(rt, s);
        st = zo_error(st, "%s", msg); /* the failure's own message, not the waits' */
    }
    return st;
}
