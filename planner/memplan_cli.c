/* memplan's shared flag parsing and the helpers every command uses
 * (memplan_cli.h). */
#include "memplan_cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/fileio.h" /* defines: zo_file_read_all, zo_file_write_all, zo_file_write_json */
#include "common/plan_schema.h" /* defines: zo_plan_flag_int, zo_plan_flag_double, zo_plan_flag_u64 */
#include "common/units.h"
#include "common/version.h" /* defines: zo_version_print */
#include "planner/planfile.h" /* defines: plan_hw_parse */
#include "planner/svg.h"

int fail(void)
{
    fprintf(stderr, "memplan: %s\n", zo_last_error());
    return EXIT_BADINPUT;
}

void warn(const plan_train *t, const plan_hw *hw)
{
    char w[1024];
    if (!plan_train_warnings(t, hw, w, sizeof w)) return;
    for (char *sv = NULL, *line = strtok_r(w, "\n", &sv); line; line = strtok_r(NULL, "\n", &sv))
        fprintf(stderr, "memplan: warning: %s\n", line);
}

/* ---- values checked against the plan schema ------------------------------------------ */

/* zo_plan_flag_int into an int */
static zo_status flag_int_to(const char *s, const char *flag, const char *field, int *out)
{
    long v = 0;
    zo_status st = zo_plan_flag_int(s, flag, field, &v);
    *out = (int)v;
    return st;
}

/* ---- the shared flags ------------------------------------------------------------------ */

/* The model, the GPUs and the sequence: 1 when `c` is one of them. */
static int parse_model_flag(const cli_command *cmd, int c, const char *arg, cli_flags *f,
                            zo_status *st)
{
    shape_flags *sf = &f->sf;
    switch (c) {
    case OPT_MODEL: f->model = arg; return 1;
    case OPT_PARAMS:
        /* estimate's --params is both a placement (gpu|cpu|nvme) and a size */
        if (cmd->params_tier &&
            (!strcasecmp(arg, "gpu") || !strcasecmp(arg, "cpu") || !strcasecmp(arg, "nvme")))
            *st = zo_plan_tier_parse(arg, "--params", 1, &f->params_on);
        else
            *st = zo_parse_count(arg, "--params", &f->params_n);
        return 1;
    case OPT_LAYERS: *st = zo_parse_int(arg, "--layers", 1, 1 << 20, &sf->layers); return 1;
    case OPT_HIDDEN: *st = zo_parse_int(arg, "--hidden", 1, 1 << 24, &sf->hidden); return 1;
    case OPT_HEADS: *st = zo_parse_int(arg, "--heads", 1, 1 << 20, &sf->heads); return 1;
    case OPT_KV_HEADS: *st = zo_parse_int(arg, "--kv-heads", 1, 1 << 20, &sf->kv_heads); return 1;
    case OPT_FFN: *st = zo_parse_int(arg, "--ffn", 1, 1 << 26, &sf->ffn); return 1;
    case OPT_VOCAB: *st = zo_parse_int(arg, "--vocab", 1, 1 << 26, &sf->vocab); return 1;
    case OPT_ARCH: sf->arch = arg; return 1;
    case OPT_GPUS: *st = zo_parse_int(arg, "--gpus", 1, cmd->gpus_max, &f->gpus); return 1;
    case OPT_SEQ: *st = zo_plan_flag_int(arg, "--seq", "training.seq", &f->seq); return 1;
    default: return 0;
    }
}

/* A size flag of the hardware: the text given (the report names it) and its bytes. */
static zo_status size_flag(const char *arg, const char *flag, int allow_zero, const char **text,
                           uint64_t *bytes)
{
    *text = arg;
    return zo_parse_size(arg, flag, allow_zero, bytes);
}

/* The hardware flags: 1 when `c` is one. */
static int parse_hw_flag(int c, const char *arg, plan_hw_flags *f, zo_status *st)
{
    long v;
    switch (c) {
    case OPT_HW: f->hw = arg; return 1;
    case OPT_GPU: f->gpu = arg; return 1;
    case OPT_HOST: f->host = arg; return 1;
    case OPT_PCIE: f->pcie = arg; return 1;
    case OPT_GPU_MEM: *st = size_flag(arg, "--gpu-mem", 0, &f->gpu_mem_arg, &f->gpu_mem); return 1;
    case OPT_CPU_MEM: *st = size_flag(arg, "--cpu-mem", 0, &f->cpu_mem_arg, &f->cpu_mem); return 1;
    case OPT_NVME: *st = size_flag(arg, "--nvme", 1, &f->nvme_arg, &f->nvme); return 1;
    case OPT_GPUS_PER_NODE:
        *st = zo_parse_int(arg, "--gpus-per-node", 1, 1024, &v);
        f->gpus_per_node = v;
        return 1;
    default: return 0;
    }
}

/* The training settings and the model-parallel degrees: 1 when `c` is one. */
static int parse_train_flag(int c, const char *arg, cli_flags *f, zo_status *st)
{
    zo_plan_recompute r = ZO_PLAN_RECOMPUTE_NONE;
    switch (c) {
    case OPT_GLOBAL_BATCH:
        *st = zo_parse_int(arg, "--global-batch", 1, 1 << 30, &f->global_batch);
        return 1;
    case OPT_DTYPE: *st = zo_dtype_parse(arg, &f->dtype); return 1;
    case OPT_GRAD_DTYPE: *st = zo_dtype_parse(arg, &f->grad_dtype); return 1;
    case OPT_REDUCE_DTYPE:
        *st = zo_dtype_parse(arg, &f->reduce_dtype);
        if (*st) *st = zo_error_wrap(*st, "--reduce-dtype");
        return 1;
    case OPT_RUNTIME: *st = plan_runtime_parse(arg, "--runtime", &f->runtime); return 1;
    case OPT_OPTIM: {
        int q8 = 0;
        *st = zo_plan_optim_parse(arg, "--optim", &f->optim, &q8);
        if (q8 && f->opt_state >= 0 && f->opt_state != ZO_PLAN_STATE_8BIT) {
            *st = zo_error(ZO_ERR_INVALID, "--optim adamw8bit keeps m and v in 8 bits: drop "
                           "--optim-dtype %s", f->opt_state == PLAN_STATE_AUTO ? "auto"
                           : zo_plan_opt_state_name((zo_plan_opt_state)f->opt_state));
            return 1;
        }
        if (q8) f->opt_state = ZO_PLAN_STATE_8BIT;
        return 1;
    }
    case OPT_OPTIM_DTYPE: {
        zo_plan_opt_state os = ZO_PLAN_STATE_FP32;
        if (!strcasecmp(arg, "auto")) os = PLAN_STATE_AUTO;
        else if ((*st = zo_plan_opt_state_parse(arg, "--optim-dtype", &os)) != ZO_OK) return 1;
        if (f->opt_state == ZO_PLAN_STATE_8BIT && (int)os != ZO_PLAN_STATE_8BIT) {
            *st = zo_error(ZO_ERR_INVALID, "--optim-dtype %s: --optim adamw8bit keeps m and v in 8 bits",
                           arg);
            return 1;
        }
        f->opt_state = (int)os;
        return 1;
    }
    case OPT_LOSS_CHUNK:
        *st = zo_plan_flag_int(arg, "--loss-chunk", "training.loss_chunk", &f->loss_chunk);
        return 1;
    case OPT_NO_FLASH: return 1;
    case OPT_ATTENTION: {
        static const char *const names[] = {"auto", "flash", "gemm", "tc", "mma"};
        for (int p = 0; p <= ZO_ATTN_MMA; p++)
            if (!strcasecmp(arg, names[p])) {
                f->attn_path = (zo_attn_path)p;
                return 1;
            }
        *st = zo_error(ZO_ERR_INVALID, "--attention %s: expected auto, flash, gemm, tc or mma", arg);
        return 1;
    }
    case OPT_DROPOUT: f->dropout = 1; return 1;
    case OPT_NO_DROPOUT: f->dropout = 0; return 1;
    case OPT_RECOMPUTE:
        *st = zo_plan_recompute_parse(arg, "--recompute", &r);
        f->recompute = (int)r;
        return 1;
    case OPT_TP: *st = zo_plan_flag_int(arg, "--tp", "parallel.tp", &f->tp); return 1;
    case OPT_PP: *st = zo_plan_flag_int(arg, "--pp", "parallel.pp", &f->pp); return 1;
    case OPT_EP: *st = zo_plan_flag_int(arg, "--ep", "parallel.ep", &f->ep); return 1;
    default: return 0;
    }
}

/* The working buffers: 1 when `c` is one of them. */
static int parse_buffer_flag(int c, const char *arg, plan_buffers *b, zo_status *st)
{
    switch (c) {
    case OPT_CUDA_CONTEXT:
        *st = zo_plan_flag_u64(arg, "--cuda-context", "buffers.cuda_context", 0,
                               &b->cuda_context);
        return 1;
    case OPT_CUBLAS_WS:
        *st = zo_plan_flag_u64(arg, "--cublas-workspace", "buffers.cublas_workspace", 0,
                               &b->cublas_workspace);
        return 1;
    case OPT_COMM_BUCKET:
        *st = zo_plan_flag_u64(arg, "--comm-bucket", "buffers.comm_bucket_elems", 1,
                               &b->comm_bucket);
        return 1;
    case OPT_COMM_BUCKETS:
        *st = flag_int_to(arg, "--comm-buckets", "buffers.comm_buckets", &b->comm_buckets);
        return 1;
    case OPT_PREFETCH:
        *st = flag_int_to(arg, "--prefetch", "buffers.prefetch_depth", &b->prefetch_depth);
        return 1;
    case OPT_PINNED:
        *st = zo_plan_flag_u64(arg, "--pinned-staging", "buffers.pinned_staging", 0,
                               &b->pinned_staging);
        return 1;
    case OPT_FRAG:
        *st = zo_plan_flag_double(arg, "--fragmentation", "buffers.fragmentation",
                                  &b->fragmentation);
        return 1;
    case OPT_SUB_GROUP:
        *st = zo_plan_flag_u64(arg, "--sub-group", "nvme.sub_group", 1, &b->sub_group);
        return 1;
    case OPT_SWAP_BUFFERS:
        *st = flag_int_to(arg, "--swap-buffers", "nvme.swap_buffers", &b->swap_buffers);
        return 1;
    default: return 0;
    }
}

/* The method and schedule flags (METHOD_OPTIONS): 1 when `c` is one. */
static int parse_method_flag(int c, const char *arg, method_flags *f, zo_status *st)
{
    zo_plan_tier tier = ZO_PLAN_GPU;
    zo_plan_schedule sched = ZO_PLAN_SCHED_SERIAL;
    switch (c) {
    case OPT_LORA: *st = zo_plan_flag_int(arg, "--lora", "training.lora.r", &f->lora_r); return 1;
    case OPT_LORA_TARGETS: f->targets = arg; return 1;
    case OPT_LORA_ALPHA:
        *st = zo_plan_flag_double(arg, "--lora-alpha", "training.lora.alpha", &f->alpha);
        f->alpha_set = 1;
        return 1;
    case OPT_QLORA: f->qlora = 1; return 1;
    case OPT_ADAPTERS_ON:
        *st = zo_plan_tier_parse(arg, "--adapters-on", 1, &tier);
        f->adapters_on = (int)tier;
        return 1;
    case OPT_SCHEDULE:
        *st = zo_plan_schedule_parse(arg, "--schedule", &sched);
        f->schedule = *st == ZO_OK ? (int)sched : -1;
        return 1;
    case OPT_DPU_WARMUP:
        *st = zo_plan_flag_int(arg, "--dpu-warmup", "training.dpu_warmup", &f->dpu_warmup);
        f->dpu_warmup_set = 1;
        return 1;
    case OPT_OPT_THREADS:
        *st = zo_plan_flag_int(arg, "--opt-threads", "training.opt_threads", &f->opt_threads);
        return 1;
    case OPT_CLIP_STALE: f->clip_stale = 1; return 1;
    case OPT_MASTER: {
        zo_plan_master ma = ZO_PLAN_MASTER_FP32;
        *st = zo_plan_master_parse(arg, "--master", &ma);
        f->master = (int)ma;
        return 1;
    }
    case OPT_RECIPE:
        if (strcasecmp(arg, "qlora")) {
            *st = zo_error(ZO_ERR_INVALID, "--recipe: '%s' is not qlora (the QLoRA paper's: NF4 "
                           "base, adapters on every linear layer, bf16, 32-bit AdamW, no fp32 master)",
                           arg);
            return 1;
        }
        f->recipe_qlora = 1;
        return 1;
    default: return 0;
    }
}

/* --json, --json-out FILE, --svg FILE: 1 when `c` is one. */
static int parse_output_flag(int c, const char *arg, cli_flags *f)
{
    switch (c) {
    case OPT_JSON: f->json = 1; return 1;
    case OPT_JSON_OUT: f->json_out = arg; return 1;
    case OPT_SVG: f->svg_path = arg; return 1;
    default: return 0;
    }
}

static void cli_flags_init(cli_flags *f)
{
    memset(f, 0, sizeof *f);
    f->params_on = ZO_PLAN_GPU;
    f->optim = ZO_PLAN_ADAMW;
    f->dropout = -1;
    f->recompute = -1;
    f->mf.schedule = -1;
    f->mf.adapters_on = -1;
    f->mf.master = -1;
    f->opt_state = -1;
}

/* An option getopt refused, or an argument left over after the options
 * (the old `--json FILE`?); EXIT_BADINPUT. */
static int usage_error(const cli_command *cmd, int c, int argc, char **argv)
{
    if (optind < argc && c == -1) {
        int after_json = optind > 1 && !strcmp(argv[optind - 1], "--json");
        zo_error(ZO_ERR_INVALID, "%s: unexpected argument '%s'%s", cmd->name, argv[optind],
                 after_json ? " (--json prints JSON to stdout; --json-out FILE writes it to FILE)"
                            : "");
        return fail();
    }
    fprintf(stderr, c == ':' ? "memplan: %s needs a value (see 'memplan %s --help')\n"
                             : "memplan: unknown option '%s' (see 'memplan %s --help')\n",
            argv[optind - 1], cmd->name);
    return EXIT_BADINPUT;
}

int cli_parse(const cli_command *cmd, int argc, char **argv, cli_flags *f, void *own)
{
    int c;
    cli_flags_init(f);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", cmd->opts, NULL)) != -1) {
        zo_status st = ZO_OK;
        if (c >= OPT_MODEL && c < OPT_END) f->seen[c] = 1;
        if (c == OPT_HELP || c == 'h') {
            fputs(cmd->usage, stdout);
            return 0;
        }
        if (c == OPT_VERSION) {
            zo_version_print(stdout, "memplan");
            return 0;
        }
        int known = parse_model_flag(cmd, c, optarg, f, &st) ||
                    parse_hw_flag(c, optarg, &f->hwf, &st) || parse_train_flag(c, optarg, f, &st) ||
                    parse_buffer_flag(c, optarg, &f->buf, &st) ||
                    parse_method_flag(c, optarg, &f->mf, &st) || parse_output_flag(c, optarg, f) ||
                    (cmd->own_flag && cmd->own_flag(c, optarg, own, &st));
        if (!known) return usage_error(cmd, c, argc, argv);
        if (st) return fail();
    }
    return optind < argc ? usage_error(cmd, c, argc, argv) : CLI_PARSED;
}

/* ---- applying the flags ---------------------------------------------------------------- */

void apply_train_flags(const cli_flags *f, plan_train *t)
{
    if (f->seq) t->seq = (int)f->seq;
    t->seq_is_default = !f->seq;
    if (f->seen[OPT_DTYPE]) t->dtype = t->grad_dtype = f->dtype;
    if (f->seen[OPT_GRAD_DTYPE]) t->grad_dtype = f->grad_dtype;
    if (f->seen[OPT_REDUCE_DTYPE]) t->reduce_dtype = f->reduce_dtype;
    t->runtime = f->runtime;
    t->optimizer = f->optim;
    if (f->opt_state >= 0 && f->opt_state < ZO_PLAN_STATES) t->opt_state = (zo_plan_opt_state)f->opt_state;
    if (f->seen[OPT_LOSS_CHUNK]) t->loss_chunk = (int)f->loss_chunk;
    if (f->seen[OPT_NO_FLASH]) t->flash_attn = 0;
    t->attn_path = f->attn_path;
    if (f->dropout >= 0) t->dropout = f->dropout;
}

void apply_buffer_flags(const cli_flags *f, plan_buffers *b)
{
    if (f->seen[OPT_CUDA_CONTEXT]) b->cuda_context = f->buf.cuda_context;
    if (f->seen[OPT_CUBLAS_WS]) b->cublas_workspace = f->buf.cublas_workspace;
    if (f->seen[OPT_COMM_BUCKET]) b->comm_bucket = f->buf.comm_bucket;
    if (f->seen[OPT_COMM_BUCKETS]) b->comm_buckets = f->buf.comm_buckets;
    if (f->seen[OPT_PREFETCH]) b->prefetch_depth = f->buf.prefetch_depth;
    if (f->seen[OPT_PINNED]) b->pinned_staging = f->buf.pinned_staging;
    if (f->seen[OPT_FRAG]) b->fragmentation = f->buf.fragmentation;
    if (f->seen[OPT_SUB_GROUP]) b->sub_group = f->buf.sub_group;
    if (f->seen[OPT_SWAP_BUFFERS]) b->swap_buffers = f->buf.swap_buffers;
}

zo_status apply_method_flags(const method_flags *f, plan_train *t)
{
    zo_status st;
    if (f->recipe_qlora) {
        /* QLoRA (Dettmers et al. 2023), as its 65B run: r 64 on every
         * linear layer, alpha 16, the base in NF4 with double quantization,
         * bf16 adapters updated by 32-bit AdamW with no fp32 master */
        if (t->opt_state != ZO_PLAN_STATE_FP32)
            return zo_error(ZO_ERR_INVALID, "--recipe qlora runs 32-bit AdamW: drop --optim-dtype "
                            "and --optim adamw8bit");
        t->method = ZO_PLAN_QLORA;
        t->lora.r = f->lora_r ? (int)f->lora_r : 64;
        t->lora.alpha = f->alpha_set ? (float)f->alpha : 16;
        t->lora.targets = ZO_LORA_ALL_LINEAR;
        if (f->targets && (st = zo_lora_targets_parse(f->targets, &t->lora.targets)) != ZO_OK)
            return zo_error_wrap(st, "--lora-targets");
        if (f->adapters_on >= 0) t->adapters_on = (zo_plan_tier)f->adapters_on;
        t->master = f->master >= 0 ? (zo_plan_master)f->master : ZO_PLAN_MASTER_NONE;
    } else if (f->master >= 0) {
        t->master = (zo_plan_master)f->master;
    }
    if (!f->recipe_qlora && !f->lora_r && (f->qlora || f->targets || f->alpha_set || f->adapters_on >= 0))
        return zo_error(ZO_ERR_INVALID, "%s needs --lora R (the adapters' rank)",
                        f->qlora ? "--qlora" : f->targets ? "--lora-targets"
                                           : f->alpha_set ? "--lora-alpha" : "--adapters-on");
    if (f->lora_r && !f->recipe_qlora) {
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

/* ---- the model and the machine --------------------------------------------------------- */

static int is_file(const char *p)
{
    struct stat sb;
    return strchr(p, '/') || strstr(p, ".json") ? 1 : (stat(p, &sb) == 0 && S_ISREG(sb.st_mode));
}

/* A Hugging Face model folder (--model DIR: its config.json). */
static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

zo_status read_text(const char *path, char **out)
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

static int is_node_preset(const char *name)
{
    size_t n;
    const plan_hw_preset *p = plan_hw_presets(&n);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(p[i].name, name)) return 1;
    return 0;
}

zo_status build_hw(const plan_hw_flags *f, plan_hw *hw, plan_hw_basis *b)
{
    zo_status st;
    if ((st = plan_hw_flags_check(f)) != ZO_OK) return st;
    const char *name = f->hw ? f->hw : DEFAULT_HW;
    if (!strcmp(name, "cpu") && !is_file(name)) { /* train --device cpu */
        const plan_host_spec *h = NULL;
        if (f->host && (st = plan_host_find(f->host, &h)) != ZO_OK) return st;
        plan_hw_cpu_host(h, hw);
        char what[128];
        snprintf(what, sizeof what, "cpu (train --device cpu, %s host)", h ? h->name : "desktop");
        plan_hw_basis_init(b, PLAN_HW_PRESET, what, 0, hw);
    } else if (f->gpu) {
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

void gpu_node_size(const plan_hw_flags *f, const plan_hw_basis *b, plan_hw *hw)
{
    if (b->source == PLAN_HW_GPU && !f->gpus_per_node) hw->gpus_per_node = hw->gpus;
}

/* A model known only by its size. */
static zo_status size_only_model(uint64_t params_n, long seq, zo_model_config *m)
{
    snprintf(m->name, sizeof m->name, "%.3g-param model", (double)params_n);
    snprintf(m->family, sizeof m->family, "custom");
    m->params_override = params_n;
    m->max_seq = seq ? (int)seq : 2048;
    return ZO_OK;
}

/* The custom shape's flags over `m` (a --model's, or a new GPT one). */
static void apply_shape(const shape_flags *sf, int over_model, zo_model_config *m)
{
    int gpt = m->arch == ZO_ARCH_GPT;
    if (!over_model || sf->arch) {
        m->tied_embeddings = gpt;
        m->attn_bias = m->out_bias = m->norm_bias = gpt;
        m->attn_out_nobias = 0; /* (GPT-J's unbiased attention output is its own) */
        m->qk_norm_heads = 0;   /* (command-r-plus's per-head q/k norm weights too) */
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
    else if (!over_model || sf->hidden)
        /* GPT: 4h; LLaMA: 2/3 of 4h rounded up to a multiple of 256 */
        m->ffn = gpt ? 4 * m->hidden : ((8 * m->hidden / 3 + 255) / 256) * 256;
    if (over_model) snprintf(m->name + strlen(m->name), sizeof m->name - strlen(m->name), "%s", "*");
}

zo_status build_model(const char *model, uint64_t params_n, const shape_flags *sf, long seq,
                      zo_model_config *m)
{
    zo_status st;
    int custom = sf->layers || sf->hidden || sf->heads || sf->kv_heads || sf->ffn || sf->vocab || sf->arch;
    memset(m, 0, sizeof *m);
    if (model) {
        st = is_file(model) || is_dir(model) ? zo_model_config_load(model, m) : zo_model_preset_find(model, m);
        if (st) return st;
    } else if (params_n) {
        if (custom)
            return zo_error(ZO_ERR_INVALID, "--params N and a custom shape (--layers ...) exclude each other");
        return size_only_model(params_n, seq, m);
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
    if (custom) apply_shape(sf, model != NULL, m);
    /* rotary and ALiBi models take longer sequences; a learned table does not */
    if (seq && seq > m->max_seq && !zo_model_position_rows(m)) m->max_seq = (int)seq;
    if (!model && seq) m->max_seq = (int)seq;
    return zo_model_config_validate(m);
}

/* ---- output ---------------------------------------------------------------------------- */

zo_status emit_json(cJSON *doc, int to_stdout, const char *path)
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

zo_status write_svg(const char *path, const zo_model_config *m, const plan_hw *hw,
                    const plan_train *t, const plan_estimate *e, const plan_time *pt)
{
    char *svg = plan_svg(m, hw, t, e, pt);
    if (!svg) return zo_error(ZO_ERR_NOMEM, "--svg %s: out of memory drawing the plan", path);
    zo_status st = zo_file_write_all(path, svg, strlen(svg));
    free(svg);
    return st ? zo_error_wrap(st, "--svg") : ZO_OK;
}
