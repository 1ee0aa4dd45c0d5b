/* The single-process backend: one rank, no MPI. Every collective of one rank
 * is a copy from send to recv (nothing when in place). With a device the
 * copy runs on the communicator's own stream of that device, after `after`,
 * and `done` is recorded behind it; without one it is a host memcpy. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/comm_impl.h" /* defines: comm_iface, struct comm, struct comm_request */

typedef struct self_ctx {
    gpu_stream_t stream; /* NULL without a device */
} self_ctx;

typedef struct self_op {
    struct comm_request base;
    gpu_event_t complete; /* recorded behind the copy; NULL: already complete */
} self_op;

/* The bytes a collective of one rank copies, and where to. */
static size_t copy_bytes(const struct comm_request *op)
{
    /* one rank: every collective copies its count (all_to_all: its one block) */
    if (op->kind == COMM_OP_BARRIER || op->send == op->recv) return 0;
    return op->count * zo_dtype_size(op->dtype);
}

static zo_status self_start(comm_t c, struct comm_request *base)
{
    self_ctx *x = c->ctx;
    self_op *op = (self_op *)base;
    size_t bytes = copy_bytes(base);
    if (!x->stream) {
        if (bytes) memcpy(base->recv, base->send, bytes);
        return ZO_OK;
    }
    zo_status st;
    gpu_event_t ev;
    if ((st = gpu_event_create(c->device, &ev)) != ZO_OK) return st;
    if (base->after && (st = gpu_stream_wait_event(x->stream, base->after)) != ZO_OK)
        goto out_destroy_event;
    if (bytes && (st = gpu_memcpy_async(x->stream, base->recv, base->send, bytes,
                                         GPU_COPY_DEVICE_TO_DEVICE)) != ZO_OK)
        goto out_destroy_event;
    if (base->done && (st = gpu_event_record(base->done, x->stream)) != ZO_OK)
        goto out_destroy_event;
    if ((st = gpu_event_record(ev, x->stream)) != ZO_OK) goto out_destroy_event;
    op->complete = ev;
    return ZO_OK;

out_destroy_event:
    gpu_event_destroy(ev);
    return st;
}

static zo_status self_wait(struct comm_request *base)
{
    self_op *op = (self_op *)base;
    if (!op->complete) return ZO_OK;
    zo_status st = gpu_event_synchronize(op->complete);
    gpu_event_destroy(op->complete);
    return st;
}

static int self_test(struct comm_request *base)
{
    self_op *op = (self_op *)base;
    return !op->complete || gpu_event_query(op->complete);
}

static void self_free(comm_t c)
{
    self_ctx *x = c->ctx;
    if (x->stream) gpu_stream_destroy(x->stream);
    free(x);
}

__attribute__((noreturn)) static void self_abort(comm_t c, int code, const char *message)
{
    comm_report_fault(c, message);
    _exit(code);
}

/* One rank: the child is one rank too (or none). */
static zo_status self_split(comm_t parent, uint64_t seq, int color, int key, comm_t child)
{
    (void)parent, (void)seq, (void)key;
    return color == COMM_SPLIT_NONE ? ZO_OK : comm_self_init(child);
}

static const comm_iface self_iface = {
    .name = "self",
    .op_size = sizeof(self_op),
    .free = self_free,
    .start = self_start,
    .wait = self_wait,
    .test = self_test,
    .abort = self_abort,
    .split = self_split,
};

zo_status comm_self_init(comm_t c)
{
    self_ctx *x = calloc(1, sizeof *x);
    if (!x) return zo_error(ZO_ERR_NOMEM, "comm_init: out of host memory");
    if (c->device) {
        zo_status st = gpu_stream_create(c->device, &x->stream);
        if (st != ZO_OK) {
            free(x);
            return zo_error_wrap(st, "comm_init (self)");
        }
    }
    c->iface = &self_iface;
    c->rank = 0;
    c->size = 1;
    c->device_buffers = c->device && !strcmp(gpu_device_name(c->device), "cuda");
    c->ctx = x;
    return ZO_OK;
}
