/* The CUDA column of the op table: each entry unpacks its slots (gpu/ops.h)
 * for its launcher in gpu/cuda/<family>.cu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"            /* defines: zo_dtype_name */

#include "gpu/cuda/attention_gemm.h" /* defines: CUDA_ATTN_GEMM_MIN_T */
#include "gpu/cuda/attention_mma.h"  /* defines: cuda_attn_mma_covers, cuda_launch_attention_mma_* */
#include "gpu/cuda/attention_tc.h"   /* defines: cuda_attn_tc_covers, cuda_launch_attention_tc_* */
#include "gpu/cuda/ops_cuda.h"       /* defines: cuda_exec, cuda_ops */

/* cuBLASLt where there is a handle; the tiled kernel otherwise (the host
 * shim, which has no cuBLASLt). */
static zo_status cuda_run_gemm(const cuda_exec *e, const gpu_op_args *a)
{
    gpu_gemm_desc d = a->d.gemm;
    d.a = a->t[0], d.b = a->t[1], d.c = a->t[2];
#ifndef ZO_CUDA_SHIM
    if (e->lt) return cuda_gemm(e->stream, e->lt, e->pool, e->workspace, e->ws_bytes, &d);
#endif
    return cuda_launch_gemm_tiled(e->stream, &d);
}

static zo_status cuda_run_bias_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_bias_forward(e->stream, a->t[0], a->t[1], (int)a->i[0], (int)a->i[1],
                                    a->i[2]);
}

static zo_status cuda_run_bias_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_bias_backward(e->stream, e->workspace, e->ws_bytes, a->t[0], a->t[1], (int)a->i[0],
                                     (int)a->i[1], a->i[2]);
}

static zo_status cuda_run_layernorm_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_layernorm_forward(e->stream, a->t[0], a->p[0], a->p[1], a->t[1], a->t[2],
                                         a->t[3], (int)a->i[0], (int)a->i[1], a->f[0]);
}

static zo_status cuda_run_layernorm_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_layernorm_backward(e->stream, e->workspace, e->ws_bytes, a->t[0], a->t[1], a->t[2], a->t[3], a->t[4],
                                          a->t[5], a->p[0], a->p[1], (int)a->i[0], (int)a->i[1]);
}

static zo_status cuda_run_rmsnorm_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_rmsnorm_forward(e->stream, a->t[0], a->p[0], a->t[1], a->t[2],
                                       (int)a->i[0], (int)a->i[1], a->f[0]);
}

static zo_status cuda_run_rmsnorm_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_rmsnorm_backward(e->stream, e->workspace, e->ws_bytes, a->t[0], a->t[1], a->t[2], a->t[3], a->t[4],
                                        a->p[0], (int)a->i[0], (int)a->i[1]);
}

static zo_status cuda_run_head_norm_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_head_norm_forward(e->stream, a->t[0], a->i[3], a->t[2], a->p[0], a->t[1], a->i[4],
                                         (int)a->i[0], (int)a->i[1], (int)a->i[2], a->f[0], (int)a->i[5]);
}

static zo_status cuda_run_head_norm_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_head_norm_backward(e->stream, e->workspace, e->ws_bytes, a->t[0], a->i[3], a->t[1], a->t[2],
                                          a->t[3], a->i[4], a->p[0], (int)a->i[0], (int)a->i[1], (int)a->i[2],
                                          (int)a->i[5]);
}

/* Whether `path` computes attention over qkv of this shape: the
 * tensor-core and mma.sync kernels their cases (16-bit qkv, d 64/80/96/128,
 * windows and soft caps; ALiBi on the tensor-core kernels only) with qkv
 * 16-byte aligned, as their vector loads need; the GEMM path 16-bit qkv; the flash kernel all. */
static int attention_covers(const gpu_attn_desc *d, gpu_tensor qkv, int path)
{
    const int b16 = qkv.dtype == ZO_DTYPE_F16 || qkv.dtype == ZO_DTYPE_BF16;
    const int aligned = (uintptr_t)qkv.data % 16 == 0;
    switch (path) {
    case CUDA_ATTN_MMA: return aligned && cuda_attn_mma_covers(d, qkv.dtype);
    case CUDA_ATTN_TC: return aligned && cuda_attn_tc_covers(d, qkv.dtype);
    case CUDA_ATTN_GEMM: return b16;
    default: return path == CUDA_ATTN_FLASH;
    }
}

/* The path a call of this shape takes when `path` is asked for
 * (CUDA_ATTN_AUTO: the automatic choice), common/attn_path.h's
 * zo_attn_resolve_path (memplan resolves the same): forced mma.sync or
 * tensor-core kernels where they cover the case, else the automatic choice
 * (zo_attn_auto_path: the mma.sync kernels wherever they cover it, not
 * ALiBi; the tensor-core kernels where they cover it at head sizes up to
 * 64, or where the GEMM path is not taken; the GEMM path for 16-bit qkv on
 * a device with cuBLASLt from t >= ZO_ATTN_GEMM_MIN_T; else the flash
 * kernel); forced GEMM for 16-bit qkv, else the flash kernel. */
static int attention_resolve(const cuda_exec *e, const gpu_attn_desc *d, gpu_tensor qkv, int path)
{
    static const int of[] = {[ZO_ATTN_FLASH] = CUDA_ATTN_FLASH, [ZO_ATTN_GEMM] = CUDA_ATTN_GEMM,
                             [ZO_ATTN_TC] = CUDA_ATTN_TC, [ZO_ATTN_MMA] = CUDA_ATTN_MMA};
    static const zo_attn_path to[] = {[CUDA_ATTN_AUTO] = ZO_ATTN_AUTO, [CUDA_ATTN_FLASH] = ZO_ATTN_FLASH,
                                      [CUDA_ATTN_GEMM] = ZO_ATTN_GEMM, [CUDA_ATTN_TC] = ZO_ATTN_TC,
                                      [CUDA_ATTN_MMA] = ZO_ATTN_MMA, [CUDA_ATTN_TUNE] = ZO_ATTN_AUTO};
    const int b16 = qkv.dtype == ZO_DTYPE_F16 || qkv.dtype == ZO_DTYPE_BF16;
    const int aligned = (uintptr_t)qkv.data % 16 == 0;
    return of[zo_attn_resolve_path(to[path], b16, aligned, d->d, d->window, d->softcap, d->alibi, d->t,
                                   e->lt != NULL)];
}

/* Which kernels run attention over qkv of this shape (*path: CUDA_ATTN_FLASH,
 * _GEMM, _TC, _MMA, or _TUNE: the fastest of those that cover it, timed once
 * per shape). The tensor-core kernels when chosen (ZO_ATTENTION=tc) and
 * they cover the case (16-bit qkv, d 64/80/96/128, windows, soft caps and
 * ALiBi; qkv 16-byte aligned); the mma.sync kernels (ZO_ATTENTION=mma, and
 * the automatic choice's first) for the same cases but ALiBi; what they do
 * not cover falls back to the automatic choice (attention_resolve), as does
 * tune without a cache of the device's choices. */
static zo_status attention_path(const cuda_exec *e, const gpu_attn_desc *d, gpu_tensor qkv, int *path)
{
    int p = e->attn_path;
    if (p == CUDA_ATTN_AUTO) {
        const char *v = getenv("ZO_ATTENTION");
        if (v && !strcmp(v, "gemm")) p = CUDA_ATTN_GEMM;
        else if (v && !strcmp(v, "flash")) p = CUDA_ATTN_FLASH;
        else if (v && !strcmp(v, "tc")) p = CUDA_ATTN_TC;
        else if (v && !strcmp(v, "mma")) p = CUDA_ATTN_MMA;
        else if (v && !strcmp(v, "tune")) p = CUDA_ATTN_TUNE;
        else if (v && *v && strcmp(v, "auto"))
            return zo_error(ZO_ERR_INVALID, "ZO_ATTENTION=%s: expected gemm, flash, tc, mma, tune or auto", v);
    }
    if (p == CUDA_ATTN_TUNE && e->tune) {
        *path = CUDA_ATTN_TUNE;
        return ZO_OK;
    }
    *path = attention_resolve(e, d, qkv, p); /* (tune without a cache: the automatic choice) */
    return ZO_OK;
}

static cuda_gemm_env gemm_env(const cuda_exec *e)
{
    cuda_gemm_env g = {.stream = e->stream, .lt = e->lt, .pool = e->pool, .workspace = e->workspace,
                       .ws_bytes = e->ws_bytes, .cap = e->attn_cap};
    return g;
}

/* One path's forward: out [b, t, hq*d] (t[0]), lse (p[0]) from qkv (t[1]). */
static zo_status attention_forward_on(const cuda_exec *e, const gpu_op_args *a, int path)
{
    if (path == CUDA_ATTN_MMA)
        return cuda_launch_attention_mma_forward(e->stream, &a->d.attn, a->t[0], a->p[0], a->t[1]);
    if (path == CUDA_ATTN_TC) return cuda_launch_attention_tc_forward(e->stream, &a->d.attn, a->t[0], a->p[0], a->t[1]);
    if (path == CUDA_ATTN_GEMM) {
        cuda_gemm_env g = gemm_env(e);
        return cuda_launch_attention_gemm_forward(&g, &a->d.attn, a->t[0], a->p[0], a->t[1]);
    }
    return cuda_launch_attention_forward(e->stream, &a->d.attn, a->t[0], a->p[0], a->t[1]);
}

/* One path's backward: dqkv (t[0], overwritten) from dout (t[1]), qkv
 * (t[2]), out (t[3]) and lse (p[0]). */
static zo_status attention_backward_on(const cuda_exec *e, const gpu_op_args *a, int path)
{
    if (path == CUDA_ATTN_MMA)
        return cuda_launch_attention_mma_backward(e->stream, e->pool, &a->d.attn, a->t[0], a->t[1], a->t[2], a->t[3],
                                                  a->p[0]);
    if (path == CUDA_ATTN_TC)
        return cuda_launch_attention_tc_backward(e->stream, e->pool, &a->d.attn, a->t[0], a->t[1], a->t[2], a->t[3],
                                                 a->p[0]);
    if (path == CUDA_ATTN_GEMM) {
        cuda_gemm_env g = gemm_env(e);
        return cuda_launch_attention_gemm_backward(&g, &a->d.attn, a->t[0], a->t[1], a->t[2], a->t[3],
                                                   a->p[0]);
    }
    return cuda_launch_attention_backward(e->stream, &a->d.attn, a->t[0], a->t[1], a->t[2],
                                          a->t[3], a->p[0]);
}

/* ---- ZO_ATTENTION=tune (ops_cuda.h) ---- */

void cuda_attn_tune_init(cuda_attn_tune *t)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->lock, NULL);
}

void cuda_attn_tune_free(cuda_attn_tune *t) { pthread_mutex_destroy(&t->lock); }

const char *cuda_attn_path_name(int path)
{
    static const char *names[CUDA_ATTN_PATHS] = {[CUDA_ATTN_FLASH] = "flash", [CUDA_ATTN_GEMM] = "gemm",
                                                 [CUDA_ATTN_TC] = "tc", [CUDA_ATTN_MMA] = "mma"};
    return path > 0 && path < CUDA_ATTN_PATHS ? names[path] : "?";
}

cuda_attn_shape cuda_attn_shape_of(const gpu_op_args *a, int backward)
{
    const gpu_attn_desc *d = &a->d.attn;
    const gpu_tensor qkv = a->t[backward ? 2 : 1];
    cuda_attn_shape k = {.backward = backward, .b = d->b, .t = d->t, .hq = d->hq, .hkv = d->hkv, .d = d->d,
                         .window = d->window, .alibi_bf16 = d->alibi_bf16, .softcap = d->softcap,
                         .alibi = d->alibi, .qkv = (int)qkv.dtype, .out = -1, .dout = -1, .dqkv = -1,
                         .aligned = (uintptr_t)qkv.data % 16 == 0};
    if (backward) k.dqkv = (int)a->t[0].dtype, k.dout = (int)a->t[1].dtype, k.grads16 = d->grads16 != 0;
    else k.out = (int)a->t[0].dtype;
    return k;
}

static int shape_equal(const cuda_attn_shape *x, const cuda_attn_shape *y)
{
    return x->backward == y->backward && x->b == y->b && x->t == y->t && x->hq == y->hq && x->hkv == y->hkv &&
           x->d == y->d && x->window == y->window && x->alibi_bf16 == y->alibi_bf16 && x->softcap == y->softcap &&
           x->alibi == y->alibi && x->qkv == y->qkv && x->out == y->out && x->dout == y->dout &&
           x->dqkv == y->dqkv && x->aligned == y->aligned && x->grads16 == y->grads16;
}

const cuda_attn_tuned *cuda_attn_tune_find(cuda_attn_tune *t, const cuda_attn_shape *k)
{
    const cuda_attn_tuned *hit = NULL;
    pthread_mutex_lock(&t->lock);
    for (int i = 0; i < t->n && !hit; i++)
        if (shape_equal(&t->e[i].shape, k)) hit = &t->e[i];
    pthread_mutex_unlock(&t->lock);
    return hit;
}

typedef zo_status (*attention_run_fn)(const cuda_exec *e, const gpu_op_args *a, int path);

/* One path's mean time a run (*us), after a warm-up run: `runs` runs
 * queued back to back between the stopwatch's two records. */
static zo_status time_path(const cuda_exec *e, const gpu_op_args *a, attention_run_fn run, int path, int runs,
                           double *us)
{
    zo_status st = run(e, a, path);
    if (st != ZO_OK) return st;
    cuda_stopwatch w;
    if ((st = cuda_stopwatch_start(e->stream, &w)) != ZO_OK) return st;
    for (int r = 0; r < runs && st == ZO_OK; r++) st = run(e, a, path);
    zo_status st2 = cuda_stopwatch_stop(e->stream, &w, us);
    *us /= runs;
    pthread_mutex_lock(&e->tune->lock);
    e->tune->launched[path] += runs + 1;
    pthread_mutex_unlock(&e->tune->lock);
    return st != ZO_OK ? st : st2;
}

/* ZO_ATTENTION_LOG's line for a tuned shape. */
static void log_tuned(const cuda_attn_tuned *x)
{
    const char *v = getenv("ZO_ATTENTION_LOG");
    if (!v || !*v || !strcmp(v, "0")) return;
    const cuda_attn_shape *k = &x->shape;
    char line[512];
    int n = snprintf(line, sizeof line, "ZO_ATTENTION=tune: attention_%s b%d t%d hq%d hkv%d d%d causal qkv %s",
                     k->backward ? "backward" : "forward", k->b, k->t, k->hq, k->hkv, k->d,
                     zo_dtype_name((zo_dtype)k->qkv));
    if (k->backward)
        n += snprintf(line + n, sizeof line - n, " dout %s dqkv %s", zo_dtype_name((zo_dtype)k->dout),
                      zo_dtype_name((zo_dtype)k->dqkv));
    else
        n += snprintf(line + n, sizeof line - n, " out %s", zo_dtype_name((zo_dtype)k->out));
    if (k->window > 0) n += snprintf(line + n, sizeof line - n, " w%d", k->window);
    if (k->softcap > 0.0f) n += snprintf(line + n, sizeof line - n, " softcap %g", (double)k->softcap);
    if (k->alibi > 0.0f) n += snprintf(line + n, sizeof line - n, " alibi %g%s", (double)k->alibi,
                                       k->alibi_bf16 ? " bf16" : "");
    if (!k->aligned) n += snprintf(line + n, sizeof line - n, " unaligned");
    if (k->grads16) n += snprintf(line + n, sizeof line - n, " grads16");
    static const int order[] = {CUDA_ATTN_MMA, CUDA_ATTN_TC, CUDA_ATTN_GEMM, CUDA_ATTN_FLASH};
    const char *sep = ":";
    for (int i = 0; i < 4; i++) {
        if (x->us[order[i]] < 0) continue;
        n += snprintf(line + n, sizeof line - n, "%s %s %.1f us", sep, cuda_attn_path_name(order[i]),
                      x->us[order[i]]);
        sep = ",";
    }
    fprintf(stderr, "%s -> %s\n", line, cuda_attn_path_name(x->path));
}

/* The call under ZO_ATTENTION=tune: the shape's path when it has one; else
 * every path that covers it timed (mma, tc, gemm, flash), the fastest kept
 * and run last, so that the call's results are its own. */
static zo_status attention_tuned(const cuda_exec *e, const gpu_op_args *a, int backward, attention_run_fn run)
{
    cuda_attn_tune *t = e->tune;
    const gpu_tensor qkv = a->t[backward ? 2 : 1];
    cuda_attn_tuned x = {.shape = cuda_attn_shape_of(a, backward)};
    const cuda_attn_tuned *hit = cuda_attn_tune_find(t, &x.shape);
    if (hit) return run(e, a, hit->path);
    pthread_mutex_lock(&t->lock);
    const int full = t->n == CUDA_ATTN_TUNE_SLOTS, runs = t->runs > 0 ? t->runs : CUDA_ATTN_TUNE_RUNS;
    pthread_mutex_unlock(&t->lock);
    if (full) return run(e, a, attention_resolve(e, &a->d.attn, qkv, CUDA_ATTN_AUTO));
    static const int order[] = {CUDA_ATTN_MMA, CUDA_ATTN_TC, CUDA_ATTN_GEMM, CUDA_ATTN_FLASH};
    for (int p = 0; p < CUDA_ATTN_PATHS; p++) x.us[p] = -1.0;
    for (int i = 0; i < 4; i++) {
        const int p = order[i];
        if (!attention_covers(&a->d.attn, qkv, p)) continue;
        zo_status st = time_path(e, a, run, p, runs, &x.us[p]);
        if (st != ZO_OK)
            return zo_error_wrap(st, "ZO_ATTENTION=tune: timing the %s path", cuda_attn_path_name(p));
        if (!x.path || x.us[p] < x.us[x.path]) x.path = p;
    }
    pthread_mutex_lock(&t->lock);
    int known = 0;
    for (int i = 0; i < t->n && !known; i++) known = shape_equal(&t->e[i].shape, &x.shape);
    if (!known && t->n < CUDA_ATTN_TUNE_SLOTS) t->e[t->n++] = x;
    pthread_mutex_unlock(&t->lock);
    if (!known) log_tuned(&x);
    return run(e, a, x.path);
}

static zo_status cuda_run_attention_forward(const cuda_exec *e, const gpu_op_args *a)
{
    int path = 0;
    zo_status st = attention_path(e, &a->d.attn, a->t[1], &path);
    if (st != ZO_OK) return st;
    st = path == CUDA_ATTN_TUNE ? attention_tuned(e, a, 0, attention_forward_on) : attention_forward_on(e, a, path);
    if (st != ZO_OK || !a->p[1]) return st;
    return cuda_launch_attention_sink_forward(e->stream, &a->d.attn, a->t[0], a->p[0], a->p[1]);
}

/* ZO_ATTENTION_GRADS: 16bit sets every backward's grads16 (gpu/device.h:
 * FlashAttention-2's precision where a kernel takes it, the mma.sync
 * kernels); split, auto or unset leaves the call's own. */
static zo_status attention_grads(const gpu_attn_desc *d, gpu_attn_desc *out)
{
    *out = *d;
    const char *v = getenv("ZO_ATTENTION_GRADS");
    if (v && !strcmp(v, "16bit")) out->grads16 = 1;
    else if (v && *v && strcmp(v, "split") && strcmp(v, "auto"))
        return zo_error(ZO_ERR_INVALID, "ZO_ATTENTION_GRADS=%s: expected 16bit, split or auto", v);
    return ZO_OK;
}

static zo_status cuda_run_attention_backward(const cuda_exec *e, const gpu_op_args *a)
{
    gpu_op_args x = *a;
    zo_status st = attention_grads(&a->d.attn, &x.d.attn);
    int path = 0;
    if (st == ZO_OK) st = attention_path(e, &x.d.attn, x.t[2], &path);
    if (st != ZO_OK) return st;
    st = path == CUDA_ATTN_TUNE ? attention_tuned(e, &x, 1, attention_backward_on) : attention_backward_on(e, &x, path);
    if (st != ZO_OK || !a->p[2]) return st;
    return cuda_launch_attention_sink_backward(e->stream, &a->d.attn, a->p[2], a->p[1], a->t[1], a->t[3], a->p[0]);
}

static zo_status cuda_run_attention_cached(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_attention_cached(e->stream, e->err, &a->d.attn, a->t[0], a->t[1], a->t[2], a->t[3],
                                        a->p[0], a->p[1], (int)a->i[0]);
}

static zo_status rope(const cuda_exec *e, const gpu_op_args *a, int inverse)
{
    return cuda_launch_rope(e->stream, e->err, a->t[0], (int)a->i[0], (int)a->i[1], (int)a->i[2],
                            (int)a->i[3], a->i[4], a->i[6], a->f[0], (int)a->i[5], a->p[1], (int)a->i[7], a->p[0],
                            a->f[1], inverse);
}

static zo_status cuda_run_rope_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return rope(e, a, 0);
}

static zo_status cuda_run_rope_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return rope(e, a, 1);
}

static zo_status cuda_run_gelu_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_gelu_forward(e->stream, a->t[0], a->t[1], a->n, (int)a->i[0]);
}

static zo_status cuda_run_gelu_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_gelu_backward(e->stream, a->t[0], a->t[1], a->t[2], a->n, (int)a->i[0]);
}

static zo_status cuda_run_swiglu_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_swiglu_forward(e->stream, a->t[0], a->t[1], a->t[2], a->n, (int)a->i[0], a->f[0], a->f[1]);
}

static zo_status cuda_run_swiglu_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_swiglu_backward(e->stream, a->t[0], a->t[1], a->t[2], a->t[3], a->t[4],
                                       a->n, (int)a->i[0], a->f[0], a->f[1]);
}

static zo_status cuda_run_embedding_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_embedding_forward(e->stream, e->err, a->t[0], a->p[0], a->t[1], a->t[2], a->p[1],
                                         (int)a->i[4], (int)a->i[0], (int)a->i[1], (int)a->i[2], (int)a->i[3]);
}

static zo_status cuda_run_embedding_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_embedding_backward(e->stream, e->err, e->workspace, e->ws_bytes, a->t[0],
                                          a->t[1], a->t[2], a->p[0], (int)a->i[0], (int)a->i[1],
                                          (int)a->i[2], (int)a->i[3]);
}

static zo_status cuda_run_cross_entropy_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_cross_entropy_forward(e->stream, e->err, a->p[0], a->t[0], a->p[1],
                                             (int)a->i[0], (int)a->i[1], a->f[0]);
}

static zo_status cuda_run_cross_entropy_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_cross_entropy_backward(e->stream, e->err, a->t[0], a->t[1], a->p[0],
                                              a->f[0], (int)a->i[0], (int)a->i[1], a->f[1]);
}

static zo_status cuda_run_add(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_add(e->stream, a->t[0], a->t[1], a->t[2], a->n);
}

static zo_status cuda_run_scale(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_scale(e->stream, a->t[0], a->f[0], a->n);
}

static zo_status cuda_run_softcap(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_softcap(e->stream, a->t[0], a->f[0], a->n);
}

static zo_status cuda_run_cast(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_cast(e->stream, a->t[0], a->t[1], a->n);
}

static zo_status cuda_run_head_copy(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_head_copy(e->stream, a->t[0], a->t[1], (int)a->i[0], (int)a->i[1], (int)a->i[2],
                                 (int)a->i[3], a->i[4], a->i[5], a->i[6], a->i[7]);
}

static zo_status cuda_run_check_finite(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_check_finite(e->stream, a->p[0], a->t[0], a->n);
}

static zo_status cuda_run_sum_squares(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_sum_squares(e->stream, a->p[0], a->t[0], a->n, e->partials);
}

static zo_status cuda_run_nf4_dequantize(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_nf4_dequantize(e->stream, a->t[0], a->p[0], a->n);
}

static zo_status cuda_run_adam_update(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_adam_update(e->stream, &a->d.adam, a->n, a->p[0], a->t[0], a->p[1],
                                   a->p[2], a->t[1]);
}

static zo_status cuda_run_adam_state_update(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_adam_state_update(e->stream, &a->d.astate, a->n, a->t[0], a->t[1], a->p[0], a->t[2],
                                         a->p[1]);
}

static zo_status cuda_run_moe_router_forward(const cuda_exec *e, const gpu_op_args *a)
{
    const gpu_moe_gate g = {.mode = (gpu_moe_route)a->i[3], .eps = a->f[1], .groups = (int)a->i[5],
                            .topk_groups = (int)a->i[6], .scale = a->f[2], .bias = a->p[2]};
    return cuda_launch_moe_router_forward(e->stream, e->workspace, e->ws_bytes, a->t[0], a->t[1], a->p[0],
                                          a->p[1], (int)a->i[0],
                                          (int)a->i[1], (int)a->i[2], &g, (int)a->i[4]);
}

static zo_status cuda_run_moe_router_backward(const cuda_exec *e, const gpu_op_args *a)
{
    const gpu_moe_gate g = {.mode = (gpu_moe_route)a->i[3], .eps = a->f[1], .groups = (int)a->i[6],
                            .topk_groups = (int)a->i[7], .scale = a->f[2], .bias = a->p[1]};
    return cuda_launch_moe_router_backward(e->stream, a->t[0], a->t[1], a->t[2], a->p[0], (int)a->i[0],
                                           (int)a->i[1], (int)a->i[2], &g, (int)a->i[4], (int)a->i[5],
                                           a->f[0]);
}

static zo_status cuda_run_moe_scale_forward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_moe_scale_forward(e->stream, a->t[0], a->t[1], a->p[0], (int)a->i[0],
                                         (int)a->i[1], a->i[2], (int)a->i[3]);
}

static zo_status cuda_run_moe_scale_backward(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_moe_scale_backward(e->stream, a->t[0], a->p[0], a->t[1], a->t[2], a->p[1],
                                          (int)a->i[0], (int)a->i[1], a->i[2], (int)a->i[3]);
}

static zo_status cuda_run_moe_gather(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_moe_gather(e->stream, a->t[0], a->t[1], a->p[0], (int)a->i[0], (int)a->i[1]);
}

static zo_status cuda_run_moe_scatter_add(const cuda_exec *e, const gpu_op_args *a)
{
    return cuda_launch_moe_scatter_add(e->stream, a->t[0], a->t[1], a->p[0], (int)a->i[0],
                                       (int)a->i[1], a->i[2]);
}

const cuda_op_fn cuda_ops[GPU_OP_COUNT] = {
#define CUDA_OP(ID, name, slots, check) [GPU_OP_##ID] = cuda_run_##name,
    GPU_OP_TABLE(CUDA_OP)
#undef CUDA_OP
};
