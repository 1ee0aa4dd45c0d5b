/* Tests for common/nf4: NF4 with double quantization against a reference
 * written here from the published code table and block scheme (blocks of
 * 64, absmax per block; the absmax constants centred on their mean and coded
 * in 8 bits in blocks of 256 with an fp32 scale), and against the PyTorch
 * implementation of tests/fixtures/lora/make_lora_fixtures.py: exact sizes,
 * exact codes, dequantized values within the format's rounding, the double-
 * quantized constants within theirs, thread-count independence, errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/nf4.h"        /* defines: zo_nf4_quantize, zo_nf4_bytes */
#include "model/safetensors.h" /* defines: model_st_open (the PyTorch fixture) */

/* The QLoRA paper's NF4 values (Appendix E), as printed there. */
static const double paper_nf4[16] = {
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
};

/* ---- the reference ------------------------------------------------------------------- */

/* bitsandbytes' signed dynamic map built another way: the 127 positive
 * values by decade, mirrored, then 0 and 1, placed in ascending order by
 * construction (negatives from the largest magnitude down). */
static void ref_map(float map[256])
{
    double pos[127];
    /* values computed as the definition reads: 10^(i-6) * (0.1 + 0.9 (j + 1/2) / 2^i) */
    static const double p10[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
    int k = 0;
    for (int i = 0; i < 7; i++)
        for (int j = 0; j < (1 << i); j++) pos[k++] = p10[i] * (0.1 + 0.9 * (j + 0.5) / (double)(1 << i));
    /* the decades do not overlap and each is ascending in j: pos is sorted */
    for (int i = 0; i < 127; i++) map[i] = (float)-pos[126 - i];
    map[127] = 0.0f;
    for (int i = 0; i < 127; i++) map[128 + i] = (float)pos[i];
    map[255] = 1.0f;
}

/* Nearest value by linear scan: the number of neighbour midpoints (double,
 * rounded to fp32) strictly below v. */
static int ref_nearest(const float *vals, int n, float v)
{
    int idx = 0;
    for (int k = 0; k + 1 < n; k++)
        if ((float)(((double)vals[k] + vals[k + 1]) / 2.0) < v) idx++;
    return idx;
}

/* The whole format, element by element. */
static uint8_t *ref_quantize(const float *x, uint64_t n, size_t *bytes)
{
    float nf4[16], map[256];
    for (int i = 0; i < 16; i++) nf4[i] = (float)paper_nf4[i];
    ref_map(map);
    uint64_t nb = (n + 63) / 64, nb2 = (nb + 255) / 256;
    *bytes = 4 + 4 * nb2 + nb + (n + 1) / 2;
    uint8_t *q = calloc(*bytes, 1);
    float *absmax = calloc(nb + 1, sizeof(float));
    double sum = 0.0;
    for (uint64_t b = 0; b < nb; b++) {
        for (uint64_t i = b * 64; i < n && i < b * 64 + 64; i++)
            if (fabsf(x[i]) > absmax[b]) absmax[b] = fabsf(x[i]);
        sum += absmax[b];
    }
    float offset = nb ? (float)(sum / (double)nb) : 0.0f;
    memcpy(q, &offset, 4);
    for (uint64_t j = 0; j < nb2; j++) {
        float s = 0.0f;
        for (uint64_t b = j * 256; b < nb && b < j * 256 + 256; b++)
            if (fabsf(absmax[b] - offset) > s) s = fabsf(absmax[b] - offset);
        memcpy(q + 4 + 4 * j, &s, 4);
        for (uint64_t b = j * 256; b < nb && b < j * 256 + 256; b++)
            q[4 + 4 * nb2 + b] = (uint8_t)ref_nearest(map, 256, s > 0 ? (absmax[b] - offset) / s : 0.0f);
    }
    uint8_t *codes = q + 4 + 4 * nb2 + nb;
    for (uint64_t i = 0; i < n; i++) {
        float a = absmax[i / 64];
        int c = ref_nearest(nf4, 16, a > 0 ? x[i] / a : 0.0f);
        codes[i / 2] |= (uint8_t)(i % 2 ? c : c << 4);
    }
    free(absmax);
    return q;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static double nrand(void) { return sqrt(-2.0 * log(urand() + 1e-300)) * cos(2.0 * M_PI * urand()); }

/* Weights ~ N(0, s_b^2) with a scale per block of 64 (0.01 .. 2), and an
 * all-zero block when there are three or more. */
static float *weights(uint64_t n)
{
    float *x = malloc((n + 1) * sizeof(float));
    double s = 1.0;
    for (uint64_t i = 0; i < n; i++) {
        if (i % 64 == 0) s = 0.01 + 2.0 * urand();
        x[i] = (float)(nrand() * s);
    }
    if (n > 192)
        for (uint64_t i = 64; i < 128; i++) x[i] = 0.0f;
    return x;
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_tables(void **state)
{
    (void)state;
    for (int i = 0; i < 16; i++) assert_true(zo_nf4_code[i] == (float)paper_nf4[i]);
    float map[256], want[256];
    zo_nf4_absmax_map(map);
    ref_map(want);
    assert_memory_equal(map, want, sizeof map);
    for (int i = 1; i < 256; i++) assert_true(map[i - 1] < map[i]);
    assert_true(map[127] == 0.0f && map[255] == 1.0f);
    assert_true(fabsf(map[0] + 0.99296875f) < 1e-7f); /* -(1 - 0.9/128): -1 is not in the map */
}

/* Sizes from the block scheme: 4 (offset) + 4 per 256 constants + 1 per 64
 * weights + 1 per 2 weights, for odd and even n, at every boundary. */
static void test_sizes(void **state)
{
    (void)state;
    struct { uint64_t n, bytes; } cases[] = {
        {0, 4},
        {1, 4 + 4 + 1 + 1},
        {2, 4 + 4 + 1 + 1},
        {3, 4 + 4 + 1 + 2},
        {63, 4 + 4 + 1 + 32},
        {64, 4 + 4 + 1 + 32},
        {65, 4 + 4 + 2 + 33},
        {64 * 256, 4 + 4 + 256 + 8192},
        {64 * 256 + 1, 4 + 8 + 257 + 8193},
        /* LLaMA-2-7B q_proj, 4096 x 4096: 8388608 + 262144 constants + 1024 scales
         * = 8654852 bytes, 4.127 bits a weight (the paper's 4 + 0.127) */
        {4096ull * 4096, 4 + 4096 + 262144 + 8388608},
        /* 11008 x 4096 + 1, odd: 45088769 weights */
        {11008ull * 4096 + 1, 4 + 4 * 2753 + 704513 + 22544385},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zo_nf4_layout L;
        zo_nf4_layout_of(cases[i].n, &L);
        assert_int_equal(zo_nf4_bytes(cases[i].n), cases[i].bytes);
        assert_int_equal(L.bytes, cases[i].bytes);
        assert_int_equal(L.off_absq, 4 + 4 * L.n_blocks2);
        assert_int_equal(L.off_codes, L.off_absq + L.n_blocks);
    }
    double bits = 8.0 * (double)zo_nf4_bytes(4096ull * 4096) / (4096.0 * 4096.0);
    assert_true(fabs(bits - 4.127) < 5e-4);
}

/* Codes bit for bit against the reference; dequantized values within the
 * rounding of the format; the absmax constants within theirs. */
static void check_against_reference(uint64_t n, int n_threads)
{
    float *x = weights(n);
    size_t bytes;
    uint8_t *want = ref_quantize(x, n, &bytes);
    assert_int_equal(bytes, zo_nf4_bytes(n));
    uint8_t *got = aligned_alloc(64, (bytes + 63) / 64 * 64);
    memset(got, 0xa5, bytes);
    assert_int_equal(zo_nf4_quantize(got, x, n, n_threads), ZO_OK);
    if (memcmp(got, want, bytes)) {
        for (size_t i = 0; i < bytes; i++)
            if (got[i] != want[i]) {
                fprintf(stderr, "n %llu: byte %zu is 0x%02x, the reference 0x%02x\n",
                        (unsigned long long)n, i, got[i], want[i]);
                break;
            }
        fail();
    }
    /* dequantized: exactly code * absmax_dq, and within the rounding bound */
    float map[256];
    zo_nf4_absmax_map(map);
    float *dq = malloc((n + 1) * sizeof(float));
    zo_nf4_dequantize(dq, ZO_DTYPE_F32, got, n, n_threads);
    zo_nf4_layout L;
    zo_nf4_layout_of(n, &L);
    float offset;
    memcpy(&offset, got, 4);
    double worst_const = 0.0;
    for (uint64_t b = 0; b < L.n_blocks; b++) {
        float a = 0.0f;
        for (uint64_t i = b * 64; i < n && i < b * 64 + 64; i++) a = fmaxf(a, fabsf(x[i]));
        float s;
        memcpy(&s, got + L.off_scale2 + 4 * (b / 256), 4);
        int qa = got[L.off_absq + b];
        float adq = zo_nf4_block_absmax(got, n, b);
        assert_true(adq == map[qa] * s + offset);
        /* the constant's code is the nearest map value to (a - offset) / s, so
         * its error is at most half the gap to the neighbour on its side (or
         * the distance to the map's end, -0.99296875, for v = -1) */
        double v = s > 0 ? (double)(a - offset) / s : 0.0;
        double gap = v >= map[qa] ? (qa < 255 ? map[qa + 1] - map[qa] : 0.0)
                                  : (qa > 0 ? map[qa] - map[qa - 1] : 2 * (map[0] - v));
        double err_const = fabs((double)adq - a);
        double bound_const = s * (gap / 2) * (1 + 1e-6) + 4e-7 * (fabs(offset) + a);
        assert_true(err_const <= bound_const);
        if (a > 0) worst_const = fmax(worst_const, err_const / s);
        for (uint64_t i = b * 64; i < n && i < b * 64 + 64; i++) {
            int c = zo_nf4_code_of(got, n, i);
            assert_true(dq[i] == zo_nf4_code[c] * adq);
            /* |x - c a| <= half the gap to the neighbouring code on x's side, times a */
            double u = a > 0 ? (double)x[i] / a : 0.0;
            double g = u >= paper_nf4[c] ? (c < 15 ? paper_nf4[c + 1] - paper_nf4[c] : 0.0)
                                         : (c > 0 ? paper_nf4[c] - paper_nf4[c - 1] : 0.0);
            double bound = a * (g / 2) * (1 + 1e-6) + fabs(paper_nf4[c]) * err_const + 1e-6 * a;
            if (fabs((double)dq[i] - x[i]) > bound) {
                fprintf(stderr, "n %llu, weight %llu: %.9g -> %.9g, bound %.3g\n",
                        (unsigned long long)n, (unsigned long long)i, x[i], dq[i], bound);
                fail();
            }
        }
    }
    /* the constants' error never exceeds half the map's widest gap (0.9/64) */
    assert_true(worst_const <= 0.0140625 / 2 * (1 + 1e-6) + 1e-6);
    free(dq);
    free(got);
    free(want);
    free(x);
}

static void test_codes(void **state)
{
    (void)state;
    uint64_t ns[] = {1, 2, 3, 63, 64, 65, 127, 1001, 64 * 256, 64 * 256 + 1, 3 * 64 * 256 + 77};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) check_against_reference(ns[i], 2);
}

/* Large enough to run in parallel: the bytes do not depend on the thread count. */
static void test_threads(void **state)
{
    (void)state;
    uint64_t n = 1000003;
    float *x = weights(n);
    size_t bytes = zo_nf4_bytes(n);
    uint8_t *a = aligned_alloc(64, (bytes + 63) / 64 * 64), *b = aligned_alloc(64, (bytes + 63) / 64 * 64);
    assert_int_equal(zo_nf4_quantize(a, x, n, 1), ZO_OK);
    assert_int_equal(zo_nf4_quantize(b, x, n, 2), ZO_OK);
    assert_memory_equal(a, b, bytes);
    uint16_t *d1 = malloc(n * 2), *d2 = malloc(n * 2);
    zo_nf4_dequantize(d1, ZO_DTYPE_BF16, a, n, 1);
    zo_nf4_dequantize(d2, ZO_DTYPE_BF16, a, n, 2);
    assert_memory_equal(d1, d2, n * 2);
    /* bf16 output is the fp32 value rounded to nearest even */
    float *f = malloc(n * sizeof(float));
    zo_nf4_dequantize(f, ZO_DTYPE_F32, a, n, 2);
    for (uint64_t i = 0; i < n; i += 997) assert_int_equal(d1[i], zo_f32_to_bf16(f[i]));
    /* the error on N(0, s^2) weights, for docs/transformer.md */
    double se = 0.0, sx = 0.0;
    for (uint64_t i = 0; i < n; i++) {
        se += ((double)f[i] - x[i]) * ((double)f[i] - x[i]);
        sx += (double)x[i] * x[i];
    }
    printf("  NF4 on N(0, s^2) blocks: relative RMS error %.4f\n", sqrt(se / sx));
    assert_true(sqrt(se / sx) < 0.12);
    free(f);
    free(d1);
    free(d2);
    free(a);
    free(b);
    free(x);
}

static void test_errors(void **state)
{
    (void)state;
    float x[130];
    for (int i = 0; i < 130; i++) x[i] = (float)i;
    x[77] = NAN;
    _Alignas(4) uint8_t buf[256];
    zo_clear_error();
    assert_int_equal(zo_nf4_quantize(buf, x, 130, 1), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "weight 77"));
    x[77] = INFINITY;
    assert_int_equal(zo_nf4_quantize(buf, x, 130, 1), ZO_ERR_INVALID);
    x[77] = 0.0f;
    assert_int_equal(zo_nf4_quantize(buf + 1, x, 130, 1), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "aligned"));
    assert_int_equal(zo_nf4_quantize(NULL, x, 130, 1), ZO_ERR_INVALID);
    /* n = 0: just the offset */
    assert_int_equal(zo_nf4_quantize(buf, x, 0, 1), ZO_OK);
    /* one block: its constant is the mean, exactly recovered */
    assert_int_equal(zo_nf4_quantize(buf, x, 64, 1), ZO_OK);
    assert_true(zo_nf4_block_absmax(buf, 64, 0) == 63.0f);
}

/* The PyTorch implementation of the same published scheme: the same bytes
 * and the same dequantized values. */
static void test_against_torch(void **state)
{
    (void)state;
    const char *d = getenv("ZO_GPU_FIXTURES");
    char path[512];
    snprintf(path, sizeof path, "%s/nf4.safetensors", d && *d ? d : ZO_FIXTURES_DIR "/lora");
    model_st_file f;
    assert_int_equal(model_st_open(&f, path), ZO_OK);
    int cases = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const model_st_tensor *tx = &f.tensors[i];
        unsigned long long n;
        if (sscanf(tx->name, "x_%llu", &n) != 1) continue;
        char name[64];
        snprintf(name, sizeof name, "q_%llu", n);
        const model_st_tensor *tq = model_st_find(&f, name);
        snprintf(name, sizeof name, "dq_%llu", n);
        const model_st_tensor *td = model_st_find(&f, name);
        assert_non_null(tq);
        assert_non_null(td);
        assert_int_equal(tq->numel, zo_nf4_bytes(n));
        float *x = malloc(n * 4), *qf = malloc(tq->numel * 4), *want = malloc(n * 4), *dq = malloc(n * 4);
        assert_int_equal(model_st_read(&f, tx, x, ZO_DTYPE_F32, 0), ZO_OK);
        assert_int_equal(model_st_read(&f, tq, qf, ZO_DTYPE_F32, 0), ZO_OK);
        assert_int_equal(model_st_read(&f, td, want, ZO_DTYPE_F32, 0), ZO_OK);
        uint8_t *got = aligned_alloc(64, (tq->numel + 63) / 64 * 64);
        assert_int_equal(zo_nf4_quantize(got, x, n, 2), ZO_OK);
        for (uint64_t k = 0; k < tq->numel; k++)
            if (got[k] != (uint8_t)qf[k]) {
                fprintf(stderr, "%s: byte %llu is 0x%02x, PyTorch's 0x%02x\n", tx->name,
                        (unsigned long long)k, got[k], (unsigned)qf[k]);
                fail();
            }
        zo_nf4_dequantize(dq, ZO_DTYPE_F32, got, n, 2);
        assert_memory_equal(dq, want, n * 4);
        free(got);
        free(x);
        free(qf);
        free(want);
        free(dq);
        cases++;
    }
    assert_true(cases >= 5);
    model_st_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables),  cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_codes),   cmocka_unit_test(test_threads),
        cmocka_unit_test(test_errors),  cmocka_unit_test(test_against_torch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
