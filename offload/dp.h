/* Data parallelism (dp.c), above the accounting: the partition of every
 * block over the ranks, the communication buckets and the runtime's
 * collectives, counted. */
#ifndef ZO_OFFLOAD_DP_H
#define ZO_OFFLOAD_DP_H

#include "offload/acct.h" /* defines: offload_env, offload_geom */

#define OFFLOAD_DEFAULT_BUCKET 25000000u /* elements (memplan's comm.bucket) */

/* Expert parallelism at ZeRO 1-3: the partition of one MoE block
 * (docs/architecture.md, "ZeRO with expert parallelism"). The block of n
 * elements, its routed experts at [xlo, xhi), is up to three segments, in
 * block order: the dense elements before the experts and those after them,
 * each partitioned over the world's `world` ranks, and the experts,
 * partitioned over the `xsize` ranks holding the same ones (expert_comm).
 * Each segment is padded to a multiple of its communicator's size and split
 * as comm_shard splits a block; the rank's part of the block is its parts
 * of the segments, one after the other (offload_dp_set_experts at ZeRO
 * 1-3). */
typedef struct offload_seg {
    size_t lo, n;          /* elements [lo, lo + n) of the block */
    int expert;            /* 1: over expert_comm (its rank xrank); 0: over the world (rank) */
    size_t pad;            /* n padded: comm_padded_count(n, the communicator's size) */
    size_t own_off, own_n; /* the rank's part: elements [lo + own_off, lo + own_off + own_n) */
    size_t loc;            /* where that part starts in the rank's part of the block */
} offload_seg;

/* The partition: every block is one bucket, padded to a multiple of the
 * rank count and split in equal parts (comm_padded_count, comm_shard); rank
 * r's part of block b is elements [part_off[b], part_off[b] + part_n[b]).
 * With ZeRO 1-3 the optimizer state, the gradient sums it reads and (ZeRO
 * 3) the 16-bit weights of a rank are its parts: the rank's geometry has
 * block b of part_n[b] elements. Stage 0 partitions nothing (its part is
 * the whole block). A block whose part is in segments (nseg[b]) has
 * part_off[b] 0: a whole block's buffer (ZeRO-1's sums) holds the part
 * from its start; offload_dp_part_at maps the part onto the block. */
struct offload_dp {
    comm_t comm;
    int rank, size, stage;
    const offload_env *env;
    int nb;
    size_t *pad;           /* [nb] block b padded: comm_padded_count(numel, size) */
    size_t *part_off;      /* [nb] the rank's part of block b: first element */
    size_t *part_n;        /* [nb] ... and its elements (possibly 0) */
    size_t *loc_off;       /* [nb + 1] the rank's geometry: flat offsets of the parts */
    size_t largest_pad;    /* the largest padded block */
    /* two buckets of bucket_q x size elements of the reduce dtype on the
     * device: a piece of a block's gradient while a collective runs on it
     * (or, as fp32 words, of master weights being gathered). A block whose
     * part is longer than bucket_q goes in pieces: piece j holds elements
     * [j q, j q + q) of every rank's part, rank after rank
     * (offload_dp_piece), so that a reduce-scatter of the piece leaves each
     * rank a piece of its own part. */
    void *bucket[2];
    zo_dtype red;          /* the gradients' reduce dtype: the buckets' elements */
    size_t bucket_q;       /* elements of a rank's part per piece */
    size_t bucket_words;   /* fp32 words of a rank's part per piece (offload_dp_gather_part) */
    gpu_event_t bucket_ev[2]; /* the bucket's last use is done (its stream's record) */
    void *small;           /* device [size * OFFLOAD_GATHER_MAX]: offload_gather */
    /* a collective's `after` recorded on the h2d stream (ev_in) or on the
     * compute stream (ev_in_s), and its `done` (on the communicator's
     * stream). One event is recorded on one stream only: a record on one
     * stream may complete before an earlier one on another, and the CPU
     * backend then releases the earlier record's waiters too (it keeps the
     * highest record completed) */
    gpu_event_t ev_in, ev_in_s, ev_out;
    /* expert parallelism (offload_dp_set_experts): block b's routed experts,
     * elements [xlo[b], xhi[b]), are this rank's own; at ZeRO-0 they are
     * all-reduced over xcomm (the ranks holding the same experts; NULL:
     * none other does, nothing to reduce), the rest of the block over comm */
    int ep;
    comm_t xcomm;
    size_t *xlo, *xhi;     /* [nb] */
    /* ... and at ZeRO 1-3 the partition of a block with experts in
     * segments (nseg[b] of them; 0: the block is one part, part_off's):
     * the dense ones over comm, the experts over xcomm_part (expert_comm,
     * of any size; its rank xrank) */
    offload_seg (*seg)[3]; /* [nb] */
    int *nseg;             /* [nb] */
    comm_t xcomm_part;
    int xrank, xsize;
    /* collectives in flight, oldest first (they complete in issue order) */
    comm_request_t *req;
    size_t n_req, head, cap_req;
};

/* A partition of some blocks over the ranks, as a gathering store (ZeRO-3)
 * takes it: block b is padded to pad[b] elements, rank r's part starts at
 * r pad[b] / ranks, and part_n[b] of its elements are real (the rest
 * padding); loc_off[b] is where the rank's part of block b starts in the
 * rank's geometry. The trainable weights' is the data-parallel partition
 * itself (offload_dp_part); a frozen base's is of bytes, padded to whole
 * fp32 words per rank (offload_dp_part_bytes). */
typedef struct offload_part {
    int nb;
    const size_t *pad, *part_off, *part_n, *loc_off; /* [nb], [nb], [nb], [nb + 1] */
    size_t largest_pad;
    zo_dtype wire;         /* the all-gather's element: the weights' dtype, or fp32 words of bytes */
    size_t per_wire;       /* the blocks' elements per wire element (1; 4 bytes a word) */
    int frozen;            /* a frozen base: counted apart (offload_acct.comm_frozen_bytes) */
    size_t *own;           /* the arrays, when the partition owns them (free with offload_dp_part_free) */
    /* a frozen base with expert parallelism (offload_dp_part_bytes_experts):
     * block b's part in nseg[b] segments of bytes (0: one run at part_off) */
    offload_seg (*seg)[3];
    int *nseg;
} offload_part;

typedef enum dp_op {
    DP_ALL_REDUCE = 0,     /* in place over `count` elements */
    DP_REDUCE_SCATTER,     /* in place: block b padded, the rank's part at part_off */
    DP_ALL_GATHER,         /* in place: likewise */
} dp_op;

/* bucket: elements per communication bucket (0: 25M), rounded to the rank
 * count, at most the largest padded block; red: the gradients' reduce dtype
 * (the buckets' elements: fp32, bf16 or fp16). */
zo_status offload_dp_create(const offload_env *env, const offload_geom *g, comm_t comm, int stage,
                            size_t bucket, zo_dtype red, offload_dp **out);
/* Element i of bucket k, in the reduce dtype. */
void *offload_dp_bucket_at(const offload_dp *dp, int k, size_t i);
void offload_dp_free(offload_dp *dp);
/* 1 when the optimizer state (and what follows it) is partitioned: ZeRO 1-3. */
int offload_dp_partitioned(const offload_dp *dp);
/* Where the optimizer's part of block b starts in the whole block (0 when
 * not partitioned or dp is NULL). */
size_t offload_dp_part_first(const offload_dp *dp, int b);
/* The rank's geometry (the parts of every block) over the arrays of dp;
 * with stage 0 (or no dp) the model's own. */
void offload_dp_geom(const offload_dp *dp, const offload_geom *g, offload_geom *out);
/* The data-parallel partition of the model's blocks, as a partition (a
 * view of dp's arrays, its segments included: offload_dp_set_experts first). */
void offload_dp_part(const offload_dp *dp, const offload_geom *g, offload_part *out);
/* A partition of blocks of bytes[b] bytes (a frozen base): each padded to
 * whole fp32 words per rank. */
zo_status offload_dp_part_bytes(const offload_dp *dp, int nb, const size_t *bytes, offload_part *out);
/* Expert parallelism at ZeRO-3: the frozen base's blocks with experts
 * (bytes [xlo[b], xhi[b]) the rank's, xlo == xhi: none) in segments as
 * offload_dp_segments lays the weights' (the dense bytes over the world,
 * the experts' over expert_comm), each padded to whole fp32 words a rank;
 * their part_off 0, part_n and loc_off the segments' (pad: the block's
 * bytes, what a slot holds). offload_dp_set_experts first. */
zo_status offload_dp_part_bytes_experts(const offload_dp *dp, const size_t *bytes, const size_t *xlo,
                                        const size_t *xhi, offload_part *p);
int offload_part_segmented(const offload_part *p, int b);
/* Byte (element) `rel` of the rank's part of block b of p in the whole
 * block; *run: how many from there on are contiguous in both. */
size_t offload_part_at(const offload_part *p, int b, size_t rel, size_t *run);
/* Block b of partition p, its part in segments, gathered from the rank's
 * part (es-byte elements one after another) into `all`, as
 * offload_dp_gather_segs: the weights' (offload_dp_part) or a frozen
 * base's (bytes as fp32 words). */
zo_status offload_dp_gather_part_segs(offload_dp *dp, const offload_part *p, int b, size_t es, const void *part,
                                      gpu_copy_kind in_kind, void *all, gpu_copy_kind out_kind);
void offload_dp_part_free(offload_part *p);
/* The rank's geometry of partition p over the blocks of g (the parts). */
void offload_part_geom(const offload_part *p, const offload_geom *g, offload_geom *out);
/* All-gather block b of partition p in place in device buffer `buf` (the
 * rank's part already at its place), after `after`, completion on `done`. */
zo_status offload_dp_part_gather(offload_dp *dp, const offload_part *p, int b, size_t numel, void *buf,
                                 gpu_event_t after, gpu_event_t done);
/* Issue a collective on device buffer `buf` (fp32, fp16 or bf16): an
 * all-reduce of `count` elements, or a reduce-scatter or all-gather in
 * place of `count` elements per rank (the rank's at buf + rank * count);
 * `real` of them are the model's (the rest padding). `after` (may be NULL):
 * the collective reads its input after the event's latest record; its
 * completion is recorded on `done` (may be NULL). Counted in the
 * accounting; the request is kept until offload_dp_wait. */
zo_status offload_dp_collective(offload_dp *dp, dp_op op, size_t count, size_t real, void *buf, zo_dtype dt,
                                gpu_event_t after, gpu_event_t done);
/* The same on all of block b in place (numel elements of it real): an
 * all-reduce of numel, or a reduce-scatter / all-gather of the padded block. */
zo_status offload_dp_block(offload_dp *dp, dp_op op, int b, size_t numel, void *buf, zo_dtype dt,
                           gpu_event_t after, gpu_event_t done);
/* A piece of a block's reduce-scatter or all-gather through a bucket: of
 * one segment of the block (the whole block but with expert parallelism at
 * ZeRO 1-3), elements [first, first + q) of every rank's part of it, rank
 * after rank, on the segment's communicator. */
typedef struct offload_piece {
    comm_t comm;
    int rank, size;        /* the rank in comm, and comm's size */
    size_t lo, n, c;       /* the segment: its first element in the block, its elements, a rank's part (padded) */
    size_t first, q, real; /* the piece in each rank's part; real: of its size * q elements, the model's */
    size_t loc, mine;      /* the rank's share: where it starts in the rank's part, how many are real */
} offload_piece;
/* The pieces of block b of at most qcap elements a rank (at least 1 when
 * it has elements), and piece j of them (numel: the block's elements). */
size_t offload_dp_pieces(const offload_dp *dp, int b, size_t qcap);
void offload_dp_piece(const offload_dp *dp, int b, size_t numel, size_t j, size_t qcap, offload_piece *p);
/* Where rank r's share of piece p starts in the whole block, and how many
 * of its q elements are the model's (the rest padding). */
size_t offload_piece_src(const offload_piece *p, int r, size_t *n);
/* Piece p of a block's fp32 values (at most dp->bucket_words a rank)
 * gathered through bucket 0 on its communicator: the rank's p->mine values
 * from `mine` (host) in, every rank's q, rank after rank, to all[size * q]
 * (host; rank r's first n from offload_piece_src, the rest padding).
 * Blocking. Returns the gather's status, the group's; a failure of this
 * rank's own device work (its share's copy in, the piece's copy out) is
 * kept in *local (the first; set it to ZO_OK before) with the gather still
 * run: the rank takes part whatever its device did, so that the others
 * are not left in the gather, and its caller agrees on *local with them
 * (`all` is then not what was gathered). */
zo_status offload_dp_gather_piece(offload_dp *dp, const offload_piece *p, const float *mine, float *all,
                                  zo_status *local);
/* Element `rel` of the rank's part of block b in the whole block; *run:
 * how many from there on are contiguous in both (the rest of the part, or
 * of its segment's part). Not partitioned: rel itself. */
size_t offload_dp_part_at(const offload_dp *dp, int b, size_t rel, size_t *run);
/* 1 when block b's part is in segments (expert parallelism at ZeRO 1-3). */
int offload_dp_segmented(const offload_dp *dp, int b);
/* A segmented block's fp32, fp16 or bf16 values (es bytes each) gathered
 * through bucket 0, segment by segment on its communicator: from `part`
 * (the rank's part; part_local 0: its runs at their places in a whole
 * block) to `all` (the whole block, numel elements), copied in and out as
 * in_kind and out_kind say. Blocking. */
zo_status offload_dp_gather_segs(offload_dp *dp, int b, size_t numel, size_t es, const void *part, int part_local,
                                 gpu_copy_kind in_kind, void *all, gpu_copy_kind out_kind);
/* Complete every collective issued so far. */
zo_status offload_dp_wait(offload_dp *dp);
/* Block b's fp32 values from every rank's part: `part` (host, part_n[b]
 * values) in, the whole block (host, numel values) out. Blocking. */
zo_status offload_dp_gather_block(offload_dp *dp, int b, size_t numel, const float *part, float *all);
/* The same for block b of partition p, its elements `es` bytes each
 * (a whole number of fp32 words per rank's part). Blocking. */
zo_status offload_dp_gather_part(offload_dp *dp, const offload_part *p, int b, size_t numel, size_t es,
                                 const void *part, void *all);
/* `bytes` of host memory from every rank into all[rank * bytes]. Blocking. */
zo_status offload_dp_gather(offload_dp *dp, const void *mine, size_t bytes, void *all);
/* The same over communicator c (expert parallelism's groups: at most the
 * world's ranks). */
zo_status offload_dp_gather_on(offload_dp *dp, comm_t c, const void *mine, size_t bytes, void *all);
/* Expert parallelism: block b's elements [lo[b], hi[b]) are this rank's
 * experts, held by the ranks of xcomm: at ZeRO-0 all-reduced over it (not
 * at all when it has one rank), at ZeRO 1-3 partitioned over it, the rest
 * of the block over the world (offload_dp_segments); part_n and loc_off
 * change (numel: the blocks' elements). */
zo_status offload_dp_set_experts(offload_dp *dp, comm_t xcomm, const size_t *numel, const size_t *lo,
                                 const size_t *hi);
/* The non-empty segments of the block into seg[0..2], their count returned
 * (0 when n is 0). xlo == xhi: no experts, one dense segment. */
int offload_dp_segments(size_t n, size_t xlo, size_t xhi, int world, int rank, int xsize, int xrank,
                        offload_seg seg[3]);
/* Element `rel` of the rank's part (segments seg[0..ns)) in the whole
 * block; *run: how many elements from there on are contiguous in both (to
 * the end of its segment's part). rel must be inside the part. */
size_t offload_seg_at(const offload_seg *seg, int ns, size_t rel, size_t *run);
/* A piece's collective (a reduce-scatter or all-gather in place in bucket
 * buf of dtype dt, as offload_dp_collective's) on its communicator. */
zo_status offload_dp_piece_collective(offload_dp *dp, dp_op op, const offload_piece *p, void *buf, zo_dtype dt,
                                      gpu_event_t after, gpu_event_t done);
/* An all-reduce in place over xcomm, as offload_dp_collective's (xcomm
 * must not be NULL). */
zo_status offload_dp_all_reduce_experts(offload_dp *dp, size_t count, void *buf, zo_dtype dt, gpu_event_t after,
                                        gpu_event_t done);

#endif
