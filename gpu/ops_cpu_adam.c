/* The CPU backend's Adam / AdamW (gpu_adam_update, and gpu_adam_state_update
 * with m and v in bf16 or 8 bits): the reference sequence of
 * common/adam_math.h, which cpu_adam follows too. Built with -ffp-contract=off
 * so that no multiply-add is fused; tests/test_gpu.c checks the bits against
 * cpu_adam itself. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>

#include "common/adam_math.h" /* defines: zo_adam_step_elem */
#include "common/dtype.h" /* defines: zo_load_f32, zo_store_f32, zo_f32_to_bf16 */
#include "common/nf4.h"   /* defines: zo_dynamic_map, zo_dynamic_map_nearest */
#include "gpu/ops_cpu.h"  /* defines: cpu_adam_update, gpu_adam_consts */


/* param, m, v [n] fp32; grad [n] any dtype; out16 [n] fp16/bf16 or data NULL.
 * Element-wise, so the split among threads does not change a bit. */
void cpu_adam_update(const gpu_adam_consts *c, size_t n, float *param, gpu_tensor grad, float *m,
                     float *v, gpu_tensor out16, int nt)
{
    nt = cpu_team(nt); /* 0: OpenMP's default, as the other ops */
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

/* ---- encoded m and v (gpu_adam_state_update) ------------------------------------------ */

/* bitsandbytes' dynamic maps and their decision thresholds (common/nf4.h),
 * built once. */
typedef struct q8_maps {
    float map_m[256], map_v[256]; /* signed (m), unsigned (v) */
    float thr_m[255], thr_v[255];
} q8_maps;

static q8_maps maps;
static pthread_once_t maps_once = PTHREAD_ONCE_INIT;

static void maps_build(void)
{
    zo_dynamic_map(maps.map_m, 1);
    zo_dynamic_map(maps.map_v, 0);
    zo_dynamic_map_thresholds(maps.thr_m, maps.map_m);
    zo_dynamic_map_thresholds(maps.thr_v, maps.map_v);
}

/* The constants of element i (of the call): the step's, or without weight
 * decay outside the decay ranges (what zo_adam_consts_make gives for a
 * weight decay of 0). */
static const zo_adam_consts *consts_at(const gpu_adam_state_args *x, const zo_adam_consts *nodecay,
                                       uint64_t i)
{
    if (x->n_decay < 0) return &x->c;
    for (int k = 0; k < x->n_decay; k++)
        if (i < x->decay[k][1]) return i >= x->decay[k][0] ? &x->c : nodecay;
    return nodecay;
}

/* One element: the fp32 update on widened m, v (updated in place); the new
 * weight into param, stored as x->round says (comp: Kahan's compensation,
 * read into the weight and written again), and into out16. */
static void state_elem(const gpu_adam_state_args *x, const zo_adam_consts *c, gpu_tensor param, gpu_tensor grad,
                       gpu_tensor out16, uint16_t *comp, uint64_t i, float *m, float *v)
{
    float p = zo_load_f32(param.data, param.dtype, i);
    if (comp) p = p + zo_bf16_to_f32(comp[i]);
    p = zo_adam_step_elem(c, p, zo_load_f32(grad.data, grad.dtype, i), m, v);
    if (x->round == GPU_ADAM_ROUND_NEAREST) {
        zo_store_f32(param.data, param.dtype, i, p);
        if (out16.data) zo_store_f32(out16.data, out16.dtype, i, p);
        return;
    }
    uint16_t w = x->round == GPU_ADAM_ROUND_STOCHASTIC
                     ? zo_f32_to_bf16_sr(p, zo_adam_sr_bits(x->sr_step, x->sr_block, x->sr_first + i))
                     : zo_f32_to_bf16(p);
    ((uint16_t *)param.data)[i] = w;
    if (comp) comp[i] = zo_f32_to_bf16(p - zo_bf16_to_f32(w));
    if (out16.data) zo_store_f32(out16.data, out16.dtype, i, zo_bf16_to_f32(w));
}

/* The absmax a q8 block keeps, from its largest magnitude (as bit
 * patterns: a nan is largest), and the factor its values are coded with:
 * 1/absmax for a normal absmax; 0 for a block of zeros and subnormals
 * (absmax 0) or holding a nan (absmax nan: it reads back as nan). */
static float q8_absmax(uint32_t max_mag, float *inv)
{
    float a = zo_bits_f32(max_mag);
    *inv = a >= FLT_MIN ? 1.0f / a : 0.0f;
    return a >= FLT_MIN || a != a ? a : 0.0f;
}

static uint8_t q8_code(const float thr[255], float x) { return (uint8_t)zo_dynamic_map_nearest(thr, x == x ? x : 0.0f); }

/* Values [lo, lo + len) of the state (one q8 block), element e0 of the call
 * the first. */
static void q8_block(const gpu_adam_state_args *x, const zo_adam_consts *nodecay, gpu_tensor param, gpu_tensor grad,
                     gpu_tensor out16, uint16_t *comp, char *state, uint64_t lo, uint64_t len, uint64_t e0)
{
    uint8_t *qm = (uint8_t *)state + x->off_m + lo, *qv = (uint8_t *)state + x->off_v + lo;
    float *am = (float *)(void *)(state + x->off_am) + lo / x->block;
    float *av = (float *)(void *)(state + x->off_av) + lo / x->block;
    float m[GPU_ADAM_Q8_BLOCK_MAX], v[GPU_ADAM_Q8_BLOCK_MAX];
    uint32_t max_m = 0, max_v = 0;
    for (uint64_t k = 0; k < len; k++) {
        m[k] = maps.map_m[qm[k]] * *am;
        v[k] = maps.map_v[qv[k]] * *av;
        uint64_t i = e0 + k;
        state_elem(x, consts_at(x, nodecay, i), param, grad, out16, comp, i, &m[k], &v[k]);
        uint32_t a = zo_f32_bits(m[k]) & 0x7fffffffu, b = zo_f32_bits(v[k]) & 0x7fffffffu;
        if (a > max_m) max_m = a;
        if (b > max_v) max_v = b;
    }
    float inv_m, inv_v;
    *am = q8_absmax(max_m, &inv_m);
    *av = q8_absmax(max_v, &inv_v);
    for (uint64_t k = 0; k < len; k++) {
        qm[k] = q8_code(maps.thr_m, m[k] * inv_m);
        qv[k] = q8_code(maps.thr_v, v[k] * inv_v);
    }
}

/* param, grad, out16, comp [n]; state: the whole buffer (x's offsets), values
 * [first, first + n) updated. Threads take whole q8 blocks or elements, so
 * the result does not depend on their number. */
void cpu_adam_state_update(const gpu_adam_state_args *x, size_t n, gpu_tensor param, gpu_tensor grad, void *state,
                           gpu_tensor out16, void *comp, int nt)
{
    nt = cpu_team(nt);
    if (n < 65536) nt = 1;
    zo_adam_consts nodecay = x->c;
    nodecay.l2 = 0.0f;
    nodecay.lr_wd = 0.0f;
    char *S = state;
    if (x->type == GPU_ADAM_STATE_F32) {
        float *sm = (float *)(void *)(S + x->off_m) + x->first, *sv = (float *)(void *)(S + x->off_v) + x->first;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
        for (size_t i = 0; i < n; i++) state_elem(x, consts_at(x, &nodecay, i), param, grad, out16, comp, i, &sm[i], &sv[i]);
        return;
    }
    if (x->type == GPU_ADAM_STATE_BF16) {
        uint16_t *sm = (uint16_t *)(void *)(S + x->off_m) + x->first;
        uint16_t *sv = (uint16_t *)(void *)(S + x->off_v) + x->first;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
        for (size_t i = 0; i < n; i++) {
            float m = zo_bf16_to_f32(sm[i]), v = zo_bf16_to_f32(sv[i]);
            state_elem(x, consts_at(x, &nodecay, i), param, grad, out16, comp, i, &m, &v);
            sm[i] = zo_f32_to_bf16(m);
            sv[i] = zo_f32_to_bf16(v);
        }
        return;
    }
    pthread_once(&maps_once, maps_build);
    size_t nblk = (n + x->block - 1) / x->block;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (size_t j = 0; j < nblk; j++) {
        uint64_t e0 = (uint64_t)j * x->block, len = n - e0 < x->block ? n - e0 : x->block;
        q8_block(x, &nodecay, param, grad, out16, comp, S, x->first + e0, len, e0);
    }
}
