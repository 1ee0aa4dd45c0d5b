/* train: train a GPT-2 or LLaMA-family model on a token file on the offload
 * runtime: on the CPU device backend or a CUDA GPU (--device), its memory
 * capped by --device-mem, weights resident or streamed from pinned host
 * memory or NVMe, AdamW over
 * fp32 master state in memory and/or on NVMe, checkpoints, a plan from
 * memplan; on several ranks under mpirun (ZeRO stages 0-3). See --help. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/model_config.h" /* defines: zo_model_config_load, zo_model_preset_find */
#include "common/units.h"        /* defines: zo_parse_size, zo_parse_int, zo_format_bytes */
#include "gpu/comm.h"             /* defines: comm_init, comm_launch_detect, comm_abort */
#include "gpu/device.h"           /* defines: gpu_device_open, gpu_cuda_device_count */
#include "offload/offload.h"     /* defines: offload_init, offload_micro_batch, offload_step */
#include "model/data.h"          /* defines: model_tokens, model_batch_get */
#include "model/safetensors.h"   /* defines: model_load_path, model_save */
#include "transformer/offload_model.h" /* defines: tf_offload_model */

typedef struct train_args {
    const char *model, *weights, *data, *save, *device;
    const char *plan, *ckpt, *resume, *stats_json;
    model_token_width width;
    long steps, micro_batch, seq, seed, threads, save_every;
    offload_plan p;      /* the runtime's configuration: the plan, then the flags */
    zo_dtype dtype;
    uint64_t device_mem;
    double comm_timeout; /* seconds; 0: ZO_COMM_TIMEOUT or the communicator's default */
    int set_dtype, set_mb, set_seq, set_devmem; /* given as flags (they beat the plan) */
} train_args;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: train --model CONFIG|PRESET --data FILE [options]\n"
        "\n"
        "Train a GPT-2 or LLaMA-family transformer on a token file. Batches are\n"
        "sequential: at step k, row i starts at token ((k*B + i) * S) mod (N - S - 1).\n"
        "\n"
        "model and data:\n"
        "  --model CONFIG|PRESET  a Hugging Face config.json, or a preset name (gpt2, llama-2-7b, ...)\n"
        "  --weights FILE         safetensors checkpoint (file, index.json or directory);\n"
        "                         default: GPT-2-style random init from --seed\n"
        "  --data FILE            token file: raw little-endian uint16 ids (nanoGPT style)\n"
        "  --tokens-u32           the token file holds uint32 ids\n"
        "  --text                 the data file is plain text: one token per byte (vocab >= 256)\n"
        "\n"
        "training:\n"
        "  --steps N              optimizer steps (default 100)\n"
        "  --micro-batch B        sequences per step (default 4)\n"
        "  --seq S                tokens per sequence (default 64)\n"
        "  --lr X                 learning rate (default 3e-4)\n"
        "  --beta1 X --beta2 X    AdamW betas (default 0.9, 0.95)\n"
        "  --eps X                AdamW epsilon (default 1e-8)\n"
        "  --weight-decay X       decoupled weight decay on 2-D weights (default 0.1)\n"
        "  --clip X               max gradient norm; 0 disables (default 1.0)\n"
        "  --dtype fp32|fp16|bf16 device storage of weights, gradients, activations (default fp32)\n"
        "  --grad-accum K         micro-batches per optimizer step (default 1)\n"
        "  --seed N               random init seed (default 1337)\n"
        "\n"
        "placement (a plan, then these flags; see docs/offload.md):\n"
        "  --plan FILE            a plan memplan wrote (plan --json FILE, estimate --plan-out\n"
        "                         FILE): placement, buffers, batch, dtype; its model and its\n"
        "                         ranks (dp x tp x pp) must be this run's\n"
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
        "several ranks (under mpirun -np N, or a launcher setting OMPI_COMM_WORLD_* or PMI_*):\n"
        "  --zero 0|1|2|3         ZeRO stage (default: the plan's, else 0): 0 replicate, 1 partition\n"
        "                         the optimizer state, 2 also the gradients, 3 also the weights\n"
        "  --comm-timeout S       a collective not done in S seconds ends every rank (default 300)\n"
        "  Rank r of N reads micro-batches (k N + r) K + j of step k: the global batch of one\n"
        "  rank with --grad-accum N K. Rank 0 prints; the others print only errors.\n"
        "\n"
        "checkpoints and output:\n"
        "  --ckpt DIR             save a checkpoint (weights, optimizer state, counters) into DIR\n"
        "                         (several ranks: a directory they share; each rank writes its\n"
        "                         shard of the optimizer state)\n"
        "  --save-every N         every N steps (default: only at the end)\n"
        "  --resume DIR           continue from DIR's latest checkpoint (saved on any number of\n"
        "                         ranks whose global batch is this run's)\n"
        "  --stats-json FILE      peak bytes per tier (and the plan's prediction) and the time split\n"
        "                         (several ranks: rank r > 0 writes FILE.rank<r>)\n"
        "  --save FILE            write the trained weights as safetensors (Hugging Face names)\n"
        "  -h, --help             this text\n"
        "\n"
        "Prints one line per step: step K loss X norm G tok/s R mem M (loss: the mean over\n"
        "the global batch; tok/s: every rank's tokens).\n");
}

enum {
    OPT_MODEL = 256, OPT_WEIGHTS, OPT_DATA, OPT_U32, OPT_TEXT, OPT_STEPS, OPT_MB, OPT_SEQ,
    OPT_LR, OPT_B1, OPT_B2, OPT_EPS, OPT_WD, OPT_CLIP, OPT_DTYPE, OPT_SEED, OPT_DEVICE,
    OPT_DEVMEM, OPT_THREADS, OPT_SAVE, OPT_ACCUM, OPT_PLAN, OPT_PARAMS_ON, OPT_OPT_ON,
    OPT_CKPT_ON, OPT_RECOMPUTE, OPT_PREFETCH, OPT_SUBGROUP, OPT_NVME_DIR, OPT_CKPT, OPT_SAVE_EVERY,
    OPT_RESUME, OPT_STATS, OPT_ZERO, OPT_COMM_TIMEOUT,
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
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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
                      .seed = 1337, .dtype = ZO_DTYPE_F32, .device = "cpu"};
    offload_plan_defaults(&a->p);
    offload_config *oc = &a->p.cfg;
    oc->adam = (offload_adamw){.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
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
        case OPT_CKPT: a->ckpt = optarg; break;
        case OPT_SAVE_EVERY: st = zo_parse_int(optarg, "--save-every", 1, 1L << 40, &a->save_every); break;
        case OPT_RESUME: a->resume = optarg; break;
        case OPT_STATS: a->stats_json = optarg; break;
        case OPT_ZERO:
            st = zo_parse_int(optarg, "--zero", 0, 3, &v);
            oc->zero_stage = (int)v;
            break;
        case OPT_COMM_TIMEOUT: st = zo_parse_double(optarg, "--comm-timeout", 0.001, 1e7, &a->comm_timeout); break;
        case OPT_MODEL: a->model = optarg; break;
        case OPT_WEIGHTS: a->weights = optarg; break;
        case OPT_DATA: a->data = optarg; break;
        case OPT_U32: a->width = MODEL_TOKENS_U32; break;
        case OPT_TEXT: a->width = MODEL_TOKENS_BYTES; break;
        case OPT_STEPS: st = zo_parse_int(optarg, "--steps", 1, 1L << 40, &a->steps); break;
        case OPT_MB: st = zo_parse_int(optarg, "--micro-batch", 1, 1 << 20, &a->micro_batch); break;
        case OPT_SEQ: st = zo_parse_int(optarg, "--seq", 1, 1 << 24, &a->seq); break;
        case OPT_LR: st = parse_float(optarg, "--lr", 0.0, 10.0, &oc->adam.lr); break;
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
    if (a->save_every && !a->ckpt) {
        fprintf(stderr, "train: --save-every needs --ckpt DIR (where the checkpoints go)\n");
        return 2;
    }
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

/* Test seam: ZO_TRAIN_CKPT_PAUSE="POINT:N:FD" makes the N-th checkpoint
 * write, at hook POINT ("begin", "optimizer-half", "before-rename",
 * "before-latest"), write one byte to FD and wait there for a signal (a test
 * kills the process mid-write). */
static void pause_hook(void *user, const char *point)
{
    static int saves;
    const char *spec = user;
    if (!strcmp(point, "begin")) saves++;
    char want[64];
    int nth = 0, fd = -1;
    if (sscanf(spec, "%63[^:]:%d:%d", want, &nth, &fd) != 3 || strcmp(want, point) || nth != saves)
        return;
    if (write(fd, "k", 1) != 1) return;
    for (;;) pause();
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
    if (st == ZO_ERR_UNSUPPORTED)
        return zo_error_wrap(st, "--device %s: rebuild with the CUDA toolkit (nvcc) installed, or "
                                 "use --device cpu", name);
    if (st == ZO_ERR_NOT_FOUND && !gpu_cuda_device_count())
        return zo_error_wrap(st, "--device %s: no CUDA GPU found on this machine (use --device cpu)",
                             name);
    if (st != ZO_OK) return zo_error_wrap(st, "--device %s", name);
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
    return ZO_OK;
}

int main(int argc, char **argv)
{
    train_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    if (!a.model || !a.data) {
        fprintf(stderr, "train: %s is required (see --help)\n", !a.model ? "--model" : "--data");
        return 2;
    }

    zo_status st;
    zo_model_config cfg;
    model_tokens tokens = {.fd = -1};
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
    rc = 1;

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
    if ((st = model_tokens_open(&tokens, a.data, a.width, cfg.vocab)) != ZO_OK) goto out;
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
    tf_options to = {.recompute = oc->recompute, .external_res = 1};
    if ((st = tf_init_opts(&m, &cfg, dev, a.dtype, (int)a.micro_batch, (int)a.seq, &to)) != ZO_OK)
        goto out_dev;
    if ((st = tf_offload_model_init(&tm, &m)) != ZO_OK) goto out_model;
    if ((st = offload_init(&rt, dev, &tm.om, oc)) != ZO_OK) goto out_model;

    /* initial weights: a checkpoint, a safetensors file, or random */
    const model_layout *l = &m.layout;
    if ((st = initial_weights(rt, l, a.weights, (uint64_t)a.seed)) != ZO_OK) goto out_rt;
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
    printf("# placement: weights %s (prefetch %d), optimizer cpu %.2f nvme %.2f gpu %.2f, "
           "gradients %s, checkpoints %s, recompute %s%s%s\n",
           offload_tier_name(oc->params_on), oc->prefetch_depth, oc->opt_frac[OFFLOAD_CPU],
           oc->opt_frac[OFFLOAD_NVME], oc->opt_frac[OFFLOAD_DEVICE],
           oc->opt_frac[OFFLOAD_DEVICE] >= 1 ? "gpu" : oc->opt_frac[OFFLOAD_DEVICE] > 0 ? "gpu+cpu" : "cpu",
           offload_tier_name(oc->checkpoints_on),
           oc->recompute ? "full" : "none", a.plan ? "; plan " : "", a.plan ? a.plan : "");
    if (a.p.selective_as_none && !oc->recompute)
        printf("# recompute: \"selective\" runs as none (the attention keeps no s x s "
               "scores, so selective would recompute nothing)\n");
    fflush(stdout);

    size_t n = (size_t)a.micro_batch * a.seq;
    inputs = malloc(n * sizeof *inputs);
    targets = malloc(n * sizeof *targets);
    losses = calloc((size_t)ranks, sizeof *losses);
    if (!inputs || !targets || !losses) {
        st = zo_error(ZO_ERR_NOMEM, "train: out of host memory for the batch");
        goto out_rt;
    }
    int progress = isatty(STDERR_FILENO) && !isatty(STDOUT_FILENO);
    double t_start = now_seconds();
    for (long k = k0; k < a.steps; k++) {
        double t0 = now_seconds(), sum = 0;
        for (int j = 0; j < accum; j++) {
            /* rank r's slice of the global batch of step k */
            st = model_batch_get(&tokens, (int)a.micro_batch, (int)a.seq, (k * ranks + rank) * accum + j, 0,
                                 MODEL_SAMPLE_SEQUENTIAL, inputs, targets);
            if (st != ZO_OK) goto out_rt;
            float loss;
            if ((st = tf_set_batch(&m, s, inputs, targets, (int)a.micro_batch, (int)a.seq)) != ZO_OK ||
                (st = offload_micro_batch(rt, s)) != ZO_OK || (st = tf_loss(&m, s, &loss)) != ZO_OK) {
                st = zo_error_wrap(st, "step %ld", k);
                goto out_rt;
            }
            sum += loss;
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
        double dt = now_seconds() - t0;
        gpu_mem_get_stats(dev, &ms);
        printf("step %ld loss %.6f norm %.4f tok/s %.0f mem %s%s\n", k, sum / (accum * ranks), info.grad_norm,
               (double)n * accum * ranks / dt, zo_format_bytes(ms.high_water, b1, sizeof b1),
               info.skipped ? " (overflow: skipped)" : "");
        fflush(stdout);
        int last = k + 1 == a.steps;
        if (a.ckpt && ((a.save_every && (k + 1) % a.save_every == 0) || last)) {
            offload_ckpt_meta meta = {.data_step = (k + 1) * accum * ranks, .seed = (uint64_t)a.seed};
            if ((st = offload_save_streamed(rt, a.ckpt, &meta, write_weights, (void *)l)) != ZO_OK)
                goto out_rt;
            printf("# checkpoint %s step %ld\n", a.ckpt, k + 1);
        }
        if (progress) {
            double el = now_seconds() - t_start;
            fprintf(stderr, "\r[%ld/%ld] loss %.4f, %.0fs left ", k + 1, a.steps, sum / (accum * ranks),
                    el / (k + 1 - k0) * (a.steps - k - 1));
        }
    }
    if (progress) fprintf(stderr, "\n");
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
        if ((st = offload_write_weights(rt, a.save, write_weights, (void *)l)) != ZO_OK) goto out_rt;
        printf("# saved %s\n", a.save);
    }
    rc = 0;

out_rt:
    offload_free(rt);
out_model:
    tf_offload_model_free(&tm);
    tf_free(&m);
out_dev:
    if (rc && ranks > 1) {
        /* the others would wait for this rank in a collective until their
         * timeout: end the job now, saying why */
        char msg[1200];
        snprintf(msg, sizeof msg, "train: rank %d of %d: %s", rank, ranks, zo_last_error());
        comm_abort(comm, 1, msg);
    }
    comm_free(comm);
    if (s) gpu_stream_destroy(s);
    gpu_device_free(dev);
out:
    model_tokens_close(&tokens);
    free(inputs);
    free(targets);
    free(losses);
    if (rc) fprintf(stderr, "train: %s\n", zo_last_error());
    return rc;
}
