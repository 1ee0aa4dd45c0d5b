/* The optimizer step: gradient statistics over every block in a fixed
 * order, the unscale and clip coefficient, then AdamW over every optimizer
 * shard (the device shard enqueued first, so it runs while the host updates
 * its shards), the new weights handed to the weight store as they come. */
#include "offload/offload_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_adam/cpu_adam.h" /* defines: adam_update, adam_grad_stats */

typedef struct step_ctx {
    offload_t *rt;
    adam_hparams hp;
} step_ctx;

/* Where the decay ranges cut block b from element `rel` (of the block):
 * returns the end of the piece starting there (at most `stop`) and whether
 * it decays. */
static size_t decay_piece(const offload_t *rt, int b, size_t rel, size_t stop, int *decay)
{
    *decay = rt->m.decay ? 0 : 1;
    if (!rt->m.decay) return stop;
    for (int i = 0; i < rt->m.n_decay; i++) {
        const offload_decay_range *d = &rt->m.decay[i];
        if (d->block != b || d->offset + d->numel <= rel) continue;
        if (d->offset <= rel) {
            *decay = 1;
            if (d->offset + d->numel < stop) stop = d->offset + d->numel;
        } else if (d->offset < stop) {
            stop = d->offset;
        }
        break; /* sorted: the first range ending after rel decides */
    }
    return stop;
}

/* decay_piece in the optimizer's coordinates of block b (its part; decay
 * ranges are in whole-block coordinates). */
static size_t decay_piece_part(const offload_t *rt, int b, size_t rel, size_t stop, int *decay)
{
    size_t base = offload_dp_part_first(rt->dp, b);
    return decay_piece(rt, b, base + rel, base + stop, decay) - base;
}

/* One AdamW call over the optimizer's flat [a, e) of block b, all with or
 * without decay; P, M, V point at element a; the new weights go to the
 * store. */
static zo_status update_piece(step_ctx *c, int b, size_t a, size_t e, int decay, float *P,
                              float *M, float *V)
{
    offload_t *rt = c->rt;
    wstore *ws = rt->ws;
    size_t rel = a - rt->og.off[b], n = e - a;
    adam_hparams hp = c->hp;
    if (!decay) hp.weight_decay = 0.0f;
    void *dst;
    zo_status st = ws->ops->put_host(ws, b, rel, n, &dst);
    if (st != ZO_OK) return st;
    int wide = rt->m.dtype == ZO_DTYPE_F32;
    st = adam_update(&hp, n, P, rt->grad + rt->goff[b] + rel, ZO_DTYPE_F32, M, V, wide ? NULL : dst, rt->m.dtype,
                     rt->cfg.n_threads);
    if (st != ZO_OK)
        return zo_error_wrap(st, "offload_step: block %d elements %zu..%zu", b, rel, rel + n);
    if (wide) memcpy(dst, P, n * 4);
    return ws->ops->put_host_done(ws, b, rel, n);
}

/* A host shard's update of flat [first, first + n) whose state is P, M, V:
 * split at blocks and at the blocks' decay ranges. */
static zo_status update_host(void *ctx, size_t first, size_t n, float *P, float *M, float *V)
{
    step_ctx *c = ctx;
    offload_t *rt = c->rt;
    const size_t *off = rt->og.off;
    zo_status st;
    size_t pos = first, end = first + n;
    while (pos < end) {
        int b = offload_block_of(&rt->og, pos);
        size_t bend = off[b + 1] < end ? off[b + 1] : end;
        while (pos < bend) {
            int decay;
            size_t stop = decay_piece_part(rt, b, pos - off[b], bend - off[b], &decay);
            size_t e = off[b] + stop, k = pos - first;
            if ((st = update_piece(c, b, pos, e, decay, P + k, M + k, V + k)) != ZO_OK) return st;
            pos = e;
        }
    }
    return ZO_OK;
}

/* The device shard's update of block b, enqueued on s: gpu_adam_update
 * (cpu_adam's arithmetic) over each decay piece, the new weights written
 * where the store takes them from the device. */
static zo_status update_dev(void *ctx, int b, float *P, float *M, float *V, float *G, gpu_stream_t s)
{
    step_ctx *c = ctx;
    offload_t *rt = c->rt;
    wstore *ws = rt->ws;
    size_t nb = rt->og.numel[b], es = rt->g.es;
    int wide = rt->m.dtype == ZO_DTYPE_F32;
    char *dst;
    zo_status st = ws->ops->put_dev(ws, b, (void **)&dst);
    if (st != ZO_OK) return st;
    for (size_t rel = 0; rel < nb;) {
        int decay;
        size_t stop = decay_piece_part(rt, b, rel, nb, &decay);
        gpu_adam_hparams h = c->hp;
        if (!decay) h.weight_decay = 0.0f;
        gpu_tensor out = gpu_t(wide ? NULL : dst + rel * es, rt->m.dtype);
        st = gpu_adam_update(s, &h, stop - rel, P + rel, gpu_t(G + rel, ZO_DTYPE_F32), M + rel, V + rel, out);
        if (st != ZO_OK)
            return zo_error_wrap(st, "offload_step: device share, block %d elements %zu..%zu", b, rel, stop);
        rel = stop;
    }
    if (wide && (st = gpu_memcpy_async(s, dst, P, nb * es, GPU_COPY_DEVICE_TO_DEVICE)) != ZO_OK) return st;
    return ws->ops->put_dev_done(ws, b, s);
}

/* Sum of squares and inf/nan of the step's gradient: the host's blocks in
 * order, then the device shard's; with the optimizer partitioned, each
 * rank's over its parts, then the ranks' in rank order (the same double on
 * every rank). */
static zo_status grad_stats(offload_t *rt, double *sumsq, int *nonfinite)
{
    zo_status st;
    *sumsq = 0.0;
    *nonfinite = 0;
    for (int b = 0; b < rt->dev_block; b++) {
        if (!rt->og.numel[b]) continue;
        double ss;
        int nf;
        if ((st = adam_grad_stats(rt->grad + rt->goff[b], ZO_DTYPE_F32, rt->og.numel[b], rt->cfg.n_threads,
                                  &ss, &nf)) != ZO_OK)
            return st;
        *sumsq += ss;
        *nonfinite |= nf;
    }
    oshard *d = rt->dev_shard;
    if (d && (st = d->ops->grad_stats(d, rt->cfg.adam.clip > 0.0f, sumsq, nonfinite)) != ZO_OK)
        return st;
    if (!offload_dp_partitioned(rt->dp)) return ZO_OK;
    struct {
        double sumsq;
        int32_t nonfinite, pad;
    } mine = {*sumsq, *nonfinite, 0}, *all = calloc((size_t)rt->dp->size, sizeof mine);
    if (!all) return zo_error(ZO_ERR_NOMEM, "offload_step: out of host memory");
    st = offload_dp_gather(rt->dp, &mine, sizeof mine, all);
    *sumsq = 0.0;
    *nonfinite = 0;
    for (int r = 0; r < rt->dp->size && st == ZO_OK; r++) {
        *sumsq += all[r].sumsq;
        *nonfinite |= all[r].nonfinite;
    }
    free(all);
    return st;
}

zo_status offload_optim_step(offload_t *rt, offload_step_info *info)
{
    offload_acct *a = &rt->acct;
    zo_status st;
    info->loss_scale = rt->loss_scale;
    double t0 = offload_now();
    double sumsq;
    int nonfinite;
    if ((st = grad_stats(rt, &sumsq, &nonfinite)) != ZO_OK) return st;
    /* the mean over the global batch: every rank's micro-batches */
    double denom = (double)rt->loss_scale * (double)rt->micro * (rt->dp ? rt->dp->size : 1);
    double norm = sqrt(sumsq) / denom;
    info->grad_norm = (float)norm;
    rt->micro = 0;
    if (nonfinite) {
        /* an overflow: no update, a smaller scale */
        if (rt->dynamic_scale && rt->loss_scale > 1.0f) rt->loss_scale *= 0.5f;
        rt->good_steps = 0;
        rt->skipped++;
        info->skipped = 1;
        info->step = rt->step;
        a->time[OFFLOAD_TIME_OPTIMIZER] += offload_now() - t0;
        return ZO_OK;
    }
    double coef = 1.0;
    if (rt->cfg.adam.clip > 0.0f) {
        double cc = rt->cfg.adam.clip / (norm + 1e-6);
        if (cc < 1.0) coef = cc;
    }
    rt->step++;
    step_ctx c = {.rt = rt};
    c.hp = adam_hparams_default();
    c.hp.lr = rt->cfg.adam.lr;
    c.hp.beta1 = rt->cfg.adam.beta1;
    c.hp.beta2 = rt->cfg.adam.beta2;
    c.hp.eps = rt->cfg.adam.eps;
    c.hp.weight_decay = rt->cfg.adam.weight_decay;
    c.hp.decay = ADAM_DECAY_ADAMW;
    c.hp.step = (long)rt->step;
    c.hp.grad_mult = (float)(coef / denom);
    oshard_update u = {.host = update_host, .dev = update_dev, .ctx = &c};

    /* the device shard first: enqueued, it runs while the host updates the
     * others in flat order (a block split between two host shards is
     * completed by the second) */
    oshard *d = rt->dev_shard;
    if (d) st = d->ops->step(d, &u);
    double t_host = offload_now();
    for (int i = 0; i < rt->n_shards && st == ZO_OK; i++) {
        oshard *sh = rt->shards[i];
        if (sh == d) continue;
        double ts = offload_now();
        st = sh->ops->step(sh, &u);
        /* the NVMe shard splits its own time between disk and optimizer */
        if (sh->tier != OFFLOAD_NVME) a->time[OFFLOAD_TIME_OPTIMIZER] += offload_now() - ts;
    }
    a->time[OFFLOAD_TIME_OPTIMIZER] += t_host - t0;
    /* the device shard's update, then every new weight in the store */
    zo_status sd = d ? d->ops->sync(d) : ZO_OK;
    if (st == ZO_OK) st = sd;
    zo_status sw = rt->ws->ops->sync(rt->ws);
    if (st == ZO_OK) st = sw;
    if (st != ZO_OK) return zo_error_wrap(st, "offload_step %lld", (long long)rt->step);
    if (rt->dynamic_scale && ++rt->good_steps >= rt->cfg.loss_scale_window) {
        rt->loss_scale *= 2.0f;
        rt->good_steps = 0;
    }
    info->step = rt->step;
    return ZO_OK;
}
