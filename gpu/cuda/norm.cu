/* LayerNorm and RMSNorm over the last dimension, forward and backward.
 * Row statistics of the plain norms: one block per row, each thread taking
 * chunks of VEC columns (16-byte vector accesses where the row's tensors
 * are aligned; every pass one walk, row_map), sums in double (as the CPU reference sums in double)
 * combined by a block reduction in a fixed order. The norms of each head
 * (RMSNorm or LayerNorm without a bias, rows of 64 to 256, one weight or a
 * row a head): one warp per row, lanes striding over the columns, the
 * LayerNorm's mean and M2 in one read (Welford per lane, Chan's merge).
 * Parameter gradients (and the bias gradient of bias.cu, through
 * cuda_launch_column_sums): column sums over the rows cut into a fixed
 * number of chunks (a function of the shape), each chunk's sums (over a
 * fixed set of row groups) a partial in the stream's workspace, the
 * partials added in chunk order (no atomics, run-to-run stable). */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, tloadv, tstorev, warp_sum_d, block_sum_d */

#define ROWS_PER_BLOCK 4 /* warps per block, one row each */
#define ROW_THREADS 256  /* threads of a row's block (fewer for short rows) */
#define COLS 32          /* column chunks (of VEC) per block of the parameter gradients, one a lane */
#define ROWG 16          /* row groups per block of the parameter gradients */
#define SUM_BLOCKS 1056  /* blocks the partials aim at: 8 of 132 SMs' worth */
#define SUM_CHUNKS_MAX 1024 /* row chunks of the column sums (at most) */

/* A tensor that a row walk (row_map) leaves alone: no load, no store, no
 * say in the vector test, and no code for any of them. */
struct row_none {
};

/* One chunk of a row walk: VEC values of each tensor (x, g, w, b, and o
 * the output), m of them real (the rest 0 where loaded). */
struct row_chunk {
    float x[VEC], g[VEC], w[VEC], b[VEC], o[VEC];
    int m;
};

__device__ __forceinline__ bool row_ok(gpu_tensor t, size_t i) { return !t.data || tvec_ok(t, i); }
__device__ __forceinline__ bool row_ok(row_none, size_t) { return true; }
__device__ __forceinline__ bool row_has(gpu_tensor t) { return t.data != NULL; }
__device__ __forceinline__ bool row_has(row_none) { return false; }
__device__ __forceinline__ void row_load(gpu_tensor t, size_t i, float *v, int m, bool vec) { tloadv(t, i, v, m, vec); }
__device__ __forceinline__ void row_load(row_none, size_t, float *, int, bool) {}
__device__ __forceinline__ void row_store(gpu_tensor t, size_t i, const float *v, int m, bool vec)
{
    tstorev(t, i, v, m, vec);
}
__device__ __forceinline__ void row_store(row_none, size_t, const float *, int, bool) {}

/* The walk of a block-per-row kernel over its row of c columns: this
 * thread's chunks of VEC columns from threadIdx.x * VEC in steps of
 * blockDim.x * VEC (the last one short). Per chunk at column j0: x and g
 * (row tensors, at off + j0), w and b (the row's parameters, at j0; b only
 * where its data is not NULL) loaded in that order, then o from `out` when out_in; f(chunk);
 * chunk.o stored to `out`. Any of g, w, b, out may be row_none. A chunk
 * takes the vector path when whole and every tensor it touches is aligned
 * there (tvec_ok; data NULL: not touched). */
template <typename O, typename G, typename W, typename B, typename F>
__device__ __forceinline__ void row_map(int c, size_t off, O out, bool out_in, gpu_tensor x, G g, W w, B b, F f)
{
    for (int j0 = threadIdx.x * VEC; j0 < c; j0 += blockDim.x * VEC) {
        row_chunk k;
        k.m = vec_len(c, j0);
        size_t o = off + j0;
        bool vec = k.m == VEC && row_ok(out, o) && row_ok(x, o) && row_ok(g, o) && row_ok(w, j0) && row_ok(b, j0);
        tloadv(x, o, k.x, k.m, vec);
        row_load(g, o, k.g, k.m, vec);
        row_load(w, j0, k.w, k.m, vec);
        if (row_has(b)) row_load(b, j0, k.b, k.m, vec);
        if (out_in) row_load(out, o, k.o, k.m, vec);
        f(k);
        row_store(out, o, k.o, k.m, vec);
    }
}

/* y = (x - mean) * rstd * w + b; x, y [n, c]; w, b [c] (b.data may be NULL);
 * mean, rstd [n]. One block per row. Reads x three times (the last two
 * from cache), writes y: 2 n c elements from memory (GPT-2's 8192 x 768
 * bf16: 25.2 MB), plus w, b. */
__global__ void layernorm_forward_kernel(gpu_tensor y, float *mean, float *rstd, gpu_tensor x,
                                         gpu_tensor w, gpu_tensor b, int c, float eps)
{
    int r = blockIdx.x;
    size_t off = (size_t)r * c;
    row_none none;
    double s = 0.0;
    row_map(c, off, none, false, x, none, none, none, [&](row_chunk &v) {
        ZO_UNROLL
        for (int k = 0; k < VEC; k++) s += v.x[k];
    });
    float mu = (float)(block_sum_d(s) / c);
    double q = 0.0;
    row_map(c, off, none, false, x, none, none, none, [&](row_chunk &v) {
        ZO_UNROLL
        for (int k = 0; k < VEC; k++) {
            float dv = v.x[k] - mu;
            q += k < v.m ? (double)dv * dv : 0.0;
        }
    });
    float rs = (float)(1.0 / sqrt(block_sum_d(q) / c + (double)eps));
    row_map(c, off, y, false, x, none, w, b, [&](row_chunk &v) {
        ZO_UNROLL
        for (int k = 0; k < VEC; k++) v.o[k] = (v.x[k] - mu) * rs * v.w[k] + (b.data ? v.b[k] : 0.0f);
    });
    if (threadIdx.x == 0) {
        mean[r] = mu;
        rstd[r] = rs;
    }
}

/* dx += rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), with
 * dxhat = dy * w, xhat = (x - mean) * rstd; one block per row. Moves dy
 * and x (twice, the second from cache), dx in and out: 4 n c elements from
 * memory (GPT-2's 8192 x 768, dx and dy fp32, x bf16: 88.1 MB). */
__global__ void layernorm_backward_dx_kernel(gpu_tensor dx, gpu_tensor dy, gpu_tensor x,
                                             gpu_tensor w, const float *mean, const float *rstd,
                                             int c)
{
    int r = blockIdx.x;
    size_t off = (size_t)r * c;
    float mu = mean[r], rs = rstd[r];
    row_none none;
    double s1 = 0.0, s2 = 0.0;
    row_map(c, off, none, false, x, dy, w, none, [&](row_chunk &v) {
        ZO_UNROLL
        for (int k = 0; k < VEC; k++) {
            float xh = (v.x[k] - mu) * rs, dxh = __fmul_rn(v.g[k], v.w[k]);
            s1 += dxh;
            s2 += (double)dxh * xh;
        }
    });
    float m1 = (float)(block_sum_d(s1) / c), m2 = (float)(block_sum_d(s2) / c);
    /* dxh rounded on its own (__fmul_rn) in both passes: contracted into
     * fma(dy, w, -m1) it would keep the product's rounding error, which rs
     * (up to 1/sqrt(eps)) magnifies where dxh - m1 cancels (the H200 failed
     * test_ops' c 1 fp32 case by 7e-6 so) */
    row_map(c, off, dx, true, x, dy, w, none, [&](row_chunk &v) {
        ZO_UNROLL
        for (int k = 0; k < VEC; k++) {
            float xh = (v.x[k] - mu) * rs, dxh = __fmul_rn(v.g[k], v.w[k]);
            v.o[k] = v.o[k] + rs * (dxh - m1 - xh * m2);
        }
    });
}

/* Chan et al.'s merge of two partial (count, mean, M2) of disjoint
 * columns, M2 the sum of squared deviations from their mean: b into a */
__device__ __forceinline__ void moments_merge(double &na, double &ma, double &qa, double nb, double mb, double qb)
{
    if (nb == 0.0) return;
    double n = na + nb, dl = mb - ma;
    ma += dl * (nb / n);
    qa += qb + dl * dl * (na * nb / n);
    na = n;
}

/* One warp's mean and M2 of x[xo..xo+c) in one read of x: each lane's by
 * Welford's update over its columns, then merged over the warp (a
 * butterfly in which both lanes of a pair merge the higher lane's partial
 * into the lower's, so that every lane gets the same bits) */
__device__ __forceinline__ void warp_moments(gpu_tensor x, size_t xo, int c, int lane, double &mean, double &m2)
{
    double n = 0.0, mu = 0.0, q = 0.0;
    for (int j = lane; j < c; j += WARP) {
        double v = tload(x, xo + j), dl = v - mu;
        n += 1.0;
        mu += dl / n;
        q += dl * (v - mu);
    }
    for (int o = WARP / 2; o > 0; o >>= 1) {
        double pn = __shfl_xor_sync(FULL_MASK, n, o), pm = __shfl_xor_sync(FULL_MASK, mu, o),
               pq = __shfl_xor_sync(FULL_MASK, q, o);
        if (lane & o) { /* the partner is the lower lane: its partial first */
            double tn = n, tm = mu, tq = q;
            n = pn, mu = pm, q = pq;
            pn = tn, pm = tm, pq = tq;
        }
        moments_merge(n, mu, q, pn, pm, pq);
    }
    mean = mu;
    m2 = q;
}

/* One warp's row of c: y[yo..] = (x[xo..] - mean) * rstd * w[wo..] (y may be
 * x), rstd = 1/sqrt(mean((x - mean)^2) + eps) returned; mean is the row's
 * when centered (LayerNorm without a bias), else 0 (RMSNorm); x - mean
 * copied to saved[so..] when saved.data is not NULL. Two reads of x: the
 * statistics (the sum of squares; centered, the mean and M2 at once,
 * warp_moments), then the output. */
__device__ __forceinline__ float head_norm_warp_row(gpu_tensor y, size_t yo, gpu_tensor x, size_t xo, gpu_tensor saved,
                                                   size_t so, gpu_tensor w, size_t wo, int c, float eps, int centered,
                                                   int lane)
{
    float mu = 0.0f;
    double ss = 0.0;
    if (centered) {
        double mean;
        warp_moments(x, xo, c, lane, mean, ss);
        mu = (float)mean;
    } else {
        for (int j = lane; j < c; j += WARP) {
            float v = tload(x, xo + j);
            ss += (double)v * v;
        }
        ss = warp_sum_d(ss);
    }
    float rs = (float)(1.0 / sqrt(ss / c + (double)eps));
    for (int j = lane; j < c; j += WARP) {
        float v = tload(x, xo + j) - mu;
        if (saved.data) tstore(saved, so + j, v);
        tstore(y, yo + j, v * rs * tload(w, wo + j));
    }
    return rs;
}

/* One warp's row of c, x the saved input (less its mean when centered):
 * dx[dxo..] = rstd * (dxh - mean(dxh) - xh * mean(dxh * xh)), dxh = dy*w[wo..],
 * xh = x*rstd, the mean(dxh) term only when centered; in place (dx may be dy) */
__device__ __forceinline__ void head_norm_warp_dx(gpu_tensor dx, size_t dxo, gpu_tensor dy, size_t dyo, gpu_tensor x,
                                                 size_t xo, gpu_tensor w, size_t wo, float rs, int c, int centered,
                                                 int lane)
{
    double s1 = 0.0, s2 = 0.0;
    for (int j = lane; j < c; j += WARP) {
        float dxh = __fmul_rn(tload(dy, dyo + j), tload(w, wo + j));
        s1 += dxh;
        s2 += (double)dxh * (tload(x, xo + j) * rs);
    }
    float m1 = centered ? (float)(warp_sum_d(s1) / c) : 0.0f, m2 = (float)(warp_sum_d(s2) / c);
    for (int j = lane; j < c; j += WARP) {
        float dxh = __fmul_rn(tload(dy, dyo + j), tload(w, wo + j)), xv = tload(x, xo + j);
        tstore(dx, dxo + j, rs * (dxh - m1 - xv * rs * m2));
    }
}

/* y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); one block per row.
 * Moves x (twice, the second from cache) and y: 2 n c elements from memory
 * (8192 x 2048 bf16: 67.1 MB), plus w. */
__global__ void rmsnorm_forward_kernel(gpu_tensor y, float *rstd, gpu_tensor x, gpu_tensor w,
                                       int c, float eps)
{
    int r = blockIdx.x;
    size_t off = (size_t)r * c;
    row_none none;
    double ss = 0.0;
    row_map(c, off, none, false, x, none, none, none, [&](row_chunk &v) {
        ZO_UNROLL
        for (int k = 0; k < VEC; k++) ss += (double)v.x[k] * v.x[k];
    });
    float rs = (float)(1.0 / sqrt(block_sum_d(ss) / c + (double)eps));
    row_map(c, off, y, false, x, none, w, none, [&](row_chunk &v) {
        ZO_UNROLL
        for (int k = 0; k < VEC; k++) v.o[k] = v.x[k] * rs * v.w[k];
    });
    if (threadIdx.x == 0) rstd[r] = rs;
}

/* dx += rstd * (dy*w - x*rstd * mean(dy*w * x*rstd)); one block per row.
 * Moves dy and x (twice, the second from cache), dx in and out: 4 n c
 * elements from memory (LLaMA's 8192 x 2048, dx and dy fp32, x bf16: 234.9
 * MB), plus w. */
__global__ void rmsnorm_backward_dx_kernel(gpu_tensor dx, gpu_tensor dy, gpu_tensor x,
                                           gpu_tensor w, const float *rstd, int c)
{
    int r = blockIdx.x;
    size_t off = (size_t)r * c;
    float rs = rstd[r];
    row_none none;
    double s2 = 0.0;
    row_map(c, off, none, false, x, dy, w, none, [&](row_chunk &v) {
        ZO_UNROLL
        for (int k = 0; k < VEC; k++) s2 += (double)__fmul_rn(v.g[k], v.w[k]) * (v.x[k] * rs);
    });
    float m2 = (float)(block_sum_d(s2) / c);
    row_map(c, off, dx, true, x, dy, w, none, [&](row_chunk &v) {
        ZO_UNROLL
        /* dy*w rounded on its own (__fmul_rn), as LayerNorm's: contracted into
         * fma(dy, w, -x rs m2) it would keep the product's rounding error,
         * which rs magnifies where the difference cancels (c 1) */
        for (int k = 0; k < VEC; k++) v.o[k] = v.o[k] + rs * (__fmul_rn(v.g[k], v.w[k]) - v.x[k] * rs * m2);
    });
}

/* Partial parameter gradients of row chunk blockIdx.y (rows r of [n], chunk
 * rows each): pw[y][j] = sum over the chunk's rows r and heads h of
 * dy[r*ldy + h*c + j] * (x[(r*heads + h)*c + j] - mean) * rstd and pb[y][j]
 * = the sum of dy (mean NULL: RMSNorm; pw, pb NULL: not wanted; x, rstd
 * unread without pw). Block (COLS, ROWG): lane x owns the VEC columns from
 * (blockIdx.x*COLS + x)*VEC, row group y takes the chunk's rows y, y+ROWG,
 * ... and each of their heads in order; the row groups' sums are added in
 * order. Every column's sum runs in this order whether its loads are
 * vectors or not. Moves dy once, x once with pw: 2 n c elements (8192 x
 * 2048, dy fp32, x bf16: 100.7 MB), the partials (chunks x c fp32) out. */
__global__ void norm_param_partials_kernel(float *pw, float *pb, gpu_tensor dy, int64_t ldy, gpu_tensor x,
                                           const float *mean, const float *rstd, int n, int heads, int c,
                                           int sd, int chunk)
{
    __shared__ float sp[2][ROWG][COLS * VEC];
    int j0 = (blockIdx.x * COLS + threadIdx.x) * VEC;
    int r0 = blockIdx.y * chunk, r1 = r0 + chunk < n ? r0 + chunk : n;
    float aw[VEC], ab[VEC];
    ZO_UNROLL
    for (int k = 0; k < VEC; k++) aw[k] = ab[k] = 0.0f;
    if (j0 < c) {
        int m = vec_len(c, j0);
        for (int r = r0 + threadIdx.y; r < r1; r += ROWG) {
            size_t ri = (size_t)r * heads, o = (size_t)r * (size_t)ldy + j0;
            for (int h = 0; h < heads; h++, ri++, o += c) {
                size_t xo = ri * c + j0;
                bool vec = m == VEC && tvec_ok(dy, o) && (!pw || tvec_ok(x, xo));
                float g[VEC], xv[VEC];
                tloadv(dy, o, g, m, vec);
                if (pw && sd == c) {
                    tloadv(x, xo, xv, m, vec);
                    float mu = mean ? mean[ri] : 0.0f, rs = rstd[ri];
                    ZO_UNROLL
                    for (int k = 0; k < VEC; k++) aw[k] += g[k] * (xv[k] - mu) * rs;
                } else if (pw) { /* a statistic every sd columns */
                    tloadv(x, xo, xv, m, vec);
                    size_t si = ri * (size_t)(c / sd);
                    ZO_UNROLL
                    for (int k = 0; k < VEC; k++) {
                        size_t q = si + (size_t)(j0 + (k < m ? k : 0)) / sd;
                        aw[k] += g[k] * (xv[k] - (mean ? mean[q] : 0.0f)) * rstd[q];
                    }
                }
                ZO_UNROLL
                for (int k = 0; k < VEC; k++) ab[k] += g[k];
            }
        }
    }
    ZO_UNROLL
    for (int k = 0; k < VEC; k++) {
        sp[0][threadIdx.y][threadIdx.x * VEC + k] = aw[k];
        sp[1][threadIdx.y][threadIdx.x * VEC + k] = ab[k];
    }
    __syncthreads();
    /* the block's 2 x COLS*VEC column sums, one a thread (COLS*ROWG of them) */
    for (int t = threadIdx.y * COLS + threadIdx.x; t < 2 * COLS * VEC; t += COLS * ROWG) {
        int which = t / (COLS * VEC), col = t % (COLS * VEC), j = blockIdx.x * COLS * VEC + col;
        float *out = which ? pb : pw;
        if (!out || j >= c) continue;
        float tot = 0.0f;
        for (int g = 0; g < ROWG; g++) tot += sp[which][g][col];
        out[(size_t)blockIdx.y * c + j] = tot;
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

/* The norm of each head, in place: one warp per (row, head); row r's head h
 * starts at r*ldx + h*d, its weight at h*w_stride; saved [n*heads, d] and
 * rstd [n*heads] when given */
__global__ void head_norm_forward_kernel(gpu_tensor x, int64_t ldx, gpu_tensor saved, float *rstd, gpu_tensor w,
                                         int64_t w_stride, int n, int heads, int d, float eps, int centered)
{
    int lane = threadIdx.x % WARP;
    long long ri = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (ri >= (long long)n * heads) return;
    size_t off = head_offset(ri, heads, ldx, d), wo = (size_t)(ri % heads) * (size_t)w_stride;
    float rs = head_norm_warp_row(x, off, x, off, saved, (size_t)ri * d, w, wo, d, eps, centered, lane);
    if (lane == 0 && rstd) rstd[ri] = rs;
}

/* the input's gradient in place (dx holds dy); one warp per (row, head), x
 * the saved input */
__global__ void head_norm_backward_dx_kernel(gpu_tensor dx, int64_t ldx, gpu_tensor x, gpu_tensor w,
                                             int64_t w_stride, const float *rstd, int n, int heads, int d,
                                             int centered)
{
    int lane = threadIdx.x % WARP;
    long long ri = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (ri >= (long long)n * heads) return;
    size_t off = head_offset(ri, heads, ldx, d), wo = (size_t)(ri % heads) * (size_t)w_stride;
    head_norm_warp_dx(dx, off, dx, off, x, (size_t)ri * d, w, wo, rstd[ri], d, centered, lane);
}

static unsigned row_blocks(long long n) { return (unsigned)((n + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

/* Threads of a block-per-row kernel over rows of c: a warp per 32 chunks
 * of VEC, at most ROW_THREADS. */
static unsigned row_threads(int c)
{
    unsigned t = (unsigned)(((c + VEC - 1) / VEC + WARP - 1) / WARP * WARP);
    return t < WARP ? WARP : t > ROW_THREADS ? ROW_THREADS : t;
}

/* dw, db += the parameter gradients over n rows of `heads` heads of c (dy
 * rows of stride ldy; the plain norms: heads 1, ldy c), through partials of
 * row chunks in the scratch: as many chunks as bring the blocks to about
 * SUM_BLOCKS (at most one per row group's worth of rows, SUM_CHUNKS_MAX, and
 * fewer where they do not fit in the scratch: a fixed count for a shape all
 * the same). dw.data and db.data NULL: nothing to do. */
extern "C" zo_status cuda_launch_column_sums(cudaStream_t st, void *scratch, size_t scratch_bytes, gpu_tensor dw,
                                             gpu_tensor db, gpu_tensor dy, int64_t ldy, gpu_tensor x,
                                             const float *mean, const float *rstd, int n, int heads, int c)
{
    return cuda_launch_column_sums_sd(st, scratch, scratch_bytes, dw, db, dy, ldy, x, mean, rstd, n, heads, c, c);
}

/* The same with a statistic every sd columns (sd divides c): those of
 * column j of head-row ri at ri*(c/sd) + j/sd (sd c: one a head-row) */
extern "C" zo_status cuda_launch_column_sums_sd(cudaStream_t st, void *scratch, size_t scratch_bytes, gpu_tensor dw,
                                                gpu_tensor db, gpu_tensor dy, int64_t ldy, gpu_tensor x,
                                                const float *mean, const float *rstd, int n, int heads, int c, int sd)
{
    if (!dw.data && !db.data) return ZO_OK;
    size_t per = (size_t)c * sizeof(float) * ((dw.data != NULL) + (db.data != NULL)); /* one chunk's */
    size_t fit = scratch_bytes / per;
    if (fit == 0)
        return zo_error(ZO_ERR_INVALID, "norm parameter gradients: %d columns need %zu bytes of scratch, "
                        "the stream's workspace has %zu", c, per, scratch_bytes);
    unsigned col_blocks = (unsigned)((c + COLS * VEC - 1) / (COLS * VEC));
    long long chunks = (SUM_BLOCKS + col_blocks - 1) / col_blocks;
    long long most = ((long long)n + ROWG - 1) / ROWG;
    if (chunks > most) chunks = most;
    if (chunks > SUM_CHUNKS_MAX) chunks = SUM_CHUNKS_MAX;
    if ((size_t)chunks > fit) chunks = (long long)fit;
    if (chunks < 1) chunks = 1;
    int chunk = (int)((n + chunks - 1) / chunks);
    if (chunk < 1) chunk = 1;
    float *pw = dw.data ? (float *)scratch : NULL;
    float *pb = db.data ? (float *)scratch + (dw.data ? (size_t)chunks * c : 0) : NULL;
    dim3 grid(col_blocks, (unsigned)chunks), block(COLS, ROWG);
    ZO_LAUNCH(norm_param_partials_kernel, grid, block, 0, st, pw, pb, dy, ldy, x, mean, rstd, n, heads, c, sd, chunk);
    zo_status s = cuda_launch_check("norm_param_partials_kernel");
    if (s != ZO_OK) return s;
    ZO_LAUNCH(norm_param_sum_kernel, (c + 255) / 256, 256, 0, st, dw, db, pw, pb, (int)chunks, c);
    return cuda_launch_check("norm_param_sum_kernel");
}

extern "C" zo_status cuda_launch_layernorm_forward(cudaStream_t st, gpu_tensor y, float *mean,
                                                   float *rstd, gpu_tensor x, gpu_tensor w,
                                                   gpu_tensor b, int n, int c, float eps)
{
    ZO_LAUNCH(layernorm_forward_kernel, (unsigned)n, row_threads(c), 0, st, y, mean, rstd,
              x, w, b, c, eps);
    return cuda_launch_check("layernorm_forward_kernel");
}

extern "C" zo_status cuda_launch_layernorm_backward(cudaStream_t st, void *scratch, size_t scratch_bytes,
                                                    gpu_tensor dx, gpu_tensor dw, gpu_tensor db, gpu_tensor dy,
                                                    gpu_tensor x, gpu_tensor w, const float *mean,
                                                    const float *rstd, int n, int c)
{
    ZO_LAUNCH(layernorm_backward_dx_kernel, (unsigned)n, row_threads(c), 0, st, dx, dy, x,
              w, mean, rstd, c);
    zo_status s = cuda_launch_check("layernorm_backward_dx_kernel");
    if (s != ZO_OK)
        return s;
    return cuda_launch_column_sums(st, scratch, scratch_bytes, dw, db, dy, c, x, mean, rstd, n, 1, c);
}

extern "C" zo_status cuda_launch_rmsnorm_forward(cudaStream_t st, gpu_tensor y, float *rstd,
                                                 gpu_tensor x, gpu_tensor w, int n, int c,
                                                 float eps)
{
    ZO_LAUNCH(rmsnorm_forward_kernel, (unsigned)n, row_threads(c), 0, st, y, rstd, x, w,
              c, eps);
    return cuda_launch_check("rmsnorm_forward_kernel");
}

extern "C" zo_status cuda_launch_rmsnorm_backward(cudaStream_t st, void *scratch, size_t scratch_bytes,
                                                  gpu_tensor dx, gpu_tensor dw, gpu_tensor dy, gpu_tensor x,
                                                  gpu_tensor w, const float *rstd, int n, int c)
{
    ZO_LAUNCH(rmsnorm_backward_dx_kernel, (unsigned)n, row_threads(c), 0, st, dx, dy, x, w,
              rstd, c);
    zo_status s = cuda_launch_check("rmsnorm_backward_dx_kernel");
    if (s != ZO_OK) return s;
    gpu_tensor none = {NULL, ZO_DTYPE_F32};
    return cuda_launch_column_sums(st, scratch, scratch_bytes, dw, none, dy, c, x, NULL, rstd, n, 1, c);
}

extern "C" zo_status cuda_launch_head_norm_forward(cudaStream_t st, gpu_tensor x, int64_t ldx, gpu_tensor saved,
                                                   float *rstd, gpu_tensor w, int64_t w_stride, int n, int heads,
                                                   int d, float eps, int centered)
{
    ZO_LAUNCH(head_norm_forward_kernel, row_blocks((long long)n * heads), ROWS_PER_BLOCK * WARP, 0, st, x, ldx,
              saved, rstd, w, w_stride, n, heads, d, eps, centered);
    return cuda_launch_check("head_norm_forward_kernel");
}

extern "C" zo_status cuda_launch_head_norm_backward(cudaStream_t st, void *scratch, size_t scratch_bytes,
                                                    gpu_tensor dx, int64_t ldx, gpu_tensor dw, gpu_tensor saved,
                                                    gpu_tensor w, int64_t w_stride, const float *rstd, int n,
                                                    int heads, int d, int centered)
{
    /* the weight's gradient first, while dx still holds the output's (saved
     * is the input less its mean: RMSNorm's sums); one weight: summed over
     * the heads; one a head: the heads' columns side by side, a statistic
     * every d */
    gpu_tensor none = {NULL, ZO_DTYPE_F32};
    zo_status s = w_stride ? cuda_launch_column_sums_sd(st, scratch, scratch_bytes, dw, none, dx, ldx, saved, NULL,
                                                        rstd, n, 1, heads * d, d)
                           : cuda_launch_column_sums(st, scratch, scratch_bytes, dw, none, dx, ldx, saved, NULL,
                                                     rstd, n, heads, d);
    if (s != ZO_OK) return s;
    ZO_LAUNCH(head_norm_backward_dx_kernel, row_blocks((long long)n * heads), ROWS_PER_BLOCK * WARP, 0, st, dx,
              ldx, saved, w, w_stride, rstd, n, heads, d, centered);
    return cuda_launch_check("head_norm_backward_dx_kernel");
}
