/* Causal self-attention, memory-efficient (flash-style): no [t, t] matrix
 * exists at any time. The forward streams key/value tiles through shared
 * memory with an online softmax and saves only the log-sum-exp of each score
 * row; the backward recomputes the probabilities from it.
 *
 * Layout (gpu/device.h): qkv [b, t, (hq + 2*hkv) * d], per token the hq query
 * heads, then hkv key heads, then hkv value heads; query head h reads kv head
 * h / (hq / hkv). out [b, t, hq*d], lse [b, hq, t], dqkv like qkv. Scores
 * are scaled and, with a cap, soft-capped (attn_geom::score), then with
 * ALiBi biased by a step a head times (j - i) (attn_geom::step). With a
 * sliding window (G.window > 0) query i sees keys i - window < j <= i: the
 * tiles wholly outside it are skipped, the keys outside it masked.
 *
 * Work split, chosen to be simple and free of atomics:
 * - forward and dQ: a block of NW warps per (query tile of NW rows, query
 *   head, batch); warp w owns query row i = tile*NW + w; tiles of TK keys
 *   pass through shared memory; lane l scores key j0 + l of the tile, and
 *   lanes own the output dimensions k = lane + 32*u.
 * - dK/dV: a block of NW warps per (key tile of NW rows, kv head, batch);
 *   warp w owns key row j; tiles of TK query rows (of every query head of the
 *   group) pass through shared memory; lane l takes query row i0 + l.
 * Each output element is written by exactly one lane, and every sum runs in
 * the order of the CPU reference (keys ascending; heads, then rows,
 * ascending), so results do not change from run to run. */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, warp_sum, warp_max */

#define NW 8  /* warps per block: query rows (forward, dQ) or key rows (dK/dV) */
#define TK 32 /* rows per tile in shared memory: one per lane */

/* Element offsets into qkv / out / lse. */
struct attn_geom {
    int t, hq, hkv, d, grp;
    int window;     /* > 0: query i sees keys i - window < j <= i */
    size_t ld, ldo; /* row strides of qkv and out */
    float scale;
    float cap; /* > 0: scores soft-capped, cap tanh(s / cap) */
    float alibi;    /* > 0: the score of query i, key j gets alibi slope_h (j - i) */
    int alibi_bf16; /* ... or Falcon's alibi bf16(bf16(slope_h) j) (gpu_alibi_at) */
    /* query head h's ALiBi (no bias without): the score's is gpu_alibi_at(ab, i, j) */
    __device__ gpu_alibi_head step(int h) const { return gpu_alibi_of(alibi, alibi_bf16, hq, h); }
    /* the score of a dot product: scaled, then capped */
    __device__ float score(float dot) const { return cap > 0.0f ? cap * tanhf(dot * scale / cap) : dot * scale; }
    /* the backward's: the score, and in *dcap the cap's derivative there
     * (1 - tanh^2; 1 without a cap), from one tanh. The score gradient of
     * dp - D is then P (dp - D) scale dcap. */
    __device__ float score_d(float dot, float *dcap) const
    {
        if (cap <= 0.0f) {
            *dcap = 1.0f;
            return dot * scale;
        }
        const float th = tanhf(dot * scale / cap);
        *dcap = 1.0f - th * th;
        return cap * th;
    }
    /* the first key query i sees */
    __device__ int first_key(int i) const { return window > 0 && i >= window ? i - window + 1 : 0; }
    /* whether query i sees key j */
    __device__ bool sees(int i, int j) const { return j <= i && (window <= 0 || i - j < window); }
    __device__ size_t q(int b, int i, int h) const { return ((size_t)b * t + i) * ld + (size_t)h * d; }
    __device__ size_t k(int b, int j, int g) const
    {
        return ((size_t)b * t + j) * ld + (size_t)(hq + g) * d;
    }
    __device__ size_t v(int b, int j, int g) const
    {
        return ((size_t)b * t + j) * ld + (size_t)(hq + hkv + g) * d;
    }
    __device__ size_t o(int b, int i, int h) const { return ((size_t)b * t + i) * ldo + (size_t)h * d; }
    __device__ size_t l(int b, int h, int i) const { return ((size_t)b * hq + h) * t + i; }
};

/* Rows j0..j0+TK-1 of one head into dst [TK][ldd] (fp32), zeros past t. */
__device__ void load_tile(float *dst, int ldd, gpu_tensor src, const attn_geom &G, int b, int j0,
                          int head_off_elems)
{
    for (int e = threadIdx.x; e < TK * G.d; e += blockDim.x) {
        int jj = e / G.d, k = e % G.d, j = j0 + jj;
        dst[jj * ldd + k] =
            j < G.t ? tload(src, ((size_t)b * G.t + j) * G.ld + (size_t)head_off_elems + k) : 0.0f;
    }
}

/* Forward. Dynamic shared memory: Ks [TK][d+1], Vs [TK][d], Qs [NW][d]. */
template <int DPL>
__global__ void attention_forward_kernel(gpu_tensor out, float *lse, gpu_tensor qkv, attn_geom G)
{
    ZO_EXTERN_SHARED(float, smem);
    const int d = G.d, dp = d + 1;
    float *Ks = smem, *Vs = Ks + TK * dp, *Qs = Vs + TK * d;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    const int b = blockIdx.z, h = blockIdx.y, g = h / G.grp;
    const int i0 = blockIdx.x * NW, i = i0 + w;
    const bool valid = i < G.t; /* uniform over the warp */
    float *q = Qs + w * d;
    if (valid)
        for (int k = lane; k < d; k += WARP) q[k] = tload(qkv, G.q(b, i, h) + k);

    float o[DPL], m = -INFINITY, l = 0.0f;
    for (int u = 0; u < DPL; u++) o[u] = 0.0f;
    const gpu_alibi_head ab = G.step(h);
    const int last = min(i0 + NW, G.t) - 1; /* the block's last query row */
    /* from the tile of the first key the block's first row sees */
    for (int j0 = G.first_key(i0) / TK * TK; j0 <= last; j0 += TK) {
        __syncthreads(); /* the previous tile is no longer read; q is written */
        load_tile(Ks, dp, qkv, G, b, j0, (G.hq + g) * d);
        load_tile(Vs, d, qkv, G, b, j0, (G.hq + G.hkv + g) * d);
        __syncthreads();
        /* every key of the tile is masked for this row */
        if (!valid || j0 > i || j0 + TK - 1 < G.first_key(i)) continue;
        const int j = j0 + lane;
        float s = -INFINITY;
        if (G.sees(i, j)) {
            float acc = 0.0f;
            const float *kr = Ks + lane * dp;
            for (int k = 0; k < d; k++) acc += q[k] * kr[k];
            s = G.score(acc) + gpu_alibi_at(ab, i, j);
        }
        /* a key of the tile is unmasked, so the new maximum is finite */
        const float mnew = fmaxf(m, warp_max(s));
        const float p = G.sees(i, j) ? expf(s - mnew) : 0.0f;
        const float corr = expf(m - mnew); /* 0 on the first tile (m = -inf) */
        l = l * corr + warp_sum(p);
        for (int u = 0; u < DPL; u++) o[u] *= corr;
        for (int jj = 0; jj < TK; jj++) {
            const float pj = __shfl_sync(FULL_MASK, p, jj);
            const float *vr = Vs + jj * d;
            for (int u = 0; u < DPL; u++) {
                const int k = lane + WARP * u;
                if (k < d) o[u] += pj * vr[k];
            }
        }
        m = mnew;
    }
    if (!valid) return;
    const float inv = 1.0f / l;
    for (int u = 0; u < DPL; u++) {
        const int k = lane + WARP * u;
        if (k < d) tstore(out, G.o(b, i, h) + k, o[u] * inv);
    }
    if (lane == 0) lse[G.l(b, h, i)] = m + logf(l);
}

/* Backward, dQ. dq_i = scale * sum_j P_ij (dO_i . V_j - D_i) K_j with
 * P_ij = exp(q_i . K_j * scale - lse_i), D_i = dO_i . O_i (soft-capped:
 * the capped score in P, each term times the cap's derivative).
 * Dynamic shared memory: Ks [TK][d+1], Vs [TK][d+1], Qs [NW][d], dOs [NW][d]. */
template <int DPL>
__global__ void attention_backward_dq_kernel(gpu_tensor dqkv, gpu_tensor dout, gpu_tensor qkv,
                                             gpu_tensor out, const float *lse, attn_geom G)
{
    ZO_EXTERN_SHARED(float, smem);
    const int d = G.d, dp = d + 1;
    float *Ks = smem, *Vs = Ks + TK * dp, *Qs = Vs + TK * dp, *dOs = Qs + NW * d;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    const int b = blockIdx.z, h = blockIdx.y, g = h / G.grp;
    const int i0 = blockIdx.x * NW, i = i0 + w;
    const bool valid = i < G.t;
    float *q = Qs + w * d, *go = dOs + w * d;
    float D = 0.0f, L = 0.0f;
    if (valid) {
        float acc = 0.0f;
        for (int k = lane; k < d; k += WARP) {
            q[k] = tload(qkv, G.q(b, i, h) + k);
            go[k] = tload(dout, G.o(b, i, h) + k);
            acc += go[k] * tload(out, G.o(b, i, h) + k);
        }
        D = warp_sum(acc);
        L = lse[G.l(b, h, i)];
    }

    float dq[DPL];
    for (int u = 0; u < DPL; u++) dq[u] = 0.0f;
    const gpu_alibi_head ab = G.step(h);
    const int last = min(i0 + NW, G.t) - 1;
    for (int j0 = G.first_key(i0) / TK * TK; j0 <= last; j0 += TK) {
        __syncthreads();
        load_tile(Ks, dp, qkv, G, b, j0, (G.hq + g) * d);
        load_tile(Vs, dp, qkv, G, b, j0, (G.hq + G.hkv + g) * d);
        __syncthreads();
        if (!valid || j0 > i || j0 + TK - 1 < G.first_key(i)) continue;
        const int j = j0 + lane;
        float ds = 0.0f;
        if (G.sees(i, j)) {
            const float *kr = Ks + lane * dp, *vr = Vs + lane * dp;
            float sk = 0.0f, sv = 0.0f;
            for (int k = 0; k < d; k++) {
                sk += q[k] * kr[k];
                sv += go[k] * vr[k];
            }
            float dc;
            const float p = expf(G.score_d(sk, &dc) + gpu_alibi_at(ab, i, j) - L);
            ds = p * (sv - D) * G.scale * dc;
        }
        for (int jj = 0; jj < TK; jj++) {
            const float dsj = __shfl_sync(FULL_MASK, ds, jj);
            const float *kr = Ks + jj * dp;
            for (int u = 0; u < DPL; u++) {
                const int k = lane + WARP * u;
                if (k < d) dq[u] += dsj * kr[k];
            }
        }
    }
    if (!valid) return;
    for (int u = 0; u < DPL; u++) {
        const int k = lane + WARP * u;
        if (k < d) tstore(dqkv, G.q(b, i, h) + k, dq[u]);
    }
}

/* Backward, dK and dV of kv head g, summed over the query heads of its group:
 * dV_j = sum_{h, i >= j} P_ij dO_i, dK_j = scale * sum_{h, i >= j} P_ij
 * (dO_i . V_j - D_i) q_i. Dynamic shared memory: Qs [TK][d+1], dOs [TK][d+1],
 * Ls [TK], Ds [TK], Kw [NW][d], Vw [NW][d]. */
template <int DPL>
__global__ void attention_backward_dkv_kernel(gpu_tensor dqkv, gpu_tensor dout, gpu_tensor qkv,
                                              gpu_tensor out, const float *lse, attn_geom G)
{
    ZO_EXTERN_SHARED(float, smem);
    const int d = G.d, dp = d + 1;
    float *Qs = smem, *dOs = Qs + TK * dp, *Ls = dOs + TK * dp, *Ds = Ls + TK;
    float *Kw = Ds + TK, *Vw = Kw + NW * d;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    const int b = blockIdx.z, g = blockIdx.y;
    const int jfirst = blockIdx.x * NW, j = jfirst + w;
    const bool valid = j < G.t;
    float *kj = Kw + w * d, *vj = Vw + w * d;
    if (valid)
        for (int k = lane; k < d; k += WARP) {
            kj[k] = tload(qkv, G.k(b, j, g) + k);
            vj[k] = tload(qkv, G.v(b, j, g) + k);
        }

    float dk[DPL], dv[DPL];
    for (int u = 0; u < DPL; u++) dk[u] = dv[u] = 0.0f;
    /* query rows below the block's first key see none of its keys, nor (with
     * a window) rows at or past its last key + window */
    const int istart = jfirst / TK * TK;
    const int iend = G.window > 0 ? min(G.t, jfirst + NW - 1 + G.window) : G.t;
    for (int h = g * G.grp; h < (g + 1) * G.grp; h++) {
        const gpu_alibi_head ab = G.step(h);
        for (int i0 = istart; i0 < iend; i0 += TK) {
            __syncthreads(); /* the previous tile is no longer read */
            load_tile(Qs, dp, qkv, G, b, i0, h * d);
            for (int e = threadIdx.x; e < TK * d; e += blockDim.x) {
                int ii = e / d, k = e % d, i = i0 + ii;
                dOs[ii * dp + k] = i < G.t ? tload(dout, G.o(b, i, h) + k) : 0.0f;
            }
            for (int ii = threadIdx.x; ii < TK; ii += blockDim.x)
                Ls[ii] = i0 + ii < G.t ? lse[G.l(b, h, i0 + ii)] : 0.0f;
            __syncthreads();
            /* D_i = dO_i . O_i for the tile's rows, one warp per row */
            for (int ii = w; ii < TK; ii += NW) {
                const int i = i0 + ii;
                float acc = 0.0f;
                if (i < G.t)
                    for (int k = lane; k < d; k += WARP)
                        acc += dOs[ii * dp + k] * tload(out, G.o(b, i, h) + k);
                acc = warp_sum(acc);
                if (lane == 0) Ds[ii] = acc;
            }
            __syncthreads();
            /* every row of the tile is masked for this key */
            if (!valid || i0 + TK - 1 < j || (G.window > 0 && i0 - j >= G.window)) continue;
            const int i = i0 + lane;
            float p = 0.0f, ds = 0.0f;
            if (i < G.t && G.sees(i, j)) {
                const float *qr = Qs + lane * dp, *gr = dOs + lane * dp;
                float sk = 0.0f, sv = 0.0f;
                for (int k = 0; k < d; k++) {
                    sk += qr[k] * kj[k];
                    sv += gr[k] * vj[k];
                }
                float dc;
                p = expf(G.score_d(sk, &dc) + gpu_alibi_at(ab, i, j) - Ls[lane]);
                ds = p * (sv - Ds[lane]) * G.scale * dc;
            }
            for (int ii = 0; ii < TK; ii++) {
                const float pi = __shfl_sync(FULL_MASK, p, ii);
                const float dsi = __shfl_sync(FULL_MASK, ds, ii);
                const float *qr = Qs + ii * dp, *gr = dOs + ii * dp;
                for (int u = 0; u < DPL; u++) {
                    const int k = lane + WARP * u;
                    if (k < d) {
                        dv[u] += pi * gr[k];
                        dk[u] += dsi * qr[k];
                    }
                }
            }
        }
    }
    if (!valid) return;
    for (int u = 0; u < DPL; u++) {
        const int k = lane + WARP * u;
        if (k < d) {
            tstore(dqkv, G.k(b, j, g) + k, dk[u]);
            tstore(dqkv, G.v(b, j, g) + k, dv[u]);
        }
    }
}

/* ---- over a key/value cache (generation) ----------------------------------------
 * Two kernels in stream order: the new tokens' keys and values into the
 * caches, then the attention, one warp per (query row, query head,
 * sequence) as in the forward: lane l scores cache row j0 + l (read from
 * global memory), an online softmax over chunks of 32 rows, lanes own the
 * output dimensions. Keys ascending, as the CPU reference sums them. */

/* Sequence s's new rows fit its cache: pos[s] in [0, tc - t]. */
__device__ __forceinline__ bool cached_pos_ok(int p0, int t, int tc) { return p0 >= 0 && p0 <= tc - t; }

/* kc, vc [b, tc, hkv*d] at rows pos[s] + i = qkv's keys and values of row (s, i). */
__global__ void attention_cache_write_kernel(cuda_err_rec *err, gpu_tensor kc, gpu_tensor vc, gpu_tensor qkv,
                                             const int32_t *pos, int tc, int nb, attn_geom G)
{
    const size_t kvw = (size_t)G.hkv * G.d, total = (size_t)nb * G.t * kvw;
    for (size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x; x < total;
         x += (size_t)gridDim.x * blockDim.x) {
        const size_t r = x / kvw, e = x % kvw; /* row (s, i), element e of its kv heads */
        const int s = (int)(r / G.t), i = (int)(r % G.t), p0 = pos[s];
        if (!cached_pos_ok(p0, G.t, tc)) {
            if (i == 0 && e == 0) record_bad_id(err, CUDA_ERR_ATTN_CACHED, s, p0, tc - G.t + 1);
            continue;
        }
        const size_t dst = ((size_t)s * tc + p0 + i) * kvw + e, src = r * G.ld + (size_t)G.hq * G.d + e;
        tstore(kc, dst, tload(qkv, src));
        tstore(vc, dst, tload(qkv, src + kvw));
    }
}

/* out [b, t, hq*d]: query i of sequence s over cache rows 0 .. pos[s] + i;
 * with sinks (NULL: none) the softmax state starts at head h's sink (m its
 * logit, l 1: a column without a value). Dynamic shared memory: Qs [NW][d]. */
template <int DPL>
__global__ void attention_cached_kernel(gpu_tensor out, gpu_tensor qkv, gpu_tensor kc, gpu_tensor vc,
                                        const int32_t *pos, const float *sinks, int tc, attn_geom G)
{
    ZO_EXTERN_SHARED(float, smem);
    const int d = G.d, lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    const int b = blockIdx.z, h = blockIdx.y, g = h / G.grp, i = blockIdx.x * NW + w;
    const int p0 = pos[b];
    const bool valid = i < G.t && cached_pos_ok(p0, G.t, tc); /* uniform over the warp */
    float *q = smem + w * d;
    if (valid)
        for (int k = lane; k < d; k += WARP) q[k] = tload(qkv, G.q(b, i, h) + k);
    __syncthreads();
    if (!valid) return;
    const size_t ldc = (size_t)G.hkv * d, base = (size_t)b * tc * ldc + (size_t)g * d;
    const int p = p0 + i, jfirst = G.window > 0 && p >= G.window ? p - G.window + 1 : 0;
    const gpu_alibi_head ab = G.step(h);
    float o[DPL], m = sinks ? sinks[h] : -INFINITY, l = sinks ? 1.0f : 0.0f;
    for (int u = 0; u < DPL; u++) o[u] = 0.0f;
    for (int j0 = jfirst; j0 <= p; j0 += WARP) {
        const int j = j0 + lane;
        float s = -INFINITY;
        if (j <= p) {
            float acc = 0.0f;
            for (int k = 0; k < d; k++) acc += q[k] * tload(kc, base + (size_t)j * ldc + k);
            s = G.score(acc) + gpu_alibi_at(ab, p, j);
        }
        const float mnew = fmaxf(m, warp_max(s)); /* row j0 is seen: finite */
        const float pj = j <= p ? expf(s - mnew) : 0.0f;
        const float corr = expf(m - mnew);
        l = l * corr + warp_sum(pj);
        for (int u = 0; u < DPL; u++) o[u] *= corr;
        const int n = min(WARP, p - j0 + 1);
        for (int jj = 0; jj < n; jj++) {
            const float pjj = __shfl_sync(FULL_MASK, pj, jj);
            const size_t vrow = base + (size_t)(j0 + jj) * ldc;
            for (int u = 0; u < DPL; u++) {
                const int k = lane + WARP * u;
                if (k < d) o[u] += pjj * tload(vc, vrow + k);
            }
        }
        m = mnew;
    }
    const float inv = 1.0f / l;
    for (int u = 0; u < DPL; u++) {
        const int k = lane + WARP * u;
        if (k < d) tstore(out, G.o(b, i, h) + k, o[u] * inv);
    }
}

/* ---- attention sinks (gpu/device.h) --------------------------------------------
 * Applied around whichever kernels ran the attention: the forward's rows
 * scaled by exp(L - L'), L' = log(exp(L) + exp(sink)), and lse set to L';
 * the backward, given those, needs only the sinks' gradient. */

/* One warp per row (b, i, h) of out: rows [b*t*hq]. */
__global__ void attention_sink_forward_kernel(gpu_tensor out, float *lse, const float *sinks, int t, int hq,
                                              int d, size_t rows)
{
    const size_t r = (size_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= rows) return;
    const int h = (int)(r % hq), lane = threadIdx.x % WARP;
    const size_t bi = r / hq, b = bi / t, i = bi % t;
    float *L = lse + (b * hq + h) * t + i;
    const float x = *L, y = sinks[h], hi = fmaxf(x, y), Ls = hi + log1pf(expf(fminf(x, y) - hi));
    const float f = expf(x - Ls);
    for (int k = lane; k < d; k += WARP) tstore(out, r * d + k, tload(out, r * d + k) * f);
    __syncwarp();
    if (lane == 0) *L = Ls;
}

/* One block per head h: dsinks[h] = -sum over b, i of exp(sink - lse) (dout
 * . out), the rows in a fixed order of threads and a fixed tree. */
__global__ void attention_sink_backward_kernel(float *dsinks, const float *sinks, gpu_tensor dout, gpu_tensor out,
                                               const float *lse, int nb, int t, int hq, int d)
{
    const int h = blockIdx.x;
    double acc = 0.0;
    for (int bi = threadIdx.x; bi < nb * t; bi += blockDim.x) {
        const int b = bi / t, i = bi % t;
        const size_t o = ((size_t)b * t + i) * hq * d + (size_t)h * d;
        float D = 0.0f;
        for (int k = 0; k < d; k++) D += tload(dout, o + k) * tload(out, o + k);
        acc -= (double)expf(sinks[h] - lse[((size_t)b * hq + h) * t + i]) * (double)D;
    }
    acc = block_sum_d(acc);
    if (threadIdx.x == 0) dsinks[h] = (float)acc;
}

extern "C" zo_status cuda_launch_attention_sink_forward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out,
                                                        float *lse, const float *sinks)
{
    const size_t rows = (size_t)a->b * a->t * a->hq;
    const unsigned per = 8; /* rows (warps) per block */
    ZO_LAUNCH(attention_sink_forward_kernel, (unsigned)((rows + per - 1) / per), per * WARP, 0, st, out, lse,
              sinks, a->t, a->hq, a->d, rows);
    return cuda_launch_check("attention_sink_forward_kernel");
}

extern "C" zo_status cuda_launch_attention_sink_backward(cudaStream_t st, const gpu_attn_desc *a, float *dsinks,
                                                         const float *sinks, gpu_tensor dout, gpu_tensor out,
                                                         const float *lse)
{
    ZO_LAUNCH(attention_sink_backward_kernel, (unsigned)a->hq, 256, 0, st, dsinks, sinks, dout, out, lse, a->b,
              a->t, a->hq, a->d);
    return cuda_launch_check("attention_sink_backward_kernel");
}

/* ---- launchers ---------------------------------------------------------------- */

static attn_geom make_geom(const gpu_attn_desc *a)
{
    attn_geom G;
    G.t = a->t;
    G.hq = a->hq;
    G.hkv = a->hkv;
    G.d = a->d;
    G.grp = a->hq / a->hkv;
    G.window = a->window;
    G.ld = (size_t)(a->hq + 2 * a->hkv) * a->d;
    G.ldo = (size_t)a->hq * a->d;
    G.scale = gpu_attn_scale(a);
    G.cap = a->softcap;
    G.alibi = a->alibi;
    G.alibi_bf16 = a->alibi_bf16;
    return G;
}

/* Allow more than the default 48 KiB of dynamic shared memory when needed. */
template <typename K>
static zo_status allow_smem(K *kernel, size_t bytes, const char *name)
{
    if (bytes <= 48u * 1024u) return ZO_OK;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)bytes);
    if (e == cudaSuccess) return ZO_OK;
    /* clear it: left behind, it would fail the next launch check of any kernel */
    (void)cudaGetLastError();
    return zo_error(ZO_ERR_DEVICE, "cudaFuncSetAttribute(%s, %zu bytes of shared memory): %s", name,
                    bytes, cudaGetErrorString(e));
}

/* Dimensions per lane for head dim d: 1, 2, 4 or 8 (d <= 256), else 0. */
static int dims_per_lane(int d)
{
    if (d <= 32) return 1;
    if (d <= 64) return 2;
    if (d <= 128) return 4;
    if (d <= CUDA_ATTN_MAX_D) return 8;
    return 0;
}

template <int DPL>
static zo_status forward_dpl(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out, float *lse,
                             gpu_tensor qkv)
{
    attn_geom G = make_geom(a);
    size_t smem = ((size_t)TK * (G.d + 1) + (size_t)TK * G.d + (size_t)NW * G.d) * sizeof(float);
    zo_status s = allow_smem(attention_forward_kernel<DPL>, smem, "attention_forward_kernel");
    if (s != ZO_OK) return s;
    dim3 grid((a->t + NW - 1) / NW, a->hq, a->b);
    ZO_LAUNCH(attention_forward_kernel<DPL>, grid, NW * WARP, smem, st, out, lse, qkv, G);
    return cuda_launch_check("attention_forward_kernel");
}

template <int DPL>
static zo_status backward_dpl(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor dqkv,
                              gpu_tensor dout, gpu_tensor qkv, gpu_tensor out, const float *lse)
{
    attn_geom G = make_geom(a);
    size_t smem_dq = ((size_t)2 * TK * (G.d + 1) + (size_t)2 * NW * G.d) * sizeof(float);
    size_t smem_dkv = ((size_t)2 * TK * (G.d + 1) + 2 * TK + (size_t)2 * NW * G.d) * sizeof(float);
    zo_status s = allow_smem(attention_backward_dq_kernel<DPL>, smem_dq,
                             "attention_backward_dq_kernel");
    if (s != ZO_OK) return s;
    s = allow_smem(attention_backward_dkv_kernel<DPL>, smem_dkv, "attention_backward_dkv_kernel");
    if (s != ZO_OK) return s;
    dim3 grid_dq((a->t + NW - 1) / NW, a->hq, a->b);
    ZO_LAUNCH(attention_backward_dq_kernel<DPL>, grid_dq, NW * WARP, smem_dq, st, dqkv, dout, qkv,
              out, lse, G);
    s = cuda_launch_check("attention_backward_dq_kernel");
    if (s != ZO_OK) return s;
    dim3 grid_dkv((a->t + NW - 1) / NW, a->hkv, a->b);
    ZO_LAUNCH(attention_backward_dkv_kernel<DPL>, grid_dkv, NW * WARP, smem_dkv, st, dqkv, dout,
              qkv, out, lse, G);
    return cuda_launch_check("attention_backward_dkv_kernel");
}

static zo_status check_geometry(const char *op, const gpu_attn_desc *a)
{
    if (!dims_per_lane(a->d))
        return zo_error(ZO_ERR_UNSUPPORTED, "%s (cuda): head dim %d > %d", op, a->d,
                        CUDA_ATTN_MAX_D);
    if (a->hq > 65535 || a->b > 65535)
        return zo_error(ZO_ERR_UNSUPPORTED, "%s (cuda): batch %d or heads %d > 65535", op, a->b,
                        a->hq);
    return ZO_OK;
}

extern "C" zo_status cuda_launch_attention_forward(cudaStream_t st, const gpu_attn_desc *a,
                                                   gpu_tensor out, float *lse, gpu_tensor qkv)
{
    zo_status s = check_geometry("gpu_attention_forward", a);
    if (s != ZO_OK) return s;
    switch (dims_per_lane(a->d)) {
    case 1: return forward_dpl<1>(st, a, out, lse, qkv);
    case 2: return forward_dpl<2>(st, a, out, lse, qkv);
    case 4: return forward_dpl<4>(st, a, out, lse, qkv);
    default: return forward_dpl<8>(st, a, out, lse, qkv);
    }
}

extern "C" zo_status cuda_launch_attention_backward(cudaStream_t st, const gpu_attn_desc *a,
                                                    gpu_tensor dqkv, gpu_tensor dout,
                                                    gpu_tensor qkv, gpu_tensor out,
                                                    const float *lse)
{
    zo_status s = check_geometry("gpu_attention_backward", a);
    if (s != ZO_OK) return s;
    switch (dims_per_lane(a->d)) {
    case 1: return backward_dpl<1>(st, a, dqkv, dout, qkv, out, lse);
    case 2: return backward_dpl<2>(st, a, dqkv, dout, qkv, out, lse);
    case 4: return backward_dpl<4>(st, a, dqkv, dout, qkv, out, lse);
    default: return backward_dpl<8>(st, a, dqkv, dout, qkv, out, lse);
    }
}

template <int DPL>
static zo_status cached_dpl(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out, gpu_tensor qkv,
                            gpu_tensor kc, gpu_tensor vc, const int32_t *pos, const float *sinks, int tc)
{
    attn_geom G = make_geom(a);
    size_t smem = (size_t)NW * G.d * sizeof(float);
    dim3 grid((a->t + NW - 1) / NW, a->hq, a->b);
    ZO_LAUNCH(attention_cached_kernel<DPL>, grid, NW * WARP, smem, st, out, qkv, kc, vc, pos, sinks, tc, G);
    return cuda_launch_check("attention_cached_kernel");
}

/* The cached attention's dims per lane: the others' up to 256, then 16 or
 * 32 (the latent cache's rows, up to CUDA_ATTN_CACHED_MAX_D), else 0. */
static int cached_dims_per_lane(int d)
{
    if (d <= CUDA_ATTN_MAX_D) return dims_per_lane(d);
    if (d <= 512) return 16;
    if (d <= CUDA_ATTN_CACHED_MAX_D) return 32;
    return 0;
}

extern "C" zo_status cuda_launch_attention_cached(cudaStream_t st, cuda_err_rec *err, const gpu_attn_desc *a,
                                                  gpu_tensor out, gpu_tensor qkv, gpu_tensor k_cache,
                                                  gpu_tensor v_cache, const int32_t *pos, const float *sinks,
                                                  int tc)
{
    if (!cached_dims_per_lane(a->d))
        return zo_error(ZO_ERR_UNSUPPORTED, "gpu_attention_cached (cuda): head dim %d > %d", a->d,
                        CUDA_ATTN_CACHED_MAX_D);
    gpu_attn_desc g = *a;
    g.d = 1; /* (the head dim checked above: the rest of the geometry) */
    zo_status s = check_geometry("gpu_attention_cached", &g);
    if (s != ZO_OK) return s;
    attn_geom G = make_geom(a);
    size_t total = (size_t)a->b * a->t * a->hkv * a->d;
    ZO_LAUNCH(attention_cache_write_kernel, grid_for(total, 256), 256, 0, st, err, k_cache, v_cache, qkv, pos, tc,
              a->b, G);
    if ((s = cuda_launch_check("attention_cache_write_kernel")) != ZO_OK) return s;
    switch (cached_dims_per_lane(a->d)) {
    case 1: return cached_dpl<1>(st, a, out, qkv, k_cache, v_cache, pos, sinks, tc);
    case 2: return cached_dpl<2>(st, a, out, qkv, k_cache, v_cache, pos, sinks, tc);
    case 4: return cached_dpl<4>(st, a, out, qkv, k_cache, v_cache, pos, sinks, tc);
    case 8: return cached_dpl<8>(st, a, out, qkv, k_cache, v_cache, pos, sinks, tc);
    case 16: return cached_dpl<16>(st, a, out, qkv, k_cache, v_cache, pos, sinks, tc);
    default: return cached_dpl<32>(st, a, out, qkv, k_cache, v_cache, pos, sinks, tc);
    }
}
