/* Reductions over a whole tensor: the inf/nan check of loss scaling and the
 * sum of squares of gradient clipping. The sum is accumulated in double in a
 * fixed order (a fixed number of partials, each reduced by a fixed tree, then
 * summed by one block), so it is the same on every run. */
#include "gpu/cuda/kernels.cuh" /* defines: tload, block_sum_d, grid_for */

#define BS 256

/* *flag |= 1 when any x[i] (i < n) is inf or nan */
__global__ void check_finite_kernel(int32_t *flag, gpu_tensor x, size_t n)
{
    int bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        bad |= !isfinite(tload(x, i));
    if (bad) atomicOr(flag, 1);
}

/* partials[b] = sum of x[i]^2 over block b's contiguous chunk of x [n] */
__global__ void sum_squares_partial_kernel(double *partials, gpu_tensor x, size_t n)
{
    size_t chunk = (n + gridDim.x - 1) / gridDim.x;
    size_t lo = (size_t)blockIdx.x * chunk, hi = lo + chunk < n ? lo + chunk : n;
    double s = 0.0;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        double v = tload(x, i);
        s += v * v;
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

/* *sum += sum of partials[0..np), one block of np threads (np <= 1024) */
__global__ void sum_squares_final_kernel(double *sum, const double *partials, int np)
{
    double v = (int)threadIdx.x < np ? partials[threadIdx.x] : 0.0;
    v = block_sum_d(v);
    if (threadIdx.x == 0) *sum += v;
}

extern "C" zo_status cuda_launch_check_finite(cudaStream_t st, int32_t *flag, gpu_tensor x,
                                              size_t n)
{
    ZO_LAUNCH(check_finite_kernel, grid_for(n, BS), BS, 0, st, flag, x, n);
    return cuda_launch_check("check_finite_kernel");
}

extern "C" zo_status cuda_launch_sum_squares(cudaStream_t st, double *sum, gpu_tensor x, size_t n,
                                             double *partials)
{
    ZO_LAUNCH(sum_squares_partial_kernel, CUDA_SUMSQ_BLOCKS, BS, 0, st, partials, x, n);
    zo_status s = cuda_launch_check("sum_squares_partial_kernel");
    if (s != ZO_OK)
        return s;
    ZO_LAUNCH(sum_squares_final_kernel, 1, CUDA_SUMSQ_BLOCKS, 0, st, sum, partials,
              CUDA_SUMSQ_BLOCKS);
    return cuda_launch_check("sum_squares_final_kernel");
}
