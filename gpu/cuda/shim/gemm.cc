/* gpu/cuda/gemm.cu on the host, through the shim (shim_prelude.h says why
 * the namespace), and the shim's stand-in for cuBLASLt (cuda_gemm_host). */
#include "gpu/cuda/shim/shim_prelude.h"

#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h> /* defines: _mm256_* (gemm_host_row_avx2) */
#endif

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
#if defined(__x86_64__) && defined(__GNUC__)
/* The same sums, 8 columns a vector (a product, then an add: no FMA), for
 * the builds whose -O2 leaves the loop below scalar (the sanitizer build:
 * it was a sixth of its test_ops). */
__attribute__((target("avx2"))) ZO_UNCHECKED static void gemm_host_row_avx2(const float *arow, const float *bt,
                                                                           int k, int n, float *c)
{
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 s = _mm256_setzero_ps();
        for (int p = 0; p < k; p++)
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(arow[p]), _mm256_loadu_ps(&bt[(size_t)p * n + j])));
        _mm256_storeu_ps(c + j, s);
    }
    for (; j < n; j++) {
        float s = 0.0f;
        for (int p = 0; p < k; p++) s += arow[p] * bt[(size_t)p * n + j];
        c[j] = s;
    }
}
#endif

ZO_UNCHECKED static void gemm_host_row(const float *arow, const float *bt, int k, int n, float *c)
{
#if defined(__x86_64__) && defined(__GNUC__)
    static const int avx2 = __builtin_cpu_supports("avx2");
    if (avx2) {
        gemm_host_row_avx2(arow, bt, k, n, c);
        return;
    }
#endif
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
