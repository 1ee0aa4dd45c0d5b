/* Elementwise kernels: the residual add, in-place scaling, casts, heads
 * moved between row layouts (head_copy, its own loop below). One thread
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

/* gpu_head_copy: y's head h of row r, elements [0, w) from x's (hsx 0: x's
 * one head), [w, fill) zero; with hsy 0 the heads' sum, in head order, into
 * y's one head. One thread per element of y written (row, head, j) (hsy 0:
 * per (row, j)), in a grid-stride loop. */
__global__ void head_copy_kernel(gpu_tensor y, gpu_tensor x, int n, int heads, int w, int fill, int64_t ldy,
                                 int64_t hsy, int64_t ldx, int64_t hsx)
{
    const int hs = hsy ? heads : 1; /* heads of y written */
    size_t total = (size_t)n * hs * fill;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t j = e % fill, rh = e / fill, h = rh % hs, r = rh / hs;
        size_t xo = r * (size_t)ldx + j, yo = r * (size_t)ldy + h * (size_t)hsy + j;
        float v = 0.0f;
        if (!hsy)
            for (int g = 0; g < heads; g++) v += tload(x, xo + (size_t)g * hsx);
        else if (j < (size_t)w)
            v = tload(x, xo + h * (size_t)hsx);
        tstore(y, yo, v);
    }
}

extern "C" zo_status cuda_launch_head_copy(cudaStream_t st, gpu_tensor y, gpu_tensor x, int n, int heads, int w,
                                           int fill, int64_t ldy, int64_t hsy, int64_t ldx, int64_t hsx)
{
    size_t total = (size_t)n * (hsy ? heads : 1) * fill;
    ZO_LAUNCH(head_copy_kernel, grid_for(total, BS), BS, 0, st, y, x, n, heads, w, fill, ldy, hsy, ldx, hsx);
    return cuda_launch_check("head_copy_kernel");
}
