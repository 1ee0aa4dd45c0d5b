/* The small models the runtime's tests train, and their data (tests only;
 * links cmocka). */
#ifndef ZO_TESTS_SUPPORT_MODELS_H
#define ZO_TESTS_SUPPORT_MODELS_H

#include <stdint.h>

#include "common/model_config.h" /* defines: zo_model_config, zo_arch */

/* A validated configuration: GPT-2 shaped ("tiny-gpt2": 4 heads, ffn 4 x
 * hidden, tied embeddings, biases) or LLaMA shaped ("tiny-llama": 4 heads, 2
 * KV heads (grouped-query attention), ffn 3 x hidden, RoPE). */
zo_model_config tiny_model(zo_arch arch, int layers, int hidden, int vocab, int max_seq);

/* Tokens of micro-batch `k`: rows b x t; row r is global row k*b + r, so k
 * micro-batches of b rows hold the rows of one batch of k*b (the same on
 * every rank of a job). Mostly the next id after the previous one, sometimes
 * random, so that the loss falls. */
void tiny_batch(int vocab, int b, int t, int64_t k, int32_t *in, int32_t *tg);

#endif
