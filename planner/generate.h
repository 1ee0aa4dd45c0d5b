/* Generation's memory and time (memplan generate; docs/memplan.md,
 * "Generation"): the weights per tier as the runtime places them, the
 * key/value cache of a batch and a context, the forward's buffers, and a
 * time per token bound by moving the weights and the cache through the
 * slowest link they cross. Pure arithmetic, no I/O.
 *
 * What it counts is what the runtime allocates for `generate` (the model of
 * transformer/generate.h: a forward-only runtime, tf_options.kv_len), byte
 * for byte where the sizes are known exactly, so that the runtime's measured
 * peaks agree (tests/test_planner_generate.c: within 3% per tier). */
#ifndef ZO_PLANNER_GENERATE_H
#define ZO_PLANNER_GENERATE_H

#include <stdint.h>

#include "planner/memory.h" /* defines: plan_train, plan_hw, plan_tier */

/* What is generated, and where the weights live. */
typedef struct plan_gen {
    int batch;                  /* sequences generated together */
    int prompt;                 /* tokens of the longest prompt (the forward's buffers) */
    int new_tokens;             /* tokens generated after each prompt */
    int prompt_buffers;         /* tokens a sequence the forward's buffers hold; 0: prompt
                                   (generate --plan sizes them for the whole context) */
    zo_dtype dtype;             /* weights, activations and the cache */
    int mla_full_cache;         /* latent attention: 0 caches the compressed latent [k_pe | c_kv]
                                   and absorbs kv_b_proj (the runtime's default); 1 every head's
                                   decompressed key and value (generate --mla-cache full) */
    zo_plan_method method;      /* full (no adapters), lora or qlora: adapters over the base */
    zo_lora_config lora;        /* with adapters: r, targets */
    zo_plan_tier params_on;     /* the weights (with adapters: the base): gpu, cpu, nvme */
    zo_plan_tier adapters_on;   /* the adapters */
    int prefetch_depth;         /* streamed blocks loaded ahead */
    uint64_t sub_group;         /* elements the resident store takes a put in (the runtime's
                                   sub-group: its pinned staging) */
    /* reserved on the GPU, as memplan's training estimate (docs/memplan.md,
     * "Working buffers"): the CUDA context, cuBLAS's workspace, an allocator
     * allowance of the GPU total */
    uint64_t cuda_context, cublas_workspace;
    double fragmentation;
} plan_gen;

/* 1 sequence, a prompt of 128 and 128 new tokens, bf16, the weights on the
 * GPU, prefetch 2, sub-group 1M, the training estimate's reserved buffers. */
void plan_gen_defaults(plan_gen *g);

#define PLAN_GEN_MAX_ITEMS 16

typedef struct plan_gen_estimate {
    int n_items;
    plan_item items[PLAN_GEN_MAX_ITEMS]; /* every line: name, tier, bytes */
    uint64_t total[ZO_PLAN_TIERS], capacity[ZO_PLAN_TIERS];
    uint64_t reserved[ZO_PLAN_TIERS]; /* of total, what no allocation of the runtime makes (the
                                         CUDA context, cuBLAS workspace, fragmentation allowance) */
    int fits;
    int context;                /* prompt + new tokens: the cache's positions */
    uint64_t weight_bytes;      /* the weights (base in its format, adapters) */
    uint64_t stream_bytes;      /* of them, what crosses to the GPU for each token */
    uint64_t nvme_bytes;        /* of those, read from NVMe */
    int experts_apart;          /* an MoE layer's routed experts stream apart from its dense part
                                   (the weights whole in pinned host memory) */
    int experts_token, experts_prompt; /* the routed experts a layer's forward touches, at most:
                                   min(experts, top_k x its tokens), a token's and the prompts' */
    uint64_t kv_cache;          /* bytes of the cache: 2 L batch context kv_heads head_dim; latent
                                   attention's latent cache L batch context (qk_rope + kv_lora_rank) */
    uint64_t kv_read;           /* bytes of it a token reads, on average over the generation */
    /* time (seconds): a token of every sequence, the prompts' forward */
    double s_per_token;         /* pace_s + stall_s: the runtime's schedule played block by block
                                   (generate.c, simulate), its steady state */
    double pace_s;              /* the slowest resource: max(compute_s, link_s); on the CPU backend
                                   (a "GPU" that is the host: plan_hw_cpu_backend) max(compute_s +
                                   the copies, the disk), its copies running on the cores the
                                   compute runs on */
    double stall_s;             /* what the schedule adds to the pace: at each token's end the host
                                   waits for the logits before it reads or copies past the next
                                   token's first prefetch_depth blocks, so the slowest resource
                                   idles while the others drain */
    double compute_s;           /* the GPU's work of a token: each matmul's roofline, the cache read */
    double link_s;              /* the streamed weights through the slowest link they cross (on the
                                   CPU backend the disk at nvme_read_bw_busy while the cores
                                   compute, at nvme_read_bw the rest of the time) */
    double prompt_compute_s;    /* the GPU's work of the prompts' forward */
    double ttft_s;              /* time to the first tokens: the prompts' forward through the same
                                   schedule from cold (the first blocks read and copied before
                                   anything runs, at the disk's idle rate) */
    int longrope_rows;          /* longrope switching to long_factor within the context with prompts
                                   within the original length: the crossing's forward over every
                                   token so far, original + 1 a sequence (its buffers counted at
                                   those rows); 0: none */
    double longrope_s;          /* that forward's time, once: its GPU work, or the streamed weights'
                                   pass (link_s) when slower */
    const char *bound;          /* what sets pace_s: "compute", "compute+copies", "pcie", "nvme" */
    double tokens_per_s;        /* batch / s_per_token */
} plan_gen_estimate;

/* The estimate of generating `g` with model `m` on `hw` (one GPU): the
 * lines, the totals against the capacities, whether it fits, and the time.
 * ZO_ERR_INVALID naming what the runtime cannot do (a family it does not
 * build, a model known only by its size, learned positions past the
 * model's, adapters that do not fit the model). */
zo_status plan_gen_estimate_run(const zo_model_config *m, const plan_hw *hw, const plan_gen *g,
                                plan_gen_estimate *out);

#endif
