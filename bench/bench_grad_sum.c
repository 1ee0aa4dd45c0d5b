/* bench_grad_sum: the host's gradient sum (cpu_adam's adam_grad_accumulate,
 * what offload_grads_accumulate runs for every block and micro-batch)
 * against the memory roof measured in the same run.
 *
 * For each gradient dtype (bf16, fp32) and each kind of addition (fresh: the
 * step's first, which writes the sum without reading it; add: the later
 * micro-batches, which read and write it), a roof with the same bytes (the
 * same loads and stores, an integer OR in place of the conversion and the
 * fp32 addition) and the accumulate, alternated round by round, each taking
 * its best round. Rows: case, threads, Gelem/s, GB/s, % of the roof. The
 * last line: the accumulate's time over the roof's, summed over the cases
 * (1.00: at the memory roof). Then (-b) the old path for comparison: a
 * memset of the sum and the scalar loop, single-threaded, as the runtime
 * ran it. With -s, the clipping statistics too: the sum then
 * adam_grad_stats' pass over it (`+stats`, the runtime's step before
 * 2026-11-27), and adam_grad_accumulate_stats (`fused`, the last addition
 * of a step now), alternated with the others; their GB/s at the sum's
 * bytes.
 *
 *   bench_grad_sum [-n elements] [-t threads] [-r rounds] [-b] [-s] [-q]
 */
#include <getopt.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"       /* bench_header, bench_time_best, bench_row, bench_result */
#include "common/dtype.h"      /* zo_dtype, zo_store_f32 */
#include "common/units.h"      /* zo_parse_count, zo_parse_int */
#include "cpu_adam/cpu_adam.h" /* adam_grad_accumulate */

typedef struct acc_case {
    float *acc;
    const void *g;
    zo_dtype gd;
    size_t n;
    int fresh, threads;
} acc_case;

static void run_accumulate(void *p)
{
    acc_case *c = p;
    if (adam_grad_accumulate(c->acc, c->g, c->gd, c->n, c->fresh, c->threads) != ZO_OK) abort();
}

/* The sum, then a pass of its own for the statistics. */
static void run_then_stats(void *p)
{
    acc_case *c = p;
    double ss;
    int nf;
    if (adam_grad_accumulate(c->acc, c->g, c->gd, c->n, c->fresh, c->threads) != ZO_OK ||
        adam_grad_stats(c->acc, ZO_DTYPE_F32, c->n, c->threads, &ss, &nf) != ZO_OK)
        abort();
    bench_sink(&ss);
}

/* The sum with its statistics in the same pass. */
static void run_fused(void *p)
{
    acc_case *c = p;
    double ss;
    int nf;
    if (adam_grad_accumulate_stats(c->acc, c->g, c->gd, c->n, c->fresh, c->threads, c->threads, &ss, &nf) != ZO_OK)
        abort();
    bench_sink(&ss);
}

/* The roof: the accumulate's loads and stores (fresh: the gradient read,
 * the sum written; add: both read, the sum written) with an integer OR for
 * arithmetic, over the same OpenMP split. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void roof_part(float *acc, const void *g, zo_dtype gd,
                                                                           size_t n, int fresh)
{
    size_t i = 0;
    int32_t *a = (int32_t *)acc;
    for (; i + 16 <= n; i += 16) {
        __m512i x = gd == ZO_DTYPE_F32 ? _mm512_loadu_si512((const float *)g + i)
                                       : _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                             (const __m256i *)((const uint16_t *)g + i)));
        if (!fresh) x = _mm512_or_si512(x, _mm512_loadu_si512(a + i));
        _mm512_storeu_si512(a + i, x);
    }
    for (; i < n; i++) a[i] = (int32_t)(gd == ZO_DTYPE_F32 ? ((const int32_t *)g)[i] : ((const uint16_t *)g)[i]) |
                              (fresh ? 0 : a[i]);
}

static void run_roof(void *p)
{
    acc_case *c = p;
    int nt = adam_grad_accumulate_threads(c->n, c->threads);
    size_t es = zo_dtype_size(c->gd);
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), team = omp_get_num_threads();
        size_t per = (c->n + (size_t)team - 1) / (size_t)team, lo = (size_t)t * per;
        size_t hi = lo + per < c->n ? lo + per : c->n;
        if (hi > lo) roof_part(c->acc + lo, (const char *)c->g + lo * es, c->gd, hi - lo, c->fresh);
    }
}

/* The runtime's loop before adam_grad_accumulate: a memset of the sum on
 * the step's first addition, then the scalar loop, on the host thread. */
static void run_old(void *p)
{
    acc_case *c = p;
    if (c->fresh) memset(c->acc, 0, c->n * 4);
    if (c->gd == ZO_DTYPE_F32) {
        const float *x = c->g;
        for (size_t i = 0; i < c->n; i++) c->acc[i] += x[i];
    } else {
        const uint16_t *x = c->g;
        for (size_t i = 0; i < c->n; i++) c->acc[i] += zo_bf16_to_f32(x[i]);
    }
}

int main(int argc, char **argv)
{
    uint64_t n = 128u << 20; /* 512 MiB of fp32 sum: past this VM's caches */
    long threads = 0, rounds = 5;
    int quiet = 0, old = 0, stats = 0, opt;
    while ((opt = getopt(argc, argv, "n:t:r:bsq")) != -1) {
        zo_status st = ZO_OK;
        switch (opt) {
        case 'n': st = zo_parse_count(optarg, "-n", &n); break;
        case 't': st = zo_parse_int(optarg, "-t", 0, 1024, &threads); break;
        case 'r': st = zo_parse_int(optarg, "-r", 1, 1000, &rounds); break;
        case 'b': old = 1; break;
        case 's': stats = 1; break;
        case 'q': quiet = 1; break;
        default: st = ZO_ERR_INVALID; break;
        }
        if (st != ZO_OK || n == 0) {
            fprintf(stderr, "usage: bench_grad_sum [-n elements] [-t threads] [-r rounds] [-b] [-s] [-q]\n");
            return 2;
        }
    }
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
        fprintf(stderr, "bench_grad_sum: the roof kernel needs AVX-512 (F, BW), which this CPU lacks\n");
        return 77;
    }
    int team = adam_grad_accumulate_threads((size_t)n, (int)threads);
    bench_header("bench_grad_sum", "%llu elements a block, %d threads (-t %ld), %ld rounds, %s",
                 (unsigned long long)n, team, threads, rounds, adam_impl_name(adam_best_impl()));
    float *acc = aligned_alloc(64, ((size_t)n * 4 + 63) / 64 * 64);
    float *g = aligned_alloc(64, ((size_t)n * 4 + 63) / 64 * 64);
    if (!acc || !g) {
        fprintf(stderr, "bench_grad_sum: out of memory for %llu elements\n", (unsigned long long)n);
        return 1;
    }
    for (size_t i = 0; i < n; i++) acc[i] = (float)(i % 1000) * 1e-3f, g[i] = (float)(i % 777) * 1e-4f;
    static const zo_dtype dts[2] = {ZO_DTYPE_BF16, ZO_DTYPE_F32};
    double t_acc = 0, t_roof = 0;
    if (!quiet) bench_row("# %-12s %7s %9s %8s %7s", "case", "threads", "Gelem/s", "GB/s", "%roof");
    for (int d = 0; d < 2; d++)
        for (int fresh = 1; fresh >= 0; fresh--) {
            acc_case c = {.acc = acc, .g = g, .gd = dts[d], .n = (size_t)n, .fresh = fresh, .threads = (int)threads};
            double bytes = (double)n * (zo_dtype_size(dts[d]) + 4 + (fresh ? 0 : 4)), ba = 1e30, br = 1e30, bo = 0;
            double bs = 1e30, bf = 1e30;
            for (int r = 0; r < rounds; r++) {
                double a = bench_time_best(run_accumulate, &c, 1, 3, 0.0), f = bench_time_best(run_roof, &c, 1, 3, 0.0);
                if (a < ba) ba = a;
                if (f < br) br = f;
                if (!stats) continue;
                double s2 = bench_time_best(run_then_stats, &c, 1, 3, 0.0), f2 = bench_time_best(run_fused, &c, 1, 3, 0.0);
                if (s2 < bs) bs = s2;
                if (f2 < bf) bf = f2;
            }
            if (old) bo = bench_time_best(run_old, &c, 1, 3, 0.0);
            t_acc += ba, t_roof += br;
            char name[32];
            snprintf(name, sizeof name, "%s-%s", zo_dtype_name(dts[d]), fresh ? "fresh" : "add");
            if (!quiet) {
                bench_row("  %-12s %7d %9.3f %8.2f %7.1f", "roof", team, n / br / 1e9, bytes / br / 1e9, 100.0);
                bench_row("  %-12s %7d %9.3f %8.2f %7.1f", name, team, n / ba / 1e9, bytes / ba / 1e9, 100 * br / ba);
                if (old)
                    bench_row("  %-12s %7d %9.3f %8.2f %7.1f", "old-path", 1, n / bo / 1e9, bytes / bo / 1e9,
                              100 * br / bo);
                if (stats) {
                    bench_row("  %-12s %7d %9.3f %8.2f %7.1f", "+stats", team, n / bs / 1e9, bytes / bs / 1e9,
                              100 * br / bs);
                    bench_row("  %-12s %7d %9.3f %8.2f %7.1f", "fused", team, n / bf / 1e9, bytes / bf / 1e9,
                              100 * br / bf);
                }
            }
        }
    bench_sink(acc);
    free(acc);
    free(g);
    bench_result("accumulate / roof (time, all cases)", t_acc / t_roof);
    return 0;
}
