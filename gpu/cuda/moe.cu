/* Mixture of experts: the router (softmax over the experts, the top k, their
 * weights, or Phi-3.5-MoE's sparsemixer; the load-balancing loss's statistics) forward and backward, and
 * the per-token scaling of an expert's output, with the formulas of the CPU
 * reference (gpu/ops_cpu_moe.c) in fp32. The router runs one thread per
 * row (or per expert for the statistics) and finds the chosen experts by
 * rank, so no thread holds an array: expert j is chosen when fewer than k
 * experts come before it (a larger p, or an equal p and a lower index). */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, grid_for */

#define BS 256

/* Row r's softmax: the maximum and the sum of exp(l - max). */
__device__ void router_row(gpu_tensor logits, size_t r, int e, float *mx, float *sum)
{
    float m = -INFINITY, s = 0.0f;
    for (int j = 0; j < e; j++) m = fmaxf(m, tload(logits, r * e + j));
    for (int j = 0; j < e; j++) s += expf(tload(logits, r * e + j) - m);
    *mx = m;
    *sum = s;
}

__device__ float router_p(gpu_tensor logits, size_t r, int e, int j, float mx, float sum)
{
    return expf(tload(logits, r * e + j) - mx) / sum;
}

/* Expert j's place in row r's choice (the experts before it), or k when
 * it is not chosen */
__device__ int router_place(gpu_tensor logits, size_t r, int e, int k, int j, float mx, float sum)
{
    float pj = router_p(logits, r, e, j, mx, sum);
    int before = 0;
    for (int q = 0; q < e && before < k; q++) {
        float pq = router_p(logits, r, e, q, mx, sum);
        before += pq > pj || (pq == pj && q < j);
    }
    return before;
}

__device__ int router_chosen(gpu_tensor logits, size_t r, int e, int k, int j, float mx, float sum)
{
    return router_place(logits, r, e, k, j, mx, sum) < k;
}

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

/* weights [n, e]: the chosen experts' p (divided by their sum with norm), 0
 * elsewhere; the sparsemixer's two weights (mode 2); order [n, e] (NULL:
 * none): each chosen expert's place, GPU_MOE_NOT_CHOSEN elsewhere */
__global__ void moe_router_forward_kernel(float *w, uint8_t *order, gpu_tensor logits, int n, int e, int k,
                                          int norm, double thr)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    if (norm == 2) {
        int sel[2];
        float mw[2];
        mixer_row(logits, r, e, thr, sel, mw);
        for (int j = 0; j < e; j++) {
            w[(size_t)r * e + j] = j == sel[0] ? mw[0] : j == sel[1] ? mw[1] : 0.0f;
            if (order) order[(size_t)r * e + j] = j == sel[0] ? 0 : j == sel[1] ? 1 : GPU_MOE_NOT_CHOSEN;
        }
        return;
    }
    float mx, sum, S = 0.0f;
    router_row(logits, r, e, &mx, &sum);
    for (int j = 0; j < e; j++)
        if (router_chosen(logits, r, e, k, j, mx, sum)) S += router_p(logits, r, e, j, mx, sum);
    for (int j = 0; j < e; j++) {
        float p = router_p(logits, r, e, j, mx, sum);
        int at = router_place(logits, r, e, k, j, mx, sum), c = at < k;
        w[(size_t)r * e + j] = c ? (norm ? p / S : p) : 0.0f;
        if (order) order[(size_t)r * e + j] = c ? (uint8_t)at : GPU_MOE_NOT_CHOSEN;
    }
}

/* stats [groups, 2 e]: expert j's p summed over group g's rows (group_rows
 * of them from g group_rows), and its rows choosing j; one thread per
 * expert and group (blockIdx.y), the rows in order */
__global__ void moe_router_stats_kernel(float *stats, gpu_tensor logits, int n, int e, int k, int group_rows,
                                        int mixer, double thr)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x, g = blockIdx.y;
    if (j >= e) return;
    double ps = 0.0, cnt = 0.0;
    const int r0 = g * group_rows, r1 = n - r0 < group_rows ? n : r0 + group_rows;
    stats += (size_t)g * 2 * e;
    for (int r = r0; r < r1; r++) {
        float mx, sum;
        router_row(logits, r, e, &mx, &sum);
        ps += router_p(logits, r, e, j, mx, sum);
        if (mixer) { /* its choices, by the logits */
            int sel[2];
            float mw[2];
            mixer_row(logits, r, e, thr, sel, mw);
            cnt += sel[0] == j || sel[1] == j;
        } else {
            cnt += router_chosen(logits, r, e, k, j, mx, sum);
        }
    }
    stats[j] = (float)ps;
    stats[e + j] = (float)cnt;
}

/* dlogits [n, e] = p (dp - sum_j p_j dp_j); dp_j = aux_j + the chosen
 * weights' share (through the normalization with norm); the sparsemixer
 * (norm 2): dp_j = aux_j, plus each weight's masked softmax's backward,
 * dw_i w_i ([j == sel_i] - q_j) for the j its mask keeps */
__global__ void moe_router_backward_kernel(float *dl, const float *dw, gpu_tensor logits,
                                           const float *stats, int n, int e, int k, int norm,
                                           int layers, int group_rows, float aux_scale, double thr)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    const int groups = (n + group_rows - 1) / group_rows;
    stats += (size_t)(r / group_rows) * 2 * e; /* row r's group's, layer 0 */
    const float *dwr = dw + (size_t)r * e;
    float mx, sum;
    router_row(logits, r, e, &mx, &sum);
    const int mixer = norm == 2;
    int sel[2] = {-1, -1};
    float mw[2] = {0.0f, 0.0f};
    if (mixer) mixer_row(logits, r, e, thr, sel, mw);
    double S = 0.0, wdot = 0.0;
    for (int j = 0; j < e && !mixer; j++)
        if (router_chosen(logits, r, e, k, j, mx, sum)) S += router_p(logits, r, e, j, mx, sum);
    for (int j = 0; j < e && !mixer; j++)
        if (router_chosen(logits, r, e, k, j, mx, sum))
            wdot += (double)dwr[j] * router_p(logits, r, e, j, mx, sum) / S;
    /* two passes: the dot product of p and dp, then the gradient */
    double dot = 0.0;
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < e; j++) {
            double cnt = 0.0;
            if (aux_scale != 0.0f)
                for (int l = 0; l < layers; l++) cnt += stats[(size_t)l * groups * 2 * e + e + j];
            double dp = (double)aux_scale * cnt;
            float p = router_p(logits, r, e, j, mx, sum);
            if (!mixer && router_chosen(logits, r, e, k, j, mx, sum)) dp += norm ? (dwr[j] - wdot) / S : dwr[j];
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
                                                    int n, int e, int k, int mode, float eps,
                                                    int group_rows)
{
    const double thr = 2.0 * (double)eps;
    ZO_LAUNCH(moe_router_forward_kernel, (n + BS - 1) / BS, BS, 0, st, (float *)weights.data, order,
              logits, n, e, k, mode, thr);
    zo_status s = cuda_launch_check("moe_router_forward_kernel");
    if (s != ZO_OK) return s;
    const int groups = (n + group_rows - 1) / group_rows;
    ZO_LAUNCH(moe_router_stats_kernel, dim3((e + BS - 1) / BS, groups), BS, 0, st, stats, logits, n, e, k,
              group_rows, mode == 2, thr);
    return cuda_launch_check("moe_router_stats_kernel");
}

extern "C" zo_status cuda_launch_moe_router_backward(cudaStream_t st, gpu_tensor dlogits,
                                                     gpu_tensor dweights, gpu_tensor logits,
                                                     const float *stats, int n, int e, int k,
                                                     int mode, float eps, int layers, int group_rows,
                                                     float aux_scale)
{
    ZO_LAUNCH(moe_router_backward_kernel, (n + BS - 1) / BS, BS, 0, st, (float *)dlogits.data,
              (const float *)dweights.data, logits, stats, n, e, k, mode, layers, group_rows, aux_scale,
              2.0 * (double)eps);
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
