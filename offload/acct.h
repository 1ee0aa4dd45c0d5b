/* The runtime's bottom layer (acct.c): the clock and the memory of every
 * tier counted, the bytes moved, and what every object of the runtime works
 * with: the device and its copy streams (offload_env) and the model's
 * blocks on the flat parameter index (offload_geom). Includes nothing of
 * the runtime but its public types (offload.h). */
#ifndef ZO_OFFLOAD_ACCT_H
#define ZO_OFFLOAD_ACCT_H

#include <pthread.h>

#include "common/clock.h"     /* defines: zo_now */
#include "offload/offload.h"  /* defines: offload_tier, offload_time_part, gpu_device_t */

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
    /* the time split of the thread that made the runtime (the caller's:
     * the parts of its wall time), and what other threads (the optimizer's,
     * overlap and dpu) spent beside it */
    pthread_t owner;
    double time[OFFLOAD_TIME_PARTS], beside[OFFLOAD_TIME_PARTS];
    double total_s;
    int64_t n_micro, n_steps;
    uint64_t bytes[OFFLOAD_BYTES_KINDS];
    double opt_busy_s, opt_overlap_s; /* the optimizer's time, and its part while the device computed */
    int device_busy;       /* a micro-batch is running (atomic: read by the optimizer's thread) */
    /* several ranks (offload_stats), counted by the host thread alone: it
     * issues every collective (the optimizer's thread issues none) */
    uint64_t comm_elems, comm_pad_elems; /* collectives */
    uint64_t reused_elems; /* blocks a half-pass found in a slot an earlier one loaded */
    uint64_t weight_bytes; /* streamed weights copied into device slots (the host thread's) */
    uint64_t experts_fetched; /* routed experts copied into their slots */
    uint64_t comm_frozen_bytes; /* a frozen base's all-gathers (ZeRO-3 LoRA), apart */
    int64_t comm_calls;
    int64_t grad_sums, grad_sums_beside; /* the host's gradient sums; of them, on the team the
                                            optimizer's thread left (the host thread's) */
    int64_t grad_stats_fused; /* blocks' statistics taken by the addition that completed the sum */
    int64_t grad_stats_read;  /* ... by a pass of their own over the host sum, read again */
    uint64_t state_fused;     /* elements of encoded m and v the host updated a whole chunk in place */
    uint64_t state_decoded;   /* ... decoded, updated in fp32, coded again */
} offload_acct;

typedef struct offload_dp offload_dp; /* dp.h */

/* What every object of the runtime works with. */
typedef struct offload_env {
    gpu_device_t dev;
    gpu_stream_t h2d, d2h; /* the runtime's copy streams */
    offload_acct *acct;
    int n_threads;         /* CPU Adam threads; 0 = OpenMP's default */
    offload_dp *dp;        /* data parallelism, NULL with one rank */
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

void offload_count(offload_acct *a, offload_tier t, int64_t delta);
/* Seconds to a part of the time split: the owner thread's (offload_acct.
 * owner) to time[], another thread's to beside[]. */
void offload_add_time(offload_acct *a, offload_time_part p, double seconds);
/* A timed region: what it adds at its end is its time less what the regions
 * timed inside it (on the same thread) added, so a wait inside an update is
 * counted once, and the parts add up to the thread's wall time. */
typedef struct offload_timer {
    double t0, inner0;
} offload_timer;
offload_timer offload_time_begin(void);
void offload_time_end(offload_acct *a, offload_time_part p, offload_timer t);
void offload_add_bytes(offload_acct *a, offload_bytes_kind k, uint64_t n);
/* The device is computing a micro-batch (1) or not (0): the optimizer's
 * time is counted as overlapped while it is. */
void offload_set_device_busy(offload_acct *a, int busy);
int offload_device_busy(const offload_acct *a);
/* Host memory counted against the CPU tier (pinned: through the device). */
zo_status offload_host_alloc(const offload_env *env, size_t bytes, int pinned, void **out);
void offload_host_free(const offload_env *env, void *p, size_t bytes, int pinned);
/* Host wait on one event, added to a part of the time split. */
zo_status offload_timed_wait(const offload_env *env, gpu_event_t ev, offload_time_part part);
/* The block holding flat element `a` (blocks of no elements skipped). */
int offload_block_of(const offload_geom *g, size_t a);
/* The index of the first of n values that is inf or nan, n when none. */
size_t offload_find_nonfinite(const float *p, size_t n);
/* Convert n fp32 values to the weights' dtype. */
void offload_to_dtype(const offload_geom *g, void *dst, const float *src, size_t n);

#endif
