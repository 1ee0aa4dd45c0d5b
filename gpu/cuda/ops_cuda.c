/* The CUDA column of the op table: each entry unpacks its slots (gpu/ops.h)
 * for its launcher in gpu/cuda/<family>.cu. */
#include <stdlib.h>
#include <string.h>

#include "gpu/cuda/attention_gemm.h" /* defines: CUDA_ATTN_GEMM_MIN_T */
#include "gpu/cuda/attention_mma.h"  /* defines: cuda_attn_mma_covers, cuda_launch_attention_mma_* */
#include "gpu/cuda/attention_tc.h"   /* defines: cuda_attn_tc_covers, cuda_launch_attention_tc_* */
#include "gpu/cuda/ops_cuda.h"       /* defines: cuda_exec, cuda_ops */

/* cuBLASLt where there is a handle; the tiled kernel otherwise (the host
 * shim, which has no cuBLASLt). */
static zo_status cuda_run_gemm(const cuda_exec *e, const gpu_op_args *a)
{
    gpu_gemm_desc d = a->d.gemm;
    d.a = a->t[0], d.b = a->t[1], d.c = a->t[2];
#ifndef ZO_CUDA_SHIM
    if (e->lt) return cuda_gemm(e->stream, e->lt, e->pool, e->workspace, e->ws_bytes, &d);
#endif
    return cuda_launch_gemm_tiled(e->stream, &d);
}

static zo_status cuda_run_bias_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_bias_forward(e->stream, a->t[0], a->t[1], (int)a->i[0], (int)a->i[1],
                                    a->i[2]);
}

static zo_status cuda_run_bias_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_bias_backward(e->stream, e->workspace, e->ws_bytes, a->t[0], a->t[1], (int)a->i[0],
                                     (int)a->i[1], a->i[2]);
}

static zo_status cuda_run_layernorm_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_layernorm_forward(e->stream, a->t[0], a->p[0], a->p[1], a->t[1], a->t[2],
                                         a->t[3], (int)a->i[0], (int)a->i[1], a->f[0]);
}

static zo_status cuda_run_layernorm_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_layernorm_backward(e->stream, e->workspace, e->ws_bytes, a->t[0], a->t[1], a->t[2], a->t[3], a->t[4],
                                          a->t[5], a->p[0], a->p[1], (int)a->i[0], (int)a->i[1]);
}

static zo_status cuda_run_rmsnorm_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_rmsnorm_forward(e->stream, a->t[0], a->p[0], a->t[1], a->t[2],
                                       (int)a->i[0], (int)a->i[1], a->f[0]);
}

static zo_status cuda_run_rmsnorm_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_rmsnorm_backward(e->stream, e->workspace, e->ws_bytes, a->t[0], a->t[1], a->t[2], a->t[3], a->t[4],
                                        a->p[0], (int)a->i[0], (int)a->i[1]);
}

static zo_status cuda_run_head_norm_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_head_norm_forward(e->stream, a->t[0], a->i[3], a->t[2], a->p[0], a->t[1], a->i[4],
                                         (int)a->i[0], (int)a->i[1], (int)a->i[2], a->f[0], (int)a->i[5]);
}

static zo_status cuda_run_head_norm_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_head_norm_backward(e->stream, e->workspace, e->ws_bytes, a->t[0], a->i[3], a->t[1], a->t[2],
                                          a->t[3], a->i[4], a->p[0], (int)a->i[0], (int)a->i[1], (int)a->i[2],
                                          (int)a->i[5]);
}

/* Which kernels run attention over qkv of this shape (*path: CUDA_ATTN_FLASH,
 * _GEMM, _TC or _MMA). The tensor-core kernels when chosen (ZO_ATTENTION=tc)
 * and they cover the case (cuda_attn_tc_covers: 16-bit qkv, d 64/80/96/128;
 * qkv 16-byte aligned, as their vector loads
 * need); the mma.sync kernels (ZO_ATTENTION=mma, opt-in until a GPU has
 * timed them) for the same cases but ALiBi; what they do not cover falls back to
 * the automatic choice,
 * common/attn_path.h's zo_attn_auto_path (memplan times the same): the
 * tensor-core kernels where they cover the case at head sizes up to 64, or
 * where the GEMM path is not taken; the GEMM path for 16-bit qkv on a
 * device with cuBLASLt from t >= ZO_ATTN_GEMM_MIN_T; else the flash
 * kernel. */
static zo_status attention_path(const cuda_exec *e, const gpu_attn_desc *d, gpu_tensor qkv, int *path)
{
    int p = e->attn_path;
    if (p == CUDA_ATTN_AUTO) {
        const char *v = getenv("ZO_ATTENTION");
        if (v && !strcmp(v, "gemm")) p = CUDA_ATTN_GEMM;
        else if (v && !strcmp(v, "flash")) p = CUDA_ATTN_FLASH;
        else if (v && !strcmp(v, "tc")) p = CUDA_ATTN_TC;
        else if (v && !strcmp(v, "mma")) p = CUDA_ATTN_MMA;
        else if (v && *v && strcmp(v, "auto"))
            return zo_error(ZO_ERR_INVALID, "ZO_ATTENTION=%s: expected gemm, flash, tc, mma or auto", v);
    }
    const int b16 = qkv.dtype == ZO_DTYPE_F16 || qkv.dtype == ZO_DTYPE_BF16;
    const int aligned = (uintptr_t)qkv.data % 16 == 0;
    if (p == CUDA_ATTN_TC && aligned && cuda_attn_tc_covers(d, qkv.dtype)) {
        *path = CUDA_ATTN_TC;
        return ZO_OK;
    }
    if (p == CUDA_ATTN_MMA && aligned && cuda_attn_mma_covers(d, qkv.dtype)) {
        *path = CUDA_ATTN_MMA;
        return ZO_OK;
    }
    if (p == CUDA_ATTN_AUTO || p == CUDA_ATTN_TC || p == CUDA_ATTN_MMA) {
        static const int of[] = {[ZO_ATTN_FLASH] = CUDA_ATTN_FLASH, [ZO_ATTN_GEMM] = CUDA_ATTN_GEMM,
                                 [ZO_ATTN_TC] = CUDA_ATTN_TC};
        *path = of[zo_attn_auto_path(b16, aligned, d->d, d->window, d->softcap, d->alibi, d->t, e->lt != NULL)];
        return ZO_OK;
    }
    *path = b16 && p == CUDA_ATTN_GEMM ? CUDA_ATTN_GEMM : CUDA_ATTN_FLASH;
    return ZO_OK;
}

static cuda_gemm_env gemm_env(const cuda_exec *e)
{
    cuda_gemm_env g = {.stream = e->stream, .lt = e->lt, .pool = e->pool, .workspace = e->workspace,
                       .ws_bytes = e->ws_bytes, .cap = e->attn_cap};
    return g;
}

static zo_status cuda_run_attention_forward(const cuda_exec *e, const gpu_op_args *a)
{
    int path = 0;
    zo_status st = attention_path(e, &a->d.attn, a->t[1], &path);
    if (st != ZO_OK) return st;
    if (path == CUDA_ATTN_MMA)
        return cuda_launch_attention_mma_forward(e->stream, &a->d.attn, a->t[0], a->p[0], a->t[1]);
    if (path == CUDA_ATTN_TC) return cuda_launch_attention_tc_forward(e->stream, &a->d.attn, a->t[0], a->p[0], a->t[1]);
    if (path == CUDA_ATTN_GEMM) {
        cuda_gemm_env g = gemm_env(e);
        return cuda_launch_attention_gemm_forward(&g, &a->d.attn, a->t[0], a->p[0], a->t[1]);
    }
    return cuda_launch_attention_forward(e->stream, &a->d.attn, a->t[0], a->p[0], a->t[1]);
}

static zo_status cuda_run_attention_backward(const cuda_exec *e, const gpu_op_args *a)
{
    int path = 0;
    zo_status st = attention_path(e, &a->d.attn, a->t[2], &path);
    if (st != ZO_OK) return st;
    if (path == CUDA_ATTN_MMA)
        return cuda_launch_attention_mma_backward(e->stream, e->pool, &a->d.attn, a->t[0], a->t[1], a->t[2], a->t[3],
                                                  a->p[0]);
    if (path == CUDA_ATTN_TC)
        return cuda_launch_attention_tc_backward(e->stream, e->pool, &a->d.attn, a->t[0], a->t[1], a->t[2], a->t[3],
                                                 a->p[0]);
    if (path == CUDA_ATTN_GEMM) {
        cuda_gemm_env g = gemm_env(e);
        return cuda_launch_attention_gemm_backward(&g, &a->d.attn, a->t[0], a->t[1], a->t[2], a->t[3],
                                                   a->p[0]);
    }
    return cuda_launch_attention_backward(e->stream, &a->d.attn, a->t[0], a->t[1], a->t[2],
                                          a->t[3], a->p[0]);
}

static zo_status cuda_run_attention_cached(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_attention_cached(e->stream, e->err, &a->d.attn, a->t[0], a->t[1], a->t[2], a->t[3],
                                        a->p[0], (int)a->i[0]);
}

static zo_status rope(const cuda_exec *e, const gpu_op_args *a, int inverse)
{
    return cuda_launch_rope(e->stream, e->err, a->t[0], (int)a->i[0], (int)a->i[1], (int)a->i[2],
                            (int)a->i[3], a->i[4], a->i[6], a->f[0], (int)a->i[5], a->p[1], (int)a->i[7], a->p[0],
                            a->f[1], inverse);
}

static zo_status cuda_run_rope_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return rope(e, a, 0);
}

static zo_status cuda_run_rope_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return rope(e, a, 1);
}

static zo_status cuda_run_gelu_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_gelu_forward(e->stream, a->t[0], a->t[1], a->n, (int)a->i[0]);
}

static zo_status cuda_run_gelu_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_gelu_backward(e->stream, a->t[0], a->t[1], a->t[2], a->n, (int)a->i[0]);
}

static zo_status cuda_run_swiglu_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_swiglu_forward(e->stream, a->t[0], a->t[1], a->t[2], a->n, (int)a->i[0]);
}

static zo_status cuda_run_swiglu_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_swiglu_backward(e->stream, a->t[0], a->t[1], a->t[2], a->t[3], a->t[4],
                                       a->n, (int)a->i[0]);
}

static zo_status cuda_run_embedding_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_embedding_forward(e->stream, e->err, a->t[0], a->p[0], a->t[1], a->t[2], a->p[1],
                                         (int)a->i[4], (int)a->i[0], (int)a->i[1], (int)a->i[2], (int)a->i[3]);
}

static zo_status cuda_run_embedding_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_embedding_backward(e->stream, e->err, e->workspace, e->ws_bytes, a->t[0],
                                          a->t[1], a->t[2], a->p[0], (int)a->i[0], (int)a->i[1],
                                          (int)a->i[2], (int)a->i[3]);
}

static zo_status cuda_run_cross_entropy_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_cross_entropy_forward(e->stream, e->err, a->p[0], a->t[0], a->p[1],
                                             (int)a->i[0], (int)a->i[1], a->f[0]);
}

static zo_status cuda_run_cross_entropy_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_cross_entropy_backward(e->stream, e->err, a->t[0], a->t[1], a->p[0],
                                              a->f[0], (int)a->i[0], (int)a->i[1], a->f[1]);
}

static zo_status cuda_run_add(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_add(e->stream, a->t[0], a->t[1], a->t[2], a->n);
}

static zo_status cuda_run_scale(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_scale(e->stream, a->t[0], a->f[0], a->n);
}

static zo_status cuda_run_softcap(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_softcap(e->stream, a->t[0], a->f[0], a->n);
}

static zo_status cuda_run_cast(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_cast(e->stream, a->t[0], a->t[1], a->n);
}

static zo_status cuda_run_head_copy(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_head_copy(e->stream, a->t[0], a->t[1], (int)a->i[0], (int)a->i[1], (int)a->i[2],
                                 (int)a->i[3], a->i[4], a->i[5], a->i[6], a->i[7]);
}

static zo_status cuda_run_check_finite(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_check_finite(e->stream, a->p[0], a->t[0], a->n);
}

static zo_status cuda_run_sum_squares(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_sum_squares(e->stream, a->p[0], a->t[0], a->n, e->partials);
}

static zo_status cuda_run_nf4_dequantize(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_nf4_dequantize(e->stream, a->t[0], a->p[0], a->n);
}

static zo_status cuda_run_adam_update(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_adam_update(e->stream, &a->d.adam, a->n, a->p[0], a->t[0], a->p[1],
                                   a->p[2], a->t[1]);
}

static zo_status cuda_run_adam_state_update(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_adam_state_update(e->stream, &a->d.astate, a->n, a->t[0], a->t[1], a->p[0], a->t[2],
                                         a->p[1]);
}

static zo_status cuda_run_moe_router_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_moe_router_forward(e->stream, a->t[0], a->t[1], a->p[0], (int)a->i[0],
                                          (int)a->i[1], (int)a->i[2], (int)a->i[3], (int)a->i[4]);
}

static zo_status cuda_run_moe_router_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_moe_router_backward(e->stream, a->t[0], a->t[1], a->t[2], a->p[0],
                                           (int)a->i[0], (int)a->i[1], (int)a->i[2], (int)a->i[3],
                                           (int)a->i[4], (int)a->i[5], a->f[0]);
}

static zo_status cuda_run_moe_scale_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_moe_scale_forward(e->stream, a->t[0], a->t[1], a->p[0], (int)a->i[0],
                                         (int)a->i[1], a->i[2], (int)a->i[3]);
}

static zo_status cuda_run_moe_scale_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_moe_scale_backward(e->stream, a->t[0], a->p[0], a->t[1], a->t[2], a->p[1],
                                          (int)a->i[0], (int)a->i[1], a->i[2], (int)a->i[3]);
}

static zo_status cuda_run_moe_gather(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_moe_gather(e->stream, a->t[0], a->t[1], a->p[0], (int)a->i[0], (int)a->i[1]);
}

static zo_status cuda_run_moe_scatter_add(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_moe_scatter_add(e->stream, a->t[0], a->t[1], a->p[0], (int)a->i[0],
                                       (int)a->i[1], a->i[2]);
}

const cuda_op_fn cuda_ops[GPU_OP_COUNT] = {
#define CUDA_OP(ID, name, slots, check) [GPU_OP_##ID] = cuda_run_##name,
    GPU_OP_TABLE(CUDA_OP)
#undef CUDA_OP
};
