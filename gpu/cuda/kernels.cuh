/* Device helpers shared by the kernel families: element access in any
 * storage type (fp32 arithmetic, round-to-nearest-even stores, as the CPU
 * backend's zo_load_f32/zo_store_f32), warp and block reductions in a fixed
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
