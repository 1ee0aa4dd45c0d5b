/* memplan models, memplan hardware: the presets, listed. */
#include <stdio.h>

#include "common/units.h"
#include "planner/memplan_cli.h"

int cmd_models(void)
{
    size_t n;
    const zo_model_preset *p = zo_model_presets(&n);
    printf("%-20s %-6s %6s %7s %6s %5s %7s %7s %6s %18s\n", "name", "arch", "layers", "hidden",
           "heads", "kv", "ffn", "vocab", "seq", "params");
    for (size_t i = 0; i < n; i++) {
        const zo_model_config *c = &p[i].cfg;
        char cnt[32];
        uint64_t np = zo_model_params(c);
        printf("%-20s %-6s %6d %7d %6d %5d %7d %7d %6d %18llu (%s)\n", p[i].name,
               zo_arch_name(c->arch), c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->ffn,
               c->vocab, c->max_seq, (unsigned long long)np, zo_format_count(np, cnt, sizeof cnt));
    }
    printf("\nAlso: --model PATH/config.json (Hugging Face), --params N, or a custom shape.\n");
    /* the config.json families by model_type: sized exactly, or refused */
    const zo_family_info *fi = zo_model_families(&n);
    printf("\nconfig.json families (model_type; * = the runtime trains it too):\n");
    for (size_t i = 0; i < n; i++)
        if (fi[i].modelled)
            printf("  %-16s%s %s\n", fi[i].model_type, fi[i].trainable ? "*" : " ", fi[i].what);
    printf("refused by name:\n");
    for (size_t i = 0; i < n; i++)
        if (!fi[i].modelled) printf("  %-17s %s\n", fi[i].model_type, fi[i].what);
    return 0;
}

int cmd_hardware(void)
{
    size_t n;
    const plan_hw_preset *p = plan_hw_presets(&n);
    printf("machines (--hw NAME):\n");
    printf("%-15s %-60s %10s %10s %9s %9s\n", "name", "summary", "GPU mem", "PCIe", "NVMe rd",
           "NVMe wr");
    for (size_t i = 0; i < n; i++) {
        char mem[32];
        printf("%-15s %-60s %10s %7.0f GB/s %5.1f GB/s %5.1f GB/s\n", p[i].name, p[i].summary,
               zo_format_bytes(p[i].hw.gpu_mem, mem, sizeof mem), p[i].hw.pcie_bw / 1e9,
               p[i].hw.nvme_read_bw / 1e9, p[i].hw.nvme_write_bw / 1e9);
    }
    const plan_gpu_spec *g = plan_gpu_presets(&n);
    printf("\nGPUs (--gpu NAME [--host NAME]; datasheet figures, dense; docs/memplan.md cites "
           "each):\n");
    printf("%-15s %-36s %10s %15s %10s %8s %10s %-11s\n", "name", "product", "memory",
           "bf16 TFLOPS*", "fp16acc16", "TF32", "mem GB/s", "PCIe, host, peers");
    for (size_t i = 0; i < n; i++) {
        char mem[32], acc16[16] = "-";
        if (g[i].tensor_16_acc16 > 0) snprintf(acc16, sizeof acc16, "%.4g", g[i].tensor_16_acc16 / 1e12);
        printf("%-15s %-36s %10s %15.4g %10s %8.4g %10.4g %d.0 x%d, %s, %s\n", g[i].name, g[i].product,
               zo_format_bytes(g[i].mem, mem, sizeof mem), g[i].tensor_16 / 1e12, acc16,
               g[i].tensor_32 / 1e12, g[i].mem_bw / 1e9, g[i].pcie_gen, g[i].pcie_lanes, g[i].host,
               plan_peers_name(g[i].peers));
    }
    printf("  * fp16/bf16 tensor with fp32 accumulation, the rate training gets (GeForce cards run "
           "it at half\n    their fp16-accumulate rate, fp16acc16)\n");
    const plan_host_spec *h = plan_host_presets(&n);
    printf("\nhosts (--host NAME, with --gpu or --hw cpu):\n");
    for (size_t i = 0; i < n; i++)
        printf("%-15s %s; NVMe read %.4g, write %.4g GB/s\n", h[i].name, h[i].summary,
               h[i].nvme_read_bw / 1e9, h[i].nvme_write_bw / 1e9);
    printf("\ncpu (--hw cpu [--host NAME]): the CPU backend, for train --device cpu (its device memory: "
           "--gpu-mem, train's --device-mem).\n");
    printf("\nOverride with --gpus --gpus-per-node --gpu-mem --cpu-mem --nvme --pcie (CPU memory and "
           "NVMe are per node).\n");
    return 0;
}

