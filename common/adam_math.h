/* Adam / AdamW: the hyperparameters, their checks, the per-step scalars and
 * the per-element sequence of operations, defined once. cpu_adam's kernels
 * and every device backend follow this definition, so an update gives the
 * same bits wherever it runs (see docs/cpu_adam.md).
 *
 * Per element, with g the stored gradient:
 *     g  = g * grad_mult                 (1/loss_scale times the clip coefficient)
 *     g += weight_decay * p              (L2 only)
 *     m  = beta1 * m + (1 - beta1) * g
 *     v  = beta2 * v + (1 - beta2) * (g * g)
 *     d  = sqrt(v) * (1 / sqrt(1 - beta2^step)) + eps
 *     p  = p - (lr * weight_decay) * p   (AdamW only)
 *     p  = p - (lr / (1 - beta1^step)) * (m / d)
 * The scalars in parentheses are computed once per step in double and
 * rounded to float (zo_adam_consts_make). A translation unit that calls
 * zo_adam_step_elem must be compiled with -ffp-contract=off, so that no
 * multiply-add is fused. */
#ifndef ZO_COMMON_ADAM_MATH_H
#define ZO_COMMON_ADAM_MATH_H

#include <math.h>
#include <stdint.h>

#include "common/status.h" /* zo_status */

#ifdef __cplusplus
extern "C" {
#endif

/* The host's two OpenMP teams while the optimizer's own thread (the overlap
 * and dpu schedules) updates beside the host thread's gradient sums
 * (cpu_adam's adam_grad_accumulate), out of `cores` threads: with
 * opt_threads set the optimizer gets it and the sums the rest (at least
 * one); unset, the sums get a quarter (at least one) and the optimizer the
 * rest, so that the two together never ask for more than `cores`. The
 * runtime and memplan's cost model both split so. */
static inline void zo_host_teams(int cores, int opt_threads, int *sum_threads, int *opt_out)
{
    if (cores < 1) cores = 1;
    int o = opt_threads > 0 ? opt_threads : cores - (cores / 4 > 1 ? cores / 4 : 1);
    if (o < 1) o = 1;
    int s = cores - o;
    *sum_threads = s < 1 ? 1 : s;
    *opt_out = o;
}

typedef enum zo_adam_decay {
    ZO_ADAM_DECAY_ADAMW = 0, /* decoupled: p -= lr * weight_decay * p */
    ZO_ADAM_DECAY_L2,        /* classic Adam: g += weight_decay * p */
} zo_adam_decay;

typedef struct zo_adam_hparams {
    float lr, beta1, beta2, eps, weight_decay;
    zo_adam_decay decay;
    long step;       /* 1-based, for bias correction */
    float grad_mult; /* 1/loss_scale * clip coefficient; 1 for none, must be > 0 */
} zo_adam_hparams;

/* Loop-invariant scalars of one step. */
typedef struct zo_adam_consts {
    float grad_mult;     /* applied to the stored gradient */
    float beta1, omb1;   /* beta1, 1 - beta1 */
    float beta2, omb2;   /* beta2, 1 - beta2 */
    float eps;
    float l2;            /* weight_decay for L2, else 0 */
    float lr_wd;         /* lr * weight_decay for AdamW, else 0 */
    float step_size;     /* lr / (1 - beta1^step) */
    float inv_bc2_sqrt;  /* 1 / sqrt(1 - beta2^step) */
    int use_l2;          /* ZO_ADAM_DECAY_L2 */
} zo_adam_consts;

/* ZO_ERR_INVALID naming `who` and the field when a hyperparameter is out of
 * range: lr, eps, weight_decay finite and >= 0; betas in [0, 1); step >= 1;
 * grad_mult finite and > 0; decay one of the two modes. */
zo_status zo_adam_check_hparams(const char *who, const zo_adam_hparams *hp);

/* The per-step scalars (hp already checked). */
zo_adam_consts zo_adam_consts_make(const zo_adam_hparams *hp);

/* One element: the reference sequence of operations. */
static inline float zo_adam_step_elem(const zo_adam_consts *c, float p, float g, float *m, float *v)
{
    g = g * c->grad_mult;
    if (c->use_l2) g = g + c->l2 * p;
    float mi = c->beta1 * *m + c->omb1 * g;
    float vi = c->beta2 * *v + c->omb2 * (g * g);
    float d = sqrtf(vi) * c->inv_bc2_sqrt + c->eps;
    if (!c->use_l2) p = p - c->lr_wd * p; /* not p * (1 - lr*wd): 1 - lr*wd rounds badly */
    p = p - c->step_size * (mi / d);
    *m = mi;
    *v = vi;
    return p;
}

/* Callable on the host and, in CUDA sources, on the device. */
#ifdef __CUDACC__
#define ZO_ADAM_HD __host__ __device__
#else
#define ZO_ADAM_HD
#endif

/* The random bits of stochastic rounding (--master stochastic): a
 * counter-based hash (splitmix64's finalizer) of the step, the block and the
 * element's index in the whole block, so every rank, every run and every
 * backend (the host's update, gpu_adam_state_update) draws the same bits
 * for the same weight. Its low 16 bits feed zo_f32_to_bf16_sr
 * (common/dtype.h). */
static inline ZO_ADAM_HD uint32_t zo_adam_sr_bits(uint64_t step, uint64_t block, uint64_t i)
{
    uint64_t z = step * 0x9e3779b97f4a7c15ull ^ (block << 40 ^ i) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)(z ^ (z >> 31));
}

/* Where the parts of encoded moments of n values lie in one buffer, the
 * layout of cpu_adam's encoded state (cpu_adam.h, "optimizer state
 * encodings") and of the device's (gpu_adam_state_update): m, then v (es
 * bytes a value: 4 fp32, 2 bf16, 1 a q8 code), then, with n_blocks > 0 (q8),
 * the fp32 absmax of m's blocks and of v's; each part starts on a 64-byte
 * boundary of the buffer. */
typedef struct zo_adam_state_offsets {
    uint64_t m, v, absmax_m, absmax_v; /* byte offsets */
    uint64_t bytes;                    /* the whole buffer */
} zo_adam_state_offsets;

static inline zo_adam_state_offsets zo_adam_state_offsets_of(uint64_t es, uint64_t n, uint64_t n_blocks)
{
    zo_adam_state_offsets o;
    uint64_t end;
    o.m = 0;
    o.v = (es * n + 63) & ~(uint64_t)63;
    end = o.v + es * n;
    o.absmax_m = o.absmax_v = end;
    if (n_blocks) {
        o.absmax_m = (end + 63) & ~(uint64_t)63;
        o.absmax_v = (o.absmax_m + 4 * n_blocks + 63) & ~(uint64_t)63;
        end = o.absmax_v + 4 * n_blocks;
    }
    o.bytes = end;
    return o;
}

#ifdef __cplusplus
}
#endif

#endif
