/* Optimizer-state shards: the fp32 master weights and Adam moments of a
 * range of the flat parameter index, wherever they live, and the gradient
 * sums they feed (ostate.h).
 *
 *   host     three arrays in host memory, updated sub-group by sub-group
 *   nvme     sub-groups in an NVMe store, updated by the pipelined step
 *            (read ahead || update || write behind); reads and writes from
 *            outside the step go through a cache of one sub-group
 *   device   the master, m and v and the fp32 gradient sums in device memory
 *            (whole blocks at the end of the index), updated by
 *            gpu_adam_update (gpu_adam_state_update with m and v encoded:
 *            a state buffer a block) on the d2h stream while the host
 *            updates its shards
 *
 * The host and NVMe shards' gradient sums are one fp32 array in host
 * memory over their blocks (one block may straddle the two shards: its sum
 * is in one piece, its statistics taken in one call, the same bits
 * wherever the cut is); the device shard keeps its own. A block's sum is
 * the optimizer's part of it, or with ZeRO 1 the whole block, padded,
 * reduce-scattered in place at the step (the part read where it lands). */
#include "offload/ostate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_adam/cpu_adam.h" /* defines: adam_grad_stats */

#ifdef ZO_OFFLOAD_HAVE_NVME
#include "nvme/nvme_engine.h"   /* defines: nvme_engine_t */
#include "nvme/nvme_pipeline.h" /* defines: nvme_pipeline_t */
#include "nvme/nvme_store.h"    /* defines: nvme_store_t */
#endif

#define OSTATE_MAX_SHARDS 3

typedef struct oshard oshard;

/* Where every block's sum is: block b at off[b] of its shard's sum buffer
 * (the host side's from 0, the device shard's from off[its first block]),
 * the optimizer's part at off[b] + part[b]. */
typedef struct ostate_sums {
    size_t *off;           /* [nb + 1] */
    size_t *part;          /* [nb] */
    int whole;             /* whole blocks are summed (ZeRO 1) */
    float *host;           /* host [off[dev_block]]: the host and NVMe shards' sums */
    size_t host_n;
    /* (NULL: none) [nb] the rank's own experts' run of each block, in the
     * block's sum ([xoff, xoff + xn), xn 0: none), whose sum of squares the
     * statistics keep apart (ostate_split_experts) */
    size_t *xoff, *xn;
} ostate_sums;

typedef struct oshard_ops {
    /* Elements [first, first + n) (flat, within the shard) of the master and
     * the moments into host arrays; a NULL array is skipped. */
    zo_status (*read)(oshard *sh, size_t first, size_t n, float *P, float *M, float *V);
    /* ... and from host arrays; NULL moments are written as zeros. */
    zo_status (*write)(oshard *sh, size_t first, size_t n, const float *P, const float *M,
                       const float *V);
    /* Writes have reached the shard's tier (and an enqueued step is done). */
    zo_status (*sync)(oshard *sh);
    /* Update every element (an enqueued shard enqueues: sync waits). */
    zo_status (*step)(oshard *sh, const oshard_update *u);
    /* (shards the host updates) Update flat [first, first + n) within the
     * shard, as its gradients complete (the schedule's updates during
     * backward). */
    zo_status (*step_range)(oshard *sh, size_t first, size_t n, const oshard_update *u);
    /* Where block b (one of the shard's) has its gradient summed. */
    void (*grad_sum)(oshard *sh, int b, oshard_sum *out);
    /* (optional) Zero the gradient sums it keeps, on stream s. */
    zo_status (*grad_zero)(oshard *sh, gpu_stream_t s);
    /* (optional) The step's first addition into its sums comes on stream s
     * (what zeroed them behind the update is waited for there). */
    zo_status (*grad_ready)(oshard *sh, gpu_stream_t s);
    /* (optional) Its image (ostate_image_key): the key and size; bytes
     * [off, off + len) of it out or in (put). */
    void (*image_key)(const oshard *sh, char *key, size_t len, uint64_t *bytes);
    zo_status (*image_io)(oshard *sh, uint64_t off, size_t len, void *buf, int put);
    /* (optional) Add the sum of squares of the sums it keeps, block by
     * block; *bad_block gets the first of its blocks whose gradient holds
     * an inf or nan, and is left as it is when none does. */
    zo_status (*grad_stats)(oshard *sh, int exact, double *sumsq, double *xsumsq, int *bad_block);
    void (*free)(oshard *sh);
} oshard_ops;

struct oshard {
    const oshard_ops *ops;
    const offload_env *env;
    const offload_geom *g;
    const ostate_sums *sums;
    offload_tier tier;
    size_t first, n;       /* the flat range it holds */
    int enqueued;          /* its step is enqueued on a stream (the device's): started first, waited for by sync */
};

typedef struct oshard_config {
    offload_tier tier;
    size_t first, n;
    size_t sub_group;      /* elements per update call (host) / per NVMe group */
    int swap_buffers;      /* NVMe pipeline buffers */
    int exact_stats;       /* device beside a host or NVMe share: a pinned block for exact clipping
                              statistics */
    const char *nvme_dir;
    zo_plan_opt_state state; /* m and v's encoding */
    zo_plan_master master;   /* host: fp32 master, or bf16 weights (+ Kahan compensation) */
    int master_in_place;     /* host, no master: the weights' store is W (else a copy) */
    uint16_t *master_at;     /* ... its bf16 weights of flat 0 (NULL: given by ostate_master_at) */
    uint16_t *dev_master_at; /* device, no master: the device store's bf16 weights of flat 0 (NULL: a copy) */
} oshard_config;

struct ostate {
    const offload_env *env;
    const offload_geom *og;
    oshard *sh[OSTATE_MAX_SHARDS]; /* in flat order */
    int n_sh;
    int dev_block;         /* the device share's first block (nb: none), the same on every rank */
    ostate_sums sums;
    double *blk_sumsq;     /* [nb] statistics of the host sums, taken as they completed */
    double *blk_xsumsq;    /* [nb] ... the experts' run's part of them (sums.xn: apart from blk_sumsq) */
    int *blk_nonfinite;    /* [nb] */
    uint8_t *blk_taken;    /* [nb] statistics taken by the addition that wrote the sum (ostate_grad_block_taken) */
};

/* ---- the gradient statistics ------------------------------------------------------------ */

/* Block b's run of the rank's own experts within its optimizer part of n
 * elements: [*lo, *hi) (empty at n: none). */
static void expert_run(const ostate_sums *s, int b, size_t n, size_t *lo, size_t *hi)
{
    *lo = *hi = n;
    if (s->xn && s->xn[b]) {
        *lo = s->xoff[b] - s->part[b];
        *hi = *lo + s->xn[b];
    }
}

/* Sum of squares of v, block b's optimizer part (n fp32 values): the
 * experts' run into *xs, the rest into *ss (each piece summed by
 * adam_grad_stats, the pieces in order); *nf: any inf or nan. */
static zo_status split_stats(const ostate_sums *s, int b, const float *v, size_t n, int nthreads, double *ss,
                             double *xs, int *nf)
{
    size_t lo, hi;
    expert_run(s, b, n, &lo, &hi);
    const size_t at[4] = {0, lo, hi, n};
    *ss = *xs = 0.0;
    *nf = 0;
    for (int k = 0; k < 3; k++) {
        if (at[k + 1] == at[k]) continue;
        double p;
        int f;
        zo_status st = adam_grad_stats(v + at[k], ZO_DTYPE_F32, at[k + 1] - at[k], nthreads, &p, &f);
        if (st != ZO_OK) return st;
        *(k == 1 ? xs : ss) += p;
        *nf |= f;
    }
    return ZO_OK;
}

/* ---- the host side's gradient sums ------------------------------------------------------- */

static void host_side_sum(oshard *sh, int b, oshard_sum *out)
{
    const ostate_sums *s = sh->sums;
    out->dev = NULL;
    out->host = s->host + s->off[b];
    out->part = out->host + s->part[b];
}

static void copy_or_zero(float *dst, const float *src, size_t n)
{
    if (src) memcpy(dst, src, n * 4);
    else memset(dst, 0, n * 4);
}

/* The same by a team of `threads` (0: OpenMP's default): a block's state,
 * gigabytes, put by the host thread. */
static void copy_or_zero_team(float *dst, const float *src, size_t n, int threads)
{
    if (src) zo_copy_team(dst, src, n * 4, threads);
    else zo_memset_team(dst, 0, n * 4, threads);
}

/* ---- m and v in an encoding (issue 30) ------------------------------------------------ */

/* bf16 or 8-bit m and v (cpu_adam's adam_state encodings) in chunks of
 * `chunk` elements from the start of a shard (or of an NVMe sub-group), each
 * chunk one adam_state buffer of its own, so that any range is reached a
 * chunk at a time: decoded into fp32 scratch, updated by the fp32 path,
 * coded again. The step updates a whole chunk in place instead, with an
 * fp32 master (oshard_update.host_state: adam_state_update a piece, the
 * same fp32 sequence with the moments coded after it, bit for bit; an
 * 8-bit block that two pieces share goes the first way alone). */
typedef struct ostate_enc {
    adam_state_kind kind;
    size_t chunk;       /* elements a chunk: a multiple of the 8-bit block */
    size_t cbytes;      /* bytes of a whole chunk's buffer, a multiple of 64 */
    int threads;
} ostate_enc;

#define ENC_CHUNK_MAX ((size_t)ZO_PLAN_STATE_CHUNK)

static size_t enc_bytes(const ostate_enc *e, size_t n)
{
    size_t full = n / e->chunk, rem = n % e->chunk;
    return full * e->cbytes + (rem ? (size_t)adam_state_bytes(e->kind, rem) : 0);
}

/* The encoding of `state` for shards of up to `n` elements (0: fp32, none). */
static zo_status enc_init(ostate_enc *e, zo_plan_opt_state state, size_t n, int threads)
{
    memset(e, 0, sizeof *e);
    if (state == ZO_PLAN_STATE_FP32) return ZO_OK;
    e->kind = state == ZO_PLAN_STATE_BF16 ? adam_state_bf16() : adam_state_q8(ADAM_Q8_BLOCK);
    size_t c = n < ENC_CHUNK_MAX ? n : ENC_CHUNK_MAX;
    e->chunk = (c + ADAM_Q8_BLOCK - 1) / ADAM_Q8_BLOCK * ADAM_Q8_BLOCK;
    if (!e->chunk) e->chunk = ADAM_Q8_BLOCK;
    e->cbytes = ((size_t)adam_state_bytes(e->kind, e->chunk) + 63) / 64 * 64;
    e->threads = threads;
    return ZO_OK;
}

static int enc_on(const ostate_enc *e) { return e->chunk != 0; }

/* The chunks of [rel, rel + k) of a region of n elements whose state is S:
 * for each, its buffer decoded into sm, sv (fp32 [chunk]), then (encode)
 * coded again; `zeros`: fn puts zeros into both moments. `whole` (when
 * given) is offered each chunk the range covers whole first, its buffer
 * as it is: *done 1, it took the chunk (nothing decoded or coded). */
typedef zo_status (*enc_visit_fn)(void *ctx, size_t at, size_t len, size_t off, float *sm, float *sv);
typedef zo_status (*enc_whole_fn)(void *ctx, size_t at, size_t len, void *buf, float *sm, float *sv, int *done);

static zo_status enc_walk(const ostate_enc *e, void *S, size_t n, size_t rel, size_t k, float *sm, float *sv,
                          int decode, int encode, int zeros, enc_visit_fn fn, enc_whole_fn whole_fn, void *ctx)
{
    zo_status st;
    size_t end = rel + k;
    while (rel < end) {
        size_t c = rel / e->chunk, c0 = c * e->chunk;
        size_t clen = n - c0 < e->chunk ? n - c0 : e->chunk;
        size_t stop = end < c0 + clen ? end : c0 + clen;
        void *buf = (char *)S + c * e->cbytes;
        /* (a write of the whole chunk needs nothing from it; zeros over the
         * whole chunk are the zero state: adam_state_init writes the bytes
         * that coding them writes, without the coding) */
        int whole = rel == c0 && stop == c0 + clen;
        if (encode && whole && zeros) {
            if ((st = adam_state_init(e->kind, buf, clen, e->threads)) != ZO_OK) return st;
            rel = stop;
            continue;
        }
        int done = 0;
        if (whole && whole_fn && (st = whole_fn(ctx, rel, clen, buf, sm, sv, &done)) != ZO_OK) return st;
        if (done) {
            rel = stop;
            continue;
        }
        if ((decode || !whole) && (st = adam_state_to_f32(e->kind, buf, clen, sm, sv, e->threads)) != ZO_OK)
            return st;
        if ((st = fn(ctx, rel, stop - rel, rel - c0, sm, sv)) != ZO_OK) return st;
        if (encode && (st = adam_state_from_f32(e->kind, buf, clen, sm, sv, e->threads)) != ZO_OK) return st;
        rel = stop;
    }
    return ZO_OK;
}

typedef struct enc_io {
    size_t base;       /* the first element of the caller's arrays */
    float *M, *V;      /* read into */
    const float *cM, *cV; /* written from (NULL: zeros) */
} enc_io;

static zo_status enc_get_fn(void *ctx, size_t at, size_t len, size_t off, float *sm, float *sv)
{
    enc_io *io = ctx;
    if (io->M) memcpy(io->M + (at - io->base), sm + off, len * 4);
    if (io->V) memcpy(io->V + (at - io->base), sv + off, len * 4);
    return ZO_OK;
}

static zo_status enc_put_fn(void *ctx, size_t at, size_t len, size_t off, float *sm, float *sv)
{
    enc_io *io = ctx;
    copy_or_zero(sm + off, io->cM ? io->cM + (at - io->base) : NULL, len);
    copy_or_zero(sv + off, io->cV ? io->cV + (at - io->base) : NULL, len);
    return ZO_OK;
}

/* m and v of [rel, rel + k) into M, V (either NULL: skipped) */
static zo_status enc_get(const ostate_enc *e, void *S, size_t n, size_t rel, size_t k, float *M, float *V,
                         float *sm, float *sv)
{
    if (!M && !V) return ZO_OK;
    enc_io io = {.base = rel, .M = M, .V = V};
    return enc_walk(e, S, n, rel, k, sm, sv, 1, 0, 0, enc_get_fn, NULL, &io);
}

/* ... and from M, V (NULL: zeros) */
static zo_status enc_put(const ostate_enc *e, void *S, size_t n, size_t rel, size_t k, const float *M,
                         const float *V, float *sm, float *sv)
{
    enc_io io = {.base = rel, .cM = M, .cV = V};
    return enc_walk(e, S, n, rel, k, sm, sv, 0, 1, !M && !V, enc_put_fn, NULL, &io);
}

typedef struct enc_upd {
    const oshard_update *u;
    adam_state_kind kind;
    size_t flat0, rel0; /* the flat index of element rel0 of the region */
    float *P;           /* the master at rel0 (NULL: the update finds it) */
    size_t most;        /* elements an update call takes at most (the sub-group) */
    uint64_t fused;     /* elements u->host_state took */
} enc_upd;

static zo_status enc_upd_fn(void *ctx, size_t at, size_t len, size_t off, float *sm, float *sv)
{
    enc_upd *x = ctx;
    zo_status st;
    for (size_t f = 0; f < len; f += x->most) {
        size_t k = len - f < x->most ? len - f : x->most, r = at + f - x->rel0;
        if ((st = x->u->host(x->u->ctx, x->flat0 + r, k, x->P ? x->P + r : NULL, sm + off + f, sv + off + f)) !=
            ZO_OK)
            return st;
    }
    return ZO_OK;
}

/* A whole chunk to u->host_state (an fp32 master), which may leave it to
 * the decoding path. */
static zo_status enc_upd_whole(void *ctx, size_t at, size_t len, void *buf, float *sm, float *sv, int *done)
{
    enc_upd *x = ctx;
    zo_status st = x->u->host_state(x->u->ctx, x->flat0 + (at - x->rel0), len, x->P + (at - x->rel0), x->kind, buf,
                                    sm, sv, done);
    if (st == ZO_OK && *done) x->fused += len;
    return st;
}

/* The update of [rel, rel + k) (flat index flat0 at rel), P its master:
 * each whole chunk by u->host_state when there is one and it takes it (an
 * fp32 master), the rest a chunk at a time decoded, updated by u->host and
 * coded again (a range that starts or ends inside a chunk: the chunk's
 * other elements are coded again too, as they were decoded). */
static zo_status enc_update(const ostate_enc *e, void *S, size_t n, size_t rel, size_t k, size_t flat0,
                            float *P, const oshard_update *u, float *sm, float *sv, size_t most, offload_acct *a)
{
    enc_upd x = {.u = u, .kind = e->kind, .flat0 = flat0, .rel0 = rel, .P = P, .most = most ? most : k};
    zo_status st = enc_walk(e, S, n, rel, k, sm, sv, 1, 1, 0, enc_upd_fn, u->host_state && P ? enc_upd_whole : NULL,
                            &x);
    a->state_fused += x.fused;
    a->state_decoded += k - x.fused;
    return st;
}

/* ---- host memory ----------------------------------------------------------------------- */

typedef struct host_shard {
    oshard base;
    float *P, *M, *V;  /* [n] (P: an fp32 master only; M, V: fp32 state only) */
    size_t sub_group;
    ostate_enc enc;    /* m and v in another encoding: S, and scratch of a chunk */
    void *S;
    size_t s_bytes;
    float *sm, *sv;
    /* no fp32 master (issue 30): the weights in bf16 (W [n]), Kahan's
     * compensation (C [n], kahan only), a sub-group of fp32 scratch (Ps)
     * the update runs on: W + C decoded, the update, then W = RN(P) and
     * C = RN(P - W) (the update rounded P itself when stochastic) */
    zo_plan_master master;
    uint16_t *W, *C;
    int nomaster;      /* the master is W (+ C) */
    int in_place;      /* W is the weights' store (no bytes of its own) */
    float *Ps;
    oshard_update inner; /* the caller's update, under mst_host */
} host_shard;

/* Weights of [r, r + n) of h, fp32, into P: W + C. */
static void mst_decode(const host_shard *h, size_t r, size_t n, float *P)
{
    for (size_t i = 0; i < n; i++)
        P[i] = zo_bf16_to_f32(h->W[r + i]) + (h->C ? zo_bf16_to_f32(h->C[r + i]) : 0.0f);
}

/* ... and back: W the nearest bf16 of P, C what it lost (kahan). */
static void mst_encode(host_shard *h, size_t r, size_t n, const float *P)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t w = zo_f32_to_bf16(P[i]);
        h->W[r + i] = w;
        if (h->C) h->C[r + i] = zo_f32_to_bf16(P[i] - zo_bf16_to_f32(w));
    }
}

/* The update of flat [first, first + n) (n at most a sub-group) on the
 * decoded weights. */
static zo_status mst_host(void *ctx, size_t first, size_t n, float *P, float *M, float *V)
{
    host_shard *h = ctx;
    (void)P;
    size_t r = first - h->base.first;
    mst_decode(h, r, n, h->Ps);
    zo_status st = h->inner.host(h->inner.ctx, first, n, h->Ps, M, V);
    if (st == ZO_OK) mst_encode(h, r, n, h->Ps);
    return st;
}

/* W + C as fp32 for a reader (checkpoints, weights out) whose value rounds
 * to W again: a compensation of exactly half an ulp of W makes the sum a
 * tie, which round to even may send to W's other neighbour; one fp32 ulp
 * toward W settles it (so a checkpoint's weights are W, and its image
 * gives back C exactly). */
static void mst_decode_out(const host_shard *h, size_t r, size_t n, float *P)
{
    mst_decode(h, r, n, P);
    for (size_t i = 0; h->C && i < n; i++)
        if (zo_f32_to_bf16(P[i]) != h->W[r + i]) P[i] = nextafterf(P[i], zo_bf16_to_f32(h->W[r + i]));
}

static zo_status host_read(oshard *sh, size_t first, size_t n, float *P, float *M, float *V)
{
    host_shard *h = (host_shard *)sh;
    size_t r = first - sh->first;
    if (P && h->nomaster) mst_decode_out(h, r, n, P);
    else if (P) memcpy(P, h->P + r, n * 4);
    if (enc_on(&h->enc)) return enc_get(&h->enc, h->S, sh->n, r, n, M, V, h->sm, h->sv);
    if (M) memcpy(M, h->M + r, n * 4);
    if (V) memcpy(V, h->V + r, n * 4);
    return ZO_OK;
}

static zo_status host_write(oshard *sh, size_t first, size_t n, const float *P, const float *M,
                            const float *V)
{
    host_shard *h = (host_shard *)sh;
    size_t r = first - sh->first;
    int team = sh->env->n_threads;
    if (P && h->nomaster) mst_encode(h, r, n, P);
    else if (P) zo_copy_team(h->P + r, P, n * 4, team);
    if (enc_on(&h->enc)) return enc_put(&h->enc, h->S, sh->n, r, n, M, V, h->sm, h->sv);
    copy_or_zero_team(h->M + r, M, n, team);
    copy_or_zero_team(h->V + r, V, n, team);
    return ZO_OK;
}

static zo_status host_sync(oshard *sh)
{
    (void)sh;
    return ZO_OK;
}

static zo_status host_step_range(oshard *sh, size_t first, size_t n, const oshard_update *u)
{
    host_shard *h = (host_shard *)sh;
    zo_status st;
    size_t r0 = first - sh->first;
    oshard_update mu = {.host = mst_host, .ctx = h};
    if (h->nomaster) {
        h->inner = *u;
        u = &mu;
    }
    float *P0 = h->nomaster ? NULL : h->P + r0;
    if (enc_on(&h->enc)) return enc_update(&h->enc, h->S, sh->n, r0, n, first, P0, u, h->sm, h->sv,
                                          h->sub_group, sh->env->acct);
    for (size_t f = 0; f < n; f += h->sub_group) {
        size_t k = n - f < h->sub_group ? n - f : h->sub_group, r = r0 + f;
        if ((st = u->host(u->ctx, first + f, k, P0 ? P0 + f : NULL, h->M + r, h->V + r)) != ZO_OK) return st;
    }
    return ZO_OK;
}

static zo_status host_step(oshard *sh, const oshard_update *u)
{
    offload_timer t0 = offload_time_begin();
    zo_status st = host_step_range(sh, sh->first, sh->n, u);
    offload_time_end(sh->env->acct, OFFLOAD_TIME_OPTIMIZER, t0);
    return st;
}

static void host_destroy(oshard *sh)
{
    host_shard *h = (host_shard *)sh;
    if (h->nomaster) {
        if (!h->in_place) offload_host_free(sh->env, h->W, sh->n * 2, 0);
        offload_host_free(sh->env, h->C, h->C ? sh->n * 2 : 0, 0);
        offload_host_free(sh->env, h->Ps, h->sub_group * 4, 0);
    } else {
        offload_host_free(sh->env, h->P, sh->n * 4, 0);
    }
    if (enc_on(&h->enc)) {
        offload_host_free(sh->env, h->S, h->s_bytes, 0);
        offload_host_free(sh->env, h->sm, h->enc.chunk * 4, 0);
        offload_host_free(sh->env, h->sv, h->enc.chunk * 4, 0);
    } else {
        offload_host_free(sh->env, h->M, sh->n * 4, 0);
        offload_host_free(sh->env, h->V, sh->n * 4, 0);
    }
    free(h);
}

/* The image: the encoded state S, then Kahan's compensation C. */
static void host_image_key(const oshard *sh, char *key, size_t len, uint64_t *bytes)
{
    const host_shard *h = (const host_shard *)sh;
    *bytes = (enc_on(&h->enc) ? h->s_bytes : 0) + (h->C ? sh->n * 2 : 0);
    snprintf(key, len, "cpu %zu+%zu %s chunk %zu%s", sh->first, sh->n, enc_on(&h->enc) ? adam_state_name(h->enc.kind) : "fp32",
             h->enc.chunk, h->C ? " kahan" : "");
}

static zo_status host_image_io(oshard *sh, uint64_t off, size_t len, void *buf, int put)
{
    host_shard *h = (host_shard *)sh;
    size_t sb = enc_on(&h->enc) ? h->s_bytes : 0;
    for (size_t done = 0; done < len;) {
        uint64_t at = off + done;
        char *mem = at < sb ? (char *)h->S + at : (char *)h->C + (at - sb);
        size_t k = at < sb && sb - at < len - done ? sb - at : len - done;
        if (put) memcpy(mem, (char *)buf + done, k);
        else memcpy((char *)buf + done, mem, k);
        done += k;
    }
    return ZO_OK;
}

static const oshard_ops host_ops = {
    .read = host_read, .write = host_write, .sync = host_sync, .step = host_step,
    .step_range = host_step_range, .grad_sum = host_side_sum, .image_key = host_image_key,
    .image_io = host_image_io, .free = host_destroy,
};

static zo_status host_create(oshard *sh, const oshard_config *c)
{
    host_shard *h = (host_shard *)sh;
    zo_status st;
    h->sub_group = c->sub_group;
    h->master = c->master;
    if (c->master != ZO_PLAN_MASTER_FP32) {
        /* the weights in bf16 (and Kahan's compensation), a sub-group of
         * fp32 scratch to update them on */
        h->in_place = c->master_at != NULL;
        h->nomaster = 1;
        h->in_place = c->master_in_place;
        if (h->in_place && c->master_at) h->W = c->master_at + sh->first;
        void **arr[3] = {(void **)&h->W, (void **)&h->C, (void **)&h->Ps};
        size_t bytes[3] = {h->in_place ? 0 : sh->n * 2, c->master == ZO_PLAN_MASTER_KAHAN ? sh->n * 2 : 0,
                           h->sub_group * 4};
        for (int i = 0; i < 3; i++) {
            if (!bytes[i]) continue;
            if ((st = offload_host_alloc(sh->env, bytes[i], 0, arr[i])) != ZO_OK)
                return zo_error_wrap(st, "offload_init: bf16 weights of the optimizer (--master %s)",
                                     zo_plan_master_name(c->master));
            zo_memset_team(*arr[i], 0, bytes[i], sh->env->n_threads);
        }
    }
    size_t p_bytes = h->nomaster ? 0 : sh->n * 4;
    if ((st = enc_init(&h->enc, c->state, sh->n, sh->env->n_threads)) != ZO_OK) return st;
    if (enc_on(&h->enc)) {
        /* the master, m and v in their encoding (zero moments: zero bytes),
         * a chunk of fp32 scratch for each moment */
        h->s_bytes = enc_bytes(&h->enc, sh->n);
        void **arr[4] = {(void **)&h->P, &h->S, (void **)&h->sm, (void **)&h->sv};
        size_t bytes[4] = {p_bytes, h->s_bytes, h->enc.chunk * 4, h->enc.chunk * 4};
        for (int i = 0; i < 4; i++) {
            if ((st = offload_host_alloc(sh->env, bytes[i], 0, arr[i])) != ZO_OK)
                return zo_error_wrap(st, "offload_init: optimizer state in memory (%s m, v)",
                                     adam_state_name(h->enc.kind));
            if (bytes[i]) zo_memset_team(*arr[i], 0, bytes[i], sh->env->n_threads);
        }
        return ZO_OK;
    }
    float **arr[3] = {&h->P, &h->M, &h->V};
    for (int i = h->nomaster ? 1 : 0; i < 3; i++) {
        if ((st = offload_host_alloc(sh->env, sh->n * 4, 0, (void **)arr[i])) != ZO_OK)
            return zo_error_wrap(st, "offload_init: optimizer state in memory");
        if (sh->n) zo_memset_team(*arr[i], 0, sh->n * 4, sh->env->n_threads);
    }
    return ZO_OK;
}

/* ---- NVMe ------------------------------------------------------------------------------- */

#ifdef ZO_OFFLOAD_HAVE_NVME

typedef struct nvme_shard {
    oshard base;
    nvme_engine_t *engine;
    nvme_store_t *store;
    nvme_pipeline_t *pipe;
    size_t group;      /* elements of the largest sub-group */
    int nslots;
    int counted;       /* its bytes are counted in the tiers */
    /* the group cache: master, m, v of one sub-group while state moves in
     * or out between steps, in the pipeline's slot 1 (idle then) */
    float *cache[3];
    long cg;           /* the cached group, -1 none */
    int loaded;        /* the cache holds the whole group (as on disk, or newer) */
    size_t covered;    /* not loaded: elements [0, covered) were written */
    int dirty;         /* newer than the disk */
    ostate_enc enc;    /* m and v in another encoding: tensor 1 a sub-group's buffer of
                          chunks (the cache's [1]), no tensor 2; scratch of a chunk */
    float *sm, *sv;
    unsigned char *stored; /* encoded: [groups] the group has been written (else its state is zeros) */
} nvme_shard;

/* Bytes of a sub-group of n elements on the drive: master, m and v. */
static size_t nvs_group_bytes(const nvme_shard *s, size_t n)
{
    return n * 4 + (enc_on(&s->enc) ? enc_bytes(&s->enc, n) : 8 * n);
}

static size_t nvs_tensor_bytes(const void *user, int j, size_t n)
{
    const ostate_enc *e = user;
    return j == 0 ? n * 4 : j == 1 ? enc_bytes(e, n) : 0;
}

static void group_range(nvme_shard *s, size_t g, size_t *first, size_t *n)
{
    nvme_pipeline_group_range(s->pipe, g, first, n);
}

/* The cache holds all of its group: read what was not written. */
static zo_status cache_complete(nvme_shard *s)
{
    if (s->loaded || s->cg < 0) return ZO_OK;
    size_t f, n;
    group_range(s, (size_t)s->cg, &f, &n);
    if (s->covered < n) {
        size_t c = s->covered;
        zo_status st = nvme_pipeline_load_group_part(s->pipe, (size_t)s->cg, c, n - c, s->cache[0] + c,
                                                     s->cache[1] + c, s->cache[2] + c);
        if (st != ZO_OK) return st;
        offload_add_bytes(s->base.env->acct, OFFLOAD_BYTES_DISK_READ, nvs_group_bytes(s, n));
    }
    s->loaded = 1;
    return ZO_OK;
}

static zo_status cache_flush(nvme_shard *s)
{
    zo_status st;
    if (!s->dirty) return ZO_OK;
    if ((st = cache_complete(s)) != ZO_OK) return st;
    if ((st = nvme_pipeline_store_group(s->pipe, (size_t)s->cg, s->cache[0], s->cache[1], s->cache[2])) != ZO_OK)
        return st;
    if (s->stored) s->stored[s->cg] = 1;
    size_t f, n;
    group_range(s, (size_t)s->cg, &f, &n);
    offload_add_bytes(s->base.env->acct, OFFLOAD_BYTES_DISK_WRITTEN, nvs_group_bytes(s, n));
    s->dirty = 0;
    return ZO_OK;
}

/* Make group g the cached one; `fresh`: about to be written from its first
 * element on, so the disk's copy is not read. */
static zo_status cache_take(nvme_shard *s, size_t g, int fresh)
{
    zo_status st;
    if (s->cg == (long)g) return ZO_OK;
    if ((st = cache_flush(s)) != ZO_OK) return st;
    s->cg = (long)g;
    s->covered = 0;
    s->loaded = 0;
    /* (encoded m and v are read whole: a chunk is coded as one; a group
     * never written holds zeros) */
    if (fresh && !enc_on(&s->enc)) return ZO_OK;
    size_t f, n;
    group_range(s, g, &f, &n);
    if (s->stored && !s->stored[g]) {
        memset(s->cache[0], 0, n * 4);
        memset(s->cache[1], 0, enc_bytes(&s->enc, n));
        s->loaded = 1;
        return ZO_OK;
    }
    if ((st = nvme_pipeline_load_group(s->pipe, g, s->cache[0], s->cache[1], s->cache[2])) != ZO_OK) {
        s->cg = -1;
        return st;
    }
    offload_add_bytes(s->base.env->acct, OFFLOAD_BYTES_DISK_READ, nvs_group_bytes(s, n));
    s->loaded = 1;
    return ZO_OK;
}

static zo_status nvs_read(oshard *sh, size_t first, size_t n, float *P, float *M, float *V)
{
    nvme_shard *s = (nvme_shard *)sh;
    float *out[3] = {P, M, V};
    size_t rel = first - sh->first, end = rel + n, base = rel;
    zo_status st;
    while (rel < end) {
        size_t g = rel / s->group, gf, gn; /* every group but the last has s->group elements */
        group_range(s, g, &gf, &gn);
        if ((st = cache_take(s, g, 0)) != ZO_OK || (st = cache_complete(s)) != ZO_OK) return st;
        size_t stop = end < gf + gn ? end : gf + gn;
        if (enc_on(&s->enc)) {
            if (P) memcpy(P + (rel - base), s->cache[0] + (rel - gf), (stop - rel) * 4);
            if ((st = enc_get(&s->enc, s->cache[1], gn, rel - gf, stop - rel, M ? M + (rel - base) : NULL,
                              V ? V + (rel - base) : NULL, s->sm, s->sv)) != ZO_OK)
                return st;
            rel = stop;
            continue;
        }
        for (int a = 0; a < 3; a++)
            if (out[a]) memcpy(out[a] + (rel - base), s->cache[a] + (rel - gf), (stop - rel) * 4);
        rel = stop;
    }
    return ZO_OK;
}

static zo_status nvs_write(oshard *sh, size_t first, size_t n, const float *P, const float *M,
                           const float *V)
{
    nvme_shard *s = (nvme_shard *)sh;
    const float *in[3] = {P, M, V};
    size_t rel = first - sh->first, end = rel + n, base = rel;
    zo_status st;
    while (rel < end) {
        size_t g = rel / s->group, gf, gn;
        group_range(s, g, &gf, &gn);
        size_t stop = end < gf + gn ? end : gf + gn;
        /* a write that starts the group, or goes on where the last one
         * stopped, needs nothing from the disk (without P the master is
         * kept: that needs it) */
        if ((st = cache_take(s, g, rel == gf && P)) != ZO_OK) return st;
        if (!s->loaded && (rel - gf != s->covered || !P) && (st = cache_complete(s)) != ZO_OK) return st;
        if (enc_on(&s->enc)) {
            if (P) memcpy(s->cache[0] + (rel - gf), P + (rel - base), (stop - rel) * 4);
            if ((st = enc_put(&s->enc, s->cache[1], gn, rel - gf, stop - rel, M ? M + (rel - base) : NULL,
                              V ? V + (rel - base) : NULL, s->sm, s->sv)) != ZO_OK)
                return st;
            s->dirty = 1;
            rel = stop;
            continue;
        }
        for (int a = 0; a < 3; a++) {
            float *dst = s->cache[a] + (rel - gf);
            if (in[a]) memcpy(dst, in[a] + (rel - base), (stop - rel) * 4);
            else if (a) memset(dst, 0, (stop - rel) * 4);
        }
        if (!s->loaded) s->covered = stop - gf;
        s->dirty = 1;
        rel = stop;
    }
    return ZO_OK;
}

static zo_status nvs_sync(oshard *sh)
{
    nvme_shard *s = (nvme_shard *)sh;
    zo_status st = cache_flush(s);
    s->cg = -1; /* the step uses the slot next */
    return st;
}

typedef struct nvs_step_ctx {
    oshard *sh;
    const oshard_update *u;
} nvs_step_ctx;

static zo_status nvs_update(void *user, size_t group, size_t first, size_t n, float *master,
                             float *m, float *v)
{
    (void)group;
    nvs_step_ctx *c = user;
    nvme_shard *s = (nvme_shard *)c->sh;
    if (enc_on(&s->enc))
        return enc_update(&s->enc, m, n, 0, n, c->sh->first + first, master, c->u, s->sm, s->sv, s->group,
                          c->sh->env->acct);
    return c->u->host(c->u->ctx, c->sh->first + first, n, master, m, v);
}

/* A range updated through the group cache: each sub-group read, the part
 * in range updated, written back when the cache moves on (no read-ahead:
 * this runs beside the device's backward). */
static zo_status nvs_step_range(oshard *sh, size_t first, size_t n, const oshard_update *u)
{
    nvme_shard *s = (nvme_shard *)sh;
    size_t rel = first - sh->first, end = rel + n;
    zo_status st;
    while (rel < end) {
        size_t g = rel / s->group, gf, gn;
        group_range(s, g, &gf, &gn);
        if ((st = cache_take(s, g, 0)) != ZO_OK || (st = cache_complete(s)) != ZO_OK) return st;
        size_t stop = end < gf + gn ? end : gf + gn, o = rel - gf;
        if (enc_on(&s->enc))
            st = enc_update(&s->enc, s->cache[1], gn, o, stop - rel, sh->first + rel, s->cache[0] + o, u, s->sm,
                            s->sv, s->group, sh->env->acct);
        else
            st = u->host(u->ctx, sh->first + rel, stop - rel, s->cache[0] + o, s->cache[1] + o, s->cache[2] + o);
        if (st != ZO_OK) return st;
        s->dirty = 1;
        rel = stop;
    }
    return ZO_OK;
}

static zo_status nvs_step(oshard *sh, const oshard_update *u)
{
    nvme_shard *s = (nvme_shard *)sh;
    offload_acct *a = sh->env->acct;
    zo_status st = nvs_sync(sh);
    if (st != ZO_OK) return st;
    nvs_step_ctx c = {.sh = sh, .u = u};
    nvme_step_stats ns;
    if (s->stored)
        for (size_t g = 0; g < nvme_pipeline_groups(s->pipe); g++)
            if (!s->stored[g]) {
                /* (the step reads every group: write the zeros of one never written) */
                size_t f, n;
                group_range(s, g, &f, &n);
                if ((st = cache_take(s, g, 1)) != ZO_OK) return st;
                s->dirty = 1;
                if ((st = nvs_sync(sh)) != ZO_OK) return st;
            }
    st = nvme_pipeline_step(s->pipe, nvs_update, &c, &ns);
    offload_add_time(a, OFFLOAD_TIME_DISK, ns.wait_seconds);
    offload_add_time(a, OFFLOAD_TIME_OPTIMIZER, ns.seconds - ns.wait_seconds);
    offload_add_bytes(a, OFFLOAD_BYTES_DISK_READ, ns.bytes_read);
    offload_add_bytes(a, OFFLOAD_BYTES_DISK_WRITTEN, ns.bytes_written);
    return st;
}

static void nvs_destroy(oshard *sh)
{
    nvme_shard *s = (nvme_shard *)sh;
    offload_acct *a = sh->env->acct;
    if (s->counted) {
        offload_count(a, OFFLOAD_CPU, -(int64_t)((size_t)s->nslots * nvs_group_bytes(s, s->group)));
        offload_count(a, OFFLOAD_NVME, -(int64_t)nvme_store_footprint(s->store));
    }
    if (enc_on(&s->enc)) {
        offload_host_free(sh->env, s->sm, s->enc.chunk * 4, 0);
        offload_host_free(sh->env, s->sv, s->enc.chunk * 4, 0);
    }
    free(s->stored);
    if (s->pipe) nvme_pipeline_free(s->pipe);
    if (s->store) nvme_store_free(s->store);
    if (s->engine) nvme_engine_free(s->engine);
    free(s);
}

/* The image: every group's encoded m and v in group order (each group but
 * the last the same size). */
static void nvs_image_key(const oshard *sh, char *key, size_t len, uint64_t *bytes)
{
    const nvme_shard *s = (const nvme_shard *)sh;
    /* (each group's chunks from its own first element: a group that is not
     * whole chunks ends in a short one, so the groups' bytes add up, not
     * the bytes of their elements together) */
    *bytes = enc_on(&s->enc) ? sh->n / s->group * enc_bytes(&s->enc, s->group) + enc_bytes(&s->enc, sh->n % s->group)
                             : 0;
    snprintf(key, len, "nvme %zu+%zu %s group %zu chunk %zu", sh->first, sh->n,
             enc_on(&s->enc) ? adam_state_name(s->enc.kind) : "fp32", s->group, s->enc.chunk);
}

static zo_status nvs_image_io(oshard *sh, uint64_t off, size_t len, void *buf, int put)
{
    nvme_shard *s = (nvme_shard *)sh;
    size_t gb = enc_bytes(&s->enc, s->group), ng = nvme_pipeline_groups(s->pipe);
    zo_status st;
    for (size_t done = 0; done < len;) {
        uint64_t at = off + done;
        size_t g = at / gb < ng ? at / gb : ng - 1, f, n;
        group_range(s, g, &f, &n);
        size_t in = at - g * gb, k = enc_bytes(&s->enc, n) - in < len - done ? enc_bytes(&s->enc, n) - in : len - done;
        if ((st = cache_take(s, g, 0)) != ZO_OK || (st = cache_complete(s)) != ZO_OK) return st;
        if (put) {
            memcpy((char *)s->cache[1] + in, (char *)buf + done, k);
            s->dirty = 1;
        } else {
            memcpy((char *)buf + done, (char *)s->cache[1] + in, k);
        }
        done += k;
    }
    return ZO_OK;
}

static const oshard_ops nvs_ops = {
    .read = nvs_read, .write = nvs_write, .sync = nvs_sync, .step = nvs_step,
    .step_range = nvs_step_range, .grad_sum = host_side_sum, .image_key = nvs_image_key,
    .image_io = nvs_image_io, .free = nvs_destroy,
};

static zo_status nvs_create(oshard *sh, const oshard_config *c)
{
    nvme_shard *s = (nvme_shard *)sh;
    offload_acct *a = sh->env->acct;
    zo_status st;
    s->cg = -1;
    nvme_engine_config ec = {0};
    if ((st = nvme_engine_init(&s->engine, &ec)) != ZO_OK) return st;
    /* <dir>/zo-opt-<random>.0.swap, created exclusively and locked (nvme_store.h) */
    const char *dirs[1] = {c->nvme_dir};
    nvme_store_config sc = {.dirs = dirs, .ndirs = 1, .prefix = "zo-opt"};
    if ((st = nvme_store_init(&s->store, s->engine, &sc)) != ZO_OK)
        return zo_error_wrap(st, "offload: NVMe store in %s", c->nvme_dir);
    s->group = c->sub_group < sh->n ? c->sub_group : sh->n;
    s->nslots = c->swap_buffers < 2 ? 2 : c->swap_buffers;
    nvme_pipeline_config pc = {.n_elems = sh->n, .group_elems = s->group, .nslots = s->nslots,
                               .prefix = "opt"};
    if ((st = enc_init(&s->enc, c->state, s->group, sh->env->n_threads)) != ZO_OK) return st;
    if (enc_on(&s->enc)) {
        /* the drive holds the master and the encoded m and v: the pipeline
         * moves those bytes */
        pc.tensor_bytes = nvs_tensor_bytes;
        pc.tensor_user = &s->enc;
        if ((st = offload_host_alloc(sh->env, s->enc.chunk * 4, 0, (void **)&s->sm)) != ZO_OK ||
            (st = offload_host_alloc(sh->env, s->enc.chunk * 4, 0, (void **)&s->sv)) != ZO_OK)
            return zo_error_wrap(st, "offload_init: optimizer state on NVMe: scratch");
    }
    if ((st = nvme_pipeline_init(&s->pipe, s->store, &pc)) != ZO_OK)
        return zo_error_wrap(st, "offload: optimizer state on NVMe");
    if ((st = nvme_pipeline_slot_buffers(s->pipe, 1, &s->cache[0], &s->cache[1], &s->cache[2])) != ZO_OK)
        return st;
    if (enc_on(&s->enc) && !(s->stored = calloc(nvme_pipeline_groups(s->pipe), 1)))
        return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    offload_count(a, OFFLOAD_NVME, (int64_t)nvme_store_footprint(s->store));
    /* the pipeline's sub-group buffers: master, m, v per slot */
    offload_count(a, OFFLOAD_CPU, (int64_t)((size_t)s->nslots * nvs_group_bytes(s, s->group)));
    s->counted = 1;
    return ZO_OK;
}

#define NVME_SHARD_SIZE sizeof(nvme_shard)

#else /* no nvme module: the configuration is refused at init */

static const oshard_ops nvs_ops;
static zo_status nvs_create(oshard *sh, const oshard_config *c)
{
    (void)sh, (void)c;
    return zo_error(ZO_ERR_UNSUPPORTED, "offload: optimizer state on NVMe needs the nvme module (liburing, xxHash)");
}
#define NVME_SHARD_SIZE sizeof(oshard)

#endif

/* ---- device memory ---------------------------------------------------------------------------- */

/* Values of m and v a device shard decodes or codes at a time in host
 * memory (checkpoints, weights in and out): whole 8-bit blocks. */
#define DEV_STAGE ((size_t)ZO_PLAN_GPU_STAGE)
_Static_assert(ZO_PLAN_GPU_STAGE % ADAM_Q8_BLOCK == 0, "the GPU share's stage holds whole 8-bit blocks");

/* The device shard's gradient statistics, as its device buffer (stats)
 * holds them and the host reads them back: what the kernels gpu_sum_squares
 * and gpu_check_finite add to. */
typedef struct dev_stats {
    double sumsq;  /* the sum of squares (without the rank's own experts when sums.xn) */
    double xsumsq; /* the rank's own experts' sum of squares (sums.xn) */
    int32_t bad;   /* not 0: an inf or a nan */
} dev_stats;

typedef struct dev_shard {
    oshard base;
    float *P, *M, *V;     /* device [n] fp32 (M, V: fp32 state only) */
    /* m and v encoded (issue 30): each block's an adam_state buffer of its
     * own (so 8-bit blocks start at the block's first element), block b's
     * at S + s_off[b - b0]; a host state buffer of DEV_STAGE values and
     * fp32 scratch to move them in and out */
    adam_state_kind kind;
    int enc;
    char *S;
    size_t *s_off;        /* [blocks + 1] */
    void *stage;
    size_t stage_bytes;
    float *sm, *sv;
    float *G;             /* device [gn] fp32: the gradient sums over micro-batches (sums->off from b0) */
    size_t gn;
    /* no fp32 master (issue 30; m and v encoded): the bf16 weights W [n]
     * and Kahan's bf16 compensation C [n] (kahan only) in device memory in
     * place of P, which gpu_adam_state_update rounds as --master says; a
     * host stage of DEV_STAGE of each to move them */
    uint16_t *W, *C;
    int w_in_place;       /* W is the device store's array (no bytes of its own) */
    uint16_t *wstage;     /* [2 DEV_STAGE]: W's values, then C's */
    int b0;               /* its first block (whole blocks to the end) */
    dev_stats *stats;     /* device */
    float *stats_host;    /* pinned [largest]: one block's fp32 gradient (exact statistics) */
    gpu_event_t done;     /* d2h: the shard's work so far has run */
    int pending;          /* the step's update is enqueued and not waited for */
    /* one rank: the update zeroes the sums behind it, on its stream, so
     * that the next micro-batch's compute waits for it only at its first
     * addition (grad_ready), not before its forward (grad_zero) */
    int sums_zeroed;      /* the last update zeroed them */
    int zero_wait;        /* the next addition waits for `done` first */
} dev_shard;

static float *dev_array(dev_shard *d, int a)
{
    float *arr[4] = {d->P, d->M, d->V, d->G};
    return arr[a];
}

/* Block b's gradient sum: the whole block (ZeRO 1) or its part. */
static float *sum_block(dev_shard *d, int b)
{
    const ostate_sums *s = d->base.sums;
    return d->G + (s->off[b] - s->off[d->b0]);
}

/* Block b's gradient as the optimizer reads it (fp32, its numel in the
 * shard's geometry). */
static float *grad_block(dev_shard *d, int b) { return sum_block(d, b) + d->base.sums->part[b]; }

static zo_status dev_wait(dev_shard *d, offload_time_part part)
{
    zo_status st = gpu_event_record(d->done, d->base.env->d2h);
    if (st == ZO_OK) st = offload_timed_wait(d->base.env, d->done, part);
    return st;
}

/* The parts of chunk [c0, c0 + len) of block b's encoded state: byte
 * offsets and lengths in the device buffer (dev) and in a host state
 * buffer of len values (host), indexed by dev_part: m, v and (8-bit) the
 * two absmax parts. */
enum dev_part { DEV_PART_M, DEV_PART_V, DEV_PART_ABSMAX_M, DEV_PART_ABSMAX_V };

static int dev_chunk_parts(const dev_shard *d, int b, size_t c0, size_t len, size_t dev[4], size_t host[4],
                           size_t bytes[4])
{
    adam_state_layout lb, lc;
    adam_state_layout_of(d->kind, d->base.g->numel[b], &lb);
    adam_state_layout_of(d->kind, len, &lc);
    size_t es = d->kind.type == ADAM_STATE_F32 ? 4 : d->kind.type == ADAM_STATE_BF16 ? 2 : 1;
    size_t base = d->s_off[b - d->b0];
    size_t q0 = d->kind.block ? c0 / d->kind.block : 0;
    dev[DEV_PART_M] = base + lb.off_m + es * c0, host[DEV_PART_M] = lc.off_m, bytes[DEV_PART_M] = es * len;
    dev[DEV_PART_V] = base + lb.off_v + es * c0, host[DEV_PART_V] = lc.off_v, bytes[DEV_PART_V] = es * len;
    dev[DEV_PART_ABSMAX_M] = base + lb.off_absmax_m + 4 * q0, host[DEV_PART_ABSMAX_M] = lc.off_absmax_m,
    bytes[DEV_PART_ABSMAX_M] = 4 * lc.n_blocks;
    dev[DEV_PART_ABSMAX_V] = base + lb.off_absmax_v + 4 * q0, host[DEV_PART_ABSMAX_V] = lc.off_absmax_v,
    bytes[DEV_PART_ABSMAX_V] = 4 * lc.n_blocks;
    return d->kind.type == ADAM_STATE_Q8 ? 4 : 2;
}

/* Chunk [c0, c0 + len) of block b between the device and the stage, then
 * (get) decoded into sm, sv, or (put, from sm, sv) coded first. */
static zo_status dev_chunk_move(dev_shard *d, int b, size_t c0, size_t len, int put)
{
    const offload_env *env = d->base.env;
    size_t dv[4], hs[4], by[4];
    int parts = dev_chunk_parts(d, b, c0, len, dv, hs, by);
    zo_status st;
    if (put && (st = adam_state_from_f32(d->kind, d->stage, len, d->sm, d->sv, env->n_threads)) != ZO_OK) return st;
    for (int k = 0; k < parts; k++) {
        st = put ? gpu_memcpy_async(env->h2d, d->S + dv[k], (char *)d->stage + hs[k], by[k], GPU_COPY_HOST_TO_DEVICE)
                 : gpu_memcpy_async(env->d2h, (char *)d->stage + hs[k], d->S + dv[k], by[k], GPU_COPY_DEVICE_TO_HOST);
        if (st != ZO_OK) return st;
    }
    if (put) return gpu_stream_synchronize(env->h2d);
    if ((st = dev_wait(d, OFFLOAD_TIME_OPTIMIZER)) != ZO_OK) return st;
    return adam_state_to_f32(d->kind, d->stage, len, d->sm, d->sv, env->n_threads);
}

/* The zero state of chunks [c0, c0 + len) of block b (c0 on a chunk, len
 * whole chunks or to the block's end) set on the device: the bytes
 * dev_chunk_move puts for zeros, enqueued on h2d and waited for. */
static zo_status dev_zero_chunks(dev_shard *d, int b, size_t c0, size_t len)
{
    gpu_stream_t s = d->base.env->h2d;
    size_t dv[4], hs[4], by[4];
    int parts = dev_chunk_parts(d, b, c0, len, dv, hs, by);
    int mcode = d->kind.type == ADAM_STATE_Q8 ? ADAM_Q8_ZERO_M_CODE : 0;
    zo_status st;
    for (int k = 0; k < parts; k++)
        if (by[k] && (st = gpu_memset_async(s, d->S + dv[k], k == DEV_PART_M ? mcode : 0, by[k])) != ZO_OK)
            return st;
    return gpu_stream_synchronize(s);
}

/* Encoded m and v of flat [first, first + n) out (M, V; either NULL:
 * skipped) or in (cM, cV; NULL: zeros), a chunk of whole 8-bit blocks of
 * one block at a time. */
static zo_status dev_enc_io(dev_shard *d, size_t first, size_t n, float *M, float *V, const float *cM,
                            const float *cV, int put)
{
    const offload_geom *g = d->base.g;
    zo_status st;
    if (!put && !M && !V) return ZO_OK;
    for (size_t pos = first, end = first + n; pos < end;) {
        int b = offload_block_of(g, pos);
        size_t rel = pos - g->off[b], nb = g->numel[b];
        size_t c0 = rel / DEV_STAGE * DEV_STAGE, len = nb - c0 < DEV_STAGE ? nb - c0 : DEV_STAGE;
        size_t stop = end - g->off[b] < c0 + len ? end - g->off[b] : c0 + len, k = stop - rel;
        size_t at = pos - first;
        /* zeros over whole chunks, as many of the block's as the range
         * holds: the zero state's bytes (what coding zeros gives: m's zero
         * code, v and the absmax 0) set on the device, nothing coded or
         * copied */
        size_t e_b = end - g->off[b] < nb ? end - g->off[b] : nb;
        size_t r1 = e_b == nb ? nb : e_b / DEV_STAGE * DEV_STAGE;
        if (put && !cM && !cV && rel == c0 && r1 > rel) {
            if ((st = dev_zero_chunks(d, b, rel, r1 - rel)) != ZO_OK) return st;
            pos += r1 - rel;
            continue;
        }
        /* (a write of the whole chunk needs nothing from it) */
        if ((!put || rel > c0 || stop < c0 + len) && (st = dev_chunk_move(d, b, c0, len, 0)) != ZO_OK) return st;
        if (put) {
            copy_or_zero(d->sm + (rel - c0), cM ? cM + at : NULL, k);
            copy_or_zero(d->sv + (rel - c0), cV ? cV + at : NULL, k);
            if ((st = dev_chunk_move(d, b, c0, len, 1)) != ZO_OK) return st;
        } else {
            if (M) memcpy(M + at, d->sm + (rel - c0), k * 4);
            if (V) memcpy(V + at, d->sv + (rel - c0), k * 4);
        }
        pos += k;
    }
    return ZO_OK;
}

/* The weights of flat [first, first + n) without a master, out as fp32 (W
 * + C, settled on W as the host shard's mst_decode_out does: a checkpoint's
 * weight rounds to W, its image gives C back) or in (W the nearest bf16 of
 * P, C what it lost), DEV_STAGE at a time through the host stage. */
static zo_status dev_w_io(dev_shard *d, size_t first, size_t n, float *out, const float *in)
{
    const offload_env *env = d->base.env;
    uint16_t *sw = d->wstage, *sc = d->wstage + DEV_STAGE;
    zo_status st;
    for (size_t f = 0; f < n; f += DEV_STAGE) {
        size_t k = n - f < DEV_STAGE ? n - f : DEV_STAGE, r = first - d->base.first + f;
        if (in) {
            for (size_t i = 0; i < k; i++) {
                sw[i] = zo_f32_to_bf16(in[f + i]);
                sc[i] = zo_f32_to_bf16(in[f + i] - zo_bf16_to_f32(sw[i]));
            }
            if ((st = gpu_memcpy_async(env->h2d, d->W + r, sw, k * 2, GPU_COPY_HOST_TO_DEVICE)) != ZO_OK ||
                (d->C && (st = gpu_memcpy_async(env->h2d, d->C + r, sc, k * 2, GPU_COPY_HOST_TO_DEVICE)) != ZO_OK) ||
                (st = gpu_stream_synchronize(env->h2d)) != ZO_OK)
                return st;
            continue;
        }
        if ((st = gpu_memcpy_async(env->d2h, sw, d->W + r, k * 2, GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
            (d->C && (st = gpu_memcpy_async(env->d2h, sc, d->C + r, k * 2, GPU_COPY_DEVICE_TO_HOST)) != ZO_OK) ||
            (st = dev_wait(d, OFFLOAD_TIME_OPTIMIZER)) != ZO_OK)
            return st;
        for (size_t i = 0; i < k; i++) {
            float w = zo_bf16_to_f32(sw[i]), p = w + (d->C ? zo_bf16_to_f32(sc[i]) : 0.0f);
            if (zo_f32_to_bf16(p) != sw[i]) p = nextafterf(p, w);
            out[f + i] = p;
        }
    }
    return ZO_OK;
}

static zo_status dev_read(oshard *sh, size_t first, size_t n, float *P, float *M, float *V)
{
    dev_shard *d = (dev_shard *)sh;
    if (d->W && P && n) {
        zo_status st = dev_w_io(d, first, n, P, NULL);
        if (st != ZO_OK) return st;
        P = NULL;
    }
    float *out[3] = {P, d->enc ? NULL : M, d->enc ? NULL : V};
    size_t r = first - sh->first;
    zo_status st;
    if (!n) return ZO_OK;
    for (int a = 0; a < 3; a++)
        if (out[a] && (st = gpu_memcpy_async(sh->env->d2h, out[a], dev_array(d, a) + r, n * 4,
                                             GPU_COPY_DEVICE_TO_HOST)) != ZO_OK)
            return st;
    if ((st = dev_wait(d, OFFLOAD_TIME_OPTIMIZER)) != ZO_OK) return st;
    return d->enc ? dev_enc_io(d, first, n, M, V, NULL, NULL, 0) : ZO_OK;
}

static zo_status dev_write(oshard *sh, size_t first, size_t n, const float *P, const float *M,
                           const float *V)
{
    dev_shard *d = (dev_shard *)sh;
    const float *in[3] = {P, M, V};
    gpu_stream_t s = sh->env->h2d;
    size_t r = first - sh->first;
    zo_status st;
    if (!n) return ZO_OK;
    if (d->W) { /* (no weights given: left as they are, as a master is) */
        if (P && (st = dev_w_io(d, first, n, NULL, P)) != ZO_OK) return st;
        in[0] = NULL;
    }
    for (int a = 0; a < (d->enc ? 1 : 3); a++) {
        float *dst = dev_array(d, a) + r;
        if (in[a]) st = gpu_memcpy_async(s, dst, in[a], n * 4, GPU_COPY_HOST_TO_DEVICE);
        else if (a) st = gpu_memset_async(s, dst, 0, n * 4);
        else continue;
        if (st != ZO_OK) return st;
    }
    if ((st = gpu_stream_synchronize(s)) != ZO_OK) return st;
    return d->enc ? dev_enc_io(d, first, n, NULL, NULL, M, V, 1) : ZO_OK;
}

static zo_status dev_sync(oshard *sh)
{
    dev_shard *d = (dev_shard *)sh;
    if (!d->pending) return ZO_OK;
    d->pending = 0;
    return offload_timed_wait(sh->env, d->done, OFFLOAD_TIME_OPTIMIZER);
}

static zo_status dev_step(oshard *sh, const oshard_update *u)
{
    dev_shard *d = (dev_shard *)sh;
    const offload_geom *g = sh->g;
    gpu_stream_t s = sh->env->d2h;
    zo_status st;
    for (int b = d->b0; b < g->nb; b++) {
        size_t r = g->off[b] - sh->first;
        if (!g->numel[b]) continue;
        float *M = d->enc ? NULL : d->M + r, *V = d->enc ? NULL : d->V + r;
        void *S = d->enc ? d->S + d->s_off[b - d->b0] : NULL;
        float *P = d->W ? NULL : d->P + r;
        uint16_t *W = d->W ? d->W + r : NULL, *C = d->C ? d->C + r : NULL;
        if ((st = u->dev(u->ctx, b, P, M, V, S, grad_block(d, b), W, C, s)) != ZO_OK) return st;
    }
    /* (several ranks: the reductions write the sums too; they are zeroed
     * at the next micro-batch, after the update, as before) */
    if (d->gn && !sh->env->dp) {
        if ((st = gpu_memset_async(s, d->G, 0, d->gn * 4)) != ZO_OK) return st;
        d->sums_zeroed = 1;
    }
    if ((st = gpu_event_record(d->done, s)) != ZO_OK) return st;
    d->pending = 1;
    return ZO_OK;
}

static void dev_grad_sum(oshard *sh, int b, oshard_sum *out)
{
    dev_shard *d = (dev_shard *)sh;
    out->host = NULL;
    out->dev = sum_block(d, b);
    out->part = grad_block(d, b);
}

static zo_status dev_grad_zero(oshard *sh, gpu_stream_t s)
{
    dev_shard *d = (dev_shard *)sh;
    zo_status st;
    if (!d->gn) return ZO_OK;
    if (d->sums_zeroed) { /* behind the update: waited for at the first addition */
        d->sums_zeroed = 0;
        d->zero_wait = 1;
        return ZO_OK;
    }
    /* the update that reads the sums runs on d2h, perhaps still (the step
     * returns before it ends) */
    d->zero_wait = 0;
    if ((st = gpu_stream_wait_event(s, d->done)) != ZO_OK) return st;
    return gpu_memset_async(s, d->G, 0, d->gn * 4);
}

static zo_status dev_grad_ready(oshard *sh, gpu_stream_t s)
{
    dev_shard *d = (dev_shard *)sh;
    if (!d->zero_wait) return ZO_OK;
    d->zero_wait = 0;
    return gpu_stream_wait_event(s, d->done);
}

/* exact (and the shard keeps its pinned statistics block: the optimizer
 * has a host or NVMe share too): block by block, each block's fp32 sum
 * copied to the pinned statistics buffer and summed by the host's own
 * function, in block order: the very bits the host would get with these
 * blocks in memory, so clipping gives bit-identical steps. Otherwise on
 * the device, with no copy: gpu_sum_squares accumulates in double and
 * only the statistics' few bytes come back (the host's sum too is one in
 * double of the same exact squares, in another order: the two differ in
 * the double's last bits, and the clip's float multiplier is the same bits
 * but where they straddle a float's rounding boundary). The rank's own
 * experts' runs
 * (sums->xn) go to *xsumsq, in the same pass. */
static zo_status dev_grad_stats(oshard *sh, int exact, double *sumsq, double *xsumsq, int *bad_block)
{
    dev_shard *d = (dev_shard *)sh;
    const offload_geom *g = sh->g;
    const offload_env *env = sh->env;
    gpu_stream_t s = env->d2h;
    zo_status st;
    if (exact && d->stats_host) {
        for (int b = d->b0; b < g->nb; b++) {
            size_t n = g->numel[b];
            if (!n) continue;
            double ss, xs;
            int nf;
            if ((st = gpu_memcpy_async(s, d->stats_host, grad_block(d, b), n * 4,
                                       GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
                (st = gpu_event_record(d->done, s)) != ZO_OK || (st = gpu_event_synchronize(d->done)) != ZO_OK)
                return st;
            offload_add_bytes(env->acct, OFFLOAD_BYTES_D2H, n * 4);
            if ((st = split_stats(sh->sums, b, d->stats_host, n, env->n_threads, &ss, &xs, &nf)) != ZO_OK)
                return st;
            *sumsq += ss;
            *xsumsq += xs;
            if (nf && *bad_block < 0) *bad_block = b;
        }
        return ZO_OK; /* (its time is the step's: offload_optim_step) */
    }
    double *sum = &d->stats->sumsq, *xsum = &d->stats->xsumsq; /* (device addresses) */
    int32_t *flag = &d->stats->bad;
    dev_stats host;
    if ((st = gpu_memset_async(s, d->stats, 0, sizeof host)) != ZO_OK) return st;
    if (sh->sums->xn) { /* block by block: each block's experts' run apart */
        for (int b = d->b0; b < g->nb; b++) {
            size_t n = g->numel[b], lo, hi;
            const float *v = grad_block(d, b);
            expert_run(sh->sums, b, n, &lo, &hi);
            const size_t at[4] = {0, lo, hi, n};
            for (int k = 0; k < 3; k++)
                if (at[k + 1] > at[k] &&
                    (st = gpu_sum_squares(s, k == 1 ? xsum : sum, gpu_t((float *)v + at[k], ZO_DTYPE_F32),
                                          at[k + 1] - at[k])) != ZO_OK)
                    return st;
        }
    } else if (!sh->sums->whole) { /* the sums are the shard's range, in one piece */
        if ((st = gpu_sum_squares(s, sum, gpu_t(d->G, ZO_DTYPE_F32), sh->n)) != ZO_OK) return st;
    } else {
        for (int b = d->b0; b < g->nb; b++)
            if (g->numel[b] &&
                (st = gpu_sum_squares(s, sum, gpu_t(grad_block(d, b), ZO_DTYPE_F32), g->numel[b])) != ZO_OK)
                return st;
    }
    if ((st = gpu_memcpy_async(s, &host, d->stats, sizeof host, GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
        (st = gpu_event_record(d->done, s)) != ZO_OK || (st = gpu_event_synchronize(d->done)) != ZO_OK)
        return st;
    *sumsq += host.sumsq;
    *xsumsq += host.xsumsq;
    /* a gradient that is inf or nan makes its sum of squares so (squares
     * of finite floats in double neither overflow nor cancel), so no check
     * of its own runs while the sums are finite */
    if (isfinite(host.sumsq) && isfinite(host.xsumsq)) return ZO_OK;
    /* the step fails or is skipped: which block, checked one by one */
    for (int b = d->b0; b < g->nb && *bad_block < 0; b++) {
        if (!g->numel[b]) continue;
        if ((st = gpu_memset_async(s, flag, 0, sizeof host.bad)) != ZO_OK ||
            (st = gpu_check_finite(s, flag, gpu_t(grad_block(d, b), ZO_DTYPE_F32), g->numel[b])) != ZO_OK ||
            (st = gpu_memcpy_async(s, &host.bad, flag, sizeof host.bad, GPU_COPY_DEVICE_TO_HOST)) != ZO_OK ||
            (st = gpu_event_record(d->done, s)) != ZO_OK || (st = gpu_event_synchronize(d->done)) != ZO_OK)
            return st;
        if (host.bad) *bad_block = b;
    }
    /* finite values whose sum of squares overflows fp32: named by the share's first block */
    if (*bad_block < 0) *bad_block = d->b0;
    return ZO_OK;
}

static void dev_destroy(oshard *sh)
{
    dev_shard *d = (dev_shard *)sh;
    gpu_device_t dev = sh->env->dev;
    /* dev_create's zero fills may still be queued (a later allocation of it
     * failed): they finish before their arrays go */
    if (sh->env->h2d) gpu_stream_synchronize(sh->env->h2d);
    for (int a = 0; a < 4; a++) gpu_mem_free(dev, dev_array(d, a));
    gpu_mem_free(dev, d->S);
    if (!d->w_in_place) gpu_mem_free(dev, d->W);
    gpu_mem_free(dev, d->C);
    offload_host_free(sh->env, d->wstage, d->wstage ? DEV_STAGE * 4 : 0, 0);
    free(d->s_off);
    if (d->enc) {
        offload_host_free(sh->env, d->stage, d->stage_bytes, 0);
        offload_host_free(sh->env, d->sm, DEV_STAGE * 4, 0);
        offload_host_free(sh->env, d->sv, DEV_STAGE * 4, 0);
    }
    gpu_mem_free(dev, d->stats);
    offload_host_free(sh->env, d->stats_host, sh->g->largest * 4, 1);
    if (d->done) gpu_event_destroy(d->done);
    free(d);
}

/* The image: every block's state buffer, in block order, then Kahan's
 * compensation C (the key says "kahan"). */
static void dev_image_key(const oshard *sh, char *key, size_t len, uint64_t *bytes)
{
    const dev_shard *d = (const dev_shard *)sh;
    *bytes = (d->enc ? d->s_off[sh->g->nb - d->b0] : 0) + (d->C ? sh->n * 2 : 0);
    /* (fp32 m and v in state buffers, without a master: "fp32 buffers",
     * whose image the fp32 master's shard, with none, does not take) */
    snprintf(key, len, "gpu %zu+%zu %s%s%s", sh->first, sh->n, d->enc ? adam_state_name(d->kind) : "fp32",
             d->enc && d->kind.type == ADAM_STATE_F32 ? " buffers" : "", d->C ? " kahan" : "");
}

static zo_status dev_image_io(oshard *sh, uint64_t off, size_t len, void *buf, int put)
{
    dev_shard *d = (dev_shard *)sh;
    const offload_env *env = sh->env;
    uint64_t sb = d->enc ? d->s_off[sh->g->nb - d->b0] : 0;
    zo_status st;
    /* [off, off + len) cut at the state's end: the state's part, then C's */
    for (int part = 0; part < 2 && len; part++) {
        if (part == 0 && off >= sb) continue;
        size_t k = part == 0 ? (off + len <= sb ? len : (size_t)(sb - off)) : len;
        char *dv = part == 0 ? d->S + off : (char *)d->C + (off - sb);
        st = put ? gpu_memcpy_async(env->h2d, dv, buf, k, GPU_COPY_HOST_TO_DEVICE)
                 : gpu_memcpy_async(env->d2h, buf, dv, k, GPU_COPY_DEVICE_TO_HOST);
        if (st != ZO_OK) return st;
        st = put ? gpu_stream_synchronize(env->h2d) : dev_wait(d, OFFLOAD_TIME_OPTIMIZER);
        if (st != ZO_OK) return st;
        buf = (char *)buf + k;
        off += k;
        len -= k;
    }
    return ZO_OK;
}

static const oshard_ops dev_ops = {
    .read = dev_read, .write = dev_write, .sync = dev_sync, .step = dev_step, .grad_sum = dev_grad_sum,
    .grad_zero = dev_grad_zero, .grad_ready = dev_grad_ready, .grad_stats = dev_grad_stats, .image_key = dev_image_key,
    .image_io = dev_image_io, .free = dev_destroy,
};

/* m and v encoded: every block's state buffer (zero state: 8-bit m codes
 * at the map's 0, everything else 0) and the host stage. */
static zo_status dev_enc_create(dev_shard *d, zo_plan_opt_state state)
{
    const offload_env *env = d->base.env;
    const offload_geom *g = d->base.g;
    int nblk = g->nb - d->b0;
    zo_status st;
    d->enc = 1;
    d->kind = state == ZO_PLAN_STATE_BF16 ? adam_state_bf16()
              : state == ZO_PLAN_STATE_FP32 ? adam_state_f32() : adam_state_q8(ADAM_Q8_BLOCK);
    d->s_off = calloc((size_t)nblk + 1, sizeof *d->s_off);
    if (!d->s_off) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    for (int i = 0; i < nblk; i++)
        d->s_off[i + 1] = d->s_off[i] + ((size_t)adam_state_bytes(d->kind, g->numel[d->b0 + i]) + 63) / 64 * 64;
    size_t bytes = d->s_off[nblk];
    if (bytes && (st = gpu_mem_alloc(env->dev, bytes, (void **)&d->S)) != ZO_OK)
        return zo_error_wrap(st, "offload_init: optimizer on the device: %s m and v of %zu elements",
                             adam_state_name(d->kind), d->base.n);
    if (bytes && (st = gpu_memset_async(env->h2d, d->S, 0, bytes)) != ZO_OK) return st;
    for (int i = 0; i < nblk && d->kind.type == ADAM_STATE_Q8; i++) {
        adam_state_layout l;
        adam_state_layout_of(d->kind, g->numel[d->b0 + i], &l);
        if (l.n && (st = gpu_memset_async(env->h2d, d->S + d->s_off[i] + l.off_m, ADAM_Q8_ZERO_M_CODE, l.n)) != ZO_OK)
            return st;
    }
    d->stage_bytes = (size_t)adam_state_bytes(d->kind, DEV_STAGE);
    void **arr[3] = {&d->stage, (void **)&d->sm, (void **)&d->sv};
    size_t sz[3] = {d->stage_bytes, DEV_STAGE * 4, DEV_STAGE * 4};
    for (int i = 0; i < 3; i++)
        if ((st = offload_host_alloc(env, sz[i], 0, arr[i])) != ZO_OK)
            return zo_error_wrap(st, "offload_init: optimizer on the device: host stage of its %s m and v",
                                 adam_state_name(d->kind));
    return ZO_OK;
}

static zo_status dev_create(oshard *sh, const oshard_config *c)
{
    dev_shard *d = (dev_shard *)sh;
    const offload_env *env = sh->env;
    zo_status st;
    d->b0 = offload_block_of(sh->g, sh->first);
    if (sh->g->off[d->b0] != sh->first)
        return zo_error(ZO_ERR_INTERNAL, "offload: the device shard starts inside block %d", d->b0);
    float **arr[4] = {&d->P, &d->M, &d->V, &d->G};
    const char *what[4] = {"fp32 master", "m", "v", "fp32 gradient sums"};
    d->gn = sh->sums->off[sh->g->nb] - sh->sums->off[d->b0];
    sh->enqueued = 1;
    /* (without a master, fp32 m and v too are a state buffer a block, the
     * layout gpu_adam_state_update takes) */
    if ((c->state != ZO_PLAN_STATE_FP32 || c->master != ZO_PLAN_MASTER_FP32) &&
        (st = dev_enc_create(d, c->state)) != ZO_OK)
        return st;
    if (c->master != ZO_PLAN_MASTER_FP32) { /* bf16 weights (+ compensation), zeros until written */
        uint16_t **wc[2] = {&d->W, &d->C};
        if (c->dev_master_at) { /* the device store's weights themselves */
            d->W = c->dev_master_at + sh->first;
            d->w_in_place = 1;
        }
        for (int i = d->w_in_place; i < (c->master == ZO_PLAN_MASTER_KAHAN ? 2 : 1); i++)
            if (sh->n && ((st = gpu_mem_alloc(env->dev, sh->n * 2, (void **)wc[i])) != ZO_OK ||
                          (st = gpu_memset_async(env->h2d, *wc[i], 0, sh->n * 2)) != ZO_OK))
                return zo_error_wrap(st, "offload_init: optimizer on the device: bf16 %s of %zu elements (--master %s)",
                                     i ? "compensation" : "weights", sh->n, zo_plan_master_name(c->master));
        if ((st = offload_host_alloc(env, DEV_STAGE * 4, 0, (void **)&d->wstage)) != ZO_OK)
            return zo_error_wrap(st, "offload_init: optimizer on the device: host stage of its bf16 weights");
    }
    for (int a = 0; a < 4; a++) {
        size_t n = a == 3 ? d->gn : (a == 0 && !d->W) || !d->enc ? sh->n : 0;
        if (!n) continue;
        if ((st = gpu_mem_alloc(env->dev, n * 4, (void **)arr[a])) != ZO_OK)
            return zo_error_wrap(st, "offload_init: optimizer on the device: %s of %zu elements", what[a], n);
        if ((st = gpu_memset_async(env->h2d, *arr[a], 0, n * 4)) != ZO_OK) return st;
    }
    if ((st = gpu_mem_alloc(env->dev, sizeof *d->stats, (void **)&d->stats)) != ZO_OK)
        return zo_error_wrap(st, "offload_init: optimizer on the device: gradient statistics");
    /* exact statistics only beside a host or NVMe share (whose norm the
     * device share's must match bit for bit): a device shard that is the
     * whole optimizer takes its norm on the device, no gradient leaving it */
    if (c->exact_stats && sh->first > 0 &&
        (st = offload_host_alloc(env, sh->g->largest * 4, 1, (void **)&d->stats_host)) != ZO_OK)
        return zo_error_wrap(st, "offload_init: optimizer on the device: pinned statistics block");
    if ((st = gpu_event_create(env->dev, &d->done)) != ZO_OK) return st;
    return gpu_stream_synchronize(env->h2d);
}

/* ---- life cycle ----------------------------------------------------------------------------------- */

static zo_status oshard_create(ostate *os, const oshard_config *c, oshard **out)
{
    *out = NULL;
    static const size_t size[OFFLOAD_TIERS] = {sizeof(dev_shard), sizeof(host_shard), NVME_SHARD_SIZE};
    static const oshard_ops *const ops[OFFLOAD_TIERS] = {&dev_ops, &host_ops, &nvs_ops};
    zo_status (*const create[OFFLOAD_TIERS])(oshard *, const oshard_config *) = {dev_create, host_create,
                                                                                   nvs_create};
    oshard *sh = calloc(1, size[c->tier]);
    if (!sh) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    sh->ops = ops[c->tier];
    sh->env = os->env;
    sh->g = os->og;
    sh->sums = &os->sums;
    sh->tier = c->tier;
    sh->first = c->first;
    sh->n = c->n;
    zo_status st = create[c->tier](sh, c);
    if (st != ZO_OK) {
        if (sh->ops->free) sh->ops->free(sh);
        else free(sh);
        return st;
    }
    *out = sh;
    return ZO_OK;
}

/* The device share: the suffix of whole blocks whose size is nearest
 * frac * n (at least one block when the fraction is not 0), so that a
 * block's gradient stays on the device or leaves it whole. Chosen on the
 * model g, so that every rank chooses the same blocks. */
static int device_share_first(const offload_geom *g, double frac)
{
    int nb = g->nb, best_b = nb;
    if (frac <= 0) return nb;
    double want = frac * (double)g->n, best = -1;
    for (int b = nb - 1; b >= 0; b--) {
        double d = fabs((double)(g->n - g->off[b]) - want);
        if (best < 0 || d < best || best_b == nb) {
            best = d;
            best_b = b;
        }
    }
    return best_b;
}

/* Where the gradient sums are (the layout of ostate_sums) and the host
 * side's array; the statistics kept per block. */
static zo_status sums_create(ostate *os, const offload_geom *g)
{
    const offload_dp *dp = os->env->dp;
    const offload_geom *og = os->og;
    ostate_sums *s = &os->sums;
    int nb = g->nb;
    zo_status st;
    s->whole = dp && dp->stage == 1;
    s->off = calloc((size_t)nb + 1, sizeof *s->off);
    s->part = calloc((size_t)nb, sizeof *s->part);
    os->blk_sumsq = calloc((size_t)nb, sizeof *os->blk_sumsq);
    os->blk_xsumsq = calloc((size_t)nb, sizeof *os->blk_xsumsq);
    os->blk_nonfinite = calloc((size_t)nb, sizeof *os->blk_nonfinite);
    os->blk_taken = calloc((size_t)nb, 1);
    if (!s->off || !s->part || !os->blk_sumsq || !os->blk_xsumsq || !os->blk_nonfinite || !os->blk_taken)
        return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    for (int b = 0; b < nb; b++) {
        s->off[b + 1] = s->off[b] + (s->whole ? dp->pad[b] : og->numel[b]);
        s->part[b] = s->whole ? dp->part_off[b] : 0;
    }
    s->host_n = s->off[os->dev_block];
    if ((st = offload_host_alloc(os->env, s->host_n * sizeof(float), 0, (void **)&s->host)) != ZO_OK)
        return zo_error_wrap(st, "offload_init: fp32 gradients");
    if (s->host_n) zo_memset_team(s->host, 0, s->host_n * sizeof(float), os->env->n_threads);
    return ZO_OK;
}

zo_status ostate_create(const offload_env *env, const offload_geom *g, const offload_geom *og,
                        const ostate_config *c, ostate **out)
{
    *out = NULL;
    ostate *os = calloc(1, sizeof *os);
    if (!os) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    os->env = env;
    os->og = og;
    os->dev_block = device_share_first(g, c->frac[OFFLOAD_DEVICE]);
    zo_status st = sums_create(os, g);
    /* in flat order: the first elements in memory, then NVMe, then the
     * device share (whole blocks at the end) */
    size_t dev_first = og->off[os->dev_block];
    size_t n_nvme = (size_t)llround((double)og->n * c->frac[OFFLOAD_NVME]);
    if (n_nvme > dev_first || c->frac[OFFLOAD_CPU] <= 0) n_nvme = dev_first;
    size_t n_cpu = dev_first - n_nvme;
    struct {
        offload_tier tier;
        size_t first, n;
    } part[3] = {{OFFLOAD_CPU, 0, n_cpu}, {OFFLOAD_NVME, n_cpu, n_nvme},
                 {OFFLOAD_DEVICE, dev_first, og->n - dev_first}};
    for (int i = 0; i < 3 && st == ZO_OK; i++) {
        /* blocks summed on the host are handed out by a shard the host
         * updates: one of no elements when the rank holds none of them */
        int hands_out = i == 0 && os->dev_block > 0 && !n_nvme;
        if (!part[i].n && !hands_out) continue;
        oshard_config sc = {.tier = part[i].tier, .first = part[i].first, .n = part[i].n,
                            .sub_group = c->sub_group, .swap_buffers = c->swap_buffers,
                            .exact_stats = c->exact_stats, .nvme_dir = c->nvme_dir, .state = c->state,
                            .master = c->master, .master_in_place = c->master_in_place,
                            .master_at = c->master_at, .dev_master_at = c->dev_master_at};
        if ((st = oshard_create(os, &sc, &os->sh[os->n_sh])) == ZO_OK) os->n_sh++;
    }
    if (st != ZO_OK) {
        ostate_free(os);
        return st;
    }
    *out = os;
    return ZO_OK;
}

void ostate_free(ostate *os)
{
    if (!os) return;
    for (int i = 0; i < os->n_sh; i++) os->sh[i]->ops->free(os->sh[i]);
    offload_host_free(os->env, os->sums.host, os->sums.host_n * sizeof(float), 0);
    free(os->sums.off);
    free(os->sums.part);
    free(os->sums.xoff);
    free(os->sums.xn);
    free(os->blk_sumsq);
    free(os->blk_xsumsq);
    free(os->blk_nonfinite);
    free(os->blk_taken);
    free(os);
}

/* The part of [first, first + n) that shard s holds: [*a, *e), empty when *a == *e. */
static void piece(const oshard *s, size_t first, size_t n, size_t *a, size_t *e)
{
    size_t lo = first > s->first ? first : s->first;
    size_t hi = first + n < s->first + s->n ? first + n : s->first + s->n;
    *a = lo;
    *e = hi > lo ? hi : lo;
}

static float *opt_at(float *p, size_t k) { return p ? p + k : NULL; }
static const float *opt_cat(const float *p, size_t k) { return p ? p + k : NULL; }

zo_status ostate_read(ostate *os, size_t first, size_t n, float *P, float *M, float *V)
{
    zo_status st;
    for (int i = 0; i < os->n_sh; i++) {
        oshard *sh = os->sh[i];
        size_t a, e;
        piece(sh, first, n, &a, &e);
        if (a == e) continue;
        size_t k = a - first;
        if ((st = sh->ops->read(sh, a, e - a, opt_at(P, k), opt_at(M, k), opt_at(V, k))) != ZO_OK) return st;
    }
    return ZO_OK;
}

zo_status ostate_write(ostate *os, size_t first, size_t n, const float *P, const float *M, const float *V)
{
    zo_status st;
    for (int i = 0; i < os->n_sh; i++) {
        oshard *sh = os->sh[i];
        size_t a, e;
        piece(sh, first, n, &a, &e);
        if (a == e) continue;
        size_t k = a - first;
        if ((st = sh->ops->write(sh, a, e - a, opt_cat(P, k), opt_cat(M, k), opt_cat(V, k))) != ZO_OK) return st;
    }
    return ZO_OK;
}

zo_status ostate_sync(ostate *os)
{
    zo_status st = ZO_OK;
    for (int i = 0; i < os->n_sh; i++) {
        zo_status si = os->sh[i]->ops->sync(os->sh[i]);
        if (st == ZO_OK) st = si;
    }
    return st;
}

/* The shards whose step is enqueued (`enqueued`), or the others. */
static zo_status sync_some(ostate *os, int enqueued)
{
    zo_status st = ZO_OK;
    for (int i = 0; i < os->n_sh; i++) {
        zo_status si = os->sh[i]->enqueued != enqueued ? ZO_OK : os->sh[i]->ops->sync(os->sh[i]);
        if (st == ZO_OK) st = si;
    }
    return st;
}

zo_status ostate_sync_host(ostate *os) { return sync_some(os, 0); }

zo_status ostate_sync_enqueued(ostate *os) { return sync_some(os, 1); }

zo_status ostate_get_block(ostate *os, int b, size_t numel, float *w)
{
    const offload_geom *og = os->og;
    offload_dp *dp = os->env->dp;
    zo_status st;
    if (!offload_dp_partitioned(dp)) return ostate_read(os, og->off[b], og->numel[b], w, NULL, NULL);
    /* the rank's part, then everybody's */
    size_t pn = og->numel[b];
    float *part = NULL;
    if (pn && (st = offload_host_alloc(os->env, pn * sizeof(float), 0, (void **)&part)) != ZO_OK) return st;
    st = ostate_read(os, og->off[b], pn, part, NULL, NULL);
    if (st == ZO_OK) st = offload_dp_gather_block(dp, b, numel, part, w);
    offload_host_free(os->env, part, pn * sizeof(float), 0);
    return st;
}

void ostate_master_at(ostate *os, uint16_t *w)
{
    for (int i = 0; i < os->n_sh; i++) {
        oshard *sh = os->sh[i];
        if (sh->tier != OFFLOAD_CPU) continue;
        host_shard *h = (host_shard *)sh;
        if (h->nomaster && h->in_place) h->W = w + sh->first;
    }
}

void ostate_bytes(const ostate *os, uint64_t bytes[OFFLOAD_TIERS])
{
    for (int i = 0; i < os->n_sh; i++) {
        const oshard *sh = os->sh[i];
        uint64_t b = sh->n * 12;
        if (sh->tier == OFFLOAD_CPU) {
            const host_shard *h = (const host_shard *)sh;
            /* the master: fp32, or bf16 weights (+ Kahan's bf16 compensation) */
            uint64_t p = h->nomaster ? sh->n * ((h->in_place ? 0 : 2) + (h->C ? 2 : 0)) : sh->n * 4;
            b = p + (enc_on(&h->enc) ? h->s_bytes : sh->n * 8);
        }
        if (sh->tier == OFFLOAD_DEVICE && ((const dev_shard *)sh)->enc) {
            const dev_shard *d = (const dev_shard *)sh;
            /* the master: fp32, or bf16 weights (+ Kahan's bf16 compensation) */
            b = sh->n * (d->W ? (d->w_in_place ? 0 : 2) + (d->C ? 2 : 0) : 4) + d->s_off[sh->g->nb - d->b0];
        }
#ifdef ZO_OFFLOAD_HAVE_NVME
        if (sh->tier == OFFLOAD_NVME && enc_on(&((const nvme_shard *)sh)->enc))
            b = sh->n * 4 + enc_bytes(&((const nvme_shard *)sh)->enc, sh->n);
#endif
        bytes[sh->tier] += b;
    }
}

/* ---- the step ---------------------------------------------------------------------------- */

zo_status ostate_step_enqueued(ostate *os, const oshard_update *u)
{
    zo_status st;
    for (int i = 0; i < os->n_sh; i++)
        if (os->sh[i]->enqueued && (st = os->sh[i]->ops->step(os->sh[i], u)) != ZO_OK) return st;
    return ZO_OK;
}

zo_status ostate_step_host(ostate *os, const oshard_update *u)
{
    zo_status st;
    /* (a block split between two shards is completed by the second) */
    for (int i = 0; i < os->n_sh; i++)
        if (!os->sh[i]->enqueued && (st = os->sh[i]->ops->step(os->sh[i], u)) != ZO_OK) return st;
    return ZO_OK;
}

int ostate_images(const ostate *os) { return os->n_sh; }

void ostate_image_key(const ostate *os, int i, char *key, size_t len, uint64_t *bytes)
{
    const oshard *sh = os->sh[i];
    *bytes = 0;
    key[0] = 0;
    if (sh->ops->image_key) sh->ops->image_key(sh, key, len, bytes);
}

zo_status ostate_image_io(ostate *os, int i, uint64_t off, size_t len, void *buf, int put)
{
    oshard *sh = os->sh[i];
    uint64_t bytes;
    char key[160];
    ostate_image_key(os, i, key, sizeof key, &bytes);
    if (off > bytes || len > bytes - off)
        return zo_error(ZO_ERR_INTERNAL, "offload: bytes %llu..%llu of a %llu-byte image (%s)", (unsigned long long)off,
                        (unsigned long long)(off + len), (unsigned long long)bytes, key);
    return len ? sh->ops->image_io(sh, off, len, buf, put) : ZO_OK;
}

zo_status ostate_step_block(ostate *os, int b, const oshard_update *u)
{
    const size_t *off = os->og->off;
    zo_status st;
    for (int i = 0; i < os->n_sh; i++) {
        oshard *sh = os->sh[i];
        size_t a = off[b] > sh->first ? off[b] : sh->first;
        size_t e = off[b + 1] < sh->first + sh->n ? off[b + 1] : sh->first + sh->n;
        if (!sh->enqueued && a < e && (st = sh->ops->step_range(sh, a, e - a, u)) != ZO_OK) return st;
    }
    return ZO_OK;
}

/* ---- the gradient sums ------------------------------------------------------------------- */

void ostate_grad_sum(const ostate *os, int b, oshard_sum *out)
{
    /* the host side's blocks come first (its first shard hands out the
     * array they share), the device shard's last */
    oshard *sh = os->sh[b < os->dev_block ? 0 : os->n_sh - 1];
    sh->ops->grad_sum(sh, b, out);
}

float *ostate_host_sums(const ostate *os, size_t *n)
{
    *n = os->og->off[os->dev_block];
    return os->sums.host;
}

zo_status ostate_grad_ready(ostate *os, gpu_stream_t s)
{
    zo_status st;
    for (int i = 0; i < os->n_sh; i++)
        if (os->sh[i]->ops->grad_ready && (st = os->sh[i]->ops->grad_ready(os->sh[i], s)) != ZO_OK) return st;
    return ZO_OK;
}

zo_status ostate_grad_zero(ostate *os, gpu_stream_t s)
{
    zo_status st;
    memset(os->blk_taken, 0, (size_t)os->og->nb); /* (a step's sums start: none taken yet) */
    for (int i = 0; i < os->n_sh; i++)
        if (os->sh[i]->ops->grad_zero && (st = os->sh[i]->ops->grad_zero(os->sh[i], s)) != ZO_OK) return st;
    return ZO_OK;
}

/* split_stats over the optimizer's part of host block b. */
static zo_status host_block_stats(const ostate *os, int b, double *ss, double *xs, int *nf)
{
    const ostate_sums *s = &os->sums;
    os->env->acct->grad_stats_read++;
    return split_stats(s, b, s->host + s->off[b] + s->part[b], os->og->numel[b], os->env->n_threads, ss, xs, nf);
}

zo_status ostate_grad_block_stats(ostate *os, int b, int *nonfinite)
{
    zo_status st = os->blk_taken[b] ? ZO_OK
                                     : host_block_stats(os, b, &os->blk_sumsq[b], &os->blk_xsumsq[b],
                                                        &os->blk_nonfinite[b]);
    *nonfinite = os->blk_nonfinite[b];
    return st;
}

int ostate_grad_fusable(const ostate *os, int b, size_t n, int *threads)
{
    const ostate_sums *s = &os->sums;
    *threads = os->env->n_threads; /* (host_block_stats' team) */
    return b < os->dev_block && !s->part[b] && n == os->og->numel[b] && !(s->xn && s->xn[b]);
}

void ostate_grad_block_taken(ostate *os, int b, double sumsq, int nonfinite)
{
    os->blk_sumsq[b] = sumsq;
    os->blk_xsumsq[b] = 0.0;
    os->blk_nonfinite[b] = nonfinite;
    os->blk_taken[b] = 1;
    os->env->acct->grad_stats_fused++;
}

void ostate_grad_block_changed(ostate *os, int b) { os->blk_taken[b] = 0; }

zo_status ostate_split_experts(ostate *os, int b, size_t off, size_t n)
{
    ostate_sums *s = &os->sums;
    size_t nb = (size_t)os->og->nb;
    if (!s->xn && (!(s->xoff = calloc(nb, sizeof *s->xoff)) || !(s->xn = calloc(nb, sizeof *s->xn))))
        return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    size_t lo = s->xn[b] && s->xoff[b] < off ? s->xoff[b] : off;
    size_t hi = s->xn[b] && s->xoff[b] + s->xn[b] > off + n ? s->xoff[b] + s->xn[b] : off + n;
    if (lo < s->part[b] || hi > s->part[b] + os->og->numel[b])
        return zo_error(ZO_ERR_INTERNAL, "offload_init: block %d's experts [%zu, %zu) lie outside its optimizer part",
                        b, lo, hi);
    s->xoff[b] = lo;
    s->xn[b] = hi - lo;
    return ZO_OK;
}

zo_status ostate_grad_stats(ostate *os, int taken, int exact, double *sumsq, double *xsumsq, int *first_bad)
{
    zo_status st;
    *sumsq = *xsumsq = 0.0;
    *first_bad = -1;
    for (int b = 0; b < os->dev_block; b++) {
        double ss = os->blk_sumsq[b], xs = os->blk_xsumsq[b];
        int nf = os->blk_nonfinite[b];
        if (!taken && !os->blk_taken[b] && (st = host_block_stats(os, b, &ss, &xs, &nf)) != ZO_OK) return st;
        os->blk_taken[b] = 0; /* (the next step's sums take their own) */
        *sumsq += ss;
        *xsumsq += xs;
        if (nf && *first_bad < 0) *first_bad = b;
    }
    for (int i = 0; i < os->n_sh; i++) {
        oshard *sh = os->sh[i];
        if (sh->ops->grad_stats && (st = sh->ops->grad_stats(sh, exact, sumsq, xsumsq, first_bad)) != ZO_OK)
            return st;
    }
    return ZO_OK;
}
