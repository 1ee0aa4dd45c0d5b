/* Private to the CUDA backend: the index math of gpu_gemm on cuBLASLt, kept
 * free of CUDA so that a CPU-only test (tests/test_gpu_cuda_layout.c) can
 * check it by running a column-major product with exactly these parameters.
 *
 * cuBLASLt is column-major. A row-major [r, c] matrix with leading dimension
 * ld is the column-major c x r matrix with the same ld (its transpose), so the
 * row-major C = op(A) op(B) is computed as the column-major
 * C^T = op(B)^T op(A)^T: cuBLASLt's A is our B and its B is our A, each with
 * its transpose flag kept, and m and n swap. */
#ifndef ZO_GPU_CUDA_GEMM_LAYOUT_H
#define ZO_GPU_CUDA_GEMM_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* device.h and common/ declare C functions (gemm.cu is C++) */
#endif

#include "gpu/device.h" /* defines: gpu_gemm_desc */

/* One cuBLASLt operand: column-major rows x cols as stored (before its op),
 * leading dimension ld, batch stride in elements. */
typedef struct cuda_lt_mat {
    int trans; /* CUBLAS_OP_T when 1, CUBLAS_OP_N when 0 */
    uint64_t rows, cols;
    int64_t ld, stride;
} cuda_lt_mat;

/* The cuBLASLt problem of a gpu_gemm: D = C = op(a) op(b) in column-major,
 * a = our B, b = our A, c = our C; batch >= 1. */
typedef struct cuda_lt_gemm {
    cuda_lt_mat a, b, c;
    int batch;
} cuda_lt_gemm;

static inline cuda_lt_gemm cuda_gemm_lt_shape(const gpu_gemm_desc *d)
{
    cuda_lt_gemm g;
    g.batch = d->batch > 0 ? d->batch : 1;
    /* Lt's A = our B as stored: row-major [k, n] is column-major n x k (op N,
     * giving op(B)^T); row-major [n, k] is column-major k x n (op T). */
    g.a.trans = d->trans_b != 0;
    g.a.rows = (uint64_t)(d->trans_b ? d->k : d->n);
    g.a.cols = (uint64_t)(d->trans_b ? d->n : d->k);
    g.a.ld = d->ldb;
    g.a.stride = d->stride_b;
    /* Lt's B = our A as stored: [m, k] is k x m (op N); [k, m] is m x k (op T). */
    g.b.trans = d->trans_a != 0;
    g.b.rows = (uint64_t)(d->trans_a ? d->m : d->k);
    g.b.cols = (uint64_t)(d->trans_a ? d->k : d->m);
    g.b.ld = d->lda;
    g.b.stride = d->stride_a;
    /* C row-major [m, n] is column-major n x m */
    g.c.trans = 0;
    g.c.rows = (uint64_t)d->n;
    g.c.cols = (uint64_t)d->m;
    g.c.ld = d->ldc;
    g.c.stride = d->stride_c;
    return g;
}

/* Elements from the first to one past the last element of operand `which`
 * ('a' or 'b', row-major as gpu_gemm stores it) over all batches: what a
 * scratch copy of it must hold with its ld and batch stride kept. */
static inline size_t cuda_gemm_operand_extent(const gpu_gemm_desc *d, char which)
{
    const int batch = d->batch > 0 ? d->batch : 1;
    int64_t ld = which == 'a' ? d->lda : d->ldb, stride = which == 'a' ? d->stride_a : d->stride_b;
    int rows, cols; /* as stored, row-major */
    if (which == 'a') {
        rows = d->trans_a ? d->k : d->m;
        cols = d->trans_a ? d->m : d->k;
    } else {
        rows = d->trans_b ? d->n : d->k;
        cols = d->trans_b ? d->k : d->n;
    }
    return (size_t)(batch - 1) * (size_t)(batch > 1 ? stride : 0) +
           (size_t)(rows - 1) * (size_t)ld + (size_t)cols;
}

#ifdef __cplusplus
}
#endif

#endif
