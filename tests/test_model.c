/* Tests for model/: parameter layout, safetensors, token data. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>
#include <unistd.h>

#include "common/fileio.h" /* defines: zo_file_read_all */
#include "common/model_config.h"
#include "common/model_limits.h"
#include "model/data.h"
#include "model/hf.h" /* defines: model_hf_config */
#include "model/layout.h"
#include "model/lora.h"        /* defines: model_lora_layout_init */
#include "model/safetensors.h" /* defines: model_save, model_load_path, model_st_open */
#include "tests/support/files.h" /* defines: files_write */
#include "tests/support/scratch.h" /* defines: scratch_path */

static const char *hf_configs[] = {"gpt2.json",         "gpt2-xl.json",     "llama-2-7b.json",
                                   "llama-2-13b.json",  "llama-2-70b.json", "llama-3-8b.json",
                                   "mistral-7b.json",   "llama-7b.json",    "llama-3.1-8b.json",
                                   "llama-3.2-1b.json", "qwen2.5-0.5b.json", "qwen2.5-7b.json",
                                   "mixtral-8x7b.json", "qwen1.5-moe-a2.7b.json",
                                   "qwen3-0.6b.json",   "qwen3-8b.json",    "qwen3-30b-a3b.json",
                                   "phi-3-mini-4k-instruct.json", "phi-3.5-mini-instruct.json",
                                   "phi-4.json", "gemma-2b.json", "gemma-7b.json",
                                   "pythia-160m.json", "pythia-6.9b.json", "gpt-neox-20b.json",
                                   "falcon-7b.json", "falcon-40b.json",
                                   "gemma-2-2b.json", "gemma-2-9b.json", "gemma-2-27b.json",
                                   "gemma-3-1b.json", "deepseek-moe-16b.json", "opt-125m.json", "opt-1.3b.json",
                                   "bloom-560m.json", "bloom-7b1.json", "falcon-rw-1b.json", "phi-2.json",
                                   "exaone-4.0-1.2b.json", "exaone-4.0-32b.json",
                                   "granite-3.1-2b.json", "granite-3.1-8b.json", "granite-3.0-1b-a400m.json",
                                   "granite-3.0-3b-a800m.json", "gpt-j-6b.json",
                                   "gemma-3-4b-it.json", "gemma-3-27b-it.json", "llava-1.5-7b-hf.json",
                                   "mistral-small-3.1-24b.json", "c4ai-command-r-v01.json",
                                   "aya-23-8b.json", "deepseek-v2-lite.json", "c4ai-command-r-plus.json",
                                   "deepseek-v2.json", "deepseek-v3.json"};


/* DeepSeek-V2-Lite's latent attention under its checkpoint's names and
 * shapes, and the rows that feed its rotary dims moved to the front of
 * each head, de-interleaved (the file's pair (2i, 2i + 1) at i and 32 + i
 * of the 64), by hand from the config: q_proj's heads of 128 + 64 rows,
 * kv_a_proj_with_mqa's 512 c_kv rows then 64 rotary ones. */
static void test_layout_mla(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/hf-configs/deepseek-v2-lite.json", ZO_FIXTURES_DIR);
    zo_model_config cfg;
    if (zo_model_config_load(path, &cfg)) fail_msg("%s", zo_last_error());
    model_layout l;
    assert_int_equal(model_layout_init(&l, &cfg), ZO_OK);
    static const struct {
        const char *name;
        int64_t rows, cols;
    } want[] = {
        {"model.layers.0.self_attn.q_proj.weight", 16 * 192, 2048},
        {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 576, 2048},
        {"model.layers.0.self_attn.kv_a_layernorm.weight", 512, 0},
        {"model.layers.0.self_attn.kv_b_proj.weight", 16 * 256, 512},
        {"model.layers.26.self_attn.o_proj.weight", 2048, 16 * 128},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const model_tensor *t = model_layout_find(&l, want[i].name);
        if (!t) fail_msg("%s missing", want[i].name);
        assert_true(t->shape[0] == want[i].rows && t->shape[1] == want[i].cols);
    }
    assert_null(model_layout_find(&l, "model.layers.0.self_attn.q_a_proj.weight"));
    const model_tensor *q = model_layout_find(&l, "model.layers.0.self_attn.q_proj.weight");
    const model_tensor *kva = model_layout_find(&l, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
    const model_tensor *kvb = model_layout_find(&l, "model.layers.0.self_attn.kv_b_proj.weight");
    assert_int_equal(kvb->hf_rope_rows, 0);
    /* (our row, the file's) */
    static const size_t qrows[][2] = {{0, 128},   {1, 130},   {31, 190},  {32, 129},  {63, 191},
                                      {64, 0},    {191, 127}, {192, 320}, {224, 321}, {256, 192},
                                      {3071, 3007}};
    for (size_t i = 0; i < sizeof qrows / sizeof qrows[0]; i++) {
        assert_int_equal(model_tensor_rope_file_row(q, qrows[i][0]), qrows[i][1]);
        assert_int_equal(model_tensor_rope_our_row(q, qrows[i][1]), qrows[i][0]);
    }
    static const size_t kvrows[][2] = {{0, 512}, {1, 514}, {32, 513}, {63, 575}, {64, 0}, {575, 511}};
    for (size_t i = 0; i < sizeof kvrows / sizeof kvrows[0]; i++) {
        assert_int_equal(model_tensor_rope_file_row(kva, kvrows[i][0]), kvrows[i][1]);
        assert_int_equal(model_tensor_rope_our_row(kva, kvrows[i][1]), kvrows[i][0]);
    }
    model_layout_free(&l);
}

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
        if (!t->hf_fused[0]) {
            assert_ptr_equal(model_layout_find(&l, t->name), t);
            continue;
        }
        /* a slice of a fused file tensor (Granite-MoE's experts): the name
         * finds its first slice; the slices under the name tile the fused
         * tensor, each its own run, in the block */
        const model_tensor *f = model_layout_find(&l, t->name);
        assert_true(f && f->hf_fused_at == 0 && f->block == t->block);
        size_t whole = (size_t)(t->hf_fused[0] * t->hf_fused[1] * t->hf_fused[2]), covered = 0;
        for (int j = 0; j < l.n_tensors; j++) {
            const model_tensor *u = &l.tensors[j];
            if (strcmp(u->name, t->name)) continue;
            assert_int_equal(u->block, t->block);
            covered += u->numel;
            if (u != t)
                assert_true(u->hf_fused_at + u->numel <= t->hf_fused_at || t->hf_fused_at + t->numel <= u->hf_fused_at);
        }
        assert_int_equal(covered, whole);
    }
    for (int b = 0; b < l.n_blocks; b++) assert_int_equal(next[b], l.block_numel[b]);
    free(next);
    /* the count from common/, computed by its own formula (less DeepSeek-V3's
     * router score corrections, E floats a MoE layer that no block holds) */
    uint64_t apart = cfg->moe.router_bias ? (uint64_t)cfg->moe.experts * zo_model_moe_layers(cfg) : 0;
    assert_int_equal(sum + apart, zo_model_params(cfg));
    zo_param_counts pc;
    zo_model_param_counts(cfg, &pc);
    assert_int_equal(l.block_numel[0], pc.embedding);
    /* (each layer's own count: DeepSeek's dense first layers differ from its MoE layers) */
    for (int i = 0; i < cfg->n_layers; i++) {
        zo_layer_params lp;
        zo_model_layer_params(cfg, i, &lp);
        assert_int_equal(l.block_numel[model_layout_layer_block(i)] +
                             (zo_model_layer_is_moe(cfg, i) && cfg->moe.router_bias ? (uint64_t)cfg->moe.experts : 0),
                         lp.total);
        if (zo_model_layer_is_moe(cfg, i) || !cfg->moe.experts) assert_int_equal(lp.total, pc.per_layer);
    }
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

/* Shapes whose products overflow and constants that make no sense are
 * refused by name before anything is formed from them (layers at INT_MAX
 * wrapped the block count; a norm epsilon or RoPE base below zero trained);
 * every preset and real config is within the limits. */
/* The MoE layers under the checkpoints' names (Mixtral's block_sparse_moe
 * w1/w3/w2, Qwen2-MoE's mlp experts, shared expert and its gate), and the
 * expert views: expert 0's tensor, expert e's a stride further. */
static void test_layout_moe(void **state)
{
    (void)state;
    static const struct {
        const char *config, *name;
        int64_t rows, cols;
    } want[] = {
        {"mixtral-8x7b.json", "model.layers.0.block_sparse_moe.gate.weight", 8, 4096},
        {"mixtral-8x7b.json", "model.layers.31.block_sparse_moe.experts.7.w1.weight", 14336, 4096},
        {"mixtral-8x7b.json", "model.layers.3.block_sparse_moe.experts.0.w3.weight", 14336, 4096},
        {"mixtral-8x7b.json", "model.layers.3.block_sparse_moe.experts.5.w2.weight", 4096, 14336},
        {"qwen1.5-moe-a2.7b.json", "model.layers.0.mlp.gate.weight", 60, 2048},
        {"qwen1.5-moe-a2.7b.json", "model.layers.23.mlp.experts.59.down_proj.weight", 2048, 1408},
        {"qwen1.5-moe-a2.7b.json", "model.layers.1.mlp.experts.0.gate_proj.weight", 1408, 2048},
        {"qwen1.5-moe-a2.7b.json", "model.layers.1.mlp.shared_expert.up_proj.weight", 5632, 2048},
        {"qwen1.5-moe-a2.7b.json", "model.layers.1.mlp.shared_expert_gate.weight", 1, 2048},
        /* Granite-MoE: the router, and expert 0's gate and down, the first slices of the fused
         * input_linear [32, 1024, 1024] and output_linear [32, 1024, 512] */
        {"granite-3.0-1b-a400m.json", "model.layers.0.block_sparse_moe.router.layer.weight", 32, 1024},
        {"granite-3.0-1b-a400m.json", "model.layers.23.block_sparse_moe.input_linear.weight", 512, 1024},
        {"granite-3.0-1b-a400m.json", "model.layers.5.block_sparse_moe.output_linear.weight", 1024, 512},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char path[512];
        zo_model_config cfg;
        model_layout l;
        snprintf(path, sizeof path, "%s/hf-configs/%s", ZO_FIXTURES_DIR, want[i].config);
        assert_int_equal(zo_model_config_load(path, &cfg), ZO_OK);
        assert_int_equal(model_layout_init(&l, &cfg), ZO_OK);
        const model_tensor *t = model_layout_find(&l, want[i].name);
        if (!t) fail_msg("%s: no %s", want[i].config, want[i].name);
        assert_int_equal(t->shape[0], want[i].rows);
        assert_int_equal(t->shape[1], want[i].cols);
        /* expert e's tensors sit e strides after the view (expert 0's) */
        static const model_role roles[] = {MODEL_ROLE_EXPERT_GATE_W, MODEL_ROLE_EXPERT_UP_W,
                                           MODEL_ROLE_EXPERT_DOWN_W};
        for (int r = 0; r < 3; r++) {
            const model_view *v = model_layout_view(&l, model_layout_layer_block(1), roles[r]);
            assert_non_null(v);
            for (int e = 0; e < cfg.moe.experts; e++) {
                size_t off = v->offset + (size_t)e * model_layout_expert_stride(&l);
                int found = 0;
                for (int k = 0; k < l.n_tensors; k++) {
                    const model_tensor *u = &l.tensors[k];
                    if (u->block == model_layout_layer_block(1) && u->offset == off) {
                        assert_int_equal(u->role, roles[r]);
                        assert_int_equal(u->numel, v->numel);
                        found = 1;
                    }
                }
                assert_true(found);
            }
        }
        model_layout_free(&l);
    }
}

static void test_layout_limits(void **state)
{
    (void)state;
    zo_model_config base;
    assert_int_equal(zo_model_preset_find("llama-2-7b", &base), ZO_OK);
    size_t n;
    const zo_model_preset *p = zo_model_presets(&n);
    for (size_t i = 0; i < n; i++) {
        zo_model_config c = p[i].cfg;
        if (zo_model_config_validate(&c) == ZO_OK && zo_model_config_check_limits(&c) != ZO_OK)
            fail_msg("preset %s: %s", p[i].name, zo_last_error());
    }
    struct {
        const char *what;
        zo_model_config c;
        const char *said;
    } bad[] = {
        {"eps", base, "rms_norm_eps"}, {"theta", base, "rope_theta"}, {"theta inf", base, "rope_theta"},
        {"layers", base, "layers"}, {"hidden", base, "2^53"}, {"vocab", base, "token embedding"},
        {"nan eps", base, "rms_norm_eps"},
    };
    bad[0].c.norm_eps = -1e-6f;
    bad[1].c.rope_theta = -1e4f;
    bad[2].c.rope_theta = INFINITY;
    bad[3].c.n_layers = 2147483647;
    bad[4].c.hidden = 2147483646;
    bad[4].c.n_heads = bad[4].c.n_kv_heads = 2;
    bad[4].c.head_dim = 0;
    bad[5].c.vocab = 2147483647;
    bad[5].c.hidden = 8388608;
    bad[5].c.head_dim = 0;
    bad[6].c.norm_eps = NAN;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        model_layout l;
        zo_status st = model_layout_init(&l, &bad[i].c);
        if (st != ZO_ERR_INVALID || !strstr(zo_last_error(), bad[i].said))
            fail_msg("%s: %s (%s)", bad[i].what, zo_status_name(st), zo_last_error());
    }
    zo_model_config gpt;
    assert_int_equal(zo_model_preset_find("gpt2", &gpt), ZO_OK);
    gpt.norm_eps = -1e-5f;
    model_layout l;
    assert_int_equal(model_layout_init(&l, &gpt), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "layer_norm_epsilon"));
}

/* DeepSeek's routing groups and scores, refused naming the field: n_group
 * dividing n_routed_experts (at most 64), topk_group 1 to n_group,
 * num_experts_per_tok within topk_group groups, V3's groups of two
 * experts, V3's sigmoid scores and noaux_tc, V2's known topk_method. */
static void test_deepseek_routing_fields(void **state)
{
    (void)state;
#define DS_V3 "{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 2, \"hidden_size\": 64, " \
              "\"num_attention_heads\": 2, \"intermediate_size\": 96, \"vocab_size\": 64, " \
              "\"moe_intermediate_size\": 32, \"n_routed_experts\": 8, \"first_k_dense_replace\": 1, "
#define DS_V2 "{\"model_type\": \"deepseek_v2\", \"num_hidden_layers\": 2, \"hidden_size\": 64, " \
              "\"num_attention_heads\": 2, \"intermediate_size\": 96, \"vocab_size\": 64, " \
              "\"moe_intermediate_size\": 32, \"n_routed_experts\": 8, \"first_k_dense_replace\": 1, " \
              "\"topk_method\": \"group_limited_greedy\", "
    static const struct {
        const char *json, *field;
    } bad[] = {
        {DS_V3 "\"num_experts_per_tok\": 2, \"n_group\": 3, \"topk_group\": 1}", "\"n_group\""},
        {DS_V3 "\"num_experts_per_tok\": 2, \"n_group\": 8, \"topk_group\": 4}", "\"n_group\""},
        {DS_V3 "\"num_experts_per_tok\": 2, \"n_group\": 4, \"topk_group\": 5}", "\"topk_group\""},
        {DS_V3 "\"num_experts_per_tok\": 5, \"n_group\": 4, \"topk_group\": 2}", "\"num_experts_per_tok\""},
        {DS_V3 "\"num_experts_per_tok\": 2, \"n_group\": 4, \"topk_group\": 2, \"scoring_func\": \"softmax\"}",
         "\"scoring_func\""},
        {DS_V3 "\"num_experts_per_tok\": 2, \"n_group\": 4, \"topk_group\": 2, \"topk_method\": \"greedy\"}",
         "\"topk_method\""},
        {DS_V2 "\"num_experts_per_tok\": 2, \"n_group\": 4}", "\"topk_group\""},
        {DS_V2 "\"num_experts_per_tok\": 2, \"n_group\": 128, \"topk_group\": 1}", "\"n_group\""},
        {DS_V2 "\"num_experts_per_tok\": 2, \"n_group\": 4, \"topk_group\": 1, \"routed_scaling_factor\": 0}",
         "\"routed_scaling_factor\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zo_model_config c;
        if (zo_model_config_parse(bad[i].json, "ds.json", &c) == ZO_OK) fail_msg("case %zu accepted", i);
        if (!strstr(zo_last_error(), bad[i].field))
            fail_msg("case %zu: \"%s\" does not name %s", i, zo_last_error(), bad[i].field);
    }
    /* accepted: V2's groups each of one expert (max of one p), the top k of topk_group x E/G */
    zo_model_config c;
    assert_int_equal(zo_model_config_parse(DS_V2 "\"num_experts_per_tok\": 2, \"n_group\": 8, \"topk_group\": 2}",
                                           "ds.json", &c), ZO_OK);
    assert_int_equal(c.moe_groups, 8);
    assert_int_equal(c.moe_topk_groups, 2);
    assert_int_equal(zo_model_config_parse(DS_V3 "\"num_experts_per_tok\": 1, \"n_group\": 4, \"topk_group\": 1, "
                                           "\"norm_topk_prob\": true}", "ds.json", &c), ZO_OK);
    assert_true(c.moe_sigmoid && c.moe.router_bias && c.moe.norm_topk && !c.moe.aux_loss);
    assert_true(c.moe_routed_scale == 2.5f);
#undef DS_V2
#undef DS_V3
}

static void test_layout_refuses_families(void **state)
{
    (void)state;
    /* a LLaMA config with another activation is not the runtime's SwiGLU */
    zo_model_config c;
    assert_int_equal(zo_model_preset_find("llama-2-7b", &c), ZO_OK);
    snprintf(c.act, sizeof c.act, "gelu");
    model_layout l;
    assert_int_equal(model_layout_init(&l, &c), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "gelu"));
    /* Qwen3's q/k norms are RMSNorms of LLaMA-shaped layers, not on GPT's */
    assert_int_equal(zo_model_preset_find("gpt2", &c), ZO_OK);
    c.qk_norm = 1;
    assert_int_equal(model_layout_init(&l, &c), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "q/k norms on GPT layers"));
    /* OPT-350m's post-norm layers (without its projections), an OPT without
     * its final norm and a BLOOM whose residual is taken after the norms:
     * refused by name when the config is read */
    static const char *opt_refused[][3] = {{"opt", "\"do_layer_norm_before\": false", "do_layer_norm_before"},
                                           {"opt", "\"_remove_final_layer_norm\": true", "_remove_final_layer_norm"},
                                           {"bloom", "\"apply_residual_connection_post_layernorm\": true",
                                            "apply_residual_connection_post_layernorm"}};
    for (int i = 0; i < 3; i++) {
        char json[512];
        snprintf(json, sizeof json,
                 "{\"model_type\": \"%s\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
                 "\"num_attention_heads\": 4, \"ffn_dim\": 256, \"vocab_size\": 100, %s}", opt_refused[i][0],
                 opt_refused[i][1]);
        assert_int_equal(zo_model_config_parse(json, "opt.json", &c), ZO_ERR_UNSUPPORTED);
        if (!strstr(zo_last_error(), opt_refused[i][2])) fail_msg("%s", zo_last_error());
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

/* ---- token data ---------------------------------------------------------------- */

static char tmpdir[256];

static int setup_tmp(void **state)
{
    (void)state;
    scratch_path(tmpdir, sizeof tmpdir, "zo_test_model.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmp(void **state)
{
    (void)state;
    const char *names[] = {"u16.bin", "u32.bin", "odd.bin", "oov.bin", "text.txt", "text.bin",
                           "short.bin", "empty.bin", "cut.bin", "granitemoe.safetensors", "gpt_oss.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", tmpdir, names[i]);
        unlink(p);
    }
    return rmdir(tmpdir);
}

/* n tokens from a small LCG, below vocab, written little-endian with width w */
static uint32_t *write_tokens(const char *path, size_t n, int w, uint32_t vocab)
{
    uint32_t *ids = malloc(n * sizeof *ids);
    uint8_t *raw = malloc(n * (size_t)w);
    assert_non_null(ids);
    assert_non_null(raw);
    uint32_t x = 99;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        ids[i] = (x >> 8) % vocab;
        for (int b = 0; b < w; b++) raw[i * (size_t)w + (size_t)b] = (uint8_t)(ids[i] >> (8 * b));
    }
    files_write(path, raw, n * (size_t)w);
    free(raw);
    return ids;
}

/* The train contract: row i of step k starts at ((k*B + i) * T) mod (N - T - 1). */
static void test_batches_sequential(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/u16.bin", tmpdir);
    const size_t N = 1000;
    const int B = 3, T = 17;
    uint32_t *ids = write_tokens(path, N, 2, 50257);
    model_tokens t;
    assert_int_equal(model_tokens_open(&t, path, MODEL_TOKENS_U16, 50257), ZO_OK);
    assert_int_equal(t.n, N);
    int32_t in[3 * 17], tg[3 * 17];
    for (int64_t k = 0; k < 40; k++) {
        assert_int_equal(model_batch_get(&t, B, T, k, 0, MODEL_SAMPLE_SEQUENTIAL, in, tg), ZO_OK);
        for (int i = 0; i < B; i++) {
            size_t off = (size_t)((k * B + i) * T) % (N - (size_t)T - 1);
            for (int j = 0; j < T; j++) {
                assert_int_equal(in[i * T + j], ids[off + (size_t)j]);
                assert_int_equal(tg[i * T + j], ids[off + (size_t)j + 1]);
            }
        }
    }
    model_tokens_close(&t);
    free(ids);
}

/* Random windows: a function of (seed, step, row) only; in range; seed matters. */
static void test_batches_random(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/u32.bin", tmpdir);
    const size_t N = 5000;
    const int B = 4, T = 33;
    uint32_t *ids = write_tokens(path, N, 4, 100000);
    model_tokens t;
    assert_int_equal(model_tokens_open(&t, path, MODEL_TOKENS_U32, 100000), ZO_OK);
    int32_t a_in[4 * 33], a_tg[4 * 33], b_in[4 * 33], b_tg[4 * 33];
    /* step 7 alone equals step 7 after other steps */
    assert_int_equal(model_batch_get(&t, B, T, 7, 42, MODEL_SAMPLE_RANDOM, a_in, a_tg), ZO_OK);
    for (int64_t k = 0; k < 7; k++)
        assert_int_equal(model_batch_get(&t, B, T, k, 42, MODEL_SAMPLE_RANDOM, b_in, b_tg), ZO_OK);
    assert_int_equal(model_batch_get(&t, B, T, 7, 42, MODEL_SAMPLE_RANDOM, b_in, b_tg), ZO_OK);
    assert_memory_equal(a_in, b_in, sizeof a_in);
    assert_memory_equal(a_tg, b_tg, sizeof a_tg);
    /* targets are the inputs shifted by one, from the file */
    for (int i = 0; i < B; i++) {
        uint64_t off = model_batch_offset(&t, B, T, 7, i, 42, MODEL_SAMPLE_RANDOM);
        assert_true(off < N - (uint64_t)T - 1);
        for (int j = 0; j < T; j++) {
            assert_int_equal(a_in[i * T + j], ids[off + (uint64_t)j]);
            assert_int_equal(a_tg[i * T + j], ids[off + (uint64_t)j + 1]);
        }
    }
    /* another seed gives other windows */
    assert_int_equal(model_batch_get(&t, B, T, 7, 43, MODEL_SAMPLE_RANDOM, b_in, b_tg), ZO_OK);
    assert_memory_not_equal(a_in, b_in, sizeof a_in);
    /* offsets spread over the file: 2000 draws hit both halves and the last tenth */
    int low = 0, high = 0, tail = 0;
    uint64_t span = N - (uint64_t)T - 1;
    for (int k = 0; k < 500; k++) {
        for (int i = 0; i < B; i++) {
            uint64_t off = model_batch_offset(&t, B, T, k, i, 1, MODEL_SAMPLE_RANDOM);
            assert_true(off < span);
            low += off < span / 2;
            high += off >= span / 2;
            tail += off >= span - span / 10;
        }
    }
    assert_true(low > 800 && high > 800 && tail > 100);
    model_tokens_close(&t);
    free(ids);
}

/* A token file cut short while it is in use (another process rewrote it):
 * the batch that reads past its new end is ZO_ERR_IO naming the file and
 * both sizes; the windows still inside it read as before. The tokens were
 * read through the mapping, and the same batch killed the process with
 * SIGBUS (train: exit 135, no message). */
static void test_tokens_truncated(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/cut.bin", tmpdir);
    const size_t N = 20000;
    const int B = 2, T = 31;
    uint32_t *ids = write_tokens(path, N, 2, 50257);
    model_tokens t;
    assert_int_equal(model_tokens_open(&t, path, MODEL_TOKENS_U16, 50257), ZO_OK);
    int32_t in[2 * 31], tg[2 * 31];
    /* step 200 reads tokens [12400, 12464): before the cut, it is the file's */
    assert_int_equal(model_batch_get(&t, B, T, 200, 0, MODEL_SAMPLE_SEQUENTIAL, in, tg), ZO_OK);
    assert_int_equal(in[0], ids[200 * B * T]);
    assert_int_equal(truncate(path, 8192), 0); /* 4096 tokens left */
    assert_int_equal(model_batch_get(&t, B, T, 200, 0, MODEL_SAMPLE_SEQUENTIAL, in, tg), ZO_ERR_IO);
    printf("  %s\n", zo_last_error());
    assert_non_null(strstr(zo_last_error(), path));
    assert_non_null(strstr(zo_last_error(), "the file ends at byte 8192, was 40000 bytes when opened: cut short"));
    /* step 1's windows lie before the cut */
    assert_int_equal(model_batch_get(&t, B, T, 1, 0, MODEL_SAMPLE_SEQUENTIAL, in, tg), ZO_OK);
    assert_int_equal(tg[0], ids[B * T + 1]);
    model_tokens_close(&t);
    free(ids);
}

static void test_tokens_errors(void **state)
{
    (void)state;
    char path[512];
    model_tokens t;
    int32_t in[64], tg[64];
    /* an id past the vocabulary, at token 123: named with file and position */
    snprintf(path, sizeof path, "%s/oov.bin", tmpdir);
    uint16_t raw[200];
    for (int i = 0; i < 200; i++) raw[i] = (uint16_t)(i % 100);
    raw[123] = 1500;
    files_write(path, raw, sizeof raw);
    assert_int_equal(model_tokens_open(&t, path, MODEL_TOKENS_U16, 1000), ZO_OK);
    assert_int_equal(model_tokens_check(&t, 0, 100), ZO_OK);
    assert_int_equal(model_tokens_check(&t, 0, t.n), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), path));
    assert_non_null(strstr(zo_last_error(), "token 123 "));
    assert_non_null(strstr(zo_last_error(), "1500"));
    /* the batch whose window covers it fails the same way: step 4 row 0 is [120, 145) */
    assert_int_equal(model_batch_get(&t, 2, 15, 0, 0, MODEL_SAMPLE_SEQUENTIAL, in, tg), ZO_OK);
    assert_int_equal(model_batch_get(&t, 2, 15, 4, 0, MODEL_SAMPLE_SEQUENTIAL, in, tg),
                     ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "token 123 "));
    /* too few tokens for the sequence length */
    assert_int_equal(model_batch_get(&t, 1, 199, 0, 0, MODEL_SAMPLE_SEQUENTIAL, in, tg),
                     ZO_ERR_INVALID);
    model_tokens_close(&t);
    /* with a large enough vocabulary the file is fine */
    assert_int_equal(model_tokens_open(&t, path, MODEL_TOKENS_U16, 50257), ZO_OK);
    assert_int_equal(model_tokens_check(&t, 0, t.n), ZO_OK);
    model_tokens_close(&t);

    /* an odd byte count is not a uint16 token file; nor is an empty file */
    snprintf(path, sizeof path, "%s/odd.bin", tmpdir);
    files_write(path, raw, 7);
    assert_int_equal(model_tokens_open(&t, path, MODEL_TOKENS_U16, 1000), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), path));
    assert_int_equal(model_tokens_open(&t, path, MODEL_TOKENS_U32, 1000), ZO_ERR_FORMAT);
    snprintf(path, sizeof path, "%s/empty.bin", tmpdir);
    files_write(path, raw, 0);
    assert_int_equal(model_tokens_open(&t, path, MODEL_TOKENS_U16, 1000), ZO_ERR_FORMAT);
    snprintf(path, sizeof path, "%s/nope.bin", tmpdir);
    assert_int_equal(model_tokens_open(&t, path, MODEL_TOKENS_U16, 1000), ZO_ERR_NOT_FOUND);
    assert_int_equal(model_tokens_open(&t, path, MODEL_TOKENS_BYTES, 100), ZO_ERR_INVALID);
    /* a FIFO nobody writes to is refused at once, naming it (opening it
     * waited for a writer forever: the alarm ends the test then) */
    snprintf(path, sizeof path, "%s/fifo.bin", tmpdir);
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(20);
    assert_int_equal(model_tokens_open(&t, path, MODEL_TOKENS_U16, 1000), ZO_ERR_INVALID);
    alarm(0);
    assert_non_null(strstr(zo_last_error(), path));
    assert_non_null(strstr(zo_last_error(), "not a regular file (a FIFO)"));
    unlink(path);
}

/* Byte-level tokenizer: a text file as tokens, encoded to uint16, decoded back. */
static void test_byte_tokens(void **state)
{
    (void)state;
    char text_path[512], tok_path[512];
    snprintf(text_path, sizeof text_path, "%s/text.txt", tmpdir);
    snprintf(tok_path, sizeof tok_path, "%s/text.bin", tmpdir);
    const char text[] = "To be, or not to be: that is the question.\n\xc3\xa9t\xc3\xa9\n";
    size_t n = sizeof text - 1;
    files_write(text_path, text, n);

    model_tokens t;
    assert_int_equal(model_tokens_open(&t, text_path, MODEL_TOKENS_BYTES, MODEL_BYTE_VOCAB), ZO_OK);
    assert_int_equal(t.n, n);
    for (size_t i = 0; i < n; i++) assert_int_equal(model_tokens_get(&t, i), (uint8_t)text[i]);
    model_tokens_close(&t);

    uint64_t count = 0;
    assert_int_equal(model_bytes_encode_file(text_path, tok_path, MODEL_TOKENS_U16, &count), ZO_OK);
    assert_int_equal(count, n);
    assert_int_equal(model_tokens_open(&t, tok_path, MODEL_TOKENS_U16, MODEL_BYTE_VOCAB), ZO_OK);
    assert_int_equal(t.n, n);
    int32_t ids[128];
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)model_tokens_get(&t, i);
    char back[129];
    assert_int_equal(model_bytes_decode(ids, n, back, sizeof back), ZO_OK);
    assert_memory_equal(back, text, n + 1);
    /* a batch of byte tokens decodes to a slice of the text */
    int32_t in[10], tg[10];
    assert_int_equal(model_batch_get(&t, 1, 10, 2, 0, MODEL_SAMPLE_SEQUENTIAL, in, tg), ZO_OK);
    assert_int_equal(model_bytes_decode(in, 10, back, sizeof back), ZO_OK);
    assert_memory_equal(back, text + 20, 10);
    model_tokens_close(&t);

    ids[3] = 300;
    assert_int_equal(model_bytes_decode(ids, n, back, sizeof back), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "token 3 "));
    assert_int_equal(model_bytes_decode(ids, n, back, n), ZO_ERR_INVALID);
    /* a GPT-2 vocabulary reads byte tokens too; too small a vocabulary is refused */
    assert_int_equal(model_tokens_open(&t, text_path, MODEL_TOKENS_BYTES, 50257), ZO_OK);
    model_tokens_close(&t);
    assert_int_equal(model_tokens_open(&t, text_path, MODEL_TOKENS_BYTES, 128), ZO_ERR_INVALID);
}

/* A config written from a shape alone (a preset's: train --save with no
 * config.json given) reads back as the same family: Qwen3's q/k norms and
 * head_dim 128, Gemma's; a mixture of experts, whose router and expert keys
 * the writer does not make, is refused naming the model rather than written
 * as LLaMA. */
/* Saved from the layout `l` (and its LoRA layout `ad`, q, k, v adapted),
 * query_key_value's file head h (d rows each) must hold our head ours[h]
 * (its rows in [q | k | v]) for the weight, its bias (if any: want_qkv
 * tensors in all) and lora_B; loaded back, each is the buffer saved; a nan
 * in the weight's row 1 of file head `nan_head` is named by its element as
 * the file numbers it. groups: the tensors' hf_head_groups. */
static void qkv_rows_round_trip(const char *tag, const model_layout *l, const model_layout *ad, int d, int groups,
                                const int *ours, int want_qkv, int nan_head)
{
    char dir[64], path[256], apath[256];
    scratch_path(dir, sizeof dir, "zo_qkv_XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(apath, sizeof apath, "%s/adapter.safetensors", dir);
    for (int pass = 0; pass < 2; pass++) { /* the model, then the adapters */
        const model_layout *L = pass ? ad : l;
        const char *file = pass ? apath : path;
        float **blocks = calloc((size_t)L->n_blocks, sizeof *blocks), **back = calloc((size_t)L->n_blocks, sizeof *back);
        assert_non_null(blocks);
        assert_non_null(back);
        for (int b = 0; b < L->n_blocks; b++) {
            blocks[b] = malloc((L->block_numel[b] + 1) * sizeof(float));
            back[b] = calloc(L->block_numel[b] + 1, sizeof(float));
            for (size_t i = 0; i < L->block_numel[b]; i++) blocks[b][i] = (float)(1000 * b + i);
        }
        if (model_save(file, L, (const void *const *)blocks, ZO_DTYPE_F32, ZO_DTYPE_F32)) fail_msg("%s", zo_last_error());
        model_st_file f;
        assert_int_equal(model_st_open(&f, file), ZO_OK);
        int checked = 0;
        size_t nan_at = 0, nan_elem = 0; /* the byte of the nan in the file, its element */
        for (int i = 0; i < L->n_tensors; i++) {
            const model_tensor *t = &L->tensors[i];
            int qkv = strstr(t->name, "query_key_value") && (!pass || strstr(t->name, "lora_B"));
            assert_int_equal(t->hf_head_rows, qkv ? d : 0);
            assert_int_equal(t->hf_head_groups, qkv ? groups : 0);
            const model_st_tensor *st = model_st_find(&f, t->name);
            assert_non_null(st);
            float *got = malloc(t->numel * sizeof(float));
            assert_int_equal(model_st_read(&f, st, got, ZO_DTYPE_F32, 0), ZO_OK);
            size_t cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
            for (size_t R = 0; R < (size_t)t->shape[0]; R++) {
                size_t row = qkv ? (size_t)ours[R / d] * d + R % d : R;
                for (size_t k = 0; k < cols; k++)
                    if (got[R * cols + k] != blocks[t->block][t->offset + row * cols + k])
                        fail_msg("%s: %s: file row %zu col %zu is %g, want our row %zu's %g", tag, t->name, R, k,
                                 got[R * cols + k], row, blocks[t->block][t->offset + row * cols + k]);
            }
            if (qkv && !pass && t->ndim == 2) {
                nan_elem = ((size_t)nan_head * d + 1) * cols + cols - 1;
                nan_at = f.data_start + st->begin + nan_elem * sizeof(float);
            }
            checked += qkv;
            free(got);
        }
        assert_int_equal(checked, pass ? 1 : want_qkv); /* weight (and bias); lora_B */
        model_st_close(&f);
        if (model_load_path(file, L, (void *const *)back, ZO_DTYPE_F32, MODEL_LOAD_STRICT, NULL))
            fail_msg("%s: %s", tag, zo_last_error());
        for (int b = 0; b < L->n_blocks; b++)
            assert_memory_equal(back[b], blocks[b], L->block_numel[b] * sizeof(float));
        if (!pass) {
            /* the weight's nan, named as the file numbers it */
            assert_true(nan_at > 0);
            FILE *fp = fopen(file, "r+b");
            assert_non_null(fp);
            const float nan = NAN;
            assert_int_equal(fseek(fp, (long)nan_at, SEEK_SET), 0);
            assert_int_equal(fwrite(&nan, sizeof nan, 1, fp), 1);
            fclose(fp);
            assert_int_equal(model_load_path(file, L, (void *const *)back, ZO_DTYPE_F32, MODEL_LOAD_STRICT, NULL),
                             ZO_ERR_FORMAT);
            char want[64];
            snprintf(want, sizeof want, "element %zu is nan", nan_elem);
            if (!strstr(zo_last_error(), want)) fail_msg("%s: want \"%s\": %s", tag, want, zo_last_error());
        }
        for (int b = 0; b < L->n_blocks; b++) free(blocks[b]), free(back[b]);
        free(blocks), free(back);
        unlink(file);
    }
    rmdir(dir);
}

/* GPT-NeoX's query_key_value has its rows per head, [q_0 k_0 v_0 q_1 k_1
 * v_1 ...] (Hugging Face views the output as [heads, 3 d] and splits the
 * last axis): file head 3 j + p is our head p heads + j (p = 0, 1, 2 for
 * q, k, v), for the weight, its bias and a LoRA adapter's lora_B. */
static void test_neox_qkv_rows(void **state)
{
    (void)state;
    static const char *json =
        "{\"model_type\": \"gpt_neox\", \"num_hidden_layers\": 1, \"hidden_size\": 12, "
        "\"num_attention_heads\": 2, \"intermediate_size\": 16, \"vocab_size\": 8, "
        "\"rotary_pct\": 0.5, \"use_parallel_residual\": true}";
    zo_model_config c;
    if (zo_model_config_parse(json, "neox.json", &c)) fail_msg("%s", zo_last_error());
    assert_int_equal(zo_model_rope_dim(&c), 3); /* int(6 x 0.5): odd, refused */
    assert_int_equal(model_layout_init(&(model_layout){0}, &c), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "odd rotary size"));
    c.rope_partial = 2.0 / 3.0; /* 4 of 6 */
    model_layout l, ad;
    if (model_layout_init(&l, &c)) fail_msg("%s", zo_last_error());
    zo_lora_config lc = {.r = 2, .alpha = 4.0f, .targets = ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V};
    if (model_lora_layout_init(&ad, &c, &lc)) fail_msg("%s", zo_last_error());
    const int d = 6, heads = 2;
    int ours[3 * 2];
    for (int j = 0; j < heads; j++)
        for (int p = 0; p < 3; p++) ours[3 * j + p] = p * heads + j;
    /* GPT-NeoX: a group a head; the nan in file head 1, k_0 (our head 2) */
    qkv_rows_round_trip("gpt-neox", &l, &ad, d, heads, ours, 2, 1);
    model_layout_free(&ad);
    model_layout_free(&l);
}

/* Falcon's query_key_value has its rows per kv group, each group's query
 * heads, then its key and value: [q_0 q_1 k_0 v_0 q_2 q_3 k_1 v_1] with the
 * new decoder architecture (4 query heads in 2 groups), ours [q_0 .. q_3 k_0
 * k_1 v_0 v_1]; multi-query (Falcon-7B: one group) is already ours. */
static void test_falcon_qkv_rows(void **state)
{
    (void)state;
    static const char *const json[2] = {
        "{\"model_type\": \"falcon\", \"num_hidden_layers\": 1, \"hidden_size\": 16, \"num_attention_heads\": 4, "
        "\"vocab_size\": 8, \"new_decoder_architecture\": true, \"num_kv_heads\": 2, \"bias\": true}",
        "{\"model_type\": \"falcon\", \"num_hidden_layers\": 1, \"hidden_size\": 16, \"num_attention_heads\": 4, "
        "\"vocab_size\": 8, \"multi_query\": true, \"parallel_attn\": true}"};
    /* our head of each file head, by hand */
    static const int grouped[8] = {0, 1, 4, 6, 2, 3, 5, 7}, multi_query[6] = {0, 1, 2, 3, 4, 5};
    for (int mq = 0; mq < 2; mq++) {
        zo_model_config c;
        if (zo_model_config_parse(json[mq], "falcon.json", &c)) fail_msg("%s", zo_last_error());
        assert_int_equal(c.n_kv_heads, mq ? 1 : 2);
        model_layout l, ad;
        if (model_layout_init(&l, &c)) fail_msg("%s", zo_last_error());
        zo_lora_config lc = {.r = 2, .alpha = 4.0f, .targets = ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V};
        if (model_lora_layout_init(&ad, &c, &lc)) fail_msg("%s", zo_last_error());
        /* the nan in file head 3: v_0 (our head 6) grouped, q_3 multi-query */
        qkv_rows_round_trip(mq ? "falcon multi-query" : "falcon grouped", &l, &ad, 4, mq ? 1 : 2,
                            mq ? multi_query : grouped, mq ? 1 : 2, 3);
        model_layout_free(&ad);
        model_layout_free(&l);
    }
}

/* GPT-J's q_proj and k_proj hold each head's rotary pairs interleaved (rows
 * 2i, 2i + 1 of the head rotate together), ours as rotate-half pairs them
 * (rows i, P + i, P the pairs): file row 2i of a head is our row i, 2i + 1
 * our row P + i, rows past 2P stay, for the weights and q's and k's lora_B,
 * and no other tensor (v_proj, lora_A) moves. Heads of 10 rows, 3 pairs (an
 * odd count, so halves and pairs differ), two heads. Saved and loaded back,
 * each buffer is the one saved; a nan at file row 3 of head 1 is named by
 * its element as the file numbers it. */
static void test_gptj_rot_rows(void **state)
{
    (void)state;
    static const char *json = "{\"model_type\": \"gptj\", \"n_layer\": 1, \"n_embd\": 20, \"n_head\": 2, "
                              "\"n_positions\": 16, \"vocab_size\": 8, \"rotary_dim\": 6}";
    zo_model_config c;
    if (zo_model_config_parse(json, "gptj.json", &c)) fail_msg("%s", zo_last_error());
    model_layout l, ad;
    if (model_layout_init(&l, &c)) fail_msg("%s", zo_last_error());
    zo_lora_config lc = {.r = 2, .alpha = 4.0f, .targets = ZO_LORA_ALL_LINEAR};
    if (model_lora_layout_init(&ad, &c, &lc)) fail_msg("%s", zo_last_error());
    /* our row of each file row of a head, by hand */
    static const int ours[10] = {0, 3, 1, 4, 2, 5, 6, 7, 8, 9};
    const size_t d = 10;
    char dir[64], path[256];
    scratch_path(dir, sizeof dir, "zo_gptj_XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    for (int pass = 0; pass < 2; pass++) { /* the model, then the adapters */
        const model_layout *L = pass ? &ad : &l;
        float **blocks = calloc((size_t)L->n_blocks, sizeof *blocks), **back = calloc((size_t)L->n_blocks, sizeof *back);
        assert_non_null(blocks);
        assert_non_null(back);
        for (int b = 0; b < L->n_blocks; b++) {
            blocks[b] = malloc((L->block_numel[b] + 1) * sizeof(float));
            back[b] = calloc(L->block_numel[b] + 1, sizeof(float));
            for (size_t i = 0; i < L->block_numel[b]; i++) blocks[b][i] = (float)(1000 * b + i);
        }
        if (model_save(path, L, (const void *const *)blocks, ZO_DTYPE_F32, ZO_DTYPE_F32)) fail_msg("%s", zo_last_error());
        model_st_file f;
        assert_int_equal(model_st_open(&f, path), ZO_OK);
        int moved = 0;
        size_t nan_at = 0, nan_elem = 0;
        for (int i = 0; i < L->n_tensors; i++) {
            const model_tensor *t = &L->tensors[i];
            int rot = (strstr(t->name, "attn.q_proj") || strstr(t->name, "attn.k_proj")) &&
                      (!pass || strstr(t->name, "lora_B"));
            assert_int_equal(t->hf_rope_rows, rot ? 6 : 0);
            assert_int_equal(t->hf_rope_at, 0);
            const model_st_tensor *st = model_st_find(&f, t->name);
            assert_non_null(st);
            float *got = malloc(t->numel * sizeof(float));
            assert_int_equal(model_st_read(&f, st, got, ZO_DTYPE_F32, 0), ZO_OK);
            size_t cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
            for (size_t R = 0; R < (size_t)t->shape[0]; R++) {
                size_t row = rot ? R / d * d + (size_t)ours[R % d] : R;
                for (size_t k = 0; k < cols; k++)
                    if (got[R * cols + k] != blocks[t->block][t->offset + row * cols + k])
                        fail_msg("%s: file row %zu col %zu is %g, want our row %zu's %g", t->name, R, k,
                                 got[R * cols + k], row, blocks[t->block][t->offset + row * cols + k]);
            }
            if (rot && !pass && strstr(t->name, "k_proj")) {
                nan_elem = (d + 3) * cols + 1;
                nan_at = f.data_start + st->begin + nan_elem * sizeof(float);
            }
            moved += rot;
            free(got);
        }
        assert_int_equal(moved, 2); /* q and k: the weights, or lora_B */
        model_st_close(&f);
        if (model_load_path(path, L, (void *const *)back, ZO_DTYPE_F32, MODEL_LOAD_STRICT, NULL))
            fail_msg("%s", zo_last_error());
        for (int b = 0; b < L->n_blocks; b++) assert_memory_equal(back[b], blocks[b], L->block_numel[b] * sizeof(float));
        if (!pass) {
            FILE *fp = fopen(path, "r+b");
            assert_non_null(fp);
            const float nan = NAN;
            assert_int_equal(fseek(fp, (long)nan_at, SEEK_SET), 0);
            assert_int_equal(fwrite(&nan, sizeof nan, 1, fp), 1);
            fclose(fp);
            assert_int_equal(model_load_path(path, L, (void *const *)back, ZO_DTYPE_F32, MODEL_LOAD_STRICT, NULL),
                             ZO_ERR_FORMAT);
            char want[64];
            snprintf(want, sizeof want, "element %zu is nan", nan_elem);
            if (!strstr(zo_last_error(), want)) fail_msg("want \"%s\": %s", want, zo_last_error());
        }
        for (int b = 0; b < L->n_blocks; b++) free(blocks[b]), free(back[b]);
        free(blocks), free(back);
        unlink(path);
    }
    rmdir(dir);
    model_layout_free(&ad);
    model_layout_free(&l);
}

/* Falcon-7B's first config (model_type RefinedWebModel, the old keys):
 * built as Falcon, multi-query, one norm, no projection biases; with
 * Falcon-RW's ALiBi the same tensors (no position table). */
static void test_falcon_old_keys(void **state)
{
    (void)state;
    static const char *json =
        "{\"model_type\": \"RefinedWebModel\", \"n_layer\": 2, \"hidden_size\": 256, \"n_head\": 4, "
        "\"vocab_size\": 100, \"multi_query\": true, \"parallel_attn\": true, \"alibi\": false, "
        "\"bias\": false}";
    zo_model_config c;
    if (zo_model_config_parse(json, "rw.json", &c)) fail_msg("%s", zo_last_error());
    assert_string_equal(c.family, "falcon");
    model_layout l;
    if (model_layout_init(&l, &c)) fail_msg("%s", zo_last_error());
    const model_tensor *t = model_layout_find(&l, "transformer.h.1.self_attention.query_key_value.weight");
    assert_non_null(t);
    assert_int_equal(t->shape[0], (4 + 2) * 64);
    assert_int_equal(t->hf_head_groups, 1);
    assert_null(model_layout_find(&l, "transformer.h.1.self_attention.query_key_value.bias"));
    assert_null(model_layout_find(&l, "transformer.h.1.post_attention_layernorm.weight"));
    assert_non_null(model_layout_find(&l, "transformer.h.1.input_layernorm.bias"));
    assert_null(model_layout_find(&l, "lm_head.weight")); /* tied */
    int n_tensors = l.n_tensors;
    model_layout_free(&l);
    c.pos = ZO_POS_ALIBI;
    if (model_layout_init(&l, &c)) fail_msg("%s", zo_last_error());
    assert_int_equal(l.n_tensors, n_tensors);
    model_layout_free(&l);
    /* sequential with kv heads neither 1 nor every head's: no FalconConfig
     * says so (its config.json would read back as another model) */
    c.pos = ZO_POS_ROTARY;
    c.parallel_block = 0;
    c.layer_norms = 2;
    c.n_kv_heads = 2;
    assert_int_equal(model_layout_init(&l, &c), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "grouped kv heads with sequential attention and MLP"));
    c.n_kv_heads = 1; /* multi-query: multi_query true */
    if (model_layout_init(&l, &c)) fail_msg("%s", zo_last_error());
    model_layout_free(&l);
}

/* The config.json a saved folder gets from the one given: torch_dtype the
 * weights', and transformers 5's dtype too where the config has one (never
 * a stale bf16 beside fp32 weights), no quantization_config, every other key
 * as given; a config without dtype gets none. */
static void test_hf_config_copy(void **state)
{
    (void)state;
    char path[128];
    scratch_path(path, sizeof path, "zo_test_copy_%d.json", (int)getpid());
    zo_model_config c;
    static const char *const given[2] = {
        "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 4, "
        "\"intermediate_size\": 96, \"vocab_size\": 100, \"dtype\": \"bfloat16\", \"torch_dtype\": \"bfloat16\", "
        "\"quantization_config\": {\"quant_method\": \"fp8\"}, \"transformers_version\": \"5.0.0\"}",
        "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 4, "
        "\"intermediate_size\": 96, \"vocab_size\": 100, \"torch_dtype\": \"bfloat16\"}"};
    for (int k = 0; k < 2; k++) {
        files_write_text(path, given[k]);
        assert_int_equal(zo_model_config_load(path, &c), ZO_OK);
        cJSON *o = NULL;
        if (model_hf_config_copy(path, &c, ZO_DTYPE_F32, &o) != ZO_OK) fail_msg("%s", zo_last_error());
        const cJSON *td = cJSON_GetObjectItemCaseSensitive(o, "torch_dtype");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "dtype");
        assert_true(cJSON_IsString(td) && !strcmp(td->valuestring, "float32"));
        if (k == 0) {
            assert_true(cJSON_IsString(d) && !strcmp(d->valuestring, "float32"));
            assert_null(cJSON_GetObjectItemCaseSensitive(o, "quantization_config"));
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "transformers_version");
            assert_true(cJSON_IsString(v) && !strcmp(v->valuestring, "5.0.0"));
        } else {
            assert_null(d);
        }
        cJSON_Delete(o);
    }
    remove(path);
}

static void test_hf_config_from_presets(void **state)
{
    (void)state;
    static const char *const dense[] = {"qwen3-0.6b", "qwen3-8b", "gemma-2b", "phi-4", "mistral-7b",
                                        "pythia-1.4b", "gpt-neox-20b", "falcon-7b", "falcon-40b", "falcon-rw-1b",
                                        "opt-125m", "opt-66b", "bloom-560m", "bloom", "phi-1.5", "phi-2"};
    for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++) {
        zo_model_config c, back;
        assert_int_equal(zo_model_preset_find(dense[i], &c), ZO_OK);
        cJSON *js = NULL;
        assert_int_equal(model_hf_config(&c, ZO_DTYPE_BF16, &js), ZO_OK);
        char *text = cJSON_Print(js);
        if (zo_model_config_parse(text, "written.json", &back) != ZO_OK) fail_msg("%s: %s", dense[i], zo_last_error());
        assert_string_equal(back.family, c.family);
        assert_int_equal(back.qk_norm, c.qk_norm);
        assert_int_equal(back.head_dim, c.head_dim);
        assert_int_equal(back.n_kv_heads, c.n_kv_heads);
        assert_int_equal(back.parallel_block, c.parallel_block);
        assert_int_equal(back.layer_norms, c.layer_norms);
        assert_int_equal(back.pos, c.pos);
        assert_int_equal(back.tied_embeddings, c.tied_embeddings);
        assert_int_equal(back.head_bias, c.head_bias);
        assert_int_equal(zo_model_rope_dim(&back), zo_model_rope_dim(&c));
        assert_string_equal(back.act, c.act[0] ? c.act : back.act);
        assert_true(zo_model_params(&back) == zo_model_params(&c));
        free(text);
        cJSON_Delete(js);
    }
    static const char *const moe[] = {"qwen3-30b-a3b"};
    for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) {
        zo_model_config c;
        assert_int_equal(zo_model_preset_find(moe[i], &c), ZO_OK);
        cJSON *js = NULL;
        assert_int_equal(model_hf_config(&c, ZO_DTYPE_BF16, &js), ZO_ERR_UNSUPPORTED);
        assert_null(js);
        assert_non_null(strstr(zo_last_error(), "mixture of experts"));
    }
    /* the rotary families past LLaMA keep a rope_scaling (linear, and
     * dynamic with its original length) when their config is written from
     * the shape */
    static const char *const rotary[] = {"pythia-1.4b", "falcon-7b", "phi-2"};
    for (size_t i = 0; i < sizeof rotary / sizeof rotary[0]; i++)
        for (int kind = 0; kind < 2; kind++) {
            zo_model_config c, back;
            assert_int_equal(zo_model_preset_find(rotary[i], &c), ZO_OK);
            snprintf(c.rope_scaling, sizeof c.rope_scaling, "%s", kind ? "dynamic" : "linear");
            c.rope_factor = kind ? 4.0f : 2.0f;
            c.rope_original_max = kind ? c.max_seq : 0;
            cJSON *js = NULL;
            assert_int_equal(model_hf_config(&c, ZO_DTYPE_BF16, &js), ZO_OK);
            char *text = cJSON_Print(js);
            if (zo_model_config_parse(text, "written.json", &back) != ZO_OK)
                fail_msg("%s: %s", rotary[i], zo_last_error());
            assert_string_equal(back.rope_scaling, c.rope_scaling);
            assert_true(back.rope_factor == c.rope_factor);
            free(text);
            cJSON_Delete(js);
        }
}

/* A fixture config.json (tests/fixtures/hf-configs/NAME) into c. */
/* json (as "bad.json") refused with `code`, the error naming field `key`
 * and, when `says` is given, saying it. */
static void refused(const char *json, const char *key, const char *says, zo_status code)
{
    zo_model_config c;
    assert_int_equal(zo_model_config_parse(json, "bad.json", &c), code);
    printf("  refused: %s\n", zo_last_error());
    char want[96];
    snprintf(want, sizeof want, "bad.json: field \"%s\"", key);
    assert_non_null(strstr(zo_last_error(), want));
    if (says) assert_non_null(strstr(zo_last_error(), says));
}

/* A config refused: its text, the key and words the message names, the status. */
typedef struct refusal {
    const char *json, *key, *says;
    zo_status code;
} refusal;

static void refused_each(const refusal *bad, size_t n)
{
    for (size_t i = 0; i < n; i++) refused(bad[i].json, bad[i].key, bad[i].says, bad[i].code);
}

static void load_hf_fixture(const char *name, zo_model_config *c)
{
    char path[512];
    snprintf(path, sizeof path, "%s/hf-configs/%s", ZO_FIXTURES_DIR, name);
    if (zo_model_config_load(path, c)) fail_msg("%s", zo_last_error());
}

/* Preset `name` into c, and its config.json (model_hf_config) read back
 * into back. */
/* c's config.json (model_hf_config) read back into back. */
static void written_back(const zo_model_config *c, zo_model_config *back)
{
    cJSON *js = NULL;
    assert_int_equal(model_hf_config(c, ZO_DTYPE_BF16, &js), ZO_OK);
    char *text = cJSON_Print(js);
    if (zo_model_config_parse(text, "written.json", back) != ZO_OK) fail_msg("%s: %s", c->name, zo_last_error());
    free(text);
    cJSON_Delete(js);
}

static void preset_round_trip(const char *name, zo_model_config *c, zo_model_config *back)
{
    assert_int_equal(zo_model_preset_find(name, c), ZO_OK);
    written_back(c, back);
}

/* c is the same text model as want: family, shape, positions, norm eps,
 * rotary bases and scaling, each layer's window and rotary, parameter count (a
 * mismatch named by its field and both values). */
static void assert_same_shape(const zo_model_config *c, const zo_model_config *want)
{
#define SAME(f)                                                                                        \
    do {                                                                                               \
        if (c->f != want->f)                                                                           \
            fail_msg("%s: " #f " %g, want %s's %g", c->name, (double)c->f, want->name, (double)want->f); \
    } while (0)
    assert_string_equal(c->family, want->family);
    SAME(n_layers);
    SAME(hidden);
    SAME(n_heads);
    SAME(n_kv_heads);
    SAME(head_dim);
    SAME(ffn);
    SAME(vocab);
    SAME(max_seq);
    SAME(tied_embeddings);
    SAME(norm_eps);
    SAME(rope_theta);
    SAME(rope_local_theta);
    SAME(rope_factor);
    SAME(query_pre_attn_scalar);
#undef SAME
    assert_string_equal(c->rope_scaling, want->rope_scaling);
    for (int l = 0; l < c->n_layers; l++) {
        assert_int_equal(zo_model_layer_window(c, l), zo_model_layer_window(want, l));
        assert_int_equal(zo_model_layer_rotary(c, l), zo_model_layer_rotary(want, l));
    }
    assert_true(zo_model_params(c) == zo_model_params(want));
}

/* zo_model_windows: the distinct windows of a range of layers, first met
 * first, and their layer counts, against what each model's config says
 * (written here): Gemma-2-27B's 46 layers alternate 4096 and global from
 * layer 0; a period-3 list two sliding layers of 8 then a global one;
 * Mistral-7B's 32 layers all 4096; LLaMA-2-7B's none. Ranges inside a
 * model and an empty one too; then every range of several models against
 * the layers' windows one by one. */
static void check_windows_every_range(const zo_model_config *c)
{
    for (int first = 0; first <= c->n_layers; first++)
        for (int layers = 0; first + layers <= c->n_layers; layers++) {
            int want_w[2], want_n[2] = {0, 0}, nw = 0;
            for (int l = first; l < first + layers; l++) { /* layer by layer */
                const int x = zo_model_layer_window(c, l);
                int i = 0;
                while (i < nw && want_w[i] != x) i++;
                if (i == nw) want_w[nw++] = x;
                want_n[i]++;
            }
            int w[ZO_MODEL_WINDOWS], n[ZO_MODEL_WINDOWS];
            assert_int_equal(zo_model_windows(c, first, layers, w, n), nw);
            for (int i = 0; i < nw; i++) {
                assert_int_equal(w[i], want_w[i]);
                assert_int_equal(n[i], want_n[i]);
            }
        }
}

static void test_model_windows(void **state)
{
    (void)state;
    zo_model_config c;
    int w[ZO_MODEL_WINDOWS], n[ZO_MODEL_WINDOWS];
    load_hf_fixture("gemma-2-27b.json", &c);
    assert_int_equal(zo_model_windows(&c, 0, 46, w, n), 2);
    assert_true(w[0] == 4096 && n[0] == 23 && w[1] == 0 && n[1] == 23);
    assert_int_equal(zo_model_windows(&c, 1, 2, w, n), 2); /* layers 1, 2 */
    assert_true(w[0] == 0 && n[0] == 1 && w[1] == 4096 && n[1] == 1);
    assert_int_equal(zo_model_windows(&c, 45, 1, w, NULL), 1);
    assert_int_equal(w[0], 0);
    assert_int_equal(zo_model_windows(&c, 3, 0, w, n), 0);
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"gemma2\", \"num_hidden_layers\": 6, "
                                           "\"hidden_size\": 64, \"num_attention_heads\": 2, "
                                           "\"num_key_value_heads\": 1, \"head_dim\": 32, "
                                           "\"intermediate_size\": 96, \"vocab_size\": 100, "
                                           "\"sliding_window\": 8, \"layer_types\": [\"sliding_attention\", "
                                           "\"sliding_attention\", \"full_attention\", \"sliding_attention\", "
                                           "\"sliding_attention\", \"full_attention\"]}",
                                           "period3.json", &c),
                     ZO_OK);
    assert_int_equal(zo_model_windows(&c, 0, 6, w, n), 2);
    assert_true(w[0] == 8 && n[0] == 4 && w[1] == 0 && n[1] == 2);
    assert_int_equal(zo_model_windows(&c, 2, 4, w, n), 2); /* global, two sliding, global */
    assert_true(w[0] == 0 && n[0] == 2 && w[1] == 8 && n[1] == 2);
    assert_int_equal(zo_model_windows(&c, 3, 2, w, n), 1);
    assert_true(w[0] == 8 && n[0] == 2);
    assert_int_equal(zo_model_preset_find("mistral-7b", &c), ZO_OK);
    assert_int_equal(zo_model_windows(&c, 0, 32, w, n), 1);
    assert_true(w[0] == 4096 && n[0] == 32);
    assert_int_equal(zo_model_preset_find("llama-2-7b", &c), ZO_OK);
    assert_int_equal(zo_model_windows(&c, 0, 32, w, n), 1);
    assert_true(w[0] == 0 && n[0] == 32);
    /* every range against the layers one by one: those models, Gemma-3's
     * period of 6, a window from layer 5 (Qwen2's max_window_layers) */
    const char *presets[] = {"gemma-2-27b", "gemma-3-4b", "mistral-7b", "llama-2-7b"};
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        assert_int_equal(zo_model_preset_find(presets[i], &c), ZO_OK);
        check_windows_every_range(&c);
    }
    c.sliding_window = 16;
    c.window_from_layer = 5;
    check_windows_every_range(&c);
    c.window_period = 3;
    c.sliding_window = 0; /* a period without a window: every layer 0 */
    check_windows_every_range(&c);
}

/* Gemma-2's attention keys as Hugging Face's Gemma2Config reads them: the
 * real configs (27b: heads of 128, query_pre_attn_scalar 144; caps 50 and
 * 30; a window of 4096 on the even layers), null caps and window (none),
 * layer_types of another period; refused by name, saying what is wrong:
 * one of no period, one of another length, one with an entry that is not
 * "full_attention" or "sliding_attention", one that is not a list; and
 * each preset's config.json read back with the same keys. */
static void test_gemma2_config(void **state)
{
    (void)state;
    zo_model_config c, back;
    load_hf_fixture("gemma-2-27b.json", &c);
    assert_int_equal(c.head_dim, 128);
    assert_true(c.query_pre_attn_scalar == 144.0f && c.attn_softcap == 50.0f && c.final_softcap == 30.0f);
    assert_int_equal(c.layer_norms, 4);
    assert_int_equal(zo_model_layer_window(&c, 0), 4096);
    assert_int_equal(zo_model_layer_window(&c, 1), 0);
    assert_int_equal(zo_model_layer_window(&c, 44), 4096);
    assert_int_equal(zo_model_config_runtime_check(&c), ZO_OK);
#define G2 "{\"model_type\": \"gemma2\", \"num_hidden_layers\": 6, \"hidden_size\": 64, " \
           "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32, " \
           "\"intermediate_size\": 96, \"vocab_size\": 100"
    assert_int_equal(zo_model_config_parse(G2 ", \"attn_logit_softcapping\": null, "
                                           "\"final_logit_softcapping\": null, \"sliding_window\": null}",
                                           "nulls.json", &c),
                     ZO_OK);
    assert_true(c.attn_softcap == 0.0f && c.final_softcap == 0.0f && c.query_pre_attn_scalar == 256.0f);
    for (int l = 0; l < 6; l++) assert_int_equal(zo_model_layer_window(&c, l), 0);
    /* one global layer in three (Gemma-3's kind of list) */
    assert_int_equal(zo_model_config_parse(G2 ", \"sliding_window\": 8, \"layer_types\": [\"sliding_attention\", "
                                           "\"sliding_attention\", \"full_attention\", \"sliding_attention\", "
                                           "\"sliding_attention\", \"full_attention\"]}",
                                           "period3.json", &c),
                     ZO_OK);
    static const int want3[] = {8, 8, 0, 8, 8, 0};
    for (int l = 0; l < 6; l++) assert_int_equal(zo_model_layer_window(&c, l), want3[l]);
    assert_int_equal(zo_model_config_parse(G2 ", \"layer_types\": [\"full_attention\", \"sliding_attention\", "
                                           "\"sliding_attention\", \"full_attention\", \"sliding_attention\", "
                                           "\"full_attention\"]}",
                                           "odd.json", &c),
                     ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "layer_types"));
    /* each refusal says what is wrong: the first layer off the pattern (p 1
     * from layer 0: every layer full), the length against the layer count,
     * an entry that is not a string, a list that is not one */
    assert_non_null(strstr(zo_last_error(), "entry 1 is \"sliding_attention\""));
    static const struct {
        const char *json, *says;
    } bad[] = {
        {G2 ", \"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\", "
            "\"full_attention\"]}", "has 4 entries, num_hidden_layers is 6"},
        {G2 ", \"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\", "
            "\"full_attention\", 7, \"full_attention\"]}", "entry 4 is not"},
        {G2 ", \"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\", "
            "\"full_attention\", \"chunked_attention\", \"full_attention\"]}", "entry 4 is not"},
        {G2 ", \"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\", "
            "\"full_attention\", \"full_attention\", \"full_attention\"]}", "entry 4 is \"full_attention\""},
        {G2 ", \"layer_types\": \"sliding_attention\"}", "must be a list"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_not_equal(zo_model_config_parse(bad[i].json, "bad.json", &c), ZO_OK);
        printf("  refused: %s\n", zo_last_error());
        assert_non_null(strstr(zo_last_error(), "bad.json: field \"layer_types\""));
        assert_non_null(strstr(zo_last_error(), bad[i].says));
    }
#undef G2
    static const char *const presets[] = {"gemma-2-2b", "gemma-2-9b", "gemma-2-27b"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        preset_round_trip(presets[i], &c, &back);
        assert_string_equal(back.family, "gemma2");
        assert_true(back.query_pre_attn_scalar == c.query_pre_attn_scalar && back.attn_softcap == c.attn_softcap &&
                    back.final_softcap == c.final_softcap);
        for (int l = 0; l < c.n_layers; l++) assert_int_equal(zo_model_layer_window(&back, l), zo_model_layer_window(&c, l));
        assert_true(zo_model_params(&back) == zo_model_params(&c));
    }
}

/* Cohere as CohereConfig reads it: c4ai-command-r-v01's and aya-23-8b's
 * shapes, one LayerNorm without a bias before a parallel attention and MLP,
 * logit_scale as the logits' divisor's inverse (absent: 0.0625), tied unless
 * said; logit_scale not a finite number > 0 and attention_bias refused by
 * name; command-r-plus's use_qk_norm (a weight per head) read, sized and
 * laid out (its norms' columns permuted as q's rows); q_proj's and k_proj's rows (not v_proj's) carry the
 * interleaved rotary pairs over the whole head; each preset's config.json
 * read back alike. */
static void test_cohere_config(void **state)
{
    (void)state;
    zo_model_config c, back;
    load_hf_fixture("c4ai-command-r-v01.json", &c);
    assert_string_equal(c.family, "cohere");
    assert_true(c.arch == ZO_ARCH_LLAMA && c.layer_norm && !c.norm_bias && c.layer_norms == 1 && c.parallel_block);
    assert_true(c.n_kv_heads == 64 && c.head_dim == 128 && c.rope_theta == 8e6f && c.norm_eps == 1e-5f);
    assert_true(c.logit_div == 16.0f && c.tied_embeddings && !c.attn_bias && !c.qk_norm);
    if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());
    load_hf_fixture("aya-23-8b.json", &c);
    assert_true(c.logit_div == 8.0f && c.n_kv_heads == 8 && c.ffn == 14336);
#define CO "{\"model_type\": \"cohere\", \"num_hidden_layers\": 2, \"hidden_size\": 64, " \
           "\"num_attention_heads\": 2, \"intermediate_size\": 96, \"vocab_size\": 100"
    assert_int_equal(zo_model_config_parse(CO "}", "defaults.json", &c), ZO_OK);
    assert_true(c.logit_div == 16.0f && c.tied_embeddings && c.n_kv_heads == 2 && c.norm_eps == 1e-5f);
    assert_int_equal(zo_model_config_parse(CO ", \"logit_scale\": 0.5, \"num_key_value_heads\": null}", "ls.json", &c),
                     ZO_OK);
    assert_true(c.logit_div == 2.0f && c.n_kv_heads == 2);
    static const struct {
        const char *json, *key;
        zo_status code;
    } bad[] = {
        {CO ", \"logit_scale\": 0}", "logit_scale", ZO_ERR_FORMAT},
        {CO ", \"logit_scale\": -0.0625}", "logit_scale", ZO_ERR_FORMAT},
        {CO ", \"logit_scale\": 1e-300}", "logit_scale", ZO_ERR_FORMAT},
        {CO ", \"attention_bias\": true}", "attention_bias", ZO_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) refused(bad[i].json, bad[i].key, NULL, bad[i].code);
    load_hf_fixture("c4ai-command-r-plus.json", &c);
    assert_true(c.qk_norm && c.qk_norm_heads && c.n_kv_heads == 8 && c.rope_theta == 7.5e7f);
    /* 256000 x 12288 tied + 64 x (q, k, v, o + gate, up, down + input_layernorm + q_norm [96, 128]
     * + k_norm [8, 128]) + the final norm, summed in Python from the shapes (published: 104B) */
    assert_true(zo_model_params(&c) == 103810674688ull);
    if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());
    /* its q/k norms in the layout: a row a head, the columns in q_proj's
     * rows' order (the file's rotary pairs (2i, 2i + 1) at i and 64 + i) */
    {
        model_layout pl;
        if (model_layout_init(&pl, &c) != ZO_OK) fail_msg("%s", zo_last_error());
        const model_tensor *qn = model_layout_find(&pl, "model.layers.63.self_attn.q_norm.weight"),
                           *kn = model_layout_find(&pl, "model.layers.0.self_attn.k_norm.weight");
        assert_true(qn && kn && qn->ndim == 2 && qn->shape[0] == 96 && qn->shape[1] == 128);
        assert_true(kn->ndim == 2 && kn->shape[0] == 8 && kn->shape[1] == 128);
        assert_true(qn->hf_rope_elems && qn->hf_rope_rows == 128 && qn->hf_rope_period == 128 && kn->hf_rope_elems);
        assert_int_equal(model_tensor_rope_our_row(qn, 128 + 3), 128 + 64 + 1);
        assert_int_equal(model_tensor_rope_file_row(qn, 2 * 128 + 5), 2 * 128 + 10);
        model_layout_free(&pl);
    }
    /* the layout: one norm a layer, no biases, q and k rows interleaved in the file */
    assert_int_equal(zo_model_config_parse(CO ", \"num_key_value_heads\": 1}", "gqa.json", &c), ZO_OK);
    model_layout l;
    if (model_layout_init(&l, &c) != ZO_OK) fail_msg("%s", zo_last_error());
    const model_tensor *q = model_layout_find(&l, "model.layers.1.self_attn.q_proj.weight"),
                       *k = model_layout_find(&l, "model.layers.1.self_attn.k_proj.weight"),
                       *v = model_layout_find(&l, "model.layers.1.self_attn.v_proj.weight");
    assert_true(q && k && v && q->hf_rope_rows == 32 && q->hf_rope_period == 32 && k->hf_rope_rows == 32);
    assert_int_equal(v->hf_rope_rows, 0);
    assert_null(model_layout_find(&l, "model.layers.0.post_attention_layernorm.weight"));
    assert_null(model_layout_find(&l, "model.layers.0.input_layernorm.bias"));
    assert_null(model_layout_find(&l, "lm_head.weight"));
    assert_non_null(model_layout_find(&l, "model.norm.weight"));
    model_layout_free(&l);
#undef CO
    static const char *const presets[] = {"c4ai-command-r-v01", "aya-23-8b"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        preset_round_trip(presets[i], &c, &back);
        assert_string_equal(back.family, "cohere");
        assert_true(back.logit_div == c.logit_div && back.layer_norm && back.layer_norms == 1 && back.parallel_block);
        assert_true(back.rope_theta == c.rope_theta && back.norm_eps == c.norm_eps);
        assert_true(back.tied_embeddings && zo_model_params(&back) == zo_model_params(&c));
    }
}

/* Cohere2 as Cohere2Config reads it: c4ai-command-r7b-12-2024's config
 * (Cohere's layers, a window of 4096 on three layers of four, the fourth
 * global without rotary, logit_scale 0.25), the defaults (window 4096,
 * pattern 4), layer_types alone and with a pattern alike; refused by name:
 * a list the pattern contradicts, a list of no period, a null window, a
 * pattern below 1, use_qk_norm, a head_dim other than hidden / heads; the
 * preset's config.json read back with the same layers. */
static void test_cohere2_config(void **state)
{
    (void)state;
    zo_model_config c, back;
    load_hf_fixture("c4ai-command-r7b-12-2024.json", &c);
    assert_string_equal(c.family, "cohere2");
    assert_true(zo_model_cohere(&c) && zo_model_rot_interleaved(&c) && c.global_nope);
    assert_true(c.arch == ZO_ARCH_LLAMA && c.layer_norm && !c.norm_bias && c.layer_norms == 1 && c.parallel_block);
    assert_true(c.n_kv_heads == 8 && c.head_dim == 128 && c.rope_theta == 50000.0f && c.logit_div == 4.0f);
    assert_true(c.tied_embeddings && !c.qk_norm && c.sliding_window == 4096 && c.window_period == 4);
    for (int l = 0; l < c.n_layers; l++) {
        int local = (l + 1) % 4 != 0;
        assert_int_equal(zo_model_layer_window(&c, l), local ? 4096 : 0);
        assert_int_equal(zo_model_layer_rotary(&c, l), local);
    }
    assert_true(zo_model_params(&c) == 8028033024ull);
    if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());
    /* Cohere's layers keep their rotary everywhere */
    load_hf_fixture("aya-23-8b.json", &back);
    for (int l = 0; l < back.n_layers; l++) assert_true(zo_model_layer_rotary(&back, l));
#define C2 "{\"model_type\": \"cohere2\", \"num_hidden_layers\": 8, \"hidden_size\": 64, " \
           "\"num_attention_heads\": 2, \"intermediate_size\": 96, \"vocab_size\": 100"
    assert_int_equal(zo_model_config_parse(C2 "}", "defaults.json", &c), ZO_OK);
    assert_true(c.sliding_window == 4096 && c.window_period == 4 && c.logit_div == 16.0f && c.rope_theta == 10000.0f);
    assert_true(zo_model_layer_rotary(&c, 2) && !zo_model_layer_rotary(&c, 3) && !zo_model_layer_rotary(&c, 7));
#define LT "\"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\", " \
           "\"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\"]"
    static const char *const alike[] = {C2 ", \"sliding_window\": 16, " LT "}",
                                        C2 ", \"sliding_window\": 16, \"sliding_window_pattern\": 2, " LT "}",
                                        C2 ", \"sliding_window\": 16, \"sliding_window_pattern\": 2}"};
    for (size_t i = 0; i < sizeof alike / sizeof alike[0]; i++) {
        if (zo_model_config_parse(alike[i], "lt.json", &c) != ZO_OK) fail_msg("%s", zo_last_error());
        for (int l = 0; l < 8; l++) {
            assert_int_equal(zo_model_layer_window(&c, l), l % 2 ? 0 : 16);
            assert_int_equal(zo_model_layer_rotary(&c, l), l % 2 == 0);
        }
    }
    static const struct {
        const char *json, *key, *says;
        zo_status code;
    } bad[] = {
        {C2 ", \"sliding_window_pattern\": 4, " LT "}", "layer_types", "sliding_window_pattern 4", ZO_ERR_FORMAT},
        {C2 ", \"layer_types\": [\"sliding_attention\", \"full_attention\", \"full_attention\", "
            "\"sliding_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", "
            "\"full_attention\"]}", "layer_types", "every p-th layer", ZO_ERR_UNSUPPORTED},
        {C2 ", \"sliding_window\": null}", "sliding_window", "no rotary", ZO_ERR_UNSUPPORTED},
        {C2 ", \"sliding_window\": 0}", "sliding_window", "at least 1", ZO_ERR_FORMAT},
        {C2 ", \"sliding_window_pattern\": 0}", "sliding_window_pattern", "at least 1", ZO_ERR_FORMAT},
        {C2 ", \"use_qk_norm\": true}", "use_qk_norm", "q/k norms", ZO_ERR_UNSUPPORTED},
        {C2 ", \"head_dim\": 64}", "head_dim", "hidden_size / num_attention_heads", ZO_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) refused(bad[i].json, bad[i].key, bad[i].says, bad[i].code);
#undef LT
#undef C2
    preset_round_trip("c4ai-command-r7b-12-2024", &c, &back);
    assert_string_equal(back.family, "cohere2");
    assert_true(back.logit_div == c.logit_div && back.global_nope && back.sliding_window == 4096);
    assert_true(back.rope_theta == c.rope_theta && back.tied_embeddings && back.max_seq == 132096);
    for (int l = 0; l < c.n_layers; l++) {
        assert_int_equal(zo_model_layer_window(&back, l), zo_model_layer_window(&c, l));
        assert_int_equal(zo_model_layer_rotary(&back, l), zo_model_layer_rotary(&c, l));
    }
    assert_true(zo_model_params(&back) == zo_model_params(&c));
}

/* SmolLM3 as SmolLM3Config reads it: SmolLM3-3B's config (every fourth
 * layer NoPE, the others turned at 5e6), the preset alike; the defaults
 * (no_rope_layer_interval 4, rope_theta 2e6, 4 kv heads, tied); a list of
 * another period read as it; refused by name: a list of no period, one
 * shorter than the layers, an entry not 0 or 1, an interval below 1, a
 * window on the NoPE layers; the preset's config.json read back with the
 * same layers. */
static void test_smollm3_config(void **state)
{
    (void)state;
    zo_model_config c, p, back;
    load_hf_fixture("smollm3-3b.json", &c);
    assert_string_equal(c.family, "smollm3");
    assert_true(c.arch == ZO_ARCH_LLAMA && c.n_kv_heads == 4 && c.head_dim == 128 && c.rope_theta == 5e6f);
    assert_true(c.tied_embeddings && c.nope_period == 4 && !c.sliding_window && !c.global_nope);
    for (int l = 0; l < c.n_layers; l++) assert_int_equal(zo_model_layer_rotary(&c, l), (l + 1) % 4 != 0);
    if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());
    assert_int_equal(zo_model_preset_find("smollm3-3b", &p), ZO_OK);
    assert_same_shape(&p, &c);
#define S3 "{\"model_type\": \"smollm3\", \"num_hidden_layers\": 6, \"hidden_size\": 64, " \
           "\"num_attention_heads\": 8, \"intermediate_size\": 96, \"vocab_size\": 100"
    assert_int_equal(zo_model_config_parse(S3 "}", "defaults.json", &c), ZO_OK);
    assert_true(c.nope_period == 4 && c.rope_theta == 2e6f && c.n_kv_heads == 4 && c.tied_embeddings);
    assert_true(zo_model_layer_rotary(&c, 2) && !zo_model_layer_rotary(&c, 3) && zo_model_layer_rotary(&c, 5));
    assert_int_equal(zo_model_config_parse(S3 ", \"no_rope_layers\": [1, 0, 1, 0, 1, 0, 1]}", "two.json", &c), ZO_OK);
    for (int l = 0; l < 6; l++) assert_int_equal(zo_model_layer_rotary(&c, l), l % 2 == 0);
    assert_int_equal(zo_model_config_parse(S3 ", \"no_rope_layers\": [1, 1, 1, 1, 1, 1]}", "all.json", &c), ZO_OK);
    for (int l = 0; l < 6; l++) assert_true(zo_model_layer_rotary(&c, l));
    static const struct {
        const char *json, *key, *says;
        zo_status code;
    } bad[] = {
        {S3 ", \"no_rope_layers\": [1, 0, 1, 1, 0, 1]}", "no_rope_layers", "every n-th", ZO_ERR_UNSUPPORTED},
        {S3 ", \"no_rope_layers\": [1, 1, 1, 0]}", "no_rope_layers", "each of the 6 layers", ZO_ERR_UNSUPPORTED},
        {S3 ", \"no_rope_layers\": [1, 1, 2, 1, 1, 1]}", "no_rope_layers", "0 or 1", ZO_ERR_UNSUPPORTED},
        {S3 ", \"no_rope_layer_interval\": 0}", "no_rope_layer_interval", "at least 1", ZO_ERR_FORMAT},
        {S3 ", \"use_sliding_window\": true, \"sliding_window\": 4096}", "use_sliding_window", "NoPE",
         ZO_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) refused(bad[i].json, bad[i].key, bad[i].says, bad[i].code);
#undef S3
    preset_round_trip("smollm3-3b", &c, &back);
    assert_same_shape(&back, &c);
}

/* StarCoder2 as Starcoder2Config reads it: starcoder2-3b's config (GPT
 * layers with LLaMA's rotary attention, GQA, biases, a window of 4096 on
 * every layer, tied); the defaults (2 kv heads, use_bias, no window, tied,
 * gelu_pytorch_tanh); use_bias false; the layout's names and biases; the
 * config.json written for it read back as the same model. */
static void test_starcoder2_config(void **state)
{
    (void)state;
    zo_model_config c, back;
    load_hf_fixture("starcoder2-3b.json", &c);
    assert_string_equal(c.family, "starcoder2");
    assert_true(zo_model_starcoder2(&c) && c.arch == ZO_ARCH_GPT && c.pos == ZO_POS_ROTARY && !c.parallel_block);
    assert_true(c.n_kv_heads == 2 && c.head_dim == 128 && c.attn_bias && c.out_bias && c.norm_bias);
    assert_true(c.tied_embeddings && c.sliding_window == 4096 && c.max_seq == 16384 && c.norm_eps == 1e-5f);
    assert_string_equal(c.act, "gelu_pytorch_tanh");
    for (int l = 0; l < c.n_layers; l++) {
        assert_int_equal(zo_model_layer_window(&c, l), 4096);
        assert_true(zo_model_layer_rotary(&c, l));
    }
    if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());
    model_layout l;
    if (model_layout_init(&l, &c)) fail_msg("%s", zo_last_error());
    static const char *const names[] = {"model.embed_tokens.weight", "model.layers.0.input_layernorm.bias",
                                        "model.layers.0.self_attn.k_proj.bias", "model.layers.0.self_attn.o_proj.bias",
                                        "model.layers.29.post_attention_layernorm.weight",
                                        "model.layers.29.mlp.c_fc.bias", "model.layers.29.mlp.c_proj.weight",
                                        "model.norm.bias"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!model_layout_find(&l, names[i])) fail_msg("no %s", names[i]);
    assert_null(model_layout_find(&l, "lm_head.weight")); /* tied */
    assert_int_equal(model_layout_find(&l, "model.layers.0.self_attn.k_proj.weight")->shape[0], 256);
    model_layout_free(&l);
#define SC2 "{\"model_type\": \"starcoder2\", \"num_hidden_layers\": 2, \"hidden_size\": 64, " \
            "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 100"
    assert_int_equal(zo_model_config_parse(SC2 "}", "defaults.json", &c), ZO_OK);
    assert_true(c.n_kv_heads == 2 && c.attn_bias && c.out_bias && c.tied_embeddings && !c.sliding_window);
    assert_true(c.rope_theta == 10000.0f && c.max_seq == 4096 && !strcmp(c.act, "gelu_pytorch_tanh"));
    assert_int_equal(zo_model_config_parse(SC2 ", \"use_bias\": false}", "nobias.json", &c), ZO_OK);
    assert_true(!c.attn_bias && !c.out_bias && c.norm_bias);
    if (model_layout_init(&l, &c)) fail_msg("%s", zo_last_error());
    assert_null(model_layout_find(&l, "model.layers.0.self_attn.q_proj.bias"));
    assert_null(model_layout_find(&l, "model.layers.0.mlp.c_fc.bias"));
    assert_non_null(model_layout_find(&l, "model.layers.0.input_layernorm.bias"));
    model_layout_free(&l);
#undef SC2
    load_hf_fixture("starcoder2-3b.json", &c);
    cJSON *o = NULL;
    assert_int_equal(model_hf_config(&c, ZO_DTYPE_BF16, &o), ZO_OK);
    char *text = cJSON_Print(o);
    assert_non_null(strstr(text, "Starcoder2ForCausalLM"));
    if (zo_model_config_parse(text, "written.json", &back) != ZO_OK) fail_msg("%s", zo_last_error());
    free(text);
    cJSON_Delete(o);
    assert_same_shape(&back, &c);
    assert_true(back.attn_bias && back.sliding_window == 4096 && back.norm_eps == c.norm_eps);
}

/* ERNIE 4.5 and Seed-OSS: configs read (ERNIE's rotary pairs interleaved,
 * its biases under use_bias on every linear layer; Seed-OSS's on q, k and
 * v alone), the layout's biases, and the config.json written for each read
 * back as the same model, a head_dim other than their default of 128
 * included. */
static void test_ernie_seed_oss_config(void **state)
{
    (void)state;
    static const char *const given[2] = {
        "{\"model_type\": \"ernie4_5\", \"num_hidden_layers\": 2, \"hidden_size\": 256, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 2, \"head_dim\": 64, \"intermediate_size\": 384, \"vocab_size\": 100, "
        "\"use_bias\": true}",
        "{\"model_type\": \"seed_oss\", \"num_hidden_layers\": 2, \"hidden_size\": 256, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 2, \"head_dim\": 64, \"intermediate_size\": 384, \"vocab_size\": 100}"};
    for (int k = 0; k < 2; k++) {
        zo_model_config c, back;
        if (zo_model_config_parse(given[k], "given.json", &c) != ZO_OK) fail_msg("%s", zo_last_error());
        assert_true(c.attn_bias && c.out_bias == !k && c.head_dim == 64);
        assert_int_equal(zo_model_rot_interleaved(&c), !k);
        assert_true(c.tied_embeddings == !k && c.norm_eps == (k ? 1e-6f : 1e-5f));
        model_layout l;
        if (model_layout_init(&l, &c)) fail_msg("%s", zo_last_error());
        assert_non_null(model_layout_find(&l, "model.layers.1.self_attn.k_proj.bias"));
        assert_int_equal(model_layout_find(&l, "model.layers.1.self_attn.o_proj.bias") == NULL, k);
        assert_int_equal(model_layout_find(&l, "model.layers.1.mlp.down_proj.bias") == NULL, k);
        model_layout_free(&l);
        cJSON *o = NULL;
        assert_int_equal(model_hf_config(&c, ZO_DTYPE_BF16, &o), ZO_OK);
        char *text = cJSON_Print(o);
        assert_non_null(strstr(text, k ? "SeedOssForCausalLM" : "Ernie4_5ForCausalLM"));
        if (zo_model_config_parse(text, "written.json", &back) != ZO_OK) fail_msg("%s", zo_last_error());
        free(text);
        cJSON_Delete(o);
        assert_same_shape(&back, &c);
        assert_true(back.attn_bias == c.attn_bias && back.out_bias == c.out_bias);
    }
}

/* EXAONE 4.0 as Exaone4Config reads it: the 32B (three layers of four over
 * a window of 4096, turned with llama3's scaling, the fourth global without
 * rotary; output norms alone, per-head q/k norms, untied) and the 1.2B (no
 * window: every layer global and turned, tied); their tensors under the
 * checkpoints' names; the defaults (a window of 4096 over three layers of
 * four, kv heads as the heads, eps 1e-5, 2048 positions, untied); the
 * pattern as a number or "L...LG"; every layer "sliding_attention" (all
 * turned) or "full_attention" (none); refused by name: another pattern
 * string, a pattern string the layers do not end, a null pattern without
 * layer_types, a window below 1, a layer list of no period; saved configs
 * read back with the same layers. */
static void test_exaone4_config(void **state)
{
    (void)state;
    zo_model_config c, back;
    load_hf_fixture("exaone-4.0-32b.json", &c);
    assert_string_equal(c.family, "exaone4");
    assert_true(c.arch == ZO_ARCH_LLAMA && c.n_kv_heads == 8 && c.head_dim == 128 && c.rope_theta == 1e6f);
    assert_true(c.qk_norm && !c.qk_norm_full && !c.qk_norm_heads && c.post_norms_only && c.layer_norms == 2);
    assert_true(!zo_model_pre_norms(&c) && zo_model_post_norms(&c) && !c.tied_embeddings && c.norm_eps == 1e-5f);
    assert_true(c.sliding_window == 4096 && c.window_period == 4 && c.global_nope && c.max_seq == 131072);
    assert_string_equal(c.rope_scaling, "llama3");
    assert_true(c.rope_factor == 16.0f && c.rope_original_max == 8192);
    for (int l = 0; l < c.n_layers; l++) {
        int local = (l + 1) % 4 != 0;
        assert_int_equal(zo_model_layer_window(&c, l), local ? 4096 : 0);
        assert_int_equal(zo_model_layer_rotary(&c, l), local);
    }
    if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());
    model_layout lay;
    assert_int_equal(model_layout_init(&lay, &c), ZO_OK);
    static const char *const has[] = {"model.layers.3.self_attn.q_norm.weight", "model.layers.3.self_attn.k_norm.weight",
                                      "model.layers.3.post_attention_layernorm.weight",
                                      "model.layers.3.post_feedforward_layernorm.weight", "lm_head.weight"};
    for (size_t i = 0; i < sizeof has / sizeof has[0]; i++) {
        const model_tensor *t = model_layout_find(&lay, has[i]);
        if (!t) fail_msg("no %s", has[i]);
        if (i < 2) assert_int_equal(t->shape[0], 128);
    }
    assert_null(model_layout_find(&lay, "model.layers.3.input_layernorm.weight"));
    assert_null(model_layout_find(&lay, "model.layers.3.pre_feedforward_layernorm.weight"));
    model_layout_free(&lay);
    written_back(&c, &back);
    assert_same_shape(&back, &c);
    assert_true(back.post_norms_only && back.qk_norm && !back.qk_norm_full && back.global_nope);
    load_hf_fixture("exaone-4.0-1.2b.json", &c);
    assert_true(c.n_layers == 30 && c.head_dim == 64 && c.n_kv_heads == 8 && c.tied_embeddings);
    assert_true(!c.sliding_window && !c.global_nope && c.post_norms_only && c.qk_norm);
    for (int l = 0; l < c.n_layers; l++) {
        assert_int_equal(zo_model_layer_window(&c, l), 0);
        assert_true(zo_model_layer_rotary(&c, l));
    }
    if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());
    written_back(&c, &back);
    assert_same_shape(&back, &c);
    assert_true(!back.global_nope && back.tied_embeddings);
#define E4 "{\"model_type\": \"exaone4\", \"num_hidden_layers\": 8, \"hidden_size\": 64, " \
           "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 100"
    assert_int_equal(zo_model_config_parse(E4 "}", "defaults.json", &c), ZO_OK);
    assert_true(c.sliding_window == 4096 && c.window_period == 4 && c.global_nope && c.n_kv_heads == 4);
    assert_true(c.head_dim == 16 && c.norm_eps == 1e-5f && c.rope_theta == 10000.0f && c.max_seq == 2048);
    assert_true(!c.tied_embeddings && !c.rope_scaling[0]);
    assert_true(zo_model_layer_rotary(&c, 2) && !zo_model_layer_rotary(&c, 3) && !zo_model_layer_rotary(&c, 7));
    static const char *const alike[] = {E4 ", \"sliding_window\": 16, \"sliding_window_pattern\": 2}",
                                        E4 ", \"sliding_window\": 16, \"sliding_window_pattern\": \"LG\"}",
                                        E4 ", \"sliding_window\": 16, \"sliding_window_pattern\": \"LLLG\", "
                                           "\"layer_types\": [\"sliding_attention\", \"full_attention\", "
                                           "\"sliding_attention\", \"full_attention\", \"sliding_attention\", "
                                           "\"full_attention\", \"sliding_attention\", \"full_attention\"]}"};
    for (size_t i = 0; i < sizeof alike / sizeof alike[0]; i++) {
        if (zo_model_config_parse(alike[i], "pattern.json", &c) != ZO_OK) fail_msg("%s", zo_last_error());
        for (int l = 0; l < 8; l++) {
            assert_int_equal(zo_model_layer_window(&c, l), l % 2 ? 0 : 16);
            assert_int_equal(zo_model_layer_rotary(&c, l), l % 2 == 0);
        }
        written_back(&c, &back);
        assert_same_shape(&back, &c);
    }
#define ALL(kind) "[\"" kind "\", \"" kind "\", \"" kind "\", \"" kind "\", \"" kind "\", \"" kind "\", \"" \
                  kind "\", \"" kind "\"]"
    assert_int_equal(zo_model_config_parse(E4 ", \"layer_types\": " ALL("sliding_attention") "}", "s.json", &c), ZO_OK);
    for (int l = 0; l < 8; l++) assert_true(zo_model_layer_window(&c, l) == 4096 && zo_model_layer_rotary(&c, l));
    written_back(&c, &back);
    assert_same_shape(&back, &c);
    assert_int_equal(zo_model_config_parse(E4 ", \"layer_types\": " ALL("full_attention") "}", "f.json", &c), ZO_OK);
    for (int l = 0; l < 8; l++) assert_true(!zo_model_layer_window(&c, l) && !zo_model_layer_rotary(&c, l));
    written_back(&c, &back);
    assert_same_shape(&back, &c);
    assert_int_equal(zo_model_config_parse(E4 ", \"sliding_window\": null, \"sliding_window_pattern\": \"LLLG\"}",
                                           "null.json", &c), ZO_OK);
    for (int l = 0; l < 8; l++) assert_true(!zo_model_layer_window(&c, l) && zo_model_layer_rotary(&c, l));
#undef ALL
    static const refusal bad[] = {
        {E4 ", \"sliding_window_pattern\": \"LGLL\"}", "sliding_window_pattern", "\"LLLG\"", ZO_ERR_UNSUPPORTED},
        {E4 ", \"sliding_window_pattern\": \"LLG\"}", "sliding_window_pattern", "over 8 layers", ZO_ERR_UNSUPPORTED},
        {E4 ", \"sliding_window_pattern\": null}", "sliding_window_pattern", "layer_types", ZO_ERR_FORMAT},
        {E4 ", \"sliding_window_pattern\": 0}", "sliding_window_pattern", "at least 1", ZO_ERR_FORMAT},
        {E4 ", \"sliding_window\": 0}", "sliding_window", "at least 1", ZO_ERR_FORMAT},
        {E4 ", \"layer_types\": [\"sliding_attention\", \"full_attention\", \"full_attention\", "
            "\"sliding_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", "
            "\"full_attention\"]}", "layer_types", "every p-th layer", ZO_ERR_UNSUPPORTED},
        {E4 ", \"attention_bias\": true}", "attention_bias", "biases", ZO_ERR_UNSUPPORTED},
    };
    refused_each(bad, sizeof bad / sizeof bad[0]);
#undef E4
}

/* Granite as GraniteConfig reads it: granite-3.1-8b's and -2b's multipliers
 * (12, 1 / head_dim, 0.22, 16 and 8), the runtime's; absent, each 1;
 * refused naming the key when not a finite number > 0 (as a float too);
 * each preset's config.json read back with the same four. */
static void test_granite_config(void **state)
{
    (void)state;
    zo_model_config c, back;
    load_hf_fixture("granite-3.1-8b.json", &c);
    assert_string_equal(c.family, "granite");
    assert_true(c.embed_mult == 12.0f && c.attn_mult == 0.0078125f && c.resid_mult == 0.22f && c.logit_div == 16.0f);
    assert_true(c.tied_embeddings && c.n_kv_heads == 8 && c.head_dim == 128 && c.rope_theta == 1e7f);
    if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());
    load_hf_fixture("granite-3.1-2b.json", &c);
    assert_true(c.attn_mult == 0.015625f && c.logit_div == 8.0f && c.head_dim == 64);
#define GR "{\"model_type\": \"granite\", \"num_hidden_layers\": 2, \"hidden_size\": 64, " \
           "\"num_attention_heads\": 2, \"intermediate_size\": 96, \"vocab_size\": 100"
    assert_int_equal(zo_model_config_parse(GR "}", "defaults.json", &c), ZO_OK);
    assert_true(c.embed_mult == 1.0f && c.attn_mult == 1.0f && c.resid_mult == 1.0f && c.logit_div == 1.0f);
    assert_false(c.tied_embeddings); /* GraniteConfig's default */
    static const struct {
        const char *json, *key;
    } bad[] = {
        {GR ", \"embedding_multiplier\": 0}", "embedding_multiplier"},
        {GR ", \"attention_multiplier\": -0.01}", "attention_multiplier"},
        {GR ", \"residual_multiplier\": 1e39}", "residual_multiplier"},
        {GR ", \"logits_scaling\": \"16\"}", "logits_scaling"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) refused(bad[i].json, bad[i].key, NULL, ZO_ERR_FORMAT);
    /* biases on the projections (attention_bias, mlp_bias) are LLaMA's: refused by name */
    assert_int_equal(zo_model_config_parse(GR ", \"mlp_bias\": true}", "bias.json", &c), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "mlp_bias"));
#undef GR
    static const char *const presets[] = {"granite-3.1-2b", "granite-3.1-8b"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        preset_round_trip(presets[i], &c, &back);
        assert_string_equal(back.family, "granite");
        assert_true(back.embed_mult == c.embed_mult && back.attn_mult == c.attn_mult &&
                    back.resid_mult == c.resid_mult && back.logit_div == c.logit_div);
        assert_true(back.tied_embeddings && zo_model_params(&back) == zo_model_params(&c));
    }
}

/* Granite-MoE as GraniteMoeConfig reads it: granite-3.0-1b-a400m's and
 * -3b-a800m's (32 and 40 experts of 512, 8 a token, renormalized; Granite's
 * four multipliers; tied), the presets of the same; absent keys at
 * GraniteMoeConfig's defaults (8 experts, 2 a token, every head a kv head,
 * untied, multipliers 1, no balance loss unless output_router_logits, its
 * coefficient 0.001); its fused experts sliced to and from expert e's gate,
 * up and down; LoRA on the attention only (an MLP target refused). */
/* Block buffers of layout l, every element distinct (100000 block +
 * element), saved in F32 as tmpdir/name (path: its path); blocks_free frees them. */
static float **numbered_blocks_saved(const model_layout *l, const char *name, char *path, size_t cap)
{
    float **blocks = calloc((size_t)l->n_blocks, sizeof *blocks);
    assert_non_null(blocks);
    for (int b = 0; b < l->n_blocks; b++) {
        blocks[b] = malloc((l->block_numel[b] + 1) * sizeof(float));
        assert_non_null(blocks[b]);
        for (size_t i = 0; i < l->block_numel[b]; i++) blocks[b][i] = (float)(100000 * b + i);
    }
    snprintf(path, cap, "%s/%s", tmpdir, name);
    if (model_save(path, l, (const void *const *)blocks, ZO_DTYPE_F32, ZO_DTYPE_F32)) fail_msg("%s", zo_last_error());
    return blocks;
}

static void blocks_free(const model_layout *l, float **blocks)
{
    for (int b = 0; b < l->n_blocks; b++) free(blocks[b]);
    free(blocks);
}

/* gpt-oss's config.json written from its shape (model_hf_config: what a
 * saved folder holds when the model came without one) reads back as the same
 * model: GptOssForCausalLM, the shape, windows and yarn (assert_same_shape),
 * the experts, the clamp, the biases and sinks, the balance loss's keys. */
static void test_gpt_oss_config_written(void **state)
{
    (void)state;
    const char *const names[] = {"gpt-oss-20b.json", "gpt-oss-120b.json"};
    for (int i = 0; i < 2; i++) {
        zo_model_config c, back;
        load_hf_fixture(names[i], &c);
        cJSON *js = NULL;
        assert_int_equal(model_hf_config(&c, ZO_DTYPE_BF16, &js), ZO_OK);
        const cJSON *arch = cJSON_GetArrayItem(cJSON_GetObjectItem(js, "architectures"), 0);
        assert_string_equal(cJSON_GetStringValue(arch), "GptOssForCausalLM");
        cJSON_Delete(js);
        written_back(&c, &back);
        assert_same_shape(&back, &c);
        assert_true(back.attn_sinks && back.attn_bias == c.attn_bias && back.out_bias == c.out_bias);
        assert_true(back.moe.experts == c.moe.experts && back.moe.top_k == c.moe.top_k &&
                    back.moe.expert_ffn == c.moe.expert_ffn && back.moe.expert_bias && back.moe.router_logit_bias &&
                    back.moe.glu_limit == c.moe.glu_limit && back.moe.glu_alpha == c.moe.glu_alpha &&
                    back.moe.norm_topk == c.moe.norm_topk && back.moe.aux_loss == c.moe.aux_loss &&
                    back.moe.aux_coef == c.moe.aux_coef);
        assert_true(back.rope_truncate == c.rope_truncate && back.rope_beta_fast == c.rope_beta_fast &&
                    back.rope_attention_factor == c.rope_attention_factor && back.head_dim == c.head_dim);
    }
}

/* gpt-oss's tensors: its experts fused over the experts in the file,
 * gate_up_proj [E, h, 2 f] stored [in, out] with gate and up interleaved
 * (column 2j gate row j, 2j + 1 up row j), gate_up_proj_bias [E, 2 f]
 * likewise, down_proj [E, f, h] stored [in, out], down_proj_bias [E, h]; the
 * router's bias, the sinks. Saved from distinct values in every element,
 * the file holds each where the index arithmetic here says; loaded back,
 * the blocks are the same, whole and in a window of experts; the layout
 * counts what memplan counts, and the transformer's check refuses it. */
static void test_gpt_oss_layout(void **state)
{
    (void)state;
    zo_model_config c;
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"gpt_oss\", \"num_hidden_layers\": 2, "
                                           "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                                           "\"num_key_value_heads\": 2, \"head_dim\": 16, "
                                           "\"intermediate_size\": 32, \"num_local_experts\": 4, "
                                           "\"num_experts_per_tok\": 2, \"vocab_size\": 96}",
                                           "gpt_oss.json", &c),
                     ZO_OK);
    model_layout l;
    if (model_layout_init(&l, &c)) fail_msg("%s", zo_last_error());
    assert_int_equal(l.total_numel, zo_model_params(&c));
    const size_t h = 64, f = 32, E = 4, S = model_layout_expert_stride(&l);
    assert_int_equal(S, 3 * h * f + 2 * f + h);
    const int blk = model_layout_layer_block(1);
    const model_view *gu = model_layout_view(&l, blk, MODEL_ROLE_EXPERT_GATE_UP_W);
    const model_view *g = model_layout_view(&l, blk, MODEL_ROLE_EXPERT_GATE_W);
    const model_view *u = model_layout_view(&l, blk, MODEL_ROLE_EXPERT_UP_W);
    const model_view *gb = model_layout_view(&l, blk, MODEL_ROLE_EXPERT_GATE_B);
    const model_view *ub = model_layout_view(&l, blk, MODEL_ROLE_EXPERT_UP_B);
    const model_view *d = model_layout_view(&l, blk, MODEL_ROLE_EXPERT_DOWN_W);
    const model_view *db = model_layout_view(&l, blk, MODEL_ROLE_EXPERT_DOWN_B);
    assert_true(gu && g && u && gb && ub && d && db);
    assert_true(g->offset == gu->offset && u->offset == gu->offset + f * h && g->numel == f * h && u->numel == f * h);
    assert_true(ub->offset == gb->offset + f && db->offset == d->offset + h * f);
    assert_non_null(model_layout_view(&l, blk, MODEL_ROLE_SINKS));
    assert_non_null(model_layout_view(&l, blk, MODEL_ROLE_ROUTER_B));
    /* the layout and the transformer take it alike (one check) */
    if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());

    char path[512];
    float **blocks = numbered_blocks_saved(&l, "gpt_oss.safetensors", path, sizeof path);
    model_st_file sf;
    assert_int_equal(model_st_open(&sf, path), ZO_OK);
    static const char *const names[4] = {"gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"};
    const size_t dims[4][2] = {{h, 2 * f}, {2 * f, 0}, {f, h}, {h, 0}};
    float *x[4];
    for (int k = 0; k < 4; k++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.1.mlp.experts.%s", names[k]);
        const model_st_tensor *t = model_st_find(&sf, name);
        if (!t) fail_msg("%s: missing", name);
        assert_int_equal(t->ndim, dims[k][1] ? 3 : 2);
        assert_true((size_t)t->shape[0] == E && (size_t)t->shape[1] == dims[k][0]);
        if (dims[k][1]) assert_int_equal((size_t)t->shape[2], dims[k][1]);
        assert_non_null(x[k] = malloc((size_t)t->numel * 4));
        assert_int_equal(model_st_read(&sf, t, x[k], ZO_DTYPE_F32, 0), ZO_OK);
    }
    assert_non_null(model_st_find(&sf, "model.layers.1.self_attn.sinks"));
    assert_non_null(model_st_find(&sf, "model.layers.1.mlp.router.bias"));
    /* 17 a layer: two norms, q, k, v, o and their biases, the sinks, the router and its bias, the four fused */
    assert_int_equal(sf.n_tensors, 2 * 17 + 3);
    const float *x0 = blocks[blk] + gu->offset;
    for (size_t e = 0; e < E; e++) {
        const float *ex = x0 + e * S, *bias = ex + 2 * f * h, *dw = bias + 2 * f, *dbias = dw + h * f;
        for (size_t j = 0; j < h; j++)
            for (size_t col = 0; col < 2 * f; col++) { /* gate row i at column 2i, up row i at 2i + 1 */
                size_t row = col / 2 + (col % 2) * f;
                if (x[0][(e * h + j) * 2 * f + col] != ex[row * h + j]) fail_msg("gate_up_proj[%zu][%zu][%zu]", e, j, col);
            }
        for (size_t col = 0; col < 2 * f; col++)
            if (x[1][e * 2 * f + col] != bias[col / 2 + (col % 2) * f]) fail_msg("gate_up_proj_bias[%zu][%zu]", e, col);
        for (size_t r = 0; r < f; r++)
            for (size_t col = 0; col < h; col++) /* down [f, h] in the file, ours [h, f] */
                if (x[2][(e * f + r) * h + col] != dw[col * f + r]) fail_msg("down_proj[%zu][%zu][%zu]", e, r, col);
        for (size_t col = 0; col < h; col++)
            if (x[3][e * h + col] != dbias[col]) fail_msg("down_proj_bias[%zu][%zu]", e, col);
    }
    for (int k = 0; k < 4; k++) free(x[k]);
    model_st_close(&sf);
    /* loaded back: the same blocks; a window of experts 1..2 their slices */
    for (int win = 0; win <= 1; win++) {
        model_layout wl;
        assert_int_equal(win ? model_layout_init_experts(&wl, &c, 1, 2) : model_layout_init(&wl, &c), ZO_OK);
        float **wb = calloc((size_t)wl.n_blocks, sizeof *wb);
        assert_non_null(wb);
        for (int b = 0; b < wl.n_blocks; b++) assert_non_null(wb[b] = calloc(wl.block_numel[b] + 1, sizeof(float)));
        if (model_load_path(path, &wl, (void *const *)wb, ZO_DTYPE_F32, MODEL_LOAD_STRICT, NULL))
            fail_msg("%s", zo_last_error());
        if (win) {
            const float *w0 = wb[blk] + model_layout_view(&wl, blk, MODEL_ROLE_EXPERT_GATE_UP_W)->offset;
            assert_memory_equal(w0, x0 + S, 2 * S * sizeof(float));
        } else {
            for (int b = 0; b < l.n_blocks; b++) assert_memory_equal(wb[b], blocks[b], l.block_numel[b] * sizeof(float));
        }
        blocks_free(&wl, wb);
        model_layout_free(&wl);
    }
    blocks_free(&l, blocks);
    model_layout_free(&l);
}

static void test_granitemoe_config(void **state)
{
    (void)state;
    zo_model_config c, back;
    static const struct {
        const char *file, *preset;
        int experts;
    } pub[] = {{"granite-3.0-1b-a400m.json", "granite-3.0-1b-a400m", 32},
               {"granite-3.0-3b-a800m.json", "granite-3.0-3b-a800m", 40}};
    for (size_t i = 0; i < sizeof pub / sizeof pub[0]; i++) {
        load_hf_fixture(pub[i].file, &c);
        assert_string_equal(c.family, "granitemoe");
        assert_true(c.moe.experts == pub[i].experts && c.moe.top_k == 8 && c.moe.expert_ffn == 512 &&
                    c.ffn == 512 && c.moe.norm_topk && !c.moe.shared_ffn && !c.moe.aux_loss);
        assert_true(c.embed_mult == 12.0f && c.attn_mult == 0.015625f && c.resid_mult == 0.22f && c.logit_div == 6.0f);
        assert_true(c.tied_embeddings && c.n_kv_heads == 8 && c.head_dim == 64 && c.norm_eps == 1e-6f);
        if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());
        assert_int_equal(zo_model_preset_find(pub[i].preset, &back), ZO_OK);
        assert_int_equal(zo_model_params(&back), zo_model_params(&c));
        assert_true(back.moe.experts == c.moe.experts && back.moe.top_k == c.moe.top_k &&
                    back.moe.norm_topk && back.resid_mult == c.resid_mult && back.logit_div == c.logit_div &&
                    back.attn_mult == c.attn_mult && back.embed_mult == c.embed_mult &&
                    !strcmp(back.family, "granitemoe"));
    }
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"granitemoe\", \"num_hidden_layers\": 2, "
                                           "\"hidden_size\": 64, \"num_attention_heads\": 2, "
                                           "\"intermediate_size\": 96, \"vocab_size\": 100}",
                                           "defaults.json", &back),
                     ZO_OK);
    assert_true(back.moe.experts == 8 && back.moe.top_k == 2 && back.moe.expert_ffn == 96 && back.n_kv_heads == 2);
    assert_true(back.embed_mult == 1.0f && back.attn_mult == 1.0f && back.resid_mult == 1.0f && back.logit_div == 1.0f);
    assert_true(!back.tied_embeddings && !back.moe.aux_loss && back.moe.aux_coef == 0.001f);
    /* expert e's gate is rows [0, f) of input_linear[e], its up rows [f, 2f), its down output_linear[e] */
    model_layout l;
    assert_int_equal(model_layout_init(&l, &back), ZO_OK);
    const int64_t h = 64, f = 96;
    int seen = 0;
    for (int i = 0; i < l.n_tensors; i++) {
        const model_tensor *t = &l.tensors[i];
        if (!t->hf_fused[0]) continue;
        size_t e = (size_t)((t->offset - model_layout_view(&l, t->block, MODEL_ROLE_EXPERT_GATE_W)->offset) /
                            model_layout_expert_stride(&l));
        size_t at = t->role == MODEL_ROLE_EXPERT_GATE_W ? e * 2 * f * h
                    : t->role == MODEL_ROLE_EXPERT_UP_W ? e * 2 * f * h + f * h
                                                        : e * h * f;
        assert_int_equal(t->hf_fused_at, at);
        assert_int_equal(t->hf_fused[0], 8);
        assert_int_equal(t->hf_fused[1], t->role == MODEL_ROLE_EXPERT_DOWN_W ? h : 2 * f);
        seen++;
    }
    assert_int_equal(seen, 2 * 8 * 3);
    /* saved: the fused tensors [8, 192, 64] and [8, 64, 96] holding expert e's
     * gate, up and down where the file has them (written here from plain
     * index arithmetic); read back into a window of experts 2..5, each
     * expert's slices as the whole layout's */
    char path[512];
    float **blocks = numbered_blocks_saved(&l, "granitemoe.safetensors", path, sizeof path);
    model_st_file sf;
    assert_int_equal(model_st_open(&sf, path), ZO_OK);
    const model_st_tensor *in = model_st_find(&sf, "model.layers.1.block_sparse_moe.input_linear.weight");
    const model_st_tensor *out = model_st_find(&sf, "model.layers.1.block_sparse_moe.output_linear.weight");
    assert_true(in && in->ndim == 3 && in->shape[0] == 8 && in->shape[1] == 2 * f && in->shape[2] == h);
    assert_true(out && out->ndim == 3 && out->shape[0] == 8 && out->shape[1] == h && out->shape[2] == f);
    assert_int_equal(sf.n_tensors, 2 * 9 + 3); /* 9 a layer (two norms, q, k, v, o, the router, the two fused); untied */
    float *win = malloc((size_t)in->numel * 4), *wout = malloc((size_t)out->numel * 4);
    assert_non_null(win);
    assert_non_null(wout);
    assert_int_equal(model_st_read(&sf, in, win, ZO_DTYPE_F32, 0), ZO_OK);
    assert_int_equal(model_st_read(&sf, out, wout, ZO_DTYPE_F32, 0), ZO_OK);
    const int blk = model_layout_layer_block(1);
    const float *x0 = blocks[blk] + model_layout_view(&l, blk, MODEL_ROLE_EXPERT_GATE_W)->offset;
    const size_t S = model_layout_expert_stride(&l);
    for (size_t e = 0; e < 8; e++)
        for (size_t r = 0; r < (size_t)(2 * f); r++)
            for (size_t k = 0; k < (size_t)h; k++) /* gate rows, then up rows: both [f, h] from the expert's start */
                if (win[(e * 2 * f + r) * h + k] != x0[e * S + r * h + k]) fail_msg("input_linear[%zu][%zu][%zu]", e, r, k);
    for (size_t e = 0; e < 8; e++)
        for (size_t i = 0; i < (size_t)(h * f); i++) /* down after gate and up */
            if (wout[e * h * f + i] != x0[e * S + 2 * f * h + i]) fail_msg("output_linear[%zu] element %zu", e, i);
    free(win);
    free(wout);
    model_st_close(&sf);
    model_layout wl;
    assert_int_equal(model_layout_init_experts(&wl, &back, 2, 4), ZO_OK);
    float **wb = calloc((size_t)wl.n_blocks, sizeof *wb);
    assert_non_null(wb);
    for (int b = 0; b < wl.n_blocks; b++) assert_non_null(wb[b] = calloc(wl.block_numel[b] + 1, sizeof(float)));
    if (model_load_path(path, &wl, (void *const *)wb, ZO_DTYPE_F32, MODEL_LOAD_STRICT, NULL))
        fail_msg("%s", zo_last_error());
    const float *w0 = wb[blk] + model_layout_view(&wl, blk, MODEL_ROLE_EXPERT_GATE_W)->offset;
    assert_memory_equal(w0, x0 + 2 * S, 4 * S * sizeof(float));
    /* a window is saved whole only (the gather's job): refused, naming the tensor */
    snprintf(path, sizeof path, "%s/window.safetensors", tmpdir);
    assert_int_equal(model_save(path, &wl, (const void *const *)wb, ZO_DTYPE_F32, ZO_DTYPE_F32), ZO_ERR_INVALID);
    printf("  refused: %s\n", zo_last_error());
    assert_non_null(strstr(zo_last_error(), "input_linear.weight\" is written whole only"));
    blocks_free(&wl, wb);
    model_layout_free(&wl);
    blocks_free(&l, blocks);
    model_layout_free(&l);
    /* LoRA: the attention's four (all-linear is those); an MLP target is refused, naming why */
    zo_lora_config lc = {.r = 4, .alpha = 8.0f, .targets = ZO_LORA_ALL_LINEAR};
    assert_int_equal(zo_lora_check(&back, &lc), ZO_OK);
    zo_lora_module mods[ZO_LORA_MAX_MODULES];
    assert_int_equal(zo_lora_layer_modules(&back, ZO_LORA_ALL_LINEAR, mods), 4);
    lc.targets = ZO_LORA_Q | ZO_LORA_UP;
    assert_int_equal(zo_lora_check(&back, &lc), ZO_ERR_INVALID);
    printf("  refused: %s\n", zo_last_error());
    assert_non_null(strstr(zo_last_error(), "not Linear modules"));
}

/* Gemma-3's text model as Gemma3TextConfig reads it: gemma-3-1b's config
 * (q/k norms, four norms, no caps, windows of 512 on five layers of six
 * with base 10000, rope_theta 1e6 on the others); the defaults (window
 * 4096, pattern 6, rope_theta 1e6); each preset's config.json read back
 * with the same keys (4b and up: a linear rope_scaling of 8); the
 * multimodal "gemma3" as its text model, its errors named under
 * text_config; zo_family_gemma names the three text families. */
static void test_gemma3_config(void **state)
{
    (void)state;
    zo_model_config c, back;
    load_hf_fixture("gemma-3-1b.json", &c);
    assert_string_equal(c.family, "gemma3_text");
    assert_true(c.qk_norm && c.layer_norms == 4 && c.attn_softcap == 0.0f && c.final_softcap == 0.0f);
    assert_true(c.rope_theta == 1e6f && c.rope_local_theta == 10000.0f && c.query_pre_attn_scalar == 256.0f);
    for (int l = 0; l < c.n_layers; l++) {
        assert_int_equal(zo_model_layer_sliding(&c, l), (l + 1) % 6 != 0);
        assert_int_equal(zo_model_layer_window(&c, l), (l + 1) % 6 ? 512 : 0);
    }
    if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"gemma3_text\", \"num_hidden_layers\": 12, "
                                           "\"hidden_size\": 64, \"num_attention_heads\": 8, \"intermediate_size\": 96, "
                                           "\"vocab_size\": 100}",
                                           "defaults.json", &c),
                     ZO_OK);
    assert_true(c.head_dim == 256 && c.n_kv_heads == 4 && c.rope_theta == 1e6f && c.sliding_window == 4096);
    assert_int_equal(zo_model_layer_window(&c, 4), 4096);
    assert_int_equal(zo_model_layer_window(&c, 5), 0);
    assert_int_equal(zo_model_layer_window(&c, 11), 0);
    static const char *const presets[] = {"gemma-3-1b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        preset_round_trip(presets[i], &c, &back);
        assert_string_equal(back.family, "gemma3_text");
        assert_true(back.qk_norm && back.rope_local_theta == c.rope_local_theta && back.rope_theta == c.rope_theta &&
                    back.query_pre_attn_scalar == c.query_pre_attn_scalar && back.attn_softcap == 0.0f);
        assert_string_equal(back.rope_scaling, c.rope_scaling);
        assert_true(back.rope_factor == c.rope_factor || !c.rope_scaling[0]);
        for (int l = 0; l < c.n_layers; l++) assert_int_equal(zo_model_layer_window(&back, l), zo_model_layer_window(&c, l));
        assert_true(zo_model_params(&back) == zo_model_params(&c));
    }
    /* the multimodal checkpoints' configs as published (Gemma3ForConditionalGeneration:
     * gemma-3-4b-it's text_config gives five keys of its own, the rest are
     * Gemma3TextConfig's defaults; gemma-3-27b-it's): each its text preset */
    static const char *const mm[][2] = {{"gemma-3-4b", "gemma-3-4b-it.json"}, {"gemma-3-27b", "gemma-3-27b-it.json"}};
    for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
        load_hf_fixture(mm[i][1], &c);
        assert_int_equal(zo_model_preset_find(mm[i][0], &back), ZO_OK);
        assert_string_equal(c.family, "gemma3_text");
        assert_true(c.mm_text && !back.mm_text);
        assert_same_shape(&c, &back);
        if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());
    }
    /* its text_config missing or not an object, or wrong inside: named */
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"gemma3\"}", "mm.json", &c), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "mm.json: field \"text_config\": missing"));
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"gemma3\", \"text_config\": 3}", "mm.json", &c),
                     ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "\"text_config\": must be an object"));
    assert_int_not_equal(zo_model_config_parse("{\"model_type\": \"gemma3\", \"text_config\": "
                                               "{\"num_attention_heads\": 0}}", "mm.json", &c),
                         ZO_OK);
    assert_non_null(strstr(zo_last_error(), "mm.json: text_config: field \"num_attention_heads\""));
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"gemma3\", \"text_config\": "
                                           "{\"attention_bias\": true}}", "mm.json", &c),
                     ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "mm.json: text_config: field \"attention_bias\""));
    /* the one Gemma predicate (the runtime's (1 + w) norms, the parser's
     * hidden_activation, the export's keys): the three text families only */
    assert_true(zo_family_gemma("gemma") && zo_family_gemma("gemma2") && zo_family_gemma("gemma3_text"));
    assert_false(zo_family_gemma("gemma3") || zo_family_gemma("gemmax") || zo_family_gemma("llama"));
}

/* Multimodal checkpoints read as their text model: llava-1.5-7b's config
 * as published (its text_config gives no shape key: LlamaConfig's
 * defaults) against the same model as a LLaMA config with every key, and
 * Mistral-Small-3.1's (its text_config whole, sliding_window null) against
 * that text_config read on its own; a text model of another kind refused
 * by name. */
static void test_multimodal_text_config(void **state)
{
    (void)state;
    zo_model_config c, want;
    load_hf_fixture("llava-1.5-7b-hf.json", &c);
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"llama\", \"num_hidden_layers\": 32, "
                                           "\"hidden_size\": 4096, \"intermediate_size\": 11008, "
                                           "\"num_attention_heads\": 32, \"num_key_value_heads\": 32, "
                                           "\"vocab_size\": 32064, \"max_position_embeddings\": 4096, "
                                           "\"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, "
                                           "\"tie_word_embeddings\": false}",
                                           "vicuna.json", &want),
                     ZO_OK);
    assert_true(c.mm_text && !want.mm_text);
    assert_string_equal(c.family, "llama");
    assert_same_shape(&c, &want);
    if (zo_model_config_runtime_check(&c) != ZO_OK) fail_msg("%s", zo_last_error());

    /* Mistral-Small-3.1: its text_config taken out and read alone */
    load_hf_fixture("mistral-small-3.1-24b.json", &c);
    char path[512], *buf = NULL;
    snprintf(path, sizeof path, "%s/hf-configs/mistral-small-3.1-24b.json", ZO_FIXTURES_DIR);
    assert_int_equal(zo_file_read_all(path, 1 << 20, "config", &buf, NULL), ZO_OK);
    cJSON *root = cJSON_Parse(buf);
    char *text = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(root, "text_config"));
    if (zo_model_config_parse(text, "text.json", &want) != ZO_OK) fail_msg("%s", zo_last_error());
    free(text);
    cJSON_Delete(root);
    free(buf);
    assert_string_equal(c.family, "mistral");
    assert_true(c.mm_text && c.sliding_window == 0 && c.n_kv_heads == 8 && c.head_dim == 128);
    c.mm_text = 0;
    memcpy(c.name, want.name, sizeof c.name); /* the file names differ; every other field alike */
    assert_memory_equal(&c, &want, sizeof c);
    /* 23.57B without the vision tower */
    assert_true(zo_model_params(&c) == 40ull * (5120ull * 128 * (32 + 2 * 8) + 32ull * 128 * 5120 +
                                                3ull * 5120 * 32768 + 2 * 5120) +
                                           2ull * 131072 * 5120 + 5120);

    /* the text model must be a LLaMA-family one */
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"llava\", \"text_config\": "
                                           "{\"model_type\": \"gpt2\", \"n_layer\": 2}}", "mm.json", &c),
                     ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "mm.json: field \"text_config\": a \"gpt2\" text model"));
}

/* A Phi-4-mini-shaped model's config.json (partial_rotary_factor 0.75:
 * 96 of each 128-wide head rotate) reads back with the same rotary size;
 * a factor of 0.7 on heads of 80 rotates 56, as Hugging Face computes. */
static void test_hf_config_partial_rotary(void **state)
{
    (void)state;
    zo_model_config c, back;
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"phi3\", \"num_hidden_layers\": 2,"
                                           " \"hidden_size\": 3072, \"num_attention_heads\": 24,"
                                           " \"num_key_value_heads\": 8, \"intermediate_size\": 8192,"
                                           " \"vocab_size\": 200064, \"partial_rotary_factor\": 0.75,"
                                           " \"tie_word_embeddings\": true}",
                                           "phi4-mini.json", &c),
                     ZO_OK);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(zo_model_rope_dim(&c), 96);
    cJSON *js = NULL;
    assert_int_equal(model_hf_config(&c, ZO_DTYPE_BF16, &js), ZO_OK);
    char *text = cJSON_Print(js);
    assert_int_equal(zo_model_config_parse(text, "written.json", &back), ZO_OK);
    assert_int_equal(zo_model_rope_dim(&back), 96);
    free(text);
    cJSON_Delete(js);
    /* 0.7 of 80 as Python computes int(80 * 0.7) in double: 56 (in float
     * 55, an odd size the layout would refuse) */
    assert_int_equal(zo_model_config_parse("{\"model_type\": \"phi3\", \"num_hidden_layers\": 2,"
                                           " \"hidden_size\": 2560, \"num_attention_heads\": 32,"
                                           " \"num_key_value_heads\": 32, \"intermediate_size\": 8192,"
                                           " \"vocab_size\": 32064, \"partial_rotary_factor\": 0.7}",
                                           "phi-0.7.json", &c),
                     ZO_OK);
    assert_int_equal(c.head_dim, 80);
    assert_int_equal(zo_model_rope_dim(&c), (int)(80 * 0.7));
    assert_int_equal(zo_model_rope_dim(&c), 56);
    model_layout l;
    if (model_layout_init(&l, &c) != ZO_OK) fail_msg("%s", zo_last_error());
    model_layout_free(&l);
    assert_int_equal(model_hf_config(&c, ZO_DTYPE_BF16, &js), ZO_OK);
    text = cJSON_Print(js);
    assert_int_equal(zo_model_config_parse(text, "written.json", &back), ZO_OK);
    assert_int_equal(zo_model_rope_dim(&back), 56);
    free(text);
    cJSON_Delete(js);
    /* GPT-NeoX reads rotary_pct, or partial_rotary_factor in later configs:
     * out of (0, 1], the error names the key the config has */
    static const char *const neox_keys[] = {"rotary_pct", "partial_rotary_factor"};
    for (int k = 0; k < 2; k++) {
        char json[256];
        snprintf(json, sizeof json,
                 "{\"model_type\": \"gpt_neox\", \"num_hidden_layers\": 1, \"hidden_size\": 64, "
                 "\"num_attention_heads\": 2, \"intermediate_size\": 16, \"vocab_size\": 8, \"%s\": 1.5}",
                 neox_keys[k]);
        assert_int_equal(zo_model_config_parse(json, "neox.json", &c), ZO_ERR_FORMAT);
        char want[64];
        snprintf(want, sizeof want, "field \"%s\": must be in (0, 1]", neox_keys[k]);
        if (!strstr(zo_last_error(), want)) fail_msg("want \"%s\": %s", want, zo_last_error());
    }
}

/* longrope outside Phi-3, as transformers' _compute_longrope_parameters
 * reads it: without a top-level original_max_position_embeddings the
 * original length is max_position_embeddings (rope_scaling's own key is
 * not read) and s is rope_scaling's factor; with one, s is the ratio. The
 * config written for it names no top-level key that was not there. */
static void test_longrope_other_family(void **state)
{
    (void)state;
    const char *base = "{\"model_type\": \"llama\", \"num_hidden_layers\": 1, \"hidden_size\": 32,"
                       " \"num_attention_heads\": 8, \"intermediate_size\": 64, \"vocab_size\": 256,"
                       " \"max_position_embeddings\": 256,%s"
                       " \"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 2.0,"
                       " \"original_max_position_embeddings\": 64,"
                       " \"short_factor\": [1.0, 1.5], \"long_factor\": [2.0, 3.0]}}";
    char text[1024];
    zo_model_config c, back;
    snprintf(text, sizeof text, base, "");
    assert_int_equal(zo_model_config_parse(text, "llama-longrope.json", &c), ZO_OK);
    assert_int_equal(c.rope_original_max, 256);
    assert_true(fabs(c.rope_attention_factor - sqrt(1.0 + log(2.0) / log(256.0))) < 1e-6);
    cJSON *js = NULL;
    assert_int_equal(model_hf_config(&c, ZO_DTYPE_BF16, &js), ZO_OK);
    assert_null(cJSON_GetObjectItemCaseSensitive(js, "original_max_position_embeddings"));
    char *out = cJSON_Print(js);
    assert_int_equal(zo_model_config_parse(out, "written.json", &back), ZO_OK);
    assert_int_equal(back.rope_original_max, 256);
    assert_true(fabs(back.rope_attention_factor - c.rope_attention_factor) < 1e-6);
    free(out);
    cJSON_Delete(js);
    /* a top-level original length: s = 256 / 32, whatever the factor */
    snprintf(text, sizeof text, base, " \"original_max_position_embeddings\": 32,");
    assert_int_equal(zo_model_config_parse(text, "llama-longrope-orig.json", &c), ZO_OK);
    assert_int_equal(c.rope_original_max, 32);
    assert_true(fabs(c.rope_attention_factor - sqrt(1.0 + log(8.0) / log(32.0))) < 1e-6);
    assert_int_equal(model_hf_config(&c, ZO_DTYPE_BF16, &js), ZO_OK);
    out = cJSON_Print(js);
    assert_int_equal(zo_model_config_parse(out, "written.json", &back), ZO_OK);
    assert_int_equal(back.rope_original_max, 32);
    free(out);
    cJSON_Delete(js);
}

/* yarn's rope_scaling fields: the defaults (beta_fast 32, beta_slow 1,
 * truncate, the original length max_position_embeddings, the attention
 * factor 0.1 ln(factor) + 1), fields given (DeepSeek-V2's mscale and
 * mscale_all_dim, whose ratio is 1; an attention_factor over them; the
 * config's factor kept where max_position_embeddings / original differs),
 * the config written back reading the same, and each bad field refused
 * naming it. The expected values are written here from the definition. */
static void test_yarn_config(void **state)
{
    (void)state;
    const char *base = "{\"model_type\": \"qwen2\", \"num_hidden_layers\": 1, \"hidden_size\": 32,"
                       " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"intermediate_size\": 64,"
                       " \"vocab_size\": 256, \"max_position_embeddings\": 1024, \"rope_scaling\": {\"rope_type\": \"yarn\"%s}}";
    char text[1024];
    zo_model_config c, back;
    snprintf(text, sizeof text, base, ", \"factor\": 4.0");
    assert_int_equal(zo_model_config_parse(text, "qwen2-yarn.json", &c), ZO_OK);
    assert_string_equal(c.rope_scaling, "yarn");
    assert_true(c.rope_factor == 4.0f);
    assert_true(c.rope_beta_fast == 32.0 && c.rope_beta_slow == 1.0);
    assert_int_equal(c.rope_truncate, 1);
    assert_int_equal(c.rope_original_max, 1024);
    assert_true(fabs(c.rope_attention_factor - (0.1 * log(4.0) + 1.0)) < 1e-6);
    /* factor 1: no attention scaling */
    snprintf(text, sizeof text, base, ", \"factor\": 1.0");
    assert_int_equal(zo_model_config_parse(text, "qwen2-yarn1.json", &c), ZO_OK);
    assert_true(c.rope_attention_factor == 1.0f);
    /* DeepSeek-V2's: factor 40, mscale = mscale_all_dim = 0.707 (a ratio of 1),
     * original 4096 of 1024 (the factor kept, not 1024 / 4096) */
    snprintf(text, sizeof text, base,
             ", \"type\": \"yarn\", \"factor\": 40, \"beta_fast\": 32, \"beta_slow\": 1, \"mscale\": 0.707,"
             " \"mscale_all_dim\": 0.707, \"original_max_position_embeddings\": 4096");
    assert_int_equal(zo_model_config_parse(text, "deepseek-v2-yarn.json", &c), ZO_OK);
    assert_true(c.rope_factor == 40.0f);
    assert_int_equal(c.rope_original_max, 4096);
    assert_true(fabs(c.rope_attention_factor - 1.0) < 1e-7);
    /* mscale 1, mscale_all_dim 0.5: (0.1 ln 40 + 1) / (0.05 ln 40 + 1) */
    snprintf(text, sizeof text, base,
             ", \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 0.5, \"beta_fast\": 16, \"beta_slow\": 2,"
             " \"truncate\": false");
    assert_int_equal(zo_model_config_parse(text, "yarn-mscale.json", &c), ZO_OK);
    assert_true(fabs(c.rope_attention_factor - (0.1 * log(40.0) + 1.0) / (0.05 * log(40.0) + 1.0)) < 1e-6);
    assert_true(c.rope_beta_fast == 16.0 && c.rope_beta_slow == 2.0);
    assert_int_equal(c.rope_truncate, 0);
    /* written back and read: the same frequencies' fields and factor */
    cJSON *js = NULL;
    assert_int_equal(model_hf_config(&c, ZO_DTYPE_BF16, &js), ZO_OK);
    char *out = cJSON_Print(js);
    assert_int_equal(zo_model_config_parse(out, "written.json", &back), ZO_OK);
    assert_string_equal(back.rope_scaling, "yarn");
    assert_true(back.rope_factor == c.rope_factor && back.rope_original_max == c.rope_original_max);
    assert_true(back.rope_beta_fast == 16.0 && back.rope_beta_slow == 2.0 && back.rope_truncate == 0);
    assert_true(back.rope_attention_factor == c.rope_attention_factor);
    free(out);
    cJSON_Delete(js);
    /* only mscale given: mscale(factor, 1) */
    snprintf(text, sizeof text, base, ", \"factor\": 40, \"mscale\": 0.707");
    assert_int_equal(zo_model_config_parse(text, "yarn-mscale-only.json", &c), ZO_OK);
    assert_true(fabs(c.rope_attention_factor - (0.1 * log(40.0) + 1.0)) < 1e-6);
    /* attention_factor given wins */
    snprintf(text, sizeof text, base, ", \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 0.5,"
                                      " \"attention_factor\": 0.75");
    assert_int_equal(zo_model_config_parse(text, "yarn-att.json", &c), ZO_OK);
    assert_true(c.rope_attention_factor == 0.75f);
    /* bad fields, each named */
    static const struct {
        const char *fields, *field;
    } bad[] = {
        {", \"factor\": 0.5", "factor"},
        {", \"factor\": 4.0, \"beta_fast\": 1.0, \"beta_slow\": 2.0", "beta_fast"},
        {", \"factor\": 4.0, \"beta_slow\": 0", "beta_slow"},
        {", \"factor\": 4.0, \"beta_fast\": \"32\"", "beta_fast"},
        {", \"factor\": 4.0, \"truncate\": 1", "truncate"},
        {", \"factor\": 4.0, \"mscale\": -1", "mscale"},
        {", \"factor\": 4.0, \"mscale_all_dim\": -0.5", "mscale_all_dim"},
        {", \"factor\": 4.0, \"attention_factor\": 0", "attention_factor"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(text, sizeof text, base, bad[k].fields);
        assert_int_equal(zo_model_config_parse(text, "bad-yarn.json", &c), ZO_ERR_FORMAT);
        char want[128];
        snprintf(want, sizeof want, "rope_scaling: field \"%s\"", bad[k].field);
        if (!strstr(zo_last_error(), want)) fail_msg("want \"%s\": %s", want, zo_last_error());
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_presets),
        cmocka_unit_test(test_layout_hf_configs),
        cmocka_unit_test(test_layout_moe),
        cmocka_unit_test(test_layout_variants),
        cmocka_unit_test(test_layout_limits),
        cmocka_unit_test(test_layout_views),
        cmocka_unit_test(test_layout_refuses_families),
        cmocka_unit_test(test_deepseek_routing_fields),
        cmocka_unit_test(test_layout_mla),
        cmocka_unit_test(test_hf_config_partial_rotary),
        cmocka_unit_test(test_gemma2_config),
        cmocka_unit_test(test_model_windows),
        cmocka_unit_test(test_gemma3_config),
        cmocka_unit_test(test_multimodal_text_config),
        cmocka_unit_test(test_granite_config),
        cmocka_unit_test(test_granitemoe_config),
        cmocka_unit_test(test_gpt_oss_layout),
        cmocka_unit_test(test_gpt_oss_config_written),
        cmocka_unit_test(test_cohere_config),
        cmocka_unit_test(test_cohere2_config),
        cmocka_unit_test(test_smollm3_config),
        cmocka_unit_test(test_exaone4_config),
        cmocka_unit_test(test_starcoder2_config),
        cmocka_unit_test(test_ernie_seed_oss_config),
        cmocka_unit_test(test_hf_config_copy),
        cmocka_unit_test(test_hf_config_from_presets),
        cmocka_unit_test(test_neox_qkv_rows),
        cmocka_unit_test(test_falcon_qkv_rows),
        cmocka_unit_test(test_gptj_rot_rows),
        cmocka_unit_test(test_falcon_old_keys),
        cmocka_unit_test(test_longrope_other_family),
        cmocka_unit_test(test_yarn_config),
        cmocka_unit_test(test_batches_sequential),
        cmocka_unit_test(test_batches_random),
        cmocka_unit_test(test_tokens_errors),
        cmocka_unit_test(test_tokens_truncated),
        cmocka_unit_test(test_byte_tokens),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}
