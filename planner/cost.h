/* The cost model: predicted seconds per optimizer step, split into its parts.
 *
 * Pure arithmetic, no I/O. A layer is a list of matmuls (timed by a roofline
 * with the hardware's efficiency curve by operation size), elementwise kernels
 * (bytes over achieved HBM bandwidth) and tensor-parallel collectives (ring or
 * tree, whichever is faster). A step is the micro-batches through the slowest
 * pipeline stage, the pipeline bubble, the exposed part of data-parallel
 * collectives and of host<->device and NVMe traffic (overlapped with compute
 * where the runtime overlaps it), and the optimizer update on the GPU or the
 * CPU. docs/memplan.md ("Time") gives every formula and constant. */
#ifndef ZO_PLANNER_COST_H
#define ZO_PLANNER_COST_H

#include "planner/memory.h"

/* One micro-batch through the slowest pipeline stage, on one rank. Depends on
 * the shape, TP/SP, micro-batch, sequence, recompute and attention only, so
 * the search computes it once for all placements. */
/* Expert parallelism's all-to-alls of one MoE layer and one micro-batch:
 * the bytes one rank sends to the other ranks of its expert-parallel group
 * (what stays on the rank not counted), under uniform routing (each pair
 * of token and chosen expert lands on another rank with probability
 * (ep-1)/ep), over plan_routed_rows a token: top_k dropless; with a
 * plan_train.capacity_factor the rows the runtime keeps at most (this
 * runtime's min(top_k, E C / tokens), eager's padding to top_k F), as the
 * activations count them. The forward: each remote rank's per-expert pair counts
 * (int32), the pairs' input rows (activation dtype) with their routing
 * weights (fp32: the runtime's layer applies them before the down
 * projection, on the expert's rank) and the output rows back; the backward
 * (fp32 gradients, as the runtime keeps them): the output rows' gradients
 * out, the input rows' gradients and the weights' gradients back. A full
 * recompute (*rc) sends the forward's counts, rows and weights again, not
 * the output rows: it stops before the down projection. All 0 without
 * expert parallelism. */
void plan_ep_layer_bytes(const zo_model_config *m, const plan_train *t, double *fwd, double *bwd, double *rc);

/* A micro-batch's compute by kind of op (plan_time_mb.ops): the base
 * weights' matmuls, the attention core's two passes, the elementwise
 * kernels (norms, activations, rotary, adds, casts), LoRA's adapters,
 * QLoRA's dequantization, and the stage's ends (embedding, output layer,
 * cross-entropy). For `memplan estimate --explain` and the comparison with
 * `train --profile` (docs/memplan.md, "This runtime's kernels"). */
typedef enum plan_op {
    PLAN_OP_GEMM = 0,
    PLAN_OP_ATTN_FWD,
    PLAN_OP_ATTN_BWD,
    PLAN_OP_EW,
    PLAN_OP_LORA,
    PLAN_OP_NF4,
    PLAN_OP_ENDS,
    PLAN_OPS
} plan_op;

const char *plan_op_name(int i); /* "matmuls", "attention forward", ... */

typedef struct plan_time_mb {
    double fwd, bwd, rc;        /* compute seconds: forward, backward, recompute */
    double tp_fwd, tp_bwd, tp_rc; /* tensor-parallel collectives of each pass */
    double ep_fwd, ep_bwd, ep_rc; /* expert-parallel all-to-alls of each pass */
    double total;               /* fwd + bwd + rc + the TP and EP parts */
    double ops[PLAN_OPS];       /* fwd + bwd by kind of op, the stage's layers and ends; they
                                   add up to fwd + bwd (recompute apart) */
    double ep_bytes;            /* bytes the expert-parallel all-to-alls send to other ranks
                                   (all MoE layers of the stage, every pass) */
    double layer_fwd, layer_bwd;  /* one layer with its TP collectives; bwd includes recompute */
    double layer_compute;       /* one layer's fwd + bwd + rc compute (overlap window per block) */
    double layer_rc, layer_rc_compute; /* of one layer: its recompute with its collectives; compute */
    double model_flops_token;   /* fwd + bwd FLOPs per token of the whole model (MFU) */
    double rc_flops_token;      /* recomputed FLOPs per token (HFU adds them) */
} plan_time_mb;

/* What the optimizer schedule works with (planner/schedule.c, filled by
 * plan_time_step): the GPU's work of a step, the optimizer's rates, the
 * links' traffic and the blocks of one micro-batch. Seconds per step of one
 * rank unless said otherwise. */
typedef struct plan_sched_in {
    double gpu;          /* the GPU's work before the update: every part but the optimizer's */
    double h2d;          /* of it, the exposed host->device copies (streamed weights, checkpoints) */
    double opt_gpu;      /* the update of the GPU's optimizer share, on the GPU */
    double cpu_n;        /* elements the CPU updates (0: the optimizer is on the GPU) */
    double threads_serial, threads_over; /* optimizer threads per rank: alone, beside the GPU */
    double rate_serial, rate_over;       /* AdamW elements/s per rank with them */
    double n_elem;       /* NVMe seconds per CPU-updated element (its share read and written) */
    double w_bytes;      /* bytes uploaded per CPU-updated element (its new weights; 0: none) */
    double pcie;         /* host->device bytes/s */
    double fill;         /* one sub-group, as a fraction of the elements: fills the pipeline */
    int seg_n[3];        /* blocks of the stage: first (embedding), layers, last (head) */
    double seg_fwd[3];   /* one micro-batch's forward of one block of each kind */
    double seg_bwd[3];   /* its backward (recompute and collectives included) */
    double seg_elems[3]; /* elements the CPU updates per block of each kind */
    double fwd1;         /* one micro-batch's forward (what waits for the overlapped update) */
    int clip_stale;      /* overlap: an update need not wait for the global norm */
    double h2d_busy, d2h_busy, nvme_busy; /* each link's traffic before overlap, the update's
                                             own not included */
    /* the gradients' way to the host (copies and the host's sums) with the
     * host sums' team of the serial schedule [0] and of overlap and dpu [1]
     * (beside the optimizer's thread): exposed, and busy; `d2h_team` says
     * which of them gpu, d2h_busy and plan_time.d2h hold now */
    double d2h_exposed[2], d2h_link[2];
    double host_sum[2];  /* of it, the host's gradient sums (seconds a step) */
    double rate_bus;     /* AdamW elements/s per rank on every core of the rank's share:
                            with host_sum[0] (the sums on every core) what the host's
                            memory carries a step (plan_time_schedule's host-memory bound) */
    double dma_bytes;    /* host memory the PCIe copies read and write a step, per rank
                            (streamed weights, gradients, checkpoints; the update's upload
                            is plan_time_schedule's): the DMA engines use the host's memory
                            beside the cores, at host_rate */
    double host_rate;    /* the host memory's bytes/s per rank (its roof over the node's ranks) */
    int d2h_team;
    double tokens, peak; /* tokens per step; dense peak FLOP/s of all GPUs */
} plan_sched_in;

/* What sets the step: the resource on its critical path. */
typedef enum plan_bound {
    PLAN_BOUND_GPU = 0, /* GPU work (the optimizer hidden, or none on the CPU) */
    PLAN_BOUND_OPT,     /* the CPU optimizer chain (AdamW, its NVMe traffic, uploads) */
    PLAN_BOUND_H2D,     /* PCIe host->device */
    PLAN_BOUND_D2H,     /* PCIe device->host */
    PLAN_BOUND_NVME,    /* NVMe */
    PLAN_BOUND_HOST_MEM, /* the host's memory: the gradient sums and AdamW together */
} plan_bound;

/* "gpu", "optimizer", "h2d", "d2h", "nvme", "host-memory" */
const char *plan_bound_name(plan_bound b);

typedef struct plan_time {
    /* seconds per optimizer step on the critical rank */
    double forward, backward, recompute; /* compute of all micro-batches */
    double tp_comm;       /* tensor-parallel collectives (not overlapped) */
    double pp_bubble;     /* pipeline fill and drain: (p-1)/v micro-batch times */
    double pp_comm;       /* activations and their gradients sent between stages */
    double dp_comm;       /* exposed data-parallel collectives (ZeRO gathers included) */
    double h2d;           /* exposed host->device copies: streamed and updated weights */
    double d2h;           /* exposed device->host gradient copies and host accumulation */
    double optimizer_gpu; /* the update on the GPU */
    double cpu_adam;      /* AdamW on the CPU over the CPU and NVMe shares */
    double nvme;          /* exposed NVMe traffic (optimizer swap, streamed weights) */
    double ep_comm;       /* expert-parallel all-to-alls (not overlapped) */
    double ep_bytes;      /* their bytes per step sent by one rank to the others */
    double pp_engine;     /* DeepSpeed's pipeline engine: a per-micro-batch overhead fitted on
                             BLOOM-176B's run (PLAN_DS_SLOT_S, docs/memplan.md "Time") */
    /* totals before overlap */
    double dp_comm_total, h2d_total, d2h_total, nvme_total;
    double step;          /* seconds per step: the critical path, the sum of the exposed parts */
    /* the optimizer schedule (docs/memplan.md, "Optimizer schedules") */
    zo_plan_schedule schedule;
    double serial_step;   /* the same configuration with the serial schedule */
    double opt_s;         /* the CPU optimizer's own time in this schedule: AdamW, NVMe and
                             uploads as they pipeline (serial: their sum) */
    double opt_hidden;    /* of it, beside GPU work: the overlapped amount */
    double opt_exposed;   /* of it, on the critical path: cpu_adam + nvme + the upload in h2d */
    plan_bound bound;     /* what sets the step */
    double opt_threads;   /* CPU threads per rank the optimizer runs on */
    double cpu_adam_rate; /* AdamW elements/s per rank with them */
    double cpu_adam_total; /* CPU AdamW before overlap */
    int dpu_warmup;       /* dpu: serial steps before the delayed update (reported) */
    int clip_stale;       /* overlap: updates need not wait for the global norm */
    plan_sched_in sched;
    double tokens_per_s;
    double model_flops;   /* per step, all GPUs (6N + attention per token) */
    double hw_flops;      /* model_flops plus recompute */
    double mfu, hfu;      /* of the dtype's dense peak */
    plan_time_mb mb;
} plan_time;

void plan_time_microbatch(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                          plan_time_mb *out);

/* A micro-batch of recompute full over a fraction `f` of the stage's layers
 * (recompute_layers K of L/p), from the one that recomputes them all:
 * plan_time_microbatch's own arithmetic, for the search. `out` may be `full`. */
void plan_time_mb_recompute_part(const plan_time_mb *full, double f, plan_time_mb *out);

/* The step from a micro-batch's time and the memory estimate (which gives
 * the rank's parameters and what lives where). */
void plan_time_step(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                    const plan_estimate *e, const plan_time_mb *mb, plan_time *out);

/* The step of `pt` (from plan_time_step) under schedule `s`: its step,
 * parts, tokens/s and utilisation recomputed from pt->sched. The parts
 * add up to the step; pt->opt_hidden is the optimizer time hidden. */
void plan_time_schedule(plan_time *pt, zo_plan_schedule s);
/* 1 when the host's gradient sums of schedule s run beside the optimizer's
 * thread on what it leaves (zo_host_teams): dpu, and overlap without exact
 * clipping; 0 when they have every core (serial, and overlap with exact
 * clipping, whose update ends in the next forward, before the backward's
 * sums: the runtime's offload_optim_sum_threads). */
int plan_sched_sum_team(zo_plan_schedule s, int clip_stale);

/* The tokens a step of t trains: seq x micro-batch x grad-accum x DP. */
double plan_step_tokens(const plan_train *t);
/* A floor under the step of every configuration of one layout (the GPUs,
 * DP x TP x PP, EP, micro-batch and gradient accumulation, interleaving,
 * SP, recompute, method, dtypes; its micro-batch `mb` from
 * plan_time_microbatch): whatever its ZeRO stage, optimizer state and
 * split, placements, checkpoints, prefetch depth and schedule, and with
 * recompute full whatever layers it recomputes. The micro-batches' compute
 * and TP/EP collectives, the pipeline's bubble, sends and engine: the parts
 * that do not depend on the placement (cost.c says why each other part is
 * >= 0). The search prunes a capped space with it (plan_space.max_step). */
double plan_time_floor(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                       const plan_time_mb *mb);

/* Both, after validating the configuration. */
zo_status plan_time_run(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                        const plan_estimate *e, plan_time *out);

/* Collectives over p ranks on links of `bw` bytes/s (already the achieved
 * bus bandwidth) and `lat` seconds per step; `bytes` is the whole buffer. */
double plan_allreduce_s(double bytes, int p, double bw, double lat);
double plan_allgather_s(double bytes, int p, double bw, double lat); /* = reduce-scatter */

/* Elements one rank's data-parallel collectives move per optimizer step of
 * P parameters (the stage's, per rank after TP), the ZeRO paper's count: an
 * all-reduce of n elements counts 2n, a reduce-scatter or an all-gather n.
 * Gradients: ZeRO 0 all-reduced and ZeRO 1 reduce-scattered once per step,
 * ZeRO 2-3 reduce-scattered every micro-batch; weights: ZeRO 1-2 gathered
 * once after the step, ZeRO 3 twice per micro-batch (forward, backward).
 * With one micro-batch: 2P for stages 0-2, 3P for stage 3. The runtime counts
 * the same (offload_stats.comm_elems, plus comm_reused_elems for ZeRO-3). */
void plan_dp_comm_elems(const plan_train *t, double P, double *grads, double *weights);

/* The names of the parts, in the order of the step (JSON keys, SVG legend). */
#define PLAN_TIME_PARTS 14
const char *plan_time_part_name(int i);
double plan_time_part(const plan_time *pt, int i);

#endif
