/* Adam / AdamW over fp32 master state on the CPU, at the memory roof.
 *
 * One pass over contiguous arrays updates the fp32 master parameters and the
 * fp32 moments m and v from a gradient stored as fp32, fp16 or bf16, and can
 * write the updated weights as fp16 or bf16 into a separate buffer (the copy
 * the runtime sends to the GPU) in the same pass. A second pass returns the
 * sum of squares of a gradient and whether it holds inf or nan (for clipping
 * and loss scaling).
 *
 * Implementations: a scalar reference, AVX2+F16C and AVX-512 (with the
 * AVX512-BF16 conversion when the CPU has it). ADAM_IMPL_AUTO picks the best
 * one the CPU supports at run time, so one binary runs everywhere. All of them
 * give bit-identical parameters, moments and 16-bit copies: the same IEEE
 * operations in the same order (no FMA contraction), and round-to-nearest-even
 * for every 16-bit conversion (common/dtype.h is the reference).
 *
 * Threads: OpenMP with a static split of [0, n) into one contiguous chunk per
 * thread, so with the same n and thread count each thread touches the same
 * pages every step. Calls on a sub-range (param + off, grad + off, ...) are
 * fine; every pointer needs only its element's natural alignment.
 *
 * Per element, with g the stored gradient:
 *     g  = g * grad_mult                 (1/loss_scale times the clip coefficient)
 *     g += weight_decay * p              (ADAM_DECAY_L2 only)
 *     m  = beta1 * m + (1 - beta1) * g
 *     v  = beta2 * v + (1 - beta2) * (g * g)
 *     d  = sqrt(v) * (1 / sqrt(1 - beta2^step)) + eps
 *     p  = p - (lr * weight_decay) * p   (ADAM_DECAY_ADAMW only)
 *     p  = p - (lr / (1 - beta1^step)) * (m / d)
 *     out16 = round_to_nearest_even(p)   (when out16 is not NULL)
 * The per-step scalars in parentheses are computed once in double and rounded
 * to float, identically for every implementation. */
#ifndef ZO_CPU_ADAM_H
#define ZO_CPU_ADAM_H

#include <stddef.h>

#include "common/dtype.h"  /* zo_dtype */
#include "common/status.h" /* zo_status */
#include "common/adam_math.h" /* zo_adam_hparams */

/* The hyperparameters are common/adam_math.h's, under this module's names. */
typedef zo_adam_decay adam_decay;
#define ADAM_DECAY_ADAMW ZO_ADAM_DECAY_ADAMW /* decoupled: p -= lr * weight_decay * p */
#define ADAM_DECAY_L2 ZO_ADAM_DECAY_L2       /* classic Adam: g += weight_decay * p */
typedef zo_adam_hparams adam_hparams;

typedef enum adam_impl {
    ADAM_IMPL_AUTO = 0, /* the best the CPU supports (adam_best_impl) */
    ADAM_IMPL_SCALAR,   /* plain C reference */
    ADAM_IMPL_AVX2,     /* AVX2 + F16C (+ FMA in the sum of squares) */
    ADAM_IMPL_AVX512,   /* AVX-512 F/BW/VL, + AVX512-BF16 when present */
    /* AVX-512 rounding the bf16 copy with integer operations even where
     * AVX512-BF16 exists (tests and benchmarks of that path). */
    ADAM_IMPL_AVX512_NO_BF16,
    ADAM_IMPL_COUNT,
} adam_impl;

/* lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01 (AdamW), step 1,
 * grad_mult 1: PyTorch's AdamW defaults. */
adam_hparams adam_hparams_default(void);

/* One optimizer step over n elements, in place on param, m and v (each n
 * fp32). grad holds n elements of grad_dtype. out16, when not NULL, receives
 * the updated params as out_dtype (ZO_DTYPE_F16 or ZO_DTYPE_BF16); out_dtype
 * is ignored when out16 is NULL. nthreads 0 uses OpenMP's default; small n
 * uses fewer threads. The arrays must not overlap. ZO_ERR_INVALID for bad
 * hyperparameters, dtypes, NULL or misaligned pointers. */
zo_status adam_update(const adam_hparams *hp, size_t n, float *param, const void *grad,
                      zo_dtype grad_dtype, float *m, float *v, void *out16, zo_dtype out_dtype,
                      int nthreads);

/* The same with a chosen implementation (tests, benchmarks).
 * ZO_ERR_UNSUPPORTED when this CPU lacks it. */
zo_status adam_update_impl(adam_impl impl, const adam_hparams *hp, size_t n, float *param,
                           const void *grad, zo_dtype grad_dtype, float *m, float *v, void *out16,
                           zo_dtype out_dtype, int nthreads);

/* Sum of squares of n gradient elements and whether any element is inf or
 * nan (*nonfinite 1, and *sumsq is then inf or nan). The scalar reference
 * sums in double; the vector ones sum blocks of 64 squares per lane in fp32
 * and the blocks in double (relative error below 2e-6; a block whose fp32 sum
 * overflows is summed again in double, so only a real inf/nan is reported).
 * grad_mult is not applied: scale the result by grad_mult^2. Results depend on
 * the implementation and thread count to rounding; a given (impl, nthreads)
 * is deterministic. */
zo_status adam_grad_stats(const void *grad, zo_dtype grad_dtype, size_t n, int nthreads,
                          double *sumsq, int *nonfinite);
zo_status adam_grad_stats_impl(adam_impl impl, const void *grad, zo_dtype grad_dtype, size_t n,
                               int nthreads, double *sumsq, int *nonfinite);

/* The best implementation this CPU supports (never ADAM_IMPL_AUTO). */
adam_impl adam_best_impl(void);
/* Whether this CPU can run impl (AUTO and SCALAR always can). */
int adam_impl_supported(adam_impl impl);
/* "auto", "scalar", "avx2", "avx512", "avx512-nobf16"; "?" for an unknown
 * value. */
const char *adam_impl_name(adam_impl impl);
/* Whether the AVX-512 implementation converts to bf16 with the AVX512-BF16
 * instruction here (otherwise it rounds with integer operations). */
int adam_avx512_has_bf16(void);

#endif
