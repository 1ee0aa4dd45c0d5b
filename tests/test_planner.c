/* Tests for planner/: parameter counts, the memory model against published
 * figures (ZeRO paper Figure 1 and Table 1; Korthikanti et al. 2022), placement,
 * the JSON report, and memplan's handling of bad input. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "common/model_config.h"
#include "common/plan_schema.h" /* defines: zo_plan_load */
#include "planner/cost.h"
#include "planner/hardware.h"
#include "planner/memory.h"
#include "gpu/cuda/attention_gemm.h" /* defines: cuda_attn_scratch_bytes (the runtime's count) */
#include "planner/report.h"
#include "planner/search.h"
#include "tests/support/files.h" /* defines: files_write_text, files_remove_tree */
#include "tests/support/run.h"   /* defines: run_memplan */

/* ---- parameter counts ------------------------------------------------------ */
#include "tests/support/scratch.h" /* defines: scratch_path */

static const struct { const char *preset, *config; uint64_t params; } counts[] = {
    {"gpt2", "gpt2.json", 124439808ull},
    {"gpt2-xl", "gpt2-xl.json", 1557611200ull},
    {"llama-2-7b", "llama-2-7b.json", 6738415616ull},
    {"llama-2-13b", "llama-2-13b.json", 13015864320ull},
    {"llama-2-70b", "llama-2-70b.json", 68976648192ull},
    {"llama-3-8b", "llama-3-8b.json", 8030261248ull},
    {"mistral-7b", "mistral-7b.json", 7241732096ull},
    /* keras-hub qwen3_0.6b_en, qwen3_8b_en, qwen3_moe_30b_a3b_en */
    {"qwen3-0.6b", "qwen3-0.6b.json", 596049920ull},
    {"qwen3-8b", "qwen3-8b.json", 8190735360ull},
    {"qwen3-30b-a3b", "qwen3-30b-a3b.json", 30532122624ull},
    /* keras-hub gemma_2b_en, gemma_7b_en */
    {"gemma-2b", "gemma-2b.json", 2506172416ull},
    {"gemma-7b", "gemma-7b.json", 8537680896ull},
    /* the Pythia model cards' totals; GPT-NeoX-20B's paper */
    {"pythia-160m", "pythia-160m.json", 162322944ull},
    {"pythia-6.9b", "pythia-6.9b.json", 6857302016ull},
    {"gpt-neox-20b", "gpt-neox-20b.json", 20554567680ull},
    /* Falcon: keras-hub's and the model cards' totals (test_planner_families) */
    {"falcon-7b", "falcon-7b.json", 6921720704ull},
    {"falcon-40b", "falcon-40b.json", 41303293952ull},
    /* Falcon-RW-1B: 24 x 50358272 + the token table and the final norm, from
     * the shapes (test_planner_families: keras-hub's falcon_refinedweb_1b_en) */
    {"falcon-rw-1b", "falcon-rw-1b.json", 1311625216ull},
    /* OPT: the OPT paper's sizes, counted from the shapes (12 x 7087872 + the token and
     * position tables and the final norm for 125m, 24 x 50358272 + ... for 1.3b) */
    {"opt-125m", "opt-125m.json", 125239296ull},
    {"opt-1.3b", "opt-1.3b.json", 1315758080ull},
    /* Phi-2: 2.78B with its bias vectors, the output layer's included
     * (test_planner_families) */
    {"phi-2", "phi-2.json", 2779683840ull},
    /* GPT-J-6B: its biased MLP and output layer, no attention biases
     * (test_planner_families) */
    {"gpt-j-6b", "gpt-j-6b.json", 6050882784ull},
    /* BLOOM: the model cards' totals (test_planner_families) */
    {"bloom-560m", "bloom-560m.json", 559214592ull},
    {"bloom-7b1", "bloom-7b1.json", 7069016064ull},
    {"bloom", "bloom-176b.json", 176247271424ull},
    /* keras-hub gemma2_2b_en, gemma2_9b_en; 27b from its shape (46 x 566249472 + the
     * embedding and the final norm) */
    {"gemma-2-2b", "gemma-2-2b.json", 2614341888ull},
    {"gemma-2-9b", "gemma-2-9b.json", 9241705984ull},
    {"gemma-2-27b", "gemma-2-27b.json", 27227128320ull},
    /* google/gemma-3-1b-pt's count (26 x 26842112 + the embedding and the final norm) */
    {"gemma-3-1b", "gemma-3-1b.json", 999885952ull},
    /* ibm-granite/granite-3.1-2b-base and -8b-base, summed from the shapes in Python
     * (tied: 49155 x h + 40 layers + the final norm; 2.53B and 8.17B as published) */
    {"granite-3.1-2b", "granite-3.1-2b.json", 2533531648ull},
    {"granite-3.1-8b", "granite-3.1-8b.json", 8170848256ull},
    /* ibm-granite/granite-3.0-1b-a400m-base and -3b-a800m-base, summed from the shapes in
     * Python: tied 49155 x h + L layers of q [h, h], k and v [8 x 64, h], o [h, h], the router
     * [E, h], input_linear [E, 1024, h], output_linear [E, h, 512] and two norms + the final
     * norm (E 32, L 24, h 1024; E 40, L 32, h 1536); 1.33B and 3.3B as published */
    {"granite-3.0-1b-a400m", "granite-3.0-1b-a400m.json", 1334628352ull},
    {"granite-3.0-3b-a800m", "granite-3.0-3b-a800m.json", 3298793472ull},
    /* CohereForAI/c4ai-command-r-v01 and aya-23-8b, summed from the shapes in Python
     * (tied: 256000 x h + layers of q, k, v, o, gate, up, down and one norm without a
     * bias + the final norm; 35.0B and 8.03B as published) */
    {"c4ai-command-r-v01", "c4ai-command-r-v01.json", 34980831232ull},
    {"aya-23-8b", "aya-23-8b.json", 8028033024ull},
    /* CohereForAI/c4ai-command-r7b-12-2024, summed from the shapes in Python as aya-23-8b's
     * (the same shapes; its windows and rotary-free global layers change no size; 8.03B as
     * published) */
    {"c4ai-command-r7b-12-2024", "c4ai-command-r7b-12-2024.json", 8028033024ull},
};

static void test_param_counts(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        zo_model_config p, c;
        assert_int_equal(zo_model_preset_find(counts[i].preset, &p), ZO_OK);
        char path[512];
        snprintf(path, sizeof path, "%s/hf-configs/%s", ZO_FIXTURES_DIR, counts[i].config);
        assert_int_equal(zo_model_config_load(path, &c), ZO_OK);
        if (zo_model_params(&p) != counts[i].params || zo_model_params(&c) != counts[i].params)
            print_error("%s: preset %llu, config %llu, want %llu\n", counts[i].preset,
                        (unsigned long long)zo_model_params(&p),
                        (unsigned long long)zo_model_params(&c),
                        (unsigned long long)counts[i].params);
        assert_true(zo_model_params(&p) == counts[i].params);
        assert_true(zo_model_params(&c) == counts[i].params);
        if (!zo_model_qkv_grouped(&p)) continue;
        /* GPT-NeoX's and Falcon's presets: what changes no size too, as the config says it */
        assert_int_equal(p.layer_norms, c.layer_norms);
        assert_int_equal(p.n_kv_heads, c.n_kv_heads);
        assert_string_equal(p.family, c.family);
        assert_string_equal(p.act, c.act);
        assert_int_equal(zo_model_rope_dim(&p), zo_model_rope_dim(&c));
        assert_int_equal(p.parallel_block, c.parallel_block);
        assert_int_equal(p.pos, c.pos);
        assert_int_equal(p.tied_embeddings, c.tied_embeddings);
    }
    /* Pythia's other sizes (no config here): the model cards' totals */
    static const struct { const char *preset; uint64_t params; } pythia[] = {
        {"pythia-1.4b", 1414647808ull}, {"pythia-12b", 11846072320ull}};
    for (size_t i = 0; i < sizeof pythia / sizeof pythia[0]; i++) {
        zo_model_config p;
        assert_int_equal(zo_model_preset_find(pythia[i].preset, &p), ZO_OK);
        assert_true(zo_model_params(&p) == pythia[i].params);
    }
}

static void test_all_presets_valid(void **state)
{
    (void)state;
    size_t n;
    const zo_model_preset *p = zo_model_presets(&n);
    assert_true(n >= 22);
    for (size_t i = 0; i < n; i++) {
        zo_model_config c = p[i].cfg;
        assert_int_equal(zo_model_config_validate(&c), ZO_OK);
        /* Qwen3's head_dim is its config's 128, not hidden / heads (0.6B: 1024 / 16);
         * Gemma's 256 (gemma-7b: 3072 / 16 = 192); Gemma-2's 256 (2b: 2304 / 8 = 288), 27b's
         * 128 (4608 / 32 = 144, its query_pre_attn_scalar) */
        int given = c.qk_norm ? 128 : !strcmp(c.family, "gemma") ? 256 : 0;
        /* Gemma-2 and Gemma-3: 256, the 27b models' 128 (query_pre_attn_scalar 144 and 168) */
        if (!strcmp(c.family, "gemma2") || !strcmp(c.family, "gemma3_text"))
            given = c.query_pre_attn_scalar == 256.0f ? 256 : 128;
        assert_int_equal(given ? given : c.hidden, given ? c.head_dim : c.n_heads * c.head_dim);
    }
    /* the GPT-3 sizes land near their names */
    zo_model_config c;
    assert_int_equal(zo_model_preset_find("gpt3-175b", &c), ZO_OK);
    assert_true(fabs((double)zo_model_params(&c) / 175e9 - 1) < 0.01);
    assert_int_equal(zo_model_preset_find("megatron-1t", &c), ZO_OK);
    assert_true(fabs((double)zo_model_params(&c) / 1.008e12 - 1) < 0.01);
}

static void test_preset_lookup_error(void **state)
{
    (void)state;
    zo_model_config c;
    assert_int_equal(zo_model_preset_find("Llama_2_13B", &c), ZO_OK);
    assert_int_equal(zo_model_preset_find("llama-2-14b", &c), ZO_ERR_NOT_FOUND);
    assert_non_null(strstr(zo_last_error(), "llama-2-13b"));
    plan_hw hw;
    assert_int_equal(plan_hw_find("H100", &hw), ZO_OK);
    assert_int_equal(plan_hw_find("h10", &hw), ZO_ERR_NOT_FOUND);
    assert_non_null(strstr(zo_last_error(), "h100-80gb"));
}

/* ---- names: every preset name and alias answers to one preset ---------------- */

/* A table's names: each entry's name and aliases (comma-separated). */
typedef struct named {
    const char *table; /* "model", "machine", "GPU", "host" */
    const char *owner; /* the preset's name */
    char key[96];      /* zo_preset_key of the name */
    const char *name;  /* as written */
} named;

static size_t add_names(named *out, size_t at, const char *table, const char *name,
                        const char *aliases)
{
    out[at] = (named){table, name, "", name};
    zo_preset_key(name, out[at].key, sizeof out[at].key);
    at++;
    /* (aliases are kept as written: each key from its own span) */
    for (const char *a = aliases; a && *a;) {
        const char *end = strchr(a, ',');
        size_t len = end ? (size_t)(end - a) : strlen(a);
        char one[96];
        snprintf(one, sizeof one, "%.*s", (int)len, a);
        out[at] = (named){table, name, "", name};
        zo_preset_key(one, out[at].key, sizeof out[at].key);
        out[at].name = strstr(aliases, one); /* for the message: points into the list */
        at++;
        a = end ? end + 1 : a + len;
    }
    return at;
}

/* Issue 33: `--model gpt3-13b` answered GPT-3 XL (1.3B) because the dot was
 * dropped from "gpt3-1.3b". Every pair of names and aliases, within the
 * models and within each hardware table, normalizes apart; each name finds its
 * own preset. Across the machines and the GPUs (both answer to --hw) the only
 * shared names are the SXM GPUs', and each is the machine preset's own GPU
 * (--hw takes the machine, --gpu the card). */
static void test_preset_names_unique(void **state)
{
    (void)state;
    static named all[512];
    size_t n = 0, nm, nh, ng, nt;
    const zo_model_preset *mp = zo_model_presets(&nm);
    for (size_t i = 0; i < nm; i++) n = add_names(all, n, "model", mp[i].name, mp[i].aliases);
    const plan_hw_preset *hp = plan_hw_presets(&nh);
    for (size_t i = 0; i < nh; i++) n = add_names(all, n, "machine", hp[i].name, hp[i].aliases);
    const plan_gpu_spec *gp = plan_gpu_presets(&ng);
    for (size_t i = 0; i < ng; i++) n = add_names(all, n, "GPU", gp[i].name, gp[i].aliases);
    const plan_host_spec *tp = plan_host_presets(&nt);
    for (size_t i = 0; i < nt; i++) n = add_names(all, n, "host", tp[i].name, "");
    assert_true(n < sizeof all / sizeof all[0]);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(all[i].key[0] != '\0');
        for (size_t j = i + 1; j < n; j++) {
            if (strcmp(all[i].key, all[j].key)) continue;
            int same_table = !strcmp(all[i].table, all[j].table);
            if (same_table && !strcmp(all[i].owner, all[j].owner)) {
                print_error("%s %s: two of its names are one key '%s'\n", all[i].table, all[i].owner,
                            all[i].key);
                bad++;
                continue;
            }
            if (same_table) {
                print_error("%s presets %s and %s share the key '%s'\n", all[i].table, all[i].owner,
                            all[j].owner, all[i].key);
                bad++;
                continue;
            }
            /* machine x GPU: allowed only for the machine's own GPU */
            int mg = !strcmp(all[i].table, "machine") && !strcmp(all[j].table, "GPU");
            if (!mg) continue; /* models and hosts are other flags */
            plan_hw mach, card;
            assert_int_equal(plan_hw_find(all[i].owner, &mach), ZO_OK);
            const plan_gpu_spec *g;
            assert_int_equal(plan_gpu_find(all[j].owner, &g), ZO_OK);
            plan_hw_gpu_node(g, NULL, &card);
            if (strcmp(mach.gpu, card.gpu) || mach.gpu_mem != card.gpu_mem ||
                mach.peak_flops_16 != card.peak_flops_16) {
                print_error("machine %s and GPU %s share the key '%s' but not the GPU\n",
                            all[i].owner, all[j].owner, all[i].key);
                bad++;
            }
        }
    }
    assert_int_equal(bad, 0);
    /* each model name and alias finds its own preset */
    for (size_t i = 0; i < n; i++) {
        if (strcmp(all[i].table, "model")) continue;
        zo_model_config c;
        char name[96];
        snprintf(name, sizeof name, "%s", all[i].key);
        assert_int_equal(zo_model_preset_find(name, &c), ZO_OK);
        assert_string_equal(c.name, all[i].owner);
    }
    /* the names of issue 33 */
    zo_model_config c;
    assert_int_equal(zo_model_preset_find("gpt3-13b", &c), ZO_OK);
    assert_string_equal(c.name, "gpt3-13b");
    assert_int_equal(zo_model_preset_find("gpt3-1.3b", &c), ZO_OK);
    assert_string_equal(c.name, "gpt3-xl");
    assert_int_equal(zo_model_preset_find("GPT3_13B", &c), ZO_OK);
    assert_string_equal(c.name, "gpt3-13b");
    /* a separator between digits parts them: no preset is "gpt3 1 3b" */
    assert_int_equal(zo_model_preset_find("gpt3-1-3b", &c), ZO_ERR_NOT_FOUND);
    char key[32];
    zo_preset_key("Llama_2--13B", key, sizeof key);
    assert_string_equal(key, "llama2-13b");
}

static void test_config_errors(void **state)
{
    (void)state;
    zo_model_config c;
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"llama\",\n \"hidden_size\": 64,\n oops}",
                                           "bad.json", &c),
                     ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "bad.json:3:"));
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, "
                                           "\"n_head\": 4, \"vocab_size\": 100}",
                                           "x/config.json", &c),
                     ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "n_positions"));
    assert_non_null(strstr(zo_last_error(), "x/config.json"));
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"llama\", \"num_hidden_layers\": 2, "
                                           "\"hidden_size\": \"64\", \"num_attention_heads\": 4, "
                                           "\"intermediate_size\": 128, \"vocab_size\": 100}",
                                           "c.json", &c),
                     ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "hidden_size"));
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"bert\"}", "c.json", &c),
                     ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "bert"));
    /* qwen2: q/k/v biases; a config with the LLaMA fields and an unknown type */
    const char *qwen = "{\"model_type\": \"qwen2\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
                       "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                       "\"intermediate_size\": 128, \"vocab_size\": 100, \"tie_word_embeddings\": true}";
    assert_int_equal(zo_model_config_parse(qwen, "q.json", &c), ZO_OK);
    /* embed 6400 + layers 2*(2*64 + 64*(64+32+32) + (64+32+32) + 64*64 + 3*64*128) + norm 64 */
    assert_int_equal(zo_model_params(&c), 6400 + 2 * (128 + 8192 + 128 + 4096 + 24576) + 64);
    /* a family that is not modelled is refused by name, never parsed as the
     * nearest one (LLaMA's fields are not LLaMA's layers); its Hugging Face
     * class, when it is one we model, names the family instead */
    const char *other = "{\"model_type\": \"yi\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
                        "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 100}";
    assert_int_equal(zo_model_config_parse(other, "y.json", &c), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "\"model_type\""));
    assert_non_null(strstr(zo_last_error(), "yi"));
    const char *by_class = "{\"model_type\": \"yi\", \"architectures\": [\"LlamaForCausalLM\"], "
                           "\"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 4, "
                           "\"intermediate_size\": 128, \"vocab_size\": 100}";
    assert_int_equal(zo_model_config_parse(by_class, "y.json", &c), ZO_OK);
    assert_int_equal(c.arch, ZO_ARCH_LLAMA);
    const char *obias = "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
                        "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 100, "
                        "\"attention_bias\": true}";
    assert_int_equal(zo_model_config_parse(obias, "b.json", &c), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "attention_bias"));
    assert_int_equal(zo_model_config_load("/nonexistent/config.json", &c), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "/nonexistent/config.json"));
}

/* ---- model states: the ZeRO paper ------------------------------------------------ */

static double model_states_gb(double params, int dp, int zero)
{
    zo_model_config m = {.name = "size-only", .params_override = (uint64_t)params, .max_seq = 2048};
    plan_hw hw;
    assert_int_equal(plan_hw_find("dgx-a100-80gb", &hw), ZO_OK);
    hw.gpus = dp;
    plan_train t;
    plan_train_defaults(&t, &m);
    t.dtype = t.grad_dtype = ZO_DTYPE_F16;
    t.runtime = PLAN_RUNTIME_EAGER; /* DeepSpeed's: fp16 gradients (this runtime sums in fp32) */
    t.dp = dp;
    t.zero = zero;
    plan_estimate e;
    assert_int_equal(plan_estimate_run(&m, &hw, &t, &e), ZO_OK);
    assert_false(e.activations_known);
    return (double)(e.bytes[PLAN_GPU][PLAN_PARAMS] + e.bytes[PLAN_GPU][PLAN_GRADS] +
                    e.bytes[PLAN_GPU][PLAN_OPTIMIZER]) / 1e9;
}

/* The published figure is rounded or truncated to its printed digits. */
static void assert_published(double got, double published, double unit, const char *what)
{
    if (fabs(got - published) > unit + 1e-9) {
        print_error("%s: got %.4f GB, published %.4g GB\n", what, got, published);
        fail();
    }
}

static void test_zero_figure1(void **state)
{
    (void)state;
    assert_published(model_states_gb(7.5e9, 64, 0), 120, 0.05, "baseline");
    assert_published(model_states_gb(7.5e9, 64, 1), 31.4, 0.05, "Pos");
    assert_published(model_states_gb(7.5e9, 64, 2), 16.6, 0.05, "Pos+g");
    assert_published(model_states_gb(7.5e9, 64, 3), 1.88, 0.005, "Pos+g+p");
}

static void test_zero_table1(void **state)
{
    (void)state;
    static const int dps[] = {1, 4, 16, 64, 256, 1024};
    /* rows: model size; columns: DP; for stages 1, 2, 3 (GB), with the unit of
     * the last printed digit */
    static const struct { double psi; double gb[3][6]; double unit[3][6]; } rows[] = {
        {7.5e9,
         {{120, 52.5, 35.6, 31.4, 30.4, 30.1}, {120, 41.3, 21.6, 16.6, 15.4, 15.1},
          {120, 30, 7.5, 1.88, 0.47, 0.12}},
         {{1, .1, .1, .1, .1, .1}, {1, .1, .1, .1, .1, .1}, {1, 1, .1, .01, .01, .01}}},
        {128e9,
         {{2048, 896, 608, 536, 518, 513}, {2048, 704, 368, 284, 263, 257},
          {2048, 512, 128, 32, 8, 2}},
         {{1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}}},
        {1e12,
         {{16000, 7000, 4750, 4187, 4046, 4011}, {16000, 5500, 2875, 2218, 2054, 2013},
          {16000, 4000, 1000, 250, 62.5, 15.6}},
         {{1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, .1, .1}}},
    };
    for (size_t r = 0; r < 3; r++)
        for (int stage = 1; stage <= 3; stage++)
            for (int d = 0; d < 6; d++) {
                char what[64];
                snprintf(what, sizeof what, "psi %.3g DP %d stage %d", rows[r].psi, dps[d], stage);
                assert_published(model_states_gb(rows[r].psi, dps[d], stage),
                                 rows[r].gb[stage - 1][d], rows[r].unit[stage - 1][d], what);
            }
}

static void test_mixed_precision_bytes(void **state)
{
    (void)state;
    /* Megatron: fp16 weights, fp32 gradients, AdamW = 18 bytes/param */
    zo_model_config m = {.name = "x", .params_override = 1000000, .max_seq = 2048};
    plan_hw hw;
    assert_int_equal(plan_hw_find("h100", &hw), ZO_OK);
    plan_train t;
    plan_train_defaults(&t, &m);
    t.grad_dtype = ZO_DTYPE_F32;
    plan_estimate e;
    assert_int_equal(plan_estimate_run(&m, &hw, &t, &e), ZO_OK);
    assert_int_equal(e.bytes[PLAN_GPU][PLAN_PARAMS] + e.bytes[PLAN_GPU][PLAN_GRADS] +
                         e.bytes[PLAN_GPU][PLAN_OPTIMIZER],
                     18 * 1000000ull);
    /* pure fp32: the runtime's optimizer keeps its own fp32 master copy
     * (the weights stream from their store): 4 + 4 + 12 (test_offload's
     * test_memplan_agrees measures it) */
    t.dtype = t.grad_dtype = ZO_DTYPE_F32;
    assert_int_equal(plan_estimate_run(&m, &hw, &t, &e), ZO_OK);
    assert_int_equal(e.bytes[PLAN_GPU][PLAN_OPTIMIZER], 12 * 1000000ull);
    /* SGD with momentum, mixed precision: master + momentum */
    t.dtype = t.grad_dtype = ZO_DTYPE_BF16;
    t.optimizer = PLAN_OPT_SGD;
    assert_int_equal(plan_estimate_run(&m, &hw, &t, &e), ZO_OK);
    assert_int_equal(e.bytes[PLAN_GPU][PLAN_OPTIMIZER], 8 * 1000000ull);
}

/* ---- activations: Korthikanti et al. 2022 ---------------------------------------- */

typedef struct setup {
    zo_model_config m;
    plan_hw hw;
    plan_train t;
} setup;

static void gpt_setup(setup *s, const char *preset, int tp, int sp, plan_recompute rc)
{
    assert_int_equal(zo_model_preset_find(preset, &s->m), ZO_OK);
    assert_int_equal(plan_hw_find("dgx-a100-80gb", &s->hw), ZO_OK);
    plan_train_defaults(&s->t, &s->m);
    s->t.dtype = s->t.grad_dtype = ZO_DTYPE_F16;
    s->t.flash_attn = 0; /* the paper's attention keeps the s^2 terms */
    s->t.seq = 2048;
    s->t.micro_batch = 1;
    s->t.tp = tp;
    s->t.sp = sp;
    s->t.dp = 8 / tp;
    s->hw.gpus = 8;
    s->t.recompute = rc;
}

static uint64_t item_bytes(const plan_estimate *e, const char *name, plan_tier tier)
{
    uint64_t sum = 0;
    for (int i = 0; i < e->n_items; i++)
        if (!strcmp(e->items[i].name, name) && e->items[i].tier == tier) sum += e->items[i].bytes;
    return sum;
}

/* ---- partial recompute (issue 33) ------------------------------------------------- */

/* LLaMA-2-13B on one H100, 4096 tokens: recompute full of K of its 40 layers
 * keeps K layer inputs and 40 - K whole layers, and recomputes K/40 of what
 * full recompute does; recompute ops keeps each layer's input, the fused
 * qkv, the attention's output and log-sum-exp and the gate's output (the
 * runtime's 1st and 3rd matmuls; the 5th, down, has an output no backward
 * reads), between none and full in memory and in time. */
/* A preset model on a preset machine with the model's defaults. */
static void preset_on(const char *model, const char *hw_name, zo_model_config *m, plan_hw *hw,
                      plan_train *t)
{
    assert_int_equal(zo_model_preset_find(model, m), ZO_OK);
    assert_int_equal(plan_hw_find(hw_name, hw), ZO_OK);
    plan_train_defaults(t, m);
}

static void test_partial_recompute(void **state)
{
    (void)state;
    zo_model_config m;
    plan_hw hw;
    plan_train t;
    preset_on("llama-2-13b", "h100-80gb", &m, &hw, &t);
    t.seq = 4096;
    plan_estimate e[4];
    plan_time pt[4];
    const int K = 10;
    for (int i = 0; i < 4; i++) {
        t.recompute = i == 0 ? PLAN_RECOMPUTE_NONE : i == 3 ? ZO_PLAN_RECOMPUTE_OPS : PLAN_RECOMPUTE_FULL;
        t.recompute_layers = i == 2 ? K : 0;
        assert_int_equal(plan_estimate_run(&m, &hw, &t, &e[i]), ZO_OK);
        assert_int_equal(plan_time_run(&m, &hw, &t, &e[i], &pt[i]), ZO_OK);
    }
    double sbh2 = 4096.0 * 5120 * 2;  /* a layer's input, bf16 */
    double whole = (double)e[0].act_layer;
    assert_true(e[1].act_layer == (uint64_t)sbh2);
    assert_true(e[2].act_layer_full == e[0].act_layer);
    double got = (double)item_bytes(&e[2], "stored layer activations", PLAN_GPU);
    assert_true(fabs(got - (K * sbh2 + (40 - K) * whole)) < 1);
    /* the recompute working set is one whole layer, as for full */
    assert_true(item_bytes(&e[2], "recompute working set (1 layer)", PLAN_GPU) == e[0].act_layer);
    /* time: K/40 of full recompute's */
    assert_true(pt[0].recompute == 0);
    assert_true(fabs(pt[2].recompute / pt[1].recompute - (double)K / 40) < 1e-12);
    assert_true(pt[0].step < pt[2].step && pt[2].step < pt[1].step);
    assert_true(fabs((pt[2].hw_flops - pt[2].model_flops) / (pt[1].hw_flops - pt[1].model_flops) -
                     (double)K / 40) < 1e-9);
    /* ops: by hand, per token h + q + k + v + o + gate (bf16), 40 heads' fp32
     * log-sum-exp */
    double ops = 4096.0 * (2 * (5120 + 5120 + 5120 + 5120 + 5120 + 13824) + 4 * 40);
    /* the working set: one layer's activations less what it kept (its input stays) */
    assert_true(item_bytes(&e[3], "recompute working set (1 layer's recomputed ops)", PLAN_GPU) ==
                e[0].act_layer - (e[3].act_layer - (uint64_t)sbh2));
    assert_true(fabs((double)e[3].act_layer - ops) < 1);
    assert_true(e[1].act_layer < e[3].act_layer && e[3].act_layer < e[0].act_layer);
    assert_true(pt[0].step < pt[3].step && pt[3].step < pt[1].step);
    assert_true(pt[3].recompute > 0 && pt[3].recompute < pt[1].recompute);
    /* what the runtime refuses, memplan refuses where it cannot model it */
    t.recompute = PLAN_RECOMPUTE_NONE;
    t.recompute_layers = 3;
    assert_int_equal(plan_estimate_run(&m, &hw, &t, &e[0]), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "--recompute-layers 3 needs --recompute full"));
    t.recompute = PLAN_RECOMPUTE_FULL;
    t.recompute_layers = 41;
    assert_int_equal(plan_estimate_run(&m, &hw, &t, &e[0]), ZO_ERR_INVALID);
    t.recompute_layers = 0;
    t.recompute = ZO_PLAN_RECOMPUTE_OPS;
    t.flash_attn = 0;
    assert_int_equal(plan_estimate_run(&m, &hw, &t, &e[0]), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "--recompute ops"));
    /* LoRA r 16 on the 7 linear layers: without recompute each layer keeps
     * its adapters' x A [s, 16] too; by op the layers keep the ops bytes
     * alone (the runtime rebuilds x A), the one layer's rebuilt set holds it,
     * and the re-forward's adapter GEMMs add to full fine-tuning's recompute */
    t.flash_attn = 1;
    t.method = PLAN_METHOD_LORA;
    t.lora = (zo_lora_config){.r = 16, .alpha = 32, .targets = ZO_LORA_ALL_LINEAR};
    plan_estimate le[2];
    plan_time lt[2];
    for (int i = 0; i < 2; i++) {
        t.recompute = i ? ZO_PLAN_RECOMPUTE_OPS : PLAN_RECOMPUTE_NONE;
        assert_int_equal(plan_estimate_run(&m, &hw, &t, &le[i]), ZO_OK);
        assert_int_equal(plan_time_run(&m, &hw, &t, &le[i], &lt[i]), ZO_OK);
    }
    uint64_t u = 4096ull * 7 * 16 * 2;
    assert_true(le[0].act_layer == e[0].act_layer + u);
    assert_true(le[1].act_layer == e[3].act_layer);
    assert_true(item_bytes(&le[1], "recompute working set (1 layer's recomputed ops)", PLAN_GPU) ==
                le[0].act_layer - (le[1].act_layer - (uint64_t)sbh2));
    assert_true(lt[1].recompute > pt[3].recompute);
    assert_true(lt[0].step < lt[1].step);
}

/* The search fills the GPU: where recompute none does not fit and full does,
 * it recomputes the fewest layers that fit (one fewer does not), which is
 * faster than recomputing them all; a plan file for the runtime keeps to
 * whole-model recompute. */
static void test_search_fills_gpu(void **state)
{
    (void)state;
    zo_model_config m;
    plan_hw hw;
    assert_int_equal(zo_model_preset_find("llama-2-7b", &m), ZO_OK);
    assert_int_equal(plan_hw_find("dgx-h100", &hw), ZO_OK);
    plan_space s;
    plan_space_defaults(&s, &m, &hw);
    s.base.seq = 16384;
    s.global_batch = 8;
    s.allow_offload = 0;
    s.max_micro_batch = 1;
    s.tp = s.pp = 1;
    s.zero_min = s.zero_max = 3;
    plan_result r;
    assert_int_equal(plan_search(&m, &hw, &s, 3, &r), ZO_OK);
    assert_true(r.n_best > 0);
    const plan_candidate *b = &r.best[0];
    assert_int_equal(b->t.recompute, PLAN_RECOMPUTE_FULL);
    int k = b->t.recompute_layers;
    assert_true(k > 0 && k < 32);
    plan_train u = b->t;
    plan_estimate e;
    plan_time full, part;
    assert_int_equal(plan_estimate_run(&m, &hw, &u, &e), ZO_OK);
    assert_true(e.fits);
    assert_int_equal(plan_time_run(&m, &hw, &u, &e, &part), ZO_OK);
    assert_true(part.step == b->time.step);
    u.recompute_layers = k - 1;
    assert_int_equal(plan_estimate_run(&m, &hw, &u, &e), ZO_OK);
    assert_false(e.fits);
    u.recompute = PLAN_RECOMPUTE_NONE;
    u.recompute_layers = 0;
    assert_int_equal(plan_estimate_run(&m, &hw, &u, &e), ZO_OK);
    assert_false(e.fits);
    u.recompute = PLAN_RECOMPUTE_FULL;
    assert_int_equal(plan_estimate_run(&m, &hw, &u, &e), ZO_OK);
    assert_int_equal(plan_time_run(&m, &hw, &u, &e, &full), ZO_OK);
    assert_true(part.step < full.step);
    /* a plan file for train: the runtime recomputes part of the layers
     * (issue 33); by op only when asked */
    s.runtime_plans = 1;
    assert_int_equal(plan_search(&m, &hw, &s, 3, &r), ZO_OK);
    assert_true(r.n_best > 0);
    assert_int_equal(r.best[0].t.recompute_layers, k);
    for (int i = 0; i < r.n_best; i++) assert_true(r.best[i].t.recompute != ZO_PLAN_RECOMPUTE_OPS);
    /* --recompute ops: the runtime runs it, so a plan for train may propose it */
    s.recompute = ZO_PLAN_RECOMPUTE_OPS;
    assert_int_equal(plan_search(&m, &hw, &s, 3, &r), ZO_OK);
    assert_true(r.n_best > 0);
    for (int i = 0; i < r.n_best; i++) assert_int_equal(r.best[i].t.recompute, ZO_PLAN_RECOMPUTE_OPS);
    /* with LoRA and QLoRA too (each adapter's x A rebuilt by the runtime) */
    for (int q = 0; q < 2; q++) {
        s.base.method = q ? ZO_PLAN_QLORA : PLAN_METHOD_LORA;
        s.base.lora = (zo_lora_config){.r = 16, .alpha = 32, .targets = ZO_LORA_ALL_LINEAR};
        assert_int_equal(plan_search(&m, &hw, &s, 3, &r), ZO_OK);
        assert_true(r.n_best > 0);
        for (int i = 0; i < r.n_best; i++) {
            assert_int_equal(r.best[i].t.recompute, ZO_PLAN_RECOMPUTE_OPS);
            assert_int_equal(r.best[i].t.method, s.base.method);
        }
    }
}

/* The reduce dtype sets the communication buckets' bytes (fp32 by default,
 * the runtime's). */
static void test_reduce_dtype_buckets(void **state)
{
    (void)state;
    zo_model_config m;
    plan_hw hw;
    plan_train t;
    preset_on("llama-2-7b", "dgx-h100", &m, &hw, &t);
    t.dp = 8;
    plan_estimate e;
    assert_int_equal(plan_estimate_run(&m, &hw, &t, &e), ZO_OK);
    uint64_t fp32 = item_bytes(&e, "communication buckets (fp32)", PLAN_GPU);
    assert_true(fp32 == 2ull * (25000000 / 8 * 8) * 4);
    t.reduce_dtype = ZO_DTYPE_BF16;
    assert_int_equal(plan_estimate_run(&m, &hw, &t, &e), ZO_OK);
    assert_true(item_bytes(&e, "communication buckets (bf16)", PLAN_GPU) == fp32 / 2);
}

static void test_korthikanti_layer(void **state)
{
    (void)state;
    static const char *presets[] = {"megatron-22b", "megatron-175b", "megatron-530b", "megatron-1t"};
    for (size_t i = 0; i < 4; i++) {
        setup s;
        gpt_setup(&s, presets[i], 1, 0, PLAN_RECOMPUTE_NONE);
        double sv = 2048, b = 1, h = s.m.hidden, a = s.m.n_heads;
        for (int t = 1; t <= 8; t *= 2) {
            s.t.tp = t;
            s.t.sp = 0;
            /* sbh(10 + 24/t + 5as/(ht)) */
            double want = sv * b * h * (10 + 24.0 / t + 5 * a * sv / (h * t));
            assert_true(fabs((double)plan_layer_act_bytes(&s.m, &s.t, 1) - want) < 1);
            /* selective recompute removes the 5as/h term */
            want = sv * b * h * (10 + 24.0 / t);
            assert_true(fabs((double)plan_layer_act_bytes(&s.m, &s.t, 0) - want) < 1);
            if (t == 1) continue;
            /* sequence parallel: sbh(34 + 5as/h)/t */
            s.t.sp = 1;
            want = sv * b * h * (34 + 5 * a * sv / h) / t;
            assert_true(fabs((double)plan_layer_act_bytes(&s.m, &s.t, 1) - want) < 1);
            want = sv * b * h * 34 / t;
            assert_true(fabs((double)plan_layer_act_bytes(&s.m, &s.t, 0) - want) < 1);
        }
        /* t = 1: sbh(34 + 5as/h) */
        s.t.tp = 1;
        s.t.sp = 0;
        assert_true((double)plan_layer_act_bytes(&s.m, &s.t, 1) ==
                    sv * b * h * 34 + 5 * a * sv * sv * b);
    }
}

static void test_korthikanti_totals(void **state)
{
    (void)state;
    setup s;
    gpt_setup(&s, "megatron-22b", 8, 1, PLAN_RECOMPUTE_NONE);
    s.t.micro_batch = 4;
    double sv = 2048, b = 4, h = 6144, a = 64, v = 51200, L = 48, t = 8;
    plan_estimate e;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    /* layers + embedding dropout + final norm/output inputs + fp32 logits */
    double layers = L * sv * b * h * (34 + 5 * a * sv / h) / t;
    double extra = sv * b * h / t + 4 * sv * b * h / t + 4 * sv * b * v / t;
    assert_true(fabs((double)item_bytes(&e, "stored layer activations", PLAN_GPU) - layers) < 1);
    /* the runtime's backward working set (one layer's fp32 activation gradients
     * and scratch) is a line of its own beside the paper's terms */
    double work = (double)item_bytes(&e, "backward working set (fp32 activation gradients, scratch)", PLAN_GPU);
    assert_true(work > 0);
    /* and the 16-bit copy of the widest gradient a GEMM reads: here the
     * logits' (v = 51200 > the MLP's 4h), column-parallel over t */
    double dy16 = (double)item_bytes(&e, "16-bit activation gradient (the GEMMs' operand)", PLAN_GPU);
    assert_true(fabs(dy16 - sv * b * (v / t) * 2) < 1);
    assert_true(fabs((double)e.bytes[PLAN_GPU][PLAN_ACTIVATIONS] - work - dy16 - layers - extra) < 4);

    /* full recompute keeps 2sbh per layer (sharded with SP) plus one layer's working set */
    s.t.recompute = PLAN_RECOMPUTE_FULL;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    assert_true(fabs((double)item_bytes(&e, "stored layer activations", PLAN_GPU) -
                     L * 2 * sv * b * h / t) < 1);
    assert_true(fabs((double)item_bytes(&e, "recompute working set (1 layer)", PLAN_GPU) -
                     sv * b * h * (34 + 5 * a * sv / h) / t) < 1);
    /* without SP (the paper's Table 2): 2sbh per layer */
    s.t.sp = 0;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    assert_true(fabs((double)item_bytes(&e, "stored layer activations", PLAN_GPU) -
                     L * 2 * sv * b * h) < 1);

    /* flash attention removes the s^2 terms (and keeps an fp32 logsumexp per row) */
    s.t.recompute = PLAN_RECOMPUTE_NONE;
    s.t.sp = 1;
    s.t.flash_attn = 1;
    assert_true(fabs((double)plan_layer_act_bytes(&s.m, &s.t, 1) -
                     (sv * b * h * 34 / t + 4 * a * sv * b / t)) < 1);
}

static void test_pipeline_inflight(void **state)
{
    (void)state;
    setup s;
    gpt_setup(&s, "megatron-175b", 8, 1, PLAN_RECOMPUTE_SELECTIVE);
    s.hw.gpus = 64;
    s.t.pp = 8;
    s.t.dp = 1;
    s.t.grad_accum = 64;
    double sv = 2048, b = 1, h = 12288, L = 96, t = 8, p = 8;
    plan_estimate e;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    /* the first stage holds p micro-batches of L/p layers: L layers' worth */
    assert_int_equal(e.stage, 0);
    double per_layer = sv * b * h * 34 / t;
    assert_true(fabs((double)item_bytes(&e, "stored layer activations", PLAN_GPU) -
                     per_layer * L / p * p) < 2);
    /* interleaving multiplies by 1 + (p-1)/(pm) */
    s.t.vpp = 3;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    double want = per_layer * L * (1 + (p - 1) / (p * 3));
    assert_true(fabs((double)item_bytes(&e, "stored layer activations", PLAN_GPU) - want) / want < 1e-9);
    /* fewer micro-batches than stages: only those are in flight */
    s.t.vpp = 1;
    s.t.grad_accum = 2;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    assert_true(fabs((double)item_bytes(&e, "stored layer activations", PLAN_GPU) -
                     per_layer * L / p * 2) < 2);
}

static void test_llama_layer(void **state)
{
    (void)state;
    zo_model_config m;
    assert_int_equal(zo_model_preset_find("llama-2-70b", &m), ZO_OK);
    plan_train t;
    plan_train_defaults(&t, &m);
    t.seq = 4096;
    t.micro_batch = 2;
    assert_false(t.dropout);
    double s = 4096, b = 2, h = 8192, a = 64, kv = 8 * 128, f = 28672;
    /* norms' and projections' inputs (4 x h), Q, K, V, attention output, gate, up, down inputs */
    double base = 2 * (4 * s * b * h + s * b * (h + kv + kv + h) + 3 * s * b * f);
    assert_true((double)plan_layer_act_bytes(&m, &t, 1) == base + 4 * a * s * b);
    t.flash_attn = 0;
    assert_true((double)plan_layer_act_bytes(&m, &t, 1) == base + 2 * a * s * s * b);
    assert_true((double)plan_layer_act_bytes(&m, &t, 0) == base);
}

/* ---- placement and sharding -------------------------------------------------------- */

static void test_placement(void **state)
{
    (void)state;
    setup s;
    assert_int_equal(zo_model_preset_find("llama-2-13b", &s.m), ZO_OK);
    assert_int_equal(plan_hw_find("h100-80gb", &s.hw), ZO_OK);
    plan_train_defaults(&s.t, &s.m);
    s.t.recompute = PLAN_RECOMPUTE_FULL;
    plan_estimate e;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    assert_false(e.fits);
    uint64_t P = 13015864320ull;
    assert_int_equal(e.bytes[PLAN_GPU][PLAN_OPTIMIZER], 12 * P);
    /* a GPU optimizer share: gradients summed in fp32 (this runtime's, which
     * --grad-dtype does not change; --runtime eager's in the plan's dtype),
     * plus the runtime's two staging
     * blocks (weights' dtype, buffers: not model states, so the ZeRO paper's
     * figures stand) and its pinned staging: two sub-group chunks of new
     * weights on their way into the resident store (set and loaded from the
     * host; no block of fp32 gradient for an exact clipping norm: the share
     * is the whole optimizer, whose norm is taken on the GPU); the largest
     * block is a layer (see below) */
    uint64_t big = 3ull * 5120 * 13824 + 4ull * 5120 * 5120 + 2 * 5120;
    uint64_t chunk = s.t.buf.sub_group < big ? s.t.buf.sub_group : big;
    assert_int_equal(e.bytes[PLAN_GPU][PLAN_GRADS], 4 * P);
    assert_int_equal(item_bytes(&e, "gradient sums (fp32)", PLAN_GPU), 4 * P);
    assert_int_equal(item_bytes(&e, "gradient staging (2 blocks)", PLAN_GPU), 2 * 2 * big);
    assert_int_equal(item_bytes(&e, "pinned staging", PLAN_CPU), 2 * 2 * chunk);
    s.t.grad_dtype = ZO_DTYPE_F32;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    assert_int_equal(e.bytes[PLAN_GPU][PLAN_GRADS], 4 * P);
    s.t.grad_dtype = ZO_DTYPE_BF16;
    s.t.runtime = PLAN_RUNTIME_EAGER;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    assert_int_equal(e.bytes[PLAN_GPU][PLAN_GRADS], 2 * P);
    s.t.runtime = PLAN_RUNTIME_ZOFFLOAD;
    s.t.grad_dtype = s.t.dtype;

    s.t.grads_on = PLAN_CPU;
    s.t.opt_frac[PLAN_GPU] = 0;
    s.t.opt_frac[PLAN_CPU] = 0.5;
    s.t.opt_frac[PLAN_NVME] = 0.5;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    assert_int_equal(e.bytes[PLAN_GPU][PLAN_OPTIMIZER], 0);
    assert_int_equal(e.bytes[PLAN_CPU][PLAN_OPTIMIZER], 6 * P);
    /* on NVMe the runtime's swap store writes each sub-group of 100M params
     * as three fp32 tensors (master, m, v), each starting on 4 KiB */
    uint64_t half = P / 2, sgn = 100000000ull, al = 4096;
    uint64_t nvme = half / sgn * 3 * ((sgn * 4 + al - 1) / al * al) +
                    (half % sgn ? 3 * ((half % sgn * 4 + al - 1) / al * al) : 0);
    assert_true(nvme >= 6 * P && nvme < 6 * P + 3 * 66 * al);
    assert_int_equal(e.bytes[PLAN_NVME][PLAN_OPTIMIZER], nvme);
    /* host gradients are summed in fp32 as blocks arrive */
    assert_int_equal(e.bytes[PLAN_CPU][PLAN_GRADS], 4 * P);
    /* three sub-groups of 100M params of fp32 master + m + v for the NVMe pipeline */
    assert_int_equal(item_bytes(&e, "NVMe swap buffers (sub-groups)", PLAN_CPU), 3 * 100000000ull * 12);
    assert_true(e.fits);

    /* streamed weights: the GPU keeps (depth + 1) x largest block (the computing
     * block holds one); the largest is a layer
     * (13824*5120*3 + 4*5120^2 + 2*5120) or the untied head (32000*5120 + 5120) */
    s.t.params_on = PLAN_CPU;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    uint64_t layer = 3ull * 5120 * 13824 + 4ull * 5120 * 5120 + 2 * 5120;
    assert_int_equal(e.largest_block, layer);
    assert_int_equal(item_bytes(&e, "weight slots ((depth + 1) x largest block)", PLAN_GPU), 3 * 2 * layer);
    assert_int_equal(e.bytes[PLAN_CPU][PLAN_PARAMS], 2 * P);
    assert_int_equal(e.bytes[PLAN_GPU][PLAN_PARAMS], 0);

    /* and with accumulation over micro-batches too */
    s.t.grad_accum = 4;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    assert_int_equal(e.bytes[PLAN_CPU][PLAN_GRADS], 4 * P);

    /* CPU memory is per node, shared by its ranks */
    assert_int_equal(plan_hw_find("dgx-h100", &s.hw), ZO_OK);
    s.t.dp = 8;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    assert_int_equal(e.ranks_per_node, 8);
    assert_int_equal(e.capacity[PLAN_CPU], s.hw.cpu_mem / 8);
}

static void test_tensor_parallel_params(void **state)
{
    (void)state;
    setup s;
    gpt_setup(&s, "megatron-22b", 8, 1, PLAN_RECOMPUTE_NONE);
    plan_estimate e;
    assert_int_equal(plan_estimate_run(&s.m, &s.hw, &s.t, &e), ZO_OK);
    /* TP shards every matrix and the vocabulary; norms, row-parallel biases and
     * positions stay whole on every rank */
    uint64_t h = 6144, L = 48, v = 51200, sq = 2048;
    uint64_t split = 3 * h * h + 3 * h + h * h + 2 * 4 * h * h + 4 * h;
    uint64_t repl = 4 * h + 2 * h;
    uint64_t want = L * (split / 8 + repl) + v * h / 8 + sq * h + 2 * h;
    assert_int_equal(e.stage_params, want);
    /* summed over TP ranks, the replicated parts counted once: the whole model */
    assert_int_equal(8 * (e.stage_params - L * repl - sq * h - 2 * h) + L * repl + sq * h + 2 * h,
                     zo_model_params(&s.m));
}

/* ---- the CLI ------------------------------------------------------------------------ */

static void expect_bad(const char *args, const char *needle)
{
    static char out[65536];
    int rc = run_memplan(args, out, sizeof out);
    if (rc != 2 || !strstr(out, needle)) {
        print_error("memplan %s\n  exit %d, output: %s  wanted exit 2 and '%s'\n", args, rc, out, needle);
        fail();
    }
    /* one clear line */
    assert_non_null(strchr(out, '\n'));
    assert_null(strchr(strchr(out, '\n') + 1, '\n'));
}

static void test_cli_bad_input(void **state)
{
    (void)state;
    char dir[64], path[256], args[512];
    scratch_path(dir, sizeof dir, "memplan-test-XXXXXX");
    assert_non_null(mkdtemp(dir));
    expect_bad("estimate --model llama-2-14b", "closest presets: llama-2-13b");
    expect_bad("estimate --model llama-2-13b --tp 3", "--tp 3 does not divide the 40 attention heads");
    expect_bad("estimate --model llama-2-70b --tp 16 --gpus 16", "--tp 16 does not divide the 8 key/value heads");
    expect_bad("estimate --model llama-2-13b --pp 3 --gpus 3", "--pp 3 does not divide the 40 layers");
    expect_bad("estimate --model llama-2-13b --optimizer cpu=0.5,nvme=0.3", "sum to 0.8, not 1");
    expect_bad("estimate --model llama-2-13b --gpu-mem 0", "--gpu-mem: size must be greater than zero");
    expect_bad("estimate --model llama-2-13b --gpu-mem -80GB", "--gpu-mem: '-80GB' is negative");
    expect_bad("estimate --model llama-2-13b --micro-batch 0", "--micro-batch: 0 is out of range");
    expect_bad("estimate --model llama-2-13b --seq -4", "--seq");
    expect_bad("estimate --model llama-2-13b --zero 4", "--zero");
    expect_bad("estimate --model llama-2-13b --checkpoints cpu", "--checkpoints cpu needs --recompute full");
    expect_bad("estimate --model llama-2-13b --grads nvme", "--grads: 'nvme' is not one of gpu, cpu");
    expect_bad("estimate --model llama-2-13b --dp 3 --gpus 8", "= 3 ranks, but the hardware has 8 GPUs");
    expect_bad("estimate --model gpt2 --seq 4096", "exceeds the 1024 learned positions");
    expect_bad("estimate --model llama-2-13b --hw h10", "closest presets: h100-80gb");
    /* a name that is both a machine and a GPU preset suggested once */
    expect_bad("estimate --model llama-2-13b --hw h100-80g", "closest presets: h100-80gb, h100-pcie, h200-141gb (");
    expect_bad("estimate", "no model");
    expect_bad("frobnicate", "unknown command 'frobnicate'");
    expect_bad("estimate --model gpt2 --frob", "unknown option '--frob'");
    expect_bad("estimate --model", "--model needs a value");

    snprintf(path, sizeof path, "%s/broken.json", dir);
    files_write_text(path, "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 4096,,\n}\n");
    snprintf(args, sizeof args, "estimate --model %s", path);
    expect_bad(args, "broken.json:3:");
    snprintf(path, sizeof path, "%s/missing.json", dir);
    files_write_text(path, "{\"model_type\": \"mistral\", \"hidden_size\": 4096, \"intermediate_size\": 14336, "
                           "\"num_attention_heads\": 32, \"vocab_size\": 32000}");
    snprintf(args, sizeof args, "estimate --model %s", path);
    expect_bad(args, "missing.json: missing field \"num_hidden_layers\"");
    snprintf(args, sizeof args, "estimate --model %s/nothere.json", dir);
    expect_bad(args, "nothere.json: cannot open");
    files_remove_tree(dir);
}

static void test_cli_json(void **state)
{
    (void)state;
    static char out[1 << 20];
    int rc = run_memplan("estimate --model llama-2-13b --hw h100-80gb --seq 4096 --recompute full "
                         "--optimizer cpu --json",
                         out, sizeof out);
    assert_int_equal(rc, 0);
    cJSON *doc = cJSON_Parse(out);
    assert_non_null(doc);
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "model"), "params")->valuedouble ==
                13015864320.0);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(doc, "fits")));
    cJSON *cfg = cJSON_GetObjectItem(doc, "config");
    assert_string_equal(cJSON_GetObjectItem(cfg, "recompute")->valuestring, "full");
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "placement"), "grads")->valuestring, "cpu");
    static const char *tiers[] = {"gpu", "cpu", "nvme"};
    static const char *kinds[] = {"params", "grads", "optimizer", "activations", "buffers"};
    cJSON *pr = cJSON_GetObjectItem(doc, "per_rank");
    for (int i = 0; i < 3; i++) {
        cJSON *t = cJSON_GetObjectItem(pr, tiers[i]);
        assert_non_null(t);
        double sum = 0;
        for (int k = 0; k < 5; k++) {
            cJSON *v = cJSON_GetObjectItem(t, kinds[k]);
            assert_non_null(v);
            assert_true(cJSON_IsNumber(v));
            assert_true(v->valuedouble == floor(v->valuedouble));
            sum += v->valuedouble;
        }
        assert_true(sum == cJSON_GetObjectItem(t, "total")->valuedouble);
        assert_true(cJSON_GetObjectItem(t, "capacity")->valuedouble > 0);
    }
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(pr, "cpu"), "optimizer")->valuedouble ==
                12.0 * 13015864320.0);
    cJSON_Delete(doc);

    /* a split: the GPU's share in whole blocks (the head and 24 of the 40
     * layers for 0.6), and the bytes are those blocks' */
    rc = run_memplan("estimate --model llama-2-13b --hw h200 --seq 2048 --recompute full --params cpu --grads cpu "
                     "--optimizer gpu=0.6,cpu=0.3,nvme=0.1 --grad-dtype fp32 --json",
                     out, sizeof out);
    assert_int_equal(rc, 0);
    doc = cJSON_Parse(out);
    assert_non_null(doc);
    cJSON *pl = cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "config"), "placement");
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(pl, "optimizer"), "gpu")->valuedouble == 0.6);
    cJSON *held = cJSON_GetObjectItem(pl, "optimizer_blocks");
    double head = 32000.0 * 5120 + 5120, layer = (13015864320.0 - 2 * 32000.0 * 5120 - 5120) / 40;
    double g = (head + 24 * layer) / 13015864320.0;
    assert_true(fabs(cJSON_GetObjectItem(held, "gpu")->valuedouble - g) < 1e-12);
    assert_true(fabs(cJSON_GetObjectItem(held, "nvme")->valuedouble - 0.1) < 1e-12);
    assert_true(fabs(cJSON_GetObjectItem(held, "cpu")->valuedouble - (0.9 - g)) < 1e-12);
    pr = cJSON_GetObjectItem(doc, "per_rank");
    assert_true(fabs(cJSON_GetObjectItem(cJSON_GetObjectItem(pr, "gpu"), "optimizer")->valuedouble -
                     12 * (head + 24 * layer)) < 1);
    assert_true(fabs(cJSON_GetObjectItem(cJSON_GetObjectItem(pr, "gpu"), "grads")->valuedouble -
                     (4 * (head + 24 * layer) + 2 * 2 * layer)) < 1); /* + two layers of staging */
    cJSON_Delete(doc);

    /* does not fit: exit 1, a verdict line and a way that fits */
    rc = run_memplan("estimate --model llama-2-13b --hw h100-80gb --seq 4096", out, sizeof out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "does NOT fit"));
    assert_non_null(strstr(out, "fits with:"));

    /* --params: activations unknown, null in JSON */
    rc = run_memplan("estimate --params 7.5e9 --dp 64 --zero 3 --hw dgx-a100-80gb --gpus 64 --json",
                     out, sizeof out);
    assert_int_equal(rc, 0);
    doc = cJSON_Parse(out);
    assert_non_null(doc);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(pr = cJSON_GetObjectItem(doc, "per_rank"), "gpu"), "activations")));
    cJSON_Delete(doc);

    /* the listings */
    assert_int_equal(run_memplan("models", out, sizeof out), 0);
    assert_non_null(strstr(out, "13015864320"));
    assert_non_null(strstr(out, "megatron-1t"));
    assert_int_equal(run_memplan("hardware", out, sizeof out), 0);
    assert_non_null(strstr(out, "dgx-h200"));
}

/* memplan counts the scratch of attention's GEMM path as the CUDA backend
 * takes it (gpu/cuda/attention_gemm.h, written apart from the planner),
 * where the runtime takes that path; test_planner_attn checks every path's
 * bytes against the pool of the launchers themselves (host shim). */
static void test_attention_scratch(void **state)
{
    (void)state;
    static const int shapes[][6] = {
        /* b, t, hq, hkv, d, window */
        {1, 2048, 40, 40, 128, 0},  {4, 4096, 32, 8, 128, 0}, {2, 300, 6, 3, 80, 100},
        {1, 32768, 32, 8, 128, 4096}, {1, 256, 2, 1, 64, 0},  {1, 200000, 8, 1, 128, 0},
        {1, 100, 4, 2, 192, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const int *x = shapes[i];
        for (int bwd = 0; bwd < 2; bwd++) {
            uint64_t want = cuda_attn_scratch_bytes(bwd, x[0], x[1], x[2], x[3], x[4], x[5], 0, bwd, 0);
            assert_true(want > 0);
            assert_int_equal(plan_attn_pool_bytes(ZO_ATTN_GEMM, bwd, x[0], x[1], x[2], x[3], x[4], x[5], 0), want);
        }
        /* the fused kernels: D backward, nothing forward; flash nothing */
        assert_int_equal(plan_attn_pool_bytes(ZO_ATTN_MMA, 1, x[0], x[1], x[2], x[3], x[4], x[5], 0),
                         (uint64_t)x[0] * x[2] * x[1] * 4);
        assert_int_equal(plan_attn_pool_bytes(ZO_ATTN_TC, 0, x[0], x[1], x[2], x[3], x[4], x[5], 0), 0);
        assert_int_equal(plan_attn_pool_bytes(ZO_ATTN_FLASH, 1, x[0], x[1], x[2], x[3], x[4], x[5], 0), 0);
    }
    /* 13B, t 2048: 40 heads x 256 rows x 2048 keys (fp32 S, two bf16 parts),
     * D, dO in two bf16 parts on the GEMM path; D alone on mma.sync */
    assert_int_equal(plan_attn_pool_bytes(ZO_ATTN_GEMM, 1, 1, 2048, 40, 40, 128, 0, 0),
                     40ull * 256 * 2048 * 8 + 40ull * 2048 * 4 + 2ull * 2048 * 5120 * 2);
    assert_int_equal(plan_attn_pool_bytes(ZO_ATTN_MMA, 1, 1, 2048, 40, 40, 128, 0, 0), 40ull * 2048 * 4);
    /* in the estimate on a GPU with bf16, not with fp32 or on the CPU backend */
    char out[65536];
    const char *base = "estimate --model gpt2-xl --seq 1024 --micro-batch 1 --gpu h200";
    char cmd[512];
    assert_int_equal(run_memplan(base, out, sizeof out), 0);
    assert_non_null(strstr(out, "attention scratch (mma.sync backward: D per row)"));
    /* the GEMM path forced: its chunk's scores */
    snprintf(cmd, sizeof cmd, "%s --attention gemm", base);
    assert_int_equal(run_memplan(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "attention scratch (GEMM path"));
    snprintf(cmd, sizeof cmd, "%s --dtype fp32", base);
    assert_int_equal(run_memplan(cmd, out, sizeof out), 0);
    assert_null(strstr(out, "attention scratch"));
    /* pool memory outside the runtime's counted allocations: the plan's
     * alloc_bytes leave it out, with the context and the workspace */
    char dir[64], plan[128];
    scratch_path(dir, sizeof dir, "zo_attn_scratch_XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(plan, sizeof plan, "%s/plan.json", dir);
    snprintf(cmd, sizeof cmd, "%s --plan-out %s", base, plan);
    assert_int_equal(run_memplan(cmd, out, sizeof out), 0);
    zo_plan p;
    assert_int_equal(zo_plan_load(plan, &p), ZO_OK);
    assert_true(p.predicted.has_alloc);
    /* gpt2-xl: 25 heads of 64, seq 1024, on the mma.sync kernels: D */
    double attn = (double)plan_attn_pool_bytes(ZO_ATTN_MMA, 1, 1, 1024, 25, 25, 64, 0, 0);
    double kept = (double)p.predicted.alloc_bytes[ZO_PLAN_GPU] + (double)p.buffers.cuda_context +
                  (double)p.buffers.cublas_workspace + attn;
    assert_true(attn > 0);
    assert_true(fabs((double)p.predicted.peak_bytes[ZO_PLAN_GPU] - kept * (1.0 + p.buffers.fragmentation)) <= 2.0);
    files_remove_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_param_counts),        cmocka_unit_test(test_all_presets_valid),
        cmocka_unit_test(test_preset_lookup_error), cmocka_unit_test(test_preset_names_unique),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_zero_figure1),        cmocka_unit_test(test_zero_table1),
        cmocka_unit_test(test_mixed_precision_bytes), cmocka_unit_test(test_korthikanti_layer),
        cmocka_unit_test(test_korthikanti_totals),  cmocka_unit_test(test_pipeline_inflight),
        cmocka_unit_test(test_llama_layer),         cmocka_unit_test(test_placement),
        cmocka_unit_test(test_tensor_parallel_params), cmocka_unit_test(test_cli_bad_input),
        cmocka_unit_test(test_cli_json),
        cmocka_unit_test(test_partial_recompute), cmocka_unit_test(test_search_fills_gpu),
        cmocka_unit_test(test_reduce_dtype_buckets), cmocka_unit_test(test_attention_scratch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
