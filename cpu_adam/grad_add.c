/* The gradient sum's addition (adam_grad_accumulate): acc [n] fp32 =
 * (fresh ? 0 : acc) + grad [n] widened to fp32. Scalar, AVX2/F16C (8 lanes)
 * and AVX-512 (16 lanes) loops, each performing the scalar one's single fp32
 * addition per element (widening fp16 and bf16 is exact), so the bits do
 * not depend on the implementation or on how the threads split the array.
 * Memory-bound: a fresh sum is written without being read (no memset, no
 * read-for-add), and the team is the CPU Adam's (nthreads, chunks of 64
 * elements, one thread below two ADAM_ACC_MIN_CHUNKs).
 *
 * adam_grad_accumulate_stats also takes the new sum's statistics in the
 * same pass: each piece of ADAM_ACC_STATS_PIECE elements is added, then
 * its squares summed while it is in L1, the sum-of-squares kernel's
 * accumulators carried from piece to piece (adam_sumsq_part_fn), over the
 * ranges adam_grad_stats would give its threads: the bits of
 * adam_grad_stats over the sum afterwards, without reading it again. */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include <immintrin.h>

#include "adam_kernels.h" /* adam_chunk */
#include "cpu_adam.h"

typedef void (*acc_fn)(float *restrict acc, const void *restrict g, zo_dtype gd, size_t n, int fresh);

/* The reference: the loop the runtime ran before (zeroing then adding). */
static void acc_scalar(float *restrict acc, const void *restrict g, zo_dtype gd, size_t n, int fresh)
{
    const float zero = 0.0f;
    for (size_t i = 0; i < n; i++) acc[i] = (fresh ? zero : acc[i]) + zo_load_f32(g, gd, i);
}

#define ACC_INLINE static inline __attribute__((always_inline))

/* 8 gradients from element i as fp32 (exact). */
__attribute__((target("avx2,f16c"))) ACC_INLINE __m256 acc_load8(const void *g, size_t i, const zo_dtype gd)
{
    if (gd == ZO_DTYPE_F32) return _mm256_loadu_ps((const float *)g + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
    if (gd == ZO_DTYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The body with the dtype and fresh as constants (one loop each). */
__attribute__((target("avx2,f16c"))) ACC_INLINE void acc_avx2_body(float *restrict acc, const void *restrict g,
                                                                    const zo_dtype gd, size_t n, const int fresh)
{
    size_t i = 0;
    const __m256 zero = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m256 a0 = fresh ? zero : _mm256_loadu_ps(acc + i), a1 = fresh ? zero : _mm256_loadu_ps(acc + i + 8);
        _mm256_storeu_ps(acc + i, _mm256_add_ps(a0, acc_load8(g, i, gd)));
        _mm256_storeu_ps(acc + i + 8, _mm256_add_ps(a1, acc_load8(g, i + 8, gd)));
    }
    acc_scalar(acc + i, (const char *)g + i * zo_dtype_size(gd), gd, n - i, fresh);
}

/* 16 gradients from element i as fp32 (lanes outside k 0). */
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) ACC_INLINE __m512 acc_load16(const void *g, size_t i,
                                                                                       const zo_dtype gd, __mmask16 k)
{
    if (gd == ZO_DTYPE_F32) return _mm512_maskz_loadu_ps(k, (const float *)g + i);
    __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)g + i);
    if (gd == ZO_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The tail in one masked vector: the masked-off lanes are neither read nor written. */
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) ACC_INLINE void
acc_avx512_body(float *restrict acc, const void *restrict g, const zo_dtype gd, size_t n, const int fresh)
{
    size_t i = 0;
    const __m512 zero = _mm512_setzero_ps();
    const __mmask16 all = 0xffff;
    for (; i + 32 <= n; i += 32) {
        __m512 a0 = fresh ? zero : _mm512_loadu_ps(acc + i), a1 = fresh ? zero : _mm512_loadu_ps(acc + i + 16);
        _mm512_storeu_ps(acc + i, _mm512_add_ps(a0, acc_load16(g, i, gd, all)));
        _mm512_storeu_ps(acc + i + 16, _mm512_add_ps(a1, acc_load16(g, i + 16, gd, all)));
    }
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? all : (__mmask16)((1u << (n - i)) - 1u);
        __m512 a = fresh ? zero : _mm512_maskz_loadu_ps(k, acc + i);
        _mm512_mask_storeu_ps(acc + i, k, _mm512_add_ps(a, acc_load16(g, i, gd, k)));
    }
}

/* An entry point for the ISA `TARGET`: BODY with the dtype and fresh as
 * constants, one loop for each of the six. */
#define ACC_ENTRY(NAME, BODY, TARGET)                                                                            \
    __attribute__((target(TARGET))) static void NAME(float *restrict acc, const void *restrict g, zo_dtype gd,   \
                                                     size_t n, int fresh)                                        \
    {                                                                                                            \
        if (gd == ZO_DTYPE_F32) fresh ? BODY(acc, g, ZO_DTYPE_F32, n, 1) : BODY(acc, g, ZO_DTYPE_F32, n, 0);     \
        else if (gd == ZO_DTYPE_F16) fresh ? BODY(acc, g, ZO_DTYPE_F16, n, 1) : BODY(acc, g, ZO_DTYPE_F16, n, 0); \
        else fresh ? BODY(acc, g, ZO_DTYPE_BF16, n, 1) : BODY(acc, g, ZO_DTYPE_BF16, n, 0);                     \
    }
ACC_ENTRY(acc_avx2, acc_avx2_body, "avx2,f16c")
ACC_ENTRY(acc_avx512, acc_avx512_body, "avx512f,avx512bw,avx512vl,f16c")

static acc_fn acc_pick(adam_impl impl)
{
    switch (impl) {
    case ADAM_IMPL_AVX2: return acc_avx2;
    case ADAM_IMPL_AVX512:
    case ADAM_IMPL_AVX512_NO_BF16: return acc_avx512;
    default: return acc_scalar;
    }
}

int adam_grad_accumulate_threads(size_t n, int nthreads)
{
    size_t t = nthreads > 0 ? (size_t)nthreads : (size_t)omp_get_max_threads();
    size_t most = n / ADAM_ACC_MIN_CHUNK;
    if (t > most) t = most;
    return t < 1 ? 1 : (int)t;
}

/* The arguments of a sum into acc: impl resolved, the gradient's dtype,
 * n, the arrays' sizes and alignment (nothing to check past n == 0). */
static zo_status acc_check(const char *who, adam_impl *impl, float *acc, const void *grad, zo_dtype grad_dtype,
                           size_t n)
{
    zo_status st;
    if ((st = adam_resolve_impl(who, *impl, impl)) != ZO_OK) return st;
    if ((int)grad_dtype < 0 || grad_dtype >= ZO_DTYPE_COUNT)
        return zo_error(ZO_ERR_INVALID, "%s: grad_dtype %d is not fp32, fp16 or bf16", who, (int)grad_dtype);
    if (n == 0) return ZO_OK;
    if (n > SIZE_MAX / 4) return zo_error(ZO_ERR_INVALID, "%s: n = %zu too large", who, n);
    size_t gs = zo_dtype_size(grad_dtype);
    adam_array arr[2] = {{"acc", acc, 4 * n, 4}, {"grad", (void *)grad, gs * n, gs}};
    return adam_check_arrays(who, arr, 2, 0);
}

zo_status adam_grad_accumulate_impl(adam_impl impl, float *acc, const void *grad, zo_dtype grad_dtype, size_t n,
                                    int fresh, int nthreads)
{
    const char *who = "adam_grad_accumulate";
    zo_status st;
    if ((st = acc_check(who, &impl, acc, grad, grad_dtype, n)) != ZO_OK || n == 0) return st;
    size_t gs = zo_dtype_size(grad_dtype);
    acc_fn fn = acc_pick(impl);
    int nt = adam_grad_accumulate_threads(n, nthreads);
    if (nt == 1) {
        fn(acc, grad, grad_dtype, n, fresh);
        return ZO_OK;
    }
#pragma omp parallel num_threads(nt)
    {
        size_t lo, hi;
        adam_chunk(n, 64, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        if (hi > lo) fn(acc + lo, (const char *)grad + lo * gs, grad_dtype, hi - lo, fresh);
    }
    return ZO_OK;
}

/* Elements added, then squared, at a time: 16 KiB of fp32 sums, in L1;
 * a multiple of 64 (adam_sumsq_part_fn's pieces). */
#define ADAM_ACC_STATS_PIECE ((size_t)4096)

static adam_sumsq_part_fn sumsq_part_pick(adam_impl impl)
{
    switch (impl) {
    case ADAM_IMPL_AVX2: return adam_sumsq_part_avx2;
    case ADAM_IMPL_AVX512:
    case ADAM_IMPL_AVX512_NO_BF16: return adam_sumsq_part_avx512;
    default: return adam_sumsq_part_scalar;
    }
}

/* [lo, hi) added, then its sum of squares (one of adam_grad_stats' ranges). */
static double acc_stats_range(acc_fn fn, adam_sumsq_part_fn sq, float *acc, const void *grad, zo_dtype gd,
                              size_t gs, size_t lo, size_t hi, int fresh)
{
    adam_sumsq_acc a = {{0}};
    double s = 0.0;
    for (size_t i = lo; i < hi; i += ADAM_ACC_STATS_PIECE) {
        size_t k = hi - i < ADAM_ACC_STATS_PIECE ? hi - i : ADAM_ACC_STATS_PIECE;
        fn(acc + i, (const char *)grad + i * gs, gd, k, fresh);
        s = sq(&a, acc + i, ZO_DTYPE_F32, k, i + k == hi);
    }
    return s;
}

zo_status adam_grad_accumulate_stats_impl(adam_impl impl, float *acc, const void *grad, zo_dtype grad_dtype,
                                          size_t n, int fresh, int nthreads, int stats_threads, double *sumsq,
                                          int *nonfinite)
{
    const char *who = "adam_grad_accumulate_stats";
    zo_status st;
    if (!sumsq || !nonfinite)
        return zo_error(ZO_ERR_INVALID, "%s: NULL result pointer (sumsq %p, nonfinite %p)", who, (void *)sumsq,
                        (void *)nonfinite);
    *sumsq = 0.0;
    *nonfinite = 0;
    if ((st = acc_check(who, &impl, acc, grad, grad_dtype, n)) != ZO_OK || n == 0) return st;
    size_t gs = zo_dtype_size(grad_dtype);
    acc_fn fn = acc_pick(impl);
    adam_sumsq_part_fn sq = sumsq_part_pick(impl);
    /* adam_grad_stats' ranges (its team for stats_threads), each summed
     * apart; the accumulate's team takes them in turn */
    int nr = adam_plan_threads(n, stats_threads);
    if (nr > ADAM_MAX_THREADS) nr = ADAM_MAX_THREADS;
    int nt = adam_grad_accumulate_threads(n, nthreads);
    if (nt > nr) nt = nr;
    double part[ADAM_MAX_THREADS];
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int r = 0; r < nr; r++) {
        size_t lo, hi;
        adam_chunk(n, ADAM_GRAIN, r, nr, &lo, &hi);
        part[r] = hi > lo ? acc_stats_range(fn, sq, acc, grad, grad_dtype, gs, lo, hi, fresh) : 0.0;
    }
    double s = 0.0; /* (adam_grad_stats' order) */
    for (int r = 0; r < nr; r++) s += part[r];
    *sumsq = s;
    *nonfinite = !isfinite(s);
    return ZO_OK;
}

zo_status adam_grad_accumulate_stats(float *acc, const void *grad, zo_dtype grad_dtype, size_t n, int fresh,
                                     int nthreads, int stats_threads, double *sumsq, int *nonfinite)
{
    return adam_grad_accumulate_stats_impl(ADAM_IMPL_AUTO, acc, grad, grad_dtype, n, fresh, nthreads, stats_threads,
                                           sumsq, nonfinite);
}

zo_status adam_grad_accumulate(float *acc, const void *grad, zo_dtype grad_dtype, size_t n, int fresh, int nthreads)
{
    return adam_grad_accumulate_impl(ADAM_IMPL_AUTO, acc, grad, grad_dtype, n, fresh, nthreads);
}
