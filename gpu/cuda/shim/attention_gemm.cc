/* gpu/cuda/attention_gemm.cu on the host, through the shim (shim_prelude.h
 * says why the namespace). */
#include "gpu/cuda/shim/shim_prelude.h"

namespace zo_shim_kernels {
#include "gpu/cuda/attention_gemm.cu"
}
