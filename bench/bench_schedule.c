/* bench_schedule: the planner's predicted step time against the runtime's
 * measured one on the CPU backend, for the optimizer schedules (serial,
 * overlap, dpu) and three placements.
 *
 * This machine is described to the planner as a "GPU" that is its own CPU
 * (plan_hw_cpu_backend): the host's profile measured here (memplan
 * calibrate's functions: triad bandwidth, CPU AdamW on one thread and on
 * all, NVMe rates of --nvme-dir), memcpy as the host link, and a compute
 * rate calibrated so that the planner's forward + backward of the first
 * case equals the one measured (the CPU backend's non-GEMM work makes its
 * GEMM rate alone a poor guide): what is compared is the schedule, the
 * update's time and the traffic, not the compute model. The batch is small
 * (1 x 16 tokens, 2 micro-batches) so that the CPU update weighs as much as
 * the compute, as it does for a 13B model on one GPU. The cores are split:
 * --compute-threads for the device's work, the rest for the optimizer's
 * thread (overlap, dpu); the serial schedule's update takes every core.
 * Each case trains a few steps after a warm-up and takes the median step,
 * the cases alternating round by round (the fastest round counts); the rows,
 * then the largest |measured / predicted - 1|, with the optimizer on NVMe
 * and (last) without. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"          /* defines: bench_header, bench_row, bench_result */
#include "common/units.h"         /* defines: zo_parse_int */
#include "gpu/device.h"           /* defines: gpu_device_init_cpu, gpu_gemm */
#include "offload/offload.h"      /* defines: offload_init, offload_step */
#include "planner/calibrate.h"    /* defines: plan_calibrate_run */
#include "planner/cost.h"         /* defines: plan_time_run, plan_time_schedule */
#include "planner/memory.h"       /* defines: plan_estimate_run */
#include "transformer/offload_model.h" /* defines: tf_offload_model */

typedef struct placement {
    const char *name;
    offload_tier params;
    double cpu, nvme, gpu;
} placement;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The CPU backend's GEMM rate on `threads`: a layer's projection shape. */
static double gemm_rate(int threads, int rows, int hidden)
{
    gpu_cpu_options o = {.n_threads = threads};
    gpu_device_t dev;
    gpu_stream_t s;
    void *a, *b, *c;
    if (gpu_device_init_cpu(&o, &dev) != ZO_OK || gpu_stream_create(dev, &s) != ZO_OK) return 0;
    size_t n = (size_t)rows * hidden, w = (size_t)hidden * 4 * hidden;
    gpu_mem_alloc(dev, n * 2, &a);
    gpu_mem_alloc(dev, w * 2, &b);
    gpu_mem_alloc(dev, (size_t)rows * 4 * hidden * 2, &c);
    gpu_memset_async(s, a, 0, n * 2);
    gpu_memset_async(s, b, 0, w * 2);
    gpu_gemm_desc g = {.m = rows, .n = 4 * hidden, .k = hidden, .alpha = 1.0f, .trans_b = 1,
                       .a = gpu_t(a, ZO_DTYPE_BF16), .b = gpu_t(b, ZO_DTYPE_BF16), .c = gpu_t(c, ZO_DTYPE_BF16),
                       .lda = hidden, .ldb = hidden, .ldc = 4 * hidden};
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        gpu_stream_synchronize(s);
        double t0 = zo_now();
        for (int i = 0; i < 4; i++)
            gpu_gemm(s, &g);
        gpu_stream_synchronize(s);
        double dt = (zo_now() - t0) / 4;
        if (dt < best) best = dt;
    }
    gpu_mem_free(dev, a);
    gpu_mem_free(dev, b);
    gpu_mem_free(dev, c);
    gpu_stream_destroy(s);
    gpu_device_free(dev);
    return 2.0 * rows * 4.0 * hidden * hidden / best;
}

static double memcpy_rate(void)
{
    size_t n = 64u << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) return 0;
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = zo_now();
        memcpy(b, a, n);
        double dt = zo_now() - t0;
        if (dt < best) best = dt;
        bench_sink(b);
    }
    free(a);
    free(b);
    return (double)n / best;
}

typedef struct runcfg {
    zo_model_config cfg;
    int B, T, accum, steps, compute_threads, opt_threads, total_threads;
    const char *nvme_dir;
} runcfg;

/* The median step of the runtime under (placement, schedule), and the
 * median forward + backward of its steps (*fb). */
static double measure(const runcfg *rc, const placement *p, offload_schedule sched, double *fb)
{
    gpu_cpu_options dopt = {.n_threads = rc->compute_threads};
    gpu_device_t dev;
    gpu_stream_t s;
    tf_model m;
    tf_offload_model tm;
    offload_t *rt = NULL;
    if (gpu_device_init_cpu(&dopt, &dev) != ZO_OK || gpu_stream_create(dev, &s) != ZO_OK) return -1;
    tf_options to = {.external_res = 1};
    offload_config oc;
    offload_config_defaults(&oc);
    oc.params_on = p->params;
    oc.prefetch_depth = 1;
    oc.opt_frac[OFFLOAD_CPU] = p->cpu;
    oc.opt_frac[OFFLOAD_NVME] = p->nvme;
    oc.opt_frac[OFFLOAD_DEVICE] = p->gpu;
    oc.nvme_dir = rc->nvme_dir;
    oc.grad_accum = rc->accum;
    oc.schedule = sched;
    oc.n_threads = sched == OFFLOAD_SCHEDULE_SERIAL ? rc->total_threads : rc->opt_threads;
    oc.opt_threads = rc->opt_threads;
    double med = -1;
    if (tf_init_opts(&m, &rc->cfg, dev, ZO_DTYPE_BF16, rc->B, rc->T, &to) != ZO_OK) goto out_dev;
    if (tf_offload_model_init(&tm, &m) != ZO_OK || offload_init(&rt, dev, &tm.om, &oc) != ZO_OK) goto out_model;
    const model_layout *l = &m.layout;
    size_t big = 1;
    for (int b = 0; b < l->n_blocks; b++)
        if (l->block_numel[b] > big) big = l->block_numel[b];
    float *w = malloc(big * sizeof(float));
    uint64_t rng = tf_init_rng(1);
    for (int b = 0; w && b < l->n_blocks; b++) {
        tf_init_block_weights(l, b, w, &rng);
        offload_set_block(rt, b, w);
    }
    free(w);
    int n = rc->B * rc->T, warm = 2;
    int32_t *in = malloc((size_t)n * 4), *tg = malloc((size_t)n * 4);
    double *t = calloc((size_t)rc->steps, sizeof *t), *tf = calloc((size_t)rc->steps, sizeof *tf);
    for (int i = 0; i < n; i++) in[i] = (i * 7) % rc->cfg.vocab, tg[i] = (i * 7 + 1) % rc->cfg.vocab;
    double prev = zo_now();
    for (int k = 0; k < warm + rc->steps; k++) {
        float loss;
        offload_step_info info;
        double f = 0;
        for (int j = 0; j < rc->accum; j++) {
            double t0 = zo_now();
            if (tf_set_batch(&m, s, in, tg, rc->B, rc->T) != ZO_OK || offload_micro_batch(rt, s) != ZO_OK ||
                tf_loss(&m, s, &loss) != ZO_OK)
                goto out_rt;
            f += zo_now() - t0;
        }
        if (offload_step(rt, &info) != ZO_OK) goto out_rt;
        double now = zo_now();
        if (k >= warm) t[k - warm] = now - prev, tf[k - warm] = f;
        prev = now;
    }
    qsort(t, (size_t)rc->steps, sizeof *t, cmp_double);
    qsort(tf, (size_t)rc->steps, sizeof *tf, cmp_double);
    med = t[rc->steps / 2];
    *fb = tf[rc->steps / 2];
out_rt:
    free(in);
    free(tg);
    free(t);
    free(tf);
    offload_free(rt);
    tf_offload_model_free(&tm);
out_model:
    tf_free(&m);
out_dev:
    gpu_stream_destroy(s);
    gpu_device_free(dev);
    return med;
}

/* The planner's step for the same configuration on this machine, and its
 * forward + backward (*fb). */
static double predict(const runcfg *rc, const plan_hw *hw, const placement *p, plan_schedule sched, double *fb)
{
    plan_train t;
    plan_train_defaults(&t, &rc->cfg);
    t.seq = rc->T;
    t.micro_batch = rc->B;
    t.grad_accum = rc->accum;
    t.dtype = t.grad_dtype = ZO_DTYPE_BF16;
    t.recompute = PLAN_RECOMPUTE_NONE;
    t.dropout = 0;
    t.flash_attn = 1;
    t.params_on = (plan_tier)p->params;
    t.grads_on = p->gpu > 0 ? PLAN_GPU : PLAN_CPU;
    if (p->gpu > 0) t.grad_dtype = ZO_DTYPE_F32; /* the runtime sums that share in fp32 */
    t.checkpoints_on = PLAN_GPU;
    t.opt_frac[PLAN_GPU] = p->gpu;
    t.opt_frac[PLAN_CPU] = p->cpu;
    t.opt_frac[PLAN_NVME] = p->nvme;
    t.buf.cuda_context = t.buf.cublas_workspace = 0;
    t.buf.fragmentation = 0;
    t.buf.prefetch_depth = 1;
    t.schedule = sched;
    t.opt_threads = sched == PLAN_SCHED_SERIAL ? rc->total_threads : rc->opt_threads;
    t.dpu_warmup = 0;
    plan_estimate e;
    plan_time pt;
    if (plan_estimate_run(&rc->cfg, hw, &t, &e) != ZO_OK || plan_time_run(&rc->cfg, hw, &t, &e, &pt) != ZO_OK)
        return -1;
    *fb = pt.forward + pt.backward;
    return pt.step;
}

enum { NP = 4, NS = 3 };

static const placement placements[NP] = {
    {"weights resident, optimizer cpu", OFFLOAD_DEVICE, 1, 0, 0},
    {"weights streamed, optimizer cpu", OFFLOAD_CPU, 1, 0, 0},
    {"weights streamed, optimizer cpu/gpu", OFFLOAD_CPU, 0.5, 0, 0.5},
    {"weights resident, optimizer nvme", OFFLOAD_DEVICE, 0, 1, 0},
};

/* The schedules, as the runtime and as the planner name them. */
static const offload_schedule run_scheds[NS] = {OFFLOAD_SCHEDULE_SERIAL, OFFLOAD_SCHEDULE_OVERLAP,
                                                OFFLOAD_SCHEDULE_DPU};
static const plan_schedule plan_scheds[NS] = {PLAN_SCHED_SERIAL, PLAN_SCHED_OVERLAP, PLAN_SCHED_DPU};

typedef struct opts {
    long layers, hidden, steps, compute_threads, rounds;
    const char *nvme_dir;
} opts;

/* The flags; -1 to go on, else main's exit status (0 after --help). */
static int parse_opts(int argc, char **argv, opts *o)
{
    *o = (opts){.layers = 8, .hidden = 512, .steps = 7, .compute_threads = 1, .rounds = 3, .nvme_dir = "/tmp"};
    static const struct option long_opts[] = {
        {"layers", required_argument, 0, 'L'}, {"hidden", required_argument, 0, 'H'},
        {"steps", required_argument, 0, 's'}, {"compute-threads", required_argument, 0, 'c'},
        {"nvme-dir", required_argument, 0, 'n'}, {"rounds", required_argument, 0, 'r'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        zo_status st = ZO_OK;
        switch (c) {
        case 'L': st = zo_parse_int(optarg, "--layers", 1, 256, &o->layers); break;
        case 'H': st = zo_parse_int(optarg, "--hidden", 64, 8192, &o->hidden); break;
        case 's': st = zo_parse_int(optarg, "--steps", 3, 100, &o->steps); break;
        case 'c': st = zo_parse_int(optarg, "--compute-threads", 1, 1024, &o->compute_threads); break;
        case 'n': o->nvme_dir = optarg; break;
        case 'r': st = zo_parse_int(optarg, "--rounds", 1, 100, &o->rounds); break;
        case 'h':
            printf("usage: bench_schedule [--layers N] [--hidden N] [--steps N] [--compute-threads N]\n"
                   "                      [--nvme-dir DIR] [--rounds N]\n"
                   "defaults: 8 layers x 512, 7 steps after 2 of warm-up, 1 compute thread, /tmp, 3 rounds\n");
            return 0;
        default: return 2;
        }
        if (st != ZO_OK) {
            fprintf(stderr, "bench_schedule: %s\n", zo_last_error());
            return 2;
        }
    }
    return -1;
}

/* The run of the flags: LLaMA-2 7B's kind of layer at `hidden` (heads of
 * 64, vocab 2048), 1 x 16 tokens, 2 micro-batches; the cores split between
 * the compute and the optimizer. */
static zo_status make_runcfg(const opts *o, runcfg *rc)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN), ct = o->compute_threads;
    *rc = (runcfg){.B = 1, .T = 16, .accum = 2, .steps = (int)o->steps, .compute_threads = (int)ct,
                   .total_threads = (int)cores, .opt_threads = (int)(cores > ct ? cores - ct : 1),
                   .nvme_dir = o->nvme_dir};
    zo_status st = zo_model_preset_find("llama-2-7b", &rc->cfg);
    if (st != ZO_OK) return st;
    rc->cfg.n_layers = (int)o->layers;
    rc->cfg.hidden = (int)o->hidden;
    rc->cfg.n_heads = rc->cfg.n_kv_heads = (int)(o->hidden / 64);
    rc->cfg.head_dim = 0;
    rc->cfg.ffn = (int)(o->hidden * 8 / 3 / 64 * 64);
    rc->cfg.vocab = 2048;
    rc->cfg.max_seq = rc->T;
    return zo_model_config_validate(&rc->cfg);
}

/* The compute rate (*flops, from the GEMM rate) that makes the planner's
 * forward + backward of the first case the measured one, and the machine
 * described with it (*hw); 0, or 1 when a run fails. */
static int calibrate_compute(const runcfg *rc, const plan_hw *host, double copy, double *flops, plan_hw *hw)
{
    double fb_meas = 1e30, fb_pred;
    for (int r = 0; r < 2; r++) {
        double fb;
        if (measure(rc, &placements[0], OFFLOAD_SCHEDULE_SERIAL, &fb) <= 0) {
            fprintf(stderr, "bench_schedule: %s\n", zo_last_error());
            return 1;
        }
        if (fb < fb_meas) fb_meas = fb;
    }
    for (int it = 0; it < 6; it++) {
        plan_hw_cpu_backend(host, *flops, copy, 1ull << 40, hw);
        if (predict(rc, hw, &placements[0], PLAN_SCHED_SERIAL, &fb_pred) <= 0) return 1;
        *flops *= fb_pred / fb_meas;
    }
    plan_hw_cpu_backend(host, *flops, copy, 1ull << 40, hw);
    return 0;
}

/* Every case's step (got[placement][schedule]; 1e30 for a refused one),
 * the cases alternating round by round, the fastest round counting (the
 * machine is shared: slower rounds are someone else's load); 0, or 1 when a
 * case fails. */
static int measure_cases(const runcfg *rc, long rounds, double got[NP][NS])
{
    for (int i = 0; i < NP; i++)
        for (int k = 0; k < NS; k++) got[i][k] = 1e30;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < NP; i++)
            for (int k = 0; k < NS; k++) {
                const placement *p = &placements[i];
                if (p->gpu > 0 && run_scheds[k] == OFFLOAD_SCHEDULE_DPU) continue; /* refused: dpu is the CPU's */
                double fb1, t = measure(rc, p, run_scheds[k], &fb1);
                if (t <= 0) {
                    fprintf(stderr, "bench_schedule: %s, %s: %s\n", p->name, offload_schedule_name(run_scheds[k]),
                            zo_last_error());
                    return 1;
                }
                if (t < got[i][k]) got[i][k] = t;
            }
    return 0;
}

/* A row per case measured, against the planner's prediction, and the
 * largest |measured / predicted - 1| with the optimizer on NVMe and without;
 * 0, or 1 when a prediction fails. */
static int report_cases(const runcfg *rc, const plan_hw *hw, double got[NP][NS], double *worst,
                        double *worst_nvme)
{
    *worst = *worst_nvme = 0;
    for (int i = 0; i < NP; i++)
        for (int k = 0; k < NS; k++) {
            const placement *p = &placements[i];
            if (got[i][k] >= 1e30) continue;
            double fb2;
            double want = predict(rc, hw, p, plan_scheds[k], &fb2);
            if (want <= 0) {
                fprintf(stderr, "bench_schedule: %s, %s: %s\n", p->name, offload_schedule_name(run_scheds[k]),
                        zo_last_error());
                return 1;
            }
            double r = got[i][k] / want;
            double *w = p->nvme > 0 ? worst_nvme : worst;
            if (fabs(r - 1) > *w) *w = fabs(r - 1);
            bench_row("%-34s %-8s measured %8.4f s  predicted %8.4f s  ratio %.3f", p->name,
                      offload_schedule_name(run_scheds[k]), got[i][k], want, r);
        }
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc >= 0) return rc;
    runcfg run;
    if (make_runcfg(&o, &run) != ZO_OK) return 1;

    /* this machine, as the planner sees it */
    plan_calibrate_opts co;
    plan_calibrate_defaults(&co);
    co.seconds = 0.3;
    co.nvme_dir = o.nvme_dir;
    co.nvme_bytes = 256u << 20;
    plan_hw host, hw;
    if (plan_calibrate_run(&co, &host) != ZO_OK) {
        fprintf(stderr, "bench_schedule: calibrate: %s\n", zo_last_error());
        return 1;
    }
    double gemm = gemm_rate(run.compute_threads, 256, (int)o.hidden), copy = memcpy_rate(), flops = gemm;
    if (calibrate_compute(&run, &host, copy, &flops, &hw) != 0) return 1;
    bench_header("bench_schedule", "LLaMA %ld x %ld, batch %d x %d x %d micro-batches, bf16; %d compute "
                 "thread(s), optimizer thread(s) %d (serial: %d); compute %.3g FLOP/s calibrated (GEMM alone "
                 "%.3g), memcpy %.3g B/s, AdamW %.3g/s on one thread, NVMe %.3g / %.3g B/s read/write",
                 o.layers, o.hidden, run.B, run.T, run.accum, run.compute_threads, run.opt_threads,
                 run.total_threads, flops, gemm, copy, host.cpu_adam_thread_rate, host.nvme_read_bw,
                 host.nvme_write_bw);
    double got[NP][NS], worst, worst_nvme;
    if (measure_cases(&run, o.rounds, got) != 0) return 1;
    if (report_cases(&run, &hw, got, &worst, &worst_nvme) != 0) return 1;
    /* NVMe: the planner takes the disk's rates calibrate measured; a
     * virtual disk's vary from run to run (docs/performance.md) */
    bench_result("largest |measured / predicted - 1|, optimizer on NVMe", worst_nvme);
    bench_result("largest |measured / predicted - 1|, optimizer in memory or on the device", worst);
    return 0;
}
