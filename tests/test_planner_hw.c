/* Tests for the single-GPU hardware of memplan (issue 20): the GPU and host
 * presets against the tables of docs/memplan.md, --gpu/--host/--pcie, the
 * report's first lines and hardware.basis naming every overridden value, the
 * ranked alternatives of a configuration that does not fit (each applied with
 * memplan estimate), and max-model's check commands on an RTX 4090. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "common/model_config.h"
#include "planner/basis.h"
#include "planner/cost.h"
#include "planner/hardware.h"
#include "planner/suggest.h"
#include "tests/support/run.h" /* defines: run_memplan */

#define MIB (1024.0 * 1024.0)

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * fabs(b); }

/* ---- the documented tables ----------------------------------------------------------- */

/* The cells of a markdown table row ("| a | b |") into cell[], trimmed. */
static int split_row(char *line, char **cell, int max)
{
    int n = 0;
    char *p = strchr(line, '|');
    while (p && n < max) {
        char *q = strchr(p + 1, '|');
        if (!q) break;
        *q = '\0';
        char *s = p + 1, *e = q;
        while (*s == ' ') s++;
        while (e > s && e[-1] == ' ') *--e = '\0';
        cell[n++] = s;
        p = q;
    }
    return n;
}

/* The rows "| `name` | ..." under the heading `title` of docs/memplan.md. */
static int doc_rows(const char *title, char rows[][1024], int max)
{
    FILE *f = fopen(ZO_SOURCE_DIR "/docs/memplan.md", "r");
    assert_non_null(f);
    char line[4096];
    int in = 0, n = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "#", 1)) in = strstr(line, title) != NULL;
        else if (in && !strncmp(line, "| `", 3) && n < max) snprintf(rows[n++], sizeof rows[0], "%.1023s", line);
    }
    fclose(f);
    return n;
}

static void test_gpu_presets_documented(void **state)
{
    (void)state;
    static char rows[64][1024];
    int n = doc_rows("### GPU presets", rows, 64);
    size_t np;
    plan_gpu_presets(&np);
    assert_int_equal(n, (int)np); /* every preset documented, once */
    for (int i = 0; i < n; i++) {
        char *c[16];
        assert_true(split_row(rows[i], c, 16) >= 11);
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)strlen(c[0]) - 2, c[0] + 1);
        const plan_gpu_spec *g;
        assert_int_equal(plan_gpu_find(name, &g), ZO_OK);
        assert_string_equal(g->name, name);
        if (!near((double)g->mem, atof(c[2]) * MIB) || !near(g->tensor_16, atof(c[3]) * 1e12) ||
            !near(g->tensor_32, atof(c[5]) * 1e12) || !near(g->mem_bw, atof(c[6]) * 1e9)) {
            print_error("%s: code and docs/memplan.md disagree\n", name);
            fail();
        }
        if (strstr(c[4], "—")) assert_true(g->tensor_16_acc16 == 0);
        else assert_true(near(g->tensor_16_acc16, atof(c[4]) * 1e12));
        int gen, lanes;
        assert_int_equal(sscanf(c[7], "PCIe %d.0 x%d", &gen, &lanes), 2);
        assert_int_equal(gen, g->pcie_gen);
        assert_int_equal(lanes, g->pcie_lanes);
        assert_string_equal(c[8], g->host);
        assert_string_equal(c[9], plan_peers_name(g->peers));
        /* NVLink where the card has it, and only there */
        assert_true((g->peers == PLAN_PEERS_NVLINK) == (g->nvlink_bw > 0));
        assert_true(strlen(c[10]) > 20); /* a source is named */

        /* the node built from it carries the figures */
        plan_hw hw;
        plan_hw_gpu_node(g, NULL, &hw);
        assert_true(hw.gpu_mem == g->mem && hw.peak_flops_16 == g->tensor_16 &&
                    hw.peak_flops_32 == g->tensor_32 && hw.hbm_bw == g->mem_bw);
        assert_true(hw.pcie_bw == plan_pcie_bw(gen, lanes));
        assert_int_equal(hw.gpus, 1);
        assert_string_equal(hw.name, g->name);
        assert_true(hw.gemm_eff_max > 0 && hw.gemm_flops_half > 0 && hw.cpu_mem > 0);
        assert_int_equal(hw.peers_via_host, g->peers == PLAN_PEERS_HOST);
        /* the GeForce cards (issue 33: RTX 4090, 3090) exchange through host memory */
        if (!strncmp(g->product, "GeForce", 7)) assert_int_equal(g->peers, PLAN_PEERS_HOST);
        plan_hw same;
        assert_int_equal(plan_hw_find(name, &same), ZO_OK); /* --hw takes it too */
        assert_true(same.peak_flops_16 == g->tensor_16 && same.gpu_mem == g->mem);
    }
    /* the GeForce cards train at half their fp16-accumulate rate */
    const plan_gpu_spec *g;
    assert_int_equal(plan_gpu_find("RTX 4090", &g), ZO_OK);
    assert_true(fabs(g->tensor_16 * 2 / g->tensor_16_acc16 - 1) < 1e-3);
}

static void test_hosts_documented(void **state)
{
    (void)state;
    static char rows[16][1024];
    int n = doc_rows("### Hosts", rows, 16);
    size_t nh;
    plan_host_presets(&nh);
    assert_int_equal(n, (int)nh);
    for (int i = 0; i < n; i++) {
        char *c[12];
        assert_true(split_row(rows[i], c, 12) >= 9);
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)strlen(c[0]) - 2, c[0] + 1);
        const plan_host_spec *h;
        assert_int_equal(plan_host_find(name, &h), ZO_OK);
        assert_true(near((double)h->cpu_mem, atof(c[1]) * 1024 * MIB));
        assert_true(near(h->cpu_mem_bw, atof(c[2]) * 1e9));
        assert_int_equal(h->cpu_cores, atoi(c[3]));
        assert_true(near((double)h->nvme, atof(c[4]) * 1e12));
        assert_true(near(h->nvme_read_bw, atof(c[5]) * 1e9));
        assert_true(near(h->nvme_write_bw, atof(c[6]) * 1e9));
        assert_true(near(h->net_bw, atof(c[7]) * 1e9));
    }
    /* another host keeps the GPU, takes the host's figures, says so in the name */
    const plan_gpu_spec *g;
    const plan_host_spec *h;
    plan_hw hw;
    assert_int_equal(plan_gpu_find("l40s", &g), ZO_OK);
    assert_int_equal(plan_host_find("workstation", &h), ZO_OK);
    plan_hw_gpu_node(g, h, &hw);
    assert_string_equal(hw.name, "l40s+workstation");
    assert_true(hw.cpu_mem == h->cpu_mem && hw.peak_flops_16 == g->tensor_16);
}

static void test_pcie(void **state)
{
    (void)state;
    /* the machine presets' figures: 12, 25, 55 GB/s at x16 */
    assert_true(plan_pcie_bw(3, 16) == 12e9 && plan_pcie_bw(4, 16) == 25e9 && plan_pcie_bw(5, 16) == 55e9);
    assert_true(plan_pcie_bw(4, 8) == 12.5e9 && plan_pcie_bw(0, 16) == 0);
    static const struct {
        const char *s;
        int gen, lanes;
    } ok[] = {{"gen4x16", 4, 16}, {"Gen3x8", 3, 8}, {"4.0 x4", 4, 4}, {"gen5", 5, 16},
              {"PCIe 3.0 x16", 3, 16}, {"4x1", 4, 1}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int g, l;
        assert_int_equal(plan_pcie_parse(ok[i].s, 16, &g, &l), ZO_OK);
        assert_int_equal(g, ok[i].gen);
        assert_int_equal(l, ok[i].lanes);
    }
    static const char *bad[] = {"", "gen7", "gen4x3", "x16", "fast", "gen4x16x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int g, l;
        assert_int_equal(plan_pcie_parse(bad[i], 16, &g, &l), ZO_ERR_INVALID);
        assert_non_null(strstr(zo_last_error(), "--pcie"));
    }
}

/* ---- the basis -------------------------------------------------------------------------- */

static void test_basis_overrides(void **state)
{
    (void)state;
    plan_hw hw;
    plan_hw_basis b;
    assert_int_equal(plan_hw_find("h100-80gb", &hw), ZO_OK);
    plan_hw_basis_init(&b, PLAN_HW_PRESET, "h100-80gb", 1, &hw);
    plan_hw_flags f = {0};
    f.gpu_mem_arg = "24GB";
    f.gpu_mem = 24000000000ull;
    f.cpu_mem_arg = "64GB";
    f.cpu_mem = 64000000000ull;
    f.pcie = "gen3x8";
    assert_int_equal(plan_hw_apply_flags(&f, &hw, &b), ZO_OK);
    assert_int_equal(b.n, 3);
    assert_string_equal(b.ov[0].flag, "--gpu-mem");
    assert_true(b.ov[0].preset == 81559 * MIB && b.ov[0].value == 24e9);
    assert_non_null(strstr(b.ov[0].text, "H100-80GB compute with 22.35 GiB of memory (--gpu-mem 24GB"));
    assert_string_equal(b.ov[1].field, "cpu_mem");
    assert_non_null(strstr(b.ov[1].text, "(--cpu-mem 64GB; the h100-80gb preset has 256.00 GiB)"));
    assert_string_equal(b.ov[2].field, "pcie_bw");
    assert_true(b.ov[2].value == 6e9 && hw.pcie_bw == 6e9 && hw.pcie_gen == 3 && hw.pcie_lanes == 8);
    /* NVLink stays NVLink; the compute stays the H100's */
    assert_true(hw.nvlink_bw == 450e9 && hw.peak_flops_16 == 989e12 && hw.gpu_mem == 24000000000ull);
    char flags[256];
    plan_hw_basis_flags(&b, flags, sizeof flags);
    assert_string_equal(flags, "--gpu-mem 24GB --cpu-mem 64GB --pcie gen3x8"); /* the default preset */

    /* --gpu: a faster slot than the card trains at the card's generation; peers follow PCIe */
    plan_hw_flags g = {0};
    g.gpu = "rtx-4090";
    g.pcie = "gen5x16";
    assert_int_equal(plan_hw_from_gpu(&g, &hw, &b), ZO_OK);
    assert_int_equal(plan_hw_apply_flags(&g, &hw, &b), ZO_OK);
    assert_int_equal(hw.pcie_gen, 4);
    assert_true(hw.pcie_bw == 25e9 && hw.nvlink_bw == 25e9);
    assert_non_null(strstr(b.ov[0].text, "limited by the RTX-4090-24GB's own PCIe 4.0"));
    plan_hw_basis_flags(&b, flags, sizeof flags);
    assert_string_equal(flags, "--gpu rtx-4090 --pcie gen5x16");

    /* --hw and --gpu exclude each other; --host needs --gpu */
    plan_hw_flags x = {0};
    x.hw = "h100-80gb";
    x.gpu = "rtx-4090";
    assert_int_equal(plan_hw_flags_check(&x), ZO_ERR_INVALID);
    x.gpu = NULL;
    x.host = "desktop";
    assert_int_equal(plan_hw_flags_check(&x), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "--host desktop needs --gpu"));
}

/* ---- peers ------------------------------------------------------------------------------ */

/* n GPUs of one --gpu node */
static void gpu_node(const char *gpu, int n, plan_hw *hw)
{
    const plan_gpu_spec *g;
    assert_int_equal(plan_gpu_find(gpu, &g), ZO_OK);
    plan_hw_gpu_node(g, NULL, hw);
    hw->gpus = hw->gpus_per_node = n;
}

/* LoRA r 8 of LLaMA-2-7B, ZeRO-3 over the node's GPUs */
static double dp_step(const plan_hw *hw, plan_time *pt)
{
    zo_model_config m;
    assert_int_equal(zo_model_preset_find("llama-2-7b", &m), ZO_OK);
    plan_train t;
    plan_train_defaults(&t, &m);
    t.seq = 2048;
    t.micro_batch = 2;
    t.dp = hw->gpus;
    t.zero = 3;
    t.recompute = ZO_PLAN_RECOMPUTE_FULL;
    t.dp_overlap = 0; /* FSDP as torchtitan and torchtune run it: the collectives add */
    t.method = ZO_PLAN_LORA;
    t.lora.r = 8;
    t.lora.alpha = PLAN_LORA_DEFAULT_ALPHA;
    t.lora.targets = PLAN_LORA_DEFAULT_TARGETS;
    plan_estimate e;
    zo_status st = plan_estimate_run(&m, hw, &t, &e);
    if (st) print_error("%s\n", zo_last_error());
    assert_int_equal(st, ZO_OK);
    assert_int_equal(plan_time_run(&m, hw, &t, &e, pt), ZO_OK);
    return pt->step;
}

/* Issue 33: GeForce cards have no peer-to-peer path; their collectives go
 * through host memory, which every GPU of the node writes and reads at once
 * (docs/memplan.md, "Peers"). */
static void test_peers(void **state)
{
    (void)state;
    plan_hw h2, h4, p2, nv;
    gpu_node("rtx-4090", 2, &h2);
    gpu_node("rtx-4090", 4, &h4);
    gpu_node("a100-80gb-pcie", 2, &p2);
    gpu_node("a100-80gb", 2, &nv);
    assert_true(h2.peers_via_host && h4.peers_via_host && !p2.peers_via_host && !nv.peers_via_host);
    /* the desktop's 89.6 GB/s at 70%, over 2 x 2 and 2 x 4 flows; under its PCIe 4.0 x16 */
    assert_true(near(plan_hw_peer_bw(&h2), 89.6e9 * 0.7 / 4));
    assert_true(near(plan_hw_peer_bw(&h4), 89.6e9 * 0.7 / 8));
    assert_true(plan_hw_peer_bw(&h2) < h2.pcie_bw);
    /* on a workstation host (8 channels) the PCIe link limits again */
    const plan_gpu_spec *g;
    const plan_host_spec *ws;
    assert_int_equal(plan_gpu_find("rtx-4090", &g), ZO_OK);
    assert_int_equal(plan_host_find("workstation", &ws), ZO_OK);
    plan_hw w2;
    plan_hw_gpu_node(g, ws, &w2);
    w2.gpus = w2.gpus_per_node = 2;
    assert_true(plan_hw_peer_bw(&w2) == w2.pcie_bw);
    /* PCIe peer-to-peer at the host link's rate, NVLink at its own */
    assert_true(plan_hw_peer_bw(&p2) == p2.pcie_bw && plan_hw_peer_bw(&nv) == 300e9);

    /* the same 2 x 4090 job with and without a peer-to-peer path: the
     * data-parallel traffic takes longer by the bandwidths' ratio (less the
     * latency), and so does the step */
    plan_time via_host, p2p;
    double s_host = dp_step(&h2, &via_host);
    plan_hw fake = h2;
    fake.peers_via_host = 0;
    double s_p2p = dp_step(&fake, &p2p);
    assert_true(via_host.dp_comm_total > 0);
    double ratio = via_host.dp_comm_total / p2p.dp_comm_total;
    assert_true(fabs(ratio / (h2.pcie_bw / plan_hw_peer_bw(&h2)) - 1) < 0.02);
    assert_true(s_host > s_p2p);
    assert_true(via_host.forward == p2p.forward);
}

/* ---- ranked alternatives ----------------------------------------------------------------- */

static void test_suggestions_ranked(void **state)
{
    (void)state;
    zo_model_config m;
    plan_hw hw;
    plan_train t;
    assert_int_equal(zo_model_preset_find("llama-3-8b", &m), ZO_OK);
    assert_int_equal(plan_hw_find("rtx-4090", &hw), ZO_OK);
    hw.cpu_mem = 64000000000ull;
    plan_train_defaults(&t, &m);
    t.seq = 2048;
    plan_estimate e;
    assert_int_equal(plan_estimate_run(&m, &hw, &t, &e), ZO_OK);
    assert_false(e.fits);
    static plan_suggestions sg;
    assert_int_equal(plan_suggest(&m, &hw, &t, &sg), ZO_OK);
    assert_true(sg.n >= 3 && sg.n <= sg.tried);
    int offload = 0;
    for (int i = 0; i < sg.n; i++) {
        const plan_alternative *a = &sg.alt[i];
        if (i) assert_true(sg.alt[i - 1].time.step <= a->time.step);
        /* applied again, it fits and takes that long */
        plan_estimate ea;
        plan_time pt;
        assert_int_equal(plan_estimate_run(&m, &hw, &a->t, &ea), ZO_OK);
        assert_true(ea.fits);
        assert_int_equal(plan_time_run(&m, &hw, &a->t, &ea, &pt), ZO_OK);
        assert_true(pt.step == a->time.step);
        assert_true(a->flags[0] != '\0' && a->what[0] != '\0');
        /* the kind names what is trained: the offload ladder keeps it, the
         * LoRA and QLoRA kinds train adapters on a 16-bit or NF4 base */
        static const plan_method method_of[PLAN_ALT_KINDS] = {PLAN_METHOD_FULL, PLAN_METHOD_LORA,
                                                              PLAN_METHOD_QLORA};
        assert_true(a->t.method == method_of[a->kind]);
        offload += a->kind == PLAN_ALT_OFFLOAD;
        for (int j = 0; j < i; j++) assert_string_not_equal(sg.alt[j].flags, a->flags);
    }
    assert_true(offload >= 3);
}

/* ---- the CLI ------------------------------------------------------------------------------ */

static cJSON *run_json(const char *args, int want_rc)
{
    static char out[1 << 20];
    char a[8192];
    snprintf(a, sizeof a, "%s --json", args);
    int rc = run_memplan(a, out, sizeof out);
    if (rc != want_rc) {
        print_error("memplan %s: exit %d, wanted %d\n%s\n", a, rc, want_rc, out);
        fail();
    }
    cJSON *doc = cJSON_Parse(out);
    assert_non_null(doc);
    return doc;
}

static cJSON *path(cJSON *o, const char *a, const char *b)
{
    cJSON *x = cJSON_GetObjectItem(o, a);
    return b ? cJSON_GetObjectItem(x, b) : x;
}

static void test_cli_header(void **state)
{
    (void)state;
    static char out[1 << 18];
    /* the issue's case: an H100's compute with a 24 GB card's memory, said first */
    const char *args = "estimate --model llama-3-8b --gpu-mem 24GB --cpu-mem 64GB --seq 2048";
    assert_int_equal(run_memplan(args, out, sizeof out), 1);
    assert_true(!strncmp(out, "hardware: preset h100-80gb (the default", 39));
    char *second = strstr(out, "\n  overridden: H100-80GB compute with 22.35 GiB of memory (--gpu-mem 24GB");
    assert_non_null(second);
    assert_non_null(strstr(out, "overridden: 59.60 GiB of CPU memory per node (--cpu-mem 64GB"));
    assert_true(second < strstr(out, "llama-3-8b (8.03B params)")); /* before the table */
    cJSON *doc = run_json(args, 1);
    cJSON *b = path(doc, "hardware", "basis");
    assert_string_equal(cJSON_GetObjectItem(b, "source")->valuestring, "preset");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(b, "default")));
    cJSON *ov = cJSON_GetObjectItem(b, "overrides");
    assert_int_equal(cJSON_GetArraySize(ov), 2);
    cJSON *o0 = cJSON_GetArrayItem(ov, 0);
    assert_string_equal(cJSON_GetObjectItem(o0, "flag")->valuestring, "--gpu-mem");
    assert_string_equal(cJSON_GetObjectItem(o0, "arg")->valuestring, "24GB");
    assert_true(cJSON_GetObjectItem(o0, "value")->valuedouble == 24e9);
    assert_true(cJSON_GetObjectItem(o0, "preset")->valuedouble == 81559 * MIB);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ov, 1), "field")->valuestring, "cpu_mem");
    assert_true(path(b, "gpu", "tensor_flops_16")->valuedouble == 989e12);
    assert_true(path(doc, "hardware", "gpu_mem")->valuedouble == 24e9);
    /* the lines are the report's */
    assert_non_null(strstr(out, cJSON_GetArrayItem(cJSON_GetObjectItem(b, "lines"), 0)->valuestring));
    cJSON_Delete(doc);

    /* --gpu with the host flags */
    args = "estimate --model llama-2-7b --gpu rtx-4090 --cpu-mem 64GB --pcie gen3x8 --nvme 1TB "
           "--params cpu --grads cpu --optimizer nvme --recompute full";
    assert_int_equal(run_memplan(args, out, sizeof out), 0);
    assert_true(!strncmp(out, "hardware: --gpu rtx-4090: GeForce RTX 4090", 42));
    assert_non_null(strstr(out, "overridden: PCIe 3.0 x8 host link, 6.0 GB/s each way (--pcie gen3x8; "
                                "the desktop host has PCIe 4.0 x16, 25.0 GB/s)"));
    assert_non_null(strstr(out, "(--nvme 1TB; the desktop host has 2.00 TB)"));
    doc = run_json(args, 0);
    b = path(doc, "hardware", "basis");
    assert_string_equal(cJSON_GetObjectItem(b, "source")->valuestring, "gpu");
    assert_string_equal(cJSON_GetObjectItem(b, "host")->valuestring, "desktop");
    assert_true(path(b, "gpu", "pcie_bw")->valuedouble == 6e9);
    assert_true(path(b, "gpu", "tensor_flops_16")->valuedouble == 165.2e12);
    assert_true(path(b, "node", "nvme")->valuedouble == 1e12);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(b, "overrides")), 3);
    cJSON_Delete(doc);
    /* a slower link is a slower step where weights stream */
    doc = run_json("estimate --model llama-2-7b --gpu rtx-4090 --cpu-mem 64GB --params cpu --grads cpu "
                   "--optimizer nvme --recompute full", 0);
    cJSON *doc3 = run_json(args, 0);
    assert_true(path(doc3, "time", "step_s")->valuedouble > path(doc, "time", "step_s")->valuedouble);
    cJSON_Delete(doc);
    cJSON_Delete(doc3);

    /* --gpu with --gpus N: one node of N */
    doc = run_json("estimate --model llama-2-7b --gpu l40s --gpus 4 --zero 3 --recompute full", 0);
    assert_true(path(doc, "hardware", "gpus_per_node")->valuedouble == 4);
    assert_true(path(doc, "ranks_per_node", NULL)->valuedouble == 4);
    cJSON_Delete(doc);

    /* plan and max-model say it first too */
    assert_int_equal(run_memplan("plan --model llama-2-7b --gpu a100-80gb-pcie --top 1", out, sizeof out), 0);
    assert_true(!strncmp(out, "hardware: --gpu a100-80gb-pcie: A100 80GB PCIe", 44));

    /* bad input: exit 2, one line naming the flag */
    static const struct {
        const char *args, *needle;
    } bad[] = {
        {"estimate --model gpt2 --hw h100-80gb --gpu rtx-4090", "exclude each other"},
        {"estimate --model gpt2 --host desktop", "--host desktop needs --gpu"},
        {"estimate --model gpt2 --gpu rtx-4091", "closest: rtx-4090"},
        {"estimate --model gpt2 --gpu rtx-4090 --host deskop", "closest: desktop"},
        {"estimate --model gpt2 --gpu rtx-4090 --pcie gen9", "--pcie: 'gen9'"},
        {"plan --model gpt2 --gpu l4 --pcie x", "--pcie: 'x'"},
        {"max-model --family llama --gpu nope", "--gpu: unknown GPU 'nope'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = run_memplan(bad[i].args, out, sizeof out);
        if (rc != 2 || !strstr(out, bad[i].needle) || strchr(out, '\n') != out + strlen(out) - 1) {
            print_error("memplan %s: exit %d, output %s; wanted exit 2 and one line with '%s'\n",
                        bad[i].args, rc, out, bad[i].needle);
            fail();
        }
    }
}

static void test_cli_suggestions_apply(void **state)
{
    (void)state;
    const char *args = "estimate --model llama-3-8b --gpu rtx-4090 --cpu-mem 64GB --seq 2048";
    cJSON *doc = run_json(args, 1);
    cJSON *sg = cJSON_GetObjectItem(doc, "suggestions");
    int n = cJSON_GetArraySize(sg);
    assert_true(n >= 3);
    assert_string_equal(cJSON_GetObjectItem(doc, "fits_with")->valuestring,
                        cJSON_GetObjectItem(cJSON_GetArrayItem(sg, 0), "flags")->valuestring);
    double prev = 0;
    for (int i = 0; i < n; i++) {
        cJSON *a = cJSON_GetArrayItem(sg, i);
        double step = cJSON_GetObjectItem(a, "step_s")->valuedouble;
        assert_true(step >= prev); /* fastest first */
        prev = step;
        char more[1024];
        snprintf(more, sizeof more, "%s %s", args, cJSON_GetObjectItem(a, "flags")->valuestring);
        cJSON *d = run_json(more, 0); /* applied, it fits */
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(d, "fits")));
        assert_true(near(path(d, "time", "step_s")->valuedouble, step));
        assert_true(near(path(d, "time", "tokens_per_s")->valuedouble,
                         cJSON_GetObjectItem(a, "tokens_per_s")->valuedouble));
        static const char *tiers[] = {"gpu", "cpu", "nvme"};
        for (int k = 0; k < 3; k++)
            assert_true(path(path(d, "per_rank", tiers[k]), "total", NULL)->valuedouble ==
                        path(a, "per_rank", tiers[k])->valuedouble);
        assert_null(cJSON_GetObjectItem(d, "suggestions"));
        cJSON_Delete(d);
    }
    cJSON_Delete(doc);

    /* the table lists them with tokens/s */
    static char out[1 << 18];
    assert_int_equal(run_memplan(args, out, sizeof out), 1);
    assert_non_null(strstr(out, "fits with:"));
    assert_non_null(strstr(out, " 1. "));
    assert_non_null(strstr(out, "tokens/s  --recompute full"));
}

static void test_cli_max_model_4090(void **state)
{
    (void)state;
    static char out[1 << 18], out2[1 << 18];
    assert_int_equal(run_memplan("max-model --family llama --gpu rtx-4090 --cpu-mem 64GB", out, sizeof out), 0);
    assert_true(!strncmp(out, "hardware: --gpu rtx-4090", 24));
    assert_non_null(strstr(out, "(--cpu-mem 64GB; the desktop host has 64.00 GiB)"));
    static const char *rows[] = {"\ndata-parallel ", "\nzero-offload ", "\nzero-infinity-cpu ",
                                 "\nzero-infinity-nvme "};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) assert_non_null(strstr(out, rows[i]));
    assert_null(strstr(out, "\nzero-1 ")); /* nothing to shard on one GPU */
    assert_null(strstr(out, "\n3d-parallel "));
    /* every check command runs, fits, and takes the row's time */
    int checks = 0;
    for (char *line = strstr(out, "\n    check: memplan "); line;
         line = strstr(line + 1, "\n    check: memplan ")) {
        char cmd[2048], *end = strchr(line + 1, '\n');
        snprintf(cmd, sizeof cmd, "%.*s --json", (int)(end - line - 20), line + 20);
        assert_int_equal(run_memplan(cmd, out2, sizeof out2), 0);
        cJSON *d = cJSON_Parse(out2);
        assert_non_null(d);
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(d, "fits")));
        /* a dense shape's row names a dense preset (granite-3.0-3b-a800m, a
         * mixture of experts of LLaMA's architecture, once filled two rows) */
        char name[128];
        zo_model_config pm;
        assert_int_equal(sscanf(strstr(line, "--model ") + 8, "%127s", name), 1);
        assert_int_equal(zo_model_preset_find(name, &pm), ZO_OK);
        assert_int_equal(pm.moe.experts, 0);
        /* the strategy's row, two lines up: "... <preset> (<step> s, <tokens/s>)" */
        char *row = line;
        for (int k = 0; k < 2; k++)
            do row--; while (row > out && *row != '\n');
        char *hit = strstr(row, " (");
        double step, tps;
        assert_true(hit && hit < line);
        assert_int_equal(sscanf(hit, " (%lf s, %lf)", &step, &tps), 2);
        /* printed to 3 significant digits, tokens/s whole above 100 */
        assert_true(fabs(step / path(d, "time", "step_s")->valuedouble - 1) < 5e-3);
        assert_true(fabs(tps - path(d, "time", "tokens_per_s")->valuedouble) < 0.5 + 5e-3 * tps);
        cJSON_Delete(d);
        checks++;
    }
    /* a 14B LLaMA-shaped model fits with its weights and optimizer on NVMe:
     * the largest preset of the architecture under the row's size, since the
     * Phi-3 presets Phi-3-medium (13.96B; LLaMA-2-13B's 13.02B before them) */
    assert_true(checks >= 1);
    assert_non_null(strstr(out, "phi-3-medium-4k ("));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_presets_documented), cmocka_unit_test(test_hosts_documented),
        cmocka_unit_test(test_pcie),                   cmocka_unit_test(test_basis_overrides),
        cmocka_unit_test(test_peers),
        cmocka_unit_test(test_suggestions_ranked),     cmocka_unit_test(test_cli_header),
        cmocka_unit_test(test_cli_suggestions_apply),  cmocka_unit_test(test_cli_max_model_4090),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
