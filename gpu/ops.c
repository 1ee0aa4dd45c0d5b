/* The op table's rows as data (gpu_op_infos), the checks beyond the slots,
 * and gpu_op_run: every op's arguments are checked here once, for every
 * backend, before the backend's `op` entry sees them. */
#include <math.h>
#include <stdint.h>

#include "common/nf4.h"      /* defines: ZO_NF4_ALIGN */
#include "gpu/device_impl.h" /* defines: struct gpu_stream, gpu_backend_iface */
#include "gpu/ops.h"         /* defines: GPU_OP_TABLE, gpu_op_args */
#include "gpu/profile_impl.h" /* defines: gpu_profile_op */

/* ---- the checks beyond the slots ------------------------------------------------- */

static int dtype_ok(zo_dtype t) { return t >= ZO_DTYPE_F32 && t < ZO_DTYPE_COUNT; }

static zo_status check_dim(const char *op, const char *name, long long v)
{
    if (v > 0) return ZO_OK;
    return zo_error(ZO_ERR_INVALID, "%s: %s must be > 0 (got %lld)", op, name, v);
}

static zo_status gpu_check_gemm(const char *op, const gpu_op_args *a)
{
    const gpu_gemm_desc *d = &a->d.gemm;
    zo_status st;
    if ((st = check_dim(op, "m", d->m)) != ZO_OK || (st = check_dim(op, "n", d->n)) != ZO_OK ||
        (st = check_dim(op, "k", d->k)) != ZO_OK)
        return st;
    int64_t a_cols = d->trans_a ? d->m : d->k, b_cols = d->trans_b ? d->k : d->n;
    if (d->lda < a_cols)
        return zo_error(ZO_ERR_INVALID, "%s: lda %lld < %lld columns of a", op,
                        (long long)d->lda, (long long)a_cols);
    if (d->ldb < b_cols)
        return zo_error(ZO_ERR_INVALID, "%s: ldb %lld < %lld columns of b", op,
                        (long long)d->ldb, (long long)b_cols);
    if (d->ldc < d->n)
        return zo_error(ZO_ERR_INVALID, "%s: ldc %lld < n %d", op, (long long)d->ldc, d->n);
    if (d->batch < 0) return zo_error(ZO_ERR_INVALID, "%s: batch %d < 0", op, d->batch);
    return ZO_OK;
}

/* The name a row gives the slot of `kind` at `index` (for messages). */
static const char *slot_name(const char *op, gpu_slot_kind kind, int index)
{
    for (int id = 0; id < GPU_OP_COUNT; id++) {
        const gpu_op_info *info = &gpu_op_infos[id];
        if (info->name != op) continue;
        for (int k = 0; k < info->n_slots; k++)
            if (info->slots[k].kind == kind && info->slots[k].index == index)
                return info->slots[k].name;
    }
    return "?";
}

/* The bias ops: the row stride i[2] holds at least c = i[1] columns. */
static zo_status gpu_check_ld(const char *op, const gpu_op_args *a)
{
    if (a->i[2] >= a->i[1]) return ZO_OK;
    return zo_error(ZO_ERR_INVALID, "%s: %s %lld < c %lld", op, slot_name(op, GPU_SLOT_INT, 2),
                    (long long)a->i[2], (long long)a->i[1]);
}

/* gpu_head_copy: w <= fill, each head's fill within hsy (w with hsy 0: the
 * heads summed), strides not negative, the heads within a row of each side */
static zo_status gpu_check_head_copy(const char *op, const gpu_op_args *a)
{
    int64_t heads = a->i[1], w = a->i[2], fill = a->i[3], ldy = a->i[4], hsy = a->i[5];
    int64_t ldx = a->i[6], hsx = a->i[7];
    if (hsy < 0 || hsx < 0)
        return zo_error(ZO_ERR_INVALID, "%s: head strides hsy %lld, hsx %lld must not be negative", op,
                        (long long)hsy, (long long)hsx);
    if (fill < w || (hsy ? (heads > 1 && fill > hsy) : fill != w))
        return zo_error(ZO_ERR_INVALID, "%s: fill %lld (w %lld, hsy %lld: w <= fill <= hsy, or fill w when "
                        "hsy is 0)", op, (long long)fill, (long long)w, (long long)hsy);
    if ((heads - 1) * hsy + fill > ldy || (heads - 1) * hsx + w > ldx)
        return zo_error(ZO_ERR_INVALID, "%s: %lld heads overrun a row (ldy %lld, ldx %lld)", op, (long long)heads,
                        (long long)ldy, (long long)ldx);
    return ZO_OK;
}

/* heads of d in rows of ldx: the heads fit in a row */
/* rows hold the heads; the weight is one row shared (w_stride 0) or one a
 * head (w_stride d); centered is a flag */
static zo_status gpu_check_heads(const char *op, const gpu_op_args *a)
{
    if (a->i[3] < a->i[1] * a->i[2])
        return zo_error(ZO_ERR_INVALID, "%s: %s %lld < heads*d %lld", op, slot_name(op, GPU_SLOT_INT, 3),
                        (long long)a->i[3], (long long)(a->i[1] * a->i[2]));
    if (a->i[4] != 0 && a->i[4] != a->i[2])
        return zo_error(ZO_ERR_INVALID, "%s: %s %lld is neither 0 (one weight) nor d %lld (one a head)", op,
                        slot_name(op, GPU_SLOT_INT, 4), (long long)a->i[4], (long long)a->i[2]);
    if (a->i[5] != 0 && a->i[5] != 1)
        return zo_error(ZO_ERR_INVALID, "%s: %s %lld must be 0 or 1", op, slot_name(op, GPU_SLOT_INT, 5),
                        (long long)a->i[5]);
    return ZO_OK;
}

static zo_status gpu_check_attn(const char *op, const gpu_op_args *a)
{
    const gpu_attn_desc *d = &a->d.attn;
    zo_status st;
    if ((st = check_dim(op, "b", d->b)) != ZO_OK || (st = check_dim(op, "t", d->t)) != ZO_OK ||
        (st = check_dim(op, "hq", d->hq)) != ZO_OK || (st = check_dim(op, "hkv", d->hkv)) != ZO_OK ||
        (st = check_dim(op, "d", d->d)) != ZO_OK)
        return st;
    if (d->hq % d->hkv)
        return zo_error(ZO_ERR_INVALID, "%s: hkv %d does not divide hq %d", op, d->hkv, d->hq);
    if (d->window < 0) return zo_error(ZO_ERR_INVALID, "%s: window %d < 0", op, d->window);
    if (!(d->alibi >= 0.0f) || !isfinite(d->alibi))
        return zo_error(ZO_ERR_INVALID, "%s: alibi %g must be finite and >= 0", op, (double)d->alibi);
    if (d->alibi_bf16 != 0 && d->alibi_bf16 != 1)
        return zo_error(ZO_ERR_INVALID, "%s: alibi_bf16 %d must be 0 or 1", op, d->alibi_bf16);
    /* the backward's p[2], dsinks: the gradient of sinks (p[1]) */
    if (a->p[2] && !a->p[1]) return zo_error(ZO_ERR_INVALID, "%s: dsinks without sinks", op);
    return ZO_OK;
}

/* the attention's shape, and a cache that holds t new tokens: i[0] = tc */
static zo_status gpu_check_attn_cached(const char *op, const gpu_op_args *a)
{
    zo_status st = gpu_check_attn(op, a);
    if (st != ZO_OK) return st;
    if (a->i[0] < a->d.attn.t)
        return zo_error(ZO_ERR_INVALID, "%s: cache of %lld positions < t %d new tokens", op, (long long)a->i[0],
                        a->d.attn.t);
    return ZO_OK;
}

/* i: n, t, n_heads, d, ldx, pos0, ldh, n_pos; f[0] = theta, f[1] = scale;
 * p[1]: a position a sequence of t rows, added to pos0 (device memory, not
 * read here: the op checks each against [0, n_pos - t]) */
static zo_status gpu_check_rope(const char *op, const gpu_op_args *a)
{
    if (a->i[3] % 2) return zo_error(ZO_ERR_INVALID, "%s: head dim %lld is odd", op, (long long)a->i[3]);
    if (a->i[6] < a->i[3])
        return zo_error(ZO_ERR_INVALID, "%s: ldh %lld < d %lld", op, (long long)a->i[6], (long long)a->i[3]);
    if (a->i[4] < (a->i[2] - 1) * a->i[6] + a->i[3])
        return zo_error(ZO_ERR_INVALID, "%s: ldx %lld < (n_heads-1)*ldh + d %lld", op, (long long)a->i[4],
                        (long long)((a->i[2] - 1) * a->i[6] + a->i[3]));
    if (!(a->f[0] > 0.0f)) return zo_error(ZO_ERR_INVALID, "%s: theta must be > 0", op);
    if (!(a->f[1] > 0.0f) || !isfinite(a->f[1]))
        return zo_error(ZO_ERR_INVALID, "%s: scale %g must be finite and > 0", op, (double)a->f[1]);
    if (a->i[5] < 0) return zo_error(ZO_ERR_INVALID, "%s: pos0 %lld < 0", op, (long long)a->i[5]);
    if (a->p[1] && a->i[7] < a->i[1])
        return zo_error(ZO_ERR_INVALID, "%s: n_pos %lld < t %lld", op, (long long)a->i[7], (long long)a->i[1]);
    return ZO_OK;
}

/* i: n, t, c, vocab, n_pos; p[1]: a position a sequence of t rows into
 * wpe's n_pos rows (device memory, checked by the op) */
static zo_status gpu_check_embedding(const char *op, const gpu_op_args *a)
{
    if (!a->p[1]) return ZO_OK;
    if (!a->t[2].data) return zo_error(ZO_ERR_INVALID, "%s: positions without wpe (they index it)", op);
    if (a->i[4] < a->i[1])
        return zo_error(ZO_ERR_INVALID, "%s: n_pos %lld < t %lld", op, (long long)a->i[4], (long long)a->i[1]);
    return ZO_OK;
}

static zo_status gpu_check_act(const char *op, const gpu_op_args *a)
{
    if (a->i[0] < 0 || a->i[0] >= GPU_ACT_COUNT)
        return zo_error(ZO_ERR_INVALID, "%s: activation form %lld is not one of 0..%d", op, (long long)a->i[0],
                        GPU_ACT_COUNT - 1);
    return ZO_OK;
}

/* the GLU's form, i[0]; the clamped form's limit f[0] and alpha f[1] */
static zo_status gpu_check_glu(const char *op, const gpu_op_args *a)
{
    if (a->i[0] < 0 || a->i[0] >= GPU_GLU_COUNT)
        return zo_error(ZO_ERR_INVALID, "%s: GLU form %lld is not one of 0..%d", op, (long long)a->i[0],
                        GPU_GLU_COUNT - 1);
    if (a->i[0] == GPU_GLU_CLAMPED && (!(a->f[0] > 0.0f) || !isfinite(a->f[0]) || !isfinite(a->f[1])))
        return zo_error(ZO_ERR_INVALID, "%s: clamped GLU's limit %g must be finite and > 0, alpha %g finite", op,
                        (double)a->f[0], (double)a->f[1]);
    return ZO_OK;
}

static zo_status gpu_check_ce_inplace(const char *op, const gpu_op_args *a)
{
    if (a->t[0].data == a->t[1].data && a->t[0].dtype != a->t[1].dtype)
        return zo_error(ZO_ERR_INVALID, "%s: in place needs one dtype", op);
    return ZO_OK;
}

static zo_status gpu_check_nf4(const char *op, const gpu_op_args *a)
{
    if ((uintptr_t)a->p[0] % ZO_NF4_ALIGN)
        return zo_error(ZO_ERR_INVALID, "%s: nf4 is not %d-byte aligned", op, ZO_NF4_ALIGN);
    return ZO_OK;
}

/* Whether [a, a + na) and [b, b + nb) share a byte. */
static int bytes_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

/* p: param, m, v (fp32 [n]); t: grad, out16 (optional, fp16 or bf16) */
static zo_status gpu_check_adam(const char *op, const gpu_op_args *a)
{
    size_t n = a->n;
    if (a->t[1].data && a->t[1].dtype != ZO_DTYPE_F16 && a->t[1].dtype != ZO_DTYPE_BF16)
        return zo_error(ZO_ERR_INVALID, "%s: out16 dtype %d is not fp16 or bf16", op,
                        (int)a->t[1].dtype);
    if (n > SIZE_MAX / 4) return zo_error(ZO_ERR_INVALID, "%s: n = %zu too large", op, n);
    const void *arr[5] = {a->p[0], a->p[1], a->p[2], a->t[0].data, a->t[1].data};
    size_t len[5] = {4 * n, 4 * n, 4 * n, zo_dtype_size(a->t[0].dtype) * n,
                     a->t[1].data ? zo_dtype_size(a->t[1].dtype) * n : 0};
    const char *name[5] = {"param", "m", "v", "grad", "out16"};
    for (int x = 0; x < 5; x++)
        for (int y = x + 1; y < 5; y++)
            if (arr[y] && bytes_overlap(arr[x], len[x], arr[y], len[y]))
                return zo_error(ZO_ERR_INVALID, "%s: buffers %s and %s overlap", op, name[x],
                                name[y]);
    return ZO_OK;
}

/* t: param (fp32 or bf16), grad, out16 (optional); p: state; d.astate */
static zo_status gpu_check_adam_state(const char *op, const gpu_op_args *a)
{
    const gpu_adam_state_args *x = &a->d.astate;
    size_t n = a->n;
    if (x->type != GPU_ADAM_STATE_BF16 && x->type != GPU_ADAM_STATE_Q8 && x->type != GPU_ADAM_STATE_F32)
        return zo_error(ZO_ERR_INVALID, "%s: state type %d is not fp32, bf16 or q8", op, (int)x->type);
    if (x->type == GPU_ADAM_STATE_Q8 ? x->block < 64 || x->block > GPU_ADAM_Q8_BLOCK_MAX || x->block % 64
                                     : x->block != 0)
        return zo_error(ZO_ERR_INVALID, "%s: block %u (q8: a multiple of 64 up to %d; fp32, bf16: 0)", op,
                        x->block, GPU_ADAM_Q8_BLOCK_MAX);
    if (x->first > x->total || n > x->total - x->first)
        return zo_error(ZO_ERR_INVALID, "%s: values %llu..%llu beyond the state's total %llu", op,
                        (unsigned long long)x->first, (unsigned long long)(x->first + n),
                        (unsigned long long)x->total);
    if (x->type == GPU_ADAM_STATE_Q8 &&
        (x->first % x->block || ((x->first + n) % x->block && x->first + n != x->total)))
        return zo_error(ZO_ERR_INVALID, "%s: values %llu..%llu are not whole blocks of %u", op,
                        (unsigned long long)x->first, (unsigned long long)(x->first + n), x->block);
    if (a->t[0].dtype != ZO_DTYPE_F32 && a->t[0].dtype != ZO_DTYPE_BF16)
        return zo_error(ZO_ERR_INVALID, "%s: param dtype %d is not fp32 or bf16", op, (int)a->t[0].dtype);
    if (a->t[2].data && a->t[2].dtype != ZO_DTYPE_F16 && a->t[2].dtype != ZO_DTYPE_BF16)
        return zo_error(ZO_ERR_INVALID, "%s: out16 dtype %d is not fp16 or bf16", op, (int)a->t[2].dtype);
    if (x->round != GPU_ADAM_ROUND_NEAREST && x->round != GPU_ADAM_ROUND_STOCHASTIC && x->round != GPU_ADAM_ROUND_KAHAN)
        return zo_error(ZO_ERR_INVALID, "%s: round %d is not nearest, stochastic or kahan", op, (int)x->round);
    if (x->round != GPU_ADAM_ROUND_NEAREST && a->t[0].dtype != ZO_DTYPE_BF16)
        return zo_error(ZO_ERR_INVALID, "%s: round %d with an fp32 param (a master rounds to nearest)", op,
                        (int)x->round);
    if ((x->round == GPU_ADAM_ROUND_KAHAN) != (a->p[1] != NULL))
        return zo_error(ZO_ERR_INVALID, "%s: comp %s (Kahan's compensation, with round kahan only)", op,
                        a->p[1] ? "given" : "NULL");
    if ((uintptr_t)a->p[0] % 4) return zo_error(ZO_ERR_INVALID, "%s: state is not 4-byte aligned", op);
    uint64_t prev = 0;
    for (int k = 0; k < x->n_decay; k++) {
        if (x->decay[k][0] < prev || x->decay[k][1] < x->decay[k][0] || x->decay[k][1] > n)
            return zo_error(ZO_ERR_INVALID, "%s: decay range %d [%llu, %llu) is not ascending within [0, %zu)",
                            op, k, (unsigned long long)x->decay[k][0], (unsigned long long)x->decay[k][1], n);
        prev = x->decay[k][1];
    }
    uint64_t state_bytes = (x->type == GPU_ADAM_STATE_Q8 ? x->off_av + 4 * ((x->total + x->block - 1) / x->block)
                                                         : x->off_v + (x->type == GPU_ADAM_STATE_F32 ? 4 : 2) * x->total);
    const void *arr[5] = {a->t[0].data, a->t[1].data, a->p[0], a->t[2].data, a->p[1]};
    size_t len[5] = {zo_dtype_size(a->t[0].dtype) * n, zo_dtype_size(a->t[1].dtype) * n, (size_t)state_bytes,
                     a->t[2].data ? zo_dtype_size(a->t[2].dtype) * n : 0, a->p[1] ? 2 * n : 0};
    const char *name[5] = {"param", "grad", "state", "out16", "comp"};
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            if (arr[j] && bytes_overlap(arr[i], len[i], arr[j], len[j]))
                return zo_error(ZO_ERR_INVALID, "%s: buffers %s and %s overlap", op, name[i], name[j]);
    return ZO_OK;
}

/* The router ops: k of e experts, a known mode (the sparsemixer's: 2 of at
 * least 2, eps finite and >= 0, in f[1], and none of the gate's groups,
 * bias or scale); at most 64 groups (the CUDA kernel's bits) dividing e,
 * 1 to groups of them kept, enough experts in those for k (the sigmoid
 * modes' group score needs 2 a group); a scale (f[2]) finite and > 0, or
 * 0; their weights (and gradients) fp32;
 * the forward's order in bytes (k < 255); the backward's auxiliary loss
 * needs the layers' statistics and a softmax. */
static zo_status gpu_check_moe_router(const char *op, const gpu_op_args *a)
{
    const int bwd = a->t[2].data != NULL; /* the backward's logits */
    const int64_t e = a->i[1], k = a->i[2], mode = a->i[3], groups = a->i[bwd ? 6 : 5],
                  topk = a->i[bwd ? 7 : 6];
    const float scale = a->f[2];
    const int sigmoid = mode == GPU_MOE_ROUTE_SIGMOID || mode == GPU_MOE_ROUTE_SIGMOID_NORM;
    if (k > e) return zo_error(ZO_ERR_INVALID, "%s: k %lld exceeds the %lld experts", op, (long long)k, (long long)e);
    if (mode < GPU_MOE_ROUTE_SOFTMAX || mode > GPU_MOE_ROUTE_SIGMOID_NORM)
        return zo_error(ZO_ERR_INVALID, "%s: unknown mode %lld", op, (long long)mode);
    if (mode == GPU_MOE_ROUTE_SPARSEMIXER && (k != 2 || !(a->f[1] >= 0.0f && isfinite(a->f[1]))))
        return zo_error(ZO_ERR_INVALID, "%s: the sparsemixer chooses 2 experts (k %lld) with a finite jitter "
                        "eps >= 0 (got %g)", op, (long long)k, (double)a->f[1]);
    if (mode == GPU_MOE_ROUTE_SPARSEMIXER && (groups > 1 || a->p[bwd ? 1 : 2] || (scale != 0.0f && scale != 1.0f)))
        return zo_error(ZO_ERR_INVALID, "%s: the sparsemixer takes no groups, bias or scale", op);
    if (groups < 0 || groups > 64 || (groups > 1 && (e % groups || topk < 1 || topk > groups)))
        return zo_error(ZO_ERR_INVALID, "%s: %lld groups of %lld experts keeping %lld (at most 64 groups, "
                        "dividing the experts, keeping 1 to groups)", op, (long long)groups, (long long)e, (long long)topk);
    if (groups > 1 && k > topk * (e / groups))
        return zo_error(ZO_ERR_INVALID, "%s: k %lld exceeds the %lld experts of %lld kept groups", op,
                        (long long)k, (long long)(topk * (e / groups)), (long long)topk);
    if (groups > 1 && sigmoid && e / groups < 2)
        return zo_error(ZO_ERR_INVALID, "%s: a group's score is its two best experts' (groups of %lld)", op,
                        (long long)(e / groups));
    if (!(scale == 0.0f || (scale > 0.0f && isfinite(scale))))
        return zo_error(ZO_ERR_INVALID, "%s: scale %g (finite and > 0, or 0 for none)", op, (double)scale);
    if (sigmoid && a->f[0] != 0.0f)
        return zo_error(ZO_ERR_INVALID, "%s: the load-balancing loss with sigmoid scores is not modelled", op);
    if (a->t[0].dtype != ZO_DTYPE_F32 || a->t[1].dtype != ZO_DTYPE_F32)
        return zo_error(ZO_ERR_INVALID, "%s: %s and %s must be fp32", op,
                        slot_name(op, GPU_SLOT_TENSOR, 0), slot_name(op, GPU_SLOT_TENSOR, 1));
    if (a->t[2].data && a->t[2].dtype != ZO_DTYPE_F32) /* the backward's logits */
        return zo_error(ZO_ERR_INVALID, "%s: %s must be fp32", op, slot_name(op, GPU_SLOT_TENSOR, 2));
    if (!bwd && a->p[1] && k >= GPU_MOE_NOT_CHOSEN) /* the forward's order (the backward has none) */
        return zo_error(ZO_ERR_INVALID, "%s: an order of %lld choices (at most %d)", op, (long long)a->i[2],
                        GPU_MOE_NOT_CHOSEN - 1);
    if (a->f[0] != 0.0f && (!a->p[0] || a->i[4] < 1))
        return zo_error(ZO_ERR_INVALID, "%s: the auxiliary loss needs stats of >= 1 layers", op);
    return ZO_OK;
}

/* ---- the rows as data ------------------------------------------------------------------ */

#define GPU_SLOTS(...) {__VA_ARGS__}
#define GPU_OP_SLOTS(ID, name, slots, check) static const gpu_op_slot slots_##name[] = GPU_SLOTS slots;
GPU_OP_TABLE(GPU_OP_SLOTS)
#undef GPU_OP_SLOTS

const gpu_op_info gpu_op_infos[GPU_OP_COUNT] = {
#define GPU_OP_INFO(ID, name, slots, chk)                                                         \
    [GPU_OP_##ID] = {"gpu_" #name, slots_##name, (int)(sizeof slots_##name / sizeof(gpu_op_slot)), \
                     chk},
    GPU_OP_TABLE(GPU_OP_INFO)
#undef GPU_OP_INFO
};

/* ---- checking and dispatching ------------------------------------------------------------ */

static zo_status check_tensor(const char *op, const char *name, gpu_tensor t)
{
    if (!t.data) return zo_error(ZO_ERR_INVALID, "%s: tensor %s is NULL", op, name);
    if (!dtype_ok(t.dtype))
        return zo_error(ZO_ERR_INVALID, "%s: tensor %s has unknown dtype %d", op, name,
                        (int)t.dtype);
    return ZO_OK;
}

/* The row's slots in order: 1 when the op is to run; 0 when it is to return
 * *st at once (a failed check, or ZO_OK for a count of 0). */
static int check_slots(zo_status *st, const gpu_op_info *info, const gpu_op_args *a)
{
    const char *op = info->name;
    *st = ZO_OK;
    for (int k = 0; k < info->n_slots; k++) {
        const gpu_op_slot *sl = &info->slots[k];
        switch (sl->kind) {
        case GPU_SLOT_COUNT:
            if (a->n == 0) return 0;
            break;
        case GPU_SLOT_TENSOR_OPT:
            if (a->t[sl->index].data) *st = check_tensor(op, sl->name, a->t[sl->index]);
            break;
        case GPU_SLOT_TENSOR:
            *st = check_tensor(op, sl->name, a->t[sl->index]);
            break;
        case GPU_SLOT_PTR:
            if (!a->p[sl->index]) *st = zo_error(ZO_ERR_INVALID, "%s: %s is NULL", op, sl->name);
            break;
        case GPU_SLOT_DIM:
            *st = check_dim(op, sl->name, (long long)a->i[sl->index]);
            break;
        case GPU_SLOT_INT:
        case GPU_SLOT_PTR_OPT:
            break;
        }
        if (*st != ZO_OK) return 0;
    }
    return 1;
}

zo_status gpu_op_run(gpu_stream_t s, gpu_op_id id, const gpu_op_args *a)
{
    if ((unsigned)id >= GPU_OP_COUNT)
        return zo_error(ZO_ERR_INVALID, "gpu_op_run: unknown op %d", (int)id);
    const gpu_op_info *info = &gpu_op_infos[id];
    if (!s) return zo_error(ZO_ERR_INVALID, "%s: NULL stream", info->name);
    if (!a) return zo_error(ZO_ERR_INVALID, "%s: NULL arguments", info->name);
    zo_status st;
    if (!check_slots(&st, info, a)) return st;
    if (info->check && (st = info->check(info->name, a)) != ZO_OK) return st;
    gpu_profile *prof = __atomic_load_n(&s->dev->prof, __ATOMIC_ACQUIRE);
    if (prof) return gpu_profile_op(prof, s, id, a); /* the op between two timed events */
    return s->dev->iface->op(s, id, a);
}
