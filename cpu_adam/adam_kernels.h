/* Private to cpu_adam: the per-step constants and the kernel table every
 * implementation fills. Each kernel processes one thread's chunk; the caller
 * (cpu_adam.c) validates arguments and splits the work. */
#ifndef ZO_CPU_ADAM_KERNELS_H
#define ZO_CPU_ADAM_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "adam_q8.h"          /* adam_q8_tables */
#include "common/adam_math.h" /* zo_adam_consts, zo_adam_step_elem */
#include "common/dtype.h" /* zo_dtype, scalar RNE conversions */
#include "cpu_adam.h"     /* adam_impl */

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
/* The same sum taken in pieces: the kernel's accumulators between calls
 * (AVX-512's 8 x 8 doubles, AVX2's 8 x 4, the scalar's one), zeroed before
 * the first piece. Every piece but the last is a multiple of 64 elements;
 * the last (`last` 1, any length) returns the sum, the bits of one
 * adam_sumsq_fn call over all the pieces (the others return 0). */
typedef struct adam_sumsq_acc {
    double lane[64];
} adam_sumsq_acc;
typedef double (*adam_sumsq_part_fn)(adam_sumsq_acc *acc, const void *g, zo_dtype gd, size_t n, int last);
/* Chunk boundaries of the OpenMP splits fall on multiples of this many
 * elements (a 64-byte line of fp32 and a 32-byte half line of the 16-bit
 * arrays, times 4); at most ADAM_MAX_THREADS partial sums a call. */
#define ADAM_GRAIN ((size_t)64)
#define ADAM_MAX_THREADS 1024
/* How far ahead of its loads a vector sum of squares prefetches, in bytes.
 * Its conversions to double fill the reorder window, so fewer of its loads
 * are in flight than in a plain read and the stream from memory slows to
 * about two thirds of one (measured: bench_cpu_adam, docs/performance.md);
 * prefetching 4 KiB ahead brings it back to the read's speed. */
#define ADAM_SUMSQ_PREFETCH 4096
/* The same update with m and v stored as bf16 (ADAM_STATE_BF16). */
typedef void adam_bf16s_kernel(const adam_consts *c, size_t n, float *restrict p,
                               const void *restrict g, zo_dtype gd, uint16_t *restrict m,
                               uint16_t *restrict v, void *restrict out, zo_dtype od);
/* The same with 8-bit block-wise m and v (ADAM_STATE_Q8): elements [0, n) in
 * blocks of `block` (a multiple of 64; the last block may be shorter), codes
 * qm, qv [n], absmax am, av [ceil(n / block)]. */
typedef void adam_q8_kernel(const adam_consts *c, const adam_q8_tables *t, size_t block,
                            size_t n, float *restrict p, const void *restrict g, zo_dtype gd,
                            uint8_t *restrict qm, uint8_t *restrict qv, float *restrict am,
                            float *restrict av, void *restrict out, zo_dtype od);

/* The conversions of an encoded state (adam_state_to_f32, adam_state_from_f32)
 * over one thread's range: elements [0, n) in blocks of `block` (q8: a
 * multiple of 64; the last block may be shorter), codes qm, qv [n], absmax
 * am, av [ceil(n / block)]; bf16 moments qm, qv [n]. Every implementation
 * gives the scalar one's bits (adam_q8_encode_scalar: codes and absmax;
 * map[code] * absmax; zo_f32_to_bf16, zo_bf16_to_f32). The fp32 arrays need
 * only 4-byte alignment. */
typedef void adam_q8_decode_kernel(const adam_q8_tables *t, size_t block, size_t n,
                                   const uint8_t *restrict qm, const uint8_t *restrict qv,
                                   const float *restrict am, const float *restrict av,
                                   float *restrict m, float *restrict v);
typedef void adam_q8_encode_kernel(const adam_q8_tables *t, size_t block, size_t n,
                                   const float *restrict m, const float *restrict v,
                                   uint8_t *restrict qm, uint8_t *restrict qv,
                                   float *restrict am, float *restrict av);
typedef void adam_bf16_decode_kernel(size_t n, const uint16_t *restrict qm,
                                     const uint16_t *restrict qv, float *restrict m,
                                     float *restrict v);
typedef void adam_bf16_encode_kernel(size_t n, const float *restrict m, const float *restrict v,
                                     uint16_t *restrict qm, uint16_t *restrict qv);

/* The 16-bit copy a vector kernel writes: none, fp16 or bf16. */
enum { OUT_NONE = 0, OUT_F16, OUT_BF16 };

/* Vector kernels compile their loop once per combination of gradient type
 * GD, copy OD and decay mode L2 (18 loops), so no branch on them is left
 * inside. In a kernel's entry point,
 *     #define CALL(GD, OD, L2) body(args..., GD, ..., OD, L2)
 *     ADAM_DISPATCH(gd, out, od, c->use_l2, CALL)
 * calls the always-inline body with the three as constants. */
#define ADAM_KEY_(gd, od, l2) (((int)(gd) * 3 + (od)) * 2 + (l2))
#define ADAM_CASE_(CALL, GD, OD, L2)                                                          \
    case ADAM_KEY_(GD, OD, L2): CALL(GD, OD, L2); break;
#define ADAM_CASES_(CALL, GD)                                                                 \
    ADAM_CASE_(CALL, GD, OUT_NONE, 0) ADAM_CASE_(CALL, GD, OUT_F16, 0)                        \
    ADAM_CASE_(CALL, GD, OUT_BF16, 0) ADAM_CASE_(CALL, GD, OUT_NONE, 1)                       \
    ADAM_CASE_(CALL, GD, OUT_F16, 1) ADAM_CASE_(CALL, GD, OUT_BF16, 1)
#define ADAM_DISPATCH(gd, out, od, l2, CALL)                                                  \
    switch (ADAM_KEY_(gd, !(out) ? OUT_NONE : (od) == ZO_DTYPE_F16 ? OUT_F16 : OUT_BF16,      \
                      (l2) != 0)) {                                                           \
        ADAM_CASES_(CALL, ZO_DTYPE_F32)                                                       \
        ADAM_CASES_(CALL, ZO_DTYPE_F16)                                                       \
        ADAM_CASES_(CALL, ZO_DTYPE_BF16)                                                      \
    default: break; /* the entry points pass only the types above */                         \
    }

/* The step constants broadcast into a vector kernel's struct of registers
 * (fields gm, b1, omb1, b2, omb2, eps, l2, lr_wd, step, ibc2), with SET1 the
 * ISA's broadcast: `avx512_k K = ADAM_BROADCAST(_mm512_set1_ps, c);`. */
#define ADAM_BROADCAST(SET1, c)                                                               \
    {                                                                                         \
        .gm = SET1((c)->grad_mult), .b1 = SET1((c)->beta1), .omb1 = SET1((c)->omb1),          \
        .b2 = SET1((c)->beta2), .omb2 = SET1((c)->omb2), .eps = SET1((c)->eps),               \
        .l2 = SET1((c)->l2), .lr_wd = SET1((c)->lr_wd), .step = SET1((c)->step_size),         \
        .ibc2 = SET1((c)->inv_bc2_sqrt),                                                      \
    }

/* One element of the update: the reference sequence of operations
 * (common/adam_math.h). Every vector kernel performs exactly these
 * operations, in this order, lane by lane; the library is built with
 * -ffp-contract=off so no FMA sneaks in. */
static inline float adam_step_elem(const adam_consts *c, float p, float g, float *m, float *v)
{
    return zo_adam_step_elem(c, p, g, m, v);
}

/* The same sequence on vectors of fp32 lanes, with P the prefix of the ISA's
 * intrinsics (_mm256, _mm512), K a struct of broadcast constants
 * (ADAM_BROADCAST), pp, mm, vv, gg lvalues of vectors updated in place and L2
 * the decay mode (a constant in the specialized loops). */
#define ADAM_VECTOR_STEP(P, K, pp, mm, vv, gg, L2)                                             \
    do {                                                                                      \
        gg = P##_mul_ps(gg, (K)->gm);                                                         \
        if (L2) gg = P##_add_ps(gg, P##_mul_ps((K)->l2, pp));                                 \
        mm = P##_add_ps(P##_mul_ps((K)->b1, mm), P##_mul_ps((K)->omb1, gg));                  \
        vv = P##_add_ps(P##_mul_ps((K)->b2, vv), P##_mul_ps((K)->omb2, P##_mul_ps(gg, gg)));  \
        __typeof__(pp) d_ = P##_add_ps(P##_mul_ps(P##_sqrt_ps(vv), (K)->ibc2), (K)->eps);     \
        if (!(L2)) pp = P##_sub_ps(pp, P##_mul_ps((K)->lr_wd, pp));                           \
        pp = P##_sub_ps(pp, P##_mul_ps((K)->step, P##_div_ps(mm, d_)));                       \
    } while (0)

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

/* The bf16-state sequence for elements [i0, n): the reference, and the head
 * and tail of the AVX2 kernel. The update reads the moments widened and
 * stores them rounded to nearest even. */
static inline void adam_update_bf16s_range(const adam_consts *c, size_t i0, size_t n,
                                           float *restrict p, const void *restrict g,
                                           zo_dtype gd, uint16_t *restrict m,
                                           uint16_t *restrict v, void *restrict out, zo_dtype od)
{
    for (size_t i = i0; i < n; i++) {
        float mi = zo_bf16_to_f32(m[i]), vi = zo_bf16_to_f32(v[i]);
        float pi = adam_step_elem(c, p[i], zo_load_f32(g, gd, i), &mi, &vi);
        p[i] = pi;
        m[i] = zo_f32_to_bf16(mi);
        v[i] = zo_f32_to_bf16(vi);
        if (out) zo_store_f32(out, od, i, pi);
    }
}

/* adam_scalar.c: the references. */
void adam_update_scalar(const adam_consts *c, size_t n, float *restrict p,
                        const void *restrict g, zo_dtype gd, float *restrict m,
                        float *restrict v, void *restrict out, zo_dtype od);
double adam_sumsq_scalar(const void *g, zo_dtype gd, size_t n);
double adam_sumsq_part_scalar(adam_sumsq_acc *acc, const void *g, zo_dtype gd, size_t n, int last);
/* Code one block of n fp32 moments (the second half of a q8 step, and
 * adam_state_from_f32): its absmax values and codes. */
void adam_q8_encode_scalar(const adam_q8_tables *t, size_t n, const float *m, const float *v,
                           uint8_t *qm, uint8_t *qv, float *am, float *av);

/* adam_avx2.c: AVX2 + F16C (+ FMA in the sum of squares). */
void adam_update_avx2(const adam_consts *c, size_t n, float *restrict p, const void *restrict g,
                      zo_dtype gd, float *restrict m, float *restrict v, void *restrict out,
                      zo_dtype od);
double adam_sumsq_avx2(const void *g, zo_dtype gd, size_t n);
double adam_sumsq_part_avx2(adam_sumsq_acc *acc, const void *g, zo_dtype gd, size_t n, int last);

/* adam_avx512.c: AVX-512 F/BW/VL; the _bf16 variants also use AVX512-BF16's
 * vcvtneps2bf16 for bf16 results. */
void adam_update_avx512(const adam_consts *c, size_t n, float *restrict p,
                        const void *restrict g, zo_dtype gd, float *restrict m,
                        float *restrict v, void *restrict out, zo_dtype od);
void adam_update_avx512_bf16(const adam_consts *c, size_t n, float *restrict p,
                             const void *restrict g, zo_dtype gd, float *restrict m,
                             float *restrict v, void *restrict out, zo_dtype od);
double adam_sumsq_avx512(const void *g, zo_dtype gd, size_t n);
double adam_sumsq_part_avx512(adam_sumsq_acc *acc, const void *g, zo_dtype gd, size_t n, int last);

/* The kernels over encoded state: adam_scalar.c, adam_avx2.c, adam_avx512.c
 * (and _bf16.c), and adam_q8_avx512.c (and _bf16.c), whose q8 step also
 * needs AVX512-VBMI for its byte lookups. */
adam_bf16s_kernel adam_update_bf16s_scalar, adam_update_bf16s_avx2, adam_update_bf16s_avx512,
    adam_update_bf16s_avx512_bf16;
adam_q8_kernel adam_update_q8_scalar, adam_update_q8_avx2, adam_update_q8_avx512,
    adam_update_q8_avx512_bf16;
/* The conversions: scalar (adam_scalar.c), AVX2 (adam_avx2.c), AVX-512
 * (bf16: adam_avx512.c, the encoder also in _bf16.c; q8: adam_q8_avx512.c,
 * with VBMI, the step's own lookups and coder). */
adam_q8_decode_kernel adam_q8_decode_scalar, adam_q8_decode_avx2, adam_q8_decode_avx512;
adam_q8_encode_kernel adam_q8_encode_blocks_scalar, adam_q8_encode_avx2, adam_q8_encode_avx512;
adam_bf16_decode_kernel adam_bf16_decode_scalar, adam_bf16_decode_avx2, adam_bf16_decode_avx512;
adam_bf16_encode_kernel adam_bf16_encode_scalar, adam_bf16_encode_avx2, adam_bf16_encode_avx512,
    adam_bf16_encode_avx512_bf16;

/* cpu_adam.c: what the CPU has, and the checks and the split every entry
 * point shares. */
typedef struct adam_cpu {
    int avx2;        /* AVX2 + F16C + FMA */
    int avx512;      /* AVX-512 F, BW, VL */
    int avx512_bf16; /* AVX512-BF16 */
    int avx512_vbmi; /* AVX512-VBMI */
} adam_cpu;
adam_cpu adam_cpu_detect(void);

/* Resolve ADAM_IMPL_AUTO and check this CPU can run impl. */
zo_status adam_resolve_impl(const char *who, adam_impl impl, adam_impl *out);

/* An array an update reads or writes, for the checks. */
typedef struct adam_array {
    const char *name;
    const void *ptr;
    size_t bytes; /* its extent */
    size_t align; /* its element's alignment */
} adam_array;

/* The checks of an update: hyperparameters, dtypes, NULL, misaligned or
 * overlapping arrays (arr[0..na), a NULL ptr allowed only where `optional`
 * has its bit set). */
/* The arrays' part of adam_check_update: each non-NULL (but those whose
 * bit is set in `optional`), aligned, and no two overlapping. */
zo_status adam_check_arrays(const char *who, const adam_array *arr, int na, unsigned optional);
zo_status adam_check_update(const char *who, const adam_hparams *hp, zo_dtype gd, int with_out,
                            zo_dtype od, const adam_array *arr, int na, unsigned optional);

/* Threads for n elements: the request (0 = OpenMP's default), capped so each
 * gets at least ADAM_MIN_CHUNK elements. */
#define ADAM_MIN_CHUNK ((size_t)32768)
int adam_plan_threads(size_t n, int nthreads);
/* Thread t of nt gets units [*lo, *hi) of n: contiguous, boundaries on
 * multiples of `grain` units. */
void adam_chunk(size_t n, size_t grain, int t, int nt, size_t *lo, size_t *hi);

#endif
