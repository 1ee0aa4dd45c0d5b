/* Training data: token files and a deterministic batch sampler.
 *
 * Token files are nanoGPT-style: raw little-endian uint16 ids (uint32 with
 * MODEL_TOKENS_U32), no header, memory-mapped for model_tokens_get and
 * model_tokens_check; batches read their windows with pread, so a file cut
 * short while in use is an error naming it (ZO_ERR_IO), not a SIGBUS. A plain text file can be used
 * directly with the byte-level tokenizer (MODEL_TOKENS_BYTES: every byte is a
 * token 0..255), or encoded to a uint16 token file once.
 *
 * The `tokenize` program writes beside FILE.bin a side file FILE.bin.json
 * saying how to read it (model_tokens_info); a token file without one is
 * read as the caller says (uint16 unless told otherwise), as before.
 *
 * Tokens may also live in memory (model_tokens_from_ids: a corpus
 * tokenized on the fly), with a mask of the tokens that count as targets
 * (prompt/completion data: the loss counts on completions only) and rows
 * (one record per row, padded, instead of a stream cut into windows).
 *
 * Token ids are checked against the vocabulary where they are read (each
 * window a batch uses), so a huge file is never scanned in full unless the
 * caller asks (model_tokens_check over the whole range). */
#ifndef ZO_MODEL_DATA_H
#define ZO_MODEL_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h" /* defines: zo_status */

/* Bytes per token in the file. */
typedef enum model_token_width {
    MODEL_TOKENS_BYTES = 1, /* a text file; byte-level tokens 0..255 */
    MODEL_TOKENS_U16 = 2,
    MODEL_TOKENS_U32 = 4,
} model_token_width;

#define MODEL_BYTE_VOCAB 256

typedef struct model_tokens {
    char *path;
    int fd;
    const uint8_t *map; /* the whole file, read-only (or the owned buffer) */
    size_t map_size;
    uint64_t n;         /* tokens in the file */
    model_token_width width;
    int vocab;          /* every id must be < vocab */
    uint8_t *owned;     /* in-memory tokens (model_tokens_from_ids), freed by close */
    uint8_t *mask;      /* NULL, or [n]: 0 where token i is not a target (owned) */
    uint64_t *rows;     /* NULL, or [n_rows + 1]: row r is tokens [rows[r], rows[r+1]) (owned) */
    uint64_t n_rows;
    int32_t pad_id;     /* the input of a padded position */
} model_tokens;

/* Map a token file. ZO_ERR_FORMAT when its size is not a multiple of the
 * token width; ZO_ERR_INVALID when vocab < 1 (or < 256 for byte tokens). */
zo_status model_tokens_open(model_tokens *t, const char *path, model_token_width width, int vocab);
void model_tokens_close(model_tokens *t);

/* Tokens in memory: ids[0..n) (every id in [0, vocab)), taken over (freed
 * by model_tokens_close, as are mask and rows when given). `name` names
 * them in messages. mask: NULL or [n], 0 where token i is not a target.
 * rows: NULL or [n_rows + 1] offsets, each row one padded sequence. */
zo_status model_tokens_from_ids(model_tokens *t, const char *name, uint32_t *ids, uint64_t n,
                                int vocab, uint8_t *mask, uint64_t *rows, uint64_t n_rows,
                                int32_t pad_id);

/* Token i (no bounds check). */
static inline uint32_t model_tokens_get(const model_tokens *t, uint64_t i)
{
    const uint8_t *p = t->map + i * (uint64_t)t->width;
    switch (t->width) {
    case MODEL_TOKENS_BYTES: return p[0];
    case MODEL_TOKENS_U16: return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    default: return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    }
}

/* Check ids in [first, first + count) are < vocab; ZO_ERR_FORMAT naming the
 * file, the token position and its byte offset otherwise. */
zo_status model_tokens_check(const model_tokens *t, uint64_t first, uint64_t count);

/* Whether batches of sequences of T tokens can be cut from t and train on
 * something, checked once where the data is prepared rather than found at
 * a step: a stream (no rows) must hold at least T + 2 tokens, and some
 * target must survive the cut: a padded row is its record cut to T + 1
 * tokens, so a prompt that fills them leaves no completion token to learn.
 * ZO_ERR_INVALID naming the file and the reason: "<file>: every record's
 * completion is cut off by --seq 64: the shortest prompt takes 70 tokens
 * (--seq 70 or more keeps a completion token of it)". *rows_cut (may be
 * NULL) gets how many padded rows keep no target (0 for a stream). */
zo_status model_tokens_check_seq(const model_tokens *t, int T, uint64_t *rows_cut);

/* ---- batches -------------------------------------------------------------- */

typedef enum model_sample {
    /* Row i of step k starts at ((k*B + i) * T) mod (N - T - 1): the file is
     * walked in order (the `train` contract). The seed is not used. */
    MODEL_SAMPLE_SEQUENTIAL = 0,
    /* Row i of step k starts at a pseudo-random offset in [0, N - T - 1)
     * drawn from (seed, k, i) alone, so any step can be reproduced alone. */
    MODEL_SAMPLE_RANDOM,
} model_sample;

/* The window start of row `row` at `step` (see model_sample). */
uint64_t model_batch_offset(const model_tokens *t, int B, int T, int64_t step, int row,
                            uint64_t seed, model_sample mode);

/* Fill one (B, T) batch: inputs[b*T + j] = tok[off_b + j] and
 * targets[b*T + j] = tok[off_b + j + 1], from a (B, T+1) window per row.
 * ZO_ERR_INVALID when the file holds fewer than T + 2 tokens; ZO_ERR_FORMAT
 * for an id >= vocab (naming the file and position); ZO_ERR_IO when the file
 * no longer holds a window (cut short since it was opened), naming it.
 * With a mask, a target whose token is masked is -1 (ignored by the loss).
 * With rows, row i of step k is record (k*B + i) mod n_rows, cut to T + 1
 * tokens: inputs past its end are pad_id and their targets -1. */
zo_status model_batch_get(const model_tokens *t, int B, int T, int64_t step, uint64_t seed,
                          model_sample mode, int32_t *inputs, int32_t *targets);

/* ---- token files with a side file ----------------------------------------------- */

/* FILE.json beside a token file FILE (written by `tokenize`):
 * {"format": "zoffload-tokens", "version": 1, "dtype": "uint16"|"uint32",
 *  "vocab": N, "eot": ID, "documents": D, "tokens": T, "tokenizer": PATH} */
typedef struct model_tokens_info {
    model_token_width width; /* U16 or U32 */
    int vocab;               /* the tokenizer's ids: every id < vocab */
    int32_t eot;             /* the document separator, -1 when none */
    uint64_t documents, tokens;
    char tokenizer[512];     /* the tokenizer.json it was made with */
} model_tokens_info;

/* The side file of token file `path`: *found 0 (and ZO_OK) when there is
 * none; ZO_ERR_FORMAT naming the file and field when it is malformed. */
zo_status model_tokens_info_read(const char *path, model_tokens_info *info, int *found);

/* The width a vocabulary needs: U16 up to 65536 ids, else U32. */
model_token_width model_tokens_width_for(int vocab);

/* Writing a token file and its side file, atomically. */
typedef struct model_tokens_writer {
    void *file;              /* zo_file_writer */
    char *path;
    model_token_width width;
    int vocab;
    uint64_t n;
    uint8_t *buf;
    size_t buf_cap;
} model_tokens_writer;

zo_status model_tokens_writer_open(model_tokens_writer *w, const char *path, model_token_width width,
                                   int vocab);
/* Append ids (each in [0, vocab)). */
zo_status model_tokens_writer_append(model_tokens_writer *w, const int32_t *ids, size_t n);
/* Commit the token file, then write the side file from *info (its width,
 * vocab and token count are the writer's). */
zo_status model_tokens_writer_commit(model_tokens_writer *w, const model_tokens_info *info);
void model_tokens_writer_abort(model_tokens_writer *w);

/* ---- byte-level tokenizer -------------------------------------------------- */

/* Encode a text file as a token file (every byte one token) of the given
 * width (U16 or U32), written atomically. *n_tokens (may be NULL) gets the
 * count. */
zo_status model_bytes_encode_file(const char *text_path, const char *tokens_path,
                                  model_token_width width, uint64_t *n_tokens);

/* Decode ids to bytes: out gets n bytes and a terminating NUL (cap >= n + 1).
 * ZO_ERR_INVALID for an id > 255 (naming its index). */
zo_status model_bytes_decode(const int32_t *ids, size_t n, char *out, size_t cap);

#endif
