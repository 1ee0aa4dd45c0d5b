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

#include "common/attn_path.h"   /* defines: ZO_ATTN_GEMM_MIN_T */
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

/* Find a preset by name or alias (by zo_preset_key, common/model_config.h): a
 * whole preset, or a GPU preset on its usual host (as plan_hw_gpu_node with
 * host NULL). The machines come first: the SXM GPUs' presets carry the names
 * of the machines built from them, so `--hw h100-80gb` is the machine and
 * `--gpu h100-80gb` the card. On a miss the message lists the closest names
 * (ZO_ERR_NOT_FOUND); a name two presets of one table answer to is refused
 * (ZO_ERR_INVALID). */
zo_status plan_hw_find(const char *name, plan_hw *out);

/* ---- GPU and host presets (single-node machines) ---------------------------------- */

/* How the GPUs of one node exchange data (docs/memplan.md, "GPU presets",
 * names the source for each card): NVLink; PCIe peer-to-peer (one GPU writes
 * the other's memory over the PCIe switch or root complex); or through host
 * memory, where the driver offers no peer-to-peer (GeForce cards: NCCL's
 * shared-memory transport). */
typedef enum plan_peers { PLAN_PEERS_NVLINK = 0, PLAN_PEERS_PCIE, PLAN_PEERS_HOST } plan_peers;
const char *plan_peers_name(plan_peers p); /* "NVLink", "PCIe peer-to-peer", "host memory" */

/* This runtime's own kernels on one GPU, measured (docs/memplan.md, "Time":
 * "This runtime's kernels"): what the cost model takes instead of a
 * FlashAttention kernel at 0.75 of the matmul curve and elementwise work at
 * hbm_eff, for a plan the runtime runs (--runtime zoffload). A GPU without
 * them keeps those (they describe the published runs memplan is checked on). */
typedef struct plan_kernels {
    /* attention, FLOP/s of the causal half (the profile's count: forward
     * 4 b h s^2 d / 2, backward 2.5x it) at head dim 128 */
    double attn_gemm_fwd, attn_gemm_bwd;   /* the GEMM path (16-bit qkv, t >= PLAN_ATTN_GEMM_MIN_T);
                                              backward with fp32 output gradients (the transformer's) */
    double attn_flash_fwd, attn_flash_bwd; /* the flash kernel (every other case) */
    double attn_tc_fwd[2], attn_tc_bwd[2]; /* the tensor-core kernels (16-bit qkv, head dim 64, 80, 96 or
                                              128) at head dim <= 64 [0] and
                                              above [1]; taken where the mma.sync kernels are
                                              not (ALiBi) at head dim <= 64, or below t
                                              PLAN_ATTN_GEMM_MIN_T (common/attn_path.h's rule) */
    double attn_mma_fwd[2], attn_mma_bwd[2]; /* the mma.sync kernels, the same cases but ALiBi and
                                                head dim 256 too, at head dim <= 64 [0] and above
                                                [1] (256 unmeasured: 128's); taken wherever they
                                                cover the layer */
    double ew_eff;    /* fraction of hbm_bw the elementwise kernels reach (their bytes as the
                         runtime moves them: 16-bit activations, fp32 gradients) */
    double lora_eff;  /* fraction of hbm_bw a LoRA GEMM (one dimension r) reaches over its bytes */
    double nf4_rate;  /* NF4 weights dequantized to 16 bits, parameters/s */
    const char *source; /* where the figures were measured */
} plan_kernels;

/* The GEMM path's automatic choice from this sequence length
 * (common/attn_path.h, the runtime's rule). */
#define PLAN_ATTN_GEMM_MIN_T ZO_ATTN_GEMM_MIN_T

/* One GPU's datasheet figures; docs/memplan.md ("GPU presets") names the
 * datasheet and the figure behind each. Rates are dense (no sparsity). */
typedef struct plan_gpu_spec {
    const char *name;        /* "rtx-4090" */
    const char *aliases;     /* comma-separated */
    const char *label;       /* plan_hw.gpu: "RTX-4090-24GB" */
    const char *product;     /* "GeForce RTX 4090 (Ada, AD102)" */
    const char *host;        /* the host preset it usually sits in */
    uint64_t mem;            /* bytes: the total the driver reports (nvidia-smi) */
    double tensor_16;        /* fp16/bf16 tensor FLOP/s with fp32 accumulation (training) */
    double tensor_16_acc16;  /* fp16 tensor FLOP/s with fp16 accumulation; 0: not published */
    double tensor_32;        /* TF32 tensor FLOP/s (V100: fp32) */
    double mem_bw;           /* bytes/s */
    int pcie_gen, pcie_lanes;
    double nvlink_bw;        /* bytes/s per GPU, one direction; 0: none */
    plan_peers peers;        /* how the GPUs of a node reach each other */
    double gemm_eff_max;     /* the generation's matmul efficiency (docs/memplan.md, "Time") */
    double gemm_flops_half;  /* FLOPs at half of it; 0: 4.2 us at tensor_16 */
    const plan_kernels *kernels; /* this runtime's kernels measured on it; NULL: not measured */
} plan_gpu_spec;

/* The host a GPU sits in: per node. */
typedef struct plan_host_spec {
    const char *name;        /* "desktop" */
    const char *summary;
    uint64_t cpu_mem;        /* bytes */
    double cpu_mem_bw;       /* bytes/s: channels x transfer rate x 8 bytes */
    int cpu_cores;
    uint64_t nvme;           /* bytes */
    double nvme_read_bw, nvme_write_bw; /* bytes/s: the drive's datasheet sequential rates */
    double net_bw;           /* bytes/s per GPU to other nodes */
} plan_host_spec;

const plan_gpu_spec *plan_gpu_presets(size_t *count);
const plan_host_spec *plan_host_presets(size_t *count);

/* By name or alias, as plan_hw_find; a miss names the closest presets. */
zo_status plan_gpu_find(const char *name, const plan_gpu_spec **out);
zo_status plan_host_find(const char *name, const plan_host_spec **out);

/* One node of `gpu` in `host` (NULL: the GPU's usual host); one GPU, named
 * "<gpu>" or "<gpu>+<host>" when the host is not the usual one. */
void plan_hw_gpu_node(const plan_gpu_spec *gpu, const plan_host_spec *host, plan_hw *out);

/* Achieved host<->device bandwidth (bytes/s, each direction) of a PCIe link:
 * about 12, 25 and 50 GB/s at x16 for generations 3, 4 and 5. */
double plan_pcie_bw(int gen, int lanes);

/* "gen4x16", "4x8", "4.0 x16", "gen5" (lanes: `default_lanes`). */
zo_status plan_pcie_parse(const char *s, int default_lanes, int *gen, int *lanes);

/* Ranks that share one node's CPU memory and NVMe. */
int plan_hw_ranks_per_node(const plan_hw *hw);

/* AdamW parameters/s of one node's CPUs: cpu_adam_rate, or when that is 0
 * the node's memory bandwidth over the bytes one update moves. */
double plan_hw_cpu_adam_rate(const plan_hw *hw);

/* AdamW parameters/s of `threads` threads of one node: threads x the rate
 * of one thread (cpu_adam_thread_rate; when 0, cpu_adam_rate / cpu_cores
 * if cpu_adam_rate is given, else 5e8), at most plan_hw_cpu_adam_rate (the
 * memory-bandwidth roof, or the rate measured on every core). threads <= 0,
 * threads >= cpu_cores or no cores known: plan_hw_cpu_adam_rate. */
double plan_hw_cpu_adam_rate_threads(const plan_hw *hw, double threads);

/* The same for an update that moves `bytes` a parameter (ADAM_BYTES, 30, for
 * fp32 master, m and v with an fp32 gradient and a 16-bit weight out) and
 * whose instructions run at `compute` times the fp32 kernel's rate a thread
 * (8-bit state: 0.86, measured by bench_cpu_adam, docs/performance.md): the
 * roof scaled by 30 / bytes, the threads' rate by `compute`; the lower. */
double plan_hw_cpu_adam_rate_enc(const plan_hw *hw, double threads, double bytes, double compute);

/* Elements/s of a streaming pass over host memory that moves `bytes` an
 * element with trivial arithmetic (the runtime's gradient sums, cpu_adam's
 * adam_grad_accumulate) on `threads` threads of one node: a thread streams
 * the bytes a CPU AdamW thread does (cpu_adam_thread_rate x 30 bytes, as
 * plan_hw_cpu_adam_rate_threads' one thread), the node at most 70% of its
 * memory bandwidth (cpu_mem_bw). threads <= 0: that roof. */
double plan_hw_host_stream_rate(const plan_hw *hw, double threads, double bytes);

/* The CPU backend as a machine, to set the planner's prediction beside the
 * runtime's measured step on it (docs/memplan.md, "The CPU backend as
 * hardware"): `host` is this host's profile (memplan calibrate: memory,
 * cores, triad bandwidth, AdamW rates, NVMe); its "GPU" is the same CPU with
 * `dev_mem` bytes of device memory, computing every matmul at `flops` (the
 * CPU backend's measured rate on its compute threads: gemm_eff_max 1, no size
 * curve) and elementwise work at the triad's bandwidth, copying to and from
 * the host at `copy_bw` (memcpy). One GPU, one node. */
void plan_hw_cpu_backend(const plan_hw *host, double flops, double copy_bw, uint64_t dev_mem,
                         plan_hw *out);

/* The matmul rate assumed of one core of the CPU backend (fp32 GEMM with
 * OpenMP and AVX2/AVX-512 on a few hundred rows): `--hw cpu` plans with
 * cores x this. memplan calibrate measures a host's real figures. */
#define PLAN_CPU_BACKEND_CORE_FLOPS 2e10

/* `memplan --hw cpu [--host NAME]`: plan_hw_cpu_backend of a host preset
 * (`host`; NULL: the desktop), for `train --device cpu`: its matmuls at
 * PLAN_CPU_BACKEND_CORE_FLOPS a core, copies at half the host memory's
 * bandwidth, as much device memory as the host has (train --device-mem,
 * memplan --gpu-mem, sets the capacity). Named "cpu". */
void plan_hw_cpu_host(const plan_host_spec *host, plan_hw *out);

/* 1 when `hw` is the CPU backend (plan_hw_cpu_backend, --hw cpu): no CUDA
 * context, no cuBLAS workspace, an allocator that keeps no slack
 * (plan_train_fit_hw). */
int plan_hw_is_cpu_backend(const plan_hw *hw);

/* Bytes/s each GPU of a node reaches its peers with in a collective over
 * the GPUs of one node (before coll_eff): nvlink_bw (NVLink, or PCIe
 * peer-to-peer), or through host memory, where each byte is written by one
 * GPU and read by another and every GPU of the node sends and receives at
 * once, so the host's memory carries 2 x ranks flows (NVIDIA/nccl#1639: "On
 * PCI systems, the performance you get is usually determined by the
 * bandwidth your CPU and memory can deliver"): the host memory's achieved
 * bandwidth over 2 x ranks on the node, at most the PCIe link. */
double plan_hw_peer_bw(const plan_hw *hw);

/* This runtime's kernels on `hw`'s GPU (by its label, plan_hw.gpu: a
 * machine preset, a GPU preset, or a profile or plan file of either);
 * NULL where they were not measured. */
const plan_kernels *plan_hw_kernels(const plan_hw *hw);

/* Matmul efficiency (fraction of peak) of one operation of `flops`:
 * gemm_eff_max * flops / (flops + gemm_flops_half). */
double plan_hw_gemm_eff(const plan_hw *hw, double flops);

#endif
