#include "memory.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/nf4.h" /* defines: zo_nf4_bytes */

const char *plan_kind_name(plan_kind k)
{
    static const char *n[] = {"params", "grads", "optimizer", "activations", "buffers"};
    return k < PLAN_KINDS ? n[k] : "?";
}

int plan_default_seq(const zo_model_config *m)
{
    /* not the positions a model was trained to reach: 131072 for Llama-3.1
     * would plan 62.6 GiB of logits for one sequence */
    return m->max_seq > 0 && m->max_seq < PLAN_DEFAULT_SEQ ? m->max_seq : PLAN_DEFAULT_SEQ;
}

/* GPT-2, GPT-3, Megatron and OPT train with dropout; GPT-NeoX, Falcon, BLOOM
 * and the LLaMA families set it to 0. */
static int default_dropout(const zo_model_config *m)
{
    return m->arch == ZO_ARCH_GPT && (m->pos == ZO_POS_ARCH || m->pos == ZO_POS_LEARNED);
}

void plan_train_defaults(plan_train *t, const zo_model_config *m)
{
    memset(t, 0, sizeof *t);
    t->seq = plan_default_seq(m);
    t->micro_batch = 1;
    t->grad_accum = 1;
    t->dtype = ZO_DTYPE_BF16;
    t->grad_dtype = ZO_DTYPE_BF16;
    t->optimizer = ZO_PLAN_ADAMW;
    t->dp = t->tp = t->pp = t->vpp = t->ep = 1;
    t->dp_overlap = 1;
    t->recompute = ZO_PLAN_RECOMPUTE_NONE;
    t->reduce_dtype = ZO_DTYPE_F32; /* the runtime's */
    t->runtime = PLAN_RUNTIME_ZOFFLOAD;
    t->flash_attn = 1;
    t->dropout = default_dropout(m);
    t->method = ZO_PLAN_FULL;
    t->adapters_on = ZO_PLAN_GPU;
    t->schedule = ZO_PLAN_SCHED_SERIAL;
    t->dpu_warmup = 10;
    t->params_on = t->grads_on = t->checkpoints_on = ZO_PLAN_GPU;
    t->opt_frac[ZO_PLAN_GPU] = 1.0;
    t->buf.cuda_context = 512ull << 20;
    t->buf.cublas_workspace = 32ull << 20;
    t->buf.comm_bucket = 25000000;
    t->buf.comm_buckets = 2;
    t->buf.prefetch_depth = 2;
    t->buf.pinned_staging = 0;
    t->buf.fragmentation = 0.05;
    t->buf.sub_group = 100000000;
    t->buf.swap_buffers = 3;
}

/* ---- activations ---------------------------------------------------------- */

static const plan_act_entry act_table[] = {
    /* attention */
    {"norm_1", "input", PLAN_W_H, 0, 0},
    {"attn.qkv", "input (norm_1 output)", PLAN_W_H, 0, PLAN_ACT_PRE_NORM},
    {"attn.q_a_norm", "input, output (q_a output)", PLAN_W_QLORA, 0, PLAN_ACT_MLA},
    {"attn.q_a_norm", "output (q_b input)", PLAN_W_QLORA, 0, PLAN_ACT_MLA},
    {"attn.kv_a_norm", "input (kv_a output)", PLAN_W_KVLORA, 0, PLAN_ACT_MLA},
    {"attn.kv_a_norm", "output (kv_b input)", PLAN_W_KVLORA, 0, PLAN_ACT_MLA},
    {"attn.q_norm", "input", PLAN_W_Q, 0, PLAN_ACT_TP | PLAN_ACT_QKNORM},
    {"attn.k_norm", "input", PLAN_W_KV, 0, PLAN_ACT_TP | PLAN_ACT_QKNORM},
    {"attn.qk_norm", "1/rms of each q and k head (fp32)", PLAN_W_QK_HEADS, 4, PLAN_ACT_TP | PLAN_ACT_QKNORM},
    {"attn.scores", "Q", PLAN_W_Q, 0, PLAN_ACT_TP},
    {"attn.scores", "K", PLAN_W_KV, 0, PLAN_ACT_TP},
    {"attn.softmax", "output", PLAN_W_SCORES, 0, PLAN_ACT_TP | PLAN_ACT_S2},
    {"attn.dropout", "mask", PLAN_W_SCORES, 1, PLAN_ACT_TP | PLAN_ACT_S2 | PLAN_ACT_DROPOUT},
    {"attn.context", "dropout output", PLAN_W_SCORES, 0, PLAN_ACT_TP | PLAN_ACT_S2 | PLAN_ACT_DROPOUT},
    {"attn.context", "V", PLAN_W_V, 0, PLAN_ACT_TP},
    {"attn.flash", "logsumexp (fp32)", PLAN_W_HEADS, 4, PLAN_ACT_TP | PLAN_ACT_FLASH},
    {"attn.out", "input", PLAN_W_O, 0, PLAN_ACT_TP},
    {"attn.resid_dropout", "mask", PLAN_W_H, 1, PLAN_ACT_DROPOUT},
    /* Gemma-2, OLMo-2: norms after attention and after the MLP (OLMo-2's alone:
     * the attention and the MLP read the layer's input and the residual between) */
    {"norm.post", "inputs", PLAN_W_NORMS, 0, 0},
    /* MLP (a parallel block's MLP reads the attention's input: no norm_2
     * input; with one norm for both, no MLP input either) */
    {"norm_2", "input", PLAN_W_H, 0, PLAN_ACT_SEQ},
    {"mlp.in", "input (norm_2 output)", PLAN_W_H, 0, PLAN_ACT_TWO_NORMS | PLAN_ACT_PRE_NORM},
    {"mlp.gelu", "input", PLAN_W_FFN, 0, PLAN_ACT_TP | PLAN_ACT_GPT | PLAN_ACT_DENSE},
    {"mlp.fc_out", "input (gelu output)", PLAN_W_FFN, 0, PLAN_ACT_TP | PLAN_ACT_GPT | PLAN_ACT_DENSE},
    {"mlp.swiglu", "gate output", PLAN_W_FFN, 0, PLAN_ACT_TP | PLAN_ACT_LLAMA | PLAN_ACT_DENSE},
    {"mlp.swiglu", "up output", PLAN_W_FFN, 0, PLAN_ACT_TP | PLAN_ACT_LLAMA | PLAN_ACT_DENSE},
    {"mlp.down", "input (swiglu output)", PLAN_W_FFN, 0, PLAN_ACT_TP | PLAN_ACT_LLAMA | PLAN_ACT_DENSE},
    /* MoE as the runtime keeps it (transformer.c): the router's logits and
     * probabilities, the (token, expert) pairs' token indices and weights
     * (int32, fp32), the experts' gated MLPs over the pairs' rows, the shared
     * expert over every token; the pairs' inputs and outputs are gathered
     * and scattered through buffers the layers share (moe_buffers) */
    {"moe.router", "logits (fp32)", PLAN_W_ROUTER, 4, PLAN_ACT_MOE},
    {"moe.router", "probabilities (fp32)", PLAN_W_ROUTER, 4, PLAN_ACT_MOE},
    {"moe.dispatch", "pairs' tokens and weights", PLAN_W_ROUTED, 8, PLAN_ACT_MOE},
    {"moe.expert", "gate output", PLAN_W_ROUTED_FFN, 0, PLAN_ACT_TP | PLAN_ACT_MOE},
    {"moe.expert", "up output", PLAN_W_ROUTED_FFN, 0, PLAN_ACT_TP | PLAN_ACT_MOE},
    {"moe.expert.down", "input (swiglu output)", PLAN_W_ROUTED_FFN, 0, PLAN_ACT_TP | PLAN_ACT_MOE},
    /* expert parallelism: the owner keeps the rows every rank of its group
     * sent its experts (the gate, up and activation above are over them),
     * their weights and their order (arrival to grouped and back) */
    {"moe.ep", "rows received (expert parallelism)", PLAN_W_EP_H, 0, PLAN_ACT_MOE},
    {"moe.ep", "their weights and order (fp32, int32)", PLAN_W_EP, 12, PLAN_ACT_MOE},
    {"moe.shared", "gate output", PLAN_W_SHARED_FFN, 0, PLAN_ACT_TP | PLAN_ACT_MOE},
    {"moe.shared", "up output", PLAN_W_SHARED_FFN, 0, PLAN_ACT_TP | PLAN_ACT_MOE},
    {"moe.shared.down", "input (swiglu output)", PLAN_W_SHARED_FFN, 0, PLAN_ACT_TP | PLAN_ACT_MOE},
    {"mlp.dropout", "mask", PLAN_W_H, 1, PLAN_ACT_DROPOUT},
};

const plan_act_entry *plan_act_table(size_t *count)
{
    *count = sizeof act_table / sizeof act_table[0];
    return act_table;
}

static uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* The nearest integer to x >= 0 (llround's, exact below 2^52, without the
 * library call the search would pay for every estimate). */
static uint64_t round_u64(double x) { return (uint64_t)(x + 0.5); }

/* With a capacity factor each rank drops among its own tokens before the
 * exchange (DeepSpeed's convention), so an owner receives at most C rows
 * of each of its experts from each rank (zo_moe_rank_rows). */
uint64_t plan_ep_rows(const zo_model_config *m, const plan_train *t)
{
    if (t->ep <= 1 || !m->moe.experts || t->runtime != PLAN_RUNTIME_ZOFFLOAD) return 0;
    uint64_t n = (uint64_t)t->seq * (uint64_t)t->micro_batch;
    return zo_moe_rank_rows(m, t->capacity_factor, n, (uint64_t)t->ep);
}

/* The zoffload runtime holds the pairs its experts can take,
 * min(n top_k, experts C) (zo_moe_rank_rows of one rank); DeepSpeed's pads
 * every expert to its capacity, top_k F a token. */
double plan_routed_rows(const zo_model_config *m, const plan_train *t)
{
    if (t->capacity_factor <= 0) return m->moe.top_k;
    if (t->runtime != PLAN_RUNTIME_ZOFFLOAD) return m->moe.top_k * t->capacity_factor;
    uint64_t n = (uint64_t)t->seq * (uint64_t)t->micro_batch;
    return (double)zo_moe_rank_rows(m, t->capacity_factor, n, 1) / (double)n;
}

uint64_t plan_layer_act_bytes_of(const zo_model_config *m, const plan_train *t, int keep_s2,
                                 int moe)
{
    uint64_t s = (uint64_t)t->seq, b = (uint64_t)t->micro_batch, sb = s * b;
    uint64_t a = (uint64_t)m->n_heads;
    uint64_t act = zo_dtype_size(t->dtype);
    uint64_t tp = (uint64_t)t->tp;
    uint64_t q, k, v, o;
    zo_model_attn_widths(m, &q, &k, &v, &o);
    /* latent attention as this runtime keeps it (transformer.c): v padded to
     * the q/k heads in its fused q|k|v, the attention's output at that width
     * and narrowed to v for o_proj, and of kv_a's output only c_kv (its
     * rotary key is in k) */
    const int mla_here = m->mla.kv_rank && t->runtime == PLAN_RUNTIME_ZOFFLOAD;
    if (mla_here) {
        v = q;
        o = q + o;
    }
    uint64_t routed = moe ? round_u64((double)sb * plan_routed_rows(m, t)) : 0;
    uint64_t ep_rows = moe ? plan_ep_rows(m, t) : 0; /* the owner's rows (expert parallelism) */
    int norms = m->layer_norms ? m->layer_norms : 2;
    /* the rows this layer does not have, as one mask of flags */
    unsigned skip = (m->arch != ZO_ARCH_GPT ? PLAN_ACT_GPT : 0) |
                    (m->arch != ZO_ARCH_LLAMA ? PLAN_ACT_LLAMA : 0) |
                    (!t->dropout ? PLAN_ACT_DROPOUT : 0) |
                    (t->flash_attn || !keep_s2 ? PLAN_ACT_S2 : 0) |
                    (!t->flash_attn ? PLAN_ACT_FLASH : 0) | (moe ? PLAN_ACT_DENSE : PLAN_ACT_MOE) |
                    (m->parallel_block ? PLAN_ACT_SEQ : 0) | (norms == 1 ? PLAN_ACT_TWO_NORMS : 0) |
                    (!m->mla.kv_rank ? PLAN_ACT_MLA : 0) | (!m->qk_norm ? PLAN_ACT_QKNORM : 0) |
                    (!zo_model_pre_norms(m) ? PLAN_ACT_PRE_NORM : 0);
    uint64_t total = 0;
    for (size_t i = 0; i < sizeof act_table / sizeof act_table[0]; i++) {
        const plan_act_entry *e = &act_table[i];
        unsigned fl = e->flags;
        if (fl & skip) continue;
        uint64_t n;
        switch (e->width) {
        case PLAN_W_H: n = sb * (uint64_t)m->hidden; break;
        case PLAN_W_Q: n = sb * q; break;
        case PLAN_W_KV: n = sb * k; break;
        case PLAN_W_V: n = sb * v; break;
        case PLAN_W_O: n = sb * o; break;
        case PLAN_W_FFN: n = sb * (uint64_t)m->ffn; break;
        case PLAN_W_SCORES: n = a * s * s * b; break;
        case PLAN_W_HEADS: n = a * sb; break;
        case PLAN_W_QLORA: n = sb * (uint64_t)m->mla.q_rank; break;
        case PLAN_W_KVLORA: n = sb * (uint64_t)(m->mla.kv_rank + (mla_here ? 0 : m->mla.qk_rope)); break;
        case PLAN_W_NORMS: n = zo_model_post_norms(m) ? sb * (uint64_t)m->hidden * 2 : 0; break;
        case PLAN_W_ROUTER: n = sb * (uint64_t)m->moe.experts; break;
        case PLAN_W_ROUTED: n = routed; break;
        case PLAN_W_ROUTED_FFN: n = (ep_rows ? ep_rows : routed) * (uint64_t)m->moe.expert_ffn; break;
        case PLAN_W_EP: n = ep_rows; break;
        case PLAN_W_EP_H: n = ep_rows * (uint64_t)m->hidden; break;
        case PLAN_W_SHARED_FFN: n = sb * (uint64_t)m->moe.shared_ffn; break;
        case PLAN_W_QK_HEADS: n = sb * (uint64_t)zo_model_qk_norm_rows(m); break;
        default: n = 0; break;
        }
        n *= e->bytes ? (uint64_t)e->bytes : act;
        uint64_t div = (fl & PLAN_ACT_TP) || t->sp ? tp : 1;
        total += div == 1 ? n : ceil_div(n, div);
    }
    return total;
}

uint64_t plan_layer_act_bytes(const zo_model_config *m, const plan_train *t, int keep_s2)
{
    return plan_layer_act_bytes_of(m, t, keep_s2, 0);
}

uint64_t plan_layer_ops_bytes(const zo_model_config *m, const plan_train *t)
{
    uint64_t sb = (uint64_t)t->seq * (uint64_t)t->micro_batch, act = zo_dtype_size(t->dtype);
    uint64_t tp = (uint64_t)t->tp, sp = t->sp ? tp : 1, h = (uint64_t)m->hidden;
    uint64_t q, k, v, o;
    zo_model_attn_widths(m, &q, &k, &v, &o);
    /* the matmuls in the order the runtime's layer runs them, q, k and v as one GEMM; the
     * odd ones (1st, 3rd, ...) kept: qkv | o | fc1 or gate | fc2 or up | down -> qkv (after
     * RoPE), fc1 or gate, and down, whose output no backward reads but a post norm's (below;
     * the runtime keeps none otherwise;
     * torchtitan's policy over separate q, k, v would keep q, v, gate and down's output:
     * the same bytes where k is as wide as the hidden size, more with grouped queries) */
    uint64_t kept_tp = q + k + v + (uint64_t)m->ffn;
    /* Qwen3: the q/k norms' inputs, which the qkv GEMM's output feeds, and their 1/rms per head */
    if (m->qk_norm) kept_tp += q + k;
    /* the layer's input, the attention's output and its log-sum-exp (fp32, per head) */
    uint64_t bytes = ceil_div(sb * h * act, sp) + ceil_div(sb * (kept_tp + o) * act, tp) +
                     ceil_div(sb * (uint64_t)m->n_heads * 4, tp) +
                     ceil_div(sb * (uint64_t)zo_model_qk_norm_rows(m) * 4, tp);
    /* Gemma-2/3: the MLP's post norm's input (down's output, which the
     * backward then need not recompute) and its 1/rms (fp32), whole rows */
    if (zo_model_post_norms(m)) bytes += ceil_div(sb * h * act, sp) + ceil_div(sb * 4, sp);
    return bytes;
}

const char *plan_runtime_name(plan_runtime r) { return r == PLAN_RUNTIME_EAGER ? "eager" : "zoffload"; }

double plan_eager_extra(const zo_model_config *m)
{
    return m->arch == ZO_ARCH_LLAMA ? PLAN_EAGER_LLAMA_EXTRA : 0;
}

int plan_recompute_rank(const plan_train *t)
{
    switch (t->recompute) {
    case ZO_PLAN_RECOMPUTE_NONE: return 0;
    case ZO_PLAN_RECOMPUTE_SELECTIVE: return 1;
    case ZO_PLAN_RECOMPUTE_OPS: return 2;
    default: return t->recompute_layers ? 3 : 4;
    }
}

void plan_recompute_words(const plan_train *t, char *buf, size_t len)
{
    if (t->recompute == ZO_PLAN_RECOMPUTE_FULL && t->recompute_layers)
        snprintf(buf, len, "full of %d layers a stage", t->recompute_layers);
    else
        snprintf(buf, len, "%s", zo_plan_recompute_name(t->recompute));
}

zo_status plan_runtime_parse(const char *s, const char *flag, plan_runtime *out)
{
    static const char *const names[] = {"zoffload", "eager", NULL};
    int i;
    zo_status st = zo_plan_name_parse(names, s, flag, &i);
    if (st == ZO_OK) *out = (plan_runtime)i;
    return st;
}

const char *plan_pp_schedule_name(plan_pp_schedule s)
{
    return s == PLAN_PP_DEEPSPEED ? "deepspeed" : "megatron";
}

zo_status plan_pp_schedule_parse(const char *s, const char *flag, plan_pp_schedule *out)
{
    static const char *const names[] = {"megatron", "deepspeed", NULL};
    int i;
    zo_status st = zo_plan_name_parse(names, s, flag, &i);
    if (st == ZO_OK) *out = (plan_pp_schedule)i;
    return st;
}

const char *plan_pp_partition_name(plan_pp_partition p)
{
    return p == PLAN_PP_PARTITION_EMBEDDING ? "embedding" : "layers";
}

zo_status plan_pp_partition_parse(const char *s, const char *flag, plan_pp_partition *out)
{
    static const char *const names[] = {"layers", "embedding", NULL};
    int i;
    zo_status st = zo_plan_name_parse(names, s, flag, &i);
    if (st == ZO_OK) *out = (plan_pp_partition)i;
    return st;
}

int plan_stage_layers(const zo_model_config *m, const plan_train *t, int stage, int *first,
                      int *most)
{
    if (t->pp_partition != PLAN_PP_PARTITION_EMBEDDING) {
        int per = m->n_layers / t->pp;
        if (first) *first = stage * per;
        if (most) *most = per;
        return per;
    }
    /* (L + 2)/p slots a stage; the embedding takes the first stage's first
     * and the tied output layer the last stage's last */
    int per = (m->n_layers + 2) / t->pp;
    if (first) *first = stage == 0 ? 0 : stage * per - 1;
    if (most) *most = t->pp > 2 ? per : per - (t->pp == 1 ? 2 : 1);
    return per - (stage == 0) - (stage == t->pp - 1);
}

/* ---- what the GPU can run -------------------------------------------------------- */

/* By the GPU's name, until the hardware description carries its compute
 * capability: Volta (V100) and older have no bf16 tensor cores and no
 * FlashAttention kernels (FlashAttention needs Turing or later, FA-2 Ampere). */
static int gpu_is_volta_or_older(const plan_hw *hw)
{
    return !strncasecmp(hw->gpu, "V100", 4) || !strncasecmp(hw->gpu, "P100", 4);
}

void plan_train_fit_hw(plan_train *t, const plan_hw *hw)
{
    if (plan_hw_is_cpu_backend(hw)) { /* train --device cpu: plain host allocations */
        t->buf.cuda_context = t->buf.cublas_workspace = 0;
        t->buf.fragmentation = 0;
    }
    if (!gpu_is_volta_or_older(hw)) return;
    if (t->dtype == ZO_DTYPE_BF16) t->dtype = ZO_DTYPE_F16;
    if (t->grad_dtype == ZO_DTYPE_BF16) t->grad_dtype = ZO_DTYPE_F16;
}

static void say(char *buf, size_t len, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void say(char *buf, size_t len, size_t *used, const char *fmt, ...)
{
    if (*used >= len) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *used, len - *used, fmt, ap);
    va_end(ap);
    if (n > 0) *used += (size_t)n;
    if (*used >= len) *used = len - 1;
}

int plan_train_warnings(const plan_train *t, const plan_hw *hw, char *buf, size_t len)
{
    size_t used = 0;
    int n = 0;
    if (len) buf[0] = '\0';
    if (t->flash_attn && gpu_is_volta_or_older(hw)) {
        say(buf, len, &used,
            "%s has no FlashAttention kernels: the attention's memory is that of a "
            "memory-efficient kernel (xformers, PyTorch SDPA), its time is optimistic; "
            "--no-flash-attn plans standard attention\n",
            hw->gpu);
        n++;
    }
    return n;
}

/* ---- validation ------------------------------------------------------------- */

/* A LoRA or QLoRA configuration: adapters the model has, on layers whose
 * linear weights the model knows (every projection of a GPT or LLaMA
 * layer, latent attention's five, the experts'; not a router with a bias). */
static zo_status plan_peft_validate(const plan_train *t, const zo_model_config *m)
{
    if (t->adapters_on < ZO_PLAN_GPU || t->adapters_on >= ZO_PLAN_TIERS)
        return zo_error(ZO_ERR_INVALID, "--adapters-on: tier %d is not gpu, cpu or nvme",
                        (int)t->adapters_on);
    if (t->method == ZO_PLAN_FULL)
        return t->adapters_on == ZO_PLAN_GPU
                   ? ZO_OK
                   : zo_error(ZO_ERR_INVALID, "--adapters-on %s needs --lora R: only adapters have "
                                              "a placement of their own",
                              zo_plan_tier_name(t->adapters_on));
    if (t->method != ZO_PLAN_LORA && t->method != ZO_PLAN_QLORA)
        return zo_error(ZO_ERR_INVALID, "training method %d is not full, lora or qlora", (int)t->method);
    const char *flag = t->method == ZO_PLAN_QLORA ? "--qlora" : "--lora";
    if (m->params_override)
        return zo_error(ZO_ERR_INVALID, "%s: the adapters need the model's shape (--model or a "
                                        "shape, not --params N)", flag);
    zo_status st = zo_lora_check(m, &t->lora);
    return st == ZO_OK ? ZO_OK : zo_error_wrap(st, "%s", flag);
}

/* The batch, the parallel degrees and what they must divide, the dtype the
 * GPU can run, and the rank count against the hardware. */
static zo_status plan_parallel_validate(const plan_train *t, const zo_model_config *m,
                                        const plan_hw *hw)
{
    if (t->seq <= 0 || t->micro_batch <= 0 || t->grad_accum <= 0)
        return zo_error(ZO_ERR_INVALID, "--seq, --micro-batch and --grad-accum must be positive");
    if (t->dp <= 0 || t->tp <= 0 || t->pp <= 0 || t->vpp <= 0 || t->ep <= 0)
        return zo_error(ZO_ERR_INVALID, "--dp, --tp, --pp, --vpp and --ep must be positive");
    if (t->ep > 1) {
        if (!m->moe.experts)
            return zo_error(ZO_ERR_INVALID, "--ep %d: %s has no experts to shard", t->ep, m->name);
        if (t->dp % t->ep)
            return zo_error(ZO_ERR_INVALID,
                            "--ep %d must divide the data-parallel degree (DP %d): expert "
                            "parallelism shards the experts over data-parallel ranks",
                            t->ep, t->dp);
        if (m->moe.experts % t->ep)
            return zo_error(ZO_ERR_INVALID, "--ep %d does not divide the %d experts of %s",
                            t->ep, m->moe.experts, m->name);
    }
    const char *why = zo_moe_check_capacity(m, t->capacity_factor);
    if (why) return zo_error(ZO_ERR_INVALID, "--capacity-factor %g: %s", t->capacity_factor, why);
    if (t->zero < 0 || t->zero > 3)
        return zo_error(ZO_ERR_INVALID, "--zero %d: the ZeRO stage is 0, 1, 2 or 3", t->zero);
    if (t->pp_partition == PLAN_PP_PARTITION_EMBEDDING && t->pp_schedule != PLAN_PP_DEEPSPEED)
        return zo_error(ZO_ERR_INVALID, "--pp-partition embedding: DeepSpeed's partition (its "
                        "PipelineModule's 'type:transformer|embedding'); needs --pp-schedule deepspeed");
    if (!m->params_override) {
        if (m->n_heads % t->tp)
            return zo_error(ZO_ERR_INVALID,
                            "--tp %d does not divide the %d attention heads of %s", t->tp,
                            m->n_heads, m->name);
        if (m->n_kv_heads % t->tp)
            return zo_error(ZO_ERR_INVALID,
                            "--tp %d does not divide the %d key/value heads of %s", t->tp,
                            m->n_kv_heads, m->name);
        if (t->pp_partition == PLAN_PP_PARTITION_EMBEDDING) {
            if ((m->n_layers + 2) % t->pp || (m->n_layers + 2) / t->pp < 2)
                return zo_error(ZO_ERR_INVALID, "--pp %d with --pp-partition embedding: the %d "
                                "layers of %s and its two embedding layers make no whole number "
                                "of at least 2 a stage", t->pp, m->n_layers, m->name);
        } else if (m->n_layers % t->pp)
            return zo_error(ZO_ERR_INVALID, "--pp %d does not divide the %d layers of %s",
                            t->pp, m->n_layers, m->name);
        if (t->vpp > 1 && m->n_layers % (t->pp * t->vpp))
            return zo_error(ZO_ERR_INVALID,
                            "--pp %d x --vpp %d does not divide the %d layers of %s", t->pp,
                            t->vpp, m->n_layers, m->name);
        if (zo_model_position_rows(m) && t->seq > m->max_seq)
            return zo_error(ZO_ERR_INVALID,
                            "--seq %d exceeds the %d learned positions of %s", t->seq,
                            m->max_seq, m->name);
    }
    if (t->vpp > 1 && t->pp == 1)
        return zo_error(ZO_ERR_INVALID, "--vpp %d needs pipeline parallelism (--pp > 1)", t->vpp);
    if (t->pp_schedule == PLAN_PP_DEEPSPEED && (t->pp == 1 || t->vpp > 1))
        return zo_error(ZO_ERR_INVALID, "--pp-schedule deepspeed: %s",
                        t->pp == 1 ? "needs pipeline parallelism (--pp > 1)"
                                   : "DeepSpeed's pipeline engine does not interleave (drop --vpp)");
    if ((t->dtype == ZO_DTYPE_BF16 || t->grad_dtype == ZO_DTYPE_BF16) && gpu_is_volta_or_older(hw))
        return zo_error(ZO_ERR_INVALID,
                        "--dtype bf16: %s has no bf16 tensor cores (Volta and older); use "
                        "--dtype fp16 (with loss scaling) or fp32",
                        hw->gpu);
    if (t->sp && t->tp == 1)
        return zo_error(ZO_ERR_INVALID, "--sp needs tensor parallelism (--tp > 1)");
    long long world = (long long)t->dp * t->tp * t->pp;
    if (world != hw->gpus)
        return zo_error(ZO_ERR_INVALID,
                        "--dp %d x --tp %d x --pp %d = %lld ranks, but the hardware has %d GPUs "
                        "(set --gpus or --dp)",
                        t->dp, t->tp, t->pp, world, hw->gpus);
    return ZO_OK;
}

/* Where the optimizer state, gradients and checkpoints live, and the
 * recomputation policy. */
static zo_status plan_placement_validate(const plan_train *t, const zo_model_config *m)
{
    zo_status st = zo_plan_fractions_check(t->opt_frac, 1, "--optimizer", "fractions");
    if (st != ZO_OK) return st;
    if (t->grads_on == ZO_PLAN_NVME)
        return zo_error(ZO_ERR_INVALID, "--grads: gradients live on gpu or cpu, not nvme");
    if (t->checkpoints_on == ZO_PLAN_CPU && (t->recompute != ZO_PLAN_RECOMPUTE_FULL || t->recompute_layers))
        return zo_error(ZO_ERR_INVALID,
                        "--checkpoints cpu needs --recompute full of every layer: the runtime moves "
                        "each layer's input checkpoint to the host; a layer that is not recomputed "
                        "keeps every activation on the GPU");
    if (t->recompute < ZO_PLAN_RECOMPUTE_NONE || t->recompute >= ZO_PLAN_RECOMPUTES)
        return zo_error(ZO_ERR_INVALID, "--recompute: %d is not none, selective, full or ops",
                        (int)t->recompute);
    if (t->recompute_layers < 0 || (t->recompute_layers && t->recompute != ZO_PLAN_RECOMPUTE_FULL))
        return zo_error(ZO_ERR_INVALID, "--recompute-layers %d needs --recompute full (the layers of "
                        "each stage recomputed whole)", t->recompute_layers);
    if (t->recompute_layers && m->params_override)
        return zo_error(ZO_ERR_INVALID, "--recompute-layers %d needs the model's layers (a shape or "
                        "a config.json, not --params N)", t->recompute_layers);
    int most = 0;
    if (!m->params_override) plan_stage_layers(m, t, 0, NULL, &most);
    if (t->recompute_layers && !m->params_override && t->recompute_layers > most)
        return zo_error(ZO_ERR_INVALID, "--recompute-layers %d: a pipeline stage of %s has %d layers",
                        t->recompute_layers, m->name, most);
    if (t->recompute == ZO_PLAN_RECOMPUTE_OPS &&
        (m->params_override || m->moe.experts || m->mla.kv_rank || !t->flash_attn))
        return zo_error(ZO_ERR_INVALID, "--recompute ops is modelled for dense GPT and LLaMA layers "
                        "with flash attention (torchtitan's policy over their matmuls)%s",
                        m->params_override ? ": the model is known only by its size"
                        : !t->flash_attn ? ": drop --no-flash-attn" : "");
    if (t->reduce_dtype < 0 || t->reduce_dtype >= ZO_DTYPE_COUNT)
        return zo_error(ZO_ERR_INVALID, "--reduce-dtype: %d is not a dtype", (int)t->reduce_dtype);
    if (t->checkpoints_on == ZO_PLAN_NVME)
        return zo_error(ZO_ERR_INVALID, "--checkpoints: activation checkpoints live on gpu or cpu");
    return ZO_OK;
}

/* The buffers, the hardware, the schedule and the optimizer's encodings. */
static zo_status plan_runtime_validate(const plan_train *t, const plan_hw *hw)
{
    if (t->buf.fragmentation < 0 || t->buf.fragmentation > 1)
        return zo_error(ZO_ERR_INVALID, "--fragmentation %g is outside [0, 1]", t->buf.fragmentation);
    if (t->buf.prefetch_depth < 1)
        return zo_error(ZO_ERR_INVALID, "--prefetch must be at least 1");
    if (t->buf.sub_group == 0 || t->buf.swap_buffers < 1)
        return zo_error(ZO_ERR_INVALID, "--sub-group and its buffer count must be positive");
    if (hw->gpu_mem == 0 || hw->gpus <= 0 || hw->gpus_per_node <= 0)
        return zo_error(ZO_ERR_INVALID, "hardware: GPU memory and GPU counts must be positive");
    if (t->schedule < ZO_PLAN_SCHED_SERIAL || t->schedule >= ZO_PLAN_SCHEDULES)
        return zo_error(ZO_ERR_INVALID, "--schedule: %d is not serial, overlap or dpu", (int)t->schedule);
    /* the runtime's GPU share updates the resident weights in place: it
     * cannot wait a step (offload_init refuses it too) */
    if (t->schedule == ZO_PLAN_SCHED_DPU && t->opt_frac[ZO_PLAN_GPU] > 0)
        return zo_error(ZO_ERR_INVALID, "--schedule dpu: the delayed update runs the CPU optimizer; with "
                        "optimizer state on the GPU (--optimizer gpu=%g) use overlap or serial",
                        t->opt_frac[ZO_PLAN_GPU]);
    if (t->opt_threads < 0 || t->dpu_warmup < 0)
        return zo_error(ZO_ERR_INVALID, "--opt-threads and --dpu-warmup must not be negative");
    if (t->opt_state < ZO_PLAN_STATE_FP32 || t->opt_state >= ZO_PLAN_STATES)
        return zo_error(ZO_ERR_INVALID, "--optim-dtype: %d is not fp32, bf16 or 8bit", (int)t->opt_state);
    if (t->opt_state != ZO_PLAN_STATE_FP32 && t->optimizer != ZO_PLAN_ADAMW)
        return zo_error(ZO_ERR_INVALID, "--optim-dtype %s: the bf16 and 8-bit encodings are AdamW's "
                        "m and v (--optim sgd keeps an fp32 momentum)",
                        zo_plan_opt_state_name(t->opt_state));
    if (t->master < ZO_PLAN_MASTER_FP32 || t->master >= ZO_PLAN_MASTERS)
        return zo_error(ZO_ERR_INVALID, "--master: %d is not fp32, none, stochastic or kahan", (int)t->master);
    if (t->master != ZO_PLAN_MASTER_FP32 && t->dtype != ZO_DTYPE_BF16)
        return zo_error(ZO_ERR_INVALID, "--master %s: without an fp32 master the optimizer updates "
                        "bf16 weights; --dtype is %s", zo_plan_master_name(t->master),
                        zo_dtype_name(t->dtype));
    if (t->loss_chunk < 0)
        return zo_error(ZO_ERR_INVALID, "--loss-chunk %d must not be negative", t->loss_chunk);
    return ZO_OK;
}

zo_status plan_train_validate(const plan_train *t, const zo_model_config *m, const plan_hw *hw)
{
    zo_status st = plan_parallel_validate(t, m, hw);
    if (st == ZO_OK) st = plan_placement_validate(t, m);
    if (st == ZO_OK) st = plan_runtime_validate(t, hw);
    if (st == ZO_OK) st = plan_peft_validate(t, m);
    return st;
}

/* ---- the estimate ------------------------------------------------------------ */

static void add(plan_estimate *e, const char *name, zo_plan_tier tier, plan_kind kind, uint64_t bytes)
{
    if (!bytes) return;
    e->bytes[tier][kind] += bytes;
    if (e->n_items < PLAN_MAX_ITEMS)
        e->items[e->n_items++] = (plan_item){name, tier, kind, bytes};
}

/* A GPU buffer no allocation of the runtime makes, or one it takes outside
 * its counted allocations: in the total, and in e->reserved. */
static void add_reserved(plan_estimate *e, const char *name, uint64_t bytes)
{
    add(e, name, ZO_PLAN_GPU, PLAN_BUFFERS, bytes);
    e->reserved[ZO_PLAN_GPU] += bytes;
}

/* Parameter elements on one rank of a pipeline stage (after TP and EP,
 * before ZeRO). */
typedef struct stage_shape {
    uint64_t params;     /* elements */
    uint64_t emb, head;  /* of which the embedding block (first stage), the head block (last) */
    uint64_t experts;    /* of which routed experts (sharded by ZeRO over DP / EP) */
    uint64_t largest;    /* elements of the largest block */
    uint64_t dense_largest; /* of the largest block with an MoE layer's routed experts apart */
    uint64_t expert;     /* elements of one routed expert on the rank */
    uint64_t largest_part; /* elements of the largest block's ZeRO part: a block over DP, an MoE layer's
                            * routed experts over DP / EP (the runtime's segments, docs/architecture.md) */
    uint64_t dense_part, moe_part; /* elements of a dense layer's and an MoE layer's ZeRO part, as this
                                    * runtime partitions them (ep_part) */
    int layers;
    int moe_layers;      /* of which MoE layers */
    int first_layer;     /* the model's index of the stage's first layer */
    int first, last;
} stage_shape;

int plan_experts_apart(const zo_model_config *m, const plan_train *t)
{
    return m->moe.experts && !m->params_override && t->runtime != PLAN_RUNTIME_EAGER && t->method == ZO_PLAN_FULL &&
           t->params_on == ZO_PLAN_CPU && (t->dp == 1 || t->zero == 0) && t->tp == 1 && t->pp == 1;
}

/* One layer on one rank: TP splits the projections, EP the routed experts. */
static uint64_t layer_on_rank(const zo_layer_params *lp, const plan_train *t, uint64_t *experts)
{
    uint64_t tp = (uint64_t)t->tp;
    *experts = (uint64_t)(lp->experts / t->ep) * ceil_div(lp->expert, tp);
    return ceil_div(lp->tp_split, tp) + lp->replicated + *experts;
}

/* A rank's ZeRO part of a block of `total` elements (or bytes), `ex` of
 * them routed experts, in parts of whole `unit`s: with expert parallelism
 * (ep > 1) the rest over DP and the experts over the DP / EP ranks holding
 * them, each padded (the runtime's segments, docs/architecture.md), else
 * the whole over DP. (plan_parallel_validate: EP divides DP.) */
static uint64_t ep_part(uint64_t total, uint64_t ex, uint64_t dp, int ep, uint64_t unit)
{
    if (ep <= 1) ex = 0;
    uint64_t xdp = dp / (uint64_t)(ep > 1 ? ep : 1); /* (an unvalidated EP above DP: over one rank, no division by 0) */
    return (ceil_div(total - ex, unit * dp) + ceil_div(ex, unit * (xdp ? xdp : 1))) * unit;
}

static void stage_params(const zo_model_config *m, const plan_train *t, int stage,
                         stage_shape *o)
{
    memset(o, 0, sizeof *o);
    o->first = stage == 0;
    o->last = stage == t->pp - 1;
    uint64_t tp = (uint64_t)t->tp, dp = (uint64_t)t->dp;
    if (m->params_override) {
        /* only the size is known: an even split, no block structure */
        o->params = ceil_div(m->params_override, tp * (uint64_t)t->pp);
        return;
    }
    uint64_t h = (uint64_t)m->hidden, v = (uint64_t)m->vocab;
    uint64_t norm = m->norm_bias ? 2 * h : h;
    /* column/row-parallel weights are split over TP; norms and the biases
     * added after a row-parallel reduction are replicated; the stage's layers
     * are dense, or MoE from the model's first_dense on */
    o->layers = plan_stage_layers(m, t, stage, &o->first_layer, NULL);
    int n_moe = 0;
    if (m->moe.experts)
        for (int i = o->first_layer; i < o->first_layer + o->layers; i++) n_moe += zo_model_layer_is_moe(m, i);
    o->moe_layers = n_moe;
    zo_layer_params lp;
    uint64_t ex;
    if (o->layers - n_moe) {
        zo_model_layer_params(m, 0, &lp);
        uint64_t layer = layer_on_rank(&lp, t, &ex);
        o->params += (uint64_t)(o->layers - n_moe) * layer;
        if (layer > o->largest) o->largest = layer;
        o->dense_largest = layer;
        o->dense_part = ceil_div(layer, dp);
        o->largest_part = o->dense_part;
    }
    if (n_moe) {
        zo_model_layer_params(m, m->n_layers - 1, &lp);
        /* (DeepSeek-V3's router score corrections are counted among the
         * model's parameters, as Hugging Face counts them, but are no
         * block's: the runtime keeps them apart in fp32, never trained,
         * with the MoE buffers, moe_buffers) */
        if (m->moe.router_bias) lp.replicated -= (uint64_t)m->moe.experts;
        uint64_t layer = layer_on_rank(&lp, t, &ex);
        o->params += (uint64_t)n_moe * layer;
        o->experts = (uint64_t)n_moe * ex;
        /* this runtime moves an MoE layer as one block (router, experts,
         * shared expert); eager PyTorch frameworks gather module by module
         * (DeepSpeed's ZeRO-3, FSDP): the attention with the router and the
         * shared expert, and each routed expert, one at a time */
        uint64_t one = ceil_div(lp.expert, tp), rest = layer - ex;
        uint64_t block = t->runtime != PLAN_RUNTIME_EAGER ? layer : one > rest ? one : rest;
        if (block > o->largest) o->largest = block;
        if (rest > o->dense_largest) o->dense_largest = rest;
        o->expert = one;
        o->moe_part = ep_part(layer, ex, dp, t->ep, 1);
        uint64_t part = t->runtime != PLAN_RUNTIME_EAGER ? o->moe_part : ceil_div(block, dp);
        if (part > o->largest_part) o->largest_part = part;
    }
    if (o->first) {
        uint64_t emb = ceil_div(v * h, tp) + zo_model_position_rows(m) * h + (m->embed_norm ? norm : 0);
        o->params += emb;
        o->emb = emb;
        if (emb > o->largest) o->largest = emb;
        if (emb > o->dense_largest) o->dense_largest = emb;
        if (ceil_div(emb, dp) > o->largest_part) o->largest_part = ceil_div(emb, dp);
    }
    if (o->last) {
        uint64_t head = norm;
        /* untied: its own output layer; tied across stages: a copy of the
         * word embedding lives on the last stage too */
        if (!m->tied_embeddings || !o->first) head += ceil_div(v * h, tp);
        /* a biased output layer (Phi): the bias split over the vocabulary as the weight */
        if (m->head_bias && !m->params_override) head += ceil_div(v, tp);
        o->params += head;
        o->head = head;
        if (head > o->largest) o->largest = head;
        if (head > o->dense_largest) o->dense_largest = head;
        if (ceil_div(head, dp) > o->largest_part) o->largest_part = ceil_div(head, dp);
    }
}

void plan_stage_shape(const zo_model_config *m, const plan_train *t, int stage,
                      uint64_t *params, uint64_t *largest, int *layers)
{
    stage_shape sh;
    stage_params(m, t, stage, &sh);
    *params = sh.params;
    *largest = sh.largest;
    *layers = sh.layers;
}

/* The NVMe store's alignment of a tensor's start (nvme_engine.h's NVME_ALIGN). */
#define PLAN_NVME_ALIGN 4096

/* NF4 tensors start and end on 16 bytes in the frozen buffer
 * (transformer.h's TF_FROZEN_ALIGN): each rounded up, an upper bound of the
 * runtime's layout within 15 bytes a tensor. */
#define PEFT_NF4_ALIGN 16

int plan_peft_modules(const zo_model_config *m, int layer, unsigned targets, int ep,
                      plan_peft_module out[PLAN_PEFT_MAX_MODULES])
{
    zo_lora_module mods[ZO_LORA_MAX_MODULES];
    int moe = zo_model_layer_is_moe(m, layer), n = 0;
    const int linear = (targets & PLAN_PEFT_LINEAR) != 0;
    targets &= ~PLAN_PEFT_LINEAR;
    /* the attention's (and a dense MLP's: DeepSeek's first layers too) as PEFT names them */
    int k = zo_lora_layer_modules_at(m, layer, moe ? targets & (ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V | ZO_LORA_O)
                                                   : targets, mods);
    for (int i = 0; i < k; i++)
        out[n++] = (plan_peft_module){mods[i].in, mods[i].out, 1,
                                      (mods[i].targets & (ZO_LORA_O | ZO_LORA_DOWN)) != 0, 1, 0};
    if (!moe) return n;
    /* an MoE layer: gate (w1), up (w3) and down (w2) of each routed expert on
     * the rank, over the routed rows (top_k a token), and of the shared
     * expert, over every token; adapters only where the model's LoRA reaches
     * them (Granite-MoE's and gpt-oss's experts: none, zo_lora_layer_modules) */
    if (!linear && !zo_lora_adapts_experts(m)) return n;
    static const unsigned mlp[3] = {ZO_LORA_GATE, ZO_LORA_UP, ZO_LORA_DOWN};
    int64_t h = m->hidden;
    for (int j = 0; j < 3; j++) {
        if (!(targets & mlp[j])) continue;
        int down = mlp[j] == ZO_LORA_DOWN;
        int64_t fe = m->moe.expert_ffn, fs = m->moe.shared_ffn;
        out[n++] = (plan_peft_module){down ? fe : h, down ? h : fe, (uint64_t)(m->moe.experts / ep),
                                      down, m->moe.top_k, 1};
        if (fs) out[n++] = (plan_peft_module){down ? fs : h, down ? h : fs, 1, down, 1, 0};
    }
    return n;
}

uint64_t plan_lora_trainable(const zo_model_config *m, int r, unsigned targets)
{
    return zo_lora_trainable_params(m, r, targets);
}

/* One kind of layer's frozen block and adapters (plan_peft_stage's per-layer
 * fields) for the layers of m like `layer`; *expert_nf4 and *expert_linear
 * one routed expert's (0 in a dense layer). */
static void peft_layer(const zo_model_config *m, const plan_train *t, int layer, plan_peft *o,
                       uint64_t *expert_nf4, uint64_t *expert_linear, uint64_t *ex)
{
    uint64_t wsz = zo_dtype_size(t->dtype), tp = (uint64_t)t->tp, r = (uint64_t)t->lora.r;
    int nf4 = t->method == ZO_PLAN_QLORA;
    /* one layer: its linear weights (PEFT's all-linear; MoE: every local
     * expert's), split by TP; the norms, biases and an MoE router stay in the
     * model dtype */
    plan_peft_module mods[PLAN_PEFT_MAX_MODULES];
    int n = plan_peft_modules(m, layer, ZO_LORA_ALL_LINEAR | PLAN_PEFT_LINEAR, t->ep, mods);
    *expert_nf4 = *expert_linear = 0;
    for (int i = 0; i < n; i++) {
        uint64_t w = ceil_div((uint64_t)(mods[i].in * mods[i].out), tp);
        uint64_t b = ceil_div(zo_nf4_bytes(w), PEFT_NF4_ALIGN) * PEFT_NF4_ALIGN;
        o->layer_linear += mods[i].count * w;
        o->layer_nf4 += mods[i].count * b;
        if (mods[i].expert) {
            *expert_linear += w;
            *expert_nf4 += b;
        }
    }
    zo_layer_params lp;
    zo_model_layer_params(m, layer, &lp);
    uint64_t layer_b = layer_on_rank(&lp, t, ex);
    o->layer_frozen = nf4 ? (layer_b - o->layer_linear) * wsz + o->layer_nf4 : layer_b * wsz;
    /* the adapters: column-parallel layers keep A [r, in] whole and split B
     * [out, r]; row-parallel ones (o, down: their input is split) the reverse */
    n = plan_peft_modules(m, layer, t->lora.targets, t->ep, mods);
    for (int i = 0; i < n; i++) {
        uint64_t in = (uint64_t)mods[i].in, out = (uint64_t)mods[i].out;
        uint64_t el = mods[i].count * r * (mods[i].row ? ceil_div(in, tp) + out : in + ceil_div(out, tp));
        o->layer_trainable += el;
        if (mods[i].expert) o->layer_trainable_ex += el;
        /* A x, per token: this runtime keeps none of a routed expert's (it
         * runs them one expert at a time through a scratch: backward_activations),
         * eager frameworks each routed row's */
        if (!mods[i].expert || t->runtime == PLAN_RUNTIME_EAGER) o->u_width += (double)mods[i].routed * (double)r;
        o->n_adapters++;
    }
}

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

void plan_peft_stage(const zo_model_config *m, const plan_train *t, int stage, plan_peft *o)
{
    memset(o, 0, sizeof *o);
    stage_shape sh;
    stage_params(m, t, stage, &sh);
    uint64_t wsz = zo_dtype_size(t->dtype);
    int nf4 = t->method == ZO_PLAN_QLORA;
    o->layers = sh.layers;
    /* the stage's layers by kind ([0] dense, [1] MoE), each kind's layer
     * (plan_peft_stage's per-layer fields the larger kind's) */
    o->kind_layers[0] = sh.layers - sh.moe_layers;
    o->kind_layers[1] = sh.moe_layers;
    uint64_t expert_nf4 = 0, ex = 0, largest = 0; /* one routed expert's (MoE) */
    uint64_t local = (uint64_t)(m->moe.experts / t->ep);
    for (int kind = 0; kind < 2; kind++) {
        if (!o->kind_layers[kind]) continue;
        plan_peft k = {0};
        uint64_t xn, xl, kx;
        peft_layer(m, t, kind ? m->n_layers - 1 : 0, &k, &xn, &xl, &kx);
        uint64_t layers = (uint64_t)o->kind_layers[kind];
        o->kind_trainable[kind] = k.layer_trainable;
        o->kind_frozen[kind] = k.layer_frozen;
        o->trainable += layers * k.layer_trainable;
        o->frozen += layers * k.layer_frozen;
        o->nf4 += nf4 ? layers * k.layer_nf4 : 0;
        o->layer_linear = max_u64(o->layer_linear, k.layer_linear);
        o->layer_nf4 = max_u64(o->layer_nf4, k.layer_nf4);
        o->layer_frozen = max_u64(o->layer_frozen, k.layer_frozen);
        o->layer_trainable = max_u64(o->layer_trainable, k.layer_trainable);
        if (k.u_width > o->u_width) o->u_width = k.u_width;
        if (k.n_adapters > o->n_adapters) o->n_adapters = k.n_adapters;
        if (kind) {
            o->layer_trainable_ex = k.layer_trainable_ex;
            expert_nf4 = xn;
            ex = kx;
        }
        /* this runtime moves an MoE layer's base as one block; eager
         * frameworks each local expert, and the rest */
        uint64_t expert = kx && t->runtime == PLAN_RUNTIME_EAGER ? (nf4 ? xn : xl * wsz) : 0;
        largest = max_u64(largest, max_u64(expert ? k.layer_frozen - local * expert : k.layer_frozen, expert));
    }
    /* the widest weight the runtime dequantizes at once, as it sizes its
     * scratch (zo_lora_dequant_elems: q, k and v as one, for its fused
     * q|k|v GEMM), split by TP */
    o->largest_linear = ceil_div(zo_lora_dequant_elems(m), (uint64_t)t->tp);
    /* the embedding and head blocks stay whole in the model dtype (QLoRA
     * quantizes the layers' linear weights only) */
    o->first_frozen = sh.emb * wsz;
    o->last_frozen = sh.head * wsz;
    o->frozen += o->first_frozen + o->last_frozen;
    o->layer_frozen_ex = nf4 ? local * expert_nf4 : ex * wsz;
    o->largest_frozen = max_u64(largest, max_u64(o->first_frozen, o->last_frozen));
}

static uint64_t frac_of(uint64_t total, double f) { return round_u64((double)total * f); }

/* The GPU share as the runtime takes it (plan_gpu_share) of a stage whose
 * shape (and LoRA's, pf) the caller has: the suffix of its blocks (the
 * embedding first on stage 0, its layers in order, the head last on the
 * last stage) nearest f of its trained elements, as offload.c's
 * device_share_first (the last block taken first, the shorter suffix kept
 * on a tie). */
static double gpu_share(const zo_model_config *m, const plan_train *t, const stage_shape *sh,
                        const plan_peft *pf, double f)
{
    if (f <= 0 || f >= 1 || m->params_override) return f <= 0 ? 0 : f >= 1 ? 1 : f;
    uint64_t n = pf ? pf->trainable : sh->params;
    if (!n) return f;
    /* a layer's trained elements: LoRA's adapters, or a dense or MoE layer */
    uint64_t layer[2] = {0, 0}, ex;
    zo_layer_params lp;
    for (int moe = 0; moe < 2 && !pf; moe++) {
        if (moe ? !sh->moe_layers : sh->layers == sh->moe_layers) continue;
        zo_model_layer_params(m, moe ? m->n_layers - 1 : 0, &lp);
        layer[moe] = layer_on_rank(&lp, t, &ex);
    }
    double want = f * (double)n, best = -1;
    uint64_t suffix = 0, chosen = 0;
    int nb = sh->first + sh->layers + sh->last;
    for (int b = nb - 1; b >= 0; b--) {
        int l = b - sh->first; /* the stage's layer, or -1 (embedding), or layers (head) */
        if (l < 0) suffix += pf ? 0 : sh->emb;
        else if (l >= sh->layers) suffix += pf ? 0 : sh->head;
        else {
            int moe = zo_model_layer_is_moe(m, sh->first_layer + l);
            suffix += pf ? pf->kind_trainable[moe] : layer[moe];
        }
        double d = fabs((double)suffix - want);
        if (best < 0 || d < best) {
            best = d;
            chosen = suffix;
        }
    }
    return (double)chosen / (double)n;
}

double plan_gpu_share(const zo_model_config *m, const plan_train *t, int stage)
{
    stage_shape sh;
    stage_params(m, t, stage, &sh);
    plan_peft pf;
    int peft = t->method != ZO_PLAN_FULL;
    if (peft) plan_peft_stage(m, t, stage, &pf);
    return gpu_share(m, t, &sh, peft ? &pf : NULL, t->opt_frac[ZO_PLAN_GPU]);
}

/* ---- the estimate of one stage, kind by kind --------------------------------- */

/* What every part of a stage's estimate reads: the stage's shape, what is
 * trained and its ZeRO shard, the weights' device slot, the optimizer's GPU
 * share. Filled by stage_init and estimate_params. */
typedef struct stage_est {
    const zo_model_config *m;
    const plan_train *t;
    stage_shape sh;
    int peft;            /* LoRA / QLoRA: the adapters are trained, the frozen base only read */
    plan_peft pf;        /* (peft) the frozen base and the adapters */
    uint64_t dp, wsz, gsz; /* DP; bytes of a weight and of a gradient on the device */
    uint64_t tr, tr_ex;  /* trained elements on this rank before ZeRO; of them routed experts */
    uint64_t tr_largest; /* trained elements of the largest block */
    uint64_t sharded;    /* of tr, the rank's ZeRO partition */
    uint64_t p_elems;    /* trained weights the rank holds (ZeRO-3: its partition) */
    uint64_t slot;       /* bytes of a device weight slot (LoRA: the streamed stores' blocks) */
    uint64_t wslot;      /* of a device weight slot as streamed (experts apart: a dense part) */
    uint64_t fslot, aslot; /* LoRA: a slot's frozen and adapter blocks */
    double fg;           /* the optimizer's GPU share as the runtime takes it */
} stage_est;

static void stage_init(stage_est *s, const zo_model_config *m, const plan_train *t, int stage)
{
    s->m = m;
    s->t = t;
    stage_params(m, t, stage, &s->sh);
    s->peft = t->method != ZO_PLAN_FULL;
    if (s->peft) plan_peft_stage(m, t, stage, &s->pf);
    s->dp = (uint64_t)t->dp;
    s->wsz = zo_dtype_size(t->dtype);
    s->gsz = zo_dtype_size(t->grad_dtype);
    s->tr = s->peft ? s->pf.trainable : s->sh.params;
    /* (LoRA: the routed experts' adapters apart only with expert parallelism) */
    s->tr_ex = !s->peft ? s->sh.experts : t->ep > 1 ? (uint64_t)s->pf.kind_layers[1] * s->pf.layer_trainable_ex : 0;
    s->tr_largest = s->peft ? s->pf.layer_trainable : s->sh.largest;
    /* ZeRO shards over the ranks that hold the same parameters: all of DP
     * for the rest, DP / EP ("expert data parallel") for routed experts */
    uint64_t edp = s->dp / (uint64_t)t->ep, dense = s->tr - s->tr_ex;
    s->sharded = ceil_div(dense, s->dp) + ceil_div(s->tr_ex, edp);
    s->p_elems = t->zero >= 3 ? s->sharded : s->tr;
    s->slot = s->wslot = s->fslot = s->aslot = 0; /* estimate_params sets them */
    s->fg = gpu_share(m, t, &s->sh, s->peft ? &s->pf : NULL, t->opt_frac[ZO_PLAN_GPU]);
}

/* Full fine-tuning's weights on NVMe at ZeRO-3 on several ranks: the store
 * of the rank's parts, each part starting on PLAN_NVME_ALIGN bytes
 * (nvme_aligned's rule for parts): the embedding's and the head's over DP,
 * a dense layer's over DP, an MoE layer's as stage_params parts it (with
 * expert parallelism its routed experts' over DP / EP, the runtime's
 * segments). */
static uint64_t nvme_parts(const stage_est *s)
{
    const stage_shape *sh = &s->sh;
    uint64_t al = PLAN_NVME_ALIGN, dp = s->dp, wsz = s->wsz, bytes = 0;
    if (sh->first) bytes += ceil_div(ceil_div(sh->emb, dp) * wsz, al) * al;
    if (sh->last) bytes += ceil_div(ceil_div(sh->head, dp) * wsz, al) * al;
    bytes += (uint64_t)(sh->layers - sh->moe_layers) * (ceil_div(sh->dense_part * wsz, al) * al);
    return bytes + (uint64_t)sh->moe_layers * (ceil_div(sh->moe_part * wsz, al) * al);
}

/* Every parameter trained: the weights where --params says. */
static void params_full(stage_est *s, plan_estimate *e)
{
    const plan_train *t = s->t;
    const stage_shape *sh = &s->sh;
    uint64_t bytes = s->p_elems * s->wsz;
    e->rank_params = s->p_elems;
    /* (on NVMe, the rank's parts each aligned) */
    uint64_t stored = t->params_on == ZO_PLAN_NVME && t->zero >= 3 && s->dp > 1 ? nvme_parts(s) : bytes;
    add(e, "fp16/bf16 weights", t->params_on, PLAN_PARAMS, stored);
    e->weight_bytes = sh->params * s->wsz;
    e->stream_bytes = t->params_on != ZO_PLAN_GPU ? bytes : 0;
    e->stream_nvme_bytes = t->params_on == ZO_PLAN_NVME ? bytes : 0;
    e->train_first = sh->first ? sh->emb : 0;
    e->train_last = sh->last ? sh->head : 0;
    e->train_layer = sh->layers ? (sh->params - sh->emb - sh->head) / (uint64_t)sh->layers : 0;
    /* (the model's parameters less DeepSeek-V3's router score corrections,
     * buffers that are never trained) */
    e->trainable = e->params - zo_model_router_bias_params(s->m);
    s->slot = sh->largest * s->wsz;
    /* this runtime streams an MoE layer's routed experts apart from its
     * dense part where the host tier holds the weights (ZeRO-0 or one rank)
     * (docs/offload.md, "Experts streamed apart"): a slot holds the largest
     * dense part, and PLAN_EXPERT_SLOTS slots one expert each */
    s->wslot = s->slot;
    if (plan_experts_apart(s->m, t)) {
        s->wslot = sh->dense_largest * s->wsz;
        add(e, "expert slots (2 x routed expert)", ZO_PLAN_GPU, PLAN_BUFFERS,
            (uint64_t)PLAN_EXPERT_SLOTS * sh->expert * s->wsz);
    }
}

/* A rank's part of a frozen block of `bytes` (ZeRO-3 on several ranks: the
 * base is partitioned in bytes padded to 4 B x DP), or the block. */
static uint64_t frozen_part(const stage_est *s, uint64_t bytes)
{
    return s->t->zero >= 3 && s->dp > 1 ? ceil_div(bytes, 4 * s->dp) * 4 : bytes;
}

/* A rank's part of a layer's frozen block (ZeRO-3 on several ranks: as
 * frozen_part; with expert parallelism the dense bytes over DP and the
 * routed experts' over DP / EP, each padded to 4 B a rank, the runtime's
 * segments). */
static uint64_t frozen_kind_part(const stage_est *s, int kind)
{
    const plan_peft *pf = &s->pf;
    if (s->t->zero < 3 || s->dp <= 1) return pf->kind_frozen[kind];
    return ep_part(pf->kind_frozen[kind], kind ? pf->layer_frozen_ex : 0, s->dp, s->t->ep, 4);
}

/* The larger of a dense and an MoE layer's (DeepSeek's two kinds). */
static uint64_t frozen_layer_part(const stage_est *s)
{
    uint64_t d = frozen_kind_part(s, 0), x = frozen_kind_part(s, 1);
    return d > x ? d : x;
}

/* A rank's part of a layer's adapters at ZeRO-3 (elements): over DP; with
 * expert parallelism the routed experts' over DP / EP (a layer of `kind`:
 * [0] dense, [1] MoE). */
static uint64_t adapters_kind_part(const stage_est *s, int kind)
{
    return ep_part(s->pf.kind_trainable[kind], kind ? s->pf.layer_trainable_ex : 0, s->dp, s->t->ep, 1);
}

static uint64_t adapters_layer_part(const stage_est *s)
{
    uint64_t d = adapters_kind_part(s, 0), x = adapters_kind_part(s, 1);
    return d > x ? d : x;
}

/* On NVMe a store's blocks (ZeRO-3: the rank's parts of them) start on
 * PLAN_NVME_ALIGN bytes (O_DIRECT): every block but the last rounded up
 * (parts: the last too). The adapters' store holds every block, each
 * rounded up (the store aligns its end): the layers' adapters (ZeRO-3: the
 * rank's part, ceil of a layer's elements over DP, comm_shard's largest),
 * and the first block (embeddings) and the last (head), which have none:
 * the weight store gives an empty block one element (wstore.c's nvme_open),
 * a PLAN_NVME_ALIGN unit each. `frozen` and `adapters` are the stores'
 * bytes unaligned. */
static void nvme_aligned(const stage_est *s, uint64_t *frozen, uint64_t *adapters)
{
    const plan_train *t = s->t;
    const stage_shape *sh = &s->sh;
    const plan_peft *pf = &s->pf;
    uint64_t al = PLAN_NVME_ALIGN;
    /* (each kind of layer its own blocks: DeepSeek's dense first ones, MoE
     * ones; the stage's last layer is of the kind that comes last) */
    int last_kind = pf->kind_layers[1] > 0;
    if (t->params_on == ZO_PLAN_NVME && sh->layers) {
        *frozen = (sh->first ? ceil_div(frozen_part(s, pf->first_frozen), al) * al : 0) +
                  (sh->last ? frozen_part(s, pf->last_frozen) : frozen_kind_part(s, last_kind));
        for (int k = 0; k < 2; k++)
            *frozen += (uint64_t)(pf->kind_layers[k] - (!sh->last && k == last_kind ? 1 : 0)) *
                       (ceil_div(frozen_kind_part(s, k), al) * al);
    }
    /* (parts: the last one rounded up too) */
    if (t->params_on == ZO_PLAN_NVME && sh->layers && t->zero >= 3 && s->dp > 1) *frozen = ceil_div(*frozen, al) * al;
    if (t->adapters_on == ZO_PLAN_NVME) {
        *adapters = ((sh->first ? 1 : 0) + (sh->last ? 1 : 0)) * al;
        for (int k = 0; k < 2; k++) {
            uint64_t layer = t->zero >= 3 ? adapters_kind_part(s, k) : pf->kind_trainable[k];
            *adapters += (uint64_t)pf->kind_layers[k] * ceil_div(layer * s->wsz, al) * al;
        }
    }
}

/* A rank's frozen base at ZeRO-3: each block's part, as the runtime
 * partitions the base (offload_dp_part_bytes: a block's bytes padded to 4 B
 * x DP, 4 B words gathered; with expert parallelism a layer's routed
 * experts' over the DP / EP ranks holding them, the rest over DP). */
static uint64_t frozen_z3(const stage_est *s)
{
    const plan_peft *pf = &s->pf;
    /* (each kind of layer its own blocks: DeepSeek's dense first ones, MoE ones) */
    return frozen_part(s, pf->first_frozen) + (uint64_t)pf->kind_layers[0] * frozen_kind_part(s, 0) +
           (uint64_t)pf->kind_layers[1] * frozen_kind_part(s, 1) + frozen_part(s, pf->last_frozen);
}

/* The largest of a rank's parts of the frozen blocks at ZeRO-3 on several
 * ranks: a block's bytes padded to 4 B x DP; with expert parallelism a
 * layer's dense bytes over DP and its routed experts' over DP / EP. */
static uint64_t frozen_largest_part(const stage_est *s)
{
    uint64_t fl = frozen_part(s, s->pf.largest_frozen), layer = frozen_layer_part(s);
    return layer > fl ? layer : fl;
}

/* LoRA: two weight stores (the runtime's), the frozen base where --params
 * says, the adapters where --adapters-on says; a device slot holds a block
 * of each that streams (the base's rounded up to 256 bytes, the adapters' at
 * least 256). */
static void params_peft(stage_est *s, plan_estimate *e)
{
    const plan_train *t = s->t;
    const plan_peft *pf = &s->pf;
    uint64_t dp = s->dp, wsz = s->wsz;
    uint64_t frozen = t->zero >= 3 ? frozen_z3(s) : pf->frozen;
    uint64_t adapters = s->p_elems * wsz;
    e->rank_params = (t->zero >= 3 ? ceil_div(s->sh.params, dp) : s->sh.params) + s->p_elems;
    uint64_t fz = frozen, ad = adapters;
    nvme_aligned(s, &fz, &ad);
    add(e, t->method == ZO_PLAN_QLORA ? "frozen base (NF4 layers; embeddings, head, norms 16-bit)"
                                      : "frozen base (16-bit)",
        t->params_on, PLAN_PARAMS, fz);
    add(e, "LoRA adapters (A, B)", t->adapters_on, PLAN_PARAMS, ad);
    s->fslot = ceil_div(pf->largest_frozen, 256) * 256;
    s->aslot = s->tr_largest * wsz > 256 ? s->tr_largest * wsz : 256;
    /* a device slot takes a block of each store that streams; at ZeRO-3 on
     * several ranks both do (each rank's parts gathered into it), and a slot
     * takes a padded block: the base's bytes to 4 B x DP (it is gathered as
     * fp32 words), the adapters' elements to DP (the slot is the all-gather's
     * and the reduce-scatter's buffer on any number of ranks) */
    int z3 = t->zero >= 3 && dp > 1;
    uint64_t fs = z3 ? ceil_div(ceil_div(pf->largest_frozen, 4 * dp) * 4 * dp, 256) * 256 : s->fslot;
    uint64_t as = dp > 1 && ceil_div(s->tr_largest, dp) * dp * wsz > s->aslot ? ceil_div(s->tr_largest, dp) * dp * wsz
                                                                              : s->aslot;
    s->slot = (t->params_on != ZO_PLAN_GPU || z3 ? fs : 0) + (t->adapters_on != ZO_PLAN_GPU || z3 ? as : 0);
    s->wslot = s->slot;
    e->weight_bytes = pf->frozen + s->tr * wsz;
    e->stream_bytes = (t->params_on != ZO_PLAN_GPU ? frozen : 0) +
                      (t->adapters_on != ZO_PLAN_GPU ? adapters : 0);
    e->stream_nvme_bytes = (t->params_on == ZO_PLAN_NVME ? frozen : 0) +
                           (t->adapters_on == ZO_PLAN_NVME ? adapters : 0);
    e->train_layer = pf->layer_trainable;
    e->trainable = plan_lora_trainable(s->m, t->lora.r, t->lora.targets);
    e->nf4_bytes = pf->nf4;
}

/* ---- parameters: the weights, and the device slots of streamed ones ---- */
static void estimate_params(stage_est *s, plan_estimate *e)
{
    const plan_train *t = s->t;
    if (s->peft) params_peft(s, e);
    else params_full(s, e);
    e->train_params = s->tr;
    e->train_expert_params = s->tr_ex;
    e->train_largest = s->tr_largest;
    e->largest_bytes = s->slot;
    e->layers = s->sh.layers;
    if (s->m->params_override) e->train_first = s->tr; /* only the size: one block */
    int streamed = t->params_on != ZO_PLAN_GPU || t->zero >= 3 || (s->peft && t->adapters_on != ZO_PLAN_GPU);
    /* the block computing holds a slot too: depth + 1 slots (the runtime's pool) */
    if (streamed)
        add(e, t->zero >= 3 && t->params_on == ZO_PLAN_GPU ? "ZeRO-3 gather slots ((prefetch + 1) x block)"
                                                           : "weight slots ((depth + 1) x largest block)",
            ZO_PLAN_GPU, PLAN_BUFFERS, (uint64_t)(t->buf.prefetch_depth + 1) * s->wslot);
}

/* ---- gradients (of what is trained) ---- */
static void estimate_grads(const stage_est *s, plan_estimate *e)
{
    const plan_train *t = s->t;
    uint64_t stage_bytes = 2 * s->tr_largest * s->wsz;
    /* summed where their optimizer state lives: the GPU share's on the GPU,
     * by this runtime in fp32 whatever --grad-dtype says (the device
     * shard's gradient sums, 4 B/param); in --grad-dtype for the frameworks
     * memplan also sizes: --runtime eager (DeepSpeed, FSDP) and tensor or
     * pipeline parallelism (Megatron), which this runtime does not run. The
     * rest where --grads says: on the GPU likewise, or added in fp32 on the
     * host as blocks arrive (micro-batches, a tied embedding's two parts,
     * fp16 unscaling) */
    uint64_t g_elems = t->zero >= 2 ? s->sharded : s->tr;
    uint64_t g_gpu = t->grads_on == ZO_PLAN_GPU ? g_elems : frac_of(g_elems, s->fg);
    uint64_t g_host = g_elems - g_gpu;
    if (t->runtime == PLAN_RUNTIME_EAGER || t->tp > 1 || t->pp > 1)
        add(e, "gradients", ZO_PLAN_GPU, PLAN_GRADS, g_gpu * s->gsz);
    else add(e, "gradient sums (fp32)", ZO_PLAN_GPU, PLAN_GRADS, g_gpu * 4);
    /* backward writes a block's gradients (in the weights' dtype) into one
     * of two staging blocks, from which they go to the host or are added to
     * the GPU's sum; beside a host share the host reads the GPU share's
     * fp32 gradient through the pinned staging for an exact clipping norm */
    if (g_host) {
        add(e, "gradients (fp32 accumulation)", ZO_PLAN_CPU, PLAN_GRADS, g_host * 4);
        add(e, "gradient staging (2 blocks)", ZO_PLAN_GPU, PLAN_GRADS, stage_bytes);
    } else if (s->fg > 0) {
        add(e, "gradient staging (2 blocks)", ZO_PLAN_GPU, PLAN_BUFFERS, stage_bytes);
    }
    /* ... and writes the new weights of a block it updates into a staging
     * block when they live off the GPU (LoRA: the adapters'; ZeRO-3: its part) */
    if (s->fg > 0 && (s->peft ? t->adapters_on : t->params_on) != ZO_PLAN_GPU) {
        uint64_t ns = s->peft ? s->aslot : s->slot;
        add(e, "new-weights staging (1 block)", ZO_PLAN_GPU, PLAN_BUFFERS,
            t->zero >= 3 ? ceil_div(ns, s->dp) : ns);
    }
    /* the delayed update writes a step's new weights into a host copy,
     * published at the next step: of what the rank updates (ZeRO 1-3 on
     * several ranks: its parts) */
    if (t->schedule == ZO_PLAN_SCHED_DPU)
        add(e, "new weights of the delayed update (host copy)", ZO_PLAN_CPU, PLAN_BUFFERS,
            (t->zero >= 1 && s->dp > 1 ? s->sharded : s->tr) * s->wsz);
}

/* ---- optimizer state ---- */

/* The NVMe store of `elems` elements of optimizer state (`per` bytes each,
 * 4 B tensors: master, m, v): the runtime's swap pipeline writes each
 * sub-group's tensors one by one, each starting on PLAN_NVME_ALIGN bytes
 * (LoRA's small adapters: 12 KiB where 10.5 KiB are used). */
static uint64_t nvme_opt_bytes(const plan_train *t, uint64_t elems, uint64_t per)
{
    uint64_t sg = t->buf.sub_group && t->buf.sub_group < elems ? t->buf.sub_group : elems;
    if (!sg) return 0;
    uint64_t tensors = per / 4, full = elems / sg, rest = elems % sg;
    uint64_t a = PLAN_NVME_ALIGN;
    return full * tensors * (ceil_div(sg * 4, a) * a) + (rest ? tensors * (ceil_div(rest * 4, a) * a) : 0);
}

double plan_opt_master_bytes(const plan_train *t)
{
    if (t->master == ZO_PLAN_MASTER_FP32) return 4;
    zo_plan_tier w_on = t->method != ZO_PLAN_FULL ? t->adapters_on : t->params_on;
    int in_place = w_on != ZO_PLAN_NVME && t->opt_frac[w_on] >= 1 - ZO_PLAN_FRACTION_EPS;
    return (in_place ? 0 : 2) + (t->master == ZO_PLAN_MASTER_KAHAN ? 2 : 0);
}

double plan_opt_bytes_per_param(const plan_train *t)
{
    double mom = t->optimizer == ZO_PLAN_ADAMW ? zo_plan_state_bytes(t->opt_state) : 4;
    return plan_opt_master_bytes(t) + mom;
}

const char *plan_opt_state_words(const plan_train *t)
{
    static const char *const adamw[ZO_PLAN_MASTERS][ZO_PLAN_STATES] = {
        {"AdamW: fp32 master, m, v", "AdamW: fp32 master, bf16 m, v",
         "AdamW: fp32 master, 8-bit m, v + absmax"},
        {"AdamW: m, v (no master)", "AdamW: bf16 m, v (no master)",
         "AdamW: 8-bit m, v + absmax (no master)"},
        {"AdamW: m, v (no master, stochastic rounding)", "AdamW: bf16 m, v (no master, stochastic rounding)",
         "AdamW: 8-bit m, v + absmax (no master, stochastic rounding)"},
        {"AdamW: m, v, Kahan compensation (no master)", "AdamW: bf16 m, v, Kahan compensation (no master)",
         "AdamW: 8-bit m, v + absmax, Kahan compensation (no master)"},
    };
    static const char *const sgd[ZO_PLAN_MASTERS] = {
        "SGD: fp32 master, momentum", "SGD: momentum (no master)",
        "SGD: momentum (no master, stochastic rounding)", "SGD: momentum, Kahan compensation (no master)"};
    int ma = t->master >= 0 && t->master < ZO_PLAN_MASTERS ? (int)t->master : 0;
    int st = t->opt_state >= 0 && t->opt_state < ZO_PLAN_STATES ? (int)t->opt_state : 0;
    return t->optimizer == ZO_PLAN_ADAMW ? adamw[ma][st] : sgd[ma];
}

const char *plan_opt_accuracy_note(const plan_train *t)
{
    if (t->method == ZO_PLAN_QLORA && t->master == ZO_PLAN_MASTER_NONE &&
        t->opt_state == ZO_PLAN_STATE_FP32)
        return "the QLoRA recipe (Dettmers et al., \"QLoRA: Efficient Finetuning of Quantized "
               "LLMs\", 2023): NF4 base, bf16 adapters, 32-bit AdamW, no fp32 master; the paper "
               "matches 16-bit full fine-tuning and 16-bit LoRA on GLUE, Super-NaturalInstructions "
               "and MMLU with adapters on every linear layer";
    switch (t->opt_state) {
    case ZO_PLAN_STATE_8BIT:
        return t->master == ZO_PLAN_MASTER_FP32
                   ? "8-bit AdamW (Dettmers et al., \"8-bit Optimizers via Block-wise "
                     "Quantization\", ICLR 2022): block-wise dynamic quantization of m and v matched "
                     "32-bit Adam on language modelling, GLUE, image classification and translation "
                     "(block-wise is what kept training stable)"
                   : "8-bit AdamW (Dettmers et al. 2022) matched 32-bit Adam with an fp32 master "
                     "(its weights stay 32-bit); without one, updates below half a bf16 ulp of a "
                     "weight are lost unless rounded stochastically or compensated (Kahan): not "
                     "what the paper measured";
    case ZO_PLAN_STATE_BF16:
        return "bf16 m and v (torchtune's and LLaMA-Factory's pure-bf16 recipes): with "
               "round-to-nearest v cannot decay by less than half an ulp a step (beta2 0.999 moves "
               "it 0.1%, half an ulp is 0.2-0.4%), so late steps come out smaller than fp32 "
               "AdamW's (docs/cpu_adam.md, \"bf16\")";
    default:
        switch (t->master) {
        case ZO_PLAN_MASTER_NONE:
            return "no fp32 master, round-to-nearest bf16 updates: an update below half an ulp of "
                   "its weight (2^-9 relative) is lost: it degraded full bf16 training in Zamirai "
                   "et al., \"Revisiting BFloat16 Training\" (2020); the QLoRA paper trains its "
                   "bf16 adapters so";
        case ZO_PLAN_MASTER_STOCHASTIC:
            return "no fp32 master, stochastic rounding of the bf16 update: unbiased, matched fp32 "
                   "master training in Zamirai et al., \"Revisiting BFloat16 Training\" (2020)";
        case ZO_PLAN_MASTER_KAHAN:
            return "no fp32 master, Kahan-compensated bf16 update: the compensation keeps what "
                   "rounding lost, matching fp32 master training (Zamirai et al. 2020)";
        default: return "";
        }
    }
}

static void estimate_optimizer(const stage_est *s, plan_estimate *e)
{
    const plan_train *t = s->t;
    uint64_t o_elems = t->zero >= 1 ? s->sharded : s->tr;
    /* the master copy (fp32: the runtime's optimizer shards keep one for
     * fp32 weights too, the weights stream from their own store) and the
     * moments in their encoding */
    double per = plan_opt_bytes_per_param(t);
    uint64_t o_bytes = round_u64((double)o_elems * per);
    /* (the runtime's: the GPU's whole blocks, NVMe the nearest count of
     * the rest, all of it when the CPU has no share) */
    uint64_t o_gpu = frac_of(o_bytes, s->fg);
    uint64_t o_nvme = frac_of(o_bytes, t->opt_frac[ZO_PLAN_NVME]);
    if (o_gpu + o_nvme > o_bytes || (t->opt_frac[ZO_PLAN_CPU] <= 0 && t->opt_frac[ZO_PLAN_NVME] > 0))
        o_nvme = o_bytes - o_gpu;
    uint64_t o_cpu = o_bytes - o_gpu - o_nvme;
    e->opt_share[ZO_PLAN_GPU] = s->fg;
    e->opt_share[ZO_PLAN_NVME] = o_bytes ? (double)o_nvme / (double)o_bytes : t->opt_frac[ZO_PLAN_NVME];
    e->opt_share[ZO_PLAN_CPU] = 1 - e->opt_share[ZO_PLAN_GPU] - e->opt_share[ZO_PLAN_NVME];
    const char *oname = plan_opt_state_words(t);
    add(e, oname, ZO_PLAN_GPU, PLAN_OPTIMIZER, o_gpu);
    add(e, oname, ZO_PLAN_CPU, PLAN_OPTIMIZER, o_cpu);
    /* fp32 state: the store's 4 KiB alignment of each tensor of a sub-group
     * (nvme_opt_bytes); the encodings' tensors are not all 4 B an element */
    int fp32_state = t->opt_state == ZO_PLAN_STATE_FP32 || t->optimizer != ZO_PLAN_ADAMW;
    add(e, oname, ZO_PLAN_NVME, PLAN_OPTIMIZER,
        fp32_state && per >= 4 ? nvme_opt_bytes(t, (uint64_t)((double)o_nvme / per), (uint64_t)per) : o_nvme);
    int encoded = t->opt_state != ZO_PLAN_STATE_FP32 && t->optimizer == ZO_PLAN_ADAMW;
    int nomaster = t->master != ZO_PLAN_MASTER_FP32 && t->optimizer == ZO_PLAN_ADAMW;
    if (encoded || (nomaster && o_gpu)) {
        /* the runtime's fp32 scratch of one chunk of m and v per shard the
         * CPU updates (memory, NVMe: a sub-group's) */
        uint64_t blk = ZO_PLAN_STATE_8BIT_BLOCK, scratch = 0;
        uint64_t e_cpu = (uint64_t)((double)o_cpu / per), e_nvme = (uint64_t)((double)o_nvme / per);
        if (e_nvme > t->buf.sub_group) e_nvme = t->buf.sub_group;
        uint64_t shard[2] = {e_cpu, e_nvme};
        for (int i = 0; i < 2 && encoded; i++) {
            if (!shard[i]) continue;
            uint64_t c = shard[i] < ZO_PLAN_STATE_CHUNK ? shard[i] : ZO_PLAN_STATE_CHUNK;
            scratch += 8 * ((c + blk - 1) / blk * blk);
        }
        /* the GPU share's host stage: ZO_PLAN_GPU_STAGE values of m and v,
         * coded and in fp32 (checkpoints and weights in and out), when they
         * are state buffers (encoded, or fp32 without a master); without a
         * master as many bf16 weights and compensations */
        if (o_gpu) scratch += round_u64((double)ZO_PLAN_GPU_STAGE * (8.0 + zo_plan_state_bytes(t->opt_state)));
        if (o_gpu && nomaster) scratch += (uint64_t)ZO_PLAN_GPU_STAGE * 4;
        add(e, "optimizer scratch (fp32 m, v of a chunk)", ZO_PLAN_CPU, PLAN_BUFFERS, scratch);
    }
    if (o_nvme) {
        /* a sub-group never holds more than the NVMe share of the state */
        uint64_t nvme_elems = (uint64_t)((double)o_nvme / per);
        uint64_t sg = t->buf.sub_group < nvme_elems ? t->buf.sub_group : nvme_elems;
        add(e, "NVMe swap buffers (sub-groups)", ZO_PLAN_CPU, PLAN_BUFFERS,
            round_u64((double)t->buf.swap_buffers * (double)sg * per));
    }
}

/* The runtime's pinned staging, one buffer a role: gradients on their way
 * to the host's fp32 sum (two blocks, when some optimizer state is off the
 * GPU); new weights on their way into a GPU-resident store (two sub-group
 * chunks) or to NVMe (one block); one block's fp32 gradient of a GPU
 * optimizer share beside a host one, for an exact clipping norm (a GPU
 * share that is the whole optimizer takes its norm on the GPU). (LoRA: the gradients and new
 * weights are the adapters', which live on the GPU; the frozen base is never
 * written back. ZeRO 2-3 over several ranks: a block's reduced fp32 part.)
 * `host_slot` is the host's part of a weight slot, `nvme_slots` LoRA's
 * read-ahead slots. */
static uint64_t pinned_staging(const stage_est *s, uint64_t host_slot, uint64_t nvme_slots)
{
    const plan_train *t = s->t;
    uint64_t dp = s->dp, wsz = s->wsz, sg = t->buf.sub_group;
    uint64_t largest = s->peft ? s->tr_largest : s->sh.largest;
    /* (the largest block's part: with EP an MoE layer's experts over DP / EP) */
    uint64_t largest_part = !s->peft ? s->sh.largest_part
                                     : ep_part(largest, s->pf.layer_trainable_ex, dp, t->ep, 1);
    uint64_t part = t->zero >= 3 ? largest_part : largest;
    uint64_t pinned = 0;
    /* (ZeRO 2-3 on several ranks: the reduced fp32 part of a block, LoRA's
     * of its adapters) */
    uint64_t grad_half = t->zero >= 2 && dp > 1 ? largest_part * 4
                         : s->peft               ? part * wsz
                                                 : host_slot;
    if (s->fg < 1) pinned += 2 * grad_half;
    if (!s->peft && t->params_on == ZO_PLAN_GPU) {
        uint64_t chunk = sg && sg < part ? sg : part;
        pinned += 2 * chunk * wsz;
    } else if (!s->peft && t->params_on == ZO_PLAN_NVME) {
        pinned += host_slot;
    } else if (s->peft) {
        /* a resident store takes its blocks through two chunks (the frozen
         * one's in bytes); one on NVMe assembles a block in one slot */
        uint64_t fl = s->pf.largest_frozen;
        /* (ZeRO-3 on several ranks: the store holds the rank's parts, its
         * bytes padded to 4 B x DP) */
        if (t->zero >= 3 && dp > 1) fl = frozen_largest_part(s);
        if (t->params_on == ZO_PLAN_GPU) pinned += 2 * (sg && sg < fl ? sg : fl);
        if (t->adapters_on == ZO_PLAN_GPU) pinned += 2 * (sg && sg < part ? sg : part) * wsz;
        pinned += nvme_slots;
    }
    /* the optimizer's part of a block (LoRA: of the adapters') */
    if (s->fg > 0 && s->fg < 1) pinned += (t->zero >= 1 ? largest_part : largest) * 4;
    return t->buf.pinned_staging ? t->buf.pinned_staging : pinned;
}

/* ---- host buffers: read-ahead of weights on NVMe, pinned staging ---- */
static void estimate_host_buffers(const stage_est *s, plan_estimate *e)
{
    const plan_train *t = s->t;
    /* with ZeRO-3 a rank reads and writes only its 1/DP partition of a block
     * through host memory (the rest arrives by all-gather) */
    uint64_t host_slot = t->zero >= 3 ? ceil_div(s->slot, s->dp) : s->slot;
    /* (expert parallelism: the largest part, an MoE layer's, holds its experts over DP / EP) */
    if (!s->peft && t->zero >= 3 && t->ep > 1 && s->sh.largest_part * s->wsz > host_slot)
        host_slot = s->sh.largest_part * s->wsz;
    uint64_t ring = (uint64_t)(t->buf.prefetch_depth + 1);
    if (!s->peft && t->params_on == ZO_PLAN_NVME)
        add(e, "fp16/bf16 weights read-ahead", ZO_PLAN_CPU, PLAN_BUFFERS, ring * host_slot);
    /* LoRA: a store on NVMe reads ahead into a ring of its slots and
     * assembles a block to write in one more (the frozen one's never used) */
    /* (ZeRO-3 on several ranks: of the rank's parts) */
    int z3 = t->zero >= 3 && s->dp > 1;
    /* (expert parallelism: a layer's part holds its experts over DP / EP) */
    uint64_t apart = z3 ? ceil_div(s->aslot, s->dp) : s->aslot;
    if (z3 && s->peft && t->ep > 1 && adapters_layer_part(s) * s->wsz > apart) apart = adapters_layer_part(s) * s->wsz;
    uint64_t nvme_slots = s->peft ? (t->params_on == ZO_PLAN_NVME ? (z3 ? frozen_largest_part(s) : s->fslot) : 0) +
                                        (t->adapters_on == ZO_PLAN_NVME ? apart : 0)
                                  : 0;
    if (nvme_slots) add(e, "NVMe weights read-ahead", ZO_PLAN_CPU, PLAN_BUFFERS, ring * nvme_slots);
    add(e, "pinned staging", ZO_PLAN_CPU, PLAN_BUFFERS, pinned_staging(s, host_slot, nvme_slots));
}

/* What one layer of the stage saves for one micro-batch, the heaviest of
 * its kinds (dense, MoE): as stored under the recompute (`stored`), whole
 * (`full`), and what selective recompute drops (`sel`); returns the stage's
 * layers' stored bytes. */
static uint64_t layer_activations(const stage_est *s, uint64_t *full, uint64_t *sel, uint64_t *stored)
{
    const zo_model_config *m = s->m;
    const plan_train *t = s->t;
    uint64_t sbh = (uint64_t)t->seq * (uint64_t)t->micro_batch * (uint64_t)m->hidden;
    uint64_t sp_div = t->sp ? (uint64_t)t->tp : 1;
    /* the stage's layers: dense ones and MoE ones save different tensors */
    int kinds[2] = {s->sh.layers - s->sh.moe_layers, s->sh.moe_layers};
    uint64_t stage_stored = 0;
    /* LoRA: each adapter's A x [s b, r] is kept for its backward; by op it
     * is not (transformer.c rebuilds it from the inputs the layer rebuilds
     * or keeps): the ops bytes alone stay per layer, and the one set the
     * re-forward fills is in `full`, so in the working set below */
    uint64_t lora_u = s->peft ? round_u64((double)t->seq * (double)t->micro_batch * s->pf.u_width *
                                          (double)s->wsz)
                              : 0;
    /* recompute full of K layers: the first K of the stage (Megatron's block method) */
    int rc_kinds[2] = {0, 0};
    if (t->recompute == ZO_PLAN_RECOMPUTE_FULL) {
        int k = t->recompute_layers && t->recompute_layers < s->sh.layers ? t->recompute_layers
                                                                           : s->sh.layers;
        if (!s->sh.moe_layers) rc_kinds[0] = k;
        else
            for (int i = s->sh.first_layer; i < s->sh.first_layer + k; i++)
                rc_kinds[zo_model_layer_is_moe(m, i)]++;
    }
    uint64_t input = ceil_div(sbh * s->wsz, sp_div);
    *full = *sel = *stored = 0;
    for (int moe = 0; moe < 2; moe++) {
        if (!kinds[moe]) continue;
        uint64_t f = plan_layer_act_bytes_of(m, t, 1, moe) + lora_u;
        /* without the s^2 terms: only selective recompute needs it */
        uint64_t sl = t->recompute == ZO_PLAN_RECOMPUTE_SELECTIVE
                          ? plan_layer_act_bytes_of(m, t, 0, moe) + lora_u
                          : f;
        if (f > *full) *full = f;
        if (f - sl > *sel) *sel = f - sl;
        if (t->recompute == ZO_PLAN_RECOMPUTE_FULL) {
            /* the recomputed layers keep their input, the others everything */
            uint64_t kept = (uint64_t)(kinds[moe] - rc_kinds[moe]);
            stage_stored += (uint64_t)rc_kinds[moe] * input + kept * f;
            uint64_t st = kept ? f : input;
            if (st > *stored) *stored = st;
            continue;
        }
        uint64_t st = t->recompute == ZO_PLAN_RECOMPUTE_NONE        ? f
                      : t->recompute == ZO_PLAN_RECOMPUTE_SELECTIVE ? sl
                                                                    : plan_layer_ops_bytes(m, t);
        if (st > *stored) *stored = st;
        stage_stored += (uint64_t)kinds[moe] * st;
    }
    return stage_stored;
}

/* Micro-batches in flight on `stage`: 1F1B keeps p on the first stage, one
 * fewer on each later one; interleaving adds (p-1)/(p m) of the pipeline. */
static double inflight_of(const plan_train *t, int stage)
{
    double inflight = (double)(t->pp - stage);
    if (t->vpp > 1 && stage == 0) inflight = t->pp * (1.0 + (t->pp - 1.0) / (t->pp * (double)t->vpp));
    if (inflight > t->grad_accum) inflight = t->grad_accum;
    if (inflight < 1) inflight = 1;
    return inflight;
}

/* The stage's ends: the embedding's on the first stage (per micro-batch in
 * flight), the final norm's, the output layer's and the logits on the last. */
static void end_activations(const stage_est *s, plan_estimate *e)
{
    const zo_model_config *m = s->m;
    const plan_train *t = s->t;
    uint64_t sb = (uint64_t)t->seq * (uint64_t)t->micro_batch, h = (uint64_t)m->hidden;
    uint64_t tp = (uint64_t)t->tp, sp_div = t->sp ? tp : 1;
    if (s->sh.first && t->dropout)
        add(e, "embedding dropout mask", ZO_PLAN_GPU, PLAN_ACTIVATIONS,
            round_u64((double)ceil_div(sb * h, sp_div) * e->inflight));
    if (s->sh.first && m->embed_norm)
        add(e, "embedding norm input", ZO_PLAN_GPU, PLAN_ACTIVATIONS,
            round_u64((double)ceil_div(sb * h * s->wsz, sp_div) * e->inflight));
    if (s->sh.last) {
        /* final norm input and output-layer input (16-bit); logits in
         * fp32 for the cross-entropy (its gradient is written in place) */
        add(e, "final norm + output layer inputs", ZO_PLAN_GPU, PLAN_ACTIVATIONS,
            2 * ceil_div(sb * h * s->wsz, sp_div));
        /* (--loss-chunk N: the output layer and cross-entropy N tokens at
         * a time, forward and backward fused: N tokens' logits live) */
        uint64_t rows = t->loss_chunk > 0 && (uint64_t)t->loss_chunk < sb ? (uint64_t)t->loss_chunk : sb;
        add(e, t->loss_chunk > 0 ? "logits (fp32, cross-entropy, one chunk)" : "logits (fp32, cross-entropy)",
            ZO_PLAN_GPU, PLAN_ACTIVATIONS, ceil_div(4 * rows * (uint64_t)m->vocab, tp));
    }
}

/* LoRA with this runtime's MoE layers: the experts' adapters one expert at
 * a time, over the rows one expert can receive (zo_moe_expert_rows: C from
 * each rank with a capacity factor, else every token); 0 where no expert
 * module is adapted (--lora-targets q,v) or no layer is MoE. */
static uint64_t lora_expert_rows(const stage_est *s)
{
    const zo_model_config *m = s->m;
    const plan_train *t = s->t;
    zo_lora_module mods[ZO_LORA_MAX_MODULES];
    int experts = 0;
    zo_lora_dense_modules(mods, zo_lora_layer_modules(m, t->lora.targets, mods), &experts);
    if (!s->sh.moe_layers || t->runtime != PLAN_RUNTIME_ZOFFLOAD || !experts) return 0;
    uint64_t sb = (uint64_t)t->seq * (uint64_t)t->micro_batch;
    return zo_moe_expert_rows(m, t->capacity_factor, sb, t->ep > 1 ? (uint64_t)t->ep : 1);
}

/* The rows of LoRA's fp32 gradient of A x (transformer.c's dlora, [rows,
 * r]): a micro-batch's tokens, or an expert's rows when more. */
static uint64_t lora_grad_rows(const stage_est *s)
{
    uint64_t sb = (uint64_t)s->t->seq * (uint64_t)s->t->micro_batch, er = lora_expert_rows(s);
    return er > sb ? er : sb;
}

/* Backward of one layer at a time: the fp32 gradients of the residual, a
 * norm output, qkv, the attention output and the MLP (two for SwiGLU; in an
 * MoE layer over the routed rows and the shared expert), one projection
 * scratch in the activation dtype, the token ids, targets and per-token
 * losses, and with 16-bit weights the 16-bit copy of the widest gradient a
 * GEMM reads; LoRA: one adapter's gradient of A x [s b, r] (or of an
 * expert's rows, when more), fp32, and an expert's x A^T (the frozen
 * norms' weight gradients are not computed). */
static void backward_activations(const stage_est *s, plan_estimate *e)
{
    const zo_model_config *m = s->m;
    const plan_train *t = s->t;
    uint64_t sb = (uint64_t)t->seq * (uint64_t)t->micro_batch, h = (uint64_t)m->hidden;
    uint64_t q, k, v, o;
    zo_model_attn_widths(m, &q, &k, &v, &o);
    uint64_t gated = m->arch == ZO_ARCH_GPT ? 1 : 2;
    uint64_t mlp = s->sh.layers > s->sh.moe_layers ? (uint64_t)m->ffn * gated : 0;
    if (s->sh.moe_layers) {
        /* (expert parallelism: over the rows the rank's experts receive) */
        uint64_t ep_rows = plan_ep_rows(m, t);
        uint64_t routed = ep_rows ? ceil_div(ep_rows * (uint64_t)m->moe.expert_ffn, sb)
                                  : round_u64(plan_routed_rows(m, t) * m->moe.expert_ffn);
        uint64_t moe = routed * gated + (uint64_t)m->moe.shared_ffn * gated;
        if (moe > mlp) mlp = moe;
    }
    /* latent attention as this runtime runs it (transformer.c): the q|k|v
     * and the attention's output at heads of qk_nope + qk_rope (v padded),
     * and its own fp32 gradients (kv_a's and kv_b's outputs, c_kv, q_a's,
     * o_proj's input) and scratch (kv_a's and kv_b's outputs) */
    uint64_t mla_grad = 0, mla_scratch = 0;
    if (m->mla.kv_rank && t->runtime == PLAN_RUNTIME_ZOFFLOAD) {
        const zo_mla *x = &m->mla;
        uint64_t ka = (uint64_t)(x->kv_rank + x->qk_rope), kb = (uint64_t)m->n_heads * (uint64_t)(x->qk_nope + x->v_dim);
        mla_grad = ka + kb + (uint64_t)x->kv_rank + (uint64_t)x->q_rank + o;
        mla_scratch = ka + kb;
        v = q;
        o = q;
    }
    uint64_t dgrad = 4 * sb * (2 * h + ceil_div(q + k + v + o + mlp + mla_grad, (uint64_t)t->tp));
    add(e, "backward working set (fp32 activation gradients, scratch)", ZO_PLAN_GPU,
        PLAN_ACTIVATIONS, dgrad + sb * (h + mla_scratch) * s->wsz + 12 * sb);
    if (s->wsz < 4) {
        /* 16-bit weights: the widest activation gradient (a linear layer's
         * output, or the logits) rounded once for the GEMMs that read it */
        uint64_t widest = q + k + v;
        /* (expert parallelism: an expert's rows from every rank of the group) */
        uint64_t ep = s->sh.moe_layers && t->ep > 1 ? (uint64_t)t->ep : 1;
        uint64_t cand[] = {(uint64_t)m->ffn, (uint64_t)m->moe.expert_ffn * ep, h * ep, (uint64_t)m->mla.q_rank};
        for (size_t i = 0; i < sizeof cand / sizeof *cand; i++) widest = cand[i] > widest ? cand[i] : widest;
        uint64_t bytes = sb * ceil_div(widest, (uint64_t)t->tp) * s->wsz;
        /* the logits' gradient: a chunk's with --loss-chunk */
        uint64_t rows = t->loss_chunk > 0 && (uint64_t)t->loss_chunk < sb ? (uint64_t)t->loss_chunk : sb;
        uint64_t lg = s->sh.last ? rows * ceil_div((uint64_t)m->vocab, (uint64_t)t->tp) * s->wsz : 0;
        add(e, "16-bit activation gradient (the GEMMs' operand)", ZO_PLAN_GPU, PLAN_ACTIVATIONS,
            lg > bytes ? lg : bytes);
    }
    if (!s->peft) return;
    uint64_t er = lora_expert_rows(s), r = (uint64_t)t->lora.r;
    if (er) add(e, "LoRA expert scratch (an expert's x A^T)", ZO_PLAN_GPU, PLAN_ACTIVATIONS, er * r * s->wsz);
    add(e, "LoRA backward scratch (fp32)", ZO_PLAN_GPU, PLAN_ACTIVATIONS, 4 * lora_grad_rows(s) * r);
}

/* The buffers an MoE model's layers share (transformer.c): the pairs'
 * gathered inputs and their outputs (activation dtype), the inputs' fp32
 * gradient and the pairs' weight gradient, the router's gradient and the
 * pairs' weights' gradient per token and expert (fp32), the weighted
 * expert activation of the widest MLP, each layer's [2 E] statistics
 * of the load-balancing loss (DeepSeek's: of each sequence), with a
 * capacity factor the router's choice order (a byte per token and expert),
 * and DeepSeek-V3's router score corrections (fp32 [L, E]). */
static void moe_buffers(const stage_est *s, plan_estimate *e)
{
    const zo_model_config *m = s->m;
    const plan_train *t = s->t;
    if (!s->sh.moe_layers) return;
    uint64_t sb = (uint64_t)t->seq * (uint64_t)t->micro_batch, h = (uint64_t)m->hidden;
    uint64_t E = (uint64_t)m->moe.experts;
    uint64_t pairs = round_u64((double)sb * plan_routed_rows(m, t));
    uint64_t ep_rows = plan_ep_rows(m, t); /* (expert parallelism: the rows the rank's experts receive) */
    uint64_t routed_ffn = (ep_rows ? ep_rows : pairs) * (uint64_t)m->moe.expert_ffn;
    uint64_t shared_ffn = sb * (uint64_t)m->moe.shared_ffn;
    uint64_t widest = routed_ffn > shared_ffn ? routed_ffn : shared_ffn;
    /* (the statistics: DeepSeek's balance loss per sequence counts each
     * sequence apart; transformer.c's stat_rows) */
    uint64_t stat_rows = m->moe.aux_per_layer && m->moe.seq_aux && m->moe.aux_loss ? (uint64_t)t->micro_batch : 1;
    uint64_t bytes = pairs * h * (2 * s->wsz + 4) + pairs * 4 + 2 * sb * E * 4 + widest * s->wsz +
                     (uint64_t)m->n_layers * stat_rows * 2 * E * 4 + (t->capacity_factor > 0 ? sb * E : 0) +
                     (m->moe.router_bias ? (uint64_t)m->n_layers * E * 4 : 0);
    add(e, "MoE dispatch buffers (pairs in and out, their gradients, router gradients)", ZO_PLAN_GPU,
        PLAN_ACTIVATIONS, bytes);
    /* expert parallelism: the rows in arrival order and grouped by expert
     * (fp32, in and out of the exchange), their weights (fp32) and the
     * counts sent and received */
    if (ep_rows)
        add(e, "expert-parallel exchange buffers (rows, weights, counts)", ZO_PLAN_GPU, PLAN_ACTIVATIONS,
            2 * ep_rows * h * 4 + 2 * ep_rows * 4 + 2 * (uint64_t)m->moe.experts * 4);
}

/* ---- activations (unknown for a model known only by its size) ---- */
static void estimate_activations(const stage_est *s, int stage, plan_estimate *e)
{
    const plan_train *t = s->t;
    e->activations_known = !s->m->params_override;
    if (!e->activations_known) return;
    uint64_t full, sel, stored;
    uint64_t stage_stored = layer_activations(s, &full, &sel, &stored);
    e->act_layer = stored;
    e->act_layer_full = full;
    e->act_stage = stage_stored;
    e->inflight = inflight_of(t, stage);
    uint64_t layers_bytes = round_u64((double)stage_stored * e->inflight);
    if (t->checkpoints_on == ZO_PLAN_CPU) {
        /* pinned host copies; two layers' worth stay on the GPU in flight */
        add(e, "stored layer activations", ZO_PLAN_CPU, PLAN_ACTIVATIONS, layers_bytes);
        add(e, "activation offload slots (2 layers)", ZO_PLAN_GPU, PLAN_ACTIVATIONS, 2 * stored);
    } else {
        add(e, "stored layer activations", ZO_PLAN_GPU, PLAN_ACTIVATIONS, layers_bytes);
    }
    /* by op: what one layer recomputes, its activations less those it kept
     * (its input stays in the working set, as full recompute's) */
    uint64_t input = ceil_div((uint64_t)t->seq * t->micro_batch * s->m->hidden * s->wsz, t->sp ? t->tp : 1);
    uint64_t working = t->recompute == ZO_PLAN_RECOMPUTE_FULL                          ? full
                       : t->recompute == ZO_PLAN_RECOMPUTE_OPS && full > stored - input ? full - (stored - input)
                       : t->recompute == ZO_PLAN_RECOMPUTE_SELECTIVE                   ? sel
                                                                                       : 0;
    if (t->recompute == ZO_PLAN_RECOMPUTE_SELECTIVE)
        add(e, "recompute working set (attention core)", ZO_PLAN_GPU, PLAN_ACTIVATIONS, working);
    else if (t->recompute == ZO_PLAN_RECOMPUTE_OPS)
        add(e, "recompute working set (1 layer's recomputed ops)", ZO_PLAN_GPU, PLAN_ACTIVATIONS, working);
    else
        add(e, "recompute working set (1 layer)", ZO_PLAN_GPU, PLAN_ACTIVATIONS, working);
    /* eager PyTorch keeps more of a layer's tensors than this runtime (measured) */
    e->eager_extra = round_u64(plan_eager_extra(s->m) * (double)(layers_bytes + working));
    end_activations(s, e);
    backward_activations(s, e);
    moe_buffers(s, e);
}

/* ---- attention on the CUDA backend: its path and its pool scratch ---- */

zo_attn_path plan_attn_path(const zo_model_config *m, const plan_train *t, int qkv_16bit, int d, int window)
{
    const float cap = m->attn_softcap, alibi = m->pos == ZO_POS_ALIBI ? 1.0f : 0.0f;
    const int w = zo_attn_window_masks(window, t->seq) ? window : 0;
    return zo_attn_resolve_path(t->attn_path, qkv_16bit, 1, d, w, cap, alibi, t->seq, 1);
}

/* gpu/cuda/attention_gemm.h's arithmetic, written again (the planner
 * includes no runtime header); test_planner_attn checks it against the
 * pool's high-water mark in the host shim. */
#define ATTN_ROWS 256
#define ATTN_CAP ((uint64_t)256 << 20)
#define ATTN_ALIGN 256

static uint64_t attn_align(uint64_t n) { return ceil_div(n, ATTN_ALIGN) * ATTN_ALIGN; }

uint64_t plan_attn_pool_bytes(zo_attn_path path, int backward, int b, int t, int hq, int hkv, int d, int window,
                              uint64_t cap)
{
    if (b < 1 || t < 1 || hq < 1 || hkv < 1 || d < 1) return 0;
    const uint64_t D = (uint64_t)b * hq * t * 4; /* dO . O per row, fp32 */
    if (path == ZO_ATTN_MMA || path == ZO_ATTN_TC) return backward ? D : 0;
    if (path != ZO_ATTN_GEMM) return 0;
    if (!cap) cap = ATTN_CAP;
    /* a chunk: query rows (fewer when one head's do not fit the cap) times
     * the keys they read, rounded up to 8, of as many kv heads as fit; S
     * fp32 and two 16-bit buffers */
    uint64_t rows = (uint64_t)t < ATTN_ROWS ? (uint64_t)t : ATTN_ROWS, ld, one;
    for (;;) {
        uint64_t keys = window > 0 && rows + (uint64_t)window - 1 < (uint64_t)t ? rows + (uint64_t)window - 1
                                                                                : (uint64_t)t;
        ld = ceil_div(keys, 8) * 8;
        one = rows * ld * 8;
        if (one <= cap || rows == 1) break;
        rows = (rows + 1) / 2;
    }
    uint64_t heads = cap / one;
    heads = heads < 1 ? 1 : heads > (uint64_t)hkv ? (uint64_t)hkv : heads;
    uint64_t nS = heads * rows * ld;
    uint64_t fwd = attn_align(nS * 4) + attn_align(nS * 2);
    if (!backward) return fwd;
    return fwd + attn_align(nS * 2) + attn_align(D) + 2 * attn_align((uint64_t)t * hq * d * 2);
}

uint64_t plan_attn_scratch(const zo_model_config *m, const plan_train *t, int wsz, int first, int layers,
                           zo_attn_path *path)
{
    /* as the transformer calls it (transformer.c's layer_attn): the model's
     * heads (over TP) of head_dim, each layer's window */
    const int hq = (int)ceil_div((uint64_t)m->n_heads, (uint64_t)t->tp);
    const int hkv = (int)ceil_div((uint64_t)m->n_kv_heads, (uint64_t)t->tp);
    uint64_t most = 0;
    *path = ZO_ATTN_FLASH;
    /* a layer's scratch depends on its window alone: each distinct one once
     * (the search asks this of every candidate) */
    int win[ZO_MODEL_WINDOWS];
    const int nw = zo_model_windows(m, first, layers, win, NULL);
    for (int i = 0; i < nw; i++) {
        const int w = win[i];
        const zo_attn_path p = plan_attn_path(m, t, wsz == 2, m->head_dim, w);
        const int wm = zo_attn_window_masks(w, t->seq) ? w : 0;
        const uint64_t bytes = plan_attn_pool_bytes(p, 1, t->micro_batch, t->seq, hq, hkv, m->head_dim, wm, 0);
        if (bytes > most) most = bytes, *path = p;
    }
    return most;
}

/* ---- working buffers on the GPU, the allocator's allowance last ---- */
static void estimate_gpu_buffers(const stage_est *s, const plan_hw *hw, plan_estimate *e)
{
    const plan_train *t = s->t;
    const zo_model_config *m = s->m;
    /* attention's scratch from the pool, at the layer that takes the most
     * on its path (per layer: the automatic choice or the forced one),
     * taken in stream order outside the runtime's counted allocations (so
     * reserved), which the pool keeps */
    if (t->runtime == PLAN_RUNTIME_ZOFFLOAD && !plan_hw_is_cpu_backend(hw)) {
        static const char *label[] = {
            [ZO_ATTN_MMA] = "attention scratch (mma.sync backward: D per row)",
            [ZO_ATTN_TC] = "attention scratch (tensor-core backward: D per row)",
            [ZO_ATTN_GEMM] = "attention scratch (GEMM path: a chunk's scores, D, dO in two parts)",
        };
        zo_attn_path path;
        uint64_t bytes = plan_attn_scratch(m, t, (int)s->wsz, s->sh.first_layer, s->sh.layers, &path);
        if (bytes) add_reserved(e, label[path], bytes);
    }
    /* LoRA on a GPU with 16-bit weights: cuBLASLt takes no fp32 operand
     * beside a 16-bit one, so gpu/cuda/gemm.cu's gemm_round_operand rounds
     * the adapters' fp32 gradient of A x (du, the GEMMs dA += du^T x and
     * dx += du A) into pool scratch, one GEMM at a time (the layers' own
     * GEMMs read the 16-bit activation gradient transformer.c rounds once,
     * counted with the activations) */
    if (s->peft && t->runtime == PLAN_RUNTIME_ZOFFLOAD && !plan_hw_is_cpu_backend(hw) && s->wsz == 2)
        add_reserved(e, "GEMM operand scratch (LoRA's fp32 du rounded to 16 bits)",
                     lora_grad_rows(s) * (uint64_t)t->lora.r * 2);
    /* QLoRA: one linear weight dequantized at a time */
    if (t->method == ZO_PLAN_QLORA)
        add(e, "NF4 dequantization scratch (1 linear weight)", ZO_PLAN_GPU, PLAN_BUFFERS,
            s->pf.largest_linear * s->wsz);
    if (t->runtime == PLAN_RUNTIME_EAGER)
        add(e, "eager PyTorch: what its ops keep beyond these layers' (measured)", ZO_PLAN_GPU,
            PLAN_ACTIVATIONS, e->eager_extra);
    add_reserved(e, "CUDA context", t->buf.cuda_context);
    add_reserved(e, "cuBLAS workspace", t->buf.cublas_workspace);
    /* the gradients are reduced in the reduce dtype (the runtime's: fp32), through
     * buckets of comm_bucket elements (rounded down to a multiple of DP), at most
     * the largest block padded */
    if (t->dp > 1) {
        uint64_t dp = s->dp;
        /* (the largest block trained: LoRA's, of adapters) */
        uint64_t cap = t->buf.comm_bucket / dp * dp, whole = ceil_div(s->tr_largest, dp) * dp;
        if (!cap) cap = dp;
        add(e, t->reduce_dtype == ZO_DTYPE_F32 ? "communication buckets (fp32)"
               : t->reduce_dtype == ZO_DTYPE_BF16 ? "communication buckets (bf16)"
                                                  : "communication buckets (fp16)",
            ZO_PLAN_GPU, PLAN_BUFFERS,
            (uint64_t)t->buf.comm_buckets * (cap < whole ? cap : whole) * zo_dtype_size(t->reduce_dtype));
    }
    uint64_t gpu_sum = 0;
    for (int k = 0; k < PLAN_KINDS; k++) gpu_sum += e->bytes[ZO_PLAN_GPU][k];
    add_reserved(e, "allocator fragmentation allowance", frac_of(gpu_sum, t->buf.fragmentation));
}

/* One pipeline stage's estimate: its capacities, each kind of memory in the
 * order the report lists them, the totals and whether they fit. */
static void estimate_stage(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                           int stage, plan_estimate *e)
{
    memset(e, 0, sizeof *e);
    e->stage = stage;
    e->params = zo_model_params(m);
    e->ranks_per_node = plan_hw_ranks_per_node(hw);
    e->capacity[ZO_PLAN_GPU] = hw->gpu_mem;
    e->capacity[ZO_PLAN_CPU] = hw->cpu_mem / (uint64_t)e->ranks_per_node;
    e->capacity[ZO_PLAN_NVME] = hw->nvme / (uint64_t)e->ranks_per_node;
    stage_est s;
    stage_init(&s, m, t, stage);
    e->stage_params = s.sh.params;
    e->stage_expert_params = s.sh.experts;
    e->largest_block = s.sh.largest;
    estimate_params(&s, e);
    estimate_grads(&s, e);
    estimate_optimizer(&s, e);
    estimate_host_buffers(&s, e);
    estimate_activations(&s, stage, e);
    estimate_gpu_buffers(&s, hw, e);
    e->fits = 1;
    for (int tier = 0; tier < ZO_PLAN_TIERS; tier++) {
        for (int k = 0; k < PLAN_KINDS; k++) e->total[tier] += e->bytes[tier][k];
        if (e->total[tier] > e->capacity[tier]) e->fits = 0;
    }
}

void plan_estimate_unchecked(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                             plan_estimate *out)
{
    estimate_stage(m, hw, t, 0, out);
    /* the last stage; with DeepSpeed's partition also a middle one (more layers) */
    int others[2] = {t->pp - 1, t->pp_partition == PLAN_PP_PARTITION_EMBEDDING && t->pp > 2};
    for (int k = 0; k < 2; k++) {
        if (others[k] <= 0) continue;
        plan_estimate other;
        estimate_stage(m, hw, t, others[k], &other);
        if (other.total[ZO_PLAN_GPU] > out->total[ZO_PLAN_GPU]) *out = other;
    }
}

zo_status plan_estimate_run(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                            plan_estimate *out)
{
    zo_status st = plan_train_validate(t, m, hw);
    if (st) return st;
    plan_estimate_unchecked(m, hw, t, out);
    return ZO_OK;
}
