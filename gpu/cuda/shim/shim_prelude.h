/* What a kernel family's shim source (gpu/cuda/shim/<family>.cc) includes
 * before the family's .cu: the shim, and every header the kernel sources
 * include, at global scope. The .cu (and kernels.cuh with it) is then
 * included inside namespace zo_shim_kernels, where these headers' include
 * guards keep them from opening again: so the kernels, their helpers and
 * their types get names of their own (zo_shim_kernels::...), never those of
 * nvcc's objects in zo_gpu, while the launchers, extern "C", become the
 * shim_* functions of shim_names.h. */
#ifndef ZO_GPU_CUDA_SHIM_PRELUDE_H
#define ZO_GPU_CUDA_SHIM_PRELUDE_H

#include "gpu/cuda/shim/cuda_shim.h" /* defines: the CUDA vocabulary on the host */

#include "gpu/cuda/cuda_impl.h"   /* defines: gpu_tensor, cuda_err_rec, shim_launch_* */
#include "gpu/cuda/gemm_layout.h" /* defines: cuda_gemm_lt_shape (gemm.cu) */
#include "gpu/cuda/attention_gemm.h" /* defines: cuda_attn_plan_chunks (attention_gemm.cu) */
extern "C" {
#include "common/nf4.h" /* defines: zo_nf4_layout_of, zo_nf4_absmax_map (nf4.cu) */
}

#endif
