#include "tests/support/tiny.h"

#include <stdio.h>

zo_model_config tiny_llama_config(int layers, int hidden, int vocab)
{
    zo_model_config c = {0};
    snprintf(c.name, sizeof c.name, "tiny-llama");
    snprintf(c.family, sizeof c.family, "llama2");
    c.arch = ZO_ARCH_LLAMA;
    c.n_layers = layers;
    c.hidden = hidden;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.ffn = 3 * hidden;
    c.vocab = vocab;
    c.max_seq = 64;
    c.norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    zo_model_config_validate(&c); /* the derived fields (head_dim); valid by construction */
    return c;
}

zo_model_config tiny_gpt_config(int layers, int hidden, int vocab)
{
    zo_model_config c = {0};
    snprintf(c.name, sizeof c.name, "tiny-gpt");
    snprintf(c.family, sizeof c.family, "gpt2");
    c.arch = ZO_ARCH_GPT;
    c.n_layers = layers;
    c.hidden = hidden;
    c.n_heads = 4;
    c.n_kv_heads = 4;
    c.ffn = 4 * hidden;
    c.vocab = vocab;
    c.max_seq = 64;
    c.tied_embeddings = 1;
    c.attn_bias = c.out_bias = c.norm_bias = 1;
    c.norm_eps = 1e-5f;
    zo_model_config_validate(&c);
    return c;
}

void tiny_batch(int vocab, int b, int t, int64_t k, int32_t *in, int32_t *tg)
{
    for (int r = 0; r < b; r++) {
        uint64_t s = (uint64_t)(k * b + r + 1) * 0x9e3779b97f4a7c15ull;
        int32_t prev = (int32_t)(s >> 40) % vocab;
        for (int j = 0; j <= t; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int32_t id = ((s >> 33) % 4) ? (prev + 1) % vocab : (int32_t)((s >> 20) % (uint64_t)vocab);
            if (j < t) in[r * t + j] = id;
            if (j > 0) tg[r * t + j - 1] = id;
            prev = id;
        }
    }
}
