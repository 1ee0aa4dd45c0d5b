/* state.json and manifest.json of a training checkpoint: writers, strict
 * readers, the files' checksums. See ckpt_meta.h. */
#include "offload/ckpt_meta.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "common/fileio.h" /* defines: zo_file_write_all, zo_file_read_all */
#include "common/json.h"   /* defines: zo_json_parse */

#define EXACT_MAX 9007199254740992.0 /* 2^53: integers a JSON number holds exactly */

/* ---- reading fields ------------------------------------------------------------------ */

/* Members of `o` not in `known` (NULL-terminated) are refused. */
static zo_status check_known(const cJSON *o, const char *const *known, const char *path,
                             const char *prefix)
{
    for (const cJSON *c = o->child; c; c = c->next) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(c->string, known[i]);
        if (!ok) return zo_error(ZO_ERR_FORMAT, "%s: unknown field \"%s%s\"", path, prefix, c->string);
    }
    return ZO_OK;
}

static zo_status get_item(const cJSON *o, const char *key, const char *path, const char *prefix,
                          const cJSON **out)
{
    *out = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!*out) return zo_error(ZO_ERR_FORMAT, "%s: field \"%s%s\" is missing", path, prefix, key);
    return ZO_OK;
}

/* A whole number in [lo, hi]. */
static zo_status get_int(const cJSON *o, const char *key, const char *path, const char *prefix,
                         double lo, double hi, double *out)
{
    const cJSON *v;
    zo_status st = get_item(o, key, path, prefix, &v);
    if (st != ZO_OK) return st;
    if (!cJSON_IsNumber(v))
        return zo_error(ZO_ERR_FORMAT, "%s: field \"%s%s\" is not a number", path, prefix, key);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi) || v->valuedouble != floor(v->valuedouble))
        return zo_error(ZO_ERR_FORMAT, "%s: field \"%s%s\" = %g is not a whole number in [%.0f, %.0f]",
                        path, prefix, key, v->valuedouble, lo, hi);
    *out = v->valuedouble;
    return ZO_OK;
}

static zo_status get_string(const cJSON *o, const char *key, const char *path, const char *prefix,
                            const char **out)
{
    const cJSON *v;
    zo_status st = get_item(o, key, path, prefix, &v);
    if (st != ZO_OK) return st;
    if (!cJSON_IsString(v))
        return zo_error(ZO_ERR_FORMAT, "%s: field \"%s%s\" is not a string", path, prefix, key);
    *out = v->valuestring;
    return ZO_OK;
}

static zo_status get_dtype(const cJSON *o, const char *path, const char *prefix, zo_dtype *out)
{
    const char *s = NULL;
    zo_status st = get_string(o, "dtype", path, prefix, &s);
    if (st != ZO_OK) return st;
    for (int t = 0; t < ZO_DTYPE_COUNT; t++)
        if (!strcmp(s, zo_dtype_name((zo_dtype)t))) {
            *out = (zo_dtype)t;
            return ZO_OK;
        }
    return zo_error(ZO_ERR_FORMAT, "%s: field \"%sdtype\" = \"%s\" is not fp32, fp16 or bf16", path,
                    prefix, s);
}

/* "format" and "version" as expected. */
static zo_status check_format(const cJSON *o, const char *path, const char *format, int version)
{
    const char *f = NULL;
    double v;
    zo_status st = get_string(o, "format", path, "", &f);
    if (st == ZO_OK && strcmp(f, format))
        st = zo_error(ZO_ERR_FORMAT, "%s: \"format\" is \"%s\", not \"%s\"", path, f, format);
    if (st == ZO_OK && (st = get_int(o, "version", path, "", 0, INT_MAX, &v)) == ZO_OK && v != version)
        st = zo_error(ZO_ERR_FORMAT, "%s: \"version\" = %.0f: this runtime reads version %d (a "
                      "checkpoint of another version of zoffload)", path, v, version);
    return st;
}

/* ---- state.json ---------------------------------------------------------------------- */

zo_status ckpt_state_write(const char *dir, const ckpt_state *s)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return zo_error(ZO_ERR_NOMEM, "%s/%s: out of host memory", dir, CKPT_STATE_NAME);
    char seed[32], path[4200];
    snprintf(seed, sizeof seed, "%" PRIu64, s->seed);
    cJSON_AddStringToObject(o, "format", CKPT_STATE_FORMAT);
    cJSON_AddNumberToObject(o, "version", CKPT_STATE_VERSION);
    cJSON_AddNumberToObject(o, "step", (double)s->step);
    cJSON_AddNumberToObject(o, "loss_scale", (double)s->loss_scale);
    cJSON_AddNumberToObject(o, "good_steps", s->good_steps);
    cJSON_AddNumberToObject(o, "skipped", (double)s->skipped);
    cJSON_AddNumberToObject(o, "skipped_in_a_row", s->skipped_in_a_row);
    cJSON_AddNumberToObject(o, "params", (double)s->params);
    cJSON_AddNumberToObject(o, "blocks", s->blocks);
    cJSON_AddStringToObject(o, "dtype", zo_dtype_name(s->dtype));
    cJSON_AddNumberToObject(o, "data_rows", (double)s->data_step);
    const ckpt_batch *b = &s->batch;
    if (b->micro_batch) {
        cJSON *bo = cJSON_AddObjectToObject(o, "batch");
        if (bo) {
            cJSON_AddNumberToObject(bo, "micro_batch", (double)b->micro_batch);
            cJSON_AddNumberToObject(bo, "grad_accum", (double)b->grad_accum);
            cJSON_AddNumberToObject(bo, "ranks", (double)b->ranks);
            cJSON_AddNumberToObject(bo, "seq", (double)b->seq);
            cJSON_AddNumberToObject(bo, "global_batch", (double)(b->micro_batch * b->grad_accum * b->ranks));
        }
    } else {
        cJSON_AddNullToObject(o, "batch");
    }
    cJSON_AddStringToObject(o, "seed", seed);
    if (s->n_expert_steps) {
        cJSON *ex = cJSON_AddArrayToObject(o, "expert_steps");
        for (size_t i = 0; ex && i < s->n_expert_steps; i++)
            cJSON_AddItemToArray(ex, cJSON_CreateNumber((double)s->expert_steps[i]));
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_STATE_NAME);
    if (!text) return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
    zo_status st = zo_file_write_all(path, text, strlen(text));
    free(text);
    return st;
}

/* "batch": null (no shape recorded), or every member a whole number >= 1
 * and "global_batch" their product. */
static zo_status get_batch(const cJSON *o, const char *path, ckpt_batch *b)
{
    static const char *const known[] = {"micro_batch", "grad_accum", "ranks", "seq", "global_batch", NULL};
    const cJSON *bo;
    zo_status st = get_item(o, "batch", path, "", &bo);
    memset(b, 0, sizeof *b);
    if (st != ZO_OK || cJSON_IsNull(bo)) return st;
    if (!cJSON_IsObject(bo)) return zo_error(ZO_ERR_FORMAT, "%s: field \"batch\" is not an object or null", path);
    double mb, ga, ranks, seq, global;
    if ((st = check_known(bo, known, path, "batch.")) != ZO_OK ||
        (st = get_int(bo, "micro_batch", path, "batch.", 1, INT_MAX, &mb)) != ZO_OK ||
        (st = get_int(bo, "grad_accum", path, "batch.", 1, INT_MAX, &ga)) != ZO_OK ||
        (st = get_int(bo, "ranks", path, "batch.", 1, CKPT_MAX_RANKS, &ranks)) != ZO_OK ||
        (st = get_int(bo, "seq", path, "batch.", 1, INT_MAX, &seq)) != ZO_OK ||
        (st = get_int(bo, "global_batch", path, "batch.", 1, EXACT_MAX, &global)) != ZO_OK)
        return st;
    if (global != mb * ga * ranks)
        return zo_error(ZO_ERR_FORMAT, "%s: \"batch.global_batch\" = %.0f is not micro_batch %.0f x grad_accum "
                        "%.0f x ranks %.0f", path, global, mb, ga, ranks);
    *b = (ckpt_batch){.micro_batch = (int64_t)mb, .grad_accum = (int64_t)ga, .ranks = (int64_t)ranks,
                      .seq = (int64_t)seq};
    return ZO_OK;
}

/* "expert_steps": absent, or a list of whole numbers in [0, step]. */
static zo_status get_expert_steps(const cJSON *o, const char *path, ckpt_state *s)
{
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(o, "expert_steps"), *e;
    if (!ex) return ZO_OK;
    int n = cJSON_GetArraySize(ex);
    if (!cJSON_IsArray(ex) || !n)
        return zo_error(ZO_ERR_FORMAT, "%s: \"expert_steps\" is not a non-empty list", path);
    if (!(s->expert_steps = calloc((size_t)n, sizeof *s->expert_steps)))
        return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
    cJSON_ArrayForEach(e, ex)
    {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!(v >= 0 && v <= (double)s->step && v == (double)(int64_t)v)) {
            size_t i = s->n_expert_steps;
            ckpt_state_free(s);
            return zo_error(ZO_ERR_FORMAT, "%s: \"expert_steps\"[%zu] is not a whole number in [0, step %" PRId64
                            "]", path, i, s->step);
        }
        s->expert_steps[s->n_expert_steps++] = (int64_t)v;
    }
    return ZO_OK;
}

zo_status ckpt_state_parse(const char *text, size_t len, const char *path, ckpt_state *s)
{
    static const char *const known[] = {"format", "version", "step", "loss_scale", "good_steps",
                                        "skipped", "skipped_in_a_row", "params", "blocks", "dtype",
                                        "data_rows", "batch", "seed", "expert_steps", NULL};
    /* version 3: the data position in micro-batches, no batch shape */
    static const char *const known_v3[] = {"format", "version", "step", "loss_scale", "good_steps",
                                           "skipped", "skipped_in_a_row", "params", "blocks", "dtype",
                                           "data_step", "seed", NULL};
    cJSON *o;
    zo_status st = zo_json_parse(text, len, path, &o);
    if (st != ZO_OK) return st;
    memset(s, 0, sizeof *s);
    double step, good, skipped, row, params, blocks, data_step;
    const char *seed;
    const cJSON *scale;
    if (!cJSON_IsObject(o)) {
        st = zo_error(ZO_ERR_FORMAT, "%s: not a JSON object", path);
        goto out_free;
    }
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "version");
    int v3 = cJSON_IsNumber(ver) && ver->valuedouble == CKPT_STATE_VERSION_OLD;
    if ((st = check_format(o, path, CKPT_STATE_FORMAT, v3 ? CKPT_STATE_VERSION_OLD : CKPT_STATE_VERSION)) != ZO_OK ||
        (st = check_known(o, v3 ? known_v3 : known, path, "")) != ZO_OK ||
        (st = get_int(o, "step", path, "", 0, EXACT_MAX, &step)) != ZO_OK ||
        (st = get_int(o, "good_steps", path, "", 0, INT_MAX, &good)) != ZO_OK ||
        (st = get_int(o, "skipped", path, "", 0, EXACT_MAX, &skipped)) != ZO_OK ||
        (st = get_int(o, "skipped_in_a_row", path, "", 0, INT_MAX, &row)) != ZO_OK ||
        (st = get_int(o, "params", path, "", 1, EXACT_MAX, &params)) != ZO_OK ||
        (st = get_int(o, "blocks", path, "", 1, INT_MAX, &blocks)) != ZO_OK ||
        (st = get_int(o, v3 ? "data_step" : "data_rows", path, "", 0, EXACT_MAX, &data_step)) != ZO_OK ||
        (!v3 && (st = get_batch(o, path, &s->batch)) != ZO_OK) ||
        (st = get_dtype(o, path, "", &s->dtype)) != ZO_OK ||
        (st = get_string(o, "seed", path, "", &seed)) != ZO_OK ||
        (st = get_item(o, "loss_scale", path, "", &scale)) != ZO_OK)
        goto out_free;
    /* a loss scale of 0 would turn the next step's weights into NaN */
    if (!cJSON_IsNumber(scale) || !(scale->valuedouble > 0 && scale->valuedouble <= FLT_MAX)) {
        st = zo_error(ZO_ERR_FORMAT, "%s: \"loss_scale\" is not a positive finite float", path);
        goto out_free;
    }
    char *end;
    errno = 0;
    unsigned long long sv = strtoull(seed, &end, 10);
    if (!seed[0] || *end || errno || seed[0] == '-' || seed[0] == '+' || seed[0] == ' ') {
        st = zo_error(ZO_ERR_FORMAT, "%s: \"seed\" = \"%s\" is not a 64-bit unsigned integer", path, seed);
        goto out_free;
    }
    s->version = v3 ? CKPT_STATE_VERSION_OLD : CKPT_STATE_VERSION;
    s->step = (int64_t)step;
    s->loss_scale = (float)scale->valuedouble;
    s->good_steps = (int)good;
    s->skipped = (int64_t)skipped;
    s->skipped_in_a_row = (int)row;
    s->params = (uint64_t)params;
    s->blocks = (int)blocks;
    s->data_step = (int64_t)data_step;
    s->seed = (uint64_t)sv;
    st = get_expert_steps(o, path, s);
out_free:
    cJSON_Delete(o);
    return st;
}

void ckpt_state_free(ckpt_state *s)
{
    free(s->expert_steps);
    s->expert_steps = NULL;
    s->n_expert_steps = 0;
}

zo_status ckpt_state_read(const char *path, ckpt_state *s)
{
    char *text;
    size_t len;
    zo_status st = zo_file_read_all(path, CKPT_META_MAX_BYTES, "a checkpoint's state.json", &text, &len);
    if (st != ZO_OK) return st;
    st = ckpt_state_parse(text, len, path, s);
    free(text);
    return st;
}

/* ---- checksums ------------------------------------------------------------------------ */

zo_status ckpt_file_hash(const char *dir, const char *name, ckpt_file_sum *out)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    memset(out, 0, sizeof *out);
    if (strlen(name) >= sizeof out->name)
        return zo_error(ZO_ERR_INVALID, "%s: a name longer than %zu bytes", path, sizeof out->name - 1);
    snprintf(out->name, sizeof out->name, "%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return zo_error(e == ENOENT ? ZO_ERR_NOT_FOUND : ZO_ERR_IO, "%s: cannot open: %s", path,
                        e == ELOOP ? "a symbolic link (a checkpoint holds none)" : strerror(e));
    }
    zo_status st = ZO_OK;
    struct stat sb;
    size_t cap = 4u << 20;
    char *buf = NULL;
    XXH3_state_t *h = XXH3_createState();
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = zo_error(ZO_ERR_IO, "%s: not a regular file", path);
        goto out_close;
    }
    if (!h || !(buf = malloc(cap))) {
        st = zo_error(ZO_ERR_NOMEM, "%s: out of host memory to hash it", path);
        goto out_close;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    XXH3_64bits_reset(h);
    uint64_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = zo_error(ZO_ERR_IO, "%s: read at byte %" PRIu64 ": %s", path, n, strerror(errno));
            goto out_close;
        }
        if (r == 0) break;
        XXH3_64bits_update(h, buf, (size_t)r);
        n += (uint64_t)r;
    }
    out->bytes = n;
    out->xxh3 = XXH3_64bits_digest(h);
out_close:
    XXH3_freeState(h);
    free(buf);
    close(fd);
    return st;
}

/* ---- manifest.json ------------------------------------------------------------------- */

static int name_ok(const char *s)
{
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..") &&
           strcmp(s, CKPT_MANIFEST_NAME) && strlen(s) < sizeof(((ckpt_file_sum *)0)->name);
}

void ckpt_shard_name(char *buf, size_t len, int rank, int ranks)
{
    snprintf(buf, len, "optimizer-%05d-of-%05d.safetensors", rank, ranks);
}

void ckpt_ep_shard_name(char *buf, size_t len, int shard, int shards)
{
    snprintf(buf, len, "optimizer-ep-%05d-of-%05d.safetensors", shard, shards);
}

void ckpt_epz_image_name(char *buf, size_t len, int rank, int ranks, int ep)
{
    snprintf(buf, len, "optimizer-ep%d-%05d-of-%05d.image", ep, rank, ranks);
}

zo_status ckpt_manifest_write(const char *dir, const ckpt_layout *layout, const char *const *names,
                              int n)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_MANIFEST_NAME);
    ckpt_manifest m = {.layout = *layout, .n_files = n, .files = calloc(n ? (size_t)n : 1, sizeof *m.files)};
    if (!m.files) return zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
    zo_status st = ZO_OK;
    for (int i = 0; i < n && st == ZO_OK; i++) {
        if (!name_ok(names[i])) st = zo_error(ZO_ERR_INVALID, "%s: \"%s\" cannot be listed", path, names[i]);
        else st = ckpt_file_hash(dir, names[i], &m.files[i]);
    }
    if (st == ZO_OK) st = ckpt_manifest_write_sums(dir, &m);
    free(m.files);
    return st;
}

/* "partition": {"ranks", "zero_stage", "blocks": [[elements, part], ...]} */
static cJSON *partition_json(const ckpt_manifest *m)
{
    const ckpt_partition *p = &m->partition;
    cJSON *o = cJSON_CreateObject(), *blocks = cJSON_CreateArray();
    if (!o || !blocks) {
        cJSON_Delete(o);
        cJSON_Delete(blocks);
        return NULL;
    }
    cJSON_AddNumberToObject(o, "ranks", p->ranks);
    cJSON_AddNumberToObject(o, "zero_stage", p->zero_stage);
    cJSON_AddItemToObject(o, "blocks", blocks);
    for (int b = 0; b < m->layout.blocks; b++) {
        cJSON *e = cJSON_CreateArray();
        if (!e) {
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)p->numel[b]));
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)p->part[b]));
        cJSON_AddItemToArray(blocks, e);
    }
    return o;
}

/* "experts": {"experts": E, "shards": [{"file", "first", "count"}, ...]}:
 * which experts each shard holds. */
static cJSON *experts_json(const ckpt_experts *x)
{
    cJSON *o = cJSON_CreateObject(), *shards = cJSON_CreateArray();
    if (!o || !shards) {
        cJSON_Delete(o);
        cJSON_Delete(shards);
        return NULL;
    }
    cJSON_AddNumberToObject(o, "experts", x->experts);
    cJSON_AddItemToObject(o, "shards", shards);
    int c = x->experts / x->shards;
    for (int q = 0; q < x->shards; q++) {
        char name[64];
        cJSON *e = cJSON_CreateObject();
        if (!e) {
            cJSON_Delete(o);
            return NULL;
        }
        ckpt_ep_shard_name(name, sizeof name, q, x->shards);
        cJSON_AddStringToObject(e, "file", name);
        cJSON_AddNumberToObject(e, "first", q * c);
        cJSON_AddNumberToObject(e, "count", c);
        cJSON_AddItemToArray(shards, e);
    }
    return o;
}

zo_status ckpt_manifest_write_sums(const char *dir, const ckpt_manifest *m)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_MANIFEST_NAME);
    zo_status st = ZO_OK;
    const ckpt_layout *layout = &m->layout;
    cJSON *o = cJSON_CreateObject(), *lay = cJSON_CreateObject(), *files = cJSON_CreateArray();
    if (!o || !lay || !files) {
        cJSON_Delete(lay);
        cJSON_Delete(files);
        st = zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
        goto out_free;
    }
    cJSON_AddStringToObject(o, "format", CKPT_MANIFEST_FORMAT);
    cJSON_AddNumberToObject(o, "version", CKPT_MANIFEST_VERSION);
    cJSON_AddNumberToObject(lay, "blocks", layout->blocks);
    cJSON_AddNumberToObject(lay, "params", (double)layout->params);
    cJSON_AddStringToObject(lay, "dtype", zo_dtype_name(layout->dtype));
    cJSON_AddNumberToObject(lay, "state_version", layout->state_version);
    cJSON_AddItemToObject(o, "layout", lay);
    cJSON_AddItemToObject(o, "files", files);
    if (m->partition.ranks > 0) {
        cJSON *p = partition_json(m);
        if (!p) {
            st = zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
            goto out_free;
        }
        cJSON_AddItemToObject(o, "partition", p);
    }
    if (m->experts.experts > 0) {
        cJSON *x = experts_json(&m->experts);
        if (!x) {
            st = zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
            goto out_free;
        }
        cJSON_AddItemToObject(o, "experts", x);
    }
    for (int i = 0; i < m->n_files; i++) {
        const ckpt_file_sum *f = &m->files[i];
        if (!name_ok(f->name)) {
            st = zo_error(ZO_ERR_INVALID, "%s: \"%s\" cannot be listed", path, f->name);
            goto out_free;
        }
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, f->xxh3);
        cJSON *e = cJSON_CreateObject();
        if (!e) {
            st = zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
            goto out_free;
        }
        cJSON_AddStringToObject(e, "name", f->name);
        cJSON_AddNumberToObject(e, "bytes", (double)f->bytes);
        cJSON_AddStringToObject(e, "xxh3", hex);
        cJSON_AddItemToArray(files, e);
    }
    char *text = cJSON_Print(o);
    if (!text) {
        st = zo_error(ZO_ERR_NOMEM, "%s: out of host memory", path);
        goto out_free;
    }
    st = zo_file_write_all(path, text, strlen(text));
    free(text);
out_free:
    cJSON_Delete(o);
    return st;
}

/* The partition of a manifest whose layout and files are read: every rank's
 * shard listed (first: a rank count tampered with is named as such), then
 * the blocks. */
static zo_status parse_partition(const cJSON *p, const char *path, ckpt_manifest *m)
{
    static const char *const known[] = {"ranks", "zero_stage", "blocks", NULL};
    ckpt_partition *q = &m->partition;
    const cJSON *blocks;
    double ranks, stage;
    zo_status st;
    if (!cJSON_IsObject(p)) return zo_error(ZO_ERR_FORMAT, "%s: \"partition\" must be an object", path);
    if ((st = check_known(p, known, path, "partition.")) != ZO_OK ||
        (st = get_int(p, "ranks", path, "partition.", 1, CKPT_MAX_RANKS, &ranks)) != ZO_OK ||
        (st = get_int(p, "zero_stage", path, "partition.", 1, 3, &stage)) != ZO_OK ||
        (st = get_item(p, "blocks", path, "partition.", &blocks)) != ZO_OK)
        return st;
    for (int r = 0; r < (int)ranks; r++) {
        char name[64];
        ckpt_shard_name(name, sizeof name, r, (int)ranks);
        if (!ckpt_manifest_find(m, name))
            return zo_error(ZO_ERR_FORMAT, "%s: \"partition.ranks\" = %.0f is not a rank count with a file for "
                            "each: %s is not listed", path, ranks, name);
    }
    int nb = m->layout.blocks;
    if (!cJSON_IsArray(blocks) || cJSON_GetArraySize(blocks) != nb)
        return zo_error(ZO_ERR_FORMAT, "%s: \"partition.blocks\" is not an array of %d blocks (layout.blocks)",
                        path, nb);
    q->ranks = (int)ranks;
    q->zero_stage = (int)stage;
    q->numel = calloc((size_t)nb, sizeof *q->numel);
    q->part = calloc((size_t)nb, sizeof *q->part);
    if (!q->numel || !q->part) return zo_error(ZO_ERR_NOMEM, "%s: out of host memory for %d blocks", path, nb);
    uint64_t sum = 0;
    int b = 0;
    for (const cJSON *e = blocks->child; e; e = e->next, b++) {
        const cJSON *n = cJSON_GetArrayItem(e, 0), *c = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsNumber(n) || !cJSON_IsNumber(c) ||
            !(n->valuedouble >= 0 && n->valuedouble <= EXACT_MAX) || n->valuedouble != floor(n->valuedouble) ||
            !(c->valuedouble >= 0 && c->valuedouble <= n->valuedouble + 1) || c->valuedouble != floor(c->valuedouble) ||
            c->valuedouble * ranks < n->valuedouble)
            return zo_error(ZO_ERR_FORMAT, "%s: \"partition.blocks[%d]\" is not [elements, a part of at least "
                            "1/%.0f of them]", path, b, ranks);
        q->numel[b] = (uint64_t)n->valuedouble;
        q->part[b] = (uint64_t)c->valuedouble;
        sum += q->numel[b];
    }
    if (sum != m->layout.params)
        return zo_error(ZO_ERR_FORMAT, "%s: \"partition.blocks\" hold %" PRIu64 " elements, \"layout.params\" "
                        "%" PRIu64, path, sum, m->layout.params);
    return ZO_OK;
}

/* The expert shards of a manifest whose files are read: shard q holds
 * experts [q c, (q + 1) c), c = experts / shards, in its listed file. */
static zo_status parse_experts(const cJSON *x, const char *path, ckpt_manifest *m)
{
    static const char *const known[] = {"experts", "shards", NULL};
    static const char *const known_shard[] = {"file", "first", "count", NULL};
    const cJSON *shards;
    double experts;
    zo_status st;
    if (!cJSON_IsObject(x)) return zo_error(ZO_ERR_FORMAT, "%s: \"experts\" must be an object", path);
    if ((st = check_known(x, known, path, "experts.")) != ZO_OK ||
        (st = get_int(x, "experts", path, "experts.", 1, INT_MAX, &experts)) != ZO_OK ||
        (st = get_item(x, "shards", path, "experts.", &shards)) != ZO_OK)
        return st;
    int n = cJSON_IsArray(shards) ? cJSON_GetArraySize(shards) : 0;
    if (!n || (int)experts % n)
        return zo_error(ZO_ERR_FORMAT, "%s: \"experts.shards\" is not a list of shards dividing the %.0f "
                        "experts", path, experts);
    int c = (int)experts / n, q = 0;
    for (const cJSON *e = shards->child; e; e = e->next, q++) {
        char prefix[48], want[64];
        const char *file = "";
        double first = 0, count = 0;
        snprintf(prefix, sizeof prefix, "experts.shards[%d].", q);
        if (!cJSON_IsObject(e))
            return zo_error(ZO_ERR_FORMAT, "%s: \"experts.shards[%d]\" is not an object", path, q);
        if ((st = check_known(e, known_shard, path, prefix)) != ZO_OK ||
            (st = get_string(e, "file", path, prefix, &file)) != ZO_OK ||
            (st = get_int(e, "first", path, prefix, 0, INT_MAX, &first)) != ZO_OK ||
            (st = get_int(e, "count", path, prefix, 1, INT_MAX, &count)) != ZO_OK)
            return st;
        ckpt_ep_shard_name(want, sizeof want, q, n);
        if ((int)first != q * c || (int)count != c || strcmp(file, want))
            return zo_error(ZO_ERR_FORMAT, "%s: \"%s\" is %s with experts [%.0f, %.0f); shard %d of %d holds "
                            "experts [%d, %d) in %s", path, prefix, file, first, first + count, q, n, q * c,
                            (q + 1) * c, want);
        if (!ckpt_manifest_find(m, file))
            return zo_error(ZO_ERR_FORMAT, "%s: \"%sfile\" %s is not listed", path, prefix, file);
    }
    m->experts = (ckpt_experts){.experts = (int)experts, .shards = n};
    return ZO_OK;
}

zo_status ckpt_manifest_parse(const char *text, size_t len, const char *path, ckpt_manifest *m)
{
    static const char *const known[] = {"format", "version", "layout", "files", "partition", "experts", NULL};
    static const char *const known_layout[] = {"blocks", "params", "dtype", "state_version", NULL};
    static const char *const known_file[] = {"name", "bytes", "xxh3", NULL};
    memset(m, 0, sizeof *m);
    cJSON *o;
    zo_status st = zo_json_parse(text, len, path, &o);
    if (st != ZO_OK) return st;
    const cJSON *lay, *files;
    double blocks, params, sv;
    if (!cJSON_IsObject(o)) {
        st = zo_error(ZO_ERR_FORMAT, "%s: not a JSON object", path);
        goto out_free;
    }
    if ((st = check_format(o, path, CKPT_MANIFEST_FORMAT, CKPT_MANIFEST_VERSION)) != ZO_OK ||
        (st = check_known(o, known, path, "")) != ZO_OK ||
        (st = get_item(o, "layout", path, "", &lay)) != ZO_OK ||
        (st = get_item(o, "files", path, "", &files)) != ZO_OK)
        goto out_free;
    if (!cJSON_IsObject(lay) || !cJSON_IsArray(files)) {
        st = zo_error(ZO_ERR_FORMAT, "%s: \"layout\" must be an object and \"files\" an array", path);
        goto out_free;
    }
    if ((st = check_known(lay, known_layout, path, "layout.")) != ZO_OK ||
        (st = get_int(lay, "blocks", path, "layout.", 1, INT_MAX, &blocks)) != ZO_OK ||
        (st = get_int(lay, "params", path, "layout.", 1, EXACT_MAX, &params)) != ZO_OK ||
        (st = get_int(lay, "state_version", path, "layout.", 1, INT_MAX, &sv)) != ZO_OK ||
        (st = get_dtype(lay, path, "layout.", &m->layout.dtype)) != ZO_OK)
        goto out_free;
    m->layout.blocks = (int)blocks;
    m->layout.params = (uint64_t)params;
    m->layout.state_version = (int)sv;
    int n = cJSON_GetArraySize(files);
    m->files = calloc(n ? (size_t)n : 1, sizeof *m->files);
    if (!m->files) {
        st = zo_error(ZO_ERR_NOMEM, "%s: out of host memory for %d files", path, n);
        goto out_free;
    }
    int i = 0;
    for (const cJSON *e = files->child; e; e = e->next, i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "files[%d].", i);
        const char *name, *hex;
        double bytes;
        if (!cJSON_IsObject(e)) {
            st = zo_error(ZO_ERR_FORMAT, "%s: \"files[%d]\" is not an object", path, i);
            goto out_free;
        }
        if ((st = check_known(e, known_file, path, prefix)) != ZO_OK ||
            (st = get_string(e, "name", path, prefix, &name)) != ZO_OK ||
            (st = get_int(e, "bytes", path, prefix, 0, EXACT_MAX, &bytes)) != ZO_OK ||
            (st = get_string(e, "xxh3", path, prefix, &hex)) != ZO_OK)
            goto out_free;
        char *end;
        uint64_t h = strtoull(hex, &end, 16);
        if (strlen(hex) != 16 || *end || strspn(hex, "0123456789abcdef") != 16) {
            st = zo_error(ZO_ERR_FORMAT, "%s: \"%sxxh3\" = \"%s\" is not 16 hex digits", path, prefix, hex);
            goto out_free;
        }
        if (!name_ok(name)) {
            st = zo_error(ZO_ERR_FORMAT, "%s: \"%sname\" = \"%s\" is not a file name inside the "
                          "checkpoint", path, prefix, name);
            goto out_free;
        }
        if (ckpt_manifest_find(m, name)) {
            st = zo_error(ZO_ERR_FORMAT, "%s: \"%s\" is listed twice", path, name);
            goto out_free;
        }
        ckpt_file_sum *f = &m->files[m->n_files++];
        snprintf(f->name, sizeof f->name, "%s", name);
        f->bytes = (uint64_t)bytes;
        f->xxh3 = h;
    }
    const cJSON *part = cJSON_GetObjectItemCaseSensitive(o, "partition");
    if (part) st = parse_partition(part, path, m);
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "experts");
    if (x && st == ZO_OK && part)
        st = zo_error(ZO_ERR_FORMAT, "%s: both \"partition\" and \"experts\": a checkpoint of expert "
                      "parallelism is not partitioned", path);
    if (x && st == ZO_OK) st = parse_experts(x, path, m);
out_free:
    if (st != ZO_OK) ckpt_manifest_free(m);
    cJSON_Delete(o);
    return st;
}

zo_status ckpt_manifest_read(const char *dir, ckpt_manifest *m)
{
    char path[4200], *text;
    size_t len;
    memset(m, 0, sizeof *m);
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_MANIFEST_NAME);
    zo_status st = zo_file_read_all(path, CKPT_MANIFEST_MAX_BYTES, "a checkpoint manifest", &text, &len);
    if (st != ZO_OK) {
        if (access(path, F_OK) != 0 && errno == ENOENT)
            return zo_error(ZO_ERR_FORMAT, "%s: missing: the checkpoint has no checksums (written "
                            "by an older zoffload, or not completely)", path);
        return st;
    }
    st = ckpt_manifest_parse(text, len, path, m);
    free(text);
    return st;
}

zo_status ckpt_manifest_verify(const char *dir, const ckpt_manifest *m, int rank, int ranks)
{
    for (int i = rank; i < m->n_files; i += ranks) {
        const ckpt_file_sum *want = &m->files[i];
        ckpt_file_sum got;
        zo_status st = ckpt_file_hash(dir, want->name, &got);
        if (st != ZO_OK) return zo_error_wrap(st, "%s/%s (listed in %s)", dir, want->name, CKPT_MANIFEST_NAME);
        if (got.bytes != want->bytes)
            return zo_error(ZO_ERR_CHECKSUM, "%s/%s: %" PRIu64 " bytes, the manifest says %" PRIu64
                            ": the checkpoint is damaged", dir, want->name, got.bytes, want->bytes);
        if (got.xxh3 != want->xxh3)
            return zo_error(ZO_ERR_CHECKSUM, "%s/%s: checksum mismatch (XXH3-64 written %016" PRIx64
                            ", read %016" PRIx64 "): the checkpoint is damaged", dir, want->name,
                            want->xxh3, got.xxh3);
    }
    return ZO_OK;
}

const ckpt_file_sum *ckpt_manifest_find(const ckpt_manifest *m, const char *name)
{
    for (int i = 0; i < m->n_files; i++)
        if (!strcmp(m->files[i].name, name)) return &m->files[i];
    return NULL;
}

void ckpt_manifest_free(ckpt_manifest *m)
{
    free(m->files);
    free(m->partition.numel);
    free(m->partition.part);
    memset(m, 0, sizeof *m);
}

/* ---- names ------------------------------------------------------------------------------ */

/* Decimal digits [s, s + n) as a number no larger than max; leading zeros
 * only where `zeros` allows. */
static int digits(const char *s, size_t n, int zeros, uint64_t max, uint64_t *out)
{
    if (!n || n > 19 || (!zeros && n > 1 && s[0] == '0')) return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > max) return 0;
    *out = v;
    return 1;
}

int ckpt_name_parse(const char *name, int64_t *step, int *k)
{
    if (strncmp(name, "step-", 5)) return 0;
    const char *d = name + 5, *dot = strchr(d, '.');
    size_t n = dot ? (size_t)(dot - d) : strlen(d);
    uint64_t s, kv = 0;
    /* %08lld: exactly 8 digits, or more without a leading zero */
    if (n < 8 || (n > 8 && d[0] == '0') || !digits(d, n, 1, INT64_MAX, &s)) return 0;
    if (dot && (!digits(dot + 1, strlen(dot + 1), 0, INT_MAX, &kv) || kv == 0)) return 0;
    *step = (int64_t)s;
    *k = (int)kv;
    return 1;
}
