/* Which of the CUDA backend's attention kernels runs a layer when the
 * choice is automatic (gpu/cuda/ops_cuda.c's attention_path), written once
 * for the runtime and for memplan, which times the kernels the runtime will
 * take (planner/cost.c). */
#ifndef ZO_COMMON_ATTN_PATH_H
#define ZO_COMMON_ATTN_PATH_H

/* the GEMM path (16-bit qkv, with cuBLASLt) from this many tokens */
#define ZO_ATTN_GEMM_MIN_T 256

/* ZO_ATTN_AUTO: the rule below (a plan's default, memory.h's plan_train);
 * the rule itself returns one of the four kernel families */
typedef enum zo_attn_path { ZO_ATTN_AUTO, ZO_ATTN_FLASH, ZO_ATTN_GEMM, ZO_ATTN_TC, ZO_ATTN_MMA } zo_attn_path;

/* Whether a sliding window of `window` positions masks anything over t
 * keys: one no shorter than the keys (Mistral-7B-v0.1's 4096 at shorter
 * sequences) is no window, and the kernels that take none may run it. */
static inline int zo_attn_window_masks(int window, int t) { return window > 0 && window < t; }

/* Whether the tensor-core kernels compute a layer over t keys: 16-bit qkv,
 * a head dim of 64, 80, 96 or 128 (any scale, GQA, sliding windows, soft
 * caps, ALiBi). The window, t, soft cap and ALiBi no longer decide it; they
 * stay in the signature for the callers that pass a layer's whole form. */
static inline int zo_attn_tc_covers(int qkv_16bit, int head_dim, int window, int t, float softcap, float alibi)
{
    (void)window, (void)t, (void)softcap, (void)alibi;
    return qkv_16bit && (head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128);
}

/* Whether the mma.sync kernels compute it: the tensor-core kernels' cases
 * but ALiBi, and head dim 256 (Gemma's; gpu/cuda/attention_mma.h). */
static inline int zo_attn_mma_covers(int qkv_16bit, int head_dim, int window, int t, float softcap, float alibi)
{
    const int d256 = qkv_16bit && head_dim == 256;
    return (zo_attn_tc_covers(qkv_16bit, head_dim, window, t, softcap, alibi) || d256) && alibi <= 0.0f;
}

/* The automatic choice for t tokens a sequence (lt: the device has
 * cuBLASLt; tc_aligned: qkv is where the tensor-core and mma.sync kernels'
 * 16-byte vector loads can read it): the mma.sync kernels wherever they
 * cover the layer (16-bit qkv, head dim 64, 80, 96, 128 or 256, windows,
 * soft caps; no ALiBi); else the tensor-core kernels where they cover it and
 * either the head dim is at most 64 or the GEMM path is not taken; the
 * GEMM path for 16-bit qkv from ZO_ATTN_GEMM_MIN_T tokens; else the flash
 * kernel.
 * The rates behind it, TFLOP/s of the causal half, bf16: on an H100 80GB
 * HBM3 (bench_gpu_cuda, 2026-11-27), LLaMA-2-13B's layer (40 heads of 128,
 * causal) at b 2 t 2048 and b 1 t 4096, forward: mma.sync 141.6 / 159.7,
 * the GEMM path 47.3 / 47.0, the tensor-core kernels 32.4 / 34.3, the
 * flash kernel 5.2 (t 2048); backward with fp32 output gradients (the
 * transformer's): mma.sync 32.7 / 35.5, GEMM 27.2 / 29.9, tensor-core 10.9
 * / 11.6 (with 16-bit ones 39.0 / 42.6, 32.4 / 35.5, 23.0 / 24.9; flash 4.7).
 * Head dims 64 and 256 were not measured on the mma.sync kernels: they take
 * them at 128's rates (64: the same kernel design; 256: 32-row tiles whose
 * two warps a row slice both compute the scores, each half of the outputs,
 * likely slower than 128 and, unmeasured, assumed to beat the GEMM path as
 * 128 does; the next GPU run's bench measures both). At
 * head dim 64 on the H200 (b 8, t 1024) the tensor-core kernels ran 41.6
 * forward and 18.6 backward against the GEMM path's 16.3 and 11.0. */
static inline zo_attn_path zo_attn_auto_path(int qkv_16bit, int tc_aligned, int head_dim, int window,
                                             float softcap, float alibi, int t, int lt)
{
    const int gemm = qkv_16bit && lt && t >= ZO_ATTN_GEMM_MIN_T;
    if (tc_aligned && zo_attn_mma_covers(qkv_16bit, head_dim, window, t, softcap, alibi)) return ZO_ATTN_MMA;
    if (tc_aligned && zo_attn_tc_covers(qkv_16bit, head_dim, window, t, softcap, alibi) && (head_dim <= 64 || !gemm))
        return ZO_ATTN_TC;
    return gemm ? ZO_ATTN_GEMM : ZO_ATTN_FLASH;
}

/* The path a call takes when `forced` is asked for (ZO_ATTN_AUTO: the
 * rule above): the mma.sync or tensor-core kernels where they cover the
 * call, else the rule's choice; the GEMM path for 16-bit qkv, else the
 * flash kernel; the flash kernel. The runtime's dispatch (ops_cuda.c's
 * attention_path, with the call's alignment and cuBLASLt) and memplan's
 * (plan_attn_path: aligned, with cuBLASLt) both resolve through it. */
static inline zo_attn_path zo_attn_resolve_path(zo_attn_path forced, int qkv_16bit, int tc_aligned, int head_dim,
                                                int window, float softcap, float alibi, int t, int lt)
{
    switch (forced) {
    case ZO_ATTN_MMA:
        if (tc_aligned && zo_attn_mma_covers(qkv_16bit, head_dim, window, t, softcap, alibi)) return ZO_ATTN_MMA;
        break;
    case ZO_ATTN_TC:
        if (tc_aligned && zo_attn_tc_covers(qkv_16bit, head_dim, window, t, softcap, alibi)) return ZO_ATTN_TC;
        break;
    case ZO_ATTN_GEMM: return qkv_16bit ? ZO_ATTN_GEMM : ZO_ATTN_FLASH;
    case ZO_ATTN_FLASH: return ZO_ATTN_FLASH;
    default: break;
    }
    return zo_attn_auto_path(qkv_16bit, tc_aligned, head_dim, window, softcap, alibi, t, lt);
}

#endif
