/* A Hugging Face model folder: what save_pretrained writes and
 * from_pretrained (and generate --model DIR, train --weights DIR) reads.
 *
 *   config.json                    the config given, its "torch_dtype" the
 *                                  weights' (or, for a preset, one written
 *                                  from the shape with Hugging Face's keys)
 *   model.safetensors              the weights with Hugging Face's names, in
 *                                  the dtype asked; or, above the shard size,
 *   model-00001-of-0000N.safetensors and model.safetensors.index.json
 *                                  ({"metadata": {"total_size": bytes},
 *                                  "weight_map": {name: shard}}), tensors
 *                                  taken in order, a shard closed before one
 *                                  would pass the size (save_pretrained's rule)
 *   tokenizer.json (and tokenizer_config.json, special_tokens_map.json when
 *                                  they sit beside the tokenizer.json given)
 *
 * Each file is written atomically; a folder that held a model of the other
 * form (one file, or shards and their index) loses that form's files, by
 * name, so that readers find one model. The weights come one block at a
 * time (model_block_read_fn): host memory holds a block. */
#ifndef ZO_MODEL_HF_H
#define ZO_MODEL_HF_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "model/safetensors.h" /* defines: model_block_read_fn, model_layout */

#define MODEL_HF_SHARD_DEFAULT (5ull * 1000 * 1000 * 1000) /* save_pretrained's max_shard_size "5GB" */

typedef struct model_hf_folder {
    const char *dir;           /* created when missing */
    const model_layout *l;
    zo_dtype dtype;            /* the weights as stored */
    uint64_t max_shard_bytes;  /* 0: MODEL_HF_SHARD_DEFAULT */
    const char *config;        /* the config.json given (copied, torch_dtype set), or NULL */
    const char *tokenizer;     /* the tokenizer.json given, or NULL */
    const model_st_entry *extra; /* tensors no block holds, their data given (DeepSeek-V3's
                                    router score corrections, fp32), written after the
                                    layout's in the last file; n_extra of them */
    int n_extra;
} model_hf_folder;

/* Write the folder. *shards (may be NULL): the weight files written (1: no
 * index). */
zo_status model_hf_save(const model_hf_folder *f, model_block_read_fn read, void *ctx, int *shards);

/* A config.json for a model shape (a preset's: its family's model_type and
 * architectures, Hugging Face's keys and defaults), torch_dtype `dtype`.
 * zo_model_config_load reads it back to the same shape. */
zo_status model_hf_config(const zo_model_config *cfg, zo_dtype dtype, cJSON **out);

/* The config.json at `src` as model_hf_save writes it for the model cfg
 * saved in `dtype`: the keys given, torch_dtype (and transformers 5's
 * dtype, where the config has it) the weights', no quantization_config
 * (the weights written are dequantized); a multimodal checkpoint's text
 * model's (cfg->mm_text). */
zo_status model_hf_config_copy(const char *src, const zo_model_config *cfg, zo_dtype dtype, cJSON **out);

/* "float32", "float16", "bfloat16": torch_dtype's names. */
const char *model_hf_dtype_name(zo_dtype dt);

#endif
