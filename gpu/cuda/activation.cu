/* Activations: GELU (tanh and erf forms), ReLU and SwiGLU, forward and backward, with the
 * formulas of the CPU reference (gpu/ops_cpu.c) in fp32. One thread per
 * chunk of VEC elements in a grid-stride loop, 16-byte vector accesses where
 * every tensor starts 16-byte aligned (kernels.cuh, vec_map). */
#include "gpu/cuda/kernels.cuh" /* defines: vec_map, vec_map_n, grid_for_vec */

#define BS 256
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_RSQRT2 0.7071067811865476f   /* 1 / sqrt(2) */
#define GELU_RSQRT2PI 0.3989422804014327f /* 1 / sqrt(2 pi) */

/* y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as the
 * CPU reference does through 1 + tanh(u) = 2 sigmoid(2u): y = x / (1 + exp(-2u)).
 * The tanh form loses all relative precision for x below about -3, where
 * 1 + tanh(u) cancels. form (gpu/device.h): 1 the erf form, 2 ReLU. */
__device__ __forceinline__ float gelu_fwd(float v, int form)
{
    if (form == 2) return v > 0.0f ? v : 0.0f; /* ReLU */
    if (form == 1) return v * 0.5f * erfcf(-v * GELU_RSQRT2); /* x Phi(x), Phi = erfc(-x / sqrt 2) / 2 */
    float u = GELU_K * (v + 0.044715f * v * v * v);
    return v / (1.0f + expf(-2.0f * u));
}

/* dy * gelu'(x) = dy * (s + 2 x s (1 - s) du/dx), s = sigmoid(2u), as the
 * CPU reference (no cancellation); the erf form Phi(x) + x phi(x); ReLU dy
 * where x > 0 */
__device__ __forceinline__ float gelu_bwd(float v, float gy, int form)
{
    if (form == 2) return v > 0.0f ? gy : 0.0f;
    if (form == 1) return gy * (0.5f * erfcf(-v * GELU_RSQRT2) + v * GELU_RSQRT2PI * expf(-0.5f * v * v));
    float u = GELU_K * (v + 0.044715f * v * v * v);
    float du = GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
    float sg = 1.0f / (1.0f + expf(-2.0f * u));
    return gy * (sg + 2.0f * v * sg * (1.0f - sg) * du);
}

/* y = gelu(x); y, x [n]: 2n elements moved */
__global__ void gelu_forward_kernel(gpu_tensor y, gpu_tensor x, size_t n, int form)
{
    vec_map(y, x, n, [=](float v) { return gelu_fwd(v, form); });
}

/* dx = dy * gelu'(x); dx, dy, x [n]: 3n elements moved */
__global__ void gelu_backward_kernel(gpu_tensor dx, gpu_tensor dy, gpu_tensor x, size_t n, int form)
{
    vec_map(dx, x, dy, n, [=](float v, float gy) { return gelu_bwd(v, gy, form); });
}

/* y = silu(gate) * up, or with gelu (GeGLU, Gemma) gelu_tanh(gate) * up;
 * y, gate, up [n]: 3n elements moved (8192 x 5504 bf16: 270.5 MB) */
__global__ void swiglu_forward_kernel(gpu_tensor y, gpu_tensor gate, gpu_tensor up, size_t n, int gelu,
                                      float lim, float al)
{
    vec_map(y, gate, up, n, [=](float g, float u) {
        if (gelu == GPU_GLU_CLAMPED) { /* gpt-oss's: (clamp(u) + 1) g sigmoid(al g), g = min(g, lim) */
            g = fminf(g, lim);
            return (fmaxf(-lim, fminf(u, lim)) + 1.0f) * g / (1.0f + expf(-al * g));
        }
        float e = gelu ? -2.0f * GELU_K * (g + 0.044715f * g * g * g) : -g;
        return g / (1.0f + expf(e)) * u;
    });
}

/* dup = dy * silu(gate); dgate = dy * up * silu'(gate); all [n]. With gelu
 * the same for gelu_tanh: gelu'(g) = s + 2 g s (1 - s) du/dg, s = sigmoid(2u).
 * 5n elements moved (8192 x 5504 bf16: 450.9 MB). */
__global__ void swiglu_backward_kernel(gpu_tensor dgate, gpu_tensor dup, gpu_tensor dy,
                                       gpu_tensor gate, gpu_tensor up, size_t n, int gelu, float lim, float al)
{
    /* o[0] dup, o[1] dgate, stored in that order; vec_map_n loads every
     * input of a chunk before it stores either output: dgate or dup may
     * alias gate, up or dy (an in-place backward) */
    const gpu_tensor ys[2] = {dup, dgate}, xs[3] = {gate, up, dy};
    vec_map_n(ys, xs, n, [=](float (&o)[2], const float (&v)[3]) {
        float g = v[0], u = v[1], gy = v[2];
        if (gelu == GPU_GLU_CLAMPED) { /* no gradient past the limits */
            const float gc = fminf(g, lim), uc = fmaxf(-lim, fminf(u, lim));
            const float sg = 1.0f / (1.0f + expf(-al * gc));
            o[0] = u < -lim || u > lim ? 0.0f : gy * gc * sg;
            o[1] = g > lim ? 0.0f : gy * (uc + 1.0f) * sg * (1.0f + al * gc * (1.0f - sg));
        } else if (gelu) {
            float a = GELU_K * (g + 0.044715f * g * g * g);
            float da = GELU_K * (1.0f + 3.0f * 0.044715f * g * g);
            float sg = 1.0f / (1.0f + expf(-2.0f * a));
            o[0] = gy * g * sg;
            o[1] = gy * u * (sg + 2.0f * g * sg * (1.0f - sg) * da);
        } else {
            float sg = 1.0f / (1.0f + expf(-g));
            o[0] = gy * g * sg;
            o[1] = gy * u * sg * (1.0f + g * (1.0f - sg));
        }
    });
}

extern "C" zo_status cuda_launch_gelu_forward(cudaStream_t st, gpu_tensor y, gpu_tensor x,
                                              size_t n, int form)
{
    ZO_LAUNCH(gelu_forward_kernel, grid_for_vec(n, BS), BS, 0, st, y, x, n, form);
    return cuda_launch_check("gelu_forward_kernel");
}

extern "C" zo_status cuda_launch_gelu_backward(cudaStream_t st, gpu_tensor dx, gpu_tensor dy,
                                               gpu_tensor x, size_t n, int form)
{
    ZO_LAUNCH(gelu_backward_kernel, grid_for_vec(n, BS), BS, 0, st, dx, dy, x, n, form);
    return cuda_launch_check("gelu_backward_kernel");
}

extern "C" zo_status cuda_launch_swiglu_forward(cudaStream_t st, gpu_tensor y, gpu_tensor gate,
                                                gpu_tensor up, size_t n, int gelu, float limit, float alpha)
{
    ZO_LAUNCH(swiglu_forward_kernel, grid_for_vec(n, BS), BS, 0, st, y, gate, up, n, gelu, limit, alpha);
    return cuda_launch_check("swiglu_forward_kernel");
}

extern "C" zo_status cuda_launch_swiglu_backward(cudaStream_t st, gpu_tensor dgate,
                                                 gpu_tensor dup, gpu_tensor dy, gpu_tensor gate,
                                                 gpu_tensor up, size_t n, int gelu, float limit, float alpha)
{
    ZO_LAUNCH(swiglu_backward_kernel, grid_for_vec(n, BS), BS, 0, st, dgate, dup, dy, gate, up, n, gelu, limit,
              alpha);
    return cuda_launch_check("swiglu_backward_kernel");
}
