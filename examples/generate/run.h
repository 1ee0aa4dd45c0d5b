/* generate's run: what it reads (the config, the tokenizer, the prompts, the
 * end-of-sequence tokens, the adapters' settings), the device and the
 * generation model over the runtime (transformer/generate.h), a step (the
 * prompts' forward, then a token per sequence), the text and ids it prints,
 * the report (tokens/s, time to first token, the peaks per tier) and the
 * end (exit status by status and phase, as train's). */
#ifndef ZO_EXAMPLES_GENERATE_RUN_H
#define ZO_EXAMPLES_GENERATE_RUN_H

#include <stdint.h>

#include "examples/generate/args.h"   /* defines: gen_args */
#include "examples/generate/sample.h" /* defines: gen_sampler */
#include "model/tokenizer.h"          /* defines: model_tokenizer, model_ids */
#include "transformer/generate.h"     /* defines: tf_gen */

#define GEN_MAX_EOS 8

/* What the run was doing, for the exit status: reading its inputs (config,
 * tokenizer, prompts, weights, adapters, plan), setting up, or generating. */
typedef enum gen_phase { GEN_INPUT, GEN_SETUP, GEN_RUN } gen_phase;

typedef struct gen_run {
    gen_args *a;
    gen_phase phase;
    zo_model_config cfg;
    char model_dir[4096];           /* --model as a folder, or "" */
    const char *weights;            /* the checkpoint read, or NULL (random) */
    char tok_path[4200];            /* the tokenizer read, or "" */
    model_tokenizer *tok;
    int32_t eos[GEN_MAX_EOS];       /* a sequence stops at any of them */
    int n_eos;
    tf_lora_options lora;           /* the adapter's r, alpha, targets (r 0: none) */
    int n;                          /* sequences (prompts) */
    model_ids *prompts;             /* [n] */
    int batch, ctx, prompt_max;     /* the model's buffers */
    gpu_device_t dev;
    tf_gen g;
    gen_sampler smp;
    float *logits;                  /* [batch, vocab] */
    model_ids *out;                 /* [n] the generated ids */
    int *done;                      /* [n] the sequence stopped (end-of-sequence or the count) */
    size_t printed;                 /* bytes of sequence 0's text written (one prompt, streamed) */
    double t_start, t_first, t_end; /* the prompts' forward began; the first tokens; the last */
} gen_run;

/* The config (a file, a folder's or a preset), the plan against it, the
 * tokenizer, the prompts, the end-of-sequence tokens, the adapter's
 * settings. */
zo_status gen_read_inputs(gen_run *r, gen_args *a);
/* The device, the model for generation and the runtime (placement from the
 * plan and the flags), then the weights block by block. */
zo_status gen_setup(gen_run *r);
/* What will run, on stderr. */
void gen_report_start(const gen_run *r);
/* The prompts' forward and the first token of each sequence. */
zo_status gen_first(gen_run *r);
/* One more token of every sequence still going; *more: whether any is. */
zo_status gen_next(gen_run *r, int *more);
/* The text (or ids) not yet printed; the report on stderr; --stats-json. */
zo_status gen_report_end(gen_run *r);
/* Everything released, the message printed; the exit status. */
int gen_finish(gen_run *r, zo_status st);

#endif
