/* Generation's memory and time (generate.h). Every line is an allocation of
 * the runtime `generate` runs on (transformer/generate.h): the weight stores
 * as offload/wstore.c makes them, the device slots of streamed blocks
 * (offload/stream.c), the two buffers a forward passes between blocks
 * (offload/actstore.c), and the model's forward buffers and key/value caches
 * (transformer.c, tf_options.kv_len). Device allocations are rounded up to
 * 256 bytes as the allocators take them; NVMe blocks start on 4096 bytes. */
#include "planner/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/nf4.h" /* defines: zo_nf4_bytes */

#define DEV_GRANULE 256u
#define NVME_BLOCK_ALIGN 4096u

static uint64_t r256(uint64_t x) { return (x + DEV_GRANULE - 1) / DEV_GRANULE * DEV_GRANULE; }
static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* Latent attention generated over its latent cache (plan_gen.mla_full_cache
 * 0): a row [k_pe | c_kv] of `latent_row` elements a position and layer,
 * one key head for every query head (transformer.c, mla_latent_attention) */
static int latent(const zo_model_config *m, const plan_gen *g) { return m->mla.kv_rank > 0 && !g->mla_full_cache; }
static uint64_t latent_row(const zo_model_config *m) { return (uint64_t)(m->mla.qk_rope + m->mla.kv_rank); }

void plan_gen_defaults(plan_gen *g)
{
    /* the reserved buffers of plan_train_defaults (planner/memory.c) */
    *g = (plan_gen){.batch = 1, .prompt = 128, .new_tokens = 128, .dtype = ZO_DTYPE_BF16,
                    .params_on = ZO_PLAN_GPU, .adapters_on = ZO_PLAN_GPU, .prefetch_depth = 2,
                    .sub_group = 1u << 20, .cuda_context = 512ull << 20, .cublas_workspace = 32ull << 20,
                    .fragmentation = 0.05};
}

/* ---- the blocks ------------------------------------------------------------------ */

/* A chain of blocks as the runtime stores one kind of weights: bytes of
 * each (embedding, a layer, the head; every layer alike but an MoE model's
 * n_dense dense first layers of `dense` bytes each: DeepSeek's), their
 * element size. */
typedef struct blocks {
    int nb;
    uint64_t first, layer, last; /* bytes */
    int n_dense;
    uint64_t dense;
} blocks;

static uint64_t blocks_total(const blocks *b)
{
    return b->first + (uint64_t)(b->nb - 2 - b->n_dense) * b->layer + (uint64_t)b->n_dense * b->dense + b->last;
}
static uint64_t blocks_largest(const blocks *b)
{
    return max_u64(max_u64(max_u64(b->first, b->layer), b->last), b->n_dense ? b->dense : 0);
}

/* What a store of b takes on NVMe: each block from a 4096-byte boundary and
 * the store's end on one (an empty block holds one element: `es`). */
static uint64_t blocks_nvme(const blocks *b, uint64_t es)
{
    uint64_t sz[4] = {b->first ? b->first : es, b->layer ? b->layer : es, b->last ? b->last : es,
                      b->dense ? b->dense : es};
    uint64_t a = NVME_BLOCK_ALIGN, r[4];
    for (int k = 0; k < 4; k++) r[k] = (sz[k] + a - 1) / a * a;
    return r[0] + (uint64_t)(b->nb - 2 - b->n_dense) * r[1] + (uint64_t)b->n_dense * r[3] + r[2];
}

/* Elements of layer `layer`'s adapters (its kind's: DeepSeek's dense first
 * layers have LLaMA's modules); mods its modules (*n), *n_u those whose
 * A x the runtime keeps, *expert_ad whether a routed expert's are among
 * them. */
static uint64_t layer_adapters(const zo_model_config *m, int layer, const zo_lora_config *lc,
                               zo_lora_module mods[ZO_LORA_MAX_MODULES], int *n, int *n_u, int *expert_ad)
{
    *n = zo_lora_layer_modules_at(m, layer, lc->targets, mods);
    *n_u = zo_lora_dense_modules(mods, *n, expert_ad);
    return zo_lora_layer_params(m, layer, lc->r, lc->targets);
}

/* ---- the lines ------------------------------------------------------------------- */

static void add(plan_gen_estimate *e, const char *name, zo_plan_tier tier, plan_kind kind, uint64_t bytes)
{
    if (!bytes) return;
    e->total[tier] += bytes; /* counted even when the list of lines is full */
    if (e->n_items < PLAN_GEN_MAX_ITEMS) e->items[e->n_items++] = (plan_item){name, tier, kind, bytes};
}

/* A GPU buffer no allocation of the runtime makes: in the total, and in
 * e->reserved. */
static void add_reserved(plan_gen_estimate *e, const char *name, uint64_t bytes)
{
    add(e, name, ZO_PLAN_GPU, PLAN_BUFFERS, bytes);
    e->reserved[ZO_PLAN_GPU] += bytes;
}

/* One weight store of `b` on `tier` (offload/wstore.c): resident on the GPU
 * (its pinned staging: two chunks of min(sub_group, the largest block)
 * elements), all of it in pinned host memory, or on NVMe (a pinned block
 * to assemble writes and a read-ahead ring of `ring` blocks, each a slot's
 * size). */
static void store(plan_gen_estimate *e, const char *name, const char *staging, const blocks *b, uint64_t es,
                  zo_plan_tier tier, uint64_t chunk, uint64_t slot, int ring)
{
    uint64_t total = blocks_total(b), largest = blocks_largest(b) / es;
    switch (tier) {
    case ZO_PLAN_GPU:
        add(e, name, ZO_PLAN_GPU, PLAN_PARAMS, r256(total));
        add(e, staging, ZO_PLAN_CPU, PLAN_BUFFERS, 2 * (largest && chunk > largest ? largest : chunk) * es);
        break;
    case ZO_PLAN_CPU: add(e, name, ZO_PLAN_CPU, PLAN_PARAMS, total); break;
    default:
        add(e, name, ZO_PLAN_NVME, PLAN_PARAMS, blocks_nvme(b, es));
        add(e, staging, ZO_PLAN_CPU, PLAN_BUFFERS, (uint64_t)(1 + ring) * slot);
        break;
    }
}

/* The model's forward buffers for batch x rows new tokens (transformer.c's
 * generation buffers, each rounded as allocated), its caches apart. An MoE
 * model's dense MLP buffers are its shared expert's (none: Mixtral), and
 * its layers share one set of the router's and the experts' buffers for
 * those tokens: the router's logits and weights [N, E] fp32, the top_k
 * pairs of each token (inputs, outputs [N k, h], the experts' gate, up and
 * activation [N k, expert_ffn], their tokens and weights), the weighted
 * activation, the shared gate, every layer's router statistics; with
 * adapters on the routed experts (expert_ad), one expert's A x. Gemma-2's
 * two output norms share one input and one 1/rms (nothing is kept). Latent
 * attention's q|k|v and output are heads of qk_nope + qk_rope (head_dim)
 * with its own buffers beside them; over the latent cache, q|k|v holds H
 * absorbed queries and the row twice (key, value), the output H heads of
 * the row's width, at B rows (the absorbed form: a token of each sequence,
 * a longer call in chunks of B rows), and the decompressed form
 * (transformer.c, mla_decompressed: the prompt) takes the full cache's
 * q|k|v, c_kv copy and kv_b output at N rows and its keys and values
 * [N, 2 hkv d] beside them; with an adapter on kv_b_proj, its terms in the
 * absorbed form [B, H, r]; each new row's position. */
static uint64_t forward_buffers(const zo_model_config *m, const plan_gen *g, int rows, int lora_cols, int expert_ad,
                                uint64_t wdq)
{
    uint64_t B = (uint64_t)g->batch, N = B * (uint64_t)rows, es = zo_dtype_size(g->dtype);
    const zo_moe *mo = &m->moe;
    uint64_t E = (uint64_t)mo->experts, K = (uint64_t)mo->top_k, fe = (uint64_t)mo->expert_ffn;
    /* (the MLP's width: an MoE layer's shared expert's, or DeepSeek's dense first layers' if wider) */
    uint64_t fs = (uint64_t)mo->shared_ffn, fd = !E || mo->first_dense ? (uint64_t)m->ffn : 0;
    uint64_t h = (uint64_t)m->hidden, f = max_u64(fs, fd), d = (uint64_t)m->head_dim;
    uint64_t widest = max_u64(fs, K * fe), r = g->method != ZO_PLAN_FULL ? (uint64_t)g->lora.r : 0;
    uint64_t qkv = (uint64_t)(m->n_heads + 2 * m->n_kv_heads) * d, q = (uint64_t)m->n_heads * d;
    int layers = m->n_layers > 0, llama = m->arch != ZO_ARCH_GPT, post = zo_model_post_norms(m);
    uint64_t pre = (uint64_t)(layers && zo_model_pre_norms(m)); /* (OLMo-2: no ln1, ln2) */
    /* a second norm (not Falcon-7B's one for both) and the residual between
     * the attention and the MLP (not where the two run in parallel) */
    uint64_t pre2 = pre * (uint64_t)(m->layer_norms != 1), mid = (uint64_t)(layers && !m->parallel_block);
    const int lat = latent(m, g);
    const uint64_t H = (uint64_t)m->n_heads, kvr = (uint64_t)m->mla.kv_rank;
    const uint64_t kvw = H * (uint64_t)(m->mla.qk_nope + m->mla.v_dim);
    /* (over the latent cache the absorbed form's at B rows: a token of each sequence) */
    const uint64_t qkv_n = lat ? max_u64(N * qkv, B * (H + 2) * latent_row(m)) : N * qkv;
    const uint64_t q_n = lat ? max_u64(N * q, B * H * latent_row(m)) : N * q;
    int kvb_ad = lat && g->method != ZO_PLAN_FULL && (g->lora.targets & (ZO_LORA_K | ZO_LORA_V));
    int rotary = llama || m->pos == ZO_POS_ROTARY; /* GPT-NeoX's and Falcon's too */
    uint64_t a[] = {
        N * 4, B * 4,                                           /* tokens, positions */
        pre * N * h * es, pre * N * 4, pre * N * 4,             /* ln1, its mean and rstd */
        layers * qkv_n * es, layers * q_n * es,                 /* qkv, attention */
        mid * N * h * es, pre2 * N * h * es,                    /* the residual between, ln2 */
        layers * post * N * h * es, layers * post * N * 4,      /* Gemma-2: an output norm's input, 1/rms */
        pre2 * N * 4, pre2 * N * 4,                             /* ln2's mean and rstd */
        layers * N * f * es, layers * llama * N * f * es, layers * N * f * es, /* fc/gate, up, act */
        layers * N * (uint64_t)lora_cols * es,                  /* the adapters' A x */
        N * h * es,                                             /* a projection's scratch */
        B * h * es, B * h * es, B * 4, B * 4,                   /* the rows read out, the final norm */
        B * (uint64_t)m->vocab * 4,                             /* fp32 logits */
        wdq,                                                    /* QLoRA: a dequantized weight */
        rotary && m->rope_scaling[0] ? (uint64_t)zo_model_rope_dim(m) / 2 * 8 : 0, /* a rope_scaling's
                                                                 frequencies (the rotated part's) */
        zo_family_gemma(m->family) ? 2 * max_u64(h, m->qk_norm ? d : 0) * 4 : 0, /* Gemma: ones, 1 + w (fp32) */
        layers * N * E * 4, layers * N * E * 4,                 /* MoE: router logits, weights */
        layers * K * N * fe * es, layers * K * N * fe * es,     /* the experts' gate, up */
        layers * K * N * fe * es,                               /* and activation */
        layers * K * N * 4, layers * K * N * 4,                 /* the pairs' tokens, weights */
        layers * (mo->shared_gate ? N * 4 : 0),                 /* the shared expert's gate */
        /* latent attention: q_a's output, c_kv, the output narrowed to v, kv_a's and kv_b's outputs */
        layers * N * (uint64_t)m->mla.q_rank * es, layers * N * kvr * es,
        layers * (m->mla.kv_rank ? N * (uint64_t)m->n_heads * (uint64_t)m->mla.v_dim * es : 0),
        layers * (m->mla.kv_rank ? N * (uint64_t)(m->mla.kv_rank + m->mla.qk_rope) * es : 0),
        layers * (m->mla.kv_rank ? N * kvw * es : 0),
        layers * lat * N * 2 * (uint64_t)m->n_kv_heads * d * es, /* the decompressed keys, values */
        layers * kvb_ad * B * H * r * es,                       /* the absorbed form's kv_b adapter terms */
        (uint64_t)lat * N * 4,                                  /* the rows' positions */
        (uint64_t)m->n_layers * 2 * E * 4,                      /* router statistics */
        mo->router_bias ? (uint64_t)m->n_layers * E * 4 : 0,    /* DeepSeek-V3's router score corrections */
        E ? N * widest * es : 0,                                /* the weighted activation */
        K * N * h * es, K * N * h * es,                         /* the pairs' inputs, outputs */
        expert_ad ? N * r * es : 0,         /* an expert adapter's A x (an expert's rows: at most N) */
    };
    uint64_t sum = 0;
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) sum += a[i] ? r256(a[i]) : 0;
    return sum;
}

/* ---- time ------------------------------------------------------------------------ */

/* The routed experts an MoE layer's forward of `rows` tokens touches: each
 * token routes to top_k, so at most min(experts, rows x top_k) (the bound
 * memplan takes: routing spread over the experts, as load balancing trains
 * it to be; fewer when tokens agree). 0 for a dense model. */
static double touched(const zo_model_config *m, double rows)
{
    double pairs = rows * m->moe.top_k;
    return pairs < m->moe.experts ? pairs : m->moe.experts;
}

/* A matmul of F FLOPs moving `bytes`: the cost model's roofline. */
static double roofline(const plan_hw *hw, zo_dtype dt, double F, double bytes)
{
    double peak = dt == ZO_DTYPE_F32 ? hw->peak_flops_32 : hw->peak_flops_16;
    double eff = plan_hw_gemm_eff(hw, F);
    double t_f = peak > 0 && eff > 0 ? F / (peak * eff) : 0.0;
    double t_b = bytes / (hw->hbm_bw * (hw->hbm_eff > 0 ? hw->hbm_eff : 1.0));
    return t_f > t_b ? t_f : t_b;
}

/* The GPU's work of one forward over `rows` new tokens a sequence (batch
 * sequences), each query reading `keys` cache rows on average (over the
 * latent cache, `absorbed`: the absorbed form; 0: the prompt's decompressed
 * form, the full cache's work), per block:
 * part[0] the embedding, part[1] one layer (its matmuls and, with
 * adapters, theirs; with QLoRA each weight dequantized first; the
 * attention over the cache; the elementwise passes), part[2] the head on
 * one row a sequence. Returns the whole forward's. */
static double forward_time(const zo_model_config *m, const plan_hw *hw, const plan_gen *g, double rows,
                           double keys, int absorbed, const zo_lora_module *mods, int n_mods, double part[3])
{
    const double B = g->batch, es = (double)zo_dtype_size(g->dtype), M = B * rows;
    const zo_moe *mo = &m->moe;
    const double E = mo->experts, K = mo->top_k, fe = mo->expert_ffn, P = M * K, T = touched(m, M);
    const double h = m->hidden, f = E ? mo->shared_ffn : m->ffn, d = m->head_dim, hq = m->n_heads;
    const double hkv = m->n_kv_heads, qkv = (hq + 2 * hkv) * d, q = hq * d;
    int llama = m->arch != ZO_ARCH_GPT, nf4 = g->method == ZO_PLAN_QLORA;
    /* latent attention's projections, as the runtime runs them (cost.c's
     * attn_proj_time): q_proj, or q_a_proj and q_b_proj; kv_a_proj_with_mqa
     * [k_pe | c_kv]; kv_b_proj over c_kv, except in the absorbed form, whose
     * attention term below reads its weight; o_proj from H v */
    const int mla = m->mla.kv_rank > 0, absorb = latent(m, g) && absorbed;
    const double qr = m->mla.q_rank, kvr = m->mla.kv_rank, nope = m->mla.qk_nope, vd = m->mla.v_dim;
    const double kvw = hq * (nope + vd);
    uint64_t uq, uk, uv, uo;
    zo_model_attn_widths(m, &uq, &uk, &uv, &uo);
    /* out, in, the matrices of that shape, the rows through each, the copies
     * of its weight read: q|k|v (latent attention's q_a, q or q_b, kv_a,
     * kv_b), o, the MLP's (an MoE layer's shared expert's: its gate and up,
     * its down), and an MoE layer's router, the routed experts' gate and up,
     * their down (on the P = M top_k pairs, each pair through one expert: T
     * experts' weights read), the shared gate */
    enum { LIN_ROUTER = 8, LIN_SHARED_GATE = 11 };
    double lin[][5] = {{mla ? 0 : qkv, h, 1, M, 1},
                       {qr, h, 1, M, 1},
                       {mla ? (double)uq : 0, qr > 0 ? qr : h, 1, M, 1},
                       {mla ? kvr + m->mla.qk_rope : 0, h, 1, M, 1},
                       {mla && !absorb ? kvw : 0, kvr, 1, M, 1},
                       {h, (double)uo, 1, M, 1},
                       {f, h, llama ? 2 : 1, M, 1},
                       {h, f, 1, M, 1},
                       {E, h, 1, M, 1},
                       {fe, h, 2, P, T},
                       {h, fe, 1, P, T},
                       {mo->shared_gate, h, 1, M, 1}};
    double layer = 0;
    for (size_t k = 0; k < sizeof lin / sizeof lin[0]; k++) {
        double w = lin[k][0] * lin[k][1], rows_k = lin[k][3], copies = lin[k][4];
        int nf4_k = nf4 && k != LIN_ROUTER && k != LIN_SHARED_GATE; /* QLoRA keeps these two 16-bit */
        for (int i = 0; w > 0 && copies > 0 && i < (int)lin[k][2]; i++) {
            if (nf4_k) /* the NF4 tensor read, the 16-bit weight written */
                layer += copies * ((double)zo_nf4_bytes((uint64_t)w) + w * es) / (hw->hbm_bw * hw->hbm_eff);
            layer += roofline(hw, g->dtype, 2 * rows_k * w, copies * w * es + rows_k * (lin[k][0] + lin[k][1]) * es);
        }
    }
    for (int j = 0; j < n_mods; j++) { /* u = x A^T, y += s u B^T: a routed expert's on its pairs */
        double r = g->lora.r, in = (double)mods[j].in, out = (double)mods[j].out;
        if (absorb && mods[j].latent == ZO_LORA_LATENT_KV_B) {
            /* the absorbed form's terms (transformer.c's
             * mla_kvb_adapter_terms), four batched GEMMs over the H heads:
             * u_h = q_nope_h B_K_h, q'_h += s u_h A; u_h = o_h A^T,
             * out_h += s u_h B_V_h^T (A and the B rows read once) */
            layer += roofline(hw, g->dtype, 2 * M * hq * nope * r, (hq * nope * r + M * hq * (nope + r)) * es);
            layer += roofline(hw, g->dtype, 2 * M * hq * r * kvr, (r * kvr + M * hq * (r + 2 * kvr)) * es);
            layer += roofline(hw, g->dtype, 2 * M * hq * kvr * r, (r * kvr + M * hq * (kvr + r)) * es);
            layer += roofline(hw, g->dtype, 2 * M * hq * r * vd, (hq * vd * r + M * hq * (r + 2 * vd)) * es);
            continue;
        }
        double rows_j = mods[j].experts ? P : M, n = mods[j].experts ? T : 1;
        layer += roofline(hw, g->dtype, 2 * rows_j * r * in, (n * r * in + rows_j * (in + r)) * es);
        layer += roofline(hw, g->dtype, 2 * rows_j * r * out, (n * r * out + rows_j * (r + 2 * out)) * es);
    }
    /* attention: each query against its keys, the cache's keys and values read;
     * over the latent cache one row of D a key and value for every head, and
     * kv_b_proj's key rows absorbed into each query, its value rows applied to
     * each head's output */
    if (absorb) { /* (kv_b_proj's weight read here once: QLoRA's dequantized first) */
        const double D = (double)latent_row(m);
        layer += roofline(hw, g->dtype, 4 * M * keys * hq * D, B * (keys + rows) * D * es + 2 * M * hq * D * es);
        if (nf4) layer += ((double)zo_nf4_bytes((uint64_t)(kvw * kvr)) + kvw * kvr * es) / (hw->hbm_bw * hw->hbm_eff);
        /* kv_b_proj's key rows into the queries, q_nope_h W_UK_h, and its
         * value rows onto the output, o_h W_UV_h^T: two batched GEMMs over
         * the heads, each its weight rows, its input and its output */
        layer += roofline(hw, g->dtype, 2 * M * hq * nope * kvr, (hq * nope * kvr + M * hq * (nope + kvr)) * es);
        layer += roofline(hw, g->dtype, 2 * M * hq * vd * kvr, (hq * vd * kvr + M * hq * (kvr + vd)) * es);
    } else {
        layer += roofline(hw, g->dtype, 4 * M * keys * hq * d, B * (keys + rows) * 2 * hkv * d * es + 2 * M * q * es);
    }
    /* norms, residual adds, activation, RoPE: elements read and written (an
     * MoE layer's pairs: their activation, weighting, gather and scatter) */
    layer += (M * (10 * h + 3 * f + 2 * qkv) + P * (4 * fe + 3 * h)) * es / (hw->hbm_bw * hw->hbm_eff);
    double V = m->vocab;
    double head = roofline(hw, g->dtype, 2 * B * h * V, V * h * es + B * (h * es + V * 4));
    double embed = 2 * M * h * es / (hw->hbm_bw * hw->hbm_eff);
    part[0] = embed, part[1] = layer, part[2] = head;
    return m->n_layers * layer + head + embed;
}

/* ---- the pipeline ------------------------------------------------------------------ */

/* What one block costs the pipeline, by its kind (embedding, a layer, the
 * head), in seconds: reading its weights from disk (at the idle rate),
 * copying them to the device, its compute in the prompts' forward and in a
 * token's. (A tied head's reuse of the embedding block is not modelled:
 * each block is moved once a forward, as stream_bytes counts.) */
typedef struct sim_block {
    double disk, copy, copy_prompt, prompt, token; /* copy_prompt: the prompts' forward's (an MoE layer's
                                                       experts apart: those its tokens touch) */
} sim_block;

/* the prompts' forward, then tokens: the two before the last are the
 * steady state (the last reads nothing ahead for a token after it) */
#define SIM_TOKENS 6

/* The runtime's schedule of a generation (offload/stream.c), block by block
 * over the prompts' forward and SIM_TOKENS - 1 tokens. The host thread, at
 * each block: waits until the block two back has run; prefetches up to
 * `depth` blocks ahead, reading each streamed block from disk itself
 * (synchronously, into a read-ahead buffer, after that buffer's last copy)
 * and queueing its copy to a device slot (after the read, the copies before
 * it, and the compute of the block that last held the slot, `slots` back);
 * waits for this block's copy; queues its compute (after the block before
 * it). At each forward's end it waits for the logits (it samples the next
 * token from them), so nothing past the next forward's first `depth`
 * blocks is read or copied until the head has run: the logits wait. A read
 * takes its idle time x `busy_factor` (the disk beside the forward) once
 * the forward has started, its idle time before (the prompts' first
 * blocks, read before any compute is queued). On the CPU backend (`host`)
 * copies and compute share the cores: one resource taking them in the
 * order they are queued. Returns the end of the prompts' forward (*ttft)
 * and the time a token in the steady state (*token). */
static zo_status simulate(const sim_block kind[3], int n_layers, int depth, int slots, double busy_factor, int host,
                          double *ttft, double *token)
{
    int nb = n_layers + 2, np = SIM_TOKENS * nb;
    double *R = malloc(3 * (size_t)np * sizeof *R), *C = R + np, *F = C + np; /* read, copy, compute: ends */
    if (!R) return zo_error(ZO_ERR_NOMEM, "memplan generate: the schedule of %d blocks: out of memory", np);
    double H = 0, D = 0, end[SIM_TOKENS]; /* the host thread's time, when the CPU backend's cores are free */
#define KIND(q) (&kind[(q) % nb == 0 ? 0 : (q) % nb == nb - 1 ? 2 : 1])
#define MAX2(a, b) ((a) > (b) ? (a) : (b))
    int next = 0; /* the next position to fetch */
    for (int p = 0; p < np; p++) {
        int t = p / nb;
        if (p >= 2) H = MAX2(H, F[p - 2]);
        for (; next < np && next <= p + depth; next++) {
            int q = next;
            const sim_block *k = KIND(q);
            if (k->disk > 0) {
                if (q >= slots) H = MAX2(H, C[q - slots]); /* the read-ahead buffer's last copy */
                H += k->disk * (p > 0 ? busy_factor : 1.0);
            }
            R[q] = H;
            double start = MAX2(R[q], q >= slots ? F[q - slots] : 0.0);
            start = MAX2(start, host ? D : q > 0 ? C[q - 1] : 0.0);
            C[q] = start + (q < nb ? k->copy_prompt : k->copy);
            if (host) D = C[q];
        }
        H = MAX2(H, C[p]); /* the weights are on the device */
        double start = MAX2(H, p > 0 ? F[p - 1] : 0.0);
        F[p] = MAX2(start, host ? D : 0.0) + (t ? KIND(p)->token : KIND(p)->prompt);
        if (host) D = F[p];
        if (p % nb == nb - 1) { /* the logits: the host samples the next token */
            end[t] = F[p];
            H = MAX2(H, F[p]);
        }
    }
#undef KIND
#undef MAX2
    free(R);
    *ttft = end[0];
    *token = (end[SIM_TOKENS - 2] - end[SIM_TOKENS - 4]) / 2.0;
    return ZO_OK;
}

/* The "GPU" is the host's CPU (plan_hw_cpu_backend's description of the CPU
 * backend): its copies to and from "device" memory and its NVMe reads run
 * on the same cores and memory as its compute. */
static int device_is_host(const plan_hw *hw) { return !strcmp(hw->gpu, "CPU"); }

/* ---- the estimate ---------------------------------------------------------------- */

static zo_status check(const zo_model_config *m, const plan_gen *g)
{
    if (m->params_override)
        return zo_error(ZO_ERR_INVALID, "generation needs the model's shape: a model known only by its size "
                        "(--params) has no layers to stream");
    zo_status st = zo_model_config_runtime_check(m);
    if (st != ZO_OK) return st;
    if (g->batch < 1 || g->prompt < 1 || g->new_tokens < 1 || g->prompt_buffers < 0 ||
        (g->prompt_buffers && g->prompt_buffers < g->prompt))
        return zo_error(ZO_ERR_INVALID, "generation: %d sequences, a prompt of %d and %d new tokens (each >= 1)",
                        g->batch, g->prompt, g->new_tokens);
    if (m->arch == ZO_ARCH_GPT && g->prompt + g->new_tokens > m->max_seq)
        return zo_error(ZO_ERR_INVALID, "generation: a prompt of %d and %d new tokens need %d positions, past the "
                        "%d learned positions of %s", g->prompt, g->new_tokens, g->prompt + g->new_tokens,
                        m->max_seq, m->name);
    if (g->prefetch_depth < 1 || g->prefetch_depth > ZO_PLAN_MAX_PREFETCH)
        return zo_error(ZO_ERR_INVALID, "generation: prefetch %d outside [1, %d]", g->prefetch_depth,
                        ZO_PLAN_MAX_PREFETCH);
    if (g->method != ZO_PLAN_FULL) return zo_lora_check(m, &g->lora);
    return ZO_OK;
}

zo_status plan_gen_estimate_run(const zo_model_config *m, const plan_hw *hw, const plan_gen *g,
                                plan_gen_estimate *e)
{
    memset(e, 0, sizeof *e);
    zo_status st = check(m, g);
    if (st != ZO_OK) return st;
    const uint64_t es = zo_dtype_size(g->dtype), L = (uint64_t)m->n_layers;
    const int adapters = g->method != ZO_PLAN_FULL, nb = m->n_layers + 2;
    e->context = g->prompt + g->new_tokens;

    /* the weights: the model's blocks, or a frozen base (its format) and adapters */
    zo_param_counts pc;
    zo_model_param_counts(m, &pc);
    /* (an MoE model's dense first layers: DeepSeek's, blocks of their own size) */
    int n_dense = m->moe.experts ? m->n_layers - pc.moe_layers : 0;
    zo_layer_params dl;
    zo_model_layer_params(m, 0, &dl);
    blocks w = {nb, pc.embedding * es, pc.per_layer * es, (pc.final_norm + pc.head) * es, n_dense, dl.total * es};
    blocks base = w, ad = {nb, 0, 0, 0, n_dense, 0};
    zo_lora_module mods[ZO_LORA_MAX_MODULES]; /* (an MoE layer's, for the time) */
    int n_mods = 0, dense_mods = 0, expert_ad = 0;
    uint64_t wdq = 0;
    if (adapters) {
        plan_train t;
        plan_train_defaults(&t, m);
        t.dtype = t.grad_dtype = g->dtype;
        t.method = g->method;
        t.lora = g->lora;
        plan_peft p;
        plan_peft_stage(m, &t, 0, &p);
        int moe = m->moe.experts > 0;
        base = (blocks){nb, p.first_frozen, p.kind_frozen[moe], p.last_frozen, n_dense, p.kind_frozen[0]};
        /* the runtime keeps the A x of the wider kind's dense modules */
        ad.layer = layer_adapters(m, m->n_layers - 1, &g->lora, mods, &n_mods, &dense_mods, &expert_ad) * es;
        if (n_dense) {
            zo_lora_module dmods[ZO_LORA_MAX_MODULES];
            int n0, u0, x0;
            ad.dense = layer_adapters(m, 0, &g->lora, dmods, &n0, &u0, &x0) * es;
            if (u0 > dense_mods) dense_mods = u0;
        }
        /* QLoRA dequantizes each linear weight into one scratch as large as
         * the widest, as the runtime sizes it (zo_lora_dequant_elems) */
        if (g->method == ZO_PLAN_QLORA) wdq = zo_lora_dequant_elems(m) * es;
        w = ad;
    }
    /* an MoE layer's routed experts stream apart from its dense part where
     * the runtime does it (offload/offload.c: the whole weights in pinned
     * host memory, no frozen base): a slot holds the largest dense part, two
     * expert slots one routed expert each, and a forward copies the dense
     * parts and the experts it touches (touched(): at most top_k a token) */
    zo_layer_params lp; /* (an MoE layer's; DeepSeek's dense first layers stream whole) */
    zo_model_layer_params(m, m->n_layers - 1, &lp);
    int apart = lp.experts && !adapters && g->params_on == ZO_PLAN_CPU;
    uint64_t expert_b = apart ? lp.expert * es : 0, layer_dense = w.layer - (uint64_t)lp.experts * expert_b;
    blocks dense = {nb, w.first, layer_dense, w.last, w.n_dense, w.dense};
    /* the stores, the device slots of what streams (offload/offload.c, stream.c) */
    zo_plan_tier w_on = adapters ? g->adapters_on : g->params_on;
    int w_streamed = w_on != ZO_PLAN_GPU, b_streamed = adapters && g->params_on != ZO_PLAN_GPU;
    int slots = g->prefetch_depth + 1;
    if (m->tied_embeddings && slots < 2) slots = 2;
    if (slots > nb) slots = nb;
    uint64_t w_slot = max_u64(blocks_largest(&dense), DEV_GRANULE), b_slot = r256(blocks_largest(&base));
    if (adapters) {
        store(e, "frozen base", "frozen base staging (pinned)", &base, 1, g->params_on, g->sub_group, b_slot, slots);
        store(e, "LoRA adapters (A, B)", "adapter staging (pinned)", &ad, es, g->adapters_on, g->sub_group, w_slot,
              slots);
    } else {
        store(e, "weights", "weight staging (pinned)", &w, es, g->params_on, g->sub_group, w_slot, slots);
    }
    if (w_streamed || b_streamed)
        add(e, "weight slots (streamed blocks)", ZO_PLAN_GPU, PLAN_BUFFERS,
            (uint64_t)slots * r256((b_streamed ? b_slot : 0) + (w_streamed ? w_slot : 0)));
    if (apart) add(e, "expert slots (2 x routed expert)", ZO_PLAN_GPU, PLAN_BUFFERS, PLAN_EXPERT_SLOTS * r256(expert_b));
    /* the key/value caches, the forward's buffers, the two boundaries */
    /* (latent attention over its latent cache: one buffer a layer) */
    const uint64_t parts = latent(m, g) ? 1 : 2;
    const uint64_t row = latent(m, g) ? latent_row(m) : 2 * (uint64_t)m->n_kv_heads * m->head_dim;
    e->kv_cache = L * (uint64_t)g->batch * (uint64_t)e->context * row * es;
    add(e, latent(m, g) ? "latent cache [k_pe | c_kv]" : "key/value cache", ZO_PLAN_GPU, PLAN_ACTIVATIONS,
        L ? parts * L * r256(e->kv_cache / (parts * L)) : 0);
    /* (longrope's crossing: one forward of original + 1 tokens a sequence) */
    int rows = zo_model_longrope_rows(m, g->prompt_buffers ? g->prompt_buffers : g->prompt, e->context);
    e->longrope_rows = g->prompt <= m->rope_original_max && zo_model_longrope_switches(m, e->context)
                           ? m->rope_original_max + 1 : 0;
    add(e, "forward buffers (one layer, logits)", ZO_PLAN_GPU, PLAN_ACTIVATIONS,
        forward_buffers(m, g, rows, dense_mods * g->lora.r, expert_ad, wdq));
    add(e, "block boundaries (two)", ZO_PLAN_GPU, PLAN_ACTIVATIONS,
        (uint64_t)(nb - 1 < 2 ? nb - 1 : 2) * r256((uint64_t)g->batch * rows * m->hidden * es));
    /* what the GPU itself takes */
    add_reserved(e, "CUDA context", g->cuda_context);
    add_reserved(e, "cuBLAS workspace", g->cublas_workspace);
    add_reserved(e, "allocator fragmentation", (uint64_t)(g->fragmentation * (double)e->total[ZO_PLAN_GPU]));
    int per_node = plan_hw_ranks_per_node(hw);
    e->capacity[ZO_PLAN_GPU] = hw->gpu_mem;
    e->capacity[ZO_PLAN_CPU] = hw->cpu_mem / (uint64_t)per_node;
    e->capacity[ZO_PLAN_NVME] = hw->nvme / (uint64_t)per_node;
    e->fits = 1;
    for (int t = 0; t < ZO_PLAN_TIERS; t++) e->fits &= e->total[t] <= e->capacity[t];

    /* time: the weights streamed each token through the links they cross */
    e->weight_bytes = blocks_total(&base) + (adapters ? blocks_total(&ad) : 0);
    e->stream_bytes = (b_streamed || (!adapters && w_streamed) ? blocks_total(&base) : 0) +
                      (adapters && w_streamed ? blocks_total(&ad) : 0);
    /* experts apart: a token's forward (one row a sequence) copies the dense
     * parts and the experts it touches, the prompts' its own */
    uint64_t tok_experts = (uint64_t)touched(m, g->batch) * expert_b;
    uint64_t prompt_experts = (uint64_t)touched(m, (double)g->batch * g->prompt) * expert_b;
    if (apart) e->stream_bytes = blocks_total(&dense) + (L - (uint64_t)n_dense) * tok_experts;
    e->experts_apart = apart;
    e->experts_token = (int)touched(m, g->batch);
    e->experts_prompt = (int)touched(m, (double)g->batch * g->prompt);
    e->nvme_bytes = (g->params_on == ZO_PLAN_NVME ? blocks_total(&base) : 0) +
                    (adapters && g->adapters_on == ZO_PLAN_NVME ? blocks_total(&ad) : 0);
    double pcie = e->stream_bytes / hw->pcie_bw, disk = e->nvme_bytes ? e->nvme_bytes / hw->nvme_read_bw : 0.0;
    /* a token: one row a sequence against the cache, on average halfway */
    double keys = g->prompt + (g->new_tokens - 1) / 2.0 + 1.0;
    e->kv_read = (uint64_t)((double)g->batch * keys * (double)L * (double)row * es);
    double tok_part[3], prompt_part[3];
    e->compute_s = forward_time(m, hw, g, 1.0, keys, 1, mods, n_mods, tok_part);
    double device = e->compute_s + (device_is_host(hw) ? pcie : 0.0);
    /* On the CPU backend the reads share the cores with the forward: while
     * the cores compute (the device's work of a token, or all of the reads
     * when that is longer) the disk gives its busy rate (calibrate's read
     * beside a triad on every thread), the rest of the time its idle rate:
     * N / idle + overlap x (1 - busy / idle) for N bytes. A GPU's forward
     * leaves the host's cores alone: the idle rate. */
    double disk_idle = disk;
    if (device_is_host(hw) && disk > 0 && hw->nvme_read_bw_busy > 0 && hw->nvme_read_bw_busy < hw->nvme_read_bw) {
        double all_busy = e->nvme_bytes / hw->nvme_read_bw_busy;
        disk += (device < all_busy ? device : all_busy) * (1.0 - hw->nvme_read_bw_busy / hw->nvme_read_bw);
    }
    /* the disk, the host link and the GPU work on different blocks at once
     * (prefetch): the busiest sets the pace. On the CPU backend the copies
     * run on the cores and the memory the compute runs on: one resource */
    e->link_s = pcie > disk ? pcie : disk;
    double link = device_is_host(hw) ? disk : e->link_s;
    e->pace_s = device > link ? device : link;
    e->bound = device >= link ? (device_is_host(hw) && pcie > 0 ? "compute+copies" : "compute")
               : disk >= pcie ? "nvme" : "pcie";
    /* the prompts' forward: each query reads half the prompt on average;
     * over the latent cache it attends decompressed (at position 0 its FLOPs
     * are the fewer: transformer.c, mla_decompressed) */
    e->prompt_compute_s =
        forward_time(m, hw, g, g->prompt, (g->prompt + 1) / 2.0, 0, mods, n_mods, prompt_part);
    if (e->longrope_rows) {
        double part[3], r = e->longrope_rows;
        e->longrope_s = forward_time(m, hw, g, r, (r + 1) / 2.0, 0, mods, n_mods, part);
        if (e->longrope_s < e->link_s) e->longrope_s = e->link_s;
    }
    /* the pipeline block by block: what it adds to the pace (the logits
     * wait at each token's end), and the first tokens' time */
    sim_block kind[3];
    const uint64_t bb[3] = {base.first, base.layer, base.last}, ab[3] = {ad.first, ad.layer, ad.last};
    int base_disk = g->params_on == ZO_PLAN_NVME, ad_disk = adapters && g->adapters_on == ZO_PLAN_NVME;
    int base_copy = b_streamed || (!adapters && w_streamed), ad_copy = adapters && w_streamed;
    for (int k = 0; k < 3; k++) {
        double rd = (double)((base_disk ? bb[k] : 0) + (ad_disk ? ab[k] : 0));
        double cp = (double)((base_copy ? bb[k] : 0) + (ad_copy ? ab[k] : 0)), cp_prompt = cp;
        if (apart && k == 1) { /* a layer's dense part and the experts the forward touches */
            cp = (double)(layer_dense + tok_experts);
            cp_prompt = (double)(layer_dense + prompt_experts);
        }
        kind[k] = (sim_block){rd / hw->nvme_read_bw, cp / hw->pcie_bw, cp_prompt / hw->pcie_bw, prompt_part[k],
                              tok_part[k]};
    }
    if ((st = simulate(kind, m->n_layers, g->prefetch_depth, slots, disk > 0 ? disk / disk_idle : 1.0, device_is_host(hw),
                       &e->ttft_s, &e->s_per_token)) != ZO_OK)
        return st;
    /* (the sum of the blocks' times rounds: never below the slowest, and a
     * difference below the rounding is none) */
    if (e->s_per_token < e->pace_s * (1 + 1e-12)) e->s_per_token = e->pace_s;
    e->stall_s = e->s_per_token - e->pace_s;
    e->tokens_per_s = g->batch / e->s_per_token;
    return ZO_OK;
}
