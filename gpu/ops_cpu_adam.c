/* The CPU backend's Adam / AdamW (gpu_adam_update): the reference sequence of
 * common/adam_math.h, which cpu_adam follows too. Built with -ffp-contract=off
 * so that no multiply-add is fused; tests/test_gpu.c checks the bits against
 * cpu_adam itself. */
#include <math.h>
#include <omp.h>

#include "common/adam_math.h" /* defines: zo_adam_step_elem */
#include "common/dtype.h" /* defines: zo_load_f32, zo_store_f32 */
#include "gpu/ops_cpu.h"  /* defines: cpu_adam_update, gpu_adam_consts */


/* param, m, v [n] fp32; grad [n] any dtype; out16 [n] fp16/bf16 or data NULL.
 * Element-wise, so the split among threads does not change a bit. */
void cpu_adam_update(const gpu_adam_consts *c, size_t n, float *param, gpu_tensor grad, float *m,
                     float *v, gpu_tensor out16, int nt)
{
    if (nt <= 0) nt = omp_get_max_threads(); /* 0: OpenMP's default, as the other ops */
    if (n < 65536) nt = 1; /* not worth a team */
    const void *g = grad.data;
    zo_dtype gd = grad.dtype;
    void *out = out16.data;
    zo_dtype od = out16.dtype;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (size_t i = 0; i < n; i++) {
        float p = zo_adam_step_elem(c, param[i], zo_load_f32(g, gd, i), &m[i], &v[i]);
        param[i] = p;
        if (out) zo_store_f32(out, od, i, p);
    }
}
