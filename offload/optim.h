/* The optimizer layer (optim.c), above the weight store and the optimizer
 * state: the step's arithmetic (gradient statistics, unscaling, clipping,
 * the dynamic loss scale, AdamW over every shard, the new weights into the
 * store) and its schedule (when the update runs: on the host thread, or on
 * the optimizer's own thread beside the device's work). It also counts the
 * micro-batches whose gradients the next step averages. */
#ifndef ZO_OFFLOAD_OPTIM_H
#define ZO_OFFLOAD_OPTIM_H

#include "common/adam_math.h" /* defines: zo_adam_hparams */
#include "offload/ostate.h"   /* defines: ostate */
#include "offload/wstore.h"   /* defines: wstore */

#define OFFLOAD_LOSS_SCALE_INIT 65536.0f
#define OFFLOAD_LOSS_SCALE_WINDOW 200
#define OFFLOAD_MAX_SKIPPED_STEPS 50 /* fp16 overflow skips in a row before the step fails */

/* What the optimizer's thread runs. */
enum { OFFLOAD_JOB_NONE = 0, OFFLOAD_JOB_ALL, OFFLOAD_JOB_BLOCKS };

/* The training counters (a checkpoint keeps them). */
typedef struct optim_counters {
    int64_t step;               /* steps taken */
    float loss_scale;
    int good_steps;             /* steps since the scale last moved */
    int64_t skipped;            /* fp16 overflow skips, in all */
    int skipped_in_a_row;       /* ... since the last step taken */
} optim_counters;

typedef struct offload_optim {
    const offload_env *env;
    const offload_config *cfg;  /* the runtime's (its learning rate moves: offload_set_lr) */
    const offload_model *m;     /* the dtype and the decay ranges */
    const offload_geom *g, *og; /* the model's blocks; the optimizer's (the rank's parts with ZeRO 1-3) */
    wstore *ws;                 /* where the new weights go */
    ostate *os;                 /* the state they come from, and the gradient sums */
    optim_counters ctr;
    int dynamic_scale;          /* fp16: the scale moves */
    int micro;                  /* micro-batches in the gradient sums */
    float prev_norm;            /* the last step's gradient norm (clip_stale) */
    int have_prev_norm;
    /* the schedule */
    int threaded;               /* OVERLAP or DPU: updates run on the optimizer's thread */
    int threads, sum_threads;   /* the update's OpenMP team and the host gradient sums' (0: OpenMP's
                                   default); threaded, the cores split by zo_host_teams */
    int cores;                  /* threaded: the two teams' cores (the sums' while the thread idles) */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* job posted, block published, job done */
    int job;                    /* OFFLOAD_JOB_* being run or posted */
    int quit;
    zo_status status;           /* the last job's failure, reported at the next step */
    char msg[512];
    int *queue;                 /* [nb] blocks to update (updates during backward) */
    int qhead, qtail, qclosed;
    int64_t *published;         /* [nb] the step whose weights block b's store holds */
    int64_t pub_step;           /* the latest step a block was published for, and how many */
    int pub_n;                  /* blocks were (every one: that update's AdamW is over) */
    zo_adam_hparams hp;         /* the running job's hyperparameters */
    int early;                  /* this step's updates started during backward */
    wstore *shadow;             /* DPU: a host store the update writes into */
    int dpu_pending;            /* DPU: the shadow holds an update not yet published */
    /* mixtures of experts (m->n_expert_ranges > 0): [nb * m->experts] each,
     * expert e of block b at b * experts + e */
    uint8_t *routed;            /* this step's training forwards so far sent it a token (this rank) */
    uint8_t *step_routed;       /* the update's: a token on any rank, in any micro-batch of its step */
    int64_t *expert_steps;      /* AdamW steps the expert has taken (its bias correction; a checkpoint
                                   keeps them) */
    int routed_final;           /* step_routed and expert_steps are the step's (offload_optim_step, or
                                   the first update during backward) */
    offload_decay_range *expert_at; /* [m->n_expert_ranges] the experts' ranges, as ranges of a block */
} offload_optim;

/* The optimizer of the shards `os` and the store `ws` (on the model's
 * blocks g; og the optimizer's geometry), configured by cfg (already
 * defaulted: offload_init). */
zo_status offload_optim_create(const offload_env *env, const offload_config *cfg, const offload_model *m,
                               const offload_geom *g, const offload_geom *og, wstore *ws, ostate *os,
                               offload_optim **out);
void offload_optim_free(offload_optim *o);
/* The delayed update's host copy of the newest weights (NULL: another
 * schedule). */
wstore *offload_optim_shadow(offload_optim *o);
/* Unscale, clip and update every shard from the gradient sums of o->micro
 * micro-batches (drained), as the schedule says; the sums are the next
 * step's to start (o->micro 0) once their statistics are taken. */
zo_status offload_optim_step(offload_optim *o, offload_step_info *info);
/* Every update done and every new weight in the store (before anything
 * reads or writes the state from outside the step). */
zo_status offload_optim_settle(offload_optim *o);
/* Block b's weights are the current step's (a forward waits for its
 * update); with wait 0, 1 when they are, 0 when not yet. */
int offload_optim_ready(offload_optim *o, int b, int wait);
/* Before the step's first addition into block b's host gradient sum: the
 * update in flight is done reading it (dpu: the delayed update runs beside
 * this step's backward). */
void offload_optim_grads_free(offload_optim *o, int b);
/* The host gradient sums' OpenMP team (adam_grad_accumulate's nthreads)
 * for a sum starting now: the CPU Adam's when the update runs after the
 * micro-batches; with the optimizer's thread, what it leaves
 * (zo_host_teams) while it updates blocks (*beside = 1), every core once
 * its update has published every block or before it starts (the overlap
 * schedule with exact clipping: the update ends in the forward, which
 * waits for each block). The sums' bits do not depend on the team. */
int offload_optim_sum_threads(offload_optim *o, int *beside);
/* The last micro-batch of a step completed block b's gradients (a block
 * summed in host memory): its update may start now (OVERLAP without exact
 * clipping). */
zo_status offload_optim_block_done(offload_optim *o, int b);
/* A micro-batch starts: when it is the step's last and the schedule allows
 * (overlap without exact clipping), its blocks' updates start as their
 * gradients complete (offload_optim_early says so). */
zo_status offload_optim_micro_begin(offload_optim *o);
/* A training forward of block b ran: the experts it sent tokens to are
 * updated this step (the others, on every rank, are left untouched). */
void offload_optim_routed(offload_optim *o, int b);
/* A training forward's blocks were all issued (the host thread, at the same
 * point of every rank's program): when its backward updates blocks as
 * their gradients complete, the step's experts are settled now (gathered
 * over the ranks), before the backward issues any reduction. */
zo_status offload_optim_forward_done(offload_optim *o);
int offload_optim_early(const offload_optim *o);

#endif
