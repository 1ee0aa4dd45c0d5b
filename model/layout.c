#include "layout.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static const char *const role_names[MODEL_ROLE_COUNT] = {
    [MODEL_ROLE_TOK_EMB] = "tok_emb",
    [MODEL_ROLE_POS_EMB] = "pos_emb",
    [MODEL_ROLE_LN1_W] = "ln1_w",
    [MODEL_ROLE_LN1_B] = "ln1_b",
    [MODEL_ROLE_QKV_W] = "qkv_w",
    [MODEL_ROLE_QKV_B] = "qkv_b",
    [MODEL_ROLE_Q_W] = "q_w",
    [MODEL_ROLE_K_W] = "k_w",
    [MODEL_ROLE_V_W] = "v_w",
    [MODEL_ROLE_Q_B] = "q_b",
    [MODEL_ROLE_K_B] = "k_b",
    [MODEL_ROLE_V_B] = "v_b",
    [MODEL_ROLE_ATTN_OUT_W] = "attn_out_w",
    [MODEL_ROLE_ATTN_OUT_B] = "attn_out_b",
    [MODEL_ROLE_LN2_W] = "ln2_w",
    [MODEL_ROLE_LN2_B] = "ln2_b",
    [MODEL_ROLE_MLP_GATE_W] = "mlp_gate_w",
    [MODEL_ROLE_MLP_UP_W] = "mlp_up_w",
    [MODEL_ROLE_MLP_GATE_UP_W] = "mlp_gate_up_w",
    [MODEL_ROLE_MLP_GATE_B] = "mlp_gate_b",
    [MODEL_ROLE_MLP_UP_B] = "mlp_up_b",
    [MODEL_ROLE_MLP_GATE_UP_B] = "mlp_gate_up_b",
    [MODEL_ROLE_MLP_DOWN_W] = "mlp_down_w",
    [MODEL_ROLE_MLP_DOWN_B] = "mlp_down_b",
    [MODEL_ROLE_ROUTER_W] = "router_w",
    [MODEL_ROLE_EXPERT_GATE_W] = "expert_gate_w",
    [MODEL_ROLE_EXPERT_UP_W] = "expert_up_w",
    [MODEL_ROLE_EXPERT_DOWN_W] = "expert_down_w",
    [MODEL_ROLE_SHARED_GATE_W] = "shared_gate_w",
    [MODEL_ROLE_Q_NORM_W] = "q_norm_w",
    [MODEL_ROLE_K_NORM_W] = "k_norm_w",
    [MODEL_ROLE_POST_ATTN_NORM_W] = "post_attn_norm_w",
    [MODEL_ROLE_POST_MLP_NORM_W] = "post_mlp_norm_w",
    [MODEL_ROLE_EMB_NORM_W] = "emb_norm_w",
    [MODEL_ROLE_EMB_NORM_B] = "emb_norm_b",
    [MODEL_ROLE_NORM_W] = "norm_w",
    [MODEL_ROLE_NORM_B] = "norm_b",
    [MODEL_ROLE_LM_HEAD_W] = "lm_head_w",
    [MODEL_ROLE_LM_HEAD_B] = "lm_head_b",
    [MODEL_ROLE_Q_A_W] = "q_a_w",
    [MODEL_ROLE_Q_A_NORM_W] = "q_a_norm_w",
    [MODEL_ROLE_Q_B_W] = "q_b_w",
    [MODEL_ROLE_KV_A_W] = "kv_a_w",
    [MODEL_ROLE_KV_A_NORM_W] = "kv_a_norm_w",
    [MODEL_ROLE_KV_B_W] = "kv_b_w",
    [MODEL_ROLE_SINKS] = "sinks",
    [MODEL_ROLE_ROUTER_B] = "router_b",
    [MODEL_ROLE_EXPERT_GATE_UP_W] = "expert_gate_up_w",
    [MODEL_ROLE_EXPERT_GATE_UP_B] = "expert_gate_up_b",
    [MODEL_ROLE_EXPERT_GATE_B] = "expert_gate_b",
    [MODEL_ROLE_EXPERT_UP_B] = "expert_up_b",
    [MODEL_ROLE_EXPERT_DOWN_B] = "expert_down_b",
};

const char *model_role_name(model_role r)
{
    return (unsigned)r < MODEL_ROLE_COUNT ? role_names[r] : "?";
}

/* Builder state: tensors are appended in buffer order. The first failure is
 * kept in `st` and makes later appends do nothing, so the caller checks once. */
typedef struct builder {
    model_layout *l;
    int cap;
    int block;
    int layer;
    zo_status st;
} builder;

static model_view *view_at(model_layout *l, int block, model_role r)
{
    return &l->views[(size_t)block * MODEL_ROLE_COUNT + r];
}

/* Append one tensor of shape [d0] or [d0, d1] to the current block (nothing
 * after a failure: see builder.st). */
static void add(builder *b, model_role role, int hf_transposed, int64_t d0, int64_t d1,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static void add(builder *b, model_role role, int hf_transposed, int64_t d0, int64_t d1,
                const char *fmt, ...)
{
    model_layout *l = b->l;
    if (b->st != ZO_OK) return;
    if (l->n_tensors == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        model_tensor *t = realloc(l->tensors, (size_t)cap * sizeof *t);
        if (!t) {
            b->st = zo_error(ZO_ERR_NOMEM, "model layout: cannot grow to %d tensors", cap);
            return;
        }
        l->tensors = t;
        b->cap = cap;
    }
    model_tensor *t = &l->tensors[l->n_tensors];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->block = b->block;
    t->role = role;
    t->layer = b->layer;
    t->offset = l->block_numel[b->block];
    t->ndim = d1 > 0 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1 > 0 ? d1 : 0;
    t->numel = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    t->hf_transposed = hf_transposed;
    l->block_numel[b->block] += t->numel;
    model_view *v = view_at(l, b->block, role);
    v->offset = t->offset;
    v->numel = t->numel;
    v->ndim = t->ndim;
    v->shape[0] = t->shape[0];
    v->shape[1] = t->shape[1];
    v->tensor = l->n_tensors;
    l->n_tensors++;
}

/* A view covering the adjacent roles first..last (rows stacked), or a row
 * range [row0, row0 + rows) of the tensor holding role `whole`. */
static void fuse_views(model_layout *l, int block, model_role fused, const model_role *parts,
                       int n)
{
    const model_view *p0 = view_at(l, block, parts[0]);
    if (!p0->numel) return;
    model_view *v = view_at(l, block, fused);
    *v = *p0;
    v->tensor = -1;
    for (int i = 1; i < n; i++) {
        const model_view *p = view_at(l, block, parts[i]);
        v->numel += p->numel;
        v->shape[0] += p->shape[0];
    }
}

/* The fused q|k|v views (weights, biases) over separate q, k and v tensors. */
static void fuse_qkv(model_layout *l, int block)
{
    static const model_role qkv_w[] = {MODEL_ROLE_Q_W, MODEL_ROLE_K_W, MODEL_ROLE_V_W};
    static const model_role qkv_b[] = {MODEL_ROLE_Q_B, MODEL_ROLE_K_B, MODEL_ROLE_V_B};
    fuse_views(l, block, MODEL_ROLE_QKV_W, qkv_w, 3);
    fuse_views(l, block, MODEL_ROLE_QKV_B, qkv_b, 3);
}

static void sub_view(model_layout *l, int block, model_role whole, model_role part, int64_t row0,
                     int64_t rows)
{
    const model_view *w = view_at(l, block, whole);
    if (!w->numel) return;
    model_view *v = view_at(l, block, part);
    int64_t cols = w->ndim == 2 ? w->shape[1] : 1;
    v->offset = w->offset + (size_t)(row0 * cols);
    v->numel = (size_t)(rows * cols);
    v->ndim = w->ndim;
    v->shape[0] = rows;
    v->shape[1] = w->ndim == 2 ? cols : 0;
    v->tensor = -1;
}

/* q, k and v (weights and biases) as the row ranges [0, q), [q, q + kv),
 * [q + kv, q + 2 kv) of the fused QKV_W and QKV_B (GPT-2's c_attn, GPT-NeoX's
 * and Falcon's query_key_value in our row order). */
static void qkv_sub_views(model_layout *l, int bl, int64_t q, int64_t kv)
{
    sub_view(l, bl, MODEL_ROLE_QKV_W, MODEL_ROLE_Q_W, 0, q);
    sub_view(l, bl, MODEL_ROLE_QKV_W, MODEL_ROLE_K_W, q, kv);
    sub_view(l, bl, MODEL_ROLE_QKV_W, MODEL_ROLE_V_W, q + kv, kv);
    sub_view(l, bl, MODEL_ROLE_QKV_B, MODEL_ROLE_Q_B, 0, q);
    sub_view(l, bl, MODEL_ROLE_QKV_B, MODEL_ROLE_K_B, q, kv);
    sub_view(l, bl, MODEL_ROLE_QKV_B, MODEL_ROLE_V_B, q + kv, kv);
}

/* The gated MLP of a LLaMA layer (gate, up, down; Qwen2's biases where
 * out_bias; Phi-3's gate and up fused). */
static void llama_mlp(builder *b, int i)
{
    const zo_model_config *c = &b->l->cfg;
    const int64_t h = c->hidden, f = c->ffn;
    const char *p = "model.layers";
    if (zo_model_fused_proj(c)) /* Phi-3: gate and up as the row ranges of one gate_up_proj */
        add(b, MODEL_ROLE_MLP_GATE_UP_W, 0, 2 * f, h, "%s.%d.mlp.gate_up_proj.weight", p, i);
    else {
        add(b, MODEL_ROLE_MLP_GATE_W, 0, f, h, "%s.%d.mlp.gate_proj.weight", p, i);
        add(b, MODEL_ROLE_MLP_UP_W, 0, f, h, "%s.%d.mlp.up_proj.weight", p, i);
    }
    if (c->out_bias) {
        add(b, MODEL_ROLE_MLP_GATE_B, 0, f, 0, "%s.%d.mlp.gate_proj.bias", p, i);
        add(b, MODEL_ROLE_MLP_UP_B, 0, f, 0, "%s.%d.mlp.up_proj.bias", p, i);
    }
    add(b, MODEL_ROLE_MLP_DOWN_W, 0, h, f, "%s.%d.mlp.down_proj.weight", p, i);
    if (c->out_bias) add(b, MODEL_ROLE_MLP_DOWN_B, 0, h, 0, "%s.%d.mlp.down_proj.bias", p, i);
}

/* Granite-MoE's router and experts (layer i): the file fuses each
 * projection over the experts, input_linear [E, 2 fe, h] (expert e's gate
 * rows, then its up rows: chunk(2) of its output, the first activated) and
 * output_linear [E, h, fe]; ours are Mixtral's per-expert gate, up and down,
 * each a contiguous slice of the fused tensor (hf_fused), read from it at
 * load and written into it at save. */
static void granitemoe_experts(builder *b, int i)
{
    const zo_model_config *c = &b->l->cfg;
    const int64_t h = c->hidden, fe = c->moe.expert_ffn, E = c->moe.experts;
    add(b, MODEL_ROLE_ROUTER_W, 0, E, h, "model.layers.%d.block_sparse_moe.router.layer.weight", i);
    for (int e = b->l->expert_first; e < b->l->expert_first + b->l->expert_count; e++) {
        static const model_role roles[3] = {MODEL_ROLE_EXPERT_GATE_W, MODEL_ROLE_EXPERT_UP_W,
                                            MODEL_ROLE_EXPERT_DOWN_W};
        for (int k = 0; k < 3; k++) {
            int down = k == 2;
            add(b, roles[k], 0, down ? h : fe, down ? fe : h, "model.layers.%d.block_sparse_moe.%s.weight", i,
                down ? "output_linear" : "input_linear");
            if (b->st != ZO_OK) return;
            model_tensor *t = &b->l->tensors[b->l->n_tensors - 1];
            t->hf_fused[0] = E;
            t->hf_fused[1] = down ? h : 2 * fe;
            t->hf_fused[2] = down ? fe : h;
            t->hf_fused_at = (size_t)(e * t->hf_fused[1] * t->hf_fused[2] + (k == 1 ? fe * h : 0));
        }
    }
}

/* A fused slice of layer i's gpt-oss expert tensor `name` [E, d1(, d2)]:
 * expert e's run of d1 d2 elements (the last tensor added). */
static void fuse_expert(builder *b, int e, int64_t E, int64_t d1, int64_t d2)
{
    if (b->st != ZO_OK) return;
    model_tensor *t = &b->l->tensors[b->l->n_tensors - 1];
    t->hf_fused[0] = E;
    t->hf_fused[1] = d1;
    t->hf_fused[2] = d2;
    t->hf_fused_at = (size_t)(e * d1 * (d2 ? d2 : 1));
}

/* gpt-oss's router and experts (layer i): mlp.router's weight and bias;
 * the file's experts are each tensor fused over them, gate_up_proj
 * [E, h, 2 ffn] (x gate_up_proj: stored [in, out], and its columns
 * interleaved, gate 2j and up 2j + 1), gate_up_proj_bias [E, 2 ffn] (the
 * same interleave), down_proj [E, ffn, h] ([in, out]) and down_proj_bias
 * [E, h]. Ours: expert e's gate_up [2 ffn, h] (gate rows, then up rows:
 * the file's run transposed and de-interleaved, as the rotary pairs are,
 * hf_rope_rows over all 2 ffn rows), its bias [2 ffn] likewise, down
 * [h, ffn] and its bias [h], experts one after another. The views are
 * expert 0's; gate and up (weights and biases) their row ranges. */
static void gpt_oss_experts(builder *b, int i)
{
    model_layout *l = b->l;
    const zo_model_config *c = &l->cfg;
    const int64_t h = c->hidden, fe = c->moe.expert_ffn, E = c->moe.experts;
    add(b, MODEL_ROLE_ROUTER_W, 0, E, h, "model.layers.%d.mlp.router.weight", i);
    add(b, MODEL_ROLE_ROUTER_B, 0, E, 0, "model.layers.%d.mlp.router.bias", i);
    const int first = l->n_tensors;
    for (int e = l->expert_first; e < l->expert_first + l->expert_count; e++) {
        add(b, MODEL_ROLE_EXPERT_GATE_UP_W, 1, 2 * fe, h, "model.layers.%d.mlp.experts.gate_up_proj", i);
        fuse_expert(b, e, E, h, 2 * fe);
        if (b->st == ZO_OK) model_tensor_set_rope_rows(&l->tensors[l->n_tensors - 1], (int)(2 * fe), (int)(2 * fe), 0);
        add(b, MODEL_ROLE_EXPERT_GATE_UP_B, 0, 2 * fe, 0, "model.layers.%d.mlp.experts.gate_up_proj_bias", i);
        fuse_expert(b, e, E, 2 * fe, 0);
        if (b->st == ZO_OK) {
            model_tensor_set_rope_rows(&l->tensors[l->n_tensors - 1], (int)(2 * fe), (int)(2 * fe), 0);
            l->tensors[l->n_tensors - 1].hf_rope_elems = 1;
        }
        add(b, MODEL_ROLE_EXPERT_DOWN_W, 1, h, fe, "model.layers.%d.mlp.experts.down_proj", i);
        fuse_expert(b, e, E, fe, h);
        add(b, MODEL_ROLE_EXPERT_DOWN_B, 0, h, 0, "model.layers.%d.mlp.experts.down_proj_bias", i);
        fuse_expert(b, e, E, h, 0);
    }
    if (b->st != ZO_OK) return;
    for (int k = 0; k < 4; k++) { /* the views are expert 0's (add left the last expert's) */
        const model_tensor *t = &l->tensors[first + k];
        model_view *v = view_at(l, b->block, t->role);
        v->offset = t->offset;
        v->tensor = first + k;
    }
    sub_view(l, b->block, MODEL_ROLE_EXPERT_GATE_UP_W, MODEL_ROLE_EXPERT_GATE_W, 0, fe);
    sub_view(l, b->block, MODEL_ROLE_EXPERT_GATE_UP_W, MODEL_ROLE_EXPERT_UP_W, fe, fe);
    sub_view(l, b->block, MODEL_ROLE_EXPERT_GATE_UP_B, MODEL_ROLE_EXPERT_GATE_B, 0, fe);
    sub_view(l, b->block, MODEL_ROLE_EXPERT_GATE_UP_B, MODEL_ROLE_EXPERT_UP_B, fe, fe);
}

/* The MLP of an MoE layer (Mixtral's block_sparse_moe, Qwen2-MoE's and
 * DeepSeek's mlp): the router, the experts (gate, up, down each), the
 * shared expert(s) and Qwen2-MoE's gate on them. The EXPERT_* views are expert 0's. */
static void moe_layer(builder *b, int i)
{
    const zo_model_config *c = &b->l->cfg;
    const int64_t h = c->hidden, fe = c->moe.expert_ffn, fs = c->moe.shared_ffn;
    const int mixtral = zo_model_mixtral_names(c), granite = zo_model_granitemoe(c);
    const char *p = "model.layers", *m = mixtral ? "block_sparse_moe" : "mlp";
    int first = b->l->n_tensors;
    if (zo_model_gpt_oss(c)) {
        gpt_oss_experts(b, i);
        return;
    }
    if (granite) {
        granitemoe_experts(b, i);
    } else {
        add(b, MODEL_ROLE_ROUTER_W, 0, c->moe.experts, h, "%s.%d.%s.gate.weight", p, i, m);
        first = b->l->n_tensors;
    }
    for (int e = b->l->expert_first; !granite && e < b->l->expert_first + b->l->expert_count; e++) {
        add(b, MODEL_ROLE_EXPERT_GATE_W, 0, fe, h, "%s.%d.%s.experts.%d.%s.weight", p, i, m, e,
            mixtral ? "w1" : "gate_proj");
        add(b, MODEL_ROLE_EXPERT_UP_W, 0, fe, h, "%s.%d.%s.experts.%d.%s.weight", p, i, m, e,
            mixtral ? "w3" : "up_proj");
        add(b, MODEL_ROLE_EXPERT_DOWN_W, 0, h, fe, "%s.%d.%s.experts.%d.%s.weight", p, i, m, e,
            mixtral ? "w2" : "down_proj");
    }
    if (b->st != ZO_OK) return;
    if (granite) first++; /* (after the router) */
    /* the views are expert 0's (add left the last expert's) */
    for (int k = 0; k < 3; k++) {
        const model_tensor *t = &b->l->tensors[first + k];
        model_view *v = view_at(b->l, b->block, t->role);
        v->offset = t->offset;
        v->tensor = first + k;
    }
    if (fs) { /* Qwen2-MoE's shared_expert; DeepSeek's shared_experts, n of them as one MLP */
        const char *se = zo_moe_shared_name(c);
        add(b, MODEL_ROLE_MLP_GATE_W, 0, fs, h, "%s.%d.mlp.%s.gate_proj.weight", p, i, se);
        add(b, MODEL_ROLE_MLP_UP_W, 0, fs, h, "%s.%d.mlp.%s.up_proj.weight", p, i, se);
        add(b, MODEL_ROLE_MLP_DOWN_W, 0, h, fs, "%s.%d.mlp.%s.down_proj.weight", p, i, se);
    }
    if (c->moe.shared_gate)
        add(b, MODEL_ROLE_SHARED_GATE_W, 0, 1, h, "%s.%d.mlp.shared_expert_gate.weight", p, i);
}

size_t model_layout_expert_stride(const model_layout *l)
{
    const size_t h = (size_t)l->cfg.hidden, fe = (size_t)l->cfg.moe.expert_ffn;
    return 3 * h * fe + (l->cfg.moe.expert_bias ? 2 * fe + h : 0);
}

/* Block 0: the token embedding (and GPT's learned positions). */
static void embedding_block(builder *b)
{
    const zo_model_config *c = &b->l->cfg;
    const int64_t h = c->hidden, v = c->vocab;
    if (zo_model_neox(c)) {
        add(b, MODEL_ROLE_TOK_EMB, 0, v, h, "gpt_neox.embed_in.weight");
    } else if (zo_model_falcon(c) || zo_model_bloom(c)) {
        add(b, MODEL_ROLE_TOK_EMB, 0, v, h, "transformer.word_embeddings.weight");
        if (c->embed_norm) { /* BLOOM's */
            add(b, MODEL_ROLE_EMB_NORM_W, 0, h, 0, "transformer.word_embeddings_layernorm.weight");
            add(b, MODEL_ROLE_EMB_NORM_B, 0, h, 0, "transformer.word_embeddings_layernorm.bias");
        }
    } else if (zo_model_opt(c)) { /* positions from row pos_offset (2) on */
        add(b, MODEL_ROLE_TOK_EMB, 0, v, h, "model.decoder.embed_tokens.weight");
        add(b, MODEL_ROLE_POS_EMB, 0, c->max_seq + c->pos_offset, h, "model.decoder.embed_positions.weight");
    } else if (zo_model_gptj(c)) {
        add(b, MODEL_ROLE_TOK_EMB, 0, v, h, "transformer.wte.weight");
    } else if (c->arch == ZO_ARCH_GPT && !zo_model_phi(c) && !zo_model_starcoder2(c)) {
        add(b, MODEL_ROLE_TOK_EMB, 0, v, h, "wte.weight");
        add(b, MODEL_ROLE_POS_EMB, 0, c->max_seq, h, "wpe.weight");
    } else {
        add(b, MODEL_ROLE_TOK_EMB, 0, v, h, "model.embed_tokens.weight");
    }
}

/* Layer i of a GPT-2 model (the builder at its block): Conv1D weights
 * (transposed in the file), q, k and v as row ranges of the fused c_attn. */
static void gpt_layer(builder *b, int i)
{
    model_layout *l = b->l;
    const zo_model_config *c = &l->cfg;
    const int64_t h = c->hidden, f = c->ffn;
    const int64_t q = (int64_t)c->n_heads * c->head_dim;
    const int64_t kv = (int64_t)c->n_kv_heads * c->head_dim;
    const int bl = b->block;
    add(b, MODEL_ROLE_LN1_W, 0, h, 0, "h.%d.ln_1.weight", i);
    if (c->norm_bias) add(b, MODEL_ROLE_LN1_B, 0, h, 0, "h.%d.ln_1.bias", i);
    add(b, MODEL_ROLE_QKV_W, 1, q + 2 * kv, h, "h.%d.attn.c_attn.weight", i);
    if (c->attn_bias)
        add(b, MODEL_ROLE_QKV_B, 0, q + 2 * kv, 0, "h.%d.attn.c_attn.bias", i);
    add(b, MODEL_ROLE_ATTN_OUT_W, 1, h, q, "h.%d.attn.c_proj.weight", i);
    if (c->out_bias && !c->attn_out_nobias) add(b, MODEL_ROLE_ATTN_OUT_B, 0, h, 0, "h.%d.attn.c_proj.bias", i);
    add(b, MODEL_ROLE_LN2_W, 0, h, 0, "h.%d.ln_2.weight", i);
    if (c->norm_bias) add(b, MODEL_ROLE_LN2_B, 0, h, 0, "h.%d.ln_2.bias", i);
    add(b, MODEL_ROLE_MLP_UP_W, 1, f, h, "h.%d.mlp.c_fc.weight", i);
    if (c->out_bias) add(b, MODEL_ROLE_MLP_UP_B, 0, f, 0, "h.%d.mlp.c_fc.bias", i);
    add(b, MODEL_ROLE_MLP_DOWN_W, 1, h, f, "h.%d.mlp.c_proj.weight", i);
    if (c->out_bias) add(b, MODEL_ROLE_MLP_DOWN_B, 0, h, 0, "h.%d.mlp.c_proj.bias", i);
    qkv_sub_views(l, bl, q, kv); /* q, k, v are row ranges of the fused c_attn */
}

/* Layer i of a GPT-NeoX, Falcon or BLOOM model (BLOOM's is the sequential
 * Falcon's with biases, a kv head a query head): GPT-2's tensors under their names,
 * as Linear weights ([out, in]); query_key_value's rows grouped per kv head
 * in the file (hf_head_rows), [q | k | v] here. GPT-NeoX: every projection
 * and norm biased, two norms. Falcon: biases where `bias` (norms always);
 * one norm (input_layernorm) before a parallel attention and MLP, two
 * (ln_attn, ln_mlp) with the new decoder architecture, or the sequential
 * input_layernorm and post_attention_layernorm. */
static void grouped_layer(builder *b, int i)
{
    model_layout *l = b->l;
    const zo_model_config *c = &l->cfg;
    const int64_t h = c->hidden, f = c->ffn, q = (int64_t)c->n_heads * c->head_dim;
    const int64_t kv = (int64_t)c->n_kv_heads * c->head_dim;
    const int bl = b->block, neox = zo_model_neox(c);
    const char *p = neox ? "gpt_neox.layers" : "transformer.h", *att = neox ? "attention" : "self_attention";
    const char *n1 = "input_layernorm", *n2 = "post_attention_layernorm";
    if (!neox && c->parallel_block && c->layer_norms == 2) n1 = "ln_attn", n2 = "ln_mlp";
    add(b, MODEL_ROLE_LN1_W, 0, h, 0, "%s.%d.%s.weight", p, i, n1);
    add(b, MODEL_ROLE_LN1_B, 0, h, 0, "%s.%d.%s.bias", p, i, n1);
    if (c->layer_norms != 1) { /* GPT-NeoX has two (the config refuses one) */
        add(b, MODEL_ROLE_LN2_W, 0, h, 0, "%s.%d.%s.weight", p, i, n2);
        add(b, MODEL_ROLE_LN2_B, 0, h, 0, "%s.%d.%s.bias", p, i, n2);
    }
    int first = l->n_tensors;
    add(b, MODEL_ROLE_QKV_W, 0, q + 2 * kv, h, "%s.%d.%s.query_key_value.weight", p, i, att);
    if (c->attn_bias) add(b, MODEL_ROLE_QKV_B, 0, q + 2 * kv, 0, "%s.%d.%s.query_key_value.bias", p, i, att);
    for (int k = first; b->st == ZO_OK && k < l->n_tensors; k++) model_tensor_set_head_rows(&l->tensors[k], c);
    add(b, MODEL_ROLE_ATTN_OUT_W, 0, h, q, "%s.%d.%s.dense.weight", p, i, att);
    if (c->out_bias && !c->attn_out_nobias) add(b, MODEL_ROLE_ATTN_OUT_B, 0, h, 0, "%s.%d.%s.dense.bias", p, i, att);
    add(b, MODEL_ROLE_MLP_UP_W, 0, f, h, "%s.%d.mlp.dense_h_to_4h.weight", p, i);
    if (c->out_bias) add(b, MODEL_ROLE_MLP_UP_B, 0, f, 0, "%s.%d.mlp.dense_h_to_4h.bias", p, i);
    add(b, MODEL_ROLE_MLP_DOWN_W, 0, h, f, "%s.%d.mlp.dense_4h_to_h.weight", p, i);
    if (c->out_bias) add(b, MODEL_ROLE_MLP_DOWN_B, 0, h, 0, "%s.%d.mlp.dense_4h_to_h.bias", p, i);
    qkv_sub_views(l, bl, q, kv);
}

/* Layer i's q, k and v apart under `p` (LLaMA's model.layers, OPT's
 * model.decoder.layers) and `attn` (self_attn; GPT-J's attn): their weights
 * when `weights`, their biases when `biases`, {attn}.{q,k,v}_proj; GPT-J's
 * and Cohere's q_proj and k_proj (weights and biases) interleave each head's
 * rotated pairs in the file (hf_rope_rows). */
static void qkv_apart(builder *b, const char *p, const char *attn, int i, int weights, int biases)
{
    model_layout *l = b->l;
    const zo_model_config *c = &l->cfg;
    const int64_t h = c->hidden, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    if (weights) {
        int first = l->n_tensors;
        add(b, MODEL_ROLE_Q_W, 0, q, h, "%s.%d.%s.q_proj.weight", p, i, attn);
        add(b, MODEL_ROLE_K_W, 0, kv, h, "%s.%d.%s.k_proj.weight", p, i, attn);
        for (int k = first; zo_model_rot_interleaved(c) && b->st == ZO_OK && k < l->n_tensors; k++)
            model_tensor_set_rot_pairs(&l->tensors[k], c);
        add(b, MODEL_ROLE_V_W, 0, kv, h, "%s.%d.%s.v_proj.weight", p, i, attn);
    }
    if (biases) {
        int first = l->n_tensors;
        add(b, MODEL_ROLE_Q_B, 0, q, 0, "%s.%d.%s.q_proj.bias", p, i, attn);
        add(b, MODEL_ROLE_K_B, 0, kv, 0, "%s.%d.%s.k_proj.bias", p, i, attn);
        for (int k = first; zo_model_rot_interleaved(c) && b->st == ZO_OK && k < l->n_tensors; k++)
            model_tensor_set_rot_pairs(&l->tensors[k], c);
        add(b, MODEL_ROLE_V_B, 0, kv, 0, "%s.%d.%s.v_proj.bias", p, i, attn);
    }
}

/* The names of GPT-2's layer stored as Linear weights with q, k and v
 * apart: OPT's, Phi's, GPT-J's (ln2 NULL: one norm before a parallel
 * attention and MLP), StarCoder2's. */
typedef struct linear_gpt_names {
    const char *prefix, *ln1, *ln2, *attn, *out, *up, *down;
} linear_gpt_names;

static const linear_gpt_names opt_names = {"model.decoder.layers", "self_attn_layer_norm", "final_layer_norm",
                                           "self_attn", "out_proj", "fc1", "fc2"};
static const linear_gpt_names phi_names = {"model.layers", "input_layernorm", NULL, "self_attn", "dense",
                                           "mlp.fc1", "mlp.fc2"};
static const linear_gpt_names gptj_names = {"transformer.h", "ln_1", NULL, "attn", "out_proj", "mlp.fc_in",
                                            "mlp.fc_out"};
static const linear_gpt_names starcoder2_names = {"model.layers", "input_layernorm", "post_attention_layernorm",
                                                  "self_attn", "o_proj", "mlp.c_fc", "mlp.c_proj"};

/* Layer i of an OPT, Phi, GPT-J or StarCoder2 model under its names: the norms, q, k
 * and v (biased where attn_bias), the attention's output projection
 * (biased where out_bias but attn_out_nobias: GPT-J's is not), the MLP's
 * two (biased where out_bias), with fused views over q, k and v. */
static void linear_gpt_layer(builder *b, int i, const linear_gpt_names *n)
{
    model_layout *l = b->l;
    const zo_model_config *c = &l->cfg;
    const int64_t h = c->hidden, f = c->ffn, q = (int64_t)c->n_heads * c->head_dim;
    const char *p = n->prefix;
    add(b, MODEL_ROLE_LN1_W, 0, h, 0, "%s.%d.%s.weight", p, i, n->ln1);
    add(b, MODEL_ROLE_LN1_B, 0, h, 0, "%s.%d.%s.bias", p, i, n->ln1);
    qkv_apart(b, p, n->attn, i, 1, c->attn_bias);
    add(b, MODEL_ROLE_ATTN_OUT_W, 0, h, q, "%s.%d.%s.%s.weight", p, i, n->attn, n->out);
    if (c->out_bias && !c->attn_out_nobias)
        add(b, MODEL_ROLE_ATTN_OUT_B, 0, h, 0, "%s.%d.%s.%s.bias", p, i, n->attn, n->out);
    if (n->ln2) {
        add(b, MODEL_ROLE_LN2_W, 0, h, 0, "%s.%d.%s.weight", p, i, n->ln2);
        add(b, MODEL_ROLE_LN2_B, 0, h, 0, "%s.%d.%s.bias", p, i, n->ln2);
    }
    add(b, MODEL_ROLE_MLP_UP_W, 0, f, h, "%s.%d.%s.weight", p, i, n->up);
    if (c->out_bias) add(b, MODEL_ROLE_MLP_UP_B, 0, f, 0, "%s.%d.%s.bias", p, i, n->up);
    add(b, MODEL_ROLE_MLP_DOWN_W, 0, h, f, "%s.%d.%s.weight", p, i, n->down);
    if (c->out_bias) add(b, MODEL_ROLE_MLP_DOWN_B, 0, h, 0, "%s.%d.%s.bias", p, i, n->down);
    fuse_qkv(l, b->block);
}

/* Layer i's latent attention (DeepSeek-V2, mla.kv_rank): q_proj, or
 * q_a_proj, its norm and q_b_proj; kv_a_proj_with_mqa, its norm, kv_b_proj;
 * o_proj. The rows that feed the rotary dims are permuted (hf_rope_rows):
 * each q head's to its front, kv_a's rotary key before c_kv. */
static void mla_attention(builder *b, int i)
{
    model_layout *l = b->l;
    const zo_model_config *c = &l->cfg;
    const zo_mla *x = &c->mla;
    const int64_t h = c->hidden, H = c->n_heads, dq = x->qk_nope + x->qk_rope;
    const char *p = "model.layers";
    int first = l->n_tensors;
    if (x->q_rank) {
        add(b, MODEL_ROLE_Q_A_W, 0, x->q_rank, h, "%s.%d.self_attn.q_a_proj.weight", p, i);
        add(b, MODEL_ROLE_Q_A_NORM_W, 0, x->q_rank, 0, "%s.%d.self_attn.q_a_layernorm.weight", p, i);
        add(b, MODEL_ROLE_Q_B_W, 0, H * dq, x->q_rank, "%s.%d.self_attn.q_b_proj.weight", p, i);
    } else {
        add(b, MODEL_ROLE_Q_W, 0, H * dq, h, "%s.%d.self_attn.q_proj.weight", p, i);
    }
    add(b, MODEL_ROLE_KV_A_W, 0, x->kv_rank + x->qk_rope, h, "%s.%d.self_attn.kv_a_proj_with_mqa.weight", p, i);
    add(b, MODEL_ROLE_KV_A_NORM_W, 0, x->kv_rank, 0, "%s.%d.self_attn.kv_a_layernorm.weight", p, i);
    add(b, MODEL_ROLE_KV_B_W, 0, H * (x->qk_nope + x->v_dim), x->kv_rank, "%s.%d.self_attn.kv_b_proj.weight", p, i);
    add(b, MODEL_ROLE_ATTN_OUT_W, 0, h, H * x->v_dim, "%s.%d.self_attn.o_proj.weight", p, i);
    for (int k = first; b->st == ZO_OK && k < l->n_tensors; k++) {
        model_tensor *t = &l->tensors[k];
        if (t->role == MODEL_ROLE_Q_W || t->role == MODEL_ROLE_Q_B_W)
            model_tensor_set_rope_rows(t, x->qk_rope, (int)dq, x->qk_nope);
        else if (t->role == MODEL_ROLE_KV_A_W)
            model_tensor_set_rope_rows(t, x->qk_rope, x->kv_rank + x->qk_rope, x->kv_rank);
    }
}

/* Layer i of a LLaMA-family model (the builder at its block): separate
 * q, k, v and an MLP or MoE block, with fused views over q/k/v and gate/up
 * (Phi-3: the fused tensors, with q, k, v, gate and up as views of them). */
static void llama_layer(builder *b, int i)
{
    model_layout *l = b->l;
    const zo_model_config *c = &l->cfg;
    const int64_t h = c->hidden;
    const int64_t q = (int64_t)c->n_heads * c->head_dim;
    const int64_t kv = (int64_t)c->n_kv_heads * c->head_dim;
    const int bl = b->block;
    const char *p = "model.layers";
    if (zo_model_pre_norms(c)) /* (OLMo-2: none) */
        add(b, MODEL_ROLE_LN1_W, 0, h, 0, "%s.%d.input_layernorm.weight", p, i);
    if (c->norm_bias)
        add(b, MODEL_ROLE_LN1_B, 0, h, 0, "%s.%d.input_layernorm.bias", p, i);
    const int fused = zo_model_fused_proj(c);
    if (c->mla.kv_rank)
        mla_attention(b, i);
    else if (fused) /* Phi-3 stores q, k, v as row ranges of one qkv_proj */
        add(b, MODEL_ROLE_QKV_W, 0, q + 2 * kv, h, "%s.%d.self_attn.qkv_proj.weight", p, i);
    if (!c->mla.kv_rank) {
        qkv_apart(b, p, "self_attn", i, !fused, c->attn_bias);
        add(b, MODEL_ROLE_ATTN_OUT_W, 0, h, q, "%s.%d.self_attn.o_proj.weight", p, i);
    }
    if (c->out_bias && !c->attn_out_nobias)
        add(b, MODEL_ROLE_ATTN_OUT_B, 0, h, 0, "%s.%d.self_attn.o_proj.bias", p, i);
    if (c->attn_sinks) add(b, MODEL_ROLE_SINKS, 0, c->n_heads, 0, "%s.%d.self_attn.sinks", p, i);
    if (c->qk_norm && c->qk_norm_heads) { /* Cohere's: a row a head, its columns q's and k's dims */
        int first = l->n_tensors;
        add(b, MODEL_ROLE_Q_NORM_W, 0, c->n_heads, c->head_dim, "%s.%d.self_attn.q_norm.weight", p, i);
        add(b, MODEL_ROLE_K_NORM_W, 0, c->n_kv_heads, c->head_dim, "%s.%d.self_attn.k_norm.weight", p, i);
        for (int k = first; zo_model_rot_interleaved(c) && b->st == ZO_OK && k < l->n_tensors; k++) {
            model_tensor_set_rot_pairs(&l->tensors[k], c);
            l->tensors[k].hf_rope_elems = 1;
        }
    } else if (c->qk_norm) { /* Qwen3's a head wide; OLMo-2's (qk_norm_full) as wide as q and k */
        add(b, MODEL_ROLE_Q_NORM_W, 0, c->qk_norm_full ? q : c->head_dim, 0, "%s.%d.self_attn.q_norm.weight", p, i);
        add(b, MODEL_ROLE_K_NORM_W, 0, c->qk_norm_full ? kv : c->head_dim, 0, "%s.%d.self_attn.k_norm.weight", p,
            i);
    }
    if (zo_model_post_norms(c)) { /* Gemma-2: a norm after attention, then the MLP's pre-norm (OLMo-2: none) */
        add(b, MODEL_ROLE_POST_ATTN_NORM_W, 0, h, 0, "%s.%d.post_attention_layernorm.weight", p, i);
        if (zo_model_pre_norms(c))
            add(b, MODEL_ROLE_LN2_W, 0, h, 0, "%s.%d.pre_feedforward_layernorm.weight", p, i);
    } else if (c->layer_norms != 1) { /* (Cohere: input_layernorm alone, before both) */
        add(b, MODEL_ROLE_LN2_W, 0, h, 0, "%s.%d.post_attention_layernorm.weight", p, i);
    }
    if (c->norm_bias && c->layer_norms != 1)
        add(b, MODEL_ROLE_LN2_B, 0, h, 0, "%s.%d.post_attention_layernorm.bias", p, i);
    if (zo_model_layer_is_moe(c, i))
        moe_layer(b, i);
    else
        llama_mlp(b, i);
    if (zo_model_post_norms(c))
        add(b, MODEL_ROLE_POST_MLP_NORM_W, 0, h, 0, "%s.%d.post_feedforward_layernorm.weight", p, i);
    if (fused) { /* the parts as row ranges of the fused tensors */
        const int64_t f = c->ffn;
        sub_view(l, bl, MODEL_ROLE_QKV_W, MODEL_ROLE_Q_W, 0, q);
        sub_view(l, bl, MODEL_ROLE_QKV_W, MODEL_ROLE_K_W, q, kv);
        sub_view(l, bl, MODEL_ROLE_QKV_W, MODEL_ROLE_V_W, q + kv, kv);
        sub_view(l, bl, MODEL_ROLE_MLP_GATE_UP_W, MODEL_ROLE_MLP_GATE_W, 0, f);
        sub_view(l, bl, MODEL_ROLE_MLP_GATE_UP_W, MODEL_ROLE_MLP_UP_W, f, f);
        return;
    }
    static const model_role gu_w[] = {MODEL_ROLE_MLP_GATE_W, MODEL_ROLE_MLP_UP_W};
    static const model_role gu_b[] = {MODEL_ROLE_MLP_GATE_B, MODEL_ROLE_MLP_UP_B};
    fuse_qkv(l, bl);
    fuse_views(l, bl, MODEL_ROLE_MLP_GATE_UP_W, gu_w, 2);
    fuse_views(l, bl, MODEL_ROLE_MLP_GATE_UP_B, gu_b, 2);
}

/* Block L+1: the final norm and, unless tied to the embedding, the LM head
 * (with its bias where head_bias). */
static void head_block(builder *b)
{
    const zo_model_config *c = &b->l->cfg;
    const int64_t h = c->hidden, v = c->vocab;
    if (zo_model_phi(c)) {
        add(b, MODEL_ROLE_NORM_W, 0, h, 0, "model.final_layernorm.weight");
        add(b, MODEL_ROLE_NORM_B, 0, h, 0, "model.final_layernorm.bias");
    } else if (zo_model_starcoder2(c)) {
        add(b, MODEL_ROLE_NORM_W, 0, h, 0, "model.norm.weight");
        add(b, MODEL_ROLE_NORM_B, 0, h, 0, "model.norm.bias");
    } else if (zo_model_neox(c)) {
        add(b, MODEL_ROLE_NORM_W, 0, h, 0, "gpt_neox.final_layer_norm.weight");
        add(b, MODEL_ROLE_NORM_B, 0, h, 0, "gpt_neox.final_layer_norm.bias");
        if (!c->tied_embeddings) add(b, MODEL_ROLE_LM_HEAD_W, 0, v, h, "embed_out.weight");
        if (c->head_bias) add(b, MODEL_ROLE_LM_HEAD_B, 0, v, 0, "embed_out.bias");
        return;
    } else if (zo_model_falcon(c) || zo_model_bloom(c) || zo_model_gptj(c)) {
        add(b, MODEL_ROLE_NORM_W, 0, h, 0, "transformer.ln_f.weight");
        add(b, MODEL_ROLE_NORM_B, 0, h, 0, "transformer.ln_f.bias");
    } else if (zo_model_opt(c)) {
        add(b, MODEL_ROLE_NORM_W, 0, h, 0, "model.decoder.final_layer_norm.weight");
        add(b, MODEL_ROLE_NORM_B, 0, h, 0, "model.decoder.final_layer_norm.bias");
    } else if (c->arch == ZO_ARCH_GPT) {
        add(b, MODEL_ROLE_NORM_W, 0, h, 0, "ln_f.weight");
        if (c->norm_bias) add(b, MODEL_ROLE_NORM_B, 0, h, 0, "ln_f.bias");
    } else {
        add(b, MODEL_ROLE_NORM_W, 0, h, 0, "model.norm.weight");
        if (c->norm_bias) add(b, MODEL_ROLE_NORM_B, 0, h, 0, "model.norm.bias");
    }
    if (!c->tied_embeddings) add(b, MODEL_ROLE_LM_HEAD_W, 0, v, h, "lm_head.weight");
    if (c->head_bias) add(b, MODEL_ROLE_LM_HEAD_B, 0, v, 0, "lm_head.bias");
}

zo_status model_layout_init(model_layout *l, const zo_model_config *cfg)
{
    return model_layout_init_experts(l, cfg, 0, cfg->moe.experts);
}

zo_status model_layout_init_experts(model_layout *l, const zo_model_config *cfg_in, int first, int count)
{
    zo_status st;
    memset(l, 0, sizeof *l);
    if (first < 0 || count < 1 - !cfg_in->moe.experts || first + count > cfg_in->moe.experts)
        return zo_error(ZO_ERR_INVALID, "model layout: %s: experts %d..%d of its %d", cfg_in->name, first,
                        first + count - 1, cfg_in->moe.experts);
    zo_model_config cfg = *cfg_in;
    if (cfg.params_override)
        return zo_error(ZO_ERR_INVALID,
                        "model layout: %s: only the parameter total is known (--params), not "
                        "the shapes",
                        cfg.name);
    /* products of the shape (tensor sizes, the block count) are formed
     * below: nonsense is refused before, not wrapped around */
    if ((st = zo_model_config_validate(&cfg)) != ZO_OK) /* with its limits (model_limits.h) */
        return zo_error_wrap(st, "model layout: %s", cfg.name);
    /* memplan sizes more families than the layout builds: refuse the rest by name */
    if ((st = zo_model_config_runtime_check(&cfg)) != ZO_OK)
        return zo_error_wrap(st, "model layout");
    l->cfg = cfg;
    l->expert_first = first;
    l->expert_count = count;
    l->n_layers = cfg.n_layers;
    l->n_blocks = cfg.n_layers + 2;
    l->block_numel = calloc((size_t)l->n_blocks, sizeof *l->block_numel);
    l->views = calloc((size_t)l->n_blocks * MODEL_ROLE_COUNT, sizeof *l->views);
    if (!l->block_numel || !l->views) {
        st = zo_error(ZO_ERR_NOMEM, "model layout: cannot allocate %d blocks", l->n_blocks);
        goto out_free_layout;
    }

    builder b = {.l = l, .block = 0, .layer = -1, .st = ZO_OK};
    embedding_block(&b); /* block 0 */
    for (int i = 0; i < cfg.n_layers; i++) { /* blocks 1..L */
        b.block = model_layout_layer_block(i);
        b.layer = i;
        if (zo_model_qkv_grouped(&cfg)) grouped_layer(&b, i);
        else if (zo_model_opt(&cfg)) linear_gpt_layer(&b, i, &opt_names);
        else if (zo_model_phi(&cfg)) linear_gpt_layer(&b, i, &phi_names);
        else if (zo_model_gptj(&cfg)) linear_gpt_layer(&b, i, &gptj_names);
        else if (zo_model_starcoder2(&cfg)) linear_gpt_layer(&b, i, &starcoder2_names);
        else if (cfg.arch == ZO_ARCH_GPT) gpt_layer(&b, i);
        else llama_layer(&b, i);
    }
    b.block = model_layout_head_block(l); /* block L+1 */
    b.layer = -1;
    head_block(&b);
    if ((st = b.st) != ZO_OK) goto out_free_layout;

    for (int i = 0; i < l->n_blocks; i++) l->total_numel += l->block_numel[i];
    /* the experts outside the window, and DeepSeek-V3's router score
     * corrections, which no block holds (the transformer keeps them in fp32
     * apart, tf_model.router_bias) */
    uint64_t want = zo_model_params(&cfg), outside = zo_model_router_bias_params(&cfg);
    for (int i = 0; i < cfg.n_layers; i++)
        if (zo_model_layer_is_moe(&cfg, i)) outside += (uint64_t)(cfg.moe.experts - count) * model_layout_expert_stride(l);
    if ((uint64_t)l->total_numel != want - outside) {
        st = zo_error(ZO_ERR_INTERNAL,
                      "model layout: %s: %zu elements laid out but the config counts %llu",
                      cfg.name, l->total_numel, (unsigned long long)(want - outside));
        goto out_free_layout;
    }
    if ((st = model_layout_index(l)) != ZO_OK) goto out_free_layout;
    return ZO_OK;

out_free_layout:
    model_layout_free(l);
    return st;
}

void model_layout_free(model_layout *l)
{
    free(l->block_numel);
    free(l->tensors);
    free(l->by_name);
    free(l->views);
    memset(l, 0, sizeof *l);
}

void model_tensor_set_head_rows(model_tensor *t, const zo_model_config *c)
{
    t->hf_head_rows = c->head_dim;
    t->hf_head_groups = c->n_kv_heads;
}

void model_tensor_set_rot_pairs(model_tensor *t, const zo_model_config *c)
{
    model_tensor_set_rope_rows(t, zo_model_rope_dim(c), c->head_dim, 0);
}

void model_tensor_set_rope_rows(model_tensor *t, int rope, int period, int at)
{
    t->hf_rope_rows = rope;
    t->hf_rope_period = period;
    t->hf_rope_at = at;
}

size_t model_tensor_rope_file_row(const model_tensor *t, size_t row)
{
    if (!t->hf_rope_rows) return row;
    size_t P = (size_t)t->hf_rope_period, R = (size_t)t->hf_rope_rows, A = (size_t)t->hf_rope_at;
    size_t i = row % P, base = row - i;
    if (i >= R) /* the run's other rows, after our rotary ones: around the file's rotary run */
        return base + (i - R < A ? i - R : i);
    size_t pair = i < R / 2 ? i : i - R / 2;
    return base + A + 2 * pair + (i >= R / 2);
}

size_t model_tensor_rope_our_row(const model_tensor *t, size_t file_row)
{
    if (!t->hf_rope_rows) return file_row;
    size_t P = (size_t)t->hf_rope_period, R = (size_t)t->hf_rope_rows, A = (size_t)t->hf_rope_at;
    size_t i = file_row % P, base = file_row - i;
    if (i < A) return base + R + i;
    if (i >= A + R) return base + i;
    size_t j = i - A; /* rotary dim j of the file: pair j / 2, its (j % 2)-th */
    return base + j / 2 + (j % 2) * (R / 2);
}

/* by name, then in buffer order (the pointers are into one array) */
static int cmp_tensor_name(const void *a, const void *b)
{
    const model_tensor *x = *(const model_tensor *const *)a, *y = *(const model_tensor *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x > y) - (x < y);
}

zo_status model_layout_index(model_layout *l)
{
    free(l->by_name);
    l->by_name = malloc((l->n_tensors ? (size_t)l->n_tensors : 1) * sizeof *l->by_name);
    if (!l->by_name)
        return zo_error(ZO_ERR_NOMEM, "model layout: %s: cannot index %d tensors", l->cfg.name, l->n_tensors);
    for (int i = 0; i < l->n_tensors; i++) l->by_name[i] = &l->tensors[i];
    qsort(l->by_name, (size_t)l->n_tensors, sizeof *l->by_name, cmp_tensor_name);
    return ZO_OK;
}

const model_tensor *model_layout_find(const model_layout *l, const char *name)
{
    if (!l->by_name) {
        for (int i = 0; i < l->n_tensors; i++)
            if (!strcmp(l->tensors[i].name, name)) return &l->tensors[i];
        return NULL;
    }
    /* the first entry whose name is not below `name`: the first in buffer order among equals */
    int lo = 0, hi = l->n_tensors;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (strcmp(l->by_name[mid]->name, name) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < l->n_tensors && !strcmp(l->by_name[lo]->name, name) ? l->by_name[lo] : NULL;
}

const model_view *model_layout_view(const model_layout *l, int block, model_role role)
{
    if (block < 0 || block >= l->n_blocks || (unsigned)role >= MODEL_ROLE_COUNT) return NULL;
    const model_view *v = &l->views[(size_t)block * MODEL_ROLE_COUNT + role];
    return v->numel ? v : NULL;
}

const char *model_layout_block_name(const model_layout *l, int block, char *buf, size_t len)
{
    if (block == MODEL_BLOCK_EMBED)
        snprintf(buf, len, "embedding");
    else if (block == model_layout_head_block(l))
        snprintf(buf, len, "head");
    else
        snprintf(buf, len, "layer %d", block - 1);
    return buf;
}
