/* gpu/cuda/attention_tc.cu on the host, through the shim (shim_prelude.h
 * says why the namespace) and the shim's nvcuda::wmma (shim_wmma.h). */
#include "gpu/cuda/shim/shim_prelude.h"
#include "gpu/cuda/shim/shim_wmma.h" /* defines: nvcuda::wmma */
#include "gpu/cuda/attention_tc.h"    /* defines: cuda_attn_tc_covers (attention_tc.cu) */

namespace zo_shim_kernels {
#include "gpu/cuda/attention_tc.cu"
}
