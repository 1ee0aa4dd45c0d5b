/* Small model configurations for tests. */
#include "tests/support/models.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

zo_model_config tiny_model(zo_arch arch, int layers, int hidden, int vocab, int max_seq)
{
    int gpt = arch == ZO_ARCH_GPT;
    zo_model_config c = {0};
    snprintf(c.name, sizeof c.name, gpt ? "tiny-gpt2" : "tiny-llama");
    snprintf(c.family, sizeof c.family, gpt ? "gpt2" : "llama2");
    c.arch = arch;
    c.n_layers = layers;
    c.hidden = hidden;
    c.n_heads = 4;
    c.n_kv_heads = gpt ? 4 : 2;
    c.ffn = (gpt ? 4 : 3) * hidden;
    c.vocab = vocab;
    c.max_seq = max_seq;
    c.norm_eps = 1e-5f;
    if (gpt) {
        c.tied_embeddings = 1; /* the head depends on the embedding block */
        c.attn_bias = c.out_bias = c.norm_bias = 1;
    } else {
        c.rope_theta = 10000.0f;
    }
    if (zo_model_config_validate(&c) != ZO_OK) fail_msg("tiny_model: %s", zo_last_error());
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
