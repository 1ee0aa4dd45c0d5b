/* The CPU backend: "device" memory from a pool with a capacity, one worker
 * thread per stream running its queue in order, events that order work
 * across streams, and the kernels of ops_cpu.c enqueued as commands. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"     /* defines: zo_now */
#include "common/dtype.h"     /* defines: zo_memset_team */
#include "gpu/device_impl.h" /* defines: gpu_backend_iface, struct gpu_stream/event */
#include "gpu/ops_cpu.h"     /* defines: cpu_gemm, cpu_attention_forward, ... */

#define POOL_ALIGN 256u
#define ALLOC_MAGIC 0x5a4f44455649434full /* "ZODEVICO" */

typedef struct cpu_ctx {
    pthread_mutex_t lock; /* guards the counters and the fault plan below */
    size_t capacity, in_use, high_water, n_allocs, host_pinned;
    int n_threads;
    int tf32; /* gpu_cpu_options.tf32 */
    gpu_cpu_faults faults; /* test seam: see gpu_cpu_inject_faults */
} cpu_ctx;

/* Every device allocation starts with this header, POOL_ALIGN bytes before
 * the pointer handed out. */
typedef struct alloc_header {
    uint64_t magic;
    size_t bytes; /* rounded size counted against the capacity */
} alloc_header;

static cpu_ctx *ctx_of(gpu_device_t dev) { return dev->ctx; }

/* ---- fault injection ----------------------------------------------------------- */

/* One step of a skip/fail countdown: nonzero when this call is to fail. */
static int fault_step(cpu_ctx *c, int *skip, int *fail)
{
    pthread_mutex_lock(&c->lock);
    int hit = 0;
    if (*fail > 0) {
        if (*skip > 0) {
            (*skip)--;
        } else {
            (*fail)--;
            hit = 1;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return hit;
}

static int fault_scratch(void *arg)
{
    cpu_ctx *c = arg;
    return fault_step(c, &c->faults.scratch_skip, &c->faults.scratch_fail);
}

static int fault_alloc(cpu_ctx *c)
{
    return fault_step(c, &c->faults.alloc_skip, &c->faults.alloc_fail);
}

static int fault_copy(cpu_ctx *c)
{
    return fault_step(c, &c->faults.copy_skip, &c->faults.copy_fail);
}

/* ---- memory ---------------------------------------------------------------- */

/* Back every page of a new allocation now, as cudaMalloc and cudaHostAlloc
 * do (device memory and page-locked memory are committed when allocated):
 * left to the first use, the page faults landed in the first token's time
 * (a streamed generation's slots, the NVMe read-ahead ring, its forward's
 * buffers: issue 29) and in whichever op first wrote a buffer. */
static void commit_pages(const cpu_ctx *c, void *p, size_t bytes)
{
    /* by the device's team: gigabytes of faults are a start-up's seconds */
    zo_memset_team(p, 0, bytes, c->n_threads);
}

static zo_status cpu_mem_alloc(gpu_device_t dev, size_t bytes, void **out)
{
    cpu_ctx *c = ctx_of(dev);
    if (bytes > SIZE_MAX - 2 * POOL_ALIGN)
        return zo_error(ZO_ERR_CAPACITY, "gpu_mem_alloc: %zu bytes is too large", bytes);
    size_t rounded = (bytes + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
    if (fault_alloc(c))
        return zo_error(ZO_ERR_NOMEM, "gpu_mem_alloc: host allocation of %zu bytes failed "
                                      "(backing the cpu device; injected)", rounded);
    pthread_mutex_lock(&c->lock);
    if (c->capacity && c->in_use + rounded > c->capacity) {
        size_t in_use = c->in_use;
        pthread_mutex_unlock(&c->lock);
        return zo_error(ZO_ERR_CAPACITY,
                        "device memory (cpu): allocating %zu bytes would exceed the capacity "
                        "of %zu bytes (%zu in use, %zu free)",
                        rounded, c->capacity, in_use, c->capacity - in_use);
    }
    c->in_use += rounded; /* reserve before allocating so racing threads see it */
    if (c->in_use > c->high_water) c->high_water = c->in_use;
    c->n_allocs++;
    pthread_mutex_unlock(&c->lock);

    char *base = aligned_alloc(POOL_ALIGN, rounded + POOL_ALIGN);
    if (!base) {
        pthread_mutex_lock(&c->lock);
        c->in_use -= rounded;
        c->n_allocs--;
        pthread_mutex_unlock(&c->lock);
        return zo_error(ZO_ERR_NOMEM, "gpu_mem_alloc: host allocation of %zu bytes failed "
                                      "(backing the cpu device)", rounded);
    }
    commit_pages(c, base, rounded + POOL_ALIGN);
    alloc_header *h = (alloc_header *)base;
    h->magic = ALLOC_MAGIC;
    h->bytes = rounded;
    *out = base + POOL_ALIGN;
    return ZO_OK;
}

static void cpu_mem_free(gpu_device_t dev, void *p)
{
    cpu_ctx *c = ctx_of(dev);
    char *base = (char *)p - POOL_ALIGN;
    alloc_header *h = (alloc_header *)base;
    if (h->magic != ALLOC_MAGIC) return; /* not ours, or freed twice: ignore */
    h->magic = 0;
    pthread_mutex_lock(&c->lock);
    c->in_use -= h->bytes;
    c->n_allocs--;
    pthread_mutex_unlock(&c->lock);
    free(base);
}

static void cpu_mem_get_stats(gpu_device_t dev, gpu_mem_stats *out)
{
    cpu_ctx *c = ctx_of(dev);
    pthread_mutex_lock(&c->lock);
    out->capacity = c->capacity;
    out->in_use = c->in_use;
    out->high_water = c->high_water;
    out->n_allocs = c->n_allocs;
    out->host_pinned = c->host_pinned;
    pthread_mutex_unlock(&c->lock);
}

static void cpu_mem_reset_peak(gpu_device_t dev)
{
    cpu_ctx *c = ctx_of(dev);
    pthread_mutex_lock(&c->lock);
    c->high_water = c->in_use;
    pthread_mutex_unlock(&c->lock);
}

/* Pinned host memory is ordinary memory here, with the same header so that
 * its bytes can be counted. It starts on a page, as cudaHostAlloc's does:
 * the NVMe engine reads into it with O_DIRECT (4 KiB aligned buffers), where
 * 256-byte buffers sent every request through the page cache, so the CPU
 * backend's weights "from NVMe" came from memory (issue 29). */
#define HOST_ALIGN 4096u

static zo_status cpu_host_alloc(gpu_device_t dev, size_t bytes, void **out)
{
    cpu_ctx *c = ctx_of(dev);
    if (bytes > SIZE_MAX - 2 * HOST_ALIGN)
        return zo_error(ZO_ERR_NOMEM, "gpu_host_alloc: %zu bytes is too large", bytes);
    size_t rounded = (bytes + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
    if (fault_alloc(c))
        return zo_error(ZO_ERR_NOMEM, "gpu_host_alloc: %zu bytes failed (injected)", rounded);
    char *base = aligned_alloc(HOST_ALIGN, (rounded + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN + HOST_ALIGN);
    if (!base) return zo_error(ZO_ERR_NOMEM, "gpu_host_alloc: %zu bytes failed", rounded);
    commit_pages(c, base, (rounded + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN + HOST_ALIGN);
    alloc_header *h = (alloc_header *)base;
    h->magic = ALLOC_MAGIC ^ 1u;
    h->bytes = rounded;
    pthread_mutex_lock(&c->lock);
    c->host_pinned += rounded;
    pthread_mutex_unlock(&c->lock);
    *out = base + HOST_ALIGN;
    return ZO_OK;
}

static void cpu_host_free(gpu_device_t dev, void *p)
{
    cpu_ctx *c = ctx_of(dev);
    char *base = (char *)p - HOST_ALIGN;
    alloc_header *h = (alloc_header *)base;
    if (h->magic != (ALLOC_MAGIC ^ 1u)) return;
    h->magic = 0;
    pthread_mutex_lock(&c->lock);
    c->host_pinned -= h->bytes;
    pthread_mutex_unlock(&c->lock);
    free(base);
}

/* ---- streams: a queue of commands and its worker thread ------------------------ */

typedef struct cpu_cmd cpu_cmd;
typedef zo_status (*cpu_cmd_fn)(cpu_cmd *cmd, int nt);

/* The arguments of one command, copied when it is queued. */
typedef union cpu_args {
    struct { void *dst; const void *src; size_t bytes; int value; } mem;
    struct { void *p; } free;
    struct { struct cpu_event *ev; uint64_t gen; } event;
    struct { gpu_host_fn fn; void *arg; } host;
    struct { gpu_op_id id; gpu_op_args a; } op;
} cpu_args;

/* A command: the function to run and a copy of its arguments. */
struct cpu_cmd {
    cpu_cmd *next;
    cpu_cmd_fn run;
    gpu_device_t dev;
    cpu_scratch *ws; /* the running stream's arena, set by its worker */
    cpu_args u;
};

typedef struct cpu_stream {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work;    /* signalled when a command arrives or on stop */
    pthread_cond_t idle;    /* signalled when a command completes */
    cpu_cmd *head, *tail;
    uint64_t submitted, completed;
    int stop;
    int inline_running;     /* the head is running on a submitting thread (enqueue) */
    zo_status error;        /* first failure, sticky until synchronize */
    char message[512];
    int n_threads;
    cpu_scratch scratch; /* working memory of the ops, used by the worker only */
} cpu_stream;

typedef struct cpu_event {
    pthread_mutex_t lock;
    pthread_cond_t done;
    uint64_t recorded;  /* records made (host side) */
    uint64_t completed; /* latest record that has run */
    int timed;          /* gpu_event_create_timed: t_done kept */
    double t_done;      /* zo_now() when the worker reached the latest record */
} cpu_event;

/* Run the stream's head command (the lock not held), then, locked, keep
 * its failure (sticky until synchronize), take it off the queue and count
 * it done; returns with the lock held. */
static void run_head(cpu_stream *cs, cpu_cmd *cmd)
{
    cmd->ws = &cs->scratch;
    zo_status st = cmd->run(cmd, cs->n_threads);
    pthread_mutex_lock(&cs->lock);
    if (st != ZO_OK && cs->error == ZO_OK) {
        cs->error = st;
        snprintf(cs->message, sizeof cs->message, "%s", zo_last_error());
    }
    cs->head = cmd->next;
    if (!cs->head) cs->tail = NULL;
    cs->completed++;
    pthread_cond_broadcast(&cs->idle);
}

static void *stream_worker(void *arg)
{
    cpu_stream *cs = arg;
    pthread_mutex_lock(&cs->lock);
    for (;;) {
        while ((!cs->head || cs->inline_running) && !cs->stop) pthread_cond_wait(&cs->work, &cs->lock);
        if (!cs->head || cs->inline_running) break; /* stop with an empty queue */
        cpu_cmd *cmd = cs->head;
        pthread_mutex_unlock(&cs->lock);
        run_head(cs, cmd);
        free(cmd);
    }
    pthread_mutex_unlock(&cs->lock);
    return NULL;
}

static zo_status cpu_stream_create(gpu_device_t dev, gpu_stream_t s)
{
    cpu_stream *cs = calloc(1, sizeof *cs);
    if (!cs) return zo_error(ZO_ERR_NOMEM, "gpu_stream_create: out of host memory");
    cs->n_threads = ctx_of(dev)->n_threads;
    cpu_scratch_init(&cs->scratch);
    cs->scratch.fail = fault_scratch;
    cs->scratch.fail_arg = ctx_of(dev);
    cs->scratch.tf32 = ctx_of(dev)->tf32;
    pthread_mutex_init(&cs->lock, NULL);
    pthread_cond_init(&cs->work, NULL);
    pthread_cond_init(&cs->idle, NULL);
    int rc = pthread_create(&cs->thread, NULL, stream_worker, cs);
    if (rc != 0) {
        pthread_cond_destroy(&cs->idle);
        pthread_cond_destroy(&cs->work);
        pthread_mutex_destroy(&cs->lock);
        free(cs);
        return zo_error(ZO_ERR_DEVICE, "gpu_stream_create: pthread_create: %s", strerror(rc));
    }
    s->impl = cs;
    return ZO_OK;
}

static zo_status run_memcpy(cpu_cmd *cmd, int nt);
static zo_status run_memset(cpu_cmd *cmd, int nt);
static zo_status run_free(cpu_cmd *cmd, int nt);
static zo_status run_event_complete(cpu_cmd *cmd, int nt);

/* Commands an idle stream runs on the thread that submits them (enqueue):
 * an event's record, a free, a copy or fill of at most this many bytes
 * (a few microseconds). Waking the worker for each cost two context
 * switches, most of a small model's on this backend; ops and longer
 * copies stay on the worker, so the host still overlaps the device. */
#define INLINE_BYTES (64u << 10)

/* Append a command (allocated by new_cmd) and wake the worker, or run it
 * here when the stream is idle and it is one of the above. */
static zo_status enqueue(gpu_stream_t s, cpu_cmd *cmd)
{
    cpu_stream *cs = s->impl;
    pthread_mutex_lock(&cs->lock);
    int here = !cs->head && (cmd->run == run_event_complete || cmd->run == run_free ||
                             ((cmd->run == run_memcpy || cmd->run == run_memset) && cmd->u.mem.bytes <= INLINE_BYTES));
    if (cs->tail)
        cs->tail->next = cmd;
    else
        cs->head = cmd;
    cs->tail = cmd;
    cs->submitted++;
    if (!here) {
        pthread_cond_signal(&cs->work);
        pthread_mutex_unlock(&cs->lock);
        return ZO_OK;
    }
    cs->inline_running = 1;
    pthread_mutex_unlock(&cs->lock);
    run_head(cs, cmd);
    cs->inline_running = 0;
    if (cs->head) pthread_cond_signal(&cs->work); /* appended meanwhile by another thread */
    pthread_mutex_unlock(&cs->lock);
    free(cmd);
    return ZO_OK;
}

/* A command that runs fn on the stream's worker; NULL when the host has no
 * memory for it. */
static cpu_cmd *new_cmd(gpu_stream_t s, cpu_cmd_fn fn, const cpu_args *args)
{
    cpu_cmd *cmd = calloc(1, sizeof *cmd);
    if (!cmd) return NULL;
    cmd->run = fn;
    cmd->dev = s->dev;
    if (args) cmd->u = *args;
    return cmd;
}

static zo_status no_cmd(const char *op)
{
    return zo_error(ZO_ERR_NOMEM, "%s: out of host memory for a command", op);
}

/* Queue fn with a copy of its arguments; `op` names the call in messages. */
static zo_status submit(gpu_stream_t s, cpu_cmd_fn fn, const char *op, const cpu_args *args)
{
    cpu_cmd *cmd = new_cmd(s, fn, args);
    if (!cmd) return no_cmd(op);
    return enqueue(s, cmd);
}

static zo_status cpu_stream_synchronize(gpu_stream_t s)
{
    cpu_stream *cs = s->impl;
    pthread_mutex_lock(&cs->lock);
    uint64_t target = cs->submitted;
    while (cs->completed < target) pthread_cond_wait(&cs->idle, &cs->lock);
    zo_status st = cs->error;
    char msg[sizeof cs->message];
    memcpy(msg, cs->message, sizeof msg);
    cs->error = ZO_OK;
    cs->message[0] = '\0';
    pthread_mutex_unlock(&cs->lock);
    if (st != ZO_OK) return zo_error(st, "stream error: %s", msg);
    return ZO_OK;
}

static void cpu_stream_destroy(gpu_stream_t s)
{
    cpu_stream *cs = s->impl;
    (void)cpu_stream_synchronize(s);
    pthread_mutex_lock(&cs->lock);
    cs->stop = 1;
    pthread_cond_signal(&cs->work);
    pthread_mutex_unlock(&cs->lock);
    pthread_join(cs->thread, NULL);
    pthread_cond_destroy(&cs->idle);
    pthread_cond_destroy(&cs->work);
    pthread_mutex_destroy(&cs->lock);
    cpu_scratch_free(&cs->scratch);
    free(cs);
}

static zo_status cpu_synchronize(gpu_device_t dev)
{
    zo_status first = ZO_OK;
    pthread_mutex_lock(dev->list_lock);
    for (gpu_stream_t s = dev->streams; s; s = s->next) {
        zo_status st = cpu_stream_synchronize(s);
        if (st != ZO_OK && first == ZO_OK) first = st;
    }
    pthread_mutex_unlock(dev->list_lock);
    return first;
}

/* ---- events --------------------------------------------------------------------------- */

static zo_status cpu_event_create(gpu_device_t dev, gpu_event_t ev)
{
    (void)dev;
    cpu_event *ce = calloc(1, sizeof *ce);
    if (!ce) return zo_error(ZO_ERR_NOMEM, "gpu_event_create: out of host memory");
    ce->timed = ev->timed;
    pthread_mutex_init(&ce->lock, NULL);
    pthread_cond_init(&ce->done, NULL);
    ev->impl = ce;
    return ZO_OK;
}

static void cpu_event_destroy(gpu_event_t ev)
{
    cpu_event *ce = ev->impl;
    (void)ev->dev->iface->event_synchronize(ev); /* a queued record still points at it */
    pthread_cond_destroy(&ce->done);
    pthread_mutex_destroy(&ce->lock);
    free(ce);
}

static zo_status run_event_complete(cpu_cmd *cmd, int nt)
{
    (void)nt;
    cpu_event *ce = cmd->u.event.ev;
    double t = ce->timed ? zo_now() : 0.0; /* the device's clock: when its stream got here */
    pthread_mutex_lock(&ce->lock);
    if (cmd->u.event.gen > ce->completed) {
        ce->completed = cmd->u.event.gen;
        ce->t_done = t;
    }
    pthread_cond_broadcast(&ce->done);
    pthread_mutex_unlock(&ce->lock);
    return ZO_OK;
}

static zo_status cpu_event_record(gpu_event_t ev, gpu_stream_t s)
{
    cpu_event *ce = ev->impl;
    cpu_cmd *cmd = new_cmd(s, run_event_complete, NULL);
    if (!cmd) return no_cmd("gpu_event_record");
    pthread_mutex_lock(&ce->lock);
    cmd->u.event.ev = ce;
    cmd->u.event.gen = ++ce->recorded;
    pthread_mutex_unlock(&ce->lock);
    return enqueue(s, cmd);
}

static zo_status run_event_wait(cpu_cmd *cmd, int nt)
{
    (void)nt;
    cpu_event *ce = cmd->u.event.ev;
    pthread_mutex_lock(&ce->lock);
    while (ce->completed < cmd->u.event.gen) pthread_cond_wait(&ce->done, &ce->lock);
    pthread_mutex_unlock(&ce->lock);
    return ZO_OK;
}

static zo_status cpu_stream_wait_event(gpu_stream_t s, gpu_event_t ev)
{
    cpu_event *ce = ev->impl;
    pthread_mutex_lock(&ce->lock);
    uint64_t gen = ce->recorded;
    pthread_mutex_unlock(&ce->lock);
    if (gen == 0) return ZO_OK; /* never recorded: nothing to wait for */
    cpu_args args = {.event = {.ev = ce, .gen = gen}};
    return submit(s, run_event_wait, "gpu_stream_wait_event", &args);
}

static int cpu_event_query(gpu_event_t ev)
{
    cpu_event *ce = ev->impl;
    pthread_mutex_lock(&ce->lock);
    int done = ce->completed >= ce->recorded;
    pthread_mutex_unlock(&ce->lock);
    return done;
}

static zo_status cpu_event_synchronize(gpu_event_t ev)
{
    cpu_event *ce = ev->impl;
    pthread_mutex_lock(&ce->lock);
    uint64_t target = ce->recorded;
    while (ce->completed < target) pthread_cond_wait(&ce->done, &ce->lock);
    pthread_mutex_unlock(&ce->lock);
    return ZO_OK;
}

static zo_status cpu_event_elapsed(gpu_event_t start, gpu_event_t end, double *ms)
{
    cpu_event *a = start->impl, *b = end->impl;
    pthread_mutex_lock(&a->lock);
    double t0 = a->t_done;
    pthread_mutex_unlock(&a->lock);
    pthread_mutex_lock(&b->lock);
    double t1 = b->t_done;
    pthread_mutex_unlock(&b->lock);
    *ms = (t1 - t0) * 1e3;
    return ZO_OK;
}

static zo_status run_host_func(cpu_cmd *cmd, int nt)
{
    (void)nt;
    cmd->u.host.fn(cmd->u.host.arg);
    return ZO_OK;
}

static zo_status cpu_launch_host_func(gpu_stream_t s, gpu_host_fn fn, void *arg)
{
    cpu_args args = {.host = {.fn = fn, .arg = arg}};
    return submit(s, run_host_func, "gpu_launch_host_func", &args);
}

/* ---- copies and stream-ordered free ------------------------------------------------------ */

static zo_status run_memcpy(cpu_cmd *cmd, int nt)
{
    (void)nt;
    memmove(cmd->u.mem.dst, cmd->u.mem.src, cmd->u.mem.bytes);
    return ZO_OK;
}

static zo_status cpu_memcpy_async(gpu_stream_t s, void *dst, const void *src, size_t bytes,
                                  gpu_copy_kind kind)
{
    (void)kind; /* one address space */
    if (fault_copy(ctx_of(s->dev)))
        return zo_error(ZO_ERR_DEVICE, "gpu_memcpy_async: a copy of %zu bytes failed (injected)", bytes);
    cpu_args args = {.mem = {.dst = dst, .src = src, .bytes = bytes}};
    return submit(s, run_memcpy, "gpu_memcpy_async", &args);
}

static zo_status run_memset(cpu_cmd *cmd, int nt)
{
    (void)nt;
    memset(cmd->u.mem.dst, cmd->u.mem.value, cmd->u.mem.bytes);
    return ZO_OK;
}

static zo_status cpu_memset_async(gpu_stream_t s, void *dst, int value, size_t bytes)
{
    cpu_args args = {.mem = {.dst = dst, .value = value, .bytes = bytes}};
    return submit(s, run_memset, "gpu_memset_async", &args);
}

static zo_status run_free(cpu_cmd *cmd, int nt)
{
    (void)nt;
    cpu_mem_free(cmd->dev, cmd->u.free.p);
    return ZO_OK;
}

static zo_status cpu_mem_free_async(gpu_device_t dev, void *p, gpu_stream_t s)
{
    (void)dev;
    cpu_args args = {.free = {.p = p}};
    return submit(s, run_free, "gpu_mem_free_async", &args);
}

/* ---- ops: the CPU column of the op table (gpu/ops.h): each unpacks its
 * slots for its kernel in ops_cpu.c ---------------------------------------------------- */

typedef zo_status (*cpu_op_fn)(cpu_scratch *ws, const gpu_op_args *a, int nt);

static zo_status cpu_run_gemm(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    gpu_gemm_desc d = a->d.gemm;
    d.a = a->t[0], d.b = a->t[1], d.c = a->t[2];
    return cpu_gemm(ws, &d, nt);
}

static zo_status cpu_run_bias_forward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return cpu_bias_forward(ws, a->t[0], a->t[1], (int)a->i[0], (int)a->i[1], a->i[2], nt);
}

static zo_status cpu_run_bias_backward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_bias_backward(a->t[0], a->t[1], (int)a->i[0], (int)a->i[1], a->i[2], nt);
    return ZO_OK;
}

static zo_status cpu_run_layernorm_forward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return cpu_layernorm_forward(ws, a->t[0], a->p[0], a->p[1], a->t[1], a->t[2], a->t[3],
                                 (int)a->i[0], (int)a->i[1], a->f[0], nt);
}

static zo_status cpu_run_layernorm_backward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return cpu_layernorm_backward(ws, a->t[0], a->t[1], a->t[2], a->t[3], a->t[4], a->t[5],
                                  a->p[0], a->p[1], (int)a->i[0], (int)a->i[1], nt);
}

static zo_status cpu_run_rmsnorm_forward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return cpu_rmsnorm_forward(ws, a->t[0], a->p[0], a->t[1], a->t[2], (int)a->i[0],
                               (int)a->i[1], a->f[0], nt);
}

static zo_status cpu_run_rmsnorm_backward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return cpu_rmsnorm_backward(ws, a->t[0], a->t[1], a->t[2], a->t[3], a->t[4], a->p[0],
                                (int)a->i[0], (int)a->i[1], nt);
}

static zo_status cpu_run_head_norm_forward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return cpu_head_norm_forward(ws, a->t[0], a->i[3], a->t[2], a->p[0], a->t[1], a->i[4], (int)a->i[0],
                                 (int)a->i[1], (int)a->i[2], a->f[0], (int)a->i[5], nt);
}

static zo_status cpu_run_head_norm_backward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return cpu_head_norm_backward(ws, a->t[0], a->i[3], a->t[1], a->t[2], a->t[3], a->i[4], a->p[0],
                                  (int)a->i[0], (int)a->i[1], (int)a->i[2], (int)a->i[5], nt);
}

/* The desc with its sinks from the slots p[1], p[2] (gpu/ops.h) */
static gpu_attn_desc attn_with_sinks(const gpu_op_args *a, int backward)
{
    gpu_attn_desc d = a->d.attn;
    d.sinks = a->p[1];
    d.dsinks = backward ? a->p[2] : NULL;
    return d;
}

static zo_status cpu_run_attention_forward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    gpu_attn_desc d = attn_with_sinks(a, 0);
    return cpu_attention_forward(ws, &d, a->t[0], a->p[0], a->t[1], nt);
}

static zo_status cpu_run_attention_backward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    gpu_attn_desc d = attn_with_sinks(a, 1);
    return cpu_attention_backward(ws, &d, a->t[0], a->t[1], a->t[2], a->t[3], a->p[0], nt);
}

static zo_status cpu_run_attention_cached(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    gpu_attn_desc d = attn_with_sinks(a, 0);
    return cpu_attention_cached(ws, &d, a->t[0], a->t[1], a->t[2], a->t[3], a->p[0], (int)a->i[0], nt);
}

static zo_status rope(cpu_scratch *ws, const gpu_op_args *a, int inverse, int nt)
{
    return cpu_rope(ws, a->t[0], (int)a->i[0], (int)a->i[1], (int)a->i[2], (int)a->i[3], a->i[4],
                    a->i[6], a->f[0], (int)a->i[5], a->p[1], (int)a->i[7], a->p[0], a->f[1], inverse, nt);
}

static zo_status cpu_run_rope_forward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return rope(ws, a, 0, nt);
}

static zo_status cpu_run_rope_backward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return rope(ws, a, 1, nt);
}

static zo_status cpu_run_gelu_forward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_gelu_forward(a->t[0], a->t[1], a->n, (int)a->i[0], nt);
    return ZO_OK;
}

static zo_status cpu_run_gelu_backward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_gelu_backward(a->t[0], a->t[1], a->t[2], a->n, (int)a->i[0], nt);
    return ZO_OK;
}

static zo_status cpu_run_swiglu_forward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_swiglu_forward(a->t[0], a->t[1], a->t[2], a->n, (int)a->i[0], a->f[0], a->f[1], nt);
    return ZO_OK;
}

static zo_status cpu_run_swiglu_backward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_swiglu_backward(a->t[0], a->t[1], a->t[2], a->t[3], a->t[4], a->n, (int)a->i[0], a->f[0], a->f[1], nt);
    return ZO_OK;
}

static zo_status cpu_run_moe_router_forward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    const gpu_moe_gate g = {.mode = (gpu_moe_route)a->i[3], .eps = a->f[1], .groups = (int)a->i[5],
                            .topk_groups = (int)a->i[6], .scale = a->f[2], .bias = a->p[2]};
    return cpu_moe_router_forward(ws, a->t[0], a->t[1], a->p[0], a->p[1], (int)a->i[0], (int)a->i[1],
                                  (int)a->i[2], &g, (int)a->i[4], nt);
}

static zo_status cpu_run_moe_router_backward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    const gpu_moe_gate g = {.mode = (gpu_moe_route)a->i[3], .eps = a->f[1], .groups = (int)a->i[6],
                            .topk_groups = (int)a->i[7], .scale = a->f[2], .bias = a->p[1]};
    return cpu_moe_router_backward(ws, a->t[0], a->t[1], a->t[2], a->p[0], (int)a->i[0],
                                   (int)a->i[1], (int)a->i[2], &g, (int)a->i[4], (int)a->i[5], a->f[0], nt);
}

static zo_status cpu_run_moe_scale_forward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_moe_scale_forward(a->t[0], a->t[1], a->p[0], (int)a->i[0], (int)a->i[1], a->i[2],
                          (int)a->i[3], nt);
    return ZO_OK;
}

static zo_status cpu_run_moe_scale_backward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_moe_scale_backward(a->t[0], a->p[0], a->t[1], a->t[2], a->p[1], (int)a->i[0],
                           (int)a->i[1], a->i[2], (int)a->i[3], nt);
    return ZO_OK;
}

static zo_status cpu_run_head_copy(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_head_copy(a->t[0], a->t[1], (int)a->i[0], (int)a->i[1], (int)a->i[2], (int)a->i[3], a->i[4], a->i[5],
                  a->i[6], a->i[7], nt);
    return ZO_OK;
}

static zo_status cpu_run_moe_gather(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_moe_gather(a->t[0], a->t[1], a->p[0], (int)a->i[0], (int)a->i[1], nt);
    return ZO_OK;
}

static zo_status cpu_run_moe_scatter_add(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_moe_scatter_add(a->t[0], a->t[1], a->p[0], (int)a->i[0], (int)a->i[1], a->i[2], nt);
    return ZO_OK;
}

static zo_status cpu_run_embedding_forward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return cpu_embedding_forward(ws, a->t[0], a->p[0], a->t[1], a->t[2], a->p[1], (int)a->i[4], (int)a->i[0],
                                 (int)a->i[1], (int)a->i[2], (int)a->i[3], nt);
}

static zo_status cpu_run_embedding_backward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return cpu_embedding_backward(ws, a->t[0], a->t[1], a->t[2], a->p[0], (int)a->i[0],
                                  (int)a->i[1], (int)a->i[2], (int)a->i[3], nt);
}

static zo_status cpu_run_cross_entropy_forward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return cpu_cross_entropy_forward(ws, a->p[0], a->t[0], a->p[1], (int)a->i[0], (int)a->i[1],
                                     a->f[0], nt);
}

static zo_status cpu_run_cross_entropy_backward(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return cpu_cross_entropy_backward(ws, a->t[0], a->t[1], a->p[0], a->f[0], (int)a->i[0],
                                      (int)a->i[1], a->f[1], nt);
}

static zo_status cpu_run_add(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_add(a->t[0], a->t[1], a->t[2], a->n, nt);
    return ZO_OK;
}

static zo_status cpu_run_scale(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_scale(a->t[0], a->f[0], a->n, nt);
    return ZO_OK;
}

static zo_status cpu_run_softcap(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_softcap(a->t[0], a->f[0], a->n, nt);
    return ZO_OK;
}

static zo_status cpu_run_cast(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_cast(a->t[0], a->t[1], a->n, nt);
    return ZO_OK;
}

static zo_status cpu_run_check_finite(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_check_finite(a->p[0], a->t[0], a->n, nt);
    return ZO_OK;
}

static zo_status cpu_run_sum_squares(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    return cpu_sum_squares(ws, a->p[0], a->t[0], a->n, nt);
}

static zo_status cpu_run_nf4_dequantize(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_nf4_dequantize(a->t[0], a->p[0], a->n, nt);
    return ZO_OK;
}

static zo_status cpu_run_adam_update(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_adam_update(&a->d.adam, a->n, a->p[0], a->t[0], a->p[1], a->p[2], a->t[1], nt);
    return ZO_OK;
}

static zo_status cpu_run_adam_state_update(cpu_scratch *ws, const gpu_op_args *a, int nt)
{
    (void)ws;
    cpu_adam_state_update(&a->d.astate, a->n, a->t[0], a->t[1], a->p[0], a->t[2], a->p[1], nt);
    return ZO_OK;
}

static const cpu_op_fn cpu_ops[GPU_OP_COUNT] = {
#define CPU_OP(ID, name, slots, check) [GPU_OP_##ID] = cpu_run_##name,
    GPU_OP_TABLE(CPU_OP)
#undef CPU_OP
};

static zo_status run_op(cpu_cmd *c, int nt)
{
    return cpu_ops[c->u.op.id](c->ws, &c->u.op.a, nt);
}

/* Every op is a command that runs its kernel on the stream's worker. */
static zo_status cpu_op(gpu_stream_t s, gpu_op_id id, const gpu_op_args *a)
{
    cpu_args args = {.op = {.id = id, .a = *a}};
    return submit(s, run_op, gpu_op_infos[id].name, &args);
}

/* ---- the device -------------------------------------------------------------------------- */

static void cpu_free(gpu_device_t dev)
{
    cpu_ctx *c = ctx_of(dev);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static const gpu_backend_iface cpu_iface = {
    .name = "cpu",
    .free = cpu_free,
    .synchronize = cpu_synchronize,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .mem_free_async = cpu_mem_free_async,
    .mem_get_stats = cpu_mem_get_stats,
    .mem_reset_peak = cpu_mem_reset_peak,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_synchronize = cpu_stream_synchronize,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_query = cpu_event_query,
    .event_synchronize = cpu_event_synchronize,
    .event_elapsed = cpu_event_elapsed,
    .launch_host_func = cpu_launch_host_func,
    .memcpy_async = cpu_memcpy_async,
    .memset_async = cpu_memset_async,
    .op = cpu_op,
};

zo_status gpu_cpu_inject_faults(gpu_device_t dev, const gpu_cpu_faults *f)
{
    if (!dev || !f) return zo_error(ZO_ERR_INVALID, "gpu_cpu_inject_faults: NULL argument");
    if (dev->iface != &cpu_iface)
        return zo_error(ZO_ERR_INVALID, "gpu_cpu_inject_faults: device \"%s\" is not a cpu "
                                        "device", dev->iface->name);
    cpu_ctx *c = ctx_of(dev);
    pthread_mutex_lock(&c->lock);
    c->faults = *f;
    pthread_mutex_unlock(&c->lock);
    return ZO_OK;
}

zo_status gpu_device_init_cpu(const gpu_cpu_options *opt, gpu_device_t *out)
{
    if (!out) return zo_error(ZO_ERR_INVALID, "gpu_device_init_cpu: NULL output");
    *out = NULL;
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return zo_error(ZO_ERR_NOMEM, "gpu_device_init_cpu: out of host memory");
    pthread_mutex_init(&c->lock, NULL);
    c->capacity = opt ? opt->capacity : 0;
    c->n_threads = opt && opt->n_threads > 0 ? opt->n_threads : 0;
    c->tf32 = opt && opt->tf32;
    zo_status st = gpu_device_wrap(&cpu_iface, c, out);
    if (st != ZO_OK) goto out_free_ctx;
    return ZO_OK;

out_free_ctx:
    pthread_mutex_destroy(&c->lock);
    free(c);
    return st;
}
