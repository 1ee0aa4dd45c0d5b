/* Causal self-attention on mma.sync (FlashAttention-2's scheme with the
 * scores and the softmax in registers) for what cuda_attn_mma_covers
 * (attention_mma.h: the cases of the tensor-core kernels, attention_tc.cu,
 * but ALiBi).
 * Same contract as attention.cu and attention_tc.cu (gpu/device.h): out,
 * lse [b, hq, t] (the log-sum-exp of the scores, natural log; a forward of
 * one path and a backward of another agree), dqkv overwritten. Scores,
 * soft caps and sliding windows as attention_tc.cu computes them
 * (attn_fused_geom): scale q . k, capped cap tanh(s / cap); a window masks
 * keys before i - window + 1, and the loops skip the tiles wholly outside
 * every row's window as attention_tc.cu's do.
 *
 * Products go through mma_ptx.cuh: mma.m16n8k16 (16-bit operands, fp32
 * accumulators) on fragments whose per-lane layout the PTX ISA documents,
 * loaded from shared memory by ldmatrix. One block per MBR query rows of
 * one head (64; 32 at D 256, mma_tiles), MW warps of 16 rows (at D 256 two
 * warps a 16-row slice, each half of O's columns); per warp, for the whole
 * key loop:
 *   Q's fragments (16 x D, A operands, D / 16 k-chunks of 4 registers);
 *   O (16 x DC fp32, DC / 8 n-tiles of 4 floats: rows lane / 4 and
 *   lane / 4 + 8, columns 2 (lane % 4) and the next), the row max m and the
 *   lane's part of the row sum l (rows lane / 4 and lane / 4 + 8).
 * Per key tile of MBC = MBR keys (K and V through shared memory, the next
 * tile streaming in by cp.async meanwhile): S = Q K^T in
 * registers (MBC / 8 n-tiles of 4 floats), scored (scaled, capped) in log2 units,
 * masked where a key of the tile lies past a row of the warp or before a
 * row's window; the row max over
 * the lane's 16 values and its quad (shuffles xor 1, 2); P = 2^(S - m) in
 * place; O *= 2^(m_old - m_new); P rounded to the qkv type is the A operand
 * of P V as it lies (the C layout of n-tiles 2c and 2c + 1 is the A layout
 * of k-chunk c); O += P V with V's fragments from ldmatrix .trans. At the
 * end the quad sums l, out = O / l, lse = m ln 2 + log l.
 *
 * Every sum runs in a fixed order: results do not change from run to run. */
#include "gpu/cuda/attention_fused.cuh" /* defines: attn_fused_geom, attn_fused_allow_smem, attn_fused_check, attn_fused_backward */
#include "gpu/cuda/attention_mma.h" /* defines: cuda_attn_mma_covers */
#include "gpu/cuda/kernels.cuh"     /* defines: tstore, ZO_LAUNCH, WARP, FULL_MASK */
#include "gpu/cuda/mma_ptx.cuh"     /* defines: mma_m16n8k16, ldmatrix_x4, ldmatrix_x4_trans, mma_pack */

#define MW 4 /* warps per block */

/* The tiles by head dim: MB query rows a block and keys a tile (the
 * backward's dK/dV block: MB keys, query tiles of MB), the warps' outputs
 * in NH column parts of DC = D / NH (warp w: rows 16 (w / NH) .. of the
 * tile, columns DC (w % NH) ..). Up to D 128: MB 64, NH 1, each warp all
 * of a row's D columns. At D 256 a warp's 16 x 256 fp32 accumulators (dK
 * and dV both: 256 registers a lane) would not fit: MB 32 and NH 2, the
 * two warps of a row slice computing the same scores (Q K^T over all of D)
 * and each its half of the outputs; the backward's shared memory with an
 * fp32 dO is 82.75 KiB (at MB 64 it would be 165.5, past sm_80's 163). */
template <int D>
struct mma_tiles {
    static constexpr int NH = D > 128 ? 2 : 1;
    static constexpr int MB = 16 * MW / NH;
    static constexpr int DC = D / NH;
};

#define MMA_LOG2E 1.4426950408889634f
#define MMA_LN2 0.6931471805599453f

/* What the kernels need of the shape (attention_fused.cuh). */
typedef attn_fused_geom mma_geom;

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

/* Fragments from a 16-bit row-major tile in shared memory (row stride LD
 * elements), by one ldmatrix .x4; a lane addresses row lr = lane % 8 of
 * matrix lm = lane / 8. mma_frag_a: the A operand of rows r0 .. r0 + 15, k-chunk at
 * column k0 (matrices: rows + 0 / 8 by lm % 2, columns + 0 / 8 by lm / 2).
 * mma_frag_b: the B operands of two n-tiles, rows n0 .. n0 + 7 and n0 + 8
 * .. n0 + 15 of a tile stored [n][k] (as K for Q K^T), k-chunk at column k0
 * (rows + 0 / 8 by lm / 2, columns by lm % 2): f[0..1] the first n-tile,
 * f[2..3] the second. mma_frag_bt: the same of a tile stored [k][n] (as V
 * for P V), k-chunk at row k0, n-tiles at columns n0 and n0 + 8, through
 * .trans (rows + 0 / 8 by lm % 2, columns by lm / 2). */
template <int LD, typename T>
__device__ __forceinline__ void mma_frag_a(unsigned f[4], const T *tile, int r0, int k0)
{
    const int lane = threadIdx.x % WARP, lr = lane % 8, lm = lane / 8;
    ldmatrix_x4(f, tile + (size_t)(r0 + lr + 8 * (lm % 2)) * LD + k0 + 8 * (lm / 2));
}

template <int LD, typename T>
__device__ __forceinline__ void mma_frag_b(unsigned f[4], const T *tile, int n0, int k0)
{
    const int lane = threadIdx.x % WARP, lr = lane % 8, lm = lane / 8;
    ldmatrix_x4(f, tile + (size_t)(n0 + lr + 8 * (lm / 2)) * LD + k0 + 8 * (lm % 2));
}

template <int LD, typename T>
__device__ __forceinline__ void mma_frag_bt(unsigned f[4], const T *tile, int k0, int n0)
{
    const int lane = threadIdx.x % WARP, lr = lane % 8, lm = lane / 8;
    ldmatrix_x4_trans(f, tile + (size_t)(k0 + lr + 8 * (lm % 2)) * LD + n0 + 8 * (lm / 2));
}

/* The A operand of k-chunk c from the C fragments of n-tiles 2c (c0) and
 * 2c + 1 (c1) of a 16-row product: the C layout of two adjacent n-tiles is
 * the A layout of one k-chunk. hi: rounded to T; lo (mma_split_a): the
 * remainder v - hi rounded to T (hi + lo: about twice T's precision). */
template <typename T>
__device__ __forceinline__ void mma_a_from_c(unsigned a[4], const float c0[4], const float c1[4])
{
    a[0] = mma_pack<T>(c0[0], c0[1]);
    a[1] = mma_pack<T>(c0[2], c0[3]);
    a[2] = mma_pack<T>(c1[0], c1[1]);
    a[3] = mma_pack<T>(c1[2], c1[3]);
}

template <typename T>
__device__ __forceinline__ void mma_split_a(unsigned hi[4], unsigned lo[4], const float c0[4], const float c1[4])
{
    mma_a_from_c<T>(hi, c0, c1);
    const float *src[4] = {c0, c0 + 2, c1, c1 + 2};
    ZO_UNROLL
    for (int r = 0; r < 4; r++) {
        float x, y;
        mma_unpack<T>(hi[r], &x, &y);
        lo[r] = mma_pack<T>(src[r][0] - x, src[r][1] - y);
    }
}

/* mma_load_tile through cp.async (mma_ptx.cuh): the rows past n are zeroed
 * by plain stores, the others copied in the thread's current group; the
 * caller commits, waits and synchronizes before reading. */
template <typename T, int D, int LD>
__device__ __forceinline__ void mma_load_tile_async(T *dst, const T *src, size_t ld, int n, int rows)
{
    const int per_row = D / 8;
    for (int x = threadIdx.x; x < rows * per_row; x += blockDim.x) {
        const int r = x / per_row, c = x % per_row * 8;
        if (r < n) {
            cp_async16(dst + (size_t)r * LD + c, src + (size_t)r * ld + c);
        } else {
            const mma_chunk z = {{0u, 0u, 0u, 0u}};
            *reinterpret_cast<mma_chunk *>(dst + (size_t)r * LD + c) = z;
        }
    }
}

/* Dynamic shared memory: two buffers of Ks, Vs [MBC][D+8] (Q staged in the
 * second's Ks first): tile j + 1 streams in by cp.async while tile j is
 * computed. The 8 elements of padding put the 8 rows an ldmatrix reads in
 * distinct banks. MBR = MBC = mma_tiles' MB; warp w computes the scores of
 * rows 16 (w / NH) .. and columns wc = DC (w % NH) .. of O. */
template <typename T, int D>
__global__ void __launch_bounds__(MW * WARP)
    attention_mma_forward_kernel(gpu_tensor out, float *lse, const T *qkv, mma_geom G)
{
    constexpr int MBR = mma_tiles<D>::MB, MBC = mma_tiles<D>::MB, NH = mma_tiles<D>::NH, DC = mma_tiles<D>::DC;
    static_assert(MBR == MBC, "Q is staged in K's tile");
    static_assert(D % 16 == 0 && DC % 16 == 0, "k-chunks of 16");
    constexpr int LDT = D + 8;
    ZO_EXTERN_SHARED(float, smem);
    T *const buf = reinterpret_cast<T *>(smem); /* buffer u: K at buf + 2 u MBC LDT, V after it */
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP / NH, wc = threadIdx.x / WARP % NH * DC;
    const int quad_row = lane / 4, quad_col = 2 * (lane % 4); /* the lane's place in a C fragment */
    /* the row blocks in z, the slowest index, from the last (the longest) of
     * every head and sequence down */
    const int i0 = (gridDim.z - 1 - blockIdx.z) * MBR, h = blockIdx.x, b = blockIdx.y, g = h / G.grp;
    const int n_rows = min(MBR, G.t - i0);
    const T *base = qkv + (size_t)b * G.t * G.ld;

    /* Q: staged in buffer 1's K while tile 0 streams into buffer 0, kept in
     * A fragments (the warp's 16 rows, k-chunks of 16) */
    const T *kb = base + (size_t)(G.hq + g) * D, *vb = base + (size_t)(G.hq + G.hkv + g) * D;
    /* from the tile of the first key the block's first row sees */
    const int j_first = G.first_key(i0) / MBC * MBC;
    mma_load_tile_async<T, D, LDT>(buf, kb + (size_t)j_first * G.ld, G.ld, min(MBC, G.t - j_first), MBC);
    mma_load_tile_async<T, D, LDT>(buf + MBC * LDT, vb + (size_t)j_first * G.ld, G.ld, min(MBC, G.t - j_first), MBC);
    cp_async_commit();
    mma_load_tile<T, D, LDT>(buf + 2 * MBC * LDT, base + (size_t)i0 * G.ld + (size_t)h * D, G.ld, n_rows, MBR);
    __syncthreads();
    unsigned qf[D / 16][4];
    ZO_UNROLL
    for (int k = 0; k < D / 16; k++) mma_frag_a<LDT>(qf[k], buf + 2 * MBC * LDT, w * 16, k * 16);

    float o[DC / 8][4];
    ZO_UNROLL
    for (int n = 0; n < DC / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float sl2 = G.scale * MMA_LOG2E;
    /* the lane's rows; a row past t masks as the last row does (its results are dropped) */
    const int r0 = i0 + w * 16 + quad_row;
    const int row[2] = {min(r0, G.t - 1), min(r0 + 8, G.t - 1)};
    const int last = i0 + n_rows - 1;
    for (int j0 = j_first, u = 0; j0 <= last; j0 += MBC, u ^= 1) {
        /* tile j0 in buffer u: this thread's copies done, then everyone's;
         * the barrier also says every warp is done with buffer u ^ 1 (the
         * last tile, or Q), which tile j0 + MBC then streams into */
        cp_async_wait_all();
        __syncthreads();
        if (j0 + MBC <= last) {
            T *next = buf + (size_t)(u ^ 1) * 2 * MBC * LDT;
            const int n_next = min(MBC, G.t - j0 - MBC);
            mma_load_tile_async<T, D, LDT>(next, kb + (size_t)(j0 + MBC) * G.ld, G.ld, n_next, MBC);
            mma_load_tile_async<T, D, LDT>(next + MBC * LDT, vb + (size_t)(j0 + MBC) * G.ld, G.ld, n_next, MBC);
            cp_async_commit();
        }
        const T *Ks = buf + (size_t)u * 2 * MBC * LDT, *Vs = Ks + MBC * LDT;

        /* S = Q K^T: n-tiles 2p and 2p + 1 (keys 16p ..) of k-chunk k from one ldmatrix */
        float s[MBC / 8][4];
        ZO_UNROLL
        for (int n = 0; n < MBC / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        ZO_UNROLL
        for (int k = 0; k < D / 16; k++) {
            ZO_UNROLL
            for (int p = 0; p < MBC / 16; p++) {
                unsigned kf[4];
                mma_frag_b<LDT>(kf, Ks, p * 16, k * 16);
                mma_m16n8k16<T>(s[2 * p], qf[k], kf, s[2 * p]);
                mma_m16n8k16<T>(s[2 * p + 1], qf[k], kf + 2, s[2 * p + 1]);
            }
        }

        /* the online softmax in log2 units (soft-capped: cap tanh first):
         * the mask only where a key of the tile lies past a row of the warp
         * (keys past t lie past every row) or, with a window, before the
         * first key of one. With a window a row may have seen no key yet
         * (m stays -inf, p and alpha 0); its own key it sees, so m ends
         * finite. */
        const int w0 = i0 + w * 16; /* the warp's first row */
        const bool edge = j0 + MBC - 1 > w0 || (G.window > 0 && j0 <= w0 + 15 - G.window);
        float mx[2] = {m[0], m[1]};
        ZO_UNROLL
        for (int n = 0; n < MBC / 8; n++) {
            ZO_UNROLL
            for (int e = 0; e < 4; e++) {
                const int j = j0 + n * 8 + quad_col + e % 2;
                const float sc = G.cap > 0.0f ? G.score(s[n][e]) * MMA_LOG2E : s[n][e] * sl2;
                const float v = edge && !G.sees(row[e / 2], j) ? -INFINITY : sc;
                s[n][e] = v;
                mx[e / 2] = fmaxf(mx[e / 2], v);
            }
        }
        float alpha[2], sum[2] = {0.0f, 0.0f}, msub[2];
        ZO_UNROLL
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL_MASK, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL_MASK, mx[r], 2));
            msub[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
            alpha[r] = exp2f(m[r] - msub[r]);
            m[r] = mx[r];
        }
        ZO_UNROLL
        for (int n = 0; n < MBC / 8; n++) {
            ZO_UNROLL
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(s[n][e] - msub[e / 2]);
                s[n][e] = p;
                sum[e / 2] += p;
            }
        }
        ZO_UNROLL
        for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + sum[r];
        ZO_UNROLL
        for (int n = 0; n < DC / 8; n++) {
            o[n][0] *= alpha[0], o[n][1] *= alpha[0];
            o[n][2] *= alpha[1], o[n][3] *= alpha[1];
        }

        /* O += P V: k-chunk c of P is n-tiles 2c, 2c + 1 of S; V's n-tiles
         * 2p, 2p + 1 (dims wc + 16p ..) from one ldmatrix .trans */
        ZO_UNROLL
        for (int c = 0; c < MBC / 16; c++) {
            unsigned pf[4];
            mma_a_from_c<T>(pf, s[2 * c], s[2 * c + 1]);
            ZO_UNROLL
            for (int p = 0; p < DC / 16; p++) {
                unsigned vf[4];
                mma_frag_bt<LDT>(vf, Vs, c * 16, wc + p * 16);
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
        const size_t first = ((size_t)b * G.t + i) * G.ldo + (size_t)h * D + wc + quad_col;
        ZO_UNROLL
        for (int n = 0; n < DC / 8; n++) {
            tstore(out, first + n * 8, o[n][2 * r] * inv);
            tstore(out, first + n * 8 + 1, o[n][2 * r + 1] * inv);
        }
        if (lane % 4 == 0 && wc == 0) lse[((size_t)b * G.hq + h) * G.t + i] = m[r] * MMA_LN2 + logf(l[r]);
    }
}

/* ---- backward ------------------------------------------------------------------
 * With P = exp(score(Q K^T) - lse) (masked), Di = dO_i . O_i (fp32, a pass
 * of its own), dP = dO V^T and dS = P (dP - D) scale dcap (dcap = 1 - tanh^2
 * of the capped score, 1 without a cap): dV = P^T dO and dK = dS^T Q per
 * key tile (one block over every query tile from its first key to its
 * window's end and every query head of its kv head's group; S^T and dP^T
 * both computed before P^T, since dcap needs S beside dP: 254 registers at
 * bf16 d 128 on sm_90, no spills), the warp's 16 keys' dK and dV
 * in registers, written once); dQ = dS K per query tile (a second kernel
 * that recomputes S and dP, dQ in registers). The products' operands come
 * from shared memory by ldmatrix, the scores (S^T, dP^T in the first; S, dP
 * in the second) stay in registers and enter the next products as A
 * operands as they lie. As attention_tc.cu, P and dS enter them as a high
 * and a low 16-bit part, and so does an fp32 dO: per key tile, 8 products
 * of the tile's size in the first kernel and 5 in the second with an fp32
 * dO (6 and 4 with a 16-bit one), against the algorithm's 4 and 3. With
 * grads16 (gpu_attn_desc) each is rounded once to the qkv type, as
 * FlashAttention-2 does: those 4 and 3 (SPLIT false). No atomics: every
 * output element has one writer, every sum a fixed order. */


/* The backward kernels' dynamic shared memory: L, Dd [MB] fp32 (the query
 * rows' lse and D), K, V, Q, dOh, dOl [MB][D+8] (dOl with an fp32 dO, else
 * null; MB of mma_tiles). */
template <typename T>
struct mma_bwd_smem {
    float *L, *Dd;
    T *K, *V, *Q, *dOh, *dOl;
};

template <typename T, int D>
__device__ __forceinline__ mma_bwd_smem<T> mma_bwd_carve(int split_do)
{
    constexpr int LDT = D + 8, MBR = mma_tiles<D>::MB, MBC = mma_tiles<D>::MB;
    ZO_EXTERN_SHARED(float, smem);
    float *L = smem, *Dd = L + MBR;
    T *K = reinterpret_cast<T *>(Dd + MBR), *V = K + MBC * LDT, *Q = V + MBC * LDT, *dOh = Q + MBR * LDT;
    return {L, Dd, K, V, Q, dOh, split_do ? dOh + MBR * LDT : nullptr};
}

/* Query rows i0 .. i0 + n - 1 of head h of batch b (base: the batch's qkv
 * rows) into sm.Q; dO's rows into sm.dOh and, with sm.dOl, the remainder
 * dO - dOh into sm.dOl; their lse and D into sm.L, sm.Dd; rows past n zero. */
template <typename T, int D>
__device__ __forceinline__ void mma_load_queries(const mma_bwd_smem<T> &sm, const T *base, gpu_tensor dout,
                                                 const float *lse, const float *Drow, const mma_geom &G, int b, int h,
                                                 int i0, int n)
{
    constexpr int LDT = D + 8, MBR = mma_tiles<D>::MB;
    mma_load_tile<T, D, LDT>(sm.Q, base + (size_t)i0 * G.ld + (size_t)h * D, G.ld, n, MBR);
    const size_t first = ((size_t)b * G.t + i0) * G.ldo + (size_t)h * D;
    for (int x = threadIdx.x; x < MBR * D / 2; x += blockDim.x) {
        const int r = x / (D / 2), c = x % (D / 2) * 2;
        const float v0 = r < n ? tload(dout, first + (size_t)r * G.ldo + c) : 0.0f;
        const float v1 = r < n ? tload(dout, first + (size_t)r * G.ldo + c + 1) : 0.0f;
        const unsigned hi = mma_pack<T>(v0, v1);
        *reinterpret_cast<unsigned *>(sm.dOh + (size_t)r * LDT + c) = hi;
        if (sm.dOl) {
            float x0, x1;
            mma_unpack<T>(hi, &x0, &x1);
            *reinterpret_cast<unsigned *>(sm.dOl + (size_t)r * LDT + c) = mma_pack<T>(v0 - x0, v1 - x1);
        }
    }
    for (int x = threadIdx.x; x < MBR; x += blockDim.x) {
        const size_t l = ((size_t)b * G.hq + h) * G.t + i0 + x;
        sm.L[x] = x < n ? lse[l] : 0.0f;
        sm.Dd[x] = x < n ? Drow[l] : 0.0f;
    }
}

/* c[MB / 8] (16 rows x MB columns, fp32) += A B^T over D: A the tile
 * `a`'s rows r0 .. r0 + 15, B the tile `b`'s MB rows (both [rows][D+8];
 * MB of mma_tiles). */
template <typename T, int D>
__device__ __forceinline__ void mma_abt(float (*c)[4], const T *a, int r0, const T *b)
{
    constexpr int LDT = D + 8, MBC = mma_tiles<D>::MB;
    ZO_UNROLL
    for (int k = 0; k < D / 16; k++) {
        unsigned af[4];
        mma_frag_a<LDT>(af, a, r0, k * 16);
        ZO_UNROLL
        for (int p = 0; p < MBC / 16; p++) {
            unsigned bf[4];
            mma_frag_b<LDT>(bf, b, p * 16, k * 16);
            mma_m16n8k16<T>(c[2 * p], af, bf, c[2 * p]);
            mma_m16n8k16<T>(c[2 * p + 1], af, bf + 2, c[2 * p + 1]);
        }
    }
}

/* acc[DC / 8] (16 rows x DC, fp32) += X B with X (16 x MB) the C
 * fragments x[MB / 8] as two 16-bit parts (hi + lo; SPLIT false: hi
 * alone, X rounded once) and B columns n0 .. n0 + DC - 1 of the tile `b`
 * [MB][D+8] (stored [k][n]); with b2, also += hi(X) b2 (MB, DC of
 * mma_tiles). */
template <typename T, int D, bool SPLIT>
__device__ __forceinline__ void mma_xb(float (*acc)[4], const float (*x)[4], const T *b, const T *b2, int n0)
{
    constexpr int LDT = D + 8, MBC = mma_tiles<D>::MB, DC = mma_tiles<D>::DC;
    ZO_UNROLL
    for (int c = 0; c < MBC / 16; c++) {
        unsigned hi[4], lo[4];
        mma_split_a<T>(hi, lo, x[2 * c], x[2 * c + 1]);
        ZO_UNROLL
        for (int p = 0; p < DC / 16; p++) {
            unsigned bf[4];
            mma_frag_bt<LDT>(bf, b, c * 16, n0 + p * 16);
            mma_m16n8k16<T>(acc[2 * p], hi, bf, acc[2 * p]);
            mma_m16n8k16<T>(acc[2 * p + 1], hi, bf + 2, acc[2 * p + 1]);
            if (SPLIT) {
                mma_m16n8k16<T>(acc[2 * p], lo, bf, acc[2 * p]);
                mma_m16n8k16<T>(acc[2 * p + 1], lo, bf + 2, acc[2 * p + 1]);
            }
            if (b2) {
                mma_frag_bt<LDT>(bf, b2, c * 16, n0 + p * 16);
                mma_m16n8k16<T>(acc[2 * p], hi, bf, acc[2 * p]);
                mma_m16n8k16<T>(acc[2 * p + 1], hi, bf + 2, acc[2 * p + 1]);
            }
        }
    }
}

/* Rows `row[r]` (< t; r = 0, 1: the lane's rows lane / 4 and lane / 4 + 8)
 * of acc (16 x D fp32 C fragments) into dst at first + row * ld. */
template <int D>
__device__ __forceinline__ void mma_store_rows(gpu_tensor dst, size_t first, size_t ld, const int row[2], int t,
                                               const float (*acc)[4])
{
    const int quad_col = 2 * (threadIdx.x % WARP % 4);
    ZO_UNROLL
    for (int r = 0; r < 2; r++) {
        if (row[r] >= t) continue;
        const size_t o = first + (size_t)row[r] * ld + quad_col;
        ZO_UNROLL
        for (int n = 0; n < D / 8; n++) {
            tstore(dst, o + n * 8, acc[n][2 * r]);
            tstore(dst, o + n * 8 + 1, acc[n][2 * r + 1]);
        }
    }
}

/* dK, dV of MBC keys of one kv head; each warp 16 keys, columns wc ..
 * wc + DC - 1 (mma_tiles). SPLIT: P and dS enter their products as two
 * 16-bit parts; else rounded once (gpu_attn_desc's grads16). */
template <typename T, int D, bool SPLIT>
__global__ void __launch_bounds__(MW * WARP)
    attention_mma_backward_dkv_kernel(gpu_tensor dqkv, gpu_tensor dout, const T *qkv, const float *lse,
                                      const float *Drow, mma_geom G, int split_do)
{
    constexpr int LDT = D + 8, MBR = mma_tiles<D>::MB, MBC = mma_tiles<D>::MB, NH = mma_tiles<D>::NH,
                  DC = mma_tiles<D>::DC;
    const mma_bwd_smem<T> sm = mma_bwd_carve<T, D>(split_do);
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP / NH, wc = threadIdx.x / WARP % NH * DC;
    const int quad_row = lane / 4, quad_col = 2 * (lane % 4);
    const int j0 = blockIdx.z * MBC, g = blockIdx.x, b = blockIdx.y; /* the first keys (the longest) first */
    const int n_keys = min(MBC, G.t - j0);
    const T *base = qkv + (size_t)b * G.t * G.ld;
    mma_load_tile<T, D, LDT>(sm.K, base + (size_t)j0 * G.ld + (size_t)(G.hq + g) * D, G.ld, n_keys, MBC);
    mma_load_tile<T, D, LDT>(sm.V, base + (size_t)j0 * G.ld + (size_t)(G.hq + G.hkv + g) * D, G.ld, n_keys, MBC);

    float dk[DC / 8][4], dv[DC / 8][4];
    ZO_UNROLL
    for (int n = 0; n < DC / 8; n++) {
        ZO_UNROLL
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
    }
    const int key[2] = {j0 + w * 16 + quad_row, j0 + w * 16 + quad_row + 8}; /* the lane's keys */
    /* the query tiles from the one of the first key up to the last query
     * that sees the block's last key */
    const int i_end = G.query_end(j0 + n_keys - 1);
    for (int h = g * G.grp; h < (g + 1) * G.grp; h++)
        for (int i0 = j0 / MBR * MBR; i0 < i_end; i0 += MBR) {
            __syncthreads(); /* the last tile's reads are done (and K's, V's loads) */
            mma_load_queries<T, D>(sm, base, dout, lse, Drow, G, b, h, i0, min(MBR, G.t - i0));
            __syncthreads();
            /* S^T = K Q^T: the warp's keys x the tile's queries; dP^T = V
             * dO^T beside it (a soft cap's derivative needs S with dP) */
            float s[MBC / 8][4], dp[MBC / 8][4];
            ZO_UNROLL
            for (int n = 0; n < MBC / 8; n++) {
                ZO_UNROLL
                for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
            }
            mma_abt<T, D>(s, sm.K, w * 16, sm.Q);
            mma_abt<T, D>(dp, sm.V, w * 16, sm.dOh);
            if (sm.dOl) mma_abt<T, D>(dp, sm.V, w * 16, sm.dOl);
            /* P^T; dS^T = P^T (dP^T - D) scale dcap */
            ZO_UNROLL
            for (int n = 0; n < MBC / 8; n++) {
                ZO_UNROLL
                for (int e = 0; e < 4; e++) {
                    const int c = n * 8 + quad_col + e % 2, i = i0 + c;
                    float dc = 0.0f;
                    const float p = i < G.t && G.sees(i, key[e / 2]) ? expf(G.score_d(s[n][e], &dc) - sm.L[c]) : 0.0f;
                    s[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - sm.Dd[c]) * G.scale * dc;
                }
            }
            /* dV += P^T dO */
            mma_xb<T, D, SPLIT>(dv, s, sm.dOh, sm.dOl, wc);
            /* dK += dS^T Q */
            mma_xb<T, D, SPLIT>(dk, dp, sm.Q, static_cast<const T *>(nullptr), wc);
        }
    const size_t first = (size_t)b * G.t * G.ld + wc;
    mma_store_rows<DC>(dqkv, first + (size_t)(G.hq + g) * D, G.ld, key, G.t, dk);
    mma_store_rows<DC>(dqkv, first + (size_t)(G.hq + G.hkv + g) * D, G.ld, key, G.t, dv);
}

/* dQ of MBR query rows of one head; each warp 16 rows, columns wc .. wc +
 * DC - 1 (mma_tiles); SPLIT as the dK/dV kernel's. */
template <typename T, int D, bool SPLIT>
__global__ void __launch_bounds__(MW * WARP)
    attention_mma_backward_dq_kernel(gpu_tensor dqkv, gpu_tensor dout, const T *qkv, const float *lse,
                                     const float *Drow, mma_geom G, int split_do)
{
    constexpr int LDT = D + 8, MBR = mma_tiles<D>::MB, MBC = mma_tiles<D>::MB, NH = mma_tiles<D>::NH,
                  DC = mma_tiles<D>::DC;
    const mma_bwd_smem<T> sm = mma_bwd_carve<T, D>(split_do);
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP / NH, wc = threadIdx.x / WARP % NH * DC;
    const int quad_row = lane / 4, quad_col = 2 * (lane % 4);
    const int i0 = (gridDim.z - 1 - blockIdx.z) * MBR, h = blockIdx.x, b = blockIdx.y, g = h / G.grp;
    const int n_rows = min(MBR, G.t - i0);
    const T *base = qkv + (size_t)b * G.t * G.ld;
    mma_load_queries<T, D>(sm, base, dout, lse, Drow, G, b, h, i0, n_rows);

    float dq[DC / 8][4];
    ZO_UNROLL
    for (int n = 0; n < DC / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    const int rr[2] = {w * 16 + quad_row, w * 16 + quad_row + 8}; /* the lane's rows in the tile */
    const int row[2] = {i0 + rr[0], i0 + rr[1]};
    const int last = i0 + n_rows - 1;
    for (int j0 = G.first_key(i0) / MBC * MBC; j0 <= last; j0 += MBC) {
        __syncthreads(); /* the last tile's reads are done (and the setup above) */
        const int n_keys = min(MBC, G.t - j0);
        mma_load_tile<T, D, LDT>(sm.K, base + (size_t)j0 * G.ld + (size_t)(G.hq + g) * D, G.ld, n_keys, MBC);
        mma_load_tile<T, D, LDT>(sm.V, base + (size_t)j0 * G.ld + (size_t)(G.hq + G.hkv + g) * D, G.ld, n_keys,
                                 MBC);
        __syncthreads();
        /* S = Q K^T, P; dP = dO V^T; dS = P (dP - D) scale */
        float s[MBC / 8][4], dp[MBC / 8][4];
        ZO_UNROLL
        for (int n = 0; n < MBC / 8; n++) {
            ZO_UNROLL
            for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
        }
        mma_abt<T, D>(s, sm.Q, w * 16, sm.K);
        mma_abt<T, D>(dp, sm.dOh, w * 16, sm.V);
        if (sm.dOl) mma_abt<T, D>(dp, sm.dOl, w * 16, sm.V);
        ZO_UNROLL
        for (int n = 0; n < MBC / 8; n++) {
            ZO_UNROLL
            for (int e = 0; e < 4; e++) {
                const int j = j0 + n * 8 + quad_col + e % 2, r = e / 2;
                float dc = 0.0f;
                const float p =
                    row[r] < G.t && G.sees(row[r], j) ? expf(G.score_d(s[n][e], &dc) - sm.L[rr[r]]) : 0.0f;
                dp[n][e] = p * (dp[n][e] - sm.Dd[rr[r]]) * G.scale * dc;
            }
        }
        /* dQ += dS K */
        mma_xb<T, D, SPLIT>(dq, dp, sm.K, static_cast<const T *>(nullptr), wc);
    }
    mma_store_rows<DC>(dqkv, (size_t)b * G.t * G.ld + (size_t)h * D + wc, G.ld, row, G.t, dq);
}

/* ---- launchers ---------------------------------------------------------------- */



template <typename T, int D>
static zo_status mma_forward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out, float *lse, gpu_tensor qkv)
{
    /* two buffers of 2 MB (D + 8) 16-bit elements: 68 KiB at D 128, 36 KiB
     * at D 64, 66 KiB at D 256 (MB 32) */
    constexpr int MB = mma_tiles<D>::MB;
    const size_t smem = 4 * (size_t)MB * (D + 8) * sizeof(T);
    zo_status s = attn_fused_allow_smem(attention_mma_forward_kernel<T, D>, smem, "attention_mma_forward_kernel");
    if (s != ZO_OK) return s;
    dim3 grid(a->hq, a->b, (a->t + MB - 1) / MB);
    auto *attention_mma_forward = attention_mma_forward_kernel<T, D>; /* one macro argument */
    ZO_LAUNCH(attention_mma_forward, grid, MW * WARP, smem, st, out, lse, static_cast<const T *>(qkv.data),
              attn_fused_make_geom(a));
    return cuda_launch_check("attention_mma_forward_kernel");
}

template <typename T>
static zo_status mma_forward_t(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out, float *lse, gpu_tensor qkv)
{
    switch (a->d) {
    case 64: return mma_forward<T, 64>(st, a, out, lse, qkv);
    case 80: return mma_forward<T, 80>(st, a, out, lse, qkv);
    case 96: return mma_forward<T, 96>(st, a, out, lse, qkv);
    case 256: return mma_forward<T, 256>(st, a, out, lse, qkv);
    default: return mma_forward<T, 128>(st, a, out, lse, qkv);
    }
}

static zo_status mma_check(const char *op, const gpu_attn_desc *a, gpu_tensor qkv)
{
    const int rows = a->d == 256 ? mma_tiles<256>::MB : mma_tiles<128>::MB; /* a block's */
    return attn_fused_check(op, "mma.sync", a, qkv, cuda_attn_mma_covers(a, qkv.dtype), rows);
}

extern "C" zo_status cuda_launch_attention_mma_forward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out,
                                                       float *lse, gpu_tensor qkv)
{
    zo_status s = mma_check("gpu_attention_forward", a, qkv);
    if (s != ZO_OK) return s;
    if (a->t <= 0 || a->b <= 0) return ZO_OK;
    if (qkv.dtype == ZO_DTYPE_BF16) return mma_forward_t<__nv_bfloat16>(st, a, out, lse, qkv);
    return mma_forward_t<__half>(st, a, out, lse, qkv);
}

template <typename T, int D, bool SPLIT>
static zo_status mma_backward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor dqkv, gpu_tensor dout,
                              gpu_tensor qkv, const float *Drow, const float *lse)
{
    /* dO in two parts when it is not in qkv's type (the transformer's fp32
     * gradient), unless grads16 rounds it once as P and dS */
    const int split_do = SPLIT && dout.dtype != qkv.dtype;
    constexpr int MB = mma_tiles<D>::MB;
    const size_t smem = 2 * (size_t)MB * 4 + (size_t)(2 * MB + (split_do ? 3 : 2) * MB) * (D + 8) * sizeof(T);
    zo_status s = attn_fused_allow_smem(attention_mma_backward_dkv_kernel<T, D, SPLIT>, smem,
                                        "attention_mma_backward_dkv_kernel");
    if (s == ZO_OK)
        s = attn_fused_allow_smem(attention_mma_backward_dq_kernel<T, D, SPLIT>, smem,
                                  "attention_mma_backward_dq_kernel");
    if (s != ZO_OK) return s;
    const mma_geom G = attn_fused_make_geom(a);
    const T *q = static_cast<const T *>(qkv.data);
    dim3 grid_kv(a->hkv, a->b, (a->t + MB - 1) / MB);
    auto *attention_mma_backward_dkv = attention_mma_backward_dkv_kernel<T, D, SPLIT>; /* one macro argument */
    auto *attention_mma_backward_dq = attention_mma_backward_dq_kernel<T, D, SPLIT>;
    ZO_LAUNCH(attention_mma_backward_dkv, grid_kv, MW * WARP, smem, st, dqkv, dout, q, lse, Drow, G, split_do);
    if ((s = cuda_launch_check("attention_mma_backward_dkv_kernel")) != ZO_OK) return s;
    dim3 grid_q(a->hq, a->b, (a->t + MB - 1) / MB);
    ZO_LAUNCH(attention_mma_backward_dq, grid_q, MW * WARP, smem, st, dqkv, dout, q, lse, Drow, G, split_do);
    return cuda_launch_check("attention_mma_backward_dq_kernel");
}

template <typename T, bool SPLIT>
static zo_status mma_backward_d(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor dqkv, gpu_tensor dout,
                                gpu_tensor qkv, const float *Drow, const float *lse)
{
    switch (a->d) {
    case 64: return mma_backward<T, 64, SPLIT>(st, a, dqkv, dout, qkv, Drow, lse);
    case 80: return mma_backward<T, 80, SPLIT>(st, a, dqkv, dout, qkv, Drow, lse);
    case 96: return mma_backward<T, 96, SPLIT>(st, a, dqkv, dout, qkv, Drow, lse);
    case 256: return mma_backward<T, 256, SPLIT>(st, a, dqkv, dout, qkv, Drow, lse);
    default: return mma_backward<T, 128, SPLIT>(st, a, dqkv, dout, qkv, Drow, lse);
    }
}

template <typename T>
static zo_status mma_backward_t(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor dqkv, gpu_tensor dout,
                                gpu_tensor qkv, const float *Drow, const float *lse)
{
    if (a->grads16) return mma_backward_d<T, false>(st, a, dqkv, dout, qkv, Drow, lse);
    return mma_backward_d<T, true>(st, a, dqkv, dout, qkv, Drow, lse);
}

extern "C" zo_status cuda_launch_attention_mma_backward(cudaStream_t st, cudaMemPool_t pool, const gpu_attn_desc *a,
                                                        gpu_tensor dqkv, gpu_tensor dout, gpu_tensor qkv,
                                                        gpu_tensor out, const float *lse)
{
    zo_status s = mma_check("gpu_attention_backward", a, qkv);
    if (s != ZO_OK) return s;
    if (a->t <= 0 || a->b <= 0) return ZO_OK;
    return attn_fused_backward(st, pool, a, dout, out, [&](const float *Drow) {
        if (qkv.dtype == ZO_DTYPE_BF16) return mma_backward_t<__nv_bfloat16>(st, a, dqkv, dout, qkv, Drow, lse);
        return mma_backward_t<__half>(st, a, dqkv, dout, qkv, Drow, lse);
    });
}
