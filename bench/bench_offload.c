/* bench_offload: one training step (forward, backward, gradients to the
 * host, CPU AdamW) of a GPT-2-shaped model on the offload runtime, with the
 * weights all resident against streamed from pinned host memory at prefetch
 * depths 0, 1 and 2, on the device --device names (cpu, cuda, cuda:N).
 *
 * On the CPU backend the copies run on their own stream threads, so a deeper
 * prefetch hides them behind compute as on a GPU. On CUDA the weights cross
 * PCIe on the runtime's h2d stream while the compute stream runs the previous
 * block. Besides the whole step (which includes the CPU Adam update, the same
 * in every case), `fb s` is the forward + backward alone (offload_micro_batch
 * until the loss is on the host), where streaming costs what it costs.
 * The last line: streamed (prefetch 2) step time over resident.
 *
 * Exits 77 when --device names CUDA and this build or machine has none. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"          /* defines: bench_header, bench_time_best, bench_row */
#include "common/units.h"         /* defines: zo_format_bytes, zo_parse_int, zo_parse_size */
#include "gpu/device.h"           /* defines: gpu_device_open, gpu_cuda_device_count */
#include "offload/offload.h"      /* defines: offload_init, offload_micro_batch, offload_step */
#include "transformer/offload_model.h" /* defines: tf_offload_model */

/* The model and batch of a run; defaults depend on the device. */
typedef struct bench_shape {
    long layers, hidden, vocab, batch, seq;
} bench_shape;

typedef struct bench_case {
    gpu_device_t dev;
    gpu_stream_t s;
    tf_model m;
    tf_offload_model tm;
    offload_t *rt;
    int32_t *in, *tg;     /* [batch * seq] */
    bench_shape sh;
    double best_fb;       /* fewest seconds of one forward + backward */
    int failed;
} bench_case;

static int case_init(bench_case *c, const char *device, size_t capacity, const bench_shape *sh,
                     offload_tier params, int depth)
{
    memset(c, 0, sizeof *c);
    c->sh = *sh;
    c->best_fb = 1e30;
    zo_model_config cfg;
    if (zo_model_preset_find("gpt2", &cfg) != ZO_OK) return -1;
    cfg.n_layers = (int)sh->layers;
    cfg.hidden = (int)sh->hidden;
    cfg.n_heads = (int)(sh->hidden / 64 > 0 ? sh->hidden / 64 : 1);
    cfg.head_dim = 0;
    cfg.n_kv_heads = 0;
    cfg.ffn = 4 * (int)sh->hidden;
    cfg.vocab = (int)sh->vocab;
    cfg.max_seq = (int)sh->seq;
    if (zo_model_config_validate(&cfg) != ZO_OK) return -1;
    offload_config oc;
    offload_config_defaults(&oc);
    oc.params_on = params;
    oc.prefetch_depth = depth;
    tf_options to = {.external_res = 1};
    int n = (int)(sh->batch * sh->seq);
    if (gpu_device_open(device, capacity, &c->dev) != ZO_OK || gpu_stream_create(c->dev, &c->s) != ZO_OK ||
        tf_init_opts(&c->m, &cfg, c->dev, ZO_DTYPE_BF16, (int)sh->batch, (int)sh->seq, &to) != ZO_OK ||
        tf_offload_model_init(&c->tm, &c->m) != ZO_OK || offload_init(&c->rt, c->dev, &c->tm.om, &oc) != ZO_OK)
        return -1;
    const model_layout *l = &c->m.layout;
    float **w = calloc((size_t)l->n_blocks, sizeof(float *));
    c->in = malloc((size_t)n * sizeof(int32_t));
    c->tg = malloc((size_t)n * sizeof(int32_t));
    if (!w || !c->in || !c->tg) {
        free(w);
        zo_error(ZO_ERR_NOMEM, "bench_offload: out of host memory");
        return -1;
    }
    int ok = 1;
    for (int b = 0; b < l->n_blocks; b++) ok &= (w[b] = calloc(l->block_numel[b] + 1, sizeof(float))) != NULL;
    zo_status st = ZO_ERR_NOMEM;
    if (ok) {
        tf_init_weights(l, w, 1);
        st = offload_set_weights(c->rt, (const float *const *)w);
    }
    for (int b = 0; b < l->n_blocks; b++) free(w[b]);
    free(w);
    for (int i = 0; i < n; i++) {
        c->in[i] = (int32_t)((i * 7) % sh->vocab);
        c->tg[i] = (int32_t)((i * 7 + 1) % sh->vocab);
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
    free(c->in);
    free(c->tg);
}

static void one_step(void *arg)
{
    bench_case *c = arg;
    offload_step_info info;
    float loss = 0;
    int B = (int)c->sh.batch, T = (int)c->sh.seq;
    double t0 = zo_now();
    if (tf_set_batch(&c->m, c->s, c->in, c->tg, B, T) != ZO_OK || offload_micro_batch(c->rt, c->s) != ZO_OK ||
        tf_loss(&c->m, c->s, &loss) != ZO_OK) {
        c->failed = 1;
        return;
    }
    double fb = zo_now() - t0;
    if (fb < c->best_fb) c->best_fb = fb;
    if (offload_step(c->rt, &info) != ZO_OK) c->failed = 1;
    bench_sink(&loss);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_offload [--device cpu|cuda|cuda:N] [--device-mem SIZE] [--layers N]\n"
            "                     [--hidden N] [--vocab N] [--batch N] [--seq N]\n"
            "defaults: cpu: 8 layers x 256, vocab 4096, batch 4 x 64;\n"
            "          cuda: 16 layers x 1024, vocab 32000, batch 8 x 256\n");
}

int main(int argc, char **argv)
{
    const char *device = "cpu";
    uint64_t capacity = 0;
    long set[5] = {0, 0, 0, 0, 0}; /* layers, hidden, vocab, batch, seq given as flags */
    static const struct option opts[] = {
        {"device", required_argument, 0, 'd'}, {"device-mem", required_argument, 0, 'm'},
        {"layers", required_argument, 0, 'L'}, {"hidden", required_argument, 0, 'H'},
        {"vocab", required_argument, 0, 'V'},  {"batch", required_argument, 0, 'B'},
        {"seq", required_argument, 0, 'T'},    {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int o;
    zo_status st = ZO_OK;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'd': device = optarg; break;
        case 'm': st = zo_parse_size(optarg, "--device-mem", 0, &capacity); break;
        case 'L': st = zo_parse_int(optarg, "--layers", 1, 1024, &set[0]); break;
        case 'H': st = zo_parse_int(optarg, "--hidden", 64, 65536, &set[1]); break;
        case 'V': st = zo_parse_int(optarg, "--vocab", 2, 1 << 20, &set[2]); break;
        case 'B': st = zo_parse_int(optarg, "--batch", 1, 1 << 16, &set[3]); break;
        case 'T': st = zo_parse_int(optarg, "--seq", 1, 1 << 20, &set[4]); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (st != ZO_OK) {
            fprintf(stderr, "bench_offload: %s\n", zo_last_error());
            return 2;
        }
    }
    int cuda = strcmp(device, "cpu") != 0;
    if (cuda && strcmp(device, "cuda") && strncmp(device, "cuda:", 5)) {
        fprintf(stderr, "bench_offload: --device %s: expected cpu, cuda or cuda:N\n", device);
        return 2;
    }
    if (cuda && gpu_cuda_device_count() == 0) {
        printf("bench_offload: --device %s: no CUDA device here (or a build without CUDA): skipped\n",
               device);
        return 77;
    }
    bench_shape sh = cuda ? (bench_shape){16, 1024, 32000, 8, 256} : (bench_shape){8, 256, 4096, 4, 64};
    long *field[5] = {&sh.layers, &sh.hidden, &sh.vocab, &sh.batch, &sh.seq};
    for (int i = 0; i < 5; i++)
        if (set[i]) *field[i] = set[i];
    char capb[32];
    bench_header("bench_offload", "%s backend%s, device memory %s; gpt2-shaped %ld layers x %ld, vocab %ld, "
                 "bf16, batch %ld x %ld; weights resident vs streamed from pinned host", device,
                 cuda ? "" : ", all threads per op",
                 capacity ? zo_format_bytes(capacity, capb, sizeof capb) : "default", sh.layers, sh.hidden,
                 sh.vocab, sh.batch, sh.seq);
    bench_row("%-22s %10s %10s %10s %10s %10s %11s %11s", "case", "step s", "tok/s", "fb s", "wait s",
              "dev peak", "step/resid", "fb/resid");
    double resident = 0, resident_fb = 0, streamed2 = 0;
    struct { const char *name; offload_tier p; int depth; } cases[] = {
        {"resident", OFFLOAD_DEVICE, 0},
        {"streamed, prefetch 0", OFFLOAD_CPU, 0},
        {"streamed, prefetch 1", OFFLOAD_CPU, 1},
        {"streamed, prefetch 2", OFFLOAD_CPU, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bench_case c;
        if (case_init(&c, device, (size_t)capacity, &sh, cases[i].p, cases[i].depth)) {
            fprintf(stderr, "bench_offload: %s: %s\n", cases[i].name, zo_last_error());
            case_free(&c);
            return 1;
        }
        one_step(&c); /* warm-up outside the timed part: first-touch of every buffer */
        offload_reset_times(c.rt);
        c.best_fb = 1e30;
        double t = bench_time_best(one_step, &c, 1, 5, 3.0);
        offload_stats ost;
        offload_get_stats(c.rt, &ost);
        if (c.failed) {
            fprintf(stderr, "bench_offload: %s failed: %s\n", cases[i].name, zo_last_error());
            case_free(&c);
            return 1;
        }
        if (i == 0) {
            resident = t;
            resident_fb = c.best_fb;
        }
        if (i == 3) streamed2 = t;
        char peak[32];
        double per = ost.micro_batches ? ost.time[OFFLOAD_TIME_WEIGHTS] / (double)ost.micro_batches : 0;
        bench_row("%-22s %10.4f %10.0f %10.4f %10.4f %10s %11.3f %11.3f", cases[i].name, t,
                  (double)(sh.batch * sh.seq) / t, c.best_fb, per,
                  zo_format_bytes(ost.peak[OFFLOAD_DEVICE], peak, sizeof peak), t / resident,
                  c.best_fb / resident_fb);
        case_free(&c);
    }
    bench_result("streamed (prefetch 2) step time / resident", streamed2 / resident);
    return 0;
}
