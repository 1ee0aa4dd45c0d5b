/* Transformer shapes: presets and Hugging Face config.json files.
 *
 * Shared by the planner (sizing) and the transformer (building the model), so
 * both see the same shapes and the same exact parameter counts. */
#ifndef ZO_COMMON_MODEL_CONFIG_H
#define ZO_COMMON_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef enum zo_arch {
    ZO_ARCH_GPT = 0, /* LayerNorm, GELU MLP of ffn width, learned positions, biases, dropout */
    ZO_ARCH_LLAMA,   /* RMSNorm, SwiGLU MLP, RoPE, GQA, no biases (unless attn_bias), no dropout */
} zo_arch;

/* Positions, where a family differs from its arch (planner only). */
typedef enum zo_pos {
    ZO_POS_ARCH = 0, /* the arch's own: learned max_seq x h (GPT), rotary (LLaMA) */
    ZO_POS_ROTARY,   /* rotary, no parameters (GPT-NeoX, Falcon) */
    ZO_POS_ALIBI,    /* attention biases, no parameters (BLOOM, Falcon-RW) */
    ZO_POS_LEARNED,  /* a learned table of max_seq + pos_offset rows (OPT) */
} zo_pos;

/* Multi-head latent attention (DeepSeek-V2/V3); kv_rank 0: standard attention.
 * q = q_b(norm(q_a(x))) (or q_proj(x) when q_rank is 0); [c_kv, k_rope] =
 * kv_a(x); [k_nope, v] = kv_b(norm(c_kv)); heads of qk_nope + qk_rope for q
 * and k, v_dim for v. */
typedef struct zo_mla {
    int q_rank;  /* q_lora_rank; 0: q projected directly */
    int kv_rank; /* kv_lora_rank */
    int qk_nope; /* qk_nope_head_dim */
    int qk_rope; /* qk_rope_head_dim (one rotary key shared by all heads) */
    int v_dim;   /* v_head_dim */
} zo_mla;

/* Mixture of experts; experts 0: a dense model. Every layer from first_dense
 * on is an MoE layer: a router (h x experts), `experts` routed gated MLPs of
 * expert_ffn of which each token uses top_k, and shared experts of
 * shared_ffn (all of them together) that every token uses. */
typedef struct zo_moe {
    int experts;     /* routed experts per MoE layer */
    int top_k;       /* routed experts per token */
    int expert_ffn;  /* inner width of one routed expert */
    int shared_ffn;  /* inner width of the shared expert(s) together; 0: none */
    int shared_gate; /* Qwen2-MoE: a sigmoid gate (h -> 1) on the shared expert */
    int router_bias; /* DeepSeek-V3: a score correction per expert in the router */
    int first_dense; /* the first layers keep the dense MLP of ffn (DeepSeek) */
    /* How the router weighs the chosen experts and trains (they change no
     * size): the softmax over all experts, then the top_k of it, divided by
     * their sum when norm_topk (Mixtral always; Qwen2-MoE's norm_topk_prob);
     * with aux_loss (output_router_logits) the loss gains aux_coef
     * (router_aux_loss_coef) times Switch's load-balancing loss.
     * DeepSeek's gate (aux_per_layer): each MoE layer's own loss, aux_coef
     * (aux_loss_alpha) times E sum_j f_j P_j with f_j the share of the
     * layer's top_k choices that picked j and P_j its mean probability,
     * over each sequence and averaged over the micro-batch's (seq_aux) or
     * over all its tokens; summed over the layers, in the gradient only
     * (the loss DeepSeek's model returns, and train prints, is the
     * cross-entropy). */
    int norm_topk;
    int aux_loss;
    float aux_coef;
    int aux_per_layer;
    int seq_aux;
    /* Phi-3.5-MoE's router (sparsemixer; top_k 2), in its deterministic eval
     * form: the largest logit's expert weighed by the softmax over the
     * logits within 2 jitter_eps of it (relative: (max - s) / max(|s|, max)),
     * then the same over the others for the second; no renormalization
     * (gpu/device.h, GPU_MOE_ROUTE_SPARSEMIXER). jitter_eps is
     * router_jitter_noise. */
    int sparsemixer;
    float jitter_eps;
    /* gpt-oss's experts and router (mlp.experts, mlp.router): expert_bias, a
     * bias on each routed expert's gate, up and down projections
     * (gate_up_proj_bias, down_proj_bias); router_logit_bias, a trained bias
     * on the router's logits (mlp.router.bias; not DeepSeek-V3's score
     * correction, router_bias above); glu_limit > 0, the experts' GLU
     * clamped: g = min(gate, limit), u = clamp(up, -limit, limit),
     * (u + 1) g sigmoid(glu_alpha g) (swiglu_limit 7, alpha 1.702) */
    int expert_bias;
    int router_logit_bias;
    float glu_limit, glu_alpha;
} zo_moe;

#define ZO_MOE_MAX_GROUPS 64 /* n_group's limit: the router op keeps the chosen groups in 64 bits */
#define ZO_ROPE_MAX_FACTORS 256 /* longrope factors a config may hold: head_dim up to 512 */

typedef struct zo_model_config {
    char name[64];
    char family[16];   /* "gpt2", "gpt3", "megatron", "llama2", "llama3", "mistral", "qwen2", "custom" */
    zo_arch arch;
    int n_layers;
    int hidden;        /* h */
    int n_heads;       /* a */
    int n_kv_heads;    /* GQA groups; == n_heads for multi-head attention */
    int head_dim;      /* usually hidden / n_heads */
    int ffn;           /* MLP inner width (4h for GPT, intermediate_size for LLaMA) */
    int vocab;         /* v */
    int max_seq;       /* positions the model was trained with */
    int tied_embeddings; /* output layer shares the input embedding */
    int attn_bias;     /* q/k/v projections carry biases (GPT-2, Qwen2) */
    int out_bias;      /* attention output and MLP projections carry biases (GPT) */
    int attn_out_nobias; /* with out_bias: the MLP's projections only, the attention output has
                            none (GPT-J: out_proj unbiased, fc_in and fc_out biased) */
    int norm_bias;     /* LayerNorm has a bias (GPT); RMSNorm has none */
    int layer_norm;    /* LayerNorm (the mean taken out) where the arch has RMSNorm: Cohere's
                          CohereLayerNorm on LLaMA layers, without a bias (norm_bias 0) */
    int head_bias;     /* the output layer has a bias over the vocabulary (Phi-1/2's lm_head.bias) */
    float norm_eps;
    float rope_theta;  /* LLaMA only */
    /* ---- what the attention computes beyond the shape: none of it changes a
     * size, so memplan reads it and ignores it; the transformer computes it
     * (sliding windows; the llama3, linear, longrope, yarn and, within its
     * original length, dynamic RoPE scalings) and refuses the rest by name. ---- */
    int sliding_window;    /* a query sees the last sliding_window positions (itself included):
                              Mistral's sliding_window, Qwen2's with use_sliding_window; 0: all */
    int window_from_layer; /* the window applies to layers >= this (Qwen2's max_window_layers) */
    int window_period;     /* > 0: layer l attends globally when (l + 1) % window_period == 0, over
                              the window otherwise (Gemma-2's alternating layers: 2) */
    float query_pre_attn_scalar; /* > 0: scores times its ^-0.5, not head_dim's (Gemma-2) */
    float attn_softcap;    /* > 0: scores capped, c tanh(s / c) (attn_logit_softcapping) */
    float final_softcap;   /* > 0: logits capped likewise (final_logit_softcapping) */
    /* Granite's four multipliers (0: none, as 1), none of which changes a size:
     * embed_mult: the embeddings times it (embedding_multiplier; Gemma's
     * sqrt(hidden) is the runtime's own, not this field); attn_mult: the
     * score scale itself, in place of 1/sqrt(head_dim) (attention_multiplier);
     * resid_mult: each residual branch (attention's output, MLP's output)
     * times it before its add (residual_multiplier); logit_div: the logits
     * divided by it (logits_scaling) */
    float embed_mult, attn_mult, resid_mult, logit_div;
    float rope_local_theta; /* > 0: the sliding layers' rotary base, without rope_scaling (Gemma-3's
                               rope_local_base_freq); the global layers keep rope_theta's */
    int global_nope;       /* the global (not sliding) layers take no rotary: their q and k attend as
                              projected (Cohere2's full_attention layers) */
    int nope_period;       /* > 0: every nope_period-th layer (l + 1 a multiple of it) takes no rotary
                              (SmolLM3's no_rope_layers: NoPE layers) */
    char rope_scaling[16]; /* rope_scaling's rope_type when it rescales the rotary frequencies
                              (llama3, linear, dynamic, yarn, ...); "" for none or "default" */
    float rope_factor;     /* rope_scaling's factor */
    float rope_low_freq_factor, rope_high_freq_factor; /* llama3's (defaults 1 and 4) */
    int rope_original_max; /* original_max_position_embeddings (llama3, dynamic; longrope: Phi-3's
                              top-level key, Phi3Config's default 4096) */
    /* longrope (Phi-3-mini-128k, Phi-3.5-mini): a divisor of each rotary
     * frequency, short_factor's for sequences up to rope_original_max and
     * long_factor's past it, and cos and sin times rope_attention_factor */
    int rope_n_factors;    /* the lists' length (head_dim / 2 for a usable config); -1: the lists
                              are not lists of numbers, or are longer than ZO_ROPE_MAX_FACTORS */
    float rope_short_factor[ZO_ROPE_MAX_FACTORS], rope_long_factor[ZO_ROPE_MAX_FACTORS];
    double rope_partial;   /* partial_rotary_factor (Phi-4-mini's 0.75): the first int(head_dim x
                              it) of each head rotate, the rest pass; 0: all (zo_model_rope_dim).
                              A double, as Python multiplies: 0.7 x 80 is 56 (a float's 55) */
    float rope_long_attention_factor; /* > 0: cos and sin's factor past rope_original_max, where it differs
                                         from the one within (Phi-3.5-MoE's long_mscale and short_mscale);
                                         0: rope_attention_factor at every length */
    float rope_attention_factor; /* rope_scaling's attention_factor, or as Hugging Face derives it:
                                    longrope: sqrt(1 + ln(s) / ln(original)) for s =
                                    max_position_embeddings / original > 1, else 1; yarn:
                                    mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both
                                    are given, else mscale(factor, 1), mscale(s, m) = 0.1 m ln(s) + 1
                                    (1 for s <= 1) */
    /* yarn (Qwen2.5 and Qwen3 long-context configs, DeepSeek-V2/V3): each
     * frequency a blend of itself and itself / rope_factor, by a ramp over the
     * pairs between the dims where beta_fast and beta_slow rotations fit in
     * rope_original_max positions */
    double rope_beta_fast, rope_beta_slow; /* rope_scaling's (defaults 32 and 1) */
    double rope_mscale, rope_mscale_all_dim; /* rope_scaling's (0: not given) */
    int rope_truncate;     /* rope_scaling's truncate (default true): the ramp's ends to integers */
    uint64_t params_override; /* != 0: only the total is known (--params) */
    /* ---- beyond the runtime's GPT and LLaMA layers. All 0 for what the
     * runtime builds; memplan sizes them, zo_model_config_runtime_check
     * refuses them for training; plans carry them as "model.features"
     * (common/plan_schema.c). ---- */
    char act[20];        /* the config's activation when it names one ("gelu_pytorch_tanh") */
    zo_pos pos;
    int pos_offset;      /* OPT: its learned table has max_seq + 2 rows */
    int layer_norms;     /* norms per layer; 0: two (Falcon-7B: one, Gemma-2: four) */
    int parallel_block;  /* attention and MLP read the same input (GPT-NeoX, Falcon, ...): the
                            runtime computes it for GPT-NeoX (use_parallel_residual) */
    int embed_norm;      /* BLOOM: a LayerNorm on the word embeddings */
    int qk_norm;         /* Qwen3: an RMSNorm over head_dim on q and on k */
    int qk_norm_heads;   /* with qk_norm, Cohere's use_qk_norm (command-r-plus): LayerNorms whose
                            weight is per head ([heads, head_dim] and [kv_heads, head_dim]), split
                            with the heads */
    int qk_norm_full;    /* with qk_norm, OLMo-2's: one RMSNorm over the whole q projection (n_heads x
                            head_dim, one weight of that width) and one over the whole k projection
                            (n_kv_heads x head_dim), before the split into heads and before RoPE */
    int attn_sinks;      /* gpt-oss's attention sinks: a learned logit per query head (self_attn.sinks
                            [n_heads]) that joins every row's softmax as a column without a value */
    int post_norms_only; /* the layer's two norms on the attention's and the MLP's outputs, before
                            each residual add, and none before either (OLMo-2's
                            post_attention_layernorm, post_feedforward_layernorm; layer_norms 2) */
    int mm_text;         /* the text model of a multimodal checkpoint (Gemma-3 4b/12b/27b,
                            Mistral-Small-3.1, LLaVA as published: *ForConditionalGeneration):
                            config under text_config, tensors under language_model. (or
                            model.language_model.), the vision tower neither read nor counted;
                            PEFT names its adapters under model.language_model.; a saved model
                            is the text model alone */
    zo_mla mla;
    zo_moe moe;
    /* DeepSeek-V2's and V3's routing beyond the greedy top k, which changes
     * no size (plans do not carry it: the runtime reads it from the config):
     * moe_group_limited, V2's topk_method "group_limited_greedy" (the
     * softmax's top k within the best moe_topk_groups of moe_groups groups,
     * each scored by its largest p); moe_sigmoid, V3's scoring_func
     * "sigmoid" with its noaux_tc choice (moe.router_bias: the score plus
     * e_score_correction_bias, each group scored by its two best keys' sum;
     * moe.norm_topk: norm_topk_prob whatever top_k); moe_groups and
     * moe_topk_groups, n_group and topk_group (0: one group of all);
     * moe_routed_scale, routed_scaling_factor on the routed experts'
     * weights (0: 1) */
    int moe_group_limited;
    int moe_sigmoid;
    int moe_groups, moe_topk_groups;
    float moe_routed_scale;
    /* An FP8 checkpoint's quantization_config (quant_method "fp8": DeepSeek-V3/R1,
     * Kimi-K2 as published): weight_block_size, the [rows, columns] of the
     * blocks each `_scale_inv` element scales (0: the default 128 x 128). The
     * loader dequantizes such weights as it reads them (model/safetensors.h);
     * nothing else depends on it: the model trains in its run's dtype. fmt,
     * "e4m3" or "e5m2" ("": not given), the FP8 format its weights must
     * have (the loader refuses a weight of the other); activation_scheme
     * (DeepSeek-V3's "dynamic") is accepted and not kept: it says how FP8
     * inference quantizes activations, and training runs in its dtype. */
    int fp8_block[2];
    char fp8_fmt[8];
    /* quantization_config's quant_method as given ("": none), and an MXFP4
     * checkpoint's (quant_method "mxfp4": gpt-oss as published)
     * modules_to_not_convert, the modules it keeps unquantized (each
     * pattern followed by '\n'; '*' matches any run of characters, and a
     * pattern names a module and everything under it). The loader
     * dequantizes a weight stored as `<name>_blocks` and `<name>_scales`
     * under "mxfp4" only, and never one of these modules'
     * (model/safetensors.h). */
    char quant_method[24];
    char quant_keep[512];
} zo_model_config;

/* What memplan's reports say of a multimodal checkpoint's model (mm_text):
 * its parameter count is the text model's, not the card's. */
#define ZO_MM_TEXT_NOTE "the text model of a multimodal checkpoint: its vision tower neither counted nor trained"

typedef struct zo_model_preset {
    const char *name;     /* "llama-2-13b" */
    const char *aliases;  /* comma-separated other accepted names */
    zo_model_config cfg;
} zo_model_preset;

/* Phi-3's fused projections: q, k and v stored as row ranges of one
 * qkv_proj, gate and up of one gate_up_proj (the layout's tensors, PEFT's
 * adapters, the largest weight QLoRA dequantizes at once). */
int zo_model_fused_proj(const zo_model_config *c);

/* GPT-NeoX / Pythia: GPT layers with rotary positions, the erf GELU, a
 * parallel residual and query_key_value interleaved per head in its files. */
int zo_model_neox(const zo_model_config *c);
/* Falcon: GPT layers with rotary positions, multi-query or grouped kv heads,
 * one norm or two (ln_attn, ln_mlp) before a parallel attention and MLP, or
 * the sequential form; query_key_value grouped per kv head in its files. */
int zo_model_falcon(const zo_model_config *c);
/* GPT-NeoX, Falcon or BLOOM: GPT layers as Linear weights under their names,
 * rotary (BLOOM: ALiBi), the erf GELU allowed, query_key_value's rows
 * grouped per kv head in the file ([q ... k v] of group 0, then of group 1, ...) */
int zo_model_qkv_grouped(const zo_model_config *c);
/* BLOOM: GPT layers as Falcon's sequential ones (query_key_value per head
 * in its files, biases), ALiBi, a LayerNorm on the word embeddings */
int zo_model_bloom(const zo_model_config *c);
/* OPT: GPT layers as Linear weights under model.decoder., q, k and v
 * separate, learned positions read from row pos_offset (2) on, ReLU */
int zo_model_opt(const zo_model_config *c);
/* Phi-1/1.5/2: GPT layers as Linear weights under model.layers, q, k and
 * v separate and biased, partial rotary, one LayerNorm before a parallel
 * attention and MLP (fc1, fc2), a biased output layer. */
int zo_model_phi(const zo_model_config *c);
/* GPT-J: GPT layers as Linear weights under transformer.h, q, k and v
 * separate and unbiased, out_proj unbiased, fc_in and fc_out biased, one
 * LayerNorm before a parallel attention and MLP, rotary on the first
 * rotary_dim dimensions of each head with its pairs interleaved in the file
 * (model_tensor.hf_rope_rows), a biased output layer. */
int zo_model_gptj(const zo_model_config *c);
/* StarCoder2: GPT layers (LayerNorms with a bias, a biased GELU MLP under
 * c_fc and c_proj, sequential) with LLaMA's attention under its names (q,
 * k, v and o_proj apart, biased, GQA, rotary) and model.* names elsewhere. */
int zo_model_starcoder2(const zo_model_config *c);
/* ERNIE 4.5 (dense): LLaMA layers, every linear layer biased under use_bias,
 * rotary pairs interleaved (zo_model_rot_interleaved). */
int zo_model_ernie(const zo_model_config *c);
/* gpt-oss: LLaMA's layers with sinks (attn_sinks) and MoE MLPs whose router
 * and experts are biased and whose GLU is clamped; its experts stored fused
 * (model/layout.c). */
int zo_model_gpt_oss(const zo_model_config *c);
/* Cohere (Command-R, Aya) and Cohere2 (Command-R7B, Command-A): LLaMA
 * layers (SwiGLU, GQA) with a LayerNorm without a bias (layer_norm), one norm
 * before a parallel attention and MLP, rotary over the whole head with its
 * pairs interleaved in the file, the logits times logit_scale (logit_div its
 * inverse), tied. Cohere2's sliding layers attend over sliding_window keys
 * with that rotary, its global layers over all keys without any
 * (global_nope). */
int zo_model_cohere(const zo_model_config *c);
/* Granite-MoE: Granite's multipliers on Mixtral's MoE layers, its experts
 * stored fused (model/layout.c). */
int zo_model_granitemoe(const zo_model_config *c);
/* Phi-3.5-MoE: Mixtral's MoE layers with LayerNorms with a bias (layer_norm,
 * norm_bias), q/k/v/o and output biases, and the sparsemixer router. */
int zo_model_phimoe(const zo_model_config *c);
/* Mixtral's names for an MoE layer (block_sparse_moe.gate, experts.N.w1, w3,
 * w2): Mixtral's and Phi-3.5-MoE's. */
int zo_model_mixtral_names(const zo_model_config *c);
/* The families whose files interleave each head's rotary pairs (dims 2i,
 * 2i + 1 turn together): GPT-J and Cohere. Their q and k rows are held in
 * the kernels' halves order (model_tensor.hf_rope_rows). */
int zo_model_rot_interleaved(const zo_model_config *c);
/* Gemma-2's layers: a norm on the attention's and on the MLP's output
 * before each residual add (layer_norms 4 on a LLaMA layer); OLMo-2's, with
 * those two norms alone (post_norms_only). */
int zo_model_post_norms(const zo_model_config *c);
/* Whether the layer normalises its input before the attention and before
 * the MLP (every layer but post_norms_only's) */
int zo_model_pre_norms(const zo_model_config *c);
/* The q/k norms' 1/rms values a token: one a q and a k head (Qwen3,
 * Cohere's use_qk_norm), two with qk_norm_full (the whole q and the whole
 * k), none without q/k norms. */
int zo_model_qk_norm_rows(const zo_model_config *c);
/* Whether a family (or a config.json's model_type, the same names) is
 * Gemma's: gemma, gemma2, gemma3_text, whose RMSNorms multiply by 1 + w,
 * whose embedding is times sqrt(hidden) and whose MLP is GeGLU. Not
 * "gemma3", the multimodal model (refused). */
int zo_family_gemma(const char *family);

/* Whether layer l is a sliding (local) layer: with window_period p all but
 * every p-th layer (Gemma-2's and Gemma-3's layer_types, with or without a
 * window), else the layers from window_from_layer when there is a window. */
int zo_model_layer_sliding(const zo_model_config *c, int l);

/* The sliding window of layer l: sliding_window on the sliding layers, 0
 * elsewhere. */
int zo_model_layer_window(const zo_model_config *c, int l);

/* At most how many distinct windows a model's layers take
 * (zo_model_layer_window: sliding_window or 0). */
#define ZO_MODEL_WINDOWS 2

/* The distinct windows of layers [first, first + layers) in the order first
 * met (window[i]), and how many of those layers take each (count[i], or
 * count NULL); returns how many (0 for no layers). Counted by
 * zo_model_layer_sliding's rule without a walk over the layers. What asks
 * a question per window rather than per layer (memplan's attention scratch
 * and path shares) walks these, so a model whose layers take other windows
 * changes these functions, not their callers. */
int zo_model_windows(const zo_model_config *c, int first, int layers, int window[ZO_MODEL_WINDOWS],
                     int count[ZO_MODEL_WINDOWS]);

/* Whether layer l turns its q and k by their positions: every layer of a
 * rotary model but Cohere2's global ones (global_nope) and SmolLM3's NoPE
 * ones (nope_period). */
int zo_model_layer_rotary(const zo_model_config *c, int l);

/* The rotated part of a head: int(head_dim x partial_rotary_factor) as
 * Hugging Face computes it, or head_dim. */
int zo_model_rope_dim(const zo_model_config *c);

/* Whether a rope_scaling "longrope" switches from short_factor to
 * long_factor within `positions` (past rope_original_max). Generation
 * whose cache can cross it runs one forward over every token so far at the
 * crossing, of rope_original_max + 1 tokens a sequence
 * (zo_model_longrope_rows). */
int zo_model_longrope_switches(const zo_model_config *c, int positions);

/* The tokens a sequence generation's forwards take with `prompt`-token
 * prompts and a cache of `context`: the prompt, or the crossing's
 * rope_original_max + 1 when longrope switches within the context. */
int zo_model_longrope_rows(const zo_model_config *c, int prompt, int context);

/* The built-in presets, in listing order. */
const zo_model_preset *zo_model_presets(size_t *count);

/* The key a preset name is looked up by: lower case, without ' ', '-' and
 * '_' except that a separator between two digits stays as one '-' (so
 * "gpt3-1.3b", "gpt3-13b" and "gpt3-1-3b" stay three names); '.' is kept.
 * Every preset name and alias, of models and of hardware, has a key no
 * other preset's name or alias has (tests/test_planner.c checks every pair). */
void zo_preset_key(const char *name, char *out, size_t len);

/* Look a preset up by name or alias (by zo_preset_key). On a miss, returns
 * ZO_ERR_NOT_FOUND with a message listing the closest names; a name two
 * presets answer to is refused (ZO_ERR_INVALID), naming both. */
zo_status zo_model_preset_find(const char *name, zo_model_config *out);

/* Parse a Hugging Face config.json: a parser per family, chosen by
 * "model_type" (or "architectures"), with the family's Hugging Face defaults
 * for absent keys (docs/memplan.md, "Model families", lists them). A family
 * that is not modelled, or a key that changes the size and that the
 * family's parser does not model, is refused with ZO_ERR_UNSUPPORTED naming
 * the key. Errors name the file and the field, and malformed JSON gives the
 * line and column. */
zo_status zo_model_config_load(const char *path, zo_model_config *out);
/* `path` may be a Hugging Face model folder (config.json, tokenizer.json,
 * safetensors): its config.json, the model named after the folder
 * ("Llama-2-7b-hf" for /models/Llama-2-7b-hf/). */
/* The same from a string in memory; `path` is used in messages only. */
zo_status zo_model_config_parse(const char *json, const char *path, zo_model_config *out);

/* Fill derived fields (head_dim, n_kv_heads) and check the shape is sane:
 * positive sizes, heads dividing hidden where head_dim is derived, kv heads
 * dividing heads, and the limits of common/model_limits.h (no product of the
 * shape overflows; norm epsilons and rope_theta finite and not negative). A
 * config with only a total (params_override) has that total checked. */
zo_status zo_model_config_validate(zo_model_config *cfg);

/* The families zo_model_config_parse knows, modelled or refused, with what
 * each one is: for `memplan models` and the docs. */
typedef struct zo_family_info {
    const char *model_type;  /* "mixtral" */
    const char *what;        /* "LLaMA layers, MoE MLP (router + experts)" or why refused */
    int modelled;            /* 0: recognised and refused */
    int trainable;           /* the runtime (examples/train) builds it */
} zo_family_info;
const zo_family_info *zo_model_families(size_t *count);

/* ZO_OK when the runtime (model/, examples/) implements this shape: GPT-2,
 * LLaMA, Mistral or Qwen2 layers and nothing of the planner-only fields;
 * else ZO_ERR_UNSUPPORTED naming the family and what it lacks. What
 * model_layout_init lays out and the loader reads and writes is the same
 * set (tf_init and model_layout_init both ask it). */
zo_status zo_model_config_runtime_check(const zo_model_config *cfg);

/* One layer's parameters, by how tensor parallelism treats them. */
typedef struct zo_layer_params {
    uint64_t tp_split;   /* column/row-parallel matrices and the biases split with them */
    uint64_t replicated; /* norms, biases after a row-parallel reduction, MLA down
                            projections, the router and the shared expert's gate */
    uint64_t expert;     /* one routed expert (split by TP like an MLP) */
    int experts;         /* routed experts in this layer; 0: a dense layer */
    uint64_t total;      /* tp_split + replicated + experts x expert */
    uint64_t active;     /* used by one token: total less (experts - top_k) x expert */
} zo_layer_params;

int zo_model_layer_is_moe(const zo_model_config *cfg, int layer);
/* How many layers have experts: every one from first_dense on (0 in a dense model). */
int zo_model_moe_layers(const zo_model_config *cfg);
/* The parameters no block holds, counted in zo_model_params as Hugging
 * Face counts them but never trained: DeepSeek-V3's router score
 * corrections, experts of them a MoE layer (0 for other models). */
uint64_t zo_model_router_bias_params(const zo_model_config *cfg);
/* The shared expert's module under an MoE layer's mlp: DeepSeek's
 * "shared_experts" (its n_shared_experts as one MLP), else Qwen2-MoE's
 * "shared_expert". */
const char *zo_moe_shared_name(const zo_model_config *cfg);

/* Capacity-limited routing (memplan's --capacity-factor F, the plan's
 * parallel.capacity_factor; 0: dropless): an expert takes at most
 * C = ceil(F n top_k / experts) pairs (at least 1, at most n: a token once)
 * of a rank's n tokens in a micro-batch; the rest are dropped. */
uint64_t zo_moe_capacity(const zo_model_config *cfg, double factor, uint64_t n);
/* The most rows the experts of one rank of `ranks` (expert parallelism,
 * experts / ranks of them a rank; 1: all) can receive from the ranks' n
 * tokens each: ranks n min(top_k, experts / ranks), at most
 * ranks (experts / ranks) C with a capacity factor (each rank drops among
 * its own tokens before the exchange). ranks 1: the pairs n tokens route
 * to experts that take them, min(n top_k, experts C). */
uint64_t zo_moe_rank_rows(const zo_model_config *cfg, double factor, uint64_t n, uint64_t ranks);
/* The most rows one expert can receive from `ranks` ranks of n tokens
 * each: a token once, so n from each rank, or C with a capacity factor
 * (an expert's LoRA scratch, which holds one expert's rows at a time). */
uint64_t zo_moe_expert_rows(const zo_model_config *cfg, double factor, uint64_t n, uint64_t ranks);
/* NULL when `factor` suits the model, else why not (negative or not a
 * number; positive for a model without routed experts): callers name
 * their flag or field. */
const char *zo_moe_check_capacity(const zo_model_config *cfg, double factor);

/* Rows of the learned position table (GPT-2's max_seq, OPT's max_seq + 2);
 * 0 for rotary and ALiBi models, which take any sequence length. */
uint64_t zo_model_position_rows(const zo_model_config *cfg);
void zo_model_layer_params(const zo_model_config *cfg, int layer, zo_layer_params *out);

/* Widths of the attention's tensors per token: q, k, v (all heads) and the
 * output projection's input. Standard attention: heads x head_dim, kv_heads
 * x head_dim twice, heads x head_dim; MLA: heads x (qk_nope + qk_rope) for
 * q and k, heads x v_dim for v and the output. */
void zo_model_attn_widths(const zo_model_config *cfg, uint64_t *q, uint64_t *k, uint64_t *v,
                          uint64_t *o);

/* Exact parameter counts. */
typedef struct zo_param_counts {
    uint64_t embedding;   /* token (+ position) embeddings (+ BLOOM's embedding norm) */
    uint64_t per_layer;   /* one transformer layer (the last one), norms and biases included */
    uint64_t layers;      /* all layers (n_layers * per_layer when they are alike) */
    uint64_t final_norm;
    uint64_t head;        /* output projection; 0 when tied */
    uint64_t total;
    uint64_t experts;     /* routed expert parameters, all layers (in `layers`) */
    uint64_t active;      /* used per token: total less the routed experts a token skips */
    int moe_layers;       /* layers with experts */
} zo_param_counts;

void zo_model_param_counts(const zo_model_config *cfg, zo_param_counts *out);
uint64_t zo_model_params(const zo_model_config *cfg);

const char *zo_arch_name(zo_arch a); /* "gpt", "llama" */
/* The model's family as the programs' headers name it: the config's
 * model_type or the preset's family ("mixtral", "qwen2_moe", "llama2"),
 * else (a shape given by hand: "" or "custom") its arch's name. */
const char *zo_model_family_name(const zo_model_config *cfg);

#endif
