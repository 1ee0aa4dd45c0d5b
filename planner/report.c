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

void plan_json_add_fields(cJSON *o, const void *base, const plan_json_field *f, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *p = (const char *)base + f[i].off;
        switch (f[i].type) {
        case PLAN_JSON_DOUBLE: cJSON_AddNumberToObject(o, f[i].key, *(const double *)p); break;
        case PLAN_JSON_INT: cJSON_AddNumberToObject(o, f[i].key, *(const int *)p); break;
        case PLAN_JSON_U64: add_u64(o, f[i].key, *(const uint64_t *)p); break;
        case PLAN_JSON_BOOL: cJSON_AddBoolToObject(o, f[i].key, *(const int *)p); break;
        }
    }
}

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

#define T(key, member, type) PLAN_JSON_FIELD(key, plan_time, member, type)
static const plan_json_field time_fields[] = {
    T("step_s", step, DOUBLE),   T("tokens_per_s", tokens_per_s, DOUBLE),
    T("mfu", mfu, DOUBLE),       T("hfu", hfu, DOUBLE),
    T("model_flops", model_flops, DOUBLE), T("hw_flops", hw_flops, DOUBLE),
    T("ep_alltoall_bytes", ep_bytes, DOUBLE),
};
static const plan_json_field before_overlap_fields[] = {
    T("cpu_adam", cpu_adam_total, DOUBLE), T("dp_comm", dp_comm_total, DOUBLE),
    T("h2d", h2d_total, DOUBLE),           T("d2h", d2h_total, DOUBLE),
    T("nvme", nvme_total, DOUBLE),
};
/* "schedule": after its "name", before its "bound" ... */
static const plan_json_field schedule_fields[] = {
    T("serial_step_s", serial_step, DOUBLE), T("optimizer_s", opt_s, DOUBLE),
    T("overlapped_s", opt_hidden, DOUBLE),   T("exposed_s", opt_exposed, DOUBLE),
};
/* ... and after it */
static const plan_json_field schedule_rate_fields[] = {
    T("opt_threads", opt_threads, DOUBLE), T("cpu_adam_rate", cpu_adam_rate, DOUBLE),
    T("dpu_warmup", dpu_warmup, INT),      T("clip_stale", clip_stale, BOOL),
};
static const plan_json_field microbatch_fields[] = {
    T("stage_s", mb.total, DOUBLE),
    T("layer_forward_s", mb.layer_fwd, DOUBLE),
    T("layer_backward_s", mb.layer_bwd, DOUBLE),
};
#undef T

cJSON *plan_report_time_json(const plan_time *pt)
{
    cJSON *jt = cJSON_CreateObject();
    if (!jt) return NULL;
    PLAN_JSON_ADD(jt, pt, time_fields);
    cJSON *parts = cJSON_AddObjectToObject(jt, "parts");
    for (int i = 0; i < PLAN_TIME_PARTS; i++)
        cJSON_AddNumberToObject(parts, plan_time_part_name(i), plan_time_part(pt, i));
    PLAN_JSON_ADD(cJSON_AddObjectToObject(jt, "before_overlap"), pt, before_overlap_fields);
    cJSON *js = cJSON_AddObjectToObject(jt, "schedule");
    cJSON_AddStringToObject(js, "name", zo_plan_schedule_name(pt->schedule));
    PLAN_JSON_ADD(js, pt, schedule_fields);
    cJSON_AddStringToObject(js, "bound", plan_bound_name(pt->bound));
    PLAN_JSON_ADD(js, pt, schedule_rate_fields);
    PLAN_JSON_ADD(cJSON_AddObjectToObject(jt, "microbatch"), pt, microbatch_fields);
    return jt;
}

/* an alternative's time */
static const plan_json_field alternative_fields[] = {
    PLAN_JSON_FIELD("step_s", plan_time, step, DOUBLE),
    PLAN_JSON_FIELD("tokens_per_s", plan_time, tokens_per_s, DOUBLE),
    PLAN_JSON_FIELD("mfu", plan_time, mfu, DOUBLE),
};

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
        PLAN_JSON_ADD(o, &a->time, alternative_fields);
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

#define H(key, member, type) PLAN_JSON_FIELD(key, plan_hw, member, type)
static const plan_json_field hardware_fields[] = {
    H("gpus", gpus, INT),       H("gpus_per_node", gpus_per_node, INT),
    H("gpu_mem", gpu_mem, U64), H("cpu_mem_per_node", cpu_mem, U64),
    H("nvme_per_node", nvme, U64),
};
#undef H

#define C(key, member, type) PLAN_JSON_FIELD(key, plan_train, member, type)
/* "config": the sequence and the batch ... */
static const plan_json_field batch_fields[] = {
    C("seq", seq, INT), C("seq_is_default", seq_is_default, BOOL),
    C("micro_batch", micro_batch, INT), C("grad_accum", grad_accum, INT),
};
/* ... the layout ... */
static const plan_json_field layout_fields[] = {
    C("dp", dp, INT), C("tp", tp, INT), C("pp", pp, INT), C("vpp", vpp, INT), C("ep", ep, INT),
    C("capacity_factor", capacity_factor, DOUBLE), C("sp", sp, BOOL), C("zero", zero, INT),
};
static const plan_json_field attention_fields[] = {
    C("flash_attn", flash_attn, BOOL), C("dropout", dropout, BOOL),
};
/* ... the optimizer's schedule ... */
static const plan_json_field optimizer_run_fields[] = {
    C("dpu_warmup", dpu_warmup, INT), C("opt_threads", opt_threads, INT),
    C("clip_stale", clip_stale, BOOL),
};
/* ... and the working buffers */
static const plan_json_field buffer_fields[] = {
    C("cuda_context", buf.cuda_context, U64),     C("cublas_workspace", buf.cublas_workspace, U64),
    C("comm_bucket_elems", buf.comm_bucket, U64), C("comm_buckets", buf.comm_buckets, INT),
    C("prefetch_depth", buf.prefetch_depth, INT), C("pinned_staging", buf.pinned_staging, U64),
    C("fragmentation", buf.fragmentation, DOUBLE), C("sub_group", buf.sub_group, U64),
    C("swap_buffers", buf.swap_buffers, INT),
};
#undef C

#define E(key, member, type) PLAN_JSON_FIELD(key, plan_estimate, member, type)
static const plan_json_field rank_fields[] = {
    E("ranks_per_node", ranks_per_node, INT), E("pipeline_stage", stage, INT),
    E("stage_params", stage_params, U64),     E("rank_params", rank_params, U64),
    E("trainable_params", trainable, U64),    E("rank_trainable_params", train_params, U64),
};
#undef E

/* "hardware": the machine's name, GPU and sizes */
static void add_hardware(cJSON *root, const plan_hw *hw)
{
    cJSON *jh = cJSON_AddObjectToObject(root, "hardware");
    cJSON_AddStringToObject(jh, "name", hw->name);
    cJSON_AddStringToObject(jh, "gpu", hw->gpu);
    PLAN_JSON_ADD(jh, hw, hardware_fields);
}

/* "config": the configuration estimated */
static void add_config(cJSON *root, const plan_train *t, const plan_estimate *e)
{
    cJSON *jc = cJSON_AddObjectToObject(root, "config");
    PLAN_JSON_ADD(jc, t, batch_fields);
    cJSON_AddNumberToObject(jc, "global_batch", (double)t->micro_batch * t->grad_accum * t->dp);
    cJSON_AddStringToObject(jc, "dtype", zo_dtype_name(t->dtype));
    cJSON_AddStringToObject(jc, "grad_dtype", zo_dtype_name(t->grad_dtype));
    cJSON_AddStringToObject(jc, "optimizer", zo_plan_optimizer_name(t->optimizer));
    cJSON_AddStringToObject(jc, "optim_dtype", zo_plan_opt_state_name(t->opt_state));
    cJSON_AddStringToObject(jc, "master", zo_plan_master_name(t->master));
    cJSON_AddNumberToObject(jc, "optimizer_bytes_per_param", plan_opt_bytes_per_param(t));
    cJSON_AddStringToObject(jc, "optimizer_accuracy", plan_opt_accuracy_note(t));
    cJSON_AddNumberToObject(jc, "loss_chunk", t->loss_chunk);
    PLAN_JSON_ADD(jc, t, layout_fields);
    cJSON_AddStringToObject(jc, "recompute", zo_plan_recompute_name(t->recompute));
    cJSON_AddNumberToObject(jc, "recompute_layers", t->recompute_layers);
    cJSON_AddStringToObject(jc, "reduce_dtype", zo_dtype_name(t->reduce_dtype));
    cJSON_AddStringToObject(jc, "runtime", plan_runtime_name(t->runtime));
    PLAN_JSON_ADD(jc, t, attention_fields);
    cJSON_AddStringToObject(jc, "schedule", t->pp_schedule == PLAN_PP_DEEPSPEED ? "deepspeed-1f1b"
                                            : t->vpp > 1                      ? "interleaved-1f1b"
                                                                              : "1f1b");
    cJSON_AddStringToObject(jc, "pp_partition", plan_pp_partition_name(t->pp_partition));
    cJSON_AddStringToObject(jc, "method", zo_plan_method_name(t->method));
    if (t->method != ZO_PLAN_FULL) {
        char tg[64];
        cJSON *jl = cJSON_AddObjectToObject(jc, "lora");
        cJSON_AddNumberToObject(jl, "r", t->lora.r);
        cJSON_AddNumberToObject(jl, "alpha", t->lora.alpha);
        cJSON_AddStringToObject(jl, "targets", zo_lora_targets_str(t->lora.targets, tg, sizeof tg));
    }
    cJSON_AddStringToObject(jc, "optimizer_schedule", zo_plan_schedule_name(t->schedule));
    PLAN_JSON_ADD(jc, t, optimizer_run_fields);
    plan_json_add_placement(jc, t);
    /* the split as the runtime makes it (the GPU's share in whole blocks) */
    cJSON *jo = cJSON_AddObjectToObject(cJSON_GetObjectItem(jc, "placement"), "optimizer_blocks");
    for (int i = 0; i < ZO_PLAN_TIERS; i++)
        cJSON_AddNumberToObject(jo, zo_plan_tier_name((zo_plan_tier)i), e->opt_share[i]);
    PLAN_JSON_ADD(cJSON_AddObjectToObject(jc, "buffers"), t, buffer_fields);
}

/* "per_rank": per tier, the bytes of each kind, the total against the
 * capacity and the named lines */
static void add_per_rank(cJSON *root, const plan_estimate *e)
{
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
}

cJSON *plan_report_json(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                        const plan_estimate *e, const plan_time *pt, const plan_suggestions *sg)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "model", plan_json_model(m));
    add_hardware(root, hw);
    add_config(root, t, e);
    add_per_rank(root, e);
    PLAN_JSON_ADD(root, e, rank_fields);
    if (t->method != ZO_PLAN_FULL) {
        add_u64(root, "frozen_bytes", e->weight_bytes - e->train_params * zo_dtype_size(t->dtype));
        add_u64(root, "nf4_bytes", e->nf4_bytes);
    }
    if (e->activations_known) {
        add_u64(root, "activations_per_layer", e->act_layer);
        cJSON_AddNumberToObject(root, "microbatches_in_flight", e->inflight);
        add_u64(root, "eager_extra_bytes", e->eager_extra);
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
    "DeepSpeed engine overhead (fitted on BLOOM)",
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
    if (pt->ep_bytes > 0)
        fprintf(out, "    (expert parallelism: %.0f bytes of tokens sent to other ranks per step and "
                     "rank, uniform routing)\n", pt->ep_bytes);
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
            pt->bound == PLAN_BOUND_GPU        ? "the GPU's work"
            : pt->bound == PLAN_BOUND_OPT      ? "the CPU optimizer"
            : pt->bound == PLAN_BOUND_HOST_MEM ? "the host's memory (the gradient sums and AdamW)"
                                               : plan_bound_name(pt->bound));
    if (pt->schedule != ZO_PLAN_SCHED_SERIAL)
        fprintf(out, "    the serial schedule: %s per step (%.2fx this one)\n",
                secs(pt->serial_step, b, sizeof b), pt->serial_step / pt->step);
}

static const char *tier_title[] = {"GPU", "CPU", "NVMe"};

/* The configuration, in the table's first lines. */
static void print_config(FILE *out, const zo_model_config *m, const plan_hw *hw,
                         const plan_train *t, const plan_estimate *e)
{
    char cnt[32], fr[64];
    zo_param_counts pc;
    zo_model_param_counts(m, &pc);
    char act[128] = "";
    if (pc.experts) {
        char a[32];
        snprintf(act, sizeof act, ", %s active", zo_format_count(pc.active, a, sizeof a));
    }
    if (m->mm_text) /* what a multimodal checkpoint's parameter count on its card includes */
        snprintf(act + strlen(act), sizeof act - strlen(act), ", %s", ZO_MM_TEXT_NOTE);
    fprintf(out, "%s (%s params%s) on %s: %d x %s, %d per node\n", m->name,
            zo_format_count(e->params, cnt, sizeof cnt), act, hw->name, hw->gpus, hw->gpu,
            hw->gpus_per_node);
    plan_format_fractions(t->opt_frac, fr, sizeof fr);
    char opt[96];
    if (t->optimizer != ZO_PLAN_ADAMW)
        snprintf(opt, sizeof opt, "SGD");
    else if (t->opt_state == ZO_PLAN_STATE_FP32 && t->master == ZO_PLAN_MASTER_FP32)
        snprintf(opt, sizeof opt, "AdamW");
    else
        snprintf(opt, sizeof opt, "AdamW (%s m, v; %s%s)", zo_plan_opt_state_name(t->opt_state),
                 t->master == ZO_PLAN_MASTER_FP32 ? "fp32 master" : "no fp32 master: ",
                 t->master == ZO_PLAN_MASTER_NONE         ? "bf16 rounded to nearest"
                 : t->master == ZO_PLAN_MASTER_STOCHASTIC ? "bf16, stochastic rounding"
                 : t->master == ZO_PLAN_MASTER_KAHAN      ? "bf16, Kahan-compensated"
                                                          : "");
    fprintf(out,
            "  seq %d%s, micro-batch %d, grad-accum %d, %s weights, %s grads, %s; DP %d, TP %d%s, "
            "PP %d%s, ZeRO-%d\n",
            t->seq, t->seq_is_default ? " (default: the model's positions, at most 4096)" : "",
            t->micro_batch, t->grad_accum, zo_dtype_name(t->dtype),
            zo_dtype_name(t->grad_dtype), opt, t->dp,
            t->tp, t->sp ? " (+SP)" : "", t->pp,
            t->pp_schedule != PLAN_PP_DEEPSPEED                ? (t->vpp > 1 ? " (interleaved)" : "")
            : t->pp_partition == PLAN_PP_PARTITION_EMBEDDING ? " (DeepSpeed's engine, the embedding a layer)"
                                                             : " (DeepSpeed's engine)",
            t->zero);
    if (*plan_opt_accuracy_note(t))
        fprintf(out, "  optimizer state %.4g B/param; accuracy: %s\n", plan_opt_bytes_per_param(t),
                plan_opt_accuracy_note(t));
    if (t->loss_chunk)
        fprintf(out, "  loss in chunks of %d tokens: the output layer and cross-entropy fused, "
                     "forward and backward, a chunk at a time\n", t->loss_chunk);
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
    char rc[48], red[40] = "";
    plan_recompute_words(t, rc, sizeof rc);
    if (t->dp > 1) snprintf(red, sizeof red, "; gradients reduced in %s", zo_dtype_name(t->reduce_dtype));
    fprintf(out,
            "  recompute %s, %s attention%s; params on %s, grads on %s, optimizer on %s%s, "
            "checkpoints on %s%s\n",
            rc, t->flash_attn ? "flash" : "standard", t->dropout ? ", dropout" : "",
            zo_plan_tier_name(t->params_on), zo_plan_tier_name(t->grads_on), fr, held,
            zo_plan_tier_name(t->checkpoints_on), red);
}

/* What runtime the figures model, and what the other one would change. */
void plan_report_runtime(FILE *out, const zo_model_config *m, const plan_estimate *e,
                         const plan_train *t)
{
    char b[32];
    if (!e->activations_known) {
        fprintf(out, "  runtime: %s\n", t->runtime == PLAN_RUNTIME_EAGER ? "eager PyTorch (--runtime eager)"
                     : "this project's (fused attention, the buffers listed)");
        return;
    }
    if (t->runtime == PLAN_RUNTIME_EAGER) {
        fprintf(out, "  runtime: eager PyTorch (--runtime eager): its ops keep %s more than this "
                     "project's runtime (%s layers: +%.0f%% of their activations, measured; "
                     "docs/memplan.md, \"What memplan models\")\n",
                zo_format_bytes(e->eager_extra, b, sizeof b), zo_arch_name(m->arch),
                100 * plan_eager_extra(m));
        return;
    }
    fprintf(out, "  runtime: this project's (fused attention, norms and activations; the buffers "
                 "listed); an eager PyTorch run of this setting keeps about %s more activations "
                 "(%s layers: +%.0f%%, measured; --runtime eager sizes for it)\n",
            zo_format_bytes(e->eager_extra, b, sizeof b), zo_arch_name(m->arch),
            100 * plan_eager_extra(m));
}

void plan_report_runtime_note(FILE *out, plan_runtime r)
{
    if (r == PLAN_RUNTIME_EAGER)
        fprintf(out, "runtime: eager PyTorch (--runtime eager): its ops keep more activations than "
                     "this project's runtime (llama layers +%.0f%%, gpt +0%%, measured)\n",
                100 * PLAN_EAGER_LLAMA_EXTRA);
    else
        fprintf(out, "runtime: this project's (fused attention, norms and activations); eager "
                     "PyTorch's ops keep more activations (llama layers +%.0f%%, gpt +0%%, "
                     "measured): --runtime eager sizes for it\n",
                100 * PLAN_EAGER_LLAMA_EXTRA);
}

/* LoRA / QLoRA: the adapters, what they train and where the base lives. */
static void print_method(FILE *out, const plan_train *t, const plan_estimate *e, const zo_model_config *m)
{
    char tg[64], tr[32], nf[32];
    const int moe = m->moe.experts > 0, mlp = (t->lora.targets & (ZO_LORA_GATE | ZO_LORA_UP | ZO_LORA_DOWN)) != 0;
    fprintf(out, "  %s r %d (alpha %g) on %s: %s trainable parameters (%.3g%%, %s)\n",
            t->method == ZO_PLAN_QLORA ? "QLoRA" : "LoRA", t->lora.r, (double)t->lora.alpha,
            zo_lora_targets_str(t->lora.targets, tg, sizeof tg),
            group_digits(e->trainable, tr, sizeof tr),
            100.0 * (double)e->trainable / (double)e->params,
            moe && mlp && zo_model_granitemoe(m)
                ? "the attention's targets: Granite-MoE's experts are not Linear modules PEFT adapts"
            : moe && mlp && zo_model_gpt_oss(m)
                ? "the attention's targets: gpt-oss's experts are not Linear modules PEFT adapts"
            : moe && mlp ? "the MLP targets on every expert; the router not adapted"
                         : "as PEFT counts them");
    if (t->method == ZO_PLAN_QLORA)
        fprintf(out, "    frozen base: the layers' linear weights in NF4 with double quantization "
                     "(%s), embeddings, head and norms in %s\n",
                zo_format_bytes(e->nf4_bytes, nf, sizeof nf), zo_dtype_name(t->dtype));
    else
        fprintf(out, "    frozen base in %s\n", zo_dtype_name(t->dtype));
    fprintf(out, "    the frozen base on %s, the adapters on %s\n", zo_plan_tier_name(t->params_on),
            zo_plan_tier_name(t->adapters_on));
}

/* Per tier the total against the capacity and its lines, largest first. */
static void print_tiers(FILE *out, const plan_estimate *e)
{
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
}

/* "verdict: fits (GPU 50.2% of 79.65 GiB, CPU 12.0%)" */
static void print_fits(FILE *out, const plan_estimate *e)
{
    const uint64_t *tot = e->total, *cap = e->capacity;
    unit u = tier_unit(cap[ZO_PLAN_GPU]);
    fprintf(out, "verdict: fits (GPU %.1f%% of %.2f %s", pct(tot[ZO_PLAN_GPU], cap[ZO_PLAN_GPU]),
            (double)cap[ZO_PLAN_GPU] / u.div, u.name);
    if (tot[ZO_PLAN_CPU]) fprintf(out, ", CPU %.1f%%", pct(tot[ZO_PLAN_CPU], cap[ZO_PLAN_CPU]));
    if (tot[ZO_PLAN_NVME]) fprintf(out, ", NVMe %.1f%%", pct(tot[ZO_PLAN_NVME], cap[ZO_PLAN_NVME]));
    fprintf(out, ")%s\n", e->activations_known ? "" : " for model states; activations unknown");
}

/* "verdict: does NOT fit: ..." with each tier that is over, and what fits instead. */
static void print_does_not_fit(FILE *out, const zo_model_config *m, const plan_train *t, const plan_estimate *e,
                               const plan_suggestions *sg)
{
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
    else if (m->params_override) /* (suggest.c's gen_peft: no layers to adapt) */
        fprintf(out, "         no offload setting alone makes it fit (LoRA and QLoRA not tried: their adapters "
                     "need the model's layers, --model rather than --params): add GPUs (--dp/--tp/--pp with "
                     "--zero) or shorten --seq / --micro-batch\n");
    else
        fprintf(out, "         no offload setting%s alone makes it fit: add GPUs (--dp/--tp/--pp "
                     "with --zero) or shorten --seq / --micro-batch\n",
                t->method == ZO_PLAN_QLORA ? "" : ", LoRA or QLoRA");
}

void plan_report_table(FILE *out, const zo_model_config *m, const plan_hw *hw,
                       const plan_train *t, const plan_estimate *e, const plan_time *pt,
                       const plan_suggestions *sg)
{
    print_config(out, m, hw, t, e);
    plan_report_runtime(out, m, e, t);
    if (t->method != ZO_PLAN_FULL) print_method(out, t, e, m);
    if (t->pp > 1)
        fprintf(out, "  per rank of pipeline stage %d (the one that needs the most GPU memory)\n",
                e->stage);
    print_tiers(out, e);
    if (!e->activations_known)
        fprintf(out, "\n  activations: unknown (the model is known only by its size; give a "
                     "shape or a config.json)\n");
    fprintf(out, "\n");
    if (e->fits) print_fits(out, e);
    else print_does_not_fit(out, m, t, e, sg);
    if (pt) plan_report_time_table(out, pt);
}
