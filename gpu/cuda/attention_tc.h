/* Private to the CUDA backend: the fused tensor-core attention
 * (attention_tc.cu), the same ops as attention.cu and attention_gemm.cu
 * (gpu/device.h) for what cuda_attn_tc_covers: 16-bit qkv, head sizes 64,
 * 80, 96 and 128 (any scale, GQA, sliding windows, soft caps, ALiBi).
 * dout and dqkv of the backward may be fp32 or the type of qkv. ops_cuda.c
 * chooses between the three. */
#ifndef ZO_GPU_CUDA_ATTENTION_TC_H
#define ZO_GPU_CUDA_ATTENTION_TC_H

#include "common/attn_path.h"   /* defines: zo_attn_tc_covers */
#include "gpu/cuda/cuda_impl.h" /* defines: cudaStream_t, cudaMemPool_t, gpu_tensor, gpu_attn_desc */

#ifdef __cplusplus
extern "C" {
#endif

static inline int cuda_attn_tc_covers(const gpu_attn_desc *a, zo_dtype qkv)
{
    return zo_attn_tc_covers(qkv == ZO_DTYPE_F16 || qkv == ZO_DTYPE_BF16, a->d, a->window, a->t, a->softcap, a->alibi);
}

zo_status cuda_launch_attention_tc_forward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out, float *lse,
                                           gpu_tensor qkv);

/* scratch: b * hq * t floats from pool, stream-ordered */
zo_status cuda_launch_attention_tc_backward(cudaStream_t st, cudaMemPool_t pool, const gpu_attn_desc *a,
                                            gpu_tensor dqkv, gpu_tensor dout, gpu_tensor qkv, gpu_tensor out,
                                            const float *lse);

#ifdef __cplusplus
}
#endif

#endif
