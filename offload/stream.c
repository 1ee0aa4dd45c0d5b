/* One micro-batch: blocks forward in order and backward in reverse, their
 * weights streamed from the weight stores through the device slots, their
 * gradients handed to the gradient layer (which sums them where their
 * optimizer shard says), the activations between blocks kept in the
 * activation store (stream.h).
 *
 * Streams: the caller's compute stream `s`, the runtime's h2d stream (weights
 * and activation checkpoints coming in) and d2h stream (gradients and
 * checkpoints going out). Every cross-stream dependency is an event; the host
 * waits only on single events, timed as the part they belong to. */
#include "offload/stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- life cycle ------------------------------------------------------------------- */

int offload_stream_slots(const offload_model *m, int prefetch_depth)
{
    int has_dep = 0;
    for (int b = 0; b < m->n_blocks; b++) has_dep |= m->block_dep && m->block_dep[b] >= 0;
    int n = prefetch_depth + 1;
    if (has_dep && n < 2) n = 2;
    return n > m->n_blocks ? m->n_blocks : n;
}

static zo_status alloc_slots(offload_stream *sm)
{
    zo_status st;
    int n = sm->c.n_slots;
    sm->slots = calloc((size_t)n, sizeof *sm->slots);
    if (!sm->slots) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    for (int i = 0; i < n; i++) {
        offload_slot *sl = &sm->slots[i];
        sl->block = -1;
        if ((st = gpu_mem_alloc(sm->env->dev, sm->c.slot_size, &sl->buf)) != ZO_OK)
            return zo_error_wrap(st, "offload_init: device weight slot %d of %d (%zu bytes each)", i + 1, n,
                                 sm->c.slot_size);
        if ((st = gpu_event_create(sm->env->dev, &sl->ready)) != ZO_OK) return st;
        if ((st = gpu_event_create(sm->env->dev, &sl->freed)) != ZO_OK) return st;
    }
    return ZO_OK;
}

/* Block b's routed experts' range [lo, hi) from the model's expert ranges
 * (sorted by block and offset); 0 when they do not lie together, each
 * `numel` long (*numel 0: any, set from the first). */
static int expert_span(const offload_model *m, int b, size_t *lo, size_t *hi, size_t *numel)
{
    int n = 0;
    *lo = *hi = 0;
    for (int i = 0; i < m->n_expert_ranges; i++) {
        const offload_expert_range *r = &m->expert_ranges[i];
        if (r->block != b) continue;
        if (!*numel) *numel = r->numel;
        if (r->numel != *numel || r->expert != n || (n && r->offset != *hi)) return 0;
        if (!n) *lo = r->offset;
        *hi = r->offset + r->numel;
        n++;
    }
    return !n || n == m->experts;
}

int offload_stream_apart(const offload_model *m, const wstore *ws, const wstore *fws, size_t *dense_largest,
                         size_t *expert_numel)
{
    *dense_largest = *expert_numel = 0;
    if (!m->n_expert_ranges || !m->expert_routed || !ws || ws->resident || ws->collective || !ws->ops->fetch_range ||
        fws)
        return 0;
    size_t numel = 0, largest = 0;
    for (int b = 0; b < m->n_blocks; b++) {
        size_t lo, hi;
        if (!expert_span(m, b, &lo, &hi, &numel)) return 0;
        size_t dense = m->block_numel[b] - (hi - lo);
        if (dense > largest) largest = dense;
    }
    *dense_largest = largest;
    *expert_numel = numel;
    return numel > 0;
}

static zo_status alloc_expert_slots(offload_stream *sm)
{
    zo_status st;
    const offload_model *m = sm->c.m;
    int nb = m->n_blocks, n = sm->c.expert_slots;
    size_t bytes = sm->c.expert_numel * sm->c.g->es, numel = sm->c.expert_numel;
    sm->elo = calloc((size_t)nb, sizeof *sm->elo);
    sm->ehi = calloc((size_t)nb, sizeof *sm->ehi);
    sm->eslots = calloc((size_t)n, sizeof *sm->eslots);
    if (!sm->elo || !sm->ehi || !sm->eslots) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    for (int b = 0; b < nb; b++)
        if (!expert_span(m, b, &sm->elo[b], &sm->ehi[b], &numel))
            return zo_error(ZO_ERR_INTERNAL, "offload_init: block %d: its experts do not lie together", b);
    for (int i = 0; i < n; i++) {
        offload_eslot *sl = &sm->eslots[i];
        sl->block = sl->expert = -1;
        if ((st = gpu_mem_alloc(sm->env->dev, bytes, &sl->buf)) != ZO_OK)
            return zo_error_wrap(st, "offload_init: device expert slot %d of %d (%zu bytes each)", i + 1, n, bytes);
        if ((st = gpu_event_create(sm->env->dev, &sl->ready)) != ZO_OK) return st;
        if ((st = gpu_event_create(sm->env->dev, &sl->freed)) != ZO_OK) return st;
    }
    sm->ebusy = -1;
    return ZO_OK;
}

/* The schedule of a micro-batch: forward in order, backward in reverse;
 * forward only, this forward and the next. */
static zo_status schedule(offload_stream *sm)
{
    int nb = sm->c.g->nb;
    if (!(sm->sched = calloc(2 * (size_t)nb, sizeof *sm->sched)))
        return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    for (int b = 0; b < nb; b++) {
        sm->sched[b] = b;
        sm->sched[nb + b] = sm->c.forward_only ? b : nb - 1 - b;
    }
    sm->n_sched = 2 * nb;
    return ZO_OK;
}

zo_status offload_stream_create(const offload_env *env, const offload_stream_config *c, offload_stream **out)
{
    *out = NULL;
    offload_stream *sm = calloc(1, sizeof *sm);
    if (!sm) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    sm->env = env;
    sm->c = *c;
    sm->dep = c->m->block_dep;
    zo_status st = schedule(sm);
    sm->ebusy = -1;
    if (st == ZO_OK && c->n_slots) st = alloc_slots(sm);
    if (st == ZO_OK && c->n_slots && c->expert_slots) st = alloc_expert_slots(sm);
    for (int k = 0; k < 2 && st == ZO_OK; k++) st = gpu_event_create(env->dev, &sm->done[k]);
    if (st == ZO_OK)
        st = actstore_create(env, c->g->nb, c->m->boundary_bytes, c->forward_only ? ACTSTORE_PASS : c->checkpoints_on,
                             &sm->acts);
    if (st != ZO_OK) {
        offload_stream_free(sm);
        return st;
    }
    *out = sm;
    return ZO_OK;
}

/* A slot's device memory and events (either kind of slot). */
static void slot_free(gpu_device_t d, void *buf, gpu_event_t ready, gpu_event_t freed)
{
    gpu_mem_free(d, buf);
    if (ready) gpu_event_destroy(ready);
    if (freed) gpu_event_destroy(freed);
}

void offload_stream_free(offload_stream *sm)
{
    if (!sm) return;
    gpu_device_t d = sm->env->dev;
    if (sm->slots)
        for (int i = 0; i < sm->c.n_slots; i++) slot_free(d, sm->slots[i].buf, sm->slots[i].ready, sm->slots[i].freed);
    free(sm->slots);
    if (sm->eslots)
        for (int i = 0; i < sm->c.expert_slots; i++)
            slot_free(d, sm->eslots[i].buf, sm->eslots[i].ready, sm->eslots[i].freed);
    free(sm->eslots);
    free(sm->elo);
    free(sm->ehi);
    for (int k = 0; k < 2; k++)
        if (sm->done[k]) gpu_event_destroy(sm->done[k]);
    actstore_free(sm->acts);
    free(sm->sched);
    free(sm);
}

/* ---- weights --------------------------------------------------------------------- */

/* The block slot `sl` holds a current copy of, -1 none: a copy is current
 * while the generations of the streamed weights it was made from are the
 * stores' (a put or a load since makes a new one). */
static int held(const offload_stream *sm, const offload_slot *sl)
{
    int b = sl->block;
    if (b < 0) return -1;
    if (!sm->c.ws->resident && sl->gen != wstore_gen(sm->c.ws, b)) return -1;
    if (sm->c.fws && !sm->c.fws->resident && sl->fgen != wstore_gen(sm->c.fws, b)) return -1;
    return b;
}

static int slot_of(offload_stream *sm, int block)
{
    for (int i = 0; i < sm->c.n_slots; i++)
        if (held(sm, &sm->slots[i]) == block) return i;
    return -1;
}

/* The slot acquired for `block`, -1 none. */
static int busy_slot(offload_stream *sm, int block)
{
    for (int i = 0; i < sm->c.n_slots; i++)
        if (sm->slots[i].busy && sm->slots[i].block == block) return i;
    return -1;
}

/* Whether `block` is needed by schedule positions [from, to). */
static int needed_soon(offload_stream *sm, int block, int from, int to)
{
    for (int p = from; p < to && p < sm->n_sched; p++) {
        int b = sm->sched[p];
        if (b == block || sm->dep[b] == block) return 1;
    }
    return 0;
}

/* Whether block b's routed experts stream apart from its dense part. */
static int apart(const offload_stream *sm, int b) { return sm->eslots && sm->ehi[b] > sm->elo[b]; }

/* Copy the streamed weights of `block` into device memory dst on h2d: the
 * whole block, or with its experts apart its dense part (the elements
 * before them, then those after). */
static zo_status fetch_weights(offload_stream *sm, int block, void *dst)
{
    wstore *ws = sm->c.ws;
    size_t n = sm->c.g->numel[block], es = sm->c.g->es;
    zo_status st;
    if (!apart(sm, block)) {
        sm->env->acct->weight_bytes += n * es;
        return ws->ops->fetch(ws, block, dst);
    }
    size_t lo = sm->elo[block], hi = sm->ehi[block];
    sm->env->acct->weight_bytes += (n - (hi - lo)) * es;
    if ((st = ws->ops->fetch_range(ws, block, 0, lo, dst)) != ZO_OK) return st;
    return ws->ops->fetch_range(ws, block, hi, n - hi, (char *)dst + lo * es);
}

/* Start loading `block` into a free slot; -1 when none can be taken now
 * (every free slot holds a block needed before this one). */
static zo_status load_block(offload_stream *sm, int block, int horizon_end, int *slot_out)
{
    zo_status st;
    *slot_out = -1;
    int best = -1;
    for (int i = 0; i < sm->c.n_slots; i++) {
        offload_slot *sl = &sm->slots[i];
        if (sl->busy) continue;
        int b = held(sm, sl);
        if (b >= 0 && needed_soon(sm, b, sm->pos, horizon_end)) continue;
        if (best < 0 || sl->released < sm->slots[best].released) best = i;
    }
    if (best < 0) return ZO_OK;
    offload_slot *sl = &sm->slots[best];
    /* the copy overwrites the slot after the last block that used it has run */
    if (sl->used && (st = gpu_stream_wait_event(sm->env->h2d, sl->freed)) != ZO_OK) return st;
    /* the frozen base first, then the trainable weights: the parts streamed,
     * as of their generations now (their updates are published: the
     * optimizer is done writing them) */
    sl->block = -1;
    if (sm->c.fws) sl->fgen = wstore_gen(sm->c.fws, block);
    sl->gen = wstore_gen(sm->c.ws, block);
    if (sm->c.fws && !sm->c.fws->resident && (st = sm->c.fws->ops->fetch(sm->c.fws, block, sl->buf)) != ZO_OK)
        return st;
    if (!sm->c.ws->resident && (st = fetch_weights(sm, block, (char *)sl->buf + sm->c.fslot)) != ZO_OK) return st;
    if ((st = gpu_event_record(sl->ready, sm->env->h2d)) != ZO_OK) return st;
    sl->block = block;
    sl->seg = 2 * sm->pass + (horizon_end - 1 >= sm->c.g->nb); /* the half-pass it was loaded for */
    *slot_out = best;
    return ZO_OK;
}

/* Issue loads for the blocks of schedule positions [pos, pos + depth]. */
static zo_status prefetch(offload_stream *sm)
{
    zo_status st;
    int end = sm->pos + sm->c.prefetch_depth + 1;
    if (end > sm->n_sched) end = sm->n_sched;
    for (int p = sm->pos; p < end; p++) {
        int need[2] = {sm->sched[p], sm->dep[sm->sched[p]]};
        for (int k = 0; k < 2; k++) {
            if (need[k] < 0 || slot_of(sm, need[k]) >= 0) continue;
            /* its update runs: later; a store whose fetch is a collective
             * waits for it, so that what every rank fetches, and when, is
             * its schedule's, not the update's timing (a forward-only
             * runtime has no optimizer) */
            if (sm->c.opt && !offload_optim_ready(sm->c.opt, need[k], sm->c.ws->collective)) return ZO_OK;
            int s;
            if ((st = load_block(sm, need[k], p + 1, &s)) != ZO_OK) return st;
            if (s < 0) return ZO_OK; /* no slot free: later positions wait too */
        }
    }
    return ZO_OK;
}

/* ---- routed experts streamed apart ---------------------------------------------------- */

/* The expert slot holding a current copy of expert e of block b, -1 none. */
static int eslot_of(const offload_stream *sm, int b, int e)
{
    for (int i = 0; i < sm->c.expert_slots; i++) {
        const offload_eslot *sl = &sm->eslots[i];
        if (sl->block == b && sl->expert == e && sl->gen == wstore_gen(sm->c.ws, b)) return i;
    }
    return -1;
}

/* The expert slot computing is done with once the work enqueued on s has run. */
static zo_status expert_release(offload_stream *sm, gpu_stream_t s)
{
    if (sm->ebusy < 0) return ZO_OK;
    offload_eslot *sl = &sm->eslots[sm->ebusy];
    sm->ebusy = -1;
    sl->used = 1;
    sl->released = ++sm->tick;
    return gpu_event_record(sl->freed, s);
}

/* Start copying expert e of block b into the least recently released slot
 * that is not computing; *slot_out its index. */
static zo_status expert_load(offload_stream *sm, int b, int e, int *slot_out)
{
    zo_status st;
    int best = -1;
    for (int i = 0; i < sm->c.expert_slots; i++)
        if (i != sm->ebusy && (best < 0 || sm->eslots[i].released < sm->eslots[best].released)) best = i;
    offload_eslot *sl = &sm->eslots[best];
    const offload_expert_range *r = NULL;
    for (int i = 0; i < sm->c.m->n_expert_ranges && !r; i++)
        if (sm->c.m->expert_ranges[i].block == b && sm->c.m->expert_ranges[i].expert == e)
            r = &sm->c.m->expert_ranges[i];
    if (!r) return zo_error(ZO_ERR_INTERNAL, "offload: block %d has no expert %d", b, e);
    /* the copy overwrites the slot after the expert that used it has run */
    if (sl->used && (st = gpu_stream_wait_event(sm->env->h2d, sl->freed)) != ZO_OK) return st;
    sl->block = -1;
    sl->gen = wstore_gen(sm->c.ws, b);
    if ((st = sm->c.ws->ops->fetch_range(sm->c.ws, b, r->offset, r->numel, sl->buf)) != ZO_OK ||
        (st = gpu_event_record(sl->ready, sm->env->h2d)) != ZO_OK)
        return st;
    sl->block = b;
    sl->expert = e;
    sm->env->acct->weight_bytes += r->numel * sm->c.g->es;
    sm->env->acct->experts_fetched++;
    *slot_out = best;
    return ZO_OK;
}

/* Start loading the first expert from `from` on that block b's last forward
 * routed tokens to, unless a slot has it (or none is free of the expert
 * computing). */
static zo_status expert_prefetch(offload_stream *sm, int b, int from)
{
    const offload_model *m = sm->c.m;
    int e = from, i;
    while (e < m->experts && !m->expert_routed(m->user, b, e)) e++;
    if (e >= m->experts || sm->c.expert_slots - (sm->ebusy >= 0) < 1 || eslot_of(sm, b, e) >= 0) return ZO_OK;
    return expert_load(sm, b, e, &i);
}

/* offload_block_io.expert: routed expert e of the block computing, on s;
 * the expert before it is released, and the next one the block routed
 * tokens to starts loading into another slot while e computes. */
static zo_status expert_acquire(void *ctx, int e, gpu_stream_t s, const void **w)
{
    offload_stream *sm = ctx;
    int b = sm->eblock, i;
    zo_status st;
    *w = NULL;
    if ((st = expert_release(sm, s)) != ZO_OK) return st;
    if ((i = eslot_of(sm, b, e)) < 0 && (st = expert_load(sm, b, e, &i)) != ZO_OK) return st;
    offload_eslot *sl = &sm->eslots[i];
    /* the device waits for the copy, the host does not: it goes on queueing
     * the expert's work and the next expert's copy (the time the device
     * waits shows as compute) */
    if ((st = gpu_stream_wait_event(s, sl->ready)) != ZO_OK) return st;
    sm->ebusy = i;
    *w = sl->buf;
    return expert_prefetch(sm, b, e + 1);
}

static int recomputes(const offload_stream *sm, int b);

/* Where block b's weights and frozen base are for compute: resident in
 * their stores, or in slot `slot` (NULL: nothing streamed). */
static void block_pointers(offload_stream *sm, int b, const offload_slot *slot, const void **params,
                           const void **frozen)
{
    wstore *ws = sm->c.ws, *fws = sm->c.fws;
    *params = ws->resident ? ws->ops->resident(ws, b) : (const char *)slot->buf + sm->c.fslot;
    *frozen = !fws ? NULL : fws->resident ? fws->ops->resident(fws, b) : slot->buf;
}

/* The resident stores' block b is about to be read on s: what the ranks
 * still owe it (ZeRO 1-2 with a threaded update: its gather). */
static zo_status use_resident(offload_stream *sm, gpu_stream_t s, int b)
{
    zo_status st = sm->c.ws->resident ? wstore_use(sm->c.ws, b, s) : ZO_OK;
    if (st == ZO_OK && sm->c.fws && sm->c.fws->resident) st = wstore_use(sm->c.fws, b, s);
    return st;
}

/* Make block b's weights (and its dependency's) usable on `s`: the device
 * waits for their copies by event. */
static zo_status acquire(offload_stream *sm, gpu_stream_t s, int b, offload_block_io *io)
{
    zo_status st;
    int dep = sm->dep[b];
    io->dep_params = io->dep_frozen = NULL;
    /* wait until the block before the previous one has run (the compute
     * part of the split): the previous one stays queued on the device */
    if (sm->n_done >= 2 &&
        (st = offload_timed_wait(sm->env, sm->done[sm->n_done % 2], OFFLOAD_TIME_COMPUTE)) != ZO_OK)
        return st;
    /* the weights of this step: the update of the block (and of the block
     * it reads) has published them */
    int ids0[2] = {b, dep};
    for (int k = 0; k < 2; k++) {
        if (ids0[k] < 0) continue;
        offload_timer t0 = offload_time_begin();
        int ready = !sm->c.opt || offload_optim_ready(sm->c.opt, ids0[k], 1);
        offload_time_end(sm->env->acct, OFFLOAD_TIME_WEIGHTS, t0);
        if (!ready) return zo_error(ZO_ERR_INVALID, "offload: block %d: the optimizer's update failed", ids0[k]);
        if ((st = use_resident(sm, s, ids0[k])) != ZO_OK) return st;
    }
    if (!sm->c.n_slots) {
        block_pointers(sm, b, NULL, &io->params, &io->frozen);
        if (dep >= 0) block_pointers(sm, dep, NULL, &io->dep_params, &io->dep_frozen);
        return ZO_OK;
    }
    if ((st = prefetch(sm)) != ZO_OK) return st;
    int ids[2] = {b, dep};
    for (int k = 0; k < 2; k++) {
        if (ids[k] < 0) continue;
        int i = slot_of(sm, ids[k]);
        if (i < 0) {
            if ((st = load_block(sm, ids[k], sm->pos + 1, &i)) != ZO_OK) return st;
            if (i < 0)
                return zo_error(ZO_ERR_INTERNAL, "offload: no device slot free for block %d (%d slots)",
                                ids[k], sm->c.n_slots);
        }
        offload_slot *sl = &sm->slots[i];
        sl->busy = 1;
        /* a half-pass (a forward, a backward) found the copy an earlier one
         * loaded still there: not fetched again */
        uint64_t seg = 2 * sm->pass + (sm->pos >= sm->c.g->nb);
        if (sl->seg != seg) {
            sm->env->acct->reused_elems += sm->c.g->numel[ids[k]];
            sl->seg = seg;
        }
        /* the time the weights were late by */
        if ((st = offload_timed_wait(sm->env, sl->ready, OFFLOAD_TIME_WEIGHTS)) != ZO_OK ||
            (st = gpu_stream_wait_event(s, sl->ready)) != ZO_OK)
            return st;
        if (k == 0) block_pointers(sm, b, sl, &io->params, &io->frozen);
        else block_pointers(sm, dep, sl, &io->dep_params, &io->dep_frozen);
    }
    if (apart(sm, b)) {
        io->expert = expert_acquire;
        io->expert_ctx = sm;
        sm->eblock = b;
        /* a backward routes as its forward did: the first expert it will
         * ask for loads now, beside the dense part's wait (a forward knows
         * its routing only once the router has run, and a block recomputed
         * once it has been: the layers it shares its activations with, its
         * routing included, have routed since) */
        if (sm->pos >= sm->c.g->nb && !recomputes(sm, b) && (st = expert_prefetch(sm, b, 0)) != ZO_OK) return st;
    }
    return ZO_OK;
}

/* Block b's work is enqueued on s: mark its slots reusable after it. */
static zo_status release(offload_stream *sm, gpu_stream_t s, int b)
{
    zo_status st;
    if ((st = gpu_event_record(sm->done[sm->n_done % 2], s)) != ZO_OK) return st;
    sm->n_done++;
    sm->pos++;
    if (!sm->c.n_slots) return ZO_OK;
    if ((st = expert_release(sm, s)) != ZO_OK) return st;
    int ids[2] = {b, sm->dep[b]};
    for (int k = 0; k < 2; k++) {
        if (ids[k] < 0) continue;
        int i = busy_slot(sm, ids[k]);
        if (i < 0) continue;
        offload_slot *sl = &sm->slots[i];
        if ((st = gpu_event_record(sl->freed, s)) != ZO_OK) return st;
        sl->used = 1;
        sl->busy = 0;
        sl->released = ++sm->tick;
    }
    return ZO_OK;
}

/* ---- the micro-batch ------------------------------------------------------------------- */

/* The schedule starts again, and so does the activation store. */
static void pass_begin(offload_stream *sm)
{
    sm->pass++;
    sm->pos = 0;
    sm->n_done = 0;
    sm->acts->ops->pass_begin(sm->acts);
}

/* Forward of every block in order; `train`: a micro-batch's, whose
 * routing to the experts the optimizer hears of. */
static zo_status forward_blocks(offload_stream *sm, gpu_stream_t s, int train)
{
    actstore *acts = sm->acts;
    zo_status st;
    for (int b = 0; b < sm->c.g->nb; b++) {
        offload_block_io io = {0};
        if ((st = acquire(sm, s, b, &io)) != ZO_OK || (st = acts->ops->forward(acts, s, b, &io)) != ZO_OK ||
            (st = sm->c.m->forward(sm->c.m->user, b, &io, s)) != ZO_OK ||
            (st = acts->ops->forward_done(acts, s, b)) != ZO_OK || (st = release(sm, s, b)) != ZO_OK)
            return st;
        if (train) offload_optim_routed(sm->c.opt, b);
    }
    return ZO_OK;
}

/* Whether block b's activations are rebuilt before its backward: with
 * recompute, every block, or (recompute_layers K) the blocks of the first K
 * layers, the others having kept theirs. */
static int recomputes(const offload_stream *sm, int b)
{
    if (!sm->c.recompute) return 0;
    if (!sm->c.recompute_layers) return 1;
    int l = sm->c.m->block_layer ? sm->c.m->block_layer[b] : b;
    return l >= 0 && l < sm->c.recompute_layers;
}

/* Backward of block b, its gradients sent on. */
static zo_status backward_block(offload_stream *sm, gpu_stream_t s, int b)
{
    zo_status st;
    actstore *acts = sm->acts;
    offload_grads *gr = sm->c.gr;
    offload_block_io io = {0};
    int k, kd = -1, dep = sm->dep[b];
    if ((st = acquire(sm, s, b, &io)) != ZO_OK || (st = acts->ops->backward(acts, s, b, &io)) != ZO_OK ||
        (st = offload_grads_take(gr, s, -1, &k)) != ZO_OK)
        return st;
    io.grads = gr->gs[k].dev;
    if (dep >= 0) {
        if ((st = offload_grads_take(gr, s, k, &kd)) != ZO_OK) return st;
        io.dep_grads = gr->gs[kd].dev;
    }
    if (recomputes(sm, b) && (st = sm->c.m->recompute(sm->c.m->user, b, &io, s)) != ZO_OK) return st;
    if ((st = sm->c.m->backward(sm->c.m->user, b, &io, sm->c.opt->ctr.loss_scale, s)) != ZO_OK) return st;
    /* the dependency's share first: the same order whatever the placement */
    if (kd >= 0 && (st = offload_grads_send(gr, s, kd, dep, 0)) != ZO_OK) return st;
    if ((st = offload_grads_send(gr, s, k, b, 1)) != ZO_OK || (st = acts->ops->backward_done(acts, s, b)) != ZO_OK ||
        (st = release(sm, s, b)) != ZO_OK)
        return st;
    /* add the previous block's gradients while the device runs this one */
    for (int i = 0; i < OFFLOAD_GRAD_SLOTS; i++)
        if (i != k && i != kd && (st = offload_grads_accumulate(gr, i)) != ZO_OK) return st;
    return ZO_OK;
}

/* Wait for the pass's last block to have run (the compute part of the split). */
static zo_status last_block_done(offload_stream *sm)
{
    if (!sm->n_done) return ZO_OK;
    return offload_timed_wait(sm->env, sm->done[(sm->n_done - 1) % 2], OFFLOAD_TIME_COMPUTE);
}

static zo_status micro_batch_run(offload_stream *sm, gpu_stream_t s)
{
    zo_status st;
    pass_begin(sm);
    if ((st = offload_grads_begin(sm->c.gr, s)) != ZO_OK || (st = offload_optim_micro_begin(sm->c.opt)) != ZO_OK)
        return st;
    if ((st = forward_blocks(sm, s, 1)) != ZO_OK || (st = offload_optim_forward_done(sm->c.opt)) != ZO_OK)
        return st;
    for (int b = sm->c.g->nb - 1; b >= 0; b--)
        if ((st = backward_block(sm, s, b)) != ZO_OK) return st;
    /* the compute of the last block, then its gradients */
    if ((st = last_block_done(sm)) != ZO_OK || (st = offload_grads_drain(sm->c.gr)) != ZO_OK ||
        (st = offload_dp_wait(sm->env->dp)) != ZO_OK)
        return st;
    sm->n_done = 0;
    sm->c.opt->micro++;
    return ZO_OK;
}

static zo_status forward_run(offload_stream *sm, gpu_stream_t s)
{
    zo_status st;
    pass_begin(sm);
    if ((st = forward_blocks(sm, s, 0)) != ZO_OK || (st = last_block_done(sm)) != ZO_OK ||
        (st = offload_dp_wait(sm->env->dp)) != ZO_OK)
        return st;
    sm->n_done = 0;
    return ZO_OK;
}

/* After a failure part-way: let the work already queued (the model's ops on
 * `s`, the runtime's copies) finish, so that nothing in flight uses the
 * runtime's buffers when it returns (the caller may free it next), and
 * forget the step's gradients, which now hold part of a micro-batch; the
 * slots are free again, so the runtime can go on. A forward leaves the
 * step's gradients alone. */
static zo_status abandon(offload_stream *sm, gpu_stream_t s, zo_status st, int keep_grads)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", zo_last_error());
    gpu_stream_synchronize(s);
    gpu_stream_synchronize(sm->env->h2d);
    gpu_stream_synchronize(sm->env->d2h);
    for (int i = 0; i < sm->c.n_slots; i++) sm->slots[i].busy = 0;
    sm->ebusy = -1;
    sm->n_done = 0;
    if (!keep_grads) {
        offload_grads_forget(sm->c.gr);
        sm->c.opt->micro = 0;
    }
    return zo_error(st, "%s", msg); /* the failure's own message, not the waits' */
}

zo_status offload_stream_micro_batch(offload_stream *sm, gpu_stream_t s)
{
    zo_status st = micro_batch_run(sm, s);
    return st == ZO_OK ? ZO_OK : abandon(sm, s, st, 0);
}

zo_status offload_stream_forward(offload_stream *sm, gpu_stream_t s)
{
    zo_status st = forward_run(sm, s);
    return st == ZO_OK ? ZO_OK : abandon(sm, s, st, 1);
}
