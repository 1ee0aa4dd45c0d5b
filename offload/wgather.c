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
 * has them) keeps the rank's part. */
#include "offload/wstore.h"

#include <stdlib.h>

typedef struct wgather {
    wstore base;
    wstore *inner; /* block b: the rank's part, dp->part_n[b] elements */
    int round;     /* a put since the last sync */
} wgather;

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
    wstore *in = inner_of(ws);
    size_t es = ws->g->es, n = dp->part_n[b];
    char *mine = (char *)dst + dp->part_off[b] * es;
    zo_status st;
    if (!ws->g->numel[b]) return ZO_OK;
    if (n && in->resident) {
        st = gpu_memcpy_async(env->h2d, mine, in->ops->resident(in, b), n * es, GPU_COPY_DEVICE_TO_DEVICE);
        if (st != ZO_OK) return st;
    } else if (n && (st = in->ops->fetch(in, b, mine)) != ZO_OK) {
        return st;
    }
    if ((st = gpu_event_record(dp->ev_in, env->h2d)) != ZO_OK ||
        (st = offload_dp_block(dp, DP_ALL_GATHER, b, ws->g->numel[b], dst, ws->g->dtype, dp->ev_in,
                                    dp->ev_out)) != ZO_OK)
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
    ((wgather *)ws)->round = 1;
    return wstore_put_host_done(inner_of(ws), b, rel, n);
}

static zo_status wg_put_dev(wstore *ws, int b, void **dst)
{
    wstore *in = inner_of(ws);
    return in->ops->put_dev(in, b, dst);
}

static zo_status wg_put_dev_done(wstore *ws, int b, gpu_stream_t s)
{
    ((wgather *)ws)->round = 1;
    return wstore_put_dev_done(inner_of(ws), b, s);
}

/* The end of a round of puts: every block changed, the ones of which this
 * rank holds nothing included (the other ranks put their parts), so that
 * every rank fetches, and gathers, the same blocks. */
static zo_status wg_sync(wstore *ws)
{
    wgather *w = (wgather *)ws;
    wstore *in = inner_of(ws);
    if (w->round) wstore_changed_all(ws);
    w->round = 0;
    zo_status st = in->ops->sync(in);
    /* the gathers of the last fetches: their requests done */
    zo_status sw = offload_dp_wait(ws->env->dp);
    return st != ZO_OK ? st : sw;
}

/* Whole-block elements [rel, rel + n): the rank keeps their overlap with
 * its part. */
static zo_status wg_load(wstore *ws, int b, size_t rel, size_t n, const float *src)
{
    const offload_dp *dp = ws->env->dp;
    wstore *in = inner_of(ws);
    size_t po = dp->part_off[b], pe = po + dp->part_n[b];
    size_t lo = rel > po ? rel : po, hi = rel + n < pe ? rel + n : pe;
    if (lo >= hi) return ZO_OK;
    return wstore_load_f32(in, b, lo - po, hi - lo, src + (lo - rel));
}

static void wg_free(wstore *ws)
{
    wstore_free(inner_of(ws));
    free(ws);
}

static const wstore_ops wgather_ops = {
    .resident = wg_resident, .fetch = wg_fetch, .put_host = wg_put_host,
    .put_host_done = wg_put_host_done, .put_dev = wg_put_dev, .put_dev_done = wg_put_dev_done,
    .sync = wg_sync, .load = wg_load, .free = wg_free,
};

zo_status wgather_create(const offload_env *env, const offload_geom *g, wstore *inner, wstore **out)
{
    *out = NULL;
    wgather *w = calloc(1, sizeof *w);
    if (!w) {
        wstore_free(inner);
        return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    }
    w->inner = inner;
    zo_status st = wstore_init_base(&w->base, &wgather_ops, env, g, inner->tier);
    if (st != ZO_OK) {
        wstore_free(&w->base);
        return st;
    }
    w->base.part_only = 1;
    w->base.put_max = inner->put_max;
    *out = &w->base;
    return ZO_OK;
}
