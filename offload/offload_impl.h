/* Internals of the offload runtime shared by its files (not installed). */
#ifndef ZO_OFFLOAD_IMPL_H
#define ZO_OFFLOAD_IMPL_H

#include "offload/offload.h"

#ifdef ZO_OFFLOAD_HAVE_NVME
#include "nvme/nvme_engine.h"   /* defines: nvme_engine_t */
#include "nvme/nvme_pipeline.h" /* defines: nvme_pipeline_t */
#include "nvme/nvme_store.h"    /* defines: nvme_store_t */
#endif

#define OFFLOAD_MAX_PREFETCH 16
#define OFFLOAD_GRAD_SLOTS 2
#define OFFLOAD_LOSS_SCALE_INIT 65536.0f
#define OFFLOAD_LOSS_SCALE_WINDOW 200
#define OFFLOAD_DEFAULT_SUB_GROUP (1u << 20)

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
    void *host;         /* pinned, slot_bytes */
    int block;          /* the block whose gradients are in flight, -1 none */
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
    gpu_device_t dev;
    offload_config cfg;
    /* the model, with owned copies of its arrays */
    offload_model m;
    size_t *numel;              /* [nb] */
    int *dep;                   /* [nb] */
    offload_decay_range *decay; /* [n_decay] sorted by flat offset */
    int nb;
    size_t n;                   /* elements of the whole model */
    size_t *off;                /* [nb + 1] flat offsets */
    size_t largest;             /* elements of the largest block */
    size_t es;                  /* bytes per element of the model's dtype */
    size_t slot_bytes;          /* largest * es, at least 256 */

    gpu_stream_t h2d, d2h;

    /* the parameter store */
    void *store_host;           /* CPU tier: pinned [n] dtype */
    void *store_dev;            /* DEVICE tier: device [n] dtype */
    /* DEVICE tier, in the step: the new weights of a block are assembled in
     * gradient slot k's pinned buffer (gs[k].host) and copied on h2d;
     * stage16_ev[k] (h2d) says that copy is done and the buffer is free */
    gpu_event_t stage16_ev[2];
    int stage16_pending[2];

    /* streaming */
    int n_slots;
    offload_slot *slots;
    uint64_t tick;
    int *sched;                 /* [2 nb] the blocks of one micro-batch in order */
    int n_sched;
    int pos;                    /* schedule position being acquired */
    gpu_event_t prev_done;      /* compute stream: the last block's work */
    int has_prev;

    /* gradients */
    offload_gslot gs[OFFLOAD_GRAD_SLOTS];
    float *grad;                /* host [n] fp32, summed over micro-batches */
    int micro;                  /* micro-batches in grad */

    /* activation boundaries */
    void **bnd;                 /* checkpoints on the device: [nb - 1] device buffers */
    void **bnd_host;            /* checkpoints in host memory: [nb - 1] pinned */
    offload_ring ring[2];

    /* optimizer state */
    size_t n_cpu;               /* [0, n_cpu) in memory, [n_cpu, dev_first) on NVMe */
    /* the device share: flat [dev_first, n), blocks [dev_block, nb) */
    size_t dev_first;
    int dev_block;
    float *d_master, *d_mom, *d_var; /* device [n - dev_first] fp32 */
    float *d_grad;              /* device [n - dev_first] fp32, summed over micro-batches */
    void *d_stats;              /* device: float sum of squares, int32 inf/nan flag */
    gpu_event_t d_done;         /* d2h stream: the device share's update has run */
    float *master, *mom, *var;  /* [n_cpu] */
    int64_t step;
    float loss_scale;
    int dynamic_scale;          /* fp16: the scale moves */
    int good_steps;
    int64_t skipped;
    /* the step in progress (read by the update callback) */
    float hp_grad_mult;
    int nvme_blk;               /* NVMe params: block being assembled, -1 none */

#ifdef ZO_OFFLOAD_HAVE_NVME
    nvme_engine_t *opt_engine, *par_engine;
    nvme_store_t *opt_store, *par_store;
    nvme_pipeline_t *pipe;
    int *par_ids;               /* [nb] tensor ids of the 16-bit weights on NVMe */
#endif
    void *par_stage;            /* NVMe params: aligned [slot_bytes] block assembly */
    void **par_ring;            /* NVMe params: [n_slots] pinned read-ahead buffers */
    gpu_event_t *par_ring_ev;
    int *par_ring_used;
    int par_ring_next;

    /* measurements */
    uint64_t use[OFFLOAD_TIERS], peak[OFFLOAD_TIERS];
    double time[OFFLOAD_TIME_PARTS];
    double total_s;
    int64_t n_micro, n_steps;
    uint64_t bytes_h2d, bytes_d2h, bytes_disk_read, bytes_disk_written;
};

double offload_now(void);

/* Host memory counted against the CPU tier. */
zo_status offload_host_alloc(offload_t *rt, size_t bytes, int pinned, void **out);
void offload_host_free(offload_t *rt, void *p, size_t bytes, int pinned);
void offload_count(offload_t *rt, offload_tier t, int64_t delta);
/* The device tier's figures come from the device's own counters. */
void offload_device_peak(offload_t *rt);

/* Write the 16-bit weights of every block from fp32 master blocks. */
zo_status offload_store_from_master(offload_t *rt, const float *const *blocks);
/* Forget which blocks the device slots hold (after the store changed). */
void offload_slots_invalidate(offload_t *rt);
/* Finish outstanding gradient copies (before a step or a free). */
zo_status offload_grads_drain(offload_t *rt);
/* Move the 16-bit weights of [first, first + n) (given as fp32 or 16-bit in
 * `src16`) into the store. */
zo_status offload_store_range(offload_t *rt, size_t first, size_t n, const void *src16);

/* The device share of the optimizer state (optim.c): copy elements
 * [first, first + n) of the share (relative to dev_first) of master (which
 * 0), m (1), v (2) or the gradient sum (3) out to host memory, or in from
 * it (src NULL: zeros). Synchronous (on the d2h / h2d streams). */
zo_status offload_dev_state_get(offload_t *rt, int which, size_t first, size_t n, float *dst);
zo_status offload_dev_state_set(offload_t *rt, int which, size_t first, size_t n, const float *src);

/* Optimizer state on NVMe (optim.c). */
zo_status offload_nvme_init(offload_t *rt);
void offload_nvme_free(offload_t *rt);
zo_status offload_opt_load_group(offload_t *rt, size_t g, float *master, float *m, float *v);
zo_status offload_opt_store_group(offload_t *rt, size_t g, const float *master, const float *m,
                                  const float *v);
size_t offload_opt_groups(const offload_t *rt);
void offload_opt_group_range(const offload_t *rt, size_t g, size_t *first, size_t *n);
/* 16-bit weights of block b on NVMe. */
zo_status offload_par_write(offload_t *rt, int block, const void *buf);
zo_status offload_par_read(offload_t *rt, int block, void *buf);

#endif
