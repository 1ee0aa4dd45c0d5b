/* train: train a GPT-2 or LLaMA-family model on a token file, or on text
 * through the model's tokenizer.json, on the offload runtime: on the CPU
 * device backend or a CUDA GPU (--device), its memory capped by
 * --device-mem, weights resident or streamed from pinned host memory or
 * NVMe, AdamW over fp32 master state in memory and/or on NVMe, a
 * learning-rate schedule, evaluation on held-out data, checkpoints, a
 * metrics log and its picture, a plan from memplan; on several ranks under
 * mpirun (ZeRO stages 0-3). See --help. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/model_config.h" /* defines: zo_model_config_load, zo_model_preset_find */
#include "common/units.h"        /* defines: zo_parse_size, zo_parse_int, zo_format_bytes */
#include "examples/finetune.h"   /* defines: ft_lr_at, ft_log_write, ft_plot_write */
#include "gpu/comm.h"             /* defines: comm_init, comm_launch_detect, comm_abort */
#include "gpu/device.h"           /* defines: gpu_device_open, gpu_cuda_device_count */
#include "offload/offload.h"     /* defines: offload_init, offload_micro_batch, offload_step */
#include "model/corpus.h"        /* defines: model_corpus_read, model_corpus_tokenize */
#include "model/data.h"          /* defines: model_tokens, model_batch_get */
#include "model/lora.h"          /* defines: model_lora_save, model_lora_load, model_lora_read_config */
#include "model/safetensors.h"   /* defines: model_load_path, model_save */
#include "transformer/offload_model.h" /* defines: tf_offload_model */

typedef struct train_args {
    const char *model, *weights, *data, *save, *device;
    const char *plan, *ckpt, *resume, *stats_json;
    const char *tokenizer, *eot, *eval_data, *log, *plot;
    model_token_width width;
    int set_width;       /* --tokens-u32 or --text given */
    model_packing packing;
    int set_packing, set_eval_batches;
    long steps, micro_batch, seq, seed, threads, save_every;
    long eval_every, eval_batches, schedule_steps;
    ft_schedule sched;   /* its lr: the AdamW lr (--lr) */
    zo_lora_config lora; /* r 0: full fine-tuning */
    int qlora;
    const char *adapter; /* PEFT adapter directory to start from */
    offload_plan p;      /* the runtime's configuration: the plan, then the flags */
    zo_dtype dtype;
    uint64_t device_mem;
    double comm_timeout; /* seconds; 0: ZO_COMM_TIMEOUT or the communicator's default */
    int set_dtype, set_mb, set_seq, set_devmem; /* given as flags (they beat the plan) */
    int check_plan;      /* --check-plan: check the plan against the model, run nothing */
} train_args;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: train --model CONFIG|PRESET --data FILE [options]\n"
        "\n"
        "Train or fine-tune a GPT-2 or LLaMA-family transformer on a token file, or on\n"
        "text through the model's tokenizer.json (docs/finetune.md). Batches are\n"
        "sequential: at step k, row i starts at token ((k*B + i) * S) mod (N - S - 1)\n"
        "(padded rows: row i is record (k*B + i) mod R).\n"
        "\n"
        "model and data:\n"
        "  --model CONFIG|PRESET  a Hugging Face config.json, or a preset name (gpt2, llama-2-7b, ...)\n"
        "  --weights FILE         safetensors checkpoint (file, index.json or directory);\n"
        "                         default: GPT-2-style random init from --seed\n"
        "  --data FILE            token file: raw little-endian uint16 ids (nanoGPT style; the side\n"
        "                         file FILE.json that tokenize writes says uint16 or uint32);\n"
        "                         with --tokenizer, text (a .jsonl file: {\"text\": ...} documents or\n"
        "                         {\"prompt\": ..., \"completion\": ...} pairs, the loss counted on\n"
        "                         completions only; any other file: one document)\n"
        "  --tokenizer FILE       the model's tokenizer.json: tokenize --data (and --eval-data) now,\n"
        "                         as the tokenize program does\n"
        "  --eot TOKEN|none       end-of-text token after each document (default: the tokenizer's)\n"
        "  --packing stream|pad   stream: records one after another, cut into windows of --seq;\n"
        "                         pad: one record per row, cut to --seq and padded (no loss on the\n"
        "                         padding). Default: pad for prompt/completion pairs, else stream\n"
        "  --tokens-u32           the token file holds uint32 ids (no side file)\n"
        "  --text                 the data file is plain text: one token per byte (vocab >= 256)\n"
        "\n"
        "training:\n"
        "  --steps N              optimizer steps (default 100)\n"
        "  --micro-batch B        sequences per step (default 4)\n"
        "  --seq S                tokens per sequence (default 64)\n"
        "  --lr X                 peak learning rate (default 3e-4)\n"
        "  --lr-schedule KIND     constant, cosine or linear (default constant): after --warmup\n"
        "                         steps of linear warmup, decay to --min-lr over the schedule\n"
        "  --warmup N             warmup steps: step k < N runs at lr * (k+1)/N (default 0)\n"
        "  --min-lr X             the floor cosine and linear decay to (default 0)\n"
        "  --schedule-steps N     the steps the schedule spans (default --steps): a run may stop\n"
        "                         earlier and be resumed on the same schedule\n"
        "  --beta1 X --beta2 X    AdamW betas (default 0.9, 0.95)\n"
        "  --eps X                AdamW epsilon (default 1e-8)\n"
        "  --weight-decay X       decoupled weight decay on 2-D weights (default 0.1)\n"
        "  --clip X               max gradient norm; 0 disables (default 1.0)\n"
        "  --dtype fp32|fp16|bf16 device storage of weights, gradients, activations (default fp32)\n"
        "  --grad-accum K         micro-batches per optimizer step (default 1)\n"
        "  --seed N               random init seed (default 1337)\n"
        "  --max-skipped-steps N  fp16: steps skipped for overflow in a row before the run\n"
        "                         stops with an error (default 50); gradients that are not\n"
        "                         finite with no loss scale to lower (fp32, bf16, fp16 at\n"
        "                         scale 1) stop it at once, naming the block\n"
        "\n"
        "fine-tuning method (default: full fine-tuning of every weight):\n"
        "  --lora R               train LoRA adapters of rank R over a frozen base: the base's\n"
        "                         weights get no gradients and no optimizer state\n"
        "  --lora-targets LIST    linear layers with adapters: q,k,v,o,gate,up,down (any of them)\n"
        "                         or all-linear (default q,v; GPT-2: q, k or v adapt c_attn)\n"
        "  --lora-alpha A         the adapters' update is scaled by A / R (default 8, PEFT's)\n"
        "  --qlora                the base's linear weights in NF4 with double quantization\n"
        "  --adapter DIR          start from a PEFT adapter directory (adapter_config.json and\n"
        "                         adapter_model.safetensors; its r, alpha and targets are used)\n"
        "  --adapters-on gpu|cpu|nvme  where the adapters live (default gpu; --params-on places\n"
        "                         the frozen base)\n"
        "\n"
        "placement (a plan, then these flags; see docs/offload.md):\n"
        "  --plan FILE            a plan memplan wrote (plan --json-out FILE, estimate --plan-out\n"
        "                         FILE): placement, buffers, batch, dtype; its model and its\n"
        "                         ranks (dp x tp x pp) must be this run's\n"
        "  --check-plan           with --plan: check the plan against --model (default: the\n"
        "                         plan's model), print the placement and the plan's predicted\n"
        "                         peaks per tier, and exit (0: they agree) without opening a\n"
        "                         device, reading --data or allocating the model\n"
        "  --params-on gpu|cpu|nvme     16-bit weights: resident, or streamed from pinned host / NVMe\n"
        "  --optimizer-on SPEC    fp32 master + Adam moments: cpu, nvme, gpu, or fractions\n"
        "                         cpu=0.5,nvme=0.3,gpu=0.2 (the gpu share: whole blocks, its\n"
        "                         gradients summed and updated on the device)\n"
        "  --checkpoints-on gpu|cpu     activation checkpoints between blocks (cpu needs --recompute full)\n"
        "  --recompute none|selective|full  recompute each block's activations in backward\n"
        "                         (default none; selective runs as none: the attention keeps\n"
        "                         no s x s scores, so there is nothing selective to recompute)\n"
        "  --prefetch N           blocks loaded ahead of the one computing (default 2)\n"
        "  --sub-group N          optimizer sub-group, parameters (default 1M)\n"
        "  --nvme-dir DIR         where NVMe state lives\n"
        "\n"
        "device:\n"
        "  --device NAME          cpu, cuda or cuda:N (default cpu; cuda needs a build with CUDA\n"
        "                         and a GPU; on several ranks, cuda is the GPU of the rank's\n"
        "                         local rank: OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID)\n"
        "  --device-mem SIZE      device memory capacity, e.g. 512MiB, 2GB, on either backend\n"
        "                         (default: the plan's hardware.gpu_mem, else unlimited on cpu\n"
        "                         and the free memory on cuda)\n"
        "  --threads N            threads per op on cpu, and of the CPU Adam (default: all)\n"
        "\n"
        "optimizer schedule (docs/offload.md, \"Schedules\"):\n"
        "  --schedule KIND        serial: the update after the micro-batches (default); overlap:\n"
        "                         on a thread of its own beside the device's work (with exact\n"
        "                         clipping after the norm, beside the next forward: the serial\n"
        "                         results bit for bit); dpu: step t's update during step t+1,\n"
        "                         which uses the weights of step t-1\n"
        "  --clip-stale           overlap: clip with the previous step's norm, so each block's\n"
        "                         update starts as soon as its gradients are complete\n"
        "  --dpu-warmup N         dpu: serial steps first (default 0)\n"
        "  --opt-threads N        the optimizer's threads with overlap or dpu (default --threads)\n"
        "\n"
        "several ranks (under mpirun -np N, or a launcher setting OMPI_COMM_WORLD_* or PMI_*):\n"
        "  --zero 0|1|2|3         ZeRO stage (default: the plan's, else 0): 0 replicate, 1 partition\n"
        "                         the optimizer state, 2 also the gradients, 3 also the weights\n"
        "  --comm-timeout S       a collective not done in S seconds ends every rank (default 300)\n"
        "  Rank r of N reads micro-batches (k N + r) K + j of step k: the global batch of one\n"
        "  rank with --grad-accum N K. Rank 0 prints; the others print only errors.\n"
        "\n"
        "evaluation:\n"
        "  --eval-data FILE       held-out data, read as --data is; prints the loss and perplexity\n"
        "                         (forward only, through the same runtime)\n"
        "  --eval-every N         evaluate every N steps (default: after the last step only)\n"
        "  --eval-batches K       batches per evaluation, the same K each time (default 10)\n"
        "\n"
        "checkpoints and output:\n"
        "  --ckpt DIR             save a checkpoint (weights, optimizer state, counters) into DIR;\n"
        "                         DIR is locked for the run (a second run on it is refused);\n"
        "                         several ranks: a directory they share, each rank writing its\n"
        "                         shard of the optimizer state\n"
        "  --save-every N         every N steps (default: only at the end)\n"
        "  --keep-checkpoints K   checkpoints kept in DIR: the latest and the K-1 others with the\n"
        "                         highest step numbers (default 1: the latest only); only\n"
        "                         folders named step-N or step-N.K are ever removed\n"
        "  --resume DIR           continue from DIR's latest checkpoint (every file's checksum\n"
        "                         verified first; saved on any number of ranks whose global\n"
        "                         batch is this run's)\n"
        "  --stats-json FILE      peak bytes per tier (and the plan's prediction) and the time split\n"
        "                         (several ranks: rank r > 0 writes FILE.rank<r>)\n"
        "  --save FILE            write the trained weights as safetensors (Hugging Face names);\n"
        "                         with LoRA, a PEFT adapter directory FILE (Hugging Face PEFT\n"
        "                         loads it onto the base)\n"
        "  --log FILE             one JSON object per step: step, loss, lr, grad_norm, tokens_per_s,\n"
        "                         peak_bytes per tier, eval_loss and eval_ppl when evaluated\n"
        "                         (appended to with --resume)\n"
        "  --plot FILE            at the end, an SVG of loss, eval loss and lr against steps (the\n"
        "                         whole --log when given; plot LOG --out FILE draws one any time)\n"
        "  -h, --help             this text\n"
        "\n"
        "Prints one line per step: step K loss X lr Y norm G tok/s R mem M (loss: the mean over\n"
        "the global batch; tok/s: every rank's tokens), and eval step K loss X ppl P when\n"
        "evaluating.\n"
        "\n"
        "Input files (--model, --data, --eval-data, --tokenizer, --weights and its shards,\n"
        "--adapter's files, --plan) must be regular files: a FIFO or a device is refused,\n"
        "naming it. SIGINT, SIGTERM or SIGHUP stop the run after the current micro-batch, its\n"
        "NVMe swap files removed; swap files a killed run left behind in --nvme-dir are removed\n"
        "by the next run there.\n"
        "\n"
        "exit status: 0 trained (--check-plan: the plan is this model's); 1 failed at run time\n"
        "(out of memory or a tier's capacity, a device or disk error, gradients not finite,\n"
        "the checkpoint folder in use by another run); 2 bad input (flags, config, tokenizer,\n"
        "data, weights, adapters, plan, or a checkpoint that is damaged or of another model);\n"
        "a signal that stopped it ends it the same way.\n");
}

enum {
    OPT_MODEL = 256, OPT_CHECK_PLAN, OPT_WEIGHTS, OPT_DATA, OPT_U32, OPT_TEXT, OPT_STEPS, OPT_MB, OPT_SEQ,
    OPT_LR, OPT_B1, OPT_B2, OPT_EPS, OPT_WD, OPT_CLIP, OPT_DTYPE, OPT_SEED, OPT_DEVICE,
    OPT_DEVMEM, OPT_THREADS, OPT_SAVE, OPT_ACCUM, OPT_PLAN, OPT_PARAMS_ON, OPT_OPT_ON,
    OPT_CKPT_ON, OPT_RECOMPUTE, OPT_PREFETCH, OPT_SUBGROUP, OPT_NVME_DIR, OPT_CKPT, OPT_SAVE_EVERY,
    OPT_RESUME, OPT_STATS, OPT_TOKENIZER, OPT_EOT, OPT_PACKING, OPT_EVAL_DATA, OPT_EVAL_EVERY,
    OPT_EVAL_BATCHES, OPT_SCHEDULE, OPT_WARMUP, OPT_MIN_LR, OPT_SCHEDULE_STEPS, OPT_LOG, OPT_PLOT,
    OPT_LORA, OPT_LORA_TARGETS, OPT_LORA_ALPHA, OPT_QLORA, OPT_ADAPTER, OPT_ADAPTERS_ON,
    OPT_SCHED, OPT_CLIP_STALE, OPT_DPU_WARMUP, OPT_OPT_THREADS, OPT_KEEP_CKPT,
    OPT_MAX_SKIPPED, OPT_ZERO, OPT_COMM_TIMEOUT,
};

static const struct option long_opts[] = {
    {"model", required_argument, 0, OPT_MODEL},
    {"weights", required_argument, 0, OPT_WEIGHTS},
    {"data", required_argument, 0, OPT_DATA},
    {"tokens-u32", no_argument, 0, OPT_U32},
    {"text", no_argument, 0, OPT_TEXT},
    {"steps", required_argument, 0, OPT_STEPS},
    {"micro-batch", required_argument, 0, OPT_MB},
    {"seq", required_argument, 0, OPT_SEQ},
    {"lr", required_argument, 0, OPT_LR},
    {"beta1", required_argument, 0, OPT_B1},
    {"beta2", required_argument, 0, OPT_B2},
    {"eps", required_argument, 0, OPT_EPS},
    {"weight-decay", required_argument, 0, OPT_WD},
    {"clip", required_argument, 0, OPT_CLIP},
    {"dtype", required_argument, 0, OPT_DTYPE},
    {"seed", required_argument, 0, OPT_SEED},
    {"device", required_argument, 0, OPT_DEVICE},
    {"device-mem", required_argument, 0, OPT_DEVMEM},
    {"threads", required_argument, 0, OPT_THREADS},
    {"save", required_argument, 0, OPT_SAVE},
    {"grad-accum", required_argument, 0, OPT_ACCUM},
    {"plan", required_argument, 0, OPT_PLAN},
    {"check-plan", no_argument, 0, OPT_CHECK_PLAN},
    {"params-on", required_argument, 0, OPT_PARAMS_ON},
    {"optimizer-on", required_argument, 0, OPT_OPT_ON},
    {"checkpoints-on", required_argument, 0, OPT_CKPT_ON},
    {"recompute", required_argument, 0, OPT_RECOMPUTE},
    {"prefetch", required_argument, 0, OPT_PREFETCH},
    {"sub-group", required_argument, 0, OPT_SUBGROUP},
    {"nvme-dir", required_argument, 0, OPT_NVME_DIR},
    {"ckpt", required_argument, 0, OPT_CKPT},
    {"save-every", required_argument, 0, OPT_SAVE_EVERY},
    {"resume", required_argument, 0, OPT_RESUME},
    {"stats-json", required_argument, 0, OPT_STATS},
    {"zero", required_argument, 0, OPT_ZERO},
    {"comm-timeout", required_argument, 0, OPT_COMM_TIMEOUT},
    {"keep-checkpoints", required_argument, 0, OPT_KEEP_CKPT},
    {"max-skipped-steps", required_argument, 0, OPT_MAX_SKIPPED},
    {"tokenizer", required_argument, 0, OPT_TOKENIZER},
    {"eot", required_argument, 0, OPT_EOT},
    {"packing", required_argument, 0, OPT_PACKING},
    {"eval-data", required_argument, 0, OPT_EVAL_DATA},
    {"eval-every", required_argument, 0, OPT_EVAL_EVERY},
    {"eval-batches", required_argument, 0, OPT_EVAL_BATCHES},
    {"lr-schedule", required_argument, 0, OPT_SCHEDULE},
    {"warmup", required_argument, 0, OPT_WARMUP},
    {"min-lr", required_argument, 0, OPT_MIN_LR},
    {"schedule-steps", required_argument, 0, OPT_SCHEDULE_STEPS},
    {"log", required_argument, 0, OPT_LOG},
    {"plot", required_argument, 0, OPT_PLOT},
    {"lora", required_argument, 0, OPT_LORA},
    {"lora-targets", required_argument, 0, OPT_LORA_TARGETS},
    {"lora-alpha", required_argument, 0, OPT_LORA_ALPHA},
    {"qlora", no_argument, 0, OPT_QLORA},
    {"adapter", required_argument, 0, OPT_ADAPTER},
    {"adapters-on", required_argument, 0, OPT_ADAPTERS_ON},
    {"schedule", required_argument, 0, OPT_SCHED},
    {"clip-stale", no_argument, 0, OPT_CLIP_STALE},
    {"dpu-warmup", required_argument, 0, OPT_DPU_WARMUP},
    {"opt-threads", required_argument, 0, OPT_OPT_THREADS},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};


static zo_status parse_float(const char *s, const char *flag, double lo, double hi, float *out)
{
    double v;
    zo_status st = zo_parse_double(s, flag, lo, hi, &v);
    if (st == ZO_OK) *out = (float)v;
    return st;
}

/* --optimizer-on: "cpu", "nvme", "gpu" or fractions "cpu=0.7,nvme=0.3". */
static zo_status parse_opt_on(const char *s, offload_config *c)
{
    double f[OFFLOAD_TIERS] = {0};
    offload_tier t;
    if (!strchr(s, '=')) {
        if (offload_tier_parse(s, "--optimizer-on", &t) != ZO_OK) return ZO_ERR_INVALID;
        f[t] = 1.0;
    } else {
        char buf[128];
        snprintf(buf, sizeof buf, "%s", s);
        for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(tok, '=');
            if (!eq) return zo_error(ZO_ERR_INVALID, "--optimizer-on: '%s' is not TIER=FRACTION", tok);
            *eq = 0;
            double v;
            if (offload_tier_parse(tok, "--optimizer-on", &t) != ZO_OK ||
                zo_parse_double(eq + 1, "--optimizer-on", 0.0, 1.0, &v) != ZO_OK)
                return ZO_ERR_INVALID;
            f[t] = v;
        }
    }
    memcpy(c->opt_frac, f, sizeof f);
    return ZO_OK;
}

/* 0: parsed; 1: --help printed; 2: usage error (message printed). */
static int parse_args(int argc, char **argv, train_args *a)
{
    *a = (train_args){.width = MODEL_TOKENS_U16, .steps = 100, .micro_batch = 4, .seq = 64,
                      .seed = 1337, .dtype = ZO_DTYPE_F32, .device = "cpu", .eval_batches = 10,
                      .sched = {.lr = 3e-4}, .lora = {.alpha = 8.0f}};
    offload_plan_defaults(&a->p);
    offload_config *oc = &a->p.cfg;
    oc->adam = (offload_adamw){.lr = (float)a->sched.lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                               .weight_decay = 0.1f, .clip = 1.0f};
    /* the plan first, so that every flag overrides it: a first pass of
     * getopt_long finds it in every spelling (--plan F, --plan=F, --pla F) */
    int c;
    opterr = 0;
    optind = 0; /* glibc: a full re-initialization */
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        if (c != OPT_PLAN) continue;
        a->plan = optarg;
        if (offload_plan_load(a->plan, &a->p) != ZO_OK) {
            fprintf(stderr, "train: --plan %s\n", zo_last_error());
            return 2;
        }
        if (a->p.seq) a->seq = a->p.seq;
        if (a->p.micro_batch) a->micro_batch = a->p.micro_batch;
        if (a->p.dtype >= 0) a->dtype = (zo_dtype)a->p.dtype;
        if (a->p.gpu_mem) a->device_mem = a->p.gpu_mem;
    }
    long v;
    zo_status st = ZO_OK;
    opterr = 0;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        switch (c) {
        case OPT_PLAN: break; /* read above */
        case OPT_CHECK_PLAN: a->check_plan = 1; break;
        case OPT_ACCUM:
            st = zo_parse_int(optarg, "--grad-accum", 1, 1 << 20, &v);
            oc->grad_accum = (int)v;
            break;
        case OPT_PARAMS_ON: st = offload_tier_parse(optarg, "--params-on", &oc->params_on); break;
        case OPT_OPT_ON: st = parse_opt_on(optarg, oc); break;
        case OPT_CKPT_ON: st = offload_tier_parse(optarg, "--checkpoints-on", &oc->checkpoints_on); break;
        case OPT_RECOMPUTE:
            if (!strcmp(optarg, "none") || !strcmp(optarg, "full")) oc->recompute = !strcmp(optarg, "full");
            else if (!strcmp(optarg, "selective")) oc->recompute = 0, a->p.selective_as_none = 1;
            else st = zo_error(ZO_ERR_INVALID, "--recompute %s: none, selective (runs as none) or full", optarg);
            break;
        case OPT_PREFETCH:
            st = zo_parse_int(optarg, "--prefetch", 0, 16, &v);
            oc->prefetch_depth = (int)v;
            break;
        case OPT_SUBGROUP: {
            uint64_t n;
            st = zo_parse_count(optarg, "--sub-group", &n);
            if (st == ZO_OK && !n) st = zo_error(ZO_ERR_INVALID, "--sub-group must be positive");
            oc->sub_group = (size_t)n;
            break;
        }
        case OPT_NVME_DIR: oc->nvme_dir = optarg; break;
        case OPT_LORA:
            st = zo_parse_int(optarg, "--lora", 1, 1 << 16, &v);
            a->lora.r = (int)v;
            break;
        case OPT_LORA_TARGETS: st = zo_lora_targets_parse(optarg, &a->lora.targets); break;
        case OPT_LORA_ALPHA: st = parse_float(optarg, "--lora-alpha", 1e-6, 1e6, &a->lora.alpha); break;
        case OPT_QLORA: a->qlora = 1; break;
        case OPT_ADAPTER: a->adapter = optarg; break;
        case OPT_ADAPTERS_ON: st = offload_tier_parse(optarg, "--adapters-on", &oc->trainable_on); break;
        case OPT_SCHED: st = offload_schedule_parse(optarg, "--schedule", &oc->schedule); break;
        case OPT_CLIP_STALE: oc->clip_stale = 1; break;
        case OPT_DPU_WARMUP:
            st = zo_parse_int(optarg, "--dpu-warmup", 0, 1 << 30, &v);
            oc->dpu_warmup = (int)v;
            break;
        case OPT_OPT_THREADS:
            st = zo_parse_int(optarg, "--opt-threads", 1, 4096, &v);
            oc->opt_threads = (int)v;
            break;
        case OPT_CKPT: a->ckpt = optarg; break;
        case OPT_SAVE_EVERY: st = zo_parse_int(optarg, "--save-every", 1, 1L << 40, &a->save_every); break;
        case OPT_RESUME: a->resume = optarg; break;
        case OPT_KEEP_CKPT:
            st = zo_parse_int(optarg, "--keep-checkpoints", 1, 1 << 20, &v);
            oc->keep_checkpoints = (int)v;
            break;
        case OPT_MAX_SKIPPED:
            st = zo_parse_int(optarg, "--max-skipped-steps", 1, 1 << 20, &v);
            oc->max_skipped_steps = (int)v;
            break;
        case OPT_STATS: a->stats_json = optarg; break;
        case OPT_ZERO:
            st = zo_parse_int(optarg, "--zero", 0, 3, &v);
            oc->zero_stage = (int)v;
            break;
        case OPT_COMM_TIMEOUT: st = zo_parse_double(optarg, "--comm-timeout", 0.001, 1e7, &a->comm_timeout); break;
        case OPT_MODEL: a->model = optarg; break;
        case OPT_WEIGHTS: a->weights = optarg; break;
        case OPT_DATA: a->data = optarg; break;
        case OPT_U32: a->width = MODEL_TOKENS_U32, a->set_width = 1; break;
        case OPT_TEXT: a->width = MODEL_TOKENS_BYTES, a->set_width = 1; break;
        case OPT_TOKENIZER: a->tokenizer = optarg; break;
        case OPT_EOT: a->eot = optarg; break;
        case OPT_PACKING:
            a->set_packing = 1;
            if (!strcmp(optarg, "stream")) a->packing = MODEL_PACK_STREAM;
            else if (!strcmp(optarg, "pad")) a->packing = MODEL_PACK_PAD;
            else st = zo_error(ZO_ERR_INVALID, "--packing %s: stream or pad", optarg);
            break;
        case OPT_EVAL_DATA: a->eval_data = optarg; break;
        case OPT_EVAL_EVERY: st = zo_parse_int(optarg, "--eval-every", 1, 1L << 40, &a->eval_every); break;
        case OPT_EVAL_BATCHES:
            st = zo_parse_int(optarg, "--eval-batches", 1, 1L << 30, &a->eval_batches);
            a->set_eval_batches = 1;
            break;
        case OPT_SCHEDULE: st = ft_schedule_parse(optarg, "--lr-schedule", &a->sched.kind); break;
        case OPT_WARMUP: st = zo_parse_int(optarg, "--warmup", 0, 1L << 40, &a->sched.warmup); break;
        case OPT_MIN_LR: st = zo_parse_double(optarg, "--min-lr", 0.0, 10.0, &a->sched.min_lr); break;
        case OPT_SCHEDULE_STEPS:
            st = zo_parse_int(optarg, "--schedule-steps", 1, 1L << 40, &a->schedule_steps);
            break;
        case OPT_LOG: a->log = optarg; break;
        case OPT_PLOT: a->plot = optarg; break;
        case OPT_STEPS: st = zo_parse_int(optarg, "--steps", 1, 1L << 40, &a->steps); break;
        case OPT_MB: st = zo_parse_int(optarg, "--micro-batch", 1, 1 << 20, &a->micro_batch); break;
        case OPT_SEQ: st = zo_parse_int(optarg, "--seq", 1, 1 << 24, &a->seq); break;
        case OPT_LR: /* the schedule's peak (double: the closed form); the runtime's (float) */
            st = zo_parse_double(optarg, "--lr", 0.0, 10.0, &a->sched.lr);
            oc->adam.lr = (float)a->sched.lr;
            break;
        case OPT_B1: st = parse_float(optarg, "--beta1", 0.0, 0.999999, &oc->adam.beta1); break;
        case OPT_B2: st = parse_float(optarg, "--beta2", 0.0, 0.999999, &oc->adam.beta2); break;
        case OPT_EPS: st = parse_float(optarg, "--eps", 0.0, 1.0, &oc->adam.eps); break;
        case OPT_WD: st = parse_float(optarg, "--weight-decay", 0.0, 10.0, &oc->adam.weight_decay); break;
        case OPT_CLIP: st = parse_float(optarg, "--clip", 0.0, 1e9, &oc->adam.clip); break;
        case OPT_DTYPE:
            st = zo_dtype_parse(optarg, &a->dtype);
            if (st != ZO_OK) st = zo_error_wrap(st, "--dtype");
            break;
        case OPT_SEED: st = zo_parse_int(optarg, "--seed", 0, 0x7fffffffL, &a->seed); break;
        case OPT_DEVICE: /* the name here; whether it exists when opened in main */
            a->device = optarg;
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda") && strncmp(optarg, "cuda:", 5))
                st = zo_error(ZO_ERR_INVALID, "--device %s: expected cpu, cuda or cuda:N", optarg);
            break;
        case OPT_DEVMEM: st = zo_parse_size(optarg, "--device-mem", 0, &a->device_mem); break;
        case OPT_THREADS: st = zo_parse_int(optarg, "--threads", 1, 1024, &a->threads); break;
        case OPT_SAVE: a->save = optarg; break;
        case 'h': usage(stdout); return 1;
        case '?':
        default:
            if (optopt && optopt < 256)
                fprintf(stderr, "train: unknown option -%c\n", optopt);
            else if (optopt)
                fprintf(stderr, "train: option %s needs a value\n", argv[optind - 1]);
            else
                fprintf(stderr, "train: unknown option %s\n", argv[optind - 1]);
            fprintf(stderr, "run 'train --help' for the options\n");
            return 2;
        }
        if (st != ZO_OK) {
            fprintf(stderr, "train: %s\n", zo_last_error());
            return 2;
        }
    }
    if ((a->save_every || oc->keep_checkpoints) && !a->ckpt) {
        fprintf(stderr, "train: %s needs --ckpt DIR (where the checkpoints go)\n",
                a->save_every ? "--save-every" : "--keep-checkpoints");
        return 2;
    }
    oc->ckpt_dir = a->ckpt; /* locked from the start of the run */
    const char *bad = NULL;
    if (a->tokenizer && a->width == MODEL_TOKENS_BYTES) bad = "--text reads bytes as tokens: leave it out with --tokenizer";
    else if ((a->eval_every || a->set_eval_batches) && !a->eval_data) bad = "--eval-every and --eval-batches need --eval-data FILE";
    else if ((a->eot || a->set_packing) && !a->tokenizer) bad = "--eot and --packing need --tokenizer (they shape text as it is tokenized)";
    else if (a->sched.min_lr > a->sched.lr) bad = "--min-lr is above --lr";
    else if (!a->lora.r && !a->adapter && (a->qlora || a->lora.targets))
        bad = "--qlora and --lora-targets need --lora R (or --adapter DIR)";
    if (bad) {
        fprintf(stderr, "train: %s\n", bad);
        return 2;
    }
    a->sched.steps = a->schedule_steps ? a->schedule_steps : a->steps;
    oc->n_threads = (int)a->threads;
    if (!a->model && a->plan && a->p.model_name[0]) a->model = a->p.model_name;
    if (optind < argc) {
        fprintf(stderr, "train: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return 0;
}

/* A path to an existing file is a config.json, anything else a preset. */
static zo_status load_config(const char *arg, zo_model_config *cfg)
{
    struct stat sb;
    if (stat(arg, &sb) == 0) return zo_model_config_load(arg, cfg);
    if (strchr(arg, '/') || strstr(arg, ".json"))
        return zo_error(ZO_ERR_NOT_FOUND, "--model %s: %s", arg, strerror(errno));
    zo_status st = zo_model_preset_find(arg, cfg);
    if (st != ZO_OK) return zo_error_wrap(st, "--model");
    return ZO_OK;
}

/* ---- checkpoints --------------------------------------------------------------- */

static zo_status write_weights(void *user, const char *path, offload_block_reader read, void *ctx)
{
    const model_layout *l = user;
    return model_save_streamed(path, l, read, ctx, ZO_DTYPE_F32);
}

/* ---- weights block by block ------------------------------------------------------ */

static zo_status set_block(void *ctx, int block, const void *buf)
{
    return offload_set_block(ctx, block, buf);
}

/* The initial weights, one block at a time: from a safetensors checkpoint
 * (every tensor of the model in it) or random from the seed. Host memory
 * holds one block, whatever the model's size. */
static zo_status initial_weights(offload_t *rt, const model_layout *l, const char *weights,
                                 uint64_t seed)
{
    size_t largest = 1;
    for (int b = 0; b < l->n_blocks; b++)
        if (l->block_numel[b] > largest) largest = l->block_numel[b];
    float *buf = malloc(largest * sizeof(float));
    if (!buf) return zo_error(ZO_ERR_NOMEM, "train: out of host memory for a block of %zu weights", largest);
    zo_status st = ZO_OK;
    if (weights) {
        model_ckpt c;
        if ((st = model_ckpt_open(&c, weights)) == ZO_OK) {
            st = model_load_streamed(&c, l, buf, ZO_DTYPE_F32, 0, NULL, set_block, rt);
            model_ckpt_close(&c);
        }
    } else {
        uint64_t rng = tf_init_rng(seed);
        for (int b = 0; b < l->n_blocks && st == ZO_OK; b++) {
            tf_init_block_weights(l, b, buf, &rng);
            st = offload_set_block(rt, b, buf);
        }
    }
    free(buf);
    return st;
}

/* ---- LoRA ---------------------------------------------------------------------------- */

/* The LoRA choice: the flags, or the adapter directory's config (which a
 * flag given as well must agree with); q,v by default. */
static zo_status lora_choice(train_args *a, const zo_model_config *cfg)
{
    /* a plan for LoRA or QLoRA, unless the flags choose */
    const zo_plan_training *pt = &a->p.file.training;
    if (a->plan && pt->method != ZO_PLAN_FULL && !a->lora.r && !a->adapter) {
        a->lora = pt->lora;
        a->qlora = pt->method == ZO_PLAN_QLORA;
    }
    if (a->adapter) {
        zo_lora_config lc;
        zo_status st = model_lora_read_config(a->adapter, cfg, &lc, NULL, 0);
        if (st != ZO_OK) return st;
        if ((a->lora.r && a->lora.r != lc.r) || (a->lora.targets && a->lora.targets != lc.targets))
            return zo_error(ZO_ERR_INVALID, "--adapter %s has r %d on other targets than --lora/--lora-targets say",
                            a->adapter, lc.r);
        a->lora = lc;
    }
    if (!a->lora.r) return ZO_OK;
    if (!a->lora.targets) a->lora.targets = ZO_LORA_Q | ZO_LORA_V;
    return zo_lora_check(cfg, &a->lora);
}

static size_t frozen_total(const tf_model *m)
{
    size_t n = 0;
    for (int b = 0; b < m->layout.n_blocks; b++) n += tf_frozen_bytes(m, b);
    return n;
}

/* The frozen base of a block, packed (NF4 where QLoRA says) into its store. */
typedef struct base_sink {
    offload_t *rt;
    const tf_model *m;
    void *packed;
} base_sink;

static zo_status set_base_block(void *ctx, int block, const void *buf)
{
    base_sink *b = ctx;
    zo_status st = tf_frozen_pack(b->m, block, buf, b->packed);
    return st == ZO_OK ? offload_set_frozen_block(b->rt, block, b->packed) : st;
}

static zo_status lora_weights(offload_t *rt, tf_model *m, const train_args *a)
{
    const model_layout *l = &m->layout, *ad = &m->adapters;
    size_t largest = 1, fbig = 1, abig = 1;
    for (int b = 0; b < l->n_blocks; b++) {
        if (l->block_numel[b] > largest) largest = l->block_numel[b];
        if (tf_frozen_bytes(m, b) > fbig) fbig = tf_frozen_bytes(m, b);
        if (ad->block_numel[b] > abig) abig = ad->block_numel[b];
    }
    zo_status st = ZO_OK;
    float *buf = malloc(largest * sizeof(float));
    base_sink sink = {.rt = rt, .m = m, .packed = malloc(fbig)};
    void **ablocks = calloc((size_t)ad->n_blocks, sizeof *ablocks);
    if (!buf || !sink.packed || !ablocks) {
        st = zo_error(ZO_ERR_NOMEM, "train: out of host memory for a block of %zu weights", largest);
        goto out_free;
    }
    /* the base, block by block */
    if (a->weights) {
        model_ckpt c;
        if ((st = model_ckpt_open(&c, a->weights)) != ZO_OK) goto out_free;
        st = model_load_streamed(&c, l, buf, ZO_DTYPE_F32, 0, NULL, set_base_block, &sink);
        model_ckpt_close(&c);
    } else {
        uint64_t rng = tf_init_rng((uint64_t)a->seed);
        for (int b = 0; b < l->n_blocks && st == ZO_OK; b++) {
            tf_init_block_weights(l, b, buf, &rng);
            st = set_base_block(&sink, b, buf);
        }
    }
    if (st != ZO_OK) goto out_free;
    /* the adapters: small, every block at once */
    for (int b = 0; b < ad->n_blocks; b++)
        if (!(ablocks[b] = calloc(ad->block_numel[b] + 1, sizeof(float)))) {
            st = zo_error(ZO_ERR_NOMEM, "train: out of host memory for the adapters");
            goto out_free;
        }
    if (a->adapter) {
        st = model_lora_load(a->adapter, ad, ablocks, ZO_DTYPE_F32);
    } else {
        uint64_t rng = tf_init_rng((uint64_t)a->seed + 1);
        for (int b = 0; b < ad->n_blocks; b++) tf_init_lora_block(ad, b, ablocks[b], &rng);
    }
    for (int b = 0; b < ad->n_blocks && st == ZO_OK; b++) st = offload_set_block(rt, b, ablocks[b]);
out_free:
    for (int b = 0; ablocks && b < ad->n_blocks; b++) free(ablocks[b]);
    free(ablocks);
    free(sink.packed);
    free(buf);
    return st;
}

/* --save with LoRA: a PEFT adapter directory. */
static zo_status save_adapters(offload_t *rt, const tf_model *m, const train_args *a)
{
    const model_layout *ad = &m->adapters;
    zo_status st = ZO_OK;
    void **blocks = calloc((size_t)ad->n_blocks, sizeof *blocks);
    if (!blocks) return zo_error(ZO_ERR_NOMEM, "train: out of host memory for the adapters");
    for (int b = 0; b < ad->n_blocks && st == ZO_OK; b++) {
        if (!(blocks[b] = calloc(ad->block_numel[b] + 1, sizeof(float))))
            st = zo_error(ZO_ERR_NOMEM, "train: out of host memory for the adapters");
        else
            st = offload_get_block(rt, b, blocks[b]);
    }
    if (st == ZO_OK)
        st = model_lora_save(a->save, ad, &a->lora, a->model, (const void *const *)blocks, ZO_DTYPE_F32,
                             ZO_DTYPE_F32);
    for (int b = 0; b < ad->n_blocks; b++) free(blocks[b]);
    free(blocks);
    return st;
}

static volatile sig_atomic_t stop_signal; /* SIGINT, SIGTERM or SIGHUP came */

/* Test seam: ZO_TRAIN_CKPT_PAUSE="POINT:N:FD" makes the N-th checkpoint
 * write, at hook POINT ("begin", "optimizer-half", "before-rename",
 * "before-latest"), write one byte to FD and wait there for a signal (a test
 * kills the process mid-write, or stops it with SIGTERM: the write goes on
 * then, and the run ends as a stopped run does). */
static void pause_hook(void *user, const char *point)
{
    static int saves;
    const char *spec = user;
    if (!strcmp(point, "begin")) saves++;
    char want[64];
    int nth = 0, fd = -1;
    if (sscanf(spec, "%63[^:]:%d:%d", want, &nth, &fd) != 3 || strcmp(want, point) || nth != saves)
        return;
    /* the stop signals held until sigsuspend waits, so none is missed */
    sigset_t stop, old;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    sigprocmask(SIG_BLOCK, &stop, &old);
    if (write(fd, "k", 1) == 1)
        while (!stop_signal) sigsuspend(&old);
    sigprocmask(SIG_SETMASK, &old, NULL);
}

/* --device NAME with --device-mem as the capacity: the CPU backend with its
 * thread count, or gpu_device_open's "cuda"/"cuda:N". A CUDA name gets a
 * message saying what is missing: the backend in this build, or a GPU. */
static zo_status open_device(const char *name, size_t capacity, int threads, gpu_device_t *out)
{
    if (!strcmp(name, "cpu")) {
        gpu_cpu_options o = {.capacity = capacity, .n_threads = threads};
        return gpu_device_init_cpu(&o, out);
    }
    zo_status st = gpu_device_open(name, capacity, out);
    if (st == ZO_ERR_UNSUPPORTED) /* the message names what is missing: CUDA in the build, the
                                   * backend's module, a library it needs or the driver */
        return zo_error_wrap(st, "--device %s (or use --device cpu)", name);
    if (st == ZO_ERR_NOT_FOUND && !gpu_cuda_device_count())
        return zo_error_wrap(st, "--device %s: no CUDA GPU found on this machine (use --device cpu)",
                             name);
    if (st != ZO_OK) return zo_error_wrap(st, "--device %s", name);
    return ZO_OK;
}

/* ---- data and evaluation --------------------------------------------------------- */

/* --data or --eval-data: a token file (read as its side file says, when it
 * has one), or with a tokenizer, text tokenized now. Prints what it read. */
static zo_status open_data(const train_args *a, const char *path, const model_tokenizer *tok, int32_t eot,
                           int vocab, model_tokens *out)
{
    zo_status st;
    char b1[32];
    if (!tok) {
        model_tokens_info info;
        int found;
        model_token_width w = a->width;
        if ((st = model_tokens_info_read(path, &info, &found)) != ZO_OK) return st;
        if (found) {
            if (a->set_width && a->width != info.width)
                return zo_error(ZO_ERR_INVALID, "%s: %s.json says its tokens are uint%d: leave out %s", path, path,
                                (int)info.width * 8, a->width == MODEL_TOKENS_BYTES ? "--text" : "--tokens-u32");
            if (info.vocab > vocab)
                return zo_error(ZO_ERR_INVALID, "%s: made with a vocabulary of %d ids (%s), more than the "
                                "model's %d", path, info.vocab, info.tokenizer, vocab);
            w = info.width;
        }
        if ((st = model_tokens_open(out, path, w, vocab)) != ZO_OK) return st;
        if (found)
            printf("# data %s: %llu tokens, uint%d, %llu documents (tokenizer %s)\n", path,
                   (unsigned long long)out->n, (int)w * 8, (unsigned long long)info.documents, info.tokenizer);
        return ZO_OK;
    }
    model_corpus c;
    if ((st = model_corpus_read(path, &c)) != ZO_OK) return st;
    int pairs = c.kind == MODEL_CORPUS_PAIRS;
    model_corpus_options o = {.add_special = 1, .eot = eot, .n_threads = (int)a->threads,
                              .packing = a->set_packing ? a->packing : pairs ? MODEL_PACK_PAD : MODEL_PACK_STREAM};
    st = model_corpus_tokenize(&c, tok, &o, vocab, out);
    size_t records = c.n, bytes = 0;
    for (size_t i = 0; i < c.n; i++) bytes += c.len[i] + (pairs ? c.clen[i] : 0);
    model_corpus_free(&c);
    if (st != ZO_OK) return st;
    printf("# data %s: %zu %s, %s of text -> %llu tokens", path, records, pairs ? "prompt/completion pairs" : "documents",
           zo_format_bytes(bytes, b1, sizeof b1), (unsigned long long)out->n);
    if (out->mask) {
        uint64_t counted = 0;
        for (uint64_t i = 0; i < out->n; i++) counted += out->mask[i];
        printf(", %.1f%% of them completion targets", 100.0 * (double)counted / (double)out->n);
    }
    if (out->rows) {
        uint64_t cut = 0;
        for (uint64_t r = 0; r < out->n_rows; r++) cut += out->rows[r + 1] - out->rows[r] > (uint64_t)a->seq + 1;
        printf("; one record per row, %llu of them cut to --seq %ld", (unsigned long long)cut, a->seq);
    }
    printf("\n");
    return ZO_OK;
}

/* The mean loss over the counted targets of `batches` batches of the
 * held-out data (the same batches every time), forward only. On failure
 * *bad_data says whether the data was at fault (bad input) rather than the
 * run. */
static zo_status evaluate(const train_args *a, tf_model *m, offload_t *rt, gpu_stream_t s,
                          const model_tokens *ev, int32_t *inputs, int32_t *targets, double *loss,
                          uint64_t *counted, int *bad_data)
{
    double sum = 0;
    *counted = 0;
    for (long j = 0; j < a->eval_batches; j++) {
        float l;
        zo_status st = model_batch_get(ev, (int)a->micro_batch, (int)a->seq, j, 0, MODEL_SAMPLE_SEQUENTIAL,
                                       inputs, targets);
        *bad_data = st != ZO_OK;
        if (st == ZO_OK) st = tf_set_batch(m, s, inputs, targets, (int)a->micro_batch, (int)a->seq);
        if (st == ZO_OK) st = offload_forward(rt, s);
        if (st == ZO_OK) st = tf_loss(m, s, &l);
        if (st != ZO_OK) return zo_error_wrap(st, "evaluation batch %ld", j);
        sum += (double)l * m->n_targets;
        *counted += (uint64_t)m->n_targets;
    }
    *loss = *counted ? sum / (double)*counted : NAN;
    return ZO_OK;
}

/* Peak bytes per tier beside the plan's prediction (per rank). */
static void print_peaks(const char *who, const uint64_t *peak, const offload_prediction *pred)
{
    char b1[32], b2[32];
    printf("# %speak bytes per tier:", who);
    for (int t = 0; t < OFFLOAD_TIERS; t++) {
        printf(" %s %s", offload_tier_name((offload_tier)t), zo_format_bytes(peak[t], b1, sizeof b1));
        if (pred && pred->present && pred->peak[t])
            printf(" (plan %s, %.1f%%)", zo_format_bytes(pred->peak[t], b2, sizeof b2),
                   100.0 * (double)peak[t] / (double)pred->peak[t]);
        printf(t + 1 < OFFLOAD_TIERS ? "," : "\n");
    }
}

/* Every rank's peaks (gathered: a collective), rank 0 prints them; then
 * this rank's time split. */
static zo_status print_tiers(offload_t *rt, const offload_stats *st, const offload_prediction *pred,
                             uint64_t psi)
{
    if (st->ranks <= 1) {
        print_peaks("", st->peak, pred);
    } else {
        uint64_t *all = calloc((size_t)st->ranks * OFFLOAD_TIERS, sizeof *all);
        if (!all) return zo_error(ZO_ERR_NOMEM, "train: out of host memory");
        zo_status e = offload_gather(rt, st->peak, sizeof st->peak, all);
        for (int r = 0; r < st->ranks && e == ZO_OK; r++) {
            char who[32];
            snprintf(who, sizeof who, "rank %d of %d: ", r, st->ranks);
            print_peaks(who, all + (size_t)r * OFFLOAD_TIERS, pred);
        }
        free(all);
        if (e != ZO_OK) return e;
        printf("# communication: %.3f Psi per step (%llu elements in %lld collectives since the start)\n",
               st->steps ? (double)(st->comm_elems + st->comm_reused_elems) / (double)st->steps /
                               (double)psi : 0.0,
               (unsigned long long)st->comm_elems, (long long)st->comm_calls);
    }
    printf("# time:");
    for (int p = 0; p < OFFLOAD_TIME_PARTS; p++)
        printf(" %s %.3fs%s", offload_time_part_name((offload_time_part)p), st->time[p],
               p + 1 < OFFLOAD_TIME_PARTS ? "," : "");
    printf(" (runtime total %.3fs)\n", st->total_s);
    if (st->optimizer_s > 0)
        printf("# optimizer: %.3fs on the host, %.0f%% of it beside the device's work\n", st->optimizer_s,
               100.0 * st->optimizer_overlap);
    return ZO_OK;
}

/* "# placement: ..." of the run's configuration (the plan's, then the flags). */
static void print_placement(const train_args *a)
{
    const offload_config *oc = &a->p.cfg;
    printf("# placement: weights %s (prefetch %d), optimizer cpu %.2f nvme %.2f gpu %.2f, "
           "gradients %s, checkpoints %s, recompute %s%s%s\n",
           offload_tier_name(oc->params_on), oc->prefetch_depth, oc->opt_frac[OFFLOAD_CPU],
           oc->opt_frac[OFFLOAD_NVME], oc->opt_frac[OFFLOAD_DEVICE],
           oc->opt_frac[OFFLOAD_DEVICE] >= 1 ? "gpu" : oc->opt_frac[OFFLOAD_DEVICE] > 0 ? "gpu+cpu" : "cpu",
           offload_tier_name(oc->checkpoints_on),
           oc->recompute ? "full" : "none", a->plan ? "; plan " : "", a->plan ? a->plan : "");
}

/* ---- exit status and signals ------------------------------------------------------ */

/* What failed, for the exit status: reading the inputs (config, plan,
 * tokenizer, data and eval data, LoRA adapters, weights, a checkpoint to
 * resume, the --log path), setting up (device, model, runtime), or
 * training. */
typedef enum run_phase { PHASE_INPUT, PHASE_SETUP, PHASE_TRAIN } run_phase;

/* memplan's convention: 2 bad input, 1 failed at run time. */
static int exit_code(zo_status st, run_phase phase)
{
    switch (st) {
    case ZO_OK: return 0;
    case ZO_ERR_NOMEM:
    case ZO_ERR_CAPACITY:
    case ZO_ERR_DEVICE:
    case ZO_ERR_INTERNAL:
    case ZO_ERR_BUSY: return 1;
    case ZO_ERR_IO: return phase == PHASE_INPUT ? 2 : 1; /* an input that cannot be read */
    default: return phase == PHASE_TRAIN ? 1 : 2;
    }
}

static void on_stop_signal(int sig) { stop_signal = sig; }

/* SIGINT, SIGTERM and SIGHUP end the run at the next micro-batch, through
 * the normal exit path (swap files removed, locks released). */
static void catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART; /* I/O in flight completes */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* "# method: ..." of the run's configuration: what is trained (LoRA from the
 * plan, the flags or --adapter) and the optimizer's schedule. */
static void print_method(const train_args *a)
{
    const offload_config *oc = &a->p.cfg;
    char tg[128];
    printf("# method: %s", !a->lora.r ? "full" : a->qlora ? "qlora" : "lora");
    if (a->lora.r)
        printf(" (LoRA r %d alpha %g on %s, adapters on %s)", a->lora.r, a->lora.alpha,
               zo_lora_targets_str(a->lora.targets, tg, sizeof tg), offload_tier_name(oc->trainable_on));
    printf("; optimizer schedule %s", offload_schedule_name(oc->schedule));
    if (oc->schedule == OFFLOAD_SCHEDULE_DPU) printf(" (warm-up %d)", oc->dpu_warmup);
    if (oc->schedule == OFFLOAD_SCHEDULE_OVERLAP && oc->clip_stale) printf(" (clip stale)");
    printf("\n");
}

/* --check-plan: the plan against the model (its parameters and the run's one
 * rank, as a run checks them), the placement, method and schedule the run
 * would use and the plan's predictions; no device, no data, nothing of the
 * model allocated. Exit status: 0 they agree, 2 they do not or a file is bad
 * (1 only when the host runs out of memory reading them). */
static int check_plan(train_args *a)
{
    if (!a->plan || !a->model) {
        fprintf(stderr, "train: --check-plan needs --plan FILE%s\n", a->plan ? " and --model" : "");
        return 2;
    }
    zo_model_config cfg;
    zo_status st = load_config(a->model, &cfg);
    if (st != ZO_OK) {
        fprintf(stderr, "train: %s\n", zo_last_error());
        return exit_code(st, PHASE_INPUT);
    }
    if (zo_plan_check_run(&a->p.file, &cfg, 1, a->plan) != ZO_OK) {
        fprintf(stderr, "train: --plan %s\n", zo_last_error());
        return 2;
    }
    const offload_config *oc = &a->p.cfg;
    printf("# check-plan: %s (%s), %llu parameters, %d layers, hidden %d, vocab %d; dtype %s; "
           "batch %ld x %ld x %d: the plan is for this model and one rank\n",
           cfg.name, zo_arch_name(cfg.arch), (unsigned long long)zo_model_params(&cfg), cfg.n_layers,
           cfg.hidden, cfg.vocab, zo_dtype_name(a->dtype), a->micro_batch, a->seq,
           oc->grad_accum ? oc->grad_accum : 1);
    if (lora_choice(a, &cfg) != ZO_OK) {
        fprintf(stderr, "train: --plan %s: %s\n", a->plan, zo_last_error());
        return 2;
    }
    print_placement(a);
    print_method(a);
    const offload_prediction *pr = &a->p.predicted;
    if (!pr->present) {
        printf("# plan predicts: nothing (the plan has no \"predicted\" member)\n");
        return 0;
    }
    char b[32];
    printf("# plan predicts peak bytes per tier:");
    for (int t = 0; t < OFFLOAD_TIERS; t++)
        printf(" %s %s%s", offload_tier_name((offload_tier)t), zo_format_bytes(pr->peak[t], b, sizeof b),
               t + 1 < OFFLOAD_TIERS ? "," : "");
    printf("; step %.3g s\n", pr->step_s);
    return 0;
}

int main(int argc, char **argv)
{
    train_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    if (a.check_plan) return check_plan(&a);
    if (!a.model || !a.data) {
        fprintf(stderr, "train: %s is required (see --help)\n", !a.model ? "--model" : "--data");
        return 2;
    }

    zo_status st;
    zo_model_config cfg;
    model_tokens tokens = {.fd = -1}, eval = {.fd = -1};
    model_tokenizer *tok = NULL;
    int32_t eot = -1;
    FILE *log = NULL;
    ft_record *recs = NULL;
    size_t n_recs = 0;
    gpu_device_t dev = NULL;
    gpu_stream_t s = NULL;
    tf_model m = {0};
    tf_offload_model tm = {0};
    offload_t *rt = NULL;
    int32_t *inputs = NULL, *targets = NULL;
    char b1[32], b2[32];
    offload_config *oc = &a.p.cfg;
    comm_t comm = NULL;
    int rank = 0, ranks = 1;
    double *losses = NULL;
    run_phase phase = PHASE_INPUT;
    catch_stop_signals();

    long kill_rank = -1, kill_step = -1;
    const char *kill_spec = getenv("ZO_TRAIN_KILL");
    if (kill_spec && sscanf(kill_spec, "%ld:%ld", &kill_rank, &kill_step) != 2) {
        fprintf(stderr, "train: ZO_TRAIN_KILL=%s is not RANK:STEP\n", kill_spec);
        return 2;
    }
    const char *pause_spec = getenv("ZO_TRAIN_CKPT_PAUSE");
    if (pause_spec) {
        oc->ckpt_hook = pause_hook;
        oc->ckpt_hook_user = (void *)pause_spec;
    }
    if ((st = load_config(a.model, &cfg)) != ZO_OK) goto out;
    /* the ranks the launcher started (one without a launcher) */
    comm_launch launch;
    if ((st = comm_launch_detect(&launch)) != ZO_OK) goto out;
    /* a plan made for another model or another number of ranks would run as
     * something it never planned */
    if (a.plan && (st = zo_plan_check_run(&a.p.file, &cfg, launch.size, a.plan)) != ZO_OK) {
        fprintf(stderr, "train: --plan %s\n", zo_last_error());
        return 2;
    }
    if (a.tokenizer) {
        if ((st = model_tokenizer_load(a.tokenizer, &tok)) != ZO_OK) goto out;
        eot = model_tokenizer_eot(tok);
        if (model_tokenizer_vocab(tok) > cfg.vocab) {
            st = zo_error(ZO_ERR_INVALID, "--tokenizer %s has %d ids, more than the model's vocabulary of %d",
                          a.tokenizer, model_tokenizer_vocab(tok), cfg.vocab);
            goto out;
        }
        if (a.eot && !strcmp(a.eot, "none")) {
            eot = -1;
        } else if (a.eot && (eot = model_tokenizer_token_id(tok, a.eot)) < 0) {
            st = zo_error(ZO_ERR_INVALID, "--eot %s: no such token in %s", a.eot, a.tokenizer);
            goto out;
        }
        printf("# tokenizer %s: %s, %d ids, end-of-text %d\n", a.tokenizer, model_tokenizer_kind(tok),
               model_tokenizer_vocab(tok), eot);
    }
    if ((st = open_data(&a, a.data, tok, eot, cfg.vocab, &tokens)) != ZO_OK) goto out;
    if (a.eval_data && (st = open_data(&a, a.eval_data, tok, eot, cfg.vocab, &eval)) != ZO_OK) goto out;
    /* LoRA: the flags, the plan or --adapter's config (an input) */
    if ((st = lora_choice(&a, &cfg)) != ZO_OK) goto out;
    phase = PHASE_SETUP;
    /* several ranks on "cuda": one GPU per rank of a node, by the launcher's local rank */
    char device[32];
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!local) local = getenv("MPI_LOCALRANKID"); /* MPICH's hydra */
    if (!local) local = getenv("SLURM_LOCALID");
    snprintf(device, sizeof device, "%s", a.device);
    if (launch.size > 1 && !strcmp(a.device, "cuda") && local) snprintf(device, sizeof device, "cuda:%s", local);
    if ((st = open_device(device, (size_t)a.device_mem, (int)a.threads, &dev)) != ZO_OK) goto out;
    /* the communicator: MPI or NCCL under a launcher, else one rank */
    comm_options co = {.device = dev, .timeout_s = a.comm_timeout};
    if ((st = comm_init(&co, &comm)) != ZO_OK) goto out_dev;
    rank = comm_rank(comm);
    ranks = comm_size(comm);
    oc->comm = comm;
    /* rank 0 speaks for the job; the others print only errors */
    if (rank > 0 && !freopen("/dev/null", "w", stdout)) {
        st = zo_error(ZO_ERR_IO, "train: rank %d: /dev/null: %s", rank, strerror(errno));
        goto out_dev;
    }
    if ((st = gpu_stream_create(dev, &s)) != ZO_OK) goto out_dev;
    tf_options to = {.recompute = oc->recompute, .external_res = 1,
                     .lora = {.r = a.lora.r, .alpha = a.lora.alpha, .targets = a.lora.targets, .nf4 = a.qlora}};
    if ((st = tf_init_opts(&m, &cfg, dev, a.dtype, (int)a.micro_batch, (int)a.seq, &to)) != ZO_OK)
        goto out_dev;
    if (a.lora.r) {
        char tg[128];
        printf("# LoRA r %d alpha %g on %s%s: %zu trainable parameters over a frozen base of %s\n",
               a.lora.r, a.lora.alpha, zo_lora_targets_str(a.lora.targets, tg, sizeof tg),
               a.qlora ? " (QLoRA: NF4 base)" : "", m.adapters.total_numel,
               zo_format_bytes(frozen_total(&m), b1, sizeof b1));
    }
    if ((st = tf_offload_model_init(&tm, &m)) != ZO_OK) goto out_model;
    if ((st = offload_init(&rt, dev, &tm.om, oc)) != ZO_OK) goto out_model;

    /* initial weights: a checkpoint, a safetensors file, or random; with
     * LoRA, the frozen base from them and the adapters from --adapter or
     * PEFT's init */
    phase = PHASE_INPUT;
    const model_layout *l = a.lora.r ? &m.adapters : &m.layout;
    if (a.lora.r) st = lora_weights(rt, &m, &a);
    else st = initial_weights(rt, l, a.weights, (uint64_t)a.seed);
    if (st != ZO_OK) goto out_rt;
    int accum = oc->grad_accum ? oc->grad_accum : 1;
    long k0 = 0;
    if (a.resume) {
        offload_ckpt_meta meta;
        if ((st = offload_load(rt, a.resume, &meta)) != ZO_OK) goto out_rt;
        /* the data position counts every rank's micro-batches: it resumes on
         * any rank count whose global batch (ranks x grad-accum) divides it */
        if (meta.data_step % (accum * ranks)) {
            st = zo_error(ZO_ERR_INVALID, "--resume %s: the checkpoint is %lld micro-batches into the data, not "
                          "a whole number of global batches of %d ranks x grad-accum %d", a.resume,
                          (long long)meta.data_step, ranks, accum);
            goto out_rt;
        }
        k0 = (long)(meta.data_step / (accum * ranks));
        printf("# resumed from %s at step %ld\n", a.resume, k0);
    }

    gpu_mem_stats ms;
    gpu_mem_get_stats(dev, &ms);
    printf("# train: %s (%s), %llu parameters, %d layers, hidden %d, vocab %d; dtype %s; "
           "batch %ld x %ld x %d; data %s (%llu tokens); device %s, %s in use of %s\n",
           cfg.name, zo_arch_name(cfg.arch), (unsigned long long)l->total_numel,
           cfg.n_layers, cfg.hidden, cfg.vocab, zo_dtype_name(a.dtype), a.micro_batch, a.seq, accum,
           a.data, (unsigned long long)tokens.n, gpu_device_name(dev),
           zo_format_bytes(ms.in_use, b1, sizeof b1),
           ms.capacity ? zo_format_bytes(ms.capacity, b2, sizeof b2) : "unlimited");
    if (ranks > 1)
        printf("# ranks: %d (%s), ZeRO-%d; global batch %ld x %ld x %d x %d ranks\n", ranks,
               comm_backend_name(comm_get_backend(comm)), oc->zero_stage, a.micro_batch, a.seq, accum, ranks);
    print_placement(&a);
    print_method(&a);
    if (a.p.selective_as_none && !oc->recompute)
        printf("# recompute: \"selective\" runs as none (the attention keeps no s x s "
               "scores, so selective would recompute nothing)\n");
    if (a.sched.kind != FT_LR_CONSTANT || a.sched.warmup)
        printf("# lr: %s from %g to %g over %ld steps, %ld warmup\n", ft_schedule_name(a.sched.kind), a.sched.lr,
               a.sched.kind == FT_LR_CONSTANT ? a.sched.lr : a.sched.min_lr, a.sched.steps, a.sched.warmup);
    fflush(stdout);
    if (a.log && !(log = fopen(a.log, a.resume ? "a" : "w"))) { /* a path that cannot be written: bad input */
        st = zo_error(ZO_ERR_IO, "--log %s: %s", a.log, strerror(errno));
        goto out_rt;
    }

    phase = PHASE_TRAIN;
    if (stop_signal) goto out_signal; /* came while the data was read or the model set up */
    size_t n = (size_t)a.micro_batch * a.seq;
    inputs = malloc(n * sizeof *inputs);
    targets = malloc(n * sizeof *targets);
    losses = calloc((size_t)ranks, sizeof *losses);
    if (!inputs || !targets || !losses) {
        st = zo_error(ZO_ERR_NOMEM, "train: out of host memory for the batch");
        goto out_rt;
    }
    int progress = isatty(STDERR_FILENO) && !isatty(STDOUT_FILENO);
    double t_start = zo_now();
    for (long k = k0; k < a.steps; k++) {
        double t0 = zo_now(), sum = 0, lr = ft_lr_at(&a.sched, k);
        offload_set_lr(rt, (float)lr);
        for (int j = 0; j < accum; j++) {
            /* rank r's slice of the global batch of step k */
            st = model_batch_get(&tokens, (int)a.micro_batch, (int)a.seq, (k * ranks + rank) * accum + j, 0,
                                 MODEL_SAMPLE_SEQUENTIAL, inputs, targets);
            if (st != ZO_OK) {
                phase = PHASE_INPUT; /* the data file holds what it should not */
                goto out_rt;
            }
            float loss;
            if ((st = tf_set_batch(&m, s, inputs, targets, (int)a.micro_batch, (int)a.seq)) != ZO_OK ||
                (st = offload_micro_batch(rt, s)) != ZO_OK || (st = tf_loss(&m, s, &loss)) != ZO_OK) {
                st = zo_error_wrap(st, "step %ld", k);
                goto out_rt;
            }
            sum += loss;
            if (stop_signal) goto out_signal;
        }
        /* test seam: ZO_TRAIN_KILL="RANK:STEP" kills that rank mid-step */
        if (kill_rank == rank && kill_step == k) raise(SIGKILL);
        offload_step_info info;
        if ((st = offload_step(rt, &info)) != ZO_OK) {
            st = zo_error_wrap(st, "step %ld", k);
            goto out_rt;
        }
        /* the mean over the global batch: every rank's sum, in rank order */
        if ((st = offload_gather(rt, &sum, sizeof sum, losses)) != ZO_OK) goto out_rt;
        sum = 0;
        for (int r = 0; r < ranks; r++) sum += losses[r];
        double dt = zo_now() - t0;
        gpu_mem_get_stats(dev, &ms);
        printf("step %ld loss %.6f lr %.6g norm %.4f tok/s %.0f mem %s%s\n", k, sum / (accum * ranks), lr,
               info.grad_norm, (double)n * accum * ranks / dt, zo_format_bytes(ms.high_water, b1, sizeof b1),
               info.skipped ? " (overflow: skipped)" : "");
        int last = k + 1 == a.steps;
        ft_record rec = {.step = k, .loss = sum / (accum * ranks), .lr = lr, .grad_norm = info.grad_norm,
                         .tokens_per_s = (double)n * accum * ranks / dt};
        offload_stats ost;
        offload_get_stats(rt, &ost);
        for (int t = 0; t < FT_TIERS; t++) rec.peak[t] = ost.peak[t];
        if (a.eval_data && ((a.eval_every && (k + 1) % a.eval_every == 0) || last)) {
            uint64_t counted;
            int bad_data = 0;
            if ((st = evaluate(&a, &m, rt, s, &eval, inputs, targets, &rec.eval_loss, &counted, &bad_data)) !=
                ZO_OK) {
                if (bad_data) phase = PHASE_INPUT; /* --eval-data holds what it should not */
                goto out_rt;
            }
            rec.has_eval = 1;
            rec.eval_ppl = exp(rec.eval_loss);
            printf("eval step %ld loss %.6f ppl %.4f (%ld batches, %llu tokens)\n", k, rec.eval_loss, rec.eval_ppl,
                   a.eval_batches, (unsigned long long)counted);
        }
        fflush(stdout);
        if (log && (st = ft_log_write(log, a.log, &rec)) != ZO_OK) goto out_rt;
        if (a.plot) {
            ft_record *nr = realloc(recs, (n_recs + 1) * sizeof *nr);
            if (!nr) {
                st = zo_error(ZO_ERR_NOMEM, "train: out of host memory for the plot");
                goto out_rt;
            }
            recs = nr;
            recs[n_recs++] = rec;
        }
        if (a.ckpt && ((a.save_every && (k + 1) % a.save_every == 0) || last)) {
            offload_ckpt_meta meta = {.data_step = (k + 1) * accum * ranks, .seed = (uint64_t)a.seed};
            if ((st = offload_save_streamed(rt, a.ckpt, &meta, write_weights, (void *)l)) != ZO_OK)
                goto out_rt;
            printf("# checkpoint %s step %ld\n", a.ckpt, k + 1);
        }
        if (stop_signal) goto out_signal;
        if (progress) {
            double el = zo_now() - t_start;
            fprintf(stderr, "\r[%ld/%ld] loss %.4f, %.0fs left ", k + 1, a.steps, sum / (accum * ranks),
                    el / (k + 1 - k0) * (a.steps - k - 1));
        }
    }
    if (progress) fprintf(stderr, "\n");
    if (a.plot) {
        /* the whole log (earlier runs too when resumed), else this run's steps */
        if (log) {
            fclose(log);
            log = NULL;
            free(recs);
            recs = NULL;
            if ((st = ft_log_read(a.log, &recs, &n_recs)) != ZO_OK) goto out_rt;
        }
        char title[256];
        snprintf(title, sizeof title, "%s on %s", cfg.name, a.data);
        if ((st = ft_plot_write(a.plot, recs, n_recs, title)) != ZO_OK) goto out_rt;
        printf("# plot %s\n", a.plot);
    }
    gpu_mem_get_stats(dev, &ms);
    printf("# device memory: peak %s of %s\n", zo_format_bytes(ms.high_water, b1, sizeof b1),
           ms.capacity ? zo_format_bytes(ms.capacity, b2, sizeof b2) : "unlimited");
    offload_stats ost;
    offload_get_stats(rt, &ost);
    if ((st = print_tiers(rt, &ost, a.plan ? &a.p.predicted : NULL, l->total_numel)) != ZO_OK) goto out_rt;
    if (a.stats_json) {
        /* rank r > 0 writes FILE.rank<r> */
        char stats_path[4200];
        snprintf(stats_path, sizeof stats_path, rank ? "%s.rank%d" : "%s", a.stats_json, rank);
        if ((st = offload_write_stats_json(rt, a.plan ? &a.p.predicted : NULL, stats_path)) != ZO_OK)
            goto out_rt;
        printf("# stats %s\n", a.stats_json);
    }
    if (a.save) {
        /* every rank takes part: with the optimizer state partitioned, blocks are gathered */
        if (a.lora.r) st = save_adapters(rt, &m, &a);
        else st = offload_write_weights(rt, a.save, write_weights, (void *)l);
        if (st != ZO_OK) goto out_rt;
        printf("# saved %s\n", a.save);
    }
    st = ZO_OK;
    goto out_rt;

out_signal:
    st = zo_error(ZO_ERR_INTERNAL, "stopped by signal %d (%s)", (int)stop_signal, strsignal(stop_signal));

out_rt:
    offload_free(rt);
out_model:
    tf_offload_model_free(&tm);
    tf_free(&m);
out_dev:
    if (st != ZO_OK && ranks > 1) {
        /* the others would wait for this rank in a collective until their
         * timeout: end the job now, saying why, with the exit status one
         * rank would have */
        char msg[1200];
        snprintf(msg, sizeof msg, "train: rank %d of %d: %s", rank, ranks, zo_last_error());
        comm_abort(comm, exit_code(st, phase), msg);
    }
    comm_free(comm);
    if (s) gpu_stream_destroy(s);
    gpu_device_free(dev);
out:
    if (log) fclose(log);
    free(recs);
    model_tokens_close(&tokens);
    model_tokens_close(&eval);
    model_tokenizer_free(tok);
    free(inputs);
    free(targets);
    free(losses);
    if (st == ZO_OK) return 0;
    fprintf(stderr, "train: %s\n", zo_last_error());
    if (stop_signal) { /* cleaned up: end the way the signal would have */
        fflush(NULL);
        signal(stop_signal, SIG_DFL);
        raise(stop_signal);
    }
    return exit_code(st, phase);
}
