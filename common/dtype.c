#include "dtype.h"

#include <omp.h>
#include <stdatomic.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include "bf16_avx2.h" /* defines: zo_avx2_bf16_to_f32, zo_avx2_round_bf16 */
#endif

#include <strings.h>

size_t zo_dtype_size(zo_dtype t)
{
    switch (t) {
    case ZO_DTYPE_F16:
    case ZO_DTYPE_BF16: return 2;
    case ZO_DTYPE_F32: return 4;
    default: return 0;
    }
}

const char *zo_dtype_name(zo_dtype t)
{
    switch (t) {
    case ZO_DTYPE_F32: return "fp32";
    case ZO_DTYPE_F16: return "fp16";
    case ZO_DTYPE_BF16: return "bf16";
    default: return "?";
    }
}

zo_status zo_dtype_parse(const char *s, zo_dtype *out)
{
    static const struct { const char *name; zo_dtype t; } names[] = {
        {"fp32", ZO_DTYPE_F32}, {"float32", ZO_DTYPE_F32}, {"f32", ZO_DTYPE_F32},
        {"float", ZO_DTYPE_F32}, {"fp16", ZO_DTYPE_F16}, {"float16", ZO_DTYPE_F16},
        {"f16", ZO_DTYPE_F16},   {"half", ZO_DTYPE_F16},  {"bf16", ZO_DTYPE_BF16},
        {"bfloat16", ZO_DTYPE_BF16},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (s && !strcasecmp(s, names[i].name)) {
            *out = names[i].t;
            return ZO_OK;
        }
    return zo_error(ZO_ERR_INVALID, "unknown dtype '%s' (expected fp32, fp16 or bf16)",
                    s ? s : "(null)");
}

/* ---- rows of bf16 and fp32 ------------------------------------------------------------- */

/* -1: not yet asked; 0: the scalar loops; 1: AVX2. The CPU's answer alone
 * ever sets 1 (zo_convert_simd(1) asks it again). */
static _Atomic int row_simd = -1;

static int rows_simd(void)
{
    int s = atomic_load_explicit(&row_simd, memory_order_relaxed);
    if (s < 0) {
#if defined(__x86_64__) && defined(__GNUC__)
        __builtin_cpu_init();
        s = __builtin_cpu_supports("avx2") ? 1 : 0;
#else
        s = 0;
#endif
        atomic_store_explicit(&row_simd, s, memory_order_relaxed);
    }
    return s;
}

int zo_convert_simd(int on)
{
    int before = rows_simd();
    atomic_store_explicit(&row_simd, on ? -1 : 0, memory_order_relaxed);
    return before;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static void bf16_to_f32_avx2(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, zo_avx2_bf16_to_f32(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = zo_bf16_to_f32(src[i]);
}

__attribute__((target("avx2"))) static void f32_to_bf16_avx2(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = zo_avx2_round_bf16(_mm256_castps_si256(_mm256_loadu_ps(src + i)));
        __m256i b = zo_avx2_round_bf16(_mm256_castps_si256(_mm256_loadu_ps(src + i + 8)));
        /* packus interleaves the 128-bit halves: a0-3 b0-3 a4-7 b4-7 */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
        _mm256_storeu_si256((__m256i *)(dst + i), p);
    }
    for (; i < n; i++) dst[i] = zo_f32_to_bf16(src[i]);
}
#endif

void zo_bf16_to_f32_row(float *dst, const uint16_t *src, size_t n)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (rows_simd()) {
        bf16_to_f32_avx2(dst, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = zo_bf16_to_f32(src[i]);
}

void zo_f32_to_bf16_row(uint16_t *dst, const float *src, size_t n)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (rows_simd()) {
        f32_to_bf16_avx2(dst, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = zo_f32_to_bf16(src[i]);
}

void zo_convert(void *dst, zo_dtype dt, const void *src, zo_dtype st, size_t n)
{
    if (dt == ZO_DTYPE_F32 && st == ZO_DTYPE_F32) {
        if (n) memmove(dst, src, n * sizeof(float));
    } else if (dt == ZO_DTYPE_F32 && st == ZO_DTYPE_BF16) {
        zo_bf16_to_f32_row(dst, src, n);
    } else if (dt == ZO_DTYPE_BF16 && st == ZO_DTYPE_F32) {
        zo_f32_to_bf16_row(dst, src, n);
    } else {
        for (size_t i = 0; i < n; i++) zo_store_f32(dst, dt, i, zo_load_f32(src, st, i));
    }
}

/* A team for `pieces` pieces: n_threads (0: OpenMP's default), no more than
 * the pieces; 1 below two pieces. */
static int team_for(size_t pieces, int n_threads)
{
    int nt = n_threads > 0 ? n_threads : omp_get_max_threads();
    if (pieces < 2 || nt < 2) return 1;
    return (size_t)nt > pieces ? (int)pieces : nt;
}

/* Thread t of a team of `team`: its contiguous run [*lo, *hi) of whole
 * pieces of `piece` units, of n units in all. */
static void team_run(size_t n, size_t piece, size_t t, size_t team, size_t *lo, size_t *hi)
{
    size_t pieces = (n + piece - 1) / piece;
    *lo = pieces * t / team * piece;
    *hi = pieces * (t + 1) / team * piece;
    if (*hi > n) *hi = n;
    if (*lo > *hi) *lo = *hi;
}

void zo_copy_team(void *dst, const void *src, size_t bytes, int n_threads)
{
    int nt = team_for((bytes + ZO_COPY_PIECE - 1) / ZO_COPY_PIECE, n_threads);
    if (nt < 2) {
        memcpy(dst, src, bytes);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        size_t lo, hi;
        team_run(bytes, ZO_COPY_PIECE, (size_t)omp_get_thread_num(), (size_t)omp_get_num_threads(), &lo, &hi);
        if (lo < hi) memcpy((char *)dst + lo, (const char *)src + lo, hi - lo);
    }
}

void zo_memset_team(void *dst, int c, size_t bytes, int n_threads)
{
    int nt = team_for((bytes + ZO_COPY_PIECE - 1) / ZO_COPY_PIECE, n_threads);
    if (nt < 2) {
        memset(dst, c, bytes);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        size_t lo, hi;
        team_run(bytes, ZO_COPY_PIECE, (size_t)omp_get_thread_num(), (size_t)omp_get_num_threads(), &lo, &hi);
        if (lo < hi) memset((char *)dst + lo, c, hi - lo);
    }
}

void zo_convert_team(void *dst, zo_dtype dt, const void *src, zo_dtype st, size_t n, int n_threads)
{
    /* pieces of as many elements as a copy's piece has bytes of fp32 */
    const size_t piece = ZO_COPY_PIECE / 4;
    int nt = team_for((n + piece - 1) / piece, n_threads);
    size_t ds = zo_dtype_size(dt), ss = zo_dtype_size(st);
    if (nt < 2) {
        zo_convert(dst, dt, src, st, n);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        size_t lo, hi;
        team_run(n, piece, (size_t)omp_get_thread_num(), (size_t)omp_get_num_threads(), &lo, &hi);
        if (lo < hi) zo_convert((char *)dst + lo * ds, dt, (const char *)src + lo * ss, st, hi - lo);
    }
}
