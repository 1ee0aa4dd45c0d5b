#include "hardware.h"

#include <ctype.h>
#include <stdio.h>
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
#define H100_EFF 0.65
#define H100_HALF 4.0e9
#define COMMON_COST .hbm_eff = 0.85, .coll_eff = 0.80, .nvlink_lat = 6e-6, .net_lat = 12e-6

/* GPU memory is the total the driver reports (nvidia-smi), e.g. 81559 MiB for
 * an H100-80GB. */
#define V100 .gpu = "V100-32GB", .gpu_mem = 32768 * MIB, .hbm_bw = 900 * GBs, \
    .peak_flops_16 = 125 * TF, .peak_flops_32 = 15.7 * TF, .nvlink_bw = 150 * GBs, .pcie_bw = 12 * GBs, \
    .gemm_eff_max = V100_EFF, .gemm_flops_half = V100_HALF, COMMON_COST
#define A100_40 .gpu = "A100-40GB", .gpu_mem = 40960 * MIB, .hbm_bw = 1555 * GBs, \
    .peak_flops_16 = 312 * TF, .peak_flops_32 = 156 * TF, .nvlink_bw = 300 * GBs, .pcie_bw = 25 * GBs, \
    .gemm_eff_max = A100_EFF, .gemm_flops_half = A100_HALF, COMMON_COST
#define A100_80 .gpu = "A100-80GB", .gpu_mem = 81920 * MIB, .hbm_bw = 2039 * GBs, \
    .peak_flops_16 = 312 * TF, .peak_flops_32 = 156 * TF, .nvlink_bw = 300 * GBs, .pcie_bw = 25 * GBs, \
    .gemm_eff_max = A100_EFF, .gemm_flops_half = A100_HALF, COMMON_COST
#define H100 .gpu = "H100-80GB", .gpu_mem = 81559 * MIB, .hbm_bw = 3350 * GBs, \
    .peak_flops_16 = 989 * TF, .peak_flops_32 = 495 * TF, .nvlink_bw = 450 * GBs, .pcie_bw = 50 * GBs, \
    .gemm_eff_max = H100_EFF, .gemm_flops_half = H100_HALF, COMMON_COST
#define H200 .gpu = "H200-141GB", .gpu_mem = 143771 * MIB, .hbm_bw = 4800 * GBs, \
    .peak_flops_16 = 989 * TF, .peak_flops_32 = 495 * TF, .nvlink_bw = 450 * GBs, .pcie_bw = 50 * GBs, \
    .gemm_eff_max = H100_EFF, .gemm_flops_half = H100_HALF, COMMON_COST

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
    {"dgx1-v100", "dgx-1,dgx1", "8x V100-32GB, 512 GiB RAM, 7.68 TB NVMe, 4x100 Gb/s IB",
     {.name = "dgx1-v100", V100, .gpus = 8, .gpus_per_node = 8, .cpu_mem = 512 * GIB,
      .nvme = 7680000000000ull, .nvme_read_bw = 10 * GBs, .nvme_write_bw = 6 * GBs,
      .net_bw = 6.25 * GBs, .cpu_mem_bw = 150 * GBs, .cpu_cores = 40}},
    {"dgx2-v100", "dgx-2,dgx2", "16x V100-32GB, 1.5 TiB RAM, 30.72 TB NVMe, 8x100 Gb/s IB",
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

const plan_hw_preset *plan_hw_presets(size_t *count)
{
    *count = sizeof presets / sizeof presets[0];
    return presets;
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

zo_status plan_hw_find(const char *name, plan_hw *out)
{
    char want[64], cand[64], buf[128];
    norm(name ? name : "", want, sizeof want);
    size_t n = sizeof presets / sizeof presets[0];
    int score[sizeof presets / sizeof presets[0]];
    for (size_t i = 0; i < n; i++) {
        norm(presets[i].name, cand, sizeof cand);
        if (!strcmp(cand, want)) goto found;
        score[i] = common_prefix(cand, want) * 2 + (strstr(cand, want) ? 1 : 0);
        snprintf(buf, sizeof buf, "%s", presets[i].aliases);
        for (char *sv = NULL, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
            norm(t, cand, sizeof cand);
            if (!strcmp(cand, want)) goto found;
            int sc = common_prefix(cand, want) * 2;
            if (sc > score[i]) score[i] = sc;
        }
        continue;
    found:
        *out = presets[i].hw;
        return ZO_OK;
    }
    char hint[160] = "";
    for (int k = 0; k < 3; k++) {
        size_t b = 0;
        for (size_t i = 1; i < n; i++)
            if (score[i] > score[b]) b = i;
        size_t u = strlen(hint);
        snprintf(hint + u, sizeof hint - u, "%s%s", k ? ", " : "", presets[b].name);
        score[b] = -1;
    }
    return zo_error(ZO_ERR_NOT_FOUND,
                    "unknown hardware '%s'; closest presets: %s ('memplan hardware' lists all)",
                    name ? name : "", hint);
}

int plan_hw_ranks_per_node(const plan_hw *hw)
{
    return hw->gpus < hw->gpus_per_node ? hw->gpus : hw->gpus_per_node;
}

/* One AdamW update reads and writes the fp32 master, m and v (24 bytes),
 * reads an fp32 gradient (4) and writes the 16-bit weight (2); a vectorized
 * update reaches about 70% of the memory bandwidth (STREAM-like). */
#define ADAM_BYTES 30.0
#define ADAM_BW_EFF 0.7

double plan_hw_cpu_adam_rate(const plan_hw *hw)
{
    if (hw->cpu_adam_rate > 0) return hw->cpu_adam_rate;
    return hw->cpu_mem_bw * ADAM_BW_EFF / ADAM_BYTES;
}

double plan_hw_gemm_eff(const plan_hw *hw, double flops)
{
    return hw->gemm_eff_max * flops / (flops + hw->gemm_flops_half);
}
