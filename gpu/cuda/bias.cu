/* Bias of a Linear layer: broadcast add over rows, and its gradient, the
 * column sums of dy, in two stages through the stream's workspace (norm.cu,
 * cuda_launch_column_sums): partial sums of fixed row chunks, then added in
 * chunk order (no atomics): the same result every run. */
#include "gpu/cuda/kernels.cuh" /* defines: tloadv, tstorev, tvec_ok */

#define BS 256

/* y[r, j] (row stride ldy) += bias[j]; y [n, c], bias [c]. One thread per
 * chunk of VEC columns of a row, vector accesses where y's row and bias are
 * aligned there. Moves y in and out: 2 n c elements (8192 x 3072 bf16:
 * 100.7 MB), bias from cache. */
__global__ void bias_forward_kernel(gpu_tensor y, gpu_tensor bias, int n, int c, int64_t ldy)
{
    size_t per = (size_t)(c + VEC - 1) / VEC, total = (size_t)n * per;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / per;
        int j0 = (int)(i % per) * VEC, m = vec_len(c, j0);
        size_t o = r * ldy + j0;
        bool vec = m == VEC && tvec_ok(y, o) && tvec_ok(bias, j0);
        float v[VEC], b[VEC];
        tloadv(y, o, v, m, vec);
        tloadv(bias, j0, b, m, vec);
        ZO_UNROLL
        for (int k = 0; k < VEC; k++) v[k] += b[k];
        tstorev(y, o, v, m, vec);
    }
}

extern "C" zo_status cuda_launch_bias_forward(cudaStream_t st, gpu_tensor y, gpu_tensor bias,
                                              int n, int c, int64_t ldy)
{
    size_t total = (size_t)n * ((c + VEC - 1) / VEC);
    ZO_LAUNCH(bias_forward_kernel, grid_for(total, BS), BS, 0, st, y, bias, n, c, ldy);
    return cuda_launch_check("bias_forward_kernel");
}

/* dbias[j] += sum_r dy[r, j]; dy [n, c] (row stride lddy). Moves dy once:
 * n c elements (GPT-2's fp32 dy, 8192 x 768: 25.2 MB; x 3072: 100.7 MB), the
 * partials (about 1056 / (c / 256) rows of c fp32: 1.1 MB) out and back. */
extern "C" zo_status cuda_launch_bias_backward(cudaStream_t st, void *scratch, size_t scratch_bytes,
                                               gpu_tensor dbias, gpu_tensor dy, int n, int c, int64_t lddy)
{
    gpu_tensor none = {NULL, ZO_DTYPE_F32};
    return cuda_launch_column_sums(st, scratch, scratch_bytes, none, dbias, dy, lddy, none, NULL, NULL, n, 1, c);
}
