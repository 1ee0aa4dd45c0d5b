/* Public entry points: argument checks, the per-step constants, the choice of
 * implementation from cpuid, and the OpenMP static split. */
#include "cpu_adam.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "adam_kernels.h" /* adam_consts, the kernels */


adam_cpu adam_cpu_detect(void)
{
    adam_cpu cpu;
    /* __builtin_cpu_supports checks the OS has enabled the register state
     * (XCR0) too, not only the cpuid bits. */
    __builtin_cpu_init();
    cpu.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
               __builtin_cpu_supports("fma");
    cpu.avx512 = cpu.avx2 && __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    cpu.avx512_bf16 = cpu.avx512 && __builtin_cpu_supports("avx512bf16");
    cpu.avx512_vbmi = cpu.avx512 && __builtin_cpu_supports("avx512vbmi");
    return cpu;
}

int adam_impl_supported(adam_impl impl)
{
    adam_cpu cpu = adam_cpu_detect();
    switch (impl) {
    case ADAM_IMPL_AUTO:
    case ADAM_IMPL_SCALAR: return 1;
    case ADAM_IMPL_AVX2: return cpu.avx2;
    case ADAM_IMPL_AVX512:
    case ADAM_IMPL_AVX512_NO_BF16: return cpu.avx512;
    default: return 0;
    }
}

int adam_avx512_has_bf16(void) { return adam_cpu_detect().avx512_bf16; }

adam_impl adam_best_impl(void)
{
    adam_cpu cpu = adam_cpu_detect();
    if (cpu.avx512) return ADAM_IMPL_AVX512;
    if (cpu.avx2) return ADAM_IMPL_AVX2;
    return ADAM_IMPL_SCALAR;
}

const char *adam_impl_name(adam_impl impl)
{
    switch (impl) {
    case ADAM_IMPL_AUTO: return "auto";
    case ADAM_IMPL_SCALAR: return "scalar";
    case ADAM_IMPL_AVX2: return "avx2";
    case ADAM_IMPL_AVX512: return "avx512";
    case ADAM_IMPL_AVX512_NO_BF16: return "avx512-nobf16";
    default: return "?";
    }
}

adam_hparams adam_hparams_default(void)
{
    adam_hparams hp = {
        .lr = 1e-3f,
        .beta1 = 0.9f,
        .beta2 = 0.999f,
        .eps = 1e-8f,
        .weight_decay = 0.01f,
        .decay = ADAM_DECAY_ADAMW,
        .step = 1,
        .grad_mult = 1.0f,
    };
    return hp;
}

zo_status adam_resolve_impl(const char *who, adam_impl impl, adam_impl *out)
{
    if (impl == ADAM_IMPL_AUTO) impl = adam_best_impl();
    if ((int)impl < 0 || impl >= ADAM_IMPL_COUNT)
        return zo_error(ZO_ERR_INVALID, "%s: unknown implementation %d", who, (int)impl);
    if (!adam_impl_supported(impl))
        return zo_error(ZO_ERR_UNSUPPORTED, "%s: this CPU cannot run the %s implementation", who,
                        adam_impl_name(impl));
    *out = impl;
    return ZO_OK;
}

int adam_plan_threads(size_t n, int nthreads)
{
    size_t t = nthreads > 0 ? (size_t)nthreads : (size_t)omp_get_max_threads();
    size_t most = (n + ADAM_MIN_CHUNK - 1) / ADAM_MIN_CHUNK;
    if (t > most) t = most;
    return t < 1 ? 1 : (int)t;
}

void adam_chunk(size_t n, size_t grain, int t, int nt, size_t *lo, size_t *hi)
{
    size_t per = (n + (size_t)nt - 1) / (size_t)nt;
    per = (per + grain - 1) / grain * grain;
    size_t a = (size_t)t * per;
    *lo = a < n ? a : n;
    *hi = n - *lo < per ? n : *lo + per;
}

static int adam_misaligned(const void *p, size_t align) { return ((uintptr_t)p & (align - 1)) != 0; }

/* Whether [a, a + na) and [b, b + nb) share a byte. */
static int adam_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

static zo_status adam_check_dtype(const char *who, const char *what, zo_dtype t, int allow_f32)
{
    if ((int)t < 0 || t >= ZO_DTYPE_COUNT || (!allow_f32 && t == ZO_DTYPE_F32))
        return zo_error(ZO_ERR_INVALID, "%s: %s %d is not %s", who, what, (int)t,
                        allow_f32 ? "fp32, fp16 or bf16" : "fp16 or bf16");
    return ZO_OK;
}

zo_status adam_check_update(const char *who, const adam_hparams *hp, zo_dtype gd, int with_out,
                            zo_dtype od, const adam_array *arr, int na, unsigned optional)
{
    zo_status st;
    if ((st = zo_adam_check_hparams(who, hp)) != ZO_OK) return st;
    if ((st = adam_check_dtype(who, "grad_dtype", gd, 1)) != ZO_OK) return st;
    if (with_out && (st = adam_check_dtype(who, "out_dtype", od, 0)) != ZO_OK) return st;
    if (arr[0].bytes == 0) return ZO_OK; /* n = 0 */
    return adam_check_arrays(who, arr, na, optional);
}

zo_status adam_check_arrays(const char *who, const adam_array *arr, int na, unsigned optional)
{
    for (int a = 0; a < na; a++) {
        if (!arr[a].ptr && !(optional >> a & 1u))
            return zo_error(ZO_ERR_INVALID, "%s: %s is NULL", who, arr[a].name);
        if (arr[a].ptr && adam_misaligned(arr[a].ptr, arr[a].align))
            return zo_error(ZO_ERR_INVALID, "%s: %s %p is not aligned to %zu bytes", who,
                            arr[a].name, arr[a].ptr, arr[a].align);
    }
    for (int a = 0; a < na; a++)
        for (int b = a + 1; b < na; b++)
            if (arr[a].ptr && arr[b].ptr &&
                adam_overlap(arr[a].ptr, arr[a].bytes, arr[b].ptr, arr[b].bytes))
                return zo_error(ZO_ERR_INVALID, "%s: arrays %s and %s overlap", who, arr[a].name,
                                arr[b].name);
    return ZO_OK;
}

static adam_update_fn adam_pick_update(adam_impl impl)
{
    switch (impl) {
    case ADAM_IMPL_AVX2: return adam_update_avx2;
    case ADAM_IMPL_AVX512:
        return adam_avx512_has_bf16() ? adam_update_avx512_bf16 : adam_update_avx512;
    case ADAM_IMPL_AVX512_NO_BF16: return adam_update_avx512;
    default: return adam_update_scalar;
    }
}

static adam_sumsq_fn adam_pick_sumsq(adam_impl impl)
{
    switch (impl) {
    case ADAM_IMPL_AVX2: return adam_sumsq_avx2;
    case ADAM_IMPL_AVX512:
    case ADAM_IMPL_AVX512_NO_BF16: return adam_sumsq_avx512;
    default: return adam_sumsq_scalar;
    }
}

zo_status adam_update_impl(adam_impl impl, const adam_hparams *hp, size_t n, float *param,
                           const void *grad, zo_dtype grad_dtype, float *m, float *v, void *out16,
                           zo_dtype out_dtype, int nthreads)
{
    const char *who = "adam_update";
    zo_status st;
    if ((st = adam_resolve_impl(who, impl, &impl)) != ZO_OK) return st;
    if (n > SIZE_MAX / 4) return zo_error(ZO_ERR_INVALID, "%s: n = %zu too large", who, n);
    size_t gs = zo_dtype_size(grad_dtype), os = out16 ? zo_dtype_size(out_dtype) : 0;
    adam_array arr[5] = {
        {"param", param, 4 * n, 4}, {"m", m, 4 * n, 4}, {"v", v, 4 * n, 4},
        {"grad", grad, gs * n, gs ? gs : 1}, {"out16", out16, os * n, os ? os : 1},
    };
    if ((st = adam_check_update(who, hp, grad_dtype, out16 != NULL, out_dtype, arr, 5, 1u << 4)) !=
        ZO_OK)
        return st;
    if (n == 0) return ZO_OK;

    adam_consts c = zo_adam_consts_make(hp);
    adam_update_fn fn = adam_pick_update(impl);
    int nt = adam_plan_threads(n, nthreads);
    if (nt == 1) {
        fn(&c, n, param, grad, grad_dtype, m, v, out16, out_dtype);
        return ZO_OK;
    }
#pragma omp parallel num_threads(nt)
    {
        size_t lo, hi;
        adam_chunk(n, ADAM_GRAIN, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        if (hi > lo)
            fn(&c, hi - lo, param + lo, (const char *)grad + lo * gs, grad_dtype, m + lo, v + lo,
               out16 ? (char *)out16 + lo * os : NULL, out_dtype);
    }
    return ZO_OK;
}

zo_status adam_update(const adam_hparams *hp, size_t n, float *param, const void *grad,
                      zo_dtype grad_dtype, float *m, float *v, void *out16, zo_dtype out_dtype,
                      int nthreads)
{
    return adam_update_impl(ADAM_IMPL_AUTO, hp, n, param, grad, grad_dtype, m, v, out16,
                            out_dtype, nthreads);
}


zo_status adam_grad_stats_impl(adam_impl impl, const void *grad, zo_dtype grad_dtype, size_t n,
                               int nthreads, double *sumsq, int *nonfinite)
{
    const char *who = "adam_grad_stats";
    zo_status st;
    if (!sumsq || !nonfinite)
        return zo_error(ZO_ERR_INVALID, "%s: NULL result pointer (sumsq %p, nonfinite %p)", who,
                        (void *)sumsq, (void *)nonfinite);
    if ((st = adam_resolve_impl(who, impl, &impl)) != ZO_OK) return st;
    if ((st = adam_check_dtype(who, "grad_dtype", grad_dtype, 1)) != ZO_OK) return st;
    *sumsq = 0.0;
    *nonfinite = 0;
    if (n == 0) return ZO_OK;
    size_t gs = zo_dtype_size(grad_dtype);
    if (!grad) return zo_error(ZO_ERR_INVALID, "%s: grad is NULL", who);
    if (adam_misaligned(grad, gs))
        return zo_error(ZO_ERR_INVALID, "%s: grad %p is not aligned to %zu bytes", who, grad, gs);

    adam_sumsq_fn fn = adam_pick_sumsq(impl);
    int nt = adam_plan_threads(n, nthreads);
    if (nt > ADAM_MAX_THREADS) nt = ADAM_MAX_THREADS;
    double part[ADAM_MAX_THREADS];
    int used = 1;
    if (nt == 1) {
        part[0] = fn(grad, grad_dtype, n);
    } else {
#pragma omp parallel num_threads(nt)
        {
            int t = omp_get_thread_num(), team = omp_get_num_threads();
            size_t lo, hi;
            adam_chunk(n, ADAM_GRAIN, t, team, &lo, &hi);
            part[t] = hi > lo ? fn((const char *)grad + lo * gs, grad_dtype, hi - lo) : 0.0;
            if (t == 0) used = team;
        }
    }
    /* Fixed order: the same (impl, nthreads) gives the same sum. */
    double s = 0.0;
    for (int t = 0; t < used; t++) s += part[t];
    *sumsq = s;
    *nonfinite = !isfinite(s);
    return ZO_OK;
}

zo_status adam_grad_stats(const void *grad, zo_dtype grad_dtype, size_t n, int nthreads,
                          double *sumsq, int *nonfinite)
{
    return adam_grad_stats_impl(ADAM_IMPL_AUTO, grad, grad_dtype, n, nthreads, sumsq, nonfinite);
}
