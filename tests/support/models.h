/* The small model configurations the runtime's tests train (tests only;
 * links cmocka). */
#ifndef ZO_TESTS_SUPPORT_MODELS_H
#define ZO_TESTS_SUPPORT_MODELS_H

#include "common/model_config.h" /* defines: zo_model_config, zo_arch */

/* A validated configuration: GPT-2 shaped ("tiny-gpt2": 4 heads, ffn 4 x
 * hidden, tied embeddings, biases) or LLaMA shaped ("tiny-llama": 4 heads, 2
 * KV heads (grouped-query attention), ffn 3 x hidden, RoPE). */
zo_model_config tiny_model(zo_arch arch, int layers, int hidden, int vocab, int max_seq);

#endif
