/* The optimizer-state layer (ostate.c), above data parallelism and the
 * accounting: the fp32 master weights and Adam moments of the optimizer's
 * geometry (the rank's parts of every block with ZeRO 1-3, the model with
 * one rank or ZeRO 0), in shards of the flat index,
 *
 *   host     [0, n_cpu)          three arrays in host memory
 *   nvme     [n_cpu, dev_first)  sub-groups in an NVMe store, pipelined
 *   device   [dev_first, n)      whole blocks at the end, on the device
 *
 * and the gradient sums they feed: each shard hands out where its blocks'
 * gradients are summed over a step's micro-batches, a host range (the host
 * and NVMe shards share one fp32 array: a block may straddle them) or a
 * device buffer (the device shard's). Where the shards are cut is chosen
 * once, in ostate_create; nothing above asks it. */
#ifndef ZO_OFFLOAD_OSTATE_H
#define ZO_OFFLOAD_OSTATE_H

#include "cpu_adam/cpu_adam.h" /* defines: adam_state_kind */
#include "offload/dp.h"        /* defines: offload_dp, offload_env, offload_geom */

/* The step, as the shards call it. */
typedef struct oshard_update {
    /* host state of flat [first, first + n): master P, moments M and V */
    zo_status (*host)(void *ctx, size_t first, size_t n, float *P, float *M, float *V);
    /* (optional) host state of flat [first, first + n) with m and v
     * encoded: a whole chunk, S its state buffer (cpu_adam's adam_state
     * layout of `kind` over the n elements), P its fp32 master; sm, sv fp32
     * scratch of at least one 8-bit block. Updated in place without
     * decoding the chunk, the same bits as `host` on the decoded moments
     * with the chunk coded again after it; *done 0 when it takes nothing
     * (then nothing is touched: the shard decodes, calls `host`, codes).
     * NULL: always that. */
    zo_status (*host_state)(void *ctx, size_t first, size_t n, float *P, adam_state_kind kind, void *S, float *sm,
                            float *sv, int *done);
    /* device state of block b: P, the moments (fp32 M and V; or, with
     * m and v encoded, S: the block's state buffer, the layout of
     * cpu_adam's adam_state over the block's elements) and the fp32
     * gradient sum G, on `s`; without an fp32 master (P NULL) the bf16
     * weights W and (Kahan) their bf16 compensation C */
    zo_status (*dev)(void *ctx, int b, float *P, float *M, float *V, void *S, float *G, uint16_t *W, uint16_t *C,
                     gpu_stream_t s);
    void *ctx;
} oshard_update;

/* Where block b's gradient is summed (fp32), in host memory or in device
 * memory: one of `host` and `dev` is set. The sum is the whole block,
 * padded, when it is reduce-scattered at the step (ZeRO 1), else the
 * optimizer's part of it; `part` is where the optimizer reads its part. */
typedef struct oshard_sum {
    float *host;
    float *dev;
    float *part;
} oshard_sum;

/* The optimizer's state: the shards in flat order and the gradient sums. */
typedef struct ostate ostate;

typedef struct ostate_config {
    double frac[OFFLOAD_TIERS]; /* of the elements, per tier (the device's rounded to whole blocks) */
    size_t sub_group;      /* elements per update call (host) / per NVMe group */
    int swap_buffers;      /* NVMe pipeline buffers */
    int exact_stats;       /* device beside a host or NVMe share: a pinned block for exact clipping
                              statistics */
    const char *nvme_dir;
    zo_plan_opt_state state; /* m and v in every shard: fp32, bf16, 8-bit */
    zo_plan_master master;   /* an fp32 master, or bf16 weights (+ a bf16 Kahan compensation): host and
                              * device (with m and v encoded) */
    /* without an fp32 master: the host shard's weights are kept in place in
     * a store of the weights in host memory over the optimizer's geometry
     * (bf16, flat from element 0: master_at, or NULL until ostate_master_at
     * gives it, before any state is written), else in a bf16 copy */
    int master_in_place;
    uint16_t *master_at;
    /* ... and the device share's, in place in the device store's array
     * (bf16, flat from element 0) when it is given, else a bf16 copy */
    uint16_t *dev_master_at;
} ostate_config;

/* The shards of og (the optimizer's geometry over the model's blocks g;
 * env->dp partitions it or not) and their sums. */
zo_status ostate_create(const offload_env *env, const offload_geom *g, const offload_geom *og,
                        const ostate_config *c, ostate **out);
void ostate_free(ostate *os);

/* Over every shard in flat order: elements [first, first + n) anywhere in
 * the index. */
zo_status ostate_read(ostate *os, size_t first, size_t n, float *P, float *M, float *V);
zo_status ostate_write(ostate *os, size_t first, size_t n, const float *P, const float *M, const float *V);
zo_status ostate_sync(ostate *os);
/* The same, but the enqueued (device) shard's update is not waited for:
 * the device orders what reads its results after it (the gradient sums'
 * zeroing, or with one rank their first addition, waits for its event; the
 * next statistics and update run on its stream; the weights it put are
 * waited for where they are used: wstore_settle_host). ostate_sync_enqueued waits for it alone, before
 * anything from outside the step. */
zo_status ostate_sync_host(ostate *os);
zo_status ostate_sync_enqueued(ostate *os);
/* Block b's master weights, the whole block (numel elements; the ranks'
 * parts gathered when partitioned), into host memory. */
zo_status ostate_get_block(ostate *os, int b, size_t numel, float *w);
/* The store the host shard's bf16 weights are kept in (master_in_place). */
void ostate_master_at(ostate *os, uint16_t *w);
/* Bytes of state (master, m and v in their encoding) per tier. */
void ostate_bytes(const ostate *os, uint64_t bytes[OFFLOAD_TIERS]);

/* ---- the encoded state as it is (checkpoints: an exact resume) --------------------------
 *
 * What the fp32 values of ostate_read do not say exactly: each shard's
 * 8-bit or bf16 m and v as it holds them (8-bit blocks re-coded from their
 * decoded values take another absmax when a block's largest m is negative),
 * and Kahan's bf16 compensation. Shard i's image is `bytes` bytes, named by
 * `key`: its tier, range, encoding and how it cuts it into chunks (an
 * image fits only a shard of the same key); 0 bytes when it holds nothing
 * of the kind (fp32 state, a master). */
int ostate_images(const ostate *os);
void ostate_image_key(const ostate *os, int i, char *key, size_t len, uint64_t *bytes);
/* Bytes [off, off + len) of shard i's image into buf, or (put) from buf:
 * after ostate_write of the same range's fp32 values, which it refines. */
zo_status ostate_image_io(ostate *os, int i, uint64_t off, size_t len, void *buf, int put);

/* ---- the step ---------------------------------------------------------------------------- */

/* The enqueued shards' update, started (ostate_sync waits for it). */
zo_status ostate_step_enqueued(ostate *os, const oshard_update *u);
/* Every other shard's, in flat order, on this thread. */
zo_status ostate_step_host(ostate *os, const oshard_update *u);
/* Block b's range on the shards the host updates. */
zo_status ostate_step_block(ostate *os, int b, const oshard_update *u);

/* ---- the gradient sums ------------------------------------------------------------------- */

/* Where block b's gradient is summed, as the shard holding it says. */
void ostate_grad_sum(const ostate *os, int b, oshard_sum *out);
/* The host sums, flat (offload_grad), and where the device share starts in
 * the optimizer's flat index (its n when there is none): with one rank the
 * sums are its elements [0, *n) in order. */
float *ostate_host_sums(const ostate *os, size_t *n);
/* Zero the sums kept on the device, on stream s (the host's are zeroed by
 * their first addition of a step). */
zo_status ostate_grad_zero(ostate *os, gpu_stream_t s);
/* An addition into the device sums comes on stream s: with one rank the
 * device shard's update zeroes its sums behind it (on its stream), and the
 * step's first addition waits for that here, so that the next forward does
 * not wait for the update. */
zo_status ostate_grad_ready(ostate *os, gpu_stream_t s);
/* Statistics of block b's host sum, complete (a block summed in host
 * memory): kept for ostate_grad_stats; *nonfinite: it holds an inf or nan. */
zo_status ostate_grad_block_stats(ostate *os, int b, int *nonfinite);
/* Whether block b's statistics may be taken by the addition that completes
 * its host sum (adam_grad_accumulate_stats over its n elements with
 * *threads as the statistics' team): a host block whose sum is the
 * optimizer's whole part (one rank) and has no experts' run kept apart. */
int ostate_grad_fusable(const ostate *os, int b, size_t n, int *threads);
/* Block b's statistics, taken as its sum was written (ostate_grad_fusable):
 * the step's, kept for ostate_grad_stats, unless a later addition writes
 * the sum again (ostate_grad_block_changed). */
void ostate_grad_block_taken(ostate *os, int b, double sumsq, int nonfinite);
/* Block b's host sum was written with no statistics taken. */
void ostate_grad_block_changed(ostate *os, int b);
/* Block b's elements [off, off + n) of its sum (within the optimizer's
 * part) are the rank's own experts' (expert parallelism at ZeRO-0): the
 * statistics keep their squares apart. Called once a range before the first
 * step; a block's calls extend one run (offload_init refuses experts that
 * are not one run a block). */
zo_status ostate_split_experts(ostate *os, int b, size_t off, size_t n);
/* Sum of squares of every sum and the first block holding an inf or nan
 * (-1: none): the host's blocks in order (`taken`: their statistics kept by
 * ostate_grad_block_stats; a block's kept by ostate_grad_block_taken in
 * any case, its sum not read again), then the device's (`exact`: the host's
 * arithmetic, block by block). The experts' runs (ostate_split_experts)
 * go to *xsumsq, the rest to *sumsq, every element read once: each block
 * is summed in pieces (before its run, the run, after it). The statistics
 * kept are the step's: the next step's sums take their own. */
zo_status ostate_grad_stats(ostate *os, int taken, int exact, double *sumsq, double *xsumsq, int *first_bad);

#endif
