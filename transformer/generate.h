/* Generation on the offload runtime: a transformer built for generation (a
 * key/value cache per layer on the device, tf_options.kv_len) run as the
 * runtime's forward-only model, its weights resident on the device,
 * streamed from pinned host memory or read from NVMe block by block, as the
 * configuration places them (docs/generate.md). Prompts go in, the logits
 * of each sequence's next token come out; choosing the token is the
 * caller's (examples/generate/sample.h).
 *
 *     tf_gen g;
 *     tf_gen_config c = {.batch = 1, .prompt_max = 16, .ctx = 64, .dtype = ZO_DTYPE_BF16};
 *     offload_config_defaults(&c.oc);
 *     c.oc.params_on = OFFLOAD_CPU;                    // streamed from pinned host memory
 *     tf_gen_init(&g, &cfg, dev, &c);
 *     tf_gen_load(&g, "model.safetensors", 0, NULL);  // or an adapter directory too
 *     tf_gen_prompt(&g, prompts, lens, 1, logits);     // logits [n, vocab] of each prompt's last token
 *     tf_gen_next(&g, next, logits);                   // one token per sequence, the logits after it
 *     tf_gen_free(&g);
 */
#ifndef ZO_TRANSFORMER_GENERATE_H
#define ZO_TRANSFORMER_GENERATE_H

#include <stdint.h>

#include "offload/offload.h"           /* defines: offload_t, offload_config */
#include "transformer/offload_model.h" /* defines: tf_model, tf_offload_model */

typedef struct tf_gen_config {
    int batch;          /* sequences generated together */
    int prompt_max;     /* tokens of the longest prompt (one forward takes them all) */
    int ctx;            /* positions a sequence may reach: its prompt and the tokens after it */
    zo_dtype dtype;     /* weights, activations and the caches on the device */
    tf_lora_options lora; /* r > 0: the base frozen under PEFT adapters (nf4: QLoRA's NF4 base) */
    int mla_cache;      /* latent attention's cache: TF_MLA_CACHE_LATENT (0) or _FULL (tf_options) */
    /* where the weights live: params_on (with adapters: the base; trainable_on
     * the adapters), prefetch_depth, nvme_dir, n_threads; tf_gen_init makes it
     * forward-only */
    offload_config oc;
} tf_gen_config;

typedef struct tf_gen {
    tf_model m;
    tf_offload_model tm;
    offload_t *rt;
    gpu_stream_t s;
    int n;              /* sequences of the current prompts */
    int prompt_max, ctx; /* tf_gen_config's */
    int *len;           /* [batch] tokens each sequence holds so far */
    int *pos, *last;    /* [batch] the forward's positions and rows */
    int32_t *tok;       /* [batch * m.T] the forward's tokens (host) */
    int32_t *seq;       /* [batch * ctx] each sequence's tokens so far, or NULL: kept only where
                           longrope's crossing can come (a context past the original length) */
} tf_gen;

/* The model for generation on `dev` and the forward-only runtime over it
 * (ZO_ERR_CAPACITY naming what does not fit the device). */
zo_status tf_gen_init(tf_gen *g, const zo_model_config *cfg, gpu_device_t dev, const tf_gen_config *c);
void tf_gen_free(tf_gen *g);

/* The weights: from a safetensors checkpoint (`weights`: a file, an index or
 * a directory) or, when NULL, random from `seed` (tf_init_weights's); with
 * adapters (tf_gen_config.lora.r), the base packed as the model keeps it
 * (NF4 with QLoRA) and the adapters from the PEFT directory `adapter`. One
 * block in host memory at a time. */
zo_status tf_gen_load(tf_gen *g, const char *weights, uint64_t seed, const char *adapter);

/* n prompts (n <= batch, lens[j] in 1..prompt_max tokens), one forward that
 * fills the caches from position 0; logits [n, vocab] (fp32, host): the
 * next-token logits after each prompt. */
zo_status tf_gen_prompt(tf_gen *g, const int32_t *const *prompts, const int *lens, int n, float *logits);

/* One new token per sequence (tokens[n]) at its next position; the logits
 * after it. ZO_ERR_INVALID when a sequence would pass tf_gen_config.ctx.
 * longrope (Phi-3-mini-128k, Phi-3.5): the step at which the longest
 * sequence first holds original_max_position_embeddings + 1 tokens runs one
 * forward over every sequence's tokens so far with long_factor, which
 * computes the caches again, as Hugging Face's Phi-3 generation does; the
 * forwards before it turn by short_factor, those after by long_factor. */
zo_status tf_gen_next(tf_gen *g, const int32_t *tokens, float *logits);

#endif
