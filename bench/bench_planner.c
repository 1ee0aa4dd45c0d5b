/* bench_planner: the planner's speed on one core.
 *
 * Three cases on the same model and 64 GPUs: the bare parameter count (the
 * baseline: the least arithmetic an estimate can do), full memory estimates
 * (plan_estimate_run over a sweep of configurations), and the search of
 * `memplan plan` (plan_search: every layout, ZeRO stage, recompute,
 * micro-batch, interleaving, placement and prefetch depth, each memory-checked
 * and the fitting ones costed, the step bound off: plan_space.no_bound),
 * whose configurations/s the goal is >= 1e6/s for, and the whole search in
 * < 10 s. Then `memplan plan`'s whole work where its state hint is asked
 * (no --optim-dtype): the search, and where its best keeps 32-bit m and v
 * the search over the other AdamW encodings, uncapped (the old way) against
 * capped at the best's step / PLAN_STATE_HINT (plan_space.max_step: the
 * layouts that cannot beat it skipped), both with the step bound, the two
 * alternating round by round, the order flipped each round (--rounds; the
 * fastest round of each counts: the machine is shared), their hints checked
 * equal, and the ratio uncapped / capped. Last, the search (top 5) without
 * the step bound (every layout walked, the old way) against with it (the
 * layouts whose floor is above the full ranking's last plan skipped, the
 * most GPUs walked first), alternated the same way, their rankings checked
 * equal plan for plan, and the ratio without / with printed last.
 *
 *   bench_planner [--model NAME] [--hw NAME] [--max-gpus N] [--seconds S] [--rounds N]
 *
 * (--hw, default dgx-a100-80gb, with 64 GPUs; --max-gpus N also tries fewer,
 * as memplan plan's. The space is plan_space_defaults' at global batch 512,
 * on the preset as plan_hw_find gives it: `--model llama-2-70b --hw dgx-h100
 * --max-gpus 64` is the model and machine of docs/memplan.md's 70B command,
 * not its flags' space, whose best differs) */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h" /* defines: bench_row, bench_result, zo_now */
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

/* memplan plan's work with the state hint (state_hint): the search, then
 * the other encodings' best (`side`, top 1) where the best keeps 32-bit
 * state, capped or not */
typedef struct hint_run {
    search_run *sr;
    int capped;
    plan_result side;
} hint_run;

static void run_hint(void *arg)
{
    hint_run *h = arg;
    search_run *sr = h->sr;
    run_search(sr);
    const plan_candidate *b = sr->r.n_best ? &sr->r.best[0] : NULL;
    h->side.n_best = 0;
    h->side.configs = 0;
    if (b && b->t.opt_state != ZO_PLAN_STATE_FP32) return;
    plan_space o = sr->space;
    o.opt_states = ((1u << ZO_PLAN_STATES) - 1) & ~(1u << ZO_PLAN_STATE_FP32);
    if (h->capped && b) o.max_step = b->time.step / PLAN_STATE_HINT;
    plan_search(&sr->s->m, &sr->s->hw, &o, 1, &h->side);
}

/* The hint's line, or none: the other encodings' best where it takes at
 * most 1/PLAN_STATE_HINT of the step (or fits where nothing did). */
static const plan_candidate *hint_of(const plan_result *r, const plan_result *side)
{
    if (!side->n_best) return NULL;
    const plan_candidate *a = &side->best[0];
    if (r->n_best && a->time.step * PLAN_STATE_HINT > r->best[0].time.step) return NULL;
    return a;
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
    const char *model = "megatron-22b", *hw = "dgx-a100-80gb";
    double seconds = 1.0;
    int rounds = 3, max_gpus = 0;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"hw", required_argument, 0, 'w'},
        {"max-gpus", required_argument, 0, 'g'}, {"seconds", required_argument, 0, 's'},
        {"rounds", required_argument, 0, 'r'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "m:w:g:s:r:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'w': hw = optarg; break;
        case 'g': max_gpus = atoi(optarg); break;
        case 's': seconds = atof(optarg); break;
        case 'r': rounds = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: bench_planner [--model NAME] [--hw NAME] [--max-gpus N] [--seconds S] "
                            "[--rounds N]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (rounds < 1 || max_gpus < 0) {
        fprintf(stderr, "bench_planner: --rounds %d, --max-gpus %d: at least 1 round, no negative GPUs\n",
                rounds, max_gpus);
        return 2;
    }
    sweep s = {.n = 4096};
    if (zo_model_preset_find(model, &s.m) != ZO_OK || plan_hw_find(hw, &s.hw) != ZO_OK) {
        fprintf(stderr, "bench_planner: %s\n", zo_last_error());
        return 2;
    }
    s.hw.gpus = 64;
    plan_train_defaults(&s.base, &s.m);
    s.base.grad_accum = 8;
    bench_header("bench_planner", "model %s, 64 x %s%s, one core, %ld estimates per timing", model, hw,
                 max_gpus ? " (and fewer)" : "", s.n);

    search_run sr = {.s = &s};
    plan_space_defaults(&sr.space, &s.m, &s.hw);
    sr.space.global_batch = 512;
    sr.space.max_gpus = max_gpus;

    double t_count = bench_time_best(run_counts, &s, 2, 5, seconds / 2);
    double t_est = bench_time_best(run_estimates, &s, 2, 5, seconds);
    sr.space.no_bound = 1; /* (configurations/s: the whole space's) */
    double t_search = bench_time_best(run_search, &sr, 1, 3, seconds);
    sr.space.no_bound = 0;
    double count_rate = (double)s.n / t_count, est_rate = (double)s.n / t_est;
    double search_rate = (double)sr.r.configs / t_search;
    bench_row("%-44s %14s %12s", "case", "per second", "ns each");
    bench_row("%-44s %14.4g %12.1f", "baseline: parameter count", count_rate, 1e9 / count_rate);
    bench_row("%-44s %14.4g %12.1f", "full estimate (memory model)", est_rate, 1e9 / est_rate);
    bench_row("%-44s %14.4g %12.1f", "search configurations (memory + time)", search_rate,
              1e9 / search_rate);
    bench_row("search, global batch 512, every layout: %llu configurations (%llu fit) in %.3f s",
              (unsigned long long)sr.r.configs, (unsigned long long)sr.r.feasible, t_search);
    bench_row("estimate / parameter-count time: %.1f", count_rate / est_rate);
    bench_row("search configuration / parameter-count time: %.1f", count_rate / search_rate);
    bench_row("vs Calculon's ~44 ms per configuration: %.3g x faster", search_rate * 0.044);
    bench_sink(&s.sink);

    /* the state hint: the other encodings' search uncapped against capped, alternating */
    hint_run old = {.sr = &sr}, now = {.sr = &sr, .capped = 1};
    plan_result main_old = {0}, main_new = {0};
    double t_old = 1e30, t_new = 1e30;
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < 2; k++) {
            int capped = (r + k) % 2; /* old, new; new, old; ... */
            hint_run *h = capped ? &now : &old;
            double t0 = zo_now();
            run_hint(h);
            double dt = zo_now() - t0;
            if (capped) {
                t_new = dt < t_new ? dt : t_new;
                main_new = sr.r;
            } else {
                t_old = dt < t_old ? dt : t_old;
                main_old = sr.r;
            }
        }
    }
    /* the same plan and the same hint, or the timing means nothing */
    const plan_candidate *ho = hint_of(&main_old, &old.side), *hn = hint_of(&main_new, &now.side);
    if (main_old.configs != main_new.configs || main_old.n_best != main_new.n_best || !ho != !hn ||
        (ho && (ho->time.step != hn->time.step || ho->t.opt_state != hn->t.opt_state ||
                memcmp(ho->total, hn->total, sizeof ho->total)))) {
        fprintf(stderr, "bench_planner: the capped hint search's answer differs from the uncapped one's\n");
        return 1;
    }
    char line[96] = "no hint";
    if (ho) snprintf(line, sizeof line, "hint: %s m, v at %.4g s", zo_plan_opt_state_name(ho->t.opt_state),
                     ho->time.step);
    bench_row("plan with the state hint, %d rounds alternated (fastest each): uncapped %.3f s, capped %.3f s; "
              "best %.4g s, %s; the hint's search %llu configurations uncapped, %llu capped",
              rounds, t_old, t_new, main_new.n_best ? main_new.best[0].time.step : 0.0, line,
              (unsigned long long)old.side.configs, (unsigned long long)now.side.configs);
    bench_row("hint: uncapped / capped: %.3f", t_old / t_new);

    /* the step bound: the search without it against with it, alternating */
    search_run off = {.s = &s, .space = sr.space}, on = {.s = &s, .space = sr.space};
    off.space.no_bound = 1;
    double t_off = 1e30, t_on = 1e30;
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < 2; k++) {
            int bound = (r + k) % 2; /* off, on; on, off; ... */
            double t0 = zo_now();
            run_search(bound ? &on : &off);
            double dt = zo_now() - t0;
            if (bound) t_on = dt < t_on ? dt : t_on;
            else t_off = dt < t_off ? dt : t_off;
        }
    }
    /* the same ranking, or the timing means nothing */
    int same = on.r.n_best == off.r.n_best;
    for (int i = 0; same && i < on.r.n_best; i++) {
        const plan_candidate *a = &on.r.best[i], *b = &off.r.best[i];
        same = a->gpus == b->gpus && a->score == b->score && a->time.step == b->time.step &&
               !memcmp(a->total, b->total, sizeof a->total) && a->t.dp == b->t.dp && a->t.tp == b->t.tp &&
               a->t.pp == b->t.pp && a->t.zero == b->t.zero && a->t.micro_batch == b->t.micro_batch &&
               a->t.schedule == b->t.schedule && a->t.buf.prefetch_depth == b->t.buf.prefetch_depth;
    }
    if (!same) {
        fprintf(stderr, "bench_planner: the search with the step bound ranks other plans than without it\n");
        return 1;
    }
    bench_row("search (top 5), %d rounds alternated (fastest each): every layout %.3f s (%llu configurations), "
              "with the step bound %.3f s (%llu configurations, %llu of %llu layouts skipped); best %.4g s",
              rounds, t_off, (unsigned long long)off.r.configs, t_on, (unsigned long long)on.r.configs,
              (unsigned long long)on.r.skipped, (unsigned long long)on.r.layouts,
              on.r.n_best ? on.r.best[0].time.step : 0.0);
    bench_result("search: no bound / bound", t_off / t_on);
    return 0;
}
