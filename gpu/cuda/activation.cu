/* Activations: GELU (tanh and erf forms), ReLU and SwiGLU, forward and backward, with the
 * formulas of the CPU reference (gpu/ops_cpu.c) in fp32. One thread per
 * chunk of VEC elements in a grid-stride loop, 16-byte vector accesses where
 * every tensor starts 16-byte aligned (kernels.cuh, tloadv). */
#include "gpu/cuda/kernels.cuh" /* defines: tloadv, tstorev, tvec_ok, grid_for_vec */

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
    bool al = tvec_ok(y, 0) && tvec_ok(x, 0);
    for (size_t i0 = vec_first(); i0 < n; i0 += vec_stride()) {
        int m = vec_len(n, i0);
        bool vec = al && m == VEC;
        float v[VEC];
        tloadv(x, i0, v, m, vec);
ZO_UNROLL
        for (int k = 0; k < VEC; k++) v[k] = gelu_fwd(v[k], form);
        tstorev(y, i0, v, m, vec);
    }
}

/* dx = dy * gelu'(x); dx, dy, x [n]: 3n elements moved */
__global__ void gelu_backward_kernel(gpu_tensor dx, gpu_tensor dy, gpu_tensor x, size_t n, int form)
{
    bool al = tvec_ok(dx, 0) && tvec_ok(dy, 0) && tvec_ok(x, 0);
    for (size_t i0 = vec_first(); i0 < n; i0 += vec_stride()) {
        int m = vec_len(n, i0);
        bool vec = al && m == VEC;
        float v[VEC], g[VEC];
        tloadv(x, i0, v, m, vec);
        tloadv(dy, i0, g, m, vec);
ZO_UNROLL
        for (int k = 0; k < VEC; k++) v[k] = gelu_bwd(v[k], g[k], form);
        tstorev(dx, i0, v, m, vec);
    }
}

/* y = silu(gate) * up, or with gelu (GeGLU, Gemma) gelu_tanh(gate) * up;
 * y, gate, up [n]: 3n elements moved (8192 x 5504 bf16: 270.5 MB) */
__global__ void swiglu_forward_kernel(gpu_tensor y, gpu_tensor gate, gpu_tensor up, size_t n, int gelu)
{
    bool al = tvec_ok(y, 0) && tvec_ok(gate, 0) && tvec_ok(up, 0);
    for (size_t i0 = vec_first(); i0 < n; i0 += vec_stride()) {
        int m = vec_len(n, i0);
        bool vec = al && m == VEC;
        float g[VEC], u[VEC];
        tloadv(gate, i0, g, m, vec);
        tloadv(up, i0, u, m, vec);
ZO_UNROLL
        for (int k = 0; k < VEC; k++) {
            float e = gelu ? -2.0f * GELU_K * (g[k] + 0.044715f * g[k] * g[k] * g[k]) : -g[k];
            g[k] = g[k] / (1.0f + expf(e)) * u[k];
        }
        tstorev(y, i0, g, m, vec);
    }
}

/* dup = dy * silu(gate); dgate = dy * up * silu'(gate); all [n]. With gelu
 * the same for gelu_tanh: gelu'(g) = s + 2 g s (1 - s) du/dg, s = sigmoid(2u).
 * 5n elements moved (8192 x 5504 bf16: 450.9 MB). */
__global__ void swiglu_backward_kernel(gpu_tensor dgate, gpu_tensor dup, gpu_tensor dy,
                                       gpu_tensor gate, gpu_tensor up, size_t n, int gelu)
{
    bool al = tvec_ok(dgate, 0) && tvec_ok(dup, 0) && tvec_ok(dy, 0) && tvec_ok(gate, 0) && tvec_ok(up, 0);
    for (size_t i0 = vec_first(); i0 < n; i0 += vec_stride()) {
        int m = vec_len(n, i0);
        bool vec = al && m == VEC;
        float g[VEC], u[VEC], gy[VEC];
        tloadv(gate, i0, g, m, vec);
        tloadv(up, i0, u, m, vec);
        tloadv(dy, i0, gy, m, vec);
ZO_UNROLL
        for (int k = 0; k < VEC; k++) {
            float gg, gu;
            if (gelu) {
                float v = GELU_K * (g[k] + 0.044715f * g[k] * g[k] * g[k]);
                float dv = GELU_K * (1.0f + 3.0f * 0.044715f * g[k] * g[k]);
                float sg = 1.0f / (1.0f + expf(-2.0f * v));
                gu = gy[k] * g[k] * sg;
                gg = gy[k] * u[k] * (sg + 2.0f * g[k] * sg * (1.0f - sg) * dv);
            } else {
                float sg = 1.0f / (1.0f + expf(-g[k]));
                gu = gy[k] * g[k] * sg;
                gg = gy[k] * u[k] * sg * (1.0f + g[k] * (1.0f - sg));
            }
            g[k] = gg;
            u[k] = gu;
        }
        /* every input of the chunk is loaded before either output is
         * stored: dgate or dup may alias gate, up or dy (an in-place backward) */
        tstorev(dup, i0, u, m, vec);
        tstorev(dgate, i0, g, m, vec);
    }
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
                                                gpu_tensor up, size_t n, int gelu)
{
    ZO_LAUNCH(swiglu_forward_kernel, grid_for_vec(n, BS), BS, 0, st, y, gate, up, n, gelu);
    return cuda_launch_check("swiglu_forward_kernel");
}

extern "C" zo_status cuda_launch_swiglu_backward(cudaStream_t st, gpu_tensor dgate,
                                                 gpu_tensor dup, gpu_tensor dy, gpu_tensor gate,
                                                 gpu_tensor up, size_t n, int gelu)
{
    ZO_LAUNCH(swiglu_backward_kernel, grid_for_vec(n, BS), BS, 0, st, dgate, dup, dy, gate, up, n, gelu);
    return cuda_launch_check("swiglu_backward_kernel");
}
