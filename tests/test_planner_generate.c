/* memplan generate (planner/generate.c) against the runtime it plans for:
 * generation on the CPU backend (transformer/generate.h) measures its peak
 * bytes per tier, which must be within 3% of the planner's, for the weights
 * resident, streamed from pinned host memory and read from NVMe, GPT-2
 * (tied) and LLaMA (GQA), fp32 and bf16, several prefetch depths, LoRA and
 * QLoRA adapters on every tier; and memplan generate's command line (its
 * lines, the cache's bytes by hand, the verdict, --plan-out read back by
 * the plan schema, errors); its time per token by the placement on a GPU
 * and on the CPU backend. The runtime's measured tokens/s against the
 * prediction is bench_generate's (docs/performance.md): a timing, not a
 * test. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/plan_schema.h"   /* defines: zo_plan_load */
#include "model/lora.h"            /* defines: model_lora_save */
#include "planner/generate.h"     /* defines: plan_gen, plan_gen_estimate_run */
#include "tests/support/files.h"  /* defines: files_write_text */
#include "tests/support/run.h"    /* defines: run_memplan */
#include "transformer/generate.h" /* defines: tf_gen */
#include "tests/support/scratch.h" /* defines: scratch_path */

static char nvme_dir[64];

/* The families of the cases: gpt (1) or not (0, LLaMA), and the mixtures of
 * experts and Gemma-2 (its output norms' buffers), from their Hugging Face
 * configs. */
enum { FAM_MIXTRAL = 2, FAM_QWEN2_MOE = 3, FAM_GEMMA2 = 4, FAM_DEEPSEEK = 5, FAM_DEEPSEEK_V2 = 6, FAM_PHI3 = 7,
       FAM_FALCON = 8 };

/* Phi-3 with longrope over an original length of 16 (lists of 32 for
 * head_dim 64): generation past it runs the crossing's forward of 17 tokens
 * a sequence, whose buffers the planner counts. */
static zo_model_config phi3_longrope(int layers)
{
    char json[2048], shortf[400] = "", longf[400] = "";
    for (int i = 0; i < 32; i++) {
        snprintf(shortf + strlen(shortf), sizeof shortf - strlen(shortf), "%s%g", i ? ", " : "", 1 + (i % 4) / 4.0);
        snprintf(longf + strlen(longf), sizeof longf - strlen(longf), "%s%d", i ? ", " : "", 1 + i);
    }
    snprintf(json, sizeof json,
             "{\"model_type\": \"phi3\", \"num_hidden_layers\": %d, \"hidden_size\": 256, "
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 384, "
             "\"vocab_size\": 320, \"max_position_embeddings\": 4096, \"original_max_position_embeddings\": 16, "
             "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [%s], \"long_factor\": [%s]}}",
             layers, shortf, longf);
    zo_model_config m;
    assert_int_equal(zo_model_config_parse(json, "phi3.json", &m), 0);
    return m;
}

/* A small model of the family's shape. */
static zo_model_config model(int gpt, int layers)
{
    zo_model_config m;
    if (gpt == FAM_PHI3) return phi3_longrope(layers);
    if (gpt == FAM_FALCON) { /* Falcon-7B's layer: one norm for a parallel attention and MLP, multi-query */
        char json[512];
        snprintf(json, sizeof json,
                 "{\"model_type\": \"falcon\", \"num_hidden_layers\": %d, \"hidden_size\": 256, "
                 "\"num_attention_heads\": 4, \"multi_query\": true, \"parallel_attn\": true, "
                 "\"new_decoder_architecture\": false, \"vocab_size\": 320, \"bias\": false}",
                 layers);
        assert_int_equal(zo_model_config_parse(json, "falcon.json", &m), 0);
        assert_true(m.layer_norms == 1 && m.parallel_block);
        return m;
    }
    if (gpt >= FAM_MIXTRAL) { /* Mixtral: 8 experts, 2 a token; Qwen2-MoE: 6, 3 a token, a shared expert */
        char json[1024];
        snprintf(json, sizeof json,
                 gpt == FAM_DEEPSEEK_V2 /* latent attention: 4 heads of 32 + 16, v 32, kv_lora_rank 64 */
                     ? "{\"model_type\": \"deepseek_v2\", \"num_hidden_layers\": %d, \"hidden_size\": 256, "
                       "\"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"q_lora_rank\": null, "
                       "\"kv_lora_rank\": 64, \"qk_nope_head_dim\": 32, \"qk_rope_head_dim\": 16, "
                       "\"v_head_dim\": 32, \"intermediate_size\": 384, \"moe_intermediate_size\": 64, "
                       "\"n_shared_experts\": 1, \"n_routed_experts\": 6, \"num_experts_per_tok\": 2, "
                       "\"first_k_dense_replace\": 1, \"norm_topk_prob\": false, \"topk_method\": \"greedy\", "
                       "\"vocab_size\": 320, \"max_position_embeddings\": 4096}"
                 : gpt == FAM_DEEPSEEK /* a dense first layer wider than the MoE layers' MLPs */
                     ? "{\"model_type\": \"deepseek\", \"num_hidden_layers\": %d, \"hidden_size\": 256, "
                       "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 768, "
                       "\"moe_intermediate_size\": 64, \"n_shared_experts\": 2, \"n_routed_experts\": 6, "
                       "\"num_experts_per_tok\": 3, \"first_k_dense_replace\": 1, \"vocab_size\": 320, "
                       "\"max_position_embeddings\": 4096}"
                 : gpt == FAM_GEMMA2
                     ? "{\"model_type\": \"gemma2\", \"num_hidden_layers\": %d, \"hidden_size\": 256, "
                       "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 64, "
                       "\"intermediate_size\": 384, \"vocab_size\": 320, \"max_position_embeddings\": 4096, "
                       "\"sliding_window\": 8}"
                 : gpt == FAM_MIXTRAL
                     ? "{\"model_type\": \"mixtral\", \"num_hidden_layers\": %d, \"hidden_size\": 256, "
                       "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 192, "
                       "\"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"vocab_size\": 320, "
                       "\"max_position_embeddings\": 4096}"
                     : "{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": %d, \"hidden_size\": 256, "
                       "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 384, "
                       "\"moe_intermediate_size\": 96, \"shared_expert_intermediate_size\": 160, "
                       "\"num_experts\": 6, \"num_experts_per_tok\": 3, \"norm_topk_prob\": false, "
                       "\"vocab_size\": 320, \"max_position_embeddings\": 4096}",
                 layers);
        assert_int_equal(zo_model_config_parse(json, "moe.json", &m), 0);
        return m;
    }
    assert_int_equal(zo_model_preset_find(gpt ? "gpt2" : "llama-2-7b", &m), 0);
    m.n_layers = layers;
    m.hidden = gpt ? 128 : 256;
    m.n_heads = gpt ? 2 : 4;
    m.n_kv_heads = gpt ? 2 : 2; /* GQA for LLaMA */
    m.head_dim = 0;
    m.ffn = gpt ? 512 : 384;
    m.vocab = gpt ? 500 : 320;
    m.max_seq = gpt ? 128 : 4096;
    assert_int_equal(zo_model_config_validate(&m), 0);
    return m;
}

/* The CPU backend with room enough everywhere, nothing reserved. */
static void cpu_hw(plan_hw *hw)
{
    memset(hw, 0, sizeof *hw);
    snprintf(hw->name, sizeof hw->name, "cpu-backend");
    hw->gpus = hw->gpus_per_node = 1;
    hw->gpu_mem = hw->cpu_mem = hw->nvme = 1ull << 40;
    hw->hbm_bw = hw->pcie_bw = hw->nvme_read_bw = hw->cpu_mem_bw = 1e10;
    hw->hbm_eff = 1;
    hw->peak_flops_16 = hw->peak_flops_32 = 1e11;
    hw->gemm_eff_max = 1;
}

/* One sequence of `prompt` + `new_tokens` in bf16, nothing reserved. */
static plan_gen one_sequence(int prompt, int new_tokens)
{
    plan_gen g;
    plan_gen_defaults(&g);
    g.batch = 1;
    g.prompt = prompt;
    g.new_tokens = new_tokens;
    g.dtype = ZO_DTYPE_BF16;
    g.cuda_context = g.cublas_workspace = 0;
    g.fragmentation = 0;
    return g;
}

typedef struct gcase {
    const char *what;
    int gpt, layers, batch, prompt, new_tokens;
    zo_dtype dtype;
    zo_plan_tier params, adapters;
    int prefetch;
    zo_plan_method method;
    int r;
    unsigned targets;
    int mla_full; /* latent attention: the full cache (generate --mla-cache full) */
} gcase;

/* Generate with the runtime (random weights), its peaks per tier against
 * the planner's: within 3%, and 0 where the planner says 0. */
static int run_case(const gcase *c)
{
    zo_model_config m = model(c->gpt, c->layers);
    plan_gen g;
    plan_gen_defaults(&g);
    g.batch = c->batch;
    g.prompt = c->prompt;
    g.new_tokens = c->new_tokens;
    g.dtype = c->dtype;
    g.params_on = c->params;
    g.adapters_on = c->adapters;
    g.prefetch_depth = c->prefetch;
    g.method = c->method;
    g.mla_full_cache = c->mla_full;
    g.lora = (zo_lora_config){.r = c->r, .alpha = 8.0f, .targets = c->targets};
    g.cuda_context = g.cublas_workspace = 0;
    g.fragmentation = 0;
    plan_hw hw;
    cpu_hw(&hw);
    plan_gen_estimate e;
    assert_int_equal(plan_gen_estimate_run(&m, &hw, &g, &e), 0);
    if (c->gpt == FAM_PHI3) { /* (the prompt within the original 16, the context past it) */
        assert_int_equal(e.longrope_rows, 17);
        assert_true(e.longrope_s > 0);
    }

    gpu_cpu_options o = {.n_threads = 2};
    gpu_device_t dev;
    assert_int_equal(gpu_device_init_cpu(&o, &dev), 0);
    tf_gen_config gc = {.batch = c->batch, .prompt_max = c->prompt, .ctx = c->prompt + c->new_tokens,
                        .dtype = c->dtype, .mla_cache = c->mla_full ? TF_MLA_CACHE_FULL : TF_MLA_CACHE_LATENT};
    offload_config_defaults(&gc.oc);
    gc.oc.params_on = (offload_tier)c->params;
    gc.oc.trainable_on = (offload_tier)c->adapters;
    gc.oc.prefetch_depth = c->prefetch;
    gc.oc.nvme_dir = nvme_dir;
    const char *adapter = NULL;
    char adir[128];
    if (c->method != ZO_PLAN_FULL) {
        gc.lora = (tf_lora_options){.r = c->r, .alpha = 8.0f, .targets = c->targets, .nf4 = c->method == ZO_PLAN_QLORA};
        /* adapters: zeros written as a PEFT directory by the model's own layout */
        snprintf(adir, sizeof adir, "%s/adapter", nvme_dir);
        adapter = adir;
    }
    tf_gen tg;
    assert_int_equal(tf_gen_init(&tg, &m, dev, &gc), 0);
    /* the tokens so far are kept for longrope's crossing alone (Phi-3 here,
     * its context past the original 16) */
    assert_int_equal(tg.seq != NULL, c->gpt == FAM_PHI3);
    if (adapter) {
        const model_layout *ad = &tg.m.adapters;
        float **blocks = calloc((size_t)ad->n_blocks, sizeof *blocks);
        for (int b = 0; b < ad->n_blocks; b++) blocks[b] = calloc(ad->block_numel[b] + 1, sizeof(float));
        zo_lora_config lc = {.r = c->r, .alpha = 8.0f, .targets = c->targets};
        assert_int_equal(model_lora_save(adir, ad, &lc, NULL, (const void *const *)blocks, ZO_DTYPE_F32, ZO_DTYPE_F32),
                         0);
        for (int b = 0; b < ad->n_blocks; b++) free(blocks[b]);
        free(blocks);
    }
    assert_int_equal(tf_gen_load(&tg, NULL, 7, adapter), 0);
    int32_t *prompt = calloc((size_t)c->prompt, sizeof *prompt), next[16] = {0};
    const int32_t *pp[16];
    int lens[16];
    float *logits = malloc((size_t)c->batch * m.vocab * sizeof *logits);
    for (int i = 0; i < c->prompt; i++) prompt[i] = (i * 7 + 3) % m.vocab;
    for (int j = 0; j < c->batch; j++) pp[j] = prompt, lens[j] = c->prompt - j % 2; /* lengths differ */
    if (tf_gen_prompt(&tg, pp, lens, c->batch, logits)) fail_msg("%s: tf_gen_prompt: %s", c->what, zo_last_error());
    for (int k = 1; k < c->new_tokens; k++) assert_int_equal(tf_gen_next(&tg, next, logits), 0);
    offload_stats st;
    offload_get_stats(tg.rt, &st);
    int bad = 0;
    printf("  %-52s", c->what);
    for (int t = 0; t < ZO_PLAN_TIERS; t++) {
        double want = (double)e.total[t], got = (double)st.peak[t];
        double r = want > 0 ? got / want : got == 0 ? 1.0 : INFINITY;
        printf(" %s %.4f", zo_plan_tier_name((zo_plan_tier)t), r);
        bad |= fabs(r - 1) > 0.03;
    }
    printf("%s\n", bad ? "  MISMATCH" : "");
    if (bad)
        for (int t = 0; t < ZO_PLAN_TIERS; t++)
            printf("    %s: measured %llu, planned %llu\n", zo_plan_tier_name((zo_plan_tier)t),
                   (unsigned long long)st.peak[t], (unsigned long long)e.total[t]);
    free(prompt);
    free(logits);
    tf_gen_free(&tg);
    gpu_device_free(dev);
    return bad;
}

static void test_peaks(void **state)
{
    (void)state;
    const unsigned all = ZO_LORA_ALL_LINEAR, qv = ZO_LORA_Q | ZO_LORA_V;
    const gcase cases[] = {
        {"llama bf16, resident", 0, 4, 2, 9, 7, ZO_DTYPE_BF16, ZO_PLAN_GPU, ZO_PLAN_GPU, 2, ZO_PLAN_FULL, 0, 0, 0},
        {"llama bf16, streamed from host, prefetch 1", 0, 4, 2, 9, 7, ZO_DTYPE_BF16, ZO_PLAN_CPU, ZO_PLAN_GPU, 1,
         ZO_PLAN_FULL, 0, 0, 0},
        {"llama fp32, streamed from host, prefetch 3", 0, 6, 3, 17, 5, ZO_DTYPE_F32, ZO_PLAN_CPU, ZO_PLAN_GPU, 3,
         ZO_PLAN_FULL, 0, 0, 0},
        {"llama bf16, NVMe, prefetch 2", 0, 4, 1, 9, 7, ZO_DTYPE_BF16, ZO_PLAN_NVME, ZO_PLAN_GPU, 2, ZO_PLAN_FULL, 0, 0, 0},
        {"gpt2 fp32 (tied), resident", 1, 3, 2, 12, 6, ZO_DTYPE_F32, ZO_PLAN_GPU, ZO_PLAN_GPU, 2, ZO_PLAN_FULL, 0, 0, 0},
        {"gpt2 bf16 (tied), streamed from host, prefetch 1", 1, 3, 2, 12, 6, ZO_DTYPE_BF16, ZO_PLAN_CPU, ZO_PLAN_GPU, 1,
         ZO_PLAN_FULL, 0, 0, 0},
        {"gpt2 fp32 (tied), NVMe, prefetch 1", 1, 3, 1, 12, 6, ZO_DTYPE_F32, ZO_PLAN_NVME, ZO_PLAN_GPU, 1, ZO_PLAN_FULL,
         0, 0, 0},
        {"llama bf16, LoRA r 8 all-linear, base resident", 0, 4, 2, 9, 7, ZO_DTYPE_BF16, ZO_PLAN_GPU, ZO_PLAN_GPU, 2,
         ZO_PLAN_LORA, 8, all, 0},
        {"llama bf16, LoRA r 4 q,v, base streamed, adapters host", 0, 4, 2, 9, 7, ZO_DTYPE_BF16, ZO_PLAN_CPU,
         ZO_PLAN_CPU, 2, ZO_PLAN_LORA, 4, qv, 0},
        {"llama bf16, QLoRA r 8, base resident", 0, 4, 2, 9, 7, ZO_DTYPE_BF16, ZO_PLAN_GPU, ZO_PLAN_GPU, 2,
         ZO_PLAN_QLORA, 8, all, 0},
        {"llama bf16, QLoRA r 8, base NVMe, adapters NVMe", 0, 4, 1, 9, 7, ZO_DTYPE_BF16, ZO_PLAN_NVME, ZO_PLAN_NVME, 1,
         ZO_PLAN_QLORA, 8, all, 0},
        {"gpt2 fp32, QLoRA r 4, base streamed", 1, 3, 2, 12, 6, ZO_DTYPE_F32, ZO_PLAN_CPU, ZO_PLAN_GPU, 1,
         ZO_PLAN_QLORA, 4, all, 0},
        /* mixtures of experts: the router's and the experts' buffers at the batch's tokens; from
         * host the routed experts stream apart (a dense part's slots, two expert slots) */
        {"mixtral bf16, resident", FAM_MIXTRAL, 3, 2, 9, 7, ZO_DTYPE_BF16, ZO_PLAN_GPU, ZO_PLAN_GPU, 2, ZO_PLAN_FULL,
         0, 0, 0},
        {"mixtral fp32, experts apart from host, prefetch 1", FAM_MIXTRAL, 3, 3, 11, 5, ZO_DTYPE_F32, ZO_PLAN_CPU,
         ZO_PLAN_GPU, 1, ZO_PLAN_FULL, 0, 0, 0},
        {"mixtral bf16, NVMe (whole layers), prefetch 2", FAM_MIXTRAL, 3, 1, 9, 7, ZO_DTYPE_BF16, ZO_PLAN_NVME,
         ZO_PLAN_GPU, 2, ZO_PLAN_FULL, 0, 0, 0},
        {"mixtral bf16, QLoRA r 8, base streamed", FAM_MIXTRAL, 3, 2, 9, 7, ZO_DTYPE_BF16, ZO_PLAN_CPU, ZO_PLAN_GPU,
         1, ZO_PLAN_QLORA, 8, all, 0},
        {"qwen2_moe bf16, experts apart from host, prefetch 2", FAM_QWEN2_MOE, 3, 2, 9, 7, ZO_DTYPE_BF16,
         ZO_PLAN_CPU, ZO_PLAN_GPU, 2, ZO_PLAN_FULL, 0, 0, 0},
        {"qwen2_moe fp32, LoRA r 4 all-linear, resident", FAM_QWEN2_MOE, 3, 2, 9, 7, ZO_DTYPE_F32, ZO_PLAN_GPU,
         ZO_PLAN_GPU, 2, ZO_PLAN_LORA, 4, all, 0},
        /* adapters on q and v only: no expert scratch, no A x of the experts' */
        {"mixtral fp32, LoRA r 4 q,v, resident", FAM_MIXTRAL, 3, 2, 9, 7, ZO_DTYPE_F32, ZO_PLAN_GPU, ZO_PLAN_GPU, 2,
         ZO_PLAN_LORA, 4, qv, 0},
        /* Gemma-2: one input and 1/rms for its two output norms, none kept */
        {"gemma2 bf16, resident", FAM_GEMMA2, 4, 2, 9, 7, ZO_DTYPE_BF16, ZO_PLAN_GPU, ZO_PLAN_GPU, 2, ZO_PLAN_FULL,
         0, 0, 0},
        {"gemma2 fp32, streamed from host, prefetch 1", FAM_GEMMA2, 4, 2, 9, 7, ZO_DTYPE_F32, ZO_PLAN_CPU,
         ZO_PLAN_GPU, 1, ZO_PLAN_FULL, 0, 0, 0},
        /* DeepSeekMoE: a dense first layer (its MLP wider than an MoE layer's), then MoE layers */
        {"deepseek bf16, resident", FAM_DEEPSEEK, 3, 2, 9, 7, ZO_DTYPE_BF16, ZO_PLAN_GPU, ZO_PLAN_GPU, 2,
         ZO_PLAN_FULL, 0, 0, 0},
        {"deepseek fp32, experts apart from host, prefetch 1", FAM_DEEPSEEK, 3, 3, 11, 5, ZO_DTYPE_F32, ZO_PLAN_CPU,
         ZO_PLAN_GPU, 1, ZO_PLAN_FULL, 0, 0, 0},
        {"deepseek fp32, LoRA r 4 all-linear, base streamed", FAM_DEEPSEEK, 3, 2, 9, 7, ZO_DTYPE_F32, ZO_PLAN_CPU,
         ZO_PLAN_GPU, 2, ZO_PLAN_LORA, 4, all, 0},
        /* DeepSeek-V2: the latent cache (q|k|v and the output at the latent row's width, no c_kv
         * copy or kv_b output; with an adapter on kv_b_proj its folded weight), and the full one */
        {"deepseek_v2 bf16, latent cache, resident", FAM_DEEPSEEK_V2, 3, 2, 9, 40, ZO_DTYPE_BF16, ZO_PLAN_GPU,
         ZO_PLAN_GPU, 2, ZO_PLAN_FULL, 0, 0, 0},
        {"deepseek_v2 bf16, full cache, resident", FAM_DEEPSEEK_V2, 3, 2, 9, 40, ZO_DTYPE_BF16, ZO_PLAN_GPU,
         ZO_PLAN_GPU, 2, ZO_PLAN_FULL, 0, 0, 1},
        {"deepseek_v2 fp32, latent, LoRA r 4 all-linear, streamed", FAM_DEEPSEEK_V2, 3, 2, 9, 7, ZO_DTYPE_F32,
         ZO_PLAN_CPU, ZO_PLAN_GPU, 2, ZO_PLAN_LORA, 4, all, 0},
        {"deepseek_v2 bf16, latent, QLoRA r 8, resident", FAM_DEEPSEEK_V2, 3, 2, 9, 7, ZO_DTYPE_BF16, ZO_PLAN_GPU,
         ZO_PLAN_GPU, 2, ZO_PLAN_QLORA, 8, all, 0},
        /* longrope's crossing (17 of 29 positions): a forward of 17 tokens a sequence past prompts of 9 */
        {"phi3 bf16, longrope crossing, resident", FAM_PHI3, 3, 2, 9, 20, ZO_DTYPE_BF16, ZO_PLAN_GPU, ZO_PLAN_GPU, 2,
         ZO_PLAN_FULL, 0, 0, 0},
        {"phi3 fp32, longrope crossing, LoRA r 4 all-linear, streamed", FAM_PHI3, 3, 2, 9, 20, ZO_DTYPE_F32,
         ZO_PLAN_CPU, ZO_PLAN_GPU, 1, ZO_PLAN_LORA, 4, all, 0},
        /* Falcon-7B's layer: no second norm and no residual between (the attention and the MLP
         * both read the one norm's output), neither kept; the prompt's rows outweigh the weights */
        {"falcon bf16 (one norm, parallel), streamed from host", FAM_FALCON, 2, 8, 96, 3, ZO_DTYPE_BF16,
         ZO_PLAN_CPU, ZO_PLAN_GPU, 1, ZO_PLAN_FULL, 0, 0, 0},
        {"falcon fp32 (one norm, parallel), resident", FAM_FALCON, 2, 8, 96, 3, ZO_DTYPE_F32, ZO_PLAN_GPU,
         ZO_PLAN_GPU, 1, ZO_PLAN_FULL, 0, 0, 0},
    };
    int bad = 0;
    printf("  measured / planned peak bytes per tier:\n");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) bad += run_case(&cases[i]);
    assert_int_equal(bad, 0);
}

/* ---- the command ------------------------------------------------------------------------ */

static void test_cli(void **state)
{
    (void)state;
    char out[16384], args[1024], plan[128];
    /* LLaMA-2-7B, 4 sequences of 512 + 256: the cache by hand, 2 x 32 layers x 4 x 768 x 32 x 128 x 2 bytes */
    int rc = run_memplan("generate --model llama-2-7b --gpu rtx-4090 --params cpu --batch 4 --prompt 512 "
                         "--new-tokens 256 --json", out, sizeof out);
    assert_int_equal(rc, 0);
    char want[64];
    snprintf(want, sizeof want, "\"kv_cache_bytes\":\t%llu", 2ull * 32 * 4 * 768 * 32 * 128 * 2);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "\"bound\":\t\"pcie\""));
    /* DeepSeek-V2-Lite's shape, 4 sequences of 512 + 256: the latent cache by hand, 27 layers x 4 x 768 x
     * (64 + 512) x 2 bytes; --mla-cache full every head's key and value, 2 x 27 x 4 x 768 x 16 x 192 x 2 */
    char lite[128];
    snprintf(lite, sizeof lite, "%s/deepseek-v2-lite.json", nvme_dir);
    files_write_text(lite, "{\"model_type\": \"deepseek_v2\", \"num_hidden_layers\": 27, \"hidden_size\": 2048, "
                           "\"num_attention_heads\": 16, \"num_key_value_heads\": 16, \"q_lora_rank\": null, "
                           "\"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, "
                           "\"v_head_dim\": 128, \"intermediate_size\": 10944, \"moe_intermediate_size\": 1408, "
                           "\"n_shared_experts\": 2, \"n_routed_experts\": 64, \"num_experts_per_tok\": 6, "
                           "\"first_k_dense_replace\": 1, \"norm_topk_prob\": false, \"topk_method\": \"greedy\", "
                           "\"vocab_size\": 102400, \"max_position_embeddings\": 163840}");
    static const char *const caches[] = {"", " --mla-cache latent", " --mla-cache full"};
    const unsigned long long lat = 27ull * 4 * 768 * 576 * 2, full = 2ull * 27 * 4 * 768 * 16 * 192 * 2;
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "generate --model %s --gpu h100 --batch 4 --prompt 512 --new-tokens 256%s --json",
                 lite, caches[i]);
        assert_int_equal(run_memplan(args, out, sizeof out), 0);
        snprintf(want, sizeof want, "\"kv_cache_bytes\":\t%llu", i == 2 ? full : lat);
        assert_non_null(strstr(out, want));
        assert_non_null(strstr(out, i == 2 ? "\"mla_cache\":\t\"full\"" : "\"mla_cache\":\t\"latent\""));
    }
    snprintf(args, sizeof args, "generate --model %s --mla-cache half", lite);
    assert_int_equal(run_memplan(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "--mla-cache half: expected latent or full"));
    /* the weights resident do not fit a 24 GB card with that batch in fp32: exit 1 */
    rc = run_memplan("generate --model llama-2-7b --gpu rtx-4090 --batch 4 --dtype fp32", out, sizeof out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "does NOT fit: gpu needs"));
    /* streamed from NVMe it fits, bound by the drive */
    rc = run_memplan("generate --model llama-2-13b --gpu rtx-4090 --cpu-mem 16GB --params nvme", out, sizeof out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "bound by nvme"));
    /* errors name the flag */
    assert_int_equal(run_memplan("generate --model gpt2 --prompt 1000 --new-tokens 100", out, sizeof out), 2);
    assert_non_null(strstr(out, "past the 1024 learned positions"));
    assert_int_equal(run_memplan("generate --model mixtral-8x7b", out, sizeof out), 2);
    /* Mixtral-8x7B's shape from host, one sequence: the routed experts stream apart, a token
     * copying the dense parts and the 2 experts it routes to of each layer, by hand: bf16 x
     * (embedding + 32 x (attention + norms + router + 2 x 3 x 4096 x 14336) + norm + head) */
    char mcfg[128];
    snprintf(mcfg, sizeof mcfg, "%s/mixtral.json", nvme_dir);
    files_write_text(mcfg, "{\"model_type\": \"mixtral\", \"num_hidden_layers\": 32, \"hidden_size\": 4096, "
                           "\"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"intermediate_size\": 14336, "
                           "\"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"vocab_size\": 32000, "
                           "\"max_position_embeddings\": 32768, \"tie_word_embeddings\": false}\n");
    snprintf(args, sizeof args, "generate --model %s --hw h100-80gb --params cpu --json", mcfg);
    assert_int_equal(run_memplan(args, out, sizeof out), 0);
    unsigned long long h = 4096, layer = h * (h + 1024 + 1024) + h * h + 2 * h + 8 * h + 2 * 3 * h * 14336;
    snprintf(want, sizeof want, "\"stream_bytes_per_token\":\t%llu", 2 * (32000 * h + 32 * layer + h + 32000 * h));
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "\"touched_per_token\":\t2"));
    assert_non_null(strstr(out, "\"streamed_apart\":\ttrue"));
    assert_non_null(strstr(out, "expert slots (2 x routed expert)"));
    /* 4 sequences touch up to min(8, 4 x 2) = 8 experts a layer: every one */
    snprintf(args, sizeof args, "generate --model %s --hw h100-80gb --params cpu --batch 4", mcfg);
    assert_int_equal(run_memplan(args, out, sizeof out), 0);
    assert_non_null(strstr(out, "touches up to min(8, 4 x 2) = 8 a layer"));
    assert_int_equal(run_memplan("generate --model gpt2 --batch 0", out, sizeof out), 2);
    assert_non_null(strstr(out, "--batch"));
    assert_int_equal(run_memplan("generate --model gpt2 --qlora", out, sizeof out), 2);
    assert_non_null(strstr(out, "--qlora needs --lora R"));
    /* --plan-out: a plan the schema reads back, the context as its seq, the batch */
    snprintf(plan, sizeof plan, "%s/gen-plan.json", nvme_dir);
    snprintf(args, sizeof args, "generate --model llama-2-7b --hw h100-80gb --params cpu --prefetch 1 --batch 2 "
                                "--prompt 100 --new-tokens 28 --plan-out %s", plan);
    assert_int_equal(run_memplan(args, out, sizeof out), 0);
    zo_plan p;
    assert_int_equal(zo_plan_load(plan, &p), 0);
    assert_int_equal(p.training.seq, 128);
    assert_int_equal(p.training.micro_batch, 2);
    assert_int_equal(p.placement.params, ZO_PLAN_CPU);
    assert_int_equal(p.buffers.prefetch_depth, 1);
    assert_true(p.has_predicted && p.predicted.step_s > 0 && p.predicted.peak_bytes[ZO_PLAN_CPU] > 13000000000ull);
}

/* memplan generate --plan-out, then generate --plan: the program runs the
 * plan's placement, batch and context and prints its peaks beside the
 * plan's, each within 3%. */
static void test_plan_run(void **state)
{
    (void)state;
    char cfg[128], plan[128], args[1024], out[16384];
    snprintf(cfg, sizeof cfg, "%s/llama.json", nvme_dir);
    snprintf(plan, sizeof plan, "%s/run-plan.json", nvme_dir);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fprintf(f, "{\"model_type\": \"llama\", \"num_hidden_layers\": 3, \"hidden_size\": 256, \"num_attention_heads\": 4,"
               " \"num_key_value_heads\": 2, \"intermediate_size\": 512, \"vocab_size\": 1000}\n");
    fclose(f);
    const char *tiers[] = {"gpu", "cpu", "nvme"};
    for (int k = 0; k < 3; k++) {
        snprintf(args, sizeof args, "generate --model %s --gpu-mem 64MiB --params %s --prefetch 1 --batch 2 --prompt 6 "
                 "--new-tokens 10 --dtype bf16 --cuda-context 0 --cublas-workspace 0 --fragmentation 0 --plan-out %s",
                 cfg, tiers[k], plan);
        assert_int_equal(run_memplan(args, out, sizeof out), 0);
        snprintf(args, sizeof args, "--model %s --plan %s --prompt-ids 1,2,3 --prompt-ids 4,5,6,7,8,9 "
                 "--max-new-tokens 10 --nvme-dir %s --print-ids", cfg, plan, nvme_dir);
        assert_int_equal(run_program(ZO_GENERATE_BIN, args, out, sizeof out), 0);
        const char *p = strstr(out, "# peak bytes per tier:");
        assert_non_null(p);
        printf("  weights on %s: %.*s\n", tiers[k], (int)strcspn(p, "\n"), p);
        int seen = 0;
        for (const char *q = p; (q = strstr(q, "(plan ")) && q < p + strcspn(p, "\n"); q++) {
            const char *pc = strstr(q, ", ");
            double r = atof(pc + 2);
            assert_true(fabs(r - 100.0) <= 3.0);
            seen++;
        }
        assert_int_equal(seen, k == 2 ? 3 : 2); /* every tier the plan puts bytes on */
    }
}

/* The time per token by the placement, from the estimate's own parts and
 * the weights' bytes counted here (every parameter once, 2 bytes in bf16):
 * a GPU overlaps its copies with its work (the slowest of compute, host
 * link and disk sets the pace); the CPU backend (plan_hw_cpu_backend's
 * "GPU" that is the host) copies on the cores it computes on, so its
 * copies add to its compute and only the disk overlaps. */
static void test_time_model(void **state)
{
    (void)state;
    zo_model_config m = model(0, 4);
    double w = (double)zo_model_params(&m) * 2.0;
    plan_gen g = one_sequence(8, 9);
    plan_hw gpu, host;
    cpu_hw(&gpu);
    gpu.pcie_bw = 2e9;
    plan_hw_cpu_backend(&gpu, 1e11, 2e9, 1ull << 40, &host);
    for (int cpu = 0; cpu < 2; cpu++) {
        for (int k = 0; k < 2; k++) { /* a slow disk (it sets the pace), a fast one */
            plan_hw hw = cpu ? host : gpu;
            hw.nvme_read_bw = k ? 1e12 : 1e8;
            const zo_plan_tier on[] = {ZO_PLAN_GPU, ZO_PLAN_CPU, ZO_PLAN_NVME};
            double compute = 0;
            for (int i = 0; i < 3; i++) {
                g.params_on = on[i];
                plan_gen_estimate e;
                assert_int_equal(plan_gen_estimate_run(&m, &hw, &g, &e), 0);
                if (!i) compute = e.compute_s;
                assert_true(e.compute_s > 0 && e.compute_s == compute); /* the same forward wherever the weights are */
                double copies = i ? w / hw.pcie_bw : 0.0, disk = i == 2 ? w / hw.nvme_read_bw : 0.0;
                double device = cpu ? compute + copies : fmax(compute, copies), want = fmax(device, disk);
                const char *bound = disk > device ? "nvme" : !cpu && copies > compute ? "pcie"
                                  : cpu && copies > 0 ? "compute+copies" : "compute";
                printf("  %s, weights on %-4s disk %.0e B/s: %.6f s a token (pace %.6f, want %.6f), bound %s, stall %.3g\n",
                       cpu ? "CPU backend" : "GPU", zo_plan_tier_name(on[i]), hw.nvme_read_bw, e.s_per_token, e.pace_s, want,
                       e.bound, e.stall_s);
                assert_int_equal((double)e.stream_bytes, i ? w : 0.0);
                assert_int_equal((double)e.nvme_bytes, i == 2 ? w : 0.0);
                assert_true(fabs(e.pace_s - want) <= 1e-12 * want);
                assert_string_equal(e.bound, bound);
                /* the schedule adds the logits wait where the host reads
                 * the disk: its reads stop at the next token's first
                 * blocks until the head has run (test_logits_wait), the
                 * disk idle for less than a token's device work; on the
                 * CPU backend with a fast disk, the device idles while the
                 * host reads the next block before it queues the token's
                 * first compute (less than a token's reads) */
                assert_true(e.s_per_token == e.pace_s + e.stall_s);
                if (i == 2 && !k) assert_true(e.stall_s > 0 && e.stall_s < device);
                else if (i == 2 && cpu) assert_true(e.stall_s > 0 && e.stall_s < disk);
                else assert_true(e.stall_s == 0);
                assert_true(fabs(e.tokens_per_s - 1.0 / e.s_per_token) <= 1e-9 / e.s_per_token);
                /* the first tokens: the prompts' forward, after the first
                 * blocks are loaded; resident, just the forward */
                if (!i) assert_true(e.ttft_s == e.prompt_compute_s);
                else assert_true(e.ttft_s > e.prompt_compute_s && e.ttft_s >= fmax(cpu ? copies : 0.0, disk));
            }
        }
    }
}

/* DeepSeek-V2-Lite's shape (27 layers, hidden 2048, 16 heads of 128 + 64,
 * v 128, kv_lora_rank 512, 64 experts), with q_lora_rank and v_head_dim
 * set apart, bf16, one sequence of 512 + 256, resident. */
/* A device whose FLOPs are free and whose memory moves a byte a second:
 * a time is the bytes moved. */
static plan_hw byte_a_second(void)
{
    plan_hw hw;
    cpu_hw(&hw);
    hw.peak_flops_16 = hw.peak_flops_32 = 1e30;
    hw.hbm_bw = 1;
    return hw;
}

static zo_model_config lite(int q_rank, int v_dim)
{
    char json[1024], qr[16];
    snprintf(qr, sizeof qr, q_rank ? "%d" : "null", q_rank);
    snprintf(json, sizeof json,
             "{\"model_type\": \"deepseek_v2\", \"num_hidden_layers\": 27, \"hidden_size\": 2048, "
             "\"num_attention_heads\": 16, \"num_key_value_heads\": 16, \"q_lora_rank\": %s, "
             "\"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, "
             "\"v_head_dim\": %d, \"intermediate_size\": 10944, \"moe_intermediate_size\": 1408, "
             "\"n_shared_experts\": 2, \"n_routed_experts\": 64, \"num_experts_per_tok\": 6, "
             "\"first_k_dense_replace\": 1, \"norm_topk_prob\": false, \"topk_method\": \"greedy\", "
             "\"vocab_size\": 102400, \"max_position_embeddings\": 163840}",
             qr, v_dim);
    zo_model_config m;
    assert_int_equal(zo_model_config_parse(json, "lite.json", &m), 0);
    return m;
}

/* memplan generate's time of latent attention's projections, those the
 * runtime runs: q_proj, or q_a_proj then q_b_proj; kv_a_proj_with_mqa; kv_b_proj
 * (in the prompt's decompressed form; a token's absorbed attention reads its
 * weight once, in the attention's term); o_proj from heads x v_head_dim. On
 * a device whose FLOPs are free and whose memory moves a byte a second,
 * compute_s and prompt_compute_s are the bytes a forward reads and writes,
 * so a projection's change moves them by its weight plus its rows' inputs
 * and outputs (M rows: 1 a token, 512 the prompt), bf16, in each of the 27
 * layers:
 * - q_lora_rank 1536 (DeepSeek-V2's) against none: q_a [1536, 2048] and
 *   q_b [16 x 192, 1536] in place of q_proj [16 x 192, 2048], M (2 x 1536)
 *   more of rows (q_a's output written, q_b's input read);
 * - v_head_dim 128 against 64: o_proj's input 16 x 64 wider, its weight
 *   2048 x 16 x 64 more, M x 16 x 64 more read; kv_b_proj's 16 x 64 more
 *   rows of 512 read once a token (absorbed: its value rows' GEMM writes
 *   the heads' output, 1 x 16 x 64 more), in the prompt as a projection
 *   with M x 16 x 64 more written.
 * memplan's old single q|k|v of (16 + 2 x 16) heads of 192 from the hidden
 * state moved neither; kv_b_proj counted twice in a token moves the second
 * by 16 x 64 x 512 x 2 bytes a layer more. */
static void test_mla_projections(void **state)
{
    (void)state;
    plan_hw hw = byte_a_second();
    plan_gen g = one_sequence(512, 256);
    plan_gen_estimate base, qa, v64;
    zo_model_config m0 = lite(0, 128), mq = lite(1536, 128), mv = lite(0, 64);
    assert_int_equal(plan_gen_estimate_run(&m0, &hw, &g, &base), 0);
    assert_int_equal(plan_gen_estimate_run(&mq, &hw, &g, &qa), 0);
    assert_int_equal(plan_gen_estimate_run(&mv, &hw, &g, &v64), 0);
    const double L = 27, es = 2, h = 2048, q = 16 * 192, qr = 1536, dv = 16 * 64, kvr = 512, P = 512;
    const double dq_w = (h * qr + qr * q - h * q) * es; /* q_a and q_b in place of q_proj */
    double want = L * (dq_w + 1 * 2 * qr * es), got = qa.compute_s - base.compute_s;
    printf("  a token, q_lora_rank 1536 - none: %.0f bytes (want %.0f)\n", got, want);
    assert_true(fabs(got - want) <= 1e-9 * base.compute_s);
    want = L * (dq_w + P * 2 * qr * es), got = qa.prompt_compute_s - base.prompt_compute_s;
    printf("  the prompt, q_lora_rank 1536 - none: %.0f bytes (want %.0f)\n", got, want);
    assert_true(fabs(got - want) <= 1e-9 * base.prompt_compute_s);
    want = L * ((h * dv + 1 * dv) + (dv * kvr + 1 * dv)) * es, got = base.compute_s - v64.compute_s;
    printf("  a token, v_head_dim 128 - 64: %.0f bytes (want %.0f)\n", got, want);
    assert_true(fabs(got - want) <= 1e-9 * base.compute_s);
    want = L * ((h * dv + P * dv) + (dv * kvr + P * dv)) * es, got = base.prompt_compute_s - v64.prompt_compute_s;
    printf("  the prompt, v_head_dim 128 - 64: %.0f bytes (want %.0f)\n", got, want);
    assert_true(fabs(got - want) <= 1e-9 * base.prompt_compute_s);
}

/* memplan generate's time of LoRA adapters on latent attention's k and v
 * (kv_a_proj_with_mqa and kv_b_proj), r 16 at V2-Lite's shape, on the same
 * free-FLOP, byte-a-second device, against no adapters: each GEMM's
 * operands read and its output written (read too where added into). An
 * ordinary adapter over M rows, in -> out: x [M, in] x A^T [in, r] -> u,
 * u [M, r] x B^T [r, out] added into y [M, out]. kv_a's is ordinary at a
 * token and over the prompt, kv_b's only over the prompt (decompressed);
 * a token runs kv_b's in the absorbed form as the runtime does, four GEMMs
 * a layer over the 16 heads: q_nope_h [1, 128] x B_K_h [128, r] -> u_h;
 * u_h x A [r, 512] added into q'_h; o_h [1, 512] x A^T -> u_h; u_h x
 * B_V_h^T [r, 128] added into out_h (A and the heads' B rows read once). */
static void test_mla_kvb_adapter(void **state)
{
    (void)state;
    plan_hw hw = byte_a_second();
    plan_gen g = one_sequence(512, 256);
    zo_model_config m = lite(0, 128);
    plan_gen_estimate base, ad;
    assert_int_equal(plan_gen_estimate_run(&m, &hw, &g, &base), 0);
    g.method = ZO_PLAN_LORA;
    g.lora = (zo_lora_config){.r = 16, .alpha = 32.0f, .targets = ZO_LORA_K | ZO_LORA_V};
    assert_int_equal(plan_gen_estimate_run(&m, &hw, &g, &ad), 0);
    const double L = 27, es = 2, r = 16, H = 16, h = 2048, kvr = 512, rope = 64, nope = 128, v = 128, P = 512;
    const double eff = hw.hbm_eff;
#define ORDINARY(M, in, out) (((in) * r + (M) * ((in) + r)) + (r * (out) + (M) * (r + 2 * (out))))
    const double kva1 = ORDINARY(1, h, kvr + rope), kvaP = ORDINARY(P, h, kvr + rope);
    const double kvbP = ORDINARY(P, kvr, H * (nope + v));
#undef ORDINARY
    const double kvb1 = (H * nope * r + H * (nope + r)) + (r * kvr + H * (r + 2 * kvr)) +
                        (r * kvr + H * (kvr + r)) + (H * v * r + H * (r + 2 * v));
    double want = L * (kva1 + kvb1) * es / eff, got = ad.compute_s - base.compute_s;
    printf("  a token, LoRA r 16 on k and v - none: %.0f bytes (want %.0f)\n", got * eff, want * eff);
    assert_true(fabs(got - want) <= 1e-9 * base.compute_s);
    want = L * (kvaP + kvbP) * es / eff, got = ad.prompt_compute_s - base.prompt_compute_s;
    printf("  the prompt, LoRA r 16 on k and v - none: %.0f bytes (want %.0f)\n", got * eff, want * eff);
    assert_true(fabs(got - want) <= 1e-9 * base.prompt_compute_s);
}

/* The logits wait, from the schedule's structure: with the disk setting the
 * pace, the host reads the next token's first prefetch_depth blocks, then
 * waits for the logits before it reads on, so the disk idles while the
 * head runs (on the CPU backend also while the copy queued before the head
 * on the same cores runs: the last block read, a layer with prefetch 2).
 * A larger head (vocabulary) lengthens the wait by exactly what it adds to
 * the forward; the CPU backend's wait exceeds the GPU's by a layer's copy.
 * On the CPU backend the disk gives nvme_read_bw_busy while the cores
 * compute and nvme_read_bw the rest of the time (the prompts' first blocks,
 * read before anything runs, at the idle rate); a GPU's forward leaves the
 * host's cores alone: the idle rate throughout. */
static void test_logits_wait(void **state)
{
    (void)state;
    plan_gen g = one_sequence(8, 9);
    g.params_on = ZO_PLAN_NVME;
    plan_hw gpu, host;
    cpu_hw(&gpu);
    gpu.nvme_read_bw = 1e8;
    plan_hw_cpu_backend(&gpu, gpu.peak_flops_16, gpu.pcie_bw, 1ull << 40, &host);
    plan_gen_estimate e[2][2]; /* [small, large vocabulary][GPU, CPU backend] */
    zo_model_config m[2] = {model(0, 4), model(0, 4)};
    m[1].vocab = 10 * m[0].vocab;
    for (int v = 0; v < 2; v++)
        for (int cpu = 0; cpu < 2; cpu++) {
            assert_int_equal(plan_gen_estimate_run(&m[v], cpu ? &host : &gpu, &g, &e[v][cpu]), 0);
            assert_string_equal(e[v][cpu].bound, "nvme");
            printf("  vocab %d, %s: pace %.6g s, logits wait %.6g s, the forward %.6g s\n", m[v].vocab,
                   cpu ? "CPU backend" : "GPU", e[v][cpu].pace_s, e[v][cpu].stall_s, e[v][cpu].compute_s);
        }
    double head = e[1][0].compute_s - e[0][0].compute_s;
    assert_true(head > 0);
    assert_true(fabs((e[1][0].stall_s - e[0][0].stall_s) - head) <= 1e-9 * head);
    zo_param_counts pc;
    zo_model_param_counts(&m[0], &pc);
    double layer_copy = (double)pc.per_layer * 2 / host.pcie_bw;
    for (int v = 0; v < 2; v++)
        assert_true(fabs((e[v][1].stall_s - e[v][0].stall_s) - layer_copy) <= 1e-9 * layer_copy);
    /* the disk beside compute at half its idle rate: on a GPU nothing
     * changes; on the CPU backend the reads take N / idle + W / 2 (W: the
     * device's work of a token, compute plus copies, all of it beside
     * reads while the disk sets the pace); with a disk 1000x faster the
     * device's work covers every read and sets the pace */
    plan_hw busy_gpu = gpu, busy_host = host;
    busy_gpu.nvme_read_bw_busy = busy_host.nvme_read_bw_busy = gpu.nvme_read_bw / 2;
    plan_gen_estimate eg, eh;
    assert_int_equal(plan_gen_estimate_run(&m[0], &busy_gpu, &g, &eg), 0);
    assert_true(eg.pace_s == e[0][0].pace_s && eg.s_per_token == e[0][0].s_per_token && eg.ttft_s == e[0][0].ttft_s);
    assert_int_equal(plan_gen_estimate_run(&m[0], &busy_host, &g, &eh), 0);
    double N = (double)eh.nvme_bytes, W = eh.compute_s + (double)eh.stream_bytes / host.pcie_bw;
    assert_true(W < N / busy_host.nvme_read_bw_busy);
    double want = N / host.nvme_read_bw + W / 2;
    assert_true(fabs(eh.link_s - want) <= 1e-12 * want && eh.pace_s == eh.link_s);
    assert_string_equal(eh.bound, "nvme");
    /* every read after the first blocks slowed alike: a token slower, the
     * first blocks of the prompt at the idle rate (the first token less
     * slowed than reads all at the busy rate would make it) */
    assert_true(eh.s_per_token > e[0][1].s_per_token && eh.ttft_s > e[0][1].ttft_s);
    plan_hw fast = busy_host;
    fast.nvme_read_bw = 1e11, fast.nvme_read_bw_busy = 5e10;
    plan_gen_estimate ef;
    assert_int_equal(plan_gen_estimate_run(&m[0], &fast, &g, &ef), 0);
    assert_string_equal(ef.bound, "compute+copies");
    assert_true(fabs(ef.pace_s - W) <= 1e-12 * W);
}

static int setup(void **state)
{
    (void)state;
    scratch_path(nvme_dir, sizeof nvme_dir, "zo_test_plan_gen_%d", (int)getpid());
    return mkdir(nvme_dir, 0700);
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", nvme_dir);
    return system(cmd) ? -1 : 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peaks),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_plan_run),
        cmocka_unit_test(test_time_model),
        cmocka_unit_test(test_mla_projections),
        cmocka_unit_test(test_mla_kvb_adapter),
        cmocka_unit_test(test_logits_wait),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
