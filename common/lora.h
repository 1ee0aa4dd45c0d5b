/* LoRA (Hu et al., 2021) as Hugging Face PEFT applies it to a causal LM:
 * which linear layers of a transformer layer carry adapters, and how many
 * trainable parameters that makes, counted exactly as PEFT counts them.
 *
 * An adapted linear layer y = W x (W [out, in], frozen) becomes
 * y = W x + (alpha / r) B A x with A [r, in] and B [out, r] trainable, so
 * it adds r (in + out) trainable parameters. PEFT adapts no embedding, norm,
 * bias or output head (its "all-linear" leaves the head out), so the
 * trainable count is n_layers times the sum of r (in + out) over the
 * adapted layers of one transformer layer.
 *
 * Targets name the projections of a layer: q, k, v, o, gate, up, down.
 * LLaMA-family models have one Linear for each (q_proj ... down_proj).
 * GPT-2 fuses q, k and v into one Conv1D, c_attn: as PEFT targets it (its
 * default for gpt2 is ["c_attn"]), one adapter covers the fused layer, A
 * [r, h] and B [3h, r], so any of q, k, v on GPT-2 means c_attn; o is
 * attn.c_proj, up is mlp.c_fc, down is mlp.c_proj, and GPT-2 has no gate.
 * Phi-3 (Phi-3.5, Phi-4) fuses the same way, as PEFT targets it: any of q,
 * k, v means self_attn.qkv_proj (A [r, h], B [q + 2kv, r]) and either of
 * gate, up means mlp.gate_up_proj (A [r, h], B [2f, r], gate's rows first);
 * o and down are o_proj and down_proj.
 *
 * A mixture-of-experts layer (Mixtral, Qwen2-MoE) has no dense MLP: gate,
 * up and down adapt every routed expert's projection (Mixtral's
 * block_sparse_moe.experts.N.w1, w3, w2; Qwen2-MoE's
 * mlp.experts.N.gate_proj, up_proj, down_proj) and Qwen2-MoE's shared
 * expert's (mlp.shared_expert.gate_proj ...), as PEFT's target_modules
 * "w1" or "gate_proj" reach every module whose name ends so. The router
 * (block_sparse_moe.gate, mlp.gate) and Qwen2-MoE's shared_expert_gate
 * carry no adapters: PEFT's "all-linear" would include them, this
 * runtime's leaves them out and writes the modules it adapted, by name,
 * into adapter_config.json. */
#ifndef ZO_COMMON_LORA_H
#define ZO_COMMON_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "model_config.h" /* defines: zo_model_config */
#include "status.h"       /* defines: zo_status */

enum {
    ZO_LORA_Q = 1u << 0,
    ZO_LORA_K = 1u << 1,
    ZO_LORA_V = 1u << 2,
    ZO_LORA_O = 1u << 3,
    ZO_LORA_GATE = 1u << 4,
    ZO_LORA_UP = 1u << 5,
    ZO_LORA_DOWN = 1u << 6,
};
/* Which of DeepSeek-V2's latent-attention projections a module is (its
 * targets say only q, or k and v): the runtime's stages, the weight it sits
 * beside and memplan's decoding cost all key on this, not on PEFT's name. */
typedef enum zo_lora_latent {
    ZO_LORA_LATENT_NONE = 0, /* not one (latent attention's q_proj and o_proj are plain q and o) */
    ZO_LORA_LATENT_Q_A,      /* q_a_proj */
    ZO_LORA_LATENT_Q_B,      /* q_b_proj */
    ZO_LORA_LATENT_KV_A,     /* kv_a_proj_with_mqa */
    ZO_LORA_LATENT_KV_B,     /* kv_b_proj */
} zo_lora_latent;

#define ZO_LORA_ALL_LINEAR 0x7fu /* every projection the architecture has */
#define ZO_LORA_MAX_MODULES 12   /* kinds of adapted linear layers per transformer layer (DeepSeek-V2: 5 + 6) */

typedef struct zo_lora_config {
    int r;            /* rank; 0: no LoRA */
    float alpha;      /* lora_alpha: the update is scaled by alpha / r */
    unsigned targets; /* ZO_LORA_* bits */
} zo_lora_config;

/* One linear layer of a transformer layer that carries an adapter. */
typedef struct zo_lora_module {
    unsigned targets; /* the target bits it stands for (GPT-2 c_attn: q|k|v) */
    const char *peft; /* its entry in PEFT's target_modules ("q_proj", "c_attn", "attn.c_proj") */
    const char *path; /* its module path inside the layer ("self_attn.q_proj", "attn.c_attn"); a
                         routed expert's: the path inside the expert ("w1", "gate_proj") */
    int64_t in, out;  /* A is [r, in], B is [out, r] */
    int experts;      /* 0: one module; else one per routed expert, at expert_path.N.path */
    const char *expert_path; /* "block_sparse_moe.experts", "mlp.experts" (experts > 0) */
    zo_lora_latent latent;   /* a latent-attention projection, or ZO_LORA_LATENT_NONE */
} zo_lora_module;

/* Parse a comma-separated list of q, k, v, o, gate, up, down (PEFT's module
 * names q_proj ... down_proj, c_attn, c_fc, c_proj, Phi-3's qkv_proj and
 * gate_up_proj, and Mixtral's experts' w1 (gate), w3 (up), w2 (down) are
 * accepted too), or "all-linear".
 * ZO_ERR_INVALID names the unknown entry. */
zo_status zo_lora_targets_parse(const char *s, unsigned *out);
/* "q,v", or "all-linear" for every bit. */
const char *zo_lora_targets_str(unsigned targets, char *buf, size_t len);
/* A module's path inside its layer: `path`, or expert_path.N.path for
 * routed expert n. */
const char *zo_lora_module_path(const zo_lora_module *m, int n, char *buf, size_t len);

/* Check a LoRA choice against a model: r >= 1, alpha finite and > 0, at
 * least one target, and an explicit target the architecture has (gate on
 * GPT-2 is refused; "all-linear" takes what there is). */
zo_status zo_lora_check(const zo_model_config *cfg, const zo_lora_config *lc);

/* The adapted linear layers of one transformer layer, in the layer's order
 * (LLaMA: q k v o gate up down; GPT-2: c_attn, attn.c_proj, c_fc, mlp.c_proj;
 * Phi-3: qkv_proj, o_proj, gate_up_proj, down_proj;
 * an MoE layer: q k v o, the routed experts' gate up down (each module
 * `experts` times), the shared expert's gate up down); returns their count. */
int zo_lora_layer_modules(const zo_model_config *cfg, unsigned targets,
                          zo_lora_module out[ZO_LORA_MAX_MODULES]);
/* Those of layer `layer`: an MoE model's dense first layer (DeepSeek's
 * first_k_dense_replace) has a LLaMA layer's (its MLP of ffn), every other
 * layer zo_lora_layer_modules's. */
int zo_lora_layer_modules_at(const zo_model_config *cfg, int layer, unsigned targets,
                             zo_lora_module out[ZO_LORA_MAX_MODULES]);

/* Of the n modules zo_lora_layer_modules gave: how many are not a routed
 * expert's (the runtime keeps each one's A x [tokens, r] for its backward),
 * and in *experts whether any is (the experts' adapters run one expert at a
 * time through a scratch of their own and keep no A x). The runtime, the
 * generation plan and memplan all ask this. */
int zo_lora_dense_modules(const zo_lora_module *mods, int n, int *experts);

/* Elements of the widest weight QLoRA dequantizes at once, from a layer's
 * linear modules (zo_lora_layer_modules over all-linear: the weights QLoRA
 * stores in NF4; an MoE layer's router and shared expert gate stay 16-bit
 * and are not among them): each module whole (Phi-3's fused qkv_proj and
 * gate_up_proj are one tensor each, dequantized once for both gate and up;
 * a routed expert's, one expert's), and q, k and v summed where they are
 * modules apart, the runtime dequantizing them into one weight for its
 * fused q|k|v GEMM; an MoE model's dense first layers (first_dense) add
 * their MLP's h x ffn. The attention is taken as q, k, v and o: latent
 * attention (mla.kv_rank) has other projections, and adapters on it are
 * refused before this is asked (memplan's --lora check,
 * zo_model_config_runtime_check). The runtime's scratch (tf_model.wdq), the generation
 * plan's and memplan's QLoRA scratch (divided by TP there) are this. */
uint64_t zo_lora_dequant_elems(const zo_model_config *cfg);

/* Whether LoRA adapts an MoE layer's routed experts: not Granite-MoE's or
 * gpt-oss's, whose experts are not Linear modules PEFT wraps (their
 * adapters are the attention's). */
int zo_lora_adapts_experts(const zo_model_config *cfg);

/* The targets as the architecture has them: the bits of the linear layers
 * `targets` adapts (GPT-2: any of q, k, v is all three, c_attn; all-linear
 * is q|k|v|o|up|down). Two target sets adapt the same layers exactly when
 * these are equal ("all-linear" and the list of every module, "q" and
 * "c_attn" on GPT-2). */
unsigned zo_lora_targets_effective(const zo_model_config *cfg, unsigned targets);

/* Trainable parameters of rank-r adapters on `targets`, as PEFT's
 * print_trainable_parameters counts them (LLaMA-2-7B, r 8, q and v:
 * 4,194,304; an MoE layer: every expert's). */
uint64_t zo_lora_trainable_params(const zo_model_config *cfg, int r, unsigned targets);
/* Those of layer `layer` (its modules, zo_lora_layer_modules_at's: a
 * routed expert's times the experts). */
uint64_t zo_lora_layer_params(const zo_model_config *cfg, int layer, int r, unsigned targets);

#endif
