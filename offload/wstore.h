/* The weight store layer (wstore.c, wgather.c): where the 16-bit weights of
 * every block live between uses, above data parallelism and the
 * accounting. One object per store, its tier chosen when it is created:
 *
 *   device   resident in device memory (ZeRO 1-2: every block padded, the
 *            optimizer's parts all-gathered as they complete)
 *   host     pinned host memory, streamed to a device slot before use
 *   nvme     one tensor per block in an NVMe store, read ahead into pinned
 *            buffers
 *   gather   (wgather.c, ZeRO-3) the rank's parts of every block in an
 *            inner store of one of the above, all-gathered on fetch
 *
 * Every block's weights carry a generation that changes whenever they do
 * (a put completed, a load): a copy made of them (a device slot) is current
 * while the generation it was made at is the block's. */
#ifndef ZO_OFFLOAD_WSTORE_H
#define ZO_OFFLOAD_WSTORE_H

#include "offload/dp.h" /* defines: offload_dp, offload_env, offload_geom */

typedef struct wstore wstore;

/* Two kinds of writes: `put` is the optimizer's (the new weights of the
 * elements this rank updates, in the optimizer's geometry: the rank's parts
 * with ZeRO 1-3; a replicated store all-gathers them), `load` anybody's
 * who has whole blocks on every rank (weights set, checkpoints loaded: the
 * store keeps what is its own, no collective). Fetch gives whole blocks.
 * Callers complete puts and loads through wstore_put_host_done,
 * wstore_put_dev_done and wstore_load_f32, which move the generations. */
typedef struct wstore_ops {
    /* Block b's weights in device memory when the store keeps them there
     * (the compute reads them in place), else NULL. */
    const void *(*resident)(wstore *ws, int b);
    /* Start copying block b's weights into device memory `dst` on the h2d
     * stream (streamed stores); the copy is ordered on h2d. */
    zo_status (*fetch)(wstore *ws, int b, void *dst);
    /* (optional) Elements [rel, rel + n) of block b alone into device
     * memory `dst`, on the h2d stream: a part of what fetch copies (the
     * stream layer's units inside a block: an MoE layer's dense part, each
     * routed expert). The host tier has it; NULL: whole blocks only. */
    zo_status (*fetch_range)(wstore *ws, int b, size_t rel, size_t n, void *dst);
    /* Host memory for new weights of elements [rel, rel + n) of block b (in
     * the dtype), valid until put_host_done of the same range, which hands
     * them to the store. n is at most put_max. */
    zo_status (*put_host)(wstore *ws, int b, size_t rel, size_t n, void **dst);
    zo_status (*put_host_done)(wstore *ws, int b, size_t rel, size_t n);
    /* (optional) New weights of elements [rel, rel + n) of block b (any n)
     * copied on the h2d stream straight from pinned host memory src, which
     * stays unchanged until sync_host: no staging copy (the device tier;
     * dpu's publication of its shadow). NULL: put_host's chunks. */
    zo_status (*put_pinned)(wstore *ws, int b, size_t rel, size_t n, const void *src);
    /* Device memory for all new weights of block b, written on stream s;
     * put_dev_done (on the same stream) hands them to the store. The
     * optimizer's element rel goes to element rel of it, or with
     * put_dev_runs (a part in segments) to offload_dp_part_at's place. */
    zo_status (*put_dev)(wstore *ws, int b, void **dst);
    zo_status (*put_dev_done)(wstore *ws, int b, gpu_stream_t s);
    /* Every put has reached the store: later fetches and compute see it.
     * Any thread (the optimizer's too); no collective. */
    zo_status (*sync)(wstore *ws);
    /* (optional, with puts_ordered) The host puts have reached the store;
     * the device puts are left to the streams that read them (use). */
    zo_status (*sync_host)(wstore *ws);
    /* The three below are the host thread's alone, called at the same point
     * of the schedule on every rank, so that every rank issues the same
     * collectives in the same order (the optimizer's thread issues none).
     * (optional) Block b's weights (-1: every block's) change in the round
     * of puts that starts now, before any of them is put: the gathering
     * store (ZeRO-3) moves its generations here, never with a put; the
     * replicated device store (ZeRO 1-2) opens its round. */
    void (*will_change)(wstore *ws, int b);
    /* (optional) Resident block b is about to be read on stream s: what the
     * ranks owe it is issued (ZeRO 1-2 with deferred gathers: the all-gather
     * of its new parts) and s waits for it. */
    zo_status (*use)(wstore *ws, int b, gpu_stream_t s);
    /* (optional) The round of puts is over (after sync): what the ranks do
     * together for it (ZeRO 1-2: the gathers not issued yet) is issued and
     * waited for. */
    zo_status (*round_end)(wstore *ws);
    /* Elements [rel, rel + n) of block b (whole-block coordinates) from
     * fp32, which every rank has. */
    zo_status (*load)(wstore *ws, int b, size_t rel, size_t n, const float *src);
    /* (optional) Block b's weights in pinned host memory when the store
     * keeps them there (the host tier), else NULL: the gathering store
     * reads a part in segments from it straight into its bucket. */
    const void *(*host)(wstore *ws, int b);
    /* (optional) Block b read into pinned host memory of the store's (the
     * NVMe tier: a read-ahead buffer), *src valid until the store's next
     * fetch or fetch_host: the gathering store reads a part in segments from
     * there when the store keeps none in memory (host NULL). */
    zo_status (*fetch_host)(wstore *ws, int b, const void **src);
    /* Block b's weights (numel[b] elements of the dtype) into host memory,
     * synchronously (the tier stores: the frozen base's reads). */
    zo_status (*get_host)(wstore *ws, int b, void *dst);
    void (*free)(wstore *ws);
} wstore_ops;

struct wstore {
    const wstore_ops *ops;
    const offload_env *env;
    const offload_geom *g;
    offload_tier tier;
    int resident;          /* resident() gives every block: nothing is fetched */
    int part_only;         /* keeps only the rank's part of each block (ZeRO-3): loads of the rest are dropped */
    int collective;        /* a fetch is a collective (ZeRO-3): every rank fetches the same blocks at
                              the same points of the schedule, decided from what the host thread knows */
    int round_gens;        /* generations move with will_change (and loads), not with each put */
    size_t put_max;        /* elements put_host takes at once */
    int put_dev_runs;      /* put_dev of a block in segments gives the whole block's element 0: the part's
                              runs are written in their places (ZeRO 1-2 with expert parallelism) */
    int puts_ordered;      /* a device put of block b is ordered before every later read of it on the
                              device by an event (use makes the reading stream wait for it): the host
                              need not wait for it (wstore_settle_host) */
    uint64_t *gen;         /* [nb] block b's generation (atomic: puts may come from the optimizer's thread) */
};

typedef struct wstore_config {
    offload_tier tier;
    int ring;              /* NVMe: pinned read-ahead buffers (the device slots' count) */
    int dev_puts;          /* new weights will come from the device (a device shard) */
    size_t chunk;          /* device tier: elements a host put stages at once */
    const char *nvme_dir;
    const char *name;      /* what it holds ("par", "frz"): NVMe file names, messages */
    /* ZeRO 1-2 (device tier, env->dp partitioned): the puts are the rank's
     * parts; every block is kept whole, padded, and all-gathered once its
     * part is complete */
    int gathered;
    /* ZeRO 1-2: the puts come from the optimizer's thread (schedules overlap
     * and dpu): a block's all-gather is left to the host thread, issued when
     * the block is used (ops->use) or the round ends (ops->round_end) */
    int deferred;
} wstore_config;

/* The host tier's array of every block's weights, in its geometry's flat
 * order (the dtype's elements); NULL for another tier. The optimizer keeps
 * its bf16 weights there when it has no fp32 master (offload_config.master). */
void *wstore_host_array(wstore *ws);
/* The device tier's array of every block's weights when it is in its
 * geometry's flat order (whole blocks, not padded: no ZeRO 1-2 parts); NULL
 * otherwise. The GPU optimizer share updates its bf16 weights there in
 * place when it has no fp32 master and holds the whole optimizer. */
void *wstore_dev_array(wstore *ws);

/* The tier's store of the blocks of g. */
zo_status wstore_create(const offload_env *env, const offload_geom *g, const wstore_config *c,
                        wstore **out);
void wstore_free(wstore *ws);
/* The generation of block b's weights. */
uint64_t wstore_gen(const wstore *ws, int b);
/* A put completed (ws->ops->put_host_done, put_dev_done): block b changed. */
zo_status wstore_put_host_done(wstore *ws, int b, size_t rel, size_t n);
zo_status wstore_put_dev_done(wstore *ws, int b, gpu_stream_t s);
/* Load elements [rel, rel + n) of block b's weights (whole-block
 * coordinates), given in fp32: ws->ops->load. */
zo_status wstore_load_f32(wstore *ws, int b, size_t rel, size_t n, const float *src);
/* Put elements [rel, rel + n) of block b's weights given as the store's own
 * elements (bytes copied as they are), chunk by chunk. */
zo_status wstore_put_raw(wstore *ws, int b, size_t rel, size_t n, const void *src);
/* Every block of host store `from` (the geometry of `to`'s puts) put into
 * `to`, synced (the caller announced the round: will_change). */
zo_status wstore_publish(wstore *from, wstore *to);
/* The host thread's calls (ops->will_change, use, round_end; nothing where
 * the store has none). */
void wstore_will_change(wstore *ws, int b);
zo_status wstore_use(wstore *ws, int b, gpu_stream_t s);
/* Every put arrived and the round over (sync, then round_end). */
zo_status wstore_settle(wstore *ws);
/* The same, leaving the device puts of a store that orders them
 * (puts_ordered) to the streams that read them: the serial step's end,
 * whose next reads are the compute's (wstore_use). Whatever reads or
 * writes the store from outside the step settles it first. */
zo_status wstore_settle_host(wstore *ws);
/* What every store starts as: its table, environment, geometry and tier,
 * generations 0 (wgather.c). */
zo_status wstore_init_base(wstore *ws, const wstore_ops *ops, const offload_env *env, const offload_geom *g,
                           offload_tier tier);
/* Block b changed (wgather.c: announced by the host thread). */
void wstore_changed(wstore *ws, int b);

/* ---- wgather.c: ZeRO-3 ---------------------------------------------------------------- */

/* The gathering store over `inner` (a store of the rank's parts of
 * partition *part: offload_part_geom), owning both, whatever happens (a
 * partition that owns its arrays is freed with it): fetch gives whole
 * blocks of g, all-gathered. */
zo_status wgather_create(const offload_env *env, const offload_geom *g, wstore *inner, const offload_part *part,
                         wstore **out);

#endif
