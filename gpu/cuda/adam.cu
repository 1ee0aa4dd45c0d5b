/* Adam / AdamW over fp32 master state on the device (gpu_adam_update): the
 * sequence of operations of cpu_adam's scalar reference and of the CPU
 * backend (gpu/ops_cpu_adam.c), element for element. Every multiply, add,
 * divide and square root is an explicitly rounded intrinsic (__fmul_rn,
 * __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn): nvcc never contracts those
 * into an FMA, so each operation rounds once, to nearest even, as on the CPU,
 * and the results match the CPU backend bit for bit (nan payloads aside). */
#include "gpu/cuda/kernels.cuh" /* defines: tload, tstore, grid_for */

#define BS 256

/* param, m, v [n] fp32, in place; grad [n] any dtype; out16 [n] fp16/bf16 or
 * data NULL. The constants come by value (a kernel argument). */
__global__ void adam_update_kernel(gpu_adam_consts c, size_t n, float *param, gpu_tensor grad,
                                   float *m, float *v, gpu_tensor out16)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float p = param[i];
        float g = __fmul_rn(tload(grad, i), c.grad_mult);
        if (c.use_l2) g = __fadd_rn(g, __fmul_rn(c.l2, p));
        float mi = __fadd_rn(__fmul_rn(c.beta1, m[i]), __fmul_rn(c.omb1, g));
        float vi = __fadd_rn(__fmul_rn(c.beta2, v[i]), __fmul_rn(c.omb2, __fmul_rn(g, g)));
        float d = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), c.inv_bc2_sqrt), c.eps);
        if (!c.use_l2) p = __fsub_rn(p, __fmul_rn(c.lr_wd, p));
        p = __fsub_rn(p, __fmul_rn(c.step_size, __fdiv_rn(mi, d)));
        m[i] = mi;
        v[i] = vi;
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
