#include "tests/support/runtime_plan.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

void runtime_plan_train(plan_train *t, const zo_model_config *m, zo_dtype dt, int B, int T,
                        const offload_config *oc, int ranks)
{
    plan_train_defaults(t, m);
    t->seq = T;
    t->micro_batch = B;
    t->grad_accum = oc->grad_accum ? oc->grad_accum : 1;
    t->dtype = t->grad_dtype = dt;
    t->recompute = oc->recompute == OFFLOAD_RECOMPUTE_OPS ? ZO_PLAN_RECOMPUTE_OPS
                   : oc->recompute                        ? PLAN_RECOMPUTE_FULL
                                                          : PLAN_RECOMPUTE_NONE;
    t->recompute_layers = oc->recompute == OFFLOAD_RECOMPUTE_FULL ? oc->recompute_layers : 0;
    t->dropout = 0;
    t->flash_attn = 1;
    t->params_on = (plan_tier)oc->params_on;
    /* the runtime sums a gradient where its optimizer state lives: a
     * device share's on the device, the rest on the host */
    t->grads_on = oc->opt_frac[OFFLOAD_DEVICE] >= 1 ? PLAN_GPU : PLAN_CPU;
    /* (a device optimizer share's gradient sums are fp32: memplan counts
     * them so whatever the plan's gradient dtype, as train runs its plans) */
    t->checkpoints_on = (plan_tier)oc->checkpoints_on;
    for (int i = 0; i < PLAN_TIERS; i++) t->opt_frac[i] = oc->opt_frac[i];
    t->opt_state = oc->opt_state;
    t->master = oc->master;
    t->buf.cuda_context = t->buf.cublas_workspace = 0;
    t->buf.fragmentation = 0;
    t->buf.prefetch_depth = oc->prefetch_depth;
    t->buf.sub_group = oc->sub_group;
    t->buf.swap_buffers = oc->swap_buffers ? oc->swap_buffers : 3;
    if (oc->comm_bucket) t->buf.comm_bucket = oc->comm_bucket;
    t->reduce_dtype = oc->reduce_dtype;
    t->schedule = oc->schedule == OFFLOAD_SCHEDULE_DPU       ? PLAN_SCHED_DPU
                  : oc->schedule == OFFLOAD_SCHEDULE_OVERLAP ? PLAN_SCHED_OVERLAP
                                                             : PLAN_SCHED_SERIAL;
    t->dp = ranks;
    t->zero = ranks > 1 ? oc->zero_stage : 0; /* one rank: nothing partitioned */
}

void runtime_plan_estimate(const zo_model_config *m, const plan_train *t, plan_estimate *e)
{
    /* the CPU device (its runs' backend): what memplan counts only on a CUDA
     * device, the GEMM attention's scratch, is left out */
    plan_hw hw = {.gpu = "CPU", .gpus = t->dp, .gpus_per_node = t->dp, .gpu_mem = 1ull << 40,
                  .cpu_mem = 1ull << 40, .nvme = 1ull << 40};
    assert_int_equal(plan_estimate_run(m, &hw, t, e), ZO_OK);
}
