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

/* partials[b] = sum of x[i]^2 over block b's contiguous chunk of x [n]:
 * each thread walks its elements in steps of the block, four loads in
 * flight a step (one sum each, then summed in a fixed order), so that a
 * chunk of megabytes keeps the memory system busy; the rest one at a time */
__global__ void sum_squares_partial_kernel(double *partials, gpu_tensor x, size_t n)
{
    size_t chunk = (n + gridDim.x - 1) / gridDim.x;
    size_t lo = (size_t)blockIdx.x * chunk, hi = lo + chunk < n ? lo + chunk : n;
    const size_t bd = blockDim.x;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    size_t i = lo + threadIdx.x;
    for (; i + 3 * bd < hi; i += 4 * bd) {
        const double v0 = tload(x, i), v1 = tload(x, i + bd), v2 = tload(x, i + 2 * bd), v3 = tload(x, i + 3 * bd);
        s0 += v0 * v0;
        s1 += v1 * v1;
        s2 += v2 * v2;
        s3 += v3 * v3;
    }
    for (; i < hi; i += bd) {
        const double v = tload(x, i);
        s0 += v * v;
    }
    double s = (s0 + s1) + (s2 + s3);
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
