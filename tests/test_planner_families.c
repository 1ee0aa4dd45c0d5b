/* Tests for the model families: exact parameter counts of published
 * config.json files (tests/fixtures/hf-configs, copied from the models'
 * Hugging Face repositories), families and keys refused by name, and the
 * memory and time of a mixture of experts with expert parallelism. */
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

#include "common/model_config.h"
#include "planner/cost.h"
#include "planner/hardware.h"
#include "planner/memory.h"
#include "planner/planfile.h"
#include "tests/support/run.h" /* defines: run_memplan, run_memplan_json, run_json_num */

/* A small shape for the parser's defaults and refusals */
#include "tests/support/scratch.h" /* defines: scratch_path */
#define SHAPE_ONLY "\"num_hidden_layers\": 2, \"hidden_size\": 128, \"num_attention_heads\": 8, " \
                   "\"intermediate_size\": 128, \"vocab_size\": 100"

static void load(const char *name, zo_model_config *c)
{
    char path[512];
    snprintf(path, sizeof path, "%s/hf-configs/%s", ZO_FIXTURES_DIR, name);
    if (zo_model_config_load(path, c)) fail_msg("%s", zo_last_error());
}

/* ---- exact counts ------------------------------------------------------------------ */

/* `total` is the published count, from the source named beside it; `active`
 * (MoE) is the total less the routed experts a token skips, derived by hand:
 * (experts - top_k) x (3 x hidden x expert_ffn) x MoE layers, with the
 * model's own rounded figure for comparison. "keras-hub" is the preset table
 * of keras-team/keras-hub (params of its own implementation of the model);
 * "HF" is the model's Hugging Face safetensors total. */
static const struct {
    const char *config;
    uint64_t total, active;
} counts[] = {
    /* keras-hub gpt2_base_en / gpt2_extra_large_en */
    {"gpt2.json", 124439808ull, 0},
    {"gpt2-xl.json", 1557611200ull, 0},
    /* LLaMA 1 has LLaMA-2-7B's shape: keras-hub llama2_7b_en */
    {"llama-7b.json", 6738415616ull, 0},
    {"llama-2-7b.json", 6738415616ull, 0},
    {"llama-2-13b.json", 13015864320ull, 0},
    {"llama-2-70b.json", 68976648192ull, 0},
    /* keras-hub llama3_8b_en and llama3.1 presets */
    {"llama-3-8b.json", 8030261248ull, 0},
    {"llama-3.1-8b.json", 8030261248ull, 0},
    /* tied, head_dim 64: GPTQModel's test LLAMA_3_2_1B_PARAMETER_COUNT (HF
     * 1.24B; keras-hub's 1,498,482,688 adds an untied 128256 x 2048 head) */
    {"llama-3.2-1b.json", 1235814400ull, 0},
    /* keras-hub mistral_7b_en */
    {"mistral-7b.json", 7241732096ull, 0},
    /* q/k/v biases: keras-hub qwen2.5 presets (0.5B tied, math 7B) */
    {"qwen2.5-0.5b.json", 494032768ull, 0},
    {"qwen2.5-7b.json", 7615616512ull, 0},
    /* q/k norms of head_dim: keras-hub qwen3_0.6b_en, qwen3_8b_en */
    {"qwen3-0.6b.json", 596049920ull, 0},
    {"qwen3-8b.json", 8190735360ull, 0},
    /* GeGLU, head_dim 256, tied: keras-hub gemma_2b_en, gemma_7b_en */
    {"gemma-2b.json", 2506172416ull, 0},
    {"gemma-7b.json", 8537680896ull, 0},
    /* four norms per layer: keras-hub gemma2_2b_en, gemma2_9b_en */
    {"gemma-2-2b.json", 2614341888ull, 0},
    {"gemma-2-9b.json", 9241705984ull, 0},
    /* keras-hub phi3_mini_4k_instruct_en */
    {"phi-3-mini-4k-instruct.json", 3821079552ull, 0},
    /* Phi-3.5-mini: Phi-3-mini's shape (longrope changes no size) */
    {"phi-3.5-mini-instruct.json", 3821079552ull, 0},
    /* Phi-4 (HF 14.7B), by hand: 40 layers x (norms 2 x 5120 + qkv_proj
     * 5120 x (5120 + 2 x 10 x 128) + o_proj 5120^2 + gate_up_proj 5120 x 2 x
     * 17920 + down_proj 17920 x 5120 = 340,797,440) + embedding and head
     * 2 x 100352 x 5120 + norm 5120 */
    {"phi-4.json", 14659507200ull, 0},
    /* microsoft/phi-2's 2.78B, from the shapes: 32 layers x (input_layernorm 2 x
     * 2560 + q, k, v, dense 4 x (2560^2 + 2560) + fc1 2560 x 10240 + 10240 +
     * fc2 10240 x 2560 + 2560 = 78,671,360) + embed_tokens 51200 x 2560 +
     * final_layernorm 2 x 2560 + lm_head 51200 x 2560 + its bias 51200 */
    {"phi-2.json", 2779683840ull, 0},
    /* EleutherAI/gpt-j-6b's 6.05B, from the shapes: 28 layers x (ln_1 2 x 4096 +
     * q, k, v, out_proj 4 x 4096^2 (no biases) + fc_in 4096 x 16384 + 16384 +
     * fc_out 16384 x 4096 + 4096 = 201,355,264) + wte 50400 x 4096 + ln_f
     * 2 x 4096 + lm_head 50400 x 4096 + its bias 50400 */
    {"gpt-j-6b.json", 6050882784ull, 0},
    /* GPTNeoXForCausalLM counts in the Pythia suite's tables */
    {"pythia-160m.json", 162322944ull, 0},
    {"pythia-6.9b.json", 6857302016ull, 0},
    /* the GPT-NeoX-20B model card: n_parameters 20554567680 */
    {"gpt-neox-20b.json", 20554567680ull, 0},
    /* Falcon-7B (HF 6.92B), by hand: 32 layers x (ln 2x4544 + qkv 4544 x
     * (4544 + 2 x 64) + dense 4544^2 + mlp 2 x 4544 x 18176 = 207,070,080)
     * + embedding 65024 x 4544 + ln_f 2 x 4544, tied */
    {"falcon-7b.json", 6921720704ull, 0},
    /* Falcon-40B (HF 41.3B), by hand: 60 layers x (ln_attn + ln_mlp 4 x 8192
     * + qkv 8192 x (8192 + 2 x 8 x 64) + dense 8192^2 + mlp 2 x 8192 x 32768
     * = 679,510,016) + 65024 x 8192 + 2 x 8192, tied */
    {"falcon-40b.json", 41303293952ull, 0},
    /* ALiBi, biases, sequential: keras-hub falcon_refinedweb_1b_en */
    {"falcon-rw-1b.json", 1311625216ull, 0},
    /* OPT-1.3b: HF OPTForCausalLM parameters() as printed in a public script;
     * OPT-125m by hand: 12 x 7,087,872 + 50272 x 768 + (2048 + 2) x 768 +
     * 2 x 768 (keras-hub's 125,237,760 keeps 2048 position rows, not 2050) */
    {"opt-1.3b.json", 1315758080ull, 0},
    {"opt-125m.json", 125239296ull, 0},
    /* embedding LayerNorm, ALiBi: keras-hub bloom_560m_multi; BLOOM-7b1 from
     * the BLOOM evaluation tables (7,069,016,064) */
    {"bloom-560m.json", 559214592ull, 0},
    {"bloom-7b1.json", 7069016064ull, 0},
    /* keras-hub mixtral_8_7b_en; active 46,702,792,704 - 6 x 3 x 4096 x 14336
     * x 32 (Mistral: 12.9B active) */
    {"mixtral-8x7b.json", 46702792704ull, 12879925248ull},
    /* Phi-3.5-MoE (41.9B, 6.6B active), by hand: 32 layers x (two LayerNorms 2
     * x 2 x 4096 + q and o 2 x 4096^2 + k and v 2 x 4096 x 1024 + their biases
     * 2 x 4096 + 2 x 1024 + router 16 x 4096 + 16 experts x 3 x 4096 x 6400
     * = 1,300,326,400) + embedding and lm_head 2 x 32064 x 4096 + lm_head's
     * bias 32064 + the final norm 2 x 4096; active less 14 x 3 x 4096 x 6400
     * x 32 */
    {"phi-3.5-moe-instruct.json", 41873153344ull, 6640999744ull},
    /* keras-hub qwen1.5_moe_2.7b_en; active - 56 x 3 x 2048 x 1408 x 24 (A2.7B) */
    {"qwen1.5-moe-a2.7b.json", 14315784192ull, 2689173504ull},
    /* keras-hub qwen3_moe_30b_a3b_en; active - 120 x 3 x 2048 x 768 x 48 (A3B, 3.3B) */
    {"qwen3-30b-a3b.json", 30532122624ull, 3353032704ull},
    /* HF totals. Active: DeepSeekMoE-16B - 58 x 3 x 2048 x 1408 x 27 (2.8B);
     * V2-Lite - 58 x 3 x 2048 x 1408 x 26 (2.4B without the 0.21B input
     * embedding); V2 - 154 x 3 x 5120 x 1536 x 59 (21B); V3 main model (the
     * bf16 count of MAI-DS-R1, V3's shape; V3's README: 671B, and 36.6B
     * active without the 0.93B input embedding) - 248 x 3 x 7168 x 2048 x 58 */
    {"deepseek-moe-16b.json", 16375728128ull, 2828650496ull},
    {"deepseek-v2-lite.json", 15706484224ull, 2661150208ull},
    {"deepseek-v2.json", 235741434880ull, 21375800320ull},
    {"deepseek-v3.json", 671026419200ull, 37552297472ull},
    /* SmolLM3-3B (3.08B), by hand: 36 layers x (q and o 2 x 2048^2 + k and v
     * 2 x 2048 x 4 x 128 + two norms 2 x 2048 + mlp 3 x 2048 x 11008 =
     * 78,123,008) + 128256 x 2048 + the final norm 2048, tied */
    {"smollm3-3b.json", 3075098624ull, 0},
    /* EXAONE-4.0-32B (32.00B; 30.95B without the embeddings), by hand: 64
     * layers x (q and o 2 x 5120 x 40 x 128 + k and v 2 x 5120 x 8 x 128 +
     * mlp 3 x 5120 x 27392 + the two output norms 2 x 5120 + q/k norms 2 x
     * 128 = 483,666,176) + embed and lm_head 2 x 102400 x 5120 + the final
     * norm 5120, untied; the window and NoPE change no size */
    {"exaone-4.0-32b.json", 32003216384ull, 0},
    /* EXAONE-4.0-1.2B (1.28B; 1.07B without the embeddings), by hand: 30
     * layers x (q and o 2 x 2048 x 32 x 64 + k and v 2 x 2048 x 8 x 64 + mlp
     * 3 x 2048 x 4096 + 2 x 2048 + 2 x 64 = 35,655,808) + 102400 x 2048 +
     * 2048, tied */
    {"exaone-4.0-1.2b.json", 1279391488ull, 0},
    /* StarCoder2-3B (3.03B), by hand: 30 layers x (q and o 2 x (3072^2 +
     * 3072) + k and v 2 x (256 x 3072 + 256) + two LayerNorms 4 x 3072 +
     * c_fc 3072 x 12288 + 12288 + c_proj 12288 x 3072 + 3072 = 95,979,008) +
     * 49152 x 3072 + the final LayerNorm 2 x 3072, tied */
    {"starcoder2-3b.json", 3030371328ull, 0},
    /* gpt-oss-20b and -120b (the model card's 20.9B and 116.8B; 3.61B and
     * 5.13B active without the input embedding), by hand in test_gpt_oss_config */
    {"gpt-oss-20b.json", 20914757184ull, 4187440704ull},
    {"gpt-oss-120b.json", 116829156672ull, 5711982912ull},
};

static void test_family_counts(void **state)
{
    (void)state;
    int bad = 0;
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        zo_model_config c;
        load(counts[i].config, &c);
        zo_param_counts pc;
        zo_model_param_counts(&c, &pc);
        uint64_t active = counts[i].active ? counts[i].active : counts[i].total;
        if (pc.total != counts[i].total || pc.active != active) {
            print_error("%s: total %llu (want %llu), active %llu (want %llu)\n", counts[i].config,
                        (unsigned long long)pc.total, (unsigned long long)counts[i].total,
                        (unsigned long long)pc.active, (unsigned long long)active);
            bad++;
        }
        /* experts are all MoE parameters a token can skip */
        assert_int_equal(pc.experts > 0, counts[i].active > 0);
    }
    assert_int_equal(bad, 0);
    assert_true(sizeof counts / sizeof counts[0] >= 15);
}

/* Whether a preset and a config.json differ in a field every family's
 * layers read: the shape, the norms' and biases' kinds, eps, rope_theta,
 * the activation. */
static int shape_differs(const zo_model_config *p, const zo_model_config *c)
{
    return strcmp(p->family, c->family) || p->arch != c->arch || p->n_layers != c->n_layers ||
           p->hidden != c->hidden || p->n_heads != c->n_heads || p->n_kv_heads != c->n_kv_heads ||
           p->head_dim != c->head_dim || p->ffn != c->ffn || p->vocab != c->vocab || p->max_seq != c->max_seq ||
           p->tied_embeddings != c->tied_embeddings || p->norm_eps != c->norm_eps ||
           p->rope_theta != c->rope_theta || p->attn_bias != c->attn_bias || p->out_bias != c->out_bias ||
           p->norm_bias != c->norm_bias || p->layer_norm != c->layer_norm || p->head_bias != c->head_bias ||
           strcmp(p->act, c->act);
}

/* The Qwen3 presets are their config.json files (tests/fixtures/hf-configs,
 * whose totals test_family_counts checks against keras-hub's): every field
 * that sizes or computes the model. */
static void test_qwen3_presets(void **state)
{
    (void)state;
    static const char *const pairs[][2] = {
        {"qwen3-0.6b", "qwen3-0.6b.json"}, {"qwen3-8b", "qwen3-8b.json"}, {"qwen3-30b-a3b", "qwen3-30b-a3b.json"}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        zo_model_config p, c;
        assert_int_equal(zo_model_preset_find(pairs[i][0], &p), ZO_OK);
        load(pairs[i][1], &c);
        if (shape_differs(&p, &c) || p.qk_norm != c.qk_norm || p.sliding_window != c.sliding_window ||
            p.moe.experts != c.moe.experts || p.moe.top_k != c.moe.top_k || p.moe.expert_ffn != c.moe.expert_ffn ||
            p.moe.shared_ffn != c.moe.shared_ffn || p.moe.norm_topk != c.moe.norm_topk ||
            p.moe.aux_loss != c.moe.aux_loss || p.moe.aux_coef != c.moe.aux_coef)
            fail_msg("preset %s differs from %s", pairs[i][0], pairs[i][1]);
        assert_int_equal(zo_model_params(&p), zo_model_params(&c));
        /* and the runtime builds it */
        assert_int_equal(zo_model_config_runtime_check(&p), ZO_OK);
    }
}

/* json fails to parse, its message naming "key" */
static void expect_named(const char *json, const char *key)
{
    zo_model_config d;
    char want[64];
    snprintf(want, sizeof want, "\"%s\"", key);
    zo_status st = zo_model_config_parse(json, "r.json", &d);
    if (st == ZO_OK || !strstr(zo_last_error(), want))
        fail_msg("%s: status %d, \"%s\" (want %s named)", json, st, st ? zo_last_error() : "", want);
}

/* OLMo-2: a config with OLMo-2-7B's published shape (allenai/OLMo-2-1124-7B's
 * config.json: hidden 4096, 32 layers, 32 heads and kv heads, intermediate
 * 11008, vocab 100352, eps 1e-6, rope_theta 500000, untied), its count
 * against one written here from the tensors Olmo2ForCausalLM holds; the
 * layer's activations against a sum written here from what the runtime
 * keeps; Olmo2Config's defaults; its refusals by name. */
static void test_olmo2_config(void **state)
{
    (void)state;
    zo_model_config c;
    assert_int_equal(zo_model_config_parse(
                         "{\"architectures\": [\"Olmo2ForCausalLM\"], \"model_type\": \"olmo2\", "
                         "\"hidden_size\": 4096, \"num_hidden_layers\": 32, \"num_attention_heads\": 32, "
                         "\"num_key_value_heads\": 32, \"intermediate_size\": 11008, \"vocab_size\": 100352, "
                         "\"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6, \"rope_theta\": 500000, "
                         "\"rope_scaling\": null, \"attention_bias\": false, \"attention_dropout\": 0.0, "
                         "\"hidden_act\": \"silu\", \"tie_word_embeddings\": false, \"pad_token_id\": 100277, "
                         "\"eos_token_id\": 100257, \"torch_dtype\": \"float32\"}",
                         "olmo2-7b.json", &c),
                     ZO_OK);
    const uint64_t h = 4096, L = 32, f = 11008, V = 100352;
    /* a layer: q, k, v, o_proj (h x h each: 32 kv heads of 128), q_norm and
     * k_norm (h each: the whole projections), post_attention_layernorm and
     * post_feedforward_layernorm (h each), gate, up, down (h x f each); no
     * input_layernorm */
    uint64_t layer = 4 * h * h + 2 * h + 2 * h + 3 * h * f;
    uint64_t want = L * layer + V * h /* embed_tokens */ + h /* norm */ + V * h /* lm_head */;
    assert_int_equal(zo_model_params(&c), want);
    assert_int_equal(want, 7298617344ull); /* (OLMo-2-7B: 7.30B) */
    assert_true(c.qk_norm && c.qk_norm_full && c.post_norms_only && c.layer_norms == 2 && !c.tied_embeddings);
    assert_true(c.norm_eps == 1e-6f && c.rope_theta == 500000.0f && zo_model_post_norms(&c) && !zo_model_pre_norms(&c));
    assert_int_equal(zo_model_config_runtime_check(&c), ZO_OK);

    /* the layer's activations at 4096 tokens, bf16, flash attention: the
     * layer's input (the attention's own: no norm before it), the q/k
     * norms' inputs (q and k wide) and their 1/rms (two fp32 a token), q, k,
     * v, the log-sum-exp (fp32 a head), o_proj's input, the two output
     * norms' inputs, the residual between (the MLP's input), gate, up and
     * the activation */
    plan_train t;
    plan_train_defaults(&t, &c);
    t.seq = 4096;
    t.micro_batch = 1;
    t.dtype = ZO_DTYPE_BF16;
    t.flash_attn = 1;
    t.dropout = 0;
    const uint64_t n = 4096, q = h, k = h;
    uint64_t acts = 2 * (n * h + n * (q + k) + n * (q + 2 * k) + n * q + 2 * n * h + n * h + 3 * n * f) +
                    4 * 2 * n + 4 * 32 * n;
    assert_int_equal(plan_layer_act_bytes(&c, &t, 0), acts);

    /* Olmo2Config's defaults: eps 1e-5, rope_theta 10000, the heads as kv heads, untied */
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"olmo2\", " SHAPE_ONLY "}", "d.json", &c), ZO_OK);
    assert_true(c.norm_eps == 1e-5f && c.rope_theta == 10000.0f && c.n_kv_heads == 8 && !c.tied_embeddings);
    /* refused by name */
    expect_named("{\"model_type\": \"olmo2\", \"use_sinks\": true, " SHAPE_ONLY "}", "use_sinks");
    expect_named("{\"model_type\": \"olmo2\", \"attention_bias\": true, " SHAPE_ONLY "}", "attention_bias");
}

/* OLMo-3: OLMo-3-7B's published shape (OLMo-2-7B's but vocab 100278,
 * 65536 positions, yarn over 8192, a window of 4096 on three layers of
 * four): OLMo-2's count at its vocabulary, written here; the windowed
 * layers and their unscaled rotary (rope_local_theta: rope_theta's, no
 * rope_scaling); Olmo3Config's default pattern without layer_types; a
 * layer_types off every p-th full layer refused by name. */
static void test_olmo3_config(void **state)
{
    (void)state;
    zo_model_config c;
    assert_int_equal(zo_model_config_parse(
                         "{\"architectures\": [\"Olmo3ForCausalLM\"], \"model_type\": \"olmo3\", "
                         "\"hidden_size\": 4096, \"num_hidden_layers\": 8, \"num_attention_heads\": 32, "
                         "\"num_key_value_heads\": 32, \"intermediate_size\": 11008, \"vocab_size\": 100278, "
                         "\"max_position_embeddings\": 65536, \"rms_norm_eps\": 1e-6, \"rope_theta\": 500000, "
                         "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 8.0, "
                         "\"original_max_position_embeddings\": 8192, \"attention_factor\": 1.2079441541679836, "
                         "\"beta_fast\": 32, \"beta_slow\": 1}, \"sliding_window\": 4096, "
                         "\"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", "
                         "\"full_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\", "
                         "\"full_attention\"], \"tie_word_embeddings\": false}",
                         "olmo3-7b.json", &c),
                     ZO_OK);
    const uint64_t h = 4096, f = 11008, V = 100278;
    uint64_t layer = 4 * h * h + 2 * h + 2 * h + 3 * h * f; /* (as OLMo-2's, above) */
    assert_int_equal(zo_model_params(&c), 8 * layer + 2 * V * h + h);
    assert_true(c.qk_norm_full && c.post_norms_only && c.sliding_window == 4096 && c.window_period == 4);
    for (int l = 0; l < 8; l++) {
        assert_int_equal(zo_model_layer_sliding(&c, l), (l + 1) % 4 != 0);
        assert_int_equal(zo_model_layer_window(&c, l), (l + 1) % 4 ? 4096 : 0);
    }
    assert_true(c.rope_local_theta == c.rope_theta && !strcmp(c.rope_scaling, "yarn") && c.rope_factor == 8.0f);
    assert_int_equal(zo_model_config_runtime_check(&c), ZO_OK);
    /* Olmo3Config's defaults: a window of 4096 on all but every fourth layer */
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"olmo3\", " SHAPE_ONLY "}", "d.json", &c), ZO_OK);
    assert_true(c.sliding_window == 4096 && c.window_period == 4 && c.norm_eps == 1e-5f);
    expect_named("{\"model_type\": \"olmo3\", \"layer_types\": [\"full_attention\", \"sliding_attention\"], "
                 SHAPE_ONLY "}",
                 "layer_types");
}

/* OLMoE: OLMoE-1B-7B's published config.json (allenai/OLMoE-1B-7B-0924:
 * hidden 2048, 16 layers, 16 heads and kv heads, 64 experts of
 * intermediate_size 1024, 8 a token, vocab 50304, untied), its counts
 * against ones written here from the tensors OlmoeForCausalLM holds (6.9B,
 * 1.3B active as published); OlmoeConfig's defaults; refusals by name. */
/* gpt-oss (its published configs; GptOssConfig's defaults): every count
 * term by term, the features the runtime reads, the refusals by name. */
static void test_gpt_oss_config(void **state)
{
    (void)state;
    zo_model_config c;
    const uint64_t h = 2880, hd = 64, a = 64, kv = 8, fe = 2880, k = 4, V = 201088;
    for (int big = 0; big <= 1; big++) {
        load(big ? "gpt-oss-120b.json" : "gpt-oss-20b.json", &c);
        const uint64_t L = big ? 36 : 24, E = big ? 128 : 32;
        /* a layer: q and o (a hd x h each) with their biases (a hd and h), k
         * and v (kv hd x h each) with theirs, the sinks (a), two RMSNorms (h
         * each), the router (E x h) and its bias (E), E experts of
         * gate_up_proj (h x 2 fe) and its bias (2 fe) and down_proj (fe x h)
         * and its bias (h) */
        const uint64_t expert = h * 2 * fe + 2 * fe + fe * h + h;
        const uint64_t layer = 2 * a * hd * h + a * hd + h + 2 * (kv * hd * h + kv * hd) + a + 2 * h + E * h + E +
                               E * expert;
        const uint64_t want = L * layer + V * h /* embed_tokens */ + h /* norm */ + V * h /* lm_head */;
        zo_param_counts pc;
        zo_model_param_counts(&c, &pc);
        assert_int_equal(pc.total, want);
        assert_int_equal(pc.active, want - L * (E - k) * expert);
        assert_int_equal(pc.experts, L * E * expert);
        /* the model card's active counts leave out the input embedding */
        assert_int_equal((pc.active - V * h + 5000000) / 10000000, big ? 513 : 361);
        assert_true(c.attn_sinks && c.attn_bias && c.out_bias && !c.tied_embeddings && c.head_dim == 64 &&
                    c.n_kv_heads == 8 && c.norm_eps == 1e-5f && c.rope_theta == 150000.0f);
        assert_true(c.sliding_window == 128 && c.window_period == 2 && zo_model_layer_window(&c, 0) &&
                    !zo_model_layer_window(&c, 1));
        assert_true(!strcmp(c.rope_scaling, "yarn") && c.rope_factor == 32.0f && c.rope_original_max == 4096 &&
                    !c.rope_truncate && c.rope_beta_fast == 32.0 && c.rope_beta_slow == 1.0);
        assert_true(c.moe.experts == (int)E && c.moe.top_k == 4 && c.moe.expert_ffn == 2880 && c.moe.norm_topk &&
                    c.moe.expert_bias && c.moe.router_logit_bias && !c.moe.router_bias && c.moe.glu_limit == 7.0f &&
                    c.moe.glu_alpha == 1.702f && !c.moe.aux_loss && c.moe.aux_coef == 0.9f && !c.moe.shared_ffn);
        assert_true(!strcmp(c.quant_method, "mxfp4"));
        /* the runtime computes it (tf_init refuses by name what it does not run: test_moe_capacity) */
        if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());
    }
    /* GptOssConfig's defaults: 128 experts, 4 a token, every second layer
     * windowed (128), yarn as the published configs give it, limit 7 */
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"gpt_oss\", " SHAPE_ONLY "}", "d.json", &c), ZO_OK);
    assert_true(c.moe.experts == 128 && c.moe.top_k == 4 && c.moe.expert_ffn == 128 && c.n_kv_heads == 8 &&
                c.head_dim == 64 && c.max_seq == 131072 && c.sliding_window == 128 && c.window_period == 2 &&
                c.moe.glu_limit == 7.0f && c.attn_bias && c.attn_sinks);
    assert_true(!strcmp(c.rope_scaling, "yarn") && c.rope_factor == 32.0f && c.rope_original_max == 4096 &&
                !c.rope_truncate && fabsf(c.rope_attention_factor - (float)(0.1 * log(32.0) + 1)) < 1e-6f);
    /* no window (null); no biases; a limit; the balance loss */
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"gpt_oss\", \"sliding_window\": null, "
                                           "\"attention_bias\": false, \"swiglu_limit\": 5.5, "
                                           "\"output_router_logits\": true, " SHAPE_ONLY "}",
                                           "d.json", &c),
                     ZO_OK);
    assert_true(!c.sliding_window && !c.attn_bias && !c.out_bias && c.moe.glu_limit == 5.5f && c.moe.aux_loss);
    /* refused by name */
    expect_named("{\"model_type\": \"gpt_oss\", \"swiglu_limit\": 0, " SHAPE_ONLY "}", "swiglu_limit");
    expect_named("{\"model_type\": \"gpt_oss\", \"router_jitter_noise\": 0.1, " SHAPE_ONLY "}",
                 "router_jitter_noise");
    expect_named("{\"model_type\": \"gpt_oss\", \"layer_types\": [\"full_attention\", \"sliding_attention\"], "
                 SHAPE_ONLY "}", "layer_types");
    expect_named("{\"model_type\": \"gpt_oss\", \"n_shared_experts\": 1, " SHAPE_ONLY "}", "n_shared_experts");
}

static void test_olmoe_config(void **state)
{
    (void)state;
    zo_model_config c;
    assert_int_equal(zo_model_config_parse(
                         "{\"architectures\": [\"OlmoeForCausalLM\"], \"model_type\": \"olmoe\", "
                         "\"hidden_size\": 2048, \"intermediate_size\": 1024, \"num_hidden_layers\": 16, "
                         "\"num_attention_heads\": 16, \"num_key_value_heads\": 16, \"num_experts\": 64, "
                         "\"num_experts_per_tok\": 8, \"vocab_size\": 50304, \"max_position_embeddings\": 4096, "
                         "\"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"rope_scaling\": null, "
                         "\"attention_bias\": false, \"clip_qkv\": null, \"hidden_act\": \"silu\", "
                         "\"norm_topk_prob\": false, \"output_router_logits\": false, "
                         "\"router_aux_loss_coef\": 0.01, \"tie_word_embeddings\": false, \"pad_token_id\": 1, "
                         "\"eos_token_id\": 50279, \"torch_dtype\": \"bfloat16\"}",
                         "olmoe-1b-7b.json", &c),
                     ZO_OK);
    const uint64_t h = 4096 / 2, L = 16, fe = 1024, E = 64, k = 8, V = 50304;
    /* a layer: q, k, v, o_proj (h x h each), q_norm and k_norm (h each: the
     * whole projections), input_layernorm and post_attention_layernorm (h
     * each), the router (E x h), E experts' gate, up and down (h x fe each) */
    uint64_t layer = 4 * h * h + 2 * h + 2 * h + E * h + E * 3 * h * fe;
    uint64_t want = L * layer + V * h /* embed_tokens */ + h /* norm */ + V * h /* lm_head */;
    zo_param_counts pc;
    zo_model_param_counts(&c, &pc);
    assert_int_equal(pc.total, want);
    assert_int_equal(want, 6919161856ull); /* (6.9B) */
    assert_int_equal(pc.active, want - L * (E - k) * 3 * h * fe);
    assert_int_equal(pc.active, 1282017280ull); /* (1.3B active) */
    assert_true(c.qk_norm && c.qk_norm_full && !c.post_norms_only && zo_model_pre_norms(&c) && !c.tied_embeddings);
    assert_true(c.moe.experts == 64 && c.moe.top_k == 8 && c.moe.expert_ffn == 1024 && !c.moe.norm_topk &&
                !c.moe.shared_ffn && !c.moe.aux_loss && c.moe.aux_coef == 0.01f);
    assert_int_equal(zo_model_config_runtime_check(&c), ZO_OK);

    /* OlmoeConfig's defaults: 64 experts, 8 a token, not renormalized, eps
     * 1e-5, the balance loss's coefficient 0.01 */
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"olmoe\", " SHAPE_ONLY "}", "d.json", &c), ZO_OK);
    assert_true(c.moe.experts == 64 && c.moe.top_k == 8 && c.moe.expert_ffn == 128 && !c.moe.norm_topk &&
                c.norm_eps == 1e-5f && c.moe.aux_coef == 0.01f && c.n_kv_heads == 8 && !c.tied_embeddings);
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"olmoe\", \"norm_topk_prob\": true, "
                                           "\"output_router_logits\": true, " SHAPE_ONLY "}",
                                           "d.json", &c),
                     ZO_OK);
    assert_true(c.moe.norm_topk && c.moe.aux_loss);
    /* refused by name */
    expect_named("{\"model_type\": \"olmoe\", \"clip_qkv\": 8.0, " SHAPE_ONLY "}", "clip_qkv");
    expect_named("{\"model_type\": \"olmoe\", \"attention_bias\": true, " SHAPE_ONLY "}", "attention_bias");
    expect_named("{\"model_type\": \"olmoe\", \"n_shared_experts\": 1, " SHAPE_ONLY "}", "n_shared_experts");
}

/* Seed-OSS: Seed-OSS-36B's published shape (hidden 5120, 64 layers, 80
 * heads of 128 over 8 kv heads, intermediate 27648, vocab 155136, untied,
 * q/k/v biased), its count against one written here from the tensors
 * SeedOssForCausalLM holds; SeedOssConfig's defaults; refusals by name. */
static void test_seed_oss_config(void **state)
{
    (void)state;
    zo_model_config c;
    assert_int_equal(zo_model_config_parse(
                         "{\"architectures\": [\"SeedOssForCausalLM\"], \"model_type\": \"seed_oss\", "
                         "\"hidden_size\": 5120, \"intermediate_size\": 27648, \"num_hidden_layers\": 64, "
                         "\"num_attention_heads\": 80, \"num_key_value_heads\": 8, \"head_dim\": 128, "
                         "\"vocab_size\": 155136, \"max_position_embeddings\": 524288, \"rms_norm_eps\": 1e-06, "
                         "\"rope_theta\": 10000000.0, \"attention_bias\": true, \"attention_out_bias\": false, "
                         "\"mlp_bias\": false, \"attention_dropout\": 0.1, \"residual_dropout\": 0.1, "
                         "\"hidden_act\": \"silu\", \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\"}",
                         "seed-oss-36b.json", &c),
                     ZO_OK);
    const uint64_t h = 5120, L = 64, q = 80 * 128, kv = 8 * 128, f = 27648, V = 155136;
    /* a layer: q_proj (h x q and its bias), k_proj and v_proj (h x kv and
     * theirs), o_proj (q x h, no bias), gate, up, down (h x f each), two
     * RMSNorms (h each) */
    uint64_t layer = h * q + q + 2 * (h * kv + kv) + q * h + 3 * h * f + 2 * h;
    uint64_t want = L * layer + V * h /* embed_tokens */ + h /* norm */ + V * h /* lm_head */;
    assert_int_equal(zo_model_params(&c), want);
    assert_int_equal(want, 36151104512ull); /* (36.2B) */
    assert_true(c.attn_bias && !c.out_bias && c.head_dim == 128 && c.n_kv_heads == 8 && !c.tied_embeddings);
    assert_true(c.rope_theta == 1e7f && c.norm_eps == 1e-6f);
    assert_int_equal(zo_model_config_runtime_check(&c), ZO_OK);
    /* SeedOssConfig's defaults: q/k/v biased, head_dim 128, 8 kv heads, untied */
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"seed_oss\", " SHAPE_ONLY "}", "d.json", &c), ZO_OK);
    assert_true(c.attn_bias && c.head_dim == 128 && c.n_kv_heads == 8 && !c.tied_embeddings);
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"seed_oss\", \"attention_bias\": false, " SHAPE_ONLY "}",
                                           "d.json", &c),
                     ZO_OK);
    assert_false(c.attn_bias);
    expect_named("{\"model_type\": \"seed_oss\", \"attention_out_bias\": true, " SHAPE_ONLY "}", "attention_out_bias");
    expect_named("{\"model_type\": \"seed_oss\", \"mlp_bias\": true, " SHAPE_ONLY "}", "mlp_bias");
}

/* ERNIE 4.5 (dense): ERNIE-4.5-0.3B's published shape (hidden 1024, 18
 * layers, 16 heads of 128 over 2 kv heads, intermediate 3072, vocab 103424,
 * tied, no biases), its count against one written here (0.36B); with
 * use_bias every linear layer's bias counted; Ernie4_5Config's defaults. */
static void test_ernie4_5_config(void **state)
{
    (void)state;
    zo_model_config c;
    static const char json[] =
        "{\"architectures\": [\"Ernie4_5ForCausalLM\"], \"model_type\": \"ernie4_5\", \"hidden_size\": 1024, "
        "\"intermediate_size\": 3072, \"num_hidden_layers\": 18, \"num_attention_heads\": 16, "
        "\"num_key_value_heads\": 2, \"head_dim\": 128, \"vocab_size\": 103424, \"max_position_embeddings\": 131072, "
        "\"rms_norm_eps\": 1e-05, \"rope_theta\": 500000, \"use_bias\": false, \"tie_word_embeddings\": true, "
        "\"hidden_act\": \"silu\", \"torch_dtype\": \"bfloat16\"}";
    assert_int_equal(zo_model_config_parse(json, "ernie-4.5-0.3b.json", &c), ZO_OK);
    const uint64_t h = 1024, L = 18, q = 16 * 128, kv = 2 * 128, f = 3072, V = 103424;
    /* a layer: q, k, v, o_proj, gate, up, down, two RMSNorms; tied */
    uint64_t layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h;
    assert_int_equal(zo_model_params(&c), L * layer + V * h + h);
    assert_int_equal(L * layer + V * h + h, 360748032ull); /* (0.36B) */
    assert_true(!c.attn_bias && !c.out_bias && zo_model_rot_interleaved(&c) && c.rope_theta == 500000.0f);
    assert_int_equal(zo_model_config_runtime_check(&c), ZO_OK);
    /* every linear layer's bias: q, k, v, o (h), gate, up (f), down (h) */
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"ernie4_5\", \"use_bias\": true, " SHAPE_ONLY "}",
                                           "b.json", &c),
                     ZO_OK);
    zo_model_config nb;
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"ernie4_5\", " SHAPE_ONLY "}", "d.json", &nb), ZO_OK);
    const uint64_t hq = 8 * 128, hkv = 2 * 128;
    assert_int_equal(zo_model_params(&c) - zo_model_params(&nb), 2 * (hq + 2 * hkv + 128 + 2 * 128 + 128));
    /* Ernie4_5Config's defaults: 2 kv heads of 128, tied, eps 1e-5, rope_theta 500000, no biases */
    assert_true(nb.n_kv_heads == 2 && nb.head_dim == 128 && nb.tied_embeddings && nb.norm_eps == 1e-5f &&
                nb.rope_theta == 500000.0f && !nb.attn_bias);
}

/* v4 and v5 parsed; every rotary field of the two equal */
static void rope_same(const char *v4, const char *v5)
{
    zo_model_config a, b;
    if (zo_model_config_parse(v4, "r.json", &a)) fail_msg("%s: %s", v4, zo_last_error());
    if (zo_model_config_parse(v5, "r.json", &b)) fail_msg("%s: %s", v5, zo_last_error());
    if (a.rope_theta != b.rope_theta || strcmp(a.rope_scaling, b.rope_scaling) || a.rope_factor != b.rope_factor ||
        a.rope_low_freq_factor != b.rope_low_freq_factor || a.rope_high_freq_factor != b.rope_high_freq_factor ||
        a.rope_original_max != b.rope_original_max || a.rope_beta_fast != b.rope_beta_fast ||
        a.rope_beta_slow != b.rope_beta_slow || a.rope_attention_factor != b.rope_attention_factor ||
        a.rope_partial != b.rope_partial || a.rope_local_theta != b.rope_local_theta)
        fail_msg("%s\nreads other rotary fields than\n%s (theta %g / %g, scaling %s / %s, partial %g / %g, local %g / "
                 "%g)",
                 v5, v4, (double)a.rope_theta, (double)b.rope_theta, a.rope_scaling, b.rope_scaling, a.rope_partial,
                 b.rope_partial, (double)a.rope_local_theta, (double)b.rope_local_theta);
}

/* transformers 5's rope_parameters (what its save_pretrained writes in
 * place of rope_theta, rope_scaling and the rotated part; one object per
 * layer type for models whose layers differ) read as the same model as
 * the keys it replaces, its values first; what a family's parser does not
 * take refused by name. Each v5 form written here from the v4 one as
 * transformers' standardize_rope_params builds it. */
static void test_rope_parameters(void **state)
{
    (void)state;
    /* LLaMA-3.1's llama3 scaling */
    rope_same("{\"model_type\": \"llama\", " SHAPE_ONLY ", \"max_position_embeddings\": 131072, \"rope_theta\": "
              "500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
              "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}",
              "{\"model_type\": \"llama\", " SHAPE_ONLY ", \"max_position_embeddings\": 131072, \"rope_parameters\": "
              "{\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 8.0, \"low_freq_factor\": 1.0, "
              "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}");
    /* Gemma-3: one object per layer type, the sliding layers' base apart */
    rope_same("{\"model_type\": \"gemma3_text\", " SHAPE_ONLY ", \"rope_theta\": 1000000.0, \"rope_local_base_freq\": "
              "10000.0, \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}}",
              "{\"model_type\": \"gemma3_text\", " SHAPE_ONLY ", \"rope_parameters\": {\"full_attention\": "
              "{\"rope_type\": \"linear\", \"factor\": 8.0, \"rope_theta\": 1000000.0}, \"sliding_attention\": "
              "{\"rope_type\": \"default\", \"rope_theta\": 10000.0}}}");
    /* OLMo-3: yarn on the full layers, the sliding ones' default at the same base */
    rope_same("{\"model_type\": \"olmo3\", " SHAPE_ONLY ", \"rope_theta\": 500000, \"rope_scaling\": {\"rope_type\": "
              "\"yarn\", \"factor\": 8.0, \"original_max_position_embeddings\": 8192, \"attention_factor\": 1.2, "
              "\"beta_fast\": 32, \"beta_slow\": 1}}",
              "{\"model_type\": \"olmo3\", " SHAPE_ONLY ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": "
              "\"yarn\", \"rope_theta\": 500000, \"factor\": 8.0, \"original_max_position_embeddings\": 8192, "
              "\"attention_factor\": 1.2, \"beta_fast\": 32, \"beta_slow\": 1}, \"sliding_attention\": "
              "{\"rope_type\": \"default\", \"rope_theta\": 500000}}}");
    /* GPT-NeoX: rotary_emb_base and rotary_pct moved inside */
    rope_same("{\"model_type\": \"gpt_neox\", " SHAPE_ONLY ", \"rotary_emb_base\": 20000, \"rotary_pct\": 0.5}",
              "{\"model_type\": \"gpt_neox\", " SHAPE_ONLY ", \"rope_parameters\": {\"rope_type\": \"default\", "
              "\"rope_theta\": 20000, \"partial_rotary_factor\": 0.5}}");
    /* Phi-3's rotated part (Phi-4-mini's) inside */
    rope_same("{\"model_type\": \"phi3\", " SHAPE_ONLY ", \"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.75}",
              "{\"model_type\": \"phi3\", " SHAPE_ONLY ", \"rope_parameters\": {\"rope_type\": \"default\", "
              "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.75}}");
    /* rope_parameters first: over a stale top-level base and scaling */
    zo_model_config c;
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"llama\", " SHAPE_ONLY ", \"rope_theta\": 10000.0, "
                                           "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 4.0}, "
                                           "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 250000.0}}",
                                           "r.json", &c),
                     ZO_OK);
    assert_true(c.rope_theta == 250000.0f && !c.rope_scaling[0]);
    /* refused by name: a rotated part LLaMA's parser does not take, a
     * sliding base OLMo-3's layers do not have, a scaled sliding rotary, not
     * an object */
    expect_named("{\"model_type\": \"llama\", " SHAPE_ONLY ", \"rope_parameters\": {\"rope_type\": \"default\", "
                 "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.5}}",
                 "rope_parameters.partial_rotary_factor");
    expect_named("{\"model_type\": \"olmo3\", " SHAPE_ONLY ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": "
                 "\"default\", \"rope_theta\": 500000}, \"sliding_attention\": {\"rope_type\": \"default\", "
                 "\"rope_theta\": 10000}}}",
                 "rope_parameters.sliding_attention.rope_theta");
    expect_named("{\"model_type\": \"gemma3_text\", " SHAPE_ONLY ", \"rope_parameters\": {\"full_attention\": "
                 "{\"rope_type\": \"default\", \"rope_theta\": 1000000.0}, \"sliding_attention\": {\"rope_type\": "
                 "\"linear\", \"factor\": 2.0, \"rope_theta\": 10000.0}}}",
                 "rope_parameters.sliding_attention.rope_type");
    expect_named("{\"model_type\": \"llama\", " SHAPE_ONLY ", \"rope_parameters\": 5}", "rope_parameters");
}

/* Phi-3.5-MoE: the preset is its config.json in every field that sizes or
 * computes it but the longrope lists (the config.json's alone: tf_init
 * refuses the preset's, by name); PhimoeConfig's defaults; refusals by name.
 * The fixture has the published config's keys and values but for those
 * lists, which hold 1.0 each here (64 a list, as published; no size). */
static void test_phimoe_config(void **state)
{
    (void)state;
    zo_model_config p, c;
    assert_int_equal(zo_model_preset_find("phi-3.5-moe", &p), ZO_OK);
    load("phi-3.5-moe-instruct.json", &c);
    if (shape_differs(&p, &c) || p.sliding_window != c.sliding_window || strcmp(p.rope_scaling, c.rope_scaling) || p.rope_original_max != c.rope_original_max ||
        p.rope_attention_factor != c.rope_attention_factor ||
        p.rope_long_attention_factor != c.rope_long_attention_factor || p.moe.experts != c.moe.experts ||
        p.moe.top_k != c.moe.top_k || p.moe.expert_ffn != c.moe.expert_ffn || p.moe.norm_topk != c.moe.norm_topk ||
        p.moe.sparsemixer != c.moe.sparsemixer || p.moe.jitter_eps != c.moe.jitter_eps ||
        p.moe.aux_loss != c.moe.aux_loss || p.moe.aux_coef != c.moe.aux_coef)
        fail_msg("preset phi-3.5-moe differs from phi-3.5-moe-instruct.json");
    assert_true(c.layer_norm && c.norm_bias && c.attn_bias && c.out_bias && c.head_bias && c.moe.sparsemixer);
    assert_true(c.rope_original_max == 4096 && c.rope_n_factors == 64 && c.sliding_window == 131072);
    assert_true(fabsf(c.rope_long_attention_factor - 1.2431631f) < 1e-6f && c.moe.jitter_eps == 0.01f);
    assert_int_equal(zo_model_params(&p), 41873153344ull);
    assert_int_equal(zo_model_config_runtime_check(&c), ZO_OK);
    /* PhimoeConfig's defaults: 8 kv heads, eps 1e-5, rope_theta 1e6, jitter 0.01, no biases */
    zo_model_config d;
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"phimoe\", " SHAPE_ONLY "}", "d.json", &d), ZO_OK);
    assert_true(d.n_kv_heads == 8 && d.norm_eps == 1e-5f && d.rope_theta == 1e6f && d.moe.jitter_eps == 0.01f &&
                d.moe.experts == 16 && d.moe.top_k == 2 && !d.attn_bias && !d.head_bias && d.max_seq == 131072);
    /* refused by name */
    expect_named("{\"model_type\": \"phimoe\", \"num_experts_per_tok\": 3, " SHAPE_ONLY "}",
                   "num_experts_per_tok");
    expect_named("{\"model_type\": \"phimoe\", \"router_jitter_noise\": -0.5, " SHAPE_ONLY "}",
                   "router_jitter_noise");
    expect_named("{\"model_type\": \"phimoe\", \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1], "
                   "\"long_factor\": [1], \"short_mscale\": 1.2, \"original_max_position_embeddings\": 8}, " SHAPE_ONLY "}",
                   "long_mscale");
    expect_named("{\"model_type\": \"phimoe\", \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1], "
                   "\"long_factor\": [1], \"short_mscale\": 1.2, \"long_mscale\": 1.2}, " SHAPE_ONLY "}",
                   "original_max_position_embeddings");
}

/* The phi-2 preset is microsoft/phi-2's config.json: every field that sizes
 * or computes it, the output layer's bias and the rotated share included;
 * PhiConfig's defaults (no partial_rotary_factor: 0.5; no
 * num_key_value_heads: the heads; no hidden_act: gelu_new) too. */
static void test_phi_presets(void **state)
{
    (void)state;
    zo_model_config p, c;
    assert_int_equal(zo_model_preset_find("phi-2", &p), ZO_OK);
    load("phi-2.json", &c);
    if (shape_differs(&p, &c) || p.rope_partial != c.rope_partial || p.pos != c.pos ||
        p.layer_norms != c.layer_norms || p.parallel_block != c.parallel_block)
        fail_msg("preset phi-2 differs from phi-2.json");
    assert_true(c.head_bias && c.rope_partial == 0.4 && zo_model_rope_dim(&c) == 32);
    assert_int_equal(zo_model_config_runtime_check(&p), ZO_OK);
    zo_model_config d;
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"phi\", \"num_hidden_layers\": 2, "
                                           "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                                           "\"intermediate_size\": 128, \"vocab_size\": 100}",
                                           "p.json", &d),
                     ZO_OK);
    assert_true(d.rope_partial == 0.5 && d.n_kv_heads == 4 && !strcmp(d.act, "gelu_new") && !d.tied_embeddings &&
                d.head_bias && d.layer_norms == 1 && d.parallel_block);
    /* the head's count: vocab x hidden + vocab */
    zo_param_counts pc;
    zo_model_param_counts(&d, &pc);
    assert_int_equal(pc.head, 100 * 64 + 100);
}

/* The gpt-j-6b preset is EleutherAI/gpt-j-6b's config.json: every field
 * that sizes or computes it (no attention biases, the MLP's and the output
 * layer's, 64 of 256 dimensions rotated); GPTJConfig's defaults (no
 * rotary_dim: the whole head; n_inner null: 4 n_embd; no
 * activation_function: gelu_new) too. */
static void test_gptj_presets(void **state)
{
    (void)state;
    zo_model_config p, c;
    assert_int_equal(zo_model_preset_find("gpt-j-6b", &p), ZO_OK);
    load("gpt-j-6b.json", &c);
    if (strcmp(p.family, c.family) || p.arch != c.arch || p.n_layers != c.n_layers || p.hidden != c.hidden ||
        p.n_heads != c.n_heads || p.n_kv_heads != c.n_kv_heads || p.head_dim != c.head_dim || p.ffn != c.ffn ||
        p.vocab != c.vocab || p.max_seq != c.max_seq || p.tied_embeddings != c.tied_embeddings ||
        p.attn_bias != c.attn_bias || p.out_bias != c.out_bias || p.attn_out_nobias != c.attn_out_nobias ||
        p.norm_bias != c.norm_bias || p.head_bias != c.head_bias || p.norm_eps != c.norm_eps ||
        p.rope_theta != c.rope_theta || p.rope_partial != c.rope_partial || strcmp(p.act, c.act) ||
        p.pos != c.pos || p.layer_norms != c.layer_norms || p.parallel_block != c.parallel_block)
        fail_msg("preset gpt-j-6b differs from gpt-j-6b.json");
    assert_true(!c.attn_bias && c.out_bias && c.attn_out_nobias && c.head_bias && zo_model_rope_dim(&c) == 64 &&
                c.ffn == 16384 && !c.tied_embeddings);
    assert_int_equal(zo_model_config_runtime_check(&p), ZO_OK);
    zo_model_config d;
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"gptj\", \"n_layer\": 2, \"n_embd\": 160, "
                                           "\"n_head\": 2, \"n_positions\": 256, \"vocab_size\": 100}",
                                           "j.json", &d),
                     ZO_OK);
    assert_true(d.rope_partial == 0.0 && zo_model_rope_dim(&d) == 80 && d.ffn == 640 && !strcmp(d.act, "gelu_new") &&
                !d.tied_embeddings && d.head_bias && d.layer_norms == 1 && d.parallel_block);
    /* a layer: ln_1, q, k, v, out_proj without biases, fc_in and fc_out with */
    zo_layer_params lp;
    zo_model_layer_params(&d, 0, &lp);
    assert_int_equal(lp.total, 2 * 160 + 4 * 160 * 160 + 160 * 640 + 640 + 640 * 160 + 160);
    /* rotary_dim 24 of 80: a share that gives 24 back; odd or past the head refused by name */
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"gptj\", \"n_layer\": 2, \"n_embd\": 160, "
                                           "\"n_head\": 2, \"n_positions\": 256, \"vocab_size\": 100, "
                                           "\"rotary_dim\": 24}",
                                           "j.json", &d),
                     ZO_OK);
    assert_int_equal(zo_model_rope_dim(&d), 24);
    /* 30 of 44, where int(44 x (30 / 44)) in doubles is 29: still 30 */
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"gptj\", \"n_layer\": 2, \"n_embd\": 88, "
                                           "\"n_head\": 2, \"n_positions\": 256, \"vocab_size\": 100, "
                                           "\"rotary_dim\": 30}",
                                           "j.json", &d),
                     ZO_OK);
    assert_int_equal(zo_model_rope_dim(&d), 30);
    static const char *const bad[] = {"23", "82"};
    for (int i = 0; i < 2; i++) {
        char json[256];
        snprintf(json, sizeof json,
                 "{\"model_type\": \"gptj\", \"n_layer\": 2, \"n_embd\": 160, \"n_head\": 2, "
                 "\"n_positions\": 256, \"vocab_size\": 100, \"rotary_dim\": %s}",
                 bad[i]);
        assert_int_equal(zo_model_config_parse(json, "j.json", &d), ZO_ERR_FORMAT);
        assert_non_null(strstr(zo_last_error(), "rotary_dim"));
    }
}

/* Hugging Face's per-family defaults: an absent tie_word_embeddings is tied
 * for Gemma, Falcon, OPT and BLOOM and untied for LLaMA, Mixtral, GPT-NeoX;
 * Mistral's absent num_key_value_heads is 8. */
static void test_family_defaults(void **state)
{
    (void)state;
    static const struct { const char *type; int tied; } tie[] = {
        {"gemma", 1}, {"falcon", 1}, {"opt", 1}, {"bloom", 1}, {"gpt2", 1},
        {"llama", 0}, {"mistral", 0}, {"mixtral", 0}, {"gpt_neox", 0}, {"qwen2", 0},
    };
    for (size_t i = 0; i < sizeof tie / sizeof tie[0]; i++) {
        char json[512];
        snprintf(json, sizeof json,
                 "{\"model_type\": \"%s\", \"num_hidden_layers\": 2, \"n_layer\": 2, "
                 "\"hidden_size\": 64, \"n_embd\": 64, \"num_attention_heads\": 4, \"n_head\": 4, "
                 "\"intermediate_size\": 128, \"ffn_dim\": 128, \"vocab_size\": 100, "
                 "\"n_positions\": 64, \"num_key_value_heads\": 4, \"head_dim\": 16}",
                 tie[i].type);
        zo_model_config c;
        if (zo_model_config_parse(json, "d.json", &c)) fail_msg("%s", zo_last_error());
        if (c.tied_embeddings != tie[i].tied)
            fail_msg("%s: tied %d, want %d", tie[i].type, c.tied_embeddings, tie[i].tied);
    }
    zo_model_config c;
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"mistral\", \"num_hidden_layers\": 2, "
                                           "\"hidden_size\": 64, \"num_attention_heads\": 16, "
                                           "\"intermediate_size\": 128, \"vocab_size\": 100}",
                                           "m.json", &c),
                     ZO_OK);
    assert_int_equal(c.n_kv_heads, 8);
    /* the architectures' class names the family when model_type is absent */
    assert_int_equal(zo_model_config_parse("{\"architectures\": [\"Qwen2ForCausalLM\"], "
                                           "\"num_hidden_layers\": 2, \"hidden_size\": 64, "
                                           "\"num_attention_heads\": 4, \"num_key_value_heads\": 4, "
                                           "\"intermediate_size\": 128, \"vocab_size\": 100}",
                                           "q.json", &c),
                     ZO_OK);
    assert_string_equal(c.family, "qwen2");
    assert_true(c.attn_bias);
}

#define SHAPE_2L "\"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 4, " \
                 "\"intermediate_size\": 128, \"vocab_size\": 100"

/* What limits or rescales attention, read as Hugging Face reads it: Mistral's
 * sliding_window (4096 when absent, none when null), Qwen2's and Qwen3's
 * only with use_sliding_window on a layer from max_window_layers, rope_scaling's
 * rope_type (or type) unless "default". None of it changes a count. */
static void test_attention_extent(void **state)
{
    (void)state;
    static const struct {
        const char *config;
        int window;
        const char *rope_scaling;
    } real[] = {
        {"mistral-7b.json", 4096, ""},     {"llama-2-7b.json", 0, ""},       {"llama-3-8b.json", 0, ""},
        {"llama-3.1-8b.json", 0, "llama3"}, {"llama-3.2-1b.json", 0, "llama3"}, {"qwen2.5-7b.json", 0, ""},
        {"qwen2.5-0.5b.json", 0, ""},       {"gpt2.json", 0, ""},            {"qwen3-8b.json", 0, ""},
        {"qwen3-30b-a3b.json", 0, ""},
    };
    zo_model_config c;
    for (size_t i = 0; i < sizeof real / sizeof real[0]; i++) {
        load(real[i].config, &c);
        if (c.sliding_window != real[i].window || strcmp(c.rope_scaling, real[i].rope_scaling))
            fail_msg("%s: window %d, rope_scaling \"%s\"; want %d, \"%s\"", real[i].config, c.sliding_window,
                     c.rope_scaling, real[i].window, real[i].rope_scaling);
    }
    static const struct {
        const char *keys;
        int window;
        const char *rope_scaling;
    } cases[] = {
        {"\"model_type\": \"mistral\"", 4096, ""},
        {"\"model_type\": \"mistral\", \"sliding_window\": null", 0, ""},
        {"\"model_type\": \"mistral\", \"sliding_window\": 100", 100, ""},
        {"\"model_type\": \"llama\", \"sliding_window\": 100", 0, ""},
        {"\"model_type\": \"qwen2\", \"sliding_window\": 100", 0, ""},
        {"\"model_type\": \"qwen2\", \"sliding_window\": 100, \"use_sliding_window\": true", 0, ""},
        {"\"model_type\": \"qwen2\", \"sliding_window\": 100, \"use_sliding_window\": true, "
         "\"max_window_layers\": 2", 0, ""},
        {"\"model_type\": \"qwen2\", \"sliding_window\": 100, \"use_sliding_window\": true, "
         "\"max_window_layers\": 1", 100, ""},
        {"\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"max_window_layers\": 0", 4096, ""},
        /* Qwen3's (and Qwen3-MoE's) window as Qwen2's */
        {"\"model_type\": \"qwen3\", \"sliding_window\": 100", 0, ""},
        {"\"model_type\": \"qwen3\", \"sliding_window\": 100, \"use_sliding_window\": true, "
         "\"max_window_layers\": 1", 100, ""},
        {"\"model_type\": \"qwen3_moe\", \"sliding_window\": 100, \"use_sliding_window\": true, "
         "\"max_window_layers\": 2", 0, ""},
        {"\"model_type\": \"llama\", \"rope_scaling\": null", 0, ""},
        {"\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"default\"}", 0, ""},
        {"\"model_type\": \"llama\", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}", 0, "linear"},
        {"\"model_type\": \"qwen2\", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}", 0, "yarn"},
        {"\"model_type\": \"llama\", \"rope_scaling\": {\"factor\": 2.0}", 0, "unnamed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "{%s, " SHAPE_2L ", \"num_key_value_heads\": 4}", cases[i].keys);
        if (zo_model_config_parse(json, "e.json", &c)) fail_msg("%s: %s", json, zo_last_error());
        if (c.sliding_window != cases[i].window || strcmp(c.rope_scaling, cases[i].rope_scaling))
            fail_msg("%s: window %d, rope_scaling \"%s\"; want %d, \"%s\"", json, c.sliding_window, c.rope_scaling,
                     cases[i].window, cases[i].rope_scaling);
    }
    /* the presets: Mistral-7B-v0.1's window */
    assert_int_equal(zo_model_preset_find("mistral-7b", &c), ZO_OK);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(zo_model_preset_find("llama-2-7b", &c), ZO_OK);
    assert_int_equal(c.sliding_window, 0);
}

/* ---- refused by name ---------------------------------------------------------------- */

static void expect_refused(const char *json, const char *key, const char *also)
{
    zo_model_config c;
    zo_status st = zo_model_config_parse(json, "r.json", &c);
    char want[96];
    snprintf(want, sizeof want, "field \"%s\"", key);
    if (st != ZO_ERR_UNSUPPORTED || !strstr(zo_last_error(), want) ||
        (also && !strstr(zo_last_error(), also)))
        fail_msg("%s: status %d, \"%s\" (want %s and %s)", json, st, zo_last_error(), want,
                 also ? also : "");
}

#define SHAPE "\"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 4, " \
              "\"intermediate_size\": 128, \"vocab_size\": 100"

static void test_refused(void **state)
{
    (void)state;
    /* recognised families that are not modelled */
    static const char *families[] = {"t5", "bert", "mamba", "rwkv", "jamba", "mllama", "qwen3_next"};
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        char json[256];
        snprintf(json, sizeof json, "{\"model_type\": \"%s\", " SHAPE "}", families[i]);
        expect_refused(json, "model_type", families[i]);
    }
    /* an unknown family, whatever fields it has */
    expect_refused("{\"model_type\": \"frobnicator\", " SHAPE "}", "model_type", "frobnicator");
    /* keys that change the size and that the family's parser does not model */
    expect_refused("{\"model_type\": \"llama\", \"num_local_experts\": 8, " SHAPE "}",
                   "num_local_experts", "llama");
    expect_refused("{\"model_type\": \"mistral\", \"kv_lora_rank\": 512, " SHAPE "}",
                   "kv_lora_rank", NULL);
    expect_refused("{\"model_type\": \"qwen2\", \"num_experts\": 60, " SHAPE "}", "num_experts",
                   NULL);
    expect_refused("{\"model_type\": \"qwen3\", \"attention_bias\": true, " SHAPE "}",
                   "attention_bias", NULL);
    expect_refused("{\"model_type\": \"gemma2\", \"mlp_bias\": true, " SHAPE "}", "mlp_bias", NULL);
    /* Phi's LayerNorm over each q and k head */
    expect_refused("{\"model_type\": \"phi\", \"qk_layernorm\": true, " SHAPE "}", "qk_layernorm", NULL);
    expect_refused("{\"model_type\": \"qwen3_moe\", \"mlp_only_layers\": [0], " SHAPE "}",
                   "mlp_only_layers", NULL);
    expect_refused("{\"model_type\": \"qwen2_moe\", \"decoder_sparse_step\": 2, " SHAPE "}",
                   "decoder_sparse_step", NULL);
    expect_refused("{\"model_type\": \"deepseek_v2\", \"n_routed_experts\": 8, "
                   "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
                   "\"moe_layer_freq\": 2, " SHAPE "}",
                   "moe_layer_freq", NULL);
    expect_refused("{\"model_type\": \"llama\", \"num_nextn_predict_layers\": 1, " SHAPE "}",
                   "num_nextn_predict_layers", NULL);
    expect_refused("{\"model_type\": \"qwen2\", \"layer_types\": [\"linear_attention\"], " SHAPE "}",
                   "layer_types", "linear_attention");
    expect_refused("{\"model_type\": \"llama\", \"text_config\": {\"hidden_size\": 64}, " SHAPE "}",
                   "text_config", NULL);
    /* neutral values of those keys are fine: DeepSeek-V2-Lite's q_lora_rank
     * null, Qwen3-MoE's mlp_only_layers [], LLaMA's attention_bias false */
    zo_model_config c;
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"llama\", \"attention_bias\": false, "
                                           "\"mlp_bias\": false, \"q_lora_rank\": null, " SHAPE "}",
                                           "n.json", &c),
                     ZO_OK);
}

/* Shapes and constants that parse but make no sense are bad input, refused
 * naming the key before a product of them is formed: the 4 x hidden MLP of
 * GPT-2, Falcon and BLOOM (n_embd = 2147483647 overflowed an int), DeepSeek's
 * shared experts and latent head dims; routed experts and latent attention
 * count in the limit of 2^53 parameters; a key given twice; memplan exits 2. */
static void test_nonsense_refused(void **state)
{
    (void)state;
    static const struct {
        const char *json, *said;
        zo_status st;
    } cases[] = {
        {"{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_embd\": 2147483647, \"n_head\": 1, "
         "\"n_positions\": 8, \"vocab_size\": 8}", "field \"n_embd\": 4 x 2147483647", ZO_ERR_FORMAT},
        {"{\"model_type\": \"falcon\", \"num_hidden_layers\": 1, \"hidden_size\": 1073741824, "
         "\"num_attention_heads\": 1, \"vocab_size\": 8}", "field \"hidden_size\": 4 x", ZO_ERR_FORMAT},
        {"{\"model_type\": \"bloom\", \"n_layer\": 1, \"hidden_size\": 600000000, \"n_head\": 1, "
         "\"vocab_size\": 8}", "field \"hidden_size\": 4 x", ZO_ERR_FORMAT},
        {"{\"model_type\": \"deepseek\", \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, "
         "\"moe_intermediate_size\": 65536, \"n_shared_experts\": 65536, " SHAPE "}",
         "field \"n_shared_experts\": 65536 x 65536", ZO_ERR_FORMAT},
        {"{\"model_type\": \"deepseek_v2\", \"qk_nope_head_dim\": 2147483647, \"qk_rope_head_dim\": 64, "
         SHAPE "}", "field \"qk_rope_head_dim\"", ZO_ERR_FORMAT},
        /* 2^31 - 1 experts of 3 x 4096 x 14336 each: 3.8e17 parameters */
        {"{\"model_type\": \"mixtral\", \"num_local_experts\": 2147483647, \"num_hidden_layers\": 1, "
         "\"hidden_size\": 4096, \"num_attention_heads\": 32, \"intermediate_size\": 14336, "
         "\"vocab_size\": 100}", "(and the experts)", ZO_ERR_INVALID},
        /* a latent kv projection of 2^31 x 128 x 256 per layer, 1000 layers: 7e16 */
        {"{\"model_type\": \"deepseek_v2\", \"kv_lora_rank\": 2147483647, \"num_hidden_layers\": 1000, "
         "\"hidden_size\": 64, \"num_attention_heads\": 128, \"intermediate_size\": 128, "
         "\"vocab_size\": 100}", "more than 2^53", ZO_ERR_INVALID},
        {"{\"model_type\": \"llama\", \"rms_norm_eps\": -1e-6, " SHAPE "}", "rms_norm_eps", ZO_ERR_INVALID},
        {"{\"model_type\": \"llama\", \"hidden_size\": 32, " SHAPE "}", "\"hidden_size\" appears twice",
         ZO_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zo_model_config c;
        zo_status st = zo_model_config_parse(cases[i].json, "n.json", &c);
        if (st != cases[i].st || !strstr(zo_last_error(), cases[i].said))
            fail_msg("case %zu: status %d, \"%s\" (want %d and \"%s\")", i, st, zo_last_error(),
                     cases[i].st, cases[i].said);
    }
    /* memplan: bad input */
    char path[64], args[128];
    static char out[1 << 16];
    scratch_path(path, sizeof path, "zo_test_families_%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(cases[0].json, f);
    fclose(f);
    snprintf(args, sizeof args, "estimate --model %s", path);
    assert_int_equal(run_memplan(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "n_embd"));
    remove(path);
}

/* The CLI: exit 2 naming the key, for published configs it does not model. */
static void test_cli_refused(void **state)
{
    (void)state;
    static const struct { const char *config, *key; } cases[] = {
        {"t5-base.json", "model_type"},         /* an encoder-decoder */
        {"opt-350m.json", "word_embed_proj_dim"}, /* OPT-350m's projected embedding */
    };
    static char out[1 << 16];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024];
        snprintf(args, sizeof args, "estimate --model %s/hf-configs/%s", ZO_FIXTURES_DIR,
                 cases[i].config);
        assert_int_equal(run_memplan(args, out, sizeof out), 2);
        if (!strstr(out, cases[i].key)) fail_msg("%s: %s", cases[i].config, out);
    }
}

/* text_model_of_multimodal of memplan `command`'s JSON: in the model object
 * of estimate's report and of a plan, beside the model's name in
 * generate's; the test fails when it is not a boolean. */
static int json_text_model_of_multimodal(const cJSON *doc, const char *command)
{
    const cJSON *o = strcmp(command, "generate") ? cJSON_GetObjectItemCaseSensitive(doc, "model") : doc;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "text_model_of_multimodal");
    if (!cJSON_IsBool(b)) fail_msg("memplan %s --json: no boolean text_model_of_multimodal", command);
    return cJSON_IsTrue(b);
}

/* The defaults a user trips on: --seq is not Llama-3.1's 131072 positions
 * but at most 4096, and says so; a V100 gets fp16 (bf16 refused) and a
 * warning for FlashAttention; a multimodal checkpoint is sized as its text
 * model, and the reports say so. */
static void test_cli_defaults(void **state)
{
    (void)state;
    static char out[1 << 16];
    char args[1024];
    snprintf(args, sizeof args, "estimate --model %s/hf-configs/llama-3.1-8b.json --hw h100-80gb",
             ZO_FIXTURES_DIR);
    run_memplan(args, out, sizeof out);
    assert_non_null(strstr(out, "seq 4096 (default: the model's positions, at most 4096)"));
    snprintf(args, sizeof args, "estimate --model %s/hf-configs/llama-3.1-8b.json --seq 8192",
             ZO_FIXTURES_DIR);
    run_memplan(args, out, sizeof out);
    assert_non_null(strstr(out, "seq 8192,"));
    /* GPT-2's 1024 learned positions are below the cap and stay the default */
    assert_true(run_memplan("estimate --model gpt2", out, sizeof out) <= 1);
    assert_non_null(strstr(out, "seq 1024 (default"));

    assert_int_equal(run_memplan("estimate --model gpt2 --hw v100-32gb --dtype bf16", out, sizeof out), 2);
    assert_non_null(strstr(out, "--dtype bf16"));
    assert_non_null(strstr(out, "V100"));
    assert_int_equal(run_memplan("estimate --model gpt2 --hw v100-32gb", out, sizeof out), 0);
    assert_non_null(strstr(out, "fp16 weights"));
    assert_non_null(strstr(out, "warning: V100-32GB has no FlashAttention"));
    assert_int_equal(run_memplan("estimate --model gpt2 --hw v100-32gb --no-flash-attn", out, sizeof out), 0);
    assert_null(strstr(out, "warning"));

    /* a multimodal checkpoint: its text model's count (3.88B for gemma-3-4b,
     * whose card says 4.3B with the vision tower), said so in each report,
     * and in its JSON (with the same exit status); a text model's JSON says
     * false */
    static const char *const cmd[] = {"estimate", "plan", "generate"};
    zo_model_config text;
    load("gemma-3-4b-it.json", &text);
    for (size_t i = 0; i < sizeof cmd / sizeof cmd[0]; i++) {
        snprintf(args, sizeof args, "%s --model %s/hf-configs/gemma-3-4b-it.json --gpu-mem 24GiB", cmd[i],
                 ZO_FIXTURES_DIR);
        int rc = run_memplan(args, out, sizeof out);
        assert_true(rc <= 1);
        assert_non_null(strstr(out, "the text model of a multimodal checkpoint: its vision tower neither counted"));
        if (i < 2) assert_non_null(strstr(out, "(3.88B params, the text model"));
        cJSON *doc = run_memplan_json(args, rc);
        assert_true(json_text_model_of_multimodal(doc, cmd[i]));
        if (i < 2) assert_true(run_json_num(doc, "model", "params") == (double)zo_model_params(&text));
        cJSON_Delete(doc);

        snprintf(args, sizeof args, "%s --model %s/hf-configs/llama-3.1-8b.json --gpu-mem 24GiB", cmd[i],
                 ZO_FIXTURES_DIR);
        rc = run_memplan(args, out, sizeof out);
        assert_true(rc <= 1);
        assert_null(strstr(out, "multimodal"));
        doc = run_memplan_json(args, rc);
        assert_false(json_text_model_of_multimodal(doc, cmd[i]));
        cJSON_Delete(doc);
    }
}

/* ---- a mixture of experts with expert parallelism ------------------------------------- */

typedef struct moe_setup {
    zo_model_config m;
    plan_hw hw;
    plan_train t;
    plan_estimate e;
    plan_time pt;
} moe_setup;

/* Mixtral-8x7B on one 8 x H100 node, DP 8 with EP 8: each rank holds one
 * expert of each layer. */
static void mixtral_setup_of(moe_setup *s, int ep, int zero, int top_k, double capacity_factor)
{
    load("mixtral-8x7b.json", &s->m);
    if (top_k) s->m.moe.top_k = top_k;
    assert_int_equal(plan_hw_find("dgx-h100", &s->hw), ZO_OK);
    plan_train_defaults(&s->t, &s->m);
    s->t.seq = 4096;
    s->t.dp = 8;
    s->t.ep = ep;
    s->t.zero = zero;
    s->t.capacity_factor = capacity_factor;
    assert_int_equal(plan_estimate_run(&s->m, &s->hw, &s->t, &s->e), ZO_OK);
    assert_int_equal(plan_time_run(&s->m, &s->hw, &s->t, &s->e, &s->pt), ZO_OK);
}

static void mixtral_setup(moe_setup *s, int ep, int zero) { mixtral_setup_of(s, ep, zero, 0, 0); }

static uint64_t item(const plan_estimate *e, const char *name, plan_tier tier)
{
    for (int i = 0; i < e->n_items; i++)
        if (e->items[i].tier == tier && !strcmp(e->items[i].name, name)) return e->items[i].bytes;
    return 0;
}

static void test_mixtral_ep8_bytes(void **state)
{
    (void)state;
    moe_setup s;
    mixtral_setup(&s, 8, 1);
    /* by hand, per layer: attention 4096 x (4096 + 2 x 1024) + 4096 x 4096
     * = 41,943,040, two RMSNorms 8192, router 4096 x 8 = 32,768: 41,984,000
     * on every rank; one expert of 3 x 4096 x 14336 = 176,160,768 per rank
     * with EP 8. Embedding and output layer 2 x 32000 x 4096 = 262,144,000,
     * final norm 4096. */
    const uint64_t dense = 32ull * 41984000 + 262144000 + 4096; /* 1,605,636,096 */
    const uint64_t experts = 32ull * 176160768;                  /* 5,637,144,576 */
    assert_int_equal(s.e.stage_params, dense + experts);         /* 7,242,780,672 */
    assert_int_equal(s.e.stage_expert_params, experts);
    /* bf16 weights and the runtime's fp32 gradient sums, whole on each rank
     * (ZeRO-1) */
    assert_int_equal(item(&s.e, "fp16/bf16 weights", PLAN_GPU), 2 * (dense + experts));
    assert_int_equal(item(&s.e, "gradient sums (fp32)", PLAN_GPU), 4 * (dense + experts));
    /* ZeRO-1 shards AdamW's 12 bytes over the ranks that hold the same
     * parameters: the dense ones over DP 8, each expert is on one rank
     * (DP / EP = 1), so its optimizer state is not sharded at all */
    assert_int_equal(item(&s.e, "AdamW: fp32 master, m, v", PLAN_GPU),
                     12 * ((dense + 7) / 8 + experts));
    /* 87.6 GB of model states alone: over an 80 GB GPU */
    assert_false(s.e.fits);

    /* without EP every rank holds all 8 experts: the whole model */
    moe_setup all;
    mixtral_setup(&all, 1, 1);
    assert_int_equal(all.e.stage_params, zo_model_params(&all.m));
    assert_int_equal(item(&all.e, "AdamW: fp32 master, m, v", PLAN_GPU),
                     12 * ((zo_model_params(&all.m) + 7) / 8));

    /* the MoE layer's activations (no recompute, flash attention, bf16, seq
     * 4096, micro-batch 1), by hand against the dense MLP they replace
     * (gate, up and down inputs of 14336 per token), as the runtime's
     * transformer keeps them: the router's fp32 logits and probabilities
     * 2 x 8 x 4 B, the 2 (token, expert) pairs' token index and weight
     * 2 x 2 x 4 B, and the experts' gate, up and down outputs over the 2
     * routed rows: 3 x (2 x 14336) x 2 B, per token (the pairs' inputs and
     * outputs go through buffers the layers share, since issue 31) */
    uint64_t sq = 4096;
    uint64_t moe_rows = sq * (2 * 8 * 4 + 2 * 2 * 4 + 3 * 2 * 14336 * 2);
    uint64_t dense_rows = sq * 3 * 14336 * 2;
    assert_int_equal(plan_layer_act_bytes_of(&all.m, &all.t, 1, 1) - plan_layer_act_bytes_of(&all.m, &all.t, 1, 0),
                     moe_rows - dense_rows);
    /* a capacity factor: C = ceil(F 4096 x 2 / 8) pairs an expert. This
     * runtime holds min(4096 x 2, 8 C) rows: at 1.25 (C = 1280) every pair,
     * as dropless; at 0.5 (C = 512) half of them. PyTorch eager pads each
     * expert to its capacity: a quarter more at 1.25. */
    plan_train cf = all.t;
    uint64_t routed = sq * (2 * 2 * 4 + 3 * 2 * 14336 * 2);
    assert_int_equal(cf.runtime, PLAN_RUNTIME_ZOFFLOAD);
    cf.capacity_factor = 1.25;
    assert_int_equal(plan_layer_act_bytes_of(&all.m, &cf, 1, 1), plan_layer_act_bytes_of(&all.m, &all.t, 1, 1));
    cf.capacity_factor = 0.5;
    assert_int_equal(plan_layer_act_bytes_of(&all.m, &all.t, 1, 1) - plan_layer_act_bytes_of(&all.m, &cf, 1, 1),
                     routed / 2);
    cf.capacity_factor = 1.25;
    cf.runtime = PLAN_RUNTIME_EAGER;
    plan_train eager = all.t;
    eager.runtime = PLAN_RUNTIME_EAGER;
    assert_int_equal(plan_layer_act_bytes_of(&all.m, &cf, 1, 1) - plan_layer_act_bytes_of(&all.m, &eager, 1, 1),
                     routed / 4);
    /* with EP 8 the rank's expert keeps the rows every rank of its group can
     * send it, 8 x min(2, 1) a token (dropless): their gate, up and down
     * inputs 3 x 8 x 14336 x 2 B, the rows themselves 8 x 4096 x 2 B, their
     * weights and order 8 x 12 B; the rank's own pairs as before */
    uint64_t ep_rows = sq * (2 * 8 * 4 + 2 * 2 * 4 + 3 * 8 * 14336 * 2 + 8 * 4096 * 2 + 8 * 12);
    assert_int_equal(plan_ep_rows(&s.m, &s.t), 8 * sq);
    /* with a capacity factor each rank sends its expert at most C rows:
     * at 0.5 C = 512, 8 x 512 from the group (dropless: 8 x 4096) */
    plan_train ep_cf = s.t;
    ep_cf.capacity_factor = 0.5;
    assert_int_equal(plan_ep_rows(&s.m, &ep_cf), 8 * 512);
    assert_int_equal(plan_layer_act_bytes_of(&s.m, &s.t, 1, 1) - plan_layer_act_bytes_of(&s.m, &s.t, 1, 0),
                     ep_rows - dense_rows);
}

static void test_mixtral_ep_time(void **state)
{
    (void)state;
    moe_setup ep8, ep1;
    mixtral_setup(&ep8, 8, 1);
    mixtral_setup(&ep1, 1, 1);
    /* EP: per layer, 4096 x 2 (token, expert) pairs of which 7/8 leave the
     * rank (uniform routing). Forward: each of the 7 other ranks' count of
     * pairs for its 1 expert (int32), the pairs' rows out (4096 x 2 B) with
     * their fp32 weights, and the rows back; backward in fp32: the output
     * rows' gradients out, the input rows' and the weights' gradients back.
     * Four all-to-alls' latencies (dispatch and combine, forward and
     * backward) over NVLink. */
    double bw = ep8.hw.nvlink_bw * ep8.hw.coll_eff;
    double remote = 7.0 / 8 * 4096.0 * 2;
    double fwd = 7 * 1 * 4 + remote * (4096 * 2 + 4 + 4096 * 2);
    double bwd = remote * (4096 * 4 + 4096 * 4 + 4);
    double layer_s = 4 * 7 * ep8.hw.nvlink_lat + (fwd + bwd) / bw;
    assert_true(fabs(ep8.pt.ep_comm - 32 * layer_s) < 1e-9);
    assert_true(ep8.pt.ep_bytes == 32 * (fwd + bwd));
    assert_true(ep1.pt.ep_comm == 0 && ep1.pt.ep_bytes == 0);
    /* model FLOPs from the active parameters: per token 2 x (attention 41.9M
     * + router 32K + 2 experts of 176.2M) per layer and the attention core
     * 2 x s x (128 + 128) x 32, three passes, plus the output layer */
    double h = 4096, s = 4096, L = 32, v = 32000;
    double layer = 2 * (41943040.0 + 4096 * 8 + 2 * 176160768.0) + 2 * s * 256 * 32;
    assert_true(fabs(ep8.pt.mb.model_flops_token / (3 * (L * layer + 2 * h * v)) - 1) < 1e-12);
    /* the experts' gradients are reduced over DP / EP = 1 rank: nothing; the
     * dense ones over all 8 */
    assert_true(ep8.pt.dp_comm_total < ep1.pt.dp_comm_total);
}

/* The time of capacity-limited routing (this runtime): an expert computes
 * the rows it keeps, min(rows routed to it, C). memplan routes uniformly,
 * 4096 x 2 / 8 = 1024 rows an expert a micro-batch; C = ceil(F 4096 x 2 /
 * 8). At F 0.5, C = 512: half the rows, 4096 a layer, of which 7/8 cross
 * the EP 8 group, forward (the counts, the rows out with their fp32
 * weights and back) and backward (fp32): by hand as test_mixtral_ep_time.
 * They are the rows of a dropless top-1 Mixtral, whose layer times the
 * same: every compute and exchange part equal. At F 1.25, C = 1280 >=
 * 1024: nothing to drop, the dropless times exactly. */
static void test_mixtral_capacity_time(void **state)
{
    (void)state;
    moe_setup drop0, half, wide, top1;
    mixtral_setup_of(&drop0, 8, 1, 0, 0);
    mixtral_setup_of(&half, 8, 1, 0, 0.5);
    mixtral_setup_of(&wide, 8, 1, 0, 1.25);
    mixtral_setup_of(&top1, 8, 1, 1, 0);
    double remote = 7.0 / 8 * 4096;
    double fwd = 7 * 1 * 4 + remote * (4096 * 2 + 4 + 4096 * 2), bwd = remote * (4096 * 4 + 4096 * 4 + 4);
    printf("  ep bytes a step: dropless %.0f, F 0.5 %.0f (by hand %.0f), F 1.25 %.0f\n", drop0.pt.ep_bytes,
           half.pt.ep_bytes, 32 * (fwd + bwd), wide.pt.ep_bytes);
    assert_true(half.pt.ep_bytes == 32 * (fwd + bwd));
    assert_true(fabs(half.pt.ep_comm - 32 * (4 * 7 * half.hw.nvlink_lat +
                                             (fwd + bwd) / (half.hw.nvlink_bw * half.hw.coll_eff))) < 1e-9);
    printf("  forward + backward: dropless %.6f s, F 0.5 %.6f s (top-1 dropless %.6f s), F 1.25 %.6f s\n",
           drop0.pt.forward + drop0.pt.backward, half.pt.forward + half.pt.backward,
           top1.pt.forward + top1.pt.backward, wide.pt.forward + wide.pt.backward);
    assert_true(half.pt.forward == top1.pt.forward && half.pt.backward == top1.pt.backward);
    assert_true(half.pt.ep_comm == top1.pt.ep_comm);
    assert_true(half.pt.forward < drop0.pt.forward && half.pt.backward < drop0.pt.backward);
    assert_true(wide.pt.forward == drop0.pt.forward && wide.pt.backward == drop0.pt.backward);
    assert_true(wide.pt.ep_bytes == drop0.pt.ep_bytes && wide.pt.step == drop0.pt.step);
}

/* LoRA on Mixtral-8x7B with EP 8 (this runtime): the experts' adapters
 * run one expert at a time over the rows one expert can receive, from each
 * of the 8 ranks every token of its 4096 dropless (8 x 4096), C = 512 at
 * F 0.5 (8 x 512): their x A^T (r 8, bf16) and the adapters' fp32 gradient
 * (at least the dense adapters' 4096 rows). A token keeps the A x of the
 * attention's 4 adapters (4 r a layer), none of the experts' (they run
 * through that scratch); an eager runtime keeps each routed row's too,
 * 3 top_k r more. With q and v only adapted, no expert scratch. */
static void test_mixtral_lora_expert_scratch(void **state)
{
    (void)state;
    const double factor[2] = {0, 0.5};
    const uint64_t rows[2] = {8 * 4096, 8 * 512};
    for (int i = 0; i < 2; i++) {
        moe_setup s;
        load("mixtral-8x7b.json", &s.m);
        assert_int_equal(plan_hw_find("dgx-h100", &s.hw), ZO_OK);
        plan_train_defaults(&s.t, &s.m);
        s.t.seq = 4096;
        s.t.dp = s.t.ep = 8;
        s.t.zero = 1;
        s.t.method = ZO_PLAN_LORA;
        s.t.lora.r = 8;
        s.t.lora.alpha = 16;
        s.t.lora.targets = ZO_LORA_ALL_LINEAR;
        s.t.capacity_factor = factor[i];
        if (plan_estimate_run(&s.m, &s.hw, &s.t, &s.e) != ZO_OK) fail_msg("%s", zo_last_error());
        uint64_t er = rows[i];
        assert_int_equal(item(&s.e, "LoRA expert scratch (an expert's x A^T)", PLAN_GPU), er * 8 * 2);
        assert_int_equal(item(&s.e, "LoRA backward scratch (fp32)", PLAN_GPU),
                         4 * (er > 4096 ? er : 4096) * 8);
        plan_peft p;
        plan_peft_stage(&s.m, &s.t, 0, &p);
        assert_true(p.u_width == 4 * 8);
        s.t.runtime = PLAN_RUNTIME_EAGER;
        plan_peft_stage(&s.m, &s.t, 0, &p);
        assert_true(p.u_width == 4 * 8 + 3 * 2 * 8);
        s.t.runtime = PLAN_RUNTIME_ZOFFLOAD;
        s.t.lora.targets = ZO_LORA_Q | ZO_LORA_V;
        if (plan_estimate_run(&s.m, &s.hw, &s.t, &s.e) != ZO_OK) fail_msg("%s", zo_last_error());
        assert_int_equal(item(&s.e, "LoRA expert scratch (an expert's x A^T)", PLAN_GPU), 0);
        assert_int_equal(item(&s.e, "LoRA backward scratch (fp32)", PLAN_GPU), 4 * 4096 * 8);
    }
}

/* A plan file keeps what the family adds (experts, latent attention, ...),
 * the expert parallelism and capacity factor and the schedule switches:
 * read back, the same model, bytes and step. */
static void test_plan_file_keeps_family(void **state)
{
    (void)state;
    static const char *configs[] = {"mixtral-8x7b.json", "deepseek-v2-lite.json", "gemma-2-2b.json",
                                    "falcon-7b.json", "bloom-560m.json", "opt-125m.json"};
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        moe_setup s;
        load(configs[i], &s.m);
        assert_int_equal(plan_hw_find("dgx-h100", &s.hw), ZO_OK);
        plan_train_defaults(&s.t, &s.m);
        s.t.seq = 2048;
        s.t.dp = 8;
        s.t.zero = 1;
        if (s.m.moe.experts) s.t.ep = s.m.moe.experts % 8 ? 1 : 8;
        if (s.m.moe.experts) s.t.capacity_factor = 1.25;
        s.t.dp_overlap = 0;
        s.t.fused_grad_accum = 1;
        assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &s.e), ZO_OK);
        assert_int_equal(plan_time_run(&s.m, &s.hw, &s.t, &s.e, &s.pt), ZO_OK);
        cJSON *doc;
        assert_int_equal(plan_file_json(&s.m, &s.hw, &s.t, &s.e, &s.pt, "p.json", &doc), ZO_OK);
        char *text = cJSON_Print(doc);
        cJSON_Delete(doc);
        assert_non_null(text);
        moe_setup b;
        zo_status st = plan_file_parse(text, "p.json", &b.m, &b.hw, &b.t);
        free(text);
        if (st) fail_msg("%s: %s", configs[i], zo_last_error());
        assert_int_equal(zo_model_params(&b.m), zo_model_params(&s.m));
        assert_int_equal(b.t.ep, s.t.ep);
        assert_true(b.t.capacity_factor == s.t.capacity_factor);
        assert_true(b.t.dp_overlap == 0 && b.t.fused_grad_accum == 1);
        assert_memory_equal(&b.m.moe, &s.m.moe, sizeof s.m.moe);
        assert_memory_equal(&b.m.mla, &s.m.mla, sizeof s.m.mla);
        assert_string_equal(b.m.act, s.m.act);
        assert_true(b.m.pos == s.m.pos && b.m.pos_offset == s.m.pos_offset &&
                    b.m.layer_norms == s.m.layer_norms && b.m.parallel_block == s.m.parallel_block &&
                    b.m.embed_norm == s.m.embed_norm && b.m.qk_norm == s.m.qk_norm);
        assert_int_equal(plan_estimate_run(&b.m, &b.hw, &b.t, &b.e), ZO_OK);
        assert_int_equal(plan_time_run(&b.m, &b.hw, &b.t, &b.e, &b.pt), ZO_OK);
        assert_int_equal(b.e.total[PLAN_GPU], s.e.total[PLAN_GPU]);
        assert_true(fabs(b.pt.step - s.pt.step) < 1e-9 * s.pt.step);
    }
}

static void test_moe_validation(void **state)
{
    (void)state;
    moe_setup s;
    load("mixtral-8x7b.json", &s.m);
    assert_int_equal(plan_hw_find("dgx-h100", &s.hw), ZO_OK);
    plan_train_defaults(&s.t, &s.m);
    s.t.dp = 8;
    s.t.ep = 3; /* does not divide DP 8 */
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &s.e), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "--ep 3"));
    s.t.dp = 16;
    s.hw.gpus = 16;
    s.t.ep = 16; /* more than the 8 experts */
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &s.e), ZO_ERR_INVALID);
    zo_model_config dense;
    load("llama-3-8b.json", &dense);
    plan_train_defaults(&s.t, &dense);
    s.t.dp = 8;
    s.t.ep = 8;
    s.hw.gpus = 8;
    assert_int_equal(plan_estimate_run(&dense, &s.hw, &s.t, &s.e), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "no experts"));
}

/* DeepSeek-V2: the dense first layer and the MoE layers on different
 * pipeline stages. */
static void test_deepseek_stages(void **state)
{
    (void)state;
    zo_model_config m;
    load("deepseek-v2.json", &m);
    zo_layer_params d, e;
    zo_model_layer_params(&m, 0, &d);
    zo_model_layer_params(&m, 59, &e);
    assert_int_equal(d.experts, 0);
    assert_int_equal(e.experts, 160);
    /* by hand: MLA per layer 5120 x 1536 + 1536 + 1536 x 128 x 192 + 5120 x
     * (512 + 64) + 512 + 512 x 128 x 256 + 128 x 128 x 5120 = 149,227,520 of
     * which the down projections and their norms are replicated */
    assert_int_equal(d.total, 149227520ull + 3ull * 5120 * 12288 + 2 * 5120);
    plan_train t;
    plan_train_defaults(&t, &m);
    t.pp = 4;
    uint64_t p0, p3, big;
    int layers;
    plan_stage_shape(&m, &t, 0, &p0, &big, &layers);
    plan_stage_shape(&m, &t, 3, &p3, &big, &layers);
    assert_int_equal(layers, 15);
    /* stage 0: the dense layer, 14 MoE layers and the embedding; stage 3: 15
     * MoE layers, the final norm and the output layer */
    assert_int_equal(p0, d.total + 14 * e.total + 102400ull * 5120);
    assert_int_equal(p3, 15 * e.total + 5120 + 102400ull * 5120);
}

/* DeepSeek's full routing from the published configs: V2's
 * group_limited_greedy (160 experts in 8 groups, 3 kept, top 6, scale 16,
 * not renormalized, the balance loss) and V3's sigmoid noaux_tc (256 in 8,
 * 4 kept, top 8, scale 2.5, renormalized, a score correction, no balance
 * loss whatever aux_loss_alpha says); the runtime takes both. */
static void test_deepseek_routing(void **state)
{
    (void)state;
    zo_model_config v2, v3;
    load("deepseek-v2.json", &v2);
    load("deepseek-v3.json", &v3);
    assert_true(v2.moe_group_limited && !v2.moe_sigmoid && !v2.moe.router_bias);
    assert_true(v2.moe_groups == 8 && v2.moe_topk_groups == 3 && v2.moe_routed_scale == 16.0f);
    assert_true(!v2.moe.norm_topk && v2.moe.aux_loss && v2.moe.aux_coef == 0.001f);
    assert_true(!v3.moe_group_limited && v3.moe_sigmoid && v3.moe.router_bias);
    assert_true(v3.moe_groups == 8 && v3.moe_topk_groups == 4 && v3.moe_routed_scale == 2.5f);
    assert_true(v3.moe.norm_topk && !v3.moe.aux_loss && v3.moe.aux_coef == 0.0f);
    assert_int_equal(zo_model_config_runtime_check(&v2), ZO_OK);
    assert_int_equal(zo_model_config_runtime_check(&v3), ZO_OK);
}

/* Kimi-K2's config.json from its published numbers (model_type kimi_k2,
 * DeepSeek-V3's class), `type` and `archs` in place of its own. */
static void kimi_k2_json(char *out, size_t cap, const char *type, const char *archs)
{
    snprintf(out, cap,
             "{%s\"model_type\": \"%s\", \"num_hidden_layers\": 61, \"hidden_size\": 7168, "
             "\"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"num_attention_heads\": 64, "
             "\"num_key_value_heads\": 64, \"n_routed_experts\": 384, \"n_shared_experts\": 1, "
             "\"num_experts_per_tok\": 8, \"n_group\": 1, \"topk_group\": 1, \"routed_scaling_factor\": 2.827, "
             "\"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"q_lora_rank\": 1536, \"kv_lora_rank\": 512, "
             "\"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"vocab_size\": 163840, "
             "\"max_position_embeddings\": 131072, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\", "
             "\"topk_method\": \"noaux_tc\", \"num_nextn_predict_layers\": 0, \"rope_theta\": 50000.0, "
             "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 32.0, \"original_max_position_embeddings\": 4096, "
             "\"beta_fast\": 1.0, \"beta_slow\": 1.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0}, "
             "\"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": false, \"aux_loss_alpha\": 0.001, "
             "\"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", "
             "\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}}",
             archs, type);
}

/* Kimi-K2 (model_type kimi_k2, DeepseekV3ForCausalLM) is DeepSeek-V3's
 * model: its config read under kimi_k2 (with its class and without one)
 * and under deepseek_v3 gives the same family, shape, latent attention and
 * router, the same counts (by hand: 2 x 163840 x 7168 embeddings and head,
 * 61 layers of attention q_a 7168 x 1536, q_b 1536 x 64 x 192, kv_a 7168 x
 * 576, kv_b 512 x 64 x 256, o 8192 x 7168 and their norms, one dense MLP
 * 3 x 7168 x 18432, 60 MoE layers of 384 experts and a shared one 3 x 7168
 * x 2048, a router and its correction; active less 376 experts a layer),
 * and the same memplan report (QLoRA on one H200: the adapters too); the
 * runtime takes it. */
static void test_kimi_k2_alias(void **state)
{
    (void)state;
    static const struct {
        const char *type, *archs;
    } as[] = {{"kimi_k2", "\"architectures\": [\"DeepseekV3ForCausalLM\"], "},
              {"kimi_k2", ""},
              {"deepseek_v3", "\"architectures\": [\"DeepseekV3ForCausalLM\"], "}};
    const uint64_t h = 7168, V = 163840, H = 64, E = 384, fe = 2048;
    const uint64_t attn = h * 1536 + 1536 + 1536 * H * 192 + h * 576 + 512 + 512 * H * 256 + H * 128 * h + 2 * h;
    const uint64_t moe = E * h + E + (E + 1) * 3 * h * fe;
    const uint64_t total = 2 * V * h + h + 61 * attn + 3 * h * 18432 + 60 * moe;
    const uint64_t active = total - (E - 8) * 3 * h * fe * 60;
    assert_true(total == 1026408232448ull && active == 32861500928ull); /* (the figures memplan prints: 1.03T, 32.86B) */
    zo_model_config c[3];
    char *report[3];
    for (int i = 0; i < 3; i++) {
        char json[4096], path[256], args[512];
        kimi_k2_json(json, sizeof json, as[i].type, as[i].archs);
        if (zo_model_config_parse(json, "config.json", &c[i])) fail_msg("%s: %s", as[i].type, zo_last_error());
        assert_string_equal(c[i].family, "deepseek_v3");
        zo_param_counts pc;
        zo_model_param_counts(&c[i], &pc);
        if (pc.total != total || pc.active != active)
            fail_msg("%s: total %llu active %llu, want %llu and %llu", as[i].type, (unsigned long long)pc.total,
                     (unsigned long long)pc.active, (unsigned long long)total, (unsigned long long)active);
        assert_true(c[i].mla.q_rank == 1536 && c[i].mla.kv_rank == 512 && c[i].moe.first_dense == 1);
        assert_true(c[i].moe_sigmoid && c[i].moe.router_bias && c[i].moe.norm_topk && !c[i].moe.aux_loss);
        assert_true(c[i].moe_groups == 1 && c[i].moe_topk_groups == 1 && c[i].moe_routed_scale == 2.827f);
        assert_string_equal(c[i].fp8_fmt, "e4m3");
        assert_int_equal(zo_model_config_runtime_check(&c[i]), ZO_OK);
        if (i && shape_differs(&c[0], &c[i])) fail_msg("%s: another shape than kimi_k2's", as[i].type);
        assert_true(!strcmp(c[i].rope_scaling, c[0].rope_scaling) && c[i].rope_factor == c[0].rope_factor &&
                    c[i].rope_beta_fast == c[0].rope_beta_fast && c[i].rope_mscale == c[0].rope_mscale);
        /* memplan's report of it, the model's name left out */
        scratch_path(path, sizeof path, "zo_test_kimi_%d_%d.json", (int)getpid(), i);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(json, f);
        fclose(f);
        snprintf(args, sizeof args, "estimate --model %s --gpu h200 --cpu-mem 2TB --seq 4096 --lora 16 --qlora --params cpu "
                 "--recompute full --optimizer cpu --grads cpu", path);
        cJSON *doc = run_memplan_json(args, 0);
        remove(path);
        cJSON_DeleteItemFromObject(cJSON_GetObjectItemCaseSensitive(doc, "model"), "name");
        report[i] = cJSON_PrintUnformatted(doc);
        cJSON_Delete(doc);
        if (i) assert_string_equal(report[i], report[0]);
    }
    for (int i = 0; i < 3; i++) free(report[i]);
}

/* GLM-4.5-Air (zai-org/GLM-4.5-Air's config.json, its published numbers:
 * 106B total, 12B active): 46 layers, the first dense, 128 experts of 1408
 * (top 8) and one shared, q/k/v biased, half of each head rotated. The
 * count is by hand below, term by term (not memplan's formula): the
 * correction buffers counted as the checkpoint holds them (V3's kind), the
 * multi-token prediction layer not. Then GLM's defaults, the runtime's
 * check, and refusals by name. */
#define GLM45_AIR                                                                                          \
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"model_type\": \"glm4_moe\", \"hidden_size\": 4096, "   \
    "\"num_hidden_layers\": 46, \"num_attention_heads\": 96, \"num_key_value_heads\": 8, \"head_dim\": 128, " \
    "\"intermediate_size\": 10944, \"moe_intermediate_size\": 1408, \"n_routed_experts\": 128, "            \
    "\"n_shared_experts\": 1, \"num_experts_per_tok\": 8, \"first_k_dense_replace\": 1, "                  \
    "\"vocab_size\": 151552, \"partial_rotary_factor\": 0.5, \"attention_bias\": true, \"n_group\": 1, "     \
    "\"topk_group\": 1, \"routed_scaling_factor\": 1.0, \"norm_topk_prob\": true, "                        \
    "\"num_nextn_predict_layers\": 1, \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05, "      \
    "\"rope_theta\": 1000000, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false, "                  \
    "\"use_qk_norm\": false, \"torch_dtype\": \"bfloat16\"}"

static void test_glm4_moe(void **state)
{
    (void)state;
    zo_model_config c;
    if (zo_model_config_parse(GLM45_AIR, "glm-4.5-air.json", &c)) fail_msg("%s", zo_last_error());
    const uint64_t h = 4096, V = 151552, q = 96 * 128, kv = 8 * 128, E = 128, fe = 1408;
    uint64_t attn = h * q + q + 2 * (h * kv + kv) + q * h; /* q, k, v with biases; o without */
    uint64_t norms = 2 * h;
    uint64_t dense = attn + norms + 3 * h * 10944;
    uint64_t expert = 3 * h * fe;
    uint64_t moe = attn + norms + E * h /* router */ + E /* correction */ + E * expert + expert /* shared */;
    uint64_t total = V * h + dense + 45 * moe + h + V * h;
    uint64_t active = total - 45 * (E - 8) * expert;
    zo_param_counts pc;
    zo_model_param_counts(&c, &pc);
    if (pc.total != total || pc.active != active)
        fail_msg("GLM-4.5-Air: total %llu (want %llu), active %llu (want %llu)", (unsigned long long)pc.total,
                 (unsigned long long)total, (unsigned long long)pc.active, (unsigned long long)active);
    /* the published 106B and 12B (active less the input embedding: 12.8B) */
    assert_true(total > 106000000000ull && total < 107000000000ull);
    assert_true(active - V * h > 12000000000ull && active - V * h < 13000000000ull);
    assert_int_equal(zo_model_router_bias_params(&c), 45 * E);
    assert_true(c.attn_bias && !c.out_bias && !c.qk_norm && c.rope_partial == 0.5 && zo_model_rope_dim(&c) == 64);
    assert_true(c.moe_sigmoid && c.moe.router_bias && c.moe.norm_topk && !c.moe.aux_loss && !c.moe_group_limited);
    assert_true(c.moe_groups == 1 && c.moe_topk_groups == 1 && c.moe_routed_scale == 0.0f);
    assert_true(c.moe.first_dense == 1 && c.moe.shared_ffn == 1408 && !c.moe.shared_gate);
    assert_string_equal(zo_moe_shared_name(&c), "shared_experts");
    assert_int_equal(zo_model_config_runtime_check(&c), ZO_OK);

    /* Glm4MoeConfig's defaults: GLM-4.5-Air's router and attention, eps 1e-5,
     * 131072 positions; GLM-4.5's scale and q/k norms read */
    zo_model_config d;
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"glm4_moe\", " SHAPE_ONLY "}", "d.json", &d), ZO_OK);
    assert_true(d.moe.experts == 128 && d.moe.top_k == 8 && d.moe.expert_ffn == 1408 && d.moe.shared_ffn == 1408);
    assert_true(d.moe.first_dense == 1 && d.moe.norm_topk && d.moe_groups == 1 && d.n_kv_heads == 8);
    assert_true(d.norm_eps == 1e-5f && d.max_seq == 131072 && !d.attn_bias && !d.qk_norm && d.rope_partial == 0.5);
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"glm4_moe\", " SHAPE_ONLY ", \"use_qk_norm\": true, "
                                           "\"routed_scaling_factor\": 2.5, \"n_group\": 4, \"topk_group\": 2}",
                                           "g.json", &d),
                     ZO_OK);
    assert_true(d.qk_norm && !d.qk_norm_heads && d.moe_routed_scale == 2.5f && d.moe_groups == 4);
    /* with q/k norms: one head_dim weight each on every layer */
    zo_param_counts qk;
    zo_model_param_counts(&d, &qk);
    d.qk_norm = 0;
    assert_int_equal(qk.total - zo_model_params(&d), 2 * 2 * 16);

    /* refused by name: the rotary size (of head_dim 16) odd (3), under 2 (1)
     * or out of (0, 1]; the router's fields */
    static const char *const refused[][2] = {
        {"\"partial_rotary_factor\": 0.1875", "partial_rotary_factor"},
        {"\"partial_rotary_factor\": 0.0625", "partial_rotary_factor"},
        {"\"partial_rotary_factor\": 0", "partial_rotary_factor"},
        {"\"partial_rotary_factor\": 1.5", "partial_rotary_factor"},
        {"\"n_group\": 3", "n_group"},
        {"\"n_group\": 128", "n_group"},
        {"\"n_group\": 8, \"topk_group\": 9", "topk_group"},
        {"\"n_group\": 64, \"topk_group\": 3", "num_experts_per_tok"},
        {"\"routed_scaling_factor\": 0", "routed_scaling_factor"},
        {"\"n_routed_experts\": 4", "num_experts_per_tok"},
        /* transformers' older key for the experts: not what the class reads now */
        {"\"num_experts\": 64", "num_experts"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "{\"model_type\": \"glm4_moe\", " SHAPE_ONLY ", %s}", refused[i][0]);
        expect_named(json, refused[i][1]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_family_counts),   cmocka_unit_test(test_family_defaults),
        cmocka_unit_test(test_qwen3_presets),
        cmocka_unit_test(test_olmo2_config),
        cmocka_unit_test(test_olmo3_config),
        cmocka_unit_test(test_olmoe_config),
        cmocka_unit_test(test_gpt_oss_config),
        cmocka_unit_test(test_rope_parameters),
        cmocka_unit_test(test_seed_oss_config),
        cmocka_unit_test(test_ernie4_5_config),
        cmocka_unit_test(test_phimoe_config),
        cmocka_unit_test(test_phi_presets),
        cmocka_unit_test(test_gptj_presets),
        cmocka_unit_test(test_attention_extent),
        cmocka_unit_test(test_refused),         cmocka_unit_test(test_cli_refused),
        cmocka_unit_test(test_nonsense_refused),
        cmocka_unit_test(test_mixtral_ep8_bytes), cmocka_unit_test(test_mixtral_ep_time),
        cmocka_unit_test(test_mixtral_capacity_time),
        cmocka_unit_test(test_mixtral_lora_expert_scratch),
        cmocka_unit_test(test_moe_validation),  cmocka_unit_test(test_deepseek_stages),
        cmocka_unit_test(test_deepseek_routing), cmocka_unit_test(test_kimi_k2_alias),
        cmocka_unit_test(test_glm4_moe),
        cmocka_unit_test(test_plan_file_keeps_family), cmocka_unit_test(test_cli_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
