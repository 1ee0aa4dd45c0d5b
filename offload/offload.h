/* The offload runtime: train a model made of blocks that is larger than the
 * device's memory (ZeRO-Offload / ZeRO-Infinity on the device interface).
 *
 * A model is a chain of blocks (embedding, layers, head). Each block owns one
 * flat parameter buffer of `block_numel[b]` elements in the model's 16-bit
 * (or fp32) dtype, and passes one activation of `boundary_bytes` to the next
 * block. The runtime owns everything else:
 *
 * - the parameter store: the 16-bit weights of every block, resident on the
 *   device, in pinned host memory or on NVMe (config.params_on);
 * - streaming: a fixed pool of device slots, each the size of the largest
 *   block. Acquiring block b waits (on the device, by an event) for its
 *   weights, which a copy stream loaded `prefetch_depth` blocks earlier;
 *   releasing it lets the copy stream reuse the slot. The host never
 *   synchronizes the device: it waits only on events of single copies;
 * - gradients: as backward produces a block's gradients they are copied to
 *   pinned host memory on a second copy stream (overlapping the next block's
 *   backward) and added in fp32 into the flat gradient of the step (over
 *   `grad_accum` micro-batches);
 * - the optimizer step: AdamW (cpu_adam) over sub-groups of the fp32 master
 *   state, which lives in CPU memory, on NVMe (pipelined: read ahead, update,
 *   write behind) or is split between them by fraction. A share of the state
 *   may live on the device instead (opt_frac[OFFLOAD_DEVICE], rounded to
 *   whole blocks at the end of the model): its gradients never leave the
 *   device (added there in fp32 over micro-batches) and gpu_adam_update
 *   updates it, with cpu_adam's arithmetic. The clip coefficient
 *   comes from the sum of squares of the gradient; with fp16 a dynamic loss
 *   scale skips steps whose gradients overflow. New 16-bit weights go straight
 *   into the parameter store;
 * - activation checkpoints: the boundary activations between blocks, kept on
 *   the device or in pinned host memory; with `recompute` a block's own
 *   activations are rebuilt from its input before its backward;
 * - training checkpoints: weights, optimizer state and counters written to a
 *   temporary directory, flushed and renamed, so a crash at any moment leaves
 *   the previous checkpoint loadable;
 * - several ranks (config.comm, zero_stage): ZeRO-DP stages 0-3, each rank
 *   keeping its part of every block of what the stage partitions, the
 *   collectives on device memory ordered by events (docs/offload.md,
 *   "Several ranks").
 *
 * The flat parameter index: blocks are concatenated in order, so element e
 * of block b is flat element block_offset(b) + e. Optimizer sub-groups and the
 * CPU/NVMe/device split are ranges of this index: [0, n_cpu) in memory,
 * [n_cpu, n_dev_first) on NVMe, [n_dev_first, n) on the device (whole
 * blocks).
 *
 * Results do not depend on where state lives: resident, streamed, optimizer
 * in memory or on NVMe, the arithmetic and its order are the same, so losses
 * are bit-identical (same thread counts).
 *
 * Threading: one runtime is driven by one host thread. */
#ifndef ZO_OFFLOAD_H
#define ZO_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"       /* defines: zo_dtype */
#include "common/plan_schema.h" /* defines: zo_plan (the plan file as read) */
#include "common/plan_vocab.h"  /* defines: zo_plan_tier, zo_plan_schedule */
#include "common/status.h"      /* defines: zo_status */
#include "gpu/comm.h"      /* defines: comm_t (data parallelism) */
#include "gpu/device.h"    /* defines: gpu_device_t, gpu_stream_t */

typedef struct offload offload_t;

/* The run vocabulary's tiers (common/plan_vocab.h), under the runtime's
 * names: one enum for the plan, memplan and the runtime. */
typedef zo_plan_tier offload_tier;
#define OFFLOAD_DEVICE ZO_PLAN_GPU
#define OFFLOAD_CPU ZO_PLAN_CPU
#define OFFLOAD_NVME ZO_PLAN_NVME
#define OFFLOAD_TIERS ZO_PLAN_TIERS

const char *offload_tier_name(offload_tier t); /* "gpu", "cpu", "nvme" (the plan's names) */
/* "gpu", "cpu", "nvme" (any case, as train and memplan read them); messages
 * name `what`. */
zo_status offload_tier_parse(const char *s, const char *what, offload_tier *out);

/* ---- the model ------------------------------------------------------------ */

/* What one block call gets; every pointer is device memory. */
typedef struct offload_block_io {
    const void *params;     /* the block's weights */
    void *grads;            /* backward: its gradients, zeroed before; add to them */
    const void *dep_params; /* the weights of block_dep[b] (e.g. the tied embedding), or NULL */
    void *dep_grads;        /* backward: gradients of block_dep[b], zeroed before, or NULL */
    const void *frozen;     /* the block's frozen base (offload_model.frozen_bytes), or NULL */
    const void *dep_frozen; /* the frozen base of block_dep[b], or NULL */
    const void *in;         /* the activation from block b-1 (NULL for block 0) */
    void *out;              /* forward: the activation for block b+1 (NULL for the last) */
    /* (an MoE layer whose routed experts the runtime streams apart,
     * offload_stream_apart) params holds the block's dense part: its
     * elements before the experts' ranges, then those after them, moved
     * down; expert(expert_ctx, e, s, &w) makes routed expert e's weights
     * (its range of expert_ranges) usable on s, for the experts the block's
     * last forward routed tokens to, each visit in increasing order. NULL:
     * the experts are in params. */
    zo_status (*expert)(void *ctx, int e, gpu_stream_t s, const void **w);
    void *expert_ctx;
} offload_block_io;

/* AdamW weight decay of a range of a block (the model's 2-D weights). */
typedef struct offload_decay_range {
    int block;
    size_t offset, numel; /* elements in the block */
} offload_decay_range;

/* A routed expert's elements in a block (a mixture of experts). In a step
 * where no token of any micro-batch on any rank went to the expert, AdamW
 * leaves them as they are: no moment decay, no weight decay, and the
 * expert's own step count (its bias correction) does not move, as
 * torch.optim.AdamW skips a parameter whose grad is None. */
typedef struct offload_expert_range {
    int block, expert;    /* expert: 0 .. offload_model.experts - 1 */
    size_t offset, numel; /* elements in the block */
} offload_expert_range;

typedef zo_status (*offload_block_fn)(void *user, int block, const offload_block_io *io,
                                      gpu_stream_t s);
typedef zo_status (*offload_backward_fn)(void *user, int block, const offload_block_io *io,
                                         float loss_scale, gpu_stream_t s);

typedef struct offload_model {
    int n_blocks;
    const size_t *block_numel;  /* [n_blocks] elements per block */
    const int *block_dep;       /* [n_blocks] or NULL: -1, or another block whose
                                   weights block b reads and to whose gradients it adds */
    zo_dtype dtype;             /* of weights and device gradients */
    size_t boundary_bytes;      /* bytes of the activation between two blocks */
    /* Ranges with weight decay (NULL: every element decays). */
    const offload_decay_range *decay;
    int n_decay;
    void *user;
    offload_block_fn forward;
    /* Backward: the gradient of the loss w.r.t. `out` is the model's business
     * (kept inside it, flowing from block b+1). loss_scale multiplies the loss
     * gradient (the last block uses it). */
    offload_backward_fn backward;
    /* (optional) Rebuild what backward reads from `in`, without writing
     * `out`. Called before backward when config.recompute is set (with
     * config.recompute_layers K, for the blocks of layers 0..K-1 only). */
    offload_block_fn recompute;
    /* (optional) [n_blocks] the layer block b is (0, 1, ...), -1 for a block
     * that is none (an embedding, a head); NULL: block b is layer b. */
    const int *block_layer;
    /* With recompute: the layers whose activations the model rebuilds
     * (the first K; 0: every layer); offload_init checks that it is
     * config.recompute_layers. */
    int recompute_layers;
    /* (optional) A frozen base per block (e.g. the base weights under LoRA
     * adapters, 16-bit or NF4): frozen_bytes[b] bytes the model reads and
     * never trains: no gradients, no optimizer state, never written back.
     * The block's trainable weights are then block_numel[b] elements beside
     * it (0 for a block with nothing to train). NULL: nothing frozen. */
    const size_t *frozen_bytes;
    /* (optional) Mixtures of experts: the routed experts' ranges (sorted
     * by block and offset), `experts` per MoE block, and after a training
     * forward of block b, expert_routed(user, b, e): whether that forward
     * sent a token to expert e. n_expert_ranges 0: nothing is skipped.
     * experts > 0 says the model is a mixture of experts even where none
     * is trained (LoRA on the attention only: no expert ranges). */
    const offload_expert_range *expert_ranges;
    int n_expert_ranges;
    int experts;
    int (*expert_routed)(void *user, int block, int expert);
    /* (optional, a frozen base with expert parallelism) [n_blocks]: the
     * rank's routed experts are bytes [frozen_expert_lo[b],
     * frozen_expert_hi[b]) of block b's frozen base (equal: none), which
     * ZeRO-3 partitions over expert_comm, the rest over the world. */
    const size_t *frozen_expert_lo, *frozen_expert_hi;
} offload_model;

/* ---- the configuration (what a plan says) -------------------------------- */

typedef struct offload_adamw {
    float lr, beta1, beta2, eps, weight_decay;
    float clip; /* max global gradient norm; 0: no clipping */
} offload_adamw;

/* When the optimizer's update runs (docs/offload.md, "Schedules").
 * - SERIAL: after the step's micro-batches, the host waiting (the default).
 * - OVERLAP: on the optimizer's own thread beside the device's work. With
 *   exact clipping (or fp16 loss scaling) the norm comes first: the update
 *   starts after the last backward and runs while the next micro-batch's
 *   forward goes on, each block's forward waiting for exactly that block's
 *   new weights; the results are the serial schedule's, bit for bit. Without
 *   clipping, or with clip_stale, a block's update starts as soon as its
 *   gradients are complete, while backward runs on through the earlier
 *   blocks.
 * - DPU (delayed parameter update): after dpu_warmup serial steps, step t's
 *   update runs during step t+1's micro-batches, which use the weights of
 *   step t - 1; the new weights are published at the next step. */
/* The run vocabulary's optimizer schedules, under the runtime's names. */
typedef zo_plan_schedule offload_schedule;
#define OFFLOAD_SCHEDULE_SERIAL ZO_PLAN_SCHED_SERIAL
#define OFFLOAD_SCHEDULE_OVERLAP ZO_PLAN_SCHED_OVERLAP
#define OFFLOAD_SCHEDULE_DPU ZO_PLAN_SCHED_DPU

const char *offload_schedule_name(offload_schedule s); /* "serial", "overlap", "dpu" */
zo_status offload_schedule_parse(const char *s, const char *what, offload_schedule *out);

/* Test seam for checkpoint writes: called at named points of the write (see
 * offload_save); a test blocks or kills the process there. */
typedef void (*offload_ckpt_hook)(void *user, const char *point);

/* Start-up progress (offload_config.init_hook): offload_init calls it
 * after each part it sets up, in order: "weights" (the weight stores: with
 * a frozen base, the base's too), "optimizer state" (master, m and v where
 * opt_frac says, the host's gradient sums), "optimizer" (its thread and
 * buffers), "gradients" (their device and pinned buffers), "streaming" (the
 * device slots, the activation checkpoints); a forward-only runtime has
 * "weights" and "streaming" alone. */
typedef struct offload_init_part {
    const char *what;
    double seconds;                 /* the part's wall time */
    uint64_t bytes[OFFLOAD_TIERS];  /* what it allocated per tier */
    uint64_t pinned;                /* of bytes[OFFLOAD_CPU], pinned (page-locked) */
} offload_init_part;
typedef void (*offload_init_hook)(void *user, const offload_init_part *part);

/* offload_config.recompute (the values of the transformer's tf_options.recompute) */
enum { OFFLOAD_RECOMPUTE_NONE = 0, OFFLOAD_RECOMPUTE_FULL = 1, OFFLOAD_RECOMPUTE_OPS = 2 };

typedef struct offload_config {
    offload_tier params_on;          /* DEVICE: resident; CPU, NVME: streamed (with a frozen
                                        base: where the base lives) */
    offload_tier trainable_on;       /* with a frozen base: where the trainable weights
                                        live (default DEVICE); without, unused */
    /* Optimizer state split (the device share: whole blocks). A gradient is
     * summed where its optimizer state lives: on the device for the device
     * share, in fp32 host memory for the rest. */
    double opt_frac[OFFLOAD_TIERS];
    offload_tier checkpoints_on;     /* DEVICE or CPU (CPU needs recompute) */
    int recompute;                   /* OFFLOAD_RECOMPUTE_*: rebuild each block's activations in
                                        backward, whole (FULL) or by op (OPS: the model keeps
                                        every other matmul's output, tf_options.recompute); a
                                        plan's "selective" reads as NONE: see offload_plan_load */
    int recompute_layers;            /* with recompute: 0 every block; K > 0 only the blocks
                                        of the model's first K layers (offload_model.block_layer),
                                        the others keep their activations (Megatron's
                                        --recompute-num-layers; training.recompute_layers).
                                        Checkpoints in host memory need every layer */
    int prefetch_depth;              /* blocks loaded ahead of the one computing (0..16) */
    const char *nvme_dir;            /* where NVMe state lives (needed when used) */
    size_t sub_group;                /* optimizer sub-group, elements; 0 = 1M */
    /* AdamW's m and v in host memory and on NVMe (issue 30): fp32 (default),
     * bf16, or block-wise 8-bit (cpu_adam's adam_state encodings); the
     * device share keeps fp32 (offload_init refuses another with one) */
    zo_plan_opt_state opt_state;
    /* the trained weights' master (issue 30): fp32 (default), or bf16 weights
     * updated directly: none rounds to nearest, stochastic rounds
     * stochastically (seeded by step and element), kahan keeps a bf16
     * compensation; host optimizer state only (offload_init refuses others) */
    zo_plan_master master;
    int swap_buffers;                /* sub-group buffers of the NVMe pipeline; 0 = 3 */
    int grad_accum;                  /* micro-batches per step; 0 = 1 */
    int n_threads;                   /* CPU Adam threads; 0 = OpenMP's default */
    int state_unfused;               /* bf16/8-bit m and v on the host: every chunk decoded, updated in
                                        fp32, coded again, as before the fused update (the same bits;
                                        tests and benchmarks). Default: the environment variable
                                        ZO_STATE_UNFUSED set (offload_config_defaults) */
    offload_schedule schedule;       /* when the update runs (default SERIAL) */
    int clip_stale;                  /* OVERLAP: clip with the previous step's norm, so that
                                        updates start during backward */
    int dpu_warmup;                  /* DPU: serial steps first (default 0) */
    int opt_threads;                 /* CPU Adam threads of the optimizer's thread (OVERLAP,
                                        DPU); the host's gradient sums get the rest of
                                        n_threads; 0 = three quarters (zo_host_teams) */
    offload_adamw adam;
    float loss_scale;                /* initial; 0 = 65536 with fp16, else 1 (no scaling) */
    int loss_scale_window;           /* good steps before the scale doubles; 0 = 200 */
    /* fp16: steps skipped for overflow in a row before offload_step fails
     * (the gradients are not finite at any scale); 0 = 50 */
    int max_skipped_steps;
    /* (optional) the checkpoint folder: created if missing and locked at
     * init, for the runtime's life (a second run on it is refused there,
     * ZO_ERR_BUSY naming the holder). offload_save locks the folder it
     * saves into in any case. */
    const char *ckpt_dir;
    /* checkpoints kept in the folder: the latest and the keep - 1 others
     * with the highest step numbers; 0 = 1 (the latest only) */
    int keep_checkpoints;
    offload_ckpt_hook ckpt_hook;     /* (optional) test seam */
    void *ckpt_hook_user;
    offload_init_hook init_hook;     /* (optional) offload_init's progress */
    void *init_hook_user;
    /* Data parallelism (ZeRO-DP, docs/offload.md "Several ranks"): every
     * rank of `comm` runs its own runtime on its own micro-batches, and the
     * runtimes agree through collectives. NULL, or a communicator of one
     * rank: one rank, no collective. The communicator must order by this
     * runtime's device (comm_options.device) and take its memory: NCCL, or
     * MPI with the CPU device (whose memory is host memory). */
    comm_t comm;
    /* Expert parallelism (docs/offload.md "Expert parallelism"): the
     * model's expert ranges are this rank's own experts (the transformer's
     * layout window) and ep_comm the group of ranks that together hold
     * every expert; expert_comm the ranks of comm holding the same experts
     * as this one (NULL, or one rank: none other does). At ZeRO-0 a block's
     * experts are all-reduced over expert_comm, the rest over comm; the
     * clipping norm sums the group's experts once each; which experts got
     * tokens is OR-ed over expert_comm. NULL ep_comm: every rank holds every
     * expert. */
    comm_t ep_comm, expert_comm;
    /* ZeRO stage over the ranks of comm: 0 every rank holds everything and
     * gradients are all-reduced; 1 the optimizer state (fp32 master, m, v)
     * is partitioned, gradients reduce-scattered at the step and the new
     * 16-bit weights all-gathered; 2 gradients too, reduce-scattered block
     * by block as backward produces them; 3 the 16-bit weights too,
     * all-gathered into the device slots one block ahead of use. Stages 1
     * and 2 keep every 16-bit weight on the device (params_on gpu; with a
     * frozen base, trainable_on gpu); stage 3 takes any params_on (the
     * rank's part lives there). With a frozen base (LoRA) the trained
     * weights are the adapters; the base is replicated at stages 0-2 and
     * partitioned at 3. Every schedule runs at every stage. What the
     * runtime does not run is common/capability.h's table, whose words
     * offload_init refuses with (ZO_ERR_UNSUPPORTED). */
    int zero_stage;
    /* Elements of a communication bucket (in reduce_dtype; two of them on
     * the device): a block larger than it is reduced in pieces. 0: 25M (the
     * plan's comm.bucket), at most the largest block. */
    size_t comm_bucket;
    /* The dtype the gradients are reduced in over the ranks (memplan's
     * --reduce-dtype, training.reduce_dtype): fp32 (the default), bf16 or
     * fp16. The sums over micro-batches stay fp32; what is rounded where:
     * docs/offload.md, "The reduce dtype". */
    zo_dtype reduce_dtype;
    /* Forwards only (generation, docs/generate.md): the weight stores
     * (params_on; with a frozen base trainable_on places the adapters), the
     * device slots and two device buffers for the activation between blocks,
     * and nothing else: no gradients, no optimizer state, no fp32 master
     * (offload_set_block keeps the weights in the model's dtype), no
     * checkpoints, one rank. offload_forward runs the blocks; each forward's
     * last blocks prefetch the next forward's first. offload_micro_batch,
     * offload_step, offload_get_block, offload_get_weights and the
     * checkpoints are ZO_ERR_INVALID. */
    int forward_only;
} offload_config;

/* prefetch 2, everything on the device, no recompute, sub-group 1M, AdamW
 * lr 3e-4 betas (0.9, 0.95) eps 1e-8 decay 0.1 clip 1. */
void offload_config_defaults(offload_config *c);

/* ---- plans ---------------------------------------------------------------- */

/* What a plan predicts (the "predicted" member of the plan JSON). */
typedef struct offload_prediction {
    int present;
    uint64_t peak[OFFLOAD_TIERS];    /* bytes per tier */
    /* of those, what the runtime's own allocations reach (the measured peak
     * is compared with it): peak less the CUDA context, the cuBLAS workspace
     * and the fragmentation allowance; = peak for plans written before it */
    uint64_t alloc[OFFLOAD_TIERS];
    double step_s;                   /* 0 when absent */
} offload_prediction;

/* A plan file (docs/plan-format.md) as the runtime reads it: its
 * configuration and the training settings it holds besides. */
typedef struct offload_plan {
    offload_config cfg;              /* placement, buffers, grad_accum */
    offload_prediction predicted;
    char model_name[64];
    int seq, micro_batch;            /* 0 when no plan was read */
    int dtype;                       /* zo_dtype, -1 when no plan was read */
    uint64_t gpu_mem;                /* hardware.gpu_mem; 0 when the plan has no hardware */
    /* The plan said recompute "selective": read as none (cfg.recompute 0),
     * since the attention keeps no s x s scores and selective would
     * recompute nothing; programs say so when they print the plan. */
    int selective_as_none;
    /* The file as the plan schema read it (the model and parallel layout
     * for zo_plan_check_run); cfg.nvme_dir may point into it. */
    zo_plan file;
} offload_plan;

/* Defaults: offload_config_defaults, nothing predicted, dtype -1. */
void offload_plan_defaults(offload_plan *p);

/* Read a plan file through the plan schema's reader (common/plan_schema.h,
 * the one memplan writes with), which refuses anything but that one shape:
 * unknown or missing fields, values outside the schema's limits, another
 * version. The plan sets the runtime's placement, buffers and grad_accum in
 * plan->cfg and leaves the rest of cfg (AdamW, threads, loss scale, hooks) as
 * it is (start from offload_plan_defaults); the NVMe directory placeholder
 * "${ZO_NVME_DIR}" leaves cfg.nvme_dir alone, a directory points it into
 * plan->file. A plan for an optimizer the runtime lacks (sgd) is refused.
 * Messages name the file and the field. */
zo_status offload_plan_load(const char *path, offload_plan *plan);

/* ---- life cycle ------------------------------------------------------------ */

/* Allocate the parameter store, the device slots (or the resident weights),
 * gradient and activation buffers, the optimizer state (and its NVMe store)
 * and the streams. ZO_ERR_CAPACITY when a tier cannot hold its part. The
 * weights are zero until offload_set_weights. */
zo_status offload_init(offload_t **out, gpu_device_t dev, const offload_model *model,
                       const offload_config *cfg);
void offload_free(offload_t *rt);

/* Set the fp32 master weights of one block (block_numel[block] floats) and
 * its 16-bit weights from them (a value that is not finite is refused,
 * ZO_ERR_INVALID naming the block and element, before anything changes);
 * its optimizer moments restart at zero, and
 * gradients accumulated since the last step are dropped. Host memory holds
 * the block in flight and no more, whatever the model's size: load a model
 * block by block (e.g. model_load_block) through it. */
zo_status offload_set_block(offload_t *rt, int block, const float *w);
/* Read one block's fp32 master weights back. With the optimizer state
 * partitioned over ranks (ZeRO 1-3) the parts are all-gathered: a
 * collective, every rank reads the same blocks in the same order. */
zo_status offload_get_block(offload_t *rt, int block, float *w);

/* A block's frozen base (frozen_bytes[block] bytes, e.g. tf_frozen_pack's)
 * into its store, and back. Set every block's before training. */
zo_status offload_set_frozen_block(offload_t *rt, int block, const void *bytes);
zo_status offload_get_frozen_block(offload_t *rt, int block, void *bytes);

/* Every block at once (blocks[b]: block_numel[b] floats); the step counter
 * and the loss-scale history restart too. */
zo_status offload_set_weights(offload_t *rt, const float *const *blocks);
zo_status offload_get_weights(offload_t *rt, float *const *blocks);

/* ---- training -------------------------------------------------------------- */

/* Forward and backward of one micro-batch over every block, streamed; the
 * batch must already be on `s` (the model's business, e.g. tf_set_batch on
 * the same stream). Gradients are added to the step's fp32 host gradient.
 * On return the forward's outputs (the loss) are complete on `s`. On failure
 * the work already queued on `s` has run (the runtime may be freed at once),
 * and the gradients accumulated since the last step are dropped: the step
 * starts again with the next micro-batch. */
zo_status offload_micro_batch(offload_t *rt, gpu_stream_t s);

/* Forward only (evaluation, generation): every block in order, weights
 * streamed as in training, no gradients and nothing added to the step; the
 * model's outputs are complete on `s` on return. Between micro-batches of a
 * step or between steps alike; its time counts in the stats' total. */
zo_status offload_forward(offload_t *rt, gpu_stream_t s);

typedef struct offload_step_info {
    float grad_norm;   /* global norm of the mean gradient, before clipping */
    float loss_scale;  /* the scale the step's backward used */
    int skipped;       /* 1 when inf/nan skipped the update (fp16, a scale to lower) */
    int64_t step;      /* optimizer steps taken so far */
} offload_step_info;

/* After grad_accum micro-batches: unscale, clip, AdamW over every sub-group,
 * new weights into the parameter store. Gradients that are not finite skip
 * the step and halve the loss scale when there is one to lower (fp16 above
 * a scale of 1), up to config.max_skipped_steps in a row; otherwise (fp32,
 * bf16, fp16 at scale 1, or too many in a row) the step fails with
 * ZO_ERR_INVALID naming the first block whose gradients are not finite, and
 * nothing is updated. */
zo_status offload_step(offload_t *rt, offload_step_info *info);

/* The learning rate of the next steps (a schedule sets it before each step). */
void offload_set_lr(offload_t *rt, float lr);

/* The loss scale the next backward uses. */
float offload_loss_scale(const offload_t *rt);
/* The fp32 gradient of the last step (flat, unscaled sum over micro-batches
 * times loss_scale: divide by loss_scale * grad_accum for the mean), valid
 * after the micro-batches and until offload_step. NULL when none. Only the
 * host share: *n is the first element of the optimizer's device share (n
 * when there is none); that share's gradient is on the device. */
const float *offload_grad(const offload_t *rt, size_t *n);
/* Flat offset of block b. */
size_t offload_block_offset(const offload_t *rt, int block);

/* ---- measurements ------------------------------------------------------------ */

typedef enum offload_time_part {
    OFFLOAD_TIME_COMPUTE = 0,  /* waiting for the device's forward/backward */
    OFFLOAD_TIME_WEIGHTS,      /* waiting for weights that were not there yet */
    OFFLOAD_TIME_GRADS,        /* gradient copies and fp32 accumulation */
    OFFLOAD_TIME_OPTIMIZER,    /* the CPU Adam update, and the step's gradient statistics (the norm) */
    OFFLOAD_TIME_DISK,         /* NVMe reads and writes the host waited for */
    OFFLOAD_TIME_COMM,         /* collectives the host waited for (several ranks) */
    OFFLOAD_TIME_PARTS,
} offload_time_part;

const char *offload_time_part_name(offload_time_part p); /* "compute", "weights", ... */

/* Device slots for routed experts streamed apart from their MoE layer's
 * dense part: one computing while the next loads (memplan sizes as many). */
#define OFFLOAD_EXPERT_SLOTS 2

typedef struct offload_stats {
    uint64_t peak[OFFLOAD_TIERS];   /* most bytes in use at once per tier */
    uint64_t in_use[OFFLOAD_TIERS]; /* now */
    uint64_t device_capacity;       /* 0 = unlimited */
    double time[OFFLOAD_TIME_PARTS];/* seconds since init (or the last reset) the thread that made
                                       the runtime spent in each part: parts of its wall time */
    double time_beside[OFFLOAD_TIME_PARTS]; /* the same, spent on other threads beside it (the
                                       optimizer's, schedules overlap and dpu) */
    double total_s;                 /* micro-batches and steps together */
    int64_t micro_batches, steps, skipped;
    uint64_t bytes_h2d, bytes_d2h, bytes_disk_read, bytes_disk_written;
    uint64_t bytes_weights;         /* of the streamed weights, copied into the device slots (blocks,
                                       their dense parts, experts) */
    int n_slots;                    /* device weight slots (0 when resident) */
    size_t slot_bytes;
    /* MoE layers whose routed experts stream apart (offload.md, "Experts
     * streamed apart"): their slots (0: none), the bytes of one, and the
     * experts copied into them */
    int n_expert_slots;
    size_t expert_slot_bytes;
    uint64_t experts_fetched;
    double optimizer_s;             /* the CPU update's own time (every schedule) */
    double optimizer_overlap;       /* the fraction of it that ran while the device computed */
    /* the host's additions of a block's gradients into its fp32 sum, and
     * those made on the cores the optimizer's thread leaves while it
     * updates (zo_host_teams); the others had every core */
    int64_t grad_sums, grad_sums_beside;
    /* the clipping statistics of a block's host sum: taken in the addition
     * that completed it (one rank: adam_grad_accumulate_stats), or by a
     * pass of their own that reads the sum again (reductions over the
     * ranks, experts kept apart) */
    int64_t grad_stats_fused, grad_stats_read;
    /* bf16 or 8-bit m and v in host memory or on NVMe: the elements the
     * host updated a whole chunk in place (cpu_adam's fused step), and
     * those decoded, updated in fp32 and coded again (part of a chunk, no
     * fp32 master, an expert left as it is, offload_config.state_unfused) */
    uint64_t state_fused, state_decoded;
    /* Data parallelism: the collectives of this rank since init (or the
     * last reset), in model elements, the ZeRO paper's unit: an all-reduce
     * of n elements counts 2n (a reduce-scatter and an all-gather), a
     * reduce-scatter or an all-gather n; the padding that makes each block
     * divide among the ranks is counted apart. */
    int rank, ranks;                /* 0 of 1 without data parallelism */
    uint64_t comm_elems, comm_pad_elems;
    int64_t comm_calls;
    /* ZeRO-3: elements of the blocks a forward or a backward found still
     * gathered in a device slot by the pass before it (not gathered again:
     * the last blocks of a forward are the first of its backward, and so on
     * across micro-batches); comm_elems plus these is the paper's count,
     * which gathers every block twice a micro-batch */
    uint64_t comm_reused_elems;
    /* ZeRO-3 with a frozen base (LoRA, QLoRA): the bytes of the base
     * all-gathered (not model elements: apart from comm_elems) */
    uint64_t comm_frozen_bytes;
    /* fp32 master, m and v this rank holds, per tier (1/N of the model's
     * with ZeRO 1-3 over N ranks) */
    uint64_t optimizer_bytes[OFFLOAD_TIERS];
} offload_stats;

void offload_get_stats(const offload_t *rt, offload_stats *out);
/* Restart the times and counters (not the peaks). */
void offload_reset_times(offload_t *rt);

/* Data parallelism: `bytes` (at most OFFLOAD_GATHER_MAX) of host memory
 * from every rank into all[rank * bytes], on every rank, in rank order (a
 * collective: every rank calls it at the same point). With one rank, a
 * copy. For what programs print for the whole job: losses, peaks. */
#define OFFLOAD_GATHER_MAX 256
zo_status offload_gather(offload_t *rt, const void *mine, size_t bytes, void *all);

/* " (plan A, P%)": the plan's allocations for `tier` beside the measured
 * peak, and "; T with the CUDA context, the cuBLAS workspace and the
 * allocator allowance" where the plan counts more than its allocations;
 * empty without a prediction for the tier. Into buf (n bytes). */
void offload_format_peak_vs_plan(char *buf, size_t n, uint64_t measured, const offload_prediction *pr,
                                 offload_tier tier);

/* Write {"peak_bytes": {...}, "predicted_bytes": {...}, "time_s": {...},
 * ...} to `path` (atomically); pred may be NULL. */
zo_status offload_write_stats_json(const offload_t *rt, const offload_prediction *pred,
                                   const char *path);
/* The same document, for a program to add its own members to (train's
 * "profile") before it writes it (zo_file_write_json); the caller deletes
 * it. */
struct cJSON;
zo_status offload_stats_json(const offload_t *rt, const offload_prediction *pred, struct cJSON **out);

/* The runtime's copy streams (host to device, device to host: the
 * optimizer's device share steps on the latter), to name them in a
 * profile (gpu/profile.h). */
void offload_copy_streams(const offload_t *rt, gpu_stream_t *h2d, gpu_stream_t *d2h);

/* ---- training checkpoints ------------------------------------------------------ */

/* Counters saved with a checkpoint besides the runtime's own (state.json,
 * docs/offload.md "Checkpoints"). The batch shape says what the data
 * position counts, so that a run resumed with another split of the same
 * global batch (another micro-batch, grad-accum or rank count) finds its
 * place, and one with another sequence length or global batch is refused:
 * micro_batch rows (sequences of seq tokens) a micro-batch, grad_accum
 * micro-batches a rank a step, on `ranks` ranks. All 0: no shape recorded
 * (saved so, or loaded from a version-3 state.json). */
typedef struct offload_ckpt_batch {
    int64_t micro_batch, grad_accum, ranks, seq;
} offload_ckpt_batch;

typedef struct offload_ckpt_meta {
    int64_t data_step;   /* the caller's data position: train's is rows (sequences) every rank
                          * took, in all; loaded from a version-3 state.json (state_version 3),
                          * micro-batches of a shape it did not record */
    uint64_t seed;
    offload_ckpt_batch batch;
    int state_version;   /* loaded: the state.json's (4; 3 for an older checkpoint) */
} offload_ckpt_meta;

/* Write the model's weights (fp32 master blocks) under `path` (e.g. as
 * safetensors with the model's names); the runtime calls it once per save,
 * with the whole model gathered in host memory. */
typedef zo_status (*offload_weights_writer)(void *user, const char *path,
                                            const float *const *blocks);

/* Read block b's fp32 master weights into dst (block_numel[b] floats). */
typedef zo_status (*offload_block_reader)(void *ctx, int block, float *dst);
/* Write the model's weights under `path`, reading them one block at a time
 * through read(ctx, b, dst), in any order and as often as it needs (e.g.
 * model_save_streamed). */
typedef zo_status (*offload_weights_stream)(void *user, const char *path,
                                            offload_block_reader read, void *ctx);

/* Save a checkpoint into DIR/step-<N>/ (weights through `writer` when not
 * NULL as model.safetensors, optimizer.safetensors with each block's fp32
 * master, m and v, state.json, and last manifest.json: every other file's
 * size and XXH3-64 and the layout), built in DIR/.tmp-step-<N>/ with every
 * file fsynced, renamed into place, then DIR/latest (a one-line file naming
 * the directory) replaced atomically. DIR is created if missing and locked
 * for the runtime's life (ZO_ERR_BUSY, naming the holder, when another run
 * holds it). Then the checkpoints beyond config.keep_checkpoints go (the
 * latest stays, then the highest step numbers), and the .tmp-step-* of
 * interrupted saves: only directories named exactly step-<N> or
 * step-<N>.<k> (and .tmp- those), never through a link; nothing else in DIR
 * is touched. The hook (config.ckpt_hook) is called at "begin",
 * "optimizer-half", "before-rename" and "before-latest" (and, in the
 * gathered save of expert parallelism at ZeRO 1-3, "optimizer-gather":
 * before the first piece gathered from the middle block on).
 * Several ranks: every rank calls it, on a directory they share; rank 0
 * holds the lock. ZeRO 0: rank 0 saves the one-rank checkpoint. ZeRO 1-3:
 * each rank writes its shard of the optimizer state
 * (optimizer-<r>-of-<N>.safetensors) and rank 0 the weights, state.json and
 * the manifest, which adds the partition; the directory is renamed into
 * place once every rank's files are in it. offload_load reads either form
 * on any rank count. */
zo_status offload_save(offload_t *rt, const char *dir, const offload_ckpt_meta *meta,
                       offload_weights_writer writer, void *writer_user);
/* The same, the weights written block by block: host memory holds a few
 * blocks, never the model, whatever tier the state lives on. */
zo_status offload_save_streamed(offload_t *rt, const char *dir, const offload_ckpt_meta *meta,
                                offload_weights_stream writer, void *writer_user);

/* Write the model's weights (fp32 master) under `path` through `writer`,
 * reading one block at a time; with several ranks every rank calls it:
 * rank 0 writes, and when the optimizer state is partitioned the others
 * read the blocks it reads (each is gathered across ranks). */
zo_status offload_write_weights(offload_t *rt, const char *path, offload_weights_stream writer, void *user);

/* Load the checkpoint DIR/latest names (or DIR itself when it holds a
 * state.json): master, moments, step, loss scale; the 16-bit store is rebuilt
 * from the master. meta (may be NULL) receives the caller's counters. Before
 * anything is overwritten: state.json has every field, in range, version 3;
 * its parameters, blocks and dtype are the running model's; the manifest
 * lists state.json and optimizer.safetensors and every file it lists has its
 * size and checksum (ZO_ERR_CHECKSUM naming the file otherwise). Values that
 * are not finite (a negative second moment too) are refused naming the
 * tensor and element; the runtime's state is then partly loaded: load again
 * or set the weights. */
zo_status offload_load(offload_t *rt, const char *dir, offload_ckpt_meta *meta);

/* The checkpoint folder `dir` names (what offload_load reads): dir itself
 * when it holds a state.json, else the one its `latest` names; into cdir
 * [len]. ZO_ERR_NOT_FOUND when it names none. */
zo_status offload_ckpt_resolve(const char *dir, char *cdir, size_t len);

#endif
