/* Elementwise kernels: the residual add, in-place scaling, casts. One thread
 * per element in a grid-stride loop; each element is read and written by the
 * same thread, so y may alias a or b. */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, grid_for */

#define BS 256

/* y[i] = a[i] + b[i]; y, a, b [n] */
__global__ void add_kernel(gpu_tensor y, gpu_tensor a, gpu_tensor b, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        tstore(y, i, tload(a, i) + tload(b, i));
}

/* x[i] *= alpha; x [n] */
__global__ void scale_kernel(gpu_tensor x, float alpha, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        tstore(x, i, tload(x, i) * alpha);
}

/* x[i] = cap tanh(x[i] / cap); x [n] */
__global__ void softcap_kernel(gpu_tensor x, float cap, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        tstore(x, i, cap * tanhf(tload(x, i) / cap));
}

/* dst[i] = src[i] converted; dst, src [n] */
__global__ void cast_kernel(gpu_tensor dst, gpu_tensor src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        tstore(dst, i, tload(src, i));
}

extern "C" zo_status cuda_launch_add(cudaStream_t st, gpu_tensor y, gpu_tensor a, gpu_tensor b,
                                     size_t n)
{
    ZO_LAUNCH(add_kernel, grid_for(n, BS), BS, 0, st, y, a, b, n);
    return cuda_launch_check("add_kernel");
}

extern "C" zo_status cuda_launch_scale(cudaStream_t st, gpu_tensor x, float alpha, size_t n)
{
    ZO_LAUNCH(scale_kernel, grid_for(n, BS), BS, 0, st, x, alpha, n);
    return cuda_launch_check("scale_kernel");
}

extern "C" zo_status cuda_launch_softcap(cudaStream_t st, gpu_tensor x, float cap, size_t n)
{
    ZO_LAUNCH(softcap_kernel, grid_for(n, BS), BS, 0, st, x, cap, n);
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
    ZO_LAUNCH(cast_kernel, grid_for(n, BS), BS, 0, st, dst, src, n);
    return cuda_launch_check("cast_kernel");
}
