#include "memory.h"

#include <math.h>
#include <string.h>

const char *plan_tier_name(plan_tier t)
{
    static const char *n[] = {"gpu", "cpu", "nvme"};
    return t < PLAN_TIERS ? n[t] : "?";
}

const char *plan_kind_name(plan_kind k)
{
    static const char *n[] = {"params", "grads", "optimizer", "activations", "buffers"};
    return k < PLAN_KINDS ? n[k] : "?";
}

const char *plan_recompute_name(plan_recompute r)
{
    static const char *n[] = {"none", "selective", "full"};
    return r <= PLAN_RECOMPUTE_FULL ? n[r] : "?";
}

void plan_train_defaults(plan_train *t, const zo_model_config *m)
{
    memset(t, 0, sizeof *t);
    t->seq = m->max_seq > 0 ? m->max_seq : 2048;
    t->micro_batch = 1;
    t->grad_accum = 1;
    t->dtype = ZO_DTYPE_BF16;
    t->grad_dtype = ZO_DTYPE_BF16;
    t->optimizer = PLAN_OPT_ADAMW;
    t->dp = t->tp = t->pp = t->vpp = 1;
    t->recompute = PLAN_RECOMPUTE_NONE;
    t->flash_attn = 1;
    t->dropout = m->arch == ZO_ARCH_GPT;
    t->params_on = t->grads_on = t->checkpoints_on = PLAN_GPU;
    t->opt_frac[PLAN_GPU] = 1.0;
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
    {"attn.qkv", "input (norm_1 output)", PLAN_W_H, 0, 0},
    {"attn.scores", "Q", PLAN_W_Q, 0, PLAN_ACT_TP},
    {"attn.scores", "K", PLAN_W_KV, 0, PLAN_ACT_TP},
    {"attn.softmax", "output", PLAN_W_SCORES, 0, PLAN_ACT_TP | PLAN_ACT_S2},
    {"attn.dropout", "mask", PLAN_W_SCORES, 1, PLAN_ACT_TP | PLAN_ACT_S2 | PLAN_ACT_DROPOUT},
    {"attn.context", "dropout output", PLAN_W_SCORES, 0, PLAN_ACT_TP | PLAN_ACT_S2 | PLAN_ACT_DROPOUT},
    {"attn.context", "V", PLAN_W_KV, 0, PLAN_ACT_TP},
    {"attn.flash", "logsumexp (fp32)", PLAN_W_HEADS, 4, PLAN_ACT_TP | PLAN_ACT_FLASH},
    {"attn.out", "input", PLAN_W_Q, 0, PLAN_ACT_TP},
    {"attn.resid_dropout", "mask", PLAN_W_H, 1, PLAN_ACT_DROPOUT},
    /* MLP */
    {"norm_2", "input", PLAN_W_H, 0, 0},
    {"mlp.in", "input (norm_2 output)", PLAN_W_H, 0, 0},
    {"mlp.gelu", "input", PLAN_W_FFN, 0, PLAN_ACT_TP | PLAN_ACT_GPT},
    {"mlp.fc_out", "input (gelu output)", PLAN_W_FFN, 0, PLAN_ACT_TP | PLAN_ACT_GPT},
    {"mlp.swiglu", "gate output", PLAN_W_FFN, 0, PLAN_ACT_TP | PLAN_ACT_LLAMA},
    {"mlp.swiglu", "up output", PLAN_W_FFN, 0, PLAN_ACT_TP | PLAN_ACT_LLAMA},
    {"mlp.down", "input (swiglu output)", PLAN_W_FFN, 0, PLAN_ACT_TP | PLAN_ACT_LLAMA},
    {"mlp.dropout", "mask", PLAN_W_H, 1, PLAN_ACT_DROPOUT},
};

const plan_act_entry *plan_act_table(size_t *count)
{
    *count = sizeof act_table / sizeof act_table[0];
    return act_table;
}

static uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

uint64_t plan_layer_act_bytes(const zo_model_config *m, const plan_train *t, int keep_s2)
{
    uint64_t s = (uint64_t)t->seq, b = (uint64_t)t->micro_batch;
    uint64_t a = (uint64_t)m->n_heads, hd = (uint64_t)m->head_dim;
    uint64_t act = zo_dtype_size(t->dtype);
    uint64_t tp = (uint64_t)t->tp;
    uint64_t total = 0;
    for (size_t i = 0; i < sizeof act_table / sizeof act_table[0]; i++) {
        const plan_act_entry *e = &act_table[i];
        if ((e->flags & PLAN_ACT_GPT) && m->arch != ZO_ARCH_GPT) continue;
        if ((e->flags & PLAN_ACT_LLAMA) && m->arch != ZO_ARCH_LLAMA) continue;
        if ((e->flags & PLAN_ACT_DROPOUT) && !t->dropout) continue;
        if ((e->flags & PLAN_ACT_S2) && (t->flash_attn || !keep_s2)) continue;
        if ((e->flags & PLAN_ACT_FLASH) && !t->flash_attn) continue;
        uint64_t n;
        switch (e->width) {
        case PLAN_W_H: n = s * b * (uint64_t)m->hidden; break;
        case PLAN_W_Q: n = s * b * a * hd; break;
        case PLAN_W_KV: n = s * b * (uint64_t)m->n_kv_heads * hd; break;
        case PLAN_W_FFN: n = s * b * (uint64_t)m->ffn; break;
        case PLAN_W_SCORES: n = a * s * s * b; break;
        default: n = a * s * b; break;
        }
        n *= e->bytes ? (uint64_t)e->bytes : act;
        uint64_t div = (e->flags & PLAN_ACT_TP) || t->sp ? tp : 1;
        total += ceil_div(n, div);
    }
    return total;
}

/* ---- validation ------------------------------------------------------------- */

zo_status plan_train_validate(const plan_train *t, const zo_model_config *m, const plan_hw *hw)
{
    if (t->seq <= 0 || t->micro_batch <= 0 || t->grad_accum <= 0)
        return zo_error(ZO_ERR_INVALID, "--seq, --micro-batch and --grad-accum must be positive");
    if (t->dp <= 0 || t->tp <= 0 || t->pp <= 0 || t->vpp <= 0)
        return zo_error(ZO_ERR_INVALID, "--dp, --tp, --pp and --vpp must be positive");
    if (t->zero < 0 || t->zero > 3)
        return zo_error(ZO_ERR_INVALID, "--zero %d: the ZeRO stage is 0, 1, 2 or 3", t->zero);
    if (!m->params_override) {
        if (m->n_heads % t->tp)
            return zo_error(ZO_ERR_INVALID,
                            "--tp %d does not divide the %d attention heads of %s", t->tp,
                            m->n_heads, m->name);
        if (m->n_kv_heads % t->tp)
            return zo_error(ZO_ERR_INVALID,
                            "--tp %d does not divide the %d key/value heads of %s", t->tp,
                            m->n_kv_heads, m->name);
        if (m->n_layers % t->pp)
            return zo_error(ZO_ERR_INVALID, "--pp %d does not divide the %d layers of %s",
                            t->pp, m->n_layers, m->name);
        if (t->vpp > 1 && m->n_layers % (t->pp * t->vpp))
            return zo_error(ZO_ERR_INVALID,
                            "--pp %d x --vpp %d does not divide the %d layers of %s", t->pp,
                            t->vpp, m->n_layers, m->name);
        if (m->arch == ZO_ARCH_GPT && t->seq > m->max_seq)
            return zo_error(ZO_ERR_INVALID,
                            "--seq %d exceeds the %d learned positions of %s", t->seq,
                            m->max_seq, m->name);
    }
    if (t->vpp > 1 && t->pp == 1)
        return zo_error(ZO_ERR_INVALID, "--vpp %d needs pipeline parallelism (--pp > 1)", t->vpp);
    if (t->sp && t->tp == 1)
        return zo_error(ZO_ERR_INVALID, "--sp needs tensor parallelism (--tp > 1)");
    long long world = (long long)t->dp * t->tp * t->pp;
    if (world != hw->gpus)
        return zo_error(ZO_ERR_INVALID,
                        "--dp %d x --tp %d x --pp %d = %lld ranks, but the hardware has %d GPUs "
                        "(set --gpus or --dp)",
                        t->dp, t->tp, t->pp, world, hw->gpus);
    double sum = 0;
    for (int i = 0; i < PLAN_TIERS; i++) {
        if (t->opt_frac[i] < 0 || t->opt_frac[i] > 1)
            return zo_error(ZO_ERR_INVALID, "--optimizer: fraction %s=%g is outside [0, 1]",
                            plan_tier_name((plan_tier)i), t->opt_frac[i]);
        sum += t->opt_frac[i];
    }
    if (fabs(sum - 1.0) > 1e-6)
        return zo_error(ZO_ERR_INVALID, "--optimizer: fractions sum to %g, not 1", sum);
    if (t->grads_on == PLAN_NVME)
        return zo_error(ZO_ERR_INVALID, "--grads: gradients live on gpu or cpu, not nvme");
    if (t->checkpoints_on == PLAN_CPU && t->recompute != PLAN_RECOMPUTE_FULL)
        return zo_error(ZO_ERR_INVALID,
                        "--checkpoints cpu needs --recompute full: the runtime moves each layer's "
                        "input checkpoint to the host; without recompute every activation stays "
                        "on the GPU");
    if (t->checkpoints_on == PLAN_NVME)
        return zo_error(ZO_ERR_INVALID, "--checkpoints: activation checkpoints live on gpu or cpu");
    if (t->buf.fragmentation < 0 || t->buf.fragmentation > 1)
        return zo_error(ZO_ERR_INVALID, "--fragmentation %g is outside [0, 1]", t->buf.fragmentation);
    if (t->buf.prefetch_depth < 1)
        return zo_error(ZO_ERR_INVALID, "--prefetch must be at least 1");
    if (t->buf.sub_group == 0 || t->buf.swap_buffers < 1)
        return zo_error(ZO_ERR_INVALID, "--sub-group and its buffer count must be positive");
    if (hw->gpu_mem == 0 || hw->gpus <= 0 || hw->gpus_per_node <= 0)
        return zo_error(ZO_ERR_INVALID, "hardware: GPU memory and GPU counts must be positive");
    return ZO_OK;
}

/* ---- the estimate ------------------------------------------------------------ */

static void add(plan_estimate *e, const char *name, plan_tier tier, plan_kind kind, uint64_t bytes)
{
    if (!bytes) return;
    e->bytes[tier][kind] += bytes;
    if (e->n_items < PLAN_MAX_ITEMS)
        e->items[e->n_items++] = (plan_item){name, tier, kind, bytes};
}

/* Parameter elements on one rank of a pipeline stage (after TP, before ZeRO). */
typedef struct stage_shape {
    uint64_t params;     /* elements */
    uint64_t largest;    /* elements of the largest block */
    int layers;
    int first, last;
} stage_shape;

static void stage_params(const zo_model_config *m, const plan_train *t, int stage,
                         stage_shape *o)
{
    memset(o, 0, sizeof *o);
    o->first = stage == 0;
    o->last = stage == t->pp - 1;
    uint64_t tp = (uint64_t)t->tp;
    if (m->params_override) {
        /* only the size is known: an even split, no block structure */
        o->params = ceil_div(m->params_override, tp * (uint64_t)t->pp);
        return;
    }
    uint64_t h = (uint64_t)m->hidden, f = (uint64_t)m->ffn, v = (uint64_t)m->vocab;
    uint64_t q = (uint64_t)m->n_heads * (uint64_t)m->head_dim;
    uint64_t kv = (uint64_t)m->n_kv_heads * (uint64_t)m->head_dim;
    uint64_t norm = m->norm_bias ? 2 * h : h;
    /* column/row-parallel weights are split over TP; norms and the biases
     * added after a row-parallel reduction are replicated */
    uint64_t split = h * (q + 2 * kv) + q * h + (m->arch == ZO_ARCH_GPT ? 2 : 3) * h * f;
    if (m->attn_bias) split += q + 2 * kv;
    uint64_t repl = 2 * norm;
    if (m->out_bias) {
        repl += 2 * h;                                   /* attention out, MLP out */
        split += m->arch == ZO_ARCH_GPT ? f : 2 * f;     /* MLP in */
    }
    uint64_t layer = split / tp + repl;
    o->layers = m->n_layers / t->pp;
    o->params = layer * (uint64_t)o->layers;
    o->largest = layer;
    if (o->first) {
        uint64_t emb = ceil_div(v * h, tp) + (m->arch == ZO_ARCH_GPT ? (uint64_t)m->max_seq * h : 0);
        o->params += emb;
        if (emb > o->largest) o->largest = emb;
    }
    if (o->last) {
        uint64_t head = norm;
        /* untied: its own output layer; tied across stages: a copy of the
         * word embedding lives on the last stage too */
        if (!m->tied_embeddings || !o->first) head += ceil_div(v * h, tp);
        o->params += head;
        if (head > o->largest) o->largest = head;
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

static uint64_t frac_of(uint64_t total, double f) { return (uint64_t)llround((double)total * f); }

/* One rank's part of a block of n elements split over dp ranks. */
static uint64_t largest_part_of(uint64_t n, uint64_t dp) { return ceil_div(n, dp); }

static zo_status estimate_stage(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                                int stage, plan_estimate *e)
{
    memset(e, 0, sizeof *e);
    e->stage = stage;
    e->params = zo_model_params(m);
    e->ranks_per_node = plan_hw_ranks_per_node(hw);
    e->capacity[PLAN_GPU] = hw->gpu_mem;
    e->capacity[PLAN_CPU] = hw->cpu_mem / (uint64_t)e->ranks_per_node;
    e->capacity[PLAN_NVME] = hw->nvme / (uint64_t)e->ranks_per_node;

    stage_shape sh;
    stage_params(m, t, stage, &sh);
    uint64_t dp = (uint64_t)t->dp;
    uint64_t wsz = zo_dtype_size(t->dtype), gsz = zo_dtype_size(t->grad_dtype);
    e->stage_params = sh.params;
    e->largest_block = sh.largest;

    /* ---- parameters ---- */
    uint64_t p_elems = t->zero >= 3 ? ceil_div(sh.params, dp) : sh.params;
    e->rank_params = p_elems;
    add(e, "fp16/bf16 weights", t->params_on, PLAN_PARAMS, p_elems * wsz);
    int streamed = t->params_on != PLAN_GPU || t->zero >= 3;
    uint64_t slot = sh.largest * wsz;
    /* the block computing holds a slot too: depth + 1 slots (the runtime's pool) */
    if (streamed)
        add(e, t->zero >= 3 && t->params_on == PLAN_GPU ? "ZeRO-3 gather slots ((prefetch + 1) x block)"
                                                        : "weight slots ((depth + 1) x largest block)",
            PLAN_GPU, PLAN_BUFFERS, (uint64_t)(t->buf.prefetch_depth + 1) * slot);

    /* ---- gradients ---- */
    uint64_t g_elems = t->zero >= 2 ? ceil_div(sh.params, dp) : sh.params;
    if (t->grads_on == PLAN_GPU) {
        /* in the plan's gradient dtype: the runtime sums the gradients of
         * its GPU optimizer share in fp32 (--grad-dtype fp32, 4 B/param) */
        add(e, "gradients", PLAN_GPU, PLAN_GRADS, g_elems * gsz);
    } else {
        /* added in fp32 on the host as blocks arrive (micro-batches, a tied
         * embedding's two parts, fp16 unscaling), whatever the accumulation */
        add(e, "gradients (fp32 accumulation)", PLAN_CPU, PLAN_GRADS, g_elems * 4);
        add(e, "gradient staging (2 blocks)", PLAN_GPU, PLAN_GRADS, 2 * sh.largest * gsz);
    }
    /* a GPU optimizer share: backward writes each block's gradients (in
     * the weights' dtype) into one of two staging blocks before they are
     * added to the sum, and the host reads that share's fp32 gradient
     * through the pinned staging for an exact clipping norm */
    int g_dev = t->opt_frac[PLAN_GPU] > 0;
    if (g_dev && t->grads_on == PLAN_GPU)
        add(e, "gradient staging (2 blocks)", PLAN_GPU, PLAN_BUFFERS, 2 * sh.largest * wsz);
    /* ... and writes the new weights of a block it updates into a staging
     * block when they live off the GPU */
    if (g_dev && t->params_on != PLAN_GPU)
        add(e, "new-weights staging (1 block)", PLAN_GPU, PLAN_BUFFERS, t->zero >= 3 ? ceil_div(slot, dp) : slot);

    /* ---- optimizer state ---- */
    uint64_t o_elems = t->zero >= 1 ? ceil_div(sh.params, dp) : sh.params;
    uint64_t master = t->dtype == ZO_DTYPE_F32 ? 0 : 4; /* fp32 master copy */
    uint64_t per = master + (t->optimizer == PLAN_OPT_ADAMW ? 8 : 4);
    uint64_t o_bytes = o_elems * per;
    uint64_t o_gpu = frac_of(o_bytes, t->opt_frac[PLAN_GPU]);
    uint64_t o_nvme = frac_of(o_bytes, t->opt_frac[PLAN_NVME]);
    if (o_gpu + o_nvme > o_bytes) o_nvme = o_bytes - o_gpu;
    uint64_t o_cpu = o_bytes - o_gpu - o_nvme;
    const char *oname = t->optimizer == PLAN_OPT_ADAMW
                            ? (master ? "AdamW: fp32 master, m, v" : "AdamW: m, v")
                            : (master ? "SGD: fp32 master, momentum" : "SGD: momentum");
    add(e, oname, PLAN_GPU, PLAN_OPTIMIZER, o_gpu);
    add(e, oname, PLAN_CPU, PLAN_OPTIMIZER, o_cpu);
    add(e, oname, PLAN_NVME, PLAN_OPTIMIZER, o_nvme);
    if (o_nvme) {
        /* a sub-group never holds more than the NVMe share of the state */
        uint64_t nvme_elems = o_nvme / per;
        uint64_t sg = t->buf.sub_group < nvme_elems ? t->buf.sub_group : nvme_elems;
        add(e, "NVMe swap buffers (sub-groups)", PLAN_CPU, PLAN_BUFFERS,
            (uint64_t)t->buf.swap_buffers * sg * per);
    }
    /* with ZeRO-3 a rank reads and writes only its 1/DP partition of a block
     * through host memory (the rest arrives by all-gather) */
    uint64_t host_slot = t->zero >= 3 ? ceil_div(slot, dp) : slot;
    uint64_t largest_part = t->zero >= 3 ? ceil_div(sh.largest, dp) : sh.largest;
    if (t->params_on == PLAN_NVME)
        add(e, "fp16/bf16 weights read-ahead", PLAN_CPU, PLAN_BUFFERS,
            (uint64_t)(t->buf.prefetch_depth + 1) * host_slot);
    /* the runtime's pinned staging, one buffer a role: gradients on their
     * way to the host's fp32 sum (two blocks, when some optimizer state is
     * off the GPU); new weights on their way into a GPU-resident store (two
     * sub-group chunks) or to NVMe (one block); one block's fp32 gradient of
     * a GPU optimizer share for an exact clipping norm */
    uint64_t pinned = 0;
    /* (ZeRO 2-3 over several ranks: a block's reduced fp32 part) */
    uint64_t grad_half = t->zero >= 2 && dp > 1 ? largest_part_of(sh.largest, dp) * 4 : host_slot;
    if (t->opt_frac[PLAN_GPU] < 1.0 || t->grads_on != PLAN_GPU) pinned += 2 * grad_half;
    if (t->params_on == PLAN_GPU) {
        uint64_t chunk = t->buf.sub_group && t->buf.sub_group < largest_part ? t->buf.sub_group : largest_part;
        pinned += 2 * chunk * wsz;
    } else if (t->params_on == PLAN_NVME) {
        pinned += host_slot;
    }
    if (g_dev) pinned += (t->zero >= 1 ? largest_part_of(sh.largest, dp) : sh.largest) * 4; /* the optimizer's part */
    if (t->buf.pinned_staging) pinned = t->buf.pinned_staging;
    add(e, "pinned staging", PLAN_CPU, PLAN_BUFFERS, pinned);

    /* ---- activations ---- */
    e->activations_known = !m->params_override;
    if (e->activations_known) {
        uint64_t s = (uint64_t)t->seq, b = (uint64_t)t->micro_batch, h = (uint64_t)m->hidden;
        uint64_t tp = (uint64_t)t->tp, act = wsz;
        uint64_t sp_div = t->sp ? tp : 1;
        uint64_t full = plan_layer_act_bytes(m, t, 1);
        uint64_t stored = t->recompute == PLAN_RECOMPUTE_NONE        ? full
                          : t->recompute == PLAN_RECOMPUTE_SELECTIVE ? plan_layer_act_bytes(m, t, 0)
                                                                     : ceil_div(s * b * h * act, sp_div);
        e->act_layer = stored;
        /* micro-batches in flight: 1F1B keeps p on the first stage, one fewer
         * on each later one; interleaving adds (p-1)/(p m) of the pipeline */
        double inflight = (double)(t->pp - stage);
        if (t->vpp > 1 && stage == 0) inflight = t->pp * (1.0 + (t->pp - 1.0) / (t->pp * (double)t->vpp));
        if (inflight > t->grad_accum) inflight = t->grad_accum;
        if (inflight < 1) inflight = 1;
        e->inflight = inflight;
        uint64_t layers_bytes = (uint64_t)llround((double)stored * sh.layers * inflight);
        plan_tier ck = t->checkpoints_on;
        if (ck == PLAN_CPU) {
            /* pinned host copies; two layers' worth stay on the GPU in flight */
            add(e, "stored layer activations", PLAN_CPU, PLAN_ACTIVATIONS, layers_bytes);
            add(e, "activation offload slots (2 layers)", PLAN_GPU, PLAN_ACTIVATIONS, 2 * stored);
        } else {
            add(e, "stored layer activations", PLAN_GPU, PLAN_ACTIVATIONS, layers_bytes);
        }
        if (t->recompute == PLAN_RECOMPUTE_FULL)
            add(e, "recompute working set (1 layer)", PLAN_GPU, PLAN_ACTIVATIONS, full);
        else if (t->recompute == PLAN_RECOMPUTE_SELECTIVE)
            add(e, "recompute working set (attention core)", PLAN_GPU, PLAN_ACTIVATIONS,
                full - plan_layer_act_bytes(m, t, 0));
        if (sh.first && t->dropout)
            add(e, "embedding dropout mask", PLAN_GPU, PLAN_ACTIVATIONS,
                (uint64_t)llround((double)ceil_div(s * b * h, sp_div) * inflight));
        if (sh.last) {
            /* final norm input and output-layer input (16-bit); logits in
             * fp32 for the cross-entropy (its gradient is written in place) */
            add(e, "final norm + output layer inputs", PLAN_GPU, PLAN_ACTIVATIONS,
                2 * ceil_div(s * b * h * act, sp_div));
            add(e, "logits (fp32, cross-entropy)", PLAN_GPU, PLAN_ACTIVATIONS,
                ceil_div(4 * s * b * (uint64_t)m->vocab, tp));
        }
        /* backward of one layer at a time: the fp32 gradients of the
         * residual, a norm output, qkv, the attention output and the MLP
         * (two for SwiGLU), one projection scratch in the activation dtype,
         * and the token ids, targets and per-token losses */
        uint64_t q = (uint64_t)m->n_heads * (uint64_t)m->head_dim;
        uint64_t kv = (uint64_t)m->n_kv_heads * (uint64_t)m->head_dim;
        uint64_t mlp = (uint64_t)m->ffn * (m->arch == ZO_ARCH_GPT ? 1 : 2);
        uint64_t dgrad = 4 * s * b * (2 * h + ceil_div(2 * q + 2 * kv + mlp, tp));
        add(e, "backward working set (fp32 activation gradients, scratch)", PLAN_GPU,
            PLAN_ACTIVATIONS, dgrad + s * b * h * act + 12 * s * b);
    }

    /* ---- working buffers on the GPU ---- */
    add(e, "CUDA context", PLAN_GPU, PLAN_BUFFERS, t->buf.cuda_context);
    add(e, "cuBLAS workspace", PLAN_GPU, PLAN_BUFFERS, t->buf.cublas_workspace);
    /* the runtime reduces in fp32, through buckets of comm_bucket elements
     * (rounded down to a multiple of DP), at most the largest block padded */
    if (t->dp > 1) {
        uint64_t cap = t->buf.comm_bucket / dp * dp, whole = ceil_div(sh.largest, dp) * dp;
        if (!cap) cap = dp;
        add(e, "communication buckets (fp32)", PLAN_GPU, PLAN_BUFFERS,
            (uint64_t)t->buf.comm_buckets * (cap < whole ? cap : whole) * 4);
    }
    uint64_t gpu_sum = 0;
    for (int k = 0; k < PLAN_KINDS; k++) gpu_sum += e->bytes[PLAN_GPU][k];
    add(e, "allocator fragmentation allowance", PLAN_GPU, PLAN_BUFFERS,
        frac_of(gpu_sum, t->buf.fragmentation));

    e->fits = 1;
    for (int tier = 0; tier < PLAN_TIERS; tier++) {
        for (int k = 0; k < PLAN_KINDS; k++) e->total[tier] += e->bytes[tier][k];
        if (e->total[tier] > e->capacity[tier]) e->fits = 0;
    }
    return ZO_OK;
}

void plan_estimate_unchecked(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                             plan_estimate *out)
{
    estimate_stage(m, hw, t, 0, out);
    if (t->pp > 1) {
        plan_estimate last;
        estimate_stage(m, hw, t, t->pp - 1, &last);
        if (last.total[PLAN_GPU] > out->total[PLAN_GPU]) *out = last;
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
