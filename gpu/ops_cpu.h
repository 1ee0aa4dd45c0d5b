/* The CPU kernels, synchronous: each runs on the calling thread with an
 * OpenMP team of `nt` threads and returns when done. device_cpu.c enqueues
 * them on stream worker threads; tests and benchmarks may call them directly.
 *
 * Every kernel uses static schedules and reduces in a fixed order, so its
 * result does not depend on `nt`. Arguments are those of the public op of
 * the same name (gpu/device.h), already checked. */
#ifndef ZO_GPU_OPS_CPU_H
#define ZO_GPU_OPS_CPU_H

#include "gpu/device.h"

void cpu_gemm(const gpu_gemm_desc *d, int nt);
/* The plain triple loop (fp32 accumulation), the baseline of bench_gpu. */
void cpu_gemm_naive(const gpu_gemm_desc *d);

void cpu_bias_forward(gpu_tensor y, gpu_tensor bias, int n, int c, int64_t ldy, int nt);
void cpu_bias_backward(gpu_tensor dbias, gpu_tensor dy, int n, int c, int64_t lddy, int nt);
void cpu_layernorm_forward(gpu_tensor y, float *mean, float *rstd, gpu_tensor x, gpu_tensor w,
                           gpu_tensor b, int n, int c, float eps, int nt);
void cpu_layernorm_backward(gpu_tensor dx, gpu_tensor dw, gpu_tensor db, gpu_tensor dy,
                            gpu_tensor x, gpu_tensor w, const float *mean, const float *rstd,
                            int n, int c, int nt);
void cpu_rmsnorm_forward(gpu_tensor y, float *rstd, gpu_tensor x, gpu_tensor w, int n, int c,
                         float eps, int nt);
void cpu_rmsnorm_backward(gpu_tensor dx, gpu_tensor dw, gpu_tensor dy, gpu_tensor x,
                          gpu_tensor w, const float *rstd, int n, int c, int nt);
void cpu_attention_forward(const gpu_attn_desc *a, gpu_tensor out, float *lse, gpu_tensor qkv,
                           int nt);
void cpu_attention_backward(const gpu_attn_desc *a, gpu_tensor dqkv, gpu_tensor dout,
                            gpu_tensor qkv, gpu_tensor out, const float *lse, int nt);
void cpu_rope(gpu_tensor x, int n, int t, int n_heads, int d, int64_t ldx, float theta,
              int pos0, int inverse, int nt);
void cpu_gelu_forward(gpu_tensor y, gpu_tensor x, size_t n, int nt);
void cpu_gelu_backward(gpu_tensor dx, gpu_tensor dy, gpu_tensor x, size_t n, int nt);
void cpu_swiglu_forward(gpu_tensor y, gpu_tensor gate, gpu_tensor up, size_t n, int nt);
void cpu_swiglu_backward(gpu_tensor dgate, gpu_tensor dup, gpu_tensor dy, gpu_tensor gate,
                         gpu_tensor up, size_t n, int nt);
zo_status cpu_embedding_forward(gpu_tensor out, const int32_t *tokens, gpu_tensor wte,
                                gpu_tensor wpe, int n, int t, int c, int vocab, int nt);
zo_status cpu_embedding_backward(gpu_tensor dwte, gpu_tensor dwpe, gpu_tensor dout,
                                 const int32_t *tokens, int n, int t, int c, int vocab, int nt);
zo_status cpu_cross_entropy_forward(float *losses, gpu_tensor logits, const int32_t *targets,
                                    int n, int v, int nt);
zo_status cpu_cross_entropy_backward(gpu_tensor dlogits, gpu_tensor logits,
                                     const int32_t *targets, float dloss, int n, int v, int nt);
void cpu_add(gpu_tensor y, gpu_tensor a, gpu_tensor b, size_t n, int nt);
void cpu_scale(gpu_tensor x, float alpha, size_t n, int nt);
void cpu_cast(gpu_tensor dst, gpu_tensor src, size_t n, int nt);
void cpu_check_finite(int32_t *flag, gpu_tensor x, size_t n, int nt);
void cpu_sum_squares(float *sum, gpu_tensor x, size_t n, int nt);

#endif
