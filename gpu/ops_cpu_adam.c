/* The CPU backend's Adam / AdamW (gpu_adam_update): the reference sequence of
 * cpu_adam (docs/cpu_adam.md) written again here, since gpu/ does not depend
 * on cpu_adam/. Built with -ffp-contract=off so that no multiply-add is fused
 * and every operation rounds as the scalar formula says; tests/test_gpu.c
 * checks the bits against cpu_adam itself. */
#include <math.h>
#include <omp.h>

#include "common/dtype.h" /* defines: zo_load_f32, zo_store_f32 */
#include "gpu/ops_cpu.h"  /* defines: cpu_adam_update, gpu_adam_consts */

/* One element: the operations of cpu_adam's adam_step_elem in the same order. */
static inline float adam_elem(const gpu_adam_consts *c, float p, float g, float *m, float *v)
{
    g = g * c->grad_mult;
    if (c->use_l2) g = g + c->l2 * p;
    float mi = c->beta1 * *m + c->omb1 * g;
    float vi = c->beta2 * *v + c->omb2 * (g * g);
    float d = sqrtf(vi) * c->inv_bc2_sqrt + c->eps;
    if (!c->use_l2) p = p - c->lr_wd * p; /* not p * (1 - lr*wd): that constant rounds badly */
    p = p - c->step_size * (mi / d);
    *m = mi;
    *v = vi;
    return p;
}

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
        float p = adam_elem(c, param[i], zo_load_f32(g, gd, i), &m[i], &v[i]);
        param[i] = p;
        if (out) zo_store_f32(out, od, i, p);
    }
}
