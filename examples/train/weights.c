/* The weights in and out of the runtime, block by block (weights.h). */
#include "examples/train/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "common/clock.h"      /* defines: zo_now */
#include "model/hf.h"          /* defines: model_hf_folder, model_hf_save */
#include "model/lora.h"        /* defines: model_lora_save, model_lora_load */
#include "model/safetensors.h" /* defines: model_save_streamed */

weights_ckpt weights_ckpt_of(const tf_model *m, const train_args *a)
{
    weights_ckpt w = {.l = a->lora.r ? &m->adapters : &m->layout};
    if (!a->lora.r) w.extra = tf_router_bias_entries(m, &w.n_extra);
    return w;
}

zo_status weights_write(void *user, const char *path, offload_block_reader read, void *ctx)
{
    const weights_ckpt *w = user;
    return model_save_streamed_extra(path, w->l, 0, w->l->n_tensors, read, ctx, ZO_DTYPE_F32, w->extra,
                                     w->n_extra);
}

zo_status weights_resume(const tf_model *m, const train_args *a)
{
    int n;
    if (a->lora.r || !tf_router_bias_entries(m, &n)) return ZO_OK;
    char dir[4096], path[4200];
    zo_status st = offload_ckpt_resolve(a->resume, dir, sizeof dir);
    if (st != ZO_OK) return st;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return tf_load_router_bias(m, path);
}

size_t weights_frozen_total(const tf_model *m)
{
    size_t n = 0;
    for (int b = 0; b < m->layout.n_blocks; b++) n += tf_frozen_bytes(m, b);
    return n;
}

/* The largest block of the frozen base, bytes. */
static size_t weights_frozen_largest(const tf_model *m)
{
    size_t n = 1;
    for (int b = 0; b < m->layout.n_blocks; b++)
        if (tf_frozen_bytes(m, b) > n) n = tf_frozen_bytes(m, b);
    return n;
}

static zo_status set_block(void *ctx, int block, const void *buf)
{
    return offload_set_block(ctx, block, buf);
}

/* A block sink timed: the seconds spent in it add to *seconds. */
typedef struct timed_sink {
    model_block_sink sink;
    void *ctx;
    double *seconds;
} timed_sink;

static zo_status timed_block(void *ctx, int block, const void *buf)
{
    timed_sink *t = ctx;
    double t0 = zo_now();
    zo_status st = t->sink(t->ctx, block, buf);
    *t->seconds += zo_now() - t0;
    return st;
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
static zo_status load_lora(offload_t *rt, const tf_model *m, const train_args *a, double *into_s)
{
    const model_layout *ad = &m->adapters;
    size_t fbig = weights_frozen_largest(m);
    base_sink sink = {.rt = rt, .m = m, .packed = malloc(fbig)};
    if (!sink.packed) return zo_error(ZO_ERR_NOMEM, "train: out of host memory for a block of %zu bytes", fbig);
    timed_sink ts = {.sink = set_base_block, .ctx = &sink, .seconds = into_s};
    zo_status st = tf_load_blocks(&m->layout, a->weights, (uint64_t)a->seed, timed_block, &ts);
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
    double t0 = zo_now();
    for (int b = 0; b < ad->n_blocks && st == ZO_OK; b++) st = offload_set_block(rt, b, blocks[b]);
    *into_s += zo_now() - t0;
    free_blocks(blocks, ad->n_blocks);
    return st;
}

zo_status weights_load(offload_t *rt, const tf_model *m, const train_args *a, double *into_s)
{
    *into_s = 0;
    zo_status st = tf_load_router_bias(m, a->weights);
    if (st != ZO_OK) return st;
    if (a->lora.r) return load_lora(rt, m, a, into_s);
    timed_sink ts = {.sink = set_block, .ctx = rt, .seconds = into_s};
    return tf_load_blocks(&m->layout, a->weights, (uint64_t)a->seed, timed_block, &ts);
}

/* --model DIR: the adapter's base_model_name_or_path is the folder's name
 * (the model's, zo_model_config_load) */
static int is_dir(const char *p)
{
    struct stat sb;
    return p && stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The Hugging Face folder --save and --merge write (model/hf.h): the
 * --model file's config (a preset's written from its shape), the weights in
 * --dtype, the --tokenizer's files. */
static model_hf_folder hf_folder(const tf_model *m, const train_args *a, const char *dir)
{
    static char folder_config[4096]; /* --model DIR: its config.json */
    struct stat sb;
    const char *config = NULL;
    if (stat(a->model, &sb) == 0 && S_ISREG(sb.st_mode)) {
        config = a->model;
    } else if (is_dir(a->model) &&
               (size_t)snprintf(folder_config, sizeof folder_config, "%s/config.json", a->model) <
                   sizeof folder_config) {
        config = folder_config;
    }
    int n_extra;
    const model_st_entry *extra = tf_router_bias_entries(m, &n_extra);
    return (model_hf_folder){.dir = dir, .l = &m->layout, .dtype = a->dtype, .max_shard_bytes = a->max_shard,
                             .config = config, .tokenizer = a->tokenizer, .extra = extra, .n_extra = n_extra};
}

/* An offload_weights_stream: the folder of `user` (a model_hf_folder) at path. */
static zo_status hf_writer(void *user, const char *path, offload_block_reader read, void *ctx)
{
    model_hf_folder f = *(const model_hf_folder *)user;
    f.dir = path;
    return model_hf_save(&f, read, ctx, NULL);
}

/* The adapters of every block as fp32 (small: all at once). */
static zo_status read_adapters(offload_t *rt, const model_layout *ad, void ***out)
{
    void **blocks = alloc_blocks(ad);
    if (!blocks) return zo_error(ZO_ERR_NOMEM, "train: out of host memory for the adapters");
    zo_status st = ZO_OK;
    for (int b = 0; b < ad->n_blocks && st == ZO_OK; b++) st = offload_get_block(rt, b, blocks[b]);
    if (st != ZO_OK) free_blocks(blocks, ad->n_blocks);
    else *out = blocks;
    return st;
}

/* --save with LoRA: a PEFT adapter directory. */
static zo_status save_adapters(const tf_model *m, const train_args *a, void *const *adapters)
{
    return model_lora_save(a->save, &m->adapters, &a->lora, is_dir(a->model) ? m->cfg.name : a->model,
                           (const void *const *)adapters, ZO_DTYPE_F32, ZO_DTYPE_F32);
}

/* A block of the merged model: its frozen base as the model computes with it
 * (NF4 dequantized), its adapters merged in. */
typedef struct merged_reader {
    offload_t *rt;
    const tf_model *m;
    void *packed;
    void *const *adapters;
} merged_reader;

static zo_status read_merged(void *ctx, int block, float *dst)
{
    merged_reader *r = ctx;
    zo_status st = offload_get_frozen_block(r->rt, block, r->packed);
    if (st == ZO_OK) st = tf_frozen_unpack(r->m, block, r->packed, dst);
    if (st == ZO_OK) tf_lora_merge_block(r->m, block, r->adapters[block], dst);
    return st;
}

/* --merge DIR: the adapters merged into the base, a Hugging Face folder. */
static zo_status save_merged(offload_t *rt, const tf_model *m, const train_args *a, void *const *adapters)
{
    merged_reader r = {.rt = rt, .m = m, .packed = malloc(weights_frozen_largest(m)), .adapters = adapters};
    if (!r.packed) return zo_error(ZO_ERR_NOMEM, "train: out of host memory for a block of the base");
    model_hf_folder f = hf_folder(m, a, a->merge);
    int shards = 0;
    zo_status st = model_hf_save(&f, read_merged, &r, &shards);
    free(r.packed);
    if (st == ZO_OK)
        printf("# merged %s: LoRA r %d alpha %g merged into the base, %s, %d weight file(s)\n", a->merge, a->lora.r,
               a->lora.alpha, zo_dtype_name(a->dtype), shards);
    return st;
}

/* A block of the runtime's trained layout (an offload_block_reader). */
static zo_status read_trained(void *ctx, int block, float *dst)
{
    return offload_get_block(ctx, block, dst);
}

/* Expert parallelism (at any ZeRO stage: the blocks are read back whole):
 * each rank's blocks of `ll` (read by `read`: the trained weights, the
 * adapters, or the merged model) hold its group share of the experts,
 * elements [x_off, x_off + n) of each MoE layer block. Every rank reads its
 * blocks in order and each layer's experts are all-gathered over
 * its group (`ep`, through device buffers: what the communicator takes);
 * rank 0 puts the blocks together as the whole model lays them out (`gl`:
 * the experts of group rank q at x_off + q n, what follows them moved up)
 * in host memory, *whole (NULL on the other ranks). */
static zo_status gather_ep(offload_block_reader read, void *ctx, const tf_model *m, const model_layout *ll,
                           const model_layout *gl, size_t x_off, size_t n, comm_t ep, int rank, void ***whole)
{
    const int P = comm_size(ep);
    size_t largest = 1;
    for (int b = 0; b < ll->n_blocks; b++) largest = ll->block_numel[b] > largest ? ll->block_numel[b] : largest;
    void **w = rank == 0 ? alloc_blocks(gl) : NULL;
    float *local = malloc(largest * sizeof(float)), *all = malloc((size_t)P * n * sizeof(float) + 4);
    void *dsend = NULL, *drecv = NULL;
    gpu_stream_t s = NULL;
    zo_status st = ZO_OK;
    if ((rank == 0 && !w) || !local || !all) {
        st = zo_error(ZO_ERR_NOMEM, "out of host memory for the whole model's blocks");
        goto out;
    }
    if ((st = gpu_mem_alloc(m->dev, n * sizeof(float) + 4, &dsend)) != ZO_OK ||
        (st = gpu_mem_alloc(m->dev, (size_t)P * n * sizeof(float) + 4, &drecv)) != ZO_OK ||
        (st = gpu_stream_create(m->dev, &s)) != ZO_OK)
        goto out;
    for (int b = 0; b < ll->n_blocks && st == ZO_OK; b++) {
        if (ll->block_numel[b] && (st = read(ctx, b, local)) != ZO_OK) break;
        if (!model_layout_view(&m->layout, b, MODEL_ROLE_EXPERT_GATE_W)) { /* no experts: as it is */
            if (w) memcpy(w[b], local, ll->block_numel[b] * sizeof(float));
            continue;
        }
        comm_request_t req;
        if ((st = gpu_memcpy_async(s, dsend, local + x_off, n * sizeof(float), GPU_COPY_HOST_TO_DEVICE)) != ZO_OK ||
            (st = gpu_stream_synchronize(s)) != ZO_OK ||
            (st = comm_all_gather(ep, dsend, drecv, n, ZO_DTYPE_F32, NULL, &req)) != ZO_OK ||
            (st = comm_wait(req)) != ZO_OK ||
            (st = gpu_memcpy_async(s, all, drecv, (size_t)P * n * sizeof(float), GPU_COPY_DEVICE_TO_HOST)) !=
                ZO_OK ||
            (st = gpu_stream_synchronize(s)) != ZO_OK)
            break;
        if (!w) continue;
        float *dst = w[b];
        memcpy(dst, local, x_off * sizeof(float));
        memcpy(dst + x_off, all, (size_t)P * n * sizeof(float));
        memcpy(dst + x_off + (size_t)P * n, local + x_off + n, (ll->block_numel[b] - x_off - n) * sizeof(float));
    }
out:
    if (s) gpu_stream_destroy(s);
    gpu_mem_free(m->dev, dsend);
    gpu_mem_free(m->dev, drecv);
    free(local);
    free(all);
    if (st != ZO_OK && w) {
        free_blocks(w, gl->n_blocks);
        w = NULL;
    }
    *whole = w;
    return st;
}

/* Where an MoE layer block's experts begin: the last layer's (DeepSeek's
 * first layers are dense, without experts). */
static size_t experts_offset(const tf_model *m)
{
    return model_layout_view(&m->layout, model_layout_layer_block(m->cfg.n_layers - 1), MODEL_ROLE_EXPERT_GATE_W)
        ->offset;
}

/* A reader of blocks held in host memory (fp32). */
static zo_status read_held(void *ctx, int block, float *dst)
{
    const model_layout *l = ((void **)ctx)[0];
    void **blocks = ((void **)ctx)[1];
    memcpy(dst, blocks[block], l->block_numel[block] * sizeof(float));
    return ZO_OK;
}

/* The whole model's Hugging Face folder at `dir` from its blocks held
 * whole (`gl`), as one rank writes it; *shards its weight files. */
static zo_status save_held(const tf_model *m, const train_args *a, const char *dir, model_layout *gl, void **whole,
                           int *shards)
{
    model_hf_folder f = hf_folder(m, a, dir);
    f.l = gl;
    void *ctx[2] = {gl, whole};
    return model_hf_save(&f, read_held, ctx, shards);
}

/* --merge with expert parallelism: each rank merges its blocks (its base,
 * NF4 dequantized, and its adapters: its own experts'), the experts are
 * gathered as --save gathers them, and rank 0 writes the folder. */
static zo_status save_ep_merged(offload_t *rt, const tf_model *m, const train_args *a, comm_t ep, int rank)
{
    model_layout gl;
    void **adapters = NULL, **whole = NULL;
    int shards = 0;
    zo_status st = model_layout_init(&gl, &m->cfg);
    if (st != ZO_OK) return zo_error_wrap(st, "--merge %s", a->merge);
    size_t x_off = experts_offset(m);
    size_t n = (size_t)m->layout.expert_count * model_layout_expert_stride(&m->layout);
    merged_reader r = {.rt = rt, .m = m, .packed = malloc(weights_frozen_largest(m))};
    if (!r.packed) st = zo_error(ZO_ERR_NOMEM, "train: out of host memory for a block of the base");
    if (st == ZO_OK) st = read_adapters(rt, &m->adapters, &adapters);
    r.adapters = adapters;
    if (st == ZO_OK) st = gather_ep(read_merged, &r, m, &m->layout, &gl, x_off, n, ep, rank, &whole);
    if (st == ZO_OK && whole) st = save_held(m, a, a->merge, &gl, whole, &shards);
    if (st == ZO_OK && whole)
        printf("# merged %s: LoRA r %d alpha %g merged into the base, %s, %d weight file(s)\n", a->merge, a->lora.r,
               a->lora.alpha, zo_dtype_name(a->dtype), shards);
    if (whole) free_blocks(whole, gl.n_blocks);
    if (adapters) free_blocks(adapters, m->adapters.n_blocks);
    free(r.packed);
    model_layout_free(&gl);
    return st == ZO_OK ? st : zo_error_wrap(st, "--merge %s", a->merge);
}

/* --save with expert parallelism: the Hugging Face folder, or with LoRA
 * the PEFT adapter folder, rank 0 writing what one rank would. */
static zo_status save_ep(offload_t *rt, const tf_model *m, const train_args *a, comm_t ep, int rank)
{
    model_layout gl;
    size_t x_off = 0, n = 0;
    zo_status st;
    if (!a->lora.r) {
        st = model_layout_init(&gl, &m->cfg);
        x_off = experts_offset(m);
        n = (size_t)m->layout.expert_count * model_layout_expert_stride(&m->layout);
    } else {
        zo_lora_config lc = {.r = a->lora.r, .alpha = a->lora.alpha, .targets = a->lora.targets};
        st = model_lora_layout_init(&gl, &m->cfg, &lc);
        for (int j = 0; j < m->n_lora && !n; j++) /* the routed experts' adapters, together */
            if (m->lora[j].e_stride) {
                x_off = m->lora[j].a_off;
                n = (size_t)m->layout.expert_count * m->lora[j].e_stride;
            }
    }
    if (st != ZO_OK) return zo_error_wrap(st, "--save %s", a->save);
    void **whole = NULL;
    st = gather_ep(read_trained, rt, m, m->opts.lora.r ? &m->adapters : &m->layout, &gl, x_off, n, ep, rank, &whole);
    if (st == ZO_OK && whole) {
        if (a->lora.r) {
            st = model_lora_save(a->save, &gl, &a->lora, is_dir(a->model) ? m->cfg.name : a->model,
                                 (const void *const *)whole, ZO_DTYPE_F32, ZO_DTYPE_F32); /* as save_adapters */
        } else {
            st = save_held(m, a, a->save, &gl, whole, NULL);
        }
    }
    if (whole) free_blocks(whole, gl.n_blocks);
    model_layout_free(&gl);
    return st == ZO_OK ? st : zo_error_wrap(st, "--save %s", a->save);
}

zo_status weights_save(offload_t *rt, const tf_model *m, const train_args *a, int rank, comm_t ep)
{
    if (ep && comm_size(ep) > 1) {
        zo_status st = save_ep(rt, m, a, ep, rank);
        return st == ZO_OK && a->merge ? save_ep_merged(rt, m, a, ep, rank) : st;
    }
    if (!a->lora.r) {
        model_hf_folder f = hf_folder(m, a, a->save);
        return offload_write_weights(rt, a->save, hf_writer, &f); /* rank 0 writes, the others send */
    }
    /* every rank reads the adapters (gathered when partitioned); the frozen
     * base a merge reads is whole on every rank (run_read_inputs refuses
     * --merge where ZeRO-3 partitions it): rank 0 writes */
    void **adapters = NULL;
    zo_status st = read_adapters(rt, &m->adapters, &adapters);
    if (st == ZO_OK && rank == 0 && a->save) st = save_adapters(m, a, adapters);
    if (st == ZO_OK && rank == 0 && a->merge) st = save_merged(rt, m, a, adapters);
    if (adapters) free_blocks(adapters, m->adapters.n_blocks);
    return st;
}
