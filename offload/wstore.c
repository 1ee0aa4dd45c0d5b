/* Weight stores: where the 16-bit weights of every block live between uses,
 * one struct per tier.
 *
 *   device   resident in device memory: the compute reads them in place;
 *            new weights from the host arrive through two pinned chunks,
 *            copied on the h2d stream while the next chunk is being written
 *   host     in pinned host memory: streamed to a device slot before use;
 *            new weights from the host are written in place
 *   nvme     one tensor per block in an NVMe store: read into a pinned
 *            read-ahead ring, then copied to a device slot; new weights are
 *            assembled block by block in a pinned buffer and written
 *
 * New weights from the device (the optimizer's device shard) go through one
 * device staging block when the store is not on the device.
 *
 * ZeRO 1-2 (wstore_config.gathered): the device store holds every block,
 * each padded to a multiple of the rank count; the optimizer puts only the
 * rank's part of each block, and a block whose part is complete is
 * all-gathered in place, in block order (the same order on every rank, a
 * block of which this rank holds nothing included). With the serial
 * schedule the puts, and so the gathers, are the host thread's; with the
 * overlap and dpu schedules the optimizer's thread puts (deferred): the
 * host thread gathers each block of the round when it is next used, or at
 * the round's end, so that every collective is issued by the host thread at
 * the same point of the schedule on every rank. ZeRO 3: wgather.c. */
#include "offload/wstore.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef ZO_OFFLOAD_HAVE_NVME
#include "nvme/nvme_engine.h" /* defines: nvme_engine_t */
#include "nvme/nvme_store.h"  /* defines: nvme_store_t */
#endif

static size_t block_bytes(const wstore *ws, int b) { return ws->g->numel[b] * ws->g->es; }

/* ---- the generations ------------------------------------------------------------------ */

zo_status wstore_init_base(wstore *ws, const wstore_ops *ops, const offload_env *env, const offload_geom *g,
                           offload_tier tier)
{
    ws->ops = ops;
    ws->env = env;
    ws->g = g;
    ws->tier = tier;
    ws->gen = calloc((size_t)g->nb ? (size_t)g->nb : 1, sizeof *ws->gen);
    return ws->gen ? ZO_OK : zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
}

uint64_t wstore_gen(const wstore *ws, int b) { return __atomic_load_n(&ws->gen[b], __ATOMIC_RELAXED); }

void wstore_changed(wstore *ws, int b) { __atomic_add_fetch(&ws->gen[b], 1, __ATOMIC_RELAXED); }

static void changed(wstore *ws, int b) { wstore_changed(ws, b); }

zo_status wstore_put_host_done(wstore *ws, int b, size_t rel, size_t n)
{
    if (!ws->round_gens) changed(ws, b);
    return ws->ops->put_host_done(ws, b, rel, n);
}

zo_status wstore_put_dev_done(wstore *ws, int b, gpu_stream_t s)
{
    if (!ws->round_gens) changed(ws, b);
    return ws->ops->put_dev_done(ws, b, s);
}

void wstore_will_change(wstore *ws, int b)
{
    if (ws && ws->ops->will_change) ws->ops->will_change(ws, b);
}

zo_status wstore_use(wstore *ws, int b, gpu_stream_t s)
{
    return ws && ws->ops->use ? ws->ops->use(ws, b, s) : ZO_OK;
}

/* The round's puts waited for (with host_only and ordered puts, only the
 * host's side: sync_host), then the round closed. */
static zo_status settle(wstore *ws, int host_only)
{
    zo_status st = host_only && ws->puts_ordered && ws->ops->sync_host ? ws->ops->sync_host(ws) : ws->ops->sync(ws);
    zo_status sr = ws->ops->round_end ? ws->ops->round_end(ws) : ZO_OK;
    return st != ZO_OK ? st : sr;
}

zo_status wstore_settle(wstore *ws) { return settle(ws, 0); }

zo_status wstore_settle_host(wstore *ws) { return settle(ws, 1); }

zo_status wstore_load_f32(wstore *ws, int b, size_t rel, size_t n, const float *src)
{
    changed(ws, b);
    return ws->ops->load(ws, b, rel, n, src);
}

/* ---- what the tiers share ----------------------------------------------------------------- */

/* offload_to_dtype by the CPU Adam's team (the host thread's loads and
 * puts; each element converted alone, so the bytes are the same). */
static void to_dtype_team(const wstore *ws, void *dst, const float *src, size_t n)
{
    if (ws->g->dtype == ZO_DTYPE_F32) zo_copy_team(dst, src, n * sizeof(float), ws->env->n_threads);
    else zo_convert_team(dst, ws->g->dtype, src, ZO_DTYPE_F32, n, ws->env->n_threads);
}

/* Put [rel, rel + n) of block b chunk by chunk, each chunk converted from
 * fp32 or copied as it is from element `done` of the source (the copy by
 * the CPU Adam's team: these run on the host thread, the optimizer's
 * thread idle; dpu publishes a step's every weight so). */
static zo_status put_chunks(wstore *ws, int b, size_t rel, size_t n, const void *src, int f32)
{
    zo_status st;
    size_t es = ws->g->es;
    for (size_t done = 0; done < n; done += ws->put_max) {
        size_t k = n - done < ws->put_max ? n - done : ws->put_max;
        void *dst;
        if ((st = ws->ops->put_host(ws, b, rel + done, k, &dst)) != ZO_OK) return st;
        if (f32) to_dtype_team(ws, dst, (const float *)src + done, k);
        else zo_copy_team(dst, (const char *)src + done * es, k * es, ws->env->n_threads);
        if ((st = wstore_put_host_done(ws, b, rel + done, k)) != ZO_OK) return st;
    }
    return ZO_OK;
}

/* The streamed tiers' load: puts of chunks of at most put_max. */
static zo_status load_by_puts(wstore *ws, int b, size_t rel, size_t n, const float *src)
{
    return put_chunks(ws, b, rel, n, src, 1);
}

static const void *none_resident(wstore *ws, int b)
{
    (void)ws, (void)b;
    return NULL;
}

static zo_status staged_put_dev(void *stage, void **dst)
{
    if (!stage) return zo_error(ZO_ERR_INTERNAL, "offload: weights from the device without a staging block");
    *dst = stage;
    return ZO_OK;
}

/* The streamed tiers' device staging block, when new weights will come
 * from the device, and the event of its copies out. */
static zo_status staging_create(wstore *ws, const wstore_config *c, void **stage, gpu_event_t *ev)
{
    const offload_env *env = ws->env;
    zo_status st = gpu_event_create(env->dev, ev);
    if (st != ZO_OK || !c->dev_puts) return st;
    if ((st = gpu_mem_alloc(env->dev, ws->g->slot_bytes, stage)) != ZO_OK)
        return zo_error_wrap(st, "offload_init: device staging of new weights (%zu bytes)", ws->g->slot_bytes);
    return ZO_OK;
}

/* ---- the device tier --------------------------------------------------------------------- */

typedef struct dev_store {
    wstore base;
    void *dev;                 /* device [elems] dtype */
    const size_t *boff;        /* [nb] block offsets in it: the model's, or padded (ZeRO 1-2) */
    size_t *boff_own;
    void *stage[2];            /* pinned [put_max] dtype: host puts on their way in */
    gpu_event_t stage_ev[2];   /* h2d: the chunk's copy is done */
    int stage_pending[2];
    int stage_cur;
    gpu_event_t pin_ev;        /* h2d: the last put from pinned memory (put_pinned) is done */
    int pin_pending;
    gpu_event_t ev;            /* the stream of the last device put, or of a read out: done */
    int ev_pending;
    /* puts_ordered (one rank, puts from the device): block b's last device
     * put, which a stream reading the block waits for (dev_use) */
    gpu_event_t *put_ev;       /* [nb] */
    unsigned char *put_on;     /* [nb] put_ev[b] recorded */
    /* ZeRO 1-2: the round of puts of a step */
    const offload_dp *dp;      /* NULL: puts are whole-block coordinates */
    size_t *got;               /* [nb] elements of the rank's part put this round */
    int next_ag;               /* the next block to all-gather */
    int round;                 /* a put since the last sync: the step's round of puts */
    gpu_stream_t dev_s;        /* the stream of this round's device puts, or NULL */
    gpu_event_t ag_join;       /* dev_s: its puts so far (the all-gather's input) */
    /* deferred (the optimizer puts from its own thread): the gathers are the
     * host thread's, a block's when it is used or the round ends */
    int deferred;
    unsigned char *pending;    /* [nb] announced this round (will_change), not gathered yet */
    int n_pending;
} dev_store;

static dev_store *dev_of(wstore *ws) { return (dev_store *)ws; }

static char *dev_at(const wstore *ws, int b, size_t rel)
{
    const dev_store *d = (const dev_store *)ws;
    return (char *)d->dev + (d->boff[b] + rel) * ws->g->es;
}

/* Where a put of the optimizer's element `rel` of block b goes: its part's
 * place in the whole block. */
static size_t put_pos(const wstore *ws, int b, size_t rel)
{
    const dev_store *d = (const dev_store *)ws;
    return d->dp ? d->dp->part_off[b] + rel : rel;
}

static const void *dev_resident(wstore *ws, int b) { return dev_at(ws, b, 0); }

static zo_status dev_fetch(wstore *ws, int b, void *dst)
{
    (void)ws, (void)b, (void)dst;
    return zo_error(ZO_ERR_INTERNAL, "offload: resident weights are not fetched");
}

static zo_status dev_put_host(wstore *ws, int b, size_t rel, size_t n, void **dst)
{
    dev_store *d = dev_of(ws);
    (void)b, (void)rel;
    if (n > ws->put_max)
        return zo_error(ZO_ERR_INTERNAL, "offload: a put of %zu elements (at most %zu)", n, ws->put_max);
    int k = d->stage_cur ^= 1;
    if (d->stage_pending[k]) {
        zo_status st = offload_timed_wait(ws->env, d->stage_ev[k], OFFLOAD_TIME_OPTIMIZER);
        d->stage_pending[k] = 0;
        if (st != ZO_OK) return st;
    }
    *dst = d->stage[k];
    return ZO_OK;
}

/* Elements [pos, pos + n) of block b from host memory src, on h2d. */
static zo_status dev_h2d(wstore *ws, int b, size_t pos, const void *src, size_t n)
{
    const offload_env *env = ws->env;
    size_t bytes = n * ws->g->es;
    if (!bytes) return ZO_OK;
    zo_status st = gpu_memcpy_async(env->h2d, dev_at(ws, b, pos), src, bytes, GPU_COPY_HOST_TO_DEVICE);
    if (st == ZO_OK) offload_add_bytes(env->acct, OFFLOAD_BYTES_H2D, bytes);
    return st;
}

/* The staged chunk from its element `from` on into elements [pos, pos + n)
 * of block b. */
static zo_status dev_copy_in(wstore *ws, int b, size_t pos, size_t from, size_t n)
{
    dev_store *d = dev_of(ws);
    const offload_env *env = ws->env;
    int k = d->stage_cur;
    zo_status st;
    if (!n) return ZO_OK;
    if ((st = dev_h2d(ws, b, pos, (char *)d->stage[k] + from * ws->g->es, n)) != ZO_OK ||
        (st = gpu_event_record(d->stage_ev[k], env->h2d)) != ZO_OK)
        return st;
    d->stage_pending[k] = 1;
    return ZO_OK;
}

/* Block b's new weights from every rank, after dp->ev_in (recorded on
 * h2d); s (when not NULL) waits for them. In place, or, for a block in
 * segments (expert parallelism), through a bucket, blocking. */
static zo_status dev_all_gather(wstore *ws, int b, gpu_stream_t s)
{
    offload_dp *dp = ws->env->dp;
    zo_status st;
    if (offload_dp_segmented(dp, b))
        return offload_dp_gather_segs(dp, b, ws->g->numel[b], ws->g->es, dev_at(ws, b, 0), 0,
                                      GPU_COPY_DEVICE_TO_DEVICE, dev_at(ws, b, 0), GPU_COPY_DEVICE_TO_DEVICE);
    if ((st = offload_dp_block(dp, DP_ALL_GATHER, b, ws->g->numel[b], dev_at(ws, b, 0), ws->g->dtype, dp->ev_in,
                               s ? dp->ev_out : NULL)) != ZO_OK)
        return st;
    return s ? gpu_stream_wait_event(s, dp->ev_out) : ZO_OK;
}

/* ZeRO 1-2: all-gather, in block order, every block whose part is complete
 * this round (all of them when `all`: the end of the round). A block's
 * input is the rank's part, written by copies on h2d and device puts on
 * dev_s: h2d joins dev_s, and the all-gather starts after h2d. */
static zo_status dev_gather_ready(wstore *ws, int all)
{
    dev_store *d = dev_of(ws);
    const offload_env *env = ws->env;
    const offload_dp *dp = d->dp;
    zo_status st;
    int joined = 0;
    while (d->next_ag < ws->g->nb) {
        int b = d->next_ag;
        if (d->got[b] < dp->part_n[b] && !all) break;
        if (d->got[b] != dp->part_n[b])
            return zo_error(ZO_ERR_INTERNAL, "offload: new weights of block %d incomplete (%zu of %zu)",
                            b, d->got[b], dp->part_n[b]);
        if (!joined) {
            if (d->dev_s && ((st = gpu_event_record(d->ag_join, d->dev_s)) != ZO_OK ||
                             (st = gpu_stream_wait_event(env->h2d, d->ag_join)) != ZO_OK))
                return st;
            if ((st = gpu_event_record(dp->ev_in, env->h2d)) != ZO_OK) return st;
            joined = 1;
        }
        if (ws->g->numel[b] && (st = dev_all_gather(ws, b, NULL)) != ZO_OK) return st;
        d->got[b] = 0;
        d->next_ag++;
    }
    return ZO_OK;
}

/* The optimizer put n elements of block b's part: counted, and (not
 * deferred: the host thread puts) the blocks complete so far gathered. */
static zo_status dev_part_done(wstore *ws, int b, size_t n)
{
    dev_store *d = dev_of(ws);
    if (!d->dp) return ZO_OK;
    d->got[b] += n;
    if (d->deferred) return ZO_OK;
    d->round = 1;
    return dev_gather_ready(ws, 0);
}

/* Deferred: block b's new parts all-gathered in place (every rank's puts
 * of it are done: the host thread saw the block published), ordered after
 * the device puts and the chunks' copies; s (when not NULL) waits for it. */
static zo_status dev_gather_one(wstore *ws, int b, gpu_stream_t s)
{
    dev_store *d = dev_of(ws);
    const offload_env *env = ws->env;
    const offload_dp *dp = d->dp;
    zo_status st;
    if (d->got[b] != dp->part_n[b])
        return zo_error(ZO_ERR_INTERNAL, "offload: new weights of block %d incomplete (%zu of %zu)", b, d->got[b],
                        dp->part_n[b]);
    if (d->dev_s && ((st = gpu_event_record(d->ag_join, d->dev_s)) != ZO_OK ||
                     (st = gpu_stream_wait_event(env->h2d, d->ag_join)) != ZO_OK))
        return st;
    if ((st = gpu_event_record(dp->ev_in, env->h2d)) != ZO_OK || (st = dev_all_gather(ws, b, s)) != ZO_OK)
        return st;
    d->got[b] = 0;
    d->pending[b] = 0;
    if (!--d->n_pending) d->dev_s = NULL;
    return ZO_OK;
}

/* The host thread: the round's blocks (-1: all that have weights). */
static void dev_will_change(wstore *ws, int b)
{
    dev_store *d = dev_of(ws);
    if (!d->dp) return;
    if (!d->deferred) {
        d->round = 1;
        return;
    }
    for (int k = b < 0 ? 0 : b; k < (b < 0 ? ws->g->nb : b + 1); k++)
        if (ws->g->numel[k] && !d->pending[k]) {
            d->pending[k] = 1;
            d->n_pending++;
        }
}

/* The host thread, before the compute reads block b on s: its gather, if
 * the round still owes it one. */
static zo_status dev_use(wstore *ws, int b, gpu_stream_t s)
{
    dev_store *d = dev_of(ws);
    zo_status st;
    /* (a put from the device: s waits for it, not the host) */
    if (d->put_ev && d->put_on[b] && (st = gpu_stream_wait_event(s, d->put_ev[b])) != ZO_OK) return st;
    if (!d->dp || !d->deferred || !d->pending[b]) return ZO_OK;
    return dev_gather_one(ws, b, s);
}

/* The optimizer's elements [rel, rel + n) of block b from host memory src
 * (element 0 of src is rel's) on h2d, run by run: a part in segments
 * (expert parallelism) is not contiguous in the block. Then `ev` recorded
 * on h2d (*pending set) and the part counted. */
static zo_status dev_put_runs(wstore *ws, int b, size_t rel, size_t n, const char *src, gpu_event_t ev,
                              int *pending)
{
    zo_status st;
    for (size_t done = 0, run; done < n; done += run) {
        size_t at = offload_dp_part_at(dev_of(ws)->dp, b, rel + done, &run);
        if (run > n - done) run = n - done;
        if ((st = dev_h2d(ws, b, at, src + done * ws->g->es, run)) != ZO_OK) return st;
    }
    if (n) {
        if ((st = gpu_event_record(ev, ws->env->h2d)) != ZO_OK) return st;
        *pending = 1;
    }
    return dev_part_done(ws, b, n);
}

static zo_status dev_put_host_done(wstore *ws, int b, size_t rel, size_t n)
{
    dev_store *d = dev_of(ws);
    const int k = d->stage_cur;
    return dev_put_runs(ws, b, rel, n, d->stage[k], d->stage_ev[k], &d->stage_pending[k]);
}

/* (straight from src: no staging) */
static zo_status dev_put_pinned(wstore *ws, int b, size_t rel, size_t n, const void *src)
{
    dev_store *d = dev_of(ws);
    return dev_put_runs(ws, b, rel, n, src, d->pin_ev, &d->pin_pending);
}

static zo_status dev_put_dev(wstore *ws, int b, void **dst)
{
    /* (a part in segments has part_off 0: the block's start, the runs in
     * their places, put_dev_runs) */
    *dst = dev_at(ws, b, put_pos(ws, b, 0));
    return ZO_OK;
}

static zo_status dev_put_dev_done(wstore *ws, int b, gpu_stream_t s)
{
    dev_store *d = dev_of(ws);
    /* in place: the compute waits for the stream's work */
    zo_status st = gpu_event_record(d->ev, s);
    if (st != ZO_OK) return st;
    d->ev_pending = 1;
    d->dev_s = s;
    if (d->put_ev) {
        if ((st = gpu_event_record(d->put_ev[b], s)) != ZO_OK) return st;
        d->put_on[b] = 1;
    }
    return dev_part_done(ws, b, d->dp ? d->dp->part_n[b] : 0);
}

/* A load: whole-block coordinates, every rank has them: no collective. */
static zo_status dev_load(wstore *ws, int b, size_t rel, size_t n, const float *src)
{
    zo_status st;
    for (size_t done = 0; done < n; done += ws->put_max) {
        size_t k = n - done < ws->put_max ? n - done : ws->put_max;
        void *dst;
        if ((st = dev_put_host(ws, b, rel + done, k, &dst)) != ZO_OK) return st;
        to_dtype_team(ws, dst, src + done, k);
        if ((st = dev_copy_in(ws, b, rel + done, 0, k)) != ZO_OK) return st;
    }
    return ZO_OK;
}

static zo_status dev_get_host(wstore *ws, int b, void *dst)
{
    const offload_env *env = ws->env;
    dev_store *d = dev_of(ws);
    size_t bytes = block_bytes(ws, b);
    zo_status st;
    if (!bytes) return ZO_OK;
    if ((st = gpu_memcpy_async(env->d2h, dst, dev_at(ws, b, 0), bytes, GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
        (st = gpu_event_record(d->ev, env->d2h)) != ZO_OK)
        return st;
    return gpu_event_synchronize(d->ev);
}

/* ZeRO 1-2, the host thread: every block of the round gathered, in block
 * order, and waited for. */
static zo_status dev_round_end(wstore *ws)
{
    dev_store *d = dev_of(ws);
    zo_status st = ZO_OK;
    if (!d->dp) return ZO_OK;
    if (d->deferred) {
        for (int b = 0; b < ws->g->nb && st == ZO_OK && d->n_pending; b++)
            if (d->pending[b]) st = dev_gather_one(ws, b, NULL);
        zo_status sw = offload_dp_wait(ws->env->dp);
        return st != ZO_OK ? st : sw;
    }
    if (!d->round) return ZO_OK;
    /* every rank puts part of the model each step (offload_dp_create
     * refuses a rank with nothing), so every rank ends the round */
    st = dev_gather_ready(ws, 1);
    zo_status sw = offload_dp_wait(ws->env->dp);
    if (st == ZO_OK) st = sw;
    memset(d->got, 0, (size_t)ws->g->nb * sizeof *d->got);
    d->next_ag = 0;
    d->dev_s = NULL;
    d->round = 0;
    return st;
}

/* The chunks put from the host have all arrived (any thread). */
static zo_status dev_sync_host(wstore *ws)
{
    dev_store *d = dev_of(ws);
    zo_status st = ZO_OK;
    for (int k = 0; k < 2; k++) {
        if (!d->stage_pending[k]) continue;
        zo_status sk = offload_timed_wait(ws->env, d->stage_ev[k], OFFLOAD_TIME_OPTIMIZER);
        d->stage_pending[k] = 0;
        if (st == ZO_OK) st = sk;
    }
    if (d->pin_pending) {
        zo_status sk = offload_timed_wait(ws->env, d->pin_ev, OFFLOAD_TIME_OPTIMIZER);
        d->pin_pending = 0;
        if (st == ZO_OK) st = sk;
    }
    return st;
}

/* The puts from the device and the chunks have all arrived (any thread). */
static zo_status dev_sync(wstore *ws)
{
    dev_store *d = dev_of(ws);
    zo_status st = dev_sync_host(ws);
    if (d->ev_pending) {
        zo_status sk = offload_timed_wait(ws->env, d->ev, OFFLOAD_TIME_OPTIMIZER);
        d->ev_pending = 0;
        if (st == ZO_OK) st = sk;
    }
    return st;
}

static void dev_destroy(wstore *ws)
{
    dev_store *d = dev_of(ws);
    const offload_env *env = ws->env;
    gpu_mem_free(env->dev, d->dev);
    for (int k = 0; k < 2; k++) {
        offload_host_free(env, d->stage[k], ws->put_max * ws->g->es, 1);
        if (d->stage_ev[k]) gpu_event_destroy(d->stage_ev[k]);
    }
    if (d->ev) gpu_event_destroy(d->ev);
    if (d->pin_ev) gpu_event_destroy(d->pin_ev);
    if (d->ag_join) gpu_event_destroy(d->ag_join);
    for (int b = 0; d->put_ev && b < ws->g->nb; b++)
        if (d->put_ev[b]) gpu_event_destroy(d->put_ev[b]);
    free(d->put_ev);
    free(d->put_on);
    free(d->got);
    free(d->pending);
    free(d->boff_own);
    free(d);
}

static const wstore_ops dev_ops = {
    .resident = dev_resident, .fetch = dev_fetch, .put_host = dev_put_host,
    .put_host_done = dev_put_host_done, .put_pinned = dev_put_pinned, .put_dev = dev_put_dev,
    .put_dev_done = dev_put_dev_done,
    .sync = dev_sync, .sync_host = dev_sync_host, .will_change = dev_will_change, .use = dev_use,
    .round_end = dev_round_end,
    .load = dev_load, .get_host = dev_get_host, .free = dev_destroy,
};

/* ZeRO 1-2: every block padded to a multiple of the rank count (an
 * all-gather in place needs it), the puts counted per block. */
static zo_status dev_partition(wstore *ws, size_t *elems)
{
    dev_store *d = dev_of(ws);
    const offload_dp *dp = ws->env->dp;
    const offload_geom *g = ws->g;
    d->dp = dp;
    ws->put_dev_runs = 1;
    d->boff_own = calloc((size_t)g->nb, sizeof(size_t));
    d->got = calloc((size_t)g->nb, sizeof(size_t));
    d->pending = calloc((size_t)g->nb, 1);
    if (!d->boff_own || !d->got || !d->pending) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    size_t o = 0;
    for (int b = 0; b < g->nb; b++) {
        d->boff_own[b] = o;
        o += dp->pad[b];
    }
    d->boff = d->boff_own;
    *elems = o;
    return gpu_event_create(ws->env->dev, &d->ag_join);
}

static zo_status dev_create(wstore *ws, const wstore_config *c)
{
    dev_store *d = dev_of(ws);
    const offload_env *env = ws->env;
    size_t elems = ws->g->n;
    zo_status st;
    ws->resident = 1;
    d->boff = ws->g->off;
    if (c->gathered && (st = dev_partition(ws, &elems)) != ZO_OK) return st;
    d->deferred = c->gathered && c->deferred;
    size_t bytes = elems * ws->g->es;
    if ((st = gpu_mem_alloc(env->dev, bytes, &d->dev)) != ZO_OK)
        return zo_error_wrap(st, "offload_init: resident weights (%zu bytes) on the device", bytes);
    ws->put_max = c->chunk ? c->chunk : 1;
    if (ws->put_max > ws->g->largest && ws->g->largest) ws->put_max = ws->g->largest;
    for (int k = 0; k < 2; k++) {
        if ((st = offload_host_alloc(env, ws->put_max * ws->g->es, 1, &d->stage[k])) != ZO_OK)
            return zo_error_wrap(st, "offload_init: pinned staging of new weights");
        if ((st = gpu_event_create(env->dev, &d->stage_ev[k])) != ZO_OK) return st;
    }
    /* one rank with puts from the device (a device shard): each block's put
     * ordered before its reads by an event of its own */
    if (c->dev_puts && !env->dp) {
        int nb = ws->g->nb;
        d->put_ev = calloc((size_t)nb, sizeof *d->put_ev);
        d->put_on = calloc((size_t)nb, 1);
        if (!d->put_ev || !d->put_on) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
        for (int b = 0; b < nb; b++)
            if ((st = gpu_event_create(env->dev, &d->put_ev[b])) != ZO_OK) return st;
        ws->puts_ordered = 1;
    }
    if ((st = gpu_event_create(env->dev, &d->pin_ev)) != ZO_OK) return st;
    return gpu_event_create(env->dev, &d->ev);
}

/* ---- the host tier ------------------------------------------------------------------------ */

typedef struct host_store {
    wstore base;
    void *host;                /* pinned [n] dtype */
    void *dev_stage;           /* device [slot_bytes]: new weights from the device */
    gpu_event_t dev_ev;        /* the stream of the last device put: its copy out is done */
    int dev_pending;
} host_store;

static host_store *host_of(wstore *ws) { return (host_store *)ws; }

static char *host_at(const wstore *ws, int b, size_t rel)
{
    return (char *)((const host_store *)ws)->host + (ws->g->off[b] + rel) * ws->g->es;
}

static zo_status host_fetch(wstore *ws, int b, void *dst)
{
    const offload_env *env = ws->env;
    size_t bytes = block_bytes(ws, b);
    if (!bytes) return ZO_OK;
    zo_status st = gpu_memcpy_async(env->h2d, dst, host_at(ws, b, 0), bytes, GPU_COPY_HOST_TO_DEVICE);
    if (st == ZO_OK) offload_add_bytes(env->acct, OFFLOAD_BYTES_H2D, bytes);
    return st;
}

static zo_status host_fetch_range(wstore *ws, int b, size_t rel, size_t n, void *dst)
{
    const offload_env *env = ws->env;
    size_t bytes = n * ws->g->es;
    if (!bytes) return ZO_OK;
    zo_status st = gpu_memcpy_async(env->h2d, dst, host_at(ws, b, rel), bytes, GPU_COPY_HOST_TO_DEVICE);
    if (st == ZO_OK) offload_add_bytes(env->acct, OFFLOAD_BYTES_H2D, bytes);
    return st;
}

static zo_status host_get_host(wstore *ws, int b, void *dst)
{
    memcpy(dst, host_at(ws, b, 0), block_bytes(ws, b));
    return ZO_OK;
}

static const void *host_in_place(wstore *ws, int b) { return host_at(ws, b, 0); }

static zo_status host_put_host(wstore *ws, int b, size_t rel, size_t n, void **dst)
{
    (void)n;
    *dst = host_at(ws, b, rel);
    return ZO_OK;
}

static zo_status host_put_host_done(wstore *ws, int b, size_t rel, size_t n)
{
    (void)ws, (void)b, (void)rel, (void)n;
    return ZO_OK;
}

static zo_status host_put_dev(wstore *ws, int b, void **dst)
{
    (void)b;
    return staged_put_dev(host_of(ws)->dev_stage, dst);
}

static zo_status host_put_dev_done(wstore *ws, int b, gpu_stream_t s)
{
    host_store *h = host_of(ws);
    size_t bytes = block_bytes(ws, b);
    zo_status st;
    if (!bytes) return ZO_OK;
    /* the next put into the staging block is ordered after this copy on s */
    if ((st = gpu_memcpy_async(s, host_at(ws, b, 0), h->dev_stage, bytes, GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
        (st = gpu_event_record(h->dev_ev, s)) != ZO_OK)
        return st;
    h->dev_pending = 1;
    offload_add_bytes(ws->env->acct, OFFLOAD_BYTES_D2H, bytes);
    return ZO_OK;
}

/* The copies out of the staging block have arrived. */
static zo_status host_sync(wstore *ws)
{
    host_store *h = host_of(ws);
    if (!h->dev_pending) return ZO_OK;
    h->dev_pending = 0;
    return offload_timed_wait(ws->env, h->dev_ev, OFFLOAD_TIME_OPTIMIZER);
}

static void host_destroy(wstore *ws)
{
    host_store *h = host_of(ws);
    offload_host_free(ws->env, h->host, ws->g->n * ws->g->es, 1);
    gpu_mem_free(ws->env->dev, h->dev_stage);
    if (h->dev_ev) gpu_event_destroy(h->dev_ev);
    free(h);
}

static const wstore_ops host_ops = {
    .resident = none_resident, .fetch = host_fetch, .fetch_range = host_fetch_range, .put_host = host_put_host,
    .put_host_done = host_put_host_done, .put_dev = host_put_dev, .put_dev_done = host_put_dev_done,
    .sync = host_sync, .load = load_by_puts, .get_host = host_get_host, .host = host_in_place,
    .free = host_destroy,
};

static zo_status host_create(wstore *ws, const wstore_config *c)
{
    host_store *h = host_of(ws);
    size_t bytes = ws->g->n * ws->g->es;
    zo_status st = offload_host_alloc(ws->env, bytes, 1, &h->host);
    if (st != ZO_OK) return zo_error_wrap(st, "offload_init: weights in pinned host memory");
    if (bytes) zo_memset_team(h->host, 0, bytes, ws->env->n_threads);
    ws->put_max = ws->g->largest;
    return staging_create(ws, c, &h->dev_stage, &h->dev_ev);
}

void *wstore_host_array(wstore *ws) { return ws->ops == &host_ops ? host_of(ws)->host : NULL; }

void *wstore_dev_array(wstore *ws)
{
    if (ws->ops != &dev_ops) return NULL;
    const dev_store *d = dev_of(ws);
    if (d->dp) return NULL;
    for (int b = 0; b < ws->g->nb; b++)
        if (d->boff[b] != ws->g->off[b]) return NULL;
    return d->dev;
}

/* ---- the nvme tier ------------------------------------------------------------------------- */

#ifdef ZO_OFFLOAD_HAVE_NVME

typedef struct nvme_wstore {
    wstore base;
    nvme_engine_t *engine;
    nvme_store_t *store;
    int *ids;                  /* [nb] tensor ids */
    int counted;               /* the store's bytes are counted in the NVMe tier */
    void *asm_buf;             /* pinned [slot_bytes]: a block on its way to NVMe */
    int asm_block;             /* the block being assembled, -1 none */
    size_t asm_done;           /* its elements written so far */
    int n_ring;
    void **ring;               /* [n_ring] pinned [slot_bytes]: read-ahead */
    gpu_event_t *ring_ev;      /* h2d: the buffer's copy to the device is done */
    int *ring_used;
    int ring_next;
    void *dev_stage;           /* device [slot_bytes]: new weights from the device */
    gpu_event_t dev_ev;        /* their copy out to asm_buf is done */
    /* the host thread fetches while the optimizer's thread writes (schedules
     * other than serial): one ring, one caller at a time */
    pthread_mutex_t io_mu;
    int io_mu_init;
} nvme_wstore;

static nvme_wstore *nvme_of(wstore *ws) { return (nvme_wstore *)ws; }

static zo_status nvme_write_block(wstore *ws, int b)
{
    nvme_wstore *w = nvme_of(ws);
    offload_timer t0 = offload_time_begin();
    pthread_mutex_lock(&w->io_mu);
    zo_status st = nvme_store_write(w->store, w->ids[b], w->asm_buf);
    pthread_mutex_unlock(&w->io_mu);
    offload_time_end(ws->env->acct, OFFLOAD_TIME_DISK, t0);
    if (st != ZO_OK) return zo_error_wrap(st, "offload: weights of block %d to NVMe", b);
    offload_add_bytes(ws->env->acct, OFFLOAD_BYTES_DISK_WRITTEN, block_bytes(ws, b));
    return ZO_OK;
}

/* Block b (bytes of it) read into the next read-ahead buffer, once its
 * last copy to the device is done; its index in *r. */
static zo_status nvme_read_ahead(wstore *ws, int b, size_t bytes, int *r_out)
{
    nvme_wstore *w = nvme_of(ws);
    const offload_env *env = ws->env;
    zo_status st;
    int r = *r_out = w->ring_next;
    w->ring_next = (r + 1) % w->n_ring;
    if (w->ring_used[r] && (st = offload_timed_wait(env, w->ring_ev[r], OFFLOAD_TIME_WEIGHTS)) != ZO_OK)
        return st;
    offload_timer t0 = offload_time_begin();
    pthread_mutex_lock(&w->io_mu);
    st = nvme_store_read(w->store, w->ids[b], w->ring[r]);
    pthread_mutex_unlock(&w->io_mu);
    offload_time_end(env->acct, OFFLOAD_TIME_DISK, t0);
    if (st != ZO_OK) return zo_error_wrap(st, "offload: weights of block %d from NVMe", b);
    offload_add_bytes(env->acct, OFFLOAD_BYTES_DISK_READ, bytes);
    return ZO_OK;
}

static zo_status nvme_fetch(wstore *ws, int b, void *dst)
{
    nvme_wstore *w = nvme_of(ws);
    const offload_env *env = ws->env;
    size_t bytes = block_bytes(ws, b);
    zo_status st;
    int r;
    if (!bytes) return ZO_OK;
    if ((st = nvme_read_ahead(ws, b, bytes, &r)) != ZO_OK) return st;
    if ((st = gpu_memcpy_async(env->h2d, dst, w->ring[r], bytes, GPU_COPY_HOST_TO_DEVICE)) != ZO_OK ||
        (st = gpu_event_record(w->ring_ev[r], env->h2d)) != ZO_OK)
        return st;
    w->ring_used[r] = 1;
    offload_add_bytes(env->acct, OFFLOAD_BYTES_H2D, bytes);
    return ZO_OK;
}

/* The caller copies from the buffer and waits for its copies before the
 * store's next fetch (the gathering store's blocking gather through a
 * bucket): the buffer is marked free. */
static zo_status nvme_fetch_host(wstore *ws, int b, const void **src)
{
    nvme_wstore *w = nvme_of(ws);
    size_t bytes = block_bytes(ws, b);
    int r;
    *src = NULL;
    if (!bytes) return ZO_OK;
    zo_status st = nvme_read_ahead(ws, b, bytes, &r);
    if (st != ZO_OK) return st;
    w->ring_used[r] = 0;
    *src = w->ring[r];
    return ZO_OK;
}

static zo_status nvme_get_host(wstore *ws, int b, void *dst)
{
    nvme_wstore *w = nvme_of(ws);
    if (!block_bytes(ws, b)) return ZO_OK;
    offload_timer t0 = offload_time_begin();
    pthread_mutex_lock(&w->io_mu);
    zo_status st = nvme_store_read(w->store, w->ids[b], dst);
    pthread_mutex_unlock(&w->io_mu);
    offload_time_end(ws->env->acct, OFFLOAD_TIME_DISK, t0);
    if (st != ZO_OK) return zo_error_wrap(st, "offload: weights of block %d from NVMe", b);
    offload_add_bytes(ws->env->acct, OFFLOAD_BYTES_DISK_READ, block_bytes(ws, b));
    return ZO_OK;
}

static zo_status nvme_put_host(wstore *ws, int b, size_t rel, size_t n, void **dst)
{
    nvme_wstore *w = nvme_of(ws);
    (void)n;
    if (w->asm_block != b) {
        if (w->asm_block >= 0)
            return zo_error(ZO_ERR_INTERNAL, "offload: new weights of block %d left incomplete for block %d",
                            w->asm_block, b);
        w->asm_block = b;
        w->asm_done = 0;
    }
    *dst = (char *)w->asm_buf + rel * ws->g->es;
    return ZO_OK;
}

static zo_status nvme_put_host_done(wstore *ws, int b, size_t rel, size_t n)
{
    nvme_wstore *w = nvme_of(ws);
    (void)rel;
    w->asm_done += n;
    if (w->asm_done < ws->g->numel[b]) return ZO_OK;
    w->asm_block = -1;
    return nvme_write_block(ws, b);
}

static zo_status nvme_put_dev(wstore *ws, int b, void **dst)
{
    (void)b;
    return staged_put_dev(nvme_of(ws)->dev_stage, dst);
}

static zo_status nvme_put_dev_done(wstore *ws, int b, gpu_stream_t s)
{
    nvme_wstore *w = nvme_of(ws);
    size_t bytes = block_bytes(ws, b);
    zo_status st;
    if (!bytes) return ZO_OK;
    if (w->asm_block >= 0)
        return zo_error(ZO_ERR_INTERNAL, "offload: block %d from the device while block %d is assembled",
                        b, w->asm_block);
    if ((st = gpu_memcpy_async(s, w->asm_buf, w->dev_stage, bytes, GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
        (st = gpu_event_record(w->dev_ev, s)) != ZO_OK ||
        (st = offload_timed_wait(ws->env, w->dev_ev, OFFLOAD_TIME_OPTIMIZER)) != ZO_OK)
        return st;
    offload_add_bytes(ws->env->acct, OFFLOAD_BYTES_D2H, bytes);
    return nvme_write_block(ws, b);
}

static zo_status nvme_sync(wstore *ws)
{
    nvme_wstore *w = nvme_of(ws);
    if (w->asm_block >= 0) {
        int b = w->asm_block;
        w->asm_block = -1;
        return zo_error(ZO_ERR_INTERNAL, "offload: new weights of block %d left incomplete (%zu of %zu)",
                        b, w->asm_done, ws->g->numel[b]);
    }
    return ZO_OK;
}

static void nvme_destroy(wstore *ws)
{
    nvme_wstore *w = nvme_of(ws);
    const offload_env *env = ws->env;
    offload_host_free(env, w->asm_buf, ws->g->slot_bytes, 1);
    for (int i = 0; w->ring && i < w->n_ring; i++) {
        offload_host_free(env, w->ring[i], ws->g->slot_bytes, 1);
        if (w->ring_ev[i]) gpu_event_destroy(w->ring_ev[i]);
    }
    free(w->ring);
    free(w->ring_ev);
    free(w->ring_used);
    gpu_mem_free(env->dev, w->dev_stage);
    if (w->dev_ev) gpu_event_destroy(w->dev_ev);
    if (w->counted) offload_count(env->acct, OFFLOAD_NVME, -(int64_t)nvme_store_footprint(w->store));
    if (w->store) nvme_store_free(w->store);
    if (w->engine) nvme_engine_free(w->engine);
    free(w->ids);
    if (w->io_mu_init) pthread_mutex_destroy(&w->io_mu);
    free(w);
}

static const wstore_ops nvme_ops = {
    .resident = none_resident, .fetch = nvme_fetch, .put_host = nvme_put_host,
    .put_host_done = nvme_put_host_done, .put_dev = nvme_put_dev, .put_dev_done = nvme_put_dev_done,
    .sync = nvme_sync, .load = load_by_puts, .get_host = nvme_get_host, .fetch_host = nvme_fetch_host,
    .free = nvme_destroy,
};

/* The NVMe store of the blocks: one tensor each, in dir. */
static zo_status nvme_open(wstore *ws, const char *dir, const char *name)
{
    nvme_wstore *w = nvme_of(ws);
    const offload_geom *g = ws->g;
    zo_status st;
    pthread_mutex_init(&w->io_mu, NULL);
    w->io_mu_init = 1;
    nvme_engine_config ec = {0};
    if ((st = nvme_engine_init(&w->engine, &ec)) != ZO_OK) return st;
    /* <dir>/zo-<name>-<random>.0.swap ("par", "frz"), created exclusively
     * and locked; unlocked ones of dead runs are removed (nvme_store.h) */
    char prefix[64];
    snprintf(prefix, sizeof prefix, "zo-%s", name);
    const char *dirs[1] = {dir};
    nvme_store_config sc = {.dirs = dirs, .ndirs = 1, .prefix = prefix};
    if ((st = nvme_store_init(&w->store, w->engine, &sc)) != ZO_OK)
        return zo_error_wrap(st, "offload: NVMe store in %s", dir);
    w->ids = calloc((size_t)g->nb, sizeof(int));
    char(*names)[32] = calloc((size_t)g->nb, sizeof *names);
    const char **np = calloc((size_t)g->nb, sizeof *np);
    size_t *bytes = calloc((size_t)g->nb, sizeof(size_t));
    if (!w->ids || !names || !np || !bytes) {
        st = zo_error(ZO_ERR_NOMEM, "offload: out of host memory");
        goto out_free;
    }
    for (int b = 0; b < g->nb; b++) {
        snprintf(names[b], sizeof names[b], "param.%d", b);
        np[b] = names[b];
        bytes[b] = g->numel[b] ? g->numel[b] * g->es : g->es;
    }
    st = nvme_store_add(w->store, (size_t)g->nb, np, bytes, w->ids);
    if (st != ZO_OK) st = zo_error_wrap(st, "offload: weights on NVMe");
    else {
        offload_count(ws->env->acct, OFFLOAD_NVME, (int64_t)nvme_store_footprint(w->store));
        w->counted = 1;
    }
out_free:
    free(names);
    free(np);
    free(bytes);
    return st;
}

static zo_status nvme_create(wstore *ws, const wstore_config *c)
{
    nvme_wstore *w = nvme_of(ws);
    const offload_env *env = ws->env;
    size_t sb = ws->g->slot_bytes;
    zo_status st;
    w->asm_block = -1;
    if ((st = nvme_open(ws, c->nvme_dir, c->name ? c->name : "par")) != ZO_OK) return st;
    ws->put_max = ws->g->largest;
    if ((st = offload_host_alloc(env, sb, 1, &w->asm_buf)) != ZO_OK)
        return zo_error_wrap(st, "offload_init: pinned buffer of weights to NVMe");
    w->n_ring = c->ring > 0 ? c->ring : 1;
    w->ring = calloc((size_t)w->n_ring, sizeof(void *));
    w->ring_ev = calloc((size_t)w->n_ring, sizeof(gpu_event_t));
    w->ring_used = calloc((size_t)w->n_ring, sizeof(int));
    if (!w->ring || !w->ring_ev || !w->ring_used) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    for (int i = 0; i < w->n_ring; i++) {
        if ((st = offload_host_alloc(env, sb, 1, &w->ring[i])) != ZO_OK)
            return zo_error_wrap(st, "offload_init: NVMe weights read-ahead");
        if ((st = gpu_event_create(env->dev, &w->ring_ev[i])) != ZO_OK) return st;
    }
    return staging_create(ws, c, &w->dev_stage, &w->dev_ev);
}

#define NVME_WSTORE_SIZE sizeof(nvme_wstore)

#else /* no nvme module: the configuration is refused at init */

static void nvme_destroy(wstore *ws) { free(ws); }
static const wstore_ops nvme_ops = {.free = nvme_destroy};
static zo_status nvme_create(wstore *ws, const wstore_config *c)
{
    (void)ws, (void)c;
    return zo_error(ZO_ERR_UNSUPPORTED, "offload: weights on NVMe need the nvme module (liburing, xxHash)");
}
#define NVME_WSTORE_SIZE sizeof(wstore)

#endif

/* ---- life cycle ------------------------------------------------------------------------------- */

zo_status wstore_create(const offload_env *env, const offload_geom *g, const wstore_config *c,
                        wstore **out)
{
    *out = NULL;
    static const size_t size[OFFLOAD_TIERS] = {sizeof(dev_store), sizeof(host_store), NVME_WSTORE_SIZE};
    static const wstore_ops *const ops[OFFLOAD_TIERS] = {&dev_ops, &host_ops, &nvme_ops};
    zo_status (*const create[OFFLOAD_TIERS])(wstore *, const wstore_config *) = {dev_create, host_create,
                                                                                 nvme_create};
    wstore *ws = calloc(1, size[c->tier]);
    if (!ws) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    zo_status st = wstore_init_base(ws, ops[c->tier], env, g, c->tier);
    if (st == ZO_OK) st = create[c->tier](ws, c);
    if (st != ZO_OK) {
        wstore_free(ws);
        return st;
    }
    *out = ws;
    return ZO_OK;
}

void wstore_free(wstore *ws)
{
    if (!ws) return;
    uint64_t *gen = ws->gen;
    ws->ops->free(ws);
    free(gen);
}

zo_status wstore_put_raw(wstore *ws, int b, size_t rel, size_t n, const void *src)
{
    return put_chunks(ws, b, rel, n, src, 0);
}

zo_status wstore_publish(wstore *from, wstore *to)
{
    zo_status st;
    if (from->ops != &host_ops)
        return zo_error(ZO_ERR_INTERNAL, "offload: weights published from a store not in host memory");
    /* the puts' geometry (the rank's parts with ZeRO 1-3) is from's; from's
     * memory is pinned, so a store that copies from there (the device
     * tier) takes it with no staging copy (the sync waits for the copies
     * before from's next writes) */
    for (int b = 0; b < from->g->nb; b++) {
        const void *src = host_at(from, b, 0);
        if (to->ops->put_pinned) {
            if (!to->round_gens) changed(to, b);
            st = to->ops->put_pinned(to, b, 0, from->g->numel[b], src);
        } else {
            st = wstore_put_raw(to, b, 0, from->g->numel[b], src);
        }
        if (st != ZO_OK) return st;
    }
    return to->ops->sync(to);
}
