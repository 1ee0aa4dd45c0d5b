/* A Hugging Face tokenizer.json read and applied as the `tokenizers` library
 * does, for the BPE tokenizers of the families the transformer supports:
 *
 * - byte-level BPE (GPT-2, LLaMA-3, Qwen2): the ByteLevel pre-tokenizer
 *   with GPT-2's pattern, or a Split with the LLaMA-3 or Qwen2 pattern then
 *   ByteLevel; the NFC normalizer (Qwen2); `ignore_merges` (LLaMA-3);
 * - SentencePiece-style BPE (LLaMA-2, Mistral): the Prepend("▁") and
 *   Replace(" " -> "▁") normalizers or the Metaspace pre-tokenizer, byte
 *   fallback (<0xXX> tokens), unk and fuse_unk;
 * - added tokens (`added_tokens`): split out of the text first, longest
 *   match leftmost, with their lstrip/rstrip and normalized flags;
 * - post-processors ByteLevel, TemplateProcessing (the single-sequence
 *   template, e.g. LLaMA-2's <s>), Roberta/Bert, Sequence; decoders
 *   ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence.
 *
 * Anything else (another model type, a pattern other than those three, a
 * normalizer such as NFKC or Lowercase, BPE dropout, single_word tokens) is
 * refused by name when the file is loaded, never approximated.
 *
 * The pre-tokenization patterns are matched by code written for each (not a
 * regex engine); \s is Unicode White_Space (as Oniguruma has it), \p{L} and
 * \p{N} come from model/unicode.h.
 *
 * Threading: a loaded tokenizer is read-only and shared; each thread encodes
 * with its own model_tok_ctx (the word cache and scratch buffers). */
#ifndef ZO_MODEL_TOKENIZER_H
#define ZO_MODEL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h" /* defines: zo_status */

typedef struct model_tokenizer model_tokenizer;
typedef struct model_tok_ctx model_tok_ctx;

/* A growable array of token ids. */
typedef struct model_ids {
    int32_t *v;
    size_t n, cap;
} model_ids;

zo_status model_ids_reserve(model_ids *a, size_t extra);
static inline zo_status model_ids_push(model_ids *a, int32_t id)
{
    if (a->n == a->cap) {
        zo_status st = model_ids_reserve(a, 1);
        if (st != ZO_OK) return st;
    }
    a->v[a->n++] = id;
    return ZO_OK;
}
void model_ids_free(model_ids *a);

/* Read tokenizer.json. ZO_ERR_FORMAT for a malformed file,
 * ZO_ERR_UNSUPPORTED for a component this reader does not implement (the
 * message names it and its field). */
zo_status model_tokenizer_load(const char *path, model_tokenizer **out);
void model_tokenizer_free(model_tokenizer *t);

/* The largest token id + 1 (model vocabulary and added tokens). */
int model_tokenizer_vocab(const model_tokenizer *t);
/* "byte-level BPE" or "SentencePiece BPE". */
const char *model_tokenizer_kind(const model_tokenizer *t);
/* The id of a token spelled as in the file (an added token's content, or a
 * vocabulary entry), or -1. */
int32_t model_tokenizer_token_id(const model_tokenizer *t, const char *token);
/* The end-of-text token documents are separated by: the first special added
 * token of <|endoftext|>, <|end_of_text|>, </s>, <eos>, <|im_end|>; -1 when
 * none. */
int32_t model_tokenizer_eot(const model_tokenizer *t);
/* 1 when the id is a special added token. */
int model_tokenizer_is_special(const model_tokenizer *t, int32_t id);

/* Per-thread encoding state. */
zo_status model_tok_ctx_new(const model_tokenizer *t, model_tok_ctx **out);
void model_tok_ctx_free(model_tok_ctx *c);

enum {
    /* encode: add the post-processor's special tokens (e.g. LLaMA-2's <s>),
     * as Hugging Face's add_special_tokens=True */
    MODEL_TOK_ADD_SPECIAL = 1,
    /* decode: leave special added tokens out (skip_special_tokens=True) */
    MODEL_TOK_SKIP_SPECIAL = 2,
};

/* Encode UTF-8 text[0..n), appending the ids to *out. Invalid UTF-8 is
 * refused (ZO_ERR_INVALID naming the byte offset of the first bad byte). */
zo_status model_tokenizer_encode(model_tok_ctx *c, const char *text, size_t n, int flags,
                                 model_ids *out);

/* Decode ids through the file's decoder into a new NUL-terminated buffer
 * (*out, *out_n; the caller frees). decode(encode(x)) == x for valid UTF-8
 * x, special tokens skipped, unless x holds an added token's text (or, with
 * the SentencePiece legacy normalizer, starts with one). ZO_ERR_INVALID for
 * an id with no token. */
zo_status model_tokenizer_decode(const model_tokenizer *t, const int32_t *ids, size_t n, int flags,
                                 char **out, size_t *out_n);

/* Encode n_docs documents on n_threads threads (0: OpenMP's default), each
 * into docs_out[i] (appended), followed by `append_id` when >= 0. On
 * failure the message names the document's index. */
zo_status model_tokenizer_encode_many(const model_tokenizer *t, const char *const *docs,
                                      const size_t *lens, size_t n_docs, int flags,
                                      int32_t append_id, int n_threads, model_ids *docs_out);

#endif
