/* Training checkpoints: a directory per save, built under a temporary name,
 * every file fsynced, renamed into place, then the `latest` pointer replaced
 * atomically. A crash at any moment leaves `latest` naming a complete
 * checkpoint. */
#include "offload/offload_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "model/safetensors.h" /* defines: model_st_write, model_st_open */

#define STATE_FORMAT "zoffload-train-state"

static void hook(offload_t *rt, const char *point)
{
    if (rt->cfg.ckpt_hook) rt->cfg.ckpt_hook(rt->cfg.ckpt_hook_user, point);
}

static zo_status fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zo_error(ZO_ERR_IO, "%s: open for fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc) return zo_error(ZO_ERR_IO, "%s: fsync: %s", path, strerror(e));
    return ZO_OK;
}

/* Write a small file atomically: <path>.tmp, fsync, rename, fsync the directory. */
static zo_status write_atomic(const char *dir, const char *name, const char *text)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return zo_error(ZO_ERR_IO, "%s: create: %s", tmp, strerror(errno));
    size_t len = strlen(text), done = 0;
    while (done < len) {
        ssize_t w = write(fd, text + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return zo_error(ZO_ERR_IO, "%s: write: %s", tmp, strerror(e));
        }
        done += (size_t)w;
    }
    if (fsync(fd)) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return zo_error(ZO_ERR_IO, "%s: fsync: %s", tmp, strerror(e));
    }
    close(fd);
    if (rename(tmp, path)) {
        int e = errno;
        unlink(tmp);
        return zo_error(ZO_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(e));
    }
    return fsync_path(dir);
}

/* rm -r of a checkpoint directory (files only, one level). */
static void remove_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(path);
}

/* The directory name `latest` holds, or "" when none. */
static void read_latest(const char *dir, char *name, size_t len)
{
    char path[4096];
    name[0] = 0;
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(name, (int)len, f)) name[0] = 0;
    fclose(f);
    name[strcspn(name, "\r\n")] = 0;
}

/* ---- the optimizer state as a safetensors file ----------------------------------- */

typedef struct fill_ctx {
    offload_t *rt;
    float *buf;          /* one NVMe sub-group: master, m, v */
    size_t buf_n;
    long group;          /* cached sub-group, -1 none */
    int half_called;
} fill_ctx;

static zo_status fill_opt(void *user, int index, uint64_t first, uint64_t count, void *dst)
{
    fill_ctx *c = user;
    offload_t *rt = c->rt;
    if (index == 1 && !c->half_called) { /* the master is written, the moments not yet */
        c->half_called = 1;
        hook(rt, "optimizer-half");
    }
    float *out = dst;
    const float *cpu = index == 0 ? rt->master : index == 1 ? rt->mom : rt->var;
    uint64_t e = first, end = first + count;
    while (e < end) {
        if (e < rt->n_cpu) {
            uint64_t stop = end < rt->n_cpu ? end : rt->n_cpu;
            memcpy(out + (e - first), cpu + e, (stop - e) * 4);
            e = stop;
            continue;
        }
        if (e >= rt->dev_first) { /* the device share (the end of the index) */
            zo_status st = offload_dev_state_get(rt, index, e - rt->dev_first, end - e,
                                                 out + (e - first));
            if (st != ZO_OK) return st;
            e = end;
            continue;
        }
        /* on NVMe: find and load the sub-group holding e */
        size_t G = offload_opt_groups(rt), f = 0, n = 0, g;
        for (g = 0; g < G; g++) {
            offload_opt_group_range(rt, g, &f, &n);
            if (e - rt->n_cpu < f + n) break;
        }
        if (g == G) return zo_error(ZO_ERR_INTERNAL, "offload_save: element %llu beyond the state",
                                    (unsigned long long)e);
        if (c->group != (long)g) {
            if (n > c->buf_n) {
                free(c->buf);
                c->buf = malloc(3 * n * sizeof(float));
                if (!c->buf) return zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
                c->buf_n = n;
            }
            zo_status st = offload_opt_load_group(rt, g, c->buf, c->buf + n, c->buf + 2 * n);
            if (st != ZO_OK) return st;
            c->group = (long)g;
        }
        size_t lo = rt->n_cpu + f;
        uint64_t stop = end < lo + n ? end : lo + n;
        memcpy(out + (e - first), c->buf + (size_t)index * n + (e - lo), (stop - e) * 4);
        e = stop;
    }
    return ZO_OK;
}

static zo_status write_state(offload_t *rt, const char *dir, const offload_ckpt_meta *meta)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
    cJSON_AddStringToObject(o, "format", STATE_FORMAT);
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddNumberToObject(o, "step", (double)rt->step);
    cJSON_AddNumberToObject(o, "loss_scale", (double)rt->loss_scale);
    cJSON_AddNumberToObject(o, "good_steps", rt->good_steps);
    cJSON_AddNumberToObject(o, "skipped", (double)rt->skipped);
    cJSON_AddNumberToObject(o, "params", (double)rt->n);
    cJSON_AddStringToObject(o, "dtype", zo_dtype_name(rt->m.dtype));
    cJSON_AddNumberToObject(o, "data_step", meta ? (double)meta->data_step : 0);
    cJSON_AddNumberToObject(o, "seed", meta ? (double)meta->seed : 0);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
    zo_status st = write_atomic(dir, "state.json", text);
    free(text);
    return st;
}

zo_status offload_save(offload_t *rt, const char *dir, const offload_ckpt_meta *meta,
                       offload_weights_writer writer, void *writer_user)
{
    zo_status st = offload_grads_drain(rt);
    if (st != ZO_OK) return st;
    if (rt->micro)
        return zo_error(ZO_ERR_INVALID, "offload_save: %d micro-batches are accumulated; save between steps",
                        rt->micro);
    if (mkdir(dir, 0755) && errno != EEXIST)
        return zo_error(ZO_ERR_IO, "%s: mkdir: %s", dir, strerror(errno));
    char name[64], latest[256], final[4096], tmp[4096], path[4200];
    /* step-N, or step-N.K when the latest checkpoint already has that name
     * (fp16 steps skipped for overflow leave the step count where it was but
     * move the data position and the loss scale; a run resumed from an older
     * directory reaches a step number already taken). Every save is kept:
     * the new one becomes the latest and the others are removed after. */
    read_latest(dir, latest, sizeof latest);
    snprintf(name, sizeof name, "step-%08lld", (long long)rt->step);
    for (int k = 1; !strcmp(latest, name); k++)
        snprintf(name, sizeof name, "step-%08lld.%d", (long long)rt->step, k);
    snprintf(final, sizeof final, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", dir, name);
    remove_dir(tmp);   /* leftovers of a crash */
    remove_dir(final); /* renamed but never made latest */
    if (mkdir(tmp, 0755)) return zo_error(ZO_ERR_IO, "%s: mkdir: %s", tmp, strerror(errno));
    hook(rt, "begin");

    if (writer) {
        float *all = malloc(rt->n * sizeof(float) + 4);
        float **blocks = calloc((size_t)rt->nb, sizeof(float *));
        if (!all || !blocks) st = zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
        for (int b = 0; st == ZO_OK && b < rt->nb; b++) blocks[b] = all + rt->off[b];
        if (st == ZO_OK) st = offload_get_weights(rt, blocks);
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        if (st == ZO_OK) st = writer(writer_user, path, (const float *const *)blocks);
        free(all);
        free(blocks);
        if (st != ZO_OK) goto out_remove;
    }
    fill_ctx fc = {.rt = rt, .group = -1};
    model_st_entry e[3] = {
        {.name = "master", .dtype = ZO_DTYPE_F32, .ndim = 1, .shape = {(int64_t)rt->n}},
        {.name = "exp_avg", .dtype = ZO_DTYPE_F32, .ndim = 1, .shape = {(int64_t)rt->n}},
        {.name = "exp_avg_sq", .dtype = ZO_DTYPE_F32, .ndim = 1, .shape = {(int64_t)rt->n}},
    };
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    st = model_st_write(path, e, 3, fill_opt, &fc);
    free(fc.buf);
    if (st != ZO_OK) goto out_remove;
    if ((st = write_state(rt, tmp, meta)) != ZO_OK) goto out_remove;
    if ((st = fsync_path(tmp)) != ZO_OK) goto out_remove;
    hook(rt, "before-rename");
    if (rename(tmp, final)) {
        st = zo_error(ZO_ERR_IO, "rename %s -> %s: %s", tmp, final, strerror(errno));
        goto out_remove;
    }
    if ((st = fsync_path(dir)) != ZO_OK) return st;
    hook(rt, "before-latest");
    char line[80];
    snprintf(line, sizeof line, "%s\n", name);
    if ((st = write_atomic(dir, "latest", line)) != ZO_OK) return st;
    /* older checkpoints go once the new one is the latest */
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (strncmp(de->d_name, "step-", 5) || !strcmp(de->d_name, name)) continue;
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            remove_dir(path);
        }
        closedir(d);
    }
    return ZO_OK;

out_remove:
    remove_dir(tmp);
    return st;
}

/* ---- loading ------------------------------------------------------------------------ */

static zo_status json_number(const cJSON *o, const char *key, const char *path, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v)) return zo_error(ZO_ERR_FORMAT, "%s: field \"%s\" missing or not a number", path, key);
    *out = v->valuedouble;
    return ZO_OK;
}

/* A counter: a whole number in [0, 2^53] (what a double holds exactly). */
static zo_status check_count(double v, const char *key, const char *path)
{
    if (!(v >= 0 && v <= 9007199254740992.0) || v != floor(v))
        return zo_error(ZO_ERR_FORMAT, "%s: \"%s\" = %g is not a non-negative integer", path, key, v);
    return ZO_OK;
}

static zo_status read_state(const char *path, cJSON **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return zo_error(errno == ENOENT ? ZO_ERR_NOT_FOUND : ZO_ERR_IO, "%s: %s", path, strerror(errno));
    char buf[4096];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    *out = cJSON_Parse(buf);
    if (!*out) return zo_error(ZO_ERR_FORMAT, "%s: not valid JSON", path);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(*out, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, STATE_FORMAT)) {
        cJSON_Delete(*out);
        return zo_error(ZO_ERR_FORMAT, "%s: \"format\" is not \"%s\"", path, STATE_FORMAT);
    }
    return ZO_OK;
}

zo_status offload_load(offload_t *rt, const char *dir, offload_ckpt_meta *meta)
{
    char ck[4096], path[4200];
    zo_status st;
    snprintf(path, sizeof path, "%s/state.json", dir);
    if (access(path, F_OK) == 0) {
        snprintf(ck, sizeof ck, "%s", dir);
    } else {
        char name[256];
        read_latest(dir, name, sizeof name);
        if (!name[0] || strchr(name, '/'))
            return zo_error(ZO_ERR_NOT_FOUND, "%s: no checkpoint (no state.json and no valid 'latest')", dir);
        snprintf(ck, sizeof ck, "%s/%s", dir, name);
        snprintf(path, sizeof path, "%s/state.json", ck);
    }
    cJSON *state = NULL;
    if ((st = read_state(path, &state)) != ZO_OK) return st;
    double step = 0, scale = 1, good = 0, skipped = 0, params = 0, data_step = 0, seed = 0;
    if ((st = json_number(state, "step", path, &step)) != ZO_OK ||
        (st = json_number(state, "loss_scale", path, &scale)) != ZO_OK ||
        (st = json_number(state, "good_steps", path, &good)) != ZO_OK ||
        (st = json_number(state, "skipped", path, &skipped)) != ZO_OK ||
        (st = json_number(state, "params", path, &params)) != ZO_OK) {
        cJSON_Delete(state);
        return st;
    }
    json_number(state, "data_step", path, &data_step);
    json_number(state, "seed", path, &seed);
    zo_clear_error();
    cJSON_Delete(state);
    /* a tampered or corrupt state is refused before anything is loaded: a
     * loss scale of 0 would turn the next step's weights into NaN */
    if ((st = check_count(step, "step", path)) != ZO_OK || (st = check_count(good, "good_steps", path)) != ZO_OK ||
        (st = check_count(skipped, "skipped", path)) != ZO_OK ||
        (st = check_count(params, "params", path)) != ZO_OK ||
        (st = check_count(data_step, "data_step", path)) != ZO_OK)
        return st;
    if (!(seed >= 0 && seed < 18446744073709551616.0))
        return zo_error(ZO_ERR_FORMAT, "%s: \"seed\" = %g is not a 64-bit unsigned integer", path, seed);
    if (!(scale > 0 && isfinite(scale) && scale <= FLT_MAX))
        return zo_error(ZO_ERR_FORMAT, "%s: \"loss_scale\" = %g is not a positive float", path, scale);
    if ((size_t)params != rt->n)
        return zo_error(ZO_ERR_FORMAT, "%s: checkpoint of %.0f parameters, the model has %zu", path,
                        params, rt->n);

    model_st_file f;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", ck);
    if ((st = model_st_open(&f, path)) != ZO_OK) return st;
    const char *names[3] = {"master", "exp_avg", "exp_avg_sq"};
    const uint8_t *data[3];
    for (int i = 0; i < 3; i++) {
        const model_st_tensor *t = model_st_find(&f, names[i]);
        if (!t || t->dtype != ZO_DTYPE_F32 || t->numel != rt->n) {
            model_st_close(&f);
            return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\" missing or not F32 [%zu]", path, names[i], rt->n);
        }
        data[i] = model_st_data(&f, t);
    }
    if ((st = offload_grads_drain(rt)) != ZO_OK) goto out_close;
    memcpy(rt->master, data[0], rt->n_cpu * 4);
    memcpy(rt->mom, data[1], rt->n_cpu * 4);
    memcpy(rt->var, data[2], rt->n_cpu * 4);
    size_t G = offload_opt_groups(rt);
    for (size_t g = 0; g < G && st == ZO_OK; g++) {
        size_t fst, n;
        offload_opt_group_range(rt, g, &fst, &n);
        float *buf = malloc(3 * n * sizeof(float));
        if (!buf) {
            st = zo_error(ZO_ERR_NOMEM, "offload_load: out of host memory");
            break;
        }
        for (int i = 0; i < 3; i++) memcpy(buf + (size_t)i * n, data[i] + (rt->n_cpu + fst) * 4, n * 4);
        st = offload_opt_store_group(rt, g, buf, buf + n, buf + 2 * n);
        free(buf);
    }
    for (int i = 0; i < 3 && st == ZO_OK && rt->dev_first < rt->n; i++)
        st = offload_dev_state_set(rt, i, 0, rt->n - rt->dev_first,
                                   (const float *)(data[i] + rt->dev_first * 4));
    if (st != ZO_OK) goto out_close;
    /* the 16-bit store from the master */
    float *all = malloc(rt->n * sizeof(float) + 4);
    const float **blocks = calloc((size_t)rt->nb, sizeof(float *));
    if (!all || !blocks) {
        free(all);
        free(blocks);
        st = zo_error(ZO_ERR_NOMEM, "offload_load: out of host memory");
        goto out_close;
    }
    memcpy(all, data[0], rt->n * 4);
    for (int b = 0; b < rt->nb; b++) blocks[b] = all + rt->off[b];
    st = offload_store_from_master(rt, blocks);
    free(all);
    free(blocks);
    if (st != ZO_OK) goto out_close;
    rt->step = (int64_t)step;
    rt->loss_scale = (float)scale;
    rt->good_steps = (int)good;
    rt->skipped = (int64_t)skipped;
    rt->micro = 0;
    if (meta) {
        meta->data_step = (int64_t)data_step;
        meta->seed = (uint64_t)seed;
    }
out_close:
    model_st_close(&f);
    return st;
}
