/* A LoRA run's starting weights, as the runtime tests set them (test_offload,
 * test_zero). */
#ifndef ZO_TESTS_SUPPORT_LORA_INIT_H
#define ZO_TESTS_SUPPORT_LORA_INIT_H

#include <stdint.h>

#include "offload/offload.h"         /* defines: offload_t */
#include "transformer/transformer.h" /* defines: tf_model */

/* The frozen base of m (packed, NF4 with QLoRA) from the weights of seed
 * 1234 and the adapters at PEFT's init (seed 99), set in rt block by block;
 * base[b] (m's n_blocks entries) gets each block's packed bytes, for the
 * caller to compare after the run and free. */
void lora_init_weights(offload_t *rt, tf_model *m, uint8_t **base);
/* Whether rt's frozen base (ZeRO-3: the ranks' parts gathered) differs from
 * the bytes it was given, base; frees base. */
int lora_base_changed(offload_t *rt, tf_model *m, uint8_t **base);

#endif
