/* Elementwise kernels: the residual add, in-place scaling, casts. One thread
 * per chunk of VEC elements in a grid-stride loop (kernels.cuh, vec_map),
 * 16-byte vector accesses where every tensor starts 16-byte aligned, scalar
 * ones elsewhere and in the last short chunk; each element is read and
 * written by the same thread, so y may alias a or b. */
#include "gpu/cuda/kernels.cuh" /* defines: vec_map, grid_for_vec */

#define BS 256

/* y[i] = a[i] + b[i]; y, a, b [n]. Moves n * (2 in + 1 out) elements
 * (8192 x 2048 bf16: 100.7 MB). */
__global__ void add_kernel(gpu_tensor y, gpu_tensor a, gpu_tensor b, size_t n)
{
    vec_map(y, a, b, n, [](float va, float vb) { return va + vb; });
}

/* x[i] *= alpha; x [n]: 2n elements moved */
__global__ void scale_kernel(gpu_tensor x, float alpha, size_t n)
{
    vec_map(x, x, n, [=](float v) { return v * alpha; });
}

/* x[i] = cap tanh(x[i] / cap); x [n]: 2n elements moved */
__global__ void softcap_kernel(gpu_tensor x, float cap, size_t n)
{
    vec_map(x, x, n, [=](float v) { return cap * tanhf(v / cap); });
}

/* dst[i] = src[i] converted; dst, src [n]. Moves n elements of each type
 * (8192 x 2048 fp32 -> bf16: 100.7 MB). */
__global__ void cast_kernel(gpu_tensor dst, gpu_tensor src, size_t n)
{
    vec_map(dst, src, n, [](float v) { return v; });
}

extern "C" zo_status cuda_launch_add(cudaStream_t st, gpu_tensor y, gpu_tensor a, gpu_tensor b,
                                     size_t n)
{
    ZO_LAUNCH(add_kernel, grid_for_vec(n, BS), BS, 0, st, y, a, b, n);
    return cuda_launch_check("add_kernel");
}

extern "C" zo_status cuda_launch_scale(cudaStream_t st, gpu_tensor x, float alpha, size_t n)
{
    ZO_LAUNCH(scale_kernel, grid_for_vec(n, BS), BS, 0, st, x, alpha, n);
    return cuda_launch_check("scale_kernel");
}

extern "C" zo_status cuda_launch_softcap(cudaStream_t st, gpu_tensor x, float cap, size_t n)
{
    ZO_LAUNCH(softcap_kernel, grid_for_vec(n, BS), BS, 0, st, x, cap, n);
    return cuda_launch_check("softcap_kernel");
}

extern "C" zo_status cuda_launch_cast(cudaStream_t st, gpu_tensor dst, gpu_tensor src, size_t n)
{
    /* Same type: a byte copy, as the CPU backend's memmove, so every bit
     * (nan payloads and signs too) survives; the kernel's fp32 round trip
     * would turn a 16-bit nan into the canonical one. */
    if (dst.dtype == src.dtype) {
        if (dst.data == src.data) return ZO_OK;
        return cuda_status(cudaMemcpyAsync(dst.data, src.data, n * zo_dtype_size(dst.dtype),
                                           cudaMemcpyDeviceToDevice, st),
                           "cudaMemcpyAsync (gpu_cast, same type)");
    }
    ZO_LAUNCH(cast_kernel, grid_for_vec(n, BS), BS, 0, st, dst, src, n);
    return cuda_launch_check("cast_kernel");
}
