/* train's flags (args.h): the help text, the options, a handler for each
 * group of flags and the checks across them. */
#include "examples/train/args.h"

#include <dirent.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/plan_schema.h" /* defines: zo_plan_flag_int, zo_plan_flag_double, zo_plan_flag_u64 */
#include "common/plan_vocab.h"  /* defines: zo_plan_tier_parse, zo_plan_fractions_parse, ... */
#include "common/units.h"       /* defines: zo_parse_int, zo_parse_double, zo_parse_size */
#include "common/version.h"     /* defines: zo_version_print */

/* The run vocabulary's values are the runtime's, in one order. */
_Static_assert((int)ZO_PLAN_GPU == (int)OFFLOAD_DEVICE && (int)ZO_PLAN_CPU == (int)OFFLOAD_CPU &&
                   (int)ZO_PLAN_NVME == (int)OFFLOAD_NVME && (int)ZO_PLAN_TIERS == (int)OFFLOAD_TIERS,
               "the plan's tiers are the runtime's");
_Static_assert((int)ZO_PLAN_SCHED_SERIAL == (int)OFFLOAD_SCHEDULE_SERIAL &&
                   (int)ZO_PLAN_SCHED_OVERLAP == (int)OFFLOAD_SCHEDULE_OVERLAP &&
                   (int)ZO_PLAN_SCHED_DPU == (int)OFFLOAD_SCHEDULE_DPU,
               "the plan's optimizer schedules are the runtime's");

static const char HELP[] =
    "usage: train --model CONFIG|PRESET --data FILE [options]\n"
    "\n"
    "Train or fine-tune a GPT-2, GPT-NeoX (Pythia), Falcon, OPT, BLOOM, Phi-1/2, GPT-J, StarCoder2,\n"
    "Cohere (Command-R, Aya), Cohere2 (Command-R7B, Command-A) or LLaMA-family transformer (LLaMA,\n"
    "Mistral, Qwen2/3, Phi-3, Gemma, Gemma-2/3, Granite, OLMo-2/3, EXAONE 4.0, SmolLM3, Seed-OSS,\n"
    "ERNIE 4.5; Mixtral, Granite-MoE, Qwen-MoE, DeepSeekMoE, DeepSeek-V2/V3 and Kimi-K2 with their\n"
    "latent attention, GLM-4.5, OLMoE, Phi-3.5-MoE, gpt-oss; 'memplan\n"
    "models' lists each model_type, * where it trains) on a token file, or on text through the model's tokenizer.json (docs/finetune.md).\n"
    "Batches are sequential: at step k, row i starts at token ((k*B + i) * S) mod (N - S - 1)\n"
    "(padded rows: row i is record (k*B + i) mod R).\n"
    "\n"
    "model and data:\n"
    "  --model CONFIG|DIR|PRESET  a Hugging Face config.json; a Hugging Face model folder\n"
    "                         (config.json, tokenizer.json, model.safetensors or a sharded\n"
    "                         index: its weights, and its tokenizer for text --data ending in\n"
    "                         .txt, .json or .jsonl, where --weights and --tokenizer are not\n"
    "                         given; the model named after the folder in reports, plots and\n"
    "                         the adapter's base_model_name_or_path); or a preset name (gpt2,\n"
    "                         llama-2-7b, ...). A multimodal checkpoint (Gemma-3 4b and up,\n"
    "                         Mistral-Small-3.1, LLaVA) trains as its text model; --save\n"
    "                         writes that text model (docs/model.md)\n"
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
    "  --warmup N             warmup steps: step k <= N (counted from 1) runs at lr * k/N\n"
    "                         (default 0)\n"
    "  --min-lr X             the floor cosine and linear decay to (default 0)\n"
    "  --schedule-steps N     the steps the schedule spans (default --steps): a run may stop\n"
    "                         earlier and be resumed on the same schedule\n"
    "  --beta1 X --beta2 X    AdamW betas (default 0.9, 0.999: Hugging Face Trainer's)\n"
    "  --eps X                AdamW epsilon (default 1e-8)\n"
    "  --weight-decay X       decoupled weight decay on 2-D weights, LoRA adapters included\n"
    "                         (default 0: Hugging Face Trainer's, so no decay on adapters)\n"
    "  --optim adamw|adamw8bit  AdamW, or AdamW with m and v block-wise 8-bit (Dettmers et al.\n"
    "                         2022; the fp32 master kept): memplan's flag\n"
    "  --optim-dtype fp32|bf16|8bit  AdamW's m and v in the CPU optimizer's memory and on NVMe\n"
    "                         (default fp32; the GPU optimizer keeps fp32)\n"
    "  --master fp32          the fp32 master (memplan models none, stochastic, kahan; the\n"
    "                         runtime refuses them)\n"
    "  --loss-chunk N         the output layer and cross-entropy N tokens at a time: the fp32\n"
    "                         logits of N tokens held, never the micro-batch's (memplan's flag)\n"
    "  --clip X               max gradient norm; 0 disables (default 1.0)\n"
    "  --dtype fp32|fp16|bf16 device storage of weights, gradients, activations (default bf16,\n"
    "                         memplan's; a --plan's dtype where it has one)\n"
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
    "  --lora-targets LIST    linear layers with adapters: q,k,v,o,gate,up,down (any of them;\n"
    "                         PEFT's q_proj ... down_proj, Mixtral's w1,w3,w2 too) or all-linear\n"
    "                         (default q,v; GPT-2: q, k or v adapt c_attn; Phi-3: q, k or v adapt\n"
    "                         qkv_proj, gate or up gate_up_proj, PEFT's; GPT-NeoX, Falcon, BLOOM: q, k or v\n"
    "                         adapt query_key_value, PEFT's dense, dense_h_to_4h, dense_4h_to_h\n"
    "                         name o, up, down; OPT: PEFT's q_proj, v_proj, out_proj, fc1, fc2\n"
    "                         name o, up, down; Phi-1/2: q_proj, k_proj, v_proj, dense, fc1, fc2\n"
    "                         name q, k, v, o, up, down; GPT-J: q_proj, k_proj, v_proj, out_proj,\n"
    "                         fc_in, fc_out name q, k, v, o, up, down; StarCoder2: q_proj,\n"
    "                         k_proj, v_proj, o_proj, c_fc name q, k, v, o, up, and down its\n"
    "                         c_proj (c_proj here names o and down, as on GPT-2; an adapter's\n"
    "                         target_modules are matched as PEFT does); an MoE model: gate,\n"
    "                         up, down adapt every routed expert's and the shared expert's; the\n"
    "                         router carries none)\n"
    "  --lora-alpha A         the adapters' update is scaled by A / R (default 8, PEFT's)\n"
    "  --qlora                the base's linear weights in NF4 with double quantization\n"
    "  --adapter DIR          start from a PEFT adapter directory (adapter_config.json and\n"
    "                         adapter_model.safetensors; its r, alpha and targets are used)\n"
    "  --adapters-on gpu|cpu|nvme  where the adapters live (default gpu; --params places\n"
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
    "  --params gpu|cpu|nvme  16-bit weights: resident, or streamed from pinned host / NVMe\n"
    "  --grads gpu|cpu        where the gradients go: gpu with --optimizer gpu (summed on the\n"
    "                         device in fp32), else cpu (pinned host memory, for the cpu and\n"
    "                         nvme shares; the gpu share's stay on the device); checked\n"
    "                         against --optimizer, as memplan prints them\n"
    "  --optimizer SPEC       fp32 master + Adam moments: cpu, nvme, gpu, or fractions\n"
    "                         cpu=0.5,nvme=0.3,gpu=0.2 (the gpu share: whole blocks, its\n"
    "                         gradients summed and updated on the device)\n"
    "  --checkpoints gpu|cpu  activation checkpoints between blocks (cpu needs --recompute full)\n"
    "                         (memplan's names; --params-on, --optimizer-on, --checkpoints-on:\n"
    "                         deprecated spellings of the same flags)\n"
    "  --recompute none|selective|full|ops  recompute each block's activations in backward\n"
    "                         (default none; selective runs as none: the attention keeps\n"
    "                         no s x s scores, so there is nothing selective to recompute;\n"
    "                         ops: by op, PyTorch's every other matmul: each layer keeps its\n"
    "                         input, qkv, the attention output and fc1/gate and recomputes\n"
    "                         the norms, o, up and the activation (with LoRA each adapter's\n"
    "                         x A too); dense layers without latent attention, full\n"
    "                         fine-tuning, LoRA or QLoRA, checkpoints on the GPU)\n"
    "  --recompute-layers K   with --recompute full: only the first K layers recompute, the\n"
    "                         others keep their activations (Megatron's --recompute-num-layers,\n"
    "                         memplan's flag; default 0: every layer; needs --checkpoints-on gpu)\n"
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
    "  --opt-threads N        the optimizer's threads with overlap or dpu; the host's gradient\n"
    "                         sums get the rest of --threads (default: the sums a quarter)\n"
    "\n"
    "several ranks (under mpirun -np N, or a launcher setting OMPI_COMM_WORLD_* or PMI_*):\n"
    "  --zero 0|1|2|3         ZeRO stage (default: the plan's, else 0): 0 replicate, 1 partition\n"
    "                         the optimizer state, 2 also the gradients, 3 also the weights\n"
    "                         (with LoRA: the adapters are the weights trained, the frozen\n"
    "                         base is replicated at 0-2 and partitioned at 3); every method\n"
    "                         and schedule runs at every stage; ZeRO 1-2 keep the trained\n"
    "                         weights on the GPU (weights off it: --zero 3)\n"
    "  --tp N, --pp N, --ep N  tensor, pipeline and expert parallel degrees (memplan's flags):\n"
    "                         tp and pp above 1 are refused (exit 2); --ep N (N | ranks,\n"
    "                         N | experts) gives each group of N ranks every expert, a rank\n"
    "                         E/N of them, tokens exchanged by all-to-all: full fine-tuning,\n"
    "                         LoRA and QLoRA at ZeRO 0-3, every placement the stage takes;\n"
    "                         --ckpt and --resume at every stage and placement (a checkpoint\n"
    "                         resumes with any --ep, stage or ranks), --merge at ZeRO 0-2\n"
    "  --capacity-factor F    MoE: tokens an expert takes, x its fair share (memplan's flag;\n"
    "                         default: the plan's parallel.capacity_factor, else 0: dropless):\n"
    "                         each micro-batch and layer an expert keeps C = ceil(F N top_k /\n"
    "                         experts) of the rank's N tokens' pairs, every first choice\n"
    "                         before any second, tokens in order; the rest add nothing (with\n"
    "                         --ep each rank drops among its own tokens); the pairs dropped\n"
    "                         are printed per step and in --stats-json (docs/offload.md)\n"
    "  --comm-timeout S       a collective not done in S seconds ends every rank (default 300)\n"
    "  --reduce-dtype fp32|bf16|fp16  the gradients' reduction over the ranks and its buckets\n"
    "                         (memplan's flag; default: the plan's, else fp32): each rank's\n"
    "                         fp32 sum (ZeRO 2-3: each micro-batch's gradient) is rounded\n"
    "                         to it, every addition of the collective rounded to it, and\n"
    "                         the result added back into fp32 (docs/offload.md)\n"
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
    "                         verified first) at the step its data position is at: saved\n"
    "                         with any --micro-batch, --grad-accum and rank count whose\n"
    "                         product (the global batch, in sequences) and --seq are this\n"
    "                         run's; another --seq or global batch is refused\n"
    "  --stats-json FILE      peak bytes per tier (and the plan's prediction) and the time split\n"
    "                         (several ranks: rank r > 0 writes FILE.rank<r>); with --profile,\n"
    "                         its table under \"profile\"\n"
    "  --profile              time every device op, copy and memset of the steps after the\n"
    "                         first (the only one, with one step) between events on its stream,\n"
    "                         and the host's AdamW; at the end a table (lines \"# profile:\"):\n"
    "                         op, shape, stream, calls per step, ms per step, % of the step,\n"
    "                         TFLOP/s of GEMMs and attention, GB/s of copies\n"
    "                         (docs/performance.md, \"Where a step's time goes\")\n"
    "  --save DIR             the trained model as a Hugging Face folder (from_pretrained,\n"
    "                         generate --model DIR): config.json (the --model file's, its\n"
    "                         torch_dtype set; a preset's written), the weights in --dtype with\n"
    "                         Hugging Face names (model.safetensors, or shards and\n"
    "                         model.safetensors.index.json past --max-shard-size) and the\n"
    "                         --tokenizer's files; with LoRA, a PEFT adapter directory (Hugging\n"
    "                         Face PEFT loads it onto the base)\n"
    "  --merge DIR            with LoRA: also the adapters merged into the base (W + alpha/r B A,\n"
    "                         PEFT's merge_and_unload; QLoRA: into the NF4 base as it computes)\n"
    "                         as a Hugging Face folder, as --save writes a full fine-tune\n"
    "  --max-shard-size SIZE  shard --save's and --merge's weights above SIZE (default 5GB,\n"
    "                         save_pretrained's)\n"
    "  --log FILE             one JSON object per step: step, loss, lr, grad_norm, tokens_per_s,\n"
    "                         peak_bytes per tier, eval_loss and eval_ppl when evaluated\n"
    "                         (appended to with --resume)\n"
    "  --plot FILE            at the end, an SVG of loss, eval loss and lr against steps (the\n"
    "                         whole --log when given; plot LOG --out FILE draws one any time)\n"
    "  --version              the version\n"
    "  -h, --help             this text\n"
    "\n"
    "Prints one line per step: step K loss X lr Y norm G tok/s R mem M (loss: the mean over\n"
    "the global batch; tok/s: every rank's tokens), with a capacity factor also dropped D%\n"
    "(the pairs of token and expert every rank's micro-batches dropped), and eval step K\n"
    "loss X ppl P when evaluating (with a capacity factor also dropped D%: the evaluation\n"
    "routes with the factor, and every rank evaluates the same batches).\n"
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
    "a signal that stopped it ends it the same way.\n";

enum {
    OPT_MODEL = 256, OPT_CHECK_PLAN, OPT_WEIGHTS, OPT_DATA, OPT_U32, OPT_TEXT, OPT_STEPS, OPT_MB, OPT_SEQ,
    OPT_LR, OPT_B1, OPT_B2, OPT_EPS, OPT_WD, OPT_CLIP, OPT_DTYPE, OPT_SEED, OPT_DEVICE,
    OPT_DEVMEM, OPT_THREADS, OPT_SAVE, OPT_ACCUM, OPT_PLAN, OPT_PARAMS_ON, OPT_OPT_ON,
    OPT_CKPT_ON, OPT_RECOMPUTE, OPT_PREFETCH, OPT_SUBGROUP, OPT_NVME_DIR, OPT_CKPT, OPT_SAVE_EVERY,
    OPT_RESUME, OPT_STATS, OPT_TOKENIZER, OPT_EOT, OPT_PACKING, OPT_EVAL_DATA, OPT_EVAL_EVERY,
    OPT_EVAL_BATCHES, OPT_SCHEDULE, OPT_WARMUP, OPT_MIN_LR, OPT_SCHEDULE_STEPS, OPT_LOG, OPT_PLOT,
    OPT_LORA, OPT_LORA_TARGETS, OPT_LORA_ALPHA, OPT_QLORA, OPT_ADAPTER, OPT_ADAPTERS_ON,
    OPT_SCHED, OPT_CLIP_STALE, OPT_DPU_WARMUP, OPT_OPT_THREADS, OPT_KEEP_CKPT,
    OPT_MAX_SKIPPED, OPT_ZERO, OPT_COMM_TIMEOUT, OPT_RECOMPUTE_LAYERS, OPT_REDUCE_DTYPE, OPT_MERGE,
    OPT_MAX_SHARD, OPT_GRADS, OPT_VERSION, OPT_OPTIM, OPT_OPTIM_DTYPE, OPT_MASTER, OPT_LOSS_CHUNK, OPT_CAPACITY,
    OPT_TP, OPT_PP, OPT_EP, OPT_PROFILE,
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
    {"optim", required_argument, 0, OPT_OPTIM},
    {"optim-dtype", required_argument, 0, OPT_OPTIM_DTYPE},
    {"master", required_argument, 0, OPT_MASTER},
    {"loss-chunk", required_argument, 0, OPT_LOSS_CHUNK},
    {"capacity-factor", required_argument, 0, OPT_CAPACITY},
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
    {"merge", required_argument, 0, OPT_MERGE},
    {"max-shard-size", required_argument, 0, OPT_MAX_SHARD},
    {"grad-accum", required_argument, 0, OPT_ACCUM},
    {"plan", required_argument, 0, OPT_PLAN},
    {"check-plan", no_argument, 0, OPT_CHECK_PLAN},
    {"params", required_argument, 0, OPT_PARAMS_ON},
    {"grads", required_argument, 0, OPT_GRADS},
    {"optimizer", required_argument, 0, OPT_OPT_ON},
    {"checkpoints", required_argument, 0, OPT_CKPT_ON},
    /* deprecated spellings (before memplan's names were train's) */
    {"params-on", required_argument, 0, OPT_PARAMS_ON},
    {"optimizer-on", required_argument, 0, OPT_OPT_ON},
    {"checkpoints-on", required_argument, 0, OPT_CKPT_ON},
    {"recompute", required_argument, 0, OPT_RECOMPUTE},
    {"recompute-layers", required_argument, 0, OPT_RECOMPUTE_LAYERS},
    {"prefetch", required_argument, 0, OPT_PREFETCH},
    {"sub-group", required_argument, 0, OPT_SUBGROUP},
    {"nvme-dir", required_argument, 0, OPT_NVME_DIR},
    {"ckpt", required_argument, 0, OPT_CKPT},
    {"save-every", required_argument, 0, OPT_SAVE_EVERY},
    {"resume", required_argument, 0, OPT_RESUME},
    {"stats-json", required_argument, 0, OPT_STATS},
    {"profile", no_argument, 0, OPT_PROFILE},
    {"zero", required_argument, 0, OPT_ZERO},
    {"tp", required_argument, 0, OPT_TP},
    {"pp", required_argument, 0, OPT_PP},
    {"ep", required_argument, 0, OPT_EP},
    {"comm-timeout", required_argument, 0, OPT_COMM_TIMEOUT},
    {"reduce-dtype", required_argument, 0, OPT_REDUCE_DTYPE},
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
    {"version", no_argument, 0, OPT_VERSION},
    {0, 0, 0, 0},
};

/* ---- values --------------------------------------------------------------------- */

/* A number into a float, in [lo, hi]. */
static zo_status parse_float(const char *s, const char *flag, double lo, double hi, float *out)
{
    double v;
    zo_status st = zo_parse_double(s, flag, lo, hi, &v);
    if (st == ZO_OK) *out = (float)v;
    return st;
}

/* A plan field's value into an int, checked against the schema's table. */
static zo_status plan_int(const char *s, const char *flag, const char *field, int *out)
{
    long v = 0;
    zo_status st = zo_plan_flag_int(s, flag, field, &v);
    if (st == ZO_OK) *out = (int)v;
    return st;
}

/* A tier, in the plan's words (gpu, cpu, nvme; nvme only with allow_nvme). */
static zo_status plan_tier(const char *s, const char *flag, int allow_nvme, offload_tier *out)
{
    zo_plan_tier t = ZO_PLAN_GPU;
    zo_status st = zo_plan_tier_parse(s, flag, allow_nvme, &t);
    if (st == ZO_OK) *out = (offload_tier)t;
    return st;
}

/* ---- the flags, group by group: each handler returns 1 when `c` is its own ------- */

/* The model and the data. */
static int data_flag(int c, const char *arg, train_args *a, zo_status *st)
{
    switch (c) {
    case OPT_MODEL: a->model = arg; return 1;
    case OPT_WEIGHTS: a->weights = arg; return 1;
    case OPT_DATA: a->data = arg; return 1;
    case OPT_U32: a->width = MODEL_TOKENS_U32, a->set_width = 1; return 1;
    case OPT_TEXT: a->width = MODEL_TOKENS_BYTES, a->set_width = 1; return 1;
    case OPT_TOKENIZER: a->tokenizer = arg; return 1;
    case OPT_EOT: a->eot = arg; return 1;
    case OPT_PACKING:
        a->set_packing = 1;
        if (!strcmp(arg, "stream")) a->packing = MODEL_PACK_STREAM;
        else if (!strcmp(arg, "pad")) a->packing = MODEL_PACK_PAD;
        else *st = zo_error(ZO_ERR_INVALID, "--packing %s: stream or pad", arg);
        return 1;
    case OPT_EVAL_DATA: a->eval_data = arg; return 1;
    case OPT_EVAL_EVERY: *st = zo_parse_int(arg, "--eval-every", 1, 1L << 40, &a->eval_every); return 1;
    case OPT_EVAL_BATCHES:
        *st = zo_parse_int(arg, "--eval-batches", 1, 1L << 30, &a->eval_batches);
        a->set_eval_batches = 1;
        return 1;
    default: return 0;
    }
}

/* The steps, the batch, the dtype and the learning-rate schedule. */
static int training_flag(int c, const char *arg, train_args *a, zo_status *st)
{
    offload_config *oc = &a->p.cfg;
    long v = 0;
    switch (c) {
    case OPT_STEPS: *st = zo_parse_int(arg, "--steps", 1, 1L << 40, &a->steps); return 1;
    case OPT_MB: *st = zo_plan_flag_int(arg, "--micro-batch", "training.micro_batch", &a->micro_batch); return 1;
    case OPT_SEQ: *st = zo_plan_flag_int(arg, "--seq", "training.seq", &a->seq); return 1;
    case OPT_ACCUM: *st = plan_int(arg, "--grad-accum", "training.grad_accum", &oc->grad_accum); return 1;
    case OPT_DTYPE:
        if ((*st = zo_dtype_parse(arg, &a->dtype)) != ZO_OK) *st = zo_error_wrap(*st, "--dtype");
        a->dtype_from = "--dtype";
        return 1;
    case OPT_SEED: *st = zo_parse_int(arg, "--seed", 0, 0x7fffffffL, &a->seed); return 1;
    case OPT_MAX_SKIPPED:
        *st = zo_parse_int(arg, "--max-skipped-steps", 1, 1 << 20, &v);
        oc->max_skipped_steps = (int)v;
        return 1;
    case OPT_SCHEDULE: *st = ft_schedule_parse(arg, "--lr-schedule", &a->sched.kind); return 1;
    case OPT_WARMUP: *st = zo_parse_int(arg, "--warmup", 0, 1L << 40, &a->sched.warmup); return 1;
    case OPT_MIN_LR: *st = zo_parse_double(arg, "--min-lr", 0.0, 10.0, &a->sched.min_lr); return 1;
    case OPT_SCHEDULE_STEPS:
        *st = zo_parse_int(arg, "--schedule-steps", 1, 1L << 40, &a->schedule_steps);
        return 1;
    default: return 0;
    }
}

/* AdamW's settings. */
static int adamw_flag(int c, const char *arg, train_args *a, zo_status *st)
{
    offload_adamw *ad = &a->p.cfg.adam;
    switch (c) {
    case OPT_LR: /* the schedule's peak (double: the closed form); the runtime's (float) */
        *st = zo_parse_double(arg, "--lr", 0.0, 10.0, &a->sched.lr);
        ad->lr = (float)a->sched.lr;
        return 1;
    case OPT_B1: *st = parse_float(arg, "--beta1", 0.0, 0.999999, &ad->beta1); return 1;
    case OPT_B2: *st = parse_float(arg, "--beta2", 0.0, 0.999999, &ad->beta2); return 1;
    case OPT_EPS: /* 0 divides by sqrt(v) = 0 where a weight has had no gradient yet */
        *st = parse_float(arg, "--eps", 0.0, 1.0, &ad->eps);
        if (*st == ZO_OK && !(ad->eps > 0.0f))
            *st = zo_error(ZO_ERR_INVALID, "--eps: %s must be > 0 (AdamW divides by sqrt(v) + eps)", arg);
        return 1;
    case OPT_WD: *st = parse_float(arg, "--weight-decay", 0.0, 10.0, &ad->weight_decay); return 1;
    case OPT_CLIP: *st = parse_float(arg, "--clip", 0.0, 1e9, &ad->clip); return 1;
    /* the optimizer's state, with memplan's flags and words */
    case OPT_OPTIM: {
        zo_plan_optimizer o = ZO_PLAN_ADAMW;
        int q8 = 0;
        if ((*st = zo_plan_optim_parse(arg, "--optim", &o, &q8)) != ZO_OK) return 1;
        if (o != ZO_PLAN_ADAMW) {
            *st = zo_error(ZO_ERR_INVALID, "--optim %s: the runtime runs adamw and adamw8bit", arg);
            return 1;
        }
        if (q8 && a->optim_dtype_set && a->p.cfg.opt_state != ZO_PLAN_STATE_8BIT) {
            *st = zo_error(ZO_ERR_INVALID, "--optim adamw8bit keeps m and v in 8 bits: drop --optim-dtype %s",
                           zo_plan_opt_state_name(a->p.cfg.opt_state));
            return 1;
        }
        if (q8) a->p.cfg.opt_state = ZO_PLAN_STATE_8BIT;
        a->optim_8bit = q8;
        return 1;
    }
    case OPT_OPTIM_DTYPE: {
        zo_plan_opt_state os = ZO_PLAN_STATE_FP32;
        if ((*st = zo_plan_opt_state_parse(arg, "--optim-dtype", &os)) != ZO_OK) return 1;
        if (a->optim_8bit && os != ZO_PLAN_STATE_8BIT) {
            *st = zo_error(ZO_ERR_INVALID, "--optim-dtype %s: --optim adamw8bit keeps m and v in 8 bits", arg);
            return 1;
        }
        a->p.cfg.opt_state = os;
        a->optim_dtype_set = 1;
        return 1;
    }
    case OPT_MASTER: *st = zo_plan_master_parse(arg, "--master", &a->p.file.training.master); return 1;
    case OPT_LOSS_CHUNK: *st = plan_int(arg, "--loss-chunk", "training.loss_chunk", &a->p.file.training.loss_chunk); return 1;
    default: return 0;
    }
}

/* What is trained (LoRA, QLoRA) and when the optimizer runs. */
static int method_flag(int c, const char *arg, train_args *a, zo_status *st)
{
    offload_config *oc = &a->p.cfg;
    double alpha = 0;
    zo_plan_schedule sched = ZO_PLAN_SCHED_SERIAL;
    switch (c) {
    case OPT_LORA: *st = plan_int(arg, "--lora", "training.lora.r", &a->lora.r); return 1;
    case OPT_LORA_TARGETS:
        if ((*st = zo_lora_targets_parse(arg, &a->lora.targets)) != ZO_OK) *st = zo_error_wrap(*st, "--lora-targets");
        return 1;
    case OPT_LORA_ALPHA:
        if ((*st = zo_plan_flag_double(arg, "--lora-alpha", "training.lora.alpha", &alpha)) == ZO_OK)
            a->lora.alpha = (float)alpha;
        return 1;
    case OPT_QLORA: a->qlora = 1; return 1;
    case OPT_ADAPTER: a->adapter = arg; return 1;
    case OPT_ADAPTERS_ON: *st = plan_tier(arg, "--adapters-on", 1, &oc->trainable_on); return 1;
    case OPT_SCHED:
        if ((*st = zo_plan_schedule_parse(arg, "--schedule", &sched)) == ZO_OK) oc->schedule = (offload_schedule)sched;
        return 1;
    case OPT_CLIP_STALE: oc->clip_stale = 1; return 1;
    case OPT_DPU_WARMUP: *st = plan_int(arg, "--dpu-warmup", "training.dpu_warmup", &oc->dpu_warmup); return 1;
    case OPT_OPT_THREADS: *st = plan_int(arg, "--opt-threads", "training.opt_threads", &oc->opt_threads); return 1;
    default: return 0;
    }
}

/* Where each kind of state lives, and the buffers; `flag` as given. */
static int placement_flag(int c, const char *arg, const char *flag, train_args *a, zo_status *st)
{
    offload_config *oc = &a->p.cfg;
    zo_plan_recompute r = ZO_PLAN_RECOMPUTE_NONE;
    zo_plan_tier g = ZO_PLAN_GPU;
    uint64_t n = 0;
    switch (c) {
    case OPT_PLAN: return 1; /* read first, by read_plan */
    case OPT_CHECK_PLAN: a->check_plan = 1; return 1;
    /* (the flag as given: --params or its deprecated --params-on) */
    case OPT_PARAMS_ON: *st = plan_tier(arg, flag, 1, &oc->params_on); return 1;
    case OPT_GRADS:
        if ((*st = zo_plan_tier_parse(arg, flag, 0, &g)) == ZO_OK) a->grads = (int)g;
        return 1;
    case OPT_OPT_ON: *st = zo_plan_fractions_parse(arg, flag, 1, oc->opt_frac); return 1;
    case OPT_CKPT_ON: *st = plan_tier(arg, flag, 0, &oc->checkpoints_on); return 1;
    case OPT_RECOMPUTE:
        if ((*st = zo_plan_recompute_parse(arg, "--recompute", &r)) != ZO_OK) return 1;
        /* selective runs as none: the attention keeps no s x s scores to recompute */
        oc->recompute = r == ZO_PLAN_RECOMPUTE_FULL  ? OFFLOAD_RECOMPUTE_FULL
                        : r == ZO_PLAN_RECOMPUTE_OPS ? OFFLOAD_RECOMPUTE_OPS
                                                     : OFFLOAD_RECOMPUTE_NONE;
        if (r == ZO_PLAN_RECOMPUTE_SELECTIVE) a->p.selective_as_none = 1;
        return 1;
    case OPT_RECOMPUTE_LAYERS:
        *st = plan_int(arg, "--recompute-layers", "training.recompute_layers", &oc->recompute_layers);
        a->set_recompute_layers = 1;
        return 1;
    case OPT_PREFETCH:
        *st = plan_int(arg, "--prefetch", "buffers.prefetch_depth", &oc->prefetch_depth);
        return 1;
    case OPT_SUBGROUP:
        if ((*st = zo_plan_flag_u64(arg, "--sub-group", "nvme.sub_group", 1, &n)) == ZO_OK) oc->sub_group = (size_t)n;
        return 1;
    case OPT_NVME_DIR: oc->nvme_dir = arg; return 1;
    default: return 0;
    }
}

/* The device and the ranks. */
static int device_flag(int c, const char *arg, train_args *a, zo_status *st)
{
    switch (c) {
    case OPT_DEVICE: /* the name here; whether it exists when it is opened */
        a->device = arg;
        if (strcmp(arg, "cpu") && strcmp(arg, "cuda") && strncmp(arg, "cuda:", 5))
            *st = zo_error(ZO_ERR_INVALID, "--device %s: expected cpu, cuda or cuda:N", arg);
        return 1;
    case OPT_DEVMEM: *st = zo_parse_size(arg, "--device-mem", 0, &a->device_mem); return 1;
    case OPT_THREADS: *st = zo_parse_int(arg, "--threads", 1, 1024, &a->threads); return 1;
    case OPT_ZERO: *st = plan_int(arg, "--zero", "parallel.zero", &a->p.cfg.zero_stage); return 1;
    case OPT_TP: *st = plan_int(arg, "--tp", "parallel.tp", &a->tp); return 1;
    case OPT_PP: *st = plan_int(arg, "--pp", "parallel.pp", &a->pp); return 1;
    case OPT_EP: *st = plan_int(arg, "--ep", "parallel.ep", &a->ep); return 1;
    case OPT_CAPACITY:
        *st = zo_plan_flag_double(arg, "--capacity-factor", "parallel.capacity_factor",
                                  &a->p.file.parallel.capacity_factor);
        return 1;
    case OPT_COMM_TIMEOUT: *st = zo_parse_double(arg, "--comm-timeout", 0.001, 1e7, &a->comm_timeout); return 1;
    case OPT_REDUCE_DTYPE:
        if ((*st = zo_dtype_parse(arg, &a->p.cfg.reduce_dtype)) != ZO_OK) *st = zo_error_wrap(*st, "--reduce-dtype");
        return 1;
    default: return 0;
    }
}

/* Checkpoints and what the run writes. */
static int output_flag(int c, const char *arg, train_args *a, zo_status *st)
{
    long v = 0;
    switch (c) {
    case OPT_CKPT: a->ckpt = arg; return 1;
    case OPT_SAVE_EVERY: *st = zo_parse_int(arg, "--save-every", 1, 1L << 40, &a->save_every); return 1;
    case OPT_KEEP_CKPT:
        *st = zo_parse_int(arg, "--keep-checkpoints", 1, 1 << 20, &v);
        a->p.cfg.keep_checkpoints = (int)v;
        return 1;
    case OPT_RESUME: a->resume = arg; return 1;
    case OPT_STATS: a->stats_json = arg; return 1;
    case OPT_PROFILE: a->profile = 1; return 1;
    case OPT_SAVE: a->save = arg; return 1;
    case OPT_MERGE: a->merge = arg; return 1;
    case OPT_MAX_SHARD: *st = zo_parse_size(arg, "--max-shard-size", 0, &a->max_shard); return 1;
    case OPT_LOG: a->log = arg; return 1;
    case OPT_PLOT: a->plot = arg; return 1;
    default: return 0;
    }
}

/* ---- the parser ---------------------------------------------------------------------- */

static void args_defaults(train_args *a)
{
    *a = (train_args){.width = MODEL_TOKENS_U16, .steps = 100, .micro_batch = 4, .seq = 64,
                      .seed = 1337, .dtype = ZO_DTYPE_BF16, .dtype_from = "the default, memplan's",
                      .device = "cpu", .eval_batches = 10,
                      .sched = {.lr = 3e-4}, .lora = {.alpha = 8.0f}, .grads = -1};
    offload_plan_defaults(&a->p);
    /* AdamW as the Hugging Face Trainer's defaults for fine-tuning
     * (adam_beta1/2, adam_epsilon, weight_decay 0: no decay on LoRA adapters,
     * max_grad_norm 1) */
    a->p.cfg.adam = (offload_adamw){.lr = (float)a->sched.lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                    .weight_decay = 0.0f, .clip = 1.0f};
}

/* The plan first, so that every flag overrides it: a first pass of
 * getopt_long finds it in every spelling (--plan F, --plan=F, --pla F).
 * -1, or 2 when it cannot be read. */
static int read_plan(int argc, char **argv, train_args *a)
{
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
        if (a->p.dtype >= 0) a->dtype = (zo_dtype)a->p.dtype, a->dtype_from = "the plan";
        if (a->p.gpu_mem) a->device_mem = a->p.gpu_mem;
    }
    return -1;
}

/* An option getopt_long refused: 2. */
static int bad_option(char **argv)
{
    if (optopt && optopt < 256)
        fprintf(stderr, "train: unknown option -%c\n", optopt);
    else if (optopt)
        fprintf(stderr, "train: option %s needs a value\n", argv[optind - 1]);
    else
        fprintf(stderr, "train: unknown option %s\n", argv[optind - 1]);
    fprintf(stderr, "run 'train --help' for the options\n");
    return 2;
}

/* What one flag needs of another, or cannot go with: NULL when all is well. */
static const char *flags_conflict(const train_args *a)
{
    if (a->tokenizer && a->width == MODEL_TOKENS_BYTES)
        return "--text reads bytes as tokens: leave it out with --tokenizer";
    if ((a->eval_every || a->set_eval_batches) && !a->eval_data)
        return "--eval-every and --eval-batches need --eval-data FILE";
    if ((a->eot || a->set_packing) && !a->tokenizer)
        return "--eot and --packing need --tokenizer (they shape text as it is tokenized)";
    if (a->sched.min_lr > a->sched.lr) return "--min-lr is above --lr";
    if (!a->lora.r && !a->adapter && (a->qlora || a->lora.targets))
        return "--qlora and --lora-targets need --lora R (or --adapter DIR)";
    if (a->set_recompute_layers && a->p.cfg.recompute_layers && a->p.cfg.recompute != OFFLOAD_RECOMPUTE_FULL)
        return "--recompute-layers K needs --recompute full (the first K layers recomputed whole)";
    if (a->p.cfg.recompute == OFFLOAD_RECOMPUTE_OPS && a->p.cfg.checkpoints_on == OFFLOAD_CPU)
        return "--checkpoints cpu needs --recompute full (--recompute ops keeps each layer's kept outputs "
               "on the GPU)";
    if (a->merge && !a->lora.r && !a->adapter && !(a->plan && a->p.file.training.method != ZO_PLAN_FULL))
        return "--merge DIR merges LoRA adapters into their base: it needs --lora R (or --adapter DIR); "
               "--save DIR writes a full fine-tune";
    if (a->merge && !a->save) return "--merge DIR goes with --save DIR (the adapters; the merged model beside them)";
    return NULL;
}

/* --grads against the optimizer's split (the plan's, then --optimizer): the
 * runtime keeps on the device the gradients of the optimizer's GPU share,
 * and sends the rest to pinned host memory, so gpu is the optimizer wholly
 * on the GPU and cpu any split with a host share (memplan plans them so).
 * 1 after a message. */
static int grads_conflict(const train_args *a)
{
    const double *f = a->p.cfg.opt_frac;
    int all_gpu = f[ZO_PLAN_GPU] >= 1;
    if (a->grads < 0 || (a->grads == ZO_PLAN_GPU) == all_gpu) return 0;
    char fr[96] = "";
    for (int t = 0, n = 0; t < ZO_PLAN_TIERS; t++)
        if (f[t] > 0)
            n += snprintf(fr + n, sizeof fr - (size_t)n, "%s%s=%g", n ? "," : "", zo_plan_tier_name((zo_plan_tier)t),
                          f[t]);
    if (a->grads == ZO_PLAN_GPU)
        fprintf(stderr, "train: --grads gpu with the optimizer on %s (--optimizer): the runtime keeps on the GPU "
                        "only the gradients the GPU's optimizer share updates; the cpu and nvme shares' go to host "
                        "memory (--grads cpu), or put the optimizer on the GPU (--optimizer gpu)\n", fr);
    else
        fprintf(stderr, "train: --grads cpu with the optimizer on gpu (--optimizer gpu): the GPU's optimizer "
                        "updates its gradients where backward sums them, on the GPU (--grads gpu)\n");
    return 1;
}

/* --model DIR (a Hugging Face model folder): its safetensors (a sharded
 * index, model.safetensors, or any *.safetensors: --weights reads the
 * folder) unless --weights is given, and its tokenizer.json for text data
 * (--data FILE ending in .txt, .json or .jsonl, neither --text nor
 * --tokens-u32) unless --tokenizer is given. */
static void model_dir_files(train_args *a)
{
    struct stat sb;
    if (!a->model || stat(a->model, &sb) != 0 || !S_ISDIR(sb.st_mode)) return;
    if (!a->weights) {
        DIR *d = opendir(a->model);
        int found = 0;
        for (struct dirent *e; d && !found && (e = readdir(d));) {
            size_t n = strlen(e->d_name);
            found = (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors")) ||
                    (n > 23 && !strcmp(e->d_name + n - 23, ".safetensors.index.json"));
        }
        if (d) closedir(d);
        if (found) {
            snprintf(a->dir_weights, sizeof a->dir_weights, "%s", a->model);
            a->weights = a->dir_weights;
        }
    }
    const char *ext = a->data ? strrchr(a->data, '.') : NULL;
    int text = ext && (!strcmp(ext, ".txt") || !strcmp(ext, ".json") || !strcmp(ext, ".jsonl"));
    if (!a->tokenizer && !a->set_width && text) {
        snprintf(a->dir_tokenizer, sizeof a->dir_tokenizer, "%s/tokenizer.json", a->model);
        if (stat(a->dir_tokenizer, &sb) == 0) a->tokenizer = a->dir_tokenizer;
    }
}

/* The checks across flags and what follows from them: -1, or 2. */
static int args_finish(int argc, char **argv, train_args *a)
{
    offload_config *oc = &a->p.cfg;
    if ((a->save_every || oc->keep_checkpoints) && !a->ckpt) {
        fprintf(stderr, "train: %s needs --ckpt DIR (where the checkpoints go)\n",
                a->save_every ? "--save-every" : "--keep-checkpoints");
        return 2;
    }
    oc->ckpt_dir = a->ckpt; /* locked from the start of the run */
    const char *bad = flags_conflict(a);
    if (bad) {
        fprintf(stderr, "train: %s\n", bad);
        return 2;
    }
    if (grads_conflict(a)) return 2;
    if (oc->recompute != OFFLOAD_RECOMPUTE_FULL) oc->recompute_layers = 0; /* a plan's K goes with full */
    a->sched.steps = a->schedule_steps ? a->schedule_steps : a->steps;
    oc->n_threads = (int)a->threads;
    if (!a->model && a->plan && a->p.model_name[0]) a->model = a->p.model_name;
    model_dir_files(a);
    if (optind < argc) {
        fprintf(stderr, "train: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!a->check_plan && (!a->model || !a->data)) {
        fprintf(stderr, "train: %s is required (see --help)\n", !a->model ? "--model" : "--data");
        return 2;
    }
    return -1;
}

int args_parse(int argc, char **argv, train_args *a)
{
    args_defaults(a);
    int rc = read_plan(argc, argv, a), c;
    if (rc >= 0) return rc;
    opterr = 0;
    optind = 0;
    int at;
    while ((c = getopt_long(argc, argv, "h", long_opts, &at)) != -1) {
        if (c == 'h') {
            fputs(HELP, stdout);
            return 0;
        }
        if (c == OPT_VERSION) {
            zo_version_print(stdout, "train");
            return 0;
        }
        char flag[40] = "";
        if (c >= 256) snprintf(flag, sizeof flag, "--%s", long_opts[at].name);
        zo_status st = ZO_OK;
        if (!data_flag(c, optarg, a, &st) && !training_flag(c, optarg, a, &st) &&
            !adamw_flag(c, optarg, a, &st) && !method_flag(c, optarg, a, &st) &&
            !placement_flag(c, optarg, flag, a, &st) && !device_flag(c, optarg, a, &st) &&
            !output_flag(c, optarg, a, &st))
            return bad_option(argv);
        if (st != ZO_OK) {
            fprintf(stderr, "train: %s\n", zo_last_error());
            return 2;
        }
    }
    return args_finish(argc, argv, a);
}
