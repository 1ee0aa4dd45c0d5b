/* The ZeRO-3 weight store: each rank keeps only its part of every block's
 * 16-bit weights, in an inner store of the tier the plan says (device,
 * pinned host or NVMe) over the rank's geometry, and a fetch assembles the
 * whole block in the device slot: the rank's part copied to its place, then
 * an all-gather in place, on the h2d stream. The runtime's prefetch issues
 * fetches `prefetch_depth` blocks ahead of use, so the gathers run one
 * block (or more) ahead of the compute, and a released slot is the block
 * released: in forward and again in backward.
 *
 * The optimizer's puts are the rank's parts, which is what the inner store
 * holds: they pass through, no collective. A load (whole blocks, every rank
 * has them) keeps the rank's part. Generations move when the host thread
 * announces a round of puts (will_change), never with a put, which may come
 * from the optimizer's thread at any moment: what a rank fetches, and so
 * gathers, depends only on its schedule, the same on every rank.
 *
 * The partition is the data-parallel one (the trainable weights) or one of
 * bytes (a LoRA base: offload_dp_part_bytes), gathered as fp32 words. With
 * expert parallelism a block's part may be in segments (the dense elements
 * or bytes over the world, the routed experts' over expert_comm): such a
 * part is gathered through a bucket from the inner store's memory (device,
 * pinned host, or an NVMe read-ahead buffer: fetch_host). */
#include "offload/wstore.h"

#include <stdlib.h>
#include <string.h>

typedef struct wgather {
    wstore base;
    wstore *inner;     /* block b: the rank's part, part.part_n[b] elements */
    offload_part part; /* the partition of the blocks (owned when it owns its arrays) */
} wgather;

static const offload_part *part_of(wstore *ws) { return &((wgather *)ws)->part; }

static wstore *inner_of(wstore *ws) { return ((wgather *)ws)->inner; }

static const void *wg_resident(wstore *ws, int b)
{
    (void)ws, (void)b;
    return NULL;
}

/* The rank's part into its place in dst, then the others' by all-gather;
 * the h2d stream waits for the gather (the slot's `ready` follows it). */
static zo_status wg_fetch(wstore *ws, int b, void *dst)
{
    const offload_env *env = ws->env;
    offload_dp *dp = env->dp;
    const offload_part *p = part_of(ws);
    wstore *in = inner_of(ws);
    size_t es = ws->g->es, n = p->part_n[b];
    char *mine = (char *)dst + p->part_off[b] * es;
    zo_status st;
    if (!ws->g->numel[b]) return ZO_OK;
    if (offload_part_segmented(p, b)) {
        /* a part in segments (expert parallelism): gathered through a
         * bucket, each piece of the rank's share copied into it from the
         * device store's part, the host store's pinned one or the NVMe
         * store's read-ahead buffer it was read into (no staging block: the
         * bucket is the only device memory it takes) */
        const void *src = in->resident ? in->ops->resident(in, b) : in->ops->host ? in->ops->host(in, b) : NULL;
        if (!src && in->ops->fetch_host && (st = in->ops->fetch_host(in, b, &src)) != ZO_OK) return st;
        if (!src)
            return zo_error(ZO_ERR_UNSUPPORTED, "offload: block %d's part is in segments (expert parallelism at "
                            "ZeRO-3): its store keeps it in no memory the gather reads", b);
        if (!in->resident) offload_add_bytes(env->acct, OFFLOAD_BYTES_H2D, n * es);
        return offload_dp_gather_part_segs(dp, p, b, es, src,
                                           in->resident ? GPU_COPY_DEVICE_TO_DEVICE : GPU_COPY_HOST_TO_DEVICE, dst,
                                           GPU_COPY_DEVICE_TO_DEVICE);
    }
    if (n && in->resident) {
        st = gpu_memcpy_async(env->h2d, mine, in->ops->resident(in, b), n * es, GPU_COPY_DEVICE_TO_DEVICE);
        if (st != ZO_OK) return st;
    } else if (n && (st = in->ops->fetch(in, b, mine)) != ZO_OK) {
        return st;
    }
    if ((st = gpu_event_record(dp->ev_in, env->h2d)) != ZO_OK ||
        (st = offload_dp_part_gather(dp, p, b, ws->g->numel[b], dst, dp->ev_in, dp->ev_out)) != ZO_OK)
        return st;
    return gpu_stream_wait_event(env->h2d, dp->ev_out);
}

static zo_status wg_put_host(wstore *ws, int b, size_t rel, size_t n, void **dst)
{
    wstore *in = inner_of(ws);
    return in->ops->put_host(in, b, rel, n, dst);
}

static zo_status wg_put_host_done(wstore *ws, int b, size_t rel, size_t n)
{
    return wstore_put_host_done(inner_of(ws), b, rel, n);
}

static zo_status wg_put_dev(wstore *ws, int b, void **dst)
{
    wstore *in = inner_of(ws);
    return in->ops->put_dev(in, b, dst);
}

static zo_status wg_put_dev_done(wstore *ws, int b, gpu_stream_t s)
{
    return wstore_put_dev_done(inner_of(ws), b, s);
}

/* The rank's puts have reached its parts (any thread: no collective). */
static zo_status wg_sync(wstore *ws)
{
    wstore *in = inner_of(ws);
    return in->ops->sync(in);
}

/* The host thread announces the blocks a round of puts changes: their
 * generations move now, on every rank at the same point of its schedule,
 * the blocks of which this rank holds nothing included (the other ranks
 * put their parts), so that every rank fetches, and gathers, the same
 * blocks. A block with nothing to train never changes. */
static void wg_will_change(wstore *ws, int b)
{
    for (int k = b < 0 ? 0 : b; k < (b < 0 ? ws->g->nb : b + 1); k++)
        if (ws->g->numel[k]) wstore_changed(ws, k);
}

/* The gathers of the last fetches: their requests done. */
static zo_status wg_round_end(wstore *ws) { return offload_dp_wait(ws->env->dp); }

/* Whole-block elements [rel, rel + n): the rank keeps their overlap with
 * its part. */
static zo_status wg_load(wstore *ws, int b, size_t rel, size_t n, const float *src)
{
    const offload_part *p = part_of(ws);
    wstore *in = inner_of(ws);
    zo_status st;
    /* the part's runs (one, or a part in segments: expert parallelism) */
    for (size_t at_part = 0, run; at_part < p->part_n[b]; at_part += run) {
        size_t po = offload_part_at(p, b, at_part, &run);
        if (run > p->part_n[b] - at_part) run = p->part_n[b] - at_part;
        size_t pe = po + run, lo = rel > po ? rel : po, hi = rel + n < pe ? rel + n : pe;
        if (lo < hi && (st = wstore_load_f32(in, b, at_part + (lo - po), hi - lo, src + (lo - rel))) != ZO_OK)
            return st;
    }
    return ZO_OK;
}

/* Block b whole into host memory: the rank's part read, the others'
 * gathered (blocking; a frozen base read back). */
static zo_status wg_get_host(wstore *ws, int b, void *dst)
{
    const offload_part *p = part_of(ws);
    wstore *in = inner_of(ws);
    size_t es = ws->g->es, pn = p->part_n[b], cap = p->pad[b] / (size_t)ws->env->dp->size * es;
    int segs = offload_part_segmented(p, b);
    void *part = NULL;
    zo_status st;
    if (!ws->g->numel[b]) return ZO_OK;
    if (pn * es > cap) cap = pn * es;
    if ((st = offload_host_alloc(ws->env, cap, 0, &part)) != ZO_OK) return st;
    memset(part, 0, cap);
    st = pn ? in->ops->get_host(in, b, part) : ZO_OK;
    if (st == ZO_OK && segs)
        st = offload_dp_gather_part_segs(ws->env->dp, p, b, es, part, GPU_COPY_HOST_TO_DEVICE, dst,
                                         GPU_COPY_DEVICE_TO_HOST);
    else if (st == ZO_OK)
        st = offload_dp_gather_part(ws->env->dp, p, b, ws->g->numel[b], es, part, dst);
    offload_host_free(ws->env, part, cap, 0);
    return st;
}

static void wg_free(wstore *ws)
{
    wgather *w = (wgather *)ws;
    wstore_free(w->inner);
    offload_dp_part_free(&w->part);
    free(ws);
}

static const wstore_ops wgather_ops = {
    .resident = wg_resident, .fetch = wg_fetch, .put_host = wg_put_host,
    .put_host_done = wg_put_host_done, .put_dev = wg_put_dev, .put_dev_done = wg_put_dev_done,
    .sync = wg_sync, .will_change = wg_will_change, .round_end = wg_round_end, .load = wg_load,
    .get_host = wg_get_host, .free = wg_free,
};

zo_status wgather_create(const offload_env *env, const offload_geom *g, wstore *inner, const offload_part *part,
                         wstore **out)
{
    *out = NULL;
    wgather *w = calloc(1, sizeof *w);
    if (!w) {
        wstore_free(inner);
        offload_part own = *part;
        offload_dp_part_free(&own);
        return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    }
    w->inner = inner;
    w->part = *part;
    zo_status st = wstore_init_base(&w->base, &wgather_ops, env, g, inner->tier);
    if (st != ZO_OK) {
        wstore_free(&w->base);
        return st;
    }
    w->base.part_only = 1;
    w->base.collective = 1;
    w->base.round_gens = 1;
    w->base.put_max = inner->put_max;
    *out = &w->base;
    return ZO_OK;
}
