/* The CUDA column of the op table on the host: shim_cuda_ops[id] is
 * gpu/cuda/ops_cuda.c's cuda_ops[id] built over the shim's launchers, so a
 * test can run every op's CUDA kernels where no GPU exists, through the very
 * code that dispatches them on a GPU.
 *
 *     shim_exec x;
 *     shim_exec_init(&x);                      // the stream's error record and scratch
 *     zo_status s = shim_cuda_ops[GPU_OP_ADD](&x.exec, &args);   // host pointers in args
 *     shim_exec_free(&x);
 *
 * The arguments must be ones gpu_op_run accepts (the shim does not check
 * them again). GEMMs run the tiled kernel (no cuBLASLt here). */
#ifndef ZO_GPU_CUDA_SHIM_OPS_H
#define ZO_GPU_CUDA_SHIM_OPS_H

#include "gpu/cuda/shim/shim_api.h" /* defines: ZO_CUDA_SHIM, shim_* names */
#include <stdlib.h>
#include <string.h>

#include "gpu/cuda/ops_cuda.h"      /* defines: cuda_exec, shim_cuda_ops (as cuda_ops) */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shim_exec {
    cuda_exec exec;                      /* NULL stream, no cuBLASLt */
    cuda_err_rec err;                    /* the kernels' record of bad ids */
    double partials[CUDA_SUMSQ_BLOCKS];  /* sum_squares' scratch */
    cuda_attn_tune tune;                 /* ZO_ATTENTION=tune's choices (the device's on a GPU) */
} shim_exec;

/* The stream's resources a real CUDA stream has (gpu/cuda/device_cuda.c):
 * the error record, sum_squares' partials and the workspace (host memory),
 * and the device's cache of tuned attention paths. */
static inline zo_status shim_exec_init(shim_exec *x)
{
    memset(x, 0, sizeof *x);
    cuda_attn_tune_init(&x->tune);
    x->exec.tune = &x->tune;
    x->exec.err = &x->err;
    x->exec.partials = x->partials;
    x->exec.ws_bytes = CUDA_LT_WORKSPACE;
    x->exec.workspace = malloc(CUDA_LT_WORKSPACE);
    if (!x->exec.workspace) return zo_error(ZO_ERR_NOMEM, "shim_exec_init: out of host memory");
    return ZO_OK;
}

static inline void shim_exec_free(shim_exec *x)
{
    free(x->exec.workspace);
    cuda_attn_tune_free(&x->tune);
}

#ifdef __cplusplus
}
#endif

#endif
