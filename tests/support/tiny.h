/* Small models and their data for the runtime's tests and benchmarks: a
 * LLaMA-shaped config of a given size and pseudo-random batches with some
 * structure (so the loss falls), the same on every rank of a job. */
#ifndef ZO_TESTS_SUPPORT_TINY_H
#define ZO_TESTS_SUPPORT_TINY_H

#include <stdint.h>

#include "common/model_config.h" /* defines: zo_model_config */

/* LLaMA family: `layers` layers of `hidden` (4 heads, 2 key/value heads,
 * ffn 3 x hidden), vocabulary `vocab`, 64 positions, untied. */
zo_model_config tiny_llama_config(int layers, int hidden, int vocab);
/* GPT-2 family: biases, LayerNorm, 4 heads, ffn 4 x hidden, the head tied
 * to the embedding (it reads block 0's weights). */
zo_model_config tiny_gpt_config(int layers, int hidden, int vocab);

/* Tokens of micro-batch `k`: rows b x t; row r is global row k*b + r, so k
 * micro-batches of b rows hold the rows of one batch of k*b. Mostly the
 * next id after the previous one, sometimes random. */
void tiny_batch(int vocab, int b, int t, int64_t k, int32_t *in, int32_t *tg);

#endif
