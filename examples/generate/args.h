/* generate's flags: what they set (gen_args), --help, and the parser. The
 * flags that mean what train's mean have train's names and checks (--model,
 * --weights, --tokenizer, --dtype, --seed, --device, --device-mem,
 * --threads, --plan, --params-on, --adapters-on, --prefetch, --nvme-dir,
 * --adapter, --qlora, --stats-json); the generation flags have Hugging
 * Face's generate() names. */
#ifndef ZO_EXAMPLES_GENERATE_ARGS_H
#define ZO_EXAMPLES_GENERATE_ARGS_H

#include <stdint.h>

#include "offload/offload.h" /* defines: offload_plan, offload_config */

#define GEN_MAX_PROMPTS 256

typedef struct gen_args {
    const char *model, *weights, *tokenizer, *adapter, *plan, *device, *stats_json;
    const char *prompt[GEN_MAX_PROMPTS];     /* --prompt TEXT or --prompt-ids 1,2,3, in order */
    int prompt_is_ids[GEN_MAX_PROMPTS];      /* 1: prompt[i] is --prompt-ids' */
    int n_prompts;
    long max_new_tokens, top_k, seed, threads;
    double temperature, top_p;
    const char *eos;     /* --eos ID|none; NULL: the config's, else the tokenizer's */
    int print_ids;
    int qlora;
    int mla_cache;       /* --mla-cache: TF_MLA_CACHE_LATENT (default) or _FULL */
    zo_dtype dtype;
    uint64_t device_mem;
    offload_plan p;      /* placement: the plan, then the flags */
} gen_args;

/* Parse argv into *a: the defaults, then --plan's file, then every flag.
 * Returns -1 to run, or the exit status to end with at once: 0 after
 * --help, 2 for bad flags (the message, naming the flag, printed). */
int gen_args_parse(int argc, char **argv, gen_args *a);

#endif
