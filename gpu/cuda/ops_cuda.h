/* The CUDA column of the op table (gpu/ops.h): cuda_ops[id] launches op id
 * on a stream with the arguments gpu_op_run has checked. device_cuda.c
 * dispatches through it; the host shim (gpu/cuda/shim/) builds the same file
 * over its host copies of the launchers, so the parity test (tests/
 * test_ops.c) runs this very table where no GPU exists. */
#ifndef ZO_GPU_CUDA_OPS_CUDA_H
#define ZO_GPU_CUDA_OPS_CUDA_H

#include <pthread.h> /* defines: pthread_mutex_t */

#include "gpu/cuda/cuda_impl.h" /* defines: cudaStream_t, cuda_err_rec, launchers */
#include "gpu/ops.h"            /* defines: gpu_op_id, gpu_op_args */

#ifdef __cplusplus
extern "C" {
#endif

struct cuda_attn_tune;

/* What a launch needs of its stream and device. */
typedef struct cuda_exec {
    cudaStream_t stream;
    cuda_err_rec *err;      /* the stream's record of bad ids (device memory) */
    double *partials;       /* [CUDA_SUMSQ_BLOCKS] for sum_squares */
    void *workspace;        /* cuBLASLt's, ws_bytes; the scratch of the embedding's and the
                             * norms' backwards (stream_workspace, device_cuda.c) */
    size_t ws_bytes;
    cublasLtHandle_t lt;    /* NULL: GEMMs run the tiled kernel */
    cudaMemPool_t pool;     /* scratch of mixed-dtype GEMMs and GEMM attention */
    int attn_path;          /* a cuda_attn_path; CUDA_ATTN_AUTO: ZO_ATTENTION decides */
    size_t attn_cap;        /* bytes of GEMM attention's scores per chunk (0: the default) */
    struct cuda_attn_tune *tune; /* the device's tuned attention paths (NULL: tune takes the
                                  * automatic choice) */
} cuda_exec;

/* Which attention runs gpu_attention_forward / _backward with 16-bit qkv:
 * the GEMM path (attention_gemm.cu), the flash kernel (attention.cu) or the
 * fused tensor-core kernels (attention_tc.cu, for the cases
 * cuda_attn_tc_covers; the rest take the automatic choice) or the
 * mma.sync kernels (attention_mma.cu, the same cases), or the fastest of
 * them for the shape, timed on its first call (TUNE). AUTO reads
 * ZO_ATTENTION (gemm, flash, tc, mma, tune, or auto / unset): auto never
 * takes mma; it takes the tensor-core kernels where they cover the case at
 * head sizes up to 64 or where the GEMM path is not taken, the GEMM path on
 * a device with cuBLASLt from t >= CUDA_ATTN_GEMM_MIN_T, else the flash
 * kernel. fp32 qkv and the cached attention always run the flash kernels
 * (fp32 qkv under tune too: the only candidate). */
enum cuda_attn_path { CUDA_ATTN_AUTO, CUDA_ATTN_FLASH, CUDA_ATTN_GEMM, CUDA_ATTN_TC, CUDA_ATTN_MMA, CUDA_ATTN_TUNE };

/* ---- ZO_ATTENTION=tune ---------------------------------------------------------------
 * The first call of each distinct shape times every path that covers it
 * (mma and tc: cuda_attn_*_covers and qkv 16-byte aligned; gemm: 16-bit
 * qkv; flash: always) on the call's stream, one warm-up run and `runs`
 * timed ones each (cuda_stopwatch), keeps the fastest here and runs it once
 * more, last, so the call's results are that path's alone (every path
 * overwrites out and lse, or dqkv, and gpu_op_run refuses overlapping
 * buffers). Later calls of the shape run it directly. With
 * ZO_ATTENTION_LOG set (not "0") each tuned shape prints one line to stderr:
 * the shape, each candidate's microseconds a run, the choice. Shapes past
 * the last slot take the automatic choice, untimed. */
#define CUDA_ATTN_PATHS 5       /* indices CUDA_ATTN_FLASH .. CUDA_ATTN_MMA */
#define CUDA_ATTN_TUNE_SLOTS 64 /* shapes kept */
#define CUDA_ATTN_TUNE_RUNS 3   /* timed runs a candidate (after one warm-up) */

/* What selects a kernel or changes its speed: the op, the desc but the
 * scale, the tensors' types, whether qkv is 16-byte aligned. */
typedef struct cuda_attn_shape {
    int backward;
    int b, t, hq, hkv, d, window, alibi_bf16;
    float softcap, alibi;
    int qkv, out, dout, dqkv; /* zo_dtype each; the forward's dout and dqkv -1 */
    int aligned;
    int grads16; /* the backward's gpu_attn_desc grads16 (the forward's 0) */
} cuda_attn_shape;

typedef struct cuda_attn_tuned {
    cuda_attn_shape shape;
    int path;                   /* the fastest: a cuda_attn_path */
    double us[CUDA_ATTN_PATHS]; /* each candidate's mean time a run; < 0: not a candidate */
} cuda_attn_tuned;

typedef struct cuda_attn_tune {
    pthread_mutex_t lock;
    int n; /* entries in use */
    cuda_attn_tuned e[CUDA_ATTN_TUNE_SLOTS];
    int runs;                        /* timed runs a candidate (0: CUDA_ATTN_TUNE_RUNS) */
    long launched[CUDA_ATTN_PATHS];  /* runs of each path made to time it, warm-ups included */
} cuda_attn_tune;

void cuda_attn_tune_init(cuda_attn_tune *t);
void cuda_attn_tune_free(cuda_attn_tune *t);
/* The entry of a shape (NULL: not tuned yet); the pointer stays valid until
 * cuda_attn_tune_free. */
const cuda_attn_tuned *cuda_attn_tune_find(cuda_attn_tune *t, const cuda_attn_shape *k);
/* The shape of an attention call (gpu_op_args of GPU_OP_ATTENTION_FORWARD or _BACKWARD). */
cuda_attn_shape cuda_attn_shape_of(const gpu_op_args *a, int backward);
/* The path's name: "flash", "gemm", "tc", "mma". */
const char *cuda_attn_path_name(int path);

typedef zo_status (*cuda_op_fn)(const cuda_exec *e, const gpu_op_args *a);

extern const cuda_op_fn cuda_ops[GPU_OP_COUNT];

#ifdef __cplusplus
}
#endif

#endif
