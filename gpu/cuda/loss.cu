/* Softmax cross-entropy over rows of logits, forward (per-row losses) and
 * backward (dlogits, possibly in place). One block per row: the maximum and
 * the sum of exponentials (in double, as the CPU reference) are block
 * reductions in a fixed order. */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, block_max, block_sum_d */

#define BS 256

/* log(sum_j exp(logits[off + j])) over j < v, the maximum subtracted; every
 * thread of the block gets it, and every read of the row is done before any
 * thread returns. */
/* logits[i], soft-capped when cap > 0: cap tanh(x / cap) */
__device__ __forceinline__ float capped(gpu_tensor logits, size_t i, float cap)
{
    const float x = tload(logits, i);
    return cap > 0.0f ? cap * tanhf(x / cap) : x;
}

__device__ float row_lse(gpu_tensor logits, size_t off, int v, float cap)
{
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, capped(logits, off + j, cap));
    mx = block_max(mx);
    double s = 0.0;
    for (int j = threadIdx.x; j < v; j += blockDim.x) s += exp((double)(capped(logits, off + j, cap) - mx));
    s = block_sum_d(s);
    return mx + (float)log(s);
}

/* losses[r] = lse(logits[r]) - logits[r, targets[r]]; 0 where the target is
 * -1. logits [n, v], targets, losses [n]; with cap > 0 over the capped
 * logits (the backward also times the cap's derivative) */
__global__ void cross_entropy_forward_kernel(cuda_err_rec *err, float *losses, gpu_tensor logits,
                                             const int32_t *targets, int v, float cap)
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
    float lse = row_lse(logits, off, v, cap);
    if (threadIdx.x == 0) losses[r] = lse - capped(logits, off + tgt, cap);
}

/* dlogits[r, j] = dloss * (softmax(logits[r])[j] - (j == targets[r])); a row
 * whose target is -1 gets zeros. dlogits may be logits itself. */
__global__ void cross_entropy_backward_kernel(cuda_err_rec *err, gpu_tensor dlogits,
                                              gpu_tensor logits, const int32_t *targets,
                                              float dloss, int v, float cap)
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
    float L = row_lse(logits, off, v, cap);
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        const float z = capped(logits, off + j, cap); /* each thread reads its own j before writing it */
        float g = dloss * expf(z - L);
        if (j == tgt) g -= dloss;
        if (cap > 0.0f) g *= 1.0f - (z / cap) * (z / cap);
        tstore(dlogits, off + j, g);
    }
}

extern "C" zo_status cuda_launch_cross_entropy_forward(cudaStream_t st, cuda_err_rec *err,
                                                       float *losses, gpu_tensor logits,
                                                       const int32_t *targets, int n, int v, float cap)
{
    ZO_LAUNCH(cross_entropy_forward_kernel, n, BS, 0, st, err, losses, logits, targets, v, cap);
    return cuda_launch_check("cross_entropy_forward_kernel");
}

extern "C" zo_status cuda_launch_cross_entropy_backward(cudaStream_t st, cuda_err_rec *err,
                                                        gpu_tensor dlogits, gpu_tensor logits,
                                                        const int32_t *targets, float dloss,
                                                        int n, int v, float cap)
{
    ZO_LAUNCH(cross_entropy_backward_kernel, n, BS, 0, st, err, dlogits, logits, targets, dloss, v, cap);
    return cuda_launch_check("cross_entropy_backward_kernel");
}
