/* The runtime's public face (offload.h), its top layer: configuration, the
 * life cycle (the layers composed once, from the configuration: the weight
 * stores, the optimizer's state, the optimizer, the gradients, the
 * streaming, the checkpoints), weights in and out block by block, the
 * training entry points and the measurements. struct offload is this
 * file's: every layer below works on its own object. */
#include "offload/offload.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/capability.h" /* defines: zo_capability_check */
#include "common/fileio.h"  /* defines: zo_file_write_json */
#include "common/units.h"   /* defines: zo_format_bytes */
#include "offload/ckpt.h"   /* defines: offload_ckpt */
#include "offload/stream.h" /* defines: offload_stream, offload_grads, offload_optim, ostate, wstore */

#define OFFLOAD_DEFAULT_SUB_GROUP (1u << 20)

_Static_assert(ZO_PLAN_MAX_PREFETCH <= OFFLOAD_MAX_PREFETCH,
               "the plan schema's prefetch limit is one the runtime can run");

struct offload {
    offload_env env;
    offload_acct acct;
    offload_config cfg;
    /* the model, with owned copies of its arrays */
    offload_model m;
    offload_geom g;
    size_t *numel;              /* [nb] */
    size_t *off;                /* [nb + 1] */
    int *dep;                   /* [nb] */
    offload_decay_range *decay; /* [n_decay] sorted by block and offset */

    /* where state lives */
    offload_dp *dp;             /* several ranks (env.dp), or NULL */
    offload_geom og;            /* the optimizer's geometry: the rank's parts (ZeRO 1-3) or the model */
    wstore *ws;                 /* the trainable weights */
    wstore *fws;                /* the frozen base (offload_model.frozen_bytes), or NULL */
    offload_geom fg;            /* its geometry: bytes (es 1) per block */
    size_t *fbytes, *foff;      /* [nb], [nb + 1] */
    offload_part fpart;         /* ZeRO-3: its partition over the ranks (bytes, whole fp32 words a part) */
    offload_geom fog;           /* ZeRO-3: the rank's parts of it */
    ostate *os;                 /* the optimizer's state and the gradient sums */

    offload_stream *sm;         /* a micro-batch: slots, prefetch, activation checkpoints (stream.c) */
    offload_grads *gr;          /* the gradient slots and the way to the sums (grads.c) */
    offload_optim *opt;         /* the step and its schedule (optim.c) */

    offload_ckpt ck;            /* checkpoints, and the folder this runtime holds (ckpt.c) */
};

/* The runtime's names for the run vocabulary's words (common/plan_vocab.h). */
const char *offload_tier_name(offload_tier t) { return zo_plan_tier_name(t); }

zo_status offload_tier_parse(const char *s, const char *what, offload_tier *out)
{
    return zo_plan_tier_parse(s, what, 1, out);
}

const char *offload_schedule_name(offload_schedule s) { return zo_plan_schedule_name(s); }

zo_status offload_schedule_parse(const char *s, const char *what, offload_schedule *out)
{
    return zo_plan_schedule_parse(s, what, out);
}

const char *offload_time_part_name(offload_time_part p)
{
    static const char *n[] = {"compute", "weights", "grads", "optimizer", "disk", "comm"};
    return p < OFFLOAD_TIME_PARTS ? n[p] : "?";
}

void offload_config_defaults(offload_config *c)
{
    memset(c, 0, sizeof *c);
    c->params_on = OFFLOAD_DEVICE;
    c->trainable_on = OFFLOAD_DEVICE;
    c->opt_frac[OFFLOAD_CPU] = 1.0;
    c->checkpoints_on = OFFLOAD_DEVICE;
    c->prefetch_depth = 2;
    c->sub_group = OFFLOAD_DEFAULT_SUB_GROUP;
    c->swap_buffers = 3;
    c->grad_accum = 1;
    c->reduce_dtype = ZO_DTYPE_F32;
    c->state_unfused = getenv("ZO_STATE_UNFUSED") != NULL;
    c->adam = (offload_adamw){.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                              .weight_decay = 0.1f, .clip = 1.0f};
}

/* ---- init / free ---------------------------------------------------------------- */

static void device_peak(offload_t *rt)
{
    gpu_mem_stats ms;
    gpu_mem_get_stats(rt->env.dev, &ms);
    rt->acct.use[OFFLOAD_DEVICE] = ms.in_use;
    rt->acct.peak[OFFLOAD_DEVICE] = ms.high_water;
}

static zo_status check_config(const offload_model *m, const offload_config *c)
{
    if (!m || m->n_blocks < 1 || !m->block_numel || !m->forward || !m->backward)
        return zo_error(ZO_ERR_INVALID, "offload_init: the model needs blocks, forward and backward");
    if (m->dtype != ZO_DTYPE_F32 && m->dtype != ZO_DTYPE_F16 && m->dtype != ZO_DTYPE_BF16)
        return zo_error(ZO_ERR_INVALID, "offload_init: unsupported dtype %d", (int)m->dtype);
    if (c->params_on >= OFFLOAD_TIERS || c->trainable_on >= OFFLOAD_TIERS || c->checkpoints_on > OFFLOAD_CPU)
        return zo_error(ZO_ERR_INVALID, "offload_init: checkpoints live on gpu or cpu");
    if (c->prefetch_depth < 0 || c->prefetch_depth > OFFLOAD_MAX_PREFETCH)
        return zo_error(ZO_ERR_INVALID, "offload_init: prefetch depth %d outside 0..%d",
                        c->prefetch_depth, OFFLOAD_MAX_PREFETCH);
    zo_status st = zo_plan_fractions_check(c->opt_frac, 1, "offload_init", "optimizer fractions");
    if (st != ZO_OK) return st;
    if (c->recompute && !m->recompute)
        return zo_error(ZO_ERR_INVALID, "offload_init: recompute needs the model's recompute function");
    if (c->checkpoints_on == OFFLOAD_CPU && !c->recompute)
        return zo_error(ZO_ERR_INVALID,
                        "offload_init: checkpoints in host memory need recompute (only block inputs are kept)");
    if (c->recompute < OFFLOAD_RECOMPUTE_NONE || c->recompute > OFFLOAD_RECOMPUTE_OPS)
        return zo_error(ZO_ERR_INVALID, "offload_init: recompute %d is not none (0), full (1) or ops (2)",
                        c->recompute);
    if (c->recompute == OFFLOAD_RECOMPUTE_OPS && (c->recompute_layers || c->checkpoints_on == OFFLOAD_CPU))
        return zo_error(ZO_ERR_INVALID, "offload_init: recompute by op keeps every layer's kept outputs on the "
                        "device: it takes no recompute_layers (%d) and no checkpoints in host memory",
                        c->recompute_layers);
    if (c->recompute_layers < 0 || (c->recompute_layers && c->recompute != OFFLOAD_RECOMPUTE_FULL))
        return zo_error(ZO_ERR_INVALID, "offload_init: recompute_layers %d needs recompute (of the first "
                        "layers, K > 0)", c->recompute_layers);
    int layers = 0; /* the model's layers; recompute_layers of them all is every layer */
    for (int b = 0; b < m->n_blocks; b++) {
        int l = m->block_layer ? m->block_layer[b] : b;
        if (l + 1 > layers) layers = l + 1;
    }
    if (c->recompute_layers > layers)
        return zo_error(ZO_ERR_INVALID, "offload_init: recompute_layers %d, but the model has %d layers",
                        c->recompute_layers, layers);
    int k = c->recompute_layers == layers ? 0 : c->recompute_layers;
    if (c->recompute && k != m->recompute_layers)
        return zo_error(ZO_ERR_INVALID, "offload_init: recompute_layers %d, but the model rebuilds the "
                        "activations of its first %d layers (0: every layer)", c->recompute_layers,
                        m->recompute_layers);
    if (c->checkpoints_on == OFFLOAD_CPU && k)
        return zo_error(ZO_ERR_INVALID, "offload_init: checkpoints in host memory need recompute of every "
                        "layer (recompute_layers %d: a layer not recomputed keeps its activations on the "
                        "device)", c->recompute_layers);
    int nvme = c->params_on == OFFLOAD_NVME || c->opt_frac[OFFLOAD_NVME] > 0 ||
               (m->frozen_bytes && c->trainable_on == OFFLOAD_NVME);
    if (nvme) {
#ifndef ZO_OFFLOAD_HAVE_NVME
        return zo_error(ZO_ERR_UNSUPPORTED, "offload_init: NVMe tiers need the nvme module (liburing, xxHash)");
#endif
        if (!c->nvme_dir || !*c->nvme_dir)
            return zo_error(ZO_ERR_INVALID, "offload_init: NVMe placement needs an NVMe directory (--nvme-dir)");
    }
    if (c->grad_accum < 0 || c->n_threads < 0 || c->loss_scale < 0 || c->loss_scale_window < 0 ||
        c->max_skipped_steps < 0 || c->keep_checkpoints < 0 || c->opt_threads < 0 || c->dpu_warmup < 0)
        return zo_error(ZO_ERR_INVALID, "offload_init: negative grad_accum, threads, warmup, loss scale, "
                        "max_skipped_steps or keep_checkpoints");
    if ((unsigned)c->schedule > OFFLOAD_SCHEDULE_DPU)
        return zo_error(ZO_ERR_INVALID, "offload_init: schedule %d is not serial, overlap or dpu", (int)c->schedule);
    /* a forward-only runtime (generation) has no optimizer and no backward */
    if (c->forward_only && ((c->comm && comm_size(c->comm) > 1) || c->recompute || c->ckpt_dir))
        return zo_error(ZO_ERR_INVALID, "offload_init: a forward-only runtime runs one rank, recomputes nothing "
                        "and keeps no checkpoints");
    if ((unsigned)c->opt_state >= ZO_PLAN_STATES)
        return zo_error(ZO_ERR_INVALID, "offload_init: optimizer state encoding %d (fp32, bf16 or 8bit)",
                        (int)c->opt_state);
    if ((unsigned)c->master >= ZO_PLAN_MASTERS)
        return zo_error(ZO_ERR_INVALID, "offload_init: master %d (fp32, none, stochastic or kahan)", (int)c->master);
    if (c->master != ZO_PLAN_MASTER_FP32 && m->dtype != ZO_DTYPE_BF16)
        return zo_error(ZO_ERR_INVALID, "offload_init: --master %s updates bf16 weights; the model's are %s",
                        zo_plan_master_name(c->master), zo_dtype_name(m->dtype));
    if (c->zero_stage < 0 || c->zero_stage > 3)
        return zo_error(ZO_ERR_INVALID, "offload_init: ZeRO stage %d (0, 1, 2 or 3)", c->zero_stage);
    /* what the runtime runs: the table every program asks (common/capability.h) */
    zo_run_shape shape;
    zo_run_shape_defaults(&shape);
    shape.method = m->frozen_bytes ? ZO_PLAN_LORA : ZO_PLAN_FULL;
    shape.ranks = c->comm ? comm_size(c->comm) : 1;
    shape.zero = c->zero_stage;
    shape.schedule = (zo_plan_schedule)c->schedule;
    shape.params = (zo_plan_tier)c->params_on;
    shape.adapters = (zo_plan_tier)c->trainable_on;
    memcpy(shape.optimizer, c->opt_frac, sizeof shape.optimizer);
    shape.optim_dtype = c->opt_state;
    shape.master = c->master;
    shape.moe = m->experts > 0; /* (the model's experts, trained or frozen) */
    shape.ep = c->ep_comm ? comm_size(c->ep_comm) : 1;
    if ((st = zo_capability_check(&shape, NULL, 0)) != ZO_OK) return zo_error_wrap(st, "offload_init");
    return ZO_OK;
}

/* Expert parallelism: each block's routed experts (this rank's), reduced
 * apart from the rest of the block. */
static zo_status set_experts(offload_t *rt, const offload_model *m)
{
    size_t nb = (size_t)rt->g.nb, *lo = calloc(nb, sizeof *lo), *hi = calloc(nb, sizeof *hi);
    size_t *sum = calloc(nb, sizeof *sum);
    zo_status st;
    if (!lo || !hi || !sum) {
        st = zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
        goto out;
    }
    for (size_t b = 0; b < nb; b++) lo[b] = hi[b] = rt->g.numel[b];
    for (int i = 0; i < m->n_expert_ranges; i++) {
        const offload_expert_range *x = &m->expert_ranges[i];
        if (!sum[x->block] || x->offset < lo[x->block]) lo[x->block] = x->offset;
        if (!sum[x->block] || x->offset + x->numel > hi[x->block]) hi[x->block] = x->offset + x->numel;
        sum[x->block] += x->numel;
    }
    /* [lo, hi) is reduced over expert_comm only: nothing of the dense part
     * may lie between two of the rank's experts */
    for (size_t b = 0; b < nb; b++)
        if (sum[b] && sum[b] != hi[b] - lo[b]) {
            st = zo_error(ZO_ERR_INVALID, "offload_init: block %zu's routed experts are not one run "
                          "([%zu, %zu) holds %zu of their elements): expert parallelism reduces that run apart",
                          b, lo[b], hi[b], sum[b]);
            goto out;
        }
    st = offload_dp_set_experts(rt->dp, rt->cfg.expert_comm, rt->g.numel, lo, hi);
out:
    free(lo);
    free(hi);
    free(sum);
    return st;
}

static int cmp_decay(const void *a, const void *b)
{
    const offload_decay_range *x = a, *y = b;
    if (x->block != y->block) return x->block < y->block ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The model's arrays, owned, and its geometry on the flat index. */
static zo_status copy_model(offload_t *rt, const offload_model *model)
{
    int nb = model->n_blocks;
    offload_geom *g = &rt->g;
    rt->m = *model;
    rt->numel = calloc((size_t)nb, sizeof(size_t));
    rt->dep = calloc((size_t)nb, sizeof(int));
    rt->off = calloc((size_t)nb + 1, sizeof(size_t));
    if (!rt->numel || !rt->dep || !rt->off)
        return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    g->nb = nb;
    g->numel = rt->numel;
    g->off = rt->off;
    g->dtype = model->dtype;
    g->es = zo_dtype_size(model->dtype);
    for (int b = 0; b < nb; b++) {
        rt->numel[b] = model->block_numel[b];
        rt->dep[b] = model->block_dep ? model->block_dep[b] : -1;
        if (rt->dep[b] >= nb || rt->dep[b] == b)
            return zo_error(ZO_ERR_INVALID, "offload_init: block %d depends on block %d", b, rt->dep[b]);
        rt->off[b + 1] = rt->off[b] + rt->numel[b];
        if (rt->numel[b] > g->largest) g->largest = rt->numel[b];
    }
    g->n = rt->off[nb];
    g->slot_bytes = g->largest * g->es;
    if (g->slot_bytes < 256) g->slot_bytes = 256;
    rt->m.block_numel = rt->numel;
    rt->m.block_dep = rt->dep;
    if (model->frozen_bytes) {
        /* the frozen base: a geometry of bytes */
        rt->fbytes = calloc((size_t)nb, sizeof(size_t));
        rt->foff = calloc((size_t)nb + 1, sizeof(size_t));
        if (!rt->fbytes || !rt->foff) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
        offload_geom *f = &rt->fg;
        *f = (offload_geom){.nb = nb, .numel = rt->fbytes, .off = rt->foff, .dtype = ZO_DTYPE_F32, .es = 1};
        for (int b = 0; b < nb; b++) {
            rt->fbytes[b] = model->frozen_bytes[b];
            rt->foff[b + 1] = rt->foff[b] + rt->fbytes[b];
            if (rt->fbytes[b] > f->largest) f->largest = rt->fbytes[b];
        }
        f->n = rt->foff[nb];
        f->slot_bytes = (f->largest + 255) & ~(size_t)255;
        rt->m.frozen_bytes = rt->fbytes;
    }
    rt->m.decay = NULL;
    rt->m.n_decay = 0;
    if (!model->decay || model->n_decay <= 0) return ZO_OK;
    /* decay ranges, sorted and checked */
    rt->decay = calloc((size_t)model->n_decay, sizeof *rt->decay);
    if (!rt->decay) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    memcpy(rt->decay, model->decay, (size_t)model->n_decay * sizeof *rt->decay);
    qsort(rt->decay, (size_t)model->n_decay, sizeof *rt->decay, cmp_decay);
    for (int i = 0; i < model->n_decay; i++) {
        const offload_decay_range *d = &rt->decay[i];
        if (d->block < 0 || d->block >= nb || d->offset + d->numel > rt->numel[d->block] ||
            (i && d->block == rt->decay[i - 1].block &&
             rt->decay[i - 1].offset + rt->decay[i - 1].numel > d->offset))
            return zo_error(ZO_ERR_INVALID, "offload_init: decay range %d outside its block or overlapping", i);
    }
    rt->m.decay = rt->decay;
    rt->m.n_decay = model->n_decay;
    return ZO_OK;
}

/* The optimizer's state over its geometry (the rank's parts with ZeRO
 * 1-3): the shards where opt_frac says, and the gradient sums they feed. */
static zo_status create_ostate(offload_t *rt)
{
    const offload_config *c = &rt->cfg;
    ostate_config oc = {.sub_group = c->sub_group, .swap_buffers = c->swap_buffers,
                        .exact_stats = c->adam.clip > 0.0f, .nvme_dir = c->nvme_dir,
                        .state = c->opt_state, .master = c->master};
    memcpy(oc.frac, c->opt_frac, sizeof oc.frac);
    /* without an fp32 master, the host shard's bf16 weights are the store's
     * when it holds them in host memory in the optimizer's order (one rank,
     * or ZeRO 0), memplan's in-place case; with the delayed update, its host
     * copy of the newest weights (over the optimizer's geometry, made by
     * offload_optim_create: bound then) */
    if (c->master != ZO_PLAN_MASTER_FP32 && c->schedule == OFFLOAD_SCHEDULE_DPU && wstore_host_array(rt->ws)) {
        oc.master_in_place = 1;
    } else if (c->master != ZO_PLAN_MASTER_FP32) {
        void *arr = wstore_host_array(rt->ws);
        if (arr && rt->g.n == rt->og.n && rt->g.nb == rt->og.nb &&
            !memcmp(rt->g.off, rt->og.off, (size_t)(rt->g.nb + 1) * sizeof *rt->g.off)) {
            oc.master_in_place = 1;
            oc.master_at = arr;
        }
        /* the whole optimizer on the device beside the weights: their
         * device store's array, memplan's in-place case there */
        void *darr = wstore_dev_array(rt->ws);
        if (darr && c->opt_frac[OFFLOAD_DEVICE] >= 1 - ZO_PLAN_FRACTION_EPS && rt->g.n == rt->og.n &&
            rt->g.nb == rt->og.nb && !memcmp(rt->g.off, rt->og.off, (size_t)(rt->g.nb + 1) * sizeof *rt->g.off))
            oc.dev_master_at = darr;
    }
    return ostate_create(&rt->env, &rt->g, &rt->og, &oc, &rt->os);
}

/* The trainable weights' store on tier `on`: the tier's store; ZeRO 1-2
 * the device store holding every block, padded, the optimizer's parts
 * all-gathered; ZeRO 3 the gathering store over the tier's store of the
 * rank's parts. */
static zo_status create_weights(offload_t *rt, offload_tier on, int ring)
{
    int stage = rt->dp ? rt->dp->stage : 0;
    wstore_config wc = {.tier = on, .dev_puts = !rt->cfg.forward_only && rt->cfg.opt_frac[OFFLOAD_DEVICE] > 0,
                        .chunk = rt->cfg.sub_group,
                        .nvme_dir = rt->cfg.nvme_dir, .name = "par", .ring = ring,
                        .gathered = stage == 1 || stage == 2,
                        .deferred = rt->cfg.schedule != OFFLOAD_SCHEDULE_SERIAL};
    if (stage < 3) return wstore_create(&rt->env, &rt->g, &wc, &rt->ws);
    wstore *inner;
    offload_part part;
    offload_dp_part(rt->dp, &rt->g, &part);
    zo_status st = wstore_create(&rt->env, &rt->og, &wc, &inner);
    return st != ZO_OK ? st : wgather_create(&rt->env, &rt->g, inner, &part, &rt->ws);
}

/* The frozen base's store on params_on: replicated with ZeRO 0-2 (the
 * tier's store of whole blocks); with ZeRO 3 partitioned like the trained
 * weights, the rank's parts of its bytes in the tier's store, gathered
 * block by block into the slots. */
static zo_status create_frozen(offload_t *rt, int ring)
{
    wstore_config fc = {.tier = rt->cfg.params_on, .chunk = rt->cfg.sub_group, .nvme_dir = rt->cfg.nvme_dir,
                        .name = "frz", .ring = ring};
    if (!rt->dp || rt->dp->stage < 3) return wstore_create(&rt->env, &rt->fg, &fc, &rt->fws);
    wstore *inner;
    offload_part view = rt->fpart;
    view.own = NULL; /* the runtime's */
    zo_status st = wstore_create(&rt->env, &rt->fog, &fc, &inner);
    return st != ZO_OK ? st : wgather_create(&rt->env, &rt->fg, inner, &view, &rt->fws);
}

/* Where offload_init's progress stands: the clock, the bytes per tier
 * (the device's from its allocator), the pinned host bytes. */
typedef struct init_mark {
    double t;
    uint64_t use[OFFLOAD_TIERS];
    size_t pinned;
} init_mark;

static void init_mark_now(offload_t *rt, init_mark *m)
{
    gpu_mem_stats ms;
    gpu_mem_get_stats(rt->env.dev, &ms);
    pthread_mutex_lock(&rt->acct.mu);
    memcpy(m->use, rt->acct.use, sizeof m->use);
    pthread_mutex_unlock(&rt->acct.mu);
    m->use[OFFLOAD_DEVICE] = ms.in_use;
    m->pinned = ms.host_pinned;
    m->t = zo_now();
}

/* Part `what` is set up: what it took since *m, to the hook; *m restarts. */
static void init_part_done(offload_t *rt, const char *what, init_mark *m)
{
    if (!rt->cfg.init_hook) return;
    init_mark now;
    init_mark_now(rt, &now);
    offload_init_part p = {.what = what, .seconds = now.t - m->t,
                           .pinned = now.pinned > m->pinned ? now.pinned - m->pinned : 0};
    for (int t = 0; t < OFFLOAD_TIERS; t++) p.bytes[t] = now.use[t] > m->use[t] ? now.use[t] - m->use[t] : 0;
    rt->cfg.init_hook(rt->cfg.init_hook_user, &p);
    init_mark_now(rt, m); /* (the hook's own time is no part's) */
}

zo_status offload_init(offload_t **out, gpu_device_t dev, const offload_model *model,
                       const offload_config *cfg)
{
    *out = NULL;
    zo_status st = check_config(model, cfg);
    if (st != ZO_OK) return st;
    offload_t *rt = calloc(1, sizeof *rt);
    if (!rt) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    rt->cfg = *cfg;
    if (!rt->cfg.sub_group) rt->cfg.sub_group = OFFLOAD_DEFAULT_SUB_GROUP;
    if (!rt->cfg.swap_buffers) rt->cfg.swap_buffers = 3;
    if (!rt->cfg.grad_accum) rt->cfg.grad_accum = 1;
    if (!rt->cfg.loss_scale_window) rt->cfg.loss_scale_window = OFFLOAD_LOSS_SCALE_WINDOW;
    if (!rt->cfg.max_skipped_steps) rt->cfg.max_skipped_steps = OFFLOAD_MAX_SKIPPED_STEPS;
    offload_ckpt_init(&rt->ck);
    pthread_mutex_init(&rt->acct.mu, NULL);
    rt->acct.owner = pthread_self();
    /* a second run on the same checkpoint folder is refused before anything
     * is allocated (several ranks share the folder: rank 0 holds it) */
    if (cfg->ckpt_dir && (!cfg->comm || comm_rank(cfg->comm) == 0) &&
        (st = offload_ckpt_lock(&rt->ck, cfg->ckpt_dir)) != ZO_OK)
        goto out_free;
    rt->env = (offload_env){.dev = dev, .acct = &rt->acct, .n_threads = cfg->n_threads};
    if ((st = copy_model(rt, model)) != ZO_OK) goto out_free;
    if (cfg->comm && comm_size(cfg->comm) > 1) {
        if ((st = offload_dp_create(&rt->env, &rt->g, cfg->comm, cfg->zero_stage, cfg->comm_bucket,
                                     cfg->reduce_dtype, &rt->dp)) != ZO_OK)
            goto out_free;
        rt->env.dp = rt->dp;
        if (cfg->ep_comm && comm_size(cfg->ep_comm) > 1 && (st = set_experts(rt, model)) != ZO_OK) goto out_free;
        /* a slot takes a padded block (the all-gathers and reduce-scatters in place) */
        if (rt->g.slot_bytes < rt->dp->largest_pad * rt->g.es) rt->g.slot_bytes = rt->dp->largest_pad * rt->g.es;
    }
    offload_dp_geom(rt->dp, &rt->g, &rt->og);
    int frozen = model->frozen_bytes != NULL;
    int zero3 = rt->dp && rt->dp->stage >= 3;
    if (frozen && zero3) {
        /* the base partitioned in bytes; a slot takes a padded block */
        if ((st = offload_dp_part_bytes(rt->dp, rt->fg.nb, rt->fbytes, &rt->fpart)) != ZO_OK) goto out_free;
        /* expert parallelism: a block's experts' bytes over expert_comm, the rest over the world */
        if (rt->dp->ep && model->frozen_expert_lo &&
            (st = offload_dp_part_bytes_experts(rt->dp, rt->fbytes, model->frozen_expert_lo, model->frozen_expert_hi,
                                                &rt->fpart)) != ZO_OK)
            goto out_free;
        offload_part_geom(&rt->fpart, &rt->fg, &rt->fog);
        size_t fs = (rt->fpart.largest_pad + 255) & ~(size_t)255;
        if (rt->fg.slot_bytes < fs) rt->fg.slot_bytes = fs;
    }

    init_mark mark;
    init_mark_now(rt, &mark);
    if ((st = gpu_stream_create(dev, &rt->env.h2d)) != ZO_OK) goto out_free;
    if ((st = gpu_stream_create(dev, &rt->env.d2h)) != ZO_OK) goto out_free;
    /* the weights' stores: the trainable ones where params_on says (with a
     * frozen base: where trainable_on says, the base where params_on says);
     * slots for what is streamed (ZeRO-3: the rank's parts gathered into
     * them, wherever the parts live) */
    offload_tier w_on = frozen ? rt->cfg.trainable_on : rt->cfg.params_on;
    int w_streamed = w_on != OFFLOAD_DEVICE || zero3;
    int f_streamed = frozen && (rt->cfg.params_on != OFFLOAD_DEVICE || zero3);
    offload_stream_config sc = {.m = &rt->m, .g = &rt->g, .prefetch_depth = rt->cfg.prefetch_depth,
                                .recompute = rt->cfg.recompute, .recompute_layers = rt->cfg.recompute_layers,
                                .checkpoints_on = rt->cfg.checkpoints_on, .forward_only = rt->cfg.forward_only};
    if (w_streamed || f_streamed) sc.n_slots = offload_stream_slots(&rt->m, rt->cfg.prefetch_depth);
    sc.fslot = f_streamed ? rt->fg.slot_bytes : 0;
    sc.slot_size = sc.fslot + (w_streamed ? rt->g.slot_bytes : 0);
    if ((st = create_weights(rt, w_on, sc.n_slots)) != ZO_OK) goto out_free;
    if (frozen && (st = create_frozen(rt, sc.n_slots)) != ZO_OK) goto out_free;
    init_part_done(rt, "weights", &mark);
    /* an MoE layer's routed experts stream apart where the store can (the
     * host tier, whole blocks on every rank: ZeRO-0): a slot holds the
     * largest dense part, and the experts the batch routes to go through
     * their own slots (each rank fetches those its own batch routes to; a
     * forward-only runtime, generation, those each forward routes to) */
    size_t dense, expert;
    if (sc.n_slots && (!rt->dp || rt->dp->stage == 0) &&
        offload_stream_apart(&rt->m, rt->ws, rt->fws, &dense, &expert)) {
        sc.expert_slots = OFFLOAD_EXPERT_SLOTS;
        sc.expert_numel = expert;
        sc.slot_size = dense * rt->g.es > 256 ? dense * rt->g.es : 256;
    }
    /* the layers above the stores, each on the ones below it (a forward-only
     * runtime has the stores and the streaming alone) */
    if (rt->cfg.forward_only) goto streaming;
    if ((st = create_ostate(rt)) != ZO_OK) goto out_free;
    init_part_done(rt, "optimizer state", &mark);
    if ((st = offload_optim_create(&rt->env, &rt->cfg, &rt->m, &rt->g, &rt->og, rt->ws, rt->os, &rt->opt)) == ZO_OK &&
        rt->cfg.master != ZO_PLAN_MASTER_FP32 && rt->cfg.schedule == OFFLOAD_SCHEDULE_DPU &&
        wstore_host_array(rt->ws))
        ostate_master_at(rt->os, wstore_host_array(offload_optim_shadow(rt->opt)));
    if (st != ZO_OK) goto out_free;
    init_part_done(rt, "optimizer", &mark);
    if ((st = offload_grads_create(&rt->env, &rt->g, &rt->og, rt->dep, rt->cfg.grad_accum, rt->os, rt->opt, &rt->gr)) !=
        ZO_OK)
        goto out_free;
    init_part_done(rt, "gradients", &mark);
streaming:
    sc.ws = rt->ws;
    sc.fws = rt->fws;
    sc.gr = rt->gr;
    sc.opt = rt->opt;
    if ((st = offload_stream_create(&rt->env, &sc, &rt->sm)) != ZO_OK) goto out_free;
    init_part_done(rt, "streaming", &mark);
    /* the checkpoints: the layers they read and write, the folder locked above */
    rt->ck = (offload_ckpt){.env = &rt->env, .cfg = &rt->cfg, .g = &rt->g, .og = &rt->og, .ws = rt->ws,
                            .os = rt->os, .opt = rt->opt, .gr = rt->gr, .lock = rt->ck.lock};
    device_peak(rt);
    *out = rt;
    return ZO_OK;

out_free:
    offload_free(rt);
    return st;
}

void offload_free(offload_t *rt)
{
    if (!rt) return;
    /* the optimizer's thread ends first: its update may use everything */
    offload_optim_free(rt->opt);
    /* let queued copies finish before their buffers go */
    if (rt->env.h2d) gpu_stream_synchronize(rt->env.h2d);
    if (rt->env.d2h) gpu_stream_synchronize(rt->env.d2h);
    offload_stream_free(rt->sm);
    offload_grads_free(rt->gr);
    ostate_free(rt->os);
    wstore_free(rt->ws);
    wstore_free(rt->fws);
    offload_dp_part_free(&rt->fpart);
    free(rt->fbytes);
    free(rt->foff);
    if (rt->env.h2d) gpu_stream_destroy(rt->env.h2d);
    if (rt->env.d2h) gpu_stream_destroy(rt->env.d2h);
    offload_dp_free(rt->dp);
    free(rt->numel);
    free(rt->dep);
    free(rt->off);
    free(rt->decay);
    offload_ckpt_release(&rt->ck);
    pthread_mutex_destroy(&rt->acct.mu);
    free(rt);
}

/* ---- weights in and out, block by block ---------------------------------------------- */

/* What a forward-only runtime has none of: gradients, the optimizer and its state. */
static zo_status trains(const offload_t *rt, const char *fn)
{
    if (!rt->cfg.forward_only) return ZO_OK;
    return zo_error(ZO_ERR_INVALID, "%s: the runtime runs forwards only (offload_config.forward_only): no "
                    "gradients, optimizer state or fp32 master", fn);
}

static zo_status check_block(const offload_t *rt, const char *fn, int block)
{
    if (block < 0 || block >= rt->g.nb)
        return zo_error(ZO_ERR_INVALID, "%s: block %d of %d", fn, block, rt->g.nb);
    return ZO_OK;
}

/* Block b's master and 16-bit weights from w (the whole block: the rank
 * keeps its part), its moments zeroed. */
static zo_status set_block(offload_t *rt, int b, const float *w)
{
    zo_status st;
    size_t bad = offload_find_nonfinite(w, rt->numel[b]);
    if (bad < rt->numel[b])
        return zo_error(ZO_ERR_INVALID, "offload: block %d element %zu is %g: weights must be finite", b,
                        bad, (double)w[bad]);
    /* the rank's part, run by run (a part in segments: expert parallelism) */
    for (size_t rel = 0, run; rt->os && rel < rt->og.numel[b]; rel += run) {
        size_t at = offload_dp_part_at(rt->dp, b, rel, &run);
        if (run > rt->og.numel[b] - rel) run = rt->og.numel[b] - rel;
        if ((st = ostate_write(rt->os, rt->og.off[b] + rel, run, w + at, NULL, NULL)) != ZO_OK) return st;
    }
    return wstore_load_f32(rt->ws, b, 0, rt->numel[b], w);
}

/* Whatever the gradient sums held is dropped: the weights changed. */
static zo_status weights_begin(offload_t *rt)
{
    if (rt->cfg.forward_only) return ZO_OK; /* no optimizer, no gradients */
    zo_status st = offload_optim_settle(rt->opt);
    zo_status sd = offload_grads_drain(rt->gr);
    rt->opt->micro = 0;
    return st != ZO_OK ? st : sd;
}

/* The store holds what was put (the slots see the blocks' new generations). */
static zo_status weights_end(offload_t *rt) { return wstore_settle(rt->ws); }

zo_status offload_set_block(offload_t *rt, int block, const float *w)
{
    zo_status st;
    if ((st = check_block(rt, "offload_set_block", block)) != ZO_OK || (st = weights_begin(rt)) != ZO_OK ||
        (st = set_block(rt, block, w)) != ZO_OK)
        return st;
    return weights_end(rt);
}

zo_status offload_set_frozen_block(offload_t *rt, int block, const void *bytes)
{
    zo_status st = check_block(rt, "offload_set_frozen_block", block);
    if (st != ZO_OK) return st;
    if (!rt->fws) return zo_error(ZO_ERR_INVALID, "offload_set_frozen_block: the model has no frozen base");
    /* every rank sets every block, in the same order: with ZeRO-3 it keeps its part */
    wstore_will_change(rt->fws, block);
    /* the part's runs (one, or a part in segments: expert parallelism), or
     * the whole block in one when the store holds whole blocks */
    int part = rt->fws->part_only;
    size_t n = part ? rt->fpart.part_n[block] : rt->fbytes[block];
    for (size_t rel = 0, run = n; rel < n; rel += run) {
        size_t at = part ? offload_part_at(&rt->fpart, block, rel, &run) : rel;
        if ((st = wstore_put_raw(rt->fws, block, rel, run, (const char *)bytes + at)) != ZO_OK) return st;
    }
    return wstore_settle(rt->fws);
}

zo_status offload_get_frozen_block(offload_t *rt, int block, void *bytes)
{
    zo_status st = check_block(rt, "offload_get_frozen_block", block);
    if (st != ZO_OK || (rt->opt && (st = offload_optim_settle(rt->opt)) != ZO_OK)) return st;
    if (!rt->fws) return zo_error(ZO_ERR_INVALID, "offload_get_frozen_block: the model has no frozen base");
    return rt->fws->ops->get_host(rt->fws, block, bytes);
}

zo_status offload_get_block(offload_t *rt, int block, float *w)
{
    zo_status st = check_block(rt, "offload_get_block", block);
    if (st != ZO_OK || (st = trains(rt, "offload_get_block")) != ZO_OK || (st = offload_optim_settle(rt->opt)) != ZO_OK)
        return st;
    return ostate_get_block(rt->os, block, rt->numel[block], w);
}

zo_status offload_set_weights(offload_t *rt, const float *const *blocks)
{
    zo_status st = weights_begin(rt);
    for (int b = 0; b < rt->g.nb && st == ZO_OK; b++) st = set_block(rt, b, blocks[b]);
    zo_status sw = rt->os ? ostate_sync(rt->os) : ZO_OK;
    if (st == ZO_OK) st = sw;
    sw = weights_end(rt);
    if (st != ZO_OK) return st;
    if (sw != ZO_OK) return sw;
    if (!rt->opt) return ZO_OK;
    rt->opt->ctr.step = 0;
    rt->opt->ctr.good_steps = 0;
    rt->opt->ctr.skipped = 0;
    rt->opt->ctr.skipped_in_a_row = 0;
    return ZO_OK;
}

zo_status offload_get_weights(offload_t *rt, float *const *blocks)
{
    zo_status st = trains(rt, "offload_get_weights");
    if (st != ZO_OK) return st;
    for (int b = 0; b < rt->g.nb; b++)
        if ((st = offload_get_block(rt, b, blocks[b])) != ZO_OK) return st;
    return ostate_sync(rt->os);
}

/* ---- training ------------------------------------------------------------------------ */

zo_status offload_micro_batch(offload_t *rt, gpu_stream_t s)
{
    zo_status tr = trains(rt, "offload_micro_batch");
    if (tr != ZO_OK) return tr;
    double t0 = zo_now();
    offload_set_device_busy(&rt->acct, 1);
    zo_status st = offload_stream_micro_batch(rt->sm, s);
    offload_set_device_busy(&rt->acct, 0);
    if (st != ZO_OK) return st;
    rt->acct.n_micro++;
    device_peak(rt);
    rt->acct.total_s += zo_now() - t0;
    return ZO_OK;
}

zo_status offload_forward(offload_t *rt, gpu_stream_t s)
{
    double t0 = zo_now();
    offload_set_device_busy(&rt->acct, 1);
    zo_status st = offload_stream_forward(rt->sm, s);
    offload_set_device_busy(&rt->acct, 0);
    if (st != ZO_OK) return st;
    device_peak(rt);
    rt->acct.total_s += zo_now() - t0;
    return ZO_OK;
}

zo_status offload_step(offload_t *rt, offload_step_info *info)
{
    double t0 = zo_now();
    memset(info, 0, sizeof *info);
    zo_status st = trains(rt, "offload_step");
    if (st != ZO_OK || (st = offload_grads_drain(rt->gr)) != ZO_OK) return st;
    if (!rt->opt->micro) return zo_error(ZO_ERR_INVALID, "offload_step: no micro-batch since the last step");
    if ((st = offload_grads_reduce(rt->gr)) != ZO_OK) return zo_error_wrap(st, "offload_step: gradient reduction");
    /* the update before this one is done (and, with dpu, published), and
     * the shards hold what was written to them since, unless this step's
     * updates started during backward (they did both) */
    if (!offload_optim_early(rt->opt) &&
        ((st = offload_optim_settle(rt->opt)) != ZO_OK || (st = ostate_sync(rt->os)) != ZO_OK))
        return st;
    st = offload_optim_step(rt->opt, info);
    if (st == ZO_OK && !info->skipped) rt->acct.n_steps++;
    rt->acct.total_s += zo_now() - t0;
    return st;
}

float offload_loss_scale(const offload_t *rt) { return rt->opt ? rt->opt->ctr.loss_scale : 1.0f; }

void offload_set_lr(offload_t *rt, float lr) { rt->cfg.adam.lr = lr; }

const float *offload_grad(const offload_t *rt, size_t *n)
{
    if (!rt->os) {
        if (n) *n = 0;
        return NULL;
    }
    size_t host_n;
    float *sums = ostate_host_sums(rt->os, &host_n);
    if (n) *n = host_n;
    return rt->opt->micro && host_n && !rt->dp ? sums : NULL;
}

size_t offload_block_offset(const offload_t *rt, int block) { return rt->off[block]; }

/* ---- checkpoints (ckpt.c) ------------------------------------------------------------ */

zo_status offload_save_streamed(offload_t *rt, const char *dir, const offload_ckpt_meta *meta,
                                offload_weights_stream writer, void *writer_user)
{
    zo_status st = trains(rt, "offload_save_streamed");
    if (st != ZO_OK) return st;
    return offload_ckpt_save(&rt->ck, dir, meta, writer, writer_user);
}

zo_status offload_save(offload_t *rt, const char *dir, const offload_ckpt_meta *meta,
                       offload_weights_writer writer, void *writer_user)
{
    zo_status st = trains(rt, "offload_save");
    if (st != ZO_OK) return st;
    return offload_ckpt_save_whole(&rt->ck, dir, meta, writer, writer_user);
}

zo_status offload_load(offload_t *rt, const char *dir, offload_ckpt_meta *meta)
{
    zo_status st = trains(rt, "offload_load");
    if (st != ZO_OK) return st;
    return offload_ckpt_load(&rt->ck, dir, meta);
}

zo_status offload_write_weights(offload_t *rt, const char *path, offload_weights_stream writer, void *user)
{
    zo_status st = trains(rt, "offload_write_weights");
    if (st != ZO_OK) return st;
    return offload_ckpt_write_weights(&rt->ck, path, writer, user);
}

/* ---- measurements ------------------------------------------------------------------ */

void offload_get_stats(const offload_t *rt, offload_stats *o)
{
    const offload_acct *a = &rt->acct;
    memset(o, 0, sizeof *o);
    gpu_mem_stats ms;
    gpu_mem_get_stats(rt->env.dev, &ms);
    for (int t = 0; t < OFFLOAD_TIERS; t++) {
        o->peak[t] = a->peak[t];
        o->in_use[t] = a->use[t];
    }
    o->peak[OFFLOAD_DEVICE] = ms.high_water;
    o->in_use[OFFLOAD_DEVICE] = ms.in_use;
    o->device_capacity = ms.capacity;
    memcpy(o->time, a->time, sizeof o->time);
    memcpy(o->time_beside, a->beside, sizeof o->time_beside);
    o->total_s = a->total_s;
    o->micro_batches = a->n_micro;
    o->steps = a->n_steps;
    o->skipped = rt->opt ? rt->opt->ctr.skipped : 0;
    o->bytes_h2d = a->bytes[OFFLOAD_BYTES_H2D];
    o->bytes_d2h = a->bytes[OFFLOAD_BYTES_D2H];
    o->bytes_disk_read = a->bytes[OFFLOAD_BYTES_DISK_READ];
    o->bytes_disk_written = a->bytes[OFFLOAD_BYTES_DISK_WRITTEN];
    pthread_mutex_lock((pthread_mutex_t *)&a->mu);
    o->optimizer_s = a->opt_busy_s;
    o->optimizer_overlap = a->opt_busy_s > 0 ? a->opt_overlap_s / a->opt_busy_s : 0.0;
    pthread_mutex_unlock((pthread_mutex_t *)&a->mu);
    o->n_slots = rt->sm->c.n_slots;
    o->slot_bytes = rt->sm->c.n_slots ? rt->sm->c.slot_size : 0;
    o->bytes_weights = a->weight_bytes;
    o->grad_sums = a->grad_sums;
    o->grad_sums_beside = a->grad_sums_beside;
    o->grad_stats_fused = a->grad_stats_fused;
    o->grad_stats_read = a->grad_stats_read;
    o->state_fused = a->state_fused;
    o->state_decoded = a->state_decoded;
    o->n_expert_slots = rt->sm->c.n_slots ? rt->sm->c.expert_slots : 0;
    o->expert_slot_bytes = o->n_expert_slots ? rt->sm->c.expert_numel * rt->g.es : 0;
    o->experts_fetched = a->experts_fetched;
    o->rank = rt->dp ? rt->dp->rank : 0;
    o->ranks = rt->dp ? rt->dp->size : 1;
    o->comm_elems = a->comm_elems;
    o->comm_pad_elems = a->comm_pad_elems;
    o->comm_calls = a->comm_calls;
    o->comm_reused_elems = rt->dp && rt->dp->stage >= 3 ? a->reused_elems : 0;
    o->comm_frozen_bytes = a->comm_frozen_bytes;
    if (rt->os) ostate_bytes(rt->os, o->optimizer_bytes);
}

zo_status offload_gather(offload_t *rt, const void *mine, size_t bytes, void *all)
{
    if (bytes > OFFLOAD_GATHER_MAX)
        return zo_error(ZO_ERR_INVALID, "offload_gather: %zu bytes (at most %d)", bytes, OFFLOAD_GATHER_MAX);
    if (!rt->dp) {
        memcpy(all, mine, bytes);
        return ZO_OK;
    }
    return offload_dp_gather(rt->dp, mine, bytes, all);
}

void offload_reset_times(offload_t *rt)
{
    offload_acct *a = &rt->acct;
    memset(a->time, 0, sizeof a->time);
    memset(a->beside, 0, sizeof a->beside);
    a->total_s = 0;
    a->n_micro = a->n_steps = 0;
    memset(a->bytes, 0, sizeof a->bytes);
    a->weight_bytes = a->experts_fetched = 0;
    a->opt_busy_s = a->opt_overlap_s = 0;
    a->comm_elems = a->comm_pad_elems = a->reused_elems = a->comm_frozen_bytes = 0;
    a->comm_calls = 0;
    a->grad_sums = a->grad_sums_beside = 0;
    a->grad_stats_fused = a->grad_stats_read = 0;
    a->state_fused = a->state_decoded = 0;
}

void offload_format_peak_vs_plan(char *buf, size_t n, uint64_t measured, const offload_prediction *pr,
                                 offload_tier tier)
{
    char a[32], t[32];
    buf[0] = '\0';
    if (!pr || !pr->present || !pr->alloc[tier]) return;
    int k = snprintf(buf, n, " (plan %s, %.1f%%", zo_format_bytes(pr->alloc[tier], a, sizeof a),
                     100.0 * (double)measured / (double)pr->alloc[tier]);
    if (k < 0 || (size_t)k >= n) return;
    if (pr->peak[tier] > pr->alloc[tier])
        snprintf(buf + k, n - (size_t)k, "; %s with the CUDA context, cuBLAS workspace and allocator allowance)",
                 zo_format_bytes(pr->peak[tier], t, sizeof t));
    else
        snprintf(buf + k, n - (size_t)k, ")");
}

void offload_copy_streams(const offload_t *rt, gpu_stream_t *h2d, gpu_stream_t *d2h)
{
    *h2d = rt->env.h2d;
    *d2h = rt->env.d2h;
}

zo_status offload_write_stats_json(const offload_t *rt, const offload_prediction *pred,
                                   const char *path)
{
    cJSON *o;
    zo_status st = offload_stats_json(rt, pred, &o);
    if (st != ZO_OK) return zo_error_wrap(st, "%s", path);
    st = zo_file_write_json(path, o);
    cJSON_Delete(o);
    return st;
}

zo_status offload_stats_json(const offload_t *rt, const offload_prediction *pred, cJSON **out)
{
    offload_stats s;
    offload_get_stats(rt, &s);
    cJSON *o = cJSON_CreateObject();
    *out = NULL;
    if (!o) return zo_error(ZO_ERR_NOMEM, "the stats: out of host memory");
    cJSON *pk = cJSON_AddObjectToObject(o, "peak_bytes");
    cJSON *pd = pred && pred->present ? cJSON_AddObjectToObject(o, "predicted_bytes") : NULL;
    cJSON *rd = pd ? cJSON_AddObjectToObject(o, "measured_over_predicted") : NULL;
    cJSON *pt = pd ? cJSON_AddObjectToObject(o, "planned_total_bytes") : NULL;
    for (int t = 0; t < OFFLOAD_TIERS; t++) {
        const char *tn = offload_tier_name((offload_tier)t);
        cJSON_AddNumberToObject(pk, tn, (double)s.peak[t]);
        if (pd) { /* the plan's allocations, which the measured peak is */
            cJSON_AddNumberToObject(pd, tn, (double)pred->alloc[t]);
            cJSON_AddNumberToObject(pt, tn, (double)pred->peak[t]);
            if (pred->alloc[t]) cJSON_AddNumberToObject(rd, tn, (double)s.peak[t] / (double)pred->alloc[t]);
            else cJSON_AddNullToObject(rd, tn);
        }
    }
    cJSON_AddNumberToObject(o, "device_capacity", (double)s.device_capacity);
    cJSON *ts = cJSON_AddObjectToObject(o, "time_s");
    for (int p = 0; p < OFFLOAD_TIME_PARTS; p++)
        cJSON_AddNumberToObject(ts, offload_time_part_name((offload_time_part)p), s.time[p]);
    cJSON_AddNumberToObject(ts, "total", s.total_s);
    if (pred && pred->step_s > 0) cJSON_AddNumberToObject(o, "predicted_step_s", pred->step_s);
    cJSON *op = cJSON_AddObjectToObject(o, "optimizer");
    cJSON_AddStringToObject(op, "schedule", offload_schedule_name(rt->cfg.schedule));
    cJSON_AddNumberToObject(op, "host_s", s.optimizer_s);
    cJSON_AddNumberToObject(op, "overlap_fraction", s.optimizer_overlap);
    cJSON_AddNumberToObject(op, "grad_sums", (double)s.grad_sums);
    cJSON_AddNumberToObject(op, "grad_sums_beside", (double)s.grad_sums_beside);
    cJSON_AddNumberToObject(op, "grad_stats_fused", (double)s.grad_stats_fused);
    cJSON_AddNumberToObject(op, "grad_stats_read", (double)s.grad_stats_read);
    cJSON_AddNumberToObject(op, "state_fused", (double)s.state_fused);
    cJSON_AddNumberToObject(op, "state_decoded", (double)s.state_decoded);
    cJSON_AddNumberToObject(o, "micro_batches", (double)s.micro_batches);
    cJSON_AddNumberToObject(o, "steps", (double)s.steps);
    cJSON_AddNumberToObject(o, "skipped", (double)s.skipped);
    cJSON *by = cJSON_AddObjectToObject(o, "bytes_moved");
    cJSON_AddNumberToObject(by, "h2d", (double)s.bytes_h2d);
    cJSON_AddNumberToObject(by, "d2h", (double)s.bytes_d2h);
    cJSON_AddNumberToObject(by, "disk_read", (double)s.bytes_disk_read);
    cJSON_AddNumberToObject(by, "disk_written", (double)s.bytes_disk_written);
    cJSON_AddNumberToObject(by, "weights", (double)s.bytes_weights);
    cJSON_AddNumberToObject(o, "device_slots", s.n_slots);
    cJSON_AddNumberToObject(o, "slot_bytes", (double)s.slot_bytes);
    if (s.n_expert_slots) { /* docs/offload.md, "Experts streamed apart" */
        cJSON_AddNumberToObject(o, "expert_slots", s.n_expert_slots);
        cJSON_AddNumberToObject(o, "expert_slot_bytes", (double)s.expert_slot_bytes);
        cJSON_AddNumberToObject(o, "experts_fetched", (double)s.experts_fetched);
    }
    if (s.ranks > 1) { /* this rank of a data-parallel job (docs/offload.md, "Several ranks") */
        cJSON *cm = cJSON_AddObjectToObject(o, "comm");
        cJSON_AddNumberToObject(cm, "rank", s.rank);
        cJSON_AddNumberToObject(cm, "ranks", s.ranks);
        cJSON_AddNumberToObject(cm, "elements", (double)s.comm_elems);
        cJSON_AddNumberToObject(cm, "reused_elements", (double)s.comm_reused_elems);
        cJSON_AddNumberToObject(cm, "padding_elements", (double)s.comm_pad_elems);
        cJSON_AddNumberToObject(cm, "collectives", (double)s.comm_calls);
        if (s.comm_frozen_bytes) cJSON_AddNumberToObject(cm, "frozen_base_bytes", (double)s.comm_frozen_bytes);
    }
    *out = o;
    return ZO_OK;
}
