/* The small files of a training checkpoint (internal to the runtime):
 *
 *   state.json     the counters: step, loss scale, data position and the
 *                  batch shape it counts in, ... (every field required;
 *                  version 4; version 3, without the batch shape, is read)
 *   manifest.json  written last: every other file of the checkpoint with its
 *                  size and XXH3-64, and the layout the checkpoint is of
 *                  (blocks, parameters, dtype, state version). A checkpoint is
 *                  loaded only when every file it lists has its size and hash.
 *
 * The manifest is written from a list of files, so a checkpoint made of more
 * files (per-rank shards) lists them all, with its partition: how many
 * ranks wrote the optimizer state, each its part of every block, from which
 * a run of any rank count re-partitions. Its reader keeps what it does not
 * know out (unknown members are refused) so that a later version is read by
 * a reader that knows it. docs/offload.md, "Checkpoints", gives both
 * formats. */
#ifndef ZO_OFFLOAD_CKPT_META_H
#define ZO_OFFLOAD_CKPT_META_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"  /* defines: zo_dtype */
#include "common/status.h" /* defines: zo_status */

#define CKPT_STATE_NAME "state.json"
#define CKPT_STATE_FORMAT "zoffload-train-state"
#define CKPT_STATE_VERSION 4
#define CKPT_STATE_VERSION_OLD 3 /* read: its data position in micro-batches of a shape not recorded */
#define CKPT_MANIFEST_NAME "manifest.json"
#define CKPT_MANIFEST_FORMAT "zoffload-checkpoint-manifest"
#define CKPT_MANIFEST_VERSION 1
#define CKPT_META_MAX_BYTES (1u << 20) /* state.json; a manifest may hold more files */
#define CKPT_MANIFEST_MAX_BYTES (64u << 20)

/* ---- state.json ------------------------------------------------------------------ */

/* The batch shape the data position counts in: micro_batch rows (sequences
 * of seq tokens) a micro-batch, grad_accum micro-batches a rank a step, on
 * `ranks` ranks: micro_batch x grad_accum x ranks rows a step (the file's
 * "global_batch", checked). All 0: none recorded (a caller other than
 * train, or a version-3 state.json). */
typedef struct ckpt_batch {
    int64_t micro_batch, grad_accum, ranks, seq;
} ckpt_batch;

typedef struct ckpt_state {
    int version;            /* read: 4, or 3 (data_step in micro-batches, no batch) */
    int64_t step;           /* optimizer steps taken */
    float loss_scale;
    int good_steps;         /* steps since the scale last moved */
    int64_t skipped;        /* steps skipped for overflow, in all */
    int skipped_in_a_row;   /* ... since the last step taken */
    uint64_t params;        /* elements of the model */
    int blocks;
    zo_dtype dtype;         /* of the weights */
    int64_t data_step;      /* the caller's data position: rows (sequences) of `batch` taken
                             * by every rank in all ("data_rows"); version 3: micro-batches */
    uint64_t seed;          /* the caller's seed (a decimal string in the file: exact) */
    ckpt_batch batch;
    /* a mixture of experts: the AdamW steps each routed expert has taken
     * (blocks x experts, expert e of block b at b * experts + e; an expert
     * no token went to in a step takes none); "expert_steps" in the file,
     * absent when none (as before: every expert took every step). Read:
     * allocated, ckpt_state_free releases it. */
    int64_t *expert_steps;
    size_t n_expert_steps;
} ckpt_state;

void ckpt_state_free(ckpt_state *s);

/* dir/state.json, atomically. */
zo_status ckpt_state_write(const char *dir, const ckpt_state *s);
/* Every field required and in range, nothing unknown, version 4 (or 3, as
 * it was written: "data_step" and no "batch"); messages name `path` and the
 * field. */
zo_status ckpt_state_parse(const char *text, size_t len, const char *path, ckpt_state *s);
zo_status ckpt_state_read(const char *path, ckpt_state *s);

/* ---- manifest.json ----------------------------------------------------------------- */

typedef struct ckpt_layout {
    int blocks;
    uint64_t params;
    zo_dtype dtype;
    int state_version;
} ckpt_layout;

typedef struct ckpt_file_sum {
    char name[128];   /* inside the checkpoint folder: no '/', not manifest.json */
    uint64_t bytes;
    uint64_t xxh3;    /* XXH3-64 of the whole file */
} ckpt_file_sum;

/* The optimizer state of several ranks (ZeRO 1-3): each rank's shard file
 * (ckpt_shard_name) holds its part of every block; rank r's part of block b
 * is elements [r part[b], min(numel[b], (r + 1) part[b])). */
typedef struct ckpt_partition {
    int ranks;        /* 0: none, the checkpoint is one rank's (optimizer.safetensors) */
    int zero_stage;   /* 1-3: what the ranks partitioned */
    uint64_t *numel;  /* [layout.blocks] */
    uint64_t *part;   /* [layout.blocks] */
} ckpt_partition;

#define CKPT_MAX_RANKS (1 << 20)

/* The optimizer state of expert parallelism at ZeRO-0 ("experts" in the
 * manifest): `shards` files (ckpt_ep_shard_name), shard q the state of
 * every block as a rank holding experts [q E/shards, (q + 1) E/shards) of
 * each MoE block lays it out: the dense part whole, then its own experts
 * only. The layout's "params" are the whole model's (every expert once). */
typedef struct ckpt_experts {
    int experts;      /* E, the routed experts a MoE block; 0: no such section */
    int shards;       /* dividing E */
} ckpt_experts;

typedef struct ckpt_manifest {
    ckpt_layout layout;
    int n_files;
    ckpt_file_sum *files;
    ckpt_partition partition; /* ranks 0 when the checkpoint is one rank's */
    ckpt_experts experts;     /* experts 0 unless expert-parallel */
} ckpt_manifest;

/* "optimizer-<r>-of-<n>.safetensors" (5 digits each): rank r's shard. */
void ckpt_shard_name(char *buf, size_t len, int rank, int ranks);
/* "optimizer-ep-<q>-of-<n>.safetensors": expert shard q of n. */
void ckpt_ep_shard_name(char *buf, size_t len, int shard, int shards);
/* "optimizer-ep<N>-<r>-of-<W>.image": expert parallelism at ZeRO 1-3, the
 * encoded state of rank r's part, of W world ranks in groups of N (the
 * part is what the rank count, the group size and the rank decide). The
 * rank and the count first, as ckpt_shard_name's, then the group size. */
void ckpt_epz_image_name(char *buf, size_t len, int rank, int ranks, int ep);

/* Size and XXH3-64 of dir/name (a regular file, not through a link). */
zo_status ckpt_file_hash(const char *dir, const char *name, ckpt_file_sum *out);
/* Hash the n files named and write dir/manifest.json atomically (one
 * rank's checkpoint: no partition). */
zo_status ckpt_manifest_write(const char *dir, const ckpt_layout *layout, const char *const *names,
                              int n);
/* Write m as it is (its files' sums given, e.g. each rank's of its own
 * shard; its partition when ranks > 0) to dir/manifest.json atomically. */
zo_status ckpt_manifest_write_sums(const char *dir, const ckpt_manifest *m);
/* Strict: every field, the files' names inside the folder and listed once;
 * a partition whose blocks are the layout's (their elements summing to its
 * parameters, each part at least 1/ranks of its block) and every rank's
 * shard listed. */
zo_status ckpt_manifest_parse(const char *text, size_t len, const char *path, ckpt_manifest *m);
zo_status ckpt_manifest_read(const char *dir, ckpt_manifest *m);
/* Every file listed has its size and hash: ZO_ERR_CHECKSUM naming the file
 * (and what was written and read) otherwise; a file missing is
 * ZO_ERR_NOT_FOUND naming it. Of `ranks` loading together, `rank` checks
 * the files whose place in the list is `rank` modulo `ranks` (one rank: 0
 * of 1, every file). */
zo_status ckpt_manifest_verify(const char *dir, const ckpt_manifest *m, int rank, int ranks);
/* The entry for `name`, or NULL. */
const ckpt_file_sum *ckpt_manifest_find(const ckpt_manifest *m, const char *name);
void ckpt_manifest_free(ckpt_manifest *m);

/* ---- names in a checkpoint folder ---------------------------------------------------- */

/* "step-%08lld" or "step-%08lld.%d" (k >= 1) exactly as the runtime writes
 * them: 1 and the step and k (0 without a suffix), else 0. */
int ckpt_name_parse(const char *name, int64_t *step, int *k);

#endif
