/* memplan max-model: the largest model of a family that trains on the
 * hardware, per strategy, with the estimate flags that place it and the
 * largest preset that fits that way (docs/memplan.md, "memplan max-model"). */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/units.h"
#include "planner/memplan_cli.h"
#include "planner/report.h"
#include "planner/suggest.h"

static const char usage_max_model[] =
    "usage: memplan max-model [--family gpt|llama|gpt3|megatron|llama2|llama3 | --model NAME]\n"
    "                         [--hw NAME|FILE|cpu | --gpu NAME [--host NAME]] [--gpus N]\n"
    "                         [--gpu-mem SIZE] [--cpu-mem SIZE] [--nvme SIZE] [--pcie LINK]\n"
    "                         [--seq N] [--strategy NAME] [--json | --json-out FILE]\n"
    "                         [--lora R [--lora-targets LIST] [--qlora]] [--schedule S]\n"
    "\n"
    "The largest model of a family that trains on the hardware, per strategy: data-parallel,\n"
    "zero-1, zero-2, zero-3, 3d-parallel, zero-offload (ZeRO-2, gradients and optimizer on\n"
    "the CPU), zero-infinity-cpu (ZeRO-3, everything on the CPU), zero-infinity-nvme\n"
    "(weights and optimizer on NVMe). Micro-batch 1; recompute, checkpoint placement and\n"
    "prefetch are searched. Shapes interpolate the family's presets (hidden a multiple of 128);\n"
    "3d-parallel searches every TP x PP layout on the widths TP divides, each as deep (in\n"
    "multiples of PP, up to twice the family's depth) as fits.\n"
    "With --lora (and --qlora) every size is fine-tuned with adapters on a frozen base. The\n"
    "optimizer schedule is searched unless --schedule fixes it; the flags name the one taken.\n"
    "Each row also gives the estimate flags that place it, and the largest preset that fits\n"
    "that way with the 'memplan estimate' command that checks it. On one GPU the ZeRO stages\n"
    "and 3-D parallelism are left out (nothing to shard) unless --strategy names one.\n"
    "--json prints the rows as JSON instead of the table; --json-out FILE writes them to FILE.\n"
    "\n"
    "exit status: 0, 2 bad input\n";

/* `m` trained as the searched plan `ct` trains its shape: the estimate's
 * defaults for `m` with the plan's layout, batch, recompute and placement. */
static void preset_config(const zo_model_config *m, const plan_train *ct, plan_train *x)
{
    plan_train_defaults(x, m);
    x->seq = ct->seq;
    x->micro_batch = ct->micro_batch;
    x->grad_accum = ct->grad_accum;
    x->dp = ct->dp;
    x->tp = ct->tp;
    x->pp = ct->pp;
    x->vpp = ct->vpp;
    x->sp = ct->sp;
    x->zero = ct->zero;
    x->recompute = ct->recompute;
    x->params_on = ct->params_on;
    x->grads_on = ct->grads_on;
    x->checkpoints_on = ct->checkpoints_on;
    memcpy(x->opt_frac, ct->opt_frac, sizeof x->opt_frac);
    x->buf.prefetch_depth = ct->buf.prefetch_depth;
    x->method = ct->method;
    x->lora = ct->lora;
    x->adapters_on = ct->adapters_on;
    x->schedule = ct->schedule;
    x->dpu_warmup = ct->dpu_warmup;
    x->opt_threads = ct->opt_threads;
    x->clip_stale = ct->clip_stale;
    /* the optimizer's state as the search's (issue 30) */
    x->optimizer = ct->optimizer;
    x->opt_state = ct->opt_state;
    x->master = ct->master;
    x->loss_chunk = ct->loss_chunk;
}

/* The largest preset of the shape's architecture, at most `n` parameters,
 * that fits with the plan `c` found for the strategy (NULL: none does).
 * Dense shapes take dense presets only (and a mixture of experts, mixtures):
 * a mixture's parameter count is not comparable to a dense shape's (a
 * token runs through top_k of its experts, so its activations and time
 * follow the active count), and Granite-MoE shares LLaMA's architecture. */
static const zo_model_preset *largest_preset(const zo_model_config *shape, const plan_candidate *c,
                                             uint64_t n, const plan_hw *hw, plan_train *t,
                                             plan_time *pt)
{
    size_t np;
    const zo_model_preset *p = zo_model_presets(&np), *best = NULL;
    uint64_t best_n = 0;
    plan_hw h = *hw;
    h.gpus = c->gpus;
    for (size_t i = 0; i < np; i++) {
        const zo_model_config *m = &p[i].cfg;
        uint64_t pn = zo_model_params(m);
        if (m->arch != shape->arch || (m->moe.experts > 0) != (shape->moe.experts > 0) || pn > n ||
            pn <= best_n)
            continue;
        plan_train x;
        plan_estimate e;
        plan_time tt;
        preset_config(m, &c->t, &x);
        if (plan_estimate_run(m, &h, &x, &e) != ZO_OK || !e.fits ||
            plan_time_run(m, &h, &x, &e, &tt) != ZO_OK)
            continue;
        best = &p[i];
        best_n = pn;
        *t = x;
        *pt = tt;
    }
    return best;
}

/* tokens/s: whole above 100, three digits below */
static const char *fmt_rate(double v, char *buf, size_t len)
{
    if (v >= 100) snprintf(buf, len, "%.0f", v);
    else snprintf(buf, len, "%.3g", v);
    return buf;
}

/* One strategy's row: the largest model, its step, the flags that place it,
 * and the largest preset that fits with the command that checks it; printed
 * when `print`, added to the JSON rows when rows is not NULL. */
static void print_max_model_row(plan_strategy strat, const zo_model_config *shape,
                                const plan_candidate *c, uint64_t n, const plan_hw *hw,
                                const plan_hw_basis *basis, cJSON *rows, int print)
{
    char cnt[32], shp[32], flags[256], hwflags[512], pre[96] = "none", rate[32], prate[32];
    snprintf(shp, sizeof shp, "%dx%d", shape->n_layers, shape->hidden);
    plan_train d, x;
    plan_time pt;
    plan_train_defaults(&d, shape);
    d.seq = c->t.seq;
    plan_train_flags(&d, &c->t, flags, sizeof flags);
    const zo_model_preset *p = largest_preset(shape, c, n, hw, &x, &pt);
    if (p)
        snprintf(pre, sizeof pre, "%s (%.3g s, %s)", p->name, pt.step,
                 fmt_rate(pt.tokens_per_s, prate, sizeof prate));
    cJSON *row = rows ? cJSON_CreateObject() : NULL;
    if (row) {
        cJSON_AddStringToObject(row, "strategy", plan_strategy_name(strat));
        cJSON_AddNumberToObject(row, "params", (double)n);
        cJSON_AddNumberToObject(row, "layers", shape->n_layers);
        cJSON_AddNumberToObject(row, "hidden", shape->hidden);
        cJSON_AddNumberToObject(row, "step_s", c->time.step);
        cJSON_AddNumberToObject(row, "tokens_per_s", c->time.tokens_per_s);
        cJSON_AddStringToObject(row, "flags", flags);
        cJSON_AddItemToArray(rows, row);
    }
    if (print) {
        printf("%-20s %8s  %-12s %9.3g s %9s  %s\n", plan_strategy_name(strat),
               zo_format_count(n, cnt, sizeof cnt), shp, c->time.step,
               fmt_rate(c->time.tokens_per_s, rate, sizeof rate), pre);
        printf("    flags: %s\n", flags[0] ? flags : "(the defaults)");
    }
    if (!p) {
        if (row) cJSON_AddNullToObject(row, "preset");
        return;
    }
    plan_train_defaults(&d, &p->cfg);
    d.seq = x.seq;
    plan_train_flags(&d, &x, flags, sizeof flags);
    plan_hw_basis_flags(basis, hwflags, sizeof hwflags);
    char check[1024];
    snprintf(check, sizeof check, "memplan estimate --model %s%s%s --seq %d%s%s", p->name,
             hwflags[0] ? " " : "", hwflags, x.seq, flags[0] ? " " : "", flags);
    if (print) printf("    check: %s\n", check);
    if (!row) return;
    cJSON *pr = cJSON_AddObjectToObject(row, "preset");
    cJSON_AddStringToObject(pr, "name", p->name);
    cJSON_AddNumberToObject(pr, "step_s", pt.step);
    cJSON_AddNumberToObject(pr, "tokens_per_s", pt.tokens_per_s);
    cJSON_AddStringToObject(pr, "check", check);
}

/* --strategy NAME: its index; -1 when not given. */
static zo_status parse_strategy(const char *name, int *only)
{
    *only = -1;
    if (!name) return ZO_OK;
    for (int i = 0; i < PLAN_STRATEGIES; i++)
        if (!strcasecmp(name, plan_strategy_name((plan_strategy)i))) *only = i;
    if (*only >= 0) return ZO_OK;
    return zo_error(ZO_ERR_INVALID, "--strategy: '%s' is not one of data-parallel, zero-1, zero-2, "
                                    "zero-3, 3d-parallel, zero-offload, zero-infinity-cpu, "
                                    "zero-infinity-nvme", name);
}

/* The table's head: the hardware, the family and the columns. */
static void print_head(const plan_hw *hw, const plan_hw_basis *basis, const char *family,
                       long seq, int max_seq, int one, plan_runtime runtime)
{
    plan_report_basis(stdout, hw, basis);
    plan_report_runtime_note(stdout, runtime);
    printf("\nlargest %s model on %d x %s (%.2f GiB CPU memory, %.2f TB NVMe per node), seq %d%s; "
           "micro-batch 1\n",
           family, hw->gpus, hw->gpu, (double)hw->cpu_mem / (1 << 30), hw->nvme / 1e12,
           seq ? (int)seq : max_seq, seq ? "" : " (the family's)");
    if (one)
        printf("one GPU: ZeRO-1/2/3 and 3-D parallelism shard nothing; data-parallel stands for "
               "them\n");
    printf("\n%-20s %8s  %-12s %11s %9s  %s\n", "strategy", "largest", "shape (LxH)", "step",
           "tokens/s", "largest preset that fits (step s, tokens/s)");
}

/* A strategy where nothing fits: its row, and a row of 0 parameters in the JSON. */
static void print_none(plan_strategy strat, cJSON *rows, int print)
{
    if (print) printf("%-20s %8s\n", plan_strategy_name(strat), "none fits");
    if (!rows) return;
    cJSON *row = cJSON_CreateObject();
    cJSON_AddStringToObject(row, "strategy", plan_strategy_name(strat));
    cJSON_AddNumberToObject(row, "params", 0);
    cJSON_AddItemToArray(rows, row);
}

/* The family (--family, --model's, or gpt), its shape at 1B parameters in
 * c->m, the machine, the strategy asked for (-1: every one) and the space. */
static zo_status max_model_setup(search_cmd *c, const char **family, int *only)
{
    const cli_flags *f = &c->f;
    zo_status st;
    *family = c->s.family;
    if (!*family && f->model) {
        if ((st = build_model(f->model, 0, &f->sf, f->seq, &c->m)) != ZO_OK) return st;
        *family = c->m.family;
    }
    if (!*family) *family = "gpt";
    if ((st = plan_family_shape(*family, 1e9, &c->m)) != ZO_OK ||
        (st = search_cmd_hw(c)) != ZO_OK || (st = parse_strategy(c->s.strategy, only)) != ZO_OK ||
        (st = search_cmd_space(c)) != ZO_OK)
        return st;
    c->space.base.seq = f->seq ? (int)f->seq : 0;
    return ZO_OK;
}

int cmd_max_model(int argc, char **argv)
{
    search_cmd c;
    int rc = search_cmd_parse(argc, argv, "max-model", usage_max_model, &c);
    if (rc != CLI_PARSED) return rc;
    if (c.s.method >= 0) {
        zo_error(ZO_ERR_INVALID, "--method is memplan plan's: max-model sizes full fine-tuning (--lora R for "
                 "adapters)");
        return fail();
    }
    const char *family;
    int only, json = c.f.json;
    if (max_model_setup(&c, &family, &only) != ZO_OK) return fail();
    /* --json / --json-out: the rows as JSON (docs/memplan-json.md) */
    cJSON *rows = json || c.f.json_out ? cJSON_CreateArray() : NULL;
    int one = c.hw.gpus == 1 && only < 0; /* on one GPU ZeRO and 3-D parallelism shard nothing */
    if (!json) print_head(&c.hw, &c.basis, family, c.f.seq, c.m.max_seq, one, c.space.base.runtime);
    for (int i = 0; i < PLAN_STRATEGIES; i++) {
        if (only >= 0 && i != only) continue;
        if (one && i >= PLAN_STRAT_ZERO1 && i <= PLAN_STRAT_3D) continue;
        zo_model_config shape;
        plan_candidate cand;
        uint64_t n;
        if (plan_max_model(family, &c.hw, &c.space, (plan_strategy)i, &shape, &cand, &n) != ZO_OK) {
            cJSON_Delete(rows);
            return fail();
        }
        if (n)
            print_max_model_row((plan_strategy)i, &shape, &cand, n, &c.hw, &c.basis, rows, !json);
        else print_none((plan_strategy)i, rows, !json);
    }
    if (rows && emit_json(rows, json, c.f.json_out) != ZO_OK) return fail();
    return 0;
}
