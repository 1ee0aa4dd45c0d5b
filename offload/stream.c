/* One micro-batch: blocks forward in order and backward in reverse, their
 * weights streamed from the weight store through the device slots, their
 * gradients summed where their optimizer state lives (fp32 on the host, or
 * on the device for the device shard), the activations between blocks kept
 * on the device or in host memory.
 *
 * Streams: the caller's compute stream `s`, the runtime's h2d stream (weights
 * and activation checkpoints coming in) and d2h stream (gradients and
 * checkpoints going out). Every cross-stream dependency is an event; the host
 * waits only on single events, timed as the part they belong to. */
#include "offload/offload_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- allocation ------------------------------------------------------------------- */

static zo_status alloc_slots(offload_t *rt)
{
    zo_status st;
    rt->slots = calloc((size_t)rt->n_slots, sizeof *rt->slots);
    if (!rt->slots) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    for (int i = 0; i < rt->n_slots; i++) {
        offload_slot *sl = &rt->slots[i];
        sl->block = -1;
        if ((st = gpu_mem_alloc(rt->env.dev, rt->slot_size, &sl->buf)) != ZO_OK)
            return zo_error_wrap(st, "offload_init: device weight slot %d of %d (%zu bytes each)", i + 1,
                                 rt->n_slots, rt->slot_size);
        if ((st = gpu_event_create(rt->env.dev, &sl->ready)) != ZO_OK) return st;
        if ((st = gpu_event_create(rt->env.dev, &sl->freed)) != ZO_OK) return st;
    }
    return ZO_OK;
}

static zo_status alloc_boundaries(offload_t *rt)
{
    zo_status st;
    const offload_env *env = &rt->env;
    size_t nbnd = (size_t)(rt->g.nb - 1), bytes = rt->m.boundary_bytes;
    if (!nbnd || !bytes) return ZO_OK;
    if (rt->cfg.checkpoints_on == OFFLOAD_DEVICE) {
        rt->bnd = calloc(nbnd, sizeof(void *));
        if (!rt->bnd) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
        for (size_t k = 0; k < nbnd; k++)
            if ((st = gpu_mem_alloc(env->dev, bytes, &rt->bnd[k])) != ZO_OK)
                return zo_error_wrap(st, "offload_init: activation checkpoint %zu of %zu on the device", k + 1, nbnd);
        return ZO_OK;
    }
    rt->bnd_host = calloc(nbnd, sizeof(void *));
    if (!rt->bnd_host) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    for (size_t k = 0; k < nbnd; k++)
        if ((st = offload_host_alloc(env, bytes, 1, &rt->bnd_host[k])) != ZO_OK)
            return zo_error_wrap(st, "offload_init: activation checkpoints in host memory");
    for (int k = 0; k < 2; k++) {
        offload_ring *r = &rt->ring[k];
        r->holds = -1;
        if ((st = gpu_mem_alloc(env->dev, bytes, &r->buf)) != ZO_OK)
            return zo_error_wrap(st, "offload_init: activation ring on the device");
        if ((st = gpu_event_create(env->dev, &r->used)) != ZO_OK ||
            (st = gpu_event_create(env->dev, &r->filled)) != ZO_OK ||
            (st = gpu_event_create(env->dev, &r->saved)) != ZO_OK)
            return st;
    }
    return ZO_OK;
}

zo_status offload_stream_init(offload_t *rt)
{
    zo_status st;
    if (rt->n_slots && (st = alloc_slots(rt)) != ZO_OK) return st;
    if ((st = gpu_event_create(rt->env.dev, &rt->prev_done)) != ZO_OK) return st;
    return alloc_boundaries(rt);
}

void offload_stream_free(offload_t *rt)
{
    gpu_device_t d = rt->env.dev;
    const offload_env *env = &rt->env;
    if (rt->slots)
        for (int i = 0; i < rt->n_slots; i++) {
            gpu_mem_free(d, rt->slots[i].buf);
            if (rt->slots[i].ready) gpu_event_destroy(rt->slots[i].ready);
            if (rt->slots[i].freed) gpu_event_destroy(rt->slots[i].freed);
        }
    free(rt->slots);
    rt->slots = NULL;
    for (int k = 0; k < 2; k++) {
        offload_ring *r = &rt->ring[k];
        gpu_mem_free(d, r->buf);
        if (r->used) gpu_event_destroy(r->used);
        if (r->filled) gpu_event_destroy(r->filled);
        if (r->saved) gpu_event_destroy(r->saved);
    }
    if (rt->prev_done) gpu_event_destroy(rt->prev_done);
    if (rt->bnd)
        for (int k = 0; k < rt->g.nb - 1; k++) gpu_mem_free(d, rt->bnd[k]);
    free(rt->bnd);
    if (rt->bnd_host)
        for (int k = 0; k < rt->g.nb - 1; k++) offload_host_free(env, rt->bnd_host[k], rt->m.boundary_bytes, 1);
    free(rt->bnd_host);
}

/* ---- weights --------------------------------------------------------------------- */

/* The block slot `sl` holds a current copy of, -1 none: a copy is current
 * while the generations of the streamed weights it was made from are the
 * stores' (a put or a load since makes a new one). */
static int held(const offload_t *rt, const offload_slot *sl)
{
    int b = sl->block;
    if (b < 0) return -1;
    if (!rt->ws->resident && sl->gen != wstore_gen(rt->ws, b)) return -1;
    if (rt->fws && !rt->fws->resident && sl->fgen != wstore_gen(rt->fws, b)) return -1;
    return b;
}

static int slot_of(offload_t *rt, int block)
{
    for (int i = 0; i < rt->n_slots; i++)
        if (held(rt, &rt->slots[i]) == block) return i;
    return -1;
}

/* The slot acquired for `block`, -1 none. */
static int busy_slot(offload_t *rt, int block)
{
    for (int i = 0; i < rt->n_slots; i++)
        if (rt->slots[i].busy && rt->slots[i].block == block) return i;
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
    zo_status st;
    *slot_out = -1;
    int best = -1;
    for (int i = 0; i < rt->n_slots; i++) {
        offload_slot *sl = &rt->slots[i];
        if (sl->busy) continue;
        int b = held(rt, sl);
        if (b >= 0 && needed_soon(rt, b, rt->pos, horizon_end)) continue;
        if (best < 0 || sl->released < rt->slots[best].released) best = i;
    }
    if (best < 0) return ZO_OK;
    offload_slot *sl = &rt->slots[best];
    /* the copy overwrites the slot after the last block that used it has run */
    if (sl->used && (st = gpu_stream_wait_event(rt->env.h2d, sl->freed)) != ZO_OK) return st;
    /* the frozen base first, then the trainable weights: the parts streamed,
     * as of their generations now (their updates are published: the
     * optimizer is done writing them) */
    sl->block = -1;
    if (rt->fws) sl->fgen = wstore_gen(rt->fws, block);
    sl->gen = wstore_gen(rt->ws, block);
    if (rt->fws && !rt->fws->resident && (st = rt->fws->ops->fetch(rt->fws, block, sl->buf)) != ZO_OK)
        return st;
    if (!rt->ws->resident && (st = rt->ws->ops->fetch(rt->ws, block, (char *)sl->buf + rt->fslot)) != ZO_OK)
        return st;
    if ((st = gpu_event_record(sl->ready, rt->env.h2d)) != ZO_OK) return st;
    sl->block = block;
    sl->seg = 2 * rt->pass + (horizon_end - 1 >= rt->g.nb); /* the half-pass it was loaded for */
    *slot_out = best;
    return ZO_OK;
}

/* Issue loads for the blocks of schedule positions [pos, pos + depth]. */
static zo_status prefetch(offload_t *rt)
{
    zo_status st;
    int end = rt->pos + rt->cfg.prefetch_depth + 1;
    if (end > rt->n_sched) end = rt->n_sched;
    for (int p = rt->pos; p < end; p++) {
        int need[2] = {rt->sched[p], rt->dep[rt->sched[p]]};
        for (int k = 0; k < 2; k++) {
            if (need[k] < 0 || slot_of(rt, need[k]) >= 0) continue;
            if (!offload_optim_ready(rt->opt, need[k], 0)) return ZO_OK; /* its update runs: later */
            int s;
            if ((st = load_block(rt, need[k], p + 1, &s)) != ZO_OK) return st;
            if (s < 0) return ZO_OK; /* no slot free: later positions wait too */
        }
    }
    return ZO_OK;
}

/* Where block b's weights and frozen base are for compute: resident in
 * their stores, or in slot `slot` (NULL: nothing streamed). */
static void block_pointers(offload_t *rt, int b, const offload_slot *slot, const void **params,
                           const void **frozen)
{
    wstore *ws = rt->ws, *fws = rt->fws;
    *params = ws->resident ? ws->ops->resident(ws, b) : (const char *)slot->buf + rt->fslot;
    *frozen = !fws ? NULL : fws->resident ? fws->ops->resident(fws, b) : slot->buf;
}

/* Make block b's weights (and its dependency's) usable on `s`: the device
 * waits for their copies by event. */
static zo_status acquire(offload_t *rt, gpu_stream_t s, int b, offload_block_io *io)
{
    zo_status st;
    int dep = rt->dep[b];
    io->dep_params = io->dep_frozen = NULL;
    /* wait until the previous block has run: the compute part of the split */
    if (rt->has_prev && (st = offload_timed_wait(&rt->env, rt->prev_done, OFFLOAD_TIME_COMPUTE)) != ZO_OK)
        return st;
    /* the weights of this step: the update of the block (and of the block
     * it reads) has published them */
    int ids0[2] = {b, dep};
    for (int k = 0; k < 2; k++) {
        if (ids0[k] < 0) continue;
        double t0 = zo_now();
        int ready = offload_optim_ready(rt->opt, ids0[k], 1);
        offload_add_time(&rt->acct, OFFLOAD_TIME_WEIGHTS, zo_now() - t0);
        if (!ready) return zo_error(ZO_ERR_INVALID, "offload: block %d: the optimizer's update failed", ids0[k]);
    }
    if (!rt->n_slots) {
        block_pointers(rt, b, NULL, &io->params, &io->frozen);
        if (dep >= 0) block_pointers(rt, dep, NULL, &io->dep_params, &io->dep_frozen);
        return ZO_OK;
    }
    if ((st = prefetch(rt)) != ZO_OK) return st;
    int ids[2] = {b, dep};
    for (int k = 0; k < 2; k++) {
        if (ids[k] < 0) continue;
        int i = slot_of(rt, ids[k]);
        if (i < 0) {
            if ((st = load_block(rt, ids[k], rt->pos + 1, &i)) != ZO_OK) return st;
            if (i < 0)
                return zo_error(ZO_ERR_INTERNAL, "offload: no device slot free for block %d (%d slots)",
                                ids[k], rt->n_slots);
        }
        offload_slot *sl = &rt->slots[i];
        sl->busy = 1;
        /* a half-pass (a forward, a backward) found the copy an earlier one
         * loaded still there: not fetched again */
        uint64_t seg = 2 * rt->pass + (rt->pos >= rt->g.nb);
        if (sl->seg != seg) {
            rt->acct.reused_elems += rt->numel[ids[k]];
            sl->seg = seg;
        }
        /* the time the weights were late by */
        if ((st = offload_timed_wait(&rt->env, sl->ready, OFFLOAD_TIME_WEIGHTS)) != ZO_OK ||
            (st = gpu_stream_wait_event(s, sl->ready)) != ZO_OK)
            return st;
        if (k == 0) block_pointers(rt, b, sl, &io->params, &io->frozen);
        else block_pointers(rt, dep, sl, &io->dep_params, &io->dep_frozen);
    }
    return ZO_OK;
}

/* Block b's work is enqueued on s: mark its slots reusable after it. */
static zo_status release(offload_t *rt, gpu_stream_t s, int b)
{
    zo_status st;
    if ((st = gpu_event_record(rt->prev_done, s)) != ZO_OK) return st;
    rt->has_prev = 1;
    rt->pos++;
    if (!rt->n_slots) return ZO_OK;
    int ids[2] = {b, rt->dep[b]};
    for (int k = 0; k < 2; k++) {
        if (ids[k] < 0) continue;
        int i = busy_slot(rt, ids[k]);
        if (i < 0) continue;
        offload_slot *sl = &rt->slots[i];
        if ((st = gpu_event_record(sl->freed, s)) != ZO_OK) return st;
        sl->used = 1;
        sl->busy = 0;
        sl->released = ++rt->tick;
    }
    return ZO_OK;
}

/* ---- activation boundaries ----------------------------------------------------------- */

/* Host-memory checkpoints: the ring slot of boundary k. */
static offload_ring *ring_of(offload_t *rt, int k) { return &rt->ring[k & 1]; }

/* Forward of block b: its input boundary b-1 and output boundary b. */
static zo_status bounds_forward(offload_t *rt, gpu_stream_t s, int b, offload_block_io *io)
{
    zo_status st;
    int last = rt->g.nb - 1;
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
        if (r->has_saved && (st = gpu_stream_wait_event(s, r->saved)) != ZO_OK) return st;
        io->out = r->buf;
        r->holds = b;
    }
    return ZO_OK;
}

/* After forward of block b: send boundary b to host memory. */
static zo_status bounds_forward_done(offload_t *rt, gpu_stream_t s, int b)
{
    zo_status st;
    gpu_stream_t d2h = rt->env.d2h;
    if (rt->bnd || !rt->m.boundary_bytes || b >= rt->g.nb - 1) return ZO_OK;
    offload_ring *r = ring_of(rt, b);
    if ((st = gpu_event_record(r->used, s)) != ZO_OK) return st;
    r->has_used = 1;
    if ((st = gpu_stream_wait_event(d2h, r->used)) != ZO_OK ||
        (st = gpu_memcpy_async(d2h, rt->bnd_host[b], r->buf, rt->m.boundary_bytes,
                               GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
        (st = gpu_event_record(r->saved, d2h)) != ZO_OK)
        return st;
    r->has_saved = 1;
    offload_add_bytes(&rt->acct, OFFLOAD_BYTES_D2H, rt->m.boundary_bytes);
    if (b > 0) { /* the input was read by this block too */
        offload_ring *ri = ring_of(rt, b - 1);
        if ((st = gpu_event_record(ri->used, s)) != ZO_OK) return st;
        ri->has_used = 1;
    }
    return ZO_OK;
}

/* Load boundary k into its ring slot (host-memory checkpoints). */
static zo_status bounds_load(offload_t *rt, int k)
{
    zo_status st;
    gpu_stream_t h2d = rt->env.h2d;
    offload_ring *r = ring_of(rt, k);
    if (r->holds == k) return ZO_OK;
    if (r->has_used && (st = gpu_stream_wait_event(h2d, r->used)) != ZO_OK) return st;
    if ((st = gpu_memcpy_async(h2d, r->buf, rt->bnd_host[k], rt->m.boundary_bytes,
                               GPU_COPY_HOST_TO_DEVICE)) != ZO_OK ||
        (st = gpu_event_record(r->filled, h2d)) != ZO_OK)
        return st;
    r->has_filled = 1;
    r->holds = k;
    offload_add_bytes(&rt->acct, OFFLOAD_BYTES_H2D, rt->m.boundary_bytes);
    return ZO_OK;
}

/* Backward of block b reads boundary b-1. */
static zo_status bounds_backward(offload_t *rt, gpu_stream_t s, int b, offload_block_io *io)
{
    zo_status st;
    io->in = NULL;
    io->out = NULL;
    if (!rt->m.boundary_bytes || b == 0) return ZO_OK;
    if (rt->bnd) {
        io->in = rt->bnd[b - 1];
        return ZO_OK;
    }
    offload_ring *r = ring_of(rt, b - 1);
    if ((st = bounds_load(rt, b - 1)) != ZO_OK) return st;
    if (r->has_filled && (st = gpu_stream_wait_event(s, r->filled)) != ZO_OK) return st;
    io->in = r->buf;
    return ZO_OK;
}

/* After backward of block b: its input slot is free; prefetch the input of
 * block b-1 (boundary b-2) into the other slot. */
static zo_status bounds_backward_done(offload_t *rt, gpu_stream_t s, int b)
{
    zo_status st;
    if (rt->bnd || !rt->m.boundary_bytes || b == 0) return ZO_OK;
    offload_ring *r = ring_of(rt, b - 1);
    if ((st = gpu_event_record(r->used, s)) != ZO_OK) return st;
    r->has_used = 1;
    return b >= 2 ? bounds_load(rt, b - 2) : ZO_OK;
}

/* ---- the micro-batch ------------------------------------------------------------------- */

/* The schedule starts again; the activations ring is empty. */
static void pass_begin(offload_t *rt)
{
    rt->pass++;
    rt->pos = 0;
    rt->has_prev = 0;
    for (int k = 0; k < 2; k++) rt->ring[k].holds = -1;
}

/* Forward of every block in order. */
static zo_status forward_blocks(offload_t *rt, gpu_stream_t s)
{
    zo_status st;
    for (int b = 0; b < rt->g.nb; b++) {
        offload_block_io io = {0};
        if ((st = acquire(rt, s, b, &io)) != ZO_OK ||
            (st = bounds_forward(rt, s, b, &io)) != ZO_OK ||
            (st = rt->m.forward(rt->m.user, b, &io, s)) != ZO_OK ||
            (st = bounds_forward_done(rt, s, b)) != ZO_OK || (st = release(rt, s, b)) != ZO_OK)
            return st;
    }
    return ZO_OK;
}

/* Backward of block b, its gradients sent on. */
static zo_status backward_block(offload_t *rt, gpu_stream_t s, int b)
{
    zo_status st;
    offload_block_io io = {0};
    int k, kd = -1, dep = rt->dep[b];
    if ((st = acquire(rt, s, b, &io)) != ZO_OK ||
        (st = bounds_backward(rt, s, b, &io)) != ZO_OK || (st = offload_grads_take(rt->gr, s, -1, &k)) != ZO_OK)
        return st;
    io.grads = rt->gr->gs[k].dev;
    if (dep >= 0) {
        if ((st = offload_grads_take(rt->gr, s, k, &kd)) != ZO_OK) return st;
        io.dep_grads = rt->gr->gs[kd].dev;
    }
    if (rt->cfg.recompute && (st = rt->m.recompute(rt->m.user, b, &io, s)) != ZO_OK) return st;
    if ((st = rt->m.backward(rt->m.user, b, &io, rt->opt->ctr.loss_scale, s)) != ZO_OK) return st;
    /* the dependency's share first: the same order whatever the placement */
    if (kd >= 0 && (st = offload_grads_send(rt->gr, s, kd, dep, 0)) != ZO_OK) return st;
    if ((st = offload_grads_send(rt->gr, s, k, b, 1)) != ZO_OK || (st = bounds_backward_done(rt, s, b)) != ZO_OK ||
        (st = release(rt, s, b)) != ZO_OK)
        return st;
    /* add the previous block's gradients while the device runs this one */
    for (int i = 0; i < OFFLOAD_GRAD_SLOTS; i++)
        if (i != k && i != kd && (st = offload_grads_accumulate(rt->gr, i)) != ZO_OK) return st;
    return ZO_OK;
}

static zo_status micro_batch_run(offload_t *rt, gpu_stream_t s)
{
    zo_status st;
    pass_begin(rt);
    if ((st = offload_grads_begin(rt->gr, s)) != ZO_OK || (st = offload_optim_micro_begin(rt->opt)) != ZO_OK) return st;
    if ((st = forward_blocks(rt, s)) != ZO_OK) return st;
    for (int b = rt->g.nb - 1; b >= 0; b--)
        if ((st = backward_block(rt, s, b)) != ZO_OK) return st;
    /* the compute of the last block, then its gradients */
    if ((st = offload_timed_wait(&rt->env, rt->prev_done, OFFLOAD_TIME_COMPUTE)) != ZO_OK ||
        (st = offload_grads_drain(rt->gr)) != ZO_OK || (st = offload_dp_wait(rt->dp)) != ZO_OK)
        return st;
    rt->has_prev = 0;
    rt->opt->micro++;
    return ZO_OK;
}

static zo_status forward_run(offload_t *rt, gpu_stream_t s)
{
    zo_status st;
    pass_begin(rt);
    if ((st = forward_blocks(rt, s)) != ZO_OK ||
        (st = offload_timed_wait(&rt->env, rt->prev_done, OFFLOAD_TIME_COMPUTE)) != ZO_OK ||
        (st = offload_dp_wait(rt->dp)) != ZO_OK)
        return st;
    rt->has_prev = 0;
    return ZO_OK;
}

/* After a failure part-way: let the work already queued (the model's ops on
 * `s`, the runtime's copies) finish, so that nothing in flight uses the
 * runtime's buffers when it returns (the caller may free it next), and
 * forget the step's gradients, which now hold part of a micro-batch; the
 * slots are free again, so the runtime can go on. A forward leaves the
 * step's gradients alone. */
static zo_status abandon(offload_t *rt, gpu_stream_t s, zo_status st, int keep_grads)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", zo_last_error());
    gpu_stream_synchronize(s);
    gpu_stream_synchronize(rt->env.h2d);
    gpu_stream_synchronize(rt->env.d2h);
    for (int i = 0; i < rt->n_slots; i++) rt->slots[i].busy = 0;
    rt->has_prev = 0;
    if (!keep_grads) {
        offload_grads_forget(rt->gr);
        rt->opt->micro = 0;
    }
    return zo_error(st, "%s", msg); /* the failure's own message, not the waits' */
}

zo_status offload_stream_micro_batch(offload_t *rt, gpu_stream_t s)
{
    zo_status st = micro_batch_run(rt, s);
    return st == ZO_OK ? ZO_OK : abandon(rt, s, st, 0);
}

zo_status offload_stream_forward(offload_t *rt, gpu_stream_t s)
{
    zo_status st = forward_run(rt, s);
    return st == ZO_OK ? ZO_OK : abandon(rt, s, st, 1);
}
