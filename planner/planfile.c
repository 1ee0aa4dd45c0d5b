#include "planfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h" /* defines: zo_json_parse */

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

void plan_file_from(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                    const plan_estimate *e, const plan_time *pt, zo_plan *p)
{
    zo_plan_defaults(p, m);
    if (hw) {
        p->has_hardware = 1;
        p->hardware = *hw;
    }
    p->training = (zo_plan_training){
        .seq = t->seq, .micro_batch = t->micro_batch, .grad_accum = t->grad_accum,
        .dtype = t->dtype, .grad_dtype = t->grad_dtype,
        .optimizer = t->optimizer, .recompute = t->recompute,
        .flash_attn = t->flash_attn, .dropout = t->dropout, .dp_overlap = t->dp_overlap,
        .fused_grad_accum = t->fused_grad_accum, .method = t->method,
        .optimizer_schedule = t->schedule, .dpu_warmup = t->dpu_warmup,
        .opt_threads = t->opt_threads, .clip_stale = t->clip_stale,
        .has_lora = t->method != ZO_PLAN_FULL, .lora = t->lora};
    if (!p->training.has_lora) memset(&p->training.lora, 0, sizeof p->training.lora);
    p->parallel = (zo_plan_parallel){.dp = t->dp, .tp = t->tp, .pp = t->pp, .vpp = t->vpp,
                                     .sp = t->sp, .ep = t->ep,
                                     .capacity_factor = t->capacity_factor, .zero = t->zero};
    p->placement.params = t->params_on;
    p->placement.grads = t->grads_on;
    p->placement.checkpoints = t->checkpoints_on;
    p->placement.adapters = t->adapters_on;
    memcpy(p->placement.optimizer, t->opt_frac, sizeof p->placement.optimizer);
    p->nvme.sub_group = t->buf.sub_group;
    p->nvme.swap_buffers = t->buf.swap_buffers;
    p->buffers = (zo_plan_buffers){
        .prefetch_depth = t->buf.prefetch_depth, .comm_bucket_elems = t->buf.comm_bucket,
        .comm_buckets = t->buf.comm_buckets, .pinned_staging = t->buf.pinned_staging,
        .cuda_context = t->buf.cuda_context, .cublas_workspace = t->buf.cublas_workspace,
        .fragmentation = t->buf.fragmentation};
    if (!e) return;
    p->has_predicted = 1;
    for (int i = 0; i < ZO_PLAN_TIERS; i++) {
        p->predicted.peak_bytes[i] = e->total[i];
        p->predicted.capacity_bytes[i] = e->capacity[i];
    }
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
    const zo_plan_training *tr = &p->training;
    t->seq = tr->seq;
    t->micro_batch = tr->micro_batch;
    t->grad_accum = tr->grad_accum;
    t->dtype = tr->dtype;
    t->grad_dtype = tr->grad_dtype;
    t->optimizer = tr->optimizer;
    t->recompute = tr->recompute;
    t->flash_attn = tr->flash_attn;
    t->dropout = tr->dropout;
    t->dp_overlap = tr->dp_overlap;
    t->fused_grad_accum = tr->fused_grad_accum;
    t->method = tr->method;
    if (tr->has_lora) t->lora = tr->lora;
    t->schedule = tr->optimizer_schedule;
    t->dpu_warmup = tr->dpu_warmup;
    t->opt_threads = tr->opt_threads;
    t->clip_stale = tr->clip_stale;
    t->dp = p->parallel.dp;
    t->tp = p->parallel.tp;
    t->pp = p->parallel.pp;
    t->vpp = p->parallel.vpp;
    t->sp = p->parallel.sp;
    t->ep = p->parallel.ep;
    t->capacity_factor = p->parallel.capacity_factor;
    t->zero = p->parallel.zero;
    t->params_on = p->placement.params;
    t->grads_on = p->placement.grads;
    t->checkpoints_on = p->placement.checkpoints;
    t->adapters_on = p->placement.adapters;
    memcpy(t->opt_frac, p->placement.optimizer, sizeof t->opt_frac);
    t->buf.sub_group = p->nvme.sub_group;
    t->buf.swap_buffers = p->nvme.swap_buffers;
    t->buf.prefetch_depth = p->buffers.prefetch_depth;
    t->buf.comm_bucket = p->buffers.comm_bucket_elems;
    t->buf.comm_buckets = p->buffers.comm_buckets;
    t->buf.pinned_staging = p->buffers.pinned_staging;
    t->buf.cuda_context = p->buffers.cuda_context;
    t->buf.cublas_workspace = p->buffers.cublas_workspace;
    t->buf.fragmentation = p->buffers.fragmentation;
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
