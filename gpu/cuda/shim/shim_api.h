/* The shim's launchers for C (and C++) callers: the CUDA kernels of
 * gpu/cuda/<family>.cu run on the host (library zo_cuda_shim, every build). Each
 * shim_launch_<op> is cuda_launch_<op> of gpu/cuda/cuda_impl.h with the same
 * arguments, on host pointers; the stream may be NULL; the kernel has run
 * when it returns, and its status is cuda_launch_check's: ZO_ERR_DEVICE
 * naming the kernel for what a GPU would refuse or leave undefined
 * (docs/gpu-cuda.md, "The host shim"). What device.c checks before calling
 * a launcher (shapes > 0, hkv dividing hq, ...) is the caller's to hold.
 *
 *     #include "gpu/cuda/shim/shim_api.h"
 *     cuda_err_rec err = {0};                        // the stream's record, host memory
 *     zo_status s = shim_launch_cross_entropy_forward(NULL, &err, losses, logits,
 *                                                     targets, n, v);
 *     // err.code != 0: a bad target (err.index, err.value, err.limit)
 *     double partials[CUDA_SUMSQ_BLOCKS];           // scratch of shim_launch_sum_squares
 *     s = shim_launch_sum_squares(NULL, &sum, x, n, partials);
 *
 * Include it instead of cuda_impl.h; a file that includes the real
 * cuda_impl.h (with the CUDA headers) cannot include this one too. */
#ifndef ZO_GPU_CUDA_SHIM_API_H
#define ZO_GPU_CUDA_SHIM_API_H

#if defined(ZO_GPU_CUDA_IMPL_H) && !defined(ZO_CUDA_SHIM)
#error "gpu/cuda/cuda_impl.h was included for the real CUDA backend: the shim's names need ZO_CUDA_SHIM"
#endif
#ifndef ZO_CUDA_SHIM
#define ZO_CUDA_SHIM 1
#endif

#include "gpu/cuda/cuda_impl.h" /* defines: shim_launch_*, cuda_err_rec, CUDA_SUMSQ_BLOCKS */

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
/* The shim's stream-ordered pool (cudaMallocFromPoolAsync, cudaFreeAsync;
 * one for the process): the bytes its blocks hold now, the most they held
 * since the last reset, and the reset (the peak to what is held now). What
 * a launcher takes beyond its arguments, as a GPU's pool would give it. */
size_t zo_shim_pool_held(void);
size_t zo_shim_pool_peak(void);
void zo_shim_pool_reset_peak(void);
#ifdef __cplusplus
}
#endif

#endif
