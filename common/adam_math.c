#include "adam_math.h"

zo_status zo_adam_check_hparams(const char *who, const zo_adam_hparams *hp)
{
    if (!hp) return zo_error(ZO_ERR_INVALID, "%s: hparams is NULL", who);
    if (!(isfinite(hp->lr) && hp->lr >= 0.0f))
        return zo_error(ZO_ERR_INVALID, "%s: lr = %g must be finite and >= 0", who, hp->lr);
    if (!(hp->beta1 >= 0.0f && hp->beta1 < 1.0f))
        return zo_error(ZO_ERR_INVALID, "%s: beta1 = %g outside [0, 1)", who, hp->beta1);
    if (!(hp->beta2 >= 0.0f && hp->beta2 < 1.0f))
        return zo_error(ZO_ERR_INVALID, "%s: beta2 = %g outside [0, 1)", who, hp->beta2);
    if (!(isfinite(hp->eps) && hp->eps >= 0.0f))
        return zo_error(ZO_ERR_INVALID, "%s: eps = %g must be finite and >= 0", who, hp->eps);
    if (!(isfinite(hp->weight_decay) && hp->weight_decay >= 0.0f))
        return zo_error(ZO_ERR_INVALID, "%s: weight_decay = %g must be finite and >= 0", who,
                        hp->weight_decay);
    if (hp->decay != ZO_ADAM_DECAY_ADAMW && hp->decay != ZO_ADAM_DECAY_L2)
        return zo_error(ZO_ERR_INVALID, "%s: decay %d is neither ADAMW nor L2", who,
                        (int)hp->decay);
    if (hp->step < 1)
        return zo_error(ZO_ERR_INVALID, "%s: step = %ld must be >= 1 (1-based)", who, hp->step);
    if (!(isfinite(hp->grad_mult) && hp->grad_mult > 0.0f))
        return zo_error(ZO_ERR_INVALID, "%s: grad_mult = %g must be finite and > 0 (1 for none)",
                        who, hp->grad_mult);
    return ZO_OK;
}

zo_adam_consts zo_adam_consts_make(const zo_adam_hparams *hp)
{
    double bc1 = 1.0 - pow((double)hp->beta1, (double)hp->step);
    double bc2 = 1.0 - pow((double)hp->beta2, (double)hp->step);
    zo_adam_consts c = {
        .grad_mult = hp->grad_mult,
        .beta1 = hp->beta1,
        .omb1 = (float)(1.0 - (double)hp->beta1),
        .beta2 = hp->beta2,
        .omb2 = (float)(1.0 - (double)hp->beta2),
        .eps = hp->eps,
        .use_l2 = hp->decay == ZO_ADAM_DECAY_L2,
    };
    c.l2 = c.use_l2 ? hp->weight_decay : 0.0f;
    c.lr_wd = c.use_l2 ? 0.0f : (float)((double)hp->lr * (double)hp->weight_decay);
    /* beta = 0 gives bc = 1; beta^step underflowing to 0 likewise. */
    c.step_size = (float)((double)hp->lr / bc1);
    c.inv_bc2_sqrt = (float)(1.0 / sqrt(bc2));
    return c;
}
