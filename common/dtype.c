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

void zo_copy_team(void *dst, const void *src, size_t bytes, int n_threads)
{
    size_t pieces = (bytes + ZO_COPY_PIECE - 1) / ZO_COPY_PIECE;
    int nt = n_threads > 0 ? n_threads : omp_get_max_threads();
    if (pieces < 2 || nt < 2) {
        memcpy(dst, src, bytes);
        return;
    }
    if ((size_t)nt > pieces) nt = (int)pieces;
#pragma omp parallel num_threads(nt)
    {
        size_t t = (size_t)omp_get_thread_num(), team = (size_t)omp_get_num_threads();
        size_t lo = pieces * t / team * ZO_COPY_PIECE, hi = pieces * (t + 1) / team * ZO_COPY_PIECE;
        if (hi > bytes) hi = bytes;
        if (lo < hi) memcpy((char *)dst + lo, (const char *)src + lo, hi - lo);
    }
}
