/* The CPU kernels of the mixture-of-experts ops (gpu/device.h, "ops:
 * mixture of experts"): the router, forward and backward, and the
 * per-token scaling of an expert's output. Rows are split over the team
 * statically; the router's statistics are summed serially in row order, so
 * no result depends on the thread count. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "common/dtype.h" /* defines: zo_load_f32, zo_store_f32 */
#include "gpu/ops_cpu.h"

static int gate_sigmoid(const gpu_moe_gate *g)
{
    return g->mode == GPU_MOE_ROUTE_SIGMOID || g->mode == GPU_MOE_ROUTE_SIGMOID_NORM;
}

/* Row r of the router: p [e] = its scores in fp32 (the softmax over the
 * row, or each logit's sigmoid) and sel [k] the experts chosen, largest key
 * first (p + bias; ties to the lower index), from the best topk_groups
 * groups when the gate has groups. key [e] and gs [2 groups] are scratch. */
static void route_row(gpu_tensor logits, size_t r, int e, int k, const gpu_moe_gate *g, float *p,
                      float *key, float *gs, int *sel)
{
    if (gate_sigmoid(g)) {
        for (int j = 0; j < e; j++)
            p[j] = 1.0f / (1.0f + expf(-zo_load_f32(logits.data, logits.dtype, r * (size_t)e + (size_t)j)));
    } else {
        float mx = -INFINITY, sum = 0.0f;
        for (int j = 0; j < e; j++) {
            p[j] = zo_load_f32(logits.data, logits.dtype, r * (size_t)e + (size_t)j);
            mx = p[j] > mx ? p[j] : mx;
        }
        for (int j = 0; j < e; j++) {
            p[j] = expf(p[j] - mx);
            sum += p[j];
        }
        for (int j = 0; j < e; j++) p[j] /= sum;
    }
    for (int j = 0; j < e; j++) key[j] = g->bias ? p[j] + g->bias[j] : p[j];
    /* the groups: each scored by its best key (softmax) or its best two
     * keys' sum (sigmoid); the topk_groups best keep their experts, gs
     * [2 groups] becoming 1 for those and 0 for the others */
    const int G = g->groups > 1 ? g->groups : 1, gsz = e / G;
    if (G > 1) {
        for (int q = 0; q < G; q++) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int j = q * gsz; j < (q + 1) * gsz; j++)
                if (key[j] > b1) b2 = b1, b1 = key[j];
                else if (key[j] > b2) b2 = key[j];
            gs[q] = gate_sigmoid(g) ? b1 + b2 : b1;
        }
        float *kept = gs + G; /* 1 for a kept group */
        for (int q = 0; q < G; q++) kept[q] = 0.0f;
        for (int i = 0; i < g->topk_groups; i++) {
            int best = -1;
            for (int q = 0; q < G; q++)
                if (kept[q] == 0.0f && (best < 0 || gs[q] > gs[best])) best = q;
            kept[best] = 1.0f;
        }
        for (int q = 0; q < G; q++) gs[q] = kept[q];
    }
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int j = 0; j < e; j++) {
            int taken = G > 1 && gs[j / gsz] == 0.0f;
            for (int q = 0; q < i; q++) taken |= sel[q] == j;
            if (!taken && (best < 0 || key[j] > key[best])) best = j;
        }
        sel[i] = best;
    }
}

/* The chosen experts' weights in wr [e] (the others left) of a row's
 * scores p and choice sel: p, or p over their sum (plus 1e-20 for the
 * sigmoid's), times the scale */
static void route_weights(const gpu_moe_gate *g, const float *p, const int *sel, int k, float *wr)
{
    const int norm = g->mode == GPU_MOE_ROUTE_NORM || g->mode == GPU_MOE_ROUTE_SIGMOID_NORM;
    float S = 0.0f;
    for (int i = 0; i < k; i++) S += p[sel[i]];
    if (g->mode == GPU_MOE_ROUTE_SIGMOID_NORM) S += 1e-20f;
    for (int i = 0; i < k; i++) {
        float w = norm ? p[sel[i]] / S : p[sel[i]];
        wr[sel[i]] = g->scale != 0.0f ? w * g->scale : w;
    }
}

/* The sparsemixer's mask (gpu_moe_route): whether logit x lies more than
 * thr (2 eps) below the maximum m, relative to max(|x|, m); in double, as
 * the CUDA kernel computes it. A 0 / 0 (x = m = 0) is not above thr: kept,
 * as Hugging Face's comparison of a NaN. */
static int mixer_masked(float m, float x, double thr)
{
    double f = fabs((double)x) > (double)m ? fabs((double)x) : (double)m;
    return ((double)m - (double)x) / f > thr;
}

/* Row r of the sparsemixer (eval form): its two choices sel [2] (i1 the
 * largest logit, i2 the largest of the others; ties to the lower index)
 * and their weights w [2], each the softmax at its choice over the logits
 * its mask keeps (i1 left out of the second). */
static void mixer_row(gpu_tensor logits, size_t r, int e, double thr, int *sel, float *w)
{
    const float *l = (const float *)logits.data + r * (size_t)e; /* fp32 (gpu_check_moe_router) */
    for (int i = 0; i < 2; i++) {
        int best = -1;
        for (int j = 0; j < e; j++)
            if ((i == 0 || j != sel[0]) && (best < 0 || l[j] > l[best])) best = j;
        const float m = l[best];
        float sum = 0.0f;
        for (int j = 0; j < e; j++)
            if ((i == 0 || j != sel[0]) && !mixer_masked(m, l[j], thr)) sum += expf(l[j] - m);
        sel[i] = best;
        w[i] = 1.0f / sum; /* exp(0) / sum */
    }
}

/* Scratch for every thread's p [e], key [e], gs [2 e] and sel [k] (floats
 * and ints, 4 bytes each: route_row's), then `extra` doubles. */
#define ROUTE_PER(e, k) (4 * (size_t)(e) + (size_t)(k))
static zo_status route_scratch(cpu_scratch *ws, const char *op, int nt, int e, int k, size_t extra,
                               float **rows, double **dbl)
{
    size_t head = (size_t)nt * ROUTE_PER(e, k) * 4;
    head = (head + 7) / 8 * 8;
    void *p;
    zo_status st = cpu_scratch_reserve(ws, head + extra * sizeof(double), op, &p);
    if (st != ZO_OK) return st;
    *rows = p;
    *dbl = (double *)((char *)p + head);
    return ZO_OK;
}

/* A thread's route_row scratch from route_scratch's rows: p, key, gs, sel */
#define ROUTE_ROW(rows, tid, e, k)                                                        \
    float *p = (rows) + (size_t)(tid) * ROUTE_PER(e, k), *key = p + (e), *gs = key + (e); \
    int *sel = (int *)(gs + 2 * (size_t)(e))

zo_status cpu_moe_router_forward(cpu_scratch *ws, gpu_tensor weights, gpu_tensor logits,
                                 float *stats, uint8_t *order, int n, int e, int k, const gpu_moe_gate *g,
                                 int group_rows, int nt)
{
    const int mixer = g->mode == GPU_MOE_ROUTE_SPARSEMIXER;
    const double thr = 2.0 * (double)g->eps;
    nt = cpu_team(nt); /* 0: OpenMP's team, sized here: the scratch is per thread */
    float *rows;
    double *acc;
    zo_status st = route_scratch(ws, "gpu_moe_router_forward", nt, e, k, 2 * (size_t)e, &rows, &acc);
    if (st != ZO_OK) return st;
    float *w = weights.data;
    /* (the work: a row's softmax, selection and weights, a few operations an
     * expert each; 8 for cpu_run_team) */
#pragma omp parallel for num_threads(cpu_run_team(nt, (double)n * e * 8)) schedule(static)
    for (int r = 0; r < n; r++) {
        ROUTE_ROW(rows, omp_get_thread_num(), e, k);
        float *wr = w + (size_t)r * e;
        memset(wr, 0, (size_t)e * sizeof *wr);
        if (mixer) {
            float mw[2];
            mixer_row(logits, (size_t)r, e, thr, sel, mw);
            wr[sel[0]] = mw[0], wr[sel[1]] = mw[1];
        } else {
            route_row(logits, (size_t)r, e, k, g, p, key, gs, sel);
            route_weights(g, p, sel, k, wr);
        }
        if (order) { /* sel is in choice order: the largest key (the sparsemixer's i1) first */
            uint8_t *o = order + (size_t)r * e;
            memset(o, GPU_MOE_NOT_CHOSEN, (size_t)e);
            for (int i = 0; i < k; i++) o[sel[i]] = (uint8_t)i;
        }
    }
    /* the load-balancing loss's sums, each group's in row order */
    for (int r0 = 0; r0 < n; r0 += group_rows) {
        const int r1 = n - r0 < group_rows ? n : r0 + group_rows;
        memset(acc, 0, 2 * (size_t)e * sizeof *acc);
        for (int r = r0; r < r1; r++) {
            ROUTE_ROW(rows, 0, e, k);
            route_row(logits, (size_t)r, e, k, g, p, key, gs, sel);
            if (mixer) { /* its choices, by the logits (the softmax's p can tie where they do not) */
                float mw[2];
                mixer_row(logits, (size_t)r, e, thr, sel, mw);
            }
            for (int j = 0; j < e; j++) acc[j] += p[j];
            for (int i = 0; i < k; i++) acc[e + sel[i]] += 1.0;
        }
        float *sg = stats + (size_t)(r0 / group_rows) * 2 * e;
        for (int j = 0; j < 2 * e; j++) sg[j] = (float)acc[j];
    }
    return ZO_OK;
}

zo_status cpu_moe_router_backward(cpu_scratch *ws, gpu_tensor dlogits, gpu_tensor dweights,
                                  gpu_tensor logits, const float *stats, int n, int e, int k,
                                  const gpu_moe_gate *g, int layers, int group_rows, float aux_scale, int nt)
{
    const int mixer = g->mode == GPU_MOE_ROUTE_SPARSEMIXER, sigmoid = gate_sigmoid(g);
    const int norm = g->mode == GPU_MOE_ROUTE_NORM || g->mode == GPU_MOE_ROUTE_SIGMOID_NORM;
    const double thr = 2.0 * (double)g->eps, scale = g->scale != 0.0f ? (double)g->scale : 1.0;
    nt = cpu_team(nt); /* 0: OpenMP's team, sized here: the scratch is per thread */
    const int groups = (n + group_rows - 1) / group_rows;
    float *rows;
    double *aux;
    /* per thread: route_row's scratch, then aux [groups, e] and dp [e] a thread in the doubles */
    zo_status st = route_scratch(ws, "gpu_moe_router_backward", nt, e, k,
                                 (size_t)groups * e + (size_t)nt * (size_t)e, &rows, &aux);
    if (st != ZO_OK) return st;
    /* the load-balancing loss's gradient per group and expert: aux_scale
     * times the group's rows that chose it, over the layers */
    for (int gi = 0; gi < groups; gi++)
        for (int j = 0; j < e; j++) {
            double cnt = 0.0;
            if (aux_scale != 0.0f)
                for (int l = 0; l < layers; l++) cnt += stats[((size_t)l * groups + gi) * 2 * e + e + j];
            aux[(size_t)gi * e + j] = (double)aux_scale * cnt;
        }
    const float *dw = dweights.data;
    float *dl = dlogits.data;
#pragma omp parallel for num_threads(cpu_run_team(nt, (double)n * e * 8)) schedule(static)
    for (int r = 0; r < n; r++) {
        int tid = omp_get_thread_num();
        ROUTE_ROW(rows, tid, e, k);
        double *dp = aux + (size_t)groups * e + (size_t)tid * e;
        const double *ag = aux + (size_t)(r / group_rows) * e;
        route_row(logits, (size_t)r, e, k, g, p, key, gs, sel);
        const float *dwr = dw + (size_t)r * e;
        float *dlr = dl + (size_t)r * e;
        for (int j = 0; j < e; j++) dp[j] = ag[j];
        if (mixer) {
            /* the auxiliary loss's share through the softmax over all e,
             * then each weight's: w_i = the softmax at sel[i] over the
             * kept set K_i, so dl_j += dw_i w_i ([j == sel[i]] - q_j) for j
             * in K_i, q_j = exp(l_j - m_i) w_i (the masks held constant) */
            double dot = 0.0;
            for (int j = 0; j < e; j++) dot += p[j] * dp[j];
            for (int j = 0; j < e; j++) dlr[j] = (float)(p[j] * (dp[j] - dot));
            float mw[2];
            mixer_row(logits, (size_t)r, e, thr, sel, mw);
            const float *l = (const float *)logits.data + (size_t)r * e;
            for (int j = 0; j < e; j++) dp[j] = 0.0;
            for (int i = 0; i < 2; i++) {
                const float m = l[sel[i]];
                const double gw = (double)dwr[sel[i]] * mw[i];
                for (int j = 0; j < e; j++) {
                    if ((i == 1 && j == sel[0]) || mixer_masked(m, l[j], thr)) continue;
                    dp[j] += gw * ((j == sel[i]) - (double)expf(l[j] - m) * mw[i]);
                }
            }
            for (int j = 0; j < e; j++) dlr[j] = (float)((double)dlr[j] + dp[j]);
            continue;
        }
        if (norm) { /* w_i = p_i / S: dp_i = (dw_i - sum_q dw_q w_q) / S (S plus 1e-20 for the sigmoid's) */
            double S = 0.0, dot = 0.0;
            for (int i = 0; i < k; i++) S += p[sel[i]];
            if (sigmoid) S += 1e-20;
            for (int i = 0; i < k; i++) dot += scale * dwr[sel[i]] * p[sel[i]] / S;
            for (int i = 0; i < k; i++) dp[sel[i]] += (scale * dwr[sel[i]] - dot) / S;
        } else {
            for (int i = 0; i < k; i++) dp[sel[i]] += scale * dwr[sel[i]];
        }
        if (sigmoid) { /* each score its own logit's sigmoid: s (1 - s); no auxiliary loss */
            for (int j = 0; j < e; j++) dlr[j] = (float)(dp[j] * p[j] * (1.0 - p[j]));
            continue;
        }
        double dot = 0.0;
        for (int j = 0; j < e; j++) dot += p[j] * dp[j];
        for (int j = 0; j < e; j++) dlr[j] = (float)(p[j] * (dp[j] - dot));
    }
    return ZO_OK;
}

static float gate_of(float s, int sigmoid) { return sigmoid ? 1.0f / (1.0f + expf(-s)) : s; }

void cpu_moe_scale_forward(gpu_tensor y, gpu_tensor x, const float *scale, int n, int c,
                           int64_t lds, int sigmoid, int nt)
{
    nt = cpu_team(nt); /* 0: OpenMP's team (num_threads takes a positive count) */
#pragma omp parallel for num_threads(cpu_run_team(nt, (double)n * c)) schedule(static)
    for (int r = 0; r < n; r++) {
        float g = gate_of(scale[(size_t)r * lds], sigmoid);
        size_t o = (size_t)r * c;
        for (int j = 0; j < c; j++)
            zo_store_f32(y.data, y.dtype, o + j, g * zo_load_f32(x.data, x.dtype, o + j));
    }
}

void cpu_moe_scale_backward(gpu_tensor dx, float *dscale, gpu_tensor dy, gpu_tensor x,
                            const float *scale, int n, int c, int64_t lds, int sigmoid, int nt)
{
    nt = cpu_team(nt); /* 0: OpenMP's team (num_threads takes a positive count) */
#pragma omp parallel for num_threads(cpu_run_team(nt, (double)n * c)) schedule(static)
    for (int r = 0; r < n; r++) {
        float g = gate_of(scale[(size_t)r * lds], sigmoid);
        size_t o = (size_t)r * c;
        double dot = 0.0;
        for (int j = 0; j < c; j++)
            dot += (double)zo_load_f32(dy.data, dy.dtype, o + j) * zo_load_f32(x.data, x.dtype, o + j);
        /* dx may be dy: the dot product is complete before dx is written */
        for (int j = 0; j < c; j++)
            zo_store_f32(dx.data, dx.dtype, o + j, g * zo_load_f32(dy.data, dy.dtype, o + j));
        dscale[(size_t)r * lds] = (float)(sigmoid ? dot * g * (1.0f - g) : dot);
    }
}

void cpu_moe_gather(gpu_tensor y, gpu_tensor x, const int32_t *idx, int n, int c, int nt)
{
    nt = cpu_team(nt); /* 0: OpenMP's team (num_threads takes a positive count) */
#pragma omp parallel for num_threads(cpu_run_team(nt, (double)n * c)) schedule(static)
    for (int i = 0; i < n; i++) {
        size_t from = (size_t)idx[i] * c, to = (size_t)i * c;
        for (int j = 0; j < c; j++)
            zo_store_f32(y.data, y.dtype, to + j, zo_load_f32(x.data, x.dtype, from + j));
    }
}

void cpu_moe_scatter_add(gpu_tensor y, gpu_tensor x, const int32_t *idx, int n, int c, int64_t ldy,
                         int nt)
{
    nt = cpu_team(nt); /* 0: OpenMP's team (num_threads takes a positive count) */
#pragma omp parallel for num_threads(cpu_run_team(nt, (double)n * c)) schedule(static)
    for (int i = 0; i < n; i++) {
        size_t to = (size_t)idx[i] * (size_t)ldy, from = (size_t)i * c;
        for (int j = 0; j < c; j++)
            zo_store_f32(y.data, y.dtype, to + j,
                         zo_load_f32(y.data, y.dtype, to + j) + zo_load_f32(x.data, x.dtype, from + j));
    }
}
