/* The device interface: memory, streams, events, copies and the kernels a
 * transformer needs, behind one opaque handle (the ggml-backend shape: this
 * public header, a private table of functions in device_impl.h, one file per
 * backend).
 *
 * Model of execution (the CUDA one):
 * - Device memory is allocated from a pool with a fixed capacity; allocation
 *   beyond it fails with ZO_ERR_CAPACITY. The pool keeps a high-water mark.
 * - Every copy and every op is enqueued on a stream and returns at once.
 *   Work on one stream runs in order; work on different streams runs
 *   concurrently unless ordered by events (gpu_event_record on one stream,
 *   gpu_stream_wait_event on another). Host code waits with
 *   gpu_stream_synchronize / gpu_event_synchronize.
 * - Argument errors (bad sizes, a NULL pointer, an unsupported dtype) are
 *   returned by the enqueuing call. Errors found while running (a target id
 *   out of range) are sticky on the stream and returned by the next
 *   gpu_stream_synchronize.
 *
 * Tensors are raw device pointers plus a storage dtype (gpu_tensor) and the
 * sizes given to each op; matrices are row-major with an explicit leading
 * dimension where a strided view is useful. Arithmetic is fp32 whatever the
 * storage type (fp32, fp16 or bf16); reductions accumulate in fp32 (or
 * wider) in a fixed order, so results do not depend on thread counts.
 *
 * Backward conventions: gradients of parameters (dw, db, dwte, ...) are
 * ACCUMULATED (+=) so micro-batches add up; the caller zeroes them. Input
 * gradients overwrite, except where an op says "dx +=" (the norms, whose
 * input is the residual stream and whose dx is always added to it). */
#ifndef ZO_GPU_DEVICE_H
#define ZO_GPU_DEVICE_H

#include <math.h>   /* sqrtf */
#include <stddef.h>
#include <stdint.h>
#include <string.h> /* memcpy */

#include "common/dtype.h"  /* zo_dtype */
#include "common/status.h" /* zo_status */
#include "common/adam_math.h" /* zo_adam_hparams */

typedef struct gpu_device *gpu_device_t;
typedef struct gpu_stream *gpu_stream_t;
typedef struct gpu_event *gpu_event_t;

/* A device buffer and the storage type of its elements. */
typedef struct gpu_tensor {
    void *data;
    zo_dtype dtype;
} gpu_tensor;

static inline gpu_tensor gpu_t(void *data, zo_dtype dtype)
{
    gpu_tensor t = {data, dtype};
    return t;
}

/* ---- devices ------------------------------------------------------------ */

typedef struct gpu_cpu_options {
    size_t capacity;  /* bytes of "device" memory; 0 = unlimited */
    int n_threads;    /* OpenMP threads per op; 0 = omp_get_max_threads() */
    /* (tests) nonzero: every fp32 x fp32 -> fp32 gpu_gemm rounds its A and B
     * to TF32 (10-bit mantissa, round to nearest, ties away from zero, as
     * PTX's cvt.rna.tf32.f32) before the fp32 product, C and the scaling
     * left in fp32: a model of the CUDA backend's cuBLASLt GEMMs
     * (CUBLAS_COMPUTE_32F_FAST_TF32), which tests/test_gpu_parity_model.c
     * measures the CUDA backend's fp32 gradients against. Other dtypes and
     * every other op are unchanged. */
    int tf32;
} gpu_cpu_options;

/* The CPU backend: the reference for every other backend. */
zo_status gpu_device_init_cpu(const gpu_cpu_options *opt, gpu_device_t *out);

/* Open a device by name, whichever backends this build has: "cpu" (always),
 * "cuda" (= "cuda:0") or "cuda:N". `capacity` is the device memory limit in
 * bytes (0: the backend's default: unlimited for cpu, the free memory for
 * cuda). ZO_ERR_INVALID for a malformed name, ZO_ERR_UNSUPPORTED for "cuda"
 * in a build without CUDA, ZO_ERR_NOT_FOUND when the device does not exist.
 * gpu/cuda/device_cuda.h opens a CUDA device with all of its options. */
zo_status gpu_device_open(const char *name, size_t capacity, gpu_device_t *out);

/* Number of CUDA devices usable here: 0 when the build has no CUDA, when no
 * driver is installed or no device is present (never an error). */
int gpu_cuda_device_count(void);

/* Destroy the streams (after their queued work) and events still alive,
 * then the device. Device allocations must be freed before. */
void gpu_device_free(gpu_device_t dev);
const char *gpu_device_name(gpu_device_t dev); /* "cpu" */

/* Wait for all work on all streams; returns the first sticky error. */
zo_status gpu_device_synchronize(gpu_device_t dev);

/* ---- memory ------------------------------------------------------------- */

typedef struct gpu_mem_stats {
    size_t capacity;      /* 0 = unlimited */
    size_t in_use;        /* bytes allocated now (rounded to the pool's granule) */
    size_t high_water;    /* most bytes ever in use at once */
    size_t n_allocs;      /* live allocations */
    size_t host_pinned;   /* bytes of pinned host memory allocated now */
} gpu_mem_stats;

/* Device memory, 256-byte aligned. Sizes are rounded up to 256 bytes and
 * counted against the capacity; beyond it: ZO_ERR_CAPACITY. */
zo_status gpu_mem_alloc(gpu_device_t dev, size_t bytes, void **out);
/* Free now: the caller guarantees no queued work still uses `p`. */
void gpu_mem_free(gpu_device_t dev, void *p);
/* Free in stream order, after the work queued on `s` so far. */
zo_status gpu_mem_free_async(gpu_device_t dev, void *p, gpu_stream_t s);
void gpu_mem_get_stats(gpu_device_t dev, gpu_mem_stats *out);
/* Restart the high-water mark at the bytes in use now. */
void gpu_mem_reset_peak(gpu_device_t dev);

/* Page-locked host memory for asynchronous copies (no capacity). */
zo_status gpu_host_alloc(gpu_device_t dev, size_t bytes, void **out);
void gpu_host_free(gpu_device_t dev, void *p);

/* ---- streams and events ------------------------------------------------- */

zo_status gpu_stream_create(gpu_device_t dev, gpu_stream_t *out);
/* Waits for the stream's work, then destroys it. */
void gpu_stream_destroy(gpu_stream_t s);
/* Wait until all work enqueued on `s` has run; returns (and clears) the
 * stream's sticky error, if any. */
zo_status gpu_stream_synchronize(gpu_stream_t s);
gpu_device_t gpu_stream_device(gpu_stream_t s);

zo_status gpu_event_create(gpu_device_t dev, gpu_event_t *out);
void gpu_event_destroy(gpu_event_t ev);
/* Capture the work enqueued on `s` so far; the event completes when it has
 * run. Recording again re-arms the event. */
zo_status gpu_event_record(gpu_event_t ev, gpu_stream_t s);
/* Work enqueued on `s` after this call waits for the event's latest record
 * (as of this call). Waiting on a never-recorded event does nothing. */
zo_status gpu_stream_wait_event(gpu_stream_t s, gpu_event_t ev);
/* 1 when the latest record has completed (or there was none), else 0. */
int gpu_event_query(gpu_event_t ev);
zo_status gpu_event_synchronize(gpu_event_t ev);
/* An event that also keeps the time its latest record completed, on the
 * device's clock (CUDA's event timer; the CPU backend's monotonic clock read
 * by the stream's worker as it reaches the record), for gpu_event_elapsed.
 * Plain events keep none (CUDA: cudaEventDisableTiming, cheaper to record
 * and wait on); gpu/profile.h is what times ops with these. */
zo_status gpu_event_create_timed(gpu_device_t dev, gpu_event_t *out);
/* Milliseconds from the latest record of `start` to the latest record of
 * `end`, both timed events of one device whose records have completed.
 * ZO_ERR_INVALID when an event is not timed or of another device, or a
 * record is not complete (or was never made). */
zo_status gpu_event_elapsed(gpu_event_t start, gpu_event_t end, double *ms);

/* Run fn(arg) on a host thread in stream order: after the work enqueued on
 * `s` so far; work enqueued on `s` later waits until fn returns (CUDA's
 * cudaLaunchHostFunc). fn must not call the device interface. This is how
 * host-side work (an MPI collective, gpu/comm.h) joins a stream's order. */
typedef void (*gpu_host_fn)(void *arg);
zo_status gpu_launch_host_func(gpu_stream_t s, gpu_host_fn fn, void *arg);

/* ---- copies --------------------------------------------------------------- */

typedef enum gpu_copy_kind {
    GPU_COPY_HOST_TO_DEVICE = 0,
    GPU_COPY_DEVICE_TO_HOST,
    GPU_COPY_DEVICE_TO_DEVICE,
    GPU_COPY_HOST_TO_HOST,
} gpu_copy_kind;

zo_status gpu_memcpy_async(gpu_stream_t s, void *dst, const void *src, size_t bytes,
                           gpu_copy_kind kind);
zo_status gpu_memset_async(gpu_stream_t s, void *dst, int value, size_t bytes);

/* ---- ops: linear algebra --------------------------------------------------
 * C[m,n] = alpha * op(A)[m,k] . op(B)[k,n] + beta * C, row-major.
 * op(A) = A (A stored [m,k], lda >= k) or A^T (A stored [k,m], lda >= m);
 * op(B) = B (B stored [k,n], ldb >= n) or B^T (B stored [n,k], ldb >= k).
 * Products accumulate in fp32; beta == 0 ignores C's old contents (nan too).
 * Batched: `batch` independent products, the i-th at A + i*stride_a, etc.
 * (strides in elements). A Linear layer y = x W^T has W [out,in] and
 * trans_b = 1; a GPT-2 Conv1D y = x W has W [in,out] and trans_b = 0. */
typedef struct gpu_gemm_desc {
    int trans_a, trans_b;
    int m, n, k;
    float alpha, beta;
    gpu_tensor a, b, c;
    int64_t lda, ldb, ldc;
    int batch;                 /* 0 or 1: a single product */
    int64_t stride_a, stride_b, stride_c;
} gpu_gemm_desc;

zo_status gpu_gemm(gpu_stream_t s, const gpu_gemm_desc *d);

/* y[n,c] (row stride ldy) += bias[c] broadcast over rows. */
zo_status gpu_bias_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor bias, int n, int c,
                           int64_t ldy);
/* dbias[c] += sum over rows of dy[n,c] (row stride lddy). */
zo_status gpu_bias_backward(gpu_stream_t s, gpu_tensor dbias, gpu_tensor dy, int n, int c,
                            int64_t lddy);

/* ---- ops: normalization ----------------------------------------------------
 * LayerNorm over the last dimension: y = (x - mean) * rstd * w + b, with
 * x, y [n,c]; w, b [c] (b.data may be NULL); mean, rstd [n] fp32 saved for
 * backward. Backward: dx += ..., dw += ..., db += ... (dw.data and db.data
 * may be NULL: that gradient is not computed, as for a frozen norm). */
zo_status gpu_layernorm_forward(gpu_stream_t s, gpu_tensor y, float *mean, float *rstd,
                                gpu_tensor x, gpu_tensor w, gpu_tensor b, int n, int c,
                                float eps);
zo_status gpu_layernorm_backward(gpu_stream_t s, gpu_tensor dx, gpu_tensor dw, gpu_tensor db,
                                 gpu_tensor dy, gpu_tensor x, gpu_tensor w, const float *mean,
                                 const float *rstd, int n, int c);
/* RMSNorm (LLaMA): y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).
 * Backward: dx += ..., dw += ... (dw.data NULL: not computed). */
zo_status gpu_rmsnorm_forward(gpu_stream_t s, gpu_tensor y, float *rstd, gpu_tensor x,
                              gpu_tensor w, int n, int c, float eps);
zo_status gpu_rmsnorm_backward(gpu_stream_t s, gpu_tensor dx, gpu_tensor dw, gpu_tensor dy,
                               gpu_tensor x, gpu_tensor w, const float *rstd, int n, int c);
/* A norm of each head, in place: in each of n rows of x (row stride ldx >=
 * heads * d) the first `heads` runs of d elements are normalised one by
 * one. RMSNorm (centered 0: Qwen3's q_norm and k_norm): x = x rstd w, rstd
 * = 1/sqrt(mean over the head's d of x^2 + eps); LayerNorm without a bias
 * (centered 1: Cohere's use_qk_norm): x = (x - mean) rstd w, rstd =
 * 1/sqrt(mean of (x - mean)^2 + eps). The weight is one row [d] for every
 * head (w_stride 0) or one row a head, [heads, d] (w_stride d). rstd [n,
 * heads] fp32 and saved [n, heads * d] (the heads' inputs, less their mean
 * when centered: the backward's input) are written when not NULL.
 * Backward, in place: dx (row stride ldx) holds the gradient of the norm's
 * output on entry and that of its input on exit; dw += the weight's
 * gradient, summed over every row (and every head with one weight; dw.data
 * NULL: not computed); w_stride and centered as the forward's. */
zo_status gpu_head_norm_forward(gpu_stream_t s, gpu_tensor x, int64_t ldx, gpu_tensor saved, float *rstd,
                                gpu_tensor w, int64_t w_stride, int n, int heads, int d, float eps, int centered);
zo_status gpu_head_norm_backward(gpu_stream_t s, gpu_tensor dx, int64_t ldx, gpu_tensor dw, gpu_tensor saved,
                                 gpu_tensor w, int64_t w_stride, const float *rstd, int n, int heads, int d,
                                 int centered);

/* ---- ops: attention ----------------------------------------------------------
 * Causal self-attention, memory-efficient: no [t,t] matrix is kept; forward
 * saves only the log-sum-exp of each score row, backward recomputes scores.
 * qkv [b, t, (hq + 2*hkv) * d]: per token the hq query heads, then hkv key
 * heads, then hkv value heads (each d wide). Query head h uses kv head
 * h / (hq / hkv) (grouped-query attention). Scores are scaled by 1/sqrt(d).
 * out [b, t, hq*d]; lse [b, hq, t] fp32. Backward overwrites dqkv (same
 * shape as qkv). With window > 0 (a sliding window: Mistral's), query i
 * sees keys i - window < j <= i, the last `window` positions itself
 * included; 0 is every earlier one. With scale > 0 the scores are scaled by
 * it in place of 1/sqrt(d) (Gemma-2's query_pre_attn_scalar^-0.5). With
 * softcap > 0 each scaled score s becomes softcap * tanh(s / softcap)
 * before the mask and the softmax (Gemma-2's attn_logit_softcapping); lse
 * is of the capped scores, and the backward multiplies the score gradient
 * by 1 - tanh^2(s / softcap). With alibi > 0 the score of query i and key j
 * (after the scale and the cap) gets alibi * slope_h * (j - i), slope_h
 * being query head h's of hq heads (gpu_alibi_slope): BLOOM's ALiBi (alibi
 * 1), which adds slope_h * j to every score of a row, the same under the
 * softmax; the backward's score gradient is unchanged (a constant bias).
 * With alibi_bf16 too, the bias is alibi * bf16(bf16(slope_h) * j), j the
 * key's position: Falcon's (Falcon-RW), which builds it in bfloat16 whatever
 * the model's dtype, so that it depends on j itself, not only on j - i
 * (gpu_alibi_at).
 * grads16 (the backward only) allows FlashAttention-2's precision: P, dS
 * and dO (when dout is fp32) each rounded once to qkv's 16-bit type before
 * their products, as PyTorch's fused attention does. A kernel may still
 * carry them in more bits: the CUDA mma.sync kernels take it (about half
 * their tensor-core products); the other paths and the CPU backend do not.
 * The CUDA backend also sets it for every backward under
 * ZO_ATTENTION_GRADS=16bit. 0 (the default): each is carried as a high and
 * a low 16-bit part (about 16 significant bits with bf16).
 * With sinks (device memory, fp32 [hq]; NULL: none), head h's sink logit
 * sinks[h] joins every score row of that head in the softmax (after the
 * scale, cap, bias and window) as one more column whose probability is then
 * dropped: gpt-oss's attention sinks. A row's weights sum below 1: out is
 * sum_j exp(s_j - lse) v_j with lse = log(exp(sinks[h]) + sum_j exp(s_j))
 * (the saved lse includes the sink), and the backward, given that lse and
 * out, needs no other change. dsinks (the backward only; fp32 [hq], NULL:
 * the sinks are frozen) is overwritten with the sinks' gradient:
 * dsinks[h] = -sum over b, i of exp(sinks[h] - lse[b,h,i]) (dout . out)
 * of that row. The cached attention takes sinks (the forward's softmax
 * above) and refuses dsinks. */
typedef struct gpu_attn_desc {
    int b, t, hq, hkv, d;
    int window;
    float scale;   /* 0: 1/sqrt(d) */
    float softcap; /* 0: none */
    float alibi;   /* 0: none; > 0: ALiBi's bias times this */
    int alibi_bf16; /* with alibi: the bias rounded as Falcon's (above) */
    int grads16;    /* backward: 16-bit P, dS and dO allowed (above) */
    const float *sinks; /* fp32 [hq] sink logits (above); NULL: none */
    float *dsinks;      /* backward: fp32 [hq] their gradient, overwritten; NULL: none */
} gpu_attn_desc;

/* Callable on the host and, in CUDA sources, on the device. */
#ifdef __CUDACC__
#define GPU_HD __host__ __device__
#else
#define GPU_HD
#endif

/* ALiBi's slope of head h of `heads` (Hugging Face's build_alibi_tensor):
 * with p the largest power of two <= heads, 2^(-8 (h + 1) / p) for h < p,
 * and for the heads past p 2^(-4 (2 (h - p) + 1) / p), the odd powers of
 * the slopes of 2p heads. */
static inline GPU_HD float gpu_alibi_slope(int heads, int h)
{
    int p = 1;
    while (2 * p <= heads) p *= 2;
    return h < p ? exp2f(-8.0f * (float)(h + 1) / (float)p) : exp2f(-4.0f * (float)(2 * (h - p) + 1) / (float)p);
}

/* x rounded to bfloat16 (to nearest, ties to even), as a float; x finite. */
static inline GPU_HD float gpu_round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* One query head's ALiBi: its bias is step (j - i), or with slope16 > 0
 * alibi * bf16(slope16 j) (slope16 the slope in bfloat16: Falcon's form). */
typedef struct gpu_alibi_head {
    float step, alibi, slope16;
} gpu_alibi_head;

/* Head h of `heads`' ALiBi for a desc's alibi and alibi_bf16 (alibi 0: no bias). */
static inline GPU_HD gpu_alibi_head gpu_alibi_of(float alibi, int bf16, int heads, int h)
{
    gpu_alibi_head a = {0.0f, alibi, 0.0f};
    if (alibi <= 0.0f) return a;
    if (bf16) a.slope16 = gpu_round_bf16(gpu_alibi_slope(heads, h));
    else a.step = alibi * gpu_alibi_slope(heads, h);
    return a;
}

/* The bias of query i (at position i) and key j (at position j). */
static inline GPU_HD float gpu_alibi_at(gpu_alibi_head a, int i, int j)
{
    return a.slope16 > 0.0f ? a.alibi * gpu_round_bf16(a.slope16 * (float)j) : a.step * (float)(j - i);
}

/* The score scale of a: a->scale, or 1/sqrt(d). */
static inline float gpu_attn_scale(const gpu_attn_desc *a)
{
    return a->scale > 0.0f ? a->scale : 1.0f / sqrtf((float)a->d);
}

zo_status gpu_attention_forward(gpu_stream_t s, const gpu_attn_desc *a, gpu_tensor out,
                                float *lse, gpu_tensor qkv);
zo_status gpu_attention_backward(gpu_stream_t s, const gpu_attn_desc *a, gpu_tensor dqkv,
                                 gpu_tensor dout, gpu_tensor qkv, gpu_tensor out,
                                 const float *lse);

/* Attention over a key/value cache (generation). For each of b sequences, t
 * new tokens at positions pos[s] .. pos[s] + t - 1 (pos: b int32 in device
 * memory): their keys and values (in qkv, laid out as above) are written
 * into the caches at those positions first, k_cache and v_cache
 * [b, tc, hkv*d] (any storage type), then query i of sequence s attends,
 * causally, over cache positions 0 .. pos[s] + i (with window > 0 the last
 * `window` of them), scaled and capped as above. out [b, t, hq*d]. Cache positions
 * past pos[s] + t - 1 are neither read nor written. A sequence whose
 * positions leave the cache (pos[s] < 0 or pos[s] + t > tc) is a sticky
 * stream error. A prompt is a call with pos 0 (t its tokens), each token
 * generated after it a call with t 1 at the next position. k_cache and
 * v_cache may be one buffer when qkv's key and value heads are equal (the
 * latent cache of DeepSeek-V2's attention: one row [k_pe | c_kv] serves as
 * key and value, hkv 1). Head sizes: any on the CPU, up to 1024 on CUDA
 * (the other attention ops': 256). */
zo_status gpu_attention_cached(gpu_stream_t s, const gpu_attn_desc *a, gpu_tensor out,
                               gpu_tensor qkv, gpu_tensor k_cache, gpu_tensor v_cache,
                               const int32_t *pos, int tc);

/* Rotary embedding, Hugging Face LLaMA convention (rotate_half: dimension i
 * pairs with i + d/2), IN PLACE on the first d elements of each of the first
 * n_heads heads (head h at h * ldh, ldh >= d: a partial rotary size turns
 * only the front of each head) of each of n rows of x (row stride ldx). Row r has position p = pos0 + r % t and
 * pair i turns by the angle p * inv_freq[i], computed in double:
 * inv_freq[i] = theta^(-2i/d), or the d/2 doubles at `inv_freq` (device
 * memory) when it is not NULL (a rope_scaling's frequencies: LLaMA-3.1's
 * llama3, linear, Phi-3's longrope). cos and sin are multiplied by `scale`
 * (Hugging Face's attention_scaling: longrope's; 1 otherwise), finite and
 * > 0. Backward applies the transpose (the inverse rotation, times scale)
 * in place. */
zo_status gpu_rope_forward(gpu_stream_t s, gpu_tensor x, int n, int t, int n_heads, int d,
                           int64_t ldx, int64_t ldh, float theta, int pos0, const double *inv_freq, float scale);
zo_status gpu_rope_backward(gpu_stream_t s, gpu_tensor dx, int n, int t, int n_heads, int d,
                            int64_t ldx, int64_t ldh, float theta, int pos0, const double *inv_freq, float scale);
/* gpu_rope_forward with a position per sequence: the rows are sequences of
 * t, and row r has position pos[r / t] + r % t, pos being ceil(n / t)
 * int32 in device memory (generation's, where each sequence of a batch
 * sits at its own place in the cache: one call where one call a sequence
 * was needed). n_pos (>= t) is the positions there are (the cache's
 * length): a sequence whose pos is outside [0, n_pos - t] is a sticky
 * stream error naming it (its rows are left as they were), as a bad token
 * is the embedding's. */
zo_status gpu_rope_forward_seq(gpu_stream_t s, gpu_tensor x, int n, int t, int n_heads, int d,
                               int64_t ldx, int64_t ldh, float theta, const int32_t *pos, int n_pos,
                               const double *inv_freq, float scale);

/* ---- ops: activations ---------------------------------------------------------
 * The MLP's activation, by form:
 * GPU_ACT_GELU_TANH, GELU's tanh form (GPT-2's gelu_new):
 *   y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
 * GPU_ACT_GELU_ERF, its erf form (GPT-NeoX's "gelu"): y = x Phi(x), Phi the
 *   normal distribution function, dy/dx = Phi(x) + x phi(x);
 * GPU_ACT_RELU (OPT's "relu"): y = max(x, 0), dy/dx 1 where x > 0, else 0. */
enum { GPU_ACT_GELU_TANH = 0, GPU_ACT_GELU_ERF = 1, GPU_ACT_RELU = 2, GPU_ACT_COUNT };
zo_status gpu_gelu_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor x, size_t n, int form);
zo_status gpu_gelu_backward(gpu_stream_t s, gpu_tensor dx, gpu_tensor dy, gpu_tensor x,
                            size_t n, int form);
/* SwiGLU: y = silu(gate) * up, all [n] elements; with gelu 1 GeGLU
 * (Gemma): y = gelu(gate) * up, GELU's tanh form as above. Backward:
 * dgate = dy * up * act'(gate), dup = dy * act(gate) (either may alias an
 * input). gelu is the op's form: GPU_GLU_SILU, GPU_GLU_GELU, or
 * GPU_GLU_CLAMPED, which only gpu_swiglu_clamped_* below run. */
enum { GPU_GLU_SILU = 0, GPU_GLU_GELU = 1, GPU_GLU_CLAMPED = 2, GPU_GLU_COUNT };
zo_status gpu_swiglu_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor gate, gpu_tensor up,
                             size_t n, int gelu);
zo_status gpu_swiglu_backward(gpu_stream_t s, gpu_tensor dgate, gpu_tensor dup, gpu_tensor dy,
                              gpu_tensor gate, gpu_tensor up, size_t n, int gelu);
/* gpt-oss's experts' GLU (GPU_GLU_CLAMPED): g = min(gate, limit), u =
 * clamp(up, -limit, limit), y = (u + 1) g sigmoid(alpha g) (swiglu_limit
 * 7, alpha 1.702). Backward as above; a clamped input's gradient is 0 past
 * the limit and passes at it (torch.clamp's). limit > 0, alpha finite. */
zo_status gpu_swiglu_clamped_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor gate, gpu_tensor up, size_t n,
                                     float limit, float alpha);
zo_status gpu_swiglu_clamped_backward(gpu_stream_t s, gpu_tensor dgate, gpu_tensor dup, gpu_tensor dy,
                                      gpu_tensor gate, gpu_tensor up, size_t n, float limit, float alpha);

/* ---- ops: embedding and loss ----------------------------------------------------
 * out[n,c] = wte[tokens[r]] (+ wpe[r % t] when wpe.data != NULL).
 * tokens: n int32 ids on the device. Backward: dwte += ..., dwpe += ...
 * (dwpe may be NULL). An id outside [0, vocab) is a sticky stream error. */
zo_status gpu_embedding_forward(gpu_stream_t s, gpu_tensor out, const int32_t *tokens,
                                gpu_tensor wte, gpu_tensor wpe, int n, int t, int c, int vocab);
/* The same with a position a sequence of t rows (generation's batch, each
 * sequence at its own place in the cache): row r adds wpe[pos[r / t] +
 * r % t]; pos: n / t int32 on the device, wpe required, of n_pos (>= t)
 * rows. A sequence whose pos is outside [0, n_pos - t] is a sticky stream
 * error naming it, as a bad token is (its rows are not written). */
zo_status gpu_embedding_forward_seq(gpu_stream_t s, gpu_tensor out, const int32_t *tokens, gpu_tensor wte,
                                    gpu_tensor wpe, const int32_t *pos, int n_pos, int n, int t, int c, int vocab);
zo_status gpu_embedding_backward(gpu_stream_t s, gpu_tensor dwte, gpu_tensor dwpe,
                                 gpu_tensor dout, const int32_t *tokens, int n, int t, int c,
                                 int vocab);

/* Softmax cross-entropy over logits [n,v] (row stride v): losses[r] =
 * logsumexp(logits[r]) - logits[r, targets[r]] (fp32, [n]); a target of -1
 * is ignored (loss 0, gradient 0). Backward: dlogits = dloss * (softmax -
 * onehot), where dloss is a scalar (1/count for a mean); dlogits may be
 * logits itself. The _cap forms first soft-cap the logits, z = cap tanh(x /
 * cap) (Gemma-2's final_logit_softcapping; cap 0: none), the loss over z,
 * and dlogits is of x: dloss (softmax(z) - onehot) (1 - (z / cap)^2). */
zo_status gpu_cross_entropy_forward(gpu_stream_t s, float *losses, gpu_tensor logits,
                                    const int32_t *targets, int n, int v);
zo_status gpu_cross_entropy_backward(gpu_stream_t s, gpu_tensor dlogits, gpu_tensor logits,
                                     const int32_t *targets, float dloss, int n, int v);
zo_status gpu_cross_entropy_forward_cap(gpu_stream_t s, float *losses, gpu_tensor logits,
                                        const int32_t *targets, int n, int v, float cap);
zo_status gpu_cross_entropy_backward_cap(gpu_stream_t s, gpu_tensor dlogits, gpu_tensor logits,
                                         const int32_t *targets, float dloss, int n, int v, float cap);

/* ---- ops: elementwise and reductions ---------------------------------------------
 * y = a + b (the residual add; its backward passes dy to both inputs, so the
 * same op adds gradients). y may alias a or b. */
zo_status gpu_add(gpu_stream_t s, gpu_tensor y, gpu_tensor a, gpu_tensor b, size_t n);
/* x *= alpha, in place (gradient unscaling; backward is the same op). */
zo_status gpu_scale(gpu_stream_t s, gpu_tensor x, float alpha, size_t n);
/* x = cap tanh(x / cap), in place, cap > 0 (Gemma-2's final logit soft cap
 * on the logits generation downloads; the loss caps its own). */
zo_status gpu_softcap(gpu_stream_t s, gpu_tensor x, float cap, size_t n);
/* dst = src converted (round to nearest even); backward is the reverse cast. */
zo_status gpu_cast(gpu_stream_t s, gpu_tensor dst, gpu_tensor src, size_t n);
/* Heads moved between row layouts (latent attention's q|k|v, built from
 * its projections, and their gradients back). In each of n rows, for head
 * h < heads and j < w: y[r ldy + h hsy + j] = x[r ldx + h hsx + j] (hsx 0:
 * one head of x to every head of y), and y[r ldy + h hsy + j] = 0 for
 * w <= j < fill (a head's padding; fill w: none). With hsy 0 every head
 * lands on the one head of y, which gets their sum (in fp32, in head
 * order; fill must be w): the gradient of a broadcast head. y and x must
 * not overlap; the rest of y is left as it was. */
zo_status gpu_head_copy(gpu_stream_t s, gpu_tensor y, gpu_tensor x, int n, int heads, int w, int fill,
                        int64_t ldy, int64_t hsy, int64_t ldx, int64_t hsx);
/* *flag (device int32) |= 1 when any of x[0..n) is inf or nan. */
zo_status gpu_check_finite(gpu_stream_t s, int32_t *flag, gpu_tensor x, size_t n);
/* *sum (device double) += sum of x[i]^2, accumulated in double in a fixed
 * order (for gradient clipping: the total is not rounded to float, so a
 * norm taken on the device agrees with the host's to double rounding). */
zo_status gpu_sum_squares(gpu_stream_t s, double *sum, gpu_tensor x, size_t n);

/* ---- ops: quantized weights --------------------------------------------------------
 * out[n] = the NF4 tensor of n weights at `nf4` dequantized: the layout and
 * the arithmetic of common/nf4.h (fp32: map[absq] * scale2 + offset per block
 * of 64, times the 4-bit code's value, each product and sum rounded as
 * written, then rounded to out's type), so every backend gives the bits of
 * zo_nf4_dequantize. nf4: zo_nf4_bytes(n) bytes of device memory,
 * ZO_NF4_ALIGN-aligned; QLoRA dequantizes a frozen weight with it just
 * before the GEMM that reads it. */
zo_status gpu_nf4_dequantize(gpu_stream_t s, gpu_tensor out, const void *nf4, size_t n);

/* ---- ops: optimizer ----------------------------------------------------------------
 * Adam / AdamW over fp32 master state kept on the device (an optimizer the
 * plan places on the GPU). Same update, operation order and per-step scalars
 * as cpu_adam (docs/cpu_adam.md), so a step on the device gives the same
 * bits as one on the CPU (the CPU backend does; CUDA does where its IEEE
 * operations and RNE conversions agree, which is everywhere but nan
 * payloads). Per element, with g the stored gradient:
 *     g  = g * grad_mult                 (1/loss_scale times the clip coefficient)
 *     g += weight_decay * p              (GPU_ADAM_DECAY_L2 only)
 *     m  = beta1 * m + (1 - beta1) * g
 *     v  = beta2 * v + (1 - beta2) * (g * g)
 *     d  = sqrt(v) * (1 / sqrt(1 - beta2^step)) + eps
 *     p  = p - (lr * weight_decay) * p   (GPU_ADAM_DECAY_ADAMW only)
 *     p  = p - (lr / (1 - beta1^step)) * (m / d)
 *     out16 = round_to_nearest_even(p)   (when out16.data is not NULL)
 * The scalars in parentheses are computed once per call in double and
 * rounded to float (by device.c, for every backend). */
typedef zo_adam_decay gpu_adam_decay; /* common/adam_math.h */
#define GPU_ADAM_DECAY_ADAMW ZO_ADAM_DECAY_ADAMW /* decoupled: p -= lr * weight_decay * p */
#define GPU_ADAM_DECAY_L2 ZO_ADAM_DECAY_L2       /* classic Adam: g += weight_decay * p */
typedef zo_adam_hparams gpu_adam_hparams;

/* One step over n elements, in place: param, m, v [n] fp32 device buffers;
 * grad [n] fp32, fp16 or bf16; out16 [n] fp16 or bf16 receives the updated
 * weights (out16.data NULL: no copy). The buffers must not overlap.
 * ZO_ERR_INVALID for hyperparameters out of range (as cpu_adam: lr, eps,
 * weight_decay finite and >= 0, betas in [0, 1), step >= 1, grad_mult > 0),
 * NULL buffers, dtypes or overlap. */
zo_status gpu_adam_update(gpu_stream_t s, const gpu_adam_hparams *hp, size_t n, float *param,
                          gpu_tensor grad, float *m, float *v, gpu_tensor out16);

/* The same update with m and v encoded (issue 30), as cpu_adam's
 * adam_state_update keeps them (docs/cpu_adam.md, "State encodings"):
 *   GPU_ADAM_STATE_F32   m, v fp32 (gpu_adam_update's state, in this
 *                        layout: for bf16 weights without a master);
 *   GPU_ADAM_STATE_BF16  m, v bf16: read widened, updated in fp32, stored
 *                        rounded to nearest even;
 *   GPU_ADAM_STATE_Q8    m, v block-wise 8-bit: per block of `block` values
 *                        one fp32 absmax per moment and a byte per value,
 *                        the index of the nearest value of bitsandbytes'
 *                        dynamic map (common/nf4.h: signed for m, unsigned
 *                        for v) to value / absmax; read back as
 *                        map[code] * absmax. The parameters are updated
 *                        from the unrounded fp32 moments; the new absmax is
 *                        the block's largest |m| (|v|), a nan largest.
 * `state` is one device buffer of `total` values in the layout
 * zo_adam_state_offsets_of gives (common/adam_math.h: m, v, then q8's
 * absmax of m and of v); the call updates its values [first, first + n),
 * with first a multiple of block and first + n a multiple of it or total
 * (q8: whole blocks). param [n] is fp32 (a master; out16 may take the
 * 16-bit copy) or bf16 (the weights themselves, no master: updated in
 * fp32 and stored rounded as `round` says). Weight decay applies to the
 * elements of the `n_decay` ranges [decay[k][0], decay[k][1]) of the call
 * (relative to first, ascending, disjoint), or to every element when
 * n_decay < 0; elsewhere the update is the one with weight_decay 0.
 * Without a master (param bf16) the new weight p is stored as `round` says,
 * the three ways of the host optimizer's --master (docs/cpu_adam.md):
 *   GPU_ADAM_ROUND_NEAREST     round to nearest even (--master none);
 *   GPU_ADAM_ROUND_STOCHASTIC  zo_f32_to_bf16_sr(p, zo_adam_sr_bits(sr_step,
 *                              sr_block, sr_first + i)) for element i of the
 *                              call (common/adam_math.h: the host's very
 *                              bits, so both agree bit for bit);
 *   GPU_ADAM_ROUND_KAHAN       the weight read is param + comp (fp32 sum of
 *                              the two bf16 values), and after the update
 *                              param = RN(p), comp = RN(p - param): comp
 *                              [n] bf16 beside the state, the compensation.
 * out16 takes the stored weight. ZO_ERR_INVALID as gpu_adam_update, and
 * for a bad type, block, range, decay range or rounding (not nearest with
 * fp32 param; kahan without comp, comp without kahan), or a state not
 * 4-byte aligned. */
typedef enum gpu_adam_state_type {
    GPU_ADAM_STATE_BF16 = 1,
    GPU_ADAM_STATE_Q8 = 2,
    GPU_ADAM_STATE_F32 = 3,
} gpu_adam_state_type;

typedef enum gpu_adam_round {
    GPU_ADAM_ROUND_NEAREST = 0,
    GPU_ADAM_ROUND_STOCHASTIC = 1,
    GPU_ADAM_ROUND_KAHAN = 2,
} gpu_adam_round;

#define GPU_ADAM_Q8_BLOCK_MAX 4096 /* the largest q8 block (cpu_adam's ADAM_Q8_BLOCK_MAX) */
#define GPU_ADAM_DECAY_RANGES 16   /* decay ranges one call takes at most */

typedef struct gpu_adam_state_desc {
    gpu_adam_state_type type;
    uint32_t block;  /* q8: values per absmax, a multiple of 64 up to GPU_ADAM_Q8_BLOCK_MAX; else 0 */
    uint64_t total;  /* values the state buffer holds */
    uint64_t first;  /* the call's first value */
    int n_decay;     /* < 0: every element decays */
    uint64_t decay[GPU_ADAM_DECAY_RANGES][2];
    gpu_adam_round round;                  /* bf16 param only (0: nearest) */
    uint64_t sr_step, sr_block, sr_first;  /* stochastic: the hash's step, block, element of the call's first value */
    uint16_t *comp;                        /* kahan: [n] bf16 device, the call's compensation; else NULL */
} gpu_adam_state_desc;

zo_status gpu_adam_state_update(gpu_stream_t s, const gpu_adam_hparams *hp,
                                const gpu_adam_state_desc *d, size_t n, gpu_tensor param,
                                gpu_tensor grad, void *state, gpu_tensor out16);

/* ---- ops: mixture of experts (Mixtral, Qwen2-MoE) -------------------------------------- */

/* How the router weighs the k experts it chooses (gpu_moe_router_*'s mode). */
typedef enum gpu_moe_route {
    GPU_MOE_ROUTE_SOFTMAX = 0, /* p of the softmax over all e experts (Qwen2-MoE's default) */
    /* p divided by the chosen ones' sum (Mixtral). Also gpt-oss's router
     * (top k of the logits, then a softmax over those k alone): the softmax
     * is monotone, so the same k, and p_i / sum of the chosen p_j =
     * exp(l_i) / sum of the chosen exp(l_j). Its router's linear bias is
     * the logits' (added before this op), not `gate.bias` below. */
    GPU_MOE_ROUTE_NORM = 1,
    /* Phi-3.5-MoE's sparsemixer in its eval form, k 2: i1 = argmax s (s the
     * row's logits, ties to the lower index), m = s_i1; every expert j with
     * (m - s_j) / max(|s_j|, m) > 2 eps (the ratio in double) is masked out,
     * w1 = the softmax over the rest at i1; then with s_i1 set to -inf the
     * same from the new maximum (i2, its mask over the other logits) gives
     * w2. Not renormalized over the two. */
    GPU_MOE_ROUTE_SPARSEMIXER = 2,
    /* DeepSeek-V3's scores: s = the sigmoid of each logit (not a softmax);
     * the chosen experts weigh s, or with SIGMOID_NORM s divided by the
     * chosen ones' sum plus 1e-20 */
    GPU_MOE_ROUTE_SIGMOID = 3,
    GPU_MOE_ROUTE_SIGMOID_NORM = 4,
} gpu_moe_route;

/* How the router chooses and weighs: gpu_moe_router_*'s `gate`.
 * The choice ranks each expert by its key, its score (the softmax's p, or
 * the sigmoid's s) plus bias[j] when a bias is given; the weights are the
 * scores themselves (the bias never enters them). With groups > 1 the e
 * experts form `groups` groups of e / groups in index order, each group
 * scored by its largest key (the softmax modes: DeepSeek-V2's
 * group_limited_greedy) or its two largest keys' sum (the sigmoid modes:
 * V3's noaux_tc); the topk_groups best groups (ties to the lower index)
 * hold the only experts the top k is taken from (k <= topk_groups x
 * e / groups). The weights end times `scale` (routed_scaling_factor),
 * after any normalization. The sparsemixer takes none of groups, bias or
 * scale. */
typedef struct gpu_moe_gate {
    gpu_moe_route mode;
    float eps;         /* the sparsemixer's jitter eps (read by it alone) */
    int groups;        /* 0 or 1: one group of all e; at most 64 */
    int topk_groups;   /* with groups > 1: 1 to groups */
    float scale;       /* 0 or 1: none */
    const float *bias; /* [e] fp32 device memory; NULL: none */
} gpu_moe_gate;

/* The router of n tokens over e experts, as Hugging Face's Mixtral,
 * Qwen2-MoE, PhiMoE and DeepSeek's MoE gates: the scores of each row (p =
 * softmax(logits row) over all e experts, or the sigmoid modes' s), the k
 * best keys chosen (ties: the lower index; `gate` says which keys may
 * compete), weighed as `gate` says. weights [n, e] fp32 gets those weights
 * and 0 for the experts not chosen; logits [n, e] fp32. order [n, e] bytes
 * (NULL: not written) gets each chosen expert's place in the row's choice,
 * 0 for the first chosen (the largest key; the sparsemixer's i1) to k - 1,
 * and GPU_MOE_NOT_CHOSEN for the others: the order capacity-limited
 * routing keeps choices by, which the weights do not carry (the
 * sparsemixer's w2 may exceed its w1; Mixtral's renormalized weights can
 * round two p to one value; a bias reorders). stats [groups, 2 e] fp32
 * receives the load-balancing loss's counts of each group of group_rows
 * rows (row r in group r / group_rows, groups = ceil(n / group_rows):
 * DeepSeek's sequences; group_rows >= n: one group): stats[g, j] = sum
 * over the group's rows of the score of j (p, or s), stats[g, e + j] = the
 * group's rows that chose j (written, not accumulated). */
#define GPU_MOE_NOT_CHOSEN 0xff /* (so k <= 255 with an order) */
zo_status gpu_moe_router_forward(gpu_stream_t s, gpu_tensor weights, gpu_tensor logits,
                                 float *stats, uint8_t *order, int n, int e, int k,
                                 const gpu_moe_gate *gate, int group_rows);
/* Its backward: dlogits [n, e] fp32 = the gradient of the loss through the
 * chosen weights (dweights [n, e] fp32, read at the chosen experts only),
 * the choice held constant (the same choice as the forward's, from the
 * same logits and gate): the softmax's backward of dp (with NORM the
 * normalization's backward first), or each chosen s's sigmoid backward
 * (with SIGMOID_NORM the normalization's first); the gate's scale
 * multiplies dweights first; with SPARSEMIXER each weight's masked
 * softmax's backward, its mask and the choices held as constants. Plus,
 * when aux_scale is not 0 (the softmax modes only), the load-balancing
 * loss's aux_scale * C_j added to dp for every expert (through the
 * softmax over all e), C_j the rows of row r's group (r / group_rows, as
 * the forward's) that chose j, summed over `layers` layers of stats
 * ([layers, groups, 2 e], as the forward wrote them). */
zo_status gpu_moe_router_backward(gpu_stream_t s, gpu_tensor dlogits, gpu_tensor dweights,
                                  gpu_tensor logits, const float *stats, int n, int e, int k,
                                  const gpu_moe_gate *gate, int layers, int group_rows,
                                  float aux_scale);
/* An expert's output weighted per token: y[r, j] = g(scale[r * lds]) x[r, j]
 * for n rows of c columns (y, x [n, c]); g the identity, or the sigmoid
 * (sigmoid 1: Qwen2-MoE's gate on the shared expert). scale fp32. */
zo_status gpu_moe_scale_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor x, const float *scale,
                                int n, int c, int64_t lds, int sigmoid);
/* Its backward: dscale[r * lds] = g'(scale) sum_j dy[r, j] x[r, j] (written;
 * g' for the identity is 1) and dx = g(scale) dy (dx may be dy). */
zo_status gpu_moe_scale_backward(gpu_stream_t s, gpu_tensor dx, float *dscale, gpu_tensor dy,
                                 gpu_tensor x, const float *scale, int n, int c, int64_t lds,
                                 int sigmoid);
/* The tokens of an expert, packed: y[i, :] = x[idx[i], :] for n rows of c
 * columns (idx int32 device array of n rows of x). */
zo_status gpu_moe_gather(gpu_stream_t s, gpu_tensor y, gpu_tensor x, const int32_t *idx, int n, int c);
/* Back to their places: y[idx[i] * ldy + j] += x[i * c + j] (ldy >= c);
 * idx must not repeat a row (one expert's tokens), so rows are added
 * without a race and in one order. */
zo_status gpu_moe_scatter_add(gpu_stream_t s, gpu_tensor y, gpu_tensor x, const int32_t *idx, int n,
                              int c, int64_t ldy);

#endif
