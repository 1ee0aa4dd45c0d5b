/* memplan estimate: the bytes one rank needs per tier and kind, whether it
 * fits, the predicted step time by part; a configuration from flags or from a
 * plan file (docs/memplan.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h" /* defines: zo_file_write_json */
#include "common/units.h"
#include "planner/memplan_cli.h"
#include "planner/planfile.h"
#include "planner/report.h"
#include "planner/suggest.h"

static const char usage_estimate[] =
    "usage: memplan estimate --model NAME|CONFIG.json [options]\n"
    "\n"
    "model (one of):\n"
    "  --model NAME            a preset ('memplan models')\n"
    "  --model PATH            a Hugging Face config.json (its family by model_type: LLaMA,\n"
    "                          Qwen2/3, Gemma, Mixtral, DeepSeek, GPT-NeoX, Falcon, OPT, BLOOM,\n"
    "                          ...; 'memplan models' lists them and those refused)\n"
    "  --model DIR             a Hugging Face model folder: its config.json, the model named\n"
    "                          after the folder\n"
    "  --params N              a model known only by its size (e.g. 7.5e9, 13B): model\n"
    "                          states only, activations unknown\n"
    "  --layers N --hidden N --heads N [--kv-heads N] [--ffn N] --vocab N [--arch gpt|llama]\n"
    "                          a custom shape (also overrides fields of --model)\n"
    "hardware (the report's first lines say what its figures rest on):\n"
    "  --hw NAME               a machine preset ('memplan hardware'); default h100-80gb\n"
    "  --gpu NAME              one GPU preset (rtx-4090, l40s, a100-80gb-pcie, ...) in its usual\n"
    "                          host; with --gpus N, N of them in one node\n"
    "  --host NAME             with --gpu or --hw cpu: desktop, workstation or server\n"
    "  --hw cpu                train --device cpu: the CPU backend of --host (default desktop),\n"
    "                          no CUDA context, cuBLAS workspace or allocator slack; --gpu-mem\n"
    "                          is train's --device-mem (default: the host's memory)\n"
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
    "  --grad-dtype DTYPE      gradients (default: --dtype; fp32 = Megatron's 18 B/param); this\n"
    "                          runtime sums a GPU optimizer share's in fp32 whatever it is, so\n"
    "                          it sizes GPU gradients with --runtime eager or TP/PP only\n"
    "  --optim adamw|adamw8bit|sgd  AdamW: fp32 master + m + v (12 B/param); adamw8bit: m and v\n"
    "                          block-wise 8-bit (Dettmers et al. 2022; 6.004 B/param with the\n"
    "                          master); SGD: master + momentum\n"
    "  --optim-dtype fp32|bf16|8bit  AdamW's m and v (bf16: 8 B/param with the master)\n"
    "  --master fp32|none|stochastic|kahan  the fp32 master copy (default), or none: the\n"
    "                          optimizer updates the bf16 weights, rounded to nearest,\n"
    "                          stochastically, or Kahan-compensated (2 B/param more)\n"
    "  --recipe qlora          the QLoRA paper's: NF4 base, --lora 64 (or R) on every linear\n"
    "                          layer, alpha 16, bf16 adapters, 32-bit AdamW, --master none\n"
    "  --loss-chunk N          the output layer and cross-entropy N tokens at a time: the fp32\n"
    "                          logits of N tokens live, not of the micro-batch\n"
    "  --reduce-dtype fp32|bf16|fp16  the gradients' data-parallel reduction (default fp32,\n"
    "                          the runtime's); a plan field the runtime honours\n"
    "  --runtime zoffload|eager  what runs the step: this project's runtime (default), or\n"
    "                          eager PyTorch (what its ops keep, measured; no plan file)\n"
    "fine-tuning method (default: every parameter):\n"
    "  --lora R                LoRA adapters of rank R on a frozen base: trainable parameters\n"
    "                          as Hugging Face PEFT counts them; no base gradients or optimizer state\n"
    "  --lora-targets LIST     q,k,v,o,gate,up,down (or PEFT's q_proj, ..., Mixtral's w1,w3,w2) or all-linear\n"
    "                          (default q,v: PEFT's; on GPT-2 its fused c_attn; on Phi-3 qkv_proj,\n"
    "                          and gate or up its gate_up_proj)\n"
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
    "  --pp-schedule megatron|deepspeed  whose pipeline engine (time only): Megatron-LM's 1F1B\n"
    "                          (default), or DeepSpeed's of 2021 (MT-NLG's): blocking sends one\n"
    "                          tensor at a time, the tied embedding's gradient all-reduced and\n"
    "                          the data-parallel reduction run after the pipeline's flush\n"
    "  --pp-partition layers|embedding  the layers a stage: L/p (default), or with deepspeed its\n"
    "                          'type:transformer|embedding' (BLOOM's): (L + 2)/p, the embedding\n"
    "                          and the tied output layer each counted as a layer\n"
    "  --zero 0|1|2|3          ZeRO stage: 1 shards optimizer state over DP, 2 also\n"
    "                          gradients, 3 also parameters (default 0)\n"
    "  --recompute none|selective|full|ops   activation recomputation (default none): the\n"
    "                          attention core, whole layers, or every other matmul and the\n"
    "                          elementwise ops (PyTorch's selective checkpointing by op)\n"
    "  --recompute-layers K    with --recompute full: only the first K layers of each\n"
    "                          pipeline stage (Megatron's --recompute-num-layers)\n"
    "  --no-flash-attn         standard attention (keeps the s^2 softmax terms)\n"
    "  --attention auto|flash|gemm|tc|mma   this runtime's attention kernels on a GPU whose\n"
    "                          rates memplan has (time only): auto (default) the runtime's\n"
    "                          automatic choice; another as ZO_ATTENTION forces it\n"
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
    "  --capacity-factor F     tokens an expert takes, x its fair share (default 0: dropless):\n"
    "                          per micro-batch and layer an expert keeps C = ceil(F N top_k /\n"
    "                          experts) of a rank's N tokens' pairs, every first choice before\n"
    "                          any second, tokens in order; the rest are dropped (with --ep each\n"
    "                          rank drops among its own tokens). This runtime holds min(N top_k,\n"
    "                          experts C) pairs (train runs it); --runtime eager pads to capacity\n"
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
    "  --explain               under the table, the step's compute by kind of op (matmuls,\n"
    "                          attention, elementwise, LoRA, NF4), to set beside train --profile\n"
    "  --hw FILE               (above) also takes a profile from 'memplan calibrate'\n";

static const struct option estimate_opts[] = {
    SHARED_OPTIONS,
    {"micro-batch", required_argument, 0, OPT_MICRO_BATCH},
    {"grad-accum", required_argument, 0, OPT_GRAD_ACCUM},
    {"dp", required_argument, 0, OPT_DP},
    {"sp", no_argument, 0, OPT_SP},
    {"vpp", required_argument, 0, OPT_VPP},
    {"grads", required_argument, 0, OPT_GRADS},
    {"optimizer", required_argument, 0, OPT_OPTIMIZER},
    {"checkpoints", required_argument, 0, OPT_CHECKPOINTS},
    {"comm-bucket", required_argument, 0, OPT_COMM_BUCKET},
    {"comm-buckets", required_argument, 0, OPT_COMM_BUCKETS},
    {"prefetch", required_argument, 0, OPT_PREFETCH},
    {"pinned-staging", required_argument, 0, OPT_PINNED},
    {"swap-buffers", required_argument, 0, OPT_SWAP_BUFFERS},
    {"capacity-factor", required_argument, 0, OPT_CAPACITY},
    {"recompute-layers", required_argument, 0, OPT_RECOMPUTE_LAYERS},
    {"no-dp-overlap", no_argument, 0, OPT_NO_DP_OVERLAP},
    {"fused-grad-accum", no_argument, 0, OPT_FUSED_ACCUM},
    {"pp-schedule", required_argument, 0, OPT_PP_SCHEDULE},
    {"pp-partition", required_argument, 0, OPT_PP_PARTITION},
    {"plan", required_argument, 0, OPT_PLAN},
    {"plan-out", required_argument, 0, OPT_PLAN_OUT},
    {"explain", no_argument, 0, OPT_EXPLAIN},
    {0, 0, 0, 0},
};

/* The estimate's own flags, as given (0 where not). */
typedef struct estimate_flags {
    const char *plan_path, *plan_out;
    int explain;
    long dp, micro_batch, grad_accum, vpp, zero, recompute_layers;
    int sp;
    double capacity_factor;
    double opt_frac[ZO_PLAN_TIERS];
    zo_plan_tier grads_on, ck_on;
    plan_pp_schedule pp_schedule;
    plan_pp_partition pp_partition;
} estimate_flags;

static int estimate_flag(int c, const char *arg, void *own, zo_status *st)
{
    estimate_flags *e = own;
    switch (c) {
    case OPT_MICRO_BATCH:
        *st = zo_plan_flag_int(arg, "--micro-batch", "training.micro_batch", &e->micro_batch);
        return 1;
    case OPT_GRAD_ACCUM:
        *st = zo_plan_flag_int(arg, "--grad-accum", "training.grad_accum", &e->grad_accum);
        return 1;
    case OPT_DP: *st = zo_plan_flag_int(arg, "--dp", "parallel.dp", &e->dp); return 1;
    case OPT_SP: e->sp = 1; return 1;
    case OPT_VPP: *st = zo_plan_flag_int(arg, "--vpp", "parallel.vpp", &e->vpp); return 1;
    case OPT_ZERO: *st = zo_plan_flag_int(arg, "--zero", "parallel.zero", &e->zero); return 1;
    case OPT_GRADS: *st = zo_plan_tier_parse(arg, "--grads", 0, &e->grads_on); return 1;
    case OPT_OPTIMIZER: *st = zo_plan_fractions_parse(arg, "--optimizer", 1, e->opt_frac); return 1;
    case OPT_CHECKPOINTS: *st = zo_plan_tier_parse(arg, "--checkpoints", 0, &e->ck_on); return 1;
    case OPT_CAPACITY:
        *st = zo_plan_flag_double(arg, "--capacity-factor", "parallel.capacity_factor",
                                  &e->capacity_factor);
        return 1;
    case OPT_RECOMPUTE_LAYERS:
        *st = zo_plan_flag_int(arg, "--recompute-layers", "training.recompute_layers",
                               &e->recompute_layers);
        return 1;
    case OPT_NO_DP_OVERLAP: case OPT_FUSED_ACCUM: return 1;
    case OPT_PP_SCHEDULE: *st = plan_pp_schedule_parse(arg, "--pp-schedule", &e->pp_schedule); return 1;
    case OPT_PP_PARTITION:
        *st = plan_pp_partition_parse(arg, "--pp-partition", &e->pp_partition);
        return 1;
    case OPT_PLAN: e->plan_path = arg; return 1;
    case OPT_PLAN_OUT: e->plan_out = arg; return 1;
    case OPT_EXPLAIN: e->explain = 1; return 1;
    default: return 0;
    }
}

/* The data-parallel degree and the job's GPUs: --dp, or what --gpus (or the
 * preset's GPUs) leaves after TP x PP. */
static zo_status set_layout(const cli_flags *f, const estimate_flags *e, plan_hw *hw, plan_train *t)
{
    t->tp = f->tp ? (int)f->tp : 1;
    t->pp = f->pp ? (int)f->pp : 1;
    long model_par = (long)t->tp * t->pp;
    if (e->dp) {
        t->dp = (int)e->dp;
    } else if (f->gpus) {
        if (f->gpus % model_par)
            return zo_error(ZO_ERR_INVALID, "--tp %d x --pp %d = %ld does not divide --gpus %ld",
                            t->tp, t->pp, model_par, f->gpus);
        t->dp = (int)(f->gpus / model_par);
    } else {
        /* fill the preset's GPUs with data parallelism where they divide */
        t->dp = hw->gpus % model_par ? 1 : (int)(hw->gpus / model_par);
        if (t->dp < 1) t->dp = 1;
    }
    hw->gpus = f->gpus ? (int)f->gpus : (int)((long)t->dp * model_par);
    return ZO_OK;
}

/* --global-batch N: the gradient accumulation that makes it. */
static zo_status set_global_batch(const cli_flags *f, plan_train *t)
{
    long per = (long)t->micro_batch * t->dp;
    if (f->seen[OPT_GRAD_ACCUM])
        return zo_error(ZO_ERR_INVALID, "--global-batch and --grad-accum exclude each other");
    if (f->global_batch % per)
        return zo_error(ZO_ERR_INVALID,
                        "--global-batch %ld is not a multiple of --micro-batch %d x DP %d = %ld",
                        f->global_batch, t->micro_batch, t->dp, per);
    t->grad_accum = (int)(f->global_batch / per);
    return ZO_OK;
}

/* The configuration of the flags: the model's defaults on the hardware, then
 * every flag given. */
static zo_status configure(const cli_flags *f, const estimate_flags *e, zo_model_config *m,
                           plan_hw *hw, plan_hw_basis *basis, plan_train *t)
{
    zo_status st;
    if ((st = build_model(f->model, f->params_n, &f->sf, f->seq, m)) != ZO_OK ||
        (st = build_hw(&f->hwf, hw, basis)) != ZO_OK)
        return st;
    plan_train_defaults(t, m);
    plan_train_fit_hw(t, hw);
    apply_train_flags(f, t);
    if (e->micro_batch) t->micro_batch = (int)e->micro_batch;
    if (e->grad_accum) t->grad_accum = (int)e->grad_accum;
    if ((st = set_layout(f, e, hw, t)) != ZO_OK) return st;
    gpu_node_size(&f->hwf, basis, hw);
    if (e->vpp) t->vpp = (int)e->vpp;
    t->sp = e->sp;
    t->zero = (int)e->zero;
    if (f->recompute >= 0) t->recompute = (zo_plan_recompute)f->recompute;
    t->recompute_layers = (int)e->recompute_layers;
    t->params_on = f->params_on;
    memcpy(t->opt_frac, e->opt_frac, sizeof t->opt_frac);
    /* the CPU optimizer needs the gradients on the host: follow it unless told */
    t->grads_on = f->seen[OPT_GRADS]               ? e->grads_on
                  : e->opt_frac[ZO_PLAN_GPU] < 1 ? ZO_PLAN_CPU
                                                 : ZO_PLAN_GPU;
    t->checkpoints_on = e->ck_on;
    apply_buffer_flags(f, &t->buf);
    if (f->ep) t->ep = (int)f->ep;
    t->capacity_factor = e->capacity_factor;
    if (f->seen[OPT_NO_DP_OVERLAP]) t->dp_overlap = 0;
    if (f->seen[OPT_FUSED_ACCUM]) t->fused_grad_accum = 1;
    t->pp_schedule = e->pp_schedule;
    t->pp_partition = e->pp_partition;
    if ((st = apply_method_flags(&f->mf, t)) != ZO_OK) return st;
    return f->global_batch ? set_global_batch(f, t) : ZO_OK;
}

/* estimate --plan FILE: the plan says everything; only the output flags
 * combine with it. */
static zo_status from_plan_file(const cli_flags *f, const char *path, zo_model_config *m,
                                plan_hw *hw, plan_hw_basis *basis, plan_train *t)
{
    for (int k = OPT_MODEL; k <= OPT_FUSED_ACCUM; k++)
        if (f->seen[k])
            return zo_error(ZO_ERR_INVALID, "--plan: the plan file fixes the model, hardware and "
                                            "configuration; give only --json, --json-out, --svg or "
                                            "--plan-out with it");
    char *text;
    zo_status st = read_text(path, &text);
    if (st != ZO_OK) return st;
    st = plan_file_parse(text, path, m, hw, t);
    free(text);
    if (st == ZO_OK) plan_hw_basis_init(basis, PLAN_HW_PLAN, path, 0, hw);
    return st;
}

/* What train does not run of this configuration (tensor or pipeline
 * parallelism, ...: the capability table's words), said under the report:
 * estimate sizes it, train --plan refuses it with these words. */
static void runtime_note(const zo_model_config *m, const plan_train *t)
{
    zo_run_shape run;
    char why[512];
    plan_run_shape(m, t, &run);
    if (t->runtime != PLAN_RUNTIME_ZOFFLOAD || zo_capability_check(&run, why, sizeof why) == ZO_OK) return;
    zo_clear_error();
    printf("\nfor the runtime: train --plan refuses this configuration (docs/offload.md, \"What the runtime "
           "runs\"): %s\n", why);
}

/* --explain: a step's compute by kind of op (plan_time_mb.ops over its
 * micro-batches), the rest of the step as it is, and which kernels the
 * figures take (docs/memplan.md, "This runtime's kernels"). */
static void explain(const plan_hw *hw, const plan_train *t, const plan_time *pt)
{
    double n = t->grad_accum, step = pt->step;
    const plan_kernels *k = t->runtime == PLAN_RUNTIME_ZOFFLOAD ? plan_hw_kernels(hw) : NULL;
    printf("\ncompute by kind of op, %g micro-batch%s of the slowest stage (--explain):\n", n, n == 1 ? "" : "es");
    if (k) printf("  this runtime's kernels as measured on the %s (%s)\n", hw->gpu, k->source);
    else printf("  no measurement of this runtime's kernels on the %s: FlashAttention at 0.75 of the matmul "
                "curve, elementwise work at %.2f of HBM\n", hw->gpu, hw->hbm_eff);
    double ops = 0;
    for (int i = 0; i < PLAN_OPS; i++) {
        double s = n * pt->mb.ops[i];
        ops += s;
        if (s > 0) printf("    %-28s %10.2f ms  %5.1f%%\n", plan_op_name(i), 1e3 * s, 100 * s / step);
    }
    double rest = pt->forward + pt->backward - ops;
    if (rest > 1e-12)
        printf("    %-28s %10.2f ms  %5.1f%%\n", "gradient accumulation", 1e3 * rest, 100 * rest / step);
    if (pt->recompute > 0)
        printf("    %-28s %10.2f ms  %5.1f%%\n", "recompute", 1e3 * pt->recompute, 100 * pt->recompute / step);
    double other = step - pt->forward - pt->backward - pt->recompute;
    printf("    %-28s %10.2f ms  %5.1f%%\n", "the rest of the step", 1e3 * other, 100 * other / step);
}

/* The report (table and/or JSON), the picture and the plan file. */
static zo_status report(const cli_flags *f, const estimate_flags *e, const zo_model_config *m,
                        const plan_hw *hw, const plan_hw_basis *basis, const plan_train *t,
                        plan_estimate *est)
{
    zo_status st;
    plan_time pt;
    if ((st = plan_estimate_run(m, hw, t, est)) != ZO_OK) return st;
    warn(t, hw);
    if ((st = plan_time_run(m, hw, t, est, &pt)) != ZO_OK) return st;
    plan_suggestions sg = {0};
    if (!est->fits && (st = plan_suggest(m, hw, t, &sg)) != ZO_OK) return st;
    if (f->json || f->json_out) {
        cJSON *doc = plan_report_json(m, hw, t, est, &pt, &sg);
        cJSON_AddItemToObject(cJSON_GetObjectItem(doc, "hardware"), "basis",
                              plan_hw_basis_json(hw, basis));
        if ((st = emit_json(doc, f->json, f->json_out)) != ZO_OK) return st;
    }
    if (!f->json) {
        plan_report_basis(stdout, hw, basis);
        plan_report_table(stdout, m, hw, t, est, &pt, &sg);
        if (e->explain) explain(hw, t, &pt);
        runtime_note(m, t);
    }
    if (f->svg_path && (st = write_svg(f->svg_path, m, hw, t, est, &pt)) != ZO_OK) return st;
    if (e->plan_out) {
        cJSON *doc;
        if ((st = plan_file_json(m, hw, t, est, &pt, e->plan_out, &doc)) != ZO_OK) return st;
        st = zo_file_write_json(e->plan_out, doc);
        cJSON_Delete(doc);
        if (st) return st;
        if (!f->json) printf("\nplan written to %s (train --plan %s)\n", e->plan_out, e->plan_out);
    }
    return ZO_OK;
}

int cmd_estimate(int argc, char **argv)
{
    static const cli_command cmd = {"estimate", usage_estimate, estimate_opts, 1 << 24, 1,
                                    estimate_flag};
    cli_flags f;
    estimate_flags e = {.opt_frac = {1, 0, 0}};
    int rc = cli_parse(&cmd, argc, argv, &f, &e);
    if (rc != CLI_PARSED) return rc;
    zo_model_config m;
    plan_hw hw;
    plan_hw_basis basis;
    plan_train t;
    plan_estimate est;
    zo_status st = e.plan_path ? from_plan_file(&f, e.plan_path, &m, &hw, &basis, &t)
                               : configure(&f, &e, &m, &hw, &basis, &t);
    if (st != ZO_OK || report(&f, &e, &m, &hw, &basis, &t, &est) != ZO_OK) return fail();
    return est.fits ? 0 : EXIT_NOFIT;
}
