/* What the fused attention kernels (attention_tc.cu on wmma, attention_mma.cu
 * on mma.sync) share on the host and around their kernels: the shape as the
 * kernels take it, the opt-in past 48 KiB of dynamic shared memory, the
 * checks a launch makes, and the backward's first pass (D = rowsum(dO * O)
 * in fp32 scratch from the pool) around the kernels of each. Included by
 * each of those .cu files (and through them by the host shim's). */
#ifndef ZO_GPU_CUDA_ATTENTION_FUSED_CUH
#define ZO_GPU_CUDA_ATTENTION_FUSED_CUH

#include "common/attn_path.h"   /* defines: zo_attn_window_masks */
#include "gpu/cuda/kernels.cuh" /* defines: tload, warp_sum, ZO_LAUNCH, WARP, cuda_launch_check, cuda_status */

/* What the kernels need of the shape, and the score's form as attention.cu
 * computes it: scaled, then with a cap soft-capped, cap tanh(s / cap); with
 * a window query i sees keys i - window < j <= i. */
struct attn_fused_geom {
    int t, hq, hkv, grp;
    int window; /* > 0 only where it masks something (zo_attn_window_masks) */
    size_t ld;  /* qkv's row stride, (hq + 2 hkv) d */
    size_t ldo; /* out's, hq d */
    float scale;
    float cap; /* > 0: soft-capped */
    float alibi;    /* > 0: ALiBi's bias times this, added after the cap (gpu_alibi_at) */
    int alibi_bf16; /* ... in Falcon's bf16 form */
    /* query head h's ALiBi (no bias without) */
    __device__ __forceinline__ gpu_alibi_head step(int h) const { return gpu_alibi_of(alibi, alibi_bf16, hq, h); }
    /* the score of a dot product: scaled, then capped */
    __device__ __forceinline__ float score(float dot) const
    {
        return cap > 0.0f ? cap * tanhf(dot * scale / cap) : dot * scale;
    }
    /* the backward's score and in *dcap the cap's derivative there (1 -
     * tanh^2, 1 without a cap) from one tanh: dS = P (dP - D) scale dcap */
    __device__ __forceinline__ float score_d(float dot, float *dcap) const
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
    __device__ __forceinline__ int first_key(int i) const { return window > 0 && i >= window ? i - window + 1 : 0; }
    /* whether query i sees key j */
    __device__ __forceinline__ bool sees(int i, int j) const { return j <= i && (window <= 0 || i - j < window); }
    /* one past the last query that sees key j (t without a window) */
    __device__ __forceinline__ int query_end(int j) const { return window > 0 ? min(t, j + window) : t; }
};

static attn_fused_geom attn_fused_make_geom(const gpu_attn_desc *a)
{
    attn_fused_geom G;
    G.t = a->t;
    G.hq = a->hq;
    G.hkv = a->hkv;
    G.grp = a->hq / a->hkv;
    G.ld = (size_t)(a->hq + 2 * a->hkv) * a->d;
    G.ldo = (size_t)a->hq * a->d;
    G.scale = gpu_attn_scale(a);
    G.window = zo_attn_window_masks(a->window, a->t) ? a->window : 0;
    G.cap = a->softcap > 0.0f ? a->softcap : 0.0f;
    G.alibi = a->alibi > 0.0f ? a->alibi : 0.0f;
    G.alibi_bf16 = a->alibi_bf16;
    return G;
}

/* Past 48 KiB of dynamic shared memory a kernel must opt in. */
template <typename K>
static zo_status attn_fused_allow_smem(K *kernel, size_t bytes, const char *name)
{
    if (bytes <= 48u * 1024u) return ZO_OK;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e == cudaSuccess) return ZO_OK;
    (void)cudaGetLastError(); /* left behind, it would fail the next launch check */
    return zo_error(ZO_ERR_DEVICE, "cudaFuncSetAttribute(%s, %zu bytes of shared memory): %s", name, bytes,
                    cudaGetErrorString(e));
}

/* A launch's checks: qkv 16-byte aligned, the case one the kernels cover
 * (`covered`), the grid within 65535 blocks of `rows` query rows. `path`
 * names the kernels in the message ("tensor cores", "mma.sync"). */
static zo_status attn_fused_check(const char *op, const char *path, const gpu_attn_desc *a, gpu_tensor qkv,
                                  bool covered, int rows)
{
    if ((uintptr_t)qkv.data % 16 != 0)
        return zo_error(ZO_ERR_UNSUPPORTED, "%s (cuda, %s): qkv not 16-byte aligned", op, path);
    if (!covered)
        return zo_error(ZO_ERR_UNSUPPORTED, "%s (cuda, %s): d %d, %s qkv, window %d, softcap %g, alibi %g", op, path,
                        a->d, zo_dtype_name(qkv.dtype), a->window, (double)a->softcap, (double)a->alibi);
    if (a->b > 65535 || (a->t + rows - 1) / rows > 65535)
        return zo_error(ZO_ERR_UNSUPPORTED, "%s (cuda, %s): batch %d or %d-row blocks %d > 65535", op, path, a->b,
                        rows, (a->t + rows - 1) / rows);
    return ZO_OK;
}

/* D [b, hq, t] = rowsum(dO * O), one warp per row, lanes over d in a fixed order. */
static __global__ void attention_fused_dot_kernel(float *Drow, gpu_tensor dout, gpu_tensor out, attn_fused_geom G,
                                                  int d, size_t rows)
{
    const int lane = threadIdx.x % WARP;
    const size_t r = (size_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= rows) return; /* uniform over the warp */
    const int i = (int)(r % G.t), h = (int)(r / G.t % G.hq);
    const size_t b = r / G.t / G.hq;
    const size_t o = (b * G.t + i) * G.ldo + (size_t)h * d;
    float acc = 0.0f;
    for (int c = lane; c < d; c += WARP) acc += tload(dout, o + c) * tload(out, o + c);
    acc = warp_sum(acc);
    if (lane == 0) Drow[r] = acc;
}

/* The backward around the kernels of a path: D into fp32 scratch [b, hq, t]
 * from the pool (stream-ordered), then kernels(D), then the scratch freed. */
template <typename F>
static zo_status attn_fused_backward(cudaStream_t st, cudaMemPool_t pool, const gpu_attn_desc *a, gpu_tensor dout,
                                     gpu_tensor out, F kernels)
{
    const size_t rows = (size_t)a->b * a->hq * a->t;
    void *Drow = NULL;
    zo_status s = cuda_status(cudaMallocFromPoolAsync(&Drow, rows * sizeof(float), pool, st),
                              "cudaMallocFromPoolAsync (attention scratch)");
    if (s != ZO_OK) return s;
    ZO_LAUNCH(attention_fused_dot_kernel, (unsigned)((rows + 7) / 8), 8 * WARP, 0, st, (float *)Drow, dout, out,
              attn_fused_make_geom(a), a->d, rows);
    s = cuda_launch_check("attention_fused_dot_kernel");
    if (s == ZO_OK) s = kernels((const float *)Drow);
    zo_status f = cuda_status(cudaFreeAsync(Drow, st), "cudaFreeAsync (attention scratch)");
    return s != ZO_OK ? s : f;
}

#endif
