/* Causal self-attention forward on mma.sync (FlashAttention-2's scheme with
 * the softmax in registers) for what cuda_attn_mma_covers (attention_mma.h:
 * the cases of the tensor-core kernels, attention_tc.cu). Same contract as
 * attention.cu and attention_tc.cu (gpu/device.h): out, lse [b, hq, t] (the
 * log-sum-exp of the scaled scores, natural log), so the backward of
 * attention_tc.cu or attention_gemm.cu runs after it.
 *
 * Products go through mma_ptx.cuh: mma.m16n8k16 (16-bit operands, fp32
 * accumulators) on fragments whose per-lane layout the PTX ISA documents,
 * loaded from shared memory by ldmatrix. One block per MBR query rows of
 * one head, MW warps of 16 rows; per warp, for the whole key loop:
 *   Q's fragments (16 x D, A operands, D / 16 k-chunks of 4 registers);
 *   O (16 x D fp32, D / 8 n-tiles of 4 floats: rows lane / 4 and
 *   lane / 4 + 8, columns 2 (lane % 4) and the next), the row max m and the
 *   lane's part of the row sum l (rows lane / 4 and lane / 4 + 8).
 * Per key tile of MBC keys (K and V through shared memory): S = Q K^T in
 * registers (8 n-tiles of 4 floats), scaled to log2 units; the row max over
 * the lane's 16 values and its quad (shuffles xor 1, 2); P = 2^(S - m) in
 * place; O *= 2^(m_old - m_new); P rounded to the qkv type is the A operand
 * of P V as it lies (the C layout of n-tiles 2c and 2c + 1 is the A layout
 * of k-chunk c); O += P V with V's fragments from ldmatrix .trans. At the
 * end the quad sums l, out = O / l, lse = m ln 2 + log l.
 *
 * Every sum runs in a fixed order: results do not change from run to run. */
#include "gpu/cuda/attention_mma.h" /* defines: cuda_attn_mma_covers */
#include "gpu/cuda/kernels.cuh"     /* defines: tstore, ZO_LAUNCH, WARP, FULL_MASK */
#include "gpu/cuda/mma_ptx.cuh"     /* defines: mma_m16n8k16, ldmatrix_x4, ldmatrix_x4_trans, mma_pack */

#define MW 4          /* warps per block */
#define MBR (16 * MW) /* query rows per block */
#define MBC 64        /* keys per tile */

#define MMA_LOG2E 1.4426950408889634f
#define MMA_LN2 0.6931471805599453f

/* What the kernel needs of the shape. */
struct mma_geom {
    int t, hq, hkv, grp;
    size_t ld;  /* qkv's row stride, (hq + 2 hkv) d */
    size_t ldo; /* out's, hq d */
    float scale;
};

/* 16 bytes: the unit of the tile copies. */
struct alignas(16) mma_chunk {
    unsigned u[4];
};

/* Rows 0 .. n - 1 (n <= rows) of one head's D columns of a 16-bit
 * row-major source (stride ld elements) into dst [rows][LD]; rows past n are
 * zero. D and ld are multiples of 8 (16 bytes). */
template <typename T, int D, int LD>
__device__ __forceinline__ void mma_load_tile(T *dst, const T *src, size_t ld, int n, int rows)
{
    const int per_row = D / 8;
    for (int x = threadIdx.x; x < rows * per_row; x += blockDim.x) {
        const int r = x / per_row, c = x % per_row * 8;
        mma_chunk v = {{0u, 0u, 0u, 0u}};
        if (r < n) v = *reinterpret_cast<const mma_chunk *>(src + (size_t)r * ld + c);
        *reinterpret_cast<mma_chunk *>(dst + (size_t)r * LD + c) = v;
    }
}

/* Dynamic shared memory: Ks, Vs [MBC][D+8] (Q staged in Ks first). The 8
 * elements of padding put the 8 rows an ldmatrix reads in distinct banks. */
template <typename T, int D>
__global__ void __launch_bounds__(MW * WARP)
    attention_mma_forward_kernel(gpu_tensor out, float *lse, const T *qkv, mma_geom G)
{
    static_assert(MBR == MBC, "Q is staged in K's tile");
    static_assert(D % 16 == 0, "k-chunks of 16");
    constexpr int LDT = D + 8;
    ZO_EXTERN_SHARED(float, smem);
    T *Ks = reinterpret_cast<T *>(smem), *Vs = Ks + MBC * LDT;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    const int quad_row = lane / 4, quad_col = 2 * (lane % 4); /* the lane's place in a C fragment */
    const int lr = lane % 8, lm = lane / 8; /* the row and the matrix this lane addresses in an ldmatrix */
    /* the row blocks in z, the slowest index, from the last (the longest) of
     * every head and sequence down */
    const int i0 = (gridDim.z - 1 - blockIdx.z) * MBR, h = blockIdx.x, b = blockIdx.y, g = h / G.grp;
    const int n_rows = min(MBR, G.t - i0);
    const T *base = qkv + (size_t)b * G.t * G.ld;

    /* Q: staged in Ks, kept in A fragments: k-chunk k's matrices are rows
     * 0-7 / 8-15 (lm % 2) x columns 0-7 / 8-15 (lm / 2) of the warp's 16 */
    mma_load_tile<T, D, LDT>(Ks, base + (size_t)i0 * G.ld + (size_t)h * D, G.ld, n_rows, MBR);
    __syncthreads();
    unsigned qf[D / 16][4];
    ZO_UNROLL
    for (int k = 0; k < D / 16; k++)
        ldmatrix_x4(qf[k], Ks + (size_t)(w * 16 + lr + 8 * (lm % 2)) * LDT + k * 16 + 8 * (lm / 2));

    float o[D / 8][4];
    ZO_UNROLL
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float sl2 = G.scale * MMA_LOG2E;
    /* the lane's rows; a row past t masks as the last row does (its results are dropped) */
    const int r0 = i0 + w * 16 + quad_row;
    const int row[2] = {min(r0, G.t - 1), min(r0 + 8, G.t - 1)};
    const T *kb = base + (size_t)(G.hq + g) * D, *vb = base + (size_t)(G.hq + G.hkv + g) * D;
    const int last = i0 + n_rows - 1;
    for (int j0 = 0; j0 <= last; j0 += MBC) {
        __syncthreads(); /* the last tile's reads are done (and Q's) */
        const int n_keys = min(MBC, G.t - j0);
        mma_load_tile<T, D, LDT>(Ks, kb + (size_t)j0 * G.ld, G.ld, n_keys, MBC);
        mma_load_tile<T, D, LDT>(Vs, vb + (size_t)j0 * G.ld, G.ld, n_keys, MBC);
        __syncthreads();

        /* S = Q K^T: n-tiles 2p and 2p + 1 (keys 16p ..) of k-chunk k from one
         * ldmatrix: keys 0-7 / 8-15 (lm / 2) x dims 0-7 / 8-15 (lm % 2) */
        float s[MBC / 8][4];
        ZO_UNROLL
        for (int n = 0; n < MBC / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        ZO_UNROLL
        for (int k = 0; k < D / 16; k++) {
            ZO_UNROLL
            for (int p = 0; p < MBC / 16; p++) {
                unsigned kf[4];
                ldmatrix_x4(kf, Ks + (size_t)(p * 16 + lr + 8 * (lm / 2)) * LDT + k * 16 + 8 * (lm % 2));
                mma_m16n8k16<T>(s[2 * p], qf[k], kf, s[2 * p]);
                mma_m16n8k16<T>(s[2 * p + 1], qf[k], kf + 2, s[2 * p + 1]);
            }
        }

        /* the online softmax in log2 units: the causal mask only where a key
         * of the tile lies past a row of the warp (keys past t lie past every
         * row); every row sees key j0 (j0 <= i0 <= its row): m is finite */
        const bool edge = j0 + MBC - 1 > i0 + w * 16;
        float mx[2] = {m[0], m[1]};
        ZO_UNROLL
        for (int n = 0; n < MBC / 8; n++) {
            ZO_UNROLL
            for (int e = 0; e < 4; e++) {
                const int j = j0 + n * 8 + quad_col + e % 2;
                const float v = edge && j > row[e / 2] ? -INFINITY : s[n][e] * sl2;
                s[n][e] = v;
                mx[e / 2] = fmaxf(mx[e / 2], v);
            }
        }
        float alpha[2], sum[2] = {0.0f, 0.0f};
        ZO_UNROLL
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL_MASK, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL_MASK, mx[r], 2));
            alpha[r] = exp2f(m[r] - mx[r]);
            m[r] = mx[r];
        }
        ZO_UNROLL
        for (int n = 0; n < MBC / 8; n++) {
            ZO_UNROLL
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(s[n][e] - m[e / 2]);
                s[n][e] = p;
                sum[e / 2] += p;
            }
        }
        ZO_UNROLL
        for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + sum[r];
        ZO_UNROLL
        for (int n = 0; n < D / 8; n++) {
            o[n][0] *= alpha[0], o[n][1] *= alpha[0];
            o[n][2] *= alpha[1], o[n][3] *= alpha[1];
        }

        /* O += P V: k-chunk c of P is n-tiles 2c, 2c + 1 of S; V's n-tiles
         * 2p, 2p + 1 (dims 16p ..) from one ldmatrix .trans: keys 0-7 / 8-15
         * (lm % 2) x dims 0-7 / 8-15 (lm / 2) */
        ZO_UNROLL
        for (int c = 0; c < MBC / 16; c++) {
            const unsigned pf[4] = {mma_pack<T>(s[2 * c][0], s[2 * c][1]), mma_pack<T>(s[2 * c][2], s[2 * c][3]),
                                    mma_pack<T>(s[2 * c + 1][0], s[2 * c + 1][1]),
                                    mma_pack<T>(s[2 * c + 1][2], s[2 * c + 1][3])};
            ZO_UNROLL
            for (int p = 0; p < D / 16; p++) {
                unsigned vf[4];
                ldmatrix_x4_trans(vf, Vs + (size_t)(c * 16 + lr + 8 * (lm % 2)) * LDT + p * 16 + 8 * (lm / 2));
                mma_m16n8k16<T>(o[2 * p], pf, vf, o[2 * p]);
                mma_m16n8k16<T>(o[2 * p + 1], pf, vf + 2, o[2 * p + 1]);
            }
        }
    }

    /* out = O / l, lse = m ln 2 + log l: the quad's sums of l, then the lane's rows */
    ZO_UNROLL
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 1);
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 2);
    }
    ZO_UNROLL
    for (int r = 0; r < 2; r++) {
        const int i = r0 + 8 * r;
        if (i >= G.t) continue;
        const float inv = 1.0f / l[r];
        const size_t first = ((size_t)b * G.t + i) * G.ldo + (size_t)h * D + quad_col;
        ZO_UNROLL
        for (int n = 0; n < D / 8; n++) {
            tstore(out, first + n * 8, o[n][2 * r] * inv);
            tstore(out, first + n * 8 + 1, o[n][2 * r + 1] * inv);
        }
        if (lane % 4 == 0) lse[((size_t)b * G.hq + h) * G.t + i] = m[r] * MMA_LN2 + logf(l[r]);
    }
}

/* ---- launcher ---------------------------------------------------------------- */

template <typename T, int D>
static zo_status mma_forward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out, float *lse, gpu_tensor qkv)
{
    /* 2 MBC (D + 8) 16-bit elements: 34 KiB at D 128, under the 48 KiB a
     * kernel gets without opting in */
    const size_t smem = 2 * (size_t)MBC * (D + 8) * sizeof(T);
    mma_geom G;
    G.t = a->t;
    G.hq = a->hq;
    G.hkv = a->hkv;
    G.grp = a->hq / a->hkv;
    G.ld = (size_t)(a->hq + 2 * a->hkv) * a->d;
    G.ldo = (size_t)a->hq * a->d;
    G.scale = gpu_attn_scale(a);
    dim3 grid(a->hq, a->b, (a->t + MBR - 1) / MBR);
    auto *attention_mma_forward = attention_mma_forward_kernel<T, D>; /* one macro argument */
    ZO_LAUNCH(attention_mma_forward, grid, MW * WARP, smem, st, out, lse, static_cast<const T *>(qkv.data), G);
    return cuda_launch_check("attention_mma_forward_kernel");
}

template <typename T>
static zo_status mma_forward_t(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out, float *lse, gpu_tensor qkv)
{
    switch (a->d) {
    case 64: return mma_forward<T, 64>(st, a, out, lse, qkv);
    case 80: return mma_forward<T, 80>(st, a, out, lse, qkv);
    case 96: return mma_forward<T, 96>(st, a, out, lse, qkv);
    default: return mma_forward<T, 128>(st, a, out, lse, qkv);
    }
}

extern "C" zo_status cuda_launch_attention_mma_forward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out,
                                                       float *lse, gpu_tensor qkv)
{
    const char *op = "gpu_attention_forward";
    if ((uintptr_t)qkv.data % 16 != 0)
        return zo_error(ZO_ERR_UNSUPPORTED, "%s (cuda, mma.sync): qkv not 16-byte aligned", op);
    if (!cuda_attn_mma_covers(a, qkv.dtype))
        return zo_error(ZO_ERR_UNSUPPORTED, "%s (cuda, mma.sync): d %d, %s qkv, window %d, softcap %g, alibi %g", op,
                        a->d, zo_dtype_name(qkv.dtype), a->window, (double)a->softcap, (double)a->alibi);
    if (a->b > 65535 || (a->t + MBR - 1) / MBR > 65535)
        return zo_error(ZO_ERR_UNSUPPORTED, "%s (cuda, mma.sync): batch %d or %d-row blocks %d > 65535", op, a->b,
                        MBR, (a->t + MBR - 1) / MBR);
    if (a->t <= 0 || a->b <= 0) return ZO_OK;
    if (qkv.dtype == ZO_DTYPE_BF16) return mma_forward_t<__nv_bfloat16>(st, a, out, lse, qkv);
    return mma_forward_t<__half>(st, a, out, lse, qkv);
}
