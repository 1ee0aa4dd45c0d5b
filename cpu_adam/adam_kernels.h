/* Private to cpu_adam: the per-step constants and the kernel table every
 * implementation fills. Each kernel processes one thread's chunk; the caller
 * (cpu_adam.c) validates arguments and splits the work. */
#ifndef ZO_CPU_ADAM_KERNELS_H
#define ZO_CPU_ADAM_KERNELS_H

#include <math.h>
#include <stddef.h>

#include "common/adam_math.h" /* zo_adam_consts, zo_adam_step_elem */
#include "common/dtype.h" /* zo_dtype, scalar RNE conversions */

/* Loop-invariant scalars of one step (common/adam_math.h), computed once so
 * that every implementation uses the very same values. */
typedef zo_adam_consts adam_consts;

/* Update n elements starting at the given pointers (one thread's chunk);
 * out NULL means no 16-bit copy, else od is ZO_DTYPE_F16 or ZO_DTYPE_BF16. */
typedef void (*adam_update_fn)(const adam_consts *c, size_t n, float *restrict p,
                               const void *restrict g, zo_dtype gd, float *restrict m,
                               float *restrict v, void *restrict out, zo_dtype od);
/* Sum of squares of n elements in double (inf/nan propagate into it). */
typedef double (*adam_sumsq_fn)(const void *g, zo_dtype gd, size_t n);

/* One element of the update: the reference sequence of operations
 * (common/adam_math.h). Every vector kernel performs exactly these
 * operations, in this order, lane by lane; the library is built with
 * -ffp-contract=off so no FMA sneaks in. */
static inline float adam_step_elem(const adam_consts *c, float p, float g, float *m, float *v)
{
    return zo_adam_step_elem(c, p, g, m, v);
}

/* Elements [i0, n) with the scalar sequence: the reference, and the head and
 * tail of the AVX2 kernel. */
static inline void adam_update_scalar_range(const adam_consts *c, size_t i0, size_t n,
                                            float *restrict p, const void *restrict g,
                                            zo_dtype gd, float *restrict m, float *restrict v,
                                            void *restrict out, zo_dtype od)
{
    for (size_t i = i0; i < n; i++) {
        float pi = adam_step_elem(c, p[i], zo_load_f32(g, gd, i), &m[i], &v[i]);
        p[i] = pi;
        if (out) zo_store_f32(out, od, i, pi);
    }
}

void adam_update_scalar(const adam_consts *c, size_t n, float *restrict p,
                        const void *restrict g, zo_dtype gd, float *restrict m,
                        float *restrict v, void *restrict out, zo_dtype od);
double adam_sumsq_scalar(const void *g, zo_dtype gd, size_t n);

/* adam_avx2.c: AVX2 + F16C. */
void adam_update_avx2(const adam_consts *c, size_t n, float *restrict p, const void *restrict g,
                      zo_dtype gd, float *restrict m, float *restrict v, void *restrict out,
                      zo_dtype od);
double adam_sumsq_avx2(const void *g, zo_dtype gd, size_t n);

/* adam_avx512.c: AVX-512 F/BW/VL; the _bf16 variant also uses AVX512-BF16's
 * vcvtneps2bf16 for the bf16 copy. */
void adam_update_avx512(const adam_consts *c, size_t n, float *restrict p,
                        const void *restrict g, zo_dtype gd, float *restrict m,
                        float *restrict v, void *restrict out, zo_dtype od);
void adam_update_avx512_bf16(const adam_consts *c, size_t n, float *restrict p,
                             const void *restrict g, zo_dtype gd, float *restrict m,
                             float *restrict v, void *restrict out, zo_dtype od);
double adam_sumsq_avx512(const void *g, zo_dtype gd, size_t n);

#endif
