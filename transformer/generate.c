/* Generation on the offload runtime (generate.h). */
#include "transformer/generate.h"

#include <stdlib.h>
#include <string.h>

#include "common/model_config.h" /* defines: zo_model_longrope_rows, zo_model_longrope_switches */
#include "model/lora.h"          /* defines: model_lora_load */

zo_status tf_gen_init(tf_gen *g, const zo_model_config *cfg, gpu_device_t dev, const tf_gen_config *c)
{
    zo_status st;
    memset(g, 0, sizeof *g);
    if (c->batch < 1 || c->prompt_max < 1 || c->ctx < c->prompt_max)
        return zo_error(ZO_ERR_INVALID, "tf_gen_init: %d sequences, prompts of %d tokens, a context of %d "
                        "(at least the prompt)", c->batch, c->prompt_max, c->ctx);
    /* (longrope: the forward at the crossing takes original + 1 tokens a sequence) */
    const int rows = zo_model_longrope_rows(cfg, c->prompt_max, c->ctx);
    g->prompt_max = c->prompt_max;
    g->ctx = c->ctx;
    g->len = calloc((size_t)c->batch, sizeof *g->len);
    g->pos = calloc((size_t)c->batch, sizeof *g->pos);
    g->last = calloc((size_t)c->batch, sizeof *g->last);
    g->tok = calloc((size_t)c->batch * rows, sizeof *g->tok);
    /* every token so far, for longrope's crossing only (a context past the
     * original length) */
    const int keep = zo_model_longrope_switches(cfg, c->ctx);
    if (keep) g->seq = calloc((size_t)c->batch * c->ctx, sizeof *g->seq);
    if (!g->len || !g->pos || !g->last || !g->tok || (keep && !g->seq)) {
        tf_gen_free(g);
        return zo_error(ZO_ERR_NOMEM, "tf_gen_init: out of host memory");
    }
    tf_options to = {.external_res = 1, .lora = c->lora, .kv_len = c->ctx, .mla_cache = c->mla_cache};
    offload_config oc = c->oc;
    oc.forward_only = 1;
    if ((st = gpu_stream_create(dev, &g->s)) != ZO_OK ||
        (st = tf_init_opts(&g->m, cfg, dev, c->dtype, c->batch, rows, &to)) != ZO_OK ||
        (st = tf_offload_model_init(&g->tm, &g->m)) != ZO_OK || (st = offload_init(&g->rt, dev, &g->tm.om, &oc)) != ZO_OK) {
        tf_gen_free(g);
        return st;
    }
    return ZO_OK;
}

void tf_gen_free(tf_gen *g)
{
    offload_free(g->rt);
    tf_offload_model_free(&g->tm);
    tf_free(&g->m);
    if (g->s) gpu_stream_destroy(g->s);
    free(g->len);
    free(g->pos);
    free(g->last);
    free(g->tok);
    free(g->seq);
    memset(g, 0, sizeof *g);
}

/* ---- weights ------------------------------------------------------------------------- */

static zo_status set_block(void *ctx, int block, const void *buf)
{
    return offload_set_block(ctx, block, buf);
}

/* A block of the frozen base, packed as the model keeps it, into its store. */
typedef struct base_sink {
    tf_gen *g;
    void *packed;
} base_sink;

static zo_status set_base_block(void *ctx, int block, const void *buf)
{
    base_sink *b = ctx;
    zo_status st = tf_frozen_pack(&b->g->m, block, buf, b->packed);
    return st == ZO_OK ? offload_set_frozen_block(b->g->rt, block, b->packed) : st;
}

/* The adapters (small: every block at once) from a PEFT directory. */
static zo_status load_adapters(tf_gen *g, const char *dir)
{
    const model_layout *ad = &g->m.adapters;
    float **blocks = calloc((size_t)ad->n_blocks, sizeof *blocks);
    zo_status st = blocks ? ZO_OK : zo_error(ZO_ERR_NOMEM, "tf_gen_load: out of host memory for the adapters");
    for (int b = 0; st == ZO_OK && b < ad->n_blocks; b++)
        if (!(blocks[b] = calloc(ad->block_numel[b] + 1, sizeof(float))))
            st = zo_error(ZO_ERR_NOMEM, "tf_gen_load: out of host memory for the adapters");
    if (st == ZO_OK) st = model_lora_load(dir, ad, (void *const *)blocks, ZO_DTYPE_F32);
    for (int b = 0; st == ZO_OK && b < ad->n_blocks; b++) st = offload_set_block(g->rt, b, blocks[b]);
    for (int b = 0; blocks && b < ad->n_blocks; b++) free(blocks[b]);
    free(blocks);
    return st;
}

zo_status tf_gen_load(tf_gen *g, const char *weights, uint64_t seed, const char *adapter)
{
    zo_status st = tf_load_router_bias(&g->m, weights);
    if (st != ZO_OK) return st;
    if (!g->m.opts.lora.r) return tf_load_blocks(&g->m.layout, weights, seed, set_block, g->rt);
    if (!adapter) return zo_error(ZO_ERR_INVALID, "tf_gen_load: the model has adapters and no directory to read");
    size_t big = 1;
    for (int b = 0; b < g->m.layout.n_blocks; b++)
        if (tf_frozen_bytes(&g->m, b) > big) big = tf_frozen_bytes(&g->m, b);
    base_sink sink = {.g = g, .packed = malloc(big)};
    if (!sink.packed) return zo_error(ZO_ERR_NOMEM, "tf_gen_load: out of host memory for a block of %zu bytes", big);
    st = tf_load_blocks(&g->m.layout, weights, seed, set_base_block, &sink);
    free(sink.packed);
    return st == ZO_OK ? load_adapters(g, adapter) : st;
}

/* ---- forwards --------------------------------------------------------------------------- */

/* The tokens set (g->tok, t a sequence), every block forward, the logits. */
static zo_status run(tf_gen *g, int t, float *logits)
{
    zo_status st;
    if ((st = tf_set_tokens(&g->m, g->s, g->tok, g->n, t, g->pos, g->last)) != ZO_OK ||
        (st = offload_forward(g->rt, g->s)) != ZO_OK)
        return st;
    return tf_logits(&g->m, g->s, logits);
}

/* Every sequence's tokens so far from position 0 (prompts[j], or g->seq
 * where prompts is NULL; g->len), one forward of the longest's t: a shorter
 * one is padded with its last token, whose keys the tokens after it
 * overwrite before anything reads them. */
static zo_status run_whole(tf_gen *g, const int32_t *const *prompts, float *logits)
{
    int t = 1;
    for (int j = 0; j < g->n; j++)
        if (g->len[j] > t) t = g->len[j];
    for (int j = 0; j < g->n; j++) {
        const int32_t *q = prompts ? prompts[j] : g->seq + (size_t)j * g->ctx;
        for (int i = 0; i < t; i++) g->tok[(size_t)j * t + i] = q[i < g->len[j] ? i : g->len[j] - 1];
        g->pos[j] = 0;
        g->last[j] = g->len[j] - 1;
    }
    return run(g, t, logits);
}

zo_status tf_gen_prompt(tf_gen *g, const int32_t *const *prompts, const int *lens, int n, float *logits)
{
    if (n < 1 || n > g->m.B)
        return zo_error(ZO_ERR_INVALID, "tf_gen_prompt: %d prompts (the model holds 1 to %d)", n, g->m.B);
    for (int j = 0; j < n; j++)
        if (lens[j] < 1 || lens[j] > g->prompt_max)
            return zo_error(ZO_ERR_INVALID, "tf_gen_prompt: prompt %d has %d tokens (1 to %d)", j, lens[j],
                            g->prompt_max);
    for (int j = 0; j < n; j++) {
        if (g->seq) memcpy(g->seq + (size_t)j * g->ctx, prompts[j], (size_t)lens[j] * sizeof *g->seq);
        g->len[j] = lens[j];
    }
    g->n = n;
    return run_whole(g, prompts, logits);
}

zo_status tf_gen_next(tf_gen *g, const int32_t *tokens, float *logits)
{
    if (!g->n) return zo_error(ZO_ERR_INVALID, "tf_gen_next: no prompt yet (tf_gen_prompt)");
    int before = 0;
    for (int j = 0; j < g->n; j++) {
        if (g->len[j] >= g->ctx)
            return zo_error(ZO_ERR_INVALID, "tf_gen_next: sequence %d holds %d tokens, the context's %d", j,
                            g->len[j], g->ctx);
        if (g->len[j] > before) before = g->len[j];
    }
    for (int j = 0; j < g->n; j++) {
        if (g->seq) g->seq[(size_t)j * g->ctx + g->len[j]] = tokens[j];
        g->tok[j] = tokens[j];
        g->pos[j] = g->len[j]++;
        g->last[j] = 0;
    }
    /* longrope's crossing: the longest sequence reaches original + 1 tokens
     * with a cache of at most original positions (Hugging Face's Phi-3
     * drops its cache there): every token again, with long_factor */
    if (!zo_model_longrope_switches(&g->m.cfg, before) && zo_model_longrope_switches(&g->m.cfg, before + 1))
        return run_whole(g, NULL, logits);
    return run(g, 1, logits);
}
