/* Private to the CUDA backend: the contexts behind the handles, the check
 * helpers that turn CUDA/cuBLAS results into zo_status, and one launcher per
 * kernel family (each takes a stream, launches, and checks cudaGetLastError
 * right after the launch). device_cuda.c and gpu/cuda/<family>.cu include
 * this; nothing else does, except under ZO_CUDA_SHIM: then the CUDA types
 * are the shim's stand-ins (plain C11 may include this) and every function
 * below is named shim_* (gpu/cuda/shim/shim_names.h), the kernels' host
 * copies in zo_cuda_shim (docs/gpu-cuda.md, "The host shim"). */
#ifndef ZO_GPU_CUDA_IMPL_H
#define ZO_GPU_CUDA_IMPL_H

#include <stddef.h>
#include <stdint.h>

#ifdef ZO_CUDA_SHIM
#include "gpu/cuda/shim/cuda_shim_types.h" /* defines: cudaStream_t, cudaError_t, ... stand-ins */
#include "gpu/cuda/shim/shim_names.h"      /* defines: cuda_launch_* -> shim_launch_* */
#else
#include <cublasLt.h>         /* defines: cublasLtHandle_t, cublasStatus_t */
#include <cuda_runtime_api.h> /* defines: cudaStream_t, cudaError_t */
#endif

#ifdef __cplusplus
extern "C" {
#endif

#include "gpu/device_impl.h" /* defines: gpu_tensor, gpu_gemm_desc, gpu_attn_desc, structs */

/* ---- errors found while running ---------------------------------------------
 * A kernel that meets a bad id (a token outside [0, vocab), a target outside
 * [-1, v)) records it in its stream's record in device memory and skips the
 * row; gpu_stream_synchronize copies the record back (in stream order, before
 * it waits) and turns it into the stream's sticky error. `code` is claimed
 * with atomicCAS, so only the first recorder writes the rest. */
enum cuda_err_op {
    CUDA_ERR_NONE = 0,
    CUDA_ERR_EMBEDDING_FORWARD,
    CUDA_ERR_EMBEDDING_BACKWARD,
    CUDA_ERR_CE_FORWARD,
    CUDA_ERR_CE_BACKWARD,
    CUDA_ERR_ATTN_CACHED, /* index: the sequence, value: its first position */
    CUDA_ERR_ROPE_SEQ,      /* the same, of gpu_rope_forward_seq */
    CUDA_ERR_EMBEDDING_POS, /* the same, of gpu_embedding_forward_seq */
};

typedef struct cuda_err_rec {
    int code;  /* a cuda_err_op, 0 = no error */
    int index; /* the row of the bad id */
    int value; /* the bad id */
    int limit; /* the exclusive upper bound it broke */
} cuda_err_rec;

/* ---- the contexts behind the opaque handles ----------------------------------- */

typedef struct cuda_alloc_node cuda_alloc_node; /* pointer -> size, for the counters */

#define CUDA_ALLOC_BUCKETS 4096
#define CUDA_SUMSQ_BLOCKS 512         /* fixed partial count: a fixed reduction order */
#define CUDA_LT_WORKSPACE (32u << 20) /* cuBLASLt workspace per stream (Hopper: 32 MiB) */

typedef struct cuda_ctx {
    int device;
    void *lock; /* pthread_mutex_t *, guards the counters and the map */
    size_t capacity, in_use, high_water, n_allocs, host_pinned;
    cuda_alloc_node *buckets[CUDA_ALLOC_BUCKETS];
    cudaMemPool_t pool;          /* this device's own stream-ordered pool */
    cudaStream_t alloc_stream;   /* gpu_mem_alloc/free (no stream of their own) */
    cublasLtHandle_t lt;
    struct cuda_attn_tune *attn_tune; /* ZO_ATTENTION=tune's choices on this device (ops_cuda.h) */
} cuda_ctx;

typedef struct cuda_stream {
    cudaStream_t stream;
    cuda_err_rec *err_dev;  /* the kernels' record (device memory) */
    cuda_err_rec *err_host; /* its copy, read after a synchronize (pinned) */
    double *partials;       /* [CUDA_SUMSQ_BLOCKS] for gpu_sum_squares */
    void *workspace;        /* [CUDA_LT_WORKSPACE] bytes for cuBLASLt */
} cuda_stream;

typedef struct cuda_event {
    cudaEvent_t event;
} cuda_event;

/* ---- check helpers ------------------------------------------------------------- */

/* ZO_OK for cudaSuccess, else ZO_ERR_DEVICE "<call>: <error string> (<name>)". */
zo_status cuda_status(cudaError_t e, const char *call);
#ifndef ZO_CUDA_SHIM
/* The same for cuBLAS(Lt) results. */
zo_status cuda_blas_status(cublasStatus_t e, const char *call);
#endif
/* cudaGetLastError() right after a launch of `kernel`. */
zo_status cuda_launch_check(const char *kernel);

/* ---- a stopwatch on a stream: the attention's tuning (ops_cuda.c) -------------------
 * start records an event on the stream; stop records a second one, waits
 * for it on the host and gives the device time between the two in
 * microseconds, then frees both (also when it fails). The shim, whose
 * kernels have run when their launch returns, reads the host's monotonic
 * clock instead (gpu/cuda/shim/cuda_shim.cc). Not inside a stream capture:
 * start refuses a stream being captured (ZO_ERR_UNSUPPORTED). */
typedef struct cuda_stopwatch {
    cudaEvent_t start, stop; /* the GPU's */
    double t0;               /* the shim's: the host clock at start, microseconds */
} cuda_stopwatch;
zo_status cuda_stopwatch_start(cudaStream_t st, cuda_stopwatch *w);
zo_status cuda_stopwatch_stop(cudaStream_t st, cuda_stopwatch *w, double *us);

/* ---- launchers (gpu/cuda/<family>.cu). Arguments as the public op of the
 * same name in gpu/device.h, already checked by device.c. ------------------------ */

/* gemm.cu: cuBLASLt with fp32 accumulation (TF32 for fp32 inputs; an fp32
 * operand beside a 16-bit one is rounded to 16 bits in scratch from `pool`);
 * dtype combinations cuBLASLt lacks, or shapes it finds no algorithm for,
 * go to a plain tiled kernel with fp32 accumulation. */
#ifndef ZO_CUDA_SHIM /* the shim has no cuBLASLt: the tiled kernel only */
zo_status cuda_gemm(cudaStream_t st, cublasLtHandle_t lt, cudaMemPool_t pool, void *workspace,
                    size_t ws_bytes, const gpu_gemm_desc *d);
#endif
zo_status cuda_launch_gemm_tiled(cudaStream_t st, const gpu_gemm_desc *d);
#ifdef ZO_CUDA_SHIM
/* The shim's stand-in for cuBLASLt where a kernel family calls it (the
 * attention's GEMM path): gemm_tiled_kernel's products bit for bit (each
 * element's fp32 sum in the kernel's order, then alpha and beta as it
 * applies them), as a host loop vectorized across columns instead of a
 * launch of fibers (gpu/cuda/shim/gemm.cc; tests/test_cuda_shim.c checks
 * the bits against the kernel). */
zo_status cuda_gemm_host(const gpu_gemm_desc *d);
#endif

/* bias.cu */
zo_status cuda_launch_bias_forward(cudaStream_t st, gpu_tensor y, gpu_tensor bias, int n, int c,
                                   int64_t ldy);
/* The column sums in two stages through scratch (the stream's workspace),
 * as the norms' parameter gradients: cuda_launch_column_sums. */
zo_status cuda_launch_bias_backward(cudaStream_t st, void *scratch, size_t scratch_bytes, gpu_tensor dbias,
                                    gpu_tensor dy, int n, int c, int64_t lddy);

/* norm.cu */
zo_status cuda_launch_layernorm_forward(cudaStream_t st, gpu_tensor y, float *mean, float *rstd,
                                        gpu_tensor x, gpu_tensor w, gpu_tensor b, int n, int c,
                                        float eps);
/* The backwards take scratch for their parameter gradients' partials (the
 * stream's workspace): up to 1024 row chunks of c fp32 for each of dw and db
 * given (NULL data: not computed), fewer where fewer fit. */
zo_status cuda_launch_layernorm_backward(cudaStream_t st, void *scratch, size_t scratch_bytes,
                                         gpu_tensor dx, gpu_tensor dw, gpu_tensor db, gpu_tensor dy,
                                         gpu_tensor x, gpu_tensor w, const float *mean,
                                         const float *rstd, int n, int c);
zo_status cuda_launch_rmsnorm_forward(cudaStream_t st, gpu_tensor y, float *rstd, gpu_tensor x,
                                      gpu_tensor w, int n, int c, float eps);
zo_status cuda_launch_rmsnorm_backward(cudaStream_t st, void *scratch, size_t scratch_bytes,
                                       gpu_tensor dx, gpu_tensor dw, gpu_tensor dy, gpu_tensor x,
                                       gpu_tensor w, const float *rstd, int n, int c);
/* dw += the column sums of dy * (x - mean) * rstd, db += those of dy, over
 * n rows of `heads` heads of c (dy rows of stride ldy, x [n*heads, c], mean
 * NULL: RMSNorm; NULL data: not computed), in a fixed order through partials
 * in scratch: the norms' parameter gradients and the bias's. */
zo_status cuda_launch_column_sums(cudaStream_t st, void *scratch, size_t scratch_bytes, gpu_tensor dw,
                                  gpu_tensor db, gpu_tensor dy, int64_t ldy, gpu_tensor x, const float *mean,
                                  const float *rstd, int n, int heads, int c);
/* the same with a statistic every sd columns (sd divides c): column j of
 * head-row ri takes mean and rstd at ri*(c/sd) + j/sd (the per-head
 * weights of gpu_head_norm_backward, heads side by side) */
zo_status cuda_launch_column_sums_sd(cudaStream_t st, void *scratch, size_t scratch_bytes, gpu_tensor dw,
                                     gpu_tensor db, gpu_tensor dy, int64_t ldy, gpu_tensor x, const float *mean,
                                     const float *rstd, int n, int heads, int c, int sd);
zo_status cuda_launch_head_norm_forward(cudaStream_t st, gpu_tensor x, int64_t ldx, gpu_tensor saved, float *rstd,
                                        gpu_tensor w, int64_t w_stride, int n, int heads, int d, float eps,
                                        int centered);
zo_status cuda_launch_head_norm_backward(cudaStream_t st, void *scratch, size_t scratch_bytes, gpu_tensor dx,
                                         int64_t ldx, gpu_tensor dw, gpu_tensor saved, gpu_tensor w,
                                         int64_t w_stride, const float *rstd, int n, int heads, int d,
                                         int centered);

/* attention.cu: head dims up to CUDA_ATTN_MAX_D; the cached attention's up
 * to CUDA_ATTN_CACHED_MAX_D (latent attention's cache rows: DeepSeek-V2's
 * qk_rope + kv_lora_rank, 576) */
#define CUDA_ATTN_MAX_D 256
#define CUDA_ATTN_CACHED_MAX_D 1024
zo_status cuda_launch_attention_forward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out,
                                        float *lse, gpu_tensor qkv);
zo_status cuda_launch_attention_backward(cudaStream_t st, const gpu_attn_desc *a,
                                         gpu_tensor dqkv, gpu_tensor dout, gpu_tensor qkv,
                                         gpu_tensor out, const float *lse);

/* attention sinks (gpu/device.h), around any path's kernels: the forward's
 * out rows rescaled and lse raised to include the sink (out rounded twice
 * when 16-bit); the backward's dsinks from dout, the forward's out and lse */
zo_status cuda_launch_attention_sink_forward(cudaStream_t st, const gpu_attn_desc *a, gpu_tensor out,
                                             float *lse, const float *sinks);
zo_status cuda_launch_attention_sink_backward(cudaStream_t st, const gpu_attn_desc *a, float *dsinks,
                                              const float *sinks, gpu_tensor dout, gpu_tensor out,
                                              const float *lse);

/* the cache's rows: a sequence whose positions leave the cache is recorded
 * in err (CUDA_ERR_ATTN_CACHED) and skipped; sinks fp32 [hq] or NULL */
zo_status cuda_launch_attention_cached(cudaStream_t st, cuda_err_rec *err, const gpu_attn_desc *a,
                                       gpu_tensor out, gpu_tensor qkv, gpu_tensor k_cache,
                                       gpu_tensor v_cache, const int32_t *pos, const float *sinks, int tc);

/* attention_gemm.cu: the same ops for 16-bit qkv through batched GEMMs
 * (cuBLASLt with an lt handle, else the tiled kernel) and stream-ordered
 * scratch from `pool`, at most `cap` bytes of scores per chunk
 * (attention_gemm.h). ops_cuda.c chooses between the two. */
typedef struct cuda_gemm_env {
    cudaStream_t stream;
    cublasLtHandle_t lt; /* NULL: the tiled kernel */
    cudaMemPool_t pool;  /* the scratch's */
    void *workspace;     /* cuBLASLt's, ws_bytes */
    size_t ws_bytes;
    size_t cap;          /* 0: CUDA_ATTN_GEMM_CAP */
} cuda_gemm_env;
zo_status cuda_launch_attention_gemm_forward(const cuda_gemm_env *g, const gpu_attn_desc *a, gpu_tensor out,
                                             float *lse, gpu_tensor qkv);
zo_status cuda_launch_attention_gemm_backward(const cuda_gemm_env *g, const gpu_attn_desc *a, gpu_tensor dqkv,
                                              gpu_tensor dout, gpu_tensor qkv, gpu_tensor out,
                                              const float *lse);

/* rope.cu */
/* seq_pos (NULL: none) each in [0, n_pos - t], else recorded in err */
zo_status cuda_launch_rope(cudaStream_t st, cuda_err_rec *err, gpu_tensor x, int n, int t, int n_heads, int d,
                           int64_t ldx, int64_t ldh, float theta, int pos0, const int32_t *seq_pos, int n_pos,
                           const double *inv_freq, float scale, int inverse);

/* activation.cu */
/* form: GPU_ACT_GELU_TANH, GPU_ACT_GELU_ERF or GPU_ACT_RELU (gpu/device.h) */
zo_status cuda_launch_gelu_forward(cudaStream_t st, gpu_tensor y, gpu_tensor x, size_t n, int form);
zo_status cuda_launch_gelu_backward(cudaStream_t st, gpu_tensor dx, gpu_tensor dy, gpu_tensor x,
                                    size_t n, int form);
/* gelu: GeGLU (gelu_tanh(gate) * up) in place of SwiGLU */
/* gelu: the GLU's form (GPU_GLU_*); limit and alpha the clamped form's */
zo_status cuda_launch_swiglu_forward(cudaStream_t st, gpu_tensor y, gpu_tensor gate,
                                     gpu_tensor up, size_t n, int gelu, float limit, float alpha);
zo_status cuda_launch_swiglu_backward(cudaStream_t st, gpu_tensor dgate, gpu_tensor dup,
                                      gpu_tensor dy, gpu_tensor gate, gpu_tensor up, size_t n,
                                      int gelu, float limit, float alpha);

/* moe.cu */
zo_status cuda_launch_moe_router_forward(cudaStream_t st, void *ws, size_t ws_bytes, gpu_tensor weights,
                                         gpu_tensor logits, float *stats, uint8_t *order, int n, int e, int k,
                                         const gpu_moe_gate *g, int group_rows);
zo_status cuda_launch_moe_router_backward(cudaStream_t st, gpu_tensor dlogits, gpu_tensor dweights,
                                          gpu_tensor logits, const float *stats, int n, int e,
                                          int k, const gpu_moe_gate *g, int layers, int group_rows,
                                          float aux_scale);
zo_status cuda_launch_moe_scale_forward(cudaStream_t st, gpu_tensor y, gpu_tensor x,
                                        const float *scale, int n, int c, int64_t lds, int sigmoid);
zo_status cuda_launch_moe_scale_backward(cudaStream_t st, gpu_tensor dx, float *dscale,
                                         gpu_tensor dy, gpu_tensor x, const float *scale, int n,
                                         int c, int64_t lds, int sigmoid);
zo_status cuda_launch_moe_gather(cudaStream_t st, gpu_tensor y, gpu_tensor x, const int32_t *idx,
                                 int n, int c);
zo_status cuda_launch_moe_scatter_add(cudaStream_t st, gpu_tensor y, gpu_tensor x,
                                      const int32_t *idx, int n, int c, int64_t ldy);

/* embedding.cu: the backward sorts the rows by token in `workspace` (the
 * stream's cuBLASLt workspace, free between GEMMs on the same stream) */
zo_status cuda_launch_embedding_forward(cudaStream_t st, cuda_err_rec *err, gpu_tensor out,
                                        const int32_t *tokens, gpu_tensor wte, gpu_tensor wpe,
                                        const int32_t *pos, int n_pos, int n, int t, int c, int vocab);
zo_status cuda_launch_embedding_backward(cudaStream_t st, cuda_err_rec *err, void *workspace,
                                         size_t ws_bytes, gpu_tensor dwte, gpu_tensor dwpe,
                                         gpu_tensor dout, const int32_t *tokens, int n, int t,
                                         int c, int vocab);

/* loss.cu */
zo_status cuda_launch_cross_entropy_forward(cudaStream_t st, cuda_err_rec *err, float *losses,
                                            gpu_tensor logits, const int32_t *targets, int n,
                                            int v, float cap);
zo_status cuda_launch_cross_entropy_backward(cudaStream_t st, cuda_err_rec *err,
                                             gpu_tensor dlogits, gpu_tensor logits,
                                             const int32_t *targets, float dloss, int n, int v, float cap);

/* elementwise.cu */
zo_status cuda_launch_add(cudaStream_t st, gpu_tensor y, gpu_tensor a, gpu_tensor b, size_t n);
zo_status cuda_launch_scale(cudaStream_t st, gpu_tensor x, float alpha, size_t n);
zo_status cuda_launch_softcap(cudaStream_t st, gpu_tensor x, float cap, size_t n);
zo_status cuda_launch_cast(cudaStream_t st, gpu_tensor dst, gpu_tensor src, size_t n);
zo_status cuda_launch_head_copy(cudaStream_t st, gpu_tensor y, gpu_tensor x, int n, int heads, int w,
                                int fill, int64_t ldy, int64_t hsy, int64_t ldx, int64_t hsx);

/* reduce.cu */
zo_status cuda_launch_check_finite(cudaStream_t st, int32_t *flag, gpu_tensor x, size_t n);
zo_status cuda_launch_sum_squares(cudaStream_t st, double *sum, gpu_tensor x, size_t n,
                                  double *partials);

/* nf4.cu: common/nf4.c's arithmetic with explicitly rounded intrinsics */
zo_status cuda_launch_nf4_dequantize(cudaStream_t st, gpu_tensor out, const void *nf4, size_t n);

/* adam.cu: cpu_adam's operation order with explicitly rounded intrinsics */
zo_status cuda_launch_adam_update(cudaStream_t st, const gpu_adam_consts *c, size_t n,
                                  float *param, gpu_tensor grad, float *m, float *v,
                                  gpu_tensor out16);
/* ... and over bf16 or 8-bit m and v (gpu_adam_state_update) */
zo_status cuda_launch_adam_state_update(cudaStream_t st, const gpu_adam_state_args *x, size_t n,
                                        gpu_tensor param, gpu_tensor grad, void *state, gpu_tensor out16,
                                        void *comp);

#ifdef __cplusplus
}
#endif

#endif
