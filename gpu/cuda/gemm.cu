/* GEMM: row-major C = alpha op(A) op(B) + beta C through cuBLASLt, with a
 * plain tiled kernel for what cuBLASLt does not take.
 *
 * cuBLASLt is column-major: the row-major product C = op(A) op(B) is the
 * column-major C^T = op(B)^T op(A)^T, cuBLASLt's "A" being our B and its "B"
 * our A (gemm_layout.h computes the layouts; tests/test_gpu_cuda_layout.c
 * checks them on the CPU).
 *
 * cuBLASLt takes A and B of one type and C of that type or fp32:
 * fp16/bf16 inputs accumulate in fp32 (CUBLAS_COMPUTE_32F); fp32 inputs use
 * TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32: inputs rounded to a 10-bit
 * mantissa, fp32 accumulation). An fp32 operand beside a 16-bit one (the
 * fp32 activation gradients against 16-bit weights of a mixed-precision
 * backward) is rounded to that 16-bit type in a stream-ordered scratch
 * buffer first, as mixed-precision GEMMs do, so it too runs on tensor cores.
 * Other mixes (fp16 with bf16, fp32 inputs into a 16-bit C) and shapes for
 * which cuBLASLt offers no algorithm run on gemm_tiled_kernel (fp32
 * accumulation, no rounding of inputs). */
#include "gpu/cuda/gemm_layout.h" /* defines: cuda_gemm_lt_shape, cuda_gemm_operand_extent */
#include "gpu/cuda/kernels.cuh"     /* defines: tload, tstore */

#define TILE 16

/* ---- the tiled kernel ------------------------------------------------------- */

/* One thread per element of C, 16 x 16 tiles of op(A) and op(B) through
 * shared memory; grid (ceil(n/16), ceil(m/16), min(batch, 65535)), batches
 * beyond the grid's z loop. */
__global__ void gemm_tiled_kernel(gpu_gemm_desc d, int batch)
{
    __shared__ float As[TILE][TILE + 1], Bs[TILE][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int i = blockIdx.y * TILE + ty, j = blockIdx.x * TILE + tx;
    for (int bi = blockIdx.z; bi < batch; bi += gridDim.z) {
        const size_t oa = (size_t)bi * d.stride_a, ob = (size_t)bi * d.stride_b;
        const size_t oc = (size_t)bi * d.stride_c;
        float acc = 0.0f;
        for (int p0 = 0; p0 < d.k; p0 += TILE) {
            int p = p0 + tx; /* As[ty][tx] = op(A)[i, p] */
            As[ty][tx] = i < d.m && p < d.k
                             ? tload(d.a, oa + (d.trans_a ? (size_t)p * d.lda + i
                                                          : (size_t)i * d.lda + p))
                             : 0.0f;
            p = p0 + ty; /* Bs[ty][tx] = op(B)[p, j] */
            Bs[ty][tx] = p < d.k && j < d.n
                             ? tload(d.b, ob + (d.trans_b ? (size_t)j * d.ldb + p
                                                          : (size_t)p * d.ldb + j))
                             : 0.0f;
            __syncthreads();
            for (int q = 0; q < TILE; q++) acc += As[ty][q] * Bs[q][tx];
            __syncthreads();
        }
        if (i < d.m && j < d.n) {
            const size_t o = oc + (size_t)i * d.ldc + j;
            /* beta == 0 never reads C (it may hold nan) */
            const float v = d.beta != 0.0f ? d.alpha * acc + d.beta * tload(d.c, o) : d.alpha * acc;
            tstore(d.c, o, v);
        }
    }
}

extern "C" zo_status cuda_launch_gemm_tiled(cudaStream_t st, const gpu_gemm_desc *d)
{
    const int batch = d->batch > 0 ? d->batch : 1;
    if ((d->m + TILE - 1) / TILE > 65535)
        return zo_error(ZO_ERR_UNSUPPORTED, "gpu_gemm (cuda, tiled): m %d is too large", d->m);
    dim3 block(TILE, TILE);
    dim3 grid((d->n + TILE - 1) / TILE, (d->m + TILE - 1) / TILE, batch < 65535 ? batch : 65535);
    ZO_LAUNCH(gemm_tiled_kernel, grid, block, 0, st, *d, batch);
    return cuda_launch_check("gemm_tiled_kernel");
}

/* ---- cuBLASLt (not in the host shim, which runs the tiled kernel only) -------- */
#ifndef ZO_CUDA_SHIM
#include <pthread.h> /* defines: pthread_mutex_t (the heuristic's answers) */
#include <stdlib.h>  /* getenv */
#include <string.h>  /* strcmp, memcmp, memset */

static cudaDataType_t lt_type(zo_dtype t)
{
    switch (t) {
    case ZO_DTYPE_F16: return CUDA_R_16F;
    case ZO_DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
    }
}

/* The alignment in bytes (a power of two, at most 256) that the matrix at p
 * keeps in every batch (stride in bytes). */
static uint32_t alignment_of(const void *p, size_t stride_bytes, int batch)
{
    uintptr_t u = (uintptr_t)p | (uintptr_t)256u;
    if (batch > 1) u |= (uintptr_t)stride_bytes;
    return (uint32_t)(u & (~u + 1u)); /* lowest set bit */
}

/* Whether cuBLASLt takes these types: A and B alike, C like them or fp32,
 * and fp32 inputs only into fp32. */
static int lt_types_ok(const gpu_gemm_desc *d)
{
    if (d->a.dtype != d->b.dtype) return 0;
    if (d->a.dtype == ZO_DTYPE_F32) return d->c.dtype == ZO_DTYPE_F32;
    return d->c.dtype == d->a.dtype || d->c.dtype == ZO_DTYPE_F32;
}

#define LT(call) cuda_blas_status((call), #call)

/* ---- the heuristic's answers, kept by problem ---------------------------------
 * cublasLtMatmulAlgoGetHeuristic takes tens of microseconds a call, more than
 * the tensor-core work of a small product (attention_gemm.cu's chunks are
 * a few microseconds each on an H200): its answer (the algorithm, or none)
 * is kept per problem, the key being everything the query is given (device,
 * handle, compute and data types, operations, layouts, alignments,
 * workspace bytes). A table of LT_CACHE entries, direct-mapped by a hash of
 * the key (a collision replaces), under a mutex; the query runs outside it. */
#define LT_CACHE 256
#define LT_KEY_WORDS 28

typedef struct lt_key {
    uint64_t w[LT_KEY_WORDS];
} lt_key;

typedef struct lt_entry {
    int valid, found;
    lt_key key;
    cublasLtMatmulHeuristicResult_t heur;
} lt_entry;

static lt_entry lt_cache[LT_CACHE];
static pthread_mutex_t lt_cache_lock = PTHREAD_MUTEX_INITIALIZER;

static void key_mat(uint64_t *w, const cuda_lt_mat *m)
{
    w[0] = (uint64_t)m->trans, w[1] = m->rows, w[2] = m->cols;
    w[3] = (uint64_t)m->ld, w[4] = (uint64_t)m->stride;
}

static lt_key lt_key_of(cublasLtHandle_t lt, const gpu_gemm_desc *d, const cuda_lt_gemm *g, int compute,
                        const uint32_t align[3], uint64_t ws)
{
    lt_key k;
    memset(&k, 0, sizeof k);
    int dev = -1;
    (void)cudaGetDevice(&dev);
    k.w[0] = (uint64_t)(int64_t)dev, k.w[1] = (uint64_t)(uintptr_t)lt, k.w[2] = (uint64_t)compute;
    k.w[3] = (uint64_t)d->a.dtype, k.w[4] = (uint64_t)d->b.dtype, k.w[5] = (uint64_t)d->c.dtype;
    key_mat(k.w + 6, &g->a);
    key_mat(k.w + 11, &g->b);
    key_mat(k.w + 16, &g->c);
    k.w[21] = (uint64_t)g->batch, k.w[22] = align[0], k.w[23] = align[1], k.w[24] = align[2];
    k.w[25] = ws;
    return k;
}

static unsigned lt_slot(const lt_key *k)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the words */
    for (int i = 0; i < LT_KEY_WORDS; i++) {
        h ^= k->w[i];
        h *= 1099511628211ull;
    }
    return (unsigned)(h % LT_CACHE);
}

/* The kept answer for k: 1 (found, heur set) or 0 when there is none. */
static int lt_cache_get(const lt_key *k, int *found, cublasLtMatmulHeuristicResult_t *heur)
{
    const lt_entry *e = &lt_cache[lt_slot(k)];
    int hit = 0;
    pthread_mutex_lock(&lt_cache_lock);
    if (e->valid && !memcmp(&e->key, k, sizeof *k)) {
        *found = e->found;
        *heur = e->heur;
        hit = 1;
    }
    pthread_mutex_unlock(&lt_cache_lock);
    return hit;
}

static void lt_cache_put(const lt_key *k, int found, const cublasLtMatmulHeuristicResult_t *heur)
{
    lt_entry *e = &lt_cache[lt_slot(k)];
    pthread_mutex_lock(&lt_cache_lock);
    e->valid = 1;
    e->found = found;
    e->key = *k;
    e->heur = *heur;
    pthread_mutex_unlock(&lt_cache_lock);
}

/* Set a layout's batch count and stride (elements) when batched. */
static zo_status lt_batch(cublasLtMatrixLayout_t l, int batch, int64_t stride)
{
    if (batch <= 1) return ZO_OK;
    int32_t b = batch;
    zo_status s = LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b,
                                                      sizeof b));
    if (s != ZO_OK) return s;
    return LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                               &stride, sizeof stride));
}

/* cuBLASLt on a problem whose types it takes (lt_types_ok). */
static zo_status gemm_lt(cudaStream_t st, cublasLtHandle_t lt, void *workspace, size_t ws_bytes,
                         const gpu_gemm_desc *d)
{
    const cuda_lt_gemm g = cuda_gemm_lt_shape(d); /* g.a = our B, g.b = our A */
    const int batch = g.batch;
    const cublasComputeType_t compute =
        d->a.dtype == ZO_DTYPE_F32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const cublasOperation_t op_b = g.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N; /* Lt's A */
    const cublasOperation_t op_a = g.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N; /* Lt's B */
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t lay_b = NULL, lay_a = NULL, lay_c = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    memset(&heur, 0, sizeof heur);
    int found = 0;
    lt_key key;
    zo_status s;

    if ((s = LT(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F))) != ZO_OK) return s;
    if ((s = LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b,
                                               sizeof op_b))) != ZO_OK)
        goto out_destroy_desc;
    if ((s = LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a,
                                               sizeof op_a))) != ZO_OK)
        goto out_destroy_desc;
    if ((s = LT(cublasLtMatrixLayoutCreate(&lay_b, lt_type(d->b.dtype), g.a.rows, g.a.cols,
                                           g.a.ld))) != ZO_OK)
        goto out_destroy_desc;
    if ((s = LT(cublasLtMatrixLayoutCreate(&lay_a, lt_type(d->a.dtype), g.b.rows, g.b.cols,
                                           g.b.ld))) != ZO_OK)
        goto out_destroy_lay_b;
    if ((s = LT(cublasLtMatrixLayoutCreate(&lay_c, lt_type(d->c.dtype), g.c.rows, g.c.cols,
                                           g.c.ld))) != ZO_OK)
        goto out_destroy_lay_a;
    if ((s = lt_batch(lay_b, batch, g.a.stride)) != ZO_OK) goto out_destroy_lay_c;
    if ((s = lt_batch(lay_a, batch, g.b.stride)) != ZO_OK) goto out_destroy_lay_c;
    if ((s = lt_batch(lay_c, batch, g.c.stride)) != ZO_OK) goto out_destroy_lay_c;

    if ((s = LT(cublasLtMatmulPreferenceCreate(&pref))) != ZO_OK) goto out_destroy_lay_c;
    {
        uint64_t ws = ws_bytes;
        size_t es_a = zo_dtype_size(d->a.dtype), es_b = zo_dtype_size(d->b.dtype);
        size_t es_c = zo_dtype_size(d->c.dtype);
        uint32_t al_lt_a = alignment_of(d->b.data, (size_t)d->stride_b * es_b, batch);
        uint32_t al_lt_b = alignment_of(d->a.data, (size_t)d->stride_a * es_a, batch);
        uint32_t al_c = alignment_of(d->c.data, (size_t)d->stride_c * es_c, batch);
        if ((s = LT(cublasLtMatmulPreferenceSetAttribute(
                 pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws))) != ZO_OK ||
            (s = LT(cublasLtMatmulPreferenceSetAttribute(
                 pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_lt_a, sizeof al_lt_a))) !=
                ZO_OK ||
            (s = LT(cublasLtMatmulPreferenceSetAttribute(
                 pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_lt_b, sizeof al_lt_b))) !=
                ZO_OK ||
            (s = LT(cublasLtMatmulPreferenceSetAttribute(
                 pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c))) != ZO_OK ||
            (s = LT(cublasLtMatmulPreferenceSetAttribute(
                 pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c))) != ZO_OK)
            goto out_destroy_pref;
        const uint32_t align[3] = {al_lt_a, al_lt_b, al_c};
        key = lt_key_of(lt, d, &g, (int)compute, align, ws);
    }
    if (!lt_cache_get(&key, &found, &heur)) {
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, lay_b, lay_a, lay_c, lay_c,
                                                           pref, 1, &heur, &found);
        if (hs == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;
        else if ((s = cuda_blas_status(hs, "cublasLtMatmulAlgoGetHeuristic")) != ZO_OK)
            goto out_destroy_pref;
        lt_cache_put(&key, found > 0, &heur);
    }
    if (found > 0)
        s = LT(cublasLtMatmul(lt, desc, &d->alpha, d->b.data, lay_b, d->a.data, lay_a, &d->beta,
                              d->c.data, lay_c, d->c.data, lay_c, &heur.algo, workspace, ws_bytes,
                              st));
    else
        s = cuda_launch_gemm_tiled(st, d);

out_destroy_pref:
    cublasLtMatmulPreferenceDestroy(pref);
out_destroy_lay_c:
    cublasLtMatrixLayoutDestroy(lay_c);
out_destroy_lay_a:
    cublasLtMatrixLayoutDestroy(lay_a);
out_destroy_lay_b:
    cublasLtMatrixLayoutDestroy(lay_b);
out_destroy_desc:
    cublasLtMatmulDescDestroy(desc);
    return s;
}

static int is_16bit(zo_dtype t) { return t == ZO_DTYPE_F16 || t == ZO_DTYPE_BF16; }

/* Round the fp32 operand (which = 'a' or 'b') to the 16-bit type h in a
 * scratch buffer from the pool, ordered on st, then run cuBLASLt. The
 * scratch covers the operand's extent, ld and batch stride kept. */
static zo_status gemm_round_operand(cudaStream_t st, cublasLtHandle_t lt, cudaMemPool_t pool,
                                    void *workspace, size_t ws_bytes, const gpu_gemm_desc *d,
                                    char which, zo_dtype h)
{
    gpu_gemm_desc e = *d;
    gpu_tensor *op = which == 'a' ? &e.a : &e.b;
    const size_t extent = cuda_gemm_operand_extent(d, which);
    void *tmp = NULL;
    zo_status s = cuda_status(cudaMallocFromPoolAsync(&tmp, extent * 2, pool, st),
                              "cudaMallocFromPoolAsync (gpu_gemm operand scratch)");
    if (s != ZO_OK) return s;
    gpu_tensor rounded = {tmp, h};
    if ((s = cuda_launch_cast(st, rounded, *op, extent)) == ZO_OK) {
        *op = rounded;
        s = gemm_lt(st, lt, workspace, ws_bytes, &e);
    }
    zo_status f = cuda_status(cudaFreeAsync(tmp, st), "cudaFreeAsync (gpu_gemm operand scratch)");
    return s != ZO_OK ? s : f;
}

/* ZO_CUDA_GEMM=tiled: every GEMM on gemm_tiled_kernel, none through cuBLASLt
 * (read once). For compute-sanitizer's initcheck, which does not see the
 * writes of cuBLASLt's Hopper kernels and reports every later read of their
 * output as uninitialized (scripts/gpu-check.sh runs it so); slow. */
static int gemm_tiled_only(void)
{
    static int only = -1;
    if (only < 0) {
        const char *e = getenv("ZO_CUDA_GEMM");
        only = e && !strcmp(e, "tiled");
    }
    return only;
}

extern "C" zo_status cuda_gemm(cudaStream_t st, cublasLtHandle_t lt, cudaMemPool_t pool,
                               void *workspace, size_t ws_bytes, const gpu_gemm_desc *d)
{
    if (gemm_tiled_only()) return cuda_launch_gemm_tiled(st, d);
    zo_dtype ta = d->a.dtype, tb = d->b.dtype, tc = d->c.dtype;
    if (ta != tb) {
        zo_dtype h = ta == ZO_DTYPE_F32 ? tb : ta;
        if ((ta == ZO_DTYPE_F32 || tb == ZO_DTYPE_F32) && is_16bit(h) &&
            (tc == h || tc == ZO_DTYPE_F32))
            return gemm_round_operand(st, lt, pool, workspace, ws_bytes, d,
                                      ta == ZO_DTYPE_F32 ? 'a' : 'b', h);
        return cuda_launch_gemm_tiled(st, d);
    }
    if (!lt_types_ok(d)) return cuda_launch_gemm_tiled(st, d);
    return gemm_lt(st, lt, workspace, ws_bytes, d);
}
#endif /* ZO_CUDA_SHIM */
