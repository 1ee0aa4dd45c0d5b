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

/* The 16-bit copy a vector kernel writes: none, fp16 or bf16. */
enum { OUT_NONE = 0, OUT_F16, OUT_BF16 };

/* The entry point of a vector kernel, NAME with the adam_update_fn
 * signature: it calls BODY(c, n, p, g, GD, m, v, out, OD, L2), an
 * always-inline body, with constant gradient type GD, copy OD and decay mode
 * L2, so each of the 18 combinations compiles to its own loop. */
#define ADAM_KEY_(gd, od, l2) (((int)(gd) * 3 + (od)) * 2 + (l2))
#define ADAM_CASE_(BODY, GD, OD, L2)                                                          \
    case ADAM_KEY_(GD, OD, L2): BODY(c, n, p, g, GD, m, v, out, OD, L2); break;
#define ADAM_CASES_(BODY, GD)                                                                 \
    ADAM_CASE_(BODY, GD, OUT_NONE, 0) ADAM_CASE_(BODY, GD, OUT_F16, 0)                        \
    ADAM_CASE_(BODY, GD, OUT_BF16, 0) ADAM_CASE_(BODY, GD, OUT_NONE, 1)                       \
    ADAM_CASE_(BODY, GD, OUT_F16, 1) ADAM_CASE_(BODY, GD, OUT_BF16, 1)
#define ADAM_SPECIALIZED_UPDATE(NAME, BODY)                                                   \
    void NAME(const adam_consts *c, size_t n, float *restrict p, const void *restrict g,     \
              zo_dtype gd, float *restrict m, float *restrict v, void *restrict out,         \
              zo_dtype od)                                                                    \
    {                                                                                         \
        int o = !out ? OUT_NONE : od == ZO_DTYPE_F16 ? OUT_F16 : OUT_BF16;                    \
        switch (ADAM_KEY_(gd, o, c->use_l2 != 0)) {                                           \
            ADAM_CASES_(BODY, ZO_DTYPE_F32)                                                   \
            ADAM_CASES_(BODY, ZO_DTYPE_F16)                                                   \
            ADAM_CASES_(BODY, ZO_DTYPE_BF16)                                                  \
        default: break; /* cpu_adam.c passes only the types above */                          \
        }                                                                                     \
    }

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
