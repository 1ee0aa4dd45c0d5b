/* The optimizer step: gradient statistics over every block in a fixed
 * order, the unscale and clip coefficient, then AdamW over every optimizer
 * shard (the device shard enqueued first, so it runs while the host updates
 * its shards), the new weights handed to the weight store as they come.
 *
 * When the update runs is the schedule's business (offload.h,
 * offload_schedule): on the host thread after the micro-batches (serial),
 * or on the optimizer's own thread beside the device's work (overlap, dpu).
 * Each block's weights in the store carry the step they belong to
 * (`published`); a forward waits for exactly the block it loads.
 *
 * The optimizer's geometry (o->og) is the model's with one rank and with
 * ZeRO 0, the rank's part of every block with ZeRO 1-3: the shards, the
 * gradient sums it reads (as the shards hand them out) and its puts into
 * the store are in those coordinates; the decay ranges are the whole block's.
 *
 * Several ranks run every schedule: the optimizer's thread computes and
 * puts, and issues no collective; the host thread announces each round of
 * puts (wstore_will_change) and issues what the ranks do together, in the
 * same order on every rank (the gradient reductions before a block's
 * update may start, the statistics' gather, the weights' gathers when the
 * blocks are next used). */
#include "offload/optim.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_adam/cpu_adam.h" /* defines: adam_update */

typedef struct step_ctx {
    offload_optim *o;
    wstore *dst;       /* where the new weights go: the store, or the DPU shadow */
} step_ctx;

/* ---- publishing: a block's new weights are in the store ------------------------------ */

static void publish(offload_optim *o, int b, int64_t step)
{
    pthread_mutex_lock(&o->mu);
    if (o->published[b] < step) {
        if (o->pub_step != step) o->pub_step = step, o->pub_n = 0;
        o->pub_n++;
    }
    o->published[b] = step;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void publish_all(offload_optim *o, int64_t step)
{
    pthread_mutex_lock(&o->mu);
    for (int b = 0; b < o->g->nb; b++) o->published[b] = step;
    o->pub_step = step;
    o->pub_n = o->g->nb;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

int offload_optim_sum_threads(offload_optim *o, int *beside)
{
    *beside = 0;
    if (!o->threaded) return o->sum_threads;
    /* the optimizer's thread idle, or done with its AdamW (its last syncs
     * left): every core to the sums. (hp.step: the step whose update is
     * in flight, set before its job is posted.) */
    pthread_mutex_lock(&o->mu);
    int done = o->pub_step >= o->hp.step && o->pub_n >= o->g->nb;
    *beside = o->job != OFFLOAD_JOB_NONE && !done;
    pthread_mutex_unlock(&o->mu);
    return *beside ? o->sum_threads : o->cores;
}

void offload_optim_grads_free(offload_optim *o, int b)
{
    if (!o->dpu_pending) return; /* (otherwise the forward waited for the block's update) */
    pthread_mutex_lock(&o->mu);
    while (o->published[b] < o->ctr.step && o->job != OFFLOAD_JOB_NONE)
        pthread_cond_wait(&o->cv, &o->mu);
    pthread_mutex_unlock(&o->mu);
}

int offload_optim_ready(offload_optim *o, int b, int wait)
{
    /* dpu: the micro-batches use the weights the store holds, a step late */
    if (o->dpu_pending) return 1;
    pthread_mutex_lock(&o->mu);
    /* a failed job publishes nothing more: the step reports its failure */
    while (wait && o->published[b] < o->ctr.step && o->job != OFFLOAD_JOB_NONE)
        pthread_cond_wait(&o->cv, &o->mu);
    int ready = o->published[b] >= o->ctr.step;
    pthread_mutex_unlock(&o->mu);
    return ready;
}

/* ---- the update of a range ---------------------------------------------------------- */

/* Where sorted, disjoint ranges (n of them) cut block b from element `rel`
 * (of the block): returns the end of the piece starting there (at most
 * `stop`) and the range holding it (-1: none). */
static size_t range_piece(const offload_decay_range *r, int n, int b, size_t rel, size_t stop, int *hit)
{
    *hit = -1;
    for (int i = 0; i < n; i++) {
        if (r[i].block != b || r[i].offset + r[i].numel <= rel) continue;
        if (r[i].offset <= rel) {
            *hit = i;
            if (r[i].offset + r[i].numel < stop) stop = r[i].offset + r[i].numel;
        } else if (r[i].offset < stop) {
            stop = r[i].offset;
        }
        break; /* sorted: the first range ending after rel decides */
    }
    return stop;
}

/* Where the optimizer's element `rel` of block b is in the block, less
 * rel; *stop cut where that stops holding (a part in segments: expert
 * parallelism). */
static size_t part_base(const offload_optim *o, int b, size_t rel, size_t *stop)
{
    size_t run, at = offload_dp_part_at(o->env->dp, b, rel, &run);
    if (run < *stop - rel) *stop = rel + run;
    return at - rel;
}

/* From element `rel` of block b (the optimizer's coordinates: its part),
 * the end of the run (at most `stop`) in one routed expert's range (its
 * number in *expert) or between two (-1). */
static size_t expert_run(const offload_optim *o, int b, size_t rel, size_t stop, int *expert)
{
    size_t base = part_base(o, b, rel, &stop);
    int hit;
    stop = range_piece(o->expert_at, o->m->n_expert_ranges, b, base + rel, base + stop, &hit);
    *expert = hit >= 0 ? o->m->expert_ranges[hit].expert : -1;
    return stop - base;
}

/* The piece of block b from `rel` (the optimizer's coordinates: its part)
 * that one AdamW call takes: cut at the decay ranges and at the experts'. */
static size_t piece_part(const offload_optim *o, int b, size_t rel, size_t stop, int *decay, int *expert)
{
    size_t base = part_base(o, b, rel, &stop);
    int hit;
    if (o->m->decay) { /* (none given: every element decays) */
        stop = range_piece(o->m->decay, o->m->n_decay, b, base + rel, base + stop, &hit) - base;
        *decay = hit >= 0;
    } else {
        *decay = 1;
    }
    return expert_run(o, b, rel, stop, expert);
}

/* Whether the piece of `expert` of block b is left as it is this step (no
 * token went to the expert); otherwise its AdamW step in *step. */
static int expert_untouched(const offload_optim *o, int b, int expert, long *step)
{
    if (expert < 0) return 0;
    size_t k = (size_t)b * (size_t)o->m->experts + (size_t)expert;
    if (!o->step_routed[k]) return 1;
    *step = (long)o->expert_steps[k];
    return 0;
}

/* --master stochastic: the new weights of P (n, element `first` of block b
 * as a whole) rounded stochastically to bf16, into P and into dst. */
static void round_stochastic(int64_t step, int b, size_t first, float *P, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t w = zo_f32_to_bf16_sr(P[i], zo_adam_sr_bits((uint64_t)step, (uint64_t)b, first + i));
        dst[i] = w;
        P[i] = zo_bf16_to_f32(w);
    }
}

/* The optimizer's time of an update from t0 on (busy0: the device was
 * computing then): overlapped when the device was computing at both ends. */
static void busy_add(offload_optim *o, double t0, int busy0)
{
    double dt = zo_now() - t0;
    int busy1 = offload_device_busy(o->env->acct);
    pthread_mutex_lock(&o->env->acct->mu);
    o->env->acct->opt_busy_s += dt;
    if (busy0 && busy1) o->env->acct->opt_overlap_s += dt;
    pthread_mutex_unlock(&o->env->acct->mu);
}

/* The weights P of the optimizer's [rel, rel + n) of block b into the
 * store (the dtype's nearest), in puts of at most put_max. */
static zo_status put_weights(step_ctx *c, int b, size_t rel, size_t n, const float *P)
{
    wstore *ws = c->dst;
    zo_status st;
    for (size_t d = 0; d < n;) {
        size_t k = n - d < ws->put_max ? n - d : ws->put_max;
        void *dst;
        if ((st = ws->ops->put_host(ws, b, rel + d, k, &dst)) != ZO_OK) return st;
        zo_convert(dst, c->o->m->dtype, P + d, ZO_DTYPE_F32, k);
        if ((st = wstore_put_host_done(ws, b, rel + d, k)) != ZO_OK) return st;
        d += k;
    }
    return ZO_OK;
}

/* One AdamW call over the optimizer's flat [a, e) of block b, all with or
 * without decay; P, M, V point at element a; the new weights go to the
 * store. */
static zo_status update_piece(step_ctx *c, int b, size_t a, size_t e, int decay, int expert, float *P,
                              float *M, float *V)
{
    offload_optim *o = c->o;
    wstore *ws = c->dst;
    size_t rel = a - o->og->off[b], n = e - a;
    adam_hparams hp = o->hp;
    if (!decay) hp.weight_decay = 0.0f;
    /* an expert no token went to: its weights put back as they are */
    if (expert_untouched(o, b, expert, &hp.step)) return put_weights(c, b, rel, n, P);
    double t0 = zo_now();
    int busy0 = offload_device_busy(o->env->acct);
    void *dst;
    zo_status st = ws->ops->put_host(ws, b, rel, n, &dst);
    if (st != ZO_OK) return st;
    int wide = o->m->dtype == ZO_DTYPE_F32;
    int threads = o->threads;
    oshard_sum sum;
    ostate_grad_sum(o->os, b, &sum);
    /* (stochastic rounding: the update's fp32 weights rounded here, the
     * optimizer's bf16 copy keeps what the store gets) */
    int sr = o->cfg->master == ZO_PLAN_MASTER_STOCHASTIC;
    st = adam_update(&hp, n, P, sum.part + rel, ZO_DTYPE_F32, M, V, wide || sr ? NULL : dst, o->m->dtype, threads);
    if (st != ZO_OK)
        return zo_error_wrap(st, "offload_step: block %d elements %zu..%zu", b, rel, rel + n);
    if (wide) memcpy(dst, P, n * 4);
    size_t run; /* (a piece lies in one run of the part: piece_part) */
    if (sr) round_stochastic(o->hp.step, b, offload_dp_part_at(o->env->dp, b, rel, &run), P, dst, n);
    st = wstore_put_host_done(ws, b, rel, n);
    busy_add(o, t0, busy0);
    return st;
}

/* The new weights of block b are complete: in the store, for a forward
 * that waits for them (the optimizer's thread; the shadow's publication
 * waits for the next step; the serial schedule publishes every block at
 * the end of its update, which a ZeRO 1-2 store's round of all-gathers
 * needs: its sync ends the round). */
static zo_status block_complete(step_ctx *c, int b)
{
    offload_optim *o = c->o;
    if (!o->threaded) return ZO_OK;
    /* (dpu: the block is in the shadow, and its gradient sum is read: the
     * next backward may write it, offload_optim_grads_free) */
    zo_status st = c->dst == o->ws ? c->dst->ops->sync(c->dst) : ZO_OK;
    if (st == ZO_OK) publish(o, b, o->hp.step);
    return st;
}

/* A host shard's update of flat [first, first + n) whose state is P, M, V:
 * split at blocks and at the blocks' decay ranges; a block whose last
 * element this updates is published. */
static zo_status update_host(void *ctx, size_t first, size_t n, float *P, float *M, float *V)
{
    step_ctx *c = ctx;
    offload_optim *o = c->o;
    const size_t *off = o->og->off;
    zo_status st;
    size_t pos = first, end = first + n;
    while (pos < end) {
        int b = offload_block_of(o->og, pos);
        size_t bend = off[b + 1] < end ? off[b + 1] : end;
        while (pos < bend) {
            int decay, expert;
            size_t stop = piece_part(o, b, pos - off[b], bend - off[b], &decay, &expert);
            size_t e = off[b] + stop, k = pos - first;
            if ((st = update_piece(c, b, pos, e, decay, expert, P + k, M + k, V + k)) != ZO_OK) return st;
            pos = e;
        }
        if (pos == off[b + 1] && (st = block_complete(c, b)) != ZO_OK) return st;
    }
    return ZO_OK;
}

/* ---- the update of a chunk of encoded m and v ------------------------------------------- */

/* The optimizer's flat [a, e) of block b, one piece (piece_part), whose
 * moments are elements [r, r + e - a) of the state S of a chunk of cn
 * elements (r and e - a whole units of the encoding, or to the chunk's
 * end): cpu_adam's fused step on it, P the master at a. The new weights go
 * straight into the store's memory when one put takes them, else from P
 * after the step (fp32 weights, or puts shorter than an 8-bit block). */
static zo_status update_fused(step_ctx *c, int b, size_t a, size_t e, int decay, int expert, adam_state_kind kind,
                              void *S, size_t cn, size_t r, float *P)
{
    offload_optim *o = c->o;
    wstore *ws = c->dst;
    size_t rel = a - o->og->off[b], n = e - a;
    adam_hparams hp = o->hp;
    if (!decay) hp.weight_decay = 0.0f;
    /* an expert's own AdamW step (its bias correction), as update_piece's;
     * the caller left chunks with an untouched expert to the decoding path */
    if (expert_untouched(o, b, expert, &hp.step))
        return zo_error(ZO_ERR_INTERNAL, "offload_step: block %d expert %d untouched in a fused update", b, expert);
    double t0 = zo_now();
    int busy0 = offload_device_busy(o->env->acct);
    int direct = o->m->dtype != ZO_DTYPE_F32 && n <= ws->put_max;
    void *dst = NULL;
    zo_status st = direct ? ws->ops->put_host(ws, b, rel, n, &dst) : ZO_OK;
    if (st != ZO_OK) return st;
    oshard_sum sum;
    ostate_grad_sum(o->os, b, &sum);
    st = adam_state_update_range(&hp, kind, cn, r, n, P, sum.part + rel, ZO_DTYPE_F32, S, dst, o->m->dtype,
                                 o->threads);
    if (st != ZO_OK)
        return zo_error_wrap(st, "offload_step: block %d elements %zu..%zu (%s m, v)", b, rel, rel + n,
                             adam_state_name(kind));
    st = direct ? wstore_put_host_done(ws, b, rel, n) : put_weights(c, b, rel, n, P);
    busy_add(o, t0, busy0);
    return st;
}

/* A host shard's whole chunk of encoded m and v (S: the state of flat
 * [first, first + n), kind; P the fp32 master at first) in one pass a
 * piece (oshard_update.host_state): each run of whole units (8-bit blocks,
 * bf16 elements) inside one piece (a block's decay range) is cpu_adam's
 * fused step, cut where a put of the new weights ends; a unit that two
 * pieces share is decoded into sm, sv, updated by update_host, coded again.
 * Every unit is decoded, updated and coded as the chunk's decode,
 * update_host and code would (the fused step is that sequence, bit for bit:
 * cpu_adam.h), so the bits are the same. *done 0, nothing touched: a piece
 * of an expert that stays as it is (the whole chunk's decode and code
 * re-codes it: left to that). */
static zo_status update_host_state(void *ctx, size_t first, size_t n, float *P, adam_state_kind kind, void *S,
                                   float *sm, float *sv, int *done)
{
    step_ctx *c = ctx;
    offload_optim *o = c->o;
    const size_t *off = o->og->off;
    size_t unit = kind.type == ADAM_STATE_Q8 ? kind.block : 1, end = first + n;
    size_t most = c->dst->put_max / unit * unit; /* (elements a put takes, whole units) */
    int decay, expert;
    long step;
    zo_status st;
    *done = 0;
    for (size_t pos = first; pos < end;) {
        int b = offload_block_of(o->og, pos);
        size_t bend = off[b + 1] < end ? off[b + 1] : end;
        pos = off[b] + piece_part(o, b, pos - off[b], bend - off[b], &decay, &expert);
        if (expert_untouched(o, b, expert, &step)) return ZO_OK;
    }
    *done = 1;
    for (size_t r = 0; r < n;) { /* (r: a unit's first element) */
        size_t pos = first + r, ulen = n - r < unit ? n - r : unit;
        int b = offload_block_of(o->og, pos);
        size_t bend = off[b + 1] < end ? off[b + 1] : end;
        size_t e = off[b] + piece_part(o, b, pos - off[b], bend - off[b], &decay, &expert);
        if (e - first < r + ulen) { /* the unit is shared (update_host's puts: at most put_max) */
            if ((st = adam_state_to_f32_range(kind, S, n, r, ulen, sm, sv, o->threads)) != ZO_OK) return st;
            for (size_t f = 0, k; f < ulen; f += k) {
                k = ulen - f < c->dst->put_max ? ulen - f : c->dst->put_max;
                if ((st = update_host(ctx, pos + f, k, P + r + f, sm + f, sv + f)) != ZO_OK) return st;
            }
            if ((st = adam_state_from_f32_range(kind, S, n, r, ulen, sm, sv, o->threads)) != ZO_OK) return st;
            r += ulen;
            continue;
        }
        size_t stop = e == end ? n : (e - first) / unit * unit;
        if (most && stop - r > most) stop = r + most;
        if ((st = update_fused(c, b, pos, first + stop, decay, expert, kind, S, n, r, P + r)) != ZO_OK) return st;
        if (first + stop == off[b + 1] && (st = block_complete(c, b)) != ZO_OK) return st;
        r = stop;
    }
    return ZO_OK;
}

/* The decay ranges of block b from element `rel` on (the optimizer's part
 * of it, nb elements), as gpu_adam_state_update takes them: at most
 * GPU_ADAM_DECAY_RANGES, relative to rel. Returns where the call ends:
 * the block's end, or (more ranges than a call takes) the start of the
 * 8-bit block (`align`) in which the ranges ran out; rel itself when one
 * such block holds more ranges than a call takes. */
static size_t decay_ranges(const offload_optim *o, int b, size_t rel, size_t nb, size_t align,
                           gpu_adam_state_desc *d)
{
    size_t pos = rel;
    d->n_decay = 0;
    while (pos < nb) {
        int decay, expert;
        size_t stop = piece_part(o, b, pos, nb, &decay, &expert);
        if (decay) {
            if (d->n_decay == GPU_ADAM_DECAY_RANGES) break;
            d->decay[d->n_decay][0] = pos - rel;
            d->decay[d->n_decay][1] = stop - rel;
            d->n_decay++;
        }
        pos = stop;
    }
    if (pos >= nb) return nb;
    size_t end = align > 1 ? pos / align * align : pos;
    int kept = 0; /* the ranges cut at the call's end */
    for (int k = 0; k < d->n_decay; k++)
        if (d->decay[k][0] < end - rel) {
            d->decay[kept][0] = d->decay[k][0];
            d->decay[kept][1] = d->decay[k][1] < end - rel ? d->decay[k][1] : end - rel;
            kept++;
        }
    d->n_decay = kept;
    return end;
}

/* Where in put_dev's memory of block b the optimizer's element rel goes:
 * rel, or with `runs` (a store of whole blocks, a part in segments:
 * put_dev_runs) the element's place in the block; *run elements from rel
 * on go on from there. The device share's calls each lie in one run
 * (expert_run and piece_part cut there). */
static size_t dev_out_at(const offload_optim *o, int runs, int b, size_t rel, size_t *run)
{
    if (runs && offload_dp_segmented(o->env->dp, b)) return offload_dp_part_at(o->env->dp, b, rel, run);
    *run = (size_t)-1 - rel;
    return rel;
}

/* The device shard's update of block b with m and v encoded (S: the
 * block's state buffer): gpu_adam_state_update over calls of whole 8-bit
 * blocks, each taking its decay ranges. The weights: the fp32 master P, or
 * without one the bf16 W (and Kahan's C), rounded as the host shard rounds
 * them (the stochastic rounding's hash of the step, the block and the
 * element's index in the whole block, as round_stochastic). */
static zo_status update_dev_state(offload_optim *o, int b, float *P, uint16_t *W, uint16_t *C, void *S, float *G,
                                  gpu_tensor out, int runs, gpu_stream_t s)
{
    size_t nb = o->og->numel[b], es = zo_dtype_size(out.dtype);
    int q8 = o->cfg->opt_state == ZO_PLAN_STATE_8BIT;
    size_t align = q8 ? ADAM_Q8_BLOCK : 1;
    static const gpu_adam_round rounds[ZO_PLAN_MASTERS] = {
        [ZO_PLAN_MASTER_STOCHASTIC] = GPU_ADAM_ROUND_STOCHASTIC, [ZO_PLAN_MASTER_KAHAN] = GPU_ADAM_ROUND_KAHAN};
    gpu_adam_state_type type = q8 ? GPU_ADAM_STATE_Q8
                               : o->cfg->opt_state == ZO_PLAN_STATE_BF16 ? GPU_ADAM_STATE_BF16 : GPU_ADAM_STATE_F32;
    gpu_adam_state_desc d = {.type = type, .block = q8 ? ADAM_Q8_BLOCK : 0,
                             .total = nb, .round = W ? rounds[o->cfg->master] : GPU_ADAM_ROUND_NEAREST,
                             .sr_step = (uint64_t)o->hp.step, .sr_block = (uint64_t)b};
    size_t run;
    /* the weights from element rel on */
#define WEIGHTS_AT(rel) (W ? gpu_t(W + (rel), ZO_DTYPE_BF16) : gpu_t(P + (rel), ZO_DTYPE_F32))
    zo_status st;
    for (size_t rel = 0; rel < nb;) {
        /* a routed expert's range (or the run between two) at a time: its own step, or untouched */
        int expert;
        size_t xend = expert_run(o, b, rel, nb, &expert);
        if (xend < nb && xend % align) /* (the capability table refuses 8-bit device state with experts) */
            return zo_error(ZO_ERR_INTERNAL, "offload_step: device share, block %d: a routed expert's range ends "
                            "at element %zu, inside an 8-bit block of m and v", b, xend);
        gpu_adam_hparams h = o->hp;
        if (expert_untouched(o, b, expert, &h.step)) { /* no token went to it: put back as it is */
            gpu_tensor o16 = gpu_t(out.data ? (char *)out.data + dev_out_at(o, runs, b, rel, &run) * es : NULL, out.dtype);
            if (o16.data && (st = gpu_cast(s, o16, WEIGHTS_AT(rel), xend - rel)) != ZO_OK) return st;
            rel = xend;
            continue;
        }
        while (rel < xend) {
            size_t stop = decay_ranges(o, b, rel, xend, align, &d);
            if (stop <= rel)
                return zo_error(ZO_ERR_UNSUPPORTED, "offload_step: device share, block %d: more than %d decay "
                                "ranges in the 8-bit block at element %zu", b, GPU_ADAM_DECAY_RANGES, rel);
            d.first = rel;
            d.sr_first = offload_dp_part_at(o->env->dp, b, rel, &run); /* (the element's index in the block) */
            d.comp = C ? C + rel : NULL;
            /* (dev_out_at: with runs, a part in segments goes to that index) */
            size_t out_at = runs && offload_dp_segmented(o->env->dp, b) ? d.sr_first : rel;
            gpu_tensor o16 = gpu_t(out.data ? (char *)out.data + out_at * es : NULL, out.dtype);
            st = gpu_adam_state_update(s, &h, &d, stop - rel, WEIGHTS_AT(rel), gpu_t(G + rel, ZO_DTYPE_F32), S, o16);
            if (st != ZO_OK)
                return zo_error_wrap(st, "offload_step: device share, block %d elements %zu..%zu", b, rel, stop);
            rel = stop;
        }
    }
#undef WEIGHTS_AT
    return ZO_OK;
}

/* The device shard's update of block b, enqueued on s: gpu_adam_update
 * (cpu_adam's arithmetic) over each decay piece, or gpu_adam_state_update
 * over the encoded state S, the new weights written where the store takes
 * them from the device. */
static zo_status update_dev(void *ctx, int b, float *P, float *M, float *V, void *S, float *G, uint16_t *W,
                            uint16_t *C, gpu_stream_t s)
{
    step_ctx *c = ctx;
    offload_optim *o = c->o;
    wstore *ws = c->dst;
    size_t nb = o->og->numel[b], es = o->g->es;
    int wide = o->m->dtype == ZO_DTYPE_F32;
    char *dst;
    zo_status st = ws->ops->put_dev(ws, b, (void **)&dst);
    if (st != ZO_OK) return st;
    if (S) { /* (W in place in the store: no copy) */
        st = update_dev_state(o, b, P, W, C, S, G, gpu_t(wide || (char *)W == dst ? NULL : dst, o->m->dtype),
                              ws->put_dev_runs, s);
        if (st != ZO_OK) return st;
    }
    for (size_t rel = 0; rel < nb && !S;) {
        int decay, expert;
        size_t stop = piece_part(o, b, rel, nb, &decay, &expert), run;
        gpu_adam_hparams h = o->hp;
        if (!decay) h.weight_decay = 0.0f;
        gpu_tensor out = gpu_t(wide ? NULL : dst + dev_out_at(o, ws->put_dev_runs, b, rel, &run) * es, o->m->dtype);
        if (expert_untouched(o, b, expert, &h.step)) /* no token went to it: put back as it is */
            st = wide ? ZO_OK : gpu_cast(s, out, gpu_t(P + rel, ZO_DTYPE_F32), stop - rel);
        else
            st = gpu_adam_update(s, &h, stop - rel, P + rel, gpu_t(G + rel, ZO_DTYPE_F32), M + rel, V + rel, out);
        if (st != ZO_OK)
            return zo_error_wrap(st, "offload_step: device share, block %d elements %zu..%zu", b, rel, stop);
        rel = stop;
    }
    /* (fp32: the master is the weights, run by run: a part in segments) */
    for (size_t rel = 0, run; wide && rel < nb; rel += run) {
        size_t at = dev_out_at(o, ws->put_dev_runs, b, rel, &run);
        if (run > nb - rel) run = nb - rel;
        if ((st = gpu_memcpy_async(s, dst + at * es, P + rel, run * es, GPU_COPY_DEVICE_TO_DEVICE)) != ZO_OK)
            return st;
    }
    return wstore_put_dev_done(ws, b, s);
}

static oshard_update updater(step_ctx *c)
{
    /* (an fp32 master: the host shards' encoded m and v updated in one pass) */
    int fused = c->o->cfg->master == ZO_PLAN_MASTER_FP32 && !c->o->cfg->state_unfused;
    return (oshard_update){.host = update_host, .host_state = fused ? update_host_state : NULL,
                           .dev = update_dev, .ctx = c};
}

/* ---- the jobs ---------------------------------------------------------------------------- */

/* Every shard the host updates, in flat order, then the enqueued update
 * (the device shard's, enqueued by the host thread) waited for; every
 * block published. Into the weight store: the delayed update's steps, into
 * the shadow, are job_reverse's. */
static zo_status job_all(offload_optim *o, step_ctx *c)
{
    zo_status st;
    oshard_update u = updater(c);
    for (int b = 0; b < o->g->nb; b++) /* nothing to update */
        if (!o->og->numel[b]) publish(o, b, o->hp.step);
    st = ostate_step_host(o->os, &u);
    /* on the host thread, into a store that orders the device's puts
     * before their reads (the resident weights, one rank), the device
     * shard's update is left running: the next forward's blocks wait for
     * their own new weights on the compute stream, not the host for all
     * of them (offload_optim_settle waits before anything from outside) */
    int ordered = !o->threaded && c->dst->puts_ordered;
    zo_status sd = ordered ? ostate_sync_host(o->os) : ostate_sync(o->os);
    if (st == ZO_OK) st = sd;
    /* on the host thread (serial) the round ends here, its collectives
     * (ZeRO 1-2: the gathers) issued; on the optimizer's thread the host
     * thread ends it (wstore_use, offload_optim_settle) */
    zo_status sw = o->threaded ? c->dst->ops->sync(c->dst)
                   : ordered   ? wstore_settle_host(c->dst)
                               : wstore_settle(c->dst);
    if (st == ZO_OK) st = sw;
    if (st == ZO_OK) publish_all(o, o->hp.step);
    return st;
}

/* Block b's range on each shard the host updates (the block is published
 * as its last element is updated; one with nothing to update, here). */
static zo_status step_block(offload_optim *o, step_ctx *c, oshard_update *u, int b)
{
    offload_timer ts = offload_time_begin();
    zo_status st = ostate_step_block(o->os, b, u);
    offload_time_end(o->env->acct, OFFLOAD_TIME_OPTIMIZER, ts);
    if (st == ZO_OK && !o->og->numel[b]) st = block_complete(c, b);
    return st;
}

/* The shards' writes done, after the job's status st. */
static zo_status sync_shards(offload_optim *o, zo_status st)
{
    zo_status ss = ostate_sync(o->os);
    return st != ZO_OK ? st : ss;
}

/* Blocks queued as their gradients complete (updates during backward):
 * each block's range on the host shards, then published. */
static zo_status job_blocks(offload_optim *o, step_ctx *c)
{
    zo_status st = ZO_OK;
    oshard_update u = updater(c);
    for (;;) {
        pthread_mutex_lock(&o->mu);
        while (o->qhead == o->qtail && !o->qclosed) pthread_cond_wait(&o->cv, &o->mu);
        int have = o->qhead < o->qtail;
        int b = have ? o->queue[o->qhead++] : -1;
        pthread_mutex_unlock(&o->mu);
        if (!have) break;
        if (st != ZO_OK) continue; /* drain the queue after a failure */
        st = step_block(o, c, &u, b);
    }
    return sync_shards(o, st);
}

/* The delayed update, into the shadow: block by block from the last, the
 * order in which the next step's backward writes their gradient sums again
 * (each waits for its block: offload_optim_grads_free). */
static zo_status job_reverse(offload_optim *o, step_ctx *c)
{
    zo_status st = ZO_OK;
    oshard_update u = updater(c);
    for (int b = o->g->nb - 1; b >= 0 && st == ZO_OK; b--) st = step_block(o, c, &u, b);
    st = sync_shards(o, st);
    zo_status sw = c->dst->ops->sync(c->dst);
    return st != ZO_OK ? st : sw;
}

static void *opt_main(void *arg)
{
    offload_optim *o = arg;
    step_ctx c = {.o = o};
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (o->job == OFFLOAD_JOB_NONE && !o->quit) pthread_cond_wait(&o->cv, &o->mu);
        if (o->quit) break;
        int job = o->job;
        c.dst = o->dpu_pending ? o->shadow : o->ws;
        pthread_mutex_unlock(&o->mu);
        zo_status st = job == OFFLOAD_JOB_BLOCKS ? job_blocks(o, &c)
                       : c.dst == o->shadow   ? job_reverse(o, &c)
                                               : job_all(o, &c);
        pthread_mutex_lock(&o->mu);
        if (st != ZO_OK && o->status == ZO_OK) {
            o->status = st;
            snprintf(o->msg, sizeof o->msg, "%s", zo_last_error());
        }
        o->job = OFFLOAD_JOB_NONE;
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

static void post(offload_optim *o, int job)
{
    pthread_mutex_lock(&o->mu);
    o->job = job;
    o->qhead = o->qtail = 0;
    o->qclosed = 0;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/* Wait for the job in flight; its failure, if any. */
static zo_status join(offload_optim *o)
{
    pthread_mutex_lock(&o->mu);
    o->qclosed = 1;
    pthread_cond_broadcast(&o->cv);
    while (o->job != OFFLOAD_JOB_NONE) pthread_cond_wait(&o->cv, &o->mu);
    zo_status st = o->status;
    o->status = ZO_OK;
    pthread_mutex_unlock(&o->mu);
    return st == ZO_OK ? ZO_OK : zo_error(st, "%s", o->msg);
}

zo_status offload_optim_settle(offload_optim *o)
{
    zo_status st = join(o);
    if (o->dpu_pending) {
        /* DPU: the last update's weights into the store, a round of puts
         * announced on the host thread */
        wstore_will_change(o->ws, -1);
        zo_status sp = wstore_publish(o->shadow, o->ws);
        if (st == ZO_OK) st = sp;
        o->dpu_pending = 0;
    }
    /* the round over: what the ranks still owe it (ZeRO 1-2: the gathers a
     * threaded update left to this thread), and the device shard's update
     * done (the serial step leaves it running: job_all) */
    zo_status sr = wstore_settle(o->ws);
    if (st == ZO_OK) st = sr;
    sr = ostate_sync_enqueued(o->os);
    if (st == ZO_OK) st = sr;
    publish_all(o, o->ctr.step);
    return st;
}

/* ---- the step ---------------------------------------------------------------------------- */

/* The hyperparameters of step `step` with gradient multiplier coef / denom. */
static void set_hparams(offload_optim *o, int64_t step, double coef, double denom)
{
    adam_hparams hp = adam_hparams_default();
    hp.lr = o->cfg->adam.lr;
    hp.beta1 = o->cfg->adam.beta1;
    hp.beta2 = o->cfg->adam.beta2;
    hp.eps = o->cfg->adam.eps;
    hp.weight_decay = o->cfg->adam.weight_decay;
    hp.decay = ADAM_DECAY_ADAMW;
    hp.step = (long)step;
    hp.grad_mult = (float)(coef / denom);
    o->hp = hp;
}

static double clip_coef(const offload_optim *o, double norm)
{
    if (o->cfg->adam.clip <= 0.0f) return 1.0;
    double c = o->cfg->adam.clip / (norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}

int offload_optim_early(const offload_optim *o) { return o->early; }

void offload_optim_routed(offload_optim *o, int b)
{
    if (!o->routed || !o->m->expert_routed) return;
    int has = 0; /* (a block of routed experts) */
    for (int i = 0; i < o->m->n_expert_ranges && !has; i++) has = o->m->expert_ranges[i].block == b;
    for (int e = 0; has && e < o->m->experts; e++)
        if (o->m->expert_routed(o->m->user, b, e)) o->routed[(size_t)b * o->m->experts + e] = 1;
}

/* The step's experts, before its first update (on the host thread, every
 * rank at the same point of its collectives: after the last forward with
 * updates during backward, in offload_step otherwise, never where a
 * reduction's completion is polled): those any rank sent a token to in any
 * micro-batch take a step of their own; the others are left untouched. */
static zo_status routed_final(offload_optim *o)
{
    if (!o->routed || o->routed_final) return ZO_OK;
    size_t n = (size_t)o->g->nb * (size_t)o->m->experts;
    memcpy(o->step_routed, o->routed, n);
    const offload_dp *dp = o->env->dp;
    /* with expert parallelism the experts here are the rank's own: those of
     * the ranks holding the same ones (none: nothing to gather) */
    comm_t c = !dp ? NULL : dp->ep ? dp->xcomm : dp->comm;
    if (c && comm_size(c) > 1) {
        int size = comm_size(c);
        uint8_t *all = malloc(n * (size_t)size);
        if (!all) return zo_error(ZO_ERR_NOMEM, "offload_step: out of host memory");
        zo_status st = offload_dp_gather_on(o->env->dp, c, o->routed, n, all);
        for (int r = 0; r < size && st == ZO_OK; r++)
            for (size_t i = 0; i < n; i++) o->step_routed[i] |= all[(size_t)r * n + i];
        free(all);
        if (st != ZO_OK) return st;
    }
    for (size_t i = 0; i < n; i++) o->expert_steps[i] += o->step_routed[i];
    memset(o->routed, 0, n);
    o->routed_final = 1;
    return ZO_OK;
}

zo_status offload_optim_forward_done(offload_optim *o) { return o->early ? routed_final(o) : ZO_OK; }

zo_status offload_optim_micro_begin(offload_optim *o)
{
    o->early = 0;
    if (o->cfg->schedule != OFFLOAD_SCHEDULE_OVERLAP || o->dynamic_scale ||
        o->micro + 1 != o->cfg->grad_accum)
        return ZO_OK;
    double coef;
    if (o->cfg->adam.clip <= 0.0f) coef = 1.0;
    else if (o->cfg->clip_stale && o->have_prev_norm) coef = clip_coef(o, o->prev_norm);
    else return ZO_OK;
    /* the update of the step before (exact clipping: the first step) ends first */
    zo_status st = join(o);
    if (st != ZO_OK) return st;
    /* the mean over the global batch: every rank's micro-batches */
    set_hparams(o, o->ctr.step + 1, coef,
                (double)o->ctr.loss_scale * (double)o->cfg->grad_accum * (o->env->dp ? o->env->dp->size : 1));
    o->early = 1;
    post(o, OFFLOAD_JOB_BLOCKS);
    return ZO_OK;
}

zo_status offload_optim_block_done(offload_optim *o, int b)
{
    if (!o->early) return ZO_OK;
    int nf;
    zo_status st = ostate_grad_block_stats(o->os, b, &nf);
    if (st != ZO_OK) return st;
    if (nf) return ZO_OK; /* not updated: the step reports it */
    /* (the step's experts were settled after the forward: this may run
     * where a reduction's completion was polled, at a point that differs
     * from rank to rank, and must not gather) */
    wstore_will_change(o->ws, b); /* (the host thread: every rank here, at this point of its backward) */
    pthread_mutex_lock(&o->mu);
    o->queue[o->qtail++] = b;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return ZO_OK;
}

/* Sum of squares of the step's gradient and the first block holding an inf
 * or nan (-1: none): the host's blocks in order, then the device shard's.
 * Blocks whose statistics were taken as their gradients completed
 * (offload_optim_block_done) are not summed again. With the optimizer
 * partitioned, each rank's over its parts, then the ranks' in rank order
 * (the same double on every rank) and the first bad block of any. */
static zo_status grad_stats(offload_optim *o, double *sumsq, int *first_bad)
{
    double xs; /* the rank's own experts' part (expert parallelism at ZeRO-0: ostate_split_experts) */
    zo_status st = ostate_grad_stats(o->os, o->early, o->cfg->adam.clip > 0.0f, sumsq, &xs, first_bad);
    const offload_dp *dp = o->env->dp;
    /* (a partitioned state counts every element once over the world: the
     * experts once in each expert_comm, and those hold different experts) */
    if (st == ZO_OK && dp && dp->ep && !offload_dp_partitioned(dp)) {
        /* expert parallelism: the dense part is the same on every rank, the
         * experts the rank's own, kept apart by the same pass: the group's
         * experts' squares summed in rank order, each expert once (a first
         * bad block of any rank of the group) */
        comm_t c = o->cfg->ep_comm;
        int size = comm_size(c);
        struct {
            double xs;
            int32_t first_bad, pad;
        } mine = {xs, *first_bad, 0}, *all = calloc((size_t)size, sizeof mine);
        if (!all) return zo_error(ZO_ERR_NOMEM, "offload_step: out of host memory");
        st = offload_dp_gather_on(o->env->dp, c, &mine, sizeof mine, all);
        for (int r = 0; r < size && st == ZO_OK; r++) {
            *sumsq += all[r].xs;
            if (all[r].first_bad >= 0 && (*first_bad < 0 || all[r].first_bad < *first_bad))
                *first_bad = all[r].first_bad;
        }
        free(all);
        return st;
    }
    *sumsq += xs; /* (0 unless the experts were kept apart: never lost) */
    if (st != ZO_OK || !offload_dp_partitioned(o->env->dp)) return st;
    struct {
        double sumsq;
        int32_t first_bad, pad;
    } mine = {*sumsq, *first_bad, 0}, *all = calloc((size_t)o->env->dp->size, sizeof mine);
    if (!all) return zo_error(ZO_ERR_NOMEM, "offload_step: out of host memory");
    st = offload_dp_gather(o->env->dp, &mine, sizeof mine, all);
    *sumsq = 0.0;
    *first_bad = -1;
    for (int r = 0; r < o->env->dp->size && st == ZO_OK; r++) {
        *sumsq += all[r].sumsq;
        if (all[r].first_bad >= 0 && (*first_bad < 0 || all[r].first_bad < *first_bad)) *first_bad = all[r].first_bad;
    }
    free(all);
    return st;
}

/* Gradients with an inf or nan: with a loss scale to lower (fp16 above 1) the
 * step is skipped and the scale halved, a bounded number of times in a row;
 * otherwise nothing would ever change it, and the step fails naming the
 * block. `early`: the updates of the blocks whose gradients completed
 * finite had started during backward (overlap without exact clipping, never
 * with a loss scale). */
static zo_status nonfinite_step(offload_optim *o, int bad_block, int early, offload_step_info *info)
{
    int can_lower = !early && o->dynamic_scale && o->ctr.loss_scale > 1.0f;
    if (can_lower && o->ctr.skipped_in_a_row < o->cfg->max_skipped_steps) {
        o->ctr.loss_scale *= 0.5f;
        o->ctr.good_steps = 0;
        o->ctr.skipped++;
        o->ctr.skipped_in_a_row++;
        info->skipped = 1;
        info->step = o->ctr.step;
        return ZO_OK;
    }
    char why[160];
    if (!o->dynamic_scale)
        snprintf(why, sizeof why, "in %s there is no loss scale to lower", zo_dtype_name(o->m->dtype));
    else if (!can_lower)
        snprintf(why, sizeof why, "the fp16 loss scale is already %g, nothing left to lower",
                 (double)o->ctr.loss_scale);
    else
        snprintf(why, sizeof why, "%d steps in a row were skipped for overflow already "
                 "(max_skipped_steps)", o->ctr.skipped_in_a_row);
    return zo_error(ZO_ERR_INVALID, "offload_step %lld: the gradients of block %d hold inf or nan "
                    "and %s: training diverged (a learning rate too high?) or its inputs are bad; %s",
                    (long long)o->ctr.step + 1, bad_block, why,
                    early ? "the updates of the blocks whose gradients were finite had started "
                            "(schedule overlap without exact clipping)"
                          : "nothing was updated");
}

zo_status offload_optim_step(offload_optim *o, offload_step_info *info)
{
    offload_acct *a = o->env->acct;
    zo_status st;
    int early = o->early;
    /* the updates started during backward finish first */
    if (early && (st = join(o)) != ZO_OK) {
        o->early = 0;
        return st;
    }
    info->loss_scale = o->ctr.loss_scale;
    info->skipped = 0;
    /* the norm's statistics are the step's: its time part (the update's
     * is counted where it runs) */
    offload_timer t0 = offload_time_begin();
    double sumsq;
    int first_bad;
    st = grad_stats(o, &sumsq, &first_bad);
    offload_time_end(a, OFFLOAD_TIME_OPTIMIZER, t0);
    o->early = 0;
    if (st != ZO_OK) return st;
    /* the mean over the global batch: every rank's micro-batches */
    double denom = (double)o->ctr.loss_scale * (double)o->micro * (o->env->dp ? o->env->dp->size : 1);
    double norm = sqrt(sumsq) / denom;
    info->grad_norm = (float)norm;
    o->micro = 0;
    if (first_bad >= 0) {
        t0 = offload_time_begin();
        st = nonfinite_step(o, first_bad, early, info);
        if (o->routed) memset(o->routed, 0, (size_t)o->g->nb * (size_t)o->m->experts); /* (the step's batches) */
        offload_time_end(a, OFFLOAD_TIME_OPTIMIZER, t0);
        return st;
    }
    if ((st = routed_final(o)) != ZO_OK) return st;
    o->routed_final = 0; /* (the next step's, from its first update) */
    o->prev_norm = (float)norm;
    o->have_prev_norm = 1;
    step_ctx c = {.o = o, .dst = o->ws};
    int dpu = o->cfg->schedule == OFFLOAD_SCHEDULE_DPU && o->ctr.step >= o->cfg->dpu_warmup;
    if (dpu) {
        c.dst = o->shadow;
        o->dpu_pending = 1;
    }
    if (!early) set_hparams(o, o->ctr.step + 1, clip_coef(o, norm), denom);
    o->ctr.step++;
    /* the round of puts into the store starts: announced on the host thread
     * (dpu: into the shadow, announced when it is published) */
    if (c.dst == o->ws) wstore_will_change(o->ws, -1);
    /* the enqueued update first (the device shard's): it runs while the
     * host updates the others */
    oshard_update u = updater(&c);
    if ((st = ostate_step_enqueued(o->os, &u)) != ZO_OK)
        return zo_error_wrap(st, "offload_step %lld", (long long)o->ctr.step);
    if (early) {
        /* the host's updates are done: the enqueued one remains */
        zo_status sd = ostate_sync(o->os);
        zo_status sw = o->ws->ops->sync(o->ws);
        st = sd != ZO_OK ? sd : sw;
        if (st == ZO_OK) publish_all(o, o->ctr.step);
    } else if (o->threaded) {
        post(o, OFFLOAD_JOB_ALL); /* runs beside the next micro-batches */
    } else {
        st = job_all(o, &c);
    }
    if (st != ZO_OK) return zo_error_wrap(st, "offload_step %lld", (long long)o->ctr.step);
    o->ctr.skipped_in_a_row = 0;
    if (o->dynamic_scale && ++o->ctr.good_steps >= o->cfg->loss_scale_window) {
        o->ctr.loss_scale *= 2.0f;
        o->ctr.good_steps = 0;
    }
    info->step = o->ctr.step;
    return ZO_OK;
}

/* ---- life cycle ---------------------------------------------------------------------- */

wstore *offload_optim_shadow(offload_optim *o) { return o->shadow; }

zo_status offload_optim_create(const offload_env *env, const offload_config *cfg, const offload_model *m,
                               const offload_geom *g, const offload_geom *og, wstore *ws, ostate *os,
                               offload_optim **out)
{
    *out = NULL;
    offload_optim *o = calloc(1, sizeof *o);
    if (!o) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    *o = (offload_optim){.env = env, .cfg = cfg, .m = m, .g = g, .og = og, .ws = ws, .os = os};
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    o->dynamic_scale = m->dtype == ZO_DTYPE_F16;
    o->ctr.loss_scale = cfg->loss_scale > 0 ? cfg->loss_scale : (o->dynamic_scale ? OFFLOAD_LOSS_SCALE_INIT : 1.0f);
    o->threaded = cfg->schedule != OFFLOAD_SCHEDULE_SERIAL;
    o->threads = o->sum_threads = cfg->n_threads;
    if (o->threaded) {
        /* the optimizer's thread updates beside the host's gradient sums:
         * the cores split between the two teams */
        int cores = cfg->n_threads > 0 ? cfg->n_threads : adam_grad_accumulate_threads(SIZE_MAX, 0);
        zo_host_teams(cores, cfg->opt_threads, &o->sum_threads, &o->threads);
        o->cores = cores;
    }
    o->published = calloc((size_t)g->nb, sizeof *o->published);
    o->queue = calloc((size_t)g->nb, sizeof *o->queue);
    zo_status st = ZO_OK;
    if (!o->published || !o->queue) st = zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    size_t ne = m->n_expert_ranges ? (size_t)g->nb * (size_t)m->experts : 0;
    if (st == ZO_OK && ne &&
        (!(o->routed = calloc(ne, 1)) || !(o->step_routed = calloc(ne, 1)) ||
         !(o->expert_steps = calloc(ne, sizeof *o->expert_steps)) ||
         !(o->expert_at = calloc((size_t)m->n_expert_ranges, sizeof *o->expert_at))))
        st = zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    /* expert parallelism at ZeRO-0: the clipping norm's experts' part, kept
     * apart by the block statistics (grad_stats gathers it alone) */
    int split = env->dp && env->dp->ep && !offload_dp_partitioned(env->dp);
    for (int i = 0; o->expert_at && i < m->n_expert_ranges; i++) {
        const offload_expert_range *x = &m->expert_ranges[i];
        o->expert_at[i] = (offload_decay_range){.block = x->block, .offset = x->offset, .numel = x->numel};
        if (st == ZO_OK && split) st = ostate_split_experts(os, x->block, x->offset, x->numel);
    }
    if (st == ZO_OK && cfg->schedule == OFFLOAD_SCHEDULE_DPU) {
        /* the new weights of the update in flight land in a host copy (of
         * the optimizer's geometry: the rank's parts with ZeRO 1-3) */
        wstore_config sc = {.tier = OFFLOAD_CPU, .name = "dpu"};
        if ((st = wstore_create(env, og, &sc, &o->shadow)) != ZO_OK)
            st = zo_error_wrap(st, "offload_init: the delayed update's copy of the weights");
    }
    if (st == ZO_OK && o->threaded) {
        /* the thread takes no signals: the application's handlers run on its
         * own threads (train's SIGINT/SIGTERM stop, its test seam's
         * sigsuspend) */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int rc = pthread_create(&o->thread, NULL, opt_main, o);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc) st = zo_error(ZO_ERR_NOMEM, "offload_init: cannot start the optimizer's thread");
        else o->started = 1;
    }
    if (st != ZO_OK) {
        offload_optim_free(o);
        return st;
    }
    *out = o;
    return ZO_OK;
}

void offload_optim_free(offload_optim *o)
{
    if (!o) return;
    /* the thread ends first: its update may use everything */
    if (o->started) {
        join(o);
        pthread_mutex_lock(&o->mu);
        o->quit = 1;
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
        pthread_join(o->thread, NULL);
    }
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    wstore_free(o->shadow);
    free(o->published);
    free(o->queue);
    free(o->routed);
    free(o->step_routed);
    free(o->expert_steps);
    free(o->expert_at);
    free(o);
}
