#include "planfile.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h" /* defines: zo_json_parse */

void plan_run_shape(const zo_model_config *m, const plan_train *t, zo_run_shape *out)
{
    zo_run_shape_defaults(out);
    out->method = t->method;
    out->ranks = t->dp > 0 ? t->dp : 1;
    out->zero = t->zero;
    out->tp = t->tp;
    out->pp = t->pp;
    out->ep = t->ep > 0 ? t->ep : 1;
    out->schedule = t->schedule;
    out->params = t->params_on;
    out->adapters = t->method == ZO_PLAN_FULL ? ZO_PLAN_GPU : t->adapters_on;
    memcpy(out->optimizer, t->opt_frac, sizeof out->optimizer);
    out->moe = m->moe.experts > 0;
    out->optim_dtype = t->opt_state;
    out->master = t->master;
    out->loss_chunk = t->loss_chunk;
}

/* ---- hardware ----------------------------------------------------------------------- */

cJSON *plan_hw_json(const plan_hw *hw) { return zo_hw_profile_write_json(hw); }

zo_status plan_hw_from_json(const cJSON *o, const char *path, plan_hw *hw)
{
    zo_status st;
    if (!cJSON_IsObject(o)) return zo_error(ZO_ERR_FORMAT, "%s: the hardware is not an object", path);
    const cJSON *base = cJSON_GetObjectItemCaseSensitive(o, "base");
    if (base) {
        if (!cJSON_IsString(base))
            return zo_error(ZO_ERR_FORMAT, "%s: field \"base\" must be a preset name", path);
        if ((st = plan_hw_find(base->valuestring, hw)) != ZO_OK)
            return zo_error_wrap(st, "%s: field \"base\"", path);
    }
    return zo_hw_profile_read_json(o, path, "", ZO_HW_READ_PARTIAL, hw);
}

zo_status plan_hw_parse(const char *text, const char *path, plan_hw *hw)
{
    cJSON *doc;
    /* malformed JSON (line and column named) and keys given twice refused */
    zo_status st = zo_json_parse(text, strlen(text), path, &doc);
    if (st != ZO_OK) return st;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(doc, "format");
    if (cJSON_IsString(fmt) && !strcmp(fmt->valuestring, ZO_PLAN_FORMAT))
        st = zo_hw_profile_read_json(cJSON_GetObjectItemCaseSensitive(doc, "hardware"), path,
                                     "hardware.", 0, hw);
    else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, ZO_HW_FORMAT))
        st = zo_error(ZO_ERR_FORMAT, "%s: field \"format\" must be \"%s\"", path, ZO_HW_FORMAT);
    else
        st = plan_hw_from_json(doc, path, hw);
    cJSON_Delete(doc);
    return st;
}

/* ---- plans ---------------------------------------------------------------------------- */

/* A field of the plan and the configuration's that holds the same value:
 * plan_file_from copies each one way, plan_file_to the other. */
typedef struct field_map {
    size_t plan, train, size;
} field_map;

/* (sizeof a field, and 0 more when the two fields have the same size: a
 * compile error when they do not) */
#define SAME_SIZE(pf, tf)                                                                           \
    (sizeof(((plan_train *)0)->tf) +                                                                \
     0 * sizeof(char[sizeof(((zo_plan *)0)->pf) == sizeof(((plan_train *)0)->tf) ? 1 : -1]))
#define MAP(pf, tf) {offsetof(zo_plan, pf), offsetof(plan_train, tf), SAME_SIZE(pf, tf)}
static const field_map plan_fields[] = {
    MAP(training.seq, seq),
    MAP(training.micro_batch, micro_batch),
    MAP(training.grad_accum, grad_accum),
    MAP(training.dtype, dtype),
    MAP(training.grad_dtype, grad_dtype),
    MAP(training.optimizer, optimizer),
    MAP(training.optim_dtype, opt_state),
    MAP(training.master, master),
    MAP(training.loss_chunk, loss_chunk),
    MAP(training.recompute, recompute),
    MAP(training.recompute_layers, recompute_layers),
    MAP(training.reduce_dtype, reduce_dtype),
    MAP(training.flash_attn, flash_attn),
    MAP(training.dropout, dropout),
    MAP(training.dp_overlap, dp_overlap),
    MAP(training.fused_grad_accum, fused_grad_accum),
    MAP(training.method, method),
    MAP(training.optimizer_schedule, schedule),
    MAP(training.dpu_warmup, dpu_warmup),
    MAP(training.opt_threads, opt_threads),
    MAP(training.clip_stale, clip_stale),
    MAP(parallel.dp, dp),
    MAP(parallel.tp, tp),
    MAP(parallel.pp, pp),
    MAP(parallel.vpp, vpp),
    MAP(parallel.sp, sp),
    MAP(parallel.ep, ep),
    MAP(parallel.capacity_factor, capacity_factor),
    MAP(parallel.zero, zero),
    MAP(placement.params, params_on),
    MAP(placement.grads, grads_on),
    MAP(placement.checkpoints, checkpoints_on),
    MAP(placement.adapters, adapters_on),
    MAP(placement.optimizer, opt_frac),
    MAP(nvme.sub_group, buf.sub_group),
    MAP(nvme.swap_buffers, buf.swap_buffers),
    MAP(buffers.prefetch_depth, buf.prefetch_depth),
    MAP(buffers.comm_bucket_elems, buf.comm_bucket),
    MAP(buffers.comm_buckets, buf.comm_buckets),
    MAP(buffers.pinned_staging, buf.pinned_staging),
    MAP(buffers.cuda_context, buf.cuda_context),
    MAP(buffers.cublas_workspace, buf.cublas_workspace),
    MAP(buffers.fragmentation, buf.fragmentation),
};
#undef MAP

void plan_file_from(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                    const plan_estimate *e, const plan_time *pt, zo_plan *p)
{
    zo_plan_defaults(p, m);
    if (hw) {
        p->has_hardware = 1;
        p->hardware = *hw;
    }
    for (size_t i = 0; i < sizeof plan_fields / sizeof plan_fields[0]; i++)
        memcpy((char *)p + plan_fields[i].plan, (const char *)t + plan_fields[i].train,
               plan_fields[i].size);
    p->training.has_lora = t->method != ZO_PLAN_FULL;
    if (p->training.has_lora) p->training.lora = t->lora;
    if (!e) return;
    p->has_predicted = 1;
    for (int i = 0; i < ZO_PLAN_TIERS; i++) {
        p->predicted.peak_bytes[i] = e->total[i];
        p->predicted.capacity_bytes[i] = e->capacity[i];
        p->predicted.alloc_bytes[i] = e->total[i] - e->reserved[i];
    }
    p->predicted.has_alloc = 1;
    p->predicted.fits = e->fits;
    if (pt) {
        p->predicted.step_s = pt->step;
        p->predicted.tokens_per_s = pt->tokens_per_s;
        p->predicted.mfu = pt->mfu;
    }
}

zo_status plan_file_json(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                         const plan_estimate *e, const plan_time *pt, const char *what,
                         cJSON **out)
{
    if (t->runtime != PLAN_RUNTIME_ZOFFLOAD)
        return zo_error(ZO_ERR_INVALID, "%s: a plan is for this project's runtime; --runtime %s sizes "
                        "a run of another (drop it to write a plan)", what, plan_runtime_name(t->runtime));
    if (t->pp_schedule != PLAN_PP_MEGATRON)
        return zo_error(ZO_ERR_INVALID, "%s: a plan is for this project's runtime; --pp-schedule %s "
                        "times another's pipeline engine (drop it to write a plan)", what,
                        plan_pp_schedule_name(t->pp_schedule));
    zo_plan *p = malloc(sizeof *p);
    if (!p) return zo_error(ZO_ERR_NOMEM, "%s: out of memory", what);
    plan_file_from(m, hw, t, e, pt, p);
    zo_status st = zo_plan_write_json(p, what, out);
    free(p);
    return st;
}

zo_status plan_file_to(const zo_plan *p, const char *path, zo_model_config *m, plan_hw *hw,
                       plan_train *t)
{
    if (!p->has_hardware)
        return zo_error(ZO_ERR_FORMAT, "%s: missing object \"hardware\": memplan estimates a plan "
                                       "on the hardware it was made for", path);
    *m = p->model;
    *hw = p->hardware;
    plan_train_defaults(t, m);
    for (size_t i = 0; i < sizeof plan_fields / sizeof plan_fields[0]; i++)
        memcpy((char *)t + plan_fields[i].train, (const char *)p + plan_fields[i].plan,
               plan_fields[i].size);
    if (p->training.has_lora) t->lora = p->training.lora;
    zo_status st = plan_train_validate(t, m, hw);
    return st == ZO_OK ? ZO_OK : zo_error_wrap(st, "%s", path);
}

zo_status plan_file_predict(const zo_plan *p, const char *path, int schedule, plan_estimate *e,
                            plan_time *out)
{
    zo_model_config m;
    plan_hw hw;
    plan_train t;
    zo_status st = plan_file_to(p, path, &m, &hw, &t);
    if (st != ZO_OK) return st;
    if (schedule >= 0) {
        if (schedule >= ZO_PLAN_SCHEDULES)
            return zo_error(ZO_ERR_INVALID, "%s: schedule %d is not serial, overlap or dpu", path,
                            schedule);
        t.schedule = schedule;
    }
    plan_estimate est;
    if (!e) e = &est;
    if ((st = plan_estimate_run(&m, &hw, &t, e)) != ZO_OK ||
        (st = plan_time_run(&m, &hw, &t, e, out)) != ZO_OK)
        return zo_error_wrap(st, "%s", path);
    return ZO_OK;
}

zo_status plan_file_parse(const char *text, const char *path, zo_model_config *m, plan_hw *hw,
                          plan_train *t)
{
    zo_plan *p = malloc(sizeof *p);
    if (!p) return zo_error(ZO_ERR_NOMEM, "%s: out of memory", path);
    zo_status st = zo_plan_read(text, strlen(text), path, p);
    if (st == ZO_OK) st = plan_file_to(p, path, m, hw, t);
    free(p);
    return st;
}
