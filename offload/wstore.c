/* Weight stores: where the 16-bit weights of every block live between uses.
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
 * ZeRO 1-2 (env->dp partitioned): the device store holds every block,
 * each padded to a multiple of the rank count; the optimizer puts only the
 * rank's part of each block, and a block whose part is complete is
 * all-gathered in place, in block order (the same order on every rank, a
 * block of which this rank holds nothing included). ZeRO 3: wgather.c. */
#include "offload/offload_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef ZO_OFFLOAD_HAVE_NVME
#include "nvme/nvme_engine.h" /* defines: nvme_engine_t */
#include "nvme/nvme_store.h"  /* defines: nvme_store_t */
#endif

typedef struct wstore_impl {
    wstore base;
    const size_t *boff;        /* [nb] block offsets in the store: the model's, or padded */
    size_t *boff_own;
    /* ZeRO 1-2 (device tier): the round of puts of a step */
    const offload_dp *dp;      /* NULL: puts are whole-block coordinates */
    size_t *got;               /* [nb] elements of the rank's part put this round */
    int next_ag;               /* the next block to all-gather */
    int round;                 /* a put since the last sync: the step's round of puts */
    gpu_stream_t dev_s;        /* the stream of this round's device puts, or NULL */
    gpu_event_t ag_join;       /* dev_s: its puts so far (the all-gather's input) */
    /* device tier */
    void *dev;                 /* device [n] dtype */
    void *stage[2];            /* pinned [put_max] dtype: host puts on their way in */
    gpu_event_t stage_ev[2];   /* h2d: the chunk's copy is done */
    int stage_pending[2];
    int stage_cur;
    /* host tier */
    void *host;                /* pinned [n] dtype */
    /* new weights from the device (host and nvme tiers) */
    void *dev_stage;           /* device [slot_bytes] */
    gpu_event_t dev_ev;        /* the stream of the last device put: its copy out is done */
    int dev_pending;
    /* nvme tier */
    void *asm_buf;             /* pinned [slot_bytes]: a block on its way to NVMe */
    int asm_block;             /* the block being assembled, -1 none */
    size_t asm_done;           /* its elements written so far */
    int n_ring;
    void **ring;               /* [n_ring] pinned [slot_bytes]: read-ahead */
    gpu_event_t *ring_ev;      /* h2d: the buffer's copy to the device is done */
    int *ring_used;
    int ring_next;
#ifdef ZO_OFFLOAD_HAVE_NVME
    nvme_engine_t *engine;
    nvme_store_t *store;
    int *ids;                  /* [nb] tensor ids */
    int counted;               /* the store's bytes are counted in the NVMe tier */
    /* the host thread fetches while the optimizer's thread writes (schedules
     * other than serial): one ring, one caller at a time */
    pthread_mutex_t io_mu;
    int io_mu_init;
#endif
} wstore_impl;

static wstore_impl *impl(wstore *ws) { return (wstore_impl *)ws; }

static size_t block_bytes(const wstore *ws, int b) { return ws->g->numel[b] * ws->g->es; }

static char *at(const wstore *ws, void *base, int b, size_t rel)
{
    return (char *)base + (((const wstore_impl *)ws)->boff[b] + rel) * ws->g->es;
}

/* Where a put of the optimizer's element `rel` of block b goes: its part's
 * place in the whole block. */
static size_t put_pos(const wstore *ws, int b, size_t rel)
{
    const wstore_impl *w = (const wstore_impl *)ws;
    return w->dp ? w->dp->part_off[b] + rel : rel;
}

/* ---- the device tier --------------------------------------------------------------------- */

static const void *dev_resident(wstore *ws, int b) { return at(ws, impl(ws)->dev, b, 0); }

static zo_status dev_fetch(wstore *ws, int b, void *dst)
{
    (void)ws, (void)b, (void)dst;
    return zo_error(ZO_ERR_INTERNAL, "offload: resident weights are not fetched");
}

static zo_status dev_put_host(wstore *ws, int b, size_t rel, size_t n, void **dst)
{
    wstore_impl *w = impl(ws);
    (void)b, (void)rel;
    if (n > ws->put_max)
        return zo_error(ZO_ERR_INTERNAL, "offload: a put of %zu elements (at most %zu)", n, ws->put_max);
    int k = w->stage_cur ^= 1;
    if (w->stage_pending[k]) {
        zo_status st = offload_timed_wait(ws->env, w->stage_ev[k], OFFLOAD_TIME_OPTIMIZER);
        w->stage_pending[k] = 0;
        if (st != ZO_OK) return st;
    }
    *dst = w->stage[k];
    return ZO_OK;
}

/* The staged chunk into elements [pos, pos + n) of block b. */
static zo_status dev_copy_in(wstore *ws, int b, size_t pos, size_t n)
{
    wstore_impl *w = impl(ws);
    const offload_env *env = ws->env;
    int k = w->stage_cur;
    size_t bytes = n * ws->g->es;
    zo_status st;
    if (!bytes) return ZO_OK;
    if ((st = gpu_memcpy_async(env->h2d, at(ws, w->dev, b, pos), w->stage[k], bytes,
                               GPU_COPY_HOST_TO_DEVICE)) != ZO_OK ||
        (st = gpu_event_record(w->stage_ev[k], env->h2d)) != ZO_OK)
        return st;
    w->stage_pending[k] = 1;
    offload_add_bytes(env->acct, OFFLOAD_BYTES_H2D, bytes);
    return ZO_OK;
}

/* ZeRO 1-2: all-gather, in block order, every block whose part is complete
 * this round (all of them when `all`: the end of the round). A block's
 * input is the rank's part, written by copies on h2d and device puts on
 * dev_s: h2d joins dev_s, and the all-gather starts after h2d. */
static zo_status dev_gather_ready(wstore *ws, int all)
{
    wstore_impl *w = impl(ws);
    const offload_env *env = ws->env;
    const offload_dp *dp = w->dp;
    zo_status st;
    int joined = 0;
    while (w->next_ag < ws->g->nb) {
        int b = w->next_ag;
        if (w->got[b] < dp->part_n[b] && !all) break;
        if (w->got[b] != dp->part_n[b])
            return zo_error(ZO_ERR_INTERNAL, "offload: new weights of block %d incomplete (%zu of %zu)",
                            b, w->got[b], dp->part_n[b]);
        if (!joined) {
            if (w->dev_s && ((st = gpu_event_record(w->ag_join, w->dev_s)) != ZO_OK ||
                             (st = gpu_stream_wait_event(env->h2d, w->ag_join)) != ZO_OK))
                return st;
            if ((st = gpu_event_record(dp->ev_in, env->h2d)) != ZO_OK) return st;
            joined = 1;
        }
        if (ws->g->numel[b] &&
            (st = offload_dp_block(env->dp, DP_ALL_GATHER, b, ws->g->numel[b], at(ws, w->dev, b, 0),
                                        ws->g->dtype, dp->ev_in, NULL)) != ZO_OK)
            return st;
        w->got[b] = 0;
        w->next_ag++;
    }
    return ZO_OK;
}

/* The optimizer put n elements of block b's part: counted, and the blocks
 * complete so far gathered. */
static zo_status dev_part_done(wstore *ws, int b, size_t n)
{
    wstore_impl *w = impl(ws);
    if (!w->dp) return ZO_OK;
    w->got[b] += n;
    w->round = 1;
    return dev_gather_ready(ws, 0);
}

static zo_status dev_put_host_done(wstore *ws, int b, size_t rel, size_t n)
{
    zo_status st = dev_copy_in(ws, b, put_pos(ws, b, rel), n);
    if (st != ZO_OK) return st;
    return dev_part_done(ws, b, n);
}

static zo_status dev_put_dev(wstore *ws, int b, void **dst)
{
    *dst = at(ws, impl(ws)->dev, b, put_pos(ws, b, 0));
    return ZO_OK;
}

static zo_status dev_put_dev_done(wstore *ws, int b, gpu_stream_t s)
{
    wstore_impl *w = impl(ws);
    /* in place: the compute waits for the stream's work */
    zo_status st = gpu_event_record(w->dev_ev, s);
    if (st != ZO_OK) return st;
    w->dev_pending = 1;
    w->dev_s = s;
    return dev_part_done(ws, b, w->dp ? w->dp->part_n[b] : 0);
}

/* A load: whole-block coordinates, every rank has them: no collective. */
static zo_status dev_load(wstore *ws, int b, size_t rel, size_t n, const float *src)
{
    zo_status st;
    for (size_t done = 0; done < n; done += ws->put_max) {
        size_t k = n - done < ws->put_max ? n - done : ws->put_max;
        void *dst;
        if ((st = dev_put_host(ws, b, rel + done, k, &dst)) != ZO_OK) return st;
        offload_to_dtype(ws->g, dst, src + done, k);
        if ((st = dev_copy_in(ws, b, rel + done, k)) != ZO_OK) return st;
    }
    return ZO_OK;
}

static zo_status dev_get_host(wstore *ws, int b, void *dst)
{
    const offload_env *env = ws->env;
    wstore_impl *w = impl(ws);
    size_t bytes = block_bytes(ws, b);
    zo_status st;
    if (!bytes) return ZO_OK;
    if ((st = gpu_memcpy_async(env->d2h, dst, at(ws, w->dev, b, 0), bytes, GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
        (st = gpu_event_record(w->dev_ev, env->d2h)) != ZO_OK)
        return st;
    return gpu_event_synchronize(w->dev_ev);
}

/* The device and host tiers' puts from the device and the device tier's
 * chunks have all arrived (ZeRO 1-2: and every block is gathered). */
static zo_status common_sync(wstore *ws)
{
    wstore_impl *w = impl(ws);
    zo_status st = ZO_OK;
    if (w->dp && w->round) {
        /* every rank puts part of the model each step (offload_dp_create
         * refuses a rank with nothing), so every rank ends the round */
        st = dev_gather_ready(ws, 1);
        zo_status sw = offload_dp_wait(ws->env->dp);
        if (st == ZO_OK) st = sw;
        memset(w->got, 0, (size_t)ws->g->nb * sizeof *w->got);
        w->next_ag = 0;
        w->dev_s = NULL;
        w->round = 0;
    }
    for (int k = 0; k < 2; k++) {
        if (!w->stage_pending[k]) continue;
        zo_status sk = offload_timed_wait(ws->env, w->stage_ev[k], OFFLOAD_TIME_OPTIMIZER);
        w->stage_pending[k] = 0;
        if (st == ZO_OK) st = sk;
    }
    if (w->dev_pending) {
        zo_status sk = offload_timed_wait(ws->env, w->dev_ev, OFFLOAD_TIME_OPTIMIZER);
        w->dev_pending = 0;
        if (st == ZO_OK) st = sk;
    }
    return st;
}

/* ---- the host tier ------------------------------------------------------------------------ */

static const void *none_resident(wstore *ws, int b)
{
    (void)ws, (void)b;
    return NULL;
}

static zo_status host_fetch(wstore *ws, int b, void *dst)
{
    const offload_env *env = ws->env;
    size_t bytes = block_bytes(ws, b);
    if (!bytes) return ZO_OK;
    zo_status st = gpu_memcpy_async(env->h2d, dst, at(ws, impl(ws)->host, b, 0), bytes,
                                    GPU_COPY_HOST_TO_DEVICE);
    if (st == ZO_OK) offload_add_bytes(env->acct, OFFLOAD_BYTES_H2D, bytes);
    return st;
}

static zo_status host_get_host(wstore *ws, int b, void *dst)
{
    memcpy(dst, at(ws, impl(ws)->host, b, 0), block_bytes(ws, b));
    return ZO_OK;
}

static zo_status host_put_host(wstore *ws, int b, size_t rel, size_t n, void **dst)
{
    (void)n;
    *dst = at(ws, impl(ws)->host, b, rel);
    return ZO_OK;
}

static zo_status nothing_done(wstore *ws, int b, size_t rel, size_t n)
{
    (void)ws, (void)b, (void)rel, (void)n;
    return ZO_OK;
}

static zo_status staged_put_dev(wstore *ws, int b, void **dst)
{
    (void)b;
    if (!impl(ws)->dev_stage)
        return zo_error(ZO_ERR_INTERNAL, "offload: weights from the device without a staging block");
    *dst = impl(ws)->dev_stage;
    return ZO_OK;
}

static zo_status host_put_dev_done(wstore *ws, int b, gpu_stream_t s)
{
    wstore_impl *w = impl(ws);
    size_t bytes = block_bytes(ws, b);
    zo_status st;
    if (!bytes) return ZO_OK;
    /* the next put into the staging block is ordered after this copy on s */
    if ((st = gpu_memcpy_async(s, at(ws, w->host, b, 0), w->dev_stage, bytes,
                               GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
        (st = gpu_event_record(w->dev_ev, s)) != ZO_OK)
        return st;
    w->dev_pending = 1;
    offload_add_bytes(ws->env->acct, OFFLOAD_BYTES_D2H, bytes);
    return ZO_OK;
}

/* ---- the nvme tier ------------------------------------------------------------------------- */

#ifdef ZO_OFFLOAD_HAVE_NVME

static zo_status nvme_write_block(wstore *ws, int b)
{
    wstore_impl *w = impl(ws);
    double t0 = zo_now();
    pthread_mutex_lock(&w->io_mu);
    zo_status st = nvme_store_write(w->store, w->ids[b], w->asm_buf);
    pthread_mutex_unlock(&w->io_mu);
    offload_add_time(ws->env->acct, OFFLOAD_TIME_DISK, zo_now() - t0);
    if (st != ZO_OK) return zo_error_wrap(st, "offload: weights of block %d to NVMe", b);
    offload_add_bytes(ws->env->acct, OFFLOAD_BYTES_DISK_WRITTEN, block_bytes(ws, b));
    return ZO_OK;
}

static zo_status nvme_fetch(wstore *ws, int b, void *dst)
{
    wstore_impl *w = impl(ws);
    const offload_env *env = ws->env;
    size_t bytes = block_bytes(ws, b);
    zo_status st;
    if (!bytes) return ZO_OK;
    /* a read-ahead buffer whose last copy to the device is done */
    int r = w->ring_next;
    w->ring_next = (r + 1) % w->n_ring;
    if (w->ring_used[r] &&
        (st = offload_timed_wait(env, w->ring_ev[r], OFFLOAD_TIME_WEIGHTS)) != ZO_OK)
        return st;
    double t0 = zo_now();
    pthread_mutex_lock(&w->io_mu);
    st = nvme_store_read(w->store, w->ids[b], w->ring[r]);
    pthread_mutex_unlock(&w->io_mu);
    offload_add_time(env->acct, OFFLOAD_TIME_DISK, zo_now() - t0);
    if (st != ZO_OK) return zo_error_wrap(st, "offload: weights of block %d from NVMe", b);
    offload_add_bytes(env->acct, OFFLOAD_BYTES_DISK_READ, bytes);
    if ((st = gpu_memcpy_async(env->h2d, dst, w->ring[r], bytes, GPU_COPY_HOST_TO_DEVICE)) != ZO_OK ||
        (st = gpu_event_record(w->ring_ev[r], env->h2d)) != ZO_OK)
        return st;
    w->ring_used[r] = 1;
    offload_add_bytes(env->acct, OFFLOAD_BYTES_H2D, bytes);
    return ZO_OK;
}

static zo_status nvme_get_host(wstore *ws, int b, void *dst)
{
    wstore_impl *w = impl(ws);
    if (!block_bytes(ws, b)) return ZO_OK;
    double t0 = zo_now();
    pthread_mutex_lock(&w->io_mu);
    zo_status st = nvme_store_read(w->store, w->ids[b], dst);
    pthread_mutex_unlock(&w->io_mu);
    offload_add_time(ws->env->acct, OFFLOAD_TIME_DISK, zo_now() - t0);
    if (st != ZO_OK) return zo_error_wrap(st, "offload: weights of block %d from NVMe", b);
    offload_add_bytes(ws->env->acct, OFFLOAD_BYTES_DISK_READ, block_bytes(ws, b));
    return ZO_OK;
}

static zo_status nvme_put_host(wstore *ws, int b, size_t rel, size_t n, void **dst)
{
    wstore_impl *w = impl(ws);
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
    wstore_impl *w = impl(ws);
    (void)rel;
    w->asm_done += n;
    if (w->asm_done < ws->g->numel[b]) return ZO_OK;
    w->asm_block = -1;
    return nvme_write_block(ws, b);
}

static zo_status nvme_put_dev_done(wstore *ws, int b, gpu_stream_t s)
{
    wstore_impl *w = impl(ws);
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
    wstore_impl *w = impl(ws);
    if (w->asm_block >= 0) {
        int b = w->asm_block;
        w->asm_block = -1;
        return zo_error(ZO_ERR_INTERNAL, "offload: new weights of block %d left incomplete (%zu of %zu)",
                        b, w->asm_done, ws->g->numel[b]);
    }
    return ZO_OK;
}

static zo_status nvme_open(wstore *ws, const char *dir, const char *name)
{
    wstore_impl *w = impl(ws);
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

static void nvme_close(wstore *ws)
{
    wstore_impl *w = impl(ws);
    if (w->counted) offload_count(ws->env->acct, OFFLOAD_NVME, -(int64_t)nvme_store_footprint(w->store));
    if (w->store) nvme_store_free(w->store);
    if (w->engine) nvme_engine_free(w->engine);
    free(w->ids);
    if (w->io_mu_init) pthread_mutex_destroy(&w->io_mu);
}

#else /* no nvme module: the configuration is refused at init */

static zo_status nvme_open(wstore *ws, const char *dir, const char *name)
{
    (void)ws, (void)dir, (void)name;
    return zo_error(ZO_ERR_UNSUPPORTED, "offload: weights on NVMe need the nvme module (liburing, xxHash)");
}
static void nvme_close(wstore *ws) { (void)ws; }
#define nvme_fetch dev_fetch
#define nvme_put_host host_put_host
#define nvme_put_host_done nothing_done
#define nvme_put_dev_done host_put_dev_done
#define nvme_sync common_sync
#define nvme_get_host host_get_host

#endif

/* ---- life cycle ------------------------------------------------------------------------------- */

static void wstore_destroy(wstore *ws)
{
    wstore_impl *w = impl(ws);
    const offload_env *env = ws->env;
    size_t chunk_bytes = ws->put_max * ws->g->es;
    gpu_mem_free(env->dev, w->dev);
    for (int k = 0; k < 2; k++) {
        offload_host_free(env, w->stage[k], chunk_bytes, 1);
        if (w->stage_ev[k]) gpu_event_destroy(w->stage_ev[k]);
    }
    offload_host_free(env, w->host, ws->g->n * ws->g->es, 1);
    gpu_mem_free(env->dev, w->dev_stage);
    if (w->dev_ev) gpu_event_destroy(w->dev_ev);
    offload_host_free(env, w->asm_buf, ws->g->slot_bytes, 1);
    for (int i = 0; w->ring && i < w->n_ring; i++) {
        offload_host_free(env, w->ring[i], ws->g->slot_bytes, 1);
        if (w->ring_ev[i]) gpu_event_destroy(w->ring_ev[i]);
    }
    free(w->ring);
    free(w->ring_ev);
    free(w->ring_used);
    if (ws->tier == OFFLOAD_NVME) nvme_close(ws);
    if (w->ag_join) gpu_event_destroy(w->ag_join);
    free(w->got);
    free(w->boff_own);
    free(w);
}

static const wstore_ops dev_ops = {
    .resident = dev_resident, .fetch = dev_fetch, .put_host = dev_put_host,
    .put_host_done = dev_put_host_done, .put_dev = dev_put_dev, .put_dev_done = dev_put_dev_done,
    .sync = common_sync, .load = dev_load, .get_host = dev_get_host, .free = wstore_destroy,
};
static const wstore_ops host_ops = {
    .resident = none_resident, .fetch = host_fetch, .put_host = host_put_host,
    .put_host_done = nothing_done, .put_dev = staged_put_dev, .put_dev_done = host_put_dev_done,
    .sync = common_sync, .load = wstore_load_by_puts, .get_host = host_get_host, .free = wstore_destroy,
};
static const wstore_ops nvme_ops = {
    .resident = none_resident, .fetch = nvme_fetch, .put_host = nvme_put_host,
    .put_host_done = nvme_put_host_done, .put_dev = staged_put_dev, .put_dev_done = nvme_put_dev_done,
    .sync = nvme_sync, .load = wstore_load_by_puts, .get_host = nvme_get_host, .free = wstore_destroy,
};

/* ZeRO 1-2: every block padded to a multiple of the rank count (an
 * all-gather in place needs it), the puts counted per block. */
static zo_status dev_partition(wstore *ws, size_t *elems)
{
    wstore_impl *w = impl(ws);
    const offload_dp *dp = ws->env->dp;
    const offload_geom *g = ws->g;
    w->dp = dp;
    w->boff_own = calloc((size_t)g->nb, sizeof(size_t));
    w->got = calloc((size_t)g->nb, sizeof(size_t));
    if (!w->boff_own || !w->got) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    size_t o = 0;
    for (int b = 0; b < g->nb; b++) {
        w->boff_own[b] = o;
        o += dp->pad[b];
    }
    w->boff = w->boff_own;
    *elems = o;
    return gpu_event_create(ws->env->dev, &w->ag_join);
}

static zo_status create_dev(wstore *ws, const wstore_config *c)
{
    wstore_impl *w = impl(ws);
    const offload_env *env = ws->env;
    size_t elems = ws->g->n;
    zo_status st;
    if (env->dp && offload_dp_partitioned(env->dp) && !c->plain && (st = dev_partition(ws, &elems)) != ZO_OK)
        return st;
    size_t bytes = elems * ws->g->es;
    if ((st = gpu_mem_alloc(env->dev, bytes, &w->dev)) != ZO_OK)
        return zo_error_wrap(st, "offload_init: resident weights (%zu bytes) on the device", bytes);
    ws->put_max = c->chunk ? c->chunk : 1;
    if (ws->put_max > ws->g->largest && ws->g->largest) ws->put_max = ws->g->largest;
    for (int k = 0; k < 2; k++) {
        if ((st = offload_host_alloc(env, ws->put_max * ws->g->es, 1, &w->stage[k])) != ZO_OK)
            return zo_error_wrap(st, "offload_init: pinned staging of new weights");
        if ((st = gpu_event_create(env->dev, &w->stage_ev[k])) != ZO_OK) return st;
    }
    return ZO_OK;
}

static zo_status create_host(wstore *ws)
{
    wstore_impl *w = impl(ws);
    size_t bytes = ws->g->n * ws->g->es;
    zo_status st = offload_host_alloc(ws->env, bytes, 1, &w->host);
    if (st != ZO_OK) return zo_error_wrap(st, "offload_init: weights in pinned host memory");
    if (bytes) memset(w->host, 0, bytes);
    ws->put_max = ws->g->largest;
    return ZO_OK;
}

static zo_status create_nvme(wstore *ws, const wstore_config *c)
{
    wstore_impl *w = impl(ws);
    const offload_env *env = ws->env;
    size_t sb = ws->g->slot_bytes;
    zo_status st;
    if ((st = nvme_open(ws, c->nvme_dir, c->name ? c->name : "par")) != ZO_OK) return st;
    ws->put_max = ws->g->largest;
    w->asm_block = -1;
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
    return ZO_OK;
}

zo_status wstore_create(const offload_env *env, const offload_geom *g, const wstore_config *c,
                        wstore **out)
{
    *out = NULL;
    wstore_impl *w = calloc(1, sizeof *w);
    if (!w) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    wstore *ws = &w->base;
    ws->env = env;
    ws->g = g;
    ws->tier = c->tier;
    w->boff = g->off;
    zo_status st;
    if (env->dp && env->dp->stage >= 3 && !c->plain) {
        /* ZeRO-3: the tier's store of the rank's parts, gathered on fetch */
        wstore_config ic = *c;
        ic.plain = 1;
        wstore *inner;
        free(w);
        if ((st = wstore_create(env, c->part_geom, &ic, &inner)) != ZO_OK) return st;
        return wgather_create(env, g, inner, out);
    }
    switch (c->tier) {
    case OFFLOAD_DEVICE:
        ws->ops = &dev_ops;
        ws->resident = 1;
        st = create_dev(ws, c);
        break;
    case OFFLOAD_CPU:
        ws->ops = &host_ops;
        st = create_host(ws);
        break;
    default:
        ws->ops = &nvme_ops;
        st = create_nvme(ws, c);
        break;
    }
    if (st == ZO_OK && (st = gpu_event_create(env->dev, &w->dev_ev)) != ZO_OK) goto out_free;
    if (st == ZO_OK && c->dev_puts && c->tier != OFFLOAD_DEVICE &&
        (st = gpu_mem_alloc(env->dev, g->slot_bytes, &w->dev_stage)) != ZO_OK)
        st = zo_error_wrap(st, "offload_init: device staging of new weights (%zu bytes)", g->slot_bytes);
    if (st != ZO_OK) goto out_free;
    *out = ws;
    return ZO_OK;
out_free:
    wstore_destroy(ws);
    return st;
}

void wstore_free(wstore *ws)
{
    if (ws) ws->ops->free(ws);
}

zo_status wstore_load_f32(wstore *ws, int b, size_t rel, size_t n, const float *src)
{
    return ws->ops->load(ws, b, rel, n, src);
}

/* Put [rel, rel + n) of block b chunk by chunk, each chunk converted from
 * fp32 or copied as it is from element `done` of the source. */
static zo_status put_chunks(wstore *ws, int b, size_t rel, size_t n, const void *src, int f32)
{
    zo_status st;
    size_t es = ws->g->es;
    for (size_t done = 0; done < n; done += ws->put_max) {
        size_t k = n - done < ws->put_max ? n - done : ws->put_max;
        void *dst;
        if ((st = ws->ops->put_host(ws, b, rel + done, k, &dst)) != ZO_OK) return st;
        if (f32) offload_to_dtype(ws->g, dst, (const float *)src + done, k);
        else memcpy(dst, (const char *)src + done * es, k * es);
        if ((st = ws->ops->put_host_done(ws, b, rel + done, k)) != ZO_OK) return st;
    }
    return ZO_OK;
}

zo_status wstore_load_by_puts(wstore *ws, int b, size_t rel, size_t n, const float *src)
{
    return put_chunks(ws, b, rel, n, src, 1);
}

zo_status wstore_put_raw(wstore *ws, int b, size_t rel, size_t n, const void *src)
{
    return put_chunks(ws, b, rel, n, src, 0);
}

zo_status wstore_publish(wstore *from, wstore *to)
{
    wstore_impl *f = impl(from);
    zo_status st;
    if (from->tier != OFFLOAD_CPU || !f->host)
        return zo_error(ZO_ERR_INTERNAL, "offload: weights published from a store not in host memory");
    for (int b = 0; b < to->g->nb; b++)
        if ((st = wstore_put_raw(to, b, 0, to->g->numel[b], at(from, f->host, b, 0))) != ZO_OK) return st;
    return to->ops->sync(to);
}
