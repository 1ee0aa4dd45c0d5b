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

/* AdamW's m and v (issue 30; cpu_adam's adam_state encodings): fp32;
 * bf16 (torchtune's and LLaMA-Factory's pure-bf16 recipes); block-wise
 * 8-bit with one fp32 absmax per block of 2048 (Dettmers et al., "8-bit
 * Optimizers via Block-wise Quantization", ICLR 2022: bitsandbytes'
 * adamw8bit). memplan's `--optim adamw8bit` and `--optim-dtype bf16`. */
typedef enum zo_plan_opt_state {
    ZO_PLAN_STATE_FP32 = 0,
    ZO_PLAN_STATE_BF16,
    ZO_PLAN_STATE_8BIT,
    ZO_PLAN_STATES,
} zo_plan_opt_state;

/* The block of the 8-bit state, and its bytes a parameter (m and v codes,
 * an fp32 absmax each a block): 2 + 8/2048. */
#define ZO_PLAN_STATE_8BIT_BLOCK 2048
double zo_plan_state_bytes(zo_plan_opt_state s);

/* The runtime keeps bf16 and 8-bit m and v in chunks of at most this many
 * elements (a multiple of the block), each decoded into fp32 scratch for its
 * update: 8 bytes an element of scratch per CPU-updated shard (memory, NVMe),
 * of min(this, the shard's or sub-group's elements rounded up to a block). */
#define ZO_PLAN_STATE_CHUNK (1u << 18)

/* The GPU optimizer share moves its state buffers (and, without a master,
 * its bf16 weights) between the device and the host this many values at a
 * time (weights in and out, checkpoints), through a host stage of them in
 * fp32 and coded: 1 MiB of fp32 m and v, 64 8-bit blocks. */
#define ZO_PLAN_GPU_STAGE (64u * ZO_PLAN_STATE_8BIT_BLOCK)

/* The trained weights' master copy: fp32 (the default), or none, the 16-bit
 * weights updated in place by the optimizer: rounded to nearest (as
 * PyTorch's bf16 arithmetic in the QLoRA paper's adapters and the pure-bf16
 * recipes), with stochastic rounding (unbiased: an update smaller than half
 * an ulp is kept in expectation), or with Kahan compensation (a bf16
 * compensation buffer holding what the rounding lost, 2 B a parameter). */
typedef enum zo_plan_master {
    ZO_PLAN_MASTER_FP32 = 0,
    ZO_PLAN_MASTER_NONE,       /* 16-bit weights, round to nearest even */
    ZO_PLAN_MASTER_STOCHASTIC, /* 16-bit weights, stochastic rounding */
    ZO_PLAN_MASTER_KAHAN,      /* 16-bit weights and a 16-bit Kahan compensation */
    ZO_PLAN_MASTERS,
} zo_plan_master;

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
extern const char *const zo_plan_opt_state_names[]; /* "fp32", "bf16", "8bit" */
extern const char *const zo_plan_master_names[];    /* "fp32", "none", "stochastic", "kahan" */

/* A value's name; "?" for one out of range. */
const char *zo_plan_tier_name(zo_plan_tier t);
const char *zo_plan_recompute_name(zo_plan_recompute r);
const char *zo_plan_optimizer_name(zo_plan_optimizer o);
const char *zo_plan_method_name(zo_plan_method m);
const char *zo_plan_schedule_name(zo_plan_schedule s);
const char *zo_plan_opt_state_name(zo_plan_opt_state s);
const char *zo_plan_master_name(zo_plan_master m);

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
/* `--optim`: adamw (adam), sgd, or adamw8bit (AdamW with 8-bit m and v; *state
 * is set only by adamw8bit, to ZO_PLAN_STATE_8BIT). */
zo_status zo_plan_optim_parse(const char *s, const char *flag, zo_plan_optimizer *out,
                              int *state_8bit);
/* `--optim-dtype`: fp32, bf16 or 8bit (the m and v encoding). */
zo_status zo_plan_opt_state_parse(const char *s, const char *flag, zo_plan_opt_state *out);
/* `--master`: fp32, none, stochastic or kahan. */
zo_status zo_plan_master_parse(const char *s, const char *flag, zo_plan_master *out);

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
