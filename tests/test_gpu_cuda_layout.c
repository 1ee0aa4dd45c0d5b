/* The index math of the CUDA backend's GEMM (gpu/cuda/gemm_layout.h),
 * checked on the CPU: the cuBLASLt problem it describes is run here by a
 * column-major GEMM written from cuBLAS's definition (C = alpha op(A) op(B)
 * + beta C, element (i, j) of an ld matrix at i + j * ld, batches at
 * multiples of the strides, dimensions taken from the layouts as cuBLASLt
 * takes them), and must give gpu_gemm's row-major product as gpu/device.h
 * defines it, for all four transpose combinations, padded leading
 * dimensions and strided batches. Needs no GPU. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "gpu/cuda/gemm_layout.h" /* defines: cuda_gemm_lt_shape, cuda_gemm_operand_extent */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Rows and columns of op(M) for a column-major layout. */
static uint64_t op_rows(const cuda_lt_mat *l) { return l->trans ? l->cols : l->rows; }
static uint64_t op_cols(const cuda_lt_mat *l) { return l->trans ? l->rows : l->cols; }

/* cuBLAS(Lt)'s column-major batched product on the layouts of g, with
 * pa = Lt's A (our B), pb = Lt's B (our A), pc = C. Also records in
 * *max_a / *max_b one past the largest element index read of pa / pb. */
static void lt_reference(const cuda_lt_gemm *g, float alpha, float beta, const float *pa,
                         const float *pb, float *pc, size_t *max_a, size_t *max_b)
{
    const uint64_t M = g->c.rows, N = g->c.cols, K = op_cols(&g->a);
    /* what cuBLASLt checks of the layouts */
    assert_true(op_rows(&g->a) == M);
    assert_true(op_cols(&g->b) == N);
    assert_true(op_rows(&g->b) == K);
    assert_true(g->a.ld >= (int64_t)g->a.rows);
    assert_true(g->b.ld >= (int64_t)g->b.rows);
    assert_true(g->c.ld >= (int64_t)g->c.rows);
    assert_false(g->c.trans);
    *max_a = *max_b = 0;
    for (int bi = 0; bi < g->batch; bi++) {
        const size_t oa = (size_t)bi * g->a.stride, ob = (size_t)bi * g->b.stride;
        const size_t oc = (size_t)bi * g->c.stride;
        for (uint64_t j = 0; j < N; j++)
            for (uint64_t i = 0; i < M; i++) {
                double acc = 0.0;
                for (uint64_t p = 0; p < K; p++) {
                    /* op(A)(i, p) and op(B)(p, j) */
                    size_t ia = oa + (g->a.trans ? p + i * g->a.ld : i + p * g->a.ld);
                    size_t ib = ob + (g->b.trans ? j + p * g->b.ld : p + j * g->b.ld);
                    if (ia + 1 > *max_a) *max_a = ia + 1;
                    if (ib + 1 > *max_b) *max_b = ib + 1;
                    acc += (double)pa[ia] * pb[ib];
                }
                float *c = &pc[oc + i + j * g->c.ld];
                *c = (float)(alpha * acc + (beta != 0.0f ? beta * *c : 0.0));
            }
    }
}

/* gpu/device.h's definition, row-major. */
static void rowmajor_reference(const gpu_gemm_desc *d, const float *a, const float *b, float *c)
{
    const int batch = d->batch > 0 ? d->batch : 1;
    for (int bi = 0; bi < batch; bi++) {
        const size_t oa = batch > 1 ? (size_t)bi * d->stride_a : 0;
        const size_t ob = batch > 1 ? (size_t)bi * d->stride_b : 0;
        const size_t oc = batch > 1 ? (size_t)bi * d->stride_c : 0;
        for (int i = 0; i < d->m; i++)
            for (int j = 0; j < d->n; j++) {
                double acc = 0.0;
                for (int p = 0; p < d->k; p++) {
                    float x = a[oa + (d->trans_a ? (size_t)p * d->lda + i : (size_t)i * d->lda + p)];
                    float y = b[ob + (d->trans_b ? (size_t)j * d->ldb + p : (size_t)p * d->ldb + j)];
                    acc += (double)x * y;
                }
                float *o = &c[oc + (size_t)i * d->ldc + j];
                *o = (float)(d->alpha * acc + (d->beta != 0.0f ? d->beta * *o : 0.0));
            }
    }
}

static void check_case(int ta, int tb, int m, int n, int k, int pad, int batch, float beta)
{
    gpu_gemm_desc d = {0};
    d.trans_a = ta;
    d.trans_b = tb;
    d.m = m;
    d.n = n;
    d.k = k;
    d.alpha = 0.75f;
    d.beta = beta;
    d.lda = (ta ? m : k) + pad;
    d.ldb = (tb ? k : n) + pad;
    d.ldc = n + pad;
    d.batch = batch;
    const size_t sa = (size_t)(ta ? k : m) * d.lda, sb = (size_t)(tb ? n : k) * d.ldb;
    const size_t sc = (size_t)m * d.ldc;
    d.stride_a = (int64_t)sa + 3 * pad; /* strides a little beyond one matrix */
    d.stride_b = (int64_t)sb + 5 * pad;
    d.stride_c = (int64_t)sc + 7 * pad;
    const int nb = batch > 0 ? batch : 1;
    const size_t na = (size_t)d.stride_a * nb, nbb = (size_t)d.stride_b * nb;
    const size_t nc = (size_t)d.stride_c * nb;
    float *a = malloc(na * sizeof *a), *b = malloc(nbb * sizeof *b);
    float *c_row = malloc(nc * sizeof *c_row), *c_lt = malloc(nc * sizeof *c_lt);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c_row);
    assert_non_null(c_lt);
    for (size_t i = 0; i < na; i++) a[i] = frand();
    for (size_t i = 0; i < nbb; i++) b[i] = frand();
    for (size_t i = 0; i < nc; i++) c_row[i] = c_lt[i] = frand();

    const cuda_lt_gemm g = cuda_gemm_lt_shape(&d);
    assert_int_equal(g.batch, nb);
    size_t used_a, used_b; /* of Lt's A (our B) and Lt's B (our A) */
    lt_reference(&g, d.alpha, d.beta, b, a, c_lt, &used_a, &used_b);
    rowmajor_reference(&d, a, b, c_row);
    for (size_t i = 0; i < nc; i++)
        if (fabsf(c_row[i] - c_lt[i]) > 1e-5f * (1.0f + fabsf(c_row[i])))
            fail_msg("ta %d tb %d m %d n %d k %d pad %d batch %d beta %g: C[%zu] = %g by the "
                     "cuBLASLt layouts, %g by the definition",
                     ta, tb, m, n, k, pad, batch, (double)beta, i, (double)c_lt[i],
                     (double)c_row[i]);
    /* the scratch copy of a rounded operand spans exactly what is read */
    assert_int_equal(cuda_gemm_operand_extent(&d, 'a'), used_b);
    assert_int_equal(cuda_gemm_operand_extent(&d, 'b'), used_a);
    free(a);
    free(b);
    free(c_row);
    free(c_lt);
}

static void test_lt_layouts_all_transposes(void **state)
{
    (void)state;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_case(ta, tb, 5, 7, 3, 0, 0, 0.0f);   /* tight, single */
            check_case(ta, tb, 7, 5, 9, 2, 1, 1.0f);   /* padded ld, beta 1 */
            check_case(ta, tb, 1, 6, 4, 1, 0, 0.5f);   /* one row */
            check_case(ta, tb, 6, 1, 4, 3, 0, 0.0f);   /* one column */
            check_case(ta, tb, 4, 3, 1, 0, 0, 1.0f);   /* k = 1 */
            check_case(ta, tb, 3, 4, 5, 2, 3, 0.25f);  /* strided batch */
            check_case(ta, tb, 17, 13, 11, 1, 2, 0.0f); /* odd sizes, batch */
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lt_layouts_all_transposes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
