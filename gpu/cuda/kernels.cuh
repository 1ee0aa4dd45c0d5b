/* Device helpers shared by the kernel families: element access in any
 * storage type (fp32 arithmetic, round-to-nearest-even stores, as the CPU
 * backend's zo_load_f32/zo_store_f32) one element or a 16-byte vector of
 * them at a time, the loop of an element-wise kernel over such vectors
 * (vec_map), warp and block reductions in a fixed
 * order, the grid size of a grid-stride loop, and the two macros through
 * which a kernel source launches and declares dynamic shared memory, so
 * that it compiles unchanged for nvcc and for the host shim (ZO_CUDA_SHIM,
 * gpu/cuda/shim/: docs/gpu-cuda.md, "The host shim"). */
#ifndef ZO_GPU_CUDA_KERNELS_CUH
#define ZO_GPU_CUDA_KERNELS_CUH

#ifdef ZO_CUDA_SHIM
#include "gpu/cuda/shim/cuda_shim.h" /* defines: the CUDA vocabulary on the host */
#else
#include <cuda_bf16.h> /* defines: __nv_bfloat16, __bfloat162float, __float2bfloat16_rn */
#include <cuda_fp16.h> /* defines: __half, __half2float, __float2half_rn */
#endif

#include "gpu/cuda/cuda_impl.h" /* defines: gpu_tensor, launcher prototypes */

#define WARP 32
#define FULL_MASK 0xffffffffu

/* ZO_LAUNCH(kernel, grid, block, smem, stream, args...) is
 * kernel<<<grid, block, smem, stream>>>(args...) for nvcc, and under the
 * shim a host launch that runs the kernel before it returns (at least one
 * argument). ZO_EXTERN_SHARED(type, name) declares the kernel's dynamic
 * shared memory, `extern __shared__ type name[]`; under the shim a pointer
 * to the launch's smem bytes. */
#ifdef ZO_CUDA_SHIM
#define ZO_LAUNCH(kernel, grid, block, smem, stream, ...)                                   \
    zo_shim_launch(#kernel, kernel, grid, block, smem, stream, __VA_ARGS__)
#define ZO_EXTERN_SHARED(type, name) type *const name = static_cast<type *>(zo_shim_dynamic_smem())
#else
#define ZO_LAUNCH(kernel, grid, block, smem, stream, ...)                                   \
    kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
#define ZO_EXTERN_SHARED(type, name) extern __shared__ type name[]
#endif

/* Element i of t as fp32 (zo_dtype: 0 fp32, 1 fp16, 2 bf16). */
__device__ __forceinline__ float tload(gpu_tensor t, size_t i)
{
    switch (t.dtype) {
    case ZO_DTYPE_F16: return __half2float(((const __half *)t.data)[i]);
    case ZO_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)t.data)[i]);
    default: return ((const float *)t.data)[i];
    }
}

/* Store v to element i of t, rounded to nearest even in 16-bit types. */
__device__ __forceinline__ void tstore(gpu_tensor t, size_t i, float v)
{
    switch (t.dtype) {
    case ZO_DTYPE_F16: ((__half *)t.data)[i] = __float2half_rn(v); break;
    case ZO_DTYPE_BF16: ((__nv_bfloat16 *)t.data)[i] = __float2bfloat16_rn(v); break;
    default: ((float *)t.data)[i] = v; break;
    }
}

/* Vector access: VEC elements (16 bytes of a 16-bit type, 32 of fp32) moved
 * by one or two 16-byte loads or stores. A kernel takes the vector path for
 * a chunk only where every tensor it touches there starts 16-byte aligned
 * (tvec_ok) and the chunk is whole; elsewhere the same helpers fall back to
 * m scalar accesses, so one loop serves both paths and computes the same
 * values in the same order. */
#define VEC 8

/* Unroll the loop that follows (nvcc; the shim's g++ needs no hint). */
#ifdef ZO_CUDA_SHIM
#define ZO_UNROLL
#else
#define ZO_UNROLL _Pragma("unroll")
#endif

#ifdef ZO_CUDA_SHIM
struct alignas(16) zo_vec16 {
    unsigned w[4];
};
#else
typedef uint4 zo_vec16;
#endif

/* Whether element i of t starts a 16-byte aligned address. */
__device__ __forceinline__ bool tvec_ok(gpu_tensor t, size_t i)
{
    size_t es = t.dtype == ZO_DTYPE_F32 ? 4 : 2;
    return ((size_t)t.data + i * es) % 16 == 0;
}

/* One 16-byte move between memory at p (16-byte aligned) and a local
 * array at q (declared alignas(16)): load p to q, store q to p. Under the
 * shim a misaligned p is a fault, as on a GPU, and the bytes move by memcpy
 * (the locals keep their own types). */
__device__ __forceinline__ void vec16_load(void *q, const void *p)
{
#ifdef ZO_CUDA_SHIM
    if ((size_t)p % 16) zo_shim_vec_fault(p);
    memcpy(q, p, 16);
#else
    *(zo_vec16 *)q = *(const zo_vec16 *)p;
#endif
}

__device__ __forceinline__ void vec16_store(void *p, const void *q)
{
#ifdef ZO_CUDA_SHIM
    if ((size_t)p % 16) zo_shim_vec_fault(p);
    memcpy(p, q, 16);
#else
    *(zo_vec16 *)p = *(const zo_vec16 *)q;
#endif
}

/* v[0..m) = t[i..i+m), m <= VEC (v[m..VEC) = 0): vector loads when vec
 * (m == VEC, the chunk aligned: the caller's test), else m scalar loads. */
__device__ __forceinline__ void tloadv(gpu_tensor t, size_t i, float *v, int m, bool vec)
{
    if (vec) {
        if (t.dtype == ZO_DTYPE_F32) {
            alignas(16) float f[VEC];
            vec16_load(f, (const float *)t.data + i);
            vec16_load(f + 4, (const float *)t.data + i + 4);
            ZO_UNROLL
            for (int k = 0; k < VEC; k++) v[k] = f[k];
        } else if (t.dtype == ZO_DTYPE_BF16) {
            alignas(16) __nv_bfloat16 h[VEC];
            vec16_load(h, (const __nv_bfloat16 *)t.data + i);
            ZO_UNROLL
            for (int k = 0; k < VEC; k++) v[k] = __bfloat162float(h[k]);
        } else {
            alignas(16) __half h[VEC];
            vec16_load(h, (const __half *)t.data + i);
            ZO_UNROLL
            for (int k = 0; k < VEC; k++) v[k] = __half2float(h[k]);
        }
        return;
    }
    ZO_UNROLL
    for (int k = 0; k < VEC; k++) v[k] = k < m ? tload(t, i + k) : 0.0f;
}

/* t[i..i+m) = v[0..m), rounded as tstore; vector stores when vec. */
__device__ __forceinline__ void tstorev(gpu_tensor t, size_t i, const float *v, int m, bool vec)
{
    if (vec) {
        if (t.dtype == ZO_DTYPE_F32) {
            alignas(16) float f[VEC];
            ZO_UNROLL
            for (int k = 0; k < VEC; k++) f[k] = v[k];
            vec16_store((float *)t.data + i, f);
            vec16_store((float *)t.data + i + 4, f + 4);
        } else if (t.dtype == ZO_DTYPE_BF16) {
            alignas(16) __nv_bfloat16 h[VEC];
            ZO_UNROLL
            for (int k = 0; k < VEC; k++) h[k] = __float2bfloat16_rn(v[k]);
            vec16_store((__nv_bfloat16 *)t.data + i, h);
        } else {
            alignas(16) __half h[VEC];
            ZO_UNROLL
            for (int k = 0; k < VEC; k++) h[k] = __float2half_rn(v[k]);
            vec16_store((__half *)t.data + i, h);
        }
        return;
    }
    ZO_UNROLL
    for (int k = 0; k < VEC; k++)
        if (k < m) tstore(t, i + k, v[k]);
}

/* A grid-stride loop over chunks of VEC elements: this thread's first
 * chunk's first element, the step to its next, a chunk's length (the last
 * one short) of n elements. */
__device__ __forceinline__ size_t vec_first(void) { return ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC; }
__device__ __forceinline__ size_t vec_stride(void) { return (size_t)gridDim.x * blockDim.x * VEC; }
__device__ __forceinline__ int vec_len(size_t n, size_t i0) { return n - i0 < VEC ? (int)(n - i0) : VEC; }

/* Blocks for a grid-stride loop over the chunks of VEC of n elements (the
 * last one short), threads per block `bs`, capped as grid_for. */
static inline unsigned grid_for_vec(size_t n, unsigned bs)
{
    size_t chunks = (n + VEC - 1) / VEC, g = (chunks + bs - 1) / bs;
    if (g > 65535u * 8u) g = 65535u * 8u;
    return g ? (unsigned)g : 1u;
}

/* The loop of an element-wise kernel over n elements of NO outputs and NI
 * inputs, all [n]: each thread takes its chunks of VEC (vec_first), loads
 * every input's chunk in the order of x, applies f(o, v) to each element
 * (v[t] element k of x[t], o[t] element k of y[t]) and stores the outputs
 * in the order of y, vector accesses where every tensor starts 16-byte
 * aligned and the chunk is whole. A chunk's inputs are all loaded before
 * any output is stored, so an output may alias an input. */
template <int NO, int NI, typename F>
__device__ __forceinline__ void vec_map_n(const gpu_tensor (&y)[NO], const gpu_tensor (&x)[NI], size_t n, F f)
{
    bool al = true;
    ZO_UNROLL
    for (int t = 0; t < NO; t++) al = al && tvec_ok(y[t], 0);
    ZO_UNROLL
    for (int t = 0; t < NI; t++) al = al && tvec_ok(x[t], 0);
    for (size_t i0 = vec_first(); i0 < n; i0 += vec_stride()) {
        int m = vec_len(n, i0);
        bool vec = al && m == VEC;
        float v[NI][VEC], o[NO][VEC];
        ZO_UNROLL
        for (int t = 0; t < NI; t++) tloadv(x[t], i0, v[t], m, vec);
        ZO_UNROLL
        for (int k = 0; k < VEC; k++) {
            float vk[NI], ok[NO];
            ZO_UNROLL
            for (int t = 0; t < NI; t++) vk[t] = v[t][k];
            f(ok, vk);
            ZO_UNROLL
            for (int t = 0; t < NO; t++) o[t][k] = ok[t];
        }
        ZO_UNROLL
        for (int t = 0; t < NO; t++) tstorev(y[t], i0, o[t], m, vec);
    }
}

/* y[i] = f(a[i]) or f(a[i], b[i]): vec_map_n with one output; a is loaded
 * before b. */
template <typename F>
__device__ __forceinline__ void vec_map(gpu_tensor y, gpu_tensor a, size_t n, F f)
{
    const gpu_tensor ys[1] = {y}, xs[1] = {a};
    vec_map_n(ys, xs, n, [&](float (&o)[1], const float (&v)[1]) { o[0] = f(v[0]); });
}

template <typename F>
__device__ __forceinline__ void vec_map(gpu_tensor y, gpu_tensor a, gpu_tensor b, size_t n, F f)
{
    const gpu_tensor ys[1] = {y}, xs[2] = {a, b};
    vec_map_n(ys, xs, n, [&](float (&o)[1], const float (&v)[2]) { o[0] = f(v[0], v[1]); });
}

/* Butterfly sums and maxima over a full warp: every lane gets the result,
 * and the combination order is the same on every run. */
__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v)
{
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

/* Block-wide maximum / double sum (blockDim.x a multiple of 32, at most
 * 1024); every thread gets the result. Ends with a barrier, so a caller may
 * reduce again, and every thread's reads before the call are done when any
 * thread returns from it. */
__device__ __forceinline__ float block_max(float v)
{
    __shared__ float part[32];
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = warp_max(v);
    if (lane == 0) part[w] = v;
    __syncthreads();
    float r = warp_max(lane < nw ? part[lane] : -INFINITY);
    __syncthreads();
    return r;
}

__device__ __forceinline__ double block_sum_d(double v)
{
    __shared__ double part[32];
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = warp_sum_d(v);
    if (lane == 0) part[w] = v;
    __syncthreads();
    double r = warp_sum_d(lane < nw ? part[lane] : 0.0);
    __syncthreads();
    return r;
}

/* Record a bad id in the stream's error record; the first recorder wins. */
__device__ __forceinline__ void record_bad_id(cuda_err_rec *e, int code, int index, int value,
                                              int limit)
{
    if (atomicCAS(&e->code, 0, code) == 0) {
        e->index = index;
        e->value = value;
        e->limit = limit;
    }
}

/* Blocks for a grid-stride loop over n items, threads per block `bs`. */
static inline unsigned grid_for(size_t n, unsigned bs)
{
    size_t g = (n + bs - 1) / bs;
    if (g > 65535u * 8u) g = 65535u * 8u;
    return g ? (unsigned)g : 1u;
}

#endif
