/* bench_cpu_adam: the optimizer step against the memory roof, in one run.
 *
 * For each thread count: a streaming kernel with Adam's access pattern (read
 * param, grad, m, v; write param, m, v in place; write the 16-bit copy) and
 * trivial arithmetic is the roof (the faster of two orders of the same
 * loads and stores); then the scalar reference and every
 * implementation this CPU supports. Then the same for the gradient
 * sum-of-squares pass (roof: a read-only stream over the gradient).
 * Rows: variant, threads, Gparam/s, GB/s, % of roof. Then the optimizer
 * state encodings (fp32, bf16, q8: adam_state_update), each against a roof
 * with its own traffic (the moments' bytes differ), all of them timed in turn
 * in one set, so that they see the same load. Then the conversions of the
 * bf16 and q8 encodings to and from fp32 (adam_state_to_f32 / _from_f32,
 * the runtime's decode and code passes), scalar and vector, against a roof
 * with their bytes. The last lines are params/s
 * of the chosen case (default: fp32 master, fp16 gradients in, fp16 copy
 * out) with the automatic implementation and the most threads, and the
 * encodings' speeds as ratios to fp32's, and the conversions' %roof and
 * speed over the scalar conversion.
 *
 *   bench_cpu_adam [-n params] [-t 1,2] [-g fp16] [-o fp16|bf16|none]
 *                  [-m fp32,bf16,q8|none] [-s seconds] [-S stagger_bytes] [-q]
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
#define MAX_STATES 4

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
    float *p;
    void *m, *v; /* the moments: ms bytes each */
    int ms;      /* 4 (fp32), 2 (bf16) or 1 (q8 codes) */
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

/* 16 moments of ms bytes at element i of x, plus g: fp32 and bf16 ones as
 * numbers (so they stay ordinary numbers for the kernels timed after the
 * roof), q8 codes as bytes. The arithmetic is trivial; the traffic is the
 * kernel's. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline void
roof_moment(void *x, size_t i, int ms, __m512 gg)
{
    if (ms == 4) {
        float *f = (float *)x + i;
        _mm512_storeu_ps(f, _mm512_add_ps(_mm512_loadu_ps(f), gg));
    } else if (ms == 2) {
        __m256i *h = (__m256i *)((uint16_t *)x + i);
        __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(h)), 16));
        f = _mm512_add_ps(f, gg);
        _mm256_storeu_si256(h, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f), 16)));
    } else {
        __m128i *b = (__m128i *)((uint8_t *)x + i);
        _mm_storeu_si128(b, _mm_add_epi8(_mm_loadu_si128(b), _mm_set1_epi8(1)));
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
roof_avx512(size_t n, float *p, const void *g, zo_dtype gd, void *m, void *v, int ms, void *out,
            zo_dtype od)
{
    /* 16 elements per step; n is a multiple of 64 in every chunk but the
     * last, whose tail is left alone (a few elements of 64M). */
    for (size_t i = 0; i + 16 <= n; i += 16) {
        __m512 gg = roof_load_grad(g, i, gd);
        __m512 pp = _mm512_add_ps(_mm512_loadu_ps(p + i), gg);
        _mm512_storeu_ps(p + i, pp);
        roof_moment(m, i, ms, gg);
        roof_moment(v, i, ms, gg);
        if (out) _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), roof_to16(pp, od));
    }
}

/* The same traffic in another order: all loads, then all stores (Adam's),
 * the copy streamed past the cache as the library does. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
roof_avx512_lf(size_t n, float *p, const void *g, zo_dtype gd, void *m, void *v, int ms,
               void *out, zo_dtype od)
{
    for (size_t i = 0; i + 16 <= n; i += 16) {
        __m512 pp = _mm512_loadu_ps(p + i), gg = roof_load_grad(g, i, gd);
        if (ms == 4) {
            __m512 mm = _mm512_loadu_ps((float *)m + i), vv = _mm512_loadu_ps((float *)v + i);
            pp = _mm512_add_ps(pp, gg);
            _mm512_storeu_ps(p + i, pp);
            _mm512_storeu_ps((float *)m + i, _mm512_add_ps(mm, gg));
            _mm512_storeu_ps((float *)v + i, _mm512_add_ps(vv, gg));
        } else {
            pp = _mm512_add_ps(pp, gg);
            _mm512_storeu_ps(p + i, pp);
            roof_moment(m, i, ms, gg);
            roof_moment(v, i, ms, gg);
        }
        if (out) _mm256_stream_si256((__m256i *)((uint16_t *)out + i), roof_to16(pp, od));
    }
    _mm_sfence();
}

/* A moment of ms bytes at element i, plus x (the scalar and AVX2 roofs). */
static inline void roof_bump(void *a, size_t i, int ms, float x)
{
    if (ms == 4) ((float *)a)[i] += x;
    else if (ms == 2) ((uint16_t *)a)[i] = (uint16_t)(zo_f32_bits(zo_bf16_to_f32(((uint16_t *)a)[i]) + x) >> 16);
    else ((uint8_t *)a)[i]++;
}

__attribute__((target("avx2,f16c"))) static void roof_avx2(size_t n, float *p, const void *g,
                                                           zo_dtype gd, void *m, void *v, int ms,
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
        if (ms == 4) {
            _mm256_storeu_ps((float *)m + i, _mm256_add_ps(_mm256_loadu_ps((float *)m + i), gg));
            _mm256_storeu_ps((float *)v + i, _mm256_add_ps(_mm256_loadu_ps((float *)v + i), gg));
        } else if (ms == 2) {
            for (int k = 0; k < 2; k++) {
                __m128i *h = (__m128i *)((uint16_t *)(k ? v : m) + i);
                __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h)), 16));
                __m256i r = _mm256_srli_epi32(_mm256_castps_si256(_mm256_add_ps(f, gg)), 16);
                _mm_storeu_si128(h, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
            }
        } else {
            for (int k = 0; k < 2; k++) {
                __m128i *b = (__m128i *)((uint8_t *)(k ? v : m) + i);
                _mm_storel_epi64(b, _mm_add_epi8(_mm_loadl_epi64(b), _mm_set1_epi8(1)));
            }
        }
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

static void roof_scalar(size_t n, float *p, const void *g, zo_dtype gd, void *m, void *v, int ms,
                        void *out)
{
    for (size_t i = 0; i < n; i++) {
        float gi = zo_load_f32(g, gd, i);
        p[i] += gi;
        roof_bump(m, i, ms, gi);
        roof_bump(v, i, ms, gi);
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
        float *p = a->p + lo;
        void *m = (char *)a->m + lo * (size_t)a->ms, *v = (char *)a->v + lo * (size_t)a->ms;
        const void *g = (const char *)a->g + lo * gs;
        void *out = a->out ? (char *)a->out + lo * os : NULL;
        if (best == ADAM_IMPL_AVX512 && a->order)
            roof_avx512_lf(hi - lo, p, g, a->gd, m, v, a->ms, out, a->od);
        else if (best == ADAM_IMPL_AVX512)
            roof_avx512(hi - lo, p, g, a->gd, m, v, a->ms, out, a->od);
        else if (best == ADAM_IMPL_AVX2) roof_avx2(hi - lo, p, g, a->gd, m, v, a->ms, out, a->od);
        else roof_scalar(hi - lo, p, g, a->gd, m, v, a->ms, out);
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

/* One encoded state (adam_state_update) and its roof, whose m and v are the
 * state's own parts. */
typedef struct state_case {
    adam_state_kind kind;
    void *state;
    roof_args roofs[2];
    adam_args impls[8]; /* r.m holds the state buffer */
    int ni;
} state_case;

static void state_run(void *arg)
{
    adam_args *a = arg;
    state_case *sc = a->r.m; /* set up by main */
    zo_status st = adam_state_update_impl(a->impl, &a->hp, sc->kind, a->r.n, a->r.p, a->r.g,
                                          a->r.gd, sc->state, a->r.out, a->r.od, a->r.threads);
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

/* ---- conversions of encoded state (adam_state_to_f32, adam_state_from_f32) ------------ */

/* One conversion of a state case's buffer to or from the fp32 m and v of the
 * update rows, by one implementation; or (roof) a stream with its traffic:
 * the state's m and v read and fp32 m and v written (to), or the reverse
 * (from), with trivial arithmetic. */
typedef struct conv_args {
    const state_case *sc;
    int from;     /* 0: to_f32, 1: from_f32 */
    int roof;     /* the streaming kernel instead of the library */
    adam_impl impl;
    size_t n;
    float *m, *v; /* fp32 [n] */
    int threads;
    zo_status st;
} conv_args;

/* 16 state values at element i (ms bytes each) to fp32, or back. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
roof_conv_avx512(size_t n, int from, int ms, void *q, float *f)
{
    for (size_t i = 0; i + 16 <= n; i += 16) {
        if (!from) {
            __m512i w = ms == 1 ? _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((uint8_t *)q + i)))
                                : _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                                        (const __m256i *)((uint16_t *)q + i))), 16);
            _mm512_storeu_ps(f + i, _mm512_castsi512_ps(w));
        } else {
            __m512i w = _mm512_srli_epi32(_mm512_castps_si512(_mm512_loadu_ps(f + i)), 16);
            if (ms == 1) _mm_storeu_si128((__m128i *)((uint8_t *)q + i), _mm512_cvtepi32_epi8(w));
            else _mm256_storeu_si256((__m256i *)((uint16_t *)q + i), _mm512_cvtepi32_epi16(w));
        }
    }
}

static void roof_conv_scalar(size_t n, int from, int ms, void *q, float *f)
{
    for (size_t i = 0; i < n; i++) {
        if (!from) f[i] = zo_bits_f32(ms == 1 ? ((uint8_t *)q)[i] : (uint32_t)((uint16_t *)q)[i] << 16);
        else if (ms == 1) ((uint8_t *)q)[i] = (uint8_t)(zo_f32_bits(f[i]) >> 16);
        else ((uint16_t *)q)[i] = (uint16_t)(zo_f32_bits(f[i]) >> 16);
    }
}

static void conv_run(void *arg)
{
    conv_args *a = arg;
    const state_case *sc = a->sc;
    if (!a->roof) {
        zo_status st = a->from ? adam_state_from_f32_impl(a->impl, sc->kind, sc->state, a->n, a->m,
                                                          a->v, a->threads)
                               : adam_state_to_f32_impl(a->impl, sc->kind, sc->state, a->n, a->m,
                                                        a->v, a->threads);
        if (st != ZO_OK) a->st = st;
        return;
    }
    int ms = sc->roofs[0].ms, avx512 = adam_best_impl() == ADAM_IMPL_AVX512;
#pragma omp parallel num_threads(a->threads)
    {
        size_t lo, hi;
        split(a->n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        for (int k = 0; k < 2; k++) {
            void *q = (char *)(k ? sc->roofs[0].v : sc->roofs[0].m) + lo * (size_t)ms;
            float *f = (k ? a->v : a->m) + lo;
            if (avx512) roof_conv_avx512(hi - lo, a->from, ms, q, f);
            else roof_conv_scalar(hi - lo, a->from, ms, q, f);
        }
    }
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
            "                      [-o fp16|bf16|none] [-m states|none] [-s min_seconds]\n"
            "                      [-S stagger_bytes] [-q]\n"
            "  -n  parameters (default 67108864 = 64Mi; K/M/B suffixes are 1e3/1e6/1e9)\n"
            "  -t  comma-separated thread counts (default 1,<omp max>)\n"
            "  -g  gradient type (default fp16); -o 16-bit copy type (default fp16)\n"
            "  -m  optimizer state encodings timed against each other (default fp32,bf16,q8;\n"
            "      q8/<block> for another block size; none skips them), and the bf16 and q8\n"
            "      ones' conversions to and from fp32 (their scalar rows too, whatever -q)\n"
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

/* What the command line asks for. */
typedef struct bench_opts {
    uint64_t n;
    int tlist[MAX_THREAD_COUNTS], nt, tmax;
    zo_dtype gd, od;
    int with_out, quick;
    double min_s;
    long stagger;
    adam_state_kind kinds[MAX_STATES];
    int nk;
} bench_opts;

/* The thread counts in -t's comma-separated list. */
static zo_status parse_threads(char *list, bench_opts *o)
{
    zo_status st = ZO_OK;
    long x;
    for (char *tok = strtok(list, ","); tok && st == ZO_OK; tok = strtok(NULL, ",")) {
        if (o->nt == MAX_THREAD_COUNTS)
            return zo_error(ZO_ERR_INVALID, "-t: at most %d thread counts", MAX_THREAD_COUNTS);
        if ((st = zo_parse_int(tok, "-t", 1, 4096, &x)) == ZO_OK) o->tlist[o->nt++] = (int)x;
    }
    return st;
}

/* The state encodings in -m's comma-separated list; 0 or the exit code. */
static int parse_kinds(const char *kind_list, bench_opts *o)
{
    if (!strcmp(kind_list, "none")) return 0;
    char list[256];
    snprintf(list, sizeof list, "%s", kind_list);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        if (o->nk == MAX_STATES || adam_state_parse(tok, &o->kinds[o->nk]) != ZO_OK) {
            fprintf(stderr, "bench_cpu_adam: -m: %s\n",
                    o->nk == MAX_STATES ? "too many encodings" : zo_last_error());
            return 2;
        }
        o->nk++;
    }
    return 0;
}

/* Parses the options into o; returns -1 to go on, or the exit code. */
static int parse_args(int argc, char **argv, bench_opts *o)
{
    *o = (bench_opts){.n = (uint64_t)1 << 26, .gd = ZO_DTYPE_F16, .od = ZO_DTYPE_F16,
                      .with_out = 1, .min_s = 1.0,
                      /* 260 KiB: 8 arrays spread over the 2 MiB page, 4 KiB apart mod 64 KiB */
                      .stagger = 266304};
    const char *kind_list = "fp32,bf16,q8";
    int c;
    while ((c = getopt(argc, argv, "n:t:g:o:m:s:S:qh")) != -1) {
        zo_status st = ZO_OK;
        switch (c) {
        case 'n': st = zo_parse_count(optarg, "-n", &o->n); break;
        case 't': st = parse_threads(optarg, o); break;
        case 'g': st = zo_dtype_parse(optarg, &o->gd); break;
        case 'o':
            if (!strcmp(optarg, "none")) o->with_out = 0;
            else if ((st = zo_dtype_parse(optarg, &o->od)) == ZO_OK && o->od == ZO_DTYPE_F32)
                st = zo_error(ZO_ERR_INVALID, "-o: the copy is fp16, bf16 or none");
            break;
        case 'm': kind_list = optarg; break;
        case 's': st = zo_parse_double(optarg, "-s", 0.0, 600.0, &o->min_s); break;
        case 'S': st = zo_parse_int(optarg, "-S", 0, (long)HUGE_PAGE, &o->stagger); break;
        case 'q': o->quick = 1; break;
        default: usage(); return c == 'h' ? 0 : 2;
        }
        if (st != ZO_OK) {
            fprintf(stderr, "bench_cpu_adam: %s\n", zo_last_error());
            return 2;
        }
    }
    if (parse_kinds(kind_list, o)) return 2;
    if (o->stagger % 64) {
        fprintf(stderr, "bench_cpu_adam: -S must be a multiple of 64\n");
        return 2;
    }
    if (o->nt == 0) {
        o->tlist[o->nt++] = 1;
        if (omp_get_max_threads() > 1) o->tlist[o->nt++] = omp_get_max_threads();
    }
    o->tmax = o->tlist[0];
    for (int i = 1; i < o->nt; i++) o->tmax = o->tlist[i] > o->tmax ? o->tlist[i] : o->tmax;
    return -1;
}

/* The arrays, the variants timed and what they measured. */
typedef struct bench_run {
    bench_opts o;
    size_t gs, os;
    double bpp; /* bytes moved per parameter by the update */
    bench_buf bufs[5 + MAX_STATES];
    int k; /* bufs in use */
    roof_args r0, roofs[2];
    int nroof;
    adam_impl impls[8];
    int ni;
    adam_args args[9]; /* one per implementation, then the automatic one */
    int scalar;        /* impls[0] is the scalar reference, timed on its own (slow) */
    double main_rate;
    state_case *cases;
    double state_bpp[MAX_STATES], state_rate[MAX_STATES], state_roof[MAX_STATES];
    /* the conversions at the most threads: [kind][to, from] */
    double conv_speedup[MAX_STATES][2], conv_roof[MAX_STATES][2];
    int conv_failed;
} bench_run;

/* The header, the arrays (filled), the implementations this CPU supports and
 * one argument block per variant; 0 or the exit code. */
static int bench_setup(bench_run *b)
{
    const bench_opts *o = &b->o;
    uint64_t n = o->n;
    b->gs = zo_dtype_size(o->gd);
    b->os = o->with_out ? zo_dtype_size(o->od) : 0;
    /* bytes moved per parameter: read p, g, m, v; write p, m, v (+ copy) */
    b->bpp = (double)(4 + b->gs + 4 + 4) + 12.0 + (double)b->os;
    bench_header("bench_cpu_adam",
                 "n %llu, grad %s, copy %s, best %s%s, stagger %ld B, %.0f bytes/param",
                 (unsigned long long)n, zo_dtype_name(o->gd),
                 o->with_out ? zo_dtype_name(o->od) : "none", adam_impl_name(adam_best_impl()),
                 adam_avx512_has_bf16() ? " (+avx512bf16)" : "", o->stagger, b->bpp);

    size_t sizes[5] = {n * 4, n * b->gs, n * 4, n * 4, n * 2}; /* p, g, m, v, copy */
    void *a[5];
    for (b->k = 0; b->k < 5; b->k++)
        a[b->k] = buf_alloc(&b->bufs[b->k], sizes[b->k], b->k, (size_t)o->stagger);
    float *p = a[0], *m = a[2], *v = a[3];
    void *g = a[1], *out = a[4];
    if (!p || !g || !m || !v || !out) {
        fprintf(stderr, "bench_cpu_adam: cannot allocate %llu parameters\n", (unsigned long long)n);
        return 1;
    }
    if (!o->with_out) out = NULL;
    fill(n, p, m, v, g, o->gd, out, o->od, o->tmax);

    if (!o->quick) b->impls[b->ni++] = ADAM_IMPL_SCALAR;
    for (int i = ADAM_IMPL_AVX2; i < ADAM_IMPL_COUNT; i++) {
        /* the integer-bf16 variant differs only with a bf16 copy */
        if (i == ADAM_IMPL_AVX512_NO_BF16 && !(o->with_out && o->od == ZO_DTYPE_BF16 &&
                                               adam_avx512_has_bf16()))
            continue;
        if (adam_impl_supported((adam_impl)i)) b->impls[b->ni++] = (adam_impl)i;
    }

    /* one argument block per variant: roof kernels, then implementations */
    b->r0 = (roof_args){.n = n, .p = p, .m = m, .v = v, .ms = 4, .g = g, .gd = o->gd, .out = out,
                        .od = o->od};
    b->roofs[0] = b->roofs[1] = b->r0;
    b->roofs[1].order = 1;
    b->nroof = adam_best_impl() == ADAM_IMPL_AVX512 ? 2 : 1;
    for (int ii = 0; ii <= b->ni; ii++) {
        b->args[ii] = (adam_args){.r = b->r0, .impl = ii < b->ni ? b->impls[ii] : ADAM_IMPL_AUTO,
                                  .hp = adam_hparams_default()};
        b->args[ii].hp.step = 10;
    }
    b->scalar = !o->quick;
    return 0;
}

/* The update rows at th threads: the roofs and the implementations timed in
 * turn, then the scalar reference on its own. */
static void bench_update_rows(bench_run *b, int th)
{
    uint64_t n = b->o.n;
    int nroof = b->nroof, scalar = b->scalar;
    variant vs[12];
    int nv = 0;
    for (int i = 0; i < nroof; i++) {
        b->roofs[i].threads = th;
        vs[nv++] = (variant){.name = "roof", .fn = roof_run, .arg = &b->roofs[i]};
    }
    for (int ii = scalar; ii <= b->ni; ii++) {
        b->args[ii].r.threads = th;
        vs[nv++] = (variant){.name = adam_impl_name(b->args[ii].impl), .fn = adam_run,
                             .arg = &b->args[ii]};
    }
    time_interleaved(vs, nv, 5, b->o.min_s);
    /* the roof is the fastest streaming kernel */
    double roof = vs[0].best;
    for (int i = 1; i < nroof; i++) roof = vs[i].best < roof ? vs[i].best : roof;
    if (scalar) {
        b->args[0].r.threads = th;
        vs[nv] = (variant){.name = "scalar", .fn = adam_run, .arg = &b->args[0]};
        time_interleaved(&vs[nv], 1, 2, 0.0);
        nv++;
    }
    double rr = (double)n / roof * 1e-9;
    bench_row("%-16s %7d %9.3f %8.2f %8.1f", "roof", th, rr, rr * b->bpp, 100.0);
    for (int i = nroof; i < nv; i++) {
        /* print the scalar reference first, as in the implementation list */
        variant *x = &vs[scalar && i == nroof ? nv - 1 : i - (scalar && i > nroof)];
        double r = (double)n / x->best * 1e-9;
        bench_row("%-16s %7d %9.3f %8.2f %8.1f", x->name, th, r, r * b->bpp,
                  100.0 * roof / x->best);
        if (x->arg == &b->args[b->ni] && th == b->o.tmax) b->main_rate = r * 1e9;
    }
}

/* One case per state encoding: its state, its roofs and its implementations
 * (the scalar reference apart); 0 or the exit code. */
static int bench_state_setup(bench_run *b)
{
    const bench_opts *o = &b->o;
    b->cases = calloc((size_t)o->nk + 1, sizeof *b->cases);
    if (!b->cases) return 1;
    for (int ki = 0; ki < o->nk; ki++) {
        state_case *sc = &b->cases[ki];
        adam_state_layout l;
        sc->kind = o->kinds[ki];
        if (adam_state_layout_of(sc->kind, o->n, &l) != ZO_OK ||
            !(sc->state = buf_alloc(&b->bufs[b->k], l.bytes, b->k, (size_t)o->stagger)) ||
            adam_state_init(sc->kind, sc->state, o->n, o->tmax) != ZO_OK) {
            fprintf(stderr, "bench_cpu_adam: cannot set up %s state for %llu parameters\n",
                    adam_state_name(sc->kind), (unsigned long long)o->n);
            return 1;
        }
        b->k++;
        roof_args rs = b->r0;
        rs.m = (char *)sc->state + l.off_m;
        rs.v = (char *)sc->state + l.off_v;
        rs.ms = sc->kind.type == ADAM_STATE_F32 ? 4 : sc->kind.type == ADAM_STATE_BF16 ? 2 : 1;
        sc->roofs[0] = sc->roofs[1] = rs;
        sc->roofs[1].order = 1;
        for (int ii = 0; ii <= b->ni; ii++) {
            adam_impl impl = ii < b->ni ? b->impls[ii] : ADAM_IMPL_AUTO;
            if (impl == ADAM_IMPL_SCALAR) continue; /* timed on its own below */
            sc->impls[sc->ni] = (adam_args){.r = b->r0, .impl = impl, .hp = adam_hparams_default()};
            sc->impls[sc->ni].r.m = sc; /* state_run's way to the state */
            sc->impls[sc->ni].hp.step = 10;
            sc->ni++;
        }
    }
    /* bytes moved per parameter: p, g, m, v read; p, m, v, copy written;
     * q8's two absmax per block read and written */
    for (int ki = 0; ki < o->nk; ki++) {
        double ms = b->cases[ki].roofs[0].ms;
        b->state_bpp[ki] = (double)(8 + b->gs) + 4.0 * ms + (double)b->os +
                           (o->kinds[ki].type == ADAM_STATE_Q8 ? 16.0 / o->kinds[ki].block : 0.0);
    }
    return 0;
}

/* Adds the roofs and implementations of one state case at th threads to vs,
 * named after the encoding (and its block size when not the default). */
static int state_variants(bench_run *b, state_case *sc, int th, variant *vs, char (*names)[40])
{
    int nv = 0;
    const char *kn = adam_state_name(sc->kind);
    int dflt = sc->kind.type != ADAM_STATE_Q8 || sc->kind.block == ADAM_Q8_BLOCK;
    for (int i = 0; i < b->nroof; i++) {
        sc->roofs[i].threads = th;
        if (dflt) snprintf(names[nv], sizeof names[nv], "roof %s", kn);
        else snprintf(names[nv], sizeof names[nv], "roof %s/%u", kn, sc->kind.block);
        vs[nv] = (variant){.name = names[nv], .fn = roof_run, .arg = &sc->roofs[i]};
        nv++;
    }
    for (int ii = 0; ii < sc->ni; ii++) {
        sc->impls[ii].r.threads = th;
        const char *in = adam_impl_name(sc->impls[ii].impl);
        if (dflt) snprintf(names[nv], sizeof names[nv], "%s %s", kn, in);
        else snprintf(names[nv], sizeof names[nv], "%s/%u %s", kn, sc->kind.block, in);
        vs[nv] = (variant){.name = names[nv], .fn = state_run, .arg = &sc->impls[ii]};
        nv++;
    }
    return nv;
}

/* The state rows at th threads: every encoding's roofs and implementations
 * timed in turn, so that they see the same load. */
static void bench_state_rows(bench_run *b, int th)
{
    const bench_opts *o = &b->o;
    int nk = o->nk, nroof = b->nroof;
    variant vs[MAX_STATES * 10];
    char names[MAX_STATES * 10][40];
    int nv = 0, first[MAX_STATES + 1];
    for (int ki = 0; ki < nk; ki++) {
        first[ki] = nv;
        nv += state_variants(b, &b->cases[ki], th, &vs[nv], &names[nv]);
    }
    first[nk] = nv;
    time_interleaved(vs, nv, 5, o->min_s);
    for (int ki = 0; ki < nk; ki++) {
        double roof = vs[first[ki]].best, bpp_k = b->state_bpp[ki];
        for (int i = 1; i < nroof; i++)
            roof = vs[first[ki] + i].best < roof ? vs[first[ki] + i].best : roof;
        double rr = (double)o->n / roof * 1e-9;
        bench_row("%-16s %7d %9.3f %8.2f %8.2f %8.1f", vs[first[ki]].name, th, rr, bpp_k,
                  rr * bpp_k, 100.0);
        for (int i = first[ki] + nroof; i < first[ki + 1]; i++) {
            double r = (double)o->n / vs[i].best * 1e-9;
            bench_row("%-16s %7d %9.3f %8.2f %8.2f %8.1f", vs[i].name, th, r, bpp_k, r * bpp_k,
                      100.0 * roof / vs[i].best);
            if (i == first[ki + 1] - 1 && th == o->tmax) { /* auto: the last */
                b->state_rate[ki] = r;
                b->state_roof[ki] = 100.0 * roof / vs[i].best;
            }
        }
    }
}

/* The scalar references of the state encodings, on their own (slow). */
static void bench_state_scalar_rows(bench_run *b)
{
    const bench_opts *o = &b->o;
    for (int ki = 0; ki < o->nk; ki++) {
        adam_args sa = {.r = b->r0, .impl = ADAM_IMPL_SCALAR, .hp = adam_hparams_default()};
        sa.r.m = &b->cases[ki];
        sa.r.threads = o->tmax;
        sa.hp.step = 10;
        variant v1 = {.name = "scalar", .fn = state_run, .arg = &sa};
        time_interleaved(&v1, 1, 2, 0.0);
        double r = (double)o->n / v1.best * 1e-9;
        char name[40];
        snprintf(name, sizeof name, "%s scalar", adam_state_name(o->kinds[ki]));
        bench_row("%-16s %7d %9.3f %8.2f %8.2f %8s", name, o->tmax, r, b->state_bpp[ki],
                  r * b->state_bpp[ki], "-");
        if (sa.st != ZO_OK) b->cases[ki].impls[0].st = sa.st;
    }
}

/* The conversion rows at th threads (bf16 and q8 encodings): for each, to
 * and from fp32, a roof with the conversion's bytes (the state's m and v
 * one way, fp32 m and v the other), the scalar conversion (the code before
 * the vector paths), every implementation and the automatic one, all timed
 * in turn. The fp32 side is the update rows' m and v, refilled first (the
 * roof of those rows leaves v negative, which from_f32 refuses). */
static void bench_conv_rows(bench_run *b, int th)
{
    const bench_opts *o = &b->o;
    enum { PER = 2 * 10 };
    variant vs[MAX_STATES * PER];
    conv_args args[MAX_STATES * PER];
    char names[MAX_STATES * PER][40];
    int nv = 0, first[MAX_STATES][2], last[MAX_STATES][2];
    fill(o->n, b->r0.p, b->r0.m, b->r0.v, (void *)b->r0.g, o->gd, b->r0.out, o->od, o->tmax);
    for (int ki = 0; ki < o->nk; ki++) {
        const state_case *sc = &b->cases[ki];
        first[ki][0] = first[ki][1] = -1;
        if (sc->kind.type == ADAM_STATE_F32) continue;
        /* a state coded from these moments (the state rows' roof left it
         * anything); from here on each round's "to" rows decode it into m
         * and v and its "from" rows code them back, so the moments stay
         * ordinary numbers with v >= 0 whatever the roofs write */
        if (adam_state_from_f32(sc->kind, sc->state, o->n, b->r0.m, b->r0.v, th) != ZO_OK) {
            fprintf(stderr, "bench_cpu_adam: %s\n", zo_last_error());
            b->conv_failed = 1;
            return;
        }
        for (int from = 0; from < 2; from++) {
            first[ki][from] = nv;
            const char *dir = from ? "from" : "to";
            /* the roof, the scalar, the vector ones, auto last */
            for (int ii = -2; ii <= b->ni; ii++) {
                adam_impl impl = ii == -1 ? ADAM_IMPL_SCALAR : ii < b->ni && ii >= 0 ? b->impls[ii]
                                                                                      : ADAM_IMPL_AUTO;
                if (ii >= 0 && ii < b->ni && (impl == ADAM_IMPL_SCALAR || impl == ADAM_IMPL_AVX512_NO_BF16))
                    continue;
                args[nv] = (conv_args){.sc = sc, .from = from, .roof = ii == -2, .impl = impl,
                                       .n = o->n, .m = b->r0.m, .v = b->r0.v, .threads = th};
                snprintf(names[nv], sizeof names[nv], "%s %s %s", adam_state_name(sc->kind), dir,
                         ii == -2 ? "roof" : adam_impl_name(impl));
                vs[nv] = (variant){.name = names[nv], .fn = conv_run, .arg = &args[nv]};
                nv++;
            }
            last[ki][from] = nv - 1;
        }
    }
    if (!nv) return;
    time_interleaved(vs, nv, 3, o->min_s);
    for (int ki = 0; ki < o->nk; ki++)
        for (int from = 0; from < 2; from++) {
            int f0 = first[ki][from];
            if (f0 < 0) continue;
            /* bytes a parameter: 8 fp32, the state's m and v, q8's absmax */
            adam_state_kind k = o->kinds[ki];
            double bpp = 8.0 + 2.0 * b->cases[ki].roofs[0].ms +
                         (k.type == ADAM_STATE_Q8 ? 8.0 / k.block : 0.0);
            for (int i = f0; i <= last[ki][from]; i++) {
                double r = (double)o->n / vs[i].best * 1e-9;
                bench_row("%-16s %7d %9.3f %8.2f %8.2f %8.1f", vs[i].name, th, r, bpp, r * bpp,
                          100.0 * vs[f0].best / vs[i].best);
                if (args[i].st != ZO_OK) {
                    fprintf(stderr, "bench_cpu_adam: %s: %s\n", vs[i].name, zo_last_error());
                    b->conv_failed = 1;
                }
            }
            if (th == o->tmax) {
                b->conv_speedup[ki][from] = vs[f0 + 1].best / vs[last[ki][from]].best;
                b->conv_roof[ki][from] = 100.0 * vs[f0].best / vs[last[ki][from]].best;
            }
        }
}

/* The gradient statistics rows at th threads, against a read-only stream. */
static void bench_stats_rows(bench_run *b, int th)
{
    variant vs[12];
    int nv = 0;
    b->roofs[0].threads = th;
    vs[nv++] = (variant){.name = "read roof", .fn = read_run, .arg = &b->roofs[0]};
    for (int ii = 0; ii < b->ni; ii++) {
        if (b->impls[ii] == ADAM_IMPL_AVX512_NO_BF16) continue; /* same kernel as avx512 */
        b->args[ii].r.threads = th;
        vs[nv++] = (variant){.name = adam_impl_name(b->impls[ii]), .fn = stats_run,
                             .arg = &b->args[ii]};
    }
    time_interleaved(vs, nv, 5, b->o.min_s / 2);
    for (int i = 0; i < nv; i++) {
        double r = (double)b->o.n / vs[i].best * 1e-9;
        bench_row("%-16s %7d %9.3f %8.2f %8.1f", vs[i].name, th, r, r * (double)b->gs,
                  100.0 * vs[0].best / vs[i].best);
    }
}

/* The last lines: params/s of the chosen case, then the encodings against
 * fp32 state and each against its own roof. */
static void bench_report(const bench_run *b)
{
    const bench_opts *o = &b->o;
    int tmax = o->tmax;
    bench_result("params/s", b->main_rate);
    int f32 = -1;
    for (int ki = 0; ki < o->nk; ki++)
        if (o->kinds[ki].type == ADAM_STATE_F32) f32 = ki;
    for (int ki = 0; ki < o->nk; ki++) {
        char label[96];
        if (f32 >= 0 && ki != f32 && b->state_rate[f32] > 0) {
            snprintf(label, sizeof label, "%s/fp32 Gparam/s (auto, %d thread%s)",
                     adam_state_name(o->kinds[ki]), tmax, tmax > 1 ? "s" : "");
            bench_result(label, b->state_rate[ki] / b->state_rate[f32]);
        }
        snprintf(label, sizeof label, "%s %%roof (auto, %d thread%s)",
                 adam_state_name(o->kinds[ki]), tmax, tmax > 1 ? "s" : "");
        bench_result(label, b->state_roof[ki]);
    }
    for (int ki = 0; ki < o->nk; ki++)
        for (int from = 0; from < 2; from++) {
            if (b->conv_speedup[ki][from] <= 0) continue;
            char label[96];
            const char *kn = adam_state_name(o->kinds[ki]), *dir = from ? "from_f32" : "to_f32";
            snprintf(label, sizeof label, "%s %s %%roof (auto, %d thread%s)", kn, dir, tmax,
                     tmax > 1 ? "s" : "");
            bench_result(label, b->conv_roof[ki][from]);
            snprintf(label, sizeof label, "%s %s auto/scalar speed (%d thread%s)", kn, dir, tmax,
                     tmax > 1 ? "s" : "");
            bench_result(label, b->conv_speedup[ki][from]);
        }
}

/* The first failed update call, reported; 0 or the exit code. */
static int bench_check_update(const bench_run *b)
{
    for (int ii = 0; ii <= b->ni; ii++)
        if (b->args[ii].st != ZO_OK) {
            fprintf(stderr, "bench_cpu_adam: %s: %s\n", adam_impl_name(b->args[ii].impl),
                    zo_status_name(b->args[ii].st));
            return 1;
        }
    return 0;
}

/* The first failed state update call, reported; 0 or the exit code. */
static int bench_check_states(const bench_run *b)
{
    for (int ki = 0; ki < b->o.nk; ki++)
        for (int ii = 0; ii < b->cases[ki].ni; ii++)
            if (b->cases[ki].impls[ii].st != ZO_OK) {
                fprintf(stderr, "bench_cpu_adam: %s state, %s: %s\n",
                        adam_state_name(b->o.kinds[ki]),
                        adam_impl_name(b->cases[ki].impls[ii].impl),
                        zo_status_name(b->cases[ki].impls[ii].st));
                return 1;
            }
    return 0;
}

int main(int argc, char **argv)
{
    bench_run run, *b = &run;
    memset(b, 0, sizeof *b);
    int rc = parse_args(argc, argv, &b->o);
    if (rc >= 0) return rc;
    const bench_opts *o = &b->o;
    if ((rc = bench_setup(b))) return rc;

    bench_row("%-16s %7s %9s %8s %8s", "# update", "threads", "Gparam/s", "GB/s", "%roof");
    for (int ti = 0; ti < o->nt; ti++) bench_update_rows(b, o->tlist[ti]);
    if ((rc = bench_check_update(b))) return rc;

    /* the state encodings: each with its roof, all timed in turn */
    if ((rc = bench_state_setup(b))) return rc;
    if (o->nk)
        bench_row("%-16s %7s %9s %8s %8s %8s", "# state", "threads", "Gparam/s", "B/param",
                  "GB/s", "%roof");
    for (int ti = 0; ti < o->nt && o->nk; ti++) bench_state_rows(b, o->tlist[ti]);
    if (!o->quick) bench_state_scalar_rows(b);
    if ((rc = bench_check_states(b))) return rc;

    /* the conversions of encoded state (the runtime's decode and code passes) */
    if (o->nk)
        bench_row("%-16s %7s %9s %8s %8s %8s", "# convert", "threads", "Gparam/s", "B/param",
                  "GB/s", "%roof");
    for (int ti = 0; ti < o->nt && o->nk; ti++) bench_conv_rows(b, o->tlist[ti]);
    if (b->conv_failed) return 1;

    bench_row("%-16s %7s %9s %8s %8s", "# grad stats", "threads", "Gparam/s", "GB/s", "%roof");
    for (int ti = 0; ti < o->nt; ti++) bench_stats_rows(b, o->tlist[ti]);
    for (int i = 0; i < b->k; i++) free(b->bufs[i].base);
    free(b->cases);
    bench_report(b);
    return 0;
}
