/* The streaming layer (stream.c), above the gradients and the optimizer:
 * one micro-batch, blocks forward in order and backward in reverse, their
 * weights streamed from the weight stores through device slots (prefetched
 * `prefetch_depth` blocks ahead), their gradients handed to the gradient
 * layer, the activations between blocks kept in an activation store. */
#ifndef ZO_OFFLOAD_STREAM_H
#define ZO_OFFLOAD_STREAM_H

#include "offload/actstore.h" /* defines: actstore */
#include "offload/grads.h"    /* defines: offload_grads, offload_optim, wstore */

#define OFFLOAD_MAX_PREFETCH 16

/* A device slot holding one block's weights while it computes: its frozen
 * base (fslot bytes, when that is streamed), then its trainable weights. */
typedef struct offload_slot {
    void *buf;          /* device, slot_size */
    int block;          /* the block whose weights it holds (or is loading), -1 none */
    int busy;           /* acquired and not released */
    int used;           /* the freed event has been recorded at least once */
    uint64_t gen, fgen; /* the generations of the block's weights and frozen base it holds */
    uint64_t seg;       /* 2 pass + (backward): the half-pass it was loaded for, or last used by */
    uint64_t released;  /* tick of the last release (least recently released goes first) */
    gpu_event_t ready;  /* on the h2d stream: the weights have arrived */
    gpu_event_t freed;  /* on the compute stream: the last block using it has run */
} offload_slot;

/* A device slot holding one routed expert's weights (an MoE layer whose
 * experts stream apart from its dense part). */
typedef struct offload_eslot {
    void *buf;          /* device, expert_slot_size */
    int block, expert;  /* what it holds (or is loading), -1 none */
    int used;           /* the freed event has been recorded at least once */
    uint64_t gen;       /* the generation of the block's weights it copied */
    uint64_t released;  /* tick of the last release */
    gpu_event_t ready;  /* on the h2d stream: the weights have arrived */
    gpu_event_t freed;  /* on the compute stream: the expert's work has run */
} offload_eslot;

typedef struct offload_stream_config {
    const offload_model *m;     /* forward, backward, recompute; dependencies; boundary bytes */
    const offload_geom *g;      /* the model's blocks */
    wstore *ws, *fws;           /* the trainable weights; the frozen base, or NULL */
    int n_slots;                /* device slots (offload_stream_slots; 0: nothing is streamed) */
    size_t fslot, slot_size;    /* bytes of a slot's frozen part (0: the base is resident); of a slot */
    int prefetch_depth;
    int recompute;              /* backward rebuilds a block's activations from its input */
    int recompute_layers;       /* with recompute: 0 every block; K the blocks of layers 0..K-1 */
    offload_tier checkpoints_on; /* the activation store's tier */
    offload_grads *gr;
    offload_optim *opt;
    /* forwards only (generation): no gradients and no optimizer (gr, opt
     * NULL), the boundaries in two device buffers, and the schedule one
     * forward after another, so a forward's last blocks prefetch the next
     * one's first */
    int forward_only;
    /* MoE layers' routed experts streamed apart (offload_stream_apart): the
     * experts' device slots (0: each layer moves as one block) and the
     * elements of one expert; slot_size then holds a block's dense part */
    int expert_slots;
    size_t expert_numel;
} offload_stream_config;

typedef struct offload_stream {
    const offload_env *env;
    offload_stream_config c;
    const int *dep;             /* [nb] c.m->block_dep: the block whose weights block b reads, -1 none */
    offload_slot *slots;        /* [c.n_slots] */
    uint64_t tick;
    int *sched;                 /* [2 nb] the blocks of one micro-batch in order (forward only:
                                   two forwards) */
    int n_sched;
    int pos;                    /* schedule position being acquired */
    uint64_t pass;              /* passes (micro-batches, forwards) begun */
    /* compute stream: the work of the last two blocks enqueued this pass,
     * block k's in done[k % 2]; the host enqueues block k once block k - 2
     * has run, so the device always has one block queued behind the one it
     * runs (waiting for k - 1 left it idle while the host launched k) */
    gpu_event_t done[2];
    int n_done;                 /* blocks enqueued this pass */
    actstore *acts;             /* the activation checkpoints */
    /* experts streamed apart (c.expert_slots): per block, the range of its
     * routed experts [elo, ehi) (elo == ehi: none, the block moves whole) */
    size_t *elo, *ehi;
    offload_eslot *eslots;      /* [c.expert_slots] */
    int eblock;                 /* the block whose experts are being visited */
    int ebusy;                  /* the expert slot computing, -1 none */
} offload_stream;

/* Device slots for streamed weights: the block computing and
 * `prefetch_depth` loading ahead (two at least when a block reads
 * another's weights), at most one a block. */
int offload_stream_slots(const offload_model *m, int prefetch_depth);
/* Whether the MoE layers' routed experts can stream apart from their
 * dense parts (the trainable weights' store has fetch_range, its fetch is
 * no collective, no frozen base; each MoE block's experts lie together,
 * every one the same size): 1, with the elements of a slot holding the
 * largest block's dense part (a block without experts: all of it) and of
 * one expert; else 0, the layers moving whole. */
int offload_stream_apart(const offload_model *m, const wstore *ws, const wstore *fws, size_t *dense_largest,
                         size_t *expert_numel);
zo_status offload_stream_create(const offload_env *env, const offload_stream_config *c, offload_stream **out);
void offload_stream_free(offload_stream *st);
/* One micro-batch on the compute stream s: forward, backward, its
 * gradients in their sums; after a failure part-way, the work queued is
 * done and the step's gradients dropped. */
zo_status offload_stream_micro_batch(offload_stream *st, gpu_stream_t s);
/* A forward alone (evaluation): the step's gradients are left as they are. */
zo_status offload_stream_forward(offload_stream *st, gpu_stream_t s);

#endif
