/* Bias of a Linear layer: broadcast add over rows, and its gradient, the
 * column sums of dy. The column sums are split over a fixed set of row
 * groups combined in a fixed order (no atomics): the same result every run. */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, grid_for */

#define BS 256
#define COLS 32 /* columns per block of the column sums (one per lane) */
#define ROWG 16 /* row groups per block */

/* y[r, j] (row stride ldy) += bias[j]; y [n, c], bias [c] */
__global__ void bias_forward_kernel(gpu_tensor y, gpu_tensor bias, int n, int c, int64_t ldy)
{
    size_t total = (size_t)n * c;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / c, j = i % c, o = r * ldy + j;
        tstore(y, o, tload(y, o) + tload(bias, j));
    }
}

/* dbias[j] += sum_r dy[r, j]; dy [n, c] (row stride lddy). Block (COLS, ROWG):
 * lane x owns column blockIdx.x*COLS + x, row group y sums rows y, y+ROWG, ... */
__global__ void bias_backward_kernel(gpu_tensor dbias, gpu_tensor dy, int n, int c, int64_t lddy)
{
    __shared__ float part[ROWG][COLS + 1];
    int j = blockIdx.x * COLS + threadIdx.x;
    float acc = 0.0f;
    if (j < c)
        for (int r = threadIdx.y; r < n; r += ROWG) acc += tload(dy, (size_t)r * lddy + j);
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
        float s = 0.0f;
        for (int g = 0; g < ROWG; g++) s += part[g][threadIdx.x];
        tstore(dbias, j, tload(dbias, j) + s);
    }
}

extern "C" zo_status cuda_launch_bias_forward(cudaStream_t st, gpu_tensor y, gpu_tensor bias,
                                              int n, int c, int64_t ldy)
{
    ZO_LAUNCH(bias_forward_kernel, grid_for((size_t)n * c, BS), BS, 0, st, y, bias, n, c, ldy);
    return cuda_launch_check("bias_forward_kernel");
}

extern "C" zo_status cuda_launch_bias_backward(cudaStream_t st, gpu_tensor dbias, gpu_tensor dy,
                                               int n, int c, int64_t lddy)
{
    dim3 block(COLS, ROWG);
    ZO_LAUNCH(bias_backward_kernel, (c + COLS - 1) / COLS, block, 0, st, dbias, dy, n, c, lddy);
    return cuda_launch_check("bias_backward_kernel");
}
