/* What the runtime runs (capability.h): the table of what it does not, and
 * the one message each gap gets in every program. */
#include "capability.h"

#include <stdio.h>
#include <string.h>

const zo_capability_entry zo_capability_table[ZO_CAP_GAPS - 1] = {
    {ZO_CAP_TENSOR_PARALLEL, "tensor-parallel",
     "the runtime runs data parallelism only (--tp 1 --pp 1, any number of ranks); memplan estimate sizes "
     "tensor and pipeline parallelism for clusters"},
    {ZO_CAP_PIPELINE_PARALLEL, "pipeline-parallel",
     "the runtime runs data parallelism only (--tp 1 --pp 1, any number of ranks); memplan estimate sizes "
     "tensor and pipeline parallelism for clusters"},
    {ZO_CAP_EXPERT_PARALLEL, "expert-parallel",
     "expert parallelism places a mixture of experts' routed experts over the ranks: the runtime runs it for "
     "full fine-tuning, LoRA and QLoRA of such a model at ZeRO 0-3, the weights, the base, the adapters and "
     "the optimizer on any tier the stage takes (--ep N, N dividing the ranks and the experts); a model "
     "without experts runs with --ep 1"},
    {ZO_CAP_ZERO12_OFFLOADED, "zero12-offloaded-weights",
     "ZeRO-1 and ZeRO-2 keep every 16-bit weight on each rank's GPU; trained weights off the GPU need "
     "ZeRO-3 (--zero 3), which partitions them over the ranks and streams each rank's part"},
    {ZO_CAP_DPU_GPU_OPTIMIZER, "dpu-gpu-optimizer",
     "the delayed update runs the optimizer on the CPU beside the next step, while the GPU share's update "
     "writes the resident weights in place; use --schedule overlap or serial, or the optimizer on cpu and nvme"},
    {ZO_CAP_MOE_STATE8_GPU, "moe-state8-gpu-optimizer",
     "the GPU's update codes 8-bit m and v 2048 values at a time from a block's start, and the experts no "
     "token went to in a step, which AdamW leaves untouched, cut those blocks: put the optimizer on cpu and "
     "nvme, or use --optim-dtype bf16"},
    {ZO_CAP_NO_MASTER, "no-master",
     "the bf16 update without an fp32 master runs in the host and GPU optimizer shards: the NVMe swap "
     "moves an fp32 master with m and v (its sub-groups have no slot for bf16 weights and their "
     "compensation yet); put the optimizer on cpu and gpu (--optimizer cpu or cpu=F,gpu=G), or use "
     "--master fp32"},
};

void zo_run_shape_defaults(zo_run_shape *r)
{
    memset(r, 0, sizeof *r);
    r->method = ZO_PLAN_FULL;
    r->ranks = r->tp = r->pp = r->ep = 1;
    r->schedule = ZO_PLAN_SCHED_SERIAL;
    r->params = r->adapters = ZO_PLAN_GPU;
    r->optimizer[ZO_PLAN_CPU] = 1.0;
}

void zo_run_shape_from_plan(const zo_plan *p, zo_run_shape *out)
{
    zo_run_shape_defaults(out);
    out->method = p->training.method;
    out->ranks = p->parallel.dp > 0 ? p->parallel.dp : 1;
    out->zero = p->parallel.zero;
    out->tp = p->parallel.tp;
    out->pp = p->parallel.pp;
    out->ep = p->parallel.ep > 0 ? p->parallel.ep : 1;
    out->schedule = p->training.optimizer_schedule;
    out->params = p->placement.params;
    out->adapters = p->training.method == ZO_PLAN_FULL ? ZO_PLAN_GPU : p->placement.adapters;
    memcpy(out->optimizer, p->placement.optimizer, sizeof out->optimizer);
    out->moe = p->model.moe.experts > 0;
    out->optim_dtype = p->training.optim_dtype;
    out->master = p->training.master;
    out->loss_chunk = p->training.loss_chunk;
}

/* The trained weights' tier: the weights, or a LoRA base's adapters. */
static zo_plan_tier trained_on(const zo_run_shape *r)
{
    return r->method == ZO_PLAN_FULL ? r->params : r->adapters;
}

zo_capability_gap zo_capability_find(const zo_run_shape *r)
{
    if (r->tp > 1) return ZO_CAP_TENSOR_PARALLEL;
    if (r->pp > 1) return ZO_CAP_PIPELINE_PARALLEL;
    if (r->ep > 1 && !r->moe)
        return ZO_CAP_EXPERT_PARALLEL;
    if (r->ranks > 1 && (r->zero == 1 || r->zero == 2) && trained_on(r) != ZO_PLAN_GPU)
        return ZO_CAP_ZERO12_OFFLOADED;
    if (r->schedule == ZO_PLAN_SCHED_DPU && r->optimizer[ZO_PLAN_GPU] > 0) return ZO_CAP_DPU_GPU_OPTIMIZER;
    if (r->moe && r->optim_dtype == ZO_PLAN_STATE_8BIT && r->optimizer[ZO_PLAN_GPU] > 0)
        return ZO_CAP_MOE_STATE8_GPU;
    if (r->master != ZO_PLAN_MASTER_FP32 && r->optimizer[ZO_PLAN_NVME] > 0) return ZO_CAP_NO_MASTER;
    return ZO_CAP_RUNS;
}

/* The optimizer's split as the --optimizer flag writes it ("cpu=0.5,gpu=0.5"). */
static void fractions(const double f[ZO_PLAN_TIERS], char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int t = 0; t < ZO_PLAN_TIERS && n < len; t++)
        if (f[t] > 0)
            n += (size_t)snprintf(buf + n, len - n, "%s%s=%g", n ? "," : "", zo_plan_tier_name((zo_plan_tier)t),
                                  f[t]);
}

/* What does not run, with the run's values, its flags and its plan fields. */
static void what(const zo_run_shape *r, zo_capability_gap gap, char *buf, size_t len)
{
    char fr[96];
    switch (gap) {
    case ZO_CAP_TENSOR_PARALLEL:
        snprintf(buf, len, "tensor parallelism (--tp %d, parallel.tp)", r->tp);
        break;
    case ZO_CAP_PIPELINE_PARALLEL:
        snprintf(buf, len, "pipeline parallelism (--pp %d, parallel.pp)", r->pp);
        break;
    case ZO_CAP_EXPERT_PARALLEL:
        snprintf(buf, len, "expert parallelism (--ep %d, parallel.ep) on a model without experts", r->ep);
        break;
    case ZO_CAP_ZERO12_OFFLOADED:
        if (r->method == ZO_PLAN_FULL)
            snprintf(buf, len, "ZeRO-%d (--zero %d) on %d ranks with the weights on %s (--params %s, "
                     "placement.params)", r->zero, r->zero, r->ranks, zo_plan_tier_name(r->params),
                     zo_plan_tier_name(r->params));
        else
            snprintf(buf, len, "%s on %d ranks at ZeRO-%d (--zero %d) with the adapters on %s (--adapters-on %s, "
                     "placement.adapters)", r->method == ZO_PLAN_QLORA ? "QLoRA" : "LoRA", r->ranks, r->zero,
                     r->zero, zo_plan_tier_name(r->adapters), zo_plan_tier_name(r->adapters));
        break;
    case ZO_CAP_DPU_GPU_OPTIMIZER:
        fractions(r->optimizer, fr, sizeof fr);
        snprintf(buf, len, "the delayed parameter update (--schedule dpu, training.optimizer_schedule) with "
                 "optimizer state on the GPU (--optimizer %s, placement.optimizer)", fr);
        break;
        break;
    case ZO_CAP_MOE_STATE8_GPU:
        fractions(r->optimizer, fr, sizeof fr);
        snprintf(buf, len, "8-bit m and v (--optim-dtype 8bit, training.optim_dtype) with optimizer state on the "
                 "GPU (--optimizer %s, placement.optimizer) for a mixture of experts", fr);
        break;
    case ZO_CAP_NO_MASTER:
        fractions(r->optimizer, fr, sizeof fr);
        snprintf(buf, len, "weights without an fp32 master (--master %s, training.master) with optimizer state "
                 "on NVMe (--optimizer %s, placement.optimizer)", zo_plan_master_name(r->master), fr);
        break;
    default:
        snprintf(buf, len, "this combination");
        break;
    }
}

zo_status zo_capability_check(const zo_run_shape *r, char *why, size_t len)
{
    zo_capability_gap gap = zo_capability_find(r);
    if (gap == ZO_CAP_RUNS) {
        if (why && len) why[0] = '\0';
        return ZO_OK;
    }
    char w[256];
    what(r, gap, w, sizeof w);
    const char *reason = "";
    for (size_t i = 0; i < sizeof zo_capability_table / sizeof zo_capability_table[0]; i++)
        if (zo_capability_table[i].gap == gap) reason = zo_capability_table[i].why;
    if (why && len) snprintf(why, len, "%s does not run: %s", w, reason);
    return zo_error(ZO_ERR_UNSUPPORTED, "%s does not run: %s", w, reason);
}

zo_status zo_capability_check_plan(const zo_plan *p, char *why, size_t len)
{
    zo_run_shape r;
    zo_run_shape_from_plan(p, &r);
    return zo_capability_check(&r, why, len);
}
