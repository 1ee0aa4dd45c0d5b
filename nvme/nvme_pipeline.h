/* The pipelined optimizer step over state on NVMe.
 *
 * The fp32 optimizer state of n_elems parameters (master weights, Adam m and
 * v) is cut into K sub-groups of group_elems elements (the last may be
 * shorter) and kept in a swap store as three tensors per sub-group
 * ("<prefix>.<g>.master", ".m", ".v"). One step walks the sub-groups in
 * order:
 *
 *     read g+1 from disk  ||  update g on the CPU  ||  write g-1 back
 *
 * with `nslots` sub-group buffers (default 3) allocated once, however large
 * the model. The update is a callback, so this module does not depend on the
 * optimizer: it is called on the caller's thread, once per sub-group, in
 * order, with that sub-group's buffers. One I/O thread per step drives the
 * engine (and verifies checksums) meanwhile.
 *
 * Because the update sees exactly the bytes that were written, a step over
 * NVMe-resident state is bit-identical to the same callback over in-memory
 * state. */
#ifndef ZO_NVME_PIPELINE_H
#define ZO_NVME_PIPELINE_H

#include <stddef.h>

#include "common/status.h" // defines: zo_status
#include "nvme_store.h"    // defines: nvme_store_t

typedef struct nvme_pipeline nvme_pipeline_t;

/* Update sub-group `group`, which holds elements [first, first + n) of the
 * flat state: master, m, v are (n,) fp32 each, updated in place (with
 * tensor_bytes: buffers of those bytes, NULL for a tensor of none). */
typedef zo_status (*nvme_update_fn)(void *user, size_t group, size_t first, size_t n,
                                    float *master, float *m, float *v);

typedef struct nvme_pipeline_config {
    size_t n_elems;       /* parameters in the state */
    size_t group_elems;   /* elements per sub-group */
    int nslots;           /* sub-group buffers; 0 = 3; at least 2 */
    const char *prefix;   /* tensor name prefix; NULL = "opt" */
    /* (optional) The bytes of tensor j (0 master, 1 m, 2 v) of a sub-group
     * of n elements, for state in another encoding than fp32 (issue 30: m
     * and v in one buffer of adam_state_bytes, in tensor 1; tensor 2 of 0
     * bytes, not stored). NULL: n floats each. Partial loads
     * (nvme_pipeline_load_group_part) need n floats each. */
    size_t (*tensor_bytes)(const void *user, int j, size_t n);
    const void *tensor_user;
} nvme_pipeline_config;

typedef struct nvme_step_stats {
    double seconds;        /* the whole step */
    double update_seconds; /* in the callback */
    double wait_seconds;   /* the caller's thread waiting for reads */
    double io_seconds;     /* the I/O thread with transfers in flight */
    unsigned long long bytes_read, bytes_written;
} nvme_step_stats;

/* Adds the 3*K tensors to `store` (capacity checked for all of them) and
 * allocates the slot buffers from the store's engine. */
zo_status nvme_pipeline_init(nvme_pipeline_t **out, nvme_store_t *store,
                             const nvme_pipeline_config *cfg);
void nvme_pipeline_free(nvme_pipeline_t *p);
size_t nvme_pipeline_groups(const nvme_pipeline_t *p);
/* First element and length of sub-group g. */
void nvme_pipeline_group_range(const nvme_pipeline_t *p, size_t g, size_t *first, size_t *n);

/* Copy sub-group g's state to disk, or back from it (n floats each, n from
 * nvme_pipeline_group_range). Synchronous; for loading and checking. */
zo_status nvme_pipeline_store_group(nvme_pipeline_t *p, size_t g, const float *master,
                                    const float *m, const float *v);
zo_status nvme_pipeline_load_group(nvme_pipeline_t *p, size_t g, float *master, float *m,
                                   float *v);
/* Elements [from, from + count) of sub-group g (relative to the group) into
 * master, m and v (count floats each): the group is read whole through a
 * slot buffer, the rest is left alone. */
zo_status nvme_pipeline_load_group_part(nvme_pipeline_t *p, size_t g, size_t from, size_t count,
                                        float *master, float *m, float *v);

/* The aligned buffers of slot k (1 <= k < nslots; group_elems floats each),
 * which the caller may use as its own between steps (load_group and
 * store_group go through slot 0; a step uses every slot). */
zo_status nvme_pipeline_slot_buffers(nvme_pipeline_t *p, int k, float **master, float **m,
                                     float **v);

/* One step: every sub-group read, updated by fn(user, ...), written back.
 * On an error (I/O, checksum, or the callback's) the step stops, waits for
 * the transfers in flight and returns it; sub-groups not yet written keep
 * their previous state on disk. stats may be NULL. */
zo_status nvme_pipeline_step(nvme_pipeline_t *p, nvme_update_fn fn, void *user,
                             nvme_step_stats *stats);

#endif
