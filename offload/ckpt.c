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
 * ".exp_avg_sq" for every block b, in block order, in fp32 (a run resumes
 * from them in any encoding and placement). With m and v in 8 bits or
 * bf16, or Kahan's compensation, optimizer.image (issue 30) holds besides
 * each optimizer shard's bytes as it keeps them (ostate_image_key): a run
 * whose shard has the same key takes them back over the fp32 values, so
 * it resumes bit for bit.
 *
 * Several ranks: ZeRO 0 ranks hold the same state, and rank 0 saves it as
 * one rank does. ZeRO 1-3: in the same directory each rank writes its
 * shard, optimizer-<r>-of-<N>.safetensors (three tensors per block of its
 * part, none for a block of which it holds nothing), rank 0 the weights
 * (every rank reading the blocks it is asked for: they are gathered),
 * state.json and, last, the manifest with every file's sum and the
 * partition, from which a run of any rank count re-partitions.
 *
 * Expert parallelism (offload_config.ep_comm): the ranks of one group
 * hold the dense part alike and each its own experts, so the ranks of the
 * first group (world ranks 0 .. N-1) each write their state as
 * optimizer-ep-<q>-of-<N>.safetensors (q: the rank in its group), blocks
 * laid out as the rank holds them, and the manifest's "experts" says which
 * experts each shard holds; state.json's expert_steps are the whole
 * model's (gathered over the group), its params too. At ZeRO 1-3 each
 * block is gathered from every rank's part first (write_opt_gathered), so
 * the files are ZeRO-0's, and the encoded state's image is each rank's of
 * its part (optimizer-ep<N>-<r>-of-<W>.image). A run of any layout and
 * stage reads it element by element through the experts' places
 * (ck_experts): the same --ep, one rank, or another --ep dividing the
 * experts; an --ep run reads a one-rank or ZeRO 1-3 checkpoint the same
 * way. No model.safetensors is written (--save writes the whole model). */
#include "offload/ckpt.h"

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
#include "gpu/comm.h"          /* defines: comm_rank, comm_size */
#include "model/safetensors.h" /* defines: model_st_write, model_st_open */
#include "offload/ckpt_meta.h" /* defines: ckpt_state, ckpt_manifest */

#define OPT_FILE "optimizer.safetensors"
#define IMAGE_FILE "optimizer.image"
#define IMAGE_MAGIC "zoffload optimizer image 1\n"
#define IMAGE_IO ((size_t)1 << 20) /* bytes moved at once */
#define MODEL_FILE "model.safetensors"
#define LATEST_FILE "latest"

static const char *const opt_names[3] = {"master", "exp_avg", "exp_avg_sq"};

static void hook(const offload_ckpt *ck, const char *point)
{
    if (ck->cfg->ckpt_hook) ck->cfg->ckpt_hook(ck->cfg->ckpt_hook_user, point);
}

/* ---- the routed experts' places ------------------------------------------------------- */

/* This run's routed experts as a checkpoint sees them: a MoE block b's
 * experts lie together from lo[b], stride[b] elements each (0: a block
 * without experts); the run holds El of the model's E experts from
 * `first` (expert parallelism: rank ep_rank of a group of ep). E 0: no
 * experts, or none trained. */
typedef struct ck_experts {
    int E, El, first, ep, ep_rank;
    size_t *lo, *stride;
} ck_experts;

static void experts_free(ck_experts *x)
{
    free(x->lo);
    free(x->stride);
    memset(x, 0, sizeof *x);
}

static zo_status experts_init(const offload_ckpt *ck, ck_experts *x)
{
    const offload_model *m = ck->opt->m;
    memset(x, 0, sizeof *x);
    x->ep = ck->cfg->ep_comm ? comm_size(ck->cfg->ep_comm) : 1;
    x->ep_rank = ck->cfg->ep_comm ? comm_rank(ck->cfg->ep_comm) : 0;
    if (!m->n_expert_ranges) return ZO_OK;
    x->lo = calloc((size_t)ck->g->nb, sizeof *x->lo);
    x->stride = calloc((size_t)ck->g->nb, sizeof *x->stride);
    if (!x->lo || !x->stride) {
        experts_free(x);
        return zo_error(ZO_ERR_NOMEM, "offload: out of host memory");
    }
    x->El = m->experts;
    x->E = x->El * x->ep;
    x->first = x->ep_rank * x->El;
    for (int i = 0; i < m->n_expert_ranges; i++) {
        const offload_expert_range *r = &m->expert_ranges[i];
        if (r->expert) continue;
        x->lo[r->block] = r->offset;
        x->stride[r->block] = r->numel;
    }
    return ZO_OK;
}

/* Elements of block b in a layout holding c of the E experts. */
static size_t experts_numel(const offload_ckpt *ck, const ck_experts *x, int b, int c)
{
    return ck->g->numel[b] - (x->E ? (size_t)x->El * x->stride[b] : 0) + (size_t)c * (x->E ? x->stride[b] : 0);
}

/* Elements of the whole model (every expert once). */
static uint64_t experts_params(const offload_ckpt *ck, const ck_experts *x)
{
    uint64_t n = 0;
    for (int b = 0; b < ck->g->nb; b++) n += experts_numel(ck, x, b, x->E);
    return n;
}

/* Element `at` of block b as this run lays it out, in a checkpoint whose
 * shards hold c experts each (c = E: one file holding all): its shard *q
 * and place *y there; returns how many elements from `at` on (at most
 * `left`) lie together there. The dense part is every shard's: shard 0's. */
static size_t experts_map(const ck_experts *x, int b, size_t at, size_t left, int c, int *q, size_t *y)
{
    size_t lo = x->E ? x->lo[b] : 0, w = x->E ? x->stride[b] : 0, end = lo + (size_t)x->El * w;
    *q = 0;
    *y = at;
    if (!w) return left;
    if (at < lo) return lo - at < left ? lo - at : left;
    if (at >= end) {
        *y = at - end + lo + (size_t)c * w;
        return left;
    }
    size_t in = (at - lo) % w;
    int e = x->first + (int)((at - lo) / w);
    *q = e / c;
    *y = lo + (size_t)(e % c) * w + in;
    return w - in < left ? w - in : left;
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

void offload_ckpt_init(offload_ckpt *ck)
{
    memset(ck, 0, sizeof *ck);
    ck->lock.fd = -1;
}

void offload_ckpt_release(offload_ckpt *ck) { zo_dir_lock_release(&ck->lock); }

zo_status offload_ckpt_lock(offload_ckpt *ck, const char *dir)
{
    if (zo_dir_lock_holds(&ck->lock, dir)) return ZO_OK;
    if (mkdir(dir, 0777) && errno != EEXIST) /* less the umask, as any folder a program makes */
        return zo_error(ZO_ERR_IO, "%s: mkdir: %s", dir, strerror(errno));
    zo_dir_lock l;
    zo_status st = zo_dir_lock_take(dir, "the checkpoint folder", &l);
    if (st != ZO_OK) return st;
    zo_dir_lock_release(&ck->lock); /* a save into another folder moves the lock there */
    ck->lock = l;
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
static void rotate(const offload_ckpt *ck, int dfd, const char *latest)
{
    int keep = ck->cfg->keep_checkpoints > 0 ? ck->cfg->keep_checkpoints : 1;
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

/* ---- several ranks: every rank's status --------------------------------------------- */

/* Every rank's status of a stage: the first failure becomes every rank's
 * (no data parallelism: mine), with the failing rank's own message: a
 * save that fails on rank 1 for a full disk says so on rank 0 too, not
 * only "rank 1 of 2 failed" (the failing rank's message may never be
 * printed: the job is aborted by whichever rank gets there first). The
 * messages travel after the statuses, only when one failed, in pieces of
 * OFFLOAD_GATHER_MAX bytes (AGREE_MSG in all, the rest cut). */
#define AGREE_MSG (4 * OFFLOAD_GATHER_MAX)
static zo_status dp_agree(offload_dp *dp, zo_status mine, const char *what)
{
    if (!dp) return mine;
    int32_t *all = calloc((size_t)dp->size, sizeof *all), me = (int32_t)mine;
    char *msg = calloc(AGREE_MSG, 1), *msgs = calloc((size_t)dp->size, AGREE_MSG);
    if (!all || !msg || !msgs) {
        free(all), free(msg), free(msgs);
        return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", what);
    }
    if (mine != ZO_OK) snprintf(msg, AGREE_MSG, "%s", zo_last_error());
    zo_status st = offload_dp_gather(dp, &me, sizeof me, all);
    int failed = -1; /* mine first, else the first rank that failed */
    for (int r = 0; r < dp->size && st == ZO_OK; r++)
        if (all[r] != ZO_OK && (failed < 0 || r == dp->rank)) failed = r;
    if (st == ZO_OK && failed >= 0) {
        /* every rank knows one failed: every rank takes part */
        char piece[OFFLOAD_GATHER_MAX], *got = malloc((size_t)dp->size * OFFLOAD_GATHER_MAX);
        if (!got) st = zo_error(ZO_ERR_NOMEM, "%s: out of host memory", what);
        for (int k = 0; k < AGREE_MSG / OFFLOAD_GATHER_MAX && st == ZO_OK; k++) {
            memcpy(piece, msg + (size_t)k * OFFLOAD_GATHER_MAX, OFFLOAD_GATHER_MAX);
            st = offload_dp_gather(dp, piece, OFFLOAD_GATHER_MAX, got);
            for (int r = 0; r < dp->size && st == ZO_OK; r++)
                memcpy(msgs + (size_t)r * AGREE_MSG + (size_t)k * OFFLOAD_GATHER_MAX,
                       got + (size_t)r * OFFLOAD_GATHER_MAX, OFFLOAD_GATHER_MAX);
        }
        free(got);
        if (st == ZO_OK && failed == dp->rank) {
            st = zo_error(mine, "%s", msg);
        } else if (st == ZO_OK) {
            char *said = msgs + (size_t)failed * AGREE_MSG;
            said[AGREE_MSG - 1] = 0;
            st = zo_error((zo_status)all[failed], "%s: rank %d of %d: %s", what, failed, dp->size,
                          said[0] ? said : "failed");
        }
    }
    free(all);
    free(msg);
    free(msgs);
    return st;
}

/* ---- saving ------------------------------------------------------------------------ */

/* Elements moved at once by a save or a load: one sub-group of master, m
 * and v in host memory (at most a block). */
static size_t io_chunk(const offload_ckpt *ck)
{
    size_t c = ck->cfg->sub_group < ck->g->largest ? ck->cfg->sub_group : ck->g->largest;
    return c ? c : 1;
}

/* Block b's master weights, whole (a collective when they are
 * partitioned): the weights as the optimizer holds them. */
static zo_status read_master(void *ctx, int block, float *dst)
{
    offload_ckpt *ck = ctx;
    zo_status st;
    if (block < 0 || block >= ck->g->nb)
        return zo_error(ZO_ERR_INVALID, "offload: block %d of %d", block, ck->g->nb);
    if ((st = offload_optim_settle(ck->opt)) != ZO_OK) return st;
    return ostate_get_block(ck->os, block, ck->g->numel[block], dst);
}

/* An optimizer file's entries: three a block, "block.<b>.master",
 * ".exp_avg", ".exp_avg_sq", numel[b] fp32 each (none for a block of no
 * elements where `skip_empty`), block b's first at first[b]. */
typedef struct opt_table {
    model_st_entry *e;
    char (*names)[48];
    int *first, n;
} opt_table;

static void opt_table_free(opt_table *t)
{
    free(t->e);
    free(t->names);
    free(t->first);
    memset(t, 0, sizeof *t);
}

static zo_status opt_table_init(opt_table *t, const size_t *numel, int nb, int skip_empty)
{
    memset(t, 0, sizeof *t);
    t->e = calloc(3 * (size_t)nb, sizeof *t->e);
    t->names = calloc(3 * (size_t)nb, sizeof *t->names);
    t->first = calloc((size_t)nb, sizeof *t->first);
    if (!t->e || !t->names || !t->first) {
        opt_table_free(t);
        return zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
    }
    for (int b = 0; b < nb; b++) {
        t->first[b] = t->n;
        if (!numel[b] && skip_empty) continue;
        for (int a = 0; a < 3; a++, t->n++) {
            snprintf(t->names[t->n], sizeof t->names[t->n], "block.%d.%s", b, opt_names[a]);
            t->e[t->n] = (model_st_entry){.name = t->names[t->n], .dtype = ZO_DTYPE_F32, .ndim = 1,
                                          .shape = {(int64_t)numel[b]}};
        }
    }
    return ZO_OK;
}

/* optimizer.safetensors: three tensors a block, chunk by chunk, each chunk
 * read once from the shards (an NVMe sub-group is read once). The blocks as
 * the optimizer holds them (og): whole, or the rank's parts (a rank's shard
 * file; a block of which it holds nothing has no tensors). */
static zo_status write_opt(offload_ckpt *ck, const char *path)
{
    const offload_geom *og = ck->og;
    size_t C = io_chunk(ck);
    zo_status st;
    float *buf = NULL;
    model_st_writer *w = NULL;
    opt_table t;
    if ((st = opt_table_init(&t, og->numel, og->nb, ck->env->dp != NULL)) != ZO_OK) return st;
    if ((st = offload_host_alloc(ck->env, 3 * C * 4, 0, (void **)&buf)) != ZO_OK) goto out_free;
    if ((st = model_st_writer_open(&w, path, t.e, t.n)) != ZO_OK) goto out_free;
    for (int b = 0; b < og->nb && st == ZO_OK; b++) {
        if (b == og->nb / 2) hook(ck, "optimizer-half"); /* half the blocks are written */
        for (size_t rel = 0; rel < og->numel[b] && st == ZO_OK; rel += C) {
            size_t k = og->numel[b] - rel < C ? og->numel[b] - rel : C;
            st = ostate_read(ck->os, og->off[b] + rel, k, buf, buf + C, buf + 2 * C);
            for (int a = 0; a < 3 && st == ZO_OK; a++)
                st = model_st_writer_put(w, t.first[b] + a, rel, k, buf + (size_t)a * C);
        }
    }
    if (st == ZO_OK) st = model_st_writer_commit(w);
    else model_st_writer_abort(w);
out_free:
    offload_host_free(ck->env, buf, 3 * C * 4, 0);
    opt_table_free(&t);
    return st;
}

/* Expert parallelism at ZeRO 1-3: every block's master, m and v as the
 * rank lays it out (what ZeRO-0's expert shard holds), gathered from every
 * rank's part piece by piece (the dense segments over the world, the
 * experts over expert_comm; offload_dp_piece): the rank's share of a piece
 * read from its shards, every rank's gathered, each put at its place.
 * Every rank takes part in every gather, in block order, and calls this
 * whatever its status `st` (the stage before's, agreed on first); the
 * first group's ranks (`writes`) put the blocks in `path`. A rank's own
 * failure (a read, or a write: a full disk) is kept apart (mine) and
 * agreed on at the next block's start (the last block's by save_ckpt's
 * agreement), so that no rank leaves the gathers alone. Host memory: Q
 * elements of the rank's three arrays and a gathered piece (ranks x Q),
 * Q = the io chunk / ranks: about write_opt's 3 chunks or less. */
static zo_status write_opt_gathered(offload_ckpt *ck, const char *path, int writes, zo_status st)
{
    const offload_geom *g = ck->g, *og = ck->og;
    offload_dp *dp = ck->env->dp;
    size_t Q = io_chunk(ck) / (size_t)dp->size, W = (size_t)dp->size; /* the largest piece's ranks */
    Q = Q < 1 ? 1 : Q > dp->bucket_words ? dp->bucket_words : Q;
    float *part = NULL, *all = NULL;
    model_st_writer *w = NULL;
    opt_table t = {0};
    if (st == ZO_OK) st = opt_table_init(&t, g->numel, g->nb, 1);
    if (st == ZO_OK) st = offload_host_alloc(ck->env, 3 * Q * 4, 0, (void **)&part);
    if (st == ZO_OK) st = offload_host_alloc(ck->env, W * Q * 4, 0, (void **)&all);
    if (st == ZO_OK && writes) st = model_st_writer_open(&w, path, t.e, t.n);
    /* every rank goes on to the gathers only when every rank can */
    st = dp_agree(dp, st, "offload_save");
    zo_status mine = ZO_OK;
    int hooked = 0;
    for (int b = 0; b < g->nb && st == ZO_OK; b++) {
        if (b == g->nb / 2) hook(ck, "optimizer-half");
        if (!g->numel[b]) continue;
        if ((st = dp_agree(dp, mine, "offload_save")) != ZO_OK) break;
        size_t pieces = offload_dp_pieces(dp, b, Q);
        for (size_t j = 0; j < pieces && st == ZO_OK; j++) {
            offload_piece p;
            offload_dp_piece(dp, b, g->numel[b], j, Q, &p);
            if (p.mine && mine == ZO_OK)
                mine = ostate_read(ck->os, og->off[b] + p.loc, p.mine, part, part + Q, part + 2 * Q);
            for (int a = 0; a < 3 && st == ZO_OK; a++) {
                if (!hooked && b >= g->nb / 2) { /* the first gather from the middle block on */
                    hook(ck, "optimizer-gather");
                    hooked = 1;
                }
                /* (this rank's device failing: its own, as a read's) */
                st = offload_dp_gather_piece(dp, &p, part + (size_t)a * Q, all, &mine);
                for (int r = 0; r < p.size && st == ZO_OK && w && mine == ZO_OK; r++) {
                    size_t n, at = offload_piece_src(&p, r, &n);
                    if (n) mine = model_st_writer_put(w, t.first[b] + a, at, n, all + (size_t)r * p.q);
                }
            }
        }
    }
    if (st == ZO_OK) st = mine;
    if (w && st == ZO_OK) st = model_st_writer_commit(w);
    else if (w) model_st_writer_abort(w);
    offload_host_free(ck->env, part, 3 * Q * 4, 0);
    offload_host_free(ck->env, all, W * Q * 4, 0);
    opt_table_free(&t);
    return st;
}

/* The image file of a rank's optimizer file: optimizer.image (ranks 0),
 * or optimizer-<r>-of-<N>.image beside a shard, optimizer-ep-<q>-of-<N>.image
 * beside an expert shard (`expert`; at ZeRO 1-3 a rank's part has its own,
 * ckpt_epz_image_name). */
static void image_name(char *buf, size_t len, int rank, int ranks, int expert)
{
    if (!ranks) {
        snprintf(buf, len, IMAGE_FILE);
        return;
    }
    if (expert) ckpt_ep_shard_name(buf, len, rank, ranks);
    else ckpt_shard_name(buf, len, rank, ranks);
    char *dot = strrchr(buf, '.');
    if (dot) snprintf(dot, len - (size_t)(dot - buf), ".image");
}

/* optimizer.image: a line naming the format, then for each shard with an
 * image a line "<bytes> <key>" and its bytes. *written 0 (no file) when no
 * shard has one. */
static zo_status write_image(offload_ckpt *ck, const char *path, int *written)
{
    int n = ostate_images(ck->os), any = 0;
    char key[160], line[200];
    uint64_t bytes;
    zo_status st;
    *written = 0;
    for (int i = 0; i < n; i++) {
        ostate_image_key(ck->os, i, key, sizeof key, &bytes);
        any |= bytes > 0;
    }
    if (!any) return ZO_OK;
    void *buf;
    if ((st = offload_host_alloc(ck->env, IMAGE_IO, 0, &buf)) != ZO_OK) return st;
    zo_file_writer f;
    if ((st = zo_file_create(&f, path)) != ZO_OK) goto out_free;
    st = zo_file_append(&f, IMAGE_MAGIC, strlen(IMAGE_MAGIC));
    for (int i = 0; i < n && st == ZO_OK; i++) {
        ostate_image_key(ck->os, i, key, sizeof key, &bytes);
        if (!bytes) continue;
        int k = snprintf(line, sizeof line, "%llu %s\n", (unsigned long long)bytes, key);
        st = zo_file_append(&f, line, (size_t)k);
        for (uint64_t off = 0; off < bytes && st == ZO_OK; off += IMAGE_IO) {
            size_t len = bytes - off < IMAGE_IO ? (size_t)(bytes - off) : IMAGE_IO;
            if ((st = ostate_image_io(ck->os, i, off, len, buf, 0)) == ZO_OK) st = zo_file_append(&f, buf, len);
        }
    }
    if (st == ZO_OK) st = zo_file_commit(&f);
    else zo_file_abort(&f);
    *written = st == ZO_OK;
out_free:
    offload_host_free(ck->env, buf, IMAGE_IO, 0);
    return st;
}

/* The name of this save: step-N, or step-N.K with K one past the largest
 * suffix anything named step-N[.k] in the folder (or `latest`) has, so that
 * names grow with every save of one step count (fp16 steps skipped for
 * overflow leave the step count where it was but move the data position and
 * the loss scale; a run resumed from an older checkpoint reaches a step
 * number already taken). Whatever holds such a name is left alone here. */
static zo_status pick_name(const offload_ckpt *ck, int dfd, const char *latest, char *name, size_t len)
{
    int64_t step;
    int k, next = 0;
    if (ckpt_name_parse(latest, &step, &k) && step == ck->opt->ctr.step) next = k + 1;
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
        if (ckpt_name_parse(n, &step, &k) && step == ck->opt->ctr.step && k + 1 > next) next = k + 1;
    }
    closedir(d);
    if (next > 1000000)
        return zo_error(ZO_ERR_IO, "offload_save: no free checkpoint name for step %lld",
                        (long long)ck->opt->ctr.step);
    if (next) snprintf(name, len, "step-%08lld.%d", (long long)ck->opt->ctr.step, next);
    else snprintf(name, len, "step-%08lld", (long long)ck->opt->ctr.step);
    return ZO_OK;
}

/* ---- several ranks: the weights ----------------------------------------------------- */

/* Rank 0 reads a block (for its writer) and tells the others, who read it
 * too: reading a partitioned block is a collective. -1 ends. */
static zo_status told_read(offload_ckpt *ck, int32_t block, float *dst, int32_t *told)
{
    int32_t *all = calloc((size_t)ck->env->dp->size, sizeof *all);
    if (!all) return zo_error(ZO_ERR_NOMEM, "offload: out of host memory");
    zo_status st = offload_dp_gather(ck->env->dp, &block, sizeof block, all);
    *told = all[0];
    free(all);
    if (st != ZO_OK) return st;
    return *told >= 0 ? read_master(ck, *told, dst) : ZO_OK;
}

static zo_status read_master_told(void *ctx, int block, float *dst)
{
    int32_t told;
    return told_read(ctx, block, dst, &told);
}

zo_status offload_ckpt_write_weights(offload_ckpt *ck, const char *path, offload_weights_stream writer, void *user)
{
    if (!offload_dp_partitioned(ck->env->dp)) /* every rank has every block: rank 0 writes */
        return ck->env->dp && ck->env->dp->rank ? ZO_OK : writer(user, path, read_master, ck);
    zo_status st;
    int32_t told = 0;
    if (ck->env->dp->rank == 0) {
        st = writer(user, path, read_master_told, ck);
        zo_status se = told_read(ck, -1, NULL, &told);
        return st != ZO_OK ? st : se;
    }
    float *buf;
    if ((st = offload_host_alloc(ck->env, ck->g->largest * sizeof(float) + 4, 0, (void **)&buf)) != ZO_OK)
        return st;
    do st = told_read(ck, 0, buf, &told);
    while (st == ZO_OK && told >= 0);
    offload_host_free(ck->env, buf, ck->g->largest * sizeof(float) + 4, 0);
    return st;
}

/* ---- a save ----------------------------------------------------------------------------- */

/* The checkpoint under construction: DIR/.tmp-<name>, renamed to DIR/<name>
 * once complete. Only the rank that publishes (rank 0, or the only one)
 * holds the folder's lock and descriptors: DIR's, and the one of the
 * temporary folder it made (mkdirat, then opened without following a
 * link), by which it is fsynced and known again before it is renamed and
 * before `latest` names it. */
typedef struct save_dir {
    int dfd, tfd;
    char name[64], tname[80], tmp[4200];
} save_dir;

/* Whether DIR's entry `name` is the folder open as s->tfd (not a link or
 * another folder put in its place while the save wrote into it). */
static zo_status save_same_dir(const save_dir *s, const char *name, const char *path)
{
    struct stat at, mine;
    if (fstat(s->tfd, &mine) != 0) return zo_error(ZO_ERR_IO, "%s: fstat: %s", s->tmp, strerror(errno));
    if (fstatat(s->dfd, name, &at, AT_SYMLINK_NOFOLLOW) != 0)
        return zo_error(ZO_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(at.st_mode) || at.st_dev != mine.st_dev || at.st_ino != mine.st_ino)
        return zo_error(ZO_ERR_IO, "%s: no longer the folder this save made (%s put in its place while it "
                        "was written): the checkpoint is not published", path,
                        S_ISLNK(at.st_mode) ? "a link" : "something else");
    return ZO_OK;
}

/* Lock DIR, pick the name, make DIR/.tmp-<name> (a crash's leftovers of it
 * removed first). */
static zo_status save_begin(offload_ckpt *ck, const char *dir, save_dir *s)
{
    char latest[256];
    zo_status st;
    if ((st = offload_ckpt_lock(ck, dir)) != ZO_OK) return st;
    s->dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->dfd < 0) return zo_error(ZO_ERR_IO, "%s: open: %s", dir, strerror(errno));
    if (read_latest(dir, latest, sizeof latest) != ZO_OK) latest[0] = 0; /* replaced at the end */
    if ((st = pick_name(ck, s->dfd, latest, s->name, sizeof s->name)) == ZO_OK) {
        snprintf(s->tname, sizeof s->tname, ".tmp-%s", s->name);
        snprintf(s->tmp, sizeof s->tmp, "%s/%s", dir, s->tname);
        /* 0777 less the umask: a group's shared folder gets group-writable checkpoints */
        if ((st = zo_dir_remove_at(s->dfd, s->tname)) == ZO_OK && mkdirat(s->dfd, s->tname, 0777))
            st = zo_error(ZO_ERR_IO, "%s: mkdir: %s", s->tmp, strerror(errno));
        if (st == ZO_OK && (s->tfd = openat(s->dfd, s->tname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
            st = zo_error(ZO_ERR_IO, "%s: open: %s", s->tmp, strerror(errno));
    }
    if (st != ZO_OK) {
        if (s->tfd >= 0) close(s->tfd);
        close(s->dfd);
        s->dfd = s->tfd = -1;
    }
    return st;
}

/* A failed save: the temporary directory goes, the failure's message stays. */
static zo_status save_abort(save_dir *s, zo_status st)
{
    if (s->dfd < 0) return st;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zo_last_error());
    zo_dir_remove_at(s->dfd, s->tname); /* a link put in its place is left alone */
    if (s->tfd >= 0) close(s->tfd);
    close(s->dfd);
    s->dfd = s->tfd = -1;
    return zo_error(st, "%s", msg);
}

/* The complete directory renamed into place and made the latest; the
 * checkpoints beyond the ones kept go after. */
static zo_status save_publish(offload_ckpt *ck, const char *dir, save_dir *s)
{
    char path[4400], line[80];
    zo_status st = ZO_OK;
    if (fsync(s->tfd)) return save_abort(s, zo_error(ZO_ERR_IO, "%s: fsync: %s", s->tmp, strerror(errno)));
    hook(ck, "before-rename");
    if ((st = save_same_dir(s, s->tname, s->tmp)) != ZO_OK) return save_abort(s, st);
    if (renameat(s->dfd, s->tname, s->dfd, s->name))
        return save_abort(s, zo_error(ZO_ERR_IO, "rename %s -> %s/%s: %s", s->tmp, dir, s->name, strerror(errno)));
    snprintf(path, sizeof path, "%s/%s", dir, s->name);
    st = save_same_dir(s, s->name, path); /* what was renamed: `latest` names only the folder made */
    if (st == ZO_OK && fsync(s->dfd)) st = zo_error(ZO_ERR_IO, "%s: fsync: %s", dir, strerror(errno));
    if (st == ZO_OK) {
        hook(ck, "before-latest");
        snprintf(line, sizeof line, "%s\n", s->name);
        snprintf(path, sizeof path, "%s/" LATEST_FILE, dir);
        st = zo_file_write_all(path, line, strlen(line));
    }
    /* older checkpoints go once the new one is the latest */
    if (st == ZO_OK) rotate(ck, s->dfd, s->name);
    close(s->tfd);
    close(s->dfd);
    s->dfd = s->tfd = -1;
    return st;
}

/* Expert parallelism's save (`xs`, NULL otherwise): the group's experts
 * and the whole model's expert steps. */
typedef struct ep_save {
    const ck_experts *x;
    const int64_t *steps; /* [nb * E] */
} ep_save;

/* state.json, the manifest's entries for it and for the weights (`model`)
 * and the optimizer files (`opt`, one per rank), then manifest.json: what
 * every file is, read back from the disk, and the partition when the
 * optimizer state is in shards (the expert shards with `xs`). */
static zo_status save_finish(offload_ckpt *ck, const save_dir *s, offload_dp *dp, const ep_save *xs,
                             const offload_ckpt_meta *meta, int model, const ckpt_file_sum *opt, int n_opt)
{
    const optim_counters *c = &ck->opt->ctr;
    uint64_t params = xs ? experts_params(ck, xs->x) : ck->g->n;
    ckpt_state cs = {.step = c->step, .loss_scale = c->loss_scale, .good_steps = c->good_steps,
                     .skipped = c->skipped, .skipped_in_a_row = c->skipped_in_a_row,
                     .params = params, .blocks = ck->g->nb, .dtype = ck->g->dtype,
                     .data_step = meta ? meta->data_step : 0, .seed = meta ? meta->seed : 0};
    if (meta && meta->batch.micro_batch)
        cs.batch = (ckpt_batch){.micro_batch = meta->batch.micro_batch, .grad_accum = meta->batch.grad_accum,
                                .ranks = meta->batch.ranks, .seq = meta->batch.seq};
    if (ck->opt->expert_steps) {
        cs.expert_steps = xs ? (int64_t *)xs->steps : ck->opt->expert_steps;
        cs.n_expert_steps = (size_t)ck->g->nb * (size_t)(xs ? xs->x->E : ck->opt->m->experts);
    }
    zo_status st = ckpt_state_write(s->tmp, &cs);
    if (st != ZO_OK) return st;
    ckpt_manifest mf = {.layout = {.blocks = ck->g->nb, .params = params, .dtype = ck->g->dtype,
                                   .state_version = CKPT_STATE_VERSION}};
    if (xs) {
        mf.experts = (ckpt_experts){.experts = xs->x->E, .shards = xs->x->ep};
        for (int q = 0; q < xs->x->ep; q++) { /* the ranks writing were one group */
            char name[64];
            int found = 0;
            ckpt_ep_shard_name(name, sizeof name, q, xs->x->ep);
            for (int r = 0; r < n_opt && !found; r++) found = !strcmp(opt[r].name, name);
            if (!found)
                return zo_error(ZO_ERR_INVALID, "offload_save: no rank of the first %d wrote %s: they are not one "
                                "expert-parallel group (ranks [g N, (g + 1) N))", xs->x->ep, name);
        }
    }
    mf.files = calloc(2 * (size_t)n_opt + 2, sizeof *mf.files);
    uint64_t *numel = NULL, *part = NULL;
    if (dp && !xs) {
        numel = calloc((size_t)ck->g->nb, sizeof *numel);
        part = calloc((size_t)ck->g->nb, sizeof *part);
    }
    if (!mf.files || (dp && !xs && (!numel || !part))) {
        st = zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
        goto out_free;
    }
    if (model && (st = ckpt_file_hash(s->tmp, MODEL_FILE, &mf.files[mf.n_files++])) != ZO_OK) goto out_free;
    /* each rank's optimizer file and (where it wrote one) its image */
    for (int r = 0; r < 2 * n_opt; r++)
        if (opt[r].name[0]) mf.files[mf.n_files++] = opt[r];
    if ((st = ckpt_file_hash(s->tmp, CKPT_STATE_NAME, &mf.files[mf.n_files++])) != ZO_OK) goto out_free;
    if (dp && !xs) {
        /* rank r holds elements [r part, min(numel, (r + 1) part)) of a block */
        for (int b = 0; b < ck->g->nb; b++) {
            numel[b] = ck->g->numel[b];
            part[b] = dp->pad[b] / (size_t)dp->size;
        }
        mf.partition = (ckpt_partition){.ranks = dp->size, .zero_stage = dp->stage, .numel = numel, .part = part};
    }
    st = ckpt_manifest_write_sums(s->tmp, &mf);
out_free:
    free(mf.files);
    free(numel);
    free(part);
    return st;
}

/* One checkpoint written by the ranks of `dp` (NULL: this rank alone, with
 * every block's state): each writes its optimizer file (the one
 * optimizer.safetensors alone, a shard optimizer-<r>-of-<N>.safetensors
 * each otherwise; with `xs` the first N ranks each their expert shard
 * optimizer-ep-<q>-of-<N>.safetensors, the others nothing), the weights
 * are written by rank 0 (gathered block by block, every rank taking part),
 * and rank 0 completes it. Each stage ends with every rank learning
 * whether every other succeeded. */
static zo_status save_ckpt(offload_ckpt *ck, offload_dp *dp, const ep_save *xs, const char *dir,
                           const offload_ckpt_meta *meta, offload_weights_stream writer, void *writer_user)
{
    int rank = dp ? dp->rank : 0, ranks = dp ? dp->size : 1;
    int writes = !xs || rank < xs->x->ep; /* the first group's ranks, each its experts */
    int gathered = xs && offload_dp_partitioned(dp); /* ZeRO 1-3: every rank's parts gathered */
    save_dir s = {.dfd = -1, .tfd = -1};
    char path[4400], file[64];
    zo_status st = rank == 0 ? save_begin(ck, dir, &s) : ZO_OK;
    if ((st = dp_agree(dp, st, "offload_save")) != ZO_OK) return save_abort(&s, st);
    if (dp) { /* the name rank 0 picked, for everybody */
        char *names = calloc((size_t)ranks, sizeof s.name);
        if (!names) st = zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
        else st = offload_dp_gather(dp, s.name, sizeof s.name, names);
        if (st == ZO_OK) snprintf(s.name, sizeof s.name, "%s", names);
        free(names);
        if ((st = dp_agree(dp, st, "offload_save")) != ZO_OK) return save_abort(&s, st);
        snprintf(s.tname, sizeof s.tname, ".tmp-%s", s.name);
        snprintf(s.tmp, sizeof s.tmp, "%s/%s", dir, s.tname);
    }
    hook(ck, "begin");
    /* this rank's optimizer state, as the shards hold it: nothing cached in between */
    int q = xs ? xs->x->ep_rank : rank, shards = xs ? xs->x->ep : ranks;
    if (xs) ckpt_ep_shard_name(file, sizeof file, q, shards);
    else if (dp) ckpt_shard_name(file, sizeof file, rank, ranks);
    else snprintf(file, sizeof file, OPT_FILE);
    snprintf(path, sizeof path, "%s/%s", s.tmp, file);
    ckpt_file_sum mine[2];
    memset(mine, 0, sizeof mine);
    if (gathered || writes) {
        st = ostate_sync(ck->os);
        if (gathered) st = write_opt_gathered(ck, path, writes, st); /* a collective: every rank, whatever st */
        else if (st == ZO_OK) st = write_opt(ck, path);
        if (st == ZO_OK) st = ostate_sync(ck->os);
        if (st == ZO_OK && writes) st = ckpt_file_hash(s.tmp, file, &mine[0]);
    }
    /* the encoded state as the shards hold it, when the fp32 values do not
     * say it exactly (ZeRO 1-3 with experts: every rank's own part) */
    int imaged = 0;
    if (gathered) ckpt_epz_image_name(file, sizeof file, rank, ranks, shards);
    else image_name(file, sizeof file, q, dp ? shards : 0, xs != NULL);
    snprintf(path, sizeof path, "%s/%s", s.tmp, file);
    if ((writes || gathered) && st == ZO_OK && (st = write_image(ck, path, &imaged)) == ZO_OK && imaged)
        st = ostate_sync(ck->os);
    if (st == ZO_OK && imaged) st = ckpt_file_hash(s.tmp, file, &mine[1]);
    /* the weights (a collective when they are partitioned) */
    if (writer) {
        snprintf(path, sizeof path, "%s/" MODEL_FILE, s.tmp);
        zo_status sw = dp ? offload_ckpt_write_weights(ck, path, writer, writer_user)
                          : writer(writer_user, path, read_master, ck);
        if (st == ZO_OK) st = sw;
    }
    st = dp_agree(dp, st, "offload_save");
    ckpt_file_sum *sums = calloc(2 * (size_t)ranks, sizeof *sums);
    if (st == ZO_OK && !sums) st = zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
    /* sums[r] rank r's optimizer file, sums[ranks + r] its image (one
     * gather each: a gather moves OFFLOAD_GATHER_MAX bytes a rank) */
    if (st == ZO_OK && dp) st = offload_dp_gather(dp, &mine[0], sizeof mine[0], sums);
    if (st == ZO_OK && dp) st = offload_dp_gather(dp, &mine[1], sizeof mine[1], sums + ranks);
    if (st == ZO_OK && !dp) sums[0] = mine[0], sums[1] = mine[1];
    if (rank == 0) {
        if (st == ZO_OK) st = save_finish(ck, &s, dp, xs, meta, writer != NULL, sums, ranks);
        st = st == ZO_OK ? save_publish(ck, dir, &s) : save_abort(&s, st);
    }
    free(sums);
    return dp_agree(dp, st, "offload_save");
}

/* Expert parallelism: the whole model's expert steps gathered over the
 * group (each rank's [nb x El], in pieces a gather moves), then the first
 * group's ranks write their shards (at ZeRO 1-3 gathered from every rank's
 * part first, every rank its image of its part). The weights are not
 * written: no rank holds them whole. */
static zo_status save_experts(offload_ckpt *ck, const ck_experts *x, const char *dir, const offload_ckpt_meta *meta)
{
    offload_dp *dp = ck->env->dp;
    if (!dp) return zo_error(ZO_ERR_INTERNAL, "offload_save: expert parallelism without data parallelism");
    size_t nb = (size_t)ck->g->nb, local = nb * (size_t)x->El, per = OFFLOAD_GATHER_MAX / sizeof(int64_t);
    int64_t *steps = calloc(nb * (size_t)x->E + 1, sizeof *steps), piece[OFFLOAD_GATHER_MAX / sizeof(int64_t)];
    int64_t *got = calloc((size_t)x->ep * per, sizeof *got);
    zo_status st = steps && got ? ZO_OK : zo_error(ZO_ERR_NOMEM, "offload_save: out of host memory");
    /* (every rank agrees first: one that could not allocate would leave its
     * group in the gathers below) */
    st = dp_agree(dp, st, "offload_save");
    for (size_t at = 0; ck->opt->expert_steps && at < local && st == ZO_OK; at += per) {
        size_t n = local - at < per ? local - at : per;
        memset(piece, 0, sizeof piece);
        memcpy(piece, ck->opt->expert_steps + at, n * sizeof *piece);
        st = offload_dp_gather_on(dp, ck->cfg->ep_comm, piece, sizeof piece, got);
        /* local expert i of block b on group rank g is expert g El + i */
        for (int g = 0; g < x->ep && st == ZO_OK; g++)
            for (size_t j = 0; j < n; j++) {
                size_t b = (at + j) / (size_t)x->El, i = (at + j) % (size_t)x->El;
                steps[b * (size_t)x->E + (size_t)g * (size_t)x->El + i] = got[(size_t)g * per + j];
            }
    }
    st = dp_agree(dp, st, "offload_save");
    ep_save xs = {.x = x, .steps = steps};
    if (st == ZO_OK) st = save_ckpt(ck, dp, &xs, dir, meta, NULL, NULL);
    free(steps);
    free(got);
    return st;
}

zo_status offload_ckpt_save(offload_ckpt *ck, const char *dir, const offload_ckpt_meta *meta,
                            offload_weights_stream writer, void *writer_user)
{
    zo_status st = offload_optim_settle(ck->opt);
    if (st == ZO_OK) st = offload_grads_drain(ck->gr);
    if (st == ZO_OK && ck->opt->micro)
        st = zo_error(ZO_ERR_INVALID, "offload_save: %d micro-batches are accumulated; save between steps",
                      ck->opt->micro);
    if ((st = dp_agree(ck->env->dp, st, "offload_save")) != ZO_OK) return st;
    ck_experts x;
    if ((st = experts_init(ck, &x)) != ZO_OK) return st;
    if (x.ep > 1 && x.E) {
        st = save_experts(ck, &x, dir, meta);
        experts_free(&x);
        return st;
    }
    experts_free(&x);
    if (offload_dp_partitioned(ck->env->dp))
        return save_ckpt(ck, ck->env->dp, NULL, dir, meta, writer, writer_user);
    /* ZeRO 0: every rank holds the same state; rank 0 saves it as one rank does */
    if (ck->env->dp)
        return dp_agree(ck->env->dp,
                        ck->env->dp->rank == 0 ? save_ckpt(ck, NULL, NULL, dir, meta, writer, writer_user) : ZO_OK,
                        "offload_save");
    return save_ckpt(ck, NULL, NULL, dir, meta, writer, writer_user);
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

zo_status offload_ckpt_save_whole(offload_ckpt *ck, const char *dir, const offload_ckpt_meta *meta,
                                  offload_weights_writer writer, void *writer_user)
{
    gather_ctx g = {.writer = writer, .user = writer_user, .n = ck->g->n, .nb = ck->g->nb, .off = ck->g->off};
    return offload_ckpt_save(ck, dir, meta, writer ? gather_write : NULL, &g);
}

/* ---- loading ------------------------------------------------------------------------ */

/* n fp32 values of tensor t from element `first`, read (not mapped: host
 * memory holds what is read, no more), then checked: finite, and a second
 * moment (array 2) not negative (its square root divides the update). */
static zo_status read_f32(const model_st_file *f, const model_st_tensor *t, int a, size_t first, size_t n,
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
    size_t i = offload_find_nonfinite(dst, n);
    if (i == n && a == 2)
        for (i = 0; i < n && !(dst[i] < 0); i++) {}
    if (i < n)
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\" element %zu is %g: %s", f->path, t->name, first + i,
                        (double)dst[i], a == 2 ? "a second moment must be finite and not negative" : "not finite");
    return ZO_OK;
}

/* A checkpoint's optimizer state as whole-block ranges, whatever its form:
 * optimizer.safetensors, or the shards of N ranks (the manifest's
 * partition), re-partitioned on the fly for this run's ranks; or, where
 * this run or the checkpoint is expert-parallel (`x`), each element read
 * from where the checkpoint holds it: its expert shards (c experts each),
 * or its one file (c = E). */
typedef struct ck_source {
    model_st_file one;      /* one file */
    int opened;
    int ranks;              /* shards: how many, 0 for one file */
    const uint64_t *part;   /* [nb] shards: elements of a rank's part of block b (the manifest's) */
    const uint64_t *numel;  /* [nb] shards: elements of block b (the manifest's: the whole model's) */
    model_st_file *files;   /* [ranks], or [xshards] */
    int n_files;
    const ck_experts *x;    /* mapped through the experts' places; NULL: as it lies */
    int xshards, xc;        /* expert shards (0: the one file), experts in each */
} ck_source;

static void source_close(ck_source *s)
{
    if (s->opened) model_st_close(&s->one);
    for (int r = 0; r < s->n_files; r++) model_st_close(&s->files[r]);
    free(s->files);
    memset(s, 0, sizeof *s);
}

/* Elements of rank r's part of a block of n split in parts of c. */
static size_t shard_n(size_t n, size_t c, int r)
{
    size_t a = (size_t)r * c;
    return a >= n ? 0 : (n - a < c ? n - a : c);
}

/* Array a of block b in file f: an F32 tensor of `want` elements. */
static zo_status find_tensor(const model_st_file *f, int b, int a, size_t want, const model_st_tensor **out)
{
    char name[48];
    snprintf(name, sizeof name, "block.%d.%s", b, opt_names[a]);
    const model_st_tensor *t = model_st_find(f, name);
    if (!t || t->dtype != ZO_DTYPE_F32 || t->numel != want)
        return zo_error(ZO_ERR_FORMAT, "%s: tensor \"%s\" missing or not F32 [%zu]", f->path, name, want);
    *out = t;
    return ZO_OK;
}

/* Every file of the optimizer state opened and every tensor checked before
 * anything is overwritten. */
static zo_status source_open(const offload_ckpt *ck, const char *cdir, const ckpt_manifest *mf,
                             const ck_experts *x, ck_source *s)
{
    char path[4200], name[64];
    const model_st_tensor *t;
    zo_status st = ZO_OK;
    memset(s, 0, sizeof *s);
    const ckpt_partition *p = &mf->partition;
    s->x = x;
    if (x) s->xc = x->E; /* a partitioned checkpoint of the whole model: read through the experts' places */
    if (x && !p->ranks) { /* every tensor of every file this run may read from */
        s->xshards = mf->experts.shards;
        s->xc = s->xshards ? x->E / s->xshards : x->E;
        int n = s->xshards ? s->xshards : 1;
        if (!(s->files = calloc((size_t)n, sizeof *s->files)))
            return zo_error(ZO_ERR_NOMEM, "offload_load: out of host memory");
        for (int q = 0; q < n && st == ZO_OK; q++) {
            if (s->xshards) ckpt_ep_shard_name(name, sizeof name, q, n);
            snprintf(path, sizeof path, "%s/%s", cdir, s->xshards ? name : OPT_FILE);
            if ((st = model_st_open(&s->files[q], path)) != ZO_OK) break;
            s->n_files++;
            for (int b = 0; b < ck->g->nb && st == ZO_OK; b++) { /* (a shard has no empty block) */
                size_t n = experts_numel(ck, x, b, s->xc);
                for (int a = 0; a < 3 && n && st == ZO_OK; a++) st = find_tensor(&s->files[q], b, a, n, &t);
            }
        }
        if (st != ZO_OK) source_close(s);
        return st;
    }
    if (!p->ranks) {
        snprintf(path, sizeof path, "%s/" OPT_FILE, cdir);
        if ((st = model_st_open(&s->one, path)) != ZO_OK) return st;
        s->opened = 1;
        for (int b = 0; b < ck->g->nb && st == ZO_OK; b++)
            for (int a = 0; a < 3 && st == ZO_OK; a++) st = find_tensor(&s->one, b, a, ck->g->numel[b], &t);
        if (st != ZO_OK) source_close(s);
        return st;
    }
    snprintf(path, sizeof path, "%s/" CKPT_MANIFEST_NAME, cdir);
    for (int b = 0; b < ck->g->nb; b++) {
        size_t n = x ? experts_numel(ck, x, b, x->E) : ck->g->numel[b];
        if (p->numel[b] != n)
            return zo_error(ZO_ERR_INVALID, "%s: \"partition.blocks[%d]\" has %" PRIu64 " elements; this "
                            "model's block %d has %zu", path, b, p->numel[b], b, n);
    }
    s->numel = p->numel;
    s->ranks = p->ranks;
    s->part = p->part;
    if (!(s->files = calloc((size_t)s->ranks, sizeof *s->files)))
        return zo_error(ZO_ERR_NOMEM, "offload_load: out of host memory");
    for (int r = 0; r < s->ranks && st == ZO_OK; r++) {
        ckpt_shard_name(name, sizeof name, r, s->ranks);
        snprintf(path, sizeof path, "%s/%s", cdir, name);
        if ((st = model_st_open(&s->files[r], path)) != ZO_OK) break;
        s->n_files++;
        for (int b = 0; b < ck->g->nb && st == ZO_OK; b++) {
            size_t n = shard_n(s->numel[b], s->part[b], r);
            for (int a = 0; a < 3 && n && st == ZO_OK; a++) st = find_tensor(&s->files[r], b, a, n, &t);
        }
    }
    if (st != ZO_OK) source_close(s);
    return st;
}

/* Elements [rel, rel + k) of block b's array a from the shards of a
 * partitioned checkpoint (its blocks' coordinates: the whole model's) into
 * dst. */
static zo_status source_read_parts(ck_source *s, int b, size_t rel, size_t k, int a, float *dst)
{
    const model_st_tensor *t = NULL;
    zo_status st;
    size_t c = s->part[b];
    for (int r = c ? (int)(rel / c) : 0; r < s->ranks && (size_t)r * c < rel + k; r++) {
        size_t first = (size_t)r * c, n = shard_n(s->numel[b], c, r);
        size_t lo = rel > first ? rel : first, hi = rel + k < first + n ? rel + k : first + n;
        if (lo >= hi) continue;
        if ((st = find_tensor(&s->files[r], b, a, n, &t)) != ZO_OK ||
            (st = read_f32(&s->files[r], t, a, lo - first, hi - lo, dst + (lo - rel))) != ZO_OK)
            return st;
    }
    return ZO_OK;
}

/* Elements [rel, rel + k) of block b's array a (master, m, v) into dst. */
static zo_status source_read(ck_source *s, const offload_ckpt *ck, int b, size_t rel, size_t k, int a, float *dst)
{
    const model_st_tensor *t = NULL;
    zo_status st;
    for (size_t done = 0; s->x && done < k; ) {
        int q;
        size_t y, n = experts_map(s->x, b, rel + done, k - done, s->xc, &q, &y);
        if (s->ranks) st = source_read_parts(s, b, y, n, a, dst + done); /* (q is 0: one layout of every expert) */
        else if ((st = find_tensor(&s->files[q], b, a, experts_numel(ck, s->x, b, s->xc), &t)) == ZO_OK)
            st = read_f32(&s->files[q], t, a, y, n, dst + done);
        if (st != ZO_OK) return st;
        done += n;
    }
    if (s->x) return ZO_OK;
    if (!s->ranks) {
        if ((st = find_tensor(&s->one, b, a, ck->g->numel[b], &t)) != ZO_OK) return st;
        return read_f32(&s->one, t, a, rel, k, dst);
    }
    return source_read_parts(s, b, rel, k, a, dst);
}

zo_status offload_ckpt_resolve(const char *dir, char *cdir, size_t len)
{
    char path[4200], name[256];
    snprintf(path, sizeof path, "%s/" CKPT_STATE_NAME, dir);
    if (access(path, F_OK) == 0) {
        snprintf(cdir, len, "%s", dir);
        return ZO_OK;
    }
    zo_status st = read_latest(dir, name, sizeof name);
    if (st != ZO_OK) return st;
    if (!name[0])
        return zo_error(ZO_ERR_NOT_FOUND, "%s: no checkpoint (no state.json and no 'latest')", dir);
    snprintf(cdir, len, "%s/%s", dir, name);
    return ZO_OK;
}

/* The state and the manifest against the running model, and the files'
 * checksums (this rank's share of them: the ranks loading together hash
 * each file once), before anything is overwritten; the manifest stays with
 * the caller (its partition). */
static zo_status check_checkpoint(const offload_ckpt *ck, const ck_experts *x, const char *cdir, ckpt_state *cs,
                                  ckpt_manifest *mf)
{
    char path[4200];
    zo_status st;
    snprintf(path, sizeof path, "%s/" CKPT_STATE_NAME, cdir);
    if ((st = ckpt_state_read(path, cs)) != ZO_OK) return st;
    size_t ne = ck->opt->expert_steps ? (size_t)ck->g->nb * (size_t)x->E : 0;
    uint64_t params = experts_params(ck, x);
    if (cs->n_expert_steps && cs->n_expert_steps != ne) {
        st = zo_error(ZO_ERR_INVALID, "%s: \"expert_steps\" holds %zu step counts; this model's routed experts "
                      "are %zu (blocks x experts)", path, cs->n_expert_steps, ne);
        ckpt_state_free(cs);
        return st;
    }
    if (cs->params != params || cs->blocks != ck->g->nb)
        return zo_error(ZO_ERR_INVALID, "%s: a checkpoint of %" PRIu64 " parameters in %d blocks; the "
                        "model has %" PRIu64 " in %d", path, cs->params, cs->blocks, params, ck->g->nb);
    if (cs->dtype != ck->g->dtype)
        return zo_error(ZO_ERR_INVALID, "%s: a checkpoint of a %s run; this run trains in %s (its loss "
                        "scale and weights would not carry over)", path, zo_dtype_name(cs->dtype),
                        zo_dtype_name(ck->g->dtype));
    if ((st = ckpt_manifest_read(cdir, mf)) != ZO_OK) return st;
    snprintf(path, sizeof path, "%s/" CKPT_MANIFEST_NAME, cdir);
    const ckpt_layout *l = &mf->layout;
    const ckpt_experts *mx = &mf->experts;
    if (l->blocks != ck->g->nb || l->params != params || l->dtype != ck->g->dtype ||
        l->state_version != cs->version)
        st = zo_error(ZO_ERR_INVALID, "%s: layout %d blocks, %" PRIu64 " parameters, %s, state version "
                      "%d; this run: %d blocks, %" PRIu64 " parameters, %s, %s version %d", path, l->blocks,
                      l->params, zo_dtype_name(l->dtype), l->state_version, ck->g->nb, params,
                      zo_dtype_name(ck->g->dtype), CKPT_STATE_NAME, cs->version);
    else if (mx->experts && mx->experts != x->E)
        st = zo_error(ZO_ERR_INVALID, "%s: \"experts\": shards of %d routed experts; this model's MoE blocks "
                      "have %d%s", path, mx->experts, x->E, x->E ? "" : " (or no expert is trained)");
    else if (!ckpt_manifest_find(mf, CKPT_STATE_NAME) ||
             (!mf->partition.ranks && !mx->experts && !ckpt_manifest_find(mf, OPT_FILE)))
        st = zo_error(ZO_ERR_FORMAT, "%s: does not list %s and %s", path, CKPT_STATE_NAME, OPT_FILE);
    else
        st = ckpt_manifest_verify(cdir, mf, ck->env->dp ? ck->env->dp->rank : 0, ck->env->dp ? ck->env->dp->size : 1);
    if (st != ZO_OK) ckpt_manifest_free(mf);
    return st;
}

/* A line of the image file at *at (at most len - 1 bytes and its '\n'),
 * without the '\n'; *at moves past it. */
static zo_status image_line(int fd, const char *path, uint64_t *at, char *line, size_t len)
{
    ssize_t r = pread(fd, line, len - 1, (off_t)*at);
    if (r < 0) return zo_error(ZO_ERR_IO, "%s: read at byte %llu: %s", path, (unsigned long long)*at, strerror(errno));
    line[r] = 0;
    char *nl = strchr(line, '\n');
    if (!nl) return zo_error(ZO_ERR_FORMAT, "%s: byte %llu: no line of the image's format", path, (unsigned long long)*at);
    *nl = 0;
    *at += (uint64_t)(nl - line) + 1;
    return ZO_OK;
}

/* This rank's optimizer image, where the checkpoint has one: each shard
 * whose key it lists takes its bytes back (over the fp32 values just
 * written); an image of another key (another placement, encoding, chunking
 * or rank count) is passed over: the fp32 values stand. */
static zo_status load_image(offload_ckpt *ck, const ck_experts *x, const char *cdir, const ckpt_manifest *mf)
{
    const offload_dp *dp = ck->env->dp;
    int ranks = mf->partition.ranks, shards = mf->experts.shards;
    char name[64], path[4200], line[256], key[160];
    if (ranks && (!dp || dp->size != ranks)) return ZO_OK;
    /* expert shards: the rank holding the same experts as the shard (at
     * ZeRO 1-3 the rank of the same place among as many ranks: its part);
     * another group size, or a checkpoint without them, lays the state
     * out otherwise */
    if ((shards && x->ep != shards) || (!shards && x->ep > 1)) return ZO_OK;
    if (shards && offload_dp_partitioned(dp))
        ckpt_epz_image_name(name, sizeof name, dp->rank, dp->size, shards);
    else if (shards) image_name(name, sizeof name, x->ep_rank, shards, 1);
    else image_name(name, sizeof name, dp && ranks ? dp->rank : 0, ranks, 0);
    if (!ckpt_manifest_find(mf, name)) return ZO_OK;
    snprintf(path, sizeof path, "%s/%s", cdir, name);
    int fd;
    zo_status st = zo_file_open_regular(path, "a checkpoint's optimizer image", &fd);
    if (st != ZO_OK) return st;
    struct stat sb;
    uint64_t at = 0, size = fstat(fd, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    void *buf = NULL;
    if ((st = image_line(fd, path, &at, line, sizeof line)) == ZO_OK && strcmp(line, "zoffload optimizer image 1"))
        st = zo_error(ZO_ERR_FORMAT, "%s: not an optimizer image (\"%.40s\")", path, line);
    if (st == ZO_OK) st = offload_host_alloc(ck->env, IMAGE_IO, 0, &buf);
    while (st == ZO_OK && at < size) {
        if ((st = image_line(fd, path, &at, line, sizeof line)) != ZO_OK) break;
        char *end;
        unsigned long long bytes = strtoull(line, &end, 10);
        if (end == line || *end != ' ' || bytes > size - at) {
            st = zo_error(ZO_ERR_FORMAT, "%s: \"%.60s\": not \"<bytes> <key>\" of an image within the file", path,
                          line);
            break;
        }
        int shard = -1;
        uint64_t mine;
        for (int i = 0; i < ostate_images(ck->os) && shard < 0; i++) {
            ostate_image_key(ck->os, i, key, sizeof key, &mine);
            if (mine == bytes && !strcmp(key, end + 1)) shard = i;
        }
        for (uint64_t off = 0; shard >= 0 && off < bytes && st == ZO_OK; off += IMAGE_IO) {
            size_t len = bytes - off < IMAGE_IO ? (size_t)(bytes - off) : IMAGE_IO;
            ssize_t r = pread(fd, buf, len, (off_t)(at + off));
            if (r != (ssize_t)len)
                st = zo_error(ZO_ERR_IO, "%s: read at byte %llu: %s", path, (unsigned long long)(at + off),
                              r < 0 ? strerror(errno) : "end of file");
            else
                st = ostate_image_io(ck->os, shard, off, len, buf, 1);
        }
        at += bytes;
    }
    offload_host_free(ck->env, buf, IMAGE_IO, 0);
    close(fd);
    return st;
}

/* Block b of a part in segments (expert parallelism at ZeRO 1-3) from the
 * checkpoint, through buf (3 C fp32 values): the store the whole block's
 * weights (ZeRO 1-2; ZeRO-3's keeps its part), the optimizer its part, run
 * by run (offload_dp_part_at). */
static zo_status load_segmented(offload_ckpt *ck, ck_source *src, int b, float *buf, size_t C)
{
    size_t numel = ck->g->numel[b], pn = ck->og->numel[b];
    zo_status st = ZO_OK;
    for (size_t rel = 0; !ck->ws->part_only && rel < numel && st == ZO_OK; rel += C) {
        size_t k = numel - rel < C ? numel - rel : C;
        if ((st = source_read(src, ck, b, rel, k, 0, buf)) == ZO_OK) st = wstore_load_f32(ck->ws, b, rel, k, buf);
    }
    for (size_t rel = 0, run; rel < pn && st == ZO_OK; rel += run) {
        size_t at = offload_dp_part_at(ck->env->dp, b, rel, &run);
        run = run < pn - rel ? run : pn - rel;
        for (size_t o = 0; o < run && st == ZO_OK; o += C) {
            size_t k = run - o < C ? run - o : C;
            for (int a = 0; a < 3 && st == ZO_OK; a++) st = source_read(src, ck, b, at + o, k, a, buf + a * C);
            if (st == ZO_OK) st = ostate_write(ck->os, ck->og->off[b] + rel + o, k, buf, buf + C, buf + 2 * C);
            if (st == ZO_OK && ck->ws->part_only) st = wstore_load_f32(ck->ws, b, at + o, k, buf);
        }
    }
    return st;
}

zo_status offload_ckpt_load(offload_ckpt *ck, const char *dir, offload_ckpt_meta *meta)
{
    char cdir[4096];
    zo_status st;
    ckpt_state cs;
    ckpt_manifest mf;
    ck_experts x;
    if ((st = offload_ckpt_resolve(dir, cdir, sizeof cdir)) != ZO_OK || (st = experts_init(ck, &x)) != ZO_OK) return st;
    /* every rank's checks passed (a damaged file is named by the rank
     * that hashed it, and ends every rank) */
    zo_status mine = check_checkpoint(ck, &x, cdir, &cs, &mf);
    if ((st = dp_agree(ck->env->dp, mine, "offload_load")) != ZO_OK) {
        if (mine == ZO_OK) ckpt_manifest_free(&mf);
        ckpt_state_free(&cs);
        experts_free(&x);
        return st;
    }
    /* every tensor is there before anything is overwritten */
    ck_source src;
    int mapped = x.E && (x.ep > 1 || mf.experts.experts);
    if ((st = source_open(ck, cdir, &mf, mapped ? &x : NULL, &src)) != ZO_OK) goto out_manifest;
    if ((st = offload_optim_settle(ck->opt)) != ZO_OK || (st = offload_grads_drain(ck->gr)) != ZO_OK) goto out_close;
    size_t C = io_chunk(ck);
    float *buf;
    if ((st = offload_host_alloc(ck->env, 3 * C * 4, 0, (void **)&buf)) != ZO_OK) goto out_close;
    for (int b = 0; b < ck->g->nb && st == ZO_OK; b++) {
        if (offload_dp_segmented(ck->env->dp, b)) {
            st = load_segmented(ck, &src, b, buf, C);
            continue;
        }
        /* the optimizer's part of the block [po, pe) (all of it with one
         * rank); the store needs the whole block's weights, or that part */
        size_t po = offload_dp_part_first(ck->env->dp, b), pe = po + ck->og->numel[b];
        size_t r0 = ck->ws->part_only ? po : 0, r1 = ck->ws->part_only ? pe : ck->g->numel[b];
        for (size_t rel = r0; rel < r1 && st == ZO_OK; rel += C) {
            size_t k = r1 - rel < C ? r1 - rel : C;
            size_t lo = rel > po ? rel : po, hi = rel + k < pe ? rel + k : pe;
            st = source_read(&src, ck, b, rel, k, 0, buf);
            if (lo < hi) {
                for (int a = 1; a < 3 && st == ZO_OK; a++) st = source_read(&src, ck, b, lo, hi - lo, a, buf + a * C);
                if (st == ZO_OK)
                    st = ostate_write(ck->os, ck->og->off[b] + (lo - po), hi - lo, buf + (lo - rel),
                                      buf + C, buf + 2 * C);
            }
            /* the 16-bit store from the master */
            if (st == ZO_OK) st = wstore_load_f32(ck->ws, b, rel, k, buf);
        }
    }
    offload_host_free(ck->env, buf, 3 * C * 4, 0);
    if (st == ZO_OK) st = load_image(ck, &x, cdir, &mf);
    zo_status ss = ostate_sync(ck->os);
    if (st == ZO_OK) st = ss;
    ss = wstore_settle(ck->ws);
    if (st == ZO_OK) st = ss;
    if (st != ZO_OK) goto out_close;
    ck->opt->ctr.step = cs.step;
    ck->opt->ctr.loss_scale = cs.loss_scale;
    ck->opt->ctr.good_steps = cs.good_steps;
    ck->opt->ctr.skipped = cs.skipped;
    ck->opt->ctr.skipped_in_a_row = cs.skipped_in_a_row;
    ck->opt->micro = 0;
    /* each expert's steps (a checkpoint without them: every expert took
     * every step): the run's experts of the whole model's */
    for (size_t i = 0; ck->opt->expert_steps && i < (size_t)ck->g->nb * (size_t)x.El; i++)
        ck->opt->expert_steps[i] = cs.n_expert_steps ? cs.expert_steps[i / (size_t)x.El * (size_t)x.E +
                                                                        (size_t)x.first + i % (size_t)x.El]
                                                     : cs.step;
    offload_optim_settle(ck->opt); /* every block's weights are this step's */
    if (meta) {
        meta->data_step = cs.data_step;
        meta->seed = cs.seed;
        meta->batch = (offload_ckpt_batch){.micro_batch = cs.batch.micro_batch, .grad_accum = cs.batch.grad_accum,
                                           .ranks = cs.batch.ranks, .seq = cs.batch.seq};
        meta->state_version = cs.version;
    }
out_close:
    source_close(&src);
out_manifest:
    ckpt_manifest_free(&mf);
    ckpt_state_free(&cs);
    experts_free(&x);
    return st;
}
