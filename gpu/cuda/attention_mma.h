/* Private to the CUDA backend: attention on mma.sync with the scores and
 * the softmax in registers (attention_mma.cu), the ops of attention.cu
 * (gpu/device.h) for what cuda_attn_mma_covers: the cases of the
 * tensor-core kernels but ALiBi (cuda_attn_tc_covers: 16-bit qkv, head
 * sizes 64, 80, 96 and 128; any scale, GQA, sliding windows, soft caps),
 * and the same at head size 256 (Gemma's).
 * lse as the other paths save it, so a forward of one and a backward of
 * another agree; dout and dqkv of the backward may be fp32
 * or the type of qkv. ops_cuda.c takes them wherever they cover the layer
 * (the automatic choice, common/attn_path.h) or ZO_ATTENTION=mma. */
#ifndef ZO_GPU_CUDA_ATTENTION_MMA_H
#define ZO_GPU_CUDA_ATTENTION_MMA_H

#include "common/attn_path.h"      /* defines: zo_attn_mma_covers */
#include "gpu/cuda/attention_tc.h" /* defines: cuda_attn_tc_covers */
#include "gpu/cuda/cuda_impl.h"    /* defines: cudaStream_t, gpu_tensor, gpu_attn_desc */

#ifdef __cplusplus
extern "C" {
#endif

/* (no ALiBi: its per-score term spilled the dK/dV kernel at d 128, 255
 * registers and 8 bytes of spill loads on sm_90) */
static inline int cuda_attn_mma_covers(const gpu_attn_desc *a, zo_dtype qkv)
{
    return zo_attn_mma_covers(qkv == ZO_DTYPE_F16 || qkv == ZO_DTYPE_BF16, a->d, a->window, a->t, a->softcap, a->alibi);
}

zo_status cuda_launch_attention_mma_forward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out, float *lse,
                                            gpu_tensor qkv);

/* scratch: b * hq * t floats from pool, stream-ordered */
zo_status cuda_launch_attention_mma_backward(cudaStream_t st, cudaMemPool_t pool, const gpu_attn_desc *a,
                                             gpu_tensor dqkv, gpu_tensor dout, gpu_tensor qkv, gpu_tensor out,
                                             const float *lse);

#ifdef __cplusplus
}
#endif

#endif
