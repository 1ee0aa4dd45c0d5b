#include "model_config.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/fileio.h" /* defines: zo_file_read_all */

/* GPT family: LayerNorm with bias, 4h GELU MLP with biases, learned positions,
 * tied output layer. */
#define GPT(n, al, fam, L, h, a, v, s)                                                    \
    {n, al,                                                                               \
     {.name = n, .family = fam, .arch = ZO_ARCH_GPT, .n_layers = L, .hidden = h,         \
      .n_heads = a, .n_kv_heads = a, .head_dim = (h) / (a), .ffn = 4 * (h), .vocab = v,  \
      .max_seq = s, .tied_embeddings = 1, .attn_bias = 1, .out_bias = 1, .norm_bias = 1, \
      .norm_eps = 1e-5f}}

/* LLaMA family: RMSNorm, SwiGLU, RoPE, GQA, untied output layer, no biases. */
#define LLAMA(n, al, fam, L, h, a, kv, f, v, s, theta)                                    \
    {n, al,                                                                               \
     {.name = n, .family = fam, .arch = ZO_ARCH_LLAMA, .n_layers = L, .hidden = h,       \
      .n_heads = a, .n_kv_heads = kv, .head_dim = (h) / (a), .ffn = f, .vocab = v,       \
      .max_seq = s, .norm_eps = 1e-5f, .rope_theta = theta}}

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
    LLAMA("llama-2-7b", "llama2-7b", "llama2", 32, 4096, 32, 32, 11008, 32000, 4096, 10000.0f),
    LLAMA("llama-2-13b", "llama2-13b", "llama2", 40, 5120, 40, 40, 13824, 32000, 4096, 10000.0f),
    LLAMA("llama-2-70b", "llama2-70b", "llama2", 80, 8192, 64, 8, 28672, 32000, 4096, 10000.0f),
    LLAMA("llama-3-8b", "llama3-8b,llama-3.1-8b", "llama3", 32, 4096, 32, 8, 14336, 128256, 8192,
          500000.0f),
    LLAMA("llama-3-70b", "llama3-70b,llama-3.1-70b", "llama3", 80, 8192, 64, 8, 28672, 128256,
          8192, 500000.0f),
    LLAMA("mistral-7b", "mistral-7b-v0.1", "mistral", 32, 4096, 32, 8, 14336, 32000, 32768,
          10000.0f),
};

const zo_model_preset *zo_model_presets(size_t *count)
{
    *count = sizeof presets / sizeof presets[0];
    return presets;
}

const char *zo_arch_name(zo_arch a) { return a == ZO_ARCH_LLAMA ? "llama" : "gpt"; }

/* lower case, without '-', '_', '.', ' ' */
static void normalize(const char *s, char *out, size_t len)
{
    size_t j = 0;
    for (; *s && j + 1 < len; s++)
        if (!strchr("-_. ", *s)) out[j++] = (char)tolower((unsigned char)*s);
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

/* Does `want` (normalized) match the preset's name or one of its aliases? */
static int preset_distance(const zo_model_preset *p, const char *want)
{
    char norm[96], buf[256];
    normalize(p->name, norm, sizeof norm);
    int best = edit_distance(norm, want);
    snprintf(buf, sizeof buf, "%s", p->aliases);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        normalize(tok, norm, sizeof norm);
        int d = edit_distance(norm, want);
        if (d < best) best = d;
    }
    return best;
}

zo_status zo_model_preset_find(const char *name, zo_model_config *out)
{
    char want[96];
    normalize(name ? name : "", want, sizeof want);
    size_t n = sizeof presets / sizeof presets[0];
    int dist[sizeof presets / sizeof presets[0]];
    for (size_t i = 0; i < n; i++) {
        dist[i] = preset_distance(&presets[i], want);
        if (dist[i] == 0) {
            *out = presets[i].cfg;
            return ZO_OK;
        }
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
    if (c->params_override) return ZO_OK;
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
    return ZO_OK;
}

void zo_model_param_counts(const zo_model_config *c, zo_param_counts *o)
{
    memset(o, 0, sizeof *o);
    if (c->params_override) {
        o->total = c->params_override;
        return;
    }
    uint64_t h = (uint64_t)c->hidden, v = (uint64_t)c->vocab, f = (uint64_t)c->ffn;
    uint64_t q = (uint64_t)c->n_heads * (uint64_t)c->head_dim;
    uint64_t kv = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim;
    uint64_t norm = c->norm_bias ? 2 * h : h;
    uint64_t attn = h * (q + 2 * kv) + q * h;
    if (c->attn_bias) attn += q + 2 * kv;
    if (c->out_bias) attn += h;
    uint64_t mlp;
    if (c->arch == ZO_ARCH_GPT) {
        mlp = 2 * h * f;
        if (c->out_bias) mlp += f + h;
    } else {
        mlp = 3 * h * f;
        if (c->out_bias) mlp += 2 * f + h;
    }
    o->embedding = v * h + (c->arch == ZO_ARCH_GPT ? (uint64_t)c->max_seq * h : 0);
    o->per_layer = 2 * norm + attn + mlp;
    o->layers = (uint64_t)c->n_layers * o->per_layer;
    o->final_norm = norm;
    o->head = c->tied_embeddings ? 0 : v * h;
    o->total = o->embedding + o->layers + o->final_norm + o->head;
}

uint64_t zo_model_params(const zo_model_config *c)
{
    zo_param_counts pc;
    zo_model_param_counts(c, &pc);
    return pc.total;
}

/* ---- Hugging Face config.json ------------------------------------------- */

static void line_col(const char *text, const char *at, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (const char *p = text; p < at && *p; p++) {
        if (*p == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

/* An integer field: ZO_OK, or ZO_ERR_NOT_FOUND when absent/null and optional. */
static zo_status get_int(const cJSON *root, const char *path, const char *field, int required,
                         int *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!it || cJSON_IsNull(it)) {
        if (required)
            return zo_error(ZO_ERR_FORMAT, "%s: missing field \"%s\"", path, field);
        return ZO_ERR_NOT_FOUND;
    }
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
        it->valuedouble <= 0 || it->valuedouble > 2147483647.0)
        return zo_error(ZO_ERR_FORMAT, "%s: field \"%s\" must be a positive integer", path,
                        field);
    *out = (int)it->valuedouble;
    return ZO_OK;
}

static zo_status get_float(const cJSON *root, const char *path, const char *field, float *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!it || cJSON_IsNull(it)) return ZO_ERR_NOT_FOUND;
    if (!cJSON_IsNumber(it))
        return zo_error(ZO_ERR_FORMAT, "%s: field \"%s\" must be a number", path, field);
    *out = (float)it->valuedouble;
    return ZO_OK;
}

static zo_status get_bool(const cJSON *root, const char *path, const char *field, int *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!it || cJSON_IsNull(it)) return ZO_ERR_NOT_FOUND;
    if (!cJSON_IsBool(it))
        return zo_error(ZO_ERR_FORMAT, "%s: field \"%s\" must be true or false", path, field);
    *out = cJSON_IsTrue(it);
    return ZO_OK;
}

#define OPTIONAL(call)                                                                   \
    do {                                                                                 \
        zo_status s_ = (call);                                                           \
        if (s_ != ZO_OK && s_ != ZO_ERR_NOT_FOUND) { st = s_; goto out; }                 \
    } while (0)
#define REQUIRED(call)                                                                   \
    do {                                                                                 \
        if ((st = (call)) != ZO_OK) goto out;                                            \
    } while (0)

static zo_status parse_gpt2(const cJSON *root, const char *path, zo_model_config *c)
{
    zo_status st = ZO_OK;
    c->arch = ZO_ARCH_GPT;
    snprintf(c->family, sizeof c->family, "gpt2");
    c->tied_embeddings = 1;
    c->attn_bias = c->out_bias = c->norm_bias = 1;
    c->norm_eps = 1e-5f;
    REQUIRED(get_int(root, path, "n_layer", 1, &c->n_layers));
    REQUIRED(get_int(root, path, "n_embd", 1, &c->hidden));
    REQUIRED(get_int(root, path, "n_head", 1, &c->n_heads));
    REQUIRED(get_int(root, path, "vocab_size", 1, &c->vocab));
    REQUIRED(get_int(root, path, "n_positions", 1, &c->max_seq));
    c->ffn = 4 * c->hidden;
    OPTIONAL(get_int(root, path, "n_inner", 0, &c->ffn));
    OPTIONAL(get_float(root, path, "layer_norm_epsilon", &c->norm_eps));
    OPTIONAL(get_bool(root, path, "tie_word_embeddings", &c->tied_embeddings));
out:
    return st;
}

static zo_status parse_llama(const cJSON *root, const char *path, const char *type,
                             zo_model_config *c)
{
    zo_status st = ZO_OK;
    c->arch = ZO_ARCH_LLAMA;
    snprintf(c->family, sizeof c->family, "%s", type);
    c->norm_eps = 1e-6f;
    c->rope_theta = 10000.0f;
    c->attn_bias = !strcmp(type, "qwen2"); /* Qwen2 has q/k/v biases */
    REQUIRED(get_int(root, path, "num_hidden_layers", 1, &c->n_layers));
    REQUIRED(get_int(root, path, "hidden_size", 1, &c->hidden));
    REQUIRED(get_int(root, path, "num_attention_heads", 1, &c->n_heads));
    REQUIRED(get_int(root, path, "intermediate_size", 1, &c->ffn));
    REQUIRED(get_int(root, path, "vocab_size", 1, &c->vocab));
    c->max_seq = 4096;
    OPTIONAL(get_int(root, path, "max_position_embeddings", 0, &c->max_seq));
    c->n_kv_heads = c->n_heads;
    OPTIONAL(get_int(root, path, "num_key_value_heads", 0, &c->n_kv_heads));
    OPTIONAL(get_int(root, path, "head_dim", 0, &c->head_dim));
    OPTIONAL(get_float(root, path, "rms_norm_eps", &c->norm_eps));
    OPTIONAL(get_float(root, path, "rope_theta", &c->rope_theta));
    OPTIONAL(get_bool(root, path, "tie_word_embeddings", &c->tied_embeddings));
    int attention_bias = 0;
    OPTIONAL(get_bool(root, path, "attention_bias", &attention_bias));
    if (attention_bias) {
        /* LLaMA's attention_bias puts biases on q, k, v and o; only Qwen2's
         * q/k/v-only biases are modelled */
        st = zo_error(ZO_ERR_UNSUPPORTED,
                      "%s: field \"attention_bias\": biases on the q/k/v/o projections are not "
                      "supported",
                      path);
        goto out;
    }
    int mlp_bias = 0;
    OPTIONAL(get_bool(root, path, "mlp_bias", &mlp_bias));
    if (mlp_bias)
        st = zo_error(ZO_ERR_UNSUPPORTED, "%s: field \"mlp_bias\": MLP biases are not supported",
                      path);
out:
    return st;
}

zo_status zo_model_config_parse(const char *json, const char *path, zo_model_config *out)
{
    zo_status st = ZO_OK;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
    if (!root) {
        int line, col;
        line_col(json, end ? end : json, &line, &col);
        return zo_error(ZO_ERR_FORMAT, "%s:%d:%d: malformed JSON", path, line, col);
    }
    if (!cJSON_IsObject(root)) {
        st = zo_error(ZO_ERR_FORMAT, "%s: expected a JSON object at the top level", path);
        goto out_free_root;
    }
    zo_model_config c;
    memset(&c, 0, sizeof c);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const char *t = cJSON_IsString(type) ? type->valuestring : NULL;
    int has_llama_fields = cJSON_HasObjectItem(root, "hidden_size") &&
                           cJSON_HasObjectItem(root, "intermediate_size") &&
                           cJSON_HasObjectItem(root, "num_hidden_layers");
    if (type && !t) {
        st = zo_error(ZO_ERR_FORMAT, "%s: field \"model_type\" must be a string", path);
        goto out_free_root;
    }
    if (t && !strcmp(t, "gpt2")) {
        st = parse_gpt2(root, path, &c);
    } else if (t && (!strcmp(t, "llama") || !strcmp(t, "mistral") || !strcmp(t, "qwen2"))) {
        st = parse_llama(root, path, t, &c);
    } else if (has_llama_fields) {
        st = parse_llama(root, path, t ? t : "custom", &c);
    } else if (t) {
        st = zo_error(ZO_ERR_UNSUPPORTED,
                      "%s: field \"model_type\": unsupported value \"%s\" (supported: gpt2, "
                      "llama, mistral, qwen2, or any config with hidden_size, "
                      "intermediate_size, num_hidden_layers, num_attention_heads, vocab_size)",
                      path, t);
    } else {
        st = zo_error(ZO_ERR_FORMAT, "%s: missing field \"model_type\"", path);
    }
    if (st) goto out_free_root;
    snprintf(c.name, sizeof c.name, "%.63s", base);
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
    char *buf;
    zo_status st = zo_file_read_all(path, 64u << 20, "a config.json", &buf, NULL);
    if (st != ZO_OK) return st;
    st = zo_model_config_parse(buf, path, out);
    free(buf);
    return st;
}
