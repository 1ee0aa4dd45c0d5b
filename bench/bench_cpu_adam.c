/* bench_cpu_adam: the optimizer step against the memory roof, in one run.
 *
 * For each thread count: a streaming kernel with Adam's access pattern (read
 * param, grad, m, v; write param, m, v in place; write the 16-bit copy) and
 * trivial arithmetic is the roof (the faster of two orders of the same
 * loads and stores); then the scalar reference and every
 * implementation this CPU supports. Then the same for the gradient
 * sum-of-squares pass (roof: a read-only stream over the gradient).
 * Rows: variant, threads, Gparam/s, GB/s, % of roof. The last line is
 * params/s of the chosen case (default: fp32 master, fp16 gradients in, fp16
 * copy out) with the automatic implementation and the most threads.
 *
 *   bench_cpu_adam [-n params] [-t 1,2] [-g fp16] [-o fp16|bf16|none]
 *                  [-s seconds] [-S stagger_bytes] [-q]
 */
#include <getopt.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench/bench.h"       /* bench_header, bench_time_best, bench_row, bench_result */
#include "common/dtype.h"      /* zo_dtype, zo_store_f32 */
#include "common/units.h"      /* zo_parse_count, zo_parse_int */
#include "cpu_adam/cpu_adam.h" /* adam_update_impl, adam_grad_stats_impl */

#define HUGE_PAGE ((size_t)2 << 20)
#define MAX_THREAD_COUNTS 16

/* ---- staggered huge-page allocations -------------------------------------------- */

/* Arrays that all start at the same offset inside their 2 MiB pages map the
 * same cache sets and DRAM banks at every step and lose about half the
 * bandwidth; array k starts k * stagger bytes into its first page. */
typedef struct bench_buf {
    void *base;
    size_t len;
} bench_buf;

static void *buf_alloc(bench_buf *b, size_t bytes, int k, size_t stagger)
{
    size_t off = ((size_t)k * stagger) % HUGE_PAGE;
    b->len = (bytes + off + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    b->base = aligned_alloc(HUGE_PAGE, b->len);
    if (!b->base) return NULL;
    madvise(b->base, b->len, MADV_HUGEPAGE);
    return (char *)b->base + off;
}

/* ---- the roof: Adam's traffic, trivial arithmetic -------------------------------- */

typedef struct roof_args {
    int order; /* 0: read-modify-write array by array; 1: loads first */
    size_t n;
    float *p, *m, *v;
    const void *g;
    zo_dtype gd;
    void *out;
    zo_dtype od;
    int threads;
} roof_args;

/* 16 gradients from element i of g (fp32, fp16 or bf16), as fp32. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m512
roof_load_grad(const void *g, size_t i, zo_dtype gd)
{
    if (gd == ZO_DTYPE_F32) return _mm512_loadu_ps((const float *)g + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i));
    if (gd == ZO_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 fp32 values as fp16 or bf16 (bf16 truncated: the roof counts bytes). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m256i
roof_to16(__m512 x, zo_dtype od)
{
    if (od == ZO_DTYPE_F16) return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16));
}

/* Same static split as the library: contiguous chunks on 64 elements. */
static void split(size_t n, int t, int nt, size_t *lo, size_t *hi)
{
    size_t per = ((n + (size_t)nt - 1) / (size_t)nt + 63) / 64 * 64;
    *lo = (size_t)t * per < n ? (size_t)t * per : n;
    *hi = n - *lo < per ? n : *lo + per;
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
roof_avx512(size_t n, float *p, const void *g, zo_dtype gd, float *m, float *v, void *out,
            zo_dtype od)
{
    /* 16 elements per step; n is a multiple of 64 in every chunk but the
     * last, whose tail is left alone (a few elements of 64M). */
    for (size_t i = 0; i + 16 <= n; i += 16) {
        __m512 gg = roof_load_grad(g, i, gd);
        __m512 pp = _mm512_add_ps(_mm512_loadu_ps(p + i), gg);
        _mm512_storeu_ps(p + i, pp);
        _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), gg));
        _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), gg));
        if (out) _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), roof_to16(pp, od));
    }
}

/* The same traffic in another order: all loads, then all stores (Adam's),
 * the copy streamed past the cache as the library does. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
roof_avx512_lf(size_t n, float *p, const void *g, zo_dtype gd, float *m, float *v, void *out,
               zo_dtype od)
{
    for (size_t i = 0; i + 16 <= n; i += 16) {
        __m512 pp = _mm512_loadu_ps(p + i), mm = _mm512_loadu_ps(m + i);
        __m512 vv = _mm512_loadu_ps(v + i), gg = roof_load_grad(g, i, gd);
        pp = _mm512_add_ps(pp, gg);
        _mm512_storeu_ps(p + i, pp);
        _mm512_storeu_ps(m + i, _mm512_add_ps(mm, gg));
        _mm512_storeu_ps(v + i, _mm512_add_ps(vv, gg));
        if (out) _mm256_stream_si256((__m256i *)((uint16_t *)out + i), roof_to16(pp, od));
    }
    _mm_sfence();
}

__attribute__((target("avx2,f16c"))) static void roof_avx2(size_t n, float *p, const void *g,
                                                           zo_dtype gd, float *m, float *v,
                                                           void *out, zo_dtype od)
{
    for (size_t i = 0; i + 8 <= n; i += 8) {
        __m256 gg;
        if (gd == ZO_DTYPE_F32) {
            gg = _mm256_loadu_ps((const float *)g + i);
        } else {
            __m128i gh = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
            gg = gd == ZO_DTYPE_F16
                     ? _mm256_cvtph_ps(gh)
                     : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(gh), 16));
        }
        __m256 pp = _mm256_add_ps(_mm256_loadu_ps(p + i), gg);
        _mm256_storeu_ps(p + i, pp);
        _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), gg));
        _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), gg));
        if (out) {
            __m256i u = _mm256_srli_epi32(_mm256_castps_si256(pp), 16);
            __m128i h = od == ZO_DTYPE_F16
                            ? _mm256_cvtps_ph(pp, _MM_FROUND_TO_NEAREST_INT)
                            : _mm_packus_epi32(_mm256_castsi256_si128(u),
                                               _mm256_extracti128_si256(u, 1));
            _mm_stream_si128((__m128i *)((uint16_t *)out + i), h);
        }
    }
    _mm_sfence();
}

static void roof_scalar(size_t n, float *p, const void *g, zo_dtype gd, float *m, float *v,
                        void *out)
{
    for (size_t i = 0; i < n; i++) {
        float gi = zo_load_f32(g, gd, i);
        p[i] += gi;
        m[i] += gi;
        v[i] += gi;
        if (out) ((uint16_t *)out)[i] = (uint16_t)(zo_f32_bits(p[i]) >> 16);
    }
}

static void roof_run(void *arg)
{
    roof_args *a = arg;
    adam_impl best = adam_best_impl();
    size_t gs = zo_dtype_size(a->gd), os = zo_dtype_size(a->od);
#pragma omp parallel num_threads(a->threads)
    {
        size_t lo, hi;
        split(a->n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        float *p = a->p + lo, *m = a->m + lo, *v = a->v + lo;
        const void *g = (const char *)a->g + lo * gs;
        void *out = a->out ? (char *)a->out + lo * os : NULL;
        if (best == ADAM_IMPL_AVX512 && a->order)
            roof_avx512_lf(hi - lo, p, g, a->gd, m, v, out, a->od);
        else if (best == ADAM_IMPL_AVX512) roof_avx512(hi - lo, p, g, a->gd, m, v, out, a->od);
        else if (best == ADAM_IMPL_AVX2) roof_avx2(hi - lo, p, g, a->gd, m, v, out, a->od);
        else roof_scalar(hi - lo, p, g, a->gd, m, v, out);
    }
}

/* ---- the read-only roof for the gradient statistics ------------------------------ */

__attribute__((target("avx512f"))) static uint64_t read_avx512(const void *g, size_t bytes)
{
    const char *s = g;
    __m512i a = _mm512_setzero_si512(), b = a;
    size_t i = 0;
    for (; i + 128 <= bytes; i += 128) {
        a = _mm512_xor_si512(a, _mm512_loadu_si512(s + i));
        b = _mm512_xor_si512(b, _mm512_loadu_si512(s + i + 64));
    }
    return (uint64_t)_mm512_reduce_or_epi64(_mm512_xor_si512(a, b));
}

static uint64_t read_scalar(const void *g, size_t bytes)
{
    const uint64_t *s = g;
    uint64_t x = 0;
    for (size_t i = 0; i < bytes / 8; i++) x ^= s[i];
    return x;
}

static void read_run(void *arg)
{
    roof_args *a = arg;
    size_t gs = zo_dtype_size(a->gd);
    int avx512 = adam_best_impl() == ADAM_IMPL_AVX512;
    uint64_t x = 0;
#pragma omp parallel num_threads(a->threads) reduction(^ : x)
    {
        size_t lo, hi;
        split(a->n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        const char *g = (const char *)a->g + lo * gs;
        x ^= avx512 ? read_avx512(g, (hi - lo) * gs) : read_scalar(g, (hi - lo) * gs);
    }
    bench_sink(&x);
}

/* ---- the library's kernels --------------------------------------------------------- */

typedef struct adam_args {
    roof_args r;
    adam_impl impl;
    adam_hparams hp;
    zo_status st;
} adam_args;

static void adam_run(void *arg)
{
    adam_args *a = arg;
    zo_status st = adam_update_impl(a->impl, &a->hp, a->r.n, a->r.p, a->r.g, a->r.gd, a->r.m,
                                    a->r.v, a->r.out, a->r.od, a->r.threads);
    if (st != ZO_OK) a->st = st;
}

static void stats_run(void *arg)
{
    adam_args *a = arg;
    double s;
    int nf;
    zo_status st = adam_grad_stats_impl(a->impl, a->r.g, a->r.gd, a->r.n, a->r.threads, &s, &nf);
    if (st != ZO_OK) a->st = st;
    bench_sink(&s);
}

/* ---- interleaved timing ------------------------------------------------------------ */

/* The machine is shared: other jobs take memory bandwidth in bursts. Timing
 * the variants in turn, round after round, and keeping each one's best call
 * lets every variant see the same quiet moments. */
typedef struct variant {
    const char *name;
    void (*fn)(void *);
    void *arg;
    double best;
} variant;

static void time_interleaved(variant *vs, int nv, int min_rounds, double min_seconds)
{
    for (int i = 0; i < nv; i++) {
        vs[i].fn(vs[i].arg); /* warm-up: page faults, caches, frequency */
        vs[i].best = 1e300;
    }
    double start = zo_now();
    for (int r = 0; r < min_rounds || zo_now() - start < min_seconds * nv; r++)
        for (int i = 0; i < nv; i++) {
            double t0 = zo_now();
            vs[i].fn(vs[i].arg);
            double dt = zo_now() - t0;
            if (dt < vs[i].best) vs[i].best = dt;
        }
}

/* ---- main -------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_cpu_adam [-n params] [-t threads,...] [-g fp32|fp16|bf16]\n"
            "                      [-o fp16|bf16|none] [-s min_seconds] [-S stagger_bytes] [-q]\n"
            "  -n  parameters (default 67108864 = 64Mi; K/M/B suffixes are 1e3/1e6/1e9)\n"
            "  -t  comma-separated thread counts (default 1,<omp max>)\n"
            "  -g  gradient type (default fp16); -o 16-bit copy type (default fp16)\n"
            "  -s  minimum seconds timed per row (default 1)\n"
            "  -S  start offset step between arrays inside 2 MiB pages (default 266304)\n"
            "  -q  skip the scalar reference (slow)\n");
}

static void fill(size_t n, float *p, float *m, float *v, void *g, zo_dtype gd, void *out,
                 zo_dtype od, int threads)
{
    /* first touch with the same split the kernels use */
#pragma omp parallel num_threads(threads)
    {
        size_t lo, hi;
        split(n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        uint64_t s = 0x9e3779b97f4a7c15ull * (lo + 1);
        for (size_t i = lo; i < hi; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            float r = (float)((double)(s >> 40) * 0x1p-24 - 0.5);
            p[i] = r;
            m[i] = 0.01f * r;
            v[i] = 1e-4f * r * r;
            zo_store_f32(g, gd, i, 0.1f * r);
            if (out) zo_store_f32(out, od, i, r);
        }
    }
}

int main(int argc, char **argv)
{
    uint64_t n = (uint64_t)1 << 26;
    int tlist[MAX_THREAD_COUNTS], nt = 0;
    zo_dtype gd = ZO_DTYPE_F16, od = ZO_DTYPE_F16;
    int with_out = 1, quick = 0;
    double min_s = 1.0;
    long stagger = 266304; /* 260 KiB: 8 arrays spread over the 2 MiB page, 4 KiB apart mod 64 KiB */
    int c;
    while ((c = getopt(argc, argv, "n:t:g:o:s:S:qh")) != -1) {
        zo_status st = ZO_OK;
        long x;
        switch (c) {
        case 'n': st = zo_parse_count(optarg, "-n", &n); break;
        case 't':
            for (char *tok = strtok(optarg, ","); tok && st == ZO_OK; tok = strtok(NULL, ",")) {
                if (nt == MAX_THREAD_COUNTS) {
                    st = zo_error(ZO_ERR_INVALID, "-t: at most %d thread counts", MAX_THREAD_COUNTS);
                    break;
                }
                if ((st = zo_parse_int(tok, "-t", 1, 4096, &x)) == ZO_OK) tlist[nt++] = (int)x;
            }
            break;
        case 'g': st = zo_dtype_parse(optarg, &gd); break;
        case 'o':
            if (!strcmp(optarg, "none")) with_out = 0;
            else if ((st = zo_dtype_parse(optarg, &od)) == ZO_OK && od == ZO_DTYPE_F32)
                st = zo_error(ZO_ERR_INVALID, "-o: the copy is fp16, bf16 or none");
            break;
        case 's': st = zo_parse_double(optarg, "-s", 0.0, 600.0, &min_s); break;
        case 'S': st = zo_parse_int(optarg, "-S", 0, (long)HUGE_PAGE, &stagger); break;
        case 'q': quick = 1; break;
        default: usage(); return c == 'h' ? 0 : 2;
        }
        if (st != ZO_OK) {
            fprintf(stderr, "bench_cpu_adam: %s\n", zo_last_error());
            return 2;
        }
    }
    if (stagger % 64) {
        fprintf(stderr, "bench_cpu_adam: -S must be a multiple of 64\n");
        return 2;
    }
    if (nt == 0) {
        tlist[nt++] = 1;
        if (omp_get_max_threads() > 1) tlist[nt++] = omp_get_max_threads();
    }
    int tmax = tlist[0];
    for (int i = 1; i < nt; i++) tmax = tlist[i] > tmax ? tlist[i] : tmax;

    size_t gs = zo_dtype_size(gd), os = with_out ? zo_dtype_size(od) : 0;
    /* bytes moved per parameter: read p, g, m, v; write p, m, v (+ copy) */
    double bpp = (double)(4 + gs + 4 + 4) + 12.0 + (double)os;
    bench_header("bench_cpu_adam",
                 "n %llu, grad %s, copy %s, best %s%s, stagger %ld B, %.0f bytes/param",
                 (unsigned long long)n, zo_dtype_name(gd), with_out ? zo_dtype_name(od) : "none",
                 adam_impl_name(adam_best_impl()), adam_avx512_has_bf16() ? " (+avx512bf16)" : "",
                 stagger, bpp);

    bench_buf bufs[5];
    int k = 0;
    float *p = buf_alloc(&bufs[k], n * 4, k, (size_t)stagger);
    k++;
    void *g = buf_alloc(&bufs[k], n * gs, k, (size_t)stagger);
    k++;
    float *m = buf_alloc(&bufs[k], n * 4, k, (size_t)stagger);
    k++;
    float *v = buf_alloc(&bufs[k], n * 4, k, (size_t)stagger);
    k++;
    void *out = buf_alloc(&bufs[k], n * 2, k, (size_t)stagger);
    k++;
    if (!p || !g || !m || !v || !out) {
        fprintf(stderr, "bench_cpu_adam: cannot allocate %llu parameters\n", (unsigned long long)n);
        return 1;
    }
    if (!with_out) out = NULL;
    fill(n, p, m, v, g, gd, out, od, tmax);

    adam_impl impls[8];
    int ni = 0;
    if (!quick) impls[ni++] = ADAM_IMPL_SCALAR;
    for (int i = ADAM_IMPL_AVX2; i < ADAM_IMPL_COUNT; i++) {
        /* the integer-bf16 variant differs only with a bf16 copy */
        if (i == ADAM_IMPL_AVX512_NO_BF16 && !(with_out && od == ZO_DTYPE_BF16 &&
                                               adam_avx512_has_bf16()))
            continue;
        if (adam_impl_supported((adam_impl)i)) impls[ni++] = (adam_impl)i;
    }

    /* one argument block per variant: roof kernels, then implementations */
    roof_args r0 = {.n = n, .p = p, .m = m, .v = v, .g = g, .gd = gd, .out = out, .od = od};
    roof_args roofs[2] = {r0, r0};
    roofs[1].order = 1;
    int nroof = adam_best_impl() == ADAM_IMPL_AVX512 ? 2 : 1;
    adam_args args[9];
    for (int ii = 0; ii <= ni; ii++) {
        args[ii] = (adam_args){.r = r0, .impl = ii < ni ? impls[ii] : ADAM_IMPL_AUTO,
                               .hp = adam_hparams_default()};
        args[ii].hp.step = 10;
    }
    int scalar = !quick; /* impls[0] is the scalar reference, timed on its own (slow) */

    double main_rate = 0.0;
    bench_row("%-16s %7s %9s %8s %8s", "# update", "threads", "Gparam/s", "GB/s", "%roof");
    for (int ti = 0; ti < nt; ti++) {
        int th = tlist[ti];
        variant vs[12];
        int nv = 0;
        for (int i = 0; i < nroof; i++) {
            roofs[i].threads = th;
            vs[nv++] = (variant){.name = "roof", .fn = roof_run, .arg = &roofs[i]};
        }
        for (int ii = scalar; ii <= ni; ii++) {
            args[ii].r.threads = th;
            vs[nv++] = (variant){.name = adam_impl_name(args[ii].impl), .fn = adam_run,
                                 .arg = &args[ii]};
        }
        time_interleaved(vs, nv, 5, min_s);
        /* the roof is the fastest streaming kernel */
        double roof = vs[0].best;
        for (int i = 1; i < nroof; i++) roof = vs[i].best < roof ? vs[i].best : roof;
        if (scalar) {
            args[0].r.threads = th;
            vs[nv] = (variant){.name = "scalar", .fn = adam_run, .arg = &args[0]};
            time_interleaved(&vs[nv], 1, 2, 0.0);
            nv++;
        }
        double rr = (double)n / roof * 1e-9;
        bench_row("%-16s %7d %9.3f %8.2f %8.1f", "roof", th, rr, rr * bpp, 100.0);
        for (int i = nroof; i < nv; i++) {
            /* print the scalar reference first, as in the implementation list */
            variant *x = &vs[scalar && i == nroof ? nv - 1 : i - (scalar && i > nroof)];
            double r = (double)n / x->best * 1e-9;
            bench_row("%-16s %7d %9.3f %8.2f %8.1f", x->name, th, r, r * bpp,
                      100.0 * roof / x->best);
            if (x->arg == &args[ni] && th == tmax) main_rate = r * 1e9;
        }
    }
    for (int ii = 0; ii <= ni; ii++)
        if (args[ii].st != ZO_OK) {
            fprintf(stderr, "bench_cpu_adam: %s: %s\n", adam_impl_name(args[ii].impl),
                    zo_status_name(args[ii].st));
            return 1;
        }

    bench_row("%-16s %7s %9s %8s %8s", "# grad stats", "threads", "Gparam/s", "GB/s", "%roof");
    for (int ti = 0; ti < nt; ti++) {
        int th = tlist[ti];
        variant vs[12];
        int nv = 0;
        roofs[0].threads = th;
        vs[nv++] = (variant){.name = "read roof", .fn = read_run, .arg = &roofs[0]};
        for (int ii = 0; ii < ni; ii++) {
            if (impls[ii] == ADAM_IMPL_AVX512_NO_BF16) continue; /* same kernel as avx512 */
            args[ii].r.threads = th;
            vs[nv++] = (variant){.name = adam_impl_name(impls[ii]), .fn = stats_run,
                                 .arg = &args[ii]};
        }
        time_interleaved(vs, nv, 5, min_s / 2);
        for (int i = 0; i < nv; i++) {
            double r = (double)n / vs[i].best * 1e-9;
            bench_row("%-16s %7d %9.3f %8.2f %8.1f", vs[i].name, th, r, r * (double)gs,
                      100.0 * vs[0].best / vs[i].best);
        }
    }
    for (int i = 0; i < k; i++) free(bufs[i].base);
    bench_result("params/s", main_rate);
    return 0;
}
