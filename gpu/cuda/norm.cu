/* LayerNorm and RMSNorm over the last dimension, forward and backward.
 * Row statistics: one warp per row, each lane striding over the columns,
 * sums in double combined by a butterfly (as the CPU reference sums in
 * double). Parameter gradients: column sums over the rows cut into a fixed
 * number of chunks, each chunk's sums (over a fixed set of row groups) a
 * partial in the stream's workspace, the partials added in chunk order (no
 * atomics, run-to-run stable). */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, warp_sum_d */

#define ROWS_PER_BLOCK 4 /* warps per block, one row each */
#define COLS 32          /* columns per block of the parameter gradients */
#define ROWG 16          /* row groups per block of the parameter gradients */
#define NORM_CHUNKS 64   /* fixed row chunks of the parameter gradients (at most) */

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

/* Partial parameter gradients of row chunk blockIdx.y (rows r of [n], chunk
 * rows each): pw[y][j] = sum over the chunk's rows r and heads h of
 * dy[r*ldy + h*c + j] * (x[(r*heads + h)*c + j] - mean) * rstd and pb[y][j]
 * = the sum of dy (mean NULL: RMSNorm; pw, pb NULL: not wanted). Block
 * (COLS, ROWG): lane x owns column blockIdx.x*COLS + x, row group y takes
 * the chunk's rows y, y+ROWG, ... and each of their heads in order. */
__global__ void norm_param_partials_kernel(float *pw, float *pb, gpu_tensor dy, int64_t ldy, gpu_tensor x,
                                           const float *mean, const float *rstd, int n, int heads, int c,
                                           int chunk)
{
    __shared__ float sw[ROWG][COLS + 1], sb[ROWG][COLS + 1];
    int j = blockIdx.x * COLS + threadIdx.x;
    int r0 = blockIdx.y * chunk, r1 = r0 + chunk < n ? r0 + chunk : n;
    float aw = 0.0f, ab = 0.0f;
    if (j < c)
        for (int r = r0 + threadIdx.y; r < r1; r += ROWG) {
            size_t ri = (size_t)r * heads, o = (size_t)r * (size_t)ldy + j;
            for (int h = 0; h < heads; h++, ri++, o += c) {
                float g = tload(dy, o);
                if (pw) aw += g * (tload(x, ri * c + j) - (mean ? mean[ri] : 0.0f)) * rstd[ri];
                ab += g;
            }
        }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
        float tw = 0.0f, tb = 0.0f;
        for (int g = 0; g < ROWG; g++) {
            tw += sw[g][threadIdx.x];
            tb += sb[g][threadIdx.x];
        }
        size_t o = (size_t)blockIdx.y * c + j;
        if (pw) pw[o] = tw;
        if (pb) pb[o] = tb;
    }
}

/* dw[j] += sum of pw[0..chunks)[j] in order, db likewise (NULL data: none) */
__global__ void norm_param_sum_kernel(gpu_tensor dw, gpu_tensor db, const float *pw, const float *pb, int chunks,
                                      int c)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c) return;
    float tw = 0.0f, tb = 0.0f;
    for (int k = 0; k < chunks; k++) {
        if (dw.data) tw += pw[(size_t)k * c + j];
        if (db.data) tb += pb[(size_t)k * c + j];
    }
    if (dw.data) tstore(dw, j, tload(dw, j) + tw);
    if (db.data) tstore(db, j, tload(db, j) + tb);
}

/* Where head-row ri (row ri / heads, head ri % heads) of rows of stride ld
 * and heads of d starts */
__device__ __forceinline__ size_t head_offset(long long ri, int heads, int64_t ld, int d)
{
    return (size_t)(ri / heads) * (size_t)ld + (size_t)(ri % heads) * d;
}

/* RMSNorm of each head, in place: one warp per (row, head); row r's head h
 * starts at r*ldx + h*d; saved [n*heads, d] and rstd [n*heads] when given */
__global__ void head_rmsnorm_forward_kernel(gpu_tensor x, int64_t ldx, gpu_tensor saved, float *rstd,
                                            gpu_tensor w, int n, int heads, int d, float eps)
{
    int lane = threadIdx.x % WARP;
    long long ri = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (ri >= (long long)n * heads) return;
    size_t off = head_offset(ri, heads, ldx, d);
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
    size_t off = head_offset(ri, heads, ldx, d);
    rmsnorm_warp_dx(dx, off, dx, off, x, (size_t)ri * d, w, rstd[ri], d, 0, lane);
}

static unsigned row_blocks(long long n) { return (unsigned)((n + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

/* dw, db += the parameter gradients over n rows of `heads` heads of c (dy
 * rows of stride ldy; the plain norms: heads 1, ldy c), through partials of
 * NORM_CHUNKS row chunks in the scratch (fewer chunks where they do not
 * fit in its bytes: a fixed count for a shape all the same). dw.data and
 * db.data NULL: nothing to do. */
static zo_status launch_param_grads(cudaStream_t st, void *scratch, size_t scratch_bytes, gpu_tensor dw,
                                    gpu_tensor db, gpu_tensor dy, int64_t ldy, gpu_tensor x, const float *mean,
                                    const float *rstd, int n, int heads, int c)
{
    if (!dw.data && !db.data) return ZO_OK;
    size_t per = (size_t)c * sizeof(float) * ((dw.data != NULL) + (db.data != NULL)); /* one chunk's */
    size_t fit = scratch_bytes / per;
    if (fit == 0)
        return zo_error(ZO_ERR_INVALID, "norm parameter gradients: %d columns need %zu bytes of scratch, "
                        "the stream's workspace has %zu", c, per, scratch_bytes);
    int chunks = fit < NORM_CHUNKS ? (int)fit : NORM_CHUNKS;
    int chunk = (n + chunks - 1) / chunks;
    float *pw = dw.data ? (float *)scratch : NULL;
    float *pb = db.data ? (float *)scratch + (dw.data ? (size_t)chunks * c : 0) : NULL;
    dim3 grid((c + COLS - 1) / COLS, chunks), block(COLS, ROWG);
    ZO_LAUNCH(norm_param_partials_kernel, grid, block, 0, st, pw, pb, dy, ldy, x, mean, rstd, n, heads, c, chunk);
    zo_status s = cuda_launch_check("norm_param_partials_kernel");
    if (s != ZO_OK) return s;
    ZO_LAUNCH(norm_param_sum_kernel, (c + 255) / 256, 256, 0, st, dw, db, pw, pb, chunks, c);
    return cuda_launch_check("norm_param_sum_kernel");
}

extern "C" zo_status cuda_launch_layernorm_forward(cudaStream_t st, gpu_tensor y, float *mean,
                                                   float *rstd, gpu_tensor x, gpu_tensor w,
                                                   gpu_tensor b, int n, int c, float eps)
{
    ZO_LAUNCH(layernorm_forward_kernel, row_blocks(n), ROWS_PER_BLOCK * WARP, 0, st, y, mean, rstd,
              x, w, b, n, c, eps);
    return cuda_launch_check("layernorm_forward_kernel");
}

extern "C" zo_status cuda_launch_layernorm_backward(cudaStream_t st, void *scratch, size_t scratch_bytes,
                                                    gpu_tensor dx, gpu_tensor dw, gpu_tensor db, gpu_tensor dy,
                                                    gpu_tensor x, gpu_tensor w, const float *mean,
                                                    const float *rstd, int n, int c)
{
    ZO_LAUNCH(layernorm_backward_dx_kernel, row_blocks(n), ROWS_PER_BLOCK * WARP, 0, st, dx, dy, x,
              w, mean, rstd, n, c);
    zo_status s = cuda_launch_check("layernorm_backward_dx_kernel");
    if (s != ZO_OK)
        return s;
    return launch_param_grads(st, scratch, scratch_bytes, dw, db, dy, c, x, mean, rstd, n, 1, c);
}

extern "C" zo_status cuda_launch_rmsnorm_forward(cudaStream_t st, gpu_tensor y, float *rstd,
                                                 gpu_tensor x, gpu_tensor w, int n, int c,
                                                 float eps)
{
    ZO_LAUNCH(rmsnorm_forward_kernel, row_blocks(n), ROWS_PER_BLOCK * WARP, 0, st, y, rstd, x, w, n,
              c, eps);
    return cuda_launch_check("rmsnorm_forward_kernel");
}

extern "C" zo_status cuda_launch_rmsnorm_backward(cudaStream_t st, void *scratch, size_t scratch_bytes,
                                                  gpu_tensor dx, gpu_tensor dw, gpu_tensor dy, gpu_tensor x,
                                                  gpu_tensor w, const float *rstd, int n, int c)
{
    ZO_LAUNCH(rmsnorm_backward_dx_kernel, row_blocks(n), ROWS_PER_BLOCK * WARP, 0, st, dx, dy, x, w,
              rstd, n, c);
    zo_status s = cuda_launch_check("rmsnorm_backward_dx_kernel");
    if (s != ZO_OK) return s;
    gpu_tensor none = {NULL, ZO_DTYPE_F32};
    return launch_param_grads(st, scratch, scratch_bytes, dw, none, dy, c, x, NULL, rstd, n, 1, c);
}

extern "C" zo_status cuda_launch_head_rmsnorm_forward(cudaStream_t st, gpu_tensor x, int64_t ldx,
                                                      gpu_tensor saved, float *rstd, gpu_tensor w,
                                                      int n, int heads, int d, float eps)
{
    ZO_LAUNCH(head_rmsnorm_forward_kernel, row_blocks((long long)n * heads), ROWS_PER_BLOCK * WARP, 0, st, x, ldx,
              saved, rstd, w, n, heads, d, eps);
    return cuda_launch_check("head_rmsnorm_forward_kernel");
}

extern "C" zo_status cuda_launch_head_rmsnorm_backward(cudaStream_t st, void *scratch, size_t scratch_bytes,
                                                       gpu_tensor dx, int64_t ldx, gpu_tensor dw, gpu_tensor saved,
                                                       gpu_tensor w, const float *rstd, int n, int heads, int d)
{
    /* the weight's gradient first, while dx still holds the output's */
    gpu_tensor none = {NULL, ZO_DTYPE_F32};
    zo_status s = launch_param_grads(st, scratch, scratch_bytes, dw, none, dx, ldx, saved, NULL, rstd, n, heads, d);
    if (s != ZO_OK) return s;
    ZO_LAUNCH(head_rmsnorm_backward_dx_kernel, row_blocks((long long)n * heads), ROWS_PER_BLOCK * WARP, 0, st, dx,
              ldx, saved, w, rstd, n, heads, d);
    return cuda_launch_check("head_rmsnorm_backward_dx_kernel");
}
