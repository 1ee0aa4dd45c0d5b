/* LoRA targets and PEFT's trainable-parameter count (lora.h). */
#include "lora.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Target names: ours, PEFT's LLaMA module names, PEFT's GPT-2, Phi-3,
 * GPT-NeoX, OPT and GPT-J module names. */
static const struct {
    const char *name;
    unsigned bits;
} target_names[] = {
    {"q", ZO_LORA_Q},
    {"k", ZO_LORA_K},
    {"v", ZO_LORA_V},
    {"o", ZO_LORA_O},
    {"gate", ZO_LORA_GATE},
    {"up", ZO_LORA_UP},
    {"down", ZO_LORA_DOWN},
    {"q_proj", ZO_LORA_Q},
    {"k_proj", ZO_LORA_K},
    {"v_proj", ZO_LORA_V},
    {"o_proj", ZO_LORA_O},
    {"gate_proj", ZO_LORA_GATE},
    {"up_proj", ZO_LORA_UP},
    {"down_proj", ZO_LORA_DOWN},
    {"c_attn", ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V},
    {"qkv_proj", ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V},
    {"gate_up_proj", ZO_LORA_GATE | ZO_LORA_UP},
    {"c_fc", ZO_LORA_UP},
    {"query_key_value", ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V}, /* GPT-NeoX */
    {"dense", ZO_LORA_O},
    {"dense_h_to_4h", ZO_LORA_UP},
    {"dense_4h_to_h", ZO_LORA_DOWN},
    {"out_proj", ZO_LORA_O}, /* OPT */
    {"fc1", ZO_LORA_UP},
    {"fc2", ZO_LORA_DOWN},
    {"fc_in", ZO_LORA_UP}, /* GPT-J */
    {"fc_out", ZO_LORA_DOWN},
    {"c_proj", ZO_LORA_O | ZO_LORA_DOWN},
    {"w1", ZO_LORA_GATE},
    {"w3", ZO_LORA_UP},
    {"w2", ZO_LORA_DOWN},
    /* DeepSeek-V2's latent attention: q's projections, and the two that
     * make its keys and values */
    {"q_a_proj", ZO_LORA_Q},
    {"q_b_proj", ZO_LORA_Q},
    {"kv_a_proj_with_mqa", ZO_LORA_K | ZO_LORA_V},
    {"kv_b_proj", ZO_LORA_K | ZO_LORA_V},
    {"all-linear", ZO_LORA_ALL_LINEAR},
};

zo_status zo_lora_targets_parse(const char *s, unsigned *out)
{
    if (!s || !*s) return zo_error(ZO_ERR_INVALID, "LoRA targets: empty list");
    unsigned bits = 0;
    const char *p = s;
    while (*p) {
        size_t len = strcspn(p, ",");
        int found = 0;
        for (size_t i = 0; i < sizeof target_names / sizeof target_names[0]; i++)
            if (strlen(target_names[i].name) == len && !strncasecmp(p, target_names[i].name, len)) {
                bits |= target_names[i].bits;
                found = 1;
                break;
            }
        if (!found)
            return zo_error(ZO_ERR_INVALID,
                            "LoRA targets \"%s\": unknown target \"%.*s\" (expected q, k, v, o, "
                            "gate, up, down, PEFT's module names such as q_proj or w1, or all-linear)",
                            s, (int)len, p);
        p += len;
        if (*p == ',') p++;
    }
    *out = bits;
    return ZO_OK;
}

const char *zo_lora_targets_str(unsigned targets, char *buf, size_t len)
{
    static const char *const names[] = {"q", "k", "v", "o", "gate", "up", "down"};
    if (!len) return buf;
    buf[0] = '\0';
    if ((targets & ZO_LORA_ALL_LINEAR) == ZO_LORA_ALL_LINEAR) {
        snprintf(buf, len, "all-linear");
        return buf;
    }
    size_t n = 0;
    for (int i = 0; i < 7 && n < len; i++)
        if (targets & (1u << i)) n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? "," : "", names[i]);
    return buf;
}

int zo_lora_adapts_experts(const zo_model_config *cfg)
{
    return !zo_model_granitemoe(cfg) && !zo_model_gpt_oss(cfg);
}

zo_status zo_lora_check(const zo_model_config *cfg, const zo_lora_config *lc)
{
    if (lc->r < 1) return zo_error(ZO_ERR_INVALID, "LoRA: rank %d must be >= 1", lc->r);
    if (!isfinite(lc->alpha) || lc->alpha <= 0.0f)
        return zo_error(ZO_ERR_INVALID, "LoRA: alpha %g must be finite and > 0", (double)lc->alpha);
    if (!(lc->targets & ZO_LORA_ALL_LINEAR))
        return zo_error(ZO_ERR_INVALID, "LoRA: no target layers");
    if (lc->targets & ~ZO_LORA_ALL_LINEAR)
        return zo_error(ZO_ERR_INVALID, "LoRA: unknown target bits 0x%x", lc->targets);
    int all = (lc->targets & ZO_LORA_ALL_LINEAR) == ZO_LORA_ALL_LINEAR;
    if (cfg->arch == ZO_ARCH_GPT && (lc->targets & ZO_LORA_GATE) && !all)
        return zo_error(ZO_ERR_INVALID,
                        "LoRA: %s has no gate projection (its MLP is %s: targets up, down)", cfg->name,
                        zo_model_qkv_grouped(cfg) ? "dense_h_to_4h and dense_4h_to_h"
                        : zo_model_opt(cfg) || zo_model_phi(cfg) ? "fc1 and fc2"
                        : zo_model_gptj(cfg)                     ? "fc_in and fc_out"
                                                                 : "c_fc and c_proj");
    const int granite = zo_model_granitemoe(cfg);
    if (!zo_lora_adapts_experts(cfg) && (lc->targets & (ZO_LORA_GATE | ZO_LORA_UP | ZO_LORA_DOWN)) && !all)
        return zo_error(ZO_ERR_INVALID,
                        "LoRA: %s (%s) adapts the attention's projections only (targets q, k, v, o; all-linear "
                        "is those): its experts (%s) are not Linear modules PEFT adapts", cfg->name,
                        granite ? "Granite-MoE" : "gpt-oss",
                        granite ? "block_sparse_moe.input_linear, output_linear" : "mlp.experts.gate_up_proj, down_proj");
    return ZO_OK;
}

/* A module that is neither a routed expert's nor a latent-attention projection */
#define LORA_MODULE(targets, peft, path, in, out) {targets, peft, path, in, out, 0, NULL, ZO_LORA_LATENT_NONE}

int zo_lora_layer_modules(const zo_model_config *c, unsigned targets,
                          zo_lora_module out[ZO_LORA_MAX_MODULES])
{
    const int64_t h = c->hidden, f = c->ffn;
    const int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    const zo_lora_module gpt[] = {
        LORA_MODULE(ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V, "c_attn", "attn.c_attn", h, q + 2 * kv),
        LORA_MODULE(ZO_LORA_O, "attn.c_proj", "attn.c_proj", q, h),
        LORA_MODULE(ZO_LORA_UP, "c_fc", "mlp.c_fc", h, f),
        LORA_MODULE(ZO_LORA_DOWN, "mlp.c_proj", "mlp.c_proj", f, h),
    };
    /* GPT-NeoX and Falcon: GPT-2's modules under their names (PEFT matches
     * "dense" to the attention's alone: a name ends with ".dense") */
    const int neox_names = zo_model_neox(c);
    const zo_lora_module neox[] = {
        LORA_MODULE(ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V, "query_key_value",
         neox_names ? "attention.query_key_value" : "self_attention.query_key_value", h, q + 2 * kv),
        LORA_MODULE(ZO_LORA_O, "dense", neox_names ? "attention.dense" : "self_attention.dense", q, h),
        LORA_MODULE(ZO_LORA_UP, "dense_h_to_4h", "mlp.dense_h_to_4h", h, f),
        LORA_MODULE(ZO_LORA_DOWN, "dense_4h_to_h", "mlp.dense_4h_to_h", f, h),
    };
    enum { LLAMA_Q, LLAMA_K, LLAMA_V, LLAMA_O, LLAMA_GATE, LLAMA_UP, LLAMA_DOWN }; /* llama[]'s rows */
    const zo_lora_module llama[] = {
        LORA_MODULE(ZO_LORA_Q, "q_proj", "self_attn.q_proj", h, q),
        LORA_MODULE(ZO_LORA_K, "k_proj", "self_attn.k_proj", h, kv),
        LORA_MODULE(ZO_LORA_V, "v_proj", "self_attn.v_proj", h, kv),
        LORA_MODULE(ZO_LORA_O, "o_proj", "self_attn.o_proj", q, h),
        LORA_MODULE(ZO_LORA_GATE, "gate_proj", "mlp.gate_proj", h, f),
        LORA_MODULE(ZO_LORA_UP, "up_proj", "mlp.up_proj", h, f),
        LORA_MODULE(ZO_LORA_DOWN, "down_proj", "mlp.down_proj", f, h),
    };
    /* Phi-3: q|k|v and gate|up are one Linear each */
    const zo_lora_module phi3[] = {
        LORA_MODULE(ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V, "qkv_proj", "self_attn.qkv_proj", h, q + 2 * kv),
        llama[LLAMA_O],
        LORA_MODULE(ZO_LORA_GATE | ZO_LORA_UP, "gate_up_proj", "mlp.gate_up_proj", h, 2 * f),
        llama[LLAMA_DOWN],
    };
    /* a mixture of experts: the attention's, then the routed experts' (each
     * module once per expert), then the shared expert's. Granite-MoE's and
     * gpt-oss's attention's only: their experts are not Linear modules
     * (PEFT's LoRA refuses ParallelExperts; GptOssExperts holds parameters)
     * and their routers (router.layer, mlp.router: Linears that PEFT's
     * "all-linear" would reach) carry no adapters here, as no MoE router does */
    const int mixtral = zo_model_mixtral_names(c);
    const int attn_only = !zo_lora_adapts_experts(c);
    const int64_t fe = c->moe.expert_ffn, fs = c->moe.shared_ffn, E = c->moe.experts;
    const char *ep = mixtral ? "block_sparse_moe.experts" : "mlp.experts";
    /* the shared expert's paths (Qwen2-MoE's mlp.shared_expert, DeepSeek's mlp.shared_experts) */
    static const char *const shared_paths[2][3] = {
        {"mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj"},
        {"mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj"}};
    const char *const *shared = shared_paths[!strcmp(zo_moe_shared_name(c), "shared_experts")];
    const zo_lora_module moe[] = {
        llama[LLAMA_Q], llama[LLAMA_K], llama[LLAMA_V], llama[LLAMA_O],
        {ZO_LORA_GATE, mixtral ? "w1" : "gate_proj", mixtral ? "w1" : "gate_proj", h, fe, (int)E, ep, ZO_LORA_LATENT_NONE},
        {ZO_LORA_UP, mixtral ? "w3" : "up_proj", mixtral ? "w3" : "up_proj", h, fe, (int)E, ep, ZO_LORA_LATENT_NONE},
        {ZO_LORA_DOWN, mixtral ? "w2" : "down_proj", mixtral ? "w2" : "down_proj", fe, h, (int)E, ep, ZO_LORA_LATENT_NONE},
        LORA_MODULE(ZO_LORA_GATE, "gate_proj", shared[0], h, fs),
        LORA_MODULE(ZO_LORA_UP, "up_proj", shared[1], h, fs),
        LORA_MODULE(ZO_LORA_DOWN, "down_proj", shared[2], fs, h),
    };
    /* OPT: q, k and v as LLaMA's, then out_proj and the MLP's fc1, fc2 */
    const zo_lora_module opt[] = {
        llama[LLAMA_Q], llama[LLAMA_K], llama[LLAMA_V],
        LORA_MODULE(ZO_LORA_O, "out_proj", "self_attn.out_proj", q, h),
        LORA_MODULE(ZO_LORA_UP, "fc1", "fc1", h, f),
        LORA_MODULE(ZO_LORA_DOWN, "fc2", "fc2", f, h),
    };
    /* Phi: q, k and v as LLaMA's, then the attention's dense and the MLP's fc1, fc2 */
    const zo_lora_module phi[] = {
        llama[LLAMA_Q], llama[LLAMA_K], llama[LLAMA_V],
        LORA_MODULE(ZO_LORA_O, "dense", "self_attn.dense", q, h),
        LORA_MODULE(ZO_LORA_UP, "fc1", "mlp.fc1", h, f),
        LORA_MODULE(ZO_LORA_DOWN, "fc2", "mlp.fc2", f, h),
    };
    /* GPT-J: q, k, v, out_proj under attn, the MLP's fc_in, fc_out */
    const zo_lora_module gptj[] = {
        LORA_MODULE(ZO_LORA_Q, "q_proj", "attn.q_proj", h, q),
        LORA_MODULE(ZO_LORA_K, "k_proj", "attn.k_proj", h, kv),
        LORA_MODULE(ZO_LORA_V, "v_proj", "attn.v_proj", h, kv),
        LORA_MODULE(ZO_LORA_O, "out_proj", "attn.out_proj", q, h),
        LORA_MODULE(ZO_LORA_UP, "fc_in", "mlp.fc_in", h, f),
        LORA_MODULE(ZO_LORA_DOWN, "fc_out", "mlp.fc_out", f, h),
    };
    /* StarCoder2: LLaMA's attention, then the MLP's c_fc and c_proj (PEFT's
     * "c_proj" there names the MLP's alone: o_proj is the attention's) */
    const zo_lora_module starcoder2[] = {
        llama[LLAMA_Q], llama[LLAMA_K], llama[LLAMA_V], llama[LLAMA_O],
        LORA_MODULE(ZO_LORA_UP, "c_fc", "mlp.c_fc", h, f),
        LORA_MODULE(ZO_LORA_DOWN, "c_proj", "mlp.c_proj", f, h),
    };
    /* DeepSeek-V2's latent attention in place of q, k, v and o: q_proj, or
     * q_a_proj and q_b_proj (q); kv_a_proj_with_mqa and kv_b_proj (k and v
     * both: each feeds both); o_proj */
    if (c->mla.kv_rank) {
        const zo_mla *x = &c->mla;
        const int64_t H = c->n_heads, dq = x->qk_nope + x->qk_rope, qr = x->q_rank;
        const int64_t kaw = x->kv_rank + x->qk_rope, kvw = H * (x->qk_nope + x->v_dim), ow = H * x->v_dim;
        zo_lora_module mla[ZO_LORA_MAX_MODULES];
        size_t k = 0;
        if (qr) {
            mla[k++] = (zo_lora_module){ZO_LORA_Q, "q_a_proj", "self_attn.q_a_proj", h, qr, 0, NULL, ZO_LORA_LATENT_Q_A};
            mla[k++] = (zo_lora_module){ZO_LORA_Q, "q_b_proj", "self_attn.q_b_proj", qr, H * dq, 0, NULL,
                                        ZO_LORA_LATENT_Q_B};
        } else {
            mla[k++] = (zo_lora_module)LORA_MODULE(ZO_LORA_Q, "q_proj", "self_attn.q_proj", h, H * dq);
        }
        mla[k++] = (zo_lora_module){ZO_LORA_K | ZO_LORA_V, "kv_a_proj_with_mqa", "self_attn.kv_a_proj_with_mqa", h, kaw,
                                    0, NULL, ZO_LORA_LATENT_KV_A};
        mla[k++] = (zo_lora_module){ZO_LORA_K | ZO_LORA_V, "kv_b_proj", "self_attn.kv_b_proj", x->kv_rank, kvw, 0, NULL,
                                    ZO_LORA_LATENT_KV_B};
        mla[k++] = (zo_lora_module)LORA_MODULE(ZO_LORA_O, "o_proj", "self_attn.o_proj", ow, h);
        /* then the MLP's: the MoE layer's (after moe[]'s four attention
         * modules) or LLaMA's (after its four) */
        const zo_lora_module *mlp = E ? moe + 4 : llama + 4;
        size_t n_mlp = E ? sizeof moe / sizeof moe[0] - 4 - (fs ? 0 : 3) : 3;
        for (size_t i = 0; i < n_mlp; i++) mla[k++] = mlp[i];
        int n = 0;
        for (size_t i = 0; i < k; i++)
            if (targets & mla[i].targets) out[n++] = mla[i];
        return n;
    }
    int grouped = zo_model_qkv_grouped(c), is_opt = zo_model_opt(c), is_phi = zo_model_phi(c);
    int is_gptj = zo_model_gptj(c), is_sc2 = zo_model_starcoder2(c);
    int gpt2 = c->arch == ZO_ARCH_GPT && !grouped && !is_opt && !is_phi && !is_gptj && !is_sc2;
    int fused = !E && zo_model_fused_proj(c), n = 0;
    const zo_lora_module *all = grouped  ? neox
                                : is_opt ? opt
                                : is_phi ? phi
                                : is_gptj ? gptj
                                : is_sc2 ? starcoder2
                                : gpt2   ? gpt
                                : E      ? moe
                                : fused  ? phi3
                                         : llama;
    size_t count = grouped  ? sizeof neox / sizeof neox[0]
                   : is_opt ? sizeof opt / sizeof opt[0]
                   : is_phi ? sizeof phi / sizeof phi[0]
                   : is_gptj ? sizeof gptj / sizeof gptj[0]
                   : is_sc2 ? sizeof starcoder2 / sizeof starcoder2[0]
                   : gpt2   ? sizeof gpt / sizeof gpt[0]
                   : E     ? (attn_only ? 4 : sizeof moe / sizeof moe[0] - (fs ? 0 : 3))
                   : fused ? sizeof phi3 / sizeof phi3[0]
                           : sizeof llama / sizeof llama[0];
    for (size_t i = 0; i < count; i++)
        if (targets & all[i].targets) out[n++] = all[i];
    return n;
}

int zo_lora_layer_modules_at(const zo_model_config *c, int layer, unsigned targets,
                             zo_lora_module out[ZO_LORA_MAX_MODULES])
{
    if (!c->moe.experts || zo_model_layer_is_moe(c, layer)) return zo_lora_layer_modules(c, targets, out);
    zo_model_config dense = *c; /* DeepSeek's dense first layer: LLaMA's modules */
    dense.moe.experts = 0;
    return zo_lora_layer_modules(&dense, targets, out);
}

int zo_lora_dense_modules(const zo_lora_module *mods, int n, int *experts)
{
    int dense = 0;
    *experts = 0;
    for (int i = 0; i < n; i++) {
        if (mods[i].experts) *experts = 1;
        else dense++;
    }
    return dense;
}

uint64_t zo_lora_dequant_elems(const zo_model_config *cfg)
{
    zo_lora_module mods[ZO_LORA_MAX_MODULES];
    const unsigned qkv_bits = ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V;
    int n = zo_lora_layer_modules(cfg, ZO_LORA_ALL_LINEAR, mods);
    uint64_t widest = 0, qkv = 0;
    for (int i = 0; i < n; i++) {
        uint64_t w = (uint64_t)mods[i].in * (uint64_t)mods[i].out;
        if (w > widest) widest = w;
        if (!(mods[i].targets & ~qkv_bits)) qkv += w;
    }
    /* an MoE model's dense first layers (DeepSeek's first_dense): their
     * MLP's gate, up and down, each h x ffn (an MoE model's are never fused) */
    uint64_t dense = cfg->moe.experts && cfg->moe.first_dense ? (uint64_t)cfg->hidden * (uint64_t)cfg->ffn : 0;
    if (dense > widest) widest = dense;
    /* experts without adapters are NF4 all the same (Granite-MoE's, each h x
     * fe; gpt-oss's gate_up_proj one [2 fe, h] tensor an expert, gate and
     * up row ranges of it) */
    uint64_t experts = cfg->moe.experts ? (uint64_t)cfg->hidden * (uint64_t)cfg->moe.expert_ffn : 0;
    if (zo_model_gpt_oss(cfg)) experts *= 2;
    if (experts > widest) widest = experts;
    return qkv > widest ? qkv : widest;
}

const char *zo_lora_module_path(const zo_lora_module *m, int n, char *buf, size_t len)
{
    if (m->experts)
        snprintf(buf, len, "%s.%d.%s", m->expert_path, n, m->path);
    else
        snprintf(buf, len, "%s", m->path);
    return buf;
}

unsigned zo_lora_targets_effective(const zo_model_config *cfg, unsigned targets)
{
    zo_lora_module mods[ZO_LORA_MAX_MODULES];
    int n = zo_lora_layer_modules(cfg, targets, mods);
    unsigned bits = 0;
    for (int i = 0; i < n; i++) bits |= mods[i].targets;
    return bits;
}

uint64_t zo_lora_layer_params(const zo_model_config *cfg, int layer, int r, unsigned targets)
{
    zo_lora_module mods[ZO_LORA_MAX_MODULES];
    int n = zo_lora_layer_modules_at(cfg, layer, targets, mods);
    uint64_t el = 0;
    for (int i = 0; i < n; i++)
        el += (uint64_t)(mods[i].experts ? mods[i].experts : 1) * (uint64_t)r * (uint64_t)(mods[i].in + mods[i].out);
    return el;
}

uint64_t zo_lora_trainable_params(const zo_model_config *cfg, int r, unsigned targets)
{
    /* (two kinds of layer: DeepSeek's dense first ones, then MoE ones) */
    int n_moe = zo_model_moe_layers(cfg), n_dense = cfg->n_layers - n_moe;
    uint64_t total = 0;
    if (n_dense) total += zo_lora_layer_params(cfg, 0, r, targets) * (uint64_t)n_dense;
    if (n_moe) total += zo_lora_layer_params(cfg, cfg->n_layers - 1, r, targets) * (uint64_t)n_moe;
    return total;
}
