#include "corpus.h"

#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/fileio.h" /* defines: zo_file_read_all */
#include "common/json.h"   /* defines: zo_json_check_unique */
#include "unicode.h"  /* defines: model_utf8_check */

#define CORPUS_LIMIT ((size_t)1 << 36) /* 64 GiB: read whole, so bounded by memory anyway */

/* 1 when s ends with suffix, whatever the case of either. */
static int ends_with_nocase(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcasecmp(s + n - k, suffix);
}

static zo_status grow(model_corpus *c, size_t *cap)
{
    if (c->n < *cap) return ZO_OK;
    size_t nc = *cap ? *cap * 2 : 1024;
    char **t = realloc(c->text, nc * sizeof *t);
    if (t) c->text = t;
    size_t *l = realloc(c->len, nc * sizeof *l);
    if (l) c->len = l;
    char **p = realloc(c->completion, nc * sizeof *p);
    if (p) c->completion = p;
    size_t *pl = realloc(c->clen, nc * sizeof *pl);
    if (pl) c->clen = pl;
    int *ln = realloc(c->line, nc * sizeof *ln);
    if (ln) c->line = ln;
    if (!t || !l || !p || !pl || !ln) return zo_error(ZO_ERR_NOMEM, "%s: out of memory for %zu records", c->path, nc);
    *cap = nc;
    return ZO_OK;
}

/* A string member of a record, copied. */
static zo_status take_string(const model_corpus *c, const cJSON *o, const char *key, int line, char **out,
                             size_t *len)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v))
        return zo_error(ZO_ERR_FORMAT, "%s:%d: \"%s\" is %s, not a string", c->path, line, key,
                        v ? "of another type" : "missing");
    *len = strlen(v->valuestring);
    if (model_utf8_check(v->valuestring, *len) != *len) /* a \u escape of a lone surrogate */
        return zo_error(ZO_ERR_INVALID, "%s:%d: \"%s\" decodes to invalid UTF-8 at byte %zu", c->path, line, key,
                        model_utf8_check(v->valuestring, *len));
    if (!(*out = strdup(v->valuestring))) return zo_error(ZO_ERR_NOMEM, "%s:%d: out of memory", c->path, line);
    return ZO_OK;
}

/* The first "\u0000" in the JSON text a[0..n) of one value that parsed (so
 * every backslash is inside a string and starts an escape): its offset, or
 * n. cJSON decodes it to a NUL that ends the C string, cutting the text. */
static size_t find_nul_escape(const char *a, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++) {
        if (a[i] != '\\') continue;
        if (a[i + 1] == 'u' && i + 5 < n && !memcmp(a + i + 2, "0000", 4)) return i;
        i++; /* the escaped character: "\\" is no escape of what follows */
    }
    return n;
}

/* Column (1-based) of byte p of a line starting at a. */
static int column(const char *a, const char *p) { return (int)(p - a) + 1; }

/* What a record of a known shape this reader does not take is, and how to
 * convert it; NULL for others. */
static const char *shape_hint(const cJSON *o)
{
    if (cJSON_HasObjectItem(o, "instruction") && cJSON_HasObjectItem(o, "output"))
        return "an Alpaca record (instruction, input, output): write it as {\"prompt\": ..., \"completion\": ...}";
    if (cJSON_HasObjectItem(o, "messages") || cJSON_HasObjectItem(o, "conversations"))
        return "a chat record (messages) is not read: write each reply to learn as {\"prompt\": ..., "
               "\"completion\": ...}";
    return NULL;
}

/* One record, parsed from JSON text starting on `line`, into c (a copy of
 * its strings). *kind: -1 before the first record, then 1 for pairs, 0 for
 * documents; every record of a file is of one kind. */
static zo_status take_record(model_corpus *c, const cJSON *o, int line, int *kind, size_t *cap)
{
    zo_status st;
    char where[4200];
    snprintf(where, sizeof where, "%s:%d", c->path, line);
    if ((st = zo_json_check_unique(o, where)) != ZO_OK) return st; /* a record that says two things */
    int pair = cJSON_HasObjectItem(o, "prompt") || cJSON_HasObjectItem(o, "completion");
    int text = cJSON_HasObjectItem(o, "text");
    if (pair == text) {
        const char *hint = pair ? NULL : shape_hint(o);
        return hint ? zo_error(ZO_ERR_FORMAT, "%s:%d: %s", c->path, line, hint)
                    : zo_error(ZO_ERR_FORMAT, "%s:%d: a record needs \"text\", or \"prompt\" and \"completion\"",
                               c->path, line);
    }
    if (*kind >= 0 && *kind != pair)
        return zo_error(ZO_ERR_FORMAT, "%s:%d: a %s record in a file of %s records", c->path, line,
                        pair ? "prompt/completion" : "text", pair ? "text" : "prompt/completion");
    *kind = pair;
    if ((st = grow(c, cap)) != ZO_OK) return st;
    size_t i = c->n;
    c->line[i] = line;
    c->completion[i] = NULL;
    c->clen[i] = 0;
    c->text[i] = NULL;
    if (!pair) {
        if ((st = take_string(c, o, "text", line, &c->text[i], &c->len[i])) == ZO_OK) c->n++;
        return st;
    }
    if ((st = take_string(c, o, "prompt", line, &c->text[i], &c->len[i])) != ZO_OK) return st;
    c->n++; /* freed with c from here on */
    return take_string(c, o, "completion", line, &c->completion[i], &c->clen[i]);
}

/* One JSON value (an object, a record) of text a[0..n), starting on `line`:
 * parsed, its end in *end; a \u0000 in it refused. */
static zo_status parse_record(model_corpus *c, const char *a, size_t n, int line, const char *hint,
                              cJSON **out, const char **end)
{
    *out = cJSON_ParseWithLengthOpts(a, n, end, 0);
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return zo_error(ZO_ERR_FORMAT, "%s:%d: not a JSON object%s", c->path, line, hint);
    }
    size_t nul = find_nul_escape(a, (size_t)(*end - a));
    if (nul < (size_t)(*end - a)) {
        cJSON_Delete(*out);
        *out = NULL;
        const char *ls = a + nul; /* the column on its own line */
        while (ls > c->whole && ls[-1] != '\n') ls--;
        for (const char *p = a; p < a + nul; p++) line += *p == '\n';
        return zo_error(ZO_ERR_FORMAT, "%s:%d: a string holds \\u0000 (NUL) at column %d, which would cut the "
                        "record short: remove it", c->path, line, column(ls, a + nul));
    }
    return ZO_OK;
}

static int blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n'; }

/* JSON Lines: one record a line, blank lines skipped; nothing else on a line. */
static zo_status read_jsonl(model_corpus *c, size_t size, const char *hint)
{
    size_t cap = 0;
    int line = 0, kind = -1;
    zo_status st = ZO_OK;
    for (size_t pos = 0; pos < size && st == ZO_OK;) {
        const char *a = c->whole + pos, *nl = memchr(a, '\n', size - pos);
        size_t len = nl ? (size_t)(nl - a) : size - pos;
        pos += len + 1;
        line++;
        size_t k = 0;
        while (k < len && blank(a[k])) k++;
        if (k == len) continue; /* blank */
        cJSON *o;
        const char *end;
        if ((st = parse_record(c, a, len, line, hint, &o, &end)) != ZO_OK) return st;
        while (end < a + len && blank(*end)) end++;
        if (end < a + len)
            st = zo_error(ZO_ERR_FORMAT, "%s:%d: text after the record at column %d: one record a line", c->path,
                          line, column(a, end));
        else
            st = take_record(c, o, line, &kind, &cap);
        cJSON_Delete(o);
    }
    if (st == ZO_OK && !c->n) st = zo_error(ZO_ERR_FORMAT, "%s: no records", c->path);
    c->kind = kind == 1 ? MODEL_CORPUS_PAIRS : MODEL_CORPUS_TEXT;
    return st;
}

/* A JSON array of records (what json.dump of a list writes, alpaca_data.json
 * among them), parsed one record at a time so that each is named by the
 * line it starts on. */
static zo_status read_json_array(model_corpus *c, size_t size)
{
    const char *a = c->whole, *end = a + size, *p = a;
    int line = 1, kind = -1, k = 0;
    size_t cap = 0;
    zo_status st = ZO_OK;
#define SKIP_BLANK()                                                                                   \
    for (; p < end && blank(*p); p++) line += *p == '\n'
    SKIP_BLANK();
    p++; /* the '[' the caller saw */
    SKIP_BLANK();
    if (p < end && *p == ']') p++, k = -1; /* empty */
    while (k >= 0 && st == ZO_OK) {
        cJSON *o;
        const char *after;
        if ((st = parse_record(c, p, (size_t)(end - p), line, "", &o, &after)) != ZO_OK) break;
        st = take_record(c, o, line, &kind, &cap);
        cJSON_Delete(o);
        for (; p < after; p++) line += *p == '\n';
        k++;
        SKIP_BLANK();
        if (st != ZO_OK) break;
        if (p >= end) st = zo_error(ZO_ERR_FORMAT, "%s:%d: the array is not closed", c->path, line);
        else if (*p == ']') p++, k = -1;
        else if (*p != ',')
            st = zo_error(ZO_ERR_FORMAT, "%s:%d: expected ',' or ']' after record %d", c->path, line, k);
        else {
            p++;
            SKIP_BLANK();
        }
    }
    if (st == ZO_OK) {
        SKIP_BLANK();
        if (p < end) st = zo_error(ZO_ERR_FORMAT, "%s:%d: text after the array", c->path, line);
    }
#undef SKIP_BLANK
    if (st == ZO_OK && !c->n) st = zo_error(ZO_ERR_FORMAT, "%s: no records", c->path);
    c->kind = kind == 1 ? MODEL_CORPUS_PAIRS : MODEL_CORPUS_TEXT;
    return st;
}

zo_status model_corpus_parse(model_corpus *c, const char *path, char *bytes, size_t size)
{
    memset(c, 0, sizeof *c);
    c->whole = bytes;
    zo_status st;
    if (!(c->path = strdup(path))) {
        st = zo_error(ZO_ERR_NOMEM, "%s: out of memory", path);
        goto out_free;
    }
    size_t bad = model_utf8_check(c->whole, size);
    if (bad != size) {
        st = zo_error(ZO_ERR_INVALID, "%s: invalid UTF-8 at byte offset %zu", path, bad);
        goto out_free;
    }
    /* a NUL is no text (a token file given as text?), and cut a JSON string */
    const char *nul = memchr(c->whole, 0, size);
    if (nul) {
        int line = 1;
        for (const char *p = c->whole; p < nul; p++) line += *p == '\n';
        st = zo_error(ZO_ERR_FORMAT, "%s: a NUL byte at byte offset %zu (line %d): not text (a token file is "
                      "read without a tokenizer)", path, (size_t)(nul - c->whole), line);
        goto out_free;
    }
    size_t first = 0;
    while (first < size && blank(c->whole[first])) first++;
    if (ends_with_nocase(path, ".jsonl")) {
        c->json = 1;
        st = read_jsonl(c, size, "");
    } else if (ends_with_nocase(path, ".json")) {
        c->json = 1;
        st = first < size && c->whole[first] == '['
                 ? read_json_array(c, size)
                 : read_jsonl(c, size, " (a .json corpus is an array of records, or one record a line)");
    } else if (!size) {
        st = zo_error(ZO_ERR_FORMAT, "%s: empty file", path);
    } else {
        size_t cap = 0;
        if ((st = grow(c, &cap)) == ZO_OK) {
            c->text[0] = c->whole;
            c->len[0] = size;
            c->completion[0] = NULL;
            c->clen[0] = 0;
            c->line[0] = 0;
            c->n = 1;
        }
    }
    if (st == ZO_OK) return ZO_OK;
out_free:
    model_corpus_free(c);
    return st;
}

zo_status model_corpus_read(const char *path, model_corpus *c)
{
    memset(c, 0, sizeof *c);
    if (access(path, F_OK) != 0 && errno == ENOENT) return zo_error(ZO_ERR_NOT_FOUND, "%s: no such file", path);
    char *bytes;
    size_t size;
    zo_status st = zo_file_read_all(path, CORPUS_LIMIT, "a text corpus", &bytes, &size);
    return st == ZO_OK ? model_corpus_parse(c, path, bytes, size) : st;
}

void model_corpus_free(model_corpus *c)
{
    if (c->json)
        for (size_t i = 0; i < c->n; i++) {
            free(c->text[i]);
            free(c->completion[i]);
        }
    free(c->text);
    free(c->len);
    free(c->completion);
    free(c->clen);
    free(c->line);
    free(c->whole);
    free(c->path);
    memset(c, 0, sizeof *c);
}

zo_status model_corpus_tokenize(const model_corpus *c, const model_tokenizer *t,
                                const model_corpus_options *o, int vocab, model_tokens *out)
{
    int pairs = c->kind == MODEL_CORPUS_PAIRS;
    size_t ns = pairs ? 2 * c->n : c->n; /* pairs: each prompt, and prompt + completion */
    const char **docs = calloc(ns + 1, sizeof *docs);
    size_t *lens = calloc(ns + 1, sizeof *lens);
    char **joined = pairs ? calloc(c->n + 1, sizeof *joined) : NULL;
    model_ids *ids = calloc(ns + 1, sizeof *ids);
    uint32_t *all = NULL;
    uint8_t *mask = NULL;
    uint64_t *rows = NULL;
    zo_status st = ZO_OK;
    if (!docs || !lens || !ids || (pairs && !joined)) {
        st = zo_error(ZO_ERR_NOMEM, "%s: out of memory", c->path);
        goto out_free;
    }
    for (size_t i = 0; i < c->n; i++) {
        if (!pairs) {
            docs[i] = c->text[i];
            lens[i] = c->len[i];
            continue;
        }
        if (!(joined[i] = malloc(c->len[i] + c->clen[i] + 1))) {
            st = zo_error(ZO_ERR_NOMEM, "%s: out of memory", c->path);
            goto out_free;
        }
        memcpy(joined[i], c->text[i], c->len[i]);
        memcpy(joined[i] + c->len[i], c->completion[i], c->clen[i] + 1);
        docs[2 * i] = c->text[i];
        lens[2 * i] = c->len[i];
        docs[2 * i + 1] = joined[i];
        lens[2 * i + 1] = c->len[i] + c->clen[i];
    }
    int flags = o->add_special ? MODEL_TOK_ADD_SPECIAL : 0;
    if ((st = model_tokenizer_encode_many(t, docs, lens, ns, flags, -1, o->n_threads, ids)) != ZO_OK) {
        size_t d;
        const char *m = zo_last_error();
        /* "document N: ..." -> the record's line */
        if (sscanf(m, "document %zu:", &d) == 1 && (pairs ? d / 2 : d) < c->n) {
            size_t r = pairs ? d / 2 : d;
            const char *rest = strchr(m, ':') + 1;
            char msg[512];
            snprintf(msg, sizeof msg, "%s", rest);
            if (c->line[r]) st = zo_error(st, "%s:%d:%s", c->path, c->line[r], msg);
            else st = zo_error(st, "%s:%s", c->path, msg);
        }
        goto out_free;
    }
    /* the stream: each record's tokens, then the end-of-text token */
    size_t total = 0;
    for (size_t i = 0; i < c->n; i++) total += ids[pairs ? 2 * i + 1 : i].n + (o->eot >= 0);
    all = malloc((total + 1) * sizeof *all);
    mask = pairs ? malloc(total + 1) : NULL;
    rows = o->packing == MODEL_PACK_PAD ? malloc((c->n + 1) * sizeof *rows) : NULL;
    if (!all || (pairs && !mask) || (o->packing == MODEL_PACK_PAD && !rows)) {
        st = zo_error(ZO_ERR_NOMEM, "%s: out of memory for %zu tokens", c->path, total);
        goto out_free;
    }
    size_t k = 0;
    for (size_t i = 0; i < c->n; i++) {
        const model_ids *full = &ids[pairs ? 2 * i + 1 : i];
        size_t prompt = 0;
        if (pairs) {
            const model_ids *p = &ids[2 * i];
            while (prompt < p->n && prompt < full->n && p->v[prompt] == full->v[prompt]) prompt++;
        }
        if (rows) rows[i] = k;
        for (size_t j = 0; j < full->n; j++) {
            if (full->v[j] >= vocab) {
                st = zo_error(ZO_ERR_INVALID, "%s: token id %d is outside the model's vocabulary of %d "
                              "(is this the model's tokenizer?)", c->path, full->v[j], vocab);
                goto out_free;
            }
            if (mask) mask[k] = j >= prompt;
            all[k++] = (uint32_t)full->v[j];
        }
        if (o->eot >= 0) {
            if (mask) mask[k] = 1;
            all[k++] = (uint32_t)o->eot;
        }
    }
    if (rows) rows[c->n] = k;
    if (!k) {
        st = zo_error(ZO_ERR_INVALID, "%s: no tokens", c->path);
        goto out_free;
    }
    st = model_tokens_from_ids(out, c->path, all, k, vocab, mask, rows, rows ? c->n : 0,
                               o->eot >= 0 && o->eot < vocab ? o->eot : 0);
    all = NULL; /* taken over (freed there on failure too) */
    mask = NULL;
    rows = NULL;
    if (st == ZO_OK && o->seq > 0 && (st = model_tokens_check_seq(out, o->seq, NULL)) != ZO_OK)
        model_tokens_close(out);

out_free:
    for (size_t i = 0; ids && i < ns; i++) model_ids_free(&ids[i]);
    for (size_t i = 0; joined && i < c->n; i++) free(joined[i]);
    free(joined);
    free(ids);
    free(docs);
    free(lens);
    free(all);
    free(mask);
    free(rows);
    return st;
}
