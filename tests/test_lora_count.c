/* Tests for common/lora: LoRA targets and the trainable-parameter count of
 * Hugging Face PEFT (print_trainable_parameters) for real model configs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/lora.h" /* defines: zo_lora_trainable_params, zo_lora_targets_parse */

static zo_model_config load(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/hf-configs/%s.json", ZO_FIXTURES_DIR, name);
    zo_model_config c;
    assert_int_equal(zo_model_config_load(path, &c), ZO_OK);
    return c;
}

static uint64_t count(const char *model, int r, const char *targets)
{
    zo_model_config c = load(model);
    unsigned t;
    assert_int_equal(zo_lora_targets_parse(targets, &t), ZO_OK);
    zo_lora_config lc = {.r = r, .alpha = 2.0f * r, .targets = t};
    assert_int_equal(zo_lora_check(&c, &lc), ZO_OK);
    return zo_lora_trainable_params(&c, r, t);
}

/* Each count is n_layers x sum over adapted layers of r (in + out). */
static void test_peft_counts(void **state)
{
    (void)state;
    /* LLaMA-2-7B (h 4096, 32 layers), r 8 on q_proj and v_proj:
     * 32 x 8 x ((4096 + 4096) + (4096 + 4096)) */
    assert_int_equal(count("llama-2-7b", 8, "q,v"), 4194304);
    assert_int_equal(count("llama-2-7b", 8, "q_proj,v_proj"), 4194304);
    /* r 16 on all seven (f 11008): 32 x 16 x (4 x 8192 + 3 x (4096 + 11008)) */
    assert_int_equal(count("llama-2-7b", 16, "q,k,v,o,gate,up,down"), 39976960);
    assert_int_equal(count("llama-2-7b", 16, "all-linear"), 39976960);
    /* LLaMA-2-13B (h 5120, f 13824, 40 layers), r 64 all-linear (the QLoRA
     * paper's Guanaco setting): 40 x 64 x (4 x 10240 + 3 x 18944) */
    assert_int_equal(count("llama-2-13b", 64, "all-linear"), 250347520);
    /* Mistral-7B, GQA (8 kv heads of 128: k, v are [1024, 4096]), f 14336, r 16
     * all-linear: 32 x 16 x (2 x 8192 + 2 x 5120 + 3 x 18432) */
    assert_int_equal(count("mistral-7b", 16, "all-linear"), 41943040);
    /* LLaMA-3-8B (8 kv heads), r 8 on q and v: 32 x 8 x (8192 + 5120) */
    assert_int_equal(count("llama-3-8b", 8, "q,v"), 3407872);
    /* GPT-2 (h 768, 12 layers), PEFT's default target for gpt2, c_attn [2304, 768]:
     * 12 x 8 x (768 + 2304); q, v or c_attn name the same fused layer */
    assert_int_equal(count("gpt2", 8, "c_attn"), 294912);
    assert_int_equal(count("gpt2", 8, "q,v"), 294912);
    /* GPT-2 all-linear (c_attn, attn.c_proj, c_fc, mlp.c_proj; no gate, no head):
     * 12 x 4 x (3072 + 1536 + 3840 + 3840) */
    assert_int_equal(count("gpt2", 4, "all-linear"), 589824);
    /* o and down are GPT-2's two c_proj: 12 x 4 x (1536 + 3840) */
    assert_int_equal(count("gpt2", 4, "c_proj"), 258048);
    assert_int_equal(count("gpt2", 4, "o,down"), 258048);
    /* Mixtral-8x7B (h 4096, 8 kv heads of 128, 8 experts of 14336), r 16 on
     * q_proj, v_proj and every expert's w1, w2, w3 (PEFT's names):
     * 32 x 16 x ((4096 + 4096) + (4096 + 1024) + 8 x 3 x (4096 + 14336)) */
    assert_int_equal(count("mixtral-8x7b", 16, "q_proj,v_proj,w1,w2,w3"), 233308160);
    assert_int_equal(count("mixtral-8x7b", 16, "q,v,gate,up,down"), 233308160);
    /* Qwen1.5-MoE-A2.7B (h 2048, 60 experts of 1408, a shared expert of
     * 5632), r 8 all-linear (the router and shared_expert_gate carry none):
     * 24 x 8 x (4 x 4096 + 60 x 3 x 3456 + 3 x 7680) */
    assert_int_equal(count("qwen1.5-moe-a2.7b", 8, "all-linear"), 127008768);
    /* Phi-3-mini (h 3072, f 8192, 32 layers), PEFT's Phi-3 modules: qkv_proj
     * [9216, 3072], o_proj, gate_up_proj [16384, 3072], down_proj; r 8
     * all-linear: 32 x 8 x (12288 + 6144 + 19456 + 11264) */
    assert_int_equal(count("phi-3-mini-4k-instruct", 8, "all-linear"), 12582912);
    assert_int_equal(count("phi-3-mini-4k-instruct", 8, "qkv_proj,o_proj,gate_up_proj,down_proj"), 12582912);
    /* q and v (or any of q, k, v) are the fused qkv_proj: 32 x 8 x 12288 */
    assert_int_equal(count("phi-3-mini-4k-instruct", 8, "q,v"), 3145728);
    assert_int_equal(count("phi-3-mini-4k-instruct", 8, "qkv_proj"), 3145728);
    /* Phi-4 (h 5120, 10 kv heads of 128, f 17920, 40 layers), r 16
     * all-linear: 40 x 16 x (12800 + 10240 + 40960 + 23040) */
    assert_int_equal(count("phi-4", 16, "all-linear"), 55705600);
    /* up alone is the fused gate_up_proj: 40 x 16 x 40960 */
    assert_int_equal(count("phi-4", 16, "up"), 26214400);
    /* Phi-2 (h 2560, f 10240, 32 layers), PEFT's Phi modules q_proj, k_proj,
     * v_proj, dense, fc1, fc2 (the biased lm_head none); r 16 on all six:
     * 32 x 16 x (4 x (2560 + 2560) + 2 x (2560 + 10240)) */
    assert_int_equal(count("phi-2", 16, "q_proj,k_proj,v_proj,dense,fc1,fc2"), 23592960);
    assert_int_equal(count("phi-2", 16, "all-linear"), 23592960);
    /* q and v apart: 32 x 8 x 2 x (2560 + 2560) */
    assert_int_equal(count("phi-2", 8, "q,v"), 2621440);
    /* GPT-J-6B (h 4096, f 16384, 28 layers), PEFT's GPT-J modules q_proj,
     * k_proj, v_proj, out_proj, fc_in, fc_out; r 16 on all six:
     * 28 x 16 x (4 x (4096 + 4096) + 2 x (4096 + 16384)) */
    assert_int_equal(count("gpt-j-6b", 16, "q_proj,k_proj,v_proj,out_proj,fc_in,fc_out"), 33030144);
    assert_int_equal(count("gpt-j-6b", 16, "all-linear"), 33030144);
    /* StarCoder2-3B (h 3072, f 12288, 30 layers, 2 kv heads of 128), PEFT's
     * StarCoder2 modules q_proj, k_proj, v_proj, o_proj, c_fc, c_proj; r 16
     * on all six: 30 x 16 x (2 x (3072 + 3072) + 2 x (3072 + 256) + 2 x
     * (3072 + 12288)); q and v: 30 x 8 x ((3072 + 3072) + (3072 + 256)) */
    assert_int_equal(count("starcoder2-3b", 16, "q_proj,k_proj,v_proj,o_proj,c_fc,c_proj"), 23838720);
    assert_int_equal(count("starcoder2-3b", 16, "all-linear"), 23838720);
    assert_int_equal(count("starcoder2-3b", 8, "q,v"), 2273280);
    /* Pythia-160M (GPT-NeoX: h 768, f 3072, 12 layers), PEFT's GPT-NeoX modules:
     * query_key_value [2304, 768] (its default target; q, v name it too), dense,
     * dense_h_to_4h, dense_4h_to_h; r 8 on query_key_value: 12 x 8 x 3072 */
    assert_int_equal(count("pythia-160m", 8, "query_key_value"), 294912);
    assert_int_equal(count("pythia-160m", 8, "q,v"), 294912);
    /* r 16 on the four: 12 x 16 x (3072 + 1536 + 3840 + 3840) */
    assert_int_equal(count("pythia-160m", 16, "query_key_value,dense,dense_h_to_4h,dense_4h_to_h"), 2359296);
    assert_int_equal(count("pythia-160m", 16, "all-linear"), 2359296);
    /* dense is the attention's output alone (PEFT matches names ending in ".dense"): 12 x 4 x 1536 */
    assert_int_equal(count("pythia-160m", 4, "dense"), 73728);
    /* Falcon-7B (h 4544, one kv head of 64: query_key_value [4672, 4544], f 18176, 32 layers),
     * PEFT's default target for Falcon, r 16: 32 x 16 x (4544 + 4672), the 4,718,592 PEFT prints */
    assert_int_equal(count("falcon-7b", 16, "query_key_value"), 4718592);
    /* the four: 32 x 16 x (9216 + 9088 + 22720 + 22720) */
    assert_int_equal(count("falcon-7b", 16, "all-linear"), 32636928);
    /* OPT-125m (h 768, f 3072, 12 layers), PEFT's default targets for OPT, q_proj and v_proj,
     * r 8: 12 x 2 x 8 x (768 + 768) */
    assert_int_equal(count("opt-125m", 8, "q_proj,v_proj"), 294912);
    /* every linear layer, r 16: 12 x 16 x (4 x 1536 + 2 x (768 + 3072)) */
    assert_int_equal(count("opt-125m", 16, "all-linear"), 2654208);
    assert_int_equal(count("opt-125m", 16, "q,k,v,o,fc1,fc2"), 2654208);
    /* BLOOM-560m (h 1024, 24 layers), PEFT's default target query_key_value [3072, 1024], r 8:
     * 24 x 8 x (1024 + 3072), the 786,432 PEFT prints for it */
    assert_int_equal(count("bloom-560m", 8, "query_key_value"), 786432);
}

static void test_modules(void **state)
{
    (void)state;
    zo_model_config c = load("llama-3-8b");
    zo_lora_module m[ZO_LORA_MAX_MODULES];
    assert_int_equal(zo_lora_layer_modules(&c, ZO_LORA_ALL_LINEAR, m), 7);
    assert_string_equal(m[0].peft, "q_proj");
    assert_string_equal(m[2].path, "self_attn.v_proj");
    assert_int_equal(m[2].out, 1024);
    assert_int_equal(m[6].in, 14336);
    zo_model_config g = load("gpt2");
    assert_int_equal(zo_lora_layer_modules(&g, ZO_LORA_ALL_LINEAR, m), 4);
    assert_string_equal(m[0].path, "attn.c_attn");
    assert_int_equal(m[0].out, 2304);
    assert_string_equal(m[1].peft, "attn.c_proj");
    assert_string_equal(m[3].peft, "mlp.c_proj");
    assert_int_equal(zo_lora_layer_modules(&g, ZO_LORA_K, m), 1);
    assert_int_equal(m[0].targets, ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V);
    /* the layers a target set adapts: all-linear and the list of every
     * module are one set (an adapter directory lists modules) */
    const unsigned gpt_all = ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V | ZO_LORA_O | ZO_LORA_UP | ZO_LORA_DOWN;
    assert_int_equal(zo_lora_targets_effective(&g, ZO_LORA_ALL_LINEAR), gpt_all);
    assert_int_equal(zo_lora_targets_effective(&g, gpt_all), gpt_all);
    assert_int_equal(zo_lora_targets_effective(&g, ZO_LORA_Q), ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V);
    assert_int_equal(zo_lora_targets_effective(&c, ZO_LORA_ALL_LINEAR), ZO_LORA_ALL_LINEAR);
    assert_int_equal(zo_lora_targets_effective(&c, ZO_LORA_Q | ZO_LORA_V), ZO_LORA_Q | ZO_LORA_V);
    /* a mixture of experts: the attention's, the routed experts' (once per
     * expert, at expert_path.N.path), the shared expert's */
    char buf[128];
    zo_model_config x = load("mixtral-8x7b");
    assert_int_equal(zo_lora_layer_modules(&x, ZO_LORA_ALL_LINEAR, m), 7);
    assert_string_equal(m[4].peft, "w1");
    assert_string_equal(m[5].peft, "w3");
    assert_string_equal(m[6].peft, "w2");
    assert_int_equal(m[6].experts, 8);
    assert_int_equal(m[6].in, 14336);
    assert_string_equal(zo_lora_module_path(&m[4], 7, buf, sizeof buf), "block_sparse_moe.experts.7.w1");
    assert_string_equal(zo_lora_module_path(&m[0], 7, buf, sizeof buf), "self_attn.q_proj");
    zo_model_config q = load("qwen1.5-moe-a2.7b");
    assert_int_equal(zo_lora_layer_modules(&q, ZO_LORA_ALL_LINEAR, m), 10);
    assert_string_equal(zo_lora_module_path(&m[5], 59, buf, sizeof buf), "mlp.experts.59.up_proj");
    assert_string_equal(m[7].path, "mlp.shared_expert.gate_proj");
    assert_string_equal(m[7].peft, "gate_proj");
    assert_int_equal(m[7].experts, 0);
    assert_int_equal(m[7].out, 5632);
    assert_int_equal(zo_lora_layer_modules(&q, ZO_LORA_DOWN, m), 2);
    /* Phi-3: q|k|v and gate|up one module each, as PEFT names them */
    zo_model_config p = load("phi-4");
    assert_int_equal(zo_lora_layer_modules(&p, ZO_LORA_ALL_LINEAR, m), 4);
    assert_string_equal(m[0].peft, "qkv_proj");
    assert_string_equal(m[0].path, "self_attn.qkv_proj");
    assert_int_equal(m[0].out, 5120 + 2 * 1280);
    assert_string_equal(m[2].path, "mlp.gate_up_proj");
    assert_int_equal(m[2].out, 2 * 17920);
    assert_int_equal(m[2].targets, ZO_LORA_GATE | ZO_LORA_UP);
    assert_string_equal(m[3].peft, "down_proj");
    assert_int_equal(zo_lora_targets_effective(&p, ZO_LORA_V | ZO_LORA_GATE),
                     ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V | ZO_LORA_GATE | ZO_LORA_UP);
    /* DeepSeek-V2's latent attention: each projection says which it is (the
     * runtime's stages and memplan's decoding key on it); q_proj, o_proj and
     * the MLP's are none. V2 (q_lora_rank 1536): q_a q_b kv_a kv_b o, then
     * the routed and shared experts' gate up down; V2-Lite: q_proj in q_a's
     * and q_b's place */
    static const struct {
        const char *peft;
        zo_lora_latent latent;
        int64_t in, out;
    } v2[] = {{"q_a_proj", ZO_LORA_LATENT_Q_A, 5120, 1536},
              {"q_b_proj", ZO_LORA_LATENT_Q_B, 1536, 128 * 192},
              {"kv_a_proj_with_mqa", ZO_LORA_LATENT_KV_A, 5120, 512 + 64},
              {"kv_b_proj", ZO_LORA_LATENT_KV_B, 512, 128 * (128 + 128)},
              {"o_proj", ZO_LORA_LATENT_NONE, 128 * 128, 5120}};
    zo_model_config d = load("deepseek-v2");
    assert_int_equal(zo_lora_layer_modules(&d, ZO_LORA_ALL_LINEAR, m), 11);
    for (int i = 0; i < 5; i++) {
        assert_string_equal(m[i].peft, v2[i].peft);
        assert_int_equal(m[i].latent, v2[i].latent);
        assert_int_equal(m[i].in, v2[i].in);
        assert_int_equal(m[i].out, v2[i].out);
    }
    for (int i = 5; i < 11; i++) assert_int_equal(m[i].latent, ZO_LORA_LATENT_NONE);
    zo_model_config lite = load("deepseek-v2-lite");
    assert_int_equal(zo_lora_layer_modules(&lite, ZO_LORA_Q | ZO_LORA_K, m), 3);
    assert_string_equal(m[0].peft, "q_proj");
    assert_int_equal(m[0].latent, ZO_LORA_LATENT_NONE);
    assert_int_equal(m[1].latent, ZO_LORA_LATENT_KV_A);
    assert_int_equal(m[2].latent, ZO_LORA_LATENT_KV_B);
}

static void test_parse_and_check(void **state)
{
    (void)state;
    unsigned t;
    char buf[64];
    assert_int_equal(zo_lora_targets_parse("q,v", &t), ZO_OK);
    assert_int_equal(t, ZO_LORA_Q | ZO_LORA_V);
    assert_string_equal(zo_lora_targets_str(t, buf, sizeof buf), "q,v");
    assert_int_equal(zo_lora_targets_parse("w1,w3,w2", &t), ZO_OK); /* Mixtral's experts, PEFT's names */
    assert_int_equal(t, ZO_LORA_GATE | ZO_LORA_UP | ZO_LORA_DOWN);
    assert_int_equal(zo_lora_targets_parse("all-linear", &t), ZO_OK);
    assert_string_equal(zo_lora_targets_str(t, buf, sizeof buf), "all-linear");
    assert_int_equal(zo_lora_targets_parse("o,gate,down", &t), ZO_OK);
    assert_string_equal(zo_lora_targets_str(t, buf, sizeof buf), "o,gate,down");
    zo_clear_error();
    assert_int_equal(zo_lora_targets_parse("q,lm_head", &t), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "\"lm_head\""));
    assert_int_equal(zo_lora_targets_parse("", &t), ZO_ERR_INVALID);
    assert_int_equal(zo_lora_targets_parse("q,,v", &t), ZO_ERR_INVALID);

    zo_model_config g = load("gpt2");
    zo_lora_config lc = {.r = 8, .alpha = 16, .targets = ZO_LORA_GATE | ZO_LORA_UP};
    assert_int_equal(zo_lora_check(&g, &lc), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "gate"));
    lc.targets = ZO_LORA_ALL_LINEAR; /* all-linear takes what GPT-2 has */
    assert_int_equal(zo_lora_check(&g, &lc), ZO_OK);
    lc.r = 0;
    assert_int_equal(zo_lora_check(&g, &lc), ZO_ERR_INVALID);
    lc.r = 8;
    lc.alpha = 0;
    assert_int_equal(zo_lora_check(&g, &lc), ZO_ERR_INVALID);
    lc.alpha = 16;
    lc.targets = 0;
    assert_int_equal(zo_lora_check(&g, &lc), ZO_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peft_counts),
        cmocka_unit_test(test_modules),
        cmocka_unit_test(test_parse_and_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
