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

double adam_sumsq_scalar(const void *g, zo_dtype gd, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double x = zo_load_f32(g, gd, i);
        s += x * x;
    }
    return s;
}
