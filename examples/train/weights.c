/* The weights in and out of the runtime, block by block (weights.h). */
#include "examples/train/weights.h"

#include <stdlib.h>
#include <sys/stat.h>

#include "model/lora.h"        /* defines: model_lora_save, model_lora_load */
#include "model/safetensors.h" /* defines: model_ckpt_open, model_load_streamed, model_save_streamed */

zo_status weights_write(void *user, const char *path, offload_block_reader read, void *ctx)
{
    const model_layout *l = user;
    return model_save_streamed(path, l, read, ctx, ZO_DTYPE_F32);
}

size_t weights_frozen_total(const tf_model *m)
{
    size_t n = 0;
    for (int b = 0; b < m->layout.n_blocks; b++) n += tf_frozen_bytes(m, b);
    return n;
}

/* Every block of `l` in turn, from a safetensors checkpoint (`path`: every
 * tensor of the model in it) or random from `seed`, handed to sink: host
 * memory holds one block, whatever the model's size. */
static zo_status stream_blocks(const model_layout *l, const char *path, uint64_t seed, model_block_sink sink,
                               void *ctx)
{
    size_t largest = 1;
    for (int b = 0; b < l->n_blocks; b++)
        if (l->block_numel[b] > largest) largest = l->block_numel[b];
    float *buf = malloc(largest * sizeof(float));
    if (!buf) return zo_error(ZO_ERR_NOMEM, "train: out of host memory for a block of %zu weights", largest);
    zo_status st = ZO_OK;
    if (path) {
        model_ckpt c;
        if ((st = model_ckpt_open(&c, path)) == ZO_OK) {
            st = model_load_streamed(&c, l, buf, ZO_DTYPE_F32, 0, NULL, sink, ctx);
            model_ckpt_close(&c);
        }
    } else {
        uint64_t rng = tf_init_rng(seed);
        for (int b = 0; b < l->n_blocks && st == ZO_OK; b++) {
            tf_init_block_weights(l, b, buf, &rng);
            st = sink(ctx, b, buf);
        }
    }
    free(buf);
    return st;
}

static zo_status set_block(void *ctx, int block, const void *buf)
{
    return offload_set_block(ctx, block, buf);
}

/* The frozen base of a block, packed (NF4 where QLoRA says) into its store. */
typedef struct base_sink {
    offload_t *rt;
    const tf_model *m;
    void *packed;
} base_sink;

static zo_status set_base_block(void *ctx, int block, const void *buf)
{
    base_sink *b = ctx;
    zo_status st = tf_frozen_pack(b->m, block, buf, b->packed);
    return st == ZO_OK ? offload_set_frozen_block(b->rt, block, b->packed) : st;
}

static void free_blocks(void **blocks, int n)
{
    for (int b = 0; blocks && b < n; b++) free(blocks[b]);
    free(blocks);
}

/* A zeroed fp32 buffer for each block of `l` (one float more, so that none
 * is empty); NULL when out of host memory. */
static void **alloc_blocks(const model_layout *l)
{
    void **blocks = calloc((size_t)l->n_blocks, sizeof *blocks);
    for (int b = 0; blocks && b < l->n_blocks; b++)
        if (!(blocks[b] = calloc(l->block_numel[b] + 1, sizeof(float)))) {
            free_blocks(blocks, l->n_blocks);
            return NULL;
        }
    return blocks;
}

/* LoRA: the frozen base block by block, then the adapters (small: every
 * block at once) from --adapter or PEFT's init. */
static zo_status load_lora(offload_t *rt, const tf_model *m, const train_args *a)
{
    const model_layout *ad = &m->adapters;
    size_t fbig = 1;
    for (int b = 0; b < m->layout.n_blocks; b++)
        if (tf_frozen_bytes(m, b) > fbig) fbig = tf_frozen_bytes(m, b);
    base_sink sink = {.rt = rt, .m = m, .packed = malloc(fbig)};
    if (!sink.packed) return zo_error(ZO_ERR_NOMEM, "train: out of host memory for a block of %zu bytes", fbig);
    zo_status st = stream_blocks(&m->layout, a->weights, (uint64_t)a->seed, set_base_block, &sink);
    free(sink.packed);
    if (st != ZO_OK) return st;
    void **blocks = alloc_blocks(ad);
    if (!blocks) return zo_error(ZO_ERR_NOMEM, "train: out of host memory for the adapters");
    if (a->adapter) {
        st = model_lora_load(a->adapter, ad, blocks, ZO_DTYPE_F32);
    } else {
        uint64_t rng = tf_init_rng((uint64_t)a->seed + 1);
        for (int b = 0; b < ad->n_blocks; b++) tf_init_lora_block(ad, b, blocks[b], &rng);
    }
    for (int b = 0; b < ad->n_blocks && st == ZO_OK; b++) st = offload_set_block(rt, b, blocks[b]);
    free_blocks(blocks, ad->n_blocks);
    return st;
}

zo_status weights_load(offload_t *rt, const tf_model *m, const train_args *a)
{
    if (a->lora.r) return load_lora(rt, m, a);
    return stream_blocks(&m->layout, a->weights, (uint64_t)a->seed, set_block, rt);
}

/* --model DIR: the adapter's base_model_name_or_path is the folder's name
 * (the model's, zo_model_config_load) */
static int is_dir(const char *p)
{
    struct stat sb;
    return p && stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* --save with LoRA: a PEFT adapter directory, written by rank 0 (every
 * rank reads the adapters: gathered when partitioned). */
static zo_status save_adapters(offload_t *rt, const tf_model *m, const train_args *a, int rank)
{
    const model_layout *ad = &m->adapters;
    void **blocks = alloc_blocks(ad);
    if (!blocks) return zo_error(ZO_ERR_NOMEM, "train: out of host memory for the adapters");
    zo_status st = ZO_OK;
    for (int b = 0; b < ad->n_blocks && st == ZO_OK; b++) st = offload_get_block(rt, b, blocks[b]);
    if (st == ZO_OK && rank == 0)
        st = model_lora_save(a->save, ad, &a->lora, is_dir(a->model) ? m->cfg.name : a->model,
                             (const void *const *)blocks, ZO_DTYPE_F32, ZO_DTYPE_F32);
    free_blocks(blocks, ad->n_blocks);
    return st;
}

zo_status weights_save(offload_t *rt, const tf_model *m, const train_args *a, int rank)
{
    if (a->lora.r) return save_adapters(rt, m, a, rank);
    return offload_write_weights(rt, a->save, weights_write, (void *)&m->layout);
}
