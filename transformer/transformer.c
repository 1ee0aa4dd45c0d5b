/* GPT-2 and LLaMA forward and backward, block by block, on the device
 * interface. Shapes: N = b*t rows (tokens), h hidden, q = hq*d query width,
 * kv = hkv*d, f the MLP width, v the vocabulary. */
#include "transformer/transformer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int is_gpt(const tf_model *m) { return m->cfg.arch == ZO_ARCH_GPT; }
static int qkv_width(const zo_model_config *c) { return (c->n_heads + 2 * c->n_kv_heads) * c->head_dim; }
static int q_width(const zo_model_config *c) { return c->n_heads * c->head_dim; }

/* ---- allocation ------------------------------------------------------------ */

/* One activation buffer to allocate: where its pointer goes, its bytes (0:
 * none, the model has no such buffer) and its name for messages. */
typedef struct act_req {
    void **p;
    size_t bytes;
    const char *what;
} act_req;

/* Allocate the buffers in order and count them; the first failure names its
 * buffer (the ones already allocated are tf_free's). */
static zo_status act_alloc(tf_model *m, const act_req *r, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!r[i].bytes) continue;
        zo_status st = gpu_mem_alloc(m->dev, r[i].bytes, r[i].p);
        if (st != ZO_OK) return zo_error_wrap(st, "transformer activations (%s)", r[i].what);
        m->act_bytes += r[i].bytes;
    }
    return ZO_OK;
}

#define N_REQ(r) (sizeof(r) / sizeof((r)[0]))

zo_status tf_init(tf_model *m, const zo_model_config *cfg, gpu_device_t dev, zo_dtype dtype,
                  int B, int T)
{
    return tf_init_opts(m, cfg, dev, dtype, B, T, NULL);
}

zo_status tf_init_opts(tf_model *m, const zo_model_config *cfg, gpu_device_t dev, zo_dtype dtype,
                       int B, int T, const tf_options *opts)
{
    zo_status st;
    memset(m, 0, sizeof *m);
    if (opts) m->opts = *opts;
    if (B < 1 || T < 1)
        return zo_error(ZO_ERR_INVALID, "tf_init: micro-batch %d x %d must be positive", B, T);
    if ((st = model_layout_init(&m->layout, cfg)) != ZO_OK) return st;
    m->cfg = m->layout.cfg;
    m->dev = dev;
    m->dtype = dtype;
    m->B = B;
    m->T = T;
    const zo_model_config *c = &m->cfg;
    if (c->arch == ZO_ARCH_GPT && T > c->max_seq) {
        model_layout_free(&m->layout);
        return zo_error(ZO_ERR_INVALID, "tf_init: sequence %d exceeds the %d learned positions of %s",
                        T, c->max_seq, c->name);
    }
    size_t N = (size_t)B * T, es = zo_dtype_size(dtype), h = c->hidden, f = c->ffn;
    size_t L = c->n_layers;
    m->res = calloc(L + 1, sizeof *m->res);
    m->acts = calloc(L, sizeof *m->acts);
    if (!m->res || !m->acts) {
        tf_free(m);
        return zo_error(ZO_ERR_NOMEM, "tf_init: out of host memory");
    }
    const act_req io[] = {{(void **)&m->tokens, N * 4, "tokens"}, {(void **)&m->targets, N * 4, "targets"}};
    if ((st = act_alloc(m, io, N_REQ(io))) != ZO_OK) goto out_free;
    if (!m->opts.external_res)
        for (size_t l = 0; l <= L; l++) {
            const act_req r[] = {{&m->res[l], N * h * es, "residual"}};
            if ((st = act_alloc(m, r, N_REQ(r))) != ZO_OK) goto out_free;
        }
    /* with recompute, every layer shares one set of activation buffers */
    size_t n_sets = m->opts.recompute ? (L ? 1 : 0) : L;
    int llama = c->arch != ZO_ARCH_GPT;
    for (size_t l = 0; l < n_sets; l++) {
        tf_layer_acts *a = &m->acts[l];
        const act_req r[] = {
            {&a->ln1, N * h * es, "ln1"},
            {(void **)&a->mean1, N * 4, "ln1 mean"},
            {(void **)&a->rstd1, N * 4, "ln1 rstd"},
            {&a->qkv, N * qkv_width(c) * es, "qkv"},
            {&a->att, N * q_width(c) * es, "attention"},
            {(void **)&a->lse, (size_t)B * c->n_heads * T * 4, "attention lse"},
            {&a->x_mid, N * h * es, "residual mid"},
            {&a->ln2, N * h * es, "ln2"},
            {(void **)&a->mean2, N * 4, "ln2 mean"},
            {(void **)&a->rstd2, N * 4, "ln2 rstd"},
            {&a->fc, N * f * es, "mlp fc/gate"},
            {&a->up, llama ? N * f * es : 0, "mlp up"},
            {&a->act, N * f * es, "mlp activation"},
        };
        if ((st = act_alloc(m, r, N_REQ(r))) != ZO_OK) goto out_free;
    }
    for (size_t l = n_sets; l < L; l++) m->acts[l] = m->acts[0];
    const act_req r[] = {
        {&m->lnf, N * h * es, "final norm"},
        {(void **)&m->meanf, N * 4, "final norm mean"},
        {(void **)&m->rstdf, N * 4, "final norm rstd"},
        {&m->logits, N * c->vocab * sizeof(float), "logits"}, /* fp32 for the cross-entropy */
        {(void **)&m->losses, N * 4, "losses"},
        {&m->tmp, N * h * es, "scratch"},
        {(void **)&m->dres, N * h * 4, "residual gradient"},
        {(void **)&m->dh, N * h * 4, "norm gradient"},
        {(void **)&m->dqkv, N * qkv_width(c) * 4, "qkv gradient"},
        {(void **)&m->datt, N * q_width(c) * 4, "attention gradient"},
        {(void **)&m->dff, N * f * 4, "mlp gradient"},
        {(void **)&m->dff2, llama ? N * f * 4 : 0, "mlp up gradient"},
    };
    if ((st = act_alloc(m, r, N_REQ(r))) != ZO_OK) goto out_free;
    return ZO_OK;

out_free:
    tf_free(m);
    return st;
}

void tf_free(tf_model *m)
{
    if (!m->dev) return;
    gpu_device_t d = m->dev;
    size_t L = m->cfg.n_layers;
    gpu_mem_free(d, m->tokens);
    gpu_mem_free(d, m->targets);
    if (m->res && !m->opts.external_res)
        for (size_t l = 0; l <= L; l++) gpu_mem_free(d, m->res[l]);
    size_t n_sets = m->opts.recompute ? (L ? 1 : 0) : L;
    if (m->acts)
        for (size_t l = 0; l < n_sets; l++) {
            tf_layer_acts *a = &m->acts[l];
            void *p[] = {a->ln1, a->mean1, a->rstd1, a->qkv, a->att, a->lse, a->x_mid,
                         a->ln2, a->mean2, a->rstd2, a->fc, a->up, a->act};
            for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) gpu_mem_free(d, p[i]);
        }
    void *p[] = {m->lnf, m->meanf, m->rstdf, m->logits, m->losses, m->tmp, m->dres,
                 m->dh, m->dqkv, m->datt, m->dff, m->dff2};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) gpu_mem_free(d, p[i]);
    free(m->res);
    free(m->acts);
    model_layout_free(&m->layout);
    memset(m, 0, sizeof *m);
}

size_t tf_block_bytes(const tf_model *m, int block)
{
    return m->layout.block_numel[block] * zo_dtype_size(m->dtype);
}

gpu_tensor tf_view(const tf_model *m, const void *block_buf, int block, model_role role)
{
    const model_view *v = model_layout_view(&m->layout, block, role);
    if (!v || !v->numel || !block_buf) return gpu_t(NULL, m->dtype);
    return gpu_t((char *)block_buf + v->offset * zo_dtype_size(m->dtype), m->dtype);
}

zo_status tf_set_batch(tf_model *m, gpu_stream_t s, const int32_t *inputs, const int32_t *targets,
                       int b, int t)
{
    zo_status st;
    if (b < 1 || b > m->B || t < 1 || t > m->T)
        return zo_error(ZO_ERR_INVALID, "tf_set_batch: batch %d x %d outside the %d x %d the model holds",
                        b, t, m->B, m->T);
    m->b = b;
    m->t = t;
    m->n_targets = 0;
    for (int i = 0; i < b * t; i++) m->n_targets += targets[i] >= 0;
    if ((st = gpu_memcpy_async(s, m->tokens, inputs, (size_t)b * t * 4, GPU_COPY_HOST_TO_DEVICE)) != ZO_OK)
        return st;
    return gpu_memcpy_async(s, m->targets, targets, (size_t)b * t * 4, GPU_COPY_HOST_TO_DEVICE);
}

/* ---- linear layers ------------------------------------------------------------- */

static gpu_tensor F32(void *p) { return gpu_t(p, ZO_DTYPE_F32); }

/* y[N, out] (row stride ldy) = x[N, in] W^T (+ b); W is [out, in]. */
static zo_status linear_forward(gpu_stream_t s, gpu_tensor y, int64_t ldy, gpu_tensor x,
                                gpu_tensor w, gpu_tensor b, int N, int out, int in)
{
    zo_status st;
    gpu_gemm_desc g = {.trans_b = 1, .m = N, .n = out, .k = in, .alpha = 1.0f, .beta = 0.0f,
                       .a = x, .b = w, .c = y, .lda = in, .ldb = in, .ldc = ldy};
    if ((st = gpu_gemm(s, &g)) != ZO_OK) return st;
    if (b.data && (st = gpu_bias_forward(s, y, b, N, out, ldy)) != ZO_OK) return st;
    return ZO_OK;
}

/* Given dy[N, out]: dW += dy^T x, db += colsum(dy), dx = dy W (+ dx when
 * dx_beta is 1). dx may be NULL (no input gradient needed). */
static zo_status linear_backward(gpu_stream_t s, gpu_tensor dx, float dx_beta, gpu_tensor dw,
                                 gpu_tensor db, gpu_tensor dy, gpu_tensor x, gpu_tensor w, int N,
                                 int out, int in)
{
    zo_status st;
    gpu_gemm_desc gw = {.trans_a = 1, .m = out, .n = in, .k = N, .alpha = 1.0f, .beta = 1.0f,
                        .a = dy, .b = x, .c = dw, .lda = out, .ldb = in, .ldc = in};
    if ((st = gpu_gemm(s, &gw)) != ZO_OK) return st;
    if (db.data && (st = gpu_bias_backward(s, db, dy, N, out, out)) != ZO_OK) return st;
    if (dx.data) {
        gpu_gemm_desc gx = {.m = N, .n = in, .k = out, .alpha = 1.0f, .beta = dx_beta, .a = dy,
                            .b = w, .c = dx, .lda = out, .ldb = in, .ldc = in};
        if ((st = gpu_gemm(s, &gx)) != ZO_OK) return st;
    }
    return ZO_OK;
}

/* ---- blocks ---------------------------------------------------------------------- */

static zo_status embed_forward(tf_model *m, const tf_block_bufs *bb, gpu_stream_t s)
{
    const zo_model_config *c = &m->cfg;
    int N = m->b * m->t;
    /* res[0][N, h] = wte[tokens] (+ wpe[position]) */
    return gpu_embedding_forward(s, gpu_t(m->res[0], m->dtype), m->tokens,
                                 tf_view(m, bb->params, 0, MODEL_ROLE_TOK_EMB),
                                 tf_view(m, bb->params, 0, MODEL_ROLE_POS_EMB), N, m->t,
                                 c->hidden, c->vocab);
}

static zo_status embed_backward(tf_model *m, const tf_block_bufs *bb, gpu_stream_t s)
{
    const zo_model_config *c = &m->cfg;
    int N = m->b * m->t;
    return gpu_embedding_backward(s, tf_view(m, bb->grads, 0, MODEL_ROLE_TOK_EMB),
                                  tf_view(m, bb->grads, 0, MODEL_ROLE_POS_EMB), F32(m->dres),
                                  m->tokens, N, m->t, c->hidden, c->vocab);
}

/* Normalization of the architecture: LayerNorm (GPT) or RMSNorm. */
static zo_status norm_forward(tf_model *m, gpu_stream_t s, gpu_tensor y, float *mean, float *rstd,
                              gpu_tensor x, gpu_tensor w, gpu_tensor b, int N)
{
    const zo_model_config *c = &m->cfg;
    if (is_gpt(m)) return gpu_layernorm_forward(s, y, mean, rstd, x, w, b, N, c->hidden, c->norm_eps);
    return gpu_rmsnorm_forward(s, y, rstd, x, w, N, c->hidden, c->norm_eps);
}

/* dres += d(norm input), given dh = d(norm output). */
static zo_status norm_backward(tf_model *m, gpu_stream_t s, gpu_tensor dw, gpu_tensor db,
                               gpu_tensor x, gpu_tensor w, const float *mean, const float *rstd,
                               int N)
{
    const zo_model_config *c = &m->cfg;
    if (is_gpt(m))
        return gpu_layernorm_backward(s, F32(m->dres), dw, db, F32(m->dh), x, w, mean, rstd, N,
                                      c->hidden);
    return gpu_rmsnorm_backward(s, F32(m->dres), dw, F32(m->dh), x, w, rstd, N, c->hidden);
}

/* Forward of layer l. With `recompute`, stop once every activation the
 * backward reads is saved: the down projection and the residual add, whose
 * output (res[l+1]) backward does not read, are skipped and res[l+1] is not
 * written. */
static zo_status layer_forward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s,
                               int recompute)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    const int blk = model_layout_layer_block(l), N = m->b * m->t, h = c->hidden, f = c->ffn;
    const int qw = q_width(c), ld = qkv_width(c);
    const zo_dtype dt = m->dtype;
    tf_layer_acts *a = &m->acts[l];
    const void *P = bb->params;
    gpu_tensor x = gpu_t(m->res[l], dt), out = gpu_t(m->res[l + 1], dt);
    gpu_tensor ln1 = gpu_t(a->ln1, dt), qkv = gpu_t(a->qkv, dt), att = gpu_t(a->att, dt);
    gpu_tensor x_mid = gpu_t(a->x_mid, dt), ln2 = gpu_t(a->ln2, dt), tmp = gpu_t(m->tmp, dt);
    gpu_tensor fc = gpu_t(a->fc, dt), act = gpu_t(a->act, dt);

    /* attention: ln1 = norm(x); qkv[N, q+2kv] = ln1 Wqkv^T (+ b); RoPE on q, k */
    if ((st = norm_forward(m, s, ln1, a->mean1, a->rstd1, x, tf_view(m, P, blk, MODEL_ROLE_LN1_W),
                           tf_view(m, P, blk, MODEL_ROLE_LN1_B), N)) != ZO_OK)
        return st;
    if ((st = linear_forward(s, qkv, ld, ln1, tf_view(m, P, blk, MODEL_ROLE_QKV_W),
                             tf_view(m, P, blk, MODEL_ROLE_QKV_B), N, ld, h)) != ZO_OK)
        return st;
    if (!is_gpt(m) && (st = gpu_rope_forward(s, qkv, N, m->t, c->n_heads + c->n_kv_heads,
                                             c->head_dim, ld, c->rope_theta, 0)) != ZO_OK)
        return st;
    gpu_attn_desc ad = {.b = m->b, .t = m->t, .hq = c->n_heads, .hkv = c->n_kv_heads, .d = c->head_dim};
    if ((st = gpu_attention_forward(s, &ad, att, a->lse, qkv)) != ZO_OK) return st;
    /* x_mid = x + att Wo^T (+ bo) */
    if ((st = linear_forward(s, tmp, h, att, tf_view(m, P, blk, MODEL_ROLE_ATTN_OUT_W),
                             tf_view(m, P, blk, MODEL_ROLE_ATTN_OUT_B), N, h, qw)) != ZO_OK)
        return st;
    if ((st = gpu_add(s, x_mid, x, tmp, (size_t)N * h)) != ZO_OK) return st;

    /* MLP: GPT act = gelu(ln2 Wfc^T + bfc); LLaMA act = silu(ln2 Wg^T) * (ln2 Wu^T) */
    if ((st = norm_forward(m, s, ln2, a->mean2, a->rstd2, x_mid, tf_view(m, P, blk, MODEL_ROLE_LN2_W),
                           tf_view(m, P, blk, MODEL_ROLE_LN2_B), N)) != ZO_OK)
        return st;
    if (is_gpt(m)) {
        if ((st = linear_forward(s, fc, f, ln2, tf_view(m, P, blk, MODEL_ROLE_MLP_UP_W),
                                 tf_view(m, P, blk, MODEL_ROLE_MLP_UP_B), N, f, h)) != ZO_OK)
            return st;
        if ((st = gpu_gelu_forward(s, act, fc, (size_t)N * f)) != ZO_OK) return st;
    } else {
        gpu_tensor up = gpu_t(a->up, dt);
        if ((st = linear_forward(s, fc, f, ln2, tf_view(m, P, blk, MODEL_ROLE_MLP_GATE_W),
                                 tf_view(m, P, blk, MODEL_ROLE_MLP_GATE_B), N, f, h)) != ZO_OK)
            return st;
        if ((st = linear_forward(s, up, f, ln2, tf_view(m, P, blk, MODEL_ROLE_MLP_UP_W),
                                 tf_view(m, P, blk, MODEL_ROLE_MLP_UP_B), N, f, h)) != ZO_OK)
            return st;
        if ((st = gpu_swiglu_forward(s, act, fc, up, (size_t)N * f)) != ZO_OK) return st;
    }
    if (recompute) return ZO_OK;
    /* out = x_mid + act Wdown^T (+ b) */
    if ((st = linear_forward(s, tmp, h, act, tf_view(m, P, blk, MODEL_ROLE_MLP_DOWN_W),
                             tf_view(m, P, blk, MODEL_ROLE_MLP_DOWN_B), N, h, f)) != ZO_OK)
        return st;
    return gpu_add(s, out, x_mid, tmp, (size_t)N * h);
}

/* On entry dres = dL/d(res[l+1]); on exit dL/d(res[l]). */
static zo_status layer_backward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    const int blk = model_layout_layer_block(l), N = m->b * m->t, h = c->hidden, f = c->ffn;
    const int qw = q_width(c), ld = qkv_width(c);
    const zo_dtype dt = m->dtype;
    tf_layer_acts *a = &m->acts[l];
    const void *P = bb->params;
    void *G = bb->grads;
    gpu_tensor dres = F32(m->dres), dh = F32(m->dh), dff = F32(m->dff);
    gpu_tensor x = gpu_t(m->res[l], dt), ln1 = gpu_t(a->ln1, dt), qkv = gpu_t(a->qkv, dt);
    gpu_tensor att = gpu_t(a->att, dt), x_mid = gpu_t(a->x_mid, dt), ln2 = gpu_t(a->ln2, dt);
    gpu_tensor fc = gpu_t(a->fc, dt), act = gpu_t(a->act, dt);
#define PV(role) tf_view(m, P, blk, role)
#define GV(role) tf_view(m, G, blk, role)

    /* MLP down projection: dact[N, f] = dres Wdown */
    if ((st = linear_backward(s, dff, 0.0f, GV(MODEL_ROLE_MLP_DOWN_W), GV(MODEL_ROLE_MLP_DOWN_B), dres,
                              act, PV(MODEL_ROLE_MLP_DOWN_W), N, h, f)) != ZO_OK)
        return st;
    if (is_gpt(m)) {
        if ((st = gpu_gelu_backward(s, dff, dff, fc, (size_t)N * f)) != ZO_OK) return st; /* dfc, in place */
        if ((st = linear_backward(s, dh, 0.0f, GV(MODEL_ROLE_MLP_UP_W), GV(MODEL_ROLE_MLP_UP_B), dff, ln2,
                                  PV(MODEL_ROLE_MLP_UP_W), N, f, h)) != ZO_OK)
            return st;
    } else {
        gpu_tensor dup = F32(m->dff2), up = gpu_t(a->up, dt);
        if ((st = gpu_swiglu_backward(s, dff, dup, dff, fc, up, (size_t)N * f)) != ZO_OK) return st; /* dgate in place */
        if ((st = linear_backward(s, dh, 0.0f, GV(MODEL_ROLE_MLP_GATE_W), GV(MODEL_ROLE_MLP_GATE_B), dff,
                                  ln2, PV(MODEL_ROLE_MLP_GATE_W), N, f, h)) != ZO_OK)
            return st;
        if ((st = linear_backward(s, dh, 1.0f, GV(MODEL_ROLE_MLP_UP_W), GV(MODEL_ROLE_MLP_UP_B), dup, ln2,
                                  PV(MODEL_ROLE_MLP_UP_W), N, f, h)) != ZO_OK)
            return st;
    }
    /* dres (= d x_mid so far) += norm2 backward */
    if ((st = norm_backward(m, s, GV(MODEL_ROLE_LN2_W), GV(MODEL_ROLE_LN2_B), x_mid, PV(MODEL_ROLE_LN2_W),
                            a->mean2, a->rstd2, N)) != ZO_OK)
        return st;

    /* attention output projection: datt[N, q] = dres Wo */
    gpu_tensor datt = F32(m->datt), dqkv = F32(m->dqkv);
    if ((st = linear_backward(s, datt, 0.0f, GV(MODEL_ROLE_ATTN_OUT_W), GV(MODEL_ROLE_ATTN_OUT_B), dres,
                              att, PV(MODEL_ROLE_ATTN_OUT_W), N, h, qw)) != ZO_OK)
        return st;
    gpu_attn_desc ad = {.b = m->b, .t = m->t, .hq = c->n_heads, .hkv = c->n_kv_heads, .d = c->head_dim};
    if ((st = gpu_attention_backward(s, &ad, dqkv, datt, qkv, att, a->lse)) != ZO_OK) return st;
    if (!is_gpt(m) && (st = gpu_rope_backward(s, dqkv, N, m->t, c->n_heads + c->n_kv_heads,
                                              c->head_dim, ld, c->rope_theta, 0)) != ZO_OK)
        return st;
    if ((st = linear_backward(s, dh, 0.0f, GV(MODEL_ROLE_QKV_W), GV(MODEL_ROLE_QKV_B), dqkv, ln1,
                              PV(MODEL_ROLE_QKV_W), N, ld, h)) != ZO_OK)
        return st;
    /* dres (= d x) += norm1 backward */
    return norm_backward(m, s, GV(MODEL_ROLE_LN1_W), GV(MODEL_ROLE_LN1_B), x, PV(MODEL_ROLE_LN1_W),
                         a->mean1, a->rstd1, N);
#undef PV
#undef GV
}

/* The output projection's weight: lm_head, or the token embedding when tied. */
static gpu_tensor head_weight(tf_model *m, const void *params, const void *embed, int blk)
{
    if (m->cfg.tied_embeddings) return tf_view(m, embed, MODEL_BLOCK_EMBED, MODEL_ROLE_TOK_EMB);
    return tf_view(m, params, blk, MODEL_ROLE_LM_HEAD_W);
}

static zo_status head_forward(tf_model *m, const tf_block_bufs *bb, gpu_stream_t s)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    const int blk = model_layout_head_block(&m->layout), N = m->b * m->t;
    gpu_tensor w = head_weight(m, bb->params, bb->embed_params, blk);
    if (!w.data) return zo_error(ZO_ERR_INVALID, "head forward: tied model needs the embedding parameters");
    gpu_tensor lnf = gpu_t(m->lnf, m->dtype), logits = F32(m->logits);
    if ((st = norm_forward(m, s, lnf, m->meanf, m->rstdf, gpu_t(m->res[c->n_layers], m->dtype),
                           tf_view(m, bb->params, blk, MODEL_ROLE_NORM_W),
                           tf_view(m, bb->params, blk, MODEL_ROLE_NORM_B), N)) != ZO_OK)
        return st;
    /* logits[N, v] = lnf W^T */
    if ((st = linear_forward(s, logits, c->vocab, lnf, w, gpu_t(NULL, m->dtype), N, c->vocab, c->hidden)) != ZO_OK)
        return st;
    return gpu_cross_entropy_forward(s, m->losses, logits, m->targets, N, c->vocab);
}

static zo_status head_backward(tf_model *m, const tf_block_bufs *bb, float loss_scale,
                               gpu_stream_t s)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    const int blk = model_layout_head_block(&m->layout), N = m->b * m->t;
    gpu_tensor w = head_weight(m, bb->params, bb->embed_params, blk);
    gpu_tensor dw = c->tied_embeddings ? tf_view(m, bb->embed_grads, MODEL_BLOCK_EMBED, MODEL_ROLE_TOK_EMB)
                                       : tf_view(m, bb->grads, blk, MODEL_ROLE_LM_HEAD_W);
    if (!w.data || !dw.data)
        return zo_error(ZO_ERR_INVALID, "head backward: tied model needs the embedding parameters and gradients");
    gpu_tensor logits = F32(m->logits), lnf = gpu_t(m->lnf, m->dtype);
    float dloss = m->n_targets ? loss_scale / (float)m->n_targets : 0.0f;
    /* dlogits = dloss * (softmax - onehot), in place of the logits */
    if ((st = gpu_cross_entropy_backward(s, logits, logits, m->targets, dloss, N, c->vocab)) != ZO_OK)
        return st;
    if ((st = linear_backward(s, F32(m->dh), 0.0f, dw, gpu_t(NULL, m->dtype), logits, lnf, w, N, c->vocab,
                              c->hidden)) != ZO_OK)
        return st;
    /* the residual gradient starts here: dres = norm_f backward */
    if ((st = gpu_memset_async(s, m->dres, 0, (size_t)N * c->hidden * 4)) != ZO_OK) return st;
    return norm_backward(m, s, tf_view(m, bb->grads, blk, MODEL_ROLE_NORM_W),
                         tf_view(m, bb->grads, blk, MODEL_ROLE_NORM_B),
                         gpu_t(m->res[c->n_layers], m->dtype),
                         tf_view(m, bb->params, blk, MODEL_ROLE_NORM_W), m->meanf, m->rstdf, N);
}

static zo_status check_block(const tf_model *m, int block, const tf_block_bufs *bb, int need_grads)
{
    if (block < 0 || block >= m->layout.n_blocks)
        return zo_error(ZO_ERR_INVALID, "transformer: block %d outside 0..%d", block, m->layout.n_blocks - 1);
    if (!bb || !bb->params || (need_grads && !bb->grads))
        return zo_error(ZO_ERR_INVALID, "transformer: block %d buffers missing", block);
    if (!m->b) return zo_error(ZO_ERR_INVALID, "transformer: no batch set (tf_set_batch)");
    return ZO_OK;
}

zo_status tf_block_forward(tf_model *m, int block, const tf_block_bufs *bufs, gpu_stream_t s)
{
    zo_status st;
    if ((st = check_block(m, block, bufs, 0)) != ZO_OK) return st;
    if (block == MODEL_BLOCK_EMBED) return embed_forward(m, bufs, s);
    if (block == model_layout_head_block(&m->layout)) return head_forward(m, bufs, s);
    return layer_forward(m, block - 1, bufs, s, 0);
}

zo_status tf_block_recompute(tf_model *m, int block, const tf_block_bufs *bufs, gpu_stream_t s)
{
    zo_status st;
    if ((st = check_block(m, block, bufs, 0)) != ZO_OK) return st;
    if (block == MODEL_BLOCK_EMBED || block == model_layout_head_block(&m->layout))
        return ZO_OK; /* the embedding saves nothing; the head's activations are its own */
    return layer_forward(m, block - 1, bufs, s, 1);
}

zo_status tf_block_backward(tf_model *m, int block, const tf_block_bufs *bufs, float loss_scale,
                            gpu_stream_t s)
{
    zo_status st;
    if ((st = check_block(m, block, bufs, 1)) != ZO_OK) return st;
    if (block == MODEL_BLOCK_EMBED) return embed_backward(m, bufs, s);
    if (block == model_layout_head_block(&m->layout)) return head_backward(m, bufs, loss_scale, s);
    return layer_backward(m, block - 1, bufs, s);
}

zo_status tf_forward(tf_model *m, void *const *params, gpu_stream_t s)
{
    zo_status st;
    for (int i = 0; i < m->layout.n_blocks; i++) {
        tf_block_bufs bb = {.params = params[i], .embed_params = params[MODEL_BLOCK_EMBED]};
        if ((st = tf_block_forward(m, i, &bb, s)) != ZO_OK) return st;
    }
    return ZO_OK;
}

zo_status tf_backward(tf_model *m, void *const *params, void *const *grads, float loss_scale,
                      gpu_stream_t s)
{
    zo_status st;
    for (int i = m->layout.n_blocks - 1; i >= 0; i--) {
        tf_block_bufs bb = {.params = params[i], .grads = grads[i],
                            .embed_params = params[MODEL_BLOCK_EMBED],
                            .embed_grads = grads[MODEL_BLOCK_EMBED]};
        if ((st = tf_block_backward(m, i, &bb, loss_scale, s)) != ZO_OK) return st;
    }
    return ZO_OK;
}

zo_status tf_loss(tf_model *m, gpu_stream_t s, float *loss)
{
    int N = m->b * m->t;
    float *host = malloc((size_t)N * sizeof(float));
    if (!host) return zo_error(ZO_ERR_NOMEM, "tf_loss: out of host memory");
    zo_status st = gpu_memcpy_async(s, host, m->losses, (size_t)N * 4, GPU_COPY_DEVICE_TO_HOST);
    if (st == ZO_OK) st = gpu_stream_synchronize(s);
    if (st == ZO_OK) {
        double sum = 0.0;
        for (int i = 0; i < N; i++) sum += host[i];
        *loss = m->n_targets ? (float)(sum / m->n_targets) : 0.0f;
    }
    free(host);
    return st;
}

/* ---- initialization ------------------------------------------------------------------ */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double gauss(uint64_t *s) /* Box-Muller */
{
    double u1 = ((splitmix(s) >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (splitmix(s) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

uint64_t tf_init_rng(uint64_t seed) { return seed * 0x2545f4914f6cdd1dull + 1; }

void tf_init_block_weights(const model_layout *l, int block, float *dst, uint64_t *rng)
{
    double proj_std = 0.02 / sqrt(2.0 * (l->n_layers > 0 ? l->n_layers : 1));
    /* the layout's tensors are in block order */
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *t = &l->tensors[i];
        if (t->block != block) continue;
        float *p = dst + t->offset;
        int is_norm = t->role == MODEL_ROLE_LN1_W || t->role == MODEL_ROLE_LN2_W ||
                      t->role == MODEL_ROLE_NORM_W;
        if (t->ndim == 1) {
            for (size_t e = 0; e < t->numel; e++) p[e] = is_norm ? 1.0f : 0.0f;
            continue;
        }
        double std = (t->role == MODEL_ROLE_ATTN_OUT_W || t->role == MODEL_ROLE_MLP_DOWN_W) ? proj_std : 0.02;
        /* splitmix is a counter: element e draws the two values after
         * 2e draws of the tensor, so the elements are independent (and the
         * values the sequential draw gives) */
        uint64_t s0 = *rng;
        long long n = (long long)t->numel;
#pragma omp parallel for schedule(static) if (n > 65536)
        for (long long e = 0; e < n; e++) {
            uint64_t s = s0 + 2 * (uint64_t)e * 0x9e3779b97f4a7c15ull;
            p[e] = (float)(gauss(&s) * std);
        }
        *rng = s0 + 2 * (uint64_t)n * 0x9e3779b97f4a7c15ull;
    }
}

void tf_init_weights(const model_layout *l, float *const *host_blocks, uint64_t seed)
{
    uint64_t s = tf_init_rng(seed);
    for (int b = 0; b < l->n_blocks; b++) tf_init_block_weights(l, b, host_blocks[b], &s);
}
