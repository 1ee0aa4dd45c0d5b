/* memplan: size a transformer's training on given hardware.
 *
 *   memplan estimate [options]   bytes per rank, per tier and kind; fits or not
 *   memplan models               the model presets with shapes and parameter counts
 *   memplan hardware             the hardware presets
 *
 * Exit status: 0 fits (or a listing), 1 does not fit, 2 bad input. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "common/model_config.h"
#include "common/units.h"
#include "planner/hardware.h"
#include "planner/memory.h"
#include "planner/report.h"
#include "planner/suggest.h"

#define EXIT_NOFIT 1
#define EXIT_BADINPUT 2

static const char usage_main[] =
    "usage: memplan <command> [options]\n"
    "\n"
    "Size the training of a transformer on given hardware.\n"
    "\n"
    "commands:\n"
    "  estimate    bytes each rank needs per tier (GPU, CPU, NVMe) and kind; whether it fits\n"
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
    "  --model PATH            a Hugging Face config.json (gpt2, llama, mistral, qwen2, ...)\n"
    "  --params N              a model known only by its size (e.g. 7.5e9, 13B): model\n"
    "                          states only, activations unknown\n"
    "  --layers N --hidden N --heads N [--kv-heads N] [--ffn N] --vocab N [--arch gpt|llama]\n"
    "                          a custom shape (also overrides fields of --model)\n"
    "hardware:\n"
    "  --hw NAME               a preset ('memplan hardware'); default h100-80gb\n"
    "  --gpus N                GPUs in the job (default: DP x TP x PP, or the preset's)\n"
    "  --gpus-per-node N, --gpu-mem SIZE, --cpu-mem SIZE (per node), --nvme SIZE (per node)\n"
    "                          sizes: 80GB, 80GiB, 1.5TB or bytes\n"
    "training:\n"
    "  --seq N                 sequence length (default: the model's positions)\n"
    "  --micro-batch N         sequences per micro-batch (default 1)\n"
    "  --grad-accum N          micro-batches per step (default 1)\n"
    "  --dtype fp16|bf16|fp32  weights and activations (default bf16)\n"
    "  --grad-dtype DTYPE      gradients (default: --dtype; fp32 = Megatron's 18 B/param)\n"
    "  --optim adamw|sgd       AdamW: fp32 master + m + v (12 B/param); SGD: master + momentum\n"
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
    "output:\n"
    "  --json                  JSON instead of the table (docs/memplan-json.md)\n";

enum {
    OPT_MODEL = 256, OPT_PARAMS, OPT_LAYERS, OPT_HIDDEN, OPT_HEADS, OPT_KV_HEADS, OPT_FFN,
    OPT_VOCAB, OPT_ARCH, OPT_HW, OPT_GPUS, OPT_GPUS_PER_NODE, OPT_GPU_MEM, OPT_CPU_MEM, OPT_NVME,
    OPT_SEQ, OPT_MICRO_BATCH, OPT_GRAD_ACCUM, OPT_DTYPE, OPT_GRAD_DTYPE, OPT_OPTIM, OPT_DP, OPT_TP,
    OPT_PP, OPT_SP, OPT_VPP, OPT_ZERO, OPT_RECOMPUTE, OPT_NO_FLASH, OPT_DROPOUT, OPT_NO_DROPOUT,
    OPT_GRADS, OPT_OPTIMIZER, OPT_CHECKPOINTS, OPT_CUDA_CONTEXT, OPT_CUBLAS_WS, OPT_COMM_BUCKET,
    OPT_COMM_BUCKETS, OPT_PREFETCH, OPT_PINNED, OPT_FRAG, OPT_SUB_GROUP, OPT_SWAP_BUFFERS,
    OPT_JSON, OPT_HELP,
};

static const struct option estimate_opts[] = {
    {"model", required_argument, 0, OPT_MODEL},
    {"params", required_argument, 0, OPT_PARAMS},
    {"layers", required_argument, 0, OPT_LAYERS},
    {"hidden", required_argument, 0, OPT_HIDDEN},
    {"heads", required_argument, 0, OPT_HEADS},
    {"kv-heads", required_argument, 0, OPT_KV_HEADS},
    {"ffn", required_argument, 0, OPT_FFN},
    {"vocab", required_argument, 0, OPT_VOCAB},
    {"arch", required_argument, 0, OPT_ARCH},
    {"hw", required_argument, 0, OPT_HW},
    {"gpus", required_argument, 0, OPT_GPUS},
    {"gpus-per-node", required_argument, 0, OPT_GPUS_PER_NODE},
    {"gpu-mem", required_argument, 0, OPT_GPU_MEM},
    {"cpu-mem", required_argument, 0, OPT_CPU_MEM},
    {"nvme", required_argument, 0, OPT_NVME},
    {"seq", required_argument, 0, OPT_SEQ},
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
    {"json", no_argument, 0, OPT_JSON},
    {"help", no_argument, 0, OPT_HELP},
    {0, 0, 0, 0},
};

static int fail(void)
{
    fprintf(stderr, "memplan: %s\n", zo_last_error());
    return EXIT_BADINPUT;
}

static zo_status parse_tier(const char *s, const char *flag, int allow_nvme, plan_tier *out)
{
    if (!strcasecmp(s, "gpu")) *out = PLAN_GPU;
    else if (!strcasecmp(s, "cpu")) *out = PLAN_CPU;
    else if (allow_nvme && !strcasecmp(s, "nvme")) *out = PLAN_NVME;
    else
        return zo_error(ZO_ERR_INVALID, "%s: '%s' is not one of gpu, cpu%s", flag, s,
                        allow_nvme ? ", nvme" : "");
    return ZO_OK;
}

/* "cpu" or "gpu=0.2,cpu=0.5,nvme=0.3" */
static zo_status parse_fractions(const char *s, double frac[PLAN_TIERS])
{
    plan_tier t = PLAN_GPU;
    if (!strchr(s, '=')) {
        zo_status st = parse_tier(s, "--optimizer", 1, &t);
        if (st) return st;
        memset(frac, 0, sizeof(double) * PLAN_TIERS);
        frac[t] = 1.0;
        return ZO_OK;
    }
    double f[PLAN_TIERS] = {0};
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *sv = NULL, *tok = strtok_r(buf, ",", &sv); tok; tok = strtok_r(NULL, ",", &sv)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            return zo_error(ZO_ERR_INVALID, "--optimizer: '%s' is not TIER=FRACTION", tok);
        *eq = '\0';
        zo_status st = parse_tier(tok, "--optimizer", 1, &t);
        if (st) return st;
        if ((st = zo_parse_double(eq + 1, "--optimizer", 0, 1, &f[t])) != ZO_OK) return st;
    }
    double sum = f[0] + f[1] + f[2];
    if (sum < 1 - 1e-6 || sum > 1 + 1e-6)
        return zo_error(ZO_ERR_INVALID, "--optimizer: fractions in '%s' sum to %g, not 1", s, sum);
    memcpy(frac, f, sizeof f);
    return ZO_OK;
}

static int is_file(const char *p)
{
    struct stat sb;
    return strchr(p, '/') || strstr(p, ".json") ? 1 : (stat(p, &sb) == 0 && S_ISREG(sb.st_mode));
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
    if (seq && seq > m->max_seq && m->arch == ZO_ARCH_LLAMA) m->max_seq = (int)seq;
    if (!model && seq) m->max_seq = (int)seq;
    return zo_model_config_validate(m);
}

static int cmd_estimate(int argc, char **argv)
{
    const char *model = NULL, *hw_name = "h100-80gb";
    uint64_t params_n = 0, gpu_mem = 0, cpu_mem = 0, nvme = 0;
    long gpus = 0, gpus_per_node = 0, seq = 0, v;
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
    double opt_frac[PLAN_TIERS] = {1, 0, 0};
    plan_tier params_on = PLAN_GPU, grads_on = PLAN_GPU, ck_on = PLAN_GPU;
    zo_status st = ZO_OK;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":", estimate_opts, NULL)) != -1) {
        if (c >= OPT_MODEL && c <= OPT_HELP) seen[c] = 1;
        switch (c) {
        case OPT_MODEL: model = optarg; break;
        case OPT_PARAMS:
            /* --params is both a placement (gpu|cpu|nvme) and a size */
            if (!strcasecmp(optarg, "gpu") || !strcasecmp(optarg, "cpu") || !strcasecmp(optarg, "nvme"))
                st = parse_tier(optarg, "--params", 1, &params_on);
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
        case OPT_HW: hw_name = optarg; break;
        case OPT_GPUS: st = zo_parse_int(optarg, "--gpus", 1, 1 << 24, &gpus); break;
        case OPT_GPUS_PER_NODE: st = zo_parse_int(optarg, "--gpus-per-node", 1, 1024, &gpus_per_node); break;
        case OPT_GPU_MEM: st = zo_parse_size(optarg, "--gpu-mem", 0, &gpu_mem); break;
        case OPT_CPU_MEM: st = zo_parse_size(optarg, "--cpu-mem", 0, &cpu_mem); break;
        case OPT_NVME: st = zo_parse_size(optarg, "--nvme", 1, &nvme); break;
        case OPT_SEQ: st = zo_parse_int(optarg, "--seq", 1, 1 << 24, &seq); break;
        case OPT_MICRO_BATCH: st = zo_parse_int(optarg, "--micro-batch", 1, 1 << 20, &v); f.micro_batch = (int)v; break;
        case OPT_GRAD_ACCUM: st = zo_parse_int(optarg, "--grad-accum", 1, 1 << 24, &v); f.grad_accum = (int)v; break;
        case OPT_DTYPE: st = zo_dtype_parse(optarg, &f.dtype); dtype_set = 1; break;
        case OPT_GRAD_DTYPE: st = zo_dtype_parse(optarg, &f.grad_dtype); grad_dtype_set = 1; break;
        case OPT_OPTIM:
            if (!strcasecmp(optarg, "adamw") || !strcasecmp(optarg, "adam")) f.optimizer = PLAN_OPT_ADAMW;
            else if (!strcasecmp(optarg, "sgd")) f.optimizer = PLAN_OPT_SGD;
            else st = zo_error(ZO_ERR_INVALID, "--optim: '%s' is not adamw or sgd", optarg);
            break;
        case OPT_DP: st = zo_parse_int(optarg, "--dp", 1, 1 << 24, &i_dp.v); i_dp.set = 1; break;
        case OPT_TP: st = zo_parse_int(optarg, "--tp", 1, 1 << 16, &i_tp.v); i_tp.set = 1; break;
        case OPT_PP: st = zo_parse_int(optarg, "--pp", 1, 1 << 16, &i_pp.v); i_pp.set = 1; break;
        case OPT_SP: f.sp = 1; break;
        case OPT_VPP: st = zo_parse_int(optarg, "--vpp", 1, 1 << 16, &v); f.vpp = (int)v; break;
        case OPT_ZERO: st = zo_parse_int(optarg, "--zero", 0, 3, &v); f.zero = (int)v; break;
        case OPT_RECOMPUTE:
            if (!strcasecmp(optarg, "none")) f.recompute = PLAN_RECOMPUTE_NONE;
            else if (!strcasecmp(optarg, "selective")) f.recompute = PLAN_RECOMPUTE_SELECTIVE;
            else if (!strcasecmp(optarg, "full")) f.recompute = PLAN_RECOMPUTE_FULL;
            else st = zo_error(ZO_ERR_INVALID, "--recompute: '%s' is not none, selective or full", optarg);
            break;
        case OPT_NO_FLASH: break;
        case OPT_DROPOUT: dropout = 1; break;
        case OPT_NO_DROPOUT: dropout = 0; break;
        case OPT_GRADS: st = parse_tier(optarg, "--grads", 0, &grads_on); grads_set = 1; break;
        case OPT_OPTIMIZER: st = parse_fractions(optarg, opt_frac); break;
        case OPT_CHECKPOINTS: st = parse_tier(optarg, "--checkpoints", 0, &ck_on); break;
        case OPT_CUDA_CONTEXT: st = zo_parse_size(optarg, "--cuda-context", 1, &f.buf.cuda_context); break;
        case OPT_CUBLAS_WS: st = zo_parse_size(optarg, "--cublas-workspace", 1, &f.buf.cublas_workspace); break;
        case OPT_COMM_BUCKET: st = zo_parse_count(optarg, "--comm-bucket", &f.buf.comm_bucket); break;
        case OPT_COMM_BUCKETS: st = zo_parse_int(optarg, "--comm-buckets", 0, 64, &v); f.buf.comm_buckets = (int)v; break;
        case OPT_PREFETCH: st = zo_parse_int(optarg, "--prefetch", 1, 64, &v); f.buf.prefetch_depth = (int)v; break;
        case OPT_PINNED: st = zo_parse_size(optarg, "--pinned-staging", 0, &f.buf.pinned_staging); break;
        case OPT_FRAG: st = zo_parse_double(optarg, "--fragmentation", 0, 1, &f.buf.fragmentation); break;
        case OPT_SUB_GROUP: st = zo_parse_count(optarg, "--sub-group", &f.buf.sub_group); break;
        case OPT_SWAP_BUFFERS: st = zo_parse_int(optarg, "--swap-buffers", 1, 64, &v); f.buf.swap_buffers = (int)v; break;
        case OPT_JSON: json = 1; break;
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
        zo_error(ZO_ERR_INVALID, "estimate: unexpected argument '%s'", argv[optind]);
        return fail();
    }
    if ((st = build_model(model, params_n, &sf, seq, &m)) != ZO_OK) return fail();

    plan_hw hw;
    if ((st = plan_hw_find(hw_name, &hw)) != ZO_OK) return fail();
    if (gpu_mem) hw.gpu_mem = gpu_mem;
    if (seen[OPT_CPU_MEM]) hw.cpu_mem = cpu_mem;
    if (seen[OPT_NVME]) hw.nvme = nvme;
    if (gpus_per_node) hw.gpus_per_node = (int)gpus_per_node;

    plan_train_defaults(&t, &m);
    if (seq) t.seq = (int)seq;
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
    if (f.vpp) t.vpp = f.vpp;
    t.sp = f.sp;
    t.zero = f.zero;
    t.recompute = f.recompute;
    if (seen[OPT_NO_FLASH]) t.flash_attn = 0;
    if (dropout >= 0) t.dropout = dropout;
    t.params_on = params_on;
    memcpy(t.opt_frac, opt_frac, sizeof opt_frac);
    /* the CPU optimizer needs the gradients on the host: follow it unless told */
    t.grads_on = grads_set ? grads_on : (opt_frac[PLAN_GPU] < 1 ? PLAN_CPU : PLAN_GPU);
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

    plan_estimate e;
    if ((st = plan_estimate_run(&m, &hw, &t, &e)) != ZO_OK) return fail();
    char flags[256];
    int found = 0;
    plan_train better;
    if (!e.fits && (st = plan_suggest(&m, &hw, &t, &better, flags, sizeof flags, &found)) != ZO_OK)
        return fail();
    const char *suggestion = found ? flags : NULL;
    if (json) {
        cJSON *doc = plan_report_json(&m, &hw, &t, &e, suggestion);
        char *text = cJSON_Print(doc);
        if (!text) {
            cJSON_Delete(doc);
            fprintf(stderr, "memplan: out of memory printing JSON\n");
            return EXIT_BADINPUT;
        }
        puts(text);
        free(text);
        cJSON_Delete(doc);
    } else {
        plan_report_table(stdout, &m, &hw, &t, &e, suggestion);
    }
    return e.fits ? 0 : EXIT_NOFIT;
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
    return 0;
}

static int cmd_hardware(void)
{
    size_t n;
    const plan_hw_preset *p = plan_hw_presets(&n);
    printf("%-15s %-60s %10s %10s %9s %9s\n", "name", "summary", "GPU mem", "PCIe", "NVMe rd",
           "NVMe wr");
    for (size_t i = 0; i < n; i++) {
        char mem[32];
        printf("%-15s %-60s %10s %7.0f GB/s %5.1f GB/s %5.1f GB/s\n", p[i].name, p[i].summary,
               zo_format_bytes(p[i].hw.gpu_mem, mem, sizeof mem), p[i].hw.pcie_bw / 1e9,
               p[i].hw.nvme_read_bw / 1e9, p[i].hw.nvme_write_bw / 1e9);
    }
    printf("\nOverride with --gpus --gpus-per-node --gpu-mem --cpu-mem --nvme (CPU memory and NVMe "
           "are per node).\n");
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
    if (!strcmp(cmd, "models")) return cmd_models();
    if (!strcmp(cmd, "hardware")) return cmd_hardware();
    fprintf(stderr, "memplan: unknown command '%s' (commands: estimate, models, hardware; see "
                    "'memplan --help')\n", cmd);
    return EXIT_BADINPUT;
}
