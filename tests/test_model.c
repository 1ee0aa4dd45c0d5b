/* Tests for model/: parameter layout, safetensors, token data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/model_config.h"
#include "model/layout.h"

static const char *hf_configs[] = {"gpt2.json",       "gpt2-xl.json",     "llama-2-7b.json",
                                   "llama-2-13b.json", "llama-2-70b.json", "llama-3-8b.json",
                                   "mistral-7b.json"};

/* Tensors tile each block exactly, in order, and sum to the config's count. */
static void check_layout(const zo_model_config *cfg)
{
    model_layout l;
    zo_status st = model_layout_init(&l, cfg);
    if (st) fail_msg("%s: %s", cfg->name, zo_last_error());
    assert_int_equal(l.n_blocks, cfg->n_layers + 2);
    uint64_t sum = 0;
    size_t *next = calloc((size_t)l.n_blocks, sizeof *next);
    assert_non_null(next);
    for (int i = 0; i < l.n_tensors; i++) {
        const model_tensor *t = &l.tensors[i];
        assert_true(t->block >= 0 && t->block < l.n_blocks);
        if (t->offset != next[t->block]) fail_msg("%s: %s not packed", cfg->name, t->name);
        size_t numel = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        assert_int_equal(numel, t->numel);
        next[t->block] += t->numel;
        sum += t->numel;
        assert_ptr_equal(model_layout_find(&l, t->name), t);
    }
    for (int b = 0; b < l.n_blocks; b++) assert_int_equal(next[b], l.block_numel[b]);
    free(next);
    /* the count from common/, computed by its own formula */
    assert_int_equal(sum, zo_model_params(cfg));
    zo_param_counts pc;
    zo_model_param_counts(cfg, &pc);
    assert_int_equal(l.block_numel[0], pc.embedding);
    for (int i = 0; i < cfg->n_layers; i++)
        assert_int_equal(l.block_numel[model_layout_layer_block(i)], pc.per_layer);
    assert_int_equal(l.block_numel[model_layout_head_block(&l)], pc.final_norm + pc.head);
    model_layout_free(&l);
}

static void test_layout_presets(void **state)
{
    (void)state;
    size_t n;
    const zo_model_preset *p = zo_model_presets(&n);
    assert_true(n > 0);
    for (size_t i = 0; i < n; i++) check_layout(&p[i].cfg);
}

static void test_layout_hf_configs(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof hf_configs / sizeof hf_configs[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/hf-configs/%s", ZO_FIXTURES_DIR, hf_configs[i]);
        zo_model_config cfg;
        if (zo_model_config_load(path, &cfg)) fail_msg("%s", zo_last_error());
        check_layout(&cfg);
    }
}

/* Variants the presets do not cover: untied GPT, Qwen2-style q/k/v biases,
 * tied LLaMA, GQA with head_dim != hidden / heads. */
static void test_layout_variants(void **state)
{
    (void)state;
    zo_model_config c;
    assert_int_equal(zo_model_preset_find("gpt2", &c), ZO_OK);
    c.tied_embeddings = 0;
    check_layout(&c);
    c.attn_bias = 0;
    c.out_bias = 0;
    c.norm_bias = 0;
    check_layout(&c);
    assert_int_equal(zo_model_preset_find("llama-3-8b", &c), ZO_OK);
    c.attn_bias = 1;
    check_layout(&c);
    c.tied_embeddings = 1;
    c.out_bias = 1;
    check_layout(&c);
    c.head_dim = 96;
    check_layout(&c);
    c.params_override = 1000;
    model_layout l;
    assert_int_equal(model_layout_init(&l, &c), ZO_ERR_INVALID);
}

/* Role views: GPT-2 names and shapes, and the fused LLaMA views. */
static void test_layout_views(void **state)
{
    (void)state;
    zo_model_config c;
    assert_int_equal(zo_model_preset_find("gpt2", &c), ZO_OK);
    model_layout l;
    assert_int_equal(model_layout_init(&l, &c), ZO_OK);
    const model_tensor *t = model_layout_find(&l, "h.3.attn.c_attn.weight");
    assert_non_null(t);
    assert_int_equal(t->block, 4);
    assert_int_equal(t->layer, 3);
    assert_int_equal(t->hf_transposed, 1);
    assert_int_equal(t->shape[0], 3 * 768);
    assert_int_equal(t->shape[1], 768);
    const model_view *qkv = model_layout_view(&l, 4, MODEL_ROLE_QKV_W);
    const model_view *k = model_layout_view(&l, 4, MODEL_ROLE_K_W);
    assert_non_null(qkv);
    assert_non_null(k);
    assert_int_equal(qkv->offset, t->offset);
    assert_int_equal(k->offset, t->offset + 768 * 768);
    assert_int_equal(k->shape[0], 768);
    assert_int_equal(model_layout_find(&l, "h.3.mlp.c_fc.weight")->shape[0], 3072);
    assert_int_equal(model_layout_find(&l, "wte.weight")->hf_transposed, 0);
    assert_null(model_layout_view(&l, model_layout_head_block(&l), MODEL_ROLE_LM_HEAD_W));
    assert_non_null(model_layout_view(&l, 0, MODEL_ROLE_POS_EMB));
    assert_non_null(model_layout_view(&l, model_layout_head_block(&l), MODEL_ROLE_NORM_B));
    assert_null(model_layout_find(&l, "lm_head.weight"));
    model_layout_free(&l);

    assert_int_equal(zo_model_preset_find("llama-2-70b", &c), ZO_OK);
    assert_int_equal(model_layout_init(&l, &c), ZO_OK);
    const model_tensor *q = model_layout_find(&l, "model.layers.7.self_attn.q_proj.weight");
    const model_tensor *v = model_layout_find(&l, "model.layers.7.self_attn.v_proj.weight");
    assert_non_null(q);
    assert_non_null(v);
    assert_int_equal(v->shape[0], 8 * 128);
    qkv = model_layout_view(&l, 8, MODEL_ROLE_QKV_W);
    assert_non_null(qkv);
    assert_int_equal(qkv->tensor, -1);
    assert_int_equal(qkv->offset, q->offset);
    assert_int_equal(qkv->shape[0], 8192 + 2 * 1024);
    assert_int_equal(qkv->numel, q->numel + 2 * v->numel);
    const model_view *gu = model_layout_view(&l, 8, MODEL_ROLE_MLP_GATE_UP_W);
    assert_non_null(gu);
    assert_int_equal(gu->shape[0], 2 * 28672);
    assert_int_equal(gu->offset,
                     model_layout_find(&l, "model.layers.7.mlp.gate_proj.weight")->offset);
    assert_null(model_layout_view(&l, 8, MODEL_ROLE_LN1_B));
    assert_null(model_layout_view(&l, 8, MODEL_ROLE_QKV_B));
    assert_null(model_layout_view(&l, 0, MODEL_ROLE_POS_EMB));
    assert_non_null(model_layout_view(&l, model_layout_head_block(&l), MODEL_ROLE_LM_HEAD_W));
    assert_true(model_tensor_decays(q));
    assert_false(model_tensor_decays(model_layout_find(&l, "model.norm.weight")));
    model_layout_free(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_presets),
        cmocka_unit_test(test_layout_hf_configs),
        cmocka_unit_test(test_layout_variants),
        cmocka_unit_test(test_layout_views),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
