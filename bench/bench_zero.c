/* bench_zero: one optimizer step of a LLaMA-shaped model on N ranks with
 * ZeRO stages 0-3 (mpirun -np N bench_zero), against one rank training the
 * same global batch with grad-accum N in the same run (on rank 0 while the
 * others wait), and against the communicator's own all-reduce of the model
 * in fp32 (what ZeRO-0 moves per step, in one call).
 *
 * Each case runs the same number of steps on every rank (collectives: no
 * adaptive repeat count); a step's time is rank 0's, the best of --reps.
 * Rows: step seconds, global tokens/s, the collectives' elements per step
 * in units of the model (the ZeRO paper's Psi), the seconds the host waited
 * for collectives, each rank's device and host peaks. The last line: the
 * 1-rank step over the ZeRO-2 step (the speed-up of the global batch). Run
 * plainly (no launcher) it measures one rank against itself. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"               /* defines: bench_header, bench_row, bench_result */
#include "common/units.h"              /* defines: zo_format_bytes, zo_parse_int */
#include "gpu/comm.h"                  /* defines: comm_init, comm_all_reduce, comm_barrier */
#include "offload/offload.h"           /* defines: offload_init, offload_micro_batch, offload_step */
#include "transformer/offload_model.h" /* defines: tf_offload_model */

typedef struct zcase {
    gpu_stream_t s;
    tf_model m;
    tf_offload_model tm;
    offload_t *rt;
    int32_t *in, *tg;
    int B, T, accum;
} zcase;

static int case_init(zcase *c, gpu_device_t dev, const zo_model_config *cfg, int B, int T,
                     const offload_config *oc)
{
    memset(c, 0, sizeof *c);
    c->B = B;
    c->T = T;
    c->accum = oc->grad_accum ? oc->grad_accum : 1;
    tf_options to = {.external_res = 1};
    if (gpu_stream_create(dev, &c->s) != ZO_OK ||
        tf_init_opts(&c->m, cfg, dev, ZO_DTYPE_BF16, B, T, &to) != ZO_OK ||
        tf_offload_model_init(&c->tm, &c->m) != ZO_OK || offload_init(&c->rt, dev, &c->tm.om, oc) != ZO_OK)
        return -1;
    const model_layout *l = &c->m.layout;
    size_t largest = 1;
    for (int b = 0; b < l->n_blocks; b++)
        if (l->block_numel[b] > largest) largest = l->block_numel[b];
    float *w = malloc(largest * sizeof(float));
    c->in = malloc((size_t)B * T * sizeof(int32_t));
    c->tg = malloc((size_t)B * T * sizeof(int32_t));
    if (!w || !c->in || !c->tg) {
        free(w);
        zo_error(ZO_ERR_NOMEM, "bench_zero: out of host memory");
        return -1;
    }
    uint64_t rng = tf_init_rng(1);
    zo_status st = ZO_OK;
    for (int b = 0; b < l->n_blocks && st == ZO_OK; b++) {
        tf_init_block_weights(l, b, w, &rng);
        st = offload_set_block(c->rt, b, w);
    }
    free(w);
    for (int i = 0; i < B * T; i++) {
        c->in[i] = (int32_t)((i * 7) % cfg->vocab);
        c->tg[i] = (int32_t)((i * 7 + 1) % cfg->vocab);
    }
    return st == ZO_OK ? 0 : -1;
}

static void case_free(zcase *c)
{
    offload_free(c->rt);
    tf_offload_model_free(&c->tm);
    tf_free(&c->m);
    if (c->s) gpu_stream_destroy(c->s);
    free(c->in);
    free(c->tg);
}

/* One step: grad-accum micro-batches and the update; seconds. */
static double one_step(zcase *c, int *failed)
{
    offload_step_info info;
    float loss = 0;
    double t0 = zo_now();
    for (int j = 0; j < c->accum; j++)
        if (tf_set_batch(&c->m, c->s, c->in, c->tg, c->B, c->T) != ZO_OK || offload_micro_batch(c->rt, c->s) != ZO_OK ||
            tf_loss(&c->m, c->s, &loss) != ZO_OK)
            *failed = 1;
    if (!*failed && offload_step(c->rt, &info) != ZO_OK) *failed = 1;
    bench_sink(&loss);
    return zo_now() - t0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: [mpirun -np N] bench_zero [--layers N] [--hidden N] [--vocab N] [--batch N] [--seq N]\n"
               "                  [--reps N] [--threads N]\n"
               "defaults: 4 layers x 256, vocab 4096, micro-batch 2 x 64 per rank, 5 timed steps,\n"
               "threads: the cores over the ranks\n");
}

typedef struct opts {
    long layers, hidden, vocab, batch, seq, reps, threads;
} opts;

/* The flags; -1 to go on, else main's exit status (0 after --help). */
static int parse_opts(int argc, char **argv, opts *o)
{
    *o = (opts){.layers = 4, .hidden = 256, .vocab = 4096, .batch = 2, .seq = 64, .reps = 5, .threads = 0};
    static const struct option long_opts[] = {
        {"layers", required_argument, 0, 'L'}, {"hidden", required_argument, 0, 'H'},
        {"vocab", required_argument, 0, 'V'},  {"batch", required_argument, 0, 'B'},
        {"seq", required_argument, 0, 'T'},    {"reps", required_argument, 0, 'R'},
        {"threads", required_argument, 0, 'j'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    zo_status st = ZO_OK;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        switch (c) {
        case 'L': st = zo_parse_int(optarg, "--layers", 1, 1024, &o->layers); break;
        case 'H': st = zo_parse_int(optarg, "--hidden", 64, 65536, &o->hidden); break;
        case 'V': st = zo_parse_int(optarg, "--vocab", 2, 1 << 20, &o->vocab); break;
        case 'B': st = zo_parse_int(optarg, "--batch", 1, 1 << 16, &o->batch); break;
        case 'T': st = zo_parse_int(optarg, "--seq", 1, 1 << 16, &o->seq); break;
        case 'R': st = zo_parse_int(optarg, "--reps", 1, 1000, &o->reps); break;
        case 'j': st = zo_parse_int(optarg, "--threads", 1, 1024, &o->threads); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (st != ZO_OK) {
            fprintf(stderr, "bench_zero: %s\n", zo_last_error());
            return 2;
        }
    }
    return -1;
}

/* The LLaMA-shaped model of the flags: heads of 64, ffn 8/3 of hidden. */
static zo_status llama_config(const opts *o, zo_model_config *cfg)
{
    *cfg = (zo_model_config){0};
    snprintf(cfg->name, sizeof cfg->name, "bench-llama");
    snprintf(cfg->family, sizeof cfg->family, "llama2");
    cfg->arch = ZO_ARCH_LLAMA;
    cfg->n_layers = (int)o->layers;
    cfg->hidden = (int)o->hidden;
    cfg->n_heads = (int)(o->hidden / 64 > 0 ? o->hidden / 64 : 1);
    cfg->n_kv_heads = cfg->n_heads;
    cfg->ffn = (int)(8 * o->hidden / 3);
    cfg->vocab = (int)o->vocab;
    cfg->max_seq = (int)o->seq;
    cfg->norm_eps = 1e-5f;
    cfg->rope_theta = 10000.0f;
    return zo_model_config_validate(cfg);
}

/* The communicator's own all-reduce of n fp32 elements: the best of reps
 * calls after an untimed one; -1 when a call fails. */
static double time_all_reduce(comm_t comm, size_t n, long reps)
{
    float *x = calloc(n, sizeof *x);
    double ar = 1e30;
    for (int r = 0; r < reps + 1 && x; r++) {
        double t0 = zo_now();
        if (comm_all_reduce(comm, x, x, n, ZO_DTYPE_F32, NULL, NULL) != ZO_OK) {
            free(x);
            return -1;
        }
        if (r && zo_now() - t0 < ar) ar = zo_now() - t0;
    }
    free(x);
    return ar;
}

/* Case c's settings and its row's name: c < 0 is one rank with grad-accum
 * `ranks`, else every rank at ZeRO stage c (3 with the weights on the CPU). */
static void case_config(int c, comm_t comm, int ranks, long threads, offload_config *oc, char *name,
                        size_t name_size)
{
    offload_config_defaults(oc);
    oc->n_threads = (int)threads;
    oc->params_on = c == 3 ? OFFLOAD_CPU : OFFLOAD_DEVICE;
    oc->comm = c >= 0 ? comm : NULL;
    oc->zero_stage = c >= 0 ? c : 0;
    oc->grad_accum = c >= 0 ? 1 : ranks;
    if (c < 0) snprintf(name, name_size, "1 rank, grad-accum %d", ranks);
    else snprintf(name, name_size, "%d ranks, ZeRO-%d%s", ranks, c, c == 3 ? ", weights cpu" : "");
}

/* The case on this rank: a warm-up step, then the best of reps steps, and
 * the runtime's counts (*ost); *failed set when a step failed. */
static double run_case(gpu_device_t dev, const zo_model_config *cfg, const opts *o, const offload_config *oc,
                       const char *name, comm_t comm, offload_stats *ost, int *failed)
{
    zcase z;
    double best = 1e30;
    if (case_init(&z, dev, cfg, (int)o->batch, (int)o->seq, oc)) {
        fprintf(stderr, "bench_zero: %s: %s\n", name, zo_last_error());
        comm_abort(comm, 1, "bench_zero: a case failed to start");
    }
    one_step(&z, failed); /* warm-up: first touch of every buffer */
    offload_reset_times(z.rt);
    for (int r = 0; r < o->reps; r++) {
        double t = one_step(&z, failed);
        if (t < best) best = t;
    }
    offload_get_stats(z.rt, ost);
    case_free(&z);
    return best;
}

static void case_row(const char *name, double best, double tokens, double psi, const offload_stats *ost)
{
    char dpk[32], hpk[32];
    bench_row("%-30s %9.4f %10.0f %9.3f %9.4f %10s %10s", name, best, tokens / best,
              ost->steps ? (double)(ost->comm_elems + ost->comm_reused_elems) / ost->steps / psi : 0.0,
              ost->steps ? ost->time[OFFLOAD_TIME_COMM] / ost->steps : 0.0,
              zo_format_bytes(ost->peak[OFFLOAD_DEVICE], dpk, sizeof dpk),
              zo_format_bytes(ost->peak[OFFLOAD_CPU], hpk, sizeof hpk));
}

int main(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc >= 0) return rc;
    comm_launch launch;
    if (comm_launch_detect(&launch) != ZO_OK) {
        fprintf(stderr, "bench_zero: %s\n", zo_last_error());
        return 2;
    }
    if (!o.threads) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        o.threads = cores / launch.size > 0 ? cores / launch.size : 1;
    }
    gpu_cpu_options dopt = {.n_threads = (int)o.threads};
    gpu_device_t dev;
    comm_t comm;
    if (gpu_device_init_cpu(&dopt, &dev) != ZO_OK) return 1;
    comm_options co = {.device = dev};
    if (comm_init(&co, &comm) != ZO_OK) {
        fprintf(stderr, "bench_zero: %s\n", zo_last_error());
        return 1;
    }
    int rank = comm_rank(comm), ranks = comm_size(comm);
    zo_model_config cfg;
    if (llama_config(&o, &cfg) != ZO_OK) {
        fprintf(stderr, "bench_zero: %s\n", zo_last_error());
        return 2;
    }
    double psi = (double)zo_model_params(&cfg);
    if (rank == 0) {
        bench_header("bench_zero", "%d ranks (%s), %ld threads each, cpu device; llama-shaped %ld layers x %ld, "
                     "vocab %ld (%.2fM parameters), bf16; micro-batch %ld x %ld per rank; optimizer on the "
                     "CPU; best of %ld steps", ranks, comm_backend_name(comm_get_backend(comm)), o.threads,
                     o.layers, o.hidden, o.vocab, psi / 1e6, o.batch, o.seq, o.reps);
        bench_row("%-30s %9s %10s %9s %9s %10s %10s", "case", "step s", "tok/s", "Psi/step", "comm s",
                  "dev peak", "host peak");
    }
    double ar = time_all_reduce(comm, (size_t)psi, o.reps);
    if (ar < 0) return 1;
    if (rank == 0)
        bench_row("%-30s %9.4f %10s %9.3f %9s %10s %10s", "comm all-reduce, fp32, Psi", ar, "-", 2.0, "-", "-", "-");
    double one = 0, zero2 = 0;
    for (int c = -1; c <= 3; c++) {
        offload_config oc;
        char name[64];
        case_config(c, comm, ranks, o.threads, &oc, name, sizeof name);
        /* the one-rank baseline runs on rank 0 alone */
        int failed = 0;
        double best = 1e30;
        offload_stats ost = {0};
        if (c >= 0 || rank == 0) best = run_case(dev, &cfg, &o, &oc, name, comm, &ost, &failed);
        if (failed) comm_abort(comm, 1, "bench_zero: a step failed");
        if (comm_barrier(comm, NULL, NULL) != ZO_OK) return 1;
        if (rank != 0) continue;
        if (c < 0) one = best;
        if (c == 2) zero2 = best;
        case_row(name, best, (double)o.batch * o.seq * ranks, psi, &ost);
    }
    if (rank == 0) bench_result("1-rank step / ZeRO-2 step (same global batch)", one / zero2);
    comm_free(comm);
    gpu_device_free(dev);
    return 0;
}
