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

#include "common/status.h"

typedef struct plan_hw {
    char name[48];
    char gpu[24];            /* "H100-80GB" */
    int gpus;                /* GPUs in the job (ranks) */
    int gpus_per_node;
    uint64_t gpu_mem;        /* bytes per GPU */
    uint64_t cpu_mem;        /* bytes per node */
    uint64_t nvme;           /* bytes per node */
    double nvme_read_bw;     /* bytes/s per node */
    double nvme_write_bw;    /* bytes/s per node */
    double pcie_bw;          /* bytes/s per GPU, each direction, achieved */
    double nvlink_bw;        /* bytes/s per GPU, one direction */
    double net_bw;           /* bytes/s per GPU across nodes */
    double hbm_bw;           /* bytes/s */
    double peak_flops_16;    /* dense fp16/bf16 tensor FLOP/s */
    double peak_flops_32;    /* dense fp32 (TF32 where the GPU has it) FLOP/s */
    double cpu_mem_bw;       /* bytes/s per node */
    int cpu_cores;           /* per node */
    /* cost model (docs/memplan.md, "Time"): */
    double gemm_eff_max;     /* matmul efficiency of large operations, fraction of peak */
    double gemm_flops_half;  /* FLOPs of one matmul at half of gemm_eff_max */
    double hbm_eff;          /* fraction of hbm_bw that elementwise kernels reach */
    double coll_eff;         /* fraction of a link's bandwidth a collective reaches (busbw) */
    double nvlink_lat;       /* seconds per step of a collective inside a node */
    double net_lat;          /* seconds per step of a collective across nodes */
    double cpu_adam_rate;    /* AdamW parameters/s per node on the CPU; 0: from cpu_mem_bw */
    int measured;            /* 1: a profile written by `memplan calibrate` */
    char note[160];          /* what a profile could not measure (e.g. "no GPU") */
} plan_hw;

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
