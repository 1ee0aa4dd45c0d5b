/* A Hugging Face model folder (hf.h). */
#include "model/hf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h" /* defines: zo_file_write_json, zo_file_read_all, zo_file_write_all */
#include "common/json.h"   /* defines: zo_json_parse */

#define MAX_JSON_BYTES (64u << 20)

const char *model_hf_dtype_name(zo_dtype dt)
{
    return dt == ZO_DTYPE_BF16 ? "bfloat16" : dt == ZO_DTYPE_F16 ? "float16" : "float32";
}

/* ---- config.json ------------------------------------------------------------------- */

/* The family's model_type: the dense families the runtime builds (GPT-2,
 * GPT-NeoX, Falcon, OPT, BLOOM, Phi, GPT-J, LLaMA, Mistral, Qwen2, Qwen3, Phi-3, Gemma, Gemma-2, Granite, SmolLM3, EXAONE 4.0, ...); NULL for a mixture of
 * experts, whose router and expert keys this writer does not make. */
static const char *model_type(const zo_model_config *c)
{
    static const char *const own[] = {"mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text",
                                      "granite", "cohere", "cohere2", "olmo2", "olmo3", "smollm3",
                                      "ernie4_5", "seed_oss", "exaone4"};
    if (zo_model_gpt_oss(c)) return "gpt_oss"; /* (its router and experts' keys are few: written below) */
    if (c->moe.experts) return NULL;
    if (zo_model_neox(c)) return "gpt_neox";
    if (zo_model_falcon(c)) return "falcon";
    if (zo_model_opt(c)) return "opt";
    if (zo_model_phi(c)) return "phi";
    if (zo_model_gptj(c)) return "gptj";
    if (zo_model_starcoder2(c)) return "starcoder2";
    if (zo_model_bloom(c)) return "bloom";
    if (c->arch == ZO_ARCH_GPT) return "gpt2";
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (!strcmp(c->family, own[i])) return own[i];
    return "llama";
}

/* The Hugging Face class of a LLaMA-family model_type. */
static const char *llama_class(const char *type)
{
    static const char *const of[][2] = {
        {"mistral", "MistralForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"},   {"qwen3", "Qwen3ForCausalLM"},
        {"phi3", "Phi3ForCausalLM"},       {"gemma", "GemmaForCausalLM"},   {"gemma2", "Gemma2ForCausalLM"},
        {"gemma3_text", "Gemma3ForCausalLM"}, {"granite", "GraniteForCausalLM"},
        {"cohere", "CohereForCausalLM"},   {"cohere2", "Cohere2ForCausalLM"},
        {"olmo2", "Olmo2ForCausalLM"},     {"olmo3", "Olmo3ForCausalLM"},   {"smollm3", "SmolLM3ForCausalLM"},
        {"ernie4_5", "Ernie4_5ForCausalLM"}, {"seed_oss", "SeedOssForCausalLM"},
        {"exaone4", "Exaone4ForCausalLM"}, {"gpt_oss", "GptOssForCausalLM"}};
    for (size_t i = 0; i < sizeof of / sizeof of[0]; i++)
        if (!strcmp(type, of[i][0])) return of[i][1];
    return "LlamaForCausalLM";
}

/* Each family's names for the keys every config has (NULL: it writes none):
 * its class, the shape, the norm's epsilon, the rotary base and the
 * activation with the value it means when the model has none of its own. */
typedef struct hf_keys {
    const char *type, *cls, *layers, *hidden, *ffn, *heads, *kv_heads, *vocab, *positions, *eps, *theta, *act,
        *act_default;
} hf_keys;

static const hf_keys family_keys[] = {
    {"gpt_neox", "GPTNeoXForCausalLM", "num_hidden_layers", "hidden_size", "intermediate_size",
     "num_attention_heads", NULL, "vocab_size", "max_position_embeddings", "layer_norm_eps", "rotary_emb_base",
     "hidden_act", "gelu"},
    {"falcon", "FalconForCausalLM", "num_hidden_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
     "num_kv_heads", "vocab_size", "max_position_embeddings", "layer_norm_epsilon", "rope_theta", "activation",
     "gelu"},
    /* seq_length: BLOOM's training length */
    {"bloom", "BloomForCausalLM", "n_layer", "hidden_size", NULL, "n_head", NULL, "vocab_size", "seq_length",
     "layer_norm_epsilon", NULL, NULL, NULL},
    {"phi", "PhiForCausalLM", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
     "num_key_value_heads", "vocab_size", "max_position_embeddings", "layer_norm_eps", "rope_theta", "hidden_act",
     "gelu_new"},
    {"opt", "OPTForCausalLM", "num_hidden_layers", "hidden_size", "ffn_dim", "num_attention_heads", NULL,
     "vocab_size", "max_position_embeddings", NULL, NULL, "activation_function", "relu"},
    {"gptj", "GPTJForCausalLM", "n_layer", "n_embd", "n_inner", "n_head", NULL, "vocab_size", "n_positions",
     "layer_norm_epsilon", NULL, "activation_function", "gelu_new"},
    {"gpt2", "GPT2LMHeadModel", "n_layer", "n_embd", "n_inner", "n_head", NULL, "vocab_size", "n_positions",
     "layer_norm_epsilon", NULL, "activation_function", "gelu_new"},
    {"starcoder2", "Starcoder2ForCausalLM", "num_hidden_layers", "hidden_size", "intermediate_size",
     "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings", "norm_epsilon",
     "rope_theta", "hidden_act", "gelu_pytorch_tanh"},
    {"cohere", "CohereForCausalLM", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
     "num_key_value_heads", "vocab_size", "max_position_embeddings", "layer_norm_eps", "rope_theta", "hidden_act",
     "silu"},
    {"cohere2", "Cohere2ForCausalLM", "num_hidden_layers", "hidden_size", "intermediate_size",
     "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings", "layer_norm_eps",
     "rope_theta", "hidden_act", "silu"},
    /* the LLaMA family (the class llama_class's; the activation below) */
    {"", NULL, "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
     "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", NULL, NULL},
};

/* The keys every family writes, under its names. */
static void add_common(cJSON *o, cJSON *arch, const char *type, const zo_model_config *c)
{
    const hf_keys *k = &family_keys[sizeof family_keys / sizeof family_keys[0] - 1];
    for (size_t i = 0; i + 1 < sizeof family_keys / sizeof family_keys[0]; i++)
        if (!strcmp(type, family_keys[i].type)) k = &family_keys[i];
    cJSON_AddItemToArray(arch, cJSON_CreateString(k->cls ? k->cls : llama_class(type)));
    cJSON_AddStringToObject(o, "model_type", type);
    const struct {
        const char *key;
        double v;
    } shape[] = {{k->layers, c->n_layers}, {k->hidden, c->hidden},      {k->ffn, c->ffn},
                 {k->heads, c->n_heads},   {k->kv_heads, c->n_kv_heads}, {k->vocab, c->vocab},
                 {k->positions, c->max_seq}, {k->eps, c->norm_eps},    {k->theta, c->rope_theta}};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        if (shape[i].key) cJSON_AddNumberToObject(o, shape[i].key, shape[i].v);
    if (k->act) cJSON_AddStringToObject(o, k->act, c->act[0] ? c->act : k->act_default);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tied_embeddings);
}

/* rope_scaling as Hugging Face's rope utilities read it (the LLaMA family,
 * GPT-NeoX, Falcon and Phi take it). */
static void add_rope_scaling(cJSON *o, const char *type, const zo_model_config *c)
{
    cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
    cJSON_AddStringToObject(rs, "rope_type", c->rope_scaling);
    cJSON_AddNumberToObject(rs, "factor", c->rope_factor);
    if (!strcmp(c->rope_scaling, "llama3")) {
        cJSON_AddNumberToObject(rs, "low_freq_factor", c->rope_low_freq_factor);
        cJSON_AddNumberToObject(rs, "high_freq_factor", c->rope_high_freq_factor);
    }
    if (c->rope_original_max) cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_original_max);
    if (!strcmp(c->rope_scaling, "yarn")) {
        cJSON_AddNumberToObject(rs, "beta_fast", c->rope_beta_fast);
        cJSON_AddNumberToObject(rs, "beta_slow", c->rope_beta_slow);
        cJSON_AddBoolToObject(rs, "truncate", c->rope_truncate);
        if (c->rope_mscale > 0.0) cJSON_AddNumberToObject(rs, "mscale", c->rope_mscale);
        if (c->rope_mscale_all_dim > 0.0) cJSON_AddNumberToObject(rs, "mscale_all_dim", c->rope_mscale_all_dim);
        cJSON_AddNumberToObject(rs, "attention_factor", c->rope_attention_factor);
    }
    if (!strcmp(c->rope_scaling, "longrope") && c->rope_n_factors > 0) {
        cJSON_AddItemToObject(rs, "short_factor", cJSON_CreateFloatArray(c->rope_short_factor, c->rope_n_factors));
        cJSON_AddItemToObject(rs, "long_factor", cJSON_CreateFloatArray(c->rope_long_factor, c->rope_n_factors));
        cJSON_AddNumberToObject(rs, "attention_factor", c->rope_attention_factor);
        /* longrope reads its original length from the top level: Phi-3's
         * always there, another family's only when it is not
         * max_position_embeddings (its default there) */
        if (!strcmp(type, "phi3") || c->rope_original_max != c->max_seq)
            cJSON_AddNumberToObject(o, "original_max_position_embeddings", c->rope_original_max);
    }
}

/* The LLaMA family's own keys: the head size where it is not the
 * default, the activation, the windows, Gemma's score scale and caps,
 * Granite's multipliers. */
static void add_llama_keys(cJSON *o, const char *type, const zo_model_config *c)
{
    int gemma3 = !strcmp(type, "gemma3_text"), gemma2 = gemma3 || !strcmp(type, "gemma2");
    int gemma = zo_family_gemma(type), qwen3 = !strcmp(type, "qwen3"), gpt_oss = !strcmp(type, "gpt_oss");
    /* Gemma's head_dim defaults to 256, Qwen3's, ERNIE 4.5's and Seed-OSS's to 128 and gpt-oss's to 64, not
     * hidden / heads */
    if (gemma || qwen3 || gpt_oss || !strcmp(type, "ernie4_5") || !strcmp(type, "seed_oss") ||
        c->head_dim * c->n_heads != c->hidden)
        cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
    /* Gemma: Hugging Face reads hidden_activation (GELU's tanh form) */
    cJSON_AddStringToObject(o, "hidden_act", gemma ? c->act : "silu");
    if (gemma) cJSON_AddStringToObject(o, "hidden_activation", c->act);
    if (!strcmp(type, "mistral") || !strcmp(type, "phi3")) {
        if (c->sliding_window) cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window);
        else cJSON_AddNullToObject(o, "sliding_window");
        /* Phi-4-mini's partial rotary size (Phi3Config's default: 1) */
        if (!strcmp(type, "phi3") && c->rope_partial > 0.0)
            cJSON_AddNumberToObject(o, "partial_rotary_factor", c->rope_partial);
    } else if (!strcmp(type, "qwen2") || qwen3) {
        cJSON_AddBoolToObject(o, "use_sliding_window", c->sliding_window > 0);
        cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window ? c->sliding_window : 4096);
        cJSON_AddNumberToObject(o, "max_window_layers", c->sliding_window ? c->window_from_layer : c->n_layers);
    } else if (gemma2 || !strcmp(type, "olmo3") || gpt_oss) {
        /* the window, which layers take it (layer_types, as new configs
         * write them), Gemma's score scale and caps (null: none) */
        if (c->sliding_window) cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window);
        else cJSON_AddNullToObject(o, "sliding_window");
        cJSON *lt = cJSON_AddArrayToObject(o, "layer_types");
        for (int l = 0; lt && l < c->n_layers; l++)
            cJSON_AddItemToArray(lt, cJSON_CreateString(zo_model_layer_sliding(c, l) ? "sliding_attention"
                                                                                      : "full_attention"));
        if (gemma2) {
            if (gemma3) cJSON_AddNumberToObject(o, "rope_local_base_freq", c->rope_local_theta);
            cJSON_AddNumberToObject(o, "query_pre_attn_scalar", c->query_pre_attn_scalar);
            const char *caps[] = {"attn_logit_softcapping", "final_logit_softcapping"};
            const float capv[] = {c->attn_softcap, c->final_softcap};
            for (int k = 0; k < 2; k++) {
                if (capv[k] > 0.0f) cJSON_AddNumberToObject(o, caps[k], capv[k]);
                else cJSON_AddNullToObject(o, caps[k]);
            }
        }
    }
    if (gpt_oss) {
        /* q/k/v/o biases, the experts (intermediate_size is an expert's
         * width: common's ffn), the clamp, the balance loss; the sinks and
         * the router's and experts' biases are the family's own */
        cJSON_AddBoolToObject(o, "attention_bias", c->attn_bias);
        cJSON_AddNumberToObject(o, "num_local_experts", c->moe.experts);
        cJSON_AddNumberToObject(o, "num_experts_per_tok", c->moe.top_k);
        cJSON_AddNumberToObject(o, "swiglu_limit", c->moe.glu_limit);
        cJSON_AddBoolToObject(o, "output_router_logits", c->moe.aux_loss);
        cJSON_AddNumberToObject(o, "router_aux_loss_coef", c->moe.aux_coef);
    }
    if (!strcmp(type, "ernie4_5")) cJSON_AddBoolToObject(o, "use_bias", c->attn_bias);
    if (!strcmp(type, "seed_oss")) {
        cJSON_AddBoolToObject(o, "attention_bias", c->attn_bias);
        cJSON_AddBoolToObject(o, "attention_out_bias", 0);
    }
    if (!strcmp(type, "smollm3")) {
        /* which layers turn (1) and which take no rotary (0), as
         * SmolLM3Config writes them; no window */
        if (c->nope_period) cJSON_AddNumberToObject(o, "no_rope_layer_interval", c->nope_period);
        cJSON *nl = cJSON_AddArrayToObject(o, "no_rope_layers");
        for (int l = 0; nl && l < c->n_layers; l++)
            cJSON_AddItemToArray(nl, cJSON_CreateNumber(zo_model_layer_rotary(c, l)));
        cJSON_AddBoolToObject(o, "use_sliding_window", 0);
        cJSON_AddNullToObject(o, "sliding_window");
    }
    if (!strcmp(type, "exaone4")) {
        /* global_nope: the window (4096, Exaone4Config's, where no layer
         * slides) and which layers take it, the others global without
         * rotary; none: a null window, every layer global and turned (the
         * 1.2B's) */
        if (c->global_nope) cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window ? c->sliding_window : 4096);
        else cJSON_AddNullToObject(o, "sliding_window");
        if (c->global_nope && c->window_period > 0) cJSON_AddNumberToObject(o, "sliding_window_pattern", c->window_period);
        else cJSON_AddNullToObject(o, "sliding_window_pattern");
        cJSON *lt = cJSON_AddArrayToObject(o, "layer_types");
        for (int l = 0; lt && l < c->n_layers; l++)
            cJSON_AddItemToArray(lt, cJSON_CreateString(c->global_nope && zo_model_layer_sliding(c, l)
                                                             ? "sliding_attention"
                                                             : "full_attention"));
    }
    if (!strcmp(type, "granite")) {
        /* the four multipliers (0 in the config: none, GraniteConfig's 1) */
        const char *keys[] = {"embedding_multiplier", "attention_multiplier", "residual_multiplier",
                              "logits_scaling"};
        const float v[] = {c->embed_mult, c->attn_mult, c->resid_mult, c->logit_div};
        for (int k = 0; k < 4; k++) cJSON_AddNumberToObject(o, keys[k], v[k] > 0.0f ? v[k] : 1.0f);
    }
}

zo_status model_hf_config(const zo_model_config *c, zo_dtype dtype, cJSON **out)
{
    const char *type = model_type(c);
    if (!type)
        return zo_error(ZO_ERR_UNSUPPORTED,
                        "config.json: model %s (family \"%s\"): a mixture of experts' config is not written from "
                        "its shape; give the model's own config.json (train --model FILE or DIR) to save it",
                        c->name, c->family);
    cJSON *o = cJSON_CreateObject(), *arch = o ? cJSON_AddArrayToObject(o, "architectures") : NULL;
    if (!arch) {
        cJSON_Delete(o);
        return zo_error(ZO_ERR_NOMEM, "config.json: out of host memory");
    }
    add_common(o, arch, type, c);
    if (zo_model_neox(c)) {
        /* rotary_pct 1 when every dimension rotates */
        cJSON_AddNumberToObject(o, "rotary_pct", c->rope_partial > 0.0 ? c->rope_partial : 1.0);
        cJSON_AddBoolToObject(o, "use_parallel_residual", c->parallel_block);
        cJSON_AddBoolToObject(o, "attention_bias", 1);
    } else if (zo_model_falcon(c)) {
        /* The new decoder architecture where the shape needs it (two norms
         * side by side, or kv heads neither 1 nor all); the file layout of
         * query_key_value is the same either way (grouped per kv head), and
         * so is the model. */
        int new_arch = c->parallel_block && (c->layer_norms == 2 || (c->n_kv_heads != 1 && c->n_kv_heads != c->n_heads));
        cJSON_AddBoolToObject(o, "new_decoder_architecture", new_arch);
        cJSON_AddBoolToObject(o, "multi_query", !new_arch && c->n_kv_heads == 1);
        cJSON_AddBoolToObject(o, "parallel_attn", c->parallel_block);
        if (new_arch) cJSON_AddNumberToObject(o, "num_ln_in_parallel_attn", c->layer_norms);
        cJSON_AddBoolToObject(o, "bias", c->attn_bias);
        cJSON_AddBoolToObject(o, "alibi", c->pos == ZO_POS_ALIBI);
    } else if (zo_model_bloom(c)) {
        cJSON_AddBoolToObject(o, "apply_residual_connection_post_layernorm", 0);
    } else if (zo_model_phi(c)) {
        /* partial_rotary_factor 1 when every dimension rotates; the q/k
         * LayerNorms off (the runtime has none) */
        cJSON_AddNumberToObject(o, "partial_rotary_factor", c->rope_partial > 0.0 ? c->rope_partial : 1.0);
        cJSON_AddBoolToObject(o, "qk_layernorm", 0);
    } else if (zo_model_opt(c)) {
        /* pre-norm layers, the embedding as wide as the layers (no
         * projections), max_position_embeddings the positions (the table
         * has 2 rows more) */
        cJSON_AddNumberToObject(o, "word_embed_proj_dim", c->hidden);
        cJSON_AddBoolToObject(o, "do_layer_norm_before", 1);
        cJSON_AddBoolToObject(o, "enable_bias", c->attn_bias);
    } else if (zo_model_gptj(c)) {
        /* the rotated dimensions of each head */
        cJSON_AddNumberToObject(o, "rotary_dim", zo_model_rope_dim(c));
    } else if (zo_model_starcoder2(c)) {
        /* every linear layer's biases; every layer's window (null: none) */
        cJSON_AddBoolToObject(o, "use_bias", c->attn_bias);
        if (c->sliding_window) cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window);
        else cJSON_AddNullToObject(o, "sliding_window");
    } else if (c->arch == ZO_ARCH_GPT) {
        cJSON_AddNumberToObject(o, "n_ctx", c->max_seq);
    } else if (zo_model_cohere(c)) {
        /* the logits' factor (the output layer's alpha is its inverse's
         * inverse); no biases; use_qk_norm (command-r-plus's per-head q/k norms) */
        cJSON_AddNumberToObject(o, "logit_scale", c->logit_div > 0.0f ? 1.0 / c->logit_div : 1.0);
        cJSON_AddBoolToObject(o, "attention_bias", 0);
        if (!strcmp(type, "cohere2")) {
            /* the window and which layers take it: layer_types (Hugging Face's
             * current key) and, where a period gives them, sliding_window_pattern
             * (the published configs' key, which older versions read), alike;
             * the window unused where no layer slides, Cohere2Config's default */
            cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window ? c->sliding_window : 4096);
            if (c->window_period > 0) cJSON_AddNumberToObject(o, "sliding_window_pattern", c->window_period);
            cJSON *lt = cJSON_AddArrayToObject(o, "layer_types");
            for (int l = 0; lt && l < c->n_layers; l++)
                cJSON_AddItemToArray(lt, cJSON_CreateString(zo_model_layer_sliding(c, l) ? "sliding_attention"
                                                                                          : "full_attention"));
        } else {
            cJSON_AddBoolToObject(o, "use_qk_norm", c->qk_norm);
        }
    } else {
        add_llama_keys(o, type, c);
    }
    /* GPT-J's rotary takes no scaling in Hugging Face's class */
    if (c->rope_scaling[0] && c->pos != ZO_POS_ALIBI && !zo_model_gptj(c) &&
        (c->arch == ZO_ARCH_LLAMA || zo_model_neox(c) || zo_model_falcon(c) || zo_model_phi(c) ||
         zo_model_starcoder2(c)))
        add_rope_scaling(o, type, c);
    cJSON_AddStringToObject(o, "torch_dtype", model_hf_dtype_name(dtype));
    *out = o;
    return ZO_OK;
}

/* A multimodal config's text model as a config of its own (text_config,
 * its model_type c's family and its class that family's: Gemma-3's as
 * Gemma3ForCausalLM's; with the token ids the wrapper gives): what a saved
 * text model (zo_model_config.mm_text) is read with. */
static zo_status text_model_config(const char *src, const zo_model_config *c, cJSON **io)
{
    cJSON *top = *io, *text = cJSON_DetachItemFromObjectCaseSensitive(top, "text_config");
    if (!cJSON_IsObject(text)) {
        cJSON_Delete(text);
        return zo_error(ZO_ERR_FORMAT, "%s: field \"text_config\": missing or not an object", src);
    }
    static const char *const ids[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(top, ids[i]);
        if (v && !cJSON_GetObjectItemCaseSensitive(text, ids[i]))
            cJSON_AddItemToObject(text, ids[i], cJSON_Duplicate(v, 1));
    }
    cJSON_Delete(top);
    *io = text;
    cJSON_DeleteItemFromObjectCaseSensitive(text, "architectures");
    cJSON_DeleteItemFromObjectCaseSensitive(text, "model_type");
    cJSON *arch = cJSON_AddArrayToObject(text, "architectures");
    if (!arch || !cJSON_AddStringToObject(text, "model_type", c->family))
        return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", src);
    cJSON_AddItemToArray(arch, cJSON_CreateString(llama_class(c->family)));
    return ZO_OK;
}

/* The config given, its torch_dtype the weights' and without its
 * quantization_config (every other key as it was); of a multimodal
 * checkpoint (mm_text), its text model's. transformers 5 names the dtype
 * "dtype" (torch_dtype its old name, which it still reads): a config that
 * has it gets the weights' there too, never a stale one beside. */
zo_status model_hf_config_copy(const char *src, const zo_model_config *c, zo_dtype dtype, cJSON **out)
{
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    zo_status st = zo_file_read_all(src, MAX_JSON_BYTES, "config.json", &text, &len);
    if (st == ZO_OK) st = zo_json_parse(text, len, src, out);
    free(text);
    if (st == ZO_OK && c->mm_text) st = text_model_config(src, c, out);
    if (st != ZO_OK) {
        cJSON_Delete(*out);
        *out = NULL;
        return st;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(*out, "torch_dtype");
    /* the weights written are the dequantized ones (an FP8 checkpoint's:
     * docs/model.md), in `dtype`: a quantization_config kept would tell
     * readers to look for FP8 tensors and their scales */
    cJSON_DeleteItemFromObjectCaseSensitive(*out, "quantization_config");
    if (!cJSON_AddStringToObject(*out, "torch_dtype", model_hf_dtype_name(dtype)))
        return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", src);
    if (cJSON_GetObjectItemCaseSensitive(*out, "dtype") &&
        !cJSON_ReplaceItemInObjectCaseSensitive(*out, "dtype", cJSON_CreateString(model_hf_dtype_name(dtype))))
        return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", src);
    return ZO_OK;
}

/* ---- files --------------------------------------------------------------------------- */

static zo_status path_in(char *out, size_t len, const char *dir, const char *name)
{
    if ((size_t)snprintf(out, len, "%s/%s", dir, name) >= len)
        return zo_error(ZO_ERR_INVALID, "%s/%s: the path is too long", dir, name);
    return ZO_OK;
}

/* src's bytes as dir/name (atomically). */
static zo_status copy_file(const char *src, const char *dir, const char *name)
{
    char dst[4200], *text = NULL;
    size_t len = 0;
    zo_status st = path_in(dst, sizeof dst, dir, name);
    if (st == ZO_OK) st = zo_file_read_all(src, MAX_JSON_BYTES, name, &text, &len);
    if (st == ZO_OK) st = zo_file_write_all(dst, text, len);
    free(text);
    return st;
}

/* The tokenizer.json given, and the tokenizer's other files beside it. */
static zo_status copy_tokenizer(const char *tok, const char *dir)
{
    zo_status st = copy_file(tok, dir, "tokenizer.json");
    const char *slash = strrchr(tok, '/');
    char src[4200];
    const char *others[] = {"tokenizer_config.json", "special_tokens_map.json"};
    for (int i = 0; i < 2 && st == ZO_OK; i++) {
        snprintf(src, sizeof src, "%.*s%s", slash ? (int)(slash - tok + 1) : 0, tok, others[i]);
        struct stat sb;
        if (stat(src, &sb) == 0) st = copy_file(src, dir, others[i]);
    }
    return st;
}

/* A model of the other form than the one about to be written, by name: the
 * single file, or the index and the shards it names. */
static zo_status remove_other_form(const char *dir, int sharded)
{
    char p[4200];
    if (sharded) {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        if (unlink(p) && errno != ENOENT) return zo_error(ZO_ERR_IO, "%s: %s", p, strerror(errno));
        return ZO_OK;
    }
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    char *text = NULL;
    size_t len = 0;
    cJSON *doc = NULL;
    struct stat sb;
    if (stat(p, &sb) != 0) return ZO_OK;
    zo_status st = zo_file_read_all(p, MAX_JSON_BYTES, "model.safetensors.index.json", &text, &len);
    if (st == ZO_OK) st = zo_json_parse(text, len, p, &doc);
    free(text);
    if (st != ZO_OK) return st;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(doc, "weight_map"), *e;
    cJSON_ArrayForEach(e, map)
    {
        char q[4200];
        /* a shard's name, never a path out of the folder */
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) continue;
        snprintf(q, sizeof q, "%s/%s", dir, e->valuestring);
        if (unlink(q) && errno != ENOENT) st = zo_error(ZO_ERR_IO, "%s: %s", q, strerror(errno));
    }
    cJSON_Delete(doc);
    if (st == ZO_OK && unlink(p)) st = zo_error(ZO_ERR_IO, "%s: %s", p, strerror(errno));
    return st;
}

/* ---- the weights ------------------------------------------------------------------------ */

/* Tensors into shards of at most max bytes each, in order (a tensor larger
 * than max alone; the slices of fused tensors, a run of them, together):
 * shard[i] = the first tensor of shard i, n shards. */
static int plan_shards(const model_layout *l, uint64_t es, uint64_t max, int *first)
{
    int n = 0;
    uint64_t in = 0;
    for (int i = 0; i < l->n_tensors; i++) {
        uint64_t b = l->tensors[i].numel * es;
        int inside = i > 0 && l->tensors[i].hf_fused[0] && l->tensors[i - 1].hf_fused[0];
        if (i == 0 || (in > 0 && in + b > max && !inside)) {
            first[n++] = i;
            in = 0;
        }
        in += b;
    }
    first[n] = l->n_tensors;
    return n;
}

static zo_status write_index(const model_hf_folder *f, const int *first, int n)
{
    uint64_t es = zo_dtype_size(f->dtype), total = 0;
    cJSON *o = cJSON_CreateObject(), *meta = o ? cJSON_AddObjectToObject(o, "metadata") : NULL;
    cJSON *map = o ? cJSON_AddObjectToObject(o, "weight_map") : NULL;
    if (!meta || !map) {
        cJSON_Delete(o);
        return zo_error(ZO_ERR_NOMEM, "model.safetensors.index.json: out of host memory");
    }
    for (int s = 0; s < n; s++)
        for (int i = first[s]; i < first[s + 1]; i++) {
            char shard[64];
            snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", s + 1, n);
            if (!model_tensor_fused_rest(&f->l->tensors[i])) /* (a fused tensor: one name) */
                cJSON_AddStringToObject(map, f->l->tensors[i].name, shard);
            total += f->l->tensors[i].numel * es;
        }
    char last[64];
    snprintf(last, sizeof last, "model-%05d-of-%05d.safetensors", n, n);
    for (int i = 0; i < f->n_extra; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < f->extra[i].ndim; d++) numel *= (uint64_t)f->extra[i].shape[d];
        cJSON_AddStringToObject(map, f->extra[i].name, last);
        total += numel * zo_dtype_size(f->extra[i].dtype);
    }
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    char p[4200];
    zo_status st = path_in(p, sizeof p, f->dir, "model.safetensors.index.json");
    if (st == ZO_OK) st = zo_file_write_json(p, o);
    cJSON_Delete(o);
    return st;
}

zo_status model_hf_save(const model_hf_folder *f, model_block_read_fn read, void *ctx, int *shards)
{
    zo_status st;
    char p[4200];
    if (mkdir(f->dir, 0755) && errno != EEXIST) return zo_error(ZO_ERR_IO, "%s: %s", f->dir, strerror(errno));
    /* the config: the one given (its torch_dtype set; a multimodal one's
     * text model, as the weights written are), else one of the shape */
    cJSON *cfg = NULL;
    if ((st = f->config ? model_hf_config_copy(f->config, &f->l->cfg, f->dtype, &cfg) : model_hf_config(&f->l->cfg, f->dtype, &cfg)) != ZO_OK)
        return st;
    if ((st = path_in(p, sizeof p, f->dir, "config.json")) == ZO_OK) st = zo_file_write_json(p, cfg);
    cJSON_Delete(cfg);
    if (st != ZO_OK) return st;
    /* the weights, one file or shards and their index */
    int *first = calloc((size_t)f->l->n_tensors + 2, sizeof *first);
    if (!first) return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", f->dir);
    uint64_t max = f->max_shard_bytes ? f->max_shard_bytes : MODEL_HF_SHARD_DEFAULT;
    int n = plan_shards(f->l, zo_dtype_size(f->dtype), max, first);
    st = remove_other_form(f->dir, n > 1);
    for (int s = 0; s < n && st == ZO_OK; s++) {
        char name[64];
        if (n > 1) snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n);
        else snprintf(name, sizeof name, "model.safetensors");
        if ((st = path_in(p, sizeof p, f->dir, name)) == ZO_OK)
            st = model_save_streamed_extra(p, f->l, first[s], first[s + 1] - first[s], read, ctx, f->dtype,
                                           s == n - 1 ? f->extra : NULL, s == n - 1 ? f->n_extra : 0);
    }
    if (st == ZO_OK && n > 1) st = write_index(f, first, n);
    free(first);
    if (st == ZO_OK && f->tokenizer) st = copy_tokenizer(f->tokenizer, f->dir);
    if (st == ZO_OK && shards) *shards = n;
    return st;
}
