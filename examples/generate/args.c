/* generate's flags (args.h): the help text, the options, a handler for each
 * group of flags and the checks across them. */
#include "examples/generate/args.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "common/plan_schema.h" /* defines: zo_plan_flag_int */
#include "common/plan_vocab.h"  /* defines: zo_plan_tier_parse */
#include "common/units.h"       /* defines: zo_parse_int, zo_parse_double, zo_parse_size */
#include "common/version.h"     /* defines: zo_version_print */
#include "transformer/transformer.h" /* defines: TF_MLA_CACHE_LATENT, TF_MLA_CACHE_FULL */

static const char HELP[] =
    "usage: generate --model CONFIG|DIR|PRESET (--prompt TEXT | --prompt-ids 1,2,3)... [options]\n"
    "\n"
    "Generate text with a GPT-2, GPT-NeoX (Pythia), Falcon, OPT, BLOOM, Phi-1/2, GPT-J, StarCoder2,\n"
    "Cohere (Command-R, Aya), Cohere2 (Command-R7B, Command-A) or LLaMA-family model (LLaMA, Mistral,\n"
    "Qwen2/3, Phi-3, Gemma, Gemma-2/3, Granite, OLMo-2/3, EXAONE 4.0, SmolLM3, Seed-OSS, ERNIE 4.5;\n"
    "Mixtral, Granite-MoE, Qwen-MoE, DeepSeekMoE, DeepSeek-V2/V3 and Kimi-K2 with their latent\n"
    "attention, GLM-4.5, OLMoE, Phi-3.5-MoE, gpt-oss; 'memplan models' lists each model_type, * where\n"
    "it runs):\n"
    "each prompt is read in one forward that fills a key/value cache on the device, then one token\n"
    "at a time is chosen (greedy, or sampled) and fed back, until --max-new-tokens or the\n"
    "end-of-sequence token.\n"
    "The weights live where training puts them: resident on the device, streamed block by\n"
    "block from pinned host memory, or read from NVMe, so a model larger than the device's\n"
    "memory generates (docs/generate.md).\n"
    "\n"
    "model:\n"
    "  --model CONFIG|DIR|PRESET  a Hugging Face config.json, a model folder holding one\n"
    "                         (with its weights and tokenizer.json: what train --save writes),\n"
    "                         or a preset name (gpt2, llama-2-7b, ...)\n"
    "  --weights FILE|DIR     safetensors weights: a file, a model.safetensors.index.json or\n"
    "                         a folder (default: the --model folder; without one, GPT-2-style\n"
    "                         random weights from --seed)\n"
    "  --tokenizer FILE       the model's tokenizer.json (default: the one in the --model or\n"
    "                         --weights folder); needed for --prompt and to print text\n"
    "  --adapter DIR          a PEFT LoRA adapter directory (adapter_config.json and\n"
    "                         adapter_model.safetensors, as train --lora --save writes), applied\n"
    "                         over the base weights\n"
    "  --qlora                with --adapter: the base's linear weights in NF4 (QLoRA)\n"
    "  --dtype fp32|fp16|bf16 weights, activations and the cache on the device (default bf16,\n"
    "                         memplan's and train's)\n"
    "  --mla-cache latent|full  DeepSeek-V2's latent attention: cache each position's compressed\n"
    "                         latent, [k_pe | c_kv] (qk_rope + kv_lora_rank elements a layer), and\n"
    "                         attend with kv_b_proj absorbed into the queries, as DeepSeek's own\n"
    "                         inference does (latent, the default); or every head's decompressed\n"
    "                         key and value, 2 heads (qk_nope + qk_rope) a layer, as Hugging\n"
    "                         Face's does (full)\n"
    "\n"
    "prompts and generation (Hugging Face generate()'s names):\n"
    "  --prompt TEXT          a prompt, through the tokenizer (its special tokens added, as\n"
    "                         add_special_tokens=True); repeat for several, generated as one batch\n"
    "  --prompt-ids LIST      a prompt as token ids, 1,2,3; repeat for several\n"
    "  --max-new-tokens N     tokens generated after each prompt at most (default 32)\n"
    "  --temperature T        0: greedy, the most likely token (default); > 0: sample from the\n"
    "                         softmax of logits / T\n"
    "  --top-k K              sample among the K most likely tokens (0: all; default 0)\n"
    "  --top-p P              sample among the most likely tokens whose probabilities reach P\n"
    "                         (1: all; default 1); temperature, then top-k, then top-p, as\n"
    "                         Hugging Face applies them\n"
    "  --seed N               the sampling's random seed, and the random weights' (default 1337)\n"
    "  --eos ID|none          the end-of-sequence token (default: config.json's eos_token_id, else\n"
    "                         the tokenizer's end-of-text); a sequence that generates it stops\n"
    "  --print-ids            print the generated ids, one line per prompt, space-separated,\n"
    "                         instead of the text\n"
    "\n"
    "placement (a plan, then these flags; see docs/offload.md):\n"
    "  --plan FILE            a plan memplan generate wrote (--plan-out FILE): placement, batch,\n"
    "                         context, dtype, device memory, and its predicted peaks per tier\n"
    "  --params-on gpu|cpu|nvme     weights (with --adapter: the base) resident, or streamed from\n"
    "                         pinned host memory / NVMe block by block (default gpu)\n"
    "  --adapters-on gpu|cpu|nvme   where the adapters live (default gpu)\n"
    "  --prefetch N           blocks loaded ahead of the one computing (default 2)\n"
    "  --nvme-dir DIR         where NVMe weights live\n"
    "\n"
    "device:\n"
    "  --device NAME          cpu, cuda or cuda:N (default cpu)\n"
    "  --device-mem SIZE      device memory capacity, e.g. 512MiB, 2GB (default: the plan's, else\n"
    "                         unlimited on cpu and the free memory on cuda)\n"
    "  --threads N            threads per op on cpu (default: all)\n"
    "  --stats-json FILE      peak bytes per tier, the time split, tokens/s and time to first token\n"
    "  --version              the version\n"
    "  -h, --help             this text\n"
    "\n"
    "Writes the generated text to stdout as it is decoded (one prompt), or each prompt's text\n"
    "once done (several); the prompt is not repeated. On stderr: what runs, then time to first\n"
    "token (the prompt's forward), tokens/s after the first, the peak bytes per tier (beside\n"
    "the plan's) and the time split.\n"
    "\n"
    "A mixture of experts routes dropless: every expert a token chooses computes (training's\n"
    "capacity factor, train --capacity-factor or a plan's parallel.capacity_factor, is not\n"
    "applied to inference).\n"
    "\n"
    "Input files (--model, --weights and its shards, --tokenizer, --adapter's files, --plan)\n"
    "must be regular files: a FIFO or a device is refused, naming it.\n"
    "\n"
    "exit status: 0 generated; 1 failed at run time (out of memory or a tier's capacity, a\n"
    "device or disk error); 2 bad input (flags, config, weights, tokenizer, prompts, adapters\n"
    "or plan).\n";

enum {
    OPT_MODEL = 256, OPT_WEIGHTS, OPT_TOKENIZER, OPT_ADAPTER, OPT_QLORA, OPT_DTYPE, OPT_PROMPT, OPT_PROMPT_IDS,
    OPT_MAX_NEW, OPT_TEMP, OPT_TOP_K, OPT_TOP_P, OPT_SEED, OPT_EOS, OPT_PRINT_IDS, OPT_PLAN, OPT_PARAMS_ON,
    OPT_ADAPTERS_ON, OPT_PREFETCH, OPT_NVME_DIR, OPT_DEVICE, OPT_DEVMEM, OPT_THREADS, OPT_STATS, OPT_MLA_CACHE,
};

static const struct option long_opts[] = {
    {"model", required_argument, 0, OPT_MODEL},
    {"weights", required_argument, 0, OPT_WEIGHTS},
    {"tokenizer", required_argument, 0, OPT_TOKENIZER},
    {"adapter", required_argument, 0, OPT_ADAPTER},
    {"qlora", no_argument, 0, OPT_QLORA},
    {"dtype", required_argument, 0, OPT_DTYPE},
    {"mla-cache", required_argument, 0, OPT_MLA_CACHE},
    {"prompt", required_argument, 0, OPT_PROMPT},
    {"prompt-ids", required_argument, 0, OPT_PROMPT_IDS},
    {"max-new-tokens", required_argument, 0, OPT_MAX_NEW},
    {"temperature", required_argument, 0, OPT_TEMP},
    {"top-k", required_argument, 0, OPT_TOP_K},
    {"top-p", required_argument, 0, OPT_TOP_P},
    {"seed", required_argument, 0, OPT_SEED},
    {"eos", required_argument, 0, OPT_EOS},
    {"print-ids", no_argument, 0, OPT_PRINT_IDS},
    {"plan", required_argument, 0, OPT_PLAN},
    {"params-on", required_argument, 0, OPT_PARAMS_ON},
    {"adapters-on", required_argument, 0, OPT_ADAPTERS_ON},
    {"prefetch", required_argument, 0, OPT_PREFETCH},
    {"nvme-dir", required_argument, 0, OPT_NVME_DIR},
    {"device", required_argument, 0, OPT_DEVICE},
    {"device-mem", required_argument, 0, OPT_DEVMEM},
    {"threads", required_argument, 0, OPT_THREADS},
    {"stats-json", required_argument, 0, OPT_STATS},
    {"version", no_argument, 0, 'V'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* ---- the flags, group by group: each handler returns 1 when `c` is its own ------- */

/* The model, its weights, tokenizer and adapters. */
static int model_flag(int c, const char *arg, gen_args *a, zo_status *st)
{
    switch (c) {
    case OPT_MODEL: a->model = arg; return 1;
    case OPT_WEIGHTS: a->weights = arg; return 1;
    case OPT_TOKENIZER: a->tokenizer = arg; return 1;
    case OPT_ADAPTER: a->adapter = arg; return 1;
    case OPT_QLORA: a->qlora = 1; return 1;
    case OPT_DTYPE:
        if ((*st = zo_dtype_parse(arg, &a->dtype)) != ZO_OK) *st = zo_error_wrap(*st, "--dtype");
        return 1;
    case OPT_MLA_CACHE:
        if (!strcmp(arg, "latent")) a->mla_cache = TF_MLA_CACHE_LATENT;
        else if (!strcmp(arg, "full")) a->mla_cache = TF_MLA_CACHE_FULL;
        else *st = zo_error(ZO_ERR_INVALID, "--mla-cache %s: expected latent or full", arg);
        return 1;
    default: return 0;
    }
}

/* The prompts and how tokens are chosen. */
static int generation_flag(int c, const char *arg, gen_args *a, zo_status *st)
{
    switch (c) {
    case OPT_PROMPT:
    case OPT_PROMPT_IDS:
        if (a->n_prompts >= GEN_MAX_PROMPTS) {
            *st = zo_error(ZO_ERR_INVALID, "%s: at most %d prompts", c == OPT_PROMPT ? "--prompt" : "--prompt-ids",
                           GEN_MAX_PROMPTS);
            return 1;
        }
        a->prompt_is_ids[a->n_prompts] = c == OPT_PROMPT_IDS;
        a->prompt[a->n_prompts++] = arg;
        return 1;
    case OPT_MAX_NEW: *st = zo_parse_int(arg, "--max-new-tokens", 1, 1L << 24, &a->max_new_tokens); return 1;
    case OPT_TEMP: *st = zo_parse_double(arg, "--temperature", 0.0, 1e6, &a->temperature); return 1;
    case OPT_TOP_K: *st = zo_parse_int(arg, "--top-k", 0, 1L << 30, &a->top_k); return 1;
    case OPT_TOP_P:
        *st = zo_parse_double(arg, "--top-p", 0.0, 1.0, &a->top_p);
        if (*st == ZO_OK && !(a->top_p > 0.0)) *st = zo_error(ZO_ERR_INVALID, "--top-p %s: must be in (0, 1]", arg);
        return 1;
    case OPT_SEED: *st = zo_parse_int(arg, "--seed", 0, 0x7fffffffL, &a->seed); return 1;
    case OPT_EOS: a->eos = arg; return 1;
    case OPT_PRINT_IDS: a->print_ids = 1; return 1;
    default: return 0;
    }
}

/* Where the weights live, the device and what is written. */
static int placement_flag(int c, const char *arg, gen_args *a, zo_status *st)
{
    offload_config *oc = &a->p.cfg;
    zo_plan_tier t = ZO_PLAN_GPU;
    long v = 0;
    switch (c) {
    case OPT_PLAN: return 1; /* read first, by read_plan */
    case OPT_PARAMS_ON:
    case OPT_ADAPTERS_ON:
        if ((*st = zo_plan_tier_parse(arg, c == OPT_PARAMS_ON ? "--params-on" : "--adapters-on", 1, &t)) == ZO_OK)
            *(c == OPT_PARAMS_ON ? &oc->params_on : &oc->trainable_on) = (offload_tier)t;
        return 1;
    case OPT_PREFETCH:
        if ((*st = zo_plan_flag_int(arg, "--prefetch", "buffers.prefetch_depth", &v)) == ZO_OK)
            oc->prefetch_depth = (int)v;
        return 1;
    case OPT_NVME_DIR: oc->nvme_dir = arg; return 1;
    case OPT_DEVICE:
        a->device = arg;
        if (strcmp(arg, "cpu") && strcmp(arg, "cuda") && strncmp(arg, "cuda:", 5))
            *st = zo_error(ZO_ERR_INVALID, "--device %s: expected cpu, cuda or cuda:N", arg);
        return 1;
    case OPT_DEVMEM: *st = zo_parse_size(arg, "--device-mem", 0, &a->device_mem); return 1;
    case OPT_THREADS: *st = zo_parse_int(arg, "--threads", 1, 1024, &a->threads); return 1;
    case OPT_STATS: a->stats_json = arg; return 1;
    default: return 0;
    }
}

/* ---- the parser ---------------------------------------------------------------------- */

static void args_defaults(gen_args *a)
{
    *a = (gen_args){.max_new_tokens = 32, .top_p = 1.0, .seed = 1337, .dtype = ZO_DTYPE_BF16, .device = "cpu"};
    offload_plan_defaults(&a->p);
}

/* The plan first, so that every flag overrides it (a first pass of
 * getopt_long finds it in every spelling). -1, or 2 when it cannot be read. */
static int read_plan(int argc, char **argv, gen_args *a)
{
    int c;
    opterr = 0;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        if (c != OPT_PLAN) continue;
        a->plan = optarg;
        if (offload_plan_load(a->plan, &a->p) != ZO_OK) {
            fprintf(stderr, "generate: --plan %s\n", zo_last_error());
            return 2;
        }
        if (a->p.dtype >= 0) a->dtype = (zo_dtype)a->p.dtype;
        if (a->p.gpu_mem) a->device_mem = a->p.gpu_mem;
    }
    return -1;
}

static int bad_option(char **argv)
{
    if (optopt && optopt < 256)
        fprintf(stderr, "generate: unknown option -%c\n", optopt);
    else if (optopt)
        fprintf(stderr, "generate: option %s needs a value\n", argv[optind - 1]);
    else
        fprintf(stderr, "generate: unknown option %s\n", argv[optind - 1]);
    fprintf(stderr, "run 'generate --help' for the options\n");
    return 2;
}

/* What one flag needs of another: NULL when all is well. */
static const char *flags_conflict(const gen_args *a)
{
    if (!a->model) return "--model is required (see --help)";
    if (!a->n_prompts) return "a prompt is required: --prompt TEXT or --prompt-ids 1,2,3";
    if (a->qlora && !a->adapter) return "--qlora needs --adapter DIR (the adapters over the NF4 base)";
    if ((a->top_k || a->top_p < 1.0) && a->temperature == 0.0)
        return "--top-k and --top-p choose among tokens to sample: give --temperature T > 0 (0 is greedy)";
    return NULL;
}

int gen_args_parse(int argc, char **argv, gen_args *a)
{
    args_defaults(a);
    int rc = read_plan(argc, argv, a), c;
    if (rc >= 0) return rc;
    opterr = 0;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        if (c == 'h') {
            fputs(HELP, stdout);
            return 0;
        }
        if (c == 'V') {
            zo_version_print(stdout, "generate");
            return 0;
        }
        zo_status st = ZO_OK;
        if (!model_flag(c, optarg, a, &st) && !generation_flag(c, optarg, a, &st) &&
            !placement_flag(c, optarg, a, &st))
            return bad_option(argv);
        if (st != ZO_OK) {
            fprintf(stderr, "generate: %s\n", zo_last_error());
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "generate: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!a->model && a->plan && a->p.model_name[0]) a->model = a->p.model_name;
    const char *bad = flags_conflict(a);
    if (bad) {
        fprintf(stderr, "generate: %s\n", bad);
        return 2;
    }
    a->p.cfg.n_threads = (int)a->threads;
    return -1;
}
