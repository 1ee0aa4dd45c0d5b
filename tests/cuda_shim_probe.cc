/* Kernels that probe the host shim's primitives (tests/test_cuda_shim.c
 * checks what they return): barriers across warps and with returned
 * threads, every warp shuffle, kernels.cuh's block reductions, atomics,
 * dynamic shared memory and its limit, the 16-bit conversions and rounded
 * intrinsics, mma_ptx.cuh's emulation of mma.sync and ldmatrix, and the
 * launches a GPU refuses or leaves undefined. Written
 * as the kernel sources are (ZO_LAUNCH, cuda_launch_check), inside a
 * namespace as gpu/cuda/shim/<family>.cc include theirs; each probe_* is a
 * launcher callable from C. */
#include "gpu/cuda/shim/shim_prelude.h"

namespace zo_shim_kernels {
#include "gpu/cuda/kernels.cuh" /* defines: block_max, block_sum_d, warp_sum, ZO_LAUNCH */
#include "gpu/cuda/mma_ptx.cuh" /* defines: mma_m16n8k16, ldmatrix_x4, ldmatrix_x4_trans */

/* ---- barriers ---------------------------------------------------------------- */

#define PB_THREADS 256
#define PB_ROUNDS 4

/* Round r: thread t writes s[t] = (block+1)*100000 + r*1000 + t, then after
 * the barrier adds s[(7t + r + 1) % 256] to its sum. In block 1 the last
 * warp returns after round 1: the barriers of rounds 2 and 3 must still let
 * the others through, and its slots keep their round-1 values. */
__global__ void probe_barrier_kernel(int *out)
{
    __shared__ int s[PB_THREADS];
    const int t = threadIdx.x, b = blockIdx.x;
    int sum = 0;
    for (int r = 0; r < PB_ROUNDS; r++) {
        if (b == 1 && r == 2 && t >= PB_THREADS - 32) return;
        s[t] = (b + 1) * 100000 + r * 1000 + t;
        __syncthreads();
        sum += s[(7 * t + r + 1) % PB_THREADS];
        __syncthreads();
        out[(b * PB_THREADS + t) * PB_ROUNDS + r] = sum;
    }
}

/* ---- warp shuffles -------------------------------------------------------------- */

/* Two warps; per thread t (lane l): out[t*8 + k] for the k-th exchange. */
__global__ void probe_shfl_kernel(double *out)
{
    const int t = threadIdx.x, l = t % WARP;
    double *o = out + t * 8;
    o[0] = __shfl_sync(FULL_MASK, t * 10 + 1, (l * 5 + 3) % WARP);
    o[1] = __shfl_xor_sync(FULL_MASK, (float)t + 0.25f, 5);
    o[2] = __shfl_up_sync(FULL_MASK, t, 3);
    o[3] = __shfl_down_sync(FULL_MASK, t, 2);
    o[4] = __shfl_sync(FULL_MASK, t, 3, 16);         /* lane 3 of each half warp */
    o[5] = __shfl_xor_sync(FULL_MASK, t + 0.5, 17);  /* a double */
    o[6] = __shfl_sync(FULL_MASK, (long long)t << 40, 31 - l);
    __syncwarp();
    o[7] = warp_sum((float)l); /* kernels.cuh's butterfly */
}

/* ---- block reductions of kernels.cuh --------------------------------------------- */

/* One block of blockDim.x threads; thread t reduces in[t]; every thread
 * writes what it got, so that each one's result is checked. */
__global__ void probe_reduce_kernel(const float *in, float *mx, double *sum, float *mx2)
{
    const int t = threadIdx.x;
    const float v = in[t];
    float a = block_max(v);
    double s = block_sum_d(v);
    float c = block_max(-v); /* again at once: the ending barrier guards `part` */
    mx[t] = a;
    sum[t] = s;
    mx2[t] = c;
}

/* ---- atomics -------------------------------------------------------------------- */

struct probe_atomic_out {
    int count, winners, claimed_by, max_id, exch;
    unsigned bits;
    float fsum;
    double dsum;
};

__global__ void probe_atomics_kernel(probe_atomic_out *o)
{
    const int id = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(&o->count, 1);
    atomicAdd(&o->fsum, (float)(id % 7));
    atomicAdd(&o->dsum, 0.5 * id);
    atomicOr(&o->bits, 1u << (id % 32));
    atomicMax(&o->max_id, id);
    atomicExch(&o->exch, 5);
    if (atomicCAS(&o->claimed_by, -1, id) == -1) atomicAdd(&o->winners, 1);
}

/* ---- dynamic shared memory ------------------------------------------------------- */

/* first[t]: dyn[t] before any write (the shim's fill); rev[t]: dyn[n-1-t]
 * after every thread wrote dyn[t] = t; n = the bytes / 4. */
__global__ void probe_smem_kernel(float *first, float *rev, int n)
{
    ZO_EXTERN_SHARED(float, dyn);
    const int t = threadIdx.x;
    first[t] = dyn[t];
    __syncthreads();
    for (int i = t; i < n; i += blockDim.x) dyn[i] = (float)i;
    __syncthreads();
    rev[t] = dyn[n - 1 - t];
}

/* ---- conversions and rounded intrinsics ------------------------------------------ */

/* in [n] -> fp16 and bf16 bits, and both back; ops[4n]: a*b, a+b, a-b, a/b
 * with b = in[(i+1) % n]; fused[n]: a*b + c through __fmul_rn and __fadd_rn */
__global__ void probe_convert_kernel(const float *in, int n, uint16_t *h, uint16_t *bf,
                                     float *h_back, float *bf_back, float *ops, float *fused)
{
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float a = in[i], b = in[(i + 1) % n], c = in[(i + 2) % n];
        const __half hv = __float2half_rn(a);
        const __nv_bfloat16 bv = __float2bfloat16_rn(a);
        memcpy(&h[i], &hv, 2);
        memcpy(&bf[i], &bv, 2);
        h_back[i] = __half2float(hv);
        bf_back[i] = __bfloat162float(bv);
        ops[4 * i + 0] = __fmul_rn(a, b);
        ops[4 * i + 1] = __fadd_rn(a, b);
        ops[4 * i + 2] = __fsub_rn(a, b);
        ops[4 * i + 3] = __fdiv_rn(a, b);
        fused[i] = __fadd_rn(__fmul_rn(a, b), c);
    }
}

/* ---- mma.sync and ldmatrix (mma_ptx.cuh) ------------------------------------------ */

/* One warp, lane l: d[4l ..] = the m16n8k16 product of its fragments
 * a[4l ..], b[2l ..], c[4l ..] (the caller lays them out). */
template <typename T>
__global__ void probe_mma_kernel(const unsigned *a, const unsigned *b, const float *c, float *d)
{
    const int l = threadIdx.x;
    const unsigned af[4] = {a[4 * l], a[4 * l + 1], a[4 * l + 2], a[4 * l + 3]};
    const unsigned bf[2] = {b[2 * l], b[2 * l + 1]};
    const float cf[4] = {c[4 * l], c[4 * l + 1], c[4 * l + 2], c[4 * l + 3]};
    float df[4];
    mma_m16n8k16<T>(df, af, bf, cf);
    for (int i = 0; i < 4; i++) d[4 * l + i] = df[i];
}

/* One warp: src [32][16] 16-bit into shared memory as it lies; lane l
 * gives the address of row rows[l], columns 0 .. 7 (rows[] may be in any
 * order); r[4l ..] what ldmatrix .x4 (.trans with trans) returns to it. */
struct alignas(16) probe_ldm_tile {
    uint16_t v[32 * 16];
};

__global__ void probe_ldmatrix_kernel(const uint16_t *src, const int *rows, int trans, unsigned *r)
{
    __shared__ probe_ldm_tile sm;
    uint16_t *tile = sm.v;
    const int l = threadIdx.x;
    for (int x = l; x < 32 * 16; x += WARP) tile[x] = src[x];
    __syncwarp();
    unsigned f[4];
    if (trans) ldmatrix_x4_trans(f, tile + rows[l] * 16);
    else ldmatrix_x4(f, tile + rows[l] * 16);
    for (int i = 0; i < 4; i++) r[4 * l + i] = f[i];
}

/* ---- launches the shim refuses or stops ----------------------------------------- */

__global__ void probe_noop_kernel(int *out)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) *out = 1;
}

/* how = 0: lane 0 returns, then the rest shuffle; 1: lanes 0..15 shuffle
 * while lane 16 returns (after them); 2: a shuffle in a block of 48
 * threads; 3: lane 0 at __syncthreads, the others at a shuffle; 4: a
 * half-warp mask; 5: lanes at different exchanges */
__global__ void probe_bad_kernel(int *out, int how)
{
    const int l = threadIdx.x % WARP;
    int v = l;
    switch (how) {
    case 0:
        if (l == 0) return;
        v = __shfl_xor_sync(FULL_MASK, v, 1);
        break;
    case 1:
        if (l == 16) return;
        if (l < 16) v = __shfl_xor_sync(FULL_MASK, v, 1);
        break;
    case 2: v = __shfl_sync(FULL_MASK, v, 0); break;
    case 3:
        if (l == 0) __syncthreads();
        else v = __shfl_sync(FULL_MASK, v, 0);
        break;
    case 4: v = __shfl_sync(0x0000ffffu, v, 0, 16); break;
    case 5: v = l % 2 ? __shfl_xor_sync(FULL_MASK, v, 1) : __shfl_down_sync(FULL_MASK, v, 1); break;
    }
    out[threadIdx.x] = v;
}

} // namespace zo_shim_kernels

using namespace zo_shim_kernels;

extern "C" {

zo_status probe_barrier(int *out) /* [2 * 256 * 4] */
{
    ZO_LAUNCH(probe_barrier_kernel, 2, PB_THREADS, 0, NULL, out);
    return cuda_launch_check("probe_barrier_kernel");
}

zo_status probe_shfl(double *out) /* [64 * 8] */
{
    ZO_LAUNCH(probe_shfl_kernel, 1, 64, 0, NULL, out);
    return cuda_launch_check("probe_shfl_kernel");
}

zo_status probe_reduce(const float *in, int threads, float *mx, double *sum, float *mx2)
{
    ZO_LAUNCH(probe_reduce_kernel, 1, threads, 0, NULL, in, mx, sum, mx2);
    return cuda_launch_check("probe_reduce_kernel");
}

/* out[8]: count, winners, claimed_by, max_id, exch, bits, fsum, dsum (as double) */
zo_status probe_atomics(int blocks, int threads, double *out)
{
    probe_atomic_out o = {0, 0, -1, -1, 0, 0u, 0.0f, 0.0};
    ZO_LAUNCH(probe_atomics_kernel, blocks, threads, 0, NULL, &o);
    zo_status s = cuda_launch_check("probe_atomics_kernel");
    const double v[8] = {(double)o.count,  (double)o.winners, (double)o.claimed_by,
                         (double)o.max_id, (double)o.exch,    (double)o.bits,
                         (double)o.fsum,   o.dsum};
    memcpy(out, v, sizeof v);
    return s;
}

/* raise: 0 leaves the kernel's limit, else cudaFuncSetAttribute(raise) first */
zo_status probe_smem(int threads, size_t bytes, int raise, float *first, float *rev)
{
    if (raise) {
        cudaError_t e = cudaFuncSetAttribute(probe_smem_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, raise);
        zo_status s = cuda_status(e, "cudaFuncSetAttribute(probe_smem_kernel)");
        if (s != ZO_OK) return s;
    }
    ZO_LAUNCH(probe_smem_kernel, 1, threads, bytes, NULL, first, rev, (int)(bytes / 4));
    return cuda_launch_check("probe_smem_kernel");
}

zo_status probe_convert(const float *in, int n, uint16_t *h, uint16_t *bf, float *h_back,
                        float *bf_back, float *ops, float *fused)
{
    ZO_LAUNCH(probe_convert_kernel, 1, 96, 0, NULL, in, n, h, bf, h_back, bf_back, ops, fused);
    return cuda_launch_check("probe_convert_kernel");
}

zo_status probe_launch_shape(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, int *out)
{
    ZO_LAUNCH(probe_noop_kernel, dim3(gx, gy, gz), dim3(bx, by, bz), 0, NULL, out);
    return cuda_launch_check("probe_noop_kernel");
}

/* bf16: the operands' type (else fp16); a [32 * 4], b [32 * 2] packed
 * pairs, c, d [32 * 4] */
zo_status probe_mma(int bf16, const unsigned *a, const unsigned *b, const float *c, float *d)
{
    if (bf16) ZO_LAUNCH(probe_mma_kernel<__nv_bfloat16>, 1, WARP, 0, NULL, a, b, c, d);
    else ZO_LAUNCH(probe_mma_kernel<__half>, 1, WARP, 0, NULL, a, b, c, d);
    return cuda_launch_check("probe_mma_kernel");
}

/* src [32 * 16], rows [32], r [32 * 4] */
zo_status probe_ldmatrix(const uint16_t *src, const int *rows, int trans, unsigned *r)
{
    ZO_LAUNCH(probe_ldmatrix_kernel, 1, WARP, 0, NULL, src, rows, trans, r);
    return cuda_launch_check("probe_ldmatrix_kernel");
}

zo_status probe_bad(int how, int *out) /* out [64] */
{
    ZO_LAUNCH(probe_bad_kernel, 1, how == 2 ? 48 : 64, 0, NULL, out, how);
    return cuda_launch_check("probe_bad_kernel");
}

} /* extern "C" */
