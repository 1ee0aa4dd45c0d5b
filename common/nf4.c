/* NF4 with double quantization (nf4.h): sizes, quantization on the host at
 * load time, and the dequantization reference. Built with -ffp-contract=off:
 * every product and sum is rounded as written, so the device kernels can
 * match it bit for bit. */
#include "nf4.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* The NF4 values as the paper and bitsandbytes print them (fp32). */
const float zo_nf4_code[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

void zo_nf4_layout_of(uint64_t n, zo_nf4_layout *out)
{
    out->n = n;
    out->n_blocks = (n + ZO_NF4_BLOCK - 1) / ZO_NF4_BLOCK;
    out->n_blocks2 = (out->n_blocks + ZO_NF4_BLOCK2 - 1) / ZO_NF4_BLOCK2;
    out->off_scale2 = 4;
    out->off_absq = out->off_scale2 + 4 * out->n_blocks2;
    out->off_codes = out->off_absq + out->n_blocks;
    out->bytes = out->off_codes + (n + 1) / 2;
}

uint64_t zo_nf4_bytes(uint64_t n)
{
    zo_nf4_layout l;
    zo_nf4_layout_of(n, &l);
    return l.bytes;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void zo_dynamic_map(float map[256], int is_signed)
{
    static const double pow10[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
    int k = 0;
    for (int i = 0; i < 7; i++) {
        int items = 1 << (is_signed ? i : i + 1); /* midpoints of linspace(0.1, 1, items + 1) */
        for (int j = 0; j < items; j++) {
            double mid = 0.1 + 0.9 * (j + 0.5) / (double)items;
            map[k++] = (float)(pow10[i] * mid);
            if (is_signed) map[k++] = (float)(-pow10[i] * mid);
        }
    }
    map[k++] = 0.0f;
    map[k++] = 1.0f;
    qsort(map, 256, sizeof *map, cmp_float);
}

void zo_nf4_absmax_map(float map[256]) { zo_dynamic_map(map, 1); }

/* thr[k] = the midpoint of values k and k+1, in double, rounded to fp32. */
static void thresholds(float *thr, const float *values, int n)
{
    for (int k = 0; k + 1 < n; k++) thr[k] = (float)(((double)values[k] + values[k + 1]) / 2.0);
}

/* The count of thresholds below v (16 values, 15 thresholds): binary search. */
static inline int nearest16(const float *thr, float v)
{
    int p = 0;
    if (v > thr[p + 7]) p += 8;
    if (v > thr[p + 3]) p += 4;
    if (v > thr[p + 1]) p += 2;
    if (v > thr[p]) p += 1;
    return p;
}

void zo_dynamic_map_thresholds(float thr[255], const float map[256]) { thresholds(thr, map, 256); }

static int team(int n_threads) { return n_threads > 0 ? n_threads : omp_get_max_threads(); }

/* Parallel only where the work pays for the team. */
#define NF4_PARALLEL_MIN (1u << 16)

zo_status zo_nf4_quantize(void *dst, const float *src, uint64_t n, int n_threads)
{
    if (!dst || (n && !src))
        return zo_error(ZO_ERR_INVALID, "zo_nf4_quantize: NULL buffer");
    if ((uintptr_t)dst % ZO_NF4_ALIGN)
        return zo_error(ZO_ERR_INVALID, "zo_nf4_quantize: output not %d-byte aligned", ZO_NF4_ALIGN);
    zo_nf4_layout L;
    zo_nf4_layout_of(n, &L);
    uint8_t *base = dst;
    float *scale2 = (float *)(base + L.off_scale2);
    uint8_t *absq = base + L.off_absq, *codes = base + L.off_codes;
    const long long nb = (long long)L.n_blocks, nb2 = (long long)L.n_blocks2;
    const int nt = team(n_threads);
    float *absmax = malloc((L.n_blocks ? L.n_blocks : 1) * sizeof *absmax);
    if (!absmax)
        return zo_error(ZO_ERR_NOMEM, "zo_nf4_quantize: %llu absmax constants", (unsigned long long)nb);

    /* 1. each block's absmax; the first weight that is not finite */
    uint64_t bad = UINT64_MAX;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(min : bad) if (n > NF4_PARALLEL_MIN)
    for (long long b = 0; b < nb; b++) {
        uint64_t i0 = (uint64_t)b * ZO_NF4_BLOCK, i1 = i0 + ZO_NF4_BLOCK < n ? i0 + ZO_NF4_BLOCK : n;
        float m = 0.0f;
        for (uint64_t i = i0; i < i1; i++) {
            float a = fabsf(src[i]);
            if (!isfinite(a) && i < bad) bad = i;
            if (a > m) m = a;
        }
        absmax[b] = m;
    }
    if (bad != UINT64_MAX) {
        free(absmax);
        return zo_error(ZO_ERR_INVALID, "zo_nf4_quantize: weight %llu of %llu is %g, not finite",
                        (unsigned long long)bad, (unsigned long long)n, (double)src[bad]);
    }

    /* 2. double quantization: centre the constants on their mean (summed in
     * double, in order), code each block of 256 against its own absmax */
    double sum = 0.0;
    for (long long b = 0; b < nb; b++) sum += absmax[b];
    float offset = nb ? (float)(sum / (double)nb) : 0.0f;
    memcpy(base, &offset, 4);
    float map[256], map_thr[255];
    zo_nf4_absmax_map(map);
    zo_dynamic_map_thresholds(map_thr, map);
#pragma omp parallel for num_threads(nt) schedule(static) if (n > NF4_PARALLEL_MIN)
    for (long long j = 0; j < nb2; j++) {
        long long b0 = j * ZO_NF4_BLOCK2, b1 = b0 + ZO_NF4_BLOCK2 < nb ? b0 + ZO_NF4_BLOCK2 : nb;
        float s = 0.0f;
        for (long long b = b0; b < b1; b++) {
            float c = fabsf(absmax[b] - offset);
            if (c > s) s = c;
        }
        scale2[j] = s;
        for (long long b = b0; b < b1; b++) {
            float c = absmax[b] - offset;
            absq[b] = (uint8_t)zo_dynamic_map_nearest(map_thr, s > 0.0f ? c / s : 0.0f);
        }
    }

    /* 3. the 4-bit codes against each block's exact absmax */
    float thr[15];
    thresholds(thr, zo_nf4_code, 16);
#pragma omp parallel for num_threads(nt) schedule(static) if (n > NF4_PARALLEL_MIN)
    for (long long b = 0; b < nb; b++) {
        uint64_t i0 = (uint64_t)b * ZO_NF4_BLOCK, i1 = i0 + ZO_NF4_BLOCK < n ? i0 + ZO_NF4_BLOCK : n;
        float a = absmax[b];
        for (uint64_t i = i0; i < i1; i += 2) {
            int hi = nearest16(thr, a > 0.0f ? src[i] / a : 0.0f);
            int lo = i + 1 < i1 ? nearest16(thr, a > 0.0f ? src[i + 1] / a : 0.0f) : 0;
            codes[i / 2] = (uint8_t)(hi << 4 | lo);
        }
    }
    free(absmax);
    return ZO_OK;
}

/* The dequantized absmax of block b (map: zo_nf4_absmax_map). */
static inline float block_absmax(const uint8_t *base, const zo_nf4_layout *L, const float *map,
                                 uint64_t b)
{
    float offset, s;
    memcpy(&offset, base, 4);
    memcpy(&s, base + L->off_scale2 + 4 * (b / ZO_NF4_BLOCK2), 4);
    float scaled = map[base[L->off_absq + b]] * s;
    return scaled + offset;
}

static inline int code_at(const uint8_t *base, const zo_nf4_layout *L, uint64_t i)
{
    uint8_t byte = base[L->off_codes + i / 2];
    return i % 2 ? byte & 15 : byte >> 4;
}

void zo_nf4_dequantize(void *dst, zo_dtype dt, const void *src, uint64_t n, int n_threads)
{
    zo_nf4_layout L;
    zo_nf4_layout_of(n, &L);
    float map[256];
    zo_nf4_absmax_map(map);
    const uint8_t *base = src;
    const long long nb = (long long)L.n_blocks;
#pragma omp parallel for num_threads(team(n_threads)) schedule(static) if (n > NF4_PARALLEL_MIN)
    for (long long b = 0; b < nb; b++) {
        float a = block_absmax(base, &L, map, (uint64_t)b);
        uint64_t i0 = (uint64_t)b * ZO_NF4_BLOCK, i1 = i0 + ZO_NF4_BLOCK < n ? i0 + ZO_NF4_BLOCK : n;
        for (uint64_t i = i0; i < i1; i++) zo_store_f32(dst, dt, i, zo_nf4_code[code_at(base, &L, i)] * a);
    }
}

float zo_nf4_block_absmax(const void *src, uint64_t n, uint64_t b)
{
    zo_nf4_layout L;
    zo_nf4_layout_of(n, &L);
    float map[256];
    zo_nf4_absmax_map(map);
    return block_absmax(src, &L, map, b);
}

int zo_nf4_code_of(const void *src, uint64_t n, uint64_t i)
{
    zo_nf4_layout L;
    zo_nf4_layout_of(n, &L);
    return code_at(src, &L, i);
}
