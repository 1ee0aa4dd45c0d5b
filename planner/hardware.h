/* Hardware descriptions: GPU, node (CPU memory, NVMe, links) and cluster size.
 *
 * Presets describe one GPU (with its share of a typical host) and the DGX
 * nodes built from it. CPU memory and NVMe are per node and shared by the
 * ranks on that node. Bandwidths are what a workload achieves, not marketing
 * peaks, where the two differ much (PCIe); they feed the cost model. */
#ifndef ZO_PLANNER_HARDWARE_H
#define ZO_PLANNER_HARDWARE_H

#include <stddef.h>
#include <stdint.h>

#include "common/plan_schema.h" /* defines: zo_hw_profile */
#include "common/status.h"

/* A machine as the planner sees it: the plan schema's hardware profile, so
 * that its fields and their ranges are one table (common/plan_schema.c). */
typedef zo_hw_profile plan_hw;

typedef struct plan_hw_preset {
    const char *name;
    const char *aliases;
    const char *summary;
    plan_hw hw;
} plan_hw_preset;

const plan_hw_preset *plan_hw_presets(size_t *count);

/* Find a preset by name or alias (case, '-', '_' ignored). On a miss the
 * message lists the closest names. */
zo_status plan_hw_find(const char *name, plan_hw *out);

/* Ranks that share one node's CPU memory and NVMe. */
int plan_hw_ranks_per_node(const plan_hw *hw);

/* AdamW parameters/s of one node's CPUs: cpu_adam_rate, or when that is 0
 * the node's memory bandwidth over the bytes one update moves. */
double plan_hw_cpu_adam_rate(const plan_hw *hw);

/* Matmul efficiency (fraction of peak) of one operation of `flops`:
 * gemm_eff_max * flops / (flops + gemm_flops_half). */
double plan_hw_gemm_eff(const plan_hw *hw, double flops);

#endif
