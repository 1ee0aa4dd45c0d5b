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
#include <stdint.h>

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
    ADAM_IMPL_AVX2,     /* AVX2 + F16C (+ FMA in the sum of squares, in double) */
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
 * nan (*nonfinite 1, and *sumsq is then inf or nan). Every implementation
 * widens each element to double and squares it there (exactly: 48
 * significant bits) and adds the squares in double: the scalar reference
 * one after the other, the vector ones in 32 (AVX2) or 64 (AVX-512) lanes
 * and each thread's chunk apart, then the lanes and the threads' sums in a
 * fixed order. Only additions of doubles round, so the result is within
 * gamma(n - 1) ~ (n - 1) * 2^-53 relative of the exact sum whatever the
 * order (a sum of finite squares cannot overflow a double, so only a real
 * inf/nan is reported). The same values summed in another order (the device's
 * gpu_sum_squares) differ in the last bits of the double only. grad_mult is
 * not applied: scale the result by grad_mult^2. Results depend on the
 * implementation and thread count to rounding; a given (impl, nthreads) is
 * deterministic. */
zo_status adam_grad_stats(const void *grad, zo_dtype grad_dtype, size_t n, int nthreads,
                          double *sumsq, int *nonfinite);
zo_status adam_grad_stats_impl(adam_impl impl, const void *grad, zo_dtype grad_dtype, size_t n,
                               int nthreads, double *sumsq, int *nonfinite);

/* Add n gradient elements (fp32, fp16 or bf16) into an fp32 sum:
 * acc[i] = (fresh ? 0.0f : acc[i]) + (float)grad[i], one fp32 addition per
 * element, so every implementation and thread count gives the same bits as
 * the scalar loop (fresh keeps 0 + x: -0 becomes +0, a signalling nan quiet,
 * exactly as zeroing the sum first and adding would). The first addition of
 * a step writes the sum without reading it. Vectorized (AVX-512, AVX2/F16C)
 * and split over nthreads OpenMP threads (0: OpenMP's default) in chunks of
 * at least ADAM_ACC_MIN_CHUNK elements; below two chunks one thread.
 * ZO_ERR_INVALID for a bad dtype, a NULL or misaligned array, or acc
 * overlapping grad. */
zo_status adam_grad_accumulate(float *acc, const void *grad, zo_dtype grad_dtype, size_t n, int fresh,
                               int nthreads);
zo_status adam_grad_accumulate_impl(adam_impl impl, float *acc, const void *grad, zo_dtype grad_dtype,
                                    size_t n, int fresh, int nthreads);
/* adam_grad_accumulate, and the statistics of the new sum taken in the
 * same pass: *sumsq and *nonfinite are what adam_grad_stats(acc, fp32, n,
 * stats_threads) returns afterwards, bit for bit (its ranges, its kernel,
 * its order), without reading the sum back from memory (each piece squared
 * while it is in cache). The host's gradient sums take the statistics of a
 * block this way in its last addition of a step (offload/grads.c). */
zo_status adam_grad_accumulate_stats(float *acc, const void *grad, zo_dtype grad_dtype, size_t n, int fresh,
                                     int nthreads, int stats_threads, double *sumsq, int *nonfinite);
zo_status adam_grad_accumulate_stats_impl(adam_impl impl, float *acc, const void *grad, zo_dtype grad_dtype,
                                          size_t n, int fresh, int nthreads, int stats_threads, double *sumsq,
                                          int *nonfinite);
/* The team adam_grad_accumulate uses for n elements with nthreads asked. */
int adam_grad_accumulate_threads(size_t n, int nthreads);
#define ADAM_ACC_MIN_CHUNK ((size_t)65536)

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

/* ---- optimizer state encodings ----------------------------------------------------
 *
 * The moments m and v of a sub-group can be stored in fewer bytes than fp32's
 * 8 per parameter (docs/cpu_adam.md, "State encodings"). The fp32 master
 * parameters and the 16-bit weight copy are the same for every encoding.
 *
 *   ADAM_STATE_F32   m, v fp32 (8 bytes a parameter): adam_update's arrays.
 *   ADAM_STATE_BF16  m, v bf16 (4 bytes): the step reads them widened, updates
 *                    in fp32 and stores them rounded to nearest even.
 *   ADAM_STATE_Q8    m, v block-wise 8-bit (2 + 8/block bytes): 8-bit AdamW of
 *                    Dettmers et al., "8-bit Optimizers via Block-wise
 *                    Quantization" (2022), as bitsandbytes stores it. Each
 *                    block of `block` values keeps one fp32 absmax per moment
 *                    and a byte per value: the index of the nearest value of
 *                    bitsandbytes' dynamic map (common/nf4.h) to value/absmax,
 *                    signed for m, unsigned for v.
 *
 * One step of an encoded state, per block (a bf16 "block" is one element):
 *     m, v  = dequantize(state)                 map[code] * absmax (q8), widen (bf16)
 *     p, m, v, out16 = the fp32 update above     (adam_update's sequence, bit for bit)
 *     absmax = the largest |m|, |v| in the block (q8; a nan makes it nan)
 *     state = quantize(m, v)                    nearest code of m * (1/absmax) (q8),
 *                                               round to nearest even (bf16)
 * so the parameter update uses the unrounded fp32 moments of this step, and
 * only what is carried to the next step is rounded (as bitsandbytes does).
 *
 * A state of n parameters is one buffer of adam_state_bytes(kind, n) bytes,
 * aligned to ADAM_STATE_ALIGN (4 suffices; 64 keeps the vectors on lines):
 * m, then v, then (q8) the absmax of m's blocks, then of v's, each part
 * starting on a 64-byte boundary of the buffer (adam_state_layout_of). A
 * buffer of zero bytes is a valid zero state of every encoding, and so is
 * what adam_state_init writes. */

typedef enum adam_state_type {
    ADAM_STATE_F32 = 0,
    ADAM_STATE_BF16,
    ADAM_STATE_Q8,
    ADAM_STATE_TYPE_COUNT,
} adam_state_type;

/* An encoding: the type and, for ADAM_STATE_Q8, the values per absmax (a
 * multiple of 64 from 64 to ADAM_Q8_BLOCK_MAX; 0 for the other types). */
typedef struct adam_state_kind {
    adam_state_type type;
    uint32_t block;
} adam_state_kind;

#define ADAM_Q8_BLOCK 2048     /* the paper's block size */
#define ADAM_Q8_ZERO_M_CODE 127 /* m's code of 0 (the signed map's); v's is 0 */
#define ADAM_Q8_BLOCK_MAX 4096 /* the largest block a kernel handles */
#define ADAM_STATE_ALIGN 4     /* required alignment of a state buffer (64 advised) */

static inline adam_state_kind adam_state_f32(void) { return (adam_state_kind){ADAM_STATE_F32, 0}; }
static inline adam_state_kind adam_state_bf16(void) { return (adam_state_kind){ADAM_STATE_BF16, 0}; }
static inline adam_state_kind adam_state_q8(uint32_t block)
{
    return (adam_state_kind){ADAM_STATE_Q8, block};
}

/* ZO_ERR_INVALID naming `who` for an unknown type or a bad block size. */
zo_status adam_state_check(const char *who, adam_state_kind kind);
/* "fp32", "bf16", "q8" (block 2048) or "q8/<block>"; "?" when invalid. */
const char *adam_state_name(adam_state_kind kind);
/* The inverse of adam_state_name ("q8" is q8/2048); ZO_ERR_INVALID naming s. */
zo_status adam_state_parse(const char *s, adam_state_kind *out);

/* Where the parts of the state of n parameters lie: byte offsets into its
 * buffer. The absmax parts are empty (n_blocks 0) but for q8. */
typedef struct adam_state_layout {
    uint64_t n;            /* parameters */
    uint64_t n_blocks;     /* q8: ceil(n / block) absmax values per moment */
    uint64_t off_m, off_v; /* m and v: fp32, bf16 or u8 codes [n] */
    uint64_t off_absmax_m; /* q8: fp32 [n_blocks] */
    uint64_t off_absmax_v; /* q8: fp32 [n_blocks] */
    uint64_t bytes;        /* the whole buffer: adam_state_bytes(kind, n) */
} adam_state_layout;

zo_status adam_state_layout_of(adam_state_kind kind, uint64_t n, adam_state_layout *out);
/* Bytes of the state of n parameters (0 for an invalid kind). */
uint64_t adam_state_bytes(adam_state_kind kind, uint64_t n);
/* Bytes per parameter for large n: 8, 4, 2 + 8/block. */
double adam_state_bytes_per_param(adam_state_kind kind);

/* Write the zero state of n parameters (moments 0, q8 absmax 0). */
zo_status adam_state_init(adam_state_kind kind, void *state, uint64_t n, int nthreads);

/* One optimizer step over n parameters whose moments are the encoded state:
 * adam_update's arguments, with `state` in place of m and v. ADAM_STATE_F32
 * is adam_update itself on the buffer's two arrays. Threads take whole
 * blocks (q8) or chunks of 64 elements, so the result does not depend on the
 * thread count. ZO_ERR_INVALID as adam_update, and for a bad kind, a state
 * not ADAM_STATE_ALIGN-aligned, or a state overlapping another array. */
zo_status adam_state_update(const adam_hparams *hp, adam_state_kind kind, size_t n,
                            float *param, const void *grad, zo_dtype grad_dtype, void *state,
                            void *out16, zo_dtype out_dtype, int nthreads);
zo_status adam_state_update_impl(adam_impl impl, const adam_hparams *hp, adam_state_kind kind,
                                 size_t n, float *param, const void *grad, zo_dtype grad_dtype,
                                 void *state, void *out16, zo_dtype out_dtype, int nthreads);

/* The moments as fp32 (for checkpoints and conversions): exact for every
 * encoding (q8: map[code] * absmax, as the step dequantizes). */
zo_status adam_state_to_f32(adam_state_kind kind, const void *state, uint64_t n, float *m,
                            float *v, int nthreads);
/* Encode fp32 moments as the step stores them (bf16: round to nearest even;
 * q8: per block absmax and nearest codes). Converting between encodings is
 * to_f32 then from_f32. ZO_ERR_INVALID for a v below zero (named by index). */
zo_status adam_state_from_f32(adam_state_kind kind, void *state, uint64_t n, const float *m,
                              const float *v, int nthreads);
/* The step and the conversions over elements [first, first + n) of the
 * state of `total` parameters in `state` (a part of a buffer, as the
 * runtime's chunks are updated piece by piece): param, grad, out16, m and v
 * point at element `first`; the rest of the buffer is left as it is. q8:
 * first is a multiple of the block, and first + n too unless it is total
 * (whole blocks, each with its absmax); any range for bf16 and fp32. The
 * bits are those of the whole-buffer calls on the same elements.
 * ZO_ERR_INVALID as those, and for a range outside the state or (q8) not
 * of whole blocks. */
zo_status adam_state_update_range(const adam_hparams *hp, adam_state_kind kind, size_t total, size_t first,
                                  size_t n, float *param, const void *grad, zo_dtype grad_dtype, void *state,
                                  void *out16, zo_dtype out_dtype, int nthreads);
zo_status adam_state_to_f32_range(adam_state_kind kind, const void *state, uint64_t total, uint64_t first,
                                  uint64_t n, float *m, float *v, int nthreads);
zo_status adam_state_from_f32_range(adam_state_kind kind, void *state, uint64_t total, uint64_t first,
                                    uint64_t n, const float *m, const float *v, int nthreads);
/* The same with a chosen implementation (every one gives the scalar one's
 * bits; ZO_ERR_UNSUPPORTED where the CPU cannot run it): tests and benches. */
zo_status adam_state_to_f32_impl(adam_impl impl, adam_state_kind kind, const void *state,
                                 uint64_t n, float *m, float *v, int nthreads);
zo_status adam_state_from_f32_impl(adam_impl impl, adam_state_kind kind, void *state, uint64_t n,
                                   const float *m, const float *v, int nthreads);

#endif
