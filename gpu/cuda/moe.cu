/* Mixture of experts: the router (softmax or sigmoid scores, the top k of
 * the keys, within the best groups when it has groups, their weights, or
 * Phi-3.5-MoE's sparsemixer; the load-balancing loss's statistics) forward and backward, and
 * the per-token scaling of an expert's output, with the formulas of the CPU
 * reference (gpu/ops_cpu_moe.c) in fp32. The router runs a row on a warp,
 * its keys in shared memory, and finds the chosen experts by rank: expert
 * j is chosen when fewer than k experts come before it (a larger key, or
 * an equal key and a lower index), each lane ranking its own experts. The
 * statistics of the load-balancing loss are summed a chunk of rows a
 * block, the chunks' sums then added in order, so they depend on the
 * shapes alone, never on timing. */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, grid_for */

#define BS 256

/* The router's kernels run a row on a warp (ROUTER_WARPS rows a block at
 * most). Each warp's shared memory holds the row's keys [e], its groups'
 * scores [64] and kept flags [64], and each expert's place in the choice
 * [e] (router_floats); the statistics kernel's sums [2 e] in double come
 * before every warp's. A lane owns experts lane, lane + 32, ... */
#define ROUTER_WARPS 8
#define ROUTER_SMEM (48u << 10) /* the shared memory a block may have without opting in */

__host__ __device__ static inline size_t router_floats(int e) { return 2 * (size_t)e + 128; }

/* A row's router on its warp: the gate's fields, the softmax's maximum and
 * sum (the softmax modes), the kept groups' bits (bit q: group q kept; all
 * with one group), the keys and places in shared memory. */
struct router_row {
    gpu_tensor logits;
    size_t r;
    int e, k, sigmoid, G, gsz;
    float mx, sum;
    unsigned long long kept;
    float *key; /* [e]: the score plus the bias */
    int *place; /* [e]: the experts before it in the choice, k when not chosen */
};

/* Expert j's score: p of the row's softmax, or the sigmoid of its logit */
__device__ float router_p(const router_row *c, int j)
{
    float x = tload(c->logits, c->r * c->e + j);
    return c->sigmoid ? 1.0f / (1.0f + expf(-x)) : expf(x - c->mx) / c->sum;
}

__device__ int router_allowed(const router_row *c, int j) { return (int)((c->kept >> (j / c->gsz)) & 1ull); }

/* Row r's router, by the whole warp (sm: its shared memory): the softmax's
 * maximum and sum (warp reductions), every key, the topk_groups best
 * groups (each scored by its best key, or its best two keys' sum with
 * sigmoid scores; a group is kept when fewer than topk_groups score above
 * it, or equal with a lower index), then each expert's place: the allowed
 * experts with a larger key, or an equal key and a lower index, so the k
 * chosen are the CPU's (largest key first, ties to the lower index). */
__device__ void router_route(router_row *c, float *sm, gpu_tensor logits, size_t r, int e, int k, int mode,
                             int groups, int topk_groups, const float *bias)
{
    const int lane = threadIdx.x % WARP;
    c->logits = logits, c->r = r, c->e = e, c->k = k;
    c->sigmoid = mode == GPU_MOE_ROUTE_SIGMOID || mode == GPU_MOE_ROUTE_SIGMOID_NORM;
    c->G = groups > 1 ? groups : 1, c->gsz = e / c->G;
    c->key = sm;
    float *gs = sm + e;
    int *kf = (int *)(gs + 64);
    c->place = kf + 64;
    float m = -INFINITY, s = 0.0f; /* (the softmax's alone: the sigmoid modes read neither) */
    if (!c->sigmoid) {
        for (int j = lane; j < e; j += WARP) m = fmaxf(m, tload(logits, r * e + j));
        m = warp_max(m);
        for (int j = lane; j < e; j += WARP) s += expf(tload(logits, r * e + j) - m);
        s = warp_sum(s);
    }
    c->mx = m, c->sum = s;
    __syncwarp(); /* the previous row's readers are done */
    for (int j = lane; j < e; j += WARP) {
        float p = router_p(c, j);
        sm[j] = bias ? p + bias[j] : p;
    }
    __syncwarp();
    c->kept = ~0ull;
    if (c->G > 1) {
        for (int q = lane; q < c->G; q += WARP) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int j = q * c->gsz; j < (q + 1) * c->gsz; j++) {
                float x = sm[j];
                if (x > b1) b2 = b1, b1 = x;
                else if (x > b2) b2 = x;
            }
            gs[q] = c->sigmoid ? b1 + b2 : b1;
        }
        __syncwarp();
        for (int q = lane; q < c->G; q += WARP) {
            int before = 0;
            for (int t = 0; t < c->G && before < topk_groups; t++)
                before += gs[t] > gs[q] || (gs[t] == gs[q] && t < q);
            kf[q] = before < topk_groups;
        }
        __syncwarp();
        c->kept = 0ull;
        for (int q = 0; q < c->G; q++)
            if (kf[q]) c->kept |= 1ull << q;
    }
    for (int j = lane; j < e; j += WARP) {
        int before = k;
        if (router_allowed(c, j)) {
            const float kj = sm[j];
            before = 0;
            for (int q = 0; q < e && before < k; q++)
                if (router_allowed(c, q)) before += sm[q] > kj || (sm[q] == kj && q < j);
        }
        c->place[j] = before;
    }
    __syncwarp();
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
 * choice over the logits its mask keeps (i1 left out of the second); every
 * lane of the warp alike (its two experts of at most a few dozen) */
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
 * none): each chosen expert's place, GPU_MOE_NOT_CHOSEN elsewhere. A row
 * a warp. */
__global__ void moe_router_forward_kernel(float *w, uint8_t *order, gpu_tensor logits, int n, int e, int k,
                                          int mode, double thr, int groups, int topk_groups,
                                          const float *bias, float scale)
{
    ZO_EXTERN_SHARED(float, smem);
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const size_t r = (size_t)blockIdx.x * (blockDim.x / WARP) + warp;
    if (r >= (size_t)n) return; /* (the whole warp) */
    if (mode == GPU_MOE_ROUTE_SPARSEMIXER) {
        int sel[2];
        float mw[2];
        mixer_row(logits, r, e, thr, sel, mw);
        for (int j = lane; j < e; j += WARP) {
            w[r * e + j] = j == sel[0] ? mw[0] : j == sel[1] ? mw[1] : 0.0f;
            if (order) order[r * e + j] = j == sel[0] ? 0 : j == sel[1] ? 1 : GPU_MOE_NOT_CHOSEN;
        }
        return;
    }
    const int norm = mode == GPU_MOE_ROUTE_NORM || mode == GPU_MOE_ROUTE_SIGMOID_NORM;
    router_row c;
    router_route(&c, smem + (size_t)warp * router_floats(e), logits, r, e, k, mode, groups, topk_groups, bias);
    float S = 0.0f;
    if (norm) {
        for (int j = lane; j < e; j += WARP)
            if (c.place[j] < k) S += router_p(&c, j);
        S = warp_sum(S);
    }
    if (mode == GPU_MOE_ROUTE_SIGMOID_NORM) S += 1e-20f;
    for (int j = lane; j < e; j += WARP) {
        const int at = c.place[j], ch = at < k;
        float wj = 0.0f;
        if (ch) {
            float p = router_p(&c, j);
            wj = norm ? p / S : p;
            if (scale != 0.0f) wj *= scale;
        }
        w[r * e + j] = wj;
        if (order) order[r * e + j] = ch ? (uint8_t)at : GPU_MOE_NOT_CHOSEN;
    }
}

/* The statistics of group g's rows chunk_rows at a time (blockIdx.x the
 * chunk, blockIdx.y the group): expert j's score summed over them, and
 * its rows choosing j, in double; a warp's rows each on the warp, the
 * warps' sums added in order. One chunk a group: stats [g, 2 e] itself;
 * more: part [g, chunk, 2 e], which moe_router_stats_sum_kernel adds. */
__global__ void moe_router_stats_kernel(float *stats, double *part, gpu_tensor logits, int n, int e, int k,
                                        int group_rows, int chunk_rows, int chunks, int mode, double thr,
                                        int groups, int topk_groups, const float *bias)
{
    ZO_EXTERN_SHARED(double, dsm);
    const int W = blockDim.x / WARP, warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int g = blockIdx.y, ch = blockIdx.x, mixer = mode == GPU_MOE_ROUTE_SPARSEMIXER;
    double *acc = dsm + (size_t)warp * 2 * e;
    float *sm = (float *)(dsm + (size_t)W * 2 * e) + (size_t)warp * router_floats(e);
    for (int j = lane; j < 2 * e; j += WARP) acc[j] = 0.0;
    const long long g0 = (long long)g * group_rows, g1 = n - g0 < group_rows ? n : g0 + group_rows;
    const long long r0 = g0 + (long long)ch * chunk_rows, r1 = g1 - r0 < chunk_rows ? g1 : r0 + chunk_rows;
    for (long long r = r0 + warp; r < r1; r += W) {
        router_row c;
        router_route(&c, sm, logits, (size_t)r, e, k, mode, groups, topk_groups, bias);
        int sel[2] = {-1, -1};
        float mw[2];
        if (mixer) mixer_row(logits, (size_t)r, e, thr, sel, mw); /* its choices, by the logits */
        for (int j = lane; j < e; j += WARP) {
            acc[j] += router_p(&c, j);
            acc[e + j] += mixer ? (double)(sel[0] == j || sel[1] == j) : (double)(c.place[j] < k);
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < 2 * e; j += blockDim.x) {
        double s = 0.0;
        for (int v = 0; v < W; v++) s += dsm[(size_t)v * 2 * e + j];
        if (chunks == 1) stats[(size_t)g * 2 * e + j] = (float)s;
        else part[((size_t)g * chunks + ch) * 2 * e + j] = s;
    }
}

/* stats [g, 2 e] = the sum of group g's chunks' part, in chunk order */
__global__ void moe_router_stats_sum_kernel(float *stats, const double *part, int e, int chunks)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x, g = blockIdx.y;
    if (j >= 2 * e) return;
    double s = 0.0;
    for (int c = 0; c < chunks; c++) s += part[((size_t)g * chunks + c) * 2 * e + j];
    stats[(size_t)g * 2 * e + j] = (float)s;
}

/* dlogits [n, e] = p (dp - sum_j p_j dp_j) (the softmax modes) or dp s (1 -
 * s) (the sigmoid's); dp_j = aux_j + the chosen weights' share, dweights
 * times the scale (through the normalization with the NORM modes); the
 * sparsemixer: dp_j = aux_j, plus each weight's masked softmax's backward,
 * dw_i w_i ([j == sel_i] - q_j) for the j its mask keeps. A row a warp. */
__global__ void moe_router_backward_kernel(float *dl, const float *dw, gpu_tensor logits,
                                           const float *stats, int n, int e, int k, int mode,
                                           int layers, int group_rows, float aux_scale, double thr,
                                           int ngroups, int topk_groups, const float *bias, float scale)
{
    ZO_EXTERN_SHARED(float, smem);
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const size_t r = (size_t)blockIdx.x * (blockDim.x / WARP) + warp;
    if (r >= (size_t)n) return; /* (the whole warp) */
    const int groups = (n + group_rows - 1) / group_rows;
    stats += (r / group_rows) * 2 * e; /* row r's group's, layer 0 */
    const float *dwr = dw + r * e;
    router_row c;
    router_route(&c, smem + (size_t)warp * router_floats(e), logits, r, e, k, mode, ngroups, topk_groups, bias);
    const int mixer = mode == GPU_MOE_ROUTE_SPARSEMIXER;
    const int norm = mode == GPU_MOE_ROUTE_NORM || mode == GPU_MOE_ROUTE_SIGMOID_NORM;
    const double sc = scale != 0.0f ? (double)scale : 1.0;
    int sel[2] = {-1, -1};
    float mw[2] = {0.0f, 0.0f};
    if (mixer) mixer_row(logits, r, e, thr, sel, mw);
    double S = 0.0, wdot = 0.0;
    if (!mixer) {
        for (int j = lane; j < e; j += WARP)
            if (c.place[j] < k) S += router_p(&c, j);
        S = warp_sum_d(S);
        if (mode == GPU_MOE_ROUTE_SIGMOID_NORM) S += 1e-20;
        for (int j = lane; j < e; j += WARP)
            if (c.place[j] < k) wdot += sc * dwr[j] * router_p(&c, j) / S;
        wdot = warp_sum_d(wdot);
    }
    /* two passes: the dot product of p and dp, then the gradient */
    double dot = 0.0;
    for (int pass = c.sigmoid; pass < 2; pass++) {
        for (int j = lane; j < e; j += WARP) {
            double cnt = 0.0;
            if (aux_scale != 0.0f)
                for (int l = 0; l < layers; l++) cnt += stats[(size_t)l * groups * 2 * e + e + j];
            double dp = (double)aux_scale * cnt;
            float p = router_p(&c, j);
            if (!mixer && c.place[j] < k) dp += norm ? (sc * dwr[j] - wdot) / S : sc * dwr[j];
            if (c.sigmoid) {
                dl[r * e + j] = (float)(dp * p * (1.0 - p));
                continue;
            }
            if (pass == 0) {
                dot += p * dp;
                continue;
            }
            float g = (float)(p * (dp - dot));
            if (mixer) {
                double dm = 0.0;
                float x = tload(logits, r * e + j);
                for (int i = 0; i < 2; i++) {
                    float m = tload(logits, r * e + sel[i]);
                    if ((i == 1 && j == sel[0]) || mixer_masked(m, x, thr)) continue;
                    dm += (double)dwr[sel[i]] * mw[i] * ((j == sel[i]) - (double)expf(x - m) * mw[i]);
                }
                g = (float)((double)g + dm);
            }
            dl[r * e + j] = g;
        }
        if (pass == 0) dot = warp_sum_d(dot);
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

/* dscale[r lds] = g' sum_j dy x, dx = g dy (dx may be dy: a lane reads
 * each of its elements before it writes it); a row a warp (ROW_WARPS rows
 * a block), the lanes' consecutive columns, the dot product in double */
#define ROW_WARPS 8
__global__ void moe_scale_backward_kernel(gpu_tensor dx, float *dscale, gpu_tensor dy, gpu_tensor x,
                                          const float *scale, int n, int c, int64_t lds, int sigmoid)
{
    const int lane = threadIdx.x % WARP;
    const size_t r = (size_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= (size_t)n) return; /* (the whole warp) */
    const float g = moe_gate(scale[r * lds], sigmoid);
    const size_t o = r * c;
    double dot = 0.0;
    for (int j = lane; j < c; j += WARP) {
        const float d = tload(dy, o + j);
        dot += (double)d * tload(x, o + j);
        tstore(dx, o + j, g * d);
    }
    dot = warp_sum_d(dot);
    if (lane == 0) dscale[r * lds] = (float)(sigmoid ? dot * g * (1.0f - g) : dot);
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

/* Rows (warps) a block of the router's kernels whose warps each take
 * `per` bytes of shared memory: up to ROUTER_WARPS within ROUTER_SMEM; 0
 * when not even one fits. */
static int router_warps(size_t per)
{
    size_t w = ROUTER_SMEM / per;
    return w > ROUTER_WARPS ? ROUTER_WARPS : (int)w;
}

static zo_status router_too_wide(const char *op, int e, size_t per)
{
    return zo_error(ZO_ERR_UNSUPPORTED, "%s: %d experts take %zu bytes of shared memory a row, above the "
                    "kernel's %u", op, e, per, ROUTER_SMEM);
}

extern "C" zo_status cuda_launch_moe_router_forward(cudaStream_t st, void *ws, size_t ws_bytes,
                                                    gpu_tensor weights, gpu_tensor logits, float *stats,
                                                    uint8_t *order, int n, int e, int k, const gpu_moe_gate *g,
                                                    int group_rows)
{
    const double thr = 2.0 * (double)g->eps;
    const size_t per = router_floats(e) * sizeof(float), per_stats = per + 2 * (size_t)e * sizeof(double);
    const int W = router_warps(per), Ws = router_warps(per_stats);
    if (!W) return router_too_wide("gpu_moe_router_forward", e, per);
    if (!Ws) return router_too_wide("gpu_moe_router_forward's statistics", e, per_stats);
    ZO_LAUNCH(moe_router_forward_kernel, (unsigned)((n + W - 1) / W), W * WARP, W * per, st,
              (float *)weights.data, order, logits, n, e, k, (int)g->mode, thr, g->groups, g->topk_groups,
              g->bias, g->scale);
    zo_status s = cuda_launch_check("moe_router_forward_kernel");
    if (s != ZO_OK) return s;
    /* the statistics: a block for each chunk of a group's rows (four rows
     * a warp), their sums in the workspace; chunks twice as long while
     * those do not fit it, and a chunk the whole group when even that
     * does not (its block writes the statistics itself) */
    const int groups = (n + group_rows - 1) / group_rows, rows = n < group_rows ? n : group_rows;
    if (groups > 65535)
        return zo_error(ZO_ERR_UNSUPPORTED, "gpu_moe_router_forward: %d groups of rows for the statistics, above "
                        "the grid's 65535", groups);
    long long chunk_rows = 4LL * Ws, chunks = (rows + chunk_rows - 1) / chunk_rows;
    while (chunks > 1 && (size_t)groups * (size_t)chunks * 2 * (size_t)e * sizeof(double) > ws_bytes) {
        chunk_rows *= 2;
        chunks = (rows + chunk_rows - 1) / chunk_rows;
    }
    if (!ws) chunk_rows = rows, chunks = 1;
    ZO_LAUNCH(moe_router_stats_kernel, dim3((unsigned)chunks, (unsigned)groups), Ws * WARP, Ws * per_stats, st,
              stats, (double *)ws, logits, n, e, k, group_rows, (int)chunk_rows, (int)chunks, (int)g->mode, thr,
              g->groups, g->topk_groups, g->bias);
    s = cuda_launch_check("moe_router_stats_kernel");
    if (s != ZO_OK || chunks == 1) return s;
    ZO_LAUNCH(moe_router_stats_sum_kernel, dim3((unsigned)((2 * e + BS - 1) / BS), (unsigned)groups), BS, 0, st,
              stats, (const double *)ws, e, (int)chunks);
    return cuda_launch_check("moe_router_stats_sum_kernel");
}

extern "C" zo_status cuda_launch_moe_router_backward(cudaStream_t st, gpu_tensor dlogits,
                                                     gpu_tensor dweights, gpu_tensor logits,
                                                     const float *stats, int n, int e, int k,
                                                     const gpu_moe_gate *g, int layers, int group_rows,
                                                     float aux_scale)
{
    const size_t per = router_floats(e) * sizeof(float);
    const int W = router_warps(per);
    if (!W) return router_too_wide("gpu_moe_router_backward", e, per);
    ZO_LAUNCH(moe_router_backward_kernel, (unsigned)((n + W - 1) / W), W * WARP, W * per, st,
              (float *)dlogits.data, (const float *)dweights.data, logits, stats, n, e, k, (int)g->mode, layers,
              group_rows, aux_scale, 2.0 * (double)g->eps, g->groups, g->topk_groups, g->bias, g->scale);
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
    ZO_LAUNCH(moe_scale_backward_kernel, (unsigned)((n + ROW_WARPS - 1) / ROW_WARPS), ROW_WARPS * WARP, 0, st, dx,
              dscale, dy, x, scale, n, c, lds, sigmoid);
    return cuda_launch_check("moe_scale_backward_kernel");
}
