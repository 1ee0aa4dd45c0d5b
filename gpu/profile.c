/* The op profile (profile.h): records of timed events, resolved into rows
 * at the end of each profiled step. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/clock.h"     /* defines: zo_now */
#include "gpu/device_impl.h"  /* defines: struct gpu_device, gpu_backend_iface */
#include "gpu/profile_impl.h" /* defines: gpu_profile_op, gpu_profile_copy, gpu_profile_memset */

#define PROF_STREAMS 32   /* streams named apart; later ones share the last name */
#define PROF_SHAPES 512   /* rows with a shape of their own; later shapes go to "(other shapes)" */
#define PROF_WAITS 16

/* What a row adds up: an op of gpu/ops.h, a copy of each kind, a memset. */
enum { PROF_COPY = GPU_OP_COUNT, PROF_MEMSET = PROF_COPY + 4 };

/* A row's identity; zeroed before it is filled, so that memcmp compares it. */
typedef struct prof_key {
    int kind;       /* gpu_op_id, PROF_COPY + gpu_copy_kind, PROF_MEMSET */
    int stream;     /* index into streams[] */
    int64_t dim[7]; /* gemm: m n k batch trans_a trans_b dtypes; attention: b t hq hkv d window;
                     * other ops 0; dim[0] -1: the kind's "(other shapes)" */
} prof_key;

/* One op between its two events. */
typedef struct prof_rec {
    gpu_event_t ev[2];
    prof_key key;
    double flops, bytes;
    int ready; /* 1: both events recorded; 0: its thread is recording them */
} prof_rec;

typedef struct prof_row {
    prof_key key;
    double calls, seconds, flops, bytes;
} prof_row;

struct gpu_profile {
    gpu_device_t dev;
    pthread_mutex_t mu;
    pthread_cond_t idle; /* active fell to 0 */
    int open;            /* in a profiled step */
    int stopped;
    int active;          /* threads between taking a record and marking it ready */
    prof_rec *recs;
    size_t n_recs, cap_recs;
    gpu_event_t *pool;   /* timed events free for the next records */
    size_t n_pool, cap_pool;
    struct {
        gpu_stream_t s;
        char name[24];
    } streams[PROF_STREAMS];
    int n_streams;
    prof_row *rows;
    size_t n_rows, cap_rows, n_shaped;
    gpu_profile_row *host; /* gpu_profile_add_host's rows */
    size_t n_host;
    gpu_profile_row *out;  /* gpu_profile_rows' answer */
    struct {
        char name[24];
        double s;
    } waits[PROF_WAITS];
    int n_waits;
    int steps;
    double step_s, t0;
};

/* ---- FLOPs ---------------------------------------------------------------------------- */

double gpu_gemm_flops(const gpu_gemm_desc *d)
{
    double batch = d->batch > 1 ? d->batch : 1;
    return 2.0 * d->m * (double)d->n * d->k * batch;
}

double gpu_attention_flops(const gpu_attn_desc *a, int backward)
{
    double t = a->t, w = a->window > 0 && a->window < a->t ? a->window : t;
    double pairs = t * w - w * w / 2; /* t^2 / 2 without a window: the dense count halved */
    double fwd = 4.0 * a->b * a->hq * a->d * pairs;
    return backward ? 2.5 * fwd : fwd;
}

/* ---- records ---------------------------------------------------------------------------- */

static int stream_index(gpu_profile *p, gpu_stream_t s)
{
    for (int i = 0; i < p->n_streams; i++)
        if (p->streams[i].s == s) return i;
    if (p->n_streams == PROF_STREAMS) return PROF_STREAMS - 1;
    int i = p->n_streams++;
    p->streams[i].s = s;
    if (i + 1 < PROF_STREAMS) snprintf(p->streams[i].name, sizeof p->streams[i].name, "stream %d", i + 1);
    else snprintf(p->streams[i].name, sizeof p->streams[i].name, "other streams");
    return i;
}

static zo_status grow(void **arr, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap) return ZO_OK;
    size_t n = *cap ? 2 * *cap : 256;
    while (n < need) n *= 2;
    void *q = realloc(*arr, n * size);
    if (!q) return zo_error(ZO_ERR_NOMEM, "gpu profile: out of host memory");
    *arr = q;
    *cap = n;
    return ZO_OK;
}

static zo_status take_event(gpu_profile *p, gpu_event_t *ev)
{
    if (p->n_pool) {
        *ev = p->pool[--p->n_pool];
        return ZO_OK;
    }
    return gpu_event_create_timed(p->dev, ev);
}

static void give_event(gpu_profile *p, gpu_event_t ev)
{
    /* the pool never holds more than were created, and room was made as they were */
    p->pool[p->n_pool++] = ev;
}

/* Under the lock: a record for work about to be enqueued on s, its events
 * taken; *idx (SIZE_MAX: outside a profiled step, run the work untimed). */
static zo_status rec_begin(gpu_profile *p, gpu_stream_t s, const prof_key *key, double flops, double bytes,
                           gpu_event_t ev[2], size_t *idx)
{
    *idx = SIZE_MAX;
    pthread_mutex_lock(&p->mu);
    zo_status st = ZO_OK;
    if (!p->open || p->stopped) goto out;
    /* room for both events back in the pool, whatever happens to them */
    if ((st = grow((void **)&p->pool, &p->cap_pool, p->n_pool + 2 * (p->n_recs + 1), sizeof *p->pool)) != ZO_OK ||
        (st = grow((void **)&p->recs, &p->cap_recs, p->n_recs + 1, sizeof *p->recs)) != ZO_OK)
        goto out;
    if ((st = take_event(p, &ev[0])) != ZO_OK) goto out;
    if ((st = take_event(p, &ev[1])) != ZO_OK) {
        give_event(p, ev[0]);
        goto out;
    }
    prof_rec *r = &p->recs[p->n_recs];
    *r = (prof_rec){.ev = {ev[0], ev[1]}, .key = *key, .flops = flops, .bytes = bytes};
    r->key.stream = stream_index(p, s);
    *idx = p->n_recs++;
    p->active++;
out:
    pthread_mutex_unlock(&p->mu);
    return st;
}

/* Its events recorded around the work (ok), or not: the record dropped. */
static void rec_end(gpu_profile *p, size_t idx, int ok)
{
    pthread_mutex_lock(&p->mu);
    prof_rec *r = &p->recs[idx];
    if (ok) {
        r->ready = 1;
    } else { /* the events go back; re-recording one re-arms it */
        give_event(p, r->ev[0]);
        give_event(p, r->ev[1]);
        r->ready = -1;
    }
    if (--p->active == 0) pthread_cond_broadcast(&p->idle);
    pthread_mutex_unlock(&p->mu);
}

typedef zo_status (*prof_work)(gpu_stream_t s, const void *ctx);

/* The work between two timed events, inside a profiled step. */
static zo_status timed(gpu_profile *p, gpu_stream_t s, const prof_key *key, double flops, double bytes,
                       prof_work work, const void *ctx)
{
    gpu_event_t ev[2];
    size_t idx;
    zo_status st = rec_begin(p, s, key, flops, bytes, ev, &idx);
    if (st != ZO_OK) return st;
    if (idx == SIZE_MAX) return work(s, ctx);
    const gpu_backend_iface *io = s->dev->iface;
    st = io->event_record(ev[0], s);
    if (st == ZO_OK) st = work(s, ctx);
    if (st == ZO_OK) st = io->event_record(ev[1], s);
    rec_end(p, idx, st == ZO_OK);
    return st;
}

typedef struct op_call {
    gpu_op_id id;
    const gpu_op_args *a;
} op_call;

static zo_status run_op(gpu_stream_t s, const void *ctx)
{
    const op_call *c = ctx;
    return s->dev->iface->op(s, c->id, c->a);
}

zo_status gpu_profile_op(gpu_profile *p, gpu_stream_t s, gpu_op_id id, const gpu_op_args *a)
{
    prof_key key;
    memset(&key, 0, sizeof key);
    key.kind = (int)id;
    double flops = 0;
    if (id == GPU_OP_GEMM) {
        const gpu_gemm_desc *d = &a->d.gemm;
        int64_t dims[7] = {d->m, d->n, d->k, d->batch > 1 ? d->batch : 1, d->trans_a, d->trans_b,
                           (int64_t)a->t[0].dtype | (int64_t)a->t[2].dtype << 8};
        memcpy(key.dim, dims, sizeof dims);
        flops = gpu_gemm_flops(d);
    } else if (id == GPU_OP_ATTENTION_FORWARD || id == GPU_OP_ATTENTION_BACKWARD) {
        const gpu_attn_desc *d = &a->d.attn;
        int64_t dims[6] = {d->b, d->t, d->hq, d->hkv, d->d, d->window};
        memcpy(key.dim, dims, sizeof dims);
        flops = gpu_attention_flops(d, id == GPU_OP_ATTENTION_BACKWARD);
    }
    return timed(p, s, &key, flops, 0, run_op, &(op_call){id, a});
}

typedef struct copy_call {
    void *dst;
    const void *src;
    size_t bytes;
    gpu_copy_kind kind;
    int value;
} copy_call;

static zo_status run_copy(gpu_stream_t s, const void *ctx)
{
    const copy_call *c = ctx;
    return s->dev->iface->memcpy_async(s, c->dst, c->src, c->bytes, c->kind);
}

static zo_status run_memset(gpu_stream_t s, const void *ctx)
{
    const copy_call *c = ctx;
    return s->dev->iface->memset_async(s, c->dst, c->value, c->bytes);
}

zo_status gpu_profile_copy(gpu_profile *p, gpu_stream_t s, void *dst, const void *src, size_t bytes,
                           gpu_copy_kind kind)
{
    prof_key key;
    memset(&key, 0, sizeof key);
    key.kind = PROF_COPY + (int)kind;
    copy_call c = {.dst = dst, .src = src, .bytes = bytes, .kind = kind};
    return timed(p, s, &key, 0, (double)bytes, run_copy, &c);
}

zo_status gpu_profile_memset(gpu_profile *p, gpu_stream_t s, void *dst, int value, size_t bytes)
{
    prof_key key;
    memset(&key, 0, sizeof key);
    key.kind = PROF_MEMSET;
    copy_call c = {.dst = dst, .bytes = bytes, .value = value};
    return timed(p, s, &key, 0, (double)bytes, run_memset, &c);
}

/* ---- resolving records into rows ---------------------------------------------------------- */

static zo_status add_to_row(gpu_profile *p, const prof_key *key, double seconds, double flops, double bytes)
{
    prof_key k = *key;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < p->n_rows; i++)
            if (!memcmp(&p->rows[i].key, &k, sizeof k)) {
                prof_row *r = &p->rows[i];
                r->calls += 1;
                r->seconds += seconds;
                r->flops += flops;
                r->bytes += bytes;
                return ZO_OK;
            }
        int shaped = k.dim[0] > 0;
        if (!shaped || p->n_shaped < PROF_SHAPES) break;
        memset(k.dim, 0, sizeof k.dim); /* too many shapes: the kind's "(other shapes)" row */
        k.dim[0] = -1;
    }
    zo_status st = grow((void **)&p->rows, &p->cap_rows, p->n_rows + 1, sizeof *p->rows);
    if (st != ZO_OK) return st;
    if (k.dim[0] > 0) p->n_shaped++;
    p->rows[p->n_rows++] = (prof_row){.key = k, .calls = 1, .seconds = seconds, .flops = flops, .bytes = bytes};
    return ZO_OK;
}

/* Under the lock, no record being made: each record whose end event has
 * completed (wait: every one, waited for) into its row, its events back in
 * the pool; the others kept. */
static zo_status resolve(gpu_profile *p, int wait)
{
    const gpu_backend_iface *io = p->dev->iface;
    zo_status first = ZO_OK;
    size_t keep = 0;
    for (size_t i = 0; i < p->n_recs; i++) {
        prof_rec *r = &p->recs[i];
        if (r->ready < 0) continue; /* dropped: its events are back already */
        if (wait) {
            zo_status st = io->event_synchronize(r->ev[1]);
            if (st != ZO_OK && first == ZO_OK) first = st;
        } else if (!io->event_query(r->ev[1])) {
            p->recs[keep++] = *r;
            continue;
        }
        double ms = 0;
        zo_status st = io->event_elapsed(r->ev[0], r->ev[1], &ms);
        if (st == ZO_OK) st = add_to_row(p, &r->key, ms / 1e3, r->flops, r->bytes);
        if (st != ZO_OK && first == ZO_OK) first = st;
        give_event(p, r->ev[0]);
        give_event(p, r->ev[1]);
    }
    p->n_recs = keep;
    return first;
}

/* ---- the profile's life --------------------------------------------------------------------- */

zo_status gpu_profile_start(gpu_device_t dev, gpu_profile **out)
{
    if (!dev || !out) return zo_error(ZO_ERR_INVALID, "gpu_profile_start: NULL argument");
    if (__atomic_load_n(&dev->prof, __ATOMIC_ACQUIRE))
        return zo_error(ZO_ERR_BUSY, "gpu_profile_start: device %s has a profile attached already",
                        gpu_device_name(dev));
    gpu_profile *p = calloc(1, sizeof *p);
    if (!p) return zo_error(ZO_ERR_NOMEM, "gpu_profile_start: out of host memory");
    p->dev = dev;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->idle, NULL);
    __atomic_store_n(&dev->prof, p, __ATOMIC_RELEASE);
    *out = p;
    return ZO_OK;
}

zo_status gpu_profile_stop(gpu_profile *p)
{
    if (!p) return ZO_OK;
    pthread_mutex_lock(&p->mu);
    if (p->stopped) {
        pthread_mutex_unlock(&p->mu);
        return ZO_OK;
    }
    /* a thread that found the profile before it is detached sees `stopped`
     * and runs its work untimed */
    p->stopped = 1;
    p->open = 0;
    __atomic_store_n(&p->dev->prof, NULL, __ATOMIC_RELEASE);
    while (p->active) pthread_cond_wait(&p->idle, &p->mu);
    zo_status st = resolve(p, 1);
    pthread_mutex_unlock(&p->mu);
    return st;
}

void gpu_profile_free(gpu_profile *p)
{
    if (!p) return;
    (void)gpu_profile_stop(p);
    for (size_t i = 0; i < p->n_pool; i++) gpu_event_destroy(p->pool[i]);
    free(p->pool);
    free(p->recs);
    free(p->rows);
    free(p->host);
    free(p->out);
    pthread_cond_destroy(&p->idle);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void gpu_profile_name_stream(gpu_profile *p, gpu_stream_t s, const char *name)
{
    if (!p || !s || !name) return;
    pthread_mutex_lock(&p->mu);
    int i = stream_index(p, s);
    if (p->streams[i].s == s) snprintf(p->streams[i].name, sizeof p->streams[i].name, "%s", name);
    pthread_mutex_unlock(&p->mu);
}

void gpu_profile_step_begin(gpu_profile *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->open = !p->stopped;
    p->t0 = zo_now();
    pthread_mutex_unlock(&p->mu);
}

zo_status gpu_profile_step_end(gpu_profile *p)
{
    if (!p) return ZO_OK;
    pthread_mutex_lock(&p->mu);
    zo_status st = ZO_OK;
    if (p->open) {
        p->open = 0;
        p->steps++;
        p->step_s += zo_now() - p->t0;
        /* a thread may be between its two events: wait for it to record
         * them (host work of microseconds, no device wait), since the
         * records move */
        while (p->active) pthread_cond_wait(&p->idle, &p->mu);
        st = resolve(p, 0);
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}

void gpu_profile_add_host(gpu_profile *p, const char *name, double seconds, double calls)
{
    if (!p || !name) return;
    pthread_mutex_lock(&p->mu);
    size_t i = 0;
    while (i < p->n_host && strcmp(p->host[i].op, name)) i++;
    if (i == p->n_host) {
        gpu_profile_row *h = realloc(p->host, (p->n_host + 1) * sizeof *h);
        if (!h) goto out; /* the row is lost, not the run */
        p->host = h;
        p->host[p->n_host++] = (gpu_profile_row){.host = 1};
        snprintf(p->host[i].op, sizeof p->host[i].op, "%s", name);
        snprintf(p->host[i].stream, sizeof p->host[i].stream, "host");
    }
    p->host[i].seconds += seconds;
    p->host[i].calls += calls;
out:
    pthread_mutex_unlock(&p->mu);
}

void gpu_profile_add_wait(gpu_profile *p, const char *name, double seconds)
{
    if (!p || !name) return;
    pthread_mutex_lock(&p->mu);
    int i = 0;
    while (i < p->n_waits && strcmp(p->waits[i].name, name)) i++;
    if (i == p->n_waits && p->n_waits < PROF_WAITS)
        snprintf(p->waits[p->n_waits++].name, sizeof p->waits[i].name, "%s", name);
    if (i < p->n_waits) p->waits[i].s += seconds;
    pthread_mutex_unlock(&p->mu);
}

/* ---- results -------------------------------------------------------------------------------------- */

static const char *copy_names[4] = {"copy h2d", "copy d2h", "copy d2d", "copy h2h"};

static void row_of(const gpu_profile *p, const prof_row *pr, gpu_profile_row *r)
{
    const prof_key *k = &pr->key;
    *r = (gpu_profile_row){.calls = pr->calls, .seconds = pr->seconds, .flops = pr->flops, .bytes = pr->bytes};
    const char *name = k->kind < GPU_OP_COUNT ? gpu_op_infos[k->kind].name + 4 /* "gpu_" */
                       : k->kind < PROF_MEMSET ? copy_names[k->kind - PROF_COPY]
                                               : "memset";
    snprintf(r->op, sizeof r->op, "%s", name);
    snprintf(r->stream, sizeof r->stream, "%s", p->streams[k->stream].name);
    const int64_t *d = k->dim;
    if (d[0] < 0) {
        snprintf(r->shape, sizeof r->shape, "(other shapes)");
    } else if (k->kind == GPU_OP_GEMM) {
        zo_dtype ta = (zo_dtype)(d[6] & 0xff), tc = (zo_dtype)(d[6] >> 8 & 0xff);
        char batch[24] = "";
        if (d[3] > 1) snprintf(batch, sizeof batch, "%lld x ", (long long)d[3]);
        snprintf(r->shape, sizeof r->shape, "%s%lldx%lldx%lld %c%c %s%s%s", batch, (long long)d[0],
                 (long long)d[1], (long long)d[2], d[4] ? 'T' : 'N', d[5] ? 'T' : 'N', zo_dtype_name(ta),
                 tc != ta ? "->" : "", tc != ta ? zo_dtype_name(tc) : "");
    } else if (k->kind == GPU_OP_ATTENTION_FORWARD || k->kind == GPU_OP_ATTENTION_BACKWARD) {
        int n = snprintf(r->shape, sizeof r->shape, "b%lld t%lld hq%lld hkv%lld d%lld", (long long)d[0],
                         (long long)d[1], (long long)d[2], (long long)d[3], (long long)d[4]);
        if (d[5] > 0 && n > 0 && (size_t)n < sizeof r->shape)
            snprintf(r->shape + n, sizeof r->shape - (size_t)n, " w%lld", (long long)d[5]);
    }
}

static int by_time(const void *a, const void *b)
{
    const gpu_profile_row *x = a, *y = b;
    return x->seconds < y->seconds ? 1 : x->seconds > y->seconds ? -1 : strcmp(x->op, y->op);
}

size_t gpu_profile_rows(gpu_profile *p, const gpu_profile_row **rows)
{
    *rows = NULL;
    if (!p) return 0;
    pthread_mutex_lock(&p->mu);
    size_t n = p->n_rows + p->n_host;
    gpu_profile_row *o = realloc(p->out, (n ? n : 1) * sizeof *o);
    if (!o) n = 0;
    else p->out = o;
    for (size_t i = 0; i < n; i++)
        if (i < p->n_rows) row_of(p, &p->rows[i], &o[i]);
        else o[i] = p->host[i - p->n_rows];
    if (n) qsort(o, n, sizeof *o, by_time);
    *rows = p->out;
    pthread_mutex_unlock(&p->mu);
    return n;
}

double gpu_profile_op_calls(gpu_profile *p, const char *op)
{
    const gpu_profile_row *rows;
    size_t n = gpu_profile_rows(p, &rows);
    double calls = 0;
    for (size_t i = 0; i < n; i++)
        if (!rows[i].host && !strcmp(rows[i].op, op)) calls += rows[i].calls;
    return calls;
}

int gpu_profile_steps(const gpu_profile *p) { return p ? p->steps : 0; }

double gpu_profile_step_seconds(const gpu_profile *p) { return p ? p->step_s : 0.0; }

/* "412.3 TFLOP/s", "25.1 GB/s" or "" for a row. */
static void rate_of(const gpu_profile_row *r, char *buf, size_t len)
{
    buf[0] = '\0';
    if (r->seconds <= 0) return;
    if (r->flops > 0) snprintf(buf, len, "%.2f TFLOP/s", r->flops / r->seconds / 1e12);
    else if (r->bytes > 0) snprintf(buf, len, "%.2f GB/s", r->bytes / r->seconds / 1e9);
}

/* The rows' seconds summed by op name (by_stream 0; host rows too) or by
 * stream (1; device rows only: work on one stream does not overlap, so
 * the sum is its busy time), the longest first: names[] and secs[], their
 * number returned. */
typedef struct prof_sum {
    char name[40];
    double s;
} prof_sum;

static int by_secs(const void *a, const void *b)
{
    const prof_sum *x = a, *y = b;
    return x->s < y->s ? 1 : x->s > y->s ? -1 : strcmp(x->name, y->name);
}

static int sum_rows(const gpu_profile_row *rows, size_t n, int by_stream, prof_sum *sums, int max)
{
    int ns = 0;
    for (size_t i = 0; i < n; i++) {
        if (by_stream && rows[i].host) continue;
        const char *key = by_stream ? rows[i].stream : rows[i].op;
        int j = 0;
        while (j < ns && strcmp(sums[j].name, key)) j++;
        if (j == ns) {
            if (ns == max) continue;
            snprintf(sums[ns].name, sizeof sums[ns].name, "%s", key);
            sums[ns++].s = 0;
        }
        sums[j].s += rows[i].seconds;
    }
    qsort(sums, (size_t)ns, sizeof *sums, by_secs);
    return ns;
}

/* "# profile: WHAT, ms per step: a 1.000 (10.0%), b ..." */
static void print_sums(FILE *f, const char *what, const prof_sum *sums, int ns, double per, double step_ms)
{
    fprintf(f, "# profile: %s, ms per step:", what);
    for (int j = 0; j < ns; j++) {
        double ms = 1e3 * sums[j].s * per;
        fprintf(f, " %s %.3f (%.1f%%)%s", sums[j].name, ms, step_ms > 0 ? 100 * ms / step_ms : 0.0,
                j + 1 < ns ? "," : "");
    }
    fprintf(f, "\n");
}

#define PROF_SUMS (GPU_OP_COUNT + 16)

void gpu_profile_print(gpu_profile *p, FILE *f)
{
    if (!p) return;
    const gpu_profile_row *rows;
    size_t n = gpu_profile_rows(p, &rows);
    int steps = p->steps;
    double per = steps ? 1.0 / steps : 0, step_ms = 1e3 * p->step_s * per;
    fprintf(f, "# profile: %d step%s profiled, %.3f ms per step (wall); device work timed between events on "
               "its stream; attention FLOPs causal, the dense count halved\n",
            steps, steps == 1 ? "" : "s", step_ms);
    if (!steps) return;
    fprintf(f, "# profile: %-22s %-30s %-12s %10s %11s %7s %15s\n", "op", "shape", "stream", "calls/step",
            "ms/step", "% step", "rate");
    for (size_t i = 0; i < n; i++) {
        const gpu_profile_row *r = &rows[i];
        char rate[32];
        rate_of(r, rate, sizeof rate);
        double ms = 1e3 * r->seconds * per;
        fprintf(f, "# profile: %-22s %-30s %-12s %10.1f %11.3f %6.1f%% %15s\n", r->op, r->shape[0] ? r->shape : "-",
                r->stream, r->calls * per, ms, step_ms > 0 ? 100 * ms / step_ms : 0.0, rate);
    }
    prof_sum sums[PROF_SUMS];
    print_sums(f, "by op", sums, sum_rows(rows, n, 0, sums, PROF_SUMS), per, step_ms);
    print_sums(f, "streams busy", sums, sum_rows(rows, n, 1, sums, PROF_SUMS), per, step_ms);
    if (p->n_waits) {
        fprintf(f, "# profile: host thread, ms per step:");
        for (int j = 0; j < p->n_waits; j++)
            fprintf(f, " %s %.3f%s", p->waits[j].name, 1e3 * p->waits[j].s * per, j + 1 < p->n_waits ? "," : "");
        fprintf(f, "\n");
    }
}

cJSON *gpu_profile_json(gpu_profile *p)
{
    if (!p) return NULL;
    const gpu_profile_row *rows;
    size_t n = gpu_profile_rows(p, &rows);
    int steps = p->steps;
    double per = steps ? 1.0 / steps : 0, step_ms = 1e3 * p->step_s * per;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "steps", steps);
    cJSON_AddNumberToObject(o, "step_ms", step_ms);
    cJSON_AddStringToObject(o, "attention_flops", "causal: the dense count halved");
    cJSON *ops = cJSON_AddArrayToObject(o, "ops");
    for (size_t i = 0; ops && i < n; i++) {
        const gpu_profile_row *r = &rows[i];
        cJSON *e = cJSON_CreateObject();
        if (!e) break;
        cJSON_AddItemToArray(ops, e);
        double ms = 1e3 * r->seconds * per;
        cJSON_AddStringToObject(e, "op", r->op);
        cJSON_AddStringToObject(e, "shape", r->shape);
        cJSON_AddStringToObject(e, "stream", r->stream);
        cJSON_AddNumberToObject(e, "calls_per_step", r->calls * per);
        cJSON_AddNumberToObject(e, "ms_per_step", ms);
        cJSON_AddNumberToObject(e, "percent_of_step", step_ms > 0 ? 100 * ms / step_ms : 0.0);
        if (r->flops > 0) cJSON_AddNumberToObject(e, "flops_per_step", r->flops * per);
        if (r->flops > 0 && r->seconds > 0) cJSON_AddNumberToObject(e, "tflops", r->flops / r->seconds / 1e12);
        if (r->bytes > 0) cJSON_AddNumberToObject(e, "bytes_per_step", r->bytes * per);
        if (r->bytes > 0 && r->seconds > 0) cJSON_AddNumberToObject(e, "gbps", r->bytes / r->seconds / 1e9);
    }
    prof_sum sums[PROF_SUMS];
    for (int by_stream = 0; by_stream < 2; by_stream++) {
        int ns = sum_rows(rows, n, by_stream, sums, PROF_SUMS);
        cJSON *sb = cJSON_AddObjectToObject(o, by_stream ? "streams_busy_ms_per_step" : "by_op_ms_per_step");
        for (int j = 0; sb && j < ns; j++) cJSON_AddNumberToObject(sb, sums[j].name, 1e3 * sums[j].s * per);
    }
    cJSON *hw = cJSON_AddObjectToObject(o, "host_ms_per_step");
    for (int j = 0; hw && j < p->n_waits; j++) cJSON_AddNumberToObject(hw, p->waits[j].name, 1e3 * p->waits[j].s * per);
    return o;
}
