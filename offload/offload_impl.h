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
 *   acct.c      the clock, memory accounting per tier, counters
 *
 * The store and the shards are chosen once, at init, from the configuration;
 * nothing above them asks where state lives. Every staging buffer has one
 * role and one owner:
 *   - device weight slots (stream.c): blocks streamed in for compute;
 *   - gradient slots (stream.c): a device buffer per slot for backward and
 *     its pinned host copy for the fp32 sum on the host;
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

#define OFFLOAD_MAX_PREFETCH 16
#define OFFLOAD_GRAD_SLOTS 2
#define OFFLOAD_MAX_SHARDS 3
#define OFFLOAD_LOSS_SCALE_INIT 65536.0f
#define OFFLOAD_LOSS_SCALE_WINDOW 200
#define OFFLOAD_DEFAULT_SUB_GROUP (1u << 20)
#define OFFLOAD_MAX_SKIPPED_STEPS 50 /* fp16 overflow skips in a row before the step fails */

/* ---- acct.c: the clock, memory per tier, counters -------------------------------- */

typedef enum offload_bytes_kind {
    OFFLOAD_BYTES_H2D = 0,
    OFFLOAD_BYTES_D2H,
    OFFLOAD_BYTES_DISK_READ,
    OFFLOAD_BYTES_DISK_WRITTEN,
    OFFLOAD_BYTES_KINDS,
} offload_bytes_kind;

/* Updated from the host thread and the optimizer's thread alike: through
 * the functions below, under its lock. */
typedef struct offload_acct {
    pthread_mutex_t mu;
    uint64_t use[OFFLOAD_TIERS], peak[OFFLOAD_TIERS];
    double time[OFFLOAD_TIME_PARTS];
    double total_s;
    int64_t n_micro, n_steps;
    uint64_t bytes[OFFLOAD_BYTES_KINDS];
    double opt_busy_s, opt_overlap_s; /* the optimizer's time, and its part while the device computed */
} offload_acct;

/* What every object of the runtime works with. */
typedef struct offload_env {
    gpu_device_t dev;
    gpu_stream_t h2d, d2h; /* the runtime's copy streams */
    offload_acct *acct;
    int n_threads;         /* CPU Adam threads; 0 = OpenMP's default */
} offload_env;

/* The model's blocks on the flat parameter index. */
typedef struct offload_geom {
    int nb;
    const size_t *numel;   /* [nb] */
    const size_t *off;     /* [nb + 1] flat offsets */
    size_t n;              /* elements of the whole model */
    size_t largest;        /* elements of the largest block */
    zo_dtype dtype;        /* of the 16-bit (or fp32) weights */
    size_t es;             /* bytes per element of dtype */
    size_t slot_bytes;     /* largest * es, at least 256 */
} offload_geom;

double offload_now(void);
void offload_count(offload_acct *a, offload_tier t, int64_t delta);
void offload_add_time(offload_acct *a, offload_time_part p, double seconds);
void offload_add_bytes(offload_acct *a, offload_bytes_kind k, uint64_t n);
/* Host memory counted against the CPU tier (pinned: through the device). */
zo_status offload_host_alloc(const offload_env *env, size_t bytes, int pinned, void **out);
void offload_host_free(const offload_env *env, void *p, size_t bytes, int pinned);
/* Host wait on one event, added to a part of the time split. */
zo_status offload_timed_wait(const offload_env *env, gpu_event_t ev, offload_time_part part);
/* The block holding flat element `a` (blocks of no elements skipped). */
int offload_block_of(const offload_geom *g, size_t a);

/* ---- wstore.c: the 16-bit weights -------------------------------------------------- */

typedef struct wstore wstore;

typedef struct wstore_ops {
    /* Block b's weights in device memory when the store keeps them there
     * (the compute reads them in place), else NULL. */
    const void *(*resident)(wstore *ws, int b);
    /* Start copying block b's weights into device memory `dst` on the h2d
     * stream (streamed stores); the copy is ordered on h2d. */
    zo_status (*fetch)(wstore *ws, int b, void *dst);
    /* Host memory for new weights of elements [rel, rel + n) of block b (in
     * the dtype), valid until put_host_done of the same range, which hands
     * them to the store. n is at most put_max. */
    zo_status (*put_host)(wstore *ws, int b, size_t rel, size_t n, void **dst);
    zo_status (*put_host_done)(wstore *ws, int b, size_t rel, size_t n);
    /* Device memory for all new weights of block b, written on stream s;
     * put_dev_done (on the same stream) hands them to the store. */
    zo_status (*put_dev)(wstore *ws, int b, void **dst);
    zo_status (*put_dev_done)(wstore *ws, int b, gpu_stream_t s);
    /* Every put has reached the store: later fetches and compute see it. */
    zo_status (*sync)(wstore *ws);
    /* Block b's weights (numel[b] elements of the dtype) into host memory,
     * synchronously. */
    zo_status (*get_host)(wstore *ws, int b, void *dst);
    void (*free)(wstore *ws);
} wstore_ops;

struct wstore {
    const wstore_ops *ops;
    const offload_env *env;
    const offload_geom *g;
    offload_tier tier;
    int resident;          /* resident() gives every block: nothing is fetched */
    size_t put_max;        /* elements put_host takes at once */
};

typedef struct wstore_config {
    offload_tier tier;
    int ring;              /* NVMe: pinned read-ahead buffers (the device slots' count) */
    int dev_puts;          /* new weights will come from the device (a device shard) */
    size_t chunk;          /* device tier: elements a host put stages at once */
    const char *nvme_dir;
    const char *name;      /* what it holds ("par", "frz"): NVMe file names, messages */
} wstore_config;

zo_status wstore_create(const offload_env *env, const offload_geom *g, const wstore_config *c,
                        wstore **out);
void wstore_free(wstore *ws);
/* Put elements [rel, rel + n) of block b's weights, given in fp32, chunk by
 * chunk. */
zo_status wstore_put_f32(wstore *ws, int b, size_t rel, size_t n, const float *src);
/* ... given as the store's own elements (bytes copied as they are). */
zo_status wstore_put_raw(wstore *ws, int b, size_t rel, size_t n, const void *src);
/* Every block of host store `from` (same geometry) put into `to`, synced. */
zo_status wstore_publish(wstore *from, wstore *to);

/* ---- ostate.c: fp32 master weights and Adam moments ------------------------------- */

typedef struct oshard oshard;

/* The step, as the shards call it. */
typedef struct oshard_update {
    /* host state of flat [first, first + n): master P, moments M and V */
    zo_status (*host)(void *ctx, size_t first, size_t n, float *P, float *M, float *V);
    /* device state of block b: P, M, V and the fp32 gradient sum G, on `s` */
    zo_status (*dev)(void *ctx, int b, float *P, float *M, float *V, float *G, gpu_stream_t s);
    void *ctx;
} oshard_update;

typedef struct oshard_ops {
    /* Elements [first, first + n) (flat, within the shard) of the master and
     * the moments into host arrays; a NULL array is skipped. */
    zo_status (*read)(oshard *sh, size_t first, size_t n, float *P, float *M, float *V);
    /* ... and from host arrays; NULL moments are written as zeros. */
    zo_status (*write)(oshard *sh, size_t first, size_t n, const float *P, const float *M,
                       const float *V);
    /* Writes have reached the shard's tier. */
    zo_status (*sync)(oshard *sh);
    /* Update every element (the device shard enqueues: sync waits). */
    zo_status (*step)(oshard *sh, const oshard_update *u);
    /* (host shards) Update flat [first, first + n) within the shard, as its
     * gradients complete (the schedule's updates during backward). */
    zo_status (*step_range)(oshard *sh, size_t first, size_t n, const oshard_update *u);
    /* (optional) The fp32 gradient sum kept with the state, at flat element
     * `first`; NULL when gradients are summed on the host. */
    float *(*grad)(oshard *sh, size_t first);
    /* (optional) Zero that gradient sum on stream s. */
    zo_status (*grad_zero)(oshard *sh, gpu_stream_t s);
    /* (optional) Add its sum of squares, block by block; *bad_block gets the
     * first of its blocks whose gradient holds an inf or nan, and is left
     * as it is when none does. */
    zo_status (*grad_stats)(oshard *sh, int exact, double *sumsq, int *bad_block);
    void (*free)(oshard *sh);
} oshard_ops;

struct oshard {
    const oshard_ops *ops;
    const offload_env *env;
    const offload_geom *g;
    offload_tier tier;
    size_t first, n;       /* the flat range it holds */
};

typedef struct oshard_config {
    offload_tier tier;
    size_t first, n;
    size_t sub_group;      /* elements per update call (host) / per NVMe group */
    int swap_buffers;      /* NVMe pipeline buffers */
    int exact_stats;       /* device: a pinned block for exact clipping statistics */
    const char *nvme_dir;
} oshard_config;

zo_status oshard_create(const offload_env *env, const offload_geom *g, const oshard_config *c,
                        oshard **out);
void oshard_free(oshard *sh);

/* Over every shard in flat order: elements [first, first + n) anywhere in
 * the index. */
zo_status ostate_read(oshard *const *sh, int n_sh, size_t first, size_t n, float *P, float *M,
                      float *V);
zo_status ostate_write(oshard *const *sh, int n_sh, size_t first, size_t n, const float *P,
                       const float *M, const float *V);
zo_status ostate_sync(oshard *const *sh, int n_sh);

/* ---- stream.c and optim.c: the training loop --------------------------------------- */

/* A device slot holding one block's weights while it computes. */
typedef struct offload_slot {
    void *buf;          /* device, slot_bytes */
    int block;          /* the block whose weights it holds (or is loading), -1 none */
    int busy;           /* acquired and not released */
    int used;           /* the freed event has been recorded at least once */
    uint64_t released;  /* tick of the last release (least recently released goes first) */
    gpu_event_t ready;  /* on the h2d stream: the weights have arrived */
    gpu_event_t freed;  /* on the compute stream: the last block using it has run */
} offload_slot;

/* A device gradient buffer and its pinned host copy. */
typedef struct offload_gslot {
    void *dev;          /* device, slot_bytes */
    void *host;         /* pinned, slot_bytes (NULL when no gradient goes to the host) */
    int block;          /* the block whose gradients are in flight to the host, -1 none */
    int own;            /* they are the block's own (not a dependant's share) */
    gpu_event_t done;   /* compute stream: backward wrote them */
    gpu_event_t copied; /* d2h stream: they are on the host */
} offload_gslot;

/* A device buffer of the activation ring (checkpoints in host memory). */
typedef struct offload_ring {
    void *buf;
    int holds;          /* boundary index it holds, -1 none */
    gpu_event_t used;   /* compute stream: the last block reading or writing it */
    gpu_event_t filled; /* h2d stream: a boundary was loaded into it */
    gpu_event_t saved;  /* d2h stream: its boundary reached host memory */
    int has_used, has_filled, has_saved;
} offload_ring;

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
    wstore *ws;                 /* the trainable weights */
    wstore *fws;                /* the frozen base (offload_model.frozen_bytes), or NULL */
    offload_geom fg;            /* its geometry: bytes (es 1) per block */
    size_t *fbytes, *foff;      /* [nb], [nb + 1] */
    size_t fslot;               /* bytes of a slot's frozen part (0: the base is resident) */
    oshard *shards[OFFLOAD_MAX_SHARDS]; /* in flat order */
    int n_shards;
    oshard *dev_shard;          /* the shard whose gradients stay on the device, or NULL */
    int dev_block;              /* its first block (nb: none) */
    size_t host_n;              /* flat [0, host_n): gradients summed on the host */

    /* streaming (stream.c): a slot holds a block's frozen base (fslot bytes,
     * when that is streamed) then its trainable weights (g.slot_bytes, when
     * those are streamed) */
    size_t slot_size;
    int n_slots;
    offload_slot *slots;
    uint64_t tick;
    int *sched;                 /* [2 nb] the blocks of one micro-batch in order */
    int n_sched;
    int pos;                    /* schedule position being acquired */
    gpu_event_t prev_done;      /* compute stream: the last block's work */
    int has_prev;

    /* gradients (stream.c) */
    offload_gslot gs[OFFLOAD_GRAD_SLOTS];
    float *grad;                /* host [host_n] fp32, summed over micro-batches */
    unsigned char *grad_fresh;  /* [nb] the step's first addition into block b writes (lazy zero) */
    int micro;                  /* micro-batches in the sums */

    /* the optimizer's schedule (optim.c) */
    int opt_threaded;           /* OVERLAP or DPU: updates run on opt_thread */
    pthread_t opt_thread;
    int opt_started;
    pthread_mutex_t opt_mu;
    pthread_cond_t opt_cv;      /* job posted, block published, job done */
    int opt_job;                /* OFFLOAD_JOB_* being run or posted */
    int opt_quit;
    zo_status opt_status;       /* the last job's failure, reported at the next step */
    char opt_msg[512];
    int *opt_queue;             /* [nb] blocks to update (updates during backward) */
    int opt_qhead, opt_qtail, opt_qclosed;
    int64_t *published;         /* [nb] the step whose weights block b's store holds */
    zo_adam_hparams opt_hp;     /* the running job's hyperparameters */
    int opt_early;              /* this step's updates started during backward */
    double *blk_sumsq;          /* [nb] per-block statistics of the step's gradient */
    int *blk_nonfinite;
    float prev_norm;
    int have_prev_norm;
    wstore *shadow;             /* DPU: a host store the update writes into */
    int dpu_pending;            /* DPU: the shadow holds an update not yet published */
    int device_busy;            /* a micro-batch is running (for the overlap figure) */

    /* activation boundaries (stream.c) */
    void **bnd;                 /* checkpoints on the device: [nb - 1] device buffers */
    void **bnd_host;            /* checkpoints in host memory: [nb - 1] pinned */
    offload_ring ring[2];

    /* training counters */
    int64_t step;
    float loss_scale;
    int dynamic_scale;          /* fp16: the scale moves */
    int good_steps;
    int64_t skipped;
    int skipped_in_a_row;       /* fp16 overflow skips since the last step taken */

    /* the checkpoint folder this runtime writes into, locked (ckpt.c) */
    zo_dir_lock ckpt_lock;
};

/* stream.c */
zo_status offload_stream_init(offload_t *rt);
void offload_stream_free(offload_t *rt);
/* Forget which blocks the device slots hold (the store changed). */
void offload_slots_invalidate(offload_t *rt);
/* Finish outstanding gradient copies into the host sum. */
zo_status offload_grads_drain(offload_t *rt);
zo_status offload_stream_micro_batch(offload_t *rt, gpu_stream_t s);
zo_status offload_stream_forward(offload_t *rt, gpu_stream_t s);

/* optim.c: unscale, clip and update every shard from the gradient sums
 * (drained), as the schedule says. */
enum { OFFLOAD_JOB_NONE = 0, OFFLOAD_JOB_ALL, OFFLOAD_JOB_BLOCKS };
zo_status offload_optim_init(offload_t *rt);
void offload_optim_free(offload_t *rt);
zo_status offload_optim_step(offload_t *rt, offload_step_info *info);
/* Every update done and every new weight in the store (before anything
 * reads or writes the state from outside the step). */
zo_status offload_optim_settle(offload_t *rt);
/* Block b's weights are the current step's (a forward waits for its
 * update); with wait 0, 1 when they are, 0 when not yet. */
int offload_optim_ready(offload_t *rt, int b, int wait);
/* The last micro-batch of a step completed block b's gradients: its update
 * may start now (OVERLAP without exact clipping). */
zo_status offload_optim_block_done(offload_t *rt, int b);
/* A micro-batch starts: when it is the step's last and the schedule allows
 * (overlap without exact clipping), its blocks' updates start as their
 * gradients complete (offload_optim_early says so). */
zo_status offload_optim_micro_begin(offload_t *rt);
int offload_optim_early(const offload_t *rt);

/* ckpt.c: lock `dir` (created if missing) for this runtime's life; a
 * runtime holds one checkpoint folder, the last it locked. */
zo_status offload_ckpt_lock(offload_t *rt, const char *dir);

/* The index of the first of n values that is inf or nan, n when none. */
size_t offload_find_nonfinite(const float *p, size_t n);

/* Convert n fp32 values to the weights' dtype. */
void offload_to_dtype(const offload_geom *g, void *dst, const float *src, size_t n);

#endif
