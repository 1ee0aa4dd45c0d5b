/* Plans in: the JSON memplan writes, as the runtime's configuration (the
 * measurements go out through offload.c's offload_write_stats_json). */
#include "offload/offload.h"

#include "common/capability.h" /* defines: zo_capability_check */

#include <stdio.h>
#include <string.h>

/* The schema's tiers are the runtime's, value for value. */
_Static_assert((int)ZO_PLAN_GPU == OFFLOAD_DEVICE && (int)ZO_PLAN_CPU == OFFLOAD_CPU &&
                   (int)ZO_PLAN_NVME == OFFLOAD_NVME && (int)ZO_PLAN_TIERS == OFFLOAD_TIERS,
               "plan tiers");

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

    /* tensor, pipeline and expert parallelism: the capability table's
     * words (the rest of the plan's shape is checked where it runs, after
     * the program's flags: offload_init, train) */
    zo_run_shape par;
    zo_run_shape_defaults(&par);
    par.tp = f->parallel.tp;
    par.pp = f->parallel.pp;
    par.ep = f->parallel.ep > 0 ? f->parallel.ep : 1;
    par.moe = f->model.moe.experts > 0; /* (expert parallelism needs experts) */
    par.master = f->training.master;
    par.loss_chunk = f->training.loss_chunk;
    if ((st = zo_capability_check(&par, NULL, 0)) != ZO_OK) return zo_error_wrap(st, "%s", path);

    offload_config *c = &plan->cfg;
    c->zero_stage = f->parallel.zero;
    c->params_on = (offload_tier)f->placement.params;
    c->checkpoints_on = (offload_tier)f->placement.checkpoints;
    memcpy(c->opt_frac, f->placement.optimizer, sizeof c->opt_frac);
    c->opt_state = f->training.optim_dtype;
    c->master = f->training.master;
    /* selective recompute keeps all but the attention core, which is worth
     * recomputing only when it stores the s x s scores; this attention is
     * memory-efficient (it keeps one log-sum-exp per row), so selective
     * saves nothing over none */
    c->recompute = f->training.recompute == ZO_PLAN_RECOMPUTE_FULL  ? OFFLOAD_RECOMPUTE_FULL
                   : f->training.recompute == ZO_PLAN_RECOMPUTE_OPS ? OFFLOAD_RECOMPUTE_OPS
                                                                    : OFFLOAD_RECOMPUTE_NONE;
    c->recompute_layers = c->recompute == OFFLOAD_RECOMPUTE_FULL ? f->training.recompute_layers : 0;
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
    c->reduce_dtype = f->training.reduce_dtype;
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
        memcpy(plan->predicted.alloc, f->predicted.has_alloc ? f->predicted.alloc_bytes : f->predicted.peak_bytes,
               sizeof plan->predicted.alloc);
        plan->predicted.step_s = f->predicted.step_s;
    }
    return ZO_OK;
}
