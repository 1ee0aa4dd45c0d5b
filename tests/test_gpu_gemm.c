/* Tests for the CPU backend's GEMM (cpu_gemm, gpu/ops_cpu.c): the own packed
 * kernel and the OpenBLAS path, each forced in turn, and the dispatch rule,
 * against a double-precision reference written here from the definition
 * (not cpu_gemm_naive, which shares the storage conversions). Shapes sit
 * around both implementations' block sizes: the own kernel's MR = 6, NR = 32,
 * MC = 192, NC = 256, KC = 256; the library path's tiles (64 rows, 128
 * columns, edges on multiples of 16, fp32 copies of 16-bit operands capped
 * at 4M floats a tile) and OpenBLAS's depth slices (448 for its SkylakeX
 * sgemm, a remainder below 896 halved). Both transposes, leading dimensions
 * and batch strides above the minimum (the padding must stay untouched),
 * alpha != 1, beta == 0 over a C full of nan, beta != 0, fp32/fp16/bf16 and
 * mixed storage; then bits equal with 1 and 2 threads on every path, and
 * concurrent calls from two threads. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/dtype.h" /* defines: zo_store_f32, zo_load_f32, zo_dtype_size */
#include "gpu/ops_cpu.h"  /* defines: cpu_gemm, cpu_gemm_set_impl, cpu_gemm_blas */

static cpu_scratch ws;

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static double urand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* One product's description in the test's terms. */
typedef struct gcase {
    int ta, tb, m, n, k;
    int pad_a, pad_b, pad_c; /* leading dimension past the minimum */
    int batch;
    long gap;                /* elements between batch entries past the matrix */
    double alpha, beta;
    zo_dtype da, db, dc;
} gcase;

/* A product's buffers: storage as the dtypes say, and the same values as
 * doubles (what the storage holds, so the reference sees the rounded inputs). */
typedef struct gbufs {
    gpu_gemm_desc d;
    void *a, *b, *c;
    double *ha, *hb, *hc;
    size_t na, nb, nc;
} gbufs;

static void *fill(zo_dtype t, size_t n, double **h, int nan_fill)
{
    void *p = malloc(n * zo_dtype_size(t));
    *h = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        zo_store_f32(p, t, i, nan_fill ? NAN : (float)urand());
        (*h)[i] = zo_load_f32(p, t, i);
    }
    return p;
}

static gbufs make(const gcase *g)
{
    gbufs B = {0};
    int64_t lda = (g->ta ? g->m : g->k) + g->pad_a, ldb = (g->tb ? g->k : g->n) + g->pad_b;
    int64_t ldc = g->n + g->pad_c;
    int64_t rows_a = g->ta ? g->k : g->m, rows_b = g->tb ? g->n : g->k;
    int batch = g->batch > 0 ? g->batch : 1;
    int64_t sa = rows_a * lda + g->gap, sb = rows_b * ldb + g->gap, sc = (int64_t)g->m * ldc + g->gap;
    B.na = (size_t)(sa * batch), B.nb = (size_t)(sb * batch), B.nc = (size_t)(sc * batch);
    B.a = fill(g->da, B.na, &B.ha, 0);
    B.b = fill(g->db, B.nb, &B.hb, 0);
    B.c = fill(g->dc, B.nc, &B.hc, g->beta == 0.0); /* beta == 0 must ignore nan */
    B.d = (gpu_gemm_desc){.trans_a = g->ta, .trans_b = g->tb, .m = g->m, .n = g->n, .k = g->k,
                          .alpha = (float)g->alpha, .beta = (float)g->beta,
                          .a = gpu_t(B.a, g->da), .b = gpu_t(B.b, g->db), .c = gpu_t(B.c, g->dc),
                          .lda = lda, .ldb = ldb, .ldc = ldc, .batch = g->batch,
                          .stride_a = sa, .stride_b = sb, .stride_c = sc};
    return B;
}

static void unmake(gbufs *B)
{
    free(B->a), free(B->b), free(B->c), free(B->ha), free(B->hb), free(B->hc);
}

/* Unit roundoff of a storage type (what rounding a result to it may add). */
static double unit(zo_dtype t)
{
    return t == ZO_DTYPE_F32 ? 0.0 : t == ZO_DTYPE_F16 ? 0x1p-11 : 0x1p-8;
}

/* Run d with the current implementation and check every element of C
 * against the reference: |got - want| <= e (1 + u_c) + u_c |want|, where
 * e = gamma (|alpha| sum|a b| + |beta c|) bounds the fp32 error (gamma =
 * (k + 2) 2^-24: sums of k products, then alpha and beta) and u_c is the
 * unit roundoff of C's storage. Elements outside the m x n
 * blocks (padding, gaps between batch entries) must keep their bits.
 * Returns the count of bad elements, printing the first few. */
static int check_case(const char *what, const gcase *g, int nt)
{
    gbufs B = make(g);
    void *before = malloc(B.nc * zo_dtype_size(g->dc));
    memcpy(before, B.c, B.nc * zo_dtype_size(g->dc));
    assert_int_equal(cpu_gemm(&ws, &B.d, nt), ZO_OK);
    const gpu_gemm_desc *d = &B.d;
    int batch = g->batch > 0 ? g->batch : 1, bad = 0;
    double worst = 0.0;
    const double gamma = (g->k + 2) * 0x1p-24, uc = unit(g->dc);
    unsigned char *inside = calloc(B.nc, 1);
    for (int bi = 0; bi < batch; bi++) {
        const double *A = B.ha + bi * d->stride_a, *Bm = B.hb + bi * d->stride_b;
        for (int i = 0; i < g->m; i++)
            for (int j = 0; j < g->n; j++) {
                double s = 0.0, abs_s = 0.0;
                for (int p = 0; p < g->k; p++) {
                    double x = g->ta ? A[(size_t)p * d->lda + i] : A[(size_t)i * d->lda + p];
                    double y = g->tb ? Bm[(size_t)j * d->ldb + p] : Bm[(size_t)p * d->ldb + j];
                    s += x * y;
                    abs_s += fabs(x * y);
                }
                size_t o = (size_t)(bi * d->stride_c + (int64_t)i * d->ldc + j);
                inside[o] = 1;
                double c0 = g->beta != 0.0 ? B.hc[o] : 0.0;
                double want = g->alpha * s + g->beta * c0;
                double e32 = gamma * (fabs(g->alpha) * abs_s + fabs(g->beta * c0));
                double tol = e32 * (1.0 + uc) + uc * fabs(want);
                tol += 1e-30; /* an exact zero */
                double got = zo_load_f32(B.c, g->dc, o), err = fabs(got - want);
                if (!(err <= tol)) {
                    if (bad < 5)
                        printf("  %s: batch %d C[%d][%d] = %.9g, want %.9g (tolerance %.3g)\n", what,
                               bi, i, j, got, want, tol);
                    bad++;
                }
                if (err / (tol + 1e-300) > worst) worst = err / (tol + 1e-300);
            }
    }
    size_t es = zo_dtype_size(g->dc);
    for (size_t o = 0; o < B.nc; o++)
        if (!inside[o] && memcmp((char *)B.c + o * es, (char *)before + o * es, es) != 0) {
            if (bad < 5) printf("  %s: element %zu outside C changed\n", what, o);
            bad++;
        }
    if (bad)
        printf("  %s: %d bad (largest error / tolerance %.3g): %s%s m %d n %d k %d, lda %lld "
               "ldb %lld ldc %lld, batch %d, alpha %g beta %g, %s %s %s\n",
               what, bad, worst, g->ta ? "T" : "N", g->tb ? "T" : "N", g->m, g->n, g->k,
               (long long)d->lda, (long long)d->ldb, (long long)d->ldc, batch, g->alpha, g->beta,
               zo_dtype_name(g->da), zo_dtype_name(g->db), zo_dtype_name(g->dc));
    free(inside);
    free(before);
    unmake(&B);
    return bad;
}

/* The shapes every path runs: edges of the own kernel's register tile and
 * blocks, of the library path's tiles and of OpenBLAS's depth slices. */
static const int shapes[][3] = {
    {1, 1, 1},       {5, 3, 7},        {7, 33, 5},     {6, 32, 256},   {13, 31, 257},
    {193, 257, 255}, {191, 255, 449},  {65, 129, 300}, {127, 257, 97}, {128, 130, 700},
    {250, 40, 513},  {20, 300, 1000},
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

/* Every shape, both transposes, padded leading dimensions, alpha and beta
 * varied; fp32 everywhere, then 16-bit storage on a subset. */
static int run_all(const char *what)
{
    int bad = 0;
    const zo_dtype F = ZO_DTYPE_F32, H = ZO_DTYPE_F16, BF = ZO_DTYPE_BF16;
    for (int s = 0; s < N_SHAPES; s++)
        for (int t = 0; t < 4; t++) {
            gcase g = {.ta = t & 1, .tb = t >> 1, .m = shapes[s][0], .n = shapes[s][1],
                       .k = shapes[s][2], .pad_a = 3 * (s & 1), .pad_b = 5 * ((s >> 1) & 1),
                       .pad_c = 7 * ((s + t) & 1), .alpha = (s + t) % 3 ? 1.0 : 0.75,
                       .beta = t == 1 ? -1.5 : t == 3 ? 1.0 : 0.0, .da = F, .db = F, .dc = F};
            bad += check_case(what, &g, 2);
            if (s % 3 == 1) { /* 16-bit storage, every transpose */
                zo_dtype h = s % 2 ? BF : H;
                g.da = g.db = g.dc = h;
                bad += check_case(what, &g, 2);
            }
        }
    /* strided batches with gaps between the entries, beta 0 over nan and not */
    gcase b1 = {.ta = 0, .tb = 1, .m = 17, .n = 45, .k = 70, .pad_a = 2, .pad_c = 1, .batch = 5,
                .gap = 9, .alpha = 0.5, .beta = 0.0, .da = F, .db = F, .dc = F};
    gcase b2 = {.ta = 1, .tb = 0, .m = 130, .n = 70, .k = 33, .pad_b = 4, .batch = 3, .gap = 1,
                .alpha = 1.0, .beta = 2.0, .da = BF, .db = BF, .dc = BF};
    gcase b3 = {.ta = 0, .tb = 0, .m = 70, .n = 260, .k = 300, .batch = 2, .gap = 64,
                .alpha = -1.0, .beta = 0.0, .da = H, .db = H, .dc = F};
    bad += check_case(what, &b1, 2) + check_case(what, &b2, 2) + check_case(what, &b3, 2);
    /* mixed storage (bf16 weights, fp32 activations and output, and back) */
    gcase x1 = {.ta = 0, .tb = 1, .m = 150, .n = 200, .k = 96, .pad_a = 1, .alpha = 1.0,
                .da = F, .db = BF, .dc = F};
    gcase x2 = {.ta = 1, .tb = 0, .m = 96, .n = 140, .k = 150, .alpha = 1.0, .beta = 1.0,
                .da = BF, .db = F, .dc = BF};
    bad += check_case(what, &x1, 2) + check_case(what, &x2, 2);
    /* 16-bit operands whose fp32 copies pass 4M floats: the library path
     * halves its tiles' columns */
    gcase big = {.ta = 0, .tb = 1, .m = 20, .n = 2100, .k = 2050, .alpha = 1.0, .da = BF,
                 .db = BF, .dc = BF};
    bad += check_case(what, &big, 2);
    return bad;
}

/* The own GEMM on each register kernel this machine runs: the generic one
 * (AVX-512 or plain x86-64) and, where AVX2 and FMA are, the AVX2 one; the
 * shapes' last panels have 1 to 32 live columns (the kernels' 8- and
 * 16-column branches). */
static void test_gemm_own(void **state)
{
    (void)state;
    cpu_gemm_set_impl(CPU_GEMM_OWN);
    assert_int_equal(cpu_gemm_set_kernel(CPU_KERNEL_GENERIC), CPU_KERNEL_GENERIC);
    assert_int_equal(run_all("own kernel (generic registers)"), 0);
    if (cpu_gemm_set_kernel(CPU_KERNEL_AVX2) == CPU_KERNEL_AVX2)
        assert_int_equal(run_all("own kernel (AVX2 registers)"), 0);
    else
        printf("  no AVX2 and FMA here: the AVX2 register kernel is not run\n");
    cpu_gemm_set_kernel(CPU_KERNEL_AUTO);
}

static void test_gemm_blas(void **state)
{
    (void)state;
    if (!cpu_gemm_blas()) {
        printf("  no usable BLAS library (none built in, or a serial build loaded): "
               "cpu_gemm runs the own kernel only\n");
        skip();
    }
    printf("  %s\n", cpu_gemm_blas());
    cpu_gemm_set_impl(CPU_GEMM_BLAS);
    assert_int_equal(run_all("OpenBLAS path"), 0);
}

static void test_gemm_auto(void **state)
{
    (void)state;
    cpu_gemm_set_impl(CPU_GEMM_AUTO);
    assert_int_equal(run_all("dispatch"), 0);
}

/* C's bits with nt = 1 and nt = 2, for each implementation. */
static void test_gemm_determinism(void **state)
{
    (void)state;
    const zo_dtype F = ZO_DTYPE_F32, BF = ZO_DTYPE_BF16;
    const gcase cases[] = {
        /* k = 700, 1000: OpenBLAS's own threading gives other bits with 2 threads */
        {.ta = 0, .tb = 1, .m = 300, .n = 520, .k = 700, .alpha = 1.0, .da = F, .db = F, .dc = F},
        {.ta = 1, .tb = 0, .m = 520, .n = 300, .k = 1000, .alpha = 1.0, .beta = 1.0, .da = F,
         .db = F, .dc = F},
        {.ta = 0, .tb = 0, .m = 100, .n = 700, .k = 700, .alpha = 1.0, .da = BF, .db = BF, .dc = BF},
        {.ta = 0, .tb = 1, .m = 64, .n = 200, .k = 700, .batch = 3, .alpha = 1.0, .da = F,
         .db = BF, .dc = F},
    };
    /* the own GEMM twice: on the generic register kernel, then the machine's choice */
    const cpu_gemm_impl impls[] = {CPU_GEMM_AUTO, CPU_GEMM_OWN, CPU_GEMM_OWN, CPU_GEMM_BLAS};
    for (int ii = 0; ii < 4; ii++) {
        cpu_gemm_set_impl(impls[ii]);
        cpu_gemm_set_kernel(ii == 1 ? CPU_KERNEL_GENERIC : CPU_KERNEL_AUTO);
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            gbufs B = make(&cases[ci]);
            size_t bytes = B.nc * zo_dtype_size(cases[ci].dc);
            void *c0 = malloc(bytes), *c1 = malloc(bytes);
            memcpy(c0, B.c, bytes);
            assert_int_equal(cpu_gemm(&ws, &B.d, 1), ZO_OK);
            memcpy(c1, B.c, bytes);
            memcpy(B.c, c0, bytes);
            assert_int_equal(cpu_gemm(&ws, &B.d, 2), ZO_OK);
            if (memcmp(c1, B.c, bytes) != 0)
                printf("  implementation %d, case %zu: bits differ between 1 and 2 threads\n",
                       (int)impls[ii], ci);
            assert_memory_equal(c1, B.c, bytes);
            free(c0), free(c1);
            unmake(&B);
        }
    }
    cpu_gemm_set_impl(CPU_GEMM_AUTO);
}

/* Two threads, each with its own scratch, running library GEMMs at once
 * (as two streams do) get the bits of a lone run. */
typedef struct conc_arg {
    gbufs *B;
    void *want;
    size_t bytes;
    int bad;
} conc_arg;

static void *conc_run(void *p)
{
    conc_arg *a = p;
    cpu_scratch mine;
    cpu_scratch_init(&mine);
    void *c = malloc(a->bytes);
    gpu_gemm_desc d = a->B->d;
    d.c.data = c;
    for (int r = 0; r < 20; r++) {
        if (cpu_gemm(&mine, &d, 2) != ZO_OK || memcmp(c, a->want, a->bytes) != 0) a->bad++;
    }
    free(c);
    cpu_scratch_free(&mine);
    return NULL;
}

static void test_gemm_concurrent(void **state)
{
    (void)state;
    cpu_gemm_set_impl(CPU_GEMM_BLAS);
    const zo_dtype F = ZO_DTYPE_F32;
    gcase g = {.ta = 0, .tb = 1, .m = 200, .n = 300, .k = 500, .alpha = 1.0, .da = F, .db = F,
               .dc = F};
    gbufs B = make(&g);
    size_t bytes = B.nc * 4;
    assert_int_equal(cpu_gemm(&ws, &B.d, 2), ZO_OK);
    conc_arg args[2] = {{&B, B.c, bytes, 0}, {&B, B.c, bytes, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, conc_run, &args[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    assert_int_equal(args[0].bad + args[1].bad, 0);
    unmake(&B);
    cpu_gemm_set_impl(CPU_GEMM_AUTO);
}

static int setup(void **state)
{
    (void)state;
    cpu_scratch_init(&ws);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cpu_scratch_free(&ws);
    cpu_gemm_set_impl(CPU_GEMM_AUTO);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_own),
        cmocka_unit_test(test_gemm_blas),
        cmocka_unit_test(test_gemm_auto),
        cmocka_unit_test(test_gemm_determinism),
        cmocka_unit_test(test_gemm_concurrent),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
