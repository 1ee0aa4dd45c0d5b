/* Capacity-limited MoE routing (tf_options.capacity_factor) in one MoE
 * layer on the CPU backend in fp32, against a plain double-precision
 * reference of the layer's MoE block written here: RMSNorm (Phi-3.5-MoE:
 * LayerNorm with a bias), the router (softmax, top_k with ties to the
 * lower index, Mixtral's renormalized or Qwen2-MoE's raw weights;
 * Phi-3.5-MoE's sparsemixer in its eval form), the capacity
 * C = ceil(F N top_k / E) per expert with every token's first choice
 * before any token's second (choice rank: the order the router chose the
 * token's experts; tokens in order within a rank), the kept pairs' SwiGLU
 * experts weighted and summed, Qwen2-MoE's gated shared expert, and the
 * backward of all of it.
 *
 * The layer's attention output projection is zero, so the layer is
 * out = x + moe(norm(x)); the loss is sum(out * G) for a fixed G (the
 * gradient the layer's backward receives). Checked: that loss, dL/dx, the
 * gradients of the router, every expert, the shared expert, its gate and
 * the norm, and the pairs routed and dropped (tf_model.moe_pairs,
 * moe_dropped). The routing is skewed (two tokens of three prefer expert
 * 0 and then 3, the third prefers 3: first and second choices meet at
 * expert 3) and
 * two router rows are equal (exact ties in the router's weights); N = 7
 * tokens, a multiple of neither model's experts. Factors 0.5, 1.0 and
 * 1.25 drop, 8 never does, 0 is dropless; 0.5 also with the layer
 * recomputed before its backward (it routes again, uncounted).
 *
 * The sparsemixer's second weight can exceed its first (w1 a softmax over
 * the logits near the top, w2 one over those near the second: often w2
 * alone, 1; at a tie of the top two logits always), so its choice order is
 * not its weights' order: the Phi-3.5-MoE cases hold tokens whose w2 > w1
 * (the tied router rows among them) and drop first and second choices
 * both, so ranking a token's pairs by weight fails them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/lora.h"             /* defines: zo_lora_check, zo_lora_trainable_params */
#include "common/model_config.h"     /* defines: zo_model_config_parse */
#include "transformer/transformer.h" /* defines: tf_init_opts, tf_block_forward, tf_block_backward */

#define NB 1
#define NT 7 /* N = 7 tokens */
#define N (NB * NT)
#define BLK 1 /* layer 0's block */
#define MAX_E 64 /* the reference's experts at most (its router backward's row) */
#define N_MODELS 3

/* Mixtral-shaped (4 experts, 2 a token, weights renormalized over the
 * chosen), Qwen2-MoE-shaped (8 experts, 3 a token, norm_topk off, a
 * shared expert with its sigmoid gate) and Phi-3.5-MoE-shaped (4 experts,
 * the sparsemixer's 2, LayerNorms with a bias; router_jitter_noise 0.05: a
 * mask threshold of 0.1, so some first softmaxes keep more than one expert) */
static const char *const names[N_MODELS] = {"mixtral", "qwen2_moe", "phimoe"};
static const char *const configs[N_MODELS] = {
    "{\"model_type\": \"mixtral\", \"num_hidden_layers\": 1, \"hidden_size\": 16, "
    "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"intermediate_size\": 12, "
    "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"vocab_size\": 32, "
    "\"max_position_embeddings\": 16}",
    "{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 1, \"hidden_size\": 16, "
    "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"intermediate_size\": 32, "
    "\"moe_intermediate_size\": 8, \"shared_expert_intermediate_size\": 12, \"num_experts\": 8, "
    "\"num_experts_per_tok\": 3, \"norm_topk_prob\": false, \"decoder_sparse_step\": 1, "
    "\"mlp_only_layers\": [], \"vocab_size\": 32, \"max_position_embeddings\": 16}",
    "{\"model_type\": \"phimoe\", \"num_hidden_layers\": 1, \"hidden_size\": 16, "
    "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"intermediate_size\": 12, "
    "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"vocab_size\": 32, "
    "\"max_position_embeddings\": 16, \"router_jitter_noise\": 0.05}"};

static uint64_t rng_state;
static double uniform(void) /* [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

/* The view of `role` in block BLK, into *v (routed experts: expert idx's,
 * the experts one after another); v, or NULL when the block has none. */
static const model_view *find(const model_layout *l, model_role role, int idx, model_view *v)
{
    const model_view *at = model_layout_view(l, BLK, role);
    if (!at) return NULL;
    *v = *at;
    v->offset += (size_t)idx * model_layout_expert_stride(l);
    return v;
}

static double silu(double v) { return v / (1.0 + exp(-v)); }
static double sigm(double v) { return 1.0 / (1.0 + exp(-v)); }

/* What the reference computes: the loss sum(out G), dx [N, h], the block's
 * gradient dw (the MoE block's tensors and the second norm's), the pairs
 * chosen and dropped (and dropped of each choice rank, the first two), the
 * tokens whose second choice weighs more than their first. */
typedef struct ref_out {
    double loss, *dx, *dw;
    int pairs, dropped, dropped_rank[2], heavier_second;
} ref_out;

/* The sparsemixer's mask (eval form, gpu/device.h's definition): whether
 * logit z lies more than thr below the maximum m, relative to max(|z|, m).
 * *gap: the least distance of such a ratio to thr so far, relative to thr
 * (the fp32 runtime and this double reference must decide alike). */
static int mixer_out(double m, double z, double thr, double *gap)
{
    double ratio = (m - z) / fmax(fabs(z), m);
    *gap = fmin(*gap, fabs(ratio - thr) / thr);
    return ratio > thr;
}

/* One row u [h] through a SwiGLU MLP of width f (tensors t: gate, up,
 * down) scaled by `scale`: adds scale (silu(u Wg) (u Wu)) Wd . G to the
 * loss, the weights' gradients to o->dw and u's to du; returns the
 * gradient of the scale. buf: 4 f doubles. */
static double mlp_row(const float *w, const model_view *const t[3], int f, int h, const double *u,
                      const float *G, double scale, ref_out *o, double *du, double *buf)
{
    double *g1 = buf, *g3 = buf + f, *a = buf + 2 * f, *da = buf + 3 * f, dscale = 0;
    const size_t og = t[0]->offset, ou = t[1]->offset, od = t[2]->offset;
    for (int j = 0; j < f; j++) {
        g1[j] = g3[j] = 0;
        for (int i = 0; i < h; i++) {
            g1[j] += u[i] * w[og + (size_t)j * h + i];
            g3[j] += u[i] * w[ou + (size_t)j * h + i];
        }
        a[j] = silu(g1[j]) * g3[j];
    }
    for (int i = 0; i < h; i++) {
        double yi = 0;
        for (int j = 0; j < f; j++) yi += a[j] * w[od + (size_t)i * f + j];
        o->loss += scale * yi * G[i];
    }
    for (int j = 0; j < f; j++) {
        double gj = 0; /* (Wd^T G)_j */
        for (int i = 0; i < h; i++) {
            gj += w[od + (size_t)i * f + j] * G[i];
            o->dw[od + (size_t)i * f + j] += scale * G[i] * a[j];
        }
        dscale += a[j] * gj;
        da[j] = scale * gj;
    }
    for (int j = 0; j < f; j++) {
        double sg = sigm(g1[j]), d1 = da[j] * g3[j] * sg * (1 + g1[j] * (1 - sg)), d3 = da[j] * silu(g1[j]);
        for (int i = 0; i < h; i++) {
            o->dw[og + (size_t)j * h + i] += d1 * u[i];
            o->dw[ou + (size_t)j * h + i] += d3 * u[i];
            du[i] += d1 * w[og + (size_t)j * h + i] + d3 * w[ou + (size_t)j * h + i];
        }
    }
    return dscale;
}

/* The reference: the layer's MoE block in double. w: the block's weights
 * (fp32, the layout's); x, G [N, h]. */
static void reference(const zo_model_config *c, const model_layout *l, const float *w, const float *x,
                      const float *G, double F, ref_out *o)
{
    const int h = c->hidden, E = c->moe.experts, K = c->moe.top_k, fe = c->moe.expert_ffn;
    const int fs = c->moe.shared_ffn;
    assert_true(E <= MAX_E);
    model_view vg2, vb2, vwr;
    const model_view *g2 = find(l, MODEL_ROLE_LN2_W, 0, &vg2), *wr = find(l, MODEL_ROLE_ROUTER_W, 0, &vwr);
    const model_view *b2 = c->norm_bias ? find(l, MODEL_ROLE_LN2_B, 0, &vb2) : NULL;
    assert_true(!c->norm_bias || b2);
    double *u = calloc((size_t)N * h, sizeof *u), *du = calloc((size_t)N * h, sizeof *du);
    double *rstd = calloc(N, sizeof *rstd), *mu = calloc(N, sizeof *mu), *p = calloc((size_t)N * E, sizeof *p);
    double *z = calloc((size_t)N * E, sizeof *z);
    double *wt = calloc((size_t)N * E, sizeof *wt), *dwt = calloc((size_t)N * E, sizeof *dwt);
    int *chosen = calloc((size_t)N * E, sizeof *chosen), *rank = calloc((size_t)N * E, sizeof *rank);
    int *kept = calloc((size_t)N * E, sizeof *kept), *sel = calloc((size_t)N * 2, sizeof *sel);
    double *buf = malloc(sizeof(double) * (size_t)(fe > fs ? fe : fs) * 4);
    /* out = x + y: the residual's share of the loss and of dx */
    o->loss = 0;
    for (int i = 0; i < N * h; i++) {
        o->loss += (double)x[i] * G[i];
        o->dx[i] = G[i];
    }
    /* u = rmsnorm(x) g2, or LayerNorm's (x - mean) rstd g2 + b2 */
    const int ln = c->layer_norm;
    for (int r = 0; r < N; r++) {
        double ss = 0, mean = 0;
        if (ln) {
            for (int i = 0; i < h; i++) mean += x[r * h + i];
            mean /= h;
        }
        mu[r] = mean;
        for (int i = 0; i < h; i++) ss += (x[r * h + i] - mean) * (x[r * h + i] - mean);
        rstd[r] = 1.0 / sqrt(ss / h + c->norm_eps);
        for (int i = 0; i < h; i++)
            u[r * h + i] = (x[r * h + i] - mean) * rstd[r] * w[g2->offset + i] + (b2 ? w[b2->offset + i] : 0.0);
    }
    /* the router: softmax, top_k (ties: the lower index), weights */
    const double thr = 2.0 * c->moe.jitter_eps;
    double mask_gap = INFINITY, top_gap = INFINITY;
    o->heavier_second = 0;
    for (int r = 0; r < N; r++) {
        double mx = -1e300, sum = 0;
        for (int e = 0; e < E; e++) {
            double ze = 0;
            for (int i = 0; i < h; i++) ze += u[r * h + i] * w[wr->offset + (size_t)e * h + i];
            p[r * E + e] = z[r * E + e] = ze;
            mx = fmax(mx, ze);
        }
        for (int e = 0; e < E; e++) sum += (p[r * E + e] = exp(p[r * E + e] - mx));
        for (int e = 0; e < E; e++) p[r * E + e] /= sum;
        if (c->moe.sparsemixer) {
            /* i1 = argmax z (ties: the lower index), w1 = the softmax at i1
             * over the logits its mask keeps; then without i1 the same
             * from the new maximum: i2, w2. Not renormalized. */
            const double *zr = z + (size_t)r * E;
            for (int k = 0; k < 2; k++) {
                int best = -1;
                for (int e = 0; e < E; e++)
                    if (!chosen[r * E + e] && (best < 0 || zr[e] > zr[best])) best = e;
                double s = 0;
                for (int e = 0; e < E; e++) {
                    if (chosen[r * E + e] || e == best) continue;
                    if (zr[e] != zr[best]) /* (an exact tie is the test's: equal router rows) */
                        top_gap = fmin(top_gap, (zr[best] - zr[e]) / fabs(zr[best]));
                    if (!mixer_out(zr[best], zr[e], thr, &mask_gap)) s += exp(zr[e] - zr[best]);
                }
                chosen[r * E + best] = 1;
                rank[r * E + best] = k; /* the order the router chose them */
                wt[r * E + best] = 1.0 / (1.0 + s);
                sel[r * 2 + k] = best;
            }
            o->heavier_second += wt[r * E + sel[r * 2 + 1]] > wt[r * E + sel[r * 2]];
            continue;
        }
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!chosen[r * E + e] && (best < 0 || p[r * E + e] > p[r * E + best])) best = e;
            chosen[r * E + best] = 1;
            rank[r * E + best] = k; /* picked in order of weight, ties to the lower index */
        }
        double s = 0;
        for (int e = 0; e < E; e++) s += chosen[r * E + e] ? p[r * E + e] : 0;
        for (int e = 0; e < E; e++)
            wt[r * E + e] = chosen[r * E + e] ? (c->moe.norm_topk ? p[r * E + e] / s : p[r * E + e]) : 0;
    }
    /* capacity: each expert takes its pairs by (choice rank, token) until C */
    /* (at most N K: a huge or infinite F keeps every pair) */
    const double Cd = F > 0 ? ceil(F * N * K / E) : N * K;
    int C = Cd < N * K ? (int)Cd : N * K;
    if (C < 1) C = 1;
    o->pairs = N * K;
    o->dropped = o->dropped_rank[0] = o->dropped_rank[1] = 0;
    for (int e = 0; e < E; e++) {
        int taken = 0;
        for (int k = 0; k < K; k++)
            for (int r = 0; r < N; r++)
                if (chosen[r * E + e] && rank[r * E + e] == k) {
                    kept[r * E + e] = taken < C;
                    o->dropped += taken >= C;
                    if (k < 2) o->dropped_rank[k] += taken >= C;
                    taken++;
                }
    }
    /* the kept pairs' experts: y_r += wt silu(u Wg) (u Wu) Wd, and back */
    for (int e = 0; e < E; e++) {
        model_view v[3];
        const model_view *t[3] = {find(l, MODEL_ROLE_EXPERT_GATE_W, e, &v[0]), find(l, MODEL_ROLE_EXPERT_UP_W, e, &v[1]),
                                  find(l, MODEL_ROLE_EXPERT_DOWN_W, e, &v[2])};
        for (int r = 0; r < N; r++)
            if (kept[r * E + e])
                dwt[r * E + e] = mlp_row(w, t, fe, h, u + (size_t)r * h, G + (size_t)r * h, wt[r * E + e], o,
                                         du + (size_t)r * h, buf);
    }
    /* the shared expert: y += sigmoid(u wsg) silu(u Wg) (u Wu) Wd, and back */
    if (fs) {
        model_view v[4];
        const model_view *t[3] = {find(l, MODEL_ROLE_MLP_GATE_W, 0, &v[0]), find(l, MODEL_ROLE_MLP_UP_W, 0, &v[1]),
                                  find(l, MODEL_ROLE_MLP_DOWN_W, 0, &v[2])};
        const model_view *tz = find(l, MODEL_ROLE_SHARED_GATE_W, 0, &v[3]);
        for (int r = 0; r < N; r++) {
            double z = 0;
            for (int i = 0; i < h; i++) z += u[r * h + i] * w[tz->offset + i];
            const double sz = sigm(z);
            double dz = mlp_row(w, t, fs, h, u + (size_t)r * h, G + (size_t)r * h, sz, o, du + (size_t)r * h, buf);
            dz *= sz * (1 - sz);
            for (int i = 0; i < h; i++) {
                o->dw[tz->offset + i] += dz * u[r * h + i];
                du[r * h + i] += dz * w[tz->offset + i];
            }
        }
    }
    /* the router's backward: the weights (renormalized or not), the
     * softmax; the sparsemixer's w_i = exp(z_i - m_i) / sum over K_i (its
     * mask's kept logits, the masks and choices constants):
     * dz_j += dw_i w_i ([j = i] - exp(z_j - m_i) w_i) over j in K_i */
    for (int r = 0; c->moe.sparsemixer && r < N; r++) {
        const double *zr = z + (size_t)r * E;
        double dz[MAX_E] = {0}, unused = INFINITY;
        for (int k = 0; k < 2; k++) {
            const int i = sel[r * 2 + k];
            const double m = zr[i], wi = wt[r * E + i], g = dwt[r * E + i] * wi;
            for (int e = 0; e < E; e++) {
                if ((k == 1 && e == sel[r * 2]) || (e != i && mixer_out(m, zr[e], thr, &unused))) continue;
                dz[e] += g * ((e == i) - exp(zr[e] - m) * wi);
            }
        }
        for (int e = 0; e < E; e++)
            for (int i = 0; i < h; i++) {
                o->dw[wr->offset + (size_t)e * h + i] += dz[e] * u[r * h + i];
                du[r * h + i] += dz[e] * w[wr->offset + (size_t)e * h + i];
            }
    }
    for (int r = 0; !c->moe.sparsemixer && r < N; r++) {
        double dp[MAX_E] = {0}, s = 0, sdw = 0, pdp = 0;
        for (int e = 0; e < E; e++)
            if (chosen[r * E + e]) {
                s += p[r * E + e];
                sdw += dwt[r * E + e] * p[r * E + e];
            }
        for (int e = 0; e < E; e++)
            if (chosen[r * E + e])
                dp[e] = c->moe.norm_topk ? dwt[r * E + e] / s - sdw / (s * s) : dwt[r * E + e];
        for (int e = 0; e < E; e++) pdp += p[r * E + e] * dp[e];
        for (int e = 0; e < E; e++) {
            double dz = p[r * E + e] * (dp[e] - pdp);
            for (int i = 0; i < h; i++) {
                o->dw[wr->offset + (size_t)e * h + i] += dz * u[r * h + i];
                du[r * h + i] += dz * w[wr->offset + (size_t)e * h + i];
            }
        }
    }
    /* the norm's backward: with xh = (x - mean) rstd and dxh = du g2,
     * dx = rstd (dxh - xh mean(dxh xh)), less mean(dxh) with LayerNorm */
    for (int r = 0; r < N; r++) {
        double m = 0, md = 0;
        for (int i = 0; i < h; i++) {
            const double xh = (x[r * h + i] - mu[r]) * rstd[r], dxh = du[r * h + i] * w[g2->offset + i];
            o->dw[g2->offset + i] += du[r * h + i] * xh;
            if (b2) o->dw[b2->offset + i] += du[r * h + i];
            m += dxh * xh;
            md += dxh;
        }
        m /= h;
        md = ln ? md / h : 0.0;
        for (int i = 0; i < h; i++) {
            const double xh = (x[r * h + i] - mu[r]) * rstd[r], dxh = du[r * h + i] * w[g2->offset + i];
            o->dx[r * h + i] += rstd[r] * (dxh - md - xh * m);
        }
    }
    /* the fp32 runtime's choices and masks are the reference's only away
     * from their edges: a case within 1e-4 of one is the test's mistake */
    if (c->moe.sparsemixer && !(mask_gap > 1e-4 && top_gap > 1e-4))
        fail_msg("the sparsemixer's case lies within %.2e of a mask's threshold, %.2e of a choice's tie", mask_gap,
                 top_gap);
    free(u);
    free(du);
    free(rstd);
    free(mu);
    free(z);
    free(sel);
    free(p);
    free(wt);
    free(dwt);
    free(chosen);
    free(rank);
    free(kept);
    free(buf);
}

/* |got - want| <= tol max |want| over n values. */
static void compare(const char *what, const float *got, const double *want, size_t n, double tol)
{
    double most = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        most = fmax(most, fabs(want[i]));
        double d = fabs((double)got[i] - want[i]);
        if (d > worst) worst = d, at = i;
    }
    if (!(worst <= tol * most + 1e-12))
        fail_msg("%s: %.3e off at %zu (%.6g against %.6g; largest %.3e)", what, worst, at, got[at], want[at], most);
}

static double last_loss;         /* check's layer loss, the last one */
static int last_dropped_rank[2]; /* and its pairs dropped of the first and second choice ranks */

/* One model and capacity factor: the layer's forward and backward against
 * the reference (with `recompute`: the layer's activations recomputed
 * before its backward, routing again); returns the pairs the layer dropped
 * (the loss: last_loss). */
static int check(int which, double F, int recompute)
{
    zo_model_config cfg;
    assert_int_equal(zo_model_config_parse(configs[which], "test", &cfg), ZO_OK);
    const int h = cfg.hidden, E = cfg.moe.experts;
    gpu_cpu_options co = {.n_threads = 1};
    gpu_device_t dev;
    gpu_stream_t s;
    assert_int_equal(gpu_device_init_cpu(&co, &dev), ZO_OK);
    assert_int_equal(gpu_stream_create(dev, &s), ZO_OK);
    tf_options o = {.external_res = 1, .capacity_factor = F, .recompute = recompute};
    tf_model m;
    if (tf_init_opts(&m, &cfg, dev, ZO_DTYPE_F32, NB, NT + 2, &o) != ZO_OK) fail_msg("tf_init: %s", zo_last_error());
    const model_layout *l = &m.layout;
    size_t nw = l->block_numel[BLK];
    float *w = calloc(nw, 4), *x = malloc((size_t)N * h * 4), *G = malloc((size_t)N * h * 4);
    /* weights: random, the attention's output projection 0 (the layer is
     * x + moe(rmsnorm(x))), router rows 1 and 2 equal (ties); the tokens'
     * inputs lean along router row 0 (two of three: expert 0 first) or
     * against it (the third), and all along row 3's first features (the
     * second choice of the first, the first choice of the third) */
    rng_state = 0x5eed0000ull + (uint64_t)which;
    for (size_t i = 0; i < nw; i++) w[i] = (float)(0.3 * uniform());
    model_view vwo, vwr, vg2;
    const model_view *wo = find(l, MODEL_ROLE_ATTN_OUT_W, 0, &vwo), *wr = find(l, MODEL_ROLE_ROUTER_W, 0, &vwr);
    const model_view *g2 = find(l, MODEL_ROLE_LN2_W, 0, &vg2);
    assert_non_null(wo);
    assert_non_null(wr);
    assert_non_null(g2);
    memset(w + wo->offset, 0, wo->numel * 4);
    for (int i = 0; i < h; i++) {
        w[g2->offset + i] = (float)(1.0 + 0.2 * uniform());
        w[wr->offset + i] = (float)(i % 2 ? 0.25 : -0.25);
        w[wr->offset + (size_t)2 * h + i] = w[wr->offset + (size_t)h + i];
        w[wr->offset + (size_t)3 * h + i] = (float)(i < 4 ? 0.5 : 0.0);
    }
    /* the sparsemixer's tokens lean along rows 0 and 3 by lean[r][0] and
     * [1], along row 1 (= row 2) by [2]: experts 0 and 3 with margins wide
     * (weights 1 and 1), 3 first by a little (both kept in its softmax, w1
     * < w2 = 1) or by more (3 before 0, weights 1 and 1), 1 and 2 tied
     * (w1 < w2) */
    static const double lean[NT][3] = {{1, 1.5, 0}, {0.6, 1.5, 0}, {-1, 1.5, 0}, {0.3, 1.5, 0},
                                       {1, 1.5, 0}, {0, 0, 8}, {0.6, 1.5, 0}};
    for (int r = 0; r < N; r++) /* every third token leans away: expert 0 its last choice */
        for (int i = 0; i < h; i++) {
            const double *ln = cfg.moe.sparsemixer ? lean[r % NT] : (const double[3]){r % 3 == 2 ? -1 : 1, 1.5, 0};
            x[r * h + i] = (float)((i % 2 ? 1.0 : -1.0) * ln[0] + (i < 4 ? ln[1] : 0) +
                                   ln[2] * w[wr->offset + (size_t)h + i] + 0.5 * uniform());
        }
    for (int i = 0; i < N * h; i++) G[i] = (float)uniform();
    /* the layer on the device (the CPU device's memory is host memory) */
    void *pw, *pg, *xin, *xout;
    assert_int_equal(gpu_mem_alloc(dev, nw * 4, &pw), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, nw * 4, &pg), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, (size_t)N * h * 4, &xin), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, (size_t)N * h * 4, &xout), ZO_OK);
    memcpy(pw, w, nw * 4);
    memset(pg, 0, nw * 4);
    memcpy(xin, x, (size_t)N * h * 4);
    int32_t ids[N] = {0};
    m.res[0] = xin;
    m.res[1] = xout;
    assert_int_equal(tf_set_batch(&m, s, ids, ids, NB, NT), ZO_OK);
    tf_block_bufs bb = {.params = pw, .grads = pg};
    if (tf_block_forward(&m, BLK, &bb, s) != ZO_OK) fail_msg("forward: %s", zo_last_error());
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
    double loss = 0;
    for (int i = 0; i < N * h; i++) loss += (double)((float *)xout)[i] * G[i];
    if (recompute && tf_block_recompute(&m, BLK, &bb, s) != ZO_OK) fail_msg("recompute: %s", zo_last_error());
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
    memcpy(m.dres, G, (size_t)N * h * 4);
    if (tf_block_backward(&m, BLK, &bb, 1.0f, s) != ZO_OK) fail_msg("backward: %s", zo_last_error());
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);

    ref_out ro = {.dx = calloc((size_t)N * h, sizeof(double)), .dw = calloc(nw, sizeof(double))};
    reference(&cfg, l, w, x, G, F, &ro);
    char what[160];
    snprintf(what, sizeof what, "%s F %g%s", names[which], F, recompute ? " recompute" : "");
    if (!(fabs(loss - ro.loss) <= 1e-5 * fmax(1.0, fabs(ro.loss))))
        fail_msg("%s: loss %.9g against %.9g", what, loss, ro.loss);
    assert_int_equal((int)m.moe_pairs, ro.pairs); /* (a recompute's routing not counted) */
    assert_int_equal((int)m.moe_dropped, ro.dropped);
    char t[320];
    snprintf(t, sizeof t, "%s: dL/dx", what);
    compare(t, m.dres, ro.dx, (size_t)N * h, 1e-5);
    /* the MoE block's gradients and the norm's, tensor by tensor */
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *mt = &l->tensors[i];
        if (mt->block != BLK || mt->role < MODEL_ROLE_LN2_W) continue;
        float *dg = (float *)pg + mt->offset;
        double any = 0;
        for (size_t j = 0; j < mt->numel; j++) any = fmax(any, fabs(ro.dw[mt->offset + j]));
        snprintf(t, sizeof t, "%s: gradient of %s", what, mt->name);
        if (any == 0) { /* an expert no kept pair reached: untouched */
            for (size_t j = 0; j < mt->numel; j++)
                if (dg[j] != 0.0f) fail_msg("%s: %.3e where no pair reached it", t, dg[j]);
            continue;
        }
        compare(t, dg, ro.dw + mt->offset, mt->numel, 1e-5);
    }
    printf("# %s: %d of %d pairs dropped (%d first choices, %d second; E %d, N %d), loss %.6f\n", what, ro.dropped,
           ro.pairs, ro.dropped_rank[0], ro.dropped_rank[1], E, N, loss);
    if (cfg.moe.sparsemixer) { /* the cases the sparsemixer's rows are for */
        printf("#   %d of %d tokens weigh their second choice more\n", ro.heavier_second, N);
        assert_true(ro.heavier_second > 0);
    }
    last_dropped_rank[0] = ro.dropped_rank[0];
    last_dropped_rank[1] = ro.dropped_rank[1];
    last_loss = loss;
    free(ro.dx);
    free(ro.dw);
    free(w);
    free(x);
    free(G);
    gpu_mem_free(dev, pw);
    gpu_mem_free(dev, pg);
    gpu_mem_free(dev, xin);
    gpu_mem_free(dev, xout);
    tf_free(&m);
    gpu_stream_destroy(s);
    gpu_device_free(dev);
    return ro.dropped;
}

static void run_model(int which)
{
    assert_int_equal(check(which, 0, 0), 0); /* dropless */
    const double dropless = last_loss;
    /* a huge or infinite factor: C is N (a token once), every pair kept,
     * the layer F 0's to the bit */
    assert_int_equal(check(which, INFINITY, 0), 0);
    assert_true(last_loss == dropless);
    assert_int_equal(check(which, 1e30, 0), 0);
    assert_true(last_loss == dropless);
    assert_true(check(which, 0.5, 0) > 0);
    /* first choices dropped as well as second ones: the priority between them counts */
    assert_true(last_dropped_rank[0] > 0 && last_dropped_rank[1] > 0);
    assert_true(check(which, 0.5, 1) > 0);   /* the recompute routes as the forward did */
    assert_true(check(which, 1.0, 0) > 0);   /* skewed: experts 0 and 3 over their fair share */
    assert_true(check(which, 1.25, 0) > 0);
    assert_int_equal(check(which, 8, 0), 0); /* room for every pair */
}

static void test_mixtral(void **state)
{
    (void)state;
    run_model(0);
}

static void test_qwen2_moe(void **state)
{
    (void)state;
    run_model(1);
}

/* Phi-3.5-MoE's sparsemixer: a token's first choice outranks every
 * second choice whatever the weights say, so with tokens whose w2 > w1 and
 * first and second choices both dropped, ranking by weight fails it */
static void test_phimoe(void **state)
{
    (void)state;
    run_model(2);
}

/* gpt-oss trains in full, with LoRA or QLoRA (on the attention's q, k, v
 * and o: its experts take no adapters, and targets naming only theirs are
 * refused by name); what it does not run is refused by name: a capacity
 * factor, its balance loss (generation routes dropless and takes no loss:
 * accepted) */
static void test_gpt_oss_refusals(void **state)
{
    (void)state;
#define GPT_OSS_SHAPE                                                                                      \
    "\"model_type\": \"gpt_oss\", \"num_hidden_layers\": 2, \"hidden_size\": 32, \"num_attention_heads\": 2, " \
    "\"num_key_value_heads\": 1, \"head_dim\": 16, \"intermediate_size\": 8, \"num_local_experts\": 4, "           \
    "\"num_experts_per_tok\": 2, \"vocab_size\": 32, \"sliding_window\": 4"
    zo_model_config cfg, aux;
    assert_int_equal(zo_model_config_parse("{" GPT_OSS_SHAPE "}", "gpt_oss.json", &cfg), ZO_OK);
    assert_int_equal(zo_model_config_parse("{" GPT_OSS_SHAPE ", \"output_router_logits\": true}", "gpt_oss.json", &aux),
                     ZO_OK);
#undef GPT_OSS_SHAPE
    gpu_cpu_options co = {.n_threads = 1};
    gpu_device_t dev;
    assert_int_equal(gpu_device_init_cpu(&co, &dev), ZO_OK);
    tf_model m;
    tf_options full = {0}, gen = {.kv_len = 16, .capacity_factor = 1.0};
    assert_int_equal(tf_init_opts(&m, &cfg, dev, ZO_DTYPE_BF16, 2, 9, &full), ZO_OK);
    tf_free(&m);
    assert_int_equal(tf_init_opts(&m, &aux, dev, ZO_DTYPE_F32, 2, 9, &gen), ZO_OK);
    tf_free(&m);
    for (int nf4 = 0; nf4 < 2; nf4++) {
        tf_options lo = {.lora = {.r = 2, .alpha = 4, .targets = ZO_LORA_ALL_LINEAR, .nf4 = nf4}};
        assert_int_equal(tf_init_opts(&m, &cfg, dev, ZO_DTYPE_F32, 2, 9, &lo), ZO_OK);
        /* the adapters: q, k, v and o of each layer, r (in + out) each */
        size_t want = 2 * 2 * ((32 + 32) + (32 + 16) + (32 + 16) + (32 + 32));
        assert_int_equal(zo_lora_trainable_params(&cfg, 2, ZO_LORA_ALL_LINEAR), want);
        tf_free(&m);
    }
    zo_lora_config mlp = {.r = 2, .alpha = 4, .targets = ZO_LORA_GATE | ZO_LORA_UP};
    assert_int_equal(zo_lora_check(&cfg, &mlp), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "(gpt-oss) adapts the attention's projections only"));
    const struct {
        tf_options o;
        const zo_model_config *c;
        const char *named;
    } refused[] = {
        {{.capacity_factor = 1.0}, &cfg, "gpt-oss with a capacity factor"},
        {{0}, &aux, "gpt-oss with output_router_logits"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        assert_int_equal(tf_init_opts(&m, refused[i].c, dev, ZO_DTYPE_F32, 2, 9, &refused[i].o), ZO_ERR_UNSUPPORTED);
        if (!strstr(zo_last_error(), refused[i].named)) fail_msg("case %zu: %s", i, zo_last_error());
    }
    gpu_device_free(dev);
}

/* The buffers hold what can arrive: min(N top_k, E C) rows, and LoRA's
 * expert scratch one expert's, min(N, C); refusals. */
static void test_sizes_and_refusals(void **state)
{
    (void)state;
    zo_model_config cfg, dense;
    assert_int_equal(zo_model_config_parse(configs[0], "test", &cfg), ZO_OK);
    gpu_cpu_options co = {.n_threads = 1};
    gpu_device_t dev;
    assert_int_equal(gpu_device_init_cpu(&co, &dev), ZO_OK);
    tf_model m;
    /* 2 x 9 tokens, 4 experts, 2 a token: C = ceil(0.5 x 18 x 2 / 4) = 5 */
    tf_options o = {.capacity_factor = 0.5};
    assert_int_equal(tf_init_opts(&m, &cfg, dev, ZO_DTYPE_F32, 2, 9, &o), ZO_OK);
    assert_int_equal(m.moe_rows, 20);
    tf_free(&m);
    o.capacity_factor = 1.25; /* C = 12: every pair, 36 */
    assert_int_equal(tf_init_opts(&m, &cfg, dev, ZO_DTYPE_F32, 2, 9, &o), ZO_OK);
    assert_int_equal(m.moe_rows, 36);
    tf_free(&m);
    /* C is at most the 18 tokens (an expert takes a token once), however
     * large the factor: 2^62 C would make E C wrap to 0 rows, an infinite
     * one's ceiling no integer */
    const double huge[] = {INFINITY, 1e30, 5.1e17};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(zo_moe_capacity(&cfg, huge[i], 18), 18);
        assert_int_equal(zo_moe_rank_rows(&cfg, huge[i], 18, 1), 36);
        assert_int_equal(zo_moe_rank_rows(&cfg, huge[i], 18, 2), 2 * 18 * 2); /* 2 ranks, 2 experts each */
        o.capacity_factor = huge[i];
        assert_int_equal(tf_init_opts(&m, &cfg, dev, ZO_DTYPE_F32, 2, 9, &o), ZO_OK);
        assert_int_equal(m.moe_rows, 36);
        tf_free(&m);
    }
    /* 2 ranks of 2 experts: each rank sends an expert at most C = 5 rows */
    assert_int_equal(zo_moe_rank_rows(&cfg, 0.5, 18, 2), 2 * 2 * 5);
    /* LoRA r 2 on every linear layer (q, k, v, o and the experts' w1, w3,
     * w2) adds, fp32: the layer's x A^T of each of the 4 attention adapters
     * on the 18 tokens (the experts' keep none), and over the
     * rows one expert can take, one expert at a time, its adapters' x A^T
     * and the adapters' gradient (of 18 rows at least, the dense ones'):
     * an expert takes a token once, so 18 rows dropless, 5 = C at F 0.5,
     * 12 = C at F 1.25 */
    const double factors[3] = {0, 0.5, 1.25};
    const size_t expert_rows[3] = {18, 5, 12};
    for (int i = 0; i < 3; i++) {
        tf_options plain = {.capacity_factor = factors[i]}, lora = plain;
        lora.lora = (tf_lora_options){.r = 2, .alpha = 4, .targets = ZO_LORA_ALL_LINEAR};
        assert_int_equal(tf_init_opts(&m, &cfg, dev, ZO_DTYPE_F32, 2, 9, &plain), ZO_OK);
        size_t base = m.act_bytes;
        tf_free(&m);
        assert_int_equal(tf_init_opts(&m, &cfg, dev, ZO_DTYPE_F32, 2, 9, &lora), ZO_OK);
        size_t er = expert_rows[i], want = 18 * 4 * 2 * 4 + er * 2 * 4 + (er > 18 ? er : 18) * 2 * 4;
        printf("  LoRA's activation bytes at F %g: %zu (by hand %zu)\n", factors[i], m.act_bytes - base, want);
        assert_int_equal(m.act_bytes - base, want);
        tf_free(&m);
    }
    /* LoRA on q and v only: no expert carries an adapter, so no expert
     * scratch (in training or generation): the two A x and the dense
     * adapters' gradient, 18 rows */
    tf_options qv = {.lora = {.r = 2, .alpha = 4, .targets = ZO_LORA_Q | ZO_LORA_V}};
    assert_int_equal(tf_init_opts(&m, &cfg, dev, ZO_DTYPE_F32, 2, 9, &qv), ZO_OK);
    assert_null(m.eu);
    size_t qv_train = m.act_bytes;
    tf_free(&m);
    qv.lora.r = 0;
    assert_int_equal(tf_init_opts(&m, &cfg, dev, ZO_DTYPE_F32, 2, 9, &qv), ZO_OK);
    printf("  LoRA's activation bytes, q and v: %zu (by hand %d)\n", qv_train - m.act_bytes, 18 * 2 * 2 * 4 + 18 * 2 * 4);
    assert_int_equal(qv_train - m.act_bytes, 18 * 2 * 2 * 4 + 18 * 2 * 4);
    tf_free(&m);
    qv.lora.r = 2;
    qv.kv_len = 16;
    assert_int_equal(tf_init_opts(&m, &cfg, dev, ZO_DTYPE_F32, 2, 9, &qv), ZO_OK);
    assert_null(m.eu);
    tf_free(&m);
    assert_non_null(zo_moe_check_capacity(&cfg, NAN));
    o.capacity_factor = -1;
    assert_int_not_equal(tf_init_opts(&m, &cfg, dev, ZO_DTYPE_F32, 2, 9, &o), ZO_OK);
    assert_non_null(strstr(zo_last_error(), "capacity factor"));
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"llama\", \"num_hidden_layers\": 1, "
                                           "\"hidden_size\": 16, \"num_attention_heads\": 2, "
                                           "\"intermediate_size\": 12, \"vocab_size\": 32}",
                                           "dense", &dense),
                     ZO_OK);
    o.capacity_factor = 1;
    assert_int_not_equal(tf_init_opts(&m, &dense, dev, ZO_DTYPE_F32, 2, 9, &o), ZO_OK);
    assert_non_null(strstr(zo_last_error(), "no experts"));
    gpu_device_free(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_qwen2_moe),
        cmocka_unit_test(test_phimoe),
        cmocka_unit_test(test_sizes_and_refusals),
        cmocka_unit_test(test_gpt_oss_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
