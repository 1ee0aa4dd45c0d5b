/* bench_model: how fast checkpoints load and save, against reading the same
 * bytes as stored from the same (page-cached) file, and how fast batches are
 * cut.
 *
 *     bench_model [--layers N] [--dir DIR]
 *
 * Cases: a LLaMA-shaped model (hidden 768, ffn 2048, vocab 32000, GQA 12/4)
 * written as F32 and BF16 and loaded into fp32 and bf16 buffers; a GPT-2
 * shaped one (Conv1D weights transposed on load); saving; and (B=8, T=1024)
 * sequential batches from a 16M-token file. The last line is the fp32 load
 * bandwidth over the raw read's. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/model_config.h"
#include "model/data.h"
#include "model/layout.h"
#include "model/safetensors.h"

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
    char f32_path[512], bf16_path[512], gpt_path[512], save_path[512], tok_path[512];
    snprintf(f32_path, sizeof f32_path, "%s/bench_model.%d.f32.safetensors", dir, (int)getpid());
    snprintf(bf16_path, sizeof bf16_path, "%s/bench_model.%d.bf16.safetensors", dir, (int)getpid());
    snprintf(gpt_path, sizeof gpt_path, "%s/bench_model.%d.gpt2.safetensors", dir, (int)getpid());
    snprintf(save_path, sizeof save_path, "%s/bench_model.%d.save.safetensors", dir, (int)getpid());
    snprintf(tok_path, sizeof tok_path, "%s/bench_model.%d.tokens.bin", dir, (int)getpid());

    model_layout l, lg;
    check(model_layout_init(&l, &llama));
    check(model_layout_init(&lg, &gpt));
    void **src = alloc_blocks(&l, ZO_DTYPE_F32);
    check(model_save(f32_path, &l, (const void *const *)src, ZO_DTYPE_F32, ZO_DTYPE_F32));
    check(model_save(bf16_path, &l, (const void *const *)src, ZO_DTYPE_F32, ZO_DTYPE_BF16));
    void **gsrc = alloc_blocks(&lg, ZO_DTYPE_F32);
    check(model_save(gpt_path, &lg, (const void *const *)gsrc, ZO_DTYPE_F32, ZO_DTYPE_F32));
    free_blocks(&lg, gsrc);

    model_ckpt cf32, cbf16, cgpt;
    check(model_ckpt_open(&cf32, f32_path));
    check(model_ckpt_open(&cbf16, bf16_path));
    check(model_ckpt_open(&cgpt, gpt_path));
    double gb = 1e-9;
    double f32_bytes = (double)l.total_numel * 4, bf16_bytes = (double)l.total_numel * 2;

    bench_row("%-34s %10s %10s %8s", "case", "file MB", "ms", "GB/s");
    copy_case cc = {.ckpt = &cf32, .dst = malloc(l.total_numel * 4)};
    if (!cc.dst) return 1;
    double t_copy = bench_time_best(run_copy, &cc, 1, 3, 1.0);
    bench_row("%-34s %10.1f %10.2f %8.2f", "read the F32 file as stored", f32_bytes / 1e6,
              t_copy * 1e3, f32_bytes * gb / t_copy);
    free(cc.dst);

    void **b32 = alloc_blocks(&l, ZO_DTYPE_F32), **b16 = alloc_blocks(&l, ZO_DTYPE_BF16);
    load_case lc = {.ckpt = &cf32, .l = &l, .blocks = b32, .dt = ZO_DTYPE_F32};
    double t_load = bench_time_best(run_load, &lc, 1, 3, 1.0);
    bench_row("%-34s %10.1f %10.2f %8.2f", "load llama F32 -> fp32", f32_bytes / 1e6,
              t_load * 1e3, f32_bytes * gb / t_load);
    lc = (load_case){.ckpt = &cf32, .l = &l, .blocks = b16, .dt = ZO_DTYPE_BF16};
    double t = bench_time_best(run_load, &lc, 1, 3, 1.0);
    bench_row("%-34s %10.1f %10.2f %8.2f", "load llama F32 -> bf16", f32_bytes / 1e6, t * 1e3,
              f32_bytes * gb / t);
    lc = (load_case){.ckpt = &cbf16, .l = &l, .blocks = b32, .dt = ZO_DTYPE_F32};
    t = bench_time_best(run_load, &lc, 1, 3, 1.0);
    bench_row("%-34s %10.1f %10.2f %8.2f", "load llama BF16 -> fp32", bf16_bytes / 1e6, t * 1e3,
              bf16_bytes * gb / t);
    lc = (load_case){.ckpt = &cbf16, .l = &l, .blocks = b16, .dt = ZO_DTYPE_BF16};
    t = bench_time_best(run_load, &lc, 1, 3, 1.0);
    bench_row("%-34s %10.1f %10.2f %8.2f", "load llama BF16 -> bf16", bf16_bytes / 1e6, t * 1e3,
              bf16_bytes * gb / t);

    void **g32 = alloc_blocks(&lg, ZO_DTYPE_F32);
    double g_bytes = (double)lg.total_numel * 4;
    lc = (load_case){.ckpt = &cgpt, .l = &lg, .blocks = g32, .dt = ZO_DTYPE_F32};
    t = bench_time_best(run_load, &lc, 1, 3, 1.0);
    bench_row("%-34s %10.1f %10.2f %8.2f", "load gpt2 F32 -> fp32 (Conv1D T)", g_bytes / 1e6,
              t * 1e3, g_bytes * gb / t);

    lc = (load_case){.l = &l, .blocks = b32, .dt = ZO_DTYPE_F32, .path = save_path};
    t = bench_time_best(run_save, &lc, 0, 3, 1.0);
    bench_row("%-34s %10.1f %10.2f %8.2f", "save llama fp32 -> F32 (+fsync)", f32_bytes / 1e6,
              t * 1e3, f32_bytes * gb / t);
    lc = (load_case){.l = &lg, .blocks = g32, .dt = ZO_DTYPE_F32, .path = save_path};
    t = bench_time_best(run_save, &lc, 0, 3, 1.0);
    bench_row("%-34s %10.1f %10.2f %8.2f", "save gpt2 fp32 -> F32 (Conv1D T)", g_bytes / 1e6,
              t * 1e3, g_bytes * gb / t);

    /* batches: 16M uint16 tokens */
    {
        const size_t n = 16u << 20;
        uint16_t *tok = malloc(n * 2);
        if (!tok) return 1;
        for (size_t i = 0; i < n; i++) tok[i] = (uint16_t)((i * 2654435761u) % 50257);
        FILE *f = fopen(tok_path, "wb");
        if (!f || fwrite(tok, 2, n, f) != n) return 1;
        fclose(f);
        free(tok);
        model_tokens tf;
        check(model_tokens_open(&tf, tok_path, MODEL_TOKENS_U16, 50257));
        batch_case bc = {.t = &tf, .in = malloc(8 * 1024 * 4), .tg = malloc(8 * 1024 * 4)};
        if (!bc.in || !bc.tg) return 1;
        t = bench_time_best(run_batch, &bc, 5, 50, 0.5);
        bench_row("%-34s %10.1f %10.3f %8s  %.0f Mtokens/s", "batch 8 x 1024 (u16, checked)",
                  (double)n * 2 / 1e6, t * 1e3, "-", 8 * 1024 / t / 1e6);
        free(bc.in);
        free(bc.tg);
        model_tokens_close(&tf);
    }

    free_blocks(&l, b32);
    free_blocks(&l, b16);
    free_blocks(&lg, g32);
    free_blocks(&l, src);
    model_ckpt_close(&cf32);
    model_ckpt_close(&cbf16);
    model_ckpt_close(&cgpt);
    unlink(f32_path);
    unlink(bf16_path);
    unlink(gpt_path);
    unlink(save_path);
    unlink(tok_path);
    model_layout_free(&l);
    model_layout_free(&lg);
    bench_result("load F32->fp32 bandwidth / raw read bandwidth", t_copy / t_load);
    return 0;
}
