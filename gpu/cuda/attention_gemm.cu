/* Causal self-attention on tensor cores, for 16-bit qkv: the two products
 * of the forward and the five of the backward are strided-batched GEMMs
 * (cuBLASLt through cuda_gemm; the tiled kernel in the host shim; the
 * backward's split operands make its five 8 or 10 GEMMs), the softmax and
 * the score gradient small kernels between them. Same contract
 * as attention.cu (gpu/device.h): out, lse [b, hq, t] saved as the flash
 * kernel saves them, dqkv overwritten.
 *
 * The [rows, keys] scores of a chunk (attention_gemm.h) live in stream-
 * ordered scratch from the device's pool, as gemm.cu's rounded operands do:
 * S in fp32, P in the 16-bit type of qkv (in the forward, flash attention
 * rounds P before the P V product the same way). Per chunk (sequence b, group position hh,
 * kv heads g0 .. g0 + heads - 1, query rows r0 .. r0 + m - 1, keys k0 ..
 * k0 + n - 1):
 *
 *   forward   S = scale Q K^T; P = exp(c(S) - lse) masked, lse = log sum exp
 *             c(S) per row, c the soft cap (or none); O = P V
 *   backward  S = scale Q K^T; P = exp(c(S) - lse) masked; dV += P^T dO;
 *             dP = dO V^T (into S); dS = P (dP - D) scale c'(S) (into P);
 *             dQ = dS K; dK += dS^T Q
 *
 * with D = rowsum(dO * O) in fp32, as the flash kernel's. dK and dV sum
 * over the group's query heads and the row blocks in fp32: in dqkv itself
 * when it is fp32, else in a per-sequence fp32 scratch cast into dqkv at the
 * end. In the backward P, dS and a dO of another type than qkv's (the
 * transformer passes fp32 gradients) are carried as two 16-bit parts
 * (backward_seq says why). Every sum runs in a fixed order: results do not
 * change from run to run. */
#include "gpu/cuda/attention_gemm.h" /* defines: cuda_attn_plan_chunks, cuda_attn_scratch_bytes */
#include "gpu/cuda/kernels.cuh"      /* defines: tload, tstore, warp_sum, warp_max, grid_for */

#define RW 8 /* warps (rows) per block of the row kernels */
#define BS 256

/* gpu_tensor t advanced by `elems` elements (an absent one, data NULL, stays so). */
static gpu_tensor at(gpu_tensor t, size_t elems)
{
    if (!t.data) return t;
    return gpu_t((char *)t.data + elems * zo_dtype_size(t.dtype), t.dtype);
}

/* One chunk's rows: row r of the launch is query row i = r0 + r % m of
 * query head h = (g0 + r / m) * grp + hh; key column c is key k0 + c. */
struct chunk_geom {
    int t, hq, grp, window;
    int b, hh, g0, r0, m, k0, n, ld;
    float scale;
    float cap; /* > 0: the scaled scores soft-capped, cap tanh(s / cap) */
    float alibi;    /* > 0: ALiBi, the score of query i, key j biased by alibi slope_h (j - i) */
    int alibi_bf16; /* ... or by Falcon's alibi bf16(bf16(slope_h) j) (gpu_alibi_at) */
    __device__ float capped(float s) const { return cap > 0.0f ? cap * tanhf(s / cap) : s; }
    /* ALiBi's bias at launch row r, key column c (0 without) */
    __device__ float bias(int r, int c) const
    {
        if (alibi <= 0.0f) return 0.0f;
        const int h = (g0 + r / m) * grp + hh;
        return gpu_alibi_at(gpu_alibi_of(alibi, alibi_bf16, hq, h), r0 + r % m, k0 + c);
    }
    __device__ bool sees(int i, int j) const { return j <= i && (window <= 0 || i - j < window); }
    __device__ size_t lrow(int r) const /* lse / D index of launch row r */
    {
        const int h = (g0 + r / m) * grp + hh;
        return ((size_t)b * hq + h) * t + r0 + r % m;
    }
};

/* Forward: S rows scaled scores (fp32) -> P (16-bit) and lse, with ALiBi's
 * bias added after the cap; one warp per row, lanes over the keys in a fixed order. Keys a row does not see get
 * P = 0; every row sees its own key, so the maximum is finite. Soft-capped,
 * the first pass caps the scores a row sees in place (S is the forward's
 * scratch; each lane rereads only its own columns). */
__global__ void attn_softmax_kernel(gpu_tensor P, float *lse, float *S, chunk_geom G, int rows)
{
    const int lane = threadIdx.x % WARP, r = blockIdx.x * RW + threadIdx.x / WARP;
    if (r >= rows) return; /* uniform over the warp */
    const int i = G.r0 + r % G.m;
    float *s = S + (size_t)r * G.ld;
    float mx = -INFINITY;
    for (int c = lane; c < G.n; c += WARP)
        if (G.sees(i, G.k0 + c)) {
            if (G.cap > 0.0f) s[c] = G.capped(s[c]);
            if (G.alibi > 0.0f) s[c] += G.bias(r, c);
            mx = fmaxf(mx, s[c]);
        }
    mx = warp_max(mx);
    float l = 0.0f;
    for (int c = lane; c < G.n; c += WARP)
        if (G.sees(i, G.k0 + c)) l += expf(s[c] - mx);
    const float L = mx + logf(warp_sum(l));
    for (int c = lane; c < G.n; c += WARP)
        tstore(P, (size_t)r * G.ld + c, G.sees(i, G.k0 + c) ? expf(s[c] - L) : 0.0f);
    if (lane == 0) lse[G.lrow(r)] = L;
}

/* v as a high and a low 16-bit part, hi + lo = v to about twice the type's
 * precision: a product over them is two tensor-core GEMMs. */
__device__ __forceinline__ void store_split(gpu_tensor hi, gpu_tensor lo, size_t e, float v)
{
    tstore(hi, e, v);
    tstore(lo, e, v - tload(hi, e));
}

/* dst = src split into hi + lo (n elements): dO in the type of qkv. */
__global__ void attn_split_kernel(gpu_tensor hi, gpu_tensor lo, gpu_tensor src, size_t n)
{
    for (size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x; x < n; x += (size_t)gridDim.x * blockDim.x)
        store_split(hi, lo, x, tload(src, x));
}

/* Backward, one thread per element of the chunk's rows, the result split
 * into Ph + Pl: with grad 0, P = exp(capped(S) - lse) where the row sees
 * the key, else 0; with grad 1, in place, dS = P (dP - D) scale with dP in
 * S and P in Ph + Pl. Soft-capped, dS is also times 1 - tanh^2 of the
 * score over the cap, the tanh recovered from P as (log P + lse) / cap (S
 * holds dP by then; P carries about twice the 16-bit type's precision, and
 * where P is 0 so is dS). */
__global__ void attn_backward_elems_kernel(gpu_tensor Ph, gpu_tensor Pl, const float *S, const float *lse,
                                           const float *D, chunk_geom G, int rows, int grad)
{
    const size_t total = (size_t)rows * G.n;
    for (size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x; x < total;
         x += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(x / G.n), c = (int)(x % G.n);
        const size_t e = (size_t)r * G.ld + c;
        const float L = lse[G.lrow(r)];
        float y;
        if (grad) {
            const float p = tload(Ph, e) + tload(Pl, e);
            y = p * (S[e] - D[G.lrow(r)]) * G.scale;
            if (G.cap > 0.0f && p > 0.0f) {
                const float th = fminf(fmaxf((logf(p) + L - G.bias(r, c)) / G.cap, -1.0f), 1.0f);
                y *= 1.0f - th * th;
            }
        } else {
            y = G.sees(G.r0 + r % G.m, G.k0 + c) ? expf(G.capped(S[e]) + G.bias(r, c) - L) : 0.0f;
        }
        store_split(Ph, Pl, e, y);
    }
}

/* One sequence's D[h, i] = dO_i . O_i of query head h (fp32), dO and O
 * [t, hq*d]; one warp per row. */
__global__ void attn_rowdot_kernel(float *D, gpu_tensor dout, gpu_tensor out, int t, int hq, int d)
{
    const int lane = threadIdx.x % WARP;
    const size_t r = (size_t)blockIdx.x * RW + threadIdx.x / WARP; /* (i, h), h fastest */
    if (r >= (size_t)t * hq) return;
    float acc = 0.0f;
    for (int k = lane; k < d; k += WARP) acc += tload(dout, r * d + k) * tload(out, r * d + k);
    acc = warp_sum(acc);
    if (lane == 0) D[(r % hq) * t + r / hq] = acc;
}

/* dst[r, c] = src[r, c] (converted), or 0 without src; rows n, columns w. */
__global__ void attn_copy_rows_kernel(gpu_tensor dst, size_t ldd, gpu_tensor src, size_t lds, int n, int w)
{
    const size_t total = (size_t)n * w;
    for (size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x; x < total;
         x += (size_t)gridDim.x * blockDim.x) {
        const size_t r = x / w, c = x % w;
        tstore(dst, r * ldd + c, src.data ? tload(src, r * lds + c) : 0.0f);
    }
}

/* ---- host side ------------------------------------------------------------------ */

/* A GEMM on the stream: cuBLASLt where there is a handle, else the tiled
 * kernel; in the host shim, which has no cuBLASLt, the tiled kernel's bits
 * from a host loop (cuda_gemm_host: the kernel itself is checked through
 * the GEMM op). */
static zo_status gemm(const cuda_gemm_env *g, const gpu_gemm_desc *d)
{
#ifdef ZO_CUDA_SHIM
    (void)g;
    return cuda_gemm_host(d);
#else
    if (g->lt) return cuda_gemm(g->stream, g->lt, g->pool, g->workspace, g->ws_bytes, d);
    return cuda_launch_gemm_tiled(g->stream, d);
#endif
}

/* C[m, n] (+)= alpha op(A) op(B), `batch` products; strides in elements. */
static gpu_gemm_desc desc(gpu_tensor a, int64_t lda, int64_t sa, int ta, gpu_tensor b, int64_t ldb,
                          int64_t sb, int tb, gpu_tensor c, int64_t ldc, int64_t sc, int m, int n, int k,
                          float alpha, float beta, int batch)
{
    gpu_gemm_desc d = {};
    d.trans_a = ta, d.trans_b = tb, d.m = m, d.n = n, d.k = k, d.alpha = alpha, d.beta = beta;
    d.a = a, d.b = b, d.c = c, d.lda = lda, d.ldb = ldb, d.ldc = ldc;
    d.batch = batch, d.stride_a = sa, d.stride_b = sb, d.stride_c = sc;
    return d;
}

/* The shape of a call and its chunks. */
struct attn_shape {
    int b, t, hq, hkv, d, grp, window;
    int64_t ld, ldo; /* row strides of qkv and out */
    float scale, softcap, alibi;
    int alibi_bf16;
    cuda_attn_chunks ch;
};

static attn_shape shape_of(const gpu_attn_desc *a, size_t cap)
{
    attn_shape s;
    s.b = a->b, s.t = a->t, s.hq = a->hq, s.hkv = a->hkv, s.d = a->d, s.window = a->window;
    s.grp = a->hq / a->hkv;
    s.ld = (int64_t)(a->hq + 2 * a->hkv) * a->d;
    s.ldo = (int64_t)a->hq * a->d;
    s.scale = gpu_attn_scale(a);
    s.softcap = a->softcap;
    s.alibi = a->alibi;
    s.alibi_bf16 = a->alibi_bf16;
    s.ch = cuda_attn_plan_chunks(a->t, a->hkv, a->window, cap);
    return s;
}

/* Chunk (b, hh, g0, r0) of shape A: the rows, keys and heads it covers. */
static chunk_geom chunk_of(const attn_shape &A, int b, int hh, int g0, int r0)
{
    chunk_geom G;
    G.t = A.t, G.hq = A.hq, G.grp = A.grp, G.window = A.window, G.scale = A.scale, G.cap = A.softcap;
    G.alibi = A.alibi;
    G.alibi_bf16 = A.alibi_bf16;
    G.b = b, G.hh = hh, G.g0 = g0, G.r0 = r0;
    G.m = min(A.ch.rows, A.t - r0);
    G.k0 = cuda_attn_first_key(r0, A.window);
    G.n = r0 + G.m - G.k0;
    G.ld = cuda_attn_round8(G.n);
    return G;
}

/* Stream-ordered scratch from the pool (host memory in the shim). */
static zo_status scratch_alloc(const cuda_gemm_env *g, size_t bytes, void **p)
{
    return cuda_status(cudaMallocFromPoolAsync(p, bytes, g->pool, g->stream),
                       "cudaMallocFromPoolAsync (attention scratch)");
}

static zo_status scratch_free(const cuda_gemm_env *g, void *p, zo_status s)
{
    zo_status f = cuda_status(cudaFreeAsync(p, g->stream), "cudaFreeAsync (attention scratch)");
    return s != ZO_OK ? s : f;
}

/* S = scale Q K^T of chunk G (heads nh) into S [nh, m, ld] fp32. */
static zo_status scores(const cuda_gemm_env *g, const attn_shape &A, const chunk_geom &G, int nh,
                        gpu_tensor qkv, float *S)
{
    const size_t row = (size_t)G.b * A.t;
    gpu_tensor q = at(qkv, (row + G.r0) * A.ld + (size_t)(G.g0 * A.grp + G.hh) * A.d);
    gpu_tensor k = at(qkv, (row + G.k0) * A.ld + (size_t)(A.hq + G.g0) * A.d);
    gpu_gemm_desc d = desc(q, A.ld, (int64_t)A.grp * A.d, 0, k, A.ld, A.d, 1, gpu_t(S, ZO_DTYPE_F32), G.ld,
                           (int64_t)G.m * G.ld, G.m, G.n, A.d, A.scale, 0.0f, nh);
    return gemm(g, &d);
}

extern "C" zo_status cuda_launch_attention_gemm_forward(const cuda_gemm_env *g, const gpu_attn_desc *a,
                                                        gpu_tensor out, float *lse, gpu_tensor qkv)
{
    const attn_shape A = shape_of(a, g->cap);
    const size_t nS = (size_t)A.ch.heads * A.ch.rows * A.ch.ld;
    void *buf = NULL;
    zo_status s = scratch_alloc(g, cuda_attn_scratch_bytes(0, A.b, A.t, A.hq, A.hkv, A.d, A.window, g->cap, 0, 0),
                                &buf);
    if (s != ZO_OK) return s;
    float *S = (float *)buf;
    gpu_tensor P = gpu_t((char *)buf + cuda_attn_align(nS * sizeof(float)), qkv.dtype);
    for (int b = 0; b < A.b && s == ZO_OK; b++)
        for (int hh = 0; hh < A.grp && s == ZO_OK; hh++)
            for (int g0 = 0; g0 < A.hkv && s == ZO_OK; g0 += A.ch.heads)
                for (int r0 = 0; r0 < A.t && s == ZO_OK; r0 += A.ch.rows) {
                    const chunk_geom G = chunk_of(A, b, hh, g0, r0);
                    const int nh = min(A.ch.heads, A.hkv - g0), rows = nh * G.m;
                    if ((s = scores(g, A, G, nh, qkv, S)) != ZO_OK) break;
                    ZO_LAUNCH(attn_softmax_kernel, (rows + RW - 1) / RW, RW * WARP, 0, g->stream, P, lse, S, G,
                              rows);
                    if ((s = cuda_launch_check("attn_softmax_kernel")) != ZO_OK) break;
                    /* O = P V */
                    const size_t row = (size_t)b * A.t;
                    gpu_tensor v = at(qkv, (row + G.k0) * A.ld + (size_t)(A.hq + A.hkv + g0) * A.d);
                    gpu_tensor o = at(out, (row + r0) * A.ldo + (size_t)(g0 * A.grp + hh) * A.d);
                    gpu_gemm_desc d = desc(P, G.ld, (int64_t)G.m * G.ld, 0, v, A.ld, A.d, 0, o, A.ldo,
                                           (int64_t)A.grp * A.d, G.m, A.d, G.n, 1.0f, 0.0f, nh);
                    s = gemm(g, &d);
                }
    return scratch_free(g, buf, s);
}

/* The backward of one sequence b. dOh: its dO in the type of qkv, row
 * stride ldo, and dOl (data NULL when dO has that type) what rounding left
 * out; acc: where dK and dV sum (fp32, K at column 0, V at hkv*d), row
 * stride lda. P and dS are carried as high and low 16-bit parts (Ph, Pl),
 * and an fp32 dO too: rounded to one part, the early keys' dK and dV (few
 * large terms that cancel) missed the 16-bit tolerances of the op's parity
 * test. Each product with a split operand is a GEMM per part (the product
 * of the two low parts is left out), accumulating. */
static zo_status backward_seq(const cuda_gemm_env *g, const attn_shape &A, int b, gpu_tensor dqkv, gpu_tensor qkv,
                              gpu_tensor dOh, gpu_tensor dOl, const float *lse, const float *D, gpu_tensor acc,
                              int64_t lda, float *S, gpu_tensor Ph, gpu_tensor Pl)
{
    zo_status s = ZO_OK;
    const size_t row = (size_t)b * A.t;
    for (int hh = 0; hh < A.grp && s == ZO_OK; hh++)
        for (int g0 = 0; g0 < A.hkv && s == ZO_OK; g0 += A.ch.heads)
            for (int r0 = 0; r0 < A.t && s == ZO_OK; r0 += A.ch.rows) {
                const chunk_geom G = chunk_of(A, b, hh, g0, r0);
                const int nh = min(A.ch.heads, A.hkv - g0), rows = nh * G.m;
                const int64_t sP = (int64_t)G.m * G.ld, sq = (int64_t)A.grp * A.d;
                const unsigned blocks = grid_for((size_t)rows * G.n, BS);
                const size_t h0 = (size_t)(g0 * A.grp + hh) * A.d; /* the first query head's column */
                gpu_tensor q = at(qkv, (row + r0) * A.ld + h0);
                gpu_tensor k = at(qkv, (row + G.k0) * A.ld + (size_t)(A.hq + g0) * A.d);
                gpu_tensor v = at(qkv, (row + G.k0) * A.ld + (size_t)(A.hq + A.hkv + g0) * A.d);
                gpu_tensor dO = at(dOh, (size_t)r0 * A.ldo + h0), dOlo = at(dOl, (size_t)r0 * A.ldo + h0);
                const int dparts = dOl.data ? 2 : 1;
                gpu_tensor dk = at(acc, (size_t)G.k0 * lda + (size_t)g0 * A.d);
                gpu_tensor dv = at(acc, (size_t)G.k0 * lda + (size_t)(A.hkv + g0) * A.d);
                gpu_tensor dq = at(dqkv, (row + r0) * A.ld + h0);
                gpu_gemm_desc d;
                if ((s = scores(g, A, G, nh, qkv, S)) != ZO_OK) break;
                ZO_LAUNCH(attn_backward_elems_kernel, blocks, BS, 0, g->stream, Ph, Pl, S, lse, D, G, rows, 0);
                if ((s = cuda_launch_check("attn_backward_elems_kernel")) != ZO_OK) break;
                /* dV += P^T dO: Ph dOh, Pl dOh, Ph dOl */
                for (int part = 0; part < 1 + dparts && s == ZO_OK; part++) {
                    d = desc(part == 1 ? Pl : Ph, G.ld, sP, 1, part == 2 ? dOlo : dO, A.ldo, sq, 0, dv, lda, A.d,
                             G.n, A.d, G.m, 1.0f, 1.0f, nh);
                    s = gemm(g, &d);
                }
                if (s != ZO_OK) break;
                /* dP = dO V^T, into S */
                for (int part = 0; part < dparts && s == ZO_OK; part++) {
                    d = desc(part ? dOlo : dO, A.ldo, sq, 0, v, A.ld, A.d, 1, gpu_t(S, ZO_DTYPE_F32), G.ld, sP,
                             G.m, G.n, A.d, 1.0f, part ? 1.0f : 0.0f, nh);
                    s = gemm(g, &d);
                }
                if (s != ZO_OK) break;
                ZO_LAUNCH(attn_backward_elems_kernel, blocks, BS, 0, g->stream, Ph, Pl, S, lse, D, G, rows, 1);
                if ((s = cuda_launch_check("attn_backward_elems_kernel")) != ZO_OK) break;
                /* dQ = dS K (the high part overwrites: each query row is in one
                 * block), dK += dS^T Q */
                for (int part = 0; part < 2 && s == ZO_OK; part++) {
                    d = desc(part ? Pl : Ph, G.ld, sP, 0, k, A.ld, A.d, 0, dq, A.ld, sq, G.m, A.d, G.n, 1.0f,
                             part ? 1.0f : 0.0f, nh);
                    if ((s = gemm(g, &d)) != ZO_OK) break;
                    d = desc(part ? Pl : Ph, G.ld, sP, 1, q, A.ld, sq, 0, dk, lda, A.d, G.n, A.d, G.m, 1.0f, 1.0f,
                             nh);
                    s = gemm(g, &d);
                }
            }
    return s;
}

extern "C" zo_status cuda_launch_attention_gemm_backward(const cuda_gemm_env *g, const gpu_attn_desc *a,
                                                         gpu_tensor dqkv, gpu_tensor dout, gpu_tensor qkv,
                                                         gpu_tensor out, const float *lse)
{
    const attn_shape A = shape_of(a, g->cap);
    const int round_dout = dout.dtype != qkv.dtype, dkv_apart = dqkv.dtype != ZO_DTYPE_F32;
    const size_t nS = (size_t)A.ch.heads * A.ch.rows * A.ch.ld, nD = (size_t)A.b * A.hq * A.t;
    const size_t nO = (size_t)A.t * A.ldo, kvw = (size_t)2 * A.hkv * A.d;
    void *buf = NULL;
    zo_status s = scratch_alloc(g, cuda_attn_scratch_bytes(1, A.b, A.t, A.hq, A.hkv, A.d, A.window, g->cap,
                                                           round_dout, dkv_apart),
                                &buf);
    if (s != ZO_OK) return s;
    char *p = (char *)buf;
    float *S = (float *)p;
    p += cuda_attn_align(nS * sizeof(float));
    gpu_tensor Ph = gpu_t(p, qkv.dtype);
    p += cuda_attn_align(nS * 2);
    gpu_tensor Pl = gpu_t(p, qkv.dtype);
    p += cuda_attn_align(nS * 2);
    float *D = (float *)p;
    p += cuda_attn_align(nD * sizeof(float));
    gpu_tensor dOh = gpu_t(p, qkv.dtype), dOl = gpu_t(NULL, qkv.dtype);
    if (round_dout) {
        p += cuda_attn_align(nO * 2);
        dOl.data = p;
        p += cuda_attn_align(nO * 2);
    }
    gpu_tensor accbuf = gpu_t(p, ZO_DTYPE_F32);

    const unsigned dot_blocks = (unsigned)(((size_t)A.t * A.hq + RW - 1) / RW);
    for (int b = 0; b < A.b && s == ZO_OK; b++) {
        gpu_tensor dO = at(dout, (size_t)b * nO);
        if (round_dout) {
            ZO_LAUNCH(attn_split_kernel, grid_for(nO, BS), BS, 0, g->stream, dOh, dOl, dO, nO);
            if ((s = cuda_launch_check("attn_split_kernel")) != ZO_OK) break;
        }
        float *Db = D + (size_t)b * A.hq * A.t;
        ZO_LAUNCH(attn_rowdot_kernel, dot_blocks, RW * WARP, 0, g->stream, Db, dO, at(out, (size_t)b * nO), A.t,
                  A.hq, A.d);
        if ((s = cuda_launch_check("attn_rowdot_kernel")) != ZO_OK) break;
        /* dK and dV: in dqkv when it is fp32, else in the fp32 scratch */
        gpu_tensor acc = dkv_apart ? accbuf : at(dqkv, (size_t)b * A.t * A.ld + (size_t)A.hq * A.d);
        const int64_t lda = dkv_apart ? (int64_t)kvw : A.ld;
        ZO_LAUNCH(attn_copy_rows_kernel, grid_for((size_t)A.t * kvw, BS), BS, 0, g->stream, acc, (size_t)lda,
                  gpu_t(NULL, ZO_DTYPE_F32), (size_t)0, A.t, (int)kvw);
        if ((s = cuda_launch_check("attn_copy_rows_kernel")) != ZO_OK) break;
        s = backward_seq(g, A, b, dqkv, qkv, round_dout ? dOh : dO, dOl, lse, D, acc, lda, S, Ph, Pl);
        if (s != ZO_OK || !dkv_apart) continue;
        ZO_LAUNCH(attn_copy_rows_kernel, grid_for((size_t)A.t * kvw, BS), BS, 0, g->stream,
                  at(dqkv, (size_t)b * A.t * A.ld + (size_t)A.hq * A.d), (size_t)A.ld, acc, kvw, A.t, (int)kvw);
        s = cuda_launch_check("attn_copy_rows_kernel");
    }
    return scratch_free(g, buf, s);
}
