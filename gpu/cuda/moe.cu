/* Mixture of experts: the router (softmax or sigmoid scores, the top k of
 * the keys, within the best groups when it has groups, their weights, or
 * Phi-3.5-MoE's sparsemixer; the load-balancing loss's statistics) forward and backward, and
 * the per-token scaling of an expert's output, with the formulas of the CPU
 * reference (gpu/ops_cpu_moe.c) in fp32. The router runs one thread per
 * row (or per expert for the statistics) and finds the chosen experts by
 * rank, so no thread holds an array: expert j is chosen when fewer than k
 * experts come before it (a larger p, or an equal p and a lower index). */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, grid_for */

#define BS 256

/* A row's router as the kernels read it: the gate's fields, the softmax's
 * maximum and sum (the softmax modes), and the kept groups' bits (bit q:
 * group q kept; all with one group). */
struct router_ctx {
    gpu_tensor logits;
    size_t r;
    int e, k, sigmoid, groups, gsz;
    const float *bias;
    float mx, sum;
    unsigned long long kept;
};

/* Expert j's score: p of the row's softmax, or the sigmoid of its logit */
__device__ float router_p(const router_ctx *c, int j)
{
    float x = tload(c->logits, c->r * c->e + j);
    return c->sigmoid ? 1.0f / (1.0f + expf(-x)) : expf(x - c->mx) / c->sum;
}

/* Its key for the choice: the score plus the bias */
__device__ float router_key(const router_ctx *c, int j)
{
    float p = router_p(c, j);
    return c->bias ? p + c->bias[j] : p;
}

/* Group q's score: its best key (softmax) or its best two keys' sum (sigmoid) */
__device__ float router_group_score(const router_ctx *c, int q)
{
    float b1 = -INFINITY, b2 = -INFINITY;
    for (int j = q * c->gsz; j < (q + 1) * c->gsz; j++) {
        float x = router_key(c, j);
        if (x > b1) b2 = b1, b1 = x;
        else if (x > b2) b2 = x;
    }
    return c->sigmoid ? b1 + b2 : b1;
}

/* Row r's context: the softmax's maximum and sum, and the topk_groups best
 * groups (a group is kept when fewer than topk_groups score above it, or
 * equal with a lower index) */
__device__ void router_row(router_ctx *c, gpu_tensor logits, size_t r, int e, int k, int mode, int groups,
                           int topk_groups, const float *bias)
{
    c->logits = logits, c->r = r, c->e = e, c->k = k, c->bias = bias;
    c->sigmoid = mode == GPU_MOE_ROUTE_SIGMOID || mode == GPU_MOE_ROUTE_SIGMOID_NORM;
    c->groups = groups > 1 ? groups : 1, c->gsz = e / c->groups;
    float m = -INFINITY, s = 0.0f; /* (the softmax's alone: the sigmoid modes read neither) */
    for (int j = 0; j < e && !c->sigmoid; j++) m = fmaxf(m, tload(logits, r * e + j));
    for (int j = 0; j < e && !c->sigmoid; j++) s += expf(tload(logits, r * e + j) - m);
    c->mx = m, c->sum = s;
    c->kept = ~0ull;
    if (c->groups > 1) {
        c->kept = 0ull;
        for (int q = 0; q < c->groups; q++) {
            float gq = router_group_score(c, q);
            int before = 0;
            for (int t = 0; t < c->groups && before < topk_groups; t++) {
                float gt = router_group_score(c, t);
                before += gt > gq || (gt == gq && t < q);
            }
            if (before < topk_groups) c->kept |= 1ull << q;
        }
    }
}

__device__ int router_allowed(const router_ctx *c, int j) { return (int)((c->kept >> (j / c->gsz)) & 1ull); }

/* Expert j's place in row r's choice (the allowed experts before it), or
 * k when it is not chosen */
__device__ int router_place(const router_ctx *c, int j)
{
    if (!router_allowed(c, j)) return c->k;
    float kj = router_key(c, j);
    int before = 0;
    for (int q = 0; q < c->e && before < c->k; q++) {
        if (!router_allowed(c, q)) continue;
        float kq = router_key(c, q);
        before += kq > kj || (kq == kj && q < j);
    }
    return before;
}

__device__ int router_chosen(const router_ctx *c, int j) { return router_place(c, j) < c->k; }

/* The sparsemixer (GPU_MOE_ROUTE_SPARSEMIXER, eval form; gpu/ops_cpu_moe.c's
 * mixer_row): whether logit x lies more than thr below the maximum m,
 * relative to max(|x|, m), in double (0 / 0 kept) */
__device__ int mixer_masked(float m, float x, double thr)
{
    double f = fmax(fabs((double)x), (double)m);
    return ((double)m - (double)x) / f > thr;
}

/* Row r's two choices (i1 the largest logit, i2 the largest of the rest,
 * ties to the lower index) and their weights: each the softmax at its
 * choice over the logits its mask keeps (i1 left out of the second) */
__device__ void mixer_row(gpu_tensor logits, size_t r, int e, double thr, int *sel, float *w)
{
    for (int i = 0; i < 2; i++) {
        int best = -1;
        float m = 0.0f;
        for (int j = 0; j < e; j++) {
            float x = tload(logits, r * e + j);
            if ((i == 0 || j != sel[0]) && (best < 0 || x > m)) best = j, m = x;
        }
        float sum = 0.0f;
        for (int j = 0; j < e; j++) {
            float x = tload(logits, r * e + j);
            if ((i == 0 || j != sel[0]) && !mixer_masked(m, x, thr)) sum += expf(x - m);
        }
        sel[i] = best;
        w[i] = 1.0f / sum;
    }
}

/* weights [n, e]: the chosen experts' scores (divided by their sum with
 * the NORM modes, plus 1e-20 for the sigmoid's), times the scale (0:
 * none), 0 elsewhere; the sparsemixer's two weights; order [n, e] (NULL:
 * none): each chosen expert's place, GPU_MOE_NOT_CHOSEN elsewhere */
__global__ void moe_router_forward_kernel(float *w, uint8_t *order, gpu_tensor logits, int n, int e, int k,
                                          int mode, double thr, int groups, int topk_groups,
                                          const float *bias, float scale)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    if (mode == GPU_MOE_ROUTE_SPARSEMIXER) {
        int sel[2];
        float mw[2];
        mixer_row(logits, r, e, thr, sel, mw);
        for (int j = 0; j < e; j++) {
            w[(size_t)r * e + j] = j == sel[0] ? mw[0] : j == sel[1] ? mw[1] : 0.0f;
            if (order) order[(size_t)r * e + j] = j == sel[0] ? 0 : j == sel[1] ? 1 : GPU_MOE_NOT_CHOSEN;
        }
        return;
    }
    const int norm = mode == GPU_MOE_ROUTE_NORM || mode == GPU_MOE_ROUTE_SIGMOID_NORM;
    router_ctx c;
    router_row(&c, logits, r, e, k, mode, groups, topk_groups, bias);
    float S = 0.0f;
    for (int j = 0; j < e && norm; j++)
        if (router_chosen(&c, j)) S += router_p(&c, j);
    if (mode == GPU_MOE_ROUTE_SIGMOID_NORM) S += 1e-20f;
    for (int j = 0; j < e; j++) {
        float p = router_p(&c, j);
        int at = router_place(&c, j), ch = at < k;
        float wj = norm ? p / S : p;
        w[(size_t)r * e + j] = ch ? (scale != 0.0f ? wj * scale : wj) : 0.0f;
        if (order) order[(size_t)r * e + j] = ch ? (uint8_t)at : GPU_MOE_NOT_CHOSEN;
    }
}

/* stats [groups, 2 e]: expert j's score summed over group g's rows
 * (group_rows of them from g group_rows), and its rows choosing j; one
 * thread per expert and group (blockIdx.y), the rows in order */
__global__ void moe_router_stats_kernel(float *stats, gpu_tensor logits, int n, int e, int k, int group_rows,
                                        int mode, double thr, int groups, int topk_groups, const float *bias)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x, g = blockIdx.y;
    if (j >= e) return;
    double ps = 0.0, cnt = 0.0;
    const int r0 = g * group_rows, r1 = n - r0 < group_rows ? n : r0 + group_rows;
    stats += (size_t)g * 2 * e;
    for (int r = r0; r < r1; r++) {
        router_ctx c;
        router_row(&c, logits, r, e, k, mode, groups, topk_groups, bias);
        ps += router_p(&c, j);
        if (mode == GPU_MOE_ROUTE_SPARSEMIXER) { /* its choices, by the logits */
            int sel[2];
            float mw[2];
            mixer_row(logits, r, e, thr, sel, mw);
            cnt += sel[0] == j || sel[1] == j;
        } else {
            cnt += router_chosen(&c, j);
        }
    }
    stats[j] = (float)ps;
    stats[e + j] = (float)cnt;
}

/* dlogits [n, e] = p (dp - sum_j p_j dp_j) (the softmax modes) or dp s (1 -
 * s) (the sigmoid's); dp_j = aux_j + the chosen weights' share, dweights
 * times the scale (through the normalization with the NORM modes); the
 * sparsemixer: dp_j = aux_j, plus each weight's masked softmax's backward,
 * dw_i w_i ([j == sel_i] - q_j) for the j its mask keeps */
__global__ void moe_router_backward_kernel(float *dl, const float *dw, gpu_tensor logits,
                                           const float *stats, int n, int e, int k, int mode,
                                           int layers, int group_rows, float aux_scale, double thr,
                                           int ngroups, int topk_groups, const float *bias, float scale)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    const int groups = (n + group_rows - 1) / group_rows;
    stats += (size_t)(r / group_rows) * 2 * e; /* row r's group's, layer 0 */
    const float *dwr = dw + (size_t)r * e;
    router_ctx c;
    router_row(&c, logits, r, e, k, mode, ngroups, topk_groups, bias);
    const int mixer = mode == GPU_MOE_ROUTE_SPARSEMIXER;
    const int norm = mode == GPU_MOE_ROUTE_NORM || mode == GPU_MOE_ROUTE_SIGMOID_NORM;
    const double sc = scale != 0.0f ? (double)scale : 1.0;
    int sel[2] = {-1, -1};
    float mw[2] = {0.0f, 0.0f};
    if (mixer) mixer_row(logits, r, e, thr, sel, mw);
    double S = 0.0, wdot = 0.0;
    for (int j = 0; j < e && !mixer; j++)
        if (router_chosen(&c, j)) S += router_p(&c, j);
    if (mode == GPU_MOE_ROUTE_SIGMOID_NORM) S += 1e-20;
    for (int j = 0; j < e && !mixer; j++)
        if (router_chosen(&c, j)) wdot += sc * dwr[j] * router_p(&c, j) / S;
    /* two passes: the dot product of p and dp, then the gradient */
    double dot = 0.0;
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < e; j++) {
            double cnt = 0.0;
            if (aux_scale != 0.0f)
                for (int l = 0; l < layers; l++) cnt += stats[(size_t)l * groups * 2 * e + e + j];
            double dp = (double)aux_scale * cnt;
            float p = router_p(&c, j);
            if (!mixer && router_chosen(&c, j)) dp += norm ? (sc * dwr[j] - wdot) / S : sc * dwr[j];
            if (c.sigmoid) {
                if (pass == 1) dl[(size_t)r * e + j] = (float)(dp * p * (1.0 - p));
                continue;
            }
            if (pass == 0) {
                dot += p * dp;
                continue;
            }
            float g = (float)(p * (dp - dot));
            if (mixer) {
                double dm = 0.0;
                float x = tload(logits, (size_t)r * e + j);
                for (int i = 0; i < 2; i++) {
                    float m = tload(logits, (size_t)r * e + sel[i]);
                    if ((i == 1 && j == sel[0]) || mixer_masked(m, x, thr)) continue;
                    dm += (double)dwr[sel[i]] * mw[i] * ((j == sel[i]) - (double)expf(x - m) * mw[i]);
                }
                g = (float)((double)g + dm);
            }
            dl[(size_t)r * e + j] = g;
        }
}

__device__ float moe_gate(float s, int sigmoid) { return sigmoid ? 1.0f / (1.0f + expf(-s)) : s; }

/* y [n, c] = g(scale[r lds]) x */
__global__ void moe_scale_forward_kernel(gpu_tensor y, gpu_tensor x, const float *scale, int n,
                                         int c, int64_t lds, int sigmoid)
{
    size_t total = (size_t)n * c;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / c;
        tstore(y, i, moe_gate(scale[r * lds], sigmoid) * tload(x, i));
    }
}

/* dscale[r lds] = g' sum_j dy x, dx = g dy (dx may be dy); one thread per row */
__global__ void moe_scale_backward_kernel(gpu_tensor dx, float *dscale, gpu_tensor dy, gpu_tensor x,
                                          const float *scale, int n, int c, int64_t lds, int sigmoid)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    float g = moe_gate(scale[(size_t)r * lds], sigmoid);
    size_t o = (size_t)r * c;
    double dot = 0.0;
    for (int j = 0; j < c; j++) dot += (double)tload(dy, o + j) * tload(x, o + j);
    for (int j = 0; j < c; j++) tstore(dx, o + j, g * tload(dy, o + j));
    dscale[(size_t)r * lds] = (float)(sigmoid ? dot * g * (1.0f - g) : dot);
}

/* y[i, :] = x[idx[i], :]; one thread per element */
__global__ void moe_gather_kernel(gpu_tensor y, gpu_tensor x, const int32_t *idx, int n, int c)
{
    size_t total = (size_t)n * c;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / c, j = e % c;
        tstore(y, e, tload(x, (size_t)idx[i] * c + j));
    }
}

/* y[idx[i] ldy + j] += x[i, j]; idx repeats no row, so no two threads add
 * to one element */
__global__ void moe_scatter_add_kernel(gpu_tensor y, gpu_tensor x, const int32_t *idx, int n, int c,
                                       int64_t ldy)
{
    size_t total = (size_t)n * c;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / c, j = e % c, to = (size_t)idx[i] * (size_t)ldy + j;
        tstore(y, to, tload(y, to) + tload(x, e));
    }
}

extern "C" zo_status cuda_launch_moe_gather(cudaStream_t st, gpu_tensor y, gpu_tensor x,
                                            const int32_t *idx, int n, int c)
{
    ZO_LAUNCH(moe_gather_kernel, grid_for((size_t)n * c, BS), BS, 0, st, y, x, idx, n, c);
    return cuda_launch_check("moe_gather_kernel");
}

extern "C" zo_status cuda_launch_moe_scatter_add(cudaStream_t st, gpu_tensor y, gpu_tensor x,
                                                 const int32_t *idx, int n, int c, int64_t ldy)
{
    ZO_LAUNCH(moe_scatter_add_kernel, grid_for((size_t)n * c, BS), BS, 0, st, y, x, idx, n, c, ldy);
    return cuda_launch_check("moe_scatter_add_kernel");
}

extern "C" zo_status cuda_launch_moe_router_forward(cudaStream_t st, gpu_tensor weights,
                                                    gpu_tensor logits, float *stats, uint8_t *order,
                                                    int n, int e, int k, const gpu_moe_gate *g,
                                                    int group_rows)
{
    const double thr = 2.0 * (double)g->eps;
    ZO_LAUNCH(moe_router_forward_kernel, (n + BS - 1) / BS, BS, 0, st, (float *)weights.data, order,
              logits, n, e, k, (int)g->mode, thr, g->groups, g->topk_groups, g->bias, g->scale);
    zo_status s = cuda_launch_check("moe_router_forward_kernel");
    if (s != ZO_OK) return s;
    const int groups = (n + group_rows - 1) / group_rows;
    ZO_LAUNCH(moe_router_stats_kernel, dim3((e + BS - 1) / BS, groups), BS, 0, st, stats, logits, n, e, k,
              group_rows, (int)g->mode, thr, g->groups, g->topk_groups, g->bias);
    return cuda_launch_check("moe_router_stats_kernel");
}

extern "C" zo_status cuda_launch_moe_router_backward(cudaStream_t st, gpu_tensor dlogits,
                                                     gpu_tensor dweights, gpu_tensor logits,
                                                     const float *stats, int n, int e, int k,
                                                     const gpu_moe_gate *g, int layers, int group_rows,
                                                     float aux_scale)
{
    ZO_LAUNCH(moe_router_backward_kernel, (n + BS - 1) / BS, BS, 0, st, (float *)dlogits.data,
              (const float *)dweights.data, logits, stats, n, e, k, (int)g->mode, layers, group_rows,
              aux_scale, 2.0 * (double)g->eps, g->groups, g->topk_groups, g->bias, g->scale);
    return cuda_launch_check("moe_router_backward_kernel");
}

extern "C" zo_status cuda_launch_moe_scale_forward(cudaStream_t st, gpu_tensor y, gpu_tensor x,
                                                   const float *scale, int n, int c, int64_t lds,
                                                   int sigmoid)
{
    ZO_LAUNCH(moe_scale_forward_kernel, grid_for((size_t)n * c, BS), BS, 0, st, y, x, scale, n, c,
              lds, sigmoid);
    return cuda_launch_check("moe_scale_forward_kernel");
}

extern "C" zo_status cuda_launch_moe_scale_backward(cudaStream_t st, gpu_tensor dx, float *dscale,
                                                    gpu_tensor dy, gpu_tensor x, const float *scale,
                                                    int n, int c, int64_t lds, int sigmoid)
{
    ZO_LAUNCH(moe_scale_backward_kernel, (n + BS - 1) / BS, BS, 0, st, dx, dscale, dy, x, scale, n,
              c, lds, sigmoid);
    return cuda_launch_check("moe_scale_backward_kernel");
}
