/* memplan's command line: what its commands share (planner/memplan*.c).
 *
 * One flag parser for every command: the flags that mean the same in each
 * (the model, the hardware, the training settings, the method, the working
 * buffers, the output) are read here once, a command's own flags by its
 * callback. Flags that set a field of a plan are read by the plan schema
 * (zo_plan_flag_int, ...: common/plan_schema.h), which checks them against
 * its range for the field with the message a plan file holding the value
 * gets. */
#ifndef ZO_PLANNER_MEMPLAN_CLI_H
#define ZO_PLANNER_MEMPLAN_CLI_H

#include <getopt.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "planner/basis.h" /* defines: plan_hw_flags, plan_hw_basis */
#include "planner/cost.h"
#include "planner/memory.h"
#include "planner/search.h" /* defines: plan_space, plan_objective */

#define EXIT_NOFIT 1
#define EXIT_BADINPUT 2
/* cli_parse: the arguments are read, the command goes on (any other value
 * is its exit status: 0 after --help, EXIT_BADINPUT after a message) */
#define CLI_PARSED (-1)

#define DEFAULT_HW "h100-80gb"

/* --optim-dtype auto: the search tries every encoding of m and v */
#define PLAN_STATE_AUTO ZO_PLAN_STATES

/* Every command's option ids (getopt_long's val). OPT_MODEL ... OPT_FUSED_ACCUM
 * configure an estimate: a plan file (estimate --plan) refuses them. */
enum {
    OPT_MODEL = 256, OPT_PARAMS, OPT_LAYERS, OPT_HIDDEN, OPT_HEADS, OPT_KV_HEADS, OPT_FFN,
    OPT_VOCAB, OPT_ARCH, OPT_HW, OPT_GPUS, OPT_GPUS_PER_NODE, OPT_GPU_MEM, OPT_CPU_MEM, OPT_NVME,
    OPT_GPU, OPT_HOST, OPT_PCIE, OPT_SEQ, OPT_MICRO_BATCH, OPT_GRAD_ACCUM, OPT_DTYPE,
    OPT_GRAD_DTYPE, OPT_OPTIM, OPT_DP, OPT_TP, OPT_PP, OPT_SP, OPT_VPP, OPT_ZERO, OPT_RECOMPUTE,
    OPT_NO_FLASH, OPT_DROPOUT, OPT_NO_DROPOUT, OPT_GRADS, OPT_OPTIMIZER, OPT_CHECKPOINTS,
    OPT_CUDA_CONTEXT, OPT_CUBLAS_WS, OPT_COMM_BUCKET, OPT_COMM_BUCKETS, OPT_PREFETCH, OPT_PINNED,
    OPT_FRAG, OPT_SUB_GROUP, OPT_SWAP_BUFFERS, OPT_EP, OPT_CAPACITY, OPT_LORA, OPT_LORA_TARGETS,
    OPT_LORA_ALPHA, OPT_QLORA, OPT_ADAPTERS_ON, OPT_SCHEDULE, OPT_DPU_WARMUP, OPT_OPT_THREADS,
    OPT_CLIP_STALE, OPT_REDUCE_DTYPE, OPT_RUNTIME, OPT_RECOMPUTE_LAYERS, OPT_NO_DP_OVERLAP,
    OPT_OPTIM_DTYPE, OPT_MASTER, OPT_LOSS_CHUNK, OPT_RECIPE, OPT_PP_SCHEDULE, OPT_PP_PARTITION,
    OPT_ATTENTION, OPT_FUSED_ACCUM, /* the last configuration flag */
    OPT_JSON, OPT_GLOBAL_BATCH, OPT_SVG, OPT_PLAN, OPT_PLAN_OUT, OPT_HELP, OPT_VERSION, OPT_JSON_OUT,
    OPT_EXPLAIN, /* estimate */
    /* plan and max-model */
    OPT_MAX_GPUS, OPT_OBJECTIVE, OPT_TOP, OPT_NO_OFFLOAD, OPT_NO_NVME, OPT_MAX_MB, OPT_OPT_STEPS,
    OPT_OPT_MIN, OPT_MAX_PREFETCH, OPT_FAMILY, OPT_STRATEGY, OPT_METHOD,
    /* calibrate */
    OPT_OUT, OPT_BASE, OPT_NVME_DIR, OPT_THREADS, OPT_ADAM_PARAMS, OPT_STREAM_BYTES, OPT_SECONDS, OPT_NVME_BYTES,
    OPT_END,
};

/* The model and hardware flags, shared by estimate, plan and max-model. */
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

/* The training, layout, buffer and output flags estimate, plan and max-model
 * all take (estimate adds the rest of the layout and the buffers). */
#define RUN_OPTIONS                                                             \
    {"dtype", required_argument, 0, OPT_DTYPE},                                 \
    {"grad-dtype", required_argument, 0, OPT_GRAD_DTYPE},                       \
    {"optim", required_argument, 0, OPT_OPTIM},                                 \
    {"optim-dtype", required_argument, 0, OPT_OPTIM_DTYPE},                     \
    {"master", required_argument, 0, OPT_MASTER},                               \
    {"loss-chunk", required_argument, 0, OPT_LOSS_CHUNK},                       \
    {"recipe", required_argument, 0, OPT_RECIPE},                               \
    {"global-batch", required_argument, 0, OPT_GLOBAL_BATCH},                   \
    {"no-flash-attn", no_argument, 0, OPT_NO_FLASH},                            \
    {"attention", required_argument, 0, OPT_ATTENTION},                         \
    {"dropout", no_argument, 0, OPT_DROPOUT},                                   \
    {"no-dropout", no_argument, 0, OPT_NO_DROPOUT},                             \
    {"recompute", required_argument, 0, OPT_RECOMPUTE},                         \
    {"reduce-dtype", required_argument, 0, OPT_REDUCE_DTYPE},                   \
    {"runtime", required_argument, 0, OPT_RUNTIME},                             \
    {"zero", required_argument, 0, OPT_ZERO},                                   \
    {"tp", required_argument, 0, OPT_TP},                                       \
    {"pp", required_argument, 0, OPT_PP},                                       \
    {"ep", required_argument, 0, OPT_EP},                                       \
    {"cuda-context", required_argument, 0, OPT_CUDA_CONTEXT},                   \
    {"cublas-workspace", required_argument, 0, OPT_CUBLAS_WS},                  \
    {"fragmentation", required_argument, 0, OPT_FRAG},                          \
    {"sub-group", required_argument, 0, OPT_SUB_GROUP},                         \
    {"json", no_argument, 0, OPT_JSON},                                         \
    {"json-out", required_argument, 0, OPT_JSON_OUT},                           \
    {"svg", required_argument, 0, OPT_SVG},                                     \
    {"help", no_argument, 0, OPT_HELP},                                         \
    {"version", no_argument, 0, OPT_VERSION}

/* What estimate, plan and max-model all take. */
#define SHARED_OPTIONS MODEL_HW_OPTIONS, METHOD_OPTIONS, RUN_OPTIONS

/* A custom shape (--layers ... --arch), as given; 0 or NULL where not. */
typedef struct shape_flags {
    long layers, hidden, heads, kv_heads, ffn, vocab;
    const char *arch;
} shape_flags;

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
    int recipe_qlora;      /* --recipe qlora: the QLoRA paper's (NF4 base, all-linear r 64,
                              bf16 adapters, 32-bit AdamW, no fp32 master) */
    int master;            /* --master: a zo_plan_master; -1: not given */
} method_flags;

/* The flags that mean the same in estimate, plan and max-model, as given. */
typedef struct cli_flags {
    unsigned char seen[OPT_END]; /* each flag given */
    const char *model;           /* --model NAME|CONFIG.json */
    uint64_t params_n;           /* --params N */
    zo_plan_tier params_on;      /* --params gpu|cpu|nvme (estimate) */
    shape_flags sf;
    plan_hw_flags hwf;
    long gpus, seq, global_batch; /* 0: not given */
    long tp, pp, ep;             /* 0: not given */
    zo_dtype dtype, grad_dtype;  /* where seen */
    zo_dtype reduce_dtype;       /* --reduce-dtype, where seen */
    plan_runtime runtime;        /* --runtime (default zoffload) */
    zo_plan_optimizer optim;
    int opt_state;               /* --optim adamw8bit / --optim-dtype: a zo_plan_opt_state;
                                    -1: not given; PLAN_STATE_AUTO: plan searches them */
    long loss_chunk;             /* --loss-chunk N; 0: the whole sequence's logits */
    int dropout;                 /* --dropout 1, --no-dropout 0, -1: the model's */
    zo_attn_path attn_path;      /* --attention (default auto) */
    int recompute;               /* a zo_plan_recompute; -1: not given */
    plan_buffers buf;            /* the working-buffer flags' values, where seen */
    method_flags mf;
    int json;                    /* --json */
    const char *json_out, *svg_path;
} cli_flags;

/* A command: its name in messages, its --help, the options it takes and
 * its own flags (a callback: 1 when `c` is one, its value parsed into `own`,
 * *st set on a bad value). */
typedef struct cli_command {
    const char *name;
    const char *usage;
    const struct option *opts;
    long gpus_max;   /* --gpus N's bound */
    int params_tier; /* --params also places the weights (gpu|cpu|nvme) */
    int (*own_flag)(int c, const char *arg, void *own, zo_status *st);
} cli_command;

/* Parse a command's arguments (argv[0] is the command): the shared flags
 * into `f`, the command's own into `own`. CLI_PARSED, or the exit status:
 * 0 when --help was printed, EXIT_BADINPUT after a message. */
int cli_parse(const cli_command *cmd, int argc, char **argv, cli_flags *f, void *own);

/* Print zo_last_error() as memplan's message; EXIT_BADINPUT. */
int fail(void);

/* What is valid but probably not meant, to stderr. */
void warn(const plan_train *t, const plan_hw *hw);

/* The model of --model, --params N or a custom shape (over --model's). */
zo_status build_model(const char *model, uint64_t params_n, const shape_flags *sf, long seq,
                      zo_model_config *m);

/* The machine the hardware flags describe, and what its figures rest on. */
zo_status build_hw(const plan_hw_flags *f, plan_hw *hw, plan_hw_basis *b);

/* --gpu builds one node: --gpus N puts N of the GPU in it. */
void gpu_node_size(const plan_hw_flags *f, const plan_hw_basis *b, plan_hw *hw);

/* The training flags over `t` (after its defaults): --seq, --dtype,
 * --grad-dtype, --reduce-dtype, --runtime, --optim, --no-flash-attn,
 * --attention, --dropout / --no-dropout. */
void apply_train_flags(const cli_flags *f, plan_train *t);

/* The working-buffer flags given, over `b`. */
void apply_buffer_flags(const cli_flags *f, plan_buffers *b);

/* The method and schedule flags over `t` (the schedule only when given:
 * `plan` searches it otherwise). */
zo_status apply_method_flags(const method_flags *f, plan_train *t);

/* The --json convention of every command: `--json` prints the command's JSON
 * document to stdout in place of its table, `--json-out FILE` writes it to
 * FILE (atomically) beside the table. Takes doc. */
zo_status emit_json(cJSON *doc, int to_stdout, const char *path);

/* The SVG picture of an estimate to `path` (--svg). */
zo_status write_svg(const char *path, const zo_model_config *m, const plan_hw *hw,
                    const plan_train *t, const plan_estimate *e, const plan_time *pt);

/* The whole file as a string (the caller frees it). */
zo_status read_text(const char *path, char **out);

/* The commands (planner/memplan_*.c): each returns memplan's exit status. */
int cmd_estimate(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_max_model(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_models(void);
int cmd_hardware(void);

/* plan and max-model: the search's flags (planner/memplan_plan.c) */
typedef struct search_flags {
    long max_gpus, top, max_mb, opt_steps, max_prefetch; /* 0: not given (top: 5) */
    plan_objective objective;
    int no_offload, no_nvme;
    int zero_set, zmin, zmax;    /* --zero S or A-B */
    double opt_min[ZO_PLAN_TIERS];
    const char *family, *strategy;
    int method;                  /* --method: -1 not given, else a zo_plan_method or PLAN_METHOD_AUTO */
    plan_pp_schedule pp_schedule; /* --pp-schedule: whose pipeline engine times PP > 1 */
    double capacity_factor;       /* --capacity-factor: MoE tokens an expert takes; 0 dropless */
} search_flags;

/* --method lora|qlora|auto without --lora R: the adapters estimate's
 * "fits with" list suggests, rank 16 on every linear layer */
#define PLAN_METHOD_LORA_R 16

/* --method auto: full fine-tuning, LoRA and QLoRA ranked together */
#define PLAN_METHOD_AUTO (ZO_PLAN_QLORA + 1)

/* plan and max-model: the flags, the model (max-model: the family's shape
 * at 1B), the machine and the space searched. */
typedef struct search_cmd {
    cli_flags f;
    search_flags s;
    zo_model_config m;
    plan_hw hw;
    plan_hw_basis basis;
    plan_space space;
} search_cmd;

/* The arguments of plan or max-model (`name`, its --help `usage`), as
 * cli_parse. */
int search_cmd_parse(int argc, char **argv, const char *name, const char *usage, search_cmd *c);

/* The machine of the flags, its GPUs those of --max-gpus or --gpus. */
zo_status search_cmd_hw(search_cmd *c);

/* The search space of the flags for the model c->m on c->hw. */
zo_status search_cmd_space(search_cmd *c);

#endif
