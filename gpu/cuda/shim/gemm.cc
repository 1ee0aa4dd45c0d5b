/* gpu/cuda/gemm.cu on the host, through the shim (shim_prelude.h says why
 * the namespace), and the shim's stand-in for cuBLASLt (cuda_gemm_host). */
#include "gpu/cuda/shim/shim_prelude.h"

#include <vector>

namespace zo_shim_kernels {
#include "gpu/cuda/gemm.cu"

/* gemm_tiled_kernel's arithmetic for each element of C: acc = 0, then
 * acc += a * b for p = 0 .. k-1 in that order (an fp32 product, then an fp32
 * sum: no FMA, -ffp-contract=off), then alpha * acc, plus beta * C where beta
 * is not 0 (C is not read at beta 0). The kernel's zero-padded products past
 * k add +0 to a sum that cannot be -0 (it starts at +0), so they change no
 * bit and are not done here. The columns of a row are summed side by side,
 * each in that order: the compiler's vector lanes are columns, and no sum is
 * reassociated. */
/* One row of sums: c[j] = sum over p of arow[p] * bt[p * n + j], on the
 * stand-in's own copies (sized by its caller; ZO_UNCHECKED). */
ZO_UNCHECKED static void gemm_host_row(const float *arow, const float *bt, int k, int n, float *c)
{
    for (int j = 0; j < n; j++) c[j] = 0.0f;
    for (int p = 0; p < k; p++) {
        const float a = arow[p];
        const float *b = &bt[(size_t)p * n];
        for (int j = 0; j < n; j++) c[j] += a * b[j];
    }
}

extern "C" zo_status cuda_gemm_host(const gpu_gemm_desc *d)
{
    const int batch = d->batch > 0 ? d->batch : 1;
    const int m = d->m, n = d->n, k = d->k;
    std::vector<float> bt((size_t)k * n), arow(k), acc(n);
    for (int bi = 0; bi < batch; bi++) {
        const size_t oa = (size_t)bi * d->stride_a, ob = (size_t)bi * d->stride_b;
        const size_t oc = (size_t)bi * d->stride_c;
        for (int p = 0; p < k; p++) /* op(B)[p, j], row p */
            for (int j = 0; j < n; j++)
                bt[(size_t)p * n + j] = tload(d->b, ob + (d->trans_b ? (size_t)j * d->ldb + p
                                                                     : (size_t)p * d->ldb + j));
        for (int i = 0; i < m; i++) {
            for (int p = 0; p < k; p++) /* op(A)[i, p] */
                arow[p] = tload(d->a, oa + (d->trans_a ? (size_t)p * d->lda + i : (size_t)i * d->lda + p));
            float *c = acc.data();
            gemm_host_row(arow.data(), bt.data(), k, n, c);
            for (int j = 0; j < n; j++) {
                const size_t o = oc + (size_t)i * d->ldc + j;
                const float v = d->beta != 0.0f ? d->alpha * c[j] + d->beta * tload(d->c, o) : d->alpha * c[j];
                tstore(d->c, o, v);
            }
        }
    }
    return ZO_OK;
}
}
