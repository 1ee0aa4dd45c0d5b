/* bench_gpu: the CPU device backend.
 *
 * GEMM rows: shapes of GPT-2 small (N = 1024 tokens: the forward products,
 * an input gradient and a weight gradient, and one at N = 1000, whose depth
 * OpenBLAS's own threading splits differently by thread count), LLaMA-7B
 * (N = 512) and a LoRA adapter, fp32 and bf16 storage, through the device
 * interface (enqueue on a stream, synchronize): the backend's own kernel
 * ("own"), the backend as it dispatches ("backend": OpenBLAS on fixed
 * tiles, docs/gpu.md), and OpenBLAS called as a user would ("OpenBLAS":
 * cblas_sgemm on the calling thread with its own threading over the same
 * thread count; Debian's build has no 16-bit GEMM, so bf16 rows give it fp32
 * copies of the same values). The three alternate (3 rounds unless told),
 * best of each: GFLOP/s, then own / OpenBLAS and backend / OpenBLAS. "lib 1=n" says
 * whether OpenBLAS's own threading gave the bits of its 1-thread run (the
 * backend's are the same for any thread count: test_gpu_gemm).
 * Then one training step of a 4-layer, 256-wide GPT-2, own kernel and
 * backend alternated; then the bf16 rows of common/dtype.c on one thread,
 * AVX2 and scalar alternated with a memcpy (bench_rows).
 * Last lines: own / OpenBLAS, then backend / OpenBLAS, geometric means over
 * the GEMM rows.
 *
 * Usage: bench_gpu [threads [rounds]]   (default: all cores, 3 rounds)
 * Measure OpenBLAS with OPENBLAS_CORETYPE unset (its kernel for this CPU). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ZO_HAVE_OPENBLAS
#include <cblas.h> /* defines: cblas_sgemm */
#endif

#include "bench/bench.h"          /* defines: bench_header, bench_time_best, bench_row */
#include "common/dtype.h"         /* defines: zo_bf16_to_f32_row, zo_f32_to_bf16_row, zo_convert_simd */
#include "gpu/device.h"           /* defines: gpu_gemm, gpu_stream_synchronize */
#include "gpu/ops_cpu.h"          /* defines: cpu_gemm_set_impl, cpu_gemm_blas */
#include "tests/support/ref_trainer.h" /* defines: tf_trainer, tf_trainer_grads */

typedef struct gemm_case {
    const char *what;
    int ta, tb, m, n, k;
} gemm_case;

typedef struct gemm_run {
    gpu_stream_t s;
    gpu_gemm_desc d;
    cpu_gemm_impl impl;
    float *a32, *b32, *c32; /* fp32 copies for the library */
    int threads;
} gemm_run;

static void die(void)
{
    fprintf(stderr, "bench_gpu: %s\n", zo_last_error());
    exit(1);
}

static void run_device(void *arg)
{
    gemm_run *r = arg;
    cpu_gemm_set_impl(r->impl);
    if (gpu_gemm(r->s, &r->d) != ZO_OK || gpu_stream_synchronize(r->s) != ZO_OK) die();
}

#ifdef ZO_HAVE_OPENBLAS
static void run_blas(void *arg)
{
    gemm_run *r = arg;
    const gpu_gemm_desc *d = &r->d;
    omp_set_num_threads(r->threads); /* the OpenMP build's thread count for this call */
    cblas_sgemm(CblasRowMajor, d->trans_a ? CblasTrans : CblasNoTrans,
                d->trans_b ? CblasTrans : CblasNoTrans, d->m, d->n, d->k, d->alpha, r->a32,
                (int)d->lda, r->b32, (int)d->ldb, d->beta, r->c32, (int)d->ldc);
}
#endif

/* n values of dtype dt on the device, and their fp32 copy on the host. */
static void *alloc_fill(gpu_device_t dev, size_t n, zo_dtype dt, float **copy)
{
    void *p;
    if (gpu_mem_alloc(dev, n * zo_dtype_size(dt), &p) != ZO_OK) die();
    *copy = malloc(n * sizeof(float));
    if (!*copy) {
        fprintf(stderr, "bench_gpu: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        zo_store_f32(p, dt, i, (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
        (*copy)[i] = zo_load_f32(p, dt, i);
    }
    return p;
}

typedef struct step_run {
    tf_trainer *tr;
    gpu_stream_t s;
    int32_t *in, *tg;
    int b, t;
    cpu_gemm_impl impl;
} step_run;

static void run_step(void *arg)
{
    step_run *r = arg;
    tf_step_info info;
    cpu_gemm_set_impl(r->impl);
    if (tf_trainer_grads(r->tr, r->s, r->in, r->tg, r->b, r->t, &info) != ZO_OK) die();
}

/* The smaller of prev and one more best-of timing of fn (one round). */
static double best_of(void (*fn)(void *), void *arg, double prev)
{
    double t = bench_time_best(fn, arg, 1, 2, 0.05);
    return t < prev ? t : prev;
}

static const gemm_case cases[] = {
    {"gpt2 qkv   x W^T", 0, 1, 1024, 2304, 768},
    {"gpt2 fc    x W^T", 0, 1, 1024, 3072, 768},
    {"gpt2 proj  x W^T", 0, 1, 1024, 768, 3072},
    {"gpt2 dx    dy W", 0, 0, 1024, 768, 3072},
    {"gpt2 dW  dy^T x", 1, 0, 3072, 768, 1024},
    {"gpt2 dW  N=1000", 1, 0, 768, 768, 1000},
    {"llama q    x W^T", 0, 1, 512, 4096, 4096},
    {"llama up   x W^T", 0, 1, 512, 11008, 4096},
    {"lora  x A^T r16", 0, 1, 512, 16, 4096},
    {"lora  u B^T r16", 0, 1, 512, 4096, 16},
};

/* The sums of logs behind the last lines' geometric means. */
typedef struct tally {
    double log_own, log_back, log_gf;
    int n_ratio, n_rows;
} tally;

/* Whether OpenBLAS's threading gave the bits of its 1-thread run of r (whose
 * c32 holds the last threaded result): "same", "differ", or "-" where not
 * compared (bf16 rows, no OpenBLAS). */
static const char *blas_same_bits(const gemm_run *r, zo_dtype dt, size_t nc)
{
    const char *same = "-";
#ifdef ZO_HAVE_OPENBLAS
    if (dt == ZO_DTYPE_F32) { /* the library's bits with 1 thread and with nt */
        float *c1 = malloc(nc * sizeof(float));
        memcpy(c1, r->c32, nc * sizeof(float));
        gemm_run one = *r;
        one.threads = 1;
        one.c32 = c1;
        run_blas(&one);
        same = memcmp(c1, r->c32, nc * sizeof(float)) ? "differ" : "same";
        free(c1);
    }
#else
    (void)r, (void)dt, (void)nc;
#endif
    return same;
}

/* Case g in dtype dt: the own kernel, the backend and OpenBLAS alternated
 * for `rounds`, best of each; its row, and its part of the means. */
static void bench_gemm_case(gpu_device_t dev, gpu_stream_t s, const gemm_case *g, zo_dtype dt, int nt, int rounds,
                            tally *sum)
{
    size_t na = (size_t)g->m * g->k, nb = (size_t)g->k * g->n, nc = (size_t)g->m * g->n;
    gemm_run r = {.s = s, .threads = nt};
    r.d = (gpu_gemm_desc){.trans_a = g->ta, .trans_b = g->tb, .m = g->m, .n = g->n, .k = g->k,
                          .alpha = 1.0f, .beta = 0.0f,
                          .a = gpu_t(alloc_fill(dev, na, dt, &r.a32), dt),
                          .b = gpu_t(alloc_fill(dev, nb, dt, &r.b32), dt),
                          .c = gpu_t(alloc_fill(dev, nc, dt, &r.c32), dt),
                          .lda = g->ta ? g->m : g->k, .ldb = g->tb ? g->k : g->n, .ldc = g->n};
    double flops = 2.0 * g->m * g->n * g->k, t_own = 1e300, t_back = 1e300, t_lib = 1e300;
    gemm_run own = r, back = r;
    own.impl = CPU_GEMM_OWN;
    back.impl = CPU_GEMM_AUTO;
    for (int round = 0; round < rounds; round++) {
        t_own = best_of(run_device, &own, t_own);
        t_back = best_of(run_device, &back, t_back);
#ifdef ZO_HAVE_OPENBLAS
        t_lib = best_of(run_blas, &r, t_lib);
#endif
    }
    const char *same = blas_same_bits(&r, dt, nc);
    double g_own = flops / t_own * 1e-9, g_back = flops / t_back * 1e-9;
    sum->log_gf += log(g_back);
    sum->n_rows++;
    if (t_lib < 1e300) {
        double g_lib = flops / t_lib * 1e-9;
        sum->log_own += log(g_own / g_lib);
        sum->log_back += log(g_back / g_lib);
        sum->n_ratio++;
        bench_row("%-17s %-5s %5d %6d %5d %9.1f %9.1f %9.1f %9.3f %9.3f %8s", g->what, zo_dtype_name(dt), g->m,
                  g->n, g->k, g_own, g_back, g_lib, g_own / g_lib, g_back / g_lib, same);
    } else {
        bench_row("%-17s %-5s %5d %6d %5d %9.1f %9.1f %9s %9s %9s %8s", g->what, zo_dtype_name(dt), g->m, g->n,
                  g->k, g_own, g_back, "-", "-", "-", same);
    }
    gpu_mem_free(dev, r.d.a.data);
    gpu_mem_free(dev, r.d.b.data);
    gpu_mem_free(dev, r.d.c.data);
    free(r.a32), free(r.b32), free(r.c32);
}

/* One forward + backward of a small GPT-2 through the transformer, own
 * kernel and backend alternated for `rounds`, best of each; its row. */
static void bench_train_step(gpu_device_t dev, gpu_stream_t s, int rounds)
{
    zo_model_config cfg;
    const char *json = "{\"model_type\": \"gpt2\", \"n_layer\": 4, \"n_embd\": 256, \"n_head\": 4,"
                       " \"n_positions\": 256, \"vocab_size\": 8192}";
    tf_model m;
    tf_trainer tr;
    tf_adamw aw = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
    int b = 4, t = 128;
    if (zo_model_config_parse(json, "bench", &cfg) != ZO_OK ||
        tf_init(&m, &cfg, dev, ZO_DTYPE_F32, b, t) != ZO_OK || tf_trainer_init(&tr, &m, &aw) != ZO_OK)
        die();
    tf_init_weights(&m.layout, tr.master, 1);
    if (tf_trainer_upload(&tr, s) != ZO_OK) die();
    int32_t *in = malloc((size_t)b * t * 4), *tg = malloc((size_t)b * t * 4);
    for (int i = 0; i < b * t; i++) {
        in[i] = (i * 7919) % cfg.vocab;
        tg[i] = (i * 104729 + 1) % cfg.vocab;
    }
    step_run so = {.tr = &tr, .s = s, .in = in, .tg = tg, .b = b, .t = t, .impl = CPU_GEMM_OWN};
    step_run sb = so;
    sb.impl = CPU_GEMM_AUTO;
    double ts_own = 1e300, ts_back = 1e300;
    for (int round = 0; round < rounds; round++) {
        double x = bench_time_best(run_step, &so, 1, 2, 0.3);
        double y = bench_time_best(run_step, &sb, 1, 2, 0.3);
        ts_own = x < ts_own ? x : ts_own;
        ts_back = y < ts_back ? y : ts_back;
    }
    double step_flops = 6.0 * (double)m.layout.total_numel * b * t; /* 6 * params * tokens */
    bench_row("train step: gpt2 4x256 vocab 8192 (%.1fM params), batch %dx%d: own kernel %.3f s "
              "(%.0f tok/s, ~%.1f GFLOP/s), backend %.3f s (%.0f tok/s, ~%.1f GFLOP/s): %.3fx",
              m.layout.total_numel / 1e6, b, t, ts_own, b * t / ts_own, step_flops / ts_own * 1e-9,
              ts_back, b * t / ts_back, step_flops / ts_back * 1e-9, ts_own / ts_back);
    cpu_gemm_set_impl(CPU_GEMM_AUTO);
    tf_trainer_free(&tr);
    tf_free(&m);
    free(in);
    free(tg);
}

/* ---- bf16 rows (common/dtype.c) ---- */

typedef struct rows_run {
    float *f;
    uint16_t *h;
    float *copy;
    size_t n;
    int what; /* 0 widen, 1 round, 2 memcpy of the fp32 bytes */
} rows_run;

#define ROWS_REPS 256

static void run_rows(void *arg)
{
    rows_run *r = arg;
    for (int k = 0; k < ROWS_REPS; k++) {
        if (r->what == 0) zo_bf16_to_f32_row(r->f, r->h, r->n);
        else if (r->what == 1) zo_f32_to_bf16_row(r->h, r->f, r->n);
        else memcpy(r->copy, r->f, r->n * sizeof(float));
    }
}

/* The rows on one thread: 64K elements (the fp32 side 256 KiB, in the
 * caches as an op's rows are) converted 256 times, widened and rounded on
 * the AVX2 path and on the scalar loops (zo_convert_simd), alternated with
 * a memcpy of the fp32 side's bytes; GB/s of the bytes each moves (2 + 4 an
 * element; memcpy 8), best of `rounds`. The scalar loops are the sanitizer
 * build's path (they do not vectorize there); in this build GCC vectorizes
 * them too. */
static void bench_rows(int rounds)
{
    const size_t n = (size_t)64 << 10;
    rows_run r = {.f = malloc(n * sizeof(float)), .h = malloc(n * sizeof(uint16_t)),
                  .copy = malloc(n * sizeof(float)), .n = n};
    if (!r.f || !r.h || !r.copy) die();
    for (size_t i = 0; i < n; i++) r.f[i] = (float)((double)(i % 1000003) * 1e-3 - 500.0);
    memset(r.copy, 0, n * sizeof(float));
    zo_f32_to_bf16_row(r.h, r.f, n);
    double t[2][2] = {{1e30, 1e30}, {1e30, 1e30}}, tc = 1e30; /* [simd][widen, round] */
    int have = zo_convert_simd(1);
    for (int k = 0; k < rounds; k++)
        for (int simd = have; simd >= 0; simd--) {
            zo_convert_simd(simd);
            for (int w = 0; w < 2; w++) {
                r.what = w;
                t[simd][w] = best_of(run_rows, &r, t[simd][w]);
            }
            r.what = 2;
            tc = best_of(run_rows, &r, tc);
        }
    zo_convert_simd(1);
    const double gb = 6.0 * n * ROWS_REPS / 1e9, gbc = 8.0 * n * ROWS_REPS / 1e9;
    bench_row("%-22s %9s %9s %9s %10s %10s", "bf16 rows, 1 thread", "AVX2", "scalar", "memcpy", "AVX2/scal",
              "AVX2/memcpy");
    for (int w = 0; w < 2; w++)
        bench_row("%-22s %6.1f GB/s %6.1f GB/s %6.1f GB/s %10.2f %10.2f", w ? "fp32 -> bf16 (round)" : "bf16 -> fp32 (widen)",
                  have ? gb / t[1][w] : 0.0, gb / t[0][w], gbc / tc, have ? t[0][w] / t[1][w] : 0.0,
                  have ? (gb / t[1][w]) / (gbc / tc) : 0.0);
    free(r.f);
    free(r.h);
    free(r.copy);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    gpu_device_t dev;
    gpu_stream_t s;
    gpu_cpu_options opt = {.n_threads = threads};
    if (gpu_device_init_cpu(&opt, &dev) != ZO_OK || gpu_stream_create(dev, &s) != ZO_OK) die();
    const int nt = threads > 0 ? threads : omp_get_max_threads();
    const int rounds = argc > 2 && atoi(argv[2]) > 0 ? atoi(argv[2]) : 3;
    const char *blas = cpu_gemm_blas(), *coretype = getenv("OPENBLAS_CORETYPE");
    bench_header("bench_gpu", "cpu backend, %d threads per op, %d rounds; library: %s; "
                 "OPENBLAS_CORETYPE %s", nt, rounds, blas ? blas : "none (own kernel only)",
                 coretype ? coretype : "unset");
    tally sum = {0};
    bench_row("%-17s %-5s %5s %6s %5s %9s %9s %9s %9s %9s %8s", "case", "dtype", "m", "n", "k",
              "own", "backend", "OpenBLAS", "own/OB", "back/OB", "lib 1=n");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        bench_gemm_case(dev, s, &cases[c], ZO_DTYPE_F32, nt, rounds, &sum);
        bench_gemm_case(dev, s, &cases[c], ZO_DTYPE_BF16, nt, rounds, &sum);
    }
    bench_train_step(dev, s, rounds);
    bench_rows(rounds);
    gpu_stream_destroy(s);
    gpu_device_free(dev);
    if (sum.n_ratio) {
        bench_row("gemm own / OpenBLAS GFLOP/s (geomean): %.3f", exp(sum.log_own / sum.n_ratio));
        bench_result("gemm backend / OpenBLAS GFLOP/s (geomean)", exp(sum.log_back / sum.n_ratio));
    } else {
        bench_result("gemm backend GFLOP/s (geomean; no OpenBLAS built in)", exp(sum.log_gf / sum.n_rows));
    }
    return 0;
}
