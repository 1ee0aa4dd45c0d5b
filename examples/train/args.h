/* train's flags: what they set (train_args), --help, and the parser that
 * reads a plan first and every flag over it. A flag that sets a plan field
 * is read and checked through the plan schema's table (zo_plan_flag_*,
 * common/plan_schema.h) and the run vocabulary (zo_plan_*_parse,
 * common/plan_vocab.h), so that train and memplan give one value the same
 * verdict in the same words. */
#ifndef ZO_EXAMPLES_TRAIN_ARGS_H
#define ZO_EXAMPLES_TRAIN_ARGS_H

#include <stdint.h>

#include "common/lora.h"       /* defines: zo_lora_config */
#include "examples/finetune.h" /* defines: ft_schedule */
#include "model/corpus.h"      /* defines: model_packing */
#include "model/data.h"        /* defines: model_token_width */
#include "offload/offload.h"   /* defines: offload_plan, offload_config */

typedef struct train_args {
    const char *model, *weights, *data, *save, *device;
    const char *merge;   /* --merge DIR: with LoRA, the merged model as a Hugging Face folder */
    uint64_t max_shard;  /* --max-shard-size: --save's weights sharded above it; 0: 5 GB */
    const char *plan, *ckpt, *resume, *stats_json;
    const char *tokenizer, *eot, *eval_data, *log, *plot;
    model_token_width width;
    int set_width;       /* --tokens-u32 or --text given */
    model_packing packing;
    int set_packing, set_eval_batches;
    int set_recompute_layers;    /* --recompute-layers was given */
    long steps, micro_batch, seq, seed, threads, save_every;
    long eval_every, eval_batches, schedule_steps;
    ft_schedule sched;   /* its lr: the AdamW lr (--lr) */
    zo_lora_config lora; /* r 0: full fine-tuning */
    int qlora;
    int optim_8bit, optim_dtype_set; /* --optim adamw8bit, --optim-dtype given */
    const char *adapter; /* PEFT adapter directory to start from */
    offload_plan p;      /* the runtime's configuration: the plan, then the flags */
    zo_dtype dtype;
    const char *dtype_from;  /* what set dtype: the default, --dtype, the plan (the header says) */
    uint64_t device_mem;
    double comm_timeout; /* seconds; 0: ZO_COMM_TIMEOUT or the communicator's default */
    int tp, pp, ep;      /* --tp, --pp, --ep (memplan's degrees; 0: not given): the capability table's to refuse */
    int check_plan;      /* --check-plan: check the plan against the model, run nothing */
    int profile;         /* --profile: time every device op of the steps (gpu/profile.h) */
    int grads;           /* --grads: a zo_plan_tier (checked against the optimizer's split); -1: not given */
    char dir_weights[4096], dir_tokenizer[4096]; /* --model DIR: its files, where not given */
} train_args;

/* Parse argv into *a: the defaults, then --plan's file, then every flag.
 * Returns -1 to run, or the exit status to end with at once: 0 after
 * --help or --version, 2 for bad flags (the message, naming the flag, printed). */
int args_parse(int argc, char **argv, train_args *a);

#endif
