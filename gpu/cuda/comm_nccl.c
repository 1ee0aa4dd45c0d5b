/* The NCCL backend: device buffers of one CUDA device per rank, collectives
 * enqueued on the communicator's own stream of that device.
 *
 * Bootstrap: an MPI communicator (the MPI backend) gives rank and size and
 * broadcasts rank 0's ncclUniqueId; the NCCL communicator is created
 * nonblocking (ncclConfig_t.blocking = 0) and polled until ready, so a rank
 * that never joins is an error after the timeout rather than a hang. In a
 * build without MPI (the GPU machine has none) the bootstrap is the SELF
 * communicator: one rank, its own id, no watchdog (nothing to wait for).
 *
 * comm_split: the parent's bootstrap is split (comm_split of the MPI
 * communicator, through the host table), and the child is bootstrapped
 * over that MPI child exactly as comm_init bootstraps over the world: the
 * child's rank 0 makes a unique id, broadcasts it inside the child, and the
 * members create the NCCL communicator nonblocking. Not ncclCommSplit: the
 * same code path as comm_init, any NCCL version, and the MPI child keeps
 * its own slot and timeout for the broadcast. Not run on a GPU yet.
 *
 * Ordering: the stream waits for `after`, runs the collective between two
 * CUDA events (start, end), and records `done`: device work waiting on
 * `done` needs no host round trip.
 *
 * Faults: the MPI engine's thread calls a watchdog about every 20 ms. It
 * notes when each collective has started on the device (its start event
 * completed), and one that has run for longer than the timeout, or an
 * asynchronous NCCL error, ends the job through the engine, which asks the
 * other ranks where they are (each rank's watchdog publishes its own state)
 * and names those that did not arrive.
 *
 * 16-bit sums are NCCL's: each reduction step adds in fp32 and rounds to the
 * 16-bit type. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

#include "gpu/comm_impl.h"      /* defines: comm_iface, struct comm, struct comm_request */
#include "gpu/cuda/cuda_impl.h" /* defines: cuda_ctx, cuda_stream, cuda_status */

typedef struct nccl_op {
    struct comm_request base;
    struct nccl_op *next; /* the watch list, oldest first */
    cudaEvent_t start, end;
    double started_at;    /* when the watchdog saw `start` complete; 0: not yet */
    int complete;
} nccl_op;

typedef struct nccl_ctx {
    comm_t boot;         /* MPI: rank, size, the unique id, aborts */
    ncclComm_t nccl;
    int device;          /* CUDA ordinal */
    gpu_stream_t stream; /* the communicator's stream */
    float *scratch;      /* one device float: the barrier's all-reduce */
    int id;              /* the MPI engine's slot */
    pthread_mutex_t lock;
    nccl_op *head;       /* collectives not yet waited for */
    uint64_t last_done;
} nccl_ctx;

/* The communicator's functions in the program (comm.c hands them over at
 * each open; the same table every time). */
static const comm_host_api *host;

#define CU(call) cuda_status((call), #call)

static zo_status nccl_status(ncclResult_t r, const char *call)
{
    if (r == ncclSuccess || r == ncclInProgress) return ZO_OK;
    return zo_error(ZO_ERR_DEVICE, "%s: %s", call, ncclGetErrorString(r));
}
#define NC(call) nccl_status((call), #call)

static ncclDataType_t nccl_type(zo_dtype t)
{
    return t == ZO_DTYPE_BF16 ? ncclBfloat16 : t == ZO_DTYPE_F16 ? ncclFloat16 : ncclFloat32;
}

static cudaStream_t cuda_stream_of(gpu_stream_t s) { return ((cuda_stream *)s->impl)->stream; }

/* A nonblocking communicator's call may leave it "in progress": poll until
 * it is not, for at most `timeout` seconds. */
static zo_status settle(ncclComm_t comm, double timeout, const char *what)
{
    double end = zo_now() + timeout;
    for (;;) {
        ncclResult_t r = ncclInProgress;
        zo_status st = NC(ncclCommGetAsyncError(comm, &r));
        if (st != ZO_OK) return zo_error_wrap(st, "%s", what);
        if (r == ncclSuccess) return ZO_OK;
        if (r != ncclInProgress)
            return zo_error(ZO_ERR_DEVICE, "%s: %s (%s)", what, ncclGetErrorString(r),
                            ncclGetLastError(comm));
        if (zo_now() > end)
            return zo_error(ZO_ERR_DEVICE, "%s did not complete within %g s", what, timeout);
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

/* ---- the watchdog (on the MPI engine's thread) --------------------------------------------- */
#if defined(ZO_HAVE_MPI) && ZO_HAVE_MPI

static void nccl_watch(void *arg)
{
    comm_t c = arg;
    nccl_ctx *x = c->ctx;
    char what[256];
    if (cudaSetDevice(x->device) != cudaSuccess) return;
    pthread_mutex_lock(&x->lock);
    double now = zo_now();
    nccl_op *oldest = NULL; /* the oldest collective not complete */
    for (nccl_op *op = x->head; op; op = op->next) {
        if (op->complete) continue;
        if (cudaEventQuery(op->end) == cudaSuccess) {
            op->complete = 1;
            if (op->base.seq > x->last_done) x->last_done = op->base.seq;
            continue;
        }
        if (!oldest) oldest = op;
    }
    if (oldest && !oldest->started_at && cudaEventQuery(oldest->start) == cudaSuccess)
        oldest->started_at = now;
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(x->nccl, &async);
    if (!oldest) {
        host->mpi_set_state(x->id, COMM_PHASE_IDLE, x->last_done, COMM_OP_BARRIER);
    } else {
        host->mpi_set_state(x->id, oldest->started_at ? COMM_PHASE_RUNNING : COMM_PHASE_WAITING,
                           oldest->base.seq, oldest->base.kind);
        if (oldest->started_at && now - oldest->started_at > c->timeout_s) {
            host->op_describe(&oldest->base, what, sizeof what);
            pthread_mutex_unlock(&x->lock);
            host->mpi_fault(c, x->id, oldest->base.seq, what);
            __builtin_unreachable();
        }
    }
    pthread_mutex_unlock(&x->lock);
    if (async != ncclSuccess && async != ncclInProgress) {
        char msg[768];
        snprintf(msg, sizeof msg, "comm: NCCL failed on rank %d of %d: %s (%s)", c->rank, c->size,
                 ncclGetErrorString(async), ncclGetLastError(x->nccl));
        host->mpi_fail(c, msg);
        __builtin_unreachable();
    }
}
#endif

/* ---- collectives -------------------------------------------------------------------------- */

static ncclResult_t enqueue(nccl_ctx *x, const struct comm_request *b, cudaStream_t cs)
{
    ncclDataType_t t = nccl_type(b->dtype);
    switch (b->kind) {
    case COMM_OP_ALL_REDUCE:
        return ncclAllReduce(b->send, b->recv, b->count, t, ncclSum, x->nccl, cs);
    case COMM_OP_REDUCE_SCATTER:
        return ncclReduceScatter(b->send, b->recv, b->count, t, ncclSum, x->nccl, cs);
    case COMM_OP_ALL_GATHER: return ncclAllGather(b->send, b->recv, b->count, t, x->nccl, cs);
    case COMM_OP_BROADCAST:
        return ncclBroadcast(b->send, b->recv, b->count, t, b->root, x->nccl, cs);
    case COMM_OP_BARRIER:
        return ncclAllReduce(x->scratch, x->scratch, 1, ncclFloat32, ncclSum, x->nccl, cs);
    case COMM_OP_ALL_TO_ALL: { /* a send and a receive per peer, in one group */
        size_t bytes = b->count * zo_dtype_size(b->dtype);
        ncclResult_t res = ncclGroupStart();
        for (int r = 0; r < b->comm->size && res == ncclSuccess; r++) {
            res = ncclSend((const char *)b->send + (size_t)r * bytes, b->count, t, r, x->nccl, cs);
            if (res == ncclSuccess)
                res = ncclRecv((char *)b->recv + (size_t)r * bytes, b->count, t, r, x->nccl, cs);
        }
        ncclResult_t end = ncclGroupEnd();
        return res != ncclSuccess ? res : end;
    }
    case COMM_OP_ALL_TO_ALL_V: { /* the same, packed blocks of their own sizes; empty ones skipped
                                    on both sides (rank r's send_counts[q] is q's recv_counts[r]) */
        size_t es = zo_dtype_size(b->dtype), sent = 0, received = 0;
        ncclResult_t res = ncclGroupStart();
        for (int r = 0; r < b->comm->size && res == ncclSuccess; r++) {
            size_t ns = b->send_counts[r], nr = b->recv_counts[r];
            if (ns) res = ncclSend((const char *)b->send + sent * es, ns, t, r, x->nccl, cs);
            if (nr && res == ncclSuccess)
                res = ncclRecv((char *)b->recv + received * es, nr, t, r, x->nccl, cs);
            sent += ns;
            received += nr;
        }
        ncclResult_t end = ncclGroupEnd();
        return res != ncclSuccess ? res : end;
    }
    default: return ncclInvalidArgument;
    }
}

static zo_status nccl_start(comm_t c, struct comm_request *base)
{
    nccl_ctx *x = c->ctx;
    nccl_op *op = (nccl_op *)base;
    cudaStream_t cs = cuda_stream_of(x->stream);
    zo_status st;
    if ((st = CU(cudaSetDevice(x->device))) != ZO_OK) return st;
    if ((st = CU(cudaEventCreateWithFlags(&op->start, cudaEventDisableTiming))) != ZO_OK)
        return st;
    if ((st = CU(cudaEventCreateWithFlags(&op->end, cudaEventDisableTiming))) != ZO_OK)
        goto out_destroy_start;
    if (base->after && (st = gpu_stream_wait_event(x->stream, base->after)) != ZO_OK)
        goto out_destroy_end;
    if ((st = CU(cudaEventRecord(op->start, cs))) != ZO_OK) goto out_destroy_end;
    if ((st = NC(enqueue(x, base, cs))) != ZO_OK) goto out_destroy_end;
    if ((st = settle(x->nccl, c->timeout_s, host->op_name(base->kind))) != ZO_OK)
        goto out_destroy_end;
    /* From here the collective is enqueued: failures below are the device's. */
    if ((st = CU(cudaEventRecord(op->end, cs))) != ZO_OK) goto out_destroy_end;
    if (base->done && (st = gpu_event_record(base->done, x->stream)) != ZO_OK) goto out_destroy_end;
    pthread_mutex_lock(&x->lock);
    nccl_op **pp = &x->head;
    while (*pp) pp = &(*pp)->next;
    *pp = op;
    pthread_mutex_unlock(&x->lock);
    return ZO_OK;

out_destroy_end:
    cudaEventDestroy(op->end);
out_destroy_start:
    cudaEventDestroy(op->start);
    return st;
}

static void unlink_op(nccl_ctx *x, nccl_op *op)
{
    pthread_mutex_lock(&x->lock);
    for (nccl_op **pp = &x->head; *pp; pp = &(*pp)->next)
        if (*pp == op) {
            *pp = op->next;
            break;
        }
    if (op->base.seq > x->last_done) x->last_done = op->base.seq;
    pthread_mutex_unlock(&x->lock);
}

/* Past the timeout the watchdog ends the job; this waits for the device. */
static zo_status nccl_wait(struct comm_request *base)
{
    nccl_op *op = (nccl_op *)base;
    nccl_ctx *x = base->comm->ctx;
    zo_status st = CU(cudaSetDevice(x->device));
    if (st == ZO_OK) st = CU(cudaEventSynchronize(op->end));
    unlink_op(x, op);
    cudaEventDestroy(op->start);
    cudaEventDestroy(op->end);
    return st;
}

static int nccl_test(struct comm_request *base)
{
    nccl_op *op = (nccl_op *)base;
    nccl_ctx *x = base->comm->ctx;
    if (cudaSetDevice(x->device) != cudaSuccess) return 0;
    return cudaEventQuery(op->end) == cudaSuccess;
}

/* ---- communicators --------------------------------------------------------------------------- */

static void nccl_free(comm_t c)
{
    nccl_ctx *x = c->ctx;
#if defined(ZO_HAVE_MPI) && ZO_HAVE_MPI
    host->mpi_unregister(x->id);
#endif
    if (cudaSetDevice(x->device) == cudaSuccess) {
        (void)gpu_stream_synchronize(x->stream);
        if (ncclCommFinalize(x->nccl) == ncclInProgress)
            (void)settle(x->nccl, c->timeout_s, "ncclCommFinalize");
        ncclCommDestroy(x->nccl);
    }
    gpu_mem_free(c->device, x->scratch);
    gpu_stream_destroy(x->stream);
    host->free(x->boot);
    pthread_mutex_destroy(&x->lock);
    free(x);
}

__attribute__((noreturn)) static void nccl_abort(comm_t c, int code, const char *message)
{
    nccl_ctx *x = c->ctx;
    host->abort(x->boot, code, message);
    __builtin_unreachable();
}

static zo_status nccl_split(comm_t parent, uint64_t seq, int color, int key, comm_t child);

const comm_iface comm_nccl_iface = {
    .name = "nccl",
    .op_size = sizeof(nccl_op),
    .free = nccl_free,
    .start = nccl_start,
    .wait = nccl_wait,
    .test = nccl_test,
    .abort = nccl_abort,
    .split = nccl_split,
};

/* The NCCL communicator of `c` over the MPI (or SELF) communicator `boot`,
 * which it takes over (freed on failure too). */
static zo_status nccl_open(comm_t c, comm_t boot)
{
    zo_status st;
    nccl_ctx *x = calloc(1, sizeof *x);
    if (!x) {
        host->free(boot);
        return zo_error(ZO_ERR_NOMEM, "out of host memory");
    }
    pthread_mutex_init(&x->lock, NULL);
    x->device = ((cuda_ctx *)c->device->ctx)->device;
    x->boot = boot;
    c->rank = host->rank(x->boot);
    c->size = host->size(x->boot);
    if ((st = CU(cudaSetDevice(x->device))) != ZO_OK) goto out_free_boot;

    ncclUniqueId uid;
    memset(&uid, 0, sizeof uid);
    zo_status id_st = c->rank == 0 ? NC(ncclGetUniqueId(&uid)) : ZO_OK;
#if defined(ZO_HAVE_MPI) && ZO_HAVE_MPI
    /* every rank takes part in the broadcast, even when rank 0 has no id:
     * the others then fail to join within the timeout instead of hanging */
    if ((st = host->mpi_bcast_bytes(x->boot, &uid, sizeof uid)) != ZO_OK) goto out_free_boot;
#endif
    if ((st = id_st) != ZO_OK) goto out_free_boot;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    if ((st = NC(ncclCommInitRankConfig(&x->nccl, c->size, uid, c->rank, &cfg))) != ZO_OK)
        goto out_free_boot;
    if ((st = settle(x->nccl, c->timeout_s, "ncclCommInitRankConfig")) != ZO_OK)
        goto out_destroy_nccl;
    if ((st = gpu_stream_create(c->device, &x->stream)) != ZO_OK) goto out_destroy_nccl;
    if ((st = gpu_mem_alloc(c->device, sizeof(float), (void **)&x->scratch)) != ZO_OK)
        goto out_destroy_stream;
    c->ctx = x;
    c->iface = &comm_nccl_iface;
    c->device_buffers = 1;
#if defined(ZO_HAVE_MPI) && ZO_HAVE_MPI
    /* its slot: the bootstrap's ranks, a key derived from the bootstrap's */
    if ((st = host->mpi_register(c, x->boot, nccl_watch, c, &x->id)) != ZO_OK) goto out_free_scratch;
#endif
    return ZO_OK;

#if defined(ZO_HAVE_MPI) && ZO_HAVE_MPI
out_free_scratch:
    gpu_mem_free(c->device, x->scratch);
#endif
out_destroy_stream:
    gpu_stream_destroy(x->stream);
out_destroy_nccl:
    ncclCommAbort(x->nccl);
out_free_boot:
    host->free(x->boot);
    pthread_mutex_destroy(&x->lock);
    free(x);
    c->ctx = NULL;
    c->iface = NULL;
    return st;
}

zo_status comm_nccl_init(comm_t c, const comm_host_api *h)
{
    zo_status st;
    host = h;
#if defined(ZO_HAVE_MPI) && ZO_HAVE_MPI
    const comm_backend boot = COMM_BACKEND_MPI;
#else
    const comm_backend boot = COMM_BACKEND_SELF; /* one rank */
#endif
    comm_options bo = {.backend = boot, .timeout_s = c->timeout_s, .on_fault = c->on_fault,
                       .fault_arg = c->fault_arg};
    comm_t b;
    if ((st = host->init(&bo, &b)) != ZO_OK) return zo_error_wrap(st, "comm_init (nccl)");
    if ((st = nccl_open(c, b)) != ZO_OK) return zo_error_wrap(st, "comm_init (nccl)");
    return ZO_OK;
}

/* comm_split: split the bootstrap, then open over the child's. */
static zo_status nccl_split(comm_t parent, uint64_t seq, int color, int key, comm_t child)
{
    nccl_ctx *x = parent->ctx;
    comm_t b;
    zo_status st = host->split(x->boot, color, key, &b);
    if (st != ZO_OK || !b) return st;
    if ((st = nccl_open(child, b)) != ZO_OK) return st;
    /* the split is complete: the watchdog shows the parent idle after it */
    pthread_mutex_lock(&x->lock);
    if (seq > x->last_done) x->last_done = seq;
    pthread_mutex_unlock(&x->lock);
    return ZO_OK;
}
