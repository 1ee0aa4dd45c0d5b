/* The MPI backend: host buffers, one progress thread (the "engine") per
 * process that makes every MPI call.
 *
 * The engine initializes MPI (asking for MPI_THREAD_MULTIPLE, content with
 * less since it alone calls MPI), runs the collectives of every MPI
 * communicator of the process in the order they were issued, each as a
 * nonblocking MPI call polled with MPI_Test until a deadline, and finalizes
 * MPI when the process exits. Between polls it answers the questions of
 * ranks that timed out ("where are you in communicator k?") on a duplicate
 * of MPI_COMM_WORLD kept for that, so a rank that times out can name the
 * ranks that did not arrive and what they were doing.
 *
 * Communicators are known to the other ranks by a key every member derives
 * alike, not by a count of this process's communicators (which differs
 * between ranks once they create different sub-communicators): the n-th
 * communicator over the world (every rank creates those in the same order)
 * hashes n; a sub-communicator hashes its parent's key, the number of the
 * split in the parent's sequence and its color. A sub-communicator's slot
 * also lists its ranks' world ranks, so a rank that times out in it asks
 * only them and names them both ways.
 *
 * comm_split: the engine gathers every parent rank's (color, key, world
 * rank) with MPI_Iallgather, polled to the timeout like a collective (a rank
 * that never arrives is a fault naming it), then calls MPI_Comm_split, which
 * blocks but only once every rank of the parent has arrived.
 *
 * Ordering by device events: the collective is also entered in the stream
 * order of a private stream of comm_options.device: that stream waits for
 * `after`, then a host function marks the collective ready (the engine waits
 * for it before the MPI call), a second host function blocks the stream
 * until the collective completes, and `done` is recorded behind it.
 *
 * 16-bit sums: MPI has no bf16 or fp16 type; the elements travel as
 * MPI_UINT16_T and are added by a user-defined operation that adds in fp32
 * and rounds to nearest even, at every step of MPI's algorithm. */
#include <immintrin.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu/comm_impl.h" /* defines: comm_iface, struct comm, struct comm_request */

#define ENGINE_TICK_S 0.02     /* idle wake-up: answer questions, run watchdogs */
#define ENGINE_SPIN_S 5e-5     /* yield this long before sleeping on a condition */
#define ENGINE_YIELD_S 0.02    /* poll a collective yielding this long, then sleeping */
#define ENGINE_MAX_COMMS 1024  /* communicators a process may register, ever */
#define TAG_QUERY 1
#define TAG_REPLY 2
#define PHASE_UNKNOWN (-1)     /* in a reply: no such communicator here */

typedef enum mpi_ctl {
    CTL_COLLECTIVE = 0,
    CTL_DUP,   /* duplicate MPI_COMM_WORLD for a new communicator */
    CTL_FREE,  /* free a communicator's MPI_Comm */
    CTL_BYTES, /* broadcast host bytes from rank 0 (NCCL's unique id) */
    CTL_SPLIT, /* comm_split: gather the colors, then MPI_Comm_split */
} mpi_ctl;

typedef struct mpi_op {
    struct comm_request base;
    struct mpi_op *next; /* the engine's queue */
    mpi_ctl ctl;
    int ready;           /* its input is ready (the `after` event passed) */
    int complete;
    int stream_refs;     /* host functions on the device stream still to run */
    zo_status status;
    char message[512];
    int *v; /* all_to_all_v: MPI's send counts, displacements, receive counts, displacements;
               split: this rank's (color, key, world rank), then every parent rank's */
    MPI_Comm made; /* split: the new communicator (MPI_COMM_NULL for COMM_SPLIT_NONE) */
    int made_rank, made_size;
} mpi_op;

typedef struct mpi_comm_ctx {
    MPI_Comm comm;
    int id;              /* this process's slot for it */
    uint64_t key;        /* the same on every rank of it */
    int *members;        /* a sub-communicator's world ranks, by rank; NULL: the world */
    gpu_stream_t stream; /* with a device: orders by its events */
} mpi_comm_ctx;

/* Where a communicator of this process is, for the questions of others. */
typedef struct comm_slot {
    int used;
    uint64_t key;  /* how the other ranks name it */
    int *members;  /* world ranks by rank (a copy); NULL: the world */
    int n_members;
    comm_phase phase;
    uint64_t seq;
    comm_op_kind kind;
    comm_watch_fn watch;
    void *watch_arg;
} comm_slot;

typedef struct answer {
    int got;
    int64_t msg[4]; /* comm key, seq, phase, kind */
} answer;

static struct engine {
    pthread_once_t once;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* broadcast on every change below */
    pthread_t thread;
    int started, running, stop;
    zo_status init_status;
    char init_message[512];
    int we_initialized;
    int rank, size;
    mpi_op *head, *tail;
    int abort_requested, abort_code;
    comm_slot slots[ENGINE_MAX_COMMS];
    int n_slots;      /* slots ever used (a freed one is reused) */
    uint64_t n_world; /* communicators over the world created so far */
    /* engine thread only */
    MPI_Comm fault_comm;
    MPI_Op sum_bf16, sum_f16;
    int64_t query_in[4];
    MPI_Request query_req;
    int64_t *reply_out;      /* [size][4] */
    MPI_Request *reply_reqs; /* [size] */
    answer *answers;         /* [size], filled while collecting after a timeout */
    double last_tick;
} E = {.once = PTHREAD_ONCE_INIT,
       .lock = PTHREAD_MUTEX_INITIALIZER,
       .cond = PTHREAD_COND_INITIALIZER};

static mpi_comm_ctx *ctx_of(comm_t c) { return c->ctx; }

static void mpi_message(int rc, char *buf, size_t n)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", rc);
    snprintf(buf, n, "%s", s);
}

/* ---- 16-bit sums: fp32 additions rounded to nearest even ------------------------ */

/* cloned per instruction set: the loops vectorize (8-16 elements a step) */
#define SUM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

SUM_CLONES static void sum_bf16_fn(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = zo_f32_to_bf16(zo_bf16_to_f32(a[i]) + zo_bf16_to_f32(b[i]));
}

/* fp16 through F16C where the CPU has it (same bits as the scalar
 * conversions but for nan payloads: common/dtype.h, test_common); the scalar
 * conversion does not vectorize. */
__attribute__((target("avx,f16c"))) static int sum_f16_f16c(const uint16_t *a, uint16_t *b, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));
        __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));
        _mm_storeu_si128((__m128i *)(b + i),
                         _mm256_cvtps_ph(_mm256_add_ps(x, y), _MM_FROUND_TO_NEAREST_INT |
                                                                   _MM_FROUND_NO_EXC));
    }
    return i;
}

static void sum_f16_fn(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    int i = __builtin_cpu_supports("f16c") ? sum_f16_f16c(a, b, *len) : 0;
    for (; i < *len; i++) b[i] = zo_f32_to_f16(zo_f16_to_f32(a[i]) + zo_f16_to_f32(b[i]));
}

static MPI_Datatype mpi_type(zo_dtype t) { return t == ZO_DTYPE_F32 ? MPI_FLOAT : MPI_UINT16_T; }

static MPI_Op mpi_sum(zo_dtype t)
{
    return t == ZO_DTYPE_BF16 ? E.sum_bf16 : t == ZO_DTYPE_F16 ? E.sum_f16 : MPI_SUM;
}

/* ---- the questions of ranks that timed out ------------------------------------------- */

/* Keys: splitmix64's finalizer over a combination (collisions are as
 * unlikely as in any 64-bit hash). */
static uint64_t key_mix(uint64_t a, uint64_t b)
{
    uint64_t x = a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

#define KEY_WORLD 0x776f726c64ull /* "world" */
#define KEY_NCCL 0x6e63636cull    /* "nccl": a communicator bootstrapped by an MPI one */

static void slot_answer(int64_t comm_key, int64_t out[4])
{
    out[0] = comm_key;
    pthread_mutex_lock(&E.lock);
    const comm_slot *s = NULL;
    for (int i = 0; i < E.n_slots && !s; i++)
        if (E.slots[i].used && E.slots[i].key == (uint64_t)comm_key) s = &E.slots[i];
    if (s) {
        out[1] = (int64_t)s->seq;
        out[2] = s->phase;
        out[3] = s->kind;
    } else {
        out[1] = 0;
        out[2] = PHASE_UNKNOWN;
        out[3] = 0;
    }
    pthread_mutex_unlock(&E.lock);
}

/* Handle what arrived on the fault channel: answer questions, keep answers. */
static void poll_questions(void)
{
    for (;;) {
        int flag = 0;
        MPI_Status status;
        if (MPI_Test(&E.query_req, &flag, &status) != MPI_SUCCESS || !flag) return;
        int src = status.MPI_SOURCE;
        if (status.MPI_TAG == TAG_QUERY && src >= 0 && src < E.size) {
            /* one answer in flight per asker: a second question meets the first answer */
            int sent = 1;
            if (E.reply_reqs[src] != MPI_REQUEST_NULL)
                MPI_Test(&E.reply_reqs[src], &sent, MPI_STATUS_IGNORE);
            if (sent) {
                slot_answer(E.query_in[0], &E.reply_out[4 * src]);
                MPI_Isend(&E.reply_out[4 * src], 4, MPI_INT64_T, src, TAG_REPLY, E.fault_comm,
                          &E.reply_reqs[src]);
            }
        } else if (status.MPI_TAG == TAG_REPLY && src >= 0 && src < E.size && E.answers) {
            E.answers[src].got = 1;
            memcpy(E.answers[src].msg, E.query_in, sizeof E.query_in);
        }
        MPI_Irecv(E.query_in, 4, MPI_INT64_T, MPI_ANY_SOURCE, MPI_ANY_TAG, E.fault_comm,
                  &E.query_req);
    }
}

static void describe_answer(const answer *a, uint64_t seq, char *buf, size_t n)
{
    if (!a->got) {
        snprintf(buf, n, "no answer: dead or stopped");
        return;
    }
    unsigned long long s = (unsigned long long)a->msg[1];
    const char *kind = comm_op_name((comm_op_kind)a->msg[3]);
    switch (a->msg[2]) {
    case COMM_PHASE_RUNNING:
        if (s == 0)
            snprintf(buf, n, "in comm_init");
        else
            snprintf(buf, n, "in %s #%llu", kind, s);
        break;
    case COMM_PHASE_WAITING:
        snprintf(buf, n, "waiting for the input of %s #%llu", kind, s);
        break;
    case COMM_PHASE_IDLE:
        if (s == 0)
            snprintf(buf, n, "before its first collective");
        else if (s + 1 == seq)
            snprintf(buf, n, "not in it: busy elsewhere after %s #%llu", kind, s);
        else
            snprintf(buf, n, "idle after %s #%llu", kind, s);
        break;
    default: snprintf(buf, n, "does not have this communicator"); break;
    }
}

/* A rank that is in collective `seq`, or past it, has arrived. */
static int arrived_at(const int64_t msg[4], uint64_t seq)
{
    uint64_t s = (uint64_t)msg[1];
    switch (msg[2]) {
    case COMM_PHASE_RUNNING:
    case COMM_PHASE_IDLE: return s >= seq;
    case COMM_PHASE_WAITING: return s > seq;
    default: return 0;
    }
}

__attribute__((noreturn)) static void engine_mpi_abort(int code)
{
    MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code); /* MPI_Abort should not return */
}

void comm_mpi_fail(comm_t c, const char *message)
{
    comm_report_fault(c, message);
    engine_mpi_abort(1);
}

void comm_mpi_fault(comm_t c, int id, uint64_t seq, const char *what)
{
    /* The communicator's key and ranks (world ranks by rank; the world's
     * are themselves). */
    pthread_mutex_lock(&E.lock);
    const comm_slot *slot = &E.slots[id];
    uint64_t key = slot->key;
    int world = !slot->members, n = world ? E.size : slot->n_members;
    int *member = malloc((size_t)n * sizeof *member);
    for (int p = 0; member && p < n; p++) member[p] = world ? p : slot->members[p];
    pthread_mutex_unlock(&E.lock);
    if (!member) engine_mpi_abort(1);
    /* Ask every other rank of it where it is in it. */
    int64_t *q = calloc((size_t)E.size * 4, sizeof *q);
    MPI_Request *qr = calloc((size_t)E.size, sizeof *qr);
    E.answers = calloc((size_t)E.size, sizeof *E.answers);
    double grace = c->timeout_s * 0.5;
    if (grace > 2.0) grace = 2.0;
    if (grace < 0.2) grace = 0.2;
    if (q && qr && E.answers) {
        for (int p = 0; p < E.size; p++) qr[p] = MPI_REQUEST_NULL;
        for (int i = 0; i < n; i++) {
            int p = member[i];
            if (p == E.rank) continue;
            q[4 * p] = (int64_t)key;
            q[4 * p + 1] = (int64_t)seq;
            MPI_Isend(&q[4 * p], 4, MPI_INT64_T, p, TAG_QUERY, E.fault_comm, &qr[p]);
        }
        double end = zo_now() + grace;
        for (;;) {
            poll_questions();
            int all = 1;
            for (int i = 0; i < n; i++) all &= member[i] == E.rank || E.answers[member[i]].got;
            if (all || zo_now() > end) break;
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    /* The message: the operation, then the ranks that did not arrive. */
    size_t cap = 512 + (size_t)n * 112;
    char *msg = malloc(cap);
    if (!msg) engine_mpi_abort(1);
    size_t len = (size_t)snprintf(msg, cap, "comm: %s did not complete within %g s on rank %d of %d",
                                  what, c->timeout_s, c->rank, c->size);
    if (!world)
        len += (size_t)snprintf(msg + len, cap - len, " (world rank %d of %d)", E.rank, E.size);
    len += (size_t)snprintf(msg + len, cap - len, "; did not arrive:");
    int missing = 0;
    for (int i = 0; i < n && E.answers; i++) {
        int p = member[i];
        const answer *a = &E.answers[p];
        int arrived = p == E.rank ||
                      (a->got && (uint64_t)a->msg[0] == key && arrived_at(a->msg, seq));
        if (arrived) continue;
        char d[160], who[48];
        describe_answer(a, seq, d, sizeof d);
        if (world)
            snprintf(who, sizeof who, "rank %d", p);
        else
            snprintf(who, sizeof who, "rank %d, world rank %d", i, p);
        if (len < cap)
            len += (size_t)snprintf(msg + len, cap - len, "%s %s (%s)", missing ? ";" : "", who, d);
        missing++;
    }
    if (!E.answers && len < cap) len += (size_t)snprintf(msg + len, cap - len, " (not known)");
    else if (!missing && len < cap)
        len += (size_t)snprintf(msg + len, cap - len, " none (all ranks are in it: a hang inside the backend)");
    comm_mpi_fail(c, msg);
}

/* ---- the engine thread ------------------------------------------------------------------ */

static void run_watchdogs(void)
{
    double now = zo_now();
    if (now - E.last_tick < ENGINE_TICK_S) return;
    E.last_tick = now;
    poll_questions();
    for (int i = 0; i < E.n_slots; i++) {
        pthread_mutex_lock(&E.lock);
        comm_watch_fn fn = E.slots[i].used ? E.slots[i].watch : NULL;
        void *arg = E.slots[i].watch_arg;
        pthread_mutex_unlock(&E.lock);
        if (fn) fn(arg);
    }
}

static void check_abort(void)
{
    pthread_mutex_lock(&E.lock);
    int code = E.abort_requested ? E.abort_code : 0;
    pthread_mutex_unlock(&E.lock);
    if (code) engine_mpi_abort(code);
}

static void set_slot(int id, comm_phase phase, uint64_t seq, comm_op_kind kind)
{
    pthread_mutex_lock(&E.lock);
    E.slots[id].phase = phase;
    E.slots[id].seq = seq;
    E.slots[id].kind = kind;
    pthread_mutex_unlock(&E.lock);
}

void comm_mpi_set_state(int id, comm_phase phase, uint64_t seq, comm_op_kind kind)
{
    if (id >= 0 && id < ENGINE_MAX_COMMS) set_slot(id, phase, seq, kind);
}

/* An in-place reduce-scatter: recv is the rank's block of send. */
static int rs_in_place(const struct comm_request *b)
{
    size_t bytes = b->count * zo_dtype_size(b->dtype);
    return (const char *)b->recv == (const char *)b->send + (size_t)b->comm->rank * bytes;
}

/* Start the MPI call of `op`; *r is its request. */
static int start_call(mpi_op *op, MPI_Request *r)
{
    struct comm_request *b = &op->base;
    mpi_comm_ctx *x = ctx_of(b->comm);
    MPI_Datatype t = mpi_type(b->dtype);
    int n = (int)b->count;
    switch (op->ctl) {
    case CTL_DUP: return MPI_Comm_idup(MPI_COMM_WORLD, &x->comm, r);
    case CTL_BYTES: return MPI_Ibcast(b->recv, n, MPI_BYTE, 0, x->comm, r);
    case CTL_SPLIT: return MPI_Iallgather(op->v, 3, MPI_INT, op->v + 3, 3, MPI_INT, x->comm, r);
    default: break;
    }
    switch (b->kind) {
    case COMM_OP_ALL_REDUCE:
        return MPI_Iallreduce(b->send == b->recv ? MPI_IN_PLACE : b->send, b->recv, n, t,
                              mpi_sum(b->dtype), x->comm, r);
    case COMM_OP_REDUCE_SCATTER:
        /* in place: MPI leaves the rank's block at the start; finish_call moves it */
        if (rs_in_place(b))
            return MPI_Ireduce_scatter_block(MPI_IN_PLACE, (void *)b->send, n, t,
                                             mpi_sum(b->dtype), x->comm, r);
        return MPI_Ireduce_scatter_block(b->send, b->recv, n, t, mpi_sum(b->dtype), x->comm, r);
    case COMM_OP_ALL_GATHER:
        if ((const char *)b->send == (const char *)b->recv +
                                         (size_t)b->comm->rank * b->count * zo_dtype_size(b->dtype))
            return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b->recv, n, t, x->comm, r);
        return MPI_Iallgather(b->send, n, t, b->recv, n, t, x->comm, r);
    case COMM_OP_BROADCAST:
        if (b->comm->rank == b->root && b->send != b->recv && n)
            memcpy(b->recv, b->send, b->count * zo_dtype_size(b->dtype));
        return MPI_Ibcast(b->recv, n, t, b->root, x->comm, r);
    case COMM_OP_BARRIER: return MPI_Ibarrier(x->comm, r);
    case COMM_OP_ALL_TO_ALL: return MPI_Ialltoall(b->send, n, t, b->recv, n, t, x->comm, r);
    case COMM_OP_ALL_TO_ALL_V: {
        int p = b->comm->size;
        return MPI_Ialltoallv(b->send, op->v, op->v + p, t, b->recv, op->v + 2 * p, op->v + 3 * p,
                              t, x->comm, r);
    }
    default: return MPI_ERR_OP;
    }
}

/* After the call: the in-place reduce-scatter's block goes to its place;
 * a split, whose colors every rank of the parent now has, makes the new
 * communicator (blocking, but every rank of the parent is at it). */
static void finish_call(mpi_op *op)
{
    struct comm_request *b = &op->base;
    if (op->ctl == CTL_SPLIT) {
        mpi_comm_ctx *x = ctx_of(b->comm);
        int color = op->v[0] == COMM_SPLIT_NONE ? MPI_UNDEFINED : op->v[0];
        int rc = MPI_Comm_split(x->comm, color, op->v[1], &op->made);
        if (rc != MPI_SUCCESS) {
            char err[256], msg[600];
            mpi_message(rc, err, sizeof err);
            snprintf(msg, sizeof msg, "comm: split #%llu: MPI_Comm_split failed on rank %d of %d: %s",
                     (unsigned long long)b->seq, E.rank, E.size, err);
            comm_mpi_fail(b->comm, msg);
        }
        if (op->made != MPI_COMM_NULL) {
            MPI_Comm_set_errhandler(op->made, MPI_ERRORS_RETURN);
            MPI_Comm_rank(op->made, &op->made_rank);
            MPI_Comm_size(op->made, &op->made_size);
        }
        return;
    }
    if (op->ctl != CTL_COLLECTIVE || b->kind != COMM_OP_REDUCE_SCATTER || !rs_in_place(b) ||
        b->send == b->recv)
        return;
    memmove(b->recv, b->send, b->count * zo_dtype_size(b->dtype));
}

static void describe(const mpi_op *op, char *buf, size_t n)
{
    if (op->ctl == CTL_DUP)
        snprintf(buf, n, "comm_init (MPI_Comm_idup)");
    else if (op->ctl == CTL_BYTES)
        snprintf(buf, n, "comm_init (broadcast of the NCCL unique id)");
    else if (op->ctl == CTL_SPLIT)
        snprintf(buf, n, "split #%llu (MPI_Iallgather of the colors)",
                 (unsigned long long)op->base.seq);
    else
        comm_op_describe(&op->base, buf, n);
}

/* Poll until `r` completes; past the deadline, a fault. Backs off from
 * yielding to short sleeps so a waiting rank leaves the cores to others. */
static void poll_until_done(mpi_op *op, MPI_Request *r, int id)
{
    comm_t c = op->base.comm;
    double start = zo_now(), deadline = start + c->timeout_s;
    long sleep_ns = 0;
    for (;;) {
        int done = 0;
        int rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            char what[256], err[256], msg[600];
            describe(op, what, sizeof what);
            mpi_message(rc, err, sizeof err);
            snprintf(msg, sizeof msg, "comm: %s failed on rank %d of %d: %s", what, E.rank,
                     E.size, err);
            comm_mpi_fail(c, msg);
        }
        if (done) return;
        double now = zo_now();
        if (now > deadline) {
            char what[256];
            describe(op, what, sizeof what);
            comm_mpi_fault(c, id, op->base.seq, what);
        }
        run_watchdogs();
        check_abort();
        if (now - start < ENGINE_YIELD_S) {
            sched_yield();
        } else {
            sleep_ns = sleep_ns ? (sleep_ns * 2 > 200000 ? 200000 : sleep_ns * 2) : 20000;
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
        }
    }
}

/* With E.lock held: wait for a change or one tick, then (unlocked) answer
 * questions and run the watchdogs. */
static void wait_tick(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)(ENGINE_TICK_S * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&E.cond, &E.lock, &ts);
    pthread_mutex_unlock(&E.lock);
    run_watchdogs();
    pthread_mutex_lock(&E.lock);
}

static void check_abort_locked(void)
{
    if (E.abort_requested) {
        int code = E.abort_code;
        pthread_mutex_unlock(&E.lock);
        engine_mpi_abort(code);
    }
}

/* Wait (answering questions) until the device stream has marked `op` ready. */
static void wait_ready(mpi_op *op)
{
    pthread_mutex_lock(&E.lock);
    while (!op->ready) {
        wait_tick();
        check_abort_locked();
    }
    pthread_mutex_unlock(&E.lock);
}

static void engine_run(mpi_op *op)
{
    mpi_comm_ctx *x = ctx_of(op->base.comm);
    int collective = op->ctl == CTL_COLLECTIVE; /* a split is always ready */
    if (collective && !op->ready) {
        set_slot(x->id, COMM_PHASE_WAITING, op->base.seq, op->base.kind);
        wait_ready(op);
    }
    if (op->ctl == CTL_FREE) {
        MPI_Comm_free(&x->comm);
    } else {
        /* control operations at init show as collective 0; a split as its number */
        set_slot(x->id, COMM_PHASE_RUNNING, op->base.seq, op->base.kind);
        MPI_Request r;
        int rc = start_call(op, &r);
        if (rc != MPI_SUCCESS) {
            char what[256], err[256], msg[600];
            describe(op, what, sizeof what);
            mpi_message(rc, err, sizeof err);
            snprintf(msg, sizeof msg, "comm: %s could not start on rank %d of %d: %s", what,
                     E.rank, E.size, err);
            comm_mpi_fail(op->base.comm, msg);
        }
        poll_until_done(op, &r, x->id);
        if (op->ctl == CTL_DUP) MPI_Comm_set_errhandler(x->comm, MPI_ERRORS_RETURN);
        finish_call(op);
        set_slot(x->id, COMM_PHASE_IDLE, op->base.seq, op->base.kind);
    }
    pthread_mutex_lock(&E.lock);
    op->complete = 1;
    pthread_cond_broadcast(&E.cond);
    pthread_mutex_unlock(&E.lock);
}

static zo_status engine_init_mpi(void)
{
    int inited = 0, provided = 0, rc;
    MPI_Initialized(&inited);
    if (inited) {
        MPI_Query_thread(&provided);
        if (provided < MPI_THREAD_MULTIPLE)
            return zo_error(ZO_ERR_UNSUPPORTED,
                            "comm_init: the program initialized MPI without MPI_THREAD_MULTIPLE; "
                            "the communicator calls MPI from its own thread");
    } else {
        if ((rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided)) != MPI_SUCCESS)
            return zo_error(ZO_ERR_DEVICE, "comm_init: MPI_Init_thread failed (%d)", rc);
        E.we_initialized = 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &E.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &E.size);
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &E.fault_comm)) != MPI_SUCCESS)
        return zo_error(ZO_ERR_DEVICE, "comm_init: MPI_Comm_dup failed (%d)", rc);
    MPI_Comm_set_errhandler(E.fault_comm, MPI_ERRORS_RETURN);
    MPI_Op_create(sum_bf16_fn, 1, &E.sum_bf16);
    MPI_Op_create(sum_f16_fn, 1, &E.sum_f16);
    E.reply_out = calloc((size_t)E.size * 4, sizeof *E.reply_out);
    E.reply_reqs = malloc((size_t)E.size * sizeof *E.reply_reqs);
    if (!E.reply_out || !E.reply_reqs)
        return zo_error(ZO_ERR_NOMEM, "comm_init: out of host memory");
    for (int p = 0; p < E.size; p++) E.reply_reqs[p] = MPI_REQUEST_NULL;
    MPI_Irecv(E.query_in, 4, MPI_INT64_T, MPI_ANY_SOURCE, MPI_ANY_TAG, E.fault_comm, &E.query_req);
    return ZO_OK;
}

static void engine_shutdown_mpi(void)
{
    MPI_Cancel(&E.query_req);
    MPI_Wait(&E.query_req, MPI_STATUS_IGNORE);
    for (int p = 0; p < E.size; p++)
        if (E.reply_reqs[p] != MPI_REQUEST_NULL) MPI_Wait(&E.reply_reqs[p], MPI_STATUS_IGNORE);
    MPI_Op_free(&E.sum_bf16);
    MPI_Op_free(&E.sum_f16);
    MPI_Comm_free(&E.fault_comm);
    if (E.we_initialized) MPI_Finalize();
}

static void *engine_main(void *arg)
{
    (void)arg;
    zo_status st = engine_init_mpi();
    pthread_mutex_lock(&E.lock);
    E.init_status = st;
    if (st != ZO_OK) snprintf(E.init_message, sizeof E.init_message, "%s", zo_last_error());
    E.started = 1;
    E.running = st == ZO_OK;
    pthread_cond_broadcast(&E.cond);
    if (st != ZO_OK) {
        pthread_mutex_unlock(&E.lock);
        return NULL;
    }
    for (;;) {
        double spin_end = zo_now() + ENGINE_SPIN_S; /* the next collective often follows */
        while (!E.head && !E.stop && !E.abort_requested) {
            if (zo_now() < spin_end) {
                pthread_mutex_unlock(&E.lock);
                sched_yield();
                pthread_mutex_lock(&E.lock);
            } else {
                wait_tick();
            }
        }
        check_abort_locked();
        if (!E.head) break; /* stop, nothing left to run */
        mpi_op *op = E.head;
        E.head = op->next;
        if (!E.head) E.tail = NULL;
        pthread_mutex_unlock(&E.lock);
        engine_run(op);
        pthread_mutex_lock(&E.lock);
    }
    E.running = 0;
    pthread_mutex_unlock(&E.lock);
    engine_shutdown_mpi();
    return NULL;
}

static void engine_stop(void)
{
    pthread_mutex_lock(&E.lock);
    int running = E.running;
    E.stop = 1;
    pthread_cond_broadcast(&E.cond);
    pthread_mutex_unlock(&E.lock);
    if (running) pthread_join(E.thread, NULL);
}

static void engine_create(void)
{
    int rc = pthread_create(&E.thread, NULL, engine_main, NULL);
    pthread_mutex_lock(&E.lock);
    if (rc != 0) {
        E.init_status = ZO_ERR_DEVICE;
        snprintf(E.init_message, sizeof E.init_message, "comm_init: pthread_create: %s",
                 strerror(rc));
        E.started = 1;
    }
    while (!E.started) pthread_cond_wait(&E.cond, &E.lock);
    int ok = E.running;
    pthread_mutex_unlock(&E.lock);
    if (ok) atexit(engine_stop);
}

static zo_status engine_start(void)
{
    pthread_once(&E.once, engine_create);
    pthread_mutex_lock(&E.lock);
    zo_status st = E.init_status;
    int running = E.running;
    pthread_mutex_unlock(&E.lock);
    if (st != ZO_OK) return zo_error(st, "%s", E.init_message);
    if (!running) return zo_error(ZO_ERR_INVALID, "comm_init: MPI was shut down (process exiting)");
    return ZO_OK;
}

static void engine_submit(mpi_op *op)
{
    pthread_mutex_lock(&E.lock);
    op->next = NULL;
    if (E.tail)
        E.tail->next = op;
    else
        E.head = op;
    E.tail = op;
    pthread_cond_broadcast(&E.cond);
    pthread_mutex_unlock(&E.lock);
}

static zo_status engine_wait(mpi_op *op)
{
    double spin_end = zo_now() + ENGINE_SPIN_S;
    pthread_mutex_lock(&E.lock);
    while (!op->complete || op->stream_refs > 0) {
        if (zo_now() < spin_end) {
            pthread_mutex_unlock(&E.lock);
            sched_yield();
            pthread_mutex_lock(&E.lock);
        } else {
            pthread_cond_wait(&E.cond, &E.lock);
        }
    }
    pthread_mutex_unlock(&E.lock);
    if (op->status != ZO_OK) return zo_error(op->status, "%s", op->message);
    return ZO_OK;
}

/* A slot for the communicator `key` over `members` (n world ranks by rank;
 * NULL: the world), the first free one. */
static zo_status slot_register(uint64_t key, const int *members, int n, comm_watch_fn watch,
                               void *arg, int *id)
{
    zo_status st = engine_start();
    if (st != ZO_OK) return st;
    int *copy = NULL;
    if (members) {
        if (!(copy = malloc((size_t)n * sizeof *copy)))
            return zo_error(ZO_ERR_NOMEM, "comm: out of host memory");
        memcpy(copy, members, (size_t)n * sizeof *copy);
    }
    pthread_mutex_lock(&E.lock);
    int i = 0;
    while (i < E.n_slots && E.slots[i].used) i++;
    if (i == ENGINE_MAX_COMMS) {
        pthread_mutex_unlock(&E.lock);
        free(copy);
        return zo_error(ZO_ERR_CAPACITY, "comm: more than %d communicators at once in one process",
                        ENGINE_MAX_COMMS);
    }
    if (i == E.n_slots) E.n_slots++;
    comm_slot *s = &E.slots[i];
    memset(s, 0, sizeof *s);
    s->used = 1;
    s->key = key;
    s->members = copy;
    s->n_members = n;
    s->watch = watch;
    s->watch_arg = arg;
    *id = i;
    pthread_mutex_unlock(&E.lock);
    return ZO_OK;
}

zo_status comm_mpi_register(comm_t c, comm_t group, comm_watch_fn watch, void *arg, int *id)
{
    (void)c;
    mpi_comm_ctx *g = ctx_of(group);
    return slot_register(key_mix(g->key, KEY_NCCL), g->members, group->size, watch, arg, id);
}

void comm_mpi_unregister(int id)
{
    pthread_mutex_lock(&E.lock);
    if (id >= 0 && id < E.n_slots && E.slots[id].used) {
        E.slots[id].used = 0;
        free(E.slots[id].members);
        E.slots[id].members = NULL;
    }
    pthread_mutex_unlock(&E.lock);
}

/* ---- the backend ------------------------------------------------------------------------ */

static void host_mark_ready(void *arg)
{
    mpi_op *op = arg;
    pthread_mutex_lock(&E.lock);
    op->ready = 1;
    op->stream_refs--;
    pthread_cond_broadcast(&E.cond);
    pthread_mutex_unlock(&E.lock);
}

static void host_block_until_complete(void *arg)
{
    mpi_op *op = arg;
    pthread_mutex_lock(&E.lock);
    while (!op->complete) pthread_cond_wait(&E.cond, &E.lock);
    op->stream_refs--;
    pthread_cond_broadcast(&E.cond);
    pthread_mutex_unlock(&E.lock);
}

/* all_to_all_v: MPI's int counts and displacements (comm.c checked that the
 * sums fit an int). */
static zo_status counts_to_int(comm_t c, mpi_op *op)
{
    const struct comm_request *b = &op->base;
    int p = c->size;
    if (!(op->v = malloc((size_t)4 * (size_t)p * sizeof *op->v)))
        return zo_error(ZO_ERR_NOMEM, "out of host memory");
    for (int r = 0, sent = 0, received = 0; r < p; r++) {
        op->v[r] = (int)b->send_counts[r];
        op->v[p + r] = sent;
        op->v[2 * p + r] = (int)b->recv_counts[r];
        op->v[3 * p + r] = received;
        sent += op->v[r];
        received += op->v[2 * p + r];
    }
    return ZO_OK;
}

static zo_status mpi_start(comm_t c, struct comm_request *base)
{
    mpi_op *op = (mpi_op *)base;
    mpi_comm_ctx *x = ctx_of(c);
    zo_status st;
    if (base->kind == COMM_OP_ALL_TO_ALL_V && (st = counts_to_int(c, op)) != ZO_OK) return st;
    op->ready = 1;
    if (base->after) {
        /* Counted before the launch: the host function may run at once. */
        op->ready = 0;
        op->stream_refs = 1;
        if ((st = gpu_stream_wait_event(x->stream, base->after)) != ZO_OK ||
            (st = gpu_launch_host_func(x->stream, host_mark_ready, op)) != ZO_OK)
            goto out_free_counts;
    }
    if (base->done) {
        pthread_mutex_lock(&E.lock);
        op->stream_refs++;
        pthread_mutex_unlock(&E.lock);
        if ((st = gpu_launch_host_func(x->stream, host_block_until_complete, op)) != ZO_OK ||
            (st = gpu_event_record(base->done, x->stream)) != ZO_OK) {
            /* Not submitted: let a queued host_mark_ready run before the
             * caller frees the request. */
            (void)gpu_stream_synchronize(x->stream);
            goto out_free_counts;
        }
    }
    engine_submit(op);
    return ZO_OK;

out_free_counts:
    free(op->v);
    return st;
}

static zo_status mpi_wait(struct comm_request *base)
{
    mpi_op *op = (mpi_op *)base;
    zo_status st = engine_wait(op);
    free(op->v);
    return st;
}

static int mpi_test(struct comm_request *base)
{
    mpi_op *op = (mpi_op *)base;
    pthread_mutex_lock(&E.lock);
    int done = op->complete && op->stream_refs == 0;
    pthread_mutex_unlock(&E.lock);
    return done;
}

/* Run a control operation of communicator `c` on the engine and wait. */
static zo_status run_ctl(comm_t c, mpi_ctl ctl, void *buf, size_t bytes)
{
    mpi_op *op = calloc(1, sizeof *op);
    if (!op) return zo_error(ZO_ERR_NOMEM, "comm: out of host memory");
    op->base.comm = c;
    op->base.recv = buf;
    op->base.count = bytes;
    op->ctl = ctl;
    op->ready = 1;
    engine_submit(op);
    zo_status st = engine_wait(op);
    free(op);
    return st;
}

zo_status comm_mpi_bcast_bytes(comm_t mpi, void *buf, size_t bytes)
{
    if (bytes > INT_MAX) return zo_error(ZO_ERR_INVALID, "comm: broadcast of %zu bytes", bytes);
    return run_ctl(mpi, CTL_BYTES, buf, bytes);
}

static void mpi_free(comm_t c)
{
    mpi_comm_ctx *x = ctx_of(c);
    if (x->stream) gpu_stream_destroy(x->stream); /* after its host functions */
    (void)run_ctl(c, CTL_FREE, NULL, 0);         /* after the collectives queued before */
    comm_mpi_unregister(x->id);
    free(x->members);
    free(x);
}

__attribute__((noreturn)) static void mpi_abort(comm_t c, int code, const char *message)
{
    comm_report_fault(c, message);
    pthread_mutex_lock(&E.lock);
    E.abort_requested = 1;
    E.abort_code = code;
    pthread_cond_broadcast(&E.cond);
    pthread_mutex_unlock(&E.lock);
    /* The engine calls MPI_Abort within a tick; should it be stuck, end
     * this process at least. */
    struct timespec ts = {10, 0};
    while (nanosleep(&ts, &ts) != 0) {}
    _exit(code);
}

static zo_status mpi_split(comm_t parent, uint64_t seq, int color, int key, comm_t child);

const comm_iface comm_mpi_iface = {
    .name = "mpi",
    .op_size = sizeof(mpi_op),
    .free = mpi_free,
    .start = mpi_start,
    .wait = mpi_wait,
    .test = mpi_test,
    .abort = mpi_abort,
    .split = mpi_split,
};

zo_status comm_mpi_init(comm_t c)
{
    zo_status st;
    comm_launch l;
    if ((st = comm_launch_detect(&l)) != ZO_OK) return zo_error_wrap(st, "comm_init");
    mpi_comm_ctx *x = calloc(1, sizeof *x);
    if (!x) return zo_error(ZO_ERR_NOMEM, "comm_init: out of host memory");
    x->comm = MPI_COMM_NULL;
    if ((st = engine_start()) != ZO_OK) goto out_free_ctx;
    pthread_mutex_lock(&E.lock);
    x->key = key_mix(KEY_WORLD, E.n_world++);
    pthread_mutex_unlock(&E.lock);
    if ((st = slot_register(x->key, NULL, 0, NULL, NULL, &x->id)) != ZO_OK) goto out_free_ctx;
    if (l.found && (l.rank != E.rank || l.size != E.size)) {
        st = zo_error(ZO_ERR_INVALID,
                      "comm_init: the launcher says rank %d of %d (%s, %s) but MPI says rank %d "
                      "of %d: was the program started by another MPI's launcher?",
                      l.rank, l.size, l.rank_var, l.size_var, E.rank, E.size);
        goto out_unregister;
    }
    c->iface = &comm_mpi_iface;
    c->ctx = x;
    c->rank = E.rank;
    c->size = E.size;
    c->device_buffers = 0;
    if (c->device && (st = gpu_stream_create(c->device, &x->stream)) != ZO_OK) goto out_unregister;
    if ((st = run_ctl(c, CTL_DUP, NULL, 0)) != ZO_OK) goto out_destroy_stream;
    return ZO_OK;

out_destroy_stream:
    if (x->stream) gpu_stream_destroy(x->stream);
out_unregister:
    comm_mpi_unregister(x->id);
out_free_ctx:
    free(x);
    return st;
}

/* The ranks of `parent` with `color`, by key then parent rank: their world
 * ranks into members[], their count returned; *rank: this rank's place. */
static int split_members(const int *all, int parent_size, int parent_rank, int color,
                         int *members, int *rank)
{
    int n = 0;
    for (int p = 0; p < parent_size; p++) {
        if (all[3 * p] != color) continue;
        /* insertion by (key, parent rank): parent ranks arrive in order */
        int at = n;
        while (at > 0 && all[3 * members[at - 1] + 1] > all[3 * p + 1]) {
            members[at] = members[at - 1];
            at--;
        }
        members[at] = p;
        n++;
    }
    for (int i = 0; i < n; i++) {
        if (members[i] == parent_rank) *rank = i;
        members[i] = all[3 * members[i] + 2];
    }
    return n;
}

static zo_status mpi_split(comm_t parent, uint64_t seq, int color, int key, comm_t child)
{
    zo_status st;
    int p = parent->size;
    mpi_op *op = calloc(1, sizeof *op);
    if (!op || !(op->v = malloc((size_t)3 * (size_t)(p + 1) * sizeof *op->v))) {
        free(op);
        return zo_error(ZO_ERR_NOMEM, "out of host memory");
    }
    op->base.comm = parent;
    op->base.kind = COMM_OP_SPLIT;
    op->base.seq = seq;
    op->ctl = CTL_SPLIT;
    op->ready = 1;
    op->made = MPI_COMM_NULL;
    op->v[0] = color;
    op->v[1] = key;
    op->v[2] = E.rank;
    engine_submit(op);
    if ((st = engine_wait(op)) != ZO_OK || op->made == MPI_COMM_NULL) goto out_free_op;

    mpi_comm_ctx *x = calloc(1, sizeof *x);
    if (!x || !(x->members = malloc((size_t)p * sizeof *x->members))) {
        st = zo_error(ZO_ERR_NOMEM, "out of host memory");
        goto out_free_ctx;
    }
    int rank = -1, n = split_members(op->v + 3, p, parent->rank, color, x->members, &rank);
    x->comm = op->made;
    op->made = MPI_COMM_NULL;
    x->key = key_mix(key_mix(ctx_of(parent)->key, seq), (uint64_t)color);
    child->iface = &comm_mpi_iface;
    child->ctx = x;
    child->rank = rank;
    child->size = n;
    child->device_buffers = 0;
    if (rank != op->made_rank || n != op->made_size) {
        st = zo_error(ZO_ERR_DEVICE, "split #%llu: MPI made rank %d of %d, expected %d of %d",
                      (unsigned long long)seq, op->made_rank, op->made_size, rank, n);
        goto out_free_comm;
    }
    if ((st = slot_register(x->key, x->members, n, NULL, NULL, &x->id)) != ZO_OK)
        goto out_free_comm;
    if (child->device && (st = gpu_stream_create(child->device, &x->stream)) != ZO_OK) {
        comm_mpi_unregister(x->id);
        goto out_free_comm;
    }
    free(op->v);
    free(op);
    return ZO_OK;

out_free_comm:
    (void)run_ctl(child, CTL_FREE, NULL, 0);
    child->iface = NULL;
    child->ctx = NULL;
out_free_ctx:
    if (x) free(x->members);
    free(x);
out_free_op:
    free(op->v);
    free(op);
    return st;
}
