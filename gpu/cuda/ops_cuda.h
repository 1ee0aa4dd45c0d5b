/* The CUDA column of the op table (gpu/ops.h): cuda_ops[id] launches op id
 * on a stream with the arguments gpu_op_run has checked. device_cuda.c
 * dispatches through it; the host shim (gpu/cuda/shim/) builds the same file
 * over its host copies of the launchers, so the parity test (tests/
 * test_ops.c) runs this very table where no GPU exists. */
#ifndef ZO_GPU_CUDA_OPS_CUDA_H
#define ZO_GPU_CUDA_OPS_CUDA_H

#include "gpu/cuda/cuda_impl.h" /* defines: cudaStream_t, cuda_err_rec, launchers */
#include "gpu/ops.h"            /* defines: gpu_op_id, gpu_op_args */

#ifdef __cplusplus
extern "C" {
#endif

/* What a launch needs of its stream and device. */
typedef struct cuda_exec {
    cudaStream_t stream;
    cuda_err_rec *err;      /* the stream's record of bad ids (device memory) */
    double *partials;       /* [CUDA_SUMSQ_BLOCKS] for sum_squares */
    void *workspace;        /* cuBLASLt's, ws_bytes; the scratch of the embedding's and the
                             * norms' backwards (stream_workspace, device_cuda.c) */
    size_t ws_bytes;
    cublasLtHandle_t lt;    /* NULL: GEMMs run the tiled kernel */
    cudaMemPool_t pool;     /* scratch of mixed-dtype GEMMs and GEMM attention */
    int attn_path;          /* a cuda_attn_path; CUDA_ATTN_AUTO: ZO_ATTENTION decides */
    size_t attn_cap;        /* bytes of GEMM attention's scores per chunk (0: the default) */
} cuda_exec;

/* Which attention runs gpu_attention_forward / _backward with 16-bit qkv:
 * the GEMM path (attention_gemm.cu), the flash kernel (attention.cu) or the
 * fused tensor-core kernels (attention_tc.cu, for the cases
 * cuda_attn_tc_covers; the rest take the automatic choice) or the
 * mma.sync kernels (attention_mma.cu, the same cases). AUTO reads
 * ZO_ATTENTION (gemm,
 * flash, tc, mma, or auto / unset): auto never takes mma; it takes the
 * tensor-core kernels where they cover the case at head sizes up to 64 or
 * where the GEMM path is not taken, the GEMM path on a device with cuBLASLt
 * from t >= CUDA_ATTN_GEMM_MIN_T, else the flash kernel. fp32 qkv and
 * the cached attention always run the flash kernels. */
enum cuda_attn_path { CUDA_ATTN_AUTO, CUDA_ATTN_FLASH, CUDA_ATTN_GEMM, CUDA_ATTN_TC, CUDA_ATTN_MMA };

typedef zo_status (*cuda_op_fn)(const cuda_exec *e, const gpu_op_args *a);

extern const cuda_op_fn cuda_ops[GPU_OP_COUNT];

#ifdef __cplusplus
}
#endif

#endif
