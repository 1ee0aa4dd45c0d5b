#include "dtype.h"

#include <omp.h>
#include <string.h>

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

void zo_convert(void *dst, zo_dtype dt, const void *src, zo_dtype st, size_t n)
{
    for (size_t i = 0; i < n; i++) zo_store_f32(dst, dt, i, zo_load_f32(src, st, i));
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
