/* Tests for the planner's cost model (against Korthikanti et al. 2022, Tables
 * 4 and 5: the development set), its formulas and overlap rules, and the
 * time section of `memplan estimate`. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "common/model_config.h"
#include "planner/cost.h"
#include "planner/hardware.h"
#include "planner/memory.h"
#include "tests/support/run.h" /* defines: run_memplan */

/* The error allowed on each development case; docs/memplan.md reports the
 * errors themselves. */
#define DEV_TOLERANCE 0.07

typedef struct dev_case {
    const char *what, *preset;
    int gpus, tp, pp, vpp, micro_batch, global_batch, sp;
    plan_recompute rc;
    double published; /* seconds */
    int layer;        /* 1: one layer forward + backward (Table 4); 0: a step (Table 5) */
} dev_case;

static const dev_case dev[] = {
    {"Table 4, 22B layer, no recompute", "megatron-22b", 8, 8, 1, 1, 4, 4, 0, PLAN_RECOMPUTE_NONE, 19.6e-3, 1},
    {"Table 4, 22B layer, full recompute", "megatron-22b", 8, 8, 1, 1, 4, 4, 0, PLAN_RECOMPUTE_FULL, 27.2e-3, 1},
    {"Table 4, 22B layer, selective", "megatron-22b", 8, 8, 1, 1, 4, 4, 0, PLAN_RECOMPUTE_SELECTIVE, 20.9e-3, 1},
    {"Table 5, 22B, full recompute", "megatron-22b", 8, 8, 1, 1, 4, 4, 0, PLAN_RECOMPUTE_FULL, 1.42, 0},
    {"Table 5, 22B, SP + selective", "megatron-22b", 8, 8, 1, 1, 4, 4, 1, PLAN_RECOMPUTE_SELECTIVE, 1.10, 0},
    {"Table 5, 175B, full recompute", "megatron-175b", 64, 8, 8, 3, 1, 64, 0, PLAN_RECOMPUTE_FULL, 18.13, 0},
    {"Table 5, 175B, SP + selective", "megatron-175b", 64, 8, 8, 3, 1, 64, 1, PLAN_RECOMPUTE_SELECTIVE, 13.75, 0},
};

typedef struct setup {
    zo_model_config m;
    plan_hw hw;
    plan_train t;
    plan_estimate e;
    plan_time pt;
} setup;

/* Megatron's runs: fp16 weights, fp32 gradients, standard attention,
 * dropout; the weight-gradient GEMMs add into the fp32 gradient buffer
 * (gradient-accumulation fusion, on by default in Megatron-LM since
 * 2022-02). */
static void dev_setup(setup *s, const dev_case *c)
{
    assert_int_equal(zo_model_preset_find(c->preset, &s->m), ZO_OK);
    assert_int_equal(plan_hw_find("dgx-a100-80gb", &s->hw), ZO_OK);
    s->hw.gpus = c->gpus;
    plan_train_defaults(&s->t, &s->m);
    s->t.dtype = ZO_DTYPE_F16;
    s->t.grad_dtype = ZO_DTYPE_F32;
    s->t.flash_attn = 0;
    s->t.seq = 2048;
    s->t.tp = c->tp;
    s->t.pp = c->pp;
    s->t.vpp = c->vpp;
    s->t.dp = c->gpus / (c->tp * c->pp);
    s->t.micro_batch = c->micro_batch;
    s->t.grad_accum = c->global_batch / (c->micro_batch * s->t.dp);
    s->t.sp = c->sp;
    s->t.recompute = c->rc;
    s->t.fused_grad_accum = 1;
    assert_int_equal(plan_estimate_run(&s->m, &s->hw, &s->t, &s->e), ZO_OK);
    assert_int_equal(plan_time_run(&s->m, &s->hw, &s->t, &s->e, &s->pt), ZO_OK);
}

/* Narayanan et al. 2021, Table 1: weak scaling of GPT models from 1.7B to
 * 1T on Selene (DGX A100-80GB), vocabulary 51200, sequence 2048, full
 * activation recomputation, fp16. The table gives TFLOP/s per GPU with the
 * paper's count 96 B s l h^2 (1 + s/6h + V/16lh) per step, so the step time
 * is that count over GPUs x TFLOP/s. Micro-batches and interleaving are
 * those of examples/sc21/run_table_1.sh in Megatron-LM at the paper's commit
 * (bc7b353, 2021-08-22), and so is the schedule: gradients in the weights'
 * dtype (--accumulate-allreduce-grads-in-fp32 off), each micro-batch's
 * weight gradients added into that buffer by a hook (the fused accumulation
 * came in 2022-02), and the data-parallel all-reduce after the backward
 * (train_step's allreduce_gradients; overlapping it came in 2023). */
typedef struct table1_row {
    double billions;
    int heads, hidden, layers, tp, pp, gpus, batch, tflops, micro_batch, vpp;
} table1_row;

static const table1_row table1[] = {
    {1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 16, 1},
    {3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 16, 1},
    {7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 16, 1},
    {18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 8, 1},
    {39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 4, 1},
    {76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 3},
    {145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 2},
    {310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 2},
    {529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 3},
    {1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, 1},
};

/* The errors docs/memplan.md reports: 1F1B rows within 5%; the interleaved
 * rows 4-8% fast, within the 10% issue 33 asks of each family of published
 * figures (they were 6-10% fast before the standard attention core's
 * measured speed and the pipeline sends of every chunk were modelled). */
#define TABLE1_TOLERANCE 0.05
#define TABLE1_INTERLEAVED_TOLERANCE 0.10
#define TABLE1_RMS 0.05

static void test_narayanan_table1(void **state)
{
    (void)state;
    double ss = 0;
    int bad = 0;
    for (size_t i = 0; i < sizeof table1 / sizeof table1[0]; i++) {
        const table1_row *r = &table1[i];
        setup s;
        memset(&s.m, 0, sizeof s.m);
        snprintf(s.m.name, sizeof s.m.name, "gpt-%.1fb", r->billions);
        snprintf(s.m.family, sizeof s.m.family, "megatron");
        s.m.arch = ZO_ARCH_GPT;
        s.m.n_layers = r->layers;
        s.m.hidden = r->hidden;
        s.m.n_heads = r->heads;
        s.m.ffn = 4 * r->hidden;
        s.m.vocab = 51200;
        s.m.max_seq = 2048;
        s.m.tied_embeddings = s.m.attn_bias = s.m.out_bias = s.m.norm_bias = 1;
        assert_int_equal(zo_model_config_validate(&s.m), ZO_OK);
        /* the paper's parameter count, 12 l h^2 (1 + 13/12h + (V + s)/12lh) */
        double l = r->layers, h = r->hidden, sq = 2048, V = 51200;
        double p = 12 * l * h * h * (1 + 13 / (12 * h) + (V + sq) / (12 * l * h));
        assert_true(fabs(p / 1e9 / r->billions - 1) < 0.03); /* 1.65B is printed 1.7 */

        assert_int_equal(plan_hw_find("dgx-a100-80gb", &s.hw), ZO_OK);
        s.hw.gpus = r->gpus;
        plan_train_defaults(&s.t, &s.m);
        s.t.dtype = s.t.grad_dtype = ZO_DTYPE_F16;
        s.t.flash_attn = 0;
        s.t.seq = 2048;
        s.t.tp = r->tp;
        s.t.pp = r->pp;
        s.t.vpp = r->vpp;
        s.t.dp = r->gpus / (r->tp * r->pp);
        s.t.micro_batch = r->micro_batch;
        s.t.grad_accum = r->batch / (r->micro_batch * s.t.dp);
        s.t.recompute = PLAN_RECOMPUTE_FULL;
        s.t.reduce_dtype = ZO_DTYPE_F16; /* the gradients all-reduced as they are, in fp16 */
        s.t.dp_overlap = 0;
        s.t.fused_grad_accum = 0;
        assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &s.e), ZO_OK);
        assert_true(s.e.fits);
        assert_int_equal(plan_time_run(&s.m, &s.hw, &s.t, &s.e, &s.pt), ZO_OK);
        double flops = 96 * r->batch * sq * l * h * h * (1 + sq / (6 * h) + V / (16 * l * h));
        double published = flops / (r->gpus * r->tflops * 1e12);
        double err = s.pt.step / published - 1;
        ss += err * err;
        double tol = r->vpp > 1 ? TABLE1_INTERLEAVED_TOLERANCE : TABLE1_TOLERANCE;
        printf("Table 1, %.1fB: published %.3f s, memplan %.3f s, %+.1f%% (tolerance %.0f%%)\n",
               r->billions, published, s.pt.step, 100 * err, 100 * tol);
        if (fabs(err) > tol) {
            print_error("%.1fB: predicted %.3f s, published %.3f s (%+.1f%%)\n", r->billions,
                        s.pt.step, published, 100 * err);
            bad++;
        }
    }
    assert_int_equal(bad, 0);
    double rms = sqrt(ss / (sizeof table1 / sizeof table1[0]));
    if (rms > TABLE1_RMS) fail_msg("RMS error %.1f%%", 100 * rms);
}

/* The two schedule terms on their own: a DP all-reduce after the backward
 * is all exposed; the unfused accumulation costs (wsz + 2 gsz) bytes per
 * parameter per micro-batch at HBM speed. */
static void test_schedule_terms(void **state)
{
    (void)state;
    setup s;
    assert_int_equal(zo_model_preset_find("llama-2-7b", &s.m), ZO_OK);
    assert_int_equal(plan_hw_find("dgx-a100-80gb", &s.hw), ZO_OK);
    plan_train_defaults(&s.t, &s.m);
    s.t.dp = 8;
    s.t.grad_accum = 4;
    s.t.recompute = PLAN_RECOMPUTE_FULL;
    s.t.fused_grad_accum = 1;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &s.e), ZO_OK);
    assert_int_equal(plan_time_run(&s.m, &s.hw, &s.t, &s.e, &s.pt), ZO_OK);
    plan_time fused = s.pt;
    assert_true(fused.dp_comm < fused.dp_comm_total);
    s.t.fused_grad_accum = 0;
    s.t.dp_overlap = 0;
    assert_int_equal(plan_time_run(&s.m, &s.hw, &s.t, &s.e, &s.pt), ZO_OK);
    assert_true(fabs(s.pt.dp_comm - s.pt.dp_comm_total) < 1e-12);
    double P = (double)s.e.stage_params;
    double acc = 4 * P * (2 + 2 * 2) / (s.hw.hbm_bw * s.hw.hbm_eff);
    assert_true(fabs(s.pt.backward - fused.backward - acc) < 1e-9);
}

static void test_development_set(void **state)
{
    (void)state;
    int bad = 0;
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
        setup s;
        dev_setup(&s, &dev[i]);
        double got = dev[i].layer ? s.pt.mb.layer_fwd + s.pt.mb.layer_bwd : s.pt.step;
        double err = got / dev[i].published - 1;
        printf("%s: published %.4g s, memplan %.4g s, %+.1f%%\n", dev[i].what, dev[i].published,
               got, 100 * err);
        if (fabs(err) > DEV_TOLERANCE) {
            print_error("%s: predicted %.4g s, published %.4g s (%+.1f%%)\n", dev[i].what, got,
                        dev[i].published, 100 * err);
            bad++;
        }
    }
    assert_int_equal(bad, 0);
}

static void test_recompute_ordering(void **state)
{
    (void)state;
    /* Table 4's ordering: none < selective < full, and SP + selective saves
     * most of what recompute costs */
    setup a, b, c;
    dev_setup(&a, &dev[0]);
    dev_setup(&b, &dev[2]);
    dev_setup(&c, &dev[1]);
    double none = a.pt.mb.layer_fwd + a.pt.mb.layer_bwd;
    double sel = b.pt.mb.layer_fwd + b.pt.mb.layer_bwd;
    double full = c.pt.mb.layer_fwd + c.pt.mb.layer_bwd;
    assert_true(none < sel && sel < full);
    /* full recompute repeats the forward (and its collectives) in the backward */
    assert_true(fabs(c.pt.mb.layer_bwd - a.pt.mb.layer_bwd - a.pt.mb.layer_fwd) < 1e-9);
    assert_true(fabs(c.pt.mb.layer_fwd - a.pt.mb.layer_fwd) < 1e-12);
}

static void test_model_flops(void **state)
{
    (void)state;
    /* MFU's model FLOPs are Korthikanti et al.'s 72 B s l h^2 (1 + s/(6h) + v/(12lh)) */
    for (size_t i = 3; i < sizeof dev / sizeof dev[0]; i++) {
        setup s;
        dev_setup(&s, &dev[i]);
        double B = dev[i].global_batch, sq = 2048, l = s.m.n_layers, h = s.m.hidden, v = s.m.vocab;
        double want = 72 * B * sq * l * h * h * (1 + sq / (6 * h) + v / (12 * l * h));
        assert_true(fabs(s.pt.model_flops / want - 1) < 1e-9);
        /* MFU = model FLOPs / (step x GPUs x peak) */
        assert_true(fabs(s.pt.mfu - want / (s.pt.step * dev[i].gpus * 312e12)) < 1e-9);
        assert_true(s.pt.hfu >= s.pt.mfu);
        /* the parts add up to the step */
        double sum = 0;
        for (int k = 0; k < PLAN_TIME_PARTS; k++) sum += plan_time_part(&s.pt, k);
        assert_true(fabs(sum - s.pt.step) < 1e-9 * s.pt.step);
    }
    /* the published MFU of the 175B run (51.4%) within the development tolerance */
    setup s;
    dev_setup(&s, &dev[6]);
    assert_true(fabs(s.pt.mfu / 0.514 - 1) < DEV_TOLERANCE);
}

static void test_collective_formulas(void **state)
{
    (void)state;
    double bw = 100e9, lat = 10e-6, N = 1e9;
    /* ring all-reduce: 2(p-1)/p N / bw + 2(p-1) latencies */
    assert_true(fabs(plan_allreduce_s(N, 8, bw, lat) - (2.0 * 7 / 8 * N / bw + 14 * lat)) < 1e-12);
    /* all-gather and reduce-scatter: (p-1)/p N / bw */
    assert_true(fabs(plan_allgather_s(N, 8, bw, lat) - (7.0 / 8 * N / bw + 7 * lat)) < 1e-12);
    /* small messages over many ranks: the tree's log2(p) latency wins */
    double small = 1e3;
    double tree = 2 * small / bw + 2 * 10 * lat;
    assert_true(fabs(plan_allreduce_s(small, 1024, bw, lat) - tree) < 1e-12);
    assert_true(plan_allreduce_s(N, 1, bw, lat) == 0);
}

static void test_gemm_curve(void **state)
{
    (void)state;
    plan_hw hw;
    assert_int_equal(plan_hw_find("a100-80gb", &hw), ZO_OK);
    /* rises with size towards eff_max, half of it at gemm_flops_half */
    assert_true(fabs(plan_hw_gemm_eff(&hw, hw.gemm_flops_half) - hw.gemm_eff_max / 2) < 1e-12);
    assert_true(plan_hw_gemm_eff(&hw, 1e8) < plan_hw_gemm_eff(&hw, 1e10));
    assert_true(plan_hw_gemm_eff(&hw, 1e13) < hw.gemm_eff_max);
    assert_true(plan_hw_gemm_eff(&hw, 1e13) > 0.99 * hw.gemm_eff_max);
}

static void test_offload_overlap(void **state)
{
    (void)state;
    /* LLaMA-2-13B on one H100 with ZeRO-Offload: gradients stream to the host
     * during backward (hidden), CPU AdamW over 13B parameters is exposed */
    setup s;
    assert_int_equal(zo_model_preset_find("llama-2-13b", &s.m), ZO_OK);
    assert_int_equal(plan_hw_find("h100-80gb", &s.hw), ZO_OK);
    plan_train_defaults(&s.t, &s.m);
    s.t.recompute = PLAN_RECOMPUTE_FULL;
    s.t.grad_accum = 8;
    s.t.grads_on = PLAN_CPU;
    s.t.opt_frac[PLAN_GPU] = 0;
    s.t.opt_frac[PLAN_CPU] = 1;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &s.e), ZO_OK);
    assert_int_equal(plan_time_run(&s.m, &s.hw, &s.t, &s.e, &s.pt), ZO_OK);
    assert_true(s.pt.d2h_total > 0);
    assert_true(s.pt.d2h < s.pt.d2h_total);
    double P = (double)s.e.stage_params;
    assert_true(fabs(s.pt.cpu_adam - P / plan_hw_cpu_adam_rate(&s.hw)) < 1e-9);
    assert_true(s.pt.optimizer_gpu == 0);
    {
        /* several ranks: the sums are reduced after their last addition, so
         * a pass of its own reads them again for the clipping statistics (4
         * bytes an element at the host's streaming rate) before AdamW; one
         * rank's come with that addition (the runtime's offload/grads.c):
         * AdamW alone, above */
        setup r;
        r.m = s.m;
        assert_int_equal(plan_hw_find("dgx-h100", &r.hw), ZO_OK);
        plan_train_defaults(&r.t, &r.m);
        r.t.recompute = PLAN_RECOMPUTE_FULL;
        r.t.dp = 8;
        r.t.zero = 1;
        r.t.grads_on = PLAN_CPU;
        r.t.opt_frac[PLAN_GPU] = 0;
        r.t.opt_frac[PLAN_CPU] = 1;
        assert_int_equal(plan_estimate_run(&r.m, &r.hw, &r.t, &r.e), ZO_OK);
        assert_int_equal(plan_time_run(&r.m, &r.hw, &r.t, &r.e, &r.pt), ZO_OK);
        /* the node's 8 ranks share its cores and memory: each updates an
         * eighth of the parameters at an eighth of the node's rates */
        double node = plan_hw_cpu_adam_rate(&r.hw), read = plan_hw_host_stream_rate(&r.hw, r.hw.cpu_cores, 4);
        double want = (double)r.e.train_params * (1 / node + 1 / read);
        assert_true(fabs(r.pt.cpu_adam - want) < 1e-9 * want);
    }
    /* updated weights go back over PCIe once per step */
    assert_true(s.pt.h2d >= P * 2 / s.hw.pcie_bw);

    /* NVMe: the optimizer state read and written once per step, overlapped
     * with the CPU update, so the phase is at least the slower of the two */
    s.t.opt_frac[PLAN_CPU] = 0;
    s.t.opt_frac[PLAN_NVME] = 1;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &s.e), ZO_OK);
    assert_int_equal(plan_time_run(&s.m, &s.hw, &s.t, &s.e, &s.pt), ZO_OK);
    double io = 12 * P / s.hw.nvme_read_bw + 12 * P / s.hw.nvme_write_bw; /* master, m, v */
    assert_true(fabs(s.pt.nvme_total - io) < 1e-9 * io);
    assert_true(s.pt.cpu_adam + s.pt.nvme >= io - 1e-9);
    assert_true(s.pt.cpu_adam + s.pt.nvme < s.pt.cpu_adam + io);

    /* streaming weights from the CPU: 2 passes per micro-batch over PCIe */
    s.t.params_on = PLAN_CPU;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &s.e), ZO_OK);
    assert_int_equal(plan_time_run(&s.m, &s.hw, &s.t, &s.e, &s.pt), ZO_OK);
    assert_true(fabs(s.pt.h2d_total - 2 * 8 * P * 2 / s.hw.pcie_bw) < 1e-6);
}

static void test_data_parallel(void **state)
{
    (void)state;
    /* more data-parallel ranks at a fixed global batch: less compute per
     * rank, more collective time; ZeRO-3 moves 1.5x the bytes of ZeRO-0 */
    setup s;
    assert_int_equal(zo_model_preset_find("llama-2-7b", &s.m), ZO_OK);
    assert_int_equal(plan_hw_find("dgx-h100", &s.hw), ZO_OK);
    plan_train_defaults(&s.t, &s.m);
    s.t.dp = 8;
    s.t.grad_accum = 4;
    s.t.zero = 0;
    s.t.recompute = PLAN_RECOMPUTE_FULL;
    /* the reduce dtype sets the gradients' bytes: the runtime's fp32 by default */
    assert_int_equal(s.t.reduce_dtype, ZO_DTYPE_F32);
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &s.e), ZO_OK);
    assert_int_equal(plan_time_run(&s.m, &s.hw, &s.t, &s.e, &s.pt), ZO_OK);
    double P = (double)s.e.stage_params;
    double bw = s.hw.nvlink_bw * s.hw.coll_eff;
    assert_true(fabs(s.pt.dp_comm_total - plan_allreduce_s(4 * P, 8, bw, s.hw.nvlink_lat)) < 1e-12);
    /* reduced in bf16, as the weights: half of it */
    s.t.reduce_dtype = ZO_DTYPE_BF16;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &s.e), ZO_OK);
    assert_int_equal(plan_time_run(&s.m, &s.hw, &s.t, &s.e, &s.pt), ZO_OK);
    double z0 = s.pt.dp_comm_total;
    assert_true(fabs(z0 - plan_allreduce_s(2 * P, 8, bw, s.hw.nvlink_lat)) < 1e-12);
    assert_true(s.pt.dp_comm <= z0);
    s.t.zero = 3;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &s.e), ZO_OK);
    assert_int_equal(plan_time_run(&s.m, &s.hw, &s.t, &s.e, &s.pt), ZO_OK);
    assert_true(fabs(s.pt.dp_comm_total / 4 / z0 - 1.5) < 0.01);
}

/* ---- the CLI ------------------------------------------------------------------------ */

static double jnum(cJSON *o, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *sv = NULL, *k = strtok_r(buf, ".", &sv); k; k = strtok_r(NULL, ".", &sv)) {
        o = cJSON_GetObjectItem(o, k);
        if (!o) {
            print_error("missing %s\n", path);
            fail();
        }
    }
    assert_true(cJSON_IsNumber(o));
    return o->valuedouble;
}

/* memplan `args` exits 0 and prints each of `says` (NULL-terminated). */
static void memplan_says(const char *args, const char *const *says)
{
    static char out[1 << 16];
    int rc = run_memplan(args, out, sizeof out);
    if (rc) fail_msg("memplan %s: exit %d\n%s", args, rc, out);
    for (; *says; says++)
        if (!strstr(out, *says)) fail_msg("memplan %s: no '%s' in\n%s", args, *says, out);
}

static void test_cli_time(void **state)
{
    (void)state;
    static char out[1 << 20];
    int rc = run_memplan("estimate --model megatron-175b --hw dgx-a100-80gb --gpus 64 --tp 8 --pp 8 "
                         "--vpp 3 --sp --recompute selective --no-flash-attn --dtype fp16 "
                         "--grad-dtype fp32 --global-batch 64 --fused-grad-accum --json",
                         out, sizeof out);
    assert_int_equal(rc, 0);
    cJSON *doc = cJSON_Parse(out);
    assert_non_null(doc);
    assert_true(jnum(doc, "config.grad_accum") == 64);
    double step = jnum(doc, "time.step_s");
    assert_true(fabs(step / 13.75 - 1) < DEV_TOLERANCE);
    assert_true(jnum(doc, "time.mfu") > 0.4 && jnum(doc, "time.mfu") < 0.6);
    assert_true(jnum(doc, "time.hfu") >= jnum(doc, "time.mfu"));
    assert_true(jnum(doc, "time.parts.pp_bubble") > 0);
    assert_true(fabs(jnum(doc, "time.tokens_per_s") - 64 * 2048 / step) < 1e-6 * step);
    cJSON_Delete(doc);

    memplan_says("estimate --model megatron-22b --hw dgx-a100-80gb --tp 8 --micro-batch 4 "
                 "--global-batch 4 --recompute full --no-flash-attn",
                 (const char *[]){"time per step", "MFU", "recompute", NULL});

    rc = run_memplan("estimate --model llama-2-7b --micro-batch 2 --global-batch 5", out, sizeof out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "--global-batch 5 is not a multiple"));
    rc = run_memplan("estimate --model llama-2-7b --grad-accum 2 --global-batch 4", out, sizeof out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "exclude each other"));
}

/* ---- this runtime's kernels (docs/memplan.md, "This runtime's kernels") ---- */

/* LLaMA-2-13B QLoRA as train ran it on an H100 (the plan of
 * that run's 13b.log, not kept): r 16 on every linear layer, one micro-batch
 * of 4 x 2048 tokens, bf16, everything on the GPU, no recompute; attention
 * on `path` (ZO_ATTN_AUTO: the runtime's automatic choice). */
static void qlora_13b(setup *s, const char *hw, zo_attn_path path)
{
    assert_int_equal(zo_model_preset_find("llama-2-13b", &s->m), ZO_OK);
    assert_int_equal(plan_hw_find(hw, &s->hw), ZO_OK);
    plan_train_defaults(&s->t, &s->m);
    s->t.seq = 2048;
    s->t.micro_batch = 4;
    s->t.grad_accum = 1;
    s->t.recompute = PLAN_RECOMPUTE_NONE;
    s->t.method = PLAN_METHOD_QLORA;
    s->t.lora = (zo_lora_config){16, 8, ZO_LORA_ALL_LINEAR};
    s->t.attn_path = path;
    assert_int_equal(plan_estimate_run(&s->m, &s->hw, &s->t, &s->e), ZO_OK);
    assert_int_equal(plan_time_run(&s->m, &s->hw, &s->t, &s->e, &s->pt), ZO_OK);
}

/* Measured on 2026-11-26 on an NVIDIA H100 80GB HBM3 (driver 580.159.04,
 * CUDA 13.0; scripts/gpu_13b.py's QLoRA run with train --profile, 3 steps
 * profiled): 1894.555 ms a step (wall), the compute stream busy 1872.558
 * ms, of which attention forward 137.284 ms and backward 638.426 ms (40
 * calls each), the base's eight GEMM shapes 523.965 ms, the elementwise
 * kernels (rmsnorm, cast, swiglu, rope, add) 274.731 ms, the LoRA GEMMs
 * 147.996 ms, nf4_dequantize 139.688 ms; memplan said 0.88 s before issue
 * 25's calibration. The model must put the step within 20% of it. The
 * run's attention took the GEMM path (the automatic choice then, before
 * the mma.sync kernels were): the plan with that path forced, as
 * ZO_ATTENTION=gemm forces it. */
static void test_h100_qlora_13b(void **state)
{
    (void)state;
    setup s;
    qlora_13b(&s, "h100-80gb", ZO_ATTN_GEMM);
    const double *op = s.pt.mb.ops;
    printf("  QLoRA 13B on the H100: %.1f ms a step (measured 1894.6 ms): matmuls %.1f, attention "
           "%.1f + %.1f, elementwise %.1f, LoRA %.1f, NF4 %.1f, ends %.1f\n",
           1e3 * s.pt.step, 1e3 * op[PLAN_OP_GEMM], 1e3 * op[PLAN_OP_ATTN_FWD], 1e3 * op[PLAN_OP_ATTN_BWD],
           1e3 * op[PLAN_OP_EW], 1e3 * op[PLAN_OP_LORA], 1e3 * op[PLAN_OP_NF4], 1e3 * op[PLAN_OP_ENDS]);
    assert_true(fabs(s.pt.step / 1.894555 - 1) < 0.20);
    /* by kind of op, against the profile */
    assert_true(fabs(op[PLAN_OP_ATTN_FWD] / 137.284e-3 - 1) < 0.01);
    assert_true(fabs(op[PLAN_OP_ATTN_BWD] / 638.426e-3 - 1) < 0.01);
    assert_true(fabs(op[PLAN_OP_GEMM] / 523.965e-3 - 1) < 0.05);
    /* the ops add up to the compute */
    double sum = 0;
    for (int i = 0; i < PLAN_OPS; i++) sum += op[i];
    assert_true(fabs(sum - (s.pt.mb.fwd + s.pt.mb.bwd)) < 1e-9 * sum);

    /* the memory-bound ops from their bytes, as the runtime moves them (bf16
     * activations, fp32 gradients). Per row of a layer (h 5120, f 13824,
     * q = k = v = h): forward, 2 RMSNorms (2 + 2 bytes an element), 2
     * residual adds (2 + 2 + 2), SwiGLU (gate and up read, out written), RoPE
     * on q and k in place; backward, twice that, and each linear layer's fp32
     * output gradient rounded to bf16 (4 + 2) over qkv, o, gate, up, down */
    double h = 5120, f = 13824, T = 8192, L = 40, hbm = 3350e9;
    double fwd = 2 * 4 * h + 2 * 6 * h + 6 * f + 4 * (2 * h);
    double casts = 6 * (3 * h + h + 2 * f + h);
    double ew_bytes = L * T * (3 * fwd + casts);
    assert_true(fabs(op[PLAN_OP_EW] / 274.731e-3 - 1) < 1e-9);
    printf("  elementwise: %.4e bytes at %.4f of HBM; ", ew_bytes, ew_bytes / (274.731e-3 * hbm));
    /* LoRA, per adapter of in -> out on T rows: x read twice (u = x A^T, dA
     * = du^T x) and dy (bf16) twice (du, dB), y read and written (bf16), dx
     * read and written (fp32): 12 in + 8 out bytes a row. q, k, v, o, gate,
     * up from h; down from f */
    double in = 6 * h + f, out = 4 * h + 2 * f + h;
    double lora_bytes = L * T * (12 * in + 8 * out);
    assert_true(fabs(op[PLAN_OP_LORA] / 147.996e-3 - 1) < 1e-9);
    printf("LoRA: %.4e bytes at %.4f of HBM; ", lora_bytes, lora_bytes / (147.996e-3 * hbm));
    /* NF4: every linear weight, forward and backward */
    double params = 4 * h * h + 3 * h * f;
    assert_true(fabs(op[PLAN_OP_NF4] / 139.688e-3 - 1) < 1e-9);
    printf("NF4: %.4e parameters/s\n", 2 * L * params / 139.688e-3);
}

/* The kernels' rates on other shapes and GPUs, from their formulas. */
static void test_runtime_kernels(void **state)
{
    (void)state;
    setup a, b;
    qlora_13b(&a, "h100-80gb", ZO_ATTN_AUTO);
    /* the H200: the same kernels, the memory-bound ones at its HBM's speed */
    qlora_13b(&b, "h200-141gb", ZO_ATTN_AUTO);
    assert_true(fabs(b.pt.mb.ops[PLAN_OP_EW] / a.pt.mb.ops[PLAN_OP_EW] - 3350.0 / 4800) < 1e-9);
    assert_true(fabs(b.pt.mb.ops[PLAN_OP_LORA] / a.pt.mb.ops[PLAN_OP_LORA] - 3350.0 / 4800) < 1e-9);
    assert_true(b.pt.mb.ops[PLAN_OP_ATTN_BWD] == a.pt.mb.ops[PLAN_OP_ATTN_BWD]);
    assert_true(b.pt.mb.ops[PLAN_OP_NF4] == a.pt.mb.ops[PLAN_OP_NF4]);
    /* the automatic choice at head dim 128, 2048 tokens: the mma.sync
     * kernels, 150.65 TFLOP/s forward, 34.1 backward with fp32 gradients
     * (bench_gpu_cuda on the H100, the means of b 2 t 2048 and b 1 t 4096:
     * 141.6 and 159.7, 32.7 and 35.5), FLOPs of the causal half (40 layers,
     * 4 b 40 heads t^2 128 / 2), the backward 2.5x */
    double fl = 40 * 4.0 * 4 * 40 * 2048.0 * 2048 * 128 / 2;
    assert_true(fabs(a.pt.mb.ops[PLAN_OP_ATTN_FWD] - fl / 150.65e12) < 1e-9 * fl / 150.65e12);
    assert_true(fabs(a.pt.mb.ops[PLAN_OP_ATTN_BWD] - 2.5 * fl / 34.1e12) < 1e-9 * fl / 34.1e12);
    /* ALiBi, which the mma.sync kernels do not cover: from 256 tokens at
     * head dim 128 the GEMM path, as ZO_ATTENTION=gemm forced gives it; mma
     * forced falls back to the same */
    setup al = a, ag;
    qlora_13b(&ag, "h100-80gb", ZO_ATTN_GEMM);
    al.m.pos = ZO_POS_ALIBI;
    ag.m.pos = ZO_POS_ALIBI;
    for (int k = 0; k < 3; k++) {
        setup *x = k == 2 ? &ag : &al;
        x->t.attn_path = k == 1 ? ZO_ATTN_MMA : k == 2 ? ZO_ATTN_GEMM : ZO_ATTN_AUTO;
        assert_int_equal(plan_estimate_run(&x->m, &x->hw, &x->t, &x->e), ZO_OK);
        assert_int_equal(plan_time_run(&x->m, &x->hw, &x->t, &x->e, &x->pt), ZO_OK);
    }
    assert_true(al.pt.mb.ops[PLAN_OP_ATTN_FWD] == ag.pt.mb.ops[PLAN_OP_ATTN_FWD]);
    assert_true(al.pt.mb.ops[PLAN_OP_ATTN_BWD] == ag.pt.mb.ops[PLAN_OP_ATTN_BWD]);
    assert_true(al.pt.mb.ops[PLAN_OP_ATTN_FWD] > 2 * a.pt.mb.ops[PLAN_OP_ATTN_FWD]);
    /* under 256 tokens: the mma.sync kernels at head dim 128 */
    setup c = a;
    c.t.seq = 128;
    assert_int_equal(plan_time_run(&c.m, &c.hw, &c.t, &c.e, &c.pt), ZO_OK);
    fl = 40 * 4.0 * 4 * 40 * 128 * 128 * 128 / 2;
    assert_true(fabs(c.pt.mb.ops[PLAN_OP_ATTN_FWD] - fl / 150.65e12) < 1e-9 * fl / 150.65e12);
    assert_true(fabs(c.pt.mb.ops[PLAN_OP_ATTN_BWD] - 2.5 * fl / 34.1e12) < 1e-9 * fl / 34.1e12);
    /* and with ALiBi the tensor-core kernels: 31.7 TFLOP/s forward, 10.5
     * backward (the H200's profile at t 1024: extrapolated to short
     * sequences); tc forced gives them without ALiBi too */
    for (int k = 0; k < 2; k++) {
        setup x = c;
        if (k) x.t.attn_path = ZO_ATTN_TC;
        else x.m.pos = ZO_POS_ALIBI;
        assert_int_equal(plan_estimate_run(&x.m, &x.hw, &x.t, &x.e), ZO_OK);
        assert_int_equal(plan_time_run(&x.m, &x.hw, &x.t, &x.e, &x.pt), ZO_OK);
        assert_true(fabs(x.pt.mb.ops[PLAN_OP_ATTN_FWD] - fl / 31.7e12) < 1e-9 * fl / 31.7e12);
        assert_true(fabs(x.pt.mb.ops[PLAN_OP_ATTN_BWD] - 2.5 * fl / 10.5e12) < 1e-9 * fl / 10.5e12);
    }
    /* fp32 qkv: the flash kernel, 5.35 forward, 4.65 backward (bench_gpu_cuda's
     * mean of t 2048 and 4096 on the H100), whatever path is forced */
    c.t.dtype = ZO_DTYPE_F32;
    for (int k = 0; k < 2; k++) {
        c.t.attn_path = k ? ZO_ATTN_MMA : ZO_ATTN_AUTO;
        assert_int_equal(plan_estimate_run(&c.m, &c.hw, &c.t, &c.e), ZO_OK);
        assert_int_equal(plan_time_run(&c.m, &c.hw, &c.t, &c.e, &c.pt), ZO_OK);
        assert_true(fabs(c.pt.mb.ops[PLAN_OP_ATTN_FWD] - fl / 5.35e12) < 1e-9 * fl / 5.35e12);
        assert_true(fabs(c.pt.mb.ops[PLAN_OP_ATTN_BWD] - 2.5 * fl / 4.65e12) < 1e-9 * fl / 4.65e12);
    }
    /* head dim 64 (GPT-2: 12 layers of 12 heads), here past the GEMM path's
     * 256 tokens: the mma.sync kernels at head dim 128's rates (64 not
     * measured); with ALiBi the tensor-core kernels, 41.6 forward and 18.6
     * backward */
    setup g = a;
    assert_int_equal(zo_model_preset_find("gpt2", &g.m), ZO_OK);
    plan_train_defaults(&g.t, &g.m);
    g.t.seq = 1024;
    g.t.micro_batch = 8;
    double gl = 12 * 4.0 * 8 * 12 * 1024.0 * 1024 * 64 / 2;
    static const double g_fwd[2] = {150.65e12, 41.6e12}, g_bwd[2] = {34.1e12, 18.6e12};
    for (int k = 0; k < 2; k++) {
        if (k) g.m.pos = ZO_POS_ALIBI;
        assert_int_equal(plan_estimate_run(&g.m, &g.hw, &g.t, &g.e), ZO_OK);
        assert_int_equal(plan_time_run(&g.m, &g.hw, &g.t, &g.e, &g.pt), ZO_OK);
        assert_true(fabs(g.pt.mb.ops[PLAN_OP_ATTN_FWD] - gl / g_fwd[k]) < 1e-9 * gl / g_fwd[k]);
        assert_true(fabs(g.pt.mb.ops[PLAN_OP_ATTN_BWD] - 2.5 * gl / g_bwd[k]) < 1e-9 * gl / g_bwd[k]);
    }
    /* head dim 256 (Gemma-7B: 28 layers of 16 heads), past the GEMM path's
     * 256 tokens: the mma.sync kernels at head dim 128's rates (256 not
     * measured), mma forced the same; gemm forced the GEMM path, slower
     * (its score-element kernels' time moves less at 256) */
    setup gm = a;
    assert_int_equal(zo_model_preset_find("gemma-7b", &gm.m), ZO_OK);
    plan_train_defaults(&gm.t, &gm.m);
    gm.t.seq = 1024;
    gm.t.micro_batch = 2;
    const double gml = 28 * 4.0 * 2 * 16 * 1024.0 * 1024 * 256 / 2;
    double gm_gemm = 0;
    for (int k = 0; k < 3; k++) {
        gm.t.attn_path = k == 1 ? ZO_ATTN_MMA : k == 2 ? ZO_ATTN_GEMM : ZO_ATTN_AUTO;
        assert_int_equal(plan_estimate_run(&gm.m, &gm.hw, &gm.t, &gm.e), ZO_OK);
        assert_int_equal(plan_time_run(&gm.m, &gm.hw, &gm.t, &gm.e, &gm.pt), ZO_OK);
        if (k == 2) {
            gm_gemm = gm.pt.mb.ops[PLAN_OP_ATTN_FWD];
            continue;
        }
        assert_true(fabs(gm.pt.mb.ops[PLAN_OP_ATTN_FWD] - gml / 150.65e12) < 1e-9 * gml / 150.65e12);
        assert_true(fabs(gm.pt.mb.ops[PLAN_OP_ATTN_BWD] - 2.5 * gml / 34.1e12) < 1e-9 * gml / 34.1e12);
    }
    assert_true(gm_gemm > 1.5 * gml / 150.65e12);
    /* a sliding window of 64 keys at 128 tokens: the mma.sync kernels,
     * which skip the key tiles outside every row's window, at the causal
     * score elements the window leaves, (128 * 64 - 64 * 64 / 2) of
     * 128 * 128 / 2 (0.75); tc forced the same on its rates */
    setup w = a;
    w.t.seq = 128;
    w.m.sliding_window = 64;
    const double win = (128.0 * 64 - 64.0 * 64 / 2) / (128.0 * 128 / 2);
    static const double w_fwd[2] = {150.65e12, 31.7e12}, w_bwd[2] = {34.1e12, 10.5e12};
    for (int k = 0; k < 2; k++) {
        w.t.attn_path = k ? ZO_ATTN_TC : ZO_ATTN_AUTO;
        assert_int_equal(plan_estimate_run(&w.m, &w.hw, &w.t, &w.e), ZO_OK);
        assert_int_equal(plan_time_run(&w.m, &w.hw, &w.t, &w.e, &w.pt), ZO_OK);
        assert_true(fabs(w.pt.mb.ops[PLAN_OP_ATTN_FWD] - win * fl / w_fwd[k]) < 1e-9 * fl / w_fwd[k]);
        assert_true(fabs(w.pt.mb.ops[PLAN_OP_ATTN_BWD] - win * 2.5 * fl / w_bwd[k]) < 1e-9 * fl / w_bwd[k]);
    }
    w.t.attn_path = ZO_ATTN_AUTO;
    /* the window from layer 10 on (Qwen2's max_window_layers): the first 10
     * of 40 layers at the whole causal work, the rest at the window's */
    w.m.window_from_layer = 10;
    assert_int_equal(plan_estimate_run(&w.m, &w.hw, &w.t, &w.e), ZO_OK);
    assert_int_equal(plan_time_run(&w.m, &w.hw, &w.t, &w.e, &w.pt), ZO_OK);
    double mixed = (0.25 + 0.75 * win) * fl / 150.65e12;
    assert_true(fabs(w.pt.mb.ops[PLAN_OP_ATTN_FWD] - mixed) < 1e-9 * mixed);
    mixed = (0.25 + 0.75 * win) * 2.5 * fl / 34.1e12;
    assert_true(fabs(w.pt.mb.ops[PLAN_OP_ATTN_BWD] - mixed) < 1e-9 * mixed);
    /* the flash kernel forced with the window: at the whole causal work
     * (memplan counts no window's saving there) */
    w.t.attn_path = ZO_ATTN_FLASH;
    assert_int_equal(plan_time_run(&w.m, &w.hw, &w.t, &w.e, &w.pt), ZO_OK);
    assert_true(fabs(w.pt.mb.ops[PLAN_OP_ATTN_FWD] - fl / 5.35e12) < 1e-9 * fl / 5.35e12);
    w.t.attn_path = ZO_ATTN_AUTO;
    /* fp32 qkv with the window: the flash kernel, at the whole causal work */
    w.t.dtype = ZO_DTYPE_F32;
    assert_int_equal(plan_estimate_run(&w.m, &w.hw, &w.t, &w.e), ZO_OK);
    assert_int_equal(plan_time_run(&w.m, &w.hw, &w.t, &w.e, &w.pt), ZO_OK);
    assert_true(fabs(w.pt.mb.ops[PLAN_OP_ATTN_FWD] - fl / 5.35e12) < 1e-9 * fl / 5.35e12);
    w.t.dtype = a.t.dtype;
    /* a window as long as the sequence masks nothing: every layer on the
     * mma.sync kernels at the whole work, as the runtime passes it (no window) */
    w.m.sliding_window = 128;
    assert_int_equal(plan_estimate_run(&w.m, &w.hw, &w.t, &w.e), ZO_OK);
    assert_int_equal(plan_time_run(&w.m, &w.hw, &w.t, &w.e, &w.pt), ZO_OK);
    assert_true(fabs(w.pt.mb.ops[PLAN_OP_ATTN_FWD] - fl / 150.65e12) < 1e-9 * fl / 150.65e12);
    /* where nothing was measured (A100): FlashAttention at 0.75 of the curve */
    setup d;
    qlora_13b(&d, "a100-80gb", ZO_ATTN_AUTO);
    fl = 40 * 4.0 * 4 * 40 * 2048.0 * 2048 * 128 / 2;
    double one = fl / 40, t = fl / (312e12 * plan_hw_gemm_eff(&d.hw, one) * 0.75);
    assert_true(fabs(d.pt.mb.ops[PLAN_OP_ATTN_FWD] - t) < 1e-9 * t);
    /* the GEMM path, twice the tokens a sequence: its time per score
     * element as at 2048 (the bench: 48.5 forward at 4096, 50.6 at 2048) */
    setup e;
    qlora_13b(&e, "h100-80gb", ZO_ATTN_GEMM);
    setup e2 = e;
    e2.t.seq = 4096;
    e2.t.micro_batch = 2;
    assert_int_equal(plan_time_run(&e2.m, &e2.hw, &e2.t, &e2.e, &e2.pt), ZO_OK);
    assert_true(fabs(e2.pt.mb.ops[PLAN_OP_ATTN_FWD] / e.pt.mb.ops[PLAN_OP_ATTN_FWD] - 2) < 0.01);
    /* --explain prints them */
    memplan_says("estimate --model llama-2-13b --seq 2048 --micro-batch 4 --lora 16 --lora-targets all-linear "
                 "--qlora --explain",
                 (const char *[]){"compute by kind of op, 1 micro-batch",
                                  "this runtime's kernels as measured on the H100-80GB", "attention backward",
                                  "NF4 dequantization", NULL});
    memplan_says("estimate --model gpt2 --hw a100-80gb --explain",
                 (const char *[]){"no measurement of this runtime's kernels on the A100-80GB", NULL});
    /* --attention forces a path as ZO_ATTENTION does: the profiled run's GEMM
     * path (test_h100_qlora_13b's figures), the automatic choice's mma.sync */
    memplan_says("estimate --model llama-2-13b --hw h100-80gb --seq 2048 --micro-batch 4 --lora 16 "
                 "--lora-targets all-linear --qlora --explain --attention gemm",
                 (const char *[]){"time per step    1.873 s", "137.77 ms", "638.92 ms", NULL});
    memplan_says("estimate --model llama-2-13b --hw h100-80gb --seq 2048 --micro-batch 4 --lora 16 "
                 "--lora-targets all-linear --qlora --explain --attention auto",
                 (const char *[]){"time per step    1.645 s", "45.62 ms", "503.81 ms", NULL});
    static char out[1 << 16];
    int rc = run_memplan("estimate --model llama-2-13b --attention wmma", out, sizeof out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "--attention wmma: expected auto, flash, gemm, tc or mma"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_development_set), cmocka_unit_test(test_recompute_ordering),
        cmocka_unit_test(test_model_flops),     cmocka_unit_test(test_collective_formulas),
        cmocka_unit_test(test_gemm_curve),      cmocka_unit_test(test_offload_overlap),
        cmocka_unit_test(test_data_parallel),   cmocka_unit_test(test_cli_time),
        cmocka_unit_test(test_narayanan_table1), cmocka_unit_test(test_schedule_terms),
        cmocka_unit_test(test_h100_qlora_13b),  cmocka_unit_test(test_runtime_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
