/* bench_offload: one training step (forward, backward, gradients to the
 * host, CPU AdamW) of a GPT-2-shaped model on the CPU device backend, with
 * the weights all resident against streamed from pinned host memory at
 * prefetch depths 0, 1 and 2. The copies of the CPU backend run on their own
 * stream threads, so a deeper prefetch hides them behind compute as on a GPU.
 * The last line: streamed (prefetch 2) step time over resident. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"          /* defines: bench_header, bench_time_best, bench_row */
#include "common/units.h"         /* defines: zo_format_bytes */
#include "examples/trainer.h"     /* defines: tf_offload_model */
#include "offload/offload.h"      /* defines: offload_init, offload_micro_batch, offload_step */

#define LAYERS 8
#define HIDDEN 256
#define VOCAB 4096
#define B 4
#define T 64

typedef struct bench_case {
    gpu_device_t dev;
    gpu_stream_t s;
    tf_model m;
    tf_offload_model tm;
    offload_t *rt;
    int32_t in[B * T], tg[B * T];
    int64_t k;
    int failed;
} bench_case;

static int case_init(bench_case *c, offload_tier params, int depth)
{
    memset(c, 0, sizeof *c);
    zo_model_config cfg;
    if (zo_model_preset_find("gpt2", &cfg) != ZO_OK) return -1;
    cfg.n_layers = LAYERS;
    cfg.hidden = HIDDEN;
    cfg.n_heads = 4;
    cfg.head_dim = 0;
    cfg.n_kv_heads = 0;
    cfg.ffn = 4 * HIDDEN;
    cfg.vocab = VOCAB;
    cfg.max_seq = T;
    if (zo_model_config_validate(&cfg) != ZO_OK) return -1;
    gpu_cpu_options dopt = {0};
    offload_config oc;
    offload_config_defaults(&oc);
    oc.params_on = params;
    oc.prefetch_depth = depth;
    tf_options to = {.external_res = 1};
    if (gpu_device_init_cpu(&dopt, &c->dev) != ZO_OK || gpu_stream_create(c->dev, &c->s) != ZO_OK ||
        tf_init_opts(&c->m, &cfg, c->dev, ZO_DTYPE_BF16, B, T, &to) != ZO_OK ||
        tf_offload_model_init(&c->tm, &c->m) != ZO_OK || offload_init(&c->rt, c->dev, &c->tm.om, &oc) != ZO_OK)
        return -1;
    const model_layout *l = &c->m.layout;
    float **w = calloc((size_t)l->n_blocks, sizeof(float *));
    for (int b = 0; b < l->n_blocks; b++) w[b] = calloc(l->block_numel[b] + 1, sizeof(float));
    tf_init_weights(l, w, 1);
    zo_status st = offload_set_weights(c->rt, (const float *const *)w);
    for (int b = 0; b < l->n_blocks; b++) free(w[b]);
    free(w);
    for (int i = 0; i < B * T; i++) {
        c->in[i] = (i * 7) % VOCAB;
        c->tg[i] = (i * 7 + 1) % VOCAB;
    }
    return st == ZO_OK ? 0 : -1;
}

static void case_free(bench_case *c)
{
    offload_free(c->rt);
    tf_offload_model_free(&c->tm);
    tf_free(&c->m);
    if (c->s) gpu_stream_destroy(c->s);
    gpu_device_free(c->dev);
}

static void one_step(void *arg)
{
    bench_case *c = arg;
    offload_step_info info;
    float loss;
    if (tf_set_batch(&c->m, c->s, c->in, c->tg, B, T) != ZO_OK || offload_micro_batch(c->rt, c->s) != ZO_OK ||
        tf_loss(&c->m, c->s, &loss) != ZO_OK || offload_step(c->rt, &info) != ZO_OK)
        c->failed = 1;
    bench_sink(&loss);
}

int main(void)
{
    bench_header("bench_offload", "cpu backend, all threads per op; gpt2-shaped %d layers x %d, vocab %d, "
                 "bf16, batch %d x %d; weights resident vs streamed from pinned host", LAYERS, HIDDEN, VOCAB, B, T);
    bench_row("%-22s %10s %10s %10s %10s %10s", "case", "step s", "tok/s", "wait s", "dev peak", "vs resident");
    double resident = 0, streamed2 = 0;
    struct { const char *name; offload_tier p; int depth; } cases[] = {
        {"resident", OFFLOAD_DEVICE, 0},
        {"streamed, prefetch 0", OFFLOAD_CPU, 0},
        {"streamed, prefetch 1", OFFLOAD_CPU, 1},
        {"streamed, prefetch 2", OFFLOAD_CPU, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bench_case c;
        if (case_init(&c, cases[i].p, cases[i].depth)) {
            fprintf(stderr, "bench_offload: %s: %s\n", cases[i].name, zo_last_error());
            return 1;
        }
        one_step(&c); /* warm-up outside the timed part: first-touch of every buffer */
        offload_reset_times(c.rt);
        double t = bench_time_best(one_step, &c, 1, 5, 3.0);
        offload_stats st;
        offload_get_stats(c.rt, &st);
        if (c.failed) {
            fprintf(stderr, "bench_offload: %s failed: %s\n", cases[i].name, zo_last_error());
            return 1;
        }
        if (i == 0) resident = t;
        if (i == 3) streamed2 = t;
        char peak[32];
        double per = st.micro_batches ? st.time[OFFLOAD_TIME_WEIGHTS] / (double)st.micro_batches : 0;
        bench_row("%-22s %10.4f %10.0f %10.4f %10s %10.3f", cases[i].name, t, B * T / t, per,
                  zo_format_bytes(st.peak[OFFLOAD_DEVICE], peak, sizeof peak), t / resident);
        case_free(&c);
    }
    bench_result("streamed (prefetch 2) step time / resident", streamed2 / resident);
    return 0;
}
