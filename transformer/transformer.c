/* GPT-2 and LLaMA forward and backward, block by block, on the device
 * interface. Shapes: N = b*t rows (tokens), h hidden, q = hq*d query width,
 * kv = hkv*d, f the MLP width, v the vocabulary. */
#include "transformer/transformer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/nf4.h" /* defines: zo_nf4_bytes, zo_nf4_quantize */
#include "common/splitmix.h" /* defines: zo_splitmix_next, zo_splitmix_skip */
#include "model/lora.h" /* defines: model_lora_layout_init, MODEL_LORA_A */

static int is_gpt(const tf_model *m) { return m->cfg.arch == ZO_ARCH_GPT; }
static int has_lora(const tf_model *m) { return m->opts.lora.r > 0; }
/* Rows of router statistics a layer keeps: DeepSeek's balance loss per
 * sequence (seq_aux, in training) counts each sequence's choices apart, the
 * others the micro-batch's */
static size_t stat_rows(const tf_model *m)
{
    const zo_moe *mo = &m->cfg.moe;
    return mo->aux_per_layer && mo->seq_aux && mo->aux_loss && !m->opts.kv_len ? (size_t)m->B : 1;
}
/* Gemma, Gemma-2 and Gemma-3: RMSNorm times (1 + w) (Gemma-3's q/k norms
 * too), the embedding times sqrt(hidden), GeGLU */
static int is_gemma(const tf_model *m) { return zo_family_gemma(m->cfg.family); }
/* Gemma-2, OLMo-2: norms on the attention's and the MLP's outputs */
static int post_norms(const tf_model *m) { return zo_model_post_norms(&m->cfg); }
/* norms before the attention and the MLP (ln1, ln2): every layer but OLMo-2's,
 * whose attention reads the layer's input and whose MLP reads x_mid */
static int pre_norms(const zo_model_config *c) { return zo_model_pre_norms(c); }
/* Rotary positions: LLaMA's, GPT-NeoX's and Falcon's on GPT layers */
static int has_rope(const tf_model *m) { return !is_gpt(m) || m->cfg.pos == ZO_POS_ROTARY; }
/* Whether layer l turns its q and k (not Cohere2's global layers) */
static int layer_rope(const tf_model *m, int l) { return has_rope(m) && zo_model_layer_rotary(&m->cfg, l); }
/* GPT-NeoX's use_parallel_residual, Falcon's parallel_attn: x + attn(ln1(x)) + mlp(ln2(x)) */
static int parallel_residual(const tf_model *m) { return m->cfg.parallel_block; }
/* Falcon-7B: one norm for both (ln2 is ln1) */
static int one_norm(const zo_model_config *c) { return c->layer_norms == 1; }
/* The GPT MLP's activation: GELU's erf form (GPT-NeoX's "gelu"), ReLU
 * (OPT's), else GELU's tanh form */
static int act_form(const zo_model_config *c)
{
    return !strcmp(c->act, "gelu") ? GPU_ACT_GELU_ERF : !strcmp(c->act, "relu") ? GPU_ACT_RELU : GPU_ACT_GELU_TANH;
}
static int qkv_width(const zo_model_config *c) { return (c->n_heads + 2 * c->n_kv_heads) * c->head_dim; }
static int q_width(const zo_model_config *c) { return c->n_heads * c->head_dim; }
/* the LLaMA-shaped MLP's gate: GELU's tanh form (Gemma's GeGLU; the
 * runtime check refuses Gemma's other activations), else SiLU */
static int tf_geglu(const zo_model_config *c) { return zo_family_gemma(c->family); }
/* the q/k norms' inputs per token (q's and k's widths; 0 without them) and
 * their 1/rms values per token (one a head; OLMo-2's whole-projection norms: two) */
static size_t qk_norm_in(const zo_model_config *c)
{
    return c->qk_norm ? (size_t)(c->n_heads + c->n_kv_heads) * (size_t)c->head_dim : 0;
}
static size_t qk_rows(const zo_model_config *c) { return (size_t)zo_model_qk_norm_rows(c); }
static int is_moe(const tf_model *m, int l) { return zo_model_layer_is_moe(&m->cfg, l); }
/* DeepSeek-V2's latent attention: the fused attention runs over heads of
 * head_dim = qk_nope + qk_rope for q, k and v alike (v zero-padded) */
static int is_mla(const zo_model_config *c) { return c->mla.kv_rank > 0; }
/* o_proj's input per token: heads x v_dim (latent attention), else q's width */
static int o_width(const zo_model_config *c) { return is_mla(c) ? c->n_heads * c->mla.v_dim : q_width(c); }
/* Generation over the latent cache (tf_options.mla_cache): a cache row is
 * [k_pe | c_kv], one key head of mla_row wide (docs/transformer.md, "The
 * latent cache") */
static int mla_row(const zo_model_config *c) { return c->mla.qk_rope + c->mla.kv_rank; }
static int latent_cache(const tf_model *m)
{
    return m->opts.kv_len && is_mla(&m->cfg) && m->opts.mla_cache == TF_MLA_CACHE_LATENT;
}
static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }
/* The width of layer l's dense MLP activations: the MLP's, or in an MoE
 * layer the shared expert's (0: none) */
static size_t layer_mlp_width(const zo_model_config *c, int l)
{
    return (size_t)(zo_model_layer_is_moe(c, l) ? c->moe.shared_ffn : c->ffn);
}
/* The widest of them: DeepSeek's dense first layers' MLP or its MoE layers'
 * shared experts */
static size_t mlp_width(const zo_model_config *c)
{
    if (!c->moe.experts) return (size_t)c->ffn;
    return max_z((size_t)c->moe.shared_ffn, c->moe.first_dense ? (size_t)c->ffn : 0);
}
/* Columns per token of the widest MLP activation: the dense MLP's, the
 * shared expert's, or the top_k chosen experts' (packed [N top_k, expert_ffn]) */
static size_t widest_mlp(const zo_model_config *c)
{
    return max_z(mlp_width(c), (size_t)c->moe.top_k * (size_t)c->moe.expert_ffn);
}

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

/* QLoRA stores a tensor in NF4: the linear weights of the layers but an
 * MoE layer's router and shared expert gate, which choose and weigh the
 * experts (kept in the model dtype, as memplan sizes them), and Cohere's
 * q/k norm weights (2-D, a row per head, but norms). */
static int frozen_is_nf4(const tf_model *m, const model_tensor *t)
{
    return m->opts.lora.nf4 && t->block != MODEL_BLOCK_EMBED &&
           t->block != model_layout_head_block(&m->layout) && t->ndim == 2 && t->role != MODEL_ROLE_ROUTER_W &&
           t->role != MODEL_ROLE_SHARED_GATE_W && t->role != MODEL_ROLE_Q_NORM_W && t->role != MODEL_ROLE_K_NORM_W;
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* One kind of layer's adapter slots from its modules (mods), as
 * model_lora_layout_init lays such a layer out: the modules in order, the
 * routed experts' together at the first of them, expert after expert;
 * returns the layer's adapter elements, *n the slots. */
static size_t lora_slots(const tf_model *m, const zo_lora_module *mods, int n_mods, tf_lora_slot *slots, int *n)
{
    const zo_model_config *c = &m->cfg;
    const int q = q_width(c), kv = c->n_kv_heads * c->head_dim, r = m->opts.lora.r;
    size_t at = 0, e_stride = 0, e_at = 0;
    int e_seen = 0, u = 0; /* u: the next column of lora_u, the dense modules' in order */
    for (int j = 0; j < n_mods; j++)
        if (mods[j].experts) e_stride += (size_t)r * (size_t)(mods[j].in + mods[j].out);
    *n = 0;
    for (int j = 0; j < n_mods; j++) {
        tf_lora_slot *sl = &slots[(*n)++];
        unsigned t = mods[j].targets;
        const int uj = mods[j].experts ? -1 : u++;
        sl->u = uj;
        if (t == (ZO_LORA_GATE | ZO_LORA_UP)) {
            /* Phi-3's gate_up_proj: A [r, h], B [2f, r]; a gate slot with B's
             * first f rows and an up slot with the rest, over the one A (its
             * gradient the sum of both slots'; B's rows are [out, r]) */
            int f = (int)mods[j].out / 2;
            tf_lora_slot *up = &slots[(*n)++];
            *sl = (tf_lora_slot){.stage = TF_LORA_GATE, .u = uj, .in = (int)mods[j].in, .out = f,
                                 .a_off = at, .b_off = at + (size_t)r * (size_t)mods[j].in};
            *up = *sl;
            up->stage = TF_LORA_UP;
            up->b_off += (size_t)f * (size_t)r;
            at += (size_t)r * (size_t)(mods[j].in + mods[j].out);
            continue;
        }
        int ex = mods[j].experts > 0;
        /* latent attention's projections (its q_proj: QKV's, at column 0) */
        const zo_lora_latent lt = mods[j].latent;
        const int mla = is_mla(c) && !ex && (t & (ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V));
        sl->stage = lt == ZO_LORA_LATENT_Q_A                   ? TF_LORA_MLA_QA
                    : lt == ZO_LORA_LATENT_Q_B                 ? TF_LORA_MLA_QB
                    : lt == ZO_LORA_LATENT_KV_A                ? TF_LORA_MLA_KVA
                    : lt == ZO_LORA_LATENT_KV_B                ? TF_LORA_MLA_KVB
                    : t & (ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V) ? TF_LORA_QKV
                    : t == ZO_LORA_O                         ? TF_LORA_O
                    : t == ZO_LORA_GATE                      ? (ex ? TF_LORA_EXPERT_GATE : TF_LORA_GATE)
                    : t == ZO_LORA_UP                        ? (ex ? TF_LORA_EXPERT_UP : TF_LORA_UP)
                                                             : (ex ? TF_LORA_EXPERT_DOWN : TF_LORA_DOWN);
        sl->col = mla ? 0 : t == ZO_LORA_K ? q : t == ZO_LORA_V ? q + kv : 0;
        sl->in = (int)mods[j].in;
        sl->out = (int)mods[j].out;
        size_t *pos = &at;
        if (ex) {
            if (!e_seen++) { /* the first expert module: the experts' adapters (the window's) start here */
                e_at = at;
                at += (size_t)m->layout.expert_count * e_stride;
            }
            pos = &e_at;
            sl->e_stride = e_stride;
        }
        sl->a_off = *pos;
        sl->b_off = *pos + (size_t)r * sl->in;
        *pos += (size_t)r * (size_t)(sl->in + sl->out);
    }
    return at;
}

/* The adapter slots of layer l: a dense first layer's (DeepSeek), else lora[]. */
static const tf_lora_slot *layer_slots(const tf_model *m, int l, int *n)
{
    if (m->n_lora_dense && !is_moe(m, l)) {
        *n = m->n_lora_dense;
        return m->lora_dense;
    }
    *n = m->n_lora;
    return m->lora;
}

/* The adapter slots of the layers of layer `layer`'s kind (*n of them),
 * checked against the adapter layout's block; the A x columns and the
 * routed experts' adapters they need. */
static zo_status lora_kind_init(tf_model *m, int layer, tf_lora_slot *slots, int *n)
{
    zo_lora_module mods[ZO_LORA_MAX_MODULES];
    int experts;
    const int n_mods = zo_lora_layer_modules_at(&m->cfg, layer, m->opts.lora.targets, mods);
    const int n_u = zo_lora_dense_modules(mods, n_mods, &experts);
    if (n_u > m->n_lora_u) m->n_lora_u = n_u;
    m->lora_experts |= experts;
    size_t at = lora_slots(m, mods, n_mods, slots, n);
    size_t want = m->adapters.block_numel[model_layout_layer_block(layer)];
    if (at != want)
        return zo_error(ZO_ERR_INTERNAL, "tf_init: the adapters of layer %d laid out in %zu elements, not %zu",
                        layer, at, want);
    return ZO_OK;
}

/* The adapter layout, the slots of a layer's adapters (an MoE model's dense
 * first layers: their own) and the frozen buffers' offsets (host memory;
 * the device buffers come after). */
static zo_status lora_init(tf_model *m)
{
    zo_status st;
    const tf_lora_options *o = &m->opts.lora;
    const zo_model_config *c = &m->cfg;
    zo_lora_config lc = {.r = o->r, .alpha = o->alpha, .targets = o->targets};
    if ((st = model_lora_layout_init_experts(&m->adapters, c, &lc, m->layout.expert_first, m->layout.expert_count)) !=
        ZO_OK)
        return zo_error_wrap(st, "tf_init");
    m->lora_scale = o->alpha / (float)o->r;
    /* lora[]: the last layer's kind; lora_dense[]: an MoE model's dense first layers' */
    if ((st = lora_kind_init(m, c->n_layers - 1, m->lora, &m->n_lora)) != ZO_OK) return st;
    if (c->moe.experts && c->moe.first_dense && (st = lora_kind_init(m, 0, m->lora_dense, &m->n_lora_dense)) != ZO_OK)
        return st;
    const model_layout *l = &m->layout;
    m->frozen_off = calloc((size_t)l->n_tensors + 1, sizeof *m->frozen_off);
    m->frozen_bytes = calloc((size_t)l->n_blocks, sizeof *m->frozen_bytes);
    if (!m->frozen_off || !m->frozen_bytes) return zo_error(ZO_ERR_NOMEM, "tf_init: out of host memory");
    size_t es = zo_dtype_size(m->dtype);
    int prev_nf4 = 0, block = -1;
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *t = &l->tensors[i];
        if (t->block != block) prev_nf4 = 0;
        block = t->block;
        int nf4 = frozen_is_nf4(m, t);
        size_t off = m->frozen_bytes[block];
        if (nf4 || prev_nf4) off = align_up(off, TF_FROZEN_ALIGN);
        m->frozen_off[i] = off;
        m->frozen_bytes[block] = off + (nf4 ? zo_nf4_bytes(t->numel) : t->numel * es);
        prev_nf4 = nf4;
    }
    return ZO_OK;
}

/* YaRN's correction dim: where along rotary dim d the pair lies that turns
 * `turns` times in orig positions at base^(-2i/d). */
static double yarn_dim(int d, double base, double orig, double turns)
{
    return d * log(orig / (2.0 * M_PI * turns)) / (2.0 * log(base));
}

/* YaRN's frequencies (Hugging Face's _compute_yarn_parameters) over rotary
 * dim d, into f[0 .. d/2) which holds theta^(-2i/d): pair i keeps f (the
 * extrapolated frequency) below the dim where beta_fast rotations fit in
 * the original length, takes f / factor (interpolated) past the dim where
 * beta_slow do, and a linear ramp between; with truncate the ramp's ends
 * are floor and ceil of those dims, clamped to [0, d - 1]. */
static void yarn_frequencies(const zo_model_config *c, int d, double *f)
{
    const double base = c->rope_theta, orig = c->rope_original_max, factor = c->rope_factor;
    double lo = yarn_dim(d, base, orig, c->rope_beta_fast), hi = yarn_dim(d, base, orig, c->rope_beta_slow);
    if (c->rope_truncate) lo = floor(lo), hi = ceil(hi);
    lo = lo > 0.0 ? lo : 0.0;
    hi = hi < d - 1 ? hi : d - 1;
    if (hi == lo) hi += 0.001; /* no division by zero */
    for (int i = 0; i < d / 2; i++) {
        double ramp = (i - lo) / (hi - lo);
        ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
        f[i] = f[i] / factor * ramp + f[i] * (1.0 - ramp);
    }
}

/* The rotary frequencies of c's rope_scaling, as Hugging Face computes them
 * (its ROPE_INIT_FUNCTIONS), for sequences up to T: f[i] = theta^(-2i/d),
 * then linear: f / factor; llama3: f / factor for wavelengths past
 * original / low_freq_factor, f below original / high_freq_factor, and a
 * blend between; dynamic: f itself within its original length; longrope:
 * f / short_factor[i] for T up to the original length, f / long_factor[i]
 * past it (Hugging Face chooses by the sequence length of a forward; T is
 * the batch's: rope_params picks the table a forward turns by), and *scale
 * its attention factor. yarn: a blend of f
 * and f / factor (yarn_frequencies) at every length, and *scale its
 * attention factor. Other kinds are refused by name (ZO_ERR_UNSUPPORTED). */
static zo_status rope_frequencies(const zo_model_config *c, int T, double *f, float *scale)
{
    const int d = zo_model_rope_dim(c), half = d / 2;
    const char *kind = c->rope_scaling;
    for (int i = 0; i < half; i++) f[i] = pow((double)c->rope_theta, -2.0 * i / d);
    if (!strcmp(kind, "linear")) {
        for (int i = 0; i < half; i++) f[i] /= c->rope_factor;
    } else if (!strcmp(kind, "llama3")) {
        double orig = c->rope_original_max, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
        for (int i = 0; i < half; i++) {
            double wavelen = 2.0 * M_PI / f[i];
            if (wavelen > orig / lo) {
                f[i] /= c->rope_factor;
            } else if (wavelen >= orig / hi) {
                double smooth = (orig / wavelen - lo) / (hi - lo);
                f[i] = (1.0 - smooth) * f[i] / c->rope_factor + smooth * f[i];
            }
        }
    } else if (!strcmp(kind, "longrope")) {
        if (c->rope_n_factors != half)
            return zo_error(ZO_ERR_UNSUPPORTED,
                            "tf_init: model %s: rope_scaling \"longrope\": short_factor and long_factor must be "
                            "lists of %s / 2 = %d numbers each (got %d)",
                            c->name, d == c->head_dim ? "head_dim" : "the rotary dim (head_dim x partial_rotary_factor or rotary_pct)",
                            half, c->rope_n_factors);
        const float *ext = T > c->rope_original_max ? c->rope_long_factor : c->rope_short_factor;
        for (int i = 0; i < half; i++) f[i] /= (double)ext[i];
        /* (Phi-3.5-MoE: long_mscale past the original length, short_mscale within) */
        *scale = T > c->rope_original_max && c->rope_long_attention_factor > 0.0f ? c->rope_long_attention_factor
                                                                                  : c->rope_attention_factor;
    } else if (!strcmp(kind, "yarn")) {
        if (!(c->rope_theta > 1.0f))
            return zo_error(ZO_ERR_FORMAT, "tf_init: model %s: rope_scaling \"yarn\" needs rope_theta > 1 (got %g)",
                            c->name, c->rope_theta);
        yarn_frequencies(c, d, f);
        *scale = c->rope_attention_factor;
    } else if (!strcmp(kind, "dynamic")) {
        if (T > c->rope_original_max)
            return zo_error(ZO_ERR_UNSUPPORTED,
                            "tf_init: model %s: rope_scaling \"dynamic\" changes the rotary frequencies past "
                            "%d positions, and the sequence is %d (the transformer computes it up to %d)",
                            c->name, c->rope_original_max, T, c->rope_original_max);
    } else {
        return zo_error(ZO_ERR_UNSUPPORTED,
                        "tf_init: model %s: rope_scaling \"%s\" is not computed here (llama3, linear, "
                        "longrope, yarn and dynamic within its original length are)",
                        c->name, kind);
    }
    return ZO_OK;
}

/* `bytes` of host into the device buffer dst, copied before this returns. */
static zo_status upload(const tf_model *m, void *dst, const void *host, size_t bytes)
{
    gpu_stream_t s = NULL;
    zo_status st = gpu_stream_create(m->dev, &s);
    if (st == ZO_OK) st = gpu_memcpy_async(s, dst, host, bytes, GPU_COPY_HOST_TO_DEVICE);
    if (st == ZO_OK) st = gpu_stream_synchronize(s);
    gpu_stream_destroy(s);
    return st;
}

/* *dst = a new device buffer holding `bytes` of host, copied before this returns. */
static zo_status upload_new(tf_model *m, void **dst, const void *host, size_t bytes)
{
    zo_status st = gpu_mem_alloc(m->dev, bytes, dst);
    return st == ZO_OK ? upload(m, *dst, host, bytes) : st;
}

/* DeepSeek-V3's router score corrections: zeros on the host and the
 * device, and each MoE layer's tensor entry for a save (fp32 [experts]). */
static zo_status router_bias_alloc(tf_model *m)
{
    const zo_model_config *c = &m->cfg;
    if (!c->moe.router_bias || !c->moe.experts) return ZO_OK;
    const int L = c->n_layers, E = c->moe.experts, moe = L - c->moe.first_dense;
    m->router_bias_h = calloc((size_t)L * E, sizeof(float));
    m->router_bias_entries = calloc((size_t)(moe > 0 ? moe : 1), sizeof *m->router_bias_entries);
    m->router_bias_names = calloc((size_t)(moe > 0 ? moe : 1), sizeof *m->router_bias_names);
    if (!m->router_bias_h || !m->router_bias_entries || !m->router_bias_names)
        return zo_error(ZO_ERR_NOMEM, "tf_init: out of host memory (router score corrections)");
    for (int l = c->moe.first_dense, i = 0; l < L; l++, i++) {
        snprintf(m->router_bias_names[i], MODEL_TENSOR_NAME_MAX, "model.layers.%d.mlp.gate.e_score_correction_bias",
                 l);
        m->router_bias_entries[i] = (model_st_entry){.name = m->router_bias_names[i], .dtype = ZO_DTYPE_F32,
                                                     .ndim = 1, .shape = {E}, .data = m->router_bias_h + (size_t)l * E};
    }
    return upload_new(m, (void **)&m->router_bias, m->router_bias_h, (size_t)L * E * sizeof(float));
}

const model_st_entry *tf_router_bias_entries(const tf_model *m, int *n)
{
    *n = m->router_bias_h ? m->cfg.n_layers - m->cfg.moe.first_dense : 0;
    return *n ? m->router_bias_entries : NULL;
}

zo_status tf_load_router_bias(const tf_model *m, const char *path)
{
    const zo_model_config *c = &m->cfg;
    if (!m->router_bias_h || !path) return ZO_OK;
    const int L = c->n_layers, E = c->moe.experts;
    model_ckpt ck;
    zo_status st = model_ckpt_open(&ck, path);
    if (st != ZO_OK) return st;
    for (int l = c->moe.first_dense, i = 0; l < L && st == ZO_OK; l++, i++) {
        const char *name = m->router_bias_names[i];
        const model_ckpt_entry *e = model_ckpt_find(&ck, name);
        if (!e) {
            st = zo_error(ZO_ERR_NOT_FOUND, "%s: tensor \"%s\" is missing (%s's router score correction)", path,
                          name, c->name);
            break;
        }
        const model_st_file *f = &ck.files[e->file];
        if (e->tensor->ndim != 1 || e->tensor->shape[0] != E) {
            st = zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\": %d dimensions, the model (%s) expects [%d]", f->path,
                          name, e->tensor->ndim, c->name, E);
            break;
        }
        float *dst = m->router_bias_h + (size_t)l * E;
        if ((st = model_st_read(f, e->tensor, dst, ZO_DTYPE_F32, 0)) != ZO_OK) break;
        for (int j = 0; j < E; j++)
            if (!isfinite(dst[j])) {
                st = zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\" element %d is %g: it must be finite", f->path,
                              name, j, (double)dst[j]);
                break;
            }
    }
    model_ckpt_close(&ck);
    return st == ZO_OK ? upload(m, m->router_bias, m->router_bias_h, (size_t)L * E * sizeof(float)) : st;
}

/* A rope_scaling's frequencies into device memory (m->rope_freq). longrope
 * over sequences (training) or a cache (generation) past its original
 * length makes both tables, the short one for forwards within it and the
 * long one (m->rope_freq_long) past it. */
static zo_status rope_upload(tf_model *m)
{
    const zo_model_config *c = &m->cfg;
    if (!c->rope_scaling[0] || !has_rope(m)) return ZO_OK;
    const int half = zo_model_rope_dim(c) / 2, T = m->opts.kv_len ? m->opts.kv_len : m->T;
    const int two = zo_model_longrope_switches(c, T);
    size_t bytes = (size_t)(two ? 2 : 1) * half * sizeof(double);
    double *host = malloc(bytes);
    if (!host) return zo_error(ZO_ERR_NOMEM, "tf_init: out of host memory");
    zo_status st = rope_frequencies(c, two ? c->rope_original_max : T, host, &m->rope_scale); /* the last position */
    if (st == ZO_OK && two) st = rope_frequencies(c, T, host + half, &m->rope_scale_long);
    if (st == ZO_OK) st = upload_new(m, (void **)&m->rope_freq, host, bytes);
    if (st == ZO_OK && two) m->rope_freq_long = m->rope_freq + half;
    free(host);
    return st;
}

/* The widest norm weight: hidden, or the q/k norms' (Gemma-3's head_dim,
 * whole-projection ones q's width). */
static size_t norm_width(const zo_model_config *c)
{
    return max_z((size_t)c->hidden, !c->qk_norm ? 0 : c->qk_norm_full ? (size_t)q_width(c) : (size_t)c->head_dim);
}

/* Gemma's norms multiply by 1 + w: m->norm_one's first norm_width floats
 * are ones, the next hold 1 + w (norm_weight); fp32, as GemmaRMSNorm adds
 * in fp32. */
static zo_status norm_one_upload(tf_model *m)
{
    if (!is_gemma(m)) return ZO_OK;
    size_t h = norm_width(&m->cfg), bytes = 2 * h * sizeof(float);
    float *host = malloc(bytes);
    if (!host) return zo_error(ZO_ERR_NOMEM, "tf_init: out of host memory");
    for (size_t j = 0; j < 2 * h; j++) host[j] = 1.0f;
    zo_status st = upload_new(m, (void **)&m->norm_one, host, bytes);
    free(host);
    return st;
}

/* Layer l's attention: the shape, its sliding window (0: none, or a window
 * no shorter than the keys a query can see, the sequence or the cache,
 * which masks nothing: so the kernels that take no window may run it), the
 * score scale (Gemma-2's query_pre_attn_scalar^-0.5, Granite's
 * attention_multiplier; 0: 1/sqrt(head_dim)),
 * soft cap (0: none) and ALiBi: BLOOM's adds slope_h (j - i) to the scaled
 * scores; Falcon's (Falcon-RW) adds bf16(bf16(slope_h) j) to them before the
 * scale, so 1/sqrt(head_dim) of it reaches them (gpu/device.h). */
static gpu_attn_desc layer_attn(const tf_model *m, int l)
{
    const zo_model_config *c = &m->cfg;
    const int alibi = c->pos == ZO_POS_ALIBI, falcon = alibi && zo_model_falcon(c);
    const int window = zo_model_layer_window(c, l), keys = m->opts.kv_len ? m->opts.kv_len : m->t;
    gpu_attn_desc ad = {.b = m->b, .t = m->t, .hq = c->n_heads, .hkv = c->n_kv_heads, .d = c->head_dim,
                        .window = window < keys ? window : 0, .softcap = c->attn_softcap,
                        .alibi = falcon ? (float)(1.0 / sqrt((double)c->head_dim)) : alibi ? 1.0f : 0.0f,
                        .alibi_bf16 = falcon};
    if (c->query_pre_attn_scalar > 0.0f) ad.scale = (float)(1.0 / sqrt((double)c->query_pre_attn_scalar));
    if (c->attn_mult > 0.0f) ad.scale = c->attn_mult; /* Granite's attention_multiplier, the scale itself */
    /* latent attention: (qk_nope + qk_rope)^-0.5, the head size, times
     * mscale^2 where rope_scaling gives mscale_all_dim (DeepSeek-V2's
     * softmax_scale), mscale = 0.1 mscale_all_dim ln(factor) + 1 for factor > 1 */
    if (is_mla(c) && c->rope_mscale_all_dim > 0.0 && c->rope_factor > 1.0f) {
        double ms = 0.1 * c->rope_mscale_all_dim * log((double)c->rope_factor) + 1.0;
        ad.scale = (float)(ms * ms / sqrt((double)c->head_dim));
    }
    return ad;
}

static gpu_tensor bview(const tf_model *m, const void *buf, int block, model_role role);

/* gpt-oss: layer l's sink logits (the block's SINKS, in the model dtype)
 * cast to fp32 for the attention ops, one per query head; with `grad` (the
 * backward) also where their gradient goes (sinks32's second half, added
 * to the block's gradient by attn_sinks_grad). Nothing without sinks. */
static zo_status attn_sinks(tf_model *m, gpu_stream_t s, const void *W, int blk, gpu_attn_desc *ad, int grad)
{
    if (!m->cfg.attn_sinks) return ZO_OK;
    const int H = m->cfg.n_heads;
    ad->sinks = m->sinks32;
    if (grad) ad->dsinks = m->sinks32 + H;
    return gpu_cast(s, gpu_t(m->sinks32, ZO_DTYPE_F32), bview(m, W, blk, MODEL_ROLE_SINKS), (size_t)H);
}

/* The sinks' gradient (attn_sinks with grad) added to the block's (G NULL: frozen). */
static zo_status attn_sinks_grad(tf_model *m, gpu_stream_t s, const void *G, int blk)
{
    gpu_tensor g = tf_view(m, G, blk, MODEL_ROLE_SINKS);
    if (!m->cfg.attn_sinks || !g.data) return ZO_OK;
    const int H = m->cfg.n_heads;
    return gpu_bias_backward(s, g, gpu_t(m->sinks32 + H, ZO_DTYPE_F32), 1, H, H);
}

/* Elements of the widest 16-bit activation gradient of a micro-batch of N
 * tokens: a linear layer's output (q|k|v, the MLP's or an MoE layer's
 * pairs, the hidden size) or the logits (of a chunk of `chunk` tokens). */
static size_t widest_gradient(const zo_model_config *c, size_t N, size_t chunk)
{
    const zo_mla *x = &c->mla; /* latent attention's projections: q_a's, kv_a's, kv_b's */
    size_t w[] = {(size_t)qkv_width(c), widest_mlp(c), (size_t)c->hidden,
                  (size_t)c->moe.experts + (size_t)c->moe.top_k * (size_t)c->hidden, (size_t)x->q_rank,
                  (size_t)(x->kv_rank + x->qk_rope), (size_t)c->n_heads * (size_t)(x->qk_nope + x->v_dim)};
    size_t most = 0;
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) most = w[i] > most ? w[i] : most;
    /* the logits' gradient: the micro-batch's rows, or a loss chunk's */
    return N * most > chunk * (size_t)c->vocab ? N * most : chunk * (size_t)c->vocab;
}

/* Tokens of the head's chunks: the micro-batch's, or the loss chunk's. */
static size_t loss_rows(const tf_model *m, size_t N)
{
    return m->opts.loss_chunk > 0 && (size_t)m->opts.loss_chunk < N ? (size_t)m->opts.loss_chunk : N;
}

int tf_recompute_layers(const tf_model *m)
{
    int L = m->cfg.n_layers, k = m->opts.recompute_layers;
    if (!m->opts.recompute) return 0;
    return k > 0 && k < L ? k : L;
}

/* Recompute by op: every layer keeps qkv, att, lse and fc, the rest is shared. */
static int recompute_ops(const tf_model *m) { return m->opts.recompute == TF_RECOMPUTE_OPS; }

/* Whether layer l has an activation set of its own: every layer without
 * recompute, the first of the recomputed ones (the shared set) and the
 * layers after them. (By op, every layer owns its kept buffers: ops_acts.) */
static int owns_acts(const tf_model *m, size_t l)
{
    if (m->opts.kv_len) return l == 0; /* generation: one set for every layer */
    return l == 0 || l >= (size_t)tf_recompute_layers(m);
}

size_t tf_kv_cache_bytes(const zo_model_config *cfg, zo_dtype dtype, int B, int kv_len, int mla_cache)
{
    size_t row = is_mla(cfg) && mla_cache == TF_MLA_CACHE_LATENT
                     ? (size_t)mla_row(cfg)
                     : 2 * (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim;
    return (size_t)cfg->n_layers * (size_t)B * (size_t)kv_len * row * zo_dtype_size(dtype);
}

/* An adapter on kv_b_proj under the latent cache: the absorbed form runs
 * its terms beside the absorbed weight (mla_latent_attention), in mla_u */
static int mla_kvb_adapter(const tf_model *m)
{
    if (!latent_cache(m) || !has_lora(m)) return 0;
    for (int j = 0; j < m->n_lora; j++)
        if (m->lora[j].stage == TF_LORA_MLA_KVB) return 1;
    return 0;
}

/* Generation's buffers (opts.kv_len): the new tokens and each sequence's
 * position, one set of layer activations for the forward of B x T new
 * tokens (no log-sum-exp: nothing goes backward), the key/value caches, and
 * the head's B rows and logits. An MoE model's layers share one set of
 * moe_forward's buffers for those N tokens: the router's logits and weights
 * [N, E], the top_k pairs of each token (inputs, outputs, activations), the
 * routing lists on the host, and the router statistics its kernel writes. */
static zo_status gen_alloc(tf_model *m)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    size_t B = (size_t)m->B, N = B * m->T, es = zo_dtype_size(m->dtype), h = c->hidden, f = mlp_width(c);
    size_t L = c->n_layers, lora_cols = has_lora(m) ? (size_t)m->n_lora_u * m->opts.lora.r : 0;
    size_t E = (size_t)c->moe.experts, fe = (size_t)c->moe.expert_ffn, K = (size_t)c->moe.top_k;
    int llama = c->arch != ZO_ARCH_GPT;
    m->moe_rows = K * N;
    m->kcache = calloc(L ? L : 1, sizeof *m->kcache);
    m->vcache = calloc(L ? L : 1, sizeof *m->vcache);
    m->hpos = calloc(B, sizeof *m->hpos);
    m->hlast = calloc(B, sizeof *m->hlast);
    m->hrowpos = latent_cache(m) ? calloc(N, sizeof *m->hrowpos) : NULL;
    if (!m->kcache || !m->vcache || !m->hpos || !m->hlast || (latent_cache(m) && !m->hrowpos))
        return zo_error(ZO_ERR_NOMEM, "tf_init: out of host memory");
    const act_req io[] = {{(void **)&m->tokens, N * 4, "tokens"}, {(void **)&m->pos, B * 4, "positions"}};
    if ((st = act_alloc(m, io, N_REQ(io))) != ZO_OK) return st;
    if (!m->opts.external_res)
        for (size_t l = 0; l <= L; l++) {
            const act_req r[] = {{&m->res[l], N * h * es, "residual"}};
            if ((st = act_alloc(m, r, N_REQ(r))) != ZO_OK) return st;
        }
    tf_layer_acts *a = &m->acts[0];
    /* the latent cache: the absorbed form (decoding) runs at most B rows at
     * once (mla_latent_chunks), its q|k|v H query heads and one key and
     * value head of the cache row's width, its output (q before absorption
     * first) H heads of it, with an adapter on kv_b_proj that adapter's
     * terms; the decompressed form (mla_decompressed: a prompt, a long call)
     * the full cache's q|k|v, c_kv copy and kv_b output at B T rows, and the
     * keys and values it attends; each new row's position */
    const int lat = latent_cache(m);
    size_t Hr = (size_t)c->n_heads * (lat ? (size_t)mla_row(c) : 0);
    const int pre = pre_norms(c); /* (OLMo-2: no ln1, ln2) */
    const act_req r[] = {
        {&a->ln1, L && pre ? N * h * es : 0, "ln1"},
        {(void **)&a->mean1, L && pre ? N * 4 : 0, "ln1 mean"},
        {(void **)&a->rstd1, L && pre ? N * 4 : 0, "ln1 rstd"},
        {&a->qkv, L ? max_z(N * qkv_width(c), B * (lat ? Hr + 2 * (size_t)mla_row(c) : 0)) * es : 0, "qkv"},
        {&a->att, L ? max_z(N * q_width(c), B * Hr) * es : 0, "attention"},
        {&a->mla_qa, L ? N * (size_t)c->mla.q_rank * es : 0, "latent attention q_a"},
        {&a->mla_ckv, L ? N * (size_t)c->mla.kv_rank * es : 0, "latent attention c_kv"},
        {&a->mla_attv, L && is_mla(c) ? N * o_width(c) * es : 0, "latent attention output (o_proj input)"},
        {&m->mla_kva, L && is_mla(c) ? N * (size_t)(c->mla.kv_rank + c->mla.qk_rope) * es : 0, "latent attention kv_a"},
        {&m->mla_kv, L && is_mla(c) ? N * (size_t)c->n_heads * (c->mla.qk_nope + c->mla.v_dim) * es : 0,
         "latent attention kv_b"},
        {&m->mla_kdec, L && lat ? N * (size_t)(qkv_width(c) - q_width(c)) * es : 0,
         "latent cache: the decompressed keys and values"},
        {&m->mla_u, L && mla_kvb_adapter(m) ? B * c->n_heads * (size_t)m->opts.lora.r * es : 0,
         "latent cache: kv_b_proj's adapter terms"},
        {(void **)&m->rowpos, lat ? N * 4 : 0, "latent cache: the rows' positions"},
        {&a->x_mid, L && !parallel_residual(m) ? N * h * es : 0, "residual mid"},
        /* Gemma-2: one input and 1/rms for both output norms (nothing kept) */
        {&a->pa_in, L && post_norms(m) ? N * h * es : 0, "post norm input"},
        {(void **)&a->rstd3, L && post_norms(m) ? N * 4 : 0, "post norm rstd"},
        {&a->ln2, L && pre && !one_norm(c) ? N * h * es : 0, "ln2"},
        {(void **)&a->mean2, L && pre && !one_norm(c) ? N * 4 : 0, "ln2 mean"},
        {(void **)&a->rstd2, L && pre && !one_norm(c) ? N * 4 : 0, "ln2 rstd"},
        {&a->fc, L ? N * f * es : 0, "mlp fc/gate"},
        {&a->up, L && llama ? N * f * es : 0, "mlp up"},
        {&a->act, L ? N * f * es : 0, "mlp activation"},
        {&a->lora_u, L ? N * lora_cols * es : 0, "LoRA A x"},
        {&m->tmp, N * h * es, "scratch"},
        {&m->hsel, B * h * es, "the rows of the next tokens"},
        {&m->lnf, B * h * es, "final norm"},
        {(void **)&m->meanf, B * 4, "final norm mean"},
        {(void **)&m->rstdf, B * 4, "final norm rstd"},
        {&m->emb_x, c->embed_norm ? N * h * es : 0, "embedding norm input"},
        {(void **)&m->emb_mean, c->embed_norm ? N * 4 : 0, "embedding norm mean"},
        {(void **)&m->emb_rstd, c->embed_norm ? N * 4 : 0, "embedding norm rstd"},
        {&m->logits, B * c->vocab * sizeof(float), "logits"},
        {&m->wdq, has_lora(m) && m->opts.lora.nf4 ? (size_t)zo_lora_dequant_elems(c) * es : 0, "dequantized weight"},
        {(void **)&a->router_logits, L ? N * E * 4 : 0, "router logits"},
        {(void **)&a->router_w, L ? N * E * 4 : 0, "router weights"},
        {&a->efc, L ? K * N * fe * es : 0, "expert gates"},
        {&a->eup, L ? K * N * fe * es : 0, "expert ups"},
        {&a->eact, L ? K * N * fe * es : 0, "expert activations"},
        {(void **)&a->moe_idx, L ? K * N * 4 : 0, "expert tokens"},
        {(void **)&a->moe_wp, L ? K * N * 4 : 0, "expert token weights"},
        {(void **)&a->sgate, L && c->moe.shared_gate ? N * 4 : 0, "shared expert gate"},
        {(void **)&m->moe_stats, L * 2 * E * 4, "router statistics"},
        {&m->sact, E ? N * max_z((size_t)c->moe.shared_ffn, K * fe) * es : 0, "weighted expert activation"},
        {&m->moe_x, K * N * h * es, "expert inputs"},
        {&m->moe_y, K * N * h * es, "expert outputs"},
        {&m->eu, E && m->lora_experts ? (size_t)zo_moe_expert_rows(c, 0, N, 1) * m->opts.lora.r * es : 0,
         "expert LoRA A x"},
        {(void **)&m->sinks32, c->attn_sinks ? 2 * (size_t)c->n_heads * 4 : 0, "attention sinks"},
    };
    if ((st = act_alloc(m, r, N_REQ(r))) != ZO_OK) return st;
    if (E && L && (!(a->moe_idx_h = malloc(K * N * 4)) || !(a->moe_wp_h = malloc(K * N * 4)) ||
                   !(a->moe_off = calloc(E + 1, sizeof *a->moe_off)) || !(m->moe_w_h = malloc(N * E * 4))))
        return zo_error(ZO_ERR_NOMEM, "tf_init: out of host memory (routing of %zu tokens)", N);
    for (size_t l = 1; l < L; l++) m->acts[l] = m->acts[0];
    /* the caches: every layer's keys and values of B sequences of kv_len
     * positions, or the latent of each position (one buffer: kcache) */
    const int parts = lat ? 1 : 2;
    size_t one = tf_kv_cache_bytes(c, m->dtype, m->B, m->opts.kv_len, m->opts.mla_cache) / (parts * (L ? L : 1));
    for (size_t l = 0; l < L; l++) {
        if ((st = gpu_mem_alloc(m->dev, one, &m->kcache[l])) != ZO_OK ||
            (!lat && (st = gpu_mem_alloc(m->dev, one, &m->vcache[l])) != ZO_OK))
            return zo_error_wrap(st, "transformer %s cache of layer %zu (%zu bytes%s: %d sequences of %d positions)",
                                 lat ? "latent" : "key/value", l, one, lat ? "" : " each for keys and values", m->B,
                                 m->opts.kv_len);
        m->kv_bytes += (size_t)parts * one;
    }
    return ZO_OK;
}

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
    m->rope_scale = m->rope_scale_long = 1.0f;
    if (opts) m->opts = *opts;
    if (B < 1 || T < 1)
        return zo_error(ZO_ERR_INVALID, "tf_init: micro-batch %d x %d must be positive", B, T);
    if ((st = zo_model_config_runtime_check(cfg)) != ZO_OK) return zo_error_wrap(st, "tf_init");
    if (m->opts.recompute_layers < 0)
        return zo_error(ZO_ERR_INVALID, "tf_init: recompute_layers %d is negative", m->opts.recompute_layers);
    if (m->opts.recompute < TF_RECOMPUTE_NONE || m->opts.recompute > TF_RECOMPUTE_OPS)
        return zo_error(ZO_ERR_INVALID, "tf_init: recompute %d is not none (0), full (1) or ops (2)",
                        m->opts.recompute);
    if (recompute_ops(m) && m->opts.recompute_layers)
        return zo_error(ZO_ERR_INVALID, "tf_init: recompute by op with recompute_layers %d (the first K "
                        "layers are recomputed whole: recompute full)", m->opts.recompute_layers);
    if (is_mla(cfg) && recompute_ops(m))
        return zo_error(ZO_ERR_UNSUPPORTED, "tf_init: model %s: latent attention (kv_lora_rank) with recompute "
                        "by op is not implemented (recompute full or none)", cfg->name);
    if (recompute_ops(m) && cfg->moe.experts)
        return zo_error(ZO_ERR_UNSUPPORTED, "tf_init: model %s: recompute by op is implemented for dense "
                        "layers (recompute full or none)", cfg->name);
    if (m->opts.loss_chunk < 0)
        return zo_error(ZO_ERR_INVALID, "tf_init: loss chunk %d must not be negative", m->opts.loss_chunk);
    if (m->opts.lora.r < 0 || (m->opts.lora.nf4 && m->opts.lora.r < 1))
        return zo_error(ZO_ERR_INVALID, "tf_init: LoRA rank %d (NF4 needs LoRA: a rank >= 1)",
                        m->opts.lora.r);
    if (m->opts.kv_len < 0 || (m->opts.kv_len && m->opts.recompute))
        return zo_error(ZO_ERR_INVALID, "tf_init: a key/value cache of %d positions (generation: kv_len >= 1, "
                        "no recompute)", m->opts.kv_len);
    if (m->opts.mla_cache != TF_MLA_CACHE_LATENT && m->opts.mla_cache != TF_MLA_CACHE_FULL)
        return zo_error(ZO_ERR_INVALID, "tf_init: tf_options.mla_cache %d is not latent (0) or full (1)",
                        m->opts.mla_cache);
    const char *why = zo_moe_check_capacity(cfg, m->opts.capacity_factor);
    if (why) return zo_error(ZO_ERR_INVALID, "tf_init: capacity factor %g (%s)", m->opts.capacity_factor, why);
    if (cfg->moe.top_k >= GPU_MOE_NOT_CHOSEN && m->opts.capacity_factor > 0)
        return zo_error(ZO_ERR_UNSUPPORTED, "tf_init: model %s: a capacity factor with top_k %d (at most %d)",
                        cfg->name, cfg->moe.top_k, GPU_MOE_NOT_CHOSEN - 1);
    /* gpt-oss: its balance loss (Hugging Face's own form) and capacity
     * drops are not implemented for it: refused by name */
    if (zo_model_gpt_oss(cfg) && cfg->moe.aux_loss && !m->opts.kv_len)
        return zo_error(ZO_ERR_UNSUPPORTED, "tf_init: model %s: gpt-oss with output_router_logits (its balance "
                        "loss: Hugging Face's reads the router's top-k scores, not Mixtral's logits) is not "
                        "implemented", cfg->name);
    if (zo_model_gpt_oss(cfg) && m->opts.capacity_factor > 0 && !m->opts.kv_len)
        return zo_error(ZO_ERR_UNSUPPORTED, "tf_init: model %s: gpt-oss with a capacity factor is not "
                        "implemented (it routes dropless)", cfg->name);
    if (m->opts.kv_len) m->opts.capacity_factor = 0; /* generation routes dropless */
    /* expert parallelism: this rank's window of the experts */
    int ep_first = 0, ep_count = cfg->moe.experts;
    m->ep_size = m->opts.ep ? comm_size(m->opts.ep) : 1;
    m->ep_rank = m->opts.ep ? comm_rank(m->opts.ep) : 0;
    if (m->ep_size > 1) {
        if (!cfg->moe.experts || cfg->moe.experts % m->ep_size)
            return zo_error(ZO_ERR_INVALID, "tf_init: model %s: expert parallelism over %d ranks needs a number "
                            "of experts it divides (the model has %d)", cfg->name, m->ep_size, cfg->moe.experts);
        if (m->opts.kv_len)
            return zo_error(ZO_ERR_UNSUPPORTED, "tf_init: expert parallelism with generation is not implemented");
        /* the exchange hands device memory to the communicator: the CPU device's is host memory */
        if (!comm_device_buffers(m->opts.ep) && strcmp(gpu_device_name(dev), "cpu"))
            return zo_error(ZO_ERR_UNSUPPORTED, "tf_init: the %s communicator takes host buffers, expert "
                            "parallelism's exchange runs on %s device memory: use NCCL with a CUDA device",
                            comm_backend_name(comm_get_backend(m->opts.ep)), gpu_device_name(dev));
        ep_count = cfg->moe.experts / m->ep_size;
        ep_first = m->ep_rank * ep_count;
    }
    if ((st = model_layout_init_experts(&m->layout, cfg, ep_first, ep_count)) != ZO_OK) return st;
    m->cfg = m->layout.cfg;
    m->dev = dev;
    m->dtype = dtype;
    m->B = B;
    m->T = T;
    const zo_model_config *c = &m->cfg;
    int last_pos = m->opts.kv_len > T ? m->opts.kv_len : T; /* positions the model sees */
    if (zo_model_position_rows(c) && last_pos > c->max_seq) {
        model_layout_free(&m->layout);
        return zo_error(ZO_ERR_INVALID, "tf_init: %s %d exceeds the %d learned positions of %s",
                        m->opts.kv_len ? "context" : "sequence", last_pos, c->max_seq, c->name);
    }
    size_t N = (size_t)B * T, es = zo_dtype_size(dtype), h = c->hidden, f = mlp_width(c);
    size_t E = (size_t)c->moe.experts, fe = (size_t)c->moe.expert_ffn, K = (size_t)c->moe.top_k;
    size_t L = c->n_layers;
    m->res = calloc(L + 1, sizeof *m->res);
    m->acts = calloc(L, sizeof *m->acts);
    if (!m->res || !m->acts) {
        tf_free(m);
        return zo_error(ZO_ERR_NOMEM, "tf_init: out of host memory");
    }
    const int lora = has_lora(m);
    if (lora && (st = lora_init(m)) != ZO_OK) goto out_free;
    if (m->opts.kv_len) { /* generation: the forward's buffers and the caches */
        if ((st = gen_alloc(m)) != ZO_OK || (st = rope_upload(m)) != ZO_OK || (st = norm_one_upload(m)) != ZO_OK ||
            (st = router_bias_alloc(m)) != ZO_OK)
            goto out_free;
        return ZO_OK;
    }
    size_t lora_cols = lora ? (size_t)m->n_lora_u * m->opts.lora.r : 0;
    /* the rows the experts here compute a layer (zo_moe_rank_rows): the
     * rank's own pairs kept (min(top_k N, E C) with a capacity factor),
     * or with expert parallelism the most every rank of the group can
     * send (dropless: each token at most min(top_k, El) of them; with a
     * capacity factor at most C of each expert from each rank) */
    size_t El = (size_t)m->layout.expert_count, P = (size_t)m->ep_size;
    double F = m->opts.capacity_factor;
    m->moe_rows = (size_t)zo_moe_rank_rows(c, F, N, 1);
    m->ep_rows = P > 1 ? (size_t)zo_moe_rank_rows(c, F, N, P) : 0;
    size_t Mr = m->moe_rows, X = P > 1 ? m->ep_rows : Mr;
    /* LoRA: one expert's rows at a time (zo_moe_expert_rows), its adapters'
     * x A^T and their gradient, which the dense adapters' N rows share;
     * none where the experts carry no adapters */
    size_t Er = E && m->lora_experts ? (size_t)zo_moe_expert_rows(c, F, N, P) : 0;
    /* [rows, columns] of the MLP's scratch: the shared expert's, the rows
     * at the experts here (the pairs kept, N top_k of them dropless, or
     * with expert parallelism what the group sends, never fewer) */
    size_t wide = max_z(N * mlp_width(c), X * fe);
    const act_req io[] = {{(void **)&m->tokens, N * 4, "tokens"}, {(void **)&m->targets, N * 4, "targets"}};
    if ((st = act_alloc(m, io, N_REQ(io))) != ZO_OK) goto out_free;
    if (!m->opts.external_res)
        for (size_t l = 0; l <= L; l++) {
            const act_req r[] = {{&m->res[l], N * h * es, "residual"}};
            if ((st = act_alloc(m, r, N_REQ(r))) != ZO_OK) goto out_free;
        }
    /* with recompute, the layers recomputed share one set of activation
     * buffers (acts[0]); the others keep their own */
    int llama = c->arch != ZO_ARCH_GPT;
    for (size_t l = 0; l < L; l++) {
        if (!owns_acts(m, l)) {
            m->acts[l] = m->acts[0];
            if (!recompute_ops(m)) continue;
            /* by op: the kept outputs of its own, the rest shared with layer 0 */
            tf_layer_acts *a = &m->acts[l];
            a->qkv = a->att = a->fc = a->qkn = a->pm_in = NULL; /* tf_free frees these of a layer that fails here */
            a->lse = a->qk_rstd = a->rstd4 = NULL;
            /* Gemma-2/3: the MLP's post norm's input and rstd, so that the
             * backward reruns no down projection (its output is the norm's input) */
            const act_req r[] = {
                {&a->qkv, N * qkv_width(c) * es, "qkv"},
                {&a->qkn, N * qk_norm_in(c) * es, "q/k norm inputs"},
                {(void **)&a->qk_rstd, N * qk_rows(c) * 4, "q/k norm rstd"},
                {&a->att, N * q_width(c) * es, "attention"},
                {(void **)&a->lse, (size_t)B * c->n_heads * T * 4, "attention lse"},
                {&a->fc, N * f * es, "mlp fc/gate"},
                {&a->pm_in, post_norms(m) ? N * h * es : 0, "mlp output (post norm input)"},
                {(void **)&a->rstd4, post_norms(m) ? N * 4 : 0, "mlp post norm rstd"},
            };
            if ((st = act_alloc(m, r, N_REQ(r))) != ZO_OK) goto out_free;
            continue;
        }
        tf_layer_acts *a = &m->acts[l];
        /* the layer's own MLP width; layer 0's set serves the recomputed
         * layers too (dense and MoE alike: the widest) */
        int shared = l == 0 && tf_recompute_layers(m) > 1;
        size_t f = shared ? mlp_width(c) : layer_mlp_width(c, (int)l);
        /* the router's and experts' buffers: an MoE layer's (DeepSeek's dense first layers have none) */
        size_t me = E && (shared || is_moe(m, (int)l)) ? 1 : 0;
        const act_req r[] = {
            {&a->ln1, pre_norms(c) ? N * h * es : 0, "ln1"},
            {(void **)&a->mean1, pre_norms(c) ? N * 4 : 0, "ln1 mean"},
            {(void **)&a->rstd1, pre_norms(c) ? N * 4 : 0, "ln1 rstd"},
            {&a->qkv, N * qkv_width(c) * es, "qkv"},
            {&a->qkn, N * qk_norm_in(c) * es, "q/k norm inputs"},
            {(void **)&a->qk_rstd, N * qk_rows(c) * 4, "q/k norm rstd"},
            {&a->att, N * q_width(c) * es, "attention"},
            {(void **)&a->lse, (size_t)B * c->n_heads * T * 4, "attention lse"},
            {&a->x_mid, parallel_residual(m) ? 0 : N * h * es, "residual mid"},
            {&a->pa_in, post_norms(m) ? N * h * es : 0, "attention output (post norm input)"},
            {&a->pm_in, post_norms(m) ? N * h * es : 0, "mlp output (post norm input)"},
            {(void **)&a->rstd3, post_norms(m) ? N * 4 : 0, "attention post norm rstd"},
            {(void **)&a->rstd4, post_norms(m) ? N * 4 : 0, "mlp post norm rstd"},
            {&a->ln2, one_norm(c) || !pre_norms(c) ? 0 : N * h * es, "ln2"},
            {(void **)&a->mean2, one_norm(c) || !pre_norms(c) ? 0 : N * 4, "ln2 mean"},
            {(void **)&a->rstd2, one_norm(c) || !pre_norms(c) ? 0 : N * 4, "ln2 rstd"},
            {&a->fc, N * f * es, "mlp fc/gate"},
            {&a->up, llama ? N * f * es : 0, "mlp up"},
            {&a->act, N * f * es, "mlp activation"},
            {&a->lora_u, N * lora_cols * es, "LoRA A x"},
            {(void **)&a->router_logits, me * N * E * 4, "router logits"},
            {(void **)&a->router_w, me * N * E * 4, "router weights"},
            {&a->efc, me * X * fe * es, "expert gates"},
            {&a->eup, me * X * fe * es, "expert ups"},
            {&a->eact, me * X * fe * es, "expert activations"},
            {(void **)&a->moe_idx, me * Mr * 4, "expert tokens"},
            {(void **)&a->moe_wp, me * Mr * 4, "expert token weights"},
            {(void **)&a->sgate, c->moe.shared_gate ? me * N * 4 : 0, "shared expert gate"},
            {&a->mla_qa, N * (size_t)c->mla.q_rank * es, "latent attention q_a"},
            {&a->mla_qa_in, N * (size_t)c->mla.q_rank * es, "latent attention q_a norm input"},
            {(void **)&a->mla_qa_rstd, c->mla.q_rank ? N * 4 : 0, "latent attention q_a norm rstd"},
            {&a->mla_ckv, N * (size_t)c->mla.kv_rank * es, "latent attention c_kv"},
            {&a->mla_ckv_in, N * (size_t)c->mla.kv_rank * es, "latent attention c_kv norm input"},
            {(void **)&a->mla_ckv_rstd, is_mla(c) ? N * 4 : 0, "latent attention c_kv norm rstd"},
            {&a->mla_attv, is_mla(c) ? N * o_width(c) * es : 0, "latent attention output (o_proj input)"},
            {&a->ep_x, me * m->ep_rows * h * es, "expert parallel inputs"},
            {(void **)&a->ep_wp, me * m->ep_rows * 4, "expert parallel weights"},
            {(void **)&a->ep_idx, me * 2 * m->ep_rows * 4, "expert parallel order"},
        };
        if ((st = act_alloc(m, r, N_REQ(r))) != ZO_OK) goto out_free;
        if (!me) continue;
        if (E && (!(a->moe_idx_h = malloc(Mr * 4)) || !(a->moe_wp_h = malloc(Mr * 4)) ||
                  !(a->moe_off = calloc(E + 1, sizeof *a->moe_off)))) {
            st = zo_error(ZO_ERR_NOMEM, "tf_init: out of host memory (routing of %zu tokens)", N);
            goto out_free;
        }
        if (P > 1 && (!(a->ep_idx_h = malloc(2 * m->ep_rows * 4)) || !(a->ep_cnt = calloc(P * El, sizeof(int))) ||
                      !(a->ep_off = calloc(El + 1, sizeof(int))))) {
            st = zo_error(ZO_ERR_NOMEM, "tf_init: out of host memory (expert parallel routing of %zu rows)",
                          m->ep_rows);
            goto out_free;
        }
    }
    const act_req r[] = {
        {&m->lnf, N * h * es, "final norm"},
        {(void **)&m->meanf, N * 4, "final norm mean"},
        {(void **)&m->rstdf, N * 4, "final norm rstd"},
        {&m->emb_x, c->embed_norm ? N * h * es : 0, "embedding norm input"},
        {(void **)&m->emb_mean, c->embed_norm ? N * 4 : 0, "embedding norm mean"},
        {(void **)&m->emb_rstd, c->embed_norm ? N * 4 : 0, "embedding norm rstd"},
        {&m->logits, loss_rows(m, N) * c->vocab * sizeof(float), "logits"}, /* fp32 for the cross-entropy */
        {(void **)&m->losses, N * 4, "losses"},
        {&m->tmp, N * h * es, "scratch"},
        {(void **)&m->dres, N * h * 4, "residual gradient"},
        {(void **)&m->dh, N * h * 4, "norm gradient"},
        {(void **)&m->dqkv, N * qkv_width(c) * 4, "qkv gradient"},
        {&m->mla_kva, is_mla(c) ? N * (size_t)(c->mla.kv_rank + c->mla.qk_rope) * es : 0, "latent attention kv_a"},
        {&m->mla_kv, is_mla(c) ? N * (size_t)c->n_heads * (c->mla.qk_nope + c->mla.v_dim) * es : 0,
         "latent attention kv_b"},
        {(void **)&m->mla_dkva, is_mla(c) ? N * (size_t)(c->mla.kv_rank + c->mla.qk_rope) * 4 : 0,
         "latent attention kv_a gradient"},
        {(void **)&m->mla_dkv, is_mla(c) ? N * (size_t)c->n_heads * (c->mla.qk_nope + c->mla.v_dim) * 4 : 0,
         "latent attention kv_b gradient"},
        {(void **)&m->mla_dckv, N * (size_t)c->mla.kv_rank * 4, "latent attention c_kv gradient"},
        {(void **)&m->mla_dqa, N * (size_t)c->mla.q_rank * 4, "latent attention q_a gradient"},
        {(void **)&m->mla_dattv, is_mla(c) ? N * o_width(c) * 4 : 0, "latent attention output gradient"},
        {(void **)&m->datt, N * q_width(c) * 4, "attention gradient"},
        {(void **)&m->dff, wide * 4, "mlp gradient"},
        {(void **)&m->dff2, llama ? wide * 4 : 0, "mlp up gradient"},
        {(void **)&m->moe_stats, L * stat_rows(m) * 2 * E * 4, "router statistics"},
        {(void **)&m->drouter, N * E * 4, "router gradient"},
        {(void **)&m->moe_order, F > 0 ? N * E : 0, "router choice order"},
        {(void **)&m->dweights, N * E * 4, "expert weight gradient"},
        {(void **)&m->dz, c->moe.shared_gate ? N * 4 : 0, "shared expert gate gradient"},
        {(void **)&m->sinks32, c->attn_sinks ? 2 * (size_t)c->n_heads * 4 : 0, "attention sinks"},
        {&m->sact, E ? max_z(N * (size_t)c->moe.shared_ffn, X * fe) * es : 0, "weighted expert activation"},
        {&m->moe_x, Mr * h * es, "expert inputs"},
        {&m->moe_y, Mr * h * es, "expert outputs"},
        {(void **)&m->moe_dx, Mr * h * 4, "expert input gradients"},
        {(void **)&m->moe_dscale, Mr * 4, "expert weight gradients"},
        {(void **)&m->dlora, lora ? max_z(N, Er) * m->opts.lora.r * 4 : 0, "LoRA gradient"},
        {&m->eu, Er * m->opts.lora.r * es, "expert LoRA A x"},
        {&m->wdq, lora && m->opts.lora.nf4 ? (size_t)zo_lora_dequant_elems(c) * es : 0, "dequantized weight"},
        {&m->dy16, dtype == ZO_DTYPE_F32 ? 0 : max_z(widest_gradient(c, N, loss_rows(m, N)), P * N * max_z(h, fe)) * es,
         "16-bit activation gradient"},
        {&m->ep_buf[0], m->ep_rows * h * 4, "expert parallel rows"},
        {&m->ep_buf[1], m->ep_rows * h * 4, "expert parallel rows grouped"},
        {(void **)&m->ep_w[0], m->ep_rows * 4, "expert parallel weights"},
        {(void **)&m->ep_w[1], m->ep_rows * 4, "expert parallel weights grouped"},
        {(void **)&m->ep_cnt_d, P > 1 ? 2 * P * El * 4 : 0, "expert parallel counts"},
    };
    if ((st = act_alloc(m, r, N_REQ(r))) != ZO_OK) goto out_free;
    if (P > 1 && (!(m->ep_cnt_h = malloc(2 * P * El * 4)) || !(m->ep_counts = malloc(2 * P * sizeof(size_t))))) {
        st = zo_error(ZO_ERR_NOMEM, "tf_init: out of host memory (expert parallel counts)");
        goto out_free;
    }
    /* the router's weights, read to route; with a capacity factor the
     * chosen experts' choice ranks and each expert's pairs of each rank */
    const char *host = NULL;
    if (E && !(m->moe_w_h = malloc(N * E * 4)))
        host = "router weights";
    else if (E && F > 0 && !(m->moe_rank_h = malloc(N * E)))
        host = "choice ranks";
    else if (E && F > 0 && !(m->moe_quota_h = malloc(E * K * sizeof(int))))
        host = "capacity quotas";
    if (host) {
        st = zo_error(ZO_ERR_NOMEM, "tf_init: out of host memory (%s, %zu tokens x %zu experts)", host, N, E);
        goto out_free;
    }
    /* a rope_scaling's frequencies (what it does not compute is refused here) */
    if ((st = rope_upload(m)) != ZO_OK || (st = norm_one_upload(m)) != ZO_OK ||
            (st = router_bias_alloc(m)) != ZO_OK) goto out_free;
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
    gpu_mem_free(d, m->rope_freq);
    gpu_mem_free(d, m->norm_one);
    gpu_mem_free(d, m->router_bias);
    free(m->router_bias_h);
    free(m->router_bias_entries);
    free(m->router_bias_names);
    if (m->res && !m->opts.external_res)
        for (size_t l = 0; l <= L; l++) gpu_mem_free(d, m->res[l]);
    if (m->acts)
        for (size_t l = 0; l < L; l++) {
            tf_layer_acts *a = &m->acts[l];
            if (!owns_acts(m, l)) {
                if (recompute_ops(m)) {
                    gpu_mem_free(d, a->qkv);
                    gpu_mem_free(d, a->att);
                    gpu_mem_free(d, a->lse);
                    gpu_mem_free(d, a->fc);
                    gpu_mem_free(d, a->qkn);
                    gpu_mem_free(d, a->qk_rstd);
                    gpu_mem_free(d, a->pm_in);
                    gpu_mem_free(d, a->rstd4);
                }
                continue;
            }
            void *p[] = {a->ln1,  a->mean1,  a->rstd1, a->qkv,           a->att,
                         a->lse,  a->x_mid,  a->ln2,   a->mean2,         a->rstd2,
                         a->fc,   a->up,     a->act,   a->lora_u,        a->router_logits,
                         a->router_w, a->efc, a->eup,  a->eact,          a->sgate,
                         a->moe_idx, a->moe_wp, a->ep_x,     a->ep_wp,         a->ep_idx,
                         a->qkn,  a->qk_rstd, a->pa_in, a->pm_in, a->rstd3, a->rstd4,
                         a->mla_qa, a->mla_qa_in, a->mla_qa_rstd, a->mla_ckv, a->mla_ckv_in, a->mla_ckv_rstd,
                         a->mla_attv};
            for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) gpu_mem_free(d, p[i]);
            free(a->ep_idx_h);
            free(a->ep_cnt);
            free(a->ep_off);
            free(a->moe_idx_h);
            free(a->moe_wp_h);
            free(a->moe_off);
        }
    void *p[] = {m->lnf,  m->meanf, m->rstdf, m->emb_x, m->emb_mean, m->emb_rstd, m->logits, m->losses, m->tmp,
                 m->dres, m->dh,    m->dqkv,  m->datt,   m->dff,       m->dff2,
                 m->dlora, m->wdq,  m->dy16,   m->moe_stats, m->drouter, m->moe_order,
                 m->dweights, m->dz, m->sinks32, m->sact, m->moe_x, m->moe_y, m->moe_dx, m->moe_dscale, m->eu,
                 m->ep_buf[0], m->ep_buf[1], m->ep_w[0], m->ep_w[1], m->ep_cnt_d,
                 m->mla_kva, m->mla_kv, m->mla_kdec, m->mla_u, m->mla_dkva, m->mla_dkv, m->mla_dckv, m->mla_dqa,
                 m->mla_dattv};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) gpu_mem_free(d, p[i]);
    for (size_t l = 0; l < L; l++) {
        if (m->kcache) gpu_mem_free(d, m->kcache[l]);
        if (m->vcache) gpu_mem_free(d, m->vcache[l]);
    }
    gpu_mem_free(d, m->pos);
    gpu_mem_free(d, m->rowpos);
    gpu_mem_free(d, m->hsel);
    free(m->kcache);
    free(m->vcache);
    free(m->hpos);
    free(m->hlast);
    free(m->hrowpos);
    free(m->res);
    free(m->acts);
    free(m->moe_w_h);
    free(m->moe_rank_h);
    free(m->moe_quota_h);
    free(m->ep_cnt_h);
    free(m->ep_counts);
    free(m->frozen_off);
    free(m->frozen_bytes);
    model_layout_free(&m->adapters);
    model_layout_free(&m->layout);
    memset(m, 0, sizeof *m);
}

size_t tf_block_bytes(const tf_model *m, int block)
{
    const model_layout *l = has_lora(m) ? &m->adapters : &m->layout;
    return l->block_numel[block] * zo_dtype_size(m->dtype);
}

size_t tf_frozen_bytes(const tf_model *m, int block)
{
    return has_lora(m) ? m->frozen_bytes[block] : 0;
}

zo_status tf_frozen_pack(const tf_model *m, int block, const float *src, void *dst)
{
    zo_status st;
    if (!has_lora(m)) return zo_error(ZO_ERR_INVALID, "tf_frozen_pack: the model has no LoRA");
    if (block < 0 || block >= m->layout.n_blocks)
        return zo_error(ZO_ERR_INVALID, "tf_frozen_pack: block %d outside 0..%d", block, m->layout.n_blocks - 1);
    uint8_t *out = dst;
    memset(out, 0, m->frozen_bytes[block]); /* the padding too: the same bytes every time */
    for (int i = 0; i < m->layout.n_tensors; i++) {
        const model_tensor *t = &m->layout.tensors[i];
        if (t->block != block) continue;
        if (!frozen_is_nf4(m, t)) {
            zo_convert(out + m->frozen_off[i], m->dtype, src + t->offset, ZO_DTYPE_F32, t->numel);
            continue;
        }
        if ((st = zo_nf4_quantize(out + m->frozen_off[i], src + t->offset, t->numel, 0)) != ZO_OK)
            return zo_error_wrap(st, "tf_frozen_pack: %s", t->name);
    }
    return ZO_OK;
}

zo_status tf_frozen_unpack(const tf_model *m, int block, const void *src, float *dst)
{
    if (!has_lora(m)) return zo_error(ZO_ERR_INVALID, "tf_frozen_unpack: the model has no LoRA");
    if (block < 0 || block >= m->layout.n_blocks)
        return zo_error(ZO_ERR_INVALID, "tf_frozen_unpack: block %d outside 0..%d", block, m->layout.n_blocks - 1);
    const uint8_t *in = src;
    for (int i = 0; i < m->layout.n_tensors; i++) {
        const model_tensor *t = &m->layout.tensors[i];
        if (t->block != block) continue;
        if (!frozen_is_nf4(m, t)) {
            zo_convert(dst + t->offset, ZO_DTYPE_F32, in + m->frozen_off[i], m->dtype, t->numel);
            continue;
        }
        zo_nf4_dequantize(dst + t->offset, ZO_DTYPE_F32, in + m->frozen_off[i], t->numel, 0);
    }
    return ZO_OK;
}

void tf_lora_merge_block(const tf_model *m, int block, const float *adapters, float *w)
{
    if (!has_lora(m) || block < 1 || block > m->cfg.n_layers) return;
    static const model_role role[] = {[TF_LORA_QKV] = MODEL_ROLE_QKV_W, [TF_LORA_O] = MODEL_ROLE_ATTN_OUT_W,
                                      [TF_LORA_GATE] = MODEL_ROLE_MLP_GATE_W, [TF_LORA_UP] = MODEL_ROLE_MLP_UP_W,
                                      [TF_LORA_DOWN] = MODEL_ROLE_MLP_DOWN_W,
                                      [TF_LORA_EXPERT_GATE] = MODEL_ROLE_EXPERT_GATE_W,
                                      [TF_LORA_EXPERT_UP] = MODEL_ROLE_EXPERT_UP_W,
                                      [TF_LORA_EXPERT_DOWN] = MODEL_ROLE_EXPERT_DOWN_W,
                                      [TF_LORA_MLA_QA] = MODEL_ROLE_Q_A_W, [TF_LORA_MLA_QB] = MODEL_ROLE_Q_B_W,
                                      [TF_LORA_MLA_KVA] = MODEL_ROLE_KV_A_W, [TF_LORA_MLA_KVB] = MODEL_ROLE_KV_B_W};
    const int r = m->opts.lora.r;
    int n;
    const tf_lora_slot *slots = layer_slots(m, model_layout_block_layer(block), &n);
    for (int j = 0; j < n; j++) {
        const tf_lora_slot *sl = &slots[j];
        /* (latent attention's q_proj: its own tensor, not a fused q|k|v) */
        model_role rl = sl->stage == TF_LORA_QKV && is_mla(&m->cfg) ? MODEL_ROLE_Q_W : role[sl->stage];
        const model_view *v = model_layout_view(&m->layout, block, rl);
        int experts = sl->e_stride ? m->layout.expert_count : 1; /* a routed expert's: each expert's */
        for (int e = 0; e < experts; e++) {
            const float *A = adapters + sl->a_off + (size_t)e * sl->e_stride; /* [r, in] */
            const float *Bm = adapters + sl->b_off + (size_t)e * sl->e_stride; /* [out, r] */
            /* rows col.. of the weight (of the fused q|k|v for q, k, v), [rows, in] */
            float *W = w + v->offset + (size_t)e * model_layout_expert_stride(&m->layout) * (sl->e_stride != 0) +
                       (size_t)sl->col * sl->in;
            for (int o = 0; o < sl->out; o++)
                for (int i = 0; i < sl->in; i++) {
                    double acc = 0.0;
                    for (int k = 0; k < r; k++) acc += (double)Bm[(size_t)o * r + k] * A[(size_t)k * sl->in + i];
                    W[(size_t)o * sl->in + i] += (float)(m->lora_scale * acc);
                }
        }
    }
}

/* A model built for generation has no backward buffers. */
static zo_status check_trains(const tf_model *m, const char *fn)
{
    if (!m->opts.kv_len) return ZO_OK;
    return zo_error(ZO_ERR_INVALID, "%s: the model was built for generation (a key/value cache, no backward)", fn);
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
    if ((st = check_trains(m, "tf_set_batch")) != ZO_OK) return st;
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

_Static_assert(sizeof(int) == sizeof(int32_t), "hpos goes to the device as int32");

zo_status tf_set_tokens(tf_model *m, gpu_stream_t s, const int32_t *tokens, int b, int t, const int *pos,
                        const int *last)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    if (!m->opts.kv_len)
        return zo_error(ZO_ERR_INVALID, "tf_set_tokens: the model has no key/value cache (tf_options.kv_len)");
    if (b < 1 || b > m->B || t < 1 || t > m->T)
        return zo_error(ZO_ERR_INVALID, "tf_set_tokens: %d x %d new tokens outside the %d x %d the model holds", b, t,
                        m->B, m->T);
    for (int j = 0; j < b; j++) {
        if (pos[j] < 0 || pos[j] + t > m->opts.kv_len)
            return zo_error(ZO_ERR_INVALID, "tf_set_tokens: sequence %d: positions %d..%d outside the cache of %d",
                            j, pos[j], pos[j] + t - 1, m->opts.kv_len);
        if (zo_model_position_rows(c) && pos[j] + t > c->max_seq)
            return zo_error(ZO_ERR_INVALID, "tf_set_tokens: sequence %d: position %d past the %d learned positions "
                            "of %s", j, pos[j] + t - 1, c->max_seq, c->name);
        if (last[j] < 0 || last[j] >= t)
            return zo_error(ZO_ERR_INVALID, "tf_set_tokens: sequence %d: row %d of %d new tokens", j, last[j], t);
    }
    m->b = b;
    m->t = t;
    memcpy(m->hpos, pos, (size_t)b * sizeof *pos);
    memcpy(m->hlast, last, (size_t)b * sizeof *last);
    if ((st = gpu_memcpy_async(s, m->tokens, tokens, (size_t)b * t * 4, GPU_COPY_HOST_TO_DEVICE)) != ZO_OK)
        return st;
    if (m->hrowpos) { /* (the latent cache's forms take a sequence's rows apart: mla_latent_chunks) */
        for (int j = 0; j < b; j++)
            for (int i = 0; i < t; i++) m->hrowpos[(size_t)j * t + i] = pos[j] + i;
        if ((st = gpu_memcpy_async(s, m->rowpos, m->hrowpos, (size_t)b * t * 4, GPU_COPY_HOST_TO_DEVICE)) != ZO_OK)
            return st;
    }
    return gpu_memcpy_async(s, m->pos, m->hpos, (size_t)b * 4, GPU_COPY_HOST_TO_DEVICE);
}

zo_status tf_logits(tf_model *m, gpu_stream_t s, float *host)
{
    if (!m->opts.kv_len || !m->b)
        return zo_error(ZO_ERR_INVALID, "tf_logits: no generation forward (tf_set_tokens) to read");
    size_t n = (size_t)m->b * m->cfg.vocab;
    zo_status st = gpu_memcpy_async(s, host, m->logits, n * sizeof(float), GPU_COPY_DEVICE_TO_HOST);
    return st != ZO_OK ? st : gpu_stream_synchronize(s);
}

/* ---- linear layers ------------------------------------------------------------- */

static gpu_tensor F32(void *p) { return gpu_t(p, ZO_DTYPE_F32); }

/* y[N, out] (row stride ldy) = alpha x[N, in] W^T (+ b); W is [out, in].
 * alpha: Granite's residual_multiplier on a branch's last GEMM, its
 * 1 / logits_scaling on the output layer, else 1 (a bias, which no layer
 * with alpha != 1 has, is added as it is). */
static zo_status linear_forward(gpu_stream_t s, gpu_tensor y, int64_t ldy, gpu_tensor x,
                                gpu_tensor w, gpu_tensor b, int N, int out, int in, float alpha)
{
    zo_status st;
    gpu_gemm_desc g = {.trans_b = 1, .m = N, .n = out, .k = in, .alpha = alpha, .beta = 0.0f,
                       .a = x, .b = w, .c = y, .lda = in, .ldb = in, .ldc = ldy};
    if ((st = gpu_gemm(s, &g)) != ZO_OK) return st;
    if (b.data && (st = gpu_bias_forward(s, y, b, N, out, ldy)) != ZO_OK) return st;
    return ZO_OK;
}

/* Given dy[N, out]: dW += dy^T x, db += colsum(dy), dx = dy W (+ dx when
 * dx_beta is 1). dx may be NULL (no input gradient needed); dw and db may
 * be NULL (a frozen weight: no GEMM for its gradient). */
/* A linear layer's backward: dW += dy^T x, db += the column sums of dy_bias
 * (the fp32 dy, where the GEMMs take its 16-bit copy dy), dx = dx_beta dx +
 * dy W; with the forward's alpha both GEMMs times it (dW += alpha dy^T x,
 * dx = dx_beta dx + alpha dy W). */
static zo_status linear_backward(gpu_stream_t s, gpu_tensor dx, float dx_beta, gpu_tensor dw,
                                    gpu_tensor db, gpu_tensor dy_bias, gpu_tensor dy, gpu_tensor x,
                                    gpu_tensor w, int N, int out, int in, float alpha)
{
    zo_status st;
    gpu_gemm_desc gw = {.trans_a = 1, .m = out, .n = in, .k = N, .alpha = alpha, .beta = 1.0f,
                        .a = dy, .b = x, .c = dw, .lda = out, .ldb = in, .ldc = in};
    if (dw.data && (st = gpu_gemm(s, &gw)) != ZO_OK) return st;
    if (db.data && (st = gpu_bias_backward(s, db, dy_bias, N, out, out)) != ZO_OK) return st;
    if (dx.data) {
        gpu_gemm_desc gx = {.m = N, .n = in, .k = out, .alpha = alpha, .beta = dx_beta, .a = dy,
                            .b = w, .c = dx, .lda = out, .ldb = in, .ldc = in};
        if ((st = gpu_gemm(s, &gx)) != ZO_OK) return st;
    }
    return ZO_OK;
}

/* ---- the base weights and the adapters ------------------------------------------------
 * Without LoRA the base weights are the block's parameters; with LoRA they
 * are its frozen buffer, whose tensors sit at frozen_off (packed as the
 * layout's, or NF4 where QLoRA says), and the parameters are the adapters. */

static const void *base_buf(const tf_model *m, const tf_block_bufs *bb)
{
    return has_lora(m) ? bb->frozen : bb->params;
}

/* The index of the tensor of `block` holding element `e` of the block. */
static int tensor_at(const model_layout *l, int block, size_t e)
{
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *t = &l->tensors[i];
        if (t->block == block && e >= t->offset && e < t->offset + t->numel) return i;
    }
    return -1;
}

/* A base tensor (a norm, a bias, an embedding: never an NF4 one) of a base
 * buffer; data NULL when the block has no such role. */
static gpu_tensor bview(const tf_model *m, const void *buf, int block, model_role role)
{
    if (!has_lora(m) && buf && buf == m->apart_buf) {
        /* the dense part of an MoE layer streamed per expert: the roles after
         * the experts (the shared expert's) moved down over them */
        const model_view *v = model_layout_view(&m->layout, block, role);
        const model_view *x = model_layout_view(&m->layout, block, MODEL_ROLE_EXPERT_GATE_W);
        if (!v || !v->numel) return gpu_t(NULL, m->dtype);
        size_t o = v->offset, lo = x->offset;
        size_t n = (size_t)m->layout.expert_count * model_layout_expert_stride(&m->layout);
        return gpu_t((char *)buf + (o >= lo ? o - n : o) * zo_dtype_size(m->dtype), m->dtype);
    }
    if (!has_lora(m)) return tf_view(m, buf, block, role);
    const model_view *v = model_layout_view(&m->layout, block, role);
    int i = v && buf ? tensor_at(&m->layout, block, v->offset) : -1;
    if (i < 0) return gpu_t(NULL, m->dtype);
    size_t skip = (v->offset - m->layout.tensors[i].offset) * zo_dtype_size(m->dtype);
    return gpu_t((char *)buf + m->frozen_off[i] + skip, m->dtype);
}

/* A row range of an NF4 tensor of `block` (src: its bytes, numel its
 * elements, skip the range's bytes from its start): the tensor dequantized
 * into m->wdq whole, once for its ranges (gate and up of a fused gate_up),
 * in stream order. */
static zo_status wdq_range(tf_model *m, gpu_stream_t s, const char *src, size_t numel, int block, size_t skip,
                           gpu_tensor *w)
{
    *w = gpu_t((char *)m->wdq + skip, m->dtype);
    if (m->wdq_src == src && m->wdq_block == block) return ZO_OK;
    zo_status st = gpu_nf4_dequantize(s, gpu_t(m->wdq, m->dtype), src, numel);
    m->wdq_src = st == ZO_OK ? src : NULL;
    m->wdq_block = block;
    return st;
}

/* A linear weight of a layer (QKV_W fused, ATTN_OUT_W, MLP_*_W, an MoE
 * layer's router and shared expert gate): a view of the base buffer, or,
 * NF4, each of its tensors dequantized into m->wdq in stream order (the
 * scratch is reused by the next weight; a row range of the tensor wdq
 * already holds, gate after up of gate_up_proj, is read without a second
 * dequantization). */
static zo_status base_weight(tf_model *m, gpu_stream_t s, const void *buf, int block,
                             model_role role, gpu_tensor *w)
{
    zo_status st;
    const model_view *v = model_layout_view(&m->layout, block, role);
    int first = v ? tensor_at(&m->layout, block, v->offset) : -1;
    /* (an MoE layer's router and shared expert gate stay in the model dtype) */
    if (!m->opts.lora.nf4 || !has_lora(m) || (first >= 0 && !frozen_is_nf4(m, &m->layout.tensors[first]))) {
        *w = bview(m, buf, block, role);
        return ZO_OK;
    }
    size_t es = zo_dtype_size(m->dtype);
    const model_tensor *t = first >= 0 ? &m->layout.tensors[first] : NULL;
    if (t && (t->offset < v->offset || t->offset + t->numel > v->offset + v->numel)) {
        /* a row range of one tensor (Phi-3's gate or up of gate_up_proj): the
         * tensor dequantized once, the range's rows of it */
        return wdq_range(m, s, (const char *)buf + m->frozen_off[first], t->numel, block,
                         (v->offset - t->offset) * es, w);
    }
    m->wdq_src = NULL;
    for (int i = 0; v && i < m->layout.n_tensors; i++) {
        const model_tensor *t = &m->layout.tensors[i];
        if (t->block != block || t->offset < v->offset || t->offset >= v->offset + v->numel) continue;
        gpu_tensor dst = gpu_t((char *)m->wdq + (t->offset - v->offset) * es, m->dtype);
        if ((st = gpu_nf4_dequantize(s, dst, (const char *)buf + m->frozen_off[i], t->numel)) != ZO_OK)
            return st;
    }
    *w = gpu_t(v ? m->wdq : NULL, m->dtype);
    return ZO_OK;
}

/* The factor on a layer's linear layer of weight `role`: Granite's
 * residual_multiplier on the two that end a residual branch (the
 * attention's output projection, the MLP's down projection), computed as
 * their GEMMs' alpha, never folded into the stored weights (AdamW would then
 * train a differently scaled parameter); 1 elsewhere. */
static float branch_alpha(const tf_model *m, model_role role)
{
    const float r = m->cfg.resid_mult;
    return r > 0.0f && (role == MODEL_ROLE_ATTN_OUT_W || role == MODEL_ROLE_MLP_DOWN_W) ? r : 1.0f;
}

/* The adapters' factor on stage's modules: (lora_alpha / r), times
 * branch_alpha where the stage ends a residual branch (o, down). */
static float stage_scale(const tf_model *m, tf_lora_stage stage)
{
    return m->lora_scale * (stage == TF_LORA_O     ? branch_alpha(m, MODEL_ROLE_ATTN_OUT_W)
                            : stage == TF_LORA_DOWN ? branch_alpha(m, MODEL_ROLE_MLP_DOWN_W)
                                                    : 1.0f);
}

/* The output layer's factor: 1 / logits_scaling (Granite), else 1. */
static float head_alpha(const tf_model *m)
{
    return m->cfg.logit_div > 0.0f ? 1.0f / m->cfg.logit_div : 1.0f;
}

/* y[N, out] (row stride ldy) = x W^T (+ b) with the base weight `wrole`
 * and bias `brole`, times branch_alpha. */
static zo_status base_linear_forward(tf_model *m, gpu_stream_t s, const void *buf, int block,
                                     model_role wrole, model_role brole, gpu_tensor y, int64_t ldy,
                                     gpu_tensor x, int N, int out, int in)
{
    zo_status st;
    gpu_tensor w;
    if ((st = base_weight(m, s, buf, block, wrole, &w)) != ZO_OK) return st;
    return linear_forward(s, y, ldy, x, w, bview(m, buf, block, brole), N, out, in, branch_alpha(m, wrole));
}

/* linear_backward through a base weight (times branch_alpha); dw and db
 * as linear_backward (NULL with LoRA: the base is frozen). */
static zo_status base_linear_backward(tf_model *m, gpu_stream_t s, const void *buf, int block,
                                      model_role wrole, gpu_tensor dx, float dx_beta, gpu_tensor dw,
                                      gpu_tensor db, gpu_tensor dy_bias, gpu_tensor dy, gpu_tensor x,
                                      int N, int out, int in)
{
    zo_status st;
    gpu_tensor w;
    if ((st = base_weight(m, s, buf, block, wrole, &w)) != ZO_OK) return st;
    return linear_backward(s, dx, dx_beta, dw, db, dy_bias, dy, x, w, N, out, in, branch_alpha(m, wrole));
}

/* Slot sl's A [r, in] or B [out, r] in a layer block's adapter buffer. */
static gpu_tensor lora_part(const tf_model *m, const void *buf, const tf_lora_slot *sl, int part)
{
    size_t off = part == MODEL_LORA_A ? sl->a_off : sl->b_off;
    return gpu_t((char *)buf + off * zo_dtype_size(m->dtype), m->dtype);
}

/* dy [N, out] (fp32) as the GEMMs of a linear layer's backward take it:
 * rounded once to the model's 16-bit type into m->dy16 (every GEMM of the
 * layer and its adapters reads that one copy; a backend given the fp32 dy
 * beside 16-bit weights would round it again for each); fp32 models use
 * dy as it is. */
static zo_status gemm_operand(tf_model *m, gpu_stream_t s, gpu_tensor dy, int N, int out,
                              gpu_tensor *op)
{
    *op = dy;
    if (m->dtype == ZO_DTYPE_F32) return ZO_OK;
    *op = gpu_t(m->dy16, m->dtype);
    return gpu_cast(s, *op, dy, (size_t)N * out);
}

/* One adapter on n rows: u [n, r] (row stride ldu) = x A^T, then
 * y[n, out] (row stride ldy) += sc u B^T (sc: stage_scale, (alpha / r)
 * unless the module ends a Granite branch); y.data NULL: u only. */
static zo_status adapter_forward(tf_model *m, gpu_stream_t s, gpu_tensor u, int ldu, gpu_tensor A, gpu_tensor B,
                                 gpu_tensor x, gpu_tensor y, int64_t ldy, int n, int in, int out, float sc)
{
    zo_status st;
    const int r = m->opts.lora.r;
    gpu_gemm_desc ga = {.trans_b = 1, .m = n, .n = r, .k = in, .alpha = 1.0f, .beta = 0.0f,
                        .a = x, .b = A, .c = u, .lda = in, .ldb = in, .ldc = ldu};
    if ((st = gpu_gemm(s, &ga)) != ZO_OK || !y.data) return st;
    gpu_gemm_desc gb = {.trans_b = 1, .m = n, .n = out, .k = r, .alpha = sc, .beta = 1.0f,
                        .a = u, .b = B, .c = y, .lda = ldu, .ldb = r, .ldc = ldy};
    return gpu_gemm(s, &gb);
}

/* The backward of one adapter on n rows, given dy (row stride lddy), its
 * input x [n, in] and u: du = sc dy B, dB += sc dy^T u, dA += du^T x,
 * dx += du A (sc: the forward's). */
static zo_status adapter_backward(tf_model *m, gpu_stream_t s, gpu_tensor u, int ldu, gpu_tensor A, gpu_tensor B,
                                  gpu_tensor dA, gpu_tensor dB, gpu_tensor dy, int64_t lddy, gpu_tensor x,
                                  gpu_tensor dx, int n, int in, int out, float sc)
{
    zo_status st;
    const int r = m->opts.lora.r;
    gpu_tensor du = F32(m->dlora);
    gpu_gemm_desc g1 = {.m = n, .n = r, .k = out, .alpha = sc, .beta = 0.0f,
                        .a = dy, .b = B, .c = du, .lda = lddy, .ldb = r, .ldc = r};
    gpu_gemm_desc g2 = {.trans_a = 1, .m = out, .n = r, .k = n, .alpha = sc,
                        .beta = 1.0f, .a = dy, .b = u, .c = dB, .lda = lddy, .ldb = ldu, .ldc = r};
    gpu_gemm_desc g3 = {.trans_a = 1, .m = r, .n = in, .k = n, .alpha = 1.0f, .beta = 1.0f,
                        .a = du, .b = x, .c = dA, .lda = r, .ldb = in, .ldc = in};
    gpu_gemm_desc g4 = {.m = n, .n = in, .k = r, .alpha = 1.0f, .beta = 1.0f, .a = du,
                        .b = A, .c = dx, .lda = r, .ldb = in, .ldc = in};
    if ((st = gpu_gemm(s, &g1)) != ZO_OK || (st = gpu_gemm(s, &g2)) != ZO_OK || (st = gpu_gemm(s, &g3)) != ZO_OK)
        return st;
    return gpu_gemm(s, &g4);
}

/* The adapters of `stage` in layer l: u_j = x A_j^T [N, r] (saved), then
 * y[:, col_j ..] += (alpha / r) u_j B_j^T. y.data NULL: u only (recompute,
 * whose forward stops before the GEMM the adapter adds to). */
static zo_status lora_forward(tf_model *m, gpu_stream_t s, int l, const tf_block_bufs *bb,
                              tf_lora_stage stage, gpu_tensor x, gpu_tensor y, int64_t ldy)
{
    zo_status st;
    const int N = m->b * m->t, r = m->opts.lora.r, ldu = m->n_lora_u * r;
    const zo_dtype dt = m->dtype;
    int n;
    const tf_lora_slot *slots = layer_slots(m, l, &n);
    for (int j = 0; j < n; j++) {
        const tf_lora_slot *sl = &slots[j];
        if (sl->stage != stage) continue;
        gpu_tensor u = gpu_t((char *)m->acts[l].lora_u + (size_t)sl->u * r * zo_dtype_size(dt), dt);
        gpu_tensor yc = y;
        if (y.data) yc.data = (char *)y.data + (size_t)sl->col * zo_dtype_size(y.dtype);
        if ((st = adapter_forward(m, s, u, ldu, lora_part(m, bb->params, sl, MODEL_LORA_A),
                                  lora_part(m, bb->params, sl, MODEL_LORA_B), x, yc, ldy, N, sl->in, sl->out,
                                  stage_scale(m, stage))) !=
            ZO_OK)
            return st;
    }
    return ZO_OK;
}

/* Backward of the adapters of `stage` in layer l, given dy (row stride
 * lddy; adapter j reads its columns from col_j), the saved input x [N, in]
 * and u (adapter_backward). */
static zo_status lora_backward(tf_model *m, gpu_stream_t s, int l, const tf_block_bufs *bb,
                               tf_lora_stage stage, gpu_tensor dy, int64_t lddy, gpu_tensor x,
                               gpu_tensor dx)
{
    zo_status st;
    const int N = m->b * m->t, r = m->opts.lora.r, ldu = m->n_lora_u * r;
    const zo_dtype dt = m->dtype;
    int n;
    const tf_lora_slot *slots = layer_slots(m, l, &n);
    for (int j = 0; j < n; j++) {
        const tf_lora_slot *sl = &slots[j];
        if (sl->stage != stage) continue;
        gpu_tensor u = gpu_t((char *)m->acts[l].lora_u + (size_t)sl->u * r * zo_dtype_size(dt), dt);
        gpu_tensor dyc = gpu_t((char *)dy.data + (size_t)sl->col * zo_dtype_size(dy.dtype), dy.dtype);
        if ((st = adapter_backward(m, s, u, ldu, lora_part(m, bb->params, sl, MODEL_LORA_A),
                                   lora_part(m, bb->params, sl, MODEL_LORA_B), lora_part(m, bb->grads, sl, MODEL_LORA_A),
                                   lora_part(m, bb->grads, sl, MODEL_LORA_B), dyc, lddy, x, dx, N, sl->in,
                                   sl->out, stage_scale(m, stage))) != ZO_OK)
            return st;
    }
    return ZO_OK;
}

/* Routed expert e's adapter j, A or B, in a layer block's adapter buffer. */
static gpu_tensor expert_lora_part(const tf_model *m, const void *buf, int j, int e, int part)
{
    gpu_tensor t = lora_part(m, buf, &m->lora[j], part);
    t.data = (char *)t.data + (size_t)e * m->lora[j].e_stride * zo_dtype_size(m->dtype);
    return t;
}

/* The adapters of routed expert e at `stage` on its n pairs: y[n, out]
 * (row stride ldy) += (alpha / r) (x A^T) B^T, x A^T in m->eu. */
static zo_status expert_lora_forward(tf_model *m, gpu_stream_t s, const tf_block_bufs *bb, tf_lora_stage stage,
                                     int e, gpu_tensor x, gpu_tensor y, int64_t ldy, int n)
{
    zo_status st;
    for (int j = 0; j < m->n_lora; j++) {
        const tf_lora_slot *sl = &m->lora[j];
        if (sl->stage != stage) continue;
        if ((st = adapter_forward(m, s, gpu_t(m->eu, m->dtype), m->opts.lora.r,
                                  expert_lora_part(m, bb->params, j, e, MODEL_LORA_A),
                                  expert_lora_part(m, bb->params, j, e, MODEL_LORA_B), x, y, ldy, n, sl->in,
                                  sl->out, m->lora_scale)) != ZO_OK)
            return st;
    }
    return ZO_OK;
}

/* Their backward from dy (row stride lddy) and the input x [n, in]: x A^T
 * computed again (the forward's bits: the same GEMM on the same input),
 * then adapter_backward, dx += the adapters' share. */
static zo_status expert_lora_backward(tf_model *m, gpu_stream_t s, const tf_block_bufs *bb, tf_lora_stage stage,
                                      int e, gpu_tensor dy, int64_t lddy, gpu_tensor x, gpu_tensor dx, int n)
{
    zo_status st;
    const int r = m->opts.lora.r;
    gpu_tensor u = gpu_t(m->eu, m->dtype);
    for (int j = 0; j < m->n_lora; j++) {
        const tf_lora_slot *sl = &m->lora[j];
        if (sl->stage != stage) continue;
        gpu_tensor A = expert_lora_part(m, bb->params, j, e, MODEL_LORA_A);
        gpu_tensor B = expert_lora_part(m, bb->params, j, e, MODEL_LORA_B);
        if ((st = adapter_forward(m, s, u, r, A, B, x, gpu_t(NULL, m->dtype), 0, n, sl->in, sl->out,
                                  m->lora_scale)) != ZO_OK ||
            (st = adapter_backward(m, s, u, r, A, B, expert_lora_part(m, bb->grads, j, e, MODEL_LORA_A),
                                   expert_lora_part(m, bb->grads, j, e, MODEL_LORA_B), dy, lddy, x, dx, n, sl->in,
                                   sl->out, m->lora_scale)) != ZO_OK)
            return st;
    }
    return ZO_OK;
}

/* ---- blocks ---------------------------------------------------------------------- */

/* The embeddings' factor (1: none). Gemma multiplies the embedding by
 * sqrt(hidden), the factor rounded to the model's dtype first (Hugging
 * Face's normalizer is a tensor of that dtype: bf16 rounds sqrt(3072) =
 * 55.43 to 55.5); Granite by its embedding_multiplier, a Python float (the
 * product taken in fp32, as PyTorch's tensor times a scalar). */
static float embed_scale(const tf_model *m)
{
    if (!is_gemma(m)) return m->cfg.embed_mult > 0.0f ? m->cfg.embed_mult : 1.0f;
    float v = (float)sqrt((double)m->cfg.hidden);
    uint16_t b[2];
    zo_store_f32(b, m->dtype, 0, v);
    return m->dtype == ZO_DTYPE_F32 ? v : zo_load_f32(b, m->dtype, 0);
}

static zo_status norm_forward(tf_model *m, gpu_stream_t s, gpu_tensor y, float *mean, float *rstd,
                              gpu_tensor x, gpu_tensor w, gpu_tensor b, int N);
static zo_status norm_backward(tf_model *m, gpu_stream_t s, gpu_tensor dx, gpu_tensor dy, const void *grads,
                               int block, model_role w_role, model_role b_role, gpu_tensor x, gpu_tensor w,
                               const float *mean, const float *rstd, int N);

/* Position p's row of the learned table: row p, OPT's row p + 2 (pos_offset:
 * Hugging Face's positions count from 2, the rows before are never read) */
static gpu_tensor pos_rows(const zo_model_config *c, gpu_tensor wpe)
{
    if (wpe.data) wpe.data = (char *)wpe.data + (size_t)c->pos_offset * c->hidden * zo_dtype_size(wpe.dtype);
    return wpe;
}

static zo_status embed_forward(tf_model *m, const tf_block_bufs *bb, gpu_stream_t s)
{
    const zo_model_config *c = &m->cfg;
    int N = m->b * m->t;
    const void *W = base_buf(m, bb);
    gpu_tensor res0 = gpu_t(m->res[0], m->dtype), wte = bview(m, W, 0, MODEL_ROLE_TOK_EMB);
    gpu_tensor wpe = pos_rows(c, bview(m, W, 0, MODEL_ROLE_POS_EMB));
    /* BLOOM: the embedding into the norm's saved input, normed into res[0] */
    gpu_tensor out = c->embed_norm ? gpu_t(m->emb_x, m->dtype) : res0;
    /* res[0][N, h] = wte[tokens] (+ wpe[position]): positions from 0, or in
     * generation from each sequence's (m->pos: one call for the batch),
     * within wpe's rows */
    const model_view *pv = model_layout_view(&m->layout, 0, MODEL_ROLE_POS_EMB);
    int n_pos = pv ? (int)(pv->numel / (size_t)c->hidden) : 0;
    zo_status st = m->opts.kv_len && wpe.data
                       ? gpu_embedding_forward_seq(s, out, m->tokens, wte, wpe, m->pos, n_pos, N, m->t, c->hidden,
                                                   c->vocab)
                       : gpu_embedding_forward(s, out, m->tokens, wte, wpe, N, m->t, c->hidden, c->vocab);
    if (st == ZO_OK && c->embed_norm)
        st = norm_forward(m, s, res0, m->emb_mean, m->emb_rstd, out, bview(m, W, 0, MODEL_ROLE_EMB_NORM_W),
                          bview(m, W, 0, MODEL_ROLE_EMB_NORM_B), N);
    const float es = embed_scale(m);
    return st != ZO_OK || es == 1.0f ? st : gpu_scale(s, res0, es, (size_t)N * c->hidden);
}

/* The positions a forward reaches, as Hugging Face's longrope update reads
 * them (the largest position id + 1): a training batch's length, or in
 * generation the longest sequence's last new position + 1 (the batch's
 * rule: every sequence turns by the longest one's factors). */
static int rope_seq_len(const tf_model *m)
{
    int n = 0;
    if (!m->opts.kv_len) return m->t;
    for (int j = 0; j < m->b; j++)
        if (m->hpos[j] + m->t > n) n = m->hpos[j] + m->t;
    return n;
}

/* Layer l's rotation: longrope's factors of the forward's positions
 * (rope_seq_len), as Hugging Face picks them; Gemma-3's sliding layers
 * turn with their own base (rope_local_base_freq) and no rope_scaling. */
static void rope_params(const tf_model *m, int l, const double **f, float *theta, float *scale)
{
    const zo_model_config *c = &m->cfg;
    const int lng = m->rope_freq_long && rope_seq_len(m) > c->rope_original_max;
    *f = lng ? m->rope_freq_long : m->rope_freq;
    *theta = c->rope_theta, *scale = lng ? m->rope_scale_long : m->rope_scale;
    if (c->rope_local_theta > 0.0f && zo_model_layer_sliding(c, l))
        *f = NULL, *theta = c->rope_local_theta, *scale = 1.0f;
}

/* RoPE (or its backward) on the q and k heads of n rows of x of layer l,
 * one call over every head: the first zo_model_rope_dim elements of each
 * head_dim-wide head (all of it, or with a partial rotary size,
 * Phi-4-mini's, its front), which the op pairs and turns as Hugging Face's
 * apply_rotary_pos_emb does its q_rot. Each sequence of m->t rows from
 * position 0 (training); generation's positions are rope_rows'. */
static zo_status rope_heads(tf_model *m, int l, gpu_stream_t s, gpu_tensor x, int n, int ld, int backward)
{
    const zo_model_config *c = &m->cfg;
    const int heads = c->n_heads + c->n_kv_heads, rd = zo_model_rope_dim(c);
    const double *f;
    float theta, scale;
    rope_params(m, l, &f, &theta, &scale);
    return backward ? gpu_rope_backward(s, x, n, m->t, heads, rd, ld, c->head_dim, theta, 0, f, scale)
                    : gpu_rope_forward(s, x, n, m->t, heads, rd, ld, c->head_dim, theta, 0, f, scale);
}

/* Generation's RoPE on the first `heads` heads (ldh apart) of the current
 * rows of x (row stride ld) of layer l, each sequence from its own position
 * (m->pos: the device's copy of each sequence's, within the cache's
 * kv_len), one call for the whole batch. */
static zo_status rope_gen(tf_model *m, int l, gpu_stream_t s, gpu_tensor x, int ld, int heads, int ldh)
{
    const double *f;
    float theta, scale;
    rope_params(m, l, &f, &theta, &scale);
    return gpu_rope_forward_seq(s, x, m->b * m->t, m->t, heads, zo_model_rope_dim(&m->cfg), ld, ldh, theta, m->pos,
                                m->opts.kv_len, f, scale);
}

/* RoPE on the q and k heads of the current rows of layer l: from position 0
 * of each sequence in training; in generation from each sequence's own
 * position (m->pos: the device's copy of each sequence's, one call for the
 * whole batch). Generation has no backward, so only the forward takes
 * positions. */
static zo_status rope_rows(tf_model *m, int l, gpu_stream_t s, gpu_tensor qkv, int ld)
{
    const zo_model_config *c = &m->cfg;
    if (!m->opts.kv_len) return rope_heads(m, l, s, qkv, m->b * m->t, ld, 0);
    return rope_gen(m, l, s, qkv, ld, c->n_heads + c->n_kv_heads, c->head_dim);
}

static zo_status embed_backward(tf_model *m, const tf_block_bufs *bb, gpu_stream_t s)
{
    const zo_model_config *c = &m->cfg;
    int N = m->b * m->t;
    if (has_lora(m)) return ZO_OK; /* the embedding is frozen: nothing to compute */
    /* Gemma's and Granite's factor: its gradient, in place (the embedding is the last block back) */
    const float es = embed_scale(m);
    zo_status st = es != 1.0f ? gpu_scale(s, F32(m->dres), es, (size_t)N * c->hidden) : ZO_OK;
    gpu_tensor dx = F32(m->dres);
    if (st == ZO_OK && c->embed_norm) { /* BLOOM: through the embedding norm, into dh */
        dx = F32(m->dh);
        const void *W = base_buf(m, bb);
        if ((st = gpu_memset_async(s, m->dh, 0, (size_t)N * c->hidden * 4)) == ZO_OK)
            st = norm_backward(m, s, dx, F32(m->dres), bb->grads, 0, MODEL_ROLE_EMB_NORM_W, MODEL_ROLE_EMB_NORM_B,
                               gpu_t(m->emb_x, m->dtype), bview(m, W, 0, MODEL_ROLE_EMB_NORM_W), m->emb_mean,
                               m->emb_rstd, N);
    }
    if (st != ZO_OK) return st;
    return gpu_embedding_backward(s, tf_view(m, bb->grads, 0, MODEL_ROLE_TOK_EMB),
                                  pos_rows(c, tf_view(m, bb->grads, 0, MODEL_ROLE_POS_EMB)), dx,
                                  m->tokens, N, m->t, c->hidden, c->vocab);
}

/* The weight an RMSNorm of n elements multiplies by: w, or Gemma's 1 + w
 * (fp32, in m->norm_one; the ops that read it run in stream order, so one
 * scratch serves every norm). w's gradient is the same either way: only dx
 * reads it. */
static zo_status norm_weight_n(tf_model *m, gpu_stream_t s, gpu_tensor *w, size_t n)
{
    if (!is_gemma(m)) return ZO_OK;
    gpu_tensor w1 = F32(m->norm_one + norm_width(&m->cfg));
    zo_status st = gpu_cast(s, w1, *w, n);
    if (st == ZO_OK) st = gpu_add(s, w1, w1, F32(m->norm_one), n);
    *w = w1;
    return st;
}

static zo_status norm_weight(tf_model *m, gpu_stream_t s, gpu_tensor *w)
{
    return norm_weight_n(m, s, w, (size_t)m->cfg.hidden);
}

/* LayerNorm: GPT's, and Cohere's on LLaMA layers (without a bias: b's data NULL) */
static int layer_norm(const tf_model *m) { return is_gpt(m) || m->cfg.layer_norm; }

/* Normalization of the architecture: LayerNorm (GPT, Cohere) or RMSNorm. */
static zo_status norm_forward(tf_model *m, gpu_stream_t s, gpu_tensor y, float *mean, float *rstd,
                              gpu_tensor x, gpu_tensor w, gpu_tensor b, int N)
{
    const zo_model_config *c = &m->cfg;
    if (layer_norm(m)) return gpu_layernorm_forward(s, y, mean, rstd, x, w, b, N, c->hidden, c->norm_eps);
    zo_status st = norm_weight(m, s, &w);
    return st != ZO_OK ? st : gpu_rmsnorm_forward(s, y, rstd, x, w, N, c->hidden, c->norm_eps);
}

/* The bias role of a norm that has none (Gemma-2's output norms): tf_view
 * gives no tensor for it. */
#define NO_BIAS MODEL_ROLE_COUNT

/* dx += d(norm input), given dy = d(norm output): the pre-norms' dres += from
 * dh, or Gemma-2's output norms' dh (zeroed first) from dres. dw, db: the
 * norm's gradients in `grads` (role w_role, b_role); with LoRA the norm is
 * frozen and they are not computed. */
static zo_status norm_backward(tf_model *m, gpu_stream_t s, gpu_tensor dx, gpu_tensor dy, const void *grads,
                               int block, model_role w_role, model_role b_role, gpu_tensor x, gpu_tensor w,
                               const float *mean, const float *rstd, int N)
{
    const zo_model_config *c = &m->cfg;
    gpu_tensor dw = tf_view(m, grads, block, w_role), db = tf_view(m, grads, block, b_role);
    if (has_lora(m)) dw = db = gpu_t(NULL, ZO_DTYPE_F32);
    if (layer_norm(m)) return gpu_layernorm_backward(s, dx, dw, db, dy, x, w, mean, rstd, N, c->hidden);
    zo_status st = norm_weight(m, s, &w);
    return st != ZO_OK ? st : gpu_rmsnorm_backward(s, dx, dw, dy, x, w, rstd, N, c->hidden);
}


/* The q/k norms' runs: q's heads, then k's, each run of its d elements
 * normalised apart (Qwen3's, Cohere's: a run a head); OLMo-2's
 * whole-projection norms (qk_norm_full) one run each, q's width and k's */
typedef struct qk_norm_shape {
    int qh, kh; /* q's runs, k's */
    int dq, dk; /* their lengths */
} qk_norm_shape;

static qk_norm_shape qk_norm_shape_of(const zo_model_config *c)
{
    if (c->qk_norm_full) return (qk_norm_shape){1, 1, q_width(c), c->n_kv_heads * c->head_dim};
    return (qk_norm_shape){c->n_heads, c->n_kv_heads, c->head_dim, c->head_dim};
}

/* k's part of the q/k norms' saved inputs and 1/rms (after q's N x q width
 * and N x qh): NULL where nothing is kept (generation) */
static void qk_norm_k_saved(const tf_model *m, const tf_layer_acts *a, gpu_tensor *sk, float **rk)
{
    const size_t N = (size_t)m->b * m->t, es = zo_dtype_size(m->dtype), qw = (size_t)q_width(&m->cfg);
    *sk = gpu_t(a->qkn ? (char *)a->qkn + N * qw * es : NULL, m->dtype);
    *rk = a->qk_rstd ? a->qk_rstd + N * (size_t)qk_norm_shape_of(&m->cfg).qh : NULL;
}

/* The q/k norms' kind: Cohere's (use_qk_norm) are LayerNorms without a
 * bias with a weight row per head, Qwen3's and Gemma-3's RMSNorms with one
 * weight, OLMo-2's RMSNorms with one weight as wide as q or k */
static int64_t qk_norm_w_stride(const zo_model_config *c) { return c->qk_norm_heads ? c->head_dim : 0; }
static int qk_norm_centered(const zo_model_config *c) { return c->layer_norm; }

/* The q and k norms, in place on qkv's rows (row stride qkv_width): each
 * query run by q_norm, each key run by k_norm (qk_norm_shape_of), before
 * RoPE. Training keeps their inputs (less their means when centered) and
 * 1/rms (a->qkn, a->qk_rstd) for the backward; generation keeps neither
 * (its acts have none). */
static zo_status qk_norm_forward(tf_model *m, gpu_stream_t s, const tf_layer_acts *a, const void *W, int blk,
                                 gpu_tensor qkv)
{
    const zo_model_config *c = &m->cfg;
    if (!c->qk_norm) return ZO_OK;
    const size_t N = (size_t)m->b * m->t, es = zo_dtype_size(m->dtype), qw = (size_t)q_width(c);
    const int ld = qkv_width(c);
    const qk_norm_shape sh = qk_norm_shape_of(c);
    gpu_tensor k = gpu_t((char *)qkv.data + qw * es, m->dtype), sk;
    float *rk;
    qk_norm_k_saved(m, a, &sk, &rk);
    /* Gemma-3's multiply by 1 + w */
    gpu_tensor wq = bview(m, W, blk, MODEL_ROLE_Q_NORM_W), wk = bview(m, W, blk, MODEL_ROLE_K_NORM_W);
    const int64_t ws = qk_norm_w_stride(c);
    const int ctr = qk_norm_centered(c);
    zo_status st = norm_weight_n(m, s, &wq, (size_t)sh.dq);
    if (st == ZO_OK)
        st = gpu_head_norm_forward(s, qkv, ld, gpu_t(a->qkn, m->dtype), a->qk_rstd, wq, ws, (int)N, sh.qh, sh.dq,
                                   c->norm_eps, ctr);
    if (st == ZO_OK) st = norm_weight_n(m, s, &wk, (size_t)sh.dk);
    return st != ZO_OK ? st
                       : gpu_head_norm_forward(s, k, ld, sk, rk, wk, ws, (int)N, sh.kh, sh.dk, c->norm_eps, ctr);
}

/* Their backward, in place on dqkv's q and k runs (the gradient of the
 * norms' outputs in, of their inputs out); the weights' gradients into
 * `grads`, none with LoRA (frozen norms). */
static zo_status qk_norm_backward(tf_model *m, gpu_stream_t s, const tf_layer_acts *a, const void *W,
                                  const void *grads, int blk)
{
    const zo_model_config *c = &m->cfg;
    if (!c->qk_norm) return ZO_OK;
    const size_t N = (size_t)m->b * m->t, qw = (size_t)q_width(c);
    const int ld = qkv_width(c);
    const qk_norm_shape sh = qk_norm_shape_of(c);
    gpu_tensor dq = F32(m->dqkv), dk = F32(m->dqkv + qw), sk;
    gpu_tensor dwq = tf_view(m, grads, blk, MODEL_ROLE_Q_NORM_W), dwk = tf_view(m, grads, blk, MODEL_ROLE_K_NORM_W);
    if (has_lora(m)) dwq = dwk = gpu_t(NULL, ZO_DTYPE_F32);
    float *rk;
    qk_norm_k_saved(m, a, &sk, &rk);
    gpu_tensor wq = bview(m, W, blk, MODEL_ROLE_Q_NORM_W), wk = bview(m, W, blk, MODEL_ROLE_K_NORM_W);
    const int64_t ws = qk_norm_w_stride(c);
    const int ctr = qk_norm_centered(c);
    zo_status st = norm_weight_n(m, s, &wq, (size_t)sh.dq);
    if (st == ZO_OK)
        st = gpu_head_norm_backward(s, dq, ld, dwq, gpu_t(a->qkn, m->dtype), wq, ws, a->qk_rstd, (int)N, sh.qh,
                                    sh.dq, ctr);
    if (st == ZO_OK) st = norm_weight_n(m, s, &wk, (size_t)sh.dk);
    return st != ZO_OK ? st
                       : gpu_head_norm_backward(s, dk, ld, dwk, sk, wk, ws, rk, (int)N, sh.kh, sh.dk, ctr);
}

/* ---- mixture of experts ----------------------------------------------------------------
 * The MLP of an MoE layer, as Hugging Face's MixtralSparseMoeBlock and
 * Qwen2MoeSparseMoeBlock compute it: the router's logits [N, E] = ln2 Wr^T,
 * p = softmax over the E experts, the top_k of p weighted by p (divided by
 * their sum with norm_topk), the output the weighted sum of the chosen
 * experts' SwiGLU MLPs, plus with Qwen2-MoE sigmoid(ln2 . w_sg) times the
 * shared expert's MLP. Each expert runs on the tokens that chose it only:
 * the router's weights are read back to the host (the one wait of the
 * layer), which lists the (token, expert) pairs expert by expert; the pairs'
 * inputs are gathered, each expert's GEMMs run on its rows, and its
 * weighted outputs are added back to their tokens, expert after expert. */

/* Expert e's tensor of an EXPERT_* role (a trained buffer's: the
 * parameters or, without LoRA, the gradients); data NULL when buf is. */
static gpu_tensor expert_view(const tf_model *m, const void *buf, int blk, model_role role, int e)
{
    gpu_tensor t = tf_view(m, buf, blk, role);
    if (t.data)
        t.data = (char *)t.data + (size_t)e * model_layout_expert_stride(&m->layout) * zo_dtype_size(m->dtype);
    return t;
}

/* Expert e's base weight of an EXPERT_* role: a view of the parameters, or
 * with LoRA of the frozen buffer (NF4: dequantized into m->wdq, in stream
 * order; the next base weight reuses it). */
static zo_status base_expert_weight(tf_model *m, gpu_stream_t s, const tf_block_bufs *bb, int blk,
                                    model_role role, int e, gpu_tensor *w)
{
    if (!has_lora(m)) {
        *w = expert_view(m, bb->params, blk, role, e);
        return ZO_OK;
    }
    const model_view *v = model_layout_view(&m->layout, blk, role);
    size_t at = v->offset + (size_t)e * model_layout_expert_stride(&m->layout);
    int i = tensor_at(&m->layout, blk, at);
    const model_tensor *t = &m->layout.tensors[i];
    /* (gpt-oss's gate and up, weights and biases: row ranges of one tensor) */
    const size_t rel = (at - t->offset) * zo_dtype_size(m->dtype);
    const char *p = (const char *)bb->frozen + m->frozen_off[i];
    if (!frozen_is_nf4(m, t)) {
        *w = gpu_t((void *)(p + rel), m->dtype);
        return ZO_OK;
    }
    return wdq_range(m, s, p, t->numel, blk, rel, w);
}

/* A layer's weight gradient of `role` (expert e's for EXPERT_* roles, e
 * otherwise ignored); data NULL with LoRA, whose base is frozen. */
/* A visit to routed expert e begins: where its weights are when the
 * runtime streams them apart (bb->expert), else NULL. */
static zo_status expert_begin(const tf_block_bufs *bb, int e, gpu_stream_t s, const void **ew)
{
    *ew = NULL;
    return bb->expert ? bb->expert(bb->expert_ctx, e, s, ew) : ZO_OK;
}

/* Expert e's base weight of an EXPERT_* role: in its own buffer `ew` (from
 * expert_begin), or as base_expert_weight finds it. */
static zo_status expert_weight(tf_model *m, gpu_stream_t s, const tf_block_bufs *bb, int blk, model_role role,
                               int e, const void *ew, gpu_tensor *w)
{
    if (!ew) return base_expert_weight(m, s, bb, blk, role, e, w);
    size_t rel = model_layout_view(&m->layout, blk, role)->offset -
                 model_layout_view(&m->layout, blk, MODEL_ROLE_EXPERT_GATE_W)->offset;
    *w = gpu_t((char *)ew + rel * zo_dtype_size(m->dtype), m->dtype);
    return ZO_OK;
}

/* A role repeated per routed expert (gpt-oss's fused gate_up and the biases too) */
static int is_expert_role(model_role role)
{
    return (role >= MODEL_ROLE_EXPERT_GATE_W && role <= MODEL_ROLE_EXPERT_DOWN_W) ||
           (role >= MODEL_ROLE_EXPERT_GATE_UP_W && role <= MODEL_ROLE_EXPERT_DOWN_B);
}

static gpu_tensor base_grad(const tf_model *m, const tf_block_bufs *bb, int blk, model_role role, int e)
{
    const void *G = has_lora(m) ? NULL : bb->grads;
    return is_expert_role(role) ? expert_view(m, G, blk, role, e) : tf_view(m, G, blk, role);
}

/* Rows from `row` of a [rows, cols] tensor. */
static gpu_tensor rows_at(gpu_tensor t, int row, int cols)
{
    t.data = (char *)t.data + (size_t)row * cols * zo_dtype_size(t.dtype);
    return t;
}

/* y[N, out] (+)= x[N, in] W^T: beta 0 or 1 */
static zo_status gemm_xwt(gpu_stream_t s, gpu_tensor y, gpu_tensor x, gpu_tensor w, int N, int out,
                          int in, float beta)
{
    gpu_gemm_desc g = {.trans_b = 1, .m = N, .n = out, .k = in, .alpha = 1.0f, .beta = beta,
                       .a = x, .b = w, .c = y, .lda = in, .ldb = in, .ldc = out};
    return gpu_gemm(s, &g);
}

/* y (+)= x W^T with the layer's base weight of `role` (beta 0 or 1) */
static zo_status base_xwt(tf_model *m, gpu_stream_t s, const tf_block_bufs *bb, int blk, model_role role,
                          gpu_tensor y, gpu_tensor x, int N, int out, int in, float beta)
{
    zo_status st;
    gpu_tensor w;
    if ((st = base_weight(m, s, base_buf(m, bb), blk, role, &w)) != ZO_OK) return st;
    return gemm_xwt(s, y, x, w, N, out, in, beta);
}

/* dx[n, in] (+)= alpha dy[n, out] W (W [out, in]) and dW += alpha dy^T x:
 * beta for dx; alpha the forward's (Granite-MoE's residual_multiplier on
 * the experts' down projection), else 1 */
static zo_status gemm_back(gpu_stream_t s, gpu_tensor dx, float beta, gpu_tensor dw, gpu_tensor dy,
                           gpu_tensor x, gpu_tensor w, int n, int out, int in, float alpha)
{
    zo_status st;
    gpu_gemm_desc gw = {.trans_a = 1, .m = out, .n = in, .k = n, .alpha = alpha, .beta = 1.0f,
                        .a = dy, .b = x, .c = dw, .lda = out, .ldb = in, .ldc = in};
    if (dw.data && (st = gpu_gemm(s, &gw)) != ZO_OK) return st;
    if (!dx.data) return ZO_OK;
    gpu_gemm_desc gx = {.m = n, .n = in, .k = out, .alpha = alpha, .beta = beta, .a = dy, .b = w,
                        .c = dx, .lda = out, .ldb = in, .ldc = in};
    return gpu_gemm(s, &gx);
}

/* Capacity-limited routing: each expert's pairs of each choice rank into
 * moe_quota_h [E, K], from the router's choice order (moe_rank_h [N, E],
 * the place the router chose each expert in: gpu_moe_router_forward).
 * A pair whose weight underflowed to 0 routes nothing and is not counted. */
static zo_status moe_choice_ranks(tf_model *m, int l, int N)
{
    const int E = m->cfg.moe.experts, K = m->cfg.moe.top_k;
    memset(m->moe_quota_h, 0, (size_t)E * K * sizeof *m->moe_quota_h);
    for (int r = 0; r < N; r++) {
        const float *w = m->moe_w_h + (size_t)r * E;
        const uint8_t *rank = m->moe_rank_h + (size_t)r * E;
        for (int e = 0; e < E; e++) {
            if (rank[e] == GPU_MOE_NOT_CHOSEN ? w[e] != 0.0f : rank[e] >= K)
                return zo_error(ZO_ERR_INTERNAL, "transformer: layer %d: token %d's expert %d: weight %g at "
                                "choice %d of %d", l, r, e, (double)w[e], rank[e], K);
            if (w[e] != 0.0f) m->moe_quota_h[(size_t)e * K + rank[e]]++;
        }
    }
    return ZO_OK;
}

/* Route layer l's tokens: wait for the router's weights, list the pairs
 * expert by expert (tokens in order) with their weights, and upload them.
 * With a capacity factor C an expert keeps its C first pairs by priority,
 * choice rank then token (tf_options.capacity_factor): the ranks below
 * `cut` whole, `room` pairs of rank cut in token order. `count`: add the
 * pairs chosen and dropped to moe_pairs, moe_dropped (not a recompute). */
static zo_status moe_route(tf_model *m, int l, gpu_stream_t s, int count)
{
    zo_status st;
    const int N = m->b * m->t, E = m->cfg.moe.experts, K = m->cfg.moe.top_k;
    const double F = m->opts.capacity_factor;
    tf_layer_acts *a = &m->acts[l];
    /* (C >= N: an expert takes a token once, so nothing can drop) */
    const int cap = (int)zo_moe_capacity(&m->cfg, F, (uint64_t)N), limit = F > 0 && cap < N;
    /* the weights; the choice order too when a capacity ranks the choices */
    if ((st = gpu_memcpy_async(s, m->moe_w_h, a->router_w, (size_t)N * E * 4, GPU_COPY_DEVICE_TO_HOST)) !=
            ZO_OK ||
        (limit &&
         (st = gpu_memcpy_async(s, m->moe_rank_h, m->moe_order, (size_t)N * E, GPU_COPY_DEVICE_TO_HOST)) != ZO_OK) ||
        (st = gpu_stream_synchronize(s)) != ZO_OK) /* also: the last uploads from the host lists ran */
        return st;
    if (limit && (st = moe_choice_ranks(m, l, N)) != ZO_OK) return st;
    int n = 0, chosen = 0;
    a->moe_off[0] = 0;
    for (int e = 0; e < E; e++) {
        int cut = K, room = 0;
        if (limit) {
            const int *quota = m->moe_quota_h + (size_t)e * K;
            int left = cap;
            for (cut = 0; cut < K && quota[cut] <= left; cut++) left -= quota[cut];
            room = left;
        }
        for (int r = 0; r < N; r++) {
            float w = m->moe_w_h[(size_t)r * E + e];
            if (w == 0.0f) continue; /* not chosen (or a weight that underflowed: adds nothing) */
            chosen++;
            if (limit) {
                int rank = m->moe_rank_h[(size_t)r * E + e];
                if (rank > cut || (rank == cut && room-- <= 0)) continue; /* over the capacity: dropped */
            }
            if (n == N * K) /* (a capacity that drops: moe_choice_ranks counted the chosen first) */
                return zo_error(ZO_ERR_INTERNAL, "transformer: layer %d: the router chose more than %d experts "
                                "per token", l, m->cfg.moe.top_k);
            a->moe_idx_h[n] = r;
            a->moe_wp_h[n++] = w;
        }
        a->moe_off[e + 1] = n;
    }
    if (count) {
        m->moe_pairs += (uint64_t)chosen;
        m->moe_dropped += (uint64_t)(chosen - n);
    }
    if (!n) return ZO_OK;
    if ((st = gpu_memcpy_async(s, a->moe_idx, a->moe_idx_h, (size_t)n * 4, GPU_COPY_HOST_TO_DEVICE)) != ZO_OK)
        return st;
    return gpu_memcpy_async(s, a->moe_wp, a->moe_wp_h, (size_t)n * 4, GPU_COPY_HOST_TO_DEVICE);
}

/* ---- expert parallelism ----------------------------------------------------------------
 * With a group of P ranks (tf_options.ep) rank q holds local experts
 * 0..El-1, the global experts q El .. q El + El - 1 (the layout's window).
 * moe_route lists a rank's pairs expert by expert, so the pairs for rank
 * q's experts are the contiguous rows moe_off[q El] .. moe_off[(q+1) El].
 * Forward: the counts per (rank, local expert) go out by comm_all_to_all,
 * then the pairs' inputs (model dtype) and their weights (fp32) by
 * comm_all_to_all_v; the owner keeps them grouped by local expert (ep_x,
 * ep_wp: per source rank in rank order within an expert), runs its experts
 * on them and sends each pair's weighted output back; the sender adds them
 * to its tokens as without the group. Backward mirrors it in fp32: each
 * pair's output gradient to the owner, which accumulates its experts'
 * weight gradients, and the pairs' input gradients and weight gradients
 * back. A recompute (its forward stops before the down projection) sends
 * the counts, inputs and weights again, not the outputs. Every rank of the
 * group runs every exchange, also one with nothing to send. */

/* Rows of the arrival order that rank p sent (the owner's side). */
static int ep_rows_from(const tf_model *m, const tf_layer_acts *a, int p)
{
    int El = m->layout.expert_count, n = 0;
    for (int j = 0; j < El; j++) n += a->ep_cnt[(size_t)p * El + j];
    return n;
}

/* One all-to-all of rows of `cols` elements of `dt` over the group, the
 * sender's pairs to their owners (back = 0: rank q gets the pairs of its
 * experts) or the owners' rows back to their senders (back = 1), after the
 * work enqueued on s; blocking. Counts the pairs crossing between ranks
 * under `pass` (TF_EP_*; -1: not, counted once a pass). */
static zo_status ep_exchange(tf_model *m, int l, gpu_stream_t s, const void *send, void *recv, int cols,
                             zo_dtype dt, int back, int pass)
{
    const int P = m->ep_size, El = m->layout.expert_count;
    const tf_layer_acts *a = &m->acts[l];
    size_t *sc = m->ep_counts, *rc = m->ep_counts + P;
    for (int q = 0; q < P; q++) {
        size_t mine = (size_t)(a->moe_off[(q + 1) * El] - a->moe_off[q * El]), theirs = (size_t)ep_rows_from(m, a, q);
        sc[q] = (back ? theirs : mine) * (size_t)cols;
        rc[q] = (back ? mine : theirs) * (size_t)cols;
        if (pass >= 0 && q != m->ep_rank) {
            m->ep_pairs[pass][0] += mine;
            m->ep_pairs[pass][1] += theirs;
        }
    }
    if (pass >= 0) m->ep_layers[pass]++;
    zo_status st;
    comm_request_t req;
    if ((st = gpu_stream_synchronize(s)) != ZO_OK ||
        (st = comm_all_to_all_v(m->opts.ep, send, sc, recv, rc, dt, NULL, &req)) != ZO_OK)
        return st;
    return comm_wait(req);
}

/* The forward's exchange of layer l: the counts, then the pairs' inputs xg
 * [M, h] and weights to their owners, kept grouped by local expert (ep_x,
 * ep_wp, ep_off). */
static zo_status ep_dispatch(tf_model *m, int l, gpu_stream_t s, gpu_tensor xg, int recompute)
{
    zo_status st;
    const int P = m->ep_size, El = m->layout.expert_count, h = m->cfg.hidden;
    tf_layer_acts *a = &m->acts[l];
    int32_t *sent = m->ep_cnt_h, *got = m->ep_cnt_h + (size_t)P * El;
    for (int k = 0; k < P * El; k++) sent[k] = a->moe_off[k + 1] - a->moe_off[k];
    /* the counts: El int32 to each rank (moved as fp32 words, never summed) */
    comm_request_t req;
    if ((st = gpu_memcpy_async(s, m->ep_cnt_d, sent, (size_t)P * El * 4, GPU_COPY_HOST_TO_DEVICE)) != ZO_OK ||
        (st = gpu_stream_synchronize(s)) != ZO_OK ||
        (st = comm_all_to_all(m->opts.ep, m->ep_cnt_d, m->ep_cnt_d + (size_t)P * El, (size_t)El, ZO_DTYPE_F32,
                              NULL, &req)) != ZO_OK ||
        (st = comm_wait(req)) != ZO_OK ||
        (st = gpu_memcpy_async(s, got, m->ep_cnt_d + (size_t)P * El, (size_t)P * El * 4,
                               GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
        (st = gpu_stream_synchronize(s)) != ZO_OK)
        return st;
    /* the arrival order is by source rank, then local expert; the grouped
     * order by local expert, then source rank */
    size_t R = 0;
    for (int k = 0; k < P * El; k++) {
        if (got[k] < 0 || (size_t)got[k] > m->ep_rows - R)
            return zo_error(ZO_ERR_INTERNAL, "transformer: layer %d: expert parallel rank %d announced %d rows "
                            "for local expert %d (at most %zu a layer in all)", l, k / El, got[k], k % El,
                            m->ep_rows);
        a->ep_cnt[k] = got[k];
        R += (size_t)got[k];
    }
    int32_t *to_arrival = a->ep_idx_h, *to_grouped = a->ep_idx_h + R;
    int g = 0;
    a->ep_off[0] = 0;
    for (int j = 0; j < El; j++) {
        for (int p = 0; p < P; p++) {
            int at = 0; /* rank p's rows for local expert j start here in the arrival order */
            for (int q = 0; q < p; q++) at += ep_rows_from(m, a, q);
            for (int i = 0; i < j; i++) at += a->ep_cnt[(size_t)p * El + i];
            for (int i = 0; i < a->ep_cnt[(size_t)p * El + j]; i++, g++) {
                to_arrival[g] = at + i;
                to_grouped[at + i] = g;
            }
        }
        a->ep_off[j + 1] = g;
    }
    gpu_tensor rows = gpu_t(m->ep_buf[0], m->dtype);
    if ((R && (st = gpu_memcpy_async(s, a->ep_idx, a->ep_idx_h, 2 * R * 4, GPU_COPY_HOST_TO_DEVICE)) != ZO_OK) ||
        (st = ep_exchange(m, l, s, xg.data, rows.data, h, m->dtype, 0,
                          recompute ? TF_EP_RECOMPUTE : TF_EP_FORWARD)) != ZO_OK ||
        (st = ep_exchange(m, l, s, a->moe_wp, m->ep_w[0], 1, ZO_DTYPE_F32, 0, -1)) != ZO_OK || !R)
        return st;
    if ((st = gpu_moe_gather(s, gpu_t(a->ep_x, m->dtype), rows, a->ep_idx, (int)R, h)) != ZO_OK) return st;
    return gpu_moe_gather(s, F32(a->ep_wp), F32(m->ep_w[0]), a->ep_idx, (int)R, 1);
}

/* Rows [R, cols] of `dt` grouped by local expert (`grouped`) back to their
 * arrival order in `arrival`, then to the ranks that sent them, into
 * `recv` (the sender's pair order). */
static zo_status ep_return(tf_model *m, int l, gpu_stream_t s, gpu_tensor grouped, void *arrival, void *recv,
                           int cols)
{
    zo_status st;
    tf_layer_acts *a = &m->acts[l];
    int R = a->ep_off[m->layout.expert_count];
    gpu_tensor arr = gpu_t(arrival, grouped.dtype);
    if (R && (st = gpu_moe_gather(s, arr, grouped, a->ep_idx + R, R, cols)) != ZO_OK) return st;
    return ep_exchange(m, l, s, arrival, recv, cols, grouped.dtype, 1, -1);
}

/* How layer l's router chooses and weighs: Phi-3.5-MoE's sparsemixer (eval
 * form); the softmax's p, renormalized over the chosen with norm_topk; or
 * DeepSeek-V3's sigmoid s (renormalized likewise), chosen by s plus the
 * layer's score correction. DeepSeek-V2's group_limited_greedy and V3 keep
 * the best topk_group of n_group groups; routed_scaling_factor multiplies
 * the weights, V3's after the normalization, DeepSeek(-V2)'s only where it
 * does not normalize: its MoEGate (trust_remote_code's) either divides by
 * the sum or scales, never both. */
static gpu_moe_gate router_gate(const tf_model *m, int l)
{
    const zo_model_config *c = &m->cfg;
    const zo_moe *mo = &c->moe;
    gpu_moe_route mode = mo->sparsemixer ? GPU_MOE_ROUTE_SPARSEMIXER
                         : c->moe_sigmoid ? (mo->norm_topk ? GPU_MOE_ROUTE_SIGMOID_NORM : GPU_MOE_ROUTE_SIGMOID)
                         : mo->norm_topk ? GPU_MOE_ROUTE_NORM
                                         : GPU_MOE_ROUTE_SOFTMAX;
    return (gpu_moe_gate){.mode = mode,
                          .eps = mo->jitter_eps,
                          .groups = c->moe_groups,
                          .topk_groups = c->moe_topk_groups,
                          .scale = !c->moe_sigmoid && mo->norm_topk ? 0.0f : c->moe_routed_scale,
                          .bias = m->router_bias ? m->router_bias + (size_t)l * mo->experts : NULL};
}

/* gpt-oss: expert e's gate and up biases added to its n rows' fc, up [n, fe]. */
static zo_status expert_biases_forward(tf_model *m, gpu_stream_t s, const tf_block_bufs *bb, int blk, int e,
                                       const void *ew, gpu_tensor fc, gpu_tensor up, int n)
{
    if (!m->cfg.moe.expert_bias) return ZO_OK;
    const int fe = m->cfg.moe.expert_ffn;
    zo_status st;
    gpu_tensor b;
    if ((st = expert_weight(m, s, bb, blk, MODEL_ROLE_EXPERT_GATE_B, e, ew, &b)) != ZO_OK ||
        (st = gpu_bias_forward(s, fc, b, n, fe, fe)) != ZO_OK ||
        (st = expert_weight(m, s, bb, blk, MODEL_ROLE_EXPERT_UP_B, e, ew, &b)) != ZO_OK)
        return st;
    return gpu_bias_forward(s, up, b, n, fe, fe);
}

/* The experts' GLU: SwiGLU, or gpt-oss's clamped one (moe.glu_limit > 0). */
static zo_status expert_glu_forward(const tf_model *m, gpu_stream_t s, gpu_tensor act, gpu_tensor fc, gpu_tensor up,
                                    size_t n)
{
    const zo_moe *mo = &m->cfg.moe;
    return mo->glu_limit > 0.0f ? gpu_swiglu_clamped_forward(s, act, fc, up, n, mo->glu_limit, mo->glu_alpha)
                                : gpu_swiglu_forward(s, act, fc, up, n, 0);
}

static zo_status expert_glu_backward(const tf_model *m, gpu_stream_t s, gpu_tensor dfc, gpu_tensor dup,
                                     gpu_tensor dy, gpu_tensor fc, gpu_tensor up, size_t n)
{
    const zo_moe *mo = &m->cfg.moe;
    return mo->glu_limit > 0.0f
               ? gpu_swiglu_clamped_backward(s, dfc, dup, dy, fc, up, n, mo->glu_limit, mo->glu_alpha)
               : gpu_swiglu_backward(s, dfc, dup, dy, fc, up, n, 0);
}

/* The MoE MLP of layer l: tmp [N, h] = its output. With `recompute`, stop
 * once the activations backward reads are saved. A routed expert's
 * adapters add to its GEMMs on its pairs; the shared expert's as a dense
 * MLP's. */
static zo_status moe_forward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s, int recompute)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    const zo_moe *mo = &c->moe;
    const int blk = model_layout_layer_block(l), N = m->b * m->t, h = c->hidden, E = mo->experts;
    const int fe = mo->expert_ffn, fs = mo->shared_ffn, ep = m->ep_size > 1;
    const zo_dtype dt = m->dtype;
    tf_layer_acts *a = &m->acts[l];
    gpu_tensor ln2 = gpu_t(a->ln2, dt), tmp = gpu_t(m->tmp, dt), sact = gpu_t(m->sact, dt), w;
    gpu_tensor xg = gpu_t(m->moe_x, dt), yg = gpu_t(m->moe_y, dt);
    gpu_tensor fc = gpu_t(a->efc, dt), up = gpu_t(a->eup, dt), act = gpu_t(a->eact, dt);

    /* router: logits [N, E] (fp32), the chosen experts' weights, the
     * statistics of layer l (DeepSeek's per sequence: each sequence's t rows apart) */
    const size_t S = stat_rows(m);
    const gpu_moe_gate gate = router_gate(m, l);
    if ((st = base_xwt(m, s, bb, blk, MODEL_ROLE_ROUTER_W, F32(a->router_logits), ln2, N, E, h, 0.0f)) != ZO_OK ||
        (mo->router_logit_bias && (st = gpu_bias_forward(s, F32(a->router_logits),
                                                         bview(m, base_buf(m, bb), blk, MODEL_ROLE_ROUTER_B), N, E,
                                                         E)) != ZO_OK) ||
        (st = gpu_moe_router_forward(s, F32(a->router_w), F32(a->router_logits), m->moe_stats + (size_t)l * S * 2 * E,
                                     m->moe_order, N, E, mo->top_k, &gate,
                                     S > 1 ? m->t : N)) != ZO_OK)
        return st;
    if ((st = moe_route(m, l, s, !recompute)) != ZO_OK) return st;
    const int *off = a->moe_off, M = off[E];
    /* the pairs' inputs xg [M, h]; the experts here take theirs (with
     * expert parallelism the rows every rank sent them, ep_x) */
    if (M && (st = gpu_moe_gather(s, xg, ln2, a->moe_idx, M, h)) != ZO_OK) return st;
    if (ep && (st = ep_dispatch(m, l, s, xg, recompute)) != ZO_OK) return st;
    const int El = m->layout.expert_count, *eoff = ep ? a->ep_off : off;
    const float *wp = ep ? a->ep_wp : a->moe_wp;
    gpu_tensor ex = ep ? gpu_t(a->ep_x, dt) : xg, ey = ep ? gpu_t(m->ep_buf[1], dt) : yg;
    if (!recompute && (st = gpu_memset_async(s, m->tmp, 0, (size_t)N * h * zo_dtype_size(dt))) != ZO_OK) return st;
    /* the experts on their rows, one expert at a time (its weights may be
     * streamed apart: one visit each): fc, up, act [rows, fe], then each
     * row's weighted output ey [rows, h], times Granite-MoE's
     * residual_multiplier (the down GEMM's alpha: the experts end the
     * branch; it has no shared expert and no expert adapters) */
    const float ralpha = branch_alpha(m, MODEL_ROLE_MLP_DOWN_W);
    for (int e = 0; e < El; e++) {
        int n = eoff[e + 1] - eoff[e];
        if (!n) continue;
        gpu_tensor x = rows_at(ex, eoff[e], h), fce = rows_at(fc, eoff[e], fe), upe = rows_at(up, eoff[e], fe);
        gpu_tensor acte = rows_at(act, eoff[e], fe), y = rows_at(ey, eoff[e], h), sx = rows_at(sact, eoff[e], fe);
        const void *ew;
        if ((st = expert_begin(bb, e, s, &ew)) != ZO_OK ||
            (st = expert_weight(m, s, bb, blk, MODEL_ROLE_EXPERT_GATE_W, e, ew, &w)) != ZO_OK ||
            (st = gemm_xwt(s, fce, x, w, n, fe, h, 0.0f)) != ZO_OK ||
            (st = expert_lora_forward(m, s, bb, TF_LORA_EXPERT_GATE, e, x, fce, fe, n)) != ZO_OK ||
            (st = expert_weight(m, s, bb, blk, MODEL_ROLE_EXPERT_UP_W, e, ew, &w)) != ZO_OK ||
            (st = gemm_xwt(s, upe, x, w, n, fe, h, 0.0f)) != ZO_OK ||
            (st = expert_lora_forward(m, s, bb, TF_LORA_EXPERT_UP, e, x, upe, fe, n)) != ZO_OK ||
            (st = expert_biases_forward(m, s, bb, blk, e, ew, fce, upe, n)) != ZO_OK ||
            (st = expert_glu_forward(m, s, acte, fce, upe, (size_t)n * fe)) != ZO_OK)
            return st;
        if (recompute) continue;
        if (mo->expert_bias) { /* gpt-oss: y = w (act Wdown^T + b_down) */
            if ((st = expert_weight(m, s, bb, blk, MODEL_ROLE_EXPERT_DOWN_W, e, ew, &w)) != ZO_OK ||
                (st = gemm_xwt(s, y, acte, w, n, h, fe, 0.0f)) != ZO_OK ||
                (st = expert_weight(m, s, bb, blk, MODEL_ROLE_EXPERT_DOWN_B, e, ew, &w)) != ZO_OK ||
                (st = gpu_bias_forward(s, y, w, n, h, h)) != ZO_OK ||
                (st = gpu_moe_scale_forward(s, y, y, wp + eoff[e], n, h, 1, 0)) != ZO_OK)
                return st;
            continue;
        }
        if ((st = gpu_moe_scale_forward(s, sx, acte, wp + eoff[e], n, fe, 1, 0)) != ZO_OK ||
            (st = expert_weight(m, s, bb, blk, MODEL_ROLE_EXPERT_DOWN_W, e, ew, &w)) != ZO_OK ||
            (st = gpu_gemm(s, &(gpu_gemm_desc){.trans_b = 1, .m = n, .n = h, .k = fe, .alpha = ralpha, .a = sx,
                                                .b = w, .c = y, .lda = fe, .ldb = fe, .ldc = h})) != ZO_OK ||
            (st = expert_lora_forward(m, s, bb, TF_LORA_EXPERT_DOWN, e, sx, y, h, n)) != ZO_OK)
            return st;
    }
    if (!recompute) {
        /* the outputs back to their senders (yg [M, h], the pairs' order),
         * then tmp = their sum at their tokens, expert after expert */
        if (ep && (st = ep_return(m, l, s, ey, m->ep_buf[0], yg.data, h)) != ZO_OK) return st;
        for (int e = 0; e < E; e++) {
            int n = off[e + 1] - off[e];
            if (n && (st = gpu_moe_scatter_add(s, tmp, rows_at(yg, off[e], h), a->moe_idx + off[e], n, h, h)) !=
                         ZO_OK)
                return st;
        }
    }
    if (!fs) return ZO_OK;
    /* the shared expert: fc = ln2 Wg^T, up = ln2 Wu^T (and their adapters),
     * act = silu(fc) up [N, fs], then tmp += (sigmoid(ln2 w_sg) * act) Wdown^T
     * (Qwen2-MoE's gate), or tmp += act Wdown^T (DeepSeek's, ungated) */
    const int gated = mo->shared_gate;
    gpu_tensor sa = gpu_t(a->act, dt), sfc = gpu_t(a->fc, dt), sup = gpu_t(a->up, dt);
    if ((st = base_xwt(m, s, bb, blk, MODEL_ROLE_MLP_GATE_W, sfc, ln2, N, fs, h, 0.0f)) != ZO_OK ||
        (st = lora_forward(m, s, l, bb, TF_LORA_GATE, ln2, sfc, fs)) != ZO_OK ||
        (st = base_xwt(m, s, bb, blk, MODEL_ROLE_MLP_UP_W, sup, ln2, N, fs, h, 0.0f)) != ZO_OK ||
        (st = lora_forward(m, s, l, bb, TF_LORA_UP, ln2, sup, fs)) != ZO_OK ||
        (st = gpu_swiglu_forward(s, sa, sfc, sup, (size_t)N * fs, 0)) != ZO_OK ||
        (gated &&
         (st = base_xwt(m, s, bb, blk, MODEL_ROLE_SHARED_GATE_W, F32(a->sgate), ln2, N, 1, h, 0.0f)) != ZO_OK))
        return st;
    if (recompute) return ZO_OK;
    gpu_tensor down_in = gated ? sact : sa;
    if ((gated && (st = gpu_moe_scale_forward(s, sact, sa, a->sgate, N, fs, 1, 1)) != ZO_OK) ||
        (st = base_xwt(m, s, bb, blk, MODEL_ROLE_MLP_DOWN_W, tmp, down_in, N, h, fs, 1.0f)) != ZO_OK)
        return st;
    return lora_forward(m, s, l, bb, TF_LORA_DOWN, down_in, tmp, h);
}

/* dh += dy W (+ the adapters' share), dW += dy^T x (none with LoRA) for the
 * layer's weight of `role`, without bias, whose adapters are `stage`'s; dy
 * fp32 [N, out], rounded once for the GEMMs. */
static zo_status plain_linear_backward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s,
                                       model_role role, tf_lora_stage stage, gpu_tensor dy, gpu_tensor x, int N,
                                       int out, int in)
{
    zo_status st;
    const int blk = model_layout_layer_block(l);
    gpu_tensor op, w;
    if ((st = gemm_operand(m, s, dy, N, out, &op)) != ZO_OK ||
        (st = base_weight(m, s, base_buf(m, bb), blk, role, &w)) != ZO_OK ||
        (st = linear_backward(s, F32(m->dh), 1.0f, base_grad(m, bb, blk, role, 0), gpu_t(NULL, m->dtype), dy, op,
                              x, w, N, out, in, 1.0f)) != ZO_OK)
        return st;
    return lora_backward(m, s, l, bb, stage, op, out, x, F32(m->dh));
}

/* The shared expert's backward from dres: dWdown, its gate's gradient dz,
 * dWg, dWu (or their adapters'), dh += its input's gradient. */
static zo_status shared_expert_backward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s)
{
    zo_status st;
    const int blk = model_layout_layer_block(l), N = m->b * m->t, h = m->cfg.hidden, f = m->cfg.moe.shared_ffn;
    const zo_dtype dt = m->dtype;
    tf_layer_acts *a = &m->acts[l];
    gpu_tensor ln2 = gpu_t(a->ln2, dt), act = gpu_t(a->act, dt), wd;
    const int gated = m->cfg.moe.shared_gate;
    gpu_tensor dff = F32(m->dff), dup = F32(m->dff2), sact = gated ? gpu_t(m->sact, dt) : act, op;
    /* g [N, f] = dres Wdown; dWdown += dres^T (sigmoid(z) act), or dres^T act ungated */
    if ((st = gemm_operand(m, s, F32(m->dres), N, h, &op)) != ZO_OK ||
        (st = base_weight(m, s, base_buf(m, bb), blk, MODEL_ROLE_MLP_DOWN_W, &wd)) != ZO_OK)
        return st;
    gpu_gemm_desc gx = {.m = N, .n = f, .k = h, .alpha = 1.0f, .beta = 0.0f, .a = op, .b = wd, .c = dff,
                        .lda = h, .ldb = f, .ldc = f};
    gpu_gemm_desc gw = {.trans_a = 1, .m = h, .n = f, .k = N, .alpha = 1.0f, .beta = 1.0f, .a = op,
                        .b = sact, .c = base_grad(m, bb, blk, MODEL_ROLE_MLP_DOWN_W, 0), .lda = h, .ldb = f, .ldc = f};
    if ((st = gpu_gemm(s, &gx)) != ZO_OK ||
        (gated && (st = gpu_moe_scale_forward(s, sact, act, a->sgate, N, f, 1, 1)) != ZO_OK) ||
        (gw.c.data && (st = gpu_gemm(s, &gw)) != ZO_OK))
        return st;
    /* the down adapters: their A x again (recompute stops before the down
     * projection), then g += their share */
    if (has_lora(m) && ((st = lora_forward(m, s, l, bb, TF_LORA_DOWN, sact, gpu_t(NULL, dt), h)) != ZO_OK ||
                        (st = lora_backward(m, s, l, bb, TF_LORA_DOWN, op, h, sact, dff)) != ZO_OK))
        return st;
    /* dz = g . act sigmoid', dact = sigmoid(z) g (in place), then SwiGLU, gate/up and the gate */
    if ((gated && (st = gpu_moe_scale_backward(s, dff, m->dz, dff, act, a->sgate, N, f, 1, 1)) != ZO_OK) ||
        (st = gpu_swiglu_backward(s, dff, dup, dff, gpu_t(a->fc, dt), gpu_t(a->up, dt), (size_t)N * f, 0)) != ZO_OK ||
        (st = plain_linear_backward(m, l, bb, s, MODEL_ROLE_MLP_GATE_W, TF_LORA_GATE, dff, ln2, N, f, h)) != ZO_OK ||
        (st = plain_linear_backward(m, l, bb, s, MODEL_ROLE_MLP_UP_W, TF_LORA_UP, dup, ln2, N, f, h)) != ZO_OK)
        return st;
    if (!gated) return ZO_OK;
    return plain_linear_backward(m, l, bb, s, MODEL_ROLE_SHARED_GATE_W, TF_LORA_NONE, F32(m->dz), ln2, N, 1, h);
}

/* dW += alpha dy^T x over an expert's n rows: with expert parallelism one GEMM
 * per source rank's rows (grouped rows: by expert, then source rank), so
 * that an expert's gradient adds each rank's tokens' share in rank order,
 * as one rank's gradient accumulation adds its micro-batches'; returns dw
 * emptied for gemm_back when it did (nothing else to add). */
static zo_status ep_weight_grad(tf_model *m, const tf_layer_acts *a, int e, gpu_stream_t s, gpu_tensor *dw,
                                gpu_tensor dy, gpu_tensor x, int out, int in, float alpha)
{
    if (m->ep_size <= 1 || !dw->data) return ZO_OK;
    const int El = m->layout.expert_count;
    zo_status st;
    for (int p = 0, at = 0; p < m->ep_size; p++) {
        int n = a->ep_cnt[(size_t)p * El + e];
        if (!n) continue;
        gpu_gemm_desc gw = {.trans_a = 1, .m = out, .n = in, .k = n, .alpha = alpha, .beta = 1.0f,
                            .a = rows_at(dy, at, out), .b = rows_at(x, at, in), .c = *dw, .lda = out, .ldb = in,
                            .ldc = in};
        if ((st = gpu_gemm(s, &gw)) != ZO_OK) return st;
        at += n;
    }
    dw->data = NULL;
    return ZO_OK;
}

/* gpt-oss's down bias of expert e, which its n pairs' outputs carry times
 * their weights w: each pair's weight gradient ds += dg . b_down (op: dg
 * [n, h] as the GEMMs take it), and db_down += sum of w dg over the pairs
 * (dg scaled in place: the caller's next use overwrites it). */
static zo_status expert_down_bias_backward(tf_model *m, gpu_stream_t s, const tf_block_bufs *bb, int blk, int e,
                                           const void *ew, float *ds, gpu_tensor op, gpu_tensor dg, const float *wp,
                                           int n)
{
    if (!m->cfg.moe.expert_bias) return ZO_OK;
    const int h = m->cfg.hidden;
    zo_status st;
    gpu_tensor b, db = base_grad(m, bb, blk, MODEL_ROLE_EXPERT_DOWN_B, e);
    if ((st = expert_weight(m, s, bb, blk, MODEL_ROLE_EXPERT_DOWN_B, e, ew, &b)) != ZO_OK ||
        (st = gemm_xwt(s, gpu_t(ds, ZO_DTYPE_F32), op, b, n, 1, h, 1.0f)) != ZO_OK || !db.data)
        return st;
    if ((st = gpu_moe_scale_forward(s, dg, dg, wp, n, h, 1, 0)) != ZO_OK) return st;
    return gpu_bias_backward(s, db, dg, n, h, h);
}

/* The routed experts' backward on their pairs, from dres: their weights'
 * (or adapters') gradients, dweights [N, E] (each pair's weight gradient at
 * its token and expert), dh += the pairs' input gradients added back to
 * their tokens. With expert parallelism the owners compute them on the
 * rows they received (ep_x) from each pair's output gradient, sent in fp32,
 * and send the input and weight gradients back. */
static zo_status experts_backward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s)
{
    zo_status st;
    const zo_moe *mo = &m->cfg.moe;
    const int blk = model_layout_layer_block(l), N = m->b * m->t, h = m->cfg.hidden, E = mo->experts;
    const int fe = mo->expert_ffn, ep = m->ep_size > 1, El = m->layout.expert_count;
    const zo_dtype dt = m->dtype;
    tf_layer_acts *a = &m->acts[l];
    const int *off = a->moe_off, M = off[E];
    gpu_tensor fc = gpu_t(a->efc, dt), up = gpu_t(a->eup, dt), act = gpu_t(a->eact, dt);
    gpu_tensor dff = F32(m->dff), dup = F32(m->dff2), sact = gpu_t(m->sact, dt), dx = F32(m->moe_dx);
    gpu_tensor xg = gpu_t(m->moe_x, dt), op, w;
    if ((st = gpu_memset_async(s, m->dweights, 0, (size_t)N * E * 4)) != ZO_OK || (!M && !ep)) return st;
    /* the pairs' output gradients dg [M, h] (in moe_dx); the owner's rows:
     * their gradients (ex_g), weighted activations w act (sact), inputs
     * (ex_x), weights and weight gradients (ex_ds) */
    if (M && (st = gpu_moe_gather(s, dx, F32(m->dres), a->moe_idx, M, h)) != ZO_OK) return st;
    /* Granite-MoE: the branch's output is residual_multiplier times the
     * experts' (moe_forward's down GEMM alpha), so is every gradient
     * through it: the down projection's backward GEMMs take it as their
     * alpha (dWdown and g below; the gate's and up's gradients and the
     * pairs' weight gradients follow from g) */
    const float ralpha = branch_alpha(m, MODEL_ROLE_MLP_DOWN_W);
    const int *eoff = ep ? a->ep_off : off, R = eoff[El];
    const float *wp = ep ? a->ep_wp : a->moe_wp;
    float *ex_ds = ep ? m->ep_w[1] : m->moe_dscale;
    gpu_tensor ex_g = dx, ex_x = ep ? gpu_t(a->ep_x, dt) : xg;
    if (ep) {
        ex_g = F32(m->ep_buf[1]);
        if ((st = ep_exchange(m, l, s, dx.data, m->ep_buf[0], h, ZO_DTYPE_F32, 0, TF_EP_BACKWARD)) != ZO_OK ||
            (R && (st = gpu_moe_gather(s, ex_g, F32(m->ep_buf[0]), a->ep_idx, R, h)) != ZO_OK))
            return st;
    } else if ((st = gpu_moe_gather(s, xg, gpu_t(a->ln2, dt), a->moe_idx, M, h)) != ZO_OK) {
        return st;
    }
    if (R && (st = gpu_moe_scale_forward(s, sact, act, wp, R, fe, 1, 0)) != ZO_OK) return st;
    /* one expert at a time (one visit each: its weights may be streamed
     * apart); the casts of a GEMM operand reuse one buffer in stream order */
    for (int e = 0; e < El; e++) {
        int n = eoff[e + 1] - eoff[e];
        if (!n) continue;
        const int o = eoff[e];
        gpu_tensor g = rows_at(dff, o, fe), gu = rows_at(dup, o, fe), x = rows_at(sact, o, fe);
        gpu_tensor dxe = rows_at(ex_g, o, h), xe = rows_at(ex_x, o, h);
        const void *ew;
        /* g = ralpha dg Wdown [n, fe]; dWdown += ralpha dg^T (w act) */
        gpu_tensor dw = base_grad(m, bb, blk, MODEL_ROLE_EXPERT_DOWN_W, e);
        if ((st = expert_begin(bb, e, s, &ew)) != ZO_OK || (st = gemm_operand(m, s, dxe, n, h, &op)) != ZO_OK ||
            (st = expert_weight(m, s, bb, blk, MODEL_ROLE_EXPERT_DOWN_W, e, ew, &w)) != ZO_OK ||
            (st = ep_weight_grad(m, a, e, s, &dw, op, x, h, fe, ralpha)) != ZO_OK ||
            (st = gemm_back(s, g, 0.0f, dw, op, x, w, n, h, fe, ralpha)) != ZO_OK ||
            (st = expert_lora_backward(m, s, bb, TF_LORA_EXPERT_DOWN, e, op, h, x, g, n)) != ZO_OK)
            return st;
        /* each pair's weight gradient g . act, dact = w g (in place), SwiGLU */
        if ((st = gpu_moe_scale_backward(s, g, ex_ds + o, g, rows_at(act, o, fe), wp + o, n, fe, 1, 0)) != ZO_OK ||
            (st = expert_down_bias_backward(m, s, bb, blk, e, ew, ex_ds + o, op, dxe, wp + o, n)) != ZO_OK ||
            (st = expert_glu_backward(m, s, g, gu, g, rows_at(fc, o, fe), rows_at(up, o, fe), (size_t)n * fe)) !=
                ZO_OK)
            return st;
        /* gpt-oss: the gate and up biases' gradients, their rows' column sums */
        gpu_tensor dbg = base_grad(m, bb, blk, MODEL_ROLE_EXPERT_GATE_B, e);
        gpu_tensor dbu = base_grad(m, bb, blk, MODEL_ROLE_EXPERT_UP_B, e);
        if ((dbg.data && (st = gpu_bias_backward(s, dbg, g, n, fe, fe)) != ZO_OK) ||
            (dbu.data && (st = gpu_bias_backward(s, dbu, gu, n, fe, fe)) != ZO_OK))
            return st;
        /* gate, then up: dW += d^T xg, dx [n, h] = dgate Wg + dup Wu (dg is spent) */
        gpu_tensor d[2] = {g, gu};
        model_role r[2] = {MODEL_ROLE_EXPERT_GATE_W, MODEL_ROLE_EXPERT_UP_W};
        tf_lora_stage ls[2] = {TF_LORA_EXPERT_GATE, TF_LORA_EXPERT_UP};
        for (int k = 0; k < 2; k++) {
            gpu_tensor dwk = base_grad(m, bb, blk, r[k], e);
            if ((st = gemm_operand(m, s, d[k], n, fe, &op)) != ZO_OK ||
                (st = expert_weight(m, s, bb, blk, r[k], e, ew, &w)) != ZO_OK ||
                (st = ep_weight_grad(m, a, e, s, &dwk, op, xe, fe, h, 1.0f)) != ZO_OK ||
                (st = gemm_back(s, dxe, (float)k, dwk, op, xe, w, n, fe, h, 1.0f)) != ZO_OK ||
                (st = expert_lora_backward(m, s, bb, ls[k], e, op, fe, xe, dxe, n)) != ZO_OK)
                return st;
        }
    }
    /* the input and weight gradients back to their senders (moe_dx,
     * moe_dscale: the pairs' order), then to the tokens, expert after
     * expert: dh += dx, dweights[token, e] = the pair's weight gradient */
    if (ep && ((st = ep_return(m, l, s, ex_g, m->ep_buf[0], dx.data, h)) != ZO_OK ||
               (st = ep_return(m, l, s, F32(ex_ds), m->ep_w[0], m->moe_dscale, 1)) != ZO_OK))
        return st;
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e];
        if (!n) continue;
        const int o = off[e];
        if ((st = gpu_moe_scatter_add(s, F32(m->dh), rows_at(dx, o, h), a->moe_idx + o, n, h, h)) != ZO_OK ||
            (st = gpu_moe_scatter_add(s, F32(m->dweights + e), F32(m->moe_dscale + o), a->moe_idx + o, n, 1, E)) !=
                ZO_OK)
            return st;
    }
    return ZO_OK;
}

/* The router's backward into drouter, with the balance loss's gradient
 * (times the loss scale, as the cross-entropy's):
 * - Hugging Face's (Mixtral, Qwen-MoE): one loss over every MoE layer's N
 *   tokens, coef * E / (L N)^2 * C_j added to dL/dp_j, C_j the choices of
 *   j over all L layers;
 * - DeepSeek's: each layer's own, coef * E / (N^2 k) * C_j with this
 *   layer's C_j; with seq_aux per sequence of t tokens, averaged over the
 *   b sequences: coef * E / (b t^2 k) * C_j of the token's sequence. */
static zo_status router_backward(tf_model *m, int l, gpu_stream_t s)
{
    const zo_model_config *c = &m->cfg;
    const zo_moe *mo = &c->moe;
    const int N = m->b * m->t, E = mo->experts, k = mo->top_k;
    const tf_layer_acts *a = &m->acts[l];
    const size_t S = stat_rows(m);
    const gpu_moe_gate gate = router_gate(m, l);
    if (!mo->aux_per_layer) {
        int moe_layers = zo_model_moe_layers(c);
        double LN = (double)moe_layers * N;
        float aux = mo->aux_loss ? (float)(m->moe_loss_scale * (double)mo->aux_coef * E / (LN * LN)) : 0.0f;
        return gpu_moe_router_backward(s, F32(m->drouter), F32(m->dweights), F32(a->router_logits),
                                       m->moe_stats + (size_t)mo->first_dense * 2 * E, N, E, k, &gate,
                                       moe_layers, N, aux);
    }
    /* the groups of rows counted apart: the b sequences, or the micro-batch */
    const int rows = S > 1 ? m->t : N, groups = N / rows;
    float aux = mo->aux_loss ? (float)(m->moe_loss_scale * (double)mo->aux_coef * E /
                                       ((double)groups * rows * rows * k))
                             : 0.0f;
    return gpu_moe_router_backward(s, F32(m->drouter), F32(m->dweights), F32(a->router_logits),
                                   m->moe_stats + (size_t)l * S * 2 * E, N, E, k, &gate, 1, rows, aux);
}

/* On entry dres = dL/d(layer output); on exit dh = dL/d ln2 through the MoE
 * MLP (the router included, with the load-balancing loss's gradient). */
static zo_status moe_backward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    const zo_moe *mo = &c->moe;
    const int N = m->b * m->t, h = c->hidden, E = mo->experts;
    tf_layer_acts *a = &m->acts[l];
    if ((st = gpu_memset_async(s, m->dh, 0, (size_t)N * h * 4)) != ZO_OK ||
        (st = experts_backward(m, l, bb, s)) != ZO_OK ||
        (mo->shared_ffn && (st = shared_expert_backward(m, l, bb, s)) != ZO_OK))
        return st;
    if ((st = router_backward(m, l, s)) != ZO_OK) return st;
    /* gpt-oss: the router's logit bias, the column sums of drouter */
    gpu_tensor drb = base_grad(m, bb, model_layout_layer_block(l), MODEL_ROLE_ROUTER_B, 0);
    if (drb.data && (st = gpu_bias_backward(s, drb, F32(m->drouter), N, E, E)) != ZO_OK) return st;
    return plain_linear_backward(m, l, bb, s, MODEL_ROLE_ROUTER_W, TF_LORA_NONE, F32(m->drouter),
                                 gpu_t(a->ln2, m->dtype), N, E, h);
}

/* One linear layer of layer l: its weight and bias roles, the adapters'
 * stage, and its shape [out, in]. */
typedef struct linear_role {
    model_role w, b;
    tf_lora_stage stage;
    int out, in;
} linear_role;

/* ---- latent attention (DeepSeek-V2) -----------------------------------------------------
 * Our rows (model/layout.c, permuted at load and save) put each q head's
 * rotary dims first, de-interleaved (the file's pair (2i, 2i + 1) at i and
 * rope / 2 + i), then its nope dims; kv_a_proj_with_mqa's rows the rotary
 * key's, the same way, then c_kv's. The fused attention then runs over a
 * q|k|v of H heads of d = nope + rope: each q head straight from its
 * projection, k = [k_pe | k_nope] (the one rotary key in every head),
 * v = [v | 0] (v_dim <= d; zero scores nothing, so the output's padding is
 * 0 and only its v columns feed o_proj), and RoPE turns the first `rope`
 * dims of each q and k head as LLaMA's rotate_half does. */

/* The latent norms' eps: DeepseekV2RMSNorm's default, which q_a_layernorm
 * and kv_a_layernorm are built with (not rms_norm_eps) */
#define MLA_NORM_EPS 1e-6f

/* The widths latent attention works in, its forward's and its backward's
 * (mla_dims_of fills them from the model's config and batch). */
typedef struct mla_dims {
    int N;          /* tokens: batch x sequence */
    int h;          /* hidden */
    int H, d;       /* heads; a q and k head's width nope + rope (v's padded to it) */
    int qw;         /* q's width H d (and k's, and padded v's) */
    int ld;         /* qkv's row stride: q | k | v, 3 H d */
    int rope, nope; /* a q and k head's rotary and other dims */
    int v;          /* a v head's dims (at most d) */
    int qr;         /* q_lora_rank (0: q projected from the hidden state) */
    int kvr;        /* kv_lora_rank: c_kv's width */
    int kaw;        /* kv_a_proj_with_mqa's rows [k_pe | c_kv]: rope + kvr */
    int kvh, kvw;   /* kv_b_proj's rows [k_nope | v] of a head (nope + v), of all H */
} mla_dims;

static mla_dims mla_dims_of(const tf_model *m)
{
    const zo_model_config *c = &m->cfg;
    const zo_mla *x = &c->mla;
    mla_dims md = {.N = m->b * m->t, .h = c->hidden, .H = c->n_heads, .d = c->head_dim,
                   .ld = qkv_width(c), .rope = x->qk_rope, .nope = x->qk_nope, .v = x->v_dim,
                   .qr = x->q_rank, .kvr = x->kv_rank};
    md.qw = md.H * md.d;
    md.kaw = md.rope + md.kvr;
    md.kvh = md.nope + md.v;
    md.kvw = md.H * md.kvh;
    return md;
}

/* Element `col` of row 0 of a [rows, ld] tensor of type dt as a tensor. */
static gpu_tensor col_at(gpu_tensor t, size_t col)
{
    return gpu_t((char *)t.data + col * zo_dtype_size(t.dtype), t.dtype);
}

/* One latent chain of layer l: a down projection a of the hidden state,
 * whose last r = b.in columns are the latent c, c's RMSNorm in place, and
 * the up projection b of c. q's with q_rank (q_a_proj, q_a_layernorm,
 * q_b_proj: c is all of a's output) and kv's (kv_a_proj_with_mqa,
 * kv_a_layernorm, kv_b_proj: c is a's output after k_pe, copied out). */
typedef struct mla_latent {
    linear_role a, b;  /* [a.out, h], [b.out, r] */
    model_role norm_w; /* the norm's weight [r] */
    gpu_tensor a_out;  /* a's output [N, a.out]; c itself when a.out is r */
    gpu_tensor c;      /* [N, r]: normed, b's input (kept for the backward) */
    gpu_tensor c_in;   /* the norm's input [N, r] and its 1/rms [N] (training) */
    float *rstd;
} mla_latent;

static mla_latent mla_latent_of(const tf_model *m, int l, const mla_dims *md, int kv)
{
    const tf_layer_acts *a = &m->acts[l];
    const zo_dtype dt = m->dtype;
    if (kv)
        return (mla_latent){.a = {MODEL_ROLE_KV_A_W, NO_BIAS, TF_LORA_MLA_KVA, md->kaw, md->h},
                            .b = {MODEL_ROLE_KV_B_W, NO_BIAS, TF_LORA_MLA_KVB, md->kvw, md->kvr},
                            .norm_w = MODEL_ROLE_KV_A_NORM_W, .a_out = gpu_t(m->mla_kva, dt),
                            .c = gpu_t(a->mla_ckv, dt), .c_in = gpu_t(a->mla_ckv_in, dt), .rstd = a->mla_ckv_rstd};
    return (mla_latent){.a = {MODEL_ROLE_Q_A_W, NO_BIAS, TF_LORA_MLA_QA, md->qr, md->h},
                        .b = {MODEL_ROLE_Q_B_W, NO_BIAS, TF_LORA_MLA_QB, md->qw, md->qr},
                        .norm_w = MODEL_ROLE_Q_A_NORM_W, .a_out = gpu_t(a->mla_qa, dt), .c = gpu_t(a->mla_qa, dt),
                        .c_in = gpu_t(a->mla_qa_in, dt), .rstd = a->mla_qa_rstd};
}

/* y [N, b.out] (row stride ldy) = b(norm(c)), c the last r columns of
 * a(ln1) [N, h], base and adapters. */
static zo_status mla_latent_forward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s,
                                    const mla_latent *p, gpu_tensor ln1, gpu_tensor y, int64_t ldy)
{
    zo_status st;
    const int blk = model_layout_layer_block(l), N = m->b * m->t, r = p->b.in;
    const void *W = base_buf(m, bb);
    if ((st = base_linear_forward(m, s, W, blk, p->a.w, p->a.b, p->a_out, p->a.out, ln1, N, p->a.out, p->a.in)) !=
            ZO_OK ||
        (st = lora_forward(m, s, l, bb, p->a.stage, ln1, p->a_out, p->a.out)) != ZO_OK)
        return st;
    if (p->a.out > r && (st = gpu_head_copy(s, p->c, col_at(p->a_out, (size_t)(p->a.out - r)), N, 1, r, r, r, r,
                                            p->a.out, p->a.out)) != ZO_OK)
        return st;
    if ((st = gpu_head_norm_forward(s, p->c, r, p->c_in, p->rstd, bview(m, W, blk, p->norm_w), 0, N, 1, r,
                                    MLA_NORM_EPS, 0)) != ZO_OK ||
        (st = base_linear_forward(m, s, W, blk, p->b.w, p->b.b, y, ldy, p->c, N, p->b.out, r)) != ZO_OK)
        return st;
    return lora_forward(m, s, l, bb, p->b.stage, p->c, y, ldy);
}

/* qkv [N, 3 H d] (row stride ld) of layer l from ln1 [N, h]: q =
 * q_proj(ln1), or q_b_proj(norm(q_a_proj(ln1))) with q_rank; [k_pe | c_kv]
 * = kv_a_proj_with_mqa(ln1), [k_nope | v] of each head = kv_b_proj(norm(c_kv)).
 * Training keeps the norms' inputs and 1/rms (generation's acts have none). */
static zo_status mla_qkv_forward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s, gpu_tensor ln1,
                                 gpu_tensor qkv)
{
    zo_status st;
    const mla_dims md = mla_dims_of(m);
    const int blk = model_layout_layer_block(l), N = md.N;
    const zo_dtype dt = m->dtype;
    const mla_latent q = mla_latent_of(m, l, &md, 0), kvl = mla_latent_of(m, l, &md, 1);
    gpu_tensor kva = kvl.a_out, kv = gpu_t(m->mla_kv, dt);
    if (md.qr) {
        if ((st = mla_latent_forward(m, l, bb, s, &q, ln1, qkv, md.ld)) != ZO_OK) return st;
    } else if ((st = base_linear_forward(m, s, base_buf(m, bb), blk, MODEL_ROLE_Q_W, NO_BIAS, qkv, md.ld, ln1, N,
                                         md.qw, md.h)) != ZO_OK ||
               (st = lora_forward(m, s, l, bb, TF_LORA_QKV, ln1, qkv, md.ld)) != ZO_OK) {
        return st;
    }
    /* kva [N, rope + kv_rank]; c_kv out of its rows, normed; kv [N, H (nope + v)] */
    if ((st = mla_latent_forward(m, l, bb, s, &kvl, ln1, kv, md.kvw)) != ZO_OK) return st;
    /* k = [k_pe (every head the same) | k_nope], v = [v | 0] */
    gpu_tensor k = col_at(qkv, (size_t)md.qw), vv = col_at(qkv, 2 * (size_t)md.qw);
    if ((st = gpu_head_copy(s, k, kva, N, md.H, md.rope, md.rope, md.ld, md.d, md.kaw, 0)) != ZO_OK ||
        (st = gpu_head_copy(s, col_at(k, md.rope), kv, N, md.H, md.nope, md.nope, md.ld, md.d, md.kvw, md.kvh)) !=
            ZO_OK)
        return st;
    return gpu_head_copy(s, vv, col_at(kv, md.nope), N, md.H, md.v, md.d, md.ld, md.d, md.kvw, md.kvh);
}

/* The attention's output att [N, H d] narrowed to o_proj's input [N, H v]. */
static zo_status mla_out_forward(tf_model *m, gpu_stream_t s, gpu_tensor attv, gpu_tensor att)
{
    const zo_model_config *c = &m->cfg;
    const int H = c->n_heads, d = c->head_dim, v = c->mla.v_dim;
    return gpu_head_copy(s, attv, att, m->b * m->t, H, v, v, (int64_t)H * v, v, (int64_t)H * d, d);
}

/* ---- the latent cache (generation, TF_MLA_CACHE_LATENT) --------------------------------
 * A position's cache row is kv_a_proj_with_mqa's output in our row order,
 * [k_pe | c_kv] (D = rope + kv_rank wide), k_pe rotated and c_kv normed:
 * one key head for every query head. kv_b_proj's rows of head h are its
 * key rows W_UK_h [nope, kv_rank] and value rows W_UV_h [v, kv_rank]. W_UK_h
 * is absorbed into the query, q'_h = [q_pe_h | q_nope_h W_UK_h], so q'_h .
 * row_j = q_pe_h . k_pe_j + q_nope_h . (W_UK_h c_kv_j): the decompressed
 * score. The row is the value too: the output's c_kv part o_h = sum_j p_j
 * c_kv_j, and o_h W_UV_h^T = sum_j p_j (W_UV_h c_kv_j), the decompressed
 * output. The cached attention runs it as MQA (hkv 1, head size D, the
 * key and value caches one buffer: the new rows' key and value heads are
 * equal), at the decompressed attention's scale. */

/* An adapter on kv_b_proj (W + s B A, B [H (nope + v), r], A [r, kv_rank])
 * in the absorbed form, as terms beside the base weight rather than folded
 * into a copy of it: q'_nope_h += s (q_nope_h B_K_h) A before the
 * attention (stage 0), out_h += s (o_h A^T) B_V_h^T after it (stage 1), B_K_h
 * and B_V_h head h's key and value rows of B, through u [N, H, r]. Nothing
 * is kept between forwards, so a changed adapter or base is what the next
 * forward reads; a term is r / kv_rank of the absorbed GEMM beside it. */
static zo_status mla_kvb_adapter_terms(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s,
                                       const mla_dims *md, int stage, gpu_tensor x, int64_t ldx, int64_t hsx,
                                       gpu_tensor y, int64_t ldy, int64_t hsy)
{
    zo_status st;
    const int N = md->N, H = md->H, r = m->opts.lora.r;
    int n;
    const tf_lora_slot *slots = layer_slots(m, l, &n);
    gpu_tensor u = gpu_t(m->mla_u, m->dtype);
    for (int j = 0; j < n; j++) {
        const tf_lora_slot *sl = &slots[j];
        if (sl->stage != TF_LORA_MLA_KVB) continue;
        gpu_tensor A = lora_part(m, bb->params, sl, MODEL_LORA_A), Bk = lora_part(m, bb->params, sl, MODEL_LORA_B);
        gpu_tensor Bv = col_at(Bk, (size_t)md->nope * r);
        const float sc = stage_scale(m, TF_LORA_MLA_KVB);
        /* u_h = q_nope_h B_K_h [N, r] (x: q_nope), or o_h A^T (x: o's c_kv part) */
        gpu_gemm_desc g1 = {.trans_b = stage, .m = N, .n = r, .k = stage ? md->kvr : md->nope, .alpha = 1.0f,
                            .beta = 0.0f, .a = x, .b = stage ? A : Bk, .c = u, .lda = ldx, .ldb = stage ? md->kvr : r,
                            .ldc = (int64_t)H * r, .batch = H, .stride_a = hsx,
                            .stride_b = stage ? 0 : (int64_t)md->kvh * r, .stride_c = r};
        /* y_h += s u_h A [N, kv_rank], or s u_h B_V_h^T [N, v] */
        gpu_gemm_desc g2 = {.trans_b = stage, .m = N, .n = stage ? md->v : md->kvr, .k = r, .alpha = sc, .beta = 1.0f,
                            .a = u, .b = stage ? Bv : A, .c = y, .lda = (int64_t)H * r, .ldb = stage ? r : md->kvr,
                            .ldc = ldy, .batch = H, .stride_a = r, .stride_b = stage ? (int64_t)md->kvh * r : 0,
                            .stride_c = hsy};
        if ((st = gpu_gemm(s, &g1)) != ZO_OK || (st = gpu_gemm(s, &g2)) != ZO_OK) return st;
    }
    return ZO_OK;
}

/* Layer l's attention over the latent cache, absorbed, from ln1 [N, h] to
 * o_proj's input attv [N, H v] (N = b t, at most B rows: mla_latent_chunks).
 * q goes to att first [N, H d]; qkv [N, (H + 2) D] holds the absorbed
 * queries, the row as key and as value; the attention's output [N, H D]
 * overwrites att. kv_b_proj's weight is the base's view (an NF4 base
 * dequantized into wdq), an adapter's terms beside it. The rows are
 * sequences seq .. seq + b - 1 of the cache. */
static zo_status mla_latent_attention(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s, gpu_tensor ln1,
                                      gpu_tensor attv, int seq)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    const mla_dims md = mla_dims_of(m);
    const int blk = model_layout_layer_block(l), N = md.N, H = md.H, D = mla_row(c), ldq = (H + 2) * D;
    const zo_dtype dt = m->dtype;
    tf_layer_acts *a = &m->acts[l];
    const void *W = base_buf(m, bb);
    gpu_tensor q = gpu_t(a->att, dt), qkv = gpu_t(a->qkv, dt), kva = gpu_t(m->mla_kva, dt), att = q;
    gpu_tensor krow = col_at(qkv, (size_t)H * D), vrow = col_at(qkv, (size_t)(H + 1) * D);
    /* q [N, H d]: q_proj(ln1), or q_b_proj(norm(q_a_proj(ln1))) */
    const mla_latent ql = mla_latent_of(m, l, &md, 0);
    if (md.qr) {
        if ((st = mla_latent_forward(m, l, bb, s, &ql, ln1, q, md.qw)) != ZO_OK) return st;
    } else if ((st = base_linear_forward(m, s, W, blk, MODEL_ROLE_Q_W, NO_BIAS, q, md.qw, ln1, N, md.qw, md.h)) !=
                   ZO_OK ||
               (st = lora_forward(m, s, l, bb, TF_LORA_QKV, ln1, q, md.qw)) != ZO_OK) {
        return st;
    }
    /* the rows [k_pe | c_kv] = kv_a_proj_with_mqa(ln1), c_kv normed in place */
    if ((st = base_linear_forward(m, s, W, blk, MODEL_ROLE_KV_A_W, NO_BIAS, kva, md.kaw, ln1, N, md.kaw, md.h)) !=
            ZO_OK ||
        (st = lora_forward(m, s, l, bb, TF_LORA_MLA_KVA, ln1, kva, md.kaw)) != ZO_OK ||
        (st = gpu_head_norm_forward(s, col_at(kva, (size_t)md.rope), md.kaw, gpu_t(NULL, dt), NULL,
                                    bview(m, W, blk, MODEL_ROLE_KV_A_NORM_W), 0, N, 1, md.kvr, MLA_NORM_EPS, 0)) !=
            ZO_OK)
        return st;
    gpu_tensor w;
    if ((st = base_weight(m, s, W, blk, MODEL_ROLE_KV_B_W, &w)) != ZO_OK) return st;
    /* q'_h = [q_pe_h | q_nope_h W_UK_h]: q_nope_h [N, nope] x W_UK_h [nope, kv_rank], a GEMM a head */
    gpu_gemm_desc uk = {.m = N, .n = md.kvr, .k = md.nope, .alpha = 1.0f, .beta = 0.0f,
                        .a = col_at(q, (size_t)md.rope), .b = w, .c = col_at(qkv, (size_t)md.rope),
                        .lda = md.qw, .ldb = md.kvr, .ldc = ldq, .batch = H, .stride_a = md.d,
                        .stride_b = (int64_t)md.kvh * md.kvr, .stride_c = D};
    if ((st = gpu_head_copy(s, qkv, q, N, H, md.rope, md.rope, ldq, D, md.qw, md.d)) != ZO_OK ||
        (st = gpu_gemm(s, &uk)) != ZO_OK ||
        (st = mla_kvb_adapter_terms(m, l, bb, s, &md, 0, col_at(q, (size_t)md.rope), md.qw, md.d,
                                    col_at(qkv, (size_t)md.rope), ldq, D)) != ZO_OK ||
        (st = gpu_head_copy(s, krow, kva, N, 1, D, D, ldq, D, md.kaw, 0)) != ZO_OK ||
        /* RoPE on every q_pe and on k_pe, then the rotated row as the value too */
        (st = rope_gen(m, l, s, qkv, ldq, H + 1, D)) != ZO_OK ||
        (st = gpu_head_copy(s, vrow, krow, N, 1, D, D, ldq, D, ldq, 0)) != ZO_OK)
        return st;
    gpu_attn_desc ad = layer_attn(m, l);
    ad.scale = gpu_attn_scale(&ad); /* the decompressed heads' (d = nope + rope) */
    ad.hkv = 1;
    ad.d = D;
    gpu_tensor cache = col_at(gpu_t(m->kcache[l], dt), (size_t)seq * m->opts.kv_len * D);
    if ((st = gpu_attention_cached(s, &ad, att, qkv, cache, cache, m->pos, m->opts.kv_len)) != ZO_OK) return st;
    /* out_h [N, v] = o_h [N, kv_rank] x W_UV_h^T, a GEMM a head */
    gpu_gemm_desc uv = {.trans_b = 1, .m = N, .n = md.v, .k = md.kvr, .alpha = 1.0f, .beta = 0.0f,
                        .a = col_at(att, (size_t)md.rope), .b = col_at(w, (size_t)md.nope * md.kvr),
                        .c = attv, .lda = (int64_t)H * D, .ldb = md.kvr,
                        .ldc = (int64_t)H * md.v, .batch = H, .stride_a = D, .stride_b = (int64_t)md.kvh * md.kvr,
                        .stride_c = md.v};
    if ((st = gpu_gemm(s, &uv)) != ZO_OK) return st;
    return mla_kvb_adapter_terms(m, l, bb, s, &md, 1, col_at(att, (size_t)md.rope), (int64_t)H * D, D, attv,
                                 (int64_t)H * md.v, md.v);
}

/* A forward's rows narrowed to `t` rows of sequence j from row i0 (m->b,
 * m->t and m->pos: what the layer's ops read), and back (rows_restore). */
typedef struct row_view {
    int b, t;
    int32_t *pos;
} row_view;

static row_view rows_narrow(tf_model *m, int j, int i0, int t)
{
    row_view v = {m->b, m->t, m->pos};
    m->pos = m->rowpos + (size_t)j * m->t + i0;
    m->b = 1;
    m->t = t;
    return v;
}

static void rows_restore(tf_model *m, row_view v)
{
    m->b = v.b;
    m->t = v.t;
    m->pos = v.pos;
}

/* The absorbed form of a call of b x t rows: at once when they are at most
 * the B rows its buffers hold (a token of each sequence), else each
 * sequence's rows in chunks of B, in order (a chunk's rows go into the
 * cache before the next chunk's queries read them: each query attends over
 * the positions up to its own, as at once). */
static zo_status mla_latent_chunks(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s, gpu_tensor ln1)
{
    const int b = m->b, t = m->t, R = m->B;
    const size_t hrow = (size_t)m->cfg.hidden, orow = (size_t)m->cfg.n_heads * m->cfg.mla.v_dim;
    gpu_tensor attv = gpu_t(m->acts[l].mla_attv, m->dtype);
    if (b * t <= R) return mla_latent_attention(m, l, bb, s, ln1, attv, 0);
    zo_status st = ZO_OK;
    for (int j = 0; j < b && st == ZO_OK; j++)
        for (int i0 = 0; i0 < t && st == ZO_OK; i0 += R) {
            const size_t row = (size_t)j * t + i0;
            row_view v = rows_narrow(m, j, i0, t - i0 < R ? t - i0 : R);
            st = mla_latent_attention(m, l, bb, s, col_at(ln1, row * hrow), col_at(attv, row * orow), j);
            rows_restore(m, v);
        }
    return st;
}

/* The latent cache's form of this call (docs/generate.md, "The latent
 * cache's forms"): 1 to attend decompressed, as the full cache does, 0
 * absorbed. Per layer, sequence s of n new tokens after p_s cached ones
 * attends over P_s = p_s + n positions, A_s = n p_s + n (n + 1) / 2
 * query-key pairs:
 *   absorbed:     H (2 n nope r + 2 n r v) + 4 A_s H D    (q_nope W_UK, o W_UV^T;
 *                                                         q.k and p.v D = rope + r wide)
 *   decompressed: 2 P_s r H (nope + v) + 4 A_s H d        (kv_b_proj over c_kv of the
 *                                                         P_s positions; q.k, p.v d wide)
 * The decompressed form is taken when its sum over the sequences is the
 * smaller and its keys and values fit their scratch (mla_kdec: B T rows; a
 * call after cached positions decompresses one sequence at a time, so each
 * P_s must fit). At position 0 the projections cost the same in both forms
 * and D > d, so a prompt always attends decompressed; a token after a
 * cache of p attends absorbed; a call of n tokens after p cached ones
 * attends decompressed once 4 A (D - d) passes 2 p r (nope + v), for every
 * p from n > r (nope + v) / (2 (D - d)) on (171 at DeepSeek-V2-Lite's shape). */
static int mla_decompressed(const tf_model *m)
{
    const zo_model_config *c = &m->cfg;
    const double n = m->t, H = c->n_heads, r = c->mla.kv_rank, nope = c->mla.qk_nope, v = c->mla.v_dim;
    const double D = mla_row(c), d = c->head_dim;
    double absorbed = 0, dec = 0;
    for (int j = 0; j < m->b; j++) {
        const double p = m->hpos[j], A = n * p + n * (n + 1) / 2;
        if (m->hpos[j] && m->hpos[j] + m->t > m->B * m->T) return 0;
        absorbed += H * (2 * n * nope * r + 2 * n * r * v) + 4 * A * H * D;
        dec += 2 * (p + n) * r * H * (nope + v) + 4 * A * H * d;
    }
    return dec < absorbed;
}

/* Sequence j's p cached positions decompressed into the keys and values
 * kd, vd [P, H d] (one sequence: row stride H d): kv_b_proj (and its
 * adapters) over each position's c_kv, copied out of the cache into
 * a->mla_ckv, gives [k_nope | v] of each head into mla_kv; a key is [k_pe |
 * k_nope] (the cache's k_pe, rotated when it was written), a value [v | 0]. */
static zo_status mla_decompress_cached(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s, int j, int p,
                                       gpu_tensor kd, gpu_tensor vd)
{
    zo_status st;
    const mla_dims md = mla_dims_of(m);
    const int D = mla_row(&m->cfg);
    const zo_dtype dt = m->dtype;
    gpu_tensor row = col_at(gpu_t(m->kcache[l], dt), (size_t)j * m->opts.kv_len * D);
    gpu_tensor ckv = gpu_t(m->acts[l].mla_ckv, dt), kv = gpu_t(m->mla_kv, dt);
    const int64_t hd = (int64_t)md.H * md.d;
    row_view v = rows_narrow(m, j, 0, p); /* (lora_forward's rows) */
    st = gpu_head_copy(s, ckv, col_at(row, (size_t)md.rope), p, 1, md.kvr, md.kvr, md.kvr, 0, D, 0);
    if (st == ZO_OK)
        st = base_linear_forward(m, s, base_buf(m, bb), model_layout_layer_block(l), MODEL_ROLE_KV_B_W, NO_BIAS, kv,
                                 md.kvw, ckv, p, md.kvw, md.kvr);
    if (st == ZO_OK) st = lora_forward(m, s, l, bb, TF_LORA_MLA_KVB, ckv, kv, md.kvw);
    rows_restore(m, v);
    if (st != ZO_OK ||
        (st = gpu_head_copy(s, kd, row, p, md.H, md.rope, md.rope, hd, md.d, D, 0)) != ZO_OK ||
        (st = gpu_head_copy(s, col_at(kd, (size_t)md.rope), kv, p, md.H, md.nope, md.nope, hd, md.d, md.kvw,
                            md.kvh)) != ZO_OK)
        return st;
    return gpu_head_copy(s, vd, col_at(kv, (size_t)md.nope), p, md.H, md.v, md.d, hd, md.d, md.kvw, md.kvh);
}

/* The decompressed form over the latent cache: qkv [N, ld] holds the new
 * tokens' q and the full cache's k and v (mla_qkv_forward, rotated), a->mla_ckv
 * their c_kv normed. Their rows [k_pe | c_kv] go into the latent cache at
 * positions pos[j] .. pos[j] + t - 1 of each sequence j, and the queries
 * attend as the full cache's do, over keys and values in m->mla_kdec: a
 * prompt's (every sequence at position 0) the call's own [b, t], all
 * sequences at once; after cached positions, one sequence at a time, its
 * cached positions decompressed (mla_decompress_cached) and the call's. */
static zo_status mla_decompressed_attention(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s,
                                            const gpu_attn_desc *ad, gpu_tensor att, gpu_tensor qkv)
{
    zo_status st;
    const mla_dims md = mla_dims_of(m);
    const int b = m->b, t = m->t, D = mla_row(&m->cfg), kv_len = m->opts.kv_len;
    const zo_dtype dt = m->dtype;
    gpu_tensor cache = gpu_t(m->kcache[l], dt), ckv = gpu_t(m->acts[l].mla_ckv, dt);
    int cached = 0;
    /* k_pe (key head 0's rotated front) and c_kv of row i of sequence j to cache row j kv_len + pos[j] + i */
    for (int j = 0; j < b; j++) {
        gpu_tensor row = col_at(cache, ((size_t)j * kv_len + m->hpos[j]) * D);
        const size_t r0 = (size_t)j * t;
        if ((st = gpu_head_copy(s, row, col_at(qkv, r0 * md.ld + md.qw), t, 1, md.rope, md.rope, D, 0, md.ld, 0)) !=
                ZO_OK ||
            (st = gpu_head_copy(s, col_at(row, (size_t)md.rope), col_at(ckv, r0 * md.kvr), t, 1, md.kvr, md.kvr, D, 0,
                                md.kvr, 0)) != ZO_OK)
            return st;
        cached |= m->hpos[j] > 0;
    }
    gpu_tensor kd = gpu_t(m->mla_kdec, dt);
    if (!cached)
        return gpu_attention_cached(s, ad, att, qkv, kd, col_at(kd, (size_t)b * t * ad->hkv * ad->d), m->pos, t);
    /* one sequence: its P <= B T keys and values (mla_decompressed), the new ones written by the attention */
    const int cap = m->B * m->T;
    gpu_tensor vd = col_at(kd, (size_t)cap * ad->hkv * ad->d);
    gpu_attn_desc one = *ad;
    one.b = 1;
    for (int j = 0; j < b; j++) {
        const size_t r0 = (size_t)j * t;
        if ((m->hpos[j] && (st = mla_decompress_cached(m, l, bb, s, j, m->hpos[j], kd, vd)) != ZO_OK) ||
            (st = gpu_attention_cached(s, &one, col_at(att, r0 * md.qw), col_at(qkv, r0 * md.ld), kd, vd, m->pos + j,
                                       cap)) != ZO_OK)
            return st;
    }
    return ZO_OK;
}

/* Forward of layer l. With `recompute`, stop once every activation the
 * backward reads is saved: the down projection and the residual add, whose
 * output (res[l+1]) backward does not read, are skipped and res[l+1] is not
 * written (a down adapter's A x is computed: backward reads it). Recompute
 * by op (TF_RECOMPUTE_OPS) also skips what the layer kept: the qkv GEMM
 * and RoPE, the attention, fc1 / gate; the ops it runs are the forward's
 * kernels on the same inputs, so their outputs are the forward's bits.
 *
 * LoRA by op: the adapters' inputs are ln1, att, ln2 and act, which the
 * base layers already keep (att) or rebuild (the others). Each adapter's
 * A x [N, r] is rebuilt from them, that of a kept GEMM's adapter too (q, k,
 * v, fc1 / gate: lora_forward with no output, u only), rather than kept per
 * layer: the rebuild is one [N, in] x [in, r] GEMM, r / out of the base GEMM
 * it stands beside (under 1% at r 16 for widths past 2k), where keeping
 * would hold N r elements per adapter in every layer on top of the ops
 * policy's kept outputs. One set of A x (layer 0's) then serves every
 * layer, as with recompute full; the same GEMM on the same input gives the
 * forward's bits. */
static zo_status layer_forward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s,
                               int recompute)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    const int blk = model_layout_layer_block(l), N = m->b * m->t, h = c->hidden, f = c->ffn;
    const int ld = qkv_width(c);
    const zo_dtype dt = m->dtype;
    tf_layer_acts *a = &m->acts[l];
    const void *W = base_buf(m, bb);
    gpu_tensor x = gpu_t(m->res[l], dt), out = gpu_t(m->res[l + 1], dt);
    /* (OLMo-2, no pre-norms: the attention reads x, the MLP x_mid) */
    const int pre = pre_norms(c);
    gpu_tensor ln1 = pre ? gpu_t(a->ln1, dt) : x, qkv = gpu_t(a->qkv, dt), att = gpu_t(a->att, dt);
    gpu_tensor x_mid = gpu_t(a->x_mid, dt), tmp = gpu_t(m->tmp, dt);
    gpu_tensor ln2 = !pre ? x_mid : gpu_t(one_norm(c) ? a->ln1 : a->ln2, dt);
    gpu_tensor fc = gpu_t(a->fc, dt), act = gpu_t(a->act, dt);

    /* qkv (qkn, qk_rstd), att, lse, fc (and pm_in, rstd4) are the forward's */
    const int kept = recompute && recompute_ops(m);
    /* a parallel residual (GPT-NeoX, Falcon): out = x + attn(ln1) + mlp(ln2)
     * with ln2 = norm2(x), taken first (so that out may be x's buffer), or
     * ln1 itself with one norm (Falcon-7B); no x_mid */
    const int par = parallel_residual(m);
    /* attention: ln1 = norm(x); qkv[N, q+2kv] = ln1 Wqkv^T (+ b) (+ adapters); Qwen3's
     * norms on each q and k head; RoPE on q, k */
    if ((pre && (st = norm_forward(m, s, ln1, a->mean1, a->rstd1, x, bview(m, W, blk, MODEL_ROLE_LN1_W),
                                   bview(m, W, blk, MODEL_ROLE_LN1_B), N)) != ZO_OK) ||
        (par && !one_norm(c) &&
         (st = norm_forward(m, s, ln2, a->mean2, a->rstd2, x, bview(m, W, blk, MODEL_ROLE_LN2_W),
                                   bview(m, W, blk, MODEL_ROLE_LN2_B), N)) != ZO_OK))
        return st;
    if (kept) {
        /* by op: q, k, v's adapters' A ln1 (their B and the GEMM were kept in qkv) */
        if ((st = lora_forward(m, s, l, bb, TF_LORA_QKV, ln1, gpu_t(NULL, dt), ld)) != ZO_OK) return st;
    } else if (latent_cache(m) && !mla_decompressed(m)) {
        m->mla_forms[0]++;
        if ((st = mla_latent_chunks(m, l, bb, s, ln1)) != ZO_OK) return st;
    } else {
        if (latent_cache(m)) m->mla_forms[1]++;
        if (is_mla(c)) {
            if ((st = mla_qkv_forward(m, l, bb, s, ln1, qkv)) != ZO_OK) return st;
        } else if ((st = base_linear_forward(m, s, W, blk, MODEL_ROLE_QKV_W, MODEL_ROLE_QKV_B, qkv, ld, ln1, N,
                                             ld, h)) != ZO_OK ||
                   (st = lora_forward(m, s, l, bb, TF_LORA_QKV, ln1, qkv, ld)) != ZO_OK ||
                   (st = qk_norm_forward(m, s, a, W, blk, qkv)) != ZO_OK) {
            return st;
        }
        /* (Cohere2's global layers: q and k as projected, the keys cached so) */
        if (layer_rope(m, l) && (st = rope_rows(m, l, s, qkv, ld)) != ZO_OK) return st;
        gpu_attn_desc ad = layer_attn(m, l);
        if ((st = attn_sinks(m, s, W, blk, &ad, 0)) != ZO_OK) return st;
        /* generation: the new keys and values into the caches, the queries against them
         * (the latent cache's prompt: its rows into the cache, the keys and values scratch) */
        st = latent_cache(m) ? mla_decompressed_attention(m, l, bb, s, &ad, att, qkv)
             : m->opts.kv_len ? gpu_attention_cached(s, &ad, att, qkv, gpu_t(m->kcache[l], dt),
                                                     gpu_t(m->vcache[l], dt), m->pos, m->opts.kv_len)
                              : gpu_attention_forward(s, &ad, att, a->lse, qkv);
        if (st != ZO_OK) return st;
        if (is_mla(c) && (st = mla_out_forward(m, s, gpu_t(a->mla_attv, dt), att)) != ZO_OK) return st;
    }
    /* o_proj's input: the attention's output (latent attention: its v columns) */
    gpu_tensor oin = is_mla(c) ? gpu_t(a->mla_attv, dt) : att;
    const int ow = o_width(c);
    /* x_mid = x + att Wo^T (+ bo); a parallel residual's out = x + att Wo^T (+ bo),
     * which backward does not read: a recompute takes only the adapters' A att
     * (as the down projection's below); Gemma-2: x + norm(att Wo^T), its input kept */
    if (par && recompute) {
        if ((st = lora_forward(m, s, l, bb, TF_LORA_O, att, gpu_t(NULL, dt), h)) != ZO_OK) return st;
    } else {
        gpu_tensor o_out = post_norms(m) ? gpu_t(a->pa_in, dt) : tmp;
        if ((st = base_linear_forward(m, s, W, blk, MODEL_ROLE_ATTN_OUT_W, MODEL_ROLE_ATTN_OUT_B, o_out, h,
                                      oin, N, h, ow)) != ZO_OK ||
            (st = lora_forward(m, s, l, bb, TF_LORA_O, oin, o_out, h)) != ZO_OK)
            return st;
        if (post_norms(m) &&
            (st = norm_forward(m, s, tmp, NULL, a->rstd3, o_out, bview(m, W, blk, MODEL_ROLE_POST_ATTN_NORM_W),
                               gpu_t(NULL, dt), N)) != ZO_OK)
            return st;
        if ((st = gpu_add(s, par ? out : x_mid, x, tmp, (size_t)N * h)) != ZO_OK) return st;
    }

    /* MLP: GPT act = gelu(ln2 Wfc^T + bfc); LLaMA act = silu(ln2 Wg^T) * (ln2 Wu^T);
     * ln2 = norm(x_mid) (a parallel residual's is norm(x), above) */
    if (!par && pre &&
        (st = norm_forward(m, s, ln2, a->mean2, a->rstd2, x_mid, bview(m, W, blk, MODEL_ROLE_LN2_W),
                           bview(m, W, blk, MODEL_ROLE_LN2_B), N)) != ZO_OK)
        return st;
    if (is_moe(m, l)) {
        if ((st = moe_forward(m, l, bb, s, recompute)) != ZO_OK || recompute) return st;
        return gpu_add(s, out, x_mid, tmp, (size_t)N * h);
    }
    /* by op, a kept fc1 / gate: its adapters' A ln2 alone */
    gpu_tensor fc_y = kept ? gpu_t(NULL, dt) : fc;
    if (is_gpt(m)) {
        if ((!kept && (st = base_linear_forward(m, s, W, blk, MODEL_ROLE_MLP_UP_W, MODEL_ROLE_MLP_UP_B, fc, f,
                                                ln2, N, f, h)) != ZO_OK) ||
            (st = lora_forward(m, s, l, bb, TF_LORA_UP, ln2, fc_y, f)) != ZO_OK)
            return st;
        if ((st = gpu_gelu_forward(s, act, fc, (size_t)N * f, act_form(c))) != ZO_OK) return st;
    } else {
        gpu_tensor up = gpu_t(a->up, dt);
        if ((!kept && (st = base_linear_forward(m, s, W, blk, MODEL_ROLE_MLP_GATE_W, MODEL_ROLE_MLP_GATE_B, fc,
                                                f, ln2, N, f, h)) != ZO_OK) ||
            (st = lora_forward(m, s, l, bb, TF_LORA_GATE, ln2, fc_y, f)) != ZO_OK)
            return st;
        if ((st = base_linear_forward(m, s, W, blk, MODEL_ROLE_MLP_UP_W, MODEL_ROLE_MLP_UP_B, up, f,
                                      ln2, N, f, h)) != ZO_OK ||
            (st = lora_forward(m, s, l, bb, TF_LORA_UP, ln2, up, f)) != ZO_OK)
            return st;
        if ((st = gpu_swiglu_forward(s, act, fc, up, (size_t)N * f, tf_geglu(c))) != ZO_OK) return st;
    }
    if (post_norms(m)) {
        /* Gemma-2: out = x_mid + norm(act Wdown^T), the norm's input and
         * rstd kept (a recompute stops before the add; by op, before the
         * down projection: its output, the norm's input, was kept, its
         * adapters' A act rebuilt) */
        if (kept) return lora_forward(m, s, l, bb, TF_LORA_DOWN, act, gpu_t(NULL, dt), h);
        /* generation keeps neither: the attention's norm's buffers serve again */
        gpu_tensor d_out = gpu_t(m->opts.kv_len ? a->pa_in : a->pm_in, dt);
        float *rstd4 = m->opts.kv_len ? a->rstd3 : a->rstd4;
        if ((st = base_linear_forward(m, s, W, blk, MODEL_ROLE_MLP_DOWN_W, MODEL_ROLE_MLP_DOWN_B, d_out, h,
                                      act, N, h, f)) != ZO_OK ||
            (st = lora_forward(m, s, l, bb, TF_LORA_DOWN, act, d_out, h)) != ZO_OK ||
            (st = norm_forward(m, s, tmp, NULL, rstd4, d_out, bview(m, W, blk, MODEL_ROLE_POST_MLP_NORM_W),
                               gpu_t(NULL, dt), N)) != ZO_OK ||
            recompute)
            return st;
        return gpu_add(s, out, x_mid, tmp, (size_t)N * h);
    }
    if (recompute) return lora_forward(m, s, l, bb, TF_LORA_DOWN, act, gpu_t(NULL, dt), h);
    /* out = x_mid + act Wdown^T (+ b); a parallel residual's out += the same */
    if ((st = base_linear_forward(m, s, W, blk, MODEL_ROLE_MLP_DOWN_W, MODEL_ROLE_MLP_DOWN_B, tmp, h,
                                  act, N, h, f)) != ZO_OK ||
        (st = lora_forward(m, s, l, bb, TF_LORA_DOWN, act, tmp, h)) != ZO_OK)
        return st;
    return gpu_add(s, out, par ? out : x_mid, tmp, (size_t)N * h);
}

/* On entry dres = dL/d(res[l+1]); on exit dL/d(res[l]). */
/* The backward of linear layer `lr` in layer l, base and adapters, from dy
 * (fp32 [N, out], rounded once for the GEMMs) and the saved input x:
 * dx = dx_beta dx + dy W (+ the adapters' share). */
static zo_status linear_role_backward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s,
                                      linear_role lr, gpu_tensor dx, float dx_beta, gpu_tensor dy,
                                      gpu_tensor x)
{
    zo_status st;
    const int blk = model_layout_layer_block(l), N = m->b * m->t;
    const void *G = has_lora(m) ? NULL : bb->grads; /* LoRA: the base is frozen */
    gpu_tensor op;
    if ((st = gemm_operand(m, s, dy, N, lr.out, &op)) != ZO_OK ||
        (st = base_linear_backward(m, s, base_buf(m, bb), blk, lr.w, dx, dx_beta, tf_view(m, G, blk, lr.w),
                                   tf_view(m, G, blk, lr.b), dy, op, x, N, lr.out, lr.in)) != ZO_OK)
        return st;
    return lora_backward(m, s, l, bb, lr.stage, op, lr.out, x, dx);
}

/* Gemma-2's norm on a branch's output (the attention's or the MLP's):
 * dh = its backward of *dy, the gradient of what the norm returned, and *dy
 * becomes dh, the gradient of the branch's own output */
static zo_status post_norm_backward(tf_model *m, gpu_stream_t s, const void *G, const void *W, int blk,
                                    model_role role, void *in, const float *rstd, gpu_tensor *dy)
{
    const int N = m->b * m->t;
    gpu_tensor dh = F32(m->dh);
    zo_status st = gpu_memset_async(s, m->dh, 0, (size_t)N * m->cfg.hidden * 4);
    if (st == ZO_OK)
        st = norm_backward(m, s, dh, *dy, G, blk, role, NO_BIAS, gpu_t(in, m->dtype), bview(m, W, blk, role),
                           NULL, rstd, N);
    if (st == ZO_OK) *dy = dh;
    return st;
}

/* mla_latent_forward's backward from dy [N, b.out] (fp32): b's, into dc
 * [N, r], the norm's in place, then a's from da [N, a.out] (dc itself when
 * a.out is r; else dc goes into its last r columns, the caller having
 * written the others) into dh = dh_beta dh + d ln1. */
static zo_status mla_latent_backward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s,
                                     const mla_latent *p, gpu_tensor dy, gpu_tensor dc, gpu_tensor da,
                                     gpu_tensor ln1, gpu_tensor dh, float dh_beta)
{
    zo_status st;
    const int blk = model_layout_layer_block(l), N = m->b * m->t, r = p->b.in;
    const void *W = base_buf(m, bb), *G = has_lora(m) ? NULL : bb->grads; /* LoRA: the norms frozen */
    if ((st = linear_role_backward(m, l, bb, s, p->b, dc, 0.0f, dy, p->c)) != ZO_OK ||
        (st = gpu_head_norm_backward(s, dc, r, tf_view(m, G, blk, p->norm_w), p->c_in, bview(m, W, blk, p->norm_w),
                                     0, p->rstd, N, 1, r, 0)) != ZO_OK)
        return st;
    if (p->a.out > r && (st = gpu_head_copy(s, col_at(da, (size_t)(p->a.out - r)), dc, N, 1, r, r, p->a.out, r,
                                            r, r)) != ZO_OK)
        return st;
    return linear_role_backward(m, l, bb, s, p->a, dh, dh_beta, da, ln1);
}

/* From dqkv (after RoPE's backward): the projections' backward, weights'
 * gradients into the block's (none under LoRA, which latent attention does
 * not take yet) and dh = d ln1. */
static zo_status mla_qkv_backward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s, gpu_tensor ln1)
{
    zo_status st;
    const mla_dims md = mla_dims_of(m);
    const int N = md.N;
    gpu_tensor dqkv = F32(m->dqkv), dh = F32(m->dh), dq = F32(m->datt); /* datt is free after the attention */
    gpu_tensor dkva = F32(m->mla_dkva), dkv = F32(m->mla_dkv), dckv = F32(m->mla_dckv);
    const linear_role qp = {MODEL_ROLE_Q_W, NO_BIAS, TF_LORA_QKV, md.qw, md.h};
    const mla_latent q = mla_latent_of(m, l, &md, 0), kvl = mla_latent_of(m, l, &md, 1);
    /* q's gradient as its own rows [N, H d] */
    if ((st = gpu_head_copy(s, dq, dqkv, N, 1, md.qw, md.qw, md.qw, md.qw, md.ld, md.ld)) != ZO_OK) return st;
    if (md.qr) {
        gpu_tensor dqa = F32(m->mla_dqa);
        if ((st = mla_latent_backward(m, l, bb, s, &q, dq, dqa, dqa, ln1, dh, 0.0f)) != ZO_OK) return st;
    } else if ((st = linear_role_backward(m, l, bb, s, qp, dh, 0.0f, dq, ln1)) != ZO_OK) {
        return st;
    }
    /* [dk_nope | dv] of each head (kv_b's dy); d[k_pe | c_kv]: the rotary
     * key's gradient summed over the heads, then d c_kv from kv_b's and
     * the norm's backward */
    gpu_tensor dk = col_at(dqkv, (size_t)md.qw), dv = col_at(dqkv, 2 * (size_t)md.qw);
    if ((st = gpu_head_copy(s, dkv, col_at(dk, md.rope), N, md.H, md.nope, md.nope, md.kvw, md.kvh, md.ld, md.d)) !=
            ZO_OK ||
        (st = gpu_head_copy(s, col_at(dkv, md.nope), dv, N, md.H, md.v, md.v, md.kvw, md.kvh, md.ld, md.d)) != ZO_OK ||
        (st = gpu_head_copy(s, dkva, dk, N, md.H, md.rope, md.rope, md.kaw, 0, md.ld, md.d)) != ZO_OK)
        return st;
    return mla_latent_backward(m, l, bb, s, &kvl, dkv, dckv, dkva, ln1, dh, 1.0f);
}

static zo_status layer_backward(tf_model *m, int l, const tf_block_bufs *bb, gpu_stream_t s)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    const int blk = model_layout_layer_block(l), N = m->b * m->t, h = c->hidden, f = c->ffn;
    const int ld = qkv_width(c);
    const zo_dtype dt = m->dtype;
    tf_layer_acts *a = &m->acts[l];
    const void *W = base_buf(m, bb);
    /* the base's gradients: none with LoRA (frozen) */
    const void *G = has_lora(m) ? NULL : bb->grads;
    gpu_tensor dres = F32(m->dres), dh = F32(m->dh), dff = F32(m->dff);
    /* (no pre-norms: ln1 is x, ln2 x_mid, and the projections' input
     * gradients add straight into dres) */
    const int pre = pre_norms(c);
    gpu_tensor x = gpu_t(m->res[l], dt), ln1 = pre ? gpu_t(a->ln1, dt) : x, qkv = gpu_t(a->qkv, dt);
    gpu_tensor att = gpu_t(a->att, dt), x_mid = gpu_t(a->x_mid, dt);
    gpu_tensor ln2 = !pre ? x_mid : gpu_t(one_norm(c) ? a->ln1 : a->ln2, dt);
    gpu_tensor fc = gpu_t(a->fc, dt), act = gpu_t(a->act, dt);
    gpu_tensor dln = pre ? dh : dres; /* d ln1, d ln2's destination */
    const float dln_beta = pre ? 0.0f : 1.0f;
    const linear_role down = {MODEL_ROLE_MLP_DOWN_W, MODEL_ROLE_MLP_DOWN_B, TF_LORA_DOWN, h, f};
    const linear_role gate = {MODEL_ROLE_MLP_GATE_W, MODEL_ROLE_MLP_GATE_B, TF_LORA_GATE, f, h};
    const linear_role up = {MODEL_ROLE_MLP_UP_W, MODEL_ROLE_MLP_UP_B, TF_LORA_UP, f, h};
    const linear_role out = {MODEL_ROLE_ATTN_OUT_W, MODEL_ROLE_ATTN_OUT_B, TF_LORA_O, h, o_width(c)};
    const linear_role qkvp = {MODEL_ROLE_QKV_W, MODEL_ROLE_QKV_B, TF_LORA_QKV, ld, h};

    if (is_moe(m, l)) {
        if ((st = moe_backward(m, l, bb, s)) != ZO_OK) return st;
    } else {
    /* MLP down projection: dact[N, f] = dres Wdown (+ adapter); Gemma-2:
     * d(down output) = the post norm's backward of dres, in dh */
    gpu_tensor ddown = dres;
    if (post_norms(m) &&
        (st = post_norm_backward(m, s, G, W, blk, MODEL_ROLE_POST_MLP_NORM_W, a->pm_in, a->rstd4, &ddown)) != ZO_OK)
        return st;
    if ((st = linear_role_backward(m, l, bb, s, down, dff, 0.0f, ddown, act)) != ZO_OK) return st;
    if (is_gpt(m)) {
        if ((st = gpu_gelu_backward(s, dff, dff, fc, (size_t)N * f, act_form(c))) != ZO_OK) return st; /* dfc, in place */
        if ((st = linear_role_backward(m, l, bb, s, up, dln, dln_beta, dff, ln2)) != ZO_OK) return st;
    } else {
        gpu_tensor dup = F32(m->dff2), upa = gpu_t(a->up, dt);
        if ((st = gpu_swiglu_backward(s, dff, dup, dff, fc, upa, (size_t)N * f, tf_geglu(c))) != ZO_OK) return st; /* dgate in place */
        if ((st = linear_role_backward(m, l, bb, s, gate, dln, dln_beta, dff, ln2)) != ZO_OK ||
            (st = linear_role_backward(m, l, bb, s, up, dln, 1.0f, dup, ln2)) != ZO_OK)
            return st;
    }
    }
    /* dres (= d x_mid so far) += norm2 backward; with a parallel residual
     * d x_mid is d out, which the output projection reads first, and norm2
     * (of x) adds its share after it */
    const int par = parallel_residual(m);
    if (!par && pre &&
        (st = norm_backward(m, s, dres, dh, G, blk, MODEL_ROLE_LN2_W, MODEL_ROLE_LN2_B, x_mid,
                            bview(m, W, blk, MODEL_ROLE_LN2_W), a->mean2, a->rstd2, N)) != ZO_OK)
        return st;

    /* attention output projection: datt[N, q] = dres Wo (+ adapter) */
    gpu_tensor datt = F32(m->datt), dqkv = F32(m->dqkv), dout = dres;
    if (post_norms(m) && /* Gemma-2: through the norm on the attention's output, into dh */
        (st = post_norm_backward(m, s, G, W, blk, MODEL_ROLE_POST_ATTN_NORM_W, a->pa_in, a->rstd3, &dout)) != ZO_OK)
        return st;
    if (is_mla(c)) { /* o_proj's input is the output's v columns: their gradient widened with zeros */
        gpu_tensor dattv = F32(m->mla_dattv);
        const int H = c->n_heads, d = c->head_dim, v = c->mla.v_dim;
        if ((st = linear_role_backward(m, l, bb, s, out, dattv, 0.0f, dout, gpu_t(a->mla_attv, dt))) != ZO_OK ||
            (st = gpu_head_copy(s, datt, dattv, N, H, v, d, (int64_t)H * d, d, (int64_t)H * v, v)) != ZO_OK)
            return st;
    } else if ((st = linear_role_backward(m, l, bb, s, out, datt, 0.0f, dout, att)) != ZO_OK) {
        return st;
    }
    /* one norm for both (Falcon-7B): the MLP's dh stays, the attention's adds to it */
    if (par && !one_norm(c) &&
        (st = norm_backward(m, s, dres, dh, G, blk, MODEL_ROLE_LN2_W, MODEL_ROLE_LN2_B, x,
                            bview(m, W, blk, MODEL_ROLE_LN2_W), a->mean2, a->rstd2, N)) != ZO_OK)
        return st;
    gpu_attn_desc ad = layer_attn(m, l);
    if ((st = attn_sinks(m, s, W, blk, &ad, 1)) != ZO_OK ||
        (st = gpu_attention_backward(s, &ad, dqkv, datt, qkv, att, a->lse)) != ZO_OK ||
        (st = attn_sinks_grad(m, s, G, blk)) != ZO_OK)
        return st;
    if (layer_rope(m, l) && (st = rope_heads(m, l, s, dqkv, N, ld, 1)) != ZO_OK)
        return st;
    if (is_mla(c)) {
        if ((st = mla_qkv_backward(m, l, bb, s, ln1)) != ZO_OK) return st;
    } else if ((st = qk_norm_backward(m, s, a, W, G, blk)) != ZO_OK ||
               (st = linear_role_backward(m, l, bb, s, qkvp, dln, one_norm(c) || !pre ? 1.0f : 0.0f, dqkv, ln1)) !=
                   ZO_OK) {
        return st;
    }
    if (!pre) return ZO_OK; /* (d x took d ln1 above) */
    /* dres (= d x) += norm1 backward */
    return norm_backward(m, s, dres, dh, G, blk, MODEL_ROLE_LN1_W, MODEL_ROLE_LN1_B, x,
                         bview(m, W, blk, MODEL_ROLE_LN1_W), a->mean1, a->rstd1, N);
}

/* The output projection's weight: lm_head, or the token embedding when tied. */
static gpu_tensor head_weight(tf_model *m, const tf_block_bufs *bb, int blk)
{
    const void *embed = has_lora(m) ? bb->embed_frozen : bb->embed_params;
    if (m->cfg.tied_embeddings) return bview(m, embed, MODEL_BLOCK_EMBED, MODEL_ROLE_TOK_EMB);
    return bview(m, base_buf(m, bb), blk, MODEL_ROLE_LM_HEAD_W);
}

/* Generation's head: the final norm and the output projection of one row
 * per sequence (its hlast, gathered into hsel): logits [b, v]. */
static zo_status head_generate(tf_model *m, const tf_block_bufs *bb, gpu_stream_t s)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    const int blk = model_layout_head_block(&m->layout);
    const size_t row = (size_t)c->hidden * zo_dtype_size(m->dtype);
    gpu_tensor w = head_weight(m, bb, blk);
    if (!w.data) return zo_error(ZO_ERR_INVALID, "head forward: tied model needs the embedding parameters");
    for (int j = 0; j < m->b; j++)
        if ((st = gpu_memcpy_async(s, (char *)m->hsel + j * row,
                                   (const char *)m->res[c->n_layers] + ((size_t)j * m->t + m->hlast[j]) * row, row,
                                   GPU_COPY_DEVICE_TO_DEVICE)) != ZO_OK)
            return st;
    const void *W = base_buf(m, bb);
    gpu_tensor lnf = gpu_t(m->lnf, m->dtype);
    if ((st = norm_forward(m, s, lnf, m->meanf, m->rstdf, gpu_t(m->hsel, m->dtype), bview(m, W, blk, MODEL_ROLE_NORM_W),
                           bview(m, W, blk, MODEL_ROLE_NORM_B), m->b)) != ZO_OK)
        return st;
    if ((st = linear_forward(s, F32(m->logits), c->vocab, lnf, w, bview(m, W, blk, MODEL_ROLE_LM_HEAD_B), m->b,
                             c->vocab, c->hidden, head_alpha(m))) != ZO_OK)
        return st;
    /* Gemma-2's final_logit_softcapping, as the loss sees the logits, on the
     * device: tf_logits downloads the model's logits */
    const float cap = c->final_softcap;
    return cap > 0.0f ? gpu_softcap(s, F32(m->logits), cap, (size_t)m->b * c->vocab) : ZO_OK;
}

static zo_status head_forward(tf_model *m, const tf_block_bufs *bb, gpu_stream_t s)
{
    if (m->opts.kv_len) return head_generate(m, bb, s);
    zo_status st;
    const zo_model_config *c = &m->cfg;
    const int blk = model_layout_head_block(&m->layout), N = m->b * m->t;
    const void *W = base_buf(m, bb);
    gpu_tensor w = head_weight(m, bb, blk);
    if (!w.data) return zo_error(ZO_ERR_INVALID, "head forward: tied model needs the embedding parameters");
    gpu_tensor lnf = gpu_t(m->lnf, m->dtype), logits = F32(m->logits);
    if ((st = norm_forward(m, s, lnf, m->meanf, m->rstdf, gpu_t(m->res[c->n_layers], m->dtype),
                           bview(m, W, blk, MODEL_ROLE_NORM_W), bview(m, W, blk, MODEL_ROLE_NORM_B),
                           N)) != ZO_OK)
        return st;
    /* logits[n, v] = lnf W^T / logits_scaling (+ the output layer's bias), n tokens at a time
     * (the loss chunk's, or all) */
    gpu_tensor hb = bview(m, W, blk, MODEL_ROLE_LM_HEAD_B);
    size_t rows = loss_rows(m, (size_t)N), es = zo_dtype_size(m->dtype);
    for (size_t n0 = 0; n0 < (size_t)N; n0 += rows) {
        int n = (int)((size_t)N - n0 < rows ? (size_t)N - n0 : rows);
        gpu_tensor x = gpu_t((char *)m->lnf + n0 * (size_t)c->hidden * es, m->dtype);
        if ((st = linear_forward(s, logits, c->vocab, x, w, hb, n, c->vocab, c->hidden, head_alpha(m))) != ZO_OK ||
            (st = gpu_cross_entropy_forward_cap(s, m->losses + n0, logits, m->targets + n0, n, c->vocab,
                                                c->final_softcap)) != ZO_OK)
            return st;
    }
    return ZO_OK;
}

/* dlogits[n, v] = dloss (softmax - onehot) of n rows of fp32 logits, into
 * dlogits (the logits in place, or their 16-bit copy); db (the output
 * layer's bias gradient, data NULL: none) += its column sums, taken from
 * the fp32 dlogits before any rounding. */
static zo_status head_dlogits(tf_model *m, gpu_stream_t s, gpu_tensor dlogits, gpu_tensor logits, gpu_tensor db,
                              const int32_t *targets, float dloss, int n)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    /* a bias to train and a 16-bit copy to fill: the fp32 gradient in place first */
    int via_f32 = db.data && dlogits.data != logits.data;
    gpu_tensor out = via_f32 ? logits : dlogits;
    if ((st = gpu_cross_entropy_backward_cap(s, out, logits, targets, dloss, n, c->vocab, c->final_softcap)) != ZO_OK)
        return st;
    if (db.data && (st = gpu_bias_backward(s, db, out, n, c->vocab, c->vocab)) != ZO_OK) return st;
    return via_f32 ? gpu_cast(s, dlogits, logits, (size_t)n * c->vocab) : ZO_OK;
}

static zo_status head_backward(tf_model *m, const tf_block_bufs *bb, float loss_scale,
                               gpu_stream_t s)
{
    zo_status st;
    const zo_model_config *c = &m->cfg;
    const int blk = model_layout_head_block(&m->layout), N = m->b * m->t;
    gpu_tensor w = head_weight(m, bb, blk);
    /* the output projection's gradient, unless it is frozen (LoRA) */
    gpu_tensor dw = has_lora(m)             ? gpu_t(NULL, m->dtype)
                    : c->tied_embeddings ? tf_view(m, bb->embed_grads, MODEL_BLOCK_EMBED, MODEL_ROLE_TOK_EMB)
                                         : tf_view(m, bb->grads, blk, MODEL_ROLE_LM_HEAD_W);
    if (!w.data || (!dw.data && !has_lora(m)))
        return zo_error(ZO_ERR_INVALID, "head backward: tied model needs the embedding parameters and gradients");
    /* the output layer's bias (head_bias): its gradient the column sums of
     * dlogits, unless it is frozen (LoRA) */
    gpu_tensor hb = bview(m, base_buf(m, bb), blk, MODEL_ROLE_LM_HEAD_B);
    gpu_tensor db = has_lora(m) ? gpu_t(NULL, m->dtype) : tf_view(m, bb->grads, blk, MODEL_ROLE_LM_HEAD_B);
    gpu_tensor logits = F32(m->logits), lnf = gpu_t(m->lnf, m->dtype);
    float dloss = m->n_targets ? loss_scale / (float)m->n_targets : 0.0f;
    m->moe_loss_scale = loss_scale; /* the layers' backward, after this one, scale the router's loss */
    /* dlogits = dloss * (softmax - onehot): in place of the fp32 logits, or
     * rounded once into the 16-bit copy the GEMMs read (gemm_operand) */
    gpu_tensor dlogits = m->dtype == ZO_DTYPE_F32 ? logits : gpu_t(m->dy16, m->dtype);
    size_t rows = loss_rows(m, (size_t)N), es = zo_dtype_size(m->dtype);
    if (rows == (size_t)N) {
        /* the forward's logits, whole */
        if ((st = head_dlogits(m, s, dlogits, logits, db, m->targets, dloss, N)) != ZO_OK) return st;
        if ((st = linear_backward(s, F32(m->dh), 0.0f, dw, gpu_t(NULL, m->dtype), dlogits, dlogits, lnf, w, N,
                                  c->vocab, c->hidden, head_alpha(m))) != ZO_OK)
            return st;
    }
    /* in chunks: each chunk's logits again, its dlogits, and its share of
     * the weight gradient (added) and of the norm gradient (its rows) */
    for (size_t n0 = 0; rows < (size_t)N && n0 < (size_t)N; n0 += rows) {
        int n = (int)((size_t)N - n0 < rows ? (size_t)N - n0 : rows);
        gpu_tensor x = gpu_t((char *)m->lnf + n0 * (size_t)c->hidden * es, m->dtype);
        if ((st = linear_forward(s, logits, c->vocab, x, w, hb, n, c->vocab, c->hidden, head_alpha(m))) != ZO_OK ||
            (st = head_dlogits(m, s, dlogits, logits, db, m->targets + n0, dloss, n)) != ZO_OK ||
            (st = linear_backward(s, F32(m->dh + n0 * (size_t)c->hidden), 0.0f, dw, gpu_t(NULL, m->dtype), dlogits,
                                  dlogits, x, w, n, c->vocab, c->hidden, head_alpha(m))) != ZO_OK)
            return st;
    }
    /* the residual gradient starts here: dres = norm_f backward */
    if ((st = gpu_memset_async(s, m->dres, 0, (size_t)N * c->hidden * 4)) != ZO_OK) return st;
    return norm_backward(m, s, F32(m->dres), F32(m->dh), bb->grads, blk, MODEL_ROLE_NORM_W, MODEL_ROLE_NORM_B,
                         gpu_t(m->res[c->n_layers], m->dtype), bview(m, base_buf(m, bb), blk, MODEL_ROLE_NORM_W),
                         m->meanf, m->rstdf, N);
}

static zo_status check_block(const tf_model *m, int block, const tf_block_bufs *bb, int need_grads)
{
    if (block < 0 || block >= m->layout.n_blocks)
        return zo_error(ZO_ERR_INVALID, "transformer: block %d outside 0..%d", block, m->layout.n_blocks - 1);
    if (!m->b) return zo_error(ZO_ERR_INVALID, "transformer: no batch set (tf_set_batch)");
    if (!bb) return zo_error(ZO_ERR_INVALID, "transformer: block %d buffers missing", block);
    /* with LoRA the parameters are the adapters, which the embedding and the head lack */
    int trains = !has_lora(m) || m->adapters.block_numel[block];
    if ((trains && !bb->params) || (trains && need_grads && !bb->grads))
        return zo_error(ZO_ERR_INVALID, "transformer: block %d %s missing", block,
                        has_lora(m) ? "adapters" : "buffers");
    if (has_lora(m) && !bb->frozen)
        return zo_error(ZO_ERR_INVALID, "transformer: block %d frozen weights missing", block);
    return ZO_OK;
}

zo_status tf_block_forward(tf_model *m, int block, const tf_block_bufs *bufs, gpu_stream_t s)
{
    zo_status st;
    if ((st = check_block(m, block, bufs, 0)) != ZO_OK) return st;
    m->apart_buf = bufs->expert ? bufs->params : NULL;
    m->wdq_src = NULL; /* the block's buffer may hold other weights than when wdq was filled */
    if (block == MODEL_BLOCK_EMBED) return embed_forward(m, bufs, s);
    if (block == model_layout_head_block(&m->layout)) return head_forward(m, bufs, s);
    return layer_forward(m, block - 1, bufs, s, 0);
}

zo_status tf_block_recompute(tf_model *m, int block, const tf_block_bufs *bufs, gpu_stream_t s)
{
    zo_status st;
    if ((st = check_trains(m, "tf_block_recompute")) != ZO_OK || (st = check_block(m, block, bufs, 0)) != ZO_OK)
        return st;
    if (block == MODEL_BLOCK_EMBED || block == model_layout_head_block(&m->layout))
        return ZO_OK; /* the embedding saves nothing; the head's activations are its own */
    if (block - 1 >= tf_recompute_layers(m)) return ZO_OK; /* it kept its activations */
    m->apart_buf = bufs->expert ? bufs->params : NULL;
    m->wdq_src = NULL;
    return layer_forward(m, block - 1, bufs, s, 1);
}

zo_status tf_block_backward(tf_model *m, int block, const tf_block_bufs *bufs, float loss_scale,
                            gpu_stream_t s)
{
    zo_status st;
    if ((st = check_trains(m, "tf_block_backward")) != ZO_OK || (st = check_block(m, block, bufs, 1)) != ZO_OK)
        return st;
    m->apart_buf = bufs->expert ? bufs->params : NULL;
    m->wdq_src = NULL;
    if (block == MODEL_BLOCK_EMBED) return embed_backward(m, bufs, s);
    if (block == model_layout_head_block(&m->layout)) return head_backward(m, bufs, loss_scale, s);
    return layer_backward(m, block - 1, bufs, s);
}

/* Block i's buffers out of the model's arrays. */
static tf_block_bufs block_bufs(const tf_model_bufs *b, int i)
{
    tf_block_bufs bb = {.params = b->params[i], .embed_params = b->params[MODEL_BLOCK_EMBED]};
    if (b->grads) {
        bb.grads = b->grads[i];
        bb.embed_grads = b->grads[MODEL_BLOCK_EMBED];
    }
    if (b->frozen) {
        bb.frozen = b->frozen[i];
        bb.embed_frozen = b->frozen[MODEL_BLOCK_EMBED];
    }
    return bb;
}

zo_status tf_forward_all(tf_model *m, const tf_model_bufs *bufs, gpu_stream_t s)
{
    zo_status st;
    for (int i = 0; i < m->layout.n_blocks; i++) {
        tf_block_bufs bb = block_bufs(bufs, i);
        if ((st = tf_block_forward(m, i, &bb, s)) != ZO_OK) return st;
    }
    return ZO_OK;
}

zo_status tf_backward_all(tf_model *m, const tf_model_bufs *bufs, float loss_scale, gpu_stream_t s)
{
    zo_status st;
    for (int i = m->layout.n_blocks - 1; i >= 0; i--) {
        tf_block_bufs bb = block_bufs(bufs, i);
        if ((st = tf_block_backward(m, i, &bb, loss_scale, s)) != ZO_OK) return st;
    }
    return ZO_OK;
}

zo_status tf_forward(tf_model *m, void *const *params, gpu_stream_t s)
{
    tf_model_bufs b = {.params = params};
    return tf_forward_all(m, &b, s);
}

zo_status tf_backward(tf_model *m, void *const *params, void *const *grads, float loss_scale,
                      gpu_stream_t s)
{
    tf_model_bufs b = {.params = params, .grads = grads};
    return tf_backward_all(m, &b, loss_scale, s);
}

/* The load-balancing loss of the batch (Hugging Face's load_balancing_loss_func
 * over every MoE layer's router logits, no attention mask): E sum_j
 * (C_j / (L N)) (P_j / (L N)) from the layers' statistics. */
static zo_status moe_aux_loss(tf_model *m, gpu_stream_t s, double *aux)
{
    const zo_moe *mo = &m->cfg.moe;
    int L = zo_model_moe_layers(&m->cfg), E = mo->experts;
    size_t n = (size_t)L * 2 * E;
    float *st_h = malloc(n * sizeof *st_h);
    if (!st_h) return zo_error(ZO_ERR_NOMEM, "tf_loss: out of host memory");
    zo_status st = gpu_memcpy_async(s, st_h, m->moe_stats + (size_t)mo->first_dense * 2 * E, n * 4,
                                    GPU_COPY_DEVICE_TO_HOST);
    if (st == ZO_OK) st = gpu_stream_synchronize(s);
    if (st == ZO_OK) {
        double LN = (double)L * m->b * m->t, sum = 0.0;
        for (int j = 0; j < E; j++) {
            double P = 0.0, C = 0.0;
            for (int l = 0; l < L; l++) P += st_h[(size_t)l * 2 * E + j], C += st_h[(size_t)l * 2 * E + E + j];
            sum += (C / LN) * (P / LN);
        }
        *aux = E * sum;
    }
    free(st_h);
    return st;
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
    /* (DeepSeek's balance loss is in the gradient only, not in the loss its model returns) */
    if (st == ZO_OK && m->cfg.moe.experts && m->cfg.moe.aux_loss && !m->cfg.moe.aux_per_layer) {
        double aux = 0.0;
        if ((st = moe_aux_loss(m, s, &aux)) == ZO_OK) *loss += (float)(m->cfg.moe.aux_coef * aux);
    }
    return st;
}

/* ---- initialization ------------------------------------------------------------------ */

uint64_t tf_init_rng(uint64_t seed) { return seed * 0x2545f4914f6cdd1dull + 1; }

/* An expert window (model/layout.h): the draws of the experts before it
 * and after it are skipped, so that each expert gets the values the whole
 * model's initialization gives it. A tensor's draws: two for each element
 * of a weight (Box-Muller), one of a LoRA A, none of a B; gpt-oss's biases,
 * 1-D, draw none and take no part. `before` is skipped at the window's
 * first expert tensor in the block, `after` once its last has drawn. */
typedef struct expert_skip {
    int first, last; /* the tensors' indices; -1: the block has none */
    uint64_t before, after;
} expert_skip;

static uint64_t init_draws(const model_tensor *t)
{
    if (t->ndim != 2 || t->lora == MODEL_LORA_B) return 0;
    return (t->lora == MODEL_LORA_A ? 1 : 2) * (uint64_t)t->numel;
}

static expert_skip expert_window_skip(const model_layout *l, int block)
{
    expert_skip k = {-1, -1, 0, 0};
    uint64_t draws = 0;
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *t = &l->tensors[i];
        if (t->block != block || !is_expert_role(t->role) || t->ndim != 2) continue;
        if (k.first < 0) k.first = i;
        k.last = i;
        draws += init_draws(t);
    }
    if (l->expert_count) {
        uint64_t per = draws / (uint64_t)l->expert_count;
        k.before = (uint64_t)l->expert_first * per;
        k.after = (uint64_t)(l->cfg.moe.experts - l->expert_first - l->expert_count) * per;
    }
    return k;
}

void tf_init_block_weights(const model_layout *l, int block, float *dst, uint64_t *rng)
{
    double proj_std = 0.02 / sqrt(2.0 * (l->n_layers > 0 ? l->n_layers : 1));
    expert_skip skip = expert_window_skip(l, block);
    /* the layout's tensors are in block order */
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *t = &l->tensors[i];
        if (t->block != block) continue;
        float *p = dst + t->offset;
        int is_norm = t->role == MODEL_ROLE_LN1_W || t->role == MODEL_ROLE_LN2_W ||
                      t->role == MODEL_ROLE_NORM_W || t->role == MODEL_ROLE_Q_NORM_W ||
                      t->role == MODEL_ROLE_K_NORM_W || t->role == MODEL_ROLE_POST_ATTN_NORM_W ||
                      t->role == MODEL_ROLE_POST_MLP_NORM_W || t->role == MODEL_ROLE_EMB_NORM_W ||
                      t->role == MODEL_ROLE_Q_A_NORM_W || t->role == MODEL_ROLE_KV_A_NORM_W;
        /* a norm multiplies by 1, which Gemma stores as the offset 0 (GemmaRMSNorm's zeros) */
        float one = zo_family_gemma(l->cfg.family) ? 0.0f : 1.0f;
        if (t->ndim == 1) {
            for (size_t e = 0; e < t->numel; e++) p[e] = is_norm ? one : 0.0f;
            continue;
        }
        double std = (t->role == MODEL_ROLE_ATTN_OUT_W || t->role == MODEL_ROLE_MLP_DOWN_W ||
                      t->role == MODEL_ROLE_EXPERT_DOWN_W)
                         ? proj_std
                         : 0.02;
        if (i == skip.first) *rng = zo_splitmix_skip(*rng, skip.before);
        /* splitmix is a counter: element e draws the two values after
         * 2e draws of the tensor, so the elements are independent (and the
         * values the sequential draw gives) */
        uint64_t s0 = *rng;
        tf_normal_fill(p, (long long)t->numel, s0, std);
        *rng = zo_splitmix_skip(s0, init_draws(t));
        if (i == skip.last) *rng = zo_splitmix_skip(*rng, skip.after);
    }
}

void tf_init_weights(const model_layout *l, float *const *host_blocks, uint64_t seed)
{
    uint64_t s = tf_init_rng(seed);
    for (int b = 0; b < l->n_blocks; b++) tf_init_block_weights(l, b, host_blocks[b], &s);
}

void tf_init_lora_block(const model_layout *adapters, int block, float *dst, uint64_t *rng)
{
    expert_skip skip = expert_window_skip(adapters, block);
    for (int i = 0; i < adapters->n_tensors; i++) {
        const model_tensor *t = &adapters->tensors[i];
        if (t->block != block) continue;
        if (i == skip.first) *rng = zo_splitmix_skip(*rng, skip.before);
        float *p = dst + t->offset;
        long long n = (long long)t->numel;
        if (t->lora == MODEL_LORA_B) { /* B = 0: the adapted model starts as the base */
            memset(p, 0, t->numel * sizeof *p);
        } else {
            /* A ~ U(-b, b), b = gain sqrt(3 / fan_in) with gain sqrt(2 / (1 + 5)):
             * b = 1 / sqrt(in); one draw per element, counter-based as above */
            double bound = 1.0 / sqrt((double)t->shape[1]);
            uint64_t s0 = *rng;
#pragma omp parallel for schedule(static) if (n > 65536)
            for (long long e = 0; e < n; e++) {
                uint64_t s = zo_splitmix_skip(s0, (uint64_t)e);
                double u = (zo_splitmix_next(&s) >> 11) / 9007199254740992.0; /* [0, 1) */
                p[e] = (float)((2.0 * u - 1.0) * bound);
            }
            *rng = zo_splitmix_skip(s0, init_draws(t));
        }
        if (i == skip.last) *rng = zo_splitmix_skip(*rng, skip.after);
    }
}
