/* Softmax cross-entropy over rows of logits, forward (per-row losses) and
 * backward (dlogits, possibly in place). One block per row: the maximum and
 * the sum of exponentials (in double, as the CPU reference) are block
 * reductions in a fixed order. */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, block_max, block_sum_d */

#define BS 256

/* log(sum_j exp(logits[off + j])) over j < v, the maximum subtracted; every
 * thread of the block gets it, and every read of the row is done before any
 * thread returns. */
__device__ float row_lse(gpu_tensor logits, size_t off, int v)
{
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, tload(logits, off + j));
    mx = block_max(mx);
    double s = 0.0;
    for (int j = threadIdx.x; j < v; j += blockDim.x) s += exp((double)(tload(logits, off + j) - mx));
    s = block_sum_d(s);
    return mx + (float)log(s);
}

/* losses[r] = lse(logits[r]) - logits[r, targets[r]]; 0 where the target is
 * -1. logits [n, v], targets, losses [n] */
__global__ void cross_entropy_forward_kernel(cuda_err_rec *err, float *losses, gpu_tensor logits,
                                             const int32_t *targets, int v)
{
    int r = blockIdx.x, tgt = targets[r]; /* uniform over the block */
    if (tgt == -1) {
        if (threadIdx.x == 0) losses[r] = 0.0f;
        return;
    }
    if (tgt < -1 || tgt >= v) {
        if (threadIdx.x == 0) record_bad_id(err, CUDA_ERR_CE_FORWARD, r, tgt, v);
        return;
    }
    size_t off = (size_t)r * v;
    float lse = row_lse(logits, off, v);
    if (threadIdx.x == 0) losses[r] = lse - tload(logits, off + tgt);
}

/* dlogits[r, j] = dloss * (softmax(logits[r])[j] - (j == targets[r])); a row
 * whose target is -1 gets zeros. dlogits may be logits itself. */
__global__ void cross_entropy_backward_kernel(cuda_err_rec *err, gpu_tensor dlogits,
                                              gpu_tensor logits, const int32_t *targets,
                                              float dloss, int v)
{
    int r = blockIdx.x, tgt = targets[r];
    size_t off = (size_t)r * v;
    if (tgt == -1) {
        for (int j = threadIdx.x; j < v; j += blockDim.x) tstore(dlogits, off + j, 0.0f);
        return;
    }
    if (tgt < -1 || tgt >= v) {
        if (threadIdx.x == 0) record_bad_id(err, CUDA_ERR_CE_BACKWARD, r, tgt, v);
        return;
    }
    float L = row_lse(logits, off, v);
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float g = dloss * expf(tload(logits, off + j) - L);
        if (j == tgt) g -= dloss;
        tstore(dlogits, off + j, g);
    }
}

extern "C" zo_status cuda_launch_cross_entropy_forward(cudaStream_t st, cuda_err_rec *err,
                                                       float *losses, gpu_tensor logits,
                                                       const int32_t *targets, int n, int v)
{
    ZO_LAUNCH(cross_entropy_forward_kernel, n, BS, 0, st, err, losses, logits, targets, v);
    return cuda_launch_check("cross_entropy_forward_kernel");
}

extern "C" zo_status cuda_launch_cross_entropy_backward(cudaStream_t st, cuda_err_rec *err,
                                                        gpu_tensor dlogits, gpu_tensor logits,
                                                        const int32_t *targets, float dloss,
                                                        int n, int v)
{
    ZO_LAUNCH(cross_entropy_backward_kernel, n, BS, 0, st, err, dlogits, logits, targets, dloss, v);
    return cuda_launch_check("cross_entropy_backward_kernel");
}
