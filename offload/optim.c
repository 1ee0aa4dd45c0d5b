/* The optimizer step: gradient statistics, loss scaling and clipping, CPU
 * AdamW over sub-groups of the fp32 master state (in memory, or on NVMe
 * through the pipelined step), new weights into the parameter store. */
#include "offload/offload_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_adam/cpu_adam.h" /* defines: adam_update, adam_grad_stats */

#define TRY(expr)                                                                           \
    do {                                                                                    \
        zo_status try_s_ = (expr);                                                          \
        if (try_s_ != ZO_OK) return try_s_;                                                 \
    } while (0)

typedef struct step_ctx {
    offload_t *rt;
    adam_hparams hp;
    int asm_k;           /* gradient slot whose pinned buffer assembles the current block */
    int asm_block;       /* the block being assembled, -1 none */
} step_ctx;

/* ---- where the new 16-bit weights go ---------------------------------------------- */

/* Start block b's assembly buffer (device and NVMe tiers). */
static zo_status assembly_begin(step_ctx *c, int b)
{
    offload_t *rt = c->rt;
    if (c->asm_block == b) return ZO_OK;
    c->asm_block = b;
    if (rt->cfg.params_on != OFFLOAD_DEVICE) return ZO_OK; /* NVMe writes synchronously */
    c->asm_k ^= 1;
    if (rt->stage16_pending[c->asm_k]) {
        double t0 = offload_now();
        zo_status st = gpu_event_synchronize(rt->stage16_ev[c->asm_k]);
        rt->time[OFFLOAD_TIME_OPTIMIZER] += offload_now() - t0;
        rt->stage16_pending[c->asm_k] = 0;
        if (st != ZO_OK) return st;
    }
    return ZO_OK;
}

/* Block b's new weights are complete in the assembly buffer. */
static zo_status assembly_end(step_ctx *c, int b)
{
    offload_t *rt = c->rt;
    void *buf = rt->gs[c->asm_k].host;
    size_t bytes = rt->numel[b] * rt->es;
    c->asm_block = -1;
    if (rt->cfg.params_on == OFFLOAD_DEVICE) {
        TRY(gpu_memcpy_async(rt->h2d, (char *)rt->store_dev + rt->off[b] * rt->es, buf, bytes,
                             GPU_COPY_HOST_TO_DEVICE));
        TRY(gpu_event_record(rt->stage16_ev[c->asm_k], rt->h2d));
        rt->stage16_pending[c->asm_k] = 1;
        rt->bytes_h2d += bytes;
        return ZO_OK;
    }
    double t0 = offload_now();
    zo_status st = offload_par_write(rt, b, buf);
    rt->time[OFFLOAD_TIME_DISK] += offload_now() - t0;
    rt->bytes_disk_written += bytes;
    return st;
}

static void *dest16(step_ctx *c, int b, size_t a)
{
    offload_t *rt = c->rt;
    if (rt->cfg.params_on == OFFLOAD_CPU) return (char *)rt->store_host + a * rt->es;
    return (char *)rt->gs[c->asm_k].host + (a - rt->off[b]) * rt->es;
}

/* One AdamW call over flat [a, e) of block b, all with or without decay;
 * P, M, V point at element a. */
static zo_status update_piece(step_ctx *c, int b, size_t a, size_t e, int decay, float *P,
                              float *M, float *V)
{
    offload_t *rt = c->rt;
    adam_hparams hp = c->hp;
    if (!decay) hp.weight_decay = 0.0f;
    void *dst = dest16(c, b, a);
    int wide = rt->m.dtype == ZO_DTYPE_F32;
    zo_status st = adam_update(&hp, e - a, P, rt->grad + a, ZO_DTYPE_F32, M, V, wide ? NULL : dst,
                               rt->m.dtype, rt->cfg.n_threads);
    if (st != ZO_OK) return zo_error_wrap(st, "offload_step: block %d elements %zu..%zu", b,
                                          a - rt->off[b], e - rt->off[b]);
    if (wide) memcpy(dst, P, (e - a) * 4);
    return ZO_OK;
}

/* The block holding flat element `a` (blocks of no elements skipped). */
static int block_of(const offload_t *rt, size_t a)
{
    int lo = 0, hi = rt->nb - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (rt->off[mid] <= a) lo = mid;
        else hi = mid - 1;
    }
    while (lo < rt->nb - 1 && rt->off[lo + 1] <= a) lo++;
    return lo;
}

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

/* Update flat [first, first + n) whose state is P, M, V (n each). */
static zo_status update_range(step_ctx *c, size_t first, size_t n, float *P, float *M, float *V)
{
    offload_t *rt = c->rt;
    size_t pos = first, end = first + n;
    while (pos < end) {
        int b = block_of(rt, pos);
        size_t bend = rt->off[b + 1] < end ? rt->off[b + 1] : end;
        if (rt->cfg.params_on != OFFLOAD_CPU) TRY(assembly_begin(c, b));
        /* split [pos, bend) at the block's decay ranges */
        while (pos < bend) {
            int decay;
            size_t stop = decay_piece(rt, b, pos - rt->off[b], bend - rt->off[b], &decay);
            size_t e = rt->off[b] + stop;
            TRY(update_piece(c, b, pos, e, decay, P + (pos - first), M + (pos - first),
                             V + (pos - first)));
            pos = e;
        }
        if (pos == rt->off[b + 1] && rt->cfg.params_on != OFFLOAD_CPU) TRY(assembly_end(c, b));
    }
    return ZO_OK;
}

/* ---- the optimizer's device share ------------------------------------------------------ */

/* Enqueue the update of the device share on the d2h stream, block by block:
 * gpu_adam_update (cpu_adam's arithmetic) over each decay piece, the new
 * weights written straight into the device store, or into a device staging
 * buffer (gradient slot 0) copied out to the host store. NVMe weights are
 * written from the pinned buffer after each block (the host waits). */
static zo_status dev_update(step_ctx *c)
{
    offload_t *rt = c->rt;
    gpu_stream_t s = rt->d2h;
    int wide = rt->m.dtype == ZO_DTYPE_F32;
    gpu_adam_hparams hp = {.lr = c->hp.lr, .beta1 = c->hp.beta1, .beta2 = c->hp.beta2,
                           .eps = c->hp.eps, .weight_decay = c->hp.weight_decay,
                           .decay = GPU_ADAM_DECAY_ADAMW, .step = c->hp.step,
                           .grad_mult = c->hp.grad_mult};
    for (int b = rt->dev_block; b < rt->nb; b++) {
        size_t nb = rt->numel[b], base = rt->off[b] - rt->dev_first, bytes = nb * rt->es;
        if (!nb) continue;
        /* dst [nb] model dtype on the device */
        char *dst = rt->cfg.params_on == OFFLOAD_DEVICE ? (char *)rt->store_dev + rt->off[b] * rt->es
                                                        : (char *)rt->gs[0].dev;
        for (size_t rel = 0; rel < nb;) {
            int decay;
            size_t stop = decay_piece(rt, b, rel, nb, &decay);
            gpu_adam_hparams h = hp;
            if (!decay) h.weight_decay = 0.0f;
            gpu_tensor out = gpu_t(wide ? NULL : dst + rel * rt->es, rt->m.dtype);
            zo_status st = gpu_adam_update(s, &h, stop - rel, rt->d_master + base + rel,
                                           gpu_t(rt->d_grad + base + rel, ZO_DTYPE_F32),
                                           rt->d_mom + base + rel, rt->d_var + base + rel, out);
            if (st != ZO_OK)
                return zo_error_wrap(st, "offload_step: device share, block %d elements %zu..%zu",
                                     b, rel, stop);
            rel = stop;
        }
        if (wide) TRY(gpu_memcpy_async(s, dst, rt->d_master + base, bytes, GPU_COPY_DEVICE_TO_DEVICE));
        if (rt->cfg.params_on == OFFLOAD_CPU) {
            TRY(gpu_memcpy_async(s, (char *)rt->store_host + rt->off[b] * rt->es, dst, bytes,
                                 GPU_COPY_DEVICE_TO_HOST));
            rt->bytes_d2h += bytes;
        } else if (rt->cfg.params_on == OFFLOAD_NVME) {
            TRY(gpu_memcpy_async(s, rt->gs[0].host, dst, bytes, GPU_COPY_DEVICE_TO_HOST));
            TRY(gpu_event_record(rt->d_done, s));
            TRY(gpu_event_synchronize(rt->d_done));
            rt->bytes_d2h += bytes;
            double t0 = offload_now();
            zo_status st = offload_par_write(rt, b, rt->gs[0].host);
            rt->time[OFFLOAD_TIME_DISK] += offload_now() - t0;
            rt->bytes_disk_written += bytes;
            if (st != ZO_OK) return st;
        }
    }
    return gpu_event_record(rt->d_done, s);
}

/* Sum of squares and inf/nan flag of the device share's gradient sum.
 * exact: block by block, each block's fp32 sum copied into the pinned
 * gradient buffer (2 slots: room for the largest block in fp32) and summed
 * by the host's own function, in block order: the very bits the host would
 * get with this share in memory, so clipping gives bit-identical steps.
 * Otherwise on the device (no copy; gpu_sum_squares accumulates in double
 * and rounds the total to float, so the norm differs in its last bits). */
static zo_status dev_grad_stats(offload_t *rt, int exact, double *sumsq, int *nonfinite)
{
    /* *sumsq and *nonfinite hold the host share's figures: added to in
     * block order, as if the blocks were on the host */
    gpu_stream_t s = rt->d2h;
    if (exact) {
        double t0 = offload_now();
        for (int b = rt->dev_block; b < rt->nb; b++) {
            if (!rt->numel[b]) continue;
            size_t base = rt->off[b] - rt->dev_first, n = rt->numel[b];
            double ss;
            int nf;
            TRY(gpu_memcpy_async(s, rt->gs[0].host, rt->d_grad + base, n * 4,
                                 GPU_COPY_DEVICE_TO_HOST));
            TRY(gpu_event_record(rt->d_done, s));
            TRY(gpu_event_synchronize(rt->d_done));
            rt->bytes_d2h += n * 4;
            TRY(adam_grad_stats(rt->gs[0].host, ZO_DTYPE_F32, n, rt->cfg.n_threads, &ss, &nf));
            *sumsq += ss;
            *nonfinite |= nf;
        }
        rt->time[OFFLOAD_TIME_GRADS] += offload_now() - t0;
        return ZO_OK;
    }
    size_t nd = rt->n - rt->dev_first;
    float *sum = rt->d_stats;
    int32_t *flag = (int32_t *)((char *)rt->d_stats + 4);
    unsigned char host[8];
    TRY(gpu_memset_async(s, rt->d_stats, 0, 8));
    TRY(gpu_sum_squares(s, sum, gpu_t(rt->d_grad, ZO_DTYPE_F32), nd));
    TRY(gpu_check_finite(s, flag, gpu_t(rt->d_grad, ZO_DTYPE_F32), nd));
    TRY(gpu_memcpy_async(s, host, rt->d_stats, 8, GPU_COPY_DEVICE_TO_HOST));
    TRY(gpu_event_record(rt->d_done, s));
    TRY(gpu_event_synchronize(rt->d_done));
    float f;
    int32_t bad;
    memcpy(&f, host, 4);
    memcpy(&bad, host + 4, 4);
    *sumsq += (double)f;
    *nonfinite |= bad != 0 || !isfinite(f);
    return ZO_OK;
}

static float *dev_array(offload_t *rt, int which)
{
    float *a[4] = {rt->d_master, rt->d_mom, rt->d_var, rt->d_grad};
    return which >= 0 && which < 4 ? a[which] : NULL;
}

zo_status offload_dev_state_get(offload_t *rt, int which, size_t first, size_t n, float *dst)
{
    float *a = dev_array(rt, which);
    if (!a || first + n > rt->n - rt->dev_first)
        return zo_error(ZO_ERR_INTERNAL, "offload: device optimizer state %d [%zu, +%zu) out of range",
                        which, first, n);
    if (!n) return ZO_OK;
    TRY(gpu_memcpy_async(rt->d2h, dst, a + first, n * 4, GPU_COPY_DEVICE_TO_HOST));
    TRY(gpu_event_record(rt->d_done, rt->d2h));
    return gpu_event_synchronize(rt->d_done);
}

zo_status offload_dev_state_set(offload_t *rt, int which, size_t first, size_t n, const float *src)
{
    float *a = dev_array(rt, which);
    if (!a || first + n > rt->n - rt->dev_first)
        return zo_error(ZO_ERR_INTERNAL, "offload: device optimizer state %d [%zu, +%zu) out of range",
                        which, first, n);
    if (!n) return ZO_OK;
    if (src) TRY(gpu_memcpy_async(rt->h2d, a + first, src, n * 4, GPU_COPY_HOST_TO_DEVICE));
    else TRY(gpu_memset_async(rt->h2d, a + first, 0, n * 4));
    return gpu_stream_synchronize(rt->h2d);
}

#ifdef ZO_OFFLOAD_HAVE_NVME
static zo_status nvme_update(void *user, size_t group, size_t first, size_t n, float *master,
                             float *m, float *v)
{
    (void)group;
    step_ctx *c = user;
    return update_range(c, c->rt->n_cpu + first, n, master, m, v);
}
#endif

zo_status offload_step(offload_t *rt, offload_step_info *info)
{
    double t_start = offload_now();
    memset(info, 0, sizeof *info);
    TRY(offload_grads_drain(rt));
    if (!rt->micro)
        return zo_error(ZO_ERR_INVALID, "offload_step: no micro-batch since the last step");
    info->loss_scale = rt->loss_scale;

    /* statistics block by block, in a fixed order */
    double t0 = offload_now();
    double sumsq = 0.0;
    int nonfinite = 0;
    for (int b = 0; b < rt->dev_block; b++) {
        if (!rt->numel[b]) continue;
        double ss;
        int nf;
        TRY(adam_grad_stats(rt->grad + rt->off[b], ZO_DTYPE_F32, rt->numel[b], rt->cfg.n_threads,
                            &ss, &nf));
        sumsq += ss;
        nonfinite |= nf;
    }
    if (rt->d_grad) /* the device share's blocks, last */
        TRY(dev_grad_stats(rt, rt->cfg.adam.clip > 0.0f, &sumsq, &nonfinite));
    double denom = (double)rt->loss_scale * (double)rt->micro;
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
        rt->time[OFFLOAD_TIME_OPTIMIZER] += offload_now() - t0;
        rt->total_s += offload_now() - t_start;
        return ZO_OK;
    }
    double coef = 1.0;
    if (rt->cfg.adam.clip > 0.0f) {
        double c = rt->cfg.adam.clip / (norm + 1e-6);
        if (c < 1.0) coef = c;
    }
    rt->step++;
    step_ctx c = {.rt = rt, .asm_k = 1, .asm_block = -1};
    c.hp = adam_hparams_default();
    c.hp.lr = rt->cfg.adam.lr;
    c.hp.beta1 = rt->cfg.adam.beta1;
    c.hp.beta2 = rt->cfg.adam.beta2;
    c.hp.eps = rt->cfg.adam.eps;
    c.hp.weight_decay = rt->cfg.adam.weight_decay;
    c.hp.decay = ADAM_DECAY_ADAMW;
    c.hp.step = (long)rt->step;
    c.hp.grad_mult = (float)(coef / denom);

    /* the device share first: enqueued, it runs while the host updates its
     * share (NVMe weights: block by block, the host waiting) */
    zo_status st = ZO_OK;
    if (rt->d_master) st = dev_update(&c);
    /* the state in memory, sub-group by sub-group */
    size_t sg = rt->cfg.sub_group;
    for (size_t f = 0; f < rt->n_cpu && st == ZO_OK; f += sg) {
        size_t n = rt->n_cpu - f < sg ? rt->n_cpu - f : sg;
        st = update_range(&c, f, n, rt->master + f, rt->mom + f, rt->var + f);
    }
    rt->time[OFFLOAD_TIME_OPTIMIZER] += offload_now() - t0;
#ifdef ZO_OFFLOAD_HAVE_NVME
    /* the state on NVMe: read ahead || update || write behind */
    if (st == ZO_OK && rt->pipe) {
        nvme_step_stats ns;
        st = nvme_pipeline_step(rt->pipe, nvme_update, &c, &ns);
        rt->time[OFFLOAD_TIME_DISK] += ns.wait_seconds;
        rt->time[OFFLOAD_TIME_OPTIMIZER] += ns.seconds - ns.wait_seconds;
        rt->bytes_disk_read += ns.bytes_read;
        rt->bytes_disk_written += ns.bytes_written;
    }
#endif
    /* the device share's update and its copies out */
    if (rt->d_master) {
        double t1 = offload_now();
        zo_status sd = gpu_event_synchronize(rt->d_done);
        if (st == ZO_OK) st = sd;
        rt->time[OFFLOAD_TIME_OPTIMIZER] += offload_now() - t1;
    }
    /* the device tier's last copies of new weights: the host waits on the
     * events of the (at most two) copies still in flight, not on a stream or
     * the device, so the next micro-batch reads the new weights */
    if (st == ZO_OK && rt->cfg.params_on == OFFLOAD_DEVICE) {
        double t1 = offload_now();
        for (int k = 0; k < 2; k++) {
            if (!rt->stage16_pending[k]) continue;
            zo_status sk = gpu_event_synchronize(rt->stage16_ev[k]);
            rt->stage16_pending[k] = 0;
            if (st == ZO_OK) st = sk;
        }
        rt->time[OFFLOAD_TIME_OPTIMIZER] += offload_now() - t1;
    }
    offload_slots_invalidate(rt);
    if (st != ZO_OK) return zo_error_wrap(st, "offload_step %lld", (long long)rt->step);
    if (rt->dynamic_scale && ++rt->good_steps >= rt->cfg.loss_scale_window) {
        rt->loss_scale *= 2.0f;
        rt->good_steps = 0;
    }
    info->step = rt->step;
    rt->n_steps++;
    rt->total_s += offload_now() - t_start;
    return ZO_OK;
}

/* ---- NVMe ---------------------------------------------------------------------------- */

#ifdef ZO_OFFLOAD_HAVE_NVME

static zo_status store_open(offload_t *rt, nvme_engine_t **eng, nvme_store_t **store,
                            const char *prefix)
{
    nvme_engine_config ec = {0};
    TRY(nvme_engine_init(eng, &ec));
    const char *dirs[1] = {rt->cfg.nvme_dir};
    nvme_store_config sc = {.dirs = dirs, .ndirs = 1, .prefix = prefix};
    zo_status st = nvme_store_init(store, *eng, &sc);
    if (st != ZO_OK) return zo_error_wrap(st, "offload: NVMe store in %s", rt->cfg.nvme_dir);
    return ZO_OK;
}

zo_status offload_nvme_init(offload_t *rt)
{
    zo_status st;
    size_t n_nvme = rt->dev_first - rt->n_cpu;
    char prefix[64];
    if (n_nvme) {
        snprintf(prefix, sizeof prefix, "zo-opt-%d", (int)getpid());
        TRY(store_open(rt, &rt->opt_engine, &rt->opt_store, prefix));
        size_t group = rt->cfg.sub_group < n_nvme ? rt->cfg.sub_group : n_nvme;
        nvme_pipeline_config pc = {.n_elems = n_nvme, .group_elems = group,
                                   .nslots = rt->cfg.swap_buffers < 2 ? 2 : rt->cfg.swap_buffers,
                                   .prefix = "opt"};
        if ((st = nvme_pipeline_init(&rt->pipe, rt->opt_store, &pc)) != ZO_OK)
            return zo_error_wrap(st, "offload: optimizer state on NVMe");
        offload_count(rt, OFFLOAD_NVME, (int64_t)nvme_store_footprint(rt->opt_store));
        /* the pipeline's sub-group buffers: master, m, v per slot */
        offload_count(rt, OFFLOAD_CPU, (int64_t)((size_t)pc.nslots * group * 12));
    }
    if (rt->cfg.params_on == OFFLOAD_NVME) {
        snprintf(prefix, sizeof prefix, "zo-par-%d", (int)getpid());
        TRY(store_open(rt, &rt->par_engine, &rt->par_store, prefix));
        rt->par_ids = calloc((size_t)rt->nb, sizeof(int));
        char **names = calloc((size_t)rt->nb, sizeof(char *));
        size_t *bytes = calloc((size_t)rt->nb, sizeof(size_t));
        st = !rt->par_ids || !names || !bytes ? zo_error(ZO_ERR_NOMEM, "offload: out of host memory") : ZO_OK;
        for (int b = 0; b < rt->nb && st == ZO_OK; b++) {
            names[b] = malloc(32);
            if (!names[b]) st = zo_error(ZO_ERR_NOMEM, "offload: out of host memory");
            else snprintf(names[b], 32, "param.%d", b);
            bytes[b] = rt->numel[b] ? rt->numel[b] * rt->es : rt->es;
        }
        if (st == ZO_OK) st = nvme_store_add(rt->par_store, (size_t)rt->nb, (const char *const *)names,
                                             bytes, rt->par_ids);
        for (int b = 0; names && b < rt->nb; b++) free(names[b]);
        free(names);
        free(bytes);
        if (st != ZO_OK) return zo_error_wrap(st, "offload: weights on NVMe");
        offload_count(rt, OFFLOAD_NVME, (int64_t)nvme_store_footprint(rt->par_store));
    }
    return ZO_OK;
}

void offload_nvme_free(offload_t *rt)
{
    if (rt->pipe) nvme_pipeline_free(rt->pipe);
    if (rt->opt_store) nvme_store_free(rt->opt_store);
    if (rt->opt_engine) nvme_engine_free(rt->opt_engine);
    if (rt->par_store) nvme_store_free(rt->par_store);
    if (rt->par_engine) nvme_engine_free(rt->par_engine);
    free(rt->par_ids);
    rt->pipe = NULL;
    rt->opt_store = rt->par_store = NULL;
    rt->opt_engine = rt->par_engine = NULL;
    rt->par_ids = NULL;
}

size_t offload_opt_groups(const offload_t *rt) { return rt->pipe ? nvme_pipeline_groups(rt->pipe) : 0; }

void offload_opt_group_range(const offload_t *rt, size_t g, size_t *first, size_t *n)
{
    nvme_pipeline_group_range(rt->pipe, g, first, n);
}

zo_status offload_opt_load_group(offload_t *rt, size_t g, float *master, float *m, float *v)
{
    return nvme_pipeline_load_group(rt->pipe, g, master, m, v);
}

zo_status offload_opt_store_group(offload_t *rt, size_t g, const float *master, const float *m,
                                  const float *v)
{
    return nvme_pipeline_store_group(rt->pipe, g, master, m, v);
}

zo_status offload_par_write(offload_t *rt, int block, const void *buf)
{
    if (!rt->numel[block]) return ZO_OK;
    return nvme_store_write(rt->par_store, rt->par_ids[block], buf);
}

zo_status offload_par_read(offload_t *rt, int block, void *buf)
{
    if (!rt->numel[block]) return ZO_OK;
    return nvme_store_read(rt->par_store, rt->par_ids[block], buf);
}

#else /* no nvme module: configurations that need it are refused at init */

zo_status offload_nvme_init(offload_t *rt) { (void)rt; return ZO_OK; }
void offload_nvme_free(offload_t *rt) { (void)rt; }
size_t offload_opt_groups(const offload_t *rt) { (void)rt; return 0; }
void offload_opt_group_range(const offload_t *rt, size_t g, size_t *first, size_t *n)
{
    (void)rt, (void)g;
    *first = *n = 0;
}
zo_status offload_opt_load_group(offload_t *rt, size_t g, float *master, float *m, float *v)
{
    (void)rt, (void)g, (void)master, (void)m, (void)v;
    return zo_error(ZO_ERR_UNSUPPORTED, "offload: built without the nvme module");
}
zo_status offload_opt_store_group(offload_t *rt, size_t g, const float *master, const float *m,
                                  const float *v)
{
    (void)rt, (void)g, (void)master, (void)m, (void)v;
    return zo_error(ZO_ERR_UNSUPPORTED, "offload: built without the nvme module");
}
zo_status offload_par_write(offload_t *rt, int block, const void *buf)
{
    (void)rt, (void)block, (void)buf;
    return zo_error(ZO_ERR_UNSUPPORTED, "offload: built without the nvme module");
}
zo_status offload_par_read(offload_t *rt, int block, void *buf)
{
    (void)rt, (void)block, (void)buf;
    return zo_error(ZO_ERR_UNSUPPORTED, "offload: built without the nvme module");
}

#endif
