/* Causal self-attention on tensor cores in fused kernels (flash attention,
 * FlashAttention-2's scheme) for 16-bit qkv, head sizes CUDA_ATTN_TC_D
 * (cuda_impl.h), any scale, GQA, sliding windows, soft caps and ALiBi:
 * ops_cuda.c sends the rest to attention.cu or attention_gemm.cu. Same
 * contract as those (gpu/device.h): out, lse [b, hq, t] (the log-sum-exp
 * of the scores), dqkv overwritten. The score of query i, key j is
 * scale q_i . k_j, with a cap cap tanh(that / cap) (attn_fused_geom::score,
 * attention.cu's order), then with ALiBi plus the head's bias at (i, j)
 * (gpu_alibi_at, Falcon's bf16 form too); with a window query i sees keys i - window < j
 * <= i only, and the tile loops skip the key tiles (forward, dQ: from the
 * tile of the block's first row's first key) and query tiles (dK/dV: up
 * to the last query that sees the block's last key) wholly outside every
 * row's window: a window of w over t tokens costs about 2 w / t of the
 * causal work.
 *
 * Products go through nvcuda::wmma (16x16x16 fragments of the qkv type,
 * fp32 accumulators; the host shim has its own, shim_wmma.h). Nothing
 * depends on how a GPU spreads an accumulator over the lanes: each warp
 * stores its scores to shared memory and reads the row statistics there,
 * and the output accumulator lives in shared memory (fp32) between the
 * key tiles.
 *
 * Forward: one block per BR query rows of one head (TW warps, 16 rows
 * each); the key/value tiles of BC keys stream through shared memory up to
 * the block's last row; per tile S = scale Q K^T, the online softmax (row
 * max m, sum l, O *= exp(m_old - m_new); with a window a row may see no
 * key of a tile nor of those before it, and keeps m = -inf, l = 0 until
 * one it sees), P in the qkv type, O += P V; at the end O / l and lse = m +
 * log l. P and S never reach global memory.
 *
 * Every sum runs in a fixed order: results do not change from run to run. */
#include "gpu/cuda/attention_tc.h" /* defines: cuda_attn_tc_covers */
#include "gpu/cuda/attention_fused.cuh" /* defines: attn_fused_geom, attn_fused_allow_smem, attn_fused_check, attn_fused_backward */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, warp_sum, warp_max, ZO_LAUNCH */
#ifndef ZO_CUDA_SHIM
#include <mma.h> /* defines: nvcuda::wmma */
#endif

namespace wmma = nvcuda::wmma;

#define TW 4        /* warps per block */
#define BR (16 * TW) /* query rows per block */
#define BC 64       /* keys per tile */
#define LDS (BC + 4) /* fp32 row stride of the score tiles; P (16-bit) rides in the same rows */

/* What the kernels need of the shape (attention_fused.cuh). */
typedef attn_fused_geom tc_geom;

/* 16 bytes: the unit of the tile copies. */
struct alignas(16) tc_chunk {
    unsigned u[4];
};

__device__ __forceinline__ void tc_round(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void tc_round(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ float tc_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float tc_float(__half v) { return __half2float(v); }

/* Rows r0 .. r0 + n - 1 (n <= rows) of one head's D columns of a 16-bit
 * row-major source (stride ld elements) into dst [rows][LD]; rows past n are
 * zero. D and ld are multiples of 8 (16 bytes). */
template <typename T, int D, int LD>
__device__ __forceinline__ void tc_load_tile(T *dst, const T *src, size_t ld, int n, int rows)
{
    const int per_row = D / 8;
    for (int x = threadIdx.x; x < rows * per_row; x += blockDim.x) {
        const int r = x / per_row, c = x % per_row * 8;
        tc_chunk v = {{0u, 0u, 0u, 0u}};
        if (r < n) v = *reinterpret_cast<const tc_chunk *>(src + (size_t)r * ld + c);
        *reinterpret_cast<tc_chunk *>(dst + (size_t)r * LD + c) = v;
    }
}

/* Forward. Dynamic shared memory: Os [BR][D+4] fp32 (Q's staging first),
 * Ss [BR][LDS] fp32 (P over it), Ks, Vs [BC][D+8], m, l [BR]. */
template <typename T, int D>
__global__ void attention_tc_forward_kernel(gpu_tensor out, float *lse,
                                                                         const T *qkv, tc_geom G)
{
    constexpr int LDT = D + 8, LDO = D + 4;
    ZO_EXTERN_SHARED(float, smem);
    float *Os = smem, *Ss = Os + BR * LDO;
    T *Ks = reinterpret_cast<T *>(Ss + BR * LDS), *Vs = Ks + BC * LDT;
    float *Ms = reinterpret_cast<float *>(Vs + BC * LDT), *Ls = Ms + BR;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    /* the row blocks in z, the slowest index, from the last (the longest) of
     * every head and sequence down */
    const int i0 = (gridDim.z - 1 - blockIdx.z) * BR, h = blockIdx.x, b = blockIdx.y, g = h / G.grp;
    const int n_rows = min(BR, G.t - i0);
    const T *base = qkv + (size_t)b * G.t * G.ld;

    /* Q: staged in Os, kept in fragments */
    T *Qs = reinterpret_cast<T *>(Os);
    tc_load_tile<T, D, LDT>(Qs, base + (size_t)i0 * G.ld + (size_t)h * D, G.ld, n_rows, BR);
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[D / 16];
    for (int k = 0; k < D / 16; k++) wmma::load_matrix_sync(qf[k], Qs + (size_t)w * 16 * LDT + k * 16, LDT);
    __syncthreads();
    for (int x = threadIdx.x; x < BR * LDO; x += blockDim.x) Os[x] = 0.0f;
    for (int x = threadIdx.x; x < BR; x += blockDim.x) Ms[x] = -INFINITY, Ls[x] = 0.0f;

    const T *kb = base + (size_t)(G.hq + g) * D, *vb = base + (size_t)(G.hq + G.hkv + g) * D;
    const int last = i0 + n_rows - 1;
    const gpu_alibi_head ab = G.step(h);
    float *S = Ss + (size_t)w * 16 * LDS, *O = Os + (size_t)w * 16 * LDO;
    T *P = reinterpret_cast<T *>(S); /* row r of P at the start of row r of S: stride 2 LDS */
    /* from the tile of the first key the block's first row sees */
    for (int j0 = G.first_key(i0) / BC * BC; j0 <= last; j0 += BC) {
        __syncthreads(); /* the last tile's reads are done (and the setup above) */
        const int n_keys = min(BC, G.t - j0);
        tc_load_tile<T, D, LDT>(Ks, kb + (size_t)j0 * G.ld, G.ld, n_keys, BC);
        tc_load_tile<T, D, LDT>(Vs, vb + (size_t)j0 * G.ld, G.ld, n_keys, BC);
        __syncthreads();

        /* S = Q K^T, the warp's 16 rows */
        for (int n = 0; n < BC / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int k = 0; k < D / 16; k++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf;
                wmma::load_matrix_sync(kf, Ks + (size_t)n * 16 * LDT + k * 16, LDT);
                wmma::mma_sync(acc, qf[k], kf, acc);
            }
            wmma::store_matrix_sync(S + n * 16, acc, LDS, wmma::mem_row_major);
        }
        __syncwarp();

        /* the online softmax, one row at a time, lanes over the keys; a
         * row past t masks as the last row does (its results are dropped) */
        for (int rr = 0; rr < 16; rr++) {
            const int r = w * 16 + rr, i = min(i0 + r, G.t - 1);
            float *s = S + (size_t)rr * LDS;
            const int ja = j0 + lane, jb = j0 + lane + WARP;
            const float va = G.sees(i, ja) ? G.score(s[lane]) + gpu_alibi_at(ab, i, ja) : -INFINITY;
            const float vb2 = G.sees(i, jb) ? G.score(s[lane + WARP]) + gpu_alibi_at(ab, i, jb) : -INFINITY;
            const float m_old = Ms[r];
            const float m_new = fmaxf(m_old, warp_max(fmaxf(va, vb2)));
            /* with a window a row may see no key of the tile nor of those
             * before (then m_new is -inf and p, alpha, l stay 0); it sees
             * its own key, so it ends finite */
            const float m_sub = m_new == -INFINITY ? 0.0f : m_new;
            const float pa = expf(va - m_sub), pb = expf(vb2 - m_sub);
            const float alpha = expf(m_old - m_sub);
            const float sum = warp_sum(pa + pb);
            /* P's row overlays S's: every lane's reads of row rr before any
             * lane writes it (the shuffles above order no memory: racecheck
             * reported the write-after-read on an H100) */
            __syncwarp();
            T *p = P + (size_t)rr * 2 * LDS;
            tc_round(p + lane, pa);
            tc_round(p + lane + WARP, pb);
            for (int c = lane; c < D; c += WARP) O[(size_t)rr * LDO + c] *= alpha;
            __syncwarp();
            if (lane == 0) Ms[r] = m_new, Ls[r] = Ls[r] * alpha + sum;
        }
        __syncwarp();

        /* O += P V */
        for (int n = 0; n < D / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, O + n * 16, LDO, wmma::mem_row_major);
            for (int k = 0; k < BC / 16; k++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pf;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
                wmma::load_matrix_sync(pf, P + k * 16, 2 * LDS);
                wmma::load_matrix_sync(vf, Vs + (size_t)k * 16 * LDT + n * 16, LDT);
                wmma::mma_sync(acc, pf, vf, acc);
            }
            wmma::store_matrix_sync(O + n * 16, acc, LDO, wmma::mem_row_major);
        }
        __syncwarp();
    }

    /* out = O / l, lse = m + log l: the warp's rows */
    for (int rr = 0; rr < 16; rr++) {
        const int r = w * 16 + rr, i = i0 + r;
        if (i >= G.t) break;
        const float l = Ls[r], inv = 1.0f / l;
        const size_t o = ((size_t)b * G.t + i) * G.ldo + (size_t)h * D;
        for (int c = lane; c < D; c += WARP) tstore(out, o + c, O[(size_t)rr * LDO + c] * inv);
        if (lane == 0) lse[((size_t)b * G.hq + h) * G.t + i] = Ms[r] + logf(l);
    }
}


/* ---- backward ------------------------------------------------------------------
 * With P = exp(score(Q K^T) - lse) (masked), Di = dO_i . O_i (fp32, a pass
 * of its own), dP = dO V^T and dS = P (dP - D) scale dcap (dcap = 1 -
 * tanh^2 of the capped score, recomputed from S with P; 1 without a cap):
 *   dV = P^T dO and dK = dS^T Q, per key tile (one block over every query
 *   tile from its first key to its window's end and every query head of
 *   its kv head's group, fp32 in
 *   fragments, written once);
 *   dQ = dS K, per query tile (a second kernel that recomputes P and dP).
 * No atomics: every sum has one owner and a fixed order. P and dS enter
 * the products as a high and a low 16-bit part (hi + lo: about twice the
 * type's precision), as the GEMM path carries them, and so does an fp32 dO
 * (the transformer's gradients): two products in place of one for dP (fp32
 * dO only), dK and dQ, two or three for dV. */


/* Rows i0 .. i0 + n - 1 of one head of dO (any type, stride G.ldo) into
 * hi [BR][LD] and, with lo, the remainder v - hi into lo; rows past n zero. */
template <typename T, int D, int LD>
__device__ __forceinline__ void tc_load_split(T *hi, T *lo, gpu_tensor dout, size_t first, size_t ld, int n)
{
    for (int x = threadIdx.x; x < BR * D; x += blockDim.x) {
        const int r = x / D, c = x % D;
        const float v = r < n ? tload(dout, first + (size_t)r * ld + c) : 0.0f;
        tc_round(hi + (size_t)r * LD + c, v);
        if (lo) tc_round(lo + (size_t)r * LD + c, v - tc_float(hi[(size_t)r * LD + c]));
    }
}

/* Row v[0 .. 2 WARP) of the fp32 tile row `row` replaced by its 16-bit
 * rounding hi at T index 0 .. 63 of the same row and the remainder lo at 64 .. 127
 * (lo only with split). The caller's warp holds the values (va, vb). */
template <typename T>
__device__ __forceinline__ void tc_put_split(float *row, float va, float vb, bool split)
{
    const int lane = threadIdx.x % WARP;
    T *p = reinterpret_cast<T *>(row);
    __syncwarp(); /* every lane's reads of the row are done */
    tc_round(p + lane, va);
    tc_round(p + lane + WARP, vb);
    if (split) {
        tc_round(p + BC + lane, va - tc_float(p[lane]));
        tc_round(p + BC + lane + WARP, vb - tc_float(p[lane + WARP]));
    }
}

/* The backward kernels' dynamic shared memory, one carve-up for both (their
 * score tiles, BC keys' rows in dK/dV's, BR queries' rows in dQ's, are the
 * same size): S, dP [BC][LDS] fp32, L, Dd [BR] (the query rows' lse and D),
 * K, V [BC][D+8], Q, dOh, dOl [BR][D+8] (dOl with split_do, else null). */
template <typename T>
struct tc_bwd_smem {
    float *S, *dP, *L, *Dd;
    T *K, *V, *Q, *dOh, *dOl;
};

template <typename T, int D>
__device__ __forceinline__ tc_bwd_smem<T> tc_bwd_carve(int split_do)
{
    static_assert(BR == BC, "the backward kernels' score tiles share one layout");
    constexpr int LDT = D + 8;
    ZO_EXTERN_SHARED(float, smem);
    float *S = smem, *dP = S + BC * LDS, *L = dP + BC * LDS, *Dd = L + BR;
    T *K = reinterpret_cast<T *>(Dd + BR), *V = K + BC * LDT, *Q = V + BC * LDT, *dOh = Q + BR * LDT;
    return {S, dP, L, Dd, K, V, Q, dOh, split_do ? dOh + BR * LDT : nullptr};
}

/* Keys j0 .. j0 + n - 1 of kv head g (base: the batch's qkv rows) into
 * sm.K, sm.V; rows past n zero. */
template <typename T, int D>
__device__ __forceinline__ void tc_load_keys(const tc_bwd_smem<T> &sm, const T *base, const tc_geom &G, int g,
                                             int j0, int n)
{
    tc_load_tile<T, D, D + 8>(sm.K, base + (size_t)j0 * G.ld + (size_t)(G.hq + g) * D, G.ld, n, BC);
    tc_load_tile<T, D, D + 8>(sm.V, base + (size_t)j0 * G.ld + (size_t)(G.hq + G.hkv + g) * D, G.ld, n, BC);
}

/* Query rows i0 .. i0 + n - 1 of head h of batch b (base: the batch's qkv
 * rows) into sm.Q, dO's into sm.dOh (and sm.dOl), their lse and D into
 * sm.L, sm.Dd; rows past n zero. */
template <typename T, int D>
__device__ __forceinline__ void tc_load_queries(const tc_bwd_smem<T> &sm, const T *base, gpu_tensor dout,
                                                const float *lse, const float *Drow, const tc_geom &G, int b,
                                                int h, int i0, int n)
{
    tc_load_tile<T, D, D + 8>(sm.Q, base + (size_t)i0 * G.ld + (size_t)h * D, G.ld, n, BR);
    tc_load_split<T, D, D + 8>(sm.dOh, sm.dOl, dout, ((size_t)b * G.t + i0) * G.ldo + (size_t)h * D, G.ldo, n);
    for (int x = threadIdx.x; x < BR; x += blockDim.x) {
        const size_t l = ((size_t)b * G.hq + h) * G.t + i0 + x;
        sm.L[x] = x < n ? lse[l] : 0.0f;
        sm.Dd[x] = x < n ? Drow[l] : 0.0f;
    }
}

/* acc(16 x 16) += A(16 x 64) B(64 x 16) over 4 k-steps: A row-major at a
 * (stride lda), B at b (row-major stride ldb, or col-major). */
template <typename T, typename LB>
__device__ __forceinline__ void tc_mma64(wmma::fragment<wmma::accumulator, 16, 16, 16, float> &acc, const T *a,
                                         int lda, const T *b, int ldb)
{
    const bool row = std::is_same<LB, wmma::row_major>::value;
    for (int k = 0; k < BC / 16; k++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> af;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> bf;
        wmma::load_matrix_sync(af, a + k * 16, lda);
        wmma::load_matrix_sync(bf, row ? b + (size_t)k * 16 * ldb : b + k * 16, ldb);
        wmma::mma_sync(acc, af, bf, acc);
    }
}

/* out(16 x 64 fp32, stride LDS) = A(16 x D) B^T with B [64][D] (both row-major, stride ld). */
template <typename T, int D>
__device__ __forceinline__ void tc_abt(float *out, const T *a, const T *b, int ld, bool accumulate)
{
    for (int n = 0; n < BC / 16; n++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        if (accumulate) wmma::load_matrix_sync(acc, out + n * 16, LDS, wmma::mem_row_major);
        else wmma::fill_fragment(acc, 0.0f);
        for (int k = 0; k < D / 16; k++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> af;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bf;
            wmma::load_matrix_sync(af, a + k * 16, ld);
            wmma::load_matrix_sync(bf, b + (size_t)n * 16 * ld + k * 16, ld);
            wmma::mma_sync(acc, af, bf, acc);
        }
        wmma::store_matrix_sync(out + n * 16, acc, LDS, wmma::mem_row_major);
    }
}

/* fp32 fragments of 16 rows x D (acc[n]: columns 16 n ..) staged through
 * stage [16][D+4] and stored to rows r0 .. r0 + 15 (< t) of dst (stride ld). */
template <int D>
__device__ __forceinline__ void tc_store_rows(gpu_tensor dst, size_t first, size_t ld, int n_rows,
                                              wmma::fragment<wmma::accumulator, 16, 16, 16, float> *acc, float *stage)
{
    const int lane = threadIdx.x % WARP;
    for (int n = 0; n < D / 16; n++) wmma::store_matrix_sync(stage + n * 16, acc[n], D + 4, wmma::mem_row_major);
    __syncwarp();
    for (int rr = 0; rr < n_rows && rr < 16; rr++)
        for (int c = lane; c < D; c += WARP) tstore(dst, first + (size_t)rr * ld + c, stage[(size_t)rr * (D + 4) + c]);
    __syncwarp();
}

/* dK, dV of BC keys of one kv head. Dynamic shared memory: Ks, Vs [BC][D+8],
 * Qs, dOh, dOl [BR][D+8] (dOl with split_do), St, dPt [BC][LDS] fp32 (the
 * warp's keys' rows: P^T, then dS^T, as 16-bit parts), Lq, Dq [BR]. */
template <typename T, int D>
__global__ void attention_tc_backward_dkv_kernel(gpu_tensor dqkv, gpu_tensor dout, const T *qkv, const float *lse,
                                                 const float *Drow, tc_geom G, int split_p,
                                                 int split_do)
{
    constexpr int LDT = D + 8;
    const tc_bwd_smem<T> sm = tc_bwd_carve<T, D>(split_do);
    const auto [St, dPt, Lq, Dq, Ks, Vs, Qs, dOh, dOl] = sm;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    const int j0 = blockIdx.z * BC, g = blockIdx.x, b = blockIdx.y; /* the first keys (the longest) first */
    const int n_keys = min(BC, G.t - j0);
    const T *base = qkv + (size_t)b * G.t * G.ld;
    tc_load_keys<T, D>(sm, base, G, g, j0, n_keys);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> dk[D / 16], dv[D / 16];
    for (int n = 0; n < D / 16; n++) wmma::fill_fragment(dk[n], 0.0f), wmma::fill_fragment(dv[n], 0.0f);
    float *st = St + (size_t)w * 16 * LDS, *dpt = dPt + (size_t)w * 16 * LDS;
    const T *kw = Ks + (size_t)w * 16 * LDT, *vw = Vs + (size_t)w * 16 * LDT;
    const T *pt = reinterpret_cast<const T *>(st), *dst = reinterpret_cast<const T *>(dpt);
    /* the query tiles from the one of the first key up to the last query
     * that sees the block's last key */
    const int i_end = G.query_end(j0 + n_keys - 1);
    for (int h = g * G.grp; h < (g + 1) * G.grp; h++) {
        const gpu_alibi_head ab = G.step(h);
        for (int i0 = j0 / BR * BR; i0 < i_end; i0 += BR) {
            const int n_rows = min(BR, G.t - i0);
            __syncthreads(); /* the last tile's reads are done */
            tc_load_queries<T, D>(sm, base, dout, lse, Drow, G, b, h, i0, n_rows);
            __syncthreads();
            tc_abt<T, D>(st, kw, Qs, LDT, false); /* S^T: the warp's keys x the tile's queries */
            tc_abt<T, D>(dpt, vw, dOh, LDT, false); /* dP^T = V dO^T */
            if (split_do) tc_abt<T, D>(dpt, vw, dOl, LDT, true);
            __syncwarp();
            for (int rr = 0; rr < 16; rr++) {
                const int j = j0 + w * 16 + rr;
                float *s = st + (size_t)rr * LDS, *dp = dpt + (size_t)rr * LDS;
                float p[2], ds[2];
                for (int u = 0; u < 2; u++) {
                    const int c = lane + u * WARP, i = i0 + c;
                    float dc = 0.0f;
                    p[u] = i < G.t && G.sees(i, j) ? expf(G.score_d(s[c], &dc) + gpu_alibi_at(ab, i, j) - Lq[c]) : 0.0f;
                    ds[u] = p[u] * (dp[c] - Dq[c]) * G.scale * dc;
                }
                tc_put_split<T>(s, p[0], p[1], split_p);
                tc_put_split<T>(dp, ds[0], ds[1], split_p);
            }
            __syncwarp();
            for (int n = 0; n < D / 16; n++) {
                tc_mma64<T, wmma::row_major>(dv[n], pt, 2 * LDS, dOh + n * 16, LDT);
                tc_mma64<T, wmma::row_major>(dk[n], dst, 2 * LDS, Qs + n * 16, LDT);
                if (split_p) {
                    tc_mma64<T, wmma::row_major>(dv[n], pt + BC, 2 * LDS, dOh + n * 16, LDT);
                    tc_mma64<T, wmma::row_major>(dk[n], dst + BC, 2 * LDS, Qs + n * 16, LDT);
                }
                if (split_do) tc_mma64<T, wmma::row_major>(dv[n], pt, 2 * LDS, dOl + n * 16, LDT);
            }
        }
    }
    /* dK, dV of the warp's keys, staged in its rows of St and dPt (16 x (D+4) fp32 fits in 16 x 2 LDS) */
    __syncthreads();
    const int kr = min(16, max(0, n_keys - w * 16));
    const size_t first = ((size_t)b * G.t + j0 + w * 16) * G.ld;
    float *stage = St + (size_t)w * 32 * LDS;
    tc_store_rows<D>(dqkv, first + (size_t)(G.hq + g) * D, G.ld, kr, dk, stage);
    tc_store_rows<D>(dqkv, first + (size_t)(G.hq + G.hkv + g) * D, G.ld, kr, dv, stage);
}

/* dQ of BR query rows of one head. Dynamic shared memory: Ss, dPs [BR][LDS]
 * fp32, L, Dd [BR], Ks, Vs [BC][D+8], Qs, dOh, dOl [BR][D+8] (dOl with split_do). */
template <typename T, int D>
__global__ void attention_tc_backward_dq_kernel(gpu_tensor dqkv, gpu_tensor dout, const T *qkv, const float *lse,
                                                const float *Drow, tc_geom G, int split_p,
                                                 int split_do)
{
    constexpr int LDT = D + 8;
    const tc_bwd_smem<T> sm = tc_bwd_carve<T, D>(split_do);
    const auto [Ss, dPs, Lr, Dr, Ks, Vs, Qs, dOh, dOl] = sm;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    const int i0 = (gridDim.z - 1 - blockIdx.z) * BR, h = blockIdx.x, b = blockIdx.y, g = h / G.grp;
    const int n_rows = min(BR, G.t - i0);
    const T *base = qkv + (size_t)b * G.t * G.ld;
    tc_load_queries<T, D>(sm, base, dout, lse, Drow, G, b, h, i0, n_rows);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> dq[D / 16];
    for (int n = 0; n < D / 16; n++) wmma::fill_fragment(dq[n], 0.0f);
    float *s = Ss + (size_t)w * 16 * LDS, *dp = dPs + (size_t)w * 16 * LDS;
    const T *qw = Qs + (size_t)w * 16 * LDT, *dohw = dOh + (size_t)w * 16 * LDT;
    const T *dsw = reinterpret_cast<const T *>(dp);
    const int last = i0 + n_rows - 1;
    const gpu_alibi_head ab = G.step(h);
    for (int j0 = G.first_key(i0) / BC * BC; j0 <= last; j0 += BC) {
        __syncthreads(); /* the last tile's reads are done (and the setup above) */
        tc_load_keys<T, D>(sm, base, G, g, j0, min(BC, G.t - j0));
        __syncthreads();
        tc_abt<T, D>(s, qw, Ks, LDT, false);    /* S */
        tc_abt<T, D>(dp, dohw, Vs, LDT, false); /* dP = dO V^T */
        if (split_do) tc_abt<T, D>(dp, dOl + (size_t)w * 16 * LDT, Vs, LDT, true);
        __syncwarp();
        for (int rr = 0; rr < 16; rr++) {
            const int r = w * 16 + rr, i = i0 + r;
            float *sr = s + (size_t)rr * LDS, *dpr = dp + (size_t)rr * LDS;
            float ds[2];
            for (int u = 0; u < 2; u++) {
                const int c = lane + u * WARP, j = j0 + c;
                float dc = 0.0f;
                const float p =
                    i < G.t && G.sees(i, j) ? expf(G.score_d(sr[c], &dc) + gpu_alibi_at(ab, i, j) - Lr[r]) : 0.0f;
                ds[u] = p * (dpr[c] - Dr[r]) * G.scale * dc;
            }
            tc_put_split<T>(dpr, ds[0], ds[1], split_p);
        }
        __syncwarp();
        for (int n = 0; n < D / 16; n++) {
            tc_mma64<T, wmma::row_major>(dq[n], dsw, 2 * LDS, Ks + n * 16, LDT);
            if (split_p) tc_mma64<T, wmma::row_major>(dq[n], dsw + BC, 2 * LDS, Ks + n * 16, LDT);
        }
    }
    __syncthreads();
    const int qr = min(16, max(0, n_rows - w * 16));
    float *stage = Ss + (size_t)w * 32 * LDS; /* 16 x (D+4) fp32 in 32 rows of LDS: Ss and dPs together */
    tc_store_rows<D>(dqkv, ((size_t)b * G.t + i0 + w * 16) * G.ld + (size_t)h * D, G.ld, qr, dq, stage);
}

/* ---- launchers ---------------------------------------------------------------- */



template <typename T, int D>
static size_t tc_forward_smem(void)
{
    return (size_t)BR * (D + 4) * 4 + (size_t)BR * LDS * 4 + 2 * (size_t)BC * (D + 8) * sizeof(T) +
           2 * (size_t)BR * 4;
}

template <typename T, int D>
static zo_status tc_forward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out, float *lse, gpu_tensor qkv)
{
    const size_t smem = tc_forward_smem<T, D>();
    zo_status s = attn_fused_allow_smem(attention_tc_forward_kernel<T, D>, smem, "attention_tc_forward_kernel");
    if (s != ZO_OK) return s;
    dim3 grid(a->hq, a->b, (a->t + BR - 1) / BR);
    auto *attention_tc_forward = attention_tc_forward_kernel<T, D>; /* one macro argument */
    ZO_LAUNCH(attention_tc_forward, grid, TW * WARP, smem, st, out, lse,
              static_cast<const T *>(qkv.data), attn_fused_make_geom(a));
    return cuda_launch_check("attention_tc_forward_kernel");
}

template <typename T>
static zo_status tc_forward_t(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out, float *lse, gpu_tensor qkv)
{
    switch (a->d) {
    case 64: return tc_forward<T, 64>(st, a, out, lse, qkv);
    case 80: return tc_forward<T, 80>(st, a, out, lse, qkv);
    case 96: return tc_forward<T, 96>(st, a, out, lse, qkv);
    default: return tc_forward<T, 128>(st, a, out, lse, qkv);
    }
}

static zo_status tc_check(const char *op, const gpu_attn_desc *a, gpu_tensor qkv)
{
    return attn_fused_check(op, "tensor cores", a, qkv, cuda_attn_tc_covers(a, qkv.dtype), BR);
}

extern "C" zo_status cuda_launch_attention_tc_forward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out,
                                                      float *lse, gpu_tensor qkv)
{
    zo_status s = tc_check("gpu_attention_forward", a, qkv);
    if (s != ZO_OK) return s;
    if (a->t <= 0 || a->b <= 0) return ZO_OK;
    if (qkv.dtype == ZO_DTYPE_BF16) return tc_forward_t<__nv_bfloat16>(st, a, out, lse, qkv);
    return tc_forward_t<__half>(st, a, out, lse, qkv);
}

template <typename T, int D>
static size_t tc_backward_smem(int split_do)
{
    return 2 * (size_t)BC * LDS * 4 + 2 * (size_t)BR * 4 + (size_t)(2 * BC + (split_do ? 3 : 2) * BR) * (D + 8) * sizeof(T);
}

template <typename T, int D>
static zo_status tc_backward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor dqkv, gpu_tensor dout,
                             gpu_tensor qkv, const float *Drow, const float *lse)
{
    /* P and dS always in two parts (as the GEMM path: one part left dV of
     * early keys summed over many rows off by 2e-3 in bf16); dO when fp32 */
    const int split_p = 1, split_do = dout.dtype != qkv.dtype;
    const size_t smem = tc_backward_smem<T, D>(split_do);
    zo_status s = attn_fused_allow_smem(attention_tc_backward_dkv_kernel<T, D>, smem, "attention_tc_backward_dkv_kernel");
    if (s == ZO_OK)
        s = attn_fused_allow_smem(attention_tc_backward_dq_kernel<T, D>, smem, "attention_tc_backward_dq_kernel");
    if (s != ZO_OK) return s;
    const tc_geom G = attn_fused_make_geom(a);
    const T *q = static_cast<const T *>(qkv.data);
    dim3 grid_kv(a->hkv, a->b, (a->t + BC - 1) / BC);
    auto *attention_tc_backward_dkv = attention_tc_backward_dkv_kernel<T, D>; /* one macro argument */
    auto *attention_tc_backward_dq = attention_tc_backward_dq_kernel<T, D>;
    ZO_LAUNCH(attention_tc_backward_dkv, grid_kv, TW * WARP, smem, st, dqkv, dout, q, lse, Drow, G,
              split_p, split_do);
    if ((s = cuda_launch_check("attention_tc_backward_dkv_kernel")) != ZO_OK) return s;
    dim3 grid_q(a->hq, a->b, (a->t + BR - 1) / BR);
    ZO_LAUNCH(attention_tc_backward_dq, grid_q, TW * WARP, smem, st, dqkv, dout, q, lse, Drow, G, split_p,
              split_do);
    return cuda_launch_check("attention_tc_backward_dq_kernel");
}

template <typename T>
static zo_status tc_backward_t(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor dqkv, gpu_tensor dout,
                               gpu_tensor qkv, const float *Drow, const float *lse)
{
    switch (a->d) {
    case 64: return tc_backward<T, 64>(st, a, dqkv, dout, qkv, Drow, lse);
    case 80: return tc_backward<T, 80>(st, a, dqkv, dout, qkv, Drow, lse);
    case 96: return tc_backward<T, 96>(st, a, dqkv, dout, qkv, Drow, lse);
    default: return tc_backward<T, 128>(st, a, dqkv, dout, qkv, Drow, lse);
    }
}

extern "C" zo_status cuda_launch_attention_tc_backward(cudaStream_t st, cudaMemPool_t pool, const gpu_attn_desc *a,
                                                       gpu_tensor dqkv, gpu_tensor dout, gpu_tensor qkv,
                                                       gpu_tensor out, const float *lse)
{
    zo_status s = tc_check("gpu_attention_backward", a, qkv);
    if (s != ZO_OK) return s;
    if (a->t <= 0 || a->b <= 0) return ZO_OK;
    return attn_fused_backward(st, pool, a, dout, out, [&](const float *Drow) {
        if (qkv.dtype == ZO_DTYPE_BF16) return tc_backward_t<__nv_bfloat16>(st, a, dqkv, dout, qkv, Drow, lse);
        return tc_backward_t<__half>(st, a, dqkv, dout, qkv, Drow, lse);
    });
}
