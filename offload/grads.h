/* The gradient layer (grads.c), above the optimizer: the device buffers
 * backward writes a block's gradients into (two gradient slots, with their
 * pinned halves when some gradient goes to the host), each block's way to
 * the sum its optimizer shard hands out, and (several ranks) the
 * reduction of the sums, chosen once at init. */
#ifndef ZO_OFFLOAD_GRADS_H
#define ZO_OFFLOAD_GRADS_H

#include "offload/optim.h" /* defines: offload_optim, ostate, oshard_sum */

#define OFFLOAD_GRAD_SLOTS 2

/* A device gradient buffer and its pinned host copy. */
typedef struct offload_gslot {
    void *dev;          /* device, slot_bytes */
    void *host;         /* pinned, ghost_bytes (NULL when no gradient goes to the host) */
    int block;          /* the block whose gradients are in flight to the host, -1 none */
    size_t n;           /* ... and how many elements (of ghost_dtype) */
    int own;            /* they are the block's own (not a dependant's share) */
    gpu_event_t done;   /* compute stream: backward wrote them */
    gpu_event_t copied; /* d2h stream: they are on the host */
} offload_gslot;

typedef struct grads_path grads_path; /* grads.c: a block's way to its sum */
typedef struct offload_grads offload_grads;

struct offload_grads {
    const offload_env *env;
    const offload_geom *g, *og; /* the model's blocks; the optimizer's geometry */
    const int *dep;             /* [nb] the block whose weights block b reads (and adds to), -1 none */
    int grad_accum;             /* micro-batches a step */
    ostate *os;                 /* the shards, which hand out the sums */
    offload_optim *opt;         /* told as sums complete; counts the micro-batches */
    offload_gslot gs[OFFLOAD_GRAD_SLOTS];
    oshard_sum *sums;           /* [nb] where block b's gradient is summed (its shard's) */
    const grads_path **path;    /* [nb] how it gets there */
    int to_host;                /* some block's sum is in host memory */
    unsigned char *fresh;       /* [nb] the step's first addition into block b writes (lazy zero) */
    zo_dtype ghost_dtype;       /* what the pinned halves hold: the model's dtype, or (ZeRO 2-3)
                                   parts reduced in the reduce dtype */
    size_t ghost_bytes, ghost_pinned; /* one pinned half; all of them */
    zo_status (*send)(offload_grads *gr, gpu_stream_t s, int k, int block, int own);
    zo_status (*reduce)(offload_grads *gr);
    /* ZeRO 0-1: each block reduced in the step's last micro-batch as soon as
     * its sum is complete (behind the backward of the blocks before it) */
    int red_op;                 /* dp_op of the step's reduction, -1 none */
    int reduce_now;             /* this micro-batch is the step's last: reduce as sums complete */
    int *contrib, *contrib_want; /* [nb] additions to block b's sum in it; how many there are */
    unsigned char *reduced;     /* [nb] block b reduced this step */
    int red_k;                  /* the next bucket */
    /* ZeRO 0-1, host sums reduced in a 16-bit reduce dtype: block b's
     * reduced values wait, 16-bit, at the start of their fp32 places, to be
     * widened before the optimizer reads them */
    unsigned char *narrowed;    /* [nb] (NULL: the reduce dtype is fp32) */
    /* ZeRO 0-1 with updates during backward (overlap, offload_optim_early):
     * a block's update starts once its reduction is back in its sum; the
     * blocks reduced and not yet handed on, oldest first, each with the
     * event of its reduction's last copy out */
    gpu_event_t *red_ev;        /* [nb] (NULL: no updates during backward) */
    int *red_wait, n_red_wait;  /* [nb] */
};

zo_status offload_grads_create(const offload_env *env, const offload_geom *g, const offload_geom *og,
                               const int *dep, int grad_accum, ostate *os, offload_optim *opt,
                               offload_grads **out);
void offload_grads_free(offload_grads *gr);
/* A micro-batch begins: the sums zeroed on s when it is the step's first;
 * ZeRO 0-1: whether it is the step's last (its blocks are reduced as they
 * complete; ZO_ERR_INVALID after the reduction: step first). */
zo_status offload_grads_begin(offload_grads *gr, gpu_stream_t s);
/* A free gradient slot zeroed on s (not `avoid`). */
zo_status offload_grads_take(offload_grads *gr, gpu_stream_t s, int avoid, int *out);
/* Backward wrote slot k's gradients of `block` (own: the block's own, not
 * a dependant's share): send them to their sum. */
zo_status offload_grads_send(offload_grads *gr, gpu_stream_t s, int k, int block, int own);
/* Add slot k's copy (once on the host) into the host sum. */
zo_status offload_grads_accumulate(offload_grads *gr, int k);
/* Finish outstanding gradient copies into the host sum. */
zo_status offload_grads_drain(offload_grads *gr);
/* Forget the copies in flight (a micro-batch failed part-way, its streams
 * synchronized): the slots are free. */
void offload_grads_forget(offload_grads *gr);
/* At the step, the sums drained: reduce them over the ranks (ZeRO 0-1), or
 * wait for the reductions made during backward (ZeRO 2-3). */
zo_status offload_grads_reduce(offload_grads *gr);

#endif
