/* Shape limits: see model_limits.h. */
#include "common/model_limits.h"

#include <math.h>

zo_status zo_model_config_check_limits(const zo_model_config *c)
{
    const char *n = c->name[0] ? c->name : "(unnamed)";
    if (c->params_override) {
        if ((double)c->params_override > ZO_MODEL_MAX_PARAMS)
            return zo_error(ZO_ERR_INVALID, "model %s: %llu parameters is more than 2^53", n,
                            (unsigned long long)c->params_override);
        return ZO_OK;
    }
    if (!isfinite(c->norm_eps) || c->norm_eps < 0)
        return zo_error(ZO_ERR_INVALID, "model %s: the norm epsilon (%s) is %g: it must be finite and "
                        "not negative", n, c->arch == ZO_ARCH_GPT ? "layer_norm_epsilon" : "rms_norm_eps",
                        (double)c->norm_eps);
    if (!isfinite(c->rope_theta) || c->rope_theta < 0)
        return zo_error(ZO_ERR_INVALID, "model %s: rope_theta is %g: it must be finite and not negative",
                        n, (double)c->rope_theta);
    if (c->n_layers > ZO_MODEL_MAX_LAYERS)
        return zo_error(ZO_ERR_INVALID, "model %s: %d layers is more than %d", n, c->n_layers,
                        ZO_MODEL_MAX_LAYERS);
    /* an upper bound of every family's count, in double: the largest tensors
     * and the sum, with every bias and norm and both MLP shapes (GELU: 2 h f,
     * SwiGLU: 3 h f) counted; a layer counted as dense and MoE at once, its
     * attention as MLA (latent, DeepSeek-V2/V3) when kv_rank is set */
    double h = c->hidden, v = c->vocab, f = c->ffn, s = c->max_seq + (double)c->pos_offset;
    double heads = c->n_heads;
    double hd = c->head_dim > 0 ? c->head_dim : (c->n_heads > 0 ? h / c->n_heads : h);
    double q = heads * hd, kv = (double)(c->n_kv_heads > 0 ? c->n_kv_heads : c->n_heads) * hd;
    const zo_mla *a = &c->mla;
    double qr = a->q_rank, kr = a->kv_rank, qk = (double)a->qk_nope + a->qk_rope;
    double mq = heads * qk, mkv = kr * heads * ((double)a->qk_nope + a->v_dim), mo = heads * a->v_dim;
    const zo_moe *e = &c->moe;
    double ex = e->experts, ef = e->expert_ffn, sf = e->shared_ffn;
    struct {
        const char *what;
        double numel;
    } t[] = {
        {"the token embedding (vocab x hidden)", v * h},
        {"the position embedding (positions x hidden)", s * h},
        {"the q/k/v projection ((heads + 2 kv heads) x head_dim x hidden)", (q + 2 * kv) * h},
        {"the attention output (hidden x heads x head_dim)", h * q},
        {"an MLP projection (ffn x hidden)", f * h},
        {"the latent q projection (heads x qk head dims x q_lora_rank, or x hidden)", mq * (qr > h ? qr : h)},
        {"the latent kv projections (kv_lora_rank x heads x (qk_nope + v) head dims)", mkv},
        {"the latent attention output (hidden x heads x v_head_dim)", h * mo},
        {"an expert's projection (expert ffn x hidden)", ef * h},
        {"the shared experts' projection (shared ffn x hidden)", sf * h},
        {"the router (experts x hidden)", ex * h},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (t[i].numel > ZO_MODEL_MAX_PARAMS)
            return zo_error(ZO_ERR_INVALID, "model %s: %s would hold %.4g elements, more than 2^53", n,
                            t[i].what, t[i].numel);
    double attn = (q + 2 * kv) * h + h * q + (q + 2 * kv);
    if (a->kv_rank)
        attn += h * qr + qr * mq + h * mq + h * (kr + a->qk_rope) + mkv + h * mo + qr + kr;
    double mlp = 3 * f * h + 2 * f + h;
    double moe = ex * (3 * ef * h + 2 * ef + h) + ex * h + ex + 3 * sf * h + h;
    double layer = attn + mlp + moe + 8 * h + 4 * hd;
    double total = 2 * v * h + s * h + (double)c->n_layers * layer + 4 * h;
    if (total > ZO_MODEL_MAX_PARAMS)
        return zo_error(ZO_ERR_INVALID, "model %s: %d layers of hidden %d, ffn %d%s and vocab %d make up "
                        "to %.4g parameters, more than 2^53", n, c->n_layers, c->hidden, c->ffn,
                        e->experts ? " (and the experts)" : "", c->vocab, total);
    return ZO_OK;
}
