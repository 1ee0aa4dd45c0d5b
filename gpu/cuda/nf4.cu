/* NF4 dequantization (gpu_nf4_dequantize): one thread per byte of codes
 * (two weights of one block of 64) in a grid-stride loop. The block's absmax
 * and each weight are computed with explicitly rounded intrinsics (no FMA
 * contraction), in common/nf4.c's order, so the result is the CPU
 * reference's bit for bit. */
#include "gpu/cuda/kernels.cuh" /* defines: tstore, grid_for */

extern "C" {
#include "common/nf4.h" /* defines: zo_nf4_layout_of, zo_nf4_absmax_map, zo_nf4_code */
}

#define BS 256

/* The two value tables, passed by value (1088 bytes of kernel parameters). */
struct nf4_tables {
    float map[256]; /* the absmax constants' 8-bit dynamic map */
    float code[16]; /* the NF4 values */
};

/* out [n] from the NF4 tensor at base (layout: common/nf4.h) */
__global__ void nf4_dequantize_kernel(gpu_tensor out, const uint8_t *base, uint64_t n,
                                      uint64_t off_absq, uint64_t off_codes, nf4_tables tab)
{
    __shared__ float map[256], code[16];
    for (int k = threadIdx.x; k < 256; k += blockDim.x) map[k] = tab.map[k];
    if (threadIdx.x < 16) code[threadIdx.x] = tab.code[threadIdx.x];
    __syncthreads();
    const float offset = *(const float *)base;
    const float *scale2 = (const float *)(base + 4);
    const uint64_t pairs = (n + 1) / 2;
    for (uint64_t p = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; p < pairs;
         p += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t i = 2 * p, b = i / ZO_NF4_BLOCK; /* 64 is even: i, i+1 share a block */
        const float a = __fadd_rn(__fmul_rn(map[base[off_absq + b]], scale2[b / ZO_NF4_BLOCK2]), offset);
        const uint8_t byte = base[off_codes + p];
        tstore(out, i, __fmul_rn(code[byte >> 4], a));
        if (i + 1 < n) tstore(out, i + 1, __fmul_rn(code[byte & 15], a));
    }
}

extern "C" zo_status cuda_launch_nf4_dequantize(cudaStream_t st, gpu_tensor out, const void *nf4,
                                                size_t n)
{
    zo_nf4_layout L;
    zo_nf4_layout_of(n, &L);
    nf4_tables tab;
    zo_nf4_absmax_map(tab.map);
    for (int k = 0; k < 16; k++) tab.code[k] = zo_nf4_code[k];
    ZO_LAUNCH(nf4_dequantize_kernel, grid_for((n + 1) / 2, BS), BS, 0, st, out,
              (const uint8_t *)nf4, n, L.off_absq, L.off_codes, tab);
    return cuda_launch_check("nf4_dequantize_kernel");
}
