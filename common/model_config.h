/* Transformer shapes: presets and Hugging Face config.json files.
 *
 * Shared by the planner (sizing) and the transformer (building the model), so
 * both see the same shapes and the same exact parameter counts. */
#ifndef ZO_COMMON_MODEL_CONFIG_H
#define ZO_COMMON_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef enum zo_arch {
    ZO_ARCH_GPT = 0, /* LayerNorm, GELU MLP of ffn width, learned positions, biases, dropout */
    ZO_ARCH_LLAMA,   /* RMSNorm, SwiGLU MLP, RoPE, GQA, no biases (unless attn_bias), no dropout */
} zo_arch;

typedef struct zo_model_config {
    char name[64];
    char family[16];   /* "gpt2", "gpt3", "megatron", "llama2", "llama3", "mistral", "qwen2", "custom" */
    zo_arch arch;
    int n_layers;
    int hidden;        /* h */
    int n_heads;       /* a */
    int n_kv_heads;    /* GQA groups; == n_heads for multi-head attention */
    int head_dim;      /* usually hidden / n_heads */
    int ffn;           /* MLP inner width (4h for GPT, intermediate_size for LLaMA) */
    int vocab;         /* v */
    int max_seq;       /* positions the model was trained with */
    int tied_embeddings; /* output layer shares the input embedding */
    int attn_bias;     /* q/k/v projections carry biases (GPT-2, Qwen2) */
    int out_bias;      /* attention output and MLP projections carry biases (GPT) */
    int norm_bias;     /* LayerNorm has a bias (GPT); RMSNorm has none */
    float norm_eps;
    float rope_theta;  /* LLaMA only */
    uint64_t params_override; /* != 0: only the total is known (--params) */
} zo_model_config;

typedef struct zo_model_preset {
    const char *name;     /* "llama-2-13b" */
    const char *aliases;  /* comma-separated other accepted names */
    zo_model_config cfg;
} zo_model_preset;

/* The built-in presets, in listing order. */
const zo_model_preset *zo_model_presets(size_t *count);

/* Look a preset up by name or alias, ignoring case and '-', '_', '.'. On a
 * miss, returns ZO_ERR_NOT_FOUND with a message listing the closest names. */
zo_status zo_model_preset_find(const char *name, zo_model_config *out);

/* Parse a Hugging Face config.json (model_type gpt2, llama, mistral, qwen2, or
 * any config with the LLaMA fields). Errors name the file and the field, and
 * malformed JSON gives the line and column. */
zo_status zo_model_config_load(const char *path, zo_model_config *out);
/* The same from a string in memory; `path` is used in messages only. */
zo_status zo_model_config_parse(const char *json, const char *path, zo_model_config *out);

/* Fill derived fields (head_dim, n_kv_heads) and check the shape is sane:
 * positive sizes, heads dividing hidden where head_dim is derived, kv heads
 * dividing heads. */
zo_status zo_model_config_validate(zo_model_config *cfg);

/* Exact parameter counts. */
typedef struct zo_param_counts {
    uint64_t embedding;   /* token (+ position) embeddings */
    uint64_t per_layer;   /* one transformer layer, norms and biases included */
    uint64_t layers;      /* n_layers * per_layer */
    uint64_t final_norm;
    uint64_t head;        /* output projection; 0 when tied */
    uint64_t total;
} zo_param_counts;

void zo_model_param_counts(const zo_model_config *cfg, zo_param_counts *out);
uint64_t zo_model_params(const zo_model_config *cfg);

const char *zo_arch_name(zo_arch a); /* "gpt", "llama" */

#endif
