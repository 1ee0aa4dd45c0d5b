/* Every op of the device interface, checked as data: the test walks the op
 * table (gpu/ops.h, GPU_OP_TABLE), asks each op's generator (parity_<name>)
 * for cases on a grid of shapes that crosses every block and panel boundary
 * of the kernels, runs each case on every backend at hand and compares the
 * result with an independent reference (ref_<name>: plain loops in double
 * precision written here, sharing no code with the kernels).
 *
 * Backends: the CPU device (always); the CUDA kernels compiled for the host
 * through the shim (gpu/cuda/shim/, where built: ZO_HAVE_CUDA_SHIM); a CUDA
 * device when one is present. An op the table lists without a generator and
 * a reference does not build; a generator that yields no case fails.
 *
 * What a case checks: every buffer of the op, outputs against the reference
 * within a tolerance of their storage type (|got - want| <= rtol * (|want| +
 * rms(want))), inputs unchanged, and guard bytes on both sides of every
 * buffer untouched (a write out of bounds). Accumulating outputs start from
 * random values, so "+=" and "=" are told apart.
 *
 * ZO_OPS_FILTER=name runs the ops whose name contains it; ZO_OPS_VERBOSE=1
 * prints every case; ZO_OPS_BACKENDS and ZO_OPS_SHIM_MAX_T (below) choose
 * the backends and the longest attention the shim's fiber kernels run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dtype.h" /* defines: zo_load_f32, zo_store_f32 */
#include "common/sanitize.h" /* defines: ZO_UNCHECKED */
#include "gpu/device.h"
#include "gpu/ops.h"              /* defines: GPU_OP_TABLE, gpu_op_run, gpu_op_infos */
#include "tests/support/check.h" /* defines: check_close_f64 */

#ifdef ZO_HAVE_CUDA_SHIM
#include "gpu/cuda/shim/shim_ops.h" /* defines: shim_cuda_ops, shim_exec_init */
#include "gpu/cuda/attention_tc.h"   /* defines: cuda_attn_tc_covers */
#include "gpu/cuda/attention_mma.h"  /* defines: cuda_attn_mma_covers */
#include "gpu/cuda/attention_gemm.h" /* defines: cuda_attn_plan_chunks */
#endif

/* ---- cases ------------------------------------------------------------------------ */

/* Element types of a case's buffers: the three storage types, and the
 * int32 and byte buffers some ops take. */
typedef enum etype { E_F32 = ZO_DTYPE_F32, E_F16 = ZO_DTYPE_F16, E_BF16 = ZO_DTYPE_BF16, E_I32, E_U8, E_F64 } etype;

typedef enum fill_kind {
    FILL_UNIFORM, /* uniform in [lo, hi) */
    FILL_INT,     /* integers in [lo, hi) */
    FILL_NONE,    /* left for the case's prep */
} fill_kind;

#define MAX_BUF (GPU_OP_MAX_T + GPU_OP_MAX_P)

typedef struct pcase pcase;

typedef struct pbuf {
    char slot;   /* 't' (args.t) or 'p' (args.p) */
    int index;
    etype type;
    size_t n;     /* elements */
    fill_kind fill;
    double lo, hi;
    int out;      /* the op writes it: compared with the reference */
    int alias;    /* >= 0: the same memory as buffer `alias` (in-place ops) */
    double rtol;  /* 0: the type's default */
    int no_rms;   /* the tolerance is rtol * |want| alone (plus fp32's error) */
    /* (optional) the comparison of an output whose elements are not values
     * (an encoded optimizer state): got and want [n], c the case; prints
     * what differs under `what` and returns 1 */
    int (*cmp)(const pcase *c, const char *what, const double *got, const double *want, size_t n);
    /* (optional) the smallest magnitude the error is measured against, for
     * an output that can cancel to zero (0: the reference's rms alone) */
    double floor;
    /* elements its start sits past GUARD (16-byte aligned): 1 starts it off
     * every 16-byte boundary, the CUDA kernels' scalar path */
    int skew;
    /* (optional) the tensor cores' accumulation (docs/testing.md): each
     * element's tolerance grows by cond_k times the sum of its terms'
     * magnitudes, which the reference writes (hostv's cond) */
    double cond_k, cond_c; /* per k-step, and once */
} pbuf;

/* Host values of every buffer (doubles), by slot: T[k], P[k]; NULL where
 * the op takes none. */
typedef struct hostv {
    double *T[GPU_OP_MAX_T];
    double *P[GPU_OP_MAX_P];
    /* (optional) per element of T[0], where a buffer asks (cond_k): the sum
     * of |terms| its value sums (cond) and the number of 16-term k-steps
     * that hold them (steps), as a tensor core sums them */
    double *cond, *steps;
} hostv;

struct pcase {
    gpu_op_id op;
    char label[160];
    gpu_op_args a; /* sizes and scalars; the harness binds the buffers */
    pbuf buf[MAX_BUF];
    int nbuf;
    /* (optional) make inputs consistent (a forward's saved values) */
    void (*prep)(const pcase *c, hostv *h);
    int param[4]; /* the generator's, for prep */
    /* the fiber kernels' paths in it all run in other cases of the grid
     * (marked by the generator: fiber_repeat); ZO_OPS_SHIM_LEAN leaves it
     * out of those backends */
    int fiber_repeat;
    /* the tensor-core kernels' path in it (the input type, the head size,
     * the gradients' type: their template arguments and dO's split) runs
     * in another case on them, at its tiles, window, cap and GQA: under
     * ZO_OPS_SHIM_LEAN left out of cuda-shim-tc (grads16_grid, scale_grid) */
    int tc_repeat;
};

/* Below this, fp16 stores subnormals: one step of them is the error floor. */
#define F16_SUBNORMAL_STEP 5.9604644775390625e-08 /* 2^-24 */

static double rtol_of(etype t)
{
    switch (t) {
    case E_F32: return 2e-5;
    case E_F16: return 2e-3;
    case E_BF16: return 1.6e-2;
    default: return 0.0; /* integers and bytes: exact */
    }
}

static size_t esize(etype t)
{
    return t == E_I32 ? 4 : t == E_U8 ? 1 : t == E_F64 ? 8 : zo_dtype_size((zo_dtype)t);
}

static const char *ename(etype t)
{
    static const char *n[] = {"f32", "f16", "bf16", "i32", "u8", "f64"};
    return n[t];
}

/* Buffers, in the order a case lists them. */
static int add_buf(pcase *c, char slot, int index, etype type, size_t n, fill_kind f, double lo,
                   double hi, int out)
{
    pbuf *b = &c->buf[c->nbuf];
    *b = (pbuf){slot, index, type, n, f, lo, hi, out, -1, 0.0, 0, NULL, 0.0, 0, 0.0, 0.0};
    return c->nbuf++;
}

#define IN_T(c, k, ty, n) add_buf(c, 't', k, ty, n, FILL_UNIFORM, -1.0, 1.0, 0)
#define OUT_T(c, k, ty, n) add_buf(c, 't', k, ty, n, FILL_UNIFORM, -1.0, 1.0, 1)
#define IN_P(c, k, ty, n) add_buf(c, 'p', k, ty, n, FILL_UNIFORM, -1.0, 1.0, 0)
#define OUT_P(c, k, ty, n) add_buf(c, 'p', k, ty, n, FILL_UNIFORM, -1.0, 1.0, 1)

/* Set by a generator around the cases whose fiber-kernel paths other
 * cases run too (pcase.fiber_repeat). */
static int fiber_repeat;
/* Set by a generator around the cases whose tensor-core path other cases
 * run too (pcase.tc_repeat). */
static int tc_repeat;

static pcase new_case(gpu_op_id op, const char *fmt, ...)
{
    pcase c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.fiber_repeat = fiber_repeat;
    c.tc_repeat = tc_repeat;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c.label, sizeof c.label, fmt, ap);
    va_end(ap);
    return c;
}

/* ---- the reference's helpers -------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) /* uniform in [0, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* v as the storage type keeps it (round to nearest even through fp32). */
static double as_stored(double v, etype t)
{
    if (t == E_I32 || t == E_U8 || t == E_F64) return v;
    float f = (float)v, r;
    uint16_t h;
    switch ((zo_dtype)t) {
    case ZO_DTYPE_F16: h = zo_f32_to_f16(f), r = zo_f16_to_f32(h); break;
    case ZO_DTYPE_BF16: h = zo_f32_to_bf16(f), r = zo_bf16_to_f32(h); break;
    default: r = f; break;
    }
    return r;
}

static double sq(double x) { return x * x; }

/* ---- references: plain loops in double, from the contracts of gpu/device.h ----------- */

/* GEMM: C = alpha op(A) op(B) + beta C, row-major, batched by strides. */
static void ref_gemm(const gpu_op_args *a, hostv *h)
{
    const gpu_gemm_desc *d = &a->d.gemm;
    int batch = d->batch > 0 ? d->batch : 1;
    for (int bi = 0; bi < batch; bi++) {
        const double *A = h->T[0] + (size_t)bi * d->stride_a, *B = h->T[1] + (size_t)bi * d->stride_b;
        double *C = h->T[2] + (size_t)bi * d->stride_c;
        for (int i = 0; i < d->m; i++)
            for (int j = 0; j < d->n; j++) {
                double s = 0.0;
                for (int p = 0; p < d->k; p++) {
                    double x = d->trans_a ? A[(size_t)p * d->lda + i] : A[(size_t)i * d->lda + p];
                    double y = d->trans_b ? B[(size_t)j * d->ldb + p] : B[(size_t)p * d->ldb + j];
                    s += x * y;
                }
                double *c = &C[(size_t)i * d->ldc + j];
                *c = d->alpha * s + (d->beta != 0.0f ? d->beta * *c : 0.0);
            }
    }
}

static void ref_bias_forward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], c = (int)a->i[1];
    for (int r = 0; r < n; r++)
        for (int j = 0; j < c; j++) h->T[0][(size_t)r * a->i[2] + j] += h->T[1][j];
}

static void ref_bias_backward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], c = (int)a->i[1];
    for (int j = 0; j < c; j++) {
        double s = 0.0;
        for (int r = 0; r < n; r++) s += h->T[1][(size_t)r * a->i[2] + j];
        h->T[0][j] += s;
    }
}

/* mean and 1/sqrt(var + eps) of row x[0..c) */
static void row_stats(const double *x, int c, double eps, double *mean, double *rstd)
{
    double m = 0.0, v = 0.0;
    for (int j = 0; j < c; j++) m += x[j];
    m /= c;
    for (int j = 0; j < c; j++) v += sq(x[j] - m);
    *mean = m;
    *rstd = 1.0 / sqrt(v / c + eps);
}

static double row_rms_rstd(const double *x, int c, double eps)
{
    double s = 0.0;
    for (int j = 0; j < c; j++) s += x[j] * x[j];
    return 1.0 / sqrt(s / c + eps);
}

/* t: y x w b; p: mean rstd */
static void ref_layernorm_forward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], c = (int)a->i[1];
    for (int r = 0; r < n; r++) {
        const double *x = h->T[1] + (size_t)r * c;
        double m, rs;
        row_stats(x, c, a->f[0], &m, &rs);
        h->P[0][r] = m;
        h->P[1][r] = rs;
        for (int j = 0; j < c; j++)
            h->T[0][(size_t)r * c + j] = (x[j] - m) * rs * h->T[2][j] + (h->T[3] ? h->T[3][j] : 0.0);
    }
}

/* t: dx dw db dy x w; p: mean rstd */
static void ref_layernorm_backward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], c = (int)a->i[1];
    for (int r = 0; r < n; r++) {
        const double *x = h->T[4] + (size_t)r * c, *dy = h->T[3] + (size_t)r * c;
        double m = h->P[0][r], rs = h->P[1][r], mg = 0.0, mgx = 0.0;
        for (int j = 0; j < c; j++) {
            double g = dy[j] * h->T[5][j], xh = (x[j] - m) * rs;
            mg += g;
            mgx += g * xh;
            if (h->T[1]) h->T[1][j] += dy[j] * xh;
            if (h->T[2]) h->T[2][j] += dy[j];
        }
        mg /= c, mgx /= c;
        for (int j = 0; j < c; j++) {
            double g = dy[j] * h->T[5][j], xh = (x[j] - m) * rs;
            h->T[0][(size_t)r * c + j] += rs * (g - mg - xh * mgx);
        }
    }
}

/* t: y x w; p: rstd */
static void ref_rmsnorm_forward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], c = (int)a->i[1];
    for (int r = 0; r < n; r++) {
        const double *x = h->T[1] + (size_t)r * c;
        double rs = row_rms_rstd(x, c, a->f[0]);
        h->P[0][r] = rs;
        for (int j = 0; j < c; j++) h->T[0][(size_t)r * c + j] = x[j] * rs * h->T[2][j];
    }
}

/* t: dx dw dy x w; p: rstd */
static void ref_rmsnorm_backward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], c = (int)a->i[1];
    for (int r = 0; r < n; r++) {
        const double *x = h->T[3] + (size_t)r * c, *dy = h->T[2] + (size_t)r * c;
        double rs = h->P[0][r], mgx = 0.0;
        for (int j = 0; j < c; j++) {
            mgx += dy[j] * h->T[4][j] * x[j];
            if (h->T[1]) h->T[1][j] += dy[j] * x[j] * rs;
        }
        mgx /= c;
        for (int j = 0; j < c; j++)
            h->T[0][(size_t)r * c + j] += rs * (dy[j] * h->T[4][j] - x[j] * rs * rs * mgx);
    }
}

/* t: x w saved; p: rstd. Head j of row r at r*ldx + j*d, in place, its
 * weight at j*w_stride; centered: LayerNorm without a bias (saved is the
 * input less its mean), else RMSNorm */
static void ref_head_norm_forward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], heads = (int)a->i[1], d = (int)a->i[2], centered = (int)a->i[5];
    for (int r = 0; r < n; r++)
        for (int j = 0; j < heads; j++) {
            double *x = h->T[0] + (size_t)r * a->i[3] + (size_t)j * d;
            const double *w = h->T[1] + (size_t)j * a->i[4];
            size_t ri = (size_t)r * heads + j;
            double m = 0.0, v = 0.0;
            for (int e = 0; e < d && centered; e++) m += x[e];
            m /= d;
            for (int e = 0; e < d; e++) v += sq(x[e] - m);
            double rs = 1.0 / sqrt(v / d + a->f[0]);
            if (h->P[0]) h->P[0][ri] = rs;
            for (int e = 0; e < d; e++) {
                if (h->T[2]) h->T[2][ri * d + e] = x[e] - m;
                x[e] = (x[e] - m) * rs * w[e];
            }
        }
}

/* t: dx dw saved w; p: rstd. dx holds dy on entry (in place); y = xh w with
 * xh = saved * rstd, so dw += dy xh and dx = rstd (g - mean(g) - xh
 * mean(g xh)), g = dy w (mean(g) only when centered: LayerNorm) */
static void ref_head_norm_backward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], heads = (int)a->i[1], d = (int)a->i[2], centered = (int)a->i[5];
    for (int r = 0; r < n; r++)
        for (int j = 0; j < heads; j++) {
            double *dy = h->T[0] + (size_t)r * a->i[3] + (size_t)j * d;
            size_t ri = (size_t)r * heads + j, wo = (size_t)j * a->i[4];
            const double *x = h->T[2] + ri * d, *w = h->T[3] + wo;
            double rs = h->P[0][ri], mg = 0.0, mgx = 0.0;
            for (int e = 0; e < d; e++) {
                mg += dy[e] * w[e];
                mgx += dy[e] * w[e] * x[e] * rs;
                if (h->T[1]) h->T[1][wo + e] += dy[e] * x[e] * rs;
            }
            mg = centered ? mg / d : 0.0;
            mgx /= d;
            for (int e = 0; e < d; e++) dy[e] = rs * (dy[e] * w[e] - mg - x[e] * rs * mgx);
        }
}

/* Attention geometry: element offsets of qkv, out, lse (gpu/device.h). */
typedef struct ageom {
    int t, hq, hkv, d, grp, window;
    size_t ld, ldo;
    double scale, cap; /* the desc's scale (0: 1/sqrt(d)) and soft cap (0: none) */
    double alibi;      /* the desc's ALiBi factor (0: none) */
    int alibi_bf16;    /* Falcon's form of it (gpu/device.h) */
} ageom;

static ageom geom_of(const gpu_attn_desc *a)
{
    ageom g = {a->t, a->hq, a->hkv, a->d, a->hq / a->hkv, a->window,
               (size_t)(a->hq + 2 * a->hkv) * a->d, (size_t)a->hq * a->d,
               a->scale > 0.0f ? (double)a->scale : 1.0 / sqrt((double)a->d), a->softcap, a->alibi,
               a->alibi_bf16};
    return g;
}

/* ALiBi's slope of head h of n as Hugging Face's build_alibi_tensor makes
 * them: cp the largest power of two <= n, base 2^-(2^-(log2 cp - 3)), the
 * first cp heads base^1 .. base^cp, the rest the odd powers 1, 3, 5, ... of
 * 2^-(2^-(log2 2cp - 3)) */
static double alibi_slope_d(int n, int h)
{
    int cp = 1;
    while (2 * cp <= n) cp *= 2;
    double base = pow(2.0, -pow(2.0, -(log2((double)cp) - 3.0)));
    if (h < cp) return pow(base, h + 1);
    double extra = pow(2.0, -pow(2.0, -(log2(2.0 * cp) - 3.0)));
    return pow(extra, 2 * (h - cp) + 1);
}

/* x to bfloat16's 8 significant bits, to nearest with ties to even (x >= 0) */
static double to_bf16_d(double x)
{
    int e;
    double m = frexp(x, &e); /* x = m 2^e, 0.5 <= m < 1 */
    return ldexp(nearbyint(ldexp(m, 8)), e - 8);
}

/* ALiBi's bias of query i (at position i) and key j of head h: alibi
 * slope_h (j - i), the contract's form (gpu/device.h; Hugging Face adds
 * slope_h j, the same softmax, its lse slope_h i higher); Falcon's form
 * (alibi_bf16): alibi bf16(bf16(slope_h) j), as modeling_falcon's
 * build_alibi_tensor multiplies the slopes in bfloat16 by the positions */
static double alibi_bias(const ageom *g, int h, int i, int j)
{
    if (!(g->alibi > 0.0)) return 0.0;
    if (g->alibi_bf16) return g->alibi * to_bf16_d(to_bf16_d(alibi_slope_d(g->hq, h)) * (double)j);
    return g->alibi * alibi_slope_d(g->hq, h) * (double)(j - i);
}

/* The score of dot product `dot`: scaled, then cap tanh(s / cap) with a
 * cap; *deriv (when not NULL) its derivative over the scaled score. */
static double score_of(const ageom *g, double dot, double *deriv)
{
    double s = dot * g->scale, th = g->cap > 0.0 ? tanh(s / g->cap) : 0.0;
    if (deriv) *deriv = g->cap > 0.0 ? 1.0 - th * th : 1.0;
    return g->cap > 0.0 ? g->cap * th : s;
}

/* The first key query i sees: the last `window` positions, or all. */
static int first_key(const ageom *g, int i) { return g->window > 0 && i >= g->window ? i - g->window + 1 : 0; }

static size_t gq(const ageom *g, int b, int i, int h) { return ((size_t)b * g->t + i) * g->ld + (size_t)h * g->d; }
static size_t gk(const ageom *g, int b, int j, int h)
{
    return ((size_t)b * g->t + j) * g->ld + (size_t)(g->hq + h / g->grp) * g->d;
}
static size_t gv(const ageom *g, int b, int j, int h)
{
    return ((size_t)b * g->t + j) * g->ld + (size_t)(g->hq + g->hkv + h / g->grp) * g->d;
}
static size_t go(const ageom *g, int b, int i, int h) { return ((size_t)b * g->t + i) * g->ldo + (size_t)h * g->d; }

/* The attention references' double loops (O(t^2 d) a case, the most of
 * the test's own time) are ZO_UNCHECKED (common/sanitize.h): they are the
 * test's, not the code under test, and read only its own arrays. */

/* Scores of query i of head h against the keys it sees (scaled and
 * capped), into s[j]; their derivatives over the scaled score into dc[j]
 * when dc is not NULL. */
ZO_UNCHECKED static void scores(const ageom *g, const double *qkv, int b, int h, int i, double *s, double *dc)
{
    const double *q = qkv + gq(g, b, i, h);
    for (int j = first_key(g, i); j <= i; j++) {
        const double *k = qkv + gk(g, b, j, h);
        double acc = 0.0;
        for (int e = 0; e < g->d; e++) acc += q[e] * k[e];
        s[j] = score_of(g, acc, dc ? &dc[j] : NULL) + alibi_bias(g, h, i, j);
    }
}

/* out [b,t,hq*d] and lse [b,hq,t] of qkv: the full causal softmax; with
 * sinks [hq] (NULL: none), as gpt-oss's eager attention: the head's sink
 * logit one more column of each row, the max and the sum taken over it
 * too, its probability then dropped. */
ZO_UNCHECKED static void attention_forward_d(const gpu_attn_desc *a, const double *sinks, const double *qkv,
                                             double *out, double *lse)
{
    ageom g = geom_of(a);
    double *s = malloc((size_t)g.t * sizeof *s);
    for (int b = 0; b < a->b; b++)
        for (int h = 0; h < g.hq; h++)
            for (int i = 0; i < g.t; i++) {
                scores(&g, qkv, b, h, i, s, NULL);
                int j0 = first_key(&g, i);
                double mx = sinks ? sinks[h] : -INFINITY, l = 0.0;
                for (int j = j0; j <= i; j++) mx = s[j] > mx ? s[j] : mx;
                for (int j = j0; j <= i; j++) l += exp(s[j] - mx);
                if (sinks) l += exp(sinks[h] - mx);
                lse[((size_t)b * g.hq + h) * g.t + i] = mx + log(l);
                /* o_e = sum over j ascending of P_j v_je, each P_j once;
                 * the loop over j outside, so v is read row by row */
                for (int j = j0; j <= i; j++) s[j] = exp(s[j] - mx) / l;
                double *o = out + go(&g, b, i, h);
                for (int e = 0; e < g.d; e++) o[e] = 0.0;
                for (int j = j0; j <= i; j++) {
                    const double *v = qkv + gv(&g, b, j, h);
                    for (int e = 0; e < g.d; e++) o[e] += s[j] * v[e];
                }
            }
    free(s);
}

/* t: out qkv; p: lse */
static void ref_attention_forward(const gpu_op_args *a, hostv *h)
{
    attention_forward_d(&a->d.attn, h->P[1], h->T[1], h->T[0], h->P[0]);
}

/* The k-steps of 16 terms a tensor core takes for each element's sum
 * (into steps, per element of dqkv): dQ_i's run over its keys, and each
 * key's dK and dV runs over the queries that see it, one run a query head
 * of its group. A run of n terms spans at most n / 16 + 2 blocks of 16
 * (ceil(n / 16) + 1 at any start); each block is taken once per 16-bit
 * part of the product (P and dS hi + lo; dO hi + lo when fp32: dV's
 * Ph dOh, Pl dOh, Ph dOl, and Pl dOl where a kernel takes it), so 2
 * parts for dQ and dK, 4 for dV. */
static void attention_steps(const gpu_attn_desc *a, double *steps)
{
    ageom g = geom_of(a);
    double *kv = calloc((size_t)g.t * g.hkv, sizeof *kv); /* a batch's runs' blocks, per key and kv head */
    for (int b = 0; b < a->b; b++) {
        memset(kv, 0, (size_t)g.t * g.hkv * sizeof *kv);
        for (int h = 0; h < g.hq; h++)
            for (int i = 0; i < g.t; i++) {
                const int j0 = first_key(&g, i);
                double *sq = steps + gq(&g, b, i, h), n = (double)(i - j0 + 1);
                for (int e = 0; e < g.d; e++) sq[e] = 2.0 * (n / 16.0 + 2.0);
                for (int j = j0; j <= i; j++) kv[(size_t)j * g.hkv + h / g.grp] += 1.0 / 16.0 + (i == j ? 2.0 : 0.0);
            }
        for (int j = 0; j < g.t; j++)
            for (int h = 0; h < g.hq; h += g.grp) {
                double *sk = steps + gk(&g, b, j, h), *sv = steps + gv(&g, b, j, h), n = kv[(size_t)j * g.hkv + h / g.grp];
                for (int e = 0; e < g.d; e++) sk[e] = 2.0 * n, sv[e] = 4.0 * n;
            }
    }
    free(kv);
}

/* t: dqkv dout qkv out; p: lse, sinks, dsinks. With P = exp(s - lse) and
 * D_i = dO_i . O_i (the saved out and lse, as the op's contract): dS = P
 * (dO V^T - D) scale (times the cap's derivative when capped),
 * dQ = dS K, dK = dS^T Q, dV = P^T dO; dqkv is overwritten. A sink is a
 * column of value 0: its dS is exp(sink - lse) (0 - D_i), summed over the
 * rows into dsinks. */
ZO_UNCHECKED static void ref_attention_backward(const gpu_op_args *a, hostv *h)
{
    ageom g = geom_of(&a->d.attn);
    const double *qkv = h->T[2], *dout = h->T[1], *out = h->T[3], *lse = h->P[0];
    /* grads16 with an fp32 dO: dO rounded once, so dP_ij = dO_i . V_j is off
     * by up to a unit of the 16-bit type times sum_e |dO_ie V_je| (A_ij),
     * which dS carries into dQ and dK: their cond also sums P scale |dcap|
     * A_ij |K_je| (|Q_ie|), the dS error's term (grads16_cond) */
    const int do16 = a->d.attn.grads16 && a->t[1].dtype == ZO_DTYPE_F32 && a->t[2].dtype != ZO_DTYPE_F32;
    double *dq = h->T[0], *s = malloc((size_t)g.t * sizeof *s), *dc = malloc((size_t)g.t * sizeof *dc);
    memset(dq, 0, (size_t)a->d.attn.b * g.t * g.ld * sizeof *dq);
    if (h->P[2]) memset(h->P[2], 0, (size_t)g.hq * sizeof *h->P[2]);
    for (int b = 0; b < a->d.attn.b; b++)
        for (int hh = 0; hh < g.hq; hh++)
            for (int i = 0; i < g.t; i++) {
                scores(&g, qkv, b, hh, i, s, dc);
                double L = lse[((size_t)b * g.hq + hh) * g.t + i], D = 0.0;
                const double *doi = dout + go(&g, b, i, hh), *oi = out + go(&g, b, i, hh);
                const double *qi = qkv + gq(&g, b, i, hh);
                double *dqi = dq + gq(&g, b, i, hh);
                for (int e = 0; e < g.d; e++) D += doi[e] * oi[e];
                if (h->P[2]) h->P[2][hh] -= exp(h->P[1][hh] - L) * D;
                for (int j = first_key(&g, i); j <= i; j++) {
                    const double *kj = qkv + gk(&g, b, j, hh), *vj = qkv + gv(&g, b, j, hh);
                    double *dkj = dq + gk(&g, b, j, hh), *dvj = dq + gv(&g, b, j, hh);
                    double p = exp(s[j] - L), dp = 0.0;
                    for (int e = 0; e < g.d; e++) dp += doi[e] * vj[e];
                    double ds = p * (dp - D) * g.scale * dc[j];
                    if (!h->cond)
                        for (int e = 0; e < g.d; e++) {
                            dqi[e] += ds * kj[e];
                            dkj[e] += ds * qi[e];
                            dvj[e] += p * doi[e];
                        }
                    else { /* with the sums of |terms| */
                        double *cq = h->cond + gq(&g, b, i, hh), *ck = h->cond + gk(&g, b, j, hh);
                        double *cv = h->cond + gv(&g, b, j, hh);
                        double adp = 0.0;
                        if (do16)
                            for (int e = 0; e < g.d; e++) adp += fabs(doi[e] * vj[e]);
                        const double ads = fabs(ds) + p * fabs(g.scale * dc[j]) * adp;
                        for (int e = 0; e < g.d; e++) {
                            dqi[e] += ds * kj[e];
                            dkj[e] += ds * qi[e];
                            dvj[e] += p * doi[e];
                            cq[e] += ads * fabs(kj[e]);
                            ck[e] += ads * fabs(qi[e]);
                            cv[e] += p * fabs(doi[e]);
                        }
                    }
                }
            }
    free(s);
    free(dc);
    if (h->cond) attention_steps(&a->d.attn, h->steps);
}

/* t: out qkv k_cache v_cache; p: pos; i[0]: tc. The new rows' keys and
 * values into the caches (rounded to the caches' type), then each query
 * over cache rows first .. pos[s] + i: the full softmax, in double. */
static void ref_attention_cached(const gpu_op_args *a, hostv *h)
{
    const gpu_attn_desc *d = &a->d.attn;
    ageom g = geom_of(d);
    const int tc = (int)a->i[0];
    const size_t ldc = (size_t)g.hkv * g.d;
    double *kc = h->T[2], *vc = h->T[3], *sc = malloc((size_t)tc * sizeof *sc);
    for (int b = 0; b < d->b; b++)
        for (int i = 0; i < g.t; i++) {
            size_t row = ((size_t)b * tc + (size_t)h->P[0][b] + i) * ldc;
            for (int kv = 0; kv < g.hkv; kv++)
                for (int e = 0; e < g.d; e++) {
                    /* gk/gv take a query head: kv * grp is one of kv head kv's */
                    kc[row + (size_t)kv * g.d + e] = as_stored(h->T[1][gk(&g, b, i, kv * g.grp) + e], (etype)a->t[2].dtype);
                    vc[row + (size_t)kv * g.d + e] = as_stored(h->T[1][gv(&g, b, i, kv * g.grp) + e], (etype)a->t[3].dtype);
                }
        }
    for (int b = 0; b < d->b; b++)
        for (int hh = 0; hh < g.hq; hh++)
            for (int i = 0; i < g.t; i++) {
                int p = (int)h->P[0][b] + i, j0 = first_key(&g, p);
                size_t kvo = (size_t)(hh / g.grp) * g.d;
                /* a sink (P[1], gpt-oss): a logit in the softmax without a value */
                double mx = h->P[1] ? h->P[1][hh] : -INFINITY, l = 0.0;
                for (int j = j0; j <= p; j++) {
                    double acc = 0.0;
                    for (int e = 0; e < g.d; e++) acc += h->T[1][gq(&g, b, i, hh) + e] * kc[((size_t)b * tc + j) * ldc + kvo + e];
                    sc[j] = score_of(&g, acc, NULL) + alibi_bias(&g, hh, p, j);
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                if (h->P[1]) l += exp(h->P[1][hh] - mx);
                for (int j = j0; j <= p; j++) l += exp(sc[j] - mx);
                for (int e = 0; e < g.d; e++) {
                    double o = 0.0;
                    for (int j = j0; j <= p; j++) o += exp(sc[j] - mx) / l * vc[((size_t)b * tc + j) * ldc + kvo + e];
                    h->T[0][go(&g, b, i, hh) + e] = o;
                }
            }
    free(sc);
}

/* HF rotate_half in place on the first d elements of the first n_heads
 * heads (head h at h * ldh, i[6]) of every row; row r at position
 * pos0 + r % t, plus P[1][r / t] when given (a position a sequence of t
 * rows); the inverse rotates back; both times the scale f[1] (longrope's
 * attention scaling). */
static void rope_d(const gpu_op_args *a, hostv *h, int inverse)
{
    int n = (int)a->i[0], t = (int)a->i[1], heads = (int)a->i[2], d = (int)a->i[3], half = d / 2;
    double *tmp = malloc((size_t)d * sizeof *tmp);
    for (int r = 0; r < n; r++)
        for (int hh = 0; hh < heads; hh++) {
            double *x = h->T[0] + (size_t)r * a->i[4] + (size_t)hh * a->i[6];
            memcpy(tmp, x, (size_t)d * sizeof *tmp);
            for (int i = 0; i < d; i++) {
                double f = h->P[0] ? h->P[0][i % half] : pow((double)a->f[0], -2.0 * (i % half) / d);
                double p = (double)a->i[5] + (h->P[1] ? h->P[1][r / t] : 0.0) + (double)(r % t);
                double ang = p * f * (inverse ? -1.0 : 1.0);
                double rot = i < half ? -tmp[i + half] : tmp[i - half];
                x[i] = (double)a->f[1] * (tmp[i] * cos(ang) + rot * sin(ang));
            }
        }
    free(tmp);
}

static void ref_rope_forward(const gpu_op_args *a, hostv *h) { rope_d(a, h, 0); }
static void ref_rope_backward(const gpu_op_args *a, hostv *h) { rope_d(a, h, 1); }

#define GELU_C 0.7978845608028654 /* sqrt(2/pi) */

/* GELU, the tanh form; with i[0] (the form) 1 the erf form 0.5 x (1 + erf(x / sqrt 2)),
 * 2 ReLU, max(x, 0) with the derivative 1 where x > 0, else 0 */
static void ref_gelu_forward(const gpu_op_args *a, hostv *h)
{
    for (size_t i = 0; i < a->n; i++) {
        double x = h->T[1][i];
        h->T[0][i] = a->i[0] == 2 ? (x > 0.0 ? x : 0.0)
                     : a->i[0]    ? 0.5 * x * (1.0 + erf(x / sqrt(2.0)))
                                  : 0.5 * x * (1.0 + tanh(GELU_C * (x + 0.044715 * x * x * x)));
    }
}

static void ref_gelu_backward(const gpu_op_args *a, hostv *h)
{
    for (size_t i = 0; i < a->n; i++) {
        double x = h->T[2][i], u = GELU_C * (x + 0.044715 * x * x * x), th = tanh(u);
        double du = GELU_C * (1.0 + 3.0 * 0.044715 * x * x);
        double d = a->i[0] == 2 ? (x > 0.0 ? 1.0 : 0.0)
                   : a->i[0]    ? 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI)
                                : 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
        h->T[0][i] = h->T[1][i] * d;
    }
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* gpt-oss's clamped GLU as modeling_gpt_oss writes it: gate.clamp(max=limit),
 * up.clamp(-limit, limit), glu = gate * sigmoid(gate * alpha), (up + 1) * glu;
 * y and, with dy, the gradients (torch.clamp's: 0 outside, passed at the
 * bounds) into *y, *dg, *du */
static void glu_clamped_d(double g, double u, double lim, double al, double dy, double *y, double *dg, double *du)
{
    double gc = g > lim ? lim : g, uc = u > lim ? lim : u < -lim ? -lim : u;
    double sg = 1.0 / (1.0 + exp(-gc * al)), glu = gc * sg;
    *y = (uc + 1.0) * glu;
    *du = u > lim || u < -lim ? 0.0 : dy * glu;
    *dg = g > lim ? 0.0 : dy * (uc + 1.0) * (sg + gc * al * sg * (1.0 - sg));
}

/* The gate's activation and its derivative: silu, or with i[0] (GeGLU)
 * GELU's tanh form written as 0.5 g (1 + tanh(u)) */
static void gate_act_d(int gelu, double g, double *f, double *df)
{
    if (gelu) {
        double u = GELU_C * (g + 0.044715 * g * g * g), th = tanh(u);
        *f = 0.5 * g * (1.0 + th);
        *df = 0.5 * (1.0 + th) + 0.5 * g * (1.0 - th * th) * GELU_C * (1.0 + 3.0 * 0.044715 * g * g);
    } else {
        double sg = sigmoid(g);
        *f = g * sg;
        *df = sg + g * sg * (1.0 - sg);
    }
}

static void ref_swiglu_forward(const gpu_op_args *a, hostv *h)
{
    if (a->i[0] == GPU_GLU_CLAMPED) {
        for (size_t i = 0; i < a->n; i++) {
            double dg, du;
            glu_clamped_d(h->T[1][i], h->T[2][i], a->f[0], a->f[1], 0.0, &h->T[0][i], &dg, &du);
        }
        return;
    }
    for (size_t i = 0; i < a->n; i++) {
        double f, df;
        gate_act_d((int)a->i[0], h->T[1][i], &f, &df);
        h->T[0][i] = f * h->T[2][i];
    }
}

/* t: dgate dup dy gate up */
static void ref_swiglu_backward(const gpu_op_args *a, hostv *h)
{
    if (a->i[0] == GPU_GLU_CLAMPED) {
        for (size_t i = 0; i < a->n; i++) {
            double y;
            glu_clamped_d(h->T[3][i], h->T[4][i], a->f[0], a->f[1], h->T[2][i], &y, &h->T[0][i], &h->T[1][i]);
        }
        return;
    }
    for (size_t i = 0; i < a->n; i++) {
        double f, df, u = h->T[4][i], dy = h->T[2][i];
        gate_act_d((int)a->i[0], h->T[3][i], &f, &df);
        h->T[0][i] = dy * u * df;
        h->T[1][i] = dy * f;
    }
}

/* t: out wte wpe; p: tokens, each sequence's position (or none); i: n t c
 * vocab. Row r adds wpe's row P[1][r / t] + r % t (P[1] none: r % t). */
static void ref_embedding_forward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], t = (int)a->i[1], c = (int)a->i[2];
    for (int r = 0; r < n; r++) {
        int tok = (int)h->P[0][r];
        size_t pe = (size_t)((h->P[1] ? h->P[1][r / t] : 0.0) + (double)(r % t));
        for (int j = 0; j < c; j++)
            h->T[0][(size_t)r * c + j] = h->T[1][(size_t)tok * c + j] + (h->T[2] ? h->T[2][pe * c + j] : 0.0);
    }
}

/* t: dwte dwpe dout; p: tokens */
static void ref_embedding_backward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], t = (int)a->i[1], c = (int)a->i[2];
    for (int r = 0; r < n; r++) {
        int tok = (int)h->P[0][r];
        for (int j = 0; j < c; j++) {
            h->T[0][(size_t)tok * c + j] += h->T[2][(size_t)r * c + j];
            if (h->T[1]) h->T[1][(size_t)(r % t) * c + j] += h->T[2][(size_t)r * c + j];
        }
    }
}

static double row_lse(const double *x, int v)
{
    double mx = -INFINITY, s = 0.0;
    for (int j = 0; j < v; j++) mx = x[j] > mx ? x[j] : mx;
    for (int j = 0; j < v; j++) s += exp(x[j] - mx);
    return mx + log(s);
}

/* row[0..v) = cap tanh(x / cap) (cap > 0), else x */
static void cap_logits(double *row, const double *x, int v, double cap)
{
    for (int j = 0; j < v; j++) row[j] = cap > 0.0 ? cap * tanh(x[j] / cap) : x[j];
}

/* t: logits; p: losses targets; f: cap */
static void ref_cross_entropy_forward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], v = (int)a->i[1];
    double *row = malloc((size_t)v * sizeof *row);
    for (int r = 0; r < n; r++) {
        int tg = (int)h->P[1][r];
        cap_logits(row, h->T[0] + (size_t)r * v, v, a->f[0]);
        h->P[0][r] = tg < 0 ? 0.0 : row_lse(row, v) - row[tg];
    }
    free(row);
}

/* t: dlogits logits; p: targets; f: dloss cap. Capped: the softmax of
 * z = cap tanh(x / cap), times dz/dx = 1 - (z / cap)^2. */
static void ref_cross_entropy_backward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], v = (int)a->i[1];
    double *row = malloc((size_t)v * sizeof *row), cap = a->f[1];
    for (int r = 0; r < n; r++) {
        int tg = (int)h->P[0][r];
        cap_logits(row, h->T[1] + (size_t)r * v, v, cap); /* dlogits may be logits */
        double L = row_lse(row, v);
        for (int j = 0; j < v; j++) {
            double dz = cap > 0.0 ? 1.0 - (row[j] / cap) * (row[j] / cap) : 1.0;
            h->T[0][(size_t)r * v + j] = tg < 0 ? 0.0 : a->f[0] * (exp(row[j] - L) - (j == tg)) * dz;
        }
    }
    free(row);
}

static void ref_add(const gpu_op_args *a, hostv *h)
{
    for (size_t i = 0; i < a->n; i++) h->T[0][i] = h->T[1][i] + h->T[2][i];
}

static void ref_scale(const gpu_op_args *a, hostv *h)
{
    for (size_t i = 0; i < a->n; i++) h->T[0][i] *= a->f[0];
}

static void ref_softcap(const gpu_op_args *a, hostv *h)
{
    for (size_t i = 0; i < a->n; i++) h->T[0][i] = a->f[0] * tanh(h->T[0][i] / a->f[0]);
}

/* dst = src rounded once to dst's type (past fp16's range: an infinity) */
static void ref_cast(const gpu_op_args *a, hostv *h)
{
    for (size_t i = 0; i < a->n; i++) h->T[0][i] = as_stored(h->T[1][i], (etype)a->t[0].dtype);
}

static void ref_check_finite(const gpu_op_args *a, hostv *h)
{
    for (size_t i = 0; i < a->n; i++)
        if (!isfinite(h->T[0][i])) h->P[0][0] = (double)((int)h->P[0][0] | 1);
}

static void ref_sum_squares(const gpu_op_args *a, hostv *h)
{
    double s = 0.0;
    for (size_t i = 0; i < a->n; i++) s += h->T[0][i] * h->T[0][i];
    h->P[0][0] += s;
}

/* NF4 (common/nf4.h's layout, decoded here from its description): fp32
 * offset; fp32 scale2 [ceil(nb/256)]; u8 absq [nb]; u8 codes, weight 2i in
 * the high nibble. The code values are the QLoRA paper's table; the absmax
 * map is the signed dynamic map, built here in double. */
static const double nf4_values[16] = {
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0};

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* bitsandbytes' create_dynamic_map(signed=True), ascending */
static void dynamic_map(double map[256])
{
    int k = 0;
    for (int i = 0; i < 7; i++) {
        int fr = 1 << i; /* 2^i midpoints of linspace(0.1, 1, 2^i + 1) */
        for (int j = 0; j < fr; j++) {
            double lo = 0.1 + 0.9 * j / fr, hi = 0.1 + 0.9 * (j + 1) / fr;
            double v = pow(10.0, i - 6) * (lo + hi) / 2;
            map[k++] = v;
            map[k++] = -v;
        }
    }
    map[k++] = 0.0;
    map[k++] = 1.0;
    qsort(map, 256, sizeof *map, cmp_double);
}

static float f32_at(const double *bytes, size_t off)
{
    uint8_t b[4];
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)bytes[off + i];
    float f;
    memcpy(&f, b, 4);
    return f;
}

static void ref_nf4_dequantize(const gpu_op_args *a, hostv *h)
{
    size_t n = a->n, nb = (n + 63) / 64, nb2 = (nb + 255) / 256;
    size_t off_scale2 = 4, off_absq = 4 + 4 * nb2, off_codes = off_absq + nb;
    double map[256];
    dynamic_map(map);
    const double *q = h->P[0];
    double offset = f32_at(q, 0);
    for (size_t i = 0; i < n; i++) {
        size_t blk = i / 64;
        /* the absmax as the device computes it: map * scale2 + offset in fp32 */
        float absmax = (float)((float)map[(int)q[off_absq + blk]] * f32_at(q, off_scale2 + 4 * (blk / 256)));
        absmax = (float)(absmax + (float)offset);
        int byte = (int)q[off_codes + i / 2], code = i % 2 ? byte & 15 : byte >> 4;
        h->T[0][i] = nf4_values[code] * absmax;
    }
}

/* p: param m v; t: grad out16; d.adam: the per-step scalars */
static void ref_adam_update(const gpu_op_args *a, hostv *h)
{
    const zo_adam_consts *c = &a->d.adam;
    for (size_t i = 0; i < a->n; i++) {
        double p = h->P[0][i], g = h->T[0][i] * c->grad_mult;
        if (c->use_l2) g += c->l2 * p;
        double m = c->beta1 * h->P[1][i] + c->omb1 * g;
        double v = c->beta2 * h->P[2][i] + c->omb2 * g * g;
        double d = sqrt(v) * c->inv_bc2_sqrt + c->eps;
        if (!c->use_l2) p -= c->lr_wd * p;
        p -= c->step_size * (m / d);
        h->P[0][i] = p, h->P[1][i] = m, h->P[2][i] = v;
        if (h->T[1]) h->T[1][i] = p;
    }
}

/* ---- Adam over encoded m and v ----
 * The format, from its description (gpu/device.h, docs/cpu_adam.md): m, v
 * of `total` values, bf16 (2 bytes each) or 8-bit codes (1 byte each) whose
 * value is map[code] * absmax of their block (bitsandbytes' dynamic map:
 * signed for m, unsigned for v), then the fp32 absmax of m's blocks and of
 * v's; each part from a 64-byte boundary. The reference reads the old
 * state so, updates in double and keeps the exact new m and v (state_want)
 * for the comparison, which allows what coding them may change. */

typedef struct state_geom {
    int q8;
    size_t block, total, first, n, es, nb;
    size_t off_m, off_v, off_am, off_av, bytes;
} state_geom;

static size_t up64(size_t x) { return (x + 63) / 64 * 64; }

static state_geom state_geom_of(gpu_adam_state_type type, size_t block, size_t total, size_t first, size_t n)
{
    int q8 = type == GPU_ADAM_STATE_Q8;
    size_t es = type == GPU_ADAM_STATE_F32 ? 4 : q8 ? 1 : 2;
    state_geom g = {q8, block, total, first, n, es, q8 ? (total + block - 1) / block : 0, 0, 0, 0, 0, 0};
    g.off_m = 0;
    g.off_v = up64(g.es * total);
    g.off_am = g.off_av = g.off_v + g.es * total;
    if (q8) {
        g.off_am = up64(g.off_v + total);
        g.off_av = up64(g.off_am + 4 * g.nb);
    }
    g.bytes = q8 ? g.off_av + 4 * g.nb : g.off_v + es * total;
    return g;
}

static state_geom state_geom_args(const gpu_op_args *a)
{
    const gpu_adam_state_args *x = &a->d.astate;
    return state_geom_of(x->type, x->block, x->total, x->first, a->n);
}

/* The unsigned map: create_dynamic_map(signed=False), ascending. */
static void dynamic_map_unsigned(double map[256])
{
    int k = 0;
    for (int i = 0; i < 7; i++) {
        int fr = 2 << i; /* 2^(i+1) midpoints of linspace(0.1, 1, fr + 1) */
        for (int j = 0; j < fr; j++) map[k++] = pow(10.0, i - 6) * (0.1 + 0.9 * (j + 0.5) / fr);
    }
    map[k++] = 0.0;
    map[k++] = 1.0;
    qsort(map, 256, sizeof *map, cmp_double);
}

/* Bytes (as the harness holds them, one double each) as a float / bf16. */
static double bytes_f32(const double *b, size_t at)
{
    uint8_t x[4] = {(uint8_t)b[at], (uint8_t)b[at + 1], (uint8_t)b[at + 2], (uint8_t)b[at + 3]};
    float f;
    memcpy(&f, x, 4);
    return f;
}

static double bytes_bf16(const double *b, size_t at)
{
    uint32_t u = ((uint32_t)b[at] | (uint32_t)b[at + 1] << 8) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Value i of the state (m: which 0, v: 1). */
static double state_value(const state_geom *g, const double *S, int which, size_t i)
{
    static double map_m[256], map_v[256];
    if (map_m[255] != 1.0) dynamic_map(map_m), dynamic_map_unsigned(map_v);
    size_t off = which ? g->off_v : g->off_m;
    if (!g->q8) return g->es == 4 ? bytes_f32(S, off + 4 * i) : bytes_bf16(S, off + 2 * i);
    double absmax = bytes_f32(S, (which ? g->off_av : g->off_am) + 4 * (i / g->block));
    return (which ? map_v : map_m)[(int)S[off + i]] * absmax;
}

/* The exact new moments of the last reference run: m, v [n]. */
static struct {
    double *m, *v;
    size_t n;
} state_want;

/* Element i of the call decays (gpu/device.h: in a range, or every one). */
static int decays(const gpu_adam_state_args *x, size_t i)
{
    if (x->n_decay < 0) return 1;
    for (int k = 0; k < x->n_decay; k++)
        if (i >= x->decay[k][0] && i < x->decay[k][1]) return 1;
    return 0;
}

/* t: param grad out16; p: state; d.astate */
static void ref_adam_state_update(const gpu_op_args *a, hostv *h)
{
    const gpu_adam_state_args *x = &a->d.astate;
    const zo_adam_consts *c = &x->c;
    state_geom g = state_geom_args(a);
    free(state_want.m), free(state_want.v);
    state_want.n = a->n;
    state_want.m = malloc((a->n ? a->n : 1) * sizeof(double));
    state_want.v = malloc((a->n ? a->n : 1) * sizeof(double));
    for (size_t i = 0; i < a->n; i++) {
        double wd_on = decays(x, i);
        /* (Kahan: the weight is the bf16 weight plus its bf16 compensation) */
        double p = h->T[0][i] + (x->round == GPU_ADAM_ROUND_KAHAN ? h->P[1][i] : 0.0), g1 = h->T[1][i] * c->grad_mult;
        if (c->use_l2) g1 += wd_on * c->l2 * p;
        double m = c->beta1 * state_value(&g, h->P[0], 0, x->first + i) + c->omb1 * g1;
        double v = c->beta2 * state_value(&g, h->P[0], 1, x->first + i) + c->omb2 * g1 * g1;
        double d = sqrt(v) * c->inv_bc2_sqrt + c->eps;
        if (!c->use_l2) p -= wd_on * c->lr_wd * p;
        p -= c->step_size * (m / d);
        /* (stochastic and Kahan: the exact weight, which round_cmp holds
         * the stored bf16 weight and its compensation to) */
        h->T[0][i] = p;
        if (h->T[2]) h->T[2][i] = p;
        if (x->round == GPU_ADAM_ROUND_KAHAN) h->P[1][i] = p;
        state_want.m[i] = m, state_want.v[i] = v;
    }
}

/* ---- mixture of experts ---- */

/* A router's gate as the references read it from the op's slots
 * (gpu_moe_gate: forward i[5] i[6] p[2], backward i[6] i[7] p[1], f[2]):
 * the mode, groups (0 or 1: one of every expert), the groups kept, the
 * scale (0: none) and the bias [e] (NULL: none). */
typedef struct gate_ref {
    int mode, groups, topk;
    double scale;
    const double *bias;
} gate_ref;

static gate_ref gate_of(const gpu_op_args *a, const hostv *h, int backward)
{
    return (gate_ref){(int)a->i[3], (int)a->i[backward ? 6 : 5], (int)a->i[backward ? 7 : 6], a->f[2],
                      h->P[backward ? 1 : 2]};
}

static int gate_sigmoid_d(const gate_ref *g)
{
    return g->mode == GPU_MOE_ROUTE_SIGMOID || g->mode == GPU_MOE_ROUTE_SIGMOID_NORM;
}

/* idx [m] ordered by v[idx] from the largest, the lower index first among
 * equal values (an insertion sort: m is at most the experts) */
static void order_desc(const double *v, int *idx, int m)
{
    for (int a = 1; a < m; a++) {
        int x = idx[a], b = a;
        for (; b > 0 && (v[idx[b - 1]] < v[x] || (v[idx[b - 1]] == v[x] && idx[b - 1] > x)); b--) idx[b] = idx[b - 1];
        idx[b] = x;
    }
}

/* One row of a router in double, as Hugging Face's DeepSeek-V2
 * (group_limited_greedy) and V3 (noaux_tc) gates state it: s [e] the
 * scores (the softmax over the row, or each logit's sigmoid), key [e] = s
 * + bias, gscore [G] each group's score (experts in index order; its
 * largest key, or with sigmoid scores its two largest keys' sum), gord [G]
 * the groups best first, eord [na] the experts of the best topk groups
 * (every expert with one group) best key first; ties: the lower index.
 * The chosen are eord's first k. */
typedef struct gate_row {
    double *s, *key, *gscore;
    int *gord, *eord, na;
} gate_row;

static gate_row gate_row_new(int e)
{
    gate_row w = {malloc((size_t)e * sizeof(double)), malloc((size_t)e * sizeof(double)),
                  malloc((size_t)e * sizeof(double)), malloc((size_t)e * sizeof(int)),
                  malloc((size_t)e * sizeof(int)), 0};
    return w;
}

static void gate_row_free(gate_row *w) { free(w->s), free(w->key), free(w->gscore), free(w->gord), free(w->eord); }

static void gate_route_d(const gate_ref *g, const double *lg, int e, gate_row *w)
{
    if (gate_sigmoid_d(g)) {
        for (int j = 0; j < e; j++) w->s[j] = sigmoid(lg[j]);
    } else {
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < e; j++) mx = lg[j] > mx ? lg[j] : mx;
        for (int j = 0; j < e; j++) sum += w->s[j] = exp(lg[j] - mx);
        for (int j = 0; j < e; j++) w->s[j] /= sum;
    }
    for (int j = 0; j < e; j++) w->key[j] = w->s[j] + (g->bias ? g->bias[j] : 0.0);
    const int G = g->groups > 1 ? g->groups : 1, size = e / G, keep = G > 1 ? g->topk : 1;
    for (int q = 0; q < G; q++) {
        const double *kq = w->key + (size_t)q * size;
        int top = 0;
        for (int j = 1; j < size; j++) top = kq[j] > kq[top] ? j : top;
        double second = -INFINITY;
        for (int j = 0; j < size; j++)
            if (j != top && kq[j] > second) second = kq[j];
        w->gscore[q] = gate_sigmoid_d(g) && G > 1 ? kq[top] + second : kq[top];
        w->gord[q] = q;
    }
    order_desc(w->gscore, w->gord, G);
    w->na = 0;
    for (int j = 0; j < e; j++) {
        int kept = 0;
        for (int t = 0; t < keep; t++) kept |= w->gord[t] == j / size;
        if (kept) w->eord[w->na++] = j;
    }
    order_desc(w->key, w->eord, w->na);
}

/* The chosen's weights' denominator: their scores' sum (plus 1e-20 with
 * SIGMOID_NORM, as DeepSeek-V3), or 1 without normalization */
static double gate_denom_d(const gate_ref *g, const gate_row *w, int k)
{
    if (g->mode != GPU_MOE_ROUTE_NORM && g->mode != GPU_MOE_ROUTE_SIGMOID_NORM) return 1.0;
    double S = g->mode == GPU_MOE_ROUTE_SIGMOID_NORM ? 1e-20 : 0.0;
    for (int i = 0; i < k; i++) S += w->s[w->eord[i]];
    return S;
}

/* Phi-3.5-MoE's sparsemixer, eval form, as Hugging Face's sparsemixer()
 * reads without training: the first choice is the largest logit (the lower
 * index of a tie), every logit x with (max - x) / max(|x|, max) > thr (2
 * jitter eps; a 0 / 0 compares false) leaves the softmax, whose value at
 * the choice is its weight; then the same with the first choice's logit at
 * -inf. `keep` [2][e] (optional): 1 where each softmax kept the logit. */
static void mixer_d(const double *lg, int e, double thr, int sel[2], double w[2], int *keep)
{
    for (int i = 0; i < 2; i++) {
        double m = -INFINITY, sum = 0.0;
        for (int j = 0; j < e; j++)
            if (!(i == 1 && j == sel[0]) && lg[j] > m) m = lg[j], sel[i] = j;
        for (int j = 0; j < e; j++) {
            double ratio = (m - lg[j]) / (fabs(lg[j]) > m ? fabs(lg[j]) : m);
            int kept = !(i == 1 && j == sel[0]) && !(ratio > thr);
            if (keep) keep[i * e + j] = kept;
            if (kept) sum += exp(lg[j] - m);
        }
        w[i] = 1.0 / sum;
    }
}

/* The sparsemixer's weights as functions of the logits with the choices
 * and masks held (keep [2][e]): sum_i dw[sel_i] w_i(lg), the loss whose
 * gradient the backward gives. */
static double mixer_loss_d(const double *lg, int e, const int sel[2], const int *keep, const double *dw)
{
    double L = 0.0;
    for (int i = 0; i < 2; i++) {
        double sum = 0.0;
        for (int j = 0; j < e; j++)
            if (keep[i * e + j]) sum += exp(lg[j] - lg[sel[i]]);
        L += dw[sel[i]] / sum;
    }
    return L;
}

/* t: weights logits; p: stats [groups, 2e], order [n, e] (optional: each
 * chosen expert's place, the largest key, the sparsemixer's first choice,
 * first), bias [e] (optional); i: n e k mode group_rows groups
 * topk_groups; f[1]: jitter eps, f[2]: scale */
static void ref_moe_router_forward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], e = (int)a->i[1], k = (int)a->i[2], gr = (int)a->i[4];
    int mixer = (int)a->i[3] == GPU_MOE_ROUTE_SPARSEMIXER, groups = (n + gr - 1) / gr;
    const gate_ref g = gate_of(a, h, 0);
    gate_row w = gate_row_new(e);
    for (size_t j = 0; j < (size_t)groups * 2 * e; j++) h->P[0][j] = 0.0;
    for (int r = 0; r < n; r++) {
        gate_route_d(&g, h->T[1] + (size_t)r * e, e, &w);
        int ms[2];
        double *st = h->P[0] + (size_t)(r / gr) * 2 * e, mw[2];
        if (mixer) mixer_d(h->T[1] + (size_t)r * e, e, 2.0 * a->f[1], ms, mw, NULL);
        const double S = gate_denom_d(&g, &w, k), scale = g.scale != 0.0 ? g.scale : 1.0;
        double *wr = h->T[0] + (size_t)r * e;
        for (int j = 0; j < e; j++) wr[j] = 0.0, st[j] += w.s[j];
        for (int i = 0; i < k; i++) {
            int j = mixer ? ms[i] : w.eord[i];
            wr[j] = mixer ? mw[i] : w.s[j] / S * scale, st[e + j] += 1.0;
        }
        if (h->P[1]) {
            double *o = h->P[1] + (size_t)r * e;
            for (int j = 0; j < e; j++) o[j] = GPU_MOE_NOT_CHOSEN;
            for (int i = 0; i < k; i++) o[mixer ? ms[i] : w.eord[i]] = i;
        }
    }
    gate_row_free(&w);
}

/* t: dlogits dweights logits; p: stats [layers, groups, 2e], bias [e]
 * (optional); i: n e k mode layers group_rows groups topk_groups; f:
 * aux_scale (row r counts its group's, r / group_rows), eps, scale.
 * The loss as a function of the scores s: L = sum over the chosen of
 * dweights * w(s) + aux_scale * sum_j C_j s_j, the choice held;
 * dlogits by the chain rule through the softmax, or each s's sigmoid. */
static void ref_moe_router_backward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], e = (int)a->i[1], k = (int)a->i[2], mixer = (int)a->i[3] == GPU_MOE_ROUTE_SPARSEMIXER;
    int layers = (int)a->i[4], gr = (int)a->i[5], groups = (n + gr - 1) / gr;
    const gate_ref g = gate_of(a, h, 1);
    const int norm = g.mode == GPU_MOE_ROUTE_NORM || g.mode == GPU_MOE_ROUTE_SIGMOID_NORM;
    gate_row w = gate_row_new(e);
    double *dp = malloc((size_t)e * sizeof *dp);
    for (int r = 0; r < n; r++) {
        gate_route_d(&g, h->T[2] + (size_t)r * e, e, &w);
        const double *p = w.s, *dw = h->T[1] + (size_t)r * e;
        for (int j = 0; j < e; j++) {
            double c = 0.0;
            for (int l = 0; a->f[0] != 0.0f && l < layers; l++)
                c += h->P[0][((size_t)l * groups + (size_t)(r / gr)) * 2 * e + e + j];
            dp[j] = a->f[0] * c;
        }
        const double S = gate_denom_d(&g, &w, k), scale = g.scale != 0.0 ? g.scale : 1.0;
        const int *sel = w.eord;
        /* d w_i / d s_q = scale ([i == q] S - s_i) / S^2 (q chosen) with
         * norm, else scale [i == q]; one expert of one: exactly 0 (the
         * sparsemixer's weights are not p's: below, by finite differences) */
        for (int i = 0; i < k && !mixer; i++)
            for (int q = 0; q < k; q++) {
                double d = norm ? ((i == q) * S - p[sel[i]]) / (S * S) : (i == q);
                dp[sel[q]] += dw[sel[i]] * scale * d;
            }
        if (gate_sigmoid_d(&g)) { /* d s_q / d l_q = s_q (1 - s_q), nothing across experts */
            for (int q = 0; q < e; q++) h->T[0][(size_t)r * e + q] = dp[q] * p[q] * (1.0 - p[q]);
            continue;
        }
        /* d p_j / d l_q = p_j ([j == q] - p_q), so dl_q = p_q sum_j p_j (dp_q - dp_j)
         * (sum_j p_j = 1): exactly 0 where dp is the same for every expert */
        for (int q = 0; q < e; q++) {
            double gq = 0.0;
            for (int j = 0; j < e; j++) gq += p[j] * (dp[q] - dp[j]);
            h->T[0][(size_t)r * e + q] = p[q] * gq;
        }
        if (!mixer) continue;
        /* the sparsemixer's share: central differences (step 1e-5, the
         * error ~1e-10) of its weights' loss, masks and choices held */
        int ms[2], *keep = malloc(2 * (size_t)e * sizeof *keep);
        double mw[2], *lg = malloc((size_t)e * sizeof *lg);
        memcpy(lg, h->T[2] + (size_t)r * e, (size_t)e * sizeof *lg);
        mixer_d(lg, e, 2.0 * a->f[1], ms, mw, keep);
        for (int q = 0; q < e; q++) {
            const double step = 1e-5, x = lg[q];
            lg[q] = x + step;
            double up = mixer_loss_d(lg, e, ms, keep, dw);
            lg[q] = x - step;
            double down = mixer_loss_d(lg, e, ms, keep, dw);
            lg[q] = x;
            h->T[0][(size_t)r * e + q] += (up - down) / (2 * step);
        }
        free(keep), free(lg);
    }
    free(dp);
    gate_row_free(&w);
}

static double moe_gate_d(double s, int sg) { return sg ? sigmoid(s) : s; }

/* t: y x; p: scale; i: n c lds sigmoid */
static void ref_moe_scale_forward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], c = (int)a->i[1];
    for (int r = 0; r < n; r++) {
        double g = moe_gate_d(h->P[0][(size_t)r * a->i[2]], (int)a->i[3]);
        for (int j = 0; j < c; j++) h->T[0][(size_t)r * c + j] = g * h->T[1][(size_t)r * c + j];
    }
}

/* t: dx dy x; p: dscale scale */
static void ref_moe_scale_backward(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], c = (int)a->i[1], sg = (int)a->i[3];
    for (int r = 0; r < n; r++) {
        double s = h->P[1][(size_t)r * a->i[2]], g = moe_gate_d(s, sg), dot = 0.0;
        for (int j = 0; j < c; j++) dot += h->T[1][(size_t)r * c + j] * h->T[2][(size_t)r * c + j];
        for (int j = 0; j < c; j++) h->T[0][(size_t)r * c + j] = g * h->T[1][(size_t)r * c + j];
        h->P[0][(size_t)r * a->i[2]] = sg ? dot * g * (1.0 - g) : dot;
    }
}

/* t: y x; p: idx; i: n c */
static void ref_moe_gather(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], c = (int)a->i[1];
    for (int r = 0; r < n; r++)
        for (int j = 0; j < c; j++) h->T[0][(size_t)r * c + j] = h->T[1][(size_t)h->P[0][r] * c + j];
}

/* t: y x; p: idx; i: n c ldy */
static void ref_moe_scatter_add(const gpu_op_args *a, hostv *h)
{
    int n = (int)a->i[0], c = (int)a->i[1];
    for (int r = 0; r < n; r++)
        for (int j = 0; j < c; j++) h->T[0][(size_t)h->P[0][r] * a->i[2] + j] += h->T[1][(size_t)r * c + j];
}

/* t: y x; i: n heads w fill ldy hsy ldx hsx */
static void ref_head_copy(const gpu_op_args *a, hostv *h)
{
    int64_t n = a->i[0], heads = a->i[1], w = a->i[2], fill = a->i[3], ldy = a->i[4], hsy = a->i[5];
    int64_t ldx = a->i[6], hsx = a->i[7];
    for (int64_t r = 0; r < n; r++) {
        if (!hsy) {
            for (int64_t j = 0; j < w; j++) {
                double sum = 0.0;
                for (int64_t g = 0; g < heads; g++) sum += h->T[1][r * ldx + g * hsx + j];
                h->T[0][r * ldy + j] = sum;
            }
            continue;
        }
        for (int64_t g = 0; g < heads; g++)
            for (int64_t j = 0; j < fill; j++)
                h->T[0][r * ldy + g * hsy + j] = j < w ? h->T[1][r * ldx + g * hsx + j] : 0.0;
    }
}

/* ---- backends ------------------------------------------------------------------------ */

#define GUARD 64 /* bytes checked on both sides of every buffer */
#define GUARD_BYTE 0xa5

typedef struct devpair devpair;
typedef struct backend {
    const char *name;
    devpair *dev; /* a device of the device interface, or NULL (the shim) */
    void *(*alloc)(size_t bytes);
    void (*release)(void *p);
    void (*put)(void *dst, const void *src, size_t bytes);
    void (*get)(void *dst, const void *src, size_t bytes);
    zo_status (*run)(gpu_op_id id, const gpu_op_args *a); /* returns when done */
    int cases, failed;
    int tf32; /* fp32 GEMMs on TF32 tensor cores (CUDA's cuBLASLt path): inputs rounded
               * to 10 mantissa bits, so their tolerance is fp16's */
    /* (optional) the cases it runs; NULL: every case */
    int (*takes)(const pcase *c);
    int fibers;  /* the host shim's fiber kernels: ZO_OPS_SHIM_MAX_T and _LEAN apply */
    int skipped; /* attention cases past ZO_OPS_SHIM_MAX_T not run here */
    int lean;    /* cases left out by ZO_OPS_SHIM_LEAN */
    int split;   /* cases left to the sanitizer pass by ZO_OPS_SHIM_SPLIT */
} backend;

/* ZO_OPS_SHIM_MAX_T=N (both builds' ctest entries set 200): the shim's
 * flash, tensor-core and mma.sync backends leave out attention's cases
 * longer than N tokens. Those cases are in the grid for the GEMM path, which
 * a GPU takes from 256 tokens, and its chunks (the GEMM-path backends and a
 * GPU's cuda backend still run them all); the fiber kernels cross every
 * tile and block boundary of theirs in the shorter cases, each feature of
 * the long ones has a shorter case (softcap_grid, alibi_grid), and the long
 * ones took 43 of test_ops' 76 s in the plain build, two thirds under ASan.
 * 0 or unset: every case. */
static int shim_max_t;

static int long_for_fibers(const backend *be, const pcase *c)
{
    return be->fibers && shim_max_t > 0 &&
           (c->op == GPU_OP_ATTENTION_FORWARD || c->op == GPU_OP_ATTENTION_BACKWARD) &&
           c->a.d.attn.t > shim_max_t;
}

/* ZO_OPS_SHIM_LEAN=1 (the sanitizer build's ctest entry sets it too): the
 * fiber kernels leave out the attention cases marked fiber_repeat, whose
 * paths (head size, GQA group, tiles, window, cap, ALiBi form, batch,
 * types) the cases beside them run on those kernels too, each mark saying
 * which (attention_grid, alibi_grid), and the sums of squares whose
 * kernel paths other sizes run (parity_sum_squares: a fixed grid, as
 * long on the shim for any n); the kernels that ignore grads16 the
 * cases of grads16_grid whose path without it other cases run there: the
 * flash kernel (cuda-shim) every one (its one template argument is the
 * head size's dims per lane, the types are read at run time), the
 * tensor-core kernels (cuda-shim-tc) those marked tc_repeat (their
 * template instance, by type and head size, and dO's split: grads16_grid,
 * and scale_grid's one repeat of a softcap_grid case); and
 * test_attention_tune its one case that repeats another's
 * (tune_case.lean_repeat). The CPU backend, the GEMM-path backends and the
 * mma.sync kernels (which take grads16) still run every case there; unset
 * or 0, every case runs. */
static int shim_lean;

/* The cases ZO_OPS_SHIM_LEAN leaves out on a backend (set or not) */
static int lean_case(const backend *be, const pcase *c)
{
    if (!be->fibers) return 0;
    if (c->fiber_repeat) return 1;
    int g16 = c->op == GPU_OP_ATTENTION_BACKWARD && c->a.d.attn.grads16;
    return (g16 && !strcmp(be->name, "cuda-shim")) || (c->tc_repeat && !strcmp(be->name, "cuda-shim-tc"));
}

static int lean_for_fibers(const backend *be, const pcase *c) { return shim_lean && lean_case(be, c); }

/* ZO_OPS_SHIM_SPLIT=1 (scripts/test.sh sets it for the plain build's pass
 * when the sanitizer build's follows, in the same run): the host shim's
 * backends run here only the cases ZO_OPS_SHIM_LEAN leaves out of the
 * sanitizer build's entry; every other shim case runs there, generated
 * alike and held to the same reference and bounds, under ASan and UBSan
 * too. The CPU backend (and a GPU's cuda backend) run every case. Unset or
 * 0 (a bare ctest, or scripts/test.sh with ZO_SKIP_SANITIZE=1): every case
 * runs here. The shim took 41 of the plain entry's 54 s. */
static int shim_split;

/* An environment flag, 0 or 1 (unset: *out unchanged); -1 naming it otherwise. */
static int env_flag(const char *name, int *out)
{
    const char *v = getenv(name);
    if (!v) return 0;
    if (strcmp(v, "0") && strcmp(v, "1")) {
        fprintf(stderr, "test_ops: %s=%s: expected 0 or 1\n", name, v);
        return -1;
    }
    *out = v[0] == '1';
    return 0;
}

static int split_out(const backend *be, const pcase *c)
{
    return shim_split && !strncmp(be->name, "cuda-shim", 9) && !lean_case(be, c);
}

/* A device of the device interface: the CPU backend, or CUDA (cuda:0). The
 * backend running a case is `cur`; its device and stream are in it. */
typedef struct devpair {
    gpu_device_t dev;
    gpu_stream_t s;
} devpair;

static devpair cpu_dev, cuda_dev, *cur;

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    assert_int_equal(gpu_mem_alloc(cur->dev, bytes, &p), ZO_OK);
    return p;
}

static void dev_release(void *p) { gpu_mem_free(cur->dev, p); }

static void dev_copy(void *dst, const void *src, size_t bytes, gpu_copy_kind kind)
{
    assert_int_equal(gpu_memcpy_async(cur->s, dst, src, bytes, kind), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(cur->s), ZO_OK);
}

static void dev_put(void *dst, const void *src, size_t bytes)
{
    dev_copy(dst, src, bytes, GPU_COPY_HOST_TO_DEVICE);
}

static void dev_get(void *dst, const void *src, size_t bytes)
{
    dev_copy(dst, src, bytes, GPU_COPY_DEVICE_TO_HOST);
}

static zo_status dev_run(gpu_op_id id, const gpu_op_args *a)
{
    zo_status st = gpu_op_run(cur->s, id, a);
    zo_status st2 = gpu_stream_synchronize(cur->s);
    return st != ZO_OK ? st : st2;
}

#ifdef ZO_HAVE_CUDA_SHIM
/* The CUDA kernels on the host (gpu/cuda/shim/): plain host memory. */
static shim_exec shim;

static void *host_alloc(size_t bytes)
{
    void *p = malloc(bytes);
    assert_non_null(p);
    return p;
}

static void host_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

static zo_status shim_run(gpu_op_id id, const gpu_op_args *a)
{
    return shim_cuda_ops[id](&shim.exec, a);
}

/* The GEMM path of attention (gpu/cuda/attention_gemm.cu) on the shim, forced
 * (a GPU takes it by itself from t 256), twice: with the default cap on a
 * chunk's scores (blocks of 256 query rows, every kv head in one chunk at
 * these sizes), and with a cap of 200 KiB, which splits the kv heads into
 * chunks and, from t 257, the query rows into blocks of 64 or 128 (the
 * second only where it does split: takes_gemm_small_attention). */
static shim_exec shim_gemm;

static zo_status shim_gemm_run(gpu_op_id id, const gpu_op_args *a)
{
    shim_gemm.exec.attn_cap = 0;
    return shim_cuda_ops[id](&shim_gemm.exec, a);
}

static const size_t shim_gemm_small_cap = (size_t)200 << 10;

static zo_status shim_gemm_small_run(gpu_op_id id, const gpu_op_args *a)
{
    shim_gemm.exec.attn_cap = shim_gemm_small_cap;
    return shim_cuda_ops[id](&shim_gemm.exec, a);
}

/* The fused tensor-core kernels (gpu/cuda/attention_tc.cu) on the shim,
 * forced (ZO_ATTENTION=tc on a GPU), over the cases they cover
 * (takes_tc_attention); the dispatch sends the others elsewhere. */
static shim_exec shim_tc;

static zo_status shim_tc_run(gpu_op_id id, const gpu_op_args *a)
{
    return shim_cuda_ops[id](&shim_tc.exec, a);
}

/* Attention's cases with 16-bit qkv: the only ones the GEMM path takes. */
static int takes_gemm_attention(const pcase *c)
{
    int qkv = c->op == GPU_OP_ATTENTION_FORWARD ? 1 : c->op == GPU_OP_ATTENTION_BACKWARD ? 2 : -1;
    if (qkv < 0) return 0;
    for (int k = 0; k < c->nbuf; k++)
        if (c->buf[k].slot == 't' && c->buf[k].index == qkv) return c->buf[k].type != E_F32;
    return 0;
}

/* The GEMM path's cases whose chunks the 200 KiB cap changes: where the
 * default cap's plan (rows per block, kv heads per chunk) is also the small
 * cap's, cuda-shim-gemm-small would run the very launches cuda-shim-gemm
 * ran, on the same scratch, and is left out. */
static int takes_gemm_small_attention(const pcase *c)
{
    if (!takes_gemm_attention(c)) return 0;
    const gpu_attn_desc *d = &c->a.d.attn;
    cuda_attn_chunks big = cuda_attn_plan_chunks(d->t, d->hkv, d->window, 0);
    cuda_attn_chunks small = cuda_attn_plan_chunks(d->t, d->hkv, d->window, shim_gemm_small_cap);
    return big.rows != small.rows || big.heads != small.heads;
}

/* The cases the tensor-core kernels cover (cuda_attn_tc_covers). */
static int takes_tc_attention(const pcase *c)
{
    return takes_gemm_attention(c) && cuda_attn_tc_covers(&c->a.d.attn, ZO_DTYPE_BF16);
}

/* The mma.sync kernels (gpu/cuda/attention_mma.cu) on the shim, forced
 * (ZO_ATTENTION=mma on a GPU), over the cases they cover
 * (cuda_attn_mma_covers). */
static shim_exec shim_mma;

static zo_status shim_mma_run(gpu_op_id id, const gpu_op_args *a)
{
    return shim_cuda_ops[id](&shim_mma.exec, a);
}

/* (At head size 256 past 256 tokens only the windowed cases: the others
 * cost the shim seconds a case there, and the windowed ones cross the same
 * row tiles.) */
static int takes_mma_attention(const pcase *c)
{
    const gpu_attn_desc *d = &c->a.d.attn;
    if (d->d == 256 && d->t > 256 && !zo_attn_window_masks(d->window, d->t)) return 0;
    return takes_gemm_attention(c) && cuda_attn_mma_covers(d, ZO_DTYPE_BF16);
}
#endif

/* ---- running a case ------------------------------------------------------------------ */

static int verbose;

/* The name the op's row gives a buffer's slot. */
static const char *slot_label(gpu_op_id id, const pbuf *b)
{
    const gpu_op_info *info = &gpu_op_infos[id];
    for (int k = 0; k < info->n_slots; k++) {
        const gpu_op_slot *s = &info->slots[k];
        int is_t = s->kind == GPU_SLOT_TENSOR || s->kind == GPU_SLOT_TENSOR_OPT;
        int is_p = s->kind == GPU_SLOT_PTR || s->kind == GPU_SLOT_PTR_OPT;
        if (s->index == b->index && ((b->slot == 't' && is_t) || (b->slot == 'p' && is_p)))
            return s->name;
    }
    return "?";
}

static double **slot_of(hostv *h, const pbuf *b)
{
    return b->slot == 't' ? &h->T[b->index] : &h->P[b->index];
}

/* Host values of a case's buffers, drawn and rounded to their types. */
static void draw(const pcase *c, double **v)
{
    for (int k = 0; k < c->nbuf; k++) {
        const pbuf *b = &c->buf[k];
        v[k] = NULL;
        if (b->alias >= 0) continue;
        v[k] = calloc(b->n ? b->n : 1, sizeof(double));
        for (size_t i = 0; i < b->n; i++) {
            double u = urand();
            if (b->fill == FILL_UNIFORM) v[k][i] = as_stored(b->lo + (b->hi - b->lo) * u, b->type);
            else if (b->fill == FILL_INT) v[k][i] = floor(b->lo + (b->hi - b->lo) * u);
        }
    }
}

static void bind_host(const pcase *c, double **v, hostv *h)
{
    memset(h, 0, sizeof *h);
    for (int k = 0; k < c->nbuf; k++) {
        const pbuf *b = &c->buf[k];
        *slot_of(h, b) = v[b->alias >= 0 ? b->alias : k];
    }
}

/* Buffer k's values in its storage type. */
static void encode(const pbuf *b, const double *v, void *dst)
{
    for (size_t i = 0; i < b->n; i++) {
        if (b->type == E_I32) ((int32_t *)dst)[i] = (int32_t)v[i];
        else if (b->type == E_U8) ((uint8_t *)dst)[i] = (uint8_t)v[i];
        else if (b->type == E_F64) ((double *)dst)[i] = v[i];
        else zo_store_f32(dst, (zo_dtype)b->type, i, (float)v[i]);
    }
}

static void decode(const pbuf *b, const void *src, double *v)
{
    for (size_t i = 0; i < b->n; i++) {
        if (b->type == E_I32) v[i] = ((const int32_t *)src)[i];
        else if (b->type == E_U8) v[i] = ((const uint8_t *)src)[i];
        else if (b->type == E_F64) v[i] = ((const double *)src)[i];
        else v[i] = zo_load_f32(src, (zo_dtype)b->type, i);
    }
}

static double rms(const double *v, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += isfinite(v[i]) ? v[i] * v[i] : 0.0;
    return n ? sqrt(s / n) : 0.0;
}

/* ZO_OPS_VERBOSE: an output's worst error over its bound, the element
 * where it is, and that element's share of the tensor cores' term (extra) */
static void worst_ratio(const char *what, const double *got, const double *want, size_t n, double at, double rt,
                        const double *extra, const double *cond, const double *steps)
{
    double worst = 0.0, worst_tc = 0.0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]), r = d / (at + rt * fabs(want[i]) + extra[i]);
        if (r > worst) worst = r, wi = i;
        if (extra[i] > 0.0 && d / extra[i] > worst_tc) worst_tc = d / extra[i];
    }
    printf("  %s: error/bound %.3f at [%zu] (got %.9g want %.9g, sum |terms| %.4g, %.0f k-steps, tc term %.3g, "
           "rms term %.3g); error/tc term at most %.3f\n",
           what, worst, wi, got[wi], want[wi], cond[wi], steps[wi], extra[wi], at + rt * fabs(want[wi]), worst_tc);
}

/* Run case c on backend be; want: the reference's values; cond, steps:
 * the reference's per-element sums of |terms| and k-steps for the buffer
 * with a cond_k (else NULL). 0 when it passes. */
static int run_on(backend *be, const pcase *c, double **in, double **want, const double *cond, const double *steps)
{
    void *mem[MAX_BUF] = {0};
    size_t bytes[MAX_BUF], lead[MAX_BUF];
    gpu_op_args a = c->a;
    int bad = 0;
    for (int k = 0; k < c->nbuf; k++) {
        const pbuf *b = &c->buf[k];
        if (b->alias >= 0) continue;
        bytes[k] = b->n * esize(b->type);
        lead[k] = GUARD + (size_t)b->skew * esize(b->type);
        size_t total = bytes[k] + lead[k] + GUARD;
        uint8_t *img = malloc(total);
        memset(img, GUARD_BYTE, total);
        encode(b, in[k], img + lead[k]);
        mem[k] = be->alloc(total);
        be->put(mem[k], img, total);
        free(img);
    }
    for (int k = 0; k < c->nbuf; k++) {
        const pbuf *b = &c->buf[k];
        int at = b->alias >= 0 ? b->alias : k;
        void *p = (char *)mem[at] + lead[at];
        if (b->slot == 't') a.t[b->index] = gpu_t(p, (zo_dtype)(b->type <= E_BF16 ? b->type : E_F32));
        else a.p[b->index] = p;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    zo_status st = be->run(c->op, &a);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (st != ZO_OK) {
        printf("  %s on %s: %s: status %d: %s\n", gpu_op_infos[c->op].name, be->name, c->label, st,
               zo_last_error());
        bad = 1;
    }
    char what[320];
    for (int k = 0; k < c->nbuf && !bad; k++) {
        const pbuf *b = &c->buf[k];
        if (b->alias >= 0) continue;
        size_t total = bytes[k] + lead[k] + GUARD;
        uint8_t *img = malloc(total);
        be->get(img, mem[k], total);
        for (size_t i = 0; i < total; i = i + 1 == lead[k] ? lead[k] + bytes[k] : i + 1) /* the guard bytes */
            if (img[i] != GUARD_BYTE) {
                printf("  %s on %s: %s: %s written out of bounds (byte %lld)\n", gpu_op_infos[c->op].name,
                       be->name, c->label, slot_label(c->op, b), (long long)i - (long long)lead[k]);
                bad = 1;
                break;
            }
        snprintf(what, sizeof what, "%s on %s: %s: %s (%s, %s)", gpu_op_infos[c->op].name, be->name,
                 c->label, slot_label(c->op, b), ename(b->type), b->out ? "output" : "input");
        if (!b->out) { /* an input: every byte as it was (nan included) */
            uint8_t *orig = malloc(bytes[k] ? bytes[k] : 1);
            encode(b, in[k], orig);
            const int same = memcmp(orig, img + lead[k], bytes[k]) == 0; /* else: find the element */
            for (size_t i = 0; i < bytes[k] && !same; i++)
                if (orig[i] != img[lead[k] + i]) {
                    printf("  %s: changed at element %zu\n", what, i / esize(b->type));
                    bad = 1;
                    break;
                }
            free(orig);
        } else { /* an output: within its type's tolerance of the reference */
            double *got = malloc((b->n ? b->n : 1) * sizeof *got);
            decode(b, img + lead[k], got);
            if (b->cmp) {
                if (b->cmp(c, what, got, want[k], b->n)) bad = 1;
                free(got);
                free(img);
                continue;
            }
            double rt = b->rtol > 0 ? b->rtol : rtol_of(b->type);
            if (be->tf32 && c->op == GPU_OP_GEMM && b->type == E_F32) rt = rtol_of(E_F16);
            double mag = rms(want[k], b->n);
            if (mag < b->floor) mag = b->floor;
            double at = (b->no_rms ? 1e-6 : rt) * mag + (b->type == E_F16 ? F16_SUBNORMAL_STEP : 0.0);
            if (b->cond_k > 0.0 && cond) {
                double *extra = malloc((b->n ? b->n : 1) * sizeof *extra);
                for (size_t i = 0; i < b->n; i++) extra[i] = (b->cond_c + b->cond_k * steps[i]) * cond[i];
                if (check_close_f64_each(what, got, want[k], b->n, at, rt, extra)) bad = 1;
                if (verbose) worst_ratio(what, got, want[k], b->n, at, rt, extra, cond, steps);
                free(extra);
            } else if (check_close_f64(what, got, want[k], b->n, at, rt)) bad = 1;
            free(got);
        }
        free(img);
    }
    for (int k = 0; k < c->nbuf; k++)
        if (mem[k]) be->release(mem[k]);
    be->cases++;
    be->failed += bad;
    if (verbose)
        printf("  %-28s %-10s %s %s %.3f s\n", gpu_op_infos[c->op].name, be->name, c->label, bad ? "FAILED" : "ok",
               (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return bad;
}

static backend *backends[6];
static int n_backends;
static int op_cases[GPU_OP_COUNT];
static int op_failed[GPU_OP_COUNT];
static const char *filter;

typedef void (*ref_fn)(const gpu_op_args *a, hostv *h);
static const ref_fn refs[GPU_OP_COUNT] = {
#define REF(ID, name, slots, check) [GPU_OP_##ID] = ref_##name,
    GPU_OP_TABLE(REF)
#undef REF
};

/* Draw the case's inputs, compute the reference, run it on every backend. */
/* Set: emit() starts each case's last input buffer one element past a
 * 16-byte boundary (vec_cases) */
static int skew_last_input;

static void emit(pcase *c)
{
    if (filter && !strstr(gpu_op_infos[c->op].name, filter)) return;
    if (skew_last_input)
        for (int k = c->nbuf - 1; k >= 0; k--)
            if (!c->buf[k].out && c->buf[k].alias < 0 && c->buf[k].slot == 't') {
                c->buf[k].skew = 1;
                snprintf(c->label + strlen(c->label), sizeof c->label - strlen(c->label), ", %s one element off",
                         slot_label(c->op, &c->buf[k]));
                break;
            }
    double *in[MAX_BUF], *want[MAX_BUF];
    draw(c, in);
    hostv h;
    bind_host(c, in, &h);
    if (c->prep) {
        c->prep(c, &h);
        for (int k = 0; k < c->nbuf; k++) /* what prep computed, as stored */
            if (c->buf[k].alias < 0)
                for (size_t i = 0; i < c->buf[k].n; i++) in[k][i] = as_stored(in[k][i], c->buf[k].type);
    }
    for (int k = 0; k < c->nbuf; k++) {
        want[k] = NULL;
        if (c->buf[k].alias >= 0) continue;
        want[k] = malloc((c->buf[k].n ? c->buf[k].n : 1) * sizeof(double));
        memcpy(want[k], in[k], c->buf[k].n * sizeof(double));
    }
    bind_host(c, want, &h);
    for (int k = 0; k < c->nbuf; k++)
        if (c->buf[k].cond_k > 0.0) { /* the tensor cores' condition of T[0] */
            h.cond = calloc(c->buf[k].n ? c->buf[k].n : 1, sizeof(double));
            h.steps = calloc(c->buf[k].n ? c->buf[k].n : 1, sizeof(double));
        }
    for (int k = 0; k < c->nbuf; k++) /* the reference sees the storage types */
        if (c->buf[k].slot == 't' && c->buf[k].type <= E_BF16) c->a.t[c->buf[k].index].dtype = (zo_dtype)c->buf[k].type;
    refs[c->op](&c->a, &h);
    op_cases[c->op]++;
    for (int b = 0; b < n_backends; b++) {
        if (backends[b]->takes && !backends[b]->takes(c)) continue;
        if (long_for_fibers(backends[b], c)) {
            backends[b]->skipped++;
            continue;
        }
        if (lean_for_fibers(backends[b], c)) {
            backends[b]->lean++;
            continue;
        }
        if (split_out(backends[b], c)) {
            backends[b]->split++;
            continue;
        }
        cur = backends[b]->dev;
        if (run_on(backends[b], c, in, want, h.cond, h.steps)) op_failed[c->op]++;
    }
    for (int k = 0; k < c->nbuf; k++) free(in[k]), free(want[k]);
    free(h.cond), free(h.steps);
}

/* ---- generators: the grids --------------------------------------------------------------
 * The boundaries they cross: the CPU GEMM's register tile (MR 6 x NR 32) and
 * cache blocks (MC 192, NC 256, KC 256), the CUDA tiled GEMM's 16; the CPU
 * attention's query blocks of 48 rows and 32-wide panels, the CUDA
 * attention's 32-row tiles and 8-warp blocks; the CPU elementwise blocks of
 * 2048, sum-of-squares chunks of 16384, bias column blocks of 64; the CUDA
 * blocks of 256 threads, 32-column groups of the column sums; NF4's blocks
 * of 64 weights and 256 constants. */

static const etype storage[3] = {E_F32, E_F16, E_BF16};

static void gemm_case(int m, int n, int k, int ta, int tb, etype ty, int pad, float alpha,
                      float beta, int batch)
{
    pcase c = new_case(GPU_OP_GEMM, "m %d n %d k %d %c%c %s pad %d alpha %g beta %g batch %d", m, n, k,
                       ta ? 'T' : 'N', tb ? 'T' : 'N', ename(ty), pad, alpha, beta, batch);
    gpu_gemm_desc *d = &c.a.d.gemm;
    d->trans_a = ta, d->trans_b = tb, d->m = m, d->n = n, d->k = k, d->alpha = alpha, d->beta = beta;
    d->lda = (ta ? m : k) + pad, d->ldb = (tb ? k : n) + pad, d->ldc = n + pad;
    d->batch = batch;
    size_t sa = (size_t)(ta ? k : m) * d->lda, sb = (size_t)(tb ? n : k) * d->ldb, sc = (size_t)m * d->ldc;
    int nb = batch > 0 ? batch : 1;
    d->stride_a = (int64_t)sa + 3, d->stride_b = (int64_t)sb + 5, d->stride_c = (int64_t)sc + 7;
    IN_T(&c, 0, ty, nb * (sa + 3));
    IN_T(&c, 1, ty, nb * (sb + 5));
    int cb = OUT_T(&c, 2, ty, nb * (sc + 7));
    /* long sums: the fp32 accumulation's error grows with k */
    if (ty == E_F32) c.buf[cb].rtol = 2e-5 * (1.0 + k / 256.0);
    c.param[0] = beta == 0.0f; /* C holds nan: beta == 0 must not read it */
    emit(&c);
}

static void gemm_nan_prep(const pcase *c, hostv *h)
{
    const gpu_gemm_desc *d = &c->a.d.gemm;
    int nb = d->batch > 0 ? d->batch : 1;
    for (int bi = 0; bi < nb; bi++)
        for (int i = 0; i < d->m; i++)
            for (int j = 0; j < d->n; j++) h->T[2][(size_t)bi * d->stride_c + (size_t)i * d->ldc + j] = NAN;
}

static void parity_gemm(void)
{
    static const int shapes[][3] = {
        {1, 1, 1},    {5, 31, 17},   {6, 32, 16},   {7, 33, 15},  {13, 64, 255}, {12, 65, 256},
        {6, 31, 257}, {193, 40, 20}, {20, 257, 33}, {37, 70, 300}, {192, 256, 64}, {3, 100, 513},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int tr = 0; tr < 4; tr++)
            gemm_case(shapes[s][0], shapes[s][1], shapes[s][2], tr & 1, tr >> 1, E_F32, 0, 1.0f, 0.0f, 0);
    for (int t = 1; t < 3; t++)
        for (int tr = 0; tr < 4; tr++) gemm_case(29, 47, 70, tr & 1, tr >> 1, storage[t], 0, 1.0f, 0.0f, 0);
    /* padded leading dimensions, alpha and beta, batches with gaps */
    gemm_case(17, 35, 40, 0, 1, E_F32, 3, 0.5f, 0.0f, 0);
    gemm_case(17, 35, 40, 1, 0, E_F32, 5, -1.5f, 0.75f, 0);
    gemm_case(9, 33, 18, 0, 0, E_BF16, 2, 1.0f, 1.0f, 3);
    gemm_case(8, 20, 48, 1, 1, E_F32, 1, 1.0f, 0.0f, 4);
    gemm_case(50, 7, 9, 0, 1, E_F16, 0, 2.0f, -0.5f, 2);
    /* Granite's alphas on 16-bit operands: residual_multiplier on a branch's
     * last projection (NT, its weight gradient TN accumulated with beta 1,
     * its input gradient NN), 1 / logits_scaling on the output layer */
    gemm_case(130, 64, 96, 0, 1, E_BF16, 0, 0.22f, 0.0f, 0);
    gemm_case(96, 64, 130, 1, 0, E_BF16, 0, 0.22f, 1.0f, 0);
    gemm_case(130, 96, 64, 0, 0, E_F16, 0, 0.22f, 1.0f, 0);
    gemm_case(65, 257, 80, 0, 1, E_BF16, 0, 0.125f, 0.0f, 0);
    /* beta 0 ignores C even when it holds nan */
    pcase c = new_case(GPU_OP_GEMM, "m 7 n 33 k 5 NT f32 beta 0 over nan");
    gpu_gemm_desc *d = &c.a.d.gemm;
    *d = (gpu_gemm_desc){.trans_b = 1, .m = 7, .n = 33, .k = 5, .alpha = 1.0f, .lda = 5, .ldb = 5, .ldc = 33};
    IN_T(&c, 0, E_F32, 35);
    IN_T(&c, 1, E_F32, 165);
    OUT_T(&c, 2, E_F32, 231);
    c.prep = gemm_nan_prep;
    emit(&c);
}

/* The CUDA kernels move chunks of 8 elements (16 bytes of a 16-bit type)
 * with vector accesses where every tensor they touch is 16-byte aligned,
 * scalar ones elsewhere: vec_cases(gen) runs gen() (cases at sizes around
 * the chunks and the blocks) twice, every buffer aligned and then the last
 * input one element off, from a stream of its own (the cases before it
 * and after it draw what they drew without it). */
#define VEC_CASE_SEED 0xbb67ae8584caa73bull

static void vec_cases(void (*gen)(void))
{
    uint64_t saved = rng;
    rng = VEC_CASE_SEED;
    gen();
    skew_last_input = 1;
    gen();
    skew_last_input = 0;
    rng = saved;
}

/* y (dy) of type ty, the bias (its gradient) of type tb */
static void bias_case(gpu_op_id op, int n, int cc, int ld, etype ty, etype tb)
{
    pcase c = ty == tb ? new_case(op, "n %d c %d ld %d %s", n, cc, ld, ename(ty))
                       : new_case(op, "n %d c %d ld %d %s, bias %s", n, cc, ld, ename(ty), ename(tb));
    c.a.i[0] = n, c.a.i[1] = cc, c.a.i[2] = ld;
    if (op == GPU_OP_BIAS_FORWARD) {
        OUT_T(&c, 0, ty, (size_t)n * ld);
        IN_T(&c, 1, tb, cc);
    } else {
        OUT_T(&c, 0, tb, cc);
        IN_T(&c, 1, ty, (size_t)n * ld);
    }
    emit(&c);
}

/* GPT-2's hidden 768, 2048 with a row stride of 2056, odd widths around a
 * block of 256 columns (264, 300 with stride 303), and 1000 rows of 40: more
 * row chunks of the column sums than a few */
static gpu_op_id vec_bias_op;
static void bias_vec_grid(void)
{
    static const int shapes[][3] = {{9, 768, 0}, {5, 2048, 8}, {40, 264, 0}, {6, 300, 3}, {1000, 40, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int t = 0; t < 3; t++)
            bias_case(vec_bias_op, shapes[s][0], shapes[s][1], shapes[s][1] + shapes[s][2], storage[t], storage[t]);
}

static void bias_cases(gpu_op_id op)
{
    static const int shapes[][3] = {{1, 1, 0}, {3, 63, 1}, {17, 64, 0}, {33, 65, 7}, {5, 130, 2}, {70, 33, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int t = 0; t < 3; t++)
            bias_case(op, shapes[s][0], shapes[s][1], shapes[s][1] + shapes[s][2], storage[t], storage[t]);
    /* the output layer's bias (Phi's lm_head.bias): fp32 logits, their row
     * stride the vocabulary, and a 16-bit bias; its gradient from the fp32
     * dlogits into a 16-bit dbias (a biased layer's dy too) */
    static const int head[][2] = {{4, 1000}, {3, 2051}, {33, 257}};
    for (size_t s = 0; s < sizeof head / sizeof *head; s++)
        for (int t = 1; t < 3; t++) bias_case(op, head[s][0], head[s][1], head[s][1], E_F32, storage[t]);
    vec_bias_op = op;
    vec_cases(bias_vec_grid);
}

static void parity_bias_forward(void) { bias_cases(GPU_OP_BIAS_FORWARD); }
static void parity_bias_backward(void) { bias_cases(GPU_OP_BIAS_BACKWARD); }

static const int norm_shapes[][2] = {{1, 1}, {3, 31}, {4, 32}, {5, 33}, {17, 64}, {2, 65}, {9, 768}, {3, 1000}};

/* The norm backwards' weight gradients go over a fixed number of row chunks
 * (32 on the CPU: n 67 and 130 are more rows, in chunks of 2-5 rows, the
 * last short or empty; with 128 every chunk is full; on CUDA chunks of at
 * least 16 rows, one a row group: 67 in 5 of 14, 130 in 9 of 15, the last
 * short, 128 in 8 full ones). */
static const int norm_chunk_shapes[][2] = {{67, 40}, {128, 24}, {130, 96}};

/* The cases added with the chunks and the NULL dw draw from a stream of
 * their own (as parity_adam_state_update's), after the ones before them:
 * every later op draws what it drew before they were added. */
#define NORM_CHUNK_SEED 0x6a09e667f3bcc909ull

/* mean and rstd of the rows of x (t[x_slot]), as the forward saves them */
static void norm_prep(const pcase *c, hostv *h)
{
    int n = (int)c->a.i[0], cc = (int)c->a.i[1], layer = c->op == GPU_OP_LAYERNORM_BACKWARD;
    const double *x = h->T[layer ? 4 : 3];
    for (int r = 0; r < n; r++) {
        if (layer) row_stats(x + (size_t)r * cc, cc, 1e-5, &h->P[0][r], &h->P[1][r]);
        else h->P[0][r] = row_rms_rstd(x + (size_t)r * cc, cc, 1e-6);
    }
}

/* Rows around the CUDA kernels' chunks of 8 and blocks of 256 threads
 * (2048 columns): LLaMA's hidden 2048, 2047, 2056, its MLP's 5504, 80 (vec_cases) */
static const int norm_vec_shapes[][2] = {{3, 2048}, {2, 2047}, {2, 2056}, {2, 5504}, {4, 80}};

static void layernorm_forward_case(int n, int cc, etype ty, int with_b)
{
    pcase c = new_case(GPU_OP_LAYERNORM_FORWARD, "n %d c %d %s%s", n, cc, ename(ty), with_b ? "" : " no bias");
    c.a.i[0] = n, c.a.i[1] = cc, c.a.f[0] = 1e-5f;
    OUT_T(&c, 0, ty, (size_t)n * cc);
    int x = IN_T(&c, 1, ty, (size_t)n * cc);
    c.buf[x].lo = -2.0, c.buf[x].hi = 3.0; /* a mean away from 0 */
    IN_T(&c, 2, ty, cc);
    if (with_b) IN_T(&c, 3, ty, cc);
    OUT_P(&c, 0, E_F32, n);
    OUT_P(&c, 1, E_F32, n);
    emit(&c);
}

/* with and without a bias (Cohere's LayerNorm has none, at hidden 4096 and
 * 8192: the 2048 and 2056 rows' blocks) */
static void layernorm_forward_vec_grid(void)
{
    for (size_t s = 0; s < sizeof norm_vec_shapes / sizeof *norm_vec_shapes; s++)
        for (int t = 0; t < 3; t++)
            for (int with_b = 1; with_b >= 0; with_b--)
                layernorm_forward_case(norm_vec_shapes[s][0], norm_vec_shapes[s][1], storage[t], with_b);
}

static void parity_layernorm_forward(void)
{
    for (size_t s = 0; s < sizeof norm_shapes / sizeof *norm_shapes; s++)
        for (int t = 0; t < 3; t++)
            for (int with_b = 0; with_b < 2; with_b++)
                layernorm_forward_case(norm_shapes[s][0], norm_shapes[s][1], storage[t], with_b);
    vec_cases(layernorm_forward_vec_grid);
}

/* grads: 2 dw and db, 1 dw (no db), 0 neither (a frozen norm) */
static void layernorm_backward_case(int n, int cc, etype ty, int grads)
{
    pcase c = new_case(GPU_OP_LAYERNORM_BACKWARD, "n %d c %d %s%s", n, cc, ename(ty),
                       grads == 2 ? "" : grads == 1 ? " no db" : " no dw, db");
    c.a.i[0] = n, c.a.i[1] = cc;
    OUT_T(&c, 0, ty, (size_t)n * cc);              /* dx += */
    if (grads > 0) OUT_T(&c, 1, ty, cc);           /* dw += */
    if (grads > 1) OUT_T(&c, 2, ty, cc);           /* db += */
    IN_T(&c, 3, ty, (size_t)n * cc);
    IN_T(&c, 4, ty, (size_t)n * cc);
    IN_T(&c, 5, ty, cc);
    add_buf(&c, 'p', 0, E_F32, n, FILL_NONE, 0, 0, 0);
    add_buf(&c, 'p', 1, E_F32, n, FILL_NONE, 0, 0, 0);
    c.prep = norm_prep;
    emit(&c);
}

/* norm_backward_cases' builder and its grads, for the vec_cases grid */
static void (*vec_norm_one)(int, int, etype, int);
static int vec_norm_top;

static void norm_backward_vec_grid(void)
{
    for (size_t s = 0; s < sizeof norm_vec_shapes / sizeof *norm_vec_shapes; s++)
        for (int t = 0; t < 3; t++) vec_norm_one(norm_vec_shapes[s][0], norm_vec_shapes[s][1], storage[t], vec_norm_top);
}

/* A norm backward's cases: one(n, c, type, grads), grads 1..top (the
 * parameter gradients: top all of them) at norm_shapes, then from their own
 * stream grads 0 (none: a frozen norm) there and every grads at
 * norm_chunk_shapes. */
static void norm_backward_cases(void (*one)(int, int, etype, int), int top)
{
    for (size_t s = 0; s < sizeof norm_shapes / sizeof *norm_shapes; s++)
        for (int t = 0; t < 3; t++)
            for (int g = 1; g <= top; g++) one(norm_shapes[s][0], norm_shapes[s][1], storage[t], g);
    uint64_t saved = rng;
    rng = NORM_CHUNK_SEED;
    for (size_t s = 0; s < sizeof norm_shapes / sizeof *norm_shapes; s++)
        for (int t = 0; t < 3; t++) one(norm_shapes[s][0], norm_shapes[s][1], storage[t], 0);
    for (size_t s = 0; s < sizeof norm_chunk_shapes / sizeof *norm_chunk_shapes; s++)
        for (int t = 0; t < 3; t++)
            for (int g = 0; g <= top; g++) one(norm_chunk_shapes[s][0], norm_chunk_shapes[s][1], storage[t], g);
    rng = saved;
    vec_norm_one = one, vec_norm_top = top;
    vec_cases(norm_backward_vec_grid);
}

static void parity_layernorm_backward(void) { norm_backward_cases(layernorm_backward_case, 2); }

static void rmsnorm_forward_case(int n, int cc, etype ty)
{
    pcase c = new_case(GPU_OP_RMSNORM_FORWARD, "n %d c %d %s", n, cc, ename(ty));
    c.a.i[0] = n, c.a.i[1] = cc, c.a.f[0] = 1e-6f;
    OUT_T(&c, 0, ty, (size_t)n * cc);
    IN_T(&c, 1, ty, (size_t)n * cc);
    IN_T(&c, 2, ty, cc);
    OUT_P(&c, 0, E_F32, n);
    emit(&c);
}

static void rmsnorm_forward_vec_grid(void)
{
    for (size_t s = 0; s < sizeof norm_vec_shapes / sizeof *norm_vec_shapes; s++)
        for (int t = 0; t < 3; t++) rmsnorm_forward_case(norm_vec_shapes[s][0], norm_vec_shapes[s][1], storage[t]);
}

static void parity_rmsnorm_forward(void)
{
    for (size_t s = 0; s < sizeof norm_shapes / sizeof *norm_shapes; s++)
        for (int t = 0; t < 3; t++) rmsnorm_forward_case(norm_shapes[s][0], norm_shapes[s][1], storage[t]);
    vec_cases(rmsnorm_forward_vec_grid);
}

static void rmsnorm_backward_case(int n, int cc, etype ty, int with_dw)
{
    pcase c = new_case(GPU_OP_RMSNORM_BACKWARD, "n %d c %d %s%s", n, cc, ename(ty), with_dw ? "" : " no dw");
    c.a.i[0] = n, c.a.i[1] = cc;
    OUT_T(&c, 0, ty, (size_t)n * cc);
    if (with_dw) OUT_T(&c, 1, ty, cc);
    IN_T(&c, 2, ty, (size_t)n * cc);
    IN_T(&c, 3, ty, (size_t)n * cc);
    IN_T(&c, 4, ty, cc);
    add_buf(&c, 'p', 0, E_F32, n, FILL_NONE, 0, 0, 0);
    c.prep = norm_prep;
    emit(&c);
}

static void parity_rmsnorm_backward(void) { norm_backward_cases(rmsnorm_backward_case, 1); }

/* The q/k norms: n rows, the first `heads` of `width` heads of d
 * normalised (ld = width * d), at head sizes 64, 80 and 128 among odd ones,
 * and OLMo-2-32B's whole-projection q norm (one run of 40 x 128 = 5120,
 * the first of a row three runs wide) */
static const int head_norm_cfg[][4] = {
    /* n  heads width d */
    {1, 1, 1, 1}, {3, 2, 3, 31}, {5, 4, 4, 33}, {7, 3, 5, 64}, {50, 16, 32, 128}, {33, 8, 16, 128}, {2, 1, 1, 300},
    {9, 6, 7, 80}, {3, 1, 3, 5120},
};

/* Against the weight gradient's row chunks (32 on the CPU; on CUDA of at
 * least 16 rows): 13 rows (fewer than either; 65 head-rows), 69 and 131
 * (more: on the CPU chunks of 2-5 rows, the last short, some empty at the
 * end; on CUDA 5 of 14 and 9 of 15), 64 (every chunk full), at d 80, 64 and
 * 128 (drawn from NORM_CHUNK_SEED's stream) */
static const int head_norm_chunk_cfg[][4] = {
    {13, 5, 6, 80}, {69, 3, 4, 80}, {131, 2, 2, 64}, {64, 2, 3, 128},
};

/* The norm's kinds: Qwen3's RMSNorm with one weight, Cohere's LayerNorm
 * with a weight per head (use_qk_norm), and the other two pairings */
enum { HN_KINDS = 4 };
static int hn_centered(int kind) { return kind == 1 || kind == 2; }
static int hn_per_head(int kind) { return kind == 1 || kind == 3; }
static const char *hn_name(int kind)
{
    static const char *n[] = {"", " layernorm, weight per head", " layernorm", " weight per head"};
    return n[kind];
}

/* the forward's saved heads (t[2]: less their mean when centered, i[5])
 * and their rstd */
static void head_norm_prep(const pcase *c, hostv *h)
{
    int rows = (int)(c->a.i[0] * c->a.i[1]), d = (int)c->a.i[2];
    for (int r = 0; r < rows; r++) {
        double *x = h->T[2] + (size_t)r * d, m = 0.0;
        for (int e = 0; e < d && c->a.i[5]; e++) m += x[e];
        for (int e = 0; e < d && c->a.i[5]; e++) x[e] -= m / d;
        h->P[0][r] = row_rms_rstd(x, d, 1e-6);
    }
}

/* g: n heads width d; the inputs in [at - 1, at + 1) */
static void head_norm_forward_cases(const int *g, int kind, int types, double at)
{
    for (int t = 0; t < types; t++)
        for (int keep = 0; keep < 2; keep++) {
            int64_t ld = (int64_t)g[2] * g[3];
            pcase c = new_case(GPU_OP_HEAD_NORM_FORWARD, "n %d heads %d of %d d %d %s%s%s", g[0], g[1], g[2], g[3],
                               ename(storage[t]), keep ? "" : " nothing kept", hn_name(kind));
            if (at != 0.0)
                snprintf(c.label + strlen(c.label), sizeof c.label - strlen(c.label), ", inputs about %g", at);
            c.a.i[0] = g[0], c.a.i[1] = g[1], c.a.i[2] = g[3], c.a.i[3] = ld, c.a.f[0] = 1e-6f;
            c.a.i[4] = hn_per_head(kind) ? g[3] : 0, c.a.i[5] = hn_centered(kind);
            int x = OUT_T(&c, 0, storage[t], (size_t)g[0] * ld);
            c.buf[x].lo = at - 1.0, c.buf[x].hi = at + 1.0;
            IN_T(&c, 1, storage[t], (size_t)g[3] * (hn_per_head(kind) ? g[1] : 1));
            if (keep) {
                OUT_T(&c, 2, storage[t], (size_t)g[0] * g[1] * g[3]);
                OUT_P(&c, 0, E_F32, (size_t)g[0] * g[1]);
            }
            emit(&c);
        }
}

/* Every storage type for the shared RMSNorm and Cohere's kind, one (the
 * first) for the other two */
static int hn_types(int kind) { return kind < 2 ? 3 : 1; }

static void parity_head_norm_forward(void)
{
    for (int k = 0; k < HN_KINDS; k++)
        for (size_t s = 0; s < sizeof head_norm_cfg / sizeof *head_norm_cfg; s++)
            head_norm_forward_cases(head_norm_cfg[s], k, hn_types(k), 0.0);
    uint64_t saved = rng;
    rng = NORM_CHUNK_SEED;
    for (int k = 0; k < 2; k++)
        for (size_t s = 0; s < sizeof head_norm_chunk_cfg / sizeof *head_norm_chunk_cfg; s++)
            head_norm_forward_cases(head_norm_chunk_cfg[s], k, 3, 0.0);
    /* the LayerNorm kinds on fp32 inputs whose mean is 64 times their
     * spread: the variance must not cancel away (E[x^2] - E[x]^2 summed in
     * fp32 loses it to ~1e-3; 64 keeps the mean's own fp32 rounding, which
     * the output inherits, below the tolerance) */
    for (int k = 1; k <= 2; k++)
        for (size_t s = 0; s < sizeof head_norm_cfg / sizeof *head_norm_cfg; s++)
            head_norm_forward_cases(head_norm_cfg[s], k, 1, 64.0);
    rng = saved;
}

/* g: n heads width d; t 0-2: every value in storage[t]; 3: the
 * transformer's, an fp32 gradient beside bf16 saved values and weights; 4:
 * the same with LoRA (frozen norms: no dw) */
static void head_norm_backward_case(const int *g, int t, int kind)
{
    int64_t ld = (int64_t)g[2] * g[3];
    etype ty = t < 3 ? storage[t] : E_BF16, tdx = t < 3 ? ty : E_F32;
    size_t nw = (size_t)g[3] * (hn_per_head(kind) ? g[1] : 1);
    pcase c = new_case(GPU_OP_HEAD_NORM_BACKWARD, "n %d heads %d of %d d %d %s dx %s%s%s", g[0], g[1], g[2], g[3],
                       ename(ty), ename(tdx), t == 4 ? " no dw" : "", hn_name(kind));
    c.a.i[0] = g[0], c.a.i[1] = g[1], c.a.i[2] = g[3], c.a.i[3] = ld;
    c.a.i[4] = hn_per_head(kind) ? g[3] : 0, c.a.i[5] = hn_centered(kind);
    int dx = OUT_T(&c, 0, tdx, (size_t)g[0] * ld);
    /* dx is written, not added to: with d 1 it is the cancellation of two
     * terms of order 1 (x / |x| does not move), measured against them */
    c.buf[dx].floor = 1.0;
    if (t < 4) OUT_T(&c, 1, t < 3 ? ty : E_F32, nw);
    IN_T(&c, 2, ty, (size_t)g[0] * g[1] * g[3]);
    IN_T(&c, 3, ty, nw);
    add_buf(&c, 'p', 0, E_F32, (size_t)g[0] * g[1], FILL_NONE, 0, 0, 0);
    c.prep = head_norm_prep;
    emit(&c);
}

static void parity_head_norm_backward(void)
{
    for (int k = 0; k < HN_KINDS; k++)
        for (size_t s = 0; s < sizeof head_norm_cfg / sizeof *head_norm_cfg; s++)
            for (int t = 0; t < (k < 2 ? 4 : 1); t++) head_norm_backward_case(head_norm_cfg[s], t, k);
    uint64_t saved = rng;
    rng = NORM_CHUNK_SEED;
    for (int k = 0; k < 2; k++) {
        for (size_t s = 0; s < sizeof head_norm_cfg / sizeof *head_norm_cfg; s++)
            head_norm_backward_case(head_norm_cfg[s], 4, k);
        for (size_t s = 0; s < sizeof head_norm_chunk_cfg / sizeof *head_norm_chunk_cfg; s++)
            for (int t = 0; t < 5; t++) head_norm_backward_case(head_norm_chunk_cfg[s], t, k);
    }
    rng = saved;
}

/* out and lse from qkv, as the forward saves them */
static void attn_prep(const pcase *c, hostv *h)
{
    attention_forward_d(&c->a.d.attn, h->P[1], h->T[2], h->T[3], h->P[0]);
}

/* The tensor cores' accumulation of 16-bit products into fp32 (the
 * published model, measured on V100 to B200: Fasi, Higham, Mikaitis,
 * Pranesh 2021; Khattak, Mikaitis 2025; gpu/cuda/shim emulates it under
 * ZO_SHIM_TC_ACCUM): each k-step of 16 products adds them to the
 * accumulator c in steps of TC_BLOCK, the products exact, every addend
 * aligned to the step's largest and truncated TC_GUARD bits below its fp32
 * unit, the sum truncated to fp32's 24 bits. A step's error is under one
 * unit of its result (2^-23 of it) plus, for each of its TC_BLOCK + 1
 * addends, 2^-TC_GUARD units of the largest: at most (1 + (TC_BLOCK + 1)
 * 2^-TC_GUARD) 2^-23 times the sum of |addends|, itself at most the sum
 * of |terms| of the whole element (the 16-bit parts add 2^-7 of it). Round
 * toward zero does not cancel from step to step: the errors of an
 * element's k-steps add up, so its bound is this constant times its
 * k-steps (attention_steps) times its sum of |terms|. */
#define TC_BLOCK 16
#define TC_GUARD 2
static double tc_cond_k(void)
{
    return 16.0 / TC_BLOCK * (1.0 + (TC_BLOCK + 1) * ldexp(1.0, -TC_GUARD)) * ldexp(1.0, -23) * (1.0 + ldexp(1.0, -7));
}

/* The two 16-bit parts (hi + lo) a kernel carries P, dS and an fp32 dO
 * in: each value to 2^-2p of itself (p: the type's significant bits, 8
 * in bf16, 11 in fp16), and dV's product drops Pl dOl (the same again),
 * so each term is off by at most 3 2^-2p of itself: 3 2^-2p times the sum
 * of |terms|, once. (fp16's lo parts of small values are subnormal: their
 * absolute error, below 2^-25, is the rms term's.) */
static double tc_cond_parts(etype ty) { return 3.0 * ldexp(1.0, ty == E_BF16 ? -16 : -22); }

/* grads16 (gpu_attn_desc): P, dS and an fp32 dO each rounded once, to a
 * unit u of the type (2^-8 bf16, 2^-11 fp16) of itself. dV's terms P dO
 * carry two roundings, dQ's and dK's terms dS K, dS Q one, plus dS's share
 * of dP's error, which the reference adds to their cond
 * (ref_attention_backward's do16): each term within 2u (1 + 2u) of its
 * cond, once. */
static double tc_cond_16(etype ty)
{
    const double u = ldexp(1.0, ty == E_BF16 ? -8 : -11);
    return 2.0 * u * (1.0 + 2.0 * u);
}

/* Set: attention_case_al's cases ask for grads16 (grads16_grid) */
static int case_grads16;
/* Set: attention_case_al's cases have attention sinks (sinks_grid) */
static int case_sinks;

/* gty: the type of dout and dqkv in the backward (the transformer passes
 * fp32 gradients beside 16-bit qkv and out). */
/* The cases' names for a desc's scale, cap and ALiBi factor (empty when none) */
static void attn_extras(char *sc, size_t n, float scale, float cap, float alibi, int abf)
{
    int k = 0;
    sc[0] = '\0';
    if (scale > 0.0f || cap > 0.0f) k = snprintf(sc, n, " scale %g softcap %g", scale, cap);
    if (alibi > 0.0f) snprintf(sc + k, n - (size_t)k, " alibi %g%s", alibi, abf ? " bf16" : "");
}

static void attention_case_al(gpu_op_id op, int b, int t, int hq, int hkv, int d, int window, float scale,
                              float cap, float alibi, int abf, etype ty, etype gty)
{
    char sc[64];
    attn_extras(sc, sizeof sc, scale, cap, alibi, abf);
    pcase c = new_case(op, "b %d t %d hq %d hkv %d d %d window %d%s %s%s%s%s%s", b, t, hq, hkv, d, window, sc,
                       ename(ty), gty != ty ? " grads " : "", gty != ty ? ename(gty) : "",
                       case_grads16 ? " grads16" : "", case_sinks ? " sinks" : "");
    c.a.d.attn = (gpu_attn_desc){b, t, hq, hkv, d, window, scale, cap, alibi, abf, case_grads16, NULL, NULL};
    size_t nq = (size_t)b * t * (hq + 2 * hkv) * d, no = (size_t)b * t * hq * d, nl = (size_t)b * hq * t;
    if (op == GPU_OP_ATTENTION_FORWARD) {
        OUT_T(&c, 0, ty, no);
        int q = IN_T(&c, 1, ty, nq);
        c.buf[q].lo = -2.0, c.buf[q].hi = 2.0; /* peaked softmax rows as well as flat ones */
        OUT_P(&c, 0, E_F32, nl);
        if (case_sinks) { /* logits about the scores' size: each takes a share of its rows */
            int k = IN_P(&c, 1, E_F32, (size_t)hq);
            c.buf[k].lo = -1.0, c.buf[k].hi = 3.0;
        }
    } else {
        int dq = OUT_T(&c, 0, gty, nq);
        /* fp32 gradients of 16-bit inputs: the GEMM path carries P, dS and
         * dO as two 16-bit parts each, about 16 significant bits with bf16
         * (against fp32's 2e-5 it missed on 146 of 307200 elements, by up
         * to 1.55e-5): 1e-4, as test_gpu_parity holds fp32 attention
         * gradients to */
        if (gty == E_F32 && ty != E_F32) {
            c.buf[dq].rtol = 1e-4;
            c.buf[dq].cond_k = tc_cond_k();
            c.buf[dq].cond_c = tc_cond_parts(ty);
        }
        /* grads16: the roundings' own bound, whatever the gradients' type
         * (16-bit ones keep their type's tolerance beside it) */
        if (case_grads16 && ty != E_F32) {
            c.buf[dq].cond_k = tc_cond_k();
            c.buf[dq].cond_c = tc_cond_16(ty);
        }
        IN_T(&c, 1, gty, no);
        int q = IN_T(&c, 2, ty, nq);
        c.buf[q].lo = -2.0, c.buf[q].hi = 2.0;
        add_buf(&c, 't', 3, ty, no, FILL_NONE, 0, 0, 0);
        add_buf(&c, 'p', 0, E_F32, nl, FILL_NONE, 0, 0, 0);
        if (case_sinks) {
            int k = IN_P(&c, 1, E_F32, (size_t)hq);
            c.buf[k].lo = -1.0, c.buf[k].hi = 3.0;
            OUT_P(&c, 2, E_F32, (size_t)hq);
        }
        c.prep = attn_prep;
    }
    emit(&c);
}

static void attention_case_sc(gpu_op_id op, int b, int t, int hq, int hkv, int d, int window, float scale,
                              float cap, etype ty, etype gty)
{
    attention_case_al(op, b, t, hq, hkv, d, window, scale, cap, 0.0f, 0, ty, gty);
}

static void attention_case_g(gpu_op_id op, int b, int t, int hq, int hkv, int d, int window, etype ty, etype gty)
{
    attention_case_sc(op, b, t, hq, hkv, d, window, 0.0f, 0.0f, ty, gty);
}

static void attention_case(gpu_op_id op, int b, int t, int hq, int hkv, int d, int window, etype ty)
{
    attention_case_g(op, b, t, hq, hkv, d, window, ty, ty);
}

#define SOFTCAP_SEED 0xbb67ae8584caa73bull

/* Gemma-2's attention: scores soft-capped (caps of 1 to 3 against scores of
 * about 1.3 standard deviations here, so tanh bends them) and scaled by a
 * given factor (27b's query_pre_attn_scalar 144 on heads of 128), at head
 * sizes 64, 128 and 256, GQA, sliding windows, across the CPU's 48-row
 * blocks, the CUDA tiles and the GEMM path's 256-row blocks (t 255, 257,
 * 300), fp32 gradients of 16-bit inputs too. Drawn from their own stream,
 * given back after, so the cases that follow draw what they drew before. */
static void softcap_grid(gpu_op_id op)
{
    uint64_t saved = rng;
    rng = SOFTCAP_SEED;
    const float s144 = 1.0f / 12.0f;
    attention_case_sc(op, 1, 97, 2, 1, 64, 0, 0.0f, 2.0f, E_F32, E_F32);
    attention_case_sc(op, 1, 130, 4, 2, 128, 17, s144, 1.0f, E_F32, E_F32);
    attention_case_sc(op, 1, 97, 2, 1, 256, 40, 0.0f, 2.0f, E_F32, E_F32);
    attention_case_sc(op, 1, 255, 4, 2, 64, 0, 0.0f, 2.0f, E_BF16, E_BF16);
    /* (the shim's fiber kernels stop at ZO_OPS_SHIM_MAX_T, 200 tokens: a
     * 16-bit cap without a window, and with a scale of its own and fp32
     * gradients, short enough for them) */
    attention_case_sc(op, 1, 130, 4, 2, 64, 0, 0.0f, 2.0f, E_BF16, E_BF16);
    if (op == GPU_OP_ATTENTION_BACKWARD) attention_case_sc(op, 1, 130, 4, 2, 128, 0, s144, 1.0f, E_BF16, E_F32);
    attention_case_sc(op, 1, 257, 4, 2, 128, 100, s144, 1.5f, E_F16, E_F16);
    /* fp16: in bf16 the GEMM path's P, rounded to 8 bits before P V as the
     * forward's contract allows, left one output of a 4-key row (near-flat
     * capped weights whose terms cancel to -0.013) 0.004 off */
    attention_case_sc(op, 1, 300, 2, 1, 256, 0, 0.0f, 3.0f, E_F16, E_F16);
    attention_case_sc(op, 2, 300, 4, 2, 256, 64, 0.0f, 2.0f, E_BF16, E_BF16);
    if (op == GPU_OP_ATTENTION_BACKWARD) {
        attention_case_sc(op, 1, 300, 4, 2, 128, 0, s144, 1.0f, E_BF16, E_F32);
        attention_case_sc(op, 1, 257, 2, 1, 256, 100, 0.0f, 2.0f, E_F16, E_F32);
    }
    rng = saved;
}

#define ALIBI_SEED 0x3c6ef372fe94f82bull

/* BLOOM's ALiBi (alibi 1; Falcon-RW's form scales it by 1/sqrt(d)): 12 and
 * 14 heads (14 is no power of two: its last 6 heads take the odd powers of
 * 16 heads' base) at head sizes 64, 80 and 128 across the CPU's 48-row
 * blocks and the CUDA tiles (t 97 to 130), with a window, GQA and a soft
 * cap beside it once each; past the GEMM path's 256-row blocks (t 257,
 * 300) with 6 heads (no power of two either, kept few: those cases cost
 * seconds a head in the shim), 16-bit inputs and fp32 gradients (those
 * the tensor-core kernels run too, cuda-shim-tc). From their own stream,
 * given back after. */
static void alibi_grid(gpu_op_id op)
{
    uint64_t saved = rng;
    rng = ALIBI_SEED;
    /* fiber_repeat (ZO_OPS_SHIM_LEAN), the fiber kernels' seconds go by
     * heads: 12 heads in BLOOM's form run in t 97 with a soft cap (below),
     * ALiBi without a cap in t 100; 14 heads' slopes
     * (no power of two) in t 100 (GQA, a window), ALiBi at head size 80 in
     * t 97 hq 12 hkv 4 below, t 130's partial third block in
     * attention_grid's t 130 cases */
    fiber_repeat = 1;
    attention_case_al(op, 1, 97, 12, 12, 64, 0, 0.0f, 0.0f, 1.0f, 0, E_F32, E_F32);
    attention_case_al(op, 1, 130, 14, 14, 80, 0, 0.0f, 0.0f, 1.0f, 0, E_F32, E_F32);
    fiber_repeat = 0;
    attention_case_al(op, 1, 100, 14, 7, 128, 40, 0.0f, 0.0f, 0.125f, 0, E_F32, E_F32);
    attention_case_al(op, 1, 97, 12, 12, 64, 0, 0.0f, 2.0f, 1.0f, 0, E_F32, E_F32);
    attention_case_al(op, 1, 257, 6, 3, 64, 0, 0.0f, 0.0f, 1.0f, 0, E_BF16, op == GPU_OP_ATTENTION_BACKWARD ? E_F32 : E_BF16);
    /* (16-bit ALiBi, the tensor-core kernels' own case, within the shim's
     * ZO_OPS_SHIM_MAX_T) */
    attention_case_al(op, 1, 130, 6, 3, 64, 0, 0.0f, 0.0f, 1.0f, 0, E_BF16, op == GPU_OP_ATTENTION_BACKWARD ? E_F32 : E_BF16);
    if (op == GPU_OP_ATTENTION_FORWARD) attention_case_al(op, 1, 300, 6, 6, 128, 64, 0.0f, 0.0f, 1.0f, 0, E_F16, E_F16);
    /* Falcon's form (Falcon-RW: alibi 1/sqrt(d), bf16(bf16(slope) j)): 12
     * and 10 heads, whose heads past the first 8 have slopes that are no
     * power of two, so both roundings show (with powers of two and j < 256
     * the rounded bias is the exact one); the GEMM path at t 257. The
     * first is a fiber_repeat: the form past 8 heads runs in the second
     * (12 heads, GQA), at head size 64 and t 130 in the cases above */
    fiber_repeat = 1;
    attention_case_al(op, 1, 130, 12, 12, 64, 0, 0.0f, 0.0f, 0.125f, 1, E_F32, E_F32);
    fiber_repeat = 0;
    attention_case_al(op, 1, 97, 12, 4, 80, 0, 0.0f, 0.0f, 0.1118034f, 1, E_F32, E_F32);
    attention_case_al(op, 1, 257, 10, 10, 64, 0, 0.0f, 0.0f, 0.125f, 1, E_BF16,
                      op == GPU_OP_ATTENTION_BACKWARD ? E_F32 : E_BF16);
    attention_case_al(op, 1, 70, 10, 5, 64, 0, 0.0f, 0.0f, 0.125f, 1, E_BF16,
                      op == GPU_OP_ATTENTION_BACKWARD ? E_F32 : E_BF16);
    rng = saved;
}

#define TC_SEED 0x510e527fade682d1ull

/* 16-bit sequences short of, at and just past the tensor-core kernels'
 * 64-row tiles and 16-row warp slices (t 1, 15, 64, 65), head size 96,
 * fp32 gradients at a head size of 64, and windows that mask nothing; then
 * windows of a tile and a tile and one (64, 65 at t 200: key tiles the
 * kernels skip, rows that see no key of a tile they load, partial tiles at
 * both ends of a row's keys) at head sizes 64 and 128 with GQA, one of
 * them soft-capped with fp32 gradients. (The grids above add more of the
 * kind: t 300 window 100, t 97 window 40, soft caps with and without a
 * window at t 255 to 300.) Last, head size 256 across the mma.sync
 * kernels' 32-row tiles there (two warps a 16-row slice, each half of the
 * columns): t short of and past one tile, at and past two, MQA and GQA,
 * windows of a tile and a tile and one, a soft cap, fp32 gradients (the
 * grids add t 70, 257, 260 and 300). From their own stream, given back
 * after, so the cases that follow draw what they drew before. */
static void tc_grid(gpu_op_id op)
{
    uint64_t saved = rng;
    rng = TC_SEED;
    attention_case(op, 1, 1, 2, 1, 64, 0, E_BF16);
    attention_case(op, 1, 15, 4, 2, 80, 0, E_F16);
    attention_case(op, 1, 64, 4, 1, 128, 0, E_BF16);
    attention_case(op, 1, 65, 2, 2, 96, 0, E_F16);
    if (op == GPU_OP_ATTENTION_BACKWARD) attention_case_g(op, 1, 97, 4, 2, 64, 0, E_BF16, E_F32);
    /* windows that mask nothing (as long as the sequence, and longer): the
     * tensor-core kernels take them */
    attention_case(op, 1, 65, 4, 2, 80, 65, E_F16);
    attention_case(op, 1, 70, 2, 1, 128, 4096, E_BF16);
    attention_case(op, 1, 200, 4, 2, 64, 64, E_BF16);
    attention_case(op, 1, 200, 2, 1, 128, 65, E_F16);
    attention_case_sc(op, 1, 200, 4, 2, 64, 65, 0.0f, 2.0f, E_BF16, op == GPU_OP_ATTENTION_BACKWARD ? E_F32 : E_BF16);
    attention_case(op, 1, 31, 2, 1, 256, 0, E_F16);
    attention_case(op, 1, 33, 4, 2, 256, 0, E_BF16);
    attention_case(op, 1, 64, 2, 1, 256, 32, E_F16);
    attention_case_sc(op, 1, 65, 2, 1, 256, 33, 0.0f, 2.0f, E_BF16, op == GPU_OP_ATTENTION_BACKWARD ? E_F32 : E_BF16);
    rng = saved;
}

#define SCALE_SEED 0x9b05688c2b3e6c1full

/* Granite's attention: a score scale of its own (attention_multiplier:
 * 1 / head_dim on granite-3.x, not 1/sqrt(head_dim)) and no soft cap, so
 * that the 16-bit cases take the tensor-core kernels (cuda-shim-tc) as well
 * as the flash and GEMM paths: heads of 64, 80 and 128, GQA, across the
 * CPU's 48-row blocks, the CUDA tiles and the GEMM path's 256-row blocks,
 * fp32 gradients of 16-bit inputs. From their own stream, given back after. */
static void scale_grid(gpu_op_id op)
{
    uint64_t saved = rng;
    rng = SCALE_SEED;
    attention_case_sc(op, 1, 130, 4, 2, 64, 0, 1.0f / 64.0f, 0.0f, E_F32, E_F32);
    attention_case_sc(op, 1, 97, 4, 2, 80, 0, 1.0f / 80.0f, 0.0f, E_BF16, E_BF16);
    attention_case_sc(op, 2, 100, 4, 2, 64, 0, 1.0f / 64.0f, 0.0f, E_F16, E_F16);
    /* (two heads where the shim pays seconds a head) */
    attention_case_sc(op, 1, 257, 2, 1, 128, 0, 1.0f / 128.0f, 0.0f, E_BF16, E_BF16);
    /* tc_repeat (ZO_OPS_SHIM_LEAN): on the tensor-core kernels this is
     * softcap_grid's t 130 backward less its cap: the same instance (bf16,
     * head size 128, dO split from fp32 gradients), sequence (two tiles
     * and 2 rows), GQA group (2) and a scale of its own; the path without a
     * cap is every other case's there */
    tc_repeat = 1;
    if (op == GPU_OP_ATTENTION_BACKWARD) attention_case_sc(op, 1, 130, 2, 1, 128, 0, 1.0f / 128.0f, 0.0f, E_BF16, E_F32);
    tc_repeat = 0;
    rng = saved;
}

/* DeepSeek-V2's latent attention as the runtime runs it: a kv head per
 * query head, heads of qk_nope + qk_rope (192: DeepSeek-V2's 128 + 64, 8
 * dimensions a lane on 24 of the CUDA kernel's 32 lanes; 96 and 48: the
 * test models'), scaled by mscale^2 / sqrt(d) (yarn's factor 40 with
 * mscale_all_dim 1: 1.874), the flash path and past 256 tokens the GEMM
 * path; from their own stream, so the cases after them draw what they drew
 * before. */
#define MLA_SEED 0x510e527fade682d1ull
#define LATENT_SEED 0x1f83d9abfb41bd6bull
static void mla_grid(gpu_op_id op)
{
    uint64_t saved = rng;
    rng = MLA_SEED;
    const float ms = 1.874f;
    attention_case_sc(op, 1, 97, 2, 2, 192, 0, ms / sqrtf(192.0f), 0.0f, E_F32, E_F32);
    attention_case_sc(op, 1, 70, 3, 3, 96, 0, ms / sqrtf(96.0f), 0.0f, E_F32, E_F32);
    attention_case_sc(op, 2, 49, 4, 4, 48, 0, 1.0f / sqrtf(48.0f), 0.0f, E_F32, E_F32);
    attention_case_sc(op, 1, 70, 2, 2, 192, 0, 1.0f / sqrtf(192.0f), 0.0f, E_BF16, E_BF16);
    attention_case_sc(op, 1, 260, 2, 2, 192, 0, ms / sqrtf(192.0f), 0.0f, E_BF16, E_BF16);
    rng = saved;
}

/* Sequences below, at and above the CPU's 48-row query blocks and the CUDA
 * tiles of 32 (t 130: three blocks, the last partial); head sizes 32, 64,
 * 80, 96, 128 and 36 (not a multiple of 16); GQA groups 1, 2, 4, 8. The
 * 16-bit cases also run the GEMM path (the cuda-shim-gemm backends): across
 * its 256-row blocks and its automatic threshold (t 255, 257, 300), at the
 * real head sizes, with GQA and sliding windows, and with fp32 gradients. */
static void attention_grid(gpu_op_id op)
{
    static const int ts[] = {1, 5, 31, 32, 33, 47, 48, 49, 96, 97, 130};
    static const int ds[] = {32, 64, 80, 96, 128, 36};
    static const int groups[][2] = {{2, 2}, {4, 2}, {8, 2}, {8, 1}};
    /* sliding windows: one key, shorter and longer than a block or a tile,
     * and wider than the sequence (no mask) */
    static const int windows[] = {1, 17, 32, 48, 64, 129, 500};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) attention_case(op, 1, ts[i], 2, 1, 64, 0, E_F32);
    for (size_t i = 0; i < sizeof ds / sizeof *ds; i++) attention_case(op, 1, 97, 2, 1, ds[i], 0, E_F32);
    for (size_t i = 0; i < 4; i++) attention_case(op, 1, 49, groups[i][0], groups[i][1], 128, 0, E_F32);
    for (size_t i = 0; i < sizeof windows / sizeof *windows; i++)
        attention_case(op, 1, 130, 4, 2, i % 2 ? 128 : 80, windows[i], E_F32);
    /* fiber_repeat (ZO_OPS_SHIM_LEAN): two sequences run in b 2 t 50, and
     * t 130's three blocks at head size 128 in the windows above (17, 48,
     * 129); fp16 at head size 80 in tc_grid's t 15 and t 65 (a window as
     * long as the sequence: none) with GQA 2, past a 64-row tile; bf16 at
     * 128 with GQA 4 in tc_grid's t 64, past a tile in its t 70 and in t 97
     * window 40 below */
    fiber_repeat = 1;
    attention_case(op, 2, 130, 4, 2, 128, 0, E_F32);
    fiber_repeat = 0;
    attention_case(op, 2, 50, 3, 1, 80, 0, E_F32);
    attention_case(op, 1, 100, 2, 2, 12, 0, E_F32);
    fiber_repeat = 1;
    attention_case(op, 1, 97, 4, 2, 80, 0, E_F16);
    attention_case(op, 1, 97, 4, 1, 128, 0, E_BF16);
    fiber_repeat = 0;
    attention_case(op, 1, 97, 4, 1, 128, 40, E_BF16);
    attention_case(op, 1, 257, 4, 2, 64, 0, E_BF16);
    attention_case(op, 1, 255, 2, 2, 80, 0, E_F16);
    attention_case(op, 2, 300, 4, 1, 128, 0, E_BF16);
    attention_case(op, 1, 300, 6, 3, 80, 100, E_F16);
    attention_case(op, 1, 300, 2, 2, 64, 300, E_BF16);
    /* head_dim 256 (Gemma), multi-query as gemma-2b: the flash path, the
     * mma.sync kernels (on the shim t 70) and, past 256 tokens, the GEMM path */
    attention_case(op, 1, 97, 2, 1, 256, 0, E_F32);
    attention_case(op, 1, 70, 4, 1, 256, 0, E_BF16);
    attention_case(op, 1, 260, 2, 1, 256, 0, E_BF16);
    if (op == GPU_OP_ATTENTION_BACKWARD) {
        attention_case_g(op, 1, 300, 4, 2, 128, 0, E_BF16, E_F32);
        attention_case_g(op, 1, 257, 2, 1, 80, 64, E_F16, E_F32);
    }
    softcap_grid(op);
    alibi_grid(op);
    tc_grid(op);
    scale_grid(op);
    mla_grid(op);
}

/* The backward with grads16 (FlashAttention-2's precision: P, dS and an
 * fp32 dO rounded once; the mma.sync kernels take it, the other paths and
 * the CPU carry more bits and meet the same bound): the real head sizes and
 * 256, across the 64-row tiles (32 at 256) and the CPU's 48-row blocks,
 * GQA 2 and 3, two sequences, a window, soft caps with a scale, bf16 and
 * fp16, fp32 and 16-bit gradients; from their own stream. */
#define GRADS16_SEED 0x9b05688c2b3e6c1full
static void grads16_grid(void)
{
    const gpu_op_id op = GPU_OP_ATTENTION_BACKWARD;
    uint64_t saved = rng;
    rng = GRADS16_SEED;
    case_grads16 = 1;
    /* tc_repeat (ZO_OPS_SHIM_LEAN): the tensor-core kernels ignore grads16,
     * so on them a case here is its path without it. bf16 at head size 64
     * with fp32 gradients runs in tc_grid's t 97 and t 200 (a window, a
     * cap) and alibi_grid's t 130; bf16 at 80 with bf16 gradients in
     * scale_grid's t 97, t 200 with windows 64 and 65 in tc_grid; fp16 at
     * 128 with fp16 gradients in tc_grid's t 200 window 65, a soft cap with
     * a scale of its own at 128 in softcap_grid's t 130, no GQA in tc_grid's
     * t 65. Kept there: bf16 at 96 and fp16 at 128 with fp32 gradients,
     * whose instances only these cases run. (The flash kernel leaves out
     * every case here: head size 256's cases with a window and a cap, fp16
     * and bf16, run in tc_grid, the others' head sizes, types, windows and
     * caps in attention_grid's) */
    tc_repeat = 1;
    attention_case_g(op, 1, 1, 2, 1, 64, 0, E_BF16, E_F32);
    attention_case_g(op, 1, 130, 4, 2, 64, 0, E_BF16, E_F32);
    tc_repeat = 0;
    attention_case_g(op, 2, 70, 6, 2, 96, 0, E_BF16, E_F32);
    attention_case_g(op, 1, 97, 2, 1, 128, 0, E_F16, E_F32);
    tc_repeat = 1;
    attention_case_g(op, 1, 200, 4, 2, 80, 65, E_BF16, E_BF16);
    attention_case_sc(op, 1, 150, 4, 4, 128, 0, 1.0f / 144.0f, 1.5f, E_F16, E_F16);
    tc_repeat = 0;
    attention_case_sc(op, 1, 65, 2, 1, 256, 33, 0.0f, 2.0f, E_BF16, E_F32);
    attention_case_g(op, 1, 97, 2, 1, 256, 0, E_F16, E_F16);
    case_grads16 = 0;
    rng = saved;
}

/* gpt-oss's attention sinks: a logit per head in every row's softmax,
 * at its head size 64 and at 128, GQA 2 and 4, two sequences, across the
 * CPU's 48-row blocks, the CUDA tiles and (t 300) the GEMM path's 256-row
 * blocks, with and without a sliding window (gpt-oss's 128 at t 300, one
 * shorter than a block), fp32, bf16 and fp16, fp32 gradients of 16-bit
 * inputs; from their own stream. */
#define SINKS_SEED 0x1f83d9abfb41bd6bull
static void sinks_grid(gpu_op_id op)
{
    const etype g16 = op == GPU_OP_ATTENTION_BACKWARD ? E_F32 : E_BF16;
    uint64_t saved = rng;
    rng = SINKS_SEED;
    case_sinks = 1;
    attention_case(op, 2, 130, 4, 2, 64, 0, E_F32);
    attention_case(op, 1, 97, 4, 1, 128, 40, E_F32);
    attention_case_g(op, 1, 300, 4, 1, 64, 128, E_BF16, g16);
    /* fiber_repeat and tc_repeat (ZO_OPS_SHIM_LEAN): the sinks' kernels run
     * after any path's, so on those backends t 300 above is this case's
     * sink arithmetic; the flash kernel and the tensor-core kernels at 128
     * without a window run in the grids above */
    fiber_repeat = tc_repeat = 1;
    attention_case(op, 1, 257, 2, 1, 128, 0, E_F16);
    fiber_repeat = tc_repeat = 0;
    case_sinks = 0;
    rng = saved;
}

static void parity_attention_forward(void)
{
    attention_grid(GPU_OP_ATTENTION_FORWARD);
    sinks_grid(GPU_OP_ATTENTION_FORWARD);
}
static void parity_attention_backward(void)
{
    attention_grid(GPU_OP_ATTENTION_BACKWARD);
    grads16_grid();
    sinks_grid(GPU_OP_ATTENTION_BACKWARD);
}

/* The cached attention's positions: param[0] >= 0 puts every sequence
 * there (a prompt at 0), else they stay as drawn. */
static void cached_prep(const pcase *c, hostv *h)
{
    if (c->param[0] >= 0)
        for (int b = 0; b < c->a.d.attn.b; b++) h->P[0][b] = c->param[0];
}

static void cached_case_al(int b, int t, int tc, int hq, int hkv, int d, int window, float scale, float cap,
                           float alibi, int abf, int pos, etype ty, etype cache)
{
    char sc[64];
    attn_extras(sc, sizeof sc, scale, cap, alibi, abf);
    pcase c = new_case(GPU_OP_ATTENTION_CACHED, "b %d t %d tc %d hq %d hkv %d d %d window %d%s pos %s %s cache %s%s",
                       b, t, tc, hq, hkv, d, window, sc, pos < 0 ? "drawn" : pos ? "given" : "0", ename(ty),
                       ename(cache), case_sinks ? " sinks" : "");
    c.a.d.attn = (gpu_attn_desc){b, t, hq, hkv, d, window, scale, cap, alibi, abf, 0, NULL, NULL};
    c.a.i[0] = tc;
    size_t nq = (size_t)b * t * (hq + 2 * hkv) * d, no = (size_t)b * t * hq * d, nc = (size_t)b * tc * hkv * d;
    OUT_T(&c, 0, ty, no);
    int q = IN_T(&c, 1, ty, nq);
    c.buf[q].lo = -2.0, c.buf[q].hi = 2.0; /* peaked softmax rows as well as flat ones */
    OUT_T(&c, 2, cache, nc); /* rows the op does not write keep their random values */
    OUT_T(&c, 3, cache, nc);
    add_buf(&c, 'p', 0, E_I32, (size_t)b, FILL_INT, 0, tc - t + 1, 0);
    if (case_sinks) {
        int k = IN_P(&c, 1, E_F32, (size_t)hq);
        c.buf[k].lo = -1.0, c.buf[k].hi = 3.0;
    }
    c.param[0] = pos;
    c.prep = cached_prep;
    emit(&c);
}

static void cached_case_sc(int b, int t, int tc, int hq, int hkv, int d, int window, float scale, float cap, int pos,
                           etype ty, etype cache)
{
    cached_case_al(b, t, tc, hq, hkv, d, window, scale, cap, 0.0f, 0, pos, ty, cache);
}

static void cached_case(int b, int t, int tc, int hq, int hkv, int d, int window, int pos, etype ty, etype cache)
{
    cached_case_sc(b, t, tc, hq, hkv, d, window, 0.0f, 0.0f, pos, ty, cache);
}

/* One new token (decoding) at positions drawn per sequence across the CUDA
 * kernel's chunks of 32 cache rows; prompts at position 0 and chunks of a
 * prompt after earlier ones; head sizes 32 to 128 and 36; GQA groups;
 * sliding windows shorter and longer than a chunk; 16-bit tokens and
 * caches, and an fp32 token into a bf16 cache. */
static void parity_attention_cached(void)
{
    static const int tcs[] = {1, 31, 32, 33, 64, 97, 200};
    static const int ds[] = {32, 64, 80, 128, 36};
    static const int groups[][2] = {{2, 2}, {4, 2}, {8, 1}};
    static const int windows[] = {1, 17, 32, 40, 500};
    for (size_t i = 0; i < sizeof tcs / sizeof *tcs; i++) cached_case(3, 1, tcs[i], 2, 1, 64, 0, -1, E_F32, E_F32);
    for (size_t i = 0; i < sizeof ds / sizeof *ds; i++) cached_case(2, 1, 130, 4, 2, ds[i], 0, -1, E_F32, E_F32);
    for (size_t i = 0; i < 3; i++) cached_case(2, 1, 70, groups[i][0], groups[i][1], 128, 0, -1, E_F32, E_F32);
    cached_case(1, 49, 64, 4, 2, 64, 0, 0, E_F32, E_F32);   /* a prompt */
    cached_case(2, 33, 33, 2, 1, 128, 0, 0, E_F32, E_F32);  /* a prompt filling the cache */
    cached_case(2, 17, 100, 4, 2, 80, 0, -1, E_F32, E_F32); /* a chunk after earlier tokens */
    for (size_t i = 0; i < sizeof windows / sizeof *windows; i++) {
        cached_case(2, 1, 120, 4, 2, 64, windows[i], -1, E_F32, E_F32);
        cached_case(1, 40, 120, 4, 2, 64, windows[i], 50, E_F32, E_F32);
    }
    cached_case(2, 1, 97, 4, 2, 80, 0, -1, E_F16, E_F16);
    cached_case(2, 3, 97, 4, 1, 128, 0, -1, E_BF16, E_BF16);
    cached_case(2, 1, 97, 4, 1, 128, 40, -1, E_BF16, E_BF16);
    cached_case(1, 5, 40, 2, 1, 64, 0, -1, E_F32, E_BF16);
    cached_case(2, 3, 60, 2, 1, 256, 0, -1, E_BF16, E_BF16); /* head_dim 256 (Gemma) */
    {   /* latent attention's (mla_grid's shapes, from its stream): a token, and a prompt's chunk */
        uint64_t before = rng;
        rng = MLA_SEED;
        cached_case_sc(2, 1, 97, 2, 2, 192, 0, 1.874f / sqrtf(192.0f), 0.0f, -1, E_F32, E_F32);
        cached_case_sc(1, 40, 120, 3, 3, 96, 0, 1.874f / sqrtf(96.0f), 0.0f, 50, E_BF16, E_BF16);
        rng = before;
    }
    /* soft-capped and scaled (Gemma-2), from their own stream as softcap_grid */
    uint64_t saved = rng;
    rng = SOFTCAP_SEED;
    cached_case_sc(2, 1, 97, 4, 2, 256, 40, 0.0f, 2.0f, -1, E_BF16, E_BF16);
    cached_case_sc(1, 40, 120, 4, 2, 128, 17, 1.0f / 12.0f, 1.0f, 50, E_F32, E_F32);
    cached_case_sc(2, 1, 70, 2, 1, 64, 0, 0.0f, 1.5f, -1, E_F32, E_F32);
    /* scaled without a cap (Granite's attention_multiplier) */
    rng = SCALE_SEED;
    cached_case_sc(2, 1, 97, 4, 2, 64, 0, 1.0f / 64.0f, 0.0f, -1, E_BF16, E_BF16);
    cached_case_sc(1, 40, 120, 4, 1, 128, 0, 1.0f / 128.0f, 0.0f, 50, E_F32, E_F32);
    /* ALiBi (BLOOM's): decoding past a chunk, a prompt, a chunk after earlier
     * tokens with a window; 12 and 14 heads */
    rng = ALIBI_SEED;
    cached_case_al(2, 1, 97, 12, 12, 64, 0, 0.0f, 0.0f, 1.0f, 0, -1, E_F32, E_F32);
    cached_case_al(1, 49, 64, 14, 14, 80, 0, 0.0f, 0.0f, 1.0f, 0, 0, E_F32, E_F32);
    cached_case_al(1, 40, 120, 14, 7, 128, 17, 0.0f, 0.0f, 1.0f, 0, 50, E_BF16, E_BF16);
    /* Falcon's form: decoding, and a chunk after earlier tokens */
    cached_case_al(2, 1, 130, 12, 12, 64, 0, 0.0f, 0.0f, 0.125f, 1, -1, E_F32, E_F32);
    cached_case_al(1, 40, 120, 10, 10, 64, 0, 0.0f, 0.0f, 0.125f, 1, 50, E_BF16, E_BF16);
    /* latent attention's latent cache (its own stream): rows of DeepSeek-V2's qk_rope + kv_lora_rank,
     * 64 + 512, one kv head for every query head at the decompressed heads' scale (CUDA: 32 dims a
     * lane), decoding across the 32-row chunks; a prompt's chunk at 288 (16 a lane) */
    rng = LATENT_SEED;
    cached_case_sc(2, 1, 97, 4, 1, 576, 0, 1.0f / sqrtf(192.0f), 0.0f, -1, E_BF16, E_BF16);
    cached_case_sc(1, 9, 40, 3, 1, 288, 0, 0.0f, 0.0f, 20, E_F32, E_F32);
    /* gpt-oss's sinks (their own stream): head 64, GQA 8 to 1 and 4 to 2,
     * caches of 300 (past the CPU's 48-row and 256-row blocks, the CUDA
     * chunks of 32): decoding and a prompt's chunk after earlier tokens,
     * with and without gpt-oss's window of 128, fp32 and bf16 */
    rng = SINKS_SEED;
    case_sinks = 1;
    cached_case(2, 1, 300, 8, 1, 64, 0, -1, E_F32, E_F32);
    cached_case(2, 1, 300, 4, 2, 64, 128, -1, E_BF16, E_BF16);
    cached_case(1, 40, 300, 8, 1, 64, 128, 250, E_F32, E_F32);
    cached_case(1, 60, 300, 4, 2, 64, 0, 0, E_BF16, E_BF16); /* a prompt */
    case_sinks = 0;
    rng = saved;
}

/* Frequencies given by the caller (a rope_scaling's): theta's, each
 * scaled by its own factor in [1/8, 1], so no pair turns at theta's rate. */
static void freq_prep(const pcase *c, hostv *h)
{
    int d = (int)c->a.i[3];
    for (int i = 0; i < d / 2; i++) h->P[0][i] = pow(5e5, -2.0 * i / d) * (0.125 + 0.875 * urand());
}

static void rope_grid(gpu_op_id op)
{
    /* n rows of t positions, the first d of each of the first `heads` of
     * `width` heads ldh wide rotated (ldh 0: d; wider, a partial rotary
     * size: Phi-4-mini's 96 of 128, Phi-3's 0.7 of 80, GPT-J-6B's 64 of
     * 256 and 24 of 64) */
    static const int cfg[][7] = {
        /* n  t  heads width d   pos0 ldh */
        {1, 1, 1, 1, 2, 0, 0},   {6, 3, 2, 4, 8, 0, 0},     {10, 5, 3, 5, 64, 2, 0},   {7, 7, 2, 3, 80, 0, 0},
        {4, 4, 4, 6, 128, 9, 0}, {9, 3, 1, 2, 36, 1, 0},    {130, 130, 1, 1, 128, 0, 0},
        {6, 3, 3, 4, 2, 1, 4},   {5, 5, 4, 5, 96, 3, 128}, {7, 7, 3, 3, 56, 0, 80},
        {4, 4, 2, 3, 64, 5, 256}, {50, 50, 4, 4, 24, 0, 64},
    };
    /* the head-stride rows (the last three) give the random stream back
     * when done, so that the ops after rope draw the inputs they drew
     * before these rows were added */
    const size_t first_ldh = 7;
    uint64_t keep = rng;
    for (size_t s = 0; s < sizeof cfg / sizeof *cfg; s++)
        for (int t = 0; t < 3; t++) {
            if (s == first_ldh && t == 0) keep = rng;
            const int *g = cfg[s], ldh = g[6] ? g[6] : g[4];
            float theta = s % 2 ? 10000.0f : 1e6f;
            pcase c = new_case(op, "n %d t %d heads %d of %d d %d ldh %d pos0 %d theta %g %s", g[0], g[1], g[2],
                               g[3], g[4], ldh, g[5], theta, ename(storage[t]));
            int64_t ldx = (int64_t)g[3] * ldh;
            c.a.i[0] = g[0], c.a.i[1] = g[1], c.a.i[2] = g[2], c.a.i[3] = g[4], c.a.i[4] = ldx, c.a.i[5] = g[5];
            c.a.i[6] = ldh;
            c.a.f[0] = theta;
            c.a.f[1] = 1.0f;
            OUT_T(&c, 0, storage[t], (size_t)g[0] * ldx);
            emit(&c);
            if (t || g[4] < 36) continue;
            /* the same with the frequencies given, and with them a scale
             * (longrope's: Phi-3.5-mini's attention scaling) */
            snprintf(c.label + strlen(c.label), sizeof c.label - strlen(c.label), " inv_freq given");
            add_buf(&c, 'p', 0, E_F64, (size_t)g[4] / 2, FILL_NONE, 0, 0, 0);
            c.prep = freq_prep;
            emit(&c);
            snprintf(c.label + strlen(c.label), sizeof c.label - strlen(c.label), ", scale 1.1902");
            c.a.f[1] = 1.1902381f;
            emit(&c);
        }
    if (op != GPU_OP_ROPE_FORWARD) {
        rng = keep;
        return; /* only the forward takes positions: generation has no backward */
    }
    /* a position a sequence (generation's batch, each sequence at its own
     * place in the cache: gpu_rope_forward_seq), drawn in [0, 4096): n
     * rows in sequences of t at head sizes 64, 80 and 128, whole heads and
     * a partial rotary size with a head stride (96 of 128, 56 of 80, 64 of
     * 256), with theta's frequencies or given ones and a scale */
    static const int seq[][6] = {
        /* n  t  heads width d   ldh */
        {6, 1, 4, 4, 64, 0}, {12, 3, 3, 4, 80, 0}, {8, 2, 5, 6, 128, 0}, {4, 1, 6, 6, 128, 0},
        {6, 2, 3, 4, 96, 128}, {5, 1, 4, 5, 56, 80}, {4, 1, 2, 2, 64, 256},
    };
    for (size_t s = 0; s < sizeof seq / sizeof *seq; s++)
        for (int t = 0; t < 3; t++) {
            const int *g = seq[s], ldh = g[5] ? g[5] : g[4];
            pcase c = new_case(op, "positions a sequence: n %d t %d heads %d of %d d %d ldh %d %s", g[0], g[1],
                               g[2], g[3], g[4], ldh, ename(storage[t]));
            int64_t ldx = (int64_t)g[3] * ldh;
            c.a.i[0] = g[0], c.a.i[1] = g[1], c.a.i[2] = g[2], c.a.i[3] = g[4], c.a.i[4] = ldx, c.a.i[5] = 0;
            c.a.i[6] = ldh, c.a.i[7] = 4096 + g[1] - 1; /* the positions there are */
            c.a.f[0] = 10000.0f;
            c.a.f[1] = 1.0f;
            OUT_T(&c, 0, storage[t], (size_t)g[0] * ldx);
            add_buf(&c, 'p', 1, E_I32, (size_t)(g[0] / g[1]), FILL_INT, 0, 4096, 0);
            emit(&c);
            if (t != 1) continue;
            snprintf(c.label + strlen(c.label), sizeof c.label - strlen(c.label), " inv_freq given, scale 1.1902");
            add_buf(&c, 'p', 0, E_F64, (size_t)g[4] / 2, FILL_NONE, 0, 0, 0);
            c.prep = freq_prep;
            c.a.f[1] = 1.1902381f;
            emit(&c);
        }
    rng = keep;
}

static void parity_rope_forward(void) { rope_grid(GPU_OP_ROPE_FORWARD); }
static void parity_rope_backward(void) { rope_grid(GPU_OP_ROPE_BACKWARD); }

/* Element counts around the CPU's blocks of 2048 and 16-wide lanes and the
 * CUDA blocks of 256. */
static const size_t ew_sizes[] = {1, 15, 16, 17, 255, 256, 257, 2047, 2048, 2049, 5000};

static void ew_case(gpu_op_id op, int n_t, int n_out, double lo, double hi, int64_t i0, size_t n, etype ty)
{
    int act = op == GPU_OP_GELU_FORWARD || op == GPU_OP_GELU_BACKWARD;
    const int clamped = !act && i0 == GPU_GLU_CLAMPED;
    pcase c = new_case(op, "n %zu %s%s", n, ename(ty),
                       !i0 ? "" : clamped ? " clamped" : !act ? " gelu" : i0 == GPU_ACT_RELU ? " relu" : " erf");
    c.a.n = n;
    c.a.i[0] = i0;     /* the gated activations' form, the activation's form */
    c.a.f[0] = 0.375f; /* scale's alpha */
    if (clamped) /* a limit inside the inputs' range, so that both clamps bite; gpt-oss's alpha */
        c.a.f[0] = 2.5f, c.a.f[1] = 1.702f;
    for (int k = 0; k < n_t; k++) {
        int b = k < n_out ? OUT_T(&c, k, ty, n) : IN_T(&c, k, ty, n);
        c.buf[b].lo = lo, c.buf[b].hi = hi;
    }
    emit(&c);
}

/* ew_grid_i's case, for vec_cases: a whole chunk of 8, one and a short one,
 * a block's 2048 and a chunk more */
static struct {
    gpu_op_id op;
    int n_t, n_out;
    double lo, hi;
    int64_t i0;
} ew_vec;

static void ew_vec_grid(void)
{
    static const size_t sizes[] = {8, 9, 2056};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int t = 0; t < 3; t++)
            ew_case(ew_vec.op, ew_vec.n_t, ew_vec.n_out, ew_vec.lo, ew_vec.hi, ew_vec.i0, sizes[s], storage[t]);
}

static void ew_grid_i(gpu_op_id op, int n_t, int n_out, double lo, double hi, int64_t i0)
{
    for (size_t s = 0; s < sizeof ew_sizes / sizeof *ew_sizes; s++)
        for (int t = 0; t < 3; t++) ew_case(op, n_t, n_out, lo, hi, i0, ew_sizes[s], storage[t]);
    ew_vec.op = op, ew_vec.n_t = n_t, ew_vec.n_out = n_out, ew_vec.lo = lo, ew_vec.hi = hi, ew_vec.i0 = i0;
    vec_cases(ew_vec_grid);
}

static void ew_grid(gpu_op_id op, int n_t, int n_out, double lo, double hi) { ew_grid_i(op, n_t, n_out, lo, hi, 0); }

/* The tanh form, then the erf form (GPT-NeoX's MLP) and ReLU (OPT's), which
 * give the random stream back when done (the ops after them draw what they drew) */
static void gelu_grid(gpu_op_id op, int n_t)
{
    ew_grid(op, n_t, 1, -6.0, 4.0);
    uint64_t keep = rng;
    ew_grid_i(op, n_t, 1, -6.0, 4.0, GPU_ACT_GELU_ERF);
    ew_grid_i(op, n_t, 1, -6.0, 4.0, GPU_ACT_RELU);
    rng = keep;
}
static void parity_gelu_forward(void) { gelu_grid(GPU_OP_GELU_FORWARD, 2); }
static void parity_gelu_backward(void) { gelu_grid(GPU_OP_GELU_BACKWARD, 3); }
/* SwiGLU, then GeGLU (gelu 1: Gemma's MLP), then gpt-oss's clamped form
 * (limit 2.5 inside [-6, 4]: gates and ups past it on both sides), which
 * gives the random stream back when done */
static void parity_swiglu_forward(void)
{
    ew_grid(GPU_OP_SWIGLU_FORWARD, 3, 1, -6.0, 4.0);
    ew_grid_i(GPU_OP_SWIGLU_FORWARD, 3, 1, -6.0, 4.0, 1);
    uint64_t keep = rng;
    ew_grid_i(GPU_OP_SWIGLU_FORWARD, 3, 1, -6.0, 4.0, GPU_GLU_CLAMPED);
    rng = keep;
}
static void parity_swiglu_backward(void)
{
    ew_grid(GPU_OP_SWIGLU_BACKWARD, 5, 2, -6.0, 4.0);
    ew_grid_i(GPU_OP_SWIGLU_BACKWARD, 5, 2, -6.0, 4.0, 1);
    uint64_t keep = rng;
    ew_grid_i(GPU_OP_SWIGLU_BACKWARD, 5, 2, -6.0, 4.0, GPU_GLU_CLAMPED);
    rng = keep;
}
static void parity_scale(void) { ew_grid(GPU_OP_SCALE, 1, 1, -1.0, 1.0); }
/* a cap of 0.375 (ew_grid's f[0]) over [-3, 3]: from linear to saturated */
static void parity_softcap(void) { ew_grid(GPU_OP_SOFTCAP, 1, 1, -3.0, 3.0); }

static void parity_add(void)
{
    ew_grid(GPU_OP_ADD, 3, 1, -1.0, 1.0);
    /* y may alias a: the residual add in place */
    pcase c = new_case(GPU_OP_ADD, "n 3000 f32 y = a");
    c.a.n = 3000;
    OUT_T(&c, 0, E_F32, 3000);
    int a = IN_T(&c, 1, E_F32, 3000);
    c.buf[a].alias = 0;
    IN_T(&c, 2, E_F32, 3000);
    emit(&c);
}

static void cast_case(size_t n, etype from, etype to, double range)
{
    pcase c = new_case(GPU_OP_CAST, "n %zu %s -> %s", n, ename(from), ename(to));
    c.a.n = n;
    int o = OUT_T(&c, 0, to, n);
    c.buf[o].rtol = 1e-300; /* the reference is rounded as the cast must round: equal */
    int i = IN_T(&c, 1, from, n);
    c.buf[i].lo = -range, c.buf[i].hi = range;
    emit(&c);
}

static void cast_vec_grid(void)
{
    static const size_t sizes[] = {9, 2056};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int from = 0; from < 3; from++)
            for (int to = 0; to < 3; to++) cast_case(sizes[s], storage[from], storage[to], 70000.0);
}

static void parity_cast(void)
{
    for (size_t s = 0; s < sizeof ew_sizes / sizeof *ew_sizes; s += 2)
        for (int from = 0; from < 3; from++)
            for (int to = 0; to < 3; to++) /* past fp16's range (inf) but at n 1 */
                cast_case(ew_sizes[s], storage[from], storage[to], s == 0 ? 3.0 : 70000.0);
    vec_cases(cast_vec_grid);
}

/* a non-finite value at element param[0] (param[1]: 0 inf, 1 nan), or none */
static void finite_prep(const pcase *c, hostv *h)
{
    if (c->param[0] >= 0) h->T[0][c->param[0]] = c->param[1] ? NAN : -INFINITY;
}

static void parity_check_finite(void)
{
    static const size_t sizes[] = {1, 17, 2048, 2049, 16385, 40000};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int t = 0; t < 3; t++)
            for (int where = -1; where < 2; where++) {
                size_t n = sizes[s];
                int at = where < 0 ? -1 : where == 0 ? 0 : (int)n - 1;
                pcase c = new_case(GPU_OP_CHECK_FINITE, "n %zu %s %s", n, ename(storage[t]),
                                   at < 0 ? "finite" : where ? "nan last" : "inf first");
                c.a.n = n;
                IN_T(&c, 0, storage[t], n);
                int f = add_buf(&c, 'p', 0, E_I32, 1, FILL_INT, 0, 1, 1); /* flag starts 0 */
                (void)f;
                c.param[0] = at, c.param[1] = where > 0;
                c.prep = finite_prep;
                emit(&c);
            }
}

static void parity_sum_squares(void)
{
    /* past 512 x 1024 each CUDA block's chunk has whole steps of four
     * loads a thread, and a rest (600001, 1048583) */
    static const size_t sizes[] = {1, 17, 2048, 2049, 16383, 16384, 16385, 40000, 100000, 600001, 1048583};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int t = 0; t < 3; t++) {
            size_t n = sizes[s];
            /* fiber_repeat (ZO_OPS_SHIM_LEAN): the CUDA kernel launches its
             * fixed 512 blocks of 256 threads whatever n (CUDA_SUMSQ_BLOCKS:
             * the fixed order), 0.3-0.5 s on the shim under the sanitizers
             * for n 1 as for 1048583. Its paths, each type's loads: blocks
             * past n's end and threads past their block's chunk in n 1
             * (one element) and 16385 (chunks of 33, the last 17, then 15
             * empty blocks); the four-load steps in 600001 (chunks of
             * 1172: the first 404 threads take one, the rest only the
             * rest; the last block short) and 1048583 (two for every thread
             * and a rest of one element). The other sizes cross the CPU's
             * boundaries (blocks of 2048, chunks of 16384) and take one
             * of these paths on the kernel. */
            fiber_repeat = n != 1 && n != 16385 && n != 600001 && n != 1048583;
            pcase c = new_case(GPU_OP_SUM_SQUARES, "n %zu %s", n, ename(storage[t]));
            c.a.n = n;
            IN_T(&c, 0, storage[t], n);
            int o = add_buf(&c, 'p', 0, E_F64, 1, FILL_UNIFORM, 0.0, 5.0, 1); /* += (a double: no float rounding) */
            c.buf[o].rtol = 1e-12;
            emit(&c);
        }
    fiber_repeat = 0;
}

static void embedding_grid(gpu_op_id op)
{
    /* vocabularies of one to three bytes of id (the CUDA backward sorts rows
     * by token a byte a pass), few ids over many rows (every id repeats) */
    static const int cfg[][4] = {/* n t c vocab */ {1, 1, 1, 1}, {8, 4, 33, 5}, {40, 20, 64, 7},
                                 {130, 130, 128, 50}, {64, 16, 300, 3}, {300, 50, 16, 700},
                                 {200, 100, 8, 70000}};
    for (size_t s = 0; s < sizeof cfg / sizeof *cfg; s++)
        for (int t = 0; t < 3; t++)
            for (int with_pe = 0; with_pe < 2; with_pe++) {
                int n = cfg[s][0], tt = cfg[s][1], cc = cfg[s][2], v = cfg[s][3];
                pcase c = new_case(op, "n %d t %d c %d vocab %d %s%s", n, tt, cc, v, ename(storage[t]),
                                   with_pe ? " with wpe" : "");
                c.a.i[0] = n, c.a.i[1] = tt, c.a.i[2] = cc, c.a.i[3] = v;
                if (op == GPU_OP_EMBEDDING_FORWARD) {
                    OUT_T(&c, 0, storage[t], (size_t)n * cc);
                    IN_T(&c, 1, storage[t], (size_t)v * cc);
                    if (with_pe) IN_T(&c, 2, storage[t], (size_t)tt * cc);
                } else { /* few ids over many rows: every id repeats */
                    OUT_T(&c, 0, storage[t], (size_t)v * cc);
                    if (with_pe) OUT_T(&c, 1, storage[t], (size_t)tt * cc);
                    IN_T(&c, 2, storage[t], (size_t)n * cc);
                }
                add_buf(&c, 'p', 0, E_I32, n, FILL_INT, 0, v, 0);
                emit(&c);
            }
}

/* ids of three values sharing their low byte (5, 261, 517), interleaved: a
 * sort by token that stopped at the first byte would leave their rows mixed */
static void same_low_byte_prep(const pcase *c, hostv *h)
{
    for (int r = 0; r < (int)c->a.i[0]; r++) h->P[0][r] = 5 + 256 * floor(3 * urand());
}

static void parity_embedding_forward(void)
{
    embedding_grid(GPU_OP_EMBEDDING_FORWARD);
    /* a position a sequence (generation's batch of GPT-2's learned
     * positions: gpu_embedding_forward_seq): n rows in sequences of t, each
     * sequence's first position drawn in [0, P - t] of a table of P rows;
     * the random stream is given back when done, so that the ops after draw
     * the inputs they drew before these cases were added */
    static const int seq[][5] = {/* n t c vocab P */ {6, 1, 33, 5, 40}, {12, 3, 64, 7, 100}, {8, 2, 300, 50, 1024},
                                 {16, 4, 16, 700, 64}, {5, 1, 128, 70000, 4096}};
    uint64_t keep = rng;
    for (size_t s = 0; s < sizeof seq / sizeof *seq; s++)
        for (int t = 0; t < 3; t++) {
            const int *g = seq[s];
            pcase c = new_case(GPU_OP_EMBEDDING_FORWARD,
                               "positions a sequence: n %d t %d c %d vocab %d, %d positions %s", g[0], g[1], g[2],
                               g[3], g[4], ename(storage[t]));
            c.a.i[0] = g[0], c.a.i[1] = g[1], c.a.i[2] = g[2], c.a.i[3] = g[3], c.a.i[4] = g[4];
            OUT_T(&c, 0, storage[t], (size_t)g[0] * g[2]);
            IN_T(&c, 1, storage[t], (size_t)g[3] * g[2]);
            IN_T(&c, 2, storage[t], (size_t)g[4] * g[2]);
            add_buf(&c, 'p', 0, E_I32, (size_t)g[0], FILL_INT, 0, g[3], 0);
            add_buf(&c, 'p', 1, E_I32, (size_t)(g[0] / g[1]), FILL_INT, 0, g[4] - g[1] + 1, 0);
            emit(&c);
        }
    rng = keep;
}

static void parity_embedding_backward(void)
{
    embedding_grid(GPU_OP_EMBEDDING_BACKWARD);
    /* each token's gradient is rounded once: the sum of its rows added to
     * the stored value (a 16-bit output within half a unit of the exact
     * result, where rounding after every row would drift) */
    for (int t = 1; t < 3; t++) {
        pcase c = new_case(GPU_OP_EMBEDDING_BACKWARD, "n 240 t 240 c 40 vocab 600 %s ids sharing a low byte, "
                           "one rounding", ename(storage[t]));
        c.a.i[0] = 240, c.a.i[1] = 240, c.a.i[2] = 40, c.a.i[3] = 600;
        int o = OUT_T(&c, 0, storage[t], 600 * 40);
        c.buf[o].rtol = storage[t] == E_BF16 ? 1.0 / 256 : 1.0 / 2048; /* half a unit, relative */
        c.buf[o].no_rms = 1;
        IN_T(&c, 2, storage[t], 240 * 40);
        add_buf(&c, 'p', 0, E_I32, 240, FILL_NONE, 0, 0, 0);
        c.prep = same_low_byte_prep;
        emit(&c);
    }
}

static const int ce_shapes[][2] = {{1, 1}, {3, 31}, {4, 256}, {5, 257}, {2, 1000}, {3, 5000}};

/* Gemma-2's final_logit_softcapping: a cap of 5 over logits in [-8, 8], so
 * tanh bends the larger ones; drawn from their own stream (SOFTCAP_SEED) */
#define CE_CAP 5.0f

static void ce_forward_cases(int capped)
{
    for (size_t s = 0; s < sizeof ce_shapes / sizeof *ce_shapes; s++)
        for (int t = 0; t < 3; t++) {
            int n = ce_shapes[s][0], v = ce_shapes[s][1];
            pcase c = new_case(GPU_OP_CROSS_ENTROPY_FORWARD, "n %d v %d %s%s", n, v, ename(storage[t]),
                               capped ? " softcap 5" : "");
            c.a.i[0] = n, c.a.i[1] = v, c.a.f[0] = capped ? CE_CAP : 0.0f;
            int x = IN_T(&c, 0, storage[t], (size_t)n * v);
            c.buf[x].lo = -8.0, c.buf[x].hi = 8.0;
            OUT_P(&c, 0, E_F32, n);
            add_buf(&c, 'p', 1, E_I32, n, FILL_INT, -1, v, 0); /* -1: ignored */
            emit(&c);
        }
}

/* cases(0), then cases(1) (the capped ones) from SOFTCAP_SEED's stream,
 * the stream given back after */
static void plain_then_capped(void (*cases)(int capped))
{
    cases(0);
    uint64_t saved = rng;
    rng = SOFTCAP_SEED;
    cases(1);
    rng = saved;
}

static void parity_cross_entropy_forward(void) { plain_then_capped(ce_forward_cases); }

static void ce_backward_cases(int capped)
{
    for (size_t s = 0; s < sizeof ce_shapes / sizeof *ce_shapes; s++)
        for (int t = 0; t < 3; t++)
            for (int inplace = 0; inplace < 2; inplace++) {
                int n = ce_shapes[s][0], v = ce_shapes[s][1];
                pcase c = new_case(GPU_OP_CROSS_ENTROPY_BACKWARD, "n %d v %d %s%s%s", n, v, ename(storage[t]),
                                   inplace ? " in place" : "", capped ? " softcap 5" : "");
                c.a.i[0] = n, c.a.i[1] = v, c.a.f[0] = 1.0f / 7.0f, c.a.f[1] = capped ? CE_CAP : 0.0f;
                OUT_T(&c, 0, storage[t], (size_t)n * v);
                int x = IN_T(&c, 1, storage[t], (size_t)n * v);
                c.buf[x].lo = -8.0, c.buf[x].hi = 8.0;
                if (inplace) c.buf[x].alias = 0, c.buf[0].lo = -8.0, c.buf[0].hi = 8.0;
                add_buf(&c, 'p', 0, E_I32, n, FILL_INT, -1, v, 0);
                emit(&c);
            }
}

static void parity_cross_entropy_backward(void) { plain_then_capped(ce_backward_cases); }

/* A well-formed NF4 image: fp32 offset and scales, random constants and codes. */
static void nf4_prep(const pcase *c, hostv *h)
{
    size_t n = c->a.n, nb = (n + 63) / 64, nb2 = (nb + 255) / 256;
    double *q = h->P[0];
    float f[2];
    for (size_t k = 0; k < 1 + nb2; k++) {
        f[0] = (float)(k == 0 ? 0.02 + 0.01 * urand() : 0.01 + 0.1 * urand());
        uint8_t b[4];
        memcpy(b, f, 4);
        for (int i = 0; i < 4; i++) q[4 * k + i] = b[i];
    }
}

static void parity_nf4_dequantize(void)
{
    static const size_t sizes[] = {1, 2, 63, 64, 65, 127, 2049, 64 * 256, 64 * 256 + 65, 40001};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int t = 0; t < 3; t++) {
            size_t n = sizes[s], nb = (n + 63) / 64, bytes = 4 + 4 * ((nb + 255) / 256) + nb + (n + 1) / 2;
            pcase c = new_case(GPU_OP_NF4_DEQUANTIZE, "n %zu -> %s", n, ename(storage[t]));
            c.a.n = n;
            int o = OUT_T(&c, 0, storage[t], n);
            if (storage[t] == E_F32) c.buf[o].rtol = 1e-6;
            add_buf(&c, 'p', 0, E_U8, bytes, FILL_INT, 0, 256, 0);
            c.prep = nf4_prep;
            emit(&c);
        }
}

static void parity_adam_update(void)
{
    static const size_t sizes[] = {1, 17, 255, 257, 3000};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int t = 0; t < 3; t++)
            for (int o = 0; o < 3; o++) {
                size_t n = sizes[s];
                zo_adam_hparams hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                      .weight_decay = 0.1f, .decay = o == 2 ? ZO_ADAM_DECAY_L2 : ZO_ADAM_DECAY_ADAMW,
                                      .step = 3 + (long)s, .grad_mult = 0.5f};
                pcase c = new_case(GPU_OP_ADAM_UPDATE, "n %zu grad %s out16 %s %s", n, ename(storage[t]),
                                   o == 0 ? "none" : o == 1 ? "f16" : "bf16", o == 2 ? "L2" : "AdamW");
                c.a.n = n;
                c.a.d.adam = zo_adam_consts_make(&hp);
                int b;
                b = OUT_P(&c, 0, E_F32, n), c.buf[b].rtol = 1e-6;
                b = OUT_P(&c, 1, E_F32, n), c.buf[b].rtol = 1e-6;
                b = add_buf(&c, 'p', 2, E_F32, n, FILL_UNIFORM, 0.0, 0.01, 1), c.buf[b].rtol = 1e-6;
                IN_T(&c, 0, storage[t], n);
                if (o) OUT_T(&c, 1, o == 1 ? E_F16 : E_BF16, n);
                emit(&c);
            }
}

/* A state to start from: zeros (the first step, c->param[0] 0) or random
 * codes and absmax (bf16: random moments), as earlier steps leave it. */
static void state_prep(const pcase *c, hostv *h)
{
    state_geom g = state_geom_args(&c->a);
    double *S = h->P[0];
    for (size_t i = 0; i < g.bytes; i++) S[i] = 0.0;
    for (size_t i = 0; i < g.total; i++) {
        if (g.q8) {
            S[g.off_m + i] = c->param[0] ? floor(256 * urand()) : 127; /* 127: the signed map's 0 */
            S[g.off_v + i] = c->param[0] ? floor(256 * urand()) : 0;
            continue;
        }
        float mv[2] = {(float)(c->param[0] ? 0.05 * (2 * urand() - 1) : 0.0), (float)(c->param[0] ? 1e-3 * urand() : 0.0)};
        for (int w = 0; w < 2 && g.es == 4; w++) {
            uint8_t x[4];
            memcpy(x, &mv[w], 4);
            for (int k = 0; k < 4; k++) S[(w ? g.off_v : g.off_m) + 4 * i + k] = x[k];
        }
        for (int w = 0; w < 2 && g.es == 2; w++) {
            uint16_t b = zo_f32_to_bf16(mv[w]);
            S[(w ? g.off_v : g.off_m) + 2 * i] = b & 0xff, S[(w ? g.off_v : g.off_m) + 2 * i + 1] = b >> 8;
        }
    }
    for (size_t b = 0; b < g.nb; b++) {
        float am[2] = {(float)(c->param[0] ? 0.01 + 0.09 * urand() : 0.0), (float)(c->param[0] ? 1e-5 + 1e-3 * urand() : 0.0)};
        uint8_t x[4];
        for (int w = 0; w < 2; w++) {
            memcpy(x, &am[w], 4);
            for (int k = 0; k < 4; k++) S[(w ? g.off_av : g.off_am) + 4 * b + k] = x[k];
        }
    }
}

/* The largest half-gap of the map around r (|r| <= 1): how far from r the
 * value of its nearest code may lie. */
static double half_gap(const double map[256], double r)
{
    for (int k = 0; k < 255; k++)
        if (r <= map[k + 1]) return (map[k + 1] - map[k]) / 2;
    return 0.0;
}

/* The state's comparison: outside the call's values and blocks, every byte
 * as it was; inside, each moment within what coding the exact one allows
 * (bf16: one unit in the last place; q8: half the gap between the map
 * values around it, times the block's absmax, which is the largest exact
 * |moment| of the block within fp32 rounding), plus fp32's error (1e-6
 * of the moments' rms, or of the block's absmax). */
static int state_cmp(const pcase *c, const char *what, const double *got, const double *want, size_t nbytes)
{
    state_geom g = state_geom_args(&c->a);
    static double map_m[256], map_v[256];
    if (map_m[255] != 1.0) dynamic_map(map_m), dynamic_map_unsigned(map_v);
    unsigned char *touched = calloc(nbytes, 1);
    size_t lo = g.first, hi = g.first + g.n;
    memset(touched + g.off_m + g.es * lo, 1, g.es * (hi - lo));
    memset(touched + g.off_v + g.es * lo, 1, g.es * (hi - lo));
    if (g.q8 && hi > lo) {
        size_t b0 = lo / g.block, b1 = (hi + g.block - 1) / g.block;
        memset(touched + g.off_am + 4 * b0, 1, 4 * (b1 - b0));
        memset(touched + g.off_av + 4 * b0, 1, 4 * (b1 - b0));
    }
    /* fp32's error in the new moments: of the order of their largest terms */
    double rms_m = rms(state_want.m, g.n), rms_v = rms(state_want.v, g.n);
    int bad = 0;
    for (size_t i = 0; i < nbytes && !bad; i++)
        if (!touched[i] && got[i] != want[i]) {
            printf("  %s: byte %zu outside the call's values changed (%g, was %g)\n", what, i, got[i], want[i]);
            bad = 1;
        }
    for (size_t i = 0; i < g.n && !bad; i++) {
        for (int w = 0; w < 2 && !bad; w++) {
            const double *ex = w ? state_want.v : state_want.m;
            double e = ex[i], gv = state_value(&g, got, w, g.first + i), allow;
            if (!g.q8) { /* (fp32: its own error alone) */
                allow = (g.es == 4 ? 1e-6 * fabs(e) : ldexp(fabs(e), -8)) + 1e-6 * (w ? rms_v : rms_m);
            } else {
                size_t blk = (g.first + i) / g.block, s0 = blk * g.block - g.first;
                size_t s1 = s0 + g.block < g.n ? s0 + g.block : g.n;
                double amax = 0.0;
                for (size_t k = s0; k < s1; k++) amax = fabs(ex[k]) > amax ? fabs(ex[k]) : amax;
                double ga = bytes_f32(got, (w ? g.off_av : g.off_am) + 4 * blk);
                if (fabs(ga - amax) > 1e-6 * amax) {
                    printf("  %s: %s absmax of block %zu %.9g, want %.9g\n", what, w ? "v" : "m", blk, ga, amax);
                    bad = 1;
                    break;
                }
                allow = amax > 0 ? half_gap(w ? map_v : map_m, e / amax) * amax * 1.001 + 1e-6 * amax : 0.0;
            }
            if (!(fabs(gv - e) <= allow)) {
                printf("  %s: %s[%zu] = %.9g, want %.9g (allowed %.3g)\n", what, w ? "v" : "m", g.first + i, gv, e,
                       allow);
                bad = 1;
            }
        }
    }
    free(touched);
    return bad;
}

/* Sizes around the 8-bit block of 2048 (and odd ones), the weights fp32 (a
 * master, with or without a 16-bit copy) or bf16 (no master), decay on
 * every element, none or two ranges, AdamW and L2, the first step from
 * zeros and later ones from a random state; and calls on a part of a state
 * (first > 0, values after the call's). */
static void state_case(int q8, size_t total, size_t first, size_t n, int pv, int variant)
{
    static const char *pname[4] = {"f32", "f32 out bf16", "f32 out f16", "bf16 (no master)"};
    int later = variant % 2, l2 = variant % 3 == 2, nd = variant % 3 - 1; /* -1 all, 0 none, 1: two ranges */
    zo_adam_hparams hp = {.lr = pv == 3 ? 0.05f : 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                          .weight_decay = 0.1f, .decay = l2 ? ZO_ADAM_DECAY_L2 : ZO_ADAM_DECAY_ADAMW,
                          .step = later ? 7 : 1, .grad_mult = 0.5f};
    pcase c = new_case(GPU_OP_ADAM_STATE_UPDATE, "%s n %zu of %zu from %zu, %s, %s, decay %s, step %ld",
                       q8 ? "q8" : "bf16", n, total, first, pname[pv], l2 ? "L2" : "AdamW",
                       nd < 0 ? "all" : nd == 0 ? "none" : "two ranges", (long)hp.step);
    c.a.n = n;
    gpu_adam_state_args *x = &c.a.d.astate;
    state_geom g = state_geom_of(q8 ? GPU_ADAM_STATE_Q8 : GPU_ADAM_STATE_BF16, 2048, total, first, n);
    *x = (gpu_adam_state_args){.c = zo_adam_consts_make(&hp), .type = q8 ? GPU_ADAM_STATE_Q8 : GPU_ADAM_STATE_BF16,
                               .block = q8 ? 2048 : 0, .total = total, .first = first, .off_m = g.off_m,
                               .off_v = g.off_v, .off_am = g.off_am, .off_av = g.off_av, .n_decay = nd};
    if (nd > 0) {
        x->n_decay = 2;
        x->decay[0][0] = n / 5, x->decay[0][1] = n / 2;
        x->decay[1][0] = n / 2 + 1 < n ? n / 2 + 1 : n, x->decay[1][1] = n;
    }
    int b = OUT_T(&c, 0, pv == 3 ? E_BF16 : E_F32, n);
    c.buf[b].rtol = pv == 3 ? 1.0 / 256 : 1e-6;
    c.buf[b].no_rms = pv == 3;
    IN_T(&c, 1, storage[(variant + pv) % 3], n);
    b = add_buf(&c, 'p', 0, E_U8, g.bytes, FILL_NONE, 0, 0, 1);
    c.buf[b].cmp = state_cmp;
    if (pv == 1 || pv == 2) OUT_T(&c, 2, pv == 1 ? E_BF16 : E_F16, n);
    c.param[0] = later;
    c.prep = state_prep;
    emit(&c);
}

/* The stochastic rounding's bits, from its description (gpu/device.h,
 * common/adam_math.h): splitmix64's finalizer of
 * step * 0x9e3779b97f4a7c15 xor ((block << 40) xor i) * 0xbf58476d1ce4e5b9. */
static uint32_t sr_hash(uint64_t step, uint64_t block, uint64_t i)
{
    uint64_t z = (step * 0x9e3779b97f4a7c15ull) ^ (((block << 40) ^ i) * 0xbf58476d1ce4e5b9ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (uint32_t)z;
}

/* The bf16 neighbours of |p| (lo <= |p| < lo + ulp, in double) and where
 * |p| lies between them, in 65536ths of the gap. */
static double bf16_frac(double p, double *lo, double *ulp)
{
    double a = fabs(p);
    int e;
    frexp(a, &e); /* a = f 2^e, f in [0.5, 1) */
    *ulp = ldexp(1.0, e - 8);
    *lo = floor(a / *ulp) * *ulp;
    return (a - *lo) / *ulp * 65536.0;
}

/* The stored weights of the last round case (Kahan's compensation is
 * checked against them). */
static struct {
    double *w;
    size_t n;
} round_got;

/* The weights without a master, rounded stochastically or (Kahan) to
 * nearest: want holds the exact new weight p. Stochastic: the bf16 above
 * |p| exactly when the dropped part (in 65536ths of the gap) plus the low
 * 16 bits of the hash reach 65536, except where fp32's error in p (2e-6 of
 * |p| and 4e-8, the steps' error, in those units) could tip it. Kahan: the bf16 nearest p, within the
 * same error of a tie. */
static int round_cmp(const pcase *c, const char *what, const double *got, const double *want, size_t n)
{
    const gpu_adam_state_args *x = &c->a.d.astate;
    free(round_got.w);
    round_got.w = malloc((n ? n : 1) * sizeof(double));
    round_got.n = n;
    memcpy(round_got.w, got, n * sizeof(double));
    size_t unsure = 0;
    for (size_t i = 0; i < n; i++) {
        double lo, ulp, frac = bf16_frac(want[i], &lo, &ulp), err = (2e-6 * fabs(want[i]) + 4e-8) / ulp * 65536.0 + 1.0;
        double up, s = want[i] < 0 ? -1.0 : 1.0;
        if (x->round == GPU_ADAM_ROUND_STOCHASTIC) {
            double r = (double)(sr_hash(x->sr_step, x->sr_block, x->sr_first + i) & 0xffffu);
            up = frac + r - 65536.0;
        } else {
            up = frac - 32768.0;
        }
        if (fabs(up) <= err) { /* too near the boundary to tell: either neighbour */
            unsure++;
            if (got[i] == s * lo || got[i] == s * (lo + ulp)) continue;
        } else if (got[i] == s * (up >= 0 ? lo + ulp : lo)) {
            continue;
        }
        printf("  %s: weight %zu = %.9g, want %.9g (exact %.9g, %s)\n", what, i, got[i],
               s * (up >= 0 ? lo + ulp : lo), want[i], x->round == GPU_ADAM_ROUND_KAHAN ? "nearest" : "stochastic");
        return 1;
    }
    if (unsure > n / 100 + 1) {
        printf("  %s: %zu of %zu weights within fp32's error of the rounding boundary\n", what, unsure, n);
        return 1;
    }
    return 0;
}

/* Kahan's compensation: the stored weight plus it is the exact new weight
 * within what rounding it to bf16 loses (2^-8 of |p - w|) and fp32's
 * error (2e-6 of |p|, and 4e-8 for the step's). */
static int comp_cmp(const pcase *c, const char *what, const double *got, const double *want, size_t n)
{
    (void)c;
    if (round_got.n != n) {
        printf("  %s: no weights to check it against\n", what);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        double w = round_got.w[i], p = want[i];
        if (fabs(w + got[i] - p) > ldexp(fabs(p - w), -8) + 2e-6 * fabs(p) + 4e-8) {
            printf("  %s: weight %zu: %.9g + compensation %.9g = %.9g, want %.9g\n", what, i, w, got[i],
                   w + got[i], p);
            return 1;
        }
    }
    return 0;
}

/* The compensation going in: up to half a bf16 gap of the weight, as the
 * previous step left it. */
static void comp_prep(const pcase *c, hostv *h)
{
    state_prep(c, h);
    for (size_t i = 0; i < c->a.n; i++) h->P[1][i] = ldexp((2 * urand() - 1) * fabs(h->T[0][i]), -9);
}

/* bf16 weights without a master rounded stochastically or with Kahan's
 * compensation (the nearest case is state_case's "no master"; with fp32
 * state, here), bf16, q8 and fp32 state, small steps (lr 1e-3: most updates below half a bf16 gap, which
 * round to nearest loses), the hash's element from sr_first. */
static void state_round_case(gpu_adam_state_type type, size_t total, size_t first, size_t n, gpu_adam_round round,
                             int variant)
{
    static const char *const tname[4] = {"", "bf16", "q8", "fp32"};
    int q8 = type == GPU_ADAM_STATE_Q8;
    int later = variant % 2, nd = variant % 3 - 1;
    zo_adam_hparams hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                          .decay = ZO_ADAM_DECAY_ADAMW, .step = later ? 7 : 1, .grad_mult = 0.5f};
    pcase c = new_case(GPU_OP_ADAM_STATE_UPDATE, "%s n %zu of %zu from %zu, bf16 (no master, %s), decay %s, step %ld",
                       tname[type], n, total, first,
                       round == GPU_ADAM_ROUND_KAHAN ? "kahan" : round == GPU_ADAM_ROUND_STOCHASTIC ? "stochastic" : "nearest",
                       nd < 0 ? "all" : nd == 0 ? "none" : "two ranges", (long)hp.step);
    c.a.n = n;
    gpu_adam_state_args *x = &c.a.d.astate;
    state_geom g = state_geom_of(type, 2048, total, first, n);
    *x = (gpu_adam_state_args){.c = zo_adam_consts_make(&hp), .type = type,
                               .block = q8 ? 2048 : 0, .total = total, .first = first, .off_m = g.off_m,
                               .off_v = g.off_v, .off_am = g.off_am, .off_av = g.off_av, .n_decay = nd,
                               .round = round, .sr_step = (uint64_t)hp.step + 40, .sr_block = 3 + variant,
                               .sr_first = 1000 * (uint64_t)variant + first};
    if (nd > 0) {
        x->n_decay = 2;
        x->decay[0][0] = n / 5, x->decay[0][1] = n / 2;
        x->decay[1][0] = n / 2 + 1 < n ? n / 2 + 1 : n, x->decay[1][1] = n;
    }
    int b = OUT_T(&c, 0, E_BF16, n);
    if (round != GPU_ADAM_ROUND_NEAREST) {
        c.buf[b].cmp = round_cmp;
    } else { /* (nearest: within a bf16 rounding of the exact weight) */
        c.buf[b].rtol = 1.0 / 256;
        c.buf[b].no_rms = 1;
    }
    IN_T(&c, 1, storage[variant % 3], n);
    b = add_buf(&c, 'p', 0, E_U8, g.bytes, FILL_NONE, 0, 0, 1);
    c.buf[b].cmp = state_cmp;
    if (round == GPU_ADAM_ROUND_KAHAN) {
        b = add_buf(&c, 'p', 1, E_BF16, n, FILL_NONE, 0, 0, 1);
        c.buf[b].cmp = comp_cmp;
    }
    if (variant % 2) OUT_T(&c, 2, E_BF16, n); /* the weight store's copy: the stored weight */
    c.param[0] = later;
    c.prep = round == GPU_ADAM_ROUND_KAHAN ? comp_prep : state_prep;
    emit(&c);
}

static void parity_adam_state_update(void)
{
    static const size_t sizes[] = {1, 2047, 2048, 2049, 4097, 6143};
    /* a stream of its own: the ops after it draw what they drew before it
     * was added */
    uint64_t saved = rng;
    rng = 0x2545f4914f6cdd1dull;
    int v = 0;
    for (int q8 = 0; q8 < 2; q8++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (int pv = 0; pv < 4; pv++, v++) state_case(q8, sizes[s], 0, sizes[s], pv, v);
    /* a part of a state: q8 whole blocks from the second one, bf16 anywhere */
    state_case(1, 3 * 2048 + 5, 2048, 2 * 2048 + 5, 0, 1);
    state_case(1, 4 * 2048 + 7, 2048, 2048, 3, 4);
    state_case(0, 3001, 17, 2500, 1, 3);
    /* without a master: stochastic rounding and Kahan's compensation */
    static const size_t rsizes[] = {1, 2049, 6143};
    static const gpu_adam_state_type types[] = {GPU_ADAM_STATE_BF16, GPU_ADAM_STATE_Q8, GPU_ADAM_STATE_F32};
    for (int t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof rsizes / sizeof *rsizes; s++)
            for (int r = t == 2 ? GPU_ADAM_ROUND_NEAREST : GPU_ADAM_ROUND_STOCHASTIC; r <= GPU_ADAM_ROUND_KAHAN; r++, v++)
                state_round_case(types[t], rsizes[s], 0, rsizes[s], (gpu_adam_round)r, v);
    state_round_case(GPU_ADAM_STATE_Q8, 3 * 2048 + 5, 2048, 2 * 2048 + 5, GPU_ADAM_ROUND_KAHAN, 5);
    state_round_case(GPU_ADAM_STATE_BF16, 3001, 17, 2500, GPU_ADAM_ROUND_STOCHASTIC, 7);
    state_round_case(GPU_ADAM_STATE_F32, 3001, 17, 2500, GPU_ADAM_ROUND_KAHAN, 8);
    rng = saved;
}

/* The forward's choice order out (p[1], when the case has one) starts as
 * a value no place and not GPU_MOE_NOT_CHOSEN, so an element left
 * unwritten shows; set without drawing, so that the cases after draw the
 * data they drew before the order was added. */
static void order_prefill(const pcase *c, hostv *h)
{
    for (int i = 0; i < c->nbuf; i++)
        if (c->buf[i].slot == 'p' && c->buf[i].index == 1)
            for (size_t j = 0; j < c->buf[i].n; j++) h->P[1][j] = 200.0;
}

/* Router logits kept apart: each row a shuffle of 0.25 j plus noise under
 * 0.05, so no two experts' p are near a tie (the choice, and its order,
 * is the same in every precision); the logits are buffer param[0]'s slot
 * t[param[0]]. param[1]: the first two experts of every row tie exactly
 * (the lower index is chosen first; with k 1 the other is not chosen). */
static void router_prep(const pcase *c, hostv *h)
{
    int n = (int)c->a.i[0], e = (int)c->a.i[1];
    double *lg = h->T[c->param[0]];
    order_prefill(c, h);
    int *perm = malloc((size_t)e * sizeof *perm);
    for (int r = 0; r < n; r++) {
        for (int j = 0; j < e; j++) perm[j] = j;
        for (int j = e - 1; j > 0; j--) {
            int q = (int)(urand() * (j + 1)), t = perm[j];
            perm[j] = perm[q], perm[q] = t;
        }
        for (int j = 0; j < e; j++) lg[(size_t)r * e + j] = 0.25 * perm[j] - 0.1 * e + 0.05 * urand();
        if (c->param[1]) lg[(size_t)r * e + 1] = lg[(size_t)r * e];
    }
    free(perm);
}

/* Rows around the CUDA blocks of 256 threads; experts and choices as
 * Mixtral (8, 2), Qwen1.5-MoE (60, 4), one expert of two, every expert. */
static const int router_rows[] = {1, 7, 300};
static const int router_ek[][2] = {{2, 1}, {8, 2}, {60, 4}, {5, 5}};

/* An order out [n, e] bytes (p[1]), equal to the reference's */
static void order_out(pcase *c, int n, int e)
{
    int o = add_buf(c, 'p', 1, E_U8, (size_t)n * e, FILL_NONE, 0, 0, 1);
    c->buf[o].rtol = 1e-300;
}

/* (the choice order out but in the statistics' group cases, which leave it
 * NULL; tie: router_prep's param[1]) */
static void router_forward_case(int n, int e, int k, int norm, int gr, int tie)
{
    int groups = (n + gr - 1) / gr;
    pcase c = gr < n ? new_case(GPU_OP_MOE_ROUTER_FORWARD, "n %d e %d k %d mode %d groups of %d", n, e, k, norm, gr)
              : tie  ? new_case(GPU_OP_MOE_ROUTER_FORWARD, "n %d e %d k %d mode %d, a tie at the top", n, e, k, norm)
                     : new_case(GPU_OP_MOE_ROUTER_FORWARD, "n %d e %d k %d mode %d", n, e, k, norm);
    c.a.i[0] = n, c.a.i[1] = e, c.a.i[2] = k, c.a.i[3] = norm, c.a.i[4] = gr;
    OUT_T(&c, 0, E_F32, (size_t)n * e);
    IN_T(&c, 1, E_F32, (size_t)n * e);
    OUT_P(&c, 0, E_F32, (size_t)groups * 2 * e);
    if (gr >= n) order_out(&c, n, e);
    c.param[0] = 1;
    c.param[1] = tie;
    c.prep = router_prep;
    emit(&c);
}

/* (the statistics of `layers` layers, each of groups of gr rows) */
static void router_backward_case(int n, int e, int k, int norm, int layers, int gr)
{
    int groups = (n + gr - 1) / gr;
    pcase c = gr < n ? new_case(GPU_OP_MOE_ROUTER_BACKWARD, "n %d e %d k %d mode %d aux layers %d groups of %d", n,
                                e, k, norm, layers, gr)
                     : new_case(GPU_OP_MOE_ROUTER_BACKWARD, "n %d e %d k %d mode %d aux layers %d", n, e, k, norm,
                                layers);
    c.a.i[0] = n, c.a.i[1] = e, c.a.i[2] = k, c.a.i[3] = norm, c.a.i[4] = layers, c.a.i[5] = gr;
    c.a.f[0] = layers ? 0.0125f : 0.0f;
    /* one chosen expert of two, renormalized: the weight is 1 whatever
     * the logits, the main loss's gradient cancels to zero, and its
     * rounding is measured against the incoming gradient's bound (1);
     * with the auxiliary loss (0.0125 a layer) beside it, against 0.01:
     * an absolute 2e-7, where the cancelled part's rounding is a few
     * 1e-9 (a draw where some rows' auxiliary gradient is exactly 0 left
     * their 2e-9 over 2e-5 of the other rows' small rms) */
    int o = OUT_T(&c, 0, E_F32, (size_t)n * e);
    if (k == 1 && norm) c.buf[o].floor = layers ? 0.01 : 1.0;
    IN_T(&c, 1, E_F32, (size_t)n * e);
    IN_T(&c, 2, E_F32, (size_t)n * e);
    if (layers) add_buf(&c, 'p', 0, E_F32, (size_t)layers * groups * 2 * e, FILL_INT, 0, gr + 1, 0);
    c.param[0] = 2;
    c.prep = router_prep;
    emit(&c);
}

/* The statistics in groups of a third of the rows (DeepSeek's per
 * sequence; the last group shorter: 7 rows in 3, 3, 1, 300 in 100s), after
 * the one-group cases; they leave the random stream as they found it, so
 * that every case after them draws the data it drew before they were added. */
static void router_group_cases(int backward)
{
    const uint64_t keep = rng;
    for (size_t s = 1; s < 3; s++)
        for (size_t g = 0; g < 4; g++)
            for (int norm = 0; norm < 2; norm++) {
                int n = router_rows[s], e = router_ek[g][0], k = router_ek[g][1], gr = (n + 2) / 3;
                if (backward) router_backward_case(n, e, k, norm, 1, gr);
                else router_forward_case(n, e, k, norm, gr, 0);
            }
    rng = keep;
}

/* The sparsemixer's logits (GPU_MOE_ROUTE_SPARSEMIXER; c->a.f[1] its eps):
 * with eps 0.125 (a threshold of 0.25) rows of patterns at its edges, their
 * columns shuffled, the rest far below (masked); with any eps, rows of
 * random logits within or around the threshold. The patterns, first
 * column first (each row's others at -30 plus noise):
 *   0  1, 0.75 (ratio 0.25 exactly: kept), 0.75 less one fp32 ulp (masked
 *      from 1, kept from 0.75), 0.5
 *   1  negative maxima -1, -1.25 (ratio 0.25 / 1.25: kept), -1.5 (masked
 *      from -1, kept from -1.25), -3
 *   2  2 and every other below its threshold: both weights 1
 *   3  4, 2 (masked from 4), 1.9 (kept from 2): the second choice is an
 *      expert the first softmax masked
 *   4  a tie at the top, 1.5 and 1.5 (the lower index first), 1.4 kept by
 *      both, 0.3 by neither
 *   5  0, 0 (0 / 0: kept), -0.5 (masked)
 *   6  every logit within the threshold: softmaxes over all the row */
static void mixer_prep(const pcase *c, hostv *h)
{
    int n = (int)c->a.i[0], e = (int)c->a.i[1], crafted = c->a.f[1] == 0.125f && e >= 5;
    double *lg = h->T[c->param[0]];
    order_prefill(c, h);
    static const double pat[6][4] = {{1.0, 0.75, 0.0, 0.5}, {-1.0, -1.25, -1.5, -3.0}, {2.0, -1.0, -2.0, -3.0},
                                     {4.0, 2.0, 1.9, 0.1},  {1.5, 1.5, 1.4, 0.3},       {0.0, 0.0, -0.5, -4.0}};
    int *perm = malloc((size_t)e * sizeof *perm);
    for (int r = 0; r < n; r++) {
        double *row = lg + (size_t)r * e;
        for (int j = 0; j < e; j++) perm[j] = j;
        for (int j = e - 1; j > 0; j--) {
            int q = (int)(urand() * (j + 1)), t = perm[j];
            perm[j] = perm[q], perm[q] = t;
        }
        int kind = r % 7;
        if (!crafted || kind == 6) { /* within the threshold, or around it */
            double spread = crafted ? 0.2 : 4.0 * c->a.f[1] * (1 + r % 3);
            for (int j = 0; j < e; j++) row[j] = 1.0 + spread * urand() - (crafted ? 0.0 : 0.5 * spread * (j % 2));
            continue;
        }
        for (int j = 0; j < e; j++) row[perm[j]] = j < 4 ? pat[kind][j] : -30.0 - urand();
        if (kind == 0) row[perm[2]] = (double)nextafterf(0.75f, 0.0f);
    }
    free(perm);
}

/* A sparsemixer case (forward, or backward with the auxiliary loss over
 * `layers` layers): n rows of e experts, eps */
static void mixer_case(int backward, int n, int e, float eps, int layers)
{
    pcase c = backward ? new_case(GPU_OP_MOE_ROUTER_BACKWARD, "sparsemixer n %d e %d eps %g aux layers %d", n, e,
                                  (double)eps, layers)
                       : new_case(GPU_OP_MOE_ROUTER_FORWARD, "sparsemixer n %d e %d eps %g", n, e, (double)eps);
    c.a.i[0] = n, c.a.i[1] = e, c.a.i[2] = 2, c.a.i[3] = GPU_MOE_ROUTE_SPARSEMIXER;
    c.a.f[1] = eps;
    OUT_T(&c, 0, E_F32, (size_t)n * e);
    IN_T(&c, 1, E_F32, (size_t)n * e);
    if (backward) {
        c.a.i[4] = layers, c.a.i[5] = n, c.a.f[0] = layers ? 0.0125f : 0.0f;
        IN_T(&c, 2, E_F32, (size_t)n * e);
        if (layers) add_buf(&c, 'p', 0, E_F32, (size_t)layers * 2 * e, FILL_INT, 0, n + 1, 0);
        c.param[0] = 2;
    } else {
        c.a.i[4] = n;
        OUT_P(&c, 0, E_F32, 2 * (size_t)e);
        order_out(&c, n, e);
        c.param[0] = 1;
    }
    c.prep = mixer_prep;
    emit(&c);
}

/* The sparsemixer: its patterns (7 rows, 300 across the CUDA blocks of
 * 256), Phi-3.5-MoE's 16 experts and eps 0.01 over random rows, two experts */
static void mixer_cases(int backward)
{
    const uint64_t keep = rng;
    static const struct {
        int n, e;
        float eps;
    } shapes[] = {{7, 5, 0.125f}, {300, 16, 0.125f}, {300, 16, 0.01f}, {33, 2, 0.01f}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int v = 0; v < (backward ? 2 : 1); v++)
            mixer_case(backward, shapes[s].n, shapes[s].e, shapes[s].eps, v ? 3 : 0);
    rng = keep;
}

/* ---- the gate's cases: DeepSeek-V2's group-limited routing, V3's sigmoid scores and noaux_tc ---- */

/* Whether a row's choice (gate_route_d's w) is the same in fp32 as in
 * double: the last kept group's score against the first left out's, and
 * each of the first k keys among the kept groups' experts against the
 * next, exactly equal (a tie the case made: fp32 ties them too) or apart
 * by more than fp32's rounding of the scores and the bias can close (1e-4
 * of their magnitudes, a few hundred times it). */
static int gate_apart(const gate_ref *g, const gate_row *w, int e, int k)
{
    double bmax = 0.0;
    for (int j = 0; g->bias && j < e; j++) bmax = fabs(g->bias[j]) > bmax ? fabs(g->bias[j]) : bmax;
    if (g->groups > 1 && g->topk < g->groups) {
        double x = w->gscore[w->gord[g->topk - 1]], y = w->gscore[w->gord[g->topk]];
        if (x != y && x - y <= 1e-4 * (fabs(x) + fabs(y) + 4.0 * bmax)) return 0;
    }
    for (int i = 0; i < k && i + 1 < w->na; i++) {
        double x = w->key[w->eord[i]], y = w->key[w->eord[i + 1]];
        if (x != y && x - y <= 1e-4 * (fabs(x) + fabs(y) + 2.0 * bmax)) return 0;
    }
    return 1;
}

/* The tie rows, 6 experts in 3 groups of 2, with the bias (where the case
 * has one) of gate_tie_bias, alike for experts 0 and 2 and for 1 and 3:
 *   0  groups 0 and 1 the same keys (the lower kept first), experts 0 and
 *      2 the same key (0 chosen first)
 *   1  experts 0 and 2 the same key at the top, their groups' second
 *      keys apart
 *   2  group 0 the best by its first key, its second key below every
 *      other expert's (negative with the bias): with group 0 kept alone
 *      and k 2 it is chosen, the other groups' keys never
 * Softmax scores: expert 2 and 5's logits tie too (without a bias). */
static const double gate_tie_rows[3][6] = {
    {1.0, 0.2, 1.0, 0.2, -0.5, 0.6}, {0.5, -1.0, 0.5, 0.0, -2.0, -1.5}, {3.0, 0.0, -1.0, 1.0, -1.5, -1.0}};
static const double gate_tie_bias[6] = {0.0, -0.8, 0.0, -0.8, 0.1, -0.1};

/* The gate cases' inputs: the logits t[param[0]], each row 6 (slot + 0.5
 * + 0.4 u) / e - 3 over a shuffle of the experts (u in [-0.5, 0.5): the
 * sigmoid's scores 0.05 to 0.95, the softmax's 6 / e apart in the
 * logits), redrawn until its choice stands apart in fp32 (gate_apart);
 * param[1]: the tie rows instead (gate_tie_rows, row r the pattern r % 3)
 * and their bias, checked to tie exactly where they tie. */
static void gate_prep(const pcase *c, hostv *h)
{
    const int backward = c->op == GPU_OP_MOE_ROUTER_BACKWARD;
    const int n = (int)c->a.i[0], e = (int)c->a.i[1], k = (int)c->a.i[2];
    double *lg = h->T[c->param[0]], *bias = h->P[backward ? 1 : 2];
    if (!backward) order_prefill(c, h);
    if (c->param[1] && bias)
        for (int j = 0; j < e; j++) bias[j] = (float)gate_tie_bias[j];
    const gate_ref g = gate_of(&c->a, h, backward);
    gate_row w = gate_row_new(e);
    int *perm = malloc((size_t)e * sizeof *perm);
    for (int r = 0; r < n; r++) {
        double *row = lg + (size_t)r * e;
        int tries = 0;
        do {
            for (int j = 0; j < e; j++) perm[j] = j;
            for (int j = e - 1; j > 0; j--) {
                int q = (int)(urand() * (j + 1)), t = perm[j];
                perm[j] = perm[q], perm[q] = t;
            }
            for (int j = 0; j < e; j++)
                row[j] = c->param[1] ? gate_tie_rows[r % 3][j]
                                     : (float)(6.0 * (perm[j] + 0.5 + 0.4 * (urand() - 0.5)) / e - 3.0);
            gate_route_d(&g, row, e, &w);
        } while (!gate_apart(&g, &w, e, k) && !c->param[1] && ++tries < 100);
        if (!gate_apart(&g, &w, e, k)) fail_msg("%s: row %d's choice is near a tie", c->label, r);
    }
    free(perm);
    gate_row_free(&w);
}

/* A gate case: n rows of e experts choosing k by `mode` among the best
 * topk of `groups` groups, the weights times scale, with a bias in [-0.6,
 * 0.4) (some keys negative, the choice reordered) or none; forward: the
 * weights, the order and the statistics in groups of gr rows; backward:
 * dlogits of random dweights (the auxiliary loss over `layers` layers of
 * statistics with a softmax, or none). tie: the tie rows (e 6). */
static void gate_case(int backward, const char *name, int n, int e, int k, int mode, int groups, int topk,
                      float scale, int bias, int gr, int layers, int tie)
{
    pcase c = new_case(backward ? GPU_OP_MOE_ROUTER_BACKWARD : GPU_OP_MOE_ROUTER_FORWARD,
                       "%s n %d e %d k %d mode %d groups %d keep %d scale %g%s, stats of %d rows%s%s", name, n, e,
                       k, mode, groups, topk, (double)scale, bias ? ", a bias" : "", gr,
                       layers ? ", aux" : "", tie ? ", ties" : "");
    const int ng = (n + gr - 1) / gr;
    c.a.i[0] = n, c.a.i[1] = e, c.a.i[2] = k, c.a.i[3] = mode;
    c.a.f[2] = scale;
    int o = OUT_T(&c, 0, E_F32, (size_t)n * e);
    IN_T(&c, 1, E_F32, (size_t)n * e);
    if (backward) {
        c.a.i[4] = layers, c.a.i[5] = gr, c.a.i[6] = groups, c.a.i[7] = topk;
        c.a.f[0] = layers ? 0.0125f : 0.0f;
        /* one expert chosen, renormalized: its weight is 1 whatever the
         * logits (router_backward_case) */
        if (k == 1 && (mode == GPU_MOE_ROUTE_NORM || mode == GPU_MOE_ROUTE_SIGMOID_NORM))
            c.buf[o].floor = layers ? 0.01 : 1.0;
        IN_T(&c, 2, E_F32, (size_t)n * e);
        if (layers) add_buf(&c, 'p', 0, E_F32, (size_t)layers * ng * 2 * e, FILL_INT, 0, gr + 1, 0);
    } else {
        c.a.i[4] = gr, c.a.i[5] = groups, c.a.i[6] = topk;
        OUT_P(&c, 0, E_F32, (size_t)ng * 2 * e);
        order_out(&c, n, e);
    }
    if (bias) add_buf(&c, 'p', backward ? 1 : 2, E_F32, (size_t)e, FILL_UNIFORM, -0.6, 0.4, 0);
    c.param[0] = backward ? 2 : 1;
    c.param[1] = tie;
    c.prep = gate_prep;
    emit(&c);
}

/* The gates users run, forward and backward (the rows few: the CUDA
 * kernels' lanes rank their experts by a scan of the row, O(e^2 / 32)
 * a lane, long on the shim): DeepSeek-V3 (sigmoid,
 * 256 experts in 8 groups keeping 4, k 8, renormalized, times 2.5, a
 * bias), DeepSeek-V2 (softmax, 160 in 8 keeping 3, k 6, times 16, not
 * renormalized), Moonlight (64 experts, one group, k 6, times 2.446) and
 * GLM-4.5's (128, one group, k 8, times 2.5), the op's most groups (64
 * of 2 keeping 5: the CUDA kernels' kept groups' bits past 32),
 * Qwen3-Next's 512 experts choosing 10 (renormalized; 40 rows: the CUDA
 * statistics kernel's three warps a block, four chunks of rows, the last
 * short); then 6 experts in 3 groups
 * of 2 keeping 1 to 3, k up to the kept experts, every mode, 1 to 300 rows
 * (across the CUDA kernels' blocks of 8 rows and the statistics' chunks
 * of 32, one to ten of them a group), with and without a bias and a scale;
 * then the tie rows. They leave the random stream as they found it. */
static void gate_cases(int backward)
{
    const uint64_t keep = rng;
    const int S = GPU_MOE_ROUTE_SOFTMAX, N = GPU_MOE_ROUTE_NORM, SG = GPU_MOE_ROUTE_SIGMOID,
              SN = GPU_MOE_ROUTE_SIGMOID_NORM;
    gate_case(backward, "DeepSeek-V3", 17, 256, 8, SN, 8, 4, 2.5f, 1, 6, 0, 0);
    gate_case(backward, "DeepSeek-V3 unnormalized", 5, 256, 8, SG, 8, 4, 0.0f, 1, 5, 0, 0);
    gate_case(backward, "DeepSeek-V2", 17, 160, 6, S, 8, 3, 16.0f, 0, 6, backward, 0);
    gate_case(backward, "Moonlight", 257, 64, 6, SN, 1, 1, 2.446f, 1, 257, 0, 0);
    gate_case(backward, "GLM-4.5", 33, 128, 8, SN, 1, 1, 2.5f, 1, 11, 0, 0);
    gate_case(backward, "the most groups", 5, 128, 8, SN, 64, 5, 1.0f, 1, 5, 0, 0);
    gate_case(backward, "Qwen3-Next", 40, 512, 10, N, 1, 1, 0.0f, 0, 40, backward, 0);
    static const struct {
        int n, k, mode, topk;
        float scale;
        int bias, gr, layers;
    } small[] = {
        {1, 2, SN, 1, 2.5f, 1, 1, 0},    {1, 1, SN, 1, 2.5f, 1, 1, 0},     {255, 3, SG, 2, 0.0f, 1, 255, 0},
        {257, 4, N, 2, 16.0f, 1, 86, 3}, {300, 5, S, 3, 1.5f, 0, 300, 1},  {300, 6, SN, 3, 0.0f, 1, 100, 0},
        {255, 1, SN, 1, 1.0f, 0, 85, 0}, {7, 2, S, 1, 0.0f, 1, 3, 0},      {7, 6, SG, 3, 3.0f, 0, 7, 0},
    };
    for (size_t i = 0; i < sizeof small / sizeof *small; i++)
        gate_case(backward, "small", small[i].n, 6, small[i].k, small[i].mode, 3, small[i].topk, small[i].scale,
                  small[i].bias, small[i].gr, backward ? small[i].layers : 0, 0);
    static const int tie_keep_k[][2] = {{1, 1}, {1, 2}, {2, 1}, {2, 3}, {3, 4}};
    static const int tie_modes[][2] = {{SN, 1}, {SG, 0}, {N, 1}, {S, 0}};
    for (size_t m = 0; m < 4; m++)
        for (size_t t = 0; t < 5; t++)
            gate_case(backward, "exact", 6, 6, tie_keep_k[t][1], tie_modes[m][0], 3, tie_keep_k[t][0],
                      m & 1 ? 0.0f : 2.5f, tie_modes[m][1], 6, 0, 1);
    rng = keep;
}

static void parity_moe_router_forward(void)
{
    for (size_t s = 0; s < 3; s++)
        for (size_t g = 0; g < 4; g++)
            for (int norm = 0; norm < 2; norm++)
                router_forward_case(router_rows[s], router_ek[g][0], router_ek[g][1], norm, router_rows[s], 0);
    router_group_cases(0);
    /* exact ties at the top: the lower index first, in the weights (k 1)
     * and the order (Mixtral's k 2, renormalized: both weights 1/2) */
    const uint64_t keep = rng;
    for (int norm = 0; norm < 2; norm++) router_forward_case(7, 8, 2, norm, 7, 1);
    router_forward_case(7, 2, 1, 1, 7, 1);
    rng = keep;
    mixer_cases(0);
    gate_cases(0);
}

static void parity_moe_router_backward(void)
{
    for (size_t s = 0; s < 3; s++)
        for (size_t g = 0; g < 4; g++)
            for (int v = 0; v < 4; v++) /* norm, and the auxiliary loss over 0 or 3 layers */
                router_backward_case(router_rows[s], router_ek[g][0], router_ek[g][1], v & 1, v & 2 ? 3 : 0,
                                     router_rows[s]);
    router_group_cases(1);
    mixer_cases(1);
    gate_cases(1);
}

static const int scale_shapes[][3] = {{1, 1, 1}, {5, 17, 3}, {33, 64, 1}, {300, 257, 8}};

static void scale_cases(gpu_op_id op)
{
    for (size_t s = 0; s < 4; s++)
        for (int t = 0; t < 3; t++)
            for (int sg = 0; sg < 2; sg++) {
                int n = scale_shapes[s][0], cc = scale_shapes[s][1], lds = scale_shapes[s][2];
                pcase c = new_case(op, "n %d c %d lds %d %s%s", n, cc, lds, ename(storage[t]),
                                   sg ? " sigmoid" : "");
                c.a.i[0] = n, c.a.i[1] = cc, c.a.i[2] = lds, c.a.i[3] = sg;
                size_t ne = (size_t)n * cc, ns = (size_t)n * lds;
                int b;
                if (op == GPU_OP_MOE_SCALE_FORWARD) {
                    OUT_T(&c, 0, storage[t], ne);
                    IN_T(&c, 1, storage[t], ne);
                    b = IN_P(&c, 0, E_F32, ns);
                } else {
                    OUT_T(&c, 0, E_F32, ne);
                    OUT_P(&c, 0, E_F32, ns);
                    IN_T(&c, 1, E_F32, ne);
                    IN_T(&c, 2, storage[t], ne);
                    b = IN_P(&c, 1, E_F32, ns);
                }
                c.buf[b].lo = -3.0, c.buf[b].hi = 3.0;
                emit(&c);
            }
}

static void parity_moe_scale_forward(void) { scale_cases(GPU_OP_MOE_SCALE_FORWARD); }

static void parity_moe_scale_backward(void)
{
    scale_cases(GPU_OP_MOE_SCALE_BACKWARD);
    /* dx may be dy: in place, as the transformer calls it */
    pcase c = new_case(GPU_OP_MOE_SCALE_BACKWARD, "n 40 c 96 lds 4 f32 dx = dy");
    c.a.i[0] = 40, c.a.i[1] = 96, c.a.i[2] = 4, c.a.i[3] = 0;
    OUT_T(&c, 0, E_F32, 40 * 96);
    OUT_P(&c, 0, E_F32, 160);
    int dy = IN_T(&c, 1, E_F32, 40 * 96);
    c.buf[dy].alias = 0;
    IN_T(&c, 2, E_F32, 40 * 96);
    IN_P(&c, 1, E_F32, 160);
    emit(&c);
}

/* Rows of y for a scatter: param[0] distinct rows of param[1], in a
 * shuffled order (one expert's tokens never repeat). */
static void distinct_rows_prep(const pcase *c, hostv *h)
{
    int n = c->param[0], rows = c->param[1];
    int *perm = malloc((size_t)rows * sizeof *perm);
    for (int j = 0; j < rows; j++) perm[j] = j;
    for (int j = rows - 1; j > 0; j--) {
        int q = (int)(urand() * (j + 1)), t = perm[j];
        perm[j] = perm[q], perm[q] = t;
    }
    for (int i = 0; i < n; i++) h->P[0][i] = perm[i];
    free(perm);
}

/* (rows gathered or scattered, columns, rows of the other side) */
static const int pack_shapes[][3] = {{1, 1, 1}, {5, 17, 9}, {64, 33, 300}, {300, 64, 300}};

/* One gpu_head_copy case: x [n, ldx] of type tx into y [n, ldy] of type ty. */
static void head_copy_case(const char *what, int n, int heads, int w, int fill, int64_t ldy, int64_t hsy,
                           int64_t ldx, int64_t hsx, etype ty, etype tx)
{
    pcase q = new_case(GPU_OP_HEAD_COPY, "%s n %d heads %d w %d fill %d ldy %lld hsy %lld ldx %lld hsx %lld %s<-%s",
                       what, n, heads, w, fill, (long long)ldy, (long long)hsy, (long long)ldx, (long long)hsx,
                       ename(ty), ename(tx));
    int64_t v[8] = {n, heads, w, fill, ldy, hsy, ldx, hsx};
    memcpy(q.a.i, v, sizeof v);
    int o = OUT_T(&q, 0, ty, (size_t)n * ldy);
    if (hsy && ty == tx) q.buf[o].rtol = 1e-300; /* a copy: equal */
    IN_T(&q, 1, tx, (size_t)n * ldx);
    emit(&q);
}

/* Latent attention's layouts (DeepSeek-V2's nope 128, rope 64, v 128:
 * heads of 192; V2-Lite's 16 heads; the test models' nope 32..128, rope
 * 16..64, v 32..128), with odd widths around them: q or v into a padded
 * q|k|v (k's rotary part at each head's front, its nope part after it),
 * the rotary key broadcast to every head from the kv_a projection's row,
 * the attention's output narrowed to v, and back: a gradient widened with
 * zeros, the rotary key's gradient summed over the heads. */
static void parity_head_copy(void)
{
    /* (heads, nope, rope, v) */
    static const int mla[][4] = {{1, 32, 16, 32}, {3, 48, 16, 80}, {16, 128, 64, 128}, {5, 33, 17, 31},
                                 {2, 64, 32, 96}};
    static const int rows[] = {1, 7, 67};
    for (size_t k = 0; k < sizeof mla / sizeof *mla; k++)
        for (size_t ri = 0; ri < sizeof rows / sizeof *rows; ri++) {
            int H = mla[k][0], nope = mla[k][1], rope = mla[k][2], v = mla[k][3], n = rows[ri];
            int D = nope + rope > v ? nope + rope : v, kvr = 40 + (int)k; /* the latent's width */
            int64_t qkv = 3LL * H * D, kvw = (int64_t)H * (nope + v);
            etype t = storage[(k + ri) % 3];
            head_copy_case("q into qkv", n, H, nope + rope, D, qkv, D, (int64_t)H * (nope + rope), nope + rope, t, t);
            head_copy_case("k_pe broadcast", n, H, rope, rope, qkv, D, kvr + rope, 0, t, t);
            head_copy_case("k_nope", n, H, nope, D - rope, qkv, D, kvw, nope + v, t, t);
            head_copy_case("v padded", n, H, v, D, qkv, D, kvw, nope + v, t, t);
            head_copy_case("output narrowed", n, H, v, v, (int64_t)H * v, v, (int64_t)H * D, D, t, t);
            head_copy_case("gradient widened", n, H, v, D, (int64_t)H * D, D, (int64_t)H * v, v, E_F32, E_F32);
            head_copy_case("k_pe gradient summed", n, H, rope, rope, kvr + rope, 0, qkv, D, E_F32, E_F32);
            head_copy_case("k_pe gradient summed", n, H, rope, rope, kvr + rope, 0, qkv, D, t, E_F32);
            head_copy_case("latent out of the row", n, 1, kvr, kvr, kvr, kvr, kvr + rope, kvr + rope, t, t);
            head_copy_case("q cast", n, H, nope + rope, nope + rope, (int64_t)H * (nope + rope), nope + rope, qkv, D,
                           E_F32, t);
        }
}

static void parity_moe_gather(void)
{
    for (size_t s = 0; s < 4; s++)
        for (int t = 0; t < 3; t++) {
            int n = pack_shapes[s][0], c = pack_shapes[s][1], rows = pack_shapes[s][2];
            pcase q = new_case(GPU_OP_MOE_GATHER, "n %d c %d of %d rows %s", n, c, rows, ename(storage[t]));
            q.a.i[0] = n, q.a.i[1] = c;
            int o = OUT_T(&q, 0, storage[t], (size_t)n * c);
            q.buf[o].rtol = 1e-300; /* a copy: equal */
            IN_T(&q, 1, storage[t], (size_t)rows * c);
            add_buf(&q, 'p', 0, E_I32, (size_t)n, FILL_INT, 0, rows, 0);
            emit(&q);
        }
}

static void parity_moe_scatter_add(void)
{
    for (size_t s = 0; s < 4; s++)
        for (int t = 0; t < 3; t++)
            for (int pad = 0; pad < 2; pad++) {
                int n = pack_shapes[s][0], c = pack_shapes[s][1], rows = pack_shapes[s][2];
                int ldy = c + 3 * pad;
                pcase q = new_case(GPU_OP_MOE_SCATTER_ADD, "n %d c %d into %d rows ldy %d %s", n, c, rows,
                                   ldy, ename(storage[t]));
                q.a.i[0] = n, q.a.i[1] = c, q.a.i[2] = ldy;
                OUT_T(&q, 0, storage[t], (size_t)rows * ldy);
                IN_T(&q, 1, storage[t], (size_t)n * c);
                add_buf(&q, 'p', 0, E_I32, (size_t)n, FILL_NONE, 0, 0, 0);
                q.param[0] = n, q.param[1] = rows;
                q.prep = distinct_rows_prep;
                emit(&q);
            }
}

/* ---- the test ----------------------------------------------------------------------------- */

typedef void (*gen_fn)(void);
static const gen_fn generators[GPU_OP_COUNT] = {
#define GEN(ID, name, slots, check) [GPU_OP_##ID] = parity_##name,
    GPU_OP_TABLE(GEN)
#undef GEN
};

static void test_every_op(void **state)
{
    (void)state;
    int failed = 0, total = 0;
    for (int id = 0; id < GPU_OP_COUNT; id++) {
        if (filter && !strstr(gpu_op_infos[id].name, filter)) continue;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        generators[id]();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (op_cases[id] == 0) {
            printf("  %s: its generator made no case\n", gpu_op_infos[id].name);
            failed++;
        }
        printf("  %-28s %4d cases %s %7.2f s\n", gpu_op_infos[id].name, op_cases[id],
               op_failed[id] ? "FAILED" : "ok  ", (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
        failed += op_failed[id];
        total += op_cases[id];
    }
    for (int b = 0; b < n_backends; b++) {
        printf("  backend %-10s %5d runs, %d failed", backends[b]->name, backends[b]->cases, backends[b]->failed);
        if (backends[b]->skipped)
            printf(", %d attention cases past t %d left out (ZO_OPS_SHIM_MAX_T)", backends[b]->skipped, shim_max_t);
        if (backends[b]->lean)
            printf(", %d whose paths other cases run left out (ZO_OPS_SHIM_LEAN)", backends[b]->lean);
        if (backends[b]->split)
            printf(", %d left to the sanitizer build's pass (ZO_OPS_SHIM_SPLIT)", backends[b]->split);
        printf("\n");
    }
    printf("  %d ops, %d cases\n", GPU_OP_COUNT, total);
    assert_int_equal(failed, 0);
}

#ifdef ZO_HAVE_CUDA_SHIM
/* ZO_ATTENTION on the shim: gemm gives the forced GEMM path's bits, tc the
 * forced tensor-core kernels', mma the forced mma.sync forward's, flash the
 * flash kernel's, unset and auto the automatic choice's (the shim has no
 * cuBLASLt: the mma.sync kernels where they cover the case, the
 * tensor-core kernels for ALiBi, which mma.sync does not cover), anything
 * else ZO_ERR_INVALID naming the variable; tc and mma on a case their
 * kernels do not cover (qkv off their 16-byte vector loads' alignment) give
 * the automatic choice's bits; a sliding window the mma.sync kernels take,
 * and one no shorter than the sequence is none. */
static void test_attention_path_env(void **state)
{
    (void)state;
    enum { B = 1, T = 40, HQ = 2, HKV = 1, D = 64, RUNS = 8 };
    const size_t nq = (size_t)B * T * (HQ + 2 * HKV) * D, no = (size_t)B * T * HQ * D;
    uint16_t *qkv = malloc((nq + 1) * 2), *out[RUNS];
    float *lse = malloc((size_t)B * HQ * T * sizeof *lse);
    for (size_t i = 0; i < nq + 1; i++) qkv[i] = zo_f32_to_bf16((float)(2.0 * urand() - 1.0));
    gpu_op_args a = {0};
    a.d.attn = (gpu_attn_desc){.b = B, .t = T, .hq = HQ, .hkv = HKV, .d = D};
    a.t[1] = gpu_t(qkv, ZO_DTYPE_BF16);
    a.p[0] = lse;
    /* forced GEMM path; AUTO with ZO_ATTENTION gemm, flash, unset; forced
     * tensor-core kernels; AUTO with tc; then qkv 2 bytes off with tc, unset */
    static const int forced[RUNS] = {CUDA_ATTN_GEMM, CUDA_ATTN_AUTO, CUDA_ATTN_AUTO, CUDA_ATTN_AUTO,
                                     CUDA_ATTN_TC,   CUDA_ATTN_AUTO, CUDA_ATTN_AUTO, CUDA_ATTN_AUTO};
    static const char *env[RUNS] = {NULL, "gemm", "flash", NULL, NULL, "tc", "tc", NULL};
    shim_exec x;
    assert_int_equal(shim_exec_init(&x), ZO_OK);
    for (int k = 0; k < RUNS; k++) {
        out[k] = malloc(no * 2);
        x.exec.attn_path = forced[k];
        a.t[1] = gpu_t(qkv + (k >= 6), ZO_DTYPE_BF16);
        if (env[k]) setenv("ZO_ATTENTION", env[k], 1);
        else unsetenv("ZO_ATTENTION");
        a.t[0] = gpu_t(out[k], ZO_DTYPE_BF16);
        assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_FORWARD](&x.exec, &a), ZO_OK);
    }
    assert_memory_equal(out[0], out[1], no * 2);
    assert_memory_not_equal(out[0], out[2], no * 2);
    assert_memory_equal(out[4], out[5], no * 2);
    assert_memory_not_equal(out[4], out[2], no * 2);
    assert_memory_not_equal(out[4], out[0], no * 2);
    assert_memory_equal(out[6], out[7], no * 2);
    /* a window as long as the sequence masks nothing: the automatic choice
     * takes the mma.sync kernels for it, and their bits */
    a.t[1] = gpu_t(qkv, ZO_DTYPE_BF16);
    a.d.attn.window = T;
    x.exec.attn_path = CUDA_ATTN_AUTO;
    a.t[0] = gpu_t(out[7], ZO_DTYPE_BF16);
    assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_FORWARD](&x.exec, &a), ZO_OK);
    assert_memory_equal(out[3], out[7], no * 2);
    /* a window of 8 at d 64: the automatic choice takes the mma.sync
     * kernels, as mma forced does */
    a.d.attn.window = 8;
    uint16_t *win[2] = {malloc(no * 2), malloc(no * 2)};
    for (int k = 0; k < 2; k++) {
        x.exec.attn_path = k ? CUDA_ATTN_MMA : CUDA_ATTN_AUTO;
        a.t[0] = gpu_t(win[k], ZO_DTYPE_BF16);
        assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_FORWARD](&x.exec, &a), ZO_OK);
    }
    assert_memory_equal(win[0], win[1], no * 2);
    assert_memory_not_equal(win[0], out[3], no * 2);
    free(win[0]);
    free(win[1]);
    x.exec.attn_path = CUDA_ATTN_AUTO;
    a.d.attn.window = 0;
    setenv("ZO_ATTENTION", "tensor", 1);
    assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_FORWARD](&x.exec, &a), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "ZO_ATTENTION=tensor"));
    /* mma: the forced mma.sync forward's bits (which may be the tensor-core
     * kernels' too: both sum in fp32 before rounding to bf16); on qkv off
     * the alignment (which it does not cover) the automatic choice's, as tc
     * gives */
    uint16_t *mma[2] = {malloc(no * 2), malloc(no * 2)};
    x.exec.attn_path = CUDA_ATTN_MMA;
    unsetenv("ZO_ATTENTION");
    a.t[0] = gpu_t(mma[0], ZO_DTYPE_BF16);
    assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_FORWARD](&x.exec, &a), ZO_OK);
    x.exec.attn_path = CUDA_ATTN_AUTO;
    setenv("ZO_ATTENTION", "mma", 1);
    a.t[0] = gpu_t(mma[1], ZO_DTYPE_BF16);
    assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_FORWARD](&x.exec, &a), ZO_OK);
    assert_memory_equal(mma[0], mma[1], no * 2);
    /* unset is auto: at d 64 the mma.sync kernels, where they cover the case */
    assert_memory_equal(mma[0], out[3], no * 2);
    a.t[1] = gpu_t(qkv + 1, ZO_DTYPE_BF16);
    assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_FORWARD](&x.exec, &a), ZO_OK);
    assert_memory_equal(mma[1], out[6], no * 2);
    /* ALiBi, which the mma.sync kernels do not cover: the automatic choice
     * takes the tensor-core kernels (no cuBLASLt here), and so does mma
     * forced, falling back to it */
    unsetenv("ZO_ATTENTION");
    a.t[1] = gpu_t(qkv, ZO_DTYPE_BF16);
    a.d.attn.alibi = 1.0f;
    static const int alibi_path[3] = {CUDA_ATTN_AUTO, CUDA_ATTN_TC, CUDA_ATTN_MMA};
    for (int k = 0; k < 3; k++) {
        x.exec.attn_path = alibi_path[k];
        a.t[0] = gpu_t(k ? mma[k - 1] : out[7], ZO_DTYPE_BF16);
        assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_FORWARD](&x.exec, &a), ZO_OK);
    }
    assert_memory_equal(out[7], mma[0], no * 2);
    assert_memory_equal(out[7], mma[1], no * 2);
    assert_memory_not_equal(out[7], out[3], no * 2);
    /* head dim 256 (Gemma's): auto takes the mma.sync kernels, forced mma's
     * bits, not the flash kernel's (ZO_ATTENTION=flash) */
    const size_t nq2 = nq / D * 256, no2 = no / D * 256;
    uint16_t *q2 = malloc(nq2 * 2), *o2[3] = {malloc(no2 * 2), malloc(no2 * 2), malloc(no2 * 2)};
    for (size_t i = 0; i < nq2; i++) q2[i] = zo_f32_to_bf16((float)(2.0 * urand() - 1.0));
    a.d.attn = (gpu_attn_desc){.b = B, .t = T, .hq = HQ, .hkv = HKV, .d = 256};
    a.t[1] = gpu_t(q2, ZO_DTYPE_BF16);
    for (int k = 0; k < 3; k++) {
        x.exec.attn_path = k == 1 ? CUDA_ATTN_MMA : CUDA_ATTN_AUTO;
        if (k == 2) setenv("ZO_ATTENTION", "flash", 1);
        a.t[0] = gpu_t(o2[k], ZO_DTYPE_BF16);
        assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_FORWARD](&x.exec, &a), ZO_OK);
    }
    unsetenv("ZO_ATTENTION");
    assert_memory_equal(o2[0], o2[1], no2 * 2);
    assert_memory_not_equal(o2[0], o2[2], no2 * 2);
    for (int k = 0; k < 3; k++) free(o2[k]);
    free(q2);
    free(mma[0]);
    free(mma[1]);
    shim_exec_free(&x);
    for (int k = 0; k < RUNS; k++) free(out[k]);
    free(qkv);
    free(lse);
}

/* grads16 on the shim (gpu/device.h; the bound is grads16_grid's): the
 * mma.sync backward with it gives other bits than without (its products
 * take P, dS and dO rounded once), ZO_ATTENTION_GRADS=16bit gives the
 * desc's bits for a call without it, and split leaves a call's own; the
 * GEMM path, which carries the parts either way, gives the same bits with
 * and without; another value is refused naming the variable. fp32 dO, GQA
 * 2, past a 64-row tile. */
static void test_attention_grads16(void **state)
{
    (void)state;
    enum { B = 1, T = 70, HQ = 4, HKV = 2, D = 64, RUNS = 6 };
    const size_t nq = (size_t)B * T * (HQ + 2 * HKV) * D, no = (size_t)B * T * HQ * D;
    uint16_t *qkv = malloc(nq * 2), *out = malloc(no * 2);
    float *lse = malloc((size_t)B * HQ * T * sizeof *lse), *dout = malloc(no * sizeof *dout), *dq[RUNS];
    for (size_t i = 0; i < nq; i++) qkv[i] = zo_f32_to_bf16((float)(2.0 * urand() - 1.0));
    for (size_t i = 0; i < no; i++) dout[i] = (float)(2.0 * urand() - 1.0);
    shim_exec x;
    assert_int_equal(shim_exec_init(&x), ZO_OK);
    gpu_op_args a = {0};
    a.d.attn = (gpu_attn_desc){.b = B, .t = T, .hq = HQ, .hkv = HKV, .d = D};
    a.t[0] = gpu_t(out, ZO_DTYPE_BF16), a.t[1] = gpu_t(qkv, ZO_DTYPE_BF16), a.p[0] = lse;
    x.exec.attn_path = CUDA_ATTN_MMA;
    unsetenv("ZO_ATTENTION");
    unsetenv("ZO_ATTENTION_GRADS");
    assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_FORWARD](&x.exec, &a), ZO_OK);
    /* mma without, with, without under 16bit, with under split; the GEMM
     * path without and with */
    static const int path[RUNS] = {CUDA_ATTN_MMA, CUDA_ATTN_MMA, CUDA_ATTN_MMA,
                                   CUDA_ATTN_MMA, CUDA_ATTN_GEMM, CUDA_ATTN_GEMM};
    static const int g16[RUNS] = {0, 1, 0, 1, 0, 1};
    static const char *env[RUNS] = {NULL, NULL, "16bit", "split", NULL, NULL};
    a.t[1] = gpu_t(dout, ZO_DTYPE_F32), a.t[2] = gpu_t(qkv, ZO_DTYPE_BF16), a.t[3] = gpu_t(out, ZO_DTYPE_BF16);
    for (int k = 0; k < RUNS; k++) {
        dq[k] = malloc(nq * sizeof *dq[k]);
        x.exec.attn_path = path[k];
        a.d.attn.grads16 = g16[k];
        if (env[k]) setenv("ZO_ATTENTION_GRADS", env[k], 1);
        else unsetenv("ZO_ATTENTION_GRADS");
        a.t[0] = gpu_t(dq[k], ZO_DTYPE_F32);
        assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_BACKWARD](&x.exec, &a), ZO_OK);
    }
    assert_memory_not_equal(dq[0], dq[1], nq * sizeof *dq[0]);
    assert_memory_equal(dq[1], dq[2], nq * sizeof *dq[0]);
    assert_memory_equal(dq[1], dq[3], nq * sizeof *dq[0]);
    assert_memory_equal(dq[4], dq[5], nq * sizeof *dq[0]);
    size_t differ = 0;
    for (size_t i = 0; i < nq; i++) differ += dq[0][i] != dq[1][i];
    printf("  mma.sync backward, fp32 dO: %zu of %zu gradients other with grads16\n", differ, nq);
    setenv("ZO_ATTENTION_GRADS", "fp16", 1);
    assert_int_equal(shim_cuda_ops[GPU_OP_ATTENTION_BACKWARD](&x.exec, &a), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "ZO_ATTENTION_GRADS=fp16"));
    unsetenv("ZO_ATTENTION_GRADS");
    shim_exec_free(&x);
    for (int k = 0; k < RUNS; k++) free(dq[k]);
    free(qkv), free(out), free(lse), free(dout);
}

/* ZO_ATTENTION=tune on the shim (gpu/cuda/ops_cuda.h; its stopwatch there
 * is the host's clock): over shapes at head sizes 64 and 128, GQA, t on
 * both sides of 256, bf16 and fp32 gradients, the first call of each shape
 * times every path that covers it (the count of runs made to time each path
 * grows) and keeps one entry, whose choice is the fastest candidate; its
 * results are the forced choice's bit for bit, forward and backward; a
 * second call times nothing and gives the same bits. A sliding window that
 * masks, a soft cap, and fp32 qkv are never timed on the tensor-core or
 * mma.sync kernels (nor fp32 qkv on the GEMM path). Left out where
 * ZO_OPS_FILTER names no attention op. */
typedef struct tune_case {
    int b, t, hq, hkv, d, window;
    float softcap, alibi;
    zo_dtype qkv, grad; /* grad: dout's and dqkv's type */
    int backward;
    int lean_repeat; /* left out under ZO_OPS_SHIM_LEAN: another case runs what it checks */
} tune_case;

/* One attention call of case c on x (its attn_path as set); outputs in o (out or dqkv), lse. */
static void tune_call(shim_exec *x, const tune_case *c, void *qkv, void *dout, void *out, float *lse, void *o)
{
    gpu_op_args a = {0};
    a.d.attn = (gpu_attn_desc){.b = c->b, .t = c->t, .hq = c->hq, .hkv = c->hkv, .d = c->d, .window = c->window,
                               .softcap = c->softcap, .alibi = c->alibi};
    a.p[0] = lse;
    if (c->backward) {
        a.t[0] = gpu_t(o, c->grad), a.t[1] = gpu_t(dout, c->grad), a.t[2] = gpu_t(qkv, c->qkv);
        a.t[3] = gpu_t(out, c->qkv);
    } else {
        a.t[0] = gpu_t(o, c->qkv), a.t[1] = gpu_t(qkv, c->qkv);
    }
    gpu_op_id op = c->backward ? GPU_OP_ATTENTION_BACKWARD : GPU_OP_ATTENTION_FORWARD;
    assert_int_equal(shim_cuda_ops[op](&x->exec, &a), ZO_OK);
}

static void fill_random(void *p, size_t n, zo_dtype t)
{
    for (size_t i = 0; i < n; i++) {
        float v = (float)(2.0 * urand() - 1.0);
        if (t == ZO_DTYPE_F32) ((float *)p)[i] = v;
        else ((uint16_t *)p)[i] = zo_f32_to_bf16(v);
    }
}

static void test_attention_tune(void **state)
{
    (void)state;
    static const tune_case cases[] = {
        /* past a 64-row tile: the grid covers the paths' boundaries, these
         * the choice, its cache and its bits */
        {1, 95, 2, 1, 64, 0, 0.0f, 0.0f, ZO_DTYPE_BF16, ZO_DTYPE_BF16, 0, 0},
        {1, 95, 2, 1, 64, 0, 0.0f, 0.0f, ZO_DTYPE_BF16, ZO_DTYPE_BF16, 1, 0},
        {1, 70, 2, 1, 128, 0, 0.0f, 0.0f, ZO_DTYPE_BF16, ZO_DTYPE_F32, 0, 0},
        {1, 70, 2, 1, 128, 0, 0.0f, 0.0f, ZO_DTYPE_BF16, ZO_DTYPE_F32, 1, 0},
        /* GQA 4, two sequences; under ZO_OPS_SHIM_LEAN left out: the t 70
         * backward above times, chooses, caches and matches the same four
         * paths at this head size and types, the t 40 cases a second
         * sequence, and the grid runs the kernels at GQA 4 */
        {2, 48, 4, 1, 128, 0, 0.0f, 0.0f, ZO_DTYPE_BF16, ZO_DTYPE_F32, 1, 1},
        {2, 40, 2, 1, 64, 8, 0.0f, 0.0f, ZO_DTYPE_BF16, ZO_DTYPE_BF16, 0, 0}, /* a window that masks */
        {2, 40, 2, 1, 64, 0, 30.0f, 0.0f, ZO_DTYPE_BF16, ZO_DTYPE_BF16, 1, 0}, /* a soft cap */
        {2, 40, 2, 1, 64, 0, 0.0f, 1.0f, ZO_DTYPE_BF16, ZO_DTYPE_BF16, 0, 0}, /* ALiBi: tc's, not mma's */
        {2, 40, 2, 1, 32, 0, 0.0f, 0.0f, ZO_DTYPE_BF16, ZO_DTYPE_BF16, 0, 0}, /* head dim 32: neither's */
        {2, 40, 2, 1, 64, 0, 0.0f, 0.0f, ZO_DTYPE_F32, ZO_DTYPE_F32, 0, 0},   /* fp32 qkv */
    };
    const int n_cases = (int)(sizeof cases / sizeof *cases);
    if (filter && !strstr(gpu_op_infos[GPU_OP_ATTENTION_FORWARD].name, filter) &&
        !strstr(gpu_op_infos[GPU_OP_ATTENTION_BACKWARD].name, filter)) {
        printf("  left out: ZO_OPS_FILTER=%s names no attention op\n", filter);
        return;
    }
    shim_exec x, forced;
    assert_int_equal(shim_exec_init(&x), ZO_OK);
    assert_int_equal(shim_exec_init(&forced), ZO_OK);
    x.exec.attn_path = CUDA_ATTN_TUNE;
    x.tune.runs = 1; /* one warm-up and one timed run a candidate: the shim is slow */
    unsetenv("ZO_ATTENTION");
    int n_tuned = 0;
    for (int k = 0; k < n_cases; k++) {
        const tune_case *c = &cases[k];
        if (shim_max_t > 0 && c->t > shim_max_t) { /* the fiber kernels' long cases (ZO_OPS_SHIM_MAX_T) */
            printf("  tune: t %d left out (ZO_OPS_SHIM_MAX_T=%d)\n", c->t, shim_max_t);
            continue;
        }
        if (shim_lean && c->lean_repeat) {
            printf("  tune: b %d t %d hq %d hkv %d d %d left out (ZO_OPS_SHIM_LEAN)\n", c->b, c->t, c->hq, c->hkv, c->d);
            continue;
        }
        n_tuned++;
        const size_t nq = (size_t)c->b * c->t * (c->hq + 2 * c->hkv) * c->d, no = (size_t)c->b * c->t * c->hq * c->d;
        const size_t es = zo_dtype_size(c->qkv), gs = zo_dtype_size(c->grad), nl = (size_t)c->b * c->hq * c->t;
        const size_t n_o = c->backward ? nq * gs : no * es; /* bytes of the call's output */
        void *qkv = malloc(nq * es), *out = malloc(no * es), *dout = malloc(no * gs);
        void *o[3] = {malloc(n_o), malloc(n_o), malloc(n_o)};
        /* lse: the backward's input (the flash kernel's forward); the
         * forward's output, one buffer a call */
        float *lse = malloc(nl * sizeof *lse), *lo[3] = {malloc(nl * 4), malloc(nl * 4), malloc(nl * 4)};
        fill_random(qkv, nq, c->qkv);
        fill_random(dout, no, c->grad);
        if (c->backward) {
            tune_case f = *c;
            f.backward = 0;
            forced.exec.attn_path = CUDA_ATTN_FLASH;
            tune_call(&forced, &f, qkv, NULL, NULL, lse, out);
        }
#define TUNE_LSE(i) (c->backward ? lse : lo[i])
        long before[CUDA_ATTN_PATHS];
        memcpy(before, x.tune.launched, sizeof before);
        /* the first call times; the entry is the fastest candidate */
        tune_call(&x, c, qkv, dout, out, TUNE_LSE(0), o[0]);
        assert_int_equal(x.tune.n, n_tuned);
        gpu_op_args a = {0};
        a.d.attn = (gpu_attn_desc){.b = c->b, .t = c->t, .hq = c->hq, .hkv = c->hkv, .d = c->d,
                                   .window = c->window, .softcap = c->softcap, .alibi = c->alibi};
        if (c->backward) a.t[0] = gpu_t(o[0], c->grad), a.t[1] = gpu_t(dout, c->grad), a.t[2] = gpu_t(qkv, c->qkv);
        else a.t[0] = gpu_t(o[0], c->qkv), a.t[1] = gpu_t(qkv, c->qkv);
        cuda_attn_shape key = cuda_attn_shape_of(&a, c->backward);
        const cuda_attn_tuned *e = cuda_attn_tune_find(&x.tune, &key);
        assert_non_null(e);
        /* the tensor-core kernels: 16-bit qkv at head dims 64/80/96/128, any
         * window, soft cap or ALiBi; mma.sync the same but ALiBi */
        const int tc_case = c->qkv != ZO_DTYPE_F32 && (c->d == 64 || c->d == 128);
        const int want[CUDA_ATTN_PATHS] = {[CUDA_ATTN_FLASH] = 1, [CUDA_ATTN_GEMM] = c->qkv != ZO_DTYPE_F32,
                                           [CUDA_ATTN_TC] = tc_case, [CUDA_ATTN_MMA] = tc_case && c->alibi == 0.0f};
        printf("  tune %s b%d t%d hq%d hkv%d d%d w%d cap %g alibi %g %s:", c->backward ? "backward" : "forward", c->b,
               c->t, c->hq, c->hkv, c->d, c->window, (double)c->softcap, (double)c->alibi, zo_dtype_name(c->qkv));
        for (int p = CUDA_ATTN_FLASH; p < CUDA_ATTN_PATHS; p++) {
            if (e->us[p] >= 0) printf(" %s %.0f us", cuda_attn_path_name(p), e->us[p]);
            /* timed exactly when it covers the case: a warm-up and one run */
            assert_int_equal(x.tune.launched[p] - before[p], want[p] ? 2 : 0);
            assert_int_equal(e->us[p] >= 0, want[p]);
            if (want[p]) assert_true(e->us[e->path] <= e->us[p]);
        }
        printf(" -> %s\n", cuda_attn_path_name(e->path));
        assert_true(want[e->path]);
        /* the forced choice's bits */
        forced.exec.attn_path = e->path;
        tune_call(&forced, c, qkv, dout, out, TUNE_LSE(1), o[1]);
        assert_memory_equal(o[0], o[1], n_o);
        if (!c->backward) assert_memory_equal(lo[0], lo[1], nl * 4);
        /* a second call, and one through ZO_ATTENTION=tune on the automatic
         * choice: nothing timed, no new entry, the same bits */
        for (int env = 0; env < 2; env++) {
            if (env) setenv("ZO_ATTENTION", "tune", 1);
            x.exec.attn_path = env ? CUDA_ATTN_AUTO : CUDA_ATTN_TUNE;
            memset(o[2], 0, n_o);
            memset(lo[2], 0, nl * 4);
            tune_call(&x, c, qkv, dout, out, TUNE_LSE(2), o[2]);
            assert_memory_equal(o[0], o[2], n_o);
            if (!c->backward) assert_memory_equal(lo[0], lo[2], nl * 4);
            assert_int_equal(x.tune.n, n_tuned);
            for (int p = CUDA_ATTN_FLASH; p < CUDA_ATTN_PATHS; p++)
                assert_int_equal(x.tune.launched[p] - before[p], want[p] ? 2 : 0);
        }
#undef TUNE_LSE
        unsetenv("ZO_ATTENTION");
        x.exec.attn_path = CUDA_ATTN_TUNE;
        for (int i = 0; i < 3; i++) free(o[i]), free(lo[i]);
        free(qkv), free(out), free(dout), free(lse);
    }
    shim_exec_free(&forced);
    shim_exec_free(&x);
}
#endif

/* ---- positions out of range -------------------------------------------------------------- */

/* gpu_rope_forward_seq and gpu_embedding_forward_seq with a sequence whose
 * position runs past the positions there are (n_pos: the cache's length,
 * wpe's rows) or is negative: on a device of the interface the stream's
 * next synchronize fails naming the op and the sequence (pos[s] = p
 * outside [0, n_pos - t + 1)), once; on the shim the kernels record it in
 * the stream's error record (the sequence, its position, the limit). The
 * last position that fits (n_pos - t) is fine. 3 sequences of t 2. */
enum { BP_T = 2, BP_SEQ = 3, BP_ROWS = BP_T * BP_SEQ, BP_D = 8, BP_POS = 10 };

#ifdef ZO_HAVE_CUDA_SHIM
/* The op's arguments as gpu_op_run hands them to a backend (the shim's). */
static void bad_position_args(gpu_op_id op, gpu_op_args *a, void *x, void *wte, void *wpe, int32_t *tok,
                              int32_t *pos)
{
    *a = (gpu_op_args){0};
    if (op == GPU_OP_ROPE_FORWARD) {
        a->t[0] = gpu_t(x, ZO_DTYPE_F32);
        a->p[1] = pos;
        a->i[0] = BP_ROWS, a->i[1] = BP_T, a->i[2] = 1, a->i[3] = BP_D, a->i[4] = BP_D, a->i[6] = BP_D;
        a->i[7] = BP_POS;
        a->f[0] = 10000.0f, a->f[1] = 1.0f;
    } else {
        a->t[0] = gpu_t(x, ZO_DTYPE_F32), a->t[1] = gpu_t(wte, ZO_DTYPE_F32), a->t[2] = gpu_t(wpe, ZO_DTYPE_F32);
        a->p[0] = tok, a->p[1] = pos;
        a->i[0] = BP_ROWS, a->i[1] = BP_T, a->i[2] = BP_D, a->i[3] = 4, a->i[4] = BP_POS;
    }
}
#endif

/* One op on a device: the positions in `p` (host) copied to the device,
 * the op called (it queues), the synchronize's status and message. */
static zo_status bad_position_on(devpair *d, gpu_op_id op, const int32_t *p, char *msg, size_t cap)
{
    float *x, *wte, *wpe;
    int32_t *tok, *pos, zeros[BP_ROWS] = {0};
    assert_int_equal(gpu_mem_alloc(d->dev, BP_ROWS * BP_D * 4, (void **)&x), ZO_OK);
    assert_int_equal(gpu_mem_alloc(d->dev, 4 * BP_D * 4, (void **)&wte), ZO_OK);
    assert_int_equal(gpu_mem_alloc(d->dev, BP_POS * BP_D * 4, (void **)&wpe), ZO_OK);
    assert_int_equal(gpu_mem_alloc(d->dev, sizeof zeros, (void **)&tok), ZO_OK);
    assert_int_equal(gpu_mem_alloc(d->dev, BP_SEQ * 4, (void **)&pos), ZO_OK);
    assert_int_equal(gpu_memset_async(d->s, x, 0, BP_ROWS * BP_D * 4), ZO_OK);
    assert_int_equal(gpu_memset_async(d->s, wte, 0, 4 * BP_D * 4), ZO_OK);
    assert_int_equal(gpu_memset_async(d->s, wpe, 0, BP_POS * BP_D * 4), ZO_OK);
    assert_int_equal(gpu_memcpy_async(d->s, tok, zeros, sizeof zeros, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
    assert_int_equal(gpu_memcpy_async(d->s, pos, p, BP_SEQ * 4, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(d->s), ZO_OK);
    gpu_tensor tx = gpu_t(x, ZO_DTYPE_F32);
    zo_status st = op == GPU_OP_ROPE_FORWARD
                       ? gpu_rope_forward_seq(d->s, tx, BP_ROWS, BP_T, 1, BP_D, BP_D, BP_D, 10000.0f, pos, BP_POS,
                                              NULL, 1.0f)
                       : gpu_embedding_forward_seq(d->s, tx, tok, gpu_t(wte, ZO_DTYPE_F32),
                                                   gpu_t(wpe, ZO_DTYPE_F32), pos, BP_POS, BP_ROWS, BP_T, BP_D, 4);
    assert_int_equal(st, ZO_OK); /* queued: found while running */
    zo_clear_error();
    st = gpu_stream_synchronize(d->s);
    snprintf(msg, cap, "%s", zo_last_error());
    assert_int_equal(gpu_stream_synchronize(d->s), ZO_OK); /* reported once */
    gpu_mem_free(d->dev, x), gpu_mem_free(d->dev, wte), gpu_mem_free(d->dev, wpe);
    gpu_mem_free(d->dev, tok), gpu_mem_free(d->dev, pos);
    return st;
}

static void test_bad_positions(void **state)
{
    (void)state;
    static const int32_t fits[BP_SEQ] = {0, BP_POS - BP_T, 3};
    static const int32_t bad[][BP_SEQ] = {{0, BP_POS - BP_T + 1, 3}, {4, 0, -1}};
    static const int bad_seq[] = {1, 2};
    static const gpu_op_id ops[2] = {GPU_OP_ROPE_FORWARD, GPU_OP_EMBEDDING_FORWARD};
    static const char *names[2] = {"gpu_rope_forward_seq", "gpu_embedding_forward_seq"};
    devpair *devs[2] = {&cpu_dev, cuda_dev.dev ? &cuda_dev : NULL};
    char msg[512], want[96];
    for (int o = 0; o < 2; o++)
        for (int k = 0; k < 2; k++) {
            if (!devs[k]) continue;
            assert_int_equal(bad_position_on(devs[k], ops[o], fits, msg, sizeof msg), ZO_OK);
            for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
                int s = bad_seq[b];
                zo_status st = bad_position_on(devs[k], ops[o], bad[b], msg, sizeof msg);
                snprintf(want, sizeof want, "pos[%d] = %d outside [0, %d)", s, bad[b][s], BP_POS - BP_T + 1);
                printf("  %s, %s: %s\n", names[o], k ? "cuda" : "cpu", msg);
                assert_int_equal(st, ZO_ERR_INVALID);
                if (!strstr(msg, names[o]) || !strstr(msg, want)) fail_msg("wanted %s: %s", want, msg);
            }
        }
#ifdef ZO_HAVE_CUDA_SHIM
    /* the CUDA kernels on the host: the error record */
    float x[BP_ROWS * BP_D] = {0}, wte[4 * BP_D] = {0}, wpe[BP_POS * BP_D] = {0};
    int32_t tok[BP_ROWS] = {0}, pos[BP_SEQ];
    for (int o = 0; o < 2; o++) {
        gpu_op_args a;
        shim_exec sx;
        assert_int_equal(shim_exec_init(&sx), ZO_OK);
        memcpy(pos, fits, sizeof pos);
        bad_position_args(ops[o], &a, x, wte, wpe, tok, pos);
        assert_int_equal(shim_cuda_ops[ops[o]](&sx.exec, &a), ZO_OK);
        assert_int_equal(sx.err.code, 0);
        for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
            memcpy(pos, bad[b], sizeof pos);
            sx.err = (cuda_err_rec){0};
            assert_int_equal(shim_cuda_ops[ops[o]](&sx.exec, &a), ZO_OK);
            printf("  %s, cuda-shim: code %d, pos[%d] = %d, limit %d\n", names[o], sx.err.code, sx.err.index,
                   sx.err.value, sx.err.limit);
            assert_int_equal(sx.err.code, o == 0 ? CUDA_ERR_ROPE_SEQ : CUDA_ERR_EMBEDDING_POS);
            assert_int_equal(sx.err.index, bad_seq[b]);
            assert_int_equal(sx.err.value, bad[b][bad_seq[b]]);
            assert_int_equal(sx.err.limit, BP_POS - BP_T + 1);
        }
        shim_exec_free(&sx);
    }
#endif
}

/* The router op's check refuses a gate it cannot run, naming the op and
 * the field (gpu_check_moe_router, in gpu_op_run before any backend: the
 * CPU device's calls stand for every device's); the same buffers with a
 * gate it can run pass. */
static void test_router_gate_refused(void **state)
{
    (void)state;
    enum { RN = 3, RE = 130 }; /* rows, the most experts of the gates below */
    gpu_stream_t s = cpu_dev.s;
    float *buf[5], *stats;
    uint8_t *order;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(gpu_mem_alloc(cpu_dev.dev, RN * RE * sizeof(float), (void **)&buf[i]), ZO_OK);
        assert_int_equal(gpu_memset_async(s, buf[i], 0, RN * RE * sizeof(float)), ZO_OK);
    }
    assert_int_equal(gpu_mem_alloc(cpu_dev.dev, 2 * RE * sizeof(float), (void **)&stats), ZO_OK);
    assert_int_equal(gpu_memset_async(s, stats, 0, 2 * RE * sizeof(float)), ZO_OK);
    assert_int_equal(gpu_mem_alloc(cpu_dev.dev, RN * RE, (void **)&order), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
    const float *bias = buf[4];
    const gpu_moe_route SM = GPU_MOE_ROUTE_SOFTMAX, NM = GPU_MOE_ROUTE_NORM, MX = GPU_MOE_ROUTE_SPARSEMIXER,
                        SG = GPU_MOE_ROUTE_SIGMOID, SN = GPU_MOE_ROUTE_SIGMOID_NORM;
    static const struct {
        int backward, e, k;
        gpu_moe_route mode;
        int groups, topk;
        float scale;
        int bias;
        float aux;
        const char *want; /* NULL: it runs */
    } cases[] = {
        {0, 6, 4, SN, 3, 2, 2.5f, 1, 0.0f, NULL}, /* DeepSeek-V3's gate, at 6 experts */
        {1, 6, 4, SN, 3, 2, 2.5f, 1, 0.0f, NULL},
        {1, 6, 2, NM, 6, 2, 16.0f, 1, 0.01f, NULL}, /* softmax groups of 1, the auxiliary loss */
        {0, 6, 2, SN, 4, 1, 0.0f, 0, 0.0f, "4 groups of 6 experts keeping 1"},
        {1, 6, 2, SM, 3, 0, 0.0f, 0, 0.0f, "3 groups of 6 experts keeping 0"},
        {0, 6, 2, SG, 3, 4, 0.0f, 0, 0.0f, "3 groups of 6 experts keeping 4"},
        {0, 130, 2, SN, 65, 1, 0.0f, 0, 0.0f, "65 groups of 130 experts keeping 1 (at most 64 groups"},
        {1, 6, 2, SN, -2, 1, 0.0f, 0, 0.0f, "-2 groups of 6 experts"},
        {0, 6, 3, SN, 3, 1, 0.0f, 0, 0.0f, "k 3 exceeds the 2 experts of 1 kept groups"},
        {1, 6, 5, NM, 3, 2, 0.0f, 0, 0.0f, "k 5 exceeds the 4 experts of 2 kept groups"},
        {0, 6, 2, SG, 6, 2, 0.0f, 0, 0.0f, "two best experts' (groups of 1)"},
        {1, 6, 2, SN, 0, 0, 0.0f, 1, 0.01f, "the load-balancing loss with sigmoid scores is not modelled"},
        {0, 6, 2, SM, 0, 0, -1.0f, 0, 0.0f, "scale -1 (finite and > 0, or 0 for none)"},
        {1, 6, 2, SN, 0, 0, NAN, 0, 0.0f, "scale nan"},
        {0, 6, 2, NM, 0, 0, INFINITY, 0, 0.0f, "scale inf"},
        {0, 6, 2, MX, 3, 1, 0.0f, 0, 0.0f, "the sparsemixer takes no groups, bias or scale"},
        {1, 6, 2, MX, 0, 0, 0.0f, 1, 0.0f, "the sparsemixer takes no groups, bias or scale"},
        {0, 6, 2, MX, 0, 0, 2.0f, 0, 0.0f, "the sparsemixer takes no groups, bias or scale"},
        {0, 6, 2, (gpu_moe_route)5, 0, 0, 0.0f, 0, 0.0f, "unknown mode 5"},
        {1, 6, 2, (gpu_moe_route)-1, 0, 0, 0.0f, 0, 0.0f, "unknown mode -1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const gpu_moe_gate g = {.mode = cases[i].mode, .groups = cases[i].groups, .topk_groups = cases[i].topk,
                                .scale = cases[i].scale, .bias = cases[i].bias ? bias : NULL};
        const int e = cases[i].e, k = cases[i].k;
        const char *op = cases[i].backward ? "gpu_moe_router_backward" : "gpu_moe_router_forward";
        zo_clear_error();
        zo_status st = cases[i].backward
                           ? gpu_moe_router_backward(s, gpu_t(buf[0], ZO_DTYPE_F32), gpu_t(buf[1], ZO_DTYPE_F32),
                                                     gpu_t(buf[2], ZO_DTYPE_F32), stats, RN, e, k, &g, 1, RN,
                                                     cases[i].aux)
                           : gpu_moe_router_forward(s, gpu_t(buf[0], ZO_DTYPE_F32), gpu_t(buf[2], ZO_DTYPE_F32),
                                                    stats, order, RN, e, k, &g, RN);
        if (st == ZO_OK) st = gpu_stream_synchronize(s);
        printf("  %s mode %d e %d k %d groups %d keep %d scale %g%s: %s\n", op, (int)cases[i].mode, e, k,
               cases[i].groups, cases[i].topk, (double)cases[i].scale, cases[i].bias ? " bias" : "",
               st == ZO_OK ? "runs" : zo_last_error());
        if (!cases[i].want) {
            assert_int_equal(st, ZO_OK);
            continue;
        }
        assert_int_equal(st, ZO_ERR_INVALID);
        if (strncmp(zo_last_error(), op, strlen(op)) || !strstr(zo_last_error(), cases[i].want))
            fail_msg("wanted %s: ... %s: %s", op, cases[i].want, zo_last_error());
    }
    assert_int_equal(gpu_moe_router_forward(s, gpu_t(buf[0], ZO_DTYPE_F32), gpu_t(buf[2], ZO_DTYPE_F32), stats,
                                            order, RN, 6, 2, NULL, RN),
                     ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "gpu_moe_router_forward: no gate"));
    for (int i = 0; i < 5; i++) gpu_mem_free(cpu_dev.dev, buf[i]);
    gpu_mem_free(cpu_dev.dev, stats), gpu_mem_free(cpu_dev.dev, order);
}

static int open_device(devpair *d, const char *name)
{
    /* n_threads 0, train's default: each op sizes its team from OpenMP's
     * (the router's kernels once took 0 for the team and laid every
     * thread's scratch over its sums) */
    gpu_cpu_options opt = {.capacity = 0, .n_threads = 0};
    zo_status st = strcmp(name, "cpu") == 0 ? gpu_device_init_cpu(&opt, &d->dev)
                                            : gpu_device_open(name, 0, &d->dev);
    if (st == ZO_OK) st = gpu_stream_create(d->dev, &d->s);
    if (st != ZO_OK) fprintf(stderr, "test_ops: opening %s: %s\n", name, zo_last_error());
    return st == ZO_OK;
}

static void close_device(devpair *d)
{
    if (!d->dev) return;
    gpu_stream_destroy(d->s);
    gpu_device_free(d->dev);
}

/* ZO_OPS_BACKENDS (a comma-separated list of backend names): only those
 * run, e.g. "cpu,cuda" on a GPU machine, where the host shim's backends
 * (the same kernels, which CI runs) took most of test_ops' 100 s. A name
 * that is no backend's is an error. */
static int keep_backends(const char *list)
{
    static const char *const known[] = {"cpu", "cuda-shim", "cuda-shim-gemm", "cuda-shim-gemm-small", "cuda-shim-tc",
                                        "cuda-shim-mma", "cuda"};
    if (!list) return 1;
    char names[256];
    snprintf(names, sizeof names, "%s", list);
    for (char *save = NULL, *w = strtok_r(names, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        size_t k = 0;
        while (k < sizeof known / sizeof *known && strcmp(w, known[k])) k++;
        if (k == sizeof known / sizeof *known) {
            fprintf(stderr, "test_ops: ZO_OPS_BACKENDS=%s: no backend is named '%s' (cpu, cuda-shim, "
                            "cuda-shim-gemm, cuda-shim-gemm-small, cuda-shim-tc, cuda-shim-mma, cuda)\n", list, w);
            return 0;
        }
    }
    int n = 0;
    for (int b = 0; b < n_backends; b++) {
        size_t len = strlen(backends[b]->name);
        const char *p = list;
        int listed = 0;
        while (!listed && (p = strstr(p, backends[b]->name)) != NULL) {
            listed = (p == list || p[-1] == ',') && (p[len] == ',' || p[len] == '\0');
            p += len;
        }
        if (listed) backends[n++] = backends[b];
        else printf("  backend %s: not in ZO_OPS_BACKENDS, not run\n", backends[b]->name);
    }
    n_backends = n;
    return 1;
}

int main(void)
{
    filter = getenv("ZO_OPS_FILTER");
    verbose = getenv("ZO_OPS_VERBOSE") != NULL;
    if (getenv("ZO_OPS_SHIM_MAX_T")) {
        char *end;
        long v = strtol(getenv("ZO_OPS_SHIM_MAX_T"), &end, 10);
        if (*end || v < 0 || v > 1 << 20) {
            fprintf(stderr, "test_ops: ZO_OPS_SHIM_MAX_T=%s: expected a token count (0: no limit)\n",
                    getenv("ZO_OPS_SHIM_MAX_T"));
            return 2;
        }
        shim_max_t = (int)v;
    }
    if (env_flag("ZO_OPS_SHIM_LEAN", &shim_lean) || env_flag("ZO_OPS_SHIM_SPLIT", &shim_split)) return 2;
    if (shim_split && shim_lean) {
        fprintf(stderr, "test_ops: ZO_OPS_SHIM_SPLIT=1 with ZO_OPS_SHIM_LEAN=1 would run neither half "
                        "of the shim's cases\n");
        return 2;
    }
    static backend cpu = {"cpu", &cpu_dev, dev_alloc, dev_release, dev_put, dev_get, dev_run, 0, 0, 0, NULL, 0, 0, 0, 0};
    static backend cuda = {"cuda", &cuda_dev, dev_alloc, dev_release, dev_put, dev_get, dev_run, 0, 0, 1, NULL, 0, 0, 0, 0};
    if (!open_device(&cpu_dev, "cpu")) return 1;
    backends[n_backends++] = &cpu;
#ifdef ZO_HAVE_CUDA_SHIM
    static backend sh = {"cuda-shim", NULL, host_alloc, free, host_copy, host_copy, shim_run, 0, 0, 0, NULL, 1, 0, 0, 0};
    static backend shg = {"cuda-shim-gemm", NULL, host_alloc, free, host_copy, host_copy, shim_gemm_run,
                          0, 0, 0, takes_gemm_attention, 0, 0, 0, 0};
    static backend shs = {"cuda-shim-gemm-small", NULL, host_alloc, free, host_copy, host_copy,
                          shim_gemm_small_run, 0, 0, 0, takes_gemm_small_attention, 0, 0, 0, 0};
    static backend sht = {"cuda-shim-tc", NULL, host_alloc, free, host_copy, host_copy, shim_tc_run,
                          0, 0, 0, takes_tc_attention, 1, 0, 0, 0};
    static backend shm = {"cuda-shim-mma", NULL, host_alloc, free, host_copy, host_copy, shim_mma_run,
                          0, 0, 0, takes_mma_attention, 1, 0, 0, 0};
    if (shim_exec_init(&shim) != ZO_OK || shim_exec_init(&shim_gemm) != ZO_OK || shim_exec_init(&shim_tc) != ZO_OK ||
        shim_exec_init(&shim_mma) != ZO_OK)
        return 1;
    /* each shim backend one attention path: the plain one the flash kernel
     * (auto would take the mma.sync kernels wherever they cover the case) */
    shim.exec.attn_path = CUDA_ATTN_FLASH;
    shim_gemm.exec.attn_path = CUDA_ATTN_GEMM;
    shim_tc.exec.attn_path = CUDA_ATTN_TC;
    shim_mma.exec.attn_path = CUDA_ATTN_MMA;
    backends[n_backends++] = &sh;
    backends[n_backends++] = &shg;
    backends[n_backends++] = &shs;
    backends[n_backends++] = &sht;
    backends[n_backends++] = &shm;
#endif
    /* a GPU, where there is one: the same cases against the same reference */
    if (gpu_cuda_device_count() > 0) {
        if (!open_device(&cuda_dev, "cuda")) return 1;
        backends[n_backends++] = &cuda;
    } else {
        printf("  no CUDA device: the cuda backend is not run here\n");
    }
    if (!keep_backends(getenv("ZO_OPS_BACKENDS"))) return 2;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op),
        cmocka_unit_test(test_bad_positions),
        cmocka_unit_test(test_router_gate_refused),
#ifdef ZO_HAVE_CUDA_SHIM
        cmocka_unit_test(test_attention_path_env),
        cmocka_unit_test(test_attention_grads16),
        cmocka_unit_test(test_attention_tune),
#endif
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
#ifdef ZO_HAVE_CUDA_SHIM
    shim_exec_free(&shim);
    shim_exec_free(&shim_gemm);
    shim_exec_free(&shim_tc);
    shim_exec_free(&shim_mma);
#endif
    close_device(&cuda_dev);
    close_device(&cpu_dev);
    return rc;
}
