/* Rotary position embedding, Hugging Face LLaMA convention (rotate_half:
 * dimension i pairs with i + d/2, inv_freq[i] = theta^(-2i/d) or the
 * caller's frequencies), in place.
 * One thread per (row, pair), rotating that pair of every head: the angle
 * (computed in double as in the CPU reference, so long positions keep their
 * precision) and its cosine and sine once for all the heads, which share
 * them. */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, record_bad_id, grid_for */

#define BS 256

/* x [n, ldx]: the first d elements of the first n_heads heads (head h at
 * h * ldh) of each row rotate by the angle of position pos0 + r % t (plus
 * seq_pos[r / t] when given: a position a sequence, in [0, n_pos - t], else
 * recorded in err and its rows left), cos and sin times scale; inverse
 * rotates back (the backward: the transpose, times scale). Moves the
 * rotated elements in and out: 2 n n_heads d elements (8192 rows of 16
 * heads of 128 bf16: 67.1 MB); one pow, cos and sin a (row, pair). */
__global__ void rope_kernel(cuda_err_rec *err, gpu_tensor x, int n, int t, int n_heads, int d, int64_t ldx,
                            int64_t ldh, float theta, int pos0, const int32_t *seq_pos, int n_pos,
                            const double *freq, float scale, int inverse)
{
    const int half = d / 2;
    size_t total = (size_t)n * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half), r = (int)(idx / half);
        int sp = seq_pos ? seq_pos[r / t] : 0; /* read once: the stores below may alias it for the compiler */
        if (seq_pos && (sp < 0 || sp > n_pos - t)) {
            if (r % t == 0 && i == 0) record_bad_id(err, CUDA_ERR_ROPE_SEQ, r / t, sp, n_pos - t + 1);
            continue;
        }
        double inv_freq = freq ? freq[i] : pow((double)theta, -2.0 * i / d);
        double p = (double)pos0 + (double)sp + (double)(r % t);
        double ang = p * inv_freq;
        float c = (float)(scale * cos(ang)), s = (float)(scale * sin(ang));
        if (inverse) s = -s;
        size_t off = (size_t)r * ldx;
        for (int h = 0; h < n_heads; h++, off += ldh) {
            float x1 = tload(x, off + i), x2 = tload(x, off + half + i);
            tstore(x, off + i, x1 * c - x2 * s);
            tstore(x, off + half + i, x2 * c + x1 * s);
        }
    }
}

extern "C" zo_status cuda_launch_rope(cudaStream_t st, cuda_err_rec *err, gpu_tensor x, int n, int t,
                                      int n_heads, int d, int64_t ldx, int64_t ldh, float theta, int pos0,
                                      const int32_t *seq_pos, int n_pos, const double *inv_freq, float scale,
                                      int inverse)
{
    size_t total = (size_t)n * (d / 2);
    ZO_LAUNCH(rope_kernel, grid_for(total, BS), BS, 0, st, err, x, n, t, n_heads, d, ldx, ldh, theta, pos0,
              seq_pos, n_pos, inv_freq, scale, inverse);
    return cuda_launch_check("rope_kernel");
}
