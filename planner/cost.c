#include "cost.h"

#include <math.h>
#include <string.h>

/* Flash attention reaches this fraction of the matmul curve (its softmax and
 * masking run between the two matmuls); its backward does 2.5x the forward
 * FLOPs (it recomputes the scores). Causal masking skips half the tiles. */
#define FLASH_REL_EFF 0.75
#define FLASH_BWD 2.5
#define FLASH_CAUSAL 0.5
/* Host memory bandwidth a vectorized loop reaches (gradient accumulation). */
#define HOST_BW_EFF 0.7

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

/* A link for a group of p ranks `stride` apart (Megatron's order: TP
 * innermost, then DP, then PP): NVLink when the group stays in a node. */
static void link_for(const plan_hw *hw, int p, long stride, double *bw, double *lat)
{
    if ((long)p * stride <= hw->gpus_per_node) {
        *bw = hw->nvlink_bw * hw->coll_eff;
        *lat = hw->nvlink_lat;
    } else {
        *bw = hw->net_bw * hw->coll_eff;
        *lat = hw->net_lat;
    }
}

typedef struct layer_time {
    double fwd, bwd, rc;        /* compute */
    double tp_fwd, tp_bwd, tp_rc;
    double flops_token;         /* model fwd FLOPs per token (whole layer, all TP ranks) */
    double attn_flops_token;    /* the attention core's share */
} layer_time;

static void layer_time_of(const zo_model_config *m, const plan_train *t, const ctx *c,
                          layer_time *o)
{
    memset(o, 0, sizeof *o);
    double s = t->seq, b = t->micro_batch, T = s * b, tp = t->tp;
    double h = m->hidden, f = m->ffn, hd = m->head_dim;
    double q = (double)m->n_heads * hd, kv = (double)m->n_kv_heads * hd;
    double heads = m->n_heads / tp; /* per rank */
    double Tsp = t->sp ? T / tp : T; /* rows of the sequence-parallel regions */
    int gpt = m->arch == ZO_ARCH_GPT;
    double e = c->esz;
    double drop = t->dropout ? 1 : 0; /* mask bytes per element */

    /* matmuls: forward once; backward the input and the weight gradients */
    double mm = gemm(c, T, (q + 2 * kv) / tp, h) + gemm(c, T, h, q / tp);
    double mm_b = gemm(c, T, h, (q + 2 * kv) / tp) + gemm(c, h, (q + 2 * kv) / tp, T) +
                  gemm(c, T, q / tp, h) + gemm(c, q / tp, h, T);
    int n_in = gpt ? 1 : 2; /* GPT: fc1; LLaMA: gate and up */
    mm += n_in * gemm(c, T, f / tp, h) + gemm(c, T, h, f / tp);
    mm_b += n_in * (gemm(c, T, h, f / tp) + gemm(c, h, f / tp, T)) + gemm(c, T, f / tp, h) +
            gemm(c, f / tp, h, T);
    o->flops_token = 2 * (h * (q + 2 * kv) + q * h + (n_in + 1) * h * f) + 4 * s * q;
    o->attn_flops_token = 4 * s * q;

    /* the attention core */
    double attn_f, attn_b, attn_rc;
    if (t->flash_attn) {
        double fl = 4 * s * s * hd * b * heads * FLASH_CAUSAL;
        double eff = plan_hw_gemm_eff(c->hw, fl) * FLASH_REL_EFF;
        attn_f = fl / (c->peak * eff);
        attn_b = FLASH_BWD * attn_f;
        attn_rc = 0; /* flash already recomputes the scores in its backward */
    } else {
        double n = b * heads, sc = n * s * s; /* score elements per rank */
        double core = bmm(c, n, s, s, hd) + bmm(c, n, s, hd, s);
        double soft = ew(c, sc * (2 * e + (t->dropout ? 2 * e + drop : 0)));
        attn_f = core + soft;
        attn_b = 2 * core + 2 * soft;
        attn_rc = attn_f;
    }

    /* elementwise kernels (bytes read + written per row) */
    double row;
    if (gpt) /* 2 LayerNorms (4h), 2 bias-dropout-residual adds (6h + mask) */
        row = 2 * 2 * e * h + 2 * (3 * e * h + drop * h);
    else /* 2 RMSNorms, 2 residual adds */
        row = 2 * 2 * e * h + 2 * 3 * e * h;
    double ew_f = ew(c, Tsp * row);
    if (gpt) /* bias + GeLU over the ffn columns of this rank */
        ew_f += ew(c, T * 2 * e * f / tp);
    else /* SwiGLU (gate, up -> out) and RoPE on q and k */
        ew_f += ew(c, T * (3 * e * f / tp + 2 * e * (q + kv) / tp));

    o->fwd = mm + attn_f + ew_f;
    o->bwd = mm_b + attn_b + 2 * ew_f;

    /* tensor-parallel collectives, two sub-blocks (attention, MLP) per layer:
     * without SP an all-reduce of the sub-block's output in each pass; with SP
     * an all-gather and a reduce-scatter in its place, and in the backward
     * also the re-gather of the input the weight gradient needs */
    if (t->tp > 1) {
        double bw, lat;
        link_for(c->hw, t->tp, 1, &bw, &lat);
        double N = T * h * e;
        double ag = plan_allgather_s(N, t->tp, bw, lat);
        o->tp_fwd = 2 * (t->sp ? 2 * ag : plan_allreduce_s(N, t->tp, bw, lat));
        o->tp_bwd = 2 * (t->sp ? 3 * ag : plan_allreduce_s(N, t->tp, bw, lat));
    }
    if (t->recompute == PLAN_RECOMPUTE_FULL) {
        o->rc = o->fwd;
        o->tp_rc = o->tp_fwd;
    } else if (t->recompute == PLAN_RECOMPUTE_SELECTIVE) {
        o->rc = attn_rc;
    }
}

void plan_time_microbatch(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                          plan_time_mb *out)
{
    memset(out, 0, sizeof *out);
    ctx c = {hw, t->dtype == ZO_DTYPE_F32 ? hw->peak_flops_32 : hw->peak_flops_16,
             hw->hbm_bw * hw->hbm_eff, (double)zo_dtype_size(t->dtype)};
    double s = t->seq, b = t->micro_batch, T = s * b, tp = t->tp;
    if (m->params_override) {
        /* only the size is known: 6N FLOPs per token at the curve's top */
        double n = (double)m->params_override;
        double f = 2 * n * T / (tp * t->pp);
        double tf = f / (c.peak * hw->gemm_eff_max);
        out->fwd = tf;
        out->bwd = 2 * tf;
        out->rc = t->recompute == PLAN_RECOMPUTE_FULL ? tf : 0;
        out->total = out->fwd + out->bwd + out->rc;
        out->model_flops_token = 6 * n;
        out->rc_flops_token = t->recompute == PLAN_RECOMPUTE_FULL ? 2 * n : 0;
        out->layer_compute = out->total;
        return;
    }
    layer_time lt;
    layer_time_of(m, t, &c, &lt);
    double nl = (double)m->n_layers / t->pp;
    double h = m->hidden, v = m->vocab, e = c.esz;

    /* first stage: embedding lookup (+ dropout); with TP the vocabulary-parallel
     * embedding is all-reduced (reduce-scattered with SP) */
    double first = ew(&c, T * h * 2 * e), first_tp = 0;
    double bw, lat;
    link_for(hw, t->tp, 1, &bw, &lat);
    if (t->tp > 1)
        first_tp = t->sp ? plan_allgather_s(T * h * e, t->tp, bw, lat)
                         : plan_allreduce_s(T * h * e, t->tp, bw, lat);
    /* last stage: final norm, output matmul, fp32 cross-entropy over v/t columns */
    double last_f = ew(&c, T * 2 * e * h / (t->sp ? tp : 1)) + gemm(&c, T, v / tp, h) +
                    ew(&c, T * v / tp * 4 * 2);
    double last_b = 2 * ew(&c, T * 2 * e * h / (t->sp ? tp : 1)) + gemm(&c, T, h, v / tp) +
                    gemm(&c, h, v / tp, T) + ew(&c, T * v / tp * 4 * 2);
    double extra_f, extra_b, extra_tp;
    if (t->pp == 1) {
        extra_f = first + last_f;
        extra_b = first + last_b;
        extra_tp = 2 * first_tp;
    } else if (first + 2 * first_tp > last_f + last_b) {
        extra_f = first;
        extra_b = first;
        extra_tp = 2 * first_tp;
    } else {
        extra_f = last_f;
        extra_b = last_b;
        extra_tp = 0;
    }
    out->fwd = nl * lt.fwd + extra_f;
    out->bwd = nl * lt.bwd + extra_b;
    out->rc = nl * lt.rc;
    out->tp_fwd = nl * lt.tp_fwd + extra_tp / 2;
    out->tp_bwd = nl * lt.tp_bwd + extra_tp / 2;
    out->tp_rc = nl * lt.tp_rc;
    out->total = out->fwd + out->bwd + out->rc + out->tp_fwd + out->tp_bwd + out->tp_rc;
    out->layer_fwd = lt.fwd + lt.tp_fwd;
    out->layer_bwd = lt.bwd + lt.rc + lt.tp_bwd + lt.tp_rc;
    out->layer_compute = lt.fwd + lt.bwd + lt.rc;
    out->model_flops_token = 3 * (m->n_layers * lt.flops_token + 2 * h * v);
    out->rc_flops_token = t->recompute == PLAN_RECOMPUTE_FULL
                              ? m->n_layers * lt.flops_token
                          : t->recompute == PLAN_RECOMPUTE_SELECTIVE && !t->flash_attn
                              ? m->n_layers * lt.attn_flops_token
                              : 0;
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

void plan_time_step(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                    const plan_estimate *e, const plan_time_mb *mb, plan_time *o)
{
    memset(o, 0, sizeof *o);
    o->mb = *mb;
    double n_mb = t->grad_accum, p = t->pp, v = t->vpp;
    double wsz = (double)zo_dtype_size(t->dtype), gsz = (double)zo_dtype_size(t->grad_dtype);
    int rpn = e->ranks_per_node;

    o->forward = n_mb * mb->fwd;
    o->backward = n_mb * mb->bwd;
    o->recompute = n_mb * mb->rc;
    o->tp_comm = n_mb * (mb->tp_fwd + mb->tp_bwd + mb->tp_rc);
    o->pp_bubble = t->pp > 1 ? (p - 1) / v * mb->total : 0;
    double window = n_mb * (mb->fwd + mb->bwd + mb->rc); /* compute that hides copies */
    double bwd_window = n_mb * (mb->bwd + mb->rc);

    /* pipeline sends: activations forward and gradients back, once per chunk
     * and micro-batch; scattered over TP ranks (1/t each) */
    if (t->pp > 1) {
        /* neighbouring stages are tp x dp ranks apart */
        int cross = (long)t->tp * t->dp >= hw->gpus_per_node;
        double bw = (cross ? hw->net_bw : hw->nvlink_bw) * hw->coll_eff;
        double lat = cross ? hw->net_lat : hw->nvlink_lat;
        double bytes = (double)t->seq * t->micro_batch * (m->params_override ? 0 : m->hidden) *
                       wsz / t->tp;
        o->pp_comm = 2 * v * n_mb * (lat + bytes / bw);
    }

    /* data parallel (plan_dp_comm_elems): gradients all-reduced (ZeRO 0) or
     * reduce-scattered (ZeRO 1) once per step, overlapped with the last
     * micro-batch's backward down to one bucket, or reduce-scattered every
     * micro-batch (ZeRO 2-3) behind its backward; updated weights
     * all-gathered after the step (ZeRO 1-2); ZeRO-3 gathers the weights
     * twice every micro-batch, overlapped with that micro-batch's compute */
    double P = (double)e->stage_params;
    if (t->dp > 1) {
        double bw, lat;
        link_for(hw, t->dp, t->tp, &bw, &lat);
        double G = P * gsz, W = P * wsz, ge, we;
        plan_dp_comm_elems(t, P, &ge, &we);
        double last_bwd = mb->bwd + mb->rc;
        double bucket = (double)t->buf.comm_bucket < P ? (double)t->buf.comm_bucket / P : 1;
        /* a reduce-scatter or an all-gather of P elements each, an all-reduce of 2P */
        double red = t->zero == 0 ? plan_allreduce_s(G, t->dp, bw, lat) : ge / P * plan_allgather_s(G, t->dp, bw, lat);
        double gat = we / P * plan_allgather_s(W, t->dp, bw, lat);
        o->dp_comm_total = red + gat;
        if (t->zero <= 1) o->dp_comm = dmax(red - last_bwd, red * bucket) + gat;
        else if (t->zero == 2) o->dp_comm = dmax(red - bwd_window, red * bucket) + gat;
        else o->dp_comm = dmax(o->dp_comm_total - window, o->dp_comm_total * bucket);
    }

    /* streamed weights (params on CPU or NVMe): this rank's share crosses PCIe
     * in the forward and again in the backward of every micro-batch; NVMe
     * reads share the node's drives. Hidden behind compute; the largest block
     * (embedding or head) shows when it takes longer than `prefetch` layers. */
    double pcie = hw->pcie_bw;
    double rank_w = (double)e->rank_params * wsz;
    double stream = 0, nvme_stream = 0;
    if (t->params_on != PLAN_GPU) {
        stream = 2 * n_mb * rank_w / pcie;
        if (t->params_on == PLAN_NVME) nvme_stream = 2 * n_mb * rank_w * rpn / hw->nvme_read_bw;
        double big = (double)e->largest_block * wsz / pcie / (t->zero >= 3 ? t->dp : 1);
        double ahead = t->buf.prefetch_depth * mb->layer_compute / 3; /* a layer's fwd ~ 1/3 */
        o->h2d_total = stream;
        o->h2d = dmax(dmax(stream, nvme_stream) - window, 0) + 2 * n_mb * dmax(big - ahead, 0) +
                 big;
    }

    /* activation checkpoints in host memory: written during the forward and
     * read back during the backward of every micro-batch, hidden behind them */
    if (t->checkpoints_on == PLAN_CPU && e->activations_known) {
        double ck = n_mb * (double)e->act_layer * ((double)m->n_layers / t->pp) / pcie;
        o->h2d_total += ck;
        o->d2h_total += ck;
        o->h2d += dmax(ck - bwd_window, 0);
        o->d2h += dmax(ck - n_mb * mb->fwd, 0);
    }

    /* gradients to the host: this rank's partition every micro-batch (fp32
     * accumulation on the host when there are several), hidden behind backward */
    double g_elems = t->zero >= 2 ? P / t->dp : P;
    if (t->grads_on == PLAN_CPU) {
        double copy = n_mb * g_elems * gsz / pcie;
        double host_bw = hw->cpu_mem_bw * HOST_BW_EFF / rpn;
        double accum = n_mb > 1 ? n_mb * g_elems * (4 + 4 + gsz) / host_bw : 0;
        double s = dmax(copy, accum);
        o->d2h_total += s;
        o->d2h += dmax(s - bwd_window, 0) + (double)e->largest_block * gsz / pcie;
    }

    /* the optimizer: on the GPU over its fraction: unscale and inf check
     * (gradient read and written), norm (read), update (master, m, v and the
     * gradient read; master, m, v written), cast (master read, weight
     * written), zeroing (gradient written); on the CPU over the rest, with the
     * NVMe share read ahead and written behind */
    double o_elems = t->zero >= 1 ? P / t->dp : P;
    double fg = t->opt_frac[PLAN_GPU], fn = t->opt_frac[PLAN_NVME];
    double per = (t->dtype == ZO_DTYPE_F32 ? 0 : 4) + (t->optimizer == PLAN_OPT_ADAMW ? 8 : 4);
    if (fg > 0) o->optimizer_gpu = fg * o_elems * (2 * per + 5 * gsz + 4 + wsz) / (hw->hbm_bw * hw->hbm_eff);
    double cpu_n = (1 - fg) * o_elems;
    if (cpu_n > 0) {
        double rate = plan_hw_cpu_adam_rate(hw) / rpn;
        if (t->optimizer == PLAN_OPT_SGD) rate *= 1.5; /* momentum only: less traffic */
        o->cpu_adam = cpu_n / rate;
        double nv = fn * o_elems * per * rpn;
        double nvme_opt = nv / hw->nvme_read_bw + nv / hw->nvme_write_bw;
        if (t->params_on == PLAN_NVME) nvme_opt += cpu_n * wsz * rpn / hw->nvme_write_bw;
        o->nvme_total = nvme_opt + nvme_stream;
        /* pipelined: the slower of the two, plus one sub-group to fill it */
        double sg = (double)t->buf.sub_group < o_elems ? (double)t->buf.sub_group / o_elems : 1;
        double phase = dmax(o->cpu_adam, nvme_opt) + sg * dmin(o->cpu_adam, nvme_opt);
        o->nvme = phase - o->cpu_adam;
        /* updated weights back to a GPU that keeps them */
        if (t->params_on == PLAN_GPU) o->h2d += cpu_n * wsz / pcie;
    }
    if (t->params_on == PLAN_NVME && nvme_stream > 0 && o->nvme_total == 0) o->nvme_total = nvme_stream;

    o->step = o->forward + o->backward + o->recompute + o->tp_comm + o->pp_bubble + o->pp_comm +
              o->dp_comm + o->h2d + o->d2h + o->optimizer_gpu + o->cpu_adam + o->nvme;
    double tokens = (double)t->seq * t->micro_batch * t->grad_accum * t->dp;
    o->tokens_per_s = tokens / o->step;
    o->model_flops = mb->model_flops_token * tokens;
    o->hw_flops = o->model_flops + mb->rc_flops_token * tokens;
    double peak = (t->dtype == ZO_DTYPE_F32 ? hw->peak_flops_32 : hw->peak_flops_16) *
                  ((double)t->dp * t->tp * t->pp);
    o->mfu = o->model_flops / (o->step * peak);
    o->hfu = o->hw_flops / (o->step * peak);
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

static const char *part_names[PLAN_TIME_PARTS] = {
    "forward", "backward", "recompute", "tp_comm", "pp_bubble", "pp_comm",
    "dp_comm", "h2d", "d2h", "optimizer_gpu", "cpu_adam", "nvme",
};

const char *plan_time_part_name(int i) { return i >= 0 && i < PLAN_TIME_PARTS ? part_names[i] : "?"; }

double plan_time_part(const plan_time *pt, int i)
{
    const double v[PLAN_TIME_PARTS] = {pt->forward, pt->backward, pt->recompute, pt->tp_comm,
                                       pt->pp_bubble, pt->pp_comm, pt->dp_comm, pt->h2d,
                                       pt->d2h, pt->optimizer_gpu, pt->cpu_adam, pt->nvme};
    return i >= 0 && i < PLAN_TIME_PARTS ? v[i] : 0;
}
