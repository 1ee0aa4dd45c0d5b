/* The weights in and out of the runtime, one block at a time (host memory
 * never holds the model): the initial weights, --save, and the writer of a
 * checkpoint's model.safetensors. */
#ifndef ZO_EXAMPLES_TRAIN_WEIGHTS_H
#define ZO_EXAMPLES_TRAIN_WEIGHTS_H

#include <stddef.h>

#include "examples/train/args.h"   /* defines: train_args */
#include "offload/offload.h"       /* defines: offload_t, offload_block_reader */
#include "transformer/transformer.h" /* defines: tf_model */

/* The initial weights: a safetensors checkpoint (--weights) or random from
 * --seed; with LoRA, the frozen base from them (packed: NF4 with QLoRA) and
 * the adapters from --adapter or PEFT's init. *into_s: the seconds of it
 * spent putting them into the runtime (the rest: reading or drawing them). */
zo_status weights_load(offload_t *rt, const tf_model *m, const train_args *a, double *into_s);

/* --save DIR: the trained model as a Hugging Face folder (model/hf.h:
 * config.json, the weights in --dtype, sharded past --max-shard-size, the
 * tokenizer's files), or with LoRA a PEFT adapter directory, and with
 * --merge DIR the adapters merged into the base as such a folder. Every
 * rank calls it (blocks are gathered when the optimizer state is
 * partitioned); rank 0 writes. */
zo_status weights_save(offload_t *rt, const tf_model *m, const train_args *a, int rank, comm_t ep);

/* An offload_weights_stream: the model_layout `user` as safetensors, fp32. */
zo_status weights_write(void *user, const char *path, offload_block_reader read, void *ctx);

/* The frozen base's bytes, every block. */
size_t weights_frozen_total(const tf_model *m);

#endif
