/* Tests for the tokenizer (model/tokenizer.h, unicode.h, corpus.h) and token
 * files with a side file (model/data.h):
 * - token ids equal those of Hugging Face's JavaScript tokenizers
 *   (tests/js/make_reference.mjs): the committed reference for the two
 *   small shipped vocabularies, or the one test_tokenizer_js has just made
 *   with node (ZO_TOK_FIXTURES), which adds GPT-2, LLaMA-2, LLaMA-3 and
 *   Qwen2/Metaspace variants; decode(encode(x)) == x; many documents on
 *   several threads give the ids of one thread;
 * - strict UTF-8 (invalid input refused with its byte offset), NFC;
 * - what the reader refuses, by name;
 * - token files and their side files; corpora (documents, prompt/completion
 *   pairs with their loss mask, padded rows); the tokenize program. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "model/corpus.h"
#include "model/data.h"
#include "model/tokenizer.h"
#include "model/unicode.h"
#include "tests/support/scratch.h" /* defines: scratch_path */

static const char *fix_dir(void)
{
    const char *d = getenv("ZO_TOK_FIXTURES");
    return d && *d ? d : ZO_FIXTURES_DIR "/tokenizer";
}

static char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    buf[len] = 0;
    fclose(f);
    if (n) *n = (size_t)len;
    return buf;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static model_tokenizer *load(const char *path)
{
    model_tokenizer *t = NULL;
    if (model_tokenizer_load(path, &t) != ZO_OK) fail_msg("%s", zo_last_error());
    return t;
}

static char tmpdir[64];

static int setup_tmp(void **state)
{
    (void)state;
    scratch_path(tmpdir, sizeof tmpdir, "zo_test_tok.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmp(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- the reference ----------------------------------------------------------------------- */

static void print_escaped(const char *s)
{
    for (int i = 0; s[i] && i < 120; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') printf("\\n");
        else if (c == '\t') printf("\\t");
        else if (c == '\r') printf("\\r");
        else if (c < 0x20) printf("\\x%02x", c);
        else putchar(c);
    }
}

/* ids vs a JSON array; prints the first difference. 0 when equal. */
static int compare_ids(const char *what, const char *name, int idx, const char *text, const model_ids *got,
                       const cJSON *want)
{
    int n = cJSON_GetArraySize(want);
    size_t first = (size_t)-1;
    for (int i = 0; i < n || (size_t)i < got->n; i++) {
        if (i >= n || (size_t)i >= got->n || got->v[i] != cJSON_GetArrayItem(want, i)->valueint) {
            first = (size_t)i;
            break;
        }
    }
    if (first == (size_t)-1) return 0;
    printf("  %s: case %d (%s): first difference at id %zu of %zu (reference %d): text \"", name, idx, what,
           first, got->n, n);
    print_escaped(text);
    printf("\"\n    got ");
    for (size_t i = first; i < got->n && i < first + 8; i++) printf("%d ", got->v[i]);
    printf("\n    ref ");
    for (int i = (int)first; i < n && i < (int)first + 8; i++) printf("%d ", cJSON_GetArrayItem(want, i)->valueint);
    printf("\n");
    return 1;
}

static int has_added(const model_tokenizer *t, const model_ids *ids)
{
    for (size_t i = 0; i < ids->n; i++)
        if (model_tokenizer_is_special(t, ids->v[i])) return 1;
    return 0;
}

static int check_tokenizer(const cJSON *entry, const char *dir)
{
    const char *name = cJSON_GetObjectItem(entry, "name")->valuestring;
    const char *file = cJSON_GetObjectItem(entry, "file")->valuestring;
    int roundtrip = cJSON_IsTrue(cJSON_GetObjectItem(entry, "roundtrip"));
    const cJSON *cases = cJSON_GetObjectItem(entry, "cases"), *c;
    char path[1024];
    if (file[0] == '/') snprintf(path, sizeof path, "%s", file);
    else snprintf(path, sizeof path, "%s/%s", dir, file);
    model_tokenizer *t = load(path);
    model_tok_ctx *ctx;
    assert_int_equal(model_tok_ctx_new(t, &ctx), ZO_OK);
    int bad = 0, idx = 0, n_cases = cJSON_GetArraySize(cases), trips = 0;
    const char **docs = calloc((size_t)n_cases, sizeof *docs);
    size_t *lens = calloc((size_t)n_cases, sizeof *lens);
    model_ids *one = calloc((size_t)n_cases, sizeof *one);
    cJSON_ArrayForEach(c, cases)
    {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        size_t len = strlen(text);
        model_ids ids = {0}, plain = {0};
        if (model_tokenizer_encode(ctx, text, len, MODEL_TOK_ADD_SPECIAL, &ids) != ZO_OK ||
            model_tokenizer_encode(ctx, text, len, 0, &plain) != ZO_OK)
            fail_msg("%s: case %d: %s", name, idx, zo_last_error());
        bad += compare_ids("with special tokens", name, idx, text, &ids, cJSON_GetObjectItem(c, "ids"));
        bad += compare_ids("plain", name, idx, text, &plain, cJSON_GetObjectItem(c, "ids_plain"));
        if (roundtrip && !has_added(t, &plain)) {
            char *dec;
            size_t dn;
            assert_int_equal(model_tokenizer_decode(t, plain.v, plain.n, MODEL_TOK_SKIP_SPECIAL, &dec, &dn), ZO_OK);
            if (dn != len || memcmp(dec, text, len)) {
                printf("  %s: case %d: decode(encode(x)) != x: \"", name, idx);
                print_escaped(dec);
                printf("\"\n");
                bad++;
            }
            trips++;
            free(dec);
        }
        docs[idx] = text;
        lens[idx] = len;
        one[idx] = ids;
        model_ids_free(&plain);
        idx++;
    }
    /* many documents on three threads, each followed by the end-of-text token */
    int32_t eot = model_tokenizer_eot(t);
    model_ids *many = calloc((size_t)n_cases, sizeof *many);
    assert_int_equal(model_tokenizer_encode_many(t, docs, lens, (size_t)n_cases, MODEL_TOK_ADD_SPECIAL, eot, 3, many),
                     ZO_OK);
    for (int i = 0; i < n_cases; i++) {
        assert_int_equal(many[i].n, one[i].n + (eot >= 0));
        assert_memory_equal(many[i].v, one[i].v, one[i].n * sizeof(int32_t));
        if (eot >= 0) assert_int_equal(many[i].v[one[i].n], eot);
        model_ids_free(&many[i]);
        model_ids_free(&one[i]);
    }
    printf("  %s: %d texts, %d round trips, %d mismatches (%s, %d ids)\n", name, n_cases, trips, bad,
           model_tokenizer_kind(t), model_tokenizer_vocab(t));
    free(many);
    free(one);
    free(docs);
    free(lens);
    model_tok_ctx_free(ctx);
    model_tokenizer_free(t);
    return bad;
}

static void test_reference(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.json", fix_dir());
    char *text = read_file(path, NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    const cJSON *list = cJSON_GetObjectItem(root, "tokenizers"), *e;
    int bad = 0, n = 0;
    cJSON_ArrayForEach(e, list)
    {
        bad += check_tokenizer(e, fix_dir());
        n++;
    }
    cJSON_Delete(root);
    assert_true(n >= 2);
    /* with node, the real vocabularies are there too */
    if (getenv("ZO_TOK_FIXTURES")) assert_true(n >= 7);
    assert_int_equal(bad, 0);
}

/* ---- UTF-8 and NFC ------------------------------------------------------------------------- */

static void test_utf8(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t n, bad; /* bad == n: valid */
    } cases[] = {
        {"plain ascii", 11, 11},
        {"\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x80", 9, 9}, /* é ▁ 😀 */
        {"\xf4\x8f\xbf\xbf", 4, 4},                       /* U+10FFFF */
        {"\xef\xbf\xbf", 3, 3},                           /* U+FFFF */
        {"\x80", 1, 0},                                   /* a lone continuation byte */
        {"a\xc0\xaf" "b", 4, 1},                          /* overlong '/' */
        {"ab\xe0\x80\xaf", 5, 2},                         /* overlong, 3 bytes */
        {"ab\xed\xa0\x80", 5, 2},                         /* a surrogate */
        {"\xf4\x90\x80\x80", 4, 0},                       /* above U+10FFFF */
        {"abc\xe2\x82", 5, 3},                            /* truncated */
        {"0123456789\xff", 11, 10},                       /* after the 8-byte fast path */
        {"\xc3\xa9" "abcdefgh\xfe", 11, 10},
    };
    model_tokenizer *t;
    char path[1024];
    snprintf(path, sizeof path, "%s/small-bpe.json", ZO_FIXTURES_DIR "/tokenizer");
    t = load(path);
    model_tok_ctx *c;
    assert_int_equal(model_tok_ctx_new(t, &c), ZO_OK);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(model_utf8_check(cases[i].s, cases[i].n), cases[i].bad);
        model_ids ids = {0};
        zo_status st = model_tokenizer_encode(c, cases[i].s, cases[i].n, 0, &ids);
        if (cases[i].bad == cases[i].n) {
            assert_int_equal(st, ZO_OK);
        } else {
            char want[64];
            snprintf(want, sizeof want, "byte offset %zu", cases[i].bad);
            assert_int_equal(st, ZO_ERR_INVALID);
            if (!strstr(zo_last_error(), want)) fail_msg("case %zu: \"%s\" does not name %s", i, zo_last_error(), want);
        }
        model_ids_free(&ids);
    }
    model_tok_ctx_free(c);
    model_tokenizer_free(t);
}

/* Examples of the Unicode standard (UAX #15 and chapter 3.12). */
static void test_nfc(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"A\xcc\x8a", "\xc3\x85"},                 /* A + ring above -> Å */
        {"\xe2\x84\xab", "\xc3\x85"},             /* ANGSTROM SIGN -> Å (singleton) */
        {"e\xcc\x81", "\xc3\xa9"},                 /* e + acute -> é */
        {"a\xcc\x81\xcc\xa3", "\xe1\xba\xa1\xcc\x81"}, /* reordered: dot below (220) first, then acute */
        {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"}, /* jamo L V T -> 각 */
        {"\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81"}, /* LV + T -> LVT */
        {"\xe0\xa4\x95\xe0\xa4\xbc", "\xe0\xa4\x95\xe0\xa4\xbc"}, /* क + nukta: composition excluded */
        {"plain", "plain"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        size_t n;
        assert_int_equal(model_uc_nfc(cases[i].in, strlen(cases[i].in), &out, &n), ZO_OK);
        if (n != strlen(cases[i].out) || memcmp(out, cases[i].out, n)) fail_msg("NFC case %zu", i);
        free(out);
    }
    /* o + diaeresis + acute: ö (U+00F6) has no composition with acute, so NFC is ö + acute */
    char *out;
    size_t n;
    assert_int_equal(model_uc_nfc("o\xcc\x88\xcc\x81", 5, &out, &n), ZO_OK);
    assert_int_equal(n, 4);
    assert_memory_equal(out, "\xc3\xb6\xcc\x81", 4);
    free(out);
    assert_int_equal(model_uc_nfc_quick("caf\xc3\xa9 \xe6\x97\xa5", 9), 1);
    assert_int_equal(model_uc_nfc_quick("e\xcc\x81", 3), 0);
    assert_int_equal(model_uc_class_of('a'), MODEL_UC_LETTER);
    assert_int_equal(model_uc_class_of(0x65E5), MODEL_UC_LETTER); /* 日 */
    assert_int_equal(model_uc_class_of(0x0663), MODEL_UC_NUMBER); /* ٣ */
    assert_int_equal(model_uc_class_of(0x2167), MODEL_UC_NUMBER); /* Ⅷ */
    assert_int_equal(model_uc_class_of(0x3000), MODEL_UC_SPACE);
    assert_int_equal(model_uc_class_of(0x85), MODEL_UC_SPACE);
    assert_int_equal(model_uc_class_of(0xFEFF), MODEL_UC_OTHER);
    assert_int_equal(model_uc_class_of(0x1F600), MODEL_UC_OTHER);
    assert_int_equal(model_uc_class_of(0x20000), MODEL_UC_LETTER); /* CJK extension B */
}

/* ---- what is refused --------------------------------------------------------------------------- */

/* small-bpe.json with one member replaced (JSON text), written to tmpdir. */
static zo_status load_variant(const char *member_path, const char *json, char *msg, size_t cap)
{
    char *text = read_file(ZO_FIXTURES_DIR "/tokenizer/small-bpe.json", NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *obj = root;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", member_path);
    char *save, *key = strtok_r(buf, ".", &save), *next;
    while ((next = strtok_r(NULL, ".", &save))) {
        obj = cJSON_GetObjectItem(obj, key);
        key = next;
    }
    cJSON *v = cJSON_Parse(json);
    assert_non_null(v);
    if (cJSON_GetObjectItem(obj, key)) cJSON_ReplaceItemInObject(obj, key, v);
    else cJSON_AddItemToObject(obj, key, v);
    char *out = cJSON_PrintUnformatted(root);
    char path[128];
    snprintf(path, sizeof path, "%s/variant.json", tmpdir);
    write_file(path, out, strlen(out));
    cJSON_free(out);
    cJSON_Delete(root);
    model_tokenizer *t = NULL;
    zo_status st = model_tokenizer_load(path, &t);
    snprintf(msg, cap, "%s", zo_last_error());
    model_tokenizer_free(t);
    return st;
}

static void test_refused(void **state)
{
    (void)state;
    static const struct {
        const char *member, *json;
        zo_status st;
        const char *names;
    } cases[] = {
        {"model.type", "\"WordPiece\"", ZO_ERR_UNSUPPORTED, "model.type"},
        {"model.dropout", "0.1", ZO_ERR_UNSUPPORTED, "dropout"},
        {"normalizer", "{\"type\": \"NFKC\"}", ZO_ERR_UNSUPPORTED, "normalizer NFKC"},
        {"normalizer", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Lowercase\"}]}", ZO_ERR_UNSUPPORTED,
         "normalizer.normalizers[0] Lowercase"},
        {"pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}, \"behavior\": \"Isolated\"}",
         ZO_ERR_UNSUPPORTED, "pattern \\w+"},
        {"pre_tokenizer", "{\"type\": \"Whitespace\"}", ZO_ERR_UNSUPPORTED, "pre_tokenizer Whitespace"},
        {"decoder", "{\"type\": \"WordPiece\"}", ZO_ERR_UNSUPPORTED, "decoder WordPiece"},
        {"added_tokens", "[{\"id\": 5, \"content\": \"x\", \"single_word\": true}]", ZO_ERR_UNSUPPORTED, "single_word"},
        {"model.merges", "[\"a zzzz\"]", ZO_ERR_FORMAT, "model.merges[0]"},
        {"model.merges", "[\"nospace\"]", ZO_ERR_FORMAT, "model.merges[0]"},
        /* a UTF-8 sequence cut off at the end of a merge's part: refused, never
         * decoded past the end of the string (ASan: heap-buffer-overflow) */
        {"model.merges", "[\"a \xf0\"]", ZO_ERR_FORMAT, "model.merges[0] is not UTF-8"},
        {"model.merges", "[\"\xe4 a\"]", ZO_ERR_FORMAT, "model.merges[0] is not UTF-8"},
        {"model.merges", "[[\"a\", \"\xe4\"]]", ZO_ERR_FORMAT, "model.merges[0] is not UTF-8"},
        {"model.merges", "[[\"\xf0\x9f\", \"a\"]]", ZO_ERR_FORMAT, "model.merges[0] is not UTF-8"},
        {"model.vocab", "{\"a\": -1}", ZO_ERR_FORMAT, "model.vocab"},
        /* ids far past the tokens: the id tables were sized by the largest
         * (2.4 GB for this one; fuzz_tokenizer, out of memory) */
        {"model.vocab", "{\"a\": 0, \"b\": 599999991}", ZO_ERR_FORMAT,
         "model.vocab[\"b\"]: id 599999991 is far past the 3 tokens"},
        {"post_processor", "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<nope>\"}}]}",
         ZO_ERR_FORMAT, "<nope>"},
        /* ids the template adds must be tokens: encode emitted them, decode
         * refused them (fuzz_tokenizer) */
        {"post_processor", "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, "
         "{\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [5000]}}}",
         ZO_ERR_FORMAT, "post_processor.special_tokens.<s>.ids: 5000 is no token of the vocabulary"},
    };
    char msg[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zo_status st = load_variant(cases[i].member, cases[i].json, msg, sizeof msg);
        if (st != cases[i].st || !strstr(msg, cases[i].names))
            fail_msg("case %zu (%s): status %s, message \"%s\"", i, cases[i].member, zo_status_name(st), msg);
    }
    /* not JSON; not a tokenizer.json */
    char path[128];
    snprintf(path, sizeof path, "%s/bad.json", tmpdir);
    write_file(path, "{\"model\": ", 10);
    model_tokenizer *t = NULL;
    assert_int_equal(model_tokenizer_load(path, &t), ZO_ERR_FORMAT);
    write_file(path, "{}", 2);
    assert_int_equal(model_tokenizer_load(path, &t), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "\"model\""));
    /* a key given twice (readers disagree on which counts) */
    const char *twice = "{\"model\": {}, \"model\": {}}";
    write_file(path, twice, strlen(twice));
    assert_int_equal(model_tokenizer_load(path, &t), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "\"model\" appears twice"));
    assert_int_equal(model_tokenizer_load("/nonexistent/tokenizer.json", &t), ZO_ERR_NOT_FOUND);
}

/* ---- special tokens ----------------------------------------------------------------------------- */

static void test_special(void **state)
{
    (void)state;
    model_tokenizer *bpe = load(ZO_FIXTURES_DIR "/tokenizer/small-bpe.json");
    model_tokenizer *sp = load(ZO_FIXTURES_DIR "/tokenizer/small-sp.json");
    assert_string_equal(model_tokenizer_kind(bpe), "byte-level BPE");
    assert_string_equal(model_tokenizer_kind(sp), "SentencePiece BPE");
    assert_int_equal(model_tokenizer_vocab(bpe), 1024);
    assert_int_equal(model_tokenizer_eot(bpe), model_tokenizer_token_id(bpe, "<|endoftext|>"));
    assert_int_equal(model_tokenizer_eot(sp), model_tokenizer_token_id(sp, "</s>"));
    assert_true(model_tokenizer_is_special(sp, model_tokenizer_token_id(sp, "<s>")));
    assert_false(model_tokenizer_is_special(sp, 100));
    assert_int_equal(model_tokenizer_token_id(bpe, "no such token"), -1);
    model_tok_ctx *c;
    assert_int_equal(model_tok_ctx_new(sp, &c), ZO_OK);
    /* <s> from the template, and one spelled in the text */
    model_ids ids = {0};
    assert_int_equal(model_tokenizer_encode(c, "a<s>b", 5, MODEL_TOK_ADD_SPECIAL, &ids), ZO_OK);
    int32_t bos = model_tokenizer_token_id(sp, "<s>");
    assert_int_equal(ids.v[0], bos);
    int found = 0;
    for (size_t i = 1; i < ids.n; i++) found += ids.v[i] == bos;
    assert_int_equal(found, 1);
    /* decoding an id with no token */
    char *out;
    size_t n;
    int32_t bad[1] = {5000};
    assert_int_equal(model_tokenizer_decode(sp, bad, 1, 0, &out, &n), ZO_ERR_INVALID);
    model_ids_free(&ids);
    model_tok_ctx_free(c);
    model_tokenizer_free(bpe);
    model_tokenizer_free(sp);
}

/* ---- token files ------------------------------------------------------------------------------- */

static void write_tokens(const char *path, model_token_width w, int vocab, const int32_t *ids, size_t n)
{
    model_tokens_writer wr;
    assert_int_equal(model_tokens_writer_open(&wr, path, w, vocab), ZO_OK);
    assert_int_equal(model_tokens_writer_append(&wr, ids, n / 2), ZO_OK);
    assert_int_equal(model_tokens_writer_append(&wr, ids + n / 2, n - n / 2), ZO_OK);
    model_tokens_info info = {.eot = ids[n - 1], .documents = 3};
    snprintf(info.tokenizer, sizeof info.tokenizer, "tok.json");
    assert_int_equal(model_tokens_writer_commit(&wr, &info), ZO_OK);
}

static void test_token_files(void **state)
{
    (void)state;
    char path[128];
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = (i * 7919) % 1000;
    for (int k = 0; k < 2; k++) {
        int vocab = k ? 100000 : 1000;
        model_token_width w = model_tokens_width_for(vocab);
        assert_int_equal(w, k ? MODEL_TOKENS_U32 : MODEL_TOKENS_U16);
        if (k) ids[5] = 99999;
        snprintf(path, sizeof path, "%s/tokens%d.bin", tmpdir, k);
        write_tokens(path, w, vocab, ids, 64);
        model_tokens_info info;
        int found;
        assert_int_equal(model_tokens_info_read(path, &info, &found), ZO_OK);
        assert_int_equal(found, 1);
        assert_int_equal(info.width, w);
        assert_int_equal(info.vocab, vocab);
        assert_int_equal(info.tokens, 64);
        assert_int_equal(info.documents, 3);
        assert_int_equal(info.eot, ids[63]);
        assert_string_equal(info.tokenizer, "tok.json");
        model_tokens t;
        assert_int_equal(model_tokens_open(&t, path, info.width, vocab), ZO_OK);
        assert_int_equal(t.n, 64);
        for (int i = 0; i < 64; i++) assert_int_equal(model_tokens_get(&t, (uint64_t)i), (uint32_t)ids[i]);
        model_tokens_close(&t);
    }
    /* an old file: no side file */
    model_tokens_info info;
    int found = 1;
    snprintf(path, sizeof path, "%s/old.bin", tmpdir);
    uint16_t raw[4] = {1, 2, 3, 4};
    write_file(path, raw, sizeof raw);
    assert_int_equal(model_tokens_info_read(path, &info, &found), ZO_OK);
    assert_int_equal(found, 0);
    /* a malformed side file, and ids outside the vocabulary */
    snprintf(path, sizeof path, "%s/old.bin.json", tmpdir);
    const char *side = "{\"format\": \"zoffload-tokens\", \"dtype\": \"int8\", \"vocab\": 5}";
    write_file(path, side, strlen(side));
    snprintf(path, sizeof path, "%s/old.bin", tmpdir);
    assert_int_equal(model_tokens_info_read(path, &info, &found), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "dtype"));
    model_tokens_writer wr;
    snprintf(path, sizeof path, "%s/bad.bin", tmpdir);
    assert_int_equal(model_tokens_writer_open(&wr, path, MODEL_TOKENS_U16, 100000), ZO_ERR_INVALID);
    assert_int_equal(model_tokens_writer_open(&wr, path, MODEL_TOKENS_U16, 10), ZO_OK);
    int32_t big[2] = {3, 10};
    assert_int_equal(model_tokens_writer_append(&wr, big, 2), ZO_ERR_INVALID);
    model_tokens_writer_abort(&wr);
    assert_int_equal(access(path, F_OK), -1); /* nothing left behind */
}

/* ---- corpora ------------------------------------------------------------------------------------- */

static void encode_one(model_tokenizer *t, const char *s, int flags, model_ids *out)
{
    model_tok_ctx *c;
    assert_int_equal(model_tok_ctx_new(t, &c), ZO_OK);
    assert_int_equal(model_tokenizer_encode(c, s, strlen(s), flags, out), ZO_OK);
    model_tok_ctx_free(c);
}

static void test_corpus_pairs(void **state)
{
    (void)state;
    model_tokenizer *t = load(ZO_FIXTURES_DIR "/tokenizer/small-sp.json");
    char path[128];
    snprintf(path, sizeof path, "%s/sft.jsonl", tmpdir);
    const char *jsonl = "{\"prompt\": \"What is the runtime?\", \"completion\": \" It streams weights.\"}\n"
                        "\n"
                        "{\"prompt\": \"Name a tier:\", \"completion\": \" nvme\"}\n";
    write_file(path, jsonl, strlen(jsonl));
    model_corpus c;
    assert_int_equal(model_corpus_read(path, &c), ZO_OK);
    assert_int_equal(c.kind, MODEL_CORPUS_PAIRS);
    assert_int_equal(c.n, 2);
    assert_int_equal(c.line[1], 3);
    int32_t eot = model_tokenizer_eot(t);
    for (int pad = 0; pad < 2; pad++) {
        model_corpus_options o = {.add_special = 1, .eot = eot, .packing = pad ? MODEL_PACK_PAD : MODEL_PACK_STREAM,
                                  .n_threads = 2};
        model_tokens tok;
        assert_int_equal(model_corpus_tokenize(&c, t, &o, 1024, &tok), ZO_OK);
        /* each record: encode(prompt + completion) then eot; the mask is 0 on the prompt's tokens */
        uint64_t k = 0;
        for (size_t r = 0; r < c.n; r++) {
            char joined[256];
            snprintf(joined, sizeof joined, "%s%s", c.text[r], c.completion[r]);
            model_ids full = {0}, prompt = {0};
            encode_one(t, joined, MODEL_TOK_ADD_SPECIAL, &full);
            encode_one(t, c.text[r], MODEL_TOK_ADD_SPECIAL, &prompt);
            if (pad) assert_int_equal(tok.rows[r], k);
            for (size_t j = 0; j < full.n; j++, k++) {
                assert_int_equal(model_tokens_get(&tok, k), (uint32_t)full.v[j]);
                /* here the prompt's tokens are a prefix of the pair's */
                assert_int_equal(tok.mask[k], j >= prompt.n);
            }
            assert_int_equal(model_tokens_get(&tok, k), (uint32_t)eot);
            assert_int_equal(tok.mask[k++], 1);
            model_ids_free(&full);
            model_ids_free(&prompt);
        }
        assert_int_equal(tok.n, k);
        /* batches: targets are -1 exactly where the mask is 0 or past a row's end */
        enum { B = 2, T = 8 };
        int32_t in[B * T], tg[B * T];
        assert_int_equal(model_batch_get(&tok, B, T, 0, 0, MODEL_SAMPLE_SEQUENTIAL, in, tg), ZO_OK);
        for (int b = 0; b < B; b++) {
            uint64_t off = pad ? tok.rows[b] : (uint64_t)b * T;
            uint64_t end = pad ? tok.rows[b + 1] : tok.n;
            for (int j = 0; j < T; j++) {
                uint64_t p = off + (uint64_t)j;
                int32_t want_in = p < end ? (int32_t)model_tokens_get(&tok, p) : eot;
                int32_t want_tg = p + 1 < end && tok.mask[p + 1] ? (int32_t)model_tokens_get(&tok, p + 1) : -1;
                assert_int_equal(in[b * T + j], want_in);
                assert_int_equal(tg[b * T + j], want_tg);
            }
        }
        model_tokens_close(&tok);
    }
    model_corpus_free(&c);

    /* malformed files name the line; invalid UTF-8 its offset */
    static const struct {
        const char *text, *names;
    } bad[] = {
        {"{\"text\": \"a\"}\n{\"prompt\": \"p\", \"completion\": \"c\"}\n", ":2:"},
        {"{\"text\": \"a\"}\nnot json\n", ":2: not a JSON object"},
        {"{\"text\": \"a\"}\n{\"text\": \"a\", \"text\": \"b\"}\n", ":2: key \"text\" appears twice"},
        {"{\"prompt\": \"p\"}\n", "\"completion\" is missing"},
        {"{\"other\": 1}\n", ":1: a record needs"},
        {"\n\n", "no records"},
        {"{\"text\": \"ab\xff\"}\n", "byte offset 12"},
        {"{\"text\": \"\\ud800\"}\n", ":1:"}, /* a lone surrogate: refused by the parser */
        /* a second record on a line, or anything after the object: it was dropped */
        {"{\"text\": \"a\"} {\"text\": \"b\"}\n", ":1: text after the record at column 15"},
        {"{\"text\": \"a\"}\n{\"text\": \"b\"}x\n", ":2: text after the record at column 14"},
        /* \u0000 in a string: the record was cut short at it */
        {"{\"text\": \"a\\u0000b\"}\n", ":1: a string holds \\u0000 (NUL) at column 12"},
        {"{\"text\": \"ok\"}\n{\"text\": \"x\", \"note\": \"\\u0000\"}\n", ":2: a string holds \\u0000"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(path, bad[i].text, strlen(bad[i].text));
        zo_status st = model_corpus_read(path, &c);
        if (st == ZO_OK || !strstr(zo_last_error(), bad[i].names))
            fail_msg("case %zu: %s: \"%s\"", i, zo_status_name(st), zo_last_error());
    }
    model_tokenizer_free(t);
}

/* Data in which no completion token survives the cut to --seq trained on
 * nothing (every target -1: loss 0, exit 0) while weight decay still moved
 * the weights. Tokenized with the sequence length (model_corpus_options.seq)
 * it is refused, naming the file and the --seq that would keep a token;
 * model_tokens_check_seq counts the records that keep none. */
static void test_corpus_seq(void **state)
{
    (void)state;
    model_tokenizer *t = load(ZO_FIXTURES_DIR "/tokenizer/small-sp.json");
    const char *prompts[] = {"What is the runtime that streams the weights to the device one block at a time?",
                             "Which tier holds the optimizer state when it does not fit in memory?"};
    char path[128], jsonl[512];
    snprintf(path, sizeof path, "%s/long-prompts.jsonl", tmpdir);
    snprintf(jsonl, sizeof jsonl, "{\"prompt\": \"%s\", \"completion\": \" offload\"}\n"
             "{\"prompt\": \"%s\", \"completion\": \" nvme\"}\n", prompts[0], prompts[1]);
    write_file(path, jsonl, strlen(jsonl));
    model_ids p0 = {0}, p1 = {0};
    encode_one(t, prompts[0], MODEL_TOK_ADD_SPECIAL, &p0);
    encode_one(t, prompts[1], MODEL_TOK_ADD_SPECIAL, &p1);
    size_t shortest = p0.n < p1.n ? p0.n : p1.n, longest = p0.n < p1.n ? p1.n : p0.n;
    assert_true(shortest > 8 && longest > shortest);
    model_corpus c;
    assert_int_equal(model_corpus_read(path, &c), ZO_OK);
    model_corpus_options o = {.add_special = 1, .eot = model_tokenizer_eot(t), .packing = MODEL_PACK_PAD,
                              .n_threads = 1, .seq = 8};
    model_tokens tok;
    assert_int_equal(model_corpus_tokenize(&c, t, &o, 1024, &tok), ZO_ERR_INVALID);
    char want[160];
    snprintf(want, sizeof want, "every record's completion is cut off by --seq 8: the shortest prompt takes %zu "
             "tokens (--seq %zu or more keeps a completion token of it)", shortest, shortest);
    if (!strstr(zo_last_error(), want) || !strstr(zo_last_error(), path)) fail_msg("%s", zo_last_error());
    /* --seq as long as the shortest prompt: one record keeps its first completion token */
    o.seq = (int)shortest;
    assert_int_equal(model_corpus_tokenize(&c, t, &o, 1024, &tok), ZO_OK);
    uint64_t cut;
    assert_int_equal(model_tokens_check_seq(&tok, (int)shortest, &cut), ZO_OK);
    assert_int_equal(cut, 1);
    int32_t in[2 * 64], tg[2 * 64];
    assert_int_equal(model_batch_get(&tok, 2, (int)shortest, 0, 0, MODEL_SAMPLE_SEQUENTIAL, in, tg), ZO_OK);
    int counted = 0;
    for (size_t j = 0; j < 2 * shortest; j++) counted += tg[j] >= 0;
    assert_int_equal(counted, 1);
    assert_int_equal(model_tokens_check_seq(&tok, (int)longest, &cut), ZO_OK);
    assert_int_equal(cut, 0);
    model_tokens_close(&tok);
    /* streamed, the records' completions are in the windows; too long a
     * --seq for the stream is refused here too */
    o.packing = MODEL_PACK_STREAM;
    o.seq = 8;
    assert_int_equal(model_corpus_tokenize(&c, t, &o, 1024, &tok), ZO_OK);
    model_tokens_close(&tok);
    o.seq = 4096;
    assert_int_equal(model_corpus_tokenize(&c, t, &o, 1024, &tok), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "are too few for sequences of 4096 (--seq 4096 needs at least 4098)"));
    model_corpus_free(&c);
    /* a stream whose mask keeps nothing */
    uint32_t *ids = calloc(16, sizeof *ids);
    uint8_t *mask = calloc(16, 1);
    assert_non_null(ids);
    assert_non_null(mask);
    assert_int_equal(model_tokens_from_ids(&tok, "masked", ids, 16, 8, mask, NULL, 0, 0), ZO_OK);
    assert_int_equal(model_tokens_check_seq(&tok, 4, NULL), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "masked: no token is a target"));
    model_tokens_close(&tok);
    model_ids_free(&p0);
    model_ids_free(&p1);
    model_tokenizer_free(t);
}

/* The file's name picks its format, whatever its case: .jsonl records one a
 * line; .json a JSON array of records (or records one a line, as Hugging
 * Face datasets reads both); anything else one text document. A JSON array
 * (alpaca_data.json) and a .JSONL file were each read as one raw document
 * before. */
static void test_corpus_formats(void **state)
{
    (void)state;
    static const struct {
        const char *name, *text;
        model_corpus_kind kind;
        size_t n;
        int last_line;
    } good[] = {
        {"data.JSONL", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n", MODEL_CORPUS_TEXT, 2, 2},
        {"data.Jsonl", "{\"text\": \"a\"}\n\n{\"text\": \"b\"}", MODEL_CORPUS_TEXT, 2, 3},
        {"pairs.json", "[{\"prompt\": \"p1\", \"completion\": \"c1\"},\n {\"prompt\": \"p2\", \"completion\": \"c2\"}]\n",
         MODEL_CORPUS_PAIRS, 2, 2},
        {"pairs.JSON", "\n  [\n  {\"text\": \"a\"}\n  ,\n\n  {\"text\": \"b\"} ]", MODEL_CORPUS_TEXT, 2, 6},
        {"lines.json", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n", MODEL_CORPUS_TEXT, 2, 2},
        {"doc.txt", "[{\"text\": \"a\"}, {\"text\": \"b\"}]", MODEL_CORPUS_TEXT, 1, 0},
        /* an escaped backslash before "u0000" is text, not a NUL */
        {"esc.jsonl", "{\"text\": \"a\\\\u0000\"}\n", MODEL_CORPUS_TEXT, 1, 1},
    };
    char path[128];
    model_corpus c;
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", tmpdir, good[i].name);
        write_file(path, good[i].text, strlen(good[i].text));
        if (model_corpus_read(path, &c) != ZO_OK) fail_msg("%s: %s", good[i].name, zo_last_error());
        if (c.kind != good[i].kind || c.n != good[i].n || c.line[c.n - 1] != good[i].last_line)
            fail_msg("%s: kind %d, %zu records, the last on line %d", good[i].name, (int)c.kind, c.n,
                     c.line[c.n - 1]);
        model_corpus_free(&c);
    }
    snprintf(path, sizeof path, "%s/esc.jsonl", tmpdir);
    assert_int_equal(model_corpus_read(path, &c), ZO_OK);
    assert_string_equal(c.text[0], "a\\u0000");
    model_corpus_free(&c);
    /* a NUL byte, in a text file or raw in a JSON string (fuzz_corpus: the
     * text held it; a JSON string was cut at it) */
    static const struct {
        const char *name, *text;
        size_t len;
        const char *names;
    } nul[] = {{"doc.txt", "one\0two", 7, "a NUL byte at byte offset 3 (line 1)"},
               {"nul.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"a\0b\"}\n", 31, "a NUL byte at byte offset 26 (line 2)"}};
    for (size_t i = 0; i < sizeof nul / sizeof nul[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", tmpdir, nul[i].name);
        write_file(path, nul[i].text, nul[i].len);
        zo_status st = model_corpus_read(path, &c);
        if (st != ZO_ERR_FORMAT || !strstr(zo_last_error(), nul[i].names) || !strstr(zo_last_error(), path))
            fail_msg("%s: %s: \"%s\"", nul[i].name, zo_status_name(st), zo_last_error());
    }
    static const struct {
        const char *name, *text, *names;
    } bad[] = {
        {"alpaca.json", "[\n{\"prompt\": \"p\", \"completion\": \"c\"},\n{\"instruction\": \"i\", \"input\": \"\", \"output\": \"o\"}]",
         ":3: an Alpaca record (instruction, input, output): write it as {\"prompt\": ..., \"completion\": ...}"},
        {"a.json", "[{\"text\": \"a\"} {\"text\": \"b\"}]", ":1: expected ',' or ']' after record 1"},
        {"a.json", "[{\"text\": \"a\"}]\n x", ":2: text after the array"},
        {"a.json", "[{\"text\": \"a\"}", ":1: the array is not closed"},
        {"a.json", " []", "no records"},
        {"a.json", "[\n1]", ":2: not a JSON object"},
        {"a.json", "[{\"text\": \"\\u0000\"}]", ":1: a string holds \\u0000"},
        {"a.json", "{\n\"text\": \"a\"\n}\n", ":1: not a JSON object (a .json corpus is an array of records, or one record a line)"},
        {"a.JSONL", "{\"text\": \"a\"}{}\n", ":1: text after the record"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", tmpdir, bad[i].name);
        write_file(path, bad[i].text, strlen(bad[i].text));
        zo_status st = model_corpus_read(path, &c);
        if (st != ZO_ERR_FORMAT || !strstr(zo_last_error(), bad[i].names) || !strstr(zo_last_error(), path))
            fail_msg("case %zu: %s: \"%s\"", i, zo_status_name(st), zo_last_error());
    }
}

/* ---- the tokenize program ----------------------------------------------------------------------- */

static int run(const char *cmd)
{
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_tokenize_program(void **state)
{
    (void)state;
    char txt[128], jsonl[128], out[160], cmd[1024];
    snprintf(txt, sizeof txt, "%s/doc.txt", tmpdir);
    snprintf(jsonl, sizeof jsonl, "%s/docs.jsonl", tmpdir);
    snprintf(out, sizeof out, "%s/out.bin", tmpdir);
    const char *doc = "The runtime streams weights.\n\nIt's  fast: 1234 tokens/s \xe2\x9c\x93\n";
    write_file(txt, doc, strlen(doc));
    const char *docs = "{\"text\": \"first document\"}\n{\"text\": \"second one\\n\"}\n";
    write_file(jsonl, docs, strlen(docs));
    snprintf(cmd, sizeof cmd, "%s --tokenizer %s/tokenizer/small-sp.json --out %s --threads 2 %s %s >/dev/null",
             ZO_TOKENIZE_BIN, ZO_FIXTURES_DIR, out, txt, jsonl);
    assert_int_equal(run(cmd), 0);
    /* what the library gives, document by document, each with <s> and then </s> */
    model_tokenizer *t = load(ZO_FIXTURES_DIR "/tokenizer/small-sp.json");
    model_ids want = {0};
    const char *texts[3] = {doc, "first document", "second one\n"};
    for (int i = 0; i < 3; i++) {
        encode_one(t, texts[i], MODEL_TOK_ADD_SPECIAL, &want);
        assert_int_equal(model_ids_push(&want, model_tokenizer_eot(t)), ZO_OK);
    }
    model_tokens_info info;
    int found;
    assert_int_equal(model_tokens_info_read(out, &info, &found), ZO_OK);
    assert_int_equal(found, 1);
    assert_int_equal(info.documents, 3);
    assert_int_equal(info.eot, model_tokenizer_eot(t));
    model_tokens tok;
    assert_int_equal(model_tokens_open(&tok, out, info.width, info.vocab), ZO_OK);
    assert_int_equal(tok.n, want.n);
    for (size_t i = 0; i < want.n; i++) assert_int_equal(model_tokens_get(&tok, i), (uint32_t)want.v[i]);
    model_tokens_close(&tok);
    model_ids_free(&want);
    model_tokenizer_free(t);
    /* refused: invalid UTF-8 (exit 2, the offset named), a missing file, prompt/completion data */
    write_file(txt, "ok\xc3(", 4);
    snprintf(cmd, sizeof cmd, "%s --tokenizer %s/tokenizer/small-sp.json --out %s %s 2>%s/err.txt", ZO_TOKENIZE_BIN,
             ZO_FIXTURES_DIR, out, txt, tmpdir);
    assert_int_equal(run(cmd), 2);
    char errp[160];
    snprintf(errp, sizeof errp, "%s/err.txt", tmpdir);
    char *err = read_file(errp, NULL);
    assert_non_null(strstr(err, "invalid UTF-8 at byte offset 2"));
    free(err);
    snprintf(cmd, sizeof cmd, "%s --tokenizer %s/tokenizer/small-sp.json --out %s /nonexistent 2>/dev/null",
             ZO_TOKENIZE_BIN, ZO_FIXTURES_DIR, out);
    assert_int_equal(run(cmd), 2);
    write_file(jsonl, "{\"prompt\": \"p\", \"completion\": \"c\"}\n", 36);
    snprintf(cmd, sizeof cmd, "%s --tokenizer %s/tokenizer/small-sp.json --out %s %s 2>/dev/null", ZO_TOKENIZE_BIN,
             ZO_FIXTURES_DIR, out, jsonl);
    assert_int_equal(run(cmd), 2);
    snprintf(cmd, sizeof cmd, "%s --help >/dev/null", ZO_TOKENIZE_BIN);
    assert_int_equal(run(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test_setup_teardown(test_refused, setup_tmp, teardown_tmp),
        cmocka_unit_test(test_special),
        cmocka_unit_test_setup_teardown(test_token_files, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_corpus_pairs, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_corpus_formats, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_corpus_seq, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_tokenize_program, setup_tmp, teardown_tmp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
