/* bf16 <-> fp32 on 8 AVX2 lanes: zo_bf16_to_f32 and zo_f32_to_bf16 (common/dtype.h)
 * bit for bit. For code built for AVX2 (a target attribute or pragma) and
 * run only where the CPU has it: common/dtype.c's rows, cpu_adam's AVX2
 * kernels. */
#ifndef ZO_COMMON_BF16_AVX2_H
#define ZO_COMMON_BF16_AVX2_H

#include <immintrin.h>

#define ZO_AVX2_INLINE static inline __attribute__((always_inline, target("avx2")))

/* 8 bf16 (the 128 bits of h) widened to fp32: exact. */
ZO_AVX2_INLINE __m256 zo_avx2_bf16_to_f32(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 fp32 (as their bits u) rounded to bf16, each in the low 16 bits of its
 * lane: a nan keeps its sign and top bits, made quiet; the rest round to
 * nearest even (no lane but a nan's sum wraps). */
ZO_AVX2_INLINE __m256i zo_avx2_round_bf16(__m256i u)
{
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i odd = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
    return _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}

/* 8 fp32 rounded to 8 bf16 (zo_avx2_round_bf16, packed: lanes hold
 * 0..0xffff, so the unsigned saturating pack is exact). */
ZO_AVX2_INLINE __m128i zo_avx2_f32_to_bf16(__m256 x)
{
    __m256i r = zo_avx2_round_bf16(_mm256_castps_si256(x));
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

#endif
