#include "hardware.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024ull * 1024)
#define GIB (1024ull * MIB)
#define GBs 1e9
#define TF 1e12

/* The cost model's constants (docs/memplan.md, "Time"). The matmul curve
 * eff(F) = eff_max * F / (F + F_half) is set from public cuBLAS GEMM
 * measurements per GPU generation (square bf16/fp16 GEMMs of 512..8192); the
 * A100 values were then tuned on the development set (Korthikanti et al.
 * 2022, Tables 4 and 5) together with hbm_eff and coll_eff, which all GPUs
 * share. Latencies are NCCL's per-step figures. */
#define V100_EFF 0.72
#define V100_HALF 0.6e9
#define A100_EFF 0.77
#define A100_HALF 1.3e9
#define H100_EFF 0.65 /* (with F_half 4.0 GFLOP at 989 TFLOPS; the H100 PCIe takes 4.2 us x its peak) */
/* The SXM H100 and H200 (GH100 at 989 TFLOPS), measured: the runtime's
 * gpu_gemm ran the LLaMA-2-13B layer's GEMMs at 8192 rows (4.3e11 to
 * 2.7e12 FLOPs) at 761-809 TFLOP/s, 0.77-0.82 of peak, on an NVIDIA H100
 * 80GB HBM3 (train --profile, 2026-11-26; docs/memplan.md, "This runtime's
 * kernels"): eff_max 0.81, F_half 10 GFLOP, fitted to those ten shapes by
 * their time (log error). The H200's bench_gpu_cuda gave the same figures
 * as the H100's at 4096 rows (mean 0.69 of peak on both). The H100 PCIe
 * keeps the public curve above. */
#define H100_SXM_EFF 0.81
#define H100_SXM_HALF 1.0e10
#define COMMON_COST .hbm_eff = 0.85, .coll_eff = 0.80, .nvlink_lat = 6e-6, .net_lat = 12e-6

/* A machine preset's GPU: its name, the memory the driver reports
 * (nvidia-smi, MiB: 81559 for an H100-80GB), HBM GB/s, dense tensor TFLOPS
 * (16-bit with fp32 accumulation, and TF32), NVLink and PCIe GB/s per
 * direction, the PCIe generation (x16) and its generation's matmul curve. */
#define GPU(name, mib, hbm, tf16, tf32, nvlink, pcie, gen, eff, half)                              \
    .gpu = name, .gpu_mem = (mib) * MIB, .hbm_bw = (hbm) * GBs, .peak_flops_16 = (tf16) * TF,      \
    .peak_flops_32 = (tf32) * TF, .nvlink_bw = (nvlink) * GBs, .pcie_bw = (pcie) * GBs,            \
    .pcie_gen = (gen), .pcie_lanes = 16, .gemm_eff_max = (eff), .gemm_flops_half = (half), COMMON_COST
#define V100 GPU("V100-32GB", 32768, 900, 125, 15.7, 150, 12, 3, V100_EFF, V100_HALF)
#define A100_40 GPU("A100-40GB", 40960, 1555, 312, 156, 300, 25, 4, A100_EFF, A100_HALF)
#define A100_80 GPU("A100-80GB", 81920, 2039, 312, 156, 300, 25, 4, A100_EFF, A100_HALF)
#define H100 GPU("H100-80GB", 81559, 3350, 989, 495, 450, 55, 5, H100_SXM_EFF, H100_SXM_HALF)
#define H200 GPU("H200-141GB", 143771, 4800, 989, 495, 450, 55, 5, H100_SXM_EFF, H100_SXM_HALF)

static const plan_hw_preset presets[] = {
    /* One GPU with an eighth of its DGX host (a single-GPU server). */
    {"v100-32gb", "v100", "1x V100-32GB, 64 GiB RAM, 1.92 TB NVMe",
     {.name = "v100-32gb", V100, .gpus = 1, .gpus_per_node = 1, .cpu_mem = 64 * GIB,
      .nvme = 1920000000000ull, .nvme_read_bw = 3 * GBs, .nvme_write_bw = 2 * GBs,
      .net_bw = 12.5 * GBs, .cpu_mem_bw = 30 * GBs, .cpu_cores = 5}},
    {"a100-40gb", "a100", "1x A100-40GB, 128 GiB RAM, 1.92 TB NVMe",
     {.name = "a100-40gb", A100_40, .gpus = 1, .gpus_per_node = 1, .cpu_mem = 128 * GIB,
      .nvme = 1920000000000ull, .nvme_read_bw = 3 * GBs, .nvme_write_bw = 2 * GBs,
      .net_bw = 25 * GBs, .cpu_mem_bw = 50 * GBs, .cpu_cores = 16}},
    {"a100-80gb", "", "1x A100-80GB, 256 GiB RAM, 3.84 TB NVMe",
     {.name = "a100-80gb", A100_80, .gpus = 1, .gpus_per_node = 1, .cpu_mem = 256 * GIB,
      .nvme = 3840000000000ull, .nvme_read_bw = 6 * GBs, .nvme_write_bw = 3 * GBs,
      .net_bw = 25 * GBs, .cpu_mem_bw = 50 * GBs, .cpu_cores = 16}},
    {"h100-80gb", "h100,h100-sxm", "1x H100-80GB SXM, 256 GiB RAM, 3.84 TB NVMe",
     {.name = "h100-80gb", H100, .gpus = 1, .gpus_per_node = 1, .cpu_mem = 256 * GIB,
      .nvme = 3840000000000ull, .nvme_read_bw = 6.5 * GBs, .nvme_write_bw = 3.5 * GBs,
      .net_bw = 50 * GBs, .cpu_mem_bw = 75 * GBs, .cpu_cores = 14}},
    {"h200-141gb", "h200", "1x H200-141GB SXM, 256 GiB RAM, 3.84 TB NVMe",
     {.name = "h200-141gb", H200, .gpus = 1, .gpus_per_node = 1, .cpu_mem = 256 * GIB,
      .nvme = 3840000000000ull, .nvme_read_bw = 6.5 * GBs, .nvme_write_bw = 3.5 * GBs,
      .net_bw = 50 * GBs, .cpu_mem_bw = 75 * GBs, .cpu_cores = 14}},
    /* DGX nodes: 8 GPUs (16 for DGX-2), NVLink/NVSwitch inside, InfiniBand out. */
    {"dgx1-v100", "dgx-1", "8x V100-32GB, 512 GiB RAM, 7.68 TB NVMe, 4x100 Gb/s IB",
     {.name = "dgx1-v100", V100, .gpus = 8, .gpus_per_node = 8, .cpu_mem = 512 * GIB,
      .nvme = 7680000000000ull, .nvme_read_bw = 10 * GBs, .nvme_write_bw = 6 * GBs,
      .net_bw = 6.25 * GBs, .cpu_mem_bw = 150 * GBs, .cpu_cores = 40}},
    {"dgx2-v100", "dgx-2", "16x V100-32GB, 1.5 TiB RAM, 30.72 TB NVMe, 8x100 Gb/s IB",
     {.name = "dgx2-v100", V100, .gpus = 16, .gpus_per_node = 16, .cpu_mem = 1536 * GIB,
      .nvme = 30720000000000ull, .nvme_read_bw = 25 * GBs, .nvme_write_bw = 12 * GBs,
      .net_bw = 6.25 * GBs, .cpu_mem_bw = 200 * GBs, .cpu_cores = 48}},
    {"dgx-a100-40gb", "dgx-a100-40", "8x A100-40GB, 1 TiB RAM, 15.36 TB NVMe, 8x200 Gb/s IB",
     {.name = "dgx-a100-40gb", A100_40, .gpus = 8, .gpus_per_node = 8, .cpu_mem = 1024 * GIB,
      .nvme = 15360000000000ull, .nvme_read_bw = 25 * GBs, .nvme_write_bw = 12 * GBs,
      .net_bw = 25 * GBs, .cpu_mem_bw = 300 * GBs, .cpu_cores = 128}},
    {"dgx-a100-80gb", "dgx-a100,dgx-a100-80", "8x A100-80GB, 2 TiB RAM, 30.72 TB NVMe, 8x200 Gb/s IB",
     {.name = "dgx-a100-80gb", A100_80, .gpus = 8, .gpus_per_node = 8, .cpu_mem = 2048 * GIB,
      .nvme = 30720000000000ull, .nvme_read_bw = 25 * GBs, .nvme_write_bw = 12 * GBs,
      .net_bw = 25 * GBs, .cpu_mem_bw = 300 * GBs, .cpu_cores = 128}},
    {"dgx-h100", "dgx-h100-80gb", "8x H100-80GB, 2 TiB RAM, 30.72 TB NVMe, 8x400 Gb/s IB",
     {.name = "dgx-h100", H100, .gpus = 8, .gpus_per_node = 8, .cpu_mem = 2048 * GIB,
      .nvme = 30720000000000ull, .nvme_read_bw = 50 * GBs, .nvme_write_bw = 25 * GBs,
      .net_bw = 50 * GBs, .cpu_mem_bw = 450 * GBs, .cpu_cores = 112}},
    {"dgx-h200", "dgx-h200-141gb", "8x H200-141GB, 2 TiB RAM, 30.72 TB NVMe, 8x400 Gb/s IB",
     {.name = "dgx-h200", H200, .gpus = 8, .gpus_per_node = 8, .cpu_mem = 2048 * GIB,
      .nvme = 30720000000000ull, .nvme_read_bw = 50 * GBs, .nvme_write_bw = 25 * GBs,
      .net_bw = 50 * GBs, .cpu_mem_bw = 450 * GBs, .cpu_cores = 112}},
};

/* ---- GPU presets: one GPU in a host of its class ------------------------------------
 *
 * Each figure is the datasheet's (docs/memplan.md, "GPU presets", names the
 * document and the table): memory is what the driver reports (nvidia-smi),
 * tensor rates are dense. Training multiplies fp16/bf16 with fp32
 * accumulation; GeForce cards run that at half their fp16-accumulate rate,
 * so tensor_16 is the fp32-accumulate figure everywhere. */

/* What a streaming loop reaches of the host's memory bandwidth (STREAM-like):
 * CPU AdamW, and GPUs exchanging through host memory. */
#define HOST_MEM_EFF 0.7

/* Half-efficiency matmul size over peak: 4.8, 4.2 and 4.0 us for the V100,
 * A100 and H100 curves above; new presets take 4.2 us x their peak. */
#define HALF_S 4.2e-6
/* Generations whose GEMMs were not measured for this model take the A100's
 * (the tuned) efficiency; Hopper PCIe takes the H100's. */
#define GA10X_EFF A100_EFF
#define ADA_EFF A100_EFF
#define GB20X_EFF A100_EFF

/* This runtime's kernels on an NVIDIA H100 80GB HBM3, from one QLoRA step
 * of LLaMA-2-13B (r 16 on all-linear, 4 x 2048 tokens, bf16; train
 * --profile, 2026-11-26, that run's 13b.log, not kept; docs/memplan.md, "This
 * runtime's kernels", has the table) and bench_gpu_cuda's attention rows of
 * the same machine:
 * - attention, GEMM path, b 4 t 2048 40 heads d 128: forward 137.28 ms for
 *   40 calls (50.06 TFLOP/s), backward with fp32 output gradients 638.43 ms
 *   (26.91); the bench at t 2048 and 4096 gave 50.6 / 48.5 forward, 27.4 /
 *   30.0 backward (fp32 gradients);
 * - the flash kernel, the bench only (t 2048 and 4096): 5.4 / 5.3 forward,
 *   4.6 / 4.7 backward: their means. The runtime takes it for t < 256,
 *   where nothing measured it: extrapolated;
 * - elementwise (RMSNorm, SwiGLU, RoPE, residual adds, the backward's casts
 *   of fp32 gradients to the GEMMs' 16-bit operand): 274.731 ms for the
 *   bytes cost.c counts, 40 layers x 8192 rows x 998,400 bytes: 0.3555 of
 *   3350 GB/s;
 * - the LoRA GEMMs (r 16): 147.996 ms for 40 x 8192 x 960,512 bytes:
 *   0.6348;
 * - NF4 dequantization: 139.688 ms for 80 x 317,194,240 parameters:
 *   1.8166e11 parameters/s (13.7% of HBM's bytes: not memory-bound).
 * The tensor-core attention (attention_tc.cu) from the third GPU run's
 * profiles on an H200 (the same GH100 at the same clocks; b 8, t 1024,
 * bf16, docs/performance.md, "The third GPU run"): GPT-2's 12 heads of 64,
 * forward 41.6 and backward 18.6 TFLOP/s; the 1.35B LLaMA's heads of 128,
 * 31.7 and 10.5 (head dims 80 and 96 take 128's: not measured).
 * The mma.sync attention (attention_mma.cu) from bench_gpu_cuda on the
 * H100 (2026-11-27, the fifth GPU run's bench.log): LLaMA-2-13B's 40 heads
 * of 128, causal, bf16, at b 2 t 2048 and b 1 t 4096: forward 141.6 and
 * 159.7, backward with fp32 output gradients (the transformer's) 32.7 and
 * 35.5: their means. Head dim 64 was not measured: it takes 128's, the
 * same kernel design (the next GPU run's bench times GPT-2's shape); nor
 * was 256 (Gemma's): it takes 128's too, likely high (32-row tiles, the
 * scores computed by two warps; the bench times Gemma-2-9B's shape).
 * The H200 (the same GH100 at the same clocks, faster HBM) takes the same
 * figures, the tensor-core and mma.sync kernels' as the rest; the
 * bandwidth fractions give it its faster memory. The other GPUs have none
 * of this runtime's figures (FlashAttention at 0.75 of the curve). */
static const plan_kernels kernels_gh100 = {
    .attn_gemm_fwd = 50.06 * TF, .attn_gemm_bwd = 26.91 * TF,
    .attn_flash_fwd = 5.35 * TF, .attn_flash_bwd = 4.65 * TF,
    .attn_tc_fwd = {41.6 * TF, 31.7 * TF}, .attn_tc_bwd = {18.6 * TF, 10.5 * TF},
    .attn_mma_fwd = {150.65 * TF, 150.65 * TF}, .attn_mma_bwd = {34.1 * TF, 34.1 * TF},
    .ew_eff = 40 * 8192 * 998400.0 / (274.731e-3 * 3350 * GBs),
    .lora_eff = 40 * 8192 * 960512.0 / (147.996e-3 * 3350 * GBs),
    .nf4_rate = 80 * 317194240.0 / 139.688e-3,
    .source = "H100 80GB HBM3, train --profile and bench_gpu_cuda, 2026-11-26 and -27",
};

static const plan_gpu_spec gpu_presets[] = {
    {"rtx-3090", "3090,geforce-rtx-3090", "RTX-3090-24GB", "GeForce RTX 3090 (Ampere, GA102)",
     "desktop", 24576 * MIB, 71 * TF, 142 * TF, 35.6 * TF, 936 * GBs, 4, 16, 0,
     PLAN_PEERS_HOST, GA10X_EFF, 0, NULL},
    {"rtx-4090", "4090,geforce-rtx-4090", "RTX-4090-24GB", "GeForce RTX 4090 (Ada, AD102)",
     "desktop", 24564 * MIB, 165.2 * TF, 330.3 * TF, 82.6 * TF, 1008 * GBs, 4, 16, 0,
     PLAN_PEERS_HOST, ADA_EFF, 0, NULL},
    {"rtx-5090", "5090,geforce-rtx-5090", "RTX-5090-32GB", "GeForce RTX 5090 (Blackwell, GB202)",
     "desktop", 32607 * MIB, 209.5 * TF, 419 * TF, 104.8 * TF, 1792 * GBs, 5, 16, 0,
     PLAN_PEERS_HOST, GB20X_EFF, 0, NULL},
    {"rtx-a6000", "a6000", "RTX-A6000-48GB", "RTX A6000 (Ampere, GA102)", "workstation",
     49140 * MIB, 154.8 * TF, 154.8 * TF, 77.4 * TF, 768 * GBs, 4, 16, 0,
     PLAN_PEERS_PCIE, GA10X_EFF, 0, NULL},
    {"rtx-6000-ada", "6000-ada", "RTX-6000-Ada-48GB", "RTX 6000 Ada Generation (AD102)",
     "workstation", 49140 * MIB, 364.2 * TF, 364.2 * TF, 182.1 * TF, 960 * GBs, 4, 16, 0,
     PLAN_PEERS_PCIE, ADA_EFF, 0, NULL},
    {"l4", "nvidia-l4", "L4-24GB", "L4 (Ada, AD104)", "server", 23034 * MIB, 121 * TF, 121 * TF,
     60 * TF, 300 * GBs, 4, 16, 0, PLAN_PEERS_PCIE, ADA_EFF, 0, NULL},
    {"l40s", "nvidia-l40s", "L40S-48GB", "L40S (Ada, AD102)", "server", 46068 * MIB, 362.05 * TF,
     362.05 * TF, 183 * TF, 864 * GBs, 4, 16, 0, PLAN_PEERS_PCIE, ADA_EFF, 0, NULL},
    {"a10g", "nvidia-a10g", "A10G-24GB", "A10G (Ampere, GA102; AWS G5)", "server", 23028 * MIB,
     70 * TF, 0, 35 * TF, 600 * GBs, 4, 16, 0, PLAN_PEERS_PCIE, GA10X_EFF, 0, NULL},
    {"a100-40gb-pcie", "a100-pcie-40gb,a100-pcie", "A100-40GB-PCIe", "A100 40GB PCIe (GA100)",
     "server", 40960 * MIB, 312 * TF, 312 * TF, 156 * TF, 1555 * GBs, 4, 16, 0,
     PLAN_PEERS_PCIE, A100_EFF, A100_HALF, NULL},
    {"a100-80gb-pcie", "a100-pcie-80gb", "A100-80GB-PCIe", "A100 80GB PCIe (GA100)", "server",
     81920 * MIB, 312 * TF, 312 * TF, 156 * TF, 1935 * GBs, 4, 16, 0,
     PLAN_PEERS_PCIE, A100_EFF, A100_HALF, NULL},
    {"h100-pcie", "h100-80gb-pcie,h100-pcie-80gb", "H100-80GB-PCIe", "H100 PCIe (Hopper, GH100)",
     "server", 81559 * MIB, 756 * TF, 756 * TF, 378 * TF, 2000 * GBs, 5, 16, 0,
     PLAN_PEERS_PCIE, H100_EFF, 0, NULL},
    /* the SXM GPUs of the presets above, for --gpu */
    {"v100-32gb", "v100,v100-sxm2", "V100-32GB", "V100 SXM2 32GB (Volta, GV100)", "server",
     32768 * MIB, 125 * TF, 125 * TF, 15.7 * TF, 900 * GBs, 3, 16, 150 * GBs,
     PLAN_PEERS_NVLINK, V100_EFF, V100_HALF, NULL},
    {"a100-40gb", "a100,a100-sxm4-40gb", "A100-40GB", "A100 40GB SXM4 (GA100)", "server",
     40960 * MIB, 312 * TF, 312 * TF, 156 * TF, 1555 * GBs, 4, 16, 300 * GBs,
     PLAN_PEERS_NVLINK, A100_EFF, A100_HALF, NULL},
    {"a100-80gb", "a100-sxm4-80gb", "A100-80GB", "A100 80GB SXM4 (GA100)", "server", 81920 * MIB,
     312 * TF, 312 * TF, 156 * TF, 2039 * GBs, 4, 16, 300 * GBs,
     PLAN_PEERS_NVLINK, A100_EFF, A100_HALF, NULL},
    {"h100-80gb", "h100,h100-sxm", "H100-80GB", "H100 SXM5 80GB (Hopper, GH100)", "server",
     81559 * MIB, 989 * TF, 989 * TF, 495 * TF, 3350 * GBs, 5, 16, 450 * GBs,
     PLAN_PEERS_NVLINK, H100_SXM_EFF, H100_SXM_HALF, &kernels_gh100},
    {"h200-141gb", "h200", "H200-141GB", "H200 SXM 141GB (Hopper, GH100)", "server",
     143771 * MIB, 989 * TF, 989 * TF, 495 * TF, 4800 * GBs, 5, 16, 450 * GBs,
     PLAN_PEERS_NVLINK, H100_SXM_EFF, H100_SXM_HALF, &kernels_gh100},
};

/* Hosts: memory bandwidth is channels x MT/s x 8 bytes (DDR5), NVMe the
 * drive's datasheet sequential rates (docs/memplan.md, "Hosts"). */
static const plan_host_spec host_presets[] = {
    {"desktop", "64 GiB DDR5-5600 (2 channels), 16 cores, 2 TB PCIe 4.0 NVMe, 10 GbE",
     64 * GIB, 89.6 * GBs, 16, 2000000000000ull, 7.45 * GBs, 6.9 * GBs, 1.25 * GBs},
    {"workstation", "256 GiB DDR5-4800 (8 channels), 32 cores, 4 TB PCIe 4.0 NVMe, 25 GbE",
     256 * GIB, 307.2 * GBs, 32, 4000000000000ull, 7.45 * GBs, 6.9 * GBs, 3.125 * GBs},
    {"server", "a GPU's share of a 4-GPU server: 256 GiB DDR5-4800 (4 channels), 24 cores, "
               "3.84 TB U.2 NVMe, 100 Gb/s",
     256 * GIB, 153.6 * GBs, 24, 3840000000000ull, 6.5 * GBs, 3.5 * GBs, 12.5 * GBs},
};

const plan_hw_preset *plan_hw_presets(size_t *count)
{
    *count = sizeof presets / sizeof presets[0];
    return presets;
}

const plan_gpu_spec *plan_gpu_presets(size_t *count)
{
    *count = sizeof gpu_presets / sizeof gpu_presets[0];
    return gpu_presets;
}

const plan_host_spec *plan_host_presets(size_t *count)
{
    *count = sizeof host_presets / sizeof host_presets[0];
    return host_presets;
}

static void norm(const char *s, char *o, size_t n)
{
    size_t j = 0;
    for (; *s && j + 1 < n; s++)
        if (!strchr("-_. ", *s)) o[j++] = (char)tolower((unsigned char)*s);
    o[j] = 0;
}

static int common_prefix(const char *a, const char *b)
{
    int k = 0;
    while (a[k] && a[k] == b[k]) k++;
    return k;
}

/* A table of names to look a word up in. */
typedef struct name_table {
    size_t n;
    const char *(*name)(size_t i);
    const char *(*aliases)(size_t i);
} name_table;

/* Whether `key` is name i's key or one of its aliases'. */
static int answers_to(const name_table *t, size_t i, const char *key)
{
    char cand[64], buf[128];
    zo_preset_key(t->name(i), cand, sizeof cand);
    if (!strcmp(cand, key)) return 1;
    snprintf(buf, sizeof buf, "%s", t->aliases(i));
    for (char *sv = NULL, *tok = strtok_r(buf, ",", &sv); tok; tok = strtok_r(NULL, ",", &sv)) {
        zo_preset_key(tok, cand, sizeof cand);
        if (!strcmp(cand, key)) return 1;
    }
    return 0;
}

/* The index of `want` in `t` (by zo_preset_key); -1 on a miss, with score[i]
 * how close name i is; -2 when two entries answer to it (the error says
 * which). */
static long match(const name_table *t, const char *want_raw, int *score)
{
    char want[64], cand[64], buf[128];
    zo_preset_key(want_raw ? want_raw : "", want, sizeof want);
    long found = -1;
    for (size_t i = 0; i < t->n; i++) {
        if (!answers_to(t, i, want)) continue;
        if (found >= 0) {
            zo_error(ZO_ERR_INVALID, "'%s' names two presets, %s and %s: give the full name",
                     want_raw, t->name((size_t)found), t->name(i));
            return -2;
        }
        found = (long)i;
    }
    if (found >= 0) return found;
    for (size_t i = 0; i < t->n; i++) {
        zo_preset_key(t->name(i), cand, sizeof cand);
        score[i] = common_prefix(cand, want) * 2 + (strstr(cand, want) ? 1 : 0);
        snprintf(buf, sizeof buf, "%s", t->aliases(i));
        for (char *sv = NULL, *tok = strtok_r(buf, ",", &sv); tok; tok = strtok_r(NULL, ",", &sv)) {
            zo_preset_key(tok, cand, sizeof cand);
            int sc = common_prefix(cand, want) * 2;
            if (sc > score[i]) score[i] = sc;
        }
    }
    return -1;
}

static const char *preset_name(size_t i) { return presets[i].name; }
static const char *preset_aliases(size_t i) { return presets[i].aliases; }
static const char *gpu_name(size_t i) { return gpu_presets[i].name; }
static const char *gpu_aliases(size_t i) { return gpu_presets[i].aliases; }
static const char *host_name(size_t i) { return host_presets[i].name; }
static const char *no_aliases(size_t i) { (void)i; return ""; }

#define NPRESETS (sizeof presets / sizeof presets[0])
#define NGPUS (sizeof gpu_presets / sizeof gpu_presets[0])
#define NHOSTS (sizeof host_presets / sizeof host_presets[0])
static const name_table node_table = {NPRESETS, preset_name, preset_aliases};
static const name_table gpu_table = {NGPUS, gpu_name, gpu_aliases};
static const name_table host_table = {NHOSTS, host_name, no_aliases};

/* The three closest names over one or two tables, best first; a name both
 * tables hold (a machine and its GPU: h100-80gb) once. */
static void closest(const name_table *a, int *sa, const name_table *b, int *sb, char *hint,
                    size_t len)
{
    hint[0] = '\0';
    const char *said[3];
    for (int k = 0; k < 3;) {
        const name_table *bt = NULL;
        int *bs = NULL;
        size_t bi = 0;
        for (int w = 0; w < 2; w++) {
            const name_table *t = w ? b : a;
            int *sc = w ? sb : sa;
            for (size_t i = 0; t && i < t->n; i++)
                if (sc[i] >= 0 && (!bs || sc[i] > bs[bi])) bt = t, bs = sc, bi = i;
        }
        if (!bs) return;
        bs[bi] = -1;
        const char *nm = bt->name(bi);
        int again = 0;
        for (int q = 0; q < k; q++) again |= !strcmp(said[q], nm);
        if (again) continue;
        said[k++] = nm;
        size_t u = strlen(hint);
        snprintf(hint + u, len - u, "%s%s", u ? ", " : "", nm);
    }
}

zo_status plan_hw_find(const char *name, plan_hw *out)
{
    int sn[NPRESETS], sg[NGPUS];
    /* a machine first: the SXM GPUs' presets share its names (--gpu NAME is the card) */
    long i = match(&node_table, name, sn);
    if (i == -2) return ZO_ERR_INVALID;
    if (i >= 0) {
        *out = presets[i].hw;
        return ZO_OK;
    }
    long g = match(&gpu_table, name, sg);
    if (g == -2) return ZO_ERR_INVALID;
    if (g >= 0) {
        plan_hw_gpu_node(&gpu_presets[g], NULL, out);
        return ZO_OK;
    }
    char hint[192];
    closest(&node_table, sn, &gpu_table, sg, hint, sizeof hint);
    return zo_error(ZO_ERR_NOT_FOUND,
                    "unknown hardware '%s'; closest presets: %s ('memplan hardware' lists all)",
                    name ? name : "", hint);
}

/* The index of `name` in `t`, or -1 with a message naming the closest. */
static long find_named(const name_table *t, const char *name, const char *what)
{
    int sc[NPRESETS + NGPUS + NHOSTS];
    long i = match(t, name, sc);
    if (i >= 0 || i == -2) return i;
    char hint[192];
    closest(t, sc, NULL, NULL, hint, sizeof hint);
    zo_error(ZO_ERR_NOT_FOUND, "%s '%s'; closest: %s ('memplan hardware' lists all)", what,
             name ? name : "", hint);
    return -1;
}

zo_status plan_gpu_find(const char *name, const plan_gpu_spec **out)
{
    long i = find_named(&gpu_table, name, "--gpu: unknown GPU");
    if (i < 0) return i == -2 ? ZO_ERR_INVALID : ZO_ERR_NOT_FOUND;
    *out = &gpu_presets[i];
    return ZO_OK;
}

zo_status plan_host_find(const char *name, const plan_host_spec **out)
{
    long i = find_named(&host_table, name, "--host: unknown host");
    if (i < 0) return i == -2 ? ZO_ERR_INVALID : ZO_ERR_NOT_FOUND;
    *out = &host_presets[i];
    return ZO_OK;
}

void plan_hw_gpu_node(const plan_gpu_spec *g, const plan_host_spec *h, plan_hw *o)
{
    const plan_host_spec *usual = NULL;
    for (size_t i = 0; i < NHOSTS; i++)
        if (!strcmp(host_presets[i].name, g->host)) usual = &host_presets[i];
    if (!h) h = usual;
    memset(o, 0, sizeof *o);
    if (h == usual) snprintf(o->name, sizeof o->name, "%s", g->name);
    else snprintf(o->name, sizeof o->name, "%s+%s", g->name, h->name);
    snprintf(o->gpu, sizeof o->gpu, "%s", g->label);
    o->gpus = o->gpus_per_node = 1;
    o->gpu_mem = g->mem;
    o->hbm_bw = g->mem_bw;
    o->peak_flops_16 = g->tensor_16;
    o->peak_flops_32 = g->tensor_32;
    o->pcie_gen = g->pcie_gen;
    o->pcie_lanes = g->pcie_lanes;
    o->pcie_bw = plan_pcie_bw(g->pcie_gen, g->pcie_lanes);
    /* without NVLink, peers talk over PCIe: directly, or through host memory */
    o->nvlink_bw = g->nvlink_bw > 0 ? g->nvlink_bw : o->pcie_bw;
    o->peers_via_host = g->peers == PLAN_PEERS_HOST;
    o->gemm_eff_max = g->gemm_eff_max;
    o->gemm_flops_half = g->gemm_flops_half > 0 ? g->gemm_flops_half : HALF_S * g->tensor_16;
    o->hbm_eff = 0.85;
    o->coll_eff = 0.80;
    o->nvlink_lat = 6e-6;
    o->net_lat = 12e-6;
    o->cpu_mem = h->cpu_mem;
    o->cpu_mem_bw = h->cpu_mem_bw;
    o->cpu_cores = h->cpu_cores;
    o->nvme = h->nvme;
    o->nvme_read_bw = h->nvme_read_bw;
    o->nvme_write_bw = h->nvme_write_bw;
    o->net_bw = h->net_bw;
}

/* Pinned host<->device copies reach about 12 and 25 GB/s over x16 links of
 * generations 3 and 4 (76-79% of 15.75 and 31.5 GB/s raw), and 55 over
 * generation 5 (88% of 63: 256 MiB pinned copies on an H200 measured 55.47
 * GB/s to the device and 55.45 back, bench_gpu_cuda, 2026-11-26), as the
 * presets above assume; narrower links scale by their lanes. */
double plan_pcie_bw(int gen, int lanes)
{
    static const double x16[] = {0, 2 * GBs, 4 * GBs, 12 * GBs, 25 * GBs, 55 * GBs, 100 * GBs};
    if (gen < 1 || gen > 6 || lanes < 1) return 0;
    return x16[gen] * lanes / 16.0;
}

zo_status plan_pcie_parse(const char *s, int default_lanes, int *gen, int *lanes)
{
    char t[32];
    norm(s ? s : "", t, sizeof t); /* "gen4x16", "40x16", "4x8" */
    const char *p = t;
    if (!strncmp(p, "gen", 3)) p += 3;
    else if (!strncmp(p, "pcie", 4)) p += 4;
    if (!strncmp(p, "gen", 3)) p += 3;
    int g = 0, l = default_lanes;
    if (*p < '1' || *p > '6') goto bad;
    g = *p++ - '0';
    if (*p == '0') p++; /* "4.0" */
    if (*p == 'x') {
        char *end;
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1 || *end || (v != 1 && v != 2 && v != 4 && v != 8 && v != 16)) goto bad;
        l = (int)v;
    } else if (*p) {
        goto bad;
    }
    *gen = g;
    *lanes = l;
    return ZO_OK;
bad:
    return zo_error(ZO_ERR_INVALID, "--pcie: '%s' is not a PCIe link such as gen4x16, gen3x8 or "
                                    "gen5 (generation 1-6, lanes 1, 2, 4, 8 or 16)",
                    s ? s : "");
}

int plan_hw_ranks_per_node(const plan_hw *hw)
{
    return hw->gpus < hw->gpus_per_node ? hw->gpus : hw->gpus_per_node;
}

/* One AdamW update reads and writes the fp32 master, m and v (24 bytes),
 * reads an fp32 gradient (4) and writes the 16-bit weight (2); a vectorized
 * update reaches about 70% of the memory bandwidth (STREAM-like). */
#define ADAM_BYTES 30.0
#define ADAM_BW_EFF HOST_MEM_EFF

double plan_hw_cpu_adam_rate(const plan_hw *hw)
{
    if (hw->cpu_adam_rate > 0) return hw->cpu_adam_rate;
    return hw->cpu_mem_bw * ADAM_BW_EFF / ADAM_BYTES;
}

/* One AVX-512 thread of AdamW over fp32 master, m, v with a 16-bit gradient
 * and weight out: cpu_adam's adam_update measured 0.55e9 elements/s per
 * thread on this project's 2-core VM (docs/memplan.md, "Optimizer schedules"). */
#define ADAM_THREAD_RATE 5e8

double plan_hw_cpu_adam_rate_threads(const plan_hw *hw, double threads)
{
    double roof = plan_hw_cpu_adam_rate(hw);
    /* every core: the node's rate itself (measured on all of them) */
    if (threads <= 0 || hw->cpu_cores <= 0 || threads >= hw->cpu_cores) return roof;
    double one = hw->cpu_adam_thread_rate > 0 ? hw->cpu_adam_thread_rate
                 : hw->cpu_adam_rate > 0      ? hw->cpu_adam_rate / hw->cpu_cores
                                              : ADAM_THREAD_RATE;
    double r = threads * one;
    return r < roof ? r : roof;
}

double plan_hw_cpu_adam_rate_enc(const plan_hw *hw, double threads, double bytes, double compute)
{
    double roof = plan_hw_cpu_adam_rate(hw) * (bytes > 0 ? ADAM_BYTES / bytes : 1);
    double one = hw->cpu_adam_thread_rate > 0 ? hw->cpu_adam_thread_rate
                 : hw->cpu_adam_rate > 0      ? hw->cpu_adam_rate / (hw->cpu_cores > 0 ? hw->cpu_cores : 1)
                                              : ADAM_THREAD_RATE;
    double n = threads > 0 && hw->cpu_cores > 0 && threads < hw->cpu_cores ? threads
               : hw->cpu_cores > 0                                          ? hw->cpu_cores
                                                                            : 0;
    /* (no cores known: the roof alone, as plan_hw_cpu_adam_rate_threads) */
    if (n <= 0) return roof;
    double r = n * one * compute;
    /* the fp32 rate on every core is the roof itself (measured there) */
    if (compute >= 1 && bytes >= ADAM_BYTES && n >= hw->cpu_cores) return roof;
    return r < roof ? r : roof;
}

double plan_hw_host_stream_rate(const plan_hw *hw, double threads, double bytes)
{
    double roof = hw->cpu_mem_bw * HOST_MEM_EFF / bytes;
    double one = hw->cpu_adam_thread_rate > 0 ? hw->cpu_adam_thread_rate
                 : hw->cpu_adam_rate > 0      ? hw->cpu_adam_rate / (hw->cpu_cores > 0 ? hw->cpu_cores : 1)
                                              : ADAM_THREAD_RATE;
    if (threads <= 0 || roof <= 0) return roof > 0 ? roof : threads * one * ADAM_BYTES / bytes;
    double r = threads * one * ADAM_BYTES / bytes;
    return r < roof ? r : roof;
}

void plan_hw_cpu_backend(const plan_hw *host, double flops, double copy_bw, uint64_t dev_mem,
                         plan_hw *out)
{
    *out = *host;
    snprintf(out->name, sizeof out->name, "cpu-backend");
    snprintf(out->gpu, sizeof out->gpu, "CPU");
    out->gpus = out->gpus_per_node = 1;
    out->gpu_mem = dev_mem;
    out->peak_flops_16 = out->peak_flops_32 = flops;
    out->gemm_eff_max = 1;
    out->gemm_flops_half = 0;
    out->hbm_bw = host->cpu_mem_bw;
    out->hbm_eff = 1;
    out->pcie_bw = copy_bw;
    out->pcie_gen = out->pcie_lanes = 0;
    snprintf(out->note, sizeof out->note, "the CPU backend: compute %.3g FLOP/s, copies %.3g B/s",
             flops, copy_bw);
}

void plan_hw_cpu_host(const plan_host_spec *host, plan_hw *out)
{
    plan_hw node;
    if (!host) plan_host_find("desktop", &host);
    plan_hw_gpu_node(&gpu_presets[0], host, &node);
    plan_hw_cpu_backend(&node, PLAN_CPU_BACKEND_CORE_FLOPS * (node.cpu_cores > 0 ? node.cpu_cores : 1),
                        node.cpu_mem_bw / 2, node.cpu_mem, out);
    snprintf(out->name, sizeof out->name, "cpu");
    snprintf(out->note, sizeof out->note,
             "train --device cpu on the %s host: matmuls at %.3g FLOP/s (%d cores, assumed), copies at %.3g B/s",
             host->name, out->peak_flops_16, out->cpu_cores, out->pcie_bw);
}

int plan_hw_is_cpu_backend(const plan_hw *hw) { return !strcmp(hw->gpu, "CPU"); }

const char *plan_peers_name(plan_peers p)
{
    return p ==
     PLAN_PEERS_NVLINK ? "NVLink" : p == PLAN_PEERS_PCIE ? "PCIe peer-to-peer" : "host memory";
}

double plan_hw_peer_bw(const plan_hw *hw)
{
    if (!hw->peers_via_host) return hw->nvlink_bw;
    double flows = 2.0 * plan_hw_ranks_per_node(hw);
    double host = hw->cpu_mem_bw * HOST_MEM_EFF / flows;
    return host < hw->pcie_bw ? host : hw->pcie_bw;
}

const plan_kernels *plan_hw_kernels(const plan_hw *hw)
{
    for (size_t i = 0; i < sizeof gpu_presets / sizeof gpu_presets[0]; i++)
        if (gpu_presets[i].kernels && !strcmp(gpu_presets[i].label, hw->gpu)) return gpu_presets[i].kernels;
    return NULL;
}

double plan_hw_gemm_eff(const plan_hw *hw, double flops)
{
    return hw->gemm_eff_max * flops / (flops + hw->gemm_flops_half);
}
