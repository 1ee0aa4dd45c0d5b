/* train: train a GPT-2 or LLaMA-family model on a token file, on the CPU
 * device backend (device memory capped by --device-mem), fp32 master
 * weights and AdamW on the host. See --help. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/model_config.h" /* defines: zo_model_config_load, zo_model_preset_find */
#include "common/units.h"        /* defines: zo_parse_size, zo_parse_int, zo_format_bytes */
#include "examples/trainer.h"    /* defines: tf_trainer, tf_trainer_step */
#include "model/data.h"          /* defines: model_tokens, model_batch_get */
#include "model/safetensors.h"   /* defines: model_load_path, model_save */

typedef struct train_args {
    const char *model, *weights, *data, *save, *device;
    model_token_width width;
    long steps, micro_batch, seq, seed, threads;
    tf_adamw opt;
    zo_dtype dtype;
    uint64_t device_mem;
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
        "  --seed N               random init seed (default 1337)\n"
        "\n"
        "device:\n"
        "  --device cpu           the device backend (only cpu in this build)\n"
        "  --device-mem SIZE      device memory capacity, e.g. 512MiB, 2GB (default unlimited)\n"
        "  --threads N            threads per op (default: all)\n"
        "\n"
        "output:\n"
        "  --save FILE            write the trained weights as safetensors (Hugging Face names)\n"
        "  -h, --help             this text\n"
        "\n"
        "Prints one line per step: step K loss X norm G tok/s R mem M.\n");
}

enum {
    OPT_MODEL = 256, OPT_WEIGHTS, OPT_DATA, OPT_U32, OPT_TEXT, OPT_STEPS, OPT_MB, OPT_SEQ,
    OPT_LR, OPT_B1, OPT_B2, OPT_EPS, OPT_WD, OPT_CLIP, OPT_DTYPE, OPT_SEED, OPT_DEVICE,
    OPT_DEVMEM, OPT_THREADS, OPT_SAVE,
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

/* 0: parsed; 1: --help printed; 2: usage error (message printed). */
static int parse_args(int argc, char **argv, train_args *a)
{
    *a = (train_args){.width = MODEL_TOKENS_U16, .steps = 100, .micro_batch = 4, .seq = 64,
                      .seed = 1337, .dtype = ZO_DTYPE_F32, .device = "cpu",
                      .opt = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                              .weight_decay = 0.1f, .clip = 1.0f}};
    int c;
    zo_status st = ZO_OK;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL: a->model = optarg; break;
        case OPT_WEIGHTS: a->weights = optarg; break;
        case OPT_DATA: a->data = optarg; break;
        case OPT_U32: a->width = MODEL_TOKENS_U32; break;
        case OPT_TEXT: a->width = MODEL_TOKENS_BYTES; break;
        case OPT_STEPS: st = zo_parse_int(optarg, "--steps", 1, 1L << 40, &a->steps); break;
        case OPT_MB: st = zo_parse_int(optarg, "--micro-batch", 1, 1 << 20, &a->micro_batch); break;
        case OPT_SEQ: st = zo_parse_int(optarg, "--seq", 1, 1 << 24, &a->seq); break;
        case OPT_LR: st = parse_float(optarg, "--lr", 0.0, 10.0, &a->opt.lr); break;
        case OPT_B1: st = parse_float(optarg, "--beta1", 0.0, 0.999999, &a->opt.beta1); break;
        case OPT_B2: st = parse_float(optarg, "--beta2", 0.0, 0.999999, &a->opt.beta2); break;
        case OPT_EPS: st = parse_float(optarg, "--eps", 0.0, 1.0, &a->opt.eps); break;
        case OPT_WD: st = parse_float(optarg, "--weight-decay", 0.0, 10.0, &a->opt.weight_decay); break;
        case OPT_CLIP: st = parse_float(optarg, "--clip", 0.0, 1e9, &a->opt.clip); break;
        case OPT_DTYPE:
            st = zo_dtype_parse(optarg, &a->dtype);
            if (st != ZO_OK) st = zo_error_wrap(st, "--dtype");
            break;
        case OPT_SEED: st = zo_parse_int(optarg, "--seed", 0, 0x7fffffffL, &a->seed); break;
        case OPT_DEVICE:
            a->device = optarg;
            if (strcmp(optarg, "cpu"))
                st = zo_error(ZO_ERR_UNSUPPORTED, "--device %s: only 'cpu' is available in this build", optarg);
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
    if (optind < argc) {
        fprintf(stderr, "train: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!a->model || !a->data) {
        fprintf(stderr, "train: %s is required (see --help)\n", !a->model ? "--model" : "--data");
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

int main(int argc, char **argv)
{
    train_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;

    zo_status st;
    zo_model_config cfg;
    model_tokens tokens = {.fd = -1};
    gpu_device_t dev = NULL;
    gpu_stream_t s = NULL;
    tf_model m = {0};
    tf_trainer tr = {0};
    int32_t *inputs = NULL, *targets = NULL;
    char b1[32], b2[32];
    rc = 1;

    if ((st = load_config(a.model, &cfg)) != ZO_OK) goto out;
    if ((st = model_tokens_open(&tokens, a.data, a.width, cfg.vocab)) != ZO_OK) goto out;
    gpu_cpu_options dopt = {.capacity = a.device_mem, .n_threads = (int)a.threads};
    if ((st = gpu_device_init_cpu(&dopt, &dev)) != ZO_OK) goto out;
    if ((st = gpu_stream_create(dev, &s)) != ZO_OK) goto out_dev;
    if ((st = tf_init(&m, &cfg, dev, a.dtype, (int)a.micro_batch, (int)a.seq)) != ZO_OK) goto out_dev;
    if ((st = tf_trainer_init(&tr, &m, &a.opt)) != ZO_OK) goto out_model;
    if (a.weights) {
        st = model_load_path(a.weights, &m.layout, (void *const *)tr.master, ZO_DTYPE_F32, 0, NULL);
        if (st != ZO_OK) goto out_trainer;
    } else {
        tf_init_weights(&m.layout, tr.master, (uint64_t)a.seed);
    }
    if ((st = tf_trainer_upload(&tr, s)) != ZO_OK) goto out_trainer;

    gpu_mem_stats ms;
    gpu_mem_get_stats(dev, &ms);
    printf("# train: %s (%s), %llu parameters, %d layers, hidden %d, vocab %d; dtype %s; "
           "batch %ld x %ld; data %s (%llu tokens); device cpu, %s in use of %s\n",
           cfg.name, zo_arch_name(cfg.arch), (unsigned long long)m.layout.total_numel,
           cfg.n_layers, cfg.hidden, cfg.vocab, zo_dtype_name(a.dtype), a.micro_batch, a.seq,
           a.data, (unsigned long long)tokens.n, zo_format_bytes(ms.in_use, b1, sizeof b1),
           a.device_mem ? zo_format_bytes(a.device_mem, b2, sizeof b2) : "unlimited");
    fflush(stdout);

    size_t n = (size_t)a.micro_batch * a.seq;
    inputs = malloc(n * sizeof *inputs);
    targets = malloc(n * sizeof *targets);
    if (!inputs || !targets) {
        st = zo_error(ZO_ERR_NOMEM, "train: out of host memory for the batch");
        goto out_trainer;
    }
    int progress = isatty(STDERR_FILENO) && !isatty(STDOUT_FILENO);
    double t_start = now_seconds();
    for (long k = 0; k < a.steps; k++) {
        double t0 = now_seconds();
        st = model_batch_get(&tokens, (int)a.micro_batch, (int)a.seq, k, 0, MODEL_SAMPLE_SEQUENTIAL,
                             inputs, targets);
        if (st != ZO_OK) goto out_trainer;
        tf_step_info info;
        st = tf_trainer_step(&tr, s, inputs, targets, (int)a.micro_batch, (int)a.seq, &info);
        if (st != ZO_OK) {
            st = zo_error_wrap(st, "step %ld", k);
            goto out_trainer;
        }
        double dt = now_seconds() - t0;
        gpu_mem_get_stats(dev, &ms);
        printf("step %ld loss %.6f norm %.4f tok/s %.0f mem %s%s\n", k, info.loss, info.grad_norm,
               (double)n / dt, zo_format_bytes(ms.high_water, b1, sizeof b1),
               info.skipped ? " (overflow: skipped)" : "");
        fflush(stdout);
        if (progress) {
            double el = now_seconds() - t_start;
            fprintf(stderr, "\r[%ld/%ld] loss %.4f, %.0fs left ", k + 1, a.steps, info.loss,
                    el / (k + 1) * (a.steps - k - 1));
        }
    }
    if (progress) fprintf(stderr, "\n");
    gpu_mem_get_stats(dev, &ms);
    printf("# device memory: peak %s of %s\n", zo_format_bytes(ms.high_water, b1, sizeof b1),
           a.device_mem ? zo_format_bytes(a.device_mem, b2, sizeof b2) : "unlimited");
    if (a.save) {
        st = model_save(a.save, &m.layout, (const void *const *)tr.master, ZO_DTYPE_F32, ZO_DTYPE_F32);
        if (st != ZO_OK) goto out_trainer;
        printf("# saved %s\n", a.save);
    }
    rc = 0;

out_trainer:
    tf_trainer_free(&tr);
out_model:
    tf_free(&m);
out_dev:
    if (s) gpu_stream_destroy(s);
    gpu_device_free(dev);
out:
    model_tokens_close(&tokens);
    free(inputs);
    free(targets);
    if (rc) fprintf(stderr, "train: %s\n", zo_last_error());
    return rc;
}
