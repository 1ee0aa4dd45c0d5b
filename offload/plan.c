/* Plans in (the JSON memplan writes) and measurements out. */
#include "offload/offload_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/fileio.h" /* defines: zo_file_write_json */

/* The schema's tiers are the runtime's, value for value. */
_Static_assert((int)ZO_PLAN_GPU == OFFLOAD_DEVICE && (int)ZO_PLAN_CPU == OFFLOAD_CPU &&
                   (int)ZO_PLAN_NVME == OFFLOAD_NVME && (int)ZO_PLAN_TIERS == OFFLOAD_TIERS,
               "plan tiers");
_Static_assert(ZO_PLAN_MAX_PREFETCH <= OFFLOAD_MAX_PREFETCH,
               "the plan schema's prefetch limit is one the runtime can run");

void offload_plan_defaults(offload_plan *p)
{
    memset(p, 0, sizeof *p);
    offload_config_defaults(&p->cfg);
    p->dtype = -1;
}

zo_status offload_plan_load(const char *path, offload_plan *plan)
{
    zo_plan *f = &plan->file;
    zo_status st = zo_plan_load(path, f);
    if (st != ZO_OK) return st;
    if (f->training.optimizer != ZO_PLAN_ADAMW)
        return zo_error(ZO_ERR_FORMAT, "%s: field \"training.optimizer\" is %s: the runtime runs "
                        "adamw only", path, zo_plan_optimizer_name(f->training.optimizer));

    if (f->parallel.tp != 1 || f->parallel.pp != 1)
        return zo_error(ZO_ERR_FORMAT, "%s: fields \"parallel.tp\" %d and \"parallel.pp\" %d: the runtime "
                        "runs data parallelism only (tp 1, pp 1)", path, f->parallel.tp, f->parallel.pp);

    offload_config *c = &plan->cfg;
    c->zero_stage = f->parallel.zero;
    c->params_on = (offload_tier)f->placement.params;
    c->checkpoints_on = (offload_tier)f->placement.checkpoints;
    memcpy(c->opt_frac, f->placement.optimizer, sizeof c->opt_frac);
    /* selective recompute keeps all but the attention core, which is worth
     * recomputing only when it stores the s x s scores; this attention is
     * memory-efficient (it keeps one log-sum-exp per row), so selective
     * saves nothing over none */
    c->recompute = f->training.recompute == ZO_PLAN_RECOMPUTE_FULL;
    /* the optimizer's schedule; LoRA: the adapters' place (the method and
     * its r, alpha and targets are the program's: plan->file.training) */
    c->schedule = f->training.optimizer_schedule == ZO_PLAN_SCHED_DPU       ? OFFLOAD_SCHEDULE_DPU
                  : f->training.optimizer_schedule == ZO_PLAN_SCHED_OVERLAP ? OFFLOAD_SCHEDULE_OVERLAP
                                                                                : OFFLOAD_SCHEDULE_SERIAL;
    c->dpu_warmup = f->training.dpu_warmup;
    c->opt_threads = f->training.opt_threads;
    c->clip_stale = f->training.clip_stale;
    if (f->training.method != ZO_PLAN_FULL) c->trainable_on = (offload_tier)f->placement.adapters;
    plan->selective_as_none = f->training.recompute == ZO_PLAN_RECOMPUTE_SELECTIVE;
    c->grad_accum = f->training.grad_accum;
    c->prefetch_depth = f->buffers.prefetch_depth;
    c->sub_group = (size_t)f->nvme.sub_group;
    c->comm_bucket = (size_t)f->buffers.comm_bucket_elems;
    c->swap_buffers = f->nvme.swap_buffers;
    if (strcmp(f->nvme.dir, ZO_PLAN_NVME_DIR_PLACEHOLDER)) c->nvme_dir = f->nvme.dir;

    snprintf(plan->model_name, sizeof plan->model_name, "%s", f->model.name);
    plan->seq = f->training.seq;
    plan->micro_batch = f->training.micro_batch;
    plan->dtype = (int)f->training.dtype;
    if (f->has_hardware) plan->gpu_mem = f->hardware.gpu_mem;
    memset(&plan->predicted, 0, sizeof plan->predicted);
    if (f->has_predicted) {
        plan->predicted.present = 1;
        memcpy(plan->predicted.peak, f->predicted.peak_bytes, sizeof plan->predicted.peak);
        plan->predicted.step_s = f->predicted.step_s;
    }
    return ZO_OK;
}

/* ---- measurements out -------------------------------------------------------------------- */

zo_status offload_write_stats_json(const offload_t *rt, const offload_prediction *pred,
                                   const char *path)
{
    offload_stats s;
    offload_get_stats(rt, &s);
    cJSON *o = cJSON_CreateObject();
    if (!o) return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
    cJSON *pk = cJSON_AddObjectToObject(o, "peak_bytes");
    cJSON *pd = pred && pred->present ? cJSON_AddObjectToObject(o, "predicted_bytes") : NULL;
    cJSON *rd = pd ? cJSON_AddObjectToObject(o, "measured_over_predicted") : NULL;
    for (int t = 0; t < OFFLOAD_TIERS; t++) {
        const char *tn = offload_tier_name((offload_tier)t);
        cJSON_AddNumberToObject(pk, tn, (double)s.peak[t]);
        if (pd) {
            cJSON_AddNumberToObject(pd, tn, (double)pred->peak[t]);
            if (pred->peak[t]) cJSON_AddNumberToObject(rd, tn, (double)s.peak[t] / (double)pred->peak[t]);
            else cJSON_AddNullToObject(rd, tn);
        }
    }
    cJSON_AddNumberToObject(o, "device_capacity", (double)s.device_capacity);
    cJSON *ts = cJSON_AddObjectToObject(o, "time_s");
    for (int p = 0; p < OFFLOAD_TIME_PARTS; p++)
        cJSON_AddNumberToObject(ts, offload_time_part_name((offload_time_part)p), s.time[p]);
    cJSON_AddNumberToObject(ts, "total", s.total_s);
    if (pred && pred->step_s > 0) cJSON_AddNumberToObject(o, "predicted_step_s", pred->step_s);
    cJSON *op = cJSON_AddObjectToObject(o, "optimizer");
    cJSON_AddStringToObject(op, "schedule", offload_schedule_name(rt->cfg.schedule));
    cJSON_AddNumberToObject(op, "host_s", s.optimizer_s);
    cJSON_AddNumberToObject(op, "overlap_fraction", s.optimizer_overlap);
    cJSON_AddNumberToObject(o, "micro_batches", (double)s.micro_batches);
    cJSON_AddNumberToObject(o, "steps", (double)s.steps);
    cJSON_AddNumberToObject(o, "skipped", (double)s.skipped);
    cJSON *by = cJSON_AddObjectToObject(o, "bytes_moved");
    cJSON_AddNumberToObject(by, "h2d", (double)s.bytes_h2d);
    cJSON_AddNumberToObject(by, "d2h", (double)s.bytes_d2h);
    cJSON_AddNumberToObject(by, "disk_read", (double)s.bytes_disk_read);
    cJSON_AddNumberToObject(by, "disk_written", (double)s.bytes_disk_written);
    cJSON_AddNumberToObject(o, "device_slots", s.n_slots);
    cJSON_AddNumberToObject(o, "slot_bytes", (double)s.slot_bytes);
    if (s.ranks > 1) { /* this rank of a data-parallel job (docs/offload.md, "Several ranks") */
        cJSON *cm = cJSON_AddObjectToObject(o, "comm");
        cJSON_AddNumberToObject(cm, "rank", s.rank);
        cJSON_AddNumberToObject(cm, "ranks", s.ranks);
        cJSON_AddNumberToObject(cm, "elements", (double)s.comm_elems);
        cJSON_AddNumberToObject(cm, "reused_elements", (double)s.comm_reused_elems);
        cJSON_AddNumberToObject(cm, "padding_elements", (double)s.comm_pad_elems);
        cJSON_AddNumberToObject(cm, "collectives", (double)s.comm_calls);
    }
    zo_status st = zo_file_write_json(path, o);
    cJSON_Delete(o);
    return st;
}
