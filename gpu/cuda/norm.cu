/* LayerNorm and RMSNorm over the last dimension, forward and backward.
 * Row statistics: one warp per row, each lane striding over the columns,
 * sums in double combined by a butterfly (as the CPU reference sums in
 * double). Parameter gradients: column sums over rows split into a fixed set
 * of row groups combined in a fixed order (no atomics, run-to-run stable). */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, warp_sum_d */

#define ROWS_PER_BLOCK 4 /* warps per block, one row each */
#define COLS 32          /* columns per block of the parameter gradients */
#define ROWG 16          /* row groups per block of the parameter gradients */

/* y = (x - mean) * rstd * w + b; x, y [n, c]; w, b [c] (b.data may be NULL);
 * mean, rstd [n] */
__global__ void layernorm_forward_kernel(gpu_tensor y, float *mean, float *rstd, gpu_tensor x,
                                         gpu_tensor w, gpu_tensor b, int n, int c, float eps)
{
    int lane = threadIdx.x % WARP, r = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (r >= n) return; /* no block-wide barrier below */
    size_t off = (size_t)r * c;
    double s = 0.0;
    for (int j = lane; j < c; j += WARP) s += tload(x, off + j);
    float m = (float)(warp_sum_d(s) / c);
    double v = 0.0;
    for (int j = lane; j < c; j += WARP) {
        float dv = tload(x, off + j) - m;
        v += (double)dv * dv;
    }
    float rs = (float)(1.0 / sqrt(warp_sum_d(v) / c + (double)eps));
    for (int j = lane; j < c; j += WARP) {
        float bj = b.data ? tload(b, j) : 0.0f;
        tstore(y, off + j, (tload(x, off + j) - m) * rs * tload(w, j) + bj);
    }
    if (lane == 0) {
        mean[r] = m;
        rstd[r] = rs;
    }
}

/* dx += rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), with
 * dxhat = dy * w, xhat = (x - mean) * rstd; one warp per row */
__global__ void layernorm_backward_dx_kernel(gpu_tensor dx, gpu_tensor dy, gpu_tensor x,
                                             gpu_tensor w, const float *mean, const float *rstd,
                                             int n, int c)
{
    int lane = threadIdx.x % WARP, r = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (r >= n) return;
    size_t off = (size_t)r * c;
    float m = mean[r], rs = rstd[r];
    double s1 = 0.0, s2 = 0.0;
    for (int j = lane; j < c; j += WARP) {
        float xh = (tload(x, off + j) - m) * rs, dxh = tload(dy, off + j) * tload(w, j);
        s1 += dxh;
        s2 += (double)dxh * xh;
    }
    float m1 = (float)(warp_sum_d(s1) / c), m2 = (float)(warp_sum_d(s2) / c);
    for (int j = lane; j < c; j += WARP) {
        float xh = (tload(x, off + j) - m) * rs, dxh = tload(dy, off + j) * tload(w, j);
        tstore(dx, off + j, tload(dx, off + j) + rs * (dxh - m1 - xh * m2));
    }
}

/* One warp's row of c: y[yo..] = x[xo..] * rstd * w (y may be x), rstd =
 * 1/sqrt(mean(x^2) + eps) returned; x's values copied to saved[so..] when
 * saved.data is not NULL */
__device__ __forceinline__ float rmsnorm_warp_row(gpu_tensor y, size_t yo, gpu_tensor x, size_t xo, gpu_tensor saved,
                                                 size_t so, gpu_tensor w, int c, float eps, int lane)
{
    double ss = 0.0;
    for (int j = lane; j < c; j += WARP) {
        float v = tload(x, xo + j);
        ss += (double)v * v;
    }
    float rs = (float)(1.0 / sqrt(warp_sum_d(ss) / c + (double)eps));
    for (int j = lane; j < c; j += WARP) {
        float v = tload(x, xo + j);
        if (saved.data) tstore(saved, so + j, v);
        tstore(y, yo + j, v * rs * tload(w, j));
    }
    return rs;
}

/* One warp's row of c: dx[dxo..] (+)= rstd * (dy*w - x*rstd * mean(dy*w * x*rstd)),
 * added to dx when add, else written (dx may then be dy: in place) */
__device__ __forceinline__ void rmsnorm_warp_dx(gpu_tensor dx, size_t dxo, gpu_tensor dy, size_t dyo, gpu_tensor x,
                                               size_t xo, gpu_tensor w, float rs, int c, int add, int lane)
{
    double s2 = 0.0;
    for (int j = lane; j < c; j += WARP)
        s2 += (double)(tload(dy, dyo + j) * tload(w, j)) * (tload(x, xo + j) * rs);
    float m2 = (float)(warp_sum_d(s2) / c);
    for (int j = lane; j < c; j += WARP) {
        float dxh = tload(dy, dyo + j) * tload(w, j), xv = tload(x, xo + j);
        float g = rs * (dxh - xv * rs * m2);
        tstore(dx, dxo + j, add ? tload(dx, dxo + j) + g : g);
    }
}

/* y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); one warp per row */
__global__ void rmsnorm_forward_kernel(gpu_tensor y, float *rstd, gpu_tensor x, gpu_tensor w,
                                       int n, int c, float eps)
{
    int lane = threadIdx.x % WARP, r = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (r >= n) return;
    size_t off = (size_t)r * c;
    gpu_tensor none = {NULL, ZO_DTYPE_F32};
    float rs = rmsnorm_warp_row(y, off, x, off, none, 0, w, c, eps, lane);
    if (lane == 0) rstd[r] = rs;
}

/* dx += rstd * (dy*w - x*rstd * mean(dy*w * x*rstd)); one warp per row */
__global__ void rmsnorm_backward_dx_kernel(gpu_tensor dx, gpu_tensor dy, gpu_tensor x,
                                           gpu_tensor w, const float *rstd, int n, int c)
{
    int lane = threadIdx.x % WARP, r = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (r >= n) return;
    size_t off = (size_t)r * c;
    rmsnorm_warp_dx(dx, off, dy, off, x, off, w, rstd[r], c, 1, lane);
}

/* dw[j] += sum_r dy[r,j] * (x[r,j] - mean[r]) * rstd[r]; db[j] += sum_r dy[r,j]
 * (mean NULL: RMSNorm; db.data NULL: no bias). Block (COLS, ROWG): lane x owns
 * column blockIdx.x*COLS + x, row group y takes rows y, y+ROWG, ... */
__global__ void norm_param_grads_kernel(gpu_tensor dw, gpu_tensor db, gpu_tensor dy, gpu_tensor x,
                                        const float *mean, const float *rstd, int n, int c)
{
    __shared__ float pw[ROWG][COLS + 1], pb[ROWG][COLS + 1];
    int j = blockIdx.x * COLS + threadIdx.x;
    float aw = 0.0f, ab = 0.0f;
    if (j < c)
        for (int r = threadIdx.y; r < n; r += ROWG) {
            size_t o = (size_t)r * c + j;
            float g = tload(dy, o), m = mean ? mean[r] : 0.0f;
            aw += g * (tload(x, o) - m) * rstd[r];
            ab += g;
        }
    pw[threadIdx.y][threadIdx.x] = aw;
    pb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
        float sw = 0.0f, sb = 0.0f;
        for (int g = 0; g < ROWG; g++) {
            sw += pw[g][threadIdx.x];
            sb += pb[g][threadIdx.x];
        }
        tstore(dw, j, tload(dw, j) + sw);
        if (db.data) tstore(db, j, tload(db, j) + sb);
    }
}

/* RMSNorm of each head, in place: one warp per (row, head); row r's head h
 * starts at r*ldx + h*d; saved [n*heads, d] and rstd [n*heads] when given */
__global__ void head_rmsnorm_forward_kernel(gpu_tensor x, int64_t ldx, gpu_tensor saved, float *rstd,
                                            gpu_tensor w, int n, int heads, int d, float eps)
{
    int lane = threadIdx.x % WARP;
    long long ri = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (ri >= (long long)n * heads) return;
    size_t off = (size_t)(ri / heads) * (size_t)ldx + (size_t)(ri % heads) * d;
    float rs = rmsnorm_warp_row(x, off, x, off, saved, (size_t)ri * d, w, d, eps, lane);
    if (lane == 0 && rstd) rstd[ri] = rs;
}

/* dx = rstd * (dy*w - x*rstd * mean(dy*w * x*rstd)), in place (dx holds dy);
 * one warp per (row, head), x the saved input */
__global__ void head_rmsnorm_backward_dx_kernel(gpu_tensor dx, int64_t ldx, gpu_tensor x, gpu_tensor w,
                                                const float *rstd, int n, int heads, int d)
{
    int lane = threadIdx.x % WARP;
    long long ri = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (ri >= (long long)n * heads) return;
    size_t off = (size_t)(ri / heads) * (size_t)ldx + (size_t)(ri % heads) * d;
    rmsnorm_warp_dx(dx, off, dx, off, x, (size_t)ri * d, w, rstd[ri], d, 0, lane);
}

/* dw[j] += sum over (row, head) of dy * x * rstd, dy at the heads' strided
 * places; block (COLS, ROWG) as norm_param_grads_kernel, fixed order */
__global__ void head_norm_grads_kernel(gpu_tensor dw, gpu_tensor dy, int64_t ldy, gpu_tensor x,
                                       const float *rstd, int n, int heads, int d)
{
    __shared__ float pw[ROWG][COLS + 1];
    int j = blockIdx.x * COLS + threadIdx.x;
    float aw = 0.0f;
    if (j < d)
        for (long long ri = threadIdx.y; ri < (long long)n * heads; ri += ROWG) {
            size_t o = (size_t)(ri / heads) * (size_t)ldy + (size_t)(ri % heads) * d + j;
            aw += tload(dy, o) * tload(x, (size_t)ri * d + j) * rstd[ri];
        }
    pw[threadIdx.y][threadIdx.x] = aw;
    __syncthreads();
    if (threadIdx.y == 0 && j < d) {
        float sw = 0.0f;
        for (int g = 0; g < ROWG; g++) sw += pw[g][threadIdx.x];
        tstore(dw, j, tload(dw, j) + sw);
    }
}

static unsigned row_blocks(int n) { return (unsigned)((n + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

static zo_status launch_param_grads(cudaStream_t st, gpu_tensor dw, gpu_tensor db, gpu_tensor dy,
                                    gpu_tensor x, const float *mean, const float *rstd, int n,
                                    int c)
{
    dim3 block(COLS, ROWG);
    ZO_LAUNCH(norm_param_grads_kernel, (c + COLS - 1) / COLS, block, 0, st, dw, db, dy, x, mean,
              rstd, n, c);
    return cuda_launch_check("norm_param_grads_kernel");
}

extern "C" zo_status cuda_launch_layernorm_forward(cudaStream_t st, gpu_tensor y, float *mean,
                                                   float *rstd, gpu_tensor x, gpu_tensor w,
                                                   gpu_tensor b, int n, int c, float eps)
{
    ZO_LAUNCH(layernorm_forward_kernel, row_blocks(n), ROWS_PER_BLOCK * WARP, 0, st, y, mean, rstd,
              x, w, b, n, c, eps);
    return cuda_launch_check("layernorm_forward_kernel");
}

extern "C" zo_status cuda_launch_layernorm_backward(cudaStream_t st, gpu_tensor dx, gpu_tensor dw,
                                                    gpu_tensor db, gpu_tensor dy, gpu_tensor x,
                                                    gpu_tensor w, const float *mean,
                                                    const float *rstd, int n, int c)
{
    ZO_LAUNCH(layernorm_backward_dx_kernel, row_blocks(n), ROWS_PER_BLOCK * WARP, 0, st, dx, dy, x,
              w, mean, rstd, n, c);
    zo_status s = cuda_launch_check("layernorm_backward_dx_kernel");
    if (s != ZO_OK)
        return s;
    return launch_param_grads(st, dw, db, dy, x, mean, rstd, n, c);
}

extern "C" zo_status cuda_launch_rmsnorm_forward(cudaStream_t st, gpu_tensor y, float *rstd,
                                                 gpu_tensor x, gpu_tensor w, int n, int c,
                                                 float eps)
{
    ZO_LAUNCH(rmsnorm_forward_kernel, row_blocks(n), ROWS_PER_BLOCK * WARP, 0, st, y, rstd, x, w, n,
              c, eps);
    return cuda_launch_check("rmsnorm_forward_kernel");
}

extern "C" zo_status cuda_launch_rmsnorm_backward(cudaStream_t st, gpu_tensor dx, gpu_tensor dw,
                                                  gpu_tensor dy, gpu_tensor x, gpu_tensor w,
                                                  const float *rstd, int n, int c)
{
    ZO_LAUNCH(rmsnorm_backward_dx_kernel, row_blocks(n), ROWS_PER_BLOCK * WARP, 0, st, dx, dy, x, w,
              rstd, n, c);
    zo_status s = cuda_launch_check("rmsnorm_backward_dx_kernel");
    if (s != ZO_OK) return s;
    gpu_tensor none = {NULL, ZO_DTYPE_F32};
    return launch_param_grads(st, dw, none, dy, x, NULL, rstd, n, c);
}

extern "C" zo_status cuda_launch_head_rmsnorm_forward(cudaStream_t st, gpu_tensor x, int64_t ldx,
                                                      gpu_tensor saved, float *rstd, gpu_tensor w,
                                                      int n, int heads, int d, float eps)
{
    long long rows = (long long)n * heads;
    ZO_LAUNCH(head_rmsnorm_forward_kernel, (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK),
              ROWS_PER_BLOCK * WARP, 0, st, x, ldx, saved, rstd, w, n, heads, d, eps);
    return cuda_launch_check("head_rmsnorm_forward_kernel");
}

extern "C" zo_status cuda_launch_head_rmsnorm_backward(cudaStream_t st, gpu_tensor dx, int64_t ldx,
                                                       gpu_tensor dw, gpu_tensor saved, gpu_tensor w,
                                                       const float *rstd, int n, int heads, int d)
{
    /* the weight's gradient first, while dx still holds the output's */
    dim3 block(COLS, ROWG);
    ZO_LAUNCH(head_norm_grads_kernel, (d + COLS - 1) / COLS, block, 0, st, dw, dx, ldx, saved, rstd, n,
              heads, d);
    zo_status s = cuda_launch_check("head_norm_grads_kernel");
    if (s != ZO_OK) return s;
    long long rows = (long long)n * heads;
    ZO_LAUNCH(head_rmsnorm_backward_dx_kernel, (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK),
              ROWS_PER_BLOCK * WARP, 0, st, dx, ldx, saved, w, rstd, n, heads, d);
    return cuda_launch_check("head_rmsnorm_backward_dx_kernel");
}
