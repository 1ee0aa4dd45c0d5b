/* Data parallelism: the rank's part of every block, the communication
 * buckets and the runtime's collectives, counted.
 *
 * Every block is one bucket. A block of n elements is padded to
 * comm_padded_count(n, ranks) and split in equal parts; rank r's part is
 * comm_shard's. Collectives run on device memory, ordered by the device's
 * events (gpu/comm.h): NCCL on a CUDA device, MPI on the CPU device (whose
 * memory is host memory), the same code. They are issued in the same order
 * on every rank because every rank runs the same schedule: the blocks of a
 * micro-batch, then of a step, in a fixed order. */
#include "offload/dp.h"

#include <stdlib.h>
#include <string.h>

int offload_dp_partitioned(const offload_dp *dp) { return dp && dp->stage >= 1; }

size_t offload_dp_part_first(const offload_dp *dp, int b) { return offload_dp_partitioned(dp) ? dp->part_off[b] : 0; }

void offload_dp_geom(const offload_dp *dp, const offload_geom *g, offload_geom *out)
{
    *out = *g;
    if (!offload_dp_partitioned(dp)) return;
    offload_part p;
    offload_dp_part(dp, g, &p);
    offload_part_geom(&p, g, out);
}

void *offload_dp_bucket_at(const offload_dp *dp, int k, size_t i)
{
    return (char *)dp->bucket[k] + i * zo_dtype_size(dp->red);
}

zo_status offload_dp_create(const offload_env *env, const offload_geom *g, comm_t comm, int stage,
                            size_t bucket, zo_dtype red, offload_dp **out)
{
    *out = NULL;
    zo_status st;
    if (stage < 0 || stage > 3)
        return zo_error(ZO_ERR_INVALID, "offload_init: ZeRO stage %d (0, 1, 2 or 3)", stage);
    if (red != ZO_DTYPE_F32 && red != ZO_DTYPE_BF16 && red != ZO_DTYPE_F16)
        return zo_error(ZO_ERR_INVALID, "offload_init: reduce dtype %d (fp32, bf16 or fp16)", (int)red);
    /* the runtime's collectives take device memory: the CPU device's is host memory */
    if (!comm_device_buffers(comm) && strcmp(gpu_device_name(env->dev), "cpu"))
        return zo_error(ZO_ERR_UNSUPPORTED,
                        "offload_init: the %s communicator takes host buffers, the runtime's collectives "
                        "run on %s device memory: use NCCL with a CUDA device",
                        comm_backend_name(comm_get_backend(comm)), gpu_device_name(env->dev));
    offload_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    dp->comm = comm;
    dp->rank = comm_rank(comm);
    dp->size = comm_size(comm);
    dp->stage = stage;
    dp->red = red;
    dp->env = env;
    dp->nb = g->nb;
    size_t nb = (size_t)g->nb;
    dp->pad = calloc(nb, sizeof(size_t));
    dp->part_off = calloc(nb, sizeof(size_t));
    dp->part_n = calloc(nb, sizeof(size_t));
    dp->loc_off = calloc(nb + 1, sizeof(size_t));
    if (!dp->pad || !dp->part_off || !dp->part_n || !dp->loc_off) {
        st = zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
        goto out_free;
    }
    for (int b = 0; b < g->nb; b++) {
        dp->pad[b] = comm_padded_count(g->numel[b], dp->size);
        if (stage >= 1) comm_shard(g->numel[b], dp->size, dp->rank, &dp->part_off[b], &dp->part_n[b]);
        else dp->part_n[b] = g->numel[b];
        dp->loc_off[b + 1] = dp->loc_off[b] + dp->part_n[b];
        if (dp->pad[b] > dp->largest_pad) dp->largest_pad = dp->pad[b];
    }
    /* a rank holding nothing would skip the step's puts the others gather */
    if (!dp->loc_off[nb]) {
        st = zo_error(ZO_ERR_INVALID, "offload_init: rank %d of %d holds no element of the model's %zu: "
                      "too few for ZeRO-%d over %d ranks", dp->rank, dp->size, g->n, stage, dp->size);
        goto out_free;
    }
    /* the buckets: a piece of every rank's part, at most the largest block */
    size_t cap = bucket ? bucket : OFFLOAD_DEFAULT_BUCKET;
    dp->bucket_q = cap / (size_t)dp->size;
    if (!dp->bucket_q) dp->bucket_q = 1;
    if (dp->bucket_q * (size_t)dp->size > dp->largest_pad) dp->bucket_q = dp->largest_pad / (size_t)dp->size;
    /* in the reduce dtype, rounded up to whole fp32 words per rank (a
     * gather of master weights goes through bucket 0 as words) */
    size_t word_row = 4 * (size_t)dp->size;
    size_t bb = (dp->bucket_q * (size_t)dp->size * zo_dtype_size(red) + word_row - 1) / word_row * word_row;
    dp->bucket_words = bb / word_row;
    for (int k = 0; k < 2; k++) {
        if ((st = gpu_mem_alloc(env->dev, bb, &dp->bucket[k])) != ZO_OK) {
            st = zo_error_wrap(st, "offload_init: communication bucket %d of 2 (%zu bytes)", k + 1, bb);
            goto out_free;
        }
        if ((st = gpu_event_create(env->dev, &dp->bucket_ev[k])) != ZO_OK) goto out_free;
    }
    if ((st = gpu_mem_alloc(env->dev, (size_t)dp->size * OFFLOAD_GATHER_MAX, &dp->small)) != ZO_OK) {
        st = zo_error_wrap(st, "offload_init: gather buffer");
        goto out_free;
    }
    if ((st = gpu_event_create(env->dev, &dp->ev_in)) != ZO_OK ||
        (st = gpu_event_create(env->dev, &dp->ev_in_s)) != ZO_OK ||
        (st = gpu_event_create(env->dev, &dp->ev_out)) != ZO_OK)
        goto out_free;
    *out = dp;
    return ZO_OK;

out_free:
    offload_dp_free(dp);
    return st;
}

void offload_dp_free(offload_dp *dp)
{
    if (!dp) return;
    offload_dp_wait(dp);
    for (int k = 0; k < 2; k++) {
        gpu_mem_free(dp->env->dev, dp->bucket[k]);
        if (dp->bucket_ev[k]) gpu_event_destroy(dp->bucket_ev[k]);
    }
    gpu_mem_free(dp->env->dev, dp->small);
    if (dp->ev_in) gpu_event_destroy(dp->ev_in);
    if (dp->ev_in_s) gpu_event_destroy(dp->ev_in_s);
    if (dp->ev_out) gpu_event_destroy(dp->ev_out);
    free(dp->req);
    free(dp->pad);
    free(dp->part_off);
    free(dp->part_n);
    free(dp->loc_off);
    free(dp->xlo);
    free(dp->xhi);
    free(dp->seg);
    free(dp->nseg);
    free(dp);
}

static zo_status collective(offload_dp *dp, dp_op op, size_t count, size_t real, void *buf, zo_dtype dt,
                            gpu_event_t after, gpu_event_t done, int frozen);

/* ---- partitions ------------------------------------------------------------------- */

void offload_dp_part(const offload_dp *dp, const offload_geom *g, offload_part *out)
{
    *out = (offload_part){.nb = dp->nb, .pad = dp->pad, .part_off = dp->part_off, .part_n = dp->part_n,
                          .loc_off = dp->loc_off, .largest_pad = dp->largest_pad, .wire = g->dtype, .per_wire = 1,
                          .seg = dp->seg, .nseg = dp->nseg};
}

zo_status offload_dp_part_bytes(const offload_dp *dp, int nb, const size_t *bytes, offload_part *out)
{
    size_t n = (size_t)nb, unit = 4 * (size_t)dp->size;
    size_t *a = calloc(4 * n + 1, sizeof(size_t));
    if (!a) return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    size_t *pad = a, *off = a + n, *pn = a + 2 * n, *loc = a + 3 * n;
    *out = (offload_part){.nb = nb, .pad = pad, .part_off = off, .part_n = pn, .loc_off = loc,
                          .wire = ZO_DTYPE_F32, .per_wire = 4, .frozen = 1, .own = a};
    for (int b = 0; b < nb; b++) {
        pad[b] = (bytes[b] + unit - 1) / unit * unit;
        size_t part = pad[b] / (size_t)dp->size;
        off[b] = (size_t)dp->rank * part;
        pn[b] = bytes[b] > off[b] ? (bytes[b] - off[b] < part ? bytes[b] - off[b] : part) : 0;
        loc[b + 1] = loc[b] + pn[b];
        if (pad[b] > out->largest_pad) out->largest_pad = pad[b];
    }
    return ZO_OK;
}

void offload_dp_part_free(offload_part *p)
{
    if (!p || !p->own) return; /* (a view: the arrays are another's) */
    free(p->own);
    free(p->seg);
    free(p->nseg);
}

void offload_part_geom(const offload_part *p, const offload_geom *g, offload_geom *out)
{
    *out = *g;
    out->numel = p->part_n;
    out->off = p->loc_off;
    out->n = p->loc_off[g->nb];
    out->largest = 0;
    for (int b = 0; b < g->nb; b++)
        if (p->part_n[b] > out->largest) out->largest = p->part_n[b];
    out->slot_bytes = out->largest * out->es;
    if (out->slot_bytes < 256) out->slot_bytes = 256;
}

zo_status offload_dp_part_gather(offload_dp *dp, const offload_part *p, int b, size_t numel, void *buf,
                                 gpu_event_t after, gpu_event_t done)
{
    size_t count = p->pad[b] / (size_t)dp->size / p->per_wire;
    zo_status st = collective(dp, DP_ALL_GATHER, count, p->frozen ? numel : numel / p->per_wire, buf, p->wire,
                              after, done, p->frozen);
    if (st != ZO_OK) return zo_error_wrap(st, "offload: all-gather of block %d%s", b, p->frozen ? "'s frozen base" : "");
    return ZO_OK;
}

/* ---- collectives ------------------------------------------------------------------ */

/* Completed requests at the head of the queue are freed (they complete in
 * issue order). */
static void reap(offload_dp *dp)
{
    while (dp->head < dp->n_req && comm_test(dp->req[dp->head])) {
        comm_wait(dp->req[dp->head]);
        dp->req[dp->head++] = NULL;
    }
    if (dp->head == dp->n_req) dp->head = dp->n_req = 0;
}

static zo_status push(offload_dp *dp, comm_request_t r)
{
    if (dp->n_req == dp->cap_req) {
        if (dp->head) { /* slide the live ones down */
            memmove(dp->req, dp->req + dp->head, (dp->n_req - dp->head) * sizeof *dp->req);
            dp->n_req -= dp->head;
            dp->head = 0;
        }
        if (dp->n_req == dp->cap_req) {
            size_t cap = dp->cap_req ? 2 * dp->cap_req : 64;
            comm_request_t *q = realloc(dp->req, cap * sizeof *q);
            if (!q) {
                comm_wait(r);
                return zo_error(ZO_ERR_NOMEM, "offload: out of host memory (collective requests)");
            }
            dp->req = q;
            dp->cap_req = cap;
        }
    }
    dp->req[dp->n_req++] = r;
    return ZO_OK;
}

/* A collective, counted: in model elements (`real` of them the model's),
 * or, for a frozen base, `real` bytes apart. */
static zo_status collective_on(offload_dp *dp, comm_t c, dp_op op, size_t count, size_t real, void *buf,
                               zo_dtype dt, gpu_event_t after, gpu_event_t done, int frozen)
{
    offload_acct *a = dp->env->acct;
    comm_order ord = {.after = after, .done = done};
    comm_request_t r = NULL;
    size_t es = zo_dtype_size(dt), size = (size_t)comm_size(c);
    char *mine = (char *)buf + (size_t)comm_rank(c) * count * es;
    uint64_t elems0 = a->comm_elems, pad0 = a->comm_pad_elems;
    zo_status st;
    reap(dp);
    switch (op) {
    case DP_ALL_REDUCE:
        st = comm_all_reduce(c, buf, buf, count, dt, &ord, &r);
        a->comm_elems += 2 * real;
        a->comm_pad_elems += 2 * (count - real);
        break;
    case DP_REDUCE_SCATTER:
        st = comm_reduce_scatter(c, buf, mine, count, dt, &ord, &r);
        a->comm_elems += real;
        a->comm_pad_elems += count * size - real;
        break;
    default:
        st = comm_all_gather(c, mine, buf, count, dt, &ord, &r);
        a->comm_elems += real;
        a->comm_pad_elems += count * size - real;
        break;
    }
    if (st != ZO_OK) return st;
    if (frozen) { /* bytes, apart from the model elements the paper counts */
        a->comm_elems = elems0;
        a->comm_pad_elems = pad0;
        a->comm_frozen_bytes += real;
    }
    a->comm_calls++;
    return push(dp, r);
}

static zo_status collective(offload_dp *dp, dp_op op, size_t count, size_t real, void *buf, zo_dtype dt,
                            gpu_event_t after, gpu_event_t done, int frozen)
{
    return collective_on(dp, dp->comm, op, count, real, buf, dt, after, done, frozen);
}

zo_status offload_dp_all_reduce_experts(offload_dp *dp, size_t count, void *buf, zo_dtype dt, gpu_event_t after,
                                        gpu_event_t done)
{
    return collective_on(dp, dp->xcomm, DP_ALL_REDUCE, count, count, buf, dt, after, done, 0);
}

static int segments(size_t n, size_t xlo, size_t xhi, int world, int rank, int xsize, int xrank, size_t unit,
                    offload_seg seg[3]);

/* The blocks with experts ([lo[b], hi[b]) of n[b] elements, hi > lo) laid
 * in segments of `unit`-element shares (offload_dp_segments): their parts
 * start at the block's (part_off 0) and run the segments' length; loc_off
 * follows every block's part. */
static void lay_segments(const offload_dp *dp, size_t nb, const size_t *n, const size_t *lo, const size_t *hi,
                         size_t unit, offload_seg (*seg)[3], int *nseg, size_t *part_off, size_t *part_n,
                         size_t *loc_off)
{
    for (size_t b = 0; b < nb; b++) {
        if (hi[b] > lo[b]) {
            nseg[b] = segments(n[b], lo[b], hi[b], dp->size, dp->rank, dp->xsize, dp->xrank, unit, seg[b]);
            const offload_seg *g = &seg[b][nseg[b] - 1];
            part_off[b] = 0;
            part_n[b] = g->loc + g->own_n;
        }
        loc_off[b + 1] = loc_off[b] + part_n[b];
    }
}

zo_status offload_dp_set_experts(offload_dp *dp, comm_t xcomm, const size_t *numel, const size_t *lo,
                                 const size_t *hi)
{
    size_t nb = (size_t)dp->nb;
    if (!(dp->xlo = malloc(nb * sizeof *dp->xlo)) || !(dp->xhi = malloc(nb * sizeof *dp->xhi)))
        return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    memcpy(dp->xlo, lo, nb * sizeof *lo);
    memcpy(dp->xhi, hi, nb * sizeof *hi);
    dp->ep = 1;
    dp->xcomm = xcomm && comm_size(xcomm) > 1 ? xcomm : NULL;
    if (!dp->stage) return ZO_OK;
    /* ZeRO 1-3: a block with experts partitioned in segments */
    dp->xcomm_part = xcomm;
    dp->xrank = xcomm ? comm_rank(xcomm) : 0;
    dp->xsize = xcomm ? comm_size(xcomm) : 1;
    if (!xcomm)
        return zo_error(ZO_ERR_INVALID, "offload_init: expert parallelism at ZeRO-%d without expert_comm", dp->stage);
    if (!(dp->seg = calloc(nb, sizeof *dp->seg)) || !(dp->nseg = calloc(nb, sizeof *dp->nseg)))
        return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    lay_segments(dp, nb, numel, lo, hi, 1, dp->seg, dp->nseg, dp->part_off, dp->part_n, dp->loc_off);
    return ZO_OK;
}

int offload_dp_segmented(const offload_dp *dp, int b) { return dp && dp->nseg && dp->nseg[b]; }

size_t offload_dp_part_at(const offload_dp *dp, int b, size_t rel, size_t *run)
{
    if (offload_dp_segmented(dp, b)) return offload_seg_at(dp->seg[b], dp->nseg[b], rel, run);
    if (!offload_dp_partitioned(dp)) {
        *run = (size_t)-1 - rel;
        return rel;
    }
    *run = dp->part_n[b] > rel ? dp->part_n[b] - rel : 0;
    return dp->part_off[b] + rel;
}

/* The segments of block b: its own, or the whole block as one (numel
 * elements, the rank's part at part_off). */
static int segs_of(const offload_dp *dp, int b, size_t numel, offload_seg *one, const offload_seg **out)
{
    if (offload_dp_segmented(dp, b)) {
        *out = dp->seg[b];
        return dp->nseg[b];
    }
    *one = (offload_seg){.lo = 0, .n = numel, .pad = dp->pad[b], .own_off = dp->part_off[b],
                         .own_n = dp->part_n[b]};
    *out = one;
    return 1;
}

static int seg_size(const offload_dp *dp, const offload_seg *g) { return g->expert ? dp->xsize : dp->size; }

/* The pieces of segments g[0..ns) (offload_dp_pieces). */
static size_t pieces_in(const offload_dp *dp, const offload_seg *g, int ns, size_t qcap)
{
    size_t n = 0;
    for (int k = 0; k < ns; k++) {
        size_t c = g[k].pad / (size_t)seg_size(dp, &g[k]);
        n += (c + qcap - 1) / qcap;
    }
    return n;
}

size_t offload_dp_pieces(const offload_dp *dp, int b, size_t qcap)
{
    offload_seg one;
    const offload_seg *g;
    int ns = segs_of(dp, b, 0, &one, &g);
    return pieces_in(dp, g, ns, qcap);
}

size_t offload_piece_src(const offload_piece *p, int r, size_t *n)
{
    size_t at = (size_t)r * p->c + p->first;
    *n = at >= p->n ? 0 : (p->n - at < p->q ? p->n - at : p->q);
    return p->lo + at;
}

/* Piece j of segments g[0..ns) (offload_dp_piece). */
static void piece_in(const offload_dp *dp, const offload_seg *g, int ns, size_t j, size_t qcap, offload_piece *p)
{
    int k = 0;
    for (;; k++) {
        size_t c = g[k].pad / (size_t)seg_size(dp, &g[k]), np = (c + qcap - 1) / qcap;
        if (j < np || k + 1 == ns) break;
        j -= np;
    }
    const offload_seg *s = &g[k];
    p->comm = s->expert ? dp->xcomm_part : dp->comm;
    p->rank = s->expert ? dp->xrank : dp->rank;
    p->size = seg_size(dp, s);
    p->lo = s->lo;
    p->n = s->n;
    p->c = s->pad / (size_t)p->size;
    p->first = j * qcap;
    p->q = p->c - p->first < qcap ? p->c - p->first : qcap;
    p->real = 0;
    for (int r = 0; r < p->size; r++) {
        size_t n;
        offload_piece_src(p, r, &n);
        p->real += n;
    }
    p->loc = s->loc + p->first;
    p->mine = p->first >= s->own_n ? 0 : (s->own_n - p->first < p->q ? s->own_n - p->first : p->q);
}

void offload_dp_piece(const offload_dp *dp, int b, size_t numel, size_t j, size_t qcap, offload_piece *p)
{
    offload_seg one;
    const offload_seg *g;
    int ns = segs_of(dp, b, numel, &one, &g);
    piece_in(dp, g, ns, j, qcap, p);
}

zo_status offload_dp_piece_collective(offload_dp *dp, dp_op op, const offload_piece *p, void *buf, zo_dtype dt,
                                      gpu_event_t after, gpu_event_t done)
{
    return collective_on(dp, p->comm, op, p->q, p->real, buf, dt, after, done, 0);
}

/* offload_dp_segments with each rank's share a multiple of `unit` (a
 * frozen base's bytes: 4, whole fp32 words). */
static int segments(size_t n, size_t xlo, size_t xhi, int world, int rank, int xsize, int xrank, size_t unit,
                    offload_seg seg[3])
{
    const size_t lo[3] = {0, xlo, xhi}, hi[3] = {xlo, xhi, n};
    int ns = 0;
    size_t loc = 0;
    for (int k = 0; k < 3; k++) {
        if (hi[k] <= lo[k]) continue;
        offload_seg *s = &seg[ns++];
        int size = k == 1 ? xsize : world, r = k == 1 ? xrank : rank;
        s->lo = lo[k];
        s->n = hi[k] - lo[k];
        s->expert = k == 1;
        /* (unit 1: comm_padded_count and comm_shard) */
        size_t u = unit * (size_t)size;
        s->pad = (s->n + u - 1) / u * u;
        size_t c = s->pad / (size_t)size;
        s->own_off = (size_t)r * c;
        s->own_n = s->own_off >= s->n ? 0 : (s->n - s->own_off < c ? s->n - s->own_off : c);
        s->loc = loc;
        loc += s->own_n;
    }
    return ns;
}

int offload_dp_segments(size_t n, size_t xlo, size_t xhi, int world, int rank, int xsize, int xrank,
                        offload_seg seg[3])
{
    return segments(n, xlo, xhi, world, rank, xsize, xrank, 1, seg);
}

zo_status offload_dp_part_bytes_experts(const offload_dp *dp, const size_t *bytes, const size_t *xlo,
                                        const size_t *xhi, offload_part *p)
{
    size_t nb = (size_t)p->nb, *pad = p->own, *off = pad + nb, *pn = pad + 2 * nb, *loc = pad + 3 * nb;
    for (size_t b = 0; b < nb; b++)
        if (xlo[b] > xhi[b] || xhi[b] > bytes[b])
            return zo_error(ZO_ERR_INVALID, "offload_init: block %zu: offload_model.frozen_expert_lo/hi [%zu, %zu) "
                            "outside its %zu bytes", b, xlo[b], xhi[b], bytes[b]);
    if (!p->own || !dp->xcomm_part)
        return zo_error(ZO_ERR_INTERNAL, "offload_init: a frozen base's expert segments without its own partition "
                        "or expert_comm");
    if (!(p->seg = calloc(nb, sizeof *p->seg)) || !(p->nseg = calloc(nb, sizeof *p->nseg)))
        return zo_error(ZO_ERR_NOMEM, "offload_init: out of host memory");
    lay_segments(dp, nb, bytes, xlo, xhi, 4, p->seg, p->nseg, off, pn, loc);
    p->largest_pad = 0;
    for (size_t b = 0; b < nb; b++) {
        if (p->nseg[b]) pad[b] = (bytes[b] + 3) / 4 * 4; /* (gathered through a bucket: the slot holds the block) */
        if (pad[b] > p->largest_pad) p->largest_pad = pad[b];
    }
    return ZO_OK;
}

int offload_part_segmented(const offload_part *p, int b) { return p && p->nseg && p->nseg[b]; }

size_t offload_part_at(const offload_part *p, int b, size_t rel, size_t *run)
{
    if (offload_part_segmented(p, b)) return offload_seg_at(p->seg[b], p->nseg[b], rel, run);
    *run = p->part_n[b] > rel ? p->part_n[b] - rel : 0;
    return p->part_off[b] + rel;
}

size_t offload_seg_at(const offload_seg *seg, int ns, size_t rel, size_t *run)
{
    int k = 0;
    while (k + 1 < ns && rel >= seg[k].loc + seg[k].own_n) k++;
    size_t in = rel - seg[k].loc;
    *run = seg[k].own_n - in;
    return seg[k].lo + seg[k].own_off + in;
}

zo_status offload_dp_collective(offload_dp *dp, dp_op op, size_t count, size_t real, void *buf, zo_dtype dt,
                                gpu_event_t after, gpu_event_t done)
{
    return collective(dp, op, count, real, buf, dt, after, done, 0);
}

zo_status offload_dp_block(offload_dp *dp, dp_op op, int b, size_t numel, void *buf, zo_dtype dt,
                           gpu_event_t after, gpu_event_t done)
{
    size_t count = op == DP_ALL_REDUCE ? numel : dp->pad[b] / (size_t)dp->size;
    zo_status st = offload_dp_collective(dp, op, count, numel, buf, dt, after, done);
    if (st != ZO_OK) return zo_error_wrap(st, "offload: collective on block %d", b);
    return ZO_OK;
}

zo_status offload_dp_wait(offload_dp *dp)
{
    zo_status st = ZO_OK;
    if (!dp) return ZO_OK;
    offload_timer t0 = offload_time_begin();
    for (; dp->head < dp->n_req; dp->head++) {
        zo_status sw = comm_wait(dp->req[dp->head]);
        dp->req[dp->head] = NULL;
        if (st == ZO_OK) st = sw;
    }
    dp->head = dp->n_req = 0;
    offload_time_end(dp->env->acct, OFFLOAD_TIME_COMM, t0);
    return st;
}

/* ---- blocking gathers of host values ------------------------------------------------- */

zo_status offload_dp_gather_part(offload_dp *dp, const offload_part *p, int b, size_t numel, size_t es,
                                 const void *part, void *all)
{
    const offload_env *env = dp->env;
    char *buf = (char *)dp->bucket[0];
    size_t c = p->pad[b] / (size_t)dp->size * es; /* bytes of a rank's part */
    size_t cw = c / 4, qw = dp->bucket_words, whole = numel * es;
    zo_status st;
    /* piece by piece through bucket 0 (qw words of every rank's part): the
     * rank's piece in, every rank's gathered, each copied to its place in
     * the whole block */
    for (size_t first = 0; first < cw; first += qw) {
        size_t q = cw - first < qw ? cw - first : qw, lo = first * 4, real = 0;
        /* the bucket's last piece has left (the host waited for it) */
        if ((st = offload_dp_wait(dp)) != ZO_OK || (st = gpu_stream_synchronize(env->d2h)) != ZO_OK) return st;
        size_t mine = p->part_n[b] * es, n = mine > lo ? (mine - lo < q * 4 ? mine - lo : q * 4) : 0;
        if (n && (st = gpu_memcpy_async(env->h2d, buf + (size_t)dp->rank * q * 4, (const char *)part + lo, n,
                                        GPU_COPY_HOST_TO_DEVICE)) != ZO_OK)
            return st;
        for (int r = 0; r < dp->size; r++) {
            size_t at = (size_t)r * c + lo;
            real += at < whole ? (whole - at < q * 4 ? whole - at : q * 4) : 0;
        }
        if ((st = gpu_event_record(dp->ev_in, env->h2d)) != ZO_OK ||
            (st = collective(dp, DP_ALL_GATHER, q, p->frozen ? real : real / es, buf, ZO_DTYPE_F32, dp->ev_in,
                             dp->ev_out, p->frozen)) != ZO_OK ||
            (st = gpu_stream_wait_event(env->d2h, dp->ev_out)) != ZO_OK)
            return st;
        for (int r = 0; r < dp->size; r++) {
            size_t at = (size_t)r * c + lo;
            size_t nr = at < whole ? (whole - at < q * 4 ? whole - at : q * 4) : 0;
            if (nr && (st = gpu_memcpy_async(env->d2h, (char *)all + at, buf + (size_t)r * q * 4, nr,
                                             GPU_COPY_DEVICE_TO_HOST)) != ZO_OK)
                return st;
        }
    }
    if ((st = offload_dp_wait(dp)) != ZO_OK) return st;
    return gpu_stream_synchronize(env->d2h);
}

/* Keep the rank's first device failure `dev` in *local, said as `what`. */
static void keep_local(zo_status dev, zo_status *local, const char *what)
{
    if (dev != ZO_OK && *local == ZO_OK) *local = zo_error_wrap(dev, "%s", what);
}

/* Piece p of es-byte elements (the wire's are `per` of them; frozen: a
 * frozen base's bytes) all-gathered in bucket 0 on its communicator: the
 * rank's p->mine elements from `from` in (in_kind), once the bucket's last
 * piece has left (the host waits for it); the d2h stream waits for the
 * gather. Returns the group's status (the gathers'); a failure of this
 * rank's device work goes to *local instead (its first), and the rank
 * still takes part in the gather, its share whatever the bucket holds:
 * the others, inside the gather, are not left waiting for it. */
static zo_status piece_gather(offload_dp *dp, const offload_piece *p, size_t es, size_t per, int frozen,
                              const void *from, gpu_copy_kind in_kind, zo_status *local)
{
    const offload_env *env = dp->env;
    char *buf = (char *)dp->bucket[0];
    zo_dtype wire = es * per == 4 ? ZO_DTYPE_F32 : ZO_DTYPE_BF16; /* (an all-gather moves bytes) */
    zo_status st;
    if ((st = offload_dp_wait(dp)) != ZO_OK) return st;
    /* after its first failure the rank only takes part (its device calls
     * would fail again and overwrite the message the ranks agree on) */
    zo_status dev = *local == ZO_OK ? gpu_stream_synchronize(env->d2h) : *local;
    if (dev == ZO_OK && p->mine)
        dev = gpu_memcpy_async(env->h2d, buf + (size_t)p->rank * p->q * es, from, p->mine * es, in_kind);
    if (dev == ZO_OK) dev = gpu_event_record(dp->ev_in, env->h2d);
    keep_local(dev, local, "offload: this rank's share of an all-gather's piece");
    if ((st = collective_on(dp, p->comm, DP_ALL_GATHER, p->q / per, p->real, buf, wire,
                            dev == ZO_OK ? dp->ev_in : NULL, dp->ev_out, frozen)) != ZO_OK)
        return st;
    if (*local == ZO_OK)
        keep_local(gpu_stream_wait_event(env->d2h, dp->ev_out), local, "offload: an all-gather's piece");
    return ZO_OK;
}

zo_status offload_dp_gather_piece(offload_dp *dp, const offload_piece *p, const float *mine, float *all,
                                  zo_status *local)
{
    const offload_env *env = dp->env;
    zo_status st;
    if (p->q > dp->bucket_words)
        return zo_error(ZO_ERR_INTERNAL, "offload: a piece of %zu elements a rank (at most %zu)", p->q,
                        dp->bucket_words);
    if ((st = piece_gather(dp, p, sizeof(float), 1, 0, mine, GPU_COPY_HOST_TO_DEVICE, local)) != ZO_OK)
        return zo_error_wrap(st, "offload: all-gather of a piece");
    zo_status dev = *local == ZO_OK ? gpu_memcpy_async(env->d2h, all, dp->bucket[0],
                                                       (size_t)p->size * p->q * sizeof(float),
                                                       GPU_COPY_DEVICE_TO_HOST)
                                    : *local;
    if ((st = offload_dp_wait(dp)) != ZO_OK) return zo_error_wrap(st, "offload: all-gather of a piece");
    if (dev == ZO_OK) dev = gpu_stream_synchronize(env->d2h);
    keep_local(dev, local, "offload: an all-gather's piece out");
    return ZO_OK;
}

/* Block b in segments g[0..ns) of es-byte elements gathered, as
 * offload_dp_gather_segs; the wire's elements are `per` of them (a frozen
 * base: bytes, 4 a word, counted as frozen bytes). */
static zo_status gather_segs(offload_dp *dp, int b, const offload_seg *g, int ns, size_t es, size_t per, int frozen,
                             const void *part, int part_local, gpu_copy_kind in_kind, void *all,
                             gpu_copy_kind out_kind)
{
    const offload_env *env = dp->env;
    char *buf = (char *)dp->bucket[0];
    size_t qcap = dp->bucket_words * 4 / es;
    zo_status st;
    if (es * per != 4 && es * per != 2)
        return zo_error(ZO_ERR_INTERNAL, "offload: a gather of %zu-byte elements", es * per);
    /* piece by piece through bucket 0: the rank's share in, every rank's
     * gathered on the segment's communicator, each copied to its place */
    for (size_t j = 0; j < pieces_in(dp, g, ns, qcap); j++) {
        offload_piece p;
        piece_in(dp, g, ns, j, qcap, &p);
        size_t n, own = offload_piece_src(&p, p.rank, &n);
        const char *from = (const char *)part + (part_local ? p.loc : own) * es;
        zo_status dev = ZO_OK; /* (this rank's own failure ends the block here, as the gathers' do) */
        if ((st = piece_gather(dp, &p, es, per, frozen, from, in_kind, &dev)) != ZO_OK || (st = dev) != ZO_OK)
            return zo_error_wrap(st, "offload: all-gather of block %d%s", b, frozen ? "'s frozen base" : "");
        for (int r = 0; r < p.size; r++) {
            size_t at = offload_piece_src(&p, r, &n);
            if (n && (st = gpu_memcpy_async(env->d2h, (char *)all + at * es, buf + (size_t)r * p.q * es, n * es,
                                             out_kind)) != ZO_OK)
                return st;
        }
    }
    if ((st = offload_dp_wait(dp)) != ZO_OK) return st;
    return gpu_stream_synchronize(env->d2h);
}

zo_status offload_dp_gather_segs(offload_dp *dp, int b, size_t numel, size_t es, const void *part, int part_local,
                                 gpu_copy_kind in_kind, void *all, gpu_copy_kind out_kind)
{
    offload_seg one;
    const offload_seg *g;
    int ns = segs_of(dp, b, numel, &one, &g);
    return gather_segs(dp, b, g, ns, es, 1, 0, part, part_local, in_kind, all, out_kind);
}

zo_status offload_dp_gather_part_segs(offload_dp *dp, const offload_part *p, int b, size_t es, const void *part,
                                      gpu_copy_kind in_kind, void *all, gpu_copy_kind out_kind)
{
    return gather_segs(dp, b, p->seg[b], p->nseg[b], es, p->per_wire, p->frozen, part, 1, in_kind, all, out_kind);
}

zo_status offload_dp_gather_block(offload_dp *dp, int b, size_t numel, const float *part, float *all)
{
    if (offload_dp_segmented(dp, b))
        return offload_dp_gather_segs(dp, b, numel, sizeof(float), part, 1, GPU_COPY_HOST_TO_DEVICE, all,
                                      GPU_COPY_DEVICE_TO_HOST);
    offload_part p = {.nb = dp->nb, .pad = dp->pad, .part_off = dp->part_off, .part_n = dp->part_n,
                      .loc_off = dp->loc_off, .largest_pad = dp->largest_pad, .wire = ZO_DTYPE_F32, .per_wire = 1};
    return offload_dp_gather_part(dp, &p, b, numel, sizeof(float), part, all);
}

zo_status offload_dp_gather(offload_dp *dp, const void *mine, size_t bytes, void *all)
{
    return offload_dp_gather_on(dp, dp->comm, mine, bytes, all);
}

zo_status offload_dp_gather_on(offload_dp *dp, comm_t c, const void *mine, size_t bytes, void *all)
{
    const offload_env *env = dp->env;
    const int rank = comm_rank(c), size = comm_size(c);
    if (bytes > OFFLOAD_GATHER_MAX)
        return zo_error(ZO_ERR_INVALID, "offload_gather: %zu bytes (at most %d)", bytes, OFFLOAD_GATHER_MAX);
    size_t words = (bytes + 3) / 4, stride = words * 4;
    char *buf = dp->small;
    comm_order ord = {.after = dp->ev_in};
    zo_status st;
    if (!bytes) return ZO_OK;
    if ((st = gpu_memcpy_async(env->h2d, buf + (size_t)rank * stride, mine, bytes,
                               GPU_COPY_HOST_TO_DEVICE)) != ZO_OK ||
        (st = gpu_event_record(dp->ev_in, env->h2d)) != ZO_OK)
        return st;
    offload_timer t0 = offload_time_begin();
    st = comm_all_gather(c, buf + (size_t)rank * stride, buf, words, ZO_DTYPE_F32, &ord, NULL);
    offload_time_end(dp->env->acct, OFFLOAD_TIME_COMM, t0);
    if (st != ZO_OK) return zo_error_wrap(st, "offload_gather");
    for (int r = 0; r < size; r++)
        if ((st = gpu_memcpy_async(env->d2h, (char *)all + (size_t)r * bytes, buf + (size_t)r * stride, bytes,
                                   GPU_COPY_DEVICE_TO_HOST)) != ZO_OK)
            return st;
    return gpu_stream_synchronize(env->d2h);
}
