/* Token (+ learned position) embedding, forward and backward. The backward
 * scatter-add is race-free and deterministic without atomics: block (x, p)
 * owns columns x*BS.. and the embedding rows whose index is p modulo PARTS,
 * and adds the gradient rows in row order, as the CPU reference does. */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, record_bad_id, grid_for */

#define BS 128   /* columns per block of the backward */
#define PARTS 64 /* embedding-row partitions of the backward */

/* out[r, j] = wte[tokens[r], j] (+ wpe[r % t, j]); out [n, c], wte [vocab, c],
 * wpe [t, c] or NULL */
__global__ void embedding_forward_kernel(cuda_err_rec *err, gpu_tensor out, const int32_t *tokens,
                                         gpu_tensor wte, gpu_tensor wpe, int n, int t, int c,
                                         int vocab)
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
        float v = tload(wte, (size_t)tok * c + j);
        if (wpe.data) v += tload(wpe, (size_t)(r % t) * c + j);
        tstore(out, i, v);
    }
}

/* dwte[tokens[r], j] += dout[r, j]; dwpe[r % t, j] += dout[r, j] (dwpe may be
 * NULL). Grid (ceil(c/BS), PARTS). */
__global__ void embedding_backward_kernel(cuda_err_rec *err, gpu_tensor dwte, gpu_tensor dwpe,
                                          gpu_tensor dout, const int32_t *tokens, int n, int t,
                                          int c, int vocab)
{
    int j = blockIdx.x * BS + threadIdx.x, part = blockIdx.y;
    int recorder = blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0; /* j == 0 < c */
    if (j >= c) return;
    for (int r = 0; r < n; r++) {
        int tok = tokens[r];
        if (tok < 0 || tok >= vocab) {
            if (recorder) record_bad_id(err, CUDA_ERR_EMBEDDING_BACKWARD, r, tok, vocab);
            continue;
        }
        if (tok % PARTS == part) {
            size_t o = (size_t)tok * c + j;
            tstore(dwte, o, tload(dwte, o) + tload(dout, (size_t)r * c + j));
        }
        int pos = r % t;
        if (dwpe.data && pos % PARTS == part) {
            size_t o = (size_t)pos * c + j;
            tstore(dwpe, o, tload(dwpe, o) + tload(dout, (size_t)r * c + j));
        }
    }
}

extern "C" zo_status cuda_launch_embedding_forward(cudaStream_t st, cuda_err_rec *err,
                                                   gpu_tensor out, const int32_t *tokens,
                                                   gpu_tensor wte, gpu_tensor wpe, int n, int t,
                                                   int c, int vocab)
{
    ZO_LAUNCH(embedding_forward_kernel, grid_for((size_t)n * c, 256), 256, 0, st, err, out, tokens,
              wte, wpe, n, t, c, vocab);
    return cuda_launch_check("embedding_forward_kernel");
}

extern "C" zo_status cuda_launch_embedding_backward(cudaStream_t st, cuda_err_rec *err,
                                                    gpu_tensor dwte, gpu_tensor dwpe,
                                                    gpu_tensor dout, const int32_t *tokens, int n,
                                                    int t, int c, int vocab)
{
    dim3 grid((c + BS - 1) / BS, PARTS);
    ZO_LAUNCH(embedding_backward_kernel, grid, BS, 0, st, err, dwte, dwpe, dout, tokens, n, t, c,
              vocab);
    return cuda_launch_check("embedding_backward_kernel");
}
