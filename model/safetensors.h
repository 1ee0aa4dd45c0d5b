/* safetensors files: reading, writing, and loading/saving a model layout.
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]},
 * ..., "__metadata__": {"format": "pt"}}), then the data section; offsets are
 * bytes into the data section, which the tensors cover exactly, without
 * overlaps or holes. A sharded checkpoint adds model.safetensors.index.json
 * whose "weight_map" names the shard file of every tensor.
 *
 * Files are fully validated when opened, before any tensor byte is touched:
 * every malformed or truncated file gives ZO_ERR_FORMAT with a message naming
 * the file and the tensor, never a crash. Tensors are read (pread), never
 * mapped: a file cut short after it was opened (rewritten by another process,
 * a copy still under way) is ZO_ERR_FORMAT naming the file and the tensor
 * where a mapping would raise SIGBUS and end the run without a word; and the
 * process's memory never grows with the file. Files are written atomically
 * (temporary file, fsync, rename; common/fileio.h). */
#ifndef ZO_MODEL_SAFETENSORS_H
#define ZO_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"  /* defines: zo_dtype */
#include "common/status.h" /* defines: zo_status */
#include "layout.h"        /* defines: model_layout */

#define MODEL_ST_MAX_DIMS 8
#define MODEL_ST_MAX_HEADER (100u << 20) /* as the reference implementation */

/* ---- one file ------------------------------------------------------------ */

typedef struct model_st_tensor {
    char *name;
    char dtype_name[8];  /* as in the header: "F32", "F16", "BF16", "I64", ... */
    int dtype;           /* zo_dtype for F32/F16/BF16, -1 for other element types */
    size_t elem_size;    /* bytes per element */
    int ndim;
    int64_t shape[MODEL_ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end; /* byte range in the data section */
} model_st_tensor;

typedef struct model_st_file {
    char *path;
    int fd;                    /* read-only */
    uint64_t file_size;        /* when opened */
    uint64_t data_start;       /* 8 + header length */
    int n_tensors;
    model_st_tensor *tensors;  /* sorted by name */
} model_st_file;

/* Open and validate a .safetensors file. */
zo_status model_st_open(model_st_file *f, const char *path);
void model_st_close(model_st_file *f);

/* The tensor with this exact name, or NULL. */
const model_st_tensor *model_st_find(const model_st_file *f, const char *name);

/* The tensor's bytes as stored (end - begin of them) into dst. A file that
 * ends before them now is ZO_ERR_FORMAT "<path>: tensor "<name>": the file
 * ends at byte N ...: truncated after it was opened"; a read error ZO_ERR_IO. */
zo_status model_st_read_raw(const model_st_file *f, const model_st_tensor *t, void *dst);

/* Copy a tensor into dst (numel elements of `dt`), converting with
 * round-to-nearest-even (through a bounded buffer, MODEL_ST_READ_CHUNK bytes
 * of the file at a time). With `transpose`, a 2-D [r, c] tensor is written as
 * [c, r]. ZO_ERR_UNSUPPORTED for element types other than F32/F16/BF16
 * (FP8 weights are read with their scales: model_st_read_fp8; MXFP4 ones
 * with theirs: model_st_read_mxfp4); a file cut
 * short as model_st_read_raw says. */
#define MODEL_ST_READ_CHUNK (4u << 20)
zo_status model_st_read(const model_st_file *f, const model_st_tensor *t, void *dst, zo_dtype dt,
                        int transpose);

/* An FP8 block-quantized weight (quantization_config "fp8": DeepSeek-V3/R1,
 * Kimi-K2 as published) dequantized into dst as it is read: t is a 2-D
 * [rows, cols] F8_E4M3 (or F8_E5M2) tensor of file f, s its `_scale_inv`
 * (F32, F16 or BF16) of file sf, shaped [ceil(rows / block[0]),
 * ceil(cols / block[1])] (a block past the edge is cut short: its scale
 * covers the rows and columns that exist), and
 *     w[i][j] = fp8(t[i][j]) * s[i / block[0]][j / block[1]]
 * (multiplied, whatever "inverse" says) computed exactly in double and
 * rounded once, to nearest even, into `dt` ([cols, rows] with transpose).
 * FP8 is decoded as OCP's OFP8: E4M3 with bias 7, no infinities and
 * S.1111.111 NaN; E5M2 as IEEE half's top byte. A NaN code, an infinite
 * one, or a non-finite product is ZO_ERR_FORMAT naming the element; a
 * scale of the wrong shape or dtype, or a block that is not two positive
 * ints, ZO_ERR_FORMAT naming the file and both tensors. Host memory: the
 * scales and MODEL_ST_READ_CHUNK bytes of the weight. */
#define MODEL_FP8_BLOCK 128 /* weight_block_size's default, both dimensions */
zo_status model_st_read_fp8(const model_st_file *f, const model_st_tensor *t, const model_st_file *sf,
                            const model_st_tensor *s, const int block[2], void *dst, zo_dtype dt,
                            int transpose);

/* The value of FP8 code `code` (E4M3 when e4m3, else E5M2) as OCP's OFP8
 * defines it: NaN for the NaN codes, +-inf for E5M2's infinities. */
double model_fp8_decode(uint8_t code, int e4m3);

/* An MXFP4 weight (OCP Microscaling; quantization_config "mxfp4": gpt-oss
 * as published) dequantized into dst as it is read. The file stores a
 * weight X of shape [..., C, R] as two U8 tensors:
 *     b = X_blocks [..., R, C / 32, 16]: two E2M1 codes a byte, the low
 *         nibble first (element 2 j of a 32-value block), the high second;
 *     s = X_scales [..., R, C / 32]: E8M0 exponents, one a block,
 * which decode to D [..., R, C] with
 *     D[..., r, 32 g + 2 j]     = e2m1(b[..., r, g, j] & 15) * 2^(s[..., r, g] - 127)
 *     D[..., r, 32 g + 2 j + 1] = e2m1(b[..., r, g, j] >> 4) * 2^(s[..., r, g] - 127)
 * and X is D transposed over its last two dimensions (as Hugging Face
 * dequantizes gpt-oss's experts: gate_up_proj [E, h, 2 I] from blocks
 * [E, 2 I, h / 32, 16], down_proj [E, I, h] from [E, h, I / 32, 16]).
 * E2M1 is sign, 2 exponent bits (bias 1), 1 mantissa bit: 0, 0.5, 1, 1.5,
 * 2, 3, 4, 6 and their negatives; E8M0 255 is NaN. Elements [first,
 * first + count) of X in row-major order are written to dst in `dt`
 * (with transpose, of D [..., R, C]: each matrix of X transposed back,
 * a weight held as [out, in] that the file's X stores as [in, out]; one
 * value at a time, not in tiles), each the exact
 * product rounded once, to nearest even (exact in BF16 and F32 but past
 * their range; F16 rounds below 2^-14). A blocks tensor that is not U8 or
 * not [..., R, G, 16], scales that are not U8 [..., R, G], a scale of 255, a
 * product past dt's largest (inf), or a range outside X is refused,
 * naming the file, the tensor and the element. Host memory: about
 * MODEL_ST_READ_CHUNK bytes of blocks and their scales. */
#define MODEL_MXFP4_BLOCK 32 /* values an E8M0 scale covers */
zo_status model_st_read_mxfp4(const model_st_file *f, const model_st_tensor *b, const model_st_file *sf,
                              const model_st_tensor *s, uint64_t first, uint64_t count, void *dst, zo_dtype dt,
                              int transpose);

/* X's shape from its blocks' (model_st_read_mxfp4): its dimensions, or -1
 * when b is not [..., R, G, 16] with at least one R and G. */
int model_mxfp4_shape(const model_st_tensor *b, int64_t shape[MODEL_ST_MAX_DIMS]);

/* ---- writing ------------------------------------------------------------- */

/* Produce elements [first, first + count) of tensor `index` (row-major, in the
 * entry's dtype) into dst. */
typedef zo_status (*model_st_fill_fn)(void *ctx, int index, uint64_t first, uint64_t count,
                                      void *dst);

typedef struct model_st_entry {
    const char *name;
    zo_dtype dtype;                   /* stored element type */
    int ndim;
    int64_t shape[MODEL_ST_MAX_DIMS];
    const void *data;                 /* numel elements of dtype, or NULL to call fill */
} model_st_entry;

/* Write entries (in the given order) to `path` atomically, with
 * "__metadata__": {"format": "pt"}. `fill` may be NULL when every entry has
 * data. */
zo_status model_st_write(const char *path, const model_st_entry *entries, int n,
                         model_st_fill_fn fill, void *ctx);

/* The same file written piece by piece, in any order: open writes the
 * header (entries' data is not used), put writes elements [first, first +
 * count) of tensor `index` from src (in the entry's dtype), commit checks
 * that every byte was put and renames the file into place. Both commit and
 * abort free the writer. */
typedef struct model_st_writer model_st_writer;
zo_status model_st_writer_open(model_st_writer **w, const char *path, const model_st_entry *entries,
                               int n);
zo_status model_st_writer_put(model_st_writer *w, int index, uint64_t first, uint64_t count,
                              const void *src);
zo_status model_st_writer_commit(model_st_writer *w);
void model_st_writer_abort(model_st_writer *w);

/* ---- checkpoints: one file, a sharded index, or a directory --------------- */

typedef struct model_ckpt_entry {
    const char *name;             /* points into the file's tensor */
    int file;                     /* index into model_ckpt.files */
    const model_st_tensor *tensor;
} model_ckpt_entry;

typedef struct model_ckpt {
    char *path;                   /* what was opened */
    int n_files;
    model_st_file *files;
    int n_entries;
    model_ckpt_entry *entries;    /* every tensor of every file, sorted by name */
} model_ckpt;

/* `path` is a .safetensors file, a model.safetensors.index.json, or a
 * directory holding one of them (the index is preferred). Every shard the
 * index names is opened and validated; a tensor whose shard does not hold it,
 * or a name held by two shards, is ZO_ERR_FORMAT. */
zo_status model_ckpt_open(model_ckpt *c, const char *path);
void model_ckpt_close(model_ckpt *c);

/* The entry with this exact name, or NULL. */
const model_ckpt_entry *model_ckpt_find(const model_ckpt *c, const char *name);

/* ---- loading and saving a layout ----------------------------------------- */

enum {
    MODEL_LOAD_ALLOW_MISSING = 1u << 0, /* leave tensors the checkpoint lacks untouched */
    MODEL_LOAD_STRICT = 1u << 1,        /* unexpected checkpoint tensors are an error */
};

typedef struct model_load_report {
    int n_loaded;              /* layout tensors filled */
    int n_missing;             /* layout tensors the checkpoint lacks */
    int n_unexpected;          /* checkpoint tensors that match nothing */
    int n_ignored;             /* buffers skipped: attention masks, rotary inv_freq, tied lm_head;
                                  FP8 weights' _scale_inv and MXFP4 weights' _blocks and
                                  _scales (read with their weight); the routed
                                  experts outside the layout's window (other ranks') */
    char first_missing[MODEL_TENSOR_NAME_MAX];
    char first_unexpected[MODEL_TENSOR_NAME_MAX];
} model_load_report;

/* The layout tensor a checkpoint name refers to (GPT-2: with or without the
 * "transformer." prefix), or NULL; *ignored is set to 1 for names that are
 * known buffers rather than parameters. */
const model_tensor *model_layout_match_hf(const model_layout *l, const char *hf_name,
                                          int *ignored);

/* Fill one block buffer (l->block_numel[block] elements of `dt`) from an open
 * checkpoint: names are matched, shapes checked against the layout (Conv1D
 * weights transposed), dtypes converted, FP8 weights dequantized with their
 * `<name>_scale_inv` (model_st_read_fp8; blocks of l->cfg.fp8_block, 128 x
 * 128 by default), a weight the file holds as `<name>_blocks` and
 * `<name>_scales` in its stead dequantized as MXFP4 (model_st_read_mxfp4;
 * only under l->cfg.quant_method "mxfp4", never for a module of
 * l->cfg.quant_keep). Missing tensors are an error
 * (ZO_ERR_NOT_FOUND naming the first) unless MODEL_LOAD_ALLOW_MISSING. The
 * report (may be NULL) is added to, not cleared. */
zo_status model_load_block(const model_ckpt *c, const model_layout *l, int block, void *buf,
                           zo_dtype dt, unsigned flags, model_load_report *rep);

/* Fill every block (blocks[b] for b < l->n_blocks) and account for the
 * checkpoint tensors that matched nothing (an error only with
 * MODEL_LOAD_STRICT, found before any block is read). The report (may be
 * NULL) is cleared first. */
zo_status model_load(const model_ckpt *c, const model_layout *l, void *const *blocks,
                     zo_dtype dt, unsigned flags, model_load_report *rep);

/* Open `path` (see model_ckpt_open), load, close. */
zo_status model_load_path(const char *path, const model_layout *l, void *const *blocks,
                          zo_dtype dt, unsigned flags, model_load_report *rep);

/* Receives block `block`'s buffer once it is filled. */
typedef zo_status (*model_block_sink)(void *ctx, int block, const void *buf);

/* model_load one block at a time through one buffer (the largest block's
 * elements of `dt`): each block is filled (zeros where the checkpoint lacks
 * a tensor and MODEL_LOAD_ALLOW_MISSING is set) and handed to sink before
 * the next is read (the files are read, not mapped), so host memory holds
 * one block whatever the model's size. */
zo_status model_load_streamed(const model_ckpt *c, const model_layout *l, void *buf, zo_dtype dt,
                              unsigned flags, model_load_report *rep, model_block_sink sink,
                              void *ctx);

/* Write the model as one safetensors file with Hugging Face names and layout
 * (Conv1D weights back to [in, out]; no lm_head.weight when tied), converting
 * the block buffers (dtype buf_dt) to file_dt. */
zo_status model_save(const char *path, const model_layout *l, const void *const *blocks,
                     zo_dtype buf_dt, zo_dtype file_dt);

/* Reads block b's fp32 weights into dst (l->block_numel[b] floats). */
typedef zo_status (*model_block_read_fn)(void *ctx, int block, float *dst);

/* model_save with the weights read one block at a time (fp32) through
 * read(ctx, b, dst): host memory holds one block. */
zo_status model_save_streamed(const char *path, const model_layout *l, model_block_read_fn read,
                              void *ctx, zo_dtype file_dt);
/* The same for the layout's tensors [first, first + n) alone (a shard of a
 * sharded checkpoint: model/hf.h). */
zo_status model_save_streamed_range(const char *path, const model_layout *l, int first, int n,
                                    model_block_read_fn read, void *ctx, zo_dtype file_dt);
/* The same with `n_extra` tensors held apart appended after the range's
 * (their data given: DeepSeek-V3's fp32 router score corrections, which no
 * block holds). */
zo_status model_save_streamed_extra(const char *path, const model_layout *l, int first, int n,
                                    model_block_read_fn read, void *ctx, zo_dtype file_dt,
                                    const model_st_entry *extra, int n_extra);

#endif
