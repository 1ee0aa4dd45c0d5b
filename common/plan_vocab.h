/* The run vocabulary: the words a plan, memplan's flags and the runtime's
 * reading of a plan share (docs/plan-format.md). One enum for each, its
 * names (the plan schema's table reads and writes them), the parsing of a
 * flag's value, and the optimizer's split over the tiers: one parser and
 * one checker for its fractions.
 *
 * Depends on common/status.h only: the planner's memory model and the plan
 * schema both include it, the runtime reads it through the schema. */
#ifndef ZO_COMMON_PLAN_VOCAB_H
#define ZO_COMMON_PLAN_VOCAB_H

#include <stddef.h>

#include "status.h"

/* Where a kind of state lives. */
typedef enum zo_plan_tier {
    ZO_PLAN_GPU = 0,
    ZO_PLAN_CPU,
    ZO_PLAN_NVME,
    ZO_PLAN_TIERS,
} zo_plan_tier;

/* Activation recomputation. */
typedef enum zo_plan_recompute {
    ZO_PLAN_RECOMPUTE_NONE = 0,
    ZO_PLAN_RECOMPUTE_SELECTIVE, /* recompute the attention core (the s^2 terms) */
    ZO_PLAN_RECOMPUTE_FULL,      /* keep only each layer's input (with recompute_layers K:
                                    only K layers of a stage; the rest keep everything) */
    ZO_PLAN_RECOMPUTE_OPS,       /* keep the attention's output and every other matmul's;
                                    recompute the rest (PyTorch's selective activation
                                    checkpointing by op, torchtitan's "selective op") */
    ZO_PLAN_RECOMPUTES,
} zo_plan_recompute;

/* AdamW: an fp32 master copy, m and v; SGD: the master copy and momentum. */
typedef enum zo_plan_optimizer { ZO_PLAN_ADAMW = 0, ZO_PLAN_SGD } zo_plan_optimizer;

/* What is trained (docs/memplan.md, "LoRA and QLoRA"): every parameter, or
 * LoRA adapters on a frozen base kept in the model dtype (lora) or with its
 * layers' linear weights in NF4 (qlora). */
typedef enum zo_plan_method { ZO_PLAN_FULL = 0, ZO_PLAN_LORA, ZO_PLAN_QLORA } zo_plan_method;

/* When the CPU optimizer runs (docs/memplan.md, "Optimizer schedules"). */
typedef enum zo_plan_schedule {
    ZO_PLAN_SCHED_SERIAL = 0, /* after the backward: forward + backward, then the update */
    ZO_PLAN_SCHED_OVERLAP,    /* block by block beside the GPU's work */
    ZO_PLAN_SCHED_DPU,        /* delayed parameter update: step t's beside step t+1 */
    ZO_PLAN_SCHEDULES,
} zo_plan_schedule;

/* Each enum's names by value, NULL-terminated: the plan file's words. */
extern const char *const zo_plan_tier_names[];      /* "gpu", "cpu", "nvme" */
extern const char *const zo_plan_host_tier_names[]; /* "gpu", "cpu": what cannot live on NVMe */
extern const char *const zo_plan_recompute_names[]; /* "none", "selective", "full", "ops" */
extern const char *const zo_plan_optimizer_names[]; /* "adamw", "sgd" */
extern const char *const zo_plan_method_names[];    /* "full", "lora", "qlora" */
extern const char *const zo_plan_schedule_names[];  /* "serial", "overlap", "dpu" */

/* A value's name; "?" for one out of range. */
const char *zo_plan_tier_name(zo_plan_tier t);
const char *zo_plan_recompute_name(zo_plan_recompute r);
const char *zo_plan_optimizer_name(zo_plan_optimizer o);
const char *zo_plan_method_name(zo_plan_method m);
const char *zo_plan_schedule_name(zo_plan_schedule s);

/* "a, b or c" of a NULL-terminated list of names, into buf. */
void zo_plan_names_list(const char *const *names, char *buf, size_t len);

/* A flag's value, one of `names` (case ignored) into *out (its index):
 * "FLAG: 'V' is not a, b or c" (ZO_ERR_INVALID) otherwise. */
zo_status zo_plan_name_parse(const char *const *names, const char *s, const char *flag, int *out);

/* The flags' readers of each word ("adam" is AdamW too). A tier: "FLAG: 'V'
 * is not one of gpu, cpu, nvme" (gpu, cpu without `allow_nvme`). */
zo_status zo_plan_tier_parse(const char *s, const char *flag, int allow_nvme, zo_plan_tier *out);
zo_status zo_plan_recompute_parse(const char *s, const char *flag, zo_plan_recompute *out);
zo_status zo_plan_optimizer_parse(const char *s, const char *flag, zo_plan_optimizer *out);
zo_status zo_plan_schedule_parse(const char *s, const char *flag, zo_plan_schedule *out);

/* ---- the optimizer's split over the tiers -------------------------------------- */

/* Fractions of the optimizer state per tier, each in [0, 1], summing to 1
 * (within ZO_PLAN_FRACTION_EPS) with `sum_one`, else to at most 1 (lower
 * bounds such as memplan's --optimizer-min). */
#define ZO_PLAN_FRACTION_EPS 1e-6

/* Check `frac`: "FLAG: fraction cpu=1.5 is outside [0, 1]", or "FLAG: WHAT
 * sum to 0.8, not 1" ("more than 1" without `sum_one`); `what` names the
 * fractions ("fractions", "the fractions", "fractions in 'cpu=0.5'").
 * ZO_ERR_INVALID. */
zo_status zo_plan_fractions_check(const double frac[ZO_PLAN_TIERS], int sum_one, const char *flag,
                                  const char *what);

/* A flag's fractions: one tier ("cpu": all of it there) or TIER=FRACTION
 * pairs separated by commas ("gpu=0.2,cpu=0.5,nvme=0.3"; tiers not named get
 * 0), then checked as above. Messages name `flag`; ZO_ERR_INVALID. */
zo_status zo_plan_fractions_parse(const char *s, const char *flag, int sum_one,
                                  double frac[ZO_PLAN_TIERS]);

#endif
