/* Token (+ learned position) embedding, forward and backward. The backward
 * is a reduction over rows: each token's (and position's) gradient is summed
 * in fp32 over its rows, ascending, and added to the stored gradient once,
 * as the CPU backend does. The rows are first put in token order by one
 * block (a stable radix sort into the stream's workspace); then block (x, p)
 * owns columns x*BS.. and the tokens equal to p modulo PARTS, so the sums
 * are race-free and deterministic without atomics. */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, record_bad_id, grid_for */

#define BS 128   /* columns per block of the backward */
#define PARTS 64 /* embedding-row partitions of the backward */
#define SORT_T 1024 /* threads of the sorting block */
#define DIGIT 8     /* key bits a pass of the radix sort */
#define BINS 256    /* 2^DIGIT */

/* out[r, j] = wte[tokens[r], j] (+ wpe[p + r % t, j], p = pos[r / t] or 0);
 * out [n, c], wte [vocab, c], wpe [n_pos, c] or NULL, pos [n / t] or NULL,
 * each in [0, n_pos - t] (else recorded in err and its rows not written) */
__global__ void embedding_forward_kernel(cuda_err_rec *err, gpu_tensor out, const int32_t *tokens,
                                         gpu_tensor wte, gpu_tensor wpe, const int32_t *pos, int n_pos, int n,
                                         int t, int c, int vocab)
{
    size_t total = (size_t)n * c;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / c), j = (int)(i % c);
        int tok = tokens[r];
        if (tok < 0 || tok >= vocab) {
            if (j == 0) record_bad_id(err, CUDA_ERR_EMBEDDING_FORWARD, r, tok, vocab);
            continue;
        }
        int p0 = pos ? pos[r / t] : 0; /* read once: the stores below may alias it for the compiler */
        if (pos && wpe.data && (p0 < 0 || p0 > n_pos - t)) {
            if (j == 0 && r % t == 0) record_bad_id(err, CUDA_ERR_EMBEDDING_POS, r / t, p0, n_pos - t + 1);
            continue;
        }
        float v = tload(wte, (size_t)tok * c + j);
        if (wpe.data) v += tload(wpe, ((size_t)p0 + (size_t)(r % t)) * c + j);
        tstore(out, i, v);
    }
}

/* The rows 0..n-1 ordered by token, stably (rows ascending within a token;
 * ids outside [0, vocab) last), into `order`: an LSD radix sort of DIGIT bits
 * a pass in one block of SORT_T threads, thread k owning a contiguous chunk
 * of rows. tmp [n] is the other buffer of the ping-pong, hist [BINS * SORT_T]
 * the per-thread digit counts (digit-major, so their exclusive scan gives
 * each thread's place for each digit, which keeps the sort stable). */
__global__ void rows_by_token_kernel(const int32_t *tokens, int n, int vocab, int passes, int *order,
                                     int *tmp, int *hist)
{
    __shared__ int part[SORT_T];
    const int tid = threadIdx.x, T = blockDim.x;
    const int chunk = (n + T - 1) / T, r0 = min(n, tid * chunk), r1 = min(n, r0 + chunk);
    for (int pass = 0; pass < passes; pass++) {
        const int shift = pass * DIGIT;
        const int *src = pass == 0 ? NULL : ((passes - pass) % 2 ? tmp : order);
        int *dst = (passes - 1 - pass) % 2 ? tmp : order; /* the last pass writes `order` */
        for (int b = 0; b < BINS; b++) hist[b * T + tid] = 0;
        for (int k = r0; k < r1; k++) {
            int row = src ? src[k] : k, tok = tokens[row];
            int key = tok < 0 || tok >= vocab ? vocab : tok;
            hist[((key >> shift) & (BINS - 1)) * T + tid]++;
        }
        __syncthreads();
        /* exclusive scan of hist in index order: segments of BINS per thread,
         * the segments' sums scanned across the block */
        int sum = 0;
        for (int e = tid * BINS; e < (tid + 1) * BINS; e++) sum += hist[e];
        part[tid] = sum;
        __syncthreads();
        for (int off = 1; off < T; off <<= 1) {
            int v = tid >= off ? part[tid - off] : 0;
            __syncthreads();
            part[tid] += v;
            __syncthreads();
        }
        int run = part[tid] - sum;
        for (int e = tid * BINS; e < (tid + 1) * BINS; e++) {
            int v = hist[e];
            hist[e] = run;
            run += v;
        }
        __syncthreads();
        for (int k = r0; k < r1; k++) {
            int row = src ? src[k] : k, tok = tokens[row];
            int key = tok < 0 || tok >= vocab ? vocab : tok;
            dst[hist[((key >> shift) & (BINS - 1)) * T + tid]++] = row;
        }
        __syncthreads();
    }
}

/* dwte[tok, j] += sum of dout[r, j] over the rows r of token tok (in
 * `order`, rows ascending); dwpe[p, j] += sum over r = p, p + t, ... (dwpe
 * may be NULL). Grid (ceil(c/BS), PARTS). */
__global__ void embedding_backward_kernel(cuda_err_rec *err, gpu_tensor dwte, gpu_tensor dwpe,
                                          gpu_tensor dout, const int32_t *tokens, const int *order,
                                          int n, int t, int c, int vocab)
{
    int j = blockIdx.x * BS + threadIdx.x, part = blockIdx.y;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) /* the first bad id, in row order */
        for (int r = 0; r < n; r++)
            if (tokens[r] < 0 || tokens[r] >= vocab) {
                record_bad_id(err, CUDA_ERR_EMBEDDING_BACKWARD, r, tokens[r], vocab);
                break;
            }
    if (j >= c) return;
    for (int k = 0; k < n;) {
        const int tok = tokens[order[k]];
        if (tok < 0 || tok >= vocab) break; /* the bad ids sort last: skipped */
        const bool mine = tok % PARTS == part;
        float sum = 0.0f;
        for (; k < n && tokens[order[k]] == tok; k++)
            if (mine) sum += tload(dout, (size_t)order[k] * c + j);
        if (mine) {
            size_t o = (size_t)tok * c + j;
            tstore(dwte, o, tload(dwte, o) + sum);
        }
    }
    if (!dwpe.data) return;
    for (int p = part; p < min(t, n); p += PARTS) {
        float sum = 0.0f;
        for (int r = p; r < n; r += t) sum += tload(dout, (size_t)r * c + j);
        size_t o = (size_t)p * c + j;
        tstore(dwpe, o, tload(dwpe, o) + sum);
    }
}

extern "C" zo_status cuda_launch_embedding_forward(cudaStream_t st, cuda_err_rec *err,
                                                   gpu_tensor out, const int32_t *tokens,
                                                   gpu_tensor wte, gpu_tensor wpe, const int32_t *pos,
                                                   int n_pos, int n, int t, int c, int vocab)
{
    ZO_LAUNCH(embedding_forward_kernel, grid_for((size_t)n * c, 256), 256, 0, st, err, out, tokens,
              wte, wpe, pos, n_pos, n, t, c, vocab);
    return cuda_launch_check("embedding_forward_kernel");
}

extern "C" zo_status cuda_launch_embedding_backward(cudaStream_t st, cuda_err_rec *err,
                                                    void *workspace, size_t ws_bytes,
                                                    gpu_tensor dwte, gpu_tensor dwpe,
                                                    gpu_tensor dout, const int32_t *tokens, int n,
                                                    int t, int c, int vocab)
{
    /* order [n], tmp [n], hist [BINS * SORT_T] in the stream's workspace */
    size_t need = ((size_t)2 * n + (size_t)BINS * SORT_T) * sizeof(int);
    if (need > ws_bytes)
        return zo_error(ZO_ERR_UNSUPPORTED,
                        "gpu_embedding_backward (cuda): %d rows need %zu bytes of the stream's %zu-byte "
                        "workspace",
                        n, need, ws_bytes);
    int *order = (int *)workspace, *tmp = order + n, *hist = tmp + n;
    int passes = 1;
    while (passes * DIGIT < 31 && (vocab >> (passes * DIGIT)) > 0) passes++; /* keys 0..vocab */
    ZO_LAUNCH(rows_by_token_kernel, 1, SORT_T, 0, st, tokens, n, vocab, passes, order, tmp, hist);
    zo_status s = cuda_launch_check("rows_by_token_kernel");
    if (s != ZO_OK) return s;
    dim3 grid((c + BS - 1) / BS, PARTS);
    ZO_LAUNCH(embedding_backward_kernel, grid, BS, 0, st, err, dwte, dwpe, dout, tokens, order, n, t,
              c, vocab);
    return cuda_launch_check("embedding_backward_kernel");
}
