/* The optimizer schedule as a critical path (docs/memplan.md, "Optimizer
 * schedules"): the closed forms of planner/schedule.c against an event
 * simulation written here, block by block; the case (LLaMA-2-13B on
 * one H100, seq 4096, global batch 8) at most 0.6x the serial schedule with
 * its parts adding up to the step; the optimizer's threads; the prediction
 * for a plan file, and the CPU backend described as hardware. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "common/model_config.h"
#include "planner/cost.h"
#include "planner/hardware.h"
#include "planner/memory.h"
#include "planner/planfile.h"
#include "planner/search.h"
#include "tests/support/run.h" /* defines: run_memplan */
#include "tests/support/scratch.h" /* defines: scratch_path */

static double dmax(double a, double b) { return a > b ? a : b; }

static double parts_sum(const plan_time *pt)
{
    double s = 0;
    for (int i = 0; i < PLAN_TIME_PARTS; i++) s += plan_time_part(pt, i);
    return s;
}

/* ---- against a simulation -------------------------------------------------------------- */

static double uniform(unsigned *seed, double lo, double hi)
{
    *seed = *seed * 1103515245u + 12345u;
    return lo + (hi - lo) * (double)((*seed >> 8) & 0xffffff) / (double)0xffffff;
}

/* The step, event by event over every block: the GPU's work ends at 0; the
 * CPU chain runs block after block, each costing its elements times the
 * slowest of AdamW, NVMe and the upload per element, its pipeline filled
 * once before the first. */
static double simulate(const plan_sched_in *in, plan_schedule s)
{
    double f[600], b[600], u[600];
    int n = 0;
    double a = 1 / in->rate_over, w = in->w_bytes / in->pcie;
    double c = dmax(a, dmax(in->n_elem, w));
    double fill = in->fill * in->cpu_n * (a + in->n_elem + w - c), F1 = 0;
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < in->seg_n[k]; j++, n++) {
            f[n] = in->seg_fwd[k];
            b[n] = in->seg_bwd[k];
            u[n] = in->seg_elems[k] * c;
            F1 += f[n];
        }
    double base = in->gpu + in->opt_gpu;
    if (s == PLAN_SCHED_DPU) {
        double chain = fill;
        for (int i = 0; i < n; i++) chain += u[i];
        return dmax(base, chain);
    }
    if (!in->clip_stale) {
        /* all gradients ready at 0: updates in forward order; the first
         * micro-batch's forward of block i waits for its update */
        double cpu = fill, gpu = in->opt_gpu;
        for (int i = 0; i < n; i++) {
            cpu += u[i];
            gpu = dmax(gpu, cpu) + f[i];
        }
        return in->gpu - F1 + gpu;
    }
    /* block i's gradients are complete when the backward of blocks 0..i-1
     * remains: updates in backward order as they become ready */
    double ready[600] = {0}, rest = 0;
    for (int i = 0; i < n; i++) {
        ready[i] = -rest;
        rest += b[i];
    }
    double cpu = ready[n - 1] + fill;
    for (int i = n - 1; i >= 0; i--) cpu = dmax(cpu, ready[i]) + u[i];
    return in->gpu + dmax(in->opt_gpu, cpu);
}

static void test_against_simulation(void **state)
{
    (void)state;
    unsigned seed = 7;
    for (int trial = 0; trial < 2000; trial++) {
        plan_time pt;
        memset(&pt, 0, sizeof pt);
        plan_sched_in *in = &pt.sched;
        in->seg_n[0] = trial % 3 ? 1 : 0;
        in->seg_n[1] = 1 + (int)uniform(&seed, 0, 120);
        in->seg_n[2] = trial % 5 ? 1 : 0;
        double elems = 0, fwd = 0, bwd = 0;
        for (int k = 0; k < 3; k++) {
            in->seg_fwd[k] = uniform(&seed, 0.001, 0.05);
            in->seg_bwd[k] = in->seg_fwd[k] * uniform(&seed, 1.5, 3.5);
            in->seg_elems[k] = uniform(&seed, 0, 3e8);
            elems += in->seg_n[k] * in->seg_elems[k];
            fwd += in->seg_n[k] * in->seg_fwd[k];
            bwd += in->seg_n[k] * in->seg_bwd[k];
        }
        in->cpu_n = elems;
        in->gpu = fwd + bwd + uniform(&seed, 0, 1); /* and what else the GPU does */
        pt.forward = in->gpu;                       /* the parts: the GPU's, then the update's */
        in->opt_gpu = trial % 4 ? 0 : uniform(&seed, 0, 1);
        in->rate_serial = in->rate_over = uniform(&seed, 2e8, 4e9);
        in->n_elem = trial % 2 ? uniform(&seed, 0, 2e-9) : 0;
        in->w_bytes = 2;
        in->pcie = uniform(&seed, 1e9, 6e10);
        in->fill = uniform(&seed, 0, 0.2);
        in->clip_stale = trial % 7 < 3;
        in->tokens = 1;
        in->peak = 1;
        for (int s = PLAN_SCHED_OVERLAP; s <= PLAN_SCHED_DPU; s++) {
            plan_time_schedule(&pt, (plan_schedule)s);
            double want = simulate(in, (plan_schedule)s);
            if (fabs(pt.step - want) > 1e-9 * want)
                fail_msg("trial %d, %s%s: step %.12g, the simulation %.12g", trial,
                         plan_schedule_name((plan_schedule)s), in->clip_stale ? " stale" : "",
                         pt.step, want);
            /* the parts add up to the critical path; the optimizer's time is
             * what is hidden plus what is exposed */
            assert_true(fabs(parts_sum(&pt) - pt.step) < 1e-12 * pt.step);
            assert_true(fabs(pt.step - (in->gpu + in->opt_gpu + pt.opt_exposed)) < 1e-9 * pt.step);
            assert_true(fabs(pt.opt_hidden + pt.opt_exposed - pt.opt_s) < 1e-9 * pt.opt_s);
            assert_true(pt.serial_step >= pt.step * (1 - 1e-12));
        }
    }
}

/* A link that carries more than the rest of the step sets the step. */
static void test_link_bound(void **state)
{
    (void)state;
    plan_time pt;
    memset(&pt, 0, sizeof pt);
    plan_sched_in *in = &pt.sched;
    in->seg_n[1] = 10;
    for (int k = 0; k < 3; k++) in->seg_fwd[k] = 0.01, in->seg_bwd[k] = 0.02, in->seg_elems[k] = 1e8;
    in->cpu_n = 1e9;
    in->gpu = pt.forward = 1;
    in->rate_serial = in->rate_over = 2e9;
    in->tokens = in->peak = 1;
    in->nvme_busy = 3; /* streamed weights */
    plan_time_schedule(&pt, PLAN_SCHED_DPU);
    assert_true(pt.step == 3 && pt.bound == PLAN_BOUND_NVME);
    assert_true(fabs(parts_sum(&pt) - pt.step) < 1e-12);
    in->nvme_busy = 0;
    plan_time_schedule(&pt, PLAN_SCHED_DPU);
    assert_true(pt.step == 1 && pt.bound == PLAN_BOUND_GPU && pt.opt_hidden == 0.5);
    /* the host's memory: the gradient sums (0.8 s on every core) and AdamW
     * (1e9 elements at 2.5e9/s on every core, 0.4 s) stream it both, so
     * beside each other they take 1.2 s at least, more than the GPU's 1 s
     * (the H100's 1.35B LLaMA: dpu no faster than serial) */
    in->host_sum[0] = 0.8;
    in->rate_bus = 2.5e9;
    plan_time_schedule(&pt, PLAN_SCHED_DPU);
    assert_true(fabs(pt.step - 1.2) < 1e-12 && pt.bound == PLAN_BOUND_HOST_MEM);
    /* and the copies' DMA reads and writes of it: 4 GB at 40 GB/s, 0.1 s more */
    in->dma_bytes = 4e9;
    in->host_rate = 4e10;
    plan_time_schedule(&pt, PLAN_SCHED_DPU);
    assert_true(fabs(pt.step - 1.3) < 1e-12 && pt.bound == PLAN_BOUND_HOST_MEM);
    assert_true(fabs(parts_sum(&pt) - pt.step) < 1e-12);
    assert_true(fabs(parts_sum(&pt) - pt.step) < 1e-12);
    assert_string_equal(plan_bound_name(pt.bound), "host-memory");
    /* serial holds it anyway: the sums beside the backward, AdamW after it;
     * the GPU's 1 s is the larger part of the step's 1.5 s, so it bounds it */
    plan_time_schedule(&pt, PLAN_SCHED_SERIAL);
    assert_true(fabs(pt.step - 1.5) < 1e-12 && pt.bound == PLAN_BOUND_GPU);
    /* an update longer than the GPU's work (2 s): the optimizer bounds the
     * serial step */
    in->rate_serial = 5e8;
    plan_time_schedule(&pt, PLAN_SCHED_SERIAL);
    assert_true(fabs(pt.step - 3.0) < 1e-12 && pt.bound == PLAN_BOUND_OPT);
    in->rate_serial = 2e9;
    /* a smaller share of the sums: the GPU's work sets the step again */
    in->host_sum[0] = 0.4;
    plan_time_schedule(&pt, PLAN_SCHED_DPU);
    assert_true(pt.step == 1 && pt.bound == PLAN_BOUND_GPU);
    in->host_sum[0] = in->rate_bus = 0;
    /* nothing on the CPU: every schedule is the serial one */
    in->cpu_n = 0;
    plan_time_schedule(&pt, PLAN_SCHED_DPU);
    assert_true(pt.schedule == PLAN_SCHED_SERIAL && pt.step == 1);
}

/* ---- the case ----------------------------------------------------------------------- */

static void search_13b(int schedule, plan_result *r)
{
    zo_model_config m;
    plan_hw hw;
    plan_space s;
    assert_int_equal(zo_model_preset_find("llama-2-13b", &m), ZO_OK);
    assert_int_equal(plan_hw_find("h100-80gb", &hw), ZO_OK);
    plan_space_defaults(&s, &m, &hw);
    s.base.seq = 4096;
    s.global_batch = 8;
    s.schedule = schedule;
    assert_int_equal(plan_search(&m, &hw, &s, 3, r), ZO_OK);
    assert_true(r->n_best > 0);
}

/* memplan plan for LLaMA-2-13B on one H100 (scripts/demo.sh): the best
 * over every schedule at most 0.6x the same plan run serially (the issue's
 * bar, set when that plan was the serial search's best), and faster than the
 * serial search's best (which may now hold part of the optimizer on the
 * GPU, a share no delayed update takes). */
static void test_13b_h100(void **state)
{
    (void)state;
    static plan_result serial, any;
    search_13b(PLAN_SCHED_SERIAL, &serial);
    search_13b(-1, &any);
    const plan_candidate *b = &any.best[0], *sb = &serial.best[0];
    printf("  best %.3f s (%s; %.3f s of the CPU optimizer's %.3f s hidden): %.3fx the same plan "
           "serially (%.3f s), %.3fx the serial search's best (%.3f s, optimizer on the GPU %.2f)\n",
           b->time.step, plan_schedule_name(b->t.schedule), b->time.opt_hidden, b->time.opt_s,
           b->time.step / b->time.serial_step, b->time.serial_step, b->time.step / sb->time.step,
           sb->time.step, sb->t.opt_frac[PLAN_GPU]);
    assert_true(sb->t.schedule == PLAN_SCHED_SERIAL);
    assert_true(b->t.schedule != PLAN_SCHED_SERIAL);
    /* the bar; or, where the GPU's own work is above it, all of the
     * CPU optimizer hidden: no schedule is faster than the GPU's work (with
     * the runtime's attention as an H100 measured it, issue 25, 11.5 s of
     * GPU work beside 7.4 s of CPU optimizer: 0.61x) */
    double gpu_work = b->time.sched.gpu + b->time.sched.opt_gpu;
    if (gpu_work <= 0.6 * b->time.serial_step) {
        assert_true(b->time.step <= 0.6 * b->time.serial_step);
    } else {
        assert_true(b->time.opt_hidden >= b->time.opt_s * (1 - 1e-9));
        assert_true(b->time.step <= gpu_work * (1 + 1e-9));
    }
    assert_true(b->time.step < sb->time.step);
    /* the parts add up to the critical path, not to the sum of everything */
    assert_true(fabs(parts_sum(&b->time) - b->time.step) < 1e-9 * b->time.step);
    assert_true(b->time.opt_hidden > 0);
    assert_true(b->time.step < b->time.sched.gpu + b->time.opt_s);
    assert_true(fabs(b->time.step - (b->time.sched.gpu + b->time.sched.opt_gpu + b->time.opt_exposed)) <
                1e-9 * b->time.step);
    /* the same plan under each schedule: none faster than the one chosen */
    for (int s = 0; s < PLAN_SCHEDULES; s++) {
        plan_time x = b->time;
        plan_time_schedule(&x, (plan_schedule)s);
        assert_true(x.step >= b->time.step * (1 - 1e-12));
        assert_true(fabs(parts_sum(&x) - x.step) < 1e-9 * x.step);
    }
}

/* The delayed update runs the CPU optimizer only (offload_init refuses a
 * GPU share under it): a search fixed to dpu keeps the optimizer off the
 * GPU even for a model whose state fits there, and an estimate that asks
 * for both is refused, naming the flags. */
static void test_dpu_no_gpu_share(void **state)
{
    (void)state;
    zo_model_config m;
    plan_hw hw;
    plan_space s;
    static plan_result r;
    assert_int_equal(zo_model_preset_find("gpt2", &m), ZO_OK);
    assert_int_equal(plan_hw_find("h100-80gb", &hw), ZO_OK);
    plan_space_defaults(&s, &m, &hw);
    s.global_batch = 8;
    s.schedule = PLAN_SCHED_DPU;
    assert_int_equal(plan_search(&m, &hw, &s, 3, &r), ZO_OK);
    assert_true(r.n_best > 0);
    for (int i = 0; i < r.n_best; i++) {
        assert_true(r.best[i].t.schedule == PLAN_SCHED_DPU);
        assert_true(r.best[i].t.opt_frac[PLAN_GPU] == 0);
    }
    static char out[4096];
    assert_int_equal(run_memplan("estimate --model gpt2 --schedule dpu --optimizer gpu=0.5,cpu=0.5", out,
                                 sizeof out), 2);
    assert_non_null(strstr(out, "--schedule dpu"));
    assert_non_null(strstr(out, "--optimizer gpu=0.5"));
}

/* The same through the CLI: the choice explained, the JSON's parts adding
 * up to step_s, the plan file carrying the schedule. */
static void test_cli(void **state)
{
    (void)state;
    static char out[1 << 17];
    char path[128], args[512];
    scratch_path(path, sizeof path, "zo_test_schedule_%d.json", (int)getpid());
    snprintf(args, sizeof args, "plan --model llama-2-13b --hw h100-80gb --seq 4096 --global-batch 8 "
             "--top 3 --json-out %s", path);
    assert_int_equal(run_memplan(args, out, sizeof out), 0);
    assert_non_null(strstr(out, "optimizer schedule dpu"));
    assert_non_null(strstr(out, "- optimizer schedule dpu: "));
    assert_non_null(strstr(out, "s serial"));
    assert_non_null(strstr(out, "beside GPU work"));
    zo_plan p;
    assert_int_equal(zo_plan_load(path, &p), ZO_OK);
    assert_true(p.training.optimizer_schedule == ZO_PLAN_SCHED_DPU);
    assert_true(p.training.dpu_warmup == 10);
    /* estimate --plan reads it back to the same step, the parts adding up */
    snprintf(args, sizeof args, "estimate --plan %s --json", path);
    assert_int_equal(run_memplan(args, out, sizeof out), 0);
    cJSON *doc = cJSON_Parse(out);
    assert_non_null(doc);
    cJSON *t = cJSON_GetObjectItemCaseSensitive(doc, "time");
    double step = cJSON_GetObjectItemCaseSensitive(t, "step_s")->valuedouble, sum = 0;
    assert_true(fabs(step - p.predicted.step_s) < 1e-9 * step);
    const cJSON *part;
    cJSON_ArrayForEach(part, cJSON_GetObjectItemCaseSensitive(t, "parts")) sum += part->valuedouble;
    assert_true(fabs(sum - step) < 1e-9 * step);
    cJSON *js = cJSON_GetObjectItemCaseSensitive(t, "schedule");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(js, "name")->valuestring, "dpu");
    double hidden = cJSON_GetObjectItemCaseSensitive(js, "overlapped_s")->valuedouble;
    double exposed = cJSON_GetObjectItemCaseSensitive(js, "exposed_s")->valuedouble;
    double opt = cJSON_GetObjectItemCaseSensitive(js, "optimizer_s")->valuedouble;
    assert_true(hidden > 0 && fabs(hidden + exposed - opt) < 1e-9 * opt);
    assert_true(cJSON_GetObjectItemCaseSensitive(js, "serial_step_s")->valuedouble > step);
    cJSON_Delete(doc);
    remove(path);
    /* fixed by a flag, as the search's other dimensions */
    assert_int_equal(run_memplan("plan --model llama-2-13b --hw h100-80gb --seq 4096 --global-batch 8 "
                                 "--top 1 --schedule overlap --clip-stale", out, sizeof out), 0);
    assert_non_null(strstr(out, "optimizer schedule overlap"));
    assert_non_null(strstr(out, "clipping by the previous step's norm"));
    assert_int_equal(run_memplan("estimate --model gpt2 --schedule async", out, sizeof out), 2);
    assert_non_null(strstr(out, "--schedule: 'async' is not serial, overlap or dpu"));
}

/* ---- threads ------------------------------------------------------------------------------ */

/* CPU AdamW scales with the optimizer's threads up to the roof: the rate
 * measured on every core, or the memory bandwidth's. */
static void test_threads(void **state)
{
    (void)state;
    plan_hw hw = {.cpu_cores = 16, .cpu_adam_rate = 1e9, .cpu_adam_thread_rate = 1e8};
    assert_true(plan_hw_cpu_adam_rate_threads(&hw, 4) == 4e8);
    assert_true(plan_hw_cpu_adam_rate_threads(&hw, 16) == 1e9);
    assert_true(plan_hw_cpu_adam_rate_threads(&hw, 0) == 1e9);
    hw.cpu_adam_thread_rate = 0; /* measured on every core only: linear in the threads */
    assert_true(fabs(plan_hw_cpu_adam_rate_threads(&hw, 4) - 2.5e8) < 1);
    hw = (plan_hw){.cpu_cores = 16, .cpu_mem_bw = 30e9}; /* a preset: 5e8 a thread */
    assert_true(plan_hw_cpu_adam_rate_threads(&hw, 1) == 5e8);
    assert_true(plan_hw_cpu_adam_rate_threads(&hw, 8) == plan_hw_cpu_adam_rate(&hw));

    /* a plan's threads, in each schedule */
    zo_model_config m;
    plan_hw h;
    plan_train t;
    plan_estimate e;
    plan_time pt;
    assert_int_equal(zo_model_preset_find("llama-2-7b", &m), ZO_OK);
    assert_int_equal(plan_hw_find("h100-80gb", &h), ZO_OK);
    h.cpu_adam_thread_rate = 1e8;
    plan_train_defaults(&t, &m);
    t.seq = 2048;
    t.grads_on = PLAN_CPU;
    t.opt_frac[PLAN_GPU] = 0;
    t.opt_frac[PLAN_CPU] = 1;
    t.opt_threads = 6;
    t.schedule = PLAN_SCHED_DPU;
    assert_int_equal(plan_estimate_run(&m, &h, &t, &e), ZO_OK);
    assert_int_equal(plan_time_run(&m, &h, &t, &e, &pt), ZO_OK);
    assert_true(pt.opt_threads == 6 && pt.cpu_adam_rate == 6e8);
    assert_true(fabs(pt.cpu_adam_total - (double)e.train_params / 6e8) < 1e-9 * pt.cpu_adam_total);
    /* unset: every core when alone; beside the GPU (and the host thread's
     * gradient sums, which keep a quarter of the cores) three quarters */
    t.opt_threads = 0;
    assert_int_equal(plan_time_run(&m, &h, &t, &e, &pt), ZO_OK);
    assert_true(h.cpu_cores >= 8);
    assert_true(pt.opt_threads == h.cpu_cores - h.cpu_cores / 4);
    /* the host's sums of the bf16 gradients (one micro-batch: written, 2 + 4
     * bytes an element) on that quarter, each thread streaming AdamW's 30
     * bytes at its rate, under 70% of the memory bandwidth */
    double q = h.cpu_cores / 4, rate = q * 1e8 * 30 / 6;
    if (rate > h.cpu_mem_bw * 0.7 / 6) rate = h.cpu_mem_bw * 0.7 / 6;
    assert_true(fabs(pt.sched.host_sum[1] - (double)e.train_params / rate) < 1e-9 * pt.sched.host_sum[1]);
    t.schedule = PLAN_SCHED_SERIAL;
    assert_int_equal(plan_time_run(&m, &h, &t, &e, &pt), ZO_OK);
    assert_true(pt.opt_threads == h.cpu_cores);
    assert_int_equal(pt.sched.d2h_team, 0);
    double d2h_all = pt.d2h;
    /* overlap with exact clipping: the update ends in the next forward, so
     * the backward's sums have every core (the runtime's
     * offload_optim_sum_threads), as serial's; the H200's 16 cores summed
     * 1.35B gradients in 0.14 s a step so, 0.28 s on the quarter */
    assert_true(pt.sched.host_sum[1] > 1.5 * pt.sched.host_sum[0]);
    t.schedule = PLAN_SCHED_OVERLAP;
    t.clip_stale = 0;
    assert_int_equal(plan_time_run(&m, &h, &t, &e, &pt), ZO_OK);
    assert_int_equal(pt.sched.d2h_team, 0);
    assert_true(pt.d2h == d2h_all);
    /* without exact clipping (its updates run during the backward) and dpu
     * (beside the whole step): the quarter */
    t.clip_stale = 1;
    assert_int_equal(plan_time_run(&m, &h, &t, &e, &pt), ZO_OK);
    assert_int_equal(pt.sched.d2h_team, 1);
    t.clip_stale = 0;
    t.schedule = PLAN_SCHED_DPU;
    assert_int_equal(plan_time_run(&m, &h, &t, &e, &pt), ZO_OK);
    assert_int_equal(pt.sched.d2h_team, 1);
    /* a schedule played again on another's times: the same teams */
    plan_time_schedule(&pt, PLAN_SCHED_OVERLAP);
    assert_int_equal(pt.sched.d2h_team, 0);
    assert_true(fabs(pt.d2h - d2h_all) < 1e-12 * d2h_all);
    plan_time_schedule(&pt, PLAN_SCHED_DPU);
    assert_int_equal(pt.sched.d2h_team, 1);
}

/* ---- plans ---------------------------------------------------------------------------------- */

/* What the runtime's tests call: the prediction for a plan, under its own
 * schedule or another, and on the CPU backend described as hardware. */
static void test_predict_plan(void **state)
{
    (void)state;
    zo_model_config m;
    plan_hw hw;
    plan_train t;
    plan_estimate e, e2;
    plan_time pt, p2;
    assert_int_equal(zo_model_preset_find("llama-2-13b", &m), ZO_OK);
    assert_int_equal(plan_hw_find("h100-80gb", &hw), ZO_OK);
    plan_train_defaults(&t, &m);
    t.seq = 4096;
    t.micro_batch = 4;
    t.grad_accum = 2;
    t.recompute = PLAN_RECOMPUTE_FULL;
    t.params_on = t.grads_on = PLAN_CPU;
    t.opt_frac[PLAN_GPU] = 0;
    t.opt_frac[PLAN_CPU] = 1;
    t.schedule = PLAN_SCHED_OVERLAP;
    assert_int_equal(plan_estimate_run(&m, &hw, &t, &e), ZO_OK);
    assert_int_equal(plan_time_run(&m, &hw, &t, &e, &pt), ZO_OK);
    static zo_plan p;
    plan_file_from(&m, &hw, &t, &e, &pt, &p);
    assert_int_equal(plan_file_predict(&p, "p.json", -1, &e2, &p2), ZO_OK);
    assert_true(p2.step == pt.step && e2.total[PLAN_CPU] == e.total[PLAN_CPU]);
    for (int s = 0; s < PLAN_SCHEDULES; s++) {
        plan_time want = pt;
        plan_time_schedule(&want, (plan_schedule)s);
        assert_int_equal(plan_file_predict(&p, "p.json", s, NULL, &p2), ZO_OK);
        assert_true(p2.step == want.step);
    }
    assert_int_equal(plan_file_predict(&p, "p.json", 3, NULL, &p2), ZO_ERR_INVALID);
    p.has_hardware = 0;
    assert_int_equal(plan_file_predict(&p, "p.json", -1, NULL, &p2), ZO_ERR_FORMAT);

    /* the CPU backend: its "GPU" computes every matmul at the measured rate,
     * elementwise work at the triad's bandwidth, copies at memcpy's */
    plan_hw host = hw, cpu;
    host.cpu_mem_bw = 20e9;
    host.cpu_adam_rate = 1e9;
    host.cpu_adam_thread_rate = 6e8;
    host.cpu_cores = 2;
    plan_hw_cpu_backend(&host, 5e10, 8e9, 1ull << 30, &cpu);
    assert_true(plan_hw_gemm_eff(&cpu, 1e3) == 1 && plan_hw_gemm_eff(&cpu, 1e12) == 1);
    assert_true(cpu.hbm_bw * cpu.hbm_eff == 20e9 && cpu.pcie_bw == 8e9 && cpu.gpu_mem == 1ull << 30);
    zo_model_config tiny = {.name = "tiny", .arch = ZO_ARCH_LLAMA, .n_layers = 8, .hidden = 128,
                            .n_heads = 4, .n_kv_heads = 4, .ffn = 512, .vocab = 256,
                            .max_seq = 64, .norm_eps = 1e-5f, .rope_theta = 1e4f};
    assert_int_equal(zo_model_config_validate(&tiny), ZO_OK);
    plan_train_defaults(&t, &tiny);
    t.seq = 32;
    t.micro_batch = 2;
    t.params_on = t.grads_on = PLAN_CPU;
    t.opt_frac[PLAN_GPU] = 0;
    t.opt_frac[PLAN_CPU] = 1;
    t.opt_threads = 1;
    t.schedule = PLAN_SCHED_DPU;
    t.buf.cuda_context = t.buf.cublas_workspace = 0;
    assert_int_equal(plan_estimate_run(&tiny, &cpu, &t, &e), ZO_OK);
    assert_int_equal(plan_time_run(&tiny, &cpu, &t, &e, &pt), ZO_OK);
    assert_true(pt.cpu_adam_rate == 6e8);
    assert_true(pt.step > 0 && pt.step <= pt.serial_step);
    /* twice the compute rate: the matmuls take half as long */
    plan_hw fast;
    plan_hw_cpu_backend(&host, 1e11, 8e9, 1ull << 30, &fast);
    plan_time pf;
    assert_int_equal(plan_time_run(&tiny, &fast, &t, &e, &pf), ZO_OK);
    assert_true(pf.mb.fwd < pt.mb.fwd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_simulation), cmocka_unit_test(test_link_bound),
        cmocka_unit_test(test_13b_h100),           cmocka_unit_test(test_cli),
        cmocka_unit_test(test_dpu_no_gpu_share),
        cmocka_unit_test(test_threads),            cmocka_unit_test(test_predict_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
