#include "basis.h"

#include <stdio.h>
#include <string.h>

#include "common/units.h"
#include "planner/report.h" /* defines: plan_json_field, PLAN_JSON_ADD */

static const char *source_names[] = {"preset", "gpu", "profile", "plan"};

const char *plan_hw_source_name(plan_hw_source s) { return s <= PLAN_HW_PLAN ? source_names[s] : "?"; }

zo_status plan_hw_flags_check(const plan_hw_flags *f)
{
    if (f->hw && f->gpu)
        return zo_error(ZO_ERR_INVALID, "--hw %s and --gpu %s exclude each other: --hw names a whole "
                                        "machine, --gpu one GPU in a host (--host, --cpu-mem, --nvme, "
                                        "--pcie)", f->hw, f->gpu);
    if (f->host && !f->gpu && !(f->hw && !strcmp(f->hw, "cpu")))
        return zo_error(ZO_ERR_INVALID, "--host %s needs --gpu NAME or --hw cpu (a --hw preset has its own "
                                        "host; change it with --cpu-mem, --nvme, --pcie)", f->host);
    return ZO_OK;
}

void plan_hw_basis_init(plan_hw_basis *b, plan_hw_source source, const char *name, int is_default,
                        const plan_hw *hw)
{
    memset(b, 0, sizeof *b);
    b->source = source;
    snprintf(b->name, sizeof b->name, "%s", name ? name : hw->name);
    b->is_default = is_default;
    b->base = *hw;
}

zo_status plan_hw_from_gpu(const plan_hw_flags *f, plan_hw *hw, plan_hw_basis *b)
{
    const plan_gpu_spec *g;
    const plan_host_spec *h = NULL;
    zo_status st;
    if ((st = plan_gpu_find(f->gpu, &g)) != ZO_OK) return st;
    if (f->host && (st = plan_host_find(f->host, &h)) != ZO_OK) return st;
    plan_hw_gpu_node(g, h, hw);
    plan_hw_basis_init(b, PLAN_HW_GPU, g->name, 0, hw);
    snprintf(b->host, sizeof b->host, "%s", h ? h->name : g->host);
    b->host_given = f->host != NULL;
    return ZO_OK;
}

static double gib(uint64_t v) { return (double)v / (double)ZO_GIB; }

/* Who had the replaced value: "the RTX-4090-24GB", "the desktop host". */
static void owner(const plan_hw_basis *b, int gpu_field, char *buf, size_t len)
{
    if (gpu_field) snprintf(buf, len, "the %s", b->base.gpu);
    else if (b->source == PLAN_HW_GPU) snprintf(buf, len, "the %s host", b->host);
    else if (b->source == PLAN_HW_PROFILE) snprintf(buf, len, "the profile");
    else snprintf(buf, len, "the %.60s preset", b->name);
}

static plan_hw_override *add(plan_hw_basis *b, const char *flag, const char *arg,
                             const char *field, double preset, double value)
{
    if (b->n == PLAN_HW_OVERRIDES) return NULL;
    plan_hw_override *o = &b->ov[b->n++];
    o->flag = flag;
    snprintf(o->arg, sizeof o->arg, "%s", arg);
    o->field = field;
    o->preset = preset;
    o->value = value;
    return o;
}

zo_status plan_hw_apply_flags(const plan_hw_flags *f, plan_hw *hw, plan_hw_basis *b)
{
    char who[96];
    plan_hw_override *o;
    if (f->gpu_mem_arg) {
        owner(b, 1, who, sizeof who);
        o = add(b, "--gpu-mem", f->gpu_mem_arg, "gpu_mem", (double)hw->gpu_mem, (double)f->gpu_mem);
        if (o)
            snprintf(o->text, sizeof o->text, "%s compute with %.2f GiB of memory (--gpu-mem %s; %s has "
                     "%.2f GiB): the times are the %s's; --gpu NAME for another GPU", hw->gpu,
                     gib(f->gpu_mem), f->gpu_mem_arg, who, gib(hw->gpu_mem), hw->gpu);
        hw->gpu_mem = f->gpu_mem;
    }
    if (f->cpu_mem_arg) {
        owner(b, 0, who, sizeof who);
        o = add(b, "--cpu-mem", f->cpu_mem_arg, "cpu_mem", (double)hw->cpu_mem, (double)f->cpu_mem);
        if (o)
            snprintf(o->text, sizeof o->text, "%.2f GiB of CPU memory per node (--cpu-mem %s; %s has "
                     "%.2f GiB)", gib(f->cpu_mem), f->cpu_mem_arg, who, gib(hw->cpu_mem));
        hw->cpu_mem = f->cpu_mem;
    }
    if (f->nvme_arg) {
        owner(b, 0, who, sizeof who);
        o = add(b, "--nvme", f->nvme_arg, "nvme", (double)hw->nvme, (double)f->nvme);
        if (o)
            snprintf(o->text, sizeof o->text, "%.2f TB of NVMe per node (--nvme %s; %s has %.2f TB)",
                     f->nvme / 1e12, f->nvme_arg, who, hw->nvme / 1e12);
        hw->nvme = f->nvme;
    }
    if (f->pcie) {
        int gen, lanes;
        zo_status st = plan_pcie_parse(f->pcie, hw->pcie_lanes ? hw->pcie_lanes : 16, &gen, &lanes);
        if (st) return st;
        /* the link trains at the lower generation and width of card and slot */
        char limit[96] = "";
        if (b->base.pcie_gen && gen > b->base.pcie_gen) {
            snprintf(limit, sizeof limit, ", limited by the %s's own PCIe %d.0", hw->gpu,
                     b->base.pcie_gen);
            gen = b->base.pcie_gen;
        }
        if (b->base.pcie_lanes && lanes > b->base.pcie_lanes) lanes = b->base.pcie_lanes;
        double bw = plan_pcie_bw(gen, lanes);
        owner(b, 0, who, sizeof who);
        o = add(b, "--pcie", f->pcie, "pcie_bw", hw->pcie_bw, bw);
        if (o) {
            char was[64];
            if (hw->pcie_gen)
                snprintf(was, sizeof was, "PCIe %d.0 x%d, %.1f GB/s", hw->pcie_gen, hw->pcie_lanes,
                         hw->pcie_bw / 1e9);
            else
                snprintf(was, sizeof was, "%.1f GB/s", hw->pcie_bw / 1e9);
            snprintf(o->text, sizeof o->text, "PCIe %d.0 x%d host link, %.1f GB/s each way (--pcie "
                     "%s%s; %s has %s)", gen, lanes, bw / 1e9, f->pcie, limit, who, was);
        }
        /* GPUs without NVLink reach their peers over the same link */
        if (hw->nvlink_bw == hw->pcie_bw) hw->nvlink_bw = bw;
        hw->pcie_gen = gen;
        hw->pcie_lanes = lanes;
        hw->pcie_bw = bw;
    }
    if (f->gpus_per_node) {
        owner(b, 0, who, sizeof who);
        char arg[24];
        snprintf(arg, sizeof arg, "%ld", f->gpus_per_node);
        o = add(b, "--gpus-per-node", arg, "gpus_per_node", hw->gpus_per_node,
                (double)f->gpus_per_node);
        if (o)
            snprintf(o->text, sizeof o->text, "%ld GPUs per node (--gpus-per-node %ld; %s has %d)",
                     f->gpus_per_node, f->gpus_per_node, who, hw->gpus_per_node);
        hw->gpus_per_node = (int)f->gpus_per_node;
    }
    return ZO_OK;
}

void plan_hw_basis_flags(const plan_hw_basis *b, char *buf, size_t len)
{
    buf[0] = '\0';
    size_t u = 0;
    if (b->source == PLAN_HW_GPU) {
        u += (size_t)snprintf(buf + u, len - u, "--gpu %s", b->name);
        if (b->host_given && u < len) u += (size_t)snprintf(buf + u, len - u, " --host %s", b->host);
    } else if (!b->is_default && b->source != PLAN_HW_PLAN) {
        u += (size_t)snprintf(buf + u, len - u, "--hw %.200s", b->name);
    }
    for (int i = 0; i < b->n && u < len; i++)
        u += (size_t)snprintf(buf + u, len - u, "%s%s %s", u ? " " : "", b->ov[i].flag, b->ov[i].arg);
}

/* ---- the lines --------------------------------------------------------------------- */

#define BASIS_LINES (4 + PLAN_HW_OVERRIDES)
typedef char basis_line[512];

static const plan_gpu_spec *gpu_spec(const char *name)
{
    size_t n;
    const plan_gpu_spec *g = plan_gpu_presets(&n);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(g[i].name, name)) return &g[i];
    return NULL;
}

static const char *preset_summary(const char *name)
{
    size_t n;
    const plan_hw_preset *p = plan_hw_presets(&n);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(p[i].name, name)) return p[i].summary;
    return NULL;
}

static int lines_of(const plan_hw *hw, const plan_hw_basis *b, basis_line *l)
{
    const plan_hw *h = &b->base;
    int n = 0;
    const plan_gpu_spec *g = b->source == PLAN_HW_GPU ? gpu_spec(b->name) : NULL;
    switch (b->source) {
    case PLAN_HW_GPU:
        snprintf(l[n++], sizeof l[0], "hardware: --gpu %.60s: %.100s in the %s host%s", b->name,
                 g ? g->product : h->gpu, b->host, b->host_given ? " (--host)" : "");
        break;
    case PLAN_HW_PRESET: {
        const char *sum = preset_summary(b->name);
        snprintf(l[n++], sizeof l[0], "hardware: preset %.60s%s: %.160s", b->name,
                 b->is_default ? " (the default; choose with --hw NAME or --gpu NAME)" : "",
                 sum ? sum : h->gpu);
        break;
    }
    case PLAN_HW_PROFILE:
        snprintf(l[n++], sizeof l[0], "hardware: profile %.200s (%s%s%.160s)", b->name,
                 h->measured ? "measured by memplan calibrate" : "a hardware file",
                 h->note[0] ? ": " : "", h->note);
        break;
    case PLAN_HW_PLAN:
        snprintf(l[n++], sizeof l[0], "hardware: from the plan file %.200s: %s, %d x %s", b->name,
                 h->name, h->gpus, h->gpu);
        break;
    }
    char link[64] = "";
    if (h->pcie_gen) snprintf(link, sizeof link, "PCIe %d.0 x%d, ", h->pcie_gen, h->pcie_lanes);
    char acc16[64] = "";
    if (g && g->tensor_16_acc16 > 0 && g->tensor_16_acc16 != g->tensor_16)
        snprintf(acc16, sizeof acc16, " (%.4g with fp16 accumulate)", g->tensor_16_acc16 / 1e12);
    snprintf(l[n++], sizeof l[0],
             "  GPU  %s: %.2f GiB, %.4g TFLOPS bf16/fp16 tensor with fp32 accumulate%s, %.4g GB/s, "
             "%s%.1f GB/s to the host",
             h->gpu, gib(h->gpu_mem), h->peak_flops_16 / 1e12, acc16, h->hbm_bw / 1e9, link,
             h->pcie_bw / 1e9);
    snprintf(l[n++], sizeof l[0],
             "  host %.2f GiB RAM (%.4g GB/s), %d cores, %.2f TB NVMe (read %.4g, write %.4g GB/s)%s",
             gib(h->cpu_mem), h->cpu_mem_bw / 1e9, h->cpu_cores, h->nvme / 1e12,
             h->nvme_read_bw / 1e9, h->nvme_write_bw / 1e9, h->gpus_per_node > 1 ? " per node" : "");
    /* how the GPUs of a node reach each other, as the job runs (a single
     * GPU: as two of them would) */
    if (hw->gpus_per_node > 1 || b->source == PLAN_HW_GPU) {
        plan_hw two = *hw;
        int alone = plan_hw_ranks_per_node(&two) < 2;
        if (alone) two.gpus = two.gpus_per_node = 2;
        snprintf(l[n++], sizeof l[0], "  peers %s: %.4g GB/s per GPU each way with %d in the node%s",
                 hw->peers_via_host ? "through host memory (no peer-to-peer)"
                 : hw->nvlink_bw > hw->pcie_bw ? "over NVLink"
                                               : "over PCIe peer-to-peer",
                 plan_hw_peer_bw(&two) / 1e9, plan_hw_ranks_per_node(&two),
                 alone ? " (--gpus 2)" : "");
    }
    for (int i = 0; i < b->n; i++)
        snprintf(l[n++], sizeof l[0], "  overridden: %.300s", b->ov[i].text);
    return n;
}

void plan_report_basis(FILE *out, const plan_hw *hw, const plan_hw_basis *b)
{
    basis_line l[BASIS_LINES];
    int n = lines_of(hw, b, l);
    for (int i = 0; i < n; i++) fprintf(out, "%s\n", l[i]);
}

/* the figures the estimate used (after the overrides): the GPU's ... */
#define H(key, member, type) PLAN_JSON_FIELD(key, plan_hw, member, type)
static const plan_json_field gpu_fields[] = {
    H("memory", gpu_mem, U64),     H("tensor_flops_16", peak_flops_16, DOUBLE),
    H("tensor_flops_32", peak_flops_32, DOUBLE), H("memory_bw", hbm_bw, DOUBLE),
    H("pcie_gen", pcie_gen, INT),  H("pcie_lanes", pcie_lanes, INT),
    H("pcie_bw", pcie_bw, DOUBLE),
};
/* ... and the node's */
static const plan_json_field node_fields[] = {
    H("cpu_mem", cpu_mem, U64),    H("cpu_mem_bw", cpu_mem_bw, DOUBLE),
    H("cpu_cores", cpu_cores, INT), H("nvme", nvme, U64),
    H("nvme_read_bw", nvme_read_bw, DOUBLE), H("nvme_write_bw", nvme_write_bw, DOUBLE),
    H("nvme_read_bw_busy", nvme_read_bw_busy, DOUBLE),
    H("nvlink_bw", nvlink_bw, DOUBLE), H("peers_via_host", peers_via_host, INT),
};
#undef H

cJSON *plan_hw_basis_json(const plan_hw *hw, const plan_hw_basis *b)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "source", plan_hw_source_name(b->source));
    cJSON_AddStringToObject(o, "name", b->name);
    if (b->source == PLAN_HW_GPU) cJSON_AddStringToObject(o, "host", b->host);
    cJSON_AddBoolToObject(o, "default", b->is_default);
    cJSON *g = cJSON_AddObjectToObject(o, "gpu");
    cJSON_AddStringToObject(g, "name", hw->gpu);
    PLAN_JSON_ADD(g, hw, gpu_fields);
    PLAN_JSON_ADD(cJSON_AddObjectToObject(o, "node"), hw, node_fields);
    cJSON *ov = cJSON_AddArrayToObject(o, "overrides");
    for (int i = 0; i < b->n; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "flag", b->ov[i].flag);
        cJSON_AddStringToObject(x, "arg", b->ov[i].arg);
        cJSON_AddStringToObject(x, "field", b->ov[i].field);
        cJSON_AddNumberToObject(x, "preset", b->ov[i].preset);
        cJSON_AddNumberToObject(x, "value", b->ov[i].value);
        cJSON_AddStringToObject(x, "text", b->ov[i].text);
        cJSON_AddItemToArray(ov, x);
    }
    basis_line l[BASIS_LINES];
    int n = lines_of(hw, b, l);
    cJSON *jl = cJSON_AddArrayToObject(o, "lines");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(jl, cJSON_CreateString(l[i]));
    return o;
}
