/* Private to the CUDA backend: how the GEMM path of attention
 * (attention_gemm.cu) cuts its work into chunks, kept free of CUDA so that
 * a CPU-only caller (the host shim's tests, docs) computes the same numbers.
 *
 * A chunk is one sequence b, one position hh inside the GQA groups (query
 * head h = g * grp + hh), `heads` consecutive kv heads g (one batched GEMM
 * covers them: Q steps by grp*d, K and V by d) and a block of `rows` query
 * rows r0 .. r0 + rows - 1, which read keys k0 .. r0 + rows - 1 only (causal:
 * none past the block's last row; with a sliding window none before its
 * first row's first key). The chunk's scratch is the scores S (fp32) and
 * two 16-bit buffers in the type of qkv (the forward's P; the backward's P,
 * then dS, as a high and a low part), [heads, rows, ld] each, ld the block's
 * key count rounded up to 8 elements. Its size is held under a cap: as many
 * heads as fit, and fewer rows when even one head does not. */
#ifndef ZO_GPU_CUDA_ATTENTION_GEMM_H
#define ZO_GPU_CUDA_ATTENTION_GEMM_H

#include <stddef.h>

#include "common/attn_path.h" /* defines: ZO_ATTN_GEMM_MIN_T */

#define CUDA_ATTN_GEMM_MIN_T ZO_ATTN_GEMM_MIN_T /* the automatic choice: the GEMM path from this t */
#define CUDA_ATTN_GEMM_ROWS 256             /* query rows per block, at most */
#define CUDA_ATTN_GEMM_CAP ((size_t)256 << 20) /* bytes of one chunk's scratch, at most */
#define CUDA_ATTN_GEMM_ALIGN 256            /* each scratch buffer starts at a multiple */

typedef struct cuda_attn_chunks {
    int rows;     /* query rows per block (the last block of a sequence may be shorter) */
    int keys;     /* the most keys a block reads */
    int ld;       /* keys rounded up to 8: the row stride of S and P */
    int heads;    /* kv heads per chunk */
    size_t bytes; /* the scratch of one chunk: heads * rows * ld * (4 + 2 + 2) */
} cuda_attn_chunks;

/* The first key query row i reads. */
static inline int cuda_attn_first_key(int i, int window)
{
    return window > 0 && i >= window ? i - window + 1 : 0;
}

static inline int cuda_attn_round8(int n) { return (n + 7) / 8 * 8; }

/* The most keys a block of `rows` rows reads in a sequence of t. */
static inline int cuda_attn_block_keys(int t, int window, int rows)
{
    int k = window > 0 ? rows + window - 1 : t;
    return k < t ? k : t;
}

static inline size_t cuda_attn_chunk_bytes(int heads, int rows, int ld)
{
    return (size_t)heads * (size_t)rows * (size_t)ld * (sizeof(float) + 2 + 2);
}

/* The chunks of attention over t positions with hkv kv heads under a cap of
 * `cap` bytes (0: CUDA_ATTN_GEMM_CAP). */
static inline cuda_attn_chunks cuda_attn_plan_chunks(int t, int hkv, int window, size_t cap)
{
    cuda_attn_chunks c;
    if (cap == 0) cap = CUDA_ATTN_GEMM_CAP;
    c.rows = t < CUDA_ATTN_GEMM_ROWS ? t : CUDA_ATTN_GEMM_ROWS;
    for (;;) {
        c.keys = cuda_attn_block_keys(t, window, c.rows);
        c.ld = cuda_attn_round8(c.keys);
        size_t one = cuda_attn_chunk_bytes(1, c.rows, c.ld);
        if (one <= cap || c.rows == 1) {
            size_t fit = cap / one;
            c.heads = fit < 1 ? 1 : fit > (size_t)hkv ? hkv : (int)fit;
            break;
        }
        c.rows = (c.rows + 1) / 2;
    }
    c.bytes = cuda_attn_chunk_bytes(c.heads, c.rows, c.ld);
    return c;
}

/* Bytes rounded up to the scratch alignment. */
static inline size_t cuda_attn_align(size_t n)
{
    return (n + CUDA_ATTN_GEMM_ALIGN - 1) / CUDA_ATTN_GEMM_ALIGN * CUDA_ATTN_GEMM_ALIGN;
}

/* All the scratch of one call, each buffer aligned. Forward: a chunk's S
 * and one 16-bit buffer. Backward: a chunk's S and both 16-bit buffers, D
 * (dO . O per row, fp32 [b, hq, t]), one sequence's dO split into two
 * parts of the type of qkv when dout has another type (2 x [t, hq*d],
 * 16-bit), and one sequence's
 * fp32 sums of dK and dV when dqkv is not fp32 ([t, 2*hkv*d]). */
static inline size_t cuda_attn_scratch_bytes(int backward, int b, int t, int hq, int hkv, int d,
                                             int window, size_t cap, int dout_rounded,
                                             int dkv_apart)
{
    cuda_attn_chunks c = cuda_attn_plan_chunks(t, hkv, window, cap);
    size_t nS = (size_t)c.heads * (size_t)c.rows * (size_t)c.ld;
    size_t n = cuda_attn_align(nS * sizeof(float)) + cuda_attn_align(nS * 2);
    if (!backward) return n;
    n += cuda_attn_align(nS * 2);
    n += cuda_attn_align((size_t)b * hq * t * sizeof(float));
    if (dout_rounded) n += 2 * cuda_attn_align((size_t)t * hq * d * 2);
    if (dkv_apart) n += cuda_attn_align((size_t)t * 2 * hkv * d * sizeof(float));
    return n;
}

#endif
