/* bench_gpu: the CPU device backend.
 *
 * Rows: GEMM shapes of a GPT-2 small layer (N = B*T = 512 tokens) through the
 * device interface (enqueue on a stream, synchronize), fp32 and bf16
 * storage, in GFLOP/s, beside the naive triple loop (cpu_gemm_naive, fp32
 * accumulation, same layouts) timed on a slice of rows in the same run; then
 * one training step (forward + backward) of a 4-layer, 256-wide GPT-2.
 * Last line: the geometric mean speed-up of the blocked GEMM over the naive
 * loop across the fp32 shapes.
 *
 * Usage: bench_gpu [threads]   (default: all cores) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"          /* defines: bench_header, bench_time_best, bench_row */
#include "gpu/device.h"           /* defines: gpu_gemm, gpu_stream_synchronize */
#include "gpu/ops_cpu.h"          /* defines: cpu_gemm_naive */
#include "tests/support/ref_trainer.h" /* defines: tf_trainer, tf_trainer_grads */

typedef struct gemm_case {
    const char *what;
    int ta, tb, m, n, k;
} gemm_case;

typedef struct gemm_run {
    gpu_stream_t s;
    gpu_gemm_desc d;
} gemm_run;

static void run_device(void *arg)
{
    gemm_run *r = arg;
    if (gpu_gemm(r->s, &r->d) != ZO_OK || gpu_stream_synchronize(r->s) != ZO_OK) {
        fprintf(stderr, "bench_gpu: %s\n", zo_last_error());
        exit(1);
    }
}

static void run_naive(void *arg) { cpu_gemm_naive(&((gemm_run *)arg)->d); }

static void *alloc_fill(gpu_device_t dev, size_t n, zo_dtype dt)
{
    void *p;
    if (gpu_mem_alloc(dev, n * zo_dtype_size(dt), &p) != ZO_OK) {
        fprintf(stderr, "bench_gpu: %s\n", zo_last_error());
        exit(1);
    }
    for (size_t i = 0; i < n; i++) zo_store_f32(p, dt, i, (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
    return p;
}

typedef struct step_run {
    tf_trainer *tr;
    gpu_stream_t s;
    int32_t *in, *tg;
    int b, t;
} step_run;

static void run_step(void *arg)
{
    step_run *r = arg;
    tf_step_info info;
    if (tf_trainer_grads(r->tr, r->s, r->in, r->tg, r->b, r->t, &info) != ZO_OK) {
        fprintf(stderr, "bench_gpu: %s\n", zo_last_error());
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    gpu_device_t dev;
    gpu_stream_t s;
    gpu_cpu_options opt = {.n_threads = threads};
    if (gpu_device_init_cpu(&opt, &dev) != ZO_OK || gpu_stream_create(dev, &s) != ZO_OK) {
        fprintf(stderr, "bench_gpu: %s\n", zo_last_error());
        return 1;
    }
    bench_header("bench_gpu", "cpu backend, %s threads per op; GEMM N=512 tokens, GPT-2 small widths",
                 threads ? argv[1] : "all");
    const gemm_case cases[] = {
        {"qkv   x W^T", 0, 1, 512, 2304, 768},
        {"fc    x W^T", 0, 1, 512, 3072, 768},
        {"proj  x W^T", 0, 1, 512, 768, 3072},
        {"dx    dy W ", 0, 0, 512, 768, 2304},
        {"dW  dy^T x ", 1, 0, 768, 768, 512},
    };
    const int naive_rows = 16; /* the naive loop runs on a slice of m */
    double log_sum = 0.0;
    int n_ratio = 0;
    bench_row("%-12s %-5s %5s %5s %5s %12s %12s %8s", "case", "dtype", "m", "n", "k",
              "GFLOP/s", "naive", "speedup");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const gemm_case *g = &cases[c];
        for (int dti = 0; dti < 2; dti++) {
            zo_dtype dt = dti ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
            size_t na = (size_t)g->m * g->k, nb = (size_t)g->k * g->n, nc = (size_t)g->m * g->n;
            gemm_run r = {.s = s};
            r.d = (gpu_gemm_desc){.trans_a = g->ta, .trans_b = g->tb, .m = g->m, .n = g->n, .k = g->k,
                                  .alpha = 1.0f, .beta = 0.0f,
                                  .a = gpu_t(alloc_fill(dev, na, dt), dt),
                                  .b = gpu_t(alloc_fill(dev, nb, dt), dt),
                                  .c = gpu_t(alloc_fill(dev, nc, dt), dt),
                                  .lda = g->ta ? g->m : g->k, .ldb = g->tb ? g->k : g->n, .ldc = g->n};
            double flops = 2.0 * g->m * g->n * g->k;
            double t = bench_time_best(run_device, &r, 1, 3, 0.3);
            double gf = flops / t * 1e-9, gn = 0.0;
            if (dt == ZO_DTYPE_F32) {
                gemm_run nr = r;
                nr.d.m = naive_rows; /* op(A) rows 0..naive_rows-1, same strides */
                double tn = bench_time_best(run_naive, &nr, 0, 1, 0.2);
                gn = 2.0 * naive_rows * g->n * g->k / tn * 1e-9;
                log_sum += log(gf / gn);
                n_ratio++;
                bench_row("%-12s %-5s %5d %5d %5d %12.2f %12.3f %8.1f", g->what, zo_dtype_name(dt),
                          g->m, g->n, g->k, gf, gn, gf / gn);
            } else {
                bench_row("%-12s %-5s %5d %5d %5d %12.2f %12s %8s", g->what, zo_dtype_name(dt), g->m,
                          g->n, g->k, gf, "-", "-");
            }
            gpu_mem_free(dev, r.d.a.data);
            gpu_mem_free(dev, r.d.b.data);
            gpu_mem_free(dev, r.d.c.data);
        }
    }

    /* one forward + backward of a small GPT-2 through the transformer */
    zo_model_config cfg;
    const char *json = "{\"model_type\": \"gpt2\", \"n_layer\": 4, \"n_embd\": 256, \"n_head\": 4,"
                       " \"n_positions\": 256, \"vocab_size\": 8192}";
    tf_model m;
    tf_trainer tr;
    tf_adamw aw = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
    int b = 4, t = 128;
    if (zo_model_config_parse(json, "bench", &cfg) != ZO_OK ||
        tf_init(&m, &cfg, dev, ZO_DTYPE_F32, b, t) != ZO_OK || tf_trainer_init(&tr, &m, &aw) != ZO_OK) {
        fprintf(stderr, "bench_gpu: %s\n", zo_last_error());
        return 1;
    }
    tf_init_weights(&m.layout, tr.master, 1);
    if (tf_trainer_upload(&tr, s) != ZO_OK) return 1;
    int32_t *in = malloc((size_t)b * t * 4), *tg = malloc((size_t)b * t * 4);
    for (int i = 0; i < b * t; i++) {
        in[i] = (i * 7919) % cfg.vocab;
        tg[i] = (i * 104729 + 1) % cfg.vocab;
    }
    step_run sr = {.tr = &tr, .s = s, .in = in, .tg = tg, .b = b, .t = t};
    double ts = bench_time_best(run_step, &sr, 1, 2, 0.5);
    double step_flops = 6.0 * (double)m.layout.total_numel * b * t; /* 6 * params * tokens */
    bench_row("train step: gpt2 4x256 vocab 8192 (%.1fM params), batch %dx%d: %.3f s, %.0f tok/s, ~%.1f GFLOP/s",
              m.layout.total_numel / 1e6, b, t, ts, b * t / ts, step_flops / ts * 1e-9);
    tf_trainer_free(&tr);
    tf_free(&m);
    free(in);
    free(tg);
    gpu_stream_destroy(s);
    gpu_device_free(dev);
    bench_result("gemm fp32 speedup over naive (geomean)", exp(log_sum / n_ratio));
    return 0;
}
