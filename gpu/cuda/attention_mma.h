/* Private to the CUDA backend: the attention forward on mma.sync with the
 * softmax in registers (attention_mma.cu), the op of attention.cu's forward
 * (gpu/device.h) for what cuda_attn_mma_covers: the cases of the
 * tensor-core kernels (cuda_attn_tc_covers: 16-bit qkv, head sizes 64, 80,
 * 96 and 128, no sliding window that masks anything, no soft cap or ALiBi;
 * any scale, GQA). Its lse is the one the backwards of attention_tc.cu and
 * attention_gemm.cu read. ops_cuda.c takes it where ZO_ATTENTION=mma. */
#ifndef ZO_GPU_CUDA_ATTENTION_MMA_H
#define ZO_GPU_CUDA_ATTENTION_MMA_H

#include "gpu/cuda/attention_tc.h" /* defines: cuda_attn_tc_covers */
#include "gpu/cuda/cuda_impl.h"    /* defines: cudaStream_t, gpu_tensor, gpu_attn_desc */

#ifdef __cplusplus
extern "C" {
#endif

static inline int cuda_attn_mma_covers(const gpu_attn_desc *a, zo_dtype qkv) { return cuda_attn_tc_covers(a, qkv); }

zo_status cuda_launch_attention_mma_forward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out, float *lse,
                                            gpu_tensor qkv);

#ifdef __cplusplus
}
#endif

#endif
