/* Normal draws for the weights' initialization (transformer.h,
 * tf_normal_fill): Box-Muller on splitmix64 as a counter.
 *
 * Element e takes the two splitmix64 outputs after s0 + 2e steps of its
 * increment: u1 = (x1 + 1) / (2^53 + 1) in (0, 1], u2 = x2 / 2^53 in [0, 1)
 * (x the top 53 bits), and std * sqrt(-2 log u1) cos(2 pi u2) rounded to
 * fp32 once. With glibc's log and cos a draw took 31-45 ns, half of it in
 * those two calls, and the draws were 2-3% of the plain test suite's CPU
 * (perf, 2026-11-29: every `train` initializes its model). Where the CPU
 * has AVX2 and FMA, a logarithm and a cosine of our own (polynomials
 * within a few units in the last place of a double of glibc's) let the
 * loop run 4 lanes wide: 8.9 ns a draw against 30.7 (bench_model), and
 * the fp32 values are glibc's: 0 of 200 million draws differed, and
 * tests/test_transformer.c's test_normal_fill and test_init_sequence hold
 * them bit for bit against libm in the test. Elsewhere the libm loop runs.
 *
 * This file is compiled with -fno-math-errno -fno-trapping-math (its
 * sqrt of a non-negative value sets no errno; the selects below may be
 * evaluated on both sides), which let GCC turn the branches into blends. */
#include <math.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h> /* defines: omp_get_thread_num, omp_get_num_threads */
#endif

#include "common/splitmix.h"         /* defines: zo_splitmix_mix, ZO_SPLITMIX_GOLDEN */
#include "transformer/transformer.h" /* defines: tf_normal_fill, tf_normal_simd */

#define GOLDEN ZO_SPLITMIX_GOLDEN
#define TWO52 4503599627370496.0 /* 2^52: the double whose low bits hold an integer */

static int use_simd = 1;

void tf_normal_simd(int on) { use_simd = on; }

typedef union {
    double d;
    uint64_t u;
} bits64;

/* x < 2^53 as a double, exactly: its two 32-bit halves through 2^52 (AVX2
 * has no 64-bit integer conversion, so (double)x would not vectorize). */
static inline double exact53(uint64_t x)
{
    bits64 hi = {.u = 0x4330000000000000ull | (x >> 32)}, lo = {.u = 0x4330000000000000ull | (x & 0xffffffffull)};
    return (hi.d - TWO52) * 4294967296.0 + (lo.d - TWO52);
}

/* log(u), u a normal double in (0, 1]: u = m 2^e with m in [sqrt(1/2),
 * sqrt(2)), log m = 2 atanh(s) = 2 (s + s^3/3 + ...), s = (m - 1) / (m + 1),
 * |s| <= 0.172: eleven terms leave 1e-19; ln 2 in two parts. */
static inline double log_unit(double u)
{
    bits64 b = {.d = u};
    bits64 eb = {.u = 0x4330000000000000ull | (b.u >> 52)};
    double e = eb.d - TWO52 - 1023.0;
    bits64 mb = {.u = (b.u & 0x000fffffffffffffull) | 0x3ff0000000000000ull};
    double m = mb.d;
    int high = m > 1.4142135623730951;
    m = high ? m * 0.5 : m;
    e = high ? e + 1.0 : e;
    double s = (m - 1.0) / (m + 1.0), z = s * s;
    double p = 1.0 / 23;
    p = p * z + 1.0 / 21;
    p = p * z + 1.0 / 19;
    p = p * z + 1.0 / 17;
    p = p * z + 1.0 / 15;
    p = p * z + 1.0 / 13;
    p = p * z + 1.0 / 11;
    p = p * z + 1.0 / 9;
    p = p * z + 1.0 / 7;
    p = p * z + 1.0 / 5;
    p = p * z + 1.0 / 3;
    double lm = 2.0 * s + 2.0 * s * z * p;
    return e * 6.93147180369123816490e-01 + (e * 1.90821492927058770002e-10 + lm);
}

/* cos(t), t = 2 pi u2 in [0, 2 pi) rounded as the reference rounds it:
 * t - k pi/2 with pi/2 in two parts (the first's 33 bits times k <= 4
 * exact), then cos or sin of |r| <= pi/4 by their Taylor series to r^18
 * and r^17. Folding u2 in turns instead would be more accurate than
 * cos(2 pi u2) near its zeros and so not the same values. */
static inline double cos_rad(double t)
{
    bits64 q = {.d = t * 0.63661977236758134308 + 6755399441055744.0}; /* 1.5 * 2^52: k in the low bits */
    double k = q.d - 6755399441055744.0;
    double r = (t - k * 1.57079632673412561417e+00) - k * 6.07710050650619224932e-11;
    double r2 = r * r;
    double c = 1.0 / 6402373705728000.0;
    c = c * r2 - 1.0 / 20922789888000.0;
    c = c * r2 + 1.0 / 87178291200.0;
    c = c * r2 - 1.0 / 479001600.0;
    c = c * r2 + 1.0 / 3628800.0;
    c = c * r2 - 1.0 / 40320.0;
    c = c * r2 + 1.0 / 720.0;
    c = c * r2 - 1.0 / 24.0;
    c = c * r2 + 0.5;
    c = 1.0 - c * r2;
    double sn = 1.0 / 121645100408832000.0;
    sn = sn * r2 - 1.0 / 355687428096000.0;
    sn = sn * r2 + 1.0 / 1307674368000.0;
    sn = sn * r2 - 1.0 / 6227020800.0;
    sn = sn * r2 + 1.0 / 39916800.0;
    sn = sn * r2 - 1.0 / 362880.0;
    sn = sn * r2 + 1.0 / 5040.0;
    sn = sn * r2 - 1.0 / 120.0;
    sn = sn * r2 + 1.0 / 6.0;
    sn = r - sn * r2 * r;
    uint64_t quadrant = q.u & 3; /* cos r, -sin r, -cos r, sin r */
    double v = quadrant & 1 ? sn : c;
    return quadrant == 1 || quadrant == 2 ? -v : v;
}

static inline float draw(uint64_t s0, long long e, double std)
{
    uint64_t s = s0 + 2 * (uint64_t)e * GOLDEN;
    uint64_t x1 = zo_splitmix_mix(s + GOLDEN) >> 11, x2 = zo_splitmix_mix(s + 2 * GOLDEN) >> 11;
    double u1 = (exact53(x1) + 1.0) / 9007199254740993.0;
    double u2 = exact53(x2) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log_unit(u1)) * cos_rad(2.0 * 3.14159265358979323846 * u2) * std);
}

/* The reference: glibc's log and cos, one element at a time (45 ns). */
static void fill_plain(float *dst, long long lo, long long hi, uint64_t s0, double std)
{
    for (long long e = lo; e < hi; e++) {
        uint64_t s = s0 + 2 * (uint64_t)e * GOLDEN;
        double u1 = ((double)(zo_splitmix_mix(s + GOLDEN) >> 11) + 1.0) / 9007199254740993.0;
        double u2 = (double)(zo_splitmix_mix(s + 2 * GOLDEN) >> 11) / 9007199254740992.0;
        dst[e] = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2) * std);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) static void fill_avx2(float *dst, long long lo, long long hi, uint64_t s0,
                                                          double std)
{
#pragma omp simd
    for (long long e = lo; e < hi; e++) dst[e] = draw(s0, e, std);
}

static int have_avx2_fma(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

void tf_normal_fill(float *dst, long long n, uint64_t s0, double std)
{
    int wide = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    wide = use_simd && have_avx2_fma();
#endif
#pragma omp parallel if (n > 65536)
    {
#ifdef _OPENMP
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        int t = 0, nt = 1;
#endif
        long long lo = n * t / nt, hi = n * (t + 1) / nt;
#if defined(__x86_64__) && defined(__GNUC__)
        if (wide)
            fill_avx2(dst, lo, hi, s0, std);
        else
#endif
            fill_plain(dst, lo, hi, s0, std);
    }
}
