/* Training checkpoints: a directory per save, built under a temporary name,
 * every file fsynced, renamed into place, then the `latest` pointer replaced
 * atomically. A crash at any moment leaves `latest` naming a complete
 * checkpoint.
 *
 * Weights and optimizer state move one block at a time, through the
 * optimizer shards and the weight store: host memory holds a few blocks, never
 * the model. optimizer.safetensors holds "block.<b>.master", ".exp_avg" and
 * ".exp_avg_sq" for every block b, in block order (version 2; version 1's
 * three whole-model tensors "master", "exp_avg", "exp_avg_sq" still load). */
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

#include "common/fileio.h"     /* defines: zo_file_read_all */
#include "model/safetensors.h" /* defines: model_st_write, model_st_open */

#define STATE_FORMAT "zoffload-train-state"
#define STATE_VERSION 2

static const char *const opt_names[3] = {"master", "exp_avg", "exp_avg_sq"};

static void hook(const offload_t *rt, const char *point)
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

/* ---- saving ------------------------------------------------------------------------ */

/* Elements moved at once by a save or a load: one sub-group of master, m
 * and v in host memory (at most a block). */
static size_t io_chunk(const offload_t *rt)
{
    size_t c = rt->cfg.sub_group < rt->g.largest ? rt->cfg.sub_group : rt->g.largest;
    return c ? c : 1;
}

static zo_status read_master(void *ctx, int block, float *dst)
{
    offload_t *rt = ctx;
    if (block < 0 || block >= rt->g.nb)
        return zo_error(ZO_ERR_INVALID, "offload: block %d of %d", block, rt->g.nb);
    return offload_get_block(rt, block, dst);
}

/* optimizer.safetensors: three tensors a block, chunk by chunk, each chunk
 * read once from the shards (an NVMe sub-group is read once). The blocks as
 * the optimizer holds them (og): whole, or the rank's parts (a rank's shard
 * file; a block of which it holds nothing has no tensors). */
static zo_status write_opt(offload_t *rt, const char *path)
{
    int nb = rt->g.nb, n = 0;
    const offload_geom *og = &rt->og;
    size_t C = io_chunk(rt);
    zo_status st;
    float *buf = NULL;
    model_st_writer *w = NULL;
    model_st_entry *e = calloc(3 * (size_t)nb, sizeof *e);
    char(*names)[48] = calloc(3 * (size_t)nb, sizeof *names);
    int *first = calloc((size_t)nb, sizeof *first); /* block b's first entry */
    if (!e || !names || !first) {
        st = zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
        goto out_free;
    }
    for (int b = 0; b < nb; b++) {
        first[b] = n;
        if (!og->numel[b] && rt->dp) continue;
        for (int a = 0; a < 3; a++, n++) {
            snprintf(names[n], sizeof names[n], "block.%d.%s", b, opt_names[a]);
            e[n] = (model_st_entry){.name = names[n], .dtype = ZO_DTYPE_F32, .ndim = 1,
                                    .shape = {(int64_t)og->numel[b]}};
        }
    }
    if ((st = offload_host_alloc(&rt->env, 3 * C * 4, 0, (void **)&buf)) != ZO_OK) goto out_free;
    if ((st = model_st_writer_open(&w, path, e, n)) != ZO_OK) goto out_free;
    for (int b = 0; b < nb && st == ZO_OK; b++) {
        if (b == nb / 2) hook(rt, "optimizer-half"); /* half the blocks are written */
        for (size_t rel = 0; rel < og->numel[b] && st == ZO_OK; rel += C) {
            size_t k = og->numel[b] - rel < C ? og->numel[b] - rel : C;
            st = ostate_read(rt->shards, rt->n_shards, og->off[b] + rel, k, buf, buf + C, buf + 2 * C);
            for (int a = 0; a < 3 && st == ZO_OK; a++)
                st = model_st_writer_put(w, first[b] + a, rel, k, buf + (size_t)a * C);
        }
    }
    if (st == ZO_OK) st = model_st_writer_commit(w);
    else model_st_writer_abort(w);
out_free:
    offload_host_free(&rt->env, buf, 3 * C * 4, 0);
    free(names);
    free(e);
    free(first);
    return st;
}

static zo_status write_state(offload_t *rt, const char *dir, const offload_ckpt_meta *meta)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
    cJSON_AddStringToObject(o, "format", STATE_FORMAT);
    cJSON_AddNumberToObject(o, "version", STATE_VERSION);
    cJSON_AddNumberToObject(o, "step", (double)rt->step);
    cJSON_AddNumberToObject(o, "loss_scale", (double)rt->loss_scale);
    cJSON_AddNumberToObject(o, "good_steps", rt->good_steps);
    cJSON_AddNumberToObject(o, "skipped", (double)rt->skipped);
    cJSON_AddNumberToObject(o, "params", (double)rt->g.n);
    cJSON_AddNumberToObject(o, "blocks", rt->g.nb);
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

/* The new checkpoint's names: DIR/step-N, or DIR/step-N.K when the latest
 * checkpoint already has that name (fp16 steps skipped for overflow leave
 * the step count where it was but move the data position and the loss
 * scale; a run resumed from an older directory reaches a step number
 * already taken), built in DIR/.tmp-<name>, which is made here (leftovers
 * of a crash removed). */
static zo_status ckpt_prepare(offload_t *rt, const char *dir, char *name, size_t name_len, char *final,
                              char *tmp)
{
    char latest[256];
    if (mkdir(dir, 0755) && errno != EEXIST) return zo_error(ZO_ERR_IO, "%s: mkdir: %s", dir, strerror(errno));
    read_latest(dir, latest, sizeof latest);
    snprintf(name, name_len, "step-%08lld", (long long)rt->step);
    for (int k = 1; !strcmp(latest, name); k++) snprintf(name, name_len, "step-%08lld.%d", (long long)rt->step, k);
    snprintf(final, 4096, "%s/%s", dir, name);
    snprintf(tmp, 4096, "%s/.tmp-%s", dir, name);
    remove_dir(tmp);   /* leftovers of a crash */
    remove_dir(final); /* renamed but never made latest */
    if (mkdir(tmp, 0755)) return zo_error(ZO_ERR_IO, "%s: mkdir: %s", tmp, strerror(errno));
    return ZO_OK;
}

/* The complete DIR/.tmp-<name> renamed to DIR/<name>, made the latest, and
 * the older checkpoints removed. Every save is kept until the new one is
 * the latest. */
static zo_status ckpt_publish(offload_t *rt, const char *dir, const char *name, const char *final,
                              const char *tmp)
{
    char path[4200];
    zo_status st;
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

/* ---- several ranks: a shard per rank and a manifest ---------------------------------
 *
 * ZeRO 0: every rank holds the same state, and rank 0 saves it as one rank
 * does. ZeRO 1-3: in the same directory, each rank writes its optimizer
 * shard, optimizer-<r>-of-<N>.safetensors (three tensors per block of its
 * part, none for a block of which it holds nothing), rank 0 the weights
 * (model.safetensors, every rank reading the blocks it asks for: they are
 * gathered), state.json and, last, manifest.json: the rank count and each
 * block's elements and part size, from which a run of any rank count
 * re-partitions (offload_load). The directory is renamed into place once
 * every rank's files are in it. Each stage ends with every rank learning
 * whether every other succeeded. */

static const char *const manifest_name = "manifest.json";
#define MANIFEST_FORMAT "zoffload-optimizer-shards"
#define MANIFEST_VERSION 1

static void shard_file(char *buf, size_t len, int r, int n)
{
    snprintf(buf, len, "optimizer-%05d-of-%05d.safetensors", r, n);
}

/* Every rank's status of a stage: the first failure becomes every rank's. */
static zo_status dp_agree(offload_t *rt, zo_status mine, const char *what)
{
    offload_dp *dp = rt->dp;
    int32_t *all = calloc((size_t)dp->size, sizeof *all), me = (int32_t)mine;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", mine != ZO_OK ? zo_last_error() : "");
    if (!all) return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", what);
    zo_status st = offload_dp_gather(dp, &me, sizeof me, all);
    for (int r = 0; r < dp->size && st == ZO_OK; r++)
        if (all[r] != ZO_OK)
            st = r == dp->rank ? zo_error(mine, "%s", msg)
                               : zo_error((zo_status)all[r], "%s: rank %d of %d failed", what, r, dp->size);
    free(all);
    return st;
}

/* Rank 0 reads a block (for its writer) and tells the others, who read it
 * too: reading a partitioned block is a collective. -1 ends. */
static zo_status told_read(offload_t *rt, int32_t block, float *dst, int32_t *told)
{
    int32_t *all = calloc((size_t)rt->dp->size, sizeof *all);
    if (!all) return zo_error(ZO_ERR_NOMEM, "offload: out of host memory");
    zo_status st = offload_dp_gather(rt->dp, &block, sizeof block, all);
    *told = all[0];
    free(all);
    if (st != ZO_OK) return st;
    return *told >= 0 ? offload_get_block(rt, *told, dst) : ZO_OK;
}

static zo_status read_master_told(void *ctx, int block, float *dst)
{
    int32_t told;
    return told_read(ctx, block, dst, &told);
}

zo_status offload_write_weights(offload_t *rt, const char *path, offload_weights_stream writer, void *user)
{
    if (!offload_dp_partitioned(rt->dp)) /* every rank has every block: rank 0 writes */
        return rt->dp && rt->dp->rank ? ZO_OK : writer(user, path, read_master, rt);
    zo_status st;
    int32_t told = 0;
    if (rt->dp->rank == 0) {
        st = writer(user, path, read_master_told, rt);
        zo_status se = told_read(rt, -1, NULL, &told);
        return st != ZO_OK ? st : se;
    }
    float *buf;
    if ((st = offload_host_alloc(&rt->env, rt->g.largest * sizeof(float) + 4, 0, (void **)&buf)) != ZO_OK)
        return st;
    do st = told_read(rt, 0, buf, &told);
    while (st == ZO_OK && told >= 0);
    offload_host_free(&rt->env, buf, rt->g.largest * sizeof(float) + 4, 0);
    return st;
}

static zo_status write_manifest(offload_t *rt, const char *dir)
{
    offload_dp *dp = rt->dp;
    char file[64];
    cJSON *o = cJSON_CreateObject(), *blocks, *files;
    if (!o) return zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
    cJSON_AddStringToObject(o, "format", MANIFEST_FORMAT);
    cJSON_AddNumberToObject(o, "version", MANIFEST_VERSION);
    cJSON_AddNumberToObject(o, "ranks", dp->size);
    cJSON_AddNumberToObject(o, "zero_stage", dp->stage);
    cJSON_AddNumberToObject(o, "params", (double)rt->g.n);
    /* block b: [elements, part]; rank r holds [r part, min(elements, (r + 1) part)) */
    blocks = cJSON_AddArrayToObject(o, "blocks");
    files = cJSON_AddArrayToObject(o, "files");
    for (int b = 0; blocks && b < rt->g.nb; b++) {
        cJSON *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)rt->numel[b]));
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)(dp->pad[b] / (size_t)dp->size)));
        cJSON_AddItemToArray(blocks, e);
    }
    for (int r = 0; files && r < dp->size; r++) {
        shard_file(file, sizeof file, r, dp->size);
        cJSON_AddItemToArray(files, cJSON_CreateString(file));
    }
    char *text = blocks && files ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!text) return zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
    zo_status st = write_atomic(dir, manifest_name, text);
    free(text);
    return st;
}

static zo_status save_one(offload_t *rt, const char *dir, const offload_ckpt_meta *meta,
                          offload_weights_stream writer, void *writer_user);

static zo_status save_ranks(offload_t *rt, const char *dir, const offload_ckpt_meta *meta,
                            offload_weights_stream writer, void *writer_user)
{
    offload_dp *dp = rt->dp;
    if (!offload_dp_partitioned(dp))
        return dp_agree(rt, dp->rank == 0 ? save_one(rt, dir, meta, writer, writer_user) : ZO_OK,
                        "offload_save");
    char name[64] = "", final[4096], tmp[4096], path[4200], file[64];
    zo_status st = dp->rank == 0 ? ckpt_prepare(rt, dir, name, sizeof name, final, tmp) : ZO_OK;
    /* the directory rank 0 made, for everybody */
    char *names = calloc((size_t)dp->size, sizeof name);
    if (!names) return zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
    if ((st = dp_agree(rt, st, "offload_save")) == ZO_OK) st = offload_dp_gather(dp, name, sizeof name, names);
    if (st == ZO_OK) {
        snprintf(name, sizeof name, "%s", names);
        snprintf(final, sizeof final, "%s/%s", dir, name);
        snprintf(tmp, sizeof tmp, "%s/.tmp-%s", dir, name);
    }
    free(names);
    if (st != ZO_OK) return st;
    hook(rt, "begin");
    /* this rank's shard */
    shard_file(file, sizeof file, dp->rank, dp->size);
    snprintf(path, sizeof path, "%s/%s", tmp, file);
    if ((st = ostate_sync(rt->shards, rt->n_shards)) == ZO_OK && (st = write_opt(rt, path)) == ZO_OK)
        st = ostate_sync(rt->shards, rt->n_shards);
    /* the weights, gathered block by block (every rank takes part) */
    if (writer) {
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        zo_status sw = offload_write_weights(rt, path, writer, writer_user);
        if (st == ZO_OK) st = sw;
    }
    st = dp_agree(rt, st, "offload_save");
    /* rank 0 completes it: the counters, the manifest last, then into place */
    if (dp->rank == 0) {
        if (st == ZO_OK && (st = write_state(rt, tmp, meta)) == ZO_OK && (st = write_manifest(rt, tmp)) == ZO_OK)
            st = ckpt_publish(rt, dir, name, final, tmp);
        else remove_dir(tmp);
    }
    return dp_agree(rt, st, "offload_save");
}

static zo_status save_one(offload_t *rt, const char *dir, const offload_ckpt_meta *meta,
                          offload_weights_stream writer, void *writer_user)
{
    char name[64], final[4096], tmp[4096], path[4200];
    zo_status st;
    if ((st = ckpt_prepare(rt, dir, name, sizeof name, final, tmp)) != ZO_OK) return st;
    hook(rt, "begin");
    /* the state as the shards hold it: nothing cached in between */
    if ((st = ostate_sync(rt->shards, rt->n_shards)) != ZO_OK) goto out_remove;
    if (writer) {
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        if ((st = writer(writer_user, path, read_master, rt)) != ZO_OK) goto out_remove;
    }
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    if ((st = write_opt(rt, path)) != ZO_OK) goto out_remove;
    if ((st = ostate_sync(rt->shards, rt->n_shards)) != ZO_OK) goto out_remove;
    if ((st = write_state(rt, tmp, meta)) != ZO_OK) goto out_remove;
    return ckpt_publish(rt, dir, name, final, tmp);

out_remove:
    remove_dir(tmp);
    return st;
}

zo_status offload_save_streamed(offload_t *rt, const char *dir, const offload_ckpt_meta *meta,
                                offload_weights_stream writer, void *writer_user)
{
    zo_status st = offload_grads_drain(rt);
    if (st != ZO_OK) return st;
    if (rt->micro)
        return zo_error(ZO_ERR_INVALID, "offload_save: %d micro-batches are accumulated; save between steps",
                        rt->micro);
    if (rt->dp) return save_ranks(rt, dir, meta, writer, writer_user);
    return save_one(rt, dir, meta, writer, writer_user);
}

/* A whole-model writer behind the streamed interface: the blocks gathered
 * in host memory first (what offload_save's writer asks for). */
typedef struct gather_ctx {
    offload_weights_writer writer;
    void *user;
    size_t n;
    int nb;
    const size_t *off;
} gather_ctx;

static zo_status gather_write(void *user, const char *path, offload_block_reader read, void *ctx)
{
    gather_ctx *g = user;
    zo_status st = ZO_OK;
    float *all = malloc(g->n * sizeof(float) + 4);
    float **blocks = calloc((size_t)g->nb, sizeof(float *));
    if (!all || !blocks) st = zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
    for (int b = 0; st == ZO_OK && b < g->nb; b++) {
        blocks[b] = all + g->off[b];
        st = read(ctx, b, blocks[b]);
    }
    if (st == ZO_OK) st = g->writer(g->user, path, (const float *const *)blocks);
    free(all);
    free(blocks);
    return st;
}

zo_status offload_save(offload_t *rt, const char *dir, const offload_ckpt_meta *meta,
                       offload_weights_writer writer, void *writer_user)
{
    gather_ctx g = {.writer = writer, .user = writer_user, .n = rt->g.n, .nb = rt->g.nb, .off = rt->off};
    return offload_save_streamed(rt, dir, meta, writer ? gather_write : NULL, &g);
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

/* Where array a (master, m, v) of block b is in the file: a tensor and the
 * element it starts at. */
typedef struct opt_source {
    const model_st_tensor *t[3];
    size_t first;
} opt_source;

static zo_status find_sources(const offload_t *rt, const model_st_file *f, int version, int b,
                              opt_source *src)
{
    char name[48];
    src->first = version == 1 ? rt->off[b] : 0;
    size_t want = version == 1 ? rt->g.n : rt->numel[b];
    for (int a = 0; a < 3; a++) {
        if (version == 1) snprintf(name, sizeof name, "%s", opt_names[a]);
        else snprintf(name, sizeof name, "block.%d.%s", b, opt_names[a]);
        const model_st_tensor *t = model_st_find(f, name);
        if (!t || t->dtype != ZO_DTYPE_F32 || t->numel != want)
            return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\" missing or not F32 [%zu]", f->path, name, want);
        src->t[a] = t;
    }
    return ZO_OK;
}

/* n fp32 values of tensor t from element `first`, read (not mapped: host
 * memory holds what is read, no more). */
static zo_status read_f32(const model_st_file *f, const model_st_tensor *t, size_t first, size_t n,
                          float *dst)
{
    uint64_t at = f->data_start + t->begin + (uint64_t)first * 4;
    size_t left = n * 4;
    char *p = (char *)dst;
    while (left) {
        ssize_t r = pread(f->fd, p, left, (off_t)at);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return zo_error(ZO_ERR_IO, "%s: read at byte %llu: %s", f->path, (unsigned long long)at,
                            r < 0 ? strerror(errno) : "end of file");
        p += r;
        at += (uint64_t)r;
        left -= (size_t)r;
    }
    return ZO_OK;
}

/* A checkpoint's optimizer state as whole-block ranges, whatever its form:
 * optimizer.safetensors (versions 1 and 2), or the shards of N ranks with
 * their manifest, re-partitioned on the fly for this run's ranks. */
typedef struct ck_source {
    int version;
    model_st_file one;      /* one file */
    int opened;
    int ranks;              /* shards: how many, 0 for one file */
    size_t *part;           /* [nb] shards: elements of a rank's part of block b */
    model_st_file *files;   /* [ranks] */
    int n_files;
} ck_source;

static void source_close(ck_source *s)
{
    if (s->opened) model_st_close(&s->one);
    for (int r = 0; r < s->n_files; r++) model_st_close(&s->files[r]);
    free(s->files);
    free(s->part);
    memset(s, 0, sizeof *s);
}

/* Elements of rank r's part of a block of n split in parts of c. */
static size_t shard_n(size_t n, size_t c, int r)
{
    size_t a = (size_t)r * c;
    return a >= n ? 0 : (n - a < c ? n - a : c);
}

static zo_status shard_tensor(const ck_source *s, int r, int b, int a, size_t want, const model_st_tensor **out)
{
    char name[48];
    snprintf(name, sizeof name, "block.%d.%s", b, opt_names[a]);
    const model_st_tensor *t = model_st_find(&s->files[r], name);
    if (!t || t->dtype != ZO_DTYPE_F32 || t->numel != want)
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\" missing or not F32 [%zu]", s->files[r].path, name, want);
    *out = t;
    return ZO_OK;
}

/* manifest.json: the rank count and the partition; every shard opened and
 * every tensor checked. */
static zo_status open_shards(const offload_t *rt, const char *ck, ck_source *s)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", ck, manifest_name);
    char *text;
    zo_status st = zo_file_read_all(path, 1u << 26, "a checkpoint manifest", &text, NULL);
    if (st != ZO_OK) return st;
    cJSON *o = cJSON_Parse(text);
    free(text);
    if (!o) return zo_error(ZO_ERR_FORMAT, "%s: not valid JSON", path);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "version");
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(o, "ranks");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "params");
    const cJSON *blocks = cJSON_GetObjectItemCaseSensitive(o, "blocks");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(o, "files");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, MANIFEST_FORMAT) || !cJSON_IsNumber(ver) ||
        ver->valuedouble != MANIFEST_VERSION) {
        st = zo_error(ZO_ERR_FORMAT, "%s: not a version %d \"%s\" manifest", path, MANIFEST_VERSION,
                      MANIFEST_FORMAT);
        goto out_free;
    }
    if (!cJSON_IsNumber(ranks) || ranks->valuedouble < 1 || ranks->valuedouble > 1 << 20 ||
        ranks->valuedouble != floor(ranks->valuedouble) || !cJSON_IsArray(files) ||
        cJSON_GetArraySize(files) != (int)ranks->valuedouble) {
        st = zo_error(ZO_ERR_FORMAT, "%s: \"ranks\" is not a rank count with a file for each", path);
        goto out_free;
    }
    if (!cJSON_IsNumber(params) || params->valuedouble != (double)rt->g.n || !cJSON_IsArray(blocks) ||
        cJSON_GetArraySize(blocks) != rt->g.nb) {
        st = zo_error(ZO_ERR_FORMAT, "%s: shards of another model (\"params\", \"blocks\"): this one has %zu "
                      "parameters in %d blocks", path, rt->g.n, rt->g.nb);
        goto out_free;
    }
    s->ranks = (int)ranks->valuedouble;
    s->part = calloc((size_t)rt->g.nb, sizeof *s->part);
    s->files = calloc((size_t)s->ranks, sizeof *s->files);
    if (!s->part || !s->files) {
        st = zo_error(ZO_ERR_NOMEM, "offload_load: out of host memory");
        goto out_free;
    }
    for (int b = 0; b < rt->g.nb; b++) {
        const cJSON *e = cJSON_GetArrayItem(blocks, b);
        const cJSON *n = cJSON_GetArrayItem(e, 0), *c = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || !cJSON_IsNumber(n) || !cJSON_IsNumber(c) || n->valuedouble != (double)rt->numel[b] ||
            c->valuedouble != floor(c->valuedouble) || c->valuedouble * s->ranks < n->valuedouble ||
            c->valuedouble > n->valuedouble + 1) {
            st = zo_error(ZO_ERR_FORMAT, "%s: block %d is not [%zu elements, a part of at least 1/%d of them]", path,
                          b, rt->numel[b], s->ranks);
            goto out_free;
        }
        s->part[b] = (size_t)c->valuedouble;
    }
    for (int r = 0; r < s->ranks; r++) {
        const cJSON *f = cJSON_GetArrayItem(files, r);
        if (!cJSON_IsString(f) || strchr(f->valuestring, '/')) {
            st = zo_error(ZO_ERR_FORMAT, "%s: \"files\"[%d] is not a file name", path, r);
            goto out_free;
        }
        snprintf(path, sizeof path, "%s/%s", ck, f->valuestring);
        if ((st = model_st_open(&s->files[r], path)) != ZO_OK) goto out_free;
        s->n_files++;
        for (int b = 0; b < rt->g.nb; b++) {
            size_t n = shard_n(rt->numel[b], s->part[b], r);
            const model_st_tensor *t;
            for (int a = 0; a < 3 && n; a++)
                if ((st = shard_tensor(s, r, b, a, n, &t)) != ZO_OK) goto out_free;
        }
    }
out_free:
    cJSON_Delete(o);
    return st;
}

static zo_status source_open(const offload_t *rt, const char *ck, int version, ck_source *s)
{
    char path[4200];
    zo_status st;
    memset(s, 0, sizeof *s);
    s->version = version;
    snprintf(path, sizeof path, "%s/%s", ck, manifest_name);
    if (access(path, F_OK) == 0) {
        if ((st = open_shards(rt, ck, s)) != ZO_OK) source_close(s);
        return st;
    }
    snprintf(path, sizeof path, "%s/optimizer.safetensors", ck);
    if ((st = model_st_open(&s->one, path)) != ZO_OK) return st;
    s->opened = 1;
    opt_source src;
    for (int b = 0; b < rt->g.nb; b++)
        if ((st = find_sources(rt, &s->one, version, b, &src)) != ZO_OK) {
            source_close(s);
            return st;
        }
    return ZO_OK;
}

/* Elements [rel, rel + k) of block b's array a (master, m, v) into dst. */
static zo_status source_read(ck_source *s, const offload_t *rt, int b, size_t rel, size_t k, int a, float *dst)
{
    zo_status st;
    if (!s->ranks) {
        opt_source src;
        if ((st = find_sources(rt, &s->one, s->version, b, &src)) != ZO_OK) return st;
        return read_f32(&s->one, src.t[a], src.first + rel, k, dst);
    }
    size_t c = s->part[b];
    for (int r = (int)(rel / c); r < s->ranks && (size_t)r * c < rel + k; r++) {
        size_t first = (size_t)r * c, n = shard_n(rt->numel[b], c, r);
        size_t lo = rel > first ? rel : first, hi = rel + k < first + n ? rel + k : first + n;
        const model_st_tensor *t = NULL;
        if (lo >= hi) continue;
        if ((st = shard_tensor(s, r, b, a, n, &t)) != ZO_OK ||
            (st = read_f32(&s->files[r], t, lo - first, hi - lo, dst + (lo - rel))) != ZO_OK)
            return st;
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
    double step = 0, scale = 1, good = 0, skipped = 0, params = 0, data_step = 0, seed = 0, version = 1;
    if ((st = json_number(state, "step", path, &step)) != ZO_OK ||
        (st = json_number(state, "loss_scale", path, &scale)) != ZO_OK ||
        (st = json_number(state, "good_steps", path, &good)) != ZO_OK ||
        (st = json_number(state, "skipped", path, &skipped)) != ZO_OK ||
        (st = json_number(state, "params", path, &params)) != ZO_OK ||
        (st = json_number(state, "version", path, &version)) != ZO_OK) {
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
    if (version != 1 && version != STATE_VERSION)
        return zo_error(ZO_ERR_FORMAT, "%s: \"version\" = %g: this runtime reads versions 1 and %d", path,
                        version, STATE_VERSION);
    if (!(seed >= 0 && seed < 18446744073709551616.0))
        return zo_error(ZO_ERR_FORMAT, "%s: \"seed\" = %g is not a 64-bit unsigned integer", path, seed);
    if (!(scale > 0 && isfinite(scale) && scale <= FLT_MAX))
        return zo_error(ZO_ERR_FORMAT, "%s: \"loss_scale\" = %g is not a positive float", path, scale);
    if ((size_t)params != rt->g.n)
        return zo_error(ZO_ERR_FORMAT, "%s: checkpoint of %.0f parameters, the model has %zu", path,
                        params, rt->g.n);

    /* every tensor is there before anything is overwritten */
    ck_source src;
    if ((st = source_open(rt, ck, (int)version, &src)) != ZO_OK) return st;
    if ((st = offload_grads_drain(rt)) != ZO_OK) goto out_close;
    size_t C = io_chunk(rt);
    float *buf;
    if ((st = offload_host_alloc(&rt->env, 3 * C * 4, 0, (void **)&buf)) != ZO_OK) goto out_close;
    for (int b = 0; b < rt->g.nb && st == ZO_OK; b++) {
        /* the optimizer's part of the block [po, pe) (all of it with one
         * rank); the store needs the whole block's weights, or that part */
        size_t po = offload_dp_part_first(rt->dp, b), pe = po + rt->og.numel[b];
        size_t r0 = rt->ws->part_only ? po : 0, r1 = rt->ws->part_only ? pe : rt->numel[b];
        for (size_t rel = r0; rel < r1 && st == ZO_OK; rel += C) {
            size_t k = r1 - rel < C ? r1 - rel : C;
            size_t lo = rel > po ? rel : po, hi = rel + k < pe ? rel + k : pe;
            st = source_read(&src, rt, b, rel, k, 0, buf);
            if (lo < hi) {
                for (int a = 1; a < 3 && st == ZO_OK; a++) st = source_read(&src, rt, b, lo, hi - lo, a, buf + a * C);
                if (st == ZO_OK)
                    st = ostate_write(rt->shards, rt->n_shards, rt->og.off[b] + (lo - po), hi - lo, buf + (lo - rel),
                                      buf + C, buf + 2 * C);
            }
            /* the 16-bit store from the master */
            if (st == ZO_OK) st = wstore_load_f32(rt->ws, b, rel, k, buf);
        }
    }
    offload_host_free(&rt->env, buf, 3 * C * 4, 0);
    zo_status ss = ostate_sync(rt->shards, rt->n_shards);
    if (st == ZO_OK) st = ss;
    ss = rt->ws->ops->sync(rt->ws);
    if (st == ZO_OK) st = ss;
    offload_slots_invalidate(rt);
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
    source_close(&src);
    return st;
}
