/* What train reads before it sets anything up: the model's config, the
 * tokenizer, the training and held-out data, and the LoRA choice (the flags,
 * the plan or --adapter's config). A failure here is bad input (exit 2). */
#ifndef ZO_EXAMPLES_TRAIN_INPUTS_H
#define ZO_EXAMPLES_TRAIN_INPUTS_H

#include <stdint.h>

#include "common/model_config.h" /* defines: zo_model_config */
#include "examples/train/args.h" /* defines: train_args */
#include "model/data.h"          /* defines: model_tokens */
#include "model/tokenizer.h"     /* defines: model_tokenizer */

/* --model: a path to an existing file is a config.json, anything else a preset. */
zo_status inputs_load_config(const char *arg, zo_model_config *cfg);

/* --tokenizer (NULL without it) and the end-of-text token appended after
 * each document (--eot, else the tokenizer's; -1: none). Prints what it read. */
zo_status inputs_tokenizer(const train_args *a, int vocab, model_tokenizer **tok, int32_t *eot);

/* --data or --eval-data: a token file (read as its side file says, when it
 * has one), or with a tokenizer, text tokenized now. Prints what it read. */
zo_status inputs_open_data(const train_args *a, const char *path, const model_tokenizer *tok, int32_t eot,
                           int vocab, model_tokens *out);

/* The LoRA choice into a->lora and a->qlora: the flags, or a plan for LoRA
 * or QLoRA, or the adapter directory's config (which a flag given as well
 * must agree with); q,v by default. Checked against the model. */
zo_status inputs_lora_choice(train_args *a, const zo_model_config *cfg);

#endif
