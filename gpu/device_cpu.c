/* The CPU backend: "device" memory from a pool with a capacity, one worker
 * thread per stream running its queue in order, events that order work
 * across streams, and the kernels of ops_cpu.c enqueued as commands. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/device_impl.h" /* defines: gpu_backend_iface, struct gpu_stream/event */
#include "gpu/ops_cpu.h"     /* defines: cpu_gemm, cpu_attention_forward, ... */

#define POOL_ALIGN 256u
#define ALLOC_MAGIC 0x5a4f44455649434full /* "ZODEVICO" */

typedef struct cpu_ctx {
    pthread_mutex_t lock; /* guards the counters and the fault plan below */
    size_t capacity, in_use, high_water, n_allocs, host_pinned;
    int n_threads;
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

/* ---- memory ---------------------------------------------------------------- */

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
 * its bytes can be counted. */
static zo_status cpu_host_alloc(gpu_device_t dev, size_t bytes, void **out)
{
    cpu_ctx *c = ctx_of(dev);
    if (bytes > SIZE_MAX - 2 * POOL_ALIGN)
        return zo_error(ZO_ERR_NOMEM, "gpu_host_alloc: %zu bytes is too large", bytes);
    size_t rounded = (bytes + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
    if (fault_alloc(c))
        return zo_error(ZO_ERR_NOMEM, "gpu_host_alloc: %zu bytes failed (injected)", rounded);
    char *base = aligned_alloc(POOL_ALIGN, rounded + POOL_ALIGN);
    if (!base) return zo_error(ZO_ERR_NOMEM, "gpu_host_alloc: %zu bytes failed", rounded);
    alloc_header *h = (alloc_header *)base;
    h->magic = ALLOC_MAGIC ^ 1u;
    h->bytes = rounded;
    pthread_mutex_lock(&c->lock);
    c->host_pinned += rounded;
    pthread_mutex_unlock(&c->lock);
    *out = base + POOL_ALIGN;
    return ZO_OK;
}

static void cpu_host_free(gpu_device_t dev, void *p)
{
    cpu_ctx *c = ctx_of(dev);
    char *base = (char *)p - POOL_ALIGN;
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
    gpu_gemm_desc gemm;
    struct { gpu_attn_desc a; gpu_tensor t0, t1, t2, t3; float *f0; const float *cf0; } attn;
    struct {
        gpu_adam_consts c;
        size_t n;
        float *param, *m, *v;
        gpu_tensor grad, out16;
    } adam;
    struct {
        gpu_tensor t[6];
        float *f[2];
        const float *cf[2];
        const int32_t *ids;
        const void *cp; /* a read-only buffer (an NF4 tensor) */
        int32_t *flag;
        int i[6];
        int64_t l;
        float x;
        size_t n;
    } op;
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
} cpu_event;

static void *stream_worker(void *arg)
{
    cpu_stream *cs = arg;
    pthread_mutex_lock(&cs->lock);
    for (;;) {
        while (!cs->head && !cs->stop) pthread_cond_wait(&cs->work, &cs->lock);
        if (!cs->head) break; /* stop with an empty queue */
        cpu_cmd *cmd = cs->head;
        pthread_mutex_unlock(&cs->lock);

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

/* Append a command (allocated by new_cmd) and wake the worker. */
static zo_status enqueue(gpu_stream_t s, cpu_cmd *cmd)
{
    cpu_stream *cs = s->impl;
    pthread_mutex_lock(&cs->lock);
    if (cs->tail)
        cs->tail->next = cmd;
    else
        cs->head = cmd;
    cs->tail = cmd;
    cs->submitted++;
    pthread_cond_signal(&cs->work);
    pthread_mutex_unlock(&cs->lock);
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
    pthread_mutex_lock(&ce->lock);
    if (cmd->u.event.gen > ce->completed) ce->completed = cmd->u.event.gen;
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

/* ---- ops: each packs its arguments into a command run by the worker ----------------------- */

static zo_status run_gemm(cpu_cmd *c, int nt)
{
    return cpu_gemm(c->ws, &c->u.gemm, nt);
}

static zo_status cpu_op_gemm(gpu_stream_t s, const gpu_gemm_desc *d)
{
    cpu_args args = {.gemm = *d};
    return submit(s, run_gemm, "gpu_gemm", &args);
}

#define OP (c->u.op)

static zo_status run_bias_forward(cpu_cmd *c, int nt)
{
    return cpu_bias_forward(c->ws, OP.t[0], OP.t[1], OP.i[0], OP.i[1], OP.l, nt);
}

static zo_status cpu_op_bias_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor bias, int n, int c,
                                     int64_t ldy)
{
    cpu_args args = {.op = {.t = {y, bias}, .i = {n, c}, .l = ldy}};
    return submit(s, run_bias_forward, "gpu_bias_forward", &args);
}

static zo_status run_bias_backward(cpu_cmd *c, int nt)
{
    cpu_bias_backward(OP.t[0], OP.t[1], OP.i[0], OP.i[1], OP.l, nt);
    return ZO_OK;
}

static zo_status cpu_op_bias_backward(gpu_stream_t s, gpu_tensor dbias, gpu_tensor dy, int n,
                                      int c, int64_t lddy)
{
    cpu_args args = {.op = {.t = {dbias, dy}, .i = {n, c}, .l = lddy}};
    return submit(s, run_bias_backward, "gpu_bias_backward", &args);
}

static zo_status run_layernorm_forward(cpu_cmd *c, int nt)
{
    return cpu_layernorm_forward(c->ws, OP.t[0], OP.f[0], OP.f[1], OP.t[1], OP.t[2], OP.t[3],
                                 OP.i[0], OP.i[1], OP.x, nt);
}

static zo_status cpu_op_layernorm_forward(gpu_stream_t s, gpu_tensor y, float *mean, float *rstd,
                                          gpu_tensor x, gpu_tensor w, gpu_tensor b, int n, int c,
                                          float eps)
{
    cpu_args args = {.op = {.t = {y, x, w, b}, .f = {mean, rstd}, .i = {n, c}, .x = eps}};
    return submit(s, run_layernorm_forward, "gpu_layernorm_forward", &args);
}

static zo_status run_layernorm_backward(cpu_cmd *c, int nt)
{
    return cpu_layernorm_backward(c->ws, OP.t[0], OP.t[1], OP.t[2], OP.t[3], OP.t[4], OP.t[5],
                                  OP.cf[0], OP.cf[1], OP.i[0], OP.i[1], nt);
}

static zo_status cpu_op_layernorm_backward(gpu_stream_t s, gpu_tensor dx, gpu_tensor dw,
                                           gpu_tensor db, gpu_tensor dy, gpu_tensor x,
                                           gpu_tensor w, const float *mean, const float *rstd,
                                           int n, int c)
{
    cpu_args args = {.op = {.t = {dx, dw, db, dy, x, w}, .cf = {mean, rstd}, .i = {n, c}}};
    return submit(s, run_layernorm_backward, "gpu_layernorm_backward", &args);
}

static zo_status run_rmsnorm_forward(cpu_cmd *c, int nt)
{
    return cpu_rmsnorm_forward(c->ws, OP.t[0], OP.f[0], OP.t[1], OP.t[2], OP.i[0], OP.i[1], OP.x,
                               nt);
}

static zo_status cpu_op_rmsnorm_forward(gpu_stream_t s, gpu_tensor y, float *rstd, gpu_tensor x,
                                        gpu_tensor w, int n, int c, float eps)
{
    cpu_args args = {.op = {.t = {y, x, w}, .f = {rstd}, .i = {n, c}, .x = eps}};
    return submit(s, run_rmsnorm_forward, "gpu_rmsnorm_forward", &args);
}

static zo_status run_rmsnorm_backward(cpu_cmd *c, int nt)
{
    return cpu_rmsnorm_backward(c->ws, OP.t[0], OP.t[1], OP.t[2], OP.t[3], OP.t[4], OP.cf[0],
                                OP.i[0], OP.i[1], nt);
}

static zo_status cpu_op_rmsnorm_backward(gpu_stream_t s, gpu_tensor dx, gpu_tensor dw,
                                         gpu_tensor dy, gpu_tensor x, gpu_tensor w,
                                         const float *rstd, int n, int c)
{
    cpu_args args = {.op = {.t = {dx, dw, dy, x, w}, .cf = {rstd}, .i = {n, c}}};
    return submit(s, run_rmsnorm_backward, "gpu_rmsnorm_backward", &args);
}

#define AT (c->u.attn)

static zo_status run_attention_forward(cpu_cmd *c, int nt)
{
    return cpu_attention_forward(c->ws, &AT.a, AT.t0, AT.f0, AT.t1, nt);
}

static zo_status cpu_op_attention_forward(gpu_stream_t s, const gpu_attn_desc *a, gpu_tensor out,
                                          float *lse, gpu_tensor qkv)
{
    cpu_args args = {.attn = {.a = *a, .t0 = out, .t1 = qkv, .f0 = lse}};
    return submit(s, run_attention_forward, "gpu_attention_forward", &args);
}

static zo_status run_attention_backward(cpu_cmd *c, int nt)
{
    return cpu_attention_backward(c->ws, &AT.a, AT.t0, AT.t1, AT.t2, AT.t3, AT.cf0, nt);
}

static zo_status cpu_op_attention_backward(gpu_stream_t s, const gpu_attn_desc *a,
                                           gpu_tensor dqkv, gpu_tensor dout, gpu_tensor qkv,
                                           gpu_tensor out, const float *lse)
{
    cpu_args args = {.attn = {.a = *a, .t0 = dqkv, .t1 = dout, .t2 = qkv, .t3 = out, .cf0 = lse}};
    return submit(s, run_attention_backward, "gpu_attention_backward", &args);
}

static zo_status run_rope(cpu_cmd *c, int nt)
{
    return cpu_rope(c->ws, OP.t[0], OP.i[0], OP.i[1], OP.i[2], OP.i[3], OP.l, OP.x, OP.i[4],
                    OP.i[5], nt);
}

static zo_status cpu_op_rope(gpu_stream_t s, gpu_tensor x, int n, int t, int n_heads, int d,
                             int64_t ldx, float theta, int pos0, int inverse)
{
    cpu_args args = {.op = {.t = {x}, .i = {n, t, n_heads, d, pos0, inverse}, .l = ldx,
                      .x = theta}};
    return submit(s, run_rope, "gpu_rope", &args);
}

static zo_status run_gelu_forward(cpu_cmd *c, int nt)
{
    cpu_gelu_forward(OP.t[0], OP.t[1], OP.n, nt);
    return ZO_OK;
}

static zo_status cpu_op_gelu_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor x, size_t n)
{
    cpu_args args = {.op = {.t = {y, x}, .n = n}};
    return submit(s, run_gelu_forward, "gpu_gelu_forward", &args);
}

static zo_status run_gelu_backward(cpu_cmd *c, int nt)
{
    cpu_gelu_backward(OP.t[0], OP.t[1], OP.t[2], OP.n, nt);
    return ZO_OK;
}

static zo_status cpu_op_gelu_backward(gpu_stream_t s, gpu_tensor dx, gpu_tensor dy, gpu_tensor x,
                                      size_t n)
{
    cpu_args args = {.op = {.t = {dx, dy, x}, .n = n}};
    return submit(s, run_gelu_backward, "gpu_gelu_backward", &args);
}

static zo_status run_swiglu_forward(cpu_cmd *c, int nt)
{
    cpu_swiglu_forward(OP.t[0], OP.t[1], OP.t[2], OP.n, nt);
    return ZO_OK;
}

static zo_status cpu_op_swiglu_forward(gpu_stream_t s, gpu_tensor y, gpu_tensor gate,
                                       gpu_tensor up, size_t n)
{
    cpu_args args = {.op = {.t = {y, gate, up}, .n = n}};
    return submit(s, run_swiglu_forward, "gpu_swiglu_forward", &args);
}

static zo_status run_swiglu_backward(cpu_cmd *c, int nt)
{
    cpu_swiglu_backward(OP.t[0], OP.t[1], OP.t[2], OP.t[3], OP.t[4], OP.n, nt);
    return ZO_OK;
}

static zo_status cpu_op_swiglu_backward(gpu_stream_t s, gpu_tensor dgate, gpu_tensor dup,
                                        gpu_tensor dy, gpu_tensor gate, gpu_tensor up, size_t n)
{
    cpu_args args = {.op = {.t = {dgate, dup, dy, gate, up}, .n = n}};
    return submit(s, run_swiglu_backward, "gpu_swiglu_backward", &args);
}

static zo_status run_embedding_forward(cpu_cmd *c, int nt)
{
    return cpu_embedding_forward(c->ws, OP.t[0], OP.ids, OP.t[1], OP.t[2], OP.i[0], OP.i[1],
                                 OP.i[2], OP.i[3], nt);
}

static zo_status cpu_op_embedding_forward(gpu_stream_t s, gpu_tensor out, const int32_t *tokens,
                                          gpu_tensor wte, gpu_tensor wpe, int n, int t, int c,
                                          int vocab)
{
    cpu_args args = {.op = {.t = {out, wte, wpe}, .ids = tokens, .i = {n, t, c, vocab}}};
    return submit(s, run_embedding_forward, "gpu_embedding_forward", &args);
}

static zo_status run_embedding_backward(cpu_cmd *c, int nt)
{
    return cpu_embedding_backward(OP.t[0], OP.t[1], OP.t[2], OP.ids, OP.i[0], OP.i[1], OP.i[2],
                                  OP.i[3], nt);
}

static zo_status cpu_op_embedding_backward(gpu_stream_t s, gpu_tensor dwte, gpu_tensor dwpe,
                                           gpu_tensor dout, const int32_t *tokens, int n, int t,
                                           int c, int vocab)
{
    cpu_args args = {.op = {.t = {dwte, dwpe, dout}, .ids = tokens, .i = {n, t, c, vocab}}};
    return submit(s, run_embedding_backward, "gpu_embedding_backward", &args);
}

static zo_status run_ce_forward(cpu_cmd *c, int nt)
{
    return cpu_cross_entropy_forward(c->ws, OP.f[0], OP.t[0], OP.ids, OP.i[0], OP.i[1], nt);
}

static zo_status cpu_op_ce_forward(gpu_stream_t s, float *losses, gpu_tensor logits,
                                   const int32_t *targets, int n, int v)
{
    cpu_args args = {.op = {.f = {losses}, .t = {logits}, .ids = targets, .i = {n, v}}};
    return submit(s, run_ce_forward, "gpu_cross_entropy_forward", &args);
}

static zo_status run_ce_backward(cpu_cmd *c, int nt)
{
    return cpu_cross_entropy_backward(c->ws, OP.t[0], OP.t[1], OP.ids, OP.x, OP.i[0], OP.i[1], nt);
}

static zo_status cpu_op_ce_backward(gpu_stream_t s, gpu_tensor dlogits, gpu_tensor logits,
                                    const int32_t *targets, float dloss, int n, int v)
{
    cpu_args args = {.op = {.t = {dlogits, logits}, .ids = targets, .x = dloss, .i = {n, v}}};
    return submit(s, run_ce_backward, "gpu_cross_entropy_backward", &args);
}

static zo_status run_add(cpu_cmd *c, int nt)
{
    cpu_add(OP.t[0], OP.t[1], OP.t[2], OP.n, nt);
    return ZO_OK;
}

static zo_status cpu_op_add(gpu_stream_t s, gpu_tensor y, gpu_tensor a, gpu_tensor b, size_t n)
{
    cpu_args args = {.op = {.t = {y, a, b}, .n = n}};
    return submit(s, run_add, "gpu_add", &args);
}

static zo_status run_scale(cpu_cmd *c, int nt)
{
    cpu_scale(OP.t[0], OP.x, OP.n, nt);
    return ZO_OK;
}

static zo_status cpu_op_scale(gpu_stream_t s, gpu_tensor x, float alpha, size_t n)
{
    cpu_args args = {.op = {.t = {x}, .x = alpha, .n = n}};
    return submit(s, run_scale, "gpu_scale", &args);
}

static zo_status run_cast(cpu_cmd *c, int nt)
{
    cpu_cast(OP.t[0], OP.t[1], OP.n, nt);
    return ZO_OK;
}

static zo_status cpu_op_cast(gpu_stream_t s, gpu_tensor dst, gpu_tensor src, size_t n)
{
    cpu_args args = {.op = {.t = {dst, src}, .n = n}};
    return submit(s, run_cast, "gpu_cast", &args);
}

static zo_status run_check_finite(cpu_cmd *c, int nt)
{
    cpu_check_finite(OP.flag, OP.t[0], OP.n, nt);
    return ZO_OK;
}

static zo_status cpu_op_check_finite(gpu_stream_t s, int32_t *flag, gpu_tensor x, size_t n)
{
    cpu_args args = {.op = {.flag = flag, .t = {x}, .n = n}};
    return submit(s, run_check_finite, "gpu_check_finite", &args);
}

static zo_status run_sum_squares(cpu_cmd *c, int nt)
{
    return cpu_sum_squares(c->ws, OP.f[0], OP.t[0], OP.n, nt);
}

static zo_status cpu_op_sum_squares(gpu_stream_t s, float *sum, gpu_tensor x, size_t n)
{
    cpu_args args = {.op = {.f = {sum}, .t = {x}, .n = n}};
    return submit(s, run_sum_squares, "gpu_sum_squares", &args);
}

static zo_status run_nf4_dequantize(cpu_cmd *c, int nt)
{
    cpu_nf4_dequantize(OP.t[0], OP.cp, OP.n, nt);
    return ZO_OK;
}

static zo_status cpu_op_nf4_dequantize(gpu_stream_t s, gpu_tensor out, const void *nf4, size_t n)
{
    cpu_args args = {.op = {.t = {out}, .cp = nf4, .n = n}};
    return submit(s, run_nf4_dequantize, "gpu_nf4_dequantize", &args);
}

static zo_status run_adam_update(cpu_cmd *c, int nt)
{
    cpu_adam_update(&c->u.adam.c, c->u.adam.n, c->u.adam.param, c->u.adam.grad, c->u.adam.m,
                    c->u.adam.v, c->u.adam.out16, nt);
    return ZO_OK;
}

static zo_status cpu_op_adam_update(gpu_stream_t s, const gpu_adam_consts *k, size_t n,
                                    float *param, gpu_tensor grad, float *m, float *v,
                                    gpu_tensor out16)
{
    cpu_args args = {.adam = {.c = *k, .n = n, .param = param, .grad = grad, .m = m, .v = v,
                      .out16 = out16}};
    return submit(s, run_adam_update, "gpu_adam_update", &args);
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
    .launch_host_func = cpu_launch_host_func,
    .memcpy_async = cpu_memcpy_async,
    .memset_async = cpu_memset_async,
    .gemm = cpu_op_gemm,
    .bias_forward = cpu_op_bias_forward,
    .bias_backward = cpu_op_bias_backward,
    .layernorm_forward = cpu_op_layernorm_forward,
    .layernorm_backward = cpu_op_layernorm_backward,
    .rmsnorm_forward = cpu_op_rmsnorm_forward,
    .rmsnorm_backward = cpu_op_rmsnorm_backward,
    .attention_forward = cpu_op_attention_forward,
    .attention_backward = cpu_op_attention_backward,
    .rope = cpu_op_rope,
    .gelu_forward = cpu_op_gelu_forward,
    .gelu_backward = cpu_op_gelu_backward,
    .swiglu_forward = cpu_op_swiglu_forward,
    .swiglu_backward = cpu_op_swiglu_backward,
    .embedding_forward = cpu_op_embedding_forward,
    .embedding_backward = cpu_op_embedding_backward,
    .cross_entropy_forward = cpu_op_ce_forward,
    .cross_entropy_backward = cpu_op_ce_backward,
    .add = cpu_op_add,
    .scale = cpu_op_scale,
    .cast = cpu_op_cast,
    .check_finite = cpu_op_check_finite,
    .sum_squares = cpu_op_sum_squares,
    .nf4_dequantize = cpu_op_nf4_dequantize,
    .adam_update = cpu_op_adam_update,
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
    zo_status st = gpu_device_wrap(&cpu_iface, c, out);
    if (st != ZO_OK) goto out_free_ctx;
    return ZO_OK;

out_free_ctx:
    pthread_mutex_destroy(&c->lock);
    free(c);
    return st;
}
