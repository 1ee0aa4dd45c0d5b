/* cpu_adam's encoded optimizer state (bf16 and 8-bit block-wise m and v):
 * the layouts; the dynamic maps and the nearest-code rule against a double
 * precision reference written here from the paper's and bitsandbytes'
 * description (never the library's tables); one step against the same
 * reference in double, with the quantization error of every block; every
 * implementation against the scalar reference bit for bit (odd sizes,
 * partial blocks, shifted pointers, both decay modes, 16-bit copies,
 * inf/nan); thread-count independence; conversions to and from fp32 (every
 * implementation against the scalar coder bit for bit); and a
 * short training run whose final loss must stay within 2% of fp32 AdamW's. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/dtype.h"      /* zo_f32_bits, zo_f32_to_bf16, zo_load_f32 */
#include "cpu_adam/cpu_adam.h" /* adam_state_* */

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-52 - 1.0; }

static void *xmalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    assert_non_null(p);
    return p;
}

static const adam_impl all_impls[] = {ADAM_IMPL_SCALAR, ADAM_IMPL_AVX2, ADAM_IMPL_AVX512,
                                      ADAM_IMPL_AVX512_NO_BF16};
#define N_IMPLS 4

static int same_f32(float a, float b)
{
    if (isnan(a) && isnan(b)) return 1;
    return zo_f32_bits(a) == zo_f32_bits(b);
}

static int is_nan16(uint16_t h, zo_dtype t)
{
    return t == ZO_DTYPE_F16 ? (h & 0x7c00) == 0x7c00 && (h & 0x3ff)
                             : (h & 0x7f80) == 0x7f80 && (h & 0x7f);
}

/* The parts of a state buffer, from the public layout. */
typedef struct parts {
    adam_state_layout l;
    uint8_t *base;
} parts;

static parts parts_of(adam_state_kind k, void *state, size_t n)
{
    parts p = {.base = state};
    assert_int_equal(adam_state_layout_of(k, n, &p.l), ZO_OK);
    return p;
}
static uint8_t *qm_of(parts *p) { return p->base + p->l.off_m; }
static uint8_t *qv_of(parts *p) { return p->base + p->l.off_v; }
static float absmax_m(parts *p, size_t b)
{
    float a;
    memcpy(&a, p->base + p->l.off_absmax_m + 4 * b, 4);
    return a;
}
static float absmax_v(parts *p, size_t b)
{
    float a;
    memcpy(&a, p->base + p->l.off_absmax_v + 4 * b, 4);
    return a;
}

/* Two states of the same kind hold the same values: bytes of codes and bf16
 * moments equal (a bf16 nan equals any nan), absmax equal bit for bit or
 * both nan. Prints the first differences. */
static int diff_state(adam_state_kind k, size_t n, void *want, void *got, const char *what)
{
    parts a = parts_of(k, want, n), b = parts_of(k, got, n);
    int bad = 0;
    if (k.type == ADAM_STATE_BF16) {
        const uint16_t *x = (const uint16_t *)qm_of(&a), *y = (const uint16_t *)qm_of(&b);
        const uint16_t *xv = (const uint16_t *)qv_of(&a), *yv = (const uint16_t *)qv_of(&b);
        for (size_t i = 0; i < n; i++) {
            int ok = (x[i] == y[i] || (is_nan16(x[i], ZO_DTYPE_BF16) && is_nan16(y[i], ZO_DTYPE_BF16))) &&
                     (xv[i] == yv[i] || (is_nan16(xv[i], ZO_DTYPE_BF16) && is_nan16(yv[i], ZO_DTYPE_BF16)));
            if (!ok && bad++ < 4)
                print_error("%s: bf16 m/v[%zu]: want %04x %04x got %04x %04x\n", what, i, x[i],
                            xv[i], y[i], yv[i]);
        }
        return bad;
    }
    for (size_t i = 0; i < n; i++)
        if ((qm_of(&a)[i] != qm_of(&b)[i] || qv_of(&a)[i] != qv_of(&b)[i]) && bad++ < 4)
            print_error("%s: codes[%zu] (block %zu): want m %d v %d got m %d v %d\n", what, i,
                        i / k.block, qm_of(&a)[i], qv_of(&a)[i], qm_of(&b)[i], qv_of(&b)[i]);
    for (size_t bl = 0; bl < a.l.n_blocks; bl++)
        if ((!same_f32(absmax_m(&a, bl), absmax_m(&b, bl)) ||
             !same_f32(absmax_v(&a, bl), absmax_v(&b, bl))) &&
            bad++ < 4)
            print_error("%s: absmax of block %zu: want m %.9g v %.9g got m %.9g v %.9g\n", what,
                        bl, absmax_m(&a, bl), absmax_v(&a, bl), absmax_m(&b, bl),
                        absmax_v(&b, bl));
    return bad;
}

/* Hyperparameters away from the defaults (a slip in a constant shows). */
static adam_hparams hp_make(adam_decay decay, long step)
{
    return (adam_hparams){.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                          .weight_decay = 0.1f, .decay = decay, .step = step, .grad_mult = 0.75f};
}

/* ---- the reference maps and codes, in double ---------------------------------------------- */

/* bitsandbytes' create_dynamic_map (Dettmers et al. 2022, section 2): for
 * i = 0..6 the midpoints of linspace(0.1, 1, k + 1) times 10^(i-6), with
 * k = 2^i per sign (signed) or 2^(i+1) (unsigned); then 0 and 1; ascending. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void ref_map(double map[256], int is_signed)
{
    int n = 0;
    for (int i = 0; i < 7; i++) {
        int k = is_signed ? 1 << i : 2 << i;
        for (int j = 0; j < k; j++) {
            double lo = 0.1 + 0.9 * j / k, hi = 0.1 + 0.9 * (j + 1) / k;
            double val = pow(10.0, i - 6) * (lo + hi) / 2;
            map[n++] = val;
            if (is_signed) map[n++] = -val;
        }
    }
    map[n++] = 0.0;
    map[n++] = 1.0;
    assert_int_equal(n, 256);
    qsort(map, 256, sizeof *map, cmp_double);
}

static double map_m[256], map_v[256]; /* the reference maps, filled by main */

/* The code nearest to x by exhaustive search (the first on an exact tie). */
static int ref_nearest(const double map[256], double x)
{
    int best = 0;
    for (int k = 1; k < 256; k++)
        if (fabs(x - map[k]) < fabs(x - map[best])) best = k;
    return best;
}

/* Whether code k is as good as the nearest code to x up to the rounding of
 * x in fp32 (a few ulp): x lies within `rel` of the midpoint between them. */
static int ref_code_ok(const double map[256], double x, int k, double rel)
{
    int r = ref_nearest(map, x);
    if (k == r) return 1;
    if (abs(k - r) != 1) return 0;
    double mid = (map[k] + map[r]) / 2;
    return fabs(x - mid) <= rel * fabs(mid) + 1e-45;
}

/* Half the gap around x (the most a nearest-code rounding can move it). */
static double ref_half_gap(const double map[256], double x)
{
    if (x <= map[0]) return map[0] - x;
    if (x >= map[255]) return x - map[255];
    int k = 0;
    while (map[k + 1] < x) k++;
    return (map[k + 1] - map[k]) / 2;
}

/* ---- layouts, names --------------------------------------------------------------------- */

static uint64_t r64(uint64_t x) { return (x + 63) / 64 * 64; }

static void test_layouts(void **state)
{
    (void)state;
    static const uint64_t ns[] = {0, 1, 63, 64, 2047, 2048, 2049, 6143, 6738415616ull};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        uint64_t n = ns[i], nb = (n + 2047) / 2048;
        assert_int_equal(adam_state_bytes(adam_state_f32(), n), r64(4 * n) + 4 * n);
        assert_int_equal(adam_state_bytes(adam_state_bf16(), n), r64(2 * n) + 2 * n);
        adam_state_layout l;
        assert_int_equal(adam_state_layout_of(adam_state_q8(2048), n, &l), ZO_OK);
        assert_int_equal(l.n_blocks, nb);
        assert_int_equal(l.off_m, 0);
        assert_int_equal(l.off_v, r64(n));
        assert_int_equal(l.off_absmax_m, r64(r64(n) + n));
        assert_int_equal(l.off_absmax_v, r64(l.off_absmax_m + 4 * nb));
        assert_int_equal(l.bytes, l.off_absmax_v + 4 * nb);
        assert_int_equal(adam_state_bytes(adam_state_q8(2048), n), l.bytes);
    }
    /* LLaMA-2-7B's 6.74e9 parameters: 53.9 GB of fp32 moments, 13.5 GB in q8
     * (2 bytes + 8 per 2048: 2.0039 a parameter) */
    double n7 = 6738415616.0;
    assert_true(fabs(adam_state_bytes(adam_state_q8(2048), 6738415616ull) / n7 - 2.00390625) < 1e-6);
    assert_true(adam_state_bytes_per_param(adam_state_f32()) == 8.0);
    assert_true(adam_state_bytes_per_param(adam_state_bf16()) == 4.0);
    assert_true(adam_state_bytes_per_param(adam_state_q8(2048)) == 2.00390625);
    assert_true(adam_state_bytes_per_param(adam_state_q8(256)) == 2.03125);
    /* names */
    adam_state_kind k;
    assert_int_equal(adam_state_parse("q8", &k), ZO_OK);
    assert_true(k.type == ADAM_STATE_Q8 && k.block == ADAM_Q8_BLOCK);
    assert_int_equal(adam_state_parse("q8/256", &k), ZO_OK);
    assert_true(k.type == ADAM_STATE_Q8 && k.block == 256);
    assert_int_equal(adam_state_parse("bf16", &k), ZO_OK);
    assert_string_equal(adam_state_name(k), "bf16");
    assert_int_equal(adam_state_parse("fp32", &k), ZO_OK);
    assert_string_equal(adam_state_name(k), "fp32");
    assert_string_equal(adam_state_name(adam_state_q8(64)), "q8");
    static const char *bad[] = {"q8/100", "q8/0", "q8/8192", "q8/", "q8/2048x", "fp16", "", "Q8"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(adam_state_parse(bad[i], &k), ZO_ERR_INVALID);
        assert_non_null(strstr(zo_last_error(), bad[i]));
    }
    assert_int_equal(adam_state_check("t", adam_state_q8(4096 + 64)), ZO_ERR_INVALID);
    assert_int_equal(adam_state_check("t", (adam_state_kind){ADAM_STATE_BF16, 64}), ZO_ERR_INVALID);
    assert_int_equal(adam_state_check("t", (adam_state_kind){(adam_state_type)9, 0}), ZO_ERR_INVALID);
    assert_int_equal(adam_state_bytes((adam_state_kind){ADAM_STATE_Q8, 7}, 100), 0);
}

/* ---- the maps and the nearest code -------------------------------------------------------- */

/* A q8 state whose absmax is 1 and whose codes are 0..255 reads back as the
 * maps, rounded once to fp32. */
static void test_q8_maps(void **state)
{
    (void)state;
    adam_state_kind k = adam_state_q8(256);
    void *st = xmalloc(adam_state_bytes(k, 256));
    parts p = parts_of(k, st, 256);
    for (int c = 0; c < 256; c++) qm_of(&p)[c] = qv_of(&p)[c] = (uint8_t)c;
    float one = 1.0f;
    memcpy(p.base + p.l.off_absmax_m, &one, 4);
    memcpy(p.base + p.l.off_absmax_v, &one, 4);
    float m[256], v[256];
    assert_int_equal(adam_state_to_f32(k, st, 256, m, v, 1), ZO_OK);
    for (int c = 0; c < 256; c++) {
        if (m[c] != (float)map_m[c] || v[c] != (float)map_v[c])
            print_error("code %d: m %.9g (want %.9g) v %.9g (want %.9g)\n", c, m[c],
                        (float)map_m[c], v[c], (float)map_v[c]);
        assert_true(m[c] == (float)map_m[c] && v[c] == (float)map_v[c]);
    }
    /* the paper's landmarks */
    assert_true(m[127] == 0.0f && m[255] == 1.0f && v[0] == 0.0f && v[255] == 1.0f);
    assert_true(fabs(m[0] + 0.99296875) < 1e-7);  /* -(0.1 + 0.9 * 63.5/64): no -1 */
    assert_true(fabs(m[128] - 5.5e-7) < 1e-13);   /* 1e-6 * (0.1 + 1) / 2 */
    assert_true(fabs(v[1] - 3.25e-7) < 1e-13);    /* 1e-6 * (0.1 + 0.55) / 2 */
    assert_true(fabs(v[254] - 0.996484375) < 1e-7); /* 0.1 + 0.9 * 127.5/128 */
    free(st);
}

/* One step with beta1 = beta2 = 0 and lr = 0 sets m = g and v = g * g
 * exactly; a block whose largest |g| is 1 codes m and v unscaled. So the
 * quantizer of every implementation sees chosen values: on, just below
 * and above every threshold of both maps (the thresholds taken from the
 * reference maps), 0, -0, the ends, random ones. Each code must be a
 * nearest code of the reference (up to fp32 rounding near a midpoint), the
 * same in every implementation, with a value on an fp32 threshold taking the
 * lower index. */
static void test_q8_nearest_codes(void **state)
{
    (void)state;
    adam_state_kind k = adam_state_q8(256);
    size_t n = 0, cap = 256 * 64;
    float *g = xmalloc(cap * 4);
    uint64_t seed = 5;
    /* block layout: element 0 of every block is 1 (the absmax) */
    for (int t = 0; t < 255 && n + 20 < cap; t++) {
        /* the fp32 thresholds: midpoints of the fp32 map values */
        double thm = ((double)(float)map_m[t] + (float)map_m[t + 1]) / 2;
        double thv = ((double)(float)map_v[t] + (float)map_v[t + 1]) / 2;
        for (int d = -2; d <= 2; d++) {
            float fm = (float)thm, fv = sqrtf((float)thv);
            uint32_t um = zo_f32_bits(fm) + (uint32_t)d, uv = zo_f32_bits(fv) + (uint32_t)d;
            if (n % 256 == 0) g[n++] = 1.0f;
            g[n++] = zo_bits_f32(um);
            if (n % 256 == 0) g[n++] = 1.0f;
            g[n++] = zo_bits_f32(uv);
        }
    }
    while (n < cap) {
        if (n % 256 == 0) {
            g[n] = n % 512 ? -1.0f : 1.0f;
            n++;
            continue;
        }
        double r = rng_unit(&seed);
        switch (rng_next(&seed) % 8) {
        case 0: g[n++] = 0.0f; break;
        case 1: g[n++] = -0.0f; break;
        case 2: g[n++] = (float)(r * pow(10.0, -7.0 * fabs(rng_unit(&seed)))); break;
        default: g[n++] = (float)r; break;
        }
    }
    adam_hparams hp = adam_hparams_default();
    hp.lr = 0.0f;
    hp.weight_decay = 0.0f;
    hp.beta1 = 0.0f;
    hp.beta2 = 0.0f;
    void *ref = NULL;
    float *p = xmalloc(n * 4);
    int near_ties = 0;
    for (int ii = 0; ii < N_IMPLS; ii++) {
        if (!adam_impl_supported(all_impls[ii])) continue;
        void *st = xmalloc(adam_state_bytes(k, n));
        memset(p, 0, n * 4);
        assert_int_equal(adam_state_init(k, st, n, 1), ZO_OK);
        assert_int_equal(adam_state_update_impl(all_impls[ii], &hp, k, n, p, g, ZO_DTYPE_F32, st,
                                                NULL, ZO_DTYPE_F16, 1),
                         ZO_OK);
        if (!ref) {
            ref = st;
            parts q = parts_of(k, st, n);
            int bad = 0;
            for (size_t i = 0; i < n; i++) {
                size_t b = i / 256;
                double am = absmax_m(&q, b), av = absmax_v(&q, b);
                assert_true(am == 1.0 && av == 1.0);
                double xm = g[i] / am, xv = (double)(g[i] * g[i]) / av;
                int cm = qm_of(&q)[i], cv = qv_of(&q)[i];
                if (cm != ref_nearest(map_m, xm) || cv != ref_nearest(map_v, xv)) near_ties++;
                if ((!ref_code_ok(map_m, xm, cm, 1e-6) || !ref_code_ok(map_v, xv, cv, 1e-6)) &&
                    bad++ < 6)
                    print_error("g[%zu] = %.9g: m code %d (nearest %d), v code %d (nearest %d)\n",
                                i, g[i], cm, ref_nearest(map_m, xm), cv, ref_nearest(map_v, xv));
                /* on an fp32 threshold: the lower index */
                float tm = (float)(((double)(float)map_m[cm] + (float)map_m[cm > 0 ? cm - 1 : 0]) / 2);
                if (cm > 0 && (float)xm == tm && bad++ < 6)
                    print_error("g[%zu] = %.9g on a threshold took the upper code %d\n", i, g[i],
                                cm);
            }
            assert_int_equal(bad, 0);
        } else {
            assert_int_equal(diff_state(k, n, ref, st, adam_impl_name(all_impls[ii])), 0);
            free(st);
        }
    }
    /* only values within fp32 rounding of a midpoint may differ from the
     * exhaustive double search, and there are a few (the threshold +-2 ulp) */
    print_message("# %zu values coded; %d within fp32 rounding of a midpoint\n", n, near_ties);
    assert_true(near_ties < 300);
    free(ref), free(p), free(g);
}

/* ---- one step against the double reference ------------------------------------------------ */

typedef struct worst {
    double m_abs, v_abs; /* max |dequantized - exact| / absmax over the blocks */
    double m_rel, v_rel; /* max relative error where |value| >= absmax / 10 */
} worst;

/* One AdamW step of the q8 state in double, from the decoded state: every
 * parameter, absmax and code of `got` (the kernel's step from `before`)
 * checked; the errors of the coded moments gathered in *w. */
static int check_q8_step(const adam_hparams *hps, size_t every, adam_state_kind k, size_t n,
                         const float *p0, const float *g, void *before, const float *p1,
                         void *got, worst *w)
{
    parts a = parts_of(k, before, n), b = parts_of(k, got, n);
    double *m = xmalloc(n * 8), *v = xmalloc(n * 8);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        /* (element i's hyperparameters: hps[i / every], or hps[0]) */
        const adam_hparams *hp = &hps[every ? i / every : 0];
        double lr = hp->lr, b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps, wd = hp->weight_decay;
        double bc1 = 1.0 - pow(b1, (double)hp->step), bc2 = 1.0 - pow(b2, (double)hp->step);
        size_t bl = i / k.block;
        double mo = map_m[qm_of(&a)[i]] * absmax_m(&a, bl), vo = map_v[qv_of(&a)[i]] * absmax_v(&a, bl);
        double gi = (double)g[i] * hp->grad_mult, pi = p0[i];
        if (hp->decay == ADAM_DECAY_L2) gi += wd * pi;
        else pi *= 1.0 - lr * wd;
        m[i] = b1 * mo + (1 - b1) * gi;
        v[i] = b2 * vo + (1 - b2) * gi * gi;
        pi -= lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
        if (fabs(p1[i] - pi) > 2e-6 * fabs(pi) + 1e-7 && bad++ < 4)
            print_error("p[%zu]: %.9g, double %.12g\n", i, p1[i], pi);
    }
    for (size_t bl = 0; bl < a.l.n_blocks; bl++) {
        size_t i0 = bl * k.block, i1 = i0 + k.block < n ? i0 + k.block : n;
        double am = 0, av = 0;
        for (size_t i = i0; i < i1; i++) am = fmax(am, fabs(m[i])), av = fmax(av, v[i]);
        double gm = absmax_m(&b, bl), gv = absmax_v(&b, bl);
        if ((fabs(gm - am) > 1e-6 * am || fabs(gv - av) > 1e-6 * av) && bad++ < 4)
            print_error("block %zu absmax: m %.9g v %.9g, double %.12g %.12g\n", bl, gm, gv, am, av);
        for (size_t i = i0; i < i1; i++) {
            int cm = qm_of(&b)[i], cv = qv_of(&b)[i];
            if ((!ref_code_ok(map_m, m[i] / am, cm, 2e-6) || !ref_code_ok(map_v, v[i] / av, cv, 2e-6)) &&
                bad++ < 4)
                print_error("codes[%zu]: m %d (nearest %d) v %d (nearest %d)\n", i, cm,
                            ref_nearest(map_m, m[i] / am), cv, ref_nearest(map_v, v[i] / av));
            /* the rounding error: at most half the gap around the value */
            double em = fabs(map_m[cm] * gm - m[i]), ev = fabs(map_v[cv] * gv - v[i]);
            double bm = ref_half_gap(map_m, m[i] / am) * am, bv = ref_half_gap(map_v, v[i] / av) * av;
            if ((em > bm * (1 + 1e-5) + 1e-6 * am || ev > bv * (1 + 1e-5) + 1e-6 * av) && bad++ < 4)
                print_error("codes[%zu]: error m %.3g (bound %.3g) v %.3g (bound %.3g)\n", i, em,
                            bm, ev, bv);
            w->m_abs = fmax(w->m_abs, em / am);
            w->v_abs = fmax(w->v_abs, ev / av);
            if (fabs(m[i]) >= am / 10) w->m_rel = fmax(w->m_rel, em / fabs(m[i]));
            if (v[i] >= av / 10) w->v_rel = fmax(w->v_rel, ev / v[i]);
        }
    }
    free(m), free(v);
    return bad;
}

/* Ten steps of every implementation; each step checked against the double
 * reference from the state the kernel started it with (so the reference
 * follows the kernel instead of drifting from it). */
static void test_q8_step_vs_double(void **state)
{
    (void)state;
    static const uint32_t blocks[] = {2048, 256};
    for (size_t bi = 0; bi < 2; bi++)
        for (int ii = 0; ii < N_IMPLS; ii++) {
            if (!adam_impl_supported(all_impls[ii])) continue;
            adam_state_kind k = adam_state_q8(blocks[bi]);
            const size_t n = 3 * 2048 + 77;
            size_t sb = adam_state_bytes(k, n);
            float *p = xmalloc(n * 4), *p0 = xmalloc(n * 4), *g = xmalloc(n * 4);
            void *st = xmalloc(sb), *st0 = xmalloc(sb);
            uint64_t seed = 77 + bi;
            for (size_t i = 0; i < n; i++) p[i] = (float)rng_unit(&seed);
            assert_int_equal(adam_state_init(k, st, n, 2), ZO_OK);
            worst w = {0};
            for (int t = 1; t <= 10; t++) {
                adam_hparams hp = hp_make(t % 2 ? ADAM_DECAY_ADAMW : ADAM_DECAY_L2, t);
                /* gradient scales that differ from block to block */
                for (size_t i = 0; i < n; i++)
                    g[i] = (float)(rng_unit(&seed) * pow(10.0, (double)((i / 997) % 5) - 3));
                memcpy(p0, p, n * 4);
                memcpy(st0, st, sb);
                assert_int_equal(adam_state_update_impl(all_impls[ii], &hp, k, n, p, g,
                                                        ZO_DTYPE_F32, st, NULL, ZO_DTYPE_F16, 2),
                                 ZO_OK);
                assert_int_equal(check_q8_step(&hp, 0, k, n, p0, g, st0, p, st, &w), 0);
            }
            if (ii == 0)
                print_message("# q8/%u: largest error / absmax: m %.5f v %.5f; relative error "
                              "where |value| >= absmax/10: m %.4f v %.4f\n",
                              blocks[bi], w.m_abs, w.v_abs, w.m_rel, w.v_rel);
            /* the maps' half gaps: m 0.0070 (around 1), v 0.0035 */
            assert_true(w.m_abs <= 0.00704 && w.v_abs <= 0.00353);
            free(p), free(p0), free(g), free(st), free(st0);
        }
}

/* bf16 state: the step in double from the widened moments; the parameter
 * within fp32 rounding, the stored moments the nearest bf16 of the exact
 * ones (either neighbour within fp32 rounding of a tie). */
static void test_bf16_step_vs_double(void **state)
{
    (void)state;
    adam_state_kind k = adam_state_bf16();
    const size_t n = 1000 + 13;
    size_t sb = adam_state_bytes(k, n);
    for (int ii = 0; ii < N_IMPLS; ii++) {
        if (!adam_impl_supported(all_impls[ii])) continue;
        float *p = xmalloc(n * 4), *p0 = xmalloc(n * 4), *g = xmalloc(n * 4);
        void *st = xmalloc(sb), *st0 = xmalloc(sb);
        uint64_t seed = 3;
        for (size_t i = 0; i < n; i++) p[i] = (float)rng_unit(&seed);
        assert_int_equal(adam_state_init(k, st, n, 1), ZO_OK);
        int bad = 0;
        for (int t = 1; t <= 10 && !bad; t++) {
            adam_hparams hp = hp_make(ADAM_DECAY_ADAMW, t);
            for (size_t i = 0; i < n; i++) g[i] = (float)rng_unit(&seed);
            memcpy(p0, p, n * 4);
            memcpy(st0, st, sb);
            assert_int_equal(adam_state_update_impl(all_impls[ii], &hp, k, n, p, g, ZO_DTYPE_F32,
                                                    st, NULL, ZO_DTYPE_F16, 1),
                             ZO_OK);
            parts a = parts_of(k, st0, n), b = parts_of(k, st, n);
            const uint16_t *m0 = (const uint16_t *)qm_of(&a), *v0 = (const uint16_t *)qv_of(&a);
            const uint16_t *m1 = (const uint16_t *)qm_of(&b), *v1 = (const uint16_t *)qv_of(&b);
            double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr;
            double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
            for (size_t i = 0; i < n; i++) {
                double gi = (double)g[i] * hp.grad_mult;
                double m = b1 * zo_bf16_to_f32(m0[i]) + (1 - b1) * gi;
                double v = b2 * zo_bf16_to_f32(v0[i]) + (1 - b2) * gi * gi;
                double pi = p0[i] * (1 - lr * hp.weight_decay) -
                            lr / bc1 * m / (sqrt(v) / sqrt(bc2) + hp.eps);
                if (fabs(p[i] - pi) > 2e-6 * fabs(pi) + 1e-7 && bad++ < 4)
                    print_error("%s p[%zu]: %.9g double %.12g\n", adam_impl_name(all_impls[ii]), i,
                                p[i], pi);
                /* the stored value is within half a bf16 ulp (8 significant
                 * bits) plus the fp32 rounding of the update */
                double em = fabs(zo_bf16_to_f32(m1[i]) - m), ev = fabs(zo_bf16_to_f32(v1[i]) - v);
                double hm = ldexp(1.0, ilogb(m) - 8), hv = ldexp(1.0, ilogb(v) - 8);
                /* (m may cancel: its fp32 error scales with its terms) */
                double mterms = fabs(b1 * zo_bf16_to_f32(m0[i])) + fabs((1 - b1) * gi);
                if ((em > hm + 1e-6 * mterms || ev > hv + 1e-6 * v) && bad++ < 4)
                    print_error("m/v[%zu]: %.9g %.9g double %.12g %.12g\n", i,
                                zo_bf16_to_f32(m1[i]), zo_bf16_to_f32(v1[i]), m, v);
            }
        }
        assert_int_equal(bad, 0);
        free(p), free(p0), free(g), free(st), free(st0);
    }
}

/* ---- implementations against the scalar reference ---------------------------------------- */

/* Gradients that stress the update, the roundings and the blocks: ordinary
 * values of a per-block scale, zeros, tiny and huge ones, now and then
 * inf/nan (which makes its q8 block nan from then on). */
static float special_grad(size_t i, uint64_t *s, int with_nonfinite)
{
    switch (rng_next(s) % 128) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return 1e-30f;
    case 3: return 6.0e4f;
    case 4: return with_nonfinite ? ((i % 3) ? INFINITY : NAN) : 1.0f;
    default: return (float)(3.0 * rng_unit(s) * pow(10.0, (double)((i / 300) % 7) - 4));
    }
}

typedef struct bx_case {
    adam_state_kind kind;
    adam_impl impl;
    zo_dtype gd, od;
    int with_out;
    adam_decay decay;
    size_t n, off;
    int threads, nonfinite;
} bx_case;

/* Steps of c->impl and of the scalar reference from the same inputs: the
 * parameters, the 16-bit copies and the states equal bit for bit. The
 * arrays (not the state) are shifted by c->off elements from a 64-byte
 * boundary. */
static int run_bitexact(const bx_case *c, int steps)
{
    size_t N = c->off + c->n + 5, gs = zo_dtype_size(c->gd);
    size_t sb = adam_state_bytes(c->kind, c->n);
    float *p[2];
    uint16_t *o[2];
    void *st[2];
    char *g = xmalloc(N * gs);
    uint64_t seed = 99 + c->n * 7 + c->off;
    for (int k = 0; k < 2; k++) {
        p[k] = xmalloc(N * 4);
        o[k] = xmalloc(N * 2);
        st[k] = xmalloc(sb);
        memset(o[k], 0xab, N * 2);
        assert_int_equal(adam_state_init(c->kind, st[k], c->n, 1), ZO_OK);
    }
    for (size_t i = 0; i < N; i++) p[0][i] = p[1][i] = (float)(2 * rng_unit(&seed));
    int bad = 0;
    for (int t = 1; t <= steps && !bad; t++) {
        adam_hparams hp = hp_make(c->decay, t);
        for (size_t i = 0; i < N; i++)
            zo_store_f32(g, c->gd, i, special_grad(i, &seed, c->nonfinite));
        for (int k = 0; k < 2; k++) {
            adam_impl impl = k ? c->impl : ADAM_IMPL_SCALAR;
            assert_int_equal(adam_state_update_impl(impl, &hp, c->kind, c->n, p[k] + c->off,
                                                    g + c->off * gs, c->gd, st[k],
                                                    c->with_out ? o[k] + c->off : NULL, c->od,
                                                    k ? c->threads : 1),
                             ZO_OK);
        }
        for (size_t i = 0; i < N; i++) {
            int same_o = o[0][i] == o[1][i] || (is_nan16(o[0][i], c->od) && is_nan16(o[1][i], c->od));
            if ((!same_f32(p[0][i], p[1][i]) || !same_o) && bad++ < 4)
                print_error("p/out16[%zu]: want %.9g %04x got %.9g %04x\n", i, p[0][i], o[0][i],
                            p[1][i], o[1][i]);
            if ((i < c->off || i >= c->off + c->n) && o[1][i] != 0xabab && bad++ < 4)
                print_error("out16[%zu] outside the range written\n", i);
        }
        bad += diff_state(c->kind, c->n, st[0], st[1], adam_impl_name(c->impl));
    }
    if (bad)
        print_error("case: state %s/%u impl %s grad %s out %s decay %d n %zu off %zu threads %d\n",
                    adam_state_name(c->kind), c->kind.block, adam_impl_name(c->impl),
                    zo_dtype_name(c->gd), c->with_out ? zo_dtype_name(c->od) : "none",
                    (int)c->decay, c->n, c->off, c->threads);
    for (int k = 0; k < 2; k++) free(p[k]), free(o[k]), free(st[k]);
    free(g);
    return bad;
}

static void test_impls_bitexact(void **state)
{
    (void)state;
    static const size_t lens[] = {1, 7, 15, 16, 17, 63, 64, 65, 255, 257, 2047, 2048, 2049, 4096 + 13};
    const adam_state_kind ks[4] = {adam_state_bf16(), adam_state_q8(2048), adam_state_q8(256),
                                   adam_state_q8(64)};
    static const zo_dtype dts[] = {ZO_DTYPE_F32, ZO_DTYPE_F16, ZO_DTYPE_BF16};
    int ran = 0;
    for (int ii = 1; ii < N_IMPLS; ii++) {
        if (!adam_impl_supported(all_impls[ii])) continue;
        for (int ki = 0; ki < 4; ki++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (int gi = 0; gi < 3; gi++) {
                    /* the copy's type and the decay mode vary with the case */
                    int variant = (int)(li + gi + ki);
                    bx_case c = {
                        .kind = ks[ki],
                        .impl = all_impls[ii],
                        .gd = dts[gi],
                        .od = variant % 2 ? ZO_DTYPE_BF16 : ZO_DTYPE_F16,
                        .with_out = variant % 3 != 0,
                        .decay = variant % 4 < 2 ? ADAM_DECAY_ADAMW : ADAM_DECAY_L2,
                        .n = lens[li],
                        .off = (size_t)(variant % 4),
                        .threads = 1 + variant % 2,
                        .nonfinite = li % 2,
                    };
                    assert_int_equal(run_bitexact(&c, 3), 0);
                    ran++;
                }
    }
    print_message("# %d bit-exact cases\n", ran);
}

/* Threads take whole blocks: 1 to 4 threads give the bits of one. */
static void test_threads_independent(void **state)
{
    (void)state;
    adam_state_kind ks[3] = {adam_state_q8(2048), adam_state_q8(64), adam_state_bf16()};
    for (int ii = 0; ii < N_IMPLS; ii++) {
        if (!adam_impl_supported(all_impls[ii])) continue;
        for (int ki = 0; ki < 3; ki++)
            for (int th = 2; th <= 4; th++) {
                bx_case c = {.kind = ks[ki], .impl = all_impls[ii], .gd = ZO_DTYPE_BF16,
                             .od = ZO_DTYPE_BF16, .with_out = 1, .decay = ADAM_DECAY_ADAMW,
                             .n = 4 * 32768 + 2048 * 3 + 11, .off = 0, .threads = th};
                assert_int_equal(run_bitexact(&c, 2), 0);
            }
    }
}

/* ---- zero state, conversions ---------------------------------------------------------------- */

/* adam_state_init and a buffer of zero bytes are the same zero state: the
 * same step from either gives the same parameters and state, and both read
 * back as zeros; adam_state_from_f32 of zeros writes adam_state_init's
 * bytes. */
static void test_zero_state(void **state)
{
    (void)state;
    adam_state_kind ks[3] = {adam_state_f32(), adam_state_bf16(), adam_state_q8(2048)};
    const size_t n = 2048 + 100;
    for (int ki = 0; ki < 3; ki++) {
        adam_state_kind k = ks[ki];
        size_t sb = adam_state_bytes(k, n);
        void *a = xmalloc(sb), *b = xmalloc(sb);
        memset(a, 0x5a, sb);
        assert_int_equal(adam_state_init(k, a, n, 2), ZO_OK);
        /* coding zeros writes adam_state_init's bytes, every one (the
         * runtime's puts of zero moments write the zero state so) */
        float *zeros = calloc(n, sizeof(float));
        assert_non_null(zeros);
        memset(b, 0xa5, sb);
        assert_int_equal(adam_state_from_f32(k, b, n, zeros, zeros, 2), ZO_OK);
        assert_memory_equal(a, b, sb);
        free(zeros);
        memset(b, 0, sb);
        float *m = xmalloc(n * 4), *v = xmalloc(n * 4), *pa = xmalloc(n * 4), *pb = xmalloc(n * 4);
        float *g = xmalloc(n * 4);
        assert_int_equal(adam_state_to_f32(k, a, n, m, v, 1), ZO_OK);
        for (size_t i = 0; i < n; i++) assert_true(zo_f32_bits(m[i]) == 0 && zo_f32_bits(v[i]) == 0);
        uint64_t seed = 1;
        for (size_t i = 0; i < n; i++) {
            pa[i] = pb[i] = (float)rng_unit(&seed);
            g[i] = i % 5 ? (float)rng_unit(&seed) : (i % 10 ? 0.0f : -0.0f);
        }
        adam_hparams hp = hp_make(ADAM_DECAY_ADAMW, 1);
        assert_int_equal(adam_state_update(&hp, k, n, pa, g, ZO_DTYPE_F32, a, NULL, ZO_DTYPE_F16, 1), ZO_OK);
        assert_int_equal(adam_state_update(&hp, k, n, pb, g, ZO_DTYPE_F32, b, NULL, ZO_DTYPE_F16, 1), ZO_OK);
        for (size_t i = 0; i < n; i++) assert_true(same_f32(pa[i], pb[i]));
        if (k.type == ADAM_STATE_F32) {
            /* fp32 keeps the sign of a zero moment; the values agree */
            assert_int_equal(adam_state_to_f32(k, a, n, m, v, 1), ZO_OK);
            assert_int_equal(adam_state_to_f32(k, b, n, pa, pb, 1), ZO_OK);
            for (size_t i = 0; i < n; i++) assert_true(m[i] == pa[i] && v[i] == pb[i]);
        } else {
            assert_int_equal(diff_state(k, n, a, b, "zero bytes"), 0);
        }
        free(a), free(b), free(m), free(v), free(pa), free(pb), free(g);
    }
}

/* Conversions: exact for fp32 and for what a bf16 or q8 state holds; from
 * fp32 as the step stores; a q8 state survives to_f32 + from_f32 unchanged
 * where each block's largest |m| is positive (a negative one is stored as
 * -0.99296875 * absmax, so the round trip scales that block's absmax by
 * 0.99296875, within the coding error). */
static void test_conversions(void **state)
{
    (void)state;
    const size_t n = 3 * 2048 + 333;
    uint64_t seed = 11;
    float *m = xmalloc(n * 4), *v = xmalloc(n * 4), *m2 = xmalloc(n * 4), *v2 = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        double scale = pow(10.0, (double)(i % 9) - 8);
        m[i] = (float)(rng_unit(&seed) * scale);
        v[i] = (float)(fabs(rng_unit(&seed)) * scale * scale);
    }
    m[5] = 2.0f; /* block 0's largest |m| positive, block 1's negative */
    m[2048 + 7] = -3.0f;
    /* bf16 */
    adam_state_kind kb = adam_state_bf16(), kq = adam_state_q8(2048);
    void *sb = xmalloc(adam_state_bytes(kb, n)), *sb2 = xmalloc(adam_state_bytes(kb, n));
    assert_int_equal(adam_state_from_f32(kb, sb, n, m, v, 2), ZO_OK);
    assert_int_equal(adam_state_to_f32(kb, sb, n, m2, v2, 2), ZO_OK);
    for (size_t i = 0; i < n; i++)
        assert_true(m2[i] == zo_bf16_to_f32(zo_f32_to_bf16(m[i])) &&
                    v2[i] == zo_bf16_to_f32(zo_f32_to_bf16(v[i])));
    assert_int_equal(adam_state_from_f32(kb, sb2, n, m2, v2, 1), ZO_OK);
    assert_memory_equal(sb, sb2, adam_state_bytes(kb, n));
    /* q8 from fp32: the codes are the nearest, the error within half a gap */
    void *sq = xmalloc(adam_state_bytes(kq, n)), *sq2 = xmalloc(adam_state_bytes(kq, n));
    memset(sq, 0x77, adam_state_bytes(kq, n));
    assert_int_equal(adam_state_from_f32(kq, sq, n, m, v, 2), ZO_OK);
    assert_int_equal(adam_state_to_f32(kq, sq, n, m2, v2, 1), ZO_OK);
    parts q = parts_of(kq, sq, n);
    for (size_t i = 0; i < n; i++) {
        size_t b = i / 2048;
        double am = absmax_m(&q, b), av = absmax_v(&q, b);
        assert_true(ref_code_ok(map_m, m[i] / am, qm_of(&q)[i], 1e-6));
        assert_true(ref_code_ok(map_v, v[i] / av, qv_of(&q)[i], 1e-6));
        assert_true(fabs(m2[i] - m[i]) <= ref_half_gap(map_m, m[i] / am) * am * (1 + 1e-5) + 1e-7 * am);
        assert_true(fabs(v2[i] - v[i]) <= ref_half_gap(map_v, v[i] / av) * av * (1 + 1e-5) + 1e-7 * av);
    }
    assert_true(absmax_m(&q, 0) == 2.0f && absmax_m(&q, 1) == 3.0f);
    assert_true(m2[2048 + 7] == (float)map_m[0] * 3.0f);
    /* ... and back: unchanged but for block 1's m */
    assert_int_equal(adam_state_from_f32(kq, sq2, n, m2, v2, 3), ZO_OK);
    parts q2 = parts_of(kq, sq2, n);
    for (size_t b = 0; b < q.l.n_blocks; b++) {
        assert_true(absmax_v(&q, b) == absmax_v(&q2, b));
        if (b != 1) assert_true(absmax_m(&q, b) == absmax_m(&q2, b));
    }
    assert_true(absmax_m(&q2, 1) == -m2[2048 + 7]);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(qv_of(&q)[i], qv_of(&q2)[i]);
        if (i / 2048 != 1) assert_int_equal(qm_of(&q)[i], qm_of(&q2)[i]);
    }
    /* the whole buffer is determined by the state (the gaps are zero) */
    memset(sq2, 0x11, adam_state_bytes(kq, n));
    assert_int_equal(adam_state_from_f32(kq, sq2, n, m, v, 1), ZO_OK);
    assert_memory_equal(sq, sq2, adam_state_bytes(kq, n));
    /* special values: nan poisons its block, a block of subnormals is 0 */
    m[10] = NAN;
    for (size_t i = 2048; i < 4096; i++) m[i] = v[i] = 1e-40f;
    assert_int_equal(adam_state_from_f32(kq, sq, n, m, v, 1), ZO_OK);
    assert_int_equal(adam_state_to_f32(kq, sq, n, m2, v2, 1), ZO_OK);
    for (size_t i = 0; i < 2048; i++) assert_true(isnan(m2[i]) && !isnan(v2[i]));
    for (size_t i = 2048; i < 4096; i++) assert_true(m2[i] == 0.0f && v2[i] == 0.0f);
    /* a negative v is refused, named */
    v[4321] = -1.0f;
    assert_int_equal(adam_state_from_f32(kq, sq, n, m, v, 2), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "v[4321]"));
    free(m), free(v), free(m2), free(v2), free(sb), free(sb2), free(sq), free(sq2);
}

/* A moment value that stresses the coders: ordinary values of a per-block
 * scale, +-0, subnormals, huge values, and (where `special`) inf, -inf, nan
 * with either sign; v's are magnitudes (a -0 allowed: only v < 0 is refused). */
static float conv_value(size_t i, uint64_t *s, int is_v, int special)
{
    float x;
    switch (rng_next(s) % 64) {
    case 0: x = 0.0f; break;
    case 1: x = -0.0f; break;
    case 2: x = 1e-40f; break;
    case 3: x = -3e-39f; break;
    case 4: x = 3e38f; break;
    case 5: x = special ? INFINITY : 1.0f; break;
    case 6: x = special ? -INFINITY : 1.0f; break;
    case 7: x = special ? (rng_next(s) & 1 ? NAN : -NAN) : 1.0f; break;
    default: x = (float)(rng_unit(s) * pow(10.0, (double)((i / 97) % 13) - 10)); break;
    }
    if (is_v && !(x != x) && (zo_f32_bits(x) != 0x80000000u)) x = fabsf(x);
    return x;
}

/* Fill m, v [n]: per 64-element stretch one of the patterns a block may have
 * (ordinary values, specials, all zero, all subnormal, one negative |m| the
 * largest, values of one magnitude). */
static void conv_fill(float *m, float *v, size_t n, uint64_t *s, int special)
{
    for (size_t i = 0; i < n; i++) {
        int pat = (int)((i / 64 + *s % 7) % 7);
        switch (pat) {
        case 0: m[i] = v[i] = 0.0f; break;
        case 1: m[i] = -1e-41f * (float)(i % 5); v[i] = 2e-42f * (float)(i % 3); break;
        case 2: m[i] = i % 64 == 9 ? -7.5f : (float)rng_unit(s); v[i] = 0.25f; break;
        default:
            m[i] = conv_value(i, s, 0, special && pat == 3);
            v[i] = conv_value(i, s, 1, special && pat == 4);
            break;
        }
    }
}

/* adam_state_from_f32 and adam_state_to_f32 of every implementation against
 * the scalar one (adam_q8_encode_scalar's codes and absmax; zo_f32_to_bf16),
 * bit for bit over the whole buffer (gaps included), at odd lengths around
 * 16, 64 and the block, shifted (unaligned) fp32 arrays, 1 to 3 threads; the
 * decoded floats also against map[code] * absmax from the test's own maps
 * (q8) and the widened bits (bf16), of the coded states and of states of
 * random bytes (every code, absmax nan, inf, 0, subnormal). */
static int conv_case(adam_impl impl, adam_state_kind k, size_t n, size_t off, int threads,
                     uint64_t seed)
{
    size_t sb = adam_state_bytes(k, n), N = n + off + 3;
    float *m = xmalloc(4 * N), *v = xmalloc(4 * N), *dm[2], *dv[2];
    void *st[2];
    int bad = 0;
    conv_fill(m + off, v + off, n, &seed, (int)(seed & 1) || n > 1000);
    for (int r = 0; r < 2; r++) {
        st[r] = xmalloc(sb);
        memset(st[r], r ? 0x5c : 0xc5, sb);
        dm[r] = xmalloc(4 * N), dv[r] = xmalloc(4 * N);
        memset(dm[r], 0xee, 4 * N), memset(dv[r], 0xee, 4 * N);
    }
    /* from fp32 */
    assert_int_equal(adam_state_from_f32_impl(ADAM_IMPL_SCALAR, k, st[0], n, m + off, v + off, 1), ZO_OK);
    assert_int_equal(adam_state_from_f32_impl(impl, k, st[1], n, m + off, v + off, threads), ZO_OK);
    bad += diff_state(k, n, st[0], st[1], adam_impl_name(impl));
    if (memcmp(st[0], st[1], sb) && bad++ < 4) print_error("state buffers differ\n");
    /* to fp32, of the coded state and then of random bytes */
    for (int pass = 0; pass < 2 && !bad; pass++) {
        if (pass == 1) {
            for (size_t i = 0; i < sb; i++) ((uint8_t *)st[0])[i] = (uint8_t)rng_next(&seed);
            if (k.type == ADAM_STATE_Q8) {
                static const float am_special[] = {0.0f, 1e-40f, INFINITY, NAN, 1.0f, 3e38f};
                parts q = parts_of(k, st[0], n);
                for (size_t b = 0; b < q.l.n_blocks; b++) {
                    float a = b % 2 ? am_special[rng_next(&seed) % 6]
                                    : (float)fabs(rng_unit(&seed) * 1e-3);
                    memcpy(q.base + q.l.off_absmax_m + 4 * b, &a, 4);
                    a = b % 3 ? (float)fabs(rng_unit(&seed)) : am_special[rng_next(&seed) % 6];
                    memcpy(q.base + q.l.off_absmax_v + 4 * b, &a, 4);
                }
            }
        }
        assert_int_equal(adam_state_to_f32_impl(ADAM_IMPL_SCALAR, k, st[0], n, dm[0] + off, dv[0] + off, 1), ZO_OK);
        assert_int_equal(adam_state_to_f32_impl(impl, k, st[0], n, dm[1] + off, dv[1] + off, threads), ZO_OK);
        parts q = parts_of(k, st[0], n);
        for (size_t i = 0; i < N; i++) {
            uint32_t want = zo_f32_bits(dm[0][i]), got = zo_f32_bits(dm[1][i]);
            uint32_t want_v = zo_f32_bits(dv[0][i]), got_v = zo_f32_bits(dv[1][i]);
            if ((want != got || want_v != got_v) && bad++ < 4)
                print_error("%s pass %d: decoded m/v[%zu]: want %08x %08x got %08x %08x\n",
                            adam_impl_name(impl), pass, i, want, want_v, got, got_v);
            if (i < off || i >= off + n) {
                if ((got != 0xeeeeeeeeu || got_v != 0xeeeeeeeeu) && bad++ < 4)
                    print_error("decoded [%zu] outside the range written\n", i);
                continue;
            }
            size_t e = i - off;
            float xm, xv;
            if (k.type == ADAM_STATE_Q8) {
                xm = (float)map_m[qm_of(&q)[e]] * absmax_m(&q, e / k.block);
                xv = (float)map_v[qv_of(&q)[e]] * absmax_v(&q, e / k.block);
            } else {
                uint16_t bm, bv;
                memcpy(&bm, qm_of(&q) + 2 * e, 2);
                memcpy(&bv, qv_of(&q) + 2 * e, 2);
                xm = zo_bits_f32((uint32_t)bm << 16), xv = zo_bits_f32((uint32_t)bv << 16);
            }
            if ((!same_f32(xm, dm[1][i]) || !same_f32(xv, dv[1][i])) && bad++ < 4)
                print_error("%s pass %d: decoded m/v[%zu] %.9g %.9g, map * absmax %.9g %.9g\n",
                            adam_impl_name(impl), pass, e, dm[1][i], dv[1][i], xm, xv);
        }
    }
    if (bad)
        print_error("case: state %s/%u impl %s n %zu off %zu threads %d\n", adam_state_name(k),
                    k.block, adam_impl_name(impl), n, off, threads);
    for (int r = 0; r < 2; r++) free(st[r]), free(dm[r]), free(dv[r]);
    free(m), free(v);
    return bad;
}

static void test_conversions_impls(void **state)
{
    (void)state;
    const adam_state_kind ks[5] = {adam_state_bf16(), adam_state_q8(64), adam_state_q8(256),
                                   adam_state_q8(2048), adam_state_q8(4096)};
    int ran = 0;
    for (int ii = 0; ii < N_IMPLS; ii++) {
        if (!adam_impl_supported(all_impls[ii])) continue;
        for (int ki = 0; ki < 5; ki++) {
            size_t blk = ks[ki].block ? ks[ki].block : 64;
            const size_t lens[] = {1, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129,
                                   blk - 1, blk + 1, 2 * blk + 37, 3 * blk + 16 * 7 + 5};
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                size_t off = (li + (size_t)ki) % 4;
                assert_int_equal(conv_case(all_impls[ii], ks[ki], lens[li], off, 1 + (int)(li % 2),
                                           1000 + 31 * li + ki),
                                 0);
                ran++;
            }
        }
        /* several threads, each on whole blocks */
        const adam_state_kind kt[2] = {adam_state_bf16(), adam_state_q8(2048)};
        for (int ki = 0; ki < 2; ki++)
            for (int th = 2; th <= 3; th++) {
                assert_int_equal(conv_case(all_impls[ii], kt[ki], 3 * 32768 + 2 * 2048 + 77,
                                           (size_t)th - 1, th, 77 + (uint64_t)th),
                                 0);
                ran++;
            }
    }
    print_message("# %d conversion cases\n", ran);
}

/* ---- training -------------------------------------------------------------------------------- */

/* Sparse logistic regression: N samples of 16 nonzero features out of D,
 * labels drawn from a teacher's probabilities (so the data are not
 * separable and the best loss is well above 0), full-batch gradients, 300
 * AdamW steps from 0. Returns the final mean log-loss. */
enum { TR_D = 2 * 2048 + 515, TR_N = 4 * TR_D, TR_NNZ = 16, TR_STEPS = 300 };

typedef struct tr_data {
    uint32_t idx[TR_N][TR_NNZ];
    float val[TR_N][TR_NNZ];
    float y[TR_N];
} tr_data;

static void tr_make(tr_data *d)
{
    uint64_t seed = 2024;
    double *teacher = xmalloc(TR_D * 8);
    for (size_t j = 0; j < TR_D; j++) teacher[j] = 1.5 * rng_unit(&seed);
    for (size_t s = 0; s < TR_N; s++) {
        double z = 0;
        for (int k = 0; k < TR_NNZ; k++) {
            d->idx[s][k] = (uint32_t)(rng_next(&seed) % TR_D);
            d->val[s][k] = (float)rng_unit(&seed);
            z += teacher[d->idx[s][k]] * d->val[s][k];
        }
        d->y[s] = (0.5 * (rng_unit(&seed) + 1)) < 1 / (1 + exp(-z)) ? 1.0f : 0.0f;
    }
    free(teacher);
}

/* Mean log-loss at w, and its gradient into grad (fp32). */
static double tr_loss(const tr_data *d, const float *w, float *grad)
{
    double loss = 0;
    double *gd = calloc(TR_D, sizeof *gd);
    assert_non_null(gd);
    for (size_t s = 0; s < TR_N; s++) {
        double z = 0;
        for (int k = 0; k < TR_NNZ; k++) z += (double)w[d->idx[s][k]] * d->val[s][k];
        double pr = 1 / (1 + exp(-z));
        loss += d->y[s] ? -log(pr) : -log1p(-pr);
        for (int k = 0; k < TR_NNZ; k++) gd[d->idx[s][k]] += (pr - d->y[s]) * d->val[s][k] / TR_N;
    }
    if (grad)
        for (size_t j = 0; j < TR_D; j++) grad[j] = (float)gd[j];
    free(gd);
    return loss / TR_N;
}

static double tr_run(const tr_data *d, adam_state_kind k, double *first)
{
    float *w = xmalloc(TR_D * 4), *g = xmalloc(TR_D * 4);
    void *st = xmalloc(adam_state_bytes(k, TR_D));
    memset(w, 0, TR_D * 4);
    assert_int_equal(adam_state_init(k, st, TR_D, 1), ZO_OK);
    for (long t = 1; t <= TR_STEPS; t++) {
        double l = tr_loss(d, w, g);
        if (t == 1) *first = l;
        adam_hparams hp = adam_hparams_default();
        hp.lr = 0.05f;
        hp.step = t;
        assert_int_equal(adam_state_update(&hp, k, TR_D, w, g, ZO_DTYPE_F32, st, NULL, ZO_DTYPE_F16, 1),
                         ZO_OK);
    }
    double l = tr_loss(d, w, NULL);
    free(w), free(g), free(st);
    return l;
}

static void test_training(void **state)
{
    (void)state;
    tr_data *d = xmalloc(sizeof *d);
    tr_make(d);
    double l0, l32 = tr_run(d, adam_state_f32(), &l0);
    double l16 = tr_run(d, adam_state_bf16(), &l0), l8 = tr_run(d, adam_state_q8(2048), &l0);
    print_message("# logistic regression, %d weights, %d samples, %d steps: loss %.5f at the "
                  "start; fp32 %.5f, bf16 %.5f (%+.2f%%), q8 %.5f (%+.2f%%)\n",
                  TR_D, TR_N, TR_STEPS, l0, l32, l16, 100 * (l16 / l32 - 1), l8,
                  100 * (l8 / l32 - 1));
    assert_true(l32 < 0.8 * l0); /* it learned */
    assert_true(fabs(l16 / l32 - 1) <= 0.02);
    assert_true(fabs(l8 / l32 - 1) <= 0.02);
    free(d);
}

/* With beta2 = 0.999 and no gradient, v should decay by 0.1% a step. q8
 * follows (its fp32 absmax carries the decay; the codes stay), bf16 rounded
 * to nearest even cannot: a 0.1% change is below half a bf16 ulp (0.2% to
 * 0.4%), so v keeps its value, step after step (docs/cpu_adam.md, "bf16"). */
static void test_v_decay(void **state)
{
    (void)state;
    const size_t n = 1000;
    const int steps = 100;
    float *p = xmalloc(n * 4), *g = xmalloc(n * 4), *m = xmalloc(n * 4), *v0 = xmalloc(n * 4);
    float *m1 = xmalloc(n * 4), *v1 = xmalloc(n * 4);
    uint64_t seed = 8;
    for (size_t i = 0; i < n; i++) {
        p[i] = g[i] = m[i] = 0.0f;
        v0[i] = (float)pow(10.0, -4.0 * fabs(rng_unit(&seed)));
    }
    adam_state_kind ks[3] = {adam_state_f32(), adam_state_q8(ADAM_Q8_BLOCK), adam_state_bf16()};
    double ratio[3];
    for (int ki = 0; ki < 3; ki++) {
        void *st = xmalloc(adam_state_bytes(ks[ki], n));
        assert_int_equal(adam_state_from_f32(ks[ki], st, n, m, v0, 1), ZO_OK);
        assert_int_equal(adam_state_to_f32(ks[ki], st, n, m1, v1, 1), ZO_OK);
        double before = 0, after = 0;
        for (size_t i = 0; i < n; i++) before += v1[i];
        for (int t = 1; t <= steps; t++) {
            adam_hparams hp = hp_make(ADAM_DECAY_ADAMW, t);
            assert_int_equal(adam_state_update(&hp, ks[ki], n, p, g, ZO_DTYPE_F32, st, NULL,
                                               ZO_DTYPE_F16, 1),
                             ZO_OK);
        }
        assert_int_equal(adam_state_to_f32(ks[ki], st, n, m1, v1, 1), ZO_OK);
        for (size_t i = 0; i < n; i++) after += v1[i];
        ratio[ki] = after / before;
        free(st);
    }
    print_message("# v after %d steps without gradient, over v before: fp32 %.4f, q8 %.4f, "
                  "bf16 %.4f (0.999^%d = %.4f)\n",
                  steps, ratio[0], ratio[1], ratio[2], steps, pow(0.999, steps));
    assert_true(fabs(ratio[0] - pow(0.999, steps)) < 1e-4);
    assert_true(fabs(ratio[1] - pow(0.999, steps)) < 1e-3);
    assert_true(ratio[2] == 1.0);
    free(p), free(g), free(m), free(v0), free(m1), free(v1);
}

/* ---- arguments ---------------------------------------------------------------------------- */

/* adam_state_update_range on pieces of a buffer (the runtime's chunks
 * updated a piece at a time): 8-bit pieces of whole blocks with their own
 * hyperparameters (AdamW decay, none, L2), each step checked element by
 * element against the double reference of its piece; a piece's call leaves
 * the rest of the buffer as it was; the conversions of a range give the
 * whole buffer's values there and code only their blocks. */
static void test_state_ranges(void **state)
{
    (void)state;
    static const uint32_t blocks[] = {2048, 256};
    const size_t n = 5 * 2048 + 77, cut[4] = {0, 2048, 3 * 2048, 5 * 2048 + 77};
    for (size_t bi = 0; bi < 2; bi++) {
        adam_state_kind k = adam_state_q8(blocks[bi]);
        size_t sb = adam_state_bytes(k, n);
        float *p = xmalloc(n * 4), *p0 = xmalloc(n * 4), *g = xmalloc(n * 4);
        float *m = xmalloc(n * 4), *v = xmalloc(n * 4), *m2 = xmalloc(n * 4), *v2 = xmalloc(n * 4);
        void *st = xmalloc(sb), *st0 = xmalloc(sb), *st2 = xmalloc(sb);
        uint64_t seed = 91 + bi;
        for (size_t i = 0; i < n; i++) p[i] = (float)rng_unit(&seed);
        assert_int_equal(adam_state_init(k, st, n, 2), ZO_OK);
        worst w = {0};
        for (int t = 1; t <= 6; t++) {
            /* per 2048 elements: piece 0 AdamW, piece 1 no decay, piece 2 L2 */
            adam_hparams hps[6];
            for (int j = 0; j < 6; j++) hps[j] = hp_make(j >= 3 ? ADAM_DECAY_L2 : ADAM_DECAY_ADAMW, t);
            hps[1].weight_decay = hps[2].weight_decay = 0.0f;
            for (size_t i = 0; i < n; i++)
                g[i] = (float)(rng_unit(&seed) * pow(10.0, (double)((i / 997) % 5) - 3));
            memcpy(p0, p, n * 4);
            memcpy(st0, st, sb);
            static const int order[3] = {2, 0, 1};
            for (int q = 0; q < 3; q++) {
                int j = order[q];
                size_t a = cut[j], e = cut[j + 1];
                assert_int_equal(adam_state_update_range(&hps[a / 2048], k, n, a, e - a, p + a, g + a, ZO_DTYPE_F32,
                                                         st, NULL, ZO_DTYPE_F16, 1 + q % 2),
                                 ZO_OK);
                if (q != 1) continue;
                /* pieces 2 and 0 done: piece 1's parameters, codes and absmax as they were */
                parts x = parts_of(k, st0, n), y = parts_of(k, st, n);
                assert_memory_equal(p + 2048, p0 + 2048, 2 * 2048 * 4);
                assert_memory_equal(qm_of(&y) + 2048, qm_of(&x) + 2048, 2 * 2048);
                assert_memory_equal(qv_of(&y) + 2048, qv_of(&x) + 2048, 2 * 2048);
                for (size_t bl = 2048 / k.block; bl < 3 * 2048 / k.block; bl++)
                    assert_true(same_f32(absmax_m(&y, bl), absmax_m(&x, bl)) &&
                                same_f32(absmax_v(&y, bl), absmax_v(&x, bl)));
            }
            assert_int_equal(check_q8_step(hps, 2048, k, n, p0, g, st0, p, st, &w), 0);
        }
        /* the conversions of the middle piece */
        assert_int_equal(adam_state_to_f32(k, st, n, m, v, 2), ZO_OK);
        memset(m2, 0xff, n * 4), memset(v2, 0xff, n * 4);
        assert_int_equal(adam_state_to_f32_range(k, st, n, 2048, 2 * 2048, m2 + 2048, v2 + 2048, 2), ZO_OK);
        assert_memory_equal(m2 + 2048, m + 2048, 2 * 2048 * 4);
        assert_memory_equal(v2 + 2048, v + 2048, 2 * 2048 * 4);
        assert_int_equal(((uint32_t *)(void *)m2)[2047], 0xffffffffu); /* (nothing written outside) */
        assert_int_equal(((uint32_t *)(void *)m2)[3 * 2048], 0xffffffffu);
        /* other values coded there alone: the nearest codes of their blocks' absmax, the rest as it was */
        for (size_t i = 2048; i < 3 * 2048; i++) m2[i] = m[i] * 0.5f, v2[i] = v[i] * 0.25f;
        memcpy(m2, m, 2048 * 4), memcpy(v2, v, 2048 * 4);
        memcpy(m2 + 3 * 2048, m + 3 * 2048, (n - 3 * 2048) * 4), memcpy(v2 + 3 * 2048, v + 3 * 2048, (n - 3 * 2048) * 4);
        memcpy(st2, st, sb);
        assert_int_equal(adam_state_from_f32_range(k, st2, n, 2048, 2 * 2048, m2 + 2048, v2 + 2048, 1), ZO_OK);
        parts x = parts_of(k, st, n), y = parts_of(k, st2, n);
        assert_memory_equal(qm_of(&y), qm_of(&x), 2048);
        assert_memory_equal(qm_of(&y) + 3 * 2048, qm_of(&x) + 3 * 2048, n - 3 * 2048);
        for (size_t i = 2048; i < 3 * 2048; i++) {
            size_t bl = i / k.block;
            int cm = qm_of(&y)[i], cv = qv_of(&y)[i];
            double am = absmax_m(&y, bl), av = absmax_v(&y, bl);
            if (!ref_code_ok(map_m, m2[i] / am, cm, 2e-6) || !ref_code_ok(map_v, v2[i] / av, cv, 2e-6))
                fail_msg("q8/%u range code [%zu]: m %d v %d", blocks[bi], i, cm, cv);
        }
        /* ranges not of whole blocks, or outside the state */
        adam_hparams hd = adam_hparams_default();
        assert_int_equal(adam_state_update_range(&hd, k, n, 64, 2048, p, g, ZO_DTYPE_F32, st, NULL, ZO_DTYPE_F16, 1),
                         ZO_ERR_INVALID);
        assert_non_null(strstr(zo_last_error(), "whole blocks"));
        assert_int_equal(adam_state_update_range(&hd, k, n, 2048, n, p, g, ZO_DTYPE_F32, st, NULL, ZO_DTYPE_F16, 1),
                         ZO_ERR_INVALID);
        assert_int_equal(adam_state_to_f32_range(k, st, n, 0, 100, m, v, 1), ZO_ERR_INVALID);
        assert_int_equal(adam_state_from_f32_range(k, st, n, 4096, n - 4096 + 1, m, v, 1), ZO_ERR_INVALID);
        free(p), free(p0), free(g), free(m), free(v), free(m2), free(v2), free(st), free(st0), free(st2);
        print_message("# q8/%u in pieces: largest error / absmax m %.5f v %.5f\n", blocks[bi], w.m_abs, w.v_abs);
        assert_true(w.m_abs <= 0.00704 && w.v_abs <= 0.00353);
    }
}

static void test_state_invalid_args(void **state)
{
    (void)state;
    adam_state_kind k = adam_state_q8(64);
    const size_t n = 100;
    size_t sb = adam_state_bytes(k, n);
    char *st = xmalloc(sb + 8);
    float p[100], g[100], m[100], v[100];
    memset(p, 0, sizeof p), memset(g, 0, sizeof g);
    adam_hparams hp = adam_hparams_default();
    assert_int_equal(adam_state_init(k, st, n, 1), ZO_OK);
    assert_int_equal(adam_state_update(&hp, k, n, p, g, ZO_DTYPE_F32, st, NULL, ZO_DTYPE_F16, 1), ZO_OK);
    assert_int_equal(adam_state_update(&hp, k, n, p, g, ZO_DTYPE_F32, NULL, NULL, ZO_DTYPE_F16, 1),
                     ZO_ERR_INVALID);
    assert_int_equal(adam_state_update(&hp, k, n, p, g, ZO_DTYPE_F32, st + 2, NULL, ZO_DTYPE_F16, 1),
                     ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "aligned"));
    assert_int_equal(adam_state_update(&hp, k, n, (float *)(void *)st, g, ZO_DTYPE_F32, st, NULL,
                                       ZO_DTYPE_F16, 1),
                     ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "overlap"));
    assert_int_equal(adam_state_update(&hp, adam_state_q8(100), n, p, g, ZO_DTYPE_F32, st, NULL,
                                       ZO_DTYPE_F16, 1),
                     ZO_ERR_INVALID);
    hp.step = 0;
    assert_int_equal(adam_state_update(&hp, k, n, p, g, ZO_DTYPE_F32, st, NULL, ZO_DTYPE_F16, 1),
                     ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "step"));
    hp.step = 1;
    assert_int_equal(adam_state_update(&hp, k, n, p, g, (zo_dtype)7, st, NULL, ZO_DTYPE_F16, 1),
                     ZO_ERR_INVALID);
    assert_int_equal(adam_state_update(&hp, k, n, p, g, ZO_DTYPE_F32, st, g, ZO_DTYPE_F32, 1),
                     ZO_ERR_INVALID);
    assert_int_equal(adam_state_update(&hp, k, 0, NULL, NULL, ZO_DTYPE_F32, NULL, NULL, ZO_DTYPE_F16, 1),
                     ZO_OK);
    for (int i = ADAM_IMPL_AVX2; i < ADAM_IMPL_COUNT; i++)
        if (!adam_impl_supported((adam_impl)i))
            assert_int_equal(adam_state_update_impl((adam_impl)i, &hp, k, n, p, g, ZO_DTYPE_F32, st,
                                                    NULL, ZO_DTYPE_F16, 1),
                             ZO_ERR_UNSUPPORTED);
    assert_int_equal(adam_state_to_f32(k, st, n, NULL, v, 1), ZO_ERR_INVALID);
    assert_int_equal(adam_state_from_f32(k, st + 1, n, m, v, 1), ZO_ERR_INVALID);
    assert_int_equal(adam_state_init((adam_state_kind){ADAM_STATE_F32, 2048}, st, n, 1), ZO_ERR_INVALID);
    free(st);
}

int main(void)
{
    ref_map(map_m, 1);
    ref_map(map_v, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts),
        cmocka_unit_test(test_q8_maps),
        cmocka_unit_test(test_q8_nearest_codes),
        cmocka_unit_test(test_q8_step_vs_double),
        cmocka_unit_test(test_bf16_step_vs_double),
        cmocka_unit_test(test_impls_bitexact),
        cmocka_unit_test(test_threads_independent),
        cmocka_unit_test(test_zero_state),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_conversions_impls),
        cmocka_unit_test(test_training),
        cmocka_unit_test(test_v_decay),
        cmocka_unit_test(test_state_ranges),
        cmocka_unit_test(test_state_invalid_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
