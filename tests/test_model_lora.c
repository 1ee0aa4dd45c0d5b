/* Tests for model/lora: the adapter layout (PEFT's names and shapes, its
 * total = PEFT's trainable count), adapter directories written and read back
 * (safetensors + adapter_config.json), checked against PEFT's documented
 * format (peft is not installed here, so the file is checked field by field:
 * what LoraConfig reads and what set_peft_model_state_dict expects), the
 * names PyTorch's fixtures use, and the configs this runtime refuses. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/fileio.h"     /* defines: zo_file_read_all, zo_file_write_all */
#include "model/lora.h"        /* defines: model_lora_layout_init, model_lora_save */
#include "model/safetensors.h" /* defines: model_st_open, model_layout_match_hf */
#include "tests/support/scratch.h" /* defines: scratch_path */

static zo_model_config load_cfg(const char *path_in_fixtures)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", ZO_FIXTURES_DIR, path_in_fixtures);
    zo_model_config c;
    assert_int_equal(zo_model_config_load(path, &c), ZO_OK);
    return c;
}

static void test_layout(void **state)
{
    (void)state;
    zo_model_config c = load_cfg("hf-configs/llama-2-7b.json");
    zo_lora_config lc = {.r = 8, .alpha = 16, .targets = ZO_LORA_Q | ZO_LORA_V};
    model_layout l;
    assert_int_equal(model_lora_layout_init(&l, &c, &lc), ZO_OK);
    assert_int_equal(l.total_numel, 4194304); /* PEFT's count */
    assert_int_equal(l.n_blocks, 34);
    assert_int_equal(l.block_numel[0], 0);
    assert_int_equal(l.block_numel[33], 0);
    assert_int_equal(l.n_tensors, 32 * 4);
    const model_tensor *t = &l.tensors[0];
    assert_string_equal(t->name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    assert_int_equal(t->lora, MODEL_LORA_A);
    assert_int_equal(t->role, MODEL_ROLE_Q_W);
    assert_int_equal(t->shape[0], 8);
    assert_int_equal(t->shape[1], 4096);
    t = &l.tensors[3];
    assert_string_equal(t->name, "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight");
    assert_int_equal(t->offset, 3 * 8 * 4096);
    assert_int_equal(t->shape[0], 4096);
    assert_int_equal(t->shape[1], 8);
    assert_non_null(model_layout_find(&l, "base_model.model.model.layers.31.self_attn.v_proj.lora_A.weight"));
    model_layout_free(&l);

    zo_model_config g = load_cfg("hf-configs/gpt2.json");
    lc.targets = ZO_LORA_ALL_LINEAR;
    assert_int_equal(model_lora_layout_init(&l, &g, &lc), ZO_OK);
    assert_string_equal(l.tensors[0].name, "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
    assert_int_equal(l.tensors[0].role, MODEL_ROLE_QKV_W);
    assert_int_equal(l.tensors[1].shape[0], 2304);
    assert_string_equal(l.tensors[7].name, "base_model.model.transformer.h.0.mlp.c_proj.lora_B.weight");
    assert_int_equal(l.tensors[7].role, MODEL_ROLE_MLP_DOWN_W);
    model_layout_free(&l);

    lc.targets = ZO_LORA_GATE; /* GPT-2 has none */
    assert_int_equal(model_lora_layout_init(&l, &g, &lc), ZO_ERR_INVALID);

    /* a mixture of experts: a routed expert's adapters together (w1, w3,
     * w2), expert after expert, after the attention's */
    zo_model_config x = load_cfg("lora/tiny_mixtral.json");
    lc.targets = ZO_LORA_Q | ZO_LORA_GATE | ZO_LORA_UP | ZO_LORA_DOWN;
    assert_int_equal(model_lora_layout_init(&l, &x, &lc), ZO_OK);
    assert_int_equal(l.n_tensors, 2 * 2 * (1 + 3 * 3));
    assert_string_equal(l.tensors[2].name, "base_model.model.model.layers.0.block_sparse_moe.experts.0.w1.lora_A.weight");
    assert_int_equal(l.tensors[2].role, MODEL_ROLE_EXPERT_GATE_W);
    assert_string_equal(l.tensors[5].name, "base_model.model.model.layers.0.block_sparse_moe.experts.0.w3.lora_B.weight");
    assert_string_equal(l.tensors[7].name, "base_model.model.model.layers.0.block_sparse_moe.experts.0.w2.lora_B.weight");
    assert_int_equal(l.tensors[7].shape[0], 32);
    assert_string_equal(l.tensors[8].name, "base_model.model.model.layers.0.block_sparse_moe.experts.1.w1.lora_A.weight");
    assert_int_equal(l.tensors[8].offset - l.tensors[2].offset, 8 * (3 * 32 + 3 * 24)); /* one expert's */
    assert_int_equal(l.total_numel, zo_lora_trainable_params(&x, 8, lc.targets));
    model_layout_free(&l);
}

/* Every adapter's module is a linear weight of the base model: stripping
 * "base_model.model." and ".lora_X.weight" and adding ".weight" names a
 * tensor of the Hugging Face checkpoint (what PEFT's wrapper resolves). */
static void check_modules_exist(const zo_model_config *c, const model_layout *ad)
{
    model_layout base;
    assert_int_equal(model_layout_init(&base, c), ZO_OK);
    for (int i = 0; i < ad->n_tensors; i++) {
        const char *name = ad->tensors[i].name, *pre = "base_model.model.";
        assert_int_equal(strncmp(name, pre, strlen(pre)), 0);
        char hf[160];
        size_t len = strlen(name) - strlen(pre) - strlen(".lora_A.weight");
        snprintf(hf, sizeof hf, "%.*s.weight", (int)len, name + strlen(pre));
        assert_string_equal(name + strlen(pre) + len, ad->tensors[i].lora == MODEL_LORA_A ? ".lora_A.weight" : ".lora_B.weight");
        int ignored;
        const model_tensor *w = model_layout_match_hf(&base, hf, &ignored);
        if (!w) fprintf(stderr, "%s: no base weight %s\n", name, hf);
        assert_non_null(w);
        /* A is [r, in] and B [out, r] of that weight ([out, in] in our layout) */
        const model_tensor *t = &ad->tensors[i];
        if (t->lora == MODEL_LORA_A)
            assert_int_equal(t->shape[1], w->shape[1]);
        else
            assert_int_equal(t->shape[0], w->shape[0]);
    }
    model_layout_free(&base);
}

static const char *json_str(const cJSON *o, const char *k)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* Save, check the files against PEFT's format, read back. */
static void round_trip(const char *cfg_path, zo_lora_config lc, const char *const *want_modules,
                       int n_want, zo_dtype file_dt)
{
    zo_model_config c = load_cfg(cfg_path);
    model_layout l;
    assert_int_equal(model_lora_layout_init(&l, &c, &lc), ZO_OK);
    check_modules_exist(&c, &l);
    float **blocks = calloc((size_t)l.n_blocks, sizeof *blocks), **back = calloc((size_t)l.n_blocks, sizeof *back);
    for (int b = 0; b < l.n_blocks; b++) {
        if (!l.block_numel[b]) continue; /* empty blocks may be NULL */
        blocks[b] = malloc(l.block_numel[b] * sizeof(float));
        back[b] = calloc(l.block_numel[b], sizeof(float));
        for (size_t e = 0; e < l.block_numel[b]; e++) blocks[b][e] = (float)((b * 131 + e * 7) % 97) / 97.0f - 0.5f;
    }
    char dir[128];
    scratch_path(dir, sizeof dir, "zo_test_lora_%d", (int)getpid());
    assert_int_equal(model_lora_save(dir, &l, &lc, "meta-llama/Llama-2-7b-hf", (const void *const *)blocks,
                                     ZO_DTYPE_F32, file_dt), ZO_OK);

    /* adapter_config.json as PEFT's LoraConfig reads it */
    char path[256], *text;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    assert_int_equal(zo_file_read_all(path, 1 << 20, "test", &text, NULL), ZO_OK);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    assert_string_equal(json_str(j, "peft_type"), "LORA");
    assert_string_equal(json_str(j, "task_type"), "CAUSAL_LM");
    assert_string_equal(json_str(j, "base_model_name_or_path"), "meta-llama/Llama-2-7b-hf");
    assert_string_equal(json_str(j, "bias"), "none");
    assert_true(cJSON_GetObjectItem(j, "r")->valuedouble == lc.r);
    assert_true(cJSON_GetObjectItem(j, "lora_alpha")->valuedouble == lc.alpha);
    assert_true(cJSON_GetObjectItem(j, "lora_dropout")->valuedouble == 0.0);
    assert_true(cJSON_IsBool(cJSON_GetObjectItem(j, "fan_in_fan_out")));
    assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItem(j, "fan_in_fan_out")), c.arch == ZO_ARCH_GPT);
    const cJSON *tm = cJSON_GetObjectItem(j, "target_modules");
    assert_int_equal(cJSON_GetArraySize(tm), n_want);
    for (int i = 0; i < n_want; i++) assert_string_equal(cJSON_GetArrayItem(tm, i)->valuestring, want_modules[i]);
    cJSON_Delete(j);
    free(text);

    /* adapter_model.safetensors: exactly the layout's names and shapes, in file_dt */
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    model_st_file f;
    assert_int_equal(model_st_open(&f, path), ZO_OK);
    assert_int_equal(f.n_tensors, l.n_tensors);
    for (int i = 0; i < l.n_tensors; i++) {
        const model_st_tensor *t = model_st_find(&f, l.tensors[i].name);
        assert_non_null(t);
        assert_int_equal(t->dtype, file_dt);
        assert_int_equal(t->ndim, 2);
        assert_int_equal(t->shape[0], l.tensors[i].shape[0]);
        assert_int_equal(t->shape[1], l.tensors[i].shape[1]);
    }
    model_st_close(&f);

    /* read back */
    zo_lora_config got;
    char base[128];
    assert_int_equal(model_lora_read_config(dir, &c, &got, base, sizeof base), ZO_OK);
    assert_int_equal(got.r, lc.r);
    assert_true(got.alpha == lc.alpha);
    zo_lora_module m1[ZO_LORA_MAX_MODULES], m2[ZO_LORA_MAX_MODULES];
    assert_int_equal(zo_lora_layer_modules(&c, got.targets, m1), zo_lora_layer_modules(&c, lc.targets, m2));
    assert_string_equal(base, "meta-llama/Llama-2-7b-hf");
    assert_int_equal(model_lora_load(dir, &l, (void *const *)back, ZO_DTYPE_F32), ZO_OK);
    for (int b = 0; b < l.n_blocks; b++)
        for (size_t e = 0; e < l.block_numel[b]; e++) {
            float want = blocks[b][e];
            if (file_dt == ZO_DTYPE_BF16) want = zo_bf16_to_f32(zo_f32_to_bf16(want));
            assert_true(back[b][e] == want);
        }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    for (int b = 0; b < l.n_blocks; b++) {
        free(blocks[b]);
        free(back[b]);
    }
    free(blocks);
    free(back);
    model_layout_free(&l);
}

static void test_round_trip(void **state)
{
    (void)state;
    static const char *const llama_qv[] = {"q_proj", "v_proj"};
    round_trip("hf-configs/llama-2-7b.json", (zo_lora_config){.r = 2, .alpha = 16, .targets = ZO_LORA_Q | ZO_LORA_V},
               llama_qv, 2, ZO_DTYPE_F32);
    static const char *const llama_all[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                            "gate_proj", "up_proj", "down_proj"};
    round_trip("gpu/tiny_llama.json", (zo_lora_config){.r = 3, .alpha = 6, .targets = ZO_LORA_ALL_LINEAR},
               llama_all, 7, ZO_DTYPE_BF16);
    static const char *const gpt_all[] = {"c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"};
    round_trip("gpu/tiny_gpt2.json", (zo_lora_config){.r = 4, .alpha = 8, .targets = ZO_LORA_ALL_LINEAR},
               gpt_all, 4, ZO_DTYPE_F32);
    static const char *const gpt_o[] = {"attn.c_proj"};
    round_trip("gpu/tiny_gpt2.json", (zo_lora_config){.r = 1, .alpha = 1.5f, .targets = ZO_LORA_O},
               gpt_o, 1, ZO_DTYPE_F32);
    /* mixtures of experts: Mixtral's experts' names; Qwen2-MoE's gate_proj,
     * up_proj and down_proj once each, the routed experts' and the shared
     * expert's */
    static const char *const mixtral[] = {"v_proj", "w1", "w3", "w2"};
    round_trip("lora/tiny_mixtral.json",
               (zo_lora_config){.r = 2, .alpha = 4, .targets = ZO_LORA_V | ZO_LORA_GATE | ZO_LORA_UP | ZO_LORA_DOWN},
               mixtral, 4, ZO_DTYPE_F32);
    round_trip("lora/tiny_qwen2_moe.json", (zo_lora_config){.r = 3, .alpha = 6, .targets = ZO_LORA_ALL_LINEAR},
               llama_all, 7, ZO_DTYPE_BF16);
}

/* The adapter files the PyTorch fixtures wrote with PEFT's names load into
 * the layout, every tensor matched, nothing left over. */
static void test_torch_names(void **state)
{
    (void)state;
    struct { const char *cfg, *file; zo_lora_config lc; } cases[] = {
        {"gpu/tiny_gpt2.json", "lora/gpt2_all_adapter.safetensors", {4, 8, ZO_LORA_ALL_LINEAR}},
        {"gpu/tiny_llama.json", "lora/llama_qv_adapter.safetensors", {4, 16, ZO_LORA_Q | ZO_LORA_V}},
        {"gpu/tiny_llama.json", "lora/llama_all_adapter.safetensors", {2, 4, ZO_LORA_ALL_LINEAR}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zo_model_config c = load_cfg(cases[i].cfg);
        model_layout l;
        assert_int_equal(model_lora_layout_init(&l, &c, &cases[i].lc), ZO_OK);
        float **bl = calloc((size_t)l.n_blocks, sizeof *bl);
        for (int b = 0; b < l.n_blocks; b++) bl[b] = calloc(l.block_numel[b] + 1, sizeof(float));
        char path[512];
        snprintf(path, sizeof path, "%s/%s", ZO_FIXTURES_DIR, cases[i].file);
        model_load_report rep;
        assert_int_equal(model_load_path(path, &l, (void *const *)bl, ZO_DTYPE_F32, MODEL_LOAD_STRICT, &rep), ZO_OK);
        assert_int_equal(rep.n_loaded, l.n_tensors);
        for (int b = 0; b < l.n_blocks; b++) free(bl[b]);
        free(bl);
        model_layout_free(&l);
    }
}

/* A config PEFT can write: what it means here (the targets; r is 8 in every
 * one), or a refusal naming the field (msg, in the error). */
/* gpu/tiny_llama.json, gpu/tiny_gpt2.json, hf-configs/mixtral-8x7b.json, hf-configs/qwen1.5-moe-a2.7b.json */
typedef enum config_base { TINY_LLAMA, TINY_GPT2, MIXTRAL, QWEN_MOE } config_base;

typedef struct config_case {
    config_base base;
    const char *json;
    zo_status want;
    unsigned targets;
    const char *msg;
} config_case;

/* what PEFT 0.17's save_pretrained writes, every field at its default */
#define PEFT_DEFAULTS                                                                                     \
    "\"alora_invocation_tokens\": null, \"alpha_pattern\": {}, \"arrow_config\": null, \"auto_mapping\": null, "   \
    "\"base_model_name_or_path\": \"meta-llama/Llama-2-7b-hf\", \"bias\": \"none\", \"corda_config\": null, "      \
    "\"ensure_weight_tying\": false, \"eva_config\": null, \"exclude_modules\": null, \"fan_in_fan_out\": false, " \
    "\"inference_mode\": true, \"init_lora_weights\": true, \"layer_replication\": null, "                        \
    "\"layers_pattern\": null, \"layers_to_transform\": null, \"loftq_config\": {}, \"lora_alpha\": 16, "          \
    "\"lora_bias\": false, \"lora_dropout\": 0.05, \"megatron_config\": null, \"megatron_core\": "              \
    "\"megatron.core\", \"modules_to_save\": null, \"peft_type\": \"LORA\", \"peft_version\": \"0.17.1\", "        \
    "\"qalora_group_size\": 16, \"r\": 8, \"rank_pattern\": {}, \"revision\": null, \"target_parameters\": null, " \
    "\"task_type\": \"CAUSAL_LM\", \"trainable_token_indices\": null, \"use_dora\": false, "                     \
    "\"use_qalora\": false, \"use_rslora\": false, \"target_modules\": [\"q_proj\", \"v_proj\"]"

static const config_case config_cases[] = {
    {TINY_LLAMA, "{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\", \"v_proj\"], "
                 "\"peft_type\": \"LORA\"}", ZO_OK, ZO_LORA_Q | ZO_LORA_V, NULL},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": \"all-linear\"}", ZO_OK, ZO_LORA_ALL_LINEAR, NULL},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"self_attn.o_proj\"], \"rank_pattern\": {}, "
                 "\"layers_to_transform\": null}", ZO_OK, ZO_LORA_O, NULL},
    {TINY_GPT2, "{\"r\": 8, \"target_modules\": [\"c_proj\"]}", ZO_OK, ZO_LORA_O | ZO_LORA_DOWN, NULL},
    {TINY_GPT2, "{\"r\": 8, \"target_modules\": [\"mlp.c_proj\", \"c_fc\"]}", ZO_OK, ZO_LORA_DOWN | ZO_LORA_UP, NULL},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"use_dora\": true}", ZO_ERR_UNSUPPORTED, 0, "use_dora"},
    /* rank-stabilised: the scale alpha / sqrt(r) is plain LoRA's with alpha * sqrt(r) */
    {TINY_LLAMA, "{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], \"use_rslora\": true}", ZO_OK,
     ZO_LORA_Q, NULL},
    {TINY_LLAMA, "{" PEFT_DEFAULTS "}", ZO_OK, ZO_LORA_Q | ZO_LORA_V, NULL},
    /* inits that leave the base weights as they are: the trained weights are what is loaded */
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"init_lora_weights\": \"gaussian\"}",
     ZO_OK, ZO_LORA_Q, NULL},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"init_lora_weights\": \"eva\"}",
     ZO_OK, ZO_LORA_Q, NULL},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"init_lora_weights\": \"orthogonal\"}",
     ZO_OK, ZO_LORA_Q, NULL},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"init_lora_weights\": false}", ZO_OK, ZO_LORA_Q, NULL},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"task_type\": null, \"exclude_modules\": [], "
                 "\"target_parameters\": [], \"some_new_config\": null}", ZO_OK, ZO_LORA_Q, NULL},
    /* fields that change what the adapters compute, or the base they sit on */
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"exclude_modules\": [\"q_proj\"]}",
     ZO_ERR_UNSUPPORTED, 0, "\"exclude_modules\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": \"all-linear\", \"exclude_modules\": \".*down.*\"}",
     ZO_ERR_UNSUPPORTED, 0, "\"exclude_modules\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"layer_replication\": [[0, 2], [1, 2]]}",
     ZO_ERR_UNSUPPORTED, 0, "\"layer_replication\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [], \"target_parameters\": [\"mlp.experts.down_proj\"]}",
     ZO_ERR_UNSUPPORTED, 0, "\"target_parameters\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"init_lora_weights\": \"pissa\"}",
     ZO_ERR_UNSUPPORTED, 0, "\"init_lora_weights\": \"pissa\" changes the base weights"},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"init_lora_weights\": \"pissa_niter_16\"}",
     ZO_ERR_UNSUPPORTED, 0, "\"pissa_niter_16\" changes the base weights"},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"init_lora_weights\": \"olora\"}",
     ZO_ERR_UNSUPPORTED, 0, "\"olora\" changes the base weights"},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"init_lora_weights\": \"corda\"}",
     ZO_ERR_UNSUPPORTED, 0, "\"corda\" changes the base weights"},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"init_lora_weights\": \"loftq\"}",
     ZO_ERR_UNSUPPORTED, 0, "\"loftq\" changes the base weights"},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"init_lora_weights\": \"lora_ga\"}",
     ZO_ERR_UNSUPPORTED, 0, "\"lora_ga\" changes the base weights"},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"init_lora_weights\": \"mica\"}", ZO_ERR_UNSUPPORTED, 0,
     "\"mica\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"init_lora_weights\": \"something\"}",
     ZO_ERR_UNSUPPORTED, 0, "\"init_lora_weights\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"task_type\": \"SEQ_CLS\"}", ZO_ERR_UNSUPPORTED, 0,
     "\"task_type\": \"SEQ_CLS\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"lora_bias\": true}",
     ZO_ERR_UNSUPPORTED, 0, "\"lora_bias\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"trainable_token_indices\": [5, 6]}",
     ZO_ERR_UNSUPPORTED, 0, "\"trainable_token_indices\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"alora_invocation_tokens\": [7]}",
     ZO_ERR_UNSUPPORTED, 0, "\"alora_invocation_tokens\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"use_qalora\": true}",
     ZO_ERR_UNSUPPORTED, 0, "\"use_qalora\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"kasa_config\": {\"rank\": 2}}", ZO_ERR_UNSUPPORTED, 0,
     "\"kasa_config\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"use_frobnication\": true}", ZO_ERR_UNSUPPORTED, 0,
     "\"use_frobnication\" is not a field this reader knows"},
    /* a module of some layers only, or a path that names no module */
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"model.layers.0.self_attn.q_proj\"]}", ZO_ERR_UNSUPPORTED, 0,
     "particular layers"},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"attn.q_proj\"]}", ZO_ERR_UNSUPPORTED, 0, "\"attn.q_proj\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"bias\": \"all\"}", ZO_ERR_UNSUPPORTED, 0, "bias"},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"modules_to_save\": [\"lm_head\"]}",
     ZO_ERR_UNSUPPORTED, 0, "modules_to_save"},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"layers_to_transform\": 3}", ZO_ERR_UNSUPPORTED, 0,
     "layers_to_transform"},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"lm_head\"]}", ZO_ERR_UNSUPPORTED, 0, "lm_head"},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": \".*proj\"}", ZO_ERR_UNSUPPORTED, 0, "pattern"},
    {TINY_LLAMA, "{\"target_modules\": [\"q_proj\"]}", ZO_ERR_FORMAT, 0, "\"r\""},
    {TINY_LLAMA, "{\"r\": 8, \"target_modules\": [\"q_proj\"], \"peft_type\": \"IA3\"}",
     ZO_ERR_UNSUPPORTED, 0, "peft_type"},
    {TINY_GPT2, "{\"r\": 8, \"target_modules\": [\"gate_proj\"]}", ZO_ERR_INVALID, 0, "gate"},
    {TINY_LLAMA, "{\"r\": 8, \"r\": 16, \"target_modules\": [\"q_proj\"]}", ZO_ERR_FORMAT, 0, "\"r\" appears twice"},
    /* mixtures of experts: the experts' projections by PEFT's names (every
     * expert's, and Qwen2-MoE's shared expert's with the routed ones); the
     * router, one expert, or the shared expert alone refused by name */
    {MIXTRAL, "{\"r\": 8, \"target_modules\": [\"q_proj\", \"w1\", \"w2\", \"w3\"]}", ZO_OK,
     ZO_LORA_Q | ZO_LORA_GATE | ZO_LORA_UP | ZO_LORA_DOWN, NULL},
    {MIXTRAL, "{\"r\": 8, \"target_modules\": [\"block_sparse_moe.experts.w2\"]}", ZO_ERR_UNSUPPORTED, 0,
     "\"block_sparse_moe.experts.w2\""},
    {MIXTRAL, "{\"r\": 8, \"target_modules\": [\"experts.0.w1\"]}", ZO_ERR_UNSUPPORTED, 0, "particular layers or experts"},
    {MIXTRAL, "{\"r\": 8, \"target_modules\": [\"gate\"]}", ZO_ERR_UNSUPPORTED, 0, "is the router"},
    {MIXTRAL, "{\"r\": 8, \"target_modules\": [\"block_sparse_moe.gate\"]}", ZO_ERR_UNSUPPORTED, 0, "is the router"},
    {QWEN_MOE, "{\"r\": 8, \"target_modules\": [\"gate_proj\", \"mlp.experts.0.up_proj\"]}", ZO_ERR_UNSUPPORTED, 0,
     "particular layers or experts"},
    {QWEN_MOE, "{\"r\": 8, \"target_modules\": [\"k_proj\", \"gate_proj\", \"down_proj\"]}", ZO_OK,
     ZO_LORA_K | ZO_LORA_GATE | ZO_LORA_DOWN, NULL},
    {QWEN_MOE, "{\"r\": 8, \"target_modules\": [\"shared_expert.up_proj\"]}", ZO_ERR_UNSUPPORTED, 0,
     "mlp.experts.N.up_proj"},
    {QWEN_MOE, "{\"r\": 8, \"target_modules\": [\"shared_expert_gate\"]}", ZO_ERR_UNSUPPORTED, 0, "is the router"},
    {QWEN_MOE, "{\"r\": 8, \"target_modules\": [\"mlp.gate\"]}", ZO_ERR_UNSUPPORTED, 0, "is the router"},
    {QWEN_MOE, "{\"r\": 8, \"target_modules\": \"all-linear\"}", ZO_OK, ZO_LORA_ALL_LINEAR, NULL},
};

/* The scale a read config should have: alpha / r, PEFT's default alpha 8;
 * rank-stabilised alpha / sqrt(r), held as alpha * sqrt(r) (r = 8). */
static float want_alpha(const char *json)
{
    const cJSON *doc = cJSON_Parse(json), *a = cJSON_GetObjectItem(doc, "lora_alpha");
    float alpha = a ? (float)a->valuedouble : 8.0f;
    if (cJSON_IsTrue(cJSON_GetObjectItem(doc, "use_rslora"))) alpha *= sqrtf(8.0f);
    cJSON_Delete((cJSON *)doc);
    return alpha;
}

/* Case k written as dir's adapter_config.json (path) and read for the base c. */
static void check_config_case(const char *dir, const char *path, const zo_model_config *c, const config_case *k)
{
    assert_int_equal(zo_file_write_all(path, k->json, strlen(k->json)), ZO_OK);
    zo_lora_config lc;
    zo_clear_error();
    zo_status st = model_lora_read_config(dir, c, &lc, NULL, 0);
    if (st != k->want) fprintf(stderr, "%s: %s\n", k->json, zo_last_error());
    assert_int_equal(st, k->want);
    if (st == ZO_OK) {
        assert_int_equal(lc.targets, k->targets);
        assert_int_equal(lc.r, 8);
        float alpha = want_alpha(k->json);
        if (fabsf(lc.alpha - alpha) > 1e-6f * alpha) fail_msg("%s: alpha %g, want %g", k->json, lc.alpha, alpha);
    } else {
        if (!strstr(zo_last_error(), k->msg)) fail_msg("%s: %s", k->json, zo_last_error());
    }
}

/* Configs PEFT can write: what they mean here, or a refusal naming the field. */
static void test_configs(void **state)
{
    (void)state;
    char dir[128], path[256];
    scratch_path(dir, sizeof dir, "zo_test_lora_cfg_%d", (int)getpid());
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    assert_int_equal(system(cmd), 0);
    zo_model_config bases[] = {[TINY_LLAMA] = load_cfg("gpu/tiny_llama.json"),
                               [TINY_GPT2] = load_cfg("gpu/tiny_gpt2.json"),
                               [MIXTRAL] = load_cfg("hf-configs/mixtral-8x7b.json"),
                               [QWEN_MOE] = load_cfg("hf-configs/qwen1.5-moe-a2.7b.json")};
    for (size_t i = 0; i < sizeof config_cases / sizeof config_cases[0]; i++)
        check_config_case(dir, path, &bases[config_cases[i].base], &config_cases[i]);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_torch_names),
        cmocka_unit_test(test_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
