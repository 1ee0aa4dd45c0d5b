/* memplan's view of a runtime configuration: the plan_train a test compares
 * the runtime's measured peaks with (test_offload's memplan comparisons,
 * test_zero). */
#ifndef ZO_TESTS_SUPPORT_RUNTIME_PLAN_H
#define ZO_TESTS_SUPPORT_RUNTIME_PLAN_H

#include "offload/offload.h" /* defines: offload_config */
#include "planner/memory.h"  /* defines: plan_train, plan_estimate */

/* The plan of a run of model m in dtype dt, micro-batch B x T, configured
 * as oc, on `ranks` data-parallel ranks (ZeRO oc->zero_stage when more than
 * one): no CUDA context, workspace or fragmentation allowance (the CPU
 * device has none). */
void runtime_plan_train(plan_train *t, const zo_model_config *m, zo_dtype dt, int B, int T,
                        const offload_config *oc, int ranks);
/* memplan's estimate of t (hardware: t->dp ranks of the CPU device with
 * room for anything); fails the test when memplan refuses it. */
void runtime_plan_estimate(const zo_model_config *m, const plan_train *t, plan_estimate *e);

#endif
