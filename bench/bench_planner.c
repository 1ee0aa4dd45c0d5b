/* bench_planner: the planner's speed on one core.
 *
 * Three cases on the same model and 64 GPUs: the bare parameter count (the
 * baseline: the least arithmetic an estimate can do), full memory estimates
 * (plan_estimate_run over a sweep of configurations), and the search of
 * `memplan plan` (plan_search: every layout, ZeRO stage, recompute,
 * micro-batch, interleaving, placement and prefetch depth, each memory-checked
 * and the fitting ones costed). The last line is `configurations/s: X` of the
 * search; the goal is >= 1e6/s and the whole search in < 10 s.
 *
 *   bench_planner [--model NAME] [--seconds S] */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench.h"
#include "common/model_config.h"
#include "planner/hardware.h"
#include "planner/memory.h"
#include "planner/search.h"

typedef struct sweep {
    zo_model_config m;
    plan_hw hw;
    plan_train base;
    long n;          /* estimates per call */
    uint64_t sink;
} sweep;

static void run_estimates(void *arg)
{
    sweep *s = arg;
    static const int tps[] = {1, 2, 4, 8};
    static const int pps[] = {1, 2, 4, 8};
    plan_estimate e;
    for (long i = 0; i < s->n; i++) {
        plan_train t = s->base;
        t.tp = tps[i & 3];
        t.pp = pps[(i >> 2) & 3];
        t.dp = 64 / (t.tp * t.pp);
        t.zero = (int)((i >> 4) & 3);
        t.recompute = (plan_recompute)((i >> 6) % 3);
        t.params_on = (i >> 8) & 1 ? PLAN_CPU : PLAN_GPU;
        t.grads_on = t.params_on;
        if (plan_estimate_run(&s->m, &s->hw, &t, &e) == ZO_OK) s->sink += e.total[PLAN_GPU];
    }
}

typedef struct search_run {
    const sweep *s;
    plan_space space;
    plan_result r;
} search_run;

static void run_search(void *arg)
{
    search_run *sr = arg;
    plan_search(&sr->s->m, &sr->s->hw, &sr->space, 5, &sr->r);
}

static void run_counts(void *arg)
{
    sweep *s = arg;
    for (long i = 0; i < s->n; i++) {
        s->m.n_layers = 48 + (int)(i & 7) * 8; /* keep the compiler from hoisting it */
        s->sink += zo_model_params(&s->m);
    }
    s->m.n_layers = 48;
}

int main(int argc, char **argv)
{
    const char *model = "megatron-22b";
    double seconds = 1.0;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"seconds", required_argument, 0, 's'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "m:s:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 's': seconds = atof(optarg); break;
        default:
            fprintf(stderr, "usage: bench_planner [--model NAME] [--seconds S]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    sweep s = {.n = 4096};
    if (zo_model_preset_find(model, &s.m) != ZO_OK || plan_hw_find("dgx-a100-80gb", &s.hw) != ZO_OK) {
        fprintf(stderr, "bench_planner: %s\n", zo_last_error());
        return 2;
    }
    s.hw.gpus = 64;
    plan_train_defaults(&s.base, &s.m);
    s.base.grad_accum = 8;
    bench_header("bench_planner", "model %s, 64 x A100-80GB, one core, %ld estimates per timing", model, s.n);

    search_run sr = {.s = &s};
    plan_space_defaults(&sr.space, &s.m, &s.hw);
    sr.space.global_batch = 512;

    double t_count = bench_time_best(run_counts, &s, 2, 5, seconds / 2);
    double t_est = bench_time_best(run_estimates, &s, 2, 5, seconds);
    double t_search = bench_time_best(run_search, &sr, 1, 3, seconds);
    double count_rate = (double)s.n / t_count, est_rate = (double)s.n / t_est;
    double search_rate = (double)sr.r.configs / t_search;
    bench_row("%-44s %14s %12s", "case", "per second", "ns each");
    bench_row("%-44s %14.4g %12.1f", "baseline: parameter count", count_rate, 1e9 / count_rate);
    bench_row("%-44s %14.4g %12.1f", "full estimate (memory model)", est_rate, 1e9 / est_rate);
    bench_row("%-44s %14.4g %12.1f", "search configurations (memory + time)", search_rate,
              1e9 / search_rate);
    bench_row("search, global batch 512: %llu configurations (%llu fit) in %.3f s",
              (unsigned long long)sr.r.configs, (unsigned long long)sr.r.feasible, t_search);
    bench_row("estimate / parameter-count time: %.1f", count_rate / est_rate);
    bench_row("search configuration / parameter-count time: %.1f", count_rate / search_rate);
    bench_row("vs Calculon's ~44 ms per configuration: %.3g x faster", search_rate * 0.044);
    bench_sink(&s.sink);
    bench_result("configurations/s", search_rate);
    return 0;
}
