/* The runtime's life cycle: configuration, allocation of every tier's part,
 * weights in and out, and the measurements. */
#include "offload/offload_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double offload_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *offload_tier_name(offload_tier t)
{
    static const char *n[] = {"gpu", "cpu", "nvme"};
    return t < OFFLOAD_TIERS ? n[t] : "?";
}

zo_status offload_tier_parse(const char *s, const char *what, offload_tier *out)
{
    if (!strcmp(s, "gpu") || !strcmp(s, "device")) *out = OFFLOAD_DEVICE;
    else if (!strcmp(s, "cpu")) *out = OFFLOAD_CPU;
    else if (!strcmp(s, "nvme")) *out = OFFLOAD_NVME;
    else return zo_error(ZO_ERR_INVALID, "%s: '%s' is not a tier (gpu, cpu or nvme)", what, s);
    return ZO_OK;
}

const char *offload_time_part_name(offload_time_part p)
{
    static const char *n[] = {"compute", "weights", "grads", "optimizer", "disk"};
    return p < OFFLOAD_TIME_PARTS ? n[p] : "?";
}

void offload_config_defaults(offload_config *c)
{
    memset(c, 0, sizeof *c);
    c->params_on = OFFLOAD_DEVICE;
    c->opt_frac[OFFLOAD_CPU] = 1.0;
    c->grads_on = OFFLOAD_CPU;
    c->checkpoints_on = OFFLOAD_DEVICE;
    c->prefetch_depth = 2;
    c->sub_group = OFFLOAD_DEFAULT_SUB_GROUP;
    c->swap_buffers = 3;
    c->grad_accum = 1;
    c->adam = (offload_adamw){.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                              .weight_decay = 0.1f, .clip = 1.0f};
}

/* ---- memory accounting ------------------------------------------------------ */

void offload_count(offload_t *rt, offload_tier t, int64_t delta)
{
    rt->use[t] = (uint64_t)((int64_t)rt->use[t] + delta);
    if (rt->use[t] > rt->peak[t]) rt->peak[t] = rt->use[t];
}

zo_status offload_host_alloc(offload_t *rt, size_t bytes, int pinned, void **out)
{
    *out = NULL;
    if (!bytes) return ZO_OK;
    if (pinned) {
        zo_status st = gpu_host_alloc(rt->dev, bytes, out);
        if (st != ZO_OK) return zo_error_wrap(st, "offload: pinned host memory (%zu bytes)", bytes);
    } else {
        *out = malloc(bytes);
        if (!*out) return zo_error(ZO_ERR_NOMEM, "offload: out of host memory (%zu bytes)", bytes);
    }
    offload_count(rt, OFFLOAD_CPU, (int64_t)bytes);
    return ZO_OK;
}

void offload_host_free(offload_t *rt, void *p, size_t bytes, int pinned)
{
    if (!p) return;
    if (pinned) gpu_host_free(rt->dev, p);
    else free(p);
    offload_count(rt, OFFLOAD_CPU, -(int64_t)bytes);
}

void offload_device_peak(offload_t *rt)
{
    gpu_mem_stats ms;
    gpu_mem_get_stats(rt->dev, &ms);
    rt->use[OFFLOAD_DEVICE] = ms.in_use;
    rt->peak[OFFLOAD_DEVICE] = ms.high_water;
}

/* ---- init / free ---------------------------------------------------------------- */

static zo_status check_config(const offload_model *m, const offload_config *c)
{
    if (!m || m->n_blocks < 1 || !m->block_numel || !m->forward || !m->backward)
        return zo_error(ZO_ERR_INVALID, "offload_init: the model needs blocks, forward and backward");
    if (m->dtype != ZO_DTYPE_F32 && m->dtype != ZO_DTYPE_F16 && m->dtype != ZO_DTYPE_BF16)
        return zo_error(ZO_ERR_INVALID, "offload_init: unsupported dtype %d", (int)m->dtype);
    if (c->params_on >= OFFLOAD_TIERS || c->checkpoints_on > OFFLOAD_CPU)
        return zo_error(ZO_ERR_INVALID, "offload_init: checkpoints live on gpu or cpu");
    if (c->prefetch_depth < 0 || c->prefetch_depth > OFFLOAD_MAX_PREFETCH)
        return zo_error(ZO_ERR_INVALID, "offload_init: prefetch depth %d outside 0..%d",
                        c->prefetch_depth, OFFLOAD_MAX_PREFETCH);
    double sum = 0;
    for (int t = 0; t < OFFLOAD_TIERS; t++) {
        if (c->opt_frac[t] < 0 || c->opt_frac[t] > 1)
            return zo_error(ZO_ERR_INVALID, "offload_init: optimizer fraction %s=%g outside [0, 1]",
                            offload_tier_name((offload_tier)t), c->opt_frac[t]);
        sum += c->opt_frac[t];
    }
    if (fabs(sum - 1.0) > 1e-6)
        return zo_error(ZO_ERR_INVALID, "offload_init: optimizer fractions sum to %g, not 1", sum);
    if (c->grads_on != OFFLOAD_DEVICE && c->grads_on != OFFLOAD_CPU)
        return zo_error(ZO_ERR_INVALID, "offload_init: gradients live on gpu or cpu, not %s",
                        offload_tier_name(c->grads_on));
    if (c->recompute && !m->recompute)
        return zo_error(ZO_ERR_INVALID, "offload_init: recompute needs the model's recompute function");
    if (c->checkpoints_on == OFFLOAD_CPU && !c->recompute)
        return zo_error(ZO_ERR_INVALID,
                        "offload_init: checkpoints in host memory need recompute (only block inputs are kept)");
    int nvme = c->params_on == OFFLOAD_NVME || c->opt_frac[OFFLOAD_NVME] > 0;
    if (nvme) {
#ifndef ZO_OFFLOAD_HAVE_NVME
        return zo_error(ZO_ERR_UNSUPPORTED, "offload_init: NVMe tiers need the nvme module (liburing, xxHash)");
#endif
        if (!c->nvme_dir || !*c->nvme_dir)
            return zo_error(ZO_ERR_INVALID, "offload_init: NVMe placement needs an NVMe directory (--nvme-dir)");
    }
    if (c->grad_accum < 0 || c->n_threads < 0 || c->loss_scale < 0 || c->loss_scale_window < 0)
        return zo_error(ZO_ERR_INVALID, "offload_init: negative grad_accum, threads or loss scale");
    return ZO_OK;
}

static int cmp_decay(const void *a, const void *b)
{
    const offload_decay_range *x = a, *y = b;
    if (x->block != y->block) return x->block < y->block ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The optimizer's device share: the suffix of whole blocks whose size is
 * nearest opt_frac[DEVICE] * n (at least one block when the fraction is not
 * 0), so that a block's gradient stays on the device or leaves it whole. */
static void split_device_share(offload_t *rt)
{
    double f = rt->cfg.opt_frac[OFFLOAD_DEVICE];
    rt->dev_block = rt->nb;
    if (f <= 0) {
        rt->dev_first = rt->n;
        return;
    }
    double want = f * (double)rt->n, best = -1;
    for (int b = rt->nb - 1; b >= 0; b--) {
        double d = fabs((double)(rt->n - rt->off[b]) - want);
        if (best < 0 || d < best || rt->dev_block == rt->nb) {
            best = d;
            rt->dev_block = b;
        }
    }
    rt->dev_first = rt->off[rt->dev_block];
}

/* Device buffers of the optimizer's device share: master, m, v and the fp32
 * gradient sum, counted against the device's capacity like everything else. */
static zo_status alloc_device_opt(offload_t *rt)
{
    zo_status st;
    size_t nd = rt->n - rt->dev_first;
    if (!nd) return ZO_OK;
    float **arr[4] = {&rt->d_master, &rt->d_mom, &rt->d_var, &rt->d_grad};
    const char *what[4] = {"fp32 master", "m", "v", "fp32 gradient sum"};
    for (int i = 0; i < 4; i++) {
        if ((st = gpu_mem_alloc(rt->dev, nd * 4, (void **)arr[i])) != ZO_OK)
            return zo_error_wrap(st, "offload_init: optimizer on the device: %s of %zu elements",
                                 what[i], nd);
        if ((st = gpu_memset_async(rt->h2d, *arr[i], 0, nd * 4)) != ZO_OK) return st;
    }
    if ((st = gpu_mem_alloc(rt->dev, 8, &rt->d_stats)) != ZO_OK)
        return zo_error_wrap(st, "offload_init: optimizer on the device: gradient statistics");
    if ((st = gpu_event_create(rt->dev, &rt->d_done)) != ZO_OK) return st;
    return gpu_stream_synchronize(rt->h2d);
}

static zo_status alloc_slots(offload_t *rt)
{
    zo_status st;
    int has_dep = 0;
    for (int b = 0; b < rt->nb; b++) has_dep |= rt->dep[b] >= 0;
    rt->n_slots = rt->cfg.prefetch_depth + 1;
    if (has_dep && rt->n_slots < 2) rt->n_slots = 2;
    if (rt->n_slots > rt->nb) rt->n_slots = rt->nb;
    rt->slots = calloc((size_t)rt->n_slots, sizeof *rt->slots);
    if (!rt->slots) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    for (int i = 0; i < rt->n_slots; i++) {
        offload_slot *sl = &rt->slots[i];
        sl->block = -1;
        if ((st = gpu_mem_alloc(rt->dev, rt->slot_bytes, &sl->buf)) != ZO_OK)
            return zo_error_wrap(st, "offload_init: device weight slot %d of %d (%zu bytes each)", i + 1,
                                 rt->n_slots, rt->slot_bytes);
        if ((st = gpu_event_create(rt->dev, &sl->ready)) != ZO_OK) return st;
        if ((st = gpu_event_create(rt->dev, &sl->freed)) != ZO_OK) return st;
    }
    return ZO_OK;
}

static zo_status alloc_grads(offload_t *rt)
{
    zo_status st;
    /* the pinned halves are one buffer: at step time it holds the fp32
     * gradient of the largest block (the device share's exact statistics) */
    void *pinned;
    if ((st = offload_host_alloc(rt, OFFLOAD_GRAD_SLOTS * rt->slot_bytes, 1, &pinned)) != ZO_OK)
        return st;
    for (int k = 0; k < OFFLOAD_GRAD_SLOTS; k++) {
        offload_gslot *g = &rt->gs[k];
        g->block = -1;
        g->host = (char *)pinned + (size_t)k * rt->slot_bytes;
        if ((st = gpu_mem_alloc(rt->dev, rt->slot_bytes, &g->dev)) != ZO_OK)
            return zo_error_wrap(st, "offload_init: device gradient buffer (%zu bytes)", rt->slot_bytes);
        if ((st = gpu_event_create(rt->dev, &g->done)) != ZO_OK) return st;
        if ((st = gpu_event_create(rt->dev, &g->copied)) != ZO_OK) return st;
    }
    /* the host share's fp32 sum; the device share's is d_grad */
    if ((st = offload_host_alloc(rt, rt->dev_first * sizeof(float), 0, (void **)&rt->grad)) != ZO_OK)
        return zo_error_wrap(st, "offload_init: fp32 gradients");
    if (rt->dev_first) memset(rt->grad, 0, rt->dev_first * sizeof(float));
    for (int k = 0; k < 2; k++) {
        if ((st = gpu_event_create(rt->dev, &rt->stage16_ev[k])) != ZO_OK) return st;
    }
    return gpu_event_create(rt->dev, &rt->prev_done);
}

static zo_status alloc_boundaries(offload_t *rt)
{
    zo_status st;
    size_t nbnd = (size_t)(rt->nb - 1), bytes = rt->m.boundary_bytes;
    if (!nbnd || !bytes) return ZO_OK;
    if (rt->cfg.checkpoints_on == OFFLOAD_DEVICE) {
        rt->bnd = calloc(nbnd, sizeof(void *));
        if (!rt->bnd) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
        for (size_t k = 0; k < nbnd; k++)
            if ((st = gpu_mem_alloc(rt->dev, bytes, &rt->bnd[k])) != ZO_OK)
                return zo_error_wrap(st, "offload_init: activation checkpoint %zu of %zu on the device", k + 1, nbnd);
        return ZO_OK;
    }
    rt->bnd_host = calloc(nbnd, sizeof(void *));
    if (!rt->bnd_host) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    for (size_t k = 0; k < nbnd; k++)
        if ((st = offload_host_alloc(rt, bytes, 1, &rt->bnd_host[k])) != ZO_OK)
            return zo_error_wrap(st, "offload_init: activation checkpoints in host memory");
    for (int k = 0; k < 2; k++) {
        offload_ring *r = &rt->ring[k];
        r->holds = -1;
        if ((st = gpu_mem_alloc(rt->dev, bytes, &r->buf)) != ZO_OK)
            return zo_error_wrap(st, "offload_init: activation ring on the device");
        if ((st = gpu_event_create(rt->dev, &r->used)) != ZO_OK ||
            (st = gpu_event_create(rt->dev, &r->filled)) != ZO_OK ||
            (st = gpu_event_create(rt->dev, &r->saved)) != ZO_OK)
            return st;
    }
    return ZO_OK;
}

static zo_status alloc_store(offload_t *rt)
{
    zo_status st;
    size_t bytes = rt->n * rt->es;
    switch (rt->cfg.params_on) {
    case OFFLOAD_DEVICE:
        if ((st = gpu_mem_alloc(rt->dev, bytes, &rt->store_dev)) != ZO_OK)
            return zo_error_wrap(st, "offload_init: resident weights (%zu bytes) on the device", bytes);
        return ZO_OK;
    case OFFLOAD_CPU:
        if ((st = offload_host_alloc(rt, bytes, 1, &rt->store_host)) != ZO_OK)
            return zo_error_wrap(st, "offload_init: weights in pinned host memory");
        memset(rt->store_host, 0, bytes);
        return alloc_slots(rt);
    default:
        if ((st = alloc_slots(rt)) != ZO_OK) return st;
        rt->par_ring = calloc((size_t)rt->n_slots, sizeof(void *));
        rt->par_ring_ev = calloc((size_t)rt->n_slots, sizeof(gpu_event_t));
        rt->par_ring_used = calloc((size_t)rt->n_slots, sizeof(int));
        if (!rt->par_ring || !rt->par_ring_ev || !rt->par_ring_used)
            return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
        for (int i = 0; i < rt->n_slots; i++) {
            if ((st = offload_host_alloc(rt, rt->slot_bytes, 1, &rt->par_ring[i])) != ZO_OK) return st;
            if ((st = gpu_event_create(rt->dev, &rt->par_ring_ev[i])) != ZO_OK) return st;
        }
        return ZO_OK;
    }
}

zo_status offload_init(offload_t **out, gpu_device_t dev, const offload_model *model,
                       const offload_config *cfg)
{
    *out = NULL;
    zo_status st = check_config(model, cfg);
    if (st != ZO_OK) return st;
    offload_t *rt = calloc(1, sizeof *rt);
    if (!rt) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    rt->dev = dev;
    rt->cfg = *cfg;
    if (!rt->cfg.sub_group) rt->cfg.sub_group = OFFLOAD_DEFAULT_SUB_GROUP;
    if (!rt->cfg.swap_buffers) rt->cfg.swap_buffers = 3;
    if (!rt->cfg.grad_accum) rt->cfg.grad_accum = 1;
    if (!rt->cfg.loss_scale_window) rt->cfg.loss_scale_window = OFFLOAD_LOSS_SCALE_WINDOW;
    rt->m = *model;
    rt->nb = model->n_blocks;
    rt->es = zo_dtype_size(model->dtype);
    rt->nvme_blk = -1;
    int nb = rt->nb;

    rt->numel = calloc((size_t)nb, sizeof(size_t));
    rt->dep = calloc((size_t)nb, sizeof(int));
    rt->off = calloc((size_t)nb + 1, sizeof(size_t));
    rt->sched = calloc(2 * (size_t)nb, sizeof(int));
    if (!rt->numel || !rt->dep || !rt->off || !rt->sched) {
        st = zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
        goto out_free;
    }
    for (int b = 0; b < nb; b++) {
        rt->numel[b] = model->block_numel[b];
        rt->dep[b] = model->block_dep ? model->block_dep[b] : -1;
        if (rt->dep[b] >= nb || rt->dep[b] == b) {
            st = zo_error(ZO_ERR_INVALID, "offload_init: block %d depends on block %d", b, rt->dep[b]);
            goto out_free;
        }
        rt->off[b + 1] = rt->off[b] + rt->numel[b];
        if (rt->numel[b] > rt->largest) rt->largest = rt->numel[b];
    }
    rt->n = rt->off[nb];
    split_device_share(rt);
    rt->slot_bytes = rt->largest * rt->es;
    if (rt->slot_bytes < 256) rt->slot_bytes = 256;
    /* the schedule: forward in order, backward in reverse */
    for (int b = 0; b < nb; b++) {
        rt->sched[b] = b;
        rt->sched[nb + b] = nb - 1 - b;
    }
    rt->n_sched = 2 * nb;
    /* decay ranges, sorted and checked */
    rt->m.block_numel = rt->numel;
    rt->m.block_dep = rt->dep;
    if (model->decay && model->n_decay > 0) {
        rt->decay = calloc((size_t)model->n_decay, sizeof *rt->decay);
        if (!rt->decay) {
            st = zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
            goto out_free;
        }
        memcpy(rt->decay, model->decay, (size_t)model->n_decay * sizeof *rt->decay);
        qsort(rt->decay, (size_t)model->n_decay, sizeof *rt->decay, cmp_decay);
        for (int i = 0; i < model->n_decay; i++) {
            const offload_decay_range *d = &rt->decay[i];
            if (d->block < 0 || d->block >= nb || d->offset + d->numel > rt->numel[d->block] ||
                (i && d->block == rt->decay[i - 1].block &&
                 rt->decay[i - 1].offset + rt->decay[i - 1].numel > d->offset)) {
                st = zo_error(ZO_ERR_INVALID, "offload_init: decay range %d outside its block or overlapping", i);
                goto out_free;
            }
        }
        rt->m.decay = rt->decay;
    } else {
        rt->m.decay = NULL;
        rt->m.n_decay = 0;
    }

    rt->dynamic_scale = model->dtype == ZO_DTYPE_F16;
    rt->loss_scale = cfg->loss_scale > 0 ? cfg->loss_scale
                                         : (rt->dynamic_scale ? OFFLOAD_LOSS_SCALE_INIT : 1.0f);

    if ((st = gpu_stream_create(dev, &rt->h2d)) != ZO_OK) goto out_free;
    if ((st = gpu_stream_create(dev, &rt->d2h)) != ZO_OK) goto out_free;
    if ((st = alloc_store(rt)) != ZO_OK) goto out_free;
    if ((st = alloc_grads(rt)) != ZO_OK) goto out_free;
    if ((st = alloc_boundaries(rt)) != ZO_OK) goto out_free;

    /* optimizer state: the first elements in memory, then NVMe, then the
     * device share (whole blocks at the end) */
    size_t n_nvme = (size_t)llround((double)rt->n * rt->cfg.opt_frac[OFFLOAD_NVME]);
    if (n_nvme > rt->dev_first || rt->cfg.opt_frac[OFFLOAD_CPU] <= 0) n_nvme = rt->dev_first;
    rt->n_cpu = rt->dev_first - n_nvme;
    if ((st = offload_host_alloc(rt, rt->n_cpu * 4, 0, (void **)&rt->master)) != ZO_OK ||
        (st = offload_host_alloc(rt, rt->n_cpu * 4, 0, (void **)&rt->mom)) != ZO_OK ||
        (st = offload_host_alloc(rt, rt->n_cpu * 4, 0, (void **)&rt->var)) != ZO_OK) {
        st = zo_error_wrap(st, "offload_init: optimizer state in memory");
        goto out_free;
    }
    if (rt->n_cpu) {
        memset(rt->master, 0, rt->n_cpu * 4);
        memset(rt->mom, 0, rt->n_cpu * 4);
        memset(rt->var, 0, rt->n_cpu * 4);
    }
    if ((st = offload_nvme_init(rt)) != ZO_OK) goto out_free;
    if ((st = alloc_device_opt(rt)) != ZO_OK) goto out_free;
    offload_device_peak(rt);
    *out = rt;
    return ZO_OK;

out_free:
    offload_free(rt);
    return st;
}

void offload_free(offload_t *rt)
{
    if (!rt) return;
    gpu_device_t d = rt->dev;
    /* let queued copies finish before their buffers go */
    if (rt->h2d) gpu_stream_synchronize(rt->h2d);
    if (rt->d2h) gpu_stream_synchronize(rt->d2h);
    offload_nvme_free(rt);
    if (rt->slots)
        for (int i = 0; i < rt->n_slots; i++) {
            gpu_mem_free(d, rt->slots[i].buf);
            if (rt->slots[i].ready) gpu_event_destroy(rt->slots[i].ready);
            if (rt->slots[i].freed) gpu_event_destroy(rt->slots[i].freed);
        }
    free(rt->slots);
    if (rt->par_ring)
        for (int i = 0; i < rt->n_slots; i++) {
            offload_host_free(rt, rt->par_ring[i], rt->slot_bytes, 1);
            if (rt->par_ring_ev && rt->par_ring_ev[i]) gpu_event_destroy(rt->par_ring_ev[i]);
        }
    free(rt->par_ring);
    free(rt->par_ring_ev);
    free(rt->par_ring_used);
    for (int k = 0; k < OFFLOAD_GRAD_SLOTS; k++) {
        gpu_mem_free(d, rt->gs[k].dev);
        if (rt->gs[k].done) gpu_event_destroy(rt->gs[k].done);
        if (rt->gs[k].copied) gpu_event_destroy(rt->gs[k].copied);
    }
    offload_host_free(rt, rt->gs[0].host, OFFLOAD_GRAD_SLOTS * rt->slot_bytes, 1);
    for (int k = 0; k < 2; k++) {
        if (rt->stage16_ev[k]) gpu_event_destroy(rt->stage16_ev[k]);
        offload_ring *r = &rt->ring[k];
        gpu_mem_free(d, r->buf);
        if (r->used) gpu_event_destroy(r->used);
        if (r->filled) gpu_event_destroy(r->filled);
        if (r->saved) gpu_event_destroy(r->saved);
    }
    if (rt->prev_done) gpu_event_destroy(rt->prev_done);
    if (rt->bnd)
        for (int k = 0; k < rt->nb - 1; k++) gpu_mem_free(d, rt->bnd[k]);
    free(rt->bnd);
    if (rt->bnd_host)
        for (int k = 0; k < rt->nb - 1; k++) offload_host_free(rt, rt->bnd_host[k], rt->m.boundary_bytes, 1);
    free(rt->bnd_host);
    offload_host_free(rt, rt->grad, rt->dev_first * 4, 0);
    gpu_mem_free(d, rt->d_master);
    gpu_mem_free(d, rt->d_mom);
    gpu_mem_free(d, rt->d_var);
    gpu_mem_free(d, rt->d_grad);
    gpu_mem_free(d, rt->d_stats);
    if (rt->d_done) gpu_event_destroy(rt->d_done);
    offload_host_free(rt, rt->master, rt->n_cpu * 4, 0);
    offload_host_free(rt, rt->mom, rt->n_cpu * 4, 0);
    offload_host_free(rt, rt->var, rt->n_cpu * 4, 0);
    offload_host_free(rt, rt->store_host, rt->n * rt->es, 1);
    gpu_mem_free(d, rt->store_dev);
    if (rt->h2d) gpu_stream_destroy(rt->h2d);
    if (rt->d2h) gpu_stream_destroy(rt->d2h);
    free(rt->numel);
    free(rt->dep);
    free(rt->off);
    free(rt->sched);
    free(rt->decay);
    free(rt);
}

/* ---- weights ------------------------------------------------------------------------ */

void offload_slots_invalidate(offload_t *rt)
{
    for (int i = 0; i < rt->n_slots; i++) rt->slots[i].block = -1;
}

/* Convert n fp32 values to the model's dtype. */
static void to_dtype(offload_t *rt, void *dst, const float *src, size_t n)
{
    if (rt->m.dtype == ZO_DTYPE_F32) memcpy(dst, src, n * 4);
    else zo_convert(dst, rt->m.dtype, src, ZO_DTYPE_F32, n);
}

zo_status offload_store_from_master(offload_t *rt, const float *const *blocks)
{
    zo_status st = ZO_OK;
    for (int b = 0; b < rt->nb; b++) {
        size_t n = rt->numel[b];
        if (!n) continue;
        switch (rt->cfg.params_on) {
        case OFFLOAD_CPU:
            to_dtype(rt, (char *)rt->store_host + rt->off[b] * rt->es, blocks[b], n);
            break;
        case OFFLOAD_DEVICE:
            /* through a gradient slot's pinned buffer, one block at a time */
            to_dtype(rt, rt->gs[0].host, blocks[b], n);
            if ((st = gpu_memcpy_async(rt->h2d, (char *)rt->store_dev + rt->off[b] * rt->es,
                                       rt->gs[0].host, n * rt->es, GPU_COPY_HOST_TO_DEVICE)) != ZO_OK ||
                (st = gpu_stream_synchronize(rt->h2d)) != ZO_OK)
                return st;
            break;
        default:
            to_dtype(rt, rt->gs[0].host, blocks[b], n);
            if ((st = offload_par_write(rt, b, rt->gs[0].host)) != ZO_OK) return st;
            break;
        }
    }
    offload_slots_invalidate(rt);
    return ZO_OK;
}

zo_status offload_set_weights(offload_t *rt, const float *const *blocks)
{
    zo_status st;
    if ((st = offload_grads_drain(rt)) != ZO_OK) return st;
    /* the master in memory */
    for (int b = 0; b < rt->nb; b++) {
        size_t lo = rt->off[b], hi = rt->off[b + 1];
        if (lo >= rt->n_cpu) break;
        if (hi > rt->n_cpu) hi = rt->n_cpu;
        memcpy(rt->master + lo, blocks[b], (hi - lo) * 4);
    }
    if (rt->n_cpu) {
        memset(rt->mom, 0, rt->n_cpu * 4);
        memset(rt->var, 0, rt->n_cpu * 4);
    }
    /* and on NVMe, sub-group by sub-group */
    size_t G = offload_opt_groups(rt);
    if (G) {
        size_t gmax = 0;
        for (size_t g = 0; g < G; g++) {
            size_t f, n;
            offload_opt_group_range(rt, g, &f, &n);
            if (n > gmax) gmax = n;
        }
        float *buf = calloc(3 * gmax, sizeof(float));
        if (!buf) return zo_error(ZO_ERR_NOMEM, "offload_set_weights: out of host memory");
        for (size_t g = 0; g < G && st == ZO_OK; g++) {
            size_t f, n;
            offload_opt_group_range(rt, g, &f, &n);
            size_t lo = rt->n_cpu + f, hi = lo + n;
            for (int b = 0; b < rt->nb; b++) {
                size_t a = rt->off[b] > lo ? rt->off[b] : lo, e = rt->off[b + 1] < hi ? rt->off[b + 1] : hi;
                if (a < e) memcpy(buf + (a - lo), blocks[b] + (a - rt->off[b]), (e - a) * 4);
            }
            memset(buf + gmax, 0, 2 * gmax * 4);
            st = offload_opt_store_group(rt, g, buf, buf + gmax, buf + 2 * gmax);
        }
        free(buf);
        if (st != ZO_OK) return st;
    }
    /* and on the device, block by block; moments and gradient sum zeroed */
    for (int b = rt->dev_block; b < rt->nb; b++) {
        size_t rel = rt->off[b] - rt->dev_first;
        if ((st = offload_dev_state_set(rt, 0, rel, rt->numel[b], blocks[b])) != ZO_OK) return st;
    }
    if (rt->d_master) {
        size_t nd = rt->n - rt->dev_first;
        if ((st = offload_dev_state_set(rt, 1, 0, nd, NULL)) != ZO_OK ||
            (st = offload_dev_state_set(rt, 2, 0, nd, NULL)) != ZO_OK ||
            (st = offload_dev_state_set(rt, 3, 0, nd, NULL)) != ZO_OK)
            return st;
    }
    rt->step = 0;
    rt->good_steps = 0;
    rt->skipped = 0;
    rt->micro = 0;
    if (rt->dev_first) memset(rt->grad, 0, rt->dev_first * 4);
    return offload_store_from_master(rt, blocks);
}

zo_status offload_get_weights(offload_t *rt, float *const *blocks)
{
    for (int b = 0; b < rt->nb; b++) {
        size_t lo = rt->off[b], hi = rt->off[b + 1];
        if (lo >= rt->n_cpu) break;
        if (hi > rt->n_cpu) hi = rt->n_cpu;
        memcpy(blocks[b], rt->master + lo, (hi - lo) * 4);
    }
    size_t G = offload_opt_groups(rt);
    zo_status st = ZO_OK;
    for (size_t g = 0; g < G && st == ZO_OK; g++) {
        size_t f, n;
        offload_opt_group_range(rt, g, &f, &n);
        float *buf = malloc(3 * n * sizeof(float));
        if (!buf) return zo_error(ZO_ERR_NOMEM, "offload_get_weights: out of host memory");
        st = offload_opt_load_group(rt, g, buf, buf + n, buf + 2 * n);
        size_t lo = rt->n_cpu + f, hi = lo + n;
        for (int b = 0; b < rt->nb && st == ZO_OK; b++) {
            size_t a = rt->off[b] > lo ? rt->off[b] : lo, e = rt->off[b + 1] < hi ? rt->off[b + 1] : hi;
            if (a < e) memcpy(blocks[b] + (a - rt->off[b]), buf + (a - lo), (e - a) * 4);
        }
        free(buf);
    }
    for (int b = rt->dev_block; b < rt->nb && st == ZO_OK; b++)
        st = offload_dev_state_get(rt, 0, rt->off[b] - rt->dev_first, rt->numel[b], blocks[b]);
    return st;
}

float offload_loss_scale(const offload_t *rt) { return rt->loss_scale; }

void offload_set_lr(offload_t *rt, float lr) { rt->cfg.adam.lr = lr; }

const float *offload_grad(const offload_t *rt, size_t *n)
{
    if (n) *n = rt->dev_first;
    return rt->micro && rt->dev_first ? rt->grad : NULL;
}

size_t offload_block_offset(const offload_t *rt, int block) { return rt->off[block]; }

/* ---- measurements ------------------------------------------------------------------ */

void offload_get_stats(const offload_t *rt, offload_stats *o)
{
    memset(o, 0, sizeof *o);
    gpu_mem_stats ms;
    gpu_mem_get_stats(rt->dev, &ms);
    for (int t = 0; t < OFFLOAD_TIERS; t++) {
        o->peak[t] = rt->peak[t];
        o->in_use[t] = rt->use[t];
    }
    o->peak[OFFLOAD_DEVICE] = ms.high_water;
    o->in_use[OFFLOAD_DEVICE] = ms.in_use;
    o->device_capacity = ms.capacity;
    memcpy(o->time, rt->time, sizeof o->time);
    o->total_s = rt->total_s;
    o->micro_batches = rt->n_micro;
    o->steps = rt->n_steps;
    o->skipped = rt->skipped;
    o->bytes_h2d = rt->bytes_h2d;
    o->bytes_d2h = rt->bytes_d2h;
    o->bytes_disk_read = rt->bytes_disk_read;
    o->bytes_disk_written = rt->bytes_disk_written;
    o->n_slots = rt->n_slots;
    o->slot_bytes = rt->n_slots ? rt->slot_bytes : 0;
}

void offload_reset_times(offload_t *rt)
{
    memset(rt->time, 0, sizeof rt->time);
    rt->total_s = 0;
    rt->n_micro = rt->n_steps = 0;
    rt->bytes_h2d = rt->bytes_d2h = rt->bytes_disk_read = rt->bytes_disk_written = 0;
}
