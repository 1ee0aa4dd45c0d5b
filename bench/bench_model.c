/* bench_model: how fast checkpoints load and save, against reading the same
 * bytes as stored from the same (page-cached) file, and how fast batches are
 * cut.
 *
 *     bench_model [--layers N] [--dir DIR]
 *
 * Cases: a LLaMA-shaped model (hidden 768, ffn 2048, vocab 32000, GQA 12/4)
 * written as F32, BF16 and FP8 with block scales (DeepSeek-V3's kind) and
 * loaded into fp32 and bf16 buffers; gpt-oss-20b's gate_up_proj of 2
 * experts ([2, 2880, 5760]) as MXFP4 (blocks and scales) and as BF16, read
 * into fp32 (and MXFP4 into bf16); a GPT-2
 * shaped one (Conv1D weights transposed on load); saving; and (B=8, T=1024)
 * sequential batches from a 16M-token file; and the weights' initialization
 * from a seed (tf_normal_fill) against the libm loop it replaced. The last
 * line is the fp32 load bandwidth over the raw read's. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench/bench.h"
#include "common/model_config.h"
#include "model/data.h"
#include "model/layout.h"
#include "model/safetensors.h"
#include "transformer/transformer.h" /* defines: tf_normal_fill, tf_normal_simd, tf_init_rng */

typedef struct load_case {
    model_ckpt *ckpt;
    model_layout *l;
    void **blocks;
    zo_dtype dt;
    const char *path;
} load_case;

static void run_load(void *arg)
{
    load_case *c = arg;
    zo_status st = model_load(c->ckpt, c->l, c->blocks, c->dt, 0, NULL);
    if (st) {
        fprintf(stderr, "bench_model: %s\n", zo_last_error());
        exit(1);
    }
    bench_sink(c->blocks[0]);
}

static void run_save(void *arg)
{
    load_case *c = arg;
    if (model_save(c->path, c->l, (const void *const *)c->blocks, c->dt, c->dt)) {
        fprintf(stderr, "bench_model: %s\n", zo_last_error());
        exit(1);
    }
}

typedef struct copy_case {
    const model_ckpt *ckpt;
    uint8_t *dst;
} copy_case;

/* the baseline: every tensor's bytes as stored, read out of the file */
static void run_copy(void *arg)
{
    copy_case *c = arg;
    size_t pos = 0;
    for (int i = 0; i < c->ckpt->n_entries; i++) {
        const model_ckpt_entry *e = &c->ckpt->entries[i];
        if (model_st_read_raw(&c->ckpt->files[e->file], e->tensor, c->dst + pos)) {
            fprintf(stderr, "bench_model: %s\n", zo_last_error());
            exit(1);
        }
        pos += e->tensor->end - e->tensor->begin;
    }
    bench_sink(c->dst);
}

typedef struct batch_case {
    model_tokens *t;
    int32_t *in, *tg;
    int64_t step;
} batch_case;

static void run_batch(void *arg)
{
    batch_case *c = arg;
    if (model_batch_get(c->t, 8, 1024, c->step++, 0, MODEL_SAMPLE_SEQUENTIAL, c->in, c->tg)) {
        fprintf(stderr, "bench_model: %s\n", zo_last_error());
        exit(1);
    }
    bench_sink(c->in);
}

static void **alloc_blocks(const model_layout *l, zo_dtype dt)
{
    void **b = calloc((size_t)l->n_blocks, sizeof *b);
    if (!b) exit(1);
    for (int i = 0; i < l->n_blocks; i++) {
        b[i] = malloc(l->block_numel[i] * zo_dtype_size(dt));
        if (!b[i]) exit(1);
        /* deterministic, non-trivial values (fp32 bits of small numbers) */
        for (size_t k = 0; k < l->block_numel[i]; k++)
            zo_store_f32(b[i], dt, k, (float)((k * 2654435761u) % 1000) * 1e-3f - 0.5f);
    }
    return b;
}

static void free_blocks(const model_layout *l, void **b)
{
    for (int i = 0; i < l->n_blocks; i++) free(b[i]);
    free(b);
}

static void check(zo_status st)
{
    if (st) {
        fprintf(stderr, "bench_model: %s\n", zo_last_error());
        exit(1);
    }
}

/* The files of one run, in the --dir given, named by the process id. */
typedef struct run_files {
    char f32[512], bf16[512], fp8[512], gpt[512], save[512], tokens[512];
} run_files;

static void files_init(run_files *f, const char *dir)
{
    snprintf(f->f32, sizeof f->f32, "%s/bench_model.%d.f32.safetensors", dir, (int)getpid());
    snprintf(f->bf16, sizeof f->bf16, "%s/bench_model.%d.bf16.safetensors", dir, (int)getpid());
    snprintf(f->fp8, sizeof f->fp8, "%s/bench_model.%d.fp8.safetensors", dir, (int)getpid());
    snprintf(f->gpt, sizeof f->gpt, "%s/bench_model.%d.gpt2.safetensors", dir, (int)getpid());
    snprintf(f->save, sizeof f->save, "%s/bench_model.%d.save.safetensors", dir, (int)getpid());
    snprintf(f->tokens, sizeof f->tokens, "%s/bench_model.%d.tokens.bin", dir, (int)getpid());
}

static void files_remove(const run_files *f)
{
    unlink(f->f32);
    unlink(f->bf16);
    unlink(f->fp8);
    unlink(f->gpt);
    unlink(f->save);
    unlink(f->tokens);
}

/* The checkpoints loaded: LLaMA-shaped l as F32 and BF16 (from src's
 * values), GPT-2-shaped lg as F32. */
static void write_checkpoints(const run_files *f, const model_layout *l, void **src, const model_layout *lg)
{
    check(model_save(f->f32, l, (const void *const *)src, ZO_DTYPE_F32, ZO_DTYPE_F32));
    check(model_save(f->bf16, l, (const void *const *)src, ZO_DTYPE_F32, ZO_DTYPE_BF16));
    void **gsrc = alloc_blocks(lg, ZO_DTYPE_F32);
    check(model_save(f->gpt, lg, (const void *const *)gsrc, ZO_DTYPE_F32, ZO_DTYPE_F32));
    free_blocks(lg, gsrc);
}

/* l as DeepSeek-V3's checkpoints are published: every layer's linear weight
 * F8_E4M3 (all finite codes in turn) with its F32 weight_scale_inv (128 x
 * 128 blocks), the rest BF16 zeros (as the published files keep norms,
 * embeddings and the head); its size in bytes. */
static double write_fp8_checkpoint(const char *path, const model_layout *l)
{
    cJSON *h = cJSON_CreateObject();
    uint64_t off = 0;
    for (int pass = 0; pass < 2; pass++) {
        FILE *f = pass ? fopen(path, "ab") : NULL;
        if (pass && !f) check(zo_error(ZO_ERR_IO, "%s: cannot append", path));
        for (int i = 0; i < l->n_tensors; i++) {
            const model_tensor *t = &l->tensors[i];
            int fp8 = t->ndim == 2 && strstr(t->name, "layers.");
            uint64_t r = (uint64_t)t->shape[0], c = t->ndim == 2 ? (uint64_t)t->shape[1] : 1;
            uint64_t sr = (r + 127) / 128, sc = (c + 127) / 128, bytes = fp8 ? r * c : t->numel * 2;
            if (!pass) {
                char sname[MODEL_TENSOR_NAME_MAX + 16];
                cJSON *e = cJSON_AddObjectToObject(h, t->name), *shape = cJSON_AddArrayToObject(e, "shape");
                cJSON_AddStringToObject(e, "dtype", fp8 ? "F8_E4M3" : "BF16");
                for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
                cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
                cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
                cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + bytes)));
                off += bytes;
                if (!fp8) continue;
                snprintf(sname, sizeof sname, "%s_scale_inv", t->name);
                e = cJSON_AddObjectToObject(h, sname);
                shape = cJSON_AddArrayToObject(e, "shape");
                cJSON_AddStringToObject(e, "dtype", "F32");
                cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)sr));
                cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)sc));
                o = cJSON_AddArrayToObject(e, "data_offsets");
                cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
                cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + sr * sc * 4)));
                off += sr * sc * 4;
                continue;
            }
            uint8_t *buf = calloc(bytes + sr * sc * 4, 1);
            if (!buf) check(zo_error(ZO_ERR_NOMEM, "%s: a tensor of %llu bytes", path, (unsigned long long)bytes));
            if (fp8) {
                for (uint64_t k = 0; k < bytes; k++) buf[k] = (uint8_t)(k % 127); /* 0x00..0x7e: finite */
                for (uint64_t k = 0; k < sr * sc; k++) ((float *)(void *)(buf + bytes))[k] = 1e-4f;
                bytes += sr * sc * 4;
            }
            if (fwrite(buf, 1, bytes, f) != bytes) check(zo_error(ZO_ERR_IO, "%s: short write", path));
            free(buf);
        }
        if (pass) {
            fclose(f);
            break;
        }
        char *text = cJSON_PrintUnformatted(h);
        uint64_t n = strlen(text);
        uint8_t len[8];
        for (int k = 0; k < 8; k++) len[k] = (uint8_t)(n >> (8 * k));
        FILE *o = fopen(path, "wb");
        if (!o || fwrite(len, 1, 8, o) != 8 || fwrite(text, 1, n, o) != n || fclose(o))
            check(zo_error(ZO_ERR_IO, "%s: cannot write the header", path));
        free(text);
    }
    cJSON_Delete(h);
    return (double)off;
}

/* Best seconds of fn(arg) (>= 3 runs, >= 1 s) and its row: file MB, ms, GB/s. */
static double time_row(const char *what, void (*fn)(void *), void *arg, int warmup, double bytes)
{
    double gb = 1e-9, t = bench_time_best(fn, arg, warmup, 3, 1.0);
    bench_row("%-34s %10.1f %10.2f %8.2f", what, bytes / 1e6, t * 1e3, bytes * gb / t);
    return t;
}

/* A file of one BF16 tensor "w" (or, with mxfp4, an MXFP4 weight's
 * "w_blocks" and "w_scales" of shape [2, 5760, 90, 16] and [2, 5760, 90]):
 * gpt-oss-20b's gate_up_proj of 2 experts, X [2, 2880, 5760]. The codes
 * run through every byte, the scales 2^-7 .. 2^0; the BF16 copy's values
 * are finite. Returns the file's data bytes. */
#define MX_E 2
#define MX_R 5760
#define MX_G 90
static double write_mx_file(const char *path, int mxfp4)
{
    uint64_t n = (uint64_t)MX_E * MX_R * MX_G, blocks = n * 16, bytes = mxfp4 ? blocks + n : n * 64;
    char header[512];
    if (mxfp4)
        snprintf(header, sizeof header,
                 "{\"w_blocks\":{\"dtype\":\"U8\",\"shape\":[%d,%d,%d,16],\"data_offsets\":[0,%llu]},"
                 "\"w_scales\":{\"dtype\":\"U8\",\"shape\":[%d,%d,%d],\"data_offsets\":[%llu,%llu]}}",
                 MX_E, MX_R, MX_G, (unsigned long long)blocks, MX_E, MX_R, MX_G, (unsigned long long)blocks,
                 (unsigned long long)bytes);
    else
        snprintf(header, sizeof header,
                 "{\"w\":{\"dtype\":\"BF16\",\"shape\":[%d,%d,%d],\"data_offsets\":[0,%llu]}}", MX_E,
                 MX_G * 32, MX_R, (unsigned long long)bytes);
    uint8_t *buf = malloc(bytes), len[8];
    if (!buf) check(zo_error(ZO_ERR_NOMEM, "%s: %llu bytes", path, (unsigned long long)bytes));
    for (uint64_t k = 0; k < bytes; k++)
        buf[k] = mxfp4 ? (uint8_t)(k < blocks ? k * 7 : 120 + k % 8) : (uint8_t)(k & 1 ? 0x3f : k * 7);
    uint64_t hl = strlen(header);
    for (int k = 0; k < 8; k++) len[k] = (uint8_t)(hl >> (8 * k));
    FILE *o = fopen(path, "wb");
    if (!o || fwrite(len, 1, 8, o) != 8 || fwrite(header, 1, hl, o) != hl || fwrite(buf, 1, bytes, o) != bytes ||
        fclose(o))
        check(zo_error(ZO_ERR_IO, "%s: cannot write", path));
    free(buf);
    return (double)bytes;
}

typedef struct mx_case {
    model_st_file *f;
    void *dst;
    zo_dtype dt;
} mx_case;

/* The weight read into dst: dequantized from its blocks and scales, or the BF16 tensor converted. */
static void run_mx(void *arg)
{
    mx_case *c = arg;
    const model_st_tensor *b = model_st_find(c->f, "w_blocks");
    zo_status st = b ? model_st_read_mxfp4(c->f, b, c->f, model_st_find(c->f, "w_scales"), 0, b->numel * 2, c->dst,
                                           c->dt, 0)
                     : model_st_read(c->f, model_st_find(c->f, "w"), c->dst, c->dt, 0);
    if (st) {
        fprintf(stderr, "bench_model: %s\n", zo_last_error());
        exit(1);
    }
    bench_sink(c->dst);
}

/* MXFP4 against BF16 of the same weight, alternated: the MXFP4 -> fp32 time over the BF16 -> fp32 one. */
static double time_mxfp4(const char *dir)
{
    char pm[512], pb[512];
    snprintf(pm, sizeof pm, "%s/bench_model.%d.mxfp4.safetensors", dir, (int)getpid());
    snprintf(pb, sizeof pb, "%s/bench_model.%d.mxbf16.safetensors", dir, (int)getpid());
    double bm = write_mx_file(pm, 1), bb = write_mx_file(pb, 0);
    model_st_file fm, fb;
    check(model_st_open(&fm, pm));
    check(model_st_open(&fb, pb));
    void *dst = malloc((size_t)MX_E * MX_R * MX_G * 32 * 4);
    if (!dst) exit(1);
    mx_case cm = {&fm, dst, ZO_DTYPE_F32}, cb = {&fb, dst, ZO_DTYPE_F32}, cm16 = {&fm, dst, ZO_DTYPE_BF16};
    double tb = time_row("experts BF16 -> fp32", run_mx, &cb, 1, bb);
    double tm = time_row("experts MXFP4 -> fp32 (dequant)", run_mx, &cm, 1, bm);
    double tb2 = time_row("experts BF16 -> fp32 (again)", run_mx, &cb, 1, bb);
    double tm2 = time_row("experts MXFP4 -> fp32 (again)", run_mx, &cm, 1, bm);
    time_row("experts MXFP4 -> bf16 (dequant)", run_mx, &cm16, 1, bm);
    tb = tb < tb2 ? tb : tb2;
    tm = tm < tm2 ? tm : tm2;
    bench_row("%-34s %10s %10s %8s  MXFP4 -> fp32 / BF16 -> fp32 time: %.2f (%.0f M weights/s)", "", "", "", "",
              tm / tb, (double)MX_E * MX_R * MX_G * 32 / tm / 1e6);
    free(dst);
    model_st_close(&fm);
    model_st_close(&fb);
    unlink(pm);
    unlink(pb);
    return tm / tb;
}

/* Every tensor of c read as stored, `bytes` in all: the baseline's seconds,
 * or -1 without the memory. */
static double time_raw_read(const model_ckpt *c, double bytes)
{
    copy_case cc = {.ckpt = c, .dst = malloc((size_t)bytes)};
    if (!cc.dst) return -1;
    double t = time_row("read the F32 file as stored", run_copy, &cc, 1, bytes);
    free(cc.dst);
    return t;
}

/* batches: 16M uint16 tokens written to path, cut (B=8, T=1024) in order;
 * 0, or 1 when the file or the memory is not there. */
static int time_batches(const char *path)
{
    const size_t n = 16u << 20;
    uint16_t *tok = malloc(n * 2);
    if (!tok) return 1;
    for (size_t i = 0; i < n; i++) tok[i] = (uint16_t)((i * 2654435761u) % 50257);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(tok, 2, n, f) != n) return 1;
    fclose(f);
    free(tok);
    model_tokens tf;
    check(model_tokens_open(&tf, path, MODEL_TOKENS_U16, 50257));
    batch_case bc = {.t = &tf, .in = malloc(8 * 1024 * 4), .tg = malloc(8 * 1024 * 4)};
    if (!bc.in || !bc.tg) return 1;
    double t = bench_time_best(run_batch, &bc, 5, 50, 0.5);
    bench_row("%-34s %10.1f %10.3f %8s  %.0f Mtokens/s", "batch 8 x 1024 (u16, checked)", (double)n * 2 / 1e6,
              t * 1e3, "-", 8 * 1024 / t / 1e6);
    free(bc.in);
    free(bc.tg);
    model_tokens_close(&tf);
    return 0;
}

/* The weights' normal draws (transformer/init_normal.c): tf_normal_fill's
 * two loops against Box-Muller with glibc's log and cos (the loop it
 * replaced, the same fp32 values), 65536 draws a call (one thread: below
 * its parallel split), alternated three times, the best of each. */
typedef struct init_case {
    float *dst;
    int simd; /* -1: the libm loop */
} init_case;

static uint64_t libm_splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void run_init(void *arg)
{
    init_case *c = arg;
    uint64_t s0 = tf_init_rng(7);
    if (c->simd >= 0) {
        tf_normal_simd(c->simd);
        tf_normal_fill(c->dst, 65536, s0, 0.02);
        tf_normal_simd(1);
    } else {
        for (long long e = 0; e < 65536; e++) {
            uint64_t x = s0 + 2 * (uint64_t)e * 0x9e3779b97f4a7c15ull;
            double u1 = ((double)(libm_splitmix(&x) >> 11) + 1.0) / 9007199254740993.0;
            double u2 = (double)(libm_splitmix(&x) >> 11) / 9007199254740992.0;
            c->dst[e] = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2) * 0.02);
        }
    }
    bench_sink(c->dst);
}

static void time_init(void)
{
    static const char *const names[3] = {"init: libm log and cos loop", "init: tf_normal_fill, plain loop",
                                         "init: tf_normal_fill, AVX2 loop"};
    float *dst[3];
    double best[3] = {1e30, 1e30, 1e30};
    for (int k = 0; k < 3; k++) dst[k] = malloc(65536 * sizeof(float));
    for (int round = 0; round < 3; round++)
        for (int k = 0; k < 3; k++) {
            init_case c = {.dst = dst[k], .simd = k - 1};
            double t = bench_time_best(run_init, &c, 1, 5, 0.2);
            if (t < best[k]) best[k] = t;
        }
    int same = !memcmp(dst[0], dst[1], 65536 * sizeof(float)) && !memcmp(dst[0], dst[2], 65536 * sizeof(float));
    for (int k = 0; k < 3; k++)
        bench_row("%-34s %10s %10.3f %8s  %.1f ns a draw", names[k], "", best[k] * 1e3, "", best[k] * 1e9 / 65536);
    bench_row("%-34s %10s %10s %8s  libm / AVX2 time: %.2f, libm / plain: %.2f; values %s", "", "", "", "",
              best[0] / best[2], best[0] / best[1], same ? "bit for bit the same" : "DIFFER");
    for (int k = 0; k < 3; k++) free(dst[k]);
}

int main(int argc, char **argv)
{
    int layers = 2;
    const char *dir = "/tmp";
    static const struct option opts[] = {
        {"layers", required_argument, NULL, 'l'}, {"dir", required_argument, NULL, 'd'}, {0}};
    int o;
    while ((o = getopt_long(argc, argv, "l:d:", opts, NULL)) != -1) {
        if (o == 'l') layers = atoi(optarg);
        else if (o == 'd') dir = optarg;
        else return 2;
    }
    bench_header("bench_model", "layers %d, files in %s, best of >= 3 runs", layers, dir);

    zo_model_config llama = {.name = "bench-llama", .arch = ZO_ARCH_LLAMA, .n_layers = layers,
                             .hidden = 768, .n_heads = 12, .n_kv_heads = 4, .ffn = 2048,
                             .vocab = 32000, .max_seq = 2048, .norm_eps = 1e-6f};
    zo_model_config gpt;
    check(zo_model_preset_find("gpt2", &gpt));
    gpt.n_layers = layers;
    run_files files;
    files_init(&files, dir);
    model_layout l, lg;
    check(model_layout_init(&l, &llama));
    check(model_layout_init(&lg, &gpt));
    void **src = alloc_blocks(&l, ZO_DTYPE_F32);
    write_checkpoints(&files, &l, src, &lg);
    model_ckpt cf32, cbf16, cgpt;
    check(model_ckpt_open(&cf32, files.f32));
    check(model_ckpt_open(&cbf16, files.bf16));
    check(model_ckpt_open(&cgpt, files.gpt));
    double fp8_bytes = write_fp8_checkpoint(files.fp8, &l);
    model_ckpt cfp8;
    check(model_ckpt_open(&cfp8, files.fp8));
    double f32_bytes = (double)l.total_numel * 4, bf16_bytes = (double)l.total_numel * 2;
    double g_bytes = (double)lg.total_numel * 4;

    bench_row("%-34s %10s %10s %8s", "case", "file MB", "ms", "GB/s");
    double t_copy = time_raw_read(&cf32, f32_bytes);
    if (t_copy < 0) return 1;
    void **b32 = alloc_blocks(&l, ZO_DTYPE_F32), **b16 = alloc_blocks(&l, ZO_DTYPE_BF16);
    load_case lc = {.ckpt = &cf32, .l = &l, .blocks = b32, .dt = ZO_DTYPE_F32};
    double t_load = time_row("load llama F32 -> fp32", run_load, &lc, 1, f32_bytes);
    lc = (load_case){.ckpt = &cf32, .l = &l, .blocks = b16, .dt = ZO_DTYPE_BF16};
    time_row("load llama F32 -> bf16", run_load, &lc, 1, f32_bytes);
    lc = (load_case){.ckpt = &cbf16, .l = &l, .blocks = b32, .dt = ZO_DTYPE_F32};
    time_row("load llama BF16 -> fp32", run_load, &lc, 1, bf16_bytes);
    lc = (load_case){.ckpt = &cbf16, .l = &l, .blocks = b16, .dt = ZO_DTYPE_BF16};
    time_row("load llama BF16 -> bf16", run_load, &lc, 1, bf16_bytes);
    /* FP8 with block scales (DeepSeek-V3's), dequantized as it loads */
    lc = (load_case){.ckpt = &cfp8, .l = &l, .blocks = b32, .dt = ZO_DTYPE_F32};
    double t_fp8 = time_row("load llama FP8 -> fp32 (dequant)", run_load, &lc, 1, fp8_bytes);
    lc = (load_case){.ckpt = &cbf16, .l = &l, .blocks = b32, .dt = ZO_DTYPE_F32};
    double t_bf16 = time_row("load llama BF16 -> fp32 (again)", run_load, &lc, 1, bf16_bytes);
    lc = (load_case){.ckpt = &cfp8, .l = &l, .blocks = b16, .dt = ZO_DTYPE_BF16};
    time_row("load llama FP8 -> bf16 (dequant)", run_load, &lc, 1, fp8_bytes);
    bench_row("%-34s %10s %10s %8s  FP8 -> fp32 / BF16 -> fp32 time: %.2f", "", "", "", "", t_fp8 / t_bf16);
    /* MXFP4 (gpt-oss's experts), dequantized as it reads */
    time_mxfp4(dir);
    void **g32 = alloc_blocks(&lg, ZO_DTYPE_F32);
    lc = (load_case){.ckpt = &cgpt, .l = &lg, .blocks = g32, .dt = ZO_DTYPE_F32};
    time_row("load gpt2 F32 -> fp32 (Conv1D T)", run_load, &lc, 1, g_bytes);
    lc = (load_case){.l = &l, .blocks = b32, .dt = ZO_DTYPE_F32, .path = files.save};
    time_row("save llama fp32 -> F32 (+fsync)", run_save, &lc, 0, f32_bytes);
    lc = (load_case){.l = &lg, .blocks = g32, .dt = ZO_DTYPE_F32, .path = files.save};
    time_row("save gpt2 fp32 -> F32 (Conv1D T)", run_save, &lc, 0, g_bytes);
    if (time_batches(files.tokens) != 0) return 1;
    time_init();

    free_blocks(&l, b32);
    free_blocks(&l, b16);
    free_blocks(&lg, g32);
    free_blocks(&l, src);
    model_ckpt_close(&cf32);
    model_ckpt_close(&cbf16);
    model_ckpt_close(&cgpt);
    model_ckpt_close(&cfp8);
    files_remove(&files);
    model_layout_free(&l);
    model_layout_free(&lg);
    bench_result("load F32->fp32 bandwidth / raw read bandwidth", t_copy / t_load);
    return 0;
}
