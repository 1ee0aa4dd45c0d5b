/* tokenizer.json: loading, encoding (added tokens, normalizer,
 * pre-tokenizer, BPE, post-processor) and decoding. See tokenizer.h. */
#include "tokenizer.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/fileio.h" /* defines: zo_file_read_all */
#include "common/json.h"   /* defines: zo_json_parse */
#include "unicode.h"  /* defines: model_uc_class_of, model_utf8_check, model_uc_nfc */

#define TOK_FILE_LIMIT ((size_t)1 << 30) /* a tokenizer.json larger than 1 GiB is refused */
#define CACHE_WORD_MAX 64                /* words up to this many bytes are cached */
#define CACHE_SLOTS (1u << 15)
#define CACHE_ARENA ((size_t)4 << 20)

/* ---- hashing -------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t h)
{
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

static inline uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    return mix64((h ^ w) * 0x94d049bb133111ebull);
}

/* A growable byte arena; strings are referred to by offset. */
typedef struct arena {
    uint8_t *p;
    size_t len, cap;
} arena;

static zo_status arena_add(arena *a, const void *s, size_t n, uint32_t *off)
{
    if (a->len + n + 1 > UINT32_MAX) return zo_error(ZO_ERR_INVALID, "tokenizer strings exceed 4 GiB");
    if (a->len + n + 1 > a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 1 << 16;
        while (cap < a->len + n + 1) cap *= 2;
        uint8_t *np = realloc(a->p, cap);
        if (!np) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory for strings");
        a->p = np;
        a->cap = cap;
    }
    memcpy(a->p + a->len, s, n);
    a->p[a->len + n] = 0;
    *off = (uint32_t)a->len;
    a->len += n + 1;
    return ZO_OK;
}

/* bytes -> id, open addressing over entries in an arena */
typedef struct str_entry {
    uint64_t h;
    uint32_t off, len;
    int32_t id;
} str_entry;

typedef struct str_map {
    uint32_t *slot; /* entry index + 1; 0 empty */
    size_t mask;
    str_entry *e;
    size_t n, cap;
} str_map;

static zo_status str_map_init(str_map *m, size_t expect)
{
    size_t slots = 16;
    while (slots < expect * 2) slots *= 2;
    m->slot = calloc(slots, sizeof(uint32_t));
    m->e = malloc((expect + 1) * sizeof(str_entry));
    m->mask = slots - 1;
    m->n = 0;
    m->cap = expect + 1;
    if (!m->slot || !m->e) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory for the vocabulary");
    return ZO_OK;
}

static void str_map_free(str_map *m)
{
    free(m->slot);
    free(m->e);
}

static int32_t str_map_get(const str_map *m, const uint8_t *base, const uint8_t *s, size_t n,
                           uint64_t h)
{
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint32_t k = m->slot[i];
        if (!k) return -1;
        const str_entry *e = &m->e[k - 1];
        if (e->h == h && e->len == n && !memcmp(base + e->off, s, n)) return e->id;
    }
}

/* Insert (the first insertion of a string wins; callers check first). */
static void str_map_put(str_map *m, uint64_t h, uint32_t off, uint32_t len, int32_t id)
{
    size_t i = h & m->mask;
    while (m->slot[i]) i = (i + 1) & m->mask;
    m->e[m->n] = (str_entry){.h = h, .off = off, .len = len, .id = id};
    m->slot[i] = (uint32_t)++m->n;
}

/* (left id, right id) -> (rank, merged id) */
typedef struct pair_slot {
    uint64_t key; /* UINT64_MAX: empty */
    uint32_t rank;
    int32_t id;
} pair_slot;

typedef struct pair_map {
    pair_slot *s;
    size_t mask;
} pair_map;

static inline uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

static inline const pair_slot *pair_get(const pair_map *m, int32_t a, int32_t b)
{
    uint64_t k = pair_key(a, b);
    for (size_t i = mix64(k * 0x9E3779B97F4A7C15ull) & m->mask;; i = (i + 1) & m->mask) {
        const pair_slot *s = &m->s[i];
        if (s->key == k) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}

/* ---- the tokenizer ------------------------------------------------------------------ */

typedef enum split_kind { SPLIT_NONE = 0, SPLIT_GPT2, SPLIT_LLAMA3 } split_kind;
typedef enum norm_kind { NORM_NFC, NORM_PREPEND, NORM_REPLACE } norm_kind;
typedef enum dec_kind {
    DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE,
} dec_kind;
typedef enum prepend_scheme { PREPEND_NEVER = 0, PREPEND_ALWAYS, PREPEND_FIRST } prepend_scheme;

/* One step of the normalizer or of the decoder. */
typedef struct pipe_step {
    int kind;         /* norm_kind or dec_kind */
    char *a, *b;      /* Prepend: a; Replace: a -> b; Strip/Metaspace: a = the character */
    size_t an, bn;
    int start, stop;  /* Strip */
    int prepend;      /* Metaspace decoder: prepend_scheme != never */
} pipe_step;
typedef pipe_step norm_step;
typedef pipe_step dec_step;

typedef struct added_token {
    char *content;
    size_t len;
    int32_t id;
    int special, lstrip, rstrip, normalized;
} added_token;

/* One splitter: tokens matched leftmost, longest first. */
typedef struct added_set {
    int *idx;        /* token indexes, by first byte then longest first */
    int start[257];  /* idx[start[b] .. start[b+1]) begin with byte b */
    int n;
} added_set;

struct model_tokenizer {
    char *path;
    arena strs;
    int n_ids;                 /* largest id + 1 */
    uint32_t *id_off, *id_len; /* [n_ids] the token as spelled in the file (arena) */
    uint8_t *id_kind;          /* [n_ids] ID_* */
    str_map vocab;             /* model-internal bytes -> id */
    pair_map merges;
    int32_t byte_id[256];      /* byte-level: the token of each byte */
    int32_t fallback_id[256];  /* <0xXX> tokens, -1 absent */
    int32_t ascii_id[128];     /* SentencePiece: the token of each ASCII character */
    int32_t unk;
    int byte_level, byte_fallback, fuse_unk, ignore_merges;
    /* SentencePiece text without a pre-tokenizer is one word; BPE may cut it
     * before each "▁" that follows another character when no merge joins a
     * symbol ending in another character to one starting with "▁" (nothing
     * can then span the cut): words become short and cacheable, the ids the
     * same. */
    int sp_cut;
    norm_step *norm;
    int n_norm;
    split_kind split;
    int digits_max;            /* LLaMA-3 \p{N}{1,3}: 3; Qwen2 \p{N}: 1 */
    int add_prefix_space;      /* ByteLevel */
    int metaspace;             /* the Metaspace pre-tokenizer */
    char meta_rep[8];
    int meta_rep_len;
    prepend_scheme meta_prepend;
    int meta_split;
    added_token *added;
    int n_added;
    added_set raw_set, norm_set;
    int32_t *prefix, *suffix;  /* post-processor */
    int n_prefix, n_suffix;
    dec_step *dec;
    int n_dec, has_decoder;
    int32_t eot;
};

enum { ID_NONE = 0, ID_MODEL = 1, ID_ADDED = 2, ID_SPECIAL = 4 };

typedef struct cache_slot {
    uint64_t h;
    uint32_t off;    /* in the cache arena: the word, then its ids (4-aligned) */
    uint16_t len;    /* word bytes; 0: empty slot */
    uint16_t n_ids;
} cache_slot;

struct model_tok_ctx {
    const model_tokenizer *t;
    int32_t *sid, *snext, *sprev; /* BPE symbols */
    size_t scap;
    uint64_t *heap;
    size_t hn, hcap;
    char *buf[3];                  /* normalizer / pre-tokenizer scratch */
    size_t bufcap[3];
    cache_slot *cache;
    size_t cache_n;
    uint8_t *carena;
    size_t carena_len;
};

/* ---- byte-level alphabet ------------------------------------------------------------- */

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others
 * (0-32, 127-160, 173) for U+0100 onwards in order. */
static void byte_level_tables(uint32_t byte_to_cp[256], int16_t cp_to_byte[324])
{
    int n = 0;
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        byte_to_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

/* A byte-level string (UTF-8 of the alphabet) to raw bytes; 0 when s[0..n)
 * is not valid UTF-8 (a sequence cut off at the end included: it is never
 * decoded past s + n) or a character is outside the alphabet. out has room
 * for n bytes and may be s. */
static int byte_level_decode(const int16_t cp_to_byte[324], const char *s, size_t n, uint8_t *out,
                             size_t *out_n)
{
    if (model_utf8_check(s, n) != n) return 0;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)model_utf8_next((const uint8_t *)s + i, &cp);
        if (cp >= 324 || cp_to_byte[cp] < 0) return 0;
        out[k++] = (uint8_t)cp_to_byte[cp];
    }
    *out_n = k;
    return 1;
}

/* ---- loading ------------------------------------------------------------------------- */

#define GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define LLAMA3_PATTERN                                                                           \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                  \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_PATTERN                                                                            \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                       \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A boolean member: 1/0, or `dflt` when absent or null. */
static int jbool(const cJSON *o, const char *k, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return dflt;
}

static zo_status dupn(const char *s, size_t n, char **out)
{
    *out = malloc(n + 1);
    if (!*out) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(*out, s, n);
    (*out)[n] = 0;
    return ZO_OK;
}

static zo_status unsupported(const model_tokenizer *t, const char *field, const char *what)
{
    return zo_error(ZO_ERR_UNSUPPORTED, "%s: %s %s is not supported (this reader implements the "
                    "byte-level and SentencePiece BPE tokenizers of GPT-2, LLaMA-2/3, Mistral and "
                    "Qwen2)", t->path, field, what);
}

/* A pipeline component: absent or null (nothing), a Sequence of components
 * under `list_key`, or one component that `one` loads. */
typedef zo_status (*component_fn)(model_tokenizer *t, const cJSON *o, const char *type, const char *field);

static zo_status load_component(model_tokenizer *t, const cJSON *o, const char *field, const char *list_key,
                                component_fn one)
{
    if (!o || cJSON_IsNull(o)) return ZO_OK;
    const char *type = jstr(o, "type");
    if (!type) return zo_error(ZO_ERR_FORMAT, "%s: %s has no \"type\"", t->path, field);
    if (strcmp(type, "Sequence")) return one(t, o, type, field);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, list_key), *it;
    if (!cJSON_IsArray(list)) return zo_error(ZO_ERR_FORMAT, "%s: %s.%s is not an array", t->path, field, list_key);
    int i = 0;
    cJSON_ArrayForEach(it, list)
    {
        char sub[128];
        if (snprintf(sub, sizeof sub, "%s.%s[%d]", field, list_key, i++) >= (int)sizeof sub)
            return zo_error(ZO_ERR_FORMAT, "%s: %s: Sequences nested too deep", t->path, field);
        zo_status st = load_component(t, it, sub, list_key, one);
        if (st != ZO_OK) return st;
    }
    return ZO_OK;
}

/* Append s to a pipeline once it loaded (st); its strings are freed otherwise. */
static zo_status add_step(pipe_step **arr, int *n, pipe_step s, zo_status st)
{
    pipe_step *np = st == ZO_OK ? realloc(*arr, (size_t)(*n + 1) * sizeof *np) : NULL;
    if (!np) {
        free(s.a);
        free(s.b);
        return st != ZO_OK ? st : zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory");
    }
    *arr = np;
    np[(*n)++] = s;
    return ZO_OK;
}

/* A Replace (normalizer or decoder) of a string pattern: a -> b. */
static zo_status load_replace(const model_tokenizer *t, const cJSON *o, const char *field, char **a, size_t *an,
                              char **b, size_t *bn)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const char *from = jstr(pat, "String"), *to = jstr(o, "content");
    if (!from) return unsupported(t, field, "Replace with a Regex pattern");
    if (!to || !*from) return zo_error(ZO_ERR_FORMAT, "%s: %s needs a non-empty pattern and a content", t->path, field);
    *an = strlen(from);
    *bn = strlen(to);
    zo_status st = dupn(from, *an, a);
    return st == ZO_OK ? dupn(to, *bn, b) : st;
}

static zo_status load_normalizer(model_tokenizer *t, const cJSON *n, const char *type, const char *field)
{
    norm_step s = {0};
    zo_status st = ZO_OK;
    if (!strcmp(type, "NFC")) {
        s.kind = NORM_NFC;
    } else if (!strcmp(type, "Prepend")) {
        const char *p = jstr(n, "prepend");
        if (!p) return zo_error(ZO_ERR_FORMAT, "%s: %s.prepend is not a string", t->path, field);
        s.kind = NORM_PREPEND;
        s.an = strlen(p);
        st = dupn(p, s.an, &s.a);
    } else if (!strcmp(type, "Replace")) {
        s.kind = NORM_REPLACE;
        st = load_replace(t, n, field, &s.a, &s.an, &s.b, &s.bn);
    } else {
        return unsupported(t, field, type);
    }
    return add_step(&t->norm, &t->n_norm, s, st);
}

static zo_status load_metaspace(model_tokenizer *t, const cJSON *p, const char *field)
{
    const char *rep = jstr(p, "replacement");
    if (!rep) rep = "\xe2\x96\x81";
    size_t rl = strlen(rep);
    if (rl == 0 || rl >= sizeof t->meta_rep || model_utf8_check(rep, rl) != rl)
        return zo_error(ZO_ERR_FORMAT, "%s: %s.replacement must be one character", t->path, field);
    memcpy(t->meta_rep, rep, rl);
    t->meta_rep_len = (int)rl;
    const char *scheme = jstr(p, "prepend_scheme");
    if (scheme) {
        if (!strcmp(scheme, "always")) t->meta_prepend = PREPEND_ALWAYS;
        else if (!strcmp(scheme, "first")) t->meta_prepend = PREPEND_FIRST;
        else if (!strcmp(scheme, "never")) t->meta_prepend = PREPEND_NEVER;
        else return zo_error(ZO_ERR_FORMAT, "%s: %s.prepend_scheme \"%s\"", t->path, field, scheme);
    } else {
        t->meta_prepend = jbool(p, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
    }
    t->meta_split = jbool(p, "split", 1);
    t->metaspace = 1;
    return ZO_OK;
}

static zo_status load_pre_tokenizer(model_tokenizer *t, const cJSON *p, const char *type, const char *field)
{
    if (t->metaspace) return unsupported(t, field, "after Metaspace");
    if (!strcmp(type, "ByteLevel")) {
        if (t->byte_level) return unsupported(t, field, "a second ByteLevel");
        t->byte_level = 1;
        t->add_prefix_space = jbool(p, "add_prefix_space", 0);
        if (jbool(p, "use_regex", 1)) {
            if (t->split != SPLIT_NONE) return unsupported(t, field, "ByteLevel with use_regex after a Split");
            t->split = SPLIT_GPT2;
        } else if (t->add_prefix_space && t->split != SPLIT_NONE) {
            return unsupported(t, field, "ByteLevel add_prefix_space after a Split");
        }
        return ZO_OK;
    }
    if (!strcmp(type, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *re = jstr(pat, "Regex"), *beh = jstr(p, "behavior");
        if (t->split != SPLIT_NONE || t->byte_level) return unsupported(t, field, "a second Split");
        if (!re) return unsupported(t, field, "Split with a String pattern");
        if (jbool(p, "invert", 0) || !beh || strcmp(beh, "Isolated"))
            return unsupported(t, field, "Split other than behavior Isolated, invert false");
        if (!strcmp(re, GPT2_PATTERN)) t->split = SPLIT_GPT2;
        else if (!strcmp(re, LLAMA3_PATTERN)) t->split = SPLIT_LLAMA3, t->digits_max = 3;
        else if (!strcmp(re, QWEN2_PATTERN)) t->split = SPLIT_LLAMA3, t->digits_max = 1;
        else {
            char what[256];
            snprintf(what, sizeof what, "pattern %.160s%s (known: the GPT-2, LLaMA-3 and Qwen2 patterns)",
                     re, strlen(re) > 160 ? "..." : "");
            return unsupported(t, field, what);
        }
        return ZO_OK;
    }
    if (!strcmp(type, "Metaspace")) {
        if (t->split != SPLIT_NONE || t->byte_level) return unsupported(t, field, "Metaspace after another pre-tokenizer");
        return load_metaspace(t, p, field);
    }
    return unsupported(t, field, type);
}

static zo_status load_decoder(model_tokenizer *t, const cJSON *d, const char *type, const char *field)
{
    dec_step s = {0};
    zo_status st = ZO_OK;
    if (!strcmp(type, "ByteLevel")) {
        s.kind = DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        s.kind = DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        s.kind = DEC_FUSE;
    } else if (!strcmp(type, "Replace")) {
        s.kind = DEC_REPLACE;
        st = load_replace(t, d, field, &s.a, &s.an, &s.b, &s.bn);
    } else if (!strcmp(type, "Strip")) {
        const char *c = jstr(d, "content");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(d, "start"),
                    *b = cJSON_GetObjectItemCaseSensitive(d, "stop");
        if (!c || !*c || !cJSON_IsNumber(a) || !cJSON_IsNumber(b))
            return zo_error(ZO_ERR_FORMAT, "%s: %s needs content, start and stop", t->path, field);
        s.kind = DEC_STRIP;
        s.start = a->valueint;
        s.stop = b->valueint;
        s.an = strlen(c);
        st = dupn(c, s.an, &s.a);
    } else if (!strcmp(type, "Metaspace")) {
        const char *rep = jstr(d, "replacement");
        if (!rep) rep = "\xe2\x96\x81";
        const char *scheme = jstr(d, "prepend_scheme");
        s.kind = DEC_METASPACE;
        s.prepend = scheme ? strcmp(scheme, "never") != 0 : jbool(d, "add_prefix_space", 1);
        s.an = strlen(rep);
        st = dupn(rep, s.an, &s.a);
    } else {
        return unsupported(t, field, type);
    }
    return add_step(&t->dec, &t->n_dec, s, st);
}

/* The id of a token named in a post-processor: an added token or a vocab entry. */
static zo_status named_id(const model_tokenizer *t, const char *name, const char *field, int32_t *id)
{
    *id = model_tokenizer_token_id(t, name);
    if (*id < 0) return zo_error(ZO_ERR_FORMAT, "%s: %s names \"%s\", which is no token", t->path, field, name);
    return ZO_OK;
}

static zo_status push_special(int32_t **arr, int *n, int32_t id)
{
    int32_t *np = realloc(*arr, (size_t)(*n + 1) * sizeof(int32_t));
    if (!np) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory");
    *arr = np;
    np[(*n)++] = id;
    return ZO_OK;
}

static zo_status load_post(model_tokenizer *t, const cJSON *p, const char *type, const char *field)
{
    zo_status st;
    if (!strcmp(type, "ByteLevel")) return ZO_OK; /* offsets only */
    if (!strcmp(type, "TemplateProcessing")) {
        if (t->n_prefix || t->n_suffix) return unsupported(t, field, "a second template");
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single"), *it;
        const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
        if (!cJSON_IsArray(single)) return zo_error(ZO_ERR_FORMAT, "%s: %s.single is not an array", t->path, field);
        int seen_a = 0;
        cJSON_ArrayForEach(it, single)
        {
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
            const cJSON *sq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
            if (sq) {
                if (seen_a) return unsupported(t, field, "a single template with two sequences");
                seen_a = 1;
                continue;
            }
            const char *name = jstr(sp, "id");
            if (!name) return zo_error(ZO_ERR_FORMAT, "%s: %s.single has an item that is neither SpecialToken nor Sequence", t->path, field);
            /* the special_tokens map gives its ids; else the token itself */
            const cJSON *ent = cJSON_GetObjectItemCaseSensitive(specials, name);
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(ent, "ids"), *idv;
            if (cJSON_IsArray(ids)) {
                cJSON_ArrayForEach(idv, ids)
                {
                    if (!cJSON_IsNumber(idv)) return zo_error(ZO_ERR_FORMAT, "%s: %s.special_tokens.%s.ids", t->path, field, name);
                    /* an id encode emits must be a token (decode refuses others) */
                    if (idv->valuedouble < 0 || idv->valuedouble >= t->n_ids || !t->id_kind[idv->valueint])
                        return zo_error(ZO_ERR_FORMAT, "%s: %s.special_tokens.%s.ids: %g is no token of the vocabulary",
                                        t->path, field, name, idv->valuedouble);
                    st = seen_a ? push_special(&t->suffix, &t->n_suffix, idv->valueint)
                                : push_special(&t->prefix, &t->n_prefix, idv->valueint);
                    if (st != ZO_OK) return st;
                }
            } else {
                int32_t id;
                if ((st = named_id(t, name, field, &id)) != ZO_OK) return st;
                st = seen_a ? push_special(&t->suffix, &t->n_suffix, id) : push_special(&t->prefix, &t->n_prefix, id);
                if (st != ZO_OK) return st;
            }
        }
        return ZO_OK;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(p, "cls"), *sep = cJSON_GetObjectItemCaseSensitive(p, "sep");
        const cJSON *ci = cJSON_GetArrayItem(cls, 1), *si = cJSON_GetArrayItem(sep, 1);
        if (!cJSON_IsNumber(ci) || !cJSON_IsNumber(si))
            return zo_error(ZO_ERR_FORMAT, "%s: %s needs cls and sep as [token, id]", t->path, field);
        if ((st = push_special(&t->prefix, &t->n_prefix, ci->valueint)) != ZO_OK) return st;
        return push_special(&t->suffix, &t->n_suffix, si->valueint);
    }
    return unsupported(t, field, type);
}

static zo_status set_id(model_tokenizer *t, int32_t id, const char *spelling, size_t n, int kind)
{
    if (id < 0 || id >= t->n_ids) return zo_error(ZO_ERR_INTERNAL, "tokenizer: id %d outside [0, %d)", id, t->n_ids);
    if (t->id_kind[id] & ID_ADDED) return ZO_OK; /* an added token keeps its content */
    zo_status st = arena_add(&t->strs, spelling, n, &t->id_off[id]);
    if (st != ZO_OK) return st;
    t->id_len[id] = (uint32_t)n;
    t->id_kind[id] = (uint8_t)(t->id_kind[id] | kind);
    return ZO_OK;
}

/* Index a set of added tokens by first byte, longest first. */
static int cmp_added(const void *a, const void *b, void *base)
{
    const added_token *t = base, *x = &t[*(const int *)a], *y = &t[*(const int *)b];
    unsigned char fx = (unsigned char)x->content[0], fy = (unsigned char)y->content[0];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return 0;
}

static zo_status build_added_set(model_tokenizer *t, added_set *s, int normalized)
{
    s->idx = malloc((size_t)(t->n_added + 1) * sizeof(int));
    if (!s->idx) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory");
    s->n = 0;
    for (int i = 0; i < t->n_added; i++) {
        int is_norm = t->added[i].normalized && t->n_norm > 0;
        if (is_norm == normalized && t->added[i].len) s->idx[s->n++] = i;
    }
    qsort_r(s->idx, (size_t)s->n, sizeof(int), cmp_added, t->added);
    int k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < s->n && (unsigned char)t->added[s->idx[k]].content[0] < b) k++;
        s->start[b] = k;
    }
    return ZO_OK;
}

static zo_status normalize_text(model_tok_ctx *c, const char *s, size_t n, const char **out,
                                size_t *out_n);

static zo_status load_added(model_tokenizer *t, const cJSON *list)
{
    const cJSON *it;
    if (!list || cJSON_IsNull(list)) return ZO_OK;
    if (!cJSON_IsArray(list)) return zo_error(ZO_ERR_FORMAT, "%s: added_tokens is not an array", t->path);
    int n = cJSON_GetArraySize(list);
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory");
    int i = 0;
    cJSON_ArrayForEach(it, list)
    {
        const char *content = jstr(it, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!content || !cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > INT32_MAX - 1)
            return zo_error(ZO_ERR_FORMAT, "%s: added_tokens[%d] needs a content and an id", t->path, i);
        if (jbool(it, "single_word", 0))
            return unsupported(t, "added_tokens[].single_word", content);
        added_token *a = &t->added[i];
        a->len = strlen(content);
        if (model_utf8_check(content, a->len) != a->len)
            return zo_error(ZO_ERR_FORMAT, "%s: added_tokens[%d] is not UTF-8", t->path, i);
        zo_status st = dupn(content, a->len, &a->content);
        if (st != ZO_OK) return st;
        a->id = id->valueint;
        a->special = jbool(it, "special", 0);
        a->lstrip = jbool(it, "lstrip", 0);
        a->rstrip = jbool(it, "rstrip", 0);
        a->normalized = jbool(it, "normalized", !a->special);
        t->n_added = ++i;
    }
    return ZO_OK;
}

/* The BPE model's options: what is not supported is refused by name. */
static zo_status load_model_options(model_tokenizer *t, const cJSON *m)
{
    const char *type = jstr(m, "type");
    if (type && strcmp(type, "BPE")) return unsupported(t, "model.type", type);
    if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(m, "vocab")) ||
        !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(m, "merges")))
        return zo_error(ZO_ERR_FORMAT, "%s: model needs a vocab object and a merges array (a BPE model)", t->path);
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (cJSON_IsNumber(drop) && drop->valuedouble > 0) return unsupported(t, "model.dropout", "(BPE dropout)");
    const char *pre = jstr(m, "continuing_subword_prefix"), *suf = jstr(m, "end_of_word_suffix");
    if ((pre && *pre) || (suf && *suf))
        return unsupported(t, "model.continuing_subword_prefix/end_of_word_suffix", "(non-empty)");
    t->byte_fallback = jbool(m, "byte_fallback", 0);
    t->fuse_unk = jbool(m, "fuse_unk", 0);
    t->ignore_merges = jbool(m, "ignore_merges", 0);
    return ZO_OK;
}

/* The id tables, sized by the largest id of the vocabulary and the added
 * tokens, with the added tokens in them. */
static zo_status load_ids(model_tokenizer *t, const cJSON *vocab)
{
    int max_id = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > INT32_MAX - 1)
            return zo_error(ZO_ERR_FORMAT, "%s: model.vocab[\"%s\"] is not a token id", t->path, it->string);
        if (it->valueint > max_id) max_id = it->valueint;
    }
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id > max_id) max_id = t->added[i].id;
    if (max_id < 0) return zo_error(ZO_ERR_FORMAT, "%s: the vocabulary is empty", t->path);
    /* the id tables are sized by the largest id: ids must be about as many
     * as the tokens (real vocabularies are dense), or a few bytes of JSON
     * would size gigabytes */
    int n_tokens = cJSON_GetArraySize(vocab) + t->n_added;
    if ((int64_t)max_id >= 2 * (int64_t)n_tokens + 1024) {
        const char *name = "added_tokens";
        cJSON_ArrayForEach(it, vocab) if (it->valueint == max_id) name = it->string;
        return zo_error(ZO_ERR_FORMAT, "%s: model.vocab[\"%s\"]: id %d is far past the %d tokens: the ids of a "
                        "vocabulary must number about as many as its tokens", t->path, name, max_id, n_tokens);
    }
    t->n_ids = max_id + 1;
    t->id_off = calloc((size_t)t->n_ids, sizeof(uint32_t));
    t->id_len = calloc((size_t)t->n_ids, sizeof(uint32_t));
    t->id_kind = calloc((size_t)t->n_ids, 1);
    if (!t->id_off || !t->id_len || !t->id_kind) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory");
    zo_status st;
    for (int i = 0; i < t->n_added; i++) {
        added_token *a = &t->added[i];
        if ((st = set_id(t, a->id, a->content, a->len, ID_ADDED | (a->special ? ID_SPECIAL : 0))) != ZO_OK)
            return st;
    }
    return ZO_OK;
}

/* The vocabulary: each token's id, and the map from the bytes BPE works on
 * (byte-level tokens decoded to raw bytes) to ids. */
static zo_status load_vocab(model_tokenizer *t, const cJSON *vocab, const int16_t c2b[324])
{
    zo_status st;
    if ((st = str_map_init(&t->vocab, (size_t)cJSON_GetArraySize(vocab))) != ZO_OK) return st;
    uint8_t *tmp = NULL;
    size_t tmpcap = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab)
    {
        const char *s = it->string;
        size_t n = strlen(s);
        if (model_utf8_check(s, n) != n) {
            free(tmp);
            return zo_error(ZO_ERR_FORMAT, "%s: model.vocab has a token that is not UTF-8 (id %d)", t->path, it->valueint);
        }
        if ((st = set_id(t, it->valueint, s, n, ID_MODEL)) != ZO_OK) break;
        const uint8_t *key = (const uint8_t *)s;
        size_t kn = n;
        if (t->byte_level) {
            if (n > tmpcap) {
                free(tmp);
                tmpcap = n * 2 + 16;
                if (!(tmp = malloc(tmpcap))) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory");
            }
            if (!byte_level_decode(c2b, s, n, tmp, &kn)) continue; /* unreachable by BPE */
            key = tmp;
        }
        uint64_t h = hash_bytes(key, kn);
        if (str_map_get(&t->vocab, t->strs.p, key, kn, h) >= 0) continue;
        uint32_t off;
        if ((st = arena_add(&t->strs, key, kn, &off)) != ZO_OK) break;
        str_map_put(&t->vocab, h, off, (uint32_t)kn, it->valueint);
    }
    free(tmp);
    return st;
}

/* The tokens BPE starts from: one per byte, the <0xXX> fallbacks, unk. */
static zo_status load_start_tokens(model_tokenizer *t, const cJSON *m)
{
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        char name[8];
        t->byte_id[b] = str_map_get(&t->vocab, t->strs.p, &c, 1, hash_bytes(&c, 1));
        snprintf(name, sizeof name, "<0x%02X>", b);
        size_t nl = strlen(name);
        t->fallback_id[b] = t->byte_level ? -1 : str_map_get(&t->vocab, t->strs.p, (const uint8_t *)name, nl,
                                                             hash_bytes((const uint8_t *)name, nl));
        if (b < 128) t->ascii_id[b] = t->byte_id[b];
    }
    const char *unk = jstr(m, "unk_token");
    t->unk = -1;
    return unk ? named_id(t, unk, "model.unk_token", &t->unk) : ZO_OK;
}

/* A merge's two parts, from "A B" or [A, B]; 0 when it is neither. */
static int merge_parts(const cJSON *it, const char **a, size_t *an, const char **b, size_t *bn)
{
    if (cJSON_IsString(it)) {
        const char *sp = strchr(it->valuestring, ' ');
        if (!sp) return 0;
        *a = it->valuestring;
        *an = (size_t)(sp - *a);
        *b = sp + 1;
    } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
        *a = cJSON_GetArrayItem(it, 0)->valuestring;
        *b = cJSON_GetArrayItem(it, 1)->valuestring;
        *an = strlen(*a);
    } else {
        return 0;
    }
    *bn = strlen(*b);
    return 1;
}

/* The ids of a merge's parts and of their concatenation cat (in model bytes). */
static void merge_ids(const model_tokenizer *t, const int16_t c2b[324], const char *a, size_t an, const char *b,
                      size_t bn, const char *cat, int32_t ids[3])
{
    const char *parts[3] = {a, b, cat};
    size_t lens[3] = {an, bn, an + bn};
    for (int k = 0; k < 3; k++) {
        uint8_t buf[256];
        const uint8_t *key = (const uint8_t *)parts[k];
        size_t kn = lens[k];
        if (t->byte_level) {
            if (kn > sizeof buf || !byte_level_decode(c2b, parts[k], lens[k], buf, &kn)) {
                ids[k] = -1;
                continue;
            }
            key = buf;
        }
        ids[k] = str_map_get(&t->vocab, t->strs.p, key, kn, hash_bytes(key, kn));
    }
}

/* merges: "a b" strings or [a, b] pairs, ranked by position */
static zo_status load_merges(model_tokenizer *t, const cJSON *merges, const int16_t c2b[324])
{
    int nm = cJSON_GetArraySize(merges);
    size_t slots = 16;
    while (slots < (size_t)nm * 2 + 2) slots *= 2;
    t->merges.s = malloc(slots * sizeof(pair_slot));
    if (!t->merges.s) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory for the merges");
    memset(t->merges.s, 0xff, slots * sizeof(pair_slot));
    t->merges.mask = slots - 1;
    char *cat = NULL;
    size_t catcap = 0;
    int rank = 0;
    zo_status st = ZO_OK;
    const cJSON *it;
    cJSON_ArrayForEach(it, merges)
    {
        const char *a, *b;
        size_t an, bn;
        if (!merge_parts(it, &a, &an, &b, &bn)) {
            st = cJSON_IsString(it)
                     ? zo_error(ZO_ERR_FORMAT, "%s: model.merges[%d] \"%s\" is not \"A B\"", t->path, rank, it->valuestring)
                     : zo_error(ZO_ERR_FORMAT, "%s: model.merges[%d] is neither \"A B\" nor [A, B]", t->path, rank);
            break;
        }
        /* the vocabulary is UTF-8 (checked above): a part that is not names no
         * token, and is named as such */
        if (model_utf8_check(a, an) != an || model_utf8_check(b, bn) != bn) {
            st = zo_error(ZO_ERR_FORMAT, "%s: model.merges[%d] is not UTF-8: its %s token has a cut-off "
                          "or invalid sequence", t->path, rank, model_utf8_check(a, an) != an ? "first" : "second");
            break;
        }
        if (an + bn + 1 > catcap) {
            free(cat);
            catcap = (an + bn) * 2 + 16;
            if (!(cat = malloc(catcap))) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory");
        }
        memcpy(cat, a, an);
        memcpy(cat + an, b, bn);
        int32_t ids[3];
        merge_ids(t, c2b, a, an, b, bn, cat, ids);
        if (ids[0] < 0 || ids[1] < 0 || ids[2] < 0) {
            st = zo_error(ZO_ERR_FORMAT, "%s: model.merges[%d] (\"%.*s\" \"%.*s\") names a token not in the vocabulary",
                          t->path, rank, (int)an, a, (int)bn, b);
            break;
        }
        uint64_t k = pair_key(ids[0], ids[1]);
        size_t i = mix64(k * 0x9E3779B97F4A7C15ull) & t->merges.mask;
        while (t->merges.s[i].key != UINT64_MAX && t->merges.s[i].key != k) i = (i + 1) & t->merges.mask;
        if (t->merges.s[i].key == UINT64_MAX) /* a repeated pair keeps its first rank */
            t->merges.s[i] = (pair_slot){.key = k, .rank = (uint32_t)rank, .id = ids[2]};
        rank++;
    }
    free(cat);
    return st;
}

/* A SentencePiece-style model (not byte-level) cuts words before the
 * U+2581 mark only when no merge joins a token onto a mark from its left. */
static void find_sp_cut(model_tokenizer *t, const cJSON *merges)
{
    const uint8_t *mark = (const uint8_t *)"\xe2\x96\x81";
    t->sp_cut = str_map_get(&t->vocab, t->strs.p, mark, 3, hash_bytes(mark, 3)) >= 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, merges)
    {
        const char *a, *b;
        size_t an, bn;
        merge_parts(it, &a, &an, &b, &bn); /* every merge was read by load_merges */
        if (bn >= 3 && !memcmp(b, mark, 3) && (an < 3 || memcmp(a + an - 3, mark, 3))) t->sp_cut = 0;
    }
}

static zo_status load_model(model_tokenizer *t, const cJSON *m)
{
    zo_status st;
    if ((st = load_model_options(t, m)) != ZO_OK) return st;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if ((st = load_ids(t, vocab)) != ZO_OK) return st;
    uint32_t b2c[256];
    int16_t c2b[324];
    byte_level_tables(b2c, c2b);
    if ((st = load_vocab(t, vocab, c2b)) != ZO_OK || (st = load_start_tokens(t, m)) != ZO_OK ||
        (st = load_merges(t, merges, c2b)) != ZO_OK)
        return st;
    if (!t->byte_level) find_sp_cut(t, merges);
    return ZO_OK;
}

static const char *const EOT_NAMES[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>"};

zo_status model_tokenizer_load(const char *path, model_tokenizer **out)
{
    *out = NULL;
    char *text = NULL;
    size_t len;
    if (access(path, F_OK) != 0 && errno == ENOENT) return zo_error(ZO_ERR_NOT_FOUND, "%s: no such file", path);
    zo_status st = zo_file_read_all(path, TOK_FILE_LIMIT, "a tokenizer.json", &text, &len);
    if (st != ZO_OK) return st;
    cJSON *root;
    st = zo_json_parse(text, len, path, &root); /* keys given twice refused too */
    free(text);
    if (st != ZO_OK) return st;
    model_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) {
        free(t);
        cJSON_Delete(root);
        return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->eot = -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) {
        st = zo_error(ZO_ERR_FORMAT, "%s: no \"model\" object (is this a tokenizer.json?)", path);
        goto out_free;
    }
    /* "truncation" and "padding" are not applied: the trainer cuts and pads sequences */
    /* the pre-tokenizer first: it says whether the vocabulary is byte-level */
    const cJSON *decoder = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    t->has_decoder = decoder && !cJSON_IsNull(decoder);
    if ((st = load_component(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "pre_tokenizer",
                             "pretokenizers", load_pre_tokenizer)) != ZO_OK ||
        (st = load_component(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizer", "normalizers",
                             load_normalizer)) != ZO_OK ||
        (st = load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"))) != ZO_OK ||
        (st = load_model(t, model)) != ZO_OK ||
        (st = load_component(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), "post_processor",
                             "processors", load_post)) != ZO_OK ||
        (st = load_component(t, decoder, "decoder", "decoders", load_decoder)) != ZO_OK)
        goto out_free;
    for (int b = 0; t->byte_level && b < 256; b++)
        if (t->byte_id[b] < 0 && t->unk < 0) {
            st = zo_error(ZO_ERR_FORMAT, "%s: the byte-level vocabulary has no token for byte 0x%02X and no unk_token",
                          path, b);
            goto out_free;
        }
    if ((st = build_added_set(t, &t->raw_set, 0)) != ZO_OK || (st = build_added_set(t, &t->norm_set, 1)) != ZO_OK)
        goto out_free;
    /* normalized added tokens are matched in normalized text: normalize their contents */
    if (t->norm_set.n) {
        model_tok_ctx *c;
        if ((st = model_tok_ctx_new(t, &c)) != ZO_OK) goto out_free;
        for (int i = 0; i < t->norm_set.n && st == ZO_OK; i++) {
            added_token *a = &t->added[t->norm_set.idx[i]];
            const char *nn;
            size_t nl;
            char *copy;
            if ((st = normalize_text(c, a->content, a->len, &nn, &nl)) != ZO_OK) break;
            if ((st = dupn(nn, nl, &copy)) != ZO_OK) break;
            free(a->content);
            a->content = copy;
            a->len = nl;
        }
        model_tok_ctx_free(c);
        if (st != ZO_OK) goto out_free;
        free(t->norm_set.idx);
        if ((st = build_added_set(t, &t->norm_set, 1)) != ZO_OK) goto out_free;
    }
    for (size_t i = 0; i < sizeof EOT_NAMES / sizeof EOT_NAMES[0] && t->eot < 0; i++)
        for (int k = 0; k < t->n_added; k++)
            if (t->added[k].special && !strcmp(t->added[k].content, EOT_NAMES[i])) t->eot = t->added[k].id;
    cJSON_Delete(root);
    *out = t;
    return ZO_OK;

out_free:
    cJSON_Delete(root);
    model_tokenizer_free(t);
    return st;
}

void model_tokenizer_free(model_tokenizer *t)
{
    if (!t) return;
    free(t->path);
    free(t->strs.p);
    free(t->id_off);
    free(t->id_len);
    free(t->id_kind);
    str_map_free(&t->vocab);
    free(t->merges.s);
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
    }
    free(t->norm);
    for (int i = 0; i < t->n_dec; i++) {
        free(t->dec[i].a);
        free(t->dec[i].b);
    }
    free(t->dec);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->raw_set.idx);
    free(t->norm_set.idx);
    free(t->prefix);
    free(t->suffix);
    free(t);
}

int model_tokenizer_vocab(const model_tokenizer *t) { return t->n_ids; }

const char *model_tokenizer_kind(const model_tokenizer *t)
{
    return t->byte_level ? "byte-level BPE" : "SentencePiece BPE";
}

int32_t model_tokenizer_eot(const model_tokenizer *t) { return t->eot; }

int model_tokenizer_is_special(const model_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && (t->id_kind[id] & ID_SPECIAL);
}

int32_t model_tokenizer_token_id(const model_tokenizer *t, const char *token)
{
    size_t n = strlen(token);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, token, n)) return t->added[i].id;
    for (int32_t id = 0; id < t->n_ids; id++) /* rare: post-processor names */
        if ((t->id_kind[id] & ID_MODEL) && t->id_len[id] == n && !memcmp(t->strs.p + t->id_off[id], token, n))
            return id;
    return -1;
}

/* ---- per-thread state ------------------------------------------------------------------ */

zo_status model_tok_ctx_new(const model_tokenizer *t, model_tok_ctx **out)
{
    model_tok_ctx *c = calloc(1, sizeof *c);
    if (!c) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory");
    c->t = t;
    c->cache = calloc(CACHE_SLOTS, sizeof(cache_slot));
    c->carena = malloc(CACHE_ARENA);
    if (!c->cache || !c->carena) {
        model_tok_ctx_free(c);
        return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory for the word cache");
    }
    *out = c;
    return ZO_OK;
}

void model_tok_ctx_free(model_tok_ctx *c)
{
    if (!c) return;
    free(c->sid);
    free(c->snext);
    free(c->sprev);
    free(c->heap);
    for (int i = 0; i < 3; i++) free(c->buf[i]);
    free(c->cache);
    free(c->carena);
    free(c);
}

static zo_status grow_buf(model_tok_ctx *c, int k, size_t need)
{
    if (need <= c->bufcap[k]) return ZO_OK;
    size_t cap = c->bufcap[k] ? c->bufcap[k] : 256;
    while (cap < need) cap *= 2;
    char *np = realloc(c->buf[k], cap);
    if (!np) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory (%zu bytes of scratch)", cap);
    c->buf[k] = np;
    c->bufcap[k] = cap;
    return ZO_OK;
}

static zo_status grow_symbols(model_tok_ctx *c, size_t n)
{
    if (n <= c->scap) return ZO_OK;
    size_t cap = c->scap ? c->scap : 64;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(c->sid, cap * sizeof(int32_t));
    if (a) c->sid = a;
    int32_t *b = realloc(c->snext, cap * sizeof(int32_t));
    if (b) c->snext = b;
    int32_t *p = realloc(c->sprev, cap * sizeof(int32_t));
    if (p) c->sprev = p;
    uint64_t *h = realloc(c->heap, cap * 2 * sizeof(uint64_t));
    if (h) c->heap = h;
    if (!a || !b || !p || !h) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory for a word of %zu symbols", n);
    c->scap = cap;
    c->hcap = cap * 2;
    return ZO_OK;
}

/* ---- normalization ------------------------------------------------------------------------ */

/* Apply the normalizer to s[0..n); *out points at s or into scratch 0/1. */
static zo_status normalize_text(model_tok_ctx *c, const char *s, size_t n, const char **out,
                                size_t *out_n)
{
    const model_tokenizer *t = c->t;
    const char *cur = s;
    size_t len = n;
    int k = 0; /* the scratch buffer to write next */
    zo_status st;
    for (int i = 0; i < t->n_norm; i++) {
        const norm_step *ns = &t->norm[i];
        switch (ns->kind) {
        case NORM_NFC: {
            if (model_uc_nfc_quick(cur, len)) break;
            char *nfc;
            size_t nl;
            if ((st = model_uc_nfc(cur, len, &nfc, &nl)) != ZO_OK) return st;
            if ((st = grow_buf(c, k, nl + 1)) != ZO_OK) {
                free(nfc);
                return st;
            }
            memcpy(c->buf[k], nfc, nl);
            free(nfc);
            cur = c->buf[k];
            len = nl;
            k ^= 1;
            break;
        }
        case NORM_PREPEND:
            if (!len) break;
            if ((st = grow_buf(c, k, len + ns->an + 1)) != ZO_OK) return st;
            memcpy(c->buf[k], ns->a, ns->an);
            memcpy(c->buf[k] + ns->an, cur, len);
            cur = c->buf[k];
            len += ns->an;
            k ^= 1;
            break;
        case NORM_REPLACE: {
            size_t count = 0;
            for (const char *p = cur; (p = memmem(p, len - (size_t)(p - cur), ns->a, ns->an)); p += ns->an) count++;
            if (!count) break;
            size_t nl = len + count * ns->bn - count * ns->an;
            if ((st = grow_buf(c, k, nl + 1)) != ZO_OK) return st;
            char *o = c->buf[k];
            const char *p = cur, *end = cur + len;
            for (const char *q; (q = memmem(p, (size_t)(end - p), ns->a, ns->an)); p = q + ns->an) {
                memcpy(o, p, (size_t)(q - p));
                o += q - p;
                memcpy(o, ns->b, ns->bn);
                o += ns->bn;
            }
            memcpy(o, p, (size_t)(end - p));
            cur = c->buf[k];
            len = nl;
            k ^= 1;
            break;
        }
        }
    }
    *out = cur;
    *out_n = len;
    return ZO_OK;
}

/* ---- BPE -------------------------------------------------------------------------------------- */

static inline void heap_push(model_tok_ctx *c, uint64_t v)
{
    uint64_t *h = c->heap;
    size_t i = c->hn++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static inline uint64_t heap_pop(model_tok_ctx *c)
{
    uint64_t *h = c->heap, top = h[0], v = h[--c->hn];
    size_t n = c->hn, i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n) break;
        if (l + 1 < n && h[l + 1] < h[l]) l++;
        if (v <= h[l]) break;
        h[i] = h[l];
        i = l;
    }
    if (n) h[i] = v;
    return top;
}

static inline void push_pair(model_tok_ctx *c, int32_t pos, int32_t a, int32_t b)
{
    const pair_slot *m = pair_get(&c->t->merges, a, b);
    if (m) {
        if (c->hn == c->hcap) return; /* cannot happen: at most 2 pushes per merge + n */
        heap_push(c, (uint64_t)m->rank << 32 | (uint32_t)pos);
    }
}

/* Merge symbols sid[0..n) (a linked list) by rank, lowest first, leftmost
 * among equals; the survivors are those with sid >= 0. */
static void bpe_merge(model_tok_ctx *c, int32_t n)
{
    int32_t *id = c->sid, *nx = c->snext, *pv = c->sprev;
    for (int32_t i = 0; i < n; i++) {
        nx[i] = i + 1 < n ? i + 1 : -1;
        pv[i] = i - 1;
    }
    c->hn = 0;
    for (int32_t i = 0; i + 1 < n; i++) push_pair(c, i, id[i], id[i + 1]);
    while (c->hn) {
        uint64_t top = heap_pop(c);
        int32_t pos = (int32_t)(uint32_t)top, r;
        uint32_t rank = (uint32_t)(top >> 32);
        if (id[pos] < 0 || (r = nx[pos]) < 0) continue;
        const pair_slot *m = pair_get(&c->t->merges, id[pos], id[r]);
        if (!m || m->rank != rank) continue; /* stale: a neighbour has changed */
        id[pos] = m->id;
        id[r] = -1;
        nx[pos] = nx[r];
        if (nx[r] >= 0) pv[nx[r]] = pos;
        if (pv[pos] >= 0) push_pair(c, pv[pos], id[pv[pos]], id[pos]);
        if (nx[pos] >= 0) push_pair(c, pos, id[pos], id[nx[pos]]);
    }
}

static void cache_clear(model_tok_ctx *c)
{
    memset(c->cache, 0, CACHE_SLOTS * sizeof(cache_slot));
    c->cache_n = 0;
    c->carena_len = 0;
}

/* BPE of one word (pre-token) into out. */
static zo_status bpe_word(model_tok_ctx *c, const uint8_t *w, size_t n, model_ids *out)
{
    const model_tokenizer *t = c->t;
    zo_status st;
    if (!n) return ZO_OK;
    uint64_t h = 0;
    cache_slot *slot = NULL;
    if (t->ignore_merges || n <= CACHE_WORD_MAX) h = hash_bytes(w, n);
    if (t->ignore_merges) {
        int32_t id = str_map_get(&t->vocab, t->strs.p, w, n, h);
        if (id >= 0) return model_ids_push(out, id);
    }
    if (n <= CACHE_WORD_MAX) {
        for (size_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
            cache_slot *s = &c->cache[i];
            if (!s->len) {
                slot = s;
                break;
            }
            if (s->h == h && s->len == n && !memcmp(c->carena + s->off, w, n)) {
                if ((st = model_ids_reserve(out, s->n_ids)) != ZO_OK) return st;
                memcpy(out->v + out->n, c->carena + ((s->off + n + 3) & ~(size_t)3), s->n_ids * sizeof(int32_t));
                out->n += s->n_ids;
                return ZO_OK;
            }
        }
    }
    /* the initial symbols */
    /* at most one symbol per byte (a byte-fallback character: one per byte) */
    if ((st = grow_symbols(c, n + 1)) != ZO_OK) return st;
    int32_t *id = c->sid, m = 0;
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++) {
            int32_t b = t->byte_id[w[i]];
            if (b >= 0) id[m++] = b;
            else if (t->unk >= 0 && !(t->fuse_unk && m && id[m - 1] == t->unk)) id[m++] = t->unk;
        }
    } else {
        for (size_t i = 0; i < n;) {
            int32_t v;
            size_t cl;
            if (w[i] < 0x80) {
                v = t->ascii_id[w[i]];
                cl = 1;
            } else {
                uint32_t cp;
                cl = (size_t)model_utf8_next(w + i, &cp);
                v = str_map_get(&t->vocab, t->strs.p, w + i, cl, hash_bytes(w + i, cl));
            }
            if (v >= 0) {
                id[m++] = v;
            } else {
                size_t k = 0;
                if (t->byte_fallback)
                    while (k < cl && t->fallback_id[w[i + k]] >= 0) k++;
                if (t->byte_fallback && k == cl) {
                    for (k = 0; k < cl; k++) id[m++] = t->fallback_id[w[i + k]];
                } else if (t->unk >= 0 && !(t->fuse_unk && m && id[m - 1] == t->unk)) {
                    id[m++] = t->unk;
                }
            }
            i += cl;
        }
    }
    if (m > 1) bpe_merge(c, m);
    size_t first = out->n;
    if ((st = model_ids_reserve(out, (size_t)m)) != ZO_OK) return st;
    for (int32_t i = 0; i < m; i++)
        if (id[i] >= 0) out->v[out->n++] = id[i];
    if (slot) {
        size_t k = out->n - first, need = ((n + 3) & ~(size_t)3) + k * sizeof(int32_t);
        if (c->cache_n * 2 >= CACHE_SLOTS || c->carena_len + need > CACHE_ARENA || k > UINT16_MAX) {
            cache_clear(c);
            return ZO_OK; /* next time */
        }
        size_t off = c->carena_len;
        memcpy(c->carena + off, w, n);
        memcpy(c->carena + ((off + n + 3) & ~(size_t)3), out->v + first, k * sizeof(int32_t));
        c->carena_len = (off + need + 3) & ~(size_t)3;
        *slot = (cache_slot){.h = h, .off = (uint32_t)off, .len = (uint16_t)n, .n_ids = (uint16_t)k};
        c->cache_n++;
    }
    return ZO_OK;
}

/* ---- pre-tokenization ---------------------------------------------------------------------- */

static const uint8_t ascii_class[128] = {
    /* 0x00-0x1F: \t \n \v \f \r are spaces */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 3, 3, 3, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* space, punctuation */
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, /* digits */
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0,
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0,
};

/* The class of the code point at s[i] and its length. */
static inline int cls_at(const uint8_t *s, size_t i, uint32_t *cp, int *len)
{
    if (s[i] < 0x80) {
        *cp = s[i];
        *len = 1;
        return ascii_class[s[i]];
    }
    *len = model_utf8_next(s + i, cp);
    return (int)model_uc_class_of(*cp);
}

/* The end of the run of class k code points from i. */
static inline size_t run_of(const uint8_t *s, size_t i, size_t n, int k)
{
    uint32_t cp;
    int l;
    while (i < n && cls_at(s, i, &cp, &l) == k) i += (size_t)l;
    return i;
}

static inline int lower(uint8_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* 's 't 're 've 'm 'll 'd after the apostrophe at i: the match length, or 0. */
static inline size_t contraction(const uint8_t *s, size_t i, size_t n, int fold)
{
    if (i + 1 >= n) return 0;
    int a = fold ? lower(s[i + 1]) : s[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= n) return 0;
    int b = fold ? lower(s[i + 2]) : s[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* A run of whitespace from i: its end, where its last code point starts,
 * how many code points it has, and the position after its last \r or \n
 * (0 when none). */
static inline size_t space_run(const uint8_t *s, size_t i, size_t n, size_t *last, size_t *count,
                               size_t *after_nl)
{
    uint32_t cp;
    int l;
    *count = 0;
    *after_nl = 0;
    *last = i;
    while (i < n && cls_at(s, i, &cp, &l) == MODEL_UC_SPACE) {
        *last = i;
        (*count)++;
        if (cp == '\r' || cp == '\n') *after_nl = i + 1;
        i += (size_t)l;
    }
    return i;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * The end of the match at i. */
static size_t match_gpt2(const uint8_t *s, size_t i, size_t n)
{
    uint32_t c0, c1;
    int l0, l1;
    int k0 = cls_at(s, i, &c0, &l0);
    if (c0 == '\'') {
        size_t m = contraction(s, i, n, 0);
        if (m) return i + m;
    }
    if (c0 == ' ' && i + 1 < n) {
        int k1 = cls_at(s, i + 1, &c1, &l1);
        if (k1 != MODEL_UC_SPACE) return run_of(s, i + 1, n, k1);
    }
    if (k0 != MODEL_UC_SPACE) return run_of(s, i, n, k0);
    size_t last, count, nl, j = space_run(s, i, n, &last, &count, &nl);
    if (j == n || count == 1) return j;
    return last; /* \s+(?!\S): leave the last space to the next word */
}

/* LLaMA-3 (digits 3) and Qwen2 (digits 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t match_llama3(const uint8_t *s, size_t i, size_t n, int digits)
{
    uint32_t c0, c1;
    int l0, l1;
    int k0 = cls_at(s, i, &c0, &l0);
    if (c0 == '\'') {
        size_t m = contraction(s, i, n, 1);
        if (m) return i + m;
    }
    if (k0 == MODEL_UC_LETTER) return run_of(s, i, n, MODEL_UC_LETTER);
    int k1 = i + (size_t)l0 < n ? cls_at(s, i + (size_t)l0, &c1, &l1) : -1;
    if (c0 != '\r' && c0 != '\n' && k0 != MODEL_UC_NUMBER && k1 == MODEL_UC_LETTER)
        return run_of(s, i + (size_t)l0, n, MODEL_UC_LETTER);
    if (k0 == MODEL_UC_NUMBER) {
        size_t j = i + (size_t)l0;
        for (int d = 1; d < digits && j < n && cls_at(s, j, &c1, &l1) == MODEL_UC_NUMBER; d++) j += (size_t)l1;
        return j;
    }
    size_t j = 0;
    if (c0 == ' ' && k1 == MODEL_UC_OTHER) j = run_of(s, i + 1, n, MODEL_UC_OTHER);
    else if (k0 == MODEL_UC_OTHER) j = run_of(s, i, n, MODEL_UC_OTHER);
    if (j) {
        while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    size_t last, count, nl;
    j = space_run(s, i, n, &last, &count, &nl);
    if (nl) return nl; /* \s*[\r\n]+ */
    if (j == n || count == 1) return j;
    return last;
}

/* Pre-tokenize one piece of text and BPE each word. `first`: the piece
 * starts the input (Metaspace's prepend_scheme "first"). */
static zo_status encode_words(model_tok_ctx *c, const char *text, size_t n, int first, model_ids *out)
{
    const model_tokenizer *t = c->t;
    const uint8_t *s = (const uint8_t *)text;
    zo_status st;
    if (t->metaspace) {
        /* spaces become the replacement; prepend it; split before each one */
        const char *rep = t->meta_rep;
        size_t rl = (size_t)t->meta_rep_len, spaces = 0;
        for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
        if ((st = grow_buf(c, 2, n + (spaces + 1) * rl + 1)) != ZO_OK) return st;
        char *o = c->buf[2];
        size_t k = 0;
        if (!n) return ZO_OK;
        int starts = s[0] == ' ' || (n >= rl && !memcmp(s, rep, rl));
        if (!starts && (t->meta_prepend == PREPEND_ALWAYS || (t->meta_prepend == PREPEND_FIRST && first))) {
            memcpy(o, rep, rl);
            k = rl;
        }
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') {
                memcpy(o + k, rep, rl);
                k += rl;
            } else {
                o[k++] = (char)s[i];
            }
        }
        if (!t->meta_split) return bpe_word(c, (const uint8_t *)o, k, out);
        size_t a = 0;
        for (size_t i = 1; i + rl <= k; i++)
            if (!memcmp(o + i, rep, rl)) {
                if ((st = bpe_word(c, (const uint8_t *)o + a, i - a, out)) != ZO_OK) return st;
                a = i;
                i += rl - 1;
            }
        return bpe_word(c, (const uint8_t *)o + a, k - a, out);
    }
    if (t->add_prefix_space && n && s[0] != ' ') {
        if ((st = grow_buf(c, 2, n + 2)) != ZO_OK) return st;
        c->buf[2][0] = ' ';
        memcpy(c->buf[2] + 1, s, n);
        s = (const uint8_t *)c->buf[2];
        n++;
    }
    switch (t->split) {
    case SPLIT_GPT2:
        for (size_t i = 0; i < n;) {
            size_t e = match_gpt2(s, i, n);
            if ((st = bpe_word(c, s + i, e - i, out)) != ZO_OK) return st;
            i = e;
        }
        return ZO_OK;
    case SPLIT_LLAMA3:
        for (size_t i = 0; i < n;) {
            size_t e = match_llama3(s, i, n, t->digits_max);
            if ((st = bpe_word(c, s + i, e - i, out)) != ZO_OK) return st;
            i = e;
        }
        return ZO_OK;
    case SPLIT_NONE:
        break;
    }
    if (t->sp_cut) {
        size_t a = 0;
        for (const uint8_t *p = s + 1; (p = memmem(p, n - (size_t)(p - s), "\xe2\x96\x81", 3)); p += 3) {
            size_t i = (size_t)(p - s);
            if (i >= 3 && !memcmp(s + i - 3, "\xe2\x96\x81", 3)) continue; /* a run of marks stays whole */
            if ((st = bpe_word(c, s + a, i - a, out)) != ZO_OK) return st;
            a = i;
        }
        return bpe_word(c, s + a, n - a, out);
    }
    return bpe_word(c, s, n, out);
}

/* ---- added tokens ------------------------------------------------------------------------------ */

/* The leftmost, longest added token of `set` in s[from..n): its start and
 * token index, or -1. */
static int find_added(const model_tokenizer *t, const added_set *set, const char *s, size_t from,
                      size_t n, size_t *at)
{
    if (!set->n) return -1;
    for (size_t i = from; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        for (int k = set->start[b]; k < set->start[b + 1]; k++) {
            const added_token *a = &t->added[set->idx[k]];
            if (a->len <= n - i && !memcmp(s + i, a->content, a->len)) {
                *at = i;
                return set->idx[k];
            }
        }
    }
    return -1;
}

static int is_space_at(const char *s, size_t i, int *len)
{
    uint32_t cp;
    return cls_at((const uint8_t *)s, i, &cp, len) == MODEL_UC_SPACE;
}

/* Whitespace before `end` back to `floor` (an added token's lstrip). */
static size_t strip_left(const char *s, size_t floor, size_t end)
{
    while (end > floor) {
        size_t b = end - 1;
        while (b > floor && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
        int l;
        if (!is_space_at(s, b, &l)) break;
        end = b;
    }
    return end;
}

static size_t strip_right(const char *s, size_t i, size_t n)
{
    int l;
    while (i < n && is_space_at(s, i, &l)) i += (size_t)l;
    return i;
}

/* Normalized text: split out the normalized added tokens, encode the rest. */
static zo_status encode_normalized(model_tok_ctx *c, const char *s, size_t n, int first, model_ids *out)
{
    const model_tokenizer *t = c->t;
    zo_status st;
    size_t pos = 0, at;
    int k;
    while ((k = find_added(t, &t->norm_set, s, pos, n, &at)) >= 0) {
        const added_token *a = &t->added[k];
        size_t end = at + a->len, left = a->lstrip ? strip_left(s, pos, at) : at;
        if (left > pos && (st = encode_words(c, s + pos, left - pos, first && pos == 0, out)) != ZO_OK) return st;
        if ((st = model_ids_push(out, a->id)) != ZO_OK) return st;
        pos = a->rstrip ? strip_right(s, end, n) : end;
    }
    if (pos < n) return encode_words(c, s + pos, n - pos, first && pos == 0, out);
    return ZO_OK;
}

/* A piece of the input between raw added tokens. */
static zo_status encode_section(model_tok_ctx *c, const char *s, size_t n, int first, model_ids *out)
{
    const char *ns;
    size_t nn;
    zo_status st = normalize_text(c, s, n, &ns, &nn);
    if (st != ZO_OK) return st;
    if (!c->t->norm_set.n) return encode_words(c, ns, nn, first, out);
    /* the normalized text may live in a scratch buffer encode_words reuses */
    char *copy;
    if ((st = dupn(ns, nn, &copy)) != ZO_OK) return st;
    st = encode_normalized(c, copy, nn, first, out);
    free(copy);
    return st;
}

zo_status model_tokenizer_encode(model_tok_ctx *c, const char *text, size_t n, int flags,
                                 model_ids *out)
{
    const model_tokenizer *t = c->t;
    size_t bad = model_utf8_check(text, n);
    if (bad != n) return zo_error(ZO_ERR_INVALID, "invalid UTF-8 at byte offset %zu", bad);
    zo_status st;
    if (flags & MODEL_TOK_ADD_SPECIAL)
        for (int i = 0; i < t->n_prefix; i++)
            if ((st = model_ids_push(out, t->prefix[i])) != ZO_OK) return st;
    size_t pos = 0, at;
    int k;
    while ((k = find_added(t, &t->raw_set, text, pos, n, &at)) >= 0) {
        const added_token *a = &t->added[k];
        size_t end = at + a->len, left = a->lstrip ? strip_left(text, pos, at) : at;
        if (left > pos && (st = encode_section(c, text + pos, left - pos, pos == 0, out)) != ZO_OK) return st;
        if ((st = model_ids_push(out, a->id)) != ZO_OK) return st;
        pos = a->rstrip ? strip_right(text, end, n) : end;
    }
    if (pos < n && (st = encode_section(c, text + pos, n - pos, pos == 0, out)) != ZO_OK) return st;
    if (flags & MODEL_TOK_ADD_SPECIAL)
        for (int i = 0; i < t->n_suffix; i++)
            if ((st = model_ids_push(out, t->suffix[i])) != ZO_OK) return st;
    return ZO_OK;
}

/* ---- decoding --------------------------------------------------------------------------------- */

typedef struct dstr {
    char *p;
    size_t n, cap;
    int added; /* an added token: kept as written */
} dstr;

static zo_status dstr_set(dstr *d, const char *s, size_t n)
{
    if (n + 1 > d->cap) {
        size_t cap = n + 16;
        char *np = realloc(d->p, cap);
        if (!np) return zo_error(ZO_ERR_NOMEM, "tokenizer decode: out of memory");
        d->p = np;
        d->cap = cap;
    }
    memmove(d->p, s, n);
    d->p[n] = 0;
    d->n = n;
    return ZO_OK;
}

/* Replace every a with b in d. */
static zo_status dstr_replace(dstr *d, const char *a, size_t an, const char *b, size_t bn)
{
    size_t count = 0;
    for (const char *p = d->p; (p = memmem(p, d->n - (size_t)(p - d->p), a, an)); p += an) count++;
    if (!count) return ZO_OK;
    size_t nl = d->n + count * bn - count * an;
    char *o = malloc(nl + 1), *w = o;
    if (!o) return zo_error(ZO_ERR_NOMEM, "tokenizer decode: out of memory");
    const char *p = d->p, *end = d->p + d->n;
    for (const char *q; (q = memmem(p, (size_t)(end - p), a, an)); p = q + an) {
        memcpy(w, p, (size_t)(q - p));
        w += q - p;
        memcpy(w, b, bn);
        w += bn;
    }
    memcpy(w, p, (size_t)(end - p));
    o[nl] = 0;
    free(d->p);
    d->p = o;
    d->n = nl;
    d->cap = nl + 1;
    return ZO_OK;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

zo_status model_tokenizer_decode(const model_tokenizer *t, const int32_t *ids, size_t n, int flags,
                                 char **out, size_t *out_n)
{
    dstr *tok = calloc(n + 1, sizeof *tok);
    if (!tok) return zo_error(ZO_ERR_NOMEM, "tokenizer decode: out of memory");
    size_t m = 0;
    zo_status st = ZO_OK;
    uint32_t b2c[256];
    int16_t c2b[324];
    byte_level_tables(b2c, c2b);
    for (size_t i = 0; i < n && st == ZO_OK; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->id_kind[id]) {
            st = zo_error(ZO_ERR_INVALID, "tokenizer decode: id %d (at %zu) is no token of %s", id, i, t->path);
            break;
        }
        if ((flags & MODEL_TOK_SKIP_SPECIAL) && (t->id_kind[id] & ID_SPECIAL)) continue;
        tok[m].added = (t->id_kind[id] & ID_ADDED) != 0;
        st = dstr_set(&tok[m++], (const char *)t->strs.p + t->id_off[id], t->id_len[id]);
    }
    for (int d = 0; d < t->n_dec && st == ZO_OK; d++) {
        const dec_step *ds = &t->dec[d];
        switch (ds->kind) {
        case DEC_BYTELEVEL:
            for (size_t i = 0; i < m; i++) {
                size_t k;
                if (!tok[i].added && byte_level_decode(c2b, tok[i].p, tok[i].n, (uint8_t *)tok[i].p, &k)) tok[i].n = k;
            }
            break;
        case DEC_REPLACE:
            for (size_t i = 0; i < m && st == ZO_OK; i++)
                if (!tok[i].added) st = dstr_replace(&tok[i], ds->a, ds->an, ds->b, ds->bn);
            break;
        case DEC_BYTEFALLBACK:
            for (size_t i = 0; i < m; i++)
                if (!tok[i].added && tok[i].n == 6 && !memcmp(tok[i].p, "<0x", 3) && tok[i].p[5] == '>' &&
                    hexval(tok[i].p[3]) >= 0 && hexval(tok[i].p[4]) >= 0) {
                    tok[i].p[0] = (char)(hexval(tok[i].p[3]) * 16 + hexval(tok[i].p[4]));
                    tok[i].n = 1;
                }
            break;
        case DEC_FUSE: {
            if (m < 2) break;
            size_t total = 0;
            for (size_t i = 0; i < m; i++) total += tok[i].n;
            char *all = malloc(total + 1);
            if (!all) {
                st = zo_error(ZO_ERR_NOMEM, "tokenizer decode: out of memory");
                break;
            }
            size_t k = 0;
            for (size_t i = 0; i < m; i++) {
                memcpy(all + k, tok[i].p, tok[i].n);
                k += tok[i].n;
                if (i) {
                    free(tok[i].p);
                    tok[i] = (dstr){0};
                }
            }
            all[k] = 0;
            free(tok[0].p);
            tok[0] = (dstr){.p = all, .n = k, .cap = k + 1};
            m = 1;
            break;
        }
        case DEC_STRIP:
            for (size_t i = 0; i < m; i++) {
                size_t a = 0, e = tok[i].n;
                for (int k = 0; k < ds->start && e - a >= ds->an && !memcmp(tok[i].p + a, ds->a, ds->an); k++) a += ds->an;
                for (int k = 0; k < ds->stop && e - a >= ds->an && !memcmp(tok[i].p + e - ds->an, ds->a, ds->an); k++)
                    e -= ds->an;
                memmove(tok[i].p, tok[i].p + a, e - a);
                tok[i].n = e - a;
            }
            break;
        case DEC_METASPACE:
            for (size_t i = 0; i < m && st == ZO_OK; i++)
                if (!tok[i].added) st = dstr_replace(&tok[i], ds->a, ds->an, i == 0 && ds->prepend ? "" : " ",
                                                     i == 0 && ds->prepend ? 0 : 1);
            break;
        }
    }
    char *o = NULL;
    size_t total = 0;
    if (st == ZO_OK) {
        for (size_t i = 0; i < m; i++) total += tok[i].n + (t->has_decoder ? 0 : 1);
        o = malloc(total + 1);
        if (!o) st = zo_error(ZO_ERR_NOMEM, "tokenizer decode: out of memory");
    }
    if (st == ZO_OK) {
        size_t k = 0;
        for (size_t i = 0; i < m; i++) {
            if (!t->has_decoder && i) o[k++] = ' '; /* no decoder: tokens joined by spaces */
            memcpy(o + k, tok[i].p, tok[i].n);
            k += tok[i].n;
        }
        o[k] = 0;
        *out = o;
        *out_n = k;
    }
    for (size_t i = 0; i < m; i++) free(tok[i].p);
    for (size_t i = m; i <= n; i++) free(tok[i].p);
    free(tok);
    return st;
}

/* ---- ids and many documents ------------------------------------------------------------------------ */

zo_status model_ids_reserve(model_ids *a, size_t extra)
{
    if (a->n + extra <= a->cap) return ZO_OK;
    size_t cap = a->cap ? a->cap : 256;
    while (cap < a->n + extra) cap *= 2;
    int32_t *np = realloc(a->v, cap * sizeof(int32_t));
    if (!np) return zo_error(ZO_ERR_NOMEM, "tokenizer: out of memory for %zu token ids", cap);
    a->v = np;
    a->cap = cap;
    return ZO_OK;
}

void model_ids_free(model_ids *a)
{
    free(a->v);
    memset(a, 0, sizeof *a);
}

zo_status model_tokenizer_encode_many(const model_tokenizer *t, const char *const *docs,
                                      const size_t *lens, size_t n_docs, int flags,
                                      int32_t append_id, int n_threads, model_ids *docs_out)
{
    zo_status first_st = ZO_OK;
    size_t first_doc = SIZE_MAX;
    char first_msg[512] = "";
    int team = n_threads > 0 ? n_threads : omp_get_max_threads();
    if ((size_t)team > n_docs) team = n_docs ? (int)n_docs : 1;
#pragma omp parallel num_threads(team)
    {
        model_tok_ctx *c = NULL;
        zo_status ctx_st = model_tok_ctx_new(t, &c);
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < n_docs; i++) {
            zo_status st = ctx_st;
            if (st == ZO_OK) st = model_tokenizer_encode(c, docs[i], lens[i], flags, &docs_out[i]);
            if (st == ZO_OK && append_id >= 0) st = model_ids_push(&docs_out[i], append_id);
            if (st != ZO_OK) {
#pragma omp critical(tok_err)
                if (i < first_doc) {
                    first_doc = i;
                    first_st = st;
                    snprintf(first_msg, sizeof first_msg, "%s", zo_last_error());
                }
            }
        }
        model_tok_ctx_free(c);
    }
    if (first_st != ZO_OK) return zo_error(first_st, "document %zu: %s", first_doc, first_msg);
    return ZO_OK;
}
