/* What the runtime runs: one table of the combinations of method, ZeRO
 * stage, optimizer schedule, placement and parallelism that the runtime
 * (offload/) does not run, each with the words every program prints for it.
 * The runtime's offload_init, the plan reader, train and memplan ask it the
 * same question and refuse with the same message (ZO_ERR_UNSUPPORTED).
 *
 * Everything else runs: full fine-tuning, LoRA and QLoRA; ZeRO 0-3 on any
 * number of data-parallel ranks; the serial, overlap and dpu schedules; the
 * weights (or a LoRA base) on the GPU, in host memory or on NVMe; the
 * optimizer state split over the three tiers; recompute of no layer, every
 * layer, the first K (training.recompute_layers) or by op; gradients reduced
 * in fp32, bf16 or fp16 (training.reduce_dtype). docs/offload.md, "What the
 * runtime runs", has the table in words. What a plan asks beyond the
 * runtime field by field (recompute by op of MoE layers) is zo_plan_runtime_check's
 * (plan_schema.h).
 *
 * Depends on the run vocabulary and the plan schema only (common/). */
#ifndef ZO_COMMON_CAPABILITY_H
#define ZO_COMMON_CAPABILITY_H

#include <stddef.h>

#include "plan_schema.h" /* defines: zo_plan */
#include "plan_vocab.h"  /* defines: zo_plan_method, zo_plan_schedule, zo_plan_tier */
#include "status.h"

/* A run as the table sees it: a plan's shape, or a program's flags. */
typedef struct zo_run_shape {
    zo_plan_method method;         /* full, lora, qlora */
    int ranks;                     /* data-parallel ranks (parallel.dp); 1: one */
    int zero;                      /* ZeRO stage 0..3 (moot on one rank) */
    int tp, pp, ep;                /* tensor, pipeline, expert parallelism (1: none) */
    zo_plan_schedule schedule;     /* serial, overlap, dpu */
    zo_plan_tier params;           /* full: the weights; lora, qlora: the frozen base */
    zo_plan_tier adapters;         /* lora, qlora: the adapters (the weights trained) */
    double optimizer[ZO_PLAN_TIERS]; /* the optimizer state's fractions per tier */
    int moe;                       /* the model has mixture-of-experts layers */
    zo_plan_opt_state optim_dtype; /* AdamW's m and v: fp32, bf16, 8bit */
    zo_plan_master master;         /* fp32, or none (with its rounding) */
    int loss_chunk;                /* > 0: the loss in chunks of this many tokens (runs) */
} zo_run_shape;

/* One rank, ZeRO 0, no tp/pp/ep, full fine-tuning, serial, everything on
 * the GPU but the optimizer (cpu). */
void zo_run_shape_defaults(zo_run_shape *r);

/* The shape of plan p (its method, parallel layout, schedule, placement). */
void zo_run_shape_from_plan(const zo_plan *p, zo_run_shape *out);

/* What the table says of one combination. */
typedef enum zo_capability_gap {
    ZO_CAP_RUNS = 0,
    ZO_CAP_TENSOR_PARALLEL,        /* tp > 1 */
    ZO_CAP_PIPELINE_PARALLEL,      /* pp > 1 */
    ZO_CAP_EXPERT_PARALLEL,        /* ep > 1 on a model without experts */
    ZO_CAP_ZERO12_OFFLOADED,       /* ZeRO 1-2 on several ranks, trained weights off the GPU */
    ZO_CAP_DPU_GPU_OPTIMIZER,      /* dpu with optimizer state on the GPU */
    ZO_CAP_MOE_STATE8_GPU,         /* a mixture of experts with 8-bit m, v in the GPU's optimizer state */
    ZO_CAP_NO_MASTER,              /* no fp32 master with optimizer state on NVMe */
    ZO_CAP_GAPS,
} zo_capability_gap;

/* The table, as data: each gap's name (a stable word, for reports and
 * tests) and why the runtime does not run it. */
typedef struct zo_capability_entry {
    zo_capability_gap gap;
    const char *name;              /* "tensor-parallel", ... */
    const char *why;               /* the reason, a sentence without the run's values */
} zo_capability_entry;
extern const zo_capability_entry zo_capability_table[ZO_CAP_GAPS - 1];

/* The first gap run r falls into, ZO_CAP_RUNS when it runs. Pure: no
 * message, no allocation (a search may call it for every candidate). */
zo_capability_gap zo_capability_find(const zo_run_shape *r);

/* ZO_OK when the runtime runs r; otherwise ZO_ERR_UNSUPPORTED with one
 * message naming what does not run with the run's values, the flags that
 * set them (the names memplan and train share) and the plan fields, and
 * what runs instead: recorded as the last error (zo_last_error), and also
 * written into why[len] when why is not NULL. */
zo_status zo_capability_check(const zo_run_shape *r, char *why, size_t len);

/* The same for plan p. */
zo_status zo_capability_check_plan(const zo_plan *p, char *why, size_t len);

#endif
