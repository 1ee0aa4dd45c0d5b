/* gpu/cuda/attention_mma.cu on the host, through the shim (shim_prelude.h
 * says why the namespace) and mma_ptx.cuh's emulation of mma.sync and
 * ldmatrix. */
#include "gpu/cuda/shim/shim_prelude.h"
#include "gpu/cuda/attention_mma.h" /* defines: cuda_attn_mma_covers (attention_mma.cu) */

namespace zo_shim_kernels {
#include "gpu/cuda/attention_mma.cu"
}
