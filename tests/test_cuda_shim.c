/* The CUDA kernels on the host, through the shim (gpu/cuda/shim/,
 * docs/gpu-cuda.md "The host shim"); needs no GPU.
 *
 * First the shim itself, with the probe kernels of tests/cuda_shim_probe.cc:
 * barriers across warps and past returned threads, every warp shuffle,
 * kernels.cuh's block reductions, atomics, dynamic shared memory and its
 * limit, the 16-bit conversions and rounded intrinsics, and the launches it
 * must refuse or stop (a block or grid out of range, shared memory over the
 * limit, a shuffle with a lane that returned or does not exist, a barrier
 * deadlock), each reported by cuda_launch_check naming the kernel.
 *
 * Then each kernel family through its shim launcher, called from C as the
 * op-table parity test calls them (gpu/cuda/shim/shim_api.h), on a small
 * case against plain double-precision loops written here: masking, strides
 * and reductions are what a wrong index would break. Attention at length:
 * forward and backward at t = 130 (past every tile), GQA, head dims 64, 80
 * and 128, fp32 and bf16, against the analytic backward. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/adam_math.h"      /* defines: zo_adam_hparams, zo_adam_consts_make */
#include "common/clock.h"          /* defines: zo_now */
#include "common/dtype.h"          /* defines: zo_load_f32, zo_store_f32, conversions */
#include "common/nf4.h"            /* defines: zo_nf4_quantize, zo_nf4_layout_of, tables */
#include "gpu/cuda/shim/shim_api.h" /* defines: shim_launch_*, cuda_err_rec */
#include "tests/support/check.h"   /* defines: check_close_f32, check_close_scaled_f32 */

/* tests/cuda_shim_probe.cc */
zo_status probe_barrier(int *out);
zo_status probe_shfl(double *out);
zo_status probe_reduce(const float *in, int threads, float *mx, double *sum, float *mx2);
zo_status probe_atomics(int blocks, int threads, double *out);
zo_status probe_smem(int threads, size_t bytes, int raise, float *first, float *rev);
zo_status probe_convert(const float *in, int n, uint16_t *h, uint16_t *bf, float *h_back,
                        float *bf_back, float *ops, float *fused);
zo_status probe_launch_shape(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, int *out);
zo_status probe_bad(int how, int *out);
zo_status probe_mma(int bf16, const unsigned *a, const unsigned *b, const float *c, float *d);
zo_status probe_ldmatrix(const uint16_t *src, const int *rows, int trans, unsigned *r);

/* ---- helpers ------------------------------------------------------------------- */

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* CPU seconds of this thread: the shim's cost, whatever else the machine runs */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static float *frand_array(size_t n, float scale)
{
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = scale * frand();
    return p;
}

/* A tensor of type t holding v [n] rounded to t; *vals gets the values it
 * holds (so a reference sees what the kernel loads). */
static gpu_tensor tensor_of(zo_dtype t, float *v, size_t n)
{
    gpu_tensor g = {xmalloc(n * zo_dtype_size(t)), t};
    for (size_t i = 0; i < n; i++) {
        zo_store_f32(g.data, t, i, v[i]);
        v[i] = zo_load_f32(g.data, t, i);
    }
    return g;
}

/* A tensor of type t filled with nan: an element a kernel never writes fails. */
static gpu_tensor tensor_nan(zo_dtype t, size_t n)
{
    gpu_tensor g = {xmalloc(n * zo_dtype_size(t)), t};
    for (size_t i = 0; i < n; i++) zo_store_f32(g.data, t, i, NAN);
    return g;
}

static float *values_of(gpu_tensor g, size_t n)
{
    float *v = xmalloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = zo_load_f32(g.data, g.dtype, i);
    return v;
}

static float *to_float(const double *d, size_t n)
{
    float *f = xmalloc(n * sizeof *f);
    for (size_t i = 0; i < n; i++) f[i] = (float)d[i];
    return f;
}

/* Tolerances per element, atol scaled by max|want| (check_close_scaled_f32). */
static double atol_of(zo_dtype t) { return t == ZO_DTYPE_F32 ? 2e-5 : 1.6e-2; }
static double rtol_of(zo_dtype t) { return t == ZO_DTYPE_F32 ? 1e-4 : 1.6e-2; }

/* got (a tensor) against want [n] in double; returns the mismatches. */
static int check_tensor(const char *what, gpu_tensor got, const double *want, size_t n)
{
    float *g = values_of(got, n), *w = to_float(want, n);
    int bad = check_close_scaled_f32(what, g, w, n, atol_of(got.dtype), rtol_of(got.dtype));
    free(g);
    free(w);
    return bad;
}

static void assert_launch_error(zo_status s, const char *kernel, const char *words)
{
    const char *msg = zo_last_error();
    if (s != ZO_ERR_DEVICE || !strstr(msg, kernel) || !strstr(msg, words))
        printf("  status %d, message: %s\n  (expected ZO_ERR_DEVICE naming %s and \"%s\")\n",
               (int)s, msg, kernel, words);
    assert_int_equal(s, ZO_ERR_DEVICE);
    assert_non_null(strstr(msg, kernel));
    assert_non_null(strstr(msg, words));
}

/* ---- the shim's primitives ----------------------------------------------------- */

static void test_barrier(void **state)
{
    (void)state;
    enum { T = 256, R = 4 };
    int *out = xmalloc(2 * T * R * sizeof *out);
    for (int i = 0; i < 2 * T * R; i++) out[i] = -1;
    assert_int_equal(probe_barrier(out), ZO_OK);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < T; t++) {
            int sum = 0;
            for (int r = 0; r < R; r++) {
                const int *o = &out[(b * T + t) * R + r];
                if (b == 1 && r >= 2 && t >= T - 32) { /* returned: wrote nothing more */
                    assert_int_equal(*o, -1);
                    continue;
                }
                int u = (7 * t + r + 1) % T;
                int written = (b == 1 && r >= 2 && u >= T - 32) ? 1 : r; /* last write of u */
                sum += (b + 1) * 100000 + written * 1000 + u;
                if (*o != sum)
                    printf("  block %d thread %d round %d: got %d want %d\n", b, t, r, *o, sum);
                assert_int_equal(*o, sum);
            }
        }
    free(out);
}

static void test_shuffles(void **state)
{
    (void)state;
    double out[64 * 8];
    assert_int_equal(probe_shfl(out), ZO_OK);
    for (int t = 0; t < 64; t++) {
        const int l = t % 32, wb = t - l;
        const double *o = out + t * 8;
        const double want[8] = {
            (wb + (l * 5 + 3) % 32) * 10 + 1,     /* __shfl_sync, lane (5l+3) % 32 */
            (float)(wb + (l ^ 5)) + 0.25f,        /* __shfl_xor_sync 5 */
            l >= 3 ? t - 3 : t,                   /* __shfl_up_sync 3: low lanes keep theirs */
            l + 2 < 32 ? t + 2 : t,               /* __shfl_down_sync 2: high lanes keep theirs */
            wb + (l & ~15) + 3,                   /* width 16: lane 3 of each half */
            (wb + (l ^ 17)) + 0.5,                /* a double, xor 17 */
            (double)((long long)(wb + 31 - l) << 40),
            496.0, /* warp_sum of the lane numbers */
        };
        for (int k = 0; k < 8; k++) {
            if (o[k] != want[k])
                printf("  thread %d exchange %d: got %.17g want %.17g\n", t, k, o[k], want[k]);
            assert_true(o[k] == want[k]);
        }
    }
}

static void test_block_reductions(void **state)
{
    (void)state;
    const int sizes[] = {32, 96, 256, 1024};
    for (size_t c = 0; c < sizeof sizes / sizeof *sizes; c++) {
        const int n = sizes[c];
        float *in = frand_array((size_t)n, 10.0f);
        in[n / 3] = 25.0f;     /* a known maximum, away from lane 0 */
        in[n - 1] = -30.0f;    /* and minimum, in the last warp */
        float *mx = xmalloc(n * sizeof *mx), *mx2 = xmalloc(n * sizeof *mx2);
        double *sum = xmalloc(n * sizeof *sum), want = 0.0;
        for (int t = 0; t < n; t++) want += in[t];
        assert_int_equal(probe_reduce(in, n, mx, sum, mx2), ZO_OK);
        for (int t = 0; t < n; t++) {
            assert_true(mx[t] == 25.0f);
            assert_true(mx2[t] == 30.0f);
            assert_true(fabs(sum[t] - want) <= 1e-12 * (1.0 + fabs(want)));
            assert_true(sum[t] == sum[0]); /* every thread the same bits */
        }
        free(in);
        free(mx);
        free(mx2);
        free(sum);
    }
}

static void test_atomics(void **state)
{
    (void)state;
    const int blocks = 3, threads = 128, n = blocks * threads;
    double o[8];
    assert_int_equal(probe_atomics(blocks, threads, o), ZO_OK);
    double fsum = 0.0, dsum = 0.0;
    for (int id = 0; id < n; id++) {
        fsum += id % 7;
        dsum += 0.5 * id;
    }
    assert_true(o[0] == n);                  /* atomicAdd int: every thread once */
    assert_true(o[1] == 1);                  /* atomicCAS: one winner */
    assert_true(o[2] >= 0 && o[2] < n);      /* ... which wrote its id */
    assert_true(o[3] == n - 1);              /* atomicMax */
    assert_true(o[4] == 5);                  /* atomicExch */
    assert_true(o[5] == (double)0xffffffffu); /* atomicOr of 1 << (id % 32) */
    assert_true(o[6] == fsum);               /* atomicAdd float (exact: small integers) */
    assert_true(o[7] == dsum);               /* atomicAdd double */
}

static void test_dynamic_shared_memory(void **state)
{
    (void)state;
    enum { T = 128 };
    float first[T], rev[T];
    /* 4 KiB: every thread sees the others' writes after the barrier */
    assert_int_equal(probe_smem(T, 4096, 0, first, rev), ZO_OK);
    for (int t = 0; t < T; t++) {
        assert_true(rev[t] == (float)(1023 - t));
        assert_true(isnan(first[t])); /* not written yet: the shim's all-ones fill */
    }
    /* 64 KiB is over the default 48 KiB ... */
    assert_launch_error(probe_smem(T, 65536, 0, first, rev), "probe_smem_kernel",
                        "dynamic shared memory");
    /* ... until cudaFuncSetAttribute raises the kernel's limit */
    assert_int_equal(probe_smem(T, 65536, 65536, first, rev), ZO_OK);
    for (int t = 0; t < T; t++) assert_true(rev[t] == (float)(16383 - t));
    /* beyond what a block may have at all (sm_80's 163 KiB) */
    zo_status s = probe_smem(T, 200000, 200000, first, rev);
    assert_int_equal(s, ZO_ERR_DEVICE);
    assert_non_null(strstr(zo_last_error(), "cudaFuncSetAttribute"));
}

/* ---- mma.sync and ldmatrix (gpu/cuda/mma_ptx.cuh) ----------------------------------- */

/* Two 16-bit elements in one register, the first in the low half (PTX's
 * .f16x2 / .bf16x2 order). */
static unsigned pack16(uint16_t lo, uint16_t hi) { return (unsigned)lo | (unsigned)hi << 16; }

/* The emulated mma.m16n8k16 against a plain matrix product, fragments laid
 * out here from the PTX ISA's table ("Matrix Fragments for mma.m16n8k16
 * with floating point type"), g = lane >> 2, q = lane % 4:
 *   A (16 x 16): a_i, i = 0 .. 7, two to a register, row g (i = 0, 1, 4, 5)
 *     else g + 8, column 2q + (i & 1), + 8 for i >= 4;
 *   B (16 x 8): b_i, i = 0 .. 3, row 2q + (i & 1), + 8 for i >= 2, column g;
 *   C, D (16 x 8 fp32): c_i, row g (i < 2) else g + 8, column 2q + (i & 1).
 * Small integers and halves, exact in both 16-bit types, so every product
 * and sum is exact in fp32 and the comparison is for equality. */
static void test_mma_fragments(void **state)
{
    (void)state;
    for (int bf16 = 0; bf16 < 2; bf16++) {
        float A[16][16], B[16][8], C[16][8];
        for (int r = 0; r < 16; r++)
            for (int k = 0; k < 16; k++) A[r][k] = (float)(int)(frand() * 8.0f) * 0.5f;
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < 8; n++) B[k][n] = (float)(int)(frand() * 8.0f);
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 8; n++) C[r][n] = (float)(int)(frand() * 100.0f);
        uint16_t (*cv)(float) = bf16 ? zo_f32_to_bf16 : zo_f32_to_f16;
        unsigned a[32 * 4], b[32 * 2];
        float c[32 * 4], d[32 * 4];
        for (int lane = 0; lane < 32; lane++) {
            const int g = lane >> 2, q = lane % 4;
            uint16_t ae[8], be[4];
            for (int i = 0; i < 8; i++) {
                const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
                const int col = 2 * q + (i & 1) + (i >= 4 ? 8 : 0);
                ae[i] = cv(A[row][col]);
            }
            for (int i = 0; i < 4; i++) be[i] = cv(B[2 * q + (i & 1) + (i >= 2 ? 8 : 0)][g]);
            for (int i = 0; i < 4; i++) {
                a[4 * lane + i] = pack16(ae[2 * i], ae[2 * i + 1]);
                c[4 * lane + i] = C[i < 2 ? g : g + 8][2 * q + (i & 1)];
            }
            b[2 * lane] = pack16(be[0], be[1]);
            b[2 * lane + 1] = pack16(be[2], be[3]);
        }
        assert_int_equal(probe_mma(bf16, a, b, c, d), ZO_OK);
        for (int lane = 0; lane < 32; lane++) {
            const int g = lane >> 2, q = lane % 4;
            for (int i = 0; i < 4; i++) {
                const int row = i < 2 ? g : g + 8, col = 2 * q + (i & 1);
                double want = C[row][col];
                for (int k = 0; k < 16; k++) want += (double)A[row][k] * B[k][col];
                if (d[4 * lane + i] != (float)want)
                    fail_msg("%s mma: lane %d d%d (row %d, col %d) = %g, expected %g", bf16 ? "bf16" : "fp16", lane,
                             i, row, col, (double)d[4 * lane + i], want);
            }
        }
    }
}

/* The emulated ldmatrix .x4 (and .trans) against the PTX ISA's description:
 * lane 8 i + k gives the address of row k of matrix i; register i of lane l
 * holds row l >> 2, elements 2 (l % 4) and 2 (l % 4) + 1 of matrix i (low
 * half first), or with .trans those of its transpose, elements
 * (2 (l % 4), l >> 2) and (2 (l % 4) + 1, l >> 2) as stored. The row
 * addresses in a shuffled order, each element a distinct value. */
static void test_ldmatrix_fragments(void **state)
{
    (void)state;
    uint16_t src[32 * 16];
    for (int x = 0; x < 32 * 16; x++) src[x] = (uint16_t)(x * 7 + 3);
    int rows[32];
    for (int l = 0; l < 32; l++) rows[l] = (l * 13 + 5) % 32; /* a permutation */
    for (int trans = 0; trans < 2; trans++) {
        unsigned r[32 * 4];
        assert_int_equal(probe_ldmatrix(src, rows, trans, r), ZO_OK);
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < 4; i++) {
                /* element (row, col) of matrix i as stored */
#define LDM_AT(row, col) src[rows[8 * i + (row)] * 16 + (col)]
                const unsigned want = trans ? pack16(LDM_AT(2 * (l % 4), l >> 2), LDM_AT(2 * (l % 4) + 1, l >> 2))
                                            : pack16(LDM_AT(l >> 2, 2 * (l % 4)), LDM_AT(l >> 2, 2 * (l % 4) + 1));
#undef LDM_AT
                if (r[4 * l + i] != want)
                    fail_msg("ldmatrix%s: lane %d r%d = %08x, expected %08x", trans ? ".trans" : "", l, i,
                             r[4 * l + i], want);
            }
    }
}

static void test_rounding_and_conversions(void **state)
{
    (void)state;
    enum { N = 200 };
    float in[N];
    for (int i = 0; i < N; i++) in[i] = ldexpf(frand(), (int)(frand() * 40.0f));
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65519.0f, 65520.0f,
                             70000.0f, 5.96e-8f, 2.98e-8f, 1e-40f, 3.0e38f, 1.0f + 0x1p-8f,
                             1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f};
    memcpy(in, special, sizeof special);
    uint16_t h[N], bf[N];
    float hb[N], bb[N], ops[4 * N], fused[N];
    assert_int_equal(probe_convert(in, N, h, bf, hb, bb, ops, fused), ZO_OK);
    for (int i = 0; i < N; i++) {
        /* the bits of common/dtype.h's round-to-nearest-even conversions */
        assert_int_equal(h[i], zo_f32_to_f16(in[i]));
        assert_int_equal(bf[i], zo_f32_to_bf16(in[i]));
        assert_int_equal(zo_f32_bits(hb[i]), zo_f32_bits(zo_f16_to_f32(h[i])));
        assert_int_equal(zo_f32_bits(bb[i]), zo_f32_bits(zo_bf16_to_f32(bf[i])));
        /* one IEEE single rounding each (double, then float, rounds + - * / once) */
        const double a = in[i], b = in[(i + 1) % N], c = in[(i + 2) % N];
        const float want[4] = {(float)(a * b), (float)(a + b), (float)(a - b), (float)(a / b)};
        for (int k = 0; k < 4; k++)
            assert_true(zo_f32_bits(ops[4 * i + k]) == zo_f32_bits(want[k]) ||
                        (isnan(ops[4 * i + k]) && isnan(want[k])));
        const float f = (float)((double)want[0] + c); /* rounded product, then the sum: no FMA */
        assert_true(zo_f32_bits(fused[i]) == zo_f32_bits(f) || (isnan(fused[i]) && isnan(f)));
    }
}

static void test_launch_refused(void **state)
{
    (void)state;
    int out = 0;
    assert_launch_error(probe_launch_shape(1, 1, 1, 2048, 1, 1, &out), "probe_noop_kernel",
                        "blockDim (2048, 1, 1)");
    assert_launch_error(probe_launch_shape(1, 1, 1, 32, 32, 2, &out), "probe_noop_kernel",
                        "2048 threads");
    assert_launch_error(probe_launch_shape(1, 1, 1, 1, 1, 65, &out), "probe_noop_kernel",
                        "blockDim (1, 1, 65)");
    assert_launch_error(probe_launch_shape(1, 70000, 1, 32, 1, 1, &out), "probe_noop_kernel",
                        "gridDim (1, 70000, 1)");
    assert_launch_error(probe_launch_shape(0, 1, 1, 32, 1, 1, &out), "probe_noop_kernel",
                        "gridDim (0, 1, 1)");
    assert_int_equal(out, 0); /* nothing ran */
    /* the error was the launch's, not the next one's */
    assert_int_equal(probe_launch_shape(2, 1, 1, 1024, 1, 1, &out), ZO_OK);
    assert_int_equal(out, 1);
}

static void test_warp_misuse(void **state)
{
    (void)state;
    const char *words[] = {"have returned", "returned while", "16 threads", "deadlock",
                           "mask 0x0000ffff", "divergent"};
    int out[64];
    for (int how = 0; how < 6; how++) {
        assert_launch_error(probe_bad(how, out), "probe_bad_kernel", words[how]);
        /* the stopped launch leaves nothing behind: the next one runs */
        double sh[64 * 8];
        assert_int_equal(probe_shfl(sh), ZO_OK);
        assert_true(sh[7] == 496.0);
    }
}

/* zo_gpu is linked too, with the real CUDA backend when nvcc was found:
 * gpu_cuda_device_count pulls in device_cuda.c and through it every kernel
 * object of nvcc. The shim's launchers must still be the shim's, on host
 * memory (the op-table parity test links both the same way). */
static void test_beside_cuda_backend(void **state)
{
    (void)state;
    assert_true(gpu_cuda_device_count() >= 0);
    float x[300];
    for (int i = 0; i < 300; i++) x[i] = (float)i;
    gpu_tensor t = {x, ZO_DTYPE_F32};
    assert_int_equal(shim_launch_scale(NULL, t, 2.0f, 300), ZO_OK);
    for (int i = 0; i < 300; i++) assert_true(x[i] == 2.0f * i);
}

/* ---- kernel families: small cases against double loops ------------------------- */

/* gpu/device.h's row-major C = alpha op(A) op(B) + beta C, batched */
static void ref_gemm(const gpu_gemm_desc *d, const float *a, const float *b, double *c)
{
    const int batch = d->batch > 0 ? d->batch : 1;
    for (int bi = 0; bi < batch; bi++)
        for (int i = 0; i < d->m; i++)
            for (int j = 0; j < d->n; j++) {
                double acc = 0.0;
                for (int p = 0; p < d->k; p++) {
                    size_t ia = bi * d->stride_a + (d->trans_a ? (size_t)p * d->lda + i
                                                                : (size_t)i * d->lda + p);
                    size_t ib = bi * d->stride_b + (d->trans_b ? (size_t)j * d->ldb + p
                                                                : (size_t)p * d->ldb + j);
                    acc += (double)a[ia] * b[ib];
                }
                double *o = &c[bi * d->stride_c + (size_t)i * d->ldc + j];
                *o = d->alpha * acc + (d->beta != 0.0f ? d->beta * *o : 0.0);
            }
}

static void test_gemm_tiled(void **state)
{
    (void)state;
    for (int cs = 0; cs < 3; cs++) {
        const zo_dtype in_t = cs == 2 ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
        gpu_gemm_desc d = {0};
        d.trans_a = cs == 1, d.trans_b = cs != 0;
        d.m = 37, d.n = 29, d.k = 45, d.alpha = 0.5f, d.beta = cs == 0 ? 0.0f : 1.0f;
        d.lda = (d.trans_a ? d.m : d.k) + 3;
        d.ldb = (d.trans_b ? d.k : d.n) + 1;
        d.ldc = d.n + 2;
        d.batch = 2;
        d.stride_a = (int64_t)(d.trans_a ? d.k : d.m) * d.lda + 5;
        d.stride_b = (int64_t)(d.trans_b ? d.n : d.k) * d.ldb;
        d.stride_c = (int64_t)d.m * d.ldc + 7;
        const size_t na = 2 * d.stride_a, nb = 2 * d.stride_b, nc = 2 * d.stride_c;
        float *a = frand_array(na, 1.0f), *b = frand_array(nb, 1.0f), *c0 = frand_array(nc, 1.0f);
        if (cs == 0) /* beta 0 never reads C: nan there must not show */
            for (size_t i = 0; i < nc; i++) c0[i] = NAN;
        d.a = tensor_of(in_t, a, na);
        d.b = tensor_of(in_t, b, nb);
        d.c = tensor_of(ZO_DTYPE_F32, c0, nc);
        double *want = xmalloc(nc * sizeof *want);
        for (size_t i = 0; i < nc; i++) want[i] = c0[i];
        ref_gemm(&d, a, b, want);
        assert_int_equal(shim_launch_gemm_tiled(NULL, &d), ZO_OK);
        /* outside the m x n blocks C is untouched (nan stays nan at beta 0) */
        float *got = values_of(d.c, nc);
        int bad = 0;
        for (size_t i = 0; i < nc; i++) {
            size_t off = i % d.stride_c, r = off / d.ldc, col = off % d.ldc;
            int inside = r < (size_t)d.m && col < (size_t)d.n;
            if (inside) {
                if (!(fabs(got[i] - want[i]) <= 1e-5 * (1.0 + fabs(want[i])))) bad++;
            } else if (!(zo_f32_bits(got[i]) == zo_f32_bits(c0[i]))) {
                bad++;
            }
        }
        if (bad) printf("  gemm case %d: %d elements wrong\n", cs, bad);
        assert_int_equal(bad, 0);
        free(a), free(b), free(c0), free(want), free(got);
        free(d.a.data), free(d.b.data), free(d.c.data);
    }
}

/* cuda_gemm_host, the shim's stand-in for cuBLASLt (what attention's GEMM
 * path calls on the host), against gemm_tiled_kernel run as fibers: the
 * same bits in every element of C, and the same untouched bytes outside
 * it, over shapes on both sides of the kernel's 16-wide tiles, every
 * transpose, the storage types' mixes, beta 0 (C holds nan, never read) and
 * not, batches with padded strides, and operands holding -0, huge values
 * (products overflowing to inf, inf - inf to nan) and subnormals. */
static void test_gemm_host_bits(void **state)
{
    (void)state;
    static const int shapes[][3] = {{1, 1, 1}, {15, 17, 16}, {16, 16, 17}, {33, 31, 47}, {40, 3, 64}, {5, 70, 15}};
    static const zo_dtype types[][3] = {{ZO_DTYPE_F32, ZO_DTYPE_F32, ZO_DTYPE_F32},
                                        {ZO_DTYPE_BF16, ZO_DTYPE_BF16, ZO_DTYPE_F32},
                                        {ZO_DTYPE_F16, ZO_DTYPE_F16, ZO_DTYPE_F16},
                                        {ZO_DTYPE_BF16, ZO_DTYPE_BF16, ZO_DTYPE_BF16},
                                        {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_F32}};
    int cases = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++)
        for (size_t ty = 0; ty < sizeof types / sizeof *types; ty++)
            for (int tr = 0; tr < 4; tr++)
                for (int bt = 0; bt < 2; bt++) {
                    gpu_gemm_desc d = {0};
                    d.m = shapes[sh][0], d.n = shapes[sh][1], d.k = shapes[sh][2];
                    d.trans_a = tr & 1, d.trans_b = tr >> 1;
                    d.alpha = bt ? 0.75f : 1.25f, d.beta = bt ? -0.5f : 0.0f;
                    d.lda = (d.trans_a ? d.m : d.k) + (int)(sh % 3);
                    d.ldb = (d.trans_b ? d.k : d.n) + 1;
                    d.ldc = d.n + 2;
                    d.batch = bt ? 3 : 1;
                    d.stride_a = (int64_t)(d.trans_a ? d.k : d.m) * d.lda + 3;
                    d.stride_b = (int64_t)(d.trans_b ? d.n : d.k) * d.ldb;
                    d.stride_c = (int64_t)d.m * d.ldc + 5;
                    const int nb = d.batch;
                    const size_t na = nb * d.stride_a, nbb = nb * d.stride_b, nc = nb * d.stride_c;
                    float *a = frand_array(na, 2.0f), *b = frand_array(nbb, 2.0f), *c0 = frand_array(nc, 1.0f);
                    a[0] = -0.0f, b[nbb - 1] = -0.0f;
                    if (na > 7) a[7] = 1e-39f;          /* subnormal in fp32 */
                    if (nbb > 5) b[5] = 3e38f, b[4] = -3e38f; /* inf in 16-bit types, overflowing products in fp32 */
                    if (na > 9) a[9] = 2e38f;
                    if (!bt)
                        for (size_t i = 0; i < nc; i++) c0[i] = NAN;
                    d.a = tensor_of(types[ty][0], a, na);
                    d.b = tensor_of(types[ty][1], b, nbb);
                    d.c = tensor_of(types[ty][2], c0, nc);
                    const size_t cbytes = nc * zo_dtype_size(types[ty][2]);
                    void *c_host = xmalloc(cbytes);
                    memcpy(c_host, d.c.data, cbytes);
                    assert_int_equal(shim_launch_gemm_tiled(NULL, &d), ZO_OK);
                    gpu_gemm_desc h = d;
                    h.c.data = c_host;
                    assert_int_equal(shim_gemm_host(&h), ZO_OK);
                    if (memcmp(c_host, d.c.data, cbytes) != 0) {
                        size_t e = zo_dtype_size(types[ty][2]), i = 0;
                        while (memcmp((char *)c_host + i * e, (char *)d.c.data + i * e, e) == 0) i++;
                        fail_msg("m %d n %d k %d trans %d/%d types %d/%d/%d beta %g batch %d: element %zu "
                                 "differs (host %g, kernel %g)", d.m, d.n, d.k, d.trans_a, d.trans_b,
                                 types[ty][0], types[ty][1], types[ty][2], d.beta, d.batch, i,
                                 zo_load_f32(c_host, types[ty][2], i), zo_load_f32(d.c.data, types[ty][2], i));
                    }
                    cases++;
                    free(a), free(b), free(c0), free(c_host);
                    free(d.a.data), free(d.b.data), free(d.c.data);
                }
    printf("  cuda_gemm_host against gemm_tiled_kernel: %d cases, the same bits\n", cases);
}

static void test_bias(void **state)
{
    (void)state;
    const int n = 37, c = 70;
    const int64_t ld = 75;
    float *y = frand_array((size_t)n * ld, 1.0f), *bias = frand_array(c, 1.0f);
    float *dbias0 = frand_array(c, 1.0f);
    gpu_tensor ty = tensor_of(ZO_DTYPE_F32, y, (size_t)n * ld);
    gpu_tensor tb = tensor_of(ZO_DTYPE_BF16, bias, c);
    gpu_tensor tdb = tensor_of(ZO_DTYPE_F32, dbias0, c);
    double *want = xmalloc((size_t)n * ld * sizeof *want), *wdb = xmalloc(c * sizeof *wdb);
    for (int r = 0; r < n; r++)
        for (int j = 0; j < ld; j++)
            want[r * ld + j] = y[r * ld + j] + (j < c ? bias[j] : 0.0);
    for (int j = 0; j < c; j++) {
        wdb[j] = dbias0[j];
        for (int r = 0; r < n; r++) wdb[j] += y[r * ld + j];
    }
    /* backward first, on dy = y as it was */
    size_t sb = (size_t)64 * c * sizeof(float);
    void *scratch = malloc(sb);
    assert_non_null(scratch);
    assert_int_equal(shim_launch_bias_backward(NULL, scratch, sb, tdb, ty, n, c, ld), ZO_OK);
    free(scratch);
    assert_int_equal(check_tensor("dbias", tdb, wdb, c), 0);
    assert_int_equal(shim_launch_bias_forward(NULL, ty, tb, n, c, ld), ZO_OK);
    assert_int_equal(check_tensor("y + bias", ty, want, (size_t)n * ld), 0);
    free(y), free(bias), free(dbias0), free(want), free(wdb);
    free(ty.data), free(tb.data), free(tdb.data);
}

/* LayerNorm (rms = 0) or RMSNorm (rms = 1), forward and backward. */
static void norm_case(int rms)
{
    const int n = 9, c = 100; /* 9 rows: the last block of 4 warps has 3 with no row */
    const size_t nc = (size_t)n * c;
    const float eps = 1e-5f;
    float *x = frand_array(nc, 2.0f), *w = frand_array(c, 1.0f), *b = frand_array(c, 1.0f);
    float *dy = frand_array(nc, 1.0f), *dx0 = frand_array(nc, 1.0f);
    float *dw0 = frand_array(c, 1.0f), *db0 = frand_array(c, 1.0f);
    gpu_tensor tx = tensor_of(ZO_DTYPE_F32, x, nc), tw = tensor_of(ZO_DTYPE_F32, w, c);
    gpu_tensor tb = tensor_of(ZO_DTYPE_F32, b, c), tdy = tensor_of(ZO_DTYPE_F32, dy, nc);
    gpu_tensor tdx = tensor_of(ZO_DTYPE_F32, dx0, nc), tdw = tensor_of(ZO_DTYPE_F32, dw0, c);
    gpu_tensor tdb = tensor_of(ZO_DTYPE_F32, db0, c), ty = tensor_nan(ZO_DTYPE_F32, nc);
    float *mean = xmalloc(n * sizeof *mean), *rstd = xmalloc(n * sizeof *rstd);
    double *wy = xmalloc(nc * sizeof *wy), *wdx = xmalloc(nc * sizeof *wdx);
    double *wdw = xmalloc(c * sizeof *wdw), *wdb = xmalloc(c * sizeof *wdb);
    double *wmean = xmalloc(n * sizeof *wmean), *wrstd = xmalloc(n * sizeof *wrstd);
    for (int j = 0; j < c; j++) wdw[j] = dw0[j], wdb[j] = db0[j];
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * c;
        double m = 0.0, v = 0.0;
        if (!rms) {
            for (int j = 0; j < c; j++) m += xr[j];
            m /= c;
        }
        for (int j = 0; j < c; j++) v += (xr[j] - m) * (xr[j] - m);
        double rs = 1.0 / sqrt(v / c + eps);
        wmean[r] = m, wrstd[r] = rs;
        /* dx = rs * (g - mean(g) - xh * mean(g xh)), g = dy w (RMSNorm: no mean(g)) */
        double mg = 0.0, mgx = 0.0;
        for (int j = 0; j < c; j++) {
            double xh = (xr[j] - m) * rs, g = (double)dy[r * c + j] * w[j];
            mg += g / c;
            mgx += g * xh / c;
            wy[r * c + j] = xh * w[j] + (rms ? 0.0 : b[j]);
            wdw[j] += dy[r * c + j] * xh;
            wdb[j] += dy[r * c + j];
        }
        for (int j = 0; j < c; j++) {
            double xh = (xr[j] - m) * rs, g = (double)dy[r * c + j] * w[j];
            wdx[r * c + j] = dx0[r * c + j] + rs * (g - (rms ? 0.0 : mg) - xh * mgx);
        }
    }
    zo_status s;
    if (rms) s = shim_launch_rmsnorm_forward(NULL, ty, rstd, tx, tw, n, c, eps);
    else s = shim_launch_layernorm_forward(NULL, ty, mean, rstd, tx, tw, tb, n, c, eps);
    assert_int_equal(s, ZO_OK);
    assert_int_equal(check_tensor("norm y", ty, wy, nc), 0);
    float *fr = to_float(wrstd, n), *fm = to_float(wmean, n);
    assert_int_equal(check_close_f32("rstd", rstd, fr, n, 1e-6, 1e-5), 0);
    if (!rms) assert_int_equal(check_close_f32("mean", mean, fm, n, 1e-6, 1e-5), 0);
    size_t sb = (size_t)2 * 64 * c * sizeof(float); /* up to 64 row chunks of dw's and db's partials */
    void *scratch = malloc(sb);
    assert_non_null(scratch);
    if (rms) s = shim_launch_rmsnorm_backward(NULL, scratch, sb, tdx, tdw, tdy, tx, tw, rstd, n, c);
    else s = shim_launch_layernorm_backward(NULL, scratch, sb, tdx, tdw, tdb, tdy, tx, tw, mean, rstd, n, c);
    free(scratch);
    assert_int_equal(s, ZO_OK);
    assert_int_equal(check_tensor("norm dx", tdx, wdx, nc), 0);
    assert_int_equal(check_tensor("norm dw", tdw, wdw, c), 0);
    if (!rms) assert_int_equal(check_tensor("norm db", tdb, wdb, c), 0);
    free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(db0), free(mean), free(rstd);
    free(wy), free(wdx), free(wdw), free(wdb), free(wmean), free(wrstd), free(fr), free(fm);
    free(tx.data), free(tw.data), free(tb.data), free(tdy.data), free(tdx.data), free(tdw.data);
    free(tdb.data), free(ty.data);
}

static void test_layernorm(void **state)
{
    (void)state;
    norm_case(0);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    norm_case(1);
}

static void test_rope(void **state)
{
    (void)state;
    const int b = 2, t = 5, n = b * t, heads = 3, d = 8, pos0 = 3;
    const int64_t ld = heads * d + 4; /* 4 more columns: never touched */
    const float theta = 10000.0f;
    const size_t nx = (size_t)n * ld;
    float *x = frand_array(nx, 1.0f);
    gpu_tensor tx = tensor_of(ZO_DTYPE_F32, x, nx);
    double *want = xmalloc(nx * sizeof *want);
    for (size_t i = 0; i < nx; i++) want[i] = x[i];
    for (int r = 0; r < n; r++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < d / 2; i++) {
                double ang = (pos0 + r % t) * pow(theta, -2.0 * i / d);
                size_t o = (size_t)r * ld + (size_t)h * d;
                double x1 = x[o + i], x2 = x[o + d / 2 + i];
                want[o + i] = x1 * cos(ang) - x2 * sin(ang);
                want[o + d / 2 + i] = x2 * cos(ang) + x1 * sin(ang);
            }
    cuda_err_rec rerr = {0};
    assert_int_equal(shim_launch_rope(NULL, &rerr, tx, n, t, heads, d, ld, d, theta, pos0, NULL, 0, NULL, 1.0f, 0),
                     ZO_OK);
    assert_int_equal(check_tensor("rope", tx, want, nx), 0);
    /* the inverse rotation brings x back */
    assert_int_equal(shim_launch_rope(NULL, &rerr, tx, n, t, heads, d, ld, d, theta, pos0, NULL, 0, NULL, 1.0f, 1),
                     ZO_OK);
    for (size_t i = 0; i < nx; i++) want[i] = x[i];
    assert_int_equal(check_tensor("rope inverse", tx, want, nx), 0);
    /* with longrope's attention scaling: the rotated heads times scale, the
     * transpose scaling them again (scale^2 x) */
    const float scale = 1.25f;
    assert_int_equal(shim_launch_rope(NULL, &rerr, tx, n, t, heads, d, ld, d, theta, pos0, NULL, 0, NULL, scale, 0),
                     ZO_OK);
    assert_int_equal(shim_launch_rope(NULL, &rerr, tx, n, t, heads, d, ld, d, theta, pos0, NULL, 0, NULL, scale, 1),
                     ZO_OK);
    for (int r = 0; r < n; r++)
        for (int j = 0; j < heads * d; j++) want[(size_t)r * ld + j] = (double)scale * scale * x[(size_t)r * ld + j];
    assert_int_equal(check_tensor("rope scaled", tx, want, nx), 0);
    free(x), free(want), free(tx.data);
}

static void test_activations(void **state)
{
    (void)state;
    const size_t n = 1000;
    const double k = sqrt(2.0 / M_PI);
    float *x = frand_array(n, 4.0f), *u = frand_array(n, 2.0f), *dy = frand_array(n, 1.0f);
    gpu_tensor tx = tensor_of(ZO_DTYPE_F32, x, n), tu = tensor_of(ZO_DTYPE_F32, u, n);
    gpu_tensor tdy = tensor_of(ZO_DTYPE_F32, dy, n);
    gpu_tensor y = tensor_nan(ZO_DTYPE_F32, n), dx = tensor_nan(ZO_DTYPE_F32, n);
    gpu_tensor dg = tensor_nan(ZO_DTYPE_F32, n), du = tensor_nan(ZO_DTYPE_F32, n);
    double *w1 = xmalloc(n * sizeof *w1), *w2 = xmalloc(n * sizeof *w2);
    double *w3 = xmalloc(n * sizeof *w3), *w4 = xmalloc(n * sizeof *w4);
    for (size_t i = 0; i < n; i++) {
        double v = x[i], a = k * (v + 0.044715 * v * v * v), th = tanh(a);
        w1[i] = 0.5 * v * (1.0 + th);
        w2[i] = dy[i] * (0.5 * (1.0 + th) +
                         0.5 * v * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * v * v));
    }
    assert_int_equal(shim_launch_gelu_forward(NULL, y, tx, n, 0), ZO_OK);
    assert_int_equal(check_tensor("gelu", y, w1, n), 0);
    assert_int_equal(shim_launch_gelu_backward(NULL, dx, tdy, tx, n, 0), ZO_OK);
    assert_int_equal(check_tensor("gelu dx", dx, w2, n), 0);
    for (size_t i = 0; i < n; i++) { /* the erf form: x Phi(x), Phi(x) + x phi(x) */
        double v = x[i], cdf = 0.5 * (1.0 + erf(v / sqrt(2.0)));
        w1[i] = v * cdf;
        w2[i] = dy[i] * (cdf + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI));
    }
    assert_int_equal(shim_launch_gelu_forward(NULL, y, tx, n, 1), ZO_OK);
    assert_int_equal(check_tensor("gelu erf", y, w1, n), 0);
    assert_int_equal(shim_launch_gelu_backward(NULL, dx, tdy, tx, n, 1), ZO_OK);
    assert_int_equal(check_tensor("gelu erf dx", dx, w2, n), 0);
    for (size_t i = 0; i < n; i++) { /* ReLU (form 2): max(x, 0), dy where x > 0 */
        w1[i] = x[i] > 0.0f ? x[i] : 0.0;
        w2[i] = x[i] > 0.0f ? dy[i] : 0.0;
    }
    assert_int_equal(shim_launch_gelu_forward(NULL, y, tx, n, 2), ZO_OK);
    assert_int_equal(check_tensor("relu", y, w1, n), 0);
    assert_int_equal(shim_launch_gelu_backward(NULL, dx, tdy, tx, n, 2), ZO_OK);
    assert_int_equal(check_tensor("relu dx", dx, w2, n), 0);
    for (size_t i = 0; i < n; i++) {
        double g = x[i], sg = 1.0 / (1.0 + exp(-g));
        w1[i] = g * sg * u[i];
        w3[i] = dy[i] * u[i] * (sg + g * sg * (1.0 - sg)); /* d/dg of g sigmoid(g) */
        w4[i] = dy[i] * g * sg;
    }
    assert_int_equal(shim_launch_swiglu_forward(NULL, y, tx, tu, n, 0, 0.0f, 0.0f), ZO_OK);
    assert_int_equal(check_tensor("swiglu", y, w1, n), 0);
    assert_int_equal(shim_launch_swiglu_backward(NULL, dg, du, tdy, tx, tu, n, 0, 0.0f, 0.0f), ZO_OK);
    assert_int_equal(check_tensor("swiglu dgate", dg, w3, n), 0);
    assert_int_equal(check_tensor("swiglu dup", du, w4, n), 0);
    free(x), free(u), free(dy), free(w1), free(w2), free(w3), free(w4);
    free(tx.data), free(tu.data), free(tdy.data), free(y.data), free(dx.data), free(dg.data);
    free(du.data);
}

static void test_embedding(void **state)
{
    (void)state;
    /* c = 200: two column blocks of the backward; vocab 70 > its 64 row partitions */
    const int b = 2, t = 3, n = b * t, c = 200, vocab = 70;
    int32_t tokens[6] = {5, 69, 5, 0, 64, 69}; /* repeats, and 0 / 64 share a partition */
    float *wte = frand_array((size_t)vocab * c, 1.0f), *wpe = frand_array((size_t)t * c, 1.0f);
    float *dout = frand_array((size_t)n * c, 1.0f), *dwte0 = frand_array((size_t)vocab * c, 1.0f);
    float *dwpe0 = frand_array((size_t)t * c, 1.0f);
    gpu_tensor twte = tensor_of(ZO_DTYPE_BF16, wte, (size_t)vocab * c);
    gpu_tensor twpe = tensor_of(ZO_DTYPE_F32, wpe, (size_t)t * c);
    gpu_tensor tdout = tensor_of(ZO_DTYPE_F32, dout, (size_t)n * c);
    gpu_tensor tdwte = tensor_of(ZO_DTYPE_F32, dwte0, (size_t)vocab * c);
    gpu_tensor tdwpe = tensor_of(ZO_DTYPE_F32, dwpe0, (size_t)t * c);
    gpu_tensor out = tensor_nan(ZO_DTYPE_F32, (size_t)n * c);
    double *wout = xmalloc((size_t)n * c * sizeof *wout);
    double *wdwte = xmalloc((size_t)vocab * c * sizeof *wdwte);
    double *wdwpe = xmalloc((size_t)t * c * sizeof *wdwpe);
    for (size_t i = 0; i < (size_t)vocab * c; i++) wdwte[i] = dwte0[i];
    for (size_t i = 0; i < (size_t)t * c; i++) wdwpe[i] = dwpe0[i];
    for (int r = 0; r < n; r++)
        for (int j = 0; j < c; j++) {
            wout[r * c + j] = (double)wte[tokens[r] * c + j] + wpe[(r % t) * c + j];
            wdwte[tokens[r] * c + j] += dout[r * c + j];
            wdwpe[(r % t) * c + j] += dout[r * c + j];
        }
    cuda_err_rec err = {0};
    assert_int_equal(shim_launch_embedding_forward(NULL, &err, out, tokens, twte, twpe, NULL, 0, n, t, c,
                                                   vocab),
                     ZO_OK);
    assert_int_equal(err.code, 0);
    assert_int_equal(check_tensor("embedding", out, wout, (size_t)n * c), 0);
    static int ws[(2 * 64 + 256 * 1024)]; /* the backward's sort: rows twice, its histograms */
    assert_int_equal(shim_launch_embedding_backward(NULL, &err, ws, sizeof ws, tdwte, tdwpe, tdout,
                                                    tokens, n, t, c, vocab),
                     ZO_OK);
    assert_int_equal(err.code, 0);
    assert_int_equal(check_tensor("dwte", tdwte, wdwte, (size_t)vocab * c), 0);
    assert_int_equal(check_tensor("dwpe", tdwpe, wdwpe, (size_t)t * c), 0);
    /* a position a sequence (generation's batch): sequence j's rows from
     * wpe's row pos[j], in a table of 12 rows */
    const int rows = 12;
    int32_t pos[2] = {5, 9};
    float *wpe2 = frand_array((size_t)rows * c, 1.0f);
    gpu_tensor twpe2 = tensor_of(ZO_DTYPE_BF16, wpe2, (size_t)rows * c);
    for (int r = 0; r < n; r++)
        for (int j = 0; j < c; j++)
            wout[r * c + j] = (double)wte[tokens[r] * c + j] + wpe2[(pos[r / t] + r % t) * c + j];
    assert_int_equal(shim_launch_embedding_forward(NULL, &err, out, tokens, twte, twpe2, pos, rows, n, t, c, vocab),
                     ZO_OK);
    assert_int_equal(err.code, 0);
    assert_int_equal(check_tensor("embedding, a position a sequence", out, wout, (size_t)n * c), 0);
    free(wpe2), free(twpe2.data);
    /* a token out of range: recorded once (row, value, limit), its row skipped */
    tokens[4] = 70;
    assert_int_equal(shim_launch_embedding_forward(NULL, &err, out, tokens, twte, twpe, NULL, 0, n, t, c,
                                                   vocab),
                     ZO_OK);
    assert_int_equal(err.code, CUDA_ERR_EMBEDDING_FORWARD);
    assert_int_equal(err.index, 4);
    assert_int_equal(err.value, 70);
    assert_int_equal(err.limit, vocab);
    free(wte), free(wpe), free(dout), free(dwte0), free(dwpe0), free(wout), free(wdwte);
    free(wdwpe), free(twte.data), free(twpe.data), free(tdout.data), free(tdwte.data);
    free(tdwpe.data), free(out.data);
}

static void test_cross_entropy(void **state)
{
    (void)state;
    const int n = 5, v = 300; /* > 256 threads: each thread takes two columns */
    int32_t targets[5] = {3, -1, 299, 0, 150};
    const float dloss = 0.25f;
    float *logits = frand_array((size_t)n * v, 5.0f);
    gpu_tensor tl = tensor_of(ZO_DTYPE_BF16, logits, (size_t)n * v);
    gpu_tensor dl = tensor_nan(ZO_DTYPE_F32, (size_t)n * v);
    double *wl = xmalloc(n * sizeof *wl), *wd = xmalloc((size_t)n * v * sizeof *wd);
    for (int r = 0; r < n; r++) {
        const float *row = logits + (size_t)r * v;
        double mx = -INFINITY, s = 0.0;
        for (int j = 0; j < v; j++) mx = row[j] > mx ? row[j] : mx;
        for (int j = 0; j < v; j++) s += exp(row[j] - mx);
        double lse = mx + log(s);
        wl[r] = targets[r] < 0 ? 0.0 : lse - row[targets[r]];
        for (int j = 0; j < v; j++)
            wd[r * v + j] = targets[r] < 0 ? 0.0
                                            : dloss * (exp(row[j] - lse) - (j == targets[r]));
    }
    float losses[5];
    cuda_err_rec err = {0};
    assert_int_equal(shim_launch_cross_entropy_forward(NULL, &err, losses, tl, targets, n, v, 0.0f),
                     ZO_OK);
    assert_int_equal(err.code, 0);
    float *fl = to_float(wl, n);
    assert_int_equal(check_close_f32("losses", losses, fl, n, 1e-5, 1e-5), 0);
    assert_int_equal(
        shim_launch_cross_entropy_backward(NULL, &err, dl, tl, targets, dloss, n, v, 0.0f), ZO_OK);
    assert_int_equal(err.code, 0);
    assert_int_equal(check_tensor("dlogits", dl, wd, (size_t)n * v), 0);
    /* in place, bf16 */
    assert_int_equal(
        shim_launch_cross_entropy_backward(NULL, &err, tl, tl, targets, dloss, n, v, 0.0f), ZO_OK);
    assert_int_equal(check_tensor("dlogits in place", tl, wd, (size_t)n * v), 0);
    /* a target out of range */
    targets[2] = 300;
    assert_int_equal(shim_launch_cross_entropy_forward(NULL, &err, losses, dl, targets, n, v, 0.0f),
                     ZO_OK);
    assert_int_equal(err.code, CUDA_ERR_CE_FORWARD);
    assert_int_equal(err.index, 2);
    assert_int_equal(err.value, 300);
    assert_int_equal(err.limit, v);
    free(logits), free(wl), free(wd), free(fl), free(tl.data), free(dl.data);
}

static void test_elementwise(void **state)
{
    (void)state;
    const size_t n = 1000;
    float *a = frand_array(n, 3.0f), *b = frand_array(n, 3.0f);
    gpu_tensor ta = tensor_of(ZO_DTYPE_F16, a, n), tb = tensor_of(ZO_DTYPE_F32, b, n);
    gpu_tensor y = tensor_nan(ZO_DTYPE_F32, n), cast = tensor_nan(ZO_DTYPE_BF16, n);
    double *w = xmalloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++) w[i] = (double)a[i] + b[i];
    assert_int_equal(shim_launch_add(NULL, y, ta, tb, n), ZO_OK);
    assert_int_equal(check_tensor("add", y, w, n), 0);
    assert_int_equal(shim_launch_add(NULL, tb, tb, tb, n), ZO_OK); /* in place */
    for (size_t i = 0; i < n; i++) w[i] = 2.0 * b[i];
    assert_int_equal(check_tensor("add in place", tb, w, n), 0);
    assert_int_equal(shim_launch_scale(NULL, tb, -0.5f, n), ZO_OK);
    for (size_t i = 0; i < n; i++) w[i] = -(double)b[i];
    assert_int_equal(check_tensor("scale", tb, w, n), 0);
    /* casts: rounded as common/dtype.h rounds; one type: the bytes */
    assert_int_equal(shim_launch_cast(NULL, cast, tb, n), ZO_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(((uint16_t *)cast.data)[i], zo_f32_to_bf16(((float *)tb.data)[i]));
    gpu_tensor copy = tensor_nan(ZO_DTYPE_F16, n);
    ((uint16_t *)ta.data)[7] = 0x7d01; /* a signalling nan: copied as it is */
    assert_int_equal(shim_launch_cast(NULL, copy, ta, n), ZO_OK);
    assert_memory_equal(copy.data, ta.data, n * 2);
    /* overlapping ranges of one type are refused, naming the call */
    gpu_tensor shifted = {(char *)ta.data + 2, ZO_DTYPE_F16};
    assert_int_equal(shim_launch_cast(NULL, shifted, ta, n - 1), ZO_ERR_DEVICE);
    assert_non_null(strstr(zo_last_error(), "cudaMemcpyAsync"));
    free(a), free(b), free(w), free(ta.data), free(tb.data), free(y.data), free(cast.data);
    free(copy.data);
}

static void test_reductions(void **state)
{
    (void)state;
    const size_t n = 100003; /* not a multiple of the 512 partials */
    float *x = frand_array(n, 2.0f);
    gpu_tensor tx = tensor_of(ZO_DTYPE_BF16, x, n);
    double want = 1.5, partials[CUDA_SUMSQ_BLOCKS];
    for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
    double sum = 1.5; /* the launcher adds to it, in double */
    assert_int_equal(shim_launch_sum_squares(NULL, &sum, tx, n, partials), ZO_OK);
    assert_true(fabs(sum - want) <= 1e-12 * want);
    int32_t flag = 0;
    assert_int_equal(shim_launch_check_finite(NULL, &flag, tx, n), ZO_OK);
    assert_int_equal(flag, 0);
    zo_store_f32(tx.data, tx.dtype, n - 1, INFINITY); /* the very last element */
    assert_int_equal(shim_launch_check_finite(NULL, &flag, tx, n), ZO_OK);
    assert_int_equal(flag, 1);
    free(x), free(tx.data);
}

static void test_nf4(void **state)
{
    (void)state;
    const uint64_t n = 64 * 300 + 33; /* > 256 blocks (two fp32 scales), a partial block, odd */
    float *w = frand_array(n, 0.1f);
    void *q = NULL;
    assert_int_equal(posix_memalign(&q, 64, zo_nf4_bytes(n)), 0);
    assert_int_equal(zo_nf4_quantize(q, w, n, 1), ZO_OK);
    /* common/nf4.h's dequantization, written out: fp32 products and sums in
     * its order (this file is ISO C: nothing is fused into an FMA) */
    zo_nf4_layout L;
    zo_nf4_layout_of(n, &L);
    float map[256];
    zo_nf4_absmax_map(map);
    const uint8_t *base = q;
    float offset, *want = xmalloc(n * sizeof *want);
    memcpy(&offset, base, 4);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t b = i / 64;
        float scale2;
        memcpy(&scale2, base + L.off_scale2 + 4 * (b / 256), 4);
        float absmax = map[base[L.off_absq + b]] * scale2 + offset;
        uint8_t byte = base[L.off_codes + i / 2];
        want[i] = zo_nf4_code[i % 2 ? byte & 15 : byte >> 4] * absmax;
    }
    gpu_tensor out = tensor_nan(ZO_DTYPE_F32, n);
    assert_int_equal(shim_launch_nf4_dequantize(NULL, out, q, n), ZO_OK);
    for (uint64_t i = 0; i < n; i++)
        assert_int_equal(zo_f32_bits(((float *)out.data)[i]), zo_f32_bits(want[i]));
    free(w), free(q), free(want), free(out.data);
}

static void test_adam(void **state)
{
    (void)state;
    const size_t n = 777;
    for (int l2 = 0; l2 < 2; l2++) {
        zo_adam_hparams hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, l2 ? ZO_ADAM_DECAY_L2 : ZO_ADAM_DECAY_ADAMW,
                              3, 0.5f};
        assert_int_equal(zo_adam_check_hparams("test", &hp), ZO_OK);
        zo_adam_consts c = zo_adam_consts_make(&hp);
        float *p = frand_array(n, 1.0f), *g = frand_array(n, 1.0f), *m = frand_array(n, 0.1f);
        float *v = frand_array(n, 0.01f);
        for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
        gpu_tensor tg = tensor_of(l2 ? ZO_DTYPE_F32 : ZO_DTYPE_BF16, g, n);
        float *pp = xmalloc(n * 4), *mm = xmalloc(n * 4), *vv = xmalloc(n * 4);
        memcpy(pp, p, n * 4), memcpy(mm, m, n * 4), memcpy(vv, v, n * 4);
        gpu_tensor out16 = tensor_nan(ZO_DTYPE_BF16, n);
        assert_int_equal(shim_launch_adam_update(NULL, &c, n, pp, tg, mm, vv, out16), ZO_OK);
        for (size_t i = 0; i < n; i++) {
            /* common/adam_math.h's sequence, one rounding per operation */
            float gi = g[i] * c.grad_mult, pi = p[i];
            if (c.use_l2) gi = gi + c.l2 * pi;
            float mi = c.beta1 * m[i] + c.omb1 * gi;
            float vi = c.beta2 * v[i] + c.omb2 * (gi * gi);
            float d = sqrtf(vi) * c.inv_bc2_sqrt + c.eps;
            if (!c.use_l2) pi = pi - c.lr_wd * pi;
            pi = pi - c.step_size * (mi / d);
            assert_int_equal(zo_f32_bits(pp[i]), zo_f32_bits(pi));
            assert_int_equal(zo_f32_bits(mm[i]), zo_f32_bits(mi));
            assert_int_equal(zo_f32_bits(vv[i]), zo_f32_bits(vi));
            assert_int_equal(((uint16_t *)out16.data)[i], zo_f32_to_bf16(pi));
        }
        free(p), free(g), free(m), free(v), free(pp), free(mm), free(vv);
        free(tg.data), free(out16.data);
    }
}

/* ---- attention ------------------------------------------------------------------ */

/* Causal GQA attention in double, gpu/device.h's layout: qkv [b, t, (hq +
 * 2 hkv) d], out [b, t, hq d], lse [b, hq, t]; the backward analytic:
 * P = softmax(q K^T / sqrt(d)) (causal), dP = dO V^T,
 * dS = P * (dP - rowsum(dO * O)) / sqrt(d), dQ = dS K, dK = dS^T Q,
 * dV = P^T dO, dK and dV summed over the query heads of a kv head. */
static void ref_attention(const gpu_attn_desc *a, const float *qkv, const float *dout,
                          double *out, double *lse, double *dqkv)
{
    const int t = a->t, hq = a->hq, hkv = a->hkv, d = a->d, grp = hq / hkv;
    const size_t ld = (size_t)(hq + 2 * hkv) * d, ldo = (size_t)hq * d;
    const double scale = 1.0 / sqrt((double)d);
    double *p = xmalloc((size_t)t * sizeof *p), *dp = xmalloc((size_t)t * sizeof *dp);
    memset(dqkv, 0, (size_t)a->b * t * ld * sizeof *dqkv);
    for (int bi = 0; bi < a->b; bi++)
        for (int h = 0; h < hq; h++) {
            const int g = h / grp;
            for (int i = 0; i < t; i++) {
                const float *q = qkv + ((size_t)bi * t + i) * ld + (size_t)h * d;
                double mx = -INFINITY, s = 0.0;
                for (int j = 0; j <= i; j++) {
                    const float *k = qkv + ((size_t)bi * t + j) * ld + (size_t)(hq + g) * d;
                    double acc = 0.0;
                    for (int e = 0; e < d; e++) acc += (double)q[e] * k[e];
                    p[j] = acc * scale;
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = 0; j <= i; j++) s += exp(p[j] - mx);
                lse[((size_t)bi * hq + h) * t + i] = mx + log(s);
                for (int j = 0; j <= i; j++) p[j] = exp(p[j] - mx) / s;
                double *o = out + ((size_t)bi * t + i) * ldo + (size_t)h * d;
                const float *go = dout + ((size_t)bi * t + i) * ldo + (size_t)h * d;
                double D = 0.0;
                for (int e = 0; e < d; e++) {
                    o[e] = 0.0;
                    for (int j = 0; j <= i; j++)
                        o[e] += p[j] * qkv[((size_t)bi * t + j) * ld + (size_t)(hq + hkv + g) * d + e];
                    D += go[e] * o[e];
                }
                double *dq = dqkv + ((size_t)bi * t + i) * ld + (size_t)h * d;
                for (int j = 0; j <= i; j++) {
                    const size_t row = ((size_t)bi * t + j) * ld;
                    const float *k = qkv + row + (size_t)(hq + g) * d;
                    const float *v = qkv + row + (size_t)(hq + hkv + g) * d;
                    double *dk = dqkv + row + (size_t)(hq + g) * d;
                    double *dv = dqkv + row + (size_t)(hq + hkv + g) * d;
                    dp[j] = 0.0;
                    for (int e = 0; e < d; e++) dp[j] += go[e] * v[e];
                    const double ds = p[j] * (dp[j] - D) * scale;
                    for (int e = 0; e < d; e++) {
                        dq[e] += ds * k[e];
                        dk[e] += ds * q[e];
                        dv[e] += p[j] * go[e];
                    }
                }
            }
        }
    free(p);
    free(dp);
}

/* Forward and backward of one shape and type through the shim against
 * ref_attention; prints and returns the seconds the two launches took. */
static double attention_case(int t, int hq, int hkv, int d, zo_dtype dt)
{
    const gpu_attn_desc a = {.b = 1, .t = t, .hq = hq, .hkv = hkv, .d = d};
    const size_t nq = (size_t)a.b * t * (hq + 2 * hkv) * d, no = (size_t)a.b * t * hq * d;
    const size_t nl = (size_t)a.b * hq * t;
    float *qkv = frand_array(nq, 1.5f), *dout = frand_array(no, 1.0f);
    gpu_tensor tqkv = tensor_of(dt, qkv, nq), tdout = tensor_of(dt, dout, no);
    gpu_tensor out = tensor_nan(dt, no), dqkv = tensor_nan(dt, nq);
    float *lse = xmalloc(nl * sizeof *lse);
    for (size_t i = 0; i < nl; i++) lse[i] = NAN;
    double *wout = xmalloc(no * sizeof *wout), *wlse = xmalloc(nl * sizeof *wlse);
    double *wdqkv = xmalloc(nq * sizeof *wdqkv);
    ref_attention(&a, qkv, dout, wout, wlse, wdqkv);

    double t0 = zo_now(), c0 = cpu_now();
    assert_int_equal(shim_launch_attention_forward(NULL, &a, out, lse, tqkv), ZO_OK);
    assert_int_equal(shim_launch_attention_backward(NULL, &a, dqkv, tdout, tqkv, out, lse), ZO_OK);
    double secs = zo_now() - t0, cpu = cpu_now() - c0;

    char what[96];
    snprintf(what, sizeof what, "attention t=%d hq=%d hkv=%d d=%d %s", t, hq, hkv, d,
             zo_dtype_name(dt));
    printf("  %s: forward + backward %.3f s (CPU %.3f s)\n", what, secs, cpu);
    fflush(stdout);
    float *fl = to_float(wlse, nl);
    int bad = check_tensor("out", out, wout, no);
    bad += check_close_f32("lse", lse, fl, nl, 1e-5, 1e-5);
    /* q, k and v gradients apart: each may be wrong alone */
    const size_t ld = (size_t)(hq + 2 * hkv) * d;
    const int cols[4] = {0, hq * d, (hq + hkv) * d, (hq + 2 * hkv) * d};
    const char *names[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; part++) {
        const size_t w = (size_t)(cols[part + 1] - cols[part]), rows = (size_t)a.b * t;
        gpu_tensor got = {xmalloc(rows * w * zo_dtype_size(dt)), dt};
        double *want = xmalloc(rows * w * sizeof *want);
        for (size_t r = 0; r < rows; r++)
            for (size_t e = 0; e < w; e++) {
                zo_store_f32(got.data, dt, r * w + e,
                             zo_load_f32(dqkv.data, dt, r * ld + (size_t)cols[part] + e));
                want[r * w + e] = wdqkv[r * ld + (size_t)cols[part] + e];
            }
        bad += check_tensor(names[part], got, want, rows * w);
        free(got.data);
        free(want);
    }
    if (bad) printf("  %s: %d mismatches\n", what, bad);
    assert_int_equal(bad, 0);
    free(qkv), free(dout), free(lse), free(wout), free(wlse), free(wdqkv), free(fl);
    free(tqkv.data), free(tdout.data), free(out.data), free(dqkv.data);
    return secs;
}

static void test_attention(void **state)
{
    (void)state;
    /* t = 130: five key tiles of 32, 17 query blocks of 8, the last partial */
    const int dims[3] = {64, 80, 128};
    for (int k = 0; k < 3; k++) {
        attention_case(130, 4, 2, dims[k], ZO_DTYPE_F32);
        attention_case(130, 4, 2, dims[k], ZO_DTYPE_BF16);
    }
}

static void test_attention_small(void **state)
{
    (void)state;
    /* MHA and MQA, a head dim of one lane's share, t below one tile */
    attention_case(5, 2, 2, 16, ZO_DTYPE_F32);
    attention_case(33, 3, 1, 32, ZO_DTYPE_F16);
    /* d = 256: 72 and 80 KiB of dynamic shared memory, over the default 48,
     * so the launches pass only through the launcher's cudaFuncSetAttribute */
    attention_case(40, 2, 1, 256, ZO_DTYPE_BF16);
}

/* The shim's wmma::mma_sync product (zo_shim_mma16_16, AVX-512 where the
 * CPU has it): d = a b + c over 16 x 16 tiles with 16-bit a, b, against the
 * documented sum, c + a_0 b_0 + ... + a_15 b_15 in that order in fp32 (one
 * rounding an operation: this file is ISO C, nothing fused), bit for bit;
 * d written over c too. */
void zo_shim_mma16_16(float *d, const uint16_t *a, const uint16_t *b, const float *c, int bf16);

static void test_wmma_product_bits(void **state)
{
    (void)state;
    uint16_t a[256], b[256];
    float c[256], d[256], want[256];
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int rep = 0; rep < 20; rep++) {
            for (int i = 0; i < 256; i++) {
                /* spread over magnitudes so the order of the sums shows */
                float x = frand() * ldexpf(1.0f, (int)(frand() * 12.0f)), y = frand() * ldexpf(1.0f, (int)(frand() * 12.0f));
                a[i] = bf16 ? zo_f32_to_bf16(x) : zo_f32_to_f16(x);
                b[i] = bf16 ? zo_f32_to_bf16(y) : zo_f32_to_f16(y);
                c[i] = frand() * 100.0f;
            }
            for (int r = 0; r < 16; r++)
                for (int n = 0; n < 16; n++) {
                    float s = c[r * 16 + n];
                    for (int k = 0; k < 16; k++) {
                        float ak = bf16 ? zo_bf16_to_f32(a[r * 16 + k]) : zo_f16_to_f32(a[r * 16 + k]);
                        float bk = bf16 ? zo_bf16_to_f32(b[k * 16 + n]) : zo_f16_to_f32(b[k * 16 + n]);
                        float p = ak * bk;
                        s = s + p;
                    }
                    want[r * 16 + n] = s;
                }
            zo_shim_mma16_16(d, a, b, c, bf16);
            for (int i = 0; i < 256; i++)
                if (memcmp(&d[i], &want[i], sizeof d[i])) fail_msg("%s: element %d: got %.9g, want %.9g", bf16 ? "bf16" : "f16", i, d[i], want[i]);
            zo_shim_mma16_16(c, a, b, c, bf16); /* in place */
            assert_memory_equal(c, want, sizeof want);
        }
}

/* The tensor cores' accumulation model (ZO_SHIM_TC_ACCUM, cuda_shim.cc),
 * on sums whose IEEE value and truncated value differ, worked by hand. */
void zo_shim_tc_accum_set(int block, int guard);
float zo_shim_tc_dot16(float c, const float *a, const float *b, int ldb);

static void test_tc_accum_model(void **state)
{
    (void)state;
    float a[16], b[16];
    for (int bits = 0; bits < 2; bits++) {
        zo_shim_tc_accum_set(bits ? 16 : 0, 2);
        /* 15 products of 2^-26, then 1: IEEE sums them first, 1 + 1.875
         * 2^-23 rounds to 1 + 2^-22; aligned to 1 with 2 bits past fp32's 24
         * (units of 2^-25) each small product truncates to 0 */
        for (int k = 0; k < 16; k++) a[k] = ldexpf(1.0f, -13), b[k] = ldexpf(1.0f, -13);
        a[15] = 1.0f, b[15] = 1.0f;
        assert_true(zo_shim_tc_dot16(0.0f, a, b, 1) == (bits ? 1.0f : 1.0f + ldexpf(1.0f, -22)));
        /* 1 + 3 2^-25 (0.75 of fp32's unit at 1): IEEE rounds up to 1 +
         * 2^-23, the model keeps it (a multiple of 2^-25) and truncates the
         * sum to 24 bits: 1; the same toward zero for -1 */
        for (int k = 0; k < 16; k++) a[k] = 0.0f, b[k] = 0.0f;
        a[5] = 3.0f * ldexpf(1.0f, -12), b[5] = ldexpf(1.0f, -13);
        assert_true(zo_shim_tc_dot16(1.0f, a, b, 1) == (bits ? 1.0f : 1.0f + ldexpf(1.0f, -23)));
        a[5] = -a[5];
        assert_true(zo_shim_tc_dot16(-1.0f, a, b, 1) == (bits ? -1.0f : -1.0f - ldexpf(1.0f, -23)));
        /* 1 - 1 + 2^-30: IEEE in order 2^-30; the model truncates 2^-30
         * against the step's largest addend (1) first: 0 */
        a[5] = 1.0f, b[5] = -1.0f, a[9] = ldexpf(1.0f, -15), b[9] = ldexpf(1.0f, -15);
        assert_true(zo_shim_tc_dot16(1.0f, a, b, 1) == (bits ? 0.0f : ldexpf(1.0f, -30)));
        /* b read with its stride: b[k ldb] */
        float bs[32] = {0};
        for (int k = 0; k < 16; k++) a[k] = 1.0f, bs[2 * k] = (float)k, bs[2 * k + 1] = 1000.0f;
        assert_true(zo_shim_tc_dot16(0.5f, a, bs, 2) == 120.5f);
    }
    /* 1 + 2^-24 + 2^-24: in one step of 16, 1 + 2^-23 exactly; in steps of
     * 8, each step's 1 + 2^-24 truncates to 1 */
    for (int k = 0; k < 16; k++) a[k] = 0.0f, b[k] = 1.0f;
    a[0] = 1.0f, a[1] = ldexpf(1.0f, -24), a[8] = ldexpf(1.0f, -24);
    zo_shim_tc_accum_set(16, 2);
    assert_true(zo_shim_tc_dot16(0.0f, a, b, 1) == 1.0f + ldexpf(1.0f, -23));
    zo_shim_tc_accum_set(8, 2);
    assert_true(zo_shim_tc_dot16(0.0f, a, b, 1) == 1.0f);
    zo_shim_tc_accum_set(0, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_shuffles),
        cmocka_unit_test(test_block_reductions),
        cmocka_unit_test(test_atomics),
        cmocka_unit_test(test_dynamic_shared_memory),
        cmocka_unit_test(test_rounding_and_conversions),
        cmocka_unit_test(test_mma_fragments),
        cmocka_unit_test(test_ldmatrix_fragments),
        cmocka_unit_test(test_wmma_product_bits),
        cmocka_unit_test(test_tc_accum_model),
        cmocka_unit_test(test_launch_refused),
        cmocka_unit_test(test_warp_misuse),
        cmocka_unit_test(test_beside_cuda_backend),
        cmocka_unit_test(test_gemm_tiled),
        cmocka_unit_test(test_gemm_host_bits),
        cmocka_unit_test(test_bias),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_nf4),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_attention_small),
        cmocka_unit_test(test_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
