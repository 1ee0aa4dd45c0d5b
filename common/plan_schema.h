/* The plan file (docs/plan-format.md): one schema, one writer, one reader and
 * one table of fields with their ranges, shared by the planner (memplan
 * writes plans and reads them back) and the runtime (train executes them).
 * Depends on common and cJSON only: the runtime reads the planner's plan,
 * never its internals.
 *
 * A plan is one JSON object, "format": "zoffload-plan", "version": 1. Every
 * field is required except the objects "hardware" and "predicted" (each
 * present whole or absent), "training.lora" (present exactly when
 * "training.method" is lora or qlora) and, for a model known only by its
 * size ("model.params_only"), the model's shape (its "features" included),
 * and the fields added after plans were written (absent: their default).
 * Unknown fields are refused by name; messages name the file and the field. */
#ifndef ZO_COMMON_PLAN_SCHEMA_H
#define ZO_COMMON_PLAN_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "dtype.h"
#include "lora.h" /* defines: zo_lora_config */
#include "model_config.h"
#include "plan_vocab.h" /* defines: zo_plan_tier, zo_plan_method, ... and their names */
#include "status.h"

#define ZO_PLAN_FORMAT "zoffload-plan"
#define ZO_PLAN_VERSION 1
#define ZO_HW_FORMAT "zoffload-hw"
#define ZO_HW_VERSION 1
/* nvme.dir as memplan writes it: the runtime's flag or environment names the
 * directory on the NVMe drive. */
#define ZO_PLAN_NVME_DIR_PLACEHOLDER "${ZO_NVME_DIR}"
/* Streamed blocks resident ahead of compute: the runtime's slot limit. */
#define ZO_PLAN_MAX_PREFETCH 16
/* Plan files larger than this are refused unread. */
#define ZO_PLAN_MAX_BYTES (16u << 20)

/* A hardware profile: a plan's "hardware" and the file `memplan calibrate`
 * writes ("format": "zoffload-hw"). The planner's plan_hw. */
typedef struct zo_hw_profile {
    char name[48];
    char gpu[24];            /* "H100-80GB" */
    int gpus;                /* GPUs in the job (ranks) */
    int gpus_per_node;
    uint64_t gpu_mem;        /* bytes per GPU */
    uint64_t cpu_mem;        /* bytes per node */
    uint64_t nvme;           /* bytes per node */
    double nvme_read_bw;     /* bytes/s per node */
    double nvme_write_bw;    /* bytes/s per node */
    double nvme_read_bw_busy; /* bytes/s per node of a read beside compute on the same cores
                                (memplan calibrate: its read beside an OpenMP triad on every
                                thread): memplan generate's rate of the CPU
                                backend's reads while its cores compute; 0: nvme_read_bw
                                (optional in a file) */
    double pcie_bw;          /* bytes/s per GPU, each direction, achieved */
    double nvlink_bw;        /* bytes/s per GPU, one direction, to the GPUs of its node: NVLink,
                                or PCIe peer-to-peer where the GPU has no NVLink */
    int peers_via_host;      /* 1: the GPUs of a node have no peer-to-peer path (GeForce
                                cards): they exchange through host memory, each byte written
                                by one GPU and read by the other (optional in a file: 0) */
    double net_bw;           /* bytes/s per GPU across nodes */
    double hbm_bw;           /* bytes/s */
    double peak_flops_16;    /* dense fp16/bf16 tensor FLOP/s */
    double peak_flops_32;    /* dense fp32 (TF32 where the GPU has it) FLOP/s */
    double cpu_mem_bw;       /* bytes/s per node */
    int cpu_cores;           /* per node */
    /* cost model (docs/memplan.md, "Time"): */
    double gemm_eff_max;     /* matmul efficiency of large operations, fraction of peak */
    double gemm_flops_half;  /* FLOPs of one matmul at half of gemm_eff_max */
    double hbm_eff;          /* fraction of hbm_bw that elementwise kernels reach */
    double coll_eff;         /* fraction of a link's bandwidth a collective reaches (busbw) */
    double nvlink_lat;       /* seconds per step of a collective inside a node */
    double net_lat;          /* seconds per step of a collective across nodes */
    double cpu_adam_rate;    /* AdamW parameters/s per node on the CPU; 0: from cpu_mem_bw */
    double cpu_adam_thread_rate; /* AdamW parameters/s of one thread; 0: cpu_adam_rate /
                                    cpu_cores when cpu_adam_rate is given, else 5e8 */
    int pcie_gen, pcie_lanes; /* the host link as it runs (0: not described); pcie_bw follows */
    int measured;            /* 1: a profile written by `memplan calibrate` */
    char note[160];          /* what a profile could not measure (e.g. "no GPU") */
} zo_hw_profile;

typedef struct zo_plan_training {
    int seq, micro_batch;
    int grad_accum;               /* micro-batches per step per data-parallel rank */
    zo_dtype dtype, grad_dtype;   /* weights and activations; gradients on the device */
    zo_plan_optimizer optimizer;
    zo_plan_opt_state optim_dtype; /* AdamW's m and v: fp32, bf16, 8bit (issue 30). Optional
                                     in the file (fp32) */
    zo_plan_master master;        /* the trained weights' master copy: fp32, or none with the
                                     16-bit update rounded to nearest, stochastically, or
                                     Kahan-compensated. Optional (fp32) */
    int loss_chunk;               /* > 0: output layer and cross-entropy this many tokens at a
                                     time. Optional (0: whole) */
    zo_plan_recompute recompute;
    int recompute_layers;         /* recompute full: 0 every layer; K > 0 only K layers of each
                                     pipeline stage (the rest keep all their activations).
                                     Optional in the file (0) */
    zo_dtype reduce_dtype;        /* the gradients' data-parallel reduction and its buckets.
                                     Optional in the file (fp32, the runtime's) */
    int flash_attn, dropout;
    /* how the trainer schedules (the planner's time only, docs/memplan.md "Time") */
    int dp_overlap;               /* gradient reduction overlaps the last backward */
    int fused_grad_accum;         /* the weight-gradient GEMM adds into the gradient buffer */
    zo_plan_method method;        /* full, lora or qlora */
    zo_plan_schedule optimizer_schedule; /* serial, overlap or dpu */
    int dpu_warmup;               /* dpu: serial steps before the delayed update starts */
    int opt_threads;              /* CPU threads the optimizer runs on; 0: the host's cores
                                     (less one per rank beside the GPU's work) */
    int clip_stale;               /* clipping takes the previous step's norm (overlap) */
    int has_lora;                 /* "training.lora" is present: method lora or qlora */
    zo_lora_config lora;          /* r, alpha, targets (ZO_LORA_* bits) */
} zo_plan_training;

typedef struct zo_plan_parallel {
    int dp, tp, pp, vpp;          /* vpp: model chunks per pipeline stage */
    int sp;                       /* sequence parallelism */
    int ep;                       /* expert parallelism (MoE): experts over ep of the dp ranks */
    double capacity_factor;       /* MoE: tokens an expert takes, x its fair share; 0: dropless */
    int zero;                     /* ZeRO stage 0..3 */
} zo_plan_parallel;

typedef struct zo_plan_placement {
    zo_plan_tier params;          /* gpu, cpu or nvme */
    zo_plan_tier grads;           /* gpu or cpu */
    zo_plan_tier checkpoints;     /* gpu or cpu */
    zo_plan_tier adapters;        /* LoRA/QLoRA: where the adapters live (gpu, cpu, nvme);
                                     full: gpu */
    double optimizer[ZO_PLAN_TIERS]; /* fractions of the optimizer state, summing to 1 */
} zo_plan_placement;

typedef struct zo_plan_nvme {
    char dir[4096];               /* ZO_PLAN_NVME_DIR_PLACEHOLDER or a directory */
    uint64_t sub_group;           /* parameters per optimizer sub-group (the swap unit) */
    int swap_buffers;             /* sub-groups of pinned buffers in the swap pipeline */
} zo_plan_nvme;

typedef struct zo_plan_buffers {
    int prefetch_depth;           /* streamed blocks resident ahead of compute */
    uint64_t comm_bucket_elems;
    int comm_buckets;
    uint64_t pinned_staging;      /* bytes; 0: derived */
    uint64_t cuda_context, cublas_workspace; /* bytes reserved */
    double fragmentation;         /* allocator allowance, fraction of the GPU total */
} zo_plan_buffers;

typedef struct zo_plan_predicted {
    uint64_t peak_bytes[ZO_PLAN_TIERS];     /* per rank and tier */
    uint64_t capacity_bytes[ZO_PLAN_TIERS]; /* what they were checked against */
    /* of peak_bytes, what the runtime's allocations reach (its measured
     * peak): the peak less what no allocation of the runtime makes (the CUDA
     * context, the cuBLAS workspace, the fragmentation allowance) */
    uint64_t alloc_bytes[ZO_PLAN_TIERS];
    int has_alloc; /* "predicted.alloc_bytes" is present (plans written before it lack it) */
    int fits;
    double step_s, tokens_per_s, mfu;
} zo_plan_predicted;

typedef struct zo_plan {
    zo_model_config model;        /* model.params_override != 0: known only by its size */
    int has_hardware;             /* the "hardware" object is present */
    zo_hw_profile hardware;
    zo_plan_training training;
    zo_plan_parallel parallel;
    zo_plan_placement placement;
    zo_plan_nvme nvme;
    zo_plan_buffers buffers;
    int has_predicted;            /* the "predicted" object is present */
    zo_plan_predicted predicted;
} zo_plan;

/* A valid plan for model `m` (copied) with everything on the GPU: its
 * positions as seq, micro-batch 1, no accumulation, bf16, AdamW, no
 * recompute, gradient reduction overlapped, full fine-tuning, the serial
 * optimizer schedule (DPU warm-up 10, optimizer threads 0, exact
 * clipping), one rank (EP 1, dropless),
 * prefetch 2, sub-group 1M, 3 swap buffers, no reserved
 * buffers, the NVMe placeholder, no hardware and no prediction. */
void zo_plan_defaults(zo_plan *p, const zo_model_config *m);

/* Check every field against the table and the fractions' sum: the reader's
 * checks on a plan in memory. `what` names it in messages. ZO_ERR_INVALID. */
zo_status zo_plan_check(const zo_plan *p, const char *what);

/* The plan as JSON (after zo_plan_check; `what` names it in messages). The
 * caller owns *out (cJSON_Delete). */
zo_status zo_plan_write_json(const zo_plan *p, const char *what, cJSON **out);

/* Read a plan from JSON text (`len` bytes, need not be terminated); `path`
 * names it in messages. ZO_ERR_FORMAT for anything the schema refuses. */
zo_status zo_plan_read(const char *text, size_t len, const char *path, zo_plan *out);

/* Read a plan file (at most ZO_PLAN_MAX_BYTES). */
zo_status zo_plan_load(const char *path, zo_plan *out);

/* One field's range, by its dotted name ("buffers.prefetch_depth"):
 * ZO_ERR_NOT_FOUND for a name the table lacks or a field that is not a
 * number. */
zo_status zo_plan_field_range(const char *field, double *lo, double *hi);

/* Check a value for a numeric field against the table: the message the
 * reader gives for it after naming the file and the field ("V is out of
 * range [LO, HI]"). For flags that set a plan field; ZO_ERR_INVALID. */
zo_status zo_plan_field_check(const char *field, double value);

/* A flag's value for a numeric field of the plan (memplan's and train's
 * flags alike): parsed, then checked against the table, the message naming
 * the flag: "--prefetch: 0 is out of range [1, 16]", the same verdict a plan
 * file holding the value gets. An integer; a number; a size in bytes (units
 * allowed, zo_parse_size) or, with `count`, a count (K/M/B/T,
 * zo_parse_count). ZO_ERR_INVALID. */
zo_status zo_plan_flag_int(const char *s, const char *flag, const char *field, long *out);
zo_status zo_plan_flag_double(const char *s, const char *flag, const char *field, double *out);
zo_status zo_plan_flag_u64(const char *s, const char *flag, const char *field, int count,
                           uint64_t *out);

/* Whether this project's runtime runs what the plan asks, field by field
 * where memplan plans beyond it (docs/plan-format.md, "Against the run"):
 * recompute "ops" (by op, every other matmul) runs for dense layers (full
 * fine-tuning, LoRA, QLoRA) with checkpoints on the GPU and is refused otherwise, naming
 * the field; recompute full of part of the layers
 * (training.recompute_layers) and a reduction in bf16 or fp16
 * (training.reduce_dtype) run. gpt-oss routes dropless: a
 * parallel.capacity_factor is refused, naming the field.
 * ZO_ERR_UNSUPPORTED. zo_plan_check_run checks it too. */
zo_status zo_plan_runtime_check(const zo_plan *p, const char *path);

/* Of a run of model m with capacity factor (0: dropless), the plan field
 * the runtime does not run for that model ("parallel.capacity_factor":
 * gpt-oss routes dropless), or NULL where it runs. zo_plan_runtime_check
 * refuses by it; memplan's search for a plan file leaves such
 * configurations out. */
const char *zo_model_run_gap(const zo_model_config *m, double capacity_factor);

/* Whether a plan can run here: the model `m` has the plan's parameter count
 * and shape (layers, widths, heads, vocabulary, biases, tied embeddings, and
 * the features of its family: positions, norms, experts, latent attention),
 * the run's `world_size` ranks are the plan's dp x tp x pp, and the runtime
 * runs what it asks (zo_plan_runtime_check). Messages name the plan (`path`)
 * and both values. ZO_ERR_INVALID (ZO_ERR_UNSUPPORTED for the runtime's
 * refusals). */
zo_status zo_plan_check_run(const zo_plan *p, const zo_model_config *m, int world_size,
                            const char *path);

/* The "model" object alone (its "features" included), as a plan carries it
 * (the estimate's report carries it too). NULL when out of memory. */
cJSON *zo_plan_model_write_json(const zo_model_config *m);

/* ---- hardware profiles ----------------------------------------------------- */

/* The profile as JSON, every field. NULL when out of memory. */
cJSON *zo_hw_profile_write_json(const zo_hw_profile *hw);

/* Read a profile object. ZO_HW_READ_PARTIAL: fields absent keep the values in
 * *hw and "base" (a preset for the caller to apply first) is allowed, and the
 * result is checked whole; else every field is required. `prefix` is prepended to field names in messages
 * ("hardware." inside a plan, "" for a profile file). ZO_ERR_FORMAT. */
enum { ZO_HW_READ_PARTIAL = 1 };
zo_status zo_hw_profile_read_json(const cJSON *o, const char *path, const char *prefix,
                                  unsigned flags, zo_hw_profile *hw);

#endif
