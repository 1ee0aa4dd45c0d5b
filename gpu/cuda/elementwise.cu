/* Elementwise kernels: the residual add, in-place scaling, casts. One thread
 * per chunk of VEC elements in a grid-stride loop, 16-byte vector accesses
 * where every tensor starts 16-byte aligned, scalar ones elsewhere and in
 * the last short chunk; each element is read and written by the same
 * thread, so y may alias a or b. */
#include "gpu/cuda/kernels.cuh" /* defines: tloadv, tstorev, tvec_ok, grid_for_vec */

#define BS 256

/* y[i] = a[i] + b[i]; y, a, b [n]. Moves n * (2 in + 1 out) elements
 * (8192 x 2048 bf16: 100.7 MB). */
__global__ void add_kernel(gpu_tensor y, gpu_tensor a, gpu_tensor b, size_t n)
{
    bool al = tvec_ok(y, 0) && tvec_ok(a, 0) && tvec_ok(b, 0);
    for (size_t i0 = vec_first(); i0 < n; i0 += vec_stride()) {
        int m = vec_len(n, i0);
        bool vec = al && m == VEC;
        float va[VEC], vb[VEC];
        tloadv(a, i0, va, m, vec);
        tloadv(b, i0, vb, m, vec);
ZO_UNROLL
        for (int k = 0; k < VEC; k++) va[k] += vb[k];
        tstorev(y, i0, va, m, vec);
    }
}

/* x[i] *= alpha; x [n]: 2n elements moved */
__global__ void scale_kernel(gpu_tensor x, float alpha, size_t n)
{
    bool al = tvec_ok(x, 0);
    for (size_t i0 = vec_first(); i0 < n; i0 += vec_stride()) {
        int m = vec_len(n, i0);
        bool vec = al && m == VEC;
        float v[VEC];
        tloadv(x, i0, v, m, vec);
ZO_UNROLL
        for (int k = 0; k < VEC; k++) v[k] *= alpha;
        tstorev(x, i0, v, m, vec);
    }
}

/* x[i] = cap tanh(x[i] / cap); x [n]: 2n elements moved */
__global__ void softcap_kernel(gpu_tensor x, float cap, size_t n)
{
    bool al = tvec_ok(x, 0);
    for (size_t i0 = vec_first(); i0 < n; i0 += vec_stride()) {
        int m = vec_len(n, i0);
        bool vec = al && m == VEC;
        float v[VEC];
        tloadv(x, i0, v, m, vec);
ZO_UNROLL
        for (int k = 0; k < VEC; k++) v[k] = cap * tanhf(v[k] / cap);
        tstorev(x, i0, v, m, vec);
    }
}

/* dst[i] = src[i] converted; dst, src [n]. Moves n elements of each type
 * (8192 x 2048 fp32 -> bf16: 100.7 MB). */
__global__ void cast_kernel(gpu_tensor dst, gpu_tensor src, size_t n)
{
    bool al = tvec_ok(dst, 0) && tvec_ok(src, 0);
    for (size_t i0 = vec_first(); i0 < n; i0 += vec_stride()) {
        int m = vec_len(n, i0);
        bool vec = al && m == VEC;
        float v[VEC];
        tloadv(src, i0, v, m, vec);
        tstorev(dst, i0, v, m, vec);
    }
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
