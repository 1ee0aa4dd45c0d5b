/* Private: the table of functions a communicator backend fills, and the
 * structs behind the opaque handles. Only comm.c and the backends include
 * this.
 *
 * comm.c checks arguments once for every backend, numbers the collectives,
 * allocates the request (iface->op_size bytes, a struct comm_request first)
 * and calls start; entries may assume valid arguments. */
#ifndef ZO_GPU_COMM_IMPL_H
#define ZO_GPU_COMM_IMPL_H

#include <stdint.h>

#include "common/clock.h" /* defines: zo_now */
#include "gpu/comm.h"

typedef enum comm_op_kind {
    COMM_OP_ALL_REDUCE = 0,
    COMM_OP_REDUCE_SCATTER,
    COMM_OP_ALL_GATHER,
    COMM_OP_BROADCAST,
    COMM_OP_BARRIER,
    COMM_OP_ALL_TO_ALL,
    COMM_OP_ALL_TO_ALL_V,
    COMM_OP_SPLIT, /* comm_split, numbered among the parent's collectives */
    COMM_OP_KIND_COUNT,
} comm_op_kind;

/* "all_reduce", "reduce_scatter", ... */
const char *comm_op_name(comm_op_kind k);

/* One collective. A backend's request struct starts with this. */
struct comm_request {
    comm_t comm;
    comm_op_kind kind;
    const void *send;
    void *recv;
    size_t count; /* all_reduce, broadcast: elements; reduce_scatter: per rank
                     (received); all_gather: per rank (sent);
                     all_to_all: per pair of ranks;
                     all_to_all_v: the sum of send_counts */
    const size_t *send_counts, *recv_counts; /* all_to_all_v: [size] each */
    zo_dtype dtype;
    int root;
    gpu_event_t after, done;
    uint64_t seq; /* the communicator's collective number, from 1 */
};

typedef struct comm_iface {
    const char *name;
    size_t op_size; /* bytes of a request (>= sizeof(struct comm_request)) */
    void (*free)(comm_t c);
    /* Enqueue the collective; it must not fail after enqueuing part of it. */
    zo_status (*start)(comm_t c, struct comm_request *op);
    /* Block until the collective completed (or the job was aborted); after
     * it returns comm.c frees the request. */
    zo_status (*wait)(struct comm_request *op);
    int (*test)(struct comm_request *op);
    /* End every rank; does not return. */
    void (*abort)(comm_t c, int code, const char *message) __attribute__((noreturn));
    /* comm_split: the parent's collective number `seq`. Fills `child` as a
     * constructor does (comm.c has set backend, device, timeout and the
     * fault handler), or leaves child->iface NULL for a rank that passed
     * COMM_SPLIT_NONE. */
    zo_status (*split)(comm_t parent, uint64_t seq, int color, int key, comm_t child);
} comm_iface;

struct comm {
    const comm_iface *iface;
    comm_backend backend;
    int rank, size;
    int device_buffers;
    double timeout_s;
    gpu_device_t device;
    comm_fault_fn on_fault;
    void *fault_arg;
    uint64_t seq; /* collectives issued so far */
    uint64_t a2a_bytes; /* bytes all-to-alls (both forms) sent to other ranks */
    void *ctx;    /* the backend's */
};

/* "all_reduce #7 (bf16, 1000 elements)" into buf. */
void comm_op_describe(const struct comm_request *op, char *buf, size_t n);
/* Hand a fault message to the communicator's on_fault (stderr by default). */
void comm_report_fault(comm_t c, const char *message);
/* Seconds on a monotonic clock. */

/* Backends' constructors: fill c->ctx, c->rank, c->size, c->device_buffers
 * (comm.c has set iface, backend, device, timeout and the fault handler). */
zo_status comm_self_init(comm_t c);
/* The MPI engine keeps, for every communicator of the process, where it is
 * in its sequence of collectives, and answers the questions of a rank that
 * timed out. A backend whose collectives do not run on the engine thread
 * (NCCL) publishes its state here and registers a watchdog called by the
 * engine thread about every 20 ms. */
typedef enum comm_phase {
    COMM_PHASE_IDLE = 0, /* between collectives */
    COMM_PHASE_WAITING,  /* the next collective waits for its input (the `after` event) */
    COMM_PHASE_RUNNING,  /* inside collective `seq` */
} comm_phase;

typedef void (*comm_watch_fn)(void *arg);

#if defined(ZO_HAVE_MPI) && ZO_HAVE_MPI
extern const comm_iface comm_mpi_iface;
zo_status comm_mpi_init(comm_t c);
/* For the NCCL backend: a blocking broadcast of host bytes from rank 0 over
 * the MPI communicator `mpi` (an MPI backend comm). */
zo_status comm_mpi_bcast_bytes(comm_t mpi, void *buf, size_t bytes);

/* Register comm `c` (another backend: NCCL) with the engine, over the
 * ranks of the MPI communicator `group` (its bootstrap). *id is this
 * process's handle of the slot; the other ranks find it by a key that every
 * rank of `group` derives alike (from group's key), so the slot answers
 * their questions whatever other communicators each process has. */
zo_status comm_mpi_register(comm_t c, comm_t group, comm_watch_fn watch, void *arg, int *id);
void comm_mpi_unregister(int id);
/* Publish comm `id`'s state: phase, the collective it is in (or the last one
 * completed when idle), and its kind. */
void comm_mpi_set_state(int id, comm_phase phase, uint64_t seq, comm_op_kind kind);
/* Called on the engine thread by a watchdog: ask the other ranks of comm
 * `id` where they are, report the fault with `what` and the ranks that did
 * not arrive (a sub-communicator's as its ranks and their world ranks), and
 * abort the job. Does not return. */
void comm_mpi_fault(comm_t c, int id, uint64_t seq, const char *what) __attribute__((noreturn));
/* Called on the engine thread: report `message` and abort the job. */
void comm_mpi_fail(comm_t c, const char *message) __attribute__((noreturn));
#endif
#if defined(ZO_HAVE_NCCL) && ZO_HAVE_NCCL
/* gpu/cuda/comm_nccl.c, in the CUDA module (gpu/cuda_module.h); comm.c
 * reaches it through the module's table */
extern const comm_iface comm_nccl_iface;

/* What the NCCL backend calls in the program, handed to it by comm.c when it
 * opens it: the module refers to none of the communicator's functions by
 * name, so it loads in a program that links zo_gpu without zo_comm
 * (test_gpu_parity, bench_gpu_cuda). The mpi_ members are NULL in a build
 * without MPI (the NCCL bootstrap is then one rank on the SELF backend). */
typedef struct comm_host_api {
    zo_status (*init)(const comm_options *o, comm_t *out);
    void (*free)(comm_t c);
    void (*abort)(comm_t c, int code, const char *message); /* does not return */
    int (*rank)(comm_t c);
    int (*size)(comm_t c);
    const char *(*op_name)(comm_op_kind k);
    void (*op_describe)(const struct comm_request *op, char *buf, size_t n);
    zo_status (*mpi_bcast_bytes)(comm_t mpi, void *buf, size_t bytes);
    zo_status (*split)(comm_t parent, int color, int key, comm_t *out); /* of the bootstrap */
    zo_status (*mpi_register)(comm_t c, comm_t group, comm_watch_fn watch, void *arg, int *id);
    void (*mpi_unregister)(int id);
    void (*mpi_set_state)(int id, comm_phase phase, uint64_t seq, comm_op_kind kind);
    void (*mpi_fault)(comm_t c, int id, uint64_t seq, const char *what); /* does not return */
    void (*mpi_fail)(comm_t c, const char *message);                     /* does not return */
} comm_host_api;
zo_status comm_nccl_init(comm_t c, const comm_host_api *host);
#endif

#endif
