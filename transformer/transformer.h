/* The transformer: GPT-2 (LayerNorm, GELU tanh, learned positions, tied
 * head) and LLaMA (RMSNorm, SwiGLU, RoPE, GQA, untied head; Mistral and Qwen2
 * shapes too) written against the device interface.
 *
 * The model is the block sequence of model/layout.h: block 0 the embedding,
 * blocks 1..L the layers, block L+1 the head (final norm, output projection,
 * loss). Every block has one flat parameter buffer and one gradient buffer of
 * the same layout, both on the device; tf_block_forward / tf_block_backward
 * run one block given its buffers, so a runtime can move blocks
 * independently. The model object owns only the activations (saved for
 * backward, all layers) and the gradient scratch, sized for a micro-batch of
 * at most B sequences of T tokens.
 *
 * Types: parameters, parameter gradients and saved activations are stored as
 * `dtype`; per-row statistics (norms, attention log-sum-exp, losses) and the
 * activation gradients flowing backward are fp32. Arithmetic is fp32.
 *
 * Everything is enqueued on the stream passed in; nothing waits unless the
 * function says so.
 *
 * LoRA (tf_options.lora): the model's weights are frozen and only adapters
 * train. Each block then has two buffers: the frozen base (`frozen`,
 * read-only, tf_frozen_bytes: the block's tensors in the model dtype, or
 * with QLoRA the layers' linear weights in NF4 with double quantization,
 * common/nf4.h) and the trainable adapters (`params` / `grads`,
 * tf_block_bytes: the adapter layout of model/lora.h, A [r, in] then B
 * [out, r] for each adapted linear layer). An adapted layer computes
 * y = W x + b + (alpha / r) B (A x); backward computes the input gradients
 * through W but no gradient of W, b or any other frozen tensor, and adds
 * the gradients of A and B to `grads`. The embedding and the head have no
 * adapters (0 trainable bytes, params and grads may be NULL). With NF4 each
 * linear weight is dequantized just before its GEMM into one scratch buffer
 * of the model dtype (bf16 for QLoRA as published), in forward and again in
 * backward. */
#ifndef ZO_TRANSFORMER_TRANSFORMER_H
#define ZO_TRANSFORMER_TRANSFORMER_H

#include <stdint.h>

#include "common/lora.h"         /* defines: zo_lora_config, ZO_LORA_MAX_MODULES */
#include "common/model_config.h" /* defines: zo_model_config */
#include "gpu/device.h"          /* defines: gpu_device_t, gpu_stream_t */
#include "gpu/comm.h"            /* defines: comm_t (expert parallelism's group) */
#include "model/layout.h"        /* defines: model_layout, model_role */
#include "model/safetensors.h"   /* defines: model_st_entry */

/* tf_options.recompute: none, whole layers, by op */
enum { TF_RECOMPUTE_NONE = 0, TF_RECOMPUTE_FULL = 1, TF_RECOMPUTE_OPS = 2 };

/* Activations one layer saves for its backward ([N = B*T] rows). */
typedef struct tf_layer_acts {
    void *ln1;        /* [N, h]  normed input of attention */
    float *mean1, *rstd1; /* [N] */
    void *qkv;        /* [N, (hq + 2 hkv) d], after RoPE */
    void *qkn;        /* Qwen3 (qk_norm): the q/k norms' inputs, q's [N, hq d] then k's [N, hkv d] */
    float *qk_rstd;   /* their 1/rms per head: q's [N, hq] then k's [N, hkv] */
    void *att;        /* [N, hq d] attention output */
    float *lse;       /* [B, hq, T] */
    void *x_mid;      /* [N, h]  residual after attention (NULL with a parallel residual) */
    /* Gemma-2 (zo_model_post_norms): the inputs of the norms on the
     * attention's output (o_proj's) and the MLP's (down_proj's) [N, h], and
     * their 1/rms [N]; NULL otherwise */
    void *pa_in, *pm_in;
    float *rstd3, *rstd4;
    void *ln2;        /* [N, h] */
    float *mean2, *rstd2; /* [N] */
    void *fc;         /* [N, ffn] GPT: pre-GELU; LLaMA: gate */
    void *up;         /* [N, ffn] LLaMA: up (NULL for GPT) */
    void *act;        /* [N, ffn] GELU(fc) or silu(gate) * up */
    void *lora_u;     /* [N, n_lora_u * r] LoRA: each adapted layer's A x (NULL without LoRA) */
    /* mixture of experts (NULL in a dense model); fc, up, act hold the
     * shared expert's ([N, shared_ffn]) */
    float *router_logits; /* [N, experts] */
    float *router_w;      /* [N, experts] the chosen experts' weights, 0 elsewhere */
    /* the (token, expert) pairs the router chose that their experts took
     * (all of them without a capacity factor), expert by expert (its
     * tokens in order): M = moe_off[experts] <= tf_model.moe_rows rows */
    void *efc, *eup, *eact; /* [M, expert_ffn] gate, up, silu(gate) * up of each pair */
    int32_t *moe_idx;     /* [M] device: each pair's token */
    float *moe_wp;        /* [M] device: each pair's weight */
    int32_t *moe_idx_h;   /* [moe_rows] host: the same, as routed */
    float *moe_wp_h;      /* [moe_rows] host */
    int *moe_off;         /* [experts + 1] host: expert e's pairs are rows moe_off[e] .. moe_off[e+1] */
    float *sgate;         /* [N] the shared expert's gate before its sigmoid */
    /* expert parallelism (tf_model.ep_size > 1), the owner's side: the rows
     * the ranks of the group sent to this rank's experts, R = ep_off[El] of
     * them (at most tf_model.ep_rows) */
    void *ep_x;           /* [R, h] their inputs, grouped by local expert (source ranks in order) */
    float *ep_wp;         /* [R] their weights, grouped the same */
    int32_t *ep_idx;      /* [2 R] device: grouped row i is arrival row ep_idx[i]; arrival row r is
                             grouped row ep_idx[R + r] (arrival: by source rank, then local expert) */
    /* DeepSeek-V2's latent attention (mla.kv_rank; NULL otherwise) */
    void *mla_qa, *mla_qa_in;   /* [N, q_rank] q_a_proj's output normed (q_b_proj's input), and
                                   before its norm (NULL without q_rank) */
    float *mla_qa_rstd;         /* [N] */
    void *mla_ckv, *mla_ckv_in; /* [N, kv_rank] c_kv normed (kv_b_proj's input), and before its norm */
    float *mla_ckv_rstd;        /* [N] */
    void *mla_attv;             /* [N, heads v_dim] the attention's output narrowed to v (o_proj's input) */
    int32_t *ep_idx_h;    /* [2 ep_rows] host: the same */
    int *ep_cnt;          /* [ep El] host: rows from rank p for local expert j at [p El + j] */
    int *ep_off;          /* [El + 1] host: local expert j's grouped rows are ep_off[j] .. ep_off[j+1] */
} tf_layer_acts;

/* LoRA on the model: r = 0 (the default) trains every weight as before. */
typedef struct tf_lora_options {
    int r;            /* rank */
    float alpha;      /* the update is scaled by alpha / r */
    unsigned targets; /* ZO_LORA_* (common/lora.h): which linear layers carry adapters */
    int nf4;          /* QLoRA: the frozen linear weights of the layers are NF4 */
} tf_lora_options;

/* Where an adapted linear layer's adapter acts: after which GEMM of the
 * layer, on which of its output columns. */
typedef enum tf_lora_stage {
    TF_LORA_QKV = 0, /* the fused q|k|v GEMM (LLaMA q, k, v; GPT-2 c_attn) */
    TF_LORA_O,
    TF_LORA_GATE,
    TF_LORA_UP,
    TF_LORA_DOWN,
    /* a mixture of experts' routed experts (each expert on its tokens) */
    TF_LORA_EXPERT_GATE,
    TF_LORA_EXPERT_UP,
    TF_LORA_EXPERT_DOWN,
    /* DeepSeek-V2's latent attention (its q_proj is TF_LORA_QKV's, into q's
     * columns of the fused q|k|v): q_a_proj, q_b_proj, kv_a_proj_with_mqa,
     * kv_b_proj */
    TF_LORA_MLA_QA,
    TF_LORA_MLA_QB,
    TF_LORA_MLA_KVA,
    TF_LORA_MLA_KVB,
    TF_LORA_NONE, /* a linear layer without adapters (the router) */
} tf_lora_stage;

typedef struct tf_lora_slot {
    tf_lora_stage stage;
    int col;             /* first output column in that GEMM's output (k: q, v: q + kv) */
    int u;               /* its A x: column u r of the layer's lora_u (Phi-3's gate_up_proj is
                            two slots, gate and up, sharing its A and so its A x); -1 for a
                            routed expert's, whose A x goes through eu */
    int in, out;
    size_t a_off, b_off; /* elements into a layer block's adapter buffer (a routed expert's: expert 0's) */
    size_t e_stride;     /* a routed expert's: elements from expert e's adapters to e + 1's */
} tf_lora_slot;

/* How the model holds its activations (all zero: the defaults). */
typedef struct tf_options {
    /* One set of layer activations shared by every layer: a layer's backward
     * must be preceded by tf_block_recompute of that layer (activation
     * checkpointing: only the residual stream between layers is kept).
     * TF_RECOMPUTE_OPS (2): recompute by op (PyTorch's selective
     * checkpointing of every other matmul, memplan's --recompute ops): each
     * layer keeps the outputs of every other matmul in the order it runs
     * them (qkv | o | fc1 or gate | fc2 or up | down: the fused qkv after
     * RoPE and fc1/gate; down's output no backward reads), the attention's
     * output and log-sum-exp; the norms, o (with the residual add), LLaMA's
     * up and the activation are recomputed into one set shared by every
     * layer, with LoRA each adapter's A x too (lora_u: none kept per
     * layer). recompute_layers must be 0; no MoE layer, no latent
     * attention. */
    int recompute;
    /* With recompute: 0 every layer shares the set; K > 0 only the first K
     * layers do (Megatron's --recompute-num-layers, the plan's
     * training.recompute_layers) and the others keep a set of their own,
     * their backward needing no recompute. K >= the layers: every layer. */
    int recompute_layers;
    /* The residual stream buffers res[0..L] are not allocated: the caller
     * points res[l] at buffers of [N, h] in `dtype` before each block call
     * (block b reads res[b-1] and writes res[b]), so a runtime can keep them
     * where it likes (device slots, copies in host memory). */
    int external_res;
    tf_lora_options lora;
    /* Generation (tf_set_tokens): kv_len > 0 keeps a key/value cache of
     * kv_len positions for each of the B sequences on the device, and
     * buffers for the forward alone: one set of layer activations for B x T
     * new tokens (T: the longest prompt a forward takes at once; 1 when it
     * only decodes; an MoE model's router and experts' buffers among them),
     * and the logits of one position per sequence. No backward. 0: training
     * (tf_set_batch). */
    int kv_len;
    /* Generation with latent attention (mla.kv_rank): what the cache holds.
     * TF_MLA_CACHE_LATENT (0, the default): the compressed latent of each
     * position, [k_pe | c_kv] (rope + kv_rank: c_kv after its norm, k_pe
     * rotated), one row shared by every head, and the queries attend with
     * kv_b_proj absorbed (DeepSeek's own inference; docs/transformer.md,
     * "The latent cache"). TF_MLA_CACHE_FULL: every head's decompressed key
     * [k_pe | k_nope] and padded value [v | 0], as Hugging Face caches. */
    int mla_cache;
    /* > 0 (and below the micro-batch's tokens): the output layer and the
     * cross-entropy this many tokens at a time (issue 30, --loss-chunk):
     * the forward computes each chunk's logits and losses; the head's
     * backward computes each chunk's logits again and takes its gradient
     * straight through the two GEMMs, so the fp32 logits of one chunk are
     * all that is held ([chunk, vocab] where [N, vocab] was). */
    int loss_chunk;
    /* Expert parallelism: the group of ranks that together hold every
     * routed expert (NULL, or one rank: this rank holds them all). Rank q
     * of its P holds experts [q E/P, (q+1) E/P) (the layout's window), and
     * each MoE layer sends the pairs routed to another rank's experts there
     * and back (comm_all_to_all_v): full fine-tuning only (no LoRA, no
     * generation). The communicator must carry no other collective while
     * the model runs a block. */
    comm_t ep;
    /* Capacity-limited routing (train's --capacity-factor, the plan's
     * parallel.capacity_factor): F > 0 lets each routed expert take at most
     * C = ceil(F N top_k / experts) pairs (at least 1) of the rank's N
     * tokens in a micro-batch and layer (zo_moe_capacity), by priority:
     * every token's first choice before any token's second (its experts
     * in the order the router chose them: by router weight for the softmax
     * routers, by logit for the sparsemixer; ties to the lower index),
     * tokens in order within a choice. A dropped pair adds nothing to its
     * token (the weights are not renormalized), its expert sees no row and
     * its weight's gradient is 0; the load-balancing loss is the router's,
     * before dropping. With expert parallelism each rank drops among its
     * own tokens before the exchange. 0: dropless. Generation (kv_len)
     * always routes dropless. */
    double capacity_factor;
} tf_options;

enum { TF_EP_FORWARD = 0, TF_EP_RECOMPUTE, TF_EP_BACKWARD };

typedef struct tf_model {
    zo_model_config cfg;
    tf_options opts;
    model_layout layout;
    gpu_device_t dev;
    zo_dtype dtype;
    int B, T;            /* largest micro-batch the buffers hold */
    int b, t;            /* the current batch (tf_set_batch) */
    int n_targets;       /* targets != -1 in the current batch */
    int32_t *tokens;     /* [B*T] device */
    int32_t *targets;    /* [B*T] device */
    double *rope_freq;   /* [rotary_dim/2] device: a rope_scaling's frequencies; NULL: rope_theta's */
    double *rope_freq_long; /* longrope built past its original length: long_factor's table (inside
                               rope_freq's allocation; rope_freq is short_factor's), for batches past
                               it; NULL otherwise */
    float rope_scale;    /* the rotation's cos and sin times this (longrope's attention factor; 1) */
    float rope_scale_long; /* with rope_freq_long: its batches' factor (Phi-3.5-MoE's long_mscale) */
    void **res;          /* [L+1] residual stream [N, h]: res[0] embedding output, res[l+1] layer l output */
    tf_layer_acts *acts; /* [L] */
    void *lnf;           /* [N, h] */
    float *meanf, *rstdf;
    void *emb_x;         /* [N, h] BLOOM: the embedding norm's input (NULL without one) */
    float *emb_mean, *emb_rstd;
    void *logits;        /* [N, vocab] fp32 ([loss_chunk, vocab] in chunks); after the head's
                            backward it holds dlogits (of the last chunk) */
    float *losses;       /* [N] fp32 */
    void *tmp;           /* [N, h] dtype scratch (projections before the residual add) */
    /* latent attention (mla.kv_rank): kv_a_proj_with_mqa's output [N, rope + kv_rank] and
     * kv_b_proj's [N, heads (nope + v)] (dtype scratch), and the fp32 gradients of those,
     * of c_kv [N, kv_rank], of q_a's output [N, q_rank] and of o_proj's input [N, heads v] */
    void *mla_kva, *mla_kv;
    void *mla_kdec;      /* the latent cache's decompressed form (generation): the keys and values
                            it attends, two [B T, heads head_dim] (dtype scratch, one layer at a time):
                            a prompt's [b, t] rows, or one sequence's cached and new positions */
    float *mla_dkva, *mla_dkv, *mla_dckv, *mla_dqa, *mla_dattv;
    float *dres;         /* [N, h] gradient of the residual stream */
    float *dh;           /* [N, h] gradient of a norm output */
    float *dqkv;         /* [N, (hq + 2 hkv) d] */
    float *datt;         /* [N, hq d] */
    float *dff, *dff2;   /* [N, ffn] */
    void *dy16;          /* [N, widest linear output or vocab] 16-bit models: the activation
                            gradient a linear layer's GEMMs read, rounded once */
    /* LoRA (opts.lora.r > 0) */
    model_layout adapters;  /* the trainable part (model/lora.h), block by block */
    int n_lora;             /* adapter slots per layer (an adapted linear layer each; Phi-3's
                               gate_up_proj two) */
    int n_lora_u;           /* adapted linear layers per layer but the routed experts': the A x
                               kept of each (zo_lora_dense_modules; the larger of a dense first
                               layer's and an MoE layer's) */
    int lora_experts;       /* whether the routed experts carry adapters (eu, the expert rows
                               of dlora) */
    tf_lora_slot lora[ZO_LORA_MAX_MODULES];
    int n_lora_dense;       /* DeepSeek's dense first layers' slots (LLaMA's MLP); 0: every layer
                               takes lora[] */
    tf_lora_slot lora_dense[ZO_LORA_MAX_MODULES];
    float lora_scale;       /* alpha / r */
    size_t *frozen_off;     /* [layout.n_tensors] bytes into its block's frozen buffer */
    size_t *frozen_bytes;   /* [n_blocks] */
    float *dlora;           /* [max(N, expert rows), r] gradient of one adapter's A x (expert
                               rows: zo_moe_expert_rows, 0 without expert adapters) */
    void *eu;               /* [expert rows, r] a routed expert's adapter's A x (dtype; recomputed
                               in backward, so one serves every layer); NULL without expert
                               adapters */
    float *norm_one;        /* Gemma: [2h] fp32, h ones then the (1 + w) a norm multiplies by
                               (GemmaRMSNorm stores w as the offset from 1); NULL otherwise */
    void *wdq;              /* QLoRA: one dequantized linear weight (model dtype) */
    const void *wdq_src;    /* the NF4 tensor wdq holds whole (a fused one whose row ranges are
                               read in turn: Phi-3's gate_up_proj), of block wdq_block; NULL: none
                               (wdq reused, or a new block begun: block buffers are reused) */
    int wdq_block;
    /* mixture of experts (cfg.moe.experts > 0) */
    float *moe_stats;       /* [L, 2 experts] each layer's router statistics
                               (gpu_moe_router_forward) for the load-balancing loss */
    float *drouter;         /* [N, experts] gradient of the router's logits */
    float *dweights;        /* [N, experts] gradient of the chosen experts' weights */
    float *dz;              /* [N] gradient of the shared expert's gate */
    float *sinks32;         /* gpt-oss (cfg.attn_sinks): [2, heads] fp32 a layer's sink logits, their
                               gradient (the attention ops take fp32; the block holds dtype) */
    void *sact;             /* [N, max(top_k expert_ffn, shared_ffn)] activations times their weights */
    void *moe_x, *moe_y;    /* [moe_rows, h] the pairs' inputs, the experts' outputs (dtype) */
    float *moe_dx;          /* [moe_rows, h] the pairs' input gradients */
    float *moe_dscale;      /* [moe_rows] the pairs' weight gradients */
    float *moe_w_h;         /* [N, experts] host: the router's weights, read to route */
    uint8_t *moe_order;     /* [N, experts] the router's choice order (gpu_moe_router_forward; capacity) */
    uint8_t *moe_rank_h;    /* [N, experts] host: moe_order, read to rank the pairs (capacity) */
    int *moe_quota_h;       /* [experts, top_k] host: an expert's pairs of each choice rank (capacity) */
    /* DeepSeek-V3's router score corrections (cfg.moe.router_bias; NULL
     * without): each MoE layer's e_score_correction_bias, a buffer of its
     * checkpoint (fp32, never rounded, never trained), added to the scores
     * for the choice only (gpu_moe_gate.bias) */
    float *router_bias;     /* [L, experts] fp32 device; zeros until tf_load_router_bias */
    float *router_bias_h;   /* [L, experts] host: the same, as loaded and as saved */
    model_st_entry *router_bias_entries; /* [MoE layers] router_bias_h as tensors to save (tf_router_bias_entries) */
    char (*router_bias_names)[MODEL_TENSOR_NAME_MAX];
    size_t moe_rows;        /* the most pairs a layer keeps: zo_moe_rank_rows of B T tokens, 1 rank */
    /* the pairs the forwards routed since tf_init (recomputes not counted):
     * chosen by the router, dropped by the capacity factor */
    uint64_t moe_pairs, moe_dropped;
    float moe_loss_scale;   /* the head's loss_scale, for the load-balancing loss's gradient */
    /* expert parallelism (opts.ep of more than one rank): this rank holds
     * the routed experts of its layout's window and computes them for the
     * pairs every rank of the group routes to them (transformer.c, "expert
     * parallelism") */
    int ep_size, ep_rank;   /* 1 and 0 without */
    size_t ep_rows;         /* the most rows a rank receives a layer: ep_size N min(top_k, El),
                               with a capacity factor at most ep_size El C (zo_moe_rank_rows) */
    void *ep_buf[2];        /* [ep_rows, h] fp32 each: rows in arrival order (in and out), grouped */
    float *ep_w[2];         /* [ep_rows] fp32: weights (gradients) in arrival order, grouped */
    int32_t *ep_cnt_d;      /* [2 ep El] device: the counts sent, then received */
    int32_t *ep_cnt_h;      /* [2 ep El] host: the same */
    size_t *ep_counts;      /* [2 ep] host: elements each all-to-all sends to, receives from each rank */
    /* what the exchanges sent since tf_init, by pass (TF_EP_FORWARD,
     * TF_EP_RECOMPUTE, TF_EP_BACKWARD): the layer exchanges, the pairs sent
     * to another rank's experts ([0]) and received from another rank ([1]).
     * The bytes they send to the other ranks (comm_all_to_all_bytes) are,
     * with h e the bytes of a row in the model dtype, El the local experts:
     * forward layers (P-1) El 4 + out (h e + 4) + in h e; recompute layers
     * (P-1) El 4 + out (h e + 4); backward out 4 h + in (4 h + 4). */
    uint64_t ep_layers[3], ep_pairs[3][2];
    const void *apart_buf;  /* the block call's params when they hold an MoE layer's dense part alone
                               (tf_block_bufs.expert), else NULL */
    /* generation (opts.kv_len > 0) */
    void **kcache, **vcache; /* [L] each [B, kv_len, hkv d] in dtype; the latent cache:
                                kcache [B, kv_len, rope + kv_rank], vcache NULL */
    void *mla_u;            /* latent cache with an adapter on kv_b_proj: the absorbed form's
                               adapter terms [B, H, r] (dtype; mla_latent_attention) */
    int32_t *rowpos;        /* latent cache: [B T] device, each new row's position (the absorbed
                               form's chunks of a call wider than its B rows) */
    int *hrowpos;           /* [B T] host: the same */
    uint64_t mla_forms[2];  /* latent cache: the layer forwards that attended absorbed [0] and
                               decompressed [1] (transformer.c, mla_decompressed) */
    int32_t *pos;           /* [B] device: each sequence's first new position */
    int *hpos, *hlast;      /* [B] host: the same; the new row whose logits are wanted */
    void *hsel;             /* [B, h] the final hidden rows of those positions */
    size_t kv_bytes;        /* device bytes of the caches */
    size_t act_bytes;       /* device bytes of all of the above */
} tf_model;

/* Build the layout and allocate activations for micro-batches up to B x T
 * on `dev` (ZO_ERR_CAPACITY when they do not fit). T <= cfg->max_seq for
 * GPT (learned positions). */
zo_status tf_init(tf_model *m, const zo_model_config *cfg, gpu_device_t dev, zo_dtype dtype,
                  int B, int T);
/* tf_init with options (opts NULL: the defaults). */
zo_status tf_init_opts(tf_model *m, const zo_model_config *cfg, gpu_device_t dev, zo_dtype dtype,
                       int B, int T, const tf_options *opts);
void tf_free(tf_model *m);

/* Bytes of block `block`'s parameter (= gradient) buffer: with LoRA, its
 * adapters (0 for the embedding and the head). */
size_t tf_block_bytes(const tf_model *m, int block);
/* Bytes of block `block`'s frozen buffer (0 without LoRA). With QLoRA each
 * NF4 tensor, and the tensor after it, starts at a multiple of
 * TF_FROZEN_ALIGN bytes; otherwise the tensors are packed as the layout's. */
#define TF_FROZEN_ALIGN 16
size_t tf_frozen_bytes(const tf_model *m, int block);
/* Fill a block's frozen buffer (host memory, 4-byte aligned,
 * tf_frozen_bytes) from its weights in the layout's order as fp32
 * (layout.block_numel[block] floats, as model_load or tf_init_weights give
 * them): converted to the model dtype, NF4 quantized where QLoRA says
 * (the quantization at load; ZO_ERR_INVALID for a weight that is not
 * finite). */
zo_status tf_frozen_pack(const tf_model *m, int block, const float *src, void *dst);

/* The inverse of tf_frozen_pack: a block's frozen buffer (host memory) as
 * the fp32 weights the model computes with, in the layout's order (NF4
 * tensors dequantized, 16-bit ones widened). */
zo_status tf_frozen_unpack(const tf_model *m, int block, const void *src, float *dst);
/* A layer block's adapters merged into its weights, as PEFT's
 * merge_and_unload: W += (alpha / r) B A for each adapted linear layer
 * (the rows of the fused q|k|v it adapts). adapters: the block's adapter
 * buffer as fp32 (m->adapters' layout); w: the block's weights as fp32 (the
 * layout's). The embedding and the head have nothing to merge. */
void tf_lora_merge_block(const tf_model *m, int block, const float *adapters, float *w);

/* Tensor `role` of a block buffer as a device tensor (data NULL when the
 * block has no such role). */
gpu_tensor tf_view(const tf_model *m, const void *block_buf, int block, model_role role);

/* Upload a batch: inputs and targets are host arrays of b*t ids (a target
 * of -1 is ignored by the loss); they must stay valid until the stream has
 * run the copies. b <= B, t <= T. */
zo_status tf_set_batch(tf_model *m, gpu_stream_t s, const int32_t *inputs, const int32_t *targets,
                       int b, int t);

/* Generation (a model built with opts.kv_len): upload b x t new tokens
 * (host ids, row-major; they must stay valid until the stream has run the
 * copy), sequence s's at positions pos[s] .. pos[s] + t - 1 (its cache
 * holds the positions before), and last[s], the new row (0..t-1) whose
 * next-token logits the head computes (a prompt shorter than t: its last
 * token; the rows after it are padding whose keys later tokens overwrite).
 * A forward of every block then writes the new keys and values into the
 * caches and the logits [b, vocab] (tf_logits). ZO_ERR_INVALID when b > B,
 * t > T, a position leaves the cache (pos[s] + t > kv_len) or, with learned
 * positions, the model's max_seq. */
zo_status tf_set_tokens(tf_model *m, gpu_stream_t s, const int32_t *tokens, int b, int t, const int *pos,
                        const int *last);
/* After the head's forward on tokens set by tf_set_tokens: the logits
 * [b, vocab] (fp32; Gemma-2's soft-capped by the head on the device) into
 * host memory; synchronizes the stream. */
zo_status tf_logits(tf_model *m, gpu_stream_t s, float *host);
/* What the cache of a latent attention model holds (tf_options.mla_cache). */
enum { TF_MLA_CACHE_LATENT = 0, TF_MLA_CACHE_FULL = 1 };

/* Device bytes of the key/value caches of B sequences of kv_len positions
 * in `dtype`: 2 L B kv_len hkv d x the dtype's size, or with latent
 * attention under TF_MLA_CACHE_LATENT L B kv_len (qk_rope + kv_lora_rank)
 * x the dtype's size (what tf_init allocates for them, and what memplan
 * sizes). */
size_t tf_kv_cache_bytes(const zo_model_config *cfg, zo_dtype dtype, int B, int kv_len, int mla_cache);

/* Buffers a block needs. `params`/`grads`: the block's own buffers. The
 * head of a tied model also reads the embedding block's parameters and adds
 * the output projection's gradient to the embedding block's gradients
 * (`embed_params`, `embed_grads`; ignored otherwise). */
typedef struct tf_block_bufs {
    const void *params;
    void *grads;
    const void *embed_params;
    void *embed_grads;
    const void *frozen;       /* LoRA: the block's frozen base (ignored otherwise) */
    const void *embed_frozen; /* LoRA, tied head: the embedding block's frozen base */
    /* (optional, an MoE layer without LoRA) its routed experts streamed
     * apart: params holds the layer's dense part only (the elements before
     * the experts, then those after them, moved down), and expert(ctx, e,
     * s, &w) makes routed expert e's weights (gate, up, down, as laid out in
     * the block) usable on s; called once a visit, for the experts with
     * tokens only, in increasing order. NULL: the experts are in params. */
    zo_status (*expert)(void *ctx, int e, gpu_stream_t s, const void **w);
    void *expert_ctx;
} tf_block_bufs;

/* Forward of one block on the current batch. The head's forward computes the
 * logits and the per-token losses. A mixture-of-experts layer waits once
 * (its forward and its recompute): for its router's weights, read back to
 * the host, which lists each expert's tokens before their GEMMs are
 * enqueued. */
zo_status tf_block_forward(tf_model *m, int block, const tf_block_bufs *bufs, gpu_stream_t s);
/* Backward of one block, after the forward of every block and the backward
 * of the blocks after it. Gradients are ADDED to bufs->grads (zero them once
 * per step, then micro-batches accumulate). `loss_scale` multiplies the
 * gradient of the mean loss (1 without loss scaling); only the head uses it. */
zo_status tf_block_backward(tf_model *m, int block, const tf_block_bufs *bufs, float loss_scale,
                            gpu_stream_t s);

/* Recompute the activations a block's backward reads from its input
 * (res[block-1] for a layer), without writing its output. A no-op for the
 * embedding, the head and a layer that keeps its own activations. */
zo_status tf_block_recompute(tf_model *m, int block, const tf_block_bufs *bufs, gpu_stream_t s);
/* Layers whose activations share one set (opts.recompute; recompute_layers):
 * the first tf_recompute_layers(m) layers, 0 without recompute (by op:
 * every layer, sharing what it recomputes). Their backward must be
 * preceded by tf_block_recompute. */
int tf_recompute_layers(const tf_model *m);

/* The whole model over per-block buffer arrays (params[i], grads[i] for
 * block i). */
zo_status tf_forward(tf_model *m, void *const *params, gpu_stream_t s);
zo_status tf_backward(tf_model *m, void *const *params, void *const *grads, float loss_scale,
                      gpu_stream_t s);
/* The same with the frozen buffers of a LoRA model (frozen[i]; entries of
 * params and grads for blocks without adapters may be NULL; grads unused by
 * forward). */
typedef struct tf_model_bufs {
    void *const *params;
    void *const *grads;
    const void *const *frozen;
} tf_model_bufs;
zo_status tf_forward_all(tf_model *m, const tf_model_bufs *bufs, gpu_stream_t s);
zo_status tf_backward_all(tf_model *m, const tf_model_bufs *bufs, float loss_scale, gpu_stream_t s);

/* Synchronize the stream and return the mean loss over the counted targets;
 * a mixture of experts with output_router_logits adds router_aux_loss_coef
 * times the load-balancing loss as Hugging Face's (Switch Transformers'):
 * experts x sum_j f_j P_j, f_j the share of the (token, choice) pairs of
 * every MoE layer of the batch that chose expert j per token, P_j the mean
 * of p_j over the tokens of every MoE layer. */
zo_status tf_loss(tf_model *m, gpu_stream_t s, float *loss);

/* GPT-2-style random initialization of fp32 host block buffers from a seed:
 * weights ~ N(0, 0.02), output projections of residual branches scaled by
 * 1/sqrt(2 L), biases 0, norm weights 1 (Gemma's, stored as the offset
 * from 1, 0). */
void tf_init_weights(const model_layout *l, float *const *host_blocks, uint64_t seed);
/* The same weights one block at a time: *rng starts as tf_init_rng(seed) and
 * the blocks are taken in order, 0 to n_blocks - 1. */
/* dst[e] = std * a standard normal draw, e < n: Box-Muller on the two
 * splitmix64 outputs after s0 + 2e steps of its increment (so elements are
 * independent of how the work is split), in fp32 as glibc's log and cos
 * would give it (init_normal.c). tf_normal_simd(0) takes the plain loop
 * where the AVX2 one would run (tests), 1 (the default) restores it. */
void tf_normal_fill(float *dst, long long n, uint64_t s0, double std);
void tf_normal_simd(int on);
uint64_t tf_init_rng(uint64_t seed);
void tf_init_block_weights(const model_layout *l, int block, float *dst, uint64_t *rng);
/* Receives block `block`'s fp32 weights (model/safetensors.h's sink). */
typedef zo_status (*tf_block_sink)(void *ctx, int block, const void *buf);
/* Every block of `l` in turn, from a safetensors checkpoint (`path`: a file,
 * an index or a directory holding every tensor of the model) or, when path
 * is NULL, tf_init_block_weights's from `seed`, handed to sink as fp32: host
 * memory holds one block, whatever the model's size. A checkpoint tensor that
 * is none of the model's (nor a known buffer: model_layout_match_hf) is
 * ZO_ERR_FORMAT naming it, before any block is read (MODEL_LOAD_STRICT). */
zo_status tf_load_blocks(const model_layout *l, const char *path, uint64_t seed, tf_block_sink sink, void *ctx);
/* DeepSeek-V3's router score corrections (tf_model.router_bias), one fp32
 * [experts] tensor a MoE layer, "model.layers.N.mlp.gate.e_score_correction_bias",
 * read from the checkpoint at `path` (as tf_load_blocks takes it; each is
 * required, F32 or 16-bit, finite) into router_bias_h and the device; NULL
 * leaves the zeros a model initialised from its config has. Nothing for a
 * model without them. */
zo_status tf_load_router_bias(const tf_model *m, const char *path);
/* The corrections as tensors a save writes beside the blocks' (model_hf_folder.extra):
 * *n of them (0 without), valid while m is. */
const model_st_entry *tf_router_bias_entries(const tf_model *m, int *n);
/* LoRA adapters of one block as PEFT initialises them: A ~ kaiming_uniform
 * with a = sqrt(5), i.e. uniform in +-1/sqrt(in), B = 0 (so the adapted
 * model starts as the base). `adapters` is tf_model.adapters; dst holds
 * adapters->block_numel[block] floats; *rng as tf_init_block_weights. */
void tf_init_lora_block(const model_layout *adapters, int block, float *dst, uint64_t *rng);

#endif
