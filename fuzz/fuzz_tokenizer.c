/* tokenizer.json (model/tokenizer.h): model_tokenizer_load of the input as
 * a file (a memfd). A tokenizer that loads encodes fixed texts and the
 * input's own UTF-8 prefix, with and without its special tokens; every id
 * it makes is a token of the vocabulary, and what it made decodes. */
#include <string.h>

#include "fuzz/fuzz.h"
#include "model/tokenizer.h" /* defines: model_tokenizer_load, model_tokenizer_encode */
#include "model/unicode.h"   /* defines: model_utf8_check */

static void encode_decode(const model_tokenizer *t, model_tok_ctx *c, const char *text, size_t n)
{
    int vocab = model_tokenizer_vocab(t);
    for (int flags = 0; flags <= MODEL_TOK_ADD_SPECIAL; flags += MODEL_TOK_ADD_SPECIAL) {
        model_ids ids = {0};
        if (model_tokenizer_encode(c, text, n, flags, &ids) == ZO_OK) {
            for (size_t i = 0; i < ids.n; i++)
                FUZZ_ASSERT(ids.v[i] >= 0 && ids.v[i] < vocab, "id %d at %zu outside the vocabulary of %d",
                            ids.v[i], i, vocab);
            char *out = NULL;
            size_t on;
            zo_status st = model_tokenizer_decode(t, ids.v, ids.n, MODEL_TOK_SKIP_SPECIAL, &out, &on);
            FUZZ_ASSERT(st == ZO_OK, "the ids encode made do not decode: %s", zo_last_error());
            free(out);
        }
        model_ids_free(&ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const texts[] = {
        "Hello, world! It's 2024: 1234567 tokens.", "  spaces\tand\nlines\r\n\n  ",
        "\xc3\xbc" "n" "\xc3\xaf" "c" "\xc3\xb6" "d" "\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82", /* üïcödé, CJK, emoji */
        "<|endoftext|></s><s><unk> x", "'s'll'VE don't",
    };
    char path[64];
    int fd = fuzz_input_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    model_tokenizer *t = NULL;
    model_tok_ctx *c = NULL;
    if (model_tokenizer_load(path, &t) == ZO_OK && model_tok_ctx_new(t, &c) == ZO_OK) {
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) encode_decode(t, c, texts[i], strlen(texts[i]));
        size_t n = size < 512 ? size : 512; /* the input as text too: its valid UTF-8 prefix */
        encode_decode(t, c, (const char *)data, model_utf8_check((const char *)data, n));
    }
    model_tok_ctx_free(c);
    model_tokenizer_free(t);
    close(fd);
    return 0;
}
