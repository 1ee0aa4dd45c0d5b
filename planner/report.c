#include "report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/plan_schema.h" /* defines: zo_plan_model_write_json */
#include "common/units.h"

void plan_format_fractions(const double f[ZO_PLAN_TIERS], char *buf, size_t len)
{
    int nonzero = 0, only = 0;
    for (int i = 0; i < ZO_PLAN_TIERS; i++)
        if (f[i] > 0) {
            nonzero++;
            only = i;
        }
    if (nonzero == 1) {
        snprintf(buf, len, "%s", zo_plan_tier_name((zo_plan_tier)only));
        return;
    }
    buf[0] = '\0';
    for (int i = 0, first = 1; i < ZO_PLAN_TIERS; i++) {
        if (f[i] <= 0) continue;
        size_t u = strlen(buf);
        snprintf(buf + u, len - u, "%s%s=%g", first ? "" : ",", zo_plan_tier_name((zo_plan_tier)i), f[i]);
        first = 0;
    }
}

void plan_json_add_placement(cJSON *parent, const plan_train *t)
{
    cJSON *jp = cJSON_AddObjectToObject(parent, "placement");
    cJSON_AddStringToObject(jp, "params", zo_plan_tier_name(t->params_on));
    cJSON_AddStringToObject(jp, "grads", zo_plan_tier_name(t->grads_on));
    cJSON *jo = cJSON_AddObjectToObject(jp, "optimizer");
    for (int i = 0; i < ZO_PLAN_TIERS; i++)
        cJSON_AddNumberToObject(jo, zo_plan_tier_name((zo_plan_tier)i), t->opt_frac[i]);
    cJSON_AddStringToObject(jp, "checkpoints", zo_plan_tier_name(t->checkpoints_on));
    cJSON_AddStringToObject(jp, "adapters", zo_plan_tier_name(t->adapters_on));
}

static void add_u64(cJSON *o, const char *k, uint64_t v) { cJSON_AddNumberToObject(o, k, (double)v); }

/* The plan's model object, and what a token of an MoE model uses. */
cJSON *plan_json_model(const zo_model_config *m)
{
    cJSON *jm = zo_plan_model_write_json(m);
    if (jm && m->moe.experts) {
        zo_param_counts pc;
        zo_model_param_counts(m, &pc);
        add_u64(jm, "active_params", pc.active);
    }
    return jm;
}

cJSON *plan_report_time_json(const plan_time *pt)
{
    cJSON *jt = cJSON_CreateObject();
    if (!jt) return NULL;
    cJSON_AddNumberToObject(jt, "step_s", pt->step);
    cJSON_AddNumberToObject(jt, "tokens_per_s", pt->tokens_per_s);
    cJSON_AddNumberToObject(jt, "mfu", pt->mfu);
    cJSON_AddNumberToObject(jt, "hfu", pt->hfu);
    cJSON_AddNumberToObject(jt, "model_flops", pt->model_flops);
    cJSON_AddNumberToObject(jt, "hw_flops", pt->hw_flops);
    cJSON *parts = cJSON_AddObjectToObject(jt, "parts");
    for (int i = 0; i < PLAN_TIME_PARTS; i++)
        cJSON_AddNumberToObject(parts, plan_time_part_name(i), plan_time_part(pt, i));
    cJSON *tot = cJSON_AddObjectToObject(jt, "before_overlap");
    cJSON_AddNumberToObject(tot, "cpu_adam", pt->cpu_adam_total);
    cJSON_AddNumberToObject(tot, "dp_comm", pt->dp_comm_total);
    cJSON_AddNumberToObject(tot, "h2d", pt->h2d_total);
    cJSON_AddNumberToObject(tot, "d2h", pt->d2h_total);
    cJSON_AddNumberToObject(tot, "nvme", pt->nvme_total);
    cJSON *js = cJSON_AddObjectToObject(jt, "schedule");
    cJSON_AddStringToObject(js, "name", zo_plan_schedule_name(pt->schedule));
    cJSON_AddNumberToObject(js, "serial_step_s", pt->serial_step);
    cJSON_AddNumberToObject(js, "optimizer_s", pt->opt_s);
    cJSON_AddNumberToObject(js, "overlapped_s", pt->opt_hidden);
    cJSON_AddNumberToObject(js, "exposed_s", pt->opt_exposed);
    cJSON_AddStringToObject(js, "bound", plan_bound_name(pt->bound));
    cJSON_AddNumberToObject(js, "opt_threads", pt->opt_threads);
    cJSON_AddNumberToObject(js, "cpu_adam_rate", pt->cpu_adam_rate);
    cJSON_AddNumberToObject(js, "dpu_warmup", pt->dpu_warmup);
    cJSON_AddBoolToObject(js, "clip_stale", pt->clip_stale);
    cJSON *jl = cJSON_AddObjectToObject(jt, "microbatch");
    cJSON_AddNumberToObject(jl, "stage_s", pt->mb.total);
    cJSON_AddNumberToObject(jl, "layer_forward_s", pt->mb.layer_fwd);
    cJSON_AddNumberToObject(jl, "layer_backward_s", pt->mb.layer_bwd);
    return jt;
}

/* "fits_with" (the fastest alternative's flags) and "suggestions", ranked. */
static void add_suggestions(cJSON *root, const plan_suggestions *sg)
{
    if (!sg || sg->n == 0) return;
    cJSON_AddStringToObject(root, "fits_with", sg->alt[0].flags);
    cJSON *arr = cJSON_AddArrayToObject(root, "suggestions");
    for (int i = 0; i < sg->n; i++) {
        const plan_alternative *a = &sg->alt[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "kind", plan_alt_kind_name(a->kind));
        cJSON_AddStringToObject(o, "flags", a->flags);
        cJSON_AddStringToObject(o, "what", a->what);
        cJSON_AddNumberToObject(o, "step_s", a->time.step);
        cJSON_AddNumberToObject(o, "tokens_per_s", a->time.tokens_per_s);
        cJSON_AddNumberToObject(o, "mfu", a->time.mfu);
        cJSON *pr = cJSON_AddObjectToObject(o, "per_rank");
        for (int tier = 0; tier < ZO_PLAN_TIERS; tier++)
            add_u64(pr, zo_plan_tier_name((zo_plan_tier)tier), a->total[tier]);
        cJSON_AddItemToArray(arr, o);
    }
}

/* The verdict's alternatives, fastest first, tokens/s beside each. */
static void print_suggestions(FILE *out, const plan_suggestions *sg)
{
    fprintf(out, "         fits with: any of these, fastest first (add the flags to the command):\n");
    for (int i = 0; i < sg->n; i++) {
        const plan_alternative *a = &sg->alt[i];
        fprintf(out, "         %2d. %9.3f s/step %10.4g tokens/s  %s\n", i + 1, a->time.step,
                a->time.tokens_per_s, a->flags);
        fprintf(out, "             (%s; per rank GPU %.1f, CPU %.1f, NVMe %.1f GiB)\n", a->what,
                (double)a->total[ZO_PLAN_GPU] / (1 << 30), (double)a->total[ZO_PLAN_CPU] / (1 << 30),
                (double)a->total[ZO_PLAN_NVME] / (1 << 30));
    }
}

cJSON *plan_report_json(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                        const plan_estimate *e, const plan_time *pt, const plan_suggestions *sg)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "model", plan_json_model(m));

    cJSON *jh = cJSON_AddObjectToObject(root, "hardware");
    cJSON_AddStringToObject(jh, "name", hw->name);
    cJSON_AddStringToObject(jh, "gpu", hw->gpu);
    cJSON_AddNumberToObject(jh, "gpus", hw->gpus);
    cJSON_AddNumberToObject(jh, "gpus_per_node", hw->gpus_per_node);
    add_u64(jh, "gpu_mem", hw->gpu_mem);
    add_u64(jh, "cpu_mem_per_node", hw->cpu_mem);
    add_u64(jh, "nvme_per_node", hw->nvme);

    cJSON *jc = cJSON_AddObjectToObject(root, "config");
    cJSON_AddNumberToObject(jc, "seq", t->seq);
    cJSON_AddBoolToObject(jc, "seq_is_default", t->seq_is_default);
    cJSON_AddNumberToObject(jc, "micro_batch", t->micro_batch);
    cJSON_AddNumberToObject(jc, "grad_accum", t->grad_accum);
    cJSON_AddNumberToObject(jc, "global_batch", (double)t->micro_batch * t->grad_accum * t->dp);
    cJSON_AddStringToObject(jc, "dtype", zo_dtype_name(t->dtype));
    cJSON_AddStringToObject(jc, "grad_dtype", zo_dtype_name(t->grad_dtype));
    cJSON_AddStringToObject(jc, "optimizer", t->optimizer == ZO_PLAN_ADAMW ? "adamw" : "sgd");
    cJSON_AddNumberToObject(jc, "dp", t->dp);
    cJSON_AddNumberToObject(jc, "tp", t->tp);
    cJSON_AddNumberToObject(jc, "pp", t->pp);
    cJSON_AddNumberToObject(jc, "vpp", t->vpp);
    cJSON_AddNumberToObject(jc, "ep", t->ep);
    cJSON_AddNumberToObject(jc, "capacity_factor", t->capacity_factor);
    cJSON_AddBoolToObject(jc, "sp", t->sp);
    cJSON_AddNumberToObject(jc, "zero", t->zero);
    cJSON_AddStringToObject(jc, "recompute", zo_plan_recompute_name(t->recompute));
    cJSON_AddBoolToObject(jc, "flash_attn", t->flash_attn);
    cJSON_AddBoolToObject(jc, "dropout", t->dropout);
    cJSON_AddStringToObject(jc, "schedule", t->vpp > 1 ? "interleaved-1f1b" : "1f1b");
    cJSON_AddStringToObject(jc, "method", zo_plan_method_name(t->method));
    if (t->method != ZO_PLAN_FULL) {
        char tg[64];
        cJSON *jl = cJSON_AddObjectToObject(jc, "lora");
        cJSON_AddNumberToObject(jl, "r", t->lora.r);
        cJSON_AddNumberToObject(jl, "alpha", t->lora.alpha);
        cJSON_AddStringToObject(jl, "targets", zo_lora_targets_str(t->lora.targets, tg, sizeof tg));
    }
    cJSON_AddStringToObject(jc, "optimizer_schedule", zo_plan_schedule_name(t->schedule));
    cJSON_AddNumberToObject(jc, "dpu_warmup", t->dpu_warmup);
    cJSON_AddNumberToObject(jc, "opt_threads", t->opt_threads);
    cJSON_AddBoolToObject(jc, "clip_stale", t->clip_stale);
    plan_json_add_placement(jc, t);
    /* the split as the runtime makes it (the GPU's share in whole blocks) */
    cJSON *jo = cJSON_AddObjectToObject(cJSON_GetObjectItem(jc, "placement"), "optimizer_blocks");
    for (int i = 0; i < ZO_PLAN_TIERS; i++)
        cJSON_AddNumberToObject(jo, zo_plan_tier_name((zo_plan_tier)i), e->opt_share[i]);
    cJSON *jb = cJSON_AddObjectToObject(jc, "buffers");
    add_u64(jb, "cuda_context", t->buf.cuda_context);
    add_u64(jb, "cublas_workspace", t->buf.cublas_workspace);
    add_u64(jb, "comm_bucket_elems", t->buf.comm_bucket);
    cJSON_AddNumberToObject(jb, "comm_buckets", t->buf.comm_buckets);
    cJSON_AddNumberToObject(jb, "prefetch_depth", t->buf.prefetch_depth);
    add_u64(jb, "pinned_staging", t->buf.pinned_staging);
    cJSON_AddNumberToObject(jb, "fragmentation", t->buf.fragmentation);
    add_u64(jb, "sub_group", t->buf.sub_group);
    cJSON_AddNumberToObject(jb, "swap_buffers", t->buf.swap_buffers);

    cJSON *jr = cJSON_AddObjectToObject(root, "per_rank");
    for (int tier = 0; tier < ZO_PLAN_TIERS; tier++) {
        cJSON *jt = cJSON_AddObjectToObject(jr, zo_plan_tier_name((zo_plan_tier)tier));
        for (int k = 0; k < PLAN_KINDS; k++) {
            if (k == PLAN_ACTIVATIONS && !e->activations_known)
                cJSON_AddNullToObject(jt, plan_kind_name((plan_kind)k));
            else
                add_u64(jt, plan_kind_name((plan_kind)k), e->bytes[tier][k]);
        }
        add_u64(jt, "total", e->total[tier]);
        add_u64(jt, "capacity", e->capacity[tier]);
        cJSON_AddBoolToObject(jt, "fits", e->total[tier] <= e->capacity[tier]);
        cJSON *items = cJSON_AddArrayToObject(jt, "items");
        for (int i = 0; i < e->n_items; i++) {
            if (e->items[i].tier != (zo_plan_tier)tier) continue;
            cJSON *it = cJSON_CreateObject();
            cJSON_AddStringToObject(it, "name", e->items[i].name);
            cJSON_AddStringToObject(it, "kind", plan_kind_name(e->items[i].kind));
            add_u64(it, "bytes", e->items[i].bytes);
            cJSON_AddItemToArray(items, it);
        }
    }
    cJSON_AddNumberToObject(root, "ranks_per_node", e->ranks_per_node);
    cJSON_AddNumberToObject(root, "pipeline_stage", e->stage);
    add_u64(root, "stage_params", e->stage_params);
    add_u64(root, "rank_params", e->rank_params);
    add_u64(root, "trainable_params", e->trainable);
    add_u64(root, "rank_trainable_params", e->train_params);
    if (t->method != ZO_PLAN_FULL) {
        add_u64(root, "frozen_bytes", e->weight_bytes - e->train_params * zo_dtype_size(t->dtype));
        add_u64(root, "nf4_bytes", e->nf4_bytes);
    }
    if (e->activations_known) {
        add_u64(root, "activations_per_layer", e->act_layer);
        cJSON_AddNumberToObject(root, "microbatches_in_flight", e->inflight);
    }
    cJSON_AddBoolToObject(root, "fits", e->fits);
    cJSON *js = cJSON_AddObjectToObject(root, "shortfall");
    for (int tier = 0; tier < ZO_PLAN_TIERS; tier++)
        add_u64(js, zo_plan_tier_name((zo_plan_tier)tier),
                e->total[tier] > e->capacity[tier] ? e->total[tier] - e->capacity[tier] : 0);
    add_suggestions(root, sg);
    if (pt) cJSON_AddItemToObject(root, "time", plan_report_time_json(pt));
    return root;
}

/* 39976960 -> "39,976,960" */
static const char *group_digits(uint64_t v, char *buf, size_t len)
{
    char d[32];
    int n = snprintf(d, sizeof d, "%llu", (unsigned long long)v), k = 0;
    size_t o = 0;
    for (int i = 0; i < n && o + 2 < len; i++) {
        if (i && (n - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = d[k++];
    }
    buf[o] = '\0';
    return buf;
}

static int cmp_items(const void *a, const void *b)
{
    const plan_item *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

static double pct(uint64_t a, uint64_t cap) { return cap ? 100.0 * (double)a / (double)cap : 0; }

/* A tier's table is in GiB, or in MiB when the tier holds less than 1 GiB
 * (toy configurations), so its lines never all read 0.00. */
typedef struct unit {
    double div;
    const char *name;
} unit;

static unit tier_unit(uint64_t capacity)
{
    return capacity >= (1ull << 30) ? (unit){1024.0 * 1024.0 * 1024.0, "GiB"}
                                    : (unit){1024.0 * 1024.0, "MiB"};
}

static const char *part_title[PLAN_TIME_PARTS] = {
    "forward compute", "backward compute", "recompute", "tensor-parallel collectives",
    "pipeline bubble", "pipeline sends", "data-parallel collectives (exposed)",
    "host->device copies (exposed)", "device->host gradients (exposed)", "optimizer on the GPU",
    "CPU AdamW", "NVMe traffic (exposed)", "expert-parallel all-to-alls",
};

static void fmt_s(double s, char *buf, size_t len)
{
    if (s >= 1) snprintf(buf, len, "%8.3f s ", s);
    else snprintf(buf, len, "%8.2f ms", s * 1e3);
}

void plan_report_time_table(FILE *out, const plan_time *pt)
{
    char b[32];
    fmt_s(pt->step, b, sizeof b);
    fprintf(out, "\n  time per step %s   %.4g tokens/s   MFU %.1f%%   HFU %.1f%%\n", b,
            pt->tokens_per_s, 100 * pt->mfu, 100 * pt->hfu);
    for (int i = 0; i < PLAN_TIME_PARTS; i++) {
        double v = plan_time_part(pt, i);
        if (v <= 0) continue;
        fmt_s(v, b, sizeof b);
        fprintf(out, "    %-42s %s  %6.1f%%\n", part_title[i], b, 100 * v / pt->step);
    }
    if (pt->mb.layer_fwd > 0)
        fprintf(out, "    (one layer, one micro-batch: forward %.2f ms, backward %.2f ms)\n",
                pt->mb.layer_fwd * 1e3, pt->mb.layer_bwd * 1e3);
    plan_report_schedule(out, pt);
}

/* seconds in a sentence: "7.438 s", "918.9 ms" */
static const char *secs(double s, char *buf, size_t len)
{
    if (s >= 1) snprintf(buf, len, "%.3f s", s);
    else snprintf(buf, len, "%.1f ms", s * 1e3);
    return buf;
}

void plan_report_schedule(FILE *out, const plan_time *pt)
{
    if (pt->sched.cpu_n <= 0) return;
    char b[32], c[32], d[32];
    static const char *what[ZO_PLAN_SCHEDULES] = {
        "serial: the CPU update after the backward",
        "overlap: the CPU update block by block beside the GPU's work",
        "dpu: each step's CPU update beside the next step's forward and backward",
    };
    fprintf(out, "  optimizer schedule %s\n", what[pt->schedule]);
    if (pt->schedule == ZO_PLAN_SCHED_OVERLAP)
        fprintf(out, "    %s\n", pt->clip_stale ? "updates start as each block's gradients are "
                                                  "complete (clipping by the previous step's norm)"
                                                : "exact clipping: updates start after the "
                                                  "backward, each next forward block waits for "
                                                  "its own");
    if (pt->schedule == ZO_PLAN_SCHED_DPU)
        fprintf(out, "    after %d serial steps; from then on a step computes with the weights "
                     "before the previous step's update\n", pt->dpu_warmup);
    fprintf(out, "    CPU optimizer %s on %.3g threads (%.3g params/s): %s beside GPU work, %s "
                 "exposed; the step is bound by %s\n",
            secs(pt->opt_s, b, sizeof b), pt->opt_threads, pt->cpu_adam_rate,
            secs(pt->opt_hidden, c, sizeof c), secs(pt->opt_exposed, d, sizeof d),
            pt->bound == PLAN_BOUND_GPU ? "the GPU's work" : pt->bound == PLAN_BOUND_OPT
                                                                 ? "the CPU optimizer"
                                                                 : plan_bound_name(pt->bound));
    if (pt->schedule != ZO_PLAN_SCHED_SERIAL)
        fprintf(out, "    the serial schedule: %s per step (%.2fx this one)\n",
                secs(pt->serial_step, b, sizeof b), pt->serial_step / pt->step);
}

void plan_report_table(FILE *out, const zo_model_config *m, const plan_hw *hw,
                       const plan_train *t, const plan_estimate *e, const plan_time *pt,
                       const plan_suggestions *sg)
{
    char cnt[32], fr[64];
    static const char *tier_title[] = {"GPU", "CPU", "NVMe"};
    zo_param_counts pc;
    zo_model_param_counts(m, &pc);
    char act[48] = "";
    if (pc.experts) {
        char a[32];
        snprintf(act, sizeof act, ", %s active", zo_format_count(pc.active, a, sizeof a));
    }
    fprintf(out, "%s (%s params%s) on %s: %d x %s, %d per node\n", m->name,
            zo_format_count(e->params, cnt, sizeof cnt), act, hw->name, hw->gpus, hw->gpu,
            hw->gpus_per_node);
    plan_format_fractions(t->opt_frac, fr, sizeof fr);
    fprintf(out,
            "  seq %d%s, micro-batch %d, grad-accum %d, %s weights, %s grads, %s; DP %d, TP %d%s, "
            "PP %d%s, ZeRO-%d\n",
            t->seq, t->seq_is_default ? " (default: the model's positions, at most 4096)" : "",
            t->micro_batch, t->grad_accum, zo_dtype_name(t->dtype),
            zo_dtype_name(t->grad_dtype), t->optimizer == ZO_PLAN_ADAMW ? "AdamW" : "SGD", t->dp,
            t->tp, t->sp ? " (+SP)" : "", t->pp, t->vpp > 1 ? " (interleaved)" : "", t->zero);
    /* the runtime's GPU share is whole blocks: say so when that moved it */
    char held[96] = "";
    if (fabs(e->opt_share[ZO_PLAN_GPU] - t->opt_frac[ZO_PLAN_GPU]) > 1e-6) {
        char sh[64];
        plan_format_fractions(e->opt_share, sh, sizeof sh);
        snprintf(held, sizeof held, " (in whole blocks: %s)", sh);
    }
    if (t->ep > 1 || t->capacity_factor > 0)
        fprintf(out, "  experts: EP %d (%d of %d experts per rank), %s\n", t->ep,
                m->moe.experts / t->ep, m->moe.experts,
                t->capacity_factor > 0 ? "capacity-limited" : "dropless routing");
    fprintf(out,
            "  recompute %s, %s attention%s; params on %s, grads on %s, optimizer on %s%s, "
            "checkpoints on %s\n",
            zo_plan_recompute_name(t->recompute), t->flash_attn ? "flash" : "standard",
            t->dropout ? ", dropout" : "", zo_plan_tier_name(t->params_on),
            zo_plan_tier_name(t->grads_on), fr, held, zo_plan_tier_name(t->checkpoints_on));
    if (t->method != ZO_PLAN_FULL) {
        char tg[64], tr[32], nf[32];
        fprintf(out, "  %s r %d (alpha %g) on %s: %s trainable parameters (%.3g%%, as PEFT counts "
                     "them)\n",
                t->method == ZO_PLAN_QLORA ? "QLoRA" : "LoRA", t->lora.r, (double)t->lora.alpha,
                zo_lora_targets_str(t->lora.targets, tg, sizeof tg),
                group_digits(e->trainable, tr, sizeof tr),
                100.0 * (double)e->trainable / (double)e->params);
        if (t->method == ZO_PLAN_QLORA)
            fprintf(out, "    frozen base: the layers' linear weights in NF4 with double quantization "
                         "(%s), embeddings, head and norms in %s\n",
                    zo_format_bytes(e->nf4_bytes, nf, sizeof nf), zo_dtype_name(t->dtype));
        else
            fprintf(out, "    frozen base in %s\n", zo_dtype_name(t->dtype));
        fprintf(out, "    the frozen base on %s, the adapters on %s\n", zo_plan_tier_name(t->params_on),
                zo_plan_tier_name(t->adapters_on));
    }
    if (t->pp > 1)
        fprintf(out, "  per rank of pipeline stage %d (the one that needs the most GPU memory)\n",
                e->stage);

    plan_item sorted[PLAN_MAX_ITEMS];
    memcpy(sorted, e->items, sizeof(plan_item) * (size_t)e->n_items);
    qsort(sorted, (size_t)e->n_items, sizeof sorted[0], cmp_items);
    for (int tier = 0; tier < ZO_PLAN_TIERS; tier++) {
        if (!e->total[tier] && tier != ZO_PLAN_GPU) continue;
        unit u = tier_unit(e->capacity[tier]);
        fprintf(out, "\n  %-4s per rank%s %10.2f %s of %.2f %s  %6.1f%%  %s\n", tier_title[tier],
                tier == ZO_PLAN_GPU || e->ranks_per_node == 1 ? "" : " (node share)",
                (double)e->total[tier] / u.div, u.name, (double)e->capacity[tier] / u.div, u.name,
                pct(e->total[tier], e->capacity[tier]),
                e->total[tier] <= e->capacity[tier] ? "ok" : "OVER");
        for (int i = 0; i < e->n_items; i++) {
            if (sorted[i].tier != (zo_plan_tier)tier) continue;
            fprintf(out, "    %-12s %-58s %10.2f %s  %6.1f%%\n", plan_kind_name(sorted[i].kind),
                    sorted[i].name, (double)sorted[i].bytes / u.div, u.name,
                    pct(sorted[i].bytes, e->capacity[tier]));
        }
    }
    if (!e->activations_known)
        fprintf(out, "\n  activations: unknown (the model is known only by its size; give a "
                     "shape or a config.json)\n");
    fprintf(out, "\n");
    if (e->fits) {
        unit u = tier_unit(e->capacity[ZO_PLAN_GPU]);
        fprintf(out, "verdict: fits (GPU %.1f%% of %.2f %s", pct(e->total[ZO_PLAN_GPU], e->capacity[ZO_PLAN_GPU]),
                (double)e->capacity[ZO_PLAN_GPU] / u.div, u.name);
        if (e->total[ZO_PLAN_CPU]) fprintf(out, ", CPU %.1f%%", pct(e->total[ZO_PLAN_CPU], e->capacity[ZO_PLAN_CPU]));
        if (e->total[ZO_PLAN_NVME])
            fprintf(out, ", NVMe %.1f%%", pct(e->total[ZO_PLAN_NVME], e->capacity[ZO_PLAN_NVME]));
        fprintf(out, ")%s\n", e->activations_known ? "" : " for model states; activations unknown");
        if (pt) plan_report_time_table(out, pt);
        return;
    }
    fprintf(out, "verdict: does NOT fit:");
    const char *sep = " ";
    for (int tier = 0; tier < ZO_PLAN_TIERS; tier++) {
        if (e->total[tier] <= e->capacity[tier]) continue;
        unit u = tier_unit(e->capacity[tier]);
        fprintf(out, "%s%s needs %.2f %s of %.2f %s (short by %.2f %s)", sep, tier_title[tier],
                (double)e->total[tier] / u.div, u.name, (double)e->capacity[tier] / u.div, u.name,
                (double)(e->total[tier] - e->capacity[tier]) / u.div, u.name);
        sep = "; ";
    }
    fprintf(out, "\n");
    if (sg && sg->n)
        print_suggestions(out, sg);
    else
        fprintf(out, "         no offload setting%s alone makes it fit: add GPUs (--dp/--tp/--pp "
                     "with --zero) or shorten --seq / --micro-batch\n",
                t->method == ZO_PLAN_QLORA ? "" : ", LoRA or QLoRA");
    if (pt) plan_report_time_table(out, pt);
}
