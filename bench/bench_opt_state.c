/* bench_opt_state: the runtime's host update of AdamW's m and v kept in 8
 * bits (or bf16), a whole chunk in place (cpu_adam's fused step:
 * oshard_update.host_state), against the same state decoded, updated in
 * fp32 and coded again a chunk at a time (offload_config.state_unfused, the
 * path before), and against fp32 m and v: one training step of a LLaMA on
 * the CPU backend per contender and round, the contenders alternating, the
 * optimizer's seconds of each step (offload_stats.time[OFFLOAD_TIME_OPTIMIZER],
 * train's "optimizer" figure) compared by their median.
 *
 * Beside them, in the same rounds, cpu_adam's kernels alone over as many
 * parameters (adam_update on fp32 m and v, adam_state_update on the
 * encoded state: one call each, fp32 gradient, bf16 copy), so that the
 * runtime's ratio can be read against the kernels' at the same load.
 *
 * The last lines: the fused update's rate as a fraction of fp32 state's in
 * the runtime, the kernels' (what memplan's planner/cost.c
 * PLAN_ADAM_8BIT_COMPUTE assumes for 8 bits), and the decoded update's time
 * over the fused one's (the speed-up). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"               /* defines: bench_header, bench_row, bench_result */
#include "cpu_adam/cpu_adam.h"         /* defines: adam_update, adam_state_update */
#include "common/units.h"              /* defines: zo_parse_int */
#include "offload/offload.h"           /* defines: offload_init, offload_step, offload_get_stats */
#include "transformer/offload_model.h" /* defines: tf_offload_model */

#define MAX_ROUNDS 64

typedef struct contender {
    const char *name;
    zo_plan_opt_state state;
    int unfused;
    /* the run */
    gpu_device_t dev;
    gpu_stream_t s;
    tf_model m;
    tf_offload_model tm;
    offload_t *rt;
    double opt_s[MAX_ROUNDS]; /* the optimizer's seconds of each timed step */
} contender;

typedef struct shape {
    long layers, hidden, ffn, vocab, batch, seq, threads, rounds;
} shape;

static zo_status contender_init(contender *c, const shape *sh, const int32_t *in, const int32_t *tg)
{
    zo_model_config cfg = {.arch = ZO_ARCH_LLAMA, .n_layers = (int)sh->layers, .hidden = (int)sh->hidden,
                           .n_heads = (int)(sh->hidden / 64), .n_kv_heads = (int)(sh->hidden / 64),
                           .ffn = (int)sh->ffn, .vocab = (int)sh->vocab, .max_seq = (int)sh->seq,
                           .norm_eps = 1e-5f, .rope_theta = 10000.0f};
    snprintf(cfg.name, sizeof cfg.name, "bench-llama");
    snprintf(cfg.family, sizeof cfg.family, "llama2");
    offload_config oc;
    offload_config_defaults(&oc);
    oc.params_on = OFFLOAD_DEVICE;
    oc.opt_state = c->state;
    oc.state_unfused = c->unfused;
    oc.n_threads = (int)sh->threads;
    gpu_cpu_options dopt = {.n_threads = (int)sh->threads};
    tf_options to = {.external_res = 1};
    zo_status st;
    if ((st = zo_model_config_validate(&cfg)) != ZO_OK || (st = gpu_device_init_cpu(&dopt, &c->dev)) != ZO_OK ||
        (st = gpu_stream_create(c->dev, &c->s)) != ZO_OK ||
        (st = tf_init_opts(&c->m, &cfg, c->dev, ZO_DTYPE_BF16, (int)sh->batch, (int)sh->seq, &to)) != ZO_OK ||
        (st = tf_offload_model_init(&c->tm, &c->m)) != ZO_OK ||
        (st = offload_init(&c->rt, c->dev, &c->tm.om, &oc)) != ZO_OK)
        return st;
    const model_layout *l = &c->m.layout;
    float **w = calloc((size_t)l->n_blocks, sizeof *w);
    int ok = w != NULL;
    for (int b = 0; ok && b < l->n_blocks; b++) ok = (w[b] = calloc(l->block_numel[b] + 1, sizeof(float))) != NULL;
    st = ok ? ZO_OK : zo_error(ZO_ERR_NOMEM, "bench_opt_state: out of host memory");
    if (ok) {
        tf_init_weights(l, w, 1); /* (the same in every contender) */
        st = offload_set_weights(c->rt, (const float *const *)w);
    }
    for (int b = 0; w && b < l->n_blocks; b++) free(w[b]);
    free(w);
    if (st != ZO_OK) return st;
    return tf_set_batch(&c->m, c->s, in, tg, (int)sh->batch, (int)sh->seq);
}

static void contender_free(contender *c)
{
    if (c->rt) offload_free(c->rt);
    tf_offload_model_free(&c->tm);
    tf_free(&c->m);
    if (c->s) gpu_stream_destroy(c->s);
    if (c->dev) gpu_device_free(c->dev);
}

/* One step; the optimizer's seconds of it. */
static zo_status contender_step(contender *c, double *opt_s)
{
    offload_stats a, b;
    offload_step_info info;
    zo_status st;
    offload_get_stats(c->rt, &a);
    if ((st = offload_micro_batch(c->rt, c->s)) != ZO_OK || (st = offload_step(c->rt, &info)) != ZO_OK) return st;
    offload_get_stats(c->rt, &b);
    *opt_s = b.time[OFFLOAD_TIME_OPTIMIZER] - a.time[OFFLOAD_TIME_OPTIMIZER];
    return ZO_OK;
}

/* cpu_adam's kernels alone over n parameters: fp32 m and v, or the state. */
typedef struct kernel_run {
    size_t n;
    float *p, *g, *m, *v;
    uint16_t *out;
    void *state;
    adam_state_kind kind;
    int threads;
    long step;
    double secs[MAX_ROUNDS][2];
} kernel_run;

static zo_status kernel_time(kernel_run *k, int encoded, double *secs)
{
    adam_hparams hp = adam_hparams_default();
    hp.step = ++k->step;
    double t0 = zo_now();
    zo_status st = encoded ? adam_state_update(&hp, k->kind, k->n, k->p, k->g, ZO_DTYPE_F32, k->state, k->out,
                                               ZO_DTYPE_BF16, k->threads)
                           : adam_update(&hp, k->n, k->p, k->g, ZO_DTYPE_F32, k->m, k->v, k->out, ZO_DTYPE_BF16,
                                         k->threads);
    *secs = zo_now() - t0;
    return st;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(const double *v, int n)
{
    double s[MAX_ROUNDS];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

int main(int argc, char **argv)
{
    shape sh = {4, 512, 1376, 256, 2, 64, 2, 8};
    const char *state = "8bit";
    static const struct option opts[] = {
        {"layers", required_argument, 0, 'L'}, {"hidden", required_argument, 0, 'H'},
        {"ffn", required_argument, 0, 'F'},    {"vocab", required_argument, 0, 'V'},
        {"batch", required_argument, 0, 'B'},  {"seq", required_argument, 0, 'T'},
        {"threads", required_argument, 0, 't'}, {"rounds", required_argument, 0, 'r'},
        {"state", required_argument, 0, 's'},  {0, 0, 0, 0},
    };
    long *field[] = {['L'] = &sh.layers, ['H'] = &sh.hidden, ['F'] = &sh.ffn, ['V'] = &sh.vocab,
                     ['B'] = &sh.batch,  ['T'] = &sh.seq,    ['t'] = &sh.threads, ['r'] = &sh.rounds};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        zo_status st = zo_error(ZO_ERR_INVALID, "usage: bench_opt_state [--layers N] [--hidden N] [--ffn N] "
                                "[--vocab N] [--batch N] [--seq N] [--threads N] [--rounds N] [--state 8bit|bf16]");
        if (o == 's') {
            state = optarg;
            st = ZO_OK;
        }
        for (int i = 0; opts[i].name && o != 's'; i++) /* (the flag's name in the message) */
            if (opts[i].val == o)
                st = zo_parse_int(optarg, opts[i].name, o == 't' ? 1 : 2, o == 'r' ? MAX_ROUNDS : 1 << 20, field[o]);
        if (st != ZO_OK) {
            fprintf(stderr, "bench_opt_state: %s\n", zo_last_error());
            return 2;
        }
    }
    zo_plan_opt_state enc;
    if (zo_plan_opt_state_parse(state, "--state", &enc) != ZO_OK || enc == ZO_PLAN_STATE_FP32) {
        fprintf(stderr, "bench_opt_state: --state %s: expected 8bit or bf16\n", state);
        return 2;
    }
    contender cs[3] = {
        {.name = "fp32 m, v", .state = ZO_PLAN_STATE_FP32},
        {.name = "decoded, coded a chunk", .state = enc, .unfused = 1},
        {.name = "fused, whole chunks", .state = enc},
    };
    size_t n = (size_t)(sh.batch * sh.seq);
    int32_t *in = malloc(n * 4), *tg = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        in[i] = (int32_t)((i * 7) % (size_t)sh.vocab);
        tg[i] = (int32_t)((i * 7 + 1) % (size_t)sh.vocab);
    }
    int rc = 0;
    for (int c = 0; c < 3 && !rc; c++) {
        double warm;
        if (contender_init(&cs[c], &sh, in, tg) != ZO_OK || contender_step(&cs[c], &warm) != ZO_OK) {
            fprintf(stderr, "bench_opt_state: %s: %s\n", cs[c].name, zo_last_error());
            rc = 1;
        }
    }
    size_t params = 0;
    for (int b = 0; !rc && b < cs[0].tm.om.n_blocks; b++) params += cs[0].tm.om.block_numel[b];
    kernel_run k = {.n = params, .kind = enc == ZO_PLAN_STATE_BF16 ? adam_state_bf16() : adam_state_q8(ADAM_Q8_BLOCK),
                    .threads = (int)sh.threads};
    size_t sb = (size_t)adam_state_bytes(k.kind, params);
    float **arr[4] = {&k.p, &k.g, &k.m, &k.v};
    for (int i = 0; !rc && i < 4; i++) rc = !(*arr[i] = calloc(params, 4));
    if (!rc) rc = !(k.out = calloc(params, 2)) || !(k.state = aligned_alloc(64, (sb + 63) / 64 * 64));
    if (!rc) {
        for (size_t i = 0; i < params; i++) k.p[i] = 0.01f * (float)(i % 97), k.g[i] = 1e-3f * (float)(i % 89) - 0.04f;
        double warm;
        rc = adam_state_init(k.kind, k.state, params, k.threads) != ZO_OK || kernel_time(&k, 0, &warm) != ZO_OK ||
             kernel_time(&k, 1, &warm) != ZO_OK;
    }
    bench_header("bench_opt_state", "cpu backend, %ld threads; llama %ld layers x %ld, ffn %ld, vocab %ld, bf16 "
                 "weights, batch %ld x %ld; %s m, v in host memory; %ld rounds, contenders alternating",
                 sh.threads, sh.layers, sh.hidden, sh.ffn, sh.vocab, sh.batch, sh.seq, state, sh.rounds);
    for (int r = 0; r < sh.rounds && !rc; r++) {
        for (int c = 0; c < 3 && !rc; c++) /* (alternating: each round every contender, in turn) */
            if (contender_step(&cs[(c + r) % 3], &cs[(c + r) % 3].opt_s[r]) != ZO_OK) {
                fprintf(stderr, "bench_opt_state: %s: %s\n", cs[(c + r) % 3].name, zo_last_error());
                rc = 1;
            }
        for (int e = 0; e < 2 && !rc; e++) rc = kernel_time(&k, (e + r) % 2, &k.secs[r][(e + r) % 2]) != ZO_OK;
    }
    if (!rc) {
        offload_stats s;
        offload_get_stats(cs[2].rt, &s);
        bench_row("%-32s %12s %12s %12s", "contender", "median s", "best s", "Gparam/s");
        double med[5], col[MAX_ROUNDS];
        static const char *kname[2] = {"kernel alone, fp32 m, v", "kernel alone, encoded m, v"};
        for (int c = 0; c < 5; c++) {
            for (int r = 0; r < sh.rounds; r++) col[r] = c < 3 ? cs[c].opt_s[r] : k.secs[r][c - 3];
            med[c] = median(col, (int)sh.rounds);
            double best = col[0];
            for (int r = 1; r < sh.rounds; r++) best = col[r] < best ? col[r] : best;
            bench_row("%-32s %12.4f %12.4f %12.3f", c < 3 ? cs[c].name : kname[c - 3], med[c], best,
                      (double)params * 1e-9 / med[c]);
        }
        bench_row("fused elements %llu, decoded %llu (the fused contender's steps)",
                  (unsigned long long)s.state_fused, (unsigned long long)s.state_decoded);
        bench_result("kernels: encoded rate / fp32 rate", med[3] / med[4]);
        bench_result("runtime, fused: encoded rate / fp32 rate", med[0] / med[2]);
        bench_result("runtime, decoded: encoded rate / fp32 rate", med[0] / med[1]);
        bench_result("decoded time / fused time", med[1] / med[2]);
    } else {
        fprintf(stderr, "bench_opt_state: %s\n", zo_last_error());
    }
    free(k.p), free(k.g), free(k.m), free(k.v), free(k.out), free(k.state);
    for (int c = 0; c < 3; c++) contender_free(&cs[c]);
    free(in);
    free(tg);
    return rc;
}
