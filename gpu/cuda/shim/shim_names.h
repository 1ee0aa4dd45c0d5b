/* The shim's names for the functions of gpu/cuda/cuda_impl.h (ZO_CUDA_SHIM):
 * every cuda_* function the kernel sources define or call becomes shim_*,
 * so that zo_cuda_shim (the kernels run on the host) and zo_gpu (the real
 * CUDA backend, when nvcc is found) link into one program without sharing a
 * symbol. cuda_impl.h includes this first under ZO_CUDA_SHIM; a C caller of
 * the shim may use either spelling, and should write the shim_* one.
 *
 * The shim's launchers take host pointers, run the kernel before they
 * return, and accept a NULL stream; arguments as gpu/cuda/cuda_impl.h. */
#ifndef ZO_GPU_CUDA_SHIM_NAMES_H
#define ZO_GPU_CUDA_SHIM_NAMES_H

/* check helpers (gpu/cuda/shim/cuda_shim.cc) */
#define cuda_status shim_status
#define cuda_launch_check shim_launch_check
#define cuda_stopwatch_start shim_stopwatch_start
#define cuda_stopwatch_stop shim_stopwatch_stop

/* launchers (gpu/cuda/<family>.cu compiled for the host) */
#define cuda_launch_gemm_tiled shim_launch_gemm_tiled
#define cuda_gemm_host shim_gemm_host
#define cuda_launch_bias_forward shim_launch_bias_forward
#define cuda_launch_bias_backward shim_launch_bias_backward
#define cuda_launch_layernorm_forward shim_launch_layernorm_forward
#define cuda_launch_layernorm_backward shim_launch_layernorm_backward
#define cuda_launch_rmsnorm_forward shim_launch_rmsnorm_forward
#define cuda_launch_rmsnorm_backward shim_launch_rmsnorm_backward
#define cuda_launch_column_sums shim_launch_column_sums
#define cuda_launch_column_sums_sd shim_launch_column_sums_sd
#define cuda_launch_head_norm_forward shim_launch_head_norm_forward
#define cuda_launch_head_norm_backward shim_launch_head_norm_backward
#define cuda_launch_attention_forward shim_launch_attention_forward
#define cuda_launch_attention_backward shim_launch_attention_backward
#define cuda_launch_attention_cached shim_launch_attention_cached
#define cuda_launch_attention_gemm_forward shim_launch_attention_gemm_forward
#define cuda_launch_attention_gemm_backward shim_launch_attention_gemm_backward
#define cuda_launch_attention_tc_forward shim_launch_attention_tc_forward
#define cuda_launch_attention_tc_backward shim_launch_attention_tc_backward
#define cuda_launch_attention_mma_forward shim_launch_attention_mma_forward
#define cuda_launch_attention_mma_backward shim_launch_attention_mma_backward
#define cuda_launch_rope shim_launch_rope
#define cuda_launch_gelu_forward shim_launch_gelu_forward
#define cuda_launch_gelu_backward shim_launch_gelu_backward
#define cuda_launch_swiglu_forward shim_launch_swiglu_forward
#define cuda_launch_swiglu_backward shim_launch_swiglu_backward
#define cuda_launch_embedding_forward shim_launch_embedding_forward
#define cuda_launch_embedding_backward shim_launch_embedding_backward
#define cuda_launch_cross_entropy_forward shim_launch_cross_entropy_forward
#define cuda_launch_cross_entropy_backward shim_launch_cross_entropy_backward
#define cuda_launch_add shim_launch_add
#define cuda_launch_scale shim_launch_scale
#define cuda_launch_softcap shim_launch_softcap
#define cuda_launch_cast shim_launch_cast
#define cuda_launch_head_copy shim_launch_head_copy
#define cuda_launch_check_finite shim_launch_check_finite
#define cuda_launch_sum_squares shim_launch_sum_squares
#define cuda_launch_nf4_dequantize shim_launch_nf4_dequantize
#define cuda_launch_adam_update shim_launch_adam_update
#define cuda_launch_adam_state_update shim_launch_adam_state_update
#define cuda_launch_moe_router_forward shim_launch_moe_router_forward
#define cuda_launch_moe_router_backward shim_launch_moe_router_backward
#define cuda_launch_moe_scale_forward shim_launch_moe_scale_forward
#define cuda_launch_moe_scale_backward shim_launch_moe_scale_backward
#define cuda_launch_moe_gather shim_launch_moe_gather
#define cuda_launch_moe_scatter_add shim_launch_moe_scatter_add

/* the CUDA column of the op table (gpu/cuda/ops_cuda.c compiled for the host) */
#define cuda_ops shim_cuda_ops
#define cuda_attn_tune_init shim_attn_tune_init
#define cuda_attn_tune_free shim_attn_tune_free
#define cuda_attn_tune_find shim_attn_tune_find
#define cuda_attn_shape_of shim_attn_shape_of
#define cuda_attn_path_name shim_attn_path_name

#endif
