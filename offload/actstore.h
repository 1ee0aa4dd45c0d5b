/* The activation checkpoints (actstore.c), above the accounting: the
 * boundary activations between blocks that a micro-batch's forward keeps
 * for its backward, on the device or in pinned host memory, one store
 * chosen at init (checkpoints_on). Boundary k is block k's output and
 * block k+1's input. */
#ifndef ZO_OFFLOAD_ACTSTORE_H
#define ZO_OFFLOAD_ACTSTORE_H

#include "offload/acct.h" /* defines: offload_env */

typedef struct actstore actstore;

typedef struct actstore_ops {
    /* Forward of block b: io->in (boundary b-1) and io->out (boundary b),
     * NULL at the ends; the compute on s may write io->out after this. */
    zo_status (*forward)(actstore *as, gpu_stream_t s, int b, offload_block_io *io);
    /* Block b's forward is enqueued on s. */
    zo_status (*forward_done)(actstore *as, gpu_stream_t s, int b);
    /* Backward of block b: io->in (boundary b-1), NULL for block 0. */
    zo_status (*backward)(actstore *as, gpu_stream_t s, int b, offload_block_io *io);
    /* Block b's backward is enqueued on s. */
    zo_status (*backward_done)(actstore *as, gpu_stream_t s, int b);
    /* A pass (a micro-batch, a forward) begins. */
    void (*pass_begin)(actstore *as);
    void (*free)(actstore *as);
} actstore_ops;

struct actstore {
    const actstore_ops *ops;
    const offload_env *env;
    int nb;                /* blocks: nb - 1 boundaries */
    size_t bytes;          /* of one boundary (0: the model passes none) */
};

/* A forward-only runtime's store (for actstore_create's `on`): two device
 * buffers the boundaries take in turn; nothing is kept for a backward. */
#define ACTSTORE_PASS ((offload_tier)OFFLOAD_TIERS)

/* The boundaries of nb blocks, `bytes` each, on the device or (on
 * OFFLOAD_CPU) in pinned host memory through two device buffers, or
 * (ACTSTORE_PASS) two device buffers for forwards alone. */
zo_status actstore_create(const offload_env *env, int nb, size_t bytes, offload_tier on, actstore **out);
void actstore_free(actstore *as);

#endif
