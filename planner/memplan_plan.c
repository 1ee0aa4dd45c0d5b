/* memplan plan: search every layout, ZeRO stage, recompute, micro-batch,
 * placement and optimizer schedule; print the best few and write the best
 * as a plan file (docs/memplan.md, "Search"). The search's flags are
 * max-model's too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/clock.h"
#include "common/units.h"
#include "planner/memplan_cli.h"
#include "planner/planfile.h"
#include "planner/report.h"

static const char usage_plan[] =
    "usage: memplan plan --model NAME|CONFIG.json [options]\n"
    "\n"
    "Search every DP x TP x PP layout, ZeRO stage, sequence parallelism, recompute,\n"
    "micro-batch, interleaving, placement of weights / gradients / optimizer state\n"
    "(fractions) / checkpoints across GPU, CPU and NVMe, prefetch depth, and the CPU\n"
    "optimizer's schedule (serial, overlap, dpu); keep what fits; rank by predicted step time.\n"
    "\n"
    "  --model, --params, --layers ... --arch   the model, as for 'memplan estimate' (--model:\n"
    "                          a preset, a config.json or a Hugging Face model folder)\n"
    "  --hw NAME|FILE          machine preset or calibrated profile (default h100-80gb)\n"
    "  --gpu NAME [--host NAME]  one GPU preset in a host (rtx-4090, l40s, ...; 'memplan hardware')\n"
    "  --hw cpu [--host NAME]  plan for train --device cpu (no CUDA context, cuBLAS workspace or\n"
    "                          allocator slack); --gpu-mem is train's --device-mem\n"
    "  --gpus N                GPUs in the job (default: the preset's)\n"
    "  --max-gpus N            also try fewer GPUs (powers of two and whole nodes up to N)\n"
    "  --gpus-per-node N, --gpu-mem SIZE, --cpu-mem SIZE, --nvme SIZE, --pcie LINK\n"
    "                          hardware overrides, named in the report's first lines\n"
    "  --seq N                 sequence length (default: the model's positions, at most 4096)\n"
    "  --global-batch N        sequences per step (default 8 x GPUs)\n"
    "  --dtype, --grad-dtype, --optim, --no-flash-attn, --attention, --dropout, --no-dropout   as for estimate\n"
    "  --optim-dtype auto      search the encodings of m and v too (fp32, bf16, 8bit), ranked by\n"
    "                          time with the rest; the report cites what each costs in accuracy\n"
    "  --lora R [--lora-targets LIST] [--lora-alpha A] [--qlora]   fine-tune adapters on a\n"
    "                          frozen base (LoRA, QLoRA), as for estimate; where the base and\n"
    "                          the adapters live is searched (--adapters-on fixes the adapters)\n"
    "  --method full|lora|qlora|auto   what is trained: auto ranks full fine-tuning, LoRA and\n"
    "                          QLoRA together (the adapters of --lora R, else rank 16 on every\n"
    "                          linear layer, as estimate's \"fits with\" list); default: full, or\n"
    "                          the method of --lora R [--qlora]\n"
    "  --schedule serial|overlap|dpu   fix the optimizer schedule (default: searched, each\n"
    "                          plan with the fastest); --clip-stale, --dpu-warmup N,\n"
    "                          --opt-threads N as for estimate\n"
    "  --objective time|memory|cost   rank by step time (default), GPU memory, or\n"
    "                          GPU-seconds per token\n"
    "  --zero S | --zero A-B   only these ZeRO stages      --tp N, --pp N, --ep N   fix a degree\n"
    "                          (EP, for a mixture of experts: searched over DP's divisors)\n"
    "  --capacity-factor F     a mixture of experts' capacity-limited routing, as for estimate\n"
    "                          (default 0: dropless)\n"
    "  --recompute none|selective|full|ops   fix recompute (full also tries the fewest\n"
    "                          layers of a stage that fit: Megatron's --recompute-num-layers)\n"
    "  --reduce-dtype fp32|bf16|fp16   the gradients' reduction (default fp32, the runtime's)\n"
    "  --runtime zoffload|eager   size for this runtime (default) or eager PyTorch\n"    "  --pp-schedule megatron|deepspeed   whose pipeline engine times the layouts with PP > 1\n"
    "                          (default megatron; deepspeed: its 2021 engine, no interleaving,\n"
    "                          as for estimate; not with --json or --json-out)\n"
    "  --no-offload            everything on the GPU       --no-nvme   nothing on NVMe\n"
    "  --max-micro-batch N     largest micro-batch tried (default 16)\n"
    "  --opt-steps N           optimizer GPU/CPU/NVMe split in 1/N steps (default 10)\n"
    "  --optimizer-min TIER=F[,TIER=F]   keep at least these shares of the optimizer\n"
    "                          state on these tiers (nvme=0.1: some of it on the disk)\n"
    "  --max-prefetch N        prefetch depths tried for streamed weights (default 3)\n"
    "  --cuda-context SIZE --cublas-workspace SIZE --fragmentation F --sub-group N\n"
    "                          working buffers, as for estimate\n"
    "  --top N                 plans printed (default 5)\n"
    "  --json                  the best as a plan file (docs/plan-format.md) on stdout, instead\n"
    "                          of the table\n"
    "  --json-out FILE         write the best as a plan file to FILE (train --plan FILE)\n"
    "                          A plan file holds only what train runs (data parallelism;\n"
    "                          docs/offload.md, \"What the runtime runs\"): flags outside that\n"
    "                          are refused (exit 2) with train's message\n"
    "  --svg FILE              a picture of the best plan\n"
    "\n"
    "exit status: 0 a plan fits, 1 nothing fits, 2 bad input\n";

static const struct option plan_opts[] = {
    SHARED_OPTIONS,
    {"max-gpus", required_argument, 0, OPT_MAX_GPUS},
    {"objective", required_argument, 0, OPT_OBJECTIVE},
    {"top", required_argument, 0, OPT_TOP},
    {"no-offload", no_argument, 0, OPT_NO_OFFLOAD},
    {"no-nvme", no_argument, 0, OPT_NO_NVME},
    {"max-micro-batch", required_argument, 0, OPT_MAX_MB},
    {"opt-steps", required_argument, 0, OPT_OPT_STEPS},
    {"optimizer-min", required_argument, 0, OPT_OPT_MIN},
    {"max-prefetch", required_argument, 0, OPT_MAX_PREFETCH},
    {"family", required_argument, 0, OPT_FAMILY},
    {"strategy", required_argument, 0, OPT_STRATEGY},
    {"method", required_argument, 0, OPT_METHOD},
    {"pp-schedule", required_argument, 0, OPT_PP_SCHEDULE},
    {"capacity-factor", required_argument, 0, OPT_CAPACITY},
    {0, 0, 0, 0},
};

/* --zero S or --zero A-B: the stages searched. */
static zo_status parse_zero_range(const char *arg, search_flags *s)
{
    long v;
    zo_status st;
    const char *dash = strchr(arg, '-');
    s->zero_set = 1;
    if (!dash) {
        st = zo_parse_int(arg, "--zero", 0, 3, &v);
        s->zmin = s->zmax = (int)v;
        return st;
    }
    char lo[16];
    snprintf(lo, sizeof lo, "%.*s", (int)(dash - arg), arg);
    st = zo_parse_int(lo, "--zero", 0, 3, &v);
    s->zmin = (int)v;
    if (!st) st = zo_parse_int(dash + 1, "--zero", s->zmin, 3, &v);
    s->zmax = (int)v;
    return st;
}

/* The search's own flags: 1 when `c` is one. */
static int search_flag(int c, const char *arg, void *own, zo_status *st)
{
    static const char *const objectives[] = {"time", "memory", "cost", NULL};
    /* (the order of zo_plan_method, then PLAN_METHOD_AUTO) */
    static const char *const methods[] = {"full", "lora", "qlora", "auto", NULL};
    search_flags *s = own;
    int obj = 0;
    switch (c) {
    case OPT_ZERO: *st = parse_zero_range(arg, s); return 1;
    case OPT_MAX_GPUS: *st = zo_parse_int(arg, "--max-gpus", 1, 1 << 16, &s->max_gpus); return 1;
    case OPT_OBJECTIVE:
        *st = zo_plan_name_parse(objectives, arg, "--objective", &obj);
        s->objective = (plan_objective)obj;
        return 1;
    case OPT_TOP: *st = zo_parse_int(arg, "--top", 1, PLAN_TOP_MAX, &s->top); return 1;
    case OPT_NO_OFFLOAD: s->no_offload = 1; return 1;
    case OPT_NO_NVME: s->no_nvme = 1; return 1;
    case OPT_MAX_MB: *st = zo_parse_int(arg, "--max-micro-batch", 1, 1 << 16, &s->max_mb); return 1;
    case OPT_OPT_STEPS:
        *st = zo_parse_int(arg, "--opt-steps", 1, PLAN_OPT_STEPS_MAX, &s->opt_steps);
        return 1;
    case OPT_OPT_MIN: *st = zo_plan_fractions_parse(arg, "--optimizer-min", 0, s->opt_min); return 1;
    case OPT_MAX_PREFETCH:
        *st = zo_plan_flag_int(arg, "--max-prefetch", "buffers.prefetch_depth", &s->max_prefetch);
        return 1;
    case OPT_FAMILY: s->family = arg; return 1;
    case OPT_METHOD: *st = zo_plan_name_parse(methods, arg, "--method", &s->method); return 1;
    case OPT_PP_SCHEDULE: *st = plan_pp_schedule_parse(arg, "--pp-schedule", &s->pp_schedule); return 1;
    case OPT_STRATEGY: s->strategy = arg; return 1;
    case OPT_CAPACITY:
        *st = zo_plan_flag_double(arg, "--capacity-factor", "parallel.capacity_factor", &s->capacity_factor);
        return 1;
    default: return 0;
    }
}

int search_cmd_parse(int argc, char **argv, const char *name, const char *usage, search_cmd *c)
{
    const cli_command cmd = {name, usage, plan_opts, 1 << 20, 0, search_flag};
    memset(&c->s, 0, sizeof c->s);
    c->s.top = 5;
    c->s.method = -1;
    return cli_parse(&cmd, argc, argv, &c->f, &c->s);
}

zo_status search_cmd_hw(search_cmd *c)
{
    zo_status st = build_hw(&c->f.hwf, &c->hw, &c->basis);
    if (st) return st;
    if (c->s.max_gpus) c->hw.gpus = (int)c->s.max_gpus;
    else if (c->f.gpus) c->hw.gpus = (int)c->f.gpus;
    gpu_node_size(&c->f.hwf, &c->basis, &c->hw);
    return ZO_OK;
}

/* --method: the methods searched, and the adapters of LoRA and QLoRA
 * (--lora R's, else estimate's suggestion: rank 16 on every linear layer). */
static zo_status search_methods(const cli_flags *f, int method, plan_space *out)
{
    const method_flags *mf = &f->mf;
    if (method < 0) return ZO_OK; /* the method of --lora / --qlora, else full */
    if (method == ZO_PLAN_FULL && mf->lora_r)
        return zo_error(ZO_ERR_INVALID, "--method full trains every weight: leave out --lora (or --method lora)");
    if (mf->qlora && method != ZO_PLAN_QLORA)
        return zo_error(ZO_ERR_INVALID, "--qlora with --method %s: --method qlora says it",
                        method == ZO_PLAN_LORA ? "lora" : method == ZO_PLAN_FULL ? "full" : "auto");
    /* (--lora-targets, --lora-alpha and --adapters-on need --lora R) */
    if (method != ZO_PLAN_FULL && !mf->lora_r)
        out->base.lora = (zo_lora_config){PLAN_METHOD_LORA_R, PLAN_LORA_DEFAULT_ALPHA, ZO_LORA_ALL_LINEAR};
    out->methods = method == PLAN_METHOD_AUTO ? 1u << ZO_PLAN_FULL | 1u << ZO_PLAN_LORA | 1u << ZO_PLAN_QLORA
                                              : 1u << method;
    out->base.method = method == PLAN_METHOD_AUTO ? ZO_PLAN_FULL : (zo_plan_method)method;
    return ZO_OK;
}

zo_status search_cmd_space(search_cmd *c)
{
    const cli_flags *f = &c->f;
    const search_flags *s = &c->s;
    plan_space *out = &c->space;
    plan_space_defaults(out, &c->m, &c->hw);
    if (s->max_gpus) out->max_gpus = (int)s->max_gpus;
    if (f->global_batch) out->global_batch = (int)f->global_batch;
    apply_train_flags(f, &out->base);
    if (s->zero_set) {
        out->zero_min = s->zmin;
        out->zero_max = s->zmax;
    }
    out->tp = (int)f->tp;
    out->pp = (int)f->pp;
    out->ep = (int)f->ep;
    out->base.capacity_factor = s->capacity_factor; /* (checked with the base: experts, range) */
    out->recompute = f->recompute;
    if (s->no_offload) out->allow_offload = 0;
    if (s->no_nvme) out->allow_nvme = 0;
    if (s->max_mb) out->max_micro_batch = (int)s->max_mb;
    if (s->opt_steps) out->opt_steps = (int)s->opt_steps;
    memcpy(out->opt_min, s->opt_min, sizeof out->opt_min);
    if (s->max_prefetch) out->max_prefetch = (int)s->max_prefetch;
    out->objective = s->objective;
    apply_buffer_flags(f, &out->base.buf);
    out->schedule = f->mf.schedule; /* searched unless given */
    /* a plan file is for the runtime: only what it runs */
    out->runtime_plans = f->json || f->json_out;
    /* layouts with PP > 1 timed with this engine's schedule (the others have none) */
    out->pp_schedule = s->pp_schedule;
    if (s->pp_schedule == PLAN_PP_DEEPSPEED && out->runtime_plans)
        return zo_error(ZO_ERR_INVALID, "--pp-schedule deepspeed: a plan file is for this project's runtime, "
                                        "which runs no pipeline (drop %s)", f->json_out ? "--json-out" : "--json");
    out->adapters_on = f->mf.adapters_on;
    /* --optim-dtype auto: every encoding of m and v, ranked with the rest */
    if (f->opt_state == PLAN_STATE_AUTO) out->opt_states = (1u << ZO_PLAN_STATES) - 1;
    zo_status st = apply_method_flags(&f->mf, &out->base);
    return st ? st : search_methods(f, s->method, out);
}

/* ---- memplan plan ------------------------------------------------------------------------ */

static void print_plan_line(const plan_candidate *c, const char *lead)
{
    const plan_train *t = &c->t;
    char fr[64];
    plan_format_fractions(t->opt_frac, fr, sizeof fr);
    char ep[24] = "";
    if (t->ep > 1) snprintf(ep, sizeof ep, " (EP %d)", t->ep);
    char rc[48];
    plan_recompute_words(t, rc, sizeof rc);
    char mw[96];
    printf("%s%s\n", lead, plan_method_words(t, mw, sizeof mw));
    printf("%s%d GPU%s: DP %d%s x TP %d%s x PP %d%s, ZeRO-%d, micro-batch %d x %d, recompute %s\n",
           lead, c->gpus, c->gpus == 1 ? "" : "s", t->dp, ep, t->tp, t->sp ? " (+SP)" : "", t->pp,
           t->vpp > 1 ? " (interleaved)" : "", t->zero, t->micro_batch, t->grad_accum, rc);
    char ad[32] = "";
    if (t->method != ZO_PLAN_FULL)
        snprintf(ad, sizeof ad, ", adapters on %s", zo_plan_tier_name(t->adapters_on));
    if (t->opt_state != ZO_PLAN_STATE_FP32 || t->master != ZO_PLAN_MASTER_FP32)
        printf("%sAdamW state: %s m, v, master %s (%.4g B/param)\n", lead,
               zo_plan_opt_state_name(t->opt_state), zo_plan_master_name(t->master),
               plan_opt_bytes_per_param(t));
    printf("%s%s on %s%s, gradients on %s, optimizer on %s, checkpoints on %s, prefetch %d, "
           "optimizer schedule %s\n",
           lead, t->method == ZO_PLAN_FULL ? "weights" : "frozen base",
           zo_plan_tier_name(t->params_on), ad, zo_plan_tier_name(t->grads_on), fr,
           zo_plan_tier_name(t->checkpoints_on), t->buf.prefetch_depth,
           zo_plan_schedule_name(t->schedule));
    printf("%sper rank: GPU %.1f GiB, CPU %.1f GiB, NVMe %.1f GiB\n", lead,
           (double)c->total[ZO_PLAN_GPU] / (1 << 30), (double)c->total[ZO_PLAN_CPU] / (1 << 30),
           (double)c->total[ZO_PLAN_NVME] / (1 << 30));
}

/* When the state's encoding was not given (no --optim-dtype, --optim
 * adamw) and the best plan is full fine-tuning with 32-bit m and v, or
 * nothing fits: the search again over every encoding (--optim-dtype
 * auto), and a line naming its best when it is PLAN_STATE_HINT times
 * faster or fits where nothing did. LLaMA-2-13B on one 80 GB GPU with
 * 113 GiB of host memory and a 0.8 GB/s disk: the 32-bit state's disk
 * share makes the best 143.6 s a step, 8-bit m and v fit without the disk
 * at 2.7 s; a user should not have to know to ask. The line is not a
 * choice: the encoding changes the training's numbers (its accuracy note
 * says how), so the plan stays the 32-bit one. Empty otherwise. */
static void state_hint(const search_cmd *c, const plan_result *r, char *out, size_t len)
{
    out[0] = 0;
    if (c->f.opt_state >= 0 || c->space.opt_states || c->f.optim != ZO_PLAN_ADAMW) return;
    const plan_candidate *b = r->n_best ? &r->best[0] : NULL;
    if (b && (b->t.method != ZO_PLAN_FULL || b->t.opt_state != ZO_PLAN_STATE_FP32)) return;
    if (!b && c->space.base.method != ZO_PLAN_FULL) return;
    plan_space any = c->space;
    /* the 32-bit state was the search's own: only the others (a third less
     * searching; the line needs one of them to beat the 32-bit best) */
    any.opt_states = ((1u << ZO_PLAN_STATES) - 1) & ~(1u << ZO_PLAN_STATE_FP32);
    /* the line needs a.step <= b.step / PLAN_STATE_HINT: the search skips the
     * layouts that cannot (plan_space.max_step), and its best is then the
     * uncapped search's where that one's is within the cap, and steps more
     * than the cap where that one's does. The other objectives rank by more
     * than the step: no cap. */
    if (b && any.objective == PLAN_OBJ_TIME) any.max_step = b->time.step / PLAN_STATE_HINT;
    plan_result *q = malloc(sizeof *q);
    if (!q) return;
    if (plan_search(&c->m, &c->hw, &any, 1, q) == ZO_OK && q->n_best > 0) {
        const plan_candidate *a = &q->best[0];
        const plan_train *t = &a->t;
        if (t->opt_state != ZO_PLAN_STATE_FP32 && (!b || a->time.step * PLAN_STATE_HINT <= b->time.step)) {
            char gain[64] = "where the 32-bit state fits nowhere";
            if (b) snprintf(gain, sizeof gain, "%.3g times less", b->time.step / a->time.step);
            snprintf(out, len,
                     "(AdamW's m and v in 32 bits; --optim-dtype %s (%.4g B/param with the %s master) takes "
                     "%.4g s per step, %s: GPU %.1f GiB, CPU %.1f GiB, NVMe %.1f GiB a rank; its accuracy: %s)",
                     zo_plan_opt_state_name(t->opt_state), plan_opt_bytes_per_param(t),
                     zo_plan_master_name(t->master), a->time.step, gain,
                     (double)a->total[ZO_PLAN_GPU] / (1 << 30), (double)a->total[ZO_PLAN_CPU] / (1 << 30),
                     (double)a->total[ZO_PLAN_NVME] / (1 << 30), plan_opt_accuracy_note(t));
        }
    }
    free(q);
}

/* What was searched, and the best plans: the first in full with why each
 * kind of state is where it is, the others as their differences from it;
 * `hint` (state_hint's line, or empty) after the search's counts.
 * `tab` is stdout, or nowhere with --json (whose stdout is the plan alone). */
static void print_search(FILE *tab, int json, const zo_model_config *m, const plan_hw *hw,
                         const plan_space *s, const plan_result *r, double dt, const char *hint)
{
    static const char *obj[] = {"step time", "GPU memory", "GPU-seconds per token"};
    char cnt[32];
    fprintf(tab, "%s (%s params%s%s) on %s: %s%d x %s; seq %d%s, global batch %d; ranked by %s\n",
            m->name, zo_format_count(zo_model_params(m), cnt, sizeof cnt), m->mm_text ? ", " : "",
            m->mm_text ? ZO_MM_TEXT_NOTE : "", hw->name,
            s->max_gpus ? "up to " : "", hw->gpus, hw->gpu, s->base.seq,
            s->base.seq_is_default ? " (default: the model's positions, at most 4096)" : "",
            s->global_batch, obj[s->objective]);
    fprintf(tab, "searched %llu configurations (%llu fit) in %.2f s: %.3g configurations/s",
            (unsigned long long)r->configs, (unsigned long long)r->feasible, dt,
            dt > 0 ? (double)r->configs / dt : 0.0);
    /* (the step-time and cost searches' bound: the layouts whose configurations they did not search) */
    if (s->objective != PLAN_OBJ_MEMORY)
        fprintf(tab, "; %llu of %llu layouts skipped by the step bound", (unsigned long long)r->skipped,
                (unsigned long long)r->layouts);
    fprintf(tab, "\n");
    if (!s->methods && s->base.method == ZO_PLAN_FULL)
        fprintf(tab, "(full fine-tuning of every weight: --method auto ranks LoRA and QLoRA adapters too)\n");
    if (s->runtime_plans)
        fprintf(tab, "(a plan file for train: only what the runtime runs, data parallelism on any number "
                     "of ranks (docs/offload.md, \"What the runtime runs\"))\n");
    if (hint[0]) fprintf(r->n_best ? tab : json ? stderr : tab, "%s\n", hint);
    if (r->n_best == 0) {
        fprintf(json ? stderr : tab, "\nnothing fits: more GPUs (--gpus / --max-gpus), a shorter "
                "--seq or a smaller --global-batch%s\n",
                s->allow_offload ? "" : ", or allow offload (drop --no-offload)");
        return;
    }
    const plan_candidate *b = &r->best[0];
    fprintf(tab, "\nbest: %.4g s per step, %.4g tokens/s, MFU %.1f%%\n", b->time.step,
            b->time.tokens_per_s, 100 * b->time.mfu);
    if (!json) {
        print_plan_line(b, "  ");
        plan_hw h = *hw;
        h.gpus = b->gpus;
        plan_estimate e;
        if (plan_estimate_run(m, &h, &b->t, &e) == ZO_OK) plan_report_runtime(tab, m, &e, &b->t);
    }
    char why[2048];
    plan_explain(m, hw, b, why, sizeof why);
    for (char *sv = NULL, *line = strtok_r(why, "\n", &sv); line; line = strtok_r(NULL, "\n", &sv))
        fprintf(tab, "  - %s\n", line);
    plan_report_time_table(tab, &b->time);
    for (int i = 1; i < r->n_best; i++) {
        char d[1024];
        plan_describe_diff(b, &r->best[i], d, sizeof d);
        fprintf(tab, "\n%d. %.4g s per step: %s\n", i + 1, r->best[i].time.step, d);
    }
}

/* The best plan as a plan file (--json, --json-out) and a picture (--svg). */
static zo_status write_best(const cli_flags *f, const zo_model_config *m, const plan_hw *hw,
                            const plan_candidate *b)
{
    zo_status st;
    plan_hw h = *hw;
    h.gpus = b->gpus;
    plan_estimate e;
    plan_time pt;
    if ((st = plan_estimate_run(m, &h, &b->t, &e)) != ZO_OK ||
        (st = plan_time_run(m, &h, &b->t, &e, &pt)) != ZO_OK)
        return st;
    if (f->json_out || f->json) {
        cJSON *doc;
        const char *what = f->json_out ? f->json_out : "the plan";
        if ((st = plan_file_json(m, &h, &b->t, &e, &pt, what, &doc)) != ZO_OK ||
            (st = emit_json(doc, f->json, f->json_out)) != ZO_OK)
            return st;
        if (f->json_out && !f->json)
            printf("\nplan written to %s (memplan estimate --plan %s; train --plan %s)\n",
                   f->json_out, f->json_out, f->json_out);
    }
    return f->svg_path ? write_svg(f->svg_path, m, &h, &b->t, &e, &pt) : ZO_OK;
}

/* A plan file for train whose fixed flags are outside the capability table
 * (--tp 2, --zero 1 --adapters-on cpu on several GPUs, --schedule dpu with
 * --optimizer-min gpu=F): the table's refusal, the words train prints
 * (ZO_ERR_UNSUPPORTED). Checked before the search, as the flags give it. */
static zo_status refuse_fixed(const search_cmd *c)
{
    const plan_space *s = &c->space;
    zo_run_shape run;
    zo_run_shape_defaults(&run);
    run.method = s->base.method;
    run.ranks = s->max_gpus ? 1 : c->hw.gpus; /* (--max-gpus: fewer ranks may run it) */
    run.zero = s->zero_min == s->zero_max ? s->zero_min : 0;
    run.tp = s->tp > 1 ? s->tp : 1;
    run.pp = s->pp > 1 ? s->pp : 1;
    run.ep = s->ep > 1 ? s->ep : 1;
    run.moe = c->m.moe.experts > 0;
    if (s->schedule >= 0) run.schedule = (zo_plan_schedule)s->schedule;
    if (s->adapters_on >= 0 && run.method != ZO_PLAN_FULL) run.adapters = (zo_plan_tier)s->adapters_on;
    if (s->opt_min[ZO_PLAN_GPU] > 0) {
        run.optimizer[ZO_PLAN_GPU] = s->opt_min[ZO_PLAN_GPU];
        run.optimizer[ZO_PLAN_CPU] = 1 - s->opt_min[ZO_PLAN_GPU];
    }
    /* what the runtime runs of this model (gpt-oss: dropless): a capacity
     * fixed outside it */
    const char *gap = zo_model_run_gap(&c->m, s->base.capacity_factor);
    if (gap)
        return zo_error(ZO_ERR_UNSUPPORTED, "plan: model %s: the runtime routes it dropless; --capacity-factor as "
                        "asked is not (field \"%s\"; memplan plan without it, or memplan estimate to size it)",
                        c->m.name, gap);
    return zo_capability_check(&run, NULL, 0);
}

/* Nothing train runs fits: when the search without the table finds a plan,
 * its refusal in the table's words (a full fine-tuning that fits only with
 * the weights off the GPU at --zero 1, ...); ZO_OK otherwise ("nothing
 * fits" stands). */
static zo_status refuse_outside_table(const search_cmd *c)
{
    plan_space any = c->space;
    any.runtime_plans = 0;
    plan_result *r = malloc(sizeof *r);
    if (!r) return zo_error(ZO_ERR_NOMEM, "plan: the search's results");
    zo_status st = plan_search(&c->m, &c->hw, &any, 1, r);
    if (st == ZO_OK && r->n_best > 0) {
        zo_run_shape run;
        plan_run_shape(&c->m, &r->best[0].t, &run);
        st = zo_capability_check(&run, NULL, 0);
    }
    free(r);
    return st;
}

/* The search tried no configuration at all: the layout flags rule out
 * every one (issue 27: `--gpus 2 --tp 2` on a preset of one GPU a node
 * printed "searched 0 configurations" and "nothing fits: more GPUs").
 * The first flag that does, named, as the search's own rules (walk_gpus):
 * TP within a node dividing the GPUs and the heads, PP dividing the layers
 * and the GPUs TP leaves, the global batch a multiple of DP. */
static zo_status refuse_unsearchable(const search_cmd *c)
{
    const plan_space *s = &c->space;
    const plan_hw *hw = &c->hw;
    const zo_model_config *m = &c->m;
    int gpus = s->max_gpus > 0 ? s->max_gpus : s->gpus, tp = s->tp > 0 ? s->tp : 1, pp = s->pp > 0 ? s->pp : 1;
    int L = m->params_override ? 1 : m->n_layers;
    if (s->tp > 1 && s->tp > hw->gpus_per_node)
        return zo_error(ZO_ERR_INVALID,
                        "--tp %d: tensor parallelism runs within a node, and %s has %d GPU%s a node (give "
                        "--gpus-per-node N, or --tp at most %d)",
                        s->tp, hw->name, hw->gpus_per_node, hw->gpus_per_node == 1 ? "" : "s", hw->gpus_per_node);
    if (s->tp > 1 && gpus % s->tp)
        return zo_error(ZO_ERR_INVALID, "--tp %d does not divide the %d GPUs (--gpus)", s->tp, gpus);
    if (s->tp > 1 && (m->params_override || m->n_heads % s->tp || m->n_kv_heads % s->tp))
        return zo_error(ZO_ERR_INVALID, "--tp %d does not divide %s's attention heads (%d, %d key/value)", s->tp,
                        m->name, m->n_heads, m->n_kv_heads);
    if (s->pp > 1 && (gpus / tp) % s->pp)
        return zo_error(ZO_ERR_INVALID, "--pp %d does not divide the %d GPUs left by --tp %d (--gpus %d)", s->pp,
                        gpus / tp, tp, gpus);
    if (s->pp > 1 && L % s->pp)
        return zo_error(ZO_ERR_INVALID, "--pp %d does not divide %s's %d layers", s->pp, m->name, L);
    if (s->tp > 0 && s->pp > 0 && s->global_batch % (gpus / (tp * pp)))
        return zo_error(ZO_ERR_INVALID, "--global-batch %d is not a multiple of the %d data-parallel ranks "
                        "(--gpus %d / --tp %d / --pp %d)", s->global_batch, gpus / (tp * pp), gpus, tp, pp);
    return ZO_OK;
}

int cmd_plan(int argc, char **argv)
{
    search_cmd c;
    int rc = search_cmd_parse(argc, argv, "plan", usage_plan, &c);
    if (rc != CLI_PARSED) return rc;
    const cli_flags *f = &c.f;
    if (build_model(f->model, f->params_n, &f->sf, f->seq, &c.m) != ZO_OK ||
        search_cmd_hw(&c) != ZO_OK || search_cmd_space(&c) != ZO_OK)
        return fail();
    if (c.space.runtime_plans && refuse_fixed(&c) != ZO_OK) return fail();
    plan_result r;
    double t0 = zo_now();
    if (plan_search(&c.m, &c.hw, &c.space, (int)c.s.top, &r) != ZO_OK) return fail();
    double dt = zo_now() - t0;
    if (r.configs == 0 && refuse_unsearchable(&c) != ZO_OK) return fail();
    if (r.n_best == 0 && c.space.runtime_plans && refuse_outside_table(&c) != ZO_OK) return fail();
    /* --json: stdout holds the plan alone */
    FILE *tab = f->json ? fopen("/dev/null", "w") : stdout;
    if (!tab) tab = stderr;
    plan_report_basis(tab, &c.hw, &c.basis);
    char hint[1024];
    state_hint(&c, &r, hint, sizeof hint);
    print_search(tab, f->json, &c.m, &c.hw, &c.space, &r, dt, hint);
    if (tab != stdout && tab != stderr) fclose(tab);
    if (r.n_best == 0) return EXIT_NOFIT;
    if ((f->json_out || f->json || f->svg_path) && write_best(f, &c.m, &c.hw, &r.best[0]) != ZO_OK)
        return fail();
    return 0;
}
