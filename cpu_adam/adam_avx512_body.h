/* The AVX-512 kernels, written once and compiled twice: adam_avx512.c
 * (F/BW/VL, bf16 rounded with integer operations) and adam_avx512_bf16.c
 * (adds AVX512-BF16's vcvtneps2bf16). Each including file sets its target
 * pragma and defines:
 *   ADAM_AVX512_NATIVE_BF16  0 or 1
 * and the names of the kernels it wants compiled (the others are left out):
 *   ADAM_AVX512_UPDATE       the update over fp32 state
 *   ADAM_AVX512_BF16S        the update over bf16 state
 *   ADAM_AVX512_SUMSQ        the sum of squares
 *   ADAM_AVX512_SUMSQ_PART   ... taken in pieces
 *   ADAM_AVX512_BF16_DECODE  bf16 state to fp32 (adam_state_to_f32)
 *   ADAM_AVX512_BF16_ENCODE  fp32 to bf16 state (adam_state_from_f32)
 * (adam_q8_avx512.c includes it for the helpers alone.) Only cpu_adam.c and
 * adam_state.c call these, and only after cpuid said the CPU has the ISA. */
#include <immintrin.h>
#include <stdint.h>

#include "adam_kernels.h" /* adam_consts, adam_step_elem order */

#define ADAM_INLINE static inline __attribute__((always_inline))

/* Broadcast step constants. */
typedef struct avx512_k {
    __m512 gm, b1, omb1, b2, omb2, eps, l2, lr_wd, step, ibc2;
} avx512_k;

/* 16 gradients from element i of g, as fp32 (lanes outside k are 0). */
ADAM_INLINE __m512 avx512_load_grad(const void *g, size_t i, const zo_dtype gd, __mmask16 k,
                                    const int masked)
{
    if (gd == ZO_DTYPE_F32) {
        const float *s = (const float *)g + i;
        return masked ? _mm512_maskz_loadu_ps(k, s) : _mm512_loadu_ps(s);
    }
    const uint16_t *s = (const uint16_t *)g + i;
    __m256i h = masked ? _mm256_maskz_loadu_epi16(k, s) : _mm256_loadu_si256((const __m256i *)s);
    if (gd == ZO_DTYPE_F16) return _mm512_cvtph_ps(h); /* exact */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* bf16: exact */
}

/* bf16 round to nearest even with integer operations, as zo_f32_to_bf16:
 * nan keeps its sign and becomes quiet, everything else rounds (32 -> 16 bits
 * per lane, in the low half). */
ADAM_INLINE __m512i avx512_bf16_round(__m512 x)
{
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    __m512i u = _mm512_castps_si512(x);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
}

/* 16 fp32 -> 16 bf16, round to nearest even, bit-identical with
 * zo_f32_to_bf16. */
ADAM_INLINE __m256i avx512_to_bf16(__m512 x)
{
#if ADAM_AVX512_NATIVE_BF16
    /* vcvtneps2bf16 rounds to nearest even and quiets nan like the reference,
     * but flushes fp32 subnormal inputs to zero; redo those lanes (rare). */
    __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
    __m512i u = _mm512_castps_si512(x);
    __mmask16 sub = _mm512_mask_test_epi32_mask(
        _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)), u,
        _mm512_set1_epi32(0x007fffff));
    if (__builtin_expect(sub != 0, 0))
        h = _mm256_mask_blend_epi16(sub, h, _mm512_cvtepi32_epi16(avx512_bf16_round(x)));
    return h;
#else
    return _mm512_cvtepi32_epi16(avx512_bf16_round(x));
#endif
}

/* The update of 16 lanes: adam_step_elem's operations in its order. */
ADAM_INLINE void avx512_adam(const avx512_k *K, __m512 *pp, __m512 *mm, __m512 *vv, __m512 gg, const int l2)
{
    ADAM_VECTOR_STEP(_mm512, K, *pp, *mm, *vv, gg, l2);
}

/* Store 16 lanes of the 16-bit copy at element i of out (lanes in k when
 * masked; nt: a non-temporal store, 32-byte aligned, unmasked only). */
ADAM_INLINE void avx512_store16(void *restrict out, size_t i, __m512 pp, const int od,
                                __mmask16 k, const int masked, const int nt)
{
    __m256i h = od == OUT_F16 ? _mm512_cvtps_ph(pp, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                              : avx512_to_bf16(pp);
    uint16_t *o = (uint16_t *)out + i;
    if (masked) _mm256_mask_storeu_epi16(o, k, h);
    else if (nt) _mm256_stream_si256((__m256i *)o, h);
    else _mm256_storeu_si256((__m256i *)o, h);
}

/* How m and v are stored: fp32 (adam_update) or bf16 (ADAM_STATE_BF16). */
enum { ST_F32 = 0, ST_BF16 };

/* 16 moments from element i of a state array of type sm, as fp32. */
ADAM_INLINE __m512 avx512_load_moment(const void *x, size_t i, const int sm, __mmask16 k,
                                      const int masked)
{
    if (sm == ST_F32) {
        const float *s = (const float *)x + i;
        return masked ? _mm512_maskz_loadu_ps(k, s) : _mm512_loadu_ps(s);
    }
    return avx512_load_grad(x, i, ZO_DTYPE_BF16, k, masked);
}

ADAM_INLINE void avx512_store_moment(void *x, size_t i, __m512 val, const int sm, __mmask16 k,
                                     const int masked)
{
    if (sm == ST_F32) {
        float *d = (float *)x + i;
        if (masked) _mm512_mask_storeu_ps(d, k, val);
        else _mm512_storeu_ps(d, val);
        return;
    }
    uint16_t *d = (uint16_t *)x + i;
    if (masked) _mm256_mask_storeu_epi16(d, k, avx512_to_bf16(val));
    else _mm256_storeu_si256((__m256i *)d, avx512_to_bf16(val));
}

/* Elements [i, i + 16) (lanes in k when masked): the sequence of
 * adam_step_elem, lane by lane, with m and v stored as sm. nt: write the
 * 16-bit copy with a non-temporal store. */
ADAM_INLINE void avx512_span(const avx512_k *K, size_t i, __mmask16 k, const int masked,
                             float *restrict p, const void *restrict g, const zo_dtype gd,
                             void *restrict m, void *restrict v, const int sm,
                             void *restrict out, const int od, const int l2, const int nt)
{
    __m512 pp = masked ? _mm512_maskz_loadu_ps(k, p + i) : _mm512_loadu_ps(p + i);
    __m512 mm = avx512_load_moment(m, i, sm, k, masked);
    __m512 vv = avx512_load_moment(v, i, sm, k, masked);
    avx512_adam(K, &pp, &mm, &vv, avx512_load_grad(g, i, gd, k, masked), l2);
    if (masked) _mm512_mask_storeu_ps(p + i, k, pp);
    else _mm512_storeu_ps(p + i, pp);
    avx512_store_moment(m, i, mm, sm, k, masked);
    avx512_store_moment(v, i, vv, sm, k, masked);
    if (od != OUT_NONE) avx512_store16(out, i, pp, od, k, masked, nt);
}

ADAM_INLINE void avx512_update_t(const adam_consts *c, size_t n, float *restrict p,
                                 const void *restrict g, const zo_dtype gd, void *restrict m,
                                 void *restrict v, const int sm, void *restrict out,
                                 const int od, const int l2)
{
    avx512_k K = ADAM_BROADCAST(_mm512_set1_ps, c);
    /* Peel up to 15 elements so the fp32 arrays' full vectors start on a
     * 64-byte line (they share an alignment when the caller's arrays do). */
    size_t head = ((64 - ((uintptr_t)p & 63)) & 63) / 4;
    if (head > n) head = n;
    if (head)
        avx512_span(&K, 0, (__mmask16)((1u << head) - 1), 1, p, g, gd, m, v, sm, out, od, l2, 0);
    size_t i = head;
    /* The copy is written once and next read by a DMA to the GPU: stream it
     * past the cache, which also saves reading its lines first (2 of 30
     * bytes per parameter), when its full vectors are 32-byte aligned. */
    if (od != OUT_NONE && ((uintptr_t)((uint16_t *)out + head) & 31) == 0) {
        for (; i + 16 <= n; i += 16)
            avx512_span(&K, i, 0xffff, 0, p, g, gd, m, v, sm, out, od, l2, 1);
        _mm_sfence(); /* order the streamed lines before what follows */
    } else {
        for (; i + 16 <= n; i += 16)
            avx512_span(&K, i, 0xffff, 0, p, g, gd, m, v, sm, out, od, l2, 0);
    }
    if (i < n)
        avx512_span(&K, i, (__mmask16)((1u << (n - i)) - 1), 1, p, g, gd, m, v, sm, out, od, l2,
                    0);
}

#ifdef ADAM_AVX512_UPDATE
void ADAM_AVX512_UPDATE(const adam_consts *c, size_t n, float *restrict p, const void *restrict g,
                        zo_dtype gd, float *restrict m, float *restrict v, void *restrict out,
                        zo_dtype od)
{
#define CALL(GD, OD, L2) avx512_update_t(c, n, p, g, GD, m, v, ST_F32, out, OD, L2)
    ADAM_DISPATCH(gd, out, od, c->use_l2, CALL)
#undef CALL
}
#endif

#ifdef ADAM_AVX512_BF16S
void ADAM_AVX512_BF16S(const adam_consts *c, size_t n, float *restrict p, const void *restrict g,
                       zo_dtype gd, uint16_t *restrict m, uint16_t *restrict v,
                       void *restrict out, zo_dtype od)
{
#define CALL(GD, OD, L2) avx512_update_t(c, n, p, g, GD, m, v, ST_BF16, out, OD, L2)
    ADAM_DISPATCH(gd, out, od, c->use_l2, CALL)
#undef CALL
}
#endif

#ifdef ADAM_AVX512_BF16_DECODE
/* adam_state_to_f32 on bf16 state: widen (exact). */
void ADAM_AVX512_BF16_DECODE(size_t n, const uint16_t *restrict qm, const uint16_t *restrict qv,
                             float *restrict m, float *restrict v)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(m + i, avx512_load_grad(qm, i, ZO_DTYPE_BF16, 0xffff, 0));
        _mm512_storeu_ps(v + i, avx512_load_grad(qv, i, ZO_DTYPE_BF16, 0xffff, 0));
    }
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(m + i, k, avx512_load_grad(qm, i, ZO_DTYPE_BF16, k, 1));
        _mm512_mask_storeu_ps(v + i, k, avx512_load_grad(qv, i, ZO_DTYPE_BF16, k, 1));
    }
}
#endif

#ifdef ADAM_AVX512_BF16_ENCODE
/* adam_state_from_f32 on bf16 state: the step's rounding (avx512_to_bf16). */
void ADAM_AVX512_BF16_ENCODE(size_t n, const float *restrict m, const float *restrict v,
                             uint16_t *restrict qm, uint16_t *restrict qv)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        avx512_store_moment(qm, i, _mm512_loadu_ps(m + i), ST_BF16, 0xffff, 0);
        avx512_store_moment(qv, i, _mm512_loadu_ps(v + i), ST_BF16, 0xffff, 0);
    }
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        avx512_store_moment(qm, i, _mm512_maskz_loadu_ps(k, m + i), ST_BF16, k, 1);
        avx512_store_moment(qv, i, _mm512_maskz_loadu_ps(k, v + i), ST_BF16, k, 1);
    }
}
#endif

#ifdef ADAM_AVX512_SUMSQ
/* 8 gradients from element i of g widened to double (exactly), lanes
 * outside k 0. */
ADAM_INLINE __m512d avx512_load8_pd(const void *g, size_t i, const zo_dtype gd, __mmask8 k,
                                    const int masked)
{
    __m256 x;
    if (gd == ZO_DTYPE_F32) {
        const float *s = (const float *)g + i;
        x = masked ? _mm256_maskz_loadu_ps(k, s) : _mm256_loadu_ps(s);
    } else {
        const uint16_t *s = (const uint16_t *)g + i;
        __m128i h = masked ? _mm_maskz_loadu_epi16(k, s) : _mm_loadu_si128((const __m128i *)s);
        x = gd == ZO_DTYPE_F16 ? _mm256_cvtph_ps(h)
                               : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm512_cvtps_pd(x);
}

/* Sum of squares in double: element i into lane i % 8 of accumulator
 * (i / 8) % 8 (eight, so the FMA latency chain does not bound the loop),
 * the tail into the first, then the accumulators added by a fixed tree.
 * The squares are exact (an fp32 value has 24 significant bits, its square
 * 48 of double's 53) and the FMA rounds only the addition. A sum of finite
 * fp32 squares cannot overflow a double: an inf or a nan in the result is
 * one in the input. Taken in pieces (adam_sumsq_acc): the accumulators
 * carried from one call to the next, every piece but the last a multiple
 * of 64 elements, so the pieces give the bits of one call over them all. */
ADAM_INLINE double avx512_sumsq_t(adam_sumsq_acc *acc, const void *g, const zo_dtype gd, size_t n, int last)
{
    const size_t gs = gd == ZO_DTYPE_F32 ? 4 : 2; /* bytes an element; 64 elements: gs lines */
    __m512d a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm512_loadu_pd(acc->lane + 8 * k);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const char *ahead = (const char *)g + i * gs + ADAM_SUMSQ_PREFETCH;
        for (size_t l = 0; l < gs; l++) _mm_prefetch(ahead + 64 * l, _MM_HINT_T0);
        for (int k = 0; k < 8; k++) {
            __m512d x = avx512_load8_pd(g, i + 8 * (size_t)k, gd, 0xff, 0);
            a[k] = _mm512_fmadd_pd(x, x, a[k]);
        }
    }
    if (!last) { /* (n a multiple of 64: no tail) */
        for (int k = 0; k < 8; k++) _mm512_storeu_pd(acc->lane + 8 * k, a[k]);
        return 0.0;
    }
    for (; i < n; i += 8) {
        size_t r = n - i < 8 ? n - i : 8;
        __m512d x = avx512_load8_pd(g, i, gd, (__mmask8)((1u << r) - 1), 1);
        a[0] = _mm512_fmadd_pd(x, x, a[0]);
    }
    __m512d s = _mm512_add_pd(_mm512_add_pd(_mm512_add_pd(a[0], a[1]), _mm512_add_pd(a[2], a[3])),
                              _mm512_add_pd(_mm512_add_pd(a[4], a[5]), _mm512_add_pd(a[6], a[7])));
    return _mm512_reduce_add_pd(s);
}

double ADAM_AVX512_SUMSQ_PART(adam_sumsq_acc *acc, const void *g, zo_dtype gd, size_t n, int last)
{
    switch (gd) {
    case ZO_DTYPE_F16: return avx512_sumsq_t(acc, g, ZO_DTYPE_F16, n, last);
    case ZO_DTYPE_BF16: return avx512_sumsq_t(acc, g, ZO_DTYPE_BF16, n, last);
    default: return avx512_sumsq_t(acc, g, ZO_DTYPE_F32, n, last);
    }
}

double ADAM_AVX512_SUMSQ(const void *g, zo_dtype gd, size_t n)
{
    adam_sumsq_acc acc = {{0}};
    return ADAM_AVX512_SUMSQ_PART(&acc, g, gd, n, 1);
}
#endif
