/* cpu_adam tests: the scalar reference against a float64 AdamW/Adam written
 * here from PyTorch's formulation, and every implementation the CPU supports
 * against the scalar reference bit for bit (odd lengths, tails, unaligned
 * pointers, 1-4 threads, both decay modes, the multiplier, 16-bit copies),
 * plus the sum-of-squares / inf-nan pass and argument checks. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/dtype.h"     /* zo_f32_to_f16, zo_f32_to_bf16, zo_load_f32 */
#include "cpu_adam/cpu_adam.h" /* adam_update_impl, adam_grad_stats_impl */

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float rng_unit(uint64_t *s) { return (float)((double)(rng_next(s) >> 11) * 0x1p-52 - 1.0); }

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* A 16-bit element as a double, decoded here from its fields. */
static double ref_16(uint16_t h, zo_dtype t)
{
    int sign = h >> 15;
    int ebits = t == ZO_DTYPE_F16 ? 5 : 8, mbits = t == ZO_DTYPE_F16 ? 10 : 7;
    int e = (h >> mbits) & ((1 << ebits) - 1), m = h & ((1 << mbits) - 1), bias = (1 << (ebits - 1)) - 1;
    double v;
    if (e == (1 << ebits) - 1) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, 1 - bias - mbits);
    else v = ldexp((double)(m | 1 << mbits), e - bias - mbits);
    return sign ? -v : v;
}

/* Fill n gradient elements of type t with values of magnitude about `scale`. */
static void fill_grad(void *g, zo_dtype t, size_t n, float scale, uint64_t *s)
{
    for (size_t i = 0; i < n; i++) zo_store_f32(g, t, i, scale * rng_unit(s));
}

static const zo_dtype all_dtypes[] = {ZO_DTYPE_F32, ZO_DTYPE_F16, ZO_DTYPE_BF16};
static const adam_impl vector_impls[] = {ADAM_IMPL_AVX2, ADAM_IMPL_AVX512,
                                         ADAM_IMPL_AVX512_NO_BF16};
#define N_VECTOR_IMPLS 3

/* Bitwise equality, except that any nan equals any nan (the payload of a nan
 * produced by arithmetic is not part of the contract). */
static int same_f32(float a, float b)
{
    if (isnan(a) && isnan(b)) return 1;
    return zo_f32_bits(a) == zo_f32_bits(b);
}

static int same_16(uint16_t a, uint16_t b, zo_dtype t)
{
    int an = t == ZO_DTYPE_F16 ? (a & 0x7c00) == 0x7c00 && (a & 0x3ff)
                               : (a & 0x7f80) == 0x7f80 && (a & 0x7f);
    int bn = t == ZO_DTYPE_F16 ? (b & 0x7c00) == 0x7c00 && (b & 0x3ff)
                               : (b & 0x7f80) == 0x7f80 && (b & 0x7f);
    if (an && bn) return 1;
    return a == b;
}

/* Compare two fp32 arrays bit for bit; print the first mismatches. */
static int diff_f32(const char *what, const float *want, const float *got, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!same_f32(want[i], got[i]) && bad++ < 4)
            print_error("%s[%zu]: want %.9g (0x%08x) got %.9g (0x%08x)\n", what, i, want[i],
                        zo_f32_bits(want[i]), got[i], zo_f32_bits(got[i]));
    return bad;
}

static int diff_16(const char *what, const uint16_t *want, const uint16_t *got, size_t n,
                   zo_dtype t)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!same_16(want[i], got[i], t) && bad++ < 4)
            print_error("%s[%zu]: want 0x%04x got 0x%04x\n", what, i, want[i], got[i]);
    return bad;
}

static adam_hparams hp_make(adam_decay decay, long step)
{
    adam_hparams hp = adam_hparams_default();
    hp.lr = 1e-2f;
    hp.weight_decay = 0.1f;
    hp.decay = decay;
    hp.step = step;
    hp.grad_mult = 0.75f;
    return hp;
}

/* ---- the float64 reference (PyTorch's AdamW / Adam formulation) ---------------- */

typedef struct ref_state {
    double *p, *m, *v;
} ref_state;

/* torch.optim.AdamW / Adam(weight_decay=L2) step on doubles, grad already
 * multiplied by grad_mult. */
static void ref_step(const adam_hparams *hp, size_t n, ref_state *s, const double *grad)
{
    double lr = hp->lr, b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps, wd = hp->weight_decay;
    double bc1 = 1.0 - pow(b1, (double)hp->step), bc2 = 1.0 - pow(b2, (double)hp->step);
    for (size_t i = 0; i < n; i++) {
        double g = grad[i];
        if (hp->decay == ADAM_DECAY_L2) g += wd * s->p[i];
        else s->p[i] *= 1.0 - lr * wd;
        s->m[i] = b1 * s->m[i] + (1.0 - b1) * g;
        s->v[i] = b2 * s->v[i] + (1.0 - b2) * g * g;
        double denom = sqrt(s->v[i]) / sqrt(bc2) + eps;
        s->p[i] -= lr / bc1 * s->m[i] / denom;
    }
}

/* 20 steps of the scalar reference against the float64 one. */
static void run_vs_double(adam_decay decay, zo_dtype gd)
{
    const size_t n = 1001;
    const int steps = 20;
    uint64_t seed = 42 + (uint64_t)decay * 7 + (uint64_t)gd;
    float *p = xmalloc(n * 4), *m = xmalloc(n * 4), *v = xmalloc(n * 4);
    void *g = xmalloc(n * 4);
    double *gd64 = xmalloc(n * 8), *p0 = xmalloc(n * 8);
    ref_state r = {xmalloc(n * 8), xmalloc(n * 8), xmalloc(n * 8)};
    for (size_t i = 0; i < n; i++) {
        p[i] = rng_unit(&seed);
        m[i] = v[i] = 0.0f;
        r.p[i] = p0[i] = p[i];
        r.m[i] = r.v[i] = 0.0;
    }
    double worst = 0.0;
    for (int t = 1; t <= steps; t++) {
        adam_hparams hp = hp_make(decay, t);
        fill_grad(g, gd, n, 2.0f, &seed);
        /* the reference sees the stored gradient times the float multiplier */
        for (size_t i = 0; i < n; i++) gd64[i] = (double)zo_load_f32(g, gd, i) * hp.grad_mult;
        assert_int_equal(adam_update_impl(ADAM_IMPL_SCALAR, &hp, n, p, g, gd, m, v, NULL,
                                          ZO_DTYPE_F16, 1),
                         ZO_OK);
        ref_step(&hp, n, &r, gd64);
    }
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        /* float32 rounding over 20 steps of two or three roundings each:
         * at most ~20 ulp of the parameter (a formula slip, e.g. in the
         * bias correction or eps, is off by 1e-4 or more) */
        double err = fabs((double)p[i] - r.p[i]);
        double tol = 1.5e-6 * fabs(r.p[i]) + 1e-7;
        if (err / tol > worst) worst = err / tol;
        if (err > tol && bad++ < 4)
            print_error("p[%zu]: float %.9g double %.12g\n", i, p[i], r.p[i]);
        double em = fabs((double)m[i] - r.m[i]), ev = fabs((double)v[i] - r.v[i]);
        if ((em > 1e-6 * fabs(r.m[i]) + 1e-7 || ev > 1e-6 * fabs(r.v[i]) + 1e-9) && bad++ < 4)
            print_error("m/v[%zu]: float %.9g %.9g double %.12g %.12g\n", i, m[i], v[i], r.m[i],
                        r.v[i]);
    }
    print_message("# %s %s: worst error %.2f of tolerance\n",
                  decay == ADAM_DECAY_L2 ? "adam-l2" : "adamw", zo_dtype_name(gd), worst);
    assert_int_equal(bad, 0);
    /* the parameters really moved: 20 steps of up to lr each */
    double moved = 0.0;
    for (size_t i = 0; i < n; i++) moved += fabs((double)p[i] - p0[i]);
    assert_true(moved / (double)n > 0.02);
    free(p), free(m), free(v), free(g), free(gd64), free(p0), free(r.p), free(r.m), free(r.v);
}

static void test_reference_vs_double_adamw(void **state)
{
    (void)state;
    for (size_t k = 0; k < 3; k++) run_vs_double(ADAM_DECAY_ADAMW, all_dtypes[k]);
}

static void test_reference_vs_double_l2(void **state)
{
    (void)state;
    for (size_t k = 0; k < 3; k++) run_vs_double(ADAM_DECAY_L2, all_dtypes[k]);
}

/* Against PyTorch: tests/fixtures/cpu_adam/torch_ref.txt holds the
 * parameters after 20 steps of torch.optim.AdamW and torch.optim.Adam (L2) in
 * float64, from inputs given by formulas (see gen_torch_ref.py). */
static void test_reference_vs_torch(void **state)
{
    (void)state;
    enum { N = 67, STEPS = 20 };
    double want[2][N];
    const char *path = ZO_FIXTURES_DIR "/cpu_adam/torch_ref.txt";
    FILE *f = fopen(path, "r");
    if (!f) print_error("cannot open %s\n", path);
    assert_non_null(f);
    char line[512];
    int rows = 0;
    while (fgets(line, sizeof line, f) && rows < N) {
        if (line[0] == '#') continue;
        assert_int_equal(sscanf(line, "%lf %lf", &want[0][rows], &want[1][rows]), 2);
        rows++;
    }
    fclose(f);
    assert_int_equal(rows, N);
    for (int mode = 0; mode < 2; mode++)
        for (int ii = 0; ii < 2; ii++) {
            adam_impl impl = ii ? ADAM_IMPL_AUTO : ADAM_IMPL_SCALAR;
            float p[N], m[N], v[N], g[N];
            for (int i = 0; i < N; i++) {
                p[i] = (float)(((i * 37) % 101 - 50) / 50.0);
                m[i] = v[i] = 0.0f;
            }
            adam_hparams hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                               .weight_decay = 0.1f, .grad_mult = 0.5f,
                               .decay = mode ? ADAM_DECAY_L2 : ADAM_DECAY_ADAMW};
            for (int t = 1; t <= STEPS; t++) {
                for (int i = 0; i < N; i++) g[i] = (float)(((i * 13 + t * 7) % 97 - 48) / 24.0);
                hp.step = t;
                assert_int_equal(adam_update_impl(impl, &hp, N, p, g, ZO_DTYPE_F32, m, v, NULL,
                                                  ZO_DTYPE_F16, 1),
                                 ZO_OK);
            }
            int bad = 0;
            for (int i = 0; i < N; i++) {
                double w = want[mode][i];
                if (fabs((double)p[i] - w) > 1.5e-6 * fabs(w) + 1e-7 && bad++ < 4)
                    print_error("%s %s p[%d]: %.9g torch %.12g\n", adam_impl_name(impl),
                                mode ? "adam-l2" : "adamw", i, p[i], w);
            }
            assert_int_equal(bad, 0);
        }
}

/* Step 1 from zero moments: the bias-corrected update is lr * g / (|g| + eps)
 * = lr * sign(g) for |g| >> eps, whatever beta1 and beta2 are. */
static void test_bias_correction_step1(void **state)
{
    (void)state;
    const size_t n = 257;
    float p[257], m[257], v[257], g[257];
    uint64_t seed = 7;
    for (int mode = 0; mode < 2; mode++) {
        adam_hparams hp = hp_make(mode ? ADAM_DECAY_L2 : ADAM_DECAY_ADAMW, 1);
        hp.beta1 = 0.8f;
        hp.beta2 = 0.95f;
        hp.grad_mult = 1.0f;
        hp.weight_decay = mode ? 0.0f : 0.1f;
        for (size_t i = 0; i < n; i++) {
            p[i] = rng_unit(&seed);
            g[i] = rng_unit(&seed);
            if (fabsf(g[i]) < 1e-3f) g[i] = 1e-3f;
            m[i] = v[i] = 0.0f;
        }
        float p0[257];
        memcpy(p0, p, sizeof p);
        assert_int_equal(adam_update_impl(ADAM_IMPL_SCALAR, &hp, n, p, g, ZO_DTYPE_F32, m, v,
                                          NULL, ZO_DTYPE_F16, 1),
                         ZO_OK);
        for (size_t i = 0; i < n; i++) {
            double want = (double)p0[i] * (1.0 - (double)hp.lr * hp.weight_decay) -
                          (double)hp.lr * (g[i] > 0 ? 1.0 : -1.0);
            assert_true(fabs(p[i] - want) < 1e-6);
        }
    }
}

/* grad_mult applies to the stored gradient: multiplier 0.25 on g equals
 * multiplier 1 on g/4 (exact in binary), bit for bit. */
static void test_grad_mult(void **state)
{
    (void)state;
    const size_t n = 999;
    float *p1 = xmalloc(n * 4), *p2 = xmalloc(n * 4), *m1 = xmalloc(n * 4), *m2 = xmalloc(n * 4);
    float *v1 = xmalloc(n * 4), *v2 = xmalloc(n * 4), *g1 = xmalloc(n * 4), *g2 = xmalloc(n * 4);
    uint64_t seed = 99;
    for (size_t i = 0; i < n; i++) {
        p1[i] = p2[i] = rng_unit(&seed);
        m1[i] = m2[i] = 0.1f * rng_unit(&seed);
        v1[i] = v2[i] = 0.01f * fabsf(rng_unit(&seed));
        g1[i] = rng_unit(&seed);
        g2[i] = g1[i] * 0.25f;
    }
    adam_hparams a = hp_make(ADAM_DECAY_L2, 3), b = a;
    a.grad_mult = 0.25f;
    b.grad_mult = 1.0f;
    assert_int_equal(adam_update(&a, n, p1, g1, ZO_DTYPE_F32, m1, v1, NULL, ZO_DTYPE_F16, 2), ZO_OK);
    assert_int_equal(adam_update(&b, n, p2, g2, ZO_DTYPE_F32, m2, v2, NULL, ZO_DTYPE_F16, 2), ZO_OK);
    assert_int_equal(diff_f32("p", p2, p1, n) + diff_f32("m", m2, m1, n) + diff_f32("v", v2, v1, n),
                     0);
    /* and the multiplier is not ignored */
    b.grad_mult = 0.5f;
    assert_int_equal(adam_update(&b, n, p2, g2, ZO_DTYPE_F32, m2, v2, NULL, ZO_DTYPE_F16, 2), ZO_OK);
    assert_int_equal(adam_update(&a, n, p1, g1, ZO_DTYPE_F32, m1, v1, NULL, ZO_DTYPE_F16, 2), ZO_OK);
    assert_true(!same_f32(m2[0], m1[0]));
    free(p1), free(p2), free(m1), free(m2), free(v1), free(v2), free(g1), free(g2);
}

/* ---- implementations against the scalar reference ---------------------------- */

/* One case: state for off + n + 19 elements, the call on [off, off + n) so
 * that every pointer is shifted by `off` elements from its allocation; the
 * whole buffers are compared, so a write outside the range shows. */
typedef struct bx_case {
    adam_impl impl;
    zo_dtype gd, od;
    int with_out;
    adam_decay decay;
    size_t n, off;
    int threads;
} bx_case;

/* Values that stress the update and the roundings: ordinary, zero, tiny,
 * huge, and now and then inf/nan in the gradient. */
static float special_grad(size_t i, uint64_t *s)
{
    switch (rng_next(s) % 64) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return 1e-30f;
    case 3: return 6.0e4f;
    case 4: return 1e30f;
    case 5: return (i % 3) ? INFINITY : NAN;
    default: return 3.0f * rng_unit(s);
    }
}

static int run_bitexact(const bx_case *c, int steps)
{
    size_t N = c->off + c->n + 19;
    size_t gs = zo_dtype_size(c->gd);
    float *p[2], *m[2], *v[2];
    uint16_t *o[2];
    void *g = xmalloc(N * gs);
    uint64_t seed = 1234 + c->n * 31 + c->off;
    for (int k = 0; k < 2; k++) {
        p[k] = xmalloc(N * 4), m[k] = xmalloc(N * 4), v[k] = xmalloc(N * 4);
        o[k] = xmalloc(N * 2);
        memset(o[k], 0xab, N * 2);
    }
    for (size_t i = 0; i < N; i++) {
        p[0][i] = p[1][i] = 2.0f * rng_unit(&seed);
        m[0][i] = m[1][i] = 0.0f;
        v[0][i] = v[1][i] = 0.0f;
    }
    int bad = 0;
    for (int t = 1; t <= steps && !bad; t++) {
        adam_hparams hp = hp_make(c->decay, t);
        for (size_t i = 0; i < N; i++) zo_store_f32(g, c->gd, i, special_grad(i, &seed));
        const void *gsub = (const char *)g + c->off * gs;
        for (int k = 0; k < 2; k++) {
            adam_impl impl = k ? c->impl : ADAM_IMPL_SCALAR;
            zo_status st = adam_update_impl(impl, &hp, c->n, p[k] + c->off, gsub, c->gd,
                                            m[k] + c->off, v[k] + c->off,
                                            c->with_out ? o[k] + c->off : NULL, c->od,
                                            k ? c->threads : 1);
            assert_int_equal(st, ZO_OK);
        }
        bad += diff_f32("p", p[0], p[1], N) + diff_f32("m", m[0], m[1], N) +
               diff_f32("v", v[0], v[1], N);
        if (c->with_out) bad += diff_16("out16", o[0], o[1], N, c->od);
    }
    if (bad)
        print_error("case: impl %s grad %s out %s decay %d n %zu off %zu threads %d\n",
                    adam_impl_name(c->impl), zo_dtype_name(c->gd),
                    c->with_out ? zo_dtype_name(c->od) : "none", (int)c->decay, c->n, c->off,
                    c->threads);
    /* elements outside the range were not touched */
    for (size_t i = 0; i < N; i++) bad += (i < c->off || i >= c->off + c->n) && o[1][i] != 0xabab;
    for (int k = 0; k < 2; k++) free(p[k]), free(m[k]), free(v[k]), free(o[k]);
    free(g);
    return bad;
}

static void test_impls_bitexact(void **state)
{
    (void)state;
    static const size_t lens[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 1000, 4099};
    int ran = 0;
    for (size_t ii = 0; ii < N_VECTOR_IMPLS; ii++) {
        adam_impl impl = vector_impls[ii];
        if (!adam_impl_supported(impl)) {
            print_message("# %s not supported here: skipped\n", adam_impl_name(impl));
            continue;
        }
        for (size_t gi = 0; gi < 3; gi++)
            for (int oi = 0; oi < 3; oi++)
                for (int dm = 0; dm < 2; dm++)
                    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                        for (size_t off = 0; off < 18; off += 5) {
                            bx_case c = {
                                .impl = impl,
                                .gd = all_dtypes[gi],
                                .od = oi == 2 ? ZO_DTYPE_BF16 : ZO_DTYPE_F16,
                                .with_out = oi > 0,
                                .decay = dm ? ADAM_DECAY_L2 : ADAM_DECAY_ADAMW,
                                .n = lens[li],
                                .off = off,
                                .threads = 1,
                            };
                            assert_int_equal(run_bitexact(&c, 3), 0);
                            ran++;
                        }
    }
    print_message("# %d bit-exact cases\n", ran);
}

/* Large enough that the static split gives every thread a chunk. */
static void test_impls_threads(void **state)
{
    (void)state;
    static const size_t lens[] = {100003, 262144 + 13};
    for (size_t ii = 0; ii <= N_VECTOR_IMPLS; ii++) {
        adam_impl impl = ii == 0 ? ADAM_IMPL_SCALAR : vector_impls[ii - 1];
        if (!adam_impl_supported(impl)) continue;
        for (int th = 1; th <= 4; th++)
            for (size_t li = 0; li < 2; li++)
                for (size_t gi = 0; gi < 3; gi++) {
                    bx_case c = {
                        .impl = impl,
                        .gd = all_dtypes[gi],
                        .od = gi == 2 ? ZO_DTYPE_BF16 : ZO_DTYPE_F16,
                        .with_out = 1,
                        .decay = ADAM_DECAY_ADAMW,
                        .n = lens[li],
                        .off = li ? 3 : 0,
                        .threads = th,
                    };
                    assert_int_equal(run_bitexact(&c, 2), 0);
                }
    }
}

/* With lr = 0 and no decay the parameters stay put and the 16-bit copy is
 * exactly the reference rounding of the inputs: ties, subnormals of either
 * format, overflow, inf, nan. */
static void test_out16_rounding(void **state)
{
    (void)state;
    const size_t n = 4096 + 5;
    float *p = xmalloc(n * 4), *m = xmalloc(n * 4), *v = xmalloc(n * 4), *g = xmalloc(n * 4);
    uint16_t *o = xmalloc(n * 2);
    uint64_t seed = 5;
    static const uint32_t specials[] = {
        0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00400000, /* fp32 subnormals */
        0x3f808000, 0x3f818000, 0x3f80c000,                         /* bf16 ties / above */
        0x3f801000, 0x3f803000,                                     /* fp16 ties */
        0x33000000, 0x33000001, 0x387fe000, 0x38800000, 0x33800000, /* fp16 subnormal edge */
        0x477fefff, 0x477ff000, 0x7f7fffff, 0xff7fffff,             /* fp16/bf16 overflow */
        0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffbfffff, /* inf, nan */
    };
    const size_t ns = sizeof specials / sizeof specials[0];
    for (size_t i = 0; i < n; i++) {
        uint32_t u = i < 2 * ns ? specials[i % ns] : (uint32_t)rng_next(&seed);
        p[i] = zo_bits_f32(u);
        g[i] = 0.0f;
        m[i] = v[i] = 0.0f;
    }
    adam_hparams hp = adam_hparams_default();
    hp.lr = 0.0f;
    hp.weight_decay = 0.0f;
    for (size_t ii = 0; ii <= N_VECTOR_IMPLS; ii++) {
        adam_impl impl = ii == 0 ? ADAM_IMPL_SCALAR : vector_impls[ii - 1];
        if (!adam_impl_supported(impl)) continue;
        for (int od = 0; od < 2; od++) {
            zo_dtype t = od ? ZO_DTYPE_BF16 : ZO_DTYPE_F16;
            for (size_t off = 0; off < 3; off++) {
                memset(o, 0, n * 2);
                assert_int_equal(adam_update_impl(impl, &hp, n - off, p + off, g + off,
                                                  ZO_DTYPE_F32, m + off, v + off, o + off, t, 2),
                                 ZO_OK);
                int bad = 0;
                for (size_t i = off; i < n; i++) {
                    uint16_t want = t == ZO_DTYPE_F16 ? zo_f32_to_f16(p[i]) : zo_f32_to_bf16(p[i]);
                    if (!same_16(want, o[i], t) && bad++ < 4)
                        print_error("%s %s: p 0x%08x want 0x%04x got 0x%04x\n",
                                    adam_impl_name(impl), zo_dtype_name(t), zo_f32_bits(p[i]),
                                    want, o[i]);
                }
                assert_int_equal(bad, 0);
            }
        }
    }
    /* a few hand-checked roundings, independent of dtype.h */
    assert_int_equal(zo_f32_to_bf16(zo_bits_f32(0x3f808000)), 0x3f80); /* tie to even */
    assert_int_equal(zo_f32_to_bf16(zo_bits_f32(0x3f818000)), 0x3f82); /* tie to even */
    free(p), free(m), free(v), free(g), free(o);
}

/* Two calls on [0, a) and [a, n) equal one call on [0, n), for any a. */
static void test_subranges(void **state)
{
    (void)state;
    const size_t n = 5000;
    static const size_t cuts[] = {0, 1, 13, 64, 2501, 4999, 5000};
    for (size_t ii = 0; ii <= N_VECTOR_IMPLS; ii++) {
        adam_impl impl = ii == 0 ? ADAM_IMPL_SCALAR : vector_impls[ii - 1];
        if (!adam_impl_supported(impl)) continue;
        for (size_t ci = 0; ci < sizeof cuts / sizeof cuts[0]; ci++) {
            size_t a = cuts[ci];
            float *p[2], *m[2], *v[2];
            uint16_t *o[2], *g = xmalloc(n * 2);
            uint64_t seed = 3 + a;
            for (int k = 0; k < 2; k++)
                p[k] = xmalloc(n * 4), m[k] = xmalloc(n * 4), v[k] = xmalloc(n * 4),
                o[k] = xmalloc(n * 2);
            for (size_t i = 0; i < n; i++) {
                p[0][i] = p[1][i] = rng_unit(&seed);
                m[0][i] = m[1][i] = 0.1f * rng_unit(&seed);
                v[0][i] = v[1][i] = 0.1f * fabsf(rng_unit(&seed));
                g[i] = zo_f32_to_bf16(rng_unit(&seed));
            }
            adam_hparams hp = hp_make(ADAM_DECAY_ADAMW, 5);
            assert_int_equal(adam_update_impl(impl, &hp, n, p[0], g, ZO_DTYPE_BF16, m[0], v[0],
                                              o[0], ZO_DTYPE_F16, 1),
                             ZO_OK);
            assert_int_equal(adam_update_impl(impl, &hp, a, p[1], g, ZO_DTYPE_BF16, m[1], v[1],
                                              o[1], ZO_DTYPE_F16, 2),
                             ZO_OK);
            assert_int_equal(adam_update_impl(impl, &hp, n - a, p[1] + a, g + a, ZO_DTYPE_BF16,
                                              m[1] + a, v[1] + a, o[1] + a, ZO_DTYPE_F16, 2),
                             ZO_OK);
            assert_int_equal(diff_f32("p", p[0], p[1], n) + diff_f32("m", m[0], m[1], n) +
                                 diff_f32("v", v[0], v[1], n) +
                                 diff_16("o", o[0], o[1], n, ZO_DTYPE_F16),
                             0);
            for (int k = 0; k < 2; k++) free(p[k]), free(m[k]), free(v[k]), free(o[k]);
            free(g);
        }
    }
}

/* ---- gradient statistics -------------------------------------------------------- */

/* Element i of g (fp32, fp16 or bf16) as a double, with no code of the
 * library's: fp32 read as a float, 16-bit decoded from its fields. */
static double ref_elem(const void *g, zo_dtype t, size_t i)
{
    return t == ZO_DTYPE_F32 ? (double)((const float *)g)[i] : ref_16(((const uint16_t *)g)[i], t);
}

/* Magnitudes far apart: 2^e for e uniform in [lo, hi], a random sign and
 * mantissa (fp16's subnormals below 2^-14 included), stored as t. An fp32
 * sum of their squares loses the small ones. */
static void fill_grad_wide(void *g, zo_dtype t, size_t n, int lo, int hi, uint64_t *s)
{
    for (size_t i = 0; i < n; i++) {
        int e = lo + (int)(rng_next(s) % (uint64_t)(hi - lo + 1));
        zo_store_f32(g, t, i, ldexpf(rng_unit(s), e));
    }
}

/* Every implementation against a plain double loop written here: the
 * squares of fp32 values are exact in double and each sum rounds only its
 * additions, so two sums of the same n squares in any orders are within
 * 2 * gamma(n - 1) of each other (gamma(k) = k u / (1 - k u), u = 2^-53:
 * Higham's bound for a sum of non-negative terms), 1.6e-11 relative at
 * n 70001: far below the 1e-8 to 1e-6 of an fp32 accumulation. Lengths
 * cross every vector and unrolled-loop boundary (8, 16, 32, 64) and the
 * threads' split; pointers aligned and not. */
static void test_grad_stats(void **state)
{
    (void)state;
    static const size_t lens[] = {0, 1, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129,
                                  1000, 1023, 1024, 1025, 70001};
    const size_t nmax = 70001 + 7;
    for (size_t gi = 0; gi < 3; gi++)
        for (int wide = 0; wide < 2; wide++) {
            zo_dtype t = all_dtypes[gi];
            size_t gs = zo_dtype_size(t);
            char *g = xmalloc(nmax * gs);
            uint64_t seed = 11 + gi + 3 * (uint64_t)wide;
            if (wide) /* fp16: 2^-24 (its smallest subnormal) to 2^15 */
                fill_grad_wide(g, t, nmax, t == ZO_DTYPE_F16 ? -24 : -60, t == ZO_DTYPE_F16 ? 15 : 60, &seed);
            else
                fill_grad(g, t, nmax, 100.0f, &seed);
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (size_t off = 0; off < 8; off += 7) {
                    size_t n = lens[li];
                    const char *gp = g + off * gs;
                    double want = 0.0;
                    for (size_t i = 0; i < n; i++) {
                        double x = ref_elem(gp, t, i);
                        want += x * x;
                    }
                    double k = n > 1 ? (double)(n - 1) * 0x1p-53 : 0.0;
                    double tol = 2.0 * k / (1.0 - k) * want;
                    for (int ii = 0; ii <= N_VECTOR_IMPLS; ii++) {
                        adam_impl impl = ii == 0 ? ADAM_IMPL_SCALAR : vector_impls[ii - 1];
                        if (!adam_impl_supported(impl)) continue;
                        for (int th = 1; th <= 4; th += 3) {
                            double s = -1;
                            int nf = -1;
                            assert_int_equal(adam_grad_stats_impl(impl, gp, t, n, th, &s, &nf), ZO_OK);
                            assert_int_equal(nf, 0);
                            if (!(fabs(s - want) <= tol)) {
                                print_error("%s %s%s n %zu threads %d: sumsq %.17g want %.17g (%.3g "
                                            "relative, bound %.3g)\n",
                                            adam_impl_name(impl), zo_dtype_name(t), wide ? " wide" : "", n,
                                            th, s, want, fabs(s - want) / want, tol / want);
                                fail();
                            }
                        }
                    }
                }
            free(g);
        }
}

/* inf or nan anywhere (first, last, in a vector tail, in any thread's chunk)
 * is reported; the largest finite values are not. */
static void test_grad_nonfinite(void **state)
{
    (void)state;
    const size_t n = 100003;
    static const size_t where[] = {0, 1, 15, 16, 50000, 99999, 100002};
    for (size_t gi = 0; gi < 3; gi++) {
        zo_dtype t = all_dtypes[gi];
        size_t gs = zo_dtype_size(t);
        char *g = xmalloc(n * gs);
        uint64_t seed = 17;
        fill_grad(g, t, n, 1.0f, &seed);
        for (int ii = 0; ii <= N_VECTOR_IMPLS; ii++) {
            adam_impl impl = ii == 0 ? ADAM_IMPL_SCALAR : vector_impls[ii - 1];
            if (!adam_impl_supported(impl)) continue;
            /* the largest finite value of the type is finite */
            float big = t == ZO_DTYPE_F32 ? 3.4028235e38f : t == ZO_DTYPE_F16 ? 65504.0f : 3.38e38f;
            zo_store_f32(g, t, n / 2, big);
            big = zo_load_f32(g, t, n / 2);
            double s;
            int nf;
            assert_int_equal(adam_grad_stats_impl(impl, g, t, n, 2, &s, &nf), ZO_OK);
            assert_int_equal(nf, 0);
            assert_true(isfinite(s) && s >= (double)big * big);
            for (size_t wi = 0; wi < sizeof where / sizeof where[0]; wi++)
                for (int kind = 0; kind < 3; kind++) {
                    size_t i = where[wi];
                    float save = zo_load_f32(g, t, i);
                    zo_store_f32(g, t, i, kind == 0 ? INFINITY : kind == 1 ? -INFINITY : NAN);
                    for (int th = 1; th <= 4; th++) {
                        nf = 0;
                        assert_int_equal(adam_grad_stats_impl(impl, g, t, n, th, &s, &nf), ZO_OK);
                        if (!nf)
                            print_error("%s %s: value %d at %zu threads %d not reported\n",
                                        adam_impl_name(impl), zo_dtype_name(t), kind, i, th);
                        assert_int_equal(nf, 1);
                        assert_false(isfinite(s));
                    }
                    zo_store_f32(g, t, i, save);
                }
        }
        free(g);
    }
}

/* ---- arguments ---------------------------------------------------------------------- */

/* ---- the gradient sum's addition --------------------------------------------- */

/* Gradients of every kind: ordinary values, -0, subnormals of the type and
 * of fp32, the largest, inf and nan; the sums likewise, so that x + (-x),
 * inf - inf and overflow occur. */
static void acc_fill(void *g, zo_dtype t, float *acc, size_t n, uint64_t *s)
{
    static const float special[] = {-0.0f, 0.0f, 1e-40f, -3e-45f, 6e-8f, 3.4e38f, -65504.0f, INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng_next(s);
        float v = r % 7 == 0 ? special[(r >> 8) % 10] : (float)ldexp(rng_unit(s), (int)(r >> 16) % 40 - 20);
        zo_store_f32(g, t, i, v);
        acc[i] = r % 11 == 0 ? special[(r >> 24) % 10] : r % 13 == 0 ? -zo_load_f32(g, t, i) : rng_unit(s);
    }
}

/* adam_grad_accumulate against a double loop: each result the double sum
 * of the two fp32 values rounded to fp32 (which is the fp32 sum exactly:
 * 53 bits are enough for one rounding), a fresh sum 0 + x whatever acc
 * held; every implementation, 1-4 threads, lengths around the vector widths
 * and the threading threshold, an unaligned gradient. */
static void test_grad_accumulate(void **state)
{
    (void)state;
    const size_t c = ADAM_ACC_MIN_CHUNK;
    const size_t lens[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 1001,
                           2 * c - 1, 2 * c, 2 * c + 1, 3 * c + 17, 4 * c + 63};
    uint64_t seed = 41;
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
        for (size_t gi = 0; gi < 3; gi++) {
            zo_dtype t = all_dtypes[gi];
            size_t n = lens[li], es = zo_dtype_size(t);
            char *gbuf = xmalloc((n + 1) * es);
            void *g = gbuf + es * (li & 1); /* every other one off the vector alignment */
            float *acc0 = xmalloc((n + 1) * 4), *acc = xmalloc((n + 1) * 4);
            double *want = xmalloc((n + 1) * sizeof(double));
            acc_fill(g, t, acc0, n, &seed);
            for (int fresh = 0; fresh <= 1; fresh++) {
                for (size_t i = 0; i < n; i++) {
                    double x = t == ZO_DTYPE_F32 ? (double)((const float *)g)[i] : ref_16(((const uint16_t *)g)[i], t);
                    want[i] = (fresh ? 0.0 : (double)acc0[i]) + x;
                }
                for (size_t ii = 0; ii <= N_VECTOR_IMPLS; ii++) {
                    adam_impl impl = ii == 0 ? ADAM_IMPL_SCALAR : vector_impls[ii - 1];
                    if (!adam_impl_supported(impl)) continue;
                    for (int th = 1; th <= 4; th++) {
                        if (fresh) for (size_t i = 0; i < n; i++) acc[i] = NAN; /* not read */
                        else memcpy(acc, acc0, n * 4);
                        acc[n] = 12345.0f; /* not written */
                        assert_int_equal(adam_grad_accumulate_impl(impl, acc, g, t, n, fresh, th), ZO_OK);
                        size_t bad = 0;
                        for (size_t i = 0; i < n; i++)
                            if (!same_f32((float)want[i], acc[i]) && bad++ < 3)
                                fprintf(stderr, "%s %s n %zu fresh %d threads %d: [%zu] %a, want %a\n",
                                        adam_impl_name(impl), zo_dtype_name(t), n, fresh, th, i, acc[i],
                                        (float)want[i]);
                        assert_int_equal(bad, 0);
                        assert_true(acc[n] == 12345.0f);
                        /* the statistics in the same pass: the sums' bits
                         * again, and the sum of squares of the new sums as
                         * a double loop gives it (to the additions'
                         * rounding) and as adam_grad_stats gives it after
                         * (bit for bit), on more and on fewer threads than
                         * the sums' */
                        if (th != 1 && th != 3) continue;
                        int ts = th % 3 + 1, nf = -1, nf2;
                        double ss = -1.0, ss2, ref = 0.0;
                        float *acc2 = xmalloc((n + 1) * 4);
                        if (fresh) for (size_t i = 0; i < n; i++) acc2[i] = NAN;
                        else memcpy(acc2, acc0, n * 4);
                        acc2[n] = 12345.0f;
                        assert_int_equal(adam_grad_accumulate_stats_impl(impl, acc2, g, t, n, fresh, th, ts, &ss, &nf),
                                         ZO_OK);
                        assert_memory_equal(acc2, acc, (n + 1) * 4);
                        for (size_t i = 0; i < n; i++) ref += (double)(float)want[i] * (double)(float)want[i];
                        /* (an inf in the sums: the fill reaches fp16's range) */
                        int close = isfinite(ref) ? fabs(ss - ref) <= 1e-15 * (double)(n + 1) * ref
                                                  : ss == ref || (isnan(ss) && isnan(ref));
                        if (!close)
                            fprintf(stderr, "%s %s n %zu fresh %d threads %d/%d: sum of squares %.17g, the double "
                                    "loop %.17g\n", adam_impl_name(impl), zo_dtype_name(t), n, fresh, th, ts, ss, ref);
                        assert_true(close);
                        assert_int_equal(adam_grad_stats_impl(impl, acc, ZO_DTYPE_F32, n, ts, &ss2, &nf2), ZO_OK);
                        if (memcmp(&ss, &ss2, sizeof ss))
                            fprintf(stderr, "%s %s n %zu threads %d/%d: sum of squares %a, adam_grad_stats %a\n",
                                    adam_impl_name(impl), zo_dtype_name(t), n, th, ts, ss, ss2);
                        assert_memory_equal(&ss, &ss2, sizeof ss);
                        assert_int_equal(nf, !isfinite(ref));
                        free(acc2);
                    }
                }
            }
            free(gbuf), free(acc0), free(acc), free(want);
        }
    /* the team: one thread below two chunks, else at most one per chunk */
    assert_int_equal(adam_grad_accumulate_threads(2 * c - 1, 8), 1);
    assert_int_equal(adam_grad_accumulate_threads(3 * c, 8), 3);
    assert_int_equal(adam_grad_accumulate_threads(100 * c, 4), 4);
    /* refused: a bad dtype, NULL, a misaligned or overlapping array */
    float a[8] = {0};
    assert_int_equal(adam_grad_accumulate(a, a + 4, (zo_dtype)7, 4, 0, 1), ZO_ERR_INVALID);
    assert_int_equal(adam_grad_accumulate(NULL, a, ZO_DTYPE_F32, 4, 0, 1), ZO_ERR_INVALID);
    assert_int_equal(adam_grad_accumulate(a, (char *)a + 17, ZO_DTYPE_BF16, 4, 0, 1), ZO_ERR_INVALID);
    assert_int_equal(adam_grad_accumulate(a, a + 2, ZO_DTYPE_F32, 4, 1, 1), ZO_ERR_INVALID);
    assert_int_equal(adam_grad_accumulate(a, NULL, ZO_DTYPE_F32, 0, 1, 1), ZO_OK);
    /* an inf in the sum: reported by the statistics */
    double ss;
    int nf;
    float big[300] = {0};
    big[257] = INFINITY;
    assert_int_equal(adam_grad_accumulate_stats(a, big + 256, ZO_DTYPE_F32, 4, 1, 1, 1, &ss, &nf), ZO_OK);
    assert_int_equal(nf, 1);
    assert_int_equal(adam_grad_accumulate_stats(a, big, ZO_DTYPE_F32, 4, 1, 1, 1, NULL, &nf), ZO_ERR_INVALID);
}

static void test_invalid_args(void **state)
{
    (void)state;
    float p[64], m[64], v[64], g[64];
    uint16_t o[64];
    memset(p, 0, sizeof p), memset(m, 0, sizeof m), memset(v, 0, sizeof v);
    memset(g, 0, sizeof g);
    adam_hparams ok = adam_hparams_default(), hp;
    assert_int_equal(adam_update(&ok, 64, p, g, ZO_DTYPE_F32, m, v, o, ZO_DTYPE_BF16, 1), ZO_OK);
    assert_int_equal(adam_update(NULL, 64, p, g, ZO_DTYPE_F32, m, v, NULL, 0, 1), ZO_ERR_INVALID);
#define BAD_HP(field, value)                                                                   \
    do {                                                                                       \
        hp = ok;                                                                               \
        hp.field = value;                                                                      \
        assert_int_equal(adam_update(&hp, 64, p, g, ZO_DTYPE_F32, m, v, NULL, 0, 1),           \
                         ZO_ERR_INVALID);                                                      \
        assert_non_null(strstr(zo_last_error(), #field));                                      \
    } while (0)
    BAD_HP(step, 0);
    BAD_HP(beta1, 1.0f);
    BAD_HP(beta2, -0.1f);
    BAD_HP(lr, NAN);
    BAD_HP(eps, -1.0f);
    BAD_HP(weight_decay, -0.5f);
    BAD_HP(grad_mult, 0.0f);
    BAD_HP(grad_mult, INFINITY);
    BAD_HP(decay, (adam_decay)7);
#undef BAD_HP
    /* dtypes */
    assert_int_equal(adam_update(&ok, 64, p, g, (zo_dtype)9, m, v, NULL, 0, 1), ZO_ERR_INVALID);
    assert_int_equal(adam_update(&ok, 64, p, g, ZO_DTYPE_F32, m, v, o, ZO_DTYPE_F32, 1),
                     ZO_ERR_INVALID);
    /* NULL, misaligned, overlapping arrays */
    assert_int_equal(adam_update(&ok, 64, p, NULL, ZO_DTYPE_F32, m, v, NULL, 0, 1), ZO_ERR_INVALID);
    assert_int_equal(adam_update(&ok, 8, (float *)((char *)p + 2), g, ZO_DTYPE_F32, m, v, NULL, 0,
                                 1),
                     ZO_ERR_INVALID);
    assert_int_equal(adam_update(&ok, 8, p, (char *)g + 1, ZO_DTYPE_F16, m, v, NULL, 0, 1),
                     ZO_ERR_INVALID);
    assert_int_equal(adam_update(&ok, 32, p, g, ZO_DTYPE_F32, p + 16, v, NULL, 0, 1),
                     ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "overlap"));
    assert_int_equal(adam_update(&ok, 16, p, g, ZO_DTYPE_F32, m, v, (uint16_t *)g + 4,
                                 ZO_DTYPE_F16, 1),
                     ZO_ERR_INVALID);
    /* n = 0 is a no-op, even with NULL arrays */
    assert_int_equal(adam_update(&ok, 0, NULL, NULL, ZO_DTYPE_F32, NULL, NULL, NULL, 0, 1), ZO_OK);
    /* implementations */
    assert_int_equal(adam_update_impl((adam_impl)42, &ok, 64, p, g, ZO_DTYPE_F32, m, v, NULL, 0, 1),
                     ZO_ERR_INVALID);
    for (int i = ADAM_IMPL_AVX2; i < ADAM_IMPL_COUNT; i++)
        if (!adam_impl_supported((adam_impl)i))
            assert_int_equal(adam_update_impl((adam_impl)i, &ok, 64, p, g, ZO_DTYPE_F32, m, v,
                                              NULL, 0, 1),
                             ZO_ERR_UNSUPPORTED);
    assert_int_not_equal(adam_best_impl(), ADAM_IMPL_AUTO);
    assert_true(adam_impl_supported(adam_best_impl()));
    assert_string_equal(adam_impl_name(ADAM_IMPL_AVX512), "avx512");
    /* stats */
    double s;
    int nf;
    assert_int_equal(adam_grad_stats(g, ZO_DTYPE_F32, 64, 1, NULL, &nf), ZO_ERR_INVALID);
    assert_int_equal(adam_grad_stats(NULL, ZO_DTYPE_F32, 64, 1, &s, &nf), ZO_ERR_INVALID);
    assert_int_equal(adam_grad_stats((char *)g + 1, ZO_DTYPE_BF16, 8, 1, &s, &nf), ZO_ERR_INVALID);
    assert_int_equal(adam_grad_stats(g, ZO_DTYPE_F32, 0, 1, &s, &nf), ZO_OK);
    assert_true(s == 0.0 && nf == 0);
}

int main(void)
{
    print_message("# best implementation here: %s%s\n", adam_impl_name(adam_best_impl()),
                  adam_avx512_has_bf16() ? " (AVX512-BF16 available)" : "");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_vs_double_adamw),
        cmocka_unit_test(test_reference_vs_double_l2),
        cmocka_unit_test(test_reference_vs_torch),
        cmocka_unit_test(test_bias_correction_step1),
        cmocka_unit_test(test_grad_mult),
        cmocka_unit_test(test_out16_rounding),
        cmocka_unit_test(test_impls_bitexact),
        cmocka_unit_test(test_impls_threads),
        cmocka_unit_test(test_subranges),
        cmocka_unit_test(test_grad_stats),
        cmocka_unit_test(test_grad_nonfinite),
        cmocka_unit_test(test_grad_accumulate),
        cmocka_unit_test(test_invalid_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
