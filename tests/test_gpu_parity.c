/* Parity of the CUDA backend with the CPU backend (the reference): every op,
 * forward and backward, in fp32, fp16 and bf16 storage, run on both devices
 * from the same inputs and compared with tolerances fit for the dtype; plus
 * the CUDA backend's own contracts (capacity and high-water mark, stream-
 * ordered frees, events across streams, sticky errors, run-to-run
 * determinism). Exits 77 (skipped) where no CUDA device is present.
 *
 * Conventions checked as gpu/device.h states them: outputs that overwrite
 * start as nan on the CUDA side (0 on the CPU side), so an element the CUDA
 * kernel fails to write is a mismatch; gradients that accumulate (+=) start
 * from the same random values on both sides. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/nf4.h"  /* defines: zo_nf4_quantize, zo_nf4_bytes */
#include "gpu/device.h" /* defines: gpu_device_open, gpu_gemm, gpu_attention_forward, ... */
#include "tests/support/check.h" /* defines: check_close_scaled_f32 */

static gpu_device_t cpu, gpu; /* gpu: the backend under test */
static gpu_stream_t scpu, sgpu;
static const char *backend = "cuda"; /* or "cpu": ZO_PARITY_BACKEND */
static int is_cuda = 1;

static const zo_dtype DTYPES[3] = {ZO_DTYPE_F32, ZO_DTYPE_F16, ZO_DTYPE_BF16};

/* ---- helpers ------------------------------------------------------------------ */

/* Whether the device under test takes ZO_ATTENTION's choice of attention
 * path (CUDA does; a CPU device, the self-check's, has one path), said
 * once where it does not. */
static int path_choice_applies(void)
{
    static int said;
    if (is_cuda) return 1;
    if (!said++)
        printf("  (a CPU device under test: the cases of CUDA's attention paths chosen by ZO_ATTENTION "
               "are left out, the CPU backend having one path)\n");
    return 0;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* The same tensor on both devices: c on the CPU backend, g on CUDA. */
typedef struct twin {
    gpu_tensor c, g;
    size_t n;
} twin;

static void put(gpu_stream_t s, void *dst, const void *src, size_t bytes)
{
    assert_int_equal(gpu_memcpy_async(s, dst, src, bytes, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
}

static void get(gpu_stream_t s, void *dst, const void *src, size_t bytes)
{
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
    assert_int_equal(gpu_memcpy_async(s, dst, src, bytes, GPU_COPY_DEVICE_TO_HOST), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
}

static twin tw_alloc(size_t n, zo_dtype t)
{
    twin x = {.n = n};
    size_t bytes = n * zo_dtype_size(t);
    x.c.dtype = x.g.dtype = t;
    assert_int_equal(gpu_mem_alloc(cpu, bytes, &x.c.data), ZO_OK);
    assert_int_equal(gpu_mem_alloc(gpu, bytes, &x.g.data), ZO_OK);
    return x;
}

/* h[0..n) stored as t on both devices. */
static twin tw_from(const float *h, size_t n, zo_dtype t)
{
    twin x = tw_alloc(n, t);
    size_t bytes = n * zo_dtype_size(t);
    void *tmp = malloc(bytes);
    for (size_t i = 0; i < n; i++) zo_store_f32(tmp, t, i, h[i]);
    put(scpu, x.c.data, tmp, bytes);
    put(sgpu, x.g.data, tmp, bytes);
    free(tmp);
    return x;
}

static twin tw_rand(size_t n, zo_dtype t, float scale)
{
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = frand() * scale;
    twin x = tw_from(h, n, t);
    free(h);
    return x;
}

/* An output the op overwrites: 0 on the CPU, nan (all bits set) on CUDA. */
static twin tw_out(size_t n, zo_dtype t)
{
    twin x = tw_alloc(n, t);
    size_t bytes = n * zo_dtype_size(t);
    assert_int_equal(gpu_memset_async(scpu, x.c.data, 0, bytes), ZO_OK);
    assert_int_equal(gpu_memset_async(sgpu, x.g.data, 0xff, bytes), ZO_OK);
    return x;
}

static twin tw_ids(const int32_t *ids, size_t n)
{
    twin x = tw_alloc(n, ZO_DTYPE_F32); /* 4-byte elements */
    put(scpu, x.c.data, ids, n * 4);
    put(sgpu, x.g.data, ids, n * 4);
    return x;
}

/* Make the CUDA copy hold exactly the CPU copy's bytes (backward ops then
 * start from identical saved tensors). */
static void tw_sync_to_gpu(twin x)
{
    size_t bytes = x.n * zo_dtype_size(x.c.dtype);
    void *tmp = malloc(bytes);
    get(scpu, tmp, x.c.data, bytes);
    put(sgpu, x.g.data, tmp, bytes);
    free(tmp);
}

static float *fetch(gpu_stream_t s, gpu_tensor t, size_t n)
{
    size_t bytes = n * zo_dtype_size(t.dtype);
    void *tmp = malloc(bytes);
    get(s, tmp, t.data, bytes);
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = zo_load_f32(tmp, t.dtype, i);
    free(tmp);
    return h;
}

static void tw_free(twin x)
{
    gpu_mem_free(cpu, x.c.data);
    gpu_mem_free(gpu, x.g.data);
}

/* |cuda - cpu| <= atol * max|cpu| + rtol * |cpu|, per element. */
typedef struct tol {
    double atol, rtol;
} tol;

/* One rounding of the output plus fp32 reordering: about two ulps. */
static tol tol_of(zo_dtype t)
{
    switch (t) {
    case ZO_DTYPE_F16: return (tol){2e-3, 2e-3};
    case ZO_DTYPE_BF16: return (tol){1.6e-2, 1.6e-2};
    default: return (tol){2e-5, 1e-4};
    }
}

/* The looser of two tolerances (an op's storage type and its sums). */
static tol tol_max(tol a, tol b)
{
    return (tol){a.atol > b.atol ? a.atol : b.atol, a.rtol > b.rtol ? a.rtol : b.rtol};
}

/* Compare CUDA values g with CPU values c; print the first mismatches and
 * the largest difference, return the mismatch count. */
static int compare(const char *what, zo_dtype t, const float *c, const float *g, size_t n, tol tl)
{
    char label[160];
    snprintf(label, sizeof label, "%s (%s, cuda vs cpu)", what, zo_dtype_name(t));
    return check_close_scaled_f32(label, g, c, n, tl.atol, tl.rtol);
}

static int tw_check(const char *what, twin x, tol tl)
{
    float *c = fetch(scpu, x.c, x.n), *g = fetch(sgpu, x.g, x.n);
    int bad = compare(what, x.c.dtype, c, g, x.n, tl);
    free(c);
    free(g);
    return bad;
}

/* ---- setup ---------------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    if (gpu_device_open("cpu", 0, &cpu) != ZO_OK) return -1;
    if (gpu_device_open(backend, 0, &gpu) != ZO_OK) {
        printf("%s: %s\n", backend, zo_last_error());
        return -1;
    }
    if (gpu_stream_create(cpu, &scpu) != ZO_OK) return -1;
    if (gpu_stream_create(gpu, &sgpu) != ZO_OK) return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    gpu_mem_stats mc, mg;
    gpu_mem_get_stats(cpu, &mc);
    gpu_mem_get_stats(gpu, &mg);
    int leaked = mc.n_allocs || mg.n_allocs;
    if (leaked) printf("  leaked: %zu cpu, %zu cuda allocations\n", mc.n_allocs, mg.n_allocs);
    gpu_device_free(cpu);
    gpu_device_free(gpu); /* destroys the streams */
    return leaked ? -1 : 0;
}

/* ---- devices, memory, streams ------------------------------------------------------ */

static void test_open_names(void **state)
{
    (void)state;
    gpu_device_t d;
    assert_string_equal(gpu_device_name(gpu), backend);
    assert_int_equal(gpu_device_open("tpu", 0, &d), ZO_ERR_INVALID);
    assert_null(d);
    assert_int_equal(gpu_device_open("cuda:x", 0, &d), ZO_ERR_INVALID);
    /* a device that does not exist; where CUDA cannot be opened at all (no
     * driver: this test's selfcheck), that is what is named */
    zo_status st = gpu_device_open("cuda:4096", 0, &d);
    assert_non_null(strstr(zo_last_error(), "cuda:4096"));
    assert_int_equal(st, gpu_cuda_device_count() > 0 ? ZO_ERR_NOT_FOUND : ZO_ERR_UNSUPPORTED);
}

static void test_capacity(void **state)
{
    (void)state;
    gpu_device_t d;
    assert_int_equal(gpu_device_open(is_cuda ? "cuda:0" : "cpu", 1 << 20, &d), ZO_OK);
    void *a, *b, *c;
    assert_int_equal(gpu_mem_alloc(d, 600 << 10, &a), ZO_OK);
    assert_int_equal(gpu_mem_alloc(d, 300 << 10, &b), ZO_OK);
    assert_int_equal((uintptr_t)a % 256, 0);
    zo_clear_error();
    assert_int_equal(gpu_mem_alloc(d, 200 << 10, &c), ZO_ERR_CAPACITY);
    assert_null(c);
    assert_non_null(strstr(zo_last_error(), "capacity"));
    gpu_mem_stats ms;
    gpu_mem_get_stats(d, &ms);
    assert_int_equal(ms.capacity, 1 << 20);
    assert_int_equal(ms.in_use, 900 << 10);
    assert_int_equal(ms.high_water, 900 << 10);
    assert_int_equal(ms.n_allocs, 2);
    gpu_mem_free(d, a);
    assert_int_equal(gpu_mem_alloc(d, 200 << 10, &c), ZO_OK);
    gpu_mem_get_stats(d, &ms);
    assert_int_equal(ms.in_use, 500 << 10);
    assert_int_equal(ms.high_water, 900 << 10);
    gpu_mem_reset_peak(d);
    gpu_mem_get_stats(d, &ms);
    assert_int_equal(ms.high_water, 500 << 10);
    void *e;
    assert_int_equal(gpu_mem_alloc(d, 1, &e), ZO_OK); /* rounded to 256 */
    gpu_mem_get_stats(d, &ms);
    assert_int_equal(ms.in_use, (500 << 10) + 256);
    /* a stream-ordered free leaves the count when the stream reaches it */
    gpu_stream_t s;
    assert_int_equal(gpu_stream_create(d, &s), ZO_OK);
    assert_int_equal(gpu_memset_async(s, b, 7, 300 << 10), ZO_OK);
    assert_int_equal(gpu_mem_free_async(d, b, s), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
    gpu_mem_get_stats(d, &ms);
    assert_int_equal(ms.in_use, (200 << 10) + 256);
    if (is_cuda) /* the cuda backend knows its live allocations */
        assert_int_equal(gpu_mem_free_async(d, b, s), ZO_ERR_INVALID);
    gpu_mem_free(d, c);
    gpu_mem_free(d, e);
    void *p;
    assert_int_equal(gpu_host_alloc(d, 1000, &p), ZO_OK);
    gpu_mem_get_stats(d, &ms);
    assert_int_equal(ms.host_pinned, 1024);
    assert_int_equal(ms.in_use, 0);
    assert_int_equal(ms.n_allocs, 0);
    gpu_host_free(d, p);
    gpu_mem_get_stats(d, &ms);
    assert_int_equal(ms.host_pinned, 0);
    gpu_device_free(d);
}

/* Stream A fills a buffer (a GEMM); stream B waits on an event recorded
 * after it and copies the result out. Pinned staging both ways. */
static void test_events_order(void **state)
{
    (void)state;
    gpu_stream_t A, B;
    gpu_event_t ev;
    assert_int_equal(gpu_stream_create(gpu, &A), ZO_OK);
    assert_int_equal(gpu_stream_create(gpu, &B), ZO_OK);
    assert_int_equal(gpu_event_create(gpu, &ev), ZO_OK);
    assert_int_equal(gpu_event_query(ev), 1); /* never recorded */
    assert_int_equal(gpu_stream_wait_event(B, ev), ZO_OK); /* no wait */
    const int n = 512;
    float *hp, *out;
    assert_int_equal(gpu_host_alloc(gpu, (size_t)n * n * 4, (void **)&hp), ZO_OK);
    assert_int_equal(gpu_host_alloc(gpu, (size_t)n * n * 4, (void **)&out), ZO_OK);
    for (int i = 0; i < n * n; i++) hp[i] = (float)(i % 7) - 3.0f;
    void *a, *c;
    assert_int_equal(gpu_mem_alloc(gpu, (size_t)n * n * 4, &a), ZO_OK);
    assert_int_equal(gpu_mem_alloc(gpu, (size_t)n * n * 4, &c), ZO_OK);
    for (int round = 0; round < 3; round++) {
        assert_int_equal(gpu_memcpy_async(A, a, hp, (size_t)n * n * 4, GPU_COPY_HOST_TO_DEVICE),
                         ZO_OK);
        gpu_gemm_desc d = {.trans_a = 0, .trans_b = 1, .m = n, .n = n, .k = n,
                           .alpha = 1.0f, .beta = 0.0f,
                           .a = gpu_t(a, ZO_DTYPE_F32), .b = gpu_t(a, ZO_DTYPE_F32),
                           .c = gpu_t(c, ZO_DTYPE_F32), .lda = n, .ldb = n, .ldc = n};
        assert_int_equal(gpu_gemm(A, &d), ZO_OK);
        assert_int_equal(gpu_scale(A, gpu_t(c, ZO_DTYPE_F32), (float)(round + 1), (size_t)n * n),
                         ZO_OK);
        assert_int_equal(gpu_event_record(ev, A), ZO_OK);
        assert_int_equal(gpu_stream_wait_event(B, ev), ZO_OK);
        assert_int_equal(gpu_memcpy_async(B, out, c, (size_t)n * n * 4, GPU_COPY_DEVICE_TO_HOST),
                         ZO_OK);
        assert_int_equal(gpu_stream_synchronize(B), ZO_OK);
        assert_int_equal(gpu_event_query(ev), 1);
        /* C[0][0] = sum_k a[0,k]^2 (exact small integers, exact in TF32 too) */
        double want = 0.0;
        for (int k = 0; k < n; k++) want += (double)hp[k] * hp[k];
        assert_float_equal(out[0], want * (round + 1), 1e-3 * want);
        assert_int_equal(gpu_event_synchronize(ev), ZO_OK);
    }
    gpu_mem_free(gpu, a);
    gpu_mem_free(gpu, c);
    gpu_host_free(gpu, hp);
    gpu_host_free(gpu, out);
    gpu_event_destroy(ev);
    gpu_stream_destroy(A);
    gpu_stream_destroy(B);
}

/* Bad ids are sticky errors of the stream: the enqueuing call succeeds,
 * the next synchronize fails naming the op, the one after is clean. */
static void test_sticky_errors(void **state)
{
    (void)state;
    const int n = 4, c = 8, vocab = 5;
    int32_t ids[4] = {0, 4, 7, 1};
    twin tok = tw_ids(ids, n), wte = tw_rand((size_t)vocab * c, ZO_DTYPE_F32, 1.0f);
    twin out = tw_out((size_t)n * c, ZO_DTYPE_F32);
    gpu_tensor none = {NULL, ZO_DTYPE_F32};
    assert_int_equal(gpu_embedding_forward(sgpu, out.g, tok.g.data, wte.g, none, n, n, c, vocab),
                     ZO_OK);
    zo_clear_error();
    assert_int_equal(gpu_stream_synchronize(sgpu), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "gpu_embedding_forward"));
    assert_non_null(strstr(zo_last_error(), "= 7"));
    assert_int_equal(gpu_stream_synchronize(sgpu), ZO_OK);
    float *losses;
    assert_int_equal(gpu_mem_alloc(gpu, n * sizeof(float), (void **)&losses), ZO_OK);
    int32_t tg[4] = {1, -1, 2, -2};
    twin tgt = tw_ids(tg, n);
    twin logits = tw_rand((size_t)n * vocab, ZO_DTYPE_F32, 1.0f);
    assert_int_equal(gpu_cross_entropy_forward(sgpu, losses, logits.g, tgt.g.data, n, vocab),
                     ZO_OK);
    assert_int_equal(gpu_stream_synchronize(sgpu), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "targets"));
    assert_int_equal(gpu_device_synchronize(gpu), ZO_OK);
    gpu_mem_free(gpu, losses);
    tw_free(tok);
    tw_free(wte);
    tw_free(out);
    tw_free(tgt);
    tw_free(logits);
}

/* ---- GEMM ------------------------------------------------------------------------ */

/* One GEMM on both devices; C starts random on both (beta != 0 reads it) or
 * nan on CUDA (beta == 0 must ignore it). */
static int gemm_case(int ta, int tb, int m, int n, int k, int pad, int batch, float beta,
                     zo_dtype ta_t, zo_dtype tb_t, zo_dtype tc_t)
{
    int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    int64_t sa = (int64_t)(ta ? k : m) * lda + pad, sb = (int64_t)(tb ? n : k) * ldb + pad;
    int64_t sc = (int64_t)m * ldc + pad;
    int nb = batch > 1 ? batch : 1;
    twin A = tw_rand((size_t)sa * nb, ta_t, 1.0f), B = tw_rand((size_t)sb * nb, tb_t, 1.0f);
    twin C = beta != 0.0f ? tw_rand((size_t)sc * nb, tc_t, 1.0f) : tw_out((size_t)sc * nb, tc_t);
    gpu_gemm_desc d = {.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .alpha = 0.75f,
                       .beta = beta, .lda = lda, .ldb = ldb, .ldc = ldc, .batch = batch,
                       .stride_a = sa, .stride_b = sb, .stride_c = sc};
    d.a = A.c, d.b = B.c, d.c = C.c;
    assert_int_equal(gpu_gemm(scpu, &d), ZO_OK);
    d.a = A.g, d.b = B.g, d.c = C.g;
    assert_int_equal(gpu_gemm(sgpu, &d), ZO_OK);
    /* fp32 inputs run on TF32 tensor cores: a 10-bit mantissa per input */
    tol tl;
    if (ta_t == ZO_DTYPE_F32 && tb_t == ZO_DTYPE_F32)
        tl = (tol){5e-3, 5e-3};
    else if (ta_t != tb_t) /* CUDA may round the fp32 operand to the other's type */
        tl = tol_max(tol_of(tc_t), tol_of(ta_t == ZO_DTYPE_F32 ? tb_t : ta_t));
    else
        tl = tol_max(tol_of(tc_t), (tol){1e-4, 1e-4});
    char what[96];
    snprintf(what, sizeof what, "gemm ta%d tb%d %dx%dx%d pad%d b%d beta%g %s.%s->%s", ta, tb, m, n,
             k, pad, batch, beta, zo_dtype_name(ta_t), zo_dtype_name(tb_t), zo_dtype_name(tc_t));
    /* the m x n elements of each batch (padding is not the op's) */
    float *hc = fetch(scpu, C.c, C.n), *hg = fetch(sgpu, C.g, C.n);
    size_t cnt = 0;
    for (int bi = 0; bi < nb; bi++)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++, cnt++) {
                size_t o = (size_t)bi * sc + (size_t)i * ldc + j;
                hc[cnt] = hc[o]; /* cnt <= o: gathering in place is safe */
                hg[cnt] = hg[o];
            }
    int bad = compare(what, tc_t, hc, hg, cnt, tl);
    free(hc);
    free(hg);
    tw_free(A);
    tw_free(B);
    tw_free(C);
    return bad;
}

static void test_gemm(void **state)
{
    (void)state;
    int bad = 0;
    for (int di = 0; di < 3; di++) {
        zo_dtype t = DTYPES[di];
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                bad += gemm_case(ta, tb, 64, 128, 96, 0, 0, 0.0f, t, t, t);
                bad += gemm_case(ta, tb, 37, 45, 70, 3, 0, 0.5f, t, t, t); /* odd, strided */
                bad += gemm_case(ta, tb, 33, 17, 40, 1, 3, 0.0f, t, t, t); /* batched */
            }
        if (t != ZO_DTYPE_F32) { /* 16-bit inputs into fp32 C (gradient accumulation) */
            bad += gemm_case(1, 0, 48, 64, 80, 0, 0, 1.0f, t, t, ZO_DTYPE_F32);
            bad += gemm_case(0, 1, 48, 64, 80, 0, 2, 0.0f, t, t, ZO_DTYPE_F32);
        }
    }
    /* fp32 activation gradients against 16-bit weights (a mixed-precision
     * backward): the fp32 operand is rounded, then cuBLASLt */
    bad += gemm_case(1, 0, 48, 64, 80, 0, 0, 1.0f, ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    bad += gemm_case(0, 0, 48, 64, 80, 2, 2, 0.0f, ZO_DTYPE_F32, ZO_DTYPE_F16, ZO_DTYPE_F32);
    bad += gemm_case(0, 1, 48, 64, 80, 0, 0, 1.0f, ZO_DTYPE_BF16, ZO_DTYPE_F32, ZO_DTYPE_F32);
    /* mixes cuBLASLt does not take: the tiled kernel */
    bad += gemm_case(0, 1, 30, 50, 70, 0, 0, 0.0f, ZO_DTYPE_F16, ZO_DTYPE_BF16, ZO_DTYPE_F32);
    bad += gemm_case(1, 1, 30, 50, 70, 2, 2, 0.5f, ZO_DTYPE_F32, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    bad += gemm_case(0, 0, 30, 50, 70, 0, 0, 1.0f, ZO_DTYPE_BF16, ZO_DTYPE_F32, ZO_DTYPE_F16);
    assert_int_equal(bad, 0);
}

/* ---- bias, norms ------------------------------------------------------------------ */

static void test_bias(void **state)
{
    (void)state;
    int bad = 0;
    const int n = 70, c = 100;
    const int64_t ld = 104;
    for (int di = 0; di < 3; di++) {
        zo_dtype t = DTYPES[di];
        twin y = tw_rand((size_t)n * ld, t, 1.0f), b = tw_rand(c, t, 1.0f);
        assert_int_equal(gpu_bias_forward(scpu, y.c, b.c, n, c, ld), ZO_OK);
        assert_int_equal(gpu_bias_forward(sgpu, y.g, b.g, n, c, ld), ZO_OK);
        bad += tw_check("bias_forward y", y, tol_of(t));
        twin db = tw_rand(c, t, 1.0f); /* accumulates */
        assert_int_equal(gpu_bias_backward(scpu, db.c, y.c, n, c, ld), ZO_OK);
        assert_int_equal(gpu_bias_backward(sgpu, db.g, y.g, n, c, ld), ZO_OK);
        bad += tw_check("bias_backward db", db, tol_of(t));
        tw_free(y);
        tw_free(b);
        tw_free(db);
    }
    assert_int_equal(bad, 0);
}

static void norm_case(int rms, zo_dtype t, int n, int c, int with_bias, int *bad)
{
    const float eps = 1e-5f;
    float *hx = malloc((size_t)n * c * sizeof(float));
    for (size_t i = 0; i < (size_t)n * c; i++) hx[i] = 2.0f * frand() + 0.3f * (float)(i / c % 5);
    twin x = tw_from(hx, (size_t)n * c, t), w = tw_rand(c, t, 1.0f); /* row means 0 .. 1.2 */
    free(hx);
    twin b = with_bias ? tw_rand(c, t, 1.0f) : (twin){{NULL, t}, {NULL, t}, 0};
    twin y = tw_out((size_t)n * c, t);
    twin mean = tw_out(n, ZO_DTYPE_F32), rstd = tw_out(n, ZO_DTYPE_F32);
    if (rms) {
        assert_int_equal(gpu_rmsnorm_forward(scpu, y.c, rstd.c.data, x.c, w.c, n, c, eps), ZO_OK);
        assert_int_equal(gpu_rmsnorm_forward(sgpu, y.g, rstd.g.data, x.g, w.g, n, c, eps), ZO_OK);
    } else {
        assert_int_equal(gpu_layernorm_forward(scpu, y.c, mean.c.data, rstd.c.data, x.c, w.c, b.c,
                                               n, c, eps), ZO_OK);
        assert_int_equal(gpu_layernorm_forward(sgpu, y.g, mean.g.data, rstd.g.data, x.g, w.g, b.g,
                                               n, c, eps), ZO_OK);
        *bad += tw_check("layernorm mean", mean, tol_of(ZO_DTYPE_F32));
    }
    *bad += tw_check(rms ? "rmsnorm y" : "layernorm y", y, tol_of(t));
    *bad += tw_check(rms ? "rmsnorm rstd" : "layernorm rstd", rstd, tol_of(ZO_DTYPE_F32));
    /* backward from the CPU's statistics on both sides */
    tw_sync_to_gpu(rstd);
    if (!rms) tw_sync_to_gpu(mean);
    twin dy = tw_rand((size_t)n * c, t, 1.0f);
    twin dx = tw_rand((size_t)n * c, t, 1.0f), dw = tw_rand(c, t, 1.0f); /* += */
    twin db = with_bias ? tw_rand(c, t, 1.0f) : (twin){{NULL, t}, {NULL, t}, 0};
    if (rms) {
        assert_int_equal(gpu_rmsnorm_backward(scpu, dx.c, dw.c, dy.c, x.c, w.c, rstd.c.data, n, c),
                         ZO_OK);
        assert_int_equal(gpu_rmsnorm_backward(sgpu, dx.g, dw.g, dy.g, x.g, w.g, rstd.g.data, n, c),
                         ZO_OK);
    } else {
        assert_int_equal(gpu_layernorm_backward(scpu, dx.c, dw.c, db.c, dy.c, x.c, w.c,
                                                mean.c.data, rstd.c.data, n, c), ZO_OK);
        assert_int_equal(gpu_layernorm_backward(sgpu, dx.g, dw.g, db.g, dy.g, x.g, w.g,
                                                mean.g.data, rstd.g.data, n, c), ZO_OK);
    }
    *bad += tw_check("norm dx", dx, tol_of(t));
    *bad += tw_check("norm dw", dw, tol_of(t));
    if (with_bias) *bad += tw_check("norm db", db, tol_of(t));
    tw_free(x);
    tw_free(w);
    tw_free(y);
    tw_free(mean);
    tw_free(rstd);
    tw_free(dy);
    tw_free(dx);
    tw_free(dw);
    if (with_bias) {
        tw_free(b);
        tw_free(db);
    }
}

static void test_layernorm(void **state)
{
    (void)state;
    int bad = 0;
    for (int di = 0; di < 3; di++) {
        norm_case(0, DTYPES[di], 37, 200, 1, &bad);
        norm_case(0, DTYPES[di], 5, 33, 0, &bad);
    }
    assert_int_equal(bad, 0);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    int bad = 0;
    for (int di = 0; di < 3; di++) {
        norm_case(1, DTYPES[di], 37, 200, 0, &bad);
        norm_case(1, DTYPES[di], 3, 1000, 0, &bad);
    }
    assert_int_equal(bad, 0);
}

/* ---- attention ------------------------------------------------------------------------ */

/* t: qkv and out; gt: dout and dqkv (the transformer passes fp32 gradients) */
static void attention_case_w(zo_dtype t, zo_dtype gt, int b, int tt, int hq, int hkv, int d, int window, int *bad)
{
    gpu_attn_desc a = {.b = b, .t = tt, .hq = hq, .hkv = hkv, .d = d, .window = window};
    size_t nqkv = (size_t)b * tt * (hq + 2 * hkv) * d, nout = (size_t)b * tt * hq * d;
    size_t nl = (size_t)b * hq * tt;
    twin qkv = tw_rand(nqkv, t, 1.5f), out = tw_out(nout, t), lse = tw_out(nl, ZO_DTYPE_F32);
    assert_int_equal(gpu_attention_forward(scpu, &a, out.c, lse.c.data, qkv.c), ZO_OK);
    assert_int_equal(gpu_attention_forward(sgpu, &a, out.g, lse.g.data, qkv.g), ZO_OK);
    char what[96];
    snprintf(what, sizeof what, "attention b%d t%d hq%d hkv%d d%d window %d grads %s", b, tt, hq, hkv, d, window,
             zo_dtype_name(gt));
    int before = *bad;
    *bad += tw_check("attention out", out, tol_of(t));
    *bad += tw_check("attention lse", lse, tol_of(ZO_DTYPE_F32));
    /* backward from identical saved tensors */
    tw_sync_to_gpu(out);
    tw_sync_to_gpu(lse);
    twin dout = tw_rand(nout, gt, 1.0f), dqkv = tw_out(nqkv, gt);
    assert_int_equal(gpu_attention_backward(scpu, &a, dqkv.c, dout.c, qkv.c, out.c, lse.c.data),
                     ZO_OK);
    assert_int_equal(gpu_attention_backward(sgpu, &a, dqkv.g, dout.g, qkv.g, out.g, lse.g.data),
                     ZO_OK);
    /* sums over up to t terms with cancellation: fp32 gets a wider margin */
    *bad += tw_check("attention dqkv", dqkv, tol_max(tol_of(gt), (tol){1e-4, 1e-3}));
    if (*bad != before) printf("  in %s %s\n", what, zo_dtype_name(t));
    tw_free(qkv);
    tw_free(out);
    tw_free(lse);
    tw_free(dout);
    tw_free(dqkv);
}

static void attention_case(zo_dtype t, int b, int tt, int hq, int hkv, int d, int *bad)
{
    attention_case_w(t, t, b, tt, hq, hkv, d, 0, bad);
}

static void test_attention(void **state)
{
    (void)state;
    int bad = 0;
    for (int di = 0; di < 3; di++) {
        zo_dtype t = DTYPES[di];
        attention_case(t, 2, 45, 4, 4, 16, &bad);  /* MHA, one lane per dim */
        attention_case(t, 1, 70, 4, 2, 64, &bad);  /* GQA, three key tiles */
        attention_case(t, 2, 33, 6, 2, 80, &bad);  /* d not a multiple of 32 */
        attention_case(t, 1, 40, 2, 1, 128, &bad); /* LLaMA head size, MQA */
    }
    attention_case(ZO_DTYPE_BF16, 1, 9, 2, 2, 256, &bad); /* the largest head */
    /* the automatic choice from 256 tokens (the mma.sync kernels), the
     * transformer's fp32 gradients and a sliding window */
    attention_case_w(ZO_DTYPE_BF16, ZO_DTYPE_F32, 2, 520, 8, 4, 128, 0, &bad);
    attention_case_w(ZO_DTYPE_BF16, ZO_DTYPE_BF16, 1, 600, 4, 1, 80, 100, &bad);
    /* The paths below are CUDA's, chosen by ZO_ATTENTION, which the CPU
     * backend does not read: with a CPU device under test (the self-check)
     * each of their cases would rerun a computation of the cases above on
     * the same code, bit for bit (three quarters of the self-check's time) */
    if (!path_choice_applies()) {
        assert_int_equal(bad, 0);
        return;
    }
    /* t >= 256 with 16-bit qkv: the GEMM path on tensor cores
     * (attention_gemm.cu), chosen (the automatic choice takes the mma.sync
     * kernels wherever they cover the case, as in the cases above) */
    setenv("ZO_ATTENTION", "gemm", 1);
    attention_case(ZO_DTYPE_BF16, 1, 300, 8, 2, 128, &bad);
    attention_case(ZO_DTYPE_F16, 2, 257, 4, 4, 64, &bad);
    attention_case_w(ZO_DTYPE_BF16, ZO_DTYPE_BF16, 1, 600, 4, 1, 80, 100, &bad); /* a sliding window */
    /* the transformer's call: fp32 gradients beside bf16 qkv and out */
    attention_case_w(ZO_DTYPE_BF16, ZO_DTYPE_F32, 2, 520, 8, 4, 128, 0, &bad);
    /* the fused tensor-core kernels (attention_tc.cu), chosen: across their
     * 64-row tiles, the head sizes they take, GQA, fp32 gradients */
    setenv("ZO_ATTENTION", "tc", 1);
    attention_case(ZO_DTYPE_BF16, 1, 70, 4, 2, 64, &bad);
    attention_case(ZO_DTYPE_F16, 2, 33, 6, 2, 80, &bad);
    attention_case(ZO_DTYPE_BF16, 1, 300, 8, 2, 128, &bad);
    attention_case(ZO_DTYPE_F16, 2, 257, 4, 4, 96, &bad);
    attention_case_w(ZO_DTYPE_BF16, ZO_DTYPE_F32, 2, 520, 8, 4, 128, 0, &bad);
    /* the mma.sync kernels (attention_mma.cu), chosen: the same cases */
    setenv("ZO_ATTENTION", "mma", 1);
    attention_case(ZO_DTYPE_BF16, 1, 70, 4, 2, 64, &bad);
    attention_case(ZO_DTYPE_F16, 2, 33, 6, 2, 80, &bad);
    attention_case(ZO_DTYPE_BF16, 1, 300, 8, 2, 128, &bad);
    attention_case(ZO_DTYPE_F16, 2, 257, 4, 4, 96, &bad);
    attention_case_w(ZO_DTYPE_BF16, ZO_DTYPE_F32, 2, 520, 8, 4, 128, 0, &bad);
    /* the fastest path per shape, timed on its first call (ZO_ATTENTION=tune):
     * every candidate runs before the chosen one, which must leave its own
     * results; a window leaves the GEMM path and the flash kernel */
    setenv("ZO_ATTENTION", "tune", 1);
    attention_case(ZO_DTYPE_BF16, 1, 300, 8, 2, 128, &bad);
    attention_case(ZO_DTYPE_F16, 2, 257, 4, 4, 64, &bad);
    attention_case_w(ZO_DTYPE_BF16, ZO_DTYPE_F32, 2, 520, 8, 4, 128, 0, &bad);
    attention_case_w(ZO_DTYPE_BF16, ZO_DTYPE_BF16, 1, 600, 4, 1, 80, 100, &bad);
    unsetenv("ZO_ATTENTION");
    assert_int_equal(bad, 0);
}

/* Same inputs twice: bitwise the same gradients (no atomics anywhere), from
 * the automatic choice (t 50 and 300: the mma.sync kernels), the flash
 * kernel (t 50) and the GEMM path (t 300), chosen, the fused tensor-core
 * kernels (t 300, ZO_ATTENTION=tc), the mma.sync kernels (t 300,
 * ZO_ATTENTION=mma) and the tuned choice (t 300, ZO_ATTENTION=tune: the
 * first backward times every candidate before the choice). */
static void determinism_case(int t)
{
    gpu_attn_desc a = {.b = 1, .t = t, .hq = 4, .hkv = 2, .d = 64};
    size_t nqkv = (size_t)t * 8 * 64, nout = (size_t)t * 4 * 64;
    twin qkv = tw_rand(nqkv, ZO_DTYPE_BF16, 1.0f), out = tw_out(nout, ZO_DTYPE_BF16);
    twin lse = tw_out((size_t)4 * t, ZO_DTYPE_F32), dout = tw_rand(nout, ZO_DTYPE_BF16, 1.0f);
    twin g1 = tw_out(nqkv, ZO_DTYPE_F32), g2 = tw_out(nqkv, ZO_DTYPE_F32);
    assert_int_equal(gpu_attention_forward(sgpu, &a, out.g, lse.g.data, qkv.g), ZO_OK);
    assert_int_equal(gpu_attention_backward(sgpu, &a, g1.g, dout.g, qkv.g, out.g, lse.g.data),
                     ZO_OK);
    assert_int_equal(gpu_attention_backward(sgpu, &a, g2.g, dout.g, qkv.g, out.g, lse.g.data),
                     ZO_OK);
    double *s;
    assert_int_equal(gpu_mem_alloc(gpu, 2 * sizeof(double), (void **)&s), ZO_OK);
    assert_int_equal(gpu_memset_async(sgpu, s, 0, 2 * sizeof(double)), ZO_OK);
    assert_int_equal(gpu_sum_squares(sgpu, s, g1.g, nqkv), ZO_OK);
    assert_int_equal(gpu_sum_squares(sgpu, s + 1, g1.g, nqkv), ZO_OK);
    float *h1 = fetch(sgpu, g1.g, nqkv), *h2 = fetch(sgpu, g2.g, nqkv);
    assert_memory_equal(h1, h2, nqkv * sizeof(float));
    double hs[2];
    get(sgpu, hs, s, sizeof hs);
    assert_memory_equal(&hs[0], &hs[1], sizeof(double));
    assert_true(hs[0] > 0.0);
    free(h1);
    free(h2);
    gpu_mem_free(gpu, s);
    tw_free(qkv);
    tw_free(out);
    tw_free(lse);
    tw_free(dout);
    tw_free(g1);
    tw_free(g2);
}

static void test_determinism(void **state)
{
    (void)state;
    determinism_case(50);
    determinism_case(300);
    if (!path_choice_applies()) return; /* (test_attention says why) */
    setenv("ZO_ATTENTION", "flash", 1);
    determinism_case(50);
    setenv("ZO_ATTENTION", "gemm", 1);
    determinism_case(300);
    setenv("ZO_ATTENTION", "tc", 1);
    determinism_case(300);
    setenv("ZO_ATTENTION", "mma", 1);
    determinism_case(300);
    /* the first backward tunes (every candidate, then the choice), the
     * second runs the choice: the same bits */
    setenv("ZO_ATTENTION", "tune", 1);
    determinism_case(300);
    unsetenv("ZO_ATTENTION");
}

/* ---- RoPE, activations -------------------------------------------------------------------- */

static void test_rope(void **state)
{
    (void)state;
    int bad = 0;
    const int n = 24, t = 12, heads = 3;
    const int64_t ld = 5 * 64 + 8; /* q heads inside a wider qkv row */
    /* whole heads with scale 1; then a partial rotary size (the first 48 of
     * each 64-wide head, as Phi-4-mini turns 96 of 128) with longrope's
     * attention scaling */
    static const struct {
        int d, ldh;
        float scale;
    } cfg[] = {{64, 64, 1.0f}, {48, 64, 1.1902381f}};
    for (size_t k = 0; k < sizeof cfg / sizeof *cfg; k++)
        for (int di = 0; di < 3; di++) {
            const int d = cfg[k].d, ldh = cfg[k].ldh;
            const float sc = cfg[k].scale;
            zo_dtype ty = DTYPES[di];
            twin x = tw_rand((size_t)n * ld, ty, 1.0f);
            assert_int_equal(gpu_rope_forward(scpu, x.c, n, t, heads, d, ld, ldh, 10000.0f, 7, NULL, sc), ZO_OK);
            assert_int_equal(gpu_rope_forward(sgpu, x.g, n, t, heads, d, ld, ldh, 10000.0f, 7, NULL, sc), ZO_OK);
            bad += tw_check("rope forward", x, tol_of(ty));
            tw_sync_to_gpu(x);
            assert_int_equal(gpu_rope_backward(scpu, x.c, n, t, heads, d, ld, ldh, 500000.0f, 4000, NULL, sc),
                             ZO_OK);
            assert_int_equal(gpu_rope_backward(sgpu, x.g, n, t, heads, d, ld, ldh, 500000.0f, 4000, NULL, sc),
                             ZO_OK);
            bad += tw_check("rope backward", x, tol_of(ty));
            tw_free(x);
        }
    assert_int_equal(bad, 0);
}

static void test_activations(void **state)
{
    (void)state;
    int bad = 0;
    const size_t n = 100003; /* more than one grid-stride pass is not needed; odd size */
    for (int di = 0; di < 3; di++) {
        zo_dtype t = DTYPES[di];
        twin x = tw_rand(n, t, 4.0f), up = tw_rand(n, t, 2.0f), dy = tw_rand(n, t, 1.0f);
        twin y = tw_out(n, t), dx = tw_out(n, t), dup = tw_out(n, t);
        assert_int_equal(gpu_gelu_forward(scpu, y.c, x.c, n, 0), ZO_OK);
        assert_int_equal(gpu_gelu_forward(sgpu, y.g, x.g, n, 0), ZO_OK);
        bad += tw_check("gelu y", y, tol_of(t));
        assert_int_equal(gpu_gelu_backward(scpu, dx.c, dy.c, x.c, n, 0), ZO_OK);
        assert_int_equal(gpu_gelu_backward(sgpu, dx.g, dy.g, x.g, n, 0), ZO_OK);
        bad += tw_check("gelu dx", dx, tol_of(t));
        assert_int_equal(gpu_swiglu_forward(scpu, y.c, x.c, up.c, n, 0), ZO_OK);
        assert_int_equal(gpu_swiglu_forward(sgpu, y.g, x.g, up.g, n, 0), ZO_OK);
        bad += tw_check("swiglu y", y, tol_of(t));
        assert_int_equal(gpu_swiglu_backward(scpu, dx.c, dup.c, dy.c, x.c, up.c, n, 0), ZO_OK);
        assert_int_equal(gpu_swiglu_backward(sgpu, dx.g, dup.g, dy.g, x.g, up.g, n, 0), ZO_OK);
        bad += tw_check("swiglu dgate", dx, tol_of(t));
        bad += tw_check("swiglu dup", dup, tol_of(t));
        tw_free(x);
        tw_free(up);
        tw_free(dy);
        tw_free(y);
        tw_free(dx);
        tw_free(dup);
    }
    assert_int_equal(bad, 0);
}

/* ---- embedding, loss ------------------------------------------------------------------------ */

static void test_embedding(void **state)
{
    (void)state;
    int bad = 0;
    const int n = 150, t = 50, c = 130, vocab = 97;
    int32_t ids[150];
    for (int r = 0; r < n; r++) ids[r] = (r * 31 + 7) % vocab; /* repeats */
    ids[3] = ids[4] = ids[90] = 5;                               /* more repeats */
    twin tok = tw_ids(ids, n);
    for (int di = 0; di < 3; di++) {
        zo_dtype ty = DTYPES[di];
        for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
            twin wte = tw_rand((size_t)vocab * c, ty, 1.0f), out = tw_out((size_t)n * c, ty);
            twin wpe = with_wpe ? tw_rand((size_t)t * c, ty, 1.0f)
                                : (twin){{NULL, ty}, {NULL, ty}, 0};
            assert_int_equal(gpu_embedding_forward(scpu, out.c, tok.c.data, wte.c, wpe.c, n, t, c,
                                                   vocab), ZO_OK);
            assert_int_equal(gpu_embedding_forward(sgpu, out.g, tok.g.data, wte.g, wpe.g, n, t, c,
                                                   vocab), ZO_OK);
            bad += tw_check("embedding out", out, tol_of(ty));
            twin dout = tw_rand((size_t)n * c, ty, 1.0f);
            /* += into the weights themselves (random start) */
            assert_int_equal(gpu_embedding_backward(scpu, wte.c, wpe.c, dout.c, tok.c.data, n, t,
                                                    c, vocab), ZO_OK);
            assert_int_equal(gpu_embedding_backward(sgpu, wte.g, wpe.g, dout.g, tok.g.data, n, t,
                                                    c, vocab), ZO_OK);
            bad += tw_check("embedding dwte", wte, tol_of(ty));
            if (with_wpe) {
                bad += tw_check("embedding dwpe", wpe, tol_of(ty));
                tw_free(wpe);
            }
            tw_free(wte);
            tw_free(out);
            tw_free(dout);
        }
    }
    tw_free(tok);
    assert_int_equal(bad, 0);
}

static void test_cross_entropy(void **state)
{
    (void)state;
    int bad = 0;
    const int n = 19, v = 3001;
    int32_t tg[19];
    for (int r = 0; r < n; r++) tg[r] = (r * 997) % v;
    tg[2] = -1;
    tg[11] = -1;
    tg[5] = v - 1;
    twin tgt = tw_ids(tg, n);
    for (int di = 0; di < 3; di++) {
        zo_dtype t = DTYPES[di];
        twin logits = tw_rand((size_t)n * v, t, 8.0f), losses = tw_out(n, ZO_DTYPE_F32);
        assert_int_equal(gpu_cross_entropy_forward(scpu, losses.c.data, logits.c, tgt.c.data, n, v),
                         ZO_OK);
        assert_int_equal(gpu_cross_entropy_forward(sgpu, losses.g.data, logits.g, tgt.g.data, n, v),
                         ZO_OK);
        bad += tw_check("cross_entropy losses", losses, tol_of(ZO_DTYPE_F32));
        twin dl = tw_out((size_t)n * v, ZO_DTYPE_F32);
        assert_int_equal(gpu_cross_entropy_backward(scpu, dl.c, logits.c, tgt.c.data, 1.0f / 17,
                                                    n, v), ZO_OK);
        assert_int_equal(gpu_cross_entropy_backward(sgpu, dl.g, logits.g, tgt.g.data, 1.0f / 17,
                                                    n, v), ZO_OK);
        bad += tw_check("cross_entropy dlogits", dl, tol_of(ZO_DTYPE_F32));
        /* in place */
        assert_int_equal(gpu_cross_entropy_backward(scpu, logits.c, logits.c, tgt.c.data, 0.5f, n,
                                                    v), ZO_OK);
        assert_int_equal(gpu_cross_entropy_backward(sgpu, logits.g, logits.g, tgt.g.data, 0.5f, n,
                                                    v), ZO_OK);
        bad += tw_check("cross_entropy in place", logits, tol_of(t));
        tw_free(logits);
        tw_free(losses);
        tw_free(dl);
    }
    tw_free(tgt);
    assert_int_equal(bad, 0);
}

/* ---- elementwise and reductions ------------------------------------------------------------- */

static void test_elementwise(void **state)
{
    (void)state;
    int bad = 0;
    const size_t n = 77777;
    for (int di = 0; di < 3; di++) {
        zo_dtype t = DTYPES[di];
        twin a = tw_rand(n, t, 3.0f), b = tw_rand(n, t, 3.0f), y = tw_out(n, t);
        assert_int_equal(gpu_add(scpu, y.c, a.c, b.c, n), ZO_OK);
        assert_int_equal(gpu_add(sgpu, y.g, a.g, b.g, n), ZO_OK);
        bad += tw_check("add", y, tol_of(t));
        assert_int_equal(gpu_add(scpu, a.c, a.c, b.c, n), ZO_OK); /* y aliases a */
        assert_int_equal(gpu_add(sgpu, a.g, a.g, b.g, n), ZO_OK);
        bad += tw_check("add in place", a, tol_of(t));
        assert_int_equal(gpu_scale(scpu, b.c, -0.37f, n), ZO_OK);
        assert_int_equal(gpu_scale(sgpu, b.g, -0.37f, n), ZO_OK);
        bad += tw_check("scale", b, tol_of(t));
        for (int dj = 0; dj < 3; dj++) { /* every cast, checked exactly: one rounding */
            twin dst = tw_out(n, DTYPES[dj]);
            assert_int_equal(gpu_cast(scpu, dst.c, a.c, n), ZO_OK);
            assert_int_equal(gpu_cast(sgpu, dst.g, a.g, n), ZO_OK);
            bad += tw_check("cast", dst, (tol){0.0, 0.0});
            tw_free(dst);
        }
        tw_free(a);
        tw_free(b);
        tw_free(y);
    }
    assert_int_equal(bad, 0);
}

/* NF4 weights quantized on the host, dequantized on both devices into every
 * type: the same bits (both round each product and sum as written). */
static void test_nf4_dequantize(void **state)
{
    (void)state;
    int bad = 0;
    const size_t ns[] = {1, 65, 3 * 64 * 256 + 1001};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        size_t n = ns[k], bytes = zo_nf4_bytes(n);
        float *w = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) w[i] = frand() * (float)(1 + i / 64 % 7);
        uint8_t *q = aligned_alloc(64, (bytes + 63) / 64 * 64);
        assert_int_equal(zo_nf4_quantize(q, w, n, 0), ZO_OK);
        void *qc, *qg;
        assert_int_equal(gpu_mem_alloc(cpu, bytes, &qc), ZO_OK);
        assert_int_equal(gpu_mem_alloc(gpu, bytes, &qg), ZO_OK);
        put(scpu, qc, q, bytes);
        put(sgpu, qg, q, bytes);
        for (int di = 0; di < 3; di++) {
            twin out = tw_out(n, DTYPES[di]);
            assert_int_equal(gpu_nf4_dequantize(scpu, out.c, qc, n), ZO_OK);
            assert_int_equal(gpu_nf4_dequantize(sgpu, out.g, qg, n), ZO_OK);
            bad += tw_check("nf4 dequantize", out, (tol){0.0, 0.0});
            tw_free(out);
        }
        gpu_mem_free(cpu, qc);
        gpu_mem_free(gpu, qg);
        free(q);
        free(w);
    }
    assert_int_equal(bad, 0);
}

static void test_reductions(void **state)
{
    (void)state;
    const size_t n = 1000003;
    for (int di = 0; di < 3; di++) {
        zo_dtype t = DTYPES[di];
        twin x = tw_rand(n, t, 2.0f);
        double *sum[2];
        int32_t *flag[2];
        gpu_device_t devs[2] = {cpu, gpu};
        gpu_stream_t ss[2] = {scpu, sgpu};
        gpu_tensor xs[2] = {x.c, x.g};
        double hs[2] = {0};
        int32_t hf[2][2] = {{0}};
        for (int k = 0; k < 2; k++) {
            assert_int_equal(gpu_mem_alloc(devs[k], sizeof(double), (void **)&sum[k]), ZO_OK);
            assert_int_equal(gpu_mem_alloc(devs[k], sizeof(int32_t), (void **)&flag[k]), ZO_OK);
            double start = 1.5; /* the sum accumulates */
            put(ss[k], sum[k], &start, sizeof start);
            assert_int_equal(gpu_memset_async(ss[k], flag[k], 0, sizeof(int32_t)), ZO_OK);
            assert_int_equal(gpu_sum_squares(ss[k], sum[k], xs[k], n), ZO_OK);
            assert_int_equal(gpu_check_finite(ss[k], flag[k], xs[k], n), ZO_OK);
            get(ss[k], &hs[k], sum[k], sizeof(double));
            get(ss[k], &hf[k][0], flag[k], sizeof(int32_t));
        }
        assert_float_equal(hs[1], hs[0], 1e-5 * hs[0]);
        assert_int_equal(hf[0][0], 0);
        assert_int_equal(hf[1][0], 0);
        /* one inf (fp32, fp16) or nan (bf16) near the end */
        float bad_v = t == ZO_DTYPE_BF16 ? NAN : INFINITY;
        unsigned char raw[4];
        zo_store_f32(raw, t, 0, bad_v);
        for (int k = 0; k < 2; k++) {
            put(ss[k], (char *)xs[k].data + (n - 2) * zo_dtype_size(t), raw, zo_dtype_size(t));
            assert_int_equal(gpu_check_finite(ss[k], flag[k], xs[k], n), ZO_OK);
            get(ss[k], &hf[k][1], flag[k], sizeof(int32_t));
            assert_int_equal(hf[k][1], 1);
            gpu_mem_free(devs[k], sum[k]);
            gpu_mem_free(devs[k], flag[k]);
        }
        tw_free(x);
    }
}

/* gpu_adam_update: explicitly rounded operations in cpu_adam's order, so the
 * backend under test must give the CPU backend's bits for params, m, v and
 * the 16-bit copy, after every one of three steps. */
static void test_adam(void **state)
{
    (void)state;
    const size_t n = 100003;
    int bad = 0;
    for (int di = 0; di < 3; di++)
        for (int l2 = 0; l2 < 2; l2++) {
            zo_dtype gd = DTYPES[di], od = di == 2 ? ZO_DTYPE_BF16 : ZO_DTYPE_F16;
            twin p = tw_rand(n, ZO_DTYPE_F32, 2.0f), m = tw_out(n, ZO_DTYPE_F32),
                 v = tw_out(n, ZO_DTYPE_F32), o = tw_out(n, od), g = tw_alloc(n, gd);
            assert_int_equal(gpu_memset_async(sgpu, m.g.data, 0, 4 * n), ZO_OK);
            assert_int_equal(gpu_memset_async(sgpu, v.g.data, 0, 4 * n), ZO_OK);
            void *tmp = malloc(n * zo_dtype_size(gd));
            for (int step = 1; step <= 3; step++) {
                /* gradients over seven decades, every 97th zero */
                for (size_t i = 0; i < n; i++) {
                    float mag = powf(10.0f, -6.0f + 3.5f * (frand() + 1.0f));
                    zo_store_f32(tmp, gd, i, i % 97 == 0 ? 0.0f : frand() * mag);
                }
                put(scpu, g.c.data, tmp, n * zo_dtype_size(gd));
                put(sgpu, g.g.data, tmp, n * zo_dtype_size(gd));
                gpu_adam_hparams hp = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                       .weight_decay = 0.1f,
                                       .decay = l2 ? GPU_ADAM_DECAY_L2 : GPU_ADAM_DECAY_ADAMW,
                                       .step = step, .grad_mult = step == 2 ? 0.7f / 1024 : 1.0f};
                assert_int_equal(gpu_adam_update(scpu, &hp, n, p.c.data, g.c, m.c.data, v.c.data,
                                                 o.c),
                                 ZO_OK);
                assert_int_equal(gpu_adam_update(sgpu, &hp, n, p.g.data, g.g, m.g.data, v.g.data,
                                                 o.g),
                                 ZO_OK);
                twin outs[4] = {p, m, v, o};
                const char *names[4] = {"adam param", "adam m", "adam v", "adam out16"};
                for (int k = 0; k < 4; k++) {
                    size_t bytes = n * zo_dtype_size(outs[k].c.dtype);
                    unsigned char *a = malloc(bytes), *b = malloc(bytes);
                    get(scpu, a, outs[k].c.data, bytes);
                    get(sgpu, b, outs[k].g.data, bytes);
                    if (memcmp(a, b, bytes)) {
                        bad++;
                        tw_check(names[k], outs[k], (tol){0.0, 0.0}); /* prints the first */
                        printf("  (grad %s, %s, step %d)\n", zo_dtype_name(gd),
                               l2 ? "l2" : "adamw", step);
                    }
                    free(a);
                    free(b);
                }
            }
            free(tmp);
            tw_free(p), tw_free(m), tw_free(v), tw_free(o), tw_free(g);
        }
    assert_int_equal(bad, 0);
}

int main(void)
{
    const char *env = getenv("ZO_PARITY_BACKEND");
    if (env && *env) backend = env;
    is_cuda = strcmp(backend, "cpu") != 0;
    if (is_cuda && gpu_cuda_device_count() == 0) {
        printf("test_gpu_parity: no CUDA device here (or a build without CUDA): skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_names),    cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_events_order),  cmocka_unit_test(test_sticky_errors),
        cmocka_unit_test(test_gemm),          cmocka_unit_test(test_bias),
        cmocka_unit_test(test_layernorm),     cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_attention),     cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_rope),          cmocka_unit_test(test_activations),
        cmocka_unit_test(test_embedding),     cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_elementwise),   cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_adam),          cmocka_unit_test(test_nf4_dequantize),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
