/* The device ops as data (ggml's test-backend-ops is the model): one table,
 * GPU_OP_TABLE below, lists every op of the device interface once, and
 * everything that must exist per op is reached through it.
 *
 * A row is X(ID, name, slots, check):
 *   ID     the op's gpu_op_id, GPU_OP_<ID>
 *   name   the public function is gpu_<name> (gpu/device.h); the columns
 *          below are named after it, so a row is all the table needs:
 *            cpu_run_<name>     the CPU implementation (gpu/device_cpu.c)
 *            cuda_run_<name>    the CUDA implementation (gpu/cuda/ops_cuda.c,
 *                               also run on the host through the shim)
 *            parity_<name>      the generator of parity cases and
 *            ref_<name>         the independent reference (double-precision
 *                               loops), both in tests/test_ops.c, which
 *                               enumerates the table: an op without them
 *                               does not build
 *   slots  its arguments, in the public function's order: where each lives
 *          in gpu_op_args and how gpu_op_run checks it (the shapes and
 *          storage types the op takes)
 *   check  the checks beyond the slots (NULL: none)
 *
 * The public functions of gpu/device.h pack their arguments into a
 * gpu_op_args and call gpu_op_run, which checks them once for every backend
 * and hands them to the backend's one `op` entry, which dispatches on the id
 * to the column of its backend. */
#ifndef ZO_GPU_OPS_H
#define ZO_GPU_OPS_H

#include "gpu/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The arguments of one op: each public argument has its slot (the table's
 * `slots` say which). Tensors go to t[], other device buffers (fp32 arrays,
 * int32 ids or flags, NF4 bytes) to p[], sizes, strides and flags to i[],
 * float scalars to f[], element counts to n; a descriptor's other fields to
 * d (a GEMM's operands are t[0..2], not d.gemm.a/b/c). */
#define GPU_OP_MAX_T 6
#define GPU_OP_MAX_P 3
#define GPU_OP_MAX_I 8
#define GPU_OP_MAX_F 3

/* gpu_adam_state_update's descriptor as the kernels take it: the step's
 * scalars, the encoding, and the byte offsets of the state's parts. */
typedef struct gpu_adam_state_args {
    zo_adam_consts c;
    gpu_adam_state_type type;
    uint32_t block;
    uint64_t total, first;
    uint64_t off_m, off_v, off_am, off_av; /* zo_adam_state_offsets_of(total) */
    int n_decay;
    uint64_t decay[GPU_ADAM_DECAY_RANGES][2];
    gpu_adam_round round;                 /* without a master: how the bf16 weights are stored */
    uint64_t sr_step, sr_block, sr_first; /* stochastic rounding's hash (zo_adam_sr_bits) */
} gpu_adam_state_args;

typedef struct gpu_op_args {
    gpu_tensor t[GPU_OP_MAX_T];
    void *p[GPU_OP_MAX_P];
    int64_t i[GPU_OP_MAX_I];
    float f[GPU_OP_MAX_F];
    size_t n;
    union {
        gpu_gemm_desc gemm;
        gpu_attn_desc attn;
        zo_adam_consts adam;
        gpu_adam_state_args astate;
    } d;
} gpu_op_args;

/* How gpu_op_run checks a slot, in the order the row lists them; the first
 * failure is the op's error, named "<op>: ... <slot name> ...". */
typedef enum gpu_slot_kind {
    GPU_SLOT_TENSOR,     /* t[k]: data not NULL, a known dtype */
    GPU_SLOT_TENSOR_OPT, /* t[k]: the same when data is not NULL */
    GPU_SLOT_PTR,        /* p[k]: not NULL */
    GPU_SLOT_PTR_OPT,    /* p[k]: may be NULL */
    GPU_SLOT_DIM,        /* i[k] > 0 */
    GPU_SLOT_INT,        /* i[k]: any value (the op's check looks at it) */
    GPU_SLOT_COUNT,      /* n: 0 makes the op do nothing, later slots unchecked */
} gpu_slot_kind;

typedef struct gpu_op_slot {
    gpu_slot_kind kind;
    int index; /* into t[], p[] or i[] as the kind says */
    const char *name;
} gpu_op_slot;

#define GPU_T(k, nm) {GPU_SLOT_TENSOR, k, #nm}
#define GPU_TOPT(k, nm) {GPU_SLOT_TENSOR_OPT, k, #nm}
#define GPU_P(k, nm) {GPU_SLOT_PTR, k, #nm}
#define GPU_POPT(k, nm) {GPU_SLOT_PTR_OPT, k, #nm}
#define GPU_DIM(k, nm) {GPU_SLOT_DIM, k, #nm}
#define GPU_INT(k, nm) {GPU_SLOT_INT, k, #nm}
#define GPU_N(nm) {GPU_SLOT_COUNT, 0, #nm}

/* X(ID, name, (slots...), check) */
#define GPU_OP_TABLE(X)                                                                          \
    X(GEMM, gemm, (GPU_T(0, a), GPU_T(1, b), GPU_T(2, c)), gpu_check_gemm)                       \
    X(BIAS_FORWARD, bias_forward,                                                               \
      (GPU_T(0, y), GPU_T(1, bias), GPU_DIM(0, n), GPU_DIM(1, c), GPU_INT(2, ldy)), gpu_check_ld) \
    X(BIAS_BACKWARD, bias_backward,                                                             \
      (GPU_T(0, dbias), GPU_T(1, dy), GPU_DIM(0, n), GPU_DIM(1, c), GPU_INT(2, lddy)),           \
      gpu_check_ld)                                                                              \
    X(LAYERNORM_FORWARD, layernorm_forward,                                                     \
      (GPU_T(0, y), GPU_T(1, x), GPU_T(2, w), GPU_TOPT(3, b), GPU_P(0, mean), GPU_P(1, rstd),    \
       GPU_DIM(0, n), GPU_DIM(1, c)),                                                            \
      NULL)                                                                                      \
    X(LAYERNORM_BACKWARD, layernorm_backward,                                                   \
      (GPU_T(0, dx), GPU_TOPT(1, dw), GPU_TOPT(2, db), GPU_T(3, dy), GPU_T(4, x), GPU_T(5, w),      \
       GPU_P(0, mean), GPU_P(1, rstd), GPU_DIM(0, n), GPU_DIM(1, c)),                            \
      NULL)                                                                                      \
    X(RMSNORM_FORWARD, rmsnorm_forward,                                                         \
      (GPU_T(0, y), GPU_T(1, x), GPU_T(2, w), GPU_P(0, rstd), GPU_DIM(0, n), GPU_DIM(1, c)),     \
      NULL)                                                                                      \
    X(RMSNORM_BACKWARD, rmsnorm_backward,                                                       \
      (GPU_T(0, dx), GPU_TOPT(1, dw), GPU_T(2, dy), GPU_T(3, x), GPU_T(4, w), GPU_P(0, rstd),       \
       GPU_DIM(0, n), GPU_DIM(1, c)),                                                            \
      NULL)                                                                                      \
    X(HEAD_NORM_FORWARD, head_norm_forward,                                                     \
      (GPU_T(0, x), GPU_T(1, w), GPU_TOPT(2, saved), GPU_POPT(0, rstd), GPU_DIM(0, n),           \
       GPU_DIM(1, heads), GPU_DIM(2, d), GPU_INT(3, ldx), GPU_INT(4, w_stride), GPU_INT(5, centered)), \
      gpu_check_heads)                                                                           \
    X(HEAD_NORM_BACKWARD, head_norm_backward,                                                   \
      (GPU_T(0, dx), GPU_TOPT(1, dw), GPU_T(2, saved), GPU_T(3, w), GPU_P(0, rstd), GPU_DIM(0, n),  \
       GPU_DIM(1, heads), GPU_DIM(2, d), GPU_INT(3, ldx), GPU_INT(4, w_stride), GPU_INT(5, centered)), \
      gpu_check_heads)                                                                           \
    X(ATTENTION_FORWARD, attention_forward,                                                     \
      (GPU_T(0, out), GPU_T(1, qkv), GPU_P(0, lse), GPU_POPT(1, sinks)), gpu_check_attn)          \
    X(ATTENTION_BACKWARD, attention_backward,                                                   \
      (GPU_T(0, dqkv), GPU_T(1, dout), GPU_T(2, qkv), GPU_T(3, out), GPU_P(0, lse),              \
       GPU_POPT(1, sinks), GPU_POPT(2, dsinks)),                                                  \
      gpu_check_attn)                                                                            \
    X(ATTENTION_CACHED, attention_cached,                                                       \
      (GPU_T(0, out), GPU_T(1, qkv), GPU_T(2, k_cache), GPU_T(3, v_cache), GPU_P(0, pos),         \
       GPU_POPT(1, sinks), GPU_DIM(0, tc)),                                                      \
      gpu_check_attn_cached)                                                                     \
    X(ROPE_FORWARD, rope_forward,                                                               \
      (GPU_T(0, x), GPU_DIM(0, n), GPU_DIM(1, t), GPU_DIM(2, n_heads), GPU_DIM(3, d),            \
       GPU_INT(4, ldx), GPU_INT(5, pos0), GPU_DIM(6, ldh), GPU_POPT(0, inv_freq), GPU_POPT(1, pos),     \
       GPU_INT(7, n_pos)),                                                                       \
      gpu_check_rope)                                                                            \
    X(ROPE_BACKWARD, rope_backward,                                                             \
      (GPU_T(0, dx), GPU_DIM(0, n), GPU_DIM(1, t), GPU_DIM(2, n_heads), GPU_DIM(3, d),           \
       GPU_INT(4, ldx), GPU_INT(5, pos0), GPU_DIM(6, ldh), GPU_POPT(0, inv_freq)),               \
      gpu_check_rope)                                                                            \
    X(GELU_FORWARD, gelu_forward, (GPU_N(n), GPU_T(0, y), GPU_T(1, x), GPU_INT(0, form)),    \
      gpu_check_act)                                                                            \
    X(GELU_BACKWARD, gelu_backward,                                                           \
      (GPU_N(n), GPU_T(0, dx), GPU_T(1, dy), GPU_T(2, x), GPU_INT(0, form)), gpu_check_act)     \
    X(SWIGLU_FORWARD, swiglu_forward,                                                           \
      (GPU_N(n), GPU_T(0, y), GPU_T(1, gate), GPU_T(2, up), GPU_INT(0, gelu)), gpu_check_glu)    \
    X(SWIGLU_BACKWARD, swiglu_backward,                                                         \
      (GPU_N(n), GPU_T(0, dgate), GPU_T(1, dup), GPU_T(2, dy), GPU_T(3, gate), GPU_T(4, up),     \
       GPU_INT(0, gelu)),                                                                        \
      gpu_check_glu)                                                                             \
    X(EMBEDDING_FORWARD, embedding_forward,                                                     \
      (GPU_T(0, out), GPU_T(1, wte), GPU_TOPT(2, wpe), GPU_P(0, tokens), GPU_DIM(0, n),          \
       GPU_DIM(1, t), GPU_DIM(2, c), GPU_DIM(3, vocab), GPU_POPT(1, pos), GPU_INT(4, n_pos)),    \
      gpu_check_embedding)                                                                       \
    X(EMBEDDING_BACKWARD, embedding_backward,                                                   \
      (GPU_T(0, dwte), GPU_TOPT(1, dwpe), GPU_T(2, dout), GPU_P(0, tokens), GPU_DIM(0, n),       \
       GPU_DIM(1, t), GPU_DIM(2, c), GPU_DIM(3, vocab)),                                         \
      NULL)                                                                                      \
    X(CROSS_ENTROPY_FORWARD, cross_entropy_forward,                                             \
      (GPU_P(0, losses), GPU_T(0, logits), GPU_P(1, targets), GPU_DIM(0, n), GPU_DIM(1, v)),     \
      NULL)                                                                                      \
    X(CROSS_ENTROPY_BACKWARD, cross_entropy_backward,                                           \
      (GPU_T(0, dlogits), GPU_T(1, logits), GPU_P(0, targets), GPU_DIM(0, n), GPU_DIM(1, v)),    \
      gpu_check_ce_inplace)                                                                      \
    X(ADD, add, (GPU_N(n), GPU_T(0, y), GPU_T(1, a), GPU_T(2, b)), NULL)                         \
    X(SCALE, scale, (GPU_N(n), GPU_T(0, x)), NULL)                                               \
    X(SOFTCAP, softcap, (GPU_N(n), GPU_T(0, x)), NULL)                                           \
    X(CAST, cast, (GPU_N(n), GPU_T(0, dst), GPU_T(1, src)), NULL)                                \
    X(HEAD_COPY, head_copy,                                                                     \
      (GPU_T(0, y), GPU_T(1, x), GPU_DIM(0, n), GPU_DIM(1, heads), GPU_DIM(2, w), GPU_DIM(3, fill), \
       GPU_DIM(4, ldy), GPU_INT(5, hsy), GPU_DIM(6, ldx), GPU_INT(7, hsx)),                      \
      gpu_check_head_copy)                                                                       \
    X(CHECK_FINITE, check_finite, (GPU_P(0, flag), GPU_N(n), GPU_T(0, x)), NULL)                 \
    X(SUM_SQUARES, sum_squares, (GPU_P(0, sum), GPU_N(n), GPU_T(0, x)), NULL)                    \
    X(NF4_DEQUANTIZE, nf4_dequantize, (GPU_N(n), GPU_T(0, out), GPU_P(0, nf4)), gpu_check_nf4)   \
    X(ADAM_UPDATE, adam_update,                                                                 \
      (GPU_N(n), GPU_P(0, param), GPU_P(1, m), GPU_P(2, v), GPU_T(0, grad), GPU_TOPT(1, out16)), \
      gpu_check_adam)                                                                            \
    X(ADAM_STATE_UPDATE, adam_state_update,                                                     \
      (GPU_N(n), GPU_T(0, param), GPU_T(1, grad), GPU_P(0, state), GPU_TOPT(2, out16),           \
       GPU_POPT(1, comp)),                                                                       \
      gpu_check_adam_state)                                                                      \
    X(MOE_ROUTER_FORWARD, moe_router_forward,                                                   \
      (GPU_T(0, weights), GPU_T(1, logits), GPU_P(0, stats), GPU_POPT(1, order),                 \
       GPU_POPT(2, bias), GPU_DIM(0, n), GPU_DIM(1, e), GPU_DIM(2, k), GPU_INT(3, mode),          \
       GPU_DIM(4, group_rows), GPU_INT(5, groups), GPU_INT(6, topk_groups)),                     \
      gpu_check_moe_router)                                                                      \
    X(MOE_ROUTER_BACKWARD, moe_router_backward,                                                 \
      (GPU_T(0, dlogits), GPU_T(1, dweights), GPU_T(2, logits), GPU_POPT(0, stats),              \
       GPU_POPT(1, bias), GPU_DIM(0, n), GPU_DIM(1, e), GPU_DIM(2, k), GPU_INT(3, mode),          \
       GPU_INT(4, layers), GPU_DIM(5, group_rows), GPU_INT(6, groups), GPU_INT(7, topk_groups)),  \
      gpu_check_moe_router)                                                                      \
    X(MOE_SCALE_FORWARD, moe_scale_forward,                                                     \
      (GPU_T(0, y), GPU_T(1, x), GPU_P(0, scale), GPU_DIM(0, n), GPU_DIM(1, c), GPU_DIM(2, lds), \
       GPU_INT(3, sigmoid)),                                                                     \
      NULL)                                                                                      \
    X(MOE_SCALE_BACKWARD, moe_scale_backward,                                                   \
      (GPU_T(0, dx), GPU_P(0, dscale), GPU_T(1, dy), GPU_T(2, x), GPU_P(1, scale),               \
       GPU_DIM(0, n), GPU_DIM(1, c), GPU_DIM(2, lds), GPU_INT(3, sigmoid)),                      \
      NULL)                                                                                      \
    X(MOE_GATHER, moe_gather,                                                                   \
      (GPU_T(0, y), GPU_T(1, x), GPU_P(0, idx), GPU_DIM(0, n), GPU_DIM(1, c)), NULL)              \
    X(MOE_SCATTER_ADD, moe_scatter_add,                                                         \
      (GPU_T(0, y), GPU_T(1, x), GPU_P(0, idx), GPU_DIM(0, n), GPU_DIM(1, c), GPU_DIM(2, ldy)),  \
      gpu_check_ld)

typedef enum gpu_op_id {
#define GPU_OP_ENUM(ID, name, slots, check) GPU_OP_##ID,
    GPU_OP_TABLE(GPU_OP_ENUM)
#undef GPU_OP_ENUM
    GPU_OP_COUNT
} gpu_op_id;

/* What a row says, in a form code can walk: */
typedef struct gpu_op_info {
    const char *name;          /* "gpu_<name>", as messages name the op */
    const gpu_op_slot *slots;
    int n_slots;
    zo_status (*check)(const char *op, const gpu_op_args *a);
} gpu_op_info;

extern const gpu_op_info gpu_op_infos[GPU_OP_COUNT];

/* Check the arguments (the stream, the id, then the row's slots and check),
 * then enqueue the op on the stream's backend. Returns the first failed
 * check, ZO_OK at once when a count slot is 0, else the backend's status. */
zo_status gpu_op_run(gpu_stream_t s, gpu_op_id id, const gpu_op_args *a);

#ifdef __cplusplus
}
#endif

#endif
