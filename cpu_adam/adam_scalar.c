/* The scalar reference: one element at a time, the sequence of
 * adam_step_elem, conversions from common/dtype.h. Readable first; the vector
 * kernels are tested against it bit for bit. */
#include "adam_kernels.h"

void adam_update_scalar(const adam_consts *c, size_t n, float *restrict p,
                        const void *restrict g, zo_dtype gd, float *restrict m,
                        float *restrict v, void *restrict out, zo_dtype od)
{
    adam_update_scalar_range(c, 0, n, p, g, gd, m, v, out, od);
}

double adam_sumsq_part_scalar(adam_sumsq_acc *acc, const void *g, zo_dtype gd, size_t n, int last)
{
    double s = acc->lane[0];
    for (size_t i = 0; i < n; i++) {
        double x = zo_load_f32(g, gd, i);
        s += x * x;
    }
    acc->lane[0] = s;
    return last ? s : 0.0;
}

double adam_sumsq_scalar(const void *g, zo_dtype gd, size_t n)
{
    adam_sumsq_acc acc = {{0}};
    return adam_sumsq_part_scalar(&acc, g, gd, n, 1);
}

void adam_update_bf16s_scalar(const adam_consts *c, size_t n, float *restrict p,
                              const void *restrict g, zo_dtype gd, uint16_t *restrict m,
                              uint16_t *restrict v, void *restrict out, zo_dtype od)
{
    adam_update_bf16s_range(c, 0, n, p, g, gd, m, v, out, od);
}

void adam_q8_encode_scalar(const adam_q8_tables *t, size_t n, const float *m, const float *v,
                           uint8_t *qm, uint8_t *qv, float *am, float *av)
{
    uint32_t max_m = 0, max_v = 0;
    for (size_t i = 0; i < n; i++) {
        if (adam_q8_mag(m[i]) > max_m) max_m = adam_q8_mag(m[i]);
        if (adam_q8_mag(v[i]) > max_v) max_v = adam_q8_mag(v[i]);
    }
    float inv_m, inv_v;
    *am = adam_q8_scale(max_m, &inv_m);
    *av = adam_q8_scale(max_v, &inv_v);
    for (size_t i = 0; i < n; i++) {
        qm[i] = adam_q8_code(t->thr_m, m[i] * inv_m);
        qv[i] = adam_q8_code(t->thr_v, v[i] * inv_v);
    }
}

void adam_q8_encode_blocks_scalar(const adam_q8_tables *t, size_t block, size_t n,
                                  const float *restrict m, const float *restrict v,
                                  uint8_t *restrict qm, uint8_t *restrict qv, float *restrict am,
                                  float *restrict av)
{
    for (size_t i = 0, b = 0; i < n; i += block, b++)
        adam_q8_encode_scalar(t, n - i < block ? n - i : block, m + i, v + i, qm + i, qv + i,
                              am + b, av + b);
}

void adam_q8_decode_scalar(const adam_q8_tables *t, size_t block, size_t n,
                           const uint8_t *restrict qm, const uint8_t *restrict qv,
                           const float *restrict am, const float *restrict av, float *restrict m,
                           float *restrict v)
{
    /* as the step dequantizes */
    for (size_t i = 0; i < n; i++) {
        m[i] = t->map_m[qm[i]] * am[i / block];
        v[i] = t->map_v[qv[i]] * av[i / block];
    }
}

void adam_bf16_decode_scalar(size_t n, const uint16_t *restrict qm, const uint16_t *restrict qv,
                             float *restrict m, float *restrict v)
{
    for (size_t i = 0; i < n; i++) {
        m[i] = zo_bf16_to_f32(qm[i]);
        v[i] = zo_bf16_to_f32(qv[i]);
    }
}

void adam_bf16_encode_scalar(size_t n, const float *restrict m, const float *restrict v,
                             uint16_t *restrict qm, uint16_t *restrict qv)
{
    for (size_t i = 0; i < n; i++) {
        qm[i] = zo_f32_to_bf16(m[i]);
        qv[i] = zo_f32_to_bf16(v[i]);
    }
}

/* One block of n <= ADAM_Q8_BLOCK_MAX elements: dequantize, update in fp32
 * (the parameters from the unrounded moments), code the new moments. */
static void q8_block_scalar(const adam_consts *c, const adam_q8_tables *t, size_t n,
                            float *restrict p, const void *restrict g, zo_dtype gd,
                            uint8_t *restrict qm, uint8_t *restrict qv, float *restrict am,
                            float *restrict av, void *restrict out, zo_dtype od)
{
    float m[ADAM_Q8_BLOCK_MAX], v[ADAM_Q8_BLOCK_MAX];
    for (size_t i = 0; i < n; i++) {
        m[i] = t->map_m[qm[i]] * *am;
        v[i] = t->map_v[qv[i]] * *av;
        p[i] = adam_step_elem(c, p[i], zo_load_f32(g, gd, i), &m[i], &v[i]);
        if (out) zo_store_f32(out, od, i, p[i]);
    }
    adam_q8_encode_scalar(t, n, m, v, qm, qv, am, av);
}

void adam_update_q8_scalar(const adam_consts *c, const adam_q8_tables *t, size_t block,
                           size_t n, float *restrict p, const void *restrict g, zo_dtype gd,
                           uint8_t *restrict qm, uint8_t *restrict qv, float *restrict am,
                           float *restrict av, void *restrict out, zo_dtype od)
{
    size_t gs = zo_dtype_size(gd), os = out ? zo_dtype_size(od) : 0;
    for (size_t i = 0, b = 0; i < n; i += block, b++) {
        size_t len = n - i < block ? n - i : block;
        q8_block_scalar(c, t, len, p + i, (const char *)g + i * gs, gd, qm + i, qv + i, am + b,
                        av + b, out ? (char *)out + i * os : NULL, od);
    }
}
