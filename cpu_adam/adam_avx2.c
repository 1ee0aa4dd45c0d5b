/* AVX2 + F16C (+ FMA, only in the sum of squares) kernels, 8 lanes. Built for that ISA whatever the compiler's
 * default; called only when cpuid says the CPU has it. The head (to align the
 * fp32 arrays on 32 bytes) and the tail run the scalar sequence, which gives
 * the same bits. */
#pragma GCC target("avx2,f16c,fma")

#include <immintrin.h>
#include <stdint.h>

#include "adam_kernels.h" /* adam_consts, adam_update_scalar_range */

#define ADAM_INLINE static inline __attribute__((always_inline))

typedef struct avx2_k {
    __m256 gm, b1, omb1, b2, omb2, eps, l2, lr_wd, step, ibc2;
} avx2_k;

/* 8 gradients from element i of g, as fp32. */
ADAM_INLINE __m256 avx2_load_grad(const void *g, size_t i, const zo_dtype gd)
{
    if (gd == ZO_DTYPE_F32) return _mm256_loadu_ps((const float *)g + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
    if (gd == ZO_DTYPE_F16) return _mm256_cvtph_ps(h); /* exact */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); /* bf16 */
}

/* 8 fp32 -> 8 bf16, round to nearest even as zo_f32_to_bf16 (nan: sign
 * kept, made quiet). */
ADAM_INLINE __m128i avx2_to_bf16(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                             _mm256_and_si256(hi, _mm256_set1_epi32(1)))),
        16);
    __m256i nanv = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, nanv, nan);
    /* lanes hold 0..0xffff, so the unsigned saturating pack is exact */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* Elements [i, i + 8): the sequence of adam_step_elem, lane by lane. nt:
 * write the 16-bit copy with a non-temporal store (16-byte aligned). */
ADAM_INLINE void avx2_span(const avx2_k *K, size_t i, float *restrict p, const void *restrict g,
                           const zo_dtype gd, float *restrict m, float *restrict v,
                           void *restrict out, const int od, const int l2, const int nt)
{
    __m256 pp = _mm256_loadu_ps(p + i);
    __m256 mm = _mm256_loadu_ps(m + i);
    __m256 vv = _mm256_loadu_ps(v + i);
    __m256 gg = avx2_load_grad(g, i, gd);

    gg = _mm256_mul_ps(gg, K->gm);
    if (l2) gg = _mm256_add_ps(gg, _mm256_mul_ps(K->l2, pp));
    mm = _mm256_add_ps(_mm256_mul_ps(K->b1, mm), _mm256_mul_ps(K->omb1, gg));
    vv = _mm256_add_ps(_mm256_mul_ps(K->b2, vv), _mm256_mul_ps(K->omb2, _mm256_mul_ps(gg, gg)));
    __m256 d = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vv), K->ibc2), K->eps);
    if (!l2) pp = _mm256_sub_ps(pp, _mm256_mul_ps(K->lr_wd, pp));
    pp = _mm256_sub_ps(pp, _mm256_mul_ps(K->step, _mm256_div_ps(mm, d)));

    _mm256_storeu_ps(p + i, pp);
    _mm256_storeu_ps(m + i, mm);
    _mm256_storeu_ps(v + i, vv);
    if (od != OUT_NONE) {
        __m128i h = od == OUT_F16 ? _mm256_cvtps_ph(pp, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                  : avx2_to_bf16(pp);
        if (nt) _mm_stream_si128((__m128i *)((uint16_t *)out + i), h);
        else _mm_storeu_si128((__m128i *)((uint16_t *)out + i), h);
    }
}

ADAM_INLINE void avx2_update_t(const adam_consts *c, size_t n, float *restrict p,
                               const void *restrict g, const zo_dtype gd, float *restrict m,
                               float *restrict v, void *restrict out, const int od, const int l2)
{
    avx2_k K = {
        .gm = _mm256_set1_ps(c->grad_mult),
        .b1 = _mm256_set1_ps(c->beta1),
        .omb1 = _mm256_set1_ps(c->omb1),
        .b2 = _mm256_set1_ps(c->beta2),
        .omb2 = _mm256_set1_ps(c->omb2),
        .eps = _mm256_set1_ps(c->eps),
        .l2 = _mm256_set1_ps(c->l2),
        .lr_wd = _mm256_set1_ps(c->lr_wd),
        .step = _mm256_set1_ps(c->step_size),
        .ibc2 = _mm256_set1_ps(c->inv_bc2_sqrt),
    };
    zo_dtype odt = od == OUT_BF16 ? ZO_DTYPE_BF16 : ZO_DTYPE_F16;
    void *o = od == OUT_NONE ? NULL : out;
    size_t head = ((32 - ((uintptr_t)p & 31)) & 31) / 4;
    if (head > n) head = n;
    adam_update_scalar_range(c, 0, head, p, g, gd, m, v, o, odt);
    size_t i = head;
    /* stream the copy past the cache when its vectors are aligned (see
     * adam_avx512_body.h) */
    if (od != OUT_NONE && ((uintptr_t)((uint16_t *)out + head) & 15) == 0) {
        for (; i + 8 <= n; i += 8) avx2_span(&K, i, p, g, gd, m, v, out, od, l2, 1);
        _mm_sfence();
    } else {
        for (; i + 8 <= n; i += 8) avx2_span(&K, i, p, g, gd, m, v, out, od, l2, 0);
    }
    adam_update_scalar_range(c, i, n, p, g, gd, m, v, o, odt);
}

ADAM_SPECIALIZED_UPDATE(adam_update_avx2, avx2_update_t)

/* Squares of 8 fp32 lanes widened to double, added into two accumulators. */
ADAM_INLINE void avx2_sq_acc(__m256 x, __m256d *a, __m256d *b)
{
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    *a = _mm256_fmadd_pd(lo, lo, *a);
    *b = _mm256_fmadd_pd(hi, hi, *b);
}

/* Elements per block: 16 squares per lane in each of four fp32 accumulators. */
#define AVX2_SQ_BLOCK 512

/* As avx512_sumsq_t: fp32 sums over blocks (relative error below 2e-6),
 * added in double; a block whose fp32 sum is not finite is summed again in
 * double; the tail is summed in double. */
ADAM_INLINE double avx2_sumsq_t(const void *g, const zo_dtype gd, size_t n)
{
    __m256d a = _mm256_setzero_pd(), b = a;
    const __m256 inf = _mm256_set1_ps(__builtin_inff());
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    size_t i = 0;
    for (; i + AVX2_SQ_BLOCK <= n; i += AVX2_SQ_BLOCK) {
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        for (size_t j = i; j < i + AVX2_SQ_BLOCK; j += 32) {
            __m256 x0 = avx2_load_grad(g, j, gd), x1 = avx2_load_grad(g, j + 8, gd);
            __m256 x2 = avx2_load_grad(g, j + 16, gd), x3 = avx2_load_grad(g, j + 24, gd);
            s0 = _mm256_fmadd_ps(x0, x0, s0);
            s1 = _mm256_fmadd_ps(x1, x1, s1);
            s2 = _mm256_fmadd_ps(x2, x2, s2);
            s3 = _mm256_fmadd_ps(x3, x3, s3);
        }
        __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
        __m256 fin = _mm256_cmp_ps(_mm256_and_ps(s, absmask), inf, _CMP_LT_OQ);
        if (__builtin_expect(_mm256_movemask_ps(fin) == 0xff, 1)) {
            a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm256_castps256_ps128(s)));
            b = _mm256_add_pd(b, _mm256_cvtps_pd(_mm256_extractf128_ps(s, 1)));
        } else {
            for (size_t j = i; j < i + AVX2_SQ_BLOCK; j += 8) avx2_sq_acc(avx2_load_grad(g, j, gd), &a, &b);
        }
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(a, b));
    double t = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; i++) {
        double x = zo_load_f32(g, gd, i);
        t += x * x;
    }
    return t;
}

double adam_sumsq_avx2(const void *g, zo_dtype gd, size_t n)
{
    switch (gd) {
    case ZO_DTYPE_F16: return avx2_sumsq_t(g, ZO_DTYPE_F16, n);
    case ZO_DTYPE_BF16: return avx2_sumsq_t(g, ZO_DTYPE_BF16, n);
    default: return avx2_sumsq_t(g, ZO_DTYPE_F32, n);
    }
}
