/* memplan: size a transformer's training on given hardware.
 *
 *   memplan estimate [options]   bytes per rank, per tier and kind; fits or not
 *   memplan models               the model presets with shapes and parameter counts
 *   memplan hardware             the hardware presets
 *
 * Exit status: 0 fits (or a listing), 1 does not fit, 2 bad input. */
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common/clock.h"
#include "common/fileio.h" /* defines: zo_file_read_all, zo_file_write_all, zo_file_write_json */
#include "common/model_config.h"
#include "common/units.h"
#include "planner/basis.h"
#include "planner/calibrate.h"
#include "planner/cost.h"
#include "planner/hardware.h"
#include "planner/memory.h"
#include "planner/planfile.h"
#include "planner/report.h"
#include "planner/search.h"
#include "planner/svg.h"
#include "planner/suggest.h"

#define EXIT_NOFIT 1
#define EXIT_BADINPUT 2

static const char usage_main[] =
    "usage: memplan <command> [options]\n"
    "\n"
    "Size the training of a transformer on given hardware.\n"
    "\n"
    "commands:\n"
    "  estimate    bytes each rank needs per tier (GPU, CPU, NVMe) and kind; whether it fits;\n"
    "              the predicted step time by part\n"
    "  plan        search layouts, ZeRO stages, recompute and placements; the best few\n"
    "  max-model   the largest model of a family that trains on the hardware, per strategy\n"
    "  calibrate   measure this machine; write a hardware profile for --hw FILE\n"
    "  models      list the model presets with their shapes and parameter counts\n"
    "  hardware    list the hardware presets\n"
    "  help        this text; 'memplan estimate --help' for the estimate's options\n"
    "\n"
    "exit status: 0 fits (or a listing), 1 does not fit, 2 bad input\n";

static const char usage_estimate[] =
    "usage: memplan estimate --model NAME|CONFIG.json [options]\n"
    "\n"
    "model (one of):\n"
    "  --model NAME            a preset ('memplan models')\n"
    "  --model PATH            a Hugging Face config.json (its family by model_type: LLaMA,\n"
    "                          Qwen2/3, Gemma, Mixtral, DeepSeek, GPT-NeoX, Falcon, OPT, BLOOM,\n"
    "                          ...; 'memplan models' lists them and those refused)\n"
    "  --params N              a model known only by its size (e.g. 7.5e9, 13B): model\n"
    "                          states only, activations unknown\n"
    "  --layers N --hidden N --heads N [--kv-heads N] [--ffn N] --vocab N [--arch gpt|llama]\n"
    "                          a custom shape (also overrides fields of --model)\n"
    "hardware (the report's first lines say what its figures rest on):\n"
    "  --hw NAME               a machine preset ('memplan hardware'); default h100-80gb\n"
    "  --gpu NAME              one GPU preset (rtx-4090, l40s, a100-80gb-pcie, ...) in its usual\n"
    "                          host; with --gpus N, N of them in one node\n"
    "  --host NAME             with --gpu: desktop, workstation or server\n"
    "  --gpus N                GPUs in the job (default: DP x TP x PP, or the preset's)\n"
    "  --gpus-per-node N, --gpu-mem SIZE, --cpu-mem SIZE (per node), --nvme SIZE (per node)\n"
    "                          sizes: 80GB, 80GiB, 1.5TB or bytes\n"
    "  --pcie LINK             the host link as it runs: gen4x16, gen3x8, gen5 (lanes kept)\n"
    "training:\n"
    "  --seq N                 sequence length (default: the model's positions, at most 4096)\n"
    "  --micro-batch N         sequences per micro-batch (default 1)\n"
    "  --grad-accum N          micro-batches per step per data-parallel rank (default 1)\n"
    "  --global-batch N        sequences per step: sets --grad-accum = N / (micro-batch x DP)\n"
    "  --dtype fp16|bf16|fp32  weights and activations (default bf16)\n"
    "  --grad-dtype DTYPE      gradients (default: --dtype; fp32 = Megatron's 18 B/param)\n"
    "  --optim adamw|sgd       AdamW: fp32 master + m + v (12 B/param); SGD: master + momentum\n"
    "fine-tuning method (default: every parameter):\n"
    "  --lora R                LoRA adapters of rank R on a frozen base: trainable parameters\n"
    "                          as Hugging Face PEFT counts them; no base gradients or optimizer state\n"
    "  --lora-targets LIST     q,k,v,o,gate,up,down (or PEFT's q_proj, ...) or all-linear\n"
    "                          (default q,v: PEFT's; on GPT-2 its fused c_attn)\n"
    "  --lora-alpha A          the adapters' scale alpha / R (default 8, PEFT's; time and memory\n"
    "                          do not depend on it)\n"
    "  --qlora                 with --lora: the base's linear weights in NF4 with double\n"
    "                          quantization (QLoRA); embeddings, head and norms stay 16-bit\n"
    "  --adapters-on gpu|cpu|nvme  with --lora: where the adapters live (default gpu; else\n"
    "                          streamed like weights); --params places the frozen base\n"
    "parallelism:\n"
    "  --dp N --tp N --pp N    data, tensor and pipeline parallel degrees (default 1)\n"
    "  --sp                    sequence parallelism (with --tp)\n"
    "  --vpp N                 interleaved 1F1B with N model chunks per stage\n"
    "  --zero 0|1|2|3          ZeRO stage: 1 shards optimizer state over DP, 2 also\n"
    "                          gradients, 3 also parameters (default 0)\n"
    "  --recompute none|selective|full   activation recomputation (default none)\n"
    "  --no-flash-attn         standard attention (keeps the s^2 softmax terms)\n"
    "  --dropout, --no-dropout dropout masks (default: on for GPT, off for LLaMA)\n"
    "placement:\n"
    "  --params gpu|cpu|nvme   fp16/bf16 weights (cpu/nvme: streamed to the GPU)\n"
    "  --grads gpu|cpu         gradients\n"
    "  --optimizer gpu|cpu|nvme or fractions such as gpu=0.2,cpu=0.5,nvme=0.3\n"
    "  --checkpoints gpu|cpu   stored activations / checkpoints\n"
    "working buffers:\n"
    "  --cuda-context SIZE     (default 512MiB)      --cublas-workspace SIZE (default 32MiB)\n"
    "  --comm-bucket N         elements per gradient bucket (default 25M), --comm-buckets N (2)\n"
    "  --prefetch N            streamed blocks resident ahead (default 2)\n"
    "  --pinned-staging SIZE   pinned host staging (default 2 x largest block)\n"
    "  --fragmentation F       allocator allowance, fraction of the GPU total (default 0.05)\n"
    "  --sub-group N           optimizer sub-group for NVMe swapping (default 100M params)\n"
    "  --swap-buffers N        sub-groups of pinned swap buffers (default 3)\n"
    "mixture of experts:\n"
    "  --ep N                  expert parallelism: each expert on one of N data-parallel ranks\n"
    "  --capacity-factor F     tokens an expert takes, x its fair share (default 0: dropless)\n"
    "runtime schedule (time only):\n"
    "  --schedule serial|overlap|dpu  when the CPU optimizer runs: after the backward (serial,\n"
    "                          default), block by block beside the GPU (overlap), or one step\n"
    "                          late beside the next step (dpu, the delayed parameter update)\n"
    "  --clip-stale            overlap: clip with the previous step's norm (or no clipping), so\n"
    "                          a block's update starts when its gradients are complete\n"
    "  --dpu-warmup N          dpu: serial steps first (default 10)\n"
    "  --opt-threads N         CPU threads per rank for the optimizer (default: the host's cores;\n"
    "                          less one per rank when it runs beside the GPU)\n"
    "  --no-dp-overlap         reduce gradients after the backward (as Megatron-LM 2021)\n"
    "  --fused-grad-accum      the weight-gradient GEMM adds into the gradient buffer\n"
    "                          (Megatron's gradient-accumulation fusion; default: a pass)\n"
    "output (every command: --json prints its JSON to stdout instead of the table,\n"
    "--json-out FILE writes it to FILE beside the table):\n"
    "  --json                  the report as JSON instead of the table (docs/memplan-json.md)\n"
    "  --json-out FILE         the same report written to FILE\n"
    "  --svg FILE              a picture: per tier what lives there against capacity, and the\n"
    "                          step-time split\n"
    "  --plan FILE             estimate a plan file (docs/plan-format.md) instead of flags\n"
    "  --plan-out FILE         write this configuration as a plan file for 'train --plan'\n"
    "                          (the report --json prints is not a plan)\n"
    "  --hw FILE               (above) also takes a profile from 'memplan calibrate'\n";

enum {
    OPT_MODEL = 256, OPT_PARAMS, OPT_LAYERS, OPT_HIDDEN, OPT_HEADS, OPT_KV_HEADS, OPT_FFN,
    OPT_VOCAB, OPT_ARCH, OPT_HW, OPT_GPUS, OPT_GPUS_PER_NODE, OPT_GPU_MEM, OPT_CPU_MEM, OPT_NVME,
    OPT_GPU, OPT_HOST, OPT_PCIE, OPT_SEQ, OPT_MICRO_BATCH, OPT_GRAD_ACCUM, OPT_DTYPE, OPT_GRAD_DTYPE, OPT_OPTIM, OPT_DP, OPT_TP,
    OPT_PP, OPT_SP, OPT_VPP, OPT_ZERO, OPT_RECOMPUTE, OPT_NO_FLASH, OPT_DROPOUT, OPT_NO_DROPOUT,
    OPT_GRADS, OPT_OPTIMIZER, OPT_CHECKPOINTS, OPT_CUDA_CONTEXT, OPT_CUBLAS_WS, OPT_COMM_BUCKET,
    OPT_COMM_BUCKETS, OPT_PREFETCH, OPT_PINNED, OPT_FRAG, OPT_SUB_GROUP, OPT_SWAP_BUFFERS,
    OPT_EP, OPT_CAPACITY, OPT_LORA, OPT_LORA_TARGETS, OPT_LORA_ALPHA, OPT_QLORA, OPT_ADAPTERS_ON,
    OPT_SCHEDULE,
    OPT_DPU_WARMUP, OPT_OPT_THREADS, OPT_CLIP_STALE,
    OPT_NO_DP_OVERLAP, OPT_FUSED_ACCUM, /* the last configuration flag */
    OPT_JSON, OPT_GLOBAL_BATCH, OPT_SVG, OPT_PLAN, OPT_PLAN_OUT, OPT_HELP, OPT_JSON_OUT,
};

/* The model and hardware flags, shared by estimate and plan. */
#define MODEL_HW_OPTIONS                                                        \
    {"model", required_argument, 0, OPT_MODEL},                                 \
    {"params", required_argument, 0, OPT_PARAMS},                               \
    {"layers", required_argument, 0, OPT_LAYERS},                               \
    {"hidden", required_argument, 0, OPT_HIDDEN},                               \
    {"heads", required_argument, 0, OPT_HEADS},                                 \
    {"kv-heads", required_argument, 0, OPT_KV_HEADS},                           \
    {"ffn", required_argument, 0, OPT_FFN},                                     \
    {"vocab", required_argument, 0, OPT_VOCAB},                                 \
    {"arch", required_argument, 0, OPT_ARCH},                                   \
    {"hw", required_argument, 0, OPT_HW},                                       \
    {"gpus", required_argument, 0, OPT_GPUS},                                   \
    {"gpus-per-node", required_argument, 0, OPT_GPUS_PER_NODE},                 \
    {"gpu-mem", required_argument, 0, OPT_GPU_MEM},                             \
    {"cpu-mem", required_argument, 0, OPT_CPU_MEM},                             \
    {"nvme", required_argument, 0, OPT_NVME},                                   \
    {"gpu", required_argument, 0, OPT_GPU},                                     \
    {"host", required_argument, 0, OPT_HOST},                                   \
    {"pcie", required_argument, 0, OPT_PCIE},                                   \
    {"seq", required_argument, 0, OPT_SEQ}

/* What is trained and how the optimizer is scheduled, shared by estimate,
 * plan and max-model. */
#define METHOD_OPTIONS                                                          \
    {"lora", required_argument, 0, OPT_LORA},                                   \
    {"lora-targets", required_argument, 0, OPT_LORA_TARGETS},                   \
    {"lora-alpha", required_argument, 0, OPT_LORA_ALPHA},                       \
    {"qlora", no_argument, 0, OPT_QLORA},                                       \
    {"adapters-on", required_argument, 0, OPT_ADAPTERS_ON},                     \
    {"schedule", required_argument, 0, OPT_SCHEDULE},                           \
    {"dpu-warmup", required_argument, 0, OPT_DPU_WARMUP},                       \
    {"opt-threads", required_argument, 0, OPT_OPT_THREADS},                     \
    {"clip-stale", no_argument, 0, OPT_CLIP_STALE}

static const struct option estimate_opts[] = {
    MODEL_HW_OPTIONS,
    METHOD_OPTIONS,
    {"micro-batch", required_argument, 0, OPT_MICRO_BATCH},
    {"grad-accum", required_argument, 0, OPT_GRAD_ACCUM},
    {"dtype", required_argument, 0, OPT_DTYPE},
    {"grad-dtype", required_argument, 0, OPT_GRAD_DTYPE},
    {"optim", required_argument, 0, OPT_OPTIM},
    {"dp", required_argument, 0, OPT_DP},
    {"tp", required_argument, 0, OPT_TP},
    {"pp", required_argument, 0, OPT_PP},
    {"sp", no_argument, 0, OPT_SP},
    {"vpp", required_argument, 0, OPT_VPP},
    {"zero", required_argument, 0, OPT_ZERO},
    {"recompute", required_argument, 0, OPT_RECOMPUTE},
    {"no-flash-attn", no_argument, 0, OPT_NO_FLASH},
    {"dropout", no_argument, 0, OPT_DROPOUT},
    {"no-dropout", no_argument, 0, OPT_NO_DROPOUT},
    {"grads", required_argument, 0, OPT_GRADS},
    {"optimizer", required_argument, 0, OPT_OPTIMIZER},
    {"checkpoints", required_argument, 0, OPT_CHECKPOINTS},
    {"cuda-context", required_argument, 0, OPT_CUDA_CONTEXT},
    {"cublas-workspace", required_argument, 0, OPT_CUBLAS_WS},
    {"comm-bucket", required_argument, 0, OPT_COMM_BUCKET},
    {"comm-buckets", required_argument, 0, OPT_COMM_BUCKETS},
    {"prefetch", required_argument, 0, OPT_PREFETCH},
    {"pinned-staging", required_argument, 0, OPT_PINNED},
    {"fragmentation", required_argument, 0, OPT_FRAG},
    {"sub-group", required_argument, 0, OPT_SUB_GROUP},
    {"swap-buffers", required_argument, 0, OPT_SWAP_BUFFERS},
    {"ep", required_argument, 0, OPT_EP},
    {"capacity-factor", required_argument, 0, OPT_CAPACITY},
    {"no-dp-overlap", no_argument, 0, OPT_NO_DP_OVERLAP},
    {"fused-grad-accum", no_argument, 0, OPT_FUSED_ACCUM},
    {"json", no_argument, 0, OPT_JSON},
    {"json-out", required_argument, 0, OPT_JSON_OUT},
    {"global-batch", required_argument, 0, OPT_GLOBAL_BATCH},
    {"svg", required_argument, 0, OPT_SVG},
    {"plan", required_argument, 0, OPT_PLAN},
    {"plan-out", required_argument, 0, OPT_PLAN_OUT},
    {"help", no_argument, 0, OPT_HELP},
    {0, 0, 0, 0},
};

static int fail(void)
{
    fprintf(stderr, "memplan: %s\n", zo_last_error());
    return EXIT_BADINPUT;
}

/* What is valid but probably not meant, to stderr. */
static void warn(const plan_train *t, const plan_hw *hw)
{
    char w[1024];
    if (!plan_train_warnings(t, hw, w, sizeof w)) return;
    for (char *sv = NULL, *line = strtok_r(w, "\n", &sv); line; line = strtok_r(NULL, "\n", &sv))
        fprintf(stderr, "memplan: warning: %s\n", line);
}

/* A flag that sets a field of the plan is checked against the plan schema's
 * range for it, with the message a plan file holding the value gets. */
static zo_status field_check(zo_status st, const char *flag, const char *field, double v)
{
    if (st != ZO_OK) return st;
    if ((st = zo_plan_field_check(field, v)) != ZO_OK) return zo_error_wrap(st, "%s", flag);
    return ZO_OK;
}

static zo_status field_int(const char *s, const char *flag, const char *field, long *out)
{
    zo_status st = zo_parse_int(s, flag, LONG_MIN, LONG_MAX, out);
    return st != ZO_OK ? st : field_check(st, flag, field, (double)*out);
}

static zo_status field_double(const char *s, const char *flag, const char *field, double *out)
{
    zo_status st = zo_parse_double(s, flag, -HUGE_VAL, HUGE_VAL, out);
    return st != ZO_OK ? st : field_check(st, flag, field, *out);
}

/* A size in bytes (units allowed) or, with `count`, a count (K/M/B/T). */
static zo_status field_u64(const char *s, const char *flag, const char *field, int count,
                           uint64_t *out)
{
    zo_status st = count ? zo_parse_count(s, flag, out) : zo_parse_size(s, flag, 1, out);
    return st != ZO_OK ? st : field_check(st, flag, field, (double)*out);
}

static int is_file(const char *p)
{
    struct stat sb;
    return strchr(p, '/') || strstr(p, ".json") ? 1 : (stat(p, &sb) == 0 && S_ISREG(sb.st_mode));
}

/* The whole file as a string (the caller frees it). */
static zo_status read_text(const char *path, char **out)
{
    return zo_file_read_all(path, 64u << 20, "a JSON description", out, NULL);
}

/* --hw NAME (a preset) or --hw FILE (a profile from `memplan calibrate`). */
static zo_status load_hw(const char *name, plan_hw *hw)
{
    if (!is_file(name)) return plan_hw_find(name, hw);
    char *text;
    zo_status st = read_text(name, &text);
    if (st) return zo_error_wrap(st, "--hw");
    memset(hw, 0, sizeof *hw);
    st = plan_hw_parse(text, name, hw);
    free(text);
    return st;
}

#define DEFAULT_HW "h100-80gb"

/* The hardware flags, shared by estimate, plan and max-model: 1 when `c` is one. */
static int parse_hw_flag(int c, const char *arg, plan_hw_flags *f, zo_status *st)
{
    long v;
    switch (c) {
    case OPT_HW: f->hw = arg; return 1;
    case OPT_GPU: f->gpu = arg; return 1;
    case OPT_HOST: f->host = arg; return 1;
    case OPT_PCIE: f->pcie = arg; return 1;
    case OPT_GPU_MEM:
        f->gpu_mem_arg = arg;
        *st = zo_parse_size(arg, "--gpu-mem", 0, &f->gpu_mem);
        return 1;
    case OPT_CPU_MEM:
        f->cpu_mem_arg = arg;
        *st = zo_parse_size(arg, "--cpu-mem", 0, &f->cpu_mem);
        return 1;
    case OPT_NVME:
        f->nvme_arg = arg;
        *st = zo_parse_size(arg, "--nvme", 1, &f->nvme);
        return 1;
    case OPT_GPUS_PER_NODE:
        *st = zo_parse_int(arg, "--gpus-per-node", 1, 1024, &v);
        f->gpus_per_node = v;
        return 1;
    default: return 0;
    }
}

/* The method and schedule flags as given (METHOD_OPTIONS). */
typedef struct method_flags {
    long lora_r;           /* --lora R; 0: not given */
    int qlora;
    const char *targets;   /* --lora-targets */
    double alpha;          /* --lora-alpha */
    int alpha_set;
    int adapters_on;       /* --adapters-on: a zo_plan_tier; -1: not given */
    int schedule;          /* --schedule: a zo_plan_schedule; -1: not given */
    long dpu_warmup;
    int dpu_warmup_set;
    long opt_threads;
    int clip_stale;
} method_flags;

static void method_flags_init(method_flags *f)
{
    memset(f, 0, sizeof *f);
    f->schedule = -1;
    f->adapters_on = -1;
}

/* One of METHOD_OPTIONS: 1 when `c` is one. */
static int parse_method_flag(int c, const char *arg, method_flags *f, zo_status *st)
{
    switch (c) {
    case OPT_LORA: *st = field_int(arg, "--lora", "training.lora.r", &f->lora_r); return 1;
    case OPT_LORA_TARGETS: f->targets = arg; return 1;
    case OPT_LORA_ALPHA:
        *st = field_double(arg, "--lora-alpha", "training.lora.alpha", &f->alpha);
        f->alpha_set = 1;
        return 1;
    case OPT_QLORA: f->qlora = 1; return 1;
    case OPT_ADAPTERS_ON: {
        zo_plan_tier tier = ZO_PLAN_GPU;
        *st = zo_plan_tier_parse(arg, "--adapters-on", 1, &tier);
        f->adapters_on = (int)tier;
        return 1;
    }
    case OPT_SCHEDULE: {
        zo_plan_schedule sched = ZO_PLAN_SCHED_SERIAL;
        *st = zo_plan_schedule_parse(arg, "--schedule", &sched);
        f->schedule = *st == ZO_OK ? (int)sched : -1;
        return 1;
    }
    case OPT_DPU_WARMUP:
        *st = field_int(arg, "--dpu-warmup", "training.dpu_warmup", &f->dpu_warmup);
        f->dpu_warmup_set = 1;
        return 1;
    case OPT_OPT_THREADS:
        *st = field_int(arg, "--opt-threads", "training.opt_threads", &f->opt_threads);
        return 1;
    case OPT_CLIP_STALE: f->clip_stale = 1; return 1;
    default: return 0;
    }
}

/* The method and schedule flags applied to `t` (the schedule only when
 * given: `plan` searches it otherwise). */
static zo_status apply_method_flags(const method_flags *f, plan_train *t)
{
    zo_status st;
    if (!f->lora_r && (f->qlora || f->targets || f->alpha_set || f->adapters_on >= 0))
        return zo_error(ZO_ERR_INVALID, "%s needs --lora R (the adapters' rank)",
                        f->qlora ? "--qlora" : f->targets ? "--lora-targets"
                                           : f->alpha_set ? "--lora-alpha" : "--adapters-on");
    if (f->lora_r) {
        t->method = f->qlora ? ZO_PLAN_QLORA : ZO_PLAN_LORA;
        t->lora.r = (int)f->lora_r;
        t->lora.alpha = f->alpha_set ? (float)f->alpha : PLAN_LORA_DEFAULT_ALPHA;
        t->lora.targets = PLAN_LORA_DEFAULT_TARGETS;
        if (f->targets && (st = zo_lora_targets_parse(f->targets, &t->lora.targets)) != ZO_OK)
            return zo_error_wrap(st, "--lora-targets");
        if (f->adapters_on >= 0) t->adapters_on = (zo_plan_tier)f->adapters_on;
    }
    if (f->schedule >= 0) t->schedule = (zo_plan_schedule)f->schedule;
    if (f->dpu_warmup_set) t->dpu_warmup = (int)f->dpu_warmup;
    t->opt_threads = (int)f->opt_threads;
    t->clip_stale = f->clip_stale;
    return ZO_OK;
}

static int is_node_preset(const char *name)
{
    size_t n;
    const plan_hw_preset *p = plan_hw_presets(&n);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(p[i].name, name)) return 1;
    return 0;
}

/* The machine the hardware flags describe, and what its figures rest on. */
static zo_status build_hw(const plan_hw_flags *f, plan_hw *hw, plan_hw_basis *b)
{
    zo_status st;
    if ((st = plan_hw_flags_check(f)) != ZO_OK) return st;
    const char *name = f->hw ? f->hw : DEFAULT_HW;
    if (f->gpu) {
        st = plan_hw_from_gpu(f, hw, b);
    } else if ((st = load_hw(name, hw)) != ZO_OK) {
        return st;
    } else if (is_file(name)) {
        plan_hw_basis_init(b, PLAN_HW_PROFILE, name, 0, hw);
    } else if (is_node_preset(hw->name)) {
        plan_hw_basis_init(b, PLAN_HW_PRESET, hw->name, !f->hw, hw);
    } else { /* --hw named a GPU preset: as --gpu */
        plan_hw_flags g = *f;
        g.gpu = name;
        g.hw = NULL;
        st = plan_hw_from_gpu(&g, hw, b);
    }
    return st ? st : plan_hw_apply_flags(f, hw, b);
}

/* --gpu builds one node: --gpus N puts N of the GPU in it. */
static void gpu_node_size(const plan_hw_flags *f, const plan_hw_basis *b, plan_hw *hw)
{
    if (b->source == PLAN_HW_GPU && !f->gpus_per_node) hw->gpus_per_node = hw->gpus;
}

static zo_status write_text(const char *path, const char *text);

/* The --json convention of every command: `--json` prints the command's JSON
 * document to stdout in place of its table, `--json-out FILE` writes it to
 * FILE (atomically) beside the table. Takes doc. */
static zo_status emit_json(cJSON *doc, int to_stdout, const char *path)
{
    zo_status st = ZO_OK;
    if (path) st = zo_file_write_json(path, doc);
    if (st == ZO_OK && to_stdout) {
        char *text = doc ? cJSON_Print(doc) : NULL;
        if (text) puts(text);
        else st = zo_error(ZO_ERR_NOMEM, "out of memory printing JSON");
        free(text);
    }
    cJSON_Delete(doc);
    return st;
}

/* An argument left over after the options: the old `--json FILE`? */
static void unexpected_argument(const char *cmd, int argc, char **argv)
{
    int after_json = optind > 1 && !strcmp(argv[optind - 1], "--json");
    zo_error(ZO_ERR_INVALID, "%s: unexpected argument '%s'%s", cmd, argv[optind],
             after_json ? " (--json prints JSON to stdout; --json-out FILE writes it to FILE)" : "");
    (void)argc;
}

static zo_status write_svg(const char *path, const zo_model_config *m, const plan_hw *hw,
                           const plan_train *t, const plan_estimate *e, const plan_time *pt)
{
    char *svg = plan_svg(m, hw, t, e, pt);
    if (!svg) return zo_error(ZO_ERR_NOMEM, "--svg %s: out of memory drawing the plan", path);
    zo_status st = write_text(path, svg);
    free(svg);
    return st ? zo_error_wrap(st, "--svg") : ZO_OK;
}

static zo_status write_text(const char *path, const char *text)
{
    return zo_file_write_all(path, text, strlen(text));
}

typedef struct shape_flags {
    long layers, hidden, heads, kv_heads, ffn, vocab;
    const char *arch;
} shape_flags;

static zo_status build_model(const char *model, uint64_t params_n, const shape_flags *sf,
                             long seq, zo_model_config *m)
{
    zo_status st;
    int custom = sf->layers || sf->hidden || sf->heads || sf->kv_heads || sf->ffn || sf->vocab || sf->arch;
    memset(m, 0, sizeof *m);
    if (model) {
        st = is_file(model) ? zo_model_config_load(model, m) : zo_model_preset_find(model, m);
        if (st) return st;
    } else if (params_n) {
        if (custom)
            return zo_error(ZO_ERR_INVALID, "--params N and a custom shape (--layers ...) exclude each other");
        snprintf(m->name, sizeof m->name, "%.3g-param model", (double)params_n);
        snprintf(m->family, sizeof m->family, "custom");
        m->params_override = params_n;
        m->max_seq = seq ? (int)seq : 2048;
        return ZO_OK;
    } else if (custom) {
        if (!sf->layers || !sf->hidden || !sf->heads || !sf->vocab)
            return zo_error(ZO_ERR_INVALID,
                            "a custom shape needs --layers, --hidden, --heads and --vocab");
        snprintf(m->name, sizeof m->name, "custom");
        snprintf(m->family, sizeof m->family, "custom");
        m->arch = ZO_ARCH_GPT;
        m->max_seq = seq ? (int)seq : 2048;
    } else {
        return zo_error(ZO_ERR_INVALID, "no model: give --model NAME|CONFIG.json, --params N or a "
                                        "shape (--layers --hidden --heads --vocab)");
    }
    if (sf->arch) {
        if (!strcasecmp(sf->arch, "gpt")) m->arch = ZO_ARCH_GPT;
        else if (!strcasecmp(sf->arch, "llama")) m->arch = ZO_ARCH_LLAMA;
        else return zo_error(ZO_ERR_INVALID, "--arch: '%s' is not gpt or llama", sf->arch);
    }
    if (custom) {
        int gpt = m->arch == ZO_ARCH_GPT;
        if (!model || sf->arch) {
            m->tied_embeddings = gpt;
            m->attn_bias = m->out_bias = m->norm_bias = gpt;
            m->rope_theta = gpt ? 0 : 10000.0f;
            m->norm_eps = 1e-5f;
        }
        if (sf->layers) m->n_layers = (int)sf->layers;
        if (sf->hidden) m->hidden = (int)sf->hidden;
        if (sf->heads) m->n_heads = (int)sf->heads;
        if (sf->vocab) m->vocab = (int)sf->vocab;
        if (sf->hidden || sf->heads) m->head_dim = 0;
        if (sf->heads && !sf->kv_heads) m->n_kv_heads = m->n_heads;
        if (sf->kv_heads) m->n_kv_heads = (int)sf->kv_heads;
        if (sf->ffn) m->ffn = (int)sf->ffn;
        else if (!model || sf->hidden)
            /* GPT: 4h; LLaMA: 2/3 of 4h rounded up to a multiple of 256 */
            m->ffn = gpt ? 4 * m->hidden : ((8 * m->hidden / 3 + 255) / 256) * 256;
        if (model) snprintf(m->name + strlen(m->name), sizeof m->name - strlen(m->name), "%s", "*");
    }
    /* rotary and ALiBi models take longer sequences; a learned table does not */
    if (seq && seq > m->max_seq && !zo_model_position_rows(m)) m->max_seq = (int)seq;
    if (!model && seq) m->max_seq = (int)seq;
    return zo_model_config_validate(m);
}

static int cmd_estimate(int argc, char **argv)
{
    const char *model = NULL;
    uint64_t params_n = 0;
    plan_hw_flags hf = {0};
    plan_hw_basis basis;
    long gpus = 0, seq = 0, global_batch = 0, v;
    const char *svg_path = NULL, *plan_path = NULL, *plan_out = NULL, *json_out = NULL;
    shape_flags sf = {0};
    int json = 0, dtype_set = 0, grad_dtype_set = 0, grads_set = 0, dropout = -1;
    plan_train t;
    zo_model_config m;
    /* flags are parsed twice: first the model (the defaults depend on it) */
    struct {
        int set;
        long v;
    } i_dp = {0}, i_tp = {0}, i_pp = {0};
    plan_train f; /* flag values, applied over the defaults */
    memset(&f, 0, sizeof f);
    unsigned char seen[OPT_HELP + 1] = {0};
    double opt_frac[ZO_PLAN_TIERS] = {1, 0, 0};
    zo_plan_tier params_on = ZO_PLAN_GPU, grads_on = ZO_PLAN_GPU, ck_on = ZO_PLAN_GPU;
    method_flags mf;
    method_flags_init(&mf);
    zo_status st = ZO_OK;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":", estimate_opts, NULL)) != -1) {
        if (c >= OPT_MODEL && c <= OPT_HELP) seen[c] = 1;
        if (parse_hw_flag(c, optarg, &hf, &st) || parse_method_flag(c, optarg, &mf, &st)) {
            if (st) return fail();
            continue;
        }
        switch (c) {
        case OPT_MODEL: model = optarg; break;
        case OPT_PARAMS:
            /* --params is both a placement (gpu|cpu|nvme) and a size */
            if (!strcasecmp(optarg, "gpu") || !strcasecmp(optarg, "cpu") || !strcasecmp(optarg, "nvme"))
                st = zo_plan_tier_parse(optarg, "--params", 1, &params_on);
            else
                st = zo_parse_count(optarg, "--params", &params_n);
            break;
        case OPT_LAYERS: st = zo_parse_int(optarg, "--layers", 1, 1 << 20, &sf.layers); break;
        case OPT_HIDDEN: st = zo_parse_int(optarg, "--hidden", 1, 1 << 24, &sf.hidden); break;
        case OPT_HEADS: st = zo_parse_int(optarg, "--heads", 1, 1 << 20, &sf.heads); break;
        case OPT_KV_HEADS: st = zo_parse_int(optarg, "--kv-heads", 1, 1 << 20, &sf.kv_heads); break;
        case OPT_FFN: st = zo_parse_int(optarg, "--ffn", 1, 1 << 26, &sf.ffn); break;
        case OPT_VOCAB: st = zo_parse_int(optarg, "--vocab", 1, 1 << 26, &sf.vocab); break;
        case OPT_ARCH: sf.arch = optarg; break;
        case OPT_GPUS: st = zo_parse_int(optarg, "--gpus", 1, 1 << 24, &gpus); break;
        case OPT_SEQ: st = field_int(optarg, "--seq", "training.seq", &seq); break;
        case OPT_MICRO_BATCH: st = field_int(optarg, "--micro-batch", "training.micro_batch", &v); f.micro_batch = (int)v; break;
        case OPT_GRAD_ACCUM: st = field_int(optarg, "--grad-accum", "training.grad_accum", &v); f.grad_accum = (int)v; break;
        case OPT_DTYPE: st = zo_dtype_parse(optarg, &f.dtype); dtype_set = 1; break;
        case OPT_GRAD_DTYPE: st = zo_dtype_parse(optarg, &f.grad_dtype); grad_dtype_set = 1; break;
        case OPT_OPTIM: st = zo_plan_optimizer_parse(optarg, "--optim", &f.optimizer); break;
        case OPT_DP: st = field_int(optarg, "--dp", "parallel.dp", &i_dp.v); i_dp.set = 1; break;
        case OPT_TP: st = field_int(optarg, "--tp", "parallel.tp", &i_tp.v); i_tp.set = 1; break;
        case OPT_PP: st = field_int(optarg, "--pp", "parallel.pp", &i_pp.v); i_pp.set = 1; break;
        case OPT_SP: f.sp = 1; break;
        case OPT_VPP: st = field_int(optarg, "--vpp", "parallel.vpp", &v); f.vpp = (int)v; break;
        case OPT_ZERO: st = field_int(optarg, "--zero", "parallel.zero", &v); f.zero = (int)v; break;
        case OPT_RECOMPUTE: st = zo_plan_recompute_parse(optarg, "--recompute", &f.recompute); break;
        case OPT_NO_FLASH: break;
        case OPT_DROPOUT: dropout = 1; break;
        case OPT_NO_DROPOUT: dropout = 0; break;
        case OPT_GRADS: st = zo_plan_tier_parse(optarg, "--grads", 0, &grads_on); grads_set = 1; break;
        case OPT_OPTIMIZER: st = zo_plan_fractions_parse(optarg, "--optimizer", 1, opt_frac); break;
        case OPT_CHECKPOINTS: st = zo_plan_tier_parse(optarg, "--checkpoints", 0, &ck_on); break;
        case OPT_CUDA_CONTEXT:
            st = field_u64(optarg, "--cuda-context", "buffers.cuda_context", 0, &f.buf.cuda_context);
            break;
        case OPT_CUBLAS_WS:
            st = field_u64(optarg, "--cublas-workspace", "buffers.cublas_workspace", 0,
                           &f.buf.cublas_workspace);
            break;
        case OPT_COMM_BUCKET:
            st = field_u64(optarg, "--comm-bucket", "buffers.comm_bucket_elems", 1, &f.buf.comm_bucket);
            break;
        case OPT_COMM_BUCKETS: st = field_int(optarg, "--comm-buckets", "buffers.comm_buckets", &v); f.buf.comm_buckets = (int)v; break;
        case OPT_PREFETCH: st = field_int(optarg, "--prefetch", "buffers.prefetch_depth", &v); f.buf.prefetch_depth = (int)v; break;
        case OPT_PINNED:
            st = field_u64(optarg, "--pinned-staging", "buffers.pinned_staging", 0, &f.buf.pinned_staging);
            break;
        case OPT_FRAG:
            st = field_double(optarg, "--fragmentation", "buffers.fragmentation", &f.buf.fragmentation);
            break;
        case OPT_SUB_GROUP:
            st = field_u64(optarg, "--sub-group", "nvme.sub_group", 1, &f.buf.sub_group);
            break;
        case OPT_SWAP_BUFFERS: st = field_int(optarg, "--swap-buffers", "nvme.swap_buffers", &v); f.buf.swap_buffers = (int)v; break;
        case OPT_EP: st = field_int(optarg, "--ep", "parallel.ep", &v); f.ep = (int)v; break;
        case OPT_CAPACITY:
            st = field_double(optarg, "--capacity-factor", "parallel.capacity_factor",
                              &f.capacity_factor);
            break;
        case OPT_NO_DP_OVERLAP: case OPT_FUSED_ACCUM: break;
        case OPT_JSON: json = 1; break;
        case OPT_JSON_OUT: json_out = optarg; break;
        case OPT_GLOBAL_BATCH: st = zo_parse_int(optarg, "--global-batch", 1, 1 << 30, &global_batch); break;
        case OPT_SVG: svg_path = optarg; break;
        case OPT_PLAN: plan_path = optarg; break;
        case OPT_PLAN_OUT: plan_out = optarg; break;
        case OPT_HELP: fputs(usage_estimate, stdout); return 0;
        case ':':
            fprintf(stderr, "memplan: %s needs a value (see 'memplan estimate --help')\n",
                    argv[optind - 1]);
            return EXIT_BADINPUT;
        default:
            fprintf(stderr, "memplan: unknown option '%s' (see 'memplan estimate --help')\n",
                    argv[optind - 1]);
            return EXIT_BADINPUT;
        }
        if (st) return fail();
    }
    if (optind < argc) {
        unexpected_argument("estimate", argc, argv);
        return fail();
    }
    plan_hw hw;
    if (plan_path) {
        /* a plan file says everything; only the output flags combine with it */
        for (int k = OPT_MODEL; k <= OPT_FUSED_ACCUM; k++)
            if (seen[k]) {
                zo_error(ZO_ERR_INVALID, "--plan: the plan file fixes the model, hardware and "
                                         "configuration; give only --json, --json-out, --svg or "
                                         "--plan-out "
                                         "with it");
                return fail();
            }
        char *text;
        if ((st = read_text(plan_path, &text)) != ZO_OK) return fail();
        st = plan_file_parse(text, plan_path, &m, &hw, &t);
        free(text);
        if (st) return fail();
        plan_hw_basis_init(&basis, PLAN_HW_PLAN, plan_path, 0, &hw);
        goto estimate;
    }
    if ((st = build_model(model, params_n, &sf, seq, &m)) != ZO_OK) return fail();

    if ((st = build_hw(&hf, &hw, &basis)) != ZO_OK) return fail();

    plan_train_defaults(&t, &m);
    plan_train_fit_hw(&t, &hw);
    if (seq) t.seq = (int)seq;
    t.seq_is_default = !seq;
    if (f.micro_batch) t.micro_batch = f.micro_batch;
    if (f.grad_accum) t.grad_accum = f.grad_accum;
    if (dtype_set) t.dtype = t.grad_dtype = f.dtype;
    if (grad_dtype_set) t.grad_dtype = f.grad_dtype;
    t.optimizer = f.optimizer;
    t.tp = i_tp.set ? (int)i_tp.v : 1;
    t.pp = i_pp.set ? (int)i_pp.v : 1;
    long model_par = (long)t.tp * t.pp;
    if (i_dp.set) {
        t.dp = (int)i_dp.v;
    } else if (gpus) {
        if (gpus % model_par) {
            zo_error(ZO_ERR_INVALID, "--tp %d x --pp %d = %ld does not divide --gpus %ld", t.tp,
                     t.pp, model_par, gpus);
            return fail();
        }
        t.dp = (int)(gpus / model_par);
    } else {
        /* fill the preset's GPUs with data parallelism where they divide */
        t.dp = hw.gpus % model_par ? 1 : (int)(hw.gpus / model_par);
        if (t.dp < 1) t.dp = 1;
    }
    hw.gpus = gpus ? (int)gpus : (int)((long)t.dp * model_par);
    gpu_node_size(&hf, &basis, &hw);
    if (f.vpp) t.vpp = f.vpp;
    t.sp = f.sp;
    t.zero = f.zero;
    t.recompute = f.recompute;
    if (seen[OPT_NO_FLASH]) t.flash_attn = 0;
    if (dropout >= 0) t.dropout = dropout;
    t.params_on = params_on;
    memcpy(t.opt_frac, opt_frac, sizeof opt_frac);
    /* the CPU optimizer needs the gradients on the host: follow it unless told */
    t.grads_on = grads_set ? grads_on : (opt_frac[ZO_PLAN_GPU] < 1 ? ZO_PLAN_CPU : ZO_PLAN_GPU);
    t.checkpoints_on = ck_on;
    if (seen[OPT_CUDA_CONTEXT]) t.buf.cuda_context = f.buf.cuda_context;
    if (seen[OPT_CUBLAS_WS]) t.buf.cublas_workspace = f.buf.cublas_workspace;
    if (seen[OPT_COMM_BUCKET]) t.buf.comm_bucket = f.buf.comm_bucket;
    if (seen[OPT_COMM_BUCKETS]) t.buf.comm_buckets = f.buf.comm_buckets;
    if (seen[OPT_PREFETCH]) t.buf.prefetch_depth = f.buf.prefetch_depth;
    if (seen[OPT_PINNED]) t.buf.pinned_staging = f.buf.pinned_staging;
    if (seen[OPT_FRAG]) t.buf.fragmentation = f.buf.fragmentation;
    if (seen[OPT_SUB_GROUP]) t.buf.sub_group = f.buf.sub_group;
    if (seen[OPT_SWAP_BUFFERS]) t.buf.swap_buffers = f.buf.swap_buffers;
    if (f.ep) t.ep = f.ep;
    t.capacity_factor = f.capacity_factor;
    if (seen[OPT_NO_DP_OVERLAP]) t.dp_overlap = 0;
    if (seen[OPT_FUSED_ACCUM]) t.fused_grad_accum = 1;
    if ((st = apply_method_flags(&mf, &t)) != ZO_OK) return fail();

    if (global_batch) {
        long per = (long)t.micro_batch * t.dp;
        if (seen[OPT_GRAD_ACCUM]) {
            zo_error(ZO_ERR_INVALID, "--global-batch and --grad-accum exclude each other");
            return fail();
        }
        if (global_batch % per) {
            zo_error(ZO_ERR_INVALID,
                     "--global-batch %ld is not a multiple of --micro-batch %d x DP %d = %ld",
                     global_batch, t.micro_batch, t.dp, per);
            return fail();
        }
        t.grad_accum = (int)(global_batch / per);
    }

    plan_estimate e;
    plan_time pt;
estimate:
    if ((st = plan_estimate_run(&m, &hw, &t, &e)) != ZO_OK) return fail();
    warn(&t, &hw);
    if ((st = plan_time_run(&m, &hw, &t, &e, &pt)) != ZO_OK) return fail();
    plan_suggestions sg = {0};
    if (!e.fits && (st = plan_suggest(&m, &hw, &t, &sg)) != ZO_OK) return fail();
    if (json || json_out) {
        cJSON *doc = plan_report_json(&m, &hw, &t, &e, &pt, &sg);
        cJSON_AddItemToObject(cJSON_GetObjectItem(doc, "hardware"), "basis",
                              plan_hw_basis_json(&hw, &basis));
        if ((st = emit_json(doc, json, json_out)) != ZO_OK) return fail();
    }
    if (!json) {
        plan_report_basis(stdout, &hw, &basis);
        plan_report_table(stdout, &m, &hw, &t, &e, &pt, &sg);
    }
    if (svg_path && (st = write_svg(svg_path, &m, &hw, &t, &e, &pt)) != ZO_OK) return fail();
    if (plan_out) {
        cJSON *doc;
        if ((st = plan_file_json(&m, &hw, &t, &e, &pt, plan_out, &doc)) != ZO_OK) return fail();
        st = zo_file_write_json(plan_out, doc);
        cJSON_Delete(doc);
        if (st) return fail();
        if (!json) printf("\nplan written to %s (train --plan %s)\n", plan_out, plan_out);
    }
    return e.fits ? 0 : EXIT_NOFIT;
}

/* ---- memplan plan / max-model ------------------------------------------------------- */

static const char usage_plan[] =
    "usage: memplan plan --model NAME|CONFIG.json [options]\n"
    "\n"
    "Search every DP x TP x PP layout, ZeRO stage, sequence parallelism, recompute,\n"
    "micro-batch, interleaving, placement of weights / gradients / optimizer state\n"
    "(fractions) / checkpoints across GPU, CPU and NVMe, prefetch depth, and the CPU\n"
    "optimizer's schedule (serial, overlap, dpu); keep what fits; rank by predicted step time.\n"
    "\n"
    "  --model, --params, --layers ... --arch   the model, as for 'memplan estimate'\n"
    "  --hw NAME|FILE          machine preset or calibrated profile (default h100-80gb)\n"
    "  --gpu NAME [--host NAME]  one GPU preset in a host (rtx-4090, l40s, ...; 'memplan hardware')\n"
    "  --gpus N                GPUs in the job (default: the preset's)\n"
    "  --max-gpus N            also try fewer GPUs (powers of two and whole nodes up to N)\n"
    "  --gpus-per-node N, --gpu-mem SIZE, --cpu-mem SIZE, --nvme SIZE, --pcie LINK\n"
    "                          hardware overrides, named in the report's first lines\n"
    "  --seq N                 sequence length (default: the model's positions, at most 4096)\n"
    "  --global-batch N        sequences per step (default 8 x GPUs)\n"
    "  --dtype, --grad-dtype, --optim, --no-flash-attn, --dropout, --no-dropout   as for estimate\n"
    "  --lora R [--lora-targets LIST] [--lora-alpha A] [--qlora]   fine-tune adapters on a\n"
    "                          frozen base (LoRA, QLoRA), as for estimate; where the base and\n"
    "                          the adapters live is searched (--adapters-on fixes the adapters)\n"
    "  --schedule serial|overlap|dpu   fix the optimizer schedule (default: searched, each\n"
    "                          plan with the fastest); --clip-stale, --dpu-warmup N,\n"
    "                          --opt-threads N as for estimate\n"
    "  --objective time|memory|cost   rank by step time (default), GPU memory, or\n"
    "                          GPU-seconds per token\n"
    "  --zero S | --zero A-B   only these ZeRO stages      --tp N, --pp N, --ep N   fix a degree\n"
    "                          (EP, for a mixture of experts: searched over DP's divisors)\n"
    "  --recompute none|selective|full   fix recompute\n"
    "  --no-offload            everything on the GPU       --no-nvme   nothing on NVMe\n"
    "  --max-micro-batch N     largest micro-batch tried (default 16)\n"
    "  --opt-steps N           optimizer GPU/CPU/NVMe split in 1/N steps (default 10)\n"
    "  --optimizer-min TIER=F[,TIER=F]   keep at least these shares of the optimizer\n"
    "                          state on these tiers (nvme=0.1: some of it on the disk)\n"
    "  --max-prefetch N        prefetch depths tried for streamed weights (default 3)\n"
    "  --cuda-context SIZE --cublas-workspace SIZE --fragmentation F --sub-group N\n"
    "                          working buffers, as for estimate\n"
    "  --top N                 plans printed (default 5)\n"
    "  --json                  the best as a plan file (docs/plan-format.md) on stdout, instead\n"
    "                          of the table\n"
    "  --json-out FILE         write the best as a plan file to FILE (train --plan FILE)\n"
    "  --svg FILE              a picture of the best plan\n"
    "\n"
    "exit status: 0 a plan fits, 1 nothing fits, 2 bad input\n";

static const char usage_max_model[] =
    "usage: memplan max-model [--family gpt|llama|gpt3|megatron|llama2|llama3 | --model NAME]\n"
    "                         [--hw NAME|FILE | --gpu NAME [--host NAME]] [--gpus N]\n"
    "                         [--gpu-mem SIZE] [--cpu-mem SIZE] [--nvme SIZE] [--pcie LINK]\n"
    "                         [--seq N] [--strategy NAME] [--json | --json-out FILE]\n"
    "                         [--lora R [--lora-targets LIST] [--qlora]] [--schedule S]\n"
    "\n"
    "The largest model of a family that trains on the hardware, per strategy: data-parallel,\n"
    "zero-1, zero-2, zero-3, 3d-parallel, zero-offload (ZeRO-2, gradients and optimizer on\n"
    "the CPU), zero-infinity-cpu (ZeRO-3, everything on the CPU), zero-infinity-nvme\n"
    "(weights and optimizer on NVMe). Micro-batch 1; recompute, checkpoint placement and\n"
    "prefetch are searched. Shapes interpolate the family's presets (hidden a multiple of 128);\n"
    "3d-parallel searches every TP x PP layout on the widths TP divides, each as deep (in\n"
    "multiples of PP, up to twice the family's depth) as fits.\n"
    "With --lora (and --qlora) every size is fine-tuned with adapters on a frozen base. The\n"
    "optimizer schedule is searched unless --schedule fixes it; the flags name the one taken.\n"
    "Each row also gives the estimate flags that place it, and the largest preset that fits\n"
    "that way with the 'memplan estimate' command that checks it. On one GPU the ZeRO stages\n"
    "and 3-D parallelism are left out (nothing to shard) unless --strategy names one.\n"
    "--json prints the rows as JSON instead of the table; --json-out FILE writes them to FILE.\n"
    "\n"
    "exit status: 0, 2 bad input\n";

enum {
    PO_MAX_GPUS = 512, PO_OBJECTIVE, PO_TOP, PO_NO_OFFLOAD, PO_NO_NVME, PO_MAX_MB, PO_OPT_STEPS,
    PO_OPT_MIN, PO_MAX_PREFETCH, PO_JSON_FILE, PO_FAMILY, PO_STRATEGY, PO_JSON_FLAG,
};

static const struct option plan_opts[] = {
    MODEL_HW_OPTIONS,
    METHOD_OPTIONS,
    {"cuda-context", required_argument, 0, OPT_CUDA_CONTEXT},
    {"cublas-workspace", required_argument, 0, OPT_CUBLAS_WS},
    {"fragmentation", required_argument, 0, OPT_FRAG},
    {"sub-group", required_argument, 0, OPT_SUB_GROUP},
    {"global-batch", required_argument, 0, OPT_GLOBAL_BATCH},
    {"dtype", required_argument, 0, OPT_DTYPE},
    {"grad-dtype", required_argument, 0, OPT_GRAD_DTYPE},
    {"optim", required_argument, 0, OPT_OPTIM},
    {"no-flash-attn", no_argument, 0, OPT_NO_FLASH},
    {"dropout", no_argument, 0, OPT_DROPOUT},
    {"no-dropout", no_argument, 0, OPT_NO_DROPOUT},
    {"zero", required_argument, 0, OPT_ZERO},
    {"tp", required_argument, 0, OPT_TP},
    {"pp", required_argument, 0, OPT_PP},
    {"ep", required_argument, 0, OPT_EP},
    {"recompute", required_argument, 0, OPT_RECOMPUTE},
    {"svg", required_argument, 0, OPT_SVG},
    {"max-gpus", required_argument, 0, PO_MAX_GPUS},
    {"objective", required_argument, 0, PO_OBJECTIVE},
    {"top", required_argument, 0, PO_TOP},
    {"no-offload", no_argument, 0, PO_NO_OFFLOAD},
    {"no-nvme", no_argument, 0, PO_NO_NVME},
    {"max-micro-batch", required_argument, 0, PO_MAX_MB},
    {"opt-steps", required_argument, 0, PO_OPT_STEPS},
    {"optimizer-min", required_argument, 0, PO_OPT_MIN},
    {"max-prefetch", required_argument, 0, PO_MAX_PREFETCH},
    {"json", no_argument, 0, PO_JSON_FLAG},
    {"json-out", required_argument, 0, PO_JSON_FILE},
    {"family", required_argument, 0, PO_FAMILY},
    {"strategy", required_argument, 0, PO_STRATEGY},
    {"help", no_argument, 0, OPT_HELP},
    {0, 0, 0, 0},
};

/* What `plan` and `max-model` share: model, hardware, training and the space. */
typedef struct plan_args {
    const char *model, *json_path, *svg_path, *family, *strategy;
    uint64_t params_n;
    plan_hw_flags hwf;
    long gpus, seq, global_batch, max_gpus, top;
    int dtype_set, grad_dtype_set, no_flash, dropout, json_flag;
    zo_dtype dtype, grad_dtype;
    zo_plan_optimizer optim;
    shape_flags sf;
    plan_space space; /* the fields the flags set; defaults filled later */
    int zero_set, zmin, zmax;
    long tp, pp, ep, max_mb, opt_steps, max_prefetch;
    double opt_min[ZO_PLAN_TIERS];
    int recompute, no_offload, no_nvme;
    plan_objective objective;
    /* working buffers: the values, and which flags set them */
    plan_buffers buf;
    int cuda_context_set, cublas_set, frag_set, sub_group_set;
    method_flags mf;
} plan_args;

static int parse_plan_args(int argc, char **argv, plan_args *a, const char *usage, int max_model)
{
    zo_status st = ZO_OK;
    int c;
    memset(a, 0, sizeof *a);
    a->dropout = -1;
    a->recompute = -1;
    a->top = 5;
    method_flags_init(&a->mf);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":", plan_opts, NULL)) != -1) {
        long v;
        if (parse_hw_flag(c, optarg, &a->hwf, &st) || parse_method_flag(c, optarg, &a->mf, &st)) {
            if (st) return fail();
            continue;
        }
        switch (c) {
        case OPT_MODEL: a->model = optarg; break;
        case OPT_PARAMS: st = zo_parse_count(optarg, "--params", &a->params_n); break;
        case OPT_LAYERS: st = zo_parse_int(optarg, "--layers", 1, 1 << 20, &a->sf.layers); break;
        case OPT_HIDDEN: st = zo_parse_int(optarg, "--hidden", 1, 1 << 24, &a->sf.hidden); break;
        case OPT_HEADS: st = zo_parse_int(optarg, "--heads", 1, 1 << 20, &a->sf.heads); break;
        case OPT_KV_HEADS: st = zo_parse_int(optarg, "--kv-heads", 1, 1 << 20, &a->sf.kv_heads); break;
        case OPT_FFN: st = zo_parse_int(optarg, "--ffn", 1, 1 << 26, &a->sf.ffn); break;
        case OPT_VOCAB: st = zo_parse_int(optarg, "--vocab", 1, 1 << 26, &a->sf.vocab); break;
        case OPT_ARCH: a->sf.arch = optarg; break;
        case OPT_GPUS: st = zo_parse_int(optarg, "--gpus", 1, 1 << 20, &a->gpus); break;
        case OPT_SEQ: st = field_int(optarg, "--seq", "training.seq", &a->seq); break;
        case OPT_GLOBAL_BATCH: st = zo_parse_int(optarg, "--global-batch", 1, 1 << 30, &a->global_batch); break;
        case OPT_DTYPE: st = zo_dtype_parse(optarg, &a->dtype); a->dtype_set = 1; break;
        case OPT_GRAD_DTYPE: st = zo_dtype_parse(optarg, &a->grad_dtype); a->grad_dtype_set = 1; break;
        case OPT_OPTIM: st = zo_plan_optimizer_parse(optarg, "--optim", &a->optim); break;
        case OPT_NO_FLASH: a->no_flash = 1; break;
        case OPT_DROPOUT: a->dropout = 1; break;
        case OPT_NO_DROPOUT: a->dropout = 0; break;
        case OPT_ZERO: {
            char *dash = strchr(optarg, '-');
            a->zero_set = 1;
            if (dash) {
                char lo[16];
                snprintf(lo, sizeof lo, "%.*s", (int)(dash - optarg), optarg);
                st = zo_parse_int(lo, "--zero", 0, 3, &v);
                a->zmin = (int)v;
                if (!st) st = zo_parse_int(dash + 1, "--zero", a->zmin, 3, &v);
                a->zmax = (int)v;
            } else {
                st = zo_parse_int(optarg, "--zero", 0, 3, &v);
                a->zmin = a->zmax = (int)v;
            }
            break;
        }
        case OPT_TP: st = field_int(optarg, "--tp", "parallel.tp", &a->tp); break;
        case OPT_PP: st = field_int(optarg, "--pp", "parallel.pp", &a->pp); break;
        case OPT_EP: st = field_int(optarg, "--ep", "parallel.ep", &a->ep); break;
        case OPT_RECOMPUTE: {
            zo_plan_recompute r = ZO_PLAN_RECOMPUTE_NONE;
            st = zo_plan_recompute_parse(optarg, "--recompute", &r);
            a->recompute = (int)r;
            break;
        }
        case OPT_SVG: a->svg_path = optarg; break;
        case OPT_CUDA_CONTEXT:
            st = field_u64(optarg, "--cuda-context", "buffers.cuda_context", 0, &a->buf.cuda_context);
            a->cuda_context_set = 1;
            break;
        case OPT_CUBLAS_WS:
            st = field_u64(optarg, "--cublas-workspace", "buffers.cublas_workspace", 0,
                           &a->buf.cublas_workspace);
            a->cublas_set = 1;
            break;
        case OPT_FRAG:
            st = field_double(optarg, "--fragmentation", "buffers.fragmentation", &a->buf.fragmentation);
            a->frag_set = 1;
            break;
        case OPT_SUB_GROUP:
            st = field_u64(optarg, "--sub-group", "nvme.sub_group", 1, &a->buf.sub_group);
            a->sub_group_set = 1;
            break;
        case PO_MAX_GPUS: st = zo_parse_int(optarg, "--max-gpus", 1, 1 << 16, &a->max_gpus); break;
        case PO_OBJECTIVE:
            if (!strcasecmp(optarg, "time")) a->objective = PLAN_OBJ_TIME;
            else if (!strcasecmp(optarg, "memory")) a->objective = PLAN_OBJ_MEMORY;
            else if (!strcasecmp(optarg, "cost")) a->objective = PLAN_OBJ_COST;
            else st = zo_error(ZO_ERR_INVALID, "--objective: '%s' is not time, memory or cost", optarg);
            break;
        case PO_TOP: st = zo_parse_int(optarg, "--top", 1, PLAN_TOP_MAX, &a->top); break;
        case PO_NO_OFFLOAD: a->no_offload = 1; break;
        case PO_NO_NVME: a->no_nvme = 1; break;
        case PO_MAX_MB: st = zo_parse_int(optarg, "--max-micro-batch", 1, 1 << 16, &a->max_mb); break;
        case PO_OPT_STEPS: st = zo_parse_int(optarg, "--opt-steps", 1, PLAN_OPT_STEPS_MAX, &a->opt_steps); break;
        case PO_OPT_MIN: st = zo_plan_fractions_parse(optarg, "--optimizer-min", 0, a->opt_min); break;
        case PO_MAX_PREFETCH:
            st = field_int(optarg, "--max-prefetch", "buffers.prefetch_depth", &a->max_prefetch);
            break;
        case PO_JSON_FILE: a->json_path = optarg; break;
        case PO_JSON_FLAG: a->json_flag = 1; break;
        case PO_FAMILY: a->family = optarg; break;
        case PO_STRATEGY: a->strategy = optarg; break;
        case OPT_HELP: fputs(usage, stdout); return -1;
        case ':':
            fprintf(stderr, "memplan: %s needs a value (see 'memplan %s --help')\n",
                    argv[optind - 1], max_model ? "max-model" : "plan");
            return EXIT_BADINPUT;
        default:
            fprintf(stderr, "memplan: unknown option '%s' (see 'memplan %s --help')\n",
                    argv[optind - 1], max_model ? "max-model" : "plan");
            return EXIT_BADINPUT;
        }
        if (st) return fail();
    }
    if (optind < argc) {
        unexpected_argument(max_model ? "max-model" : "plan", argc, argv);
        return fail();
    }
    return 0;
}

static zo_status args_hw(const plan_args *a, plan_hw *hw, plan_hw_basis *b)
{
    zo_status st = build_hw(&a->hwf, hw, b);
    if (st) return st;
    if (a->max_gpus) hw->gpus = (int)a->max_gpus;
    else if (a->gpus) hw->gpus = (int)a->gpus;
    gpu_node_size(&a->hwf, b, hw);
    return ZO_OK;
}

static zo_status args_space(const plan_args *a, const zo_model_config *m, const plan_hw *hw,
                            plan_space *s)
{
    plan_space_defaults(s, m, hw);
    if (a->max_gpus) s->max_gpus = (int)a->max_gpus;
    if (a->seq) s->base.seq = (int)a->seq;
    s->base.seq_is_default = !a->seq;
    if (a->global_batch) s->global_batch = (int)a->global_batch;
    if (a->dtype_set) s->base.dtype = s->base.grad_dtype = a->dtype;
    if (a->grad_dtype_set) s->base.grad_dtype = a->grad_dtype;
    s->base.optimizer = a->optim;
    if (a->no_flash) s->base.flash_attn = 0;
    if (a->dropout >= 0) s->base.dropout = a->dropout;
    if (a->zero_set) {
        s->zero_min = a->zmin;
        s->zero_max = a->zmax;
    }
    s->tp = (int)a->tp;
    s->pp = (int)a->pp;
    s->ep = (int)a->ep;
    s->recompute = a->recompute;
    if (a->no_offload) s->allow_offload = 0;
    if (a->no_nvme) s->allow_nvme = 0;
    if (a->max_mb) s->max_micro_batch = (int)a->max_mb;
    if (a->opt_steps) s->opt_steps = (int)a->opt_steps;
    memcpy(s->opt_min, a->opt_min, sizeof s->opt_min);
    if (a->max_prefetch) s->max_prefetch = (int)a->max_prefetch;
    s->objective = a->objective;
    if (a->cuda_context_set) s->base.buf.cuda_context = a->buf.cuda_context;
    if (a->cublas_set) s->base.buf.cublas_workspace = a->buf.cublas_workspace;
    if (a->frag_set) s->base.buf.fragmentation = a->buf.fragmentation;
    if (a->sub_group_set) s->base.buf.sub_group = a->buf.sub_group;
    s->schedule = a->mf.schedule; /* searched unless given */
    s->adapters_on = a->mf.adapters_on;
    return apply_method_flags(&a->mf, &s->base);
}

static void print_plan_line(const plan_candidate *c, const char *lead)
{
    const plan_train *t = &c->t;
    char fr[64];
    plan_format_fractions(t->opt_frac, fr, sizeof fr);
    char ep[24] = "";
    if (t->ep > 1) snprintf(ep, sizeof ep, " (EP %d)", t->ep);
    printf("%s%d GPU%s: DP %d%s x TP %d%s x PP %d%s, ZeRO-%d, micro-batch %d x %d, recompute %s\n",
           lead, c->gpus, c->gpus == 1 ? "" : "s", t->dp, ep, t->tp, t->sp ? " (+SP)" : "", t->pp,
           t->vpp > 1 ? " (interleaved)" : "", t->zero, t->micro_batch, t->grad_accum,
           zo_plan_recompute_name(t->recompute));
    char ad[32] = "";
    if (t->method != ZO_PLAN_FULL) snprintf(ad, sizeof ad, ", adapters on %s", zo_plan_tier_name(t->adapters_on));
    printf("%s%s on %s%s, gradients on %s, optimizer on %s, checkpoints on %s, prefetch %d, "
           "optimizer schedule %s\n",
           lead, t->method == ZO_PLAN_FULL ? "weights" : "frozen base",
           zo_plan_tier_name(t->params_on), ad, zo_plan_tier_name(t->grads_on), fr,
           zo_plan_tier_name(t->checkpoints_on), t->buf.prefetch_depth, zo_plan_schedule_name(t->schedule));
    printf("%sper rank: GPU %.1f GiB, CPU %.1f GiB, NVMe %.1f GiB\n", lead,
           (double)c->total[ZO_PLAN_GPU] / (1 << 30), (double)c->total[ZO_PLAN_CPU] / (1 << 30),
           (double)c->total[ZO_PLAN_NVME] / (1 << 30));
}


static int cmd_plan(int argc, char **argv)
{
    plan_args a;
    int rc = parse_plan_args(argc, argv, &a, usage_plan, 0);
    if (rc) return rc < 0 ? 0 : rc;
    zo_status st;
    zo_model_config m;
    plan_hw hw;
    plan_hw_basis basis;
    plan_space s;
    plan_result r;
    if ((st = build_model(a.model, a.params_n, &a.sf, a.seq, &m)) != ZO_OK) return fail();
    if ((st = args_hw(&a, &hw, &basis)) != ZO_OK) return fail();
    if ((st = args_space(&a, &m, &hw, &s)) != ZO_OK) return fail();
    double t0 = zo_now();
    if ((st = plan_search(&m, &hw, &s, (int)a.top, &r)) != ZO_OK) return fail();
    double dt = zo_now() - t0;

    char cnt[32];
    static const char *obj[] = {"step time", "GPU memory", "GPU-seconds per token"};
    /* --json: stdout holds the plan alone */
    FILE *tab = a.json_flag ? fopen("/dev/null", "w") : stdout;
    if (!tab) tab = stderr;
    plan_report_basis(tab, &hw, &basis);
    fprintf(tab, "%s (%s params) on %s: %s%d x %s; seq %d%s, global batch %d; ranked by %s\n", m.name,
            zo_format_count(zo_model_params(&m), cnt, sizeof cnt), hw.name,
            s.max_gpus ? "up to " : "", hw.gpus, hw.gpu, s.base.seq,
            s.base.seq_is_default ? " (default: the model's positions, at most 4096)" : "",
            s.global_batch, obj[s.objective]);
    fprintf(tab, "searched %llu configurations (%llu fit) in %.2f s: %.3g configurations/s\n",
           (unsigned long long)r.configs, (unsigned long long)r.feasible, dt,
           dt > 0 ? (double)r.configs / dt : 0.0);
    if (r.n_best == 0) {
        fprintf(a.json_flag ? stderr : tab, "\nnothing fits: more GPUs (--gpus / --max-gpus), a shorter "
                "--seq or a smaller --global-batch%s\n",
                s.allow_offload ? "" : ", or allow offload (drop --no-offload)");
        if (tab != stdout && tab != stderr) fclose(tab);
        return EXIT_NOFIT;
    }
    const plan_candidate *b = &r.best[0];
    fprintf(tab, "\nbest: %.4g s per step, %.4g tokens/s, MFU %.1f%%\n", b->time.step,
            b->time.tokens_per_s, 100 * b->time.mfu);
    if (!a.json_flag) print_plan_line(b, "  ");
    char why[2048];
    plan_explain(&m, &hw, b, why, sizeof why);
    for (char *sv = NULL, *line = strtok_r(why, "\n", &sv); line; line = strtok_r(NULL, "\n", &sv))
        fprintf(tab, "  - %s\n", line);
    plan_report_time_table(tab, &b->time);
    for (int i = 1; i < r.n_best; i++) {
        char d[1024];
        plan_describe_diff(b, &r.best[i], d, sizeof d);
        fprintf(tab, "\n%d. %.4g s per step: %s\n", i + 1, r.best[i].time.step, d);
    }
    if (tab != stdout && tab != stderr) fclose(tab);

    if (a.json_path || a.json_flag || a.svg_path) {
        plan_hw h = hw;
        h.gpus = b->gpus;
        plan_estimate e;
        plan_time pt;
        if ((st = plan_estimate_run(&m, &h, &b->t, &e)) != ZO_OK ||
            (st = plan_time_run(&m, &h, &b->t, &e, &pt)) != ZO_OK)
            return fail();
        if (a.json_path || a.json_flag) {
            cJSON *doc;
            const char *what = a.json_path ? a.json_path : "the plan";
            if ((st = plan_file_json(&m, &h, &b->t, &e, &pt, what, &doc)) != ZO_OK) return fail();
            if ((st = emit_json(doc, a.json_flag, a.json_path)) != ZO_OK) return fail();
            if (a.json_path && !a.json_flag)
                printf("\nplan written to %s (memplan estimate --plan %s; train --plan %s)\n",
                       a.json_path, a.json_path, a.json_path);
        }
        if (a.svg_path && (st = write_svg(a.svg_path, &m, &h, &b->t, &e, &pt)) != ZO_OK)
            return fail();
    }
    return 0;
}

/* `m` trained as the searched plan `ct` trains its shape: the estimate's
 * defaults for `m` with the plan's layout, batch, recompute and placement. */
static void preset_config(const zo_model_config *m, const plan_train *ct, plan_train *x)
{
    plan_train_defaults(x, m);
    x->seq = ct->seq;
    x->micro_batch = ct->micro_batch;
    x->grad_accum = ct->grad_accum;
    x->dp = ct->dp;
    x->tp = ct->tp;
    x->pp = ct->pp;
    x->vpp = ct->vpp;
    x->sp = ct->sp;
    x->zero = ct->zero;
    x->recompute = ct->recompute;
    x->params_on = ct->params_on;
    x->grads_on = ct->grads_on;
    x->checkpoints_on = ct->checkpoints_on;
    memcpy(x->opt_frac, ct->opt_frac, sizeof x->opt_frac);
    x->buf.prefetch_depth = ct->buf.prefetch_depth;
    x->method = ct->method;
    x->lora = ct->lora;
    x->adapters_on = ct->adapters_on;
    x->schedule = ct->schedule;
    x->dpu_warmup = ct->dpu_warmup;
    x->opt_threads = ct->opt_threads;
    x->clip_stale = ct->clip_stale;
}

/* The largest preset of the shape's architecture, at most `n` parameters,
 * that fits with the plan `c` found for the strategy (NULL: none does). */
static const zo_model_preset *largest_preset(const zo_model_config *shape, const plan_candidate *c,
                                             uint64_t n, const plan_hw *hw, plan_train *t,
                                             plan_time *pt)
{
    size_t np;
    const zo_model_preset *p = zo_model_presets(&np), *best = NULL;
    uint64_t best_n = 0;
    plan_hw h = *hw;
    h.gpus = c->gpus;
    for (size_t i = 0; i < np; i++) {
        const zo_model_config *m = &p[i].cfg;
        uint64_t pn = zo_model_params(m);
        if (m->arch != shape->arch || pn > n || pn <= best_n) continue;
        plan_train x;
        plan_estimate e;
        plan_time tt;
        preset_config(m, &c->t, &x);
        if (plan_estimate_run(m, &h, &x, &e) != ZO_OK || !e.fits ||
            plan_time_run(m, &h, &x, &e, &tt) != ZO_OK)
            continue;
        best = &p[i];
        best_n = pn;
        *t = x;
        *pt = tt;
    }
    return best;
}

/* tokens/s: whole above 100, three digits below */
static const char *fmt_rate(double v, char *buf, size_t len)
{
    if (v >= 100) snprintf(buf, len, "%.0f", v);
    else snprintf(buf, len, "%.3g", v);
    return buf;
}

/* One strategy's row: the largest model, its step, the flags that place it,
 * and the largest preset that fits with the command that checks it; printed
 * when `print`, added to the JSON rows when rows is not NULL. */
static void print_max_model_row(plan_strategy strat, const zo_model_config *shape,
                                const plan_candidate *c, uint64_t n, const plan_hw *hw,
                                const plan_hw_basis *basis, cJSON *rows, int print)
{
    char cnt[32], shp[32], flags[256], hwflags[512], pre[96] = "none", rate[32], prate[32];
    snprintf(shp, sizeof shp, "%dx%d", shape->n_layers, shape->hidden);
    plan_train d, x;
    plan_time pt;
    plan_train_defaults(&d, shape);
    d.seq = c->t.seq;
    plan_train_flags(&d, &c->t, flags, sizeof flags);
    const zo_model_preset *p = largest_preset(shape, c, n, hw, &x, &pt);
    if (p)
        snprintf(pre, sizeof pre, "%s (%.3g s, %s)", p->name, pt.step,
                 fmt_rate(pt.tokens_per_s, prate, sizeof prate));
    cJSON *row = rows ? cJSON_CreateObject() : NULL;
    if (row) {
        cJSON_AddStringToObject(row, "strategy", plan_strategy_name(strat));
        cJSON_AddNumberToObject(row, "params", (double)n);
        cJSON_AddNumberToObject(row, "layers", shape->n_layers);
        cJSON_AddNumberToObject(row, "hidden", shape->hidden);
        cJSON_AddNumberToObject(row, "step_s", c->time.step);
        cJSON_AddNumberToObject(row, "tokens_per_s", c->time.tokens_per_s);
        cJSON_AddStringToObject(row, "flags", flags);
        cJSON_AddItemToArray(rows, row);
    }
    if (print) {
        printf("%-20s %8s  %-12s %9.3g s %9s  %s\n", plan_strategy_name(strat),
               zo_format_count(n, cnt, sizeof cnt), shp, c->time.step,
               fmt_rate(c->time.tokens_per_s, rate, sizeof rate), pre);
        printf("    flags: %s\n", flags[0] ? flags : "(the defaults)");
    }
    if (!p) {
        if (row) cJSON_AddNullToObject(row, "preset");
        return;
    }
    plan_train_defaults(&d, &p->cfg);
    d.seq = x.seq;
    plan_train_flags(&d, &x, flags, sizeof flags);
    plan_hw_basis_flags(basis, hwflags, sizeof hwflags);
    char check[1024];
    snprintf(check, sizeof check, "memplan estimate --model %s%s%s --seq %d%s%s", p->name,
             hwflags[0] ? " " : "", hwflags, x.seq, flags[0] ? " " : "", flags);
    if (print) printf("    check: %s\n", check);
    if (!row) return;
    cJSON *pr = cJSON_AddObjectToObject(row, "preset");
    cJSON_AddStringToObject(pr, "name", p->name);
    cJSON_AddNumberToObject(pr, "step_s", pt.step);
    cJSON_AddNumberToObject(pr, "tokens_per_s", pt.tokens_per_s);
    cJSON_AddStringToObject(pr, "check", check);
}

static int cmd_max_model(int argc, char **argv)
{
    plan_args a;
    int rc = parse_plan_args(argc, argv, &a, usage_max_model, 1);
    if (rc) return rc < 0 ? 0 : rc;
    zo_status st;
    plan_hw hw;
    const char *family = a.family;
    zo_model_config ref;
    if (!family && a.model) {
        if ((st = build_model(a.model, 0, &a.sf, a.seq, &ref)) != ZO_OK) return fail();
        family = ref.family;
    }
    if (!family) family = "gpt";
    if ((st = plan_family_shape(family, 1e9, &ref)) != ZO_OK) return fail();
    plan_hw_basis basis;
    if ((st = args_hw(&a, &hw, &basis)) != ZO_OK) return fail();
    int only = -1;
    if (a.strategy) {
        for (int i = 0; i < PLAN_STRATEGIES; i++)
            if (!strcasecmp(a.strategy, plan_strategy_name((plan_strategy)i))) only = i;
        if (only < 0) {
            zo_error(ZO_ERR_INVALID, "--strategy: '%s' is not one of data-parallel, zero-1, zero-2, "
                                     "zero-3, 3d-parallel, zero-offload, zero-infinity-cpu, "
                                     "zero-infinity-nvme", a.strategy);
            return fail();
        }
    }
    plan_space base;
    if ((st = args_space(&a, &ref, &hw, &base)) != ZO_OK) return fail();
    base.base.seq = a.seq ? (int)a.seq : 0;
    /* --json / --json-out: the rows as JSON (docs/memplan-json.md) */
    cJSON *rows = a.json_flag || a.json_path ? cJSON_CreateArray() : NULL;
    int one = hw.gpus == 1 && only < 0; /* on one GPU ZeRO and 3-D parallelism shard nothing */
    if (!a.json_flag) {
        plan_report_basis(stdout, &hw, &basis);
        printf("\nlargest %s model on %d x %s (%.2f GiB CPU memory, %.2f TB NVMe per node), seq %d%s; "
               "micro-batch 1\n",
               family, hw.gpus, hw.gpu, (double)hw.cpu_mem / (1 << 30), hw.nvme / 1e12,
               a.seq ? (int)a.seq : ref.max_seq, a.seq ? "" : " (the family's)");
        if (one)
            printf("one GPU: ZeRO-1/2/3 and 3-D parallelism shard nothing; data-parallel stands for "
                   "them\n");
        printf("\n%-20s %8s  %-12s %11s %9s  %s\n", "strategy", "largest", "shape (LxH)", "step",
               "tokens/s", "largest preset that fits (step s, tokens/s)");
    }
    for (int i = 0; i < PLAN_STRATEGIES; i++) {
        if (only >= 0 && i != only) continue;
        if (one && i >= PLAN_STRAT_ZERO1 && i <= PLAN_STRAT_3D) continue;
        zo_model_config shape;
        plan_candidate c;
        uint64_t n;
        if ((st = plan_max_model(family, &hw, &base, (plan_strategy)i, &shape, &c, &n)) != ZO_OK) {
            cJSON_Delete(rows);
            return fail();
        }
        if (n) {
            print_max_model_row((plan_strategy)i, &shape, &c, n, &hw, &basis, rows, !a.json_flag);
            continue;
        }
        if (!a.json_flag) printf("%-20s %8s\n", plan_strategy_name((plan_strategy)i), "none fits");
        if (rows) { /* none fits: a row of 0 parameters */
            cJSON *row = cJSON_CreateObject();
            cJSON_AddStringToObject(row, "strategy", plan_strategy_name((plan_strategy)i));
            cJSON_AddNumberToObject(row, "params", 0);
            cJSON_AddItemToArray(rows, row);
        }
    }
    if (rows && (st = emit_json(rows, a.json_flag, a.json_path)) != ZO_OK) return fail();
    return 0;
}

/* ---- memplan calibrate ----------------------------------------------------------- */

static const char usage_calibrate[] =
    "usage: memplan calibrate [--json | --json-out FILE] [--base PRESET] [--nvme-dir DIR] [--threads N]\n"
    "                         [--adam-params N] [--seconds S] [--nvme-bytes SIZE]\n"
    "\n"
    "Measure this machine and write a hardware profile (JSON) that '--hw FILE' reads:\n"
    "CPU memory size and cores, memory bandwidth (a triad), CPU AdamW parameters/s\n"
    "(cpu_adam), and the free space and write/read rates of --nvme-dir (a file of\n"
    "--nvme-bytes, default 512MiB, through the nvme module's io_uring engine). What cannot\n"
    "be measured here (the GPU, PCIe) comes from --base (default h100-80gb; a machine or a\n"
    "GPU preset such as rtx-4090, 'memplan hardware'); the profile's\n"
    "\"note\" says which. --json (the default) prints it to stdout; --json-out FILE (or\n"
    "--out FILE) writes it to FILE.\n";

static int cmd_calibrate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"out", required_argument, 0, 'o'},      {"json-out", required_argument, 0, 'o'},
        {"json", no_argument, 0, 'j'},           {"base", required_argument, 0, 'b'},
        {"nvme-dir", required_argument, 0, 'n'}, {"threads", required_argument, 0, 't'},
        {"adam-params", required_argument, 0, 'a'}, {"seconds", required_argument, 0, 's'},
        {"nvme-bytes", required_argument, 0, 'N'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0},
    };
    plan_calibrate_opts o;
    plan_calibrate_defaults(&o);
    const char *out = NULL;
    zo_status st = ZO_OK;
    long v;
    uint64_t n;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'j': break; /* stdout: the default */
        case 'b': o.base = optarg; break;
        case 'n': o.nvme_dir = optarg; break;
        case 't': st = zo_parse_int(optarg, "--threads", 1, 4096, &v); o.threads = (int)v; break;
        case 'a': st = zo_parse_count(optarg, "--adam-params", &n); o.adam_params = (size_t)n; break;
        case 's': st = zo_parse_double(optarg, "--seconds", 0.01, 600, &o.seconds); break;
        case 'N': st = zo_parse_size(optarg, "--nvme-bytes", 0, &n); o.nvme_bytes = (size_t)n; break;
        case 'h': fputs(usage_calibrate, stdout); return 0;
        case ':':
            fprintf(stderr, "memplan: %s needs a value (see 'memplan calibrate --help')\n", argv[optind - 1]);
            return EXIT_BADINPUT;
        default:
            fprintf(stderr, "memplan: unknown option '%s' (see 'memplan calibrate --help')\n", argv[optind - 1]);
            return EXIT_BADINPUT;
        }
        if (st) return fail();
    }
    if (optind < argc) {
        unexpected_argument("calibrate", argc, argv);
        return fail();
    }
    plan_hw hw;
    if ((st = plan_calibrate_run(&o, &hw)) != ZO_OK) return fail();
    cJSON *doc = plan_hw_json(&hw);
    if (out) {
        st = zo_file_write_json(out, doc);
        cJSON_Delete(doc);
        if (st) return fail();
        fprintf(stderr, "memplan: profile written to %s: CPU AdamW %.3g params/s (%.3g on one "
                        "thread), memory %.3g GB/s, %.1f GiB RAM, %d cores (%s)\n",
                out, hw.cpu_adam_rate, hw.cpu_adam_thread_rate, hw.cpu_mem_bw / 1e9,
                (double)hw.cpu_mem / (1 << 30), hw.cpu_cores, hw.note);
        return 0;
    }
    char *text = doc ? cJSON_Print(doc) : NULL;
    cJSON_Delete(doc);
    if (!text) {
        fprintf(stderr, "memplan: out of memory printing JSON\n");
        return EXIT_BADINPUT;
    }
    puts(text);
    free(text);
    return 0;
}

static int cmd_models(void)
{
    size_t n;
    const zo_model_preset *p = zo_model_presets(&n);
    printf("%-16s %-6s %6s %7s %6s %5s %7s %7s %6s %18s\n", "name", "arch", "layers", "hidden",
           "heads", "kv", "ffn", "vocab", "seq", "params");
    for (size_t i = 0; i < n; i++) {
        const zo_model_config *c = &p[i].cfg;
        char cnt[32];
        uint64_t np = zo_model_params(c);
        printf("%-16s %-6s %6d %7d %6d %5d %7d %7d %6d %18llu (%s)\n", p[i].name,
               zo_arch_name(c->arch), c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->ffn,
               c->vocab, c->max_seq, (unsigned long long)np, zo_format_count(np, cnt, sizeof cnt));
    }
    printf("\nAlso: --model PATH/config.json (Hugging Face), --params N, or a custom shape.\n");
    /* the config.json families by model_type: sized exactly, or refused */
    const zo_family_info *fi = zo_model_families(&n);
    printf("\nconfig.json families (model_type; * = the runtime trains it too):\n");
    for (size_t i = 0; i < n; i++)
        if (fi[i].modelled)
            printf("  %-16s%s %s\n", fi[i].model_type, fi[i].trainable ? "*" : " ", fi[i].what);
    printf("refused by name:\n");
    for (size_t i = 0; i < n; i++)
        if (!fi[i].modelled) printf("  %-17s %s\n", fi[i].model_type, fi[i].what);
    return 0;
}

static int cmd_hardware(void)
{
    size_t n;
    const plan_hw_preset *p = plan_hw_presets(&n);
    printf("machines (--hw NAME):\n");
    printf("%-15s %-60s %10s %10s %9s %9s\n", "name", "summary", "GPU mem", "PCIe", "NVMe rd",
           "NVMe wr");
    for (size_t i = 0; i < n; i++) {
        char mem[32];
        printf("%-15s %-60s %10s %7.0f GB/s %5.1f GB/s %5.1f GB/s\n", p[i].name, p[i].summary,
               zo_format_bytes(p[i].hw.gpu_mem, mem, sizeof mem), p[i].hw.pcie_bw / 1e9,
               p[i].hw.nvme_read_bw / 1e9, p[i].hw.nvme_write_bw / 1e9);
    }
    const plan_gpu_spec *g = plan_gpu_presets(&n);
    printf("\nGPUs (--gpu NAME [--host NAME]; datasheet figures, dense; docs/memplan.md cites "
           "each):\n");
    printf("%-15s %-36s %10s %15s %10s %8s %10s %-11s\n", "name", "product", "memory",
           "bf16 TFLOPS*", "fp16acc16", "TF32", "mem GB/s", "PCIe, host");
    for (size_t i = 0; i < n; i++) {
        char mem[32], acc16[16] = "-";
        if (g[i].tensor_16_acc16 > 0) snprintf(acc16, sizeof acc16, "%.4g", g[i].tensor_16_acc16 / 1e12);
        printf("%-15s %-36s %10s %15.4g %10s %8.4g %10.4g %d.0 x%d, %s\n", g[i].name, g[i].product,
               zo_format_bytes(g[i].mem, mem, sizeof mem), g[i].tensor_16 / 1e12, acc16,
               g[i].tensor_32 / 1e12, g[i].mem_bw / 1e9, g[i].pcie_gen, g[i].pcie_lanes, g[i].host);
    }
    printf("  * fp16/bf16 tensor with fp32 accumulation, the rate training gets (GeForce cards run "
           "it at half\n    their fp16-accumulate rate, fp16acc16)\n");
    const plan_host_spec *h = plan_host_presets(&n);
    printf("\nhosts (--host NAME, with --gpu):\n");
    for (size_t i = 0; i < n; i++)
        printf("%-15s %s; NVMe read %.4g, write %.4g GB/s\n", h[i].name, h[i].summary,
               h[i].nvme_read_bw / 1e9, h[i].nvme_write_bw / 1e9);
    printf("\nOverride with --gpus --gpus-per-node --gpu-mem --cpu-mem --nvme --pcie (CPU memory and "
           "NVMe are per node).\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_main, stderr);
        return EXIT_BADINPUT;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        fputs(usage_main, stdout);
        return 0;
    }
    if (!strcmp(cmd, "estimate")) return cmd_estimate(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return cmd_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "max-model")) return cmd_max_model(argc - 1, argv + 1);
    if (!strcmp(cmd, "calibrate")) return cmd_calibrate(argc - 1, argv + 1);
    if (!strcmp(cmd, "models")) return cmd_models();
    if (!strcmp(cmd, "hardware")) return cmd_hardware();
    fprintf(stderr, "memplan: unknown command '%s' (commands: estimate, plan, max-model, calibrate, models, hardware; see "
                    "'memplan --help')\n", cmd);
    return EXIT_BADINPUT;
}
