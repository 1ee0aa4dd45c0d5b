/* The weights in and out of the runtime, one block at a time (host memory
 * never holds the model): the initial weights, --save, and the writer of a
 * checkpoint's model.safetensors. */
#ifndef ZO_EXAMPLES_TRAIN_WEIGHTS_H
#define ZO_EXAMPLES_TRAIN_WEIGHTS_H

#include <stddef.h>

#include "examples/train/args.h"   /* defines: train_args */
#include "model/safetensors.h"     /* defines: model_st_entry */
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

/* What a checkpoint's model.safetensors holds: the trained layout's
 * tensors (the model's, or with LoRA the adapters') and, for a full
 * fine-tune, the router score corrections DeepSeek-V3's layers keep apart
 * (tf_router_bias_entries), which --resume reads back from it
 * (weights_resume): they are in no block the optimizer saves. */
typedef struct weights_ckpt {
    const model_layout *l;
    const model_st_entry *extra;
    int n_extra;
} weights_ckpt;

weights_ckpt weights_ckpt_of(const tf_model *m, const train_args *a);

/* An offload_weights_stream: the weights_ckpt `user` as safetensors, fp32. */
zo_status weights_write(void *user, const char *path, offload_block_reader read, void *ctx);

/* After offload_load of --resume DIR: the router score corrections from
 * the checkpoint's model.safetensors when the checkpoint holds them
 * (weights_ckpt_of), so a resume without --weights routes as the run it
 * continues. */
zo_status weights_resume(const tf_model *m, const train_args *a);

/* The frozen base's bytes, every block. */
size_t weights_frozen_total(const tf_model *m);

#endif
