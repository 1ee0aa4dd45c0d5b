/* bench_lora: one training step of a LLaMA-shaped model on the offload
 * runtime, full fine-tuning against LoRA (rank --rank on every linear
 * layer) and QLoRA (the same adapters over an NF4 base), same model, batch
 * and device, the cases alternating round by round.
 *
 * Full fine-tuning moves every weight's gradient to the host and updates
 * all of them on the CPU; LoRA computes the base's input gradients only
 * (no weight-gradient GEMMs of the base), and its adapters' gradients and
 * AdamW state are a few MB; QLoRA dequantizes each frozen linear weight
 * before its GEMM, forward and backward. The last lines: LoRA's and
 * QLoRA's step time over full fine-tuning's (below 1: faster).
 *
 * Exits 77 when --device names CUDA and this build or machine has none. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"          /* defines: bench_header, bench_time_best, bench_row */
#include "common/units.h"         /* defines: zo_parse_int */
#include "gpu/device.h"           /* defines: gpu_device_open, gpu_cuda_device_count */
#include "offload/offload.h"      /* defines: offload_init, offload_micro_batch, offload_step */
#include "transformer/offload_model.h" /* defines: tf_offload_model */

typedef struct shape {
    long layers, hidden, vocab, batch, seq, rank;
} shape;

typedef struct lcase {
    const char *name;
    int lora, nf4;
    gpu_device_t dev;
    gpu_stream_t s;
    tf_model m;
    tf_offload_model tm;
    offload_t *rt;
    int32_t *in, *tg;
    shape sh;
    double best;
    int failed;
} lcase;

/* The weights: random base (packed for LoRA), PEFT's adapters. */
static zo_status set_weights(lcase *c)
{
    const model_layout *l = &c->m.layout, *ad = &c->m.adapters;
    size_t big = 1, fbig = 1;
    for (int b = 0; b < l->n_blocks; b++) {
        if (l->block_numel[b] > big) big = l->block_numel[b];
        if (c->lora && ad->block_numel[b] > big) big = ad->block_numel[b];
        if (tf_frozen_bytes(&c->m, b) > fbig) fbig = tf_frozen_bytes(&c->m, b);
    }
    float *w = malloc(big * sizeof(float));
    void *packed = malloc(fbig);
    zo_status st = w && packed ? ZO_OK : zo_error(ZO_ERR_NOMEM, "bench_lora: out of host memory");
    uint64_t rng = tf_init_rng(1), arng = tf_init_rng(2);
    for (int b = 0; b < l->n_blocks && st == ZO_OK; b++) {
        tf_init_block_weights(l, b, w, &rng);
        if (!c->lora) {
            st = offload_set_block(c->rt, b, w);
            continue;
        }
        if ((st = tf_frozen_pack(&c->m, b, w, packed)) != ZO_OK ||
            (st = offload_set_frozen_block(c->rt, b, packed)) != ZO_OK)
            break;
        tf_init_lora_block(ad, b, w, &arng);
        st = offload_set_block(c->rt, b, w);
    }
    free(w);
    free(packed);
    return st;
}

static int case_init(lcase *c, const char *device, const shape *sh)
{
    c->sh = *sh;
    c->best = 1e30;
    zo_model_config cfg;
    if (zo_model_preset_find("llama-2-7b", &cfg) != ZO_OK) return -1;
    cfg.n_layers = (int)sh->layers;
    cfg.hidden = (int)sh->hidden;
    cfg.n_heads = cfg.n_kv_heads = (int)(sh->hidden / 64 > 0 ? sh->hidden / 64 : 1);
    cfg.head_dim = 0;
    cfg.ffn = (int)(sh->hidden * 8 / 3 / 64 * 64);
    cfg.vocab = (int)sh->vocab;
    cfg.max_seq = (int)sh->seq;
    if (zo_model_config_validate(&cfg) != ZO_OK) return -1;
    offload_config oc;
    offload_config_defaults(&oc);
    tf_options to = {.external_res = 1};
    if (c->lora) to.lora = (tf_lora_options){.r = (int)sh->rank, .alpha = 2.0f * (float)sh->rank,
                                             .targets = ZO_LORA_ALL_LINEAR, .nf4 = c->nf4};
    int n = (int)(sh->batch * sh->seq);
    if (gpu_device_open(device, 0, &c->dev) != ZO_OK || gpu_stream_create(c->dev, &c->s) != ZO_OK ||
        tf_init_opts(&c->m, &cfg, c->dev, ZO_DTYPE_BF16, (int)sh->batch, (int)sh->seq, &to) != ZO_OK ||
        tf_offload_model_init(&c->tm, &c->m) != ZO_OK || offload_init(&c->rt, c->dev, &c->tm.om, &oc) != ZO_OK ||
        set_weights(c) != ZO_OK)
        return -1;
    c->in = malloc((size_t)n * sizeof(int32_t));
    c->tg = malloc((size_t)n * sizeof(int32_t));
    if (!c->in || !c->tg) return -1;
    for (int i = 0; i < n; i++) {
        c->in[i] = (int32_t)((i * 7) % sh->vocab);
        c->tg[i] = (int32_t)((i * 7 + 1) % sh->vocab);
    }
    return 0;
}

static void case_free(lcase *c)
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
    lcase *c = arg;
    offload_step_info info;
    float loss = 0;
    if (tf_set_batch(&c->m, c->s, c->in, c->tg, (int)c->sh.batch, (int)c->sh.seq) != ZO_OK ||
        offload_micro_batch(c->rt, c->s) != ZO_OK || tf_loss(&c->m, c->s, &loss) != ZO_OK ||
        offload_step(c->rt, &info) != ZO_OK)
        c->failed = 1;
    bench_sink(&loss);
}

int main(int argc, char **argv)
{
    const char *device = "cpu";
    shape sh = {.layers = 4, .hidden = 512, .vocab = 4096, .batch = 4, .seq = 64, .rank = 16};
    int rounds = 3;
    static const struct option opts[] = {
        {"device", required_argument, 0, 'd'}, {"layers", required_argument, 0, 'L'},
        {"hidden", required_argument, 0, 'H'}, {"seq", required_argument, 0, 'S'},
        {"batch", required_argument, 0, 'B'}, {"rank", required_argument, 0, 'r'},
        {"rounds", required_argument, 0, 'n'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    int o;
    long v;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        zo_status st = ZO_OK;
        switch (o) {
        case 'd': device = optarg; break;
        case 'L': st = zo_parse_int(optarg, "--layers", 1, 1024, &sh.layers); break;
        case 'H': st = zo_parse_int(optarg, "--hidden", 64, 65536, &sh.hidden); break;
        case 'S': st = zo_parse_int(optarg, "--seq", 1, 1 << 20, &sh.seq); break;
        case 'B': st = zo_parse_int(optarg, "--batch", 1, 1 << 16, &sh.batch); break;
        case 'r': st = zo_parse_int(optarg, "--rank", 1, 4096, &sh.rank); break;
        case 'n': st = zo_parse_int(optarg, "--rounds", 1, 100, &v), rounds = (int)v; break;
        case 'h':
            printf("usage: bench_lora [--device cpu|cuda|cuda:N] [--layers N] [--hidden N] [--seq N]\n"
                   "                  [--batch N] [--rank R] [--rounds N]\n"
                   "defaults: 4 layers x 512, vocab 4096, batch 4 x 64, rank 16, 3 rounds\n");
            return 0;
        default: return 2;
        }
        if (st != ZO_OK) {
            fprintf(stderr, "bench_lora: %s\n", zo_last_error());
            return 2;
        }
    }
    if (strncmp(device, "cuda", 4) == 0 && gpu_cuda_device_count() <= 0) {
        fprintf(stderr, "bench_lora: no CUDA device here\n");
        return 77;
    }
    bench_header("bench_lora", "device %s, LLaMA %ld layers x %ld, vocab %ld, batch %ld x %ld, bf16, "
                 "LoRA rank %ld on every linear layer", device, sh.layers, sh.hidden, sh.vocab, sh.batch,
                 sh.seq, sh.rank);
    lcase c[3] = {{.name = "full fine-tuning"}, {.name = "lora", .lora = 1}, {.name = "qlora", .lora = 1, .nf4 = 1}};
    for (int i = 0; i < 3; i++)
        if (case_init(&c[i], device, &sh)) {
            fprintf(stderr, "bench_lora: %s: %s\n", c[i].name, zo_last_error());
            return 1;
        }
    /* the cases alternate: each round times every case */
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < 3; i++) {
            double t = bench_time_best(one_step, &c[i], 1, 3, 0.5);
            if (c[i].failed) {
                fprintf(stderr, "bench_lora: %s: %s\n", c[i].name, zo_last_error());
                return 1;
            }
            if (t < c[i].best) c[i].best = t;
        }
    double tokens = (double)sh.batch * (double)sh.seq;
    for (int i = 0; i < 3; i++) {
        offload_stats st;
        offload_get_stats(c[i].rt, &st);
        bench_row("%-18s step %8.4f s  %9.0f tok/s  host optimizer %.3f s", c[i].name, c[i].best,
                  tokens / c[i].best, st.time[OFFLOAD_TIME_OPTIMIZER] / (st.steps ? (double)st.steps : 1.0));
    }
    bench_result("qlora step / full fine-tuning step", c[2].best / c[0].best);
    bench_result("lora step / full fine-tuning step", c[1].best / c[0].best);
    for (int i = 0; i < 3; i++) case_free(&c[i]);
    return 0;
}
