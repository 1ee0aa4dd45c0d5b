/* Activations: GELU (tanh and erf forms), ReLU and SwiGLU, forward and backward, with the
 * formulas of the CPU reference (gpu/ops_cpu.c) in fp32. One thread per
 * element in a grid-stride loop. */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, grid_for */

#define BS 256
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_RSQRT2 0.7071067811865476f   /* 1 / sqrt(2) */
#define GELU_RSQRT2PI 0.3989422804014327f /* 1 / sqrt(2 pi) */

#define GRID_STRIDE(i, n)                                                                   \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                 \
         i += (size_t)gridDim.x * blockDim.x)

/* y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as the
 * CPU reference does through 1 + tanh(u) = 2 sigmoid(2u): y = x / (1 + exp(-2u)).
 * The tanh form loses all relative precision for x below about -3, where
 * 1 + tanh(u) cancels. form (gpu/device.h): 1 the erf form, 2 ReLU. y, x [n] */
__global__ void gelu_forward_kernel(gpu_tensor y, gpu_tensor x, size_t n, int form)
{
    GRID_STRIDE(i, n)
    {
        float v = tload(x, i);
        if (form == 2) { /* ReLU */
            tstore(y, i, v > 0.0f ? v : 0.0f);
            continue;
        }
        if (form == 1) { /* the erf form as the CPU reference: x Phi(x), Phi = erfc(-x / sqrt 2) / 2 */
            tstore(y, i, v * 0.5f * erfcf(-v * GELU_RSQRT2));
            continue;
        }
        float u = GELU_K * (v + 0.044715f * v * v * v);
        tstore(y, i, v / (1.0f + expf(-2.0f * u)));
    }
}

/* dx = dy * gelu'(x) = dy * (s + 2 x s (1 - s) du/dx), s = sigmoid(2u), as
 * the CPU reference (no cancellation); dx, dy, x [n] */
__global__ void gelu_backward_kernel(gpu_tensor dx, gpu_tensor dy, gpu_tensor x, size_t n, int form)
{
    GRID_STRIDE(i, n)
    {
        float v = tload(x, i);
        if (form == 2) { /* ReLU: dy where x > 0, else 0 */
            tstore(dx, i, v > 0.0f ? tload(dy, i) : 0.0f);
            continue;
        }
        if (form == 1) { /* Phi(x) + x phi(x) */
            tstore(dx, i, tload(dy, i) * (0.5f * erfcf(-v * GELU_RSQRT2) + v * GELU_RSQRT2PI * expf(-0.5f * v * v)));
            continue;
        }
        float u = GELU_K * (v + 0.044715f * v * v * v);
        float du = GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
        float sg = 1.0f / (1.0f + expf(-2.0f * u));
        tstore(dx, i, tload(dy, i) * (sg + 2.0f * v * sg * (1.0f - sg) * du));
    }
}

/* y = silu(gate) * up, or with gelu (GeGLU, Gemma) gelu_tanh(gate) * up;
 * y, gate, up [n] */
__global__ void swiglu_forward_kernel(gpu_tensor y, gpu_tensor gate, gpu_tensor up, size_t n, int gelu)
{
    GRID_STRIDE(i, n)
    {
        float g = tload(gate, i);
        float e = gelu ? -2.0f * GELU_K * (g + 0.044715f * g * g * g) : -g;
        tstore(y, i, g / (1.0f + expf(e)) * tload(up, i));
    }
}

/* dup = dy * silu(gate); dgate = dy * up * silu'(gate); all [n]. With gelu
 * the same for gelu_tanh: gelu'(g) = s + 2 g s (1 - s) du/dg, s = sigmoid(2u) */
__global__ void swiglu_backward_kernel(gpu_tensor dgate, gpu_tensor dup, gpu_tensor dy,
                                       gpu_tensor gate, gpu_tensor up, size_t n, int gelu)
{
    GRID_STRIDE(i, n)
    {
        float g = tload(gate, i), u = tload(up, i), gy = tload(dy, i);
        float gg, gu;
        if (gelu) {
            float v = GELU_K * (g + 0.044715f * g * g * g), dv = GELU_K * (1.0f + 3.0f * 0.044715f * g * g);
            float sg = 1.0f / (1.0f + expf(-2.0f * v));
            gu = gy * g * sg;
            gg = gy * u * (sg + 2.0f * g * sg * (1.0f - sg) * dv);
        } else {
            float sg = 1.0f / (1.0f + expf(-g));
            gu = gy * g * sg;
            gg = gy * u * sg * (1.0f + g * (1.0f - sg));
        }
        /* both outputs are computed before either is stored: dgate or dup may
         * alias gate, up or dy (an in-place backward) */
        tstore(dup, i, gu);
        tstore(dgate, i, gg);
    }
}

extern "C" zo_status cuda_launch_gelu_forward(cudaStream_t st, gpu_tensor y, gpu_tensor x,
                                              size_t n, int form)
{
    ZO_LAUNCH(gelu_forward_kernel, grid_for(n, BS), BS, 0, st, y, x, n, form);
    return cuda_launch_check("gelu_forward_kernel");
}

extern "C" zo_status cuda_launch_gelu_backward(cudaStream_t st, gpu_tensor dx, gpu_tensor dy,
                                               gpu_tensor x, size_t n, int form)
{
    ZO_LAUNCH(gelu_backward_kernel, grid_for(n, BS), BS, 0, st, dx, dy, x, n, form);
    return cuda_launch_check("gelu_backward_kernel");
}

extern "C" zo_status cuda_launch_swiglu_forward(cudaStream_t st, gpu_tensor y, gpu_tensor gate,
                                                gpu_tensor up, size_t n, int gelu)
{
    ZO_LAUNCH(swiglu_forward_kernel, grid_for(n, BS), BS, 0, st, y, gate, up, n, gelu);
    return cuda_launch_check("swiglu_forward_kernel");
}

extern "C" zo_status cuda_launch_swiglu_backward(cudaStream_t st, gpu_tensor dgate,
                                                 gpu_tensor dup, gpu_tensor dy, gpu_tensor gate,
                                                 gpu_tensor up, size_t n, int gelu)
{
    ZO_LAUNCH(swiglu_backward_kernel, grid_for(n, BS), BS, 0, st, dgate, dup, dy, gate, up, n, gelu);
    return cuda_launch_check("swiglu_backward_kernel");
}
