/* The public communicator functions: choose the backend, check arguments
 * once for every backend, number the collectives, then call the backend's
 * table. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "gpu/comm_impl.h" /* defines: comm_iface, struct comm, struct comm_request */
#include "gpu/cuda_module.h" /* defines: gpu_cuda_module_get (the NCCL backend's module) */

#define COMM_DEFAULT_TIMEOUT_S 300.0

static const char *const backend_names[] = {"auto", "self", "mpi", "nccl"};
static const char *const op_names[COMM_OP_KIND_COUNT] = {"all_reduce", "reduce_scatter",
                                                         "all_gather", "broadcast", "barrier",
                                                         "all_to_all", "all_to_all_v", "split"};

const char *comm_backend_name(comm_backend b)
{
    return (unsigned)b < sizeof backend_names / sizeof backend_names[0] ? backend_names[b] : "?";
}

zo_status comm_backend_parse(const char *s, comm_backend *out)
{
    for (int b = COMM_BACKEND_AUTO; b <= COMM_BACKEND_NCCL; b++)
        if (s && !strcasecmp(s, backend_names[b])) {
            *out = (comm_backend)b;
            return ZO_OK;
        }
    return zo_error(ZO_ERR_INVALID, "unknown comm backend '%s' (expected auto, self, mpi or nccl)",
                    s ? s : "(null)");
}

#if defined(ZO_HAVE_NCCL) && ZO_HAVE_NCCL
/* What the NCCL backend (in the CUDA module, gpu/cuda/comm_nccl.c) calls in
 * the program, handed to it at each open. */
static const comm_host_api nccl_host = {
    .init = comm_init,
    .free = comm_free,
    .abort = comm_abort,
    .rank = comm_rank,
    .size = comm_size,
    .split = comm_split,
    .op_name = comm_op_name,
    .op_describe = comm_op_describe,
#if defined(ZO_HAVE_MPI) && ZO_HAVE_MPI
    .mpi_bcast_bytes = comm_mpi_bcast_bytes,
    .mpi_register = comm_mpi_register,
    .mpi_unregister = comm_mpi_unregister,
    .mpi_set_state = comm_mpi_set_state,
    .mpi_fault = comm_mpi_fault,
    .mpi_fail = comm_mpi_fail,
#endif
};

/* The NCCL backend lives in the CUDA module: open it there. */
static zo_status comm_nccl_open(comm_t c)
{
    const gpu_cuda_module *m;
    zo_status st = gpu_cuda_module_get(&m);
    if (st != ZO_OK) return zo_error_wrap(st, "comm_init(nccl)");
    if (!m->nccl_init) return zo_error(ZO_ERR_UNSUPPORTED, "comm_init(nccl): the CUDA module has no NCCL");
    return m->nccl_init(c, &nccl_host);
}
#endif

int comm_backend_built(comm_backend b)
{
    switch (b) {
    case COMM_BACKEND_AUTO:
    case COMM_BACKEND_SELF: return 1;
#if defined(ZO_HAVE_MPI) && ZO_HAVE_MPI
    case COMM_BACKEND_MPI: return 1;
#endif
#if defined(ZO_HAVE_NCCL) && ZO_HAVE_NCCL
    case COMM_BACKEND_NCCL: return 1;
#endif
    default: return 0;
    }
}

const char *comm_op_name(comm_op_kind k)
{
    return (unsigned)k < COMM_OP_KIND_COUNT ? op_names[k] : "?";
}


/* ---- launch ----------------------------------------------------------------------- */

/* A non-negative int from environment variable `var`; 0 when unset. */
static zo_status env_int(const char *var, int *value, int *set)
{
    const char *s = getenv(var);
    *set = 0;
    if (!s) return ZO_OK;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno || v < 0 || v > INT_MAX)
        return zo_error(ZO_ERR_INVALID, "environment variable %s='%s' is not a rank or size", var, s);
    *value = (int)v;
    *set = 1;
    return ZO_OK;
}

zo_status comm_launch_detect(comm_launch *out)
{
    static const char *const pairs[][2] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        {"PMI_RANK", "PMI_SIZE"},
    };
    memset(out, 0, sizeof *out);
    out->size = 1;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        int rank = 0, size = 0, rank_set, size_set;
        zo_status st;
        if ((st = env_int(pairs[i][0], &rank, &rank_set)) != ZO_OK) return st;
        if ((st = env_int(pairs[i][1], &size, &size_set)) != ZO_OK) return st;
        if (!rank_set && !size_set) continue;
        if (!rank_set || !size_set)
            return zo_error(ZO_ERR_INVALID, "environment: %s is set but %s is not",
                            pairs[i][rank_set ? 0 : 1], pairs[i][rank_set ? 1 : 0]);
        if (size < 1 || rank >= size)
            return zo_error(ZO_ERR_INVALID, "environment: %s=%d is not a rank of %s=%d",
                            pairs[i][0], rank, pairs[i][1], size);
        out->found = 1;
        out->rank = rank;
        out->size = size;
        out->rank_var = pairs[i][0];
        out->size_var = pairs[i][1];
        return ZO_OK;
    }
    return ZO_OK;
}

/* ---- communicators ------------------------------------------------------------------ */

static zo_status timeout_from(const comm_options *opt, double *out)
{
    if (opt->timeout_s < 0 || isnan(opt->timeout_s))
        return zo_error(ZO_ERR_INVALID, "comm_init: timeout_s %g is negative", opt->timeout_s);
    if (opt->timeout_s > 0) {
        *out = opt->timeout_s;
        return ZO_OK;
    }
    const char *s = getenv("ZO_COMM_TIMEOUT");
    *out = COMM_DEFAULT_TIMEOUT_S;
    if (!s) return ZO_OK;
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !(v > 0) || isinf(v))
        return zo_error(ZO_ERR_INVALID,
                        "environment variable ZO_COMM_TIMEOUT='%s' is not a positive number of "
                        "seconds", s);
    *out = v;
    return ZO_OK;
}

static int device_is_cuda(gpu_device_t dev) { return dev && !strcmp(gpu_device_name(dev), "cuda"); }

/* AUTO: NCCL for a CUDA device under a launcher with several ranks, MPI
 * under a launcher with several ranks, else SELF. */
static zo_status choose_backend(const comm_options *opt, comm_backend *out)
{
    *out = opt->backend;
    if (opt->backend != COMM_BACKEND_AUTO) return ZO_OK;
    comm_launch l;
    zo_status st = comm_launch_detect(&l);
    if (st != ZO_OK) return zo_error_wrap(st, "comm_init");
    if (l.size <= 1) {
        *out = COMM_BACKEND_SELF;
        return ZO_OK;
    }
    if (device_is_cuda(opt->device) && comm_backend_built(COMM_BACKEND_NCCL))
        *out = COMM_BACKEND_NCCL;
    else if (comm_backend_built(COMM_BACKEND_MPI))
        *out = COMM_BACKEND_MPI;
    else
        return zo_error(ZO_ERR_UNSUPPORTED,
                        "comm_init: launched as rank %d of %d (%s) but this build has no MPI "
                        "backend (configure with -DZO_MPI=ON)", l.rank, l.size, l.size_var);
    return ZO_OK;
}

zo_status comm_init(const comm_options *opt_in, comm_t *out)
{
    if (!out) return zo_error(ZO_ERR_INVALID, "comm_init: NULL argument");
    *out = NULL;
    comm_options opt = {0};
    if (opt_in) opt = *opt_in;
    zo_status st;
    comm_backend b;
    double timeout;
    if ((st = timeout_from(&opt, &timeout)) != ZO_OK) return st;
    if ((st = choose_backend(&opt, &b)) != ZO_OK) return st;
    if (!comm_backend_built(b))
        return zo_error(ZO_ERR_UNSUPPORTED, "comm_init: the %s backend is not in this build%s",
                        comm_backend_name(b),
                        b == COMM_BACKEND_MPI    ? " (configure with -DZO_MPI=ON)"
                        : b == COMM_BACKEND_NCCL ? " (needs CUDA, NCCL and MPI: -DZO_NCCL=ON)"
                                                 : "");
    if (b == COMM_BACKEND_NCCL && !device_is_cuda(opt.device))
        return zo_error(ZO_ERR_INVALID, "comm_init: the nccl backend needs a CUDA device (got %s)",
                        opt.device ? gpu_device_name(opt.device) : "none");

    comm_t c = calloc(1, sizeof *c);
    if (!c) return zo_error(ZO_ERR_NOMEM, "comm_init: out of host memory");
    c->backend = b;
    c->device = opt.device;
    c->timeout_s = timeout;
    c->on_fault = opt.on_fault;
    c->fault_arg = opt.fault_arg;
    c->size = 1;
    switch (b) {
#if defined(ZO_HAVE_MPI) && ZO_HAVE_MPI
    case COMM_BACKEND_MPI: st = comm_mpi_init(c); break;
#endif
#if defined(ZO_HAVE_NCCL) && ZO_HAVE_NCCL
    case COMM_BACKEND_NCCL: st = comm_nccl_open(c); break;
#endif
    default: st = comm_self_init(c); break;
    }
    if (st != ZO_OK) {
        free(c);
        return st;
    }
    *out = c;
    return ZO_OK;
}

zo_status comm_split(comm_t parent, int color, int key, comm_t *out)
{
    if (!out) return zo_error(ZO_ERR_INVALID, "comm_split: NULL argument");
    *out = NULL;
    if (!parent) return zo_error(ZO_ERR_INVALID, "comm_split: NULL communicator");
    if (color < COMM_SPLIT_NONE)
        return zo_error(ZO_ERR_INVALID, "comm_split: color %d is negative (a rank that joins no "
                        "communicator passes COMM_SPLIT_NONE)", color);
    if (!parent->iface->split)
        return zo_error(ZO_ERR_UNSUPPORTED, "comm_split: the %s backend cannot split",
                        parent->iface->name);
    comm_t c = calloc(1, sizeof *c);
    if (!c) return zo_error(ZO_ERR_NOMEM, "comm_split: out of host memory");
    c->backend = parent->backend;
    c->device = parent->device;
    c->timeout_s = parent->timeout_s;
    c->on_fault = parent->on_fault;
    c->fault_arg = parent->fault_arg;
    c->size = 1;
    /* a collective of the parent: the next number in its sequence */
    zo_status st = parent->iface->split(parent, parent->seq + 1, color, key, c);
    if (st == ZO_OK) parent->seq++;
    if (st != ZO_OK || !c->iface) {
        free(c);
        return st == ZO_OK ? ZO_OK : zo_error_wrap(st, "comm_split");
    }
    *out = c;
    return ZO_OK;
}

void comm_free(comm_t c)
{
    if (!c) return;
    c->iface->free(c);
    free(c);
}

comm_backend comm_get_backend(comm_t c) { return c ? c->backend : COMM_BACKEND_AUTO; }
int comm_rank(comm_t c) { return c ? c->rank : 0; }
int comm_size(comm_t c) { return c ? c->size : 1; }
double comm_timeout(comm_t c) { return c ? c->timeout_s : 0.0; }
int comm_device_buffers(comm_t c) { return c ? c->device_buffers : 0; }
uint64_t comm_all_to_all_bytes(comm_t c) { return c ? c->a2a_bytes : 0; }

void comm_op_describe(const struct comm_request *op, char *buf, size_t n)
{
    if (op->kind == COMM_OP_BARRIER || op->kind == COMM_OP_SPLIT)
        snprintf(buf, n, "%s #%llu", comm_op_name(op->kind), (unsigned long long)op->seq);
    else if (op->kind == COMM_OP_BROADCAST)
        snprintf(buf, n, "broadcast #%llu (%s, %zu elements, root %d)",
                 (unsigned long long)op->seq, zo_dtype_name(op->dtype), op->count, op->root);
    else
        snprintf(buf, n, "%s #%llu (%s, %zu elements%s)", comm_op_name(op->kind),
                 (unsigned long long)op->seq, zo_dtype_name(op->dtype), op->count,
                 op->kind == COMM_OP_ALL_REDUCE     ? ""
                 : op->kind == COMM_OP_ALL_TO_ALL_V ? " sent"
                                                    : " per rank");
}

void comm_report_fault(comm_t c, const char *message)
{
    if (c && c->on_fault) {
        c->on_fault(message, c->fault_arg);
        return;
    }
    /* The one message this library writes itself: the job is about to be
     * aborted and no caller is left to return it to. */
    fprintf(stderr, "%s\n", message);
    fflush(stderr);
}

void comm_abort(comm_t c, int code, const char *message)
{
    if (!c) {
        comm_report_fault(NULL, message ? message : "comm_abort");
        _exit(code ? code : 1);
    }
    c->iface->abort(c, code ? code : 1, message ? message : "comm_abort");
}

/* ---- collectives --------------------------------------------------------------------- */

static int dtype_ok(zo_dtype t) { return t >= ZO_DTYPE_F32 && t < ZO_DTYPE_COUNT; }

static int overlap(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

/* Check a collective's arguments: buffers present, the in-place pattern the
 * operation allows (or no overlap at all), ordering events with a device. */
static zo_status check_op(const struct comm_request *op, const char *fn)
{
    comm_t c = op->comm;
    if (op->kind == COMM_OP_BARRIER) return ZO_OK;
    if (!dtype_ok(op->dtype))
        return zo_error(ZO_ERR_INVALID, "%s: unknown dtype %d", fn, (int)op->dtype);
    if (op->count > INT_MAX)
        return zo_error(ZO_ERR_INVALID, "%s: %zu elements is more than one call takes (%d)", fn,
                        op->count, INT_MAX);
    size_t es = zo_dtype_size(op->dtype), n = (size_t)c->size;
    size_t send_bytes = op->count * es, recv_bytes = op->count * es;
    const void *in_place = op->send; /* where recv must be for an in-place call */
    switch (op->kind) {
    case COMM_OP_REDUCE_SCATTER:
        send_bytes *= n;
        in_place = (const char *)op->send + (size_t)c->rank * recv_bytes;
        break;
    case COMM_OP_ALL_GATHER:
        recv_bytes *= n;
        in_place = (const char *)op->recv + (size_t)c->rank * send_bytes;
        break;
    case COMM_OP_ALL_TO_ALL: /* never in place */
        send_bytes *= n;
        recv_bytes *= n;
        in_place = NULL;
        break;
    case COMM_OP_ALL_TO_ALL_V: { /* never in place; count is the sum of send_counts */
        if (!op->send_counts || !op->recv_counts)
            return zo_error(ZO_ERR_INVALID, "%s: NULL count array", fn);
        size_t sent = 0, received = 0;
        for (int r = 0; r < c->size; r++) {
            if (op->send_counts[r] > INT_MAX - sent || op->recv_counts[r] > INT_MAX - received)
                return zo_error(ZO_ERR_INVALID, "%s: more than %d elements in one call", fn, INT_MAX);
            sent += op->send_counts[r];
            received += op->recv_counts[r];
        }
        if (c->size == 1 && sent != received)
            return zo_error(ZO_ERR_INVALID, "%s: one rank sends %zu elements to itself but receives %zu",
                            fn, sent, received);
        send_bytes = sent * es;
        recv_bytes = received * es;
        in_place = NULL;
        if (!sent && !received) return ZO_OK;
        if ((sent && !op->send) || (received && !op->recv))
            return zo_error(ZO_ERR_INVALID, "%s: NULL buffer", fn);
        break;
    }
    case COMM_OP_BROADCAST:
        if (op->root < 0 || op->root >= c->size)
            return zo_error(ZO_ERR_INVALID, "%s: root %d is not a rank of %d", fn, op->root,
                            c->size);
        if (c->rank != op->root) send_bytes = 0; /* unused */
        break;
    default: break;
    }
    if (op->count == 0 && op->kind != COMM_OP_ALL_TO_ALL_V) return ZO_OK;
    if (op->kind != COMM_OP_ALL_TO_ALL_V && ((send_bytes && !op->send) || !op->recv))
        return zo_error(ZO_ERR_INVALID, "%s: NULL buffer", fn);
    int ok_in_place = op->kind == COMM_OP_ALL_GATHER ? op->send == in_place
                      : op->kind == COMM_OP_ALL_TO_ALL || op->kind == COMM_OP_ALL_TO_ALL_V ? 0
                                                       : op->recv == in_place;
    if (!ok_in_place && overlap(op->send, send_bytes, op->recv, recv_bytes))
        return zo_error(ZO_ERR_INVALID,
                        "%s: send and recv overlap but are not in place (docs/comm.md)", fn);
    return ZO_OK;
}

/* The bytes an all-to-all sends to the other ranks (its block for itself
 * excluded); 0 for the other collectives. */
static uint64_t sent_to_others(const struct comm_request *op)
{
    comm_t c = op->comm;
    size_t es = zo_dtype_size(op->dtype);
    if (op->kind == COMM_OP_ALL_TO_ALL) return (uint64_t)op->count * es * (uint64_t)(c->size - 1);
    if (op->kind != COMM_OP_ALL_TO_ALL_V) return 0;
    return (uint64_t)(op->count - op->send_counts[c->rank]) * es;
}

static zo_status run_op(comm_t c, struct comm_request *tmpl, const comm_order *ord,
                        comm_request_t *req, const char *fn)
{
    if (req) *req = NULL;
    if (!c) return zo_error(ZO_ERR_INVALID, "%s: NULL communicator", fn);
    tmpl->comm = c;
    if (ord) {
        tmpl->after = ord->after;
        tmpl->done = ord->done;
    }
    if ((tmpl->after || tmpl->done) && !c->device)
        return zo_error(ZO_ERR_INVALID, "%s: ordering by events needs comm_options.device", fn);
    zo_status st = check_op(tmpl, fn);
    if (st != ZO_OK) return st;
    struct comm_request *op = calloc(1, c->iface->op_size);
    if (!op) return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", fn);
    *op = *tmpl;
    op->seq = c->seq + 1;
    if ((st = c->iface->start(c, op)) != ZO_OK) {
        free(op);
        return zo_error_wrap(st, "%s", fn);
    }
    c->seq++;
    c->a2a_bytes += sent_to_others(tmpl);
    if (req) {
        *req = op;
        return ZO_OK;
    }
    return comm_wait(op);
}

zo_status comm_all_reduce(comm_t c, const void *send, void *recv, size_t count, zo_dtype dt,
                          const comm_order *ord, comm_request_t *req)
{
    struct comm_request t = {.kind = COMM_OP_ALL_REDUCE, .send = send, .recv = recv,
                             .count = count, .dtype = dt};
    return run_op(c, &t, ord, req, "comm_all_reduce");
}

zo_status comm_reduce_scatter(comm_t c, const void *send, void *recv, size_t recv_count,
                              zo_dtype dt, const comm_order *ord, comm_request_t *req)
{
    struct comm_request t = {.kind = COMM_OP_REDUCE_SCATTER, .send = send, .recv = recv,
                             .count = recv_count, .dtype = dt};
    return run_op(c, &t, ord, req, "comm_reduce_scatter");
}

zo_status comm_all_gather(comm_t c, const void *send, void *recv, size_t send_count,
                          zo_dtype dt, const comm_order *ord, comm_request_t *req)
{
    struct comm_request t = {.kind = COMM_OP_ALL_GATHER, .send = send, .recv = recv,
                             .count = send_count, .dtype = dt};
    return run_op(c, &t, ord, req, "comm_all_gather");
}

zo_status comm_broadcast(comm_t c, const void *send, void *recv, size_t count, zo_dtype dt,
                         int root, const comm_order *ord, comm_request_t *req)
{
    struct comm_request t = {.kind = COMM_OP_BROADCAST, .send = send, .recv = recv,
                             .count = count, .dtype = dt, .root = root};
    return run_op(c, &t, ord, req, "comm_broadcast");
}

zo_status comm_all_to_all(comm_t c, const void *send, void *recv, size_t count, zo_dtype dt,
                          const comm_order *ord, comm_request_t *req)
{
    struct comm_request t = {.kind = COMM_OP_ALL_TO_ALL, .send = send, .recv = recv,
                             .count = count, .dtype = dt};
    return run_op(c, &t, ord, req, "comm_all_to_all");
}

zo_status comm_all_to_all_v(comm_t c, const void *send, const size_t *send_counts, void *recv,
                            const size_t *recv_counts, zo_dtype dt, const comm_order *ord,
                            comm_request_t *req)
{
    struct comm_request t = {.kind = COMM_OP_ALL_TO_ALL_V, .send = send, .recv = recv,
                             .send_counts = send_counts, .recv_counts = recv_counts, .dtype = dt};
    if (c && send_counts)
        for (int r = 0; r < c->size; r++) t.count += send_counts[r];
    return run_op(c, &t, ord, req, "comm_all_to_all_v");
}

zo_status comm_barrier(comm_t c, const comm_order *ord, comm_request_t *req)
{
    struct comm_request t = {.kind = COMM_OP_BARRIER, .dtype = ZO_DTYPE_F32};
    return run_op(c, &t, ord, req, "comm_barrier");
}

zo_status comm_wait(comm_request_t req)
{
    if (!req) return zo_error(ZO_ERR_INVALID, "comm_wait: NULL request");
    zo_status st = req->comm->iface->wait(req);
    free(req);
    return st;
}

int comm_test(comm_request_t req) { return req ? req->comm->iface->test(req) : 1; }

/* ---- equal shards --------------------------------------------------------------------- */

size_t comm_padded_count(size_t n, int size)
{
    size_t s = size > 0 ? (size_t)size : 1;
    return (n + s - 1) / s * s;
}

void comm_shard(size_t n, int size, int rank, size_t *offset, size_t *count)
{
    size_t s = size > 0 ? (size_t)size : 1;
    size_t block = (n + s - 1) / s, start = (size_t)rank * block;
    *offset = start;
    *count = start >= n ? 0 : (n - start < block ? n - start : block);
}
