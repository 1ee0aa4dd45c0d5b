/* When a configuration does not fit: every alternative that does, each one
 * applied and estimated, fastest first.
 *
 * An alternative is a change to the configuration and the command-line flags
 * that make it. Its kind names the family of changes that produced it: the
 * offload ladder (recompute, and where weights, gradients, optimizer
 * state and checkpoints live) and trainable subsets (LoRA, QLoRA: adapters on
 * a frozen base, each on its own ladder), each a generator in suggest.c,
 * listed and ranked the same way. */
#ifndef ZO_PLANNER_SUGGEST_H
#define ZO_PLANNER_SUGGEST_H

#include "planner/cost.h"
#include "planner/memory.h"

typedef enum plan_alt_kind {
    PLAN_ALT_OFFLOAD = 0, /* recompute and placement: ZeRO-Offload, ZeRO-Infinity */
    PLAN_ALT_LORA,        /* LoRA adapters on a 16-bit frozen base */
    PLAN_ALT_QLORA,       /* LoRA adapters on an NF4 frozen base */
    PLAN_ALT_ADAMW8BIT,   /* full fine-tuning with 8-bit m and v (issue 30) */
    PLAN_ALT_KINDS,
} plan_alt_kind;

const char *plan_alt_kind_name(plan_alt_kind k); /* "offload", "lora", "qlora", "adamw8bit" */

#define PLAN_SUGGEST_MAX 32

typedef struct plan_alternative {
    plan_alt_kind kind;
    char flags[192];            /* added to the command line: "--grads cpu --optimizer cpu" */
    char what[160];             /* in words: "ZeRO-Offload: gradients and optimizer on the CPU" */
    plan_train t;               /* the configuration the flags select */
    uint64_t total[ZO_PLAN_TIERS]; /* bytes per rank */
    plan_time time;             /* its predicted step */
} plan_alternative;

typedef struct plan_suggestions {
    int n;                      /* alternatives that fit, fastest first */
    int tried;                  /* distinct alternatives estimated */
    plan_alternative alt[PLAN_SUGGEST_MAX];
} plan_suggestions;

/* Every alternative to `t` that fits `hw`, ranked by predicted step time,
 * less those that only add a setting that changes nothing (another row fits
 * with a subset of its flags and is as fast); out->n is 0 when none does. */
zo_status plan_suggest(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                       plan_suggestions *out);

/* The flags that turn `from` into `to` (memplan estimate's spelling), for the
 * fields a suggestion or a searched plan sets: parallel degrees, ZeRO,
 * micro-batch, accumulation, recompute, placement, prefetch, LoRA / QLoRA
 * (against --lora's defaults when `from` trains everything), the optimizer
 * schedule. "" when equal. */
void plan_train_flags(const plan_train *from, const plan_train *to, char *buf, size_t len);

#endif
