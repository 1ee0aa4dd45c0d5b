#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h" /* defines: zo_file_open_regular, zo_file_create, zo_file_commit */

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

void model_tokens_close(model_tokens *t)
{
    if (t->map) munmap((void *)t->map, t->map_size);
    if (t->fd >= 0) close(t->fd);
    free(t->path);
    memset(t, 0, sizeof *t);
    t->fd = -1;
}

zo_status model_tokens_check(const model_tokens *t, uint64_t first, uint64_t count)
{
    if (first > t->n || count > t->n - first)
        return zo_error(ZO_ERR_INVALID, "%s: tokens [%llu, %llu) beyond the %llu in the file",
                        t->path, (unsigned long long)first, (unsigned long long)(first + count),
                        (unsigned long long)t->n);
    for (uint64_t i = first; i < first + count; i++) {
        uint32_t id = model_tokens_get(t, i);
        if (id >= (uint32_t)t->vocab)
            return zo_error(ZO_ERR_FORMAT,
                            "%s: token %llu (byte offset %llu) is %u, outside the vocabulary "
                            "of %d",
                            t->path, (unsigned long long)i,
                            (unsigned long long)(i * (uint64_t)t->width), id, t->vocab);
    }
    return ZO_OK;
}

/* splitmix64: a full-period 64-bit mixer, enough for picking offsets. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

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

zo_status model_batch_get(const model_tokens *t, int B, int T, int64_t step, uint64_t seed,
                          model_sample mode, int32_t *inputs, int32_t *targets)
{
    if (B < 1 || T < 1 || step < 0)
        return zo_error(ZO_ERR_INVALID, "%s: batch %d x %d at step %lld", t->path, B, T,
                        (long long)step);
    if (t->n < (uint64_t)T + 2)
        return zo_error(ZO_ERR_INVALID,
                        "%s: %llu tokens are too few for sequences of %d (need at least %d)",
                        t->path, (unsigned long long)t->n, T, T + 2);
    for (int b = 0; b < B; b++) {
        uint64_t off = model_batch_offset(t, B, T, step, b, seed, mode);
        /* the (T+1)-token window: inputs are its first T, targets its last T */
        zo_status st = model_tokens_check(t, off, (uint64_t)T + 1);
        if (st) return st;
        int32_t *in = inputs + (size_t)b * (size_t)T;
        int32_t *tg = targets + (size_t)b * (size_t)T;
        for (int j = 0; j < T; j++) {
            in[j] = (int32_t)model_tokens_get(t, off + (uint64_t)j);
            tg[j] = (int32_t)model_tokens_get(t, off + (uint64_t)j + 1);
        }
    }
    return ZO_OK;
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
