#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/fileio.h" /* defines: zo_file_open_regular, zo_file_create, zo_file_append,
                              zo_file_commit, zo_file_read_all */
#include "common/json.h"   /* defines: zo_json_parse */
#include "common/splitmix.h" /* defines: zo_splitmix_mix, ZO_SPLITMIX_GOLDEN */

zo_status model_tokens_open(model_tokens *t, const char *path, model_token_width width, int vocab)
{
    zo_status st = ZO_OK;
    memset(t, 0, sizeof *t);
    t->fd = -1;
    if (width != MODEL_TOKENS_BYTES && width != MODEL_TOKENS_U16 && width != MODEL_TOKENS_U32)
        return zo_error(ZO_ERR_INVALID, "%s: token width %d (1, 2 or 4 bytes)", path, (int)width);
    if (vocab < 1 || (width == MODEL_TOKENS_BYTES && vocab < MODEL_BYTE_VOCAB))
        return zo_error(ZO_ERR_INVALID, "%s: vocabulary of %d is too small for %s tokens", path,
                        vocab, width == MODEL_TOKENS_BYTES ? "byte" : "these");
    t->path = strdup(path);
    if (!t->path) return zo_error(ZO_ERR_NOMEM, "%s: cannot copy the path", path);
    t->width = width;
    t->vocab = vocab;
    if ((st = zo_file_open_regular(path, "a token file", &t->fd)) != ZO_OK) goto out_close;
    struct stat sb;
    if (fstat(t->fd, &sb) != 0) {
        st = zo_error(ZO_ERR_IO, "%s: fstat: %s", path, strerror(errno));
        goto out_close;
    }
    if (sb.st_size == 0 || (uint64_t)sb.st_size % (uint64_t)width) {
        st = zo_error(ZO_ERR_FORMAT, "%s: %lld bytes is not a whole number of %d-byte tokens%s",
                      path, (long long)sb.st_size, (int)width,
                      sb.st_size == 0 ? " (empty file)" : "");
        goto out_close;
    }
    t->map_size = (size_t)sb.st_size;
    t->n = (uint64_t)sb.st_size / (uint64_t)width;
    t->map = mmap(NULL, t->map_size, PROT_READ, MAP_PRIVATE, t->fd, 0);
    if (t->map == MAP_FAILED) {
        t->map = NULL;
        st = zo_error(ZO_ERR_IO, "%s: mmap of %zu bytes: %s", path, t->map_size, strerror(errno));
        goto out_close;
    }
    /* batches read windows at scattered offsets */
    madvise((void *)t->map, t->map_size, MADV_RANDOM);
    return ZO_OK;
out_close:
    model_tokens_close(t);
    return st;
}

zo_status model_tokens_from_ids(model_tokens *t, const char *name, uint32_t *ids, uint64_t n,
                                int vocab, uint8_t *mask, uint64_t *rows, uint64_t n_rows,
                                int32_t pad_id)
{
    memset(t, 0, sizeof *t);
    t->fd = -1;
    t->owned = (uint8_t *)ids;
    t->mask = mask;
    t->rows = rows;
    t->n_rows = n_rows;
    t->pad_id = pad_id;
    t->map = t->owned;
    t->map_size = n * sizeof(uint32_t);
    t->n = n;
    t->width = MODEL_TOKENS_U32;
    t->vocab = vocab;
    zo_status st = ZO_OK;
    if (!(t->path = strdup(name))) st = zo_error(ZO_ERR_NOMEM, "%s: cannot copy the name", name);
    else if (!n) st = zo_error(ZO_ERR_INVALID, "%s: no tokens", name);
    else if (vocab < 1) st = zo_error(ZO_ERR_INVALID, "%s: vocabulary of %d", name, vocab);
    else if (rows && (!n_rows || rows[0] != 0 || rows[n_rows] != n))
        st = zo_error(ZO_ERR_INVALID, "%s: rows do not cover the %llu tokens", name, (unsigned long long)n);
    else if (pad_id < 0 || pad_id >= vocab)
        st = zo_error(ZO_ERR_INVALID, "%s: pad id %d outside the vocabulary of %d", name, pad_id, vocab);
    if (st == ZO_OK) st = model_tokens_check(t, 0, n); /* in memory: cheap, and checked once */
    if (st != ZO_OK) model_tokens_close(t);
    return st;
}

void model_tokens_close(model_tokens *t)
{
    if (t->owned) free(t->owned);
    else if (t->map) munmap((void *)t->map, t->map_size);
    free(t->mask);
    free(t->rows);
    if (t->fd >= 0) close(t->fd);
    free(t->path);
    memset(t, 0, sizeof *t);
    t->fd = -1;
}

static zo_status bad_id(const model_tokens *t, uint64_t i, uint32_t id)
{
    return zo_error(ZO_ERR_FORMAT, "%s: token %llu (byte offset %llu) is %u, outside the vocabulary of %d",
                    t->path, (unsigned long long)i, (unsigned long long)(i * (uint64_t)t->width), id, t->vocab);
}

zo_status model_tokens_check(const model_tokens *t, uint64_t first, uint64_t count)
{
    if (first > t->n || count > t->n - first)
        return zo_error(ZO_ERR_INVALID, "%s: tokens [%llu, %llu) beyond the %llu in the file",
                        t->path, (unsigned long long)first, (unsigned long long)(first + count),
                        (unsigned long long)t->n);
    for (uint64_t i = first; i < first + count; i++) {
        uint32_t id = model_tokens_get(t, i);
        if (id >= (uint32_t)t->vocab) return bad_id(t, i, id);
    }
    return ZO_OK;
}

/* Tokens [first, first + count) (within t->n) into ids, each checked
 * against the vocabulary. A token file is read with pread, not through its
 * mapping: a file cut short while the run uses it is ZO_ERR_IO naming it
 * and both sizes (touching a mapped page past the new end is SIGBUS). */
static zo_status tokens_read(const model_tokens *t, uint64_t first, uint64_t count, uint32_t *ids)
{
    if (t->owned || t->fd < 0) {
        for (uint64_t i = 0; i < count; i++) ids[i] = model_tokens_get(t, first + i);
    } else {
        uint8_t *b = (uint8_t *)ids; /* read in place, decoded from the end (4 >= width) */
        size_t w = (size_t)t->width, want = (size_t)count * w, got = 0;
        off_t at = (off_t)(first * w);
        while (got < want) {
            ssize_t n = pread(t->fd, b + got, want - got, at + (off_t)got);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0)
                return zo_error(ZO_ERR_IO, "%s: read at byte %lld: %s", t->path, (long long)(at + (off_t)got),
                                strerror(errno));
            if (n == 0) {
                struct stat sb;
                long long now = fstat(t->fd, &sb) == 0 ? (long long)sb.st_size : -1;
                return zo_error(ZO_ERR_IO, "%s: the file ends at byte %lld, was %zu bytes when opened: cut "
                                "short while in use (tokens at byte %lld could not be read)", t->path, now,
                                t->map_size, (long long)(at + (off_t)got));
            }
            got += (size_t)n;
        }
        for (uint64_t i = count; i-- > 0;) {
            const uint8_t *p = b + i * w;
            uint32_t v = p[0];
            if (w > 1) v |= (uint32_t)p[1] << 8;
            if (w > 2) v |= (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            ids[i] = v;
        }
    }
    for (uint64_t i = 0; i < count; i++)
        if (ids[i] >= (uint32_t)t->vocab) return bad_id(t, first + i, ids[i]);
    return ZO_OK;
}

zo_status model_tokens_check_seq(const model_tokens *t, int T, uint64_t *rows_cut)
{
    if (rows_cut) *rows_cut = 0;
    if (T < 1) return zo_error(ZO_ERR_INVALID, "%s: sequences of %d tokens", t->path, T);
    if (!t->rows) {
        if (t->n < (uint64_t)T + 2)
            return zo_error(ZO_ERR_INVALID, "%s: %llu tokens are too few for sequences of %d (--seq %d needs at "
                            "least %d)", t->path, (unsigned long long)t->n, T, T, T + 2);
        if (!t->mask) return ZO_OK;
        for (uint64_t i = 1; i < t->n; i++)
            if (t->mask[i]) return ZO_OK;
        return zo_error(ZO_ERR_INVALID, "%s: no token is a target: every completion is empty", t->path);
    }
    /* a padded row trains on its tokens 1 .. min(len, T + 1) - 1 that the mask keeps */
    uint64_t cut = 0, need = UINT64_MAX;
    for (uint64_t r = 0; r < t->n_rows; r++) {
        uint64_t a = t->rows[r], len = t->rows[r + 1] - a, first = 1;
        while (first < len && t->mask && !t->mask[a + first]) first++;
        if (first >= len) { /* no target even uncut */
            cut++;
            continue;
        }
        if (first > (uint64_t)T) cut++;
        if (first < need) need = first;
    }
    if (rows_cut) *rows_cut = cut;
    if (cut < t->n_rows) return ZO_OK;
    if (need == UINT64_MAX)
        return zo_error(ZO_ERR_INVALID, "%s: no record has a token to learn (every completion is empty)", t->path);
    return zo_error(ZO_ERR_INVALID, "%s: every record's completion is cut off by --seq %d: the shortest prompt takes "
                    "%llu tokens (--seq %llu or more keeps a completion token of it)", t->path, T,
                    (unsigned long long)need, (unsigned long long)need);
}

/* splitmix64's draw after x: a full-period 64-bit mixer, enough for picking offsets. */
static uint64_t mix64(uint64_t x) { return zo_splitmix_mix(x + ZO_SPLITMIX_GOLDEN); }

uint64_t model_batch_offset(const model_tokens *t, int B, int T, int64_t step, int row,
                            uint64_t seed, model_sample mode)
{
    uint64_t span = t->n - (uint64_t)T - 1; /* callers ensure n >= T + 2 */
    if (mode == MODEL_SAMPLE_RANDOM) {
        uint64_t h = mix64(seed ^ mix64((uint64_t)step ^ mix64((uint64_t)row + 1)));
        /* multiply-shift maps h onto [0, span) without a modulo bias worth noting */
        return (uint64_t)(((unsigned __int128)h * span) >> 64);
    }
    unsigned __int128 k = (unsigned __int128)(uint64_t)step * (uint64_t)B + (uint64_t)row;
    return (uint64_t)((k * (uint64_t)T) % span);
}

/* One padded row: record r of the rows, cut to T + 1 tokens. */
static void batch_row_padded(const model_tokens *t, int T, uint64_t r, int32_t *in, int32_t *tg)
{
    uint64_t a = t->rows[r], len = t->rows[r + 1] - a;
    if (len > (uint64_t)T + 1) len = (uint64_t)T + 1;
    for (int j = 0; j < T; j++) {
        uint64_t p = a + (uint64_t)j;
        in[j] = (uint64_t)j < len ? (int32_t)model_tokens_get(t, p) : t->pad_id;
        tg[j] = (uint64_t)j + 1 < len && (!t->mask || t->mask[p + 1]) ? (int32_t)model_tokens_get(t, p + 1) : -1;
    }
}

zo_status model_batch_get(const model_tokens *t, int B, int T, int64_t step, uint64_t seed,
                          model_sample mode, int32_t *inputs, int32_t *targets)
{
    if (B < 1 || T < 1 || step < 0)
        return zo_error(ZO_ERR_INVALID, "%s: batch %d x %d at step %lld", t->path, B, T,
                        (long long)step);
    if (t->rows) { /* in memory, checked when made */
        for (int b = 0; b < B; b++) {
            uint64_t r = (uint64_t)(((unsigned __int128)(uint64_t)step * (uint64_t)B + (uint64_t)b) % t->n_rows);
            if (mode == MODEL_SAMPLE_RANDOM)
                r = (uint64_t)(((unsigned __int128)mix64(seed ^ mix64((uint64_t)step ^ mix64((uint64_t)b + 1))) *
                                t->n_rows) >> 64);
            batch_row_padded(t, T, r, inputs + (size_t)b * (size_t)T, targets + (size_t)b * (size_t)T);
        }
        return ZO_OK;
    }
    if (t->n < (uint64_t)T + 2)
        return zo_error(ZO_ERR_INVALID,
                        "%s: %llu tokens are too few for sequences of %d (need at least %d)",
                        t->path, (unsigned long long)t->n, T, T + 2);
    uint32_t *win = malloc(((size_t)T + 1) * sizeof *win);
    if (!win) return zo_error(ZO_ERR_NOMEM, "%s: out of host memory for a window of %d tokens", t->path, T + 1);
    zo_status st = ZO_OK;
    for (int b = 0; b < B && st == ZO_OK; b++) {
        uint64_t off = model_batch_offset(t, B, T, step, b, seed, mode);
        /* the (T+1)-token window: inputs are its first T, targets its last T */
        if ((st = tokens_read(t, off, (uint64_t)T + 1, win)) != ZO_OK) break;
        int32_t *in = inputs + (size_t)b * (size_t)T;
        int32_t *tg = targets + (size_t)b * (size_t)T;
        for (int j = 0; j < T; j++) {
            in[j] = (int32_t)win[j];
            tg[j] = (int32_t)win[j + 1];
            if (t->mask && !t->mask[off + (uint64_t)j + 1]) tg[j] = -1;
        }
    }
    free(win);
    return st;
}

/* ---- token files with a side file --------------------------------------------------- */

#define INFO_LIMIT (1 << 20)

static char *info_path(const char *path)
{
    size_t n = strlen(path);
    char *p = malloc(n + 6);
    if (p) {
        memcpy(p, path, n);
        memcpy(p + n, ".json", 6);
    }
    return p;
}

model_token_width model_tokens_width_for(int vocab)
{
    return vocab <= 65536 ? MODEL_TOKENS_U16 : MODEL_TOKENS_U32;
}

zo_status model_tokens_info_read(const char *path, model_tokens_info *info, int *found)
{
    memset(info, 0, sizeof *info);
    info->eot = -1;
    *found = 0;
    char *ip = info_path(path), *text = NULL;
    size_t len;
    if (!ip) return zo_error(ZO_ERR_NOMEM, "%s: out of memory", path);
    if (access(ip, F_OK) != 0 && errno == ENOENT) { /* no side file: an older token file */
        free(ip);
        return ZO_OK;
    }
    zo_status st = zo_file_read_all(ip, INFO_LIMIT, "a token file's side file", &text, &len);
    if (st != ZO_OK) {
        free(ip);
        return st;
    }
    cJSON *root;
    st = zo_json_parse(text, len, ip, &root);
    free(text);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    const cJSON *voc = cJSON_GetObjectItemCaseSensitive(root, "vocab");
    const cJSON *eot = cJSON_GetObjectItemCaseSensitive(root, "eot");
    const cJSON *docs = cJSON_GetObjectItemCaseSensitive(root, "documents");
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(root, "tokenizer");
    /* malformed, or a key given twice: zo_json_parse named it */
    if (st == ZO_OK && (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "zoffload-tokens")))
        st = zo_error(ZO_ERR_FORMAT, "%s: \"format\" is not \"zoffload-tokens\"", ip);
    else if (st == ZO_OK &&
             (!cJSON_IsString(dt) || (strcmp(dt->valuestring, "uint16") && strcmp(dt->valuestring, "uint32"))))
        st = zo_error(ZO_ERR_FORMAT, "%s: \"dtype\" must be \"uint16\" or \"uint32\"", ip);
    else if (st == ZO_OK && (!cJSON_IsNumber(voc) || voc->valuedouble < 1 || voc->valuedouble > INT32_MAX))
        st = zo_error(ZO_ERR_FORMAT, "%s: \"vocab\" must be a positive integer", ip);
    if (st == ZO_OK) {
        info->width = !strcmp(dt->valuestring, "uint16") ? MODEL_TOKENS_U16 : MODEL_TOKENS_U32;
        info->vocab = voc->valueint;
        if (cJSON_IsNumber(eot)) info->eot = eot->valueint;
        if (cJSON_IsNumber(docs) && docs->valuedouble >= 0) info->documents = (uint64_t)docs->valuedouble;
        if (cJSON_IsNumber(toks) && toks->valuedouble >= 0) info->tokens = (uint64_t)toks->valuedouble;
        if (cJSON_IsString(tk)) snprintf(info->tokenizer, sizeof info->tokenizer, "%s", tk->valuestring);
        if (info->width == MODEL_TOKENS_U16 && info->vocab > 65536)
            st = zo_error(ZO_ERR_FORMAT, "%s: a vocabulary of %d does not fit uint16 tokens", ip, info->vocab);
        else
            *found = 1;
    }
    cJSON_Delete(root);
    free(ip);
    return st;
}

zo_status model_tokens_writer_open(model_tokens_writer *w, const char *path, model_token_width width,
                                   int vocab)
{
    memset(w, 0, sizeof *w);
    if (width != MODEL_TOKENS_U16 && width != MODEL_TOKENS_U32)
        return zo_error(ZO_ERR_INVALID, "%s: tokens are written as 2 or 4 bytes, not %d", path, (int)width);
    if (vocab < 1 || (width == MODEL_TOKENS_U16 && vocab > 65536))
        return zo_error(ZO_ERR_INVALID, "%s: a vocabulary of %d does not fit %d-byte tokens", path, vocab,
                        (int)width);
    zo_file_writer *f = calloc(1, sizeof *f);
    if (!f || !(w->path = strdup(path))) {
        free(f);
        return zo_error(ZO_ERR_NOMEM, "%s: out of memory", path);
    }
    zo_status st = zo_file_create(f, path);
    if (st != ZO_OK) {
        free(f);
        free(w->path);
        w->path = NULL;
        return st;
    }
    w->file = f;
    w->width = width;
    w->vocab = vocab;
    return ZO_OK;
}

zo_status model_tokens_writer_append(model_tokens_writer *w, const int32_t *ids, size_t n)
{
    size_t bytes = n * (size_t)w->width;
    if (bytes > w->buf_cap) {
        uint8_t *nb = realloc(w->buf, bytes);
        if (!nb) return zo_error(ZO_ERR_NOMEM, "%s: out of memory for %zu tokens", w->path, n);
        w->buf = nb;
        w->buf_cap = bytes;
    }
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= w->vocab)
            return zo_error(ZO_ERR_INVALID, "%s: token %llu is %d, outside the vocabulary of %d", w->path,
                            (unsigned long long)(w->n + i), ids[i], w->vocab);
        uint32_t v = (uint32_t)ids[i];
        uint8_t *p = w->buf + i * (size_t)w->width;
        p[0] = (uint8_t)v; /* little endian */
        p[1] = (uint8_t)(v >> 8);
        if (w->width == MODEL_TOKENS_U32) {
            p[2] = (uint8_t)(v >> 16);
            p[3] = (uint8_t)(v >> 24);
        }
    }
    zo_status st = zo_file_append(w->file, w->buf, bytes);
    if (st == ZO_OK) w->n += n;
    return st;
}

static void writer_free(model_tokens_writer *w)
{
    free(w->file);
    free(w->path);
    free(w->buf);
    memset(w, 0, sizeof *w);
}

void model_tokens_writer_abort(model_tokens_writer *w)
{
    if (w->file) zo_file_abort(w->file);
    writer_free(w);
}

zo_status model_tokens_writer_commit(model_tokens_writer *w, const model_tokens_info *info)
{
    zo_status st = zo_file_commit(w->file);
    if (st != ZO_OK) {
        writer_free(w);
        return st;
    }
    cJSON *root = cJSON_CreateObject();
    char *ip = info_path(w->path), *text = NULL;
    if (root) {
        cJSON_AddStringToObject(root, "format", "zoffload-tokens");
        cJSON_AddNumberToObject(root, "version", 1);
        cJSON_AddStringToObject(root, "dtype", w->width == MODEL_TOKENS_U16 ? "uint16" : "uint32");
        cJSON_AddNumberToObject(root, "vocab", w->vocab);
        cJSON_AddNumberToObject(root, "eot", info->eot);
        cJSON_AddNumberToObject(root, "documents", (double)info->documents);
        cJSON_AddNumberToObject(root, "tokens", (double)w->n);
        cJSON_AddStringToObject(root, "tokenizer", info->tokenizer);
        text = cJSON_Print(root);
    }
    if (!root || !ip || !text) {
        st = zo_error(ZO_ERR_NOMEM, "%s: out of memory for the side file", w->path);
    } else {
        zo_file_writer f;
        if ((st = zo_file_create(&f, ip)) == ZO_OK) {
            size_t tl = strlen(text);
            text[tl] = '\n'; /* cJSON_Print leaves room for the NUL: replace it */
            if ((st = zo_file_append(&f, text, tl + 1)) == ZO_OK) st = zo_file_commit(&f);
            else zo_file_abort(&f);
        }
    }
    cJSON_free(text);
    cJSON_Delete(root);
    free(ip);
    writer_free(w);
    return st;
}

zo_status model_bytes_encode_file(const char *text_path, const char *tokens_path,
                                  model_token_width width, uint64_t *n_tokens)
{
    if (width != MODEL_TOKENS_U16 && width != MODEL_TOKENS_U32)
        return zo_error(ZO_ERR_INVALID, "%s: byte tokens are written as 2 or 4 bytes, not %d",
                        tokens_path, (int)width);
    model_tokens text;
    zo_status st = model_tokens_open(&text, text_path, MODEL_TOKENS_BYTES, MODEL_BYTE_VOCAB);
    if (st) return st;
    zo_file_writer out;
    if ((st = zo_file_create(&out, tokens_path)) != ZO_OK) goto out_close_text;
    enum { CHUNK = 1 << 16 };
    uint8_t buf[CHUNK * 4];
    for (uint64_t i = 0; i < text.n; i += CHUNK) {
        uint64_t m = text.n - i < CHUNK ? text.n - i : CHUNK;
        for (uint64_t j = 0; j < m; j++) {
            uint8_t c = text.map[i + j];
            uint8_t *p = buf + j * (uint64_t)width;
            p[0] = c; /* little endian: the byte, then zeros */
            memset(p + 1, 0, (size_t)width - 1);
        }
        if ((st = zo_file_append(&out, buf, (size_t)(m * (uint64_t)width))) != ZO_OK) {
            zo_file_abort(&out);
            goto out_close_text;
        }
    }
    if ((st = zo_file_commit(&out)) != ZO_OK) goto out_close_text;
    if (n_tokens) *n_tokens = text.n;
out_close_text:
    model_tokens_close(&text);
    return st;
}

zo_status model_bytes_decode(const int32_t *ids, size_t n, char *out, size_t cap)
{
    if (cap < n + 1)
        return zo_error(ZO_ERR_INVALID, "byte decode: %zu tokens need %zu bytes, have %zu", n,
                        n + 1, cap);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= MODEL_BYTE_VOCAB)
            return zo_error(ZO_ERR_INVALID, "byte decode: token %zu is %d, not a byte (0..255)", i,
                            ids[i]);
        out[i] = (char)(unsigned char)ids[i];
    }
    out[n] = '\0';
    return ZO_OK;
}
