/* LoRA and QLoRA in the planner (docs/memplan.md, "LoRA and QLoRA"):
 * trainable counts through the CLI against Hugging Face PEFT's published
 * figures; the frozen base's bytes (16-bit, or NF4 with double quantization
 * from the QLoRA paper's block scheme, computed here); no base gradients;
 * what the adapters add to activations; the cost model's FLOPs and NF4
 * dequantization; the QLoRA paper's claims (LLaMA-1 65B on one 48 GB GPU,
 * 33B on one 24 GB GPU); LoRA and QLoRA among the "fits with" alternatives;
 * plan files and max-model carrying the method. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "common/model_config.h"
#include "common/plan_schema.h" /* defines: zo_plan_load */
#include "planner/cost.h"
#include "planner/hardware.h"
#include "planner/memory.h"
#include "planner/suggest.h"
#include "tests/support/run.h" /* defines: run_memplan, run_memplan_json, run_json_num */
#include "tests/support/scratch.h" /* defines: scratch_path */

static void load(const char *name, zo_model_config *c)
{
    char path[512];
    snprintf(path, sizeof path, "%s/hf-configs/%s", ZO_FIXTURES_DIR, name);
    if (zo_model_config_load(path, c)) fail_msg("%s", zo_last_error());
}


/* NF4 with double quantization as the QLoRA paper lays it out: a 4-bit code
 * per weight, an 8-bit absmax per block of 64, an fp32 scale per 256 of those
 * and one fp32 offset (written here from the scheme, not from common/nf4.c). */
static uint64_t nf4_reference(uint64_t n)
{
    uint64_t blocks = (n + 63) / 64;
    return 4 + 4 * ((blocks + 255) / 256) + blocks + (n + 1) / 2;
}

/* ---- counts ----------------------------------------------------------------------------- */

/* PEFT's print_trainable_parameters for these models and adapters (the
 * figures issue 15 and the PEFT documentation give); memplan reports them. */
static void test_peft_counts_cli(void **state)
{
    (void)state;
    static const struct {
        const char *model, *flags;
        uint64_t trainable;
    } c[] = {
        {"llama-2-7b", "--lora 8 --lora-targets q,v", 4194304ull},
        {"llama-2-7b", "--lora 16 --lora-targets all-linear", 39976960ull},
        {"llama-2-13b", "--lora 64 --lora-targets all-linear --qlora", 250347520ull},
        {"mistral-7b", "--lora 16 --lora-targets all-linear", 41943040ull},
        /* q,v (the default) on GPT-2 is its fused c_attn, PEFT's default target */
        {"gpt2", "--lora 8", 294912ull},
        {"llama-2-7b", "--lora 8 --lora-targets q_proj,v_proj", 4194304ull},
        /* Phi-4: PEFT's Phi-3 modules, qkv_proj, o_proj, gate_up_proj,
         * down_proj: 40 x 16 x (12800 + 10240 + 40960 + 23040) */
        {"phi-4", "--lora 16 --lora-targets all-linear --qlora", 55705600ull},
        {"phi-4", "--lora 16 --lora-targets qkv_proj,o_proj,gate_up_proj,down_proj", 55705600ull},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char args[512];
        snprintf(args, sizeof args, "estimate --model %s --seq 512 %s", c[i].model, c[i].flags);
        cJSON *doc = run_memplan_json(args, 0);
        if ((uint64_t)run_json_num(doc, "trainable_params", NULL) != c[i].trainable)
            fail_msg("%s: %.0f trainable, PEFT says %llu", args, run_json_num(doc, "trainable_params", NULL),
                     (unsigned long long)c[i].trainable);
        const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(doc, "config");
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(cfg, "method")->valuestring,
                            strstr(c[i].flags, "--qlora") ? "qlora" : "lora");
        assert_true(run_json_num(cfg, "lora", "r") == atof(strstr(c[i].flags, "--lora ") + 7));
        /* the table says the same count */
        static char out[1 << 16];
        assert_int_equal(run_memplan(args, out, sizeof out), 0);
        char want[64];
        uint64_t v = c[i].trainable;
        snprintf(want, sizeof want, "%llu,%03llu,%03llu trainable parameters",
                 (unsigned long long)(v / 1000000), (unsigned long long)(v / 1000 % 1000),
                 (unsigned long long)(v % 1000));
        if (v < 1000000) snprintf(want, sizeof want, "%llu,%03llu trainable parameters",
                                  (unsigned long long)(v / 1000), (unsigned long long)(v % 1000));
        if (!strstr(out, want)) fail_msg("%s: no \"%s\" in\n%s", args, want, out);
        cJSON_Delete(doc);
    }
    /* latent attention's q and v (q_a_proj, q_b_proj, kv_a_proj_with_mqa,
     * kv_b_proj) of DeepSeek-V2 and V3, r 16, from their config.json's
     * sizes: V3's router score correction is a frozen buffer, so its layers
     * take the adapters V2's do */
    static const struct {
        const char *file;
        uint64_t layers, h;
    } mla[] = {{"deepseek-v2.json", 60, 5120}, {"deepseek-v3.json", 61, 7168}};
    for (size_t i = 0; i < sizeof mla / sizeof mla[0]; i++) {
        const uint64_t q_rank = 1536, kv_rank = 512, heads = 128, nope = 128, rope = 64, vd = 128;
        const uint64_t want = mla[i].layers * 16 *
                              ((mla[i].h + q_rank) + (q_rank + heads * (nope + rope)) + (mla[i].h + kv_rank + rope) +
                               (kv_rank + heads * (nope + vd)));
        char args[768];
        snprintf(args, sizeof args, "estimate --model %s/hf-configs/%s --seq 512 --lora 16 --qlora",
                 ZO_FIXTURES_DIR, mla[i].file);
        cJSON *doc = run_memplan_json(args, 1); /* (over one H100: exit 1, the count all the same) */
        if ((uint64_t)run_json_num(doc, "trainable_params", NULL) != want)
            fail_msg("%s: %.0f trainable, want %llu", args, run_json_num(doc, "trainable_params", NULL),
                     (unsigned long long)want);
        cJSON_Delete(doc);
    }
    /* full fine-tuning of V3 trains all but its 58 MoE layers' 256 router
     * score corrections (counted among the parameters, as Hugging Face's
     * 671,026,419,200: test_planner_families), buffers never trained */
    {
        char args[768];
        snprintf(args, sizeof args, "estimate --model %s/hf-configs/deepseek-v3.json --seq 512", ZO_FIXTURES_DIR);
        cJSON *doc = run_memplan_json(args, 1);
        assert_true((uint64_t)run_json_num(doc, "trainable_params", NULL) == 671026419200ull - 58ull * 256);
        cJSON_Delete(doc);
    }
    /* what a flag cannot mean is refused by name */
    static char out[1 << 14];
    assert_int_equal(run_memplan("estimate --model gpt2 --lora 8 --lora-targets gate", out, sizeof out), 2);
    assert_non_null(strstr(out, "--lora: LoRA: gpt2 has no gate"));
    assert_int_equal(run_memplan("estimate --model llama-2-7b --qlora", out, sizeof out), 2);
    assert_non_null(strstr(out, "--qlora needs --lora R"));
    assert_int_equal(run_memplan("estimate --params 7B --lora 8", out, sizeof out), 2);
    assert_non_null(strstr(out, "the adapters need the model's shape"));
    assert_int_equal(run_memplan("estimate --model llama-2-7b --lora 0", out, sizeof out), 2);
    assert_non_null(strstr(out, "--lora: 0 is out of range [1, 65536]"));
}

/* ---- memory -------------------------------------------------------------------------------- */

typedef struct cfg {
    zo_model_config m;
    plan_hw hw;
    plan_train t;
    plan_estimate e;
    plan_time pt;
} cfg;

static void run_cfg(cfg *c)
{
    assert_int_equal(plan_estimate_run(&c->m, &c->hw, &c->t, &c->e), ZO_OK);
    assert_int_equal(plan_time_run(&c->m, &c->hw, &c->t, &c->e, &c->pt), ZO_OK);
}

static uint64_t item(const plan_estimate *e, const char *prefix)
{
    for (int i = 0; i < e->n_items; i++)
        if (!strncmp(e->items[i].name, prefix, strlen(prefix))) return e->items[i].bytes;
    return 0;
}

static void lora_of(cfg *c, plan_method method, int r, unsigned targets)
{
    c->t.method = method;
    c->t.lora = (zo_lora_config){r, 16, targets};
}

/* Preset `name` fully fine-tuned on an H100 at sequence 2048, estimated. */
static void full_run(const char *name, cfg *full)
{
    assert_int_equal(zo_model_preset_find(name, &full->m), ZO_OK);
    assert_int_equal(plan_hw_find("h100-80gb", &full->hw), ZO_OK);
    plan_train_defaults(&full->t, &full->m);
    full->t.seq = 2048;
    run_cfg(full);
}

/* The frozen base, the adapters and their gradients and AdamW state, what
 * the adapters add to activations; no base gradients, no base optimizer. */
static void test_lora_memory(void **state)
{
    (void)state;
    cfg full, lora;
    full_run("llama-2-7b", &full);
    lora = full;
    lora_of(&lora, PLAN_METHOD_LORA, 16, ZO_LORA_ALL_LINEAR);
    run_cfg(&lora);
    const zo_model_config *m = &full.m;
    double L = m->n_layers, h = m->hidden, f = m->ffn, s = 2048, r = 16;
    uint64_t P = zo_model_params(m), A = (uint64_t)(L * r * (4 * (h + h) + 3 * (h + f)));
    assert_true(lora.e.trainable == A);
    assert_true(lora.e.train_params == A);
    /* 16-bit base and adapters; fp32 gradient sums (the runtime's, on the
     * GPU with its optimizer) and 12 bytes of AdamW state for the adapters
     * only */
    assert_true(lora.e.bytes[PLAN_GPU][PLAN_PARAMS] == (P + A) * 2);
    assert_true(lora.e.bytes[PLAN_GPU][PLAN_GRADS] == A * 4);
    assert_true(lora.e.bytes[PLAN_GPU][PLAN_OPTIMIZER] == A * 12);
    assert_true(full.e.bytes[PLAN_GPU][PLAN_GRADS] == P * 4);
    /* activations: each layer keeps A x per adapter [s, r] (7 adapters), and
     * the backward one adapter's fp32 gradient [s, r] (the frozen norms'
     * weight gradients are not computed) */
    uint64_t added = (uint64_t)(L * s * 7 * r * 2 + 4 * s * r);
    assert_true(lora.e.bytes[PLAN_GPU][PLAN_ACTIVATIONS] ==
                full.e.bytes[PLAN_GPU][PLAN_ACTIVATIONS] + added);
    /* that gradient rounded to 16 bits in pool scratch for the GEMMs that
     * read it beside 16-bit x and A (gemm.cu's gemm_round_operand): [s, r]
     * bf16, outside the counted allocations; none for full fine-tuning */
    assert_true(item(&lora.e, "GEMM operand scratch") == (uint64_t)(s * r * 2));
    assert_true(item(&full.e, "GEMM operand scratch") == 0);

    /* QLoRA: the layers' seven linear weights in NF4 (each rounded up to 16
     * bytes in the frozen buffer), everything else 16-bit */
    cfg q = lora;
    lora_of(&q, PLAN_METHOD_QLORA, 16, ZO_LORA_ALL_LINEAR);
    run_cfg(&q);
    uint64_t hh = (uint64_t)h * (uint64_t)h, hf = (uint64_t)h * (uint64_t)f;
    uint64_t nf4 = (uint64_t)L * (4 * nf4_reference(hh) + 3 * nf4_reference(hf));
    uint64_t linear = (uint64_t)L * (4 * hh + 3 * hf);
    uint64_t frozen = nf4 + (P - linear) * 2;
    uint64_t got = q.e.bytes[PLAN_GPU][PLAN_PARAMS] - A * 2;
    assert_true(got >= frozen && got <= frozen + (uint64_t)L * 7 * 15);
    /* the transformer's frozen buffers for this model (test_lora's
     * test_sizes prints 3,865,595,008 bytes) */
    assert_true(got >= 3865595008ull && got <= 3865595008ull + (uint64_t)L * 7 * 15);
    /* 4.127 bits a weight, the paper's figure */
    assert_true(fabs(8.0 * (double)nf4 / (double)linear - 4.127) < 0.001);
    /* the scratch holds the widest weight the runtime dequantizes at once:
     * q|k|v fused, 3h x h, wider than LLaMA-2-7B's h x f MLP weights */
    assert_true(3 * hh > hf);
    assert_true(item(&q.e, "NF4 dequantization scratch") == 3 * hh * 2);
    assert_true(q.e.bytes[PLAN_GPU][PLAN_GRADS] == A * 4); /* fp32 sums */

    /* the frozen base streamed from the CPU: read-only there, slots on the
     * GPU for its largest block (the 16-bit head: the final norm and the
     * output layer), nothing written back */
    cfg st = q;
    st.t.params_on = PLAN_CPU;
    run_cfg(&st);
    assert_true(st.e.bytes[PLAN_CPU][PLAN_PARAMS] == got);
    assert_true(st.e.bytes[PLAN_GPU][PLAN_PARAMS] == A * 2); /* the adapters stay */
    uint64_t head = ((uint64_t)m->vocab + 1) * (uint64_t)h * 2;
    assert_true(item(&st.e, "weight slots") == (uint64_t)(st.t.buf.prefetch_depth + 1) * head);
    assert_true(st.pt.h2d_total > 0);
    /* with the base streamed, the adapters' optimizer may stay on the GPU:
     * no gradients cross PCIe */
    assert_true(st.pt.d2h_total == 0 && st.pt.cpu_adam == 0);

    /* the base on NVMe and the adapters in host memory, both streamed: a
     * slot holds a block of each (the base's rounded up to 256 bytes); the
     * base's NVMe store reads ahead into a ring of its slots and keeps one
     * more to assemble a block */
    cfg nv = q;
    nv.t.params_on = PLAN_NVME;
    nv.t.adapters_on = PLAN_CPU;
    run_cfg(&nv);
    uint64_t ring = (uint64_t)(nv.t.buf.prefetch_depth + 1);
    uint64_t fslot = (head + 255) / 256 * 256, aslot = A / (uint64_t)L * 2;
    /* on NVMe every block but the last starts on 4096 bytes (O_DIRECT) */
    uint64_t emb = (uint64_t)m->vocab * (uint64_t)h * 2, layer = (got - emb - head) / (uint64_t)L;
    uint64_t al = 4096;
    assert_true(nv.e.bytes[PLAN_NVME][PLAN_PARAMS] ==
                (emb + al - 1) / al * al + (uint64_t)L * ((layer + al - 1) / al * al) + head);
    assert_true(item(&nv.e, "LoRA adapters") == A * 2 && nv.e.bytes[PLAN_CPU][PLAN_PARAMS] == A * 2);
    assert_true(item(&nv.e, "weight slots") == ring * (fslot + aslot));
    assert_true(item(&nv.e, "NVMe weights read-ahead") == ring * fslot);
    /* both cross PCIe twice per micro-batch, the base also from NVMe */
    assert_true(fabs(nv.pt.h2d_total - 2.0 * (double)(got + A * 2) / nv.hw.pcie_bw) < 1e-9 * nv.pt.h2d_total);
    /* the CPU's updates of adapters that live on the host stay there; of
     * adapters on the GPU they go up */
    nv.t.opt_frac[PLAN_GPU] = 0;
    nv.t.opt_frac[PLAN_CPU] = 1;
    nv.t.grads_on = PLAN_CPU;
    run_cfg(&nv);
    assert_true(nv.pt.sched.cpu_n == (double)A && nv.pt.sched.w_bytes == 0);
    nv.t.adapters_on = PLAN_GPU;
    run_cfg(&nv);
    assert_true(nv.pt.sched.w_bytes == 2);
    assert_true(fabs(nv.pt.h2d_total - 2.0 * (double)got / nv.hw.pcie_bw) < 1e-9 * nv.pt.h2d_total);

    /* the adapters on NVMe: their store holds every block, each on 4096
     * bytes, the embeddings' and the head's too (no adapters: one element
     * each, wstore.c); at ZeRO-3 on 3 ranks a rank's part of each layer, the
     * largest of comm_shard's (issue 27: the runtime's 8 KiB over the plan) */
    cfg an = q;
    an.t.params_on = PLAN_CPU;
    an.t.adapters_on = PLAN_NVME;
    run_cfg(&an);
    uint64_t la = A / (uint64_t)L;
    assert_true(item(&an.e, "LoRA adapters") == ((uint64_t)L * ((la * 2 + al - 1) / al) + 2) * al);
    an.t.zero = 3;
    an.t.dp = 3;
    an.hw.gpus = 3;
    run_cfg(&an);
    uint64_t part = (la + 2) / 3;
    assert_true(item(&an.e, "LoRA adapters") == ((uint64_t)L * ((part * 2 + al - 1) / al) + 2) * al);
    /* the base partitioned over the 3 ranks as the runtime does it
     * (offload_dp_part_bytes): each block's bytes padded to 4 B x 3, a
     * rank's part a third of that; not a third of the whole, which is up to
     * 4 B a block less */
    uint64_t unit = 4 * 3;
    uint64_t want = (emb + unit - 1) / unit * 4 + (uint64_t)L * ((layer + unit - 1) / unit * 4) +
                    (head + unit - 1) / unit * 4;
    printf("  QLoRA base at ZeRO-3 on 3 ranks: %llu bytes a rank (a third of the whole: %llu)\n",
           (unsigned long long)item(&an.e, "frozen base"), (unsigned long long)((got + 2) / 3));
    assert_true(item(&an.e, "frozen base") == want);
    assert_true(want > (got + 2) / 3); /* the padding matters at this shape */
}

/* ---- time ----------------------------------------------------------------------------------- */

/* No weight-gradient GEMMs for the base: its FLOPs are the forward, the input
 * gradients and 6 per adapter parameter a token; QLoRA adds the
 * dequantization of each linear weight in the forward and the backward. */
/* Phi-4 (the preset: 40 layers, h 5120, 10 kv heads of 128, f 17920):
 * PEFT's four adapters a layer over the fused qkv_proj [7680, 5120] and
 * gate_up_proj [35840, 5120] (and o_proj, down_proj), each layer keeping
 * their four A x; QLoRA's frozen base with those four tensors in NF4, the
 * dequantization scratch as large as gate_up_proj (the runtime dequantizes
 * it whole for the gate and the up GEMM). */
static void test_phi4_memory(void **state)
{
    (void)state;
    cfg full, lora;
    full_run("phi-4", &full);
    const zo_model_config *m = &full.m;
    double L = 40, h = 5120, q = 40 * 128, qkv = q + 2 * 10 * 128, f = 17920, s = 2048, r = 16;
    assert_true(zo_model_params(m) == 14659507200ull); /* by hand: tests/test_planner_families.c */
    lora = full;
    lora_of(&lora, PLAN_METHOD_LORA, 16, ZO_LORA_ALL_LINEAR);
    run_cfg(&lora);
    uint64_t A = (uint64_t)(L * r * ((h + qkv) + (q + h) + (h + 2 * f) + (f + h)));
    assert_true(A == 55705600ull);
    assert_true(lora.e.trainable == A);
    /* each layer's A x of its 4 adapters (fused qkv and gate_up), one
     * adapter's fp32 gradient; no sink: the frozen norms' dw is not computed */
    uint64_t added = (uint64_t)(L * s * 4 * r * 2 + 4 * s * r);
    assert_true(lora.e.bytes[PLAN_GPU][PLAN_ACTIVATIONS] == full.e.bytes[PLAN_GPU][PLAN_ACTIVATIONS] + added);
    cfg ql = lora;
    lora_of(&ql, PLAN_METHOD_QLORA, 16, ZO_LORA_ALL_LINEAR);
    run_cfg(&ql);
    uint64_t w[4] = {(uint64_t)(h * qkv), (uint64_t)(h * q), (uint64_t)(h * 2 * f), (uint64_t)(f * h)};
    uint64_t nf4 = 0, linear = 0;
    for (int i = 0; i < 4; i++) nf4 += (uint64_t)L * nf4_reference(w[i]), linear += (uint64_t)L * w[i];
    uint64_t frozen = nf4 + (zo_model_params(m) - linear) * 2;
    uint64_t got = ql.e.bytes[PLAN_GPU][PLAN_PARAMS] - A * 2;
    assert_true(got >= frozen && got <= frozen + (uint64_t)L * 4 * 15);
    assert_true(item(&ql.e, "NF4 dequantization scratch") == w[2] * 2);
}

static void test_lora_cost(void **state)
{
    (void)state;
    cfg full, lora;
    assert_int_equal(zo_model_preset_find("llama-2-7b", &full.m), ZO_OK);
    assert_int_equal(plan_hw_find("h100-80gb", &full.hw), ZO_OK);
    plan_train_defaults(&full.t, &full.m);
    full.t.seq = 4096;
    run_cfg(&full);
    lora = full;
    lora_of(&lora, PLAN_METHOD_LORA, 8, ZO_LORA_Q | ZO_LORA_V);
    run_cfg(&lora);
    const zo_model_config *m = &full.m;
    double L = m->n_layers, h = m->hidden, f = m->ffn, v = m->vocab;
    double A = (double)lora.e.trainable, W = L * (4 * h * h + 3 * h * f) + h * v;
    /* full: 6 per matmul weight a token; LoRA: 4, and 6 per adapter weight */
    double diff = full.pt.mb.model_flops_token - lora.pt.mb.model_flops_token;
    assert_true(fabs(diff - (2 * W - 6 * A)) < 1e-9 * diff);
    /* no weight gradients: the base's matmuls 2 a weight instead of 3 (the
     * backward as a whole is not under 0.75x of full's on an H100, where the
     * runtime's attention backward, the same in both, was measured at 27
     * TFLOP/s: issue 25) */
    assert_true(lora.pt.mb.ops[PLAN_OP_GEMM] < 0.75 * full.pt.mb.ops[PLAN_OP_GEMM]);
    assert_true(lora.pt.mb.bwd < full.pt.mb.bwd);
    assert_true(lora.pt.mb.fwd > full.pt.mb.fwd); /* the adapters' GEMMs */
    assert_true(lora.pt.mb.fwd < 1.05 * full.pt.mb.fwd);
    /* the update on the GPU over the adapters only */
    double ratio = lora.pt.optimizer_gpu / full.pt.optimizer_gpu;
    assert_true(fabs(ratio - A / (double)full.e.stage_params) < 1e-9 * ratio);

    cfg q = lora;
    lora_of(&q, PLAN_METHOD_QLORA, 8, ZO_LORA_Q | ZO_LORA_V);
    run_cfg(&q);
    double hh = h * h, hf = h * f;
    /* on the H100, this runtime's dequantization as measured: LLaMA-2-13B's
     * 80 x 317,194,240 parameters in 139.688 ms a step (train --profile,
     * NVIDIA H100 80GB HBM3, 2026-11-26) */
    double dq_f = q.pt.mb.fwd - lora.pt.mb.fwd, dq_b = q.pt.mb.bwd - lora.pt.mb.bwd;
    double rate = 80.0 * 317194240.0 / 0.139688;
    assert_true(fabs(dq_f - L * (4 * hh + 3 * hf) / rate) < 1e-9 * dq_f);
    assert_true(fabs(dq_b - dq_f) < 1e-12);
    assert_true(q.pt.mb.model_flops_token == lora.pt.mb.model_flops_token);
    assert_true(fabs(q.pt.mb.ops[PLAN_OP_NF4] - 2 * dq_f) < 1e-9 * dq_f);
    /* where the runtime's kernels were not measured (A100): per layer the
     * NF4 weights read (each rounded up to 16 bytes) and the bf16 weights
     * written, at the HBM's achieved bandwidth */
    cfg qa = q, la = lora;
    assert_int_equal(plan_hw_find("a100-80gb", &qa.hw), ZO_OK);
    la.hw = qa.hw;
    run_cfg(&qa);
    run_cfg(&la);
    double bytes = 4 * (double)nf4_reference((uint64_t)hh) + 3 * (double)nf4_reference((uint64_t)hf);
    double bw = qa.hw.hbm_bw * qa.hw.hbm_eff;
    double lo = L * (bytes + (4 * hh + 3 * hf) * 2) / bw, hi = lo + L * 7 * 15 / bw;
    dq_f = qa.pt.mb.fwd - la.pt.mb.fwd;
    dq_b = qa.pt.mb.bwd - la.pt.mb.bwd;
    assert_true(dq_f >= lo * (1 - 1e-12) && dq_f <= hi * (1 + 1e-12));
    assert_true(fabs(dq_b - dq_f) < 1e-12);
}

/* ---- the QLoRA paper's claims --------------------------------------------------------------- */

/* Dettmers et al. 2023: QLoRA fine-tunes a 65B LLaMA on one 48 GB GPU and a
 * 33B one on a 24 GB consumer GPU, with gradient checkpointing and a small
 * batch; its adapters are rank 64 on every linear layer (alpha 16), their
 * optimizer state paged to the CPU when the GPU runs short. LLaMA-1's
 * shapes (huggyllama/llama-30b, llama-65b), batch 1. */
static void test_qlora_claims(void **state)
{
    (void)state;
    static const struct {
        const char *config, *gpu;
    } c[] = {{"llama-65b.json", "rtx-a6000"}, {"llama-30b.json", "rtx-4090"}};
    for (size_t i = 0; i < 2; i++) {
        cfg x;
        load(c[i].config, &x.m);
        assert_int_equal(plan_hw_find(c[i].gpu, &x.hw), ZO_OK);
        plan_train_defaults(&x.t, &x.m);
        x.t.seq = 512;
        x.t.recompute = PLAN_RECOMPUTE_FULL;
        lora_of(&x, PLAN_METHOD_QLORA, 64, ZO_LORA_ALL_LINEAR);
        /* the paper's adapters: the optimizer state (9.6 GB for 65B) goes to
         * the CPU, as its paged optimizer does */
        x.t.opt_frac[PLAN_GPU] = 0;
        x.t.opt_frac[PLAN_CPU] = 1;
        x.t.grads_on = PLAN_CPU;
        run_cfg(&x);
        printf("  %s QLoRA r 64 all-linear, seq 512, optimizer on the CPU: GPU %.2f of %.2f GiB\n",
               c[i].config, (double)x.e.total[PLAN_GPU] / (1 << 30), (double)x.hw.gpu_mem / (1 << 30));
        assert_true(x.e.fits);
        assert_true(x.e.bytes[PLAN_GPU][PLAN_OPTIMIZER] == 0);
        /* rank 16, everything on the GPU, 2048 tokens: fits too */
        cfg y = x;
        y.t.seq = 2048;
        lora_of(&y, PLAN_METHOD_QLORA, 16, ZO_LORA_ALL_LINEAR);
        y.t.opt_frac[PLAN_GPU] = 1;
        y.t.opt_frac[PLAN_CPU] = 0;
        y.t.grads_on = PLAN_GPU;
        run_cfg(&y);
        printf("  %s QLoRA r 16 all-linear, seq 2048, all on the GPU: GPU %.2f GiB\n", c[i].config,
               (double)y.e.total[PLAN_GPU] / (1 << 30));
        assert_true(y.e.fits);
        /* what makes it fit is the NF4 base: with a 16-bit one it does not */
        cfg z = x;
        z.t.method = PLAN_METHOD_LORA;
        run_cfg(&z);
        assert_false(z.e.fits);
        assert_true(z.e.total[PLAN_GPU] > 2 * x.hw.gpu_mem);
    }
}

/* ---- alternatives, plan files, max-model ---------------------------------------------------- */

/* Full fine-tuning of LLaMA-1 33B does not fit a desktop with an RTX 4090
 * and 64 GB of RAM; QLoRA and LoRA are among the ranked alternatives, and
 * each one's flags, applied, fit. */
static void test_suggestions(void **state)
{
    (void)state;
    char args[1024], cmd[2048];
    snprintf(args, sizeof args, "estimate --model %s/hf-configs/llama-30b.json --gpu rtx-4090 "
             "--cpu-mem 64GB --seq 2048", ZO_FIXTURES_DIR);
    cJSON *doc = run_memplan_json(args, 1);
    const cJSON *sg = cJSON_GetObjectItemCaseSensitive(doc, "suggestions");
    int kinds[3] = {0};
    double prev = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, sg)
    {
        const char *kind = cJSON_GetObjectItemCaseSensitive(a, "kind")->valuestring;
        const char *flags = cJSON_GetObjectItemCaseSensitive(a, "flags")->valuestring;
        double step = run_json_num(a, "step_s", NULL);
        assert_true(step >= prev);
        prev = step;
        kinds[!strcmp(kind, "lora") ? 1 : !strcmp(kind, "qlora") ? 2 : 0]++;
        if (strcmp(kind, "offload")) assert_non_null(strstr(flags, "--lora 16 --lora-targets all-linear"));
        snprintf(cmd, sizeof cmd, "%s %s", args, flags);
        cJSON *d = run_memplan_json(cmd, 0);
        assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "fits")));
        assert_true(run_json_num(d, "time", "step_s") == step);
        cJSON_Delete(d);
    }
    assert_int_equal(kinds[1], 1);
    assert_int_equal(kinds[2], 1);
    cJSON_Delete(doc);
}

/* A linear layer LoRA adapts when `bit` is among the targets: in x out,
 * `times` of them in the model. */
typedef struct adapted {
    unsigned bit;
    uint64_t in, out, times;
} adapted;

/* DeepSeek-V3 (config.json): 61 layers of latent attention, q_a 7168 ->
 * 1536, q_b 1536 -> 128 heads x (128 + 64), kv_a_proj_with_mqa 7168 -> 512
 * + 64, kv_b 512 -> 128 x (128 + 128), o 128 x 128 -> 7168; 3 dense
 * layers' MLP of 18432; 58 MoE layers of 256 routed experts and one shared
 * of 2048 (the router and its score correction are not adapted). */
static const adapted v3_linear[] = {
    {ZO_LORA_Q, 7168, 1536, 61},
    {ZO_LORA_Q, 1536, 128 * 192, 61},
    {ZO_LORA_K | ZO_LORA_V, 7168, 576, 61},
    {ZO_LORA_K | ZO_LORA_V, 512, 128 * 256, 61},
    {ZO_LORA_O, 128 * 128, 7168, 61},
    {ZO_LORA_GATE, 7168, 18432, 3},
    {ZO_LORA_UP, 7168, 18432, 3},
    {ZO_LORA_DOWN, 18432, 7168, 3},
    {ZO_LORA_GATE, 7168, 2048, 58 * 256},
    {ZO_LORA_UP, 7168, 2048, 58 * 256},
    {ZO_LORA_DOWN, 2048, 7168, 58 * 256},
    {ZO_LORA_GATE, 7168, 2048, 58},
    {ZO_LORA_UP, 7168, 2048, 58},
    {ZO_LORA_DOWN, 2048, 7168, 58},
};

/* Qwen1.5-MoE-A2.7B (Qwen2-MoE): 24 layers of q, k, v, o 2048 -> 2048, 60
 * routed experts of 1408 and a shared expert of 5632 (its sigmoid gate and
 * the router not adapted). */
static const adapted qwen2_moe_linear[] = {
    {ZO_LORA_Q, 2048, 2048, 24},          {ZO_LORA_K, 2048, 2048, 24},
    {ZO_LORA_V, 2048, 2048, 24},          {ZO_LORA_O, 2048, 2048, 24},
    {ZO_LORA_GATE, 2048, 1408, 24 * 60},  {ZO_LORA_UP, 2048, 1408, 24 * 60},
    {ZO_LORA_DOWN, 1408, 2048, 24 * 60},  {ZO_LORA_GATE, 2048, 5632, 24},
    {ZO_LORA_UP, 2048, 5632, 24},         {ZO_LORA_DOWN, 5632, 2048, 24},
};

/* LoRA's trainable count: r (in + out) for every adapted linear layer. */
static uint64_t adapters_of(const adapted *a, size_t n, unsigned targets, uint64_t r)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        if (a[i].bit & targets) sum += r * (a[i].in + a[i].out) * a[i].times;
    return sum;
}

/* The bytes of the items of `doc`'s per-rank tiers named `name`, summed. */
static uint64_t item_bytes(const cJSON *doc, const char *name)
{
    static const char *const tiers[] = {"gpu", "cpu", "nvme"};
    uint64_t sum = 0;
    for (int t = 0; t < 3; t++) {
        const cJSON *tier = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "per_rank"), tiers[t]);
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(tier, "items"))
        {
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(it, "name")->valuestring, name))
                sum += (uint64_t)run_json_num(it, "bytes", NULL);
        }
    }
    return sum;
}

/* Latent attention and mixtures of experts with a dense first layer, a
 * router score correction or a gated shared expert get LoRA and QLoRA
 * among the alternatives where the command does not fit: DeepSeek-V3 on
 * one H200 with 2 TB of host memory and no NVMe (full fine-tuning needs 16
 * bytes a parameter: no offload fits), Qwen2-MoE on an RTX 4090 desktop
 * with 64 GB; from full fine-tuning (rank 16 on all-linear: both kinds)
 * and from LoRA on some targets that does not fit (QLoRA, the command's
 * adapters). Each suggestion's flags, added to the command, fit with the
 * same bytes a tier and step time, and its adapters are the count written
 * above from the models' shapes: the trainable parameters, the adapters'
 * bf16 bytes and their AdamW fp32 master, m and v. A model known only by
 * its size (--params) gets none, and its verdict says why. */
static void test_suggestions_moe(void **state)
{
    (void)state;
    static const struct {
        const char *config, *hw, *flags;
        const adapted *linear;
        size_t n;
        int r;
        unsigned targets;
        int kinds; /* bit 1: lora, bit 2: qlora */
    } c[] = {
        {"deepseek-v3.json", "--gpu h200 --cpu-mem 2TB --nvme 0 --seq 4096", "", v3_linear,
         sizeof v3_linear / sizeof v3_linear[0], 16, ZO_LORA_ALL_LINEAR, 6},
        {"deepseek-v3.json", "--gpu h200 --cpu-mem 1TB --nvme 0 --seq 4096", "--lora 8 --lora-targets q,o", v3_linear,
         sizeof v3_linear / sizeof v3_linear[0], 8, ZO_LORA_Q | ZO_LORA_O, 4},
        {"qwen1.5-moe-a2.7b.json", "--gpu rtx-4090 --cpu-mem 64GB --seq 2048", "", qwen2_moe_linear,
         sizeof qwen2_moe_linear / sizeof qwen2_moe_linear[0], 16, ZO_LORA_ALL_LINEAR, 6},
        {"qwen1.5-moe-a2.7b.json", "--gpu rtx-4090 --cpu-mem 64GB --seq 2048", "--lora 8 --lora-targets up,down",
         qwen2_moe_linear, sizeof qwen2_moe_linear / sizeof qwen2_moe_linear[0], 8, ZO_LORA_UP | ZO_LORA_DOWN, 4},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char args[1024], cmd[2048];
        snprintf(args, sizeof args, "estimate --model %s/hf-configs/%s %s %s", ZO_FIXTURES_DIR, c[i].config, c[i].hw,
                 c[i].flags);
        cJSON *doc = run_memplan_json(args, 1);
        assert_false(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "fits")));
        const uint64_t want = adapters_of(c[i].linear, c[i].n, c[i].targets, (uint64_t)c[i].r);
        int kinds = 0;
        const cJSON *a;
        cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(doc, "suggestions"))
        {
            const char *kind = cJSON_GetObjectItemCaseSensitive(a, "kind")->valuestring;
            const char *flags = cJSON_GetObjectItemCaseSensitive(a, "flags")->valuestring;
            int k = !strcmp(kind, "lora") ? 1 : !strcmp(kind, "qlora") ? 2 : 0;
            if (!k) continue;
            kinds |= 1 << k;
            if (!c[i].flags[0]) assert_non_null(strstr(flags, "--lora 16 --lora-targets all-linear"));
            else assert_null(strstr(flags, "--lora")); /* (the command's adapters kept) */
            snprintf(cmd, sizeof cmd, "%s %s", args, flags);
            cJSON *d = run_memplan_json(cmd, 0);
            printf("  %s %s: %s %s: GPU %.2f GiB, CPU %.2f GiB, %.3f s a step, %llu adapter parameters\n",
                   c[i].config, c[i].flags, kind, flags, run_json_num(a, "per_rank", "gpu") / (1 << 30),
                   run_json_num(a, "per_rank", "cpu") / (1 << 30), run_json_num(a, "step_s", NULL),
                   (unsigned long long)want);
            assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "fits")));
            assert_string_equal(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(d, "config"), "method")
                                    ->valuestring,
                                kind);
            assert_true(run_json_num(d, "time", "step_s") == run_json_num(a, "step_s", NULL));
            static const char *const tiers[] = {"gpu", "cpu", "nvme"};
            for (int t = 0; t < 3; t++) {
                const cJSON *pr = cJSON_GetObjectItemCaseSensitive(d, "per_rank");
                assert_true(run_json_num(cJSON_GetObjectItemCaseSensitive(pr, tiers[t]), "total", NULL) ==
                            run_json_num(a, "per_rank", tiers[t]));
            }
            if ((uint64_t)run_json_num(d, "trainable_params", NULL) != want)
                fail_msg("%s: %.0f trainable, the adapters' count is %llu", cmd, run_json_num(d, "trainable_params", NULL),
                         (unsigned long long)want);
            assert_true(item_bytes(d, "LoRA adapters (A, B)") == 2 * want); /* bf16 */
            assert_true(item_bytes(d, "AdamW: fp32 master, m, v") == 12 * want);
            cJSON_Delete(d);
        }
        if (kinds != c[i].kinds) fail_msg("%s: suggestion kinds 0x%x, want 0x%x", args, kinds, c[i].kinds);
        cJSON_Delete(doc);
    }
    /* a model known only by its size gets none, and the verdict says why */
    static char out[1 << 14];
    assert_int_equal(run_memplan("estimate --params 70B --gpu rtx-4090 --cpu-mem 64GB --nvme 0", out, sizeof out), 1);
    if (!strstr(out, "LoRA and QLoRA not tried: their adapters need the model's layers"))
        fail_msg("no reason for the missing LoRA and QLoRA in\n%s", out);
}

/* memplan writes the method into the plan file and reads it back to the
 * same estimate. */
static void test_plan_file(void **state)
{
    (void)state;
    char path[256], args[1024];
    scratch_path(path, sizeof path, "zo_test_peft_%d.json", (int)getpid());
    snprintf(args, sizeof args, "estimate --model llama-2-13b --gpu rtx-4090 --seq 1024 --lora 32 "
             "--lora-targets q,k,v,o --lora-alpha 64 --qlora --recompute full --optimizer cpu --schedule dpu "
             "--opt-threads 6 --plan-out %s", path);
    cJSON *doc = run_memplan_json(args, 0);
    zo_plan p;
    assert_int_equal(zo_plan_load(path, &p), ZO_OK);
    assert_true(p.training.method == ZO_PLAN_QLORA && p.training.has_lora);
    assert_true(p.training.lora.r == 32 && p.training.lora.alpha == 64);
    assert_true(p.training.lora.targets == (ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V | ZO_LORA_O));
    assert_true(p.training.optimizer_schedule == ZO_PLAN_SCHED_DPU && p.training.opt_threads == 6);
    snprintf(args, sizeof args, "estimate --plan %s", path);
    cJSON *back = run_memplan_json(args, 0);
    assert_true(run_json_num(back, "trainable_params", NULL) == run_json_num(doc, "trainable_params", NULL));
    const char *tiers[] = {"gpu", "cpu", "nvme"};
    for (int t = 0; t < 3; t++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "per_rank"), tiers[t]);
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(back, "per_rank"), tiers[t]);
        assert_true(run_json_num(a, "total", NULL) == run_json_num(b, "total", NULL));
        assert_true(run_json_num(a, "total", NULL) == (double)p.predicted.peak_bytes[t]);
    }
    assert_true(run_json_num(back, "time", "step_s") == run_json_num(doc, "time", "step_s"));
    cJSON_Delete(back);
    cJSON_Delete(doc);
    remove(path);
}

/* max-model with QLoRA: every row's flags carry the method, and the command
 * each row gives to check its largest preset runs and fits. */
static void test_max_model(void **state)
{
    (void)state;
    static char out[1 << 16];
    int rc = run_memplan("max-model --family llama --gpu rtx-4090 --cpu-mem 64GB --seq 2048 "
                         "--lora 16 --lora-targets all-linear --qlora", out, sizeof out);
    assert_int_equal(rc, 0);
    int rows = 0, checks = 0;
    for (char *sv = NULL, *line = strtok_r(out, "\n", &sv); line; line = strtok_r(NULL, "\n", &sv)) {
        if (strstr(line, "    flags: ")) {
            rows++;
            assert_non_null(strstr(line, "--lora 16 --lora-targets all-linear --qlora"));
        }
        const char *chk = strstr(line, "    check: memplan ");
        if (!chk) continue;
        static char o2[1 << 16];
        assert_int_equal(run_memplan(chk + strlen("    check: memplan "), o2, sizeof o2), 0);
        assert_non_null(strstr(o2, "QLoRA r 16 (alpha 8) on all-linear"));
        checks++;
    }
    assert_true(rows == 4 && checks >= 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peft_counts_cli), cmocka_unit_test(test_lora_memory),
        cmocka_unit_test(test_phi4_memory),
        cmocka_unit_test(test_lora_cost),       cmocka_unit_test(test_qlora_claims),
        cmocka_unit_test(test_suggestions),     cmocka_unit_test(test_suggestions_moe),
        cmocka_unit_test(test_plan_file),
        cmocka_unit_test(test_max_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
