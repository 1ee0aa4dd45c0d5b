/* Text corpora (model/corpus.h): the input read as a .jsonl, a .json and a
 * text file. What is read has no string cut short (no NUL inside) and its
 * records' lines in order; it is tokenized (the byte-level tokenizer of
 * tests/fixtures) into a stream and into padded rows, and for rows of 8
 * tokens model_tokens_check_seq agrees with the batches: a row it counts as
 * cut gives no target, the others at least one. */
#include <string.h>

#include "fuzz/fuzz.h"
#include "model/corpus.h" /* defines: model_corpus_parse, model_corpus_tokenize */
#include "model/data.h"   /* defines: model_tokens_check_seq, model_batch_get */

enum { SEQ = 8, MAX_ROWS = 64 };

/* Padded rows: the rows with no target in a batch of one row each, against
 * what model_tokens_check_seq says. */
static void check_rows(const model_tokens *t)
{
    uint64_t cut;
    zo_status st = model_tokens_check_seq(t, SEQ, &cut);
    if (t->n_rows > MAX_ROWS) return;
    uint64_t none = 0;
    for (uint64_t r = 0; r < t->n_rows; r++) {
        int32_t in[SEQ], tg[SEQ], any = 0;
        FUZZ_ASSERT(model_batch_get(t, 1, SEQ, (int64_t)r, 0, MODEL_SAMPLE_SEQUENTIAL, in, tg) == ZO_OK, "row %llu: %s",
                    (unsigned long long)r, zo_last_error());
        for (int j = 0; j < SEQ; j++) any |= tg[j] >= 0;
        none += !any;
    }
    FUZZ_ASSERT(cut == none, "check_seq counts %llu rows without a target, the batches %llu",
                (unsigned long long)cut, (unsigned long long)none);
    FUZZ_ASSERT((st == ZO_OK) == (none < t->n_rows), "check_seq %s with %llu of %llu rows without a target",
                zo_status_name(st), (unsigned long long)none, (unsigned long long)t->n_rows);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static model_tokenizer *tok;
    if (!tok && model_tokenizer_load(ZO_FIXTURES_DIR "/tokenizer/small-bpe.json", &tok) != ZO_OK) {
        fprintf(stderr, "fuzz_corpus: %s\n", zo_last_error());
        abort();
    }
    static const char *const names[] = {"fuzz.jsonl", "fuzz.json", "fuzz.txt"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char *bytes = malloc(size + 1);
        if (!bytes) return 0;
        memcpy(bytes, data, size);
        bytes[size] = 0;
        model_corpus c;
        if (model_corpus_parse(&c, names[k], bytes, size) != ZO_OK) continue; /* bytes freed there */
        FUZZ_ASSERT(c.n >= 1, "%s: no records", names[k]);
        for (size_t i = 0; i < c.n; i++) {
            FUZZ_ASSERT(strlen(c.text[i]) == c.len[i], "%s: record %zu cut at a NUL", names[k], i);
            FUZZ_ASSERT(!c.completion[i] || strlen(c.completion[i]) == c.clen[i], "%s: completion %zu cut", names[k], i);
            FUZZ_ASSERT(!i || c.line[i] > c.line[i - 1], "%s: record %zu on line %d after line %d", names[k], i,
                        c.line[i], c.line[i - 1]);
        }
        for (int pad = 0; pad < 2; pad++) {
            model_corpus_options o = {.add_special = 1, .eot = model_tokenizer_eot(tok),
                                      .packing = pad ? MODEL_PACK_PAD : MODEL_PACK_STREAM, .n_threads = 1};
            model_tokens t;
            if (model_corpus_tokenize(&c, tok, &o, model_tokenizer_vocab(tok), &t) != ZO_OK) continue;
            if (pad) check_rows(&t);
            else model_tokens_check_seq(&t, SEQ, NULL);
            model_tokens_close(&t);
        }
        model_corpus_free(&c);
    }
    return 0;
}
