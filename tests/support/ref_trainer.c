/* The reference trainer: master weights, AdamW and the per-step data flow
 * between host and device, every block resident. */
#include "tests/support/ref_trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LOSS_SCALE_INIT 65536.0f
#define LOSS_SCALE_WINDOW 200 /* good steps before the scale doubles */

zo_status tf_trainer_init(tf_trainer *tr, tf_model *m, const tf_adamw *opt)
{
    memset(tr, 0, sizeof *tr);
    tr->m = m;
    tr->opt = *opt;
    tr->n_blocks = m->layout.n_blocks;
    tr->loss_scale = m->dtype == ZO_DTYPE_F16 ? LOSS_SCALE_INIT : 1.0f;
    int nb = tr->n_blocks;
    zo_status st = ZO_OK;
    tr->master = calloc(nb, sizeof(float *));
    tr->grad = calloc(nb, sizeof(float *));
    tr->adam_m = calloc(nb, sizeof(float *));
    tr->adam_v = calloc(nb, sizeof(float *));
    tr->params = calloc(nb, sizeof(void *));
    tr->grads = calloc(nb, sizeof(void *));
    if (!tr->master || !tr->grad || !tr->adam_m || !tr->adam_v || !tr->params || !tr->grads) {
        st = zo_error(ZO_ERR_NOMEM, "tf_trainer_init: out of host memory");
        goto out_free;
    }
    size_t largest = 0;
    for (int b = 0; b < nb; b++) {
        size_t n = m->layout.block_numel[b];
        if (n == 0) n = 1; /* a tied head with no bias still gets a (tiny) buffer */
        tr->master[b] = calloc(n, sizeof(float));
        tr->grad[b] = calloc(n, sizeof(float));
        tr->adam_m[b] = calloc(n, sizeof(float));
        tr->adam_v[b] = calloc(n, sizeof(float));
        if (!tr->master[b] || !tr->grad[b] || !tr->adam_m[b] || !tr->adam_v[b]) {
            st = zo_error(ZO_ERR_NOMEM, "tf_trainer_init: out of host memory for block %d", b);
            goto out_free;
        }
        size_t bytes = n * zo_dtype_size(m->dtype);
        if (bytes > largest) largest = bytes;
        char name[32];
        if ((st = gpu_mem_alloc(m->dev, bytes, &tr->params[b])) != ZO_OK ||
            (st = gpu_mem_alloc(m->dev, bytes, &tr->grads[b])) != ZO_OK) {
            st = zo_error_wrap(st, "parameters of %s",
                               model_layout_block_name(&m->layout, b, name, sizeof name));
            goto out_free;
        }
    }
    if ((st = gpu_host_alloc(m->dev, largest, &tr->staging)) != ZO_OK) goto out_free;
    if ((st = gpu_mem_alloc(m->dev, 8, (void **)&tr->d_sumsq)) != ZO_OK) goto out_free;
    if ((st = gpu_mem_alloc(m->dev, 4, (void **)&tr->d_flag)) != ZO_OK) goto out_free;
    return ZO_OK;

out_free:
    tf_trainer_free(tr);
    return st;
}

void tf_trainer_free(tf_trainer *tr)
{
    if (!tr->m) return;
    gpu_device_t d = tr->m->dev;
    for (int b = 0; b < tr->n_blocks; b++) {
        if (tr->master) free(tr->master[b]);
        if (tr->grad) free(tr->grad[b]);
        if (tr->adam_m) free(tr->adam_m[b]);
        if (tr->adam_v) free(tr->adam_v[b]);
        if (tr->params) gpu_mem_free(d, tr->params[b]);
        if (tr->grads) gpu_mem_free(d, tr->grads[b]);
    }
    free(tr->master);
    free(tr->grad);
    free(tr->adam_m);
    free(tr->adam_v);
    free(tr->params);
    free(tr->grads);
    gpu_host_free(d, tr->staging);
    gpu_mem_free(d, tr->d_sumsq);
    gpu_mem_free(d, tr->d_flag);
    memset(tr, 0, sizeof *tr);
}

zo_status tf_trainer_upload(tf_trainer *tr, gpu_stream_t s)
{
    zo_dtype dt = tr->m->dtype;
    for (int b = 0; b < tr->n_blocks; b++) {
        size_t n = tr->m->layout.block_numel[b];
        if (!n) continue;
        /* the staging buffer is reused per block: wait for the previous copy */
        zo_status st = gpu_stream_synchronize(s);
        if (st != ZO_OK) return st;
        zo_convert(tr->staging, dt, tr->master[b], ZO_DTYPE_F32, n);
        st = gpu_memcpy_async(s, tr->params[b], tr->staging, n * zo_dtype_size(dt),
                              GPU_COPY_HOST_TO_DEVICE);
        if (st != ZO_OK) return st;
    }
    return gpu_stream_synchronize(s);
}

zo_status tf_trainer_grads(tf_trainer *tr, gpu_stream_t s, const int32_t *inputs,
                           const int32_t *targets, int b, int t, tf_step_info *info)
{
    tf_model *m = tr->m;
    zo_dtype dt = m->dtype;
    zo_status st;
    memset(info, 0, sizeof *info);
    if ((st = tf_set_batch(m, s, inputs, targets, b, t)) != ZO_OK) return st;
    for (int i = 0; i < tr->n_blocks; i++)
        if (m->layout.block_numel[i] &&
            (st = gpu_memset_async(s, tr->grads[i], 0, tf_block_bytes(m, i))) != ZO_OK)
            return st;
    if ((st = tf_forward(m, tr->params, s)) != ZO_OK) return st;
    if ((st = tf_backward(m, tr->params, tr->grads, tr->loss_scale, s)) != ZO_OK) return st;
    /* overflow check and sum of squares on the device, over every block */
    if ((st = gpu_memset_async(s, tr->d_sumsq, 0, 8)) != ZO_OK) return st;
    if ((st = gpu_memset_async(s, tr->d_flag, 0, 4)) != ZO_OK) return st;
    for (int i = 0; i < tr->n_blocks; i++) {
        size_t n = m->layout.block_numel[i];
        if (!n) continue;
        if ((st = gpu_check_finite(s, tr->d_flag, gpu_t(tr->grads[i], dt), n)) != ZO_OK) return st;
        if ((st = gpu_sum_squares(s, tr->d_sumsq, gpu_t(tr->grads[i], dt), n)) != ZO_OK) return st;
    }
    if ((st = tf_loss(m, s, &info->loss)) != ZO_OK) return st; /* synchronizes */
    double sumsq;
    int32_t flag;
    if ((st = gpu_memcpy_async(s, &sumsq, tr->d_sumsq, 8, GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
        (st = gpu_memcpy_async(s, &flag, tr->d_flag, 4, GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
        (st = gpu_stream_synchronize(s)) != ZO_OK)
        return st;
    info->skipped = flag != 0;
    info->grad_norm = (float)(sqrt(sumsq) / tr->loss_scale);
    /* gradients to the host as fp32, unscaled */
    float inv = 1.0f / tr->loss_scale;
    for (int i = 0; i < tr->n_blocks; i++) {
        size_t n = m->layout.block_numel[i];
        if (!n) continue;
        if ((st = gpu_memcpy_async(s, tr->staging, tr->grads[i], n * zo_dtype_size(dt),
                                   GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
            (st = gpu_stream_synchronize(s)) != ZO_OK)
            return st;
        zo_convert(tr->grad[i], ZO_DTYPE_F32, tr->staging, dt, n);
        if (inv != 1.0f)
            for (size_t e = 0; e < n; e++) tr->grad[i][e] *= inv;
    }
    return ZO_OK;
}

/* AdamW over one tensor (torch.optim.AdamW semantics, decoupled decay). */
static void adamw_tensor(const tf_adamw *o, float *p, const float *g, float *mo, float *vo,
                         size_t n, float scale, int decay, int64_t step)
{
    float bc1 = 1.0f - powf(o->beta1, (float)step), bc2 = 1.0f - powf(o->beta2, (float)step);
    float step_size = o->lr / bc1, bc2_sqrt = sqrtf(bc2);
    float wd = decay ? o->lr * o->weight_decay : 0.0f;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * scale;
        p[i] *= 1.0f - wd;
        mo[i] = o->beta1 * mo[i] + (1.0f - o->beta1) * gi;
        vo[i] = o->beta2 * vo[i] + (1.0f - o->beta2) * gi * gi;
        p[i] -= step_size * mo[i] / (sqrtf(vo[i]) / bc2_sqrt + o->eps);
    }
}

zo_status tf_trainer_step(tf_trainer *tr, gpu_stream_t s, const int32_t *inputs,
                          const int32_t *targets, int b, int t, tf_step_info *info)
{
    zo_status st = tf_trainer_grads(tr, s, inputs, targets, b, t, info);
    if (st != ZO_OK) return st;
    if (info->skipped) { /* fp16 overflow: smaller scale, no update */
        if (tr->loss_scale > 1.0f) tr->loss_scale *= 0.5f;
        tr->good_steps = 0;
        tr->skipped++;
        return ZO_OK;
    }
    if (tr->m->dtype == ZO_DTYPE_F16 && ++tr->good_steps >= LOSS_SCALE_WINDOW) {
        tr->loss_scale *= 2.0f;
        tr->good_steps = 0;
    }
    /* clip as torch.nn.utils.clip_grad_norm_ */
    float scale = 1.0f;
    if (tr->opt.clip > 0.0f) {
        float coef = tr->opt.clip / (info->grad_norm + 1e-6f);
        if (coef < 1.0f) scale = coef;
    }
    tr->step++;
    const model_layout *l = &tr->m->layout;
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *te = &l->tensors[i];
        int blk = te->block;
        adamw_tensor(&tr->opt, tr->master[blk] + te->offset, tr->grad[blk] + te->offset,
                     tr->adam_m[blk] + te->offset, tr->adam_v[blk] + te->offset, te->numel, scale,
                     model_tensor_decays(te), tr->step);
    }
    return tf_trainer_upload(tr, s);
}
