/* The CPU kernels: fp32 arithmetic on fp32/fp16/bf16 storage, OpenMP with
 * static schedules and fixed reduction orders (results do not depend on the
 * thread count). */
#include "gpu/ops_cpu.h"

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* defines: sysconf */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h> /* defines: _mm256_fmadd_ps (the AVX2 register kernel) */
#define ZO_GEMM_AVX2 1
#endif

#ifdef ZO_HAVE_OPENBLAS
#include <cblas.h> /* defines: cblas_sgemm, openblas_get_parallel, openblas_get_corename */
#endif

#include "common/nf4.h"           /* defines: zo_nf4_dequantize */
#include "gpu/cuda/gemm_layout.h" /* defines: cuda_gemm_operand_extent (free of CUDA) */

/* ---- element access --------------------------------------------------------- */

static inline float ld(gpu_tensor t, size_t i) { return zo_load_f32(t.data, t.dtype, i); }
static inline void st(gpu_tensor t, size_t i, float v) { zo_store_f32(t.data, t.dtype, i, v); }

/* dst[0..n) = t[off..off+n) as fp32. */
static void load_row(float *dst, gpu_tensor t, size_t off, size_t n)
{
    if (t.dtype == ZO_DTYPE_F32) {
        memcpy(dst, (const float *)t.data + off, n * sizeof(float));
        return;
    }
    const uint16_t *p = (const uint16_t *)t.data + off;
    if (t.dtype == ZO_DTYPE_BF16)
        zo_bf16_to_f32_row(dst, p, n);
    else
        for (size_t i = 0; i < n; i++) dst[i] = zo_f16_to_f32(p[i]);
}

/* t[off..off+n) = src rounded to t's dtype. */
static void store_row(gpu_tensor t, size_t off, const float *src, size_t n)
{
    if (t.dtype == ZO_DTYPE_F32) {
        memcpy((float *)t.data + off, src, n * sizeof(float));
        return;
    }
    uint16_t *p = (uint16_t *)t.data + off;
    if (t.dtype == ZO_DTYPE_BF16)
        zo_f32_to_bf16_row(p, src, n);
    else
        for (size_t i = 0; i < n; i++) p[i] = zo_f32_to_f16(src[i]);
}

/* ---- vector helpers ---------------------------------------------------------------
 * Hot loops are plain loops over fp32 arrays (restrict, no calls, no dtype
 * switch) in functions cloned for AVX-512 and AVX2, so GCC vectorizes them.
 * Sums use fixed lanes (acc[l] += x[i + l]) reduced in lane order: the same
 * order whatever the vector width or the thread count. */
#define VEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define LANES 16

/* exp(x) for fp32, vectorizable: x = n ln2 + r with |r| <= ln2/2 (ln2 split
 * in two for exactness), a degree-7 polynomial for e^r, 2^n built in the
 * exponent bits. Relative error about 2 ulp; 0 below -87.3, inf above 88.7. */
static inline float fexp(float x)
{
    float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = xc - n * 0.693145751953125f;
    r = r - n * 1.428606820309417232e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t e = (int32_t)n + 127;
    float sc = zo_bits_f32((uint32_t)e << 23);
    float y = p * sc;
    y = x < -87.3f ? 0.0f : y;
    y = x > 88.7f ? INFINITY : y;
    return x != x ? x : y;
}

VEC_CLONES static void add_f32(float *y, const float *a, const float *b, int n)
{
#pragma omp simd /* in place (output == an input) is fine: same index */
    for (int i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* Elementwise ops run over fixed blocks of EW_BLOCK elements (the unit that
 * threads share), converting each block to fp32 once. */
#define EW_BLOCK 2048

/* fp32 view of t[off..off+n): the storage itself for fp32, else converted
 * into buf. */
static const float *in_f32(gpu_tensor t, size_t off, size_t n, float *buf)
{
    if (t.dtype == ZO_DTYPE_F32) return (const float *)t.data + off;
    load_row(buf, t, off, n);
    return buf;
}

/* Where to compute t[off..) in fp32: the storage for fp32, else buf (then
 * out_done stores it). */
static float *out_f32(gpu_tensor t, size_t off, float *buf)
{
    return t.dtype == ZO_DTYPE_F32 ? (float *)t.data + off : buf;
}

static void out_done(gpu_tensor t, size_t off, const float *v, size_t n)
{
    if (t.dtype != ZO_DTYPE_F32) store_row(t, off, v, n);
}

int cpu_team(int nt) { return nt > 0 ? nt : omp_get_max_threads(); }

int cpu_run_team(int team, double work)
{
    if (team <= 1 || work < 2.0 * CPU_MIN_WORK) return 1;
    double most = work / CPU_MIN_WORK;
    return most < team ? (int)most : team;
}

/* ---- scratch arena ------------------------------------------------------------ */

#define SCRATCH_ALIGN 64u

static size_t al64(size_t bytes) { return (bytes + SCRATCH_ALIGN - 1) & ~(size_t)(SCRATCH_ALIGN - 1); }

void cpu_scratch_init(cpu_scratch *ws) { memset(ws, 0, sizeof *ws); }

void cpu_scratch_free(cpu_scratch *ws)
{
    free(ws->base);
    ws->base = NULL;
    ws->cap = 0;
}

zo_status cpu_scratch_reserve(cpu_scratch *ws, size_t bytes, const char *op, void **out)
{
    *out = NULL;
    bytes = al64(bytes ? bytes : 1);
    if (ws->fail && ws->fail(ws->fail_arg))
        return zo_error(ZO_ERR_NOMEM, "%s: scratch of %zu bytes: out of host memory (injected)",
                        op, bytes);
    if (bytes > ws->cap) {
        free(ws->base);
        ws->cap = 0;
        ws->base = aligned_alloc(SCRATCH_ALIGN, bytes);
        if (!ws->base)
            return zo_error(ZO_ERR_NOMEM, "%s: scratch of %zu bytes: out of host memory", op,
                            bytes);
        ws->cap = bytes;
    }
    *out = ws->base;
    return ZO_OK;
}

/* Reserve `shared` bytes followed by `per` bytes for each of `team` threads;
 * thread i's slice starts at team_slice(base, shared, per). */
static zo_status reserve_team(cpu_scratch *ws, const char *op, size_t shared, size_t per,
                              int team, char **base)
{
    void *p;
    zo_status s = cpu_scratch_reserve(ws, al64(shared) + (size_t)team * al64(per), op, &p);
    *base = p;
    return s;
}

static char *team_slice(char *base, size_t shared, size_t per)
{
    return base + al64(shared) + (size_t)omp_get_thread_num() * al64(per);
}

/* ---- GEMM -------------------------------------------------------------------------
 * Blocked like the BLIS/GotoBLAS loops: C is cut into MC x NC tiles shared
 * out statically among threads; for each KC slice of k, op(A) and op(B) are
 * packed into fp32 slivers (MR rows / NR columns, zero padded, converting
 * the storage type on the way) and an MR x NR register kernel accumulates
 * into an fp32 tile. Each element of C sums k in the same order whatever the
 * thread count. */
#define MR 6
#define NR 32
#define MC 192
#define NC 256
#define KC 256

typedef float v16f __attribute__((vector_size(64)));

/* acc[MR][ldacc] += Ap[kc][MR] . Bp[kc][NR], over the panel's first w
 * columns (1 <= w <= NR: the live ones; the rest of acc's row is padding
 * no caller reads, left as it was). Each element's products are summed in
 * p order into a register that starts at zero, then added to acc once:
 * whichever of the kernels below runs, and whatever w, a column's bits are
 * the same. The generic kernel: GCC's vectors, built for AVX-512 (32
 * registers hold the 12 accumulators, with FMA) and plain x86-64. */
__attribute__((target_clones("avx512f", "default"))) static void
gemm_kernel_generic(int kc, const float *restrict Ap, const float *restrict Bp, float *restrict acc,
                    int ldacc, int w)
{
    const int halves = w > 16 ? 2 : 1;
    v16f c[MR][2];
    memset(c, 0, sizeof c);
    for (int p = 0; p < kc; p++) {
        v16f b0, b1;
        memcpy(&b0, Bp + (size_t)p * NR, sizeof b0);
        const float *a = Ap + (size_t)p * MR;
        if (halves == 2) {
            memcpy(&b1, Bp + (size_t)p * NR + 16, sizeof b1);
            for (int r = 0; r < MR; r++) {
                c[r][0] += a[r] * b0;
                c[r][1] += a[r] * b1;
            }
        } else {
            for (int r = 0; r < MR; r++) c[r][0] += a[r] * b0;
        }
    }
    for (int r = 0; r < MR; r++)
        for (int hv = 0; hv < halves; hv++) {
            v16f t;
            float *row = acc + (size_t)r * ldacc + 16 * hv;
            memcpy(&t, row, sizeof t);
            t += c[r][hv];
            memcpy(row, &t, sizeof t);
        }
}

#ifdef ZO_GEMM_AVX2
/* The kernel for AVX2 machines without AVX-512 (16 vector registers: the
 * generic kernel's 24 accumulators spilled to the stack, most of its
 * time): 16 columns at a time (12 accumulators, two of B, one broadcast),
 * 8 where no more are live; FMA, as the AVX-512 build of the generic
 * kernel contracts its products, so both machines get the same bits. */
__attribute__((target("avx2,fma"))) static void
gemm_kernel_avx2(int kc, const float *restrict Ap, const float *restrict Bp, float *restrict acc, int ldacc,
                 int w)
{
    for (int h = 0; h < w; h += 16) {
        const float *b = Bp + h;
        __m256 c0[MR], c1[MR];
        for (int r = 0; r < MR; r++) c0[r] = c1[r] = _mm256_setzero_ps();
        if (w - h > 8) {
            for (int p = 0; p < kc; p++) {
                const __m256 b0 = _mm256_loadu_ps(b + (size_t)p * NR), b1 = _mm256_loadu_ps(b + (size_t)p * NR + 8);
                const float *a = Ap + (size_t)p * MR;
                for (int r = 0; r < MR; r++) {
                    const __m256 x = _mm256_broadcast_ss(a + r);
                    c0[r] = _mm256_fmadd_ps(x, b0, c0[r]);
                    c1[r] = _mm256_fmadd_ps(x, b1, c1[r]);
                }
            }
        } else {
            for (int p = 0; p < kc; p++) {
                const __m256 b0 = _mm256_loadu_ps(b + (size_t)p * NR);
                const float *a = Ap + (size_t)p * MR;
                for (int r = 0; r < MR; r++) c0[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + r), b0, c0[r]);
            }
        }
        for (int r = 0; r < MR; r++) {
            float *row = acc + (size_t)r * ldacc + h;
            _mm256_storeu_ps(row, _mm256_add_ps(_mm256_loadu_ps(row), c0[r]));
            if (w - h > 8) _mm256_storeu_ps(row + 8, _mm256_add_ps(_mm256_loadu_ps(row + 8), c1[r]));
        }
    }
}
#endif

/* Which register kernel runs: -1 not yet chosen, else a cpu_gemm_kernel. */
static atomic_int gemm_kernel_choice = -1;

/* The AVX2 kernel is built and this machine can run it. */
static int have_avx2_fma(void)
{
#ifdef ZO_GEMM_AVX2
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* The machine's best: the AVX2 kernel where AVX2 and FMA are and AVX-512
 * is not; ZO_CPU_KERNEL=generic (tests, benchmarks) keeps the generic one. */
static int gemm_kernel_pick(void)
{
    int k = CPU_KERNEL_GENERIC;
#ifdef ZO_GEMM_AVX2
    if (have_avx2_fma() && !__builtin_cpu_supports("avx512f")) k = CPU_KERNEL_AVX2;
#endif
    const char *e = getenv("ZO_CPU_KERNEL");
    if (e && !strcmp(e, "generic")) k = CPU_KERNEL_GENERIC;
    int unset = -1;
    atomic_compare_exchange_strong(&gemm_kernel_choice, &unset, k);
    return atomic_load(&gemm_kernel_choice);
}

/* The register kernel that runs, on a panel whose columns from its first
 * on number `left` (the panel's w: at most NR of them). */
static inline void gemm_kernel(int kc, const float *restrict Ap, const float *restrict Bp, float *restrict acc,
                               int ldacc, int left)
{
    const int w = left < NR ? left : NR;
    int k = atomic_load_explicit(&gemm_kernel_choice, memory_order_relaxed);
    if (k < 0) k = gemm_kernel_pick();
#ifdef ZO_GEMM_AVX2
    if (k == CPU_KERNEL_AVX2) {
        gemm_kernel_avx2(kc, Ap, Bp, acc, ldacc, w);
        return;
    }
#endif
    gemm_kernel_generic(kc, Ap, Bp, acc, ldacc, w);
}

cpu_gemm_kernel cpu_gemm_set_kernel(cpu_gemm_kernel k)
{
    int want = k == CPU_KERNEL_AUTO ? -1 : (int)k;
    if (want == CPU_KERNEL_AVX2 && !have_avx2_fma()) want = CPU_KERNEL_GENERIC;
    atomic_store(&gemm_kernel_choice, want);
    return want < 0 ? (cpu_gemm_kernel)gemm_kernel_pick() : (cpu_gemm_kernel)want;
}

/* Packed panels (R = MR rows for A, NR columns for B) and the depth they
 * were packed with: panel s starts at s * R * depth. The pack functions
 * return it, so the depth that places a panel travels with the panel, apart
 * from the depth a product reads. */
typedef struct panels {
    const float *p;
    int depth;
} panels;

/* Panels of R rows of X [m][k] (row stride ldx), each stored k-major:
 * P[s][p][r] = X[s*R + r][p], zero past m. */
static inline panels pack_rows(float *restrict P, const float *X, size_t ldx, int m, int k,
                               int R)
{
    for (int s = 0; s < (m + R - 1) / R; s++) {
        float *dst = P + (size_t)s * k * R;
        for (int r = 0; r < R; r++) {
            int i = s * R + r;
            if (i < m)
                for (int p = 0; p < k; p++) dst[(size_t)p * R + r] = X[(size_t)i * ldx + p];
            else
                for (int p = 0; p < k; p++) dst[(size_t)p * R + r] = 0.0f;
        }
    }
    return (panels){P, k};
}

/* Panels of R columns of X [k][m]: P[s][p][r] = X[p][s*R + r], zero past m. */
static inline panels pack_cols(float *restrict P, const float *X, size_t ldx, int m, int k,
                               int R)
{
    for (int s = 0; s < (m + R - 1) / R; s++) {
        float *dst = P + (size_t)s * k * R;
        int w = m - s * R < R ? m - s * R : R;
        for (int p = 0; p < k; p++) {
            const float *src = X + (size_t)p * ldx + (size_t)s * R;
            for (int r = 0; r < R; r++) dst[(size_t)p * R + r] = r < w ? src[r] : 0.0f;
        }
    }
    return (panels){P, k};
}

/* A panels of X [m][k]: Ap[s][p][r] = X[s*MR + r][p]. */
static panels pack_a_rows(float *restrict Ap, const float *X, size_t ldx, int m, int k)
{
    return pack_rows(Ap, X, ldx, m, k, MR);
}

/* A panels of X^T, X [k][m]: Ap[s][p][r] = X[p][s*MR + r]. */
static panels pack_a_cols(float *restrict Ap, const float *X, size_t ldx, int m, int k)
{
    return pack_cols(Ap, X, ldx, m, k, MR);
}

/* B panels of X^T, X [n][k]: Bp[s][p][c] = X[s*NR + c][p]. */
static panels pack_b_rows(float *restrict Bp, const float *X, size_t ldx, int n, int k)
{
    return pack_rows(Bp, X, ldx, n, k, NR);
}

/* B panels of X [k][n]: Bp[s][p][c] = X[p][s*NR + c]. */
static panels pack_b_cols(float *restrict Bp, const float *X, size_t ldx, int k, int n)
{
    return pack_cols(Bp, X, ldx, n, k, NR);
}

/* Ap = panels of op(A)[i0..i0+mc, p0..p0+kc]: read in place for fp32,
 * else converted into `row` first (room for max(MC, NC) x KC floats). */
static void pack_a(float *Ap, const gpu_gemm_desc *d, const void *a, int i0, int mc, int p0,
                   int kc, float *row)
{
    gpu_tensor ta = {(void *)a, d->a.dtype};
    int f32 = d->a.dtype == ZO_DTYPE_F32;
    if (!d->trans_a) { /* A [m][k]: rows i0.. are contiguous in p */
        size_t off = (size_t)i0 * d->lda + p0;
        if (f32) {
            pack_a_rows(Ap, (const float *)a + off, d->lda, mc, kc);
            return;
        }
        for (int i = 0; i < mc; i++) load_row(row + (size_t)i * kc, ta, off + (size_t)i * d->lda, kc);
        pack_a_rows(Ap, row, kc, mc, kc);
    } else { /* A stored [k][m]: rows p0.. are contiguous in i */
        size_t off = (size_t)p0 * d->lda + i0;
        if (f32) {
            pack_a_cols(Ap, (const float *)a + off, d->lda, mc, kc);
            return;
        }
        for (int p = 0; p < kc; p++) load_row(row + (size_t)p * mc, ta, off + (size_t)p * d->lda, mc);
        pack_a_cols(Ap, row, mc, mc, kc);
    }
}

/* Bp = panels of op(B)[p0..p0+kc, j0..j0+nc], like pack_a. */
static void pack_b(float *Bp, const gpu_gemm_desc *d, const void *b, int p0, int kc, int j0,
                   int nc, float *row)
{
    gpu_tensor tb = {(void *)b, d->b.dtype};
    int f32 = d->b.dtype == ZO_DTYPE_F32;
    if (!d->trans_b) { /* B stored [k][n]: rows p0.. contiguous in j */
        size_t off = (size_t)p0 * d->ldb + j0;
        if (f32) {
            pack_b_cols(Bp, (const float *)b + off, d->ldb, kc, nc);
            return;
        }
        for (int p = 0; p < kc; p++) load_row(row + (size_t)p * nc, tb, off + (size_t)p * d->ldb, nc);
        pack_b_cols(Bp, row, nc, kc, nc);
    } else { /* B stored [n][k]: rows j0.. contiguous in p */
        size_t off = (size_t)j0 * d->ldb + p0;
        if (f32) {
            pack_b_rows(Bp, (const float *)b + off, d->ldb, nc, kc);
            return;
        }
        for (int j = 0; j < nc; j++) load_row(row + (size_t)j * kc, tb, off + (size_t)j * d->ldb, kc);
        pack_b_rows(Bp, row, kc, nc, kc);
    }
}

/* The own kernel: C in MC x NC tiles shared out among the team. */
static zo_status own_gemm(cpu_scratch *ws, const gpu_gemm_desc *d, int nt)
{
    int batch = d->batch > 0 ? d->batch : 1;
    int tm = (d->m + MC - 1) / MC, tn = (d->n + NC - 1) / NC;
    long tiles = (long)batch * tm * tn;
    size_t es_a = zo_dtype_size(d->a.dtype), es_b = zo_dtype_size(d->b.dtype);
    size_t es_c = zo_dtype_size(d->c.dtype);
    int team = cpu_team(nt);
    if (team > tiles) team = (int)tiles;
    /* per thread: packed A, packed B, the C tile, a converted row */
    const size_t n_ap = (size_t)MC * KC, n_bp = (size_t)NC * KC, n_acc = (size_t)MC * NC;
    const size_t n_row = (size_t)(NC > MC ? NC : MC) * KC;
    const size_t per = al64(n_ap * 4) + al64(n_bp * 4) + al64(n_acc * 4) + al64(n_row * 4);
    char *base;
    zo_status st = reserve_team(ws, "gpu_gemm", 0, per, team, &base);
    if (st != ZO_OK) return st;
#pragma omp parallel num_threads(cpu_run_team(team, (double)(d->batch > 0 ? d->batch : 1) * d->m * d->n * d->k))
    {
        char *mine = team_slice(base, 0, per);
        float *Ap = (float *)mine;
        float *Bp = (float *)(mine + al64(n_ap * 4));
        float *acc = (float *)(mine + al64(n_ap * 4) + al64(n_bp * 4));
        float *row = (float *)(mine + al64(n_ap * 4) + al64(n_bp * 4) + al64(n_acc * 4));
        long a_packed = -1; /* with one k slice, the row tile whose A panels Ap holds */
#pragma omp for schedule(static)
        for (long tile = 0; tile < tiles; tile++) {
            int bi = (int)(tile / ((long)tm * tn));
            int rest = (int)(tile % ((long)tm * tn));
            int i0 = (rest / tn) * MC, j0 = (rest % tn) * NC;
            int mc = d->m - i0 < MC ? d->m - i0 : MC;
            int nc = d->n - j0 < NC ? d->n - j0 : NC;
            const char *a = (const char *)d->a.data + (size_t)bi * d->stride_a * es_a;
            const char *b = (const char *)d->b.data + (size_t)bi * d->stride_b * es_b;
            gpu_tensor c = {(char *)d->c.data + (size_t)bi * d->stride_c * es_c, d->c.dtype};
            int mslv = (mc + MR - 1) / MR, nslv = (nc + NR - 1) / NR;
            memset(acc, 0, (size_t)MC * NC * sizeof(float));
            for (int p0 = 0; p0 < d->k; p0 += KC) {
                int kc = d->k - p0 < KC ? d->k - p0 : KC;
                long a_tile = (long)bi * tm + rest / tn;
                if (d->k > KC || a_tile != a_packed) pack_a(Ap, d, a, i0, mc, p0, kc, row);
                a_packed = d->k <= KC ? a_tile : -1;
                pack_b(Bp, d, b, p0, kc, j0, nc, row);
                for (int js = 0; js < nslv; js++)
                    for (int is = 0; is < mslv; is++)
                        gemm_kernel(kc, Ap + (size_t)is * MR * kc, Bp + (size_t)js * NR * kc,
                                    acc + (size_t)is * MR * NC + (size_t)js * NR, NC, nc - js * NR);
            }
            /* C = alpha * acc + beta * C; beta == 0 never reads C */
            for (int i = 0; i < mc; i++) {
                float *arow = acc + (size_t)i * NC;
                size_t off = (size_t)(i0 + i) * d->ldc + j0;
                if (d->beta != 0.0f) {
                    load_row(row, c, off, nc);
                    for (int j = 0; j < nc; j++) arow[j] = d->alpha * arow[j] + d->beta * row[j];
                } else {
                    for (int j = 0; j < nc; j++) arow[j] = d->alpha * arow[j];
                }
                store_row(c, off, arow, nc);
            }
        }
    }
    return ZO_OK;
}

/* ---- GEMM through OpenBLAS ----------------------------------------------------------
 * Where the library takes the product (blas_fits), C is cut into a grid of
 * tiles set by the shape and by the machine's processor count (as many tiles
 * as a team of all its cores needs), never by the op's thread count; the
 * op's team shares out whole tiles and each tile is one single-threaded
 * cblas_sgemm over the whole depth k. A call's bits depend only on its
 * arguments, so C's bits do not depend on nt. (OpenBLAS's own threading cuts
 * k into slices of other lengths with 2 threads than with 1, so some sums
 * round at other places, and its choice of code path for mid-sized products
 * depends on the threads it may use: docs/gpu.md.) 16-bit operands are
 * converted tile by tile into fp32 scratch, which is exact, and a 16-bit C
 * tile is computed in fp32 and rounded once, as the own kernel does. */
#define BT_ROWS_MIN 64   /* rows of a tile at least: each row tile packs all of op(B) */
#define BT_COLS_MIN 128  /* columns of a tile at least */
#define BT_ALIGN 16      /* tile edges on multiples of the library's 16-wide kernel */
#define BT_CONV_FLOATS ((size_t)4 << 20) /* fp32 copies of a tile's 16-bit operands */

static pthread_once_t gemm_once = PTHREAD_ONCE_INIT;
static int gemm_procs = 1;                     /* processors: tiles per product */
static atomic_int gemm_impl = CPU_GEMM_AUTO;   /* cpu_gemm_set_impl, ZO_CPU_GEMM */
static int blas_usable;                        /* the library takes concurrent calls */
static char blas_desc[160];

static void gemm_init(void)
{
    /* the machine's processors, not the process's: mpirun binds a rank to
     * one core, and a grid of other tiles gave other last bits (OpenBLAS's
     * Haswell kernels on an AMD EPYC: a rank's losses then differed from
     * one process's) */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    gemm_procs = online > 0 ? (int)online : omp_get_num_procs();
    const char *e = getenv("ZO_CPU_GEMM");
    if (e && !strcmp(e, "own")) atomic_store(&gemm_impl, CPU_GEMM_OWN);
    if (e && !strcmp(e, "blas")) atomic_store(&gemm_impl, CPU_GEMM_BLAS);
#ifdef ZO_HAVE_OPENBLAS
    /* 0: serial build, 1: pthreads, 2: OpenMP. The OpenMP build runs a call
     * on one thread inside a team (or after omp_set_num_threads(1)); the
     * pthreads build does once told so, here; Debian's serial build takes
     * no lock around its buffer table, so two threads calling it at once
     * may pack into the same buffer: it is left unused. */
    int par = openblas_get_parallel();
    if (par == 1) openblas_set_num_threads(1);
    blas_usable = par == 1 || par == 2;
    const char *cfg = openblas_get_config(); /* "OpenBLAS 0.3.21 NO_LAPACKE ..." */
    int vlen = (int)strcspn(cfg, " ");
    vlen += cfg[vlen] ? 1 + (int)strcspn(cfg + vlen + 1, " ") : 0;
    snprintf(blas_desc, sizeof blas_desc, "%.*s (%s kernels, %s build)", vlen, cfg,
             openblas_get_corename(), par == 2 ? "OpenMP" : par == 1 ? "pthreads" : "serial");
#endif
}

void cpu_gemm_set_impl(cpu_gemm_impl impl)
{
    pthread_once(&gemm_once, gemm_init);
    atomic_store(&gemm_impl, impl);
}

const char *cpu_gemm_blas(void)
{
    pthread_once(&gemm_once, gemm_init);
    return blas_usable ? blas_desc : NULL;
}

#ifdef ZO_HAVE_OPENBLAS
static int is16(zo_dtype t) { return t != ZO_DTYPE_F32; }

/* The grid of one product: tiles of `rows` x `cols` (the last ones smaller),
 * rt down and ct across. */
typedef struct blas_tiles {
    int rows, cols, rt, ct;
} blas_tiles;

static int round_up16(int x) { return (x + BT_ALIGN - 1) / BT_ALIGN * BT_ALIGN; }

/* floats of fp32 copies one tile needs: its rows of op(A), columns of op(B)
 * and C block, for the operands stored in 16 bits */
static size_t conv_floats(const gpu_gemm_desc *d, int rows, int cols)
{
    return (is16(d->a.dtype) ? (size_t)rows * d->k : 0) +
           (is16(d->b.dtype) ? (size_t)d->k * cols : 0) +
           (is16(d->c.dtype) ? (size_t)rows * cols : 0);
}

/* Rows are split first: op(B) is packed again for every row tile and op(A)
 * for every column tile, and row tiles lost less to that when measured. */
static blas_tiles blas_tiles_of(const gpu_gemm_desc *d, int batch)
{
    int want = (gemm_procs + batch - 1) / batch; /* tiles per product */
    int rt = d->m / BT_ROWS_MIN < want ? d->m / BT_ROWS_MIN : want;
    if (rt < 1) rt = 1;
    int ct = (want + rt - 1) / rt;
    if (ct > d->n / BT_COLS_MIN) ct = d->n / BT_COLS_MIN;
    if (ct < 1) ct = 1;
    blas_tiles t = {.rows = round_up16((d->m + rt - 1) / rt), .cols = round_up16((d->n + ct - 1) / ct)};
    while (conv_floats(d, t.rows, t.cols) > BT_CONV_FLOATS) {
        if (t.rows > BT_ROWS_MIN && (t.rows >= t.cols || t.cols <= BT_COLS_MIN))
            t.rows = round_up16(t.rows / 2);
        else if (t.cols > BT_COLS_MIN)
            t.cols = round_up16(t.cols / 2);
        else
            break;
    }
    if (t.rows > d->m) t.rows = d->m;
    if (t.cols > d->n) t.cols = d->n;
    t.rt = (d->m + t.rows - 1) / t.rows;
    t.ct = (d->n + t.cols - 1) / t.cols;
    return t;
}

/* The library can take the product: a usable build, leading dimensions in
 * its 32-bit integers. The dispatch rule is this alone: measured against the
 * own kernel (docs/gpu.md), the library was faster at every shape, transpose
 * and storage type tried, from 8 x 32 x 32 and GEMV-like rows to LLaMA's
 * widths, batched or not. */
static int blas_fits(const gpu_gemm_desc *d)
{
    return blas_usable && d->lda <= INT_MAX && d->ldb <= INT_MAX && d->ldc <= INT_MAX;
}

static gpu_tensor batch_view(gpu_tensor t, int bi, int64_t stride)
{
    return (gpu_tensor){(char *)t.data + (size_t)bi * stride * zo_dtype_size(t.dtype), t.dtype};
}

/* Tile `t` of the grid (product, row tile, column tile), one library call;
 * `buf` holds the fp32 copies (conv_floats of the grid's tile). */
static void blas_tile(const gpu_gemm_desc *d, const blas_tiles *bt, long t, float *buf)
{
    const int per = bt->rt * bt->ct, k = d->k;
    const int bi = (int)(t / per), r = (int)(t % per);
    const int i0 = r / bt->ct * bt->rows, j0 = r % bt->ct * bt->cols;
    const int mc = d->m - i0 < bt->rows ? d->m - i0 : bt->rows;
    const int nc = d->n - j0 < bt->cols ? d->n - j0 : bt->cols;
    gpu_tensor a = batch_view(d->a, bi, d->stride_a), b = batch_view(d->b, bi, d->stride_b);
    gpu_tensor c = batch_view(d->c, bi, d->stride_c);
    float *abuf = buf, *bbuf = abuf + (is16(a.dtype) ? (size_t)bt->rows * k : 0);
    float *cbuf = bbuf + (is16(b.dtype) ? (size_t)k * bt->cols : 0);

    /* op(A)[i0..i0+mc, 0..k) */
    const float *pa = (const float *)a.data + (d->trans_a ? (size_t)i0 : (size_t)i0 * d->lda);
    int lda = (int)d->lda;
    if (is16(a.dtype) && !d->trans_a) { /* A [m][k]: rows i0.. */
        for (int i = 0; i < mc; i++) load_row(abuf + (size_t)i * k, a, (size_t)(i0 + i) * d->lda, k);
        pa = abuf, lda = k;
    } else if (is16(a.dtype)) { /* A stored [k][m]: columns i0.. */
        for (int p = 0; p < k; p++) load_row(abuf + (size_t)p * mc, a, (size_t)p * d->lda + i0, mc);
        pa = abuf, lda = mc;
    }
    /* op(B)[0..k, j0..j0+nc) */
    const float *pb = (const float *)b.data + (d->trans_b ? (size_t)j0 * d->ldb : (size_t)j0);
    int ldb = (int)d->ldb;
    if (is16(b.dtype) && !d->trans_b) { /* B [k][n]: columns j0.. */
        for (int p = 0; p < k; p++) load_row(bbuf + (size_t)p * nc, b, (size_t)p * d->ldb + j0, nc);
        pb = bbuf, ldb = nc;
    } else if (is16(b.dtype)) { /* B stored [n][k]: rows j0.. */
        for (int j = 0; j < nc; j++) load_row(bbuf + (size_t)j * k, b, (size_t)(j0 + j) * d->ldb, k);
        pb = bbuf, ldb = k;
    }
    /* C[i0.., j0..]; beta == 0: the library never reads C (nor the copy) */
    float *pc = (float *)c.data + (size_t)i0 * d->ldc + j0;
    int ldc = (int)d->ldc;
    if (is16(c.dtype)) {
        if (d->beta != 0.0f)
            for (int i = 0; i < mc; i++)
                load_row(cbuf + (size_t)i * nc, c, (size_t)(i0 + i) * d->ldc + j0, nc);
        pc = cbuf, ldc = nc;
    }
    cblas_sgemm(CblasRowMajor, d->trans_a ? CblasTrans : CblasNoTrans,
                d->trans_b ? CblasTrans : CblasNoTrans, mc, nc, k, d->alpha, pa, lda, pb, ldb,
                d->beta, pc, ldc);
    if (is16(c.dtype))
        for (int i = 0; i < mc; i++) store_row(c, (size_t)(i0 + i) * d->ldc + j0, cbuf + (size_t)i * nc, nc);
}

static zo_status blas_gemm(cpu_scratch *ws, const gpu_gemm_desc *d, int nt)
{
    const int batch = d->batch > 0 ? d->batch : 1;
    const blas_tiles bt = blas_tiles_of(d, batch);
    const long tiles = (long)batch * bt.rt * bt.ct;
    int team = cpu_team(nt);
    if (team > tiles) team = (int)tiles;
    /* reserved even when nothing is converted: a GEMM takes (and may fail
     * to get) its scratch the same way whichever kernel runs it */
    const size_t per = conv_floats(d, bt.rows, bt.cols) * sizeof(float);
    char *base;
    zo_status st = reserve_team(ws, "gpu_gemm", 0, per, team, &base);
    if (st != ZO_OK) return st;
#pragma omp parallel num_threads(cpu_run_team(team, (double)batch * d->m * d->n * d->k))
    {
        /* the OpenMP build runs a call on one thread inside a team of 2 or
         * more; in a team of one it reads this thread's setting */
        omp_set_num_threads(1);
        float *mine = (float *)team_slice(base, 0, per);
#pragma omp for schedule(static)
        for (long t = 0; t < tiles; t++) blas_tile(d, &bt, t, mine);
    }
    return ZO_OK;
}
#endif

static zo_status gemm_dispatch(cpu_scratch *ws, const gpu_gemm_desc *d, int nt)
{
#ifdef ZO_HAVE_OPENBLAS
    if (atomic_load_explicit(&gemm_impl, memory_order_relaxed) != CPU_GEMM_OWN && blas_fits(d))
        return blas_gemm(ws, d, nt);
#endif
    return own_gemm(ws, d, nt);
}

/* ---- TF32 GEMMs (gpu_cpu_options.tf32) -------------------------------------------
 * A model of cuBLASLt's CUBLAS_COMPUTE_32F_FAST_TF32, which the CUDA backend
 * runs every fp32 product on: A and B rounded to TF32, then the same fp32
 * product as ever. A product of two TF32 values (11-bit significands) is
 * exact in fp32, as in the tensor cores, so what is left to differ from
 * the GPU is the order of the fp32 sums (and the rounding of ties, should
 * cuBLASLt's kernels convert otherwise: docs/gpu-cuda.md). */

float cpu_tf32_round(float x)
{
    uint32_t u = zo_f32_bits(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return x; /* inf, nan */
    /* half of the 13 dropped bits' weight, carried into the exponent when
     * the mantissa overflows; ties (exactly 0x1000 dropped) go up in
     * magnitude, away from zero */
    return zo_bits_f32((u + 0x1000u) & 0xffffe000u);
}

/* dst[0..n) = src[0..n) rounded to TF32 */
VEC_CLONES static void round_tf32(float *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = cpu_tf32_round(src[i]);
}

static zo_status tf32_gemm(cpu_scratch *ws, const gpu_gemm_desc *d, int nt)
{
    const size_t na = cuda_gemm_operand_extent(d, 'a'), nb = cuda_gemm_operand_extent(d, 'b');
    float *ra = malloc(na * sizeof(float)), *rb = malloc(nb * sizeof(float));
    zo_status st = ZO_OK;
    if (!ra || !rb) {
        st = zo_error(ZO_ERR_NOMEM, "gpu_gemm (cpu, tf32): out of host memory for the rounded "
                                    "operands (%zu + %zu floats)", na, nb);
        goto out_free;
    }
    round_tf32(ra, d->a.data, na);
    round_tf32(rb, d->b.data, nb);
    gpu_gemm_desc e = *d;
    e.a.data = ra;
    e.b.data = rb;
    st = gemm_dispatch(ws, &e, nt);
out_free:
    free(rb);
    free(ra);
    return st;
}

zo_status cpu_gemm(cpu_scratch *ws, const gpu_gemm_desc *d, int nt)
{
    pthread_once(&gemm_once, gemm_init);
    /* the products cuBLASLt runs on TF32 (gpu/cuda/gemm.cu: lt_types_ok) */
    if (ws->tf32 && d->a.dtype == ZO_DTYPE_F32 && d->b.dtype == ZO_DTYPE_F32 &&
        d->c.dtype == ZO_DTYPE_F32 && d->m > 0 && d->n > 0 && d->k > 0)
        return tf32_gemm(ws, d, nt);
    return gemm_dispatch(ws, d, nt);
}

void cpu_gemm_naive(const gpu_gemm_desc *d)
{
    int batch = d->batch > 0 ? d->batch : 1;
    for (int bi = 0; bi < batch; bi++) {
        gpu_tensor a = {(char *)d->a.data + (size_t)bi * d->stride_a * zo_dtype_size(d->a.dtype),
                        d->a.dtype};
        gpu_tensor b = {(char *)d->b.data + (size_t)bi * d->stride_b * zo_dtype_size(d->b.dtype),
                        d->b.dtype};
        gpu_tensor c = {(char *)d->c.data + (size_t)bi * d->stride_c * zo_dtype_size(d->c.dtype),
                        d->c.dtype};
        for (int i = 0; i < d->m; i++)
            for (int j = 0; j < d->n; j++) {
                float acc = 0.0f;
                for (int p = 0; p < d->k; p++) {
                    float x = d->trans_a ? ld(a, (size_t)p * d->lda + i) : ld(a, (size_t)i * d->lda + p);
                    float y = d->trans_b ? ld(b, (size_t)j * d->ldb + p) : ld(b, (size_t)p * d->ldb + j);
                    acc += x * y;
                }
                size_t o = (size_t)i * d->ldc + j;
                st(c, o, d->alpha * acc + (d->beta != 0.0f ? d->beta * ld(c, o) : 0.0f));
            }
    }
}

/* ---- bias ---------------------------------------------------------------------------- */

zo_status cpu_bias_forward(cpu_scratch *ws, gpu_tensor y, gpu_tensor bias, int n, int c,
                           int64_t ldy, int nt)
{
    const int team = cpu_team(nt);
    const size_t cb = (size_t)c * sizeof(float);
    char *base;
    zo_status st = reserve_team(ws, "gpu_bias_forward", cb, cb, team, &base);
    if (st != ZO_OK) return st;
    float *bv = (float *)base;
    load_row(bv, bias, 0, c);
#pragma omp parallel num_threads(cpu_run_team(team, (double)n * c))
    {
        float *row = (float *)team_slice(base, cb, cb);
#pragma omp for schedule(static)
        for (int r = 0; r < n; r++) {
            size_t off = (size_t)r * ldy;
            float *py = out_f32(y, off, row);
            add_f32(py, in_f32(y, off, c, row), bv, c);
            out_done(y, off, py, c);
        }
    }
    return ZO_OK;
}

/* Column sums over rows in row order; each thread owns a block of columns. */
#define COLS 64

void cpu_bias_backward(gpu_tensor dbias, gpu_tensor dy, int n, int c, int64_t lddy, int nt)
{
    int blocks = (c + COLS - 1) / COLS;
#pragma omp parallel for schedule(static) num_threads(cpu_run_team(cpu_team(nt), (double)n * c))
    for (int cb = 0; cb < blocks; cb++) {
        int j0 = cb * COLS, w = c - j0 < COLS ? c - j0 : COLS;
        float acc[COLS], row[COLS];
        for (int j = 0; j < w; j++) acc[j] = 0.0f;
        for (int r = 0; r < n; r++) {
            load_row(row, dy, (size_t)r * lddy + j0, w);
            for (int j = 0; j < w; j++) acc[j] += row[j];
        }
        for (int j = 0; j < w; j++) st(dbias, j0 + j, ld(dbias, j0 + j) + acc[j]);
    }
}

/* ---- LayerNorm and RMSNorm ------------------------------------------------------------- */

zo_status cpu_layernorm_forward(cpu_scratch *ws, gpu_tensor y, float *mean, float *rstd,
                                gpu_tensor x, gpu_tensor w, gpu_tensor b, int n, int c, float eps,
                                int nt)
{
    const int team = cpu_team(nt);
    const size_t cb = (size_t)c * sizeof(float);
    char *base;
    zo_status st = reserve_team(ws, "gpu_layernorm_forward", 2 * al64(cb), cb, team, &base);
    if (st != ZO_OK) return st;
    float *wv = (float *)base, *bv = (float *)(base + al64(cb));
    load_row(wv, w, 0, c);
    if (b.data)
        load_row(bv, b, 0, c);
    else
        memset(bv, 0, (size_t)c * sizeof(float));
#pragma omp parallel num_threads(cpu_run_team(team, (double)n * c))
    {
        float *row = (float *)team_slice(base, 2 * al64(cb), cb);
#pragma omp for schedule(static)
        for (int r = 0; r < n; r++) {
            load_row(row, x, (size_t)r * c, c);
            double s = 0.0, v = 0.0;
            for (int j = 0; j < c; j++) s += row[j];
            float m = (float)(s / c);
            for (int j = 0; j < c; j++) v += (double)(row[j] - m) * (row[j] - m);
            float rs = (float)(1.0 / sqrt(v / c + (double)eps));
            for (int j = 0; j < c; j++) row[j] = (row[j] - m) * rs * wv[j] + bv[j];
            store_row(y, (size_t)r * c, row, c);
            mean[r] = m;
            rstd[r] = rs;
        }
    }
    return ZO_OK;
}

/* The norms' parameter gradients: dw[j] += sum dy * xhat and db[j] += sum
 * dy over every (row r, head h), dy at r*ldy + h*c + j, x at (r*heads +
 * h)*c + j, the statistics of column j at (r*heads + h)*(c/sd) + j/sd (a
 * statistic every sd columns: sd c for the plain norms, heads 1, ldy c;
 * mean NULL: RMSNorm; dw.data or db.data NULL: not computed). The rows go in
 * NORM_CHUNKS fixed chunks, each chunk's sums (per column block) in its own
 * partial, and the partials are added in chunk order: the same sums whatever
 * the thread count, and the work spread over chunks x column blocks. */
#define NORM_CHUNKS 32

/* Bytes of norm_param_grads' partials: [NORM_CHUNKS, c] fp32 for each of dw
 * and db given. */
static size_t norm_part_bytes(gpu_tensor dw, gpu_tensor db, int c)
{
    return ((dw.data != NULL) + (db.data != NULL)) * al64((size_t)NORM_CHUNKS * c * sizeof(float));
}

/* part: norm_part_bytes(dw, db, c) of scratch */
static void norm_param_grads(char *part, gpu_tensor dw, gpu_tensor db, gpu_tensor dy, int64_t ldy, gpu_tensor x,
                             const float *mean, const float *rstd, int n, int heads, int c, int sd, int nt)
{
    const int per = c / sd;
    if (!dw.data && !db.data) return;
    const int blocks = (c + COLS - 1) / COLS, chunk = (n + NORM_CHUNKS - 1) / NORM_CHUNKS;
    float *pw = (float *)part, *pb = (float *)(part + (dw.data ? al64((size_t)NORM_CHUNKS * c * sizeof(float)) : 0));
#pragma omp parallel for schedule(static) num_threads(cpu_run_team(cpu_team(nt), (double)n * c))
    for (int task = 0; task < blocks * NORM_CHUNKS; task++) {
        int cb = task % blocks, k = task / blocks, j0 = cb * COLS, wd = c - j0 < COLS ? c - j0 : COLS;
        int r1 = (k + 1) * chunk < n ? (k + 1) * chunk : n;
        float aw[COLS], ab[COLS], g[COLS], xr[COLS];
        for (int j = 0; j < wd; j++) aw[j] = ab[j] = 0.0f;
        for (int r = k * chunk; r < r1; r++)
            for (int h = 0; h < heads; h++) {
                size_t ri = (size_t)r * heads + h, si = ri * per;
                load_row(g, dy, (size_t)r * (size_t)ldy + (size_t)h * c + j0, wd);
                if (dw.data) {
                    load_row(xr, x, ri * c + j0, wd);
                    for (int j = 0; j < wd; j++) {
                        size_t k = si + (size_t)(j0 + j) / sd;
                        aw[j] += g[j] * (xr[j] - (mean ? mean[k] : 0.0f)) * rstd[k];
                    }
                }
                for (int j = 0; j < wd; j++) ab[j] += g[j];
            }
        if (dw.data) memcpy(pw + (size_t)k * c + j0, aw, (size_t)wd * sizeof(float));
        if (db.data) memcpy(pb + (size_t)k * c + j0, ab, (size_t)wd * sizeof(float));
    }
#pragma omp parallel for schedule(static) num_threads(cpu_run_team(cpu_team(nt), (double)n * c))
    for (int j = 0; j < c; j++) {
        float sw = 0.0f, sb = 0.0f;
        for (int k = 0; k < NORM_CHUNKS; k++) {
            if (dw.data) sw += pw[(size_t)k * c + j];
            if (db.data) sb += pb[(size_t)k * c + j];
        }
        if (dw.data) st(dw, j, ld(dw, j) + sw);
        if (db.data) st(db, j, ld(db, j) + sb);
    }
}

/* dx[row] += the row's LayerNorm input gradient (o holds dx's row). */
static inline void layernorm_dx_row(float *restrict o, const float *g, const float *xr,
                                    const float *wv, float m, float rs, int c)
{
    double s1 = 0.0, s2 = 0.0; /* mean(dxhat), mean(dxhat * xhat) */
    for (int j = 0; j < c; j++) {
        float xh = (xr[j] - m) * rs, dxh = g[j] * wv[j];
        s1 += dxh;
        s2 += (double)dxh * xh;
    }
    float m1 = (float)(s1 / c), m2 = (float)(s2 / c);
    for (int j = 0; j < c; j++) {
        float xh = (xr[j] - m) * rs, dxh = g[j] * wv[j];
        o[j] += rs * (dxh - m1 - xh * m2);
    }
}

/* The same for RMSNorm (no mean). */
static inline void rmsnorm_dx_row(float *restrict o, const float *g, const float *xr,
                                  const float *wv, float rs, int c)
{
    double s2 = 0.0; /* mean(dxhat * xhat) */
    for (int j = 0; j < c; j++) s2 += (double)(g[j] * wv[j]) * (xr[j] * rs);
    float m2 = (float)(s2 / c);
    for (int j = 0; j < c; j++) o[j] += rs * (g[j] * wv[j] - xr[j] * rs * m2);
}

/* Backward of LayerNorm (mean given) or RMSNorm (mean NULL): dx += per
 * row, then the parameter gradients. */
static zo_status norm_backward(cpu_scratch *ws, const char *op, gpu_tensor dx, gpu_tensor dw,
                               gpu_tensor db, gpu_tensor dy, gpu_tensor x, gpu_tensor w,
                               const float *mean, const float *rstd, int n, int c, int nt)
{
    const int team = cpu_team(nt);
    const size_t cb = al64((size_t)c * sizeof(float));
    char *base;
    const size_t part = norm_part_bytes(dw, db, c);
    zo_status st = reserve_team(ws, op, cb + part, 3 * cb, team, &base);
    if (st != ZO_OK) return st;
    float *wv = (float *)base;
    load_row(wv, w, 0, c);
#pragma omp parallel num_threads(cpu_run_team(team, (double)n * c))
    {
        char *mine = team_slice(base, cb + part, 3 * cb);
        float *g = (float *)mine, *xr = (float *)(mine + cb), *o = (float *)(mine + 2 * cb);
#pragma omp for schedule(static)
        for (int r = 0; r < n; r++) {
            load_row(g, dy, (size_t)r * c, c);
            load_row(xr, x, (size_t)r * c, c);
            load_row(o, dx, (size_t)r * c, c);
            if (mean)
                layernorm_dx_row(o, g, xr, wv, mean[r], rstd[r], c);
            else
                rmsnorm_dx_row(o, g, xr, wv, rstd[r], c);
            store_row(dx, (size_t)r * c, o, c);
        }
    }
    norm_param_grads(base + cb, dw, db, dy, c, x, mean, rstd, n, 1, c, c, nt);
    return ZO_OK;
}

zo_status cpu_layernorm_backward(cpu_scratch *ws, gpu_tensor dx, gpu_tensor dw, gpu_tensor db,
                                 gpu_tensor dy, gpu_tensor x, gpu_tensor w, const float *mean,
                                 const float *rstd, int n, int c, int nt)
{
    return norm_backward(ws, "gpu_layernorm_backward", dx, dw, db, dy, x, w, mean, rstd, n, c,
                         nt);
}

/* row = row * rstd * w in place; returns rstd = 1/sqrt(mean(row^2) + eps) */
static float rmsnorm_row(float *row, const float *wv, int c, float eps)
{
    double ss = 0.0;
    for (int j = 0; j < c; j++) ss += (double)row[j] * row[j];
    float rs = (float)(1.0 / sqrt(ss / c + (double)eps));
    for (int j = 0; j < c; j++) row[j] = row[j] * rs * wv[j];
    return rs;
}

zo_status cpu_rmsnorm_forward(cpu_scratch *ws, gpu_tensor y, float *rstd, gpu_tensor x,
                              gpu_tensor w, int n, int c, float eps, int nt)
{
    const int team = cpu_team(nt);
    const size_t cb = (size_t)c * sizeof(float);
    char *base;
    zo_status st = reserve_team(ws, "gpu_rmsnorm_forward", cb, cb, team, &base);
    if (st != ZO_OK) return st;
    float *wv = (float *)base;
    load_row(wv, w, 0, c);
#pragma omp parallel num_threads(cpu_run_team(team, (double)n * c))
    {
        float *row = (float *)team_slice(base, cb, cb);
#pragma omp for schedule(static)
        for (int r = 0; r < n; r++) {
            load_row(row, x, (size_t)r * c, c);
            rstd[r] = rmsnorm_row(row, wv, c, eps);
            store_row(y, (size_t)r * c, row, c);
        }
    }
    return ZO_OK;
}

zo_status cpu_rmsnorm_backward(cpu_scratch *ws, gpu_tensor dx, gpu_tensor dw, gpu_tensor dy,
                               gpu_tensor x, gpu_tensor w, const float *rstd, int n, int c,
                               int nt)
{
    gpu_tensor none = {NULL, ZO_DTYPE_F32};
    return norm_backward(ws, "gpu_rmsnorm_backward", dx, dw, none, dy, x, w, NULL, rstd, n, c,
                         nt);
}

/* Chan et al.'s merge of two partial (count, mean, M2) of disjoint
 * columns, M2 the sum of squared deviations from their mean: b into a */
static void moments_merge(double *na, double *ma, double *qa, double nb, double mb, double qb)
{
    if (nb == 0.0) return;
    double n = *na + nb, dl = mb - *ma;
    *ma += dl * (nb / n);
    *qa += qb + dl * dl * (*na * nb / n);
    *na = n;
}

#define MOMENT_LANES 8 /* running partials of row_moments */

/* The mean and M2 of row[0..c) in one walk: MOMENT_LANES partials, lane l
 * taking columns l, l + MOMENT_LANES, ... by Welford's update (the lanes
 * side by side, so that they vectorize), merged pairwise in a fixed order */
static void row_moments(const float *row, int c, double *mean, double *m2)
{
    double n[MOMENT_LANES], mu[MOMENT_LANES] = {0}, q[MOMENT_LANES] = {0};
    const int full = c / MOMENT_LANES, tail = c % MOMENT_LANES;
    for (int k = 0; k < full; k++) {
        const float *v = row + (size_t)k * MOMENT_LANES;
        const double inv = 1.0 / (k + 1);
        for (int l = 0; l < MOMENT_LANES; l++) {
            double dl = v[l] - mu[l];
            mu[l] += dl * inv;
            q[l] += dl * (v[l] - mu[l]);
        }
    }
    for (int l = 0; l < MOMENT_LANES; l++) n[l] = full;
    for (int l = 0; l < tail; l++) {
        double v = row[(size_t)full * MOMENT_LANES + l], dl = v - mu[l];
        n[l] += 1.0;
        mu[l] += dl / n[l];
        q[l] += dl * (v - mu[l]);
    }
    for (int w = 1; w < MOMENT_LANES; w *= 2)
        for (int l = 0; l + w < MOMENT_LANES; l += 2 * w) moments_merge(&n[l], &mu[l], &q[l], n[l + w], mu[l + w], q[l + w]);
    *mean = mu[0];
    *m2 = q[0];
}

/* The norm of each head (Qwen3's RMSNorms, Cohere's LayerNorms when
 * centered), in place on rows of stride ldx: row r's head j starts at
 * r*ldx + j*d and takes the weight at j*w_stride; saved and rstd get the
 * input (less its mean when centered) and 1/rms of each (row, head) when
 * given. Centered, the mean and the squares come from one walk of the
 * head (row_moments), then one writes the output. */
zo_status cpu_head_norm_forward(cpu_scratch *ws, gpu_tensor x, int64_t ldx, gpu_tensor saved, float *rstd,
                                gpu_tensor w, int64_t w_stride, int n, int heads, int d, float eps, int centered,
                                int nt)
{
    const int team = cpu_team(nt), wrows = w_stride ? heads : 1;
    const size_t cb = (size_t)d * sizeof(float);
    char *base;
    zo_status st = reserve_team(ws, "gpu_head_norm_forward", cb * wrows, 2 * cb, team, &base);
    if (st != ZO_OK) return st;
    float *wv = (float *)base;
    load_row(wv, w, 0, d * wrows);
#pragma omp parallel num_threads(cpu_run_team(team, (double)n * heads * d))
    {
        float *row = (float *)team_slice(base, cb * wrows, 2 * cb), *xc = row + d;
#pragma omp for schedule(static)
        for (int r = 0; r < n; r++)
            for (int j = 0; j < heads; j++) {
                size_t off = (size_t)r * (size_t)ldx + (size_t)j * d, ri = (size_t)r * heads + j;
                const float *wj = wv + (size_t)j * w_stride;
                float rs;
                load_row(row, x, off, d);
                if (centered) {
                    double mean, m2;
                    row_moments(row, d, &mean, &m2);
                    const float m = (float)mean;
                    rs = (float)(1.0 / sqrt(m2 / d + (double)eps));
                    for (int e = 0; e < d; e++) {
                        xc[e] = row[e] - m;
                        row[e] = xc[e] * rs * wj[e];
                    }
                    if (saved.data) store_row(saved, ri * d, xc, d);
                } else {
                    if (saved.data) store_row(saved, ri * d, row, d);
                    rs = rmsnorm_row(row, wj, d, eps);
                }
                store_row(x, off, row, d);
                if (rstd) rstd[ri] = rs;
            }
    }
    return ZO_OK;
}

zo_status cpu_head_norm_backward(cpu_scratch *ws, gpu_tensor dx, int64_t ldx, gpu_tensor dw, gpu_tensor saved,
                                 gpu_tensor w, int64_t w_stride, const float *rstd, int n, int heads, int d,
                                 int centered, int nt)
{
    const int team = cpu_team(nt), wrows = w_stride ? heads : 1;
    const size_t cb = al64((size_t)d * sizeof(float)), wb = al64((size_t)d * wrows * sizeof(float));
    const gpu_tensor none = {NULL, ZO_DTYPE_F32};
    /* one weight: its gradient summed over the heads; one a head: the heads'
     * columns side by side, a statistic every d */
    const int gh = w_stride ? 1 : heads, gc = w_stride ? heads * d : d;
    const size_t part = norm_part_bytes(dw, none, gc);
    char *base;
    zo_status s = reserve_team(ws, "gpu_head_norm_backward", wb + part, 3 * cb, team, &base);
    if (s != ZO_OK) return s;
    /* dw first, while dx still holds the output's gradient; saved is the
     * input less its mean, so the sums are RMSNorm's */
    norm_param_grads(base + wb, dw, none, dx, ldx, saved, NULL, rstd, n, gh, gc, d, nt);
    float *wv = (float *)base;
    load_row(wv, w, 0, d * wrows);
#pragma omp parallel num_threads(cpu_run_team(team, (double)n * heads * d))
    {
        char *mine = team_slice(base, wb + part, 3 * cb);
        float *g = (float *)mine, *xr = (float *)(mine + cb), *o = (float *)(mine + 2 * cb);
#pragma omp for schedule(static)
        for (int r = 0; r < n; r++)
            for (int j = 0; j < heads; j++) {
                size_t off = (size_t)r * (size_t)ldx + (size_t)j * d, ri = (size_t)r * heads + j;
                const float *wj = wv + (size_t)j * w_stride;
                load_row(g, dx, off, d);
                load_row(xr, saved, ri * d, d);
                memset(o, 0, (size_t)d * sizeof(float)); /* dx is written, not added to */
                if (centered)
                    layernorm_dx_row(o, g, xr, wj, 0.0f, rstd[ri], d);
                else
                    rmsnorm_dx_row(o, g, xr, wj, rstd[ri], d);
                store_row(dx, off, o, d);
            }
    }
    return ZO_OK;
}

/* ---- attention ---------------------------------------------------------------------------
 * Per (batch, head), queries go in blocks of AQ rows. A block's scores
 * against keys 0..i_max (AQ x t floats, never t x t) are a product of packed
 * panels run by the GEMM register kernel, as are P V in the forward and
 * dP = dO V^T, dQ = dS K, dV += P^T dO, dK += dS^T Q in the backward. Only
 * lse[i] survives the forward; the backward recomputes P from it. Causal
 * structure: panels wholly above the diagonal are skipped, entries above it
 * are zero. Each row's arithmetic is fixed by the block layout, not by the
 * thread count. */
#define AQ 48                          /* query rows per block, a multiple of MR */
#define RUP(x, r) (((x) + (r) - 1) / (r) * (r)) /* x rounded up to a multiple of r */

/* C[m][n] (row stride ldc, room for whole panels) += A B over the first k
 * of the panels' depth (k <= A.depth, B.depth). Causal options: with `q0` >= 0,
 * rows are queries q0.. and columns keys: `skip_upper` skips column panels
 * past a row panel's last query; `clip_depth` (depth = keys) stops each row
 * panel at its last query. */
static void panel_gemm(panels A, panels B, float *C, int ldc, int m, int n, int k, int q0,
                       int skip_upper, int clip_depth)
{
    assert(k <= A.depth && k <= B.depth);
    for (int is = 0; is < (m + MR - 1) / MR; is++) {
        int last = q0 + is * MR + MR - 1; /* last query of this row panel */
        int kc = clip_depth && last + 1 < k ? last + 1 : k;
        for (int js = 0; js < (n + NR - 1) / NR; js++) {
            if (skip_upper && js * NR > last) break;
            gemm_kernel(kc, A.p + (size_t)is * MR * A.depth, B.p + (size_t)js * NR * B.depth,
                        C + (size_t)is * MR * ldc + (size_t)js * NR, ldc, n - js * NR);
        }
    }
}

/* A score row scaled, and with cap > 0 soft-capped: s = cap tanh(s / cap). */
static void scale_scores(float *restrict row, int n, float scale, float cap)
{
    for (int j = 0; j < n; j++) row[j] *= scale;
    if (cap > 0.0f)
        for (int j = 0; j < n; j++) row[j] = cap * tanhf(row[j] / cap);
}

/* ALiBi's bias of a query whose last key is n - 1 (itself): row[j] +=
 * gpu_alibi_at(ab, n - 1, j) for lo <= j < n (nothing without ALiBi) */
static void alibi_scores(float *restrict row, int lo, int n, gpu_alibi_head ab)
{
    if (ab.slope16 > 0.0f)
        for (int j = lo; j < n; j++) row[j] += gpu_alibi_at(ab, n - 1, j);
    else if (ab.step != 0.0f)
        for (int j = lo; j < n; j++) row[j] += ab.step * (float)(j - (n - 1));
}

/* The head's ALiBi (gpu_alibi_of) */
static gpu_alibi_head alibi_head(const gpu_attn_desc *a, int h)
{
    return gpu_alibi_of(a->alibi, a->alibi_bf16, a->hq, h);
}

/* Scores row -> unnormalized probabilities: row[j] = exp(c(row[j] * scale)
 * + bias_j - mx) for lo <= j < n, c the soft cap (cap > 0) or none,
 * bias_j the head's ALiBi at key j (alibi_scores) (mx their max, returned in *mx), zero for j < lo
 * (before a sliding window) and n <= j < n_zero; returns their sum (fixed
 * lanes). */
VEC_CLONES static float softmax_row(float *restrict row, int lo, int n, int n_zero, float scale,
                                    float cap, gpu_alibi_head ab, float *mx_out)
{
    float m[LANES], acc[LANES];
    for (int l = 0; l < LANES; l++) m[l] = -INFINITY, acc[l] = 0.0f;
    int nb = n / LANES * LANES;
    scale_scores(row + lo, n - lo, scale, cap); /* the keys the row sees */
    alibi_scores(row, lo, n, ab);
    for (int j = 0; j < lo; j++) row[j] = -INFINITY;
    for (int j = 0; j < nb; j += LANES)
        for (int l = 0; l < LANES; l++) m[l] = row[j + l] > m[l] ? row[j + l] : m[l];
    float mx = -INFINITY;
    for (int l = 0; l < LANES; l++) mx = m[l] > mx ? m[l] : mx;
    for (int j = nb; j < n; j++) mx = row[j] > mx ? row[j] : mx;
    for (int j = 0; j < n; j++) row[j] = j < lo ? 0.0f : fexp(row[j] - mx);
    for (int j = 0; j < nb; j += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += row[j + l];
    float s = 0.0f;
    for (int l = 0; l < LANES; l++) s += acc[l];
    for (int j = nb; j < n; j++) s += row[j];
    for (int j = n; j < n_zero; j++) row[j] = 0.0f;
    *mx_out = mx;
    return s;
}

/* P and dS rows of the backward: p = exp(s * scale + bias_j - L) for lo <=
 * j < n (bias_j: gpu_alibi_at(ab, n - 1, j)), then ds = p * (dp - D) *
 * scale; both zero for j < lo and n <= j < n_zero. With cap > 0 the score
 * is cap tanh(s scale / cap) and ds is also multiplied by its derivative
 * 1 - tanh^2. */
VEC_CLONES static void softmax_grad_row(float *restrict p, float *restrict dp, int lo, int n,
                                        int n_zero, float scale, float cap, gpu_alibi_head ab, float L,
                                        float D)
{
    if (cap > 0.0f || ab.slope16 > 0.0f) {
        for (int j = 0; j < lo; j++) p[j] = dp[j] = 0.0f;
        for (int j = lo; j < n; j++) {
            float th = cap > 0.0f ? tanhf(p[j] * scale / cap) : 0.0f;
            float pj = fexp((cap > 0.0f ? cap * th : p[j] * scale) + gpu_alibi_at(ab, n - 1, j) - L);
            p[j] = pj;
            dp[j] = pj * (dp[j] - D) * scale * (cap > 0.0f ? 1.0f - th * th : 1.0f);
        }
    } else {
        const float step = ab.step;
        for (int j = 0; j < n; j++) {
            float pj = j < lo ? 0.0f : fexp(p[j] * scale + step * (float)(j - (n - 1)) - L);
            p[j] = pj;
            dp[j] = pj * (dp[j] - D) * scale;
        }
    }
    for (int j = n; j < n_zero; j++) p[j] = dp[j] = 0.0f;
}

VEC_CLONES static float dot_lanes(const float *restrict a, const float *restrict b, int n)
{
    float acc[LANES];
    for (int l = 0; l < LANES; l++) acc[l] = 0.0f;
    int nb = n / LANES * LANES;
    for (int j = 0; j < nb; j += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += a[j + l] * b[j + l];
    float s = 0.0f;
    for (int l = 0; l < LANES; l++) s += acc[l];
    for (int j = nb; j < n; j++) s += a[j] * b[j];
    return s;
}

/* The first key query i sees: i - window + 1 under a sliding window, else 0. */
static int window_start(const gpu_attn_desc *a, int i)
{
    return a->window > 0 && i - a->window + 1 > 0 ? i - a->window + 1 : 0;
}

/* log(exp(x) + exp(y)), without overflow; x finite */
static float log_add_exp(float x, float y)
{
    float hi = x > y ? x : y, lo = x > y ? y : x;
    return hi + log1pf(expf(lo - hi));
}

/* Rows [r0, r0+rows) of one head's slice of a [.., ld] tensor as fp32 X [rows][d]. */
static void load_head_rows(float *X, gpu_tensor t, size_t base, size_t ld, size_t col, int r0,
                           int rows, int d)
{
    for (int i = 0; i < rows; i++)
        load_row(X + (size_t)i * d, t, base + (size_t)(r0 + i) * ld + col, d);
}

/* Carve consecutive 64-byte aligned float arrays out of a scratch slice. */
static float *carve(char **p, size_t floats)
{
    float *r = (float *)*p;
    *p += al64(floats * sizeof(float));
    return r;
}

zo_status cpu_attention_forward(cpu_scratch *ws, const gpu_attn_desc *a, gpu_tensor out,
                                float *lse, gpu_tensor qkv, int nt)
{
    const int t = a->t, d = a->d, hq = a->hq, hkv = a->hkv, grp = hq / hkv;
    const size_t ld = (size_t)(hq + 2 * hkv) * d, ldo = (size_t)hq * d;
    const float scale = gpu_attn_scale(a), cap = a->softcap;
    const int team = cpu_team(nt), tN = RUP(t, NR), dN = RUP(d, NR), aqM = RUP(AQ, MR);
    /* per thread: K^T and V panels, the fp32 rows staged, Q and P panels,
     * scores [aqM][tN], output tile [aqM][dN] */
    const size_t n_kp = (size_t)tN * d, n_vp = (size_t)t * dN, n_x = (size_t)t * d;
    const size_t n_qp = (size_t)aqM * d, n_s = (size_t)aqM * tN, n_pp = (size_t)aqM * t;
    const size_t n_o = (size_t)aqM * dN;
    const size_t per = al64(n_kp * 4) + al64(n_vp * 4) + al64(n_x * 4) + al64(n_qp * 4) +
                       al64(n_s * 4) + al64(n_pp * 4) + al64(n_o * 4);
    char *sb;
    zo_status st = reserve_team(ws, "gpu_attention_forward", 0, per, team, &sb);
    if (st != ZO_OK) return st;
#pragma omp parallel num_threads(cpu_run_team(team, (double)a->b * hq * t * t * d))
    {
        char *cur = team_slice(sb, 0, per);
        float *Kp = carve(&cur, n_kp), *Vp = carve(&cur, n_vp), *X = carve(&cur, n_x);
        float *Qp = carve(&cur, n_qp), *S = carve(&cur, n_s), *Pp = carve(&cur, n_pp);
        float *O = carve(&cur, n_o);
#pragma omp for schedule(static)
        for (int bh = 0; bh < a->b * hq; bh++) {
            int b = bh / hq, h = bh % hq, g = h / grp;
            size_t base = (size_t)b * t * ld;
            load_head_rows(X, qkv, base, ld, (size_t)(hq + g) * d, 0, t, d); /* K [t][d] */
            panels K = pack_b_rows(Kp, X, d, t, d);
            load_head_rows(X, qkv, base, ld, (size_t)(hq + hkv + g) * d, 0, t, d); /* V */
            panels V = pack_b_cols(Vp, X, d, t, d);
            for (int q0 = 0; q0 < t; q0 += AQ) {
                int rows = t - q0 < AQ ? t - q0 : AQ, nk = q0 + rows;
                load_head_rows(X, qkv, base, ld, (size_t)h * d, q0, rows, d); /* Q block */
                panels Q = pack_a_rows(Qp, X, d, rows, d);
                /* S [rows][nk] = Q K^T */
                for (int i = 0; i < aqM; i++) memset(S + (size_t)i * tN, 0, RUP(nk, NR) * 4);
                panel_gemm(Q, K, S, tN, rows, nk, d, q0, 1, 0);
                float l[AQ];
                for (int i = 0; i < rows; i++) {
                    float mx;
                    l[i] = softmax_row(S + (size_t)i * tN, window_start(a, q0 + i), q0 + i + 1, nk,
                                       scale, cap, alibi_head(a, h), &mx);
                    float L = mx + logf(l[i]);
                    if (a->sinks) { /* the sink's column: the row's weights scaled by exp(L - L') */
                        float Ls = log_add_exp(L, a->sinks[h]);
                        l[i] /= expf(L - Ls);
                        L = Ls;
                    }
                    lse[((size_t)b * hq + h) * t + q0 + i] = L;
                }
                /* O [rows][d] = P V, then divided by the row sums */
                panels P = pack_a_rows(Pp, S, tN, rows, nk);
                memset(O, 0, n_o * 4);
                panel_gemm(P, V, O, dN, rows, d, nk, q0, 0, 1);
                for (int i = 0; i < rows; i++) {
                    float *o = O + (size_t)i * dN, inv = 1.0f / l[i];
                    for (int k = 0; k < d; k++) o[k] *= inv;
                    store_row(out, ((size_t)b * t + q0 + i) * ldo + (size_t)h * d, o, d);
                }
            }
        }
    }
    return ZO_OK;
}

/* One task per (batch, kv head): it owns dK, dV of that head and dQ of the
 * query heads that share it, so no two threads write the same gradient. */
zo_status cpu_attention_backward(cpu_scratch *ws, const gpu_attn_desc *a, gpu_tensor dqkv,
                                 gpu_tensor dout, gpu_tensor qkv, gpu_tensor out,
                                 const float *lse, int nt)
{
    const int t = a->t, d = a->d, hq = a->hq, hkv = a->hkv, grp = hq / hkv;
    const size_t ld = (size_t)(hq + 2 * hkv) * d, ldo = (size_t)hq * d;
    const float scale = gpu_attn_scale(a), cap = a->softcap;
    const int team = cpu_team(nt), tN = RUP(t, NR), tM = RUP(t, MR), dN = RUP(d, NR);
    const int aqM = RUP(AQ, MR);
    /* per thread: K^T, V^T and K panels, dK and dV [tM][dN], the fp32 rows
     * staged (t x d), Q and dO blocks (AQ x d each), their A and B panels,
     * O row, S/P and dP/dS [aqM][tN], dS panels, P^T and dS^T panels, dQ tile */
    const size_t n_kp = (size_t)tN * d, n_kn = (size_t)t * dN, n_acc = (size_t)tM * dN;
    const size_t n_x = (size_t)t * d, n_blk = (size_t)AQ * d, n_ap = (size_t)aqM * d;
    const size_t n_bp = (size_t)AQ * dN, n_s = (size_t)aqM * tN, n_dsp = (size_t)aqM * t;
    const size_t n_tp = (size_t)tM * AQ, n_dq = (size_t)aqM * dN;
    const size_t per = 2 * al64(n_kp * 4) + al64(n_kn * 4) + 2 * al64(n_acc * 4) +
                       al64(n_x * 4) + 2 * al64(n_blk * 4) + 2 * al64(n_ap * 4) +
                       2 * al64(n_bp * 4) + al64((size_t)d * 4) + 2 * al64(n_s * 4) +
                       al64(n_dsp * 4) + 2 * al64(n_tp * 4) + al64(n_dq * 4);
    /* shared: with dsinks, each (batch, head)'s share of the sink's gradient */
    const size_t n_sink = a->dsinks ? (size_t)a->b * hq : 0;
    char *sb;
    zo_status st = reserve_team(ws, "gpu_attention_backward", n_sink * sizeof(double), per, team, &sb);
    if (st != ZO_OK) return st;
#pragma omp parallel num_threads(cpu_run_team(team, (double)a->b * hq * t * t * d))
    {
        char *cur = team_slice(sb, n_sink * sizeof(double), per);
        double *sink_part = (double *)sb;
        float *Kp = carve(&cur, n_kp), *Vtp = carve(&cur, n_kp), *Kn = carve(&cur, n_kn);
        float *dK = carve(&cur, n_acc), *dV = carve(&cur, n_acc), *X = carve(&cur, n_x);
        float *Qf = carve(&cur, n_blk), *dOf = carve(&cur, n_blk);
        float *Qp = carve(&cur, n_ap), *dOp = carve(&cur, n_ap);
        float *Qb = carve(&cur, n_bp), *dOb = carve(&cur, n_bp), *orow = carve(&cur, d);
        float *P = carve(&cur, n_s), *dS = carve(&cur, n_s), *dSp = carve(&cur, n_dsp);
        float *PTp = carve(&cur, n_tp), *dSTp = carve(&cur, n_tp), *dQ = carve(&cur, n_dq);
#pragma omp for schedule(static)
        for (int bg = 0; bg < a->b * hkv; bg++) {
            int b = bg / hkv, g = bg % hkv;
            size_t base = (size_t)b * t * ld;
            load_head_rows(X, qkv, base, ld, (size_t)(hq + g) * d, 0, t, d); /* K [t][d] */
            panels KT = pack_b_rows(Kp, X, d, t, d), K = pack_b_cols(Kn, X, d, t, d);
            load_head_rows(X, qkv, base, ld, (size_t)(hq + hkv + g) * d, 0, t, d); /* V */
            panels VT = pack_b_rows(Vtp, X, d, t, d);
            memset(dK, 0, n_acc * 4);
            memset(dV, 0, n_acc * 4);
            for (int h = g * grp; h < (g + 1) * grp; h++) {
                const float *L = lse + ((size_t)b * hq + h) * t;
                double dsink = 0.0; /* -sum_i exp(sink - L_i) D_i, rows ascending */
                for (int q0 = 0; q0 < t; q0 += AQ) {
                    int rows = t - q0 < AQ ? t - q0 : AQ, nk = q0 + rows, nkN = RUP(nk, NR);
                    load_head_rows(Qf, qkv, base, ld, (size_t)h * d, q0, rows, d);
                    load_head_rows(dOf, dout, (size_t)b * t * ldo, ldo, (size_t)h * d, q0, rows, d);
                    panels Qa = pack_a_rows(Qp, Qf, d, rows, d);
                    panels dOa = pack_a_rows(dOp, dOf, d, rows, d);
                    panels Q = pack_b_cols(Qb, Qf, d, rows, d);
                    panels dO = pack_b_cols(dOb, dOf, d, rows, d);
                    /* S = Q K^T and dP = dO V^T, [rows][nk] */
                    for (int i = 0; i < aqM; i++) {
                        memset(P + (size_t)i * tN, 0, (size_t)nkN * 4);
                        memset(dS + (size_t)i * tN, 0, (size_t)nkN * 4);
                    }
                    panel_gemm(Qa, KT, P, tN, rows, nk, d, q0, 1, 0);
                    panel_gemm(dOa, VT, dS, tN, rows, nk, d, q0, 1, 0);
                    for (int i = 0; i < rows; i++) {
                        load_row(orow, out, ((size_t)b * t + q0 + i) * ldo + (size_t)h * d, d);
                        float D = dot_lanes(dOf + (size_t)i * d, orow, d);
                        if (a->dsinks) dsink -= (double)expf(a->sinks[h] - L[q0 + i]) * D;
                        softmax_grad_row(P + (size_t)i * tN, dS + (size_t)i * tN, window_start(a, q0 + i),
                                         q0 + i + 1, nk, scale, cap, alibi_head(a, h), L[q0 + i], D);
                    }
                    /* dQ [rows][d] = dS K */
                    panels dSa = pack_a_rows(dSp, dS, tN, rows, nk);
                    memset(dQ, 0, n_dq * 4);
                    panel_gemm(dSa, K, dQ, dN, rows, d, nk, q0, 0, 1);
                    for (int i = 0; i < rows; i++)
                        store_row(dqkv, base + (size_t)(q0 + i) * ld + (size_t)h * d,
                                  dQ + (size_t)i * dN, d);
                    /* dV [nk][d] += P^T dO, dK += dS^T Q */
                    panels PT = pack_a_cols(PTp, P, tN, nk, rows);
                    panels dST = pack_a_cols(dSTp, dS, tN, nk, rows);
                    panel_gemm(PT, dO, dV, dN, nk, d, rows, 0, 0, 0);
                    panel_gemm(dST, Q, dK, dN, nk, d, rows, 0, 0, 0);
                }
                if (a->dsinks) sink_part[(size_t)b * hq + h] = dsink;
            }
            for (int j = 0; j < t; j++) {
                store_row(dqkv, base + j * ld + (size_t)(hq + g) * d, dK + (size_t)j * dN, d);
                store_row(dqkv, base + j * ld + (size_t)(hq + hkv + g) * d, dV + (size_t)j * dN, d);
            }
        }
    }
    if (a->dsinks) /* the batches' shares summed in order */
        for (int h = 0; h < hq; h++) {
            double acc = 0.0;
            for (int b = 0; b < a->b; b++) acc += ((const double *)sb)[(size_t)b * hq + h];
            a->dsinks[h] = (float)acc;
        }
    return ZO_OK;
}

/* Attention over a key/value cache (generation): the new tokens' keys and
 * values into the caches, then one task per (sequence, kv head), which
 * stages the cache rows its queries see in fp32 once for the query heads of
 * its group; with fewer of those than threads (one sequence over one kv
 * head: MQA, DeepSeek-V2's latent cache) the group's query heads are split
 * into as many slices as fill the team, each staging the rows itself. A
 * query's scores, softmax and weighted sum of values run in fixed lanes,
 * keys ascending: the same bits whatever the thread count. A head's sink
 * logit (gpt-oss) joins its rows' softmax before the keys. */

/* o[0..d) += p v[0..d) */
VEC_CLONES static void axpy_row(float *restrict o, float p, const float *restrict v, int d)
{
    for (int k = 0; k < d; k++) o[k] += p * v[k];
}

zo_status cpu_attention_cached(cpu_scratch *ws, const gpu_attn_desc *a, gpu_tensor out, gpu_tensor qkv,
                               gpu_tensor kc, gpu_tensor vc, const int32_t *pos, int tc, int nt)
{
    const int t = a->t, d = a->d, hq = a->hq, hkv = a->hkv, grp = hq / hkv, nb = a->b;
    const size_t ld = (size_t)(hq + 2 * hkv) * d, ldo = (size_t)hq * d, ldc = (size_t)hkv * d;
    const float scale = gpu_attn_scale(a), cap = a->softcap;
    int most = 0; /* the most cache rows a sequence's queries see */
    for (int s = 0; s < nb; s++) {
        if (pos[s] < 0 || pos[s] > tc - t)
            return zo_error(ZO_ERR_INVALID,
                            "gpu_attention_cached: pos[%d] = %d: positions %d..%d are outside the cache of %d",
                            s, pos[s], pos[s], pos[s] + t - 1, tc);
        if (pos[s] + t > most) most = pos[s] + t;
    }
    const int team = cpu_team(nt);
    int split = nb * hkv < team ? (team + nb * hkv - 1) / (nb * hkv) : 1; /* slices of a group's query heads */
    if (split > grp) split = grp;
    /* per thread: K and V rows [most][d], a score row, a query and an output row */
    const size_t per = 2 * al64((size_t)most * d * 4) + al64((size_t)most * 4) + 3 * al64((size_t)d * 4);
    char *sb;
    zo_status st = reserve_team(ws, "gpu_attention_cached", 0, per, team, &sb);
    if (st != ZO_OK) return st;
#pragma omp parallel num_threads(team)
    {
        char *cur = team_slice(sb, 0, per);
        float *K = carve(&cur, (size_t)most * d), *V = carve(&cur, (size_t)most * d);
        float *S = carve(&cur, (size_t)most), *q = carve(&cur, (size_t)d), *o = carve(&cur, (size_t)d);
        float *row = carve(&cur, (size_t)d);
        /* the new keys and values into the caches, row by row */
#pragma omp for schedule(static)
        for (int r = 0; r < nb * t; r++) {
            int s = r / t, i = r % t;
            size_t src = (size_t)r * ld, dst = ((size_t)s * tc + pos[s] + i) * ldc;
            for (int g = 0; g < hkv; g++) {
                load_row(row, qkv, src + (size_t)(hq + g) * d, (size_t)d);
                store_row(kc, dst + (size_t)g * d, row, (size_t)d);
                load_row(row, qkv, src + (size_t)(hq + hkv + g) * d, (size_t)d);
                store_row(vc, dst + (size_t)g * d, row, (size_t)d);
            }
        }
        /* (the implicit barrier: every key is in its cache) */
#pragma omp for schedule(static)
        for (int task = 0; task < nb * hkv * split; task++) {
            int sg = task / split, part = task % split;
            int s = sg / hkv, g = sg % hkv, nk = pos[s] + t;
            for (int j = 0; j < nk; j++) {
                size_t off = ((size_t)s * tc + j) * ldc + (size_t)g * d;
                load_row(K + (size_t)j * d, kc, off, (size_t)d);
                load_row(V + (size_t)j * d, vc, off, (size_t)d);
            }
            for (int h = g * grp + part * grp / split; h < g * grp + (part + 1) * grp / split; h++)
                for (int i = 0; i < t; i++) {
                    int p = pos[s] + i, j0 = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
                    load_row(q, qkv, ((size_t)s * t + i) * ld + (size_t)h * d, (size_t)d);
                    float mx = -INFINITY;
                    for (int j = j0; j <= p; j++) S[j] = dot_lanes(q, K + (size_t)j * d, d);
                    scale_scores(S + j0, p + 1 - j0, scale, cap);
                    alibi_scores(S, j0, p + 1, alibi_head(a, h));
                    for (int j = j0; j <= p; j++) mx = S[j] > mx ? S[j] : mx;
                    /* a sink (gpt-oss) joins the softmax as a column without a value */
                    if (a->sinks && a->sinks[h] > mx) mx = a->sinks[h];
                    float l = a->sinks ? fexp(a->sinks[h] - mx) : 0.0f;
                    for (int k = 0; k < d; k++) o[k] = 0.0f;
                    for (int j = j0; j <= p; j++) {
                        float e = fexp(S[j] - mx);
                        l += e;
                        axpy_row(o, e, V + (size_t)j * d, d);
                    }
                    float inv = 1.0f / l;
                    for (int k = 0; k < d; k++) o[k] *= inv;
                    store_row(out, ((size_t)s * t + i) * ldo + (size_t)h * d, o, (size_t)d);
                }
        }
    }
    return ZO_OK;
}

/* ---- RoPE ----------------------------------------------------------------------------------- */

/* Ids (tokens, targets, positions) within [0, limit) (-1 too where
 * allow_ignore: the loss's ignored targets). */
static zo_status check_ids(const char *op, const char *what, const int32_t *ids, int n,
                           int limit, int allow_ignore)
{
    for (int r = 0; r < n; r++)
        if (ids[r] >= limit || ids[r] < (allow_ignore ? -1 : 0))
            return zo_error(ZO_ERR_INVALID, "%s: %s[%d] = %d outside [0, %d)", op, what, r,
                            (int)ids[r], limit);
    return ZO_OK;
}

/* Each of the sequences of t rows of n starts at pos[s], within [0, n_pos -
 * t], so that its rows' positions are within the n_pos there are. */
static zo_status check_seq_pos(const char *op, const int32_t *pos, int n, int t, int n_pos)
{
    return check_ids(op, "pos", pos, (n + t - 1) / t, n_pos - t + 1, 0);
}

zo_status cpu_rope(cpu_scratch *ws, gpu_tensor x, int n, int t, int n_heads, int d, int64_t ldx,
                   int64_t ldh, float theta, int pos0, const int32_t *seq_pos, int n_pos, const double *freq,
                   float scale, int inverse, int nt)
{
    const int half = d / 2, team = cpu_team(nt);
    const size_t db = al64((size_t)d * sizeof(float));
    char *base;
    zo_status st = seq_pos ? check_seq_pos("gpu_rope_forward_seq", seq_pos, n, t, n_pos) : ZO_OK;
    if (st != ZO_OK) return st;
    st = reserve_team(ws, "gpu_rope", (size_t)half * sizeof(double), 2 * db, team, &base);
    if (st != ZO_OK) return st;
    double *inv_freq = (double *)base;
    for (int i = 0; i < half; i++) inv_freq[i] = freq ? freq[i] : pow((double)theta, -2.0 * i / d);
#pragma omp parallel num_threads(cpu_run_team(team, (double)n * n_heads * d))
    {
        char *mine = team_slice(base, (size_t)half * sizeof(double), 2 * db);
        float *cs = (float *)mine, *row = (float *)(mine + db);
#pragma omp for schedule(static)
        for (int r = 0; r < n; r++) {
            double pos = (double)pos0 + (seq_pos ? (double)seq_pos[r / t] : 0.0) + (double)(r % t);
            for (int i = 0; i < half; i++) { /* times scale, rounded once */
                cs[i] = (float)(scale * cos(pos * inv_freq[i]));
                cs[half + i] = (float)(scale * (inverse ? -sin(pos * inv_freq[i]) : sin(pos * inv_freq[i])));
            }
            for (int h = 0; h < n_heads; h++) {
                size_t off = (size_t)r * ldx + (size_t)h * ldh;
                load_row(row, x, off, d);
                for (int i = 0; i < half; i++) {
                    float x1 = row[i], x2 = row[half + i], c = cs[i], s = cs[half + i];
                    row[i] = x1 * c - x2 * s;
                    row[half + i] = x2 * c + x1 * s;
                }
                store_row(x, off, row, d);
            }
        }
    }
    return ZO_OK;
}

/* ---- activations ------------------------------------------------------------------------------
 * GELU (tanh form) through 1 + tanh(u) = 2 sigmoid(2u), which has no
 * cancellation for negative inputs: gelu(v) = v / (1 + exp(-2u)). */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

VEC_CLONES static void gelu_fwd_f32(float *y, const float *x, int n)
{
#pragma omp simd /* in place (output == an input) is fine: same index */
    for (int i = 0; i < n; i++) {
        float v = x[i], u = GELU_K * (v + 0.044715f * v * v * v);
        y[i] = v / (1.0f + fexp(-2.0f * u));
    }
}

/* d gelu / dv = s + 2 v s (1 - s) du/dv with s = sigmoid(2u). */
VEC_CLONES static void gelu_bwd_f32(float *dx, const float *dy, const float *x, int n)
{
#pragma omp simd /* in place (output == an input) is fine: same index */
    for (int i = 0; i < n; i++) {
        float v = x[i], u = GELU_K * (v + 0.044715f * v * v * v);
        float du = GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
        float sg = 1.0f / (1.0f + fexp(-2.0f * u));
        dx[i] = dy[i] * (sg + 2.0f * v * sg * (1.0f - sg) * du);
    }
}

/* GELU's erf form (GPT-NeoX's "gelu"): y = x Phi(x) with Phi(x) =
 * erfc(-x / sqrt 2) / 2, which does not cancel for negative x as
 * (1 + erf(x / sqrt 2)) / 2 does; dy/dx = Phi(x) + x phi(x). */
#define GELU_RSQRT2 0.7071067811865476f  /* 1 / sqrt(2) */
#define GELU_RSQRT2PI 0.3989422804014327f /* 1 / sqrt(2 pi) */

static void gelu_erf_fwd_f32(float *y, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] = x[i] * 0.5f * erfcf(-x[i] * GELU_RSQRT2);
}

static void gelu_erf_bwd_f32(float *dx, const float *dy, const float *x, int n)
{
    for (int i = 0; i < n; i++) {
        float v = x[i];
        dx[i] = dy[i] * (0.5f * erfcf(-v * GELU_RSQRT2) + v * GELU_RSQRT2PI * expf(-0.5f * v * v));
    }
}

/* ReLU (OPT's MLP): y = max(x, 0); dy/dx 1 where x > 0, else 0 (torch's
 * gradient at 0 included) */
VEC_CLONES static void relu_fwd_f32(float *y, const float *x, int n)
{
#pragma omp simd /* in place (output == an input) is fine: same index */
    for (int i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

VEC_CLONES static void relu_bwd_f32(float *dx, const float *dy, const float *x, int n)
{
#pragma omp simd /* in place (output == an input) is fine: same index */
    for (int i = 0; i < n; i++) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

typedef void (*act_fwd_fn)(float *y, const float *x, int n);
typedef void (*act_bwd_fn)(float *dx, const float *dy, const float *x, int n);
static const act_fwd_fn act_fwd[] = {[GPU_ACT_GELU_TANH] = gelu_fwd_f32, [GPU_ACT_GELU_ERF] = gelu_erf_fwd_f32,
                                     [GPU_ACT_RELU] = relu_fwd_f32};
static const act_bwd_fn act_bwd[] = {[GPU_ACT_GELU_TANH] = gelu_bwd_f32, [GPU_ACT_GELU_ERF] = gelu_erf_bwd_f32,
                                     [GPU_ACT_RELU] = relu_bwd_f32};

VEC_CLONES static void swiglu_fwd_f32(float *y, const float *gate, const float *up, int n)
{
#pragma omp simd /* in place (output == an input) is fine: same index */
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        y[i] = g / (1.0f + fexp(-g)) * up[i];
    }
}

VEC_CLONES static void swiglu_bwd_f32(float *restrict dgate, float *restrict dup,
                                      const float *restrict dy, const float *restrict gate,
                                      const float *restrict up, int n)
{
    for (int i = 0; i < n; i++) {
        float g = gate[i], u = up[i], gy = dy[i];
        float sg = 1.0f / (1.0f + fexp(-g));
        dup[i] = gy * g * sg;
        dgate[i] = gy * u * sg * (1.0f + g * (1.0f - sg));
    }
}

/* GeGLU (Gemma): y = gelu_tanh(gate) * up, with GELU as above */
VEC_CLONES static void geglu_fwd_f32(float *y, const float *gate, const float *up, int n)
{
#pragma omp simd /* in place (output == an input) is fine: same index */
    for (int i = 0; i < n; i++) {
        float g = gate[i], u = GELU_K * (g + 0.044715f * g * g * g);
        y[i] = g / (1.0f + fexp(-2.0f * u)) * up[i];
    }
}

VEC_CLONES static void geglu_bwd_f32(float *restrict dgate, float *restrict dup,
                                     const float *restrict dy, const float *restrict gate,
                                     const float *restrict up, int n)
{
    for (int i = 0; i < n; i++) {
        float g = gate[i], gy = dy[i], u = GELU_K * (g + 0.044715f * g * g * g);
        float du = GELU_K * (1.0f + 3.0f * 0.044715f * g * g);
        float sg = 1.0f / (1.0f + fexp(-2.0f * u));
        dup[i] = gy * g * sg;
        dgate[i] = gy * up[i] * (sg + 2.0f * g * sg * (1.0f - sg) * du);
    }
}

/* gpt-oss's clamped GLU (gpu/device.h): g = min(gate, lim), u = clamp(up,
 * -lim, lim), y = (u + 1) g sigmoid(al g) */
VEC_CLONES static void glu_clamped_fwd_f32(float *y, const float *gate, const float *up, int n, float lim, float al)
{
#pragma omp simd /* in place (output == an input) is fine: same index */
    for (int i = 0; i < n; i++) {
        float g = gate[i] < lim ? gate[i] : lim, u = up[i] < -lim ? -lim : up[i] > lim ? lim : up[i];
        y[i] = (u + 1.0f) * g / (1.0f + fexp(-al * g));
    }
}

VEC_CLONES static void glu_clamped_bwd_f32(float *restrict dgate, float *restrict dup, const float *restrict dy,
                                           const float *restrict gate, const float *restrict up, int n, float lim,
                                           float al)
{
    for (int i = 0; i < n; i++) {
        float g = gate[i] < lim ? gate[i] : lim, u = up[i] < -lim ? -lim : up[i] > lim ? lim : up[i];
        float gy = dy[i], sg = 1.0f / (1.0f + fexp(-al * g));
        dup[i] = up[i] < -lim || up[i] > lim ? 0.0f : gy * g * sg;
        dgate[i] = gate[i] > lim ? 0.0f : gy * (u + 1.0f) * sg * (1.0f + al * g * (1.0f - sg));
    }
}

static size_t ew_blocks(size_t n) { return (n + EW_BLOCK - 1) / EW_BLOCK; }
static int ew_len(size_t blk, size_t n)
{
    return (int)(n - blk * EW_BLOCK < EW_BLOCK ? n - blk * EW_BLOCK : EW_BLOCK);
}

void cpu_gelu_forward(gpu_tensor y, gpu_tensor x, size_t n, int form, int nt)
{
#pragma omp parallel for schedule(static) num_threads(cpu_run_team(cpu_team(nt), (double)n))
    for (size_t blk = 0; blk < ew_blocks(n); blk++) {
        float bx[EW_BLOCK], by[EW_BLOCK];
        size_t off = blk * EW_BLOCK;
        int len = ew_len(blk, n);
        float *py = out_f32(y, off, by);
        act_fwd[form](py, in_f32(x, off, len, bx), len);
        out_done(y, off, py, len);
    }
}

void cpu_gelu_backward(gpu_tensor dx, gpu_tensor dy, gpu_tensor x, size_t n, int form, int nt)
{
#pragma omp parallel for schedule(static) num_threads(cpu_run_team(cpu_team(nt), (double)n))
    for (size_t blk = 0; blk < ew_blocks(n); blk++) {
        float bx[EW_BLOCK], bdy[EW_BLOCK], bdx[EW_BLOCK];
        size_t off = blk * EW_BLOCK;
        int len = ew_len(blk, n);
        float *pdx = out_f32(dx, off, bdx);
        act_bwd[form](pdx, in_f32(dy, off, len, bdy), in_f32(x, off, len, bx), len);
        out_done(dx, off, pdx, len);
    }
}

void cpu_swiglu_forward(gpu_tensor y, gpu_tensor gate, gpu_tensor up, size_t n, int gelu, float limit,
                        float alpha, int nt)
{
#pragma omp parallel for schedule(static) num_threads(cpu_run_team(cpu_team(nt), (double)n))
    for (size_t blk = 0; blk < ew_blocks(n); blk++) {
        float bg[EW_BLOCK], bu[EW_BLOCK], by[EW_BLOCK];
        size_t off = blk * EW_BLOCK;
        int len = ew_len(blk, n);
        float *py = out_f32(y, off, by);
        if (gelu == GPU_GLU_CLAMPED)
            glu_clamped_fwd_f32(py, in_f32(gate, off, len, bg), in_f32(up, off, len, bu), len, limit, alpha);
        else
            (gelu ? geglu_fwd_f32 : swiglu_fwd_f32)(py, in_f32(gate, off, len, bg), in_f32(up, off, len, bu), len);
        out_done(y, off, py, len);
    }
}

void cpu_swiglu_backward(gpu_tensor dgate, gpu_tensor dup, gpu_tensor dy, gpu_tensor gate,
                         gpu_tensor up, size_t n, int gelu, float limit, float alpha, int nt)
{
#pragma omp parallel for schedule(static) num_threads(cpu_run_team(cpu_team(nt), (double)n))
    for (size_t blk = 0; blk < ew_blocks(n); blk++) {
        float bg[EW_BLOCK], bu[EW_BLOCK], bdy[EW_BLOCK], bdg[EW_BLOCK], bdu[EW_BLOCK];
        size_t off = blk * EW_BLOCK;
        int len = ew_len(blk, n);
        /* the gradients may overwrite the inputs: compute into buffers */
        if (gelu == GPU_GLU_CLAMPED)
            glu_clamped_bwd_f32(bdg, bdu, in_f32(dy, off, len, bdy), in_f32(gate, off, len, bg),
                                in_f32(up, off, len, bu), len, limit, alpha);
        else
            (gelu ? geglu_bwd_f32 : swiglu_bwd_f32)(bdg, bdu, in_f32(dy, off, len, bdy), in_f32(gate, off, len, bg),
                                                    in_f32(up, off, len, bu), len);
        store_row(dgate, off, bdg, len);
        store_row(dup, off, bdu, len);
    }
}

/* ---- embedding and loss ------------------------------------------------------------------------- */

zo_status cpu_embedding_forward(cpu_scratch *ws, gpu_tensor out, const int32_t *tokens,
                                gpu_tensor wte, gpu_tensor wpe, const int32_t *pos, int n_pos, int n, int t,
                                int c, int vocab, int nt)
{
    zo_status s = check_ids("gpu_embedding_forward", "tokens", tokens, n, vocab, 0);
    if (s == ZO_OK && pos && wpe.data) s = check_seq_pos("gpu_embedding_forward_seq", pos, n, t, n_pos);
    if (s != ZO_OK) return s;
    const int team = cpu_team(nt);
    const size_t cb = al64((size_t)c * sizeof(float));
    char *base;
    s = reserve_team(ws, "gpu_embedding_forward", 0, 2 * cb, team, &base);
    if (s != ZO_OK) return s;
#pragma omp parallel num_threads(cpu_run_team(team, (double)n * c))
    {
        char *mine = team_slice(base, 0, 2 * cb);
        float *row = (float *)mine, *pr = (float *)(mine + cb);
#pragma omp for schedule(static)
        for (int r = 0; r < n; r++) {
            load_row(row, wte, (size_t)tokens[r] * c, c);
            if (wpe.data) {
                load_row(pr, wpe, ((size_t)(pos ? pos[r / t] : 0) + (size_t)(r % t)) * c, c);
                for (int j = 0; j < c; j++) row[j] += pr[j];
            }
            store_row(out, (size_t)r * c, row, c);
        }
    }
    return ZO_OK;
}

/* Scatter-add by column blocks: each thread owns columns, rows go in order. */
/* dwte[tokens[r]] += dout[r], dwpe[r % t] += dout[r]: a reduction over the
 * rows, so each sum is formed in fp32 (rows ascending) and added to the
 * stored gradient once. The rows are put in token order first (a counting
 * sort, stable), so the rows of one token are consecutive. */
zo_status cpu_embedding_backward(cpu_scratch *ws, gpu_tensor dwte, gpu_tensor dwpe,
                                 gpu_tensor dout, const int32_t *tokens, int n, int t, int c,
                                 int vocab, int nt)
{
    const char *op = "gpu_embedding_backward";
    zo_status s = check_ids(op, "tokens", tokens, n, vocab, 0);
    if (s != ZO_OK) return s;
    char *base;
    s = reserve_team(ws, op, ((size_t)vocab + 1 + (size_t)n) * sizeof(int), 0, 1, &base);
    if (s != ZO_OK) return s;
    int *start = (int *)base, *order = start + vocab + 1;
    memset(start, 0, ((size_t)vocab + 1) * sizeof(int));
    for (int r = 0; r < n; r++) start[tokens[r] + 1]++;
    for (int v = 0; v < vocab; v++) start[v + 1] += start[v];
    for (int r = 0; r < n; r++) order[start[tokens[r]]++] = r; /* start[v]: end of token v */
    int blocks = (c + COLS - 1) / COLS, positions = t < n ? t : n;
#pragma omp parallel for schedule(static) num_threads(cpu_run_team(cpu_team(nt), (double)n * c))
    for (int cb = 0; cb < blocks; cb++) {
        int j0 = cb * COLS, w = c - j0 < COLS ? c - j0 : COLS;
        float g[COLS], sum[COLS];
        for (int k = 0; k < n;) {
            int tok = tokens[order[k]];
            memset(sum, 0, sizeof sum);
            for (; k < n && tokens[order[k]] == tok; k++) {
                load_row(g, dout, (size_t)order[k] * c + j0, w);
                for (int j = 0; j < w; j++) sum[j] += g[j];
            }
            size_t o = (size_t)tok * c + j0;
            for (int j = 0; j < w; j++) st(dwte, o + j, ld(dwte, o + j) + sum[j]);
        }
        for (int p = 0; dwpe.data && p < positions; p++) {
            memset(sum, 0, sizeof sum);
            for (int r = p; r < n; r += t) {
                load_row(g, dout, (size_t)r * c + j0, w);
                for (int j = 0; j < w; j++) sum[j] += g[j];
            }
            size_t o = (size_t)p * c + j0;
            for (int j = 0; j < w; j++) st(dwpe, o + j, ld(dwpe, o + j) + sum[j]);
        }
    }
    return ZO_OK;
}

/* max and log(sum(exp(row - max))), the sum in double over fixed lanes. */
VEC_CLONES static float row_lse(const float *restrict row, int v)
{
    float m[LANES];
    double acc[LANES];
    for (int l = 0; l < LANES; l++) m[l] = -INFINITY, acc[l] = 0.0;
    int vb = v / LANES * LANES;
    for (int j = 0; j < vb; j += LANES)
        for (int l = 0; l < LANES; l++) m[l] = row[j + l] > m[l] ? row[j + l] : m[l];
    float mx = -INFINITY;
    for (int l = 0; l < LANES; l++) mx = m[l] > mx ? m[l] : mx;
    for (int j = vb; j < v; j++) mx = row[j] > mx ? row[j] : mx;
    for (int j = 0; j < vb; j += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += (double)fexp(row[j + l] - mx);
    double s = 0.0;
    for (int l = 0; l < LANES; l++) s += acc[l];
    for (int j = vb; j < v; j++) s += (double)fexp(row[j] - mx);
    return mx + (float)log(s);
}

/* row = scale * exp(row - L) */
VEC_CLONES static void row_softmax_scaled(float *restrict row, int v, float L, float scale)
{
    for (int j = 0; j < v; j++) row[j] = scale * fexp(row[j] - L);
}

/* A row of logits soft-capped in place: x = cap tanh(x / cap) (cap > 0). */
static void cap_row(float *restrict row, int v, float cap)
{
    if (cap > 0.0f)
        for (int j = 0; j < v; j++) row[j] = cap * tanhf(row[j] / cap);
}

zo_status cpu_cross_entropy_forward(cpu_scratch *ws, float *losses, gpu_tensor logits,
                                    const int32_t *targets, int n, int v, float cap, int nt)
{
    const char *op = "gpu_cross_entropy_forward";
    zo_status s = check_ids(op, "targets", targets, n, v, 1);
    if (s != ZO_OK) return s;
    const int team = cpu_team(nt);
    const size_t vb = (size_t)v * sizeof(float);
    char *base;
    s = reserve_team(ws, op, 0, vb, team, &base);
    if (s != ZO_OK) return s;
#pragma omp parallel num_threads(cpu_run_team(team, (double)n * v))
    {
        float *row = (float *)team_slice(base, 0, vb);
#pragma omp for schedule(static)
        for (int r = 0; r < n; r++) {
            if (targets[r] < 0) {
                losses[r] = 0.0f;
                continue;
            }
            const float *lr = in_f32(logits, (size_t)r * v, v, row);
            if (cap > 0.0f) {
                if (lr != row) memcpy(row, lr, (size_t)v * sizeof(float));
                cap_row(row, v, cap);
                lr = row;
            }
            losses[r] = row_lse(lr, v) - lr[targets[r]];
        }
    }
    return ZO_OK;
}

zo_status cpu_cross_entropy_backward(cpu_scratch *ws, gpu_tensor dlogits, gpu_tensor logits,
                                     const int32_t *targets, float dloss, int n, int v, float cap, int nt)
{
    const char *op = "gpu_cross_entropy_backward";
    zo_status s = check_ids(op, "targets", targets, n, v, 1);
    if (s != ZO_OK) return s;
    const int team = cpu_team(nt);
    /* each thread's row, and with a cap the cap's derivative of each logit */
    const size_t vb = (size_t)v * sizeof(float), per = cap > 0.0f ? 2 * vb : vb;
    char *base;
    s = reserve_team(ws, op, 0, per, team, &base);
    if (s != ZO_OK) return s;
#pragma omp parallel num_threads(cpu_run_team(team, (double)n * v))
    {
        float *row = (float *)team_slice(base, 0, per), *dcap = row + v;
#pragma omp for schedule(static)
        for (int r = 0; r < n; r++) {
            if (targets[r] < 0) {
                memset(row, 0, (size_t)v * sizeof(float));
            } else {
                load_row(row, logits, (size_t)r * v, v);
                /* capped: z = cap tanh(x / cap), dz/dx = 1 - tanh^2, one tanh each */
                if (cap > 0.0f)
                    for (int j = 0; j < v; j++) {
                        float th = tanhf(row[j] / cap);
                        row[j] = cap * th;
                        dcap[j] = 1.0f - th * th;
                    }
                row_softmax_scaled(row, v, row_lse(row, v), dloss);
                row[targets[r]] -= dloss;
                if (cap > 0.0f)
                    for (int j = 0; j < v; j++) row[j] *= dcap[j];
            }
            store_row(dlogits, (size_t)r * v, row, v);
        }
    }
    return ZO_OK;
}

/* ---- elementwise and reductions -------------------------------------------------------------------- */

VEC_CLONES static void scale_f32(float *y, const float *x, float alpha, int n)
{
#pragma omp simd /* in place (output == an input) is fine: same index */
    for (int i = 0; i < n; i++) y[i] = x[i] * alpha;
}

/* Nonzero when any of x[0..n) is inf or nan (all exponent bits set). */
VEC_CLONES static int nonfinite_f32(const float *restrict x, int n)
{
    int bad = 0;
    for (int i = 0; i < n; i++) bad |= (zo_f32_bits(x[i]) & 0x7f800000u) == 0x7f800000u;
    return bad;
}

/* sum of x[i]^2 in double, over fixed lanes */
VEC_CLONES static double sumsq_f32(const float *restrict x, int n)
{
    double acc[LANES];
    for (int l = 0; l < LANES; l++) acc[l] = 0.0;
    int nb = n / LANES * LANES;
    for (int j = 0; j < nb; j += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += (double)x[j + l] * x[j + l];
    double s = 0.0;
    for (int l = 0; l < LANES; l++) s += acc[l];
    for (int j = nb; j < n; j++) s += (double)x[j] * x[j];
    return s;
}

void cpu_add(gpu_tensor y, gpu_tensor a, gpu_tensor b, size_t n, int nt)
{
#pragma omp parallel for schedule(static) num_threads(cpu_run_team(cpu_team(nt), (double)n))
    for (size_t blk = 0; blk < ew_blocks(n); blk++) {
        float ba[EW_BLOCK], bb[EW_BLOCK], by[EW_BLOCK];
        size_t off = blk * EW_BLOCK;
        int len = ew_len(blk, n);
        float *py = out_f32(y, off, by);
        add_f32(py, in_f32(a, off, len, ba), in_f32(b, off, len, bb), len);
        out_done(y, off, py, len);
    }
}

static void softcap_f32(float *y, const float *x, float cap, int n)
{
    for (int i = 0; i < n; i++) y[i] = cap * tanhf(x[i] / cap); /* in place is fine: same index */
}

/* x = f(x, p) in place, block by block (scale, soft cap) */
static void map_in_place(gpu_tensor x, float p, size_t n, int nt, void (*f)(float *, const float *, float, int))
{
#pragma omp parallel for schedule(static) num_threads(cpu_run_team(cpu_team(nt), (double)n))
    for (size_t blk = 0; blk < ew_blocks(n); blk++) {
        float bx[EW_BLOCK], by[EW_BLOCK];
        size_t off = blk * EW_BLOCK;
        int len = ew_len(blk, n);
        float *py = out_f32(x, off, by);
        f(py, in_f32(x, off, len, bx), p, len);
        out_done(x, off, py, len);
    }
}

void cpu_scale(gpu_tensor x, float alpha, size_t n, int nt) { map_in_place(x, alpha, n, nt, scale_f32); }

void cpu_softcap(gpu_tensor x, float cap, size_t n, int nt) { map_in_place(x, cap, n, nt, softcap_f32); }

void cpu_cast(gpu_tensor dst, gpu_tensor src, size_t n, int nt)
{
    if (dst.dtype == src.dtype) {
        if (dst.data != src.data) memmove(dst.data, src.data, n * zo_dtype_size(dst.dtype));
        return;
    }
#pragma omp parallel for schedule(static) num_threads(cpu_run_team(cpu_team(nt), (double)n))
    for (size_t blk = 0; blk < ew_blocks(n); blk++) {
        float bx[EW_BLOCK];
        size_t off = blk * EW_BLOCK;
        int len = ew_len(blk, n);
        store_row(dst, off, in_f32(src, off, len, bx), len);
    }
}

void cpu_head_copy(gpu_tensor y, gpu_tensor x, int n, int heads, int w, int fill, int64_t ldy, int64_t hsy,
                   int64_t ldx, int64_t hsx, int nt)
{
#pragma omp parallel for schedule(static) num_threads(cpu_run_team(cpu_team(nt), (double)n * heads * w))
    for (int r = 0; r < n; r++) {
        size_t yr = (size_t)r * ldy, xr = (size_t)r * ldx;
        if (!hsy) { /* the heads summed into one, in head order */
            for (int j = 0; j < w; j++) {
                float acc = 0.0f;
                for (int h = 0; h < heads; h++) acc += zo_load_f32(x.data, x.dtype, xr + (size_t)h * hsx + j);
                zo_store_f32(y.data, y.dtype, yr + j, acc);
            }
            continue;
        }
        for (int h = 0; h < heads; h++) {
            size_t yo = yr + (size_t)h * hsy, xo = xr + (size_t)h * hsx;
            for (int j = 0; j < w; j++) zo_store_f32(y.data, y.dtype, yo + j, zo_load_f32(x.data, x.dtype, xo + j));
            for (int j = w; j < fill; j++) zo_store_f32(y.data, y.dtype, yo + j, 0.0f);
        }
    }
}

void cpu_check_finite(int32_t *flag, gpu_tensor x, size_t n, int nt)
{
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) num_threads(cpu_run_team(cpu_team(nt), (double)n))
    for (size_t blk = 0; blk < ew_blocks(n); blk++) {
        float bx[EW_BLOCK];
        size_t off = blk * EW_BLOCK;
        int len = ew_len(blk, n);
        bad |= nonfinite_f32(in_f32(x, off, len, bx), len);
    }
    if (bad) *flag |= 1;
}

#define SUMSQ_CHUNK 16384 /* a multiple of EW_BLOCK */

zo_status cpu_sum_squares(cpu_scratch *ws, double *sum, gpu_tensor x, size_t n, int nt)
{
    size_t chunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double *part;
    zo_status st = cpu_scratch_reserve(ws, chunks * sizeof(double), "gpu_sum_squares",
                                       (void **)&part);
    if (st != ZO_OK) return st;
#pragma omp parallel for schedule(static) num_threads(cpu_run_team(cpu_team(nt), (double)n))
    for (size_t k = 0; k < chunks; k++) {
        size_t end = (k + 1) * SUMSQ_CHUNK < n ? (k + 1) * SUMSQ_CHUNK : n;
        double s = 0.0;
        float bx[EW_BLOCK];
        for (size_t off = k * SUMSQ_CHUNK; off < end; off += EW_BLOCK) {
            int len = (int)(end - off < EW_BLOCK ? end - off : EW_BLOCK);
            s += sumsq_f32(in_f32(x, off, len, bx), len);
        }
        part[k] = s;
    }
    double total = 0.0;
    for (size_t k = 0; k < chunks; k++) total += part[k];
    *sum += total;
    return ZO_OK;
}

void cpu_nf4_dequantize(gpu_tensor out, const void *nf4, size_t n, int nt)
{
    zo_nf4_dequantize(out.data, out.dtype, nf4, n, cpu_team(nt));
}
