/* Tests for model/safetensors: round trips, checkpoints written by PyTorch
 * (tests/fixtures/model, see make_fixtures.py), sharded indexes, saving with
 * Hugging Face layouts, and every malformed-file error. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/dtype.h"
#include "common/model_config.h"
#include "model/layout.h"
#include "model/safetensors.h"
#include "tests/support/scratch.h" /* defines: scratch_path */

#define FIX ZO_FIXTURES_DIR "/model"

static char tmpdir[256];

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static int setup_tmp(void **state)
{
    (void)state;
    scratch_path(tmpdir, sizeof tmpdir, "zo_test_model_st.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmp(void **state)
{
    (void)state;
    return nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static char *tmp_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", tmpdir, name);
    return buf;
}

/* 1 when tmpdir holds no temporary file of `name` ("<name>.tmp.*"). */
static int no_tmp_left(const char *name)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s | grep -F '%s.tmp.')\"", tmpdir, name);
    return system(cmd) == 0;
}

/* A tensor's bytes as stored, read (model_st_read_raw) into a buffer the
 * caller frees; fails the test on error. */
static uint8_t *raw_bytes(const model_st_file *f, const model_st_tensor *t)
{
    uint8_t *b = malloc(t->end - t->begin + 1);
    assert_non_null(b);
    if (model_st_read_raw(f, t, b) != ZO_OK) fail_msg("%s", zo_last_error());
    return b;
}

/* Whole file into memory (test helper; fails the test on error). */
static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void spit(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) fail_msg("create %s: %s", path, strerror(errno));
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
}

/* A safetensors file from a literal header and `data_len` data bytes (i, mod 251). */
static void write_raw_st(const char *path, const char *header, size_t data_len)
{
    size_t hl = strlen(header);
    uint8_t *buf = malloc(8 + hl + data_len);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) buf[8 + hl + i] = (uint8_t)(i % 251);
    spit(path, buf, 8 + hl + data_len);
    free(buf);
}

/* Block buffers for a layout, each of dtype dt. */
static void **alloc_blocks(const model_layout *l, zo_dtype dt)
{
    void **b = calloc((size_t)l->n_blocks, sizeof *b);
    assert_non_null(b);
    for (int i = 0; i < l->n_blocks; i++) {
        b[i] = calloc(l->block_numel[i], zo_dtype_size(dt));
        assert_non_null(b[i]);
    }
    return b;
}

static void free_blocks(const model_layout *l, void **b)
{
    for (int i = 0; i < l->n_blocks; i++) free(b[i]);
    free(b);
}

/* Blocks concatenated must equal the expected file byte for byte; on a
 * mismatch, name the tensor and element. */
static void assert_blocks_equal_file(const model_layout *l, void **blocks, zo_dtype dt,
                                     const char *expected_path)
{
    size_t len;
    uint8_t *exp = slurp(expected_path, &len);
    size_t esz = zo_dtype_size(dt);
    assert_int_equal(len, l->total_numel * esz);
    size_t pos = 0;
    for (int b = 0; b < l->n_blocks; b++) {
        const uint8_t *got = blocks[b];
        for (int i = 0; i < l->n_tensors; i++) {
            const model_tensor *t = &l->tensors[i];
            if (t->block != b) continue;
            for (size_t k = 0; k < t->numel; k++) {
                if (memcmp(got + (t->offset + k) * esz, exp + pos + (t->offset + k) * esz, esz))
                    fail_msg("%s: %s element %zu: got %g, expected %g", expected_path, t->name,
                             k, (double)zo_load_f32(got, dt, t->offset + k),
                             (double)zo_load_f32(exp + pos, dt, t->offset + k));
            }
        }
        pos += l->block_numel[b] * esz;
    }
    free(exp);
}

static void load_layout(const char *dir, model_layout *l)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s/config.json", FIX, dir);
    zo_model_config cfg;
    if (zo_model_config_load(path, &cfg)) fail_msg("%s", zo_last_error());
    if (model_layout_init(l, &cfg)) fail_msg("%s", zo_last_error());
}

/* ---- round trips ----------------------------------------------------------- */

/* Write tensors of every shape kind, read back, bit-equal (all bit patterns,
 * nan and inf included, survive a same-dtype round trip). */
static void test_st_roundtrip(void **state)
{
    (void)state;
    for (int dt = 0; dt < ZO_DTYPE_COUNT; dt++) {
        size_t esz = zo_dtype_size((zo_dtype)dt);
        const int64_t shapes[][3] = {{7, 5, 0}, {13, 0, 0}, {2, 3, 4}, {0, 4, 0}, {0, 0, 0}};
        const int ndims[] = {2, 1, 3, 2, 0};
        const char *names[] = {"w", "b", "cube", "empty", "scalar"};
        model_st_entry e[5];
        uint8_t *data[5];
        uint32_t x = 12345u + (uint32_t)dt;
        for (int i = 0; i < 5; i++) {
            memset(&e[i], 0, sizeof e[i]);
            e[i].name = names[i];
            e[i].dtype = (zo_dtype)dt;
            e[i].ndim = ndims[i];
            size_t n = 1;
            for (int d = 0; d < ndims[i]; d++) {
                e[i].shape[d] = shapes[i][d];
                n *= (size_t)shapes[i][d];
            }
            data[i] = malloc(n * esz + 1);
            assert_non_null(data[i]);
            for (size_t k = 0; k < n * esz; k++) {
                x = x * 1664525u + 1013904223u;
                data[i][k] = (uint8_t)(x >> 24);
            }
            e[i].data = data[i];
        }
        char path[512];
        tmp_path(path, sizeof path, "rt.safetensors");
        if (model_st_write(path, e, 5, NULL, NULL)) fail_msg("%s", zo_last_error());
        model_st_file f;
        if (model_st_open(&f, path)) fail_msg("%s", zo_last_error());
        assert_int_equal(f.n_tensors, 5);
        assert_int_equal(f.data_start % 8, 0);
        for (int i = 0; i < 5; i++) {
            const model_st_tensor *t = model_st_find(&f, names[i]);
            assert_non_null(t);
            assert_int_equal(t->dtype, dt);
            assert_int_equal(t->ndim, ndims[i]);
            for (int d = 0; d < ndims[i]; d++) assert_int_equal(t->shape[d], shapes[i][d]);
            assert_int_equal(t->end - t->begin, t->numel * esz);
            uint8_t *raw = raw_bytes(&f, t);
            assert_memory_equal(raw, data[i], t->numel * esz);
            free(raw);
            uint8_t *back = malloc(t->numel * esz + 1);
            assert_non_null(back);
            assert_int_equal(model_st_read(&f, t, back, (zo_dtype)dt, 0), ZO_OK);
            assert_memory_equal(back, data[i], t->numel * esz);
            free(back);
        }
        assert_null(model_st_find(&f, "absent"));
        model_st_close(&f);
        for (int i = 0; i < 5; i++) free(data[i]);
    }
    /* nothing but the file: no temporary file is left */
    assert_true(no_tmp_left("rt.safetensors"));
}

/* A file cut short after it was opened (rewritten by another process, a
 * copy still under way): every read of a tensor past the new end fails with
 * a status naming the file and the tensor, through each way a tensor is read
 * (as stored, converted, transposed). The file was mapped before: the first
 * read was SIGBUS, the run's end without a message (exit 135). */
static void test_st_truncated_after_open(void **state)
{
    (void)state;
    char path[512];
    tmp_path(path, sizeof path, "shrinks.safetensors");
    const char *header = "{\"a\":{\"dtype\":\"F32\",\"shape\":[256,64],\"data_offsets\":[0,65536]},"
                         "\"b\":{\"dtype\":\"BF16\",\"shape\":[128,256],\"data_offsets\":[65536,131072]},"
                         "\"c\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[131072,131136]}}";
    write_raw_st(path, header, 131136);
    model_st_file f;
    assert_int_equal(model_st_open(&f, path), ZO_OK);
    assert_int_equal(truncate(path, (off_t)(f.data_start + 4099)), 0);
    float *out = malloc(256 * 64 * sizeof(float));
    assert_non_null(out);
    static const struct {
        const char *name;
        zo_dtype dt;
        int transpose;
    } reads[] = {{"a", ZO_DTYPE_F32, 0}, {"a", ZO_DTYPE_F32, 1}, {"a", ZO_DTYPE_BF16, 0},
                 {"b", ZO_DTYPE_F32, 0}, {"b", ZO_DTYPE_F32, 1}, {"c", ZO_DTYPE_F32, 0}};
    for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++) {
        const model_st_tensor *t = model_st_find(&f, reads[i].name);
        assert_non_null(t);
        zo_status st = model_st_read(&f, t, out, reads[i].dt, reads[i].transpose);
        char want[64];
        snprintf(want, sizeof want, "tensor \"%s\"", reads[i].name);
        const char *msg = zo_last_error();
        if (st != ZO_ERR_FORMAT || !strstr(msg, path) || !strstr(msg, want) || !strstr(msg, "truncated"))
            fail_msg("read %zu (%s): %s, \"%s\"", i, reads[i].name, zo_status_name(st), msg);
        if (i == 0) printf("  %s\n", msg);
    }
    free(out);
    model_st_close(&f);
}

/* Reading with conversion and transpose, against the scalar conversions. */
static void test_st_read_convert(void **state)
{
    (void)state;
    float v[6 * 4];
    for (int i = 0; i < 24; i++) v[i] = (float)i * 0.3137f - 3.0f;
    model_st_entry e = {.name = "m", .dtype = ZO_DTYPE_F32, .ndim = 2, .shape = {6, 4}, .data = v};
    char path[512];
    tmp_path(path, sizeof path, "conv.safetensors");
    assert_int_equal(model_st_write(path, &e, 1, NULL, NULL), ZO_OK);
    model_st_file f;
    assert_int_equal(model_st_open(&f, path), ZO_OK);
    const model_st_tensor *t = model_st_find(&f, "m");
    uint16_t bf[24], hf[24];
    float tr[24];
    assert_int_equal(model_st_read(&f, t, bf, ZO_DTYPE_BF16, 0), ZO_OK);
    assert_int_equal(model_st_read(&f, t, hf, ZO_DTYPE_F16, 1), ZO_OK);
    assert_int_equal(model_st_read(&f, t, tr, ZO_DTYPE_F32, 1), ZO_OK);
    for (int r = 0; r < 6; r++) {
        for (int c = 0; c < 4; c++) {
            assert_int_equal(bf[r * 4 + c], zo_f32_to_bf16(v[r * 4 + c]));
            assert_int_equal(hf[c * 6 + r], zo_f32_to_f16(v[r * 4 + c]));
            assert_true(tr[c * 6 + r] == v[r * 4 + c]);
        }
    }
    model_st_close(&f);
}

/* ---- FP8 block-quantized checkpoints ---------------------------------------------- */

/* The reference, from the OCP 8-bit floating point spec (OFP8): E4M3 has
 * exponent bias 7, no infinities, S.1111.111 is NaN, exponent 0 is
 * subnormal (m/8 x 2^-6); E5M2 is bias 15 with IEEE infinities and NaNs. */
static double ref_fp8(unsigned code, int e4m3)
{
    unsigned e = e4m3 ? (code >> 3) & 15u : (code >> 2) & 31u;
    unsigned m = e4m3 ? code & 7u : code & 3u;
    double mant = e4m3 ? 8.0 : 4.0, bias = e4m3 ? 7.0 : 15.0, v;
    if (e4m3 && e == 15 && m == 7) return NAN;
    if (!e4m3 && e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = (m / mant) * pow(2.0, 1.0 - bias);
    else v = (1.0 + m / mant) * pow(2.0, (double)e - bias);
    return (code & 0x80u) ? -v : v;
}

/* x rounded to nearest even at `bits` significant bits with the smallest
 * normal 2^emin (below it, the subnormals' fixed spacing) */
static double ref_round(double x, int bits, int emin)
{
    if (x == 0.0) return x;
    int ex;
    frexp(x, &ex); /* |x| in [2^(ex-1), 2^ex) */
    int e = ex - 1 < emin ? emin : ex - 1;
    double q = ldexp(1.0, e - (bits - 1)), n = fabs(x) / q, f = floor(n), d = n - f;
    if (d > 0.5 || (d == 0.5 && fmod(f, 2.0) != 0.0)) f += 1.0;
    return copysign(f * q, x);
}

static uint16_t ref_bf16(double x)
{
    float v = (float)ref_round(x, 8, -126); /* exact: a bf16 value is a float */
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)(u >> 16);
}

/* One safetensors file of n tensors given as (name, dtype, 2-D shape, bytes). */
typedef struct st_in {
    const char *name, *dtype;
    int64_t rows, cols; /* cols < 0: 1-D [rows] */
    const void *data;
    size_t bytes;
} st_in;

/* The same with any shape (MXFP4's blocks: 3 or 4 dimensions). */
typedef struct st_nd {
    const char *name, *dtype;
    int ndim;
    int64_t dims[4];
    const void *data;
    size_t bytes;
} st_nd;

static void write_st_nd(const char *path, const st_nd *t, int n)
{
    char header[4096];
    size_t off = 0, hl = 0;
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "{");
    for (int i = 0; i < n; i++) {
        hl += (size_t)snprintf(header + hl, sizeof header - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                               i ? "," : "", t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++)
            hl += (size_t)snprintf(header + hl, sizeof header - hl, "%s%lld", d ? "," : "", (long long)t[i].dims[d]);
        hl += (size_t)snprintf(header + hl, sizeof header - hl, "],\"data_offsets\":[%zu,%zu]}", off,
                               off + t[i].bytes);
        off += t[i].bytes;
    }
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "}");
    assert_true(hl < sizeof header);
    uint8_t *buf = malloc(8 + hl + off);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    off = 0;
    for (int i = 0; i < n; i++) {
        memcpy(buf + 8 + hl + off, t[i].data, t[i].bytes);
        off += t[i].bytes;
    }
    spit(path, buf, 8 + hl + off);
    free(buf);
}

static void write_st(const char *path, const st_in *t, int n)
{
    st_nd nd[32];
    assert_true(n <= 32);
    for (int i = 0; i < n; i++)
        nd[i] = (st_nd){t[i].name, t[i].dtype, t[i].cols < 0 ? 1 : 2, {t[i].rows, t[i].cols}, t[i].data, t[i].bytes};
    write_st_nd(path, nd, n);
}

/* FP8 codes for a [rows, cols] weight: every finite E4M3 code in turn,
 * shifted by the row (NaN codes skipped) */
static uint8_t *fp8_codes(int64_t rows, int64_t cols, unsigned seed)
{
    uint8_t *w = malloc((size_t)(rows * cols) + 1);
    assert_non_null(w);
    for (int64_t k = 0; k < rows * cols; k++) {
        unsigned c = (unsigned)((k * 37 + k / cols * 11 + seed) % 256);
        if ((c & 0x7f) == 0x7f) c ^= 1; /* not NaN */
        w[k] = (uint8_t)c;
    }
    return w;
}

/* Scales for [sr, sc] blocks: exact ties for bf16 (1 + 2^-8 times a code
 * of three mantissa bits needs rounding), tiny ones (bf16 subnormals),
 * ordinary ones (DeepSeek's are ~1e-4) */
static float *fp8_scales(int64_t sr, int64_t sc)
{
    static const float pick[] = {1.00390625f, 2.1e-4f, 3.7e-41f, 1.0f, 0.0f, -7.5e-3f, 0x1.d12492p+0f, 6.103515625e-05f};
    float *s = malloc((size_t)(sr * sc) * sizeof *s + 1);
    assert_non_null(s);
    for (int64_t k = 0; k < sr * sc; k++) s[k] = pick[k % 8] * (float)(1 + k % 3);
    return s;
}

/* dst (dt) against the reference w[i][j] = e4m3(x[i][j]) * s[i / b0][j / b1],
 * rounded once; element by element, exactly. */
static void check_dequant(const void *dst, zo_dtype dt, const uint8_t *x, const float *s, int64_t rows,
                          int64_t cols, int b0, int b1, int transpose, const char *what)
{
    int64_t sc = (cols + b1 - 1) / b1;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < cols; j++) {
            double p = ref_fp8(x[i * cols + j], 1) * (double)s[(i / b0) * sc + j / b1];
            size_t at = (size_t)(transpose ? j * rows + i : i * cols + j);
            int ok;
            if (dt == ZO_DTYPE_F32)
                ok = ((const float *)dst)[at] == (float)p;
            else
                ok = ((const uint16_t *)dst)[at] == ref_bf16(p);
            if (!ok)
                fail_msg("%s [%lld, %lld] blocks [%d, %d]: element (%lld, %lld) code 0x%02x: got %.9g, expected %.9g",
                         what, (long long)rows, (long long)cols, b0, b1, (long long)i, (long long)j,
                         x[i * cols + j], (double)zo_load_f32(dst, dt, at), p);
        }
    }
}

static void expect_error(zo_status got, zo_status want, const char *const *words, int n)
{
    if (got != want) fail_msg("status %d, expected %d: %s", got, want, zo_last_error());
    for (int i = 0; i < n; i++)
        if (!strstr(zo_last_error(), words[i])) fail_msg("\"%s\" does not name %s", zo_last_error(), words[i]);
}

/* Weights at shapes across the 128-row and -column block edges (and other
 * block sizes), in bf16 and fp32, plain and transposed, exactly the
 * reference's. */
static void test_fp8_dequant_shapes(void **state)
{
    (void)state;
    static const struct {
        int64_t rows, cols;
        int b0, b1;
    } cases[] = {{300, 200, 128, 128}, {128, 129, 128, 128}, {1, 1, 128, 128}, {129, 128, 128, 128},
                 {256, 256, 128, 128}, {70, 45, 64, 32}, {5, 300, 1, 128}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t r = cases[k].rows, c = cases[k].cols;
        int b[2] = {cases[k].b0, cases[k].b1};
        int64_t sr = (r + b[0] - 1) / b[0], sc = (c + b[1] - 1) / b[1];
        uint8_t *x = fp8_codes(r, c, (unsigned)k);
        float *s = fp8_scales(sr, sc);
        st_in in[] = {{"m.weight", "F8_E4M3", r, c, x, (size_t)(r * c)},
                      {"m.weight_scale_inv", "F32", sr, sc, s, (size_t)(sr * sc) * 4}};
        char path[512];
        tmp_path(path, sizeof path, "fp8.safetensors");
        write_st(path, in, 2);
        model_st_file f;
        assert_int_equal(model_st_open(&f, path), ZO_OK);
        const model_st_tensor *w = model_st_find(&f, "m.weight"), *ws = model_st_find(&f, "m.weight_scale_inv");
        uint16_t *bf = malloc((size_t)(r * c) * 2);
        float *f32 = malloc((size_t)(r * c) * 4);
        assert_non_null(bf);
        assert_non_null(f32);
        for (int tr = 0; tr < 2; tr++) {
            if (model_st_read_fp8(&f, w, &f, ws, b, bf, ZO_DTYPE_BF16, tr)) fail_msg("%s", zo_last_error());
            check_dequant(bf, ZO_DTYPE_BF16, x, s, r, c, b[0], b[1], tr, "bf16");
            if (model_st_read_fp8(&f, w, &f, ws, b, f32, ZO_DTYPE_F32, tr)) fail_msg("%s", zo_last_error());
            check_dequant(f32, ZO_DTYPE_F32, x, s, r, c, b[0], b[1], tr, "f32");
        }
        /* the same scales read as blocks of another size: the wrong shape, refused */
        int other[2] = {b[0] * 2, b[1]};
        if (sr > 1) {
            const char *words[] = {"fp8.safetensors", "\"m.weight_scale_inv\"", "\"m.weight\"", "must be"};
            expect_error(model_st_read_fp8(&f, w, &f, ws, other, bf, ZO_DTYPE_BF16, 0), ZO_ERR_FORMAT, words, 4);
        }
        int zero[2] = {0, 128};
        const char *zw[] = {"\"m.weight\"", "weight_block_size"};
        expect_error(model_st_read_fp8(&f, w, &f, ws, zero, bf, ZO_DTYPE_BF16, 0), ZO_ERR_FORMAT, zw, 2);
        model_st_close(&f);
        free(bf);
        free(f32);
        free(x);
        free(s);
    }
}

/* Every E4M3 code once (scale 1, then a scale with a bf16 tie); the NaN codes
 * (0x7f, 0xff) refused naming the element; E5M2 decoded, its infinities refused. */
static void test_fp8_every_code(void **state)
{
    (void)state;
    for (int k = 0; k < 256; k++) {
        double want = ref_fp8((unsigned)k, 1), got = model_fp8_decode((uint8_t)k, 1);
        if (isnan(want) ? !isnan(got) : got != want) fail_msg("E4M3 0x%02x: %g, expected %g", k, got, want);
        want = ref_fp8((unsigned)k, 0);
        got = model_fp8_decode((uint8_t)k, 0);
        if (isnan(want) ? !isnan(got) : got != want) fail_msg("E5M2 0x%02x: %g, expected %g", k, got, want);
    }
    assert_true(ref_fp8(0x7e, 1) == 448.0 && ref_fp8(0x01, 1) == ldexp(1.0, -9)); /* the spec's extremes */
    /* 254 finite codes as a [2, 127] weight (0x7f and 0xff left out) */
    uint8_t fin[254];
    int n = 0;
    for (int k = 0; k < 256; k++)
        if ((k & 0x7f) != 0x7f) fin[n++] = (uint8_t)k;
    /* 0x1.d12492p+0 x code 0x26 (0.21875) rounds to a bf16 tie in fp32: once, from the exact product */
    const float scales[] = {1.0f, 1.00390625f, 2.5e-4f, 0x1.d12492p+0f};
    char path[512];
    tmp_path(path, sizeof path, "codes.safetensors");
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
        st_in in[] = {{"w", "F8_E4M3", 2, 127, fin, 254}, {"w_scale_inv", "F32", 1, 1, &scales[si], 4}};
        write_st(path, in, 2);
        model_st_file f;
        assert_int_equal(model_st_open(&f, path), ZO_OK);
        int b[2] = {128, 128};
        uint16_t bf[254];
        float f32[254];
        assert_int_equal(model_st_read_fp8(&f, model_st_find(&f, "w"), &f, model_st_find(&f, "w_scale_inv"), b, bf,
                                           ZO_DTYPE_BF16, 0), ZO_OK);
        check_dequant(bf, ZO_DTYPE_BF16, fin, &scales[si], 2, 127, 128, 128, 0, "every code, bf16");
        assert_int_equal(model_st_read_fp8(&f, model_st_find(&f, "w"), &f, model_st_find(&f, "w_scale_inv"), b, f32,
                                           ZO_DTYPE_F32, 0), ZO_OK);
        check_dequant(f32, ZO_DTYPE_F32, fin, &scales[si], 2, 127, 128, 128, 0, "every code, f32");
        model_st_close(&f);
    }
    /* a NaN code anywhere, an infinite scale, an E5M2 infinity: refused */
    static const struct {
        uint8_t code;
        float scale;
        const char *dtype, *says, *at;
    } bad[] = {{0x7f, 1.0f, "F8_E4M3", "0x7f", "element 7 (row 1, column 2)"},
               {0xff, 1.0f, "F8_E4M3", "0xff", "element 7 (row 1, column 2)"},
               {0x38, INFINITY, "F8_E4M3", "inf", "element 0 "},
               {0x7c, 1.0f, "F8_E5M2", "0x7c", "element 7 (row 1, column 2)"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        uint8_t w[3 * 5];
        for (int i = 0; i < 15; i++) w[i] = 0x38; /* 1.0 in both */
        w[7] = bad[k].code;
        st_in in[] = {{"w", bad[k].dtype, 3, 5, w, 15}, {"w_scale_inv", "F32", 1, 1, &bad[k].scale, 4}};
        write_st(path, in, 2);
        model_st_file f;
        assert_int_equal(model_st_open(&f, path), ZO_OK);
        int b[2] = {128, 128};
        float out[15];
        const char *words[] = {"codes.safetensors", "\"w\"", bad[k].at, bad[k].says, "finite"};
        expect_error(model_st_read_fp8(&f, model_st_find(&f, "w"), &f, model_st_find(&f, "w_scale_inv"), b, out,
                                       ZO_DTYPE_F32, 0),
                     ZO_ERR_FORMAT, words, 5);
        model_st_close(&f);
    }
    /* E5M2's finite codes: read the same way */
    uint8_t e5[4] = {0x3c, 0x01, 0xbb, 0x7b};
    float one = 0.5f;
    st_in in[] = {{"w", "F8_E5M2", 2, 2, e5, 4}, {"w_scale_inv", "F32", 1, 1, &one, 4}};
    write_st(path, in, 2);
    model_st_file f;
    assert_int_equal(model_st_open(&f, path), ZO_OK);
    int b[2] = {128, 128};
    float out[4];
    assert_int_equal(model_st_read_fp8(&f, model_st_find(&f, "w"), &f, model_st_find(&f, "w_scale_inv"), b, out,
                                       ZO_DTYPE_F32, 0), ZO_OK);
    for (int i = 0; i < 4; i++) assert_true(out[i] == (float)(ref_fp8(e5[i], 0) * 0.5));
    model_st_close(&f);
}

/* A LLaMA layer with FP8 linear weights (136 x 136 and 200 x 136: blocks
 * cut at both edges) in one shard, their scales in the other, the rest F32
 * as DeepSeek-V3's files keep norms, embeddings and the head: loaded exactly
 * through the index, scales consumed; then the refusals. */
#define FP8_CFG                                                                                          \
    "{\"model_type\":\"llama\",\"num_hidden_layers\":1,\"hidden_size\":136,\"num_attention_heads\":2,"   \
    "\"num_key_value_heads\":2,\"intermediate_size\":200,\"vocab_size\":16,"                             \
    "\"max_position_embeddings\":64,\"rms_norm_eps\":1e-06,\"tie_word_embeddings\":false,"               \
    "\"quantization_config\":{\"activation_scheme\":\"dynamic\",\"fmt\":%s,\"quant_method\":\"fp8\"," \
    "\"weight_block_size\":%s}}"

typedef struct fp8_model {
    int n;
    st_in in[32];
    uint8_t *codes[16];
    float *vals[32];
    int fp8[32];      /* in[i] is an FP8 weight; its scale is in[i + 1] */
    int shard[32];    /* 0 or 1 */
} fp8_model;

static void fp8_model_build(fp8_model *m, const model_layout *l, int b0, int b1)
{
    memset(m, 0, sizeof *m);
    int nc = 0, nv = 0;
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *t = &l->tensors[i];
        if (t->ndim == 2 && strstr(t->name, "layers.")) {
            int64_t r = t->shape[0], c = t->shape[1], sr = (r + b0 - 1) / b0, sc = (c + b1 - 1) / b1;
            m->codes[nc] = fp8_codes(r, c, (unsigned)i);
            m->vals[nv] = fp8_scales(sr, sc);
            m->fp8[m->n] = 1;
            m->shard[m->n] = 0;
            m->in[m->n++] = (st_in){t->name, "F8_E4M3", r, c, m->codes[nc++], (size_t)(r * c)};
            char *sn = malloc(strlen(t->name) + 16);
            assert_non_null(sn);
            sprintf(sn, "%s_scale_inv", t->name);
            m->shard[m->n] = 1;
            m->in[m->n++] = (st_in){sn, "F32", sr, sc, m->vals[nv++], (size_t)(sr * sc) * 4};
        } else {
            float *v = malloc(t->numel * 4);
            assert_non_null(v);
            for (size_t k = 0; k < t->numel; k++) v[k] = (float)((int)(k % 13) - 6) * 0.0625f + 1.0f / 3.0f;
            m->vals[nv++] = v;
            m->shard[m->n] = strstr(t->name, "embed") ? 0 : 1;
            m->in[m->n++] = (st_in){t->name, "F32", t->shape[0], t->ndim == 2 ? t->shape[1] : -1, v, t->numel * 4};
        }
    }
}

static void fp8_model_free(fp8_model *m)
{
    for (int i = 0; i < m->n; i++)
        if (i && m->fp8[i - 1]) free((char *)m->in[i].name);
    for (int i = 0; i < 16; i++) free(m->codes[i]);
    for (int i = 0; i < 32; i++) free(m->vals[i]);
}

/* Writes the two shards and the index of dir (leaving out tensor `skip`). */
static void fp8_model_write(const fp8_model *m, const char *dir, int skip)
{
    char path[600], index[8192];
    size_t hl = (size_t)snprintf(index, sizeof index, "{\"metadata\":{},\"weight_map\":{");
    for (int s = 0; s < 2; s++) {
        st_in part[32];
        int n = 0;
        for (int i = 0; i < m->n; i++) {
            if (m->shard[i] != s || i == skip) continue;
            part[n++] = m->in[i];
            hl += (size_t)snprintf(index + hl, sizeof index - hl, "%s\"%s\":\"model-0000%d-of-00002.safetensors\"",
                                   hl > 30 ? "," : "", m->in[i].name, s + 1);
        }
        snprintf(path, sizeof path, "%s/model-0000%d-of-00002.safetensors", dir, s + 1);
        write_st(path, part, n);
    }
    snprintf(index + hl, sizeof index - hl, "}}");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    spit(path, index, strlen(index));
}

/* fp8_model_build's model of l (128 x 128 blocks) written into the new
 * folder `name` of the tests' temporary directory, its path in dir. */
static void fp8_model_at(fp8_model *m, const model_layout *l, const char *name, char dir[512])
{
    fp8_model_build(m, l, 128, 128);
    tmp_path(dir, 512, name);
    mkdir(dir, 0755);
    fp8_model_write(m, dir, -1);
}

/* Blocks of l in dt loaded strictly from path: every tensor of l, none
 * unexpected, n_ignored skipped (scales read with their weights). */
static void **load_strict(const char *path, const model_layout *l, zo_dtype dt, int n_ignored)
{
    void **blocks = alloc_blocks(l, dt);
    model_load_report rep;
    if (model_load_path(path, l, blocks, dt, MODEL_LOAD_STRICT, &rep)) fail_msg("%s", zo_last_error());
    assert_int_equal(rep.n_loaded, l->n_tensors);
    assert_int_equal(rep.n_unexpected, 0);
    assert_int_equal(rep.n_ignored, n_ignored);
    return blocks;
}

/* The layout of config.json text `json` (fails the test on error). */
static void layout_of_json(model_layout *l, const char *json)
{
    zo_model_config cfg;
    if (zo_model_config_parse(json, "config.json", &cfg)) fail_msg("%s", zo_last_error());
    if (model_layout_init(l, &cfg)) fail_msg("%s", zo_last_error());
}

/* FP8_CFG with fmt (a JSON value) and weight_block_size `block`, laid out. */
static void fp8_layout_fmt(model_layout *l, const char *fmt, const char *block)
{
    char json[1024];
    snprintf(json, sizeof json, FP8_CFG, fmt, block);
    layout_of_json(l, json);
}

static void fp8_layout(model_layout *l, const char *block)
{
    fp8_layout_fmt(l, "\"e4m3\"", block);
}

static void test_fp8_sharded_load(void **state)
{
    (void)state;
    model_layout l;
    fp8_layout(&l, "[128, 128]");
    fp8_model m;
    char dir[512];
    fp8_model_at(&m, &l, "fp8", dir);
    int n_fp8 = 0;
    for (int i = 0; i < m.n; i++) n_fp8 += m.fp8[i];
    assert_int_equal(n_fp8, 7); /* q, k, v, o, gate, up, down */
    for (int pass = 0; pass < 2; pass++) {
        zo_dtype dt = pass ? ZO_DTYPE_F32 : ZO_DTYPE_BF16;
        void **blocks = load_strict(dir, &l, dt, n_fp8); /* the scales, read with their weights */
        for (int i = 0; i < m.n; i++) {
            if (i && m.fp8[i - 1]) continue; /* a scale */
            const model_tensor *t = model_layout_find(&l, m.in[i].name);
            assert_non_null(t);
            const uint8_t *got = (const uint8_t *)blocks[t->block] + t->offset * zo_dtype_size(dt);
            if (m.fp8[i]) {
                check_dequant(got, dt, m.in[i].data, m.in[i + 1].data, t->shape[0], t->shape[1], 128, 128, 0,
                              t->name);
                continue;
            }
            const float *v = m.in[i].data;
            for (size_t k = 0; k < t->numel; k++)
                if (dt == ZO_DTYPE_F32 ? ((const float *)got)[k] != v[k]
                                       : ((const uint16_t *)got)[k] != ref_bf16((double)v[k]))
                    fail_msg("%s element %zu", t->name, k);
        }
        free_blocks(&l, blocks);
    }
    /* blocks of 64 x 64 said by the config: the 128-block scales have the wrong shape */
    model_layout l64;
    fp8_layout(&l64, "[64, 64]");
    void **blocks = alloc_blocks(&l64, ZO_DTYPE_BF16);
    const char *shape_words[] = {"model-00002-of-00002", "_scale_inv\"", "[64, 64]", "must be"};
    expect_error(model_load_path(dir, &l64, blocks, ZO_DTYPE_BF16, 0, NULL), ZO_ERR_FORMAT, shape_words, 4);
    free_blocks(&l64, blocks);
    model_layout_free(&l64);
    /* a weight without its scale */
    int q = 0;
    while (!m.fp8[q]) q++;
    fp8_model_write(&m, dir, q + 1);
    blocks = alloc_blocks(&l, ZO_DTYPE_BF16);
    char scale_name[160];
    snprintf(scale_name, sizeof scale_name, "\"%s_scale_inv\"", m.in[q].name);
    const char *miss_words[] = {"model-00001-of-00002", m.in[q].name, scale_name, "F8_E4M3"};
    expect_error(model_load_path(dir, &l, blocks, ZO_DTYPE_BF16, 0, NULL), ZO_ERR_FORMAT, miss_words, 4);
    /* a scale beside a weight that is not FP8 */
    uint16_t *bf = calloc((size_t)(m.in[q].rows * m.in[q].cols), 2);
    assert_non_null(bf);
    st_in keep = m.in[q];
    m.in[q] = (st_in){keep.name, "BF16", keep.rows, keep.cols, bf, keep.bytes * 2};
    fp8_model_write(&m, dir, -1);
    const char *stray_words[] = {"model-00002-of-00002", scale_name, "BF16", "not FP8"};
    expect_error(model_load_path(dir, &l, blocks, ZO_DTYPE_BF16, 0, NULL), ZO_ERR_FORMAT, stray_words, 4);
    m.in[q] = keep;
    free(bf);
    free_blocks(&l, blocks);
    /* DeepSeek-V3's config.json as published: 128 x 128; a config without one: the default (0) */
    zo_model_config v3;
    if (zo_model_config_load(ZO_FIXTURES_DIR "/hf-configs/deepseek-v3.json", &v3)) fail_msg("%s", zo_last_error());
    assert_int_equal(v3.fp8_block[0], 128);
    assert_int_equal(v3.fp8_block[1], 128);
    if (zo_model_config_load(FIX "/llama-tiny/config.json", &v3)) fail_msg("%s", zo_last_error());
    assert_int_equal(v3.fp8_block[0], 0);
    assert_int_equal(v3.fp8_block[1], 0);
    /* weight_block_size that is not two positive integers */
    const char *bad[] = {"[128]", "[128, 0]", "[128, 1.5]", "\"128\"", "[128, 128, 1]"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char json[1024];
        snprintf(json, sizeof json, FP8_CFG, "\"e4m3\"", bad[k]);
        zo_model_config cfg;
        const char *words[] = {"config.json", "quantization_config", "weight_block_size"};
        expect_error(zo_model_config_parse(json, "config.json", &cfg), ZO_ERR_FORMAT, words, 3);
    }
    fp8_model_free(&m);
    model_layout_free(&l);
}

/* quantization_config's fields the loader cannot honour, refused by name:
 * weight_block_size under a quant_method other than "fp8" (or none), an
 * fmt other than "e4m3" and "e5m2"; and at load, an FP8 weight of the
 * other format than fmt's (either way). activation_scheme's values are
 * accepted (training runs in its dtype), an fmt of e5m2 kept. */
static void test_fp8_config_fields(void **state)
{
    (void)state;
    static const struct {
        const char *qc, *field, *says;
    } bad[] = {
        {"{\"quant_method\":\"gptq\",\"weight_block_size\":[128,128]}", "weight_block_size", "\"gptq\""},
        {"{\"quant_method\":\"fbgemm_fp8\",\"fmt\":\"e4m3\",\"weight_block_size\":[128,128]}",
         "weight_block_size", "\"fbgemm_fp8\""},
        {"{\"weight_block_size\":[128,128]}", "weight_block_size", "(none)"},
        {"{\"quant_method\":\"fp8\",\"fmt\":\"e3m4\",\"weight_block_size\":[128,128]}", "\"fmt\"", "\"e3m4\""},
        {"{\"quant_method\":\"fp8\",\"fmt\":\"E4M3\"}", "\"fmt\"", "\"E4M3\""},
        {"{\"quant_method\":\"fp8\",\"fmt\":8}", "\"fmt\"", "not a string"},
    };
    const char *head = "{\"model_type\":\"llama\",\"num_hidden_layers\":1,\"hidden_size\":136,"
                       "\"num_attention_heads\":2,\"intermediate_size\":200,\"vocab_size\":16,"
                       "\"quantization_config\":";
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char json[1024];
        snprintf(json, sizeof json, "%s%s}", head, bad[k].qc);
        zo_model_config cfg;
        const char *words[] = {"config.json", "field \"quantization_config\"", bad[k].field, bad[k].says};
        expect_error(zo_model_config_parse(json, "config.json", &cfg), ZO_ERR_UNSUPPORTED, words, 4);
    }
    static const struct {
        const char *qc, *fmt;
    } good[] = {
        {"{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\",\"activation_scheme\":\"static\"}", "e5m2"},
        {"{\"quant_method\":\"fp8\",\"activation_scheme\":\"dynamic\",\"weight_block_size\":[64,64]}", ""},
        {"{\"quant_method\":\"fp8\",\"fmt\":null,\"activation_scheme\":\"per-tensor\"}", ""},
        {"{\"quant_method\":\"gptq\",\"bits\":4}", ""}, /* (not read: the loader refuses its dtypes) */
    };
    for (size_t k = 0; k < sizeof good / sizeof good[0]; k++) {
        char json[1024];
        snprintf(json, sizeof json, "%s%s}", head, good[k].qc);
        zo_model_config cfg;
        if (zo_model_config_parse(json, "config.json", &cfg)) fail_msg("%s: %s", good[k].qc, zo_last_error());
        assert_string_equal(cfg.fp8_fmt, good[k].fmt);
    }
    /* at load: E4M3 weights under fmt "e5m2"; one E5M2 weight under "e4m3" */
    model_layout l4, l5;
    fp8_layout(&l4, "[128, 128]");
    fp8_layout_fmt(&l5, "\"e5m2\"", "[128, 128]");
    fp8_model m;
    char dir[512];
    fp8_model_at(&m, &l4, "fp8fmt", dir);
    void **blocks = alloc_blocks(&l4, ZO_DTYPE_BF16);
    if (model_load_path(dir, &l4, blocks, ZO_DTYPE_BF16, MODEL_LOAD_STRICT, NULL)) fail_msg("%s", zo_last_error());
    int q = 0;
    while (!m.fp8[q]) q++;
    const char *e5_words[] = {"model-00001-of-00002", m.in[q].name, "F8_E4M3", "\"fmt\" is \"e5m2\""};
    expect_error(model_load_path(dir, &l5, blocks, ZO_DTYPE_BF16, 0, NULL), ZO_ERR_FORMAT, e5_words, 4);
    int last = m.n - 1;
    while (!m.fp8[last]) last--;
    m.in[last].dtype = "F8_E5M2";
    fp8_model_write(&m, dir, -1);
    const char *e4_words[] = {"model-00001-of-00002", m.in[last].name, "F8_E5M2", "\"fmt\" is \"e4m3\""};
    expect_error(model_load_path(dir, &l4, blocks, ZO_DTYPE_BF16, 0, NULL), ZO_ERR_FORMAT, e4_words, 4);
    free_blocks(&l4, blocks);
    fp8_model_free(&m);
    model_layout_free(&l4);
    model_layout_free(&l5);
}

/* A failing fill leaves the old file in place and no temporary behind. */
static zo_status failing_fill(void *ctx, int index, uint64_t first, uint64_t count, void *dst)
{
    (void)ctx;
    (void)index;
    (void)first;
    (void)count;
    (void)dst;
    return zo_error(ZO_ERR_IO, "simulated read failure");
}

/* ---- MXFP4 (OCP Microscaling) checkpoints ------------------------------------------ */

/* The reference, from the OCP Microscaling (MX) spec: an E2M1 code is a
 * sign, 2 exponent bits of bias 1 and 1 mantissa bit (exponent 0: m / 2);
 * an E8M0 scale s is 2^(s - 127). */
static double ref_e2m1(unsigned code)
{
    unsigned e = (code >> 1) & 3u, m = code & 1u;
    double v = e ? (1.0 + m / 2.0) * ldexp(1.0, (int)e - 1) : m / 2.0;
    return code & 8u ? -v : v;
}

/* Element [p][c][r] of the weight X [P, C, R] held by blocks bl [P, R, C /
 * 32, 16] (two codes a byte, the low nibble first) and scales sc [P, R, C /
 * 32]: D[p][r][c], D being X transposed, exactly. */
static double ref_mx(const uint8_t *bl, const uint8_t *sc, int64_t R, int64_t C, int64_t p, int64_t c, int64_t r)
{
    int64_t blk = (p * R + r) * (C / 32) + c / 32;
    uint8_t byte = bl[blk * 16 + (c % 32) / 2];
    return ref_e2m1(c % 2 ? byte >> 4 : byte & 15u) * ldexp(1.0, sc[blk] - 127);
}

/* Element `at` of dst is x rounded once to nearest even in dt (its sign too). */
static int mx_equal(const void *dst, zo_dtype dt, size_t at, double x)
{
    if (dt == ZO_DTYPE_BF16) return ((const uint16_t *)dst)[at] == ref_bf16(x);
    float want = dt == ZO_DTYPE_F32 ? (float)x : (float)ref_round(x, 11, -14);
    float got = zo_load_f32(dst, dt, at);
    return got == want && !signbit(got) == !signbit(want);
}

/* Every element of got, X [P, C, R] (D [P, R, C] with d_order) read from
 * bl and sc, is the reference's. */
static void mx_check(const void *got, zo_dtype dt, const uint8_t *bl, const uint8_t *sc, int64_t P, int64_t R,
                     int64_t C, int d_order)
{
    for (int64_t p = 0; p < P; p++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t r = 0; r < R; r++) {
                size_t at = (size_t)(d_order ? (p * R + r) * C + c : (p * C + c) * R + r);
                double want = ref_mx(bl, sc, R, C, p, c, r);
                if (!mx_equal(got, dt, at, want))
                    fail_msg("%s: %s of expert %lld, row %lld of D, column %lld: want %g", zo_dtype_name(dt),
                             d_order ? "D" : "X", (long long)p, (long long)r, (long long)c, want);
            }
}

/* Blocks and scales of a [P, C = 32 G, R] weight: every byte value in turn,
 * the scales every value of [s_lo, s_lo + s_n) in turn; under scales past
 * 252 the codes of magnitude 2 and more are cleared (they would overflow
 * F32 and BF16). */
static void mx_fill(uint8_t **bl, uint8_t **sc, int64_t P, int64_t R, int64_t G, unsigned seed, int s_lo, int s_n)
{
    size_t n = (size_t)(P * R * G);
    *bl = malloc(n * 16);
    *sc = malloc(n);
    assert_non_null(*bl);
    assert_non_null(*sc);
    for (size_t k = 0; k < n; k++) {
        (*sc)[k] = (uint8_t)(s_lo + (int)((k * 7 + seed) % (unsigned)s_n));
        for (int j = 0; j < 16; j++) {
            uint8_t b = (uint8_t)((k * 16 + (size_t)j) * 7 + seed);
            (*bl)[k * 16 + (size_t)j] = (*sc)[k] > 252 ? b & 0xbb : b;
        }
    }
}

/* The file holding w_blocks and w_scales of a [P, 32 G, R] weight (P 0: 2-D). */
static void mx_write(const char *path, const uint8_t *bl, const uint8_t *sc, int64_t P, int64_t R, int64_t G,
                     const char *bdt, const char *sdt, int64_t s_last)
{
    int64_t p = P ? P : 1;
    st_nd in[2] = {{"w_blocks", bdt, P ? 4 : 3, {0}, bl, (size_t)(p * R * G * 16)},
                   {"w_scales", sdt, P ? 3 : 2, {0}, sc, (size_t)(p * R * s_last)}};
    int64_t bd[4] = {P, R, G, 16}, sd[3] = {P, R, s_last};
    memcpy(in[0].dims, bd + !P, sizeof(int64_t) * (size_t)in[0].ndim);
    memcpy(in[1].dims, sd + !P, sizeof(int64_t) * (size_t)in[1].ndim);
    write_st_nd(path, in, 2);
}

/* Reads elements [first, first + n) (of D with transpose) of the file's weight into dt. */
static void *mx_read(const char *path, zo_dtype dt, uint64_t first, uint64_t n, int transpose)
{
    model_st_file f;
    if (model_st_open(&f, path)) fail_msg("%s", zo_last_error());
    void *dst = malloc((size_t)n * 4 + 4);
    assert_non_null(dst);
    if (model_st_read_mxfp4(&f, model_st_find(&f, "w_blocks"), &f, model_st_find(&f, "w_scales"), first, n, dst, dt,
                            transpose))
        fail_msg("%s", zo_last_error());
    model_st_close(&f);
    return dst;
}

/* Weights of several experts, an odd number of rows (37: a 32-row tile and
 * 5) and columns across 32-value blocks, every code under every scale
 * (0 and 254 included), exactly the reference's in BF16 and F32 (F16 at
 * scales it holds, its subnormals rounded); runs of elements starting and
 * ending inside rows and experts (Granite-MoE's gate half of an expert);
 * D, each expert's X transposed back, whole and a run across experts;
 * a 2-D weight of gpt-oss's width (2880 columns of 3000 rows: two bands of
 * the read) plain and transposed. */
static void test_mxfp4_dequant(void **state)
{
    (void)state;
    char path[512];
    tmp_path(path, sizeof path, "mx.safetensors");
    const int64_t P = 3, R = 37, G = 3, C = 96;
    uint8_t *bl, *sc;
    int seen_code[16] = {0}, seen0 = 0, seen254 = 0;
    mx_fill(&bl, &sc, P, R, G, 11, 0, 255);
    for (int64_t k = 0; k < P * R * G; k++) {
        seen0 |= sc[k] == 0;
        seen254 |= sc[k] == 254;
        for (int j = 0; j < 16; j++) seen_code[bl[k * 16 + j] & 15] = seen_code[bl[k * 16 + j] >> 4] = 1;
    }
    assert_true(seen0 && seen254);
    for (int k = 0; k < 16; k++) assert_true(seen_code[k]);
    mx_write(path, bl, sc, P, R, G, "U8", "U8", G);
    const zo_dtype dts[2] = {ZO_DTYPE_BF16, ZO_DTYPE_F32};
    for (int d = 0; d < 2; d++) {
        void *x = mx_read(path, dts[d], 0, (uint64_t)(P * C * R), 0);
        mx_check(x, dts[d], bl, sc, P, R, C, 0);
        /* runs: from inside a row across experts; an expert's first 48 rows of X (its gate) */
        const uint64_t runs[3][2] = {{(uint64_t)R * 5 + 3, (uint64_t)(2 * C * R - 50)},
                                     {(uint64_t)(C * R + 48 * R), (uint64_t)(48 * R)},
                                     {(uint64_t)(3 * C * R - 7), 7}};
        size_t esz = zo_dtype_size(dts[d]);
        for (int k = 0; k < 3; k++) {
            uint8_t *part = mx_read(path, dts[d], runs[k][0], runs[k][1], 0);
            if (memcmp(part, (uint8_t *)x + runs[k][0] * esz, (size_t)runs[k][1] * esz))
                fail_msg("%s: the run of %llu from %llu differs from the whole read", zo_dtype_name(dts[d]),
                         (unsigned long long)runs[k][1], (unsigned long long)runs[k][0]);
            free(part);
        }
        /* D itself (each expert's X transposed back), whole and a run across experts */
        uint8_t *t = mx_read(path, dts[d], 0, (uint64_t)(P * C * R), 1);
        mx_check(t, dts[d], bl, sc, P, R, C, 1);
        uint8_t *tp = mx_read(path, dts[d], (uint64_t)(R * C - 40), (uint64_t)(C * 3 + 80), 1);
        assert_memory_equal(tp, t + (size_t)(R * C - 40) * esz, (size_t)(C * 3 + 80) * esz);
        free(tp);
        free(t);
        free(x);
    }
    free(bl);
    free(sc);
    /* F16: scales 2^-27 .. 2^13 (below 2^-25 everything rounds to zero) */
    mx_fill(&bl, &sc, P, R, G, 5, 100, 41);
    mx_write(path, bl, sc, P, R, G, "U8", "U8", G);
    void *h = mx_read(path, ZO_DTYPE_F16, 0, (uint64_t)(P * C * R), 0);
    mx_check(h, ZO_DTYPE_F16, bl, sc, P, R, C, 0);
    free(h);
    free(bl);
    free(sc);
    /* 2-D: X [2880, 3000]; transposed (D [3000, 2880]), whole and a run */
    const int64_t R2 = 3000, G2 = 90, C2 = 2880;
    mx_fill(&bl, &sc, 1, R2, G2, 3, 0, 253);
    mx_write(path, bl, sc, 0, R2, G2, "U8", "U8", G2);
    uint16_t *x = mx_read(path, ZO_DTYPE_BF16, 0, (uint64_t)(C2 * R2), 0);
    uint16_t *t = mx_read(path, ZO_DTYPE_BF16, 0, (uint64_t)(C2 * R2), 1);
    for (int64_t c = 0; c < C2; c++)
        for (int64_t r = 0; r < R2; r++) {
            uint16_t want = ref_bf16(ref_mx(bl, sc, R2, C2, 0, c, r));
            if (x[c * R2 + r] != want || t[r * C2 + c] != want)
                fail_msg("2-D [%lld, %lld]: 0x%04x, transposed 0x%04x, want 0x%04x", (long long)c, (long long)r,
                         x[c * R2 + r], t[r * C2 + c], want);
        }
    uint16_t *tr = mx_read(path, ZO_DTYPE_BF16, (uint64_t)C2 * 7 + 5, 100000, 1);
    assert_memory_equal(tr, t + C2 * 7 + 5, 100000 * 2);
    free(tr);
    free(t);
    free(x);
    free(bl);
    free(sc);
}

/* Every refusal names the file, the tensor and what is wrong: blocks not
 * U8 or not [..., R, G, 16], scales not U8 or not [..., R, G], a scale of
 * 255 (E8M0's NaN), a product past the dtype's largest, a run outside the
 * weight. */
static void test_mxfp4_refusals(void **state)
{
    (void)state;
    char path[512];
    tmp_path(path, sizeof path, "mxbad.safetensors");
    const int64_t P = 2, R = 5, G = 2;
    uint8_t *bl, *sc;
    mx_fill(&bl, &sc, P, R, G, 1, 120, 10);
    uint16_t out[2 * 64 * 5];
    static const struct {
        const char *bdt, *sdt;
        int64_t s_last;
        const char *word[3];
    } bad[] = {{"I8", "U8", 2, {"\"w_blocks\"", "I8", "must be U8"}},
               {"U8", "I8", 2, {"\"w_scales\"", "I8", "\"w_blocks\""}},
               {"U8", "U8", 1, {"\"w_scales\"", "shape", "\"w_blocks\""}}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        mx_write(path, bl, sc, P, R, G, bad[k].bdt, bad[k].sdt, bad[k].s_last);
        model_st_file f;
        if (model_st_open(&f, path)) fail_msg("%s", zo_last_error());
        const char *words[4] = {"mxbad.safetensors", bad[k].word[0], bad[k].word[1], bad[k].word[2]};
        expect_error(model_st_read_mxfp4(&f, model_st_find(&f, "w_blocks"), &f, model_st_find(&f, "w_scales"), 0, 1,
                                         out, ZO_DTYPE_BF16, 0),
                     ZO_ERR_FORMAT, words, 4);
        model_st_close(&f);
    }
    /* blocks of 8 bytes: not MXFP4's 16 */
    st_nd in8[2] = {{"w_blocks", "U8", 4, {P, R, 2 * G, 8}, bl, (size_t)(P * R * G * 16)},
                    {"w_scales", "U8", 3, {P, R, G}, sc, (size_t)(P * R * G)}};
    write_st_nd(path, in8, 2);
    model_st_file f;
    if (model_st_open(&f, path)) fail_msg("%s", zo_last_error());
    const char *w8[] = {"\"w_blocks\"", "the last 8", "columns / 32, 16]"};
    expect_error(model_st_read_mxfp4(&f, model_st_find(&f, "w_blocks"), &f, model_st_find(&f, "w_scales"), 0, 1, out,
                                     ZO_DTYPE_BF16, 0),
                 ZO_ERR_FORMAT, w8, 3);
    model_st_close(&f);
    /* scale 255 in block 1 of row 3 of expert 1 (scales element 17); then 254 under code 7 (6) in
     * column 38 of that row of D: X's element [1][38][3] */
    sc[(1 * R + 3) * G + 1] = 255;
    mx_write(path, bl, sc, P, R, G, "U8", "U8", G);
    if (model_st_open(&f, path)) fail_msg("%s", zo_last_error());
    const char *wnan[] = {"mxbad.safetensors", "\"w_scales\" element 17", "255 is NaN"};
    expect_error(model_st_read_mxfp4(&f, model_st_find(&f, "w_blocks"), &f, model_st_find(&f, "w_scales"), 0,
                                     (uint64_t)(P * 64 * R), out, ZO_DTYPE_BF16, 0),
                 ZO_ERR_FORMAT, wnan, 3);
    model_st_close(&f);
    sc[(1 * R + 3) * G + 1] = 254;
    for (int j = 0; j < 16; j++) bl[((1 * R + 3) * G + 1) * 16 + j] = 0x11; /* 0.5: finite */
    bl[((1 * R + 3) * G + 1) * 16 + 3] = 0x17; /* byte 3: column 38 of D (low nibble: 6), 39 (0.5) */
    mx_write(path, bl, sc, P, R, G, "U8", "U8", G);
    if (model_st_open(&f, path)) fail_msg("%s", zo_last_error());
    char at[64];
    snprintf(at, sizeof at, "element %d ", 1 * 64 * 5 + 38 * 5 + 3);
    const char *winf[] = {"mxbad.safetensors", "\"w_blocks\"", at, "0x7", "bf16"};
    expect_error(model_st_read_mxfp4(&f, model_st_find(&f, "w_blocks"), &f, model_st_find(&f, "w_scales"), 0,
                                     (uint64_t)(P * 64 * R), out, ZO_DTYPE_BF16, 0),
                 ZO_ERR_FORMAT, winf, 5);
    /* F16 overflows sooner: a scale of 2^16 under code 6 */
    sc[(1 * R + 3) * G + 1] = 127 + 16;
    model_st_close(&f);
    mx_write(path, bl, sc, P, R, G, "U8", "U8", G);
    if (model_st_open(&f, path)) fail_msg("%s", zo_last_error());
    const char *wh[] = {"\"w_blocks\"", at, "fp16"};
    expect_error(model_st_read_mxfp4(&f, model_st_find(&f, "w_blocks"), &f, model_st_find(&f, "w_scales"), 0,
                                     (uint64_t)(P * 64 * R), out, ZO_DTYPE_F16, 0),
                 ZO_ERR_FORMAT, wh, 3);
    /* outside the weight */
    const char *wout[] = {"\"w_blocks\"", "outside"};
    expect_error(model_st_read_mxfp4(&f, model_st_find(&f, "w_blocks"), &f, model_st_find(&f, "w_scales"),
                                     (uint64_t)(P * 64 * R), 1, out, ZO_DTYPE_BF16, 0),
                 ZO_ERR_INVALID, wout, 2);
    model_st_close(&f);
    free(bl);
    free(sc);
}

/* A Granite-MoE layer (its experts fused: input_linear [3, 2 f, 64],
 * output_linear [3, 64, f]) as an MXFP4 checkpoint would hold it. */
#define MX_CFG                                                                                                  \
    "{\"model_type\":\"granitemoe\",\"num_hidden_layers\":1,\"hidden_size\":64,\"num_attention_heads\":2,"      \
    "\"num_key_value_heads\":2,\"intermediate_size\":%d,\"num_local_experts\":3,\"num_experts_per_tok\":2,"      \
    "\"vocab_size\":16,\"max_position_embeddings\":64,\"rms_norm_eps\":1e-06,\"tie_word_embeddings\":true%s}"
#define MX_QC ",\"quantization_config\":{\"quant_method\":\"mxfp4\",\"modules_to_not_convert\":[%s]}"
#define MX_KEEP "\"model.layers.*.self_attn\",\"model.layers.*.block_sparse_moe.router\",\"model.embed_tokens\""

typedef struct mx_model {
    int n;
    st_nd in[24];
    char names[24][MODEL_TENSOR_NAME_MAX + 16];
    void *data[24];
    int64_t A[24], B[24]; /* in[i] the blocks of a fused X [3, A, B] (in[i + 1] its scales); A 0: F32 */
} mx_model;

static void mx_layout(model_layout *l, int ffn, const char *qc)
{
    char json[2048];
    snprintf(json, sizeof json, MX_CFG, ffn, qc);
    layout_of_json(l, json);
}

static void mx_model_build(mx_model *m, const model_layout *l)
{
    memset(m, 0, sizeof *m);
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *t = &l->tensors[i];
        if (model_tensor_fused_rest(t)) continue;
        assert_true(m->n + 2 <= 24);
        int k = m->n;
        if (t->hf_fused[0] && t->hf_fused[2]) { /* (a 2-D fused tensor, gpt-oss's biases: F32 below) */
            int64_t E = t->hf_fused[0], A = t->hf_fused[1], B = t->hf_fused[2];
            uint8_t *bl, *sc;
            mx_fill(&bl, &sc, E, B, A / 32, (unsigned)i, 110, 30);
            m->A[k] = A;
            m->B[k] = B;
            snprintf(m->names[k], sizeof m->names[k], "%s_blocks", t->name);
            snprintf(m->names[k + 1], sizeof m->names[k + 1], "%s_scales", t->name);
            m->in[k] = (st_nd){m->names[k], "U8", 4, {E, B, A / 32, 16}, bl, (size_t)(E * B * A / 2)};
            m->in[k + 1] = (st_nd){m->names[k + 1], "U8", 3, {E, B, A / 32}, sc, (size_t)(E * B * A / 32)};
            m->data[k] = bl;
            m->data[k + 1] = sc;
            m->n += 2;
            continue;
        }
        const int fused = t->hf_fused[0] != 0;
        size_t numel = fused ? (size_t)model_tensor_fused_numel(t) : t->numel;
        float *v = malloc(numel * 4);
        assert_non_null(v);
        for (size_t j = 0; j < numel; j++) v[j] = (float)((int)((j + (size_t)i) % 11) - 5) * 0.125f;
        snprintf(m->names[k], sizeof m->names[k], "%s", t->name);
        m->in[k] = (st_nd){m->names[k], "F32", fused ? 2 : t->ndim,
                           {fused ? t->hf_fused[0] : t->shape[0], fused ? t->hf_fused[1] : t->ndim == 2 ? t->shape[1] : 0},
                           v, numel * 4};
        m->data[k] = v;
        m->n++;
    }
}

static void mx_model_free(mx_model *m)
{
    for (int i = 0; i < m->n; i++) free(m->data[i]);
}

/* The model's file with tensor `skip` left out and `extra` (may be NULL) added. */
static void mx_model_write(const mx_model *m, const char *path, int skip, const st_nd *extra)
{
    st_nd in[26];
    int n = 0;
    for (int i = 0; i < m->n; i++)
        if (i != skip) in[n++] = m->in[i];
    if (extra) in[n++] = *extra;
    write_st_nd(path, in, n);
}

/* gpt-oss as published: its experts' gate_up_proj [E, h, 2 f] and
 * down_proj [E, f, h] as MXFP4 (blocks of D, each expert's matrix
 * transposed: [E, 2 f, h / 32, 16] and [E, h, f / 32, 16]), their biases,
 * the router, the attention and the sinks unquantized. Loaded strictly in
 * BF16 and F32, each expert's gate row i is the file's column 2i of its
 * [h, 2 f] matrix, its up row i column 2i + 1, its down [h, f] the
 * transpose of its [f, h], the biases likewise, every element the
 * reference's (index arithmetic written here). */
static void test_mxfp4_gpt_oss_load(void **state)
{
    (void)state;
    char path[512];
    model_layout l;
    layout_of_json(&l, "{\"model_type\":\"gpt_oss\",\"num_hidden_layers\":1,\"hidden_size\":64,"
                       "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":32,"
                       "\"intermediate_size\":32,\"num_local_experts\":3,\"num_experts_per_tok\":2,"
                       "\"vocab_size\":16,\"quantization_config\":{\"quant_method\":\"mxfp4\","
                       "\"modules_to_not_convert\":[\"model.layers.*.self_attn\",\"model.layers.*.mlp.router\","
                       "\"model.embed_tokens\",\"lm_head\"]}}");
    mx_model m;
    mx_model_build(&m, &l);
    tmp_path(path, sizeof path, "mxoss.safetensors");
    mx_model_write(&m, path, -1, NULL);
    const int64_t f = 32;
    for (int pass = 0; pass < 2; pass++) {
        zo_dtype dt = pass ? ZO_DTYPE_F32 : ZO_DTYPE_BF16;
        void **blocks = load_strict(path, &l, dt, 4); /* two blocks and two scales */
        int checked = 0;
        for (int i = 0; i < l.n_tensors; i++) {
            const model_tensor *t = &l.tensors[i];
            const uint8_t *got = (const uint8_t *)blocks[t->block] + t->offset * zo_dtype_size(dt);
            const int mx = t->hf_fused[0] && t->hf_fused[2];
            char name[MODEL_TENSOR_NAME_MAX + 16];
            snprintf(name, sizeof name, "%s%s", t->name, mx ? "_blocks" : "");
            int k = 0;
            while (k < m.n && strcmp(m.in[k].name, name)) k++;
            assert_true(k < m.n);
            const int gate_up = t->role == MODEL_ROLE_EXPERT_GATE_UP_W || t->role == MODEL_ROLE_EXPERT_GATE_UP_B;
            const int64_t e = t->hf_fused[0] ? (int64_t)t->hf_fused_at / (t->hf_fused[1] * (mx ? t->hf_fused[2] : 1)) : 0;
            for (size_t j = 0; j < t->numel; j++) {
                /* our row and column; the file's column of our row (gate i at 2i, up i at 2i + 1) */
                int64_t row = t->ndim == 2 ? (int64_t)j / t->shape[1] : (int64_t)j;
                int64_t col = t->ndim == 2 ? (int64_t)j % t->shape[1] : 0;
                int64_t c = gate_up ? (row < f ? 2 * row : 2 * (row - f) + 1) : row;
                double want;
                if (mx) /* X [E, A, B]: ours [B, A] transposed, X[e][col][c] */
                    want = ref_mx(m.in[k].data, m.in[k + 1].data, m.B[k], m.A[k], e, col, c);
                else if (t->hf_fused[0])
                    want = ((const float *)m.in[k].data)[e * t->hf_fused[1] + c];
                else
                    want = ((const float *)m.in[k].data)[j];
                if (!mx_equal(got, dt, j, want)) fail_msg("%s element %zu (expert %lld): want %g", t->name, j, (long long)e, want);
            }
            checked += t->hf_fused[0] != 0;
        }
        assert_int_equal(checked, 3 * 4);
        free_blocks(&l, blocks);
    }
    mx_model_free(&m);
    model_layout_free(&l);
}

/* An MXFP4 Granite-MoE checkpoint (quant_method "mxfp4", the attention,
 * router and embedding kept unquantized) loads strictly, each expert's
 * gate, up and down the reference's dequantized slice of the fused
 * weights (the gate's rows end inside a 32-value block), in BF16 and
 * F32, its blocks and scales consumed. Refused by name: a config without
 * quant_method "mxfp4", a module modules_to_not_convert keeps, scales
 * missing, the weight twice, a stray _blocks (strict), a weight whose
 * columns are no multiple of 32. */
static void test_mxfp4_granitemoe_load(void **state)
{
    (void)state;
    char qc[512], path[512];
    snprintf(qc, sizeof qc, MX_QC, MX_KEEP);
    model_layout l;
    mx_layout(&l, 48, qc);
    assert_string_equal(l.cfg.quant_method, "mxfp4");
    assert_string_equal(l.cfg.quant_keep,
                        "model.layers.*.self_attn\nmodel.layers.*.block_sparse_moe.router\nmodel.embed_tokens\n");
    mx_model m;
    mx_model_build(&m, &l);
    tmp_path(path, sizeof path, "mxmoe.safetensors");
    mx_model_write(&m, path, -1, NULL);
    int n_mx = 0;
    for (int i = 0; i < m.n; i++) n_mx += m.A[i] > 0;
    assert_int_equal(n_mx, 2);
    for (int pass = 0; pass < 2; pass++) {
        zo_dtype dt = pass ? ZO_DTYPE_F32 : ZO_DTYPE_BF16;
        void **blocks = load_strict(path, &l, dt, 2 * n_mx); /* blocks and scales */
        for (int i = 0; i < l.n_tensors; i++) {
            const model_tensor *t = &l.tensors[i];
            const uint8_t *got = (const uint8_t *)blocks[t->block] + t->offset * zo_dtype_size(dt);
            char name[MODEL_TENSOR_NAME_MAX + 16];
            snprintf(name, sizeof name, "%s%s", t->name, t->hf_fused[0] ? "_blocks" : "");
            int k = 0;
            while (k < m.n && strcmp(m.in[k].name, name)) k++;
            assert_true(k < m.n);
            for (size_t j = 0; j < t->numel; j++) {
                double want;
                if (t->hf_fused[0]) {
                    int64_t A = m.A[k], B = m.B[k], x = (int64_t)(t->hf_fused_at + j);
                    want = ref_mx(m.in[k].data, m.in[k + 1].data, B, A, x / (A * B), x / B % A, x % B);
                } else {
                    want = ((const float *)m.in[k].data)[j];
                }
                if (!mx_equal(got, dt, j, want)) fail_msg("%s element %zu: want %g", t->name, j, want);
            }
        }
        free_blocks(&l, blocks);
    }
    void **blocks = alloc_blocks(&l, ZO_DTYPE_BF16);
    const char *in_b = "model.layers.0.block_sparse_moe.input_linear.weight_blocks";
    /* no quantization_config; another quant_method; the experts kept unquantized */
    const char *other[3] = {"", ",\"quantization_config\":{\"quant_method\":\"fp8\"}", ""};
    char keep_moe[512];
    snprintf(keep_moe, sizeof keep_moe, MX_QC, "\"lm_head\",\"model.layers.*.block_sparse_moe\"");
    other[2] = keep_moe;
    const char *why[3][2] = {{"quant_method", "not given"}, {"quant_method", "\"fp8\""},
                             {"modules_to_not_convert", "\"model.layers.*.block_sparse_moe\""}};
    for (int k = 0; k < 3; k++) {
        model_layout lo;
        mx_layout(&lo, 48, other[k]);
        const char *words[4] = {"mxmoe.safetensors", in_b, why[k][0], why[k][1]};
        expect_error(model_load_path(path, &lo, blocks, ZO_DTYPE_BF16, MODEL_LOAD_STRICT, NULL), ZO_ERR_FORMAT, words,
                     4);
        model_layout_free(&lo);
    }
    /* scales missing */
    int q = 0;
    while (strcmp(m.in[q].name, in_b)) q++;
    mx_model_write(&m, path, q + 1, NULL);
    const char *wmiss[] = {in_b, "input_linear.weight_scales\"", "E8M0"};
    expect_error(model_load_path(path, &l, blocks, ZO_DTYPE_BF16, MODEL_LOAD_STRICT, NULL), ZO_ERR_FORMAT, wmiss, 3);
    /* the weight twice: as MXFP4 and as F32 */
    float *w = calloc(3 * 96 * 64, 4);
    assert_non_null(w);
    st_nd twice = {"model.layers.0.block_sparse_moe.input_linear.weight", "F32", 3, {3, 96, 64}, w, 3 * 96 * 64 * 4};
    mx_model_write(&m, path, -1, &twice);
    const char *wtwice[] = {in_b, "twice", "F32"};
    expect_error(model_load_path(path, &l, blocks, ZO_DTYPE_BF16, MODEL_LOAD_STRICT, NULL), ZO_ERR_FORMAT, wtwice, 3);
    free(w);
    /* blocks of no weight of the model: unexpected (strict) */
    st_nd stray = m.in[q];
    stray.name = "model.layers.0.block_sparse_moe.experts_blocks";
    mx_model_write(&m, path, -1, &stray);
    const char *wstray[] = {"experts_blocks", "not in the model"};
    expect_error(model_load_path(path, &l, blocks, ZO_DTYPE_BF16, MODEL_LOAD_STRICT, NULL), ZO_ERR_FORMAT, wstray, 2);
    free_blocks(&l, blocks);
    /* intermediate_size 40: input_linear [3, 80, 64], 80 columns of D per row are no multiple of 32 */
    mx_model_write(&m, path, -1, NULL);
    model_layout l40;
    mx_layout(&l40, 40, qc);
    blocks = alloc_blocks(&l40, ZO_DTYPE_BF16);
    const char *w40[] = {in_b, "[3, 80, 64]", "not a multiple of 32"};
    expect_error(model_load_path(path, &l40, blocks, ZO_DTYPE_BF16, 0, NULL), ZO_ERR_FORMAT, w40, 3);
    free_blocks(&l40, blocks);
    model_layout_free(&l40);
    mx_model_free(&m);
    model_layout_free(&l);
}

/* quantization_config under "mxfp4": quant_method kept, modules_to_not_convert
 * an array of non-empty strings or refused by name; weight_block_size refused. */
static void test_mxfp4_config_fields(void **state)
{
    (void)state;
    const char *bad[] = {"\"lm_head\"", "[1]", "[\"\"]", "{\"a\":1}"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char qc[256], json[2048];
        snprintf(qc, sizeof qc, ",\"quantization_config\":{\"quant_method\":\"mxfp4\",\"modules_to_not_convert\":%s}",
                 bad[k]);
        snprintf(json, sizeof json, MX_CFG, 48, qc);
        zo_model_config cfg;
        const char *words[] = {"config.json", "quantization_config", "modules_to_not_convert"};
        expect_error(zo_model_config_parse(json, "config.json", &cfg), ZO_ERR_FORMAT, words, 3);
    }
    char json[2048];
    snprintf(json, sizeof json, MX_CFG, 48,
             ",\"quantization_config\":{\"quant_method\":\"mxfp4\",\"weight_block_size\":[32,32]}");
    zo_model_config cfg;
    const char *wb[] = {"quantization_config", "weight_block_size", "\"mxfp4\""};
    expect_error(zo_model_config_parse(json, "config.json", &cfg), ZO_ERR_UNSUPPORTED, wb, 3);
    snprintf(json, sizeof json, MX_CFG, 48, ",\"quantization_config\":{\"quant_method\":7}");
    const char *wq[] = {"quantization_config", "quant_method", "string"};
    expect_error(zo_model_config_parse(json, "config.json", &cfg), ZO_ERR_FORMAT, wq, 3);
    snprintf(json, sizeof json, MX_CFG, 48, ",\"quantization_config\":{\"quant_method\":\"mxfp4\"}");
    if (zo_model_config_parse(json, "config.json", &cfg)) fail_msg("%s", zo_last_error());
    assert_string_equal(cfg.quant_method, "mxfp4");
    assert_string_equal(cfg.quant_keep, "");
}

static void test_st_write_atomic(void **state)
{
    (void)state;
    char path[512];
    tmp_path(path, sizeof path, "atomic.safetensors");
    spit(path, "old", 3);
    model_st_entry e = {.name = "x", .dtype = ZO_DTYPE_F32, .ndim = 1, .shape = {4}};
    assert_int_equal(model_st_write(path, &e, 1, failing_fill, NULL), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "simulated read failure"));
    assert_non_null(strstr(zo_last_error(), "\"x\""));
    size_t len;
    uint8_t *b = slurp(path, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(b, "old", 3);
    free(b);
    assert_true(no_tmp_left("atomic.safetensors"));
    /* an unwritable place is an I/O error naming it */
    assert_int_equal(model_st_write("/nonexistent-dir/x.safetensors", &e, 1, failing_fill, NULL),
                     ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "/nonexistent-dir/x.safetensors"));
    /* a negative dimension is refused before anything is read from the entry */
    model_st_entry neg = {.name = "y", .dtype = ZO_DTYPE_F32, .ndim = 2, .shape = {4, -1}};
    assert_int_equal(model_st_write(path, &neg, 1, failing_fill, NULL), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "\"y\""));
    b = slurp(path, &len);
    assert_int_equal(len, 3); /* the old file is untouched */
    free(b);
}

/* ---- checkpoints written by PyTorch ------------------------------------------ */

static void test_load_gpt2_fixture(void **state)
{
    (void)state;
    model_layout l;
    load_layout("gpt2-tiny", &l);
    const zo_dtype dts[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_F16};
    const char *exp[] = {"expected.f32", "expected.bf16", "expected.f16"};
    for (int k = 0; k < 3; k++) {
        void **blocks = alloc_blocks(&l, dts[k]);
        model_load_report rep;
        if (model_load_path(FIX "/gpt2-tiny", &l, blocks, dts[k], MODEL_LOAD_STRICT, &rep))
            fail_msg("%s", zo_last_error());
        assert_int_equal(rep.n_loaded, l.n_tensors);
        assert_int_equal(rep.n_missing, 0);
        assert_int_equal(rep.n_unexpected, 0);
        /* two mask buffers per layer and the tied lm_head.weight */
        assert_int_equal(rep.n_ignored, 2 * l.n_layers + 1);
        char path[512];
        snprintf(path, sizeof path, "%s/gpt2-tiny/%s", FIX, exp[k]);
        assert_blocks_equal_file(&l, blocks, dts[k], path);
        free_blocks(&l, blocks);
    }

    /* the Conv1D transpose, element by element against the file's own bytes */
    void **blocks = alloc_blocks(&l, ZO_DTYPE_F32);
    assert_int_equal(model_load_path(FIX "/gpt2-tiny/model.safetensors", &l, blocks,
                                     ZO_DTYPE_F32, 0, NULL),
                     ZO_OK);
    model_st_file f;
    assert_int_equal(model_st_open(&f, FIX "/gpt2-tiny/model.safetensors"), ZO_OK);
    const model_st_tensor *s = model_st_find(&f, "transformer.h.1.attn.c_attn.weight");
    assert_non_null(s);
    assert_int_equal(s->shape[0], 32); /* [in, out] */
    assert_int_equal(s->shape[1], 96);
    const model_tensor *t = model_layout_find(&l, "h.1.attn.c_attn.weight");
    const float *ours = (const float *)blocks[t->block] + t->offset;
    uint8_t *raw = raw_bytes(&f, s);
    for (int i = 0; i < 32; i++) {
        for (int o = 0; o < 96; o++) {
            float want;
            memcpy(&want, raw + ((size_t)i * 96 + (size_t)o) * 4, 4);
            if (ours[o * 32 + i] != want) fail_msg("c_attn[%d][%d] not transposed", o, i);
        }
    }
    /* the k rows of the fused view are file columns 32..63 */
    const model_view *kv = model_layout_view(&l, t->block, MODEL_ROLE_K_W);
    float k00;
    memcpy(&k00, raw + 32 * 4, 4);
    assert_true(((const float *)blocks[t->block])[kv->offset] == k00);
    free(raw);
    model_st_close(&f);
    free_blocks(&l, blocks);
    model_layout_free(&l);
}

static void test_load_llama_fixture(void **state)
{
    (void)state;
    const char *dirs[] = {FIX "/llama-tiny", FIX "/llama-tiny-sharded",
                          FIX "/llama-tiny-sharded/model.safetensors.index.json"};
    const char *exp[] = {FIX "/llama-tiny/expected.f32", FIX "/llama-tiny-sharded/expected.f32",
                         FIX "/llama-tiny-sharded/expected.f32"};
    model_layout l;
    load_layout("llama-tiny", &l);
    assert_int_equal(l.cfg.n_kv_heads, 2);
    for (int k = 0; k < 3; k++) {
        void **blocks = alloc_blocks(&l, ZO_DTYPE_F32);
        model_load_report rep;
        if (model_load_path(dirs[k], &l, blocks, ZO_DTYPE_F32, MODEL_LOAD_STRICT, &rep))
            fail_msg("%s: %s", dirs[k], zo_last_error());
        assert_int_equal(rep.n_loaded, l.n_tensors);
        assert_int_equal(rep.n_ignored, k == 0 ? 1 : 0); /* rotary inv_freq */
        assert_blocks_equal_file(&l, blocks, ZO_DTYPE_F32, exp[k]);
        free_blocks(&l, blocks);
    }
    model_ckpt c;
    assert_int_equal(model_ckpt_open(&c, FIX "/llama-tiny-sharded"), ZO_OK);
    assert_int_equal(c.n_files, 2);
    assert_int_equal(c.n_entries, l.n_tensors);
    const model_ckpt_entry *e = model_ckpt_find(&c, "lm_head.weight");
    assert_non_null(e);
    assert_non_null(strstr(c.files[e->file].path, "model-00002-of-00002"));
    /* one block at a time, as the runtime streams them: a BF16 buffer */
    int blk = model_layout_layer_block(1);
    uint16_t *buf = calloc(l.block_numel[blk], 2);
    float *ref = calloc(l.block_numel[blk], 4);
    assert_non_null(buf);
    assert_non_null(ref);
    model_load_report rep = {0};
    assert_int_equal(model_load_block(&c, &l, blk, buf, ZO_DTYPE_BF16, 0, &rep), ZO_OK);
    assert_int_equal(model_load_block(&c, &l, blk, ref, ZO_DTYPE_F32, 0, &rep), ZO_OK);
    assert_int_equal(rep.n_loaded, 2 * 9);
    for (size_t i = 0; i < l.block_numel[blk]; i++) assert_int_equal(buf[i], zo_f32_to_bf16(ref[i]));
    free(buf);
    free(ref);
    model_ckpt_close(&c);
    model_layout_free(&l);
}

/* ---- saving -------------------------------------------------------------------- */

static void test_save_gpt2(void **state)
{
    (void)state;
    model_layout l;
    load_layout("gpt2-tiny", &l);
    void **blocks = alloc_blocks(&l, ZO_DTYPE_F32);
    assert_int_equal(model_load_path(FIX "/gpt2-tiny", &l, blocks, ZO_DTYPE_F32, 0, NULL), ZO_OK);
    char path[512];
    tmp_path(path, sizeof path, "gpt2-saved.safetensors");
    if (model_save(path, &l, (const void *const *)blocks, ZO_DTYPE_F32, ZO_DTYPE_F32))
        fail_msg("%s", zo_last_error());

    /* Hugging Face names and layout: every tensor equals the PyTorch file's */
    model_st_file saved, orig;
    assert_int_equal(model_st_open(&saved, path), ZO_OK);
    assert_int_equal(model_st_open(&orig, FIX "/gpt2-tiny/model.safetensors"), ZO_OK);
    assert_int_equal(saved.n_tensors, l.n_tensors);
    assert_null(model_st_find(&saved, "lm_head.weight"));
    for (int i = 0; i < saved.n_tensors; i++) {
        const model_st_tensor *s = &saved.tensors[i];
        char name[128];
        snprintf(name, sizeof name, "transformer.%s", s->name);
        const model_st_tensor *o = model_st_find(&orig, name);
        if (!o) fail_msg("saved %s has no counterpart", s->name);
        assert_int_equal(s->ndim, o->ndim);
        for (int d = 0; d < s->ndim; d++) assert_int_equal(s->shape[d], o->shape[d]);
        assert_string_equal(s->dtype_name, "F32");
        uint8_t *a = raw_bytes(&saved, s), *b = raw_bytes(&orig, o);
        assert_memory_equal(a, b, s->end - s->begin);
        free(a);
        free(b);
    }
    model_st_close(&orig);
    model_st_close(&saved);

    /* save as bf16 from fp32 buffers: reloaded, it is torch's bf16 rounding */
    if (model_save(path, &l, (const void *const *)blocks, ZO_DTYPE_F32, ZO_DTYPE_BF16))
        fail_msg("%s", zo_last_error());
    void **back = alloc_blocks(&l, ZO_DTYPE_BF16);
    assert_int_equal(model_load_path(path, &l, back, ZO_DTYPE_BF16, MODEL_LOAD_STRICT, NULL), ZO_OK);
    assert_blocks_equal_file(&l, back, ZO_DTYPE_BF16, FIX "/gpt2-tiny/expected.bf16");
    /* and bf16 buffers saved as bf16 reload bit-equal (transpose of 2-byte elements) */
    if (model_save(path, &l, (const void *const *)back, ZO_DTYPE_BF16, ZO_DTYPE_BF16))
        fail_msg("%s", zo_last_error());
    void **again = alloc_blocks(&l, ZO_DTYPE_BF16);
    assert_int_equal(model_load_path(path, &l, again, ZO_DTYPE_BF16, MODEL_LOAD_STRICT, NULL), ZO_OK);
    for (int b = 0; b < l.n_blocks; b++) assert_memory_equal(back[b], again[b], l.block_numel[b] * 2);
    free_blocks(&l, again);
    free_blocks(&l, back);
    free_blocks(&l, blocks);
    model_layout_free(&l);
}

static void test_save_llama_fp16(void **state)
{
    (void)state;
    model_layout l;
    load_layout("llama-tiny", &l);
    void **blocks = alloc_blocks(&l, ZO_DTYPE_F32);
    assert_int_equal(model_load_path(FIX "/llama-tiny-sharded", &l, blocks, ZO_DTYPE_F32, 0, NULL),
                     ZO_OK);
    char path[512];
    tmp_path(path, sizeof path, "llama-saved.safetensors");
    assert_int_equal(model_save(path, &l, (const void *const *)blocks, ZO_DTYPE_F32, ZO_DTYPE_F16),
                     ZO_OK);
    /* the values came from F16 shards: the F16 save is byte-equal to them */
    model_st_file f;
    model_ckpt c;
    assert_int_equal(model_st_open(&f, path), ZO_OK);
    assert_int_equal(model_ckpt_open(&c, FIX "/llama-tiny-sharded"), ZO_OK);
    assert_non_null(model_st_find(&f, "lm_head.weight"));
    assert_int_equal(f.n_tensors, c.n_entries);
    for (int i = 0; i < f.n_tensors; i++) {
        const model_ckpt_entry *e = model_ckpt_find(&c, f.tensors[i].name);
        assert_non_null(e);
        uint8_t *a = raw_bytes(&f, &f.tensors[i]), *b = raw_bytes(&c.files[e->file], e->tensor);
        assert_memory_equal(a, b, f.tensors[i].end - f.tensors[i].begin);
        free(a);
        free(b);
    }
    model_ckpt_close(&c);
    model_st_close(&f);
    free_blocks(&l, blocks);
    model_layout_free(&l);
}

/* ---- errors ---------------------------------------------------------------------- */

/* status and message naming the file (and the tensor when there is one) */
static void expect_open_error(const char *path, zo_status want, const char *tensor)
{
    model_st_file f;
    zo_clear_error();
    zo_status st = model_st_open(&f, path);
    if (st != want)
        fail_msg("%s: got %s (%s), want %s", path, zo_status_name(st), zo_last_error(),
                 zo_status_name(want));
    if (!strstr(zo_last_error(), path)) fail_msg("message lacks the file: %s", zo_last_error());
    if (tensor && !strstr(zo_last_error(), tensor))
        fail_msg("message lacks tensor %s: %s", tensor, zo_last_error());
}

static void test_malformed_files(void **state)
{
    (void)state;
    char path[512];
    static const struct {
        const char *name, *header;
        size_t data;
        const char *tensor; /* named in the message */
    } cases[] = {
        {"json", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],", 16, NULL},
        {"not-object", "[1, 2]", 0, NULL},
        {"beyond", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "\"w\""},
        {"overlap",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
         24, "\"b\""},
        {"hole",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[20,36]}}",
         36, "\"b\""},
        {"trailing", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 20,
         "\"a\""},
        {"dtype-size", "{\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16,
         "\"h\""},
        {"misaligned", "{\"m\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,10]}}", 10,
         "\"m\""},
        {"fractional", "{\"m\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.5,8.5]}}", 9,
         "\"m\""},
        {"backwards", "{\"m\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8,
         "\"m\""},
        {"unknown-dtype", "{\"u\":{\"dtype\":\"F33\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16,
         "\"u\""},
        {"negative-shape", "{\"n\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}",
         16, "\"n\""},
        {"no-offsets", "{\"o\":{\"dtype\":\"F32\",\"shape\":[4]}}", 16, "\"o\""},
        {"no-dtype", "{\"o\":{\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "\"o\""},
        {"entry-not-object", "{\"o\":5}", 0, "\"o\""},
        {"duplicate",
         "{\"d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "\"d\""},
        {"bad-metadata", "{\"__metadata__\":3}", 0, "__metadata__"},
        {"garbage-after-json", "{} xyz", 0, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s.safetensors", cases[i].name);
        tmp_path(path, sizeof path, name);
        write_raw_st(path, cases[i].header, cases[i].data);
        expect_open_error(path, ZO_ERR_FORMAT, cases[i].tensor);
    }

    /* shorter than the length field; a header length past the end; length 0 */
    tmp_path(path, sizeof path, "short.safetensors");
    spit(path, "\x10\0\0", 3);
    expect_open_error(path, ZO_ERR_FORMAT, NULL);
    tmp_path(path, sizeof path, "hlen.safetensors");
    uint8_t buf[64] = {0xe8, 0x03}; /* 1000 */
    memcpy(buf + 8, "{}", 2);
    spit(path, buf, sizeof buf);
    expect_open_error(path, ZO_ERR_FORMAT, NULL);
    memset(buf, 0xff, 8); /* 2^64 - 1 */
    spit(path, buf, sizeof buf);
    expect_open_error(path, ZO_ERR_FORMAT, NULL);
    memset(buf, 0, 8);
    spit(path, buf, sizeof buf);
    expect_open_error(path, ZO_ERR_FORMAT, NULL);

    /* a real checkpoint cut short names its last tensor */
    size_t len;
    uint8_t *ck = slurp(FIX "/gpt2-tiny/model.safetensors", &len);
    tmp_path(path, sizeof path, "truncated.safetensors");
    spit(path, ck, len - 100);
    expect_open_error(path, ZO_ERR_FORMAT, "lm_head.weight");
    /* or inside its header */
    spit(path, ck, 200);
    expect_open_error(path, ZO_ERR_FORMAT, NULL);
    free(ck);

    /* missing file */
    tmp_path(path, sizeof path, "absent.safetensors");
    expect_open_error(path, ZO_ERR_NOT_FOUND, NULL);
}

static void test_malformed_index(void **state)
{
    (void)state;
    char dir[512], path[600], shard[600];
    const char *one = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    model_ckpt c;
    struct {
        const char *index;
        zo_status want;
        const char *names; /* in the message */
    } cases[] = {
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\"}}", ZO_ERR_FORMAT,
         "\"b\""},
        {"{\"weight_map\":{\"a\":\"s2.safetensors\"}}", ZO_ERR_NOT_FOUND, "s2.safetensors"},
        {"{\"metadata\":{}}", ZO_ERR_FORMAT, "weight_map"},
        {"{\"weight_map\":{\"a\":\"s1.safetensors\"", ZO_ERR_FORMAT, "malformed"},
        {"{\"weight_map\":{\"a\":\"/etc/passwd\"}}", ZO_ERR_FORMAT, "\"a\""},
        {"{\"weight_map\":{\"a\":\"../s1.safetensors\"}}", ZO_ERR_FORMAT, "no '..'"},
        {"{\"weight_map\":{\"a\":\"sub/../../x.safetensors\"}}", ZO_ERR_FORMAT, "no '..'"},
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",\"z\":\"s3.safetensors\"}}", ZO_ERR_FORMAT,
         "\"a\""}, /* both shards hold "a" */
    };
    snprintf(dir, sizeof dir, "%s/idx", tmpdir);
    mkdir(dir, 0755);
    snprintf(shard, sizeof shard, "%s/s1.safetensors", dir);
    write_raw_st(shard, one, 8);
    snprintf(shard, sizeof shard, "%s/s3.safetensors", dir);
    write_raw_st(shard, one, 8);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        spit(path, cases[i].index, strlen(cases[i].index));
        zo_status st = model_ckpt_open(&c, dir);
        if (st != cases[i].want)
            fail_msg("case %zu: got %s (%s)", i, zo_status_name(st), zo_last_error());
        if (!strstr(zo_last_error(), "idx/"))
            fail_msg("case %zu: no file in %s", i, zo_last_error());
        if (!strstr(zo_last_error(), cases[i].names))
            fail_msg("case %zu: no %s in %s", i, cases[i].names, zo_last_error());
    }
    /* a valid index opens */
    const char *ok = "{\"weight_map\":{\"a\":\"s1.safetensors\"}}";
    spit(path, ok, strlen(ok));
    assert_int_equal(model_ckpt_open(&c, path), ZO_OK);
    assert_int_equal(c.n_entries, 1);
    model_ckpt_close(&c);
    /* a directory with neither file */
    assert_int_equal(model_ckpt_open(&c, tmpdir), ZO_ERR_NOT_FOUND);
    /* a FIFO as a shard, as the index, as a single file: refused at once,
     * naming it (opening one waited for a writer forever: the alarm ends
     * the test then) */
    snprintf(shard, sizeof shard, "%s/s1.safetensors", dir);
    unlink(shard);
    assert_int_equal(mkfifo(shard, 0600), 0);
    alarm(20);
    assert_int_equal(model_ckpt_open(&c, dir), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "s1.safetensors: not a regular file (a FIFO)"));
    assert_int_equal(model_ckpt_open(&c, shard), ZO_ERR_INVALID);
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(model_ckpt_open(&c, path), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "index.json: not a regular file (a FIFO)"));
    alarm(0);
    unlink(path);
    unlink(shard);
    /* keys given twice inside an entry or in the index: refused */
    write_raw_st(shard, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"dtype\":\"F16\",\"data_offsets\":[0,8]}}", 8);
    expect_open_error(shard, ZO_ERR_FORMAT, "a.dtype");
    write_raw_st(shard, one, 8);
    const char *twice = "{\"weight_map\":{\"a\":\"s1.safetensors\"},\"weight_map\":{}}";
    spit(path, twice, strlen(twice));
    assert_int_equal(model_ckpt_open(&c, dir), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "\"weight_map\" appears twice"));
}

/* Shape, dtype, missing and unexpected tensors when loading into a layout. */
static void test_load_mismatch(void **state)
{
    (void)state;
    model_layout l;
    load_layout("llama-tiny", &l);
    /* a different ffn: the first MLP weight's shape is wrong */
    zo_model_config cfg = l.cfg;
    model_layout_free(&l);
    cfg.ffn = 48;
    assert_int_equal(model_layout_init(&l, &cfg), ZO_OK);
    void **blocks = alloc_blocks(&l, ZO_DTYPE_F32);
    assert_int_equal(model_load_path(FIX "/llama-tiny", &l, blocks, ZO_DTYPE_F32, 0, NULL),
                     ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "llama-tiny/model.safetensors"));
    assert_non_null(strstr(zo_last_error(), "model.layers.0.mlp.gate_proj.weight"));
    assert_non_null(strstr(zo_last_error(), "[64, 32]"));
    assert_non_null(strstr(zo_last_error(), "[48, 32]"));
    free_blocks(&l, blocks);
    model_layout_free(&l);

    /* three layers where the file has two: layer 2 is missing */
    load_layout("llama-tiny", &l);
    cfg = l.cfg;
    model_layout_free(&l);
    cfg.n_layers = 3;
    assert_int_equal(model_layout_init(&l, &cfg), ZO_OK);
    blocks = alloc_blocks(&l, ZO_DTYPE_F32);
    model_load_report rep;
    assert_int_equal(model_load_path(FIX "/llama-tiny", &l, blocks, ZO_DTYPE_F32, 0, &rep),
                     ZO_ERR_NOT_FOUND);
    assert_non_null(strstr(zo_last_error(), "model.layers.2.input_layernorm.weight"));
    assert_int_equal(rep.n_missing, 9);
    assert_int_equal(model_load_path(FIX "/llama-tiny", &l, blocks, ZO_DTYPE_F32,
                                     MODEL_LOAD_ALLOW_MISSING, &rep),
                     ZO_OK);
    assert_int_equal(rep.n_missing, 9);
    assert_int_equal(rep.n_loaded, l.n_tensors - 9);
    assert_string_equal(rep.first_missing, "model.layers.2.input_layernorm.weight");
    free_blocks(&l, blocks);
    model_layout_free(&l);

    /* one layer where the file has two: layer 1 is unexpected */
    load_layout("llama-tiny", &l);
    cfg = l.cfg;
    model_layout_free(&l);
    cfg.n_layers = 1;
    assert_int_equal(model_layout_init(&l, &cfg), ZO_OK);
    blocks = alloc_blocks(&l, ZO_DTYPE_F32);
    assert_int_equal(model_load_path(FIX "/llama-tiny", &l, blocks, ZO_DTYPE_F32, 0, &rep), ZO_OK);
    assert_int_equal(rep.n_unexpected, 9);
    assert_non_null(strstr(rep.first_unexpected, "model.layers.1."));
    assert_int_equal(model_load_path(FIX "/llama-tiny", &l, blocks, ZO_DTYPE_F32,
                                     MODEL_LOAD_STRICT, &rep),
                     ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "model.layers.1."));
    free_blocks(&l, blocks);
    model_layout_free(&l);

    /* an integer tensor where a weight belongs */
    zo_model_config tiny = {.name = "t", .arch = ZO_ARCH_LLAMA, .n_layers = 1, .hidden = 2,
                            .n_heads = 1, .ffn = 2, .vocab = 2, .max_seq = 4,
                            .tied_embeddings = 1, .norm_eps = 1e-6f};
    if (model_layout_init(&l, &tiny)) fail_msg("%s", zo_last_error());
    char path[512];
    tmp_path(path, sizeof path, "int.safetensors");
    write_raw_st(path,
                 "{\"model.embed_tokens.weight\":{\"dtype\":\"I32\",\"shape\":[2,2],"
                 "\"data_offsets\":[0,16]},\"model.norm.weight\":{\"dtype\":\"F32\","
                 "\"shape\":[2],\"data_offsets\":[16,24]}}",
                 24);
    blocks = alloc_blocks(&l, ZO_DTYPE_F32);
    assert_int_equal(model_load_path(path, &l, blocks, ZO_DTYPE_F32, 0, NULL), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "model.embed_tokens.weight"));
    assert_non_null(strstr(zo_last_error(), "I32"));
    free_blocks(&l, blocks);
    model_layout_free(&l);
}

/* Random byte flips in the length field and header, and random truncations,
 * of a real checkpoint: open either succeeds or reports ZO_ERR_FORMAT naming
 * the file; a file that opens loads or fails cleanly. Never a crash (run
 * under ASan/UBSan to see the difference). */
static void test_fuzz_headers(void **state)
{
    (void)state;
    size_t len;
    uint8_t *orig = slurp(FIX "/llama-tiny/model.safetensors", &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | orig[i];
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    model_layout l;
    load_layout("llama-tiny", &l);
    void **blocks = alloc_blocks(&l, ZO_DTYPE_F32);
    char path[512];
    tmp_path(path, sizeof path, "fuzz.safetensors");
    uint32_t x = 2024;
    int opened = 0, rejected = 0;
    for (int it = 0; it < 400; it++) {
        memcpy(buf, orig, len);
        size_t n = len;
        x = x * 1664525u + 1013904223u;
        if (x >> 31) {
            int flips = 1 + (int)((x >> 8) % 4);
            for (int k = 0; k < flips; k++) {
                x = x * 1664525u + 1013904223u;
                size_t at = (x >> 4) % (8 + hlen);
                x = x * 1664525u + 1013904223u;
                buf[at] = (uint8_t)(x >> 24);
            }
        } else {
            n = (x >> 4) % len;
        }
        spit(path, buf, n);
        model_st_file f;
        zo_status st = model_st_open(&f, path);
        if (st == ZO_OK) {
            opened++;
            model_st_close(&f);
            st = model_load_path(path, &l, blocks, ZO_DTYPE_F32, 0, NULL);
            if (st != ZO_OK && st != ZO_ERR_FORMAT && st != ZO_ERR_NOT_FOUND &&
                st != ZO_ERR_UNSUPPORTED)
                fail_msg("iteration %d: load gave %s: %s", it, zo_status_name(st), zo_last_error());
        } else {
            rejected++;
            if (st != ZO_ERR_FORMAT)
                fail_msg("iteration %d: open gave %s: %s", it, zo_status_name(st), zo_last_error());
            if (!strstr(zo_last_error(), path)) fail_msg("no file in %s", zo_last_error());
        }
    }
    assert_true(rejected > 200);
    assert_true(opened > 0); /* flips inside names or padding leave valid files */
    free_blocks(&l, blocks);
    model_layout_free(&l);
    free(buf);
    free(orig);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_st_roundtrip),
        cmocka_unit_test(test_st_read_convert),
        cmocka_unit_test(test_fp8_dequant_shapes),
        cmocka_unit_test(test_fp8_every_code),
        cmocka_unit_test(test_fp8_sharded_load),
        cmocka_unit_test(test_fp8_config_fields),
        cmocka_unit_test(test_mxfp4_dequant),
        cmocka_unit_test(test_mxfp4_refusals),
        cmocka_unit_test(test_mxfp4_granitemoe_load),
        cmocka_unit_test(test_mxfp4_gpt_oss_load),
        cmocka_unit_test(test_mxfp4_config_fields),
        cmocka_unit_test(test_st_write_atomic),
        cmocka_unit_test(test_st_truncated_after_open),
        cmocka_unit_test(test_load_gpt2_fixture),
        cmocka_unit_test(test_load_llama_fixture),
        cmocka_unit_test(test_save_gpt2),
        cmocka_unit_test(test_save_llama_fp16),
        cmocka_unit_test(test_malformed_files),
        cmocka_unit_test(test_malformed_index),
        cmocka_unit_test(test_load_mismatch),
        cmocka_unit_test(test_fuzz_headers),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}
