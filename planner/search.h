/* The search: every feasible configuration of a model on given hardware,
 * ranked by predicted step time (or memory, or GPU-seconds per token).
 *
 * Enumerates GPU count (up to --max-gpus), TP (dividing heads and kv heads,
 * within a node) x PP (dividing layers) x DP, EP (MoE: dividing DP and the
 * experts), micro-batch (the gradient
 * accumulation follows from the global batch), interleaving, SP, recompute
 * (none, selective, ops, full, and full of the fewest layers of a stage that
 * fill the GPU, or more where they take the same step: recompute_layers),
 * ZeRO stage, where weights / gradients / optimizer state (fractions) /
 * checkpoints live, and prefetch depth. Memory is checked before time; the
 * per-micro-batch time is computed once per outer configuration. Plans whose
 * scores tie (within 1e-9 relative) rank by GPU bytes, then by layers
 * recomputed, fewer first. Pure C, no I/O, no allocation. */
#ifndef ZO_PLANNER_SEARCH_H
#define ZO_PLANNER_SEARCH_H

#include "planner/cost.h"
#include "planner/memory.h"

typedef enum plan_objective {
    PLAN_OBJ_TIME = 0, /* seconds per step */
    PLAN_OBJ_MEMORY,   /* GPU bytes per rank (then time) */
    PLAN_OBJ_COST,     /* GPU-seconds per token: step x GPUs / tokens */
} plan_objective;

#define PLAN_TOP_MAX 16
#define PLAN_OPT_STEPS_MAX 100 /* the finest optimizer split searched: 1/100 */

typedef struct plan_space {
    int gpus;              /* the job's GPUs; with max_gpus, the most tried */
    int max_gpus;          /* > 0: also try fewer GPUs (powers of two, whole nodes) */
    int global_batch;      /* sequences per step */
    int max_micro_batch;   /* largest micro-batch tried (powers of two) */
    int max_vpp;           /* most model chunks per stage tried */
    int opt_steps;         /* GPU/CPU/NVMe optimizer split in 1/opt_steps (10: 0.1) */
    int max_prefetch;      /* prefetch depths 1..max_prefetch for streamed weights */
    int allow_offload;     /* 0: everything on the GPU */
    int allow_nvme;        /* 0: nothing on NVMe */
    int zero_min, zero_max;
    int tp, pp;            /* > 0: fixed */
    plan_pp_schedule pp_schedule; /* whose pipeline engine times the layouts with PP > 1 */
    int ep;                /* > 0: fixed; else every EP dividing DP and the experts (MoE) */
    int recompute;         /* -1: all; else a zo_plan_recompute */
    int runtime_plans;     /* 1: only what the runtime runs (a plan file for train): what the
                              capability table (common/capability.h) runs (recompute ops and
                              full of part of the layers run) */
    int params_on;         /* -1: free; else the zo_plan_tier of the weights */
    int opt_on;            /* -1: free; else all optimizer state on this zo_plan_tier */
    double opt_min[ZO_PLAN_TIERS]; /* the least share of the optimizer state on each zo_plan_tier */
    int schedule;          /* -1: every optimizer schedule; else a zo_plan_schedule */
    int adapters_on;       /* LoRA: -1 free; else the zo_plan_tier of the adapters */
    unsigned methods;      /* 1 << zo_plan_method of each method searched (base.lora the
                              adapters'); 0: base.method alone */
    unsigned opt_states;   /* AdamW's m and v encodings tried, bits (1 << zo_plan_opt_state);
                              0: base.opt_state alone (memplan plan --optim-dtype auto: all) */
    plan_objective objective;
    double max_step;       /* > 0 (PLAN_OBJ_TIME only): a cap on the step, seconds. A layout
                              whose plan_time_floor exceeds it (every plan of it steps more) is
                              not walked, so every plan that steps at most max_step, and every
                              plan ranked before one of those, is ranked as without the cap:
                              the ranking, down to its last plan of step <= max_step, is the
                              uncapped one, and none of its plans steps <= max_step where no
                              plan does. configs and feasible count what was walked. 0: none */
    int no_bound;          /* (tests, bench_planner) 1: the step-time and cost searches walk
                              every layout, fewer GPUs first, without their bound (search.c,
                              layout_bound: once the ranking holds `top` plans, a layout whose
                              plan_time_floor's score is above the last's is skipped, and the
                              step-time search walks --max-gpus from the most GPUs; the
                              ranking is the same either way) */
    /* (tests) when set, called with every plan ranked (each schedule of each configuration
       that fits) and the floor of its layout, which its step is at least */
    void (*visit)(void *arg, const plan_train *t, int gpus, double step, double floor);
    void *visit_arg;
    plan_train base;       /* dtype, grad dtype, optimizer, seq, flash, dropout, buffers */
} plan_space;

typedef struct plan_candidate {
    plan_train t;
    int gpus;
    double score;
    plan_time time;
    uint64_t total[ZO_PLAN_TIERS]; /* bytes per rank */
} plan_candidate;

typedef struct plan_result {
    plan_candidate best[PLAN_TOP_MAX];
    int n_best;
    uint64_t configs;      /* configurations enumerated (each one memory-checked) */
    uint64_t feasible;     /* of those, fitting every tier (each one costed) */
    uint64_t layouts;      /* parallel layouts met (GPUs, TP, PP, interleaving, SP, EP,
                              micro-batch, recompute: one micro-batch time each) */
    uint64_t skipped;      /* of those, not walked: their step floor above the cap (max_step)
                              or the ranking's bound */
} plan_result;

/* memplan plan's state hint: an encoding of AdamW's m and v worth a line
 * when it takes at most 1/PLAN_STATE_HINT of the 32-bit state's step (or
 * fits where that does not); its search is capped at that step. */
#define PLAN_STATE_HINT 1.5

/* Defaults: the model's sequence, global batch 8 x GPUs, micro-batches up to
 * 16, interleaving up to 4, optimizer split in tenths, prefetch 1..3,
 * offload and NVMe allowed, ZeRO 0..3, everything else free. */
void plan_space_defaults(plan_space *s, const zo_model_config *m, const plan_hw *hw);

/* Search; the best `top` (<= PLAN_TOP_MAX) distinct plans in out->best,
 * best first. n_best is 0 when nothing fits. */
zo_status plan_search(const zo_model_config *m, const plan_hw *hw, const plan_space *s, int top,
                      plan_result *out);

/* What is trained, in words: "full fine-tuning", "QLoRA r 16 on all-linear". */
const char *plan_method_words(const plan_train *t, char *buf, size_t len);

/* How `c` differs from `best`, in words ("TP 4 instead of 8; optimizer on
 * the CPU instead of the GPU; 12% slower"). */
void plan_describe_diff(const plan_candidate *best, const plan_candidate *c, char *buf,
                        size_t len);

/* Why the plan puts each kind of state where it does, one reason per line
 * ("optimizer 60% CPU / 40% NVMe because the node's CPU memory is 512 GiB,
 * 64 GiB per rank"): each offloaded kind is tried back on a faster tier. */
void plan_explain(const zo_model_config *m, const plan_hw *hw, const plan_candidate *c, char *buf,
                  size_t len);

/* ---- max-model ------------------------------------------------------------------ */

typedef enum plan_strategy {
    PLAN_STRAT_DP = 0,       /* data parallel, everything on the GPU */
    PLAN_STRAT_ZERO1,
    PLAN_STRAT_ZERO2,
    PLAN_STRAT_ZERO3,
    PLAN_STRAT_3D,           /* TP x PP x DP with ZeRO-1, on the GPU */
    PLAN_STRAT_OFFLOAD,      /* ZeRO-Offload: ZeRO-2, gradients + optimizer on the CPU */
    PLAN_STRAT_INF_CPU,      /* ZeRO-Infinity: ZeRO-3, everything on the CPU */
    PLAN_STRAT_INF_NVME,     /* ZeRO-Infinity: weights and optimizer on NVMe */
    PLAN_STRATEGIES,
} plan_strategy;

const char *plan_strategy_name(plan_strategy s);

/* A member of `family` ("gpt", "llama") with about `params` parameters: the
 * presets' shapes interpolated in log space (beyond the largest, its aspect
 * kept), hidden a multiple of 128 (heads of 128), layers an integer. */
zo_status plan_family_shape(const char *family, double params, zo_model_config *out);

/* The same with heads a multiple of `tp` and layers a multiple of `pp`: the
 * shapes a TP x PP layout can run. */
zo_status plan_family_shape_div(const char *family, double params, int tp, int pp,
                                zo_model_config *out);

/* The largest model of `family` that fits `hw` with `strategy` (a search
 * over its space: micro-batch 1, any recompute, prefetch, checkpoints);
 * *params 0 when even the smallest does not fit. 3-D parallelism searches
 * each TP x PP layout over the shapes it can run (heads divisible by TP,
 * layers by PP), where fitting is monotone in the size, and keeps the
 * largest. */
zo_status plan_max_model(const char *family, const plan_hw *hw, const plan_space *base,
                         plan_strategy strategy, zo_model_config *shape, plan_candidate *plan,
                         uint64_t *params);

#endif
