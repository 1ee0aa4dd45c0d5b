/* Text corpora for training, tokenized with the model's tokenizer.
 *
 * The file's name picks its format, whatever its case. A .jsonl file holds
 * one JSON object per line (blank lines skipped; anything after the object
 * on its line is refused): documents {"text": ...}, or prompt/completion
 * pairs {"prompt": ..., "completion": ...} (the usual instruction-tuning
 * format), not both in one file. A .json file holds a JSON array of such
 * records (what json.dump of a list writes), or, when it does not start
 * with '[', one a line as a .jsonl file (Hugging Face datasets reads both).
 * A string holding \u0000 is refused (it would end the text there), and so
 * are records of known shapes this reader does not take (Alpaca's
 * instruction/input/output, chat messages), with a word on converting them.
 * Any other file is one document of UTF-8 text. Invalid UTF-8 is refused
 * with its byte offset in the file; every other refusal names the file and
 * the line (of an array's record: the line it starts on).
 *
 * Tokenized (model_corpus_tokenize), every document or pair becomes
 *     [post-processor prefix, e.g. <s>] tokens [end-of-text]
 * and a pair's prompt tokens are no targets: the loss counts on the
 * completion (and the end-of-text token) only. The pair is encoded as one
 * text, prompt + completion, so that tokens meet at the seam as they would
 * in running text; the prompt's share is the longest common prefix of that
 * and the prompt encoded alone (a token spanning the seam counts as
 * completion). Streams are cut into windows (packing), or each record is one
 * row, cut to the sequence and padded (padding). */
#ifndef ZO_MODEL_CORPUS_H
#define ZO_MODEL_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"  /* defines: zo_status */
#include "model/data.h"     /* defines: model_tokens */
#include "model/tokenizer.h" /* defines: model_tokenizer */

typedef enum model_corpus_kind {
    MODEL_CORPUS_TEXT = 0, /* documents */
    MODEL_CORPUS_PAIRS,    /* prompt/completion */
} model_corpus_kind;

typedef struct model_corpus {
    char *path;
    model_corpus_kind kind;
    size_t n;          /* documents or pairs */
    char **text;       /* [n] documents, or prompts */
    size_t *len;
    char **completion; /* [n] pairs only */
    size_t *clen;
    int *line;         /* [n] the JSONL line (1-based); 0 for a text file */
    char *whole;       /* the file's bytes (a text file's document points into it) */
    int json;          /* 1: the strings were decoded from JSON (owned) */
} model_corpus;

/* Read a corpus file (see above). ZO_ERR_FORMAT naming the file and line
 * for a malformed record, ZO_ERR_INVALID for invalid UTF-8 (byte offset). */
zo_status model_corpus_read(const char *path, model_corpus *c);
/* The same from `size` bytes already read (bytes[size] must be NUL), which
 * c takes over (freed by model_corpus_free, or here on failure); `path`
 * names them and picks the format. */
zo_status model_corpus_parse(model_corpus *c, const char *path, char *bytes, size_t size);
void model_corpus_free(model_corpus *c);

typedef enum model_packing {
    MODEL_PACK_STREAM = 0, /* records one after another, cut into windows */
    MODEL_PACK_PAD,        /* one record per row, cut to the sequence, padded */
} model_packing;

typedef struct model_corpus_options {
    int add_special;       /* the post-processor's special tokens around each record */
    int32_t eot;           /* appended after every record; -1: none */
    model_packing packing;
    int n_threads;         /* 0: OpenMP's default */
    int seq;               /* the sequence length batches will have (--seq); 0: not checked */
} model_corpus_options;

/* Tokenize a corpus into in-memory tokens (model_tokens_from_ids, named
 * after the file): a mask for pairs, rows with MODEL_PACK_PAD (padded with
 * the end-of-text token, else 0). vocab: the model's (ids must be below).
 * With o->seq, the tokens are checked for sequences of that length
 * (model_tokens_check_seq: a stream long enough, some completion token
 * left after the cut), so that data that would train on nothing is refused
 * here, naming the file, not run. */
zo_status model_corpus_tokenize(const model_corpus *c, const model_tokenizer *t,
                                const model_corpus_options *o, int vocab, model_tokens *out);

#endif
