/* The memory model: bytes per rank, per tier and per kind of state.
 *
 * Pure arithmetic, no I/O: the CLI parses flags and prints. Activations come
 * from a table of what each op of a layer saves for backward (plan_act_table),
 * so the GPT layer gives Korthikanti et al.'s sbh(34 + 5as/h) and its tensor /
 * sequence parallel and recompute variants, and the LLaMA layer its own. */
#ifndef ZO_PLANNER_MEMORY_H
#define ZO_PLANNER_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/lora.h" /* defines: zo_lora_config */
#include "common/model_config.h"
#include "common/plan_vocab.h" /* defines: zo_plan_tier, zo_plan_method, zo_plan_schedule, ... */
#include "common/status.h"
#include "planner/hardware.h"

typedef enum plan_kind {
    PLAN_PARAMS = 0,
    PLAN_GRADS,
    PLAN_OPTIMIZER,
    PLAN_ACTIVATIONS,
    PLAN_BUFFERS,
    PLAN_KINDS,
} plan_kind;

/* --lora R alone: PEFT's defaults (lora_alpha 8; q_proj and v_proj, which
 * on GPT-2 is its fused c_attn) */
#define PLAN_LORA_DEFAULT_ALPHA 8.0f
#define PLAN_LORA_DEFAULT_TARGETS (ZO_LORA_Q | ZO_LORA_V)

/* Working buffers, each a named line with its own flag. */
typedef struct plan_buffers {
    uint64_t cuda_context;     /* bytes the CUDA context and kernels take */
    uint64_t cublas_workspace; /* bytes */
    uint64_t comm_bucket;      /* elements per gradient communication bucket */
    int comm_buckets;          /* buckets in flight (double buffering = 2) */
    int prefetch_depth;        /* streamed blocks resident ahead of compute */
    uint64_t pinned_staging;   /* bytes of pinned host staging; 0 = derived */
    double fragmentation;      /* allocator allowance, fraction of the GPU total */
    uint64_t sub_group;        /* optimizer sub-group, parameters (NVMe swap unit) */
    int swap_buffers;          /* sub-groups of pinned buffers for the NVMe pipeline */
} plan_buffers;

/* What runs the step (docs/memplan.md, "What memplan models"): this project's
 * runtime (its fused attention, norms and activations, and the buffers the
 * estimate lists), or eager PyTorch, whose autograd keeps each op's saved
 * tensors (planner only, never in a plan file). */
typedef enum plan_runtime {
    PLAN_RUNTIME_ZOFFLOAD = 0,
    PLAN_RUNTIME_EAGER,
} plan_runtime;

const char *plan_runtime_name(plan_runtime r); /* "zoffload", "eager" */
zo_status plan_runtime_parse(const char *s, const char *flag, plan_runtime *out);

/* Whose pipeline engine runs the stages (the cost model only, docs/memplan.md
 * "Time"): Megatron-LM's 1F1B (interleaved with --vpp), or DeepSpeed's
 * pipeline engine (its TrainSchedule of 2021: blocking sends one tensor at a
 * time, the stage's output re-gathered over TP in the backward, the tied
 * embedding's gradient all-reduced after the flush, the data-parallel
 * reduction after it). Never in a plan file: the runtime runs no pipeline. */
typedef enum plan_pp_schedule {
    PLAN_PP_MEGATRON = 0,
    PLAN_PP_DEEPSPEED,
} plan_pp_schedule;

const char *plan_pp_schedule_name(plan_pp_schedule s); /* "megatron", "deepspeed" */
zo_status plan_pp_schedule_parse(const char *s, const char *flag, plan_pp_schedule *out);

/* How the layers are split into pipeline stages (--pp-partition): L/p
 * layers a stage (Megatron-LM), or DeepSpeed's PipelineModule partition
 * 'type:transformer|embedding' (Megatron-DeepSpeed's --pp-partition-method,
 * BLOOM's), which balances the transformer layers and the two embedding
 * layers (the input embedding, the tied output one) together: (L + 2)/p a
 * stage, the first and the last stage one layer fewer. */
typedef enum plan_pp_partition {
    PLAN_PP_PARTITION_LAYERS = 0,
    PLAN_PP_PARTITION_EMBEDDING,
} plan_pp_partition;

const char *plan_pp_partition_name(plan_pp_partition p); /* "layers", "embedding" */
zo_status plan_pp_partition_parse(const char *s, const char *flag, plan_pp_partition *out);

/* What eager PyTorch keeps beyond this runtime in the stored layer
 * activations, as a fraction of them, from published measurements
 * (docs/memplan.md, "What memplan models"): LLaMA layers (RMSNorm upcast to
 * fp32, SwiGLU's gate output kept twice) 0.318, from litgpt's LoRA of
 * LLaMA-2-7B (micro-batch 2 against 1 at 1304 tokens: 7.77 GB a sequence
 * where this model counts 6.023 GB, 5.497 GB of it the layers'); GPT layers
 * (LayerNorm, GELU: the same tensors) 0, as litgpt's StableLM-3B measured
 * (2.41 GB a sequence of 1034 tokens where this model counts 2.54 GB). */
#define PLAN_EAGER_LLAMA_EXTRA 0.318
double plan_eager_extra(const zo_model_config *m);
/* Device slots this runtime gives routed experts streamed apart from their
 * MoE layer's dense part (offload.h's OFFLOAD_EXPERT_SLOTS: one computing,
 * the next loading). */
#define PLAN_EXPERT_SLOTS 2

typedef struct plan_train {
    int seq;
    int micro_batch;
    int grad_accum;           /* micro-batches per step per data-parallel rank */
    zo_dtype dtype;           /* weights and activations */
    zo_dtype grad_dtype;      /* gradients on the device (fp32: Megatron's 18 B/param) */
    zo_plan_optimizer optimizer;
    zo_plan_opt_state opt_state; /* AdamW's m and v: fp32, bf16 or 8-bit (issue 30) */
    zo_plan_master master;    /* the trained weights' fp32 master copy, or none (how the 16-bit
                                 update is rounded: nearest, stochastic, Kahan-compensated) */
    int loss_chunk;           /* > 0: the output layer and cross-entropy N tokens at a time
                                 (the fp32 logits of N tokens live, never the whole) */
    int dp, tp, pp, vpp;      /* vpp > 1: interleaved 1F1B with vpp chunks per stage */
    int ep;                   /* expert parallel: MoE experts sharded over ep of the dp ranks */
    double capacity_factor;   /* MoE: tokens an expert takes, x its fair share; 0: dropless */
    int sp;                   /* sequence parallel (with tp) */
    int zero;                 /* 0..3 */
    zo_plan_recompute recompute;
    int recompute_layers;     /* recompute full: 0 every layer; K > 0 the first K layers of each
                                 stage (Megatron's --recompute-num-layers, block method), the
                                 rest keep all their activations */
    zo_dtype reduce_dtype;    /* the gradients' data-parallel reduction (and its buckets) */
    plan_runtime runtime;     /* what runs the step (memory and time) */
    plan_pp_schedule pp_schedule; /* whose pipeline engine (time only) */
    plan_pp_partition pp_partition; /* how the layers are split into stages */
    int flash_attn;
    zo_attn_path attn_path;   /* this runtime's attention kernels (time, and the GPU scratch each
                                 takes from the pool): ZO_ATTN_AUTO (the default) the runtime's
                                 automatic choice, layer by layer; another path as ZO_ATTENTION
                                 forces it (where it does not cover a layer, the automatic choice,
                                 as the runtime falls back); plan_attn_path */
    int dropout;              /* dropout masks saved (GPT default on, LLaMA off) */
    int seq_is_default;       /* seq was not given: plan_train_defaults chose it (reports say so) */
    /* how the runtime schedules two things (cost model only, docs/memplan.md "Time"): */
    int dp_overlap;           /* 1: gradient reduction overlaps the last backward (0: after it,
                                 as Megatron-LM 2021 did) */
    int fused_grad_accum;     /* 1: the weight-gradient GEMM adds into the gradient buffer
                                 (Megatron's gradient-accumulation fusion); 0: a separate pass
                                 per micro-batch (this runtime's staging blocks) */
    zo_plan_method method;    /* full fine-tuning, LoRA or QLoRA */
    zo_lora_config lora;      /* method lora / qlora: rank, alpha, target layers */
    zo_plan_schedule schedule; /* when the CPU optimizer runs (cost model) */
    int dpu_warmup;           /* dpu: serial steps first (reported, not in the step time) */
    int opt_threads;          /* CPU threads per rank for the optimizer; 0: the node's cores
                                 (less one per rank beside the GPU's work), shared by its ranks */
    int clip_stale;           /* overlap: clipping takes the previous step's norm (or is off) */
    zo_plan_tier params_on;   /* GPU, CPU or NVMe (LoRA: the frozen base) */
    zo_plan_tier adapters_on; /* LoRA: where the adapters live (GPU, CPU or NVMe; streamed
                                 like weights when not on the GPU); full: GPU */
    zo_plan_tier grads_on;    /* GPU or CPU */
    zo_plan_tier checkpoints_on; /* GPU or CPU: where stored activations live */
    double opt_frac[ZO_PLAN_TIERS]; /* optimizer state split, sums to 1 */
    plan_buffers buf;
} plan_train;

/* Whether this runtime streams the MoE layers' routed experts apart (full
 * fine-tuning, weights on the host, ZeRO-0 or one rank; not --runtime eager, which
 * sizes its own per-expert blocks): a weight slot then holds the largest
 * dense part, beside PLAN_EXPERT_SLOTS expert slots. */
int plan_experts_apart(const zo_model_config *m, const plan_train *t);

/* The recompute in words: "none", "selective", "ops", "full", or "full, 12
 * layers a stage" (recompute_layers). */
void plan_recompute_words(const plan_train *t, char *buf, size_t len);

/* How much a configuration recomputes, to order them: none 0, selective 1,
 * ops 2, full of part of the layers 3, full of every layer 4. */
int plan_recompute_rank(const plan_train *t);

/* One named line of the estimate. */
typedef struct plan_item {
    const char *name;
    zo_plan_tier tier;
    plan_kind kind;
    uint64_t bytes;
} plan_item;

#define PLAN_MAX_ITEMS 48

typedef struct plan_estimate {
    uint64_t bytes[ZO_PLAN_TIERS][PLAN_KINDS];
    uint64_t total[ZO_PLAN_TIERS];
    uint64_t reserved[ZO_PLAN_TIERS]; /* of total, what no allocation of the runtime makes (the
                                         CUDA context, cuBLAS workspace, attention scratch from
                                         the CUDA pool, fragmentation allowance) */
    uint64_t capacity[ZO_PLAN_TIERS]; /* per rank: CPU and NVMe are the node's share */
    int ranks_per_node;
    int fits;
    int activations_known;     /* 0 for a model known only by its size */
    int stage;                 /* pipeline stage reported: 0 first, pp-1 last */
    uint64_t params;           /* whole model */
    uint64_t stage_params;     /* this rank's parameters before ZeRO sharding */
    uint64_t stage_expert_params; /* of those, routed experts (ZeRO shards them over DP / EP) */
    uint64_t rank_params;      /* held on this rank after ZeRO-3 */
    uint64_t largest_block;    /* elements of the largest streamed block on a rank */
    uint64_t act_layer;        /* bytes the largest layer saves for one micro-batch */
    uint64_t act_layer_full;   /* the same without recompute (what a layer keeps whole) */
    uint64_t act_stage;        /* bytes the stage's layers save for one micro-batch */
    uint64_t eager_extra;      /* GPU bytes an eager PyTorch run of the same setting adds
                                  (plan_eager_extra of the stored layer activations and the
                                  recompute working set); with runtime eager, what the
                                  estimate includes for it */
    /* what is trained and what the GPU computes with (full: the stage's
     * parameters; LoRA: the adapters, beside the frozen base) */
    uint64_t train_params;     /* trainable elements on this rank before ZeRO */
    uint64_t train_expert_params; /* of those, routed experts */
    uint64_t train_largest;    /* trainable elements of the largest block */
    uint64_t train_first, train_layer, train_last; /* trainable elements of the stage's first
                                 block (the embedding on stage 0), of one layer (the stage's
                                 average), of its last block (the head on the last stage) */
    int layers;                /* the stage's layers */
    uint64_t weight_bytes;     /* this rank's weights before ZeRO-3 (LoRA: the frozen base in
                                  its format, and the adapters) */
    uint64_t stream_bytes;     /* of the weights, what streams from the host per pass (after
                                  ZeRO-3; LoRA: the base and the adapters off the GPU) */
    uint64_t stream_nvme_bytes; /* of those, read from NVMe */
    uint64_t largest_bytes;    /* bytes of the largest streamed block */
    uint64_t trainable;        /* whole model: trainable parameters (LoRA: PEFT's count) */
    uint64_t nf4_bytes;        /* QLoRA: of weight_bytes, the NF4 tensors */
    double inflight;           /* micro-batches in flight on this stage */
    double opt_share[ZO_PLAN_TIERS]; /* the optimizer split as the runtime makes it of opt_frac:
                                 the GPU's share whole blocks (plan_gpu_share), NVMe's the
                                 nearest element count of the rest */
    int n_items;
    plan_item items[PLAN_MAX_ITEMS];
} plan_estimate;

const char *plan_kind_name(plan_kind k);   /* "params", "grads", ... */

/* Defaults for a model: its max sequence, micro-batch 1, bf16, AdamW, no
 * parallelism, ZeRO 0, no recompute, flash attention, everything on the GPU,
 * dropout as the architecture has it, working buffers as documented. */
void plan_train_defaults(plan_train *t, const zo_model_config *m);

/* Adjust the defaults to the GPU: fp16 on Volta and older (no bf16 tensor
 * cores); on the CPU backend (--hw cpu) no CUDA context, no cuBLAS
 * workspace and no allocator slack. Called after the defaults and before
 * the user's flags. */
void plan_train_fit_hw(plan_train *t, const plan_hw *hw);

/* Check a configuration against the model and hardware: TP divides heads
 * and kv heads, PP (x VPP) divides layers, DP x TP x PP equals the GPUs,
 * fractions sum to 1, placements are possible. Messages name the flag. */
zo_status plan_train_validate(const plan_train *t, const zo_model_config *m, const plan_hw *hw);

/* The optimizer state's bytes a trained parameter (issue 30): the master
 * copy, then AdamW's m and v (zo_plan_state_bytes) or SGD's fp32 momentum.
 * The master: fp32, 4; none or stochastic, 0 where the optimizer updates
 * the 16-bit weights in their own store (all of its state on the tier the
 * weights live on, GPU or CPU: the QLoRA recipe's adapters), else a 16-bit
 * copy it updates and hands on as it does the fp32 master's rounding, 2;
 * kahan, 2 more for the compensation. */
double plan_opt_master_bytes(const plan_train *t);
double plan_opt_bytes_per_param(const plan_train *t);
/* The estimate's line for the optimizer state ("AdamW: fp32 master, 8-bit m, v"). */
const char *plan_opt_state_words(const plan_train *t);
/* What the encoding and the master cost in accuracy, as the papers found
 * it (the report prints it): "" for fp32 state with an fp32 master. */
const char *plan_opt_accuracy_note(const plan_train *t);

/* The estimate for the pipeline stage that needs the most GPU memory. */
zo_status plan_estimate_run(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                            plan_estimate *out);

/* The same without validating `t` (the search builds valid ones). */
void plan_estimate_unchecked(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                             plan_estimate *out);

/* The transformer layers of pipeline stage `stage` (t->pp_partition) and,
 * in *first, the model's index of its first; the most any stage holds in
 * *most when not NULL. */
int plan_stage_layers(const zo_model_config *m, const plan_train *t, int stage, int *first,
                      int *most);

/* Parameter elements one rank of pipeline stage `stage` holds after TP (and
 * EP for routed experts) and before ZeRO, the largest streamed block
 * (elements) and the stage's layers. */
void plan_stage_shape(const zo_model_config *m, const plan_train *t, int stage,
                      uint64_t *params, uint64_t *largest, int *layers);

/* The optimizer's GPU share as the runtime takes it: the blocks (embedding,
 * layers, head) from the last whose trained elements come nearest
 * opt_frac[GPU] of the stage's, at least one when the fraction is not 0, so
 * that a block's gradient is summed on one side (offload/offload.c). Returns
 * the fraction of the stage's trained elements those blocks hold: 0 or 1
 * exactly at the ends, opt_frac[GPU] for a model known only by its size. */
double plan_gpu_share(const zo_model_config *m, const plan_train *t, int stage);

/* The default --seq when none is given: the model's positions, at most
 * PLAN_DEFAULT_SEQ (docs/memplan.md, "Defaults"). */
#define PLAN_DEFAULT_SEQ 4096
int plan_default_seq(const zo_model_config *m);

/* Warnings about a configuration that is valid but probably not what the
 * user wants (no FlashAttention kernels on the GPU, ...), one per line, into
 * `buf`; returns how many. */
int plan_train_warnings(const plan_train *t, const plan_hw *hw, char *buf, size_t len);

/* ---- the activation table ------------------------------------------------ */

typedef enum plan_act_width {
    PLAN_W_H,      /* s*b*h */
    PLAN_W_Q,      /* s*b*heads*head_dim (MLA: heads*(qk_nope + qk_rope)) */
    PLAN_W_KV,     /* s*b*kv_heads*head_dim: the keys (MLA: as q) */
    PLAN_W_FFN,    /* s*b*ffn */
    PLAN_W_SCORES, /* heads*s*s*b: attention probabilities */
    PLAN_W_HEADS,  /* heads*s*b: per-row softmax statistics */
    PLAN_W_V,      /* s*b*kv_heads*head_dim: the values (MLA: heads*v_dim; this runtime's
                      padded to heads*(qk_nope + qk_rope)) */
    PLAN_W_O,      /* s*b*heads*head_dim: the output projection's input (MLA: heads*v_dim; this
                      runtime's also the attention's output at heads*(qk_nope + qk_rope)) */
    PLAN_W_QLORA,  /* s*b*q_lora_rank (MLA) */
    PLAN_W_KVLORA, /* s*b*(kv_lora_rank + qk_rope) (MLA; this runtime's kv_lora_rank) */
    PLAN_W_NORMS,  /* s*b*h*2 with norms on the attention's and MLP's outputs (Gemma-2, OLMo-2) */
    PLAN_W_ROUTER, /* s*b*experts: the router's logits or probabilities */
    PLAN_W_ROUTED,     /* s*b*plan_routed_rows: the (token, expert) pairs */
    PLAN_W_ROUTED_FFN, /* s*b*plan_routed_rows*expert_ffn */
    PLAN_W_SHARED_FFN, /* s*b*shared_ffn */
    PLAN_W_EP,         /* expert parallelism: the rows a rank's experts can receive (plan_ep_rows) */
    PLAN_W_EP_H,       /* plan_ep_rows * hidden */
    PLAN_W_QK_HEADS,   /* s*b*(heads + kv_heads): a statistic per q and k head (Qwen3); s*b*2 with
                          norms over the whole q and k (OLMo-2: zo_model_qk_norm_rows) */
} plan_act_width;

enum {
    PLAN_ACT_GPT = 1 << 0,      /* only in GPT layers */
    PLAN_ACT_LLAMA = 1 << 1,    /* only in LLaMA layers */
    PLAN_ACT_DROPOUT = 1 << 2,  /* only with dropout */
    PLAN_ACT_S2 = 1 << 3,       /* an s^2 term: gone with flash attention or selective recompute */
    PLAN_ACT_FLASH = 1 << 4,    /* only with flash attention */
    PLAN_ACT_TP = 1 << 5,       /* sharded by tensor parallelism; else only by sequence parallelism */
    PLAN_ACT_DENSE = 1 << 6,    /* only in a dense MLP layer */
    PLAN_ACT_MOE = 1 << 7,      /* only in an MoE layer */
    PLAN_ACT_SEQ = 1 << 8,      /* only when attention and MLP run one after the other */
    PLAN_ACT_TWO_NORMS = 1 << 9, /* only with a norm of its own before the MLP */
    PLAN_ACT_MLA = 1 << 10,     /* only with latent attention */
    PLAN_ACT_QKNORM = 1 << 11,  /* only with q/k norms */
    PLAN_ACT_PRE_NORM = 1 << 12, /* only with norms before the attention and the MLP (not OLMo-2's) */
};

typedef struct plan_act_entry {
    const char *op;     /* "attn.softmax" */
    const char *saved;  /* "output" */
    plan_act_width width;
    int bytes;          /* bytes per element; 0: the activation dtype */
    unsigned flags;
} plan_act_entry;

const plan_act_entry *plan_act_table(size_t *count);

/* Bytes one layer saves for backward for one micro-batch, from the table,
 * before recompute (recompute is applied by the caller): a dense layer, or
 * with `moe` an MoE layer. */
uint64_t plan_layer_act_bytes(const zo_model_config *m, const plan_train *t, int keep_s2);
uint64_t plan_layer_act_bytes_of(const zo_model_config *m, const plan_train *t, int keep_s2,
                                 int moe);

/* Bytes one layer keeps with recompute ops (PyTorch's selective activation
 * checkpointing by op, torchtitan's policy): its input, and the outputs of
 * the attention (with its log-sum-exp) and of every other matmul (the 1st,
 * 3rd, ...: q and v, the MLP's first and last for LLaMA; the fused qkv and
 * the first MLP matmul for GPT); the rest is recomputed. Dense GPT and LLaMA
 * layers with flash attention. With LoRA the same bytes: no adapter's x A
 * is kept (the runtime rebuilds it; the working set counts it). */
uint64_t plan_layer_ops_bytes(const zo_model_config *m, const plan_train *t);

/* ---- attention on the CUDA backend: its path and its pool scratch ---------- */

/* Which of the CUDA backend's attention kernels computes a layer of m under
 * t: qkv 16-bit or not, head dim d (0: q/k and v heads of different widths,
 * which neither fused kernel takes), a window of `window` keys (0: none; a
 * window that masks nothing, zo_attn_window_masks, is none). The automatic
 * choice (common/attn_path.h, qkv aligned, cuBLASLt there) or the path
 * t->attn_path forces where it covers the layer (as ZO_ATTENTION forces it:
 * the automatic choice where it does not; the GEMM path forced for any
 * 16-bit qkv, at any t). The one rule of memplan's time (cost.c) and of its
 * GPU memory (plan_attn_scratch). */
zo_attn_path plan_attn_path(const zo_model_config *m, const plan_train *t, int qkv_16bit, int d, int window);

/* Bytes `path` takes from the device's pool (stream-ordered, outside the
 * runtime's counted allocations) in one attention call, forward or
 * (backward) backward, as the transformer calls it (fp32 dout and dqkv,
 * 16-bit qkv): b sequences of t, hq query and hkv kv heads of d, a window
 * (0: none). The mma.sync and tensor-core kernels: nothing forward, D
 * [b, hq, t] fp32 backward (attention_fused.cuh); the GEMM path
 * (gpu/cuda/attention_gemm.h): a chunk's scores S (fp32) and one 16-bit P
 * forward, S, both 16-bit parts, D and one sequence's dO as two 16-bit
 * parts backward, each buffer aligned to 256 bytes, a chunk held under
 * `cap` bytes (0: the runtime's 256 MiB); the flash kernel nothing.
 * Recompute runs the forward again: under the backward's bytes. */
uint64_t plan_attn_pool_bytes(zo_attn_path path, int backward, int b, int t, int hq, int hkv, int d, int window,
                              uint64_t cap);

/* The most attention scratch one rank takes from the pool over layers
 * first .. first + layers - 1 of m under t with wsz-byte activations (each
 * layer's path, window and head dims; the heads over TP): the backward's
 * bytes of plan_attn_pool_bytes at the largest layer, whose path *path
 * gets (ZO_ATTN_FLASH and 0 where no layer takes any). */
uint64_t plan_attn_scratch(const zo_model_config *m, const plan_train *t, int wsz, int first, int layers,
                           zo_attn_path *path);

/* ---- LoRA and QLoRA ------------------------------------------------------- */

/* A kind of adapted linear layer of a transformer layer: PEFT's module, or
 * in an MoE layer the gate (w1), up (w3) or down (w2) of every routed expert
 * on the rank (count experts / EP, over the routed rows: `routed` a token)
 * and of the shared expert. The router is not adapted (PEFT's all-linear
 * would: r (h + experts) a layer, under 0.2% of the adapters). */
#define PLAN_PEFT_MAX_MODULES 12
typedef struct plan_peft_module {
    int64_t in, out;  /* A [r, in], B [out, r] */
    uint64_t count;   /* of them in a layer on the rank */
    int row;          /* row-parallel (o, down): the input is split by TP */
    int routed;       /* rows a token sends through it: top_k for a routed expert, else 1 */
    int expert;       /* a routed expert's (streamed as a block of its own) */
} plan_peft_module;

/* The adapted layers of layer `layer` for `targets` (zo_lora_layer_modules_at's,
 * count 1; an MoE layer's: its attention's, then its experts' where the
 * model's LoRA adapts them, not Granite-MoE's or gpt-oss's); with
 * PLAN_PEFT_LINEAR in targets its linear weights whether adapted or not
 * (every expert's). Returns how many kinds. */
#define PLAN_PEFT_LINEAR 0x80000000u
int plan_peft_modules(const zo_model_config *m, int layer, unsigned targets, int ep,
                      plan_peft_module out[PLAN_PEFT_MAX_MODULES]);

/* Trainable parameters of rank-r adapters on `targets`: PEFT's count,
 * every routed expert's in an MoE layer (zo_lora_trainable_params). */
uint64_t plan_lora_trainable(const zo_model_config *m, int r, unsigned targets);

/* What one rank of a pipeline stage holds when it trains adapters on a
 * frozen base (TP splits each adapted layer as its weight: a column-parallel
 * layer's A is whole on every rank and its B split, a row-parallel layer's A
 * split and its B whole). */
typedef struct plan_peft {
    uint64_t trainable;      /* adapter elements of the stage's layers on this rank */
    uint64_t layer_trainable; /* of one layer */
    uint64_t layer_trainable_ex; /* of which the rank's routed experts' adapters (sharded by ZeRO over
                                  * DP / EP with expert parallelism) */
    uint64_t frozen;         /* bytes of the frozen base on this rank: the stage's blocks */
    uint64_t nf4;            /* of those, NF4 tensors (QLoRA) */
    uint64_t layer_frozen;   /* bytes of one layer's frozen block */
    uint64_t layer_frozen_ex; /* of which the rank's routed experts' (ZeRO-3 partitions them over DP /
                               * EP with expert parallelism) */
    uint64_t first_frozen, last_frozen; /* bytes of the embedding (stage 0) and head (last
                                           stage) blocks; 0 elsewhere */
    uint64_t largest_frozen; /* bytes of the largest frozen block */
    uint64_t layer_linear;   /* elements of one layer's linear weights on this rank */
    uint64_t layer_nf4;      /* QLoRA: their bytes in NF4 (each rounded up to 16 bytes) */
    uint64_t largest_linear; /* elements of the widest weight dequantized at once (QLoRA's scratch:
                                zo_lora_dequant_elems, split by TP) */
    int n_adapters;          /* kinds of adapted linear layers in a layer */
    double u_width;          /* elements of the adapters' A x a token keeps per layer, r each
                                (MoE: the routed experts' top_k r only in an eager runtime;
                                this one keeps none of theirs); the wider kind's (as the
                                runtime's lora_u) */
    int layers;
    /* The two kinds of layer of an MoE model with dense first layers
     * (DeepSeek), [0] dense and [1] MoE (a model of one kind: that kind's;
     * the per-layer fields above are the larger of the two): */
    int kind_layers[2];             /* the stage's layers of each kind */
    uint64_t kind_trainable[2];     /* adapter elements of one layer of the kind */
    uint64_t kind_frozen[2];        /* bytes of one layer's frozen block */
} plan_peft;

/* The frozen base and the adapters of stage `stage` on one rank (method
 * lora or qlora; after plan_train_validate). */
void plan_peft_stage(const zo_model_config *m, const plan_train *t, int stage, plan_peft *out);

/* Expert parallelism (ep > 1): the most (token, expert) rows one rank's
 * experts receive in a layer, from every rank of its group: ep s b
 * min(top_k, experts / ep) (dropless, each token at most top_k of them and
 * at most one per expert), with a capacity factor at most ep (experts / ep)
 * C of them (zo_moe_rank_rows: each rank drops among its own tokens
 * before the exchange); 0 without, and for the other runtimes (their capacity
 * factor bounds their rows). This runtime's transformer allocates exactly
 * these. */
uint64_t plan_ep_rows(const zo_model_config *m, const plan_train *t);
/* Routed token rows per token, what the experts of an MoE layer compute
 * on: top_k dropless; with a capacity factor F this runtime's
 * min(s b top_k, experts C) / (s b) (zo_moe_rank_rows of one rank: what its
 * transformer allocates), the others' top_k F (padded to capacity). */
double plan_routed_rows(const zo_model_config *m, const plan_train *t);

/* ---- the names the planner's tests and benchmarks were written with ---------- */

/* The plan vocabulary is common/plan_vocab.h's, and the planner uses its
 * names; these are the same types and values under the names the tests and
 * benchmarks still spell them with (no second enum). */
typedef zo_plan_tier plan_tier;
typedef zo_plan_recompute plan_recompute;
typedef zo_plan_method plan_method;
typedef zo_plan_schedule plan_schedule;
#define PLAN_GPU ZO_PLAN_GPU
#define PLAN_CPU ZO_PLAN_CPU
#define PLAN_NVME ZO_PLAN_NVME
#define PLAN_TIERS ZO_PLAN_TIERS
#define PLAN_OPT_SGD ZO_PLAN_SGD
#define PLAN_METHOD_FULL ZO_PLAN_FULL
#define PLAN_METHOD_LORA ZO_PLAN_LORA
#define PLAN_METHOD_QLORA ZO_PLAN_QLORA
#define PLAN_SCHED_SERIAL ZO_PLAN_SCHED_SERIAL
#define PLAN_SCHED_OVERLAP ZO_PLAN_SCHED_OVERLAP
#define PLAN_SCHED_DPU ZO_PLAN_SCHED_DPU
#define PLAN_SCHEDULES ZO_PLAN_SCHEDULES
#define PLAN_RECOMPUTE_NONE ZO_PLAN_RECOMPUTE_NONE
#define PLAN_RECOMPUTE_SELECTIVE ZO_PLAN_RECOMPUTE_SELECTIVE
#define PLAN_RECOMPUTE_FULL ZO_PLAN_RECOMPUTE_FULL
#define plan_tier_name zo_plan_tier_name
#define plan_recompute_name zo_plan_recompute_name
#define plan_schedule_name zo_plan_schedule_name

#endif
