/* Internals of the offload runtime (not installed).
 *
 * The runtime is built in layers; a file calls only into the layers below it:
 *
 *   offload.c   the public life cycle: configuration, init/free, weights in
 *               and out block by block, the step's entry, measurements
 *   stream.c    one micro-batch: device slots, prefetch, gradients out,
 *               activation boundaries
 *   optim.c     the step's arithmetic: gradient statistics, clipping, AdamW
 *               over every optimizer shard, new weights into the store
 *   ckpt.c      training checkpoints, one block at a time
 *   wstore.c    where the 16-bit weights live: a weight store object
 *               (device-resident, pinned host, NVMe)
 *   ostate.c    where the fp32 master and Adam moments live: optimizer-state
 *               shard objects (host memory, NVMe, device), ranges of the
 *               flat parameter index
 *   grads.c     gradient sums: where each block's gradient is added over
 *               micro-batches, and its reduction over ranks (ZeRO)
 *   wgather.c   the ZeRO-3 weight store: the rank's part of every block in
 *               an inner store, all-gathered into a device slot on fetch
 *   dp.c        data parallelism: the rank's part of every block, the
 *               communication buckets, the runtime's collectives, counted
 *   acct.c      the clock, memory accounting per tier, counters
 *
 * The store and the shards are chosen once, at init, from the configuration;
 * nothing above them asks where state lives. Every staging buffer has one
 * role and one owner:
 *   - device weight slots (stream.c): blocks streamed in for compute;
 *   - gradient slots (grads.c): a device buffer per slot for backward and
 *     its pinned host copy for the fp32 sum on the host;
 *   - the communication buckets (dp.c, several ranks): two fp32 device
 *     buffers a piece of a block passes through while a collective runs;
 *   - the store's incoming weights (wstore.c): pinned buffers the new 16-bit
 *     weights of a block pass through on their way to the device or NVMe,
 *     and the read-ahead ring of an NVMe store;
 *   - the device shard's statistics buffer (ostate.c): one block's fp32
 *     gradient on the host for an exact clipping norm;
 *   - the NVMe shard's group cache (ostate.c): one sub-group of master and
 *     moments while weights or checkpoints move in or out. */
#ifndef ZO_OFFLOAD_IMPL_H
#define ZO_OFFLOAD_IMPL_H

#include <pthread.h>

#include "common/adam_math.h" /* defines: zo_adam_hparams */
#include "common/fileio.h"    /* defines: zo_dir_lock */
#include "offload/offload.h"

#define OFFLOAD_DEFAULT_SUB_GROUP (1u << 20)

#include "offload/acct.h" /* defines: offload_env, offload_geom, offload_acct */
#include "offload/dp.h"   /* defines: offload_dp */
#include "offload/wstore.h" /* defines: wstore */
#include "offload/ostate.h" /* defines: ostate */
#include "offload/optim.h"  /* defines: offload_optim */
#include "offload/grads.h"  /* defines: offload_grads */
#include "offload/stream.h" /* defines: offload_stream */

/* ---- stream.c and optim.c: the training loop --------------------------------------- */

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
    ostate *os;                 /* the optimizer's state and the gradient sums */

    offload_stream *sm;         /* a micro-batch: slots, prefetch, activation checkpoints (stream.c) */
    offload_grads *gr;          /* the gradient slots and the way to the sums (grads.c) */
    offload_optim *opt;         /* the step and its schedule (optim.c) */

    /* the checkpoint folder this runtime writes into, locked (ckpt.c) */
    zo_dir_lock ckpt_lock;
};

/* ckpt.c: lock `dir` (created if missing) for this runtime's life; a
 * runtime holds one checkpoint folder, the last it locked. */
zo_status offload_ckpt_lock(offload_t *rt, const char *dir);

#endif
