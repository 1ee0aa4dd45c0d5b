/* Adam / AdamW on the device: over fp32 master state (gpu_adam_update) and
 * over m and v in bf16 or block-wise 8 bits (gpu_adam_state_update, whose
 * bf16 weights without a master round as the host's --master does). The
 * sequence of operations is cpu_adam's scalar reference and the CPU
 * backend's (gpu/ops_cpu_adam.c), element for element. Every multiply, add,
 * divide and square root is an explicitly rounded intrinsic (__fmul_rn,
 * __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn): nvcc never contracts those
 * into an FMA, so each operation rounds once, to nearest even, as on the CPU,
 * and the results match the CPU backend bit for bit (nan payloads aside). */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, grid_for */

extern "C" {
#include "common/nf4.h" /* defines: zo_dynamic_map */
}

#define BS 256

/* One element: p the weight, g the stored gradient, m and v in place. */
__device__ __forceinline__ float adam_elem(const gpu_adam_consts &c, float p, float g, float *m, float *v)
{
    g = __fmul_rn(g, c.grad_mult);
    if (c.use_l2) g = __fadd_rn(g, __fmul_rn(c.l2, p));
    float mi = __fadd_rn(__fmul_rn(c.beta1, *m), __fmul_rn(c.omb1, g));
    float vi = __fadd_rn(__fmul_rn(c.beta2, *v), __fmul_rn(c.omb2, __fmul_rn(g, g)));
    float d = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), c.inv_bc2_sqrt), c.eps);
    if (!c.use_l2) p = __fsub_rn(p, __fmul_rn(c.lr_wd, p));
    p = __fsub_rn(p, __fmul_rn(c.step_size, __fdiv_rn(mi, d)));
    *m = mi;
    *v = vi;
    return p;
}

/* param, m, v [n] fp32, in place; grad [n] any dtype; out16 [n] fp16/bf16 or
 * data NULL. The constants come by value (a kernel argument). */
__global__ void adam_update_kernel(gpu_adam_consts c, size_t n, float *param, gpu_tensor grad,
                                   float *m, float *v, gpu_tensor out16)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float p = adam_elem(c, param[i], tload(grad, i), &m[i], &v[i]);
        param[i] = p;
        if (out16.data) tstore(out16, i, p);
    }
}

extern "C" zo_status cuda_launch_adam_update(cudaStream_t st, const gpu_adam_consts *c, size_t n,
                                             float *param, gpu_tensor grad, float *m, float *v,
                                             gpu_tensor out16)
{
    ZO_LAUNCH(adam_update_kernel, grid_for(n, BS), BS, 0, st, *c, n, param, grad, m, v, out16);
    return cuda_launch_check("adam_update_kernel");
}

/* ---- encoded m and v ------------------------------------------------------------------ */

/* Element i's constants (of the call): the step's inside a decay range (or
 * everywhere, n_decay < 0), else c0, the step's without weight decay. */
__device__ __forceinline__ const gpu_adam_consts &consts_at(const gpu_adam_state_args &x,
                                                           const gpu_adam_consts &c0, uint64_t i)
{
    if (x.n_decay < 0) return x.c;
    for (int k = 0; k < x.n_decay; k++)
        if (i < x.decay[k][1]) return i >= x.decay[k][0] ? x.c : c0;
    return c0;
}

__device__ __forceinline__ gpu_adam_consts no_decay(const gpu_adam_consts &c)
{
    gpu_adam_consts c0 = c;
    c0.l2 = 0.0f;
    c0.lr_wd = 0.0f;
    return c0;
}

/* ---- the weights without a master (bf16 param) --------------------------------------- */

/* bf16 bits as fp32, and fp32 rounded to bf16 bits: to nearest even (a nan
 * kept quiet with its sign) and stochastically, as common/dtype.h's
 * zo_bf16_to_f32, zo_f32_to_bf16 and zo_f32_to_bf16_sr. */
__device__ __forceinline__ float bf16_bits_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t f32_bf16_rn(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ uint16_t f32_bf16_sr(float f, uint32_t r)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return f32_bf16_rn(f);
    return (uint16_t)((u + (r & 0xffffu)) >> 16);
}

/* Element i's weight before the update: param, plus (Kahan) its compensation. */
__device__ __forceinline__ float weight_in(gpu_tensor param, const uint16_t *comp, uint64_t i)
{
    float p = tload(param, i);
    return comp ? __fadd_rn(p, bf16_bits_f32(comp[i])) : p;
}

/* ... and after it: p stored into param as x.round says (comp: what
 * rounding to nearest lost), and into out16. */
__device__ __forceinline__ void weight_out(const gpu_adam_state_args &x, gpu_tensor param, gpu_tensor out16,
                                           uint16_t *comp, uint64_t i, float p)
{
    if (x.round == GPU_ADAM_ROUND_NEAREST) {
        tstore(param, i, p);
        if (out16.data) tstore(out16, i, p);
        return;
    }
    uint16_t w = x.round == GPU_ADAM_ROUND_STOCHASTIC
                     ? f32_bf16_sr(p, zo_adam_sr_bits(x.sr_step, x.sr_block, x.sr_first + i))
                     : f32_bf16_rn(p);
    ((uint16_t *)param.data)[i] = w;
    if (comp) comp[i] = f32_bf16_rn(__fsub_rn(p, bf16_bits_f32(w)));
    if (out16.data) tstore(out16, i, bf16_bits_f32(w));
}

/* fp32 m, v (bf16 weights without a master): element by element, [first,
 * first + n) of the state. */
__global__ void adam_f32s_kernel(gpu_adam_state_args x, size_t n, gpu_tensor param, gpu_tensor grad,
                                 char *state, gpu_tensor out16, uint16_t *comp)
{
    const gpu_adam_consts c0 = no_decay(x.c);
    float *sm = (float *)(state + x.off_m) + x.first, *sv = (float *)(state + x.off_v) + x.first;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float p = adam_elem(consts_at(x, c0, i), weight_in(param, comp, i), tload(grad, i), &sm[i], &sv[i]);
        weight_out(x, param, out16, comp, i, p);
    }
}

/* bf16 m, v: element by element, [first, first + n) of the state. */
__global__ void adam_bf16s_kernel(gpu_adam_state_args x, size_t n, gpu_tensor param, gpu_tensor grad,
                                  char *state, gpu_tensor out16, uint16_t *comp)
{
    const gpu_adam_consts c0 = no_decay(x.c);
    __nv_bfloat16 *sm = (__nv_bfloat16 *)(state + x.off_m) + x.first;
    __nv_bfloat16 *sv = (__nv_bfloat16 *)(state + x.off_v) + x.first;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float m = __bfloat162float(sm[i]), v = __bfloat162float(sv[i]);
        float p = adam_elem(consts_at(x, c0, i), weight_in(param, comp, i), tload(grad, i), &m, &v);
        weight_out(x, param, out16, comp, i, p);
        sm[i] = __float2bfloat16_rn(m);
        sv[i] = __float2bfloat16_rn(v);
    }
}

/* The two dynamic maps (2 KiB of kernel parameters). */
struct q8_maps {
    float m[256], v[256];
};

#define Q8_PER_THREAD (GPU_ADAM_Q8_BLOCK_MAX / BS)

/* The code of x: the count of thresholds below it (a nan as 0). */
__device__ __forceinline__ uint8_t q8_code(const float *thr, float x)
{
    if (x != x) x = 0.0f;
    int p = 0;
    for (int step = 128; step >= 1; step >>= 1)
        if (x > thr[p + step - 1]) p += step;
    return (uint8_t)p;
}

/* The absmax a block keeps from its largest magnitude (bits; a nan is
 * largest) and the factor its values are coded with (cpu_adam's rule:
 * 1/absmax for a normal absmax, else 0, the absmax 0 or nan). */
__device__ __forceinline__ float q8_absmax(uint32_t max_mag, float *inv)
{
    float a = __uint_as_float(max_mag);
    *inv = a >= 1.17549435e-38f ? __fdiv_rn(1.0f, a) : 0.0f;
    return a >= 1.17549435e-38f || a != a ? a : 0.0f;
}

/* 8-bit m, v: one thread block (BS threads) per q8 block of the call. Each
 * thread decodes, updates and keeps up to Q8_PER_THREAD values; the block
 * finds the new absmax (the largest magnitude, a tree of maxima in shared
 * memory: an order-free result), then codes its values. */
__global__ void adam_q8_kernel(gpu_adam_state_args x, size_t n, gpu_tensor param, gpu_tensor grad, char *state,
                               gpu_tensor out16, uint16_t *comp, q8_maps maps)
{
    __shared__ float map_m[256], map_v[256], thr_m[255], thr_v[255];
    __shared__ uint32_t red_m[BS], red_v[BS];
    const int t = threadIdx.x;
    map_m[t] = maps.m[t];
    map_v[t] = maps.v[t];
    __syncthreads();
    if (t < 255) { /* midpoints, in double, rounded once (common/nf4.h) */
        thr_m[t] = (float)(((double)map_m[t] + (double)map_m[t + 1]) / 2.0);
        thr_v[t] = (float)(((double)map_v[t] + (double)map_v[t + 1]) / 2.0);
    }
    const gpu_adam_consts c0 = no_decay(x.c);
    const uint64_t e0 = (uint64_t)blockIdx.x * x.block, lo = x.first + e0;
    const uint64_t len = n - e0 < x.block ? n - e0 : x.block;
    uint8_t *qm = (uint8_t *)state + x.off_m + lo, *qv = (uint8_t *)state + x.off_v + lo;
    float *am = (float *)(state + x.off_am) + lo / x.block, *av = (float *)(state + x.off_av) + lo / x.block;
    const float a_m = *am, a_v = *av;
    float mm[Q8_PER_THREAD], vv[Q8_PER_THREAD];
    uint32_t mx_m = 0, mx_v = 0;
    for (int j = 0; j < Q8_PER_THREAD; j++) {
        uint64_t k = (uint64_t)j * BS + t;
        if (k >= len) break;
        float m = __fmul_rn(map_m[qm[k]], a_m), v = __fmul_rn(map_v[qv[k]], a_v);
        uint64_t i = e0 + k;
        float p = adam_elem(consts_at(x, c0, i), weight_in(param, comp, i), tload(grad, i), &m, &v);
        weight_out(x, param, out16, comp, i, p);
        mm[j] = m;
        vv[j] = v;
        uint32_t bm = __float_as_uint(m) & 0x7fffffffu, bv = __float_as_uint(v) & 0x7fffffffu;
        mx_m = bm > mx_m ? bm : mx_m;
        mx_v = bv > mx_v ? bv : mx_v;
    }
    red_m[t] = mx_m;
    red_v[t] = mx_v;
    __syncthreads(); /* every thread has read the old absmax, and the thresholds are in */
    for (int s = BS / 2; s > 0; s >>= 1) {
        if (t < s) {
            red_m[t] = red_m[t + s] > red_m[t] ? red_m[t + s] : red_m[t];
            red_v[t] = red_v[t + s] > red_v[t] ? red_v[t + s] : red_v[t];
        }
        __syncthreads();
    }
    float inv_m, inv_v;
    const float new_m = q8_absmax(red_m[0], &inv_m), new_v = q8_absmax(red_v[0], &inv_v);
    if (t == 0) {
        *am = new_m;
        *av = new_v;
    }
    for (int j = 0; j < Q8_PER_THREAD; j++) {
        uint64_t k = (uint64_t)j * BS + t;
        if (k >= len) break;
        qm[k] = q8_code(thr_m, __fmul_rn(mm[j], inv_m));
        qv[k] = q8_code(thr_v, __fmul_rn(vv[j], inv_v));
    }
}

extern "C" zo_status cuda_launch_adam_state_update(cudaStream_t st, const gpu_adam_state_args *x, size_t n,
                                                   gpu_tensor param, gpu_tensor grad, void *state,
                                                   gpu_tensor out16, void *comp)
{
    uint16_t *cp = (uint16_t *)comp;
    if (x->type == GPU_ADAM_STATE_F32) {
        ZO_LAUNCH(adam_f32s_kernel, grid_for(n, BS), BS, 0, st, *x, n, param, grad, (char *)state, out16, cp);
        return cuda_launch_check("adam_f32s_kernel");
    }
    if (x->type == GPU_ADAM_STATE_BF16) {
        ZO_LAUNCH(adam_bf16s_kernel, grid_for(n, BS), BS, 0, st, *x, n, param, grad, (char *)state, out16, cp);
        return cuda_launch_check("adam_bf16s_kernel");
    }
    q8_maps maps;
    zo_dynamic_map(maps.m, 1);
    zo_dynamic_map(maps.v, 0);
    size_t blocks = (n + x->block - 1) / x->block;
    ZO_LAUNCH(adam_q8_kernel, (unsigned)blocks, BS, 0, st, *x, n, param, grad, (char *)state, out16, cp, maps);
    return cuda_launch_check("adam_q8_kernel");
}
