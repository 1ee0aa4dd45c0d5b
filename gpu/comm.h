/* The communicator: collectives across the ranks of a data-parallel job,
 * behind one opaque handle (the device interface's shape: this public
 * header, a private table of functions in comm_impl.h, one file per backend).
 *
 * Backends (docs/comm.md):
 * - SELF: one rank, no MPI; a collective is a copy (or nothing, in place).
 *   The same binary then runs without a launcher.
 * - MPI: host buffers (the CPU device's memory is host memory). Every MPI
 *   call runs on one progress thread per process, so a collective progresses
 *   while the caller computes; collectives are nonblocking MPI calls polled
 *   until a deadline.
 * - NCCL: device buffers of a CUDA device, enqueued on the communicator's own
 *   stream; the NCCL unique id is broadcast over MPI.
 *
 * Model of execution:
 * - Every rank issues the same collectives in the same order (the usual MPI
 *   and NCCL rule); one thread issues a communicator's collectives.
 * - A collective returns at once with a request (req != NULL) that
 *   comm_wait completes and frees, or blocks until done (req == NULL).
 * - Ordering with device work (comm_order): the collective reads its input
 *   only after `after` (an event of the communicator's device) completes,
 *   and `done` is recorded so that it completes when the output is ready: a
 *   device stream can gpu_stream_wait_event(done) without the host waiting.
 *   Both need comm_options.device. Without them the caller orders by hand
 *   (synchronize before, comm_wait after).
 * - 16-bit sums accumulate as the backend does: each addition is done in
 *   fp32 and rounded (to nearest even) back to the 16-bit type, at every step
 *   of the backend's algorithm (NCCL's rings and trees do so; the MPI backend
 *   gives MPI a user-defined sum on 16-bit elements that does the same). The
 *   result therefore depends on the order of the additions, as with NCCL;
 *   fp32 sums are MPI_SUM / ncclSum.
 * - Faults: a collective that has not completed `timeout_s` after it started
 *   (comm_options.timeout_s, else the environment variable ZO_COMM_TIMEOUT
 *   in seconds, else 300 s) ends every rank of the job: the rank asks the
 *   others where they are, hands a message naming the operation and the
 *   ranks that did not arrive to on_fault (default: standard error), and
 *   aborts the job (MPI_Abort). It cannot return an error: the other ranks
 *   would stay blocked. Errors in arguments are returned by the call.
 *
 * In-place conventions (NCCL's):
 *   all_reduce      recv == send
 *   reduce_scatter  recv == send + rank * recv_count (the rest of send is
 *                   undefined afterwards)
 *   all_gather      send == recv + rank * send_count
 *   broadcast       recv == send (on the root; elsewhere send is unused)
 *
 * Reduce-scatter and all-gather use equal blocks: a buffer of n elements is
 * padded by the caller to comm_padded_count(n, size) (the pad zeroed before
 * a reduction); comm_shard says which real elements are the rank's. */
#ifndef ZO_GPU_COMM_H
#define ZO_GPU_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"  /* zo_dtype */
#include "common/status.h" /* zo_status */
#include "gpu/device.h"    /* gpu_device_t, gpu_event_t */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct comm *comm_t;
typedef struct comm_request *comm_request_t;

typedef enum comm_backend {
    COMM_BACKEND_AUTO = 0, /* NCCL with a CUDA device, else MPI under a launcher, else SELF */
    COMM_BACKEND_SELF,
    COMM_BACKEND_MPI,
    COMM_BACKEND_NCCL,
} comm_backend;

/* "auto", "self", "mpi", "nccl". */
const char *comm_backend_name(comm_backend b);
zo_status comm_backend_parse(const char *s, comm_backend *out);
/* 1 when this build has the backend (SELF always; MPI with ZO_MPI; NCCL with
 * ZO_NCCL, CUDA and MPI). */
int comm_backend_built(comm_backend b);

/* ---- launch ------------------------------------------------------------------
 * Where a launcher says this process is: OMPI_COMM_WORLD_RANK/SIZE (Open MPI's
 * mpirun), else PMI_RANK/PMI_SIZE (MPICH's hydra, Slurm's srun --mpi=pmi2,
 * Intel MPI). found = 0 (rank 0 of 1) when neither pair is set.
 * ZO_ERR_INVALID, naming the variable, for a malformed value. */
typedef struct comm_launch {
    int found;
    int rank, size;
    const char *rank_var, *size_var; /* the variables read, or NULL */
} comm_launch;

zo_status comm_launch_detect(comm_launch *out);

/* ---- communicators --------------------------------------------------------------- */

/* Called with the message of a fault just before the job is aborted. */
typedef void (*comm_fault_fn)(const char *message, void *arg);

typedef struct comm_options {
    comm_backend backend;   /* AUTO (0) by default */
    gpu_device_t device;    /* (optional) the device whose events order the
                               collectives; NCCL: the CUDA device whose memory
                               the buffers are in (required) */
    double timeout_s;       /* 0: ZO_COMM_TIMEOUT or 300 s */
    comm_fault_fn on_fault; /* (optional) NULL: the message goes to stderr */
    void *fault_arg;
} comm_options;

/* Collective over all the ranks the launcher started (MPI_COMM_WORLD).
 * ZO_ERR_UNSUPPORTED when the backend asked for (or a launcher's size > 1
 * under AUTO) is not in this build; ZO_ERR_INVALID when the launcher's rank
 * and size disagree with MPI's (a binary started by another MPI's launcher);
 * ZO_ERR_DEVICE naming the MPI or NCCL call that failed. */
zo_status comm_init(const comm_options *opt, comm_t *out);
/* Waits for the collectives in flight, then frees. MPI itself stays
 * initialized until the process exits (MPI cannot be initialized twice). */
void comm_free(comm_t c);

/* The color of a rank that joins no communicator in comm_split. */
#define COMM_SPLIT_NONE (-1)

/* A sub-communicator (MPI_Comm_split's semantics): every rank of `parent`
 * calls it, as a collective of the parent (numbered in its sequence, under
 * its timeout), and the ranks that pass the same `color` (>= 0) form one
 * new communicator, ranked by `key`, then by their rank in the parent. A
 * rank that passes COMM_SPLIT_NONE gets *out = NULL. The child has the
 * parent's backend, device, timeout and fault handler, its own sequence of
 * collectives and byte counters, and outlives the parent: either may be
 * freed first, and a child may be split again. The collectives of all the
 * communicators of a process run one after another in the order they were
 * issued (MPI: on one thread; NCCL: on their streams), so every rank must
 * issue them in an order consistent with one program (the same order on
 * every rank for the communicators it shares); docs/comm.md.
 * ZO_ERR_INVALID for a color below COMM_SPLIT_NONE; a fault (as in a
 * collective) for a rank that does not arrive within the timeout. */
zo_status comm_split(comm_t parent, int color, int key, comm_t *out);

comm_backend comm_get_backend(comm_t c);
int comm_rank(comm_t c);
int comm_size(comm_t c);
double comm_timeout(comm_t c); /* seconds */
/* 1 when buffers must be device memory (NCCL; SELF with a CUDA device), 0
 * when host memory (MPI; SELF without a device or with the CPU device). */
int comm_device_buffers(comm_t c);
/* Bytes this rank's all-to-alls (comm_all_to_all and comm_all_to_all_v)
 * on `c` sent to the other ranks of `c` since it was created (comm_init or
 * comm_split), counted when each is started: the runtime's side of
 * memplan's `time.ep_alltoall_bytes`. A child counts its own traffic only,
 * and its parent's count does not include it. */
uint64_t comm_all_to_all_bytes(comm_t c);

/* ---- collectives -----------------------------------------------------------------
 * count / recv_count / send_count are elements of `dt` (fp32, fp16, bf16),
 * at most INT_MAX per call. `ord` may be NULL. Sums only. */
typedef struct comm_order {
    gpu_event_t after; /* (optional) start after its latest record completes */
    gpu_event_t done;  /* (optional) recorded: completes with the collective */
} comm_order;

/* recv[i] = sum over ranks of send[i], i < count. */
zo_status comm_all_reduce(comm_t c, const void *send, void *recv, size_t count, zo_dtype dt,
                          const comm_order *ord, comm_request_t *req);
/* send holds size * recv_count elements; recv[i] = sum over ranks of
 * send[rank * recv_count + i]. */
zo_status comm_reduce_scatter(comm_t c, const void *send, void *recv, size_t recv_count,
                              zo_dtype dt, const comm_order *ord, comm_request_t *req);
/* recv holds size * send_count elements; block r is rank r's send. */
zo_status comm_all_gather(comm_t c, const void *send, void *recv, size_t send_count,
                          zo_dtype dt, const comm_order *ord, comm_request_t *req);
/* recv = the root's send on every rank. */
zo_status comm_broadcast(comm_t c, const void *send, void *recv, size_t count, zo_dtype dt,
                         int root, const comm_order *ord, comm_request_t *req);
/* send and recv hold size * count elements each: block r of send goes to
 * rank r, block r of recv comes from rank r (expert parallelism's exchange
 * of tokens). send and recv must not overlap. */
zo_status comm_all_to_all(comm_t c, const void *send, void *recv, size_t count, zo_dtype dt,
                          const comm_order *ord, comm_request_t *req);
/* The all-to-all of variable sizes: send holds, packed in rank order,
 * send_counts[r] elements for rank r; recv receives, packed in rank order,
 * recv_counts[r] elements from rank r, which must be rank r's
 * send_counts[this rank] (exchange the counts first, e.g. with
 * comm_all_to_all). Both arrays hold comm_size entries and must stay valid
 * until the collective completes; at most INT_MAX elements each way. Every
 * rank joins every call, also one that sends and receives nothing (expert
 * parallelism's exchange of the tokens routed to each rank's experts).
 * send and recv must not overlap. */
zo_status comm_all_to_all_v(comm_t c, const void *send, const size_t *send_counts, void *recv,
                            const size_t *recv_counts, zo_dtype dt, const comm_order *ord,
                            comm_request_t *req);
/* Completes on every rank once all ranks have entered it. */
zo_status comm_barrier(comm_t c, const comm_order *ord, comm_request_t *req);

/* Block until the collective has completed, then free the request. */
zo_status comm_wait(comm_request_t req);
/* 1 when the collective has completed (comm_wait then returns at once). */
int comm_test(comm_request_t req);

/* End every rank of the job: `message` goes to on_fault (default stderr),
 * then MPI_Abort with `code` (SELF: exit with `code`). Does not return. For
 * a rank that fails outside a collective, so the others do not wait for it
 * until their timeout. */
void comm_abort(comm_t c, int code, const char *message) __attribute__((noreturn));

/* ---- equal shards ------------------------------------------------------------------ */

/* n rounded up to a multiple of size. */
size_t comm_padded_count(size_t n, int size);
/* Rank `rank`'s block of n elements padded to comm_padded_count(n, size):
 * it starts at *offset = rank * block and holds *count real elements
 * (block, fewer for the last ranks, possibly 0). */
void comm_shard(size_t n, int size, int rank, size_t *offset, size_t *count);

#ifdef __cplusplus
}
#endif

#endif
