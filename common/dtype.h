/* Element types and scalar conversions between fp32 and the 16-bit formats.
 *
 * Every 16-bit conversion rounds to nearest, ties to even, and keeps inf and
 * nan (a nan stays a quiet nan). These scalar versions are the reference the
 * vectorized kernels are tested against bit for bit. */
#ifndef ZO_COMMON_DTYPE_H
#define ZO_COMMON_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "status.h"

typedef enum zo_dtype {
    ZO_DTYPE_F32 = 0,
    ZO_DTYPE_F16,
    ZO_DTYPE_BF16,
    ZO_DTYPE_COUNT,
} zo_dtype;

size_t zo_dtype_size(zo_dtype t);
const char *zo_dtype_name(zo_dtype t); /* "fp32", "fp16", "bf16" */
/* Accepts fp32|float32|f32, fp16|float16|f16|half, bf16|bfloat16. */
zo_status zo_dtype_parse(const char *s, zo_dtype *out);

static inline uint32_t zo_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float zo_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t zo_f32_to_bf16(float f)
{
    uint32_t u = zo_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* nan: keep sign, force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float zo_bf16_to_f32(uint16_t h) { return zo_bits_f32((uint32_t)h << 16); }

/* Stochastic rounding to bf16: f rounds up with probability (its distance
 * from the bf16 below, in the 16 bits dropped) / 2^16, given r uniform in
 * [0, 2^16) (the low 16 bits are used). Unbiased: E[bf16] = f. */
static inline uint16_t zo_f32_to_bf16_sr(float f, uint32_t r)
{
    uint32_t u = zo_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return zo_f32_to_bf16(f);
    return (uint16_t)((u + (r & 0xffffu)) >> 16);
}

static inline uint16_t zo_f32_to_f16(float f)
{
    uint32_t u = zo_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x0200u | ((a >> 13) & 0x3ffu) : 0u));
    if (a >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below the smallest normal half: subnormal or 0 */
        if (a < 0x33000000u) /* < 2^-25: rounds to zero (2^-25 ties to even 0) */
            return (uint16_t)sign;
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    /* normal: rebias exponent 127 -> 15 and round the 13 dropped bits */
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

static inline float zo_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1fu) return zo_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0) return zo_bits_f32(sign);
        /* subnormal: value = m * 2^-24 exactly */
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    return zo_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* Load element i of a buffer of type t as fp32, or store fp32 with rounding. */
static inline float zo_load_f32(const void *p, zo_dtype t, size_t i)
{
    switch (t) {
    case ZO_DTYPE_F16: return zo_f16_to_f32(((const uint16_t *)p)[i]);
    case ZO_DTYPE_BF16: return zo_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static inline void zo_store_f32(void *p, zo_dtype t, size_t i, float v)
{
    switch (t) {
    case ZO_DTYPE_F16: ((uint16_t *)p)[i] = zo_f32_to_f16(v); break;
    case ZO_DTYPE_BF16: ((uint16_t *)p)[i] = zo_f32_to_bf16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* Convert n elements between any two types: the bytes of zo_store_f32 of
 * zo_load_f32, element by element. fp32 to fp32 is a copy; bf16 to fp32 and
 * fp32 to bf16 run the rows below; the others are scalar loops. */
void zo_convert(void *dst, zo_dtype dt, const void *src, zo_dtype st, size_t n);

/* Rows of bf16 widened to fp32 and fp32 rounded to bf16: zo_bf16_to_f32 and
 * zo_f32_to_bf16 on each element, bit for bit, 8 (16) elements an AVX2
 * instruction where the CPU has AVX2, else the scalar loop. The sanitizer
 * build checks a vector's bytes once rather than each element's (the
 * scalar loops do not vectorize there). dst and src do not overlap, but
 * that a row may be narrowed in place (dst == src), as the scalar loop can. */
void zo_bf16_to_f32_row(float *dst, const uint16_t *src, size_t n);
void zo_f32_to_bf16_row(uint16_t *dst, const float *src, size_t n);
/* Whether the rows take the AVX2 path: 1 where the CPU has AVX2; set to 0
 * (tests) to run the scalar loops, to 1 to return to the CPU's choice.
 * Returns the setting in force before. */
int zo_convert_simd(int on);

/* memcpy of `bytes` by an OpenMP team of n_threads (0: OpenMP's default),
 * each thread a contiguous run of whole pieces of ZO_COPY_PIECE bytes; one
 * thread below two pieces. One thread's copy streams at a fraction of the
 * memory's rate (the H200 host's: about 7 GB/s a thread, 100 GB/s for
 * all), so a copy of gigabytes wants the team. */
#define ZO_COPY_PIECE ((size_t)1 << 20)
void zo_copy_team(void *dst, const void *src, size_t bytes, int n_threads);
/* memset of `bytes` by such a team: each thread also takes the first touch
 * (the page faults) of its own pieces, so a new allocation of gigabytes is
 * backed in parallel. */
void zo_memset_team(void *dst, int c, size_t bytes, int n_threads);
/* zo_convert of n elements by such a team, pieces of ZO_COPY_PIECE / 4
 * elements: each element converted alone, so the bytes are zo_convert's. */
void zo_convert_team(void *dst, zo_dtype dt, const void *src, zo_dtype st, size_t n, int n_threads);

#endif
