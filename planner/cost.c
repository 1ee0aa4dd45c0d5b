#include "cost.h"

#include <math.h>
#include <string.h>

#include "common/adam_math.h" /* defines: zo_host_teams */

/* Standard attention's core (the batched QK^T and PV matmuls, their inner
 * dimension a head's, and the masked softmax and dropout over the s^2 scores)
 * takes this much longer than its roofline: Korthikanti et al. 2022, Table 4,
 * selective recompute adds the core's forward to the 22B layer, 20.9 - 19.6 =
 * 1.3 ms, where the roofline gives 1.036 ms. */
#define ATTN_CORE_SLOW 1.255
/* Flash attention reaches this fraction of the matmul curve (its softmax and
 * masking run between the two matmuls); its backward does 2.5x the forward
 * FLOPs (it recomputes the scores). Causal masking skips half the tiles. */
#define FLASH_REL_EFF 0.75
#define FLASH_BWD 2.5
#define FLASH_CAUSAL 0.5
/* 8-bit AdamW's kernel a thread against the fp32 one's, in parameters a
 * second: 0.856 (bench_cpu_adam, auto, 2 threads, docs/performance.md
 * "cpu_adam state encodings"); bf16 ran at its memory roof (1.36x fp32). */
#define PLAN_ADAM_8BIT_COMPUTE 0.856

static double dmax(double a, double b) { return a > b ? a : b; }
static double dmin(double a, double b) { return a < b ? a : b; }

double plan_allreduce_s(double bytes, int p, double bw, double lat)
{
    if (p <= 1 || bytes <= 0) return 0;
    /* ring: reduce-scatter then all-gather, 2(p-1) steps of bytes/p */
    double ring = 2.0 * (p - 1) / p * bytes / bw + 2.0 * (p - 1) * lat;
    /* (double binary) tree: pipelined up and down, 2 log2(p) steps */
    double tree = 2.0 * bytes / bw + 2.0 * ceil(log2((double)p)) * lat;
    return ring < tree ? ring : tree;
}

double plan_allgather_s(double bytes, int p, double bw, double lat)
{
    if (p <= 1 || bytes <= 0) return 0;
    return (double)(p - 1) / p * bytes / bw + (p - 1) * lat;
}

/* ---- one layer ------------------------------------------------------------------ */

typedef struct ctx {
    const plan_hw *hw;
    double peak;    /* FLOP/s of the dtype */
    double hbm;     /* achieved bytes/s */
    double esz;     /* bytes per activation element */
    int frozen;     /* LoRA: the weights are frozen, the backward computes no weight gradients */
    const plan_kernels *k; /* this runtime's kernels measured on the GPU (plan_hw_kernels); NULL:
                              FlashAttention at FLASH_REL_EFF, elementwise work at hbm_eff */
} ctx;

/* One matmul (M x K) @ (K x N): a roofline of compute at the size's
 * efficiency and the bytes of its three operands. */
static double gemm(const ctx *c, double M, double N, double K)
{
    double f = 2 * M * N * K;
    double tc = f / (c->peak * plan_hw_gemm_eff(c->hw, f));
    double tm = c->esz * (M * K + K * N + M * N) / c->hbm;
    return dmax(tc, tm);
}

/* A batch of `n` matmuls of one shape: efficiency by the whole batch's
 * FLOPs, bytes of every operand. */
static double bmm(const ctx *c, double n, double M, double N, double K)
{
    double f = 2 * M * N * K * n;
    double tc = f / (c->peak * plan_hw_gemm_eff(c->hw, f));
    double tm = c->esz * n * (M * K + K * N + M * N) / c->hbm;
    return dmax(tc, tm);
}

static double ew(const ctx *c, double bytes) { return bytes / c->hbm; }

/* How a collective crosses nodes: a ring (all-reduce, reduce-scatter,
 * all-gather) laid one per rail uses the NIC of every member a node has, an
 * all-to-all sends each rank's bytes through its own. */
typedef enum coll_kind { COLL_RING = 0, COLL_ALLTOALL } coll_kind;

/* A link for a group of p ranks `stride` apart (Megatron's order: TP
 * innermost, then DP, then PP): NVLink when the group stays in a node.
 * Across nodes NCCL lays one ring per NIC, so a ring collective's bus
 * bandwidth is the NICs of the group's members in a node together, up to
 * NVLink's (nccl-tests#119: 4 HDR NICs for 8 A100s, all-reduce busbw 85-96
 * GB/s of the NICs' 100; NVIDIA/nccl#412: "up to 160 GB/s, the NVLink
 * intra-node bandwidth", with more NICs): g members a node, g x net_bw. */
static void link_for(const plan_hw *hw, int p, long stride, coll_kind kind, double *bw, double *lat)
{
    double peer = plan_hw_peer_bw(hw);
    if ((long)p * stride <= hw->gpus_per_node) {
        *bw = peer * hw->coll_eff;
        *lat = hw->nvlink_lat;
        return;
    }
    long g = stride < hw->gpus_per_node ? hw->gpus_per_node / stride : 1;
    if (g > p) g = p;
    double b = kind == COLL_RING ? (double)g * hw->net_bw : hw->net_bw;
    *bw = (b < peer ? b : peer) * hw->coll_eff;
    *lat = hw->net_lat;
}

typedef struct layer_time {
    double fwd, bwd, rc;        /* compute */
    double tp_fwd, tp_bwd, tp_rc;
    double ep_fwd, ep_bwd, ep_rc; /* expert-parallel all-to-alls */
    double ep_bytes_fwd, ep_bytes_bwd, ep_bytes_rc; /* their bytes sent to other ranks */
    double ep_rc_one, ep_bytes_rc_one; /* a full recompute's all-to-alls (the dispatch: counts, rows,
                                        * weights) and their bytes */
    double ops[PLAN_OPS];       /* fwd + bwd compute by kind of op (recompute not included) */
    double flops_token;         /* model fwd FLOPs per token (whole layer, all TP ranks) */
    double attn_flops_token;    /* the attention core's share */
    double ops_flops_token;     /* recompute ops: the recomputed matmuls' (o; LLaMA's up) */
} layer_time;

/* A layer's matmuls as they add up: forward and backward seconds, the
 * weights a token meets (for the model's FLOPs), and the elements of their
 * outputs (each one's gradient is rounded to 16 bits in the backward). */
typedef struct layer_mm {
    double f, b, wparams, outs;
} layer_mm;

/* One matmul (M x K) @ (K x N) forward; its backward is the input gradient
 * (M x N)(N x K) and the weight gradient (K x M)(M x N). */
static void mm(const ctx *c, double M, double N, double K, layer_mm *a)
{
    a->f += gemm(c, M, N, K);
    a->b += gemm(c, M, K, N) + (c->frozen ? 0 : gemm(c, K, N, M));
    a->outs += M * N;
}

/* The same for `n` matmuls of one shape run as one grouped kernel (the
 * experts of an MoE layer). */
static void mm_n(const ctx *c, double n, double M, double N, double K, layer_mm *a)
{
    a->f += bmm(c, n, M, N, K);
    a->b += bmm(c, n, M, K, N) + (c->frozen ? 0 : bmm(c, n, K, N, M));
    a->outs += n * M * N;
}

void plan_ep_layer_bytes(const zo_model_config *m, const plan_train *t, double *fwd, double *bwd, double *rc)
{
    *fwd = *bwd = *rc = 0;
    if (t->ep <= 1 || !m->moe.experts) return;
    double p = t->ep, h = m->hidden, e = zo_dtype_size(t->dtype);
    double T = (double)t->seq * t->micro_batch;
    double remote = T * plan_routed_rows(m, t) * (p - 1) / p; /* pairs at other ranks' experts */
    double counts = (p - 1) * ((double)m->moe.experts / p) * 4;
    *fwd = counts + remote * (h * e + 4 + h * e);
    *bwd = remote * (h * 4 + h * 4 + 4);
    *rc = counts + remote * (h * e + 4);
}

/* One GEMM of a LoRA adapter on this runtime's kernels: one dimension is
 * r, so it is memory-bound; `bytes` it moves at the measured fraction of
 * HBM, or its FLOPs on the curve when those take longer. */
static double lora_gemm(const ctx *c, double M, double N, double K, double bytes)
{
    double f = 2 * M * N * K;
    return dmax(f / (c->peak * plan_hw_gemm_eff(c->hw, f)), bytes / (c->hw->hbm_bw * c->k->lora_eff));
}

/* LoRA adapters of one layer on one rank (T rows): per adapted layer
 * u = x A^T and y += (alpha/r) u B^T forward; du = dy B, dB += dy^T u,
 * dA += du^T x and dx += du A backward; a routed expert's over the rows
 * routed to it (its share of T x top_k). On this runtime's kernels (c->k)
 * each is timed by the bytes it moves: x read (16-bit) for u and dA, y read
 * and written (16-bit) for the forward's sum, the backward's 16-bit dy read
 * for du and dB, and the fp32 dx read and written. QLoRA dequantizes each
 * linear weight before its GEMM, in the forward and again in the backward
 * (*qf, *qb): bytes at HBM speed, or this runtime's measured rate in
 * parameters a second. */
static void adapters_time(const zo_model_config *m, const plan_train *t, const ctx *c, double T, int moe,
                          double *f, double *b, double *qf, double *qb)
{
    double r = t->lora.r, tp = t->tp;
    plan_peft_module mods[PLAN_PEFT_MAX_MODULES];
    /* (an MoE layer's, or a dense one's: DeepSeek's first layers) */
    int n = plan_peft_modules(m, moe ? m->n_layers - 1 : 0, t->lora.targets, t->ep, mods);
    for (int i = 0; i < n; i++) {
        double in = (double)mods[i].in / (mods[i].row ? tp : 1);
        double out = (double)mods[i].out / (mods[i].row ? 1 : tp);
        double k = (double)mods[i].count;
        double rows = mods[i].expert ? T * plan_routed_rows(m, t) / k : T;
        if (c->k) {
            double e = c->esz, x = rows * in * e, y = rows * out * e;
            *f += k * (lora_gemm(c, rows, r, in, x) + lora_gemm(c, rows, out, r, 2 * y));
            *b += k * (lora_gemm(c, rows, r, out, y) + lora_gemm(c, out, r, rows, y) +
                       lora_gemm(c, r, in, rows, x) + lora_gemm(c, rows, in, r, rows * in * 8));
            continue;
        }
        *f += k * (gemm(c, rows, r, in) + gemm(c, rows, out, r));
        *b += k * (gemm(c, rows, r, out) + gemm(c, out, r, rows) + gemm(c, r, in, rows) +
                   gemm(c, rows, in, r));
    }
    if (t->method == ZO_PLAN_QLORA) {
        plan_peft pf;
        plan_peft_stage(m, t, 0, &pf);
        double dq = c->k ? (double)pf.layer_linear / c->k->nf4_rate
                         : ew(c, (double)pf.layer_nf4 + (double)pf.layer_linear * c->esz);
        *qf += dq;
        *qb += dq;
    }
}

/* The adapter parameters a token passes through, for the model's FLOPs:
 * over every layer (each its own kind's modules: DeepSeek's dense first
 * layers), each adapted module's r (in + out) times its count, a routed
 * expert's times the experts a token passes (top_k). */
static double lora_active(const zo_model_config *m, const plan_train *t)
{
    plan_peft_module mods[PLAN_PEFT_MAX_MODULES];
    double total = 0, r = t->lora.r;
    /* the dense layers (all, or DeepSeek's first ones) and the MoE layers */
    int n_moe = zo_model_moe_layers(m);
    for (int moe = 0; moe < 2; moe++) {
        int layers = moe ? n_moe : m->n_layers - n_moe;
        if (!layers) continue;
        int n = plan_peft_modules(m, moe ? m->n_layers - 1 : 0, t->lora.targets, 1, mods);
        for (int i = 0; i < n; i++)
            total += (double)layers * (mods[i].expert ? (double)mods[i].routed : (double)mods[i].count) * r *
                     (double)(mods[i].in + mods[i].out);
    }
    return total;
}

/* What recompute by op runs again of the adapters a token passes through,
 * over every layer (dense: ops takes no MoE layer): each adapter's A (its
 * x A, which the runtime rebuilds rather than keeps) and the B of the
 * adapters whose base GEMM reruns (o; LLaMA's up, half of Phi-3's fused
 * gate_up); r in (+ r out) per layer, module by module. */
static double lora_rebuilt(const zo_model_config *m, const plan_train *t)
{
    zo_lora_module mods[ZO_LORA_MAX_MODULES];
    int n = zo_lora_layer_modules_at(m, 0, t->lora.targets, mods), gpt = m->arch == ZO_ARCH_GPT;
    double total = 0, r = t->lora.r;
    for (int i = 0; i < n; i++) {
        unsigned tg = mods[i].targets;
        double out = (double)mods[i].out;
        double rerun = tg & ZO_LORA_O ? out : gpt || !(tg & ZO_LORA_UP) ? 0 : tg & ZO_LORA_GATE ? out / 2 : out;
        total += r * ((double)mods[i].in + rerun);
    }
    return total * m->n_layers;
}

/* The attention projections: column-parallel in, row-parallel out; MLA's
 * down projections are whole on every rank. T rows; q, k, v, ow the
 * attention widths (zo_model_attn_widths). */
static void attn_proj_time(const zo_model_config *m, const plan_train *t, const ctx *c, double T,
                           double q, double k, double v, double ow, layer_mm *a)
{
    double h = m->hidden, tp = t->tp;
    if (m->mla.kv_rank) {
        const zo_mla *x = &m->mla;
        double qr = x->q_rank, kr = x->kv_rank, kvb = (double)m->n_heads * (x->qk_nope + x->v_dim);
        if (x->q_rank) {
            mm(c, T, qr, h, a);
            mm(c, T, q / tp, qr, a);
            a->wparams += h * qr + qr * q;
        } else {
            mm(c, T, q / tp, h, a);
            a->wparams += h * q;
        }
        mm(c, T, kr + x->qk_rope, h, a);
        mm(c, T, kvb / tp, kr, a);
        a->wparams += h * (kr + x->qk_rope) + kr * kvb;
    } else {
        mm(c, T, (q + k + v) / tp, h, a);
        a->wparams += h * (q + k + v);
    }
    mm(c, T, h, ow / tp, a);
    a->wparams += ow * h;
}

/* An MoE layer's MLP: a router, its experts over the routed rows that reach
 * this rank (EP spreads the experts, each rank receives top_k rows per token
 * on average: dropless, balanced; a capacity factor bounds it, plan_routed_rows) as grouped
 * GEMMs, and the shared expert over every token. Returns the bytes of its
 * elementwise kernels; sets the expert-parallel all-to-alls. */
static double moe_time(const zo_model_config *m, const plan_train *t, const ctx *c, double T,
                       layer_mm *a, layer_time *o)
{
    const zo_moe *x = &m->moe;
    double h = m->hidden, tp = t->tp, e = c->esz;
    int n_in = m->arch == ZO_ARCH_GPT ? 1 : 2;
    double R = T * plan_routed_rows(m, t);       /* rows at this rank's experts */
    double local = (double)x->experts / t->ep;   /* experts on this rank */
    double fe = x->expert_ffn;
    mm(c, T, x->experts, h, a);       /* router, on every TP rank */
    for (int i = 0; i < n_in; i++) mm_n(c, local, R / local, fe / tp, h, a);
    mm_n(c, local, R / local, h, fe / tp, a);
    a->wparams += h * x->experts + (n_in + 1) * h * fe * x->top_k;
    if (x->shared_ffn) {
        for (int i = 0; i < n_in; i++) mm(c, T, x->shared_ffn / tp, h, a);
        mm(c, T, h, x->shared_ffn / tp, a);
        a->wparams += (n_in + 1) * h * x->shared_ffn;
    }
    /* expert parallelism: each token's rows go to the experts' ranks and
     * come back (dispatch and combine), in every pass: two all-to-alls'
     * latencies and the bytes plan_ep_layer_bytes counts */
    if (t->ep > 1) {
        double bw, lat;
        link_for(c->hw, t->ep, t->tp, COLL_ALLTOALL, &bw, &lat);
        plan_ep_layer_bytes(m, t, &o->ep_bytes_fwd, &o->ep_bytes_bwd, &o->ep_bytes_rc_one);
        double a2a_lat = (t->ep - 1) * lat; /* one all-to-all: a step per peer */
        o->ep_fwd = 2 * a2a_lat + o->ep_bytes_fwd / bw;
        o->ep_bwd = 2 * a2a_lat + o->ep_bytes_bwd / bw;
        o->ep_rc_one = a2a_lat + o->ep_bytes_rc_one / bw; /* (a recompute: the dispatch alone) */
    }
    /* router softmax / top-k (fp32), tokens permuted to the experts and
     * back (read + write each way), the gated activation of the experts
     * and of the shared expert, the weighted sum of the expert outputs */
    return T * x->experts * 4 * 2 + 2 * 2 * R * h * e + R * 3 * e * fe / tp +
           T * 3 * e * x->shared_ffn / tp + R * h * e * 2;
}

/* A dense MLP: GPT fc1 (or LLaMA gate and up) then fc2 (down). Returns the
 * bytes of its elementwise kernels. */
static double mlp_time(const zo_model_config *m, const plan_train *t, const ctx *c, double T,
                       layer_mm *a)
{
    double h = m->hidden, f = m->ffn, tp = t->tp, e = c->esz;
    int gpt = m->arch == ZO_ARCH_GPT, n_in = gpt ? 1 : 2;
    for (int i = 0; i < n_in; i++) mm(c, T, f / tp, h, a);
    mm(c, T, h, f / tp, a);
    a->wparams += (n_in + 1) * h * f;
    if (gpt) /* bias + GeLU over the ffn columns of this rank */
        return T * 2 * e * f / tp;
    return T * 3 * e * f / tp; /* SwiGLU (gate, up -> out) */
}

/* The attention core of one rank (`heads` of them, head widths dqk and
 * dv) on `path` (one of this runtime's kernels where it runs the plan with
 * its measured rates, c->k; else ZO_ATTN_AUTO: the model's FlashAttention
 * or standard attention): forward, backward and what selective recompute
 * recomputes. */
static void attn_core_time(const plan_train *t, const ctx *c, double heads, double dqk, double dv,
                           zo_attn_path path, double *f, double *b, double *rc)
{
    double s = t->seq, mb = t->micro_batch;
    if (t->flash_attn && c->k && path != ZO_ATTN_AUTO) {
        /* this runtime's kernels at their measured rates: the tensor-core and
         * mma.sync kernels and the flash kernel at a FLOP rate (the fused
         * ones for the head size); the GEMM path at its rate at head dim
         * 128, where the score elements' kernels take most of the time:
         * another head size keeps their time and moves the GEMMs' on the
         * curve (extrapolated: only d 128 was measured) */
        double fl = 2 * s * s * (dqk + dv) * mb * heads * FLASH_CAUSAL;
        *rc = 0;
        if (path == ZO_ATTN_MMA || path == ZO_ATTN_TC) {
            const double *fr = path == ZO_ATTN_MMA ? c->k->attn_mma_fwd : c->k->attn_tc_fwd;
            const double *br = path == ZO_ATTN_MMA ? c->k->attn_mma_bwd : c->k->attn_tc_bwd;
            *f = fl / fr[dqk > 64];
            *b = FLASH_BWD * fl / br[dqk > 64];
            return;
        }
        if (path == ZO_ATTN_FLASH) {
            *f = fl / c->k->attn_flash_fwd;
            *b = FLASH_BWD * fl / c->k->attn_flash_bwd;
            return;
        }
        double fl128 = 2 * s * s * 256 * mb * heads * FLASH_CAUSAL, top = c->peak * c->hw->gemm_eff_max;
        *f = dmax(fl128 / c->k->attn_gemm_fwd - fl128 / top, 0) + fl / (c->peak * plan_hw_gemm_eff(c->hw, fl));
        double bl = FLASH_BWD * fl, bl128 = FLASH_BWD * fl128;
        *b = dmax(bl128 / c->k->attn_gemm_bwd - bl128 / top, 0) + bl / (c->peak * plan_hw_gemm_eff(c->hw, bl));
        return;
    }
    if (t->flash_attn) {
        double fl = 2 * s * s * (dqk + dv) * mb * heads * FLASH_CAUSAL;
        double eff = plan_hw_gemm_eff(c->hw, fl) * FLASH_REL_EFF;
        *f = fl / (c->peak * eff);
        *b = FLASH_BWD * *f;
        *rc = 0; /* flash already recomputes the scores in its backward */
        return;
    }
    double e = c->esz, drop = t->dropout ? 1 : 0; /* mask bytes per element */
    double n = mb * heads, sc = n * s * s;        /* score elements per rank */
    double core = ATTN_CORE_SLOW * (bmm(c, n, s, s, dqk) + bmm(c, n, s, dv, s));
    double soft = ATTN_CORE_SLOW * ew(c, sc * (2 * e + (t->dropout ? 2 * e + drop : 0)));
    *f = core + soft;
    *b = 2 * core + 2 * soft;
    *rc = *f;
}

/* The layer's elementwise kernels: the bytes their forward reads and
 * writes (per row: norms, residual adds, rotary and q/k norms; the MLP's
 * `mlp_ew` bytes). */
static double elementwise_bytes(const zo_model_config *m, const plan_train *t, const ctx *c,
                                double T, double q, double k, double mlp_ew)
{
    double h = m->hidden, tp = t->tp, e = c->esz;
    double Tsp = t->sp ? T / tp : T; /* rows of the sequence-parallel regions */
    int gpt = m->arch == ZO_ARCH_GPT;
    double drop = t->dropout ? 1 : 0;
    double norms = m->layer_norms ? m->layer_norms : 2;
    double row;
    if (gpt) /* LayerNorms (4h), 2 bias-dropout-residual adds (6h + mask) */
        row = norms * 2 * e * h + 2 * (3 * e * h + drop * h);
    else /* RMSNorms, 2 residual adds */
        row = norms * 2 * e * h + 2 * 3 * e * h;
    double bytes = Tsp * row + mlp_ew;
    if (m->pos == ZO_POS_ROTARY || (!gpt && m->pos == ZO_POS_ARCH)) /* rotary on q and k */
        bytes += T * 2 * e * (q + k) / tp;
    if (m->qk_norm) bytes += T * 2 * e * (q + k) / tp;
    return bytes;
}

/* The elementwise kernels' forward and backward seconds from the forward's
 * bytes: the backward moves twice them; on this runtime's kernels (c->k),
 * at their measured fraction of HBM, and with 16-bit weights it also
 * rounds each linear layer's fp32 output gradient to the GEMMs' 16-bit
 * operand (gemm_operand in transformer/transformer.c: fp32 read, 16-bit
 * written), over `outs` columns a row. */
static void elementwise_time(const ctx *c, double T, double bytes, double outs, double *f, double *b)
{
    if (!c->k) {
        *f = ew(c, bytes);
        *b = 2 * *f;
        return;
    }
    double bw = c->hw->hbm_bw * c->k->ew_eff;
    double casts = c->esz == 2 ? T * outs * (4 + c->esz) : 0;
    *f = bytes / bw;
    *b = (2 * bytes + casts) / bw;
}

/* Tensor-parallel collectives, two sub-blocks (attention, MLP) per layer:
 * without SP an all-reduce of the sub-block's output in each pass; with SP
 * an all-gather and a reduce-scatter in its place, and in the backward also
 * the re-gather of the input the weight gradient needs. */
static void tp_time(const zo_model_config *m, const plan_train *t, const ctx *c, double T,
                    layer_time *o)
{
    if (t->tp <= 1) return;
    double bw, lat;
    link_for(c->hw, t->tp, 1, COLL_RING, &bw, &lat);
    double N = T * m->hidden * c->esz;
    double ag = plan_allgather_s(N, t->tp, bw, lat);
    o->tp_fwd = 2 * (t->sp ? 2 * ag : plan_allreduce_s(N, t->tp, bw, lat));
    o->tp_bwd = 2 * (t->sp ? 3 * ag : plan_allreduce_s(N, t->tp, bw, lat));
}

/* The share of causal attention's score elements a sliding window of w
 * keys leaves over s (every query row sees min(i + 1, w) keys): what the
 * tensor-core kernels compute of a windowed layer, skipping the key tiles
 * outside every row's window. 1 for a window that masks nothing. */
static double attn_window_work(int w, double s)
{
    if (!zo_attn_window_masks(w, (int)s)) return 1.0;
    return (2.0 * w * s - (double)w * w) / (s * s);
}

/* Which of this runtime's attention kernels computes a layer with a window
 * of w keys (0: none): memory.h's plan_attn_path, the rule memplan's GPU
 * memory counts the same layers' scratch by. */
static zo_attn_path layer_attn_path(const zo_model_config *m, const plan_train *t, const ctx *c, int d, int w)
{
    return plan_attn_path(m, t, c->esz == 2, d, w);
}

enum { ATTN_PATHS = ZO_ATTN_MMA + 1 };

/* The share of m's layers on each attention path at this sequence length
 * (share[p]), layer by layer (Gemma-2's and -3's windowed layers may take
 * another path than their global ones; a window no shorter than the
 * sequence masks nothing and counts as none: zo_attn_window_masks), and
 * their work (work[p]): causal attention's, summed and divided by the
 * layers, each windowed layer on the tensor-core or mma.sync kernels at the
 * share its window leaves (attn_window_work: they skip the key tiles
 * outside every row's window; the GEMM path and the flash kernel, which
 * skip such blocks too, at the whole causal work). Without this
 * runtime's kernels (c->k) or with standard attention, every layer on
 * ZO_ATTN_AUTO (attn_core_time's models). Latent attention's q/k and v head
 * dims differ, which neither fused kernel takes. */
static void attn_path_shares(const zo_model_config *m, const plan_train *t, const ctx *c, double dqk, double dv,
                             double share[ATTN_PATHS], double work[ATTN_PATHS])
{
    for (int p = 0; p < ATTN_PATHS; p++) share[p] = work[p] = 0;
    if (!t->flash_attn || !c->k) {
        share[ZO_ATTN_AUTO] = work[ZO_ATTN_AUTO] = 1;
        return;
    }
    const int d = dqk == dv ? (int)dqk : 0;
    int n[ATTN_PATHS] = {0}, win[ZO_MODEL_WINDOWS], layers[ZO_MODEL_WINDOWS];
    const int nw = zo_model_windows(m, 0, m->n_layers, win, layers);
    for (int i = 0; i < nw; i++) {
        const int w = win[i], masks = zo_attn_window_masks(w, t->seq);
        const zo_attn_path p = layer_attn_path(m, t, c, d, masks ? w : 0);
        n[p] += layers[i];
        work[p] += layers[i] * (p == ZO_ATTN_TC || p == ZO_ATTN_MMA ? attn_window_work(w, t->seq) : 1.0);
    }
    for (int p = 0; p < ATTN_PATHS; p++) {
        share[p] = (double)n[p] / m->n_layers;
        work[p] /= m->n_layers;
    }
}

/* One layer (dense, or with `moe` an MoE layer) on one rank, one micro-batch. */
static void layer_time_of(const zo_model_config *m, const plan_train *t, const ctx *c, int moe,
                          layer_time *o)
{
    memset(o, 0, sizeof *o);
    double s = t->seq, T = s * t->micro_batch;
    uint64_t uq, uk, uv, uo;
    zo_model_attn_widths(m, &uq, &uk, &uv, &uo);
    double q = (double)uq, k = (double)uk, v = (double)uv, ow = (double)uo;
    double heads = m->n_heads / (double)t->tp; /* per rank */
    double dqk = q / m->n_heads, dv = v / (m->mla.kv_rank ? m->n_heads : m->n_kv_heads);
    layer_mm a = {0, 0, 0, 0};
    attn_proj_time(m, t, c, T, q, k, v, ow, &a);
    double mlp_ew = moe ? moe_time(m, t, c, T, &a, o) : mlp_time(m, t, c, T, &a);
    o->flops_token = 2 * a.wparams + 2 * s * (dqk + dv) * m->n_heads;
    o->attn_flops_token = 2 * s * (dqk + dv) * m->n_heads;
    double attn_f, attn_b, attn_rc, ew_f, ew_b, lf = 0, lb = 0, qf = 0, qb = 0;
    /* (this runtime runs latent attention's values padded to the q/k heads:
     * its core at qk_nope + qk_rope for both; the model's FLOPs above stay
     * the model's) */
    if (m->mla.kv_rank && t->runtime == PLAN_RUNTIME_ZOFFLOAD) dv = dqk;
    /* the mean over the layers of each path's time at its layers' work */
    double share[ATTN_PATHS], work[ATTN_PATHS];
    attn_path_shares(m, t, c, dqk, dv, share, work);
    attn_f = attn_b = attn_rc = 0;
    for (int p = 0; p < ATTN_PATHS; p++) {
        if (share[p] <= 0) continue;
        double pf, pb, prc;
        attn_core_time(t, c, heads, dqk, dv, (zo_attn_path)p, &pf, &pb, &prc);
        attn_f += work[p] * pf;
        attn_b += work[p] * pb;
        attn_rc += share[p] * prc;
    }
    elementwise_time(c, T, elementwise_bytes(m, t, c, T, q, k, mlp_ew), a.outs / T, &ew_f, &ew_b);
    if (c->frozen) adapters_time(m, t, c, T, moe, &lf, &lb, &qf, &qb);
    o->fwd = a.f + attn_f + ew_f + lf + qf;
    o->bwd = a.b + attn_b + ew_b + lb + qb;
    o->ops[PLAN_OP_GEMM] = a.f + a.b;
    o->ops[PLAN_OP_ATTN_FWD] = attn_f;
    o->ops[PLAN_OP_ATTN_BWD] = attn_b;
    o->ops[PLAN_OP_EW] = ew_f + ew_b;
    o->ops[PLAN_OP_LORA] = lf + lb;
    o->ops[PLAN_OP_NF4] = qf + qb;
    tp_time(m, t, c, T, o);
    if (t->recompute == ZO_PLAN_RECOMPUTE_FULL) {
        o->rc = o->fwd;
        o->tp_rc = o->tp_fwd;
        o->ep_rc = o->ep_rc_one;
        o->ep_bytes_rc = o->ep_bytes_rc_one;
    } else if (t->recompute == ZO_PLAN_RECOMPUTE_SELECTIVE) {
        o->rc = attn_rc;
    } else if (t->recompute == ZO_PLAN_RECOMPUTE_OPS) {
        /* the other matmuls whose outputs the backward reads, as the runtime
         * recomputes them (LLaMA: o, up; GPT: o; the last, down or fc2, has an
         * output no backward reads), the elementwise kernels, and the attention
         * output's TP reduction; the attention core and the kept matmuls (the
         * fused qkv, fc1 or gate) come from what was saved */
        double h = m->hidden, tp = t->tp, f = m->ffn;
        int gpt = m->arch == ZO_ARCH_GPT;
        double mm_rc = gemm(c, T, h, ow / tp) + (gpt ? 0 : gemm(c, T, f / tp, h));
        o->rc = mm_rc + ew_f;
        /* LoRA: every adapter's x A rebuilt (the runtime keeps none) and
         * the B of those whose base GEMM reruns: the adapters' forward (the
         * B of the kept GEMMs' adapters counted too, r / out of their
         * GEMMs); QLoRA: the weights of the GEMMs rerun dequantized again,
         * their share of the layer's linear weights */
        if (c->frozen) o->rc += lf + qf * (ow * h + (gpt ? 0 : f * h)) / a.wparams;
        o->tp_rc = o->tp_fwd / 2;
        o->ops_flops_token = 2 * (ow * h + (gpt ? 0 : f * h));
    }
}

/* A model known only by its size: 6N FLOPs per token at the curve's top. */
static void size_only_time(const zo_model_config *m, const plan_train *t, const ctx *c,
                           plan_time_mb *out)
{
    double n = (double)m->params_override, T = (double)t->seq * t->micro_batch;
    double f = 2 * n * T / ((double)t->tp * t->pp);
    double tf = f / (c->peak * c->hw->gemm_eff_max);
    out->fwd = tf;
    out->bwd = 2 * tf;
    out->rc = t->recompute == ZO_PLAN_RECOMPUTE_FULL ? tf : 0;
    out->total = out->fwd + out->bwd + out->rc;
    out->model_flops_token = 6 * n;
    out->rc_flops_token = t->recompute == ZO_PLAN_RECOMPUTE_FULL ? 2 * n : 0;
    out->layer_compute = out->total;
}

/* What the ends of the pipeline add to a micro-batch: the first stage's
 * embedding lookup (+ dropout; with TP the vocabulary-parallel embedding is
 * all-reduced, reduce-scattered with SP), the last stage's final norm,
 * output matmul and fp32 cross-entropy over v/t columns (a frozen head
 * computes its input gradient only; a frozen embedding has no backward). */
typedef struct ends_time {
    double first_f, first_b, first_tp;
    double last_f, last_b;
} ends_time;

static void ends_time_of(const zo_model_config *m, const plan_train *t, const ctx *c, ends_time *o)
{
    double T = (double)t->seq * t->micro_batch, tp = t->tp;
    double h = m->hidden, v = m->vocab, e = c->esz;
    o->first_f = ew(c, T * h * 2 * e);
    o->first_b = c->frozen ? 0 : o->first_f;
    o->first_tp = 0;
    double bw, lat;
    link_for(c->hw, t->tp, 1, COLL_RING, &bw, &lat);
    if (t->tp > 1)
        o->first_tp = t->sp ? plan_allgather_s(T * h * e, t->tp, bw, lat)
                            : plan_allreduce_s(T * h * e, t->tp, bw, lat);
    o->last_f = ew(c, T * 2 * e * h / (t->sp ? tp : 1)) + gemm(c, T, v / tp, h) +
                ew(c, T * v / tp * 4 * 2);
    o->last_b = 2 * ew(c, T * 2 * e * h / (t->sp ? tp : 1)) + gemm(c, T, h, v / tp) +
                (c->frozen ? 0 : gemm(c, h, v / tp, T)) + ew(c, T * v / tp * 4 * 2);
}

/* One micro-batch through a stage: nl[0] dense and nl[1] MoE layers, and
 * its ends' forward, backward and TP collectives (ef, eb, etp). */
static void stage_time(const layer_time lt[2], const double nl[2], double ef, double eb, double etp,
                       plan_time_mb *o)
{
    memset(o, 0, sizeof *o);
    for (int j = 0; j < 2; j++) {
        if (!nl[j]) continue;
        const layer_time *x = &lt[j];
        o->fwd += nl[j] * x->fwd;
        o->bwd += nl[j] * x->bwd;
        o->rc += nl[j] * x->rc;
        o->tp_fwd += nl[j] * x->tp_fwd;
        o->tp_bwd += nl[j] * x->tp_bwd;
        o->tp_rc += nl[j] * x->tp_rc;
        o->ep_fwd += nl[j] * x->ep_fwd;
        o->ep_bwd += nl[j] * x->ep_bwd;
        o->ep_rc += nl[j] * x->ep_rc;
        o->ep_bytes += nl[j] * (x->ep_bytes_fwd + x->ep_bytes_bwd + x->ep_bytes_rc);
        for (int i = 0; i < PLAN_OPS; i++) o->ops[i] += nl[j] * x->ops[i];
    }
    o->ops[PLAN_OP_ENDS] = ef + eb;
    o->fwd += ef;
    o->bwd += eb;
    o->tp_fwd += etp / 2;
    o->tp_bwd += etp / 2;
    o->total = o->fwd + o->bwd + o->rc + o->tp_fwd + o->tp_bwd + o->tp_rc + o->ep_fwd + o->ep_bwd +
               o->ep_rc;
    /* one layer as reported and as the overlap window: the heavier kind
     * the stage has */
    const layer_time *x = nl[1] ? &lt[1] : &lt[0];
    o->layer_fwd = x->fwd + x->tp_fwd + x->ep_fwd;
    o->layer_bwd = x->bwd + x->rc + x->tp_bwd + x->tp_rc + x->ep_bwd + x->ep_rc;
    o->layer_compute = x->fwd + x->bwd + x->rc;
    o->layer_rc = x->rc + x->tp_rc + x->ep_rc;
    o->layer_rc_compute = x->rc;
}

/* The model's FLOPs per token (MFU) and the recomputed ones (HFU), from its
 * layers' (n_moe of them MoE). */
static void model_flops(const zo_model_config *m, const plan_train *t, const ctx *c,
                        const layer_time lt[2], int n_moe, plan_time_mb *out)
{
    int L = m->n_layers;
    double h = m->hidden, v = m->vocab;
    double lf = (L - n_moe) * lt[0].flops_token + (n_moe ? n_moe * lt[1].flops_token : 0);
    double la = (L - n_moe) * lt[0].attn_flops_token + (n_moe ? n_moe * lt[1].attn_flops_token : 0);
    out->model_flops_token = 3 * (lf + 2 * h * v);
    double lo = (L - n_moe) * lt[0].ops_flops_token + (n_moe ? n_moe * lt[1].ops_flops_token : 0);
    out->rc_flops_token = t->recompute == ZO_PLAN_RECOMPUTE_FULL                          ? lf
                          : t->recompute == ZO_PLAN_RECOMPUTE_SELECTIVE && !t->flash_attn ? la
                          : t->recompute == ZO_PLAN_RECOMPUTE_OPS                         ? lo
                                                                                          : 0;
    if (c->frozen) {
        /* LoRA: the forward, the input gradients (the base's matmuls once
         * more, the attention core twice), and 6 FLOPs per token per adapter
         * parameter (2 forward, 4 backward) */
        double a = lora_active(m, t);
        out->model_flops_token = 2 * lf + la + 4 * h * v + 6 * a;
        if (t->recompute == ZO_PLAN_RECOMPUTE_FULL) out->rc_flops_token += 2 * a;
        /* by op: x A of every adapter, B of o's and up's (their GEMMs rerun) */
        if (t->recompute == ZO_PLAN_RECOMPUTE_OPS) out->rc_flops_token += 2 * lora_rebuilt(m, t);
    }
}

void plan_time_microbatch(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                          plan_time_mb *out)
{
    memset(out, 0, sizeof *out);
    ctx c = {hw, t->dtype == ZO_DTYPE_F32 ? hw->peak_flops_32 : hw->peak_flops_16,
             hw->hbm_bw * hw->hbm_eff, (double)zo_dtype_size(t->dtype),
             t->method != ZO_PLAN_FULL, t->runtime == PLAN_RUNTIME_ZOFFLOAD ? plan_hw_kernels(hw) : NULL};
    if (m->params_override) {
        size_only_time(m, t, &c, out);
        return;
    }
    /* dense and MoE layers (DeepSeek: dense first layers, then MoE) */
    layer_time lt[2];
    int n_moe_all = zo_model_moe_layers(m);
    layer_time_of(m, t, &c, 0, &lt[0]);
    if (n_moe_all) layer_time_of(m, t, &c, 1, &lt[1]);
    ends_time end;
    ends_time_of(m, t, &c, &end);
    /* the slowest of the first stage (its layers, the embedding), the last
     * (its layers, more of them MoE, the logits) and, with DeepSpeed's
     * partition, a middle one (a layer more than either end) */
    double best = -1;
    int per = 0;
    int stages[3] = {0, t->pp - 1, t->pp_partition == PLAN_PP_PARTITION_EMBEDDING && t->pp > 2 ? 1 : -1};
    for (int k = 0; k < 3; k++) {
        int stage = stages[k];
        if (stage < 0 || (k && stage == 0)) continue;
        int lo, n = plan_stage_layers(m, t, stage, &lo, NULL), n_moe = 0;
        for (int i = lo; i < lo + n; i++) n_moe += zo_model_layer_is_moe(m, i);
        double nl[2] = {n - n_moe, n_moe};
        int first = stage == 0, last = stage == t->pp - 1;
        double ef = (first ? end.first_f : 0) + (last ? end.last_f : 0);
        double eb = (first ? end.first_b : 0) + (last ? end.last_b : 0);
        plan_time_mb o;
        stage_time(lt, nl, ef, eb, first ? 2 * end.first_tp : 0, &o);
        if (o.total > best) {
            best = o.total;
            per = n;
            *out = o;
        }
    }
    plan_train all = *t;
    all.recompute_layers = 0;
    model_flops(m, &all, &c, lt, n_moe_all, out);
    /* recompute full of K layers a stage: K of its `per` */
    if (t->recompute == ZO_PLAN_RECOMPUTE_FULL && t->recompute_layers && t->recompute_layers < per)
        plan_time_mb_recompute_part(out, (double)t->recompute_layers / per, out);
}

void plan_time_mb_recompute_part(const plan_time_mb *full, double f, plan_time_mb *out)
{
    plan_time_mb o = *full;
    double rc = o.rc + o.tp_rc + o.ep_rc;
    o.total -= (1 - f) * rc;
    o.rc *= f;
    o.tp_rc *= f;
    o.ep_rc *= f;
    o.layer_bwd -= (1 - f) * o.layer_rc;
    o.layer_compute -= (1 - f) * o.layer_rc_compute;
    o.layer_rc *= f;
    o.layer_rc_compute *= f;
    o.rc_flops_token *= f;
    *out = o;
}

/* ---- the step ---------------------------------------------------------------------- */

void plan_dp_comm_elems(const plan_train *t, double P, double *grads, double *weights)
{
    double A = t->grad_accum;
    *grads = *weights = 0;
    if (t->dp <= 1) return;
    *grads = t->zero == 0 ? 2 * P : t->zero == 1 ? P : A * P;
    *weights = t->zero == 0 ? 0 : t->zero <= 2 ? P : 2 * A * P;
}

/* What the parts of a step read: the configuration, its estimate and its
 * micro-batch, and what they derive from them. */
typedef struct step_in {
    const zo_model_config *m;
    const plan_hw *hw;
    const plan_train *t;
    const plan_estimate *e;
    const plan_time_mb *mb;
    double n_mb;         /* micro-batches per step */
    double wsz, gsz;     /* bytes of a weight, of a gradient on the device */
    int rpn;             /* ranks per node */
    double P, Pe;        /* trained elements on the rank (LoRA: the adapters); of them experts */
    int edp;             /* the ranks that share an expert: DP / EP */
    double P_shard;      /* ZeRO's partition: the rest over DP, routed experts over DP / EP */
    double fg, on_gpu;   /* the optimizer's GPU share; of the gradients, those summed on the GPU */
    double window;       /* compute that hides copies */
    double bwd_window;   /* of it, the backward's */
    double nvme_stream;  /* NVMe seconds of streamed weights */
} step_in;

/* DeepSpeed's BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py and
 * pipe/engine.py from the bf16 pipeline work merged as 56c522386, 2022-04,
 * whose branch BLOOM-176B trained with): the only way its pipeline engine
 * ran bf16, configured as ZeRO stage 0 but sharding the fp32 optimizer
 * state over DP itself, as ZeRO-1 does (memplan: --pp-schedule deepspeed
 * --dtype bf16 --grad-dtype fp32 --zero 1). After every micro-batch's
 * backward update_hp_grads adds each bf16 gradient into its fp32 buffer
 * through a cast copy (`hp_grad.add_(lp.grad.to(fp32))`: the copy is
 * written and read again); after the flush _bf16_reduce_grads all-reduces
 * the fp32 gradients whole (no reduce-scatter), the shard is updated and
 * the bf16 weights all-gathered. */
static int ds_bf16_optimizer(const plan_train *t)
{
    return t->pp_schedule == PLAN_PP_DEEPSPEED && t->dtype == ZO_DTYPE_BF16 &&
           t->grad_dtype == ZO_DTYPE_F32 && t->zero == 1;
}

/* The micro-batches' compute and collectives, the bubble. Every
 * micro-batch's weight gradients (written by the backward in the weights'
 * dtype) are added into the rank's gradient buffer on the GPU: an
 * elementwise pass that reads the new gradient and reads and writes the
 * buffer, per micro-batch (Megatron's DDP hook and this runtime's staging
 * blocks alike; offloaded gradients are summed on the host, below). */
static void step_compute(step_in *in, plan_time *o)
{
    const plan_train *t = in->t;
    const plan_time_mb *mb = in->mb;
    double acc = 0, n_mb = in->n_mb;
    /* read the new gradient, read and write the buffer (BF16_Optimizer: and its fp32 copy) */
    double pass = in->wsz + 2 * in->gsz + (ds_bf16_optimizer(t) ? 2 * in->gsz : 0);
    if (in->on_gpu > 0 && !t->fused_grad_accum && !in->m->params_override)
        acc = in->on_gpu * (t->zero >= 2 ? in->P_shard : in->P) * pass /
              (in->hw->hbm_bw * in->hw->hbm_eff);
    o->forward = n_mb * mb->fwd;
    o->backward = n_mb * (mb->bwd + acc);
    o->recompute = n_mb * mb->rc;
    o->tp_comm = n_mb * (mb->tp_fwd + mb->tp_bwd + mb->tp_rc);
    o->ep_comm = n_mb * (mb->ep_fwd + mb->ep_bwd + mb->ep_rc);
    o->ep_bytes = n_mb * mb->ep_bytes;
    o->pp_bubble = t->pp > 1 ? ((double)t->pp - 1) / t->vpp * (mb->total + acc) : 0;
    in->window = n_mb * (mb->fwd + mb->bwd + mb->rc);
    in->bwd_window = n_mb * (mb->bwd + mb->rc);
}

/* DeepSpeed's pipeline engine: what it costs per micro-batch beyond the
 * work above, a constant fitted on one run and checked on others (issue
 * 33). Fitted on BLOOM-176B (bigscience tr11-176B-ml, 2022-03-18: 105.22 s
 * an iteration; docs/memplan.md, "Accuracy"), where everything else memplan
 * counts gives 98.06 s: the 7.16 s left over its 128 + 11 micro-batch
 * slots. It then puts MT-NLG's three published iteration times within 4%
 * (they were 20-23% short). Which of the engine's host-side costs it
 * stands for (its per-step .tolist() synchronizations, the instruction
 * interpreter, BLOOM's CUDA_LAUNCH_BLOCKING=1) no source measures. */
#define PLAN_DS_SLOT_S 51.5e-3

/* Pipeline sends: an activation forward and its gradient back, once per
 * chunk and micro-batch, each scattered over the TP ranks (1/t of s b h
 * each, Megatron's scatter-gather) and gathered again over NVLink on the
 * receiving stage. The exchange is not overlapped (1F1B's blocking sends):
 * it is on the critical path of every micro-batch a stage runs and of each
 * of the (p - 1)/v micro-batch times of the pipeline's fill and drain. */
static void step_pp_comm(const step_in *in, plan_time *o)
{
    const plan_train *t = in->t;
    const plan_hw *hw = in->hw;
    if (t->pp <= 1) return;
    /* neighbouring stages are tp x dp ranks apart */
    int cross = (long)t->tp * t->dp >= hw->gpus_per_node;
    double peer = plan_hw_peer_bw(hw);
    double bw = (cross ? hw->net_bw : peer) * hw->coll_eff;
    double lat = cross ? hw->net_lat : hw->nvlink_lat;
    double whole = (double)t->seq * t->micro_batch * (in->m->params_override ? 0 : in->m->hidden) *
                   in->wsz;
    double gather = t->tp > 1 ? plan_allgather_s(whole, t->tp, peer * hw->coll_eff, hw->nvlink_lat) : 0;
    double send = lat + whole / t->tp / bw;
    double slots = (double)t->vpp * in->n_mb + (double)t->pp - 1;
    if (t->pp_schedule != PLAN_PP_DEEPSPEED) {
        o->pp_comm = 2 * (send + gather) * slots;
        return;
    }
    /* DeepSpeed's TrainSchedule: a forward step receives the activation
     * and then sends the previous backward's gradient, a backward step
     * sends the previous forward's activation and then receives the
     * gradient, each a blocking send or receive of its own (p2p.py): four
     * transfers in a row per micro-batch. With TP the engine partitions what
     * it sends (pipe_partitioned, grad_partitioned) and gathers three
     * tensors back over the TP ranks: the received activation, the received
     * gradient, and the stage's own output, which it cleared after sending
     * and restores before the backward. Then, after the flush,
     * ReduceTiedGrads all-reduces the tied embedding's gradient between the
     * first and the last stage (its 1/t vocabulary slice, in the gradients'
     * dtype), on nothing else's time. */
    o->pp_comm = (4 * send + 3 * gather) * slots;
    o->pp_engine = PLAN_DS_SLOT_S * slots;
    if (in->m->tied_embeddings && !in->m->params_override) {
        double tied = (double)in->m->vocab / t->tp * in->m->hidden * in->gsz;
        o->pp_comm += plan_allreduce_s(tied, 2, bw, lat);
    }
}

/* Data parallel (plan_dp_comm_elems): gradients all-reduced (ZeRO 0) or
 * reduce-scattered (ZeRO 1) once per step, or reduce-scattered every
 * micro-batch (ZeRO 2-3); updated weights all-gathered after the step (ZeRO
 * 1-2); ZeRO-3 gathers the weights twice every micro-batch. The gradients'
 * bytes are the reduce dtype's. With experts: the dense parameters over all
 * DP ranks, the routed experts over the DP / EP ranks that hold the same
 * experts (stride TP x EP).
 * Overlapped (dp_overlap), the reductions run bucket by bucket as the
 * backward produces the gradients (ZeRO 0-1: the last micro-batch's; ZeRO
 * 2: every one's) and ZeRO-3's gathers and reductions block by block beside
 * each micro-batch's compute: what is left exposed is what the compute does
 * not cover, and at least what nothing can hide, the reduction of the last
 * bucket (ZeRO 0-2) or the step's first gather and last reduction of a
 * block (ZeRO-3). Not overlapped, all of it adds to the step: Megatron-LM
 * before its --overlap-grad-reduce (2023), and PyTorch FSDP as torchtitan
 * measured it (docs/memplan.md, "Time"). */
static void step_dp_comm(const step_in *in, plan_time *o)
{
    const plan_train *t = in->t;
    double P = in->P, Pe = in->Pe;
    if (t->dp <= 1) return;
    double last_bwd = in->mb->bwd + in->mb->rc;
    double rsz = (double)zo_dtype_size(t->reduce_dtype);
    /* what no compute covers: one bucket (a block at most), or a block's gather and reduction */
    double block = (double)in->e->train_largest;
    double bucket = (double)t->buf.comm_bucket < block ? (double)t->buf.comm_bucket : block;
    double red = 0, gat = 0, tail = 0;
    for (int part = 0; part < 2; part++) {
        int group = part ? in->edp : t->dp;
        double n = part ? Pe : P - Pe;
        if (group <= 1 || n <= 0) continue;
        double bw, lat, ge, we;
        link_for(in->hw, group, part ? (long)t->tp * t->ep : t->tp, COLL_RING, &bw, &lat);
        plan_dp_comm_elems(t, n, &ge, &we);
        /* ZeRO-3 gathers what the step computes with (LoRA: the frozen base too) */
        double G = n * rsz;
        double W = t->zero >= 3 && !part ? (double)in->e->weight_bytes - Pe * in->wsz : n * in->wsz;
        /* a reduce-scatter or an all-gather of n elements each, an all-reduce of 2n */
        red += t->zero == 0 || ds_bf16_optimizer(t) ? plan_allreduce_s(G, group, bw, lat)
                            : ge / n * plan_allgather_s(G, group, bw, lat);
        gat += we / n * plan_allgather_s(W, group, bw, lat);
        if (part) continue;
        tail = t->zero >= 3 ? plan_allgather_s(block * rsz, group, bw, lat) +
                                  plan_allgather_s(block * (W / n), group, bw, lat)
               : t->zero == 0 ? plan_allreduce_s(bucket * rsz, group, bw, lat)
                              : plan_allgather_s(bucket * rsz, group, bw, lat);
    }
    o->dp_comm_total = red + gat;
    /* DeepSpeed's pipeline engine reduces after the flush (ReduceGrads) */
    if (!t->dp_overlap || t->pp_schedule == PLAN_PP_DEEPSPEED) o->dp_comm = red + gat;
    else if (t->zero <= 1) o->dp_comm = dmax(red - last_bwd, dmin(tail, red)) + gat;
    else if (t->zero == 2) o->dp_comm = dmax(red - in->bwd_window, dmin(tail, red)) + gat;
    else o->dp_comm = dmax(o->dp_comm_total - in->window, dmin(tail, o->dp_comm_total));
}

/* Host<->device copies. Streamed weights (params on CPU or NVMe; LoRA: the
 * base and the adapters off the GPU): this rank's share crosses PCIe in the
 * forward and again in the backward of every micro-batch; NVMe reads share
 * the node's drives. Hidden behind compute; the largest block (embedding or
 * head) shows when it takes longer than `prefetch` layers. Activation
 * checkpoints in host memory: written during the forward and read back
 * during the backward of every micro-batch, hidden behind them. */
static void step_h2d(step_in *in, plan_time *o)
{
    const plan_train *t = in->t;
    const plan_estimate *e = in->e;
    double n_mb = in->n_mb, pcie = in->hw->pcie_bw;
    if (e->stream_bytes > 0) {
        double stream = 2 * n_mb * (double)e->stream_bytes / pcie;
        in->nvme_stream = 2 * n_mb * (double)e->stream_nvme_bytes * in->rpn / in->hw->nvme_read_bw;
        double big = (double)e->largest_bytes / pcie / (t->zero >= 3 ? t->dp : 1);
        double ahead = t->buf.prefetch_depth * in->mb->layer_compute / 3; /* a layer's fwd ~ 1/3 */
        o->h2d_total = stream;
        o->sched.dma_bytes += 2 * n_mb * (double)e->stream_bytes;
        o->h2d = dmax(dmax(stream, in->nvme_stream) - in->window, 0) +
                 2 * n_mb * dmax(big - ahead, 0) + big;
    }
    if (t->checkpoints_on == ZO_PLAN_CPU && e->activations_known) {
        double ck = n_mb * (double)e->act_stage / pcie;
        o->h2d_total += ck;
        o->d2h_total += ck;
        o->sched.dma_bytes += 2 * n_mb * (double)e->act_stage;
        o->h2d += dmax(ck - in->bwd_window, 0);
        o->d2h += dmax(ck - n_mb * in->mb->fwd, 0);
    }
}

/* The host's OpenMP teams per rank (the runtime's): the gradient sums'
 * and, beside them on its own thread (overlap, dpu), the optimizer's. With
 * the serial schedule both are every core of the rank's share. */
static void host_teams(const step_in *in, zo_plan_schedule sched, double *sum_threads, double *opt_threads)
{
    const plan_train *t = in->t;
    int cores = in->hw->cpu_cores / (in->rpn > 0 ? in->rpn : 1), s, o;
    if (in->hw->cpu_cores <= 0) {
        *sum_threads = *opt_threads = 0; /* (no cores known: the roof alone) */
        return;
    }
    if (sched == ZO_PLAN_SCHED_SERIAL) {
        *sum_threads = cores > 0 ? cores : 1;
        *opt_threads = t->opt_threads ? t->opt_threads : *sum_threads;
        return;
    }
    zo_host_teams(cores, t->opt_threads, &s, &o);
    *sum_threads = s;
    *opt_threads = o;
}

/* Gradients to the host: this rank's partition every micro-batch, summed
 * in fp32 by the host (the first addition of a step writes the sum: the
 * gradient read, the sum written; the later ones read it too) on the
 * host sums' team (host_teams, at plan_hw_host_stream_rate), hidden behind
 * the backward; the optimizer's host share, sent in the weights' dtype, or
 * a ZeRO 2-3 rank's reduced fp32 part. */
static void step_d2h(const step_in *in, plan_time *o)
{
    const plan_train *t = in->t;
    double n_mb = in->n_mb, pcie = in->hw->pcie_bw;
    double g_elems = (1 - in->on_gpu) * (t->zero >= 2 ? in->P_shard : in->P);
    double g_sent = t->zero >= 2 && t->dp > 1 ? 4 : in->wsz;
    if (g_elems <= 0) return;
    double copy = n_mb * g_elems * g_sent / pcie, th, unused;
    o->sched.dma_bytes += n_mb * g_elems * g_sent;
    int now = plan_sched_sum_team(t->schedule, t->clip_stale);
    for (int k = 0; k < 2; k++) {
        host_teams(in, k ? ZO_PLAN_SCHED_OVERLAP : ZO_PLAN_SCHED_SERIAL, &th, &unused);
        double node = th * in->rpn;
        double accum = g_elems * in->rpn / plan_hw_host_stream_rate(in->hw, node, g_sent + 4) +
                       (n_mb - 1) * g_elems * in->rpn / plan_hw_host_stream_rate(in->hw, node, g_sent + 8);
        double s = dmax(copy, accum);
        o->sched.host_sum[k] = accum;
        o->sched.d2h_link[k] = s;
        o->sched.d2h_exposed[k] = dmax(s - in->bwd_window, 0) + (double)in->e->train_largest * g_sent / pcie;
    }
    o->sched.d2h_team = now;
    o->d2h_total += o->sched.d2h_link[now];
    o->d2h += o->sched.d2h_exposed[now];
}

/* The CPU update's elements/s per rank on `threads` threads of each of
 * the node's rpn ranks: AdamW (or SGD) at plan_hw_cpu_adam_rate_*, and
 * with several ranks the clipping statistics' pass of its own: with one
 * rank the host's last addition into each sum takes them in the same pass
 * (offload/grads.c); with several the sums are reduced first and a pass
 * reads them again (4 bytes an element) before the update starts. */
static double update_rate(const step_in *in, double per, double threads)
{
    const plan_train *t = in->t;
    const plan_hw *hw = in->hw;
    int rpn = in->rpn;
    double sgd = t->optimizer == ZO_PLAN_SGD ? 1.5 : 1; /* momentum only: less traffic */
    double r;
    if (t->optimizer == ZO_PLAN_ADAMW && (t->opt_state != ZO_PLAN_STATE_FP32 ||
                                          t->master != ZO_PLAN_MASTER_FP32)) {
        /* the state read and written, an fp32 gradient read, the 16-bit
         * weight written; 8-bit state's coding costs instructions */
        double bytes = 2 * per + 4 + 2;
        double compute = t->opt_state == ZO_PLAN_STATE_8BIT ? PLAN_ADAM_8BIT_COMPUTE : 1;
        r = plan_hw_cpu_adam_rate_enc(hw, threads * rpn, bytes, compute) / rpn;
    } else {
        r = sgd * plan_hw_cpu_adam_rate_threads(hw, threads * rpn) / rpn;
    }
    double read = plan_hw_host_stream_rate(hw, threads * rpn, 4) / rpn;
    if (t->dp > 1 && read > 0 && r > 0) r = 1 / (1 / r + 1 / read);
    return r;
}

/* The CPU optimizer's rates and traffic per element (the schedule's
 * inputs): AdamW on the optimizer's threads (all the node's cores when it
 * runs alone, less one per rank beside the GPU's work;
 * plan_hw_cpu_adam_rate_threads), the NVMe share read and written (and
 * streamed weights written back), the new weights uploaded to a GPU that
 * keeps them (LoRA's adapters always). */
static void cpu_optimizer(const step_in *in, double per, double o_elems, double cpu_n,
                          plan_sched_in *s)
{
    const plan_train *t = in->t;
    const plan_hw *hw = in->hw;
    int rpn = in->rpn, cores = hw->cpu_cores;
    double unused;
    s->threads_serial = t->opt_threads ? t->opt_threads : cores ? (double)cores / rpn : 0;
    /* beside the host's gradient sums: the cores they leave */
    host_teams(in, ZO_PLAN_SCHED_OVERLAP, &unused, &s->threads_over);
    s->rate_serial = update_rate(in, per, s->threads_serial);
    s->rate_over = update_rate(in, per, s->threads_over);
    s->rate_bus = update_rate(in, per, cores ? (double)cores / rpn : 0);
    s->host_rate = plan_hw_host_stream_rate(hw, 0, 1) / rpn;
    double nv = in->e->opt_share[ZO_PLAN_NVME] / (1 - in->fg) * per * rpn;
    s->n_elem = nv / hw->nvme_read_bw + nv / hw->nvme_write_bw;
    /* (the weights a step writes: the model's, or LoRA's adapters) */
    zo_plan_tier w_on = t->method != ZO_PLAN_FULL ? t->adapters_on : t->params_on;
    if (w_on == ZO_PLAN_NVME) s->n_elem += in->wsz * rpn / hw->nvme_write_bw;
    s->w_bytes = w_on == ZO_PLAN_GPU ? in->wsz : 0;
    s->pcie = hw->pcie_bw;
    /* pipelined: one sub-group fills it */
    s->fill = (double)t->buf.sub_group < o_elems ? (double)t->buf.sub_group / o_elems : 1;
    s->cpu_n = cpu_n;
}

/* The optimizer: on the GPU over its fraction: unscale and inf check
 * (gradient read and written), norm (read), update (master, m, v and the
 * gradient read; master, m, v written), cast (master read, weight written),
 * zeroing (gradient written); on the CPU over the rest, with the NVMe share
 * read ahead and written behind. Returns the elements the CPU updates. */
static double step_optimizer(const step_in *in, plan_time *o)
{
    const plan_train *t = in->t;
    double o_elems = t->zero >= 1 ? in->P_shard : in->P;
    double per = plan_opt_bytes_per_param(t); /* (an fp32 master for fp32 weights too) */
    if (in->fg > 0)
        o->optimizer_gpu = in->fg * o_elems * (2 * per + 5 * in->gsz + 4 + in->wsz) /
                           (in->hw->hbm_bw * in->hw->hbm_eff);
    double cpu_n = (1 - in->fg) * o_elems;
    if (cpu_n > 0) {
        cpu_optimizer(in, per, o_elems, cpu_n, &o->sched);
        o->nvme_total = o->sched.n_elem * cpu_n + in->nvme_stream;
    }
    if (in->nvme_stream > 0 && o->nvme_total == 0) o->nvme_total = in->nvme_stream;
    return cpu_n;
}

/* What the schedule works with (planner/schedule.c): the GPU's work, its
 * exposed copies, the links' traffic, and the blocks of a micro-batch: the
 * stage's first block (embedding), its layers, its last (head), with what
 * the CPU updates in each. */
static void step_sched_in(const step_in *in, double cpu_n, plan_time *o)
{
    const plan_train *t = in->t;
    const plan_estimate *e = in->e;
    const plan_time_mb *mb = in->mb;
    plan_sched_in *s = &o->sched;
    s->gpu = o->forward + o->backward + o->recompute + o->tp_comm + o->pp_bubble + o->pp_comm +
             o->dp_comm + o->h2d + o->d2h + o->ep_comm + o->pp_engine;
    s->h2d = o->h2d;
    s->opt_gpu = o->optimizer_gpu;
    s->h2d_busy = o->h2d_total;
    s->d2h_busy = o->d2h_total;
    s->nvme_busy = in->nvme_stream;
    int layers = e->layers;
    s->seg_n[0] = e->train_first > 0 || (e->stage == 0 && layers);
    s->seg_n[1] = layers;
    s->seg_n[2] = e->train_last > 0 || (e->stage == t->pp - 1 && layers);
    double ratio = in->P > 0 ? cpu_n / in->P : 0;
    s->seg_elems[0] = (double)e->train_first * ratio;
    s->seg_elems[1] = (double)e->train_layer * ratio;
    s->seg_elems[2] = (double)e->train_last * ratio;
    s->fwd1 = mb->fwd + mb->tp_fwd + mb->ep_fwd;
    s->clip_stale = o->clip_stale = t->clip_stale;
    o->dpu_warmup = t->dpu_warmup;
    double bwd1 = mb->bwd + mb->rc + mb->tp_bwd + mb->tp_rc + mb->ep_bwd + mb->ep_rc;
    s->seg_fwd[1] = layers ? mb->layer_fwd : 0;
    s->seg_bwd[1] = layers ? mb->layer_bwd : 0;
    /* the rest of the micro-batch (embedding, logits) on its end blocks */
    int end = s->seg_n[2] ? 2 : 0;
    s->seg_n[end] = 1;
    s->seg_fwd[end] = dmax(s->fwd1 - layers * s->seg_fwd[1], 0);
    s->seg_bwd[end] = dmax(bwd1 - layers * s->seg_bwd[1], 0);
    double tokens = plan_step_tokens(t);
    s->tokens = tokens;
    s->peak = (t->dtype == ZO_DTYPE_F32 ? in->hw->peak_flops_32 : in->hw->peak_flops_16) *
              ((double)t->dp * t->tp * t->pp);
    o->model_flops = mb->model_flops_token * tokens;
    o->hw_flops = o->model_flops + mb->rc_flops_token * tokens;
}

void plan_time_step(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                    const plan_estimate *e, const plan_time_mb *mb, plan_time *o)
{
    memset(o, 0, sizeof *o);
    o->mb = *mb;
    /* P counts what is trained (LoRA: the adapters) */
    step_in in = {.m = m, .hw = hw, .t = t, .e = e, .mb = mb, .n_mb = t->grad_accum,
                  .wsz = (double)zo_dtype_size(t->dtype), .gsz = (double)zo_dtype_size(t->grad_dtype),
                  .rpn = e->ranks_per_node, .P = (double)e->train_params,
                  .Pe = (double)e->train_expert_params, .edp = t->dp / t->ep,
                  .fg = e->opt_share[ZO_PLAN_GPU]};
    in.P_shard = (in.P - in.Pe) / t->dp + in.Pe / in.edp;
    /* (summed on the GPU: all of them, or the GPU optimizer share's) */
    in.on_gpu = t->grads_on == ZO_PLAN_GPU ? 1 : in.fg;
    step_compute(&in, o);
    step_pp_comm(&in, o);
    step_dp_comm(&in, o);
    step_h2d(&in, o);
    step_d2h(&in, o);
    double cpu_n = step_optimizer(&in, o);
    step_sched_in(&in, cpu_n, o);
    plan_time_schedule(o, t->schedule);
}

double plan_step_tokens(const plan_train *t)
{
    return (double)t->seq * t->micro_batch * t->grad_accum * t->dp;
}

/* Why it is a floor: plan_time_schedule's step, under every schedule, is
 * the sum of the fourteen parts, and each is >= 0: dp_comm a max with 0 or
 * a sum of collectives plus the gathers; h2d and d2h sums of copies and of
 * dmax(..., 0) (a schedule moves d2h between its teams' exposed amounts,
 * each >= 0, and adds its upload times f >= 0); optimizer_gpu, and
 * cpu_adam and nvme, the serial update's parts (nvme's max(a, nv) + fill
 * min(a, nv) - a >= 0) times f = exposed / serial >= 0, exposed the period
 * beyond the GPU's work, which starts at that work plus added >= 0. Of the
 * rest, forward, recompute, tp_comm, ep_comm, pp_comm and pp_engine are
 * the layout's alone (step_compute and step_pp_comm read the shape, the
 * micro-batch, the dtypes and the links, no estimate); backward and
 * pp_bubble add to the layout's the pass that sums each micro-batch's
 * gradients on the GPU (acc >= 0), which depends on the placement: left
 * out here (nothing summed on the GPU: on_gpu 0). A full recompute of K
 * of a stage's L layers (plan_time_mb_recompute_part) times K / L of the
 * micro-batch's recompute, at least none of it: with recompute full the
 * floor counts no recompute. */
double plan_time_floor(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                       const plan_time_mb *mb)
{
    plan_time_mb lo = *mb;
    if (t->recompute == ZO_PLAN_RECOMPUTE_FULL) plan_time_mb_recompute_part(mb, 0, &lo);
    plan_time o;
    memset(&o, 0, sizeof o);
    step_in in = {.m = m, .hw = hw, .t = t, .mb = &lo, .n_mb = t->grad_accum,
                  .wsz = (double)zo_dtype_size(t->dtype), .gsz = (double)zo_dtype_size(t->grad_dtype)};
    step_compute(&in, &o);
    step_pp_comm(&in, &o);
    return o.forward + o.backward + o.recompute + o.tp_comm + o.pp_bubble + o.pp_comm + o.ep_comm +
           o.pp_engine;
}

zo_status plan_time_run(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                        const plan_estimate *e, plan_time *out)
{
    zo_status st = plan_train_validate(t, m, hw);
    if (st) return st;
    if (hw->peak_flops_16 <= 0 || hw->hbm_bw <= 0 || hw->pcie_bw <= 0 || hw->gemm_eff_max <= 0 ||
        hw->hbm_eff <= 0 || hw->coll_eff <= 0 || hw->nvme_read_bw <= 0 || hw->nvme_write_bw <= 0)
        return zo_error(ZO_ERR_INVALID, "hardware '%s': the cost model needs peak FLOP/s, HBM, "
                                        "PCIe and NVMe bandwidths and efficiencies above zero",
                        hw->name);
    plan_time_mb mb;
    plan_time_microbatch(m, hw, t, &mb);
    plan_time_step(m, hw, t, e, &mb, out);
    return ZO_OK;
}

static const char *op_names[PLAN_OPS] = {
    "matmuls", "attention forward", "attention backward", "elementwise",
    "LoRA matmuls", "NF4 dequantization", "embedding, head and loss",
};

const char *plan_op_name(int i) { return i >= 0 && i < PLAN_OPS ? op_names[i] : "?"; }

static const char *part_names[PLAN_TIME_PARTS] = {
    "forward", "backward", "recompute", "tp_comm", "pp_bubble", "pp_comm",
    "dp_comm", "h2d", "d2h", "optimizer_gpu", "cpu_adam", "nvme", "ep_comm", "pp_engine",
};

const char *plan_time_part_name(int i) { return i >= 0 && i < PLAN_TIME_PARTS ? part_names[i] : "?"; }

double plan_time_part(const plan_time *pt, int i)
{
    const double v[PLAN_TIME_PARTS] = {pt->forward, pt->backward, pt->recompute, pt->tp_comm,
                                       pt->pp_bubble, pt->pp_comm, pt->dp_comm, pt->h2d,
                                       pt->d2h, pt->optimizer_gpu, pt->cpu_adam, pt->nvme,
                                       pt->ep_comm, pt->pp_engine};
    return i >= 0 && i < PLAN_TIME_PARTS ? v[i] : 0;
}
