/* The CPU kernels, synchronous: each runs on the calling thread with an
 * OpenMP team of `nt` threads and returns when done. device_cpu.c enqueues
 * them on stream worker threads; tests and benchmarks may call them directly.
 *
 * Every kernel uses static schedules and reduces in a fixed order, so its
 * result does not depend on `nt`. Arguments are those of the public op of
 * the same name (gpu/device.h), already checked.
 *
 * Kernels that need working memory take a scratch arena (one per stream in
 * device_cpu.c) and reserve it before their parallel region, so no thread
 * allocates; when the host is out of memory they return ZO_ERR_NOMEM with a
 * message naming the op and the size, and write nothing. */
#ifndef ZO_GPU_OPS_CPU_H
#define ZO_GPU_OPS_CPU_H

#include "gpu/device.h"
#include "gpu/device_impl.h" /* defines: gpu_adam_consts */
#include "gpu/ops.h"         /* defines: gpu_adam_state_args */

/* ---- scratch arena ----------------------------------------------------------- */

/* One growing block: a reservation frees it and allocates a larger one when
 * it is too small, so a stream's ops reach a steady size and then allocate
 * nothing. Not thread-safe: one user (a stream worker) at a time. */
typedef struct cpu_scratch {
    void *base;
    size_t cap;
    /* (test seam) asked before every reservation; nonzero fails it exactly
     * as a failed host allocation would. NULL in normal use. */
    int (*fail)(void *arg);
    void *fail_arg;
    int tf32; /* the device's gpu_cpu_options.tf32, which cpu_gemm reads */
} cpu_scratch;

/* The team an op with thread count nt runs on: nt, or OpenMP's default
 * where nt is 0 (a device opened without a count). */
int cpu_team(int nt);

/* The threads of a team that run an op of `work` element operations (an
 * element of an elementwise op, a multiply-add of a product): the team when
 * each thread gets CPU_MIN_WORK of it or more, fewer below, one for an op
 * under twice that. Waking a sleeping thread for a few microseconds of work
 * cost more than the work (test_master_training: 50,000 parallel regions,
 * 160,000 context switches in 4 s). Scratch stays reserved for the whole
 * team, and every op's result is the same at any thread count, so only the
 * time changes. */
#define CPU_MIN_WORK 65536.0
int cpu_run_team(int team, double work);

void cpu_scratch_init(cpu_scratch *ws);
void cpu_scratch_free(cpu_scratch *ws);
/* *out = at least `bytes` bytes, 64-byte aligned, valid until the next
 * reservation. `op` names the caller in the ZO_ERR_NOMEM message. */
zo_status cpu_scratch_reserve(cpu_scratch *ws, size_t bytes, const char *op, void **out);

/* ---- fault injection (tests): a mock of a host running out of memory --------- */

/* After `*_skip` more successful calls, the next `*_fail` calls fail:
 * `scratch_*` counts scratch reservations of the ops on any stream of the
 * device, `alloc_*` counts gpu_mem_alloc and gpu_host_alloc (both
 * ZO_ERR_NOMEM), `copy_*` gpu_memcpy_async on any stream (ZO_ERR_DEVICE,
 * as a failing device's copy; nothing is enqueued). Zero fail counts turn
 * injection off. */
typedef struct gpu_cpu_faults {
    int scratch_skip, scratch_fail;
    int alloc_skip, alloc_fail;
    int copy_skip, copy_fail;
} gpu_cpu_faults;

/* Replace the device's fault plan. ZO_ERR_INVALID unless `dev` is a CPU
 * device. */
zo_status gpu_cpu_inject_faults(gpu_device_t dev, const gpu_cpu_faults *f);

/* ---- kernels ------------------------------------------------------------------ */

/* C = alpha op(A) op(B) + beta C: OpenBLAS where it is faster and was built
 * in, else the own packed kernel (docs/gpu.md: the rule, and why the bits
 * stay independent of nt either way). */
zo_status cpu_gemm(cpu_scratch *ws, const gpu_gemm_desc *d, int nt);
/* x rounded to TF32 (1 sign, 8 exponent, 10 mantissa bits, kept in an fp32):
 * to nearest, ties away from zero; infinities and nan unchanged, a value
 * past TF32's largest finite one rounds to infinity. What cpu_gemm does to
 * fp32 operands on a device opened with gpu_cpu_options.tf32. */
float cpu_tf32_round(float x);
/* Which implementation cpu_gemm runs. AUTO: the dispatch rule, today the
 * same as BLAS (the library was faster wherever measured); OWN: the own
 * kernel always; BLAS: the library for every product it can take (the own
 * kernel for the rest: no usable library, leading dimensions past INT_MAX). */
typedef enum cpu_gemm_impl { CPU_GEMM_AUTO = 0, CPU_GEMM_OWN, CPU_GEMM_BLAS } cpu_gemm_impl;
/* (tests, benchmarks) Set it for the whole process, from then on; the
 * environment's ZO_CPU_GEMM=own|blas|auto gives the first value. */
void cpu_gemm_set_impl(cpu_gemm_impl impl);
/* The register kernel under the own GEMM and the attention blocks: AUTO the
 * machine's best (AVX2 where there is AVX2 and FMA but no AVX-512; the
 * environment's ZO_CPU_KERNEL=generic keeps the generic one), GENERIC the
 * portable one (AVX-512 or plain x86-64), AVX2 the AVX2 one. A column's
 * bits are the same on both where both use FMA. */
typedef enum cpu_gemm_kernel { CPU_KERNEL_AUTO = -1, CPU_KERNEL_GENERIC = 0, CPU_KERNEL_AVX2 } cpu_gemm_kernel;
/* (tests, benchmarks) Set it for the whole process; returns the kernel
 * that runs (GENERIC where the AVX2 one is asked for on a machine without
 * AVX2 and FMA). */
cpu_gemm_kernel cpu_gemm_set_kernel(cpu_gemm_kernel k);
/* The library cpu_gemm can call, as "OpenBLAS 0.3.21 (SkylakeX kernels,
 * OpenMP build)"; NULL without one it can use (not built with one, or a
 * serial build, which is not safe to call from several threads at once). */
const char *cpu_gemm_blas(void);
/* The plain triple loop (fp32 accumulation): the readable statement of the
 * contract beside the fast paths (test_gpu checks it like them). */
void cpu_gemm_naive(const gpu_gemm_desc *d);

zo_status cpu_bias_forward(cpu_scratch *ws, gpu_tensor y, gpu_tensor bias, int n, int c,
                           int64_t ldy, int nt);
void cpu_bias_backward(gpu_tensor dbias, gpu_tensor dy, int n, int c, int64_t lddy, int nt);
zo_status cpu_layernorm_forward(cpu_scratch *ws, gpu_tensor y, float *mean, float *rstd,
                                gpu_tensor x, gpu_tensor w, gpu_tensor b, int n, int c, float eps,
                                int nt);
zo_status cpu_layernorm_backward(cpu_scratch *ws, gpu_tensor dx, gpu_tensor dw, gpu_tensor db,
                                 gpu_tensor dy, gpu_tensor x, gpu_tensor w, const float *mean,
                                 const float *rstd, int n, int c, int nt);
zo_status cpu_rmsnorm_forward(cpu_scratch *ws, gpu_tensor y, float *rstd, gpu_tensor x,
                              gpu_tensor w, int n, int c, float eps, int nt);
zo_status cpu_rmsnorm_backward(cpu_scratch *ws, gpu_tensor dx, gpu_tensor dw, gpu_tensor dy,
                               gpu_tensor x, gpu_tensor w, const float *rstd, int n, int c,
                               int nt);
zo_status cpu_head_norm_forward(cpu_scratch *ws, gpu_tensor x, int64_t ldx, gpu_tensor saved, float *rstd,
                                gpu_tensor w, int64_t w_stride, int n, int heads, int d, float eps, int centered,
                                int nt);
zo_status cpu_head_norm_backward(cpu_scratch *ws, gpu_tensor dx, int64_t ldx, gpu_tensor dw, gpu_tensor saved,
                                 gpu_tensor w, int64_t w_stride, const float *rstd, int n, int heads, int d,
                                 int centered, int nt);
zo_status cpu_attention_forward(cpu_scratch *ws, const gpu_attn_desc *a, gpu_tensor out,
                                float *lse, gpu_tensor qkv, int nt);
zo_status cpu_attention_backward(cpu_scratch *ws, const gpu_attn_desc *a, gpu_tensor dqkv,
                                 gpu_tensor dout, gpu_tensor qkv, gpu_tensor out,
                                 const float *lse, int nt);
zo_status cpu_attention_cached(cpu_scratch *ws, const gpu_attn_desc *a, gpu_tensor out, gpu_tensor qkv,
                               gpu_tensor k_cache, gpu_tensor v_cache, const int32_t *pos, int tc, int nt);
/* seq_pos (NULL: none): a position a sequence of t rows, added to pos0,
 * each in [0, n_pos - t] (else an error naming it, nothing turned) */
zo_status cpu_rope(cpu_scratch *ws, gpu_tensor x, int n, int t, int n_heads, int d, int64_t ldx,
                   int64_t ldh, float theta, int pos0, const int32_t *seq_pos, int n_pos, const double *inv_freq,
                   float scale, int inverse, int nt);
/* exact: the erf form in place of the tanh form */
/* form: GPU_ACT_GELU_TANH, GPU_ACT_GELU_ERF or GPU_ACT_RELU (gpu/device.h) */
void cpu_gelu_forward(gpu_tensor y, gpu_tensor x, size_t n, int form, int nt);
void cpu_gelu_backward(gpu_tensor dx, gpu_tensor dy, gpu_tensor x, size_t n, int form, int nt);
/* gelu: GeGLU (gelu_tanh(gate) * up) in place of SwiGLU */
/* gelu: the GLU's form (GPU_GLU_*); limit and alpha the clamped form's */
void cpu_swiglu_forward(gpu_tensor y, gpu_tensor gate, gpu_tensor up, size_t n, int gelu, float limit,
                        float alpha, int nt);
void cpu_swiglu_backward(gpu_tensor dgate, gpu_tensor dup, gpu_tensor dy, gpu_tensor gate,
                         gpu_tensor up, size_t n, int gelu, float limit, float alpha, int nt);
/* pos (NULL: none): a position a sequence of t rows into wpe's n_pos
 * rows, each in [0, n_pos - t] (else an error naming it, nothing written) */
zo_status cpu_embedding_forward(cpu_scratch *ws, gpu_tensor out, const int32_t *tokens,
                                gpu_tensor wte, gpu_tensor wpe, const int32_t *pos, int n_pos, int n, int t,
                                int c, int vocab, int nt);
zo_status cpu_embedding_backward(cpu_scratch *ws, gpu_tensor dwte, gpu_tensor dwpe,
                                 gpu_tensor dout, const int32_t *tokens, int n, int t, int c,
                                 int vocab, int nt);
zo_status cpu_cross_entropy_forward(cpu_scratch *ws, float *losses, gpu_tensor logits,
                                    const int32_t *targets, int n, int v, float cap, int nt);
zo_status cpu_cross_entropy_backward(cpu_scratch *ws, gpu_tensor dlogits, gpu_tensor logits,
                                     const int32_t *targets, float dloss, int n, int v, float cap, int nt);
void cpu_add(gpu_tensor y, gpu_tensor a, gpu_tensor b, size_t n, int nt);
void cpu_scale(gpu_tensor x, float alpha, size_t n, int nt);
void cpu_softcap(gpu_tensor x, float cap, size_t n, int nt);
void cpu_cast(gpu_tensor dst, gpu_tensor src, size_t n, int nt);
void cpu_head_copy(gpu_tensor y, gpu_tensor x, int n, int heads, int w, int fill, int64_t ldy, int64_t hsy,
                   int64_t ldx, int64_t hsx, int nt);
void cpu_check_finite(int32_t *flag, gpu_tensor x, size_t n, int nt);
zo_status cpu_sum_squares(cpu_scratch *ws, double *sum, gpu_tensor x, size_t n, int nt);
/* zo_nf4_dequantize (common/nf4.c, whose rounding the CUDA kernel matches) */
void cpu_nf4_dequantize(gpu_tensor out, const void *nf4, size_t n, int nt);
/* ops_cpu_adam.c (built with -ffp-contract=off, unlike this file's GEMM):
 * gpu_adam_update, element by element in cpu_adam's scalar order. */
void cpu_adam_update(const gpu_adam_consts *c, size_t n, float *param, gpu_tensor grad, float *m,
                     float *v, gpu_tensor out16, int nt);
/* gpu_adam_state_update: the same sequence on decoded m and v, coded again
 * after the update (cpu_adam's adam_state_update, written for this backend). */
void cpu_adam_state_update(const gpu_adam_state_args *x, size_t n, gpu_tensor param, gpu_tensor grad, void *state,
                           gpu_tensor out16, void *comp, int nt);

/* ---- mixture of experts (ops_cpu_moe.c) ---------------------------------------------- */

zo_status cpu_moe_router_forward(cpu_scratch *ws, gpu_tensor weights, gpu_tensor logits,
                                 float *stats, uint8_t *order, int n, int e, int k, const gpu_moe_gate *g,
                                 int group_rows, int nt);
zo_status cpu_moe_router_backward(cpu_scratch *ws, gpu_tensor dlogits, gpu_tensor dweights,
                                  gpu_tensor logits, const float *stats, int n, int e, int k,
                                  const gpu_moe_gate *g, int layers, int group_rows, float aux_scale, int nt);
void cpu_moe_scale_forward(gpu_tensor y, gpu_tensor x, const float *scale, int n, int c,
                           int64_t lds, int sigmoid, int nt);
void cpu_moe_scale_backward(gpu_tensor dx, float *dscale, gpu_tensor dy, gpu_tensor x,
                            const float *scale, int n, int c, int64_t lds, int sigmoid, int nt);
void cpu_moe_gather(gpu_tensor y, gpu_tensor x, const int32_t *idx, int n, int c, int nt);
void cpu_moe_scatter_add(gpu_tensor y, gpu_tensor x, const int32_t *idx, int n, int c, int64_t ldy,
                         int nt);

#endif
