#include "model_config.h"

#include <ctype.h>
#include <limits.h>
#include <stddef.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "common/fileio.h"       /* defines: zo_file_read_all */
#include "common/json.h"         /* defines: zo_json_parse */
#include "common/model_limits.h" /* defines: zo_model_config_check_limits */

/* GPT family: LayerNorm with bias, 4h GELU MLP with biases, learned positions,
 * tied output layer. */
#define GPT(n, al, fam, L, h, a, v, s)                                                    \
    {n, al,                                                                               \
     {.name = n, .family = fam, .arch = ZO_ARCH_GPT, .n_layers = L, .hidden = h,         \
      .n_heads = a, .n_kv_heads = a, .head_dim = (h) / (a), .ffn = 4 * (h), .vocab = v,  \
      .max_seq = s, .tied_embeddings = 1, .attn_bias = 1, .out_bias = 1, .norm_bias = 1, \
      .norm_eps = 1e-5f}}

/* LLaMA family: RMSNorm, SwiGLU, RoPE, GQA, untied output layer, no biases. */
#define LLAMA(n, al, fam, L, h, a, kv, f, v, s, theta, win)                               \
    {n, al,                                                                               \
     {.name = n, .family = fam, .arch = ZO_ARCH_LLAMA, .n_layers = L, .hidden = h,       \
      .n_heads = a, .n_kv_heads = kv, .head_dim = (h) / (a), .ffn = f, .vocab = v,       \
      .max_seq = s, .norm_eps = 1e-5f, .rope_theta = theta, .sliding_window = win}}

/* Qwen3 (config.json of Qwen/Qwen3-*): LLaMA layers with an RMSNorm over each
 * q and k head, head_dim 128 whatever hidden / heads, SiLU, rms_norm_eps
 * 1e-6, rope_theta 1e6, 40960 positions, vocabulary 151936. */
#define QWEN3(n, fam, L, h, a, kv, f, tied, ...)                                          \
    {n, "",                                                                               \
     {.name = n, .family = fam, .arch = ZO_ARCH_LLAMA, .n_layers = L, .hidden = h,       \
      .n_heads = a, .n_kv_heads = kv, .head_dim = 128, .ffn = f, .vocab = 151936,        \
      .max_seq = 40960, .tied_embeddings = tied, .norm_eps = 1e-6f, .rope_theta = 1e6f,  \
      .act = "silu", .qk_norm = 1, __VA_ARGS__}}

/* Granite 3.1 (config.json of ibm-granite/granite-3.1-2b-base, -8b-base):
 * LLaMA layers, GQA of 8 kv heads, SiLU, rms_norm_eps 1e-5, rope_theta 1e7,
 * 131072 positions, vocabulary 49155, tied; the embeddings times 12, the
 * scores times 1 / head_dim, each residual branch times 0.22, the logits
 * over `ls` (none of which changes a size). */
/* Granite-MoE 3.0 (config.json of ibm-granite/granite-3.0-1b-a400m-base,
 * -3b-a800m-base): Granite's layers and multipliers (embeddings times 12,
 * scores times 1/64, each residual branch times 0.22, the logits over 6)
 * with an MoE MLP of E experts of 512 (8 a token, softmax over the chosen),
 * GQA of 8 kv heads, rms_norm_eps 1e-6, rope_theta 1e4, 4096 positions,
 * vocabulary 49155, tied; router_aux_loss_coef 0. */
#define GRANITEMOE(n, L, h, a, E)                                                         \
    {n, "",                                                                               \
     {.name = n, .family = "granitemoe", .arch = ZO_ARCH_LLAMA, .n_layers = L,           \
      .hidden = h, .n_heads = a, .n_kv_heads = 8, .head_dim = (h) / (a), .ffn = 512,     \
      .vocab = 49155, .max_seq = 4096, .tied_embeddings = 1, .norm_eps = 1e-6f,          \
      .rope_theta = 10000.0f, .act = "silu", .embed_mult = 12.0f,                        \
      .attn_mult = (float)(a) / (float)(h), .resid_mult = 0.22f, .logit_div = 6.0f,      \
      .moe = {.experts = E, .top_k = 8, .expert_ffn = 512, .norm_topk = 1}}}

#define GRANITE(n, L, h, a, kv, f, ls)                                                    \
    {n, "",                                                                               \
     {.name = n, .family = "granite", .arch = ZO_ARCH_LLAMA, .n_layers = L, .hidden = h, \
      .n_heads = a, .n_kv_heads = kv, .head_dim = (h) / (a), .ffn = f, .vocab = 49155,   \
      .max_seq = 131072, .tied_embeddings = 1, .norm_eps = 1e-5f, .rope_theta = 1e7f,    \
      .act = "silu", .embed_mult = 12.0f, .attn_mult = (float)(a) / (float)(h),          \
      .resid_mult = 0.22f, .logit_div = ls}}

/* Cohere (config.json of CohereForAI/c4ai-command-r-v01, aya-23-8b; not
 * c4ai-command-r-plus, whose per-head q/k norms the runtime lacks and every
 * preset is built): LLaMA layers, SiLU, a LayerNorm without a bias (layer_norm_eps
 * 1e-5) before a parallel attention and MLP, rotary interleaved over the
 * whole head, 8192 positions, vocabulary 256000, tied; the logits times `ls`
 * (logit_scale). */
#define COHERE(n, L, h, a, kv, f, theta, ls)                                              \
    {n, "",                                                                               \
     {.name = n, .family = "cohere", .arch = ZO_ARCH_LLAMA, .n_layers = L, .hidden = h,  \
      .n_heads = a, .n_kv_heads = kv, .head_dim = (h) / (a), .ffn = f, .vocab = 256000,  \
      .max_seq = 8192, .tied_embeddings = 1, .norm_eps = 1e-5f, .rope_theta = theta,     \
      .act = "silu", .layer_norm = 1, .layer_norms = 1, .parallel_block = 1,             \
      .logit_div = 1.0f / (ls)}}

/* Cohere2 (config.json of CohereForAI/c4ai-command-r7b-12-2024): Cohere's
 * layers, three sliding layers of four (sliding_window_pattern 4) over a
 * window of 4096 with the interleaved rotary (rope_theta 50000), every fourth
 * layer global over all keys and without rotary; 132096 positions, tied,
 * the logits times `ls`. */
#define COHERE2(n, L, h, a, kv, f, ls)                                                     \
    {n, "",                                                                               \
     {.name = n, .family = "cohere2", .arch = ZO_ARCH_LLAMA, .n_layers = L, .hidden = h, \
      .n_heads = a, .n_kv_heads = kv, .head_dim = (h) / (a), .ffn = f, .vocab = 256000,  \
      .max_seq = 132096, .tied_embeddings = 1, .norm_eps = 1e-5f, .rope_theta = 50000.0f, \
      .act = "silu", .layer_norm = 1, .layer_norms = 1, .parallel_block = 1,             \
      .logit_div = 1.0f / (ls), .sliding_window = 4096, .window_period = 4, .global_nope = 1}}

/* SmolLM3 (config.json of HuggingFaceTB/SmolLM3-3B): LLaMA layers (16 heads
 * over 4 kv heads of 128, SwiGLU 11008), every fourth layer without rotary
 * (NoPE: no_rope_layer_interval 4), rope_theta 5e6, 65536 positions,
 * vocabulary 128256, tied. */
#define SMOLLM3(n, L, h, a, kv, f)                                                        \
    {n, "",                                                                               \
     {.name = n, .family = "smollm3", .arch = ZO_ARCH_LLAMA, .n_layers = L, .hidden = h, \
      .n_heads = a, .n_kv_heads = kv, .head_dim = (h) / (a), .ffn = f, .vocab = 128256,  \
      .max_seq = 65536, .tied_embeddings = 1, .norm_eps = 1e-6f, .rope_theta = 5e6f,     \
      .act = "silu", .nope_period = 4}}

/* Gemma (config.json of google/gemma-2b, gemma-7b): LLaMA layers with
 * GeGLU (tanh GELU), head_dim 256 whatever hidden / heads, RMSNorm times
 * (1 + w), the embedding times sqrt(hidden), tied; rms_norm_eps 1e-6, 8192
 * positions, vocabulary 256000. */
#define GEMMA(n, L, h, a, kv, f)                                                          \
    {n, "",                                                                               \
     {.name = n, .family = "gemma", .arch = ZO_ARCH_LLAMA, .n_layers = L, .hidden = h,   \
      .n_heads = a, .n_kv_heads = kv, .head_dim = 256, .ffn = f, .vocab = 256000,        \
      .max_seq = 8192, .tied_embeddings = 1, .norm_eps = 1e-6f, .rope_theta = 10000.0f,  \
      .act = "gelu_pytorch_tanh"}}

/* GPT-NeoX / Pythia (config.json of EleutherAI/pythia-*, gpt-neox-20b):
 * LayerNorm with biases, fused biased query_key_value, rotary on the first
 * quarter of each head (rotary_pct 0.25, base 10000), parallel residual, 4h
 * GELU MLP with biases, untied embed_out; vocabularies padded (50304 ...),
 * 2048 positions. */
#define NEOX(n, L, h, a, v, act_name)                                                    \
    {n, "",                                                                               \
     {.name = n, .family = "gpt_neox", .arch = ZO_ARCH_GPT, .n_layers = L, .hidden = h,  \
      .n_heads = a, .n_kv_heads = a, .head_dim = (h) / (a), .ffn = 4 * (h), .vocab = v,  \
      .max_seq = 2048, .attn_bias = 1, .out_bias = 1, .norm_bias = 1, .norm_eps = 1e-5f, \
      .rope_theta = 10000.0f, .rope_partial = 0.25, .act = act_name,                     \
      .pos = ZO_POS_ROTARY, .parallel_block = 1}}

/* Falcon (config.json of tiiuae/falcon-7b, falcon-40b): LayerNorm, no
 * biases on the projections, rotary over the whole head (64), a parallel
 * attention and MLP (4h, the erf GELU), tied; falcon-7b multi-query with one
 * norm, falcon-40b 8 kv heads with two (the new decoder architecture);
 * vocabulary 65024, 2048 positions. */
#define FALCON(n, L, h, a, kv, norms)                                                    \
    {n, "",                                                                               \
     {.name = n, .family = "falcon", .arch = ZO_ARCH_GPT, .n_layers = L, .hidden = h,    \
      .n_heads = a, .n_kv_heads = kv, .head_dim = (h) / (a), .ffn = 4 * (h),             \
      .vocab = 65024, .max_seq = 2048, .tied_embeddings = 1, .norm_bias = 1,             \
      .norm_eps = 1e-5f, .rope_theta = 10000.0f, .act = "gelu", .pos = ZO_POS_ROTARY,    \
      .layer_norms = norms, .parallel_block = 1}}
/* Falcon-RW (config.json of tiiuae/falcon-rw-1b, falcon-rw-7b): Falcon's
 * layers with ALiBi for positions, a kv head a query head, biases on every
 * projection, the attention and the MLP one after the other, two norms. */
#define FALCON_RW(n, L, h, a, v)                                                         \
    {n, "",                                                                               \
     {.name = n, .family = "falcon", .arch = ZO_ARCH_GPT, .n_layers = L, .hidden = h,    \
      .n_heads = a, .n_kv_heads = a, .head_dim = (h) / (a), .ffn = 4 * (h), .vocab = v,  \
      .max_seq = 2048, .tied_embeddings = 1, .norm_bias = 1, .attn_bias = 1,             \
      .out_bias = 1, .norm_eps = 1e-5f, .rope_theta = 10000.0f, .act = "gelu",           \
      .pos = ZO_POS_ALIBI, .layer_norms = 2}}
/* OPT (config.json of facebook/opt-*): LayerNorm with biases, biased q, k, v,
 * out_proj and fc1/fc2 (4h, ReLU), learned positions of 2048 + 2 rows, tied;
 * vocabulary 50272. */
#define OPT(n, L, h, a)                                                                   \
    {n, "",                                                                               \
     {.name = n, .family = "opt", .arch = ZO_ARCH_GPT, .n_layers = L, .hidden = h,       \
      .n_heads = a, .n_kv_heads = a, .head_dim = (h) / (a), .ffn = 4 * (h),              \
      .vocab = 50272, .max_seq = 2048, .tied_embeddings = 1, .attn_bias = 1,             \
      .out_bias = 1, .norm_bias = 1, .norm_eps = 1e-5f, .act = "relu",                   \
      .pos = ZO_POS_LEARNED, .pos_offset = 2}}
/* Gemma-2 (config.json of google/gemma-2-2b, -9b, -27b): Gemma's layers
 * with four norms (layer_norms 4), scores times query_pre_attn_scalar^-0.5
 * and capped at 50, logits capped at 30, a window of 4096 positions on
 * every other layer from the first; vocabulary 256000, 8192 positions. */
#define GEMMA2(n, L, h, a, kv, hd, f, qpas)                                               \
    {n, "",                                                                               \
     {.name = n, .family = "gemma2", .arch = ZO_ARCH_LLAMA, .n_layers = L, .hidden = h,  \
      .n_heads = a, .n_kv_heads = kv, .head_dim = hd, .ffn = f, .vocab = 256000,         \
      .max_seq = 8192, .tied_embeddings = 1, .norm_eps = 1e-6f, .rope_theta = 10000.0f,  \
      .act = "gelu_pytorch_tanh", .layer_norms = 4, .sliding_window = 4096,              \
      .window_period = 2, .query_pre_attn_scalar = qpas, .attn_softcap = 50.0f,          \
      .final_softcap = 30.0f}}

/* Gemma-3 text (config.json of google/gemma-3-1b-pt and the text_config of
 * gemma-3-4b/12b/27b-pt): Gemma-2's layers with an RMSNorm (1 + w) on each
 * q and k head, no soft caps, a window on 5 layers of 6 whose rotary base
 * is rope_local_base_freq (10000), the global layers' rope_theta 1e6 (4b
 * and up: a linear rope_scaling of 8); vocabulary 262144 (1b) or 262208. */
#define GEMMA3(n, L, h, a, kv, hd, f, qpas, v, s, win, scaling, factor)                   \
    {n, "",                                                                               \
     {.name = n, .family = "gemma3_text", .arch = ZO_ARCH_LLAMA, .n_layers = L,          \
      .hidden = h, .n_heads = a, .n_kv_heads = kv, .head_dim = hd, .ffn = f, .vocab = v, \
      .max_seq = s, .tied_embeddings = 1, .norm_eps = 1e-6f, .rope_theta = 1e6f,         \
      .act = "gelu_pytorch_tanh", .layer_norms = 4, .qk_norm = 1, .sliding_window = win, \
      .window_period = 6, .query_pre_attn_scalar = qpas, .rope_local_theta = 10000.0f,   \
      .rope_scaling = scaling, .rope_factor = factor}}

/* Phi-1, Phi-1.5, Phi-2 (config.json of microsoft/phi-*): LayerNorm with
 * biases, biased q, k, v and dense, rotary on the first part of each head
 * (0.5 of 64, Phi-2's 0.4 of 80, rotate-half), one norm before a parallel
 * attention and MLP (fc1, fc2 with biases, gelu_new), untied lm_head with a
 * bias; vocabulary 51200, 2048 positions. */
#define PHI(n, al, L, h, a, f, part)                                                       \
    {n, al,                                                                               \
     {.name = n, .family = "phi", .arch = ZO_ARCH_GPT, .n_layers = L, .hidden = h,       \
      .n_heads = a, .n_kv_heads = a, .head_dim = (h) / (a), .ffn = f, .vocab = 51200,    \
      .max_seq = 2048, .attn_bias = 1, .out_bias = 1, .norm_bias = 1, .head_bias = 1,    \
      .norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_partial = part, .act = "gelu_new", \
      .pos = ZO_POS_ROTARY, .layer_norms = 1, .parallel_block = 1}}

/* GPT-J (config.json of EleutherAI/gpt-j-6b): LayerNorm with biases, q, k,
 * v and out_proj without, fc_in and fc_out with (gelu_new), rotary on the
 * first 64 dimensions of each head of 256, one norm before a parallel
 * attention and MLP, untied lm_head with a bias; vocabulary 50400, 2048
 * positions. */
#define GPTJ(n, L, h, a, rd)                                                                \
    {n, "",                                                                               \
     {.name = n, .family = "gptj", .arch = ZO_ARCH_GPT, .n_layers = L, .hidden = h,       \
      .n_heads = a, .n_kv_heads = a, .head_dim = (h) / (a), .ffn = 4 * (h), .vocab = 50400, \
      .max_seq = 2048, .out_bias = 1, .attn_out_nobias = 1, .norm_bias = 1, .head_bias = 1, \
      .norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_partial = (double)(rd) / ((h) / (a)), \
      .act = "gelu_new", .pos = ZO_POS_ROTARY, .layer_norms = 1, .parallel_block = 1}}

/* BLOOM (config.json of bigscience/bloom-*): LayerNorm with biases (on the
 * word embeddings too), query_key_value per head, 4h GELU (tanh form) MLP,
 * biases, ALiBi, tied; vocabulary 250880, trained at 2048 positions. */
#define BLOOM(n, L, h, a)                                                                 \
    {n, "",                                                                               \
     {.name = n, .family = "bloom", .arch = ZO_ARCH_GPT, .n_layers = L, .hidden = h,     \
      .n_heads = a, .n_kv_heads = a, .head_dim = (h) / (a), .ffn = 4 * (h),              \
      .vocab = 250880, .max_seq = 2048, .tied_embeddings = 1, .attn_bias = 1,            \
      .out_bias = 1, .norm_bias = 1, .norm_eps = 1e-5f, .pos = ZO_POS_ALIBI,             \
      .embed_norm = 1}}

static const zo_model_preset presets[] = {
    GPT("gpt2", "gpt2-124m,gpt2-small", "gpt2", 12, 768, 12, 50257, 1024),
    GPT("gpt2-medium", "gpt2-355m", "gpt2", 24, 1024, 16, 50257, 1024),
    GPT("gpt2-large", "gpt2-774m", "gpt2", 36, 1280, 20, 50257, 1024),
    GPT("gpt2-xl", "gpt2-1.5b,gpt2-1558m", "gpt2", 48, 1600, 25, 50257, 1024),
    /* Brown et al. 2020, Table 2.1. XL lists 24 heads of 128 (3072 != 2048) and
     * 13B lists d_model 5140: the consistent shapes 16 x 128 and 5120 are used. */
    GPT("gpt3-small", "gpt3-125m", "gpt3", 12, 768, 12, 50257, 2048),
    GPT("gpt3-medium", "gpt3-350m", "gpt3", 24, 1024, 16, 50257, 2048),
    GPT("gpt3-large", "gpt3-760m", "gpt3", 24, 1536, 16, 50257, 2048),
    GPT("gpt3-xl", "gpt3-1.3b", "gpt3", 24, 2048, 16, 50257, 2048),
    GPT("gpt3-2.7b", "", "gpt3", 32, 2560, 32, 50257, 2048),
    GPT("gpt3-6.7b", "", "gpt3", 32, 4096, 32, 50257, 2048),
    GPT("gpt3-13b", "", "gpt3", 40, 5120, 40, 50257, 2048),
    GPT("gpt3-175b", "gpt3,davinci", "gpt3", 96, 12288, 96, 50257, 2048),
    /* Korthikanti et al. 2022, Table 3 (vocabulary 51200, sequence 2048). */
    GPT("megatron-22b", "", "megatron", 48, 6144, 64, 51200, 2048),
    GPT("megatron-175b", "", "megatron", 96, 12288, 96, 51200, 2048),
    GPT("megatron-530b", "mt-nlg-530b", "megatron", 105, 20480, 128, 51200, 2048),
    GPT("megatron-1t", "", "megatron", 128, 25600, 160, 51200, 2048),
    LLAMA("llama-2-7b", "", "llama2", 32, 4096, 32, 32, 11008, 32000, 4096, 10000.0f, 0),
    LLAMA("llama-2-13b", "", "llama2", 40, 5120, 40, 40, 13824, 32000, 4096, 10000.0f, 0),
    LLAMA("llama-2-70b", "", "llama2", 80, 8192, 64, 8, 28672, 32000, 4096, 10000.0f, 0),
    LLAMA("llama-3-8b", "llama-3.1-8b", "llama3", 32, 4096, 32, 8, 14336, 128256, 8192,
          500000.0f, 0),
    LLAMA("llama-3-70b", "llama-3.1-70b", "llama3", 80, 8192, 64, 8, 28672, 128256,
          8192, 500000.0f, 0),
    /* v0.1: attention over a sliding window of 4096 positions */
    LLAMA("mistral-7b", "mistral-7b-v0.1", "mistral", 32, 4096, 32, 8, 14336, 32000, 32768,
          10000.0f, 4096),
    /* Phi-3 (Phi3ForCausalLM; their config.json files): LLaMA layers stored
     * with fused qkv_proj and gate_up_proj; the 4k models attend over a
     * window of 2047 positions, Phi-4 over all of them */
    LLAMA("phi-3-mini-4k", "phi-3-mini-4k-instruct", "phi3", 32, 3072, 32, 32, 8192, 32064, 4096,
          10000.0f, 2047),
    LLAMA("phi-3-medium-4k", "phi-3-medium-4k-instruct", "phi3", 40, 5120, 40, 10, 17920, 32064,
          4096, 10000.0f, 2047),
    LLAMA("phi-4", "", "phi3", 40, 5120, 40, 10, 17920, 100352, 16384, 250000.0f, 0),
    GEMMA("gemma-2b", 18, 2048, 8, 1, 16384),
    GEMMA("gemma-7b", 28, 3072, 16, 16, 24576),
    NEOX("pythia-160m", 12, 768, 12, 50304, "gelu"),
    NEOX("pythia-1.4b", 24, 2048, 16, 50304, "gelu"),
    NEOX("pythia-6.9b", 32, 4096, 32, 50432, "gelu"),
    NEOX("pythia-12b", 36, 5120, 40, 50688, "gelu"),
    NEOX("gpt-neox-20b", 44, 6144, 64, 50432, "gelu_fast"),
    FALCON("falcon-7b", 32, 4544, 71, 1, 1),
    FALCON("falcon-40b", 60, 8192, 128, 8, 2),
    FALCON_RW("falcon-rw-1b", 24, 2048, 32, 50304),
    FALCON_RW("falcon-rw-7b", 36, 4096, 64, 65024),
    /* Phi-1 has Phi-1.5's shape */
    PHI("phi-1.5", "phi-1_5,phi-1", 24, 2048, 32, 8192, 0.5),
    PHI("phi-2", "", 32, 2560, 32, 10240, 0.4),
    GPTJ("gpt-j-6b", 28, 4096, 16, 64),
    OPT("opt-125m", 12, 768, 12),
    OPT("opt-1.3b", 24, 2048, 32),
    OPT("opt-2.7b", 32, 2560, 32),
    OPT("opt-6.7b", 32, 4096, 32),
    OPT("opt-13b", 40, 5120, 40),
    OPT("opt-30b", 48, 7168, 56),
    OPT("opt-66b", 64, 9216, 72),
    BLOOM("bloom-560m", 24, 1024, 16),
    BLOOM("bloom-1b7", 24, 2048, 16),
    BLOOM("bloom-7b1", 30, 4096, 32),
    BLOOM("bloom", 70, 14336, 112),
    GEMMA2("gemma-2-2b", 26, 2304, 8, 4, 256, 9216, 256),
    GEMMA2("gemma-2-9b", 42, 3584, 16, 8, 256, 14336, 256),
    /* heads of 128, but query_pre_attn_scalar 144 (hidden / heads) */
    GEMMA2("gemma-2-27b", 46, 4608, 32, 16, 128, 36864, 144),
    GEMMA3("gemma-3-1b", 26, 1152, 4, 1, 256, 6912, 256, 262144, 32768, 512, "", 1.0f),
    GEMMA3("gemma-3-4b", 34, 2560, 8, 4, 256, 10240, 256, 262208, 131072, 1024, "linear", 8.0f),
    GEMMA3("gemma-3-12b", 48, 3840, 16, 8, 256, 15360, 256, 262208, 131072, 1024, "linear", 8.0f),
    /* heads of 128, query_pre_attn_scalar 168 (hidden / heads) */
    GEMMA3("gemma-3-27b", 62, 5376, 32, 16, 128, 21504, 168, 262208, 131072, 1024, "linear", 8.0f),
    SMOLLM3("smollm3-3b", 36, 2048, 16, 4, 11008),
    GRANITE("granite-3.1-2b", 40, 2048, 32, 8, 8192, 8.0f),
    GRANITE("granite-3.1-8b", 40, 4096, 32, 8, 12800, 16.0f),
    GRANITEMOE("granite-3.0-1b-a400m", 24, 1024, 16, 32),
    GRANITEMOE("granite-3.0-3b-a800m", 32, 1536, 24, 40),
    COHERE("c4ai-command-r-v01", 40, 8192, 64, 64, 22528, 8e6f, 0.0625f),
    COHERE("aya-23-8b", 32, 4096, 32, 8, 14336, 10000.0f, 0.125f),
    COHERE2("c4ai-command-r7b-12-2024", 32, 4096, 32, 8, 14336, 0.25f),
    QWEN3("qwen3-0.6b", "qwen3", 28, 1024, 16, 8, 3072, 1),
    QWEN3("qwen3-8b", "qwen3", 36, 4096, 32, 8, 12288, 0),
    /* 128 routed experts of 768, 8 a token, renormalized (norm_topk_prob) */
    QWEN3("qwen3-30b-a3b", "qwen3_moe", 48, 2048, 32, 4, 6144, 0,
          .moe = {.experts = 128, .top_k = 8, .expert_ffn = 768, .norm_topk = 1, .aux_coef = 0.001f}),
    /* Phi-3.5-MoE (microsoft/Phi-3.5-MoE-instruct's config.json): Mixtral's
     * layers of 16 experts of 6400, 2 a token by the sparsemixer
     * (router_jitter_noise 0.01; router_aux_loss_coef 0), LayerNorms with a bias, q/k/v/o and the
     * untied output layer biased, GQA of 8 kv heads, a window of 131072,
     * longrope over 4096 original positions with both mscales 1.2432. Its
     * factor lists are its config.json's alone: memplan sizes the preset,
     * train and generate refuse it by name (give the config.json) */
    {"phi-3.5-moe", "phi-3.5-moe-instruct",
     {.name = "phi-3.5-moe", .family = "phimoe", .arch = ZO_ARCH_LLAMA, .n_layers = 32, .hidden = 4096,
      .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .ffn = 6400, .vocab = 32064, .max_seq = 131072,
      .attn_bias = 1, .out_bias = 1, .norm_bias = 1, .layer_norm = 1, .head_bias = 1, .norm_eps = 1e-5f,
      .rope_theta = 10000.0f, .act = "silu", .sliding_window = 131072, .rope_scaling = "longrope",
      .rope_factor = 1.0f, .rope_original_max = 4096, .rope_attention_factor = 1.2431631f,
      .rope_long_attention_factor = 1.2431631f,
      .moe = {.experts = 16, .top_k = 2, .expert_ffn = 6400, .aux_coef = 0.0f, .sparsemixer = 1,
              .jitter_eps = 0.01f}}},
    /* DeepSeekMoE 16B (deepseek-ai/deepseek-moe-16b-base's config.json): a
     * dense first layer of 10944, then 27 MoE layers of 64 routed experts of
     * 1408 (6 a token, not renormalized) and 2 shared ones (one MLP of
     * 2816); the balance loss per layer and sequence, alpha 0.001 */
    {"deepseek-moe-16b", "deepseek-moe-16b-base",
     {.name = "deepseek-moe-16b", .family = "deepseek", .arch = ZO_ARCH_LLAMA, .n_layers = 28, .hidden = 2048,
      .n_heads = 16, .n_kv_heads = 16, .head_dim = 128, .ffn = 10944, .vocab = 102400, .max_seq = 4096,
      .norm_eps = 1e-6f, .rope_theta = 10000.0f, .act = "silu",
      .moe = {.experts = 64, .top_k = 6, .expert_ffn = 1408, .shared_ffn = 2816, .first_dense = 1,
              .aux_loss = 1, .aux_coef = 0.001f, .aux_per_layer = 1, .seq_aux = 1}}},
};

const zo_model_preset *zo_model_presets(size_t *count)
{
    *count = sizeof presets / sizeof presets[0];
    return presets;
}

const char *zo_arch_name(zo_arch a) { return a == ZO_ARCH_LLAMA ? "llama" : "gpt"; }

const char *zo_model_family_name(const zo_model_config *c)
{
    return c->family[0] && strcmp(c->family, "custom") ? c->family : zo_arch_name(c->arch);
}

void zo_preset_key(const char *s, char *out, size_t len)
{
    size_t j = 0;
    if (!len) return;
    for (; *s && j + 1 < len; s++) {
        unsigned char c = (unsigned char)*s;
        if (strchr("-_ ", c)) {
            /* between two digits a separator parts two numbers ("1-3" is not "13") */
            if (j && isdigit((unsigned char)out[j - 1]) && isdigit((unsigned char)s[1]) && out[j - 1] != '-')
                out[j++] = '-';
            continue;
        }
        out[j++] = (char)tolower(c);
    }
    out[j] = '\0';
}

static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63) la = 63;
    if (lb > 63) lb = 63;
    int row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* How far `want` (a key) is from the preset's name or nearest alias; 0: one
 * of them is `want`. */
static int preset_distance(const zo_model_preset *p, const char *want)
{
    char norm[96], buf[256];
    zo_preset_key(p->name, norm, sizeof norm);
    int best = edit_distance(norm, want);
    snprintf(buf, sizeof buf, "%s", p->aliases);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        zo_preset_key(tok, norm, sizeof norm);
        int d = edit_distance(norm, want);
        if (d < best) best = d;
    }
    return best;
}

zo_status zo_model_preset_find(const char *name, zo_model_config *out)
{
    char want[96];
    zo_preset_key(name ? name : "", want, sizeof want);
    size_t n = sizeof presets / sizeof presets[0];
    int dist[sizeof presets / sizeof presets[0]];
    size_t found = n, twice = n;
    for (size_t i = 0; i < n; i++) {
        dist[i] = preset_distance(&presets[i], want);
        if (dist[i] != 0) continue;
        if (found == n) found = i;
        else if (twice == n) twice = i;
    }
    /* two presets answering to one name: neither is guessed */
    if (twice < n)
        return zo_error(ZO_ERR_INVALID, "model '%s' names two presets, %s and %s: give the full name",
                        name, presets[found].name, presets[twice].name);
    if (found < n) {
        *out = presets[found].cfg;
        return ZO_OK;
    }
    /* the three closest names */
    char hint[256] = "";
    for (int k = 0; k < 3; k++) {
        size_t bi = 0;
        for (size_t i = 1; i < n; i++)
            if (dist[i] < dist[bi]) bi = i;
        size_t used = strlen(hint);
        snprintf(hint + used, sizeof hint - used, "%s%s", k ? ", " : "", presets[bi].name);
        dist[bi] = 1 << 20;
    }
    return zo_error(ZO_ERR_NOT_FOUND,
                    "unknown model '%s'; closest presets: %s ('memplan models' lists all, or "
                    "give a path to a config.json)",
                    name ? name : "", hint);
}

zo_status zo_model_config_validate(zo_model_config *c)
{
    if (c->params_override) return zo_model_config_check_limits(c);
    struct { const char *name; int v; } f[] = {
        {"layers", c->n_layers}, {"hidden", c->hidden}, {"heads", c->n_heads},
        {"ffn", c->ffn},         {"vocab", c->vocab},   {"seq", c->max_seq},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v <= 0)
            return zo_error(ZO_ERR_INVALID, "model %s: %s must be positive (got %d)", c->name,
                            f[i].name, f[i].v);
    if (c->n_kv_heads <= 0) c->n_kv_heads = c->n_heads;
    if (c->head_dim <= 0) {
        if (c->hidden % c->n_heads)
            return zo_error(ZO_ERR_INVALID, "model %s: heads (%d) must divide hidden (%d)",
                            c->name, c->n_heads, c->hidden);
        c->head_dim = c->hidden / c->n_heads;
    }
    if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads)
        return zo_error(ZO_ERR_INVALID, "model %s: kv-heads (%d) must divide heads (%d)", c->name,
                        c->n_kv_heads, c->n_heads);
    const zo_mla *a = &c->mla;
    /* in 64 bits: the head dims' sums are formed (as int) by the counts */
    if (a->kv_rank && (a->kv_rank < 0 || a->qk_nope < 0 || a->qk_rope < 0 || a->v_dim <= 0 ||
                       a->q_rank < 0 || (int64_t)a->qk_nope + a->qk_rope <= 0 ||
                       (int64_t)a->qk_nope + a->qk_rope > INT_MAX ||
                       (int64_t)a->qk_nope + a->v_dim > INT_MAX))
        return zo_error(ZO_ERR_INVALID, "model %s: latent attention needs qk_nope + qk_rope and "
                                        "v head dims above zero (and their sums within %d)",
                        c->name, INT_MAX);
    const zo_moe *e = &c->moe;
    if (e->experts) {
        if (e->top_k < 1 || e->top_k > e->experts || e->expert_ffn <= 0)
            return zo_error(ZO_ERR_INVALID,
                            "model %s: experts per token (%d) must be 1..%d and the expert "
                            "width positive (%d)",
                            c->name, e->top_k, e->experts, e->expert_ffn);
        if (e->first_dense < 0 || e->first_dense > c->n_layers || e->shared_ffn < 0)
            return zo_error(ZO_ERR_INVALID, "model %s: %d dense first layers of %d", c->name,
                            e->first_dense, c->n_layers);
    }
    /* no product of the shape can overflow, and the constants make sense */
    return zo_model_config_check_limits(c);
}

/* ---- parameter counts ------------------------------------------------------- */

static uint64_t norm_params(const zo_model_config *c, uint64_t width)
{
    return c->norm_bias ? 2 * width : width;
}

uint64_t zo_model_position_rows(const zo_model_config *c)
{
    if ((c->pos == ZO_POS_ARCH && c->arch == ZO_ARCH_GPT) || c->pos == ZO_POS_LEARNED)
        return (uint64_t)c->max_seq + (uint64_t)c->pos_offset;
    return 0;
}

int zo_model_post_norms(const zo_model_config *c)
{
    return c->arch == ZO_ARCH_LLAMA && (c->layer_norms == 4 || c->post_norms_only);
}

int zo_model_pre_norms(const zo_model_config *c) { return !c->post_norms_only; }

int zo_model_qk_norm_rows(const zo_model_config *c)
{
    return !c->qk_norm ? 0 : c->qk_norm_full ? 2 : c->n_heads + c->n_kv_heads;
}

int zo_family_gemma(const char *family)
{
    return !strcmp(family, "gemma") || !strcmp(family, "gemma2") || !strcmp(family, "gemma3_text");
}

int zo_model_layer_sliding(const zo_model_config *c, int l)
{
    if (c->window_period > 0) return (l + 1) % c->window_period != 0;
    return c->sliding_window > 0 && l >= c->window_from_layer;
}

int zo_model_layer_window(const zo_model_config *c, int l)
{
    return zo_model_layer_sliding(c, l) ? c->sliding_window : 0;
}

int zo_model_windows(const zo_model_config *c, int first, int layers, int window[ZO_MODEL_WINDOWS],
                     int count[ZO_MODEL_WINDOWS])
{
    if (layers <= 0) return 0;
    /* zo_model_layer_sliding's rule counted in closed form (the planner
     * asks this of every candidate it searches): with a period p the
     * global layers are those with l + 1 a multiple of p */
    const int end = first + layers;
    int sliding = 0;
    if (c->window_period > 0) {
        sliding = layers - (end / c->window_period - first / c->window_period);
    } else if (c->sliding_window > 0) {
        const int from = first > c->window_from_layer ? first : c->window_from_layer;
        sliding = end > from ? end - from : 0;
    }
    if (c->sliding_window == 0 || sliding == 0 || sliding == layers) {
        window[0] = zo_model_layer_window(c, first);
        if (count) count[0] = layers;
        return 1;
    }
    const int lead = zo_model_layer_sliding(c, first);
    window[0] = lead ? c->sliding_window : 0;
    window[1] = lead ? 0 : c->sliding_window;
    if (count) {
        count[0] = lead ? sliding : layers - sliding;
        count[1] = layers - count[0];
    }
    return 2;
}

int zo_model_layer_rotary(const zo_model_config *c, int l)
{
    if (c->nope_period > 0 && (l + 1) % c->nope_period == 0) return 0;
    return !c->global_nope || zo_model_layer_sliding(c, l);
}

int zo_model_layer_is_moe(const zo_model_config *c, int layer)
{
    return c->moe.experts > 0 && layer >= c->moe.first_dense;
}

int zo_model_moe_layers(const zo_model_config *c)
{
    return c->moe.experts > 0 ? c->n_layers - c->moe.first_dense : 0;
}

uint64_t zo_model_router_bias_params(const zo_model_config *c)
{
    return c->moe.router_bias && !c->params_override ? (uint64_t)c->moe.experts * (uint64_t)zo_model_moe_layers(c) : 0;
}

const char *zo_moe_shared_name(const zo_model_config *c)
{
    return !strncmp(c->family, "deepseek", 8) || !strcmp(c->family, "glm4_moe") ? "shared_experts" : "shared_expert";
}

uint64_t zo_moe_capacity(const zo_model_config *c, double factor, uint64_t n)
{
    if (!(factor > 0) || c->moe.experts < 1) return 0;
    double cap = ceil(factor * (double)n * (double)c->moe.top_k / (double)c->moe.experts);
    if (cap < 1) return 1;
    /* an expert takes a token at most once: n bounds it (and keeps a huge
     * or infinite factor's ceiling out of the conversion) */
    return cap >= (double)n ? n : (uint64_t)cap;
}

uint64_t zo_moe_rank_rows(const zo_model_config *c, double factor, uint64_t n, uint64_t ranks)
{
    uint64_t k = (uint64_t)c->moe.top_k, local = (uint64_t)c->moe.experts / ranks;
    uint64_t rows = ranks * n * (k < local ? k : local);
    if (!(factor > 0)) return rows;
    uint64_t cap = ranks * local * zo_moe_capacity(c, factor, n);
    return cap < rows ? cap : rows;
}

uint64_t zo_moe_expert_rows(const zo_model_config *c, double factor, uint64_t n, uint64_t ranks)
{
    return ranks * (factor > 0 ? zo_moe_capacity(c, factor, n) : n);
}

const char *zo_moe_check_capacity(const zo_model_config *c, double factor)
{
    if (!(factor >= 0)) return "must not be negative";
    if (factor > 0 && !c->moe.experts) return "the model has no experts";
    return NULL;
}

void zo_model_attn_widths(const zo_model_config *c, uint64_t *q, uint64_t *k, uint64_t *v,
                          uint64_t *o)
{
    uint64_t a = (uint64_t)c->n_heads;
    if (c->mla.kv_rank) {
        *q = *k = a * (uint64_t)(c->mla.qk_nope + c->mla.qk_rope);
        *v = *o = a * (uint64_t)c->mla.v_dim;
    } else {
        *q = *o = a * (uint64_t)c->head_dim;
        *k = *v = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim;
    }
}

void zo_model_layer_params(const zo_model_config *c, int layer, zo_layer_params *o)
{
    memset(o, 0, sizeof *o);
    uint64_t h = (uint64_t)c->hidden, f = (uint64_t)c->ffn, q, k, v, out;
    zo_model_attn_widths(c, &q, &k, &v, &out);
    o->replicated = (uint64_t)(c->layer_norms ? c->layer_norms : 2) * norm_params(c, h);

    /* attention: column-parallel q/k/v (with their biases), row-parallel output */
    const zo_mla *a = &c->mla;
    if (a->kv_rank) {
        /* the down projections and their norms are whole on every TP rank */
        uint64_t qr = (uint64_t)a->q_rank, kr = (uint64_t)a->kv_rank;
        if (qr) {
            o->replicated += h * qr + norm_params(c, qr);
            o->tp_split += qr * q;
        } else {
            o->tp_split += h * q;
        }
        o->replicated += h * (kr + (uint64_t)a->qk_rope) + norm_params(c, kr);
        o->tp_split += kr * (uint64_t)c->n_heads * (uint64_t)(a->qk_nope + a->v_dim);
        o->tp_split += out * h;
    } else {
        o->tp_split += h * (q + k + v) + out * h;
        if (c->attn_bias) o->tp_split += q + k + v;
    }
    if (c->out_bias && !c->attn_out_nobias) o->replicated += h; /* the attention output's bias */
    if (c->attn_sinks) o->tp_split += (uint64_t)c->n_heads;    /* a sink logit per query head */
    if (c->qk_norm && (c->qk_norm_heads || c->qk_norm_full)) /* as wide as q and k: split with the heads */
        o->tp_split += norm_params(c, q + k);
    else if (c->qk_norm)
        o->replicated += 2 * norm_params(c, (uint64_t)c->head_dim);

    /* MLP: GPT up/down, LLaMA gate/up/down; or the experts */
    uint64_t mats = c->arch == ZO_ARCH_GPT ? 2 : 3;
    if (zo_model_layer_is_moe(c, layer)) {
        const zo_moe *e = &c->moe;
        o->experts = e->experts;
        o->expert = mats * h * (uint64_t)e->expert_ffn;
        /* gpt-oss: each expert's gate and up biases and its down bias; the
         * router's logit bias */
        if (e->expert_bias) o->expert += (mats - 1) * (uint64_t)e->expert_ffn + h;
        o->replicated += h * (uint64_t)e->experts + (e->router_bias ? (uint64_t)e->experts : 0);
        if (e->router_logit_bias) o->replicated += (uint64_t)e->experts;
        o->tp_split += mats * h * (uint64_t)e->shared_ffn;
        if (e->shared_gate) o->replicated += h;
    } else {
        o->tp_split += mats * h * f;
        if (c->out_bias) {
            o->tp_split += (mats - 1) * f; /* column-parallel inputs */
            o->replicated += h;            /* the output's bias */
        }
    }
    o->total = o->tp_split + o->replicated + (uint64_t)o->experts * o->expert;
    o->active = o->total;
    if (o->experts) o->active -= (uint64_t)(o->experts - c->moe.top_k) * o->expert;
}

void zo_model_param_counts(const zo_model_config *c, zo_param_counts *o)
{
    memset(o, 0, sizeof *o);
    if (c->params_override) {
        o->total = o->active = c->params_override;
        return;
    }
    uint64_t h = (uint64_t)c->hidden, v = (uint64_t)c->vocab;
    o->embedding = v * h + zo_model_position_rows(c) * h + (c->embed_norm ? norm_params(c, h) : 0);
    /* two kinds of layer: dense (all, or DeepSeek's first ones) and MoE */
    int n_moe = zo_model_moe_layers(c);
    int n_dense = c->n_layers - n_moe;
    zo_layer_params d = {0}, e = {0};
    if (n_dense) zo_model_layer_params(c, 0, &d);
    if (n_moe) zo_model_layer_params(c, c->n_layers - 1, &e);
    o->per_layer = n_moe ? e.total : d.total;
    o->layers = (uint64_t)n_dense * d.total + (uint64_t)n_moe * e.total;
    o->experts = (uint64_t)n_moe * (uint64_t)e.experts * e.expert;
    o->moe_layers = n_moe;
    uint64_t active = (uint64_t)n_dense * d.active + (uint64_t)n_moe * e.active;
    o->final_norm = norm_params(c, h);
    /* the output layer's bias is its own, tied or not */
    o->head = (c->tied_embeddings ? 0 : v * h) + (c->head_bias ? v : 0);
    o->total = o->embedding + o->layers + o->final_norm + o->head;
    o->active = o->embedding + active + o->final_norm + o->head;
}

uint64_t zo_model_params(const zo_model_config *c)
{
    zo_param_counts pc;
    zo_model_param_counts(c, &pc);
    return pc.total;
}

/* ---- the runtime's share ------------------------------------------------------ */

/* The runtime's families are the table's trainable ones (below), and the
 * names presets give shapes built of GPT-2's or LLaMA's layers. */
static const char *const preset_families[] = {"", "gpt3", "megatron", "custom", "llama2", "llama3"};
static int family_trainable(const char *type);
static size_t trainable_list(char *out, size_t cap);

/* What the runtime computes (model_layout_init asks the same: the layout holds
 * what the transformer computes, no more) */
zo_status zo_model_config_runtime_check(const zo_model_config *c)
{
    int known = family_trainable(c->family);
    for (size_t i = 0; i < sizeof preset_families / sizeof preset_families[0]; i++)
        known |= !strcmp(c->family, preset_families[i]);
    /* GPT: GELU's tanh form (GPT-2's gelu_new, also named these), GPT-NeoX's
     * erf form ("gelu") too; LLaMA: SiLU, Gemma's gate that tanh form (GeGLU) */
    int gelu_known = !strcmp(c->act, "gelu_new") || !strcmp(c->act, "gelu_fast") ||
                     !strcmp(c->act, "gelu_pytorch_tanh") || (zo_model_qkv_grouped(c) && !strcmp(c->act, "gelu")) ||
                     (zo_model_opt(c) && !strcmp(c->act, "relu")); /* OPT's ReLU */
    int gemma = zo_family_gemma(c->family);
    int other_act = c->act[0] && (c->arch == ZO_ARCH_GPT || gemma ? !gelu_known : strcmp(c->act, "silu"));
    /* GPT-NeoX and Falcon: rotary in place of learned positions, attention and
     * MLP side by side (use_parallel_residual, parallel_attn); Falcon's one
     * norm for both */
    /* (Phi and GPT-J: one norm before a parallel attention and MLP, partial rotary) */
    int grouped = zo_model_qkv_grouped(c), bloom = zo_model_bloom(c), phi = zo_model_phi(c) || zo_model_gptj(c);
    int sc2 = zo_model_starcoder2(c); /* (GPT layers, sequential, with LLaMA's rotary attention) */
    int rotary = c->arch == ZO_ARCH_LLAMA || (grouped && !bloom) || phi || sc2;
    char lacks[96];
    /* (DeepSeek-V2's and V3's latent attention and V3's router correction
     * named first: their family is DeepSeekMoE's otherwise) */
    if (c->mla.kv_rank && c->mla.v_dim > c->mla.qk_nope + c->mla.qk_rope)
        snprintf(lacks, sizeof lacks, "latent attention with v_head_dim past qk_nope + qk_rope");
    else if (c->moe.router_bias && !c->moe_sigmoid)
        snprintf(lacks, sizeof lacks, "a router score correction on softmax scores");
    else if ((c->moe_group_limited || c->moe_sigmoid || c->moe_routed_scale != 0.0f) &&
             strncmp(c->family, "deepseek", 8) && strcmp(c->family, "glm4_moe"))
        snprintf(lacks, sizeof lacks, "DeepSeek's routing outside DeepSeek's layers");
    else if (c->mla.kv_rank && c->attn_bias)
        snprintf(lacks, sizeof lacks, "latent attention with biases (attention_bias)");
    else if ((c->attn_sinks || c->moe.expert_bias || c->moe.router_logit_bias || c->moe.glu_limit > 0.0f) &&
             !zo_model_gpt_oss(c))
        snprintf(lacks, sizeof lacks, "attention sinks and gpt-oss's experts (biased, clamped) outside gpt-oss's "
                 "layers");
    else if (!known) snprintf(lacks, sizeof lacks, "its layers");
    else if (c->moe.experts && c->arch == ZO_ARCH_GPT) snprintf(lacks, sizeof lacks, "its mixture-of-experts layers");
    else if (rotary && (zo_model_rope_dim(c) < 2 || zo_model_rope_dim(c) % 2))
        snprintf(lacks, sizeof lacks, "an odd rotary size (partial_rotary_factor, rotary_pct)");
    else if (c->pos != ZO_POS_ARCH && !((grouped || phi || sc2) && c->pos == ZO_POS_ROTARY) &&
             !(zo_model_opt(c) && c->pos == ZO_POS_LEARNED) &&
             !((bloom || zo_model_falcon(c)) && c->pos == ZO_POS_ALIBI))
        snprintf(lacks, sizeof lacks, "its positions%s", c->pos == ZO_POS_ALIBI ? " (ALiBi)" : "");
    else if (c->layer_norms && c->layer_norms != 2 && !(zo_model_post_norms(c) && gemma) &&
             !((zo_model_falcon(c) || phi || zo_model_cohere(c)) && c->layer_norms == 1 && c->parallel_block))
        snprintf(lacks, sizeof lacks, "its norms");
    else if (c->parallel_block && !grouped && !phi && !zo_model_cohere(c))
        snprintf(lacks, sizeof lacks, "parallel attention and MLP");
    else if (c->layer_norm && !zo_model_cohere(c) && !zo_model_phimoe(c))
        snprintf(lacks, sizeof lacks, "a LayerNorm on LLaMA layers");
    else if (zo_model_falcon(c) && !c->parallel_block && c->n_kv_heads != 1 && c->n_kv_heads != c->n_heads)
        /* FalconConfig has grouped kv heads only with the new decoder
         * architecture, whose attention and MLP are side by side */
        snprintf(lacks, sizeof lacks, "grouped kv heads with sequential attention and MLP");
    else if (c->embed_norm && !bloom) snprintf(lacks, sizeof lacks, "an embedding norm");
    else if (c->qk_norm && c->arch == ZO_ARCH_GPT) snprintf(lacks, sizeof lacks, "q/k norms on GPT layers");
    else if (c->qk_norm_full && (!c->qk_norm || c->qk_norm_heads || c->layer_norm))
        snprintf(lacks, sizeof lacks, "whole-projection q/k norms other than RMSNorms");
    else if (c->post_norms_only && (c->arch != ZO_ARCH_LLAMA || c->layer_norms != 2 || c->parallel_block ||
                                    c->moe.experts || c->mla.kv_rank))
        snprintf(lacks, sizeof lacks, "output norms alone on these layers");
    else if (other_act) snprintf(lacks, sizeof lacks, "the activation %s", c->act);
    else return ZO_OK;
    char list[512]; /* (every trainable model_type: about 300 characters with olmo3) */
    trainable_list(list, sizeof list);
    return zo_error(ZO_ERR_UNSUPPORTED,
                    "model %s: family \"%s\": the runtime does not implement %s (it trains the families "
                    "%s; memplan sizes this family)",
                    c->name, c->family, lacks, list);
}

/* ---- Hugging Face config.json ------------------------------------------- */

/* A reader with a sticky status: the first error is kept, later reads return
 * their defaults, and the parser checks r.st once at the end. */
typedef struct hf {
    const cJSON *root;
    const char *path;
    const char *type; /* the family's model_type, for messages */
    zo_status st;
} hf;

static const cJSON *hf_item(const hf *r, const char *key)
{
    const cJSON *it = key ? cJSON_GetObjectItemCaseSensitive(r->root, key) : NULL;
    return it && !cJSON_IsNull(it) ? it : NULL;
}

static void hf_fail(hf *r, zo_status code, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void hf_fail(hf *r, zo_status code, const char *key, const char *fmt, ...)
{
    if (r->st) return;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    r->st = zo_error(code, "%s: field \"%s\": %s", r->path, key, what);
}

#define REQ (-1) /* a default that makes the key required */

/* An integer at least `min` from the first of `key`, `alt` present; `def`
 * when both are absent, or an error when def is REQ. */
static int hf_int2(hf *r, const char *key, const char *alt, int min, int def)
{
    const cJSON *it = hf_item(r, key);
    const char *name = key;
    if (!it && alt) {
        it = hf_item(r, alt);
        name = alt;
    }
    if (!it) {
        if (def == REQ && !r->st)
            r->st = zo_error(ZO_ERR_FORMAT, "%s: missing field \"%s\"", r->path, key);
        return def;
    }
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < min ||
        it->valuedouble > 2147483647.0) {
        hf_fail(r, ZO_ERR_FORMAT, name, "must be an integer of at least %d", min);
        return def;
    }
    return (int)it->valuedouble;
}

static int hf_int(hf *r, const char *key, int def) { return hf_int2(r, key, NULL, 1, def); }

/* a x b, a width formed from the value of `key` (GPT's 4 x hidden MLP,
 * DeepSeek's shared experts): past an int it is refused naming the key,
 * before the product is formed (n_embd = 2147483647 overflowed it). */
static int hf_times(hf *r, const char *key, int a, int b)
{
    if (a > 0 && b > INT_MAX / a) {
        hf_fail(r, ZO_ERR_FORMAT, key, "%d x %d is more than %d", a, b, INT_MAX);
        return 0;
    }
    return a * b;
}

/* The item when it has the right type; an error naming it when not. */
static const cJSON *hf_typed(hf *r, const char *key, cJSON_bool (*is)(const cJSON *const),
                             const char *what)
{
    const cJSON *it = hf_item(r, key);
    if (it && !is(it)) {
        hf_fail(r, ZO_ERR_FORMAT, key, "must be %s", what);
        return NULL;
    }
    return it;
}

static double hf_double(hf *r, const char *key, double def)
{
    const cJSON *it = hf_typed(r, key, cJSON_IsNumber, "a number");
    return it ? it->valuedouble : def;
}

static float hf_float(hf *r, const char *key, float def) { return (float)hf_double(r, key, def); }

/* A number from the first of `key`, `alt` present; `def` when both are
 * absent. *name (when given): the key read, key when neither is there. */
static double hf_double2(hf *r, const char *key, const char *alt, double def, const char **name)
{
    const char *k = alt && !hf_item(r, key) && hf_item(r, alt) ? alt : key;
    if (name) *name = k;
    return hf_double(r, k, def);
}

/* The rotated part of each head, in (0, 1], from the first of `key`, `alt`
 * present (`def` when neither is), refused naming the key it read; the
 * whole head is 0 (rope_partial's "all"). */
static double hf_rotary_part(hf *r, const char *key, const char *alt, double def)
{
    const char *name;
    double p = hf_double2(r, key, alt, def, &name);
    if (!r->st && !(p > 0.0 && p <= 1.0)) hf_fail(r, ZO_ERR_FORMAT, name, "must be in (0, 1] (got %g)", p);
    return p == 1.0 ? 0.0 : p;
}

static int hf_bool(hf *r, const char *key, int def)
{
    const cJSON *it = hf_typed(r, key, cJSON_IsBool, "true or false");
    return it ? cJSON_IsTrue(it) : def;
}

static void hf_act(hf *r, const char *key, const char *alt, zo_model_config *c)
{
    const cJSON *it = hf_item(r, key);
    if (!it && alt) it = hf_item(r, alt);
    if (it && cJSON_IsString(it)) snprintf(c->act, sizeof c->act, "%.19s", it->valuestring);
}

/* Keys that change the model's size. A family's parser lists the ones it
 * models; any other one set to something but its neutral value is refused. */
typedef enum neutral { N_FALSY = 0, N_TRUE, N_ONE } neutral;
static const struct {
    const char *key;
    neutral neutral;
    const char *what;
} size_keys[] = {
    {"num_local_experts", N_FALSY, "routed experts"},
    {"num_experts", N_FALSY, "routed experts"},
    {"n_routed_experts", N_FALSY, "routed experts"},
    {"moe_intermediate_size", N_FALSY, "expert MLPs"},
    {"shared_expert_intermediate_size", N_FALSY, "a shared expert"},
    {"n_shared_experts", N_FALSY, "shared experts"},
    {"first_k_dense_replace", N_FALSY, "dense first layers among MoE layers"},
    {"moe_layer_freq", N_ONE, "MoE layers every n-th layer"},
    {"decoder_sparse_step", N_ONE, "MoE layers every n-th layer"},
    {"mlp_only_layers", N_FALSY, "dense layers among MoE layers"},
    {"kv_lora_rank", N_FALSY, "latent (low-rank) key/value projections"},
    {"q_lora_rank", N_FALSY, "a low-rank query projection"},
    {"num_nextn_predict_layers", N_FALSY, "multi-token prediction layers"},
    {"attention_bias", N_FALSY, "biases on the q/k/v/o projections"},
    {"mlp_bias", N_FALSY, "MLP biases"},
    {"word_embed_proj_dim", N_FALSY, "embedding projections"},
    {"do_layer_norm_before", N_TRUE, "post-norm layers"},
    {"_remove_final_layer_norm", N_FALSY, "no final norm"},
    {"is_encoder_decoder", N_FALSY, "an encoder-decoder"},
    {"add_cross_attention", N_FALSY, "cross-attention"},
    {"use_qk_norm", N_FALSY, "q/k norms"},
    {"qk_layernorm", N_FALSY, "q/k norms"},
    {"lm_head_bias", N_FALSY, "a biased output layer"},
    {"text_config", N_FALSY, "a multimodal model (the text model is under \"text_config\")"},
    {"vision_config", N_FALSY, "a multimodal model"},
};

static int is_neutral(const cJSON *it, neutral n)
{
    if (!it || cJSON_IsNull(it)) return 1;
    switch (n) {
    case N_TRUE: return cJSON_IsTrue(it);
    case N_ONE: return cJSON_IsNumber(it) && it->valuedouble == 1;
    default:
        return cJSON_IsFalse(it) || (cJSON_IsNumber(it) && it->valuedouble == 0) ||
               ((cJSON_IsArray(it) || cJSON_IsObject(it)) && !it->child) ||
               (cJSON_IsString(it) && !it->valuestring[0]);
    }
}

/* `modelled`: the size keys this family's parser reads, comma-separated. */
static void hf_refuse_unmodelled(hf *r, const char *modelled)
{
    for (size_t i = 0; i < sizeof size_keys / sizeof size_keys[0] && !r->st; i++) {
        const char *k = size_keys[i].key;
        size_t n = strlen(k);
        const char *at = modelled ? strstr(modelled, k) : NULL;
        if (at && (at[n] == ',' || !at[n]) && (at == modelled || at[-1] == ',')) continue;
        if (is_neutral(hf_item(r, k), size_keys[i].neutral)) continue;
        hf_fail(r, ZO_ERR_UNSUPPORTED, k,
                "%s, which memplan's %s parser does not model (the size would be wrong)",
                size_keys[i].what, r->type);
    }
    /* hybrid models name each layer's kind; attention of any window is modelled */
    const cJSON *lt = hf_item(r, "layer_types"), *e;
    cJSON_ArrayForEach(e, lt)
    {
        if (cJSON_IsString(e) && strcmp(e->valuestring, "full_attention") &&
            strcmp(e->valuestring, "sliding_attention")) {
            hf_fail(r, ZO_ERR_UNSUPPORTED, "layer_types",
                    "\"%s\" layers, which memplan does not model", e->valuestring);
            break;
        }
    }
}

/* An FP8 checkpoint's block size and format (quantization_config:
 * quant_method "fp8", weight_block_size [rows, columns], fmt "e4m3" or
 * "e5m2"; zo_model_config.fp8_block, fp8_fmt). A block size under another
 * quant_method is refused (the loader dequantizes "fp8"'s blocks only);
 * other quantization methods are not read here: their weights' dtypes are
 * refused by the loader, by name. activation_scheme is not read: it has
 * no effect on training. */
static void hf_fp8_block(hf *r, zo_model_config *c)
{
    const cJSON *q = hf_item(r, "quantization_config");
    if (!cJSON_IsObject(q)) return;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
    const char *method = cJSON_IsString(m) ? m->valuestring : NULL;
    if (!method || strcmp(method, "fp8")) {
        if (b && !cJSON_IsNull(b))
            hf_fail(r, ZO_ERR_UNSUPPORTED, "quantization_config",
                    "\"weight_block_size\" under quant_method \"%.32s\": the loader dequantizes the blocks of "
                    "quant_method \"fp8\" only", method ? method : "(none)");
        return;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(q, "fmt");
    const char *f = cJSON_IsString(fmt) ? fmt->valuestring : NULL;
    if (f && (!strcmp(f, "e4m3") || !strcmp(f, "e5m2")))
        snprintf(c->fp8_fmt, sizeof c->fp8_fmt, "%s", f);
    else if (fmt && !cJSON_IsNull(fmt))
        hf_fail(r, ZO_ERR_UNSUPPORTED, "quantization_config",
                "\"fmt\" \"%.32s\" is not an FP8 format the loader reads (\"e4m3\" or \"e5m2\")",
                f ? f : "(not a string)");
    if (!b || cJSON_IsNull(b)) return; /* 128 x 128 */
    int ok = cJSON_IsArray(b) && cJSON_GetArraySize(b) == 2;
    for (int i = 0; ok && i < 2; i++) {
        const cJSON *v = cJSON_GetArrayItem(b, i);
        ok = cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1 << 20 &&
             v->valuedouble == (double)(int)v->valuedouble;
        if (ok) c->fp8_block[i] = (int)v->valuedouble;
    }
    if (!ok)
        hf_fail(r, ZO_ERR_FORMAT, "quantization_config",
                "\"weight_block_size\" must be two positive integers [rows, columns] (FP8 blocks)");
}

/* quantization_config's quant_method, kept (zo_model_config.quant_method);
 * under "mxfp4" its modules_to_not_convert, an array of module names or
 * patterns (zo_model_config.quant_keep). */
static void hf_quant_method(hf *r, zo_model_config *c)
{
    const cJSON *q = hf_item(r, "quantization_config");
    if (!cJSON_IsObject(q)) return;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    if (!m || cJSON_IsNull(m)) return;
    if (!cJSON_IsString(m) || strlen(m->valuestring) >= sizeof c->quant_method) {
        hf_fail(r, ZO_ERR_FORMAT, "quantization_config", "\"quant_method\" must be a string of at most %zu characters",
                sizeof c->quant_method - 1);
        return;
    }
    snprintf(c->quant_method, sizeof c->quant_method, "%s", m->valuestring);
    if (strcmp(m->valuestring, "mxfp4")) return;
    const cJSON *keep = cJSON_GetObjectItemCaseSensitive(q, "modules_to_not_convert");
    if (!keep || cJSON_IsNull(keep)) return;
    size_t n = 0;
    const cJSON *e;
    int ok = cJSON_IsArray(keep);
    for (e = ok ? keep->child : NULL; ok && e; e = e->next) {
        size_t len = cJSON_IsString(e) ? strlen(e->valuestring) : 0;
        ok = len > 0 && !strchr(e->valuestring, '\n') && n + len + 1 < sizeof c->quant_keep;
        if (ok) n += (size_t)snprintf(c->quant_keep + n, sizeof c->quant_keep - n, "%s\n", e->valuestring);
    }
    if (!ok)
        hf_fail(r, ZO_ERR_FORMAT, "quantization_config",
                "\"modules_to_not_convert\" must be an array of module names (non-empty strings, %zu characters "
                "in all at most)", sizeof c->quant_keep - 1);
}

/* ---- the families --------------------------------------------------------------- */

typedef struct family family;
struct family {
    const char *type;      /* model_type */
    const char *arch_name; /* architectures[0] of its Hugging Face class */
    void (*parse)(hf *r, zo_model_config *c, const family *f);
    const char *what;      /* what is modelled, or why it is refused */
    int tied;              /* Hugging Face's default of tie_word_embeddings */
    int kv_heads;          /* default num_key_value_heads; 0: the heads */
    int head_dim;          /* default head_dim; 0: hidden / heads */
    const char *modelled;  /* size keys the parser reads */
    int trainable;
};

/* The shape under the keys most families use; `ffn` names the MLP width. */
static void hf_shape(hf *r, zo_model_config *c, const char *ffn)
{
    c->n_layers = hf_int(r, "num_hidden_layers", REQ);
    c->hidden = hf_int(r, "hidden_size", REQ);
    c->n_heads = hf_int(r, "num_attention_heads", REQ);
    c->ffn = hf_int(r, ffn, REQ);
    c->vocab = hf_int(r, "vocab_size", REQ);
    c->max_seq = hf_int(r, "max_position_embeddings", 2048);
}

static void parse_gpt2(hf *r, zo_model_config *c, const family *f)
{
    c->arch = ZO_ARCH_GPT;
    c->attn_bias = c->out_bias = c->norm_bias = 1;
    c->n_layers = hf_int(r, "n_layer", REQ);
    c->hidden = hf_int(r, "n_embd", REQ);
    c->n_heads = hf_int(r, "n_head", REQ);
    c->vocab = hf_int(r, "vocab_size", REQ);
    c->max_seq = hf_int(r, "n_positions", REQ);
    c->ffn = hf_item(r, "n_inner") ? hf_int(r, "n_inner", REQ) : hf_times(r, "n_embd", 4, c->hidden);
    c->norm_eps = hf_float(r, "layer_norm_epsilon", 1e-5f);
    c->tied_embeddings = hf_bool(r, "tie_word_embeddings", f->tied);
    hf_act(r, "activation_function", NULL, c);
}

/* A longrope factor list into out[]: its length, or -1 when it is not a
 * list of numbers or has more than ZO_ROPE_MAX_FACTORS. */
static int hf_factor_list(const cJSON *list, float *out)
{
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) > ZO_ROPE_MAX_FACTORS) return -1;
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list)
    {
        if (!cJSON_IsNumber(e)) return -1;
        out[n++] = (float)e->valuedouble;
    }
    return n;
}

/* longrope as Hugging Face's _compute_longrope_parameters reads it: the
 * original length is the top-level original_max_position_embeddings
 * (Phi3Config's default 4096), s the ratio of max_position_embeddings to
 * it; without that key (another family) the original length is
 * max_position_embeddings and s rope_scaling's factor. The attention
 * factor is rope_scaling's, or sqrt(1 + ln(s) / ln(original)) when s > 1,
 * else 1. The lists are checked
 * against the head size where they are used (the transformer), so that
 * memplan sizes a model whose lists it does not need. */
static void hf_longrope(hf *r, hf *sub, zo_model_config *c, const family *f)
{
    int n_short = hf_factor_list(cJSON_GetObjectItemCaseSensitive(sub->root, "short_factor"), c->rope_short_factor);
    int n_long = hf_factor_list(cJSON_GetObjectItemCaseSensitive(sub->root, "long_factor"), c->rope_long_factor);
    c->rope_n_factors = n_short == n_long ? n_short : -1;
    /* as _compute_longrope_parameters reads them: the top-level original
     * length (Phi3Config always has one, 4096 by default) and s its ratio to
     * max_position_embeddings; without it, the original is
     * max_position_embeddings and s rope_scaling's factor (rope_scaling's
     * own original_max_position_embeddings unread) */
    double s = c->rope_factor;
    if (!strcmp(f->type, "phimoe")) {
        /* PhiMoE's rotary: the original length rope_scaling's own (required,
         * as PhimoeRotaryEmbedding reads it), cos and sin times short_mscale
         * within it and long_mscale past it (numbers, as PhimoeConfig
         * requires), in place of the derived factor */
        c->rope_original_max = hf_int2(sub, "original_max_position_embeddings", NULL, 1, REQ);
        c->rope_attention_factor = hf_float(sub, "short_mscale", 0.0f);
        c->rope_long_attention_factor = hf_float(sub, "long_mscale", 0.0f);
        if (!sub->st && !(c->rope_attention_factor > 0.0f))
            hf_fail(sub, ZO_ERR_FORMAT, "short_mscale", "must be a number > 0 (got %g)", c->rope_attention_factor);
        if (!sub->st && !(c->rope_long_attention_factor > 0.0f))
            hf_fail(sub, ZO_ERR_FORMAT, "long_mscale", "must be a number > 0 (got %g)", c->rope_long_attention_factor);
        return;
    }
    if (!strcmp(f->type, "phi3") || hf_item(r, "original_max_position_embeddings")) {
        c->rope_original_max = hf_int2(r, "original_max_position_embeddings", NULL, 1, 4096);
        s = (double)c->max_seq / c->rope_original_max;
    } else {
        c->rope_original_max = c->max_seq;
    }
    c->rope_attention_factor =
        hf_float(sub, "attention_factor", s > 1.0 ? (float)sqrt(1.0 + log(s) / log((double)c->rope_original_max)) : 1.0f);
    if (!sub->st && !(c->rope_attention_factor > 0.0f))
        hf_fail(sub, ZO_ERR_FORMAT, "attention_factor", "must be > 0 (got %g)", c->rope_attention_factor);
}

/* YaRN's mscale(s, m): 0.1 m ln(s) + 1, or 1 for s <= 1. */
static double yarn_mscale(double s, double m) { return s <= 1.0 ? 1.0 : 0.1 * m * log(s) + 1.0; }

/* yarn as Hugging Face's _compute_yarn_parameters reads it: beta_fast
 * (default 32), beta_slow (1), truncate (true), and the attention factor:
 * rope_scaling's attention_factor, else mscale(factor, mscale) /
 * mscale(factor, mscale_all_dim) when both are given and non-zero
 * (DeepSeek-V2/V3), else mscale(factor, 1). The original length is
 * rope_scaling's original_max_position_embeddings, else
 * max_position_embeddings; the factor is the config's, also where
 * max_position_embeddings / original differs from it (later transformers
 * keep it; some earlier ones derived it from that ratio). DeepSeek's other
 * use of mscale_all_dim, its latent attention's softmax scale times
 * mscale(factor, mscale_all_dim)^2, is the transformer's (layer_attn). */
static void hf_yarn(hf *sub, zo_model_config *c)
{
    c->rope_beta_fast = hf_double(sub, "beta_fast", 32.0);
    c->rope_beta_slow = hf_double(sub, "beta_slow", 1.0);
    c->rope_truncate = hf_bool(sub, "truncate", 1);
    c->rope_mscale = hf_double(sub, "mscale", 0.0);
    c->rope_mscale_all_dim = hf_double(sub, "mscale_all_dim", 0.0);
    if (sub->st) return;
    double s = c->rope_factor;
    if (!(s >= 1.0))
        hf_fail(sub, ZO_ERR_FORMAT, "factor", "must be >= 1 for yarn (got %g)", s);
    else if (!(c->rope_beta_slow > 0.0 && isfinite(c->rope_beta_slow)))
        hf_fail(sub, ZO_ERR_FORMAT, "beta_slow", "must be > 0 (got %g)", c->rope_beta_slow);
    else if (!(c->rope_beta_fast >= c->rope_beta_slow && isfinite(c->rope_beta_fast))) /* (Kimi-K2: 1 and 1) */
        hf_fail(sub, ZO_ERR_FORMAT, "beta_fast", "must not be below beta_slow (got %g and %g)", c->rope_beta_fast,
                c->rope_beta_slow);
    else if (!(c->rope_mscale >= 0.0 && isfinite(c->rope_mscale)))
        hf_fail(sub, ZO_ERR_FORMAT, "mscale", "must be >= 0 (got %g)", c->rope_mscale);
    else if (!(c->rope_mscale_all_dim >= 0.0 && isfinite(c->rope_mscale_all_dim)))
        hf_fail(sub, ZO_ERR_FORMAT, "mscale_all_dim", "must be >= 0 (got %g)", c->rope_mscale_all_dim);
    if (sub->st) return;
    double att = c->rope_mscale > 0.0 && c->rope_mscale_all_dim > 0.0
                     ? yarn_mscale(s, c->rope_mscale) / yarn_mscale(s, c->rope_mscale_all_dim)
                     : yarn_mscale(s, 1.0);
    c->rope_attention_factor = (float)hf_double(sub, "attention_factor", att);
    if (!sub->st && !(c->rope_attention_factor > 0.0f && isfinite(c->rope_attention_factor)))
        hf_fail(sub, ZO_ERR_FORMAT, "attention_factor", "must be > 0 (got %g)", c->rope_attention_factor);
}

/* Which layers attend over the window: layer_types when present, one
 * "full_attention" every p layers, the rest "sliding_attention" (p 0: none
 * full, every layer windowed; none sliding: no window), else every
 * `period`-th layer global (Gemma-2's default: the odd layers). Refused,
 * naming what is wrong: a list of another length than num_hidden_layers
 * (the two counts), an entry that is not one of those two strings (its
 * index), another pattern (the first layer off it). */
static void hf_window_layers(hf *r, zo_model_config *c, int period)
{
    const cJSON *lt = hf_item(r, "layer_types"), *e;
    c->window_period = period;
    if (!lt || r->st) return;
    if (!cJSON_IsArray(lt)) {
        hf_fail(r, ZO_ERR_FORMAT, "layer_types", "must be a list (one entry a layer)");
        return;
    }
    int n = cJSON_GetArraySize(lt);
    if (n != c->n_layers) {
        hf_fail(r, ZO_ERR_FORMAT, "layer_types", "has %d entries, num_hidden_layers is %d (one entry a layer)", n,
                c->n_layers);
        return;
    }
    /* p: one past the first full layer (0: none) */
    int i = 0, p = 0, sliding = 0;
    cJSON_ArrayForEach(e, lt)
    {
        int full = cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention");
        if (!full && !(cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention"))) {
            hf_fail(r, ZO_ERR_FORMAT, "layer_types", "entry %d is not \"full_attention\" or \"sliding_attention\"", i);
            return;
        }
        if (full && !p) p = i + 1;
        sliding += !full;
        i++;
    }
    i = 0;
    cJSON_ArrayForEach(e, lt)
    {
        int full = !strcmp(e->valuestring, "full_attention");
        if (full != (p > 0 && (i + 1) % p == 0)) {
            hf_fail(r, ZO_ERR_UNSUPPORTED, "layer_types",
                    "entry %d is \"%s\": the runtime takes every p-th layer \"full_attention\" and the rest "
                    "\"sliding_attention\" (p = %d here, from the first full layer)", i, e->valuestring, p);
            return;
        }
        i++;
    }
    c->window_period = p;
    if (!sliding) c->sliding_window = 0;
}

/* Cohere2's layers (Cohere2Config): a window of sliding_window (default
 * 4096) on the sliding layers, which layer_types names or, absent it, all but
 * every sliding_window_pattern-th (default 4). Both given: the list must be
 * the pattern's. Refused by name: a null window (Hugging Face's layers would
 * then neither slide nor turn), a window or a pattern below 1. */
static void hf_cohere2_layers(hf *r, zo_model_config *c, int null_window)
{
    if (null_window) {
        hf_fail(r, ZO_ERR_UNSUPPORTED, "sliding_window",
                "null: Cohere2's sliding layers would have no window and no rotary, which the runtime does not "
                "compute (give the window, 4096 in the published configs)");
        return;
    }
    c->sliding_window = hf_int(r, "sliding_window", 4096); /* (hf_int: at least 1) */
    int given = hf_item(r, "sliding_window_pattern") != NULL;
    int period = hf_int(r, "sliding_window_pattern", 4);
    const cJSON *lt = hf_item(r, "layer_types");
    if (!r->st && given && cJSON_IsArray(lt) && cJSON_GetArraySize(lt) == c->n_layers) {
        /* both: the list must be what the pattern says */
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, lt)
        {
            const char *want = (i + 1) % period ? "sliding_attention" : "full_attention";
            if (!cJSON_IsString(e) || strcmp(e->valuestring, want)) {
                hf_fail(r, ZO_ERR_FORMAT, "layer_types",
                        "entry %d is not \"%s\", which sliding_window_pattern %d makes it (give one of the two, "
                        "or both alike)", i, want, period);
                return;
            }
            i++;
        }
    }
    c->global_nope = 1;
    /* (period 1: every layer global; the list: its own period, checked) */
    hf_window_layers(r, c, period);
}

/* A soft cap: its value, absent the family's default, null none (0). */
static float hf_cap(hf *r, const char *key, float def)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(r->root, key);
    if (it && cJSON_IsNull(it)) return 0.0f;
    float v = hf_float(r, key, def);
    if (!r->st && !(v >= 0.0f)) hf_fail(r, ZO_ERR_FORMAT, key, "must be >= 0 or null (got %g)", v);
    return v;
}

/* What limits or rescales attention without changing a size:
 * - sliding_window, as Hugging Face reads it: Mistral's (MistralConfig's
 *   default 4096 when absent, none when null), on every layer; Qwen2's and
 *   Qwen3's (dense and MoE) only with use_sliding_window, on the layers at or past max_window_layers
 *   (default 28); Phi-3's and PhiMoE's on every layer when present and
 *   not null (their configs' default is none);
 * - rope_scaling's rope_type (or its older "type"), unless "default", and
 *   its parameters: factor, llama3's low_freq_factor (default 1),
 *   high_freq_factor (default 4) and original_max_position_embeddings;
 *   longrope's short_factor and long_factor lists and attention_factor,
 *   with Phi-3's top-level original_max_position_embeddings (hf_longrope);
 *   yarn's beta_fast, beta_slow, truncate, mscale, mscale_all_dim and
 *   attention_factor (hf_yarn). */
static void hf_attention_extent(hf *r, zo_model_config *c, const family *f)
{
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(r->root, "sliding_window");
    int null_window = w && cJSON_IsNull(w);
    if (!strcmp(f->type, "mistral") && !null_window) {
        c->sliding_window = hf_int(r, "sliding_window", 4096);
    } else if ((!strcmp(f->type, "qwen2") || !strncmp(f->type, "qwen3", 5)) && !null_window &&
               hf_bool(r, "use_sliding_window", 0)) {
        c->window_from_layer = hf_int2(r, "max_window_layers", NULL, 0, 28);
        if (c->window_from_layer < c->n_layers) c->sliding_window = hf_int(r, "sliding_window", 4096);
    } else if ((!strcmp(f->type, "phi3") || !strcmp(f->type, "phimoe")) && w && !null_window) {
        c->sliding_window = hf_int(r, "sliding_window", REQ);
    } else if (!strcmp(f->type, "gemma2") || !strcmp(f->type, "gpt_oss")) {
        /* (gpt-oss's window 128 on layer_types' "sliding_attention" ones, by default the even) */
        int gpt_oss = !strcmp(f->type, "gpt_oss");
        if (!null_window) c->sliding_window = hf_int(r, "sliding_window", gpt_oss ? 128 : 4096);
        hf_window_layers(r, c, 2);
    } else if (!strcmp(f->type, "gemma3_text")) {
        /* five sliding layers of six (sliding_window_pattern), or layer_types */
        if (!null_window) c->sliding_window = hf_int(r, "sliding_window", 4096);
        hf_window_layers(r, c, hf_int(r, "sliding_window_pattern", 6));
    } else if (!strcmp(f->type, "cohere2")) {
        hf_cohere2_layers(r, c, null_window);
    } else if (!strcmp(f->type, "starcoder2") && w && !null_window) {
        c->sliding_window = hf_int(r, "sliding_window", REQ); /* (every layer's) */
    }
    const cJSON *rs = hf_item(r, "rope_scaling");
    if (!rs) return;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const char *kind = cJSON_IsString(t) ? t->valuestring : "unnamed";
    if (!strcmp(kind, "default")) return;
    snprintf(c->rope_scaling, sizeof c->rope_scaling, "%.15s", kind);
    /* its fields, named in messages as rope_scaling's */
    char path[512];
    snprintf(path, sizeof path, "%s: rope_scaling", r->path);
    hf sub = {rs, path, r->type, ZO_OK};
    c->rope_factor = hf_float(&sub, "factor", 1.0f);
    c->rope_low_freq_factor = hf_float(&sub, "low_freq_factor", 1.0f);
    c->rope_high_freq_factor = hf_float(&sub, "high_freq_factor", 4.0f);
    c->rope_original_max = hf_int2(&sub, "original_max_position_embeddings", NULL, 1, c->max_seq);
    if (!strcmp(kind, "longrope")) hf_longrope(r, &sub, c, f);
    if (!strcmp(kind, "yarn")) hf_yarn(&sub, c);
    if (!sub.st && !(c->rope_factor > 0.0f))
        hf_fail(&sub, ZO_ERR_FORMAT, "factor", "must be > 0 (got %g)", c->rope_factor);
    if (!sub.st && !strcmp(kind, "llama3") &&
        !(c->rope_high_freq_factor > c->rope_low_freq_factor && c->rope_low_freq_factor > 0.0f))
        hf_fail(&sub, ZO_ERR_FORMAT, "high_freq_factor", "must exceed low_freq_factor > 0 (got %g and %g)",
                c->rope_high_freq_factor, c->rope_low_freq_factor);
    if (sub.st && !r->st) r->st = sub.st;
}

/* One of Granite's multipliers (GraniteConfig's default 1): finite and > 0
 * (as a float too), else refused naming the key. */
static float hf_multiplier(hf *r, const char *key)
{
    double v = hf_double(r, key, 1.0);
    if (!r->st && !(v > 0.0 && isfinite((float)v) && (float)v > 0.0f))
        hf_fail(r, ZO_ERR_FORMAT, key, "must be finite and > 0 (got %g)", v);
    return (float)v;
}

/* The LLaMA-shaped families: RMSNorm, gated MLP, rotary positions, GQA. */
static void parse_llama(hf *r, zo_model_config *c, const family *f)
{
    c->arch = ZO_ARCH_LLAMA;
    hf_shape(r, c, "intermediate_size");
    const int phimoe = !strcmp(f->type, "phimoe"); /* PhimoeConfig's defaults: 4096 x 32 positions, eps 1e-5 */
    if (phimoe) c->max_seq = hf_int(r, "max_position_embeddings", 4096 * 32);
    c->n_kv_heads = hf_int(r, "num_key_value_heads", f->kv_heads ? f->kv_heads : c->n_heads);
    c->head_dim = hf_int(r, "head_dim", f->head_dim);
    c->norm_eps = hf_float(r, "rms_norm_eps", phimoe ? 1e-5f : 1e-6f);
    int gemma3 = !strcmp(f->type, "gemma3_text");
    c->rope_theta = hf_float(r, "rope_theta", gemma3 || phimoe ? 1e6f : 10000.0f);
    c->tied_embeddings = hf_bool(r, "tie_word_embeddings", f->tied);
    if (zo_family_gemma(f->type)) {
        /* Hugging Face's GemmaMLP reads hidden_activation alone (hidden_act
         * is ignored: gemma-7b's says "gelu"); absent or null, the tanh form */
        hf_act(r, "hidden_activation", NULL, c);
        if (!c->act[0]) snprintf(c->act, sizeof c->act, "gelu_pytorch_tanh");
    } else {
        hf_act(r, "hidden_act", "hidden_activation", c);
    }
    hf_attention_extent(r, c, f);
    /* Qwen2 and Qwen2-MoE put biases on q, k and v (not o) */
    c->attn_bias = !strcmp(f->type, "qwen2") || !strcmp(f->type, "qwen2_moe");
    /* Qwen3: RMSNorm over head_dim on q and k; Gemma-2: norms after attention
     * and MLP too */
    c->qk_norm = !strncmp(f->type, "qwen3", 5) || gemma3;
    if (!strcmp(f->type, "gemma2") || gemma3) {
        c->layer_norms = 4;
        /* the score scale (query_pre_attn_scalar^-0.5) and the soft caps
         * (Gemma-3's none unless given) */
        c->query_pre_attn_scalar = hf_float(r, "query_pre_attn_scalar", 256.0f);
        if (!r->st && !(c->query_pre_attn_scalar > 0.0f))
            hf_fail(r, ZO_ERR_FORMAT, "query_pre_attn_scalar", "must be > 0 (got %g)", c->query_pre_attn_scalar);
        c->attn_softcap = hf_cap(r, "attn_logit_softcapping", gemma3 ? 0.0f : 50.0f);
        c->final_softcap = hf_cap(r, "final_logit_softcapping", gemma3 ? 0.0f : 30.0f);
    }
    if (gemma3) {
        /* the sliding layers' rotary base (no rope_scaling there) */
        c->rope_local_theta = hf_float(r, "rope_local_base_freq", 10000.0f);
        if (!r->st && !(c->rope_local_theta > 0.0f))
            hf_fail(r, ZO_ERR_FORMAT, "rope_local_base_freq", "must be > 0 (got %g)", c->rope_local_theta);
    }
    if (!strcmp(f->type, "granite") || !strcmp(f->type, "granitemoe")) {
        /* the embeddings, the score scale (in place of 1/sqrt(head_dim)), each
         * residual branch and the logits (divided): no size changes */
        c->embed_mult = hf_multiplier(r, "embedding_multiplier");
        c->attn_mult = hf_multiplier(r, "attention_multiplier");
        c->resid_mult = hf_multiplier(r, "residual_multiplier");
        c->logit_div = hf_multiplier(r, "logits_scaling");
    }
    /* Phi-4-mini rotates only the first partial_rotary_factor of each head
     * (no size changes) */
    if (!strcmp(f->type, "phi3")) c->rope_partial = hf_rotary_part(r, "partial_rotary_factor", NULL, 1.0);
}

int zo_model_fused_proj(const zo_model_config *c) { return !strcmp(c->family, "phi3"); }

int zo_model_neox(const zo_model_config *c) { return !strcmp(c->family, "gpt_neox"); }
int zo_model_falcon(const zo_model_config *c) { return !strcmp(c->family, "falcon"); }
int zo_model_bloom(const zo_model_config *c) { return !strcmp(c->family, "bloom"); }
int zo_model_qkv_grouped(const zo_model_config *c)
{
    return zo_model_neox(c) || zo_model_falcon(c) || zo_model_bloom(c);
}
int zo_model_opt(const zo_model_config *c) { return !strcmp(c->family, "opt"); }
int zo_model_phi(const zo_model_config *c) { return !strcmp(c->family, "phi"); }
int zo_model_gptj(const zo_model_config *c) { return !strcmp(c->family, "gptj"); }
int zo_model_starcoder2(const zo_model_config *c) { return !strcmp(c->family, "starcoder2"); }
int zo_model_cohere(const zo_model_config *c)
{
    return !strcmp(c->family, "cohere") || !strcmp(c->family, "cohere2");
}
int zo_model_granitemoe(const zo_model_config *c) { return !strcmp(c->family, "granitemoe"); }
int zo_model_phimoe(const zo_model_config *c) { return !strcmp(c->family, "phimoe"); }
int zo_model_mixtral_names(const zo_model_config *c) { return !strcmp(c->family, "mixtral") || zo_model_phimoe(c); }
int zo_model_ernie(const zo_model_config *c) { return !strcmp(c->family, "ernie4_5"); }
int zo_model_gpt_oss(const zo_model_config *c) { return !strcmp(c->family, "gpt_oss"); }
int zo_model_rot_interleaved(const zo_model_config *c)
{
    return zo_model_gptj(c) || zo_model_cohere(c) || zo_model_ernie(c);
}

int zo_model_rope_dim(const zo_model_config *c)
{
    if (c->mla.kv_rank) return c->mla.qk_rope; /* latent attention: the rotary key's dims */
    return c->rope_partial > 0.0 ? (int)(c->head_dim * c->rope_partial) : c->head_dim;
}

int zo_model_longrope_switches(const zo_model_config *c, int positions)
{
    return !strcmp(c->rope_scaling, "longrope") && positions > c->rope_original_max;
}

int zo_model_longrope_rows(const zo_model_config *c, int prompt, int context)
{
    const int cross = c->rope_original_max + 1;
    return zo_model_longrope_switches(c, context) && prompt < cross ? cross : prompt;
}

/* The router's training keys (Mixtral, Qwen-MoE): the auxiliary loss as
 * Hugging Face adds it; router jitter (Mixtral's router_jitter_noise, a
 * random multiplier on the router's input in training) is not modelled. */
static void hf_router_training(hf *r, zo_model_config *c)
{
    c->moe.aux_loss = hf_bool(r, "output_router_logits", 0);
    c->moe.aux_coef = hf_float(r, "router_aux_loss_coef", 0.001f);
    if (!r->st && hf_float(r, "router_jitter_noise", 0.0f) != 0.0f)
        hf_fail(r, ZO_ERR_UNSUPPORTED, "router_jitter_noise",
                "router jitter is not modelled (only 0)");
}

/* Mixtral, and Granite-MoE (Granite's layers, whose multipliers parse_llama
 * reads, with Mixtral's MoE MLP: num_local_experts experts of
 * intermediate_size, their gate|up rows fused in input_linear and their
 * down in output_linear (model/layout.c); num_experts_per_tok a token,
 * weighted by a softmax over the chosen logits, which is the softmax
 * renormalized over the chosen; the balance loss as Mixtral's). Their
 * defaults: 8 experts, 2 a token; Mixtral 8 kv heads, Granite-MoE every
 * head (the family table). */
static void parse_mixtral(hf *r, zo_model_config *c, const family *f)
{
    parse_llama(r, c, f);
    c->moe.experts = hf_int(r, "num_local_experts", 8);
    c->moe.top_k = hf_int(r, "num_experts_per_tok", 2);
    c->moe.expert_ffn = c->ffn;
    c->moe.norm_topk = 1;
    hf_router_training(r, c);
}

/* Phi-3.5-MoE (PhiMoEForCausalLM; transformers' PhimoeForCausalLM): Mixtral's layers (block_sparse_moe.gate,
 * experts w1/w3/w2 of intermediate_size; 16 experts, 2 a token) with
 * LayerNorms with a bias (weight and bias, at rms_norm_eps) before attention
 * and MLP and at the end, q, k, v and o biased with attention_bias, the
 * output layer biased with lm_head_bias, longrope with short_mscale and
 * long_mscale (hf_longrope), and the sparsemixer router at
 * router_jitter_noise (default 0.01), top 2 only. The router's training
 * form samples its choices and jitters the layer's input
 * (input_jitter_noise): the runtime trains the eval form (docs/transformer.md). */
static void parse_phimoe(hf *r, zo_model_config *c, const family *f)
{
    parse_llama(r, c, f);
    c->layer_norm = c->norm_bias = 1;
    c->attn_bias = c->out_bias = hf_bool(r, "attention_bias", 0); /* out_bias: o_proj's (no dense MLP) */
    c->head_bias = hf_bool(r, "lm_head_bias", 0);
    c->moe.experts = hf_int(r, "num_local_experts", 16);
    c->moe.top_k = hf_int(r, "num_experts_per_tok", 2);
    c->moe.expert_ffn = c->ffn;
    c->moe.sparsemixer = 1;
    c->moe.aux_loss = hf_bool(r, "output_router_logits", 0);
    c->moe.aux_coef = hf_float(r, "router_aux_loss_coef", 0.001f);
    c->moe.jitter_eps = hf_float(r, "router_jitter_noise", 0.01f);
    if (!r->st && !(c->moe.jitter_eps >= 0.0f && isfinite(c->moe.jitter_eps)))
        hf_fail(r, ZO_ERR_FORMAT, "router_jitter_noise", "must be a finite number >= 0 (got %g)",
                (double)c->moe.jitter_eps);
    double in_jitter = hf_double(r, "input_jitter_noise", 0.0);
    if (!r->st && !(in_jitter >= 0.0 && isfinite(in_jitter)))
        hf_fail(r, ZO_ERR_FORMAT, "input_jitter_noise", "must be a finite number >= 0 (got %g)", in_jitter);
    if (!r->st && c->moe.top_k != 2)
        hf_fail(r, ZO_ERR_UNSUPPORTED, "num_experts_per_tok",
                "the sparsemixer router chooses 2 experts a token (got %d)", c->moe.top_k);
}

/* Qwen2-MoE (Qwen1.5-MoE) and Qwen3-MoE: every layer an MoE layer (the dense
 * exceptions, mlp_only_layers and decoder_sparse_step, are refused). */
static void parse_qwen_moe(hf *r, zo_model_config *c, const family *f)
{
    parse_llama(r, c, f);
    int qwen2 = !strcmp(f->type, "qwen2_moe");
    c->moe.experts = hf_int(r, "num_experts", qwen2 ? 60 : 128);
    c->moe.top_k = hf_int(r, "num_experts_per_tok", qwen2 ? 4 : 8);
    c->moe.expert_ffn = hf_int(r, "moe_intermediate_size", qwen2 ? 1408 : 768);
    c->moe.norm_topk = hf_bool(r, "norm_topk_prob", 0);
    hf_router_training(r, c);
    if (qwen2) {
        c->moe.shared_ffn = hf_int2(r, "shared_expert_intermediate_size", NULL, 0, 5632);
        c->moe.shared_gate = c->moe.shared_ffn > 0;
    }
    if (hf_int(r, "decoder_sparse_step", 1) != 1)
        hf_fail(r, ZO_ERR_UNSUPPORTED, "decoder_sparse_step",
                "MoE layers every n-th layer are not modelled (only 1)");
    if (!is_neutral(hf_item(r, "mlp_only_layers"), N_FALSY))
        hf_fail(r, ZO_ERR_UNSUPPORTED, "mlp_only_layers",
                "dense layers among MoE layers are not modelled");
}

/* The routing groups of V2's group_limited_greedy and V3's noaux_tc
 * (n_group, topk_group; their defaults g_def and kg_def: V3's 8 and 4 as
 * DeepseekV3Config's, V2's required, GLM-4.5's 1 and 1): the groups divide
 * the experts (at most ZO_MOE_MAX_GROUPS, the router's limit), topk_group of
 * them hold at least num_experts_per_tok experts, and V3's groups, scored by
 * their two best keys, have two. */
static void hf_groups_of(hf *r, zo_model_config *c, int v3, int g_def, int kg_def)
{
    const int E = c->moe.experts;
    int g = hf_int(r, "n_group", g_def), kg = hf_int(r, "topk_group", kg_def);
    if (r->st) return;
    if (g > ZO_MOE_MAX_GROUPS || E % g)
        hf_fail(r, ZO_ERR_FORMAT, "n_group", "%d must divide n_routed_experts %d (and be at most %d)", g, E,
                ZO_MOE_MAX_GROUPS);
    else if (v3 && E / g < 2)
        hf_fail(r, ZO_ERR_FORMAT, "n_group", "%d groups of n_routed_experts %d: %s scores a group by its two "
                "best experts (at least 2 a group)", g, E, r->type);
    else if (kg > g)
        hf_fail(r, ZO_ERR_FORMAT, "topk_group", "%d must be 1 to n_group %d", kg, g);
    else if (c->moe.top_k > kg * (E / g))
        hf_fail(r, ZO_ERR_FORMAT, "num_experts_per_tok", "%d is more than the %d experts of topk_group %d "
                "groups of %d", c->moe.top_k, kg * (E / g), kg, E / g);
    c->moe_groups = g;
    c->moe_topk_groups = kg;
}

static void hf_groups(hf *r, zo_model_config *c, int v3) { hf_groups_of(r, c, v3, v3 ? 8 : REQ, v3 ? 4 : REQ); }

/* routed_scaling_factor (> 0; 1 is stored as 0, none) */
static float hf_routed_scale(hf *r, float def)
{
    float rs = hf_float(r, "routed_scaling_factor", def);
    if (!r->st && !(rs > 0.0f))
        hf_fail(r, ZO_ERR_FORMAT, "routed_scaling_factor", "must be > 0 (got %g)", (double)rs);
    return rs == 1.0f ? 0.0f : rs;
}

/* DeepSeek (MoE), DeepSeek-V2 and -V3: latent attention (V2/V3), dense first
 * layers, shared + routed experts; V3's router has a score correction per
 * expert. V3's multi-token prediction modules (num_nextn_predict_layers) are
 * not part of the model Hugging Face builds and are not counted. */
static void parse_deepseek(hf *r, zo_model_config *c, const family *f)
{
    parse_llama(r, c, f);
    int v3 = f->arch_name && !strcmp(f->arch_name, "DeepseekV3ForCausalLM"); /* (and its aliases) */
    if (strcmp(f->type, "deepseek")) {
        c->mla.kv_rank = hf_int(r, "kv_lora_rank", 512);
        c->mla.q_rank = hf_int2(r, "q_lora_rank", NULL, 0, 0); /* null: direct */
        c->mla.qk_nope = hf_int(r, "qk_nope_head_dim", 128);
        c->mla.qk_rope = hf_int(r, "qk_rope_head_dim", 64);
        c->mla.v_dim = hf_int(r, "v_head_dim", 128);
        c->n_kv_heads = c->n_heads;
        if (c->mla.qk_nope > INT_MAX - c->mla.qk_rope) /* both at least 1 */
            hf_fail(r, ZO_ERR_FORMAT, "qk_rope_head_dim", "with qk_nope_head_dim %d it is more than %d",
                    c->mla.qk_nope, INT_MAX);
        else
            c->head_dim = c->mla.qk_nope + c->mla.qk_rope;
    }
    /* n_routed_experts null: a dense model */
    c->moe.experts = hf_int2(r, "n_routed_experts", NULL, 0, 0);
    if (c->moe.experts) {
        c->moe.top_k = hf_int(r, "num_experts_per_tok", REQ);
        c->moe.expert_ffn = hf_int(r, "moe_intermediate_size", REQ);
        c->moe.shared_ffn = hf_times(r, "n_shared_experts", hf_int2(r, "n_shared_experts", NULL, 0, 0),
                                     c->moe.expert_ffn);
        c->moe.first_dense = hf_int2(r, "first_k_dense_replace", NULL, 0, 0);
        /* the gate (MoEGate): softmax scores, the top k, divided by their
         * sum when norm_topk_prob and top_k > 1; in training each MoE
         * layer adds aux_loss_alpha times its own balance loss to the
         * gradient, per sequence with seq_aux. V3's (Hugging Face's
         * DeepseekV3MoE): sigmoid scores, the choice by score plus
         * e_score_correction_bias within the best topk_group groups,
         * divided by their sum when norm_topk_prob (any top_k), and no
         * balance loss in training whatever aux_loss_alpha says */
        c->moe.norm_topk = hf_bool(r, "norm_topk_prob", v3) && (v3 || c->moe.top_k > 1);
        c->moe.aux_coef = v3 ? 0.0f : hf_float(r, "aux_loss_alpha", 0.001f);
        c->moe.aux_loss = c->moe.aux_coef != 0.0f;
        c->moe.aux_per_layer = 1;
        c->moe.seq_aux = hf_bool(r, "seq_aux", 1);
        if (!r->st && !(c->moe.aux_coef >= 0.0f))
            hf_fail(r, ZO_ERR_FORMAT, "aux_loss_alpha", "must be >= 0 (got %g)", c->moe.aux_coef);
        const cJSON *sf = hf_item(r, "scoring_func");
        const char *want = v3 ? "sigmoid" : "softmax";
        if (sf && !(cJSON_IsString(sf) && !strcmp(sf->valuestring, want)))
            hf_fail(r, ZO_ERR_UNSUPPORTED, "scoring_func", "only \"%s\" is modelled for %s", want, f->type);
        const cJSON *m = hf_item(r, "topk_method");
        int is_str = m && cJSON_IsString(m);
        if (v3 && m && !(is_str && !strcmp(m->valuestring, "noaux_tc")))
            hf_fail(r, ZO_ERR_UNSUPPORTED, "topk_method", "DeepSeek-V3 routes with \"noaux_tc\" only");
        if (!v3 && m && !(is_str && (!strcmp(m->valuestring, "greedy") ||
                                     !strcmp(m->valuestring, "group_limited_greedy"))))
            hf_fail(r, ZO_ERR_UNSUPPORTED, "topk_method", "only \"greedy\" and \"group_limited_greedy\" are "
                    "modelled for %s", f->type);
        c->moe.router_bias = v3;
        c->moe_sigmoid = v3;
        c->moe_group_limited = !v3 && is_str && !strcmp(m->valuestring, "group_limited_greedy");
        c->moe_routed_scale = hf_routed_scale(r, v3 ? 2.5f : 1.0f);
        if (v3 || c->moe_group_limited) hf_groups(r, c, v3);
        if (hf_int(r, "moe_layer_freq", 1) != 1)
            hf_fail(r, ZO_ERR_UNSUPPORTED, "moe_layer_freq",
                    "MoE layers every n-th layer are not modelled (only 1)");
    }
}

/* GLM-4.5, GLM-4.5-Air and GLM-4.6 (Glm4MoeForCausalLM): LLaMA layers with
 * q, k and v biased where attention_bias (o_proj never), rotary over the
 * first partial_rotary_factor of each head (0.5; rotate_half's halves, as
 * GPT-NeoX's and Phi-3's, not interleaved), use_qk_norm's RMSNorm over each
 * q and k head (Qwen3's), and DeepSeek-V3's MoE layers (transformers' model
 * is DeepseekV3TopkRouter's): first_k_dense_replace dense layers of
 * intermediate_size, then n_routed_experts experts of moe_intermediate_size
 * and n_shared_experts of it as one ungated MLP (mlp.shared_experts), sigmoid
 * scores chosen with e_score_correction_bias within the best topk_group of
 * n_group groups, renormalized with norm_topk_prob, times
 * routed_scaling_factor; no balance loss in training. Glm4MoeConfig's
 * defaults (GLM-4.5-Air's shape); the multi-token prediction layer
 * (num_nextn_predict_layers) is not part of the model transformers builds
 * and is not counted. */
static void parse_glm4_moe(hf *r, zo_model_config *c, const family *f)
{
    parse_llama(r, c, f);
    c->max_seq = hf_int(r, "max_position_embeddings", 131072);
    c->norm_eps = hf_float(r, "rms_norm_eps", 1e-5f);
    c->attn_bias = hf_bool(r, "attention_bias", 0);
    c->qk_norm = hf_bool(r, "use_qk_norm", 0);
    c->rope_partial = hf_rotary_part(r, "partial_rotary_factor", NULL, 0.5);
    const int d = c->head_dim ? c->head_dim : c->n_heads > 0 ? c->hidden / c->n_heads : 0;
    const int rd = c->rope_partial > 0.0 ? (int)(d * c->rope_partial) : d;
    if (!r->st && (rd < 2 || rd % 2))
        hf_fail(r, ZO_ERR_FORMAT, "partial_rotary_factor",
                "%g of head_dim %d rotates %d dimensions (an even number of at least 2 is needed)",
                c->rope_partial > 0.0 ? c->rope_partial : 1.0, d, rd);
    c->moe.experts = hf_int(r, "n_routed_experts", 128);
    c->moe.top_k = hf_int(r, "num_experts_per_tok", 8);
    c->moe.expert_ffn = hf_int(r, "moe_intermediate_size", 1408);
    c->moe.shared_ffn =
        hf_times(r, "n_shared_experts", hf_int2(r, "n_shared_experts", NULL, 0, 1), c->moe.expert_ffn);
    c->moe.first_dense = hf_int2(r, "first_k_dense_replace", NULL, 0, 1);
    c->moe.norm_topk = hf_bool(r, "norm_topk_prob", 1);
    c->moe.router_bias = c->moe_sigmoid = 1;
    c->moe_routed_scale = hf_routed_scale(r, 1.0f);
    if (!r->st && c->moe.top_k > c->moe.experts)
        hf_fail(r, ZO_ERR_FORMAT, "num_experts_per_tok", "%d is more than n_routed_experts %d", c->moe.top_k,
                c->moe.experts);
    hf_groups_of(r, c, 1, 1, 1);
}

/* GPT-NeoX / Pythia: LayerNorm, fused biased qkv, GELU MLP with biases,
 * partial rotary positions, parallel residual, untied output layer. */
static void parse_neox(hf *r, zo_model_config *c, const family *f)
{
    c->arch = ZO_ARCH_GPT;
    c->pos = ZO_POS_ROTARY;
    c->norm_bias = c->attn_bias = c->out_bias = 1;
    hf_shape(r, c, "intermediate_size");
    c->norm_eps = hf_float(r, "layer_norm_eps", 1e-5f);
    /* GPTNeoXConfig's rotary_emb_base (rope_theta in later configs) */
    c->rope_theta = (float)hf_double2(r, "rotary_emb_base", "rope_theta", 10000.0, NULL);
    c->tied_embeddings = hf_bool(r, "tie_word_embeddings", f->tied);
    c->parallel_block = hf_bool(r, "use_parallel_residual", 1);
    /* GPTNeoXConfig's default hidden_act is "gelu" (the erf form) */
    hf_act(r, "hidden_act", NULL, c);
    if (!c->act[0]) snprintf(c->act, sizeof c->act, "gelu");
    /* the rotated part of each head: rotary_pct (default 0.25; partial_rotary_factor in later configs) */
    c->rope_partial = hf_rotary_part(r, "rotary_pct", "partial_rotary_factor", 0.25);
    hf_attention_extent(r, c, f);
    /* without attention biases the MLP keeps its own: not one of our shapes */
    if (!hf_bool(r, "attention_bias", 1))
        hf_fail(r, ZO_ERR_UNSUPPORTED, "attention_bias",
                "false (an unbiased attention with a biased MLP) is not modelled");
}

/* Falcon: LayerNorm, fused qkv (multi-query, or GQA with the new decoder
 * architecture), GELU MLP, rotary or ALiBi, parallel attention with one norm
 * (two with the new architecture), tied output layer. The old model_types
 * RefinedWebModel (7B) and RefinedWeb (40B) are the same family. */
static void parse_falcon(hf *r, zo_model_config *c, const family *f)
{
    c->arch = ZO_ARCH_GPT;
    c->norm_bias = 1;
    c->n_layers = hf_int2(r, "num_hidden_layers", "n_layer", 1, REQ);
    c->hidden = hf_int2(r, "hidden_size", "n_embed", 1, REQ);
    c->n_heads = hf_int2(r, "num_attention_heads", "n_head", 1, REQ);
    c->vocab = hf_int(r, "vocab_size", REQ);
    c->max_seq = hf_int(r, "max_position_embeddings", 2048);
    c->ffn = hf_item(r, "ffn_hidden_size") ? hf_int(r, "ffn_hidden_size", REQ)
                                           : hf_times(r, "hidden_size", 4, c->hidden);
    c->norm_eps = hf_float(r, "layer_norm_epsilon", 1e-5f);
    c->rope_theta = hf_float(r, "rope_theta", 10000.0f);
    c->tied_embeddings = hf_bool(r, "tie_word_embeddings", f->tied);
    c->attn_bias = c->out_bias = hf_bool(r, "bias", 0);
    c->pos = hf_bool(r, "alibi", 0) ? ZO_POS_ALIBI : ZO_POS_ROTARY;
    int new_arch = hf_bool(r, "new_decoder_architecture", !strcmp(f->type, "RefinedWeb"));
    c->parallel_block = new_arch || hf_bool(r, "parallel_attn", 1);
    if (new_arch) {
        c->n_kv_heads = hf_int2(r, "num_kv_heads", "n_head_kv", 1, c->n_heads);
        c->layer_norms = hf_int(r, "num_ln_in_parallel_attn", 2);
    } else {
        c->n_kv_heads = hf_bool(r, "multi_query", 1) ? 1 : c->n_heads;
        c->layer_norms = c->parallel_block ? 1 : 2;
    }
    /* FalconConfig's default activation is "gelu" (the erf form) */
    hf_act(r, "activation", NULL, c);
    if (!c->act[0]) snprintf(c->act, sizeof c->act, "gelu");
    hf_attention_extent(r, c, f);
}

/* OPT: LayerNorm, biased q/k/v/o and MLP (ReLU), learned positions with two
 * extra rows, tied output layer. OPT-350m's post-norm layers
 * (do_layer_norm_before false, which also drops the final norm: not in
 * `modelled`, so refused by name) and embedding projections are refused. */
static void parse_opt(hf *r, zo_model_config *c, const family *f)
{
    c->arch = ZO_ARCH_GPT;
    c->pos = ZO_POS_LEARNED;
    c->pos_offset = 2;
    c->norm_bias = 1;
    hf_shape(r, c, "ffn_dim");
    c->norm_eps = 1e-5f; /* OPTConfig has no epsilon: torch's LayerNorm default */
    c->tied_embeddings = hf_bool(r, "tie_word_embeddings", f->tied);
    c->attn_bias = c->out_bias = hf_bool(r, "enable_bias", 1);
    /* OPTConfig's default activation_function is "relu" */
    hf_act(r, "activation_function", NULL, c);
    if (!c->act[0]) snprintf(c->act, sizeof c->act, "relu");
    if (hf_int(r, "word_embed_proj_dim", c->hidden) != c->hidden)
        hf_fail(r, ZO_ERR_UNSUPPORTED, "word_embed_proj_dim",
                "an embedding narrower than hidden_size (projected in and out) is not modelled");
    if (!hf_bool(r, "layer_norm_elementwise_affine", 1))
        hf_fail(r, ZO_ERR_UNSUPPORTED, "layer_norm_elementwise_affine",
                "norms without weights are not modelled");
}

/* BLOOM: LayerNorm (also on the word embeddings), fused biased qkv, 4h GELU
 * MLP with biases, ALiBi, tied output layer. */
static void parse_bloom(hf *r, zo_model_config *c, const family *f)
{
    c->arch = ZO_ARCH_GPT;
    c->pos = ZO_POS_ALIBI;
    c->embed_norm = 1;
    c->norm_bias = c->attn_bias = c->out_bias = 1;
    c->n_layers = hf_int2(r, "n_layer", "num_hidden_layers", 1, REQ);
    c->hidden = hf_int2(r, "hidden_size", "n_embed", 1, REQ);
    c->n_heads = hf_int2(r, "n_head", "num_attention_heads", 1, REQ);
    c->vocab = hf_int(r, "vocab_size", REQ);
    c->max_seq = hf_int(r, "seq_length", 2048); /* ALiBi: no table; the training length */
    c->ffn = hf_times(r, "hidden_size", 4, c->hidden);
    c->norm_eps = hf_float(r, "layer_norm_epsilon", 1e-5f);
    c->tied_embeddings = hf_bool(r, "tie_word_embeddings", f->tied);
    /* BloomGelu is GELU's tanh form (the default activation); the residual
     * taken after the norms is another model */
    if (hf_bool(r, "apply_residual_connection_post_layernorm", 0))
        hf_fail(r, ZO_ERR_UNSUPPORTED, "apply_residual_connection_post_layernorm",
                "true (the residual from the norms' outputs) is not modelled");
}

/* Phi-1/1.5/2: LayerNorm, biased q, k, v, dense and GELU MLP (fc1, fc2),
 * partial rotary, one norm before a parallel attention and MLP, an untied
 * output layer with a bias. The q/k LayerNorms (qk_layernorm) are refused
 * as a size key; the dropouts change nothing the runtime computes. */
static void parse_multimodal(hf *r, zo_model_config *c, const family *f);

static void parse_phi(hf *r, zo_model_config *c, const family *f)
{
    c->arch = ZO_ARCH_GPT;
    c->pos = ZO_POS_ROTARY;
    c->norm_bias = c->attn_bias = c->out_bias = c->head_bias = 1;
    c->layer_norms = 1;
    c->parallel_block = 1;
    hf_shape(r, c, "intermediate_size");
    c->n_kv_heads = hf_int(r, "num_key_value_heads", c->n_heads);
    c->norm_eps = hf_float(r, "layer_norm_eps", 1e-5f);
    c->rope_theta = hf_float(r, "rope_theta", 10000.0f);
    c->tied_embeddings = hf_bool(r, "tie_word_embeddings", f->tied);
    /* PhiConfig's default hidden_act is "gelu_new" (the tanh form) */
    hf_act(r, "hidden_act", NULL, c);
    if (!c->act[0]) snprintf(c->act, sizeof c->act, "gelu_new");
    c->rope_partial = hf_rotary_part(r, "partial_rotary_factor", NULL, 0.5);
    hf_attention_extent(r, c, f);
}

/* GPT-J: GPT-2's keys (n_embd, n_layer, n_head, n_inner null: 4 n_embd),
 * LayerNorm, q, k, v and out_proj unbiased, fc_in and fc_out biased, one
 * norm before a parallel attention and MLP, rotary on the first rotary_dim
 * dimensions of each head (null: all of them), an untied output layer with
 * a bias. The dropouts change nothing the runtime computes. */
static void parse_gptj(hf *r, zo_model_config *c, const family *f)
{
    parse_gpt2(r, c, f);
    c->pos = ZO_POS_ROTARY;
    c->attn_bias = 0;
    c->attn_out_nobias = c->head_bias = 1;
    c->layer_norms = 1;
    c->parallel_block = 1;
    c->rope_theta = 10000.0f;
    /* GPTJConfig's default activation_function is "gelu_new" (the tanh form) */
    if (!c->act[0]) snprintf(c->act, sizeof c->act, "gelu_new");
    if (r->st || c->n_heads < 1 || c->hidden % c->n_heads) return; /* (the shape check names it) */
    int d = c->hidden / c->n_heads, rd = hf_int(r, "rotary_dim", d);
    if (!r->st && (rd < 2 || rd > d || rd % 2))
        hf_fail(r, ZO_ERR_FORMAT, "rotary_dim", "must be even and in [2, %d] (got %d)", d, rd);
    /* the rotated part of each head as a fraction, which gives rd back */
    c->rope_partial = rd == d ? 0.0 : (double)rd / d;
    if (!r->st && rd != d && (int)(d * c->rope_partial) != rd) c->rope_partial = (rd + 0.5) / d;
}

/* Cohere (CohereConfig): LLaMA's keys, layer_norm_eps (1e-5), one
 * CohereLayerNorm (no bias) before a parallel attention and MLP, rotary
 * interleaved over the whole head, logits times logit_scale (default
 * 0.0625), tied by default. use_qk_norm (command-r-plus): a LayerNorm over
 * head_dim on each q and k head whose weight is per head, where Qwen3's q/k
 * norms share one (qk_norm_heads).
 * attention_bias true (q, k, v and o biased, the MLP not: no field says
 * that) is refused by name as an unmodelled size key. */
static void parse_cohere(hf *r, zo_model_config *c, const family *f)
{
    parse_llama(r, c, f);
    c->norm_eps = hf_float(r, "layer_norm_eps", 1e-5f);
    c->layer_norm = 1;
    c->qk_norm = c->qk_norm_heads = hf_bool(r, "use_qk_norm", 0);
    c->layer_norms = 1;
    c->parallel_block = 1;
    double ls = hf_double(r, "logit_scale", 0.0625);
    if (!r->st && !(ls > 0.0 && isfinite((float)(1.0 / ls)) && (float)ls > 0.0f))
        hf_fail(r, ZO_ERR_FORMAT, "logit_scale", "must be finite and > 0 (got %g)", ls);
    c->logit_div = (float)(1.0 / ls);
}

/* Cohere2 (Cohere2Config): Cohere's keys and layers, the windows of
 * hf_cohere2_layers (through parse_llama), no rotary on the global layers.
 * Refused by name: use_qk_norm true (Cohere2's attention has no q/k norms,
 * so Hugging Face's model ignores the key) and a head_dim other than hidden
 * / heads (Cohere2Config sets its own). */
static void parse_cohere2(hf *r, zo_model_config *c, const family *f)
{
    if (hf_bool(r, "use_qk_norm", 0))
        hf_fail(r, ZO_ERR_UNSUPPORTED, "use_qk_norm",
                "true: Cohere2's attention has no q/k norms (Cohere's command-r-plus has; Hugging Face's "
                "Cohere2 ignores the key)");
    parse_cohere(r, c, f);
    c->qk_norm = c->qk_norm_heads = 0;
    if (!r->st && c->head_dim && c->head_dim * c->n_heads != c->hidden)
        hf_fail(r, ZO_ERR_FORMAT, "head_dim", "is %d; Cohere2 takes hidden_size / num_attention_heads (%d)",
                c->head_dim, c->hidden / c->n_heads);
}

/* OLMo-2 (Olmo2Config): LLaMA's keys (rms_norm_eps 1e-5, rope_theta
 * 10000, untied by default) and layers with no norm before the attention or
 * the MLP: an RMSNorm on each one's output before its residual add
 * (post_norms_only), and q_norm, k_norm over the whole q and k projections
 * before the heads are split (qk_norm_full). attention_bias true is refused
 * as an unmodelled size key; use_sinks true (a learned sink logit per head,
 * which some Olmo2Config versions carry) by name. */
static void parse_olmo2(hf *r, zo_model_config *c, const family *f)
{
    if (hf_bool(r, "use_sinks", 0))
        hf_fail(r, ZO_ERR_UNSUPPORTED, "use_sinks", "true (attention sinks) is not modelled");
    parse_llama(r, c, f);
    c->norm_eps = hf_float(r, "rms_norm_eps", 1e-5f);
    c->qk_norm = c->qk_norm_full = 1;
    c->post_norms_only = 1;
    c->layer_norms = 2;
}

/* OLMo-3 (Olmo3Config): OLMo-2's keys and layers, three of four
 * (layer_types, or all but every fourth) attending over sliding_window
 * keys (default 4096; null: none), whose rotary is rope_theta's without
 * rope_scaling (Olmo3RotaryEmbedding's "default" for the sliding layers:
 * rope_local_theta), the full layers' with it. */
static void parse_olmo3(hf *r, zo_model_config *c, const family *f)
{
    parse_olmo2(r, c, f);
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(r->root, "sliding_window");
    if (!(w && cJSON_IsNull(w))) c->sliding_window = hf_int(r, "sliding_window", 4096);
    hf_window_layers(r, c, 4);
    c->rope_local_theta = c->rope_theta;
}

/* OLMoE (OlmoeConfig: OLMoE-1B-7B): LLaMA's pre-norm layers (rms_norm_eps
 * 1e-5, untied) with q_norm and k_norm over the whole q and k projections
 * (qk_norm_full, as OLMo-2's) and an MoE MLP in every layer: a router
 * (mlp.gate) and num_experts (64) SwiGLU experts of intermediate_size, the
 * top num_experts_per_tok (8) of the softmax over every expert, renormalized
 * only with norm_topk_prob (default false), no shared expert; the balance
 * loss as Mixtral's at router_aux_loss_coef 0.01 under output_router_logits.
 * clip_qkv (q, k and v clamped) is refused by name when set. */
static void parse_olmoe(hf *r, zo_model_config *c, const family *f)
{
    parse_llama(r, c, f);
    c->norm_eps = hf_float(r, "rms_norm_eps", 1e-5f);
    c->qk_norm = c->qk_norm_full = 1;
    c->moe.experts = hf_int(r, "num_experts", 64);
    c->moe.top_k = hf_int(r, "num_experts_per_tok", 8);
    c->moe.expert_ffn = c->ffn;
    c->moe.norm_topk = hf_bool(r, "norm_topk_prob", 0);
    hf_router_training(r, c);
    c->moe.aux_coef = hf_float(r, "router_aux_loss_coef", 0.01f);
    if (!r->st && hf_item(r, "clip_qkv"))
        hf_fail(r, ZO_ERR_UNSUPPORTED, "clip_qkv", "q, k and v clamped to a bound are not modelled (only null)");
}

/* SmolLM3 (SmolLM3Config: SmolLM3-3B): LLaMA's layers (GQA, 4 kv heads by
 * default, tied, rope_theta 2e6 by default), every no_rope_layer_interval-th
 * layer (4) without rotary: its q and k attend as projected (NoPE;
 * nope_period). no_rope_layers, when given, is that pattern or refused by
 * name (one NoPE layer every n-th, the first at n - 1, is the one modelled);
 * use_sliding_window true (a window on the NoPE layers) is refused by name. */
static void parse_smollm3(hf *r, zo_model_config *c, const family *f)
{
    parse_llama(r, c, f);
    c->rope_theta = hf_float(r, "rope_theta", 2e6f);
    int p = hf_int(r, "no_rope_layer_interval", 4); /* (an integer >= 1) */
    const cJSON *list = hf_item(r, "no_rope_layers");
    if (!r->st && list) {
        /* the period from the first 0 (none in the model's layers: every
         * layer turns), then every entry against it */
        int n = cJSON_GetArraySize(list), first = -1, bad = !cJSON_IsArray(list) || n < c->n_layers;
        for (int l = 0; !bad && l < c->n_layers; l++) {
            const cJSON *e = cJSON_GetArrayItem(list, l);
            bad = !cJSON_IsNumber(e) || (e->valuedouble != 0.0 && e->valuedouble != 1.0);
            if (!bad && e->valuedouble == 0.0 && first < 0) first = l;
        }
        p = first < 0 ? 0 : first + 1;
        for (int l = 0; !bad && l < c->n_layers; l++)
            bad = (cJSON_GetArrayItem(list, l)->valuedouble == 0.0) != (p > 0 && (l + 1) % p == 0);
        if (bad)
            hf_fail(r, ZO_ERR_UNSUPPORTED, "no_rope_layers",
                    "must list 0 or 1 for each of the %d layers, 0 on every n-th layer alone (one NoPE layer every "
                    "n-th is modelled)",
                    c->n_layers);
    }
    c->nope_period = p;
    if (!r->st && hf_bool(r, "use_sliding_window", 0) && hf_item(r, "sliding_window"))
        hf_fail(r, ZO_ERR_UNSUPPORTED, "use_sliding_window",
                "true (a sliding window on the NoPE layers) is not modelled");
}

/* StarCoder2 (Starcoder2Config: starcoder2-3b, -7b, -15b): GPT-2's kind of
 * layer (a LayerNorm with a bias at norm_epsilon before the attention and
 * another before the MLP, sequential; a GELU MLP, c_fc and c_proj) with
 * LLaMA's attention (q, k, v and o_proj apart, GQA, rotary over the whole
 * head at rope_theta, any rope_scaling), every linear layer biased under
 * use_bias (default true), sliding_window (null: none) on every layer,
 * tied by default. The dropouts change nothing the runtime computes. */
static void parse_starcoder2(hf *r, zo_model_config *c, const family *f)
{
    c->arch = ZO_ARCH_GPT;
    c->pos = ZO_POS_ROTARY;
    c->norm_bias = 1;
    hf_shape(r, c, "intermediate_size");
    c->n_kv_heads = hf_int(r, "num_key_value_heads", f->kv_heads);
    c->max_seq = hf_int(r, "max_position_embeddings", 4096);
    c->norm_eps = hf_float(r, "norm_epsilon", 1e-5f);
    c->rope_theta = hf_float(r, "rope_theta", 10000.0f);
    c->tied_embeddings = hf_bool(r, "tie_word_embeddings", f->tied);
    c->attn_bias = c->out_bias = hf_bool(r, "use_bias", 1);
    hf_act(r, "hidden_act", NULL, c);
    if (!c->act[0]) snprintf(c->act, sizeof c->act, "gelu_pytorch_tanh");
    hf_attention_extent(r, c, f);
}

/* Seed-OSS (SeedOssConfig: Seed-OSS-36B): LLaMA's layers with q, k and v
 * biased under attention_bias (default true; the published config: true),
 * o_proj unbiased (attention_out_bias true refused by name), head_dim 128
 * (q 80 x 128 wider than hidden), 8 kv heads, untied. The dropouts change
 * nothing the runtime computes. */
static void parse_seed_oss(hf *r, zo_model_config *c, const family *f)
{
    parse_llama(r, c, f);
    c->attn_bias = hf_bool(r, "attention_bias", 1);
    if (!r->st && hf_bool(r, "attention_out_bias", 0))
        hf_fail(r, ZO_ERR_UNSUPPORTED, "attention_out_bias", "true (a bias on o_proj alone) is not modelled");
}

/* ERNIE 4.5 dense (Ernie4_5Config: ERNIE-4.5-0.3B): LLaMA's layers with
 * every linear layer biased under use_bias (default false: q, k, v, o and
 * the MLP's gate, up, down; out_bias covers o and the MLP), head_dim 128,
 * 2 kv heads, rotary over the whole head with its pairs interleaved (GLM's
 * rotate_half over dims 2i, 2i + 1, as GPT-J's and Cohere's: the rows
 * reordered at load), rope_theta 500000, rms_norm_eps 1e-5, tied by
 * default. */
static void parse_ernie4_5(hf *r, zo_model_config *c, const family *f)
{
    parse_llama(r, c, f);
    c->norm_eps = hf_float(r, "rms_norm_eps", 1e-5f);
    c->rope_theta = hf_float(r, "rope_theta", 500000.0f);
    c->attn_bias = c->out_bias = hf_bool(r, "use_bias", 0);
}

/* gpt-oss (GptOssConfig: gpt-oss-20b, gpt-oss-120b): LLaMA's pre-norm
 * layers (rms_norm_eps 1e-5, head_dim 64, 8 kv heads, untied) with q, k, v
 * and o biased under attention_bias (default true), a learned sink logit
 * per query head in every attention softmax (self_attn.sinks), the
 * "sliding_attention" layers of layer_types (by default the even ones, as
 * Gemma-2's) over a window of sliding_window (128), rotary at rope_theta
 * (150000) with yarn (GptOssConfig's rope_scaling when none is given:
 * factor 32, beta_fast 32, beta_slow 1, untruncated, 4096 original
 * positions), and an MoE MLP in every layer: a router with a logit bias
 * (mlp.router) over num_local_experts (128) biased experts of
 * intermediate_size, the top num_experts_per_tok (4) logits weighed by
 * their softmax (the softmax renormalized over the chosen: Mixtral's), the
 * experts' GLU clamped at swiglu_limit (7; alpha 1.702, as
 * modeling_gpt_oss fixes it); the balance loss as Mixtral's at
 * router_aux_loss_coef 0.9 under output_router_logits. */
static void parse_gpt_oss(hf *r, zo_model_config *c, const family *f)
{
    parse_llama(r, c, f);
    c->max_seq = hf_int(r, "max_position_embeddings", 131072);
    c->norm_eps = hf_float(r, "rms_norm_eps", 1e-5f);
    c->rope_theta = hf_float(r, "rope_theta", 150000.0f);
    c->attn_bias = c->out_bias = hf_bool(r, "attention_bias", 1); /* out_bias: o_proj's (no dense MLP) */
    c->attn_sinks = 1;
    c->moe.experts = hf_int(r, "num_local_experts", 128);
    c->moe.top_k = hf_int(r, "num_experts_per_tok", 4);
    c->moe.expert_ffn = c->ffn;
    c->moe.norm_topk = 1;
    c->moe.expert_bias = c->moe.router_logit_bias = 1;
    c->moe.glu_limit = hf_float(r, "swiglu_limit", 7.0f);
    c->moe.glu_alpha = 1.702f;
    if (!r->st && !(c->moe.glu_limit > 0.0f && isfinite(c->moe.glu_limit)))
        hf_fail(r, ZO_ERR_FORMAT, "swiglu_limit", "must be finite and > 0 (got %g)", (double)c->moe.glu_limit);
    hf_router_training(r, c);
    c->moe.aux_coef = hf_float(r, "router_aux_loss_coef", 0.9f);
    if (r->st || hf_item(r, "rope_scaling")) return;
    /* GptOssConfig's own rotary when the config gives none */
    snprintf(c->rope_scaling, sizeof c->rope_scaling, "yarn");
    c->rope_factor = 32.0f;
    c->rope_original_max = 4096;
    c->rope_beta_fast = 32.0;
    c->rope_beta_slow = 1.0;
    c->rope_truncate = 0;
    c->rope_attention_factor = (float)yarn_mscale(c->rope_factor, 1.0);
}

/* EXAONE 4.0's layer pattern without layer_types: sliding_window_pattern as
 * a period (every p-th layer global), or the string "L...LG" of p letters,
 * which Exaone4Config's docstring reads as that period with the last layer
 * global (so the layers must be a whole number of periods). Refused by name:
 * another string, and null (Hugging Face's config then fails on it). */
static int hf_exaone4_period(hf *r, const zo_model_config *c)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(r->root, "sliding_window_pattern");
    if (!pat) return 4;
    if (!cJSON_IsString(pat)) {
        if (cJSON_IsNull(pat))
            hf_fail(r, ZO_ERR_FORMAT, "sliding_window_pattern",
                    "is null with a sliding_window and no layer_types (give layer_types, or the period)");
        return hf_int(r, "sliding_window_pattern", 4);
    }
    const char *s = pat->valuestring;
    size_t n = strlen(s);
    int ok = n >= 1 && n < 1024 && s[n - 1] == 'G';
    for (size_t i = 0; ok && i + 1 < n; i++) ok = s[i] == 'L';
    if (!ok) {
        hf_fail(r, ZO_ERR_UNSUPPORTED, "sliding_window_pattern",
                "\"%.40s\": the runtime takes local layers (L) then one global (G), repeated (\"LLLG\")", s);
        return 0;
    }
    if (c->n_layers % (int)n)
        hf_fail(r, ZO_ERR_UNSUPPORTED, "sliding_window_pattern",
                "\"%s\" over %d layers: a last layer global out of the pattern's turn is not modelled (give "
                "layer_types)", s, c->n_layers);
    return (int)n;
}

/* EXAONE 4.0 (Exaone4Config: EXAONE-4.0-1.2B, -32B): LLaMA's keys with
 * Exaone4Config's defaults (kv heads as the heads, rms_norm_eps 1e-5,
 * rope_theta 10000, 2048 positions, untied), OLMo-2's norms on the
 * attention's and the MLP's outputs alone (post_norms_only) and Qwen3's
 * per-head q/k RMSNorms before the rotary. With a sliding_window (default
 * 4096) the layers that layer_types names "sliding_attention" (absent it,
 * hf_exaone4_period's) attend over it and turn; the global ones take no
 * rotary (global_nope, as Cohere2's). sliding_window null: every layer
 * global, turned (the 1.2B). rope_scaling (llama3) through parse_llama. */
static void parse_exaone4(hf *r, zo_model_config *c, const family *f)
{
    parse_llama(r, c, f);
    c->norm_eps = hf_float(r, "rms_norm_eps", 1e-5f);
    c->qk_norm = 1;
    c->post_norms_only = 1;
    c->layer_norms = 2;
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(r->root, "sliding_window");
    if (r->st || (w && cJSON_IsNull(w))) return;
    c->sliding_window = hf_int(r, "sliding_window", 4096);
    int period = hf_item(r, "layer_types") ? 0 : hf_exaone4_period(r, c);
    c->global_nope = 1;
    hf_window_layers(r, c, period);
}

#define MOE_KEYS "num_experts,moe_intermediate_size,decoder_sparse_step,mlp_only_layers"
#define DS_KEYS "n_routed_experts,moe_intermediate_size,n_shared_experts,first_k_dense_replace," \
                "moe_layer_freq"
#define MLA_KEYS "kv_lora_rank,q_lora_rank"

static const family families[] = {
    {"gpt2", "GPT2LMHeadModel", parse_gpt2,
     "GPT-2: LayerNorm, biased fused qkv and GELU MLP, learned positions, tied", 1, 0, 0, NULL, 1},
    {"llama", "LlamaForCausalLM", parse_llama,
     "LLaMA 1/2/3: RMSNorm, SwiGLU, rotary, GQA; untied unless tie_word_embeddings", 0, 0, 0,
     NULL, 1},
    {"mistral", "MistralForCausalLM", parse_llama, "Mistral: LLaMA layers (sliding window)", 0,
     8, 0, NULL, 1},
    {"qwen2", "Qwen2ForCausalLM", parse_llama, "Qwen2 / Qwen2.5: LLaMA layers, q/k/v biases", 0,
     32, 0, NULL, 1},
    {"qwen3", "Qwen3ForCausalLM", parse_llama, "Qwen3: LLaMA layers, q/k RMSNorm over head_dim",
     0, 32, 128, NULL, 1},
    {"gemma", "GemmaForCausalLM", parse_llama,
     "Gemma: LLaMA layers with GeGLU, head_dim 256, tied", 1, 16, 256, NULL, 1},
    {"gemma2", "Gemma2ForCausalLM", parse_llama,
     "Gemma-2: Gemma layers with norms before and after attention and MLP (4), soft caps, tied", 1,
     16, 256, NULL, 1},
    {"gemma3_text", "Gemma3ForCausalLM", parse_llama,
     "Gemma-3 (text): Gemma-2 layers with q/k norms, five local layers of six (their own rotary base)",
     1, 4, 256, NULL, 1},
    /* multimodal checkpoints read as their text model (parse_multimodal) */
    {"gemma3", "Gemma3ForConditionalGeneration", parse_multimodal,
     "Gemma-3 4b/12b/27b as published (with vision): the text model of text_config (the vision "
     "tower neither read nor counted)", 1, 4, 256, NULL, 1},
    {"mistral3", "Mistral3ForConditionalGeneration", parse_multimodal,
     "Mistral-Small-3.1/3.2 (with vision): the text model of text_config (the vision tower "
     "neither read nor counted)", 0, 8, 0, NULL, 1},
    {"llava", "LlavaForConditionalGeneration", parse_multimodal,
     "LLaVA-1.5, Pixtral (with vision): the text model of text_config (the vision tower neither "
     "read nor counted)", 0, 0, 0, NULL, 1},
    {"phi3", "Phi3ForCausalLM", parse_llama,
     "Phi-3: LLaMA layers (fused qkv and gate/up projections)", 0, 0, 0, NULL, 1},
    {"granite", "GraniteForCausalLM", parse_llama,
     "Granite 3.x: LLaMA layers with the embeddings, the scores, each residual branch and the logits "
     "times multipliers", 0, 0, 0, NULL, 1},
    {"smollm3", "SmolLM3ForCausalLM", parse_smollm3,
     "SmolLM3: LLaMA layers, every no_rope_layer_interval-th (4th) without rotary (NoPE), tied", 1, 4, 0, NULL, 1},
    {"ernie4_5", "Ernie4_5ForCausalLM", parse_ernie4_5,
     "ERNIE 4.5 (dense): LLaMA layers, head_dim 128, rotary pairs interleaved, every linear layer biased under "
     "use_bias, tied",
     1, 2, 128, NULL, 1},
    {"seed_oss", "SeedOssForCausalLM", parse_seed_oss,
     "Seed-OSS: LLaMA layers with q/k/v biases (attention_bias), head_dim 128", 0, 8, 128, "attention_bias", 1},
    {"exaone4", "Exaone4ForCausalLM", parse_exaone4,
     "EXAONE 4.0: LLaMA layers with RMSNorms on the attention's and the MLP's outputs alone (none before), "
     "q/k RMSNorms over head_dim, three of four layers (layer_types) over a sliding window with rotary, the "
     "others global without (NoPE)",
     0, 0, 0, NULL, 1},
    {"olmo2", "Olmo2ForCausalLM", parse_olmo2,
     "OLMo-2: LLaMA layers with RMSNorms on the attention's and the MLP's outputs alone (none before), "
     "q/k RMSNorms over the whole projections",
     0, 0, 0, NULL, 1},
    {"olmo3", "Olmo3ForCausalLM", parse_olmo3,
     "OLMo-3: OLMo-2 layers, three of four (layer_types) over a sliding window with rope_theta's rotary "
     "unscaled, the others global with rope_scaling's",
     0, 0, 0, NULL, 1},
    {"olmoe", "OlmoeForCausalLM", parse_olmoe,
     "OLMoE: LLaMA layers with q/k RMSNorms over the whole projections, MoE MLP (router + num_experts "
     "SwiGLU experts of intermediate_size, top-k of the softmax)",
     0, 0, 0, "num_experts", 1},
    {"gpt_oss", "GptOssForCausalLM", parse_gpt_oss,
     "gpt-oss: LLaMA layers with biased q/k/v/o, a sink logit per head, every second layer over a window of "
     "128, yarn rotary, MoE MLP (a biased router + num_local_experts biased experts with a clamped GLU, top-k "
     "of the logits weighed by their softmax); dropless",
     0, 8, 64, "num_local_experts,attention_bias", 1},
    {"mixtral", "MixtralForCausalLM", parse_mixtral,
     "Mixtral: Mistral attention, MoE MLP (router + num_local_experts SwiGLU experts)", 0, 8, 0,
     "num_local_experts", 1},
    {"granitemoe", "GraniteMoeForCausalLM", parse_mixtral,
     "Granite-MoE (Granite 3.0/3.1 a400m, a800m): Granite's multipliers on Mixtral's MoE MLP, the "
     "experts stored fused (block_sparse_moe.input_linear, output_linear)", 0, 0, 0,
     "num_local_experts", 1},
    {"phimoe", "PhiMoEForCausalLM", parse_phimoe,
     "Phi-3.5-MoE: Mixtral's MoE layers with LayerNorms with a bias, biased q/k/v/o and output layer, "
     "longrope with short_mscale / long_mscale, the sparsemixer router (its eval form)", 0, 8, 0,
     "num_local_experts,attention_bias,lm_head_bias", 1},
    {"qwen2_moe", "Qwen2MoeForCausalLM", parse_qwen_moe,
     "Qwen1.5-MoE / Qwen2-MoE: Qwen2 attention, routed experts + a gated shared expert", 0, 16,
     0, MOE_KEYS ",shared_expert_intermediate_size", 1},
    {"qwen3_moe", "Qwen3MoeForCausalLM", parse_qwen_moe,
     "Qwen3-MoE: Qwen3 attention, routed experts", 0, 4, 128, MOE_KEYS, 1},
    {"deepseek", "DeepseekForCausalLM", parse_deepseek,
     "DeepSeekMoE: LLaMA attention, dense first layers, shared + routed experts", 0, 0, 0,
     DS_KEYS, 1},
    {"deepseek_v2", "DeepseekV2ForCausalLM", parse_deepseek,
     "DeepSeek-V2: latent attention (MLA), dense first layers, shared + routed experts", 0, 0, 0,
     DS_KEYS "," MLA_KEYS, 1},
    {"deepseek_v3", "DeepseekV3ForCausalLM", parse_deepseek,
     "DeepSeek-V3: V2 layers, sigmoid routing with a score correction per expert (MTP modules "
     "not counted)", 0, 0, 0, DS_KEYS "," MLA_KEYS ",num_nextn_predict_layers", 1},
    /* an alias: the model_type of a checkpoint of another row's class, read as that row */
    {"kimi_k2", "DeepseekV3ForCausalLM", parse_deepseek, "Kimi-K2: read as deepseek_v3 (its class)", 0, 0, 0,
     DS_KEYS "," MLA_KEYS ",num_nextn_predict_layers", 1},
    {"glm4_moe", "Glm4MoeForCausalLM", parse_glm4_moe,
     "GLM-4.5 / GLM-4.5-Air / GLM-4.6: LLaMA layers with q/k/v biases, rotary over half of each head, "
     "use_qk_norm's q/k RMSNorm, dense first layers, DeepSeek-V3's sigmoid routing with a score correction "
     "per expert and shared experts (MTP modules not counted)", 0, 8, 0,
     "n_routed_experts,moe_intermediate_size,n_shared_experts,first_k_dense_replace,"
     "num_nextn_predict_layers,attention_bias,use_qk_norm", 1},
    {"starcoder2", "Starcoder2ForCausalLM", parse_starcoder2,
     "StarCoder2: LayerNorm, biased q/k/v/o (GQA, rotary, a sliding window) and GELU MLP (c_fc, c_proj), "
     "sequential, tied",
     1, 2, 0, NULL, 1},
    {"gpt_neox", "GPTNeoXForCausalLM", parse_neox,
     "GPT-NeoX / Pythia: LayerNorm, biased fused qkv and GELU MLP, partial rotary, parallel "
     "residual, untied", 0, 0, 0, "attention_bias", 1},
    {"falcon", "FalconForCausalLM", parse_falcon,
     "Falcon: LayerNorm, fused multi-query or GQA qkv, GELU MLP, rotary or ALiBi (Falcon-RW), "
     "parallel attention, tied", 1, 0, 0, NULL, 1},
    {"RefinedWebModel", NULL, parse_falcon, "Falcon (its first model_type)", 1, 0, 0, NULL, 1},
    {"RefinedWeb", NULL, parse_falcon, "Falcon-40B (its first model_type)", 1, 0, 0, NULL, 1},
    {"opt", "OPTForCausalLM", parse_opt,
     "OPT: LayerNorm, biased q/k/v/o and ReLU MLP, learned positions (+2 rows), tied", 1, 0, 0,
     "word_embed_proj_dim", 1},
    {"bloom", "BloomForCausalLM", parse_bloom,
     "BLOOM: LayerNorm (and on the embeddings), biased fused qkv and GELU MLP, ALiBi, tied", 1,
     0, 0, NULL, 1},
    {"phi", "PhiForCausalLM", parse_phi,
     "Phi-1/1.5/2: LayerNorm, biased q/k/v/dense and GELU MLP, partial rotary, one norm before a "
     "parallel attention and MLP, untied output layer with a bias", 0, 0, 0, NULL, 1},
    {"gptj", "GPTJForCausalLM", parse_gptj,
     "GPT-J: LayerNorm, unbiased q/k/v/out_proj, biased GELU MLP, rotary interleaved over the first "
     "rotary_dim dimensions, one norm before a parallel attention and MLP, untied output layer with a "
     "bias", 0, 0, 0, NULL, 1},
    {"cohere", "CohereForCausalLM", parse_cohere,
     "Cohere Command-R / Aya: LLaMA layers with a LayerNorm without a bias, one norm before a parallel "
     "attention and MLP, rotary interleaved, the logits times logit_scale, tied; use_qk_norm's "
     "LayerNorms over each q and k head with a weight per head",
     1, 0, 0, "use_qk_norm", 1},
    {"cohere2", "Cohere2ForCausalLM", parse_cohere2,
     "Command-R7B / Command-A: Cohere's layers, three of four (sliding_window_pattern, layer_types) "
     "over a sliding window with the interleaved rotary, the others global without rotary",
     1, 0, 0, NULL, 1},
    /* recognised and refused */
    {"t5", "T5ForConditionalGeneration", NULL, "encoder-decoder", 0, 0, 0, NULL, 0},
    {"mt5", NULL, NULL, "encoder-decoder", 0, 0, 0, NULL, 0},
    {"bart", NULL, NULL, "encoder-decoder", 0, 0, 0, NULL, 0},
    {"whisper", NULL, NULL, "encoder-decoder (speech)", 0, 0, 0, NULL, 0},
    {"bert", "BertForMaskedLM", NULL, "encoder-only", 0, 0, 0, NULL, 0},
    {"roberta", NULL, NULL, "encoder-only", 0, 0, 0, NULL, 0},
    {"mamba", "MambaForCausalLM", NULL, "state-space layers", 0, 0, 0, NULL, 0},
    {"mamba2", NULL, NULL, "state-space layers", 0, 0, 0, NULL, 0},
    {"rwkv", NULL, NULL, "recurrent (RWKV) layers", 0, 0, 0, NULL, 0},
    {"jamba", NULL, NULL, "hybrid attention / state-space layers with experts", 0, 0, 0, NULL, 0},
    {"qwen3_next", NULL, NULL, "hybrid linear / full attention layers", 0, 0, 0, NULL, 0},
    {"phi3small", NULL, NULL, "Phi-3-small: block-sparse attention and its own MLP", 0, 0, 0,
     NULL, 0},
    {"llama4", NULL, NULL, "multimodal with interleaved MoE layers", 0, 0, 0, NULL, 0},
    {"mllama", NULL, NULL, "multimodal (cross-attention layers)", 0, 0, 0, NULL, 0},
};

static const zo_family_info *family_infos(size_t *count)
{
    static zo_family_info info[sizeof families / sizeof families[0]];
    *count = sizeof families / sizeof families[0];
    for (size_t i = 0; i < *count; i++)
        info[i] = (zo_family_info){families[i].type, families[i].what, families[i].parse != NULL,
                                   families[i].trainable};
    return info;
}

const zo_family_info *zo_model_families(size_t *count) { return family_infos(count); }

static const family *family_by_type(const char *t)
{
    for (size_t i = 0; t && i < sizeof families / sizeof families[0]; i++)
        if (!strcmp(families[i].type, t)) return &families[i];
    return NULL;
}

static int family_trainable(const char *type)
{
    const family *f = family_by_type(type);
    return f && f->trainable;
}

/* The trainable families' model_types, ", " between them, into out. */
static size_t trainable_list(char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (families[i].trainable && n < cap)
            n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? ", " : "", families[i].type);
    return n;
}

static const family *family_by_arch(const cJSON *archs)
{
    const cJSON *a = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    for (size_t i = 0; cJSON_IsString(a) && i < sizeof families / sizeof families[0]; i++)
        if (families[i].arch_name && !strcmp(families[i].arch_name, a->valuestring))
            return &families[i];
    return NULL;
}

/* The first row of f's class (f itself unless f is an alias: kimi_k2's is deepseek_v3). */
static const family *family_of_alias(const family *f)
{
    for (size_t i = 0; f->arch_name && i < sizeof families / sizeof families[0]; i++)
        if (families[i].arch_name && !strcmp(families[i].arch_name, f->arch_name)) return &families[i];
    return f;
}

static void list_modelled(char *buf, size_t len)
{
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        if (!families[i].parse || !families[i].arch_name) continue;
        size_t u = strlen(buf);
        snprintf(buf + u, len - u, "%s%s", u ? ", " : "", families[i].type);
    }
}

static const family *family_by_type(const char *t);

/* A text model's keys that published multimodal configs leave to its
 * class's defaults (Gemma3TextConfig's, LlamaConfig's, MistralConfig's):
 * gemma-3-4b's text_config gives five shape keys, llava-1.5-7b's none. */
typedef struct hf_default {
    const char *key;
    double v;
} hf_default;
static const hf_default gemma3_text_defaults[] = {
    {"vocab_size", 262208},        {"hidden_size", 2304},  {"intermediate_size", 9216},
    {"num_hidden_layers", 26},     {"num_attention_heads", 8}, {"num_key_value_heads", 4},
    {"head_dim", 256},             {"max_position_embeddings", 131072},
    {"query_pre_attn_scalar", 256}, {"sliding_window", 4096}, {NULL, 0}};
static const hf_default llama_defaults[] = {
    {"vocab_size", 32000},         {"hidden_size", 4096},  {"intermediate_size", 11008},
    {"num_hidden_layers", 32},     {"num_attention_heads", 32}, {"max_position_embeddings", 2048},
    {NULL, 0}};
static const hf_default mistral_defaults[] = {
    {"vocab_size", 32000},         {"hidden_size", 4096},  {"intermediate_size", 14336},
    {"num_hidden_layers", 32},     {"num_attention_heads", 32}, {"num_key_value_heads", 8},
    {"max_position_embeddings", 131072}, {NULL, 0}};

/* Each wrapper's text model_type when text_config names none (its config
 * class's default), and the defaults of the text classes. */
static const struct {
    const char *wrapper, *text;
} mm_wrappers[] = {{"gemma3", "gemma3_text"}, {"mistral3", "mistral"}, {"llava", "llama"}};
static const struct {
    const char *type;
    const hf_default *d;
} mm_defaults[] = {{"gemma3_text", gemma3_text_defaults}, {"llama", llama_defaults}, {"mistral", mistral_defaults}};

/* A multimodal checkpoint (Gemma-3 4b/12b/27b, Mistral-Small-3.1, LLaVA as
 * published) as its text model: text_config parsed as a config of the
 * family its model_type names (the wrapper's default when it names none),
 * its absent keys the text class's defaults; a LLaMA-family text model only.
 * The vision tower and projector are not modelled (zo_model_config.mm_text). */
static void parse_multimodal(hf *r, zo_model_config *c, const family *f)
{
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(r->root, "text_config");
    if (!cJSON_IsObject(tc)) {
        hf_fail(r, ZO_ERR_FORMAT, "text_config", "%s (the text model's config)",
                tc ? "must be an object" : "missing");
        return;
    }
    const char *type = NULL;
    for (size_t i = 0; i < sizeof mm_wrappers / sizeof mm_wrappers[0]; i++)
        if (!strcmp(f->type, mm_wrappers[i].wrapper)) type = mm_wrappers[i].text;
    const cJSON *tt = cJSON_GetObjectItemCaseSensitive(tc, "model_type");
    if (tt && !cJSON_IsString(tt)) {
        hf_fail(r, ZO_ERR_FORMAT, "text_config", "field \"model_type\" must be a string");
        return;
    }
    if (tt) type = tt->valuestring;
    const family *g = family_by_type(type);
    if (!g || g->parse != parse_llama) {
        hf_fail(r, ZO_ERR_UNSUPPORTED, "text_config",
                "a \"%s\" text model, which memplan does not read inside a multimodal checkpoint (a "
                "LLaMA-family text model only: llama, mistral, qwen2, gemma3_text, ...)",
                type ? type : "(none)");
        return;
    }
    cJSON *text = cJSON_Duplicate(tc, 1);
    if (!text) {
        hf_fail(r, ZO_ERR_NOMEM, "text_config", "out of host memory");
        return;
    }
    for (size_t i = 0; i < sizeof mm_defaults / sizeof mm_defaults[0]; i++) {
        if (strcmp(type, mm_defaults[i].type)) continue;
        for (const hf_default *d = mm_defaults[i].d; d->key; d++)
            if (!cJSON_GetObjectItemCaseSensitive(text, d->key)) cJSON_AddNumberToObject(text, d->key, d->v);
    }
    char path[512];
    snprintf(path, sizeof path, "%s: text_config", r->path);
    hf sub = {text, path, g->type, ZO_OK};
    g->parse(&sub, c, g);
    hf_refuse_unmodelled(&sub, g->modelled);
    if (sub.st && !r->st) r->st = sub.st;
    cJSON_Delete(text);
    snprintf(c->family, sizeof c->family, "%s", g->type);
    c->mm_text = 1;
}

/* ---- transformers 5's rope_parameters ---------------------------------- */

/* What a config's rope_parameters said, for the check after the parse. */
typedef struct rope_given {
    int set;            /* rope_parameters was an object */
    double theta;       /* its rope_theta (0: none given) */
    double partial;     /* its partial_rotary_factor (0: none given) */
    char type[16];      /* its rope_type ("" for "default" or none) */
    double local_theta; /* sliding_attention's rope_theta where given apart (0: none) */
    char where[48];     /* the object read, for messages */
} rope_given;

/* key set to item in o, replacing what o held under it */
static int json_set(cJSON *o, const char *key, cJSON *item)
{
    if (!item) return 0;
    if (cJSON_GetObjectItemCaseSensitive(o, key)) return cJSON_ReplaceItemInObjectCaseSensitive(o, key, item);
    return cJSON_AddItemToObject(o, key, item);
}

/* transformers 5 saves the rotary's parameters as one object,
 * rope_parameters = {rope_type, rope_theta, partial_rotary_factor and
 * rope_scaling's own keys}, or as one such object per layer type
 * ({"full_attention": {...}, "sliding_attention": {...}}), in place of
 * rope_theta, rope_scaling and partial_rotary_factor (GPT-NeoX's
 * rotary_emb_base and rotary_pct too). They are written back into o as
 * those keys, which the parsers read, rope_parameters' values first (as
 * transformers reads them); the full layers' object is the model's rotary,
 * the sliding layers' base goes to Gemma-3's rope_local_base_freq. What a
 * family's parser then does not take is refused by rope_given_check. */
static zo_status rope_parameters_apply(cJSON *o, const char *path, rope_given *g)
{
    memset(g, 0, sizeof *g);
    cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    if (!rp || cJSON_IsNull(rp)) return ZO_OK;
    if (!cJSON_IsObject(rp)) return zo_error(ZO_ERR_FORMAT, "%s: field \"rope_parameters\" must be an object", path);
    const cJSON *full = rp, *sliding = NULL, *e;
    int nested = rp->child != NULL;
    cJSON_ArrayForEach(e, rp) {
        if (!cJSON_IsObject(e) || (strcmp(e->string, "full_attention") && strcmp(e->string, "sliding_attention")))
            nested = 0;
    }
    snprintf(g->where, sizeof g->where, "rope_parameters");
    if (nested) {
        sliding = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
        full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
        if (!full) full = sliding, sliding = NULL; /* (every layer a sliding one) */
        snprintf(g->where, sizeof g->where, "rope_parameters.%s", full->string);
    }
    g->set = 1;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(full, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(full, "type");
    if (t && !cJSON_IsString(t))
        return zo_error(ZO_ERR_FORMAT, "%s: field \"%s.rope_type\" must be a string", path, g->where);
    if (t && strcmp(t->valuestring, "default")) snprintf(g->type, sizeof g->type, "%.15s", t->valuestring);
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(full, "rope_theta");
    const cJSON *pf = cJSON_GetObjectItemCaseSensitive(full, "partial_rotary_factor");
    if ((th && !cJSON_IsNumber(th)) || (pf && !cJSON_IsNumber(pf)))
        return zo_error(ZO_ERR_FORMAT, "%s: field \"%s.%s\" must be a number", path, g->where,
                        th && !cJSON_IsNumber(th) ? "rope_theta" : "partial_rotary_factor");
    int ok = 1;
    if (th) {
        g->theta = th->valuedouble;
        ok &= json_set(o, "rope_theta", cJSON_CreateNumber(g->theta));
        if (cJSON_GetObjectItemCaseSensitive(o, "rotary_emb_base"))
            ok &= json_set(o, "rotary_emb_base", cJSON_CreateNumber(g->theta));
    }
    if (pf) {
        g->partial = pf->valuedouble;
        ok &= json_set(o, "partial_rotary_factor", cJSON_CreateNumber(g->partial));
        if (cJSON_GetObjectItemCaseSensitive(o, "rotary_pct"))
            ok &= json_set(o, "rotary_pct", cJSON_CreateNumber(g->partial));
    }
    /* the scaling: the object less the base and the rotated part */
    cJSON *rs = g->type[0] ? cJSON_Duplicate(full, 1) : cJSON_CreateNull();
    if (rs && g->type[0]) {
        cJSON_DeleteItemFromObjectCaseSensitive(rs, "rope_theta");
        cJSON_DeleteItemFromObjectCaseSensitive(rs, "partial_rotary_factor");
    }
    ok &= json_set(o, "rope_scaling", rs);
    if (sliding) {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(sliding, "rope_type");
        if (!st) st = cJSON_GetObjectItemCaseSensitive(sliding, "type");
        if (st && (!cJSON_IsString(st) || strcmp(st->valuestring, "default")))
            return zo_error(ZO_ERR_UNSUPPORTED,
                            "%s: field \"rope_parameters.sliding_attention.rope_type\": %s on the sliding layers is "
                            "not modelled (their rotary is the default one)",
                            path, cJSON_IsString(st) ? st->valuestring : "a non-string");
        const cJSON *sth = cJSON_GetObjectItemCaseSensitive(sliding, "rope_theta");
        if (sth && !cJSON_IsNumber(sth))
            return zo_error(ZO_ERR_FORMAT, "%s: field \"rope_parameters.sliding_attention.rope_theta\" must be a number",
                            path);
        if (sth) {
            g->local_theta = sth->valuedouble;
            ok &= json_set(o, "rope_local_base_freq", cJSON_CreateNumber(g->local_theta));
        }
    }
    return ok ? ZO_OK : zo_error(ZO_ERR_NOMEM, "%s: rope_parameters: out of host memory", path);
}

/* The parsed model against what rope_parameters said: a base, a rotated
 * part, a scaling kind or a sliding layers' base the family's parser did
 * not take is refused by name, never dropped. */
static zo_status rope_given_check(const rope_given *g, const zo_model_config *c, const char *path)
{
    if (!g->set || !(c->arch == ZO_ARCH_LLAMA || c->pos == ZO_POS_ROTARY)) return ZO_OK;
    const double part = g->partial == 1.0 ? 0.0 : g->partial;
    const double local = c->rope_local_theta > 0.0f ? c->rope_local_theta : c->rope_theta;
    if (g->theta > 0.0 && (float)g->theta != c->rope_theta)
        return zo_error(ZO_ERR_UNSUPPORTED, "%s: field \"%s.rope_theta\": %g, but the %s model's rotary base is %g",
                        path, g->where, g->theta, c->family, (double)c->rope_theta);
    if (g->partial > 0.0 && fabs(part - c->rope_partial) > 1e-9)
        return zo_error(ZO_ERR_UNSUPPORTED,
                        "%s: field \"%s.partial_rotary_factor\": %g, which the %s model does not take (it rotates %g "
                        "of each head)",
                        path, g->where, g->partial, c->family, c->rope_partial > 0.0 ? c->rope_partial : 1.0);
    if (g->type[0] && strcmp(g->type, c->rope_scaling))
        return zo_error(ZO_ERR_UNSUPPORTED, "%s: field \"%s.rope_type\": \"%s\", which the %s model does not take",
                        path, g->where, g->type, c->family);
    if (g->local_theta > 0.0 && (float)g->local_theta != local)
        return zo_error(ZO_ERR_UNSUPPORTED,
                        "%s: field \"rope_parameters.sliding_attention.rope_theta\": %g, but the %s model's sliding "
                        "layers turn by a base of %g",
                        path, g->local_theta, c->family, local);
    return ZO_OK;
}

zo_status zo_model_config_parse(const char *json, const char *path, zo_model_config *out)
{
    cJSON *root;
    /* malformed JSON (line and column named) and keys given twice refused */
    zo_status st = zo_json_parse(json, strlen(json), path, &root);
    if (st != ZO_OK) return st;
    if (!cJSON_IsObject(root)) {
        st = zo_error(ZO_ERR_FORMAT, "%s: expected a JSON object at the top level", path);
        goto out_free_root;
    }
    zo_model_config c;
    memset(&c, 0, sizeof c);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (type && !cJSON_IsString(type)) {
        st = zo_error(ZO_ERR_FORMAT, "%s: field \"model_type\" must be a string", path);
        goto out_free_root;
    }
    /* the model_type names the family; the architectures' class when the
     * type is absent or not one we know (it builds the same modules) */
    const char *t = type ? type->valuestring : NULL;
    const family *f = family_by_type(t);
    if (!f) f = family_by_arch(archs);
    char known[512];
    list_modelled(known, sizeof known);
    if (!f) {
        if (t)
            st = zo_error(ZO_ERR_UNSUPPORTED,
                          "%s: field \"model_type\": unknown family \"%s\" (memplan models: %s)",
                          path, t, known);
        else
            st = zo_error(ZO_ERR_FORMAT,
                          "%s: missing field \"model_type\" (and no known \"architectures\")",
                          path);
        goto out_free_root;
    }
    if (!f->parse) {
        st = zo_error(ZO_ERR_UNSUPPORTED,
                      "%s: field \"model_type\": \"%s\" is %s, which memplan does not model "
                      "(it models: %s)",
                      path, f->type, f->what, known);
        goto out_free_root;
    }
    /* transformers 5's rope_parameters as the keys the parsers read (the
     * text model's in a multimodal checkpoint) */
    rope_given rg;
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if ((st = rope_parameters_apply(root, path, &rg)) != ZO_OK) goto out_free_root;
    if (f->parse == parse_multimodal && cJSON_IsObject(tc)) {
        char tpath[600];
        snprintf(tpath, sizeof tpath, "%s: text_config", path);
        if ((st = rope_parameters_apply(tc, tpath, &rg)) != ZO_OK) goto out_free_root;
    }
    hf r = {root, path, f->type, ZO_OK};
    f->parse(&r, &c, f);
    if (f->parse != parse_multimodal) hf_refuse_unmodelled(&r, f->modelled);
    hf_fp8_block(&r, &c);
    hf_quant_method(&r, &c);
    if ((st = r.st) != ZO_OK) goto out_free_root;
    /* the family as a name the rest of the project uses ("falcon" for its
     * old types; an alias's: its class's first row's; a multimodal
     * checkpoint's: its text model's, set above) */
    if (f->parse != parse_multimodal)
        snprintf(c.family, sizeof c.family, "%s", f->parse == parse_falcon ? "falcon" : family_of_alias(f)->type);
    snprintf(c.name, sizeof c.name, "%.63s", base);
    if ((st = rope_given_check(&rg, &c, path)) != ZO_OK) goto out_free_root;
    if ((st = zo_model_config_validate(&c)) != ZO_OK) {
        zo_error_wrap(st, "%s", path);
        goto out_free_root;
    }
    *out = c;
out_free_root:
    cJSON_Delete(root);
    return st;
}

zo_status zo_model_config_load(const char *path, zo_model_config *out)
{
    char *buf, file[4096], name[sizeof out->name];
    struct stat sb;
    const char *cfg = path;
    name[0] = '\0';
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        /* a model folder: its config.json, the model named after it */
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/') n--;
        const char *b = path + n;
        while (b > path && b[-1] != '/') b--;
        snprintf(name, sizeof name, "%.*s", (int)(path + n - b), b);
        snprintf(file, sizeof file, "%.*s/config.json", (int)n, path);
        cfg = file;
    }
    zo_status st = zo_file_read_all(cfg, 64u << 20, "a config.json", &buf, NULL);
    if (st != ZO_OK) return st;
    st = zo_model_config_parse(buf, cfg, out);
    free(buf);
    if (st == ZO_OK && name[0]) snprintf(out->name, sizeof out->name, "%s", name);
    return st;
}
