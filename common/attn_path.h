/* Which of the CUDA backend's attention kernels runs a layer when the
 * choice is automatic (gpu/cuda/ops_cuda.c's attention_path), written once
 * for the runtime and for memplan, which times the kernels the runtime will
 * take (planner/cost.c). */
#ifndef ZO_COMMON_ATTN_PATH_H
#define ZO_COMMON_ATTN_PATH_H

/* the GEMM path (16-bit qkv, with cuBLASLt) from this many tokens */
#define ZO_ATTN_GEMM_MIN_T 256

typedef enum zo_attn_path { ZO_ATTN_FLASH, ZO_ATTN_GEMM, ZO_ATTN_TC } zo_attn_path;

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

/* The automatic choice for t tokens a sequence (lt: the device has
 * cuBLASLt; tc_aligned: qkv is where the tensor-core kernels' 16-byte vector
 * loads can read it): the tensor-core kernels where they cover the layer and either
 * the head dim is at most 64 or the GEMM path is not taken; the GEMM path
 * for 16-bit qkv from ZO_ATTN_GEMM_MIN_T tokens; else the flash kernel. The
 * H200's rates behind it (b 8, t 1024, bf16): head dim 64 forward 41.6
 * TFLOP/s on the tensor-core kernels against the GEMM path's 16.3, backward
 * 18.6 against 11.0; head dim 128 forward 31.7 against 28.9, backward 10.5
 * against 22.7; the flash kernel 5 / 4.6 (H100, head dim 128). */
static inline zo_attn_path zo_attn_auto_path(int qkv_16bit, int tc_aligned, int head_dim, int window,
                                             float softcap, float alibi, int t, int lt)
{
    const int gemm = qkv_16bit && lt && t >= ZO_ATTN_GEMM_MIN_T;
    if (tc_aligned && zo_attn_tc_covers(qkv_16bit, head_dim, window, t, softcap, alibi) && (head_dim <= 64 || !gemm))
        return ZO_ATTN_TC;
    return gemm ? ZO_ATTN_GEMM : ZO_ATTN_FLASH;
}

#endif
