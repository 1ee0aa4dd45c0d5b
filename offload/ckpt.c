/* Training checkpoints: a directory per save, built under a temporary name,
 * every file fsynced, the manifest (every file's size and XXH3-64) written
 * last, renamed into place, then the `latest` pointer replaced atomically. A
 * crash at any moment leaves `latest` naming a complete checkpoint; a
 * damaged one is refused when loaded, naming the file.
 *
 * The checkpoint folder is locked for as long as the runtime writes into it
 * (one run per folder), and the runtime removes only what it writes itself,
 * never through a link: directories named exactly step-<N> or step-<N>.<k>
 * (the newest `keep_checkpoints` are kept: the latest and the highest
 * numbered others) and the .tmp-<name> leftovers of an interrupted save.
 *
 * Weights and optimizer state move one block at a time, through the
 * optimizer shards and the weight store: host memory holds a few blocks, never
 * the model. optimizer.safetensors holds "block.<b>.master", ".exp_avg" and
 * ".exp_avg_sq" for every block b, in block order. */
#include "offload/offload_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"     /* defines: zo_dir_lock_take, zo_dir_remove_at, zo_file_write_all */
#include "model/safetensors.h" /* defines: model_st_write, model_st_open */
#include "offload/ckpt_meta.h" /* defines: ckpt_state, ckpt_manifest */

#define OPT_FILE "optimizer.safetensors"
#define MODEL_FILE "model.safetensors"
#define LATEST_FILE "latest"

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

/* The checkpoint DIR/latest names, "" when there is no such file; a name
 * that is not one the runtime writes (e.g. "../x") is refused. */
static zo_status read_latest(const char *dir, char *name, size_t len)
{
    char path[4200], *text;
    name[0] = 0;
    snprintf(path, sizeof path, "%s/" LATEST_FILE, dir);
    struct stat sb;
    if (lstat(path, &sb) != 0 && errno == ENOENT) return ZO_OK;
    zo_status st = zo_file_read_all(path, 256, "a checkpoint folder's latest pointer", &text, NULL);
    if (st != ZO_OK) return st;
    text[strcspn(text, "\r\n")] = 0;
    int64_t step;
    int k;
    if (!ckpt_name_parse(text, &step, &k) || strlen(text) >= len)
        st = zo_error(ZO_ERR_FORMAT, "%s: \"%.64s\" is not a checkpoint's name (step-NNNNNNNN)", path, text);
    else
        snprintf(name, len, "%s", text);
    free(text);
    return st;
}

zo_status offload_ckpt_lock(offload_t *rt, const char *dir)
{
    if (zo_dir_lock_holds(&rt->ckpt_lock, dir)) return ZO_OK;
    if (mkdir(dir, 0755) && errno != EEXIST)
        return zo_error(ZO_ERR_IO, "%s: mkdir: %s", dir, strerror(errno));
    zo_dir_lock l;
    zo_status st = zo_dir_lock_take(dir, "the checkpoint folder", &l);
    if (st != ZO_OK) return st;
    zo_dir_lock_release(&rt->ckpt_lock); /* a save into another folder moves the lock there */
    rt->ckpt_lock = l;
    return ZO_OK;
}

typedef struct ckpt_entry {
    char name[64];
    int64_t step;
    int k;
} ckpt_entry;

static int cmp_newest_first(const void *a, const void *b)
{
    const ckpt_entry *x = a, *y = b;
    if (x->step != y->step) return x->step > y->step ? -1 : 1;
    return x->k > y->k ? -1 : x->k < y->k;
}

/* After a save: the checkpoints beyond the newest `keep` go (the latest is
 * always kept, then the highest step numbers), and so do leftovers of
 * interrupted saves. Only directories with the exact names the runtime
 * writes are touched, never through a link; failures leave things be (the
 * new checkpoint is complete either way). */
static void rotate(const offload_t *rt, int dfd, const char *latest)
{
    int keep = rt->cfg.keep_checkpoints > 0 ? rt->cfg.keep_checkpoints : 1;
    int cap = 16, n = 0;
    ckpt_entry *e = malloc((size_t)cap * sizeof *e);
    int fd = dup(dfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d || !e) {
        if (fd >= 0 && !d) close(fd);
        free(e);
        return;
    }
    rewinddir(d); /* the descriptor is a dup: its position is dfd's */
    struct dirent *de;
    while ((de = readdir(d))) {
        int tmp = !strncmp(de->d_name, ".tmp-", 5);
        const char *name = tmp ? de->d_name + 5 : de->d_name;
        int64_t step;
        int k;
        struct stat sb;
        if (!ckpt_name_parse(name, &step, &k) || strlen(de->d_name) >= sizeof e->name ||
            fstatat(dfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode))
            continue;
        if (tmp) { /* no save is under way but ours, which is done: a crash's leftovers */
            zo_dir_remove_at(dfd, de->d_name);
            continue;
        }
        if (!strcmp(name, latest)) continue;
        if (n == cap) {
            ckpt_entry *g = realloc(e, 2 * (size_t)cap * sizeof *e);
            if (!g) break;
            e = g;
            cap *= 2;
        }
        e[n++] = (ckpt_entry){.step = step, .k = k};
        snprintf(e[n - 1].name, sizeof e->name, "%s", name);
    }
    closedir(d);
    qsort(e, (size_t)n, sizeof *e, cmp_newest_first);
    for (int i = keep - 1; i < n; i++) zo_dir_remove_at(dfd, e[i].name);
    free(e);
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
    return ostate_read(rt->shards, rt->n_shards, rt->off[block], rt->numel[block], dst, NULL, NULL);
}

/* optimizer.safetensors: three tensors a block, chunk by chunk, each chunk
 * read once from the shards (an NVMe sub-group is read once). */
static zo_status write_opt(offload_t *rt, const char *path)
{
    int nb = rt->g.nb;
    size_t C = io_chunk(rt);
    zo_status st;
    float *buf = NULL;
    model_st_writer *w = NULL;
    model_st_entry *e = calloc(3 * (size_t)nb, sizeof *e);
    char(*names)[48] = calloc(3 * (size_t)nb, sizeof *names);
    if (!e || !names) {
        st = zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
        goto out_free;
    }
    for (int b = 0; b < nb; b++)
        for (int a = 0; a < 3; a++) {
            size_t i = 3 * (size_t)b + (size_t)a;
            snprintf(names[i], sizeof names[i], "block.%d.%s", b, opt_names[a]);
            e[i] = (model_st_entry){.name = names[i], .dtype = ZO_DTYPE_F32, .ndim = 1,
                                    .shape = {(int64_t)rt->numel[b]}};
        }
    if ((st = offload_host_alloc(&rt->env, 3 * C * 4, 0, (void **)&buf)) != ZO_OK) goto out_free;
    if ((st = model_st_writer_open(&w, path, e, 3 * nb)) != ZO_OK) goto out_free;
    for (int b = 0; b < nb && st == ZO_OK; b++) {
        if (b == nb / 2) hook(rt, "optimizer-half"); /* half the blocks are written */
        for (size_t rel = 0; rel < rt->numel[b] && st == ZO_OK; rel += C) {
            size_t k = rt->numel[b] - rel < C ? rt->numel[b] - rel : C;
            st = ostate_read(rt->shards, rt->n_shards, rt->off[b] + rel, k, buf, buf + C, buf + 2 * C);
            for (int a = 0; a < 3 && st == ZO_OK; a++)
                st = model_st_writer_put(w, 3 * b + a, rel, k, buf + (size_t)a * C);
        }
    }
    if (st == ZO_OK) st = model_st_writer_commit(w);
    else model_st_writer_abort(w);
out_free:
    offload_host_free(&rt->env, buf, 3 * C * 4, 0);
    free(names);
    free(e);
    return st;
}

/* The name of this save: step-N, or step-N.K with K one past the largest
 * suffix anything named step-N[.k] in the folder (or `latest`) has, so that
 * names grow with every save of one step count (fp16 steps skipped for
 * overflow leave the step count where it was but move the data position and
 * the loss scale; a run resumed from an older checkpoint reaches a step
 * number already taken). Whatever holds such a name is left alone here. */
static zo_status pick_name(const offload_t *rt, int dfd, const char *latest, char *name, size_t len)
{
    int64_t step;
    int k, next = 0;
    if (ckpt_name_parse(latest, &step, &k) && step == rt->step) next = k + 1;
    int fd = dup(dfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return zo_error(ZO_ERR_IO, "offload_save: cannot list the checkpoint folder: %s", strerror(errno));
    }
    rewinddir(d); /* the descriptor is a dup: its position is dfd's */
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = strncmp(de->d_name, ".tmp-", 5) ? de->d_name : de->d_name + 5;
        if (ckpt_name_parse(n, &step, &k) && step == rt->step && k + 1 > next) next = k + 1;
    }
    closedir(d);
    if (next > 1000000)
        return zo_error(ZO_ERR_IO, "offload_save: no free checkpoint name for step %lld",
                        (long long)rt->step);
    if (next) snprintf(name, len, "step-%08lld.%d", (long long)rt->step, next);
    else snprintf(name, len, "step-%08lld", (long long)rt->step);
    return ZO_OK;
}

zo_status offload_save_streamed(offload_t *rt, const char *dir, const offload_ckpt_meta *meta,
                                offload_weights_stream writer, void *writer_user)
{
    zo_status st = offload_optim_settle(rt);
    if (st == ZO_OK) st = offload_grads_drain(rt);
    if (st != ZO_OK) return st;
    if (rt->micro)
        return zo_error(ZO_ERR_INVALID, "offload_save: %d micro-batches are accumulated; save between steps",
                        rt->micro);
    if ((st = offload_ckpt_lock(rt, dir)) != ZO_OK) return st;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return zo_error(ZO_ERR_IO, "%s: open: %s", dir, strerror(errno));
    char name[64], latest[256], tname[80], tmp[4200], path[4400];
    if (read_latest(dir, latest, sizeof latest) != ZO_OK) latest[0] = 0; /* replaced below */
    if ((st = pick_name(rt, dfd, latest, name, sizeof name)) != ZO_OK) goto out_close;
    snprintf(tname, sizeof tname, ".tmp-%s", name);
    snprintf(tmp, sizeof tmp, "%s/%s", dir, tname);
    if ((st = zo_dir_remove_at(dfd, tname)) != ZO_OK) goto out_close; /* leftovers of a crash */
    if (mkdirat(dfd, tname, 0755)) {
        st = zo_error(ZO_ERR_IO, "%s: mkdir: %s", tmp, strerror(errno));
        goto out_close;
    }
    hook(rt, "begin");
    const char *files[3];
    int n_files = 0;
    /* the state as the shards hold it: nothing cached in between */
    if ((st = ostate_sync(rt->shards, rt->n_shards)) != ZO_OK) goto out_remove;
    if (writer) {
        snprintf(path, sizeof path, "%s/" MODEL_FILE, tmp);
        if ((st = writer(writer_user, path, read_master, rt)) != ZO_OK) goto out_remove;
        files[n_files++] = MODEL_FILE;
    }
    snprintf(path, sizeof path, "%s/" OPT_FILE, tmp);
    if ((st = write_opt(rt, path)) != ZO_OK) goto out_remove;
    files[n_files++] = OPT_FILE;
    if ((st = ostate_sync(rt->shards, rt->n_shards)) != ZO_OK) goto out_remove;
    ckpt_state cs = {.step = rt->step, .loss_scale = rt->loss_scale, .good_steps = rt->good_steps,
                     .skipped = rt->skipped, .skipped_in_a_row = rt->skipped_in_a_row,
                     .params = rt->g.n, .blocks = rt->g.nb, .dtype = rt->m.dtype,
                     .data_step = meta ? meta->data_step : 0, .seed = meta ? meta->seed : 0};
    if ((st = ckpt_state_write(tmp, &cs)) != ZO_OK) goto out_remove;
    files[n_files++] = CKPT_STATE_NAME;
    /* last: what every file is, read back from the disk */
    ckpt_layout lay = {.blocks = rt->g.nb, .params = rt->g.n, .dtype = rt->m.dtype,
                       .state_version = CKPT_STATE_VERSION};
    if ((st = ckpt_manifest_write(tmp, &lay, files, n_files)) != ZO_OK) goto out_remove;
    if ((st = fsync_path(tmp)) != ZO_OK) goto out_remove;
    hook(rt, "before-rename");
    if (renameat(dfd, tname, dfd, name)) {
        st = zo_error(ZO_ERR_IO, "rename %s -> %s/%s: %s", tmp, dir, name, strerror(errno));
        goto out_remove;
    }
    if (fsync(dfd)) {
        st = zo_error(ZO_ERR_IO, "%s: fsync: %s", dir, strerror(errno));
        goto out_close;
    }
    hook(rt, "before-latest");
    char line[80];
    snprintf(line, sizeof line, "%s\n", name);
    snprintf(path, sizeof path, "%s/" LATEST_FILE, dir);
    if ((st = zo_file_write_all(path, line, strlen(line))) != ZO_OK) goto out_close;
    /* older checkpoints go once the new one is the latest */
    rotate(rt, dfd, name);
    close(dfd);
    return ZO_OK;

out_remove: {
    char msg[1024]; /* the failure, not the clean-up's */
    snprintf(msg, sizeof msg, "%s", zo_last_error());
    zo_dir_remove_at(dfd, tname);
    zo_error(st, "%s", msg);
}
out_close:
    close(dfd);
    return st;
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

/* Where array a (master, m, v) of block b is in the file. */
static zo_status find_sources(const offload_t *rt, const model_st_file *f, int b,
                              const model_st_tensor *t[3])
{
    char name[48];
    for (int a = 0; a < 3; a++) {
        snprintf(name, sizeof name, "block.%d.%s", b, opt_names[a]);
        t[a] = model_st_find(f, name);
        if (!t[a] || t[a]->dtype != ZO_DTYPE_F32 || t[a]->numel != rt->numel[b])
            return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\" missing or not F32 [%zu]", f->path, name,
                            rt->numel[b]);
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

/* Master and moments are finite and the second moment is not negative
 * (its square root divides the update). */
static zo_status check_values(const model_st_file *f, const model_st_tensor *const t[3], size_t first,
                              size_t n, const float *const v[3])
{
    for (int a = 0; a < 3; a++) {
        size_t i = offload_find_nonfinite(v[a], n);
        if (i == n && a == 2)
            for (i = 0; i < n && !(v[a][i] < 0); i++) {}
        if (i < n)
            return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\" element %zu is %g: %s", f->path, t[a]->name,
                            first + i, (double)v[a][i],
                            a == 2 ? "a second moment must be finite and not negative" : "not finite");
    }
    return ZO_OK;
}

/* The checkpoint `dir` names: itself when it holds a state.json, else the
 * one its `latest` names. */
static zo_status resolve(const char *dir, char *ck, size_t len)
{
    char path[4200], name[256];
    snprintf(path, sizeof path, "%s/" CKPT_STATE_NAME, dir);
    if (access(path, F_OK) == 0) {
        snprintf(ck, len, "%s", dir);
        return ZO_OK;
    }
    zo_status st = read_latest(dir, name, sizeof name);
    if (st != ZO_OK) return st;
    if (!name[0])
        return zo_error(ZO_ERR_NOT_FOUND, "%s: no checkpoint (no state.json and no 'latest')", dir);
    snprintf(ck, len, "%s/%s", dir, name);
    return ZO_OK;
}

/* The state and the manifest against the running model, and every file's
 * checksum, before anything is overwritten. */
static zo_status check_checkpoint(const offload_t *rt, const char *ck, ckpt_state *cs)
{
    char path[4200];
    zo_status st;
    snprintf(path, sizeof path, "%s/" CKPT_STATE_NAME, ck);
    if ((st = ckpt_state_read(path, cs)) != ZO_OK) return st;
    if (cs->params != rt->g.n || cs->blocks != rt->g.nb)
        return zo_error(ZO_ERR_INVALID, "%s: a checkpoint of %" PRIu64 " parameters in %d blocks; the "
                        "model has %zu in %d", path, cs->params, cs->blocks, rt->g.n, rt->g.nb);
    if (cs->dtype != rt->m.dtype)
        return zo_error(ZO_ERR_INVALID, "%s: a checkpoint of a %s run; this run trains in %s (its loss "
                        "scale and weights would not carry over)", path, zo_dtype_name(cs->dtype),
                        zo_dtype_name(rt->m.dtype));
    ckpt_manifest mf;
    if ((st = ckpt_manifest_read(ck, &mf)) != ZO_OK) return st;
    snprintf(path, sizeof path, "%s/" CKPT_MANIFEST_NAME, ck);
    const ckpt_layout *l = &mf.layout;
    if (l->blocks != rt->g.nb || l->params != rt->g.n || l->dtype != rt->m.dtype ||
        l->state_version != CKPT_STATE_VERSION)
        st = zo_error(ZO_ERR_INVALID, "%s: layout %d blocks, %" PRIu64 " parameters, %s, state version "
                      "%d; this run: %d blocks, %zu parameters, %s, version %d", path, l->blocks,
                      l->params, zo_dtype_name(l->dtype), l->state_version, rt->g.nb, rt->g.n,
                      zo_dtype_name(rt->m.dtype), CKPT_STATE_VERSION);
    else if (!ckpt_manifest_find(&mf, CKPT_STATE_NAME) || !ckpt_manifest_find(&mf, OPT_FILE))
        st = zo_error(ZO_ERR_FORMAT, "%s: does not list %s and %s", path, CKPT_STATE_NAME, OPT_FILE);
    else
        st = ckpt_manifest_verify(ck, &mf);
    ckpt_manifest_free(&mf);
    return st;
}

zo_status offload_load(offload_t *rt, const char *dir, offload_ckpt_meta *meta)
{
    char ck[4096], path[4200];
    zo_status st;
    ckpt_state cs;
    if ((st = resolve(dir, ck, sizeof ck)) != ZO_OK) return st;
    if ((st = check_checkpoint(rt, ck, &cs)) != ZO_OK) return st;

    model_st_file f;
    snprintf(path, sizeof path, "%s/" OPT_FILE, ck);
    if ((st = model_st_open(&f, path)) != ZO_OK) return st;
    /* every tensor is there before anything is overwritten */
    const model_st_tensor *src[3];
    for (int b = 0; b < rt->g.nb; b++)
        if ((st = find_sources(rt, &f, b, src)) != ZO_OK) goto out_close;
    if ((st = offload_optim_settle(rt)) != ZO_OK || (st = offload_grads_drain(rt)) != ZO_OK) goto out_close;
    size_t C = io_chunk(rt);
    float *buf;
    if ((st = offload_host_alloc(&rt->env, 3 * C * 4, 0, (void **)&buf)) != ZO_OK) goto out_close;
    const float *const v[3] = {buf, buf + C, buf + 2 * C};
    for (int b = 0; b < rt->g.nb && st == ZO_OK; b++) {
        find_sources(rt, &f, b, src);
        for (size_t rel = 0; rel < rt->numel[b] && st == ZO_OK; rel += C) {
            size_t k = rt->numel[b] - rel < C ? rt->numel[b] - rel : C;
            for (int a = 0; a < 3 && st == ZO_OK; a++) st = read_f32(&f, src[a], rel, k, buf + (size_t)a * C);
            if (st == ZO_OK) st = check_values(&f, src, rel, k, v);
            if (st == ZO_OK)
                st = ostate_write(rt->shards, rt->n_shards, rt->off[b] + rel, k, buf, buf + C, buf + 2 * C);
            /* the 16-bit store from the master */
            if (st == ZO_OK) st = wstore_put_f32(rt->ws, b, rel, k, buf);
        }
    }
    offload_host_free(&rt->env, buf, 3 * C * 4, 0);
    zo_status ss = ostate_sync(rt->shards, rt->n_shards);
    if (st == ZO_OK) st = ss;
    ss = rt->ws->ops->sync(rt->ws);
    if (st == ZO_OK) st = ss;
    offload_slots_invalidate(rt);
    if (st != ZO_OK) goto out_close;
    rt->step = cs.step;
    rt->loss_scale = cs.loss_scale;
    rt->good_steps = cs.good_steps;
    rt->skipped = cs.skipped;
    rt->skipped_in_a_row = cs.skipped_in_a_row;
    rt->micro = 0;
    offload_optim_settle(rt); /* every block's weights are this step's */
    if (meta) {
        meta->data_step = cs.data_step;
        meta->seed = cs.seed;
    }
out_close:
    model_st_close(&f);
    return st;
}
