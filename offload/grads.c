/* Gradient sums: where each block's gradient is added over the micro-batches
 * of a step, and (several ranks) how it is reduced.
 *
 * A block's gradient is summed where the optimizer shard holding it says
 * (ostate_grad_sum): a device buffer (fp32, added to on the device) or a
 * host range (fp32, copied out of the gradient slot on the d2h stream and
 * added by the host while the device runs the next block's backward). Each
 * block's path to its sum is chosen once, at init, from what the shard
 * handed out.
 *
 * Several ranks (offload_dp), chosen once at init:
 *   ZeRO 0   sums as with one rank, of the whole model; in the step's last
 *            micro-batch each block's sum is all-reduced as soon as it is
 *            complete (through a device bucket when it is in host memory),
 *            behind the backward of the blocks before it (DDP's buckets)
 *   ZeRO 1   the same sums, reduce-scattered the same way; the rank keeps
 *            its part (in place in the host sums, padded per block; in
 *            place in the whole device sums ZeRO-1 keeps for a device
 *            share, where the device shard reads it)
 *   ZeRO 2-3 after each block's backward its gradient is cast to the
 *            reduce dtype in a device bucket and reduce-scattered; only the
 *            rank's part is summed (no rank holds a whole gradient)
 * Every reduction is in the reduce dtype (offload_config.reduce_dtype, the
 * buckets' elements; fp32 by default), every sum over micro-batches in
 * fp32. In 16 bits: ZeRO 0-1 round each block's fp32 sum once to the reduce
 * dtype (the host, in place, for a host sum; the device, into the bucket,
 * for a device sum), the collective adds in fp32 and rounds each partial
 * sum to the reduce dtype, and the result is widened exactly into the fp32
 * sum (or the rank's part); ZeRO 2-3 cast each micro-batch's gradient (the
 * model's dtype) to the reduce dtype, reduce-scatter it so, and add the
 * rank's piece, widened, into its fp32 sum. */
#include "offload/grads.h"

#include <stdlib.h>
#include <string.h>

#include "cpu_adam/cpu_adam.h" /* defines: adam_grad_accumulate */

/* ---- the sums ------------------------------------------------------------------------ */

/* A block's way to its sum: how the gradients of a slot reach it, and how
 * it is reduced over the ranks. */
struct grads_path {
    /* ZeRO 0-1 (and one rank): slot k's gradients of `block` (own: the
     * block's own, not a dependant's share), just written on s */
    zo_status (*send)(offload_grads *gr, gpu_stream_t s, int k, int block, int own);
    /* ZeRO 2-3: m elements of the rank's part from `first` on, reduced in
     * `mine` (device, the reduce dtype), to the sum of `block` through slot
     * k, on d2h */
    zo_status (*piece)(offload_grads *gr, int k, int block, size_t first, const void *mine, size_t m);
    /* ZeRO 2-3: the pieces of slot k's `block` (pn elements of the rank's
     * part) are sent */
    void (*pieces_sent)(offload_grads *gr, int k, int block, size_t pn, int own);
    /* ZeRO 0-1: block b's sum complete, reduced over the ranks (after the
     * work enqueued on s; NULL: at the step) */
    zo_status (*reduce)(offload_grads *gr, int b, gpu_stream_t s);
};

static zo_status added(offload_grads *gr, int b, gpu_stream_t s);
static zo_status early_reduced(offload_grads *gr, int wait);
static void widen(offload_grads *gr, int b);

/* Add the gradients of gradient slot k (on the host once its copy is done)
 * into the fp32 sum. */
zo_status offload_grads_accumulate(offload_grads *gr, int k)
{
    offload_gslot *g = &gr->gs[k];
    if (g->block < 0) return ZO_OK;
    zo_status st = offload_timed_wait(gr->env, g->copied, OFFLOAD_TIME_GRADS);
    if (st != ZO_OK) return st;
    offload_timer t0 = offload_time_begin();
    int b = g->block;
    size_t n = g->n;
    float *acc = gr->sums[b].host;
    const void *src = g->host;
    /* the step's first addition into the block writes 0 + x (lazily: the
     * update of the step before may still be reading the other blocks);
     * later ones add, vectorized over the host sums' team */
    int fresh = gr->fresh[b];
    if (fresh) {
        offload_optim_grads_free(gr->opt, b);
        gr->fresh[b] = 0;
    }
    g->block = -1;
    /* (a block with nothing to train: no sum at all) */
    int beside, team = offload_optim_sum_threads(gr->opt, &beside), stats_threads;
    /* the block's last addition of the step (its own gradients, in the
     * step's last micro-batch, one rank: no reduction follows) takes the
     * step's statistics of the sum in the same pass, which the step then
     * does not read again */
    int fuse = n && !gr->env->dp && g->own && gr->opt->micro + 1 >= gr->grad_accum &&
               ostate_grad_fusable(gr->os, b, n, &stats_threads);
    if (fuse) {
        double sumsq;
        int nf;
        st = adam_grad_accumulate_stats(acc, src, gr->ghost_dtype, n, fresh, team, stats_threads, &sumsq, &nf);
        if (st == ZO_OK) ostate_grad_block_taken(gr->os, b, sumsq, nf);
    } else {
        st = n ? adam_grad_accumulate(acc, src, gr->ghost_dtype, n, fresh, team) : ZO_OK;
        ostate_grad_block_changed(gr->os, b);
    }
    if (st != ZO_OK) return zo_error_wrap(st, "offload: the gradient sum of block %d", b);
    if (n) gr->env->acct->grad_sums++, gr->env->acct->grad_sums_beside += beside;
    offload_time_end(gr->env->acct, OFFLOAD_TIME_GRADS, t0);
    int was_reduced = gr->reduced && gr->reduced[b];
    if ((st = added(gr, b, NULL)) != ZO_OK) return st;
    if (!offload_optim_early(gr->opt)) return ZO_OK;
    if (gr->red_op >= 0) {
        /* ZeRO 0-1: the update waits for the reduction just issued */
        if (!was_reduced && gr->reduced[b]) {
            if ((st = gpu_event_record(gr->red_ev[b], gr->env->d2h)) != ZO_OK) return st;
            gr->red_wait[gr->n_red_wait++] = b;
        }
        return early_reduced(gr, 0);
    }
    /* a block's own gradients come last (the shares of blocks that read it
     * came in earlier backwards): in the step's last micro-batch they are
     * complete, and its update may start */
    return g->own ? offload_optim_block_done(gr->opt, b) : ZO_OK;
}

/* ZeRO 0-1, updates during backward: the blocks whose reductions are back
 * in their sums (all of them, waiting, with `wait`) handed to the
 * optimizer, oldest first. */
static zo_status early_reduced(offload_grads *gr, int wait)
{
    zo_status st;
    int done = 0;
    while (done < gr->n_red_wait) {
        int b = gr->red_wait[done];
        if (!wait && !gpu_event_query(gr->red_ev[b])) break;
        if ((st = offload_timed_wait(gr->env, gr->red_ev[b], OFFLOAD_TIME_COMM)) != ZO_OK) return st;
        widen(gr, b);
        if ((st = offload_optim_block_done(gr->opt, b)) != ZO_OK) return st;
        done++;
    }
    memmove(gr->red_wait, gr->red_wait + done, (size_t)(gr->n_red_wait - done) * sizeof *gr->red_wait);
    gr->n_red_wait -= done;
    return ZO_OK;
}

void offload_grads_forget(offload_grads *gr)
{
    for (int k = 0; k < OFFLOAD_GRAD_SLOTS; k++) gr->gs[k].block = -1;
    gr->n_red_wait = 0;
    if (gr->narrowed) memset(gr->narrowed, 0, (size_t)gr->g->nb); /* the sums start again */
}

zo_status offload_grads_drain(offload_grads *gr)
{
    zo_status st;
    for (int k = 0; k < OFFLOAD_GRAD_SLOTS; k++)
        if ((st = offload_grads_accumulate(gr, k)) != ZO_OK) return st;
    return gr->n_red_wait ? early_reduced(gr, 1) : ZO_OK;
}

/* A free gradient slot, zeroed on s; `avoid` is a slot already taken. */
zo_status offload_grads_take(offload_grads *gr, gpu_stream_t s, int avoid, int *out)
{
    zo_status st;
    int k = -1;
    for (int i = 0; i < OFFLOAD_GRAD_SLOTS; i++)
        if (i != avoid && gr->gs[i].block < 0) {
            k = i;
            break;
        }
    if (k < 0) {
        k = avoid == 0 ? 1 : 0;
        if ((st = offload_grads_accumulate(gr, k)) != ZO_OK) return st;
    }
    /* the device buffer (and its bucket) is free once its last copy out has run */
    if ((st = gpu_stream_wait_event(s, gr->gs[k].copied)) != ZO_OK ||
        (st = gpu_memset_async(s, gr->gs[k].dev, 0, gr->g->slot_bytes)) != ZO_OK)
        return st;
    *out = k;
    return ZO_OK;
}

zo_status offload_grads_begin(offload_grads *gr, gpu_stream_t s)
{
    zo_status st;
    int nb = gr->g->nb;
    if (gr->opt->micro == 0) {
        memset(gr->fresh, 1, (size_t)nb);
        if ((st = ostate_grad_zero(gr->os, s)) != ZO_OK) return st;
        if (gr->reduced) memset(gr->reduced, 0, (size_t)nb);
    } else if (gr->reduced && memchr(gr->reduced, 1, (size_t)nb)) {
        return zo_error(ZO_ERR_INVALID, "offload_micro_batch: the gradients of %d micro-batches (grad_accum) are "
                        "already reduced over the ranks: offload_step first", gr->opt->micro);
    }
    gr->reduce_now = gr->red_op >= 0 && gr->opt->micro + 1 == gr->grad_accum;
    if (gr->contrib) memset(gr->contrib, 0, (size_t)nb * sizeof *gr->contrib);
    return ZO_OK;
}

/* ZeRO 0-1, the step's last micro-batch: one more addition to block b's
 * sum; the last one reduces it at once (a device sum after the additions
 * enqueued on s). */
static zo_status added(offload_grads *gr, int b, gpu_stream_t s)
{
    if (!gr->reduce_now || ++gr->contrib[b] < gr->contrib_want[b] || !gr->g->numel[b]) return ZO_OK;
    gr->reduced[b] = 1;
    return gr->path[b]->reduce(gr, b, s);
}

/* ---- after a block's backward ------------------------------------------------------------ */

/* ZeRO 0-1, a device sum: slot k's gradients of `block` added to it (the
 * same fp32 additions as the host's, so the same bits). */
static zo_status send_dev(offload_grads *gr, gpu_stream_t s, int k, int block, int own)
{
    zo_status st;
    offload_gslot *g = &gr->gs[k];
    size_t n = gr->g->numel[block];
    float *acc = gr->sums[block].dev;
    (void)own;
    if ((st = ostate_grad_ready(gr->os, s)) != ZO_OK) return st;
    /* acc [n] fp32 += slot [n] model dtype, in stream order after backward;
     * the slot is zeroed for its next block later on the same stream */
    if (n && (st = gpu_add(s, gpu_t(acc, ZO_DTYPE_F32), gpu_t(acc, ZO_DTYPE_F32), gpu_t(g->dev, gr->g->dtype), n)) !=
                 ZO_OK)
        return st;
    g->block = -1;
    return added(gr, block, s);
}

/* ZeRO 0-1, a host sum: slot k's gradients of `block` copied out for the
 * host to add (offload_grads_accumulate). */
static zo_status send_host(offload_grads *gr, gpu_stream_t s, int k, int block, int own)
{
    zo_status st;
    offload_gslot *g = &gr->gs[k];
    size_t n = gr->g->numel[block], bytes = n * gr->g->es;
    if ((st = gpu_event_record(g->done, s)) != ZO_OK ||
        (st = gpu_stream_wait_event(gr->env->d2h, g->done)) != ZO_OK)
        return st;
    if (bytes && (st = gpu_memcpy_async(gr->env->d2h, g->host, g->dev, bytes, GPU_COPY_DEVICE_TO_HOST)) != ZO_OK)
        return st;
    if ((st = gpu_event_record(g->copied, gr->env->d2h)) != ZO_OK) return st;
    offload_add_bytes(gr->env->acct, OFFLOAD_BYTES_D2H, bytes);
    g->block = block;
    g->n = n;
    g->own = own;
    return ZO_OK;
}

/* Piece p of block b into bucket bk, every rank's share of it rank after
 * rank, from `src` (the whole block, dtype dt, device or host, by `kind`;
 * host memory in the reduce dtype only) in the reduce dtype, the padding
 * zeroed; on stream s. */
static zo_status pack_piece(offload_grads *gr, gpu_stream_t s, const void *src, zo_dtype dt, gpu_copy_kind kind,
                            const offload_piece *p, void *bk)
{
    offload_dp *dp = gr->env->dp;
    size_t es = zo_dtype_size(dt), rs = zo_dtype_size(dp->red), q = p->q;
    zo_status st;
    for (int r = 0; r < p->size; r++) {
        size_t nr, at = offload_piece_src(p, r, &nr);
        char *dst = (char *)bk + (size_t)r * q * rs;
        const char *from = (const char *)src + at * es;
        if (!nr) st = ZO_OK;
        else if (dt == dp->red) st = gpu_memcpy_async(s, dst, from, nr * rs, kind);
        else st = gpu_cast(s, gpu_t(dst, dp->red), gpu_t((void *)from, dt), nr);
        if (st != ZO_OK) return st;
        if (nr < q && (st = gpu_memset_async(s, dst + nr * rs, 0, (q - nr) * rs)) != ZO_OK) return st;
    }
    return ZO_OK;
}

/* ZeRO 2-3, a device sum: the rank's piece (the reduce dtype) added to it. */
static zo_status piece_dev(offload_grads *gr, int k, int block, size_t first, const void *mine, size_t m)
{
    float *acc = gr->sums[block].dev + first;
    (void)k;
    return gpu_add(gr->env->d2h, gpu_t(acc, ZO_DTYPE_F32), gpu_t(acc, ZO_DTYPE_F32),
                   gpu_t((void *)mine, gr->env->dp->red), m);
}

/* ZeRO 2-3, a host sum: the rank's piece (the reduce dtype) copied out into
 * slot k's pinned half, at its place in the part. */
static zo_status piece_host(offload_grads *gr, int k, int block, size_t first, const void *mine, size_t m)
{
    (void)block;
    size_t rs = zo_dtype_size(gr->env->dp->red);
    char *dst = (char *)gr->gs[k].host + first * rs;
    zo_status st = gpu_memcpy_async(gr->env->d2h, dst, mine, m * rs, GPU_COPY_DEVICE_TO_HOST);
    if (st == ZO_OK) offload_add_bytes(gr->env->acct, OFFLOAD_BYTES_D2H, m * rs);
    return st;
}

/* The device adds the pieces itself: nothing is left for the host. */
static void sent_dev(offload_grads *gr, int k, int block, size_t pn, int own)
{
    (void)gr, (void)k, (void)block, (void)pn, (void)own;
}

/* The host adds slot k's pinned half once its copies are done. */
static void sent_host(offload_grads *gr, int k, int block, size_t pn, int own)
{
    offload_gslot *g = &gr->gs[k];
    if (!gr->g->numel[block]) return;
    g->block = block;
    g->n = pn;
    g->own = own;
}

/* ZeRO 2-3: slot k's gradients of `block` in fp32 into bucket k, piece by
 * piece (one piece when the block fits), reduce-scattered in place; on the
 * d2h stream (the compute goes on) the rank's piece goes to its sum. The
 * slot's `copied` marks the bucket free. */
static zo_status send_scatter(offload_grads *gr, gpu_stream_t s, int k, int block, int own)
{
    offload_dp *dp = gr->env->dp;
    offload_gslot *g = &gr->gs[k];
    gpu_stream_t d2h = gr->env->d2h;
    const grads_path *path = gr->path[block];
    size_t n = gr->g->numel[block], pn = dp->part_n[block];
    void *bk = dp->bucket[k];
    zo_status st;
    g->block = -1;
    for (size_t j = 0; j < offload_dp_pieces(dp, block, dp->bucket_q); j++) {
        offload_piece p;
        offload_dp_piece(dp, block, n, j, dp->bucket_q, &p);
        const void *mine = offload_dp_bucket_at(dp, k, (size_t)p.rank * p.q);
        /* the bucket's previous piece has left it */
        if (j && (st = gpu_stream_wait_event(s, g->copied)) != ZO_OK) return st;
        if ((st = pack_piece(gr, s, g->dev, gr->g->dtype, GPU_COPY_DEVICE_TO_DEVICE, &p, bk)) != ZO_OK ||
            (st = gpu_event_record(dp->ev_in_s, s)) != ZO_OK ||
            (st = offload_dp_piece_collective(dp, DP_REDUCE_SCATTER, &p, bk, dp->red, dp->ev_in_s, dp->ev_out)) !=
                ZO_OK ||
            (st = gpu_stream_wait_event(d2h, dp->ev_out)) != ZO_OK)
            return st;
        if (p.mine && (st = path->piece(gr, k, block, p.loc, mine, p.mine)) != ZO_OK) return st;
        if ((st = gpu_event_record(g->copied, d2h)) != ZO_OK) return st;
    }
    path->pieces_sent(gr, k, block, pn, own);
    return ZO_OK;
}

/* ZeRO 0-1: the block's own path; ZeRO 2-3: reduce-scattered first. */
static zo_status send_own(offload_grads *gr, gpu_stream_t s, int k, int block, int own)
{
    return gr->path[block]->send(gr, s, k, block, own);
}

zo_status offload_grads_send(offload_grads *gr, gpu_stream_t s, int k, int block, int own)
{
    return gr->send(gr, s, k, block, own);
}

/* ---- at the step: ZeRO 0-1 ---------------------------------------------------------- */

/* n fp32 values rounded (to nearest even) to the 16-bit `red`, in place:
 * value i goes to bytes [2i, 2i + 2), behind every value not yet read. */
static void narrow_in_place(float *x, size_t n, zo_dtype red)
{
    char *p = (char *)x;
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        uint16_t h = red == ZO_DTYPE_BF16 ? zo_f32_to_bf16(v) : zo_f32_to_f16(v);
        memcpy(p + 2 * i, &h, 2);
    }
}

/* The reverse, exactly: n 16-bit values at the start of x widened to fp32,
 * last first (value i is read before bytes [2i, 2i + 2) are written). */
static void widen_in_place(float *x, size_t n, zo_dtype red)
{
    char *p = (char *)x;
    for (size_t i = n; i-- > 0;) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        float v = red == ZO_DTYPE_BF16 ? zo_bf16_to_f32(h) : zo_f16_to_f32(h);
        memcpy(p + 4 * i, &v, 4);
    }
}

/* ZeRO 0-1, a host sum reduced in 16 bits: its result (the whole block, or
 * the rank's part), back in host memory, widened where the optimizer reads
 * it. */
static void widen(offload_grads *gr, int b)
{
    if (!gr->narrowed || !gr->narrowed[b]) return;
    offload_dp *dp = gr->env->dp;
    gr->narrowed[b] = 0;
    if (gr->red_op == DP_ALL_REDUCE) widen_in_place(gr->sums[b].host, gr->g->numel[b], dp->red);
    else widen_in_place(gr->sums[b].part, dp->part_n[b], dp->red);
}

/* An all-reduce's segment k of block b: 0 the elements before its routed
 * experts, 1 the experts, 2 those after them; with expert parallelism the
 * experts are this rank's own, reduced over the ranks holding the same
 * ones (offload_dp.xcomm), the rest over all ranks. Without it segment 0
 * is the whole block. */
static void red_segment(const offload_grads *gr, int b, int k, size_t *lo, size_t *hi)
{
    const offload_dp *dp = gr->env->dp;
    size_t n = gr->g->numel[b], xl = dp->ep ? dp->xlo[b] : n, xh = dp->ep ? dp->xhi[b] : n;
    *lo = k == 0 ? 0 : k == 1 ? xl : xh;
    *hi = k == 0 ? xl : k == 1 ? xh : n;
}

static size_t red_pieces(const offload_grads *gr, int b)
{
    const offload_dp *dp = gr->env->dp;
    size_t cap = dp->bucket_q * (size_t)dp->size, n = 0;
    if (gr->red_op != DP_ALL_REDUCE) return offload_dp_pieces(dp, b, dp->bucket_q);
    for (int k = 0; k < 3; k++) {
        size_t lo, hi;
        red_segment(gr, b, k, &lo, &hi);
        n += (hi - lo + cap - 1) / cap;
    }
    return n;
}

/* *expert: an all-reduce's piece of the rank's experts (expert parallelism). */
static void red_piece(const offload_grads *gr, int b, size_t j, offload_piece *p, int *expert)
{
    const offload_dp *dp = gr->env->dp;
    size_t n = gr->g->numel[b], cap = dp->bucket_q * (size_t)dp->size;
    *expert = 0;
    if (gr->red_op == DP_ALL_REDUCE) {
        for (int k = 0; k < 3; k++) {
            size_t lo, hi, np;
            red_segment(gr, b, k, &lo, &hi);
            if (j >= (np = (hi - lo + cap - 1) / cap)) {
                j -= np;
                continue;
            }
            p->first = p->loc = lo + j * cap;
            p->q = p->real = p->mine = hi - p->first < cap ? hi - p->first : cap;
            *expert = k == 1 && dp->ep;
            return;
        }
    }
    offload_dp_piece(dp, b, n, j, dp->bucket_q, p);
}

/* A piece's collective: an all-reduce over every rank, or of the rank's
 * experts over the ranks holding the same ones; a reduce-scatter on the
 * piece's communicator. */
static zo_status red_collective(offload_dp *dp, dp_op op, int expert, const offload_piece *p, void *bk,
                                gpu_event_t after)
{
    if (op != DP_ALL_REDUCE) return offload_dp_piece_collective(dp, op, p, bk, dp->red, after, dp->ev_out);
    if (expert) return offload_dp_all_reduce_experts(dp, p->q, bk, dp->red, after, dp->ev_out);
    return offload_dp_collective(dp, op, p->q, p->real, bk, dp->red, after, dp->ev_out);
}

/* Block b's host sum through the buckets (alternating, red_k the next),
 * piece by piece: in, reduced, the result (whole, or the rank's part where
 * the optimizer reads it) back out; a bucket's event marks it free. In a
 * 16-bit reduce dtype the host rounds the whole sum first, in place (the
 * 16-bit values in the first half of its bytes), the results come back
 * 16-bit to the start of their places, and widen() finishes them once
 * they are there (each piece's results land where that piece's inputs
 * were, after they left). */
static zo_status reduce_host(offload_grads *gr, int b, gpu_stream_t s)
{
    offload_dp *dp = gr->env->dp;
    const offload_env *env = gr->env;
    dp_op op = (dp_op)gr->red_op;
    int *k = &gr->red_k;
    size_t n = gr->g->numel[b], rs = zo_dtype_size(dp->red);
    char *sum = (char *)gr->sums[b].host, *part = (char *)gr->sums[b].part;
    /* (with expert parallelism a part in segments lands from the start of
     * the whole sum: each piece's results before the inputs still to be
     * read, as a part's elements come in block order) */
    (void)s;
    if (dp->red != ZO_DTYPE_F32) {
        offload_timer t0 = offload_time_begin();
        narrow_in_place(gr->sums[b].host, n, dp->red);
        offload_time_end(env->acct, OFFLOAD_TIME_GRADS, t0);
        gr->narrowed[b] = 1;
    }
    zo_status st;
    for (size_t j = 0; j < red_pieces(gr, b); j++, *k ^= 1) {
        void *bk = dp->bucket[*k];
        offload_piece p;
        int expert;
        red_piece(gr, b, j, &p, &expert);
        if (expert && !dp->xcomm) continue; /* no other rank holds these experts */
        if ((st = offload_timed_wait(env, dp->bucket_ev[*k], OFFLOAD_TIME_GRADS)) != ZO_OK) return st;
        st = op == DP_ALL_REDUCE
                 ? gpu_memcpy_async(env->h2d, bk, sum + p.first * rs, p.q * rs, GPU_COPY_HOST_TO_DEVICE)
                 : pack_piece(gr, env->h2d, sum, dp->red, GPU_COPY_HOST_TO_DEVICE, &p, bk);
        if (st != ZO_OK) return st;
        if ((st = gpu_event_record(dp->ev_in, env->h2d)) != ZO_OK ||
            (st = red_collective(dp, op, expert, &p, bk, dp->ev_in)) != ZO_OK ||
            (st = gpu_stream_wait_event(env->d2h, dp->ev_out)) != ZO_OK)
            return st;
        if (op == DP_ALL_REDUCE)
            st = gpu_memcpy_async(env->d2h, sum + p.first * rs, bk, p.mine * rs, GPU_COPY_DEVICE_TO_HOST);
        else if (p.mine)
            st = gpu_memcpy_async(env->d2h, part + p.loc * rs, offload_dp_bucket_at(dp, *k, (size_t)p.rank * p.q),
                                  p.mine * rs, GPU_COPY_DEVICE_TO_HOST);
        if (st != ZO_OK) return st;
        offload_add_bytes(gr->env->acct, OFFLOAD_BYTES_H2D, p.real * rs);
        offload_add_bytes(gr->env->acct, OFFLOAD_BYTES_D2H, p.mine * rs);
        if ((st = gpu_event_record(dp->bucket_ev[*k], env->d2h)) != ZO_OK) return st;
    }
    return ZO_OK;
}

/* n values from src (dtype sd) to dst (dtype dt), device to device, on s. */
static zo_status cast_or_copy(gpu_stream_t s, void *dst, zo_dtype dt, const void *src, zo_dtype sd, size_t n)
{
    if (dt == sd) return gpu_memcpy_async(s, dst, src, n * zo_dtype_size(dt), GPU_COPY_DEVICE_TO_DEVICE);
    return gpu_cast(s, gpu_t(dst, dt), gpu_t((void *)src, sd), n);
}

/* Block b's device sum in a 16-bit reduce dtype, or reduce-scattered from
 * a part in segments (expert parallelism: its result lands from the start
 * of the sum, as reduce_host's): through the buckets
 * (alternating, red_k the next), piece by piece, rounded into a bucket on
 * `in` (the compute stream after its additions, or h2d at the step), reduced,
 * and widened back on d2h into the sum (all-reduce) or the rank's part of it
 * (reduce-scatter, where the device shard reads it). */
static zo_status reduce_dev_16(offload_grads *gr, int b, gpu_stream_t s)
{
    offload_dp *dp = gr->env->dp;
    const offload_env *env = gr->env;
    dp_op op = (dp_op)gr->red_op;
    int *k = &gr->red_k;
    float *sum = gr->sums[b].dev;
    gpu_stream_t in = s ? s : env->h2d;
    gpu_event_t ev = s ? dp->ev_in_s : dp->ev_in; /* (each event recorded on one stream only) */
    zo_status st;
    for (size_t j = 0; j < red_pieces(gr, b); j++, *k ^= 1) {
        void *bk = dp->bucket[*k];
        offload_piece p;
        int expert;
        red_piece(gr, b, j, &p, &expert);
        if (expert && !dp->xcomm) continue; /* no other rank holds these experts */
        if ((st = offload_timed_wait(env, dp->bucket_ev[*k], OFFLOAD_TIME_GRADS)) != ZO_OK) return st;
        st = op == DP_ALL_REDUCE ? cast_or_copy(in, bk, dp->red, sum + p.first, ZO_DTYPE_F32, p.q)
                                 : pack_piece(gr, in, sum, ZO_DTYPE_F32, GPU_COPY_DEVICE_TO_DEVICE, &p, bk);
        if (st != ZO_OK) return st;
        if ((st = gpu_event_record(ev, in)) != ZO_OK || (st = red_collective(dp, op, expert, &p, bk, ev)) != ZO_OK ||
            (st = gpu_stream_wait_event(env->d2h, dp->ev_out)) != ZO_OK)
            return st;
        if (op == DP_ALL_REDUCE)
            st = cast_or_copy(env->d2h, sum + p.first, ZO_DTYPE_F32, bk, dp->red, p.mine);
        else if (p.mine)
            st = cast_or_copy(env->d2h, sum + dp->part_off[b] + p.loc, ZO_DTYPE_F32,
                              offload_dp_bucket_at(dp, *k, (size_t)p.rank * p.q), dp->red, p.mine);
        if (st != ZO_OK || (st = gpu_event_record(dp->bucket_ev[*k], env->d2h)) != ZO_OK) return st;
    }
    return ZO_OK;
}

/* Block b's device sum, reduced in place: all-reduced (ZeRO 0: the device
 * shard holds the whole block) or reduce-scattered (ZeRO 1: the device
 * shard reads its part where it lands), after the additions enqueued on s
 * (NULL at the step: the host waited for the compute). */
static zo_status reduce_dev(offload_grads *gr, int b, gpu_stream_t s)
{
    offload_dp *dp = gr->env->dp;
    gpu_event_t after = NULL;
    zo_status st;
    if (dp->red != ZO_DTYPE_F32 || (gr->red_op != DP_ALL_REDUCE && offload_dp_segmented(dp, b)))
        return reduce_dev_16(gr, b, s);
    if (s) {
        if ((st = gpu_event_record(dp->ev_in_s, s)) != ZO_OK) return st;
        after = dp->ev_in_s;
    }
    if (!dp->ep || gr->red_op != DP_ALL_REDUCE)
        return offload_dp_block(dp, (dp_op)gr->red_op, b, gr->g->numel[b], gr->sums[b].dev, ZO_DTYPE_F32, after,
                                NULL);
    /* expert parallelism: the dense segments over every rank, the rank's
     * experts over the ranks holding the same ones (if any) */
    for (int k = 0; k < 3; k++) {
        size_t lo, hi;
        red_segment(gr, b, k, &lo, &hi);
        if (hi == lo || (k == 1 && !dp->xcomm)) continue;
        float *at = gr->sums[b].dev + lo;
        if ((st = k == 1 ? offload_dp_all_reduce_experts(dp, hi - lo, at, ZO_DTYPE_F32, after, NULL)
                         : offload_dp_collective(dp, DP_ALL_REDUCE, hi - lo, hi - lo, at, ZO_DTYPE_F32, after,
                                                 NULL)) != ZO_OK)
            return zo_error_wrap(st, "offload: collective on block %d", b);
    }
    return ZO_OK;
}

static const grads_path host_path = {.send = send_host, .piece = piece_host, .pieces_sent = sent_host,
                                     .reduce = reduce_host};
static const grads_path dev_path = {.send = send_dev, .piece = piece_dev, .pieces_sent = sent_dev,
                                    .reduce = reduce_dev};

/* ZeRO 0-1 at the step: what the last micro-batch did not reduce (all of
 * it when the step came after fewer than grad_accum), then every reduction
 * done and its result in place. */
static zo_status reduce_at_step(offload_grads *gr)
{
    offload_dp *dp = gr->env->dp;
    zo_status st = ZO_OK;
    offload_timer t0 = offload_time_begin();
    for (int b = 0; b < gr->g->nb; b++) {
        if (st == ZO_OK && gr->g->numel[b] && !gr->reduced[b]) st = gr->path[b]->reduce(gr, b, NULL);
        gr->reduced[b] = 0;
    }
    zo_status sw = offload_dp_wait(dp);
    if (st == ZO_OK) st = sw;
    sw = gpu_stream_synchronize(gr->env->d2h);
    if (st == ZO_OK) st = sw;
    offload_time_end(gr->env->acct, OFFLOAD_TIME_COMM, t0);
    for (int b = 0; st == ZO_OK && b < gr->g->nb; b++) widen(gr, b);
    return st;
}

/* ZeRO 2-3 reduced each block as it came; one rank has nothing to reduce. */
static zo_status reduce_none(offload_grads *gr)
{
    return offload_dp_wait(gr->env->dp);
}

zo_status offload_grads_reduce(offload_grads *gr) { return gr->reduce(gr); }

/* ---- allocation ---------------------------------------------------------------------- */

/* Which functions send and reduce the sums: per block, its path to the sum
 * its shard hands out; per stage, how slots leave and sums are reduced. */
static zo_status layout(offload_grads *gr)
{
    offload_dp *dp = gr->env->dp;
    int nb = gr->g->nb, stage = dp ? dp->stage : 0;
    gr->sums = calloc((size_t)nb, sizeof *gr->sums);
    gr->path = calloc((size_t)nb, sizeof *gr->path);
    if (!gr->sums || !gr->path) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    for (int b = 0; b < nb; b++) {
        ostate_grad_sum(gr->os, b, &gr->sums[b]);
        gr->path[b] = gr->sums[b].dev ? &dev_path : &host_path;
        gr->to_host |= gr->sums[b].host && gr->g->numel[b];
    }
    gr->send = send_own;
    gr->reduce = reduce_none;
    gr->red_op = -1;
    gr->ghost_dtype = gr->g->dtype;
    gr->ghost_bytes = gr->g->slot_bytes;
    if (dp && stage <= 1) {
        /* a block's sum is complete after its own backward and those of
         * the blocks reading its weights */
        gr->contrib = calloc((size_t)nb, sizeof *gr->contrib);
        gr->contrib_want = calloc((size_t)nb, sizeof *gr->contrib_want);
        gr->reduced = calloc((size_t)nb, 1);
        if (!gr->contrib || !gr->contrib_want || !gr->reduced)
            return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
        for (int b = 0; b < nb; b++) {
            gr->contrib_want[b]++;
            if (gr->dep[b] >= 0) gr->contrib_want[gr->dep[b]]++;
        }
        gr->reduce = reduce_at_step;
        gr->red_op = stage == 0 ? DP_ALL_REDUCE : DP_REDUCE_SCATTER;
        if (dp->red != ZO_DTYPE_F32 && !(gr->narrowed = calloc((size_t)nb, 1)))
            return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
        /* updates during backward (overlap) wait for each block's reduction */
        if (gr->opt->cfg->schedule == OFFLOAD_SCHEDULE_OVERLAP) {
            gr->red_ev = calloc((size_t)nb, sizeof *gr->red_ev);
            gr->red_wait = calloc((size_t)nb, sizeof *gr->red_wait);
            if (!gr->red_ev || !gr->red_wait) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
            zo_status st;
            for (int b = 0; b < nb; b++)
                if ((st = gpu_event_create(gr->env->dev, &gr->red_ev[b])) != ZO_OK) return st;
        }
    }
    if (stage >= 2) {
        /* ZeRO 2-3: the rank's parts only, reduced as backward produces them */
        gr->send = send_scatter;
        gr->ghost_dtype = dp->red; /* (the pinned halves sized for fp32 parts whatever it is) */
        gr->ghost_bytes = gr->og->largest * 4;
    }
    return ZO_OK;
}

/* The gradient slots, their pinned halves and the per-block state. */
static zo_status slots_create(offload_grads *gr)
{
    zo_status st;
    const offload_env *env = gr->env;
    size_t sb = gr->g->slot_bytes;
    if ((st = layout(gr)) != ZO_OK) return st;
    /* the pinned halves, one buffer, when some gradient goes to the host */
    size_t hb = gr->ghost_bytes;
    void *pinned = NULL;
    if (gr->to_host && hb && (st = offload_host_alloc(env, OFFLOAD_GRAD_SLOTS * hb, 1, &pinned)) != ZO_OK)
        return zo_error_wrap(st, "offload_init: pinned gradient buffers");
    gr->ghost_pinned = pinned ? OFFLOAD_GRAD_SLOTS * hb : 0;
    for (int k = 0; k < OFFLOAD_GRAD_SLOTS; k++) {
        offload_gslot *g = &gr->gs[k];
        g->host = pinned ? (char *)pinned + (size_t)k * hb : NULL;
        if ((st = gpu_mem_alloc(env->dev, sb, &g->dev)) != ZO_OK)
            return zo_error_wrap(st, "offload_init: device gradient buffer (%zu bytes)", sb);
        if ((st = gpu_event_create(env->dev, &g->done)) != ZO_OK) return st;
        if ((st = gpu_event_create(env->dev, &g->copied)) != ZO_OK) return st;
    }
    if (!(gr->fresh = calloc((size_t)gr->g->nb, 1))) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    return ZO_OK;
}

zo_status offload_grads_create(const offload_env *env, const offload_geom *g, const offload_geom *og,
                               const int *dep, int grad_accum, ostate *os, offload_optim *opt,
                               offload_grads **out)
{
    *out = NULL;
    offload_grads *gr = calloc(1, sizeof *gr);
    if (!gr) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    *gr = (offload_grads){.env = env, .g = g, .og = og, .dep = dep, .grad_accum = grad_accum, .os = os, .opt = opt};
    for (int k = 0; k < OFFLOAD_GRAD_SLOTS; k++) gr->gs[k].block = -1;
    zo_status st = slots_create(gr);
    if (st != ZO_OK) {
        offload_grads_free(gr);
        return st;
    }
    *out = gr;
    return ZO_OK;
}

void offload_grads_free(offload_grads *gr)
{
    if (!gr) return;
    gpu_device_t d = gr->env->dev;
    const offload_env *env = gr->env;
    for (int k = 0; k < OFFLOAD_GRAD_SLOTS; k++) {
        gpu_mem_free(d, gr->gs[k].dev);
        if (gr->gs[k].done) gpu_event_destroy(gr->gs[k].done);
        if (gr->gs[k].copied) gpu_event_destroy(gr->gs[k].copied);
    }
    offload_host_free(env, gr->gs[0].host, gr->ghost_pinned, 1);
    free(gr->sums);
    free(gr->path);
    free(gr->contrib);
    free(gr->contrib_want);
    free(gr->reduced);
    free(gr->narrowed);
    if (gr->red_ev)
        for (int b = 0; b < gr->g->nb; b++)
            if (gr->red_ev[b]) gpu_event_destroy(gr->red_ev[b]);
    free(gr->red_ev);
    free(gr->red_wait);
    free(gr->fresh);
    free(gr);
}
