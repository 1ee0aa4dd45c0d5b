/* Pipelined optimizer step: read g+1 || update g || write g-1.
 * See nvme_pipeline.h. */
#include "nvme_pipeline.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"

#define PIPE_MAX_SLOTS 16

enum { SLOT_FREE = 0, SLOT_READING, SLOT_READY, SLOT_WRITING };

typedef struct pipe_slot {
    float *buf[3];          /* master, m, v: (group_elems,) fp32 each, NVME_ALIGN aligned */
    int state;              /* SLOT_*, owned by the I/O thread */
    size_t group;
    nvme_store_op op[3];
} pipe_slot;

struct nvme_pipeline {
    nvme_store_t *s;
    nvme_engine_t *e;
    size_t n, ge, K;
    int nslots;
    int *ids;               /* (K, 3) tensor ids (-1: a tensor of no bytes) */
    size_t (*tbytes)(const void *user, int j, size_t n);
    const void *tuser;
    pipe_slot slot[PIPE_MAX_SLOTS];

    /* shared by the caller's thread and the I/O thread during a step */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned char *ready;   /* (K,) sub-group read and verified */
    size_t updated;         /* sub-groups the callback has finished */
    int abort;              /* stop: an error on either side */
    zo_status io_status;
    char io_msg[1024];
    double io_seconds;
};


/* Bytes of tensor j of a sub-group of n elements. */
static size_t tensor_size(const nvme_pipeline_t *p, int j, size_t n)
{
    return p->tbytes ? p->tbytes(p->tuser, j, n) : n * sizeof(float);
}

zo_status nvme_pipeline_init(nvme_pipeline_t **out, nvme_store_t *store,
                             const nvme_pipeline_config *cfg)
{
    *out = NULL;
    if (!cfg || cfg->n_elems == 0 || cfg->group_elems == 0)
        return zo_error(ZO_ERR_INVALID, "nvme_pipeline_init: n_elems and group_elems must be > 0");
    int nslots = cfg->nslots ? cfg->nslots : 3;
    if (nslots < 2 || nslots > PIPE_MAX_SLOTS)
        return zo_error(ZO_ERR_INVALID, "nvme_pipeline_init: nslots %d out of range 2..%d",
                        nslots, PIPE_MAX_SLOTS);
    const char *prefix = cfg->prefix ? cfg->prefix : "opt";
    static const char *kind[3] = {"master", "m", "v"};
    zo_status st;
    nvme_pipeline_t *p = calloc(1, sizeof *p);
    if (!p) return zo_error(ZO_ERR_NOMEM, "nvme_pipeline_init: out of memory");
    p->s = store;
    p->e = nvme_store_engine(store);
    p->n = cfg->n_elems;
    p->ge = cfg->group_elems < cfg->n_elems ? cfg->group_elems : cfg->n_elems;
    p->K = (p->n + p->ge - 1) / p->ge;
    p->nslots = nslots;
    p->tbytes = cfg->tensor_bytes;
    p->tuser = cfg->tensor_user;
    size_t nt = 3 * p->K, na = 0;
    p->ids = malloc(nt * sizeof *p->ids);
    int *added = malloc(nt * sizeof *added);
    p->ready = calloc(p->K, 1);
    char **names = calloc(nt, sizeof *names);
    size_t *sizes = malloc(nt * sizeof *sizes);
    if (!p->ids || !p->ready || !names || !sizes || !added) {
        st = zo_error(ZO_ERR_NOMEM, "nvme_pipeline_init: out of memory for %zu sub-groups", p->K);
        goto out_free_names;
    }
    for (size_t g = 0; g < p->K; g++) {
        size_t first, n;
        nvme_pipeline_group_range(p, g, &first, &n);
        for (int j = 0; j < 3; j++) {
            p->ids[3 * g + j] = -1;
            if (!tensor_size(p, j, n)) continue;
            size_t len = strlen(prefix) + 48;
            names[na] = malloc(len);
            if (!names[na]) {
                st = zo_error(ZO_ERR_NOMEM, "nvme_pipeline_init: out of memory");
                goto out_free_names;
            }
            snprintf(names[na], len, "%s.%zu.%s", prefix, g, kind[j]);
            sizes[na] = tensor_size(p, j, n);
            added[na++] = (int)(3 * g + (size_t)j);
        }
    }
    int *ids = malloc((na ? na : 1) * sizeof *ids);
    st = ids ? nvme_store_add(store, na, (const char *const *)names, sizes, ids)
             : zo_error(ZO_ERR_NOMEM, "nvme_pipeline_init: out of memory");
    for (size_t i = 0; ids && st == ZO_OK && i < na; i++) p->ids[added[i]] = ids[i];
    free(ids);
    if (st != ZO_OK) {
        zo_error_wrap(st, "optimizer state of %zu parameters in %zu sub-groups", p->n, p->K);
        goto out_free_names;
    }
    for (int i = 0; i < nslots; i++)
        for (int j = 0; j < 3; j++) {
            if (!tensor_size(p, j, p->ge)) continue;
            st = nvme_buf_alloc(p->e, tensor_size(p, j, p->ge), (void **)&p->slot[i].buf[j]);
            if (st != ZO_OK) {
                zo_error_wrap(st, "nvme_pipeline_init: sub-group buffer");
                goto out_free_bufs;
            }
        }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (size_t i = 0; i < na; i++) free(names[i]);
    free(names);
    free(sizes);
    free(added);
    *out = p;
    return ZO_OK;

out_free_bufs:
    for (int i = 0; i < nslots; i++)
        for (int j = 0; j < 3; j++) nvme_buf_free(p->e, p->slot[i].buf[j]);
out_free_names:
    if (names)
        for (size_t i = 0; i < na; i++) free(names[i]);
    free(names);
    free(sizes);
    free(added);
    free(p->ids);
    free(p->ready);
    free(p);
    return st;
}

void nvme_pipeline_free(nvme_pipeline_t *p)
{
    if (!p) return;
    for (int i = 0; i < p->nslots; i++)
        for (int j = 0; j < 3; j++) nvme_buf_free(p->e, p->slot[i].buf[j]);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->ids);
    free(p->ready);
    free(p);
}

size_t nvme_pipeline_groups(const nvme_pipeline_t *p) { return p->K; }

void nvme_pipeline_group_range(const nvme_pipeline_t *p, size_t g, size_t *first, size_t *n)
{
    *first = g * p->ge;
    *n = g + 1 < p->K ? p->ge : p->n - *first;
}

static zo_status check_group(const nvme_pipeline_t *p, size_t g, const char *what)
{
    if (g >= p->K)
        return zo_error(ZO_ERR_INVALID, "%s: sub-group %zu of %zu", what, g, p->K);
    return ZO_OK;
}

zo_status nvme_pipeline_store_group(nvme_pipeline_t *p, size_t g, const float *master,
                                    const float *m, const float *v)
{
    zo_status st = check_group(p, g, "nvme_pipeline_store_group");
    if (st != ZO_OK) return st;
    size_t first, n;
    nvme_pipeline_group_range(p, g, &first, &n);
    const float *src[3] = {master, m, v};
    for (int j = 0; j < 3; j++) {
        if (p->ids[3 * g + j] < 0) continue;
        /* Through an aligned slot buffer, so the write goes straight to disk. */
        memcpy(p->slot[0].buf[j], src[j], tensor_size(p, j, n));
        st = nvme_store_write(p->s, p->ids[3 * g + j], p->slot[0].buf[j]);
        if (st != ZO_OK) return st;
    }
    return ZO_OK;
}

zo_status nvme_pipeline_load_group_part(nvme_pipeline_t *p, size_t g, size_t from, size_t count,
                                        float *master, float *m, float *v)
{
    zo_status st = check_group(p, g, "nvme_pipeline_load_group");
    if (st != ZO_OK) return st;
    size_t first, n;
    nvme_pipeline_group_range(p, g, &first, &n);
    if (from > n || count > n - from)
        return zo_error(ZO_ERR_INVALID, "nvme_pipeline_load_group: elements %zu..%zu of a group of %zu",
                        from, from + count, n);
    if (p->tbytes && (from || count != n))
        return zo_error(ZO_ERR_INVALID, "nvme_pipeline_load_group: part of a sub-group in another "
                        "encoding than fp32");
    float *dst[3] = {master, m, v};
    for (int j = 0; j < 3; j++) {
        if (p->ids[3 * g + j] < 0) continue;
        st = nvme_store_read(p->s, p->ids[3 * g + j], p->slot[0].buf[j]);
        if (st != ZO_OK) return st;
        if (p->tbytes) memcpy(dst[j], p->slot[0].buf[j], tensor_size(p, j, n));
        else memcpy(dst[j], p->slot[0].buf[j] + from, count * sizeof(float));
    }
    return ZO_OK;
}

zo_status nvme_pipeline_load_group(nvme_pipeline_t *p, size_t g, float *master, float *m,
                                   float *v)
{
    size_t first, n;
    nvme_pipeline_group_range(p, g, &first, &n);
    return nvme_pipeline_load_group_part(p, g, 0, n, master, m, v);
}

zo_status nvme_pipeline_slot_buffers(nvme_pipeline_t *p, int k, float **master, float **m,
                                     float **v)
{
    if (k < 1 || k >= p->nslots)
        return zo_error(ZO_ERR_INVALID, "nvme_pipeline_slot_buffers: slot %d of %d (slot 0 is the pipeline's)",
                        k, p->nslots);
    *master = p->slot[k].buf[0];
    *m = p->slot[k].buf[1];
    *v = p->slot[k].buf[2];
    return ZO_OK;
}

/* ---- the step ------------------------------------------------------------------ */

static void io_record_error(nvme_pipeline_t *p, zo_status st)
{
    pthread_mutex_lock(&p->mu);
    if (p->io_status == ZO_OK) {
        p->io_status = st;
        snprintf(p->io_msg, sizeof p->io_msg, "%s", zo_last_error());
    }
    p->abort = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Queue the three tensors of sub-group g to or from slot sl. On a failed
 * submit the parts already queued stay in flight and are finished later. */
static zo_status slot_submit(nvme_pipeline_t *p, pipe_slot *sl, size_t g, nvme_op_kind op)
{
    sl->group = g;
    sl->state = op == NVME_OP_READ ? SLOT_READING : SLOT_WRITING;
    for (int j = 0; j < 3; j++) memset(&sl->op[j], 0, sizeof sl->op[j]);
    for (int j = 0; j < 3; j++) {
        if (p->ids[3 * g + j] < 0) continue;
        zo_status st = nvme_store_submit(p->s, p->ids[3 * g + j], op, sl->buf[j], &sl->op[j]);
        if (st != ZO_OK) return st;
    }
    return ZO_OK;
}

static int slot_complete(const nvme_pipeline_t *p, const pipe_slot *sl)
{
    for (int j = 0; j < 3; j++)
        if (p->ids[3 * sl->group + j] >= 0 && !nvme_store_op_complete(&sl->op[j])) return 0;
    return 1;
}

/* Finish all three ops (each releases its resources); first error wins. */
static zo_status slot_finish(nvme_pipeline_t *p, pipe_slot *sl)
{
    zo_status first = ZO_OK;
    char msg[1024] = "";
    for (int j = 0; j < 3; j++) {
        if (!sl->op[j].ios) continue; /* never submitted */
        zo_status st = nvme_store_finish(p->s, &sl->op[j]);
        if (st != ZO_OK && first == ZO_OK) {
            first = st;
            snprintf(msg, sizeof msg, "%s", zo_last_error());
        }
    }
    if (first != ZO_OK) zo_error(first, "%s", msg);
    return first;
}

/* The I/O thread: keeps reads ahead of the callback and writes behind it. */
static void *pipe_io_thread(void *arg)
{
    nvme_pipeline_t *p = arg;
    size_t next_read = 0, next_write = 0, writes_done = 0;
    int failed = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        size_t updated = p->updated;
        int abort = p->abort;
        pthread_mutex_unlock(&p->mu);
        if (!abort && !failed) {
            zo_status st = ZO_OK;
            while (st == ZO_OK && next_write < updated) {
                pipe_slot *sl = &p->slot[next_write % (size_t)p->nslots];
                st = slot_submit(p, sl, next_write, NVME_OP_WRITE);
                next_write++;
            }
            while (st == ZO_OK && next_read < p->K &&
                   p->slot[next_read % (size_t)p->nslots].state == SLOT_FREE) {
                st = slot_submit(p, &p->slot[next_read % (size_t)p->nslots], next_read,
                                 NVME_OP_READ);
                next_read++;
            }
            if (st != ZO_OK) {
                failed = 1;
                io_record_error(p, st);
            }
        }
        int inflight = 0;
        for (int i = 0; i < p->nslots; i++)
            inflight += p->slot[i].state == SLOT_READING || p->slot[i].state == SLOT_WRITING;
        if (!inflight && (writes_done == p->K || abort || failed)) break;

        double t0 = zo_now();
        zo_status st = nvme_engine_progress(p->e, 1);
        if (inflight) p->io_seconds += zo_now() - t0;
        if (st != ZO_OK) { /* the ring itself failed: nothing more will complete */
            io_record_error(p, st);
            break;
        }
        for (int i = 0; i < p->nslots; i++) {
            pipe_slot *sl = &p->slot[i];
            if ((sl->state != SLOT_READING && sl->state != SLOT_WRITING) || !slot_complete(p, sl))
                continue;
            int reading = sl->state == SLOT_READING;
            st = slot_finish(p, sl);
            if (st != ZO_OK) {
                zo_error_wrap(st, "sub-group %zu %s", sl->group, reading ? "read" : "write-back");
                failed = 1;
                io_record_error(p, st);
                sl->state = SLOT_FREE;
                continue;
            }
            if (reading) {
                sl->state = SLOT_READY;
                pthread_mutex_lock(&p->mu);
                p->ready[sl->group] = 1;
                pthread_cond_broadcast(&p->cv);
                pthread_mutex_unlock(&p->mu);
            } else {
                sl->state = SLOT_FREE;
                writes_done++;
            }
        }
    }
    return NULL;
}

zo_status nvme_pipeline_step(nvme_pipeline_t *p, nvme_update_fn fn, void *user,
                             nvme_step_stats *stats)
{
    if (!fn) return zo_error(ZO_ERR_INVALID, "nvme_pipeline_step: no update function");
    double t_start = zo_now(), t_update = 0, t_wait = 0;
    memset(p->ready, 0, p->K);
    for (int i = 0; i < p->nslots; i++) p->slot[i].state = SLOT_FREE;
    p->updated = 0;
    p->abort = 0;
    p->io_status = ZO_OK;
    p->io_msg[0] = '\0';
    p->io_seconds = 0;
    pthread_t io;
    if (pthread_create(&io, NULL, pipe_io_thread, p) != 0)
        return zo_error(ZO_ERR_INTERNAL, "nvme_pipeline_step: cannot start the I/O thread");
    zo_status st = ZO_OK;
    for (size_t g = 0; g < p->K; g++) {
        double t0 = zo_now();
        pthread_mutex_lock(&p->mu);
        while (!p->ready[g] && !p->abort) pthread_cond_wait(&p->cv, &p->mu);
        int abort = p->abort;
        pthread_mutex_unlock(&p->mu);
        double t1 = zo_now();
        t_wait += t1 - t0;
        if (abort) break;
        pipe_slot *sl = &p->slot[g % (size_t)p->nslots];
        size_t first, n;
        nvme_pipeline_group_range(p, g, &first, &n);
        st = fn(user, g, first, n, sl->buf[0], sl->buf[1], sl->buf[2]);
        t_update += zo_now() - t1;
        pthread_mutex_lock(&p->mu);
        if (st != ZO_OK) p->abort = 1;
        else p->updated = g + 1;
        pthread_mutex_unlock(&p->mu);
        nvme_engine_wakeup(p->e);
        if (st != ZO_OK) {
            zo_error_wrap(st, "nvme_pipeline_step: update of sub-group %zu", g);
            break;
        }
    }
    pthread_join(io, NULL);
    if (st == ZO_OK && p->io_status != ZO_OK)
        st = zo_error(p->io_status, "nvme_pipeline_step: %s", p->io_msg);
    if (stats) {
        stats->seconds = zo_now() - t_start;
        stats->update_seconds = t_update;
        stats->wait_seconds = t_wait;
        stats->io_seconds = p->io_seconds;
        uint64_t state = 0;
        for (size_t g = 0; g < p->K; g++) {
            size_t first, n;
            nvme_pipeline_group_range(p, g, &first, &n);
            for (int j = 0; j < 3; j++) state += tensor_size(p, j, n);
        }
        stats->bytes_read = st == ZO_OK ? state : 0;
        stats->bytes_written = st == ZO_OK ? state : 0;
    }
    return st;
}
