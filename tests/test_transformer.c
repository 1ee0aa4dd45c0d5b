/* Tests for the transformer (transformer/): tiny GPT-2, LLaMA (GQA, untied) and
 * Qwen2 (q/k/v biases, tied) against the PyTorch float64 implementation of
 * tests/fixtures/gpu/make_fixtures.py: logits, loss, every gradient, and the
 * losses of 10 AdamW steps; the block-by-block API with streamed weights;
 * determinism; the device-memory capacity; what tf_init computes of sliding
 * windows and rope_scaling, and what it refuses by name; the `train` program. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu/profile.h"       /* defines: gpu_profile_start, gpu_profile_op_calls */
#include "model/data.h"        /* defines: model_tokens, model_batch_get */
#include "common/fileio.h"     /* defines: zo_file_read_all */
#include "model/hf.h"          /* defines: model_hf_save, model_hf_config */
#include "model/lora.h"        /* defines: model_lora_save */
#include "model/safetensors.h" /* defines: model_st_open, model_load_path */
#include "tests/support/check.h" /* defines: check_close_f32 */
#include "tests/support/files.h" /* defines: files_write_text */
#include "tests/support/ref_trainer.h" /* defines: tf_trainer, tf_model */
#include "tests/support/run.h"         /* defines: run_capture */
#include "transformer/generate.h"      /* defines: tf_gen, tf_gen_prompt, tf_gen_next */
#include "tests/support/scratch.h" /* defines: scratch_path */

/* The PyTorch references: the committed ones, or those the ctest entry
 * test_transformer_torch has just made with /usr/bin/python3 (ZO_GPU_FIXTURES). */
static const char *fix_dir(void)
{
    const char *d = getenv("ZO_GPU_FIXTURES");
    return d && *d ? d : ZO_FIXTURES_DIR "/gpu";
}
#define B 2
#define T 8
#define T_MAX 64 /* the longest fixture's sequences (tiny_phi3's 56) */

/* ---- fixtures ----------------------------------------------------------------- */

/* A named tensor of an expected-values file as fp32 (caller frees). */
static float *read_expected(const char *name, const char *tensor, size_t *n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s_expected.safetensors", fix_dir(), name);
    model_st_file f;
    assert_int_equal(model_st_open(&f, path), ZO_OK);
    const model_st_tensor *t = model_st_find(&f, tensor);
    assert_non_null(t);
    float *out = malloc(t->numel * sizeof(float));
    assert_int_equal(model_st_read(&f, t, out, ZO_DTYPE_F32, 0), ZO_OK);
    if (n) *n = t->numel;
    model_st_close(&f);
    return out;
}

typedef struct fixture {
    const char *name;
    zo_model_config cfg;
    gpu_device_t dev;
    gpu_stream_t s;
    tf_model m;
    tf_trainer tr;
    int t; /* its sequences' length: T, or the fixture's own (tiny_phi3) */
    int32_t inputs[B * T_MAX], targets[B * T_MAX];
} fixture;

static void fixture_open_opts(fixture *fx, const char *name, zo_dtype dt, int n_threads, const tf_adamw *opt,
                              const tf_options *to);

/* The sequence length the next fixture opened builds its model for, when
 * longer than its own (0: its own): a batch shorter than the model holds.
 * Opening a fixture sets it back to 0. */
static int fixture_build_t;

static void fixture_open(fixture *fx, const char *name, zo_dtype dt, int n_threads,
                         const tf_adamw *opt)
{
    fixture_open_opts(fx, name, dt, n_threads, opt, NULL);
}

static void fixture_open_opts(fixture *fx, const char *name, zo_dtype dt, int n_threads, const tf_adamw *opt,
                              const tf_options *to)
{
    memset(fx, 0, sizeof *fx);
    fx->name = name;
    char path[512];
    snprintf(path, sizeof path, "%s/%s.json", fix_dir(), name);
    if (zo_model_config_load(path, &fx->cfg) != ZO_OK) fail_msg("%s", zo_last_error());
    size_t n_in;
    float *in = read_expected(name, "inputs", &n_in), *tg = read_expected(name, "targets", NULL);
    fx->t = (int)(n_in / B);
    assert_true(fx->t >= 1 && fx->t <= T_MAX);
    gpu_cpu_options o = {.n_threads = n_threads};
    assert_int_equal(gpu_device_init_cpu(&o, &fx->dev), ZO_OK);
    assert_int_equal(gpu_stream_create(fx->dev, &fx->s), ZO_OK);
    const int build_t = fx->t > fixture_build_t ? fx->t : fixture_build_t;
    fixture_build_t = 0;
    if (tf_init_opts(&fx->m, &fx->cfg, fx->dev, dt, B, build_t, to) != ZO_OK)
        fail_msg("tf_init: %s", zo_last_error());
    tf_adamw none = {.lr = 0};
    assert_int_equal(tf_trainer_init(&fx->tr, &fx->m, opt ? opt : &none), ZO_OK);
    snprintf(path, sizeof path, "%s/%s.safetensors", fix_dir(), name);
    model_load_report rep;
    assert_int_equal(model_load_path(path, &fx->m.layout, (void *const *)fx->tr.master,
                                     ZO_DTYPE_F32, MODEL_LOAD_STRICT, &rep), ZO_OK);
    assert_int_equal(rep.n_missing, 0);
    assert_int_equal(tf_trainer_upload(&fx->tr, fx->s), ZO_OK);
    for (int i = 0; i < B * fx->t; i++) {
        fx->inputs[i] = (int32_t)in[i];
        fx->targets[i] = (int32_t)tg[i];
    }
    free(in);
    free(tg);
}

static void fixture_close(fixture *fx)
{
    tf_trainer_free(&fx->tr);
    tf_free(&fx->m);
    gpu_stream_destroy(fx->s);
    gpu_mem_stats ms;
    gpu_mem_get_stats(fx->dev, &ms);
    assert_int_equal(ms.n_allocs, 0);
    gpu_device_free(fx->dev);
}

/* ---- logits, loss, gradients ------------------------------------------------------------ */

static void download_as(fixture *fx, float *dst, const void *src, size_t n, zo_dtype dt)
{
    void *tmp = malloc(n * zo_dtype_size(dt));
    assert_int_equal(gpu_memcpy_async(fx->s, tmp, src, n * zo_dtype_size(dt), GPU_COPY_DEVICE_TO_HOST), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(fx->s), ZO_OK);
    zo_convert(dst, ZO_DTYPE_F32, tmp, dt, n);
    free(tmp);
}

static void run_against_torch(const char *name)
{
    fixture fx;
    fixture_open(&fx, name, ZO_DTYPE_F32, 2, NULL);
    int V = fx.cfg.vocab, t = fx.t;
    /* forward: logits and loss */
    assert_int_equal(tf_set_batch(&fx.m, fx.s, fx.inputs, fx.targets, B, t), ZO_OK);
    assert_int_equal(tf_forward(&fx.m, fx.tr.params, fx.s), ZO_OK);
    float loss;
    assert_int_equal(tf_loss(&fx.m, fx.s, &loss), ZO_OK);
    float *logits = malloc((size_t)B * t * V * sizeof(float));
    download_as(&fx, logits, fx.m.logits, (size_t)B * t * V, ZO_DTYPE_F32); /* logits are fp32 */
    /* Gemma-2: the buffer holds the head's output, which the loss soft-caps;
     * Hugging Face's logits are capped */
    const double cap = fx.cfg.final_softcap;
    for (size_t i = 0; cap > 0.0 && i < (size_t)B * t * V; i++) logits[i] = (float)(cap * tanh(logits[i] / cap));
    size_t n;
    float *want_logits = read_expected(name, "logits", &n);
    float *want_loss = read_expected(name, "loss", NULL);
    assert_int_equal(n, (size_t)B * t * V);
    assert_int_equal(check_close_f32("logits", logits, want_logits, n, 2e-5, 2e-5), 0);
    assert_int_equal(check_close_f32("loss", &loss, want_loss, 1, 1e-5, 1e-5), 0);

    /* backward: every gradient, loaded by name from the torch file */
    tf_step_info info;
    assert_int_equal(tf_trainer_grads(&fx.tr, fx.s, fx.inputs, fx.targets, B, t, &info), ZO_OK);
    assert_int_equal(check_close_f32("loss (trainer)", &info.loss, want_loss, 1, 1e-5, 1e-5), 0);
    int nb = fx.m.layout.n_blocks;
    float **want = calloc(nb, sizeof(float *));
    for (int b = 0; b < nb; b++) want[b] = calloc(fx.m.layout.block_numel[b] + 1, sizeof(float));
    char path[512];
    snprintf(path, sizeof path, "%s/%s_grads.safetensors", fix_dir(), name);
    assert_int_equal(model_load_path(path, &fx.m.layout, (void *const *)want, ZO_DTYPE_F32, 0, NULL), ZO_OK);
    int bad = 0;
    double sumsq = 0.0;
    for (int i = 0; i < fx.m.layout.n_tensors; i++) {
        const model_tensor *t = &fx.m.layout.tensors[i];
        bad += check_close_f32(t->name, fx.tr.grad[t->block] + t->offset, want[t->block] + t->offset,
                           t->numel, 1e-5, 1e-3);
        for (size_t e = 0; e < t->numel; e++) sumsq += (double)want[t->block][t->offset + e] * want[t->block][t->offset + e];
    }
    assert_int_equal(bad, 0);
    assert_true(fabs(info.grad_norm - sqrt(sumsq)) <= 1e-4 * sqrt(sumsq));
    for (int b = 0; b < nb; b++) free(want[b]);
    free(want);
    free(logits);
    free(want_logits);
    free(want_loss);
    fixture_close(&fx);
}

/* --loss-chunk (issue 30): the output layer and the cross-entropy 5 tokens
 * at a time (chunks of 5, 5, 5 and 1 of the 16): the loss and every
 * gradient equal the unchunked path's within 1e-6 relative (of the
 * tensor's largest), and PyTorch's within the unchunked test's tolerance;
 * the logits buffer holds 5 tokens. */
static void check_loss_chunk(const char *name)
{
    fixture a, c;
    tf_options to = {.loss_chunk = 5};
    fixture_open(&a, name, ZO_DTYPE_F32, 2, NULL);
    fixture_open_opts(&c, name, ZO_DTYPE_F32, 2, NULL, &to);
    tf_step_info ia, ic;
    assert_int_equal(tf_trainer_grads(&a.tr, a.s, a.inputs, a.targets, B, T, &ia), ZO_OK);
    assert_int_equal(tf_trainer_grads(&c.tr, c.s, c.inputs, c.targets, B, T, &ic), ZO_OK);
    assert_true(fabsf(ic.loss - ia.loss) <= 1e-6f * fabsf(ia.loss));
    float *want_loss = read_expected(name, "loss", NULL);
    assert_int_equal(check_close_f32("loss (chunked)", &ic.loss, want_loss, 1, 1e-5, 1e-5), 0);
    int nb = a.m.layout.n_blocks, bad = 0;
    float **torch = calloc(nb, sizeof(float *));
    for (int b = 0; b < nb; b++) torch[b] = calloc(a.m.layout.block_numel[b] + 1, sizeof(float));
    char path[512];
    snprintf(path, sizeof path, "%s/%s_grads.safetensors", fix_dir(), name);
    assert_int_equal(model_load_path(path, &a.m.layout, (void *const *)torch, ZO_DTYPE_F32, 0, NULL), ZO_OK);
    double worst = 0;
    for (int i = 0; i < a.m.layout.n_tensors; i++) {
        const model_tensor *t = &a.m.layout.tensors[i];
        const float *g0 = a.tr.grad[t->block] + t->offset, *g1 = c.tr.grad[t->block] + t->offset;
        double big = 0, diff = 0;
        for (size_t e = 0; e < t->numel; e++) {
            big = fmax(big, fabs((double)g0[e]));
            diff = fmax(diff, fabs((double)g1[e] - (double)g0[e]));
        }
        if (big > 0) worst = fmax(worst, diff / big);
        if (diff > 1e-6 * big) {
            fprintf(stderr, "%s: chunked gradient differs by %.3g of its largest %.3g\n", t->name, diff, big);
            bad++;
        }
        bad += check_close_f32(t->name, g1, torch[t->block] + t->offset, t->numel, 1e-5, 1e-3);
    }
    printf("  %s: loss %.7f chunked %.7f; gradients differ by at most %.3g of a tensor's largest\n", name,
           (double)ia.loss, (double)ic.loss, worst);
    assert_int_equal(bad, 0);
    for (int b = 0; b < nb; b++) free(torch[b]);
    free(torch);
    free(want_loss);
    fixture_close(&a);
    fixture_close(&c);
}

static void test_loss_chunk(void **state)
{
    (void)state;
    check_loss_chunk("tiny_gpt2");
    check_loss_chunk("tiny_llama");
    check_loss_chunk("tiny_phi"); /* the output layer's bias in every chunk */
}

static void test_gpt2_vs_torch(void **state)
{
    (void)state;
    run_against_torch("tiny_gpt2");
}

static void test_llama_vs_torch(void **state)
{
    (void)state;
    run_against_torch("tiny_llama");
}

/* tf_load_blocks' count of the blocks it hands on */
static zo_status count_blocks(void *ctx, int block, const void *buf)
{
    (void)block, (void)buf;
    ++*(int *)ctx;
    return ZO_OK;
}

/* A checkpoint its config does not describe is refused by tf_load_blocks
 * (what train and generate load through) before any block is handed on:
 * Qwen2's q/k/v biases under a config without them (attention_bias false)
 * were read past without a word, and the model trained without them. The
 * same checkpoint under its own config loads every block; a config of one
 * layer finds the second layer's tensors. */
static void test_load_refuses_unexpected(void **state)
{
    (void)state;
    char path[512], st[512];
    snprintf(path, sizeof path, "%s/tiny_qwen2.json", fix_dir());
    snprintf(st, sizeof st, "%s/tiny_qwen2.safetensors", fix_dir());
    zo_model_config cfg;
    if (zo_model_config_load(path, &cfg) != ZO_OK) fail_msg("%s", zo_last_error());
    assert_true(cfg.attn_bias && cfg.n_layers >= 2);
    for (int k = 0; k < 3; k++) {
        zo_model_config c = cfg;
        if (k == 1) c.attn_bias = 0;
        if (k == 2) c.n_layers = 1;
        model_layout l;
        assert_int_equal(model_layout_init(&l, &c), ZO_OK);
        int blocks = 0;
        zo_status s = tf_load_blocks(&l, st, 0, count_blocks, &blocks);
        if (k == 0) {
            if (s != ZO_OK) fail_msg("%s", zo_last_error());
            assert_int_equal(blocks, l.n_blocks);
        } else {
            assert_int_equal(s, ZO_ERR_FORMAT);
            assert_int_equal(blocks, 0);
            const char *e = zo_last_error();
            assert_non_null(strstr(e, "tiny_qwen2.safetensors"));
            assert_non_null(strstr(e, k == 1 ? "_proj.bias\"" : "model.layers.1."));
        }
        model_layout_free(&l);
    }
}

static void test_qwen2_vs_torch(void **state)
{
    (void)state;
    run_against_torch("tiny_qwen2");
}

/* Qwen3: RMSNorm on each q and k head (head_dim 12, not hidden / heads), GQA */
static void test_qwen3_vs_torch(void **state)
{
    (void)state;
    run_against_torch("tiny_qwen3");
}

/* Phi: one norm before a parallel attention and MLP, rotary on 6 of 16, q, k
 * and v apart, an output layer with a bias (its gradient among the others) */
static void test_phi_vs_torch(void **state)
{
    (void)state;
    run_against_torch("tiny_phi");
}

/* ---- 10 AdamW steps -------------------------------------------------------------------- */

/* ---- generation: a key/value cache against PyTorch's logits ------------------------------ */

/* The logits of one forward of generation model g over the fixture's
 * weights, checked row by row against PyTorch's full-sequence logits at
 * the positions (row j, pos[j] + last[j]). */
static int gen_check(fixture *fx, tf_model *g, const int32_t *tok, int t, const int *pos, const int *last,
                     const float *want)
{
    int V = fx->cfg.vocab, bad = 0;
    float *got = malloc((size_t)B * V * sizeof(float));
    assert_int_equal(tf_set_tokens(g, fx->s, tok, B, t, pos, last), ZO_OK);
    tf_model_bufs bufs = {.params = fx->tr.params};
    assert_int_equal(tf_forward_all(g, &bufs, fx->s), ZO_OK);
    assert_int_equal(tf_logits(g, fx->s, got), ZO_OK);
    for (int j = 0; j < B; j++) {
        char what[96];
        snprintf(what, sizeof what, "%s: sequence %d, position %d", fx->name, j, pos[j] + last[j]);
        bad += check_close_f32(what, got + (size_t)j * V, want + ((size_t)j * fx->t + pos[j] + last[j]) * V, (size_t)V,
                               2e-5, 2e-5);
    }
    free(got);
    return bad;
}

/* The calls of each of the n ops `names` the op profile counted in the
 * forward of gen_check (its arguments), into calls[n]. */
static void gen_check_calls(fixture *fx, tf_model *g, const int32_t *tok, int t, const int *pos, const int *last,
                            const float *want, const char *const *names, int n, double *calls, int *bad)
{
    gpu_profile *p;
    assert_int_equal(gpu_profile_start(fx->dev, &p), ZO_OK);
    gpu_profile_step_begin(p);
    *bad += gen_check(fx, g, tok, t, pos, last, want);
    assert_int_equal(gpu_profile_step_end(p), ZO_OK);
    assert_int_equal(gpu_profile_stop(p), ZO_OK);
    for (int i = 0; i < n; i++) calls[i] = gpu_profile_op_calls(p, names[i]);
    gpu_profile_free(p);
}

/* Generation through the key/value cache: a prompt, a chunk of two, then
 * one token at a time (the fixture's own next tokens), gives PyTorch's logits of the
 * whole sequence at every position; with both sequences at one position
 * and at different ones (the shorter prompt padded: its padding's keys are
 * overwritten as it goes on), which takes RoPE's per-sequence positions
 * (one rope call a layer for the batch: gpu_rope_forward_seq) and the
 * learned positions' (one embedding call for the batch:
 * gpu_embedding_forward_seq). */
static void run_generation(const char *name)
{
    fixture fx;
    fixture_open(&fx, name, ZO_DTYPE_F32, 2, NULL);
    float *want = read_expected(name, "logits", NULL);
    tf_model g;
    const int t = fx.t; /* the cache holds the fixture's sequence */
    tf_options o = {.kv_len = t};
    assert_int_equal(tf_init_opts(&g, &fx.cfg, fx.dev, ZO_DTYPE_F32, B, 5, &o), ZO_OK);
    int32_t tok[B * 5];
    int bad = 0;
    /* one position: prompts of 3, then positions 3..7 */
    int pos[B] = {0, 0}, last[B] = {2, 2};
    for (int j = 0; j < B; j++)
        for (int i = 0; i < 3; i++) tok[j * 3 + i] = fx.inputs[j * t + i];
    bad += gen_check(&fx, &g, tok, 3, pos, last, want);
    /* a chunk of 2 after them (positions 3 and 4: a multi-token call past
     * position 0, which the latent cache attends absorbed, its 4 rows in
     * chunks of B), then one at a time */
    int three[B] = {3, 3}, one_on[B] = {1, 1};
    for (int j = 0; j < B; j++)
        for (int i = 0; i < 2; i++) tok[j * 2 + i] = fx.inputs[j * t + 3 + i];
    bad += gen_check(&fx, &g, tok, 2, three, one_on, want);
    for (int p = 5; p < t; p++) {
        int one[B] = {p, p}, zero[B] = {0, 0};
        for (int j = 0; j < B; j++) tok[j] = fx.inputs[j * t + p];
        bad += gen_check(&fx, &g, tok, 1, one, zero, want);
    }
    /* different positions: prompts of 3 (padded to 5) and 5 over the same caches */
    int last2[B] = {2, 4};
    for (int j = 0; j < B; j++)
        for (int i = 0; i < 5; i++) tok[j * 5 + i] = j == 0 && i >= 3 ? 1 : fx.inputs[j * t + i];
    bad += gen_check(&fx, &g, tok, 5, pos, last2, want);
    for (int k = 0; k < 3; k++) {
        int at[B] = {3 + k, 5 + k}, zero[B] = {0, 0};
        for (int j = 0; j < B; j++) tok[j] = fx.inputs[j * t + at[j]];
        static const char *const ops[] = {"rope_forward", "embedding_forward"};
        double calls[2];
        gen_check_calls(&fx, &g, tok, 1, at, zero, want, ops, 2, calls, &bad);
        /* one rope a layer where positions rotate (the LLaMA family, GPT layers with rotary) */
        int rotary = fx.cfg.arch != ZO_ARCH_GPT || fx.cfg.pos == ZO_POS_ROTARY;
        if (calls[0] != (rotary ? fx.cfg.n_layers : 0))
            fail_msg("%s: %g rope calls in a step of %d layers", name, calls[0], fx.cfg.n_layers);
        if (calls[1] != 1) fail_msg("%s: %g embedding calls in a step of %d sequences", name, calls[1], B);
    }
    /* a position past the cache is refused, naming it */
    int past[B] = {t, 0}, zero[B] = {0, 0};
    assert_int_equal(tf_set_tokens(&g, fx.s, tok, B, 1, past, zero), ZO_ERR_INVALID);
    char said[64];
    snprintf(said, sizeof said, "outside the cache of %d", t);
    assert_non_null(strstr(zo_last_error(), said));
    /* and a generation model trains nothing */
    assert_int_equal(tf_set_batch(&g, fx.s, fx.inputs, fx.targets, B, 5), ZO_ERR_INVALID);
    assert_int_equal(bad, 0);
    tf_free(&g);
    free(want);
    fixture_close(&fx);
}

static void test_generation_vs_torch(void **state)
{
    (void)state;
    run_generation("tiny_gpt2");
    run_generation("tiny_llama");
    run_generation("tiny_qwen2");
    run_generation("tiny_qwen3");
    /* Phi-3: the window of 20 over a cache of 56; longrope within its
     * original length (short_factor, the attention factor) */
    run_generation("tiny_phi3");
    run_generation("tiny_phi3_longrope_short");
    /* DeepSeek-V2 over its latent cache (the default): kv_b_proj absorbed */
    run_generation("tiny_deepseek_v2");
}

/* Generation on the forward-only runtime (transformer/generate.h), the
 * weights resident, streamed from pinned host memory and read from NVMe
 * (prefetch 0 and 2): a prompt of 3 tokens per sequence, then the
 * fixture's next tokens one at a time give PyTorch's logits at every
 * position. The tied GPT-2 head reads the embedding's slot. */
static void run_gen_placements(const char *name)
{
    char cfgp[512], wp[512], nvme[64];
    snprintf(cfgp, sizeof cfgp, "%s/%s.json", fix_dir(), name);
    snprintf(wp, sizeof wp, "%s/%s.safetensors", fix_dir(), name);
    scratch_path(nvme, sizeof nvme, "zo_test_gen_%d", (int)getpid());
    assert_int_equal(mkdir(nvme, 0700), 0);
    zo_model_config cfg;
    assert_int_equal(zo_model_config_load(cfgp, &cfg), ZO_OK);
    float *want = read_expected(name, "logits", NULL), *in = read_expected(name, "inputs", NULL);
    int V = cfg.vocab;
    float *got = malloc((size_t)B * V * sizeof(float));
    const offload_tier tiers[] = {OFFLOAD_DEVICE, OFFLOAD_CPU, OFFLOAD_CPU, OFFLOAD_NVME};
    const int depth[] = {2, 0, 2, 1};
    for (int c = 0; c < 4; c++) {
        gpu_cpu_options o = {.n_threads = 2};
        gpu_device_t dev;
        assert_int_equal(gpu_device_init_cpu(&o, &dev), ZO_OK);
        tf_gen_config gc = {.batch = B, .prompt_max = 3, .ctx = T, .dtype = ZO_DTYPE_F32};
        offload_config_defaults(&gc.oc);
        gc.oc.params_on = tiers[c];
        gc.oc.prefetch_depth = depth[c];
        gc.oc.nvme_dir = nvme;
        tf_gen g;
        assert_int_equal(tf_gen_init(&g, &cfg, dev, &gc), ZO_OK);
        assert_int_equal(tf_gen_load(&g, wp, 0, NULL), ZO_OK);
        int32_t prompt[B][3], next[B];
        const int32_t *pp[B] = {prompt[0], prompt[1]};
        int lens[B] = {3, 3}, bad = 0;
        for (int j = 0; j < B; j++)
            for (int i = 0; i < 3; i++) prompt[j][i] = (int32_t)in[j * T + i];
        for (int p = 2; p < T; p++) {
            if (p == 2) assert_int_equal(tf_gen_prompt(&g, pp, lens, B, got), ZO_OK);
            else {
                for (int j = 0; j < B; j++) next[j] = (int32_t)in[j * T + p];
                assert_int_equal(tf_gen_next(&g, next, got), ZO_OK);
            }
            for (int j = 0; j < B; j++) {
                char what[128];
                snprintf(what, sizeof what, "%s, weights on %s, prefetch %d: sequence %d, position %d", name,
                         offload_tier_name(tiers[c]), depth[c], j, p);
                bad += check_close_f32(what, got + (size_t)j * V, want + ((size_t)j * T + p) * V, (size_t)V, 2e-5,
                                       2e-5);
            }
        }
        /* the context is full: one more token is refused */
        assert_int_equal(tf_gen_next(&g, next, got), ZO_ERR_INVALID);
        assert_non_null(strstr(zo_last_error(), "the context's 8"));
        /* and a forward-only runtime trains nothing */
        assert_int_equal(offload_step(g.rt, &(offload_step_info){0}), ZO_ERR_INVALID);
        assert_int_equal(bad, 0);
        tf_gen_free(&g);
        gpu_mem_stats ms;
        gpu_mem_get_stats(dev, &ms);
        assert_int_equal(ms.n_allocs, 0);
        gpu_device_free(dev);
    }
    free(got);
    free(want);
    free(in);
    rmdir(nvme);
}

static void test_generation_placements(void **state)
{
    (void)state;
    run_gen_placements("tiny_gpt2");
    run_gen_placements("tiny_llama");
}

/* ---- DeepSeek-V2's latent cache against its full one ------------------------------------------ */

/* One generation of tiny_deepseek_v2 (fp32, 2 sequences: prompts of 3 and 5,
 * then MLA_STEPS tokens), its logits after the prompt and after each token
 * into out [(1 + MLA_STEPS) x 2 x vocab]; its cache's bytes into *kv. */
#define MLA_STEPS 6
static void mla_generate(const zo_model_config *cfg, const char *weights, int mla_cache, offload_tier on,
                         const tf_lora_options *lora, const char *adapter, float *out, size_t *kv)
{
    gpu_cpu_options o = {.n_threads = 2};
    gpu_device_t dev;
    assert_int_equal(gpu_device_init_cpu(&o, &dev), ZO_OK);
    tf_gen_config gc = {.batch = B, .prompt_max = 5, .ctx = 5 + MLA_STEPS, .dtype = ZO_DTYPE_F32,
                        .mla_cache = mla_cache};
    if (lora) gc.lora = *lora;
    offload_config_defaults(&gc.oc);
    gc.oc.params_on = on;
    gc.oc.prefetch_depth = 1;
    tf_gen g;
    assert_int_equal(tf_gen_init(&g, cfg, dev, &gc), ZO_OK);
    assert_int_equal(tf_gen_load(&g, weights, 0, adapter), ZO_OK);
    *kv = g.m.kv_bytes;
    const int V = cfg->vocab;
    int32_t p0[5] = {3, 17, 40}, p1[5] = {9, 2, 33, 61, 5}, next[B];
    const int32_t *pp[B] = {p0, p1};
    int lens[B] = {3, 5};
    assert_int_equal(tf_gen_prompt(&g, pp, lens, B, out), ZO_OK);
    for (int k = 1; k <= MLA_STEPS; k++) {
        for (int j = 0; j < B; j++) next[j] = (int32_t)((7 * k + 11 * j + 1) % V);
        assert_int_equal(tf_gen_next(&g, next, out + (size_t)k * B * V), ZO_OK);
    }
    tf_gen_free(&g);
    gpu_device_free(dev);
}

/* A PEFT adapter directory for the model's adapter layout, every
 * A and B drawn nonzero (B at the scale of A: the adapters move the logits). */
static void mla_write_adapter(const zo_model_config *cfg, const tf_lora_options *lora, const char *dir,
                              uint64_t seed)
{
    gpu_cpu_options o = {.n_threads = 1};
    gpu_device_t dev;
    assert_int_equal(gpu_device_init_cpu(&o, &dev), ZO_OK);
    tf_gen_config gc = {.batch = 1, .prompt_max = 1, .ctx = 1, .dtype = ZO_DTYPE_F32, .lora = *lora};
    offload_config_defaults(&gc.oc);
    tf_gen g;
    assert_int_equal(tf_gen_init(&g, cfg, dev, &gc), ZO_OK);
    const model_layout *ad = &g.m.adapters;
    float **blocks = calloc((size_t)ad->n_blocks, sizeof *blocks);
    uint64_t x = 0x9e3779b97f4a7c15ull ^ seed;
    for (int b = 0; b < ad->n_blocks; b++) {
        blocks[b] = calloc(ad->block_numel[b] + 1, sizeof(float));
        for (size_t i = 0; i < ad->block_numel[b]; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            blocks[b][i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) * 0.6f;
        }
    }
    zo_lora_config lc = {.r = lora->r, .alpha = lora->alpha, .targets = lora->targets};
    assert_int_equal(model_lora_save(dir, ad, &lc, NULL, (const void *const *)blocks, ZO_DTYPE_F32, ZO_DTYPE_F32),
                     ZO_OK);
    for (int b = 0; b < ad->n_blocks; b++) free(blocks[b]);
    free(blocks);
    tf_gen_free(&g);
    gpu_device_free(dev);
}

/* check_close_scaled_f32 of the latent cache's logits against the full
 * cache's, their largest difference against the logits' scale printed. */
static int mla_compare(const char *what, const float *lat, const float *full, size_t n)
{
    double d = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)lat[i] - full[i]));
        scale = fmax(scale, fabs((double)full[i]));
    }
    printf("  %s: largest difference %.2e of the logits' scale %.3g\n", what, d, scale);
    return check_close_scaled_f32(what, lat, full, n, 1e-4, 0.0);
}

/* The prompt's logits over the latent cache against the full cache's, bit
 * for bit: the prompt attends decompressed (transformer.c,
 * mla_decompressed), the full cache's code on the same inputs. */
static int mla_prompt_same(const char *what, const float *lat, const float *full, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&lat[i], &full[i], sizeof *lat)) {
            printf("  %s: logit %zu over the latent cache %.9g, the full cache's %.9g (not the same bits)\n", what,
                   i, (double)lat[i], (double)full[i]);
            return 1;
        }
    return 0;
}

/* DeepSeek-V2's generation over its latent cache (each position's [k_pe |
 * c_kv], kv_b_proj absorbed into the queries: transformer.c,
 * mla_latent_attention) against the same model over the full cache (every
 * head's decompressed key and value, the attention training runs): the
 * logits of a prompt and MLA_STEPS tokens of two sequences at different
 * positions, the weights resident. The prompt attends decompressed and
 * writes the latent rows (mla_decompressed_attention): its logits are the
 * full cache's bits, and the tokens after it, absorbed, read those rows
 * (rows not written, or k_pe taken before RoPE, move their logits); then with LoRA adapters on q_a_proj,
 * q_b_proj, kv_a_proj_with_mqa and kv_b_proj (folded into kv_b_proj's
 * weight for the absorption) with the base streamed from host under the
 * latent cache, and over an NF4 base (QLoRA: kv_b_proj dequantized, the
 * adapter folded into it). The two compute the same function in fp32 and
 * differ in the order of their sums only (q_nope . (W_UK c) against
 * (q_nope W_UK) . c, sums of at most 20 products; softmax over a dozen
 * keys): about 1e-6 of the logits' scale, so 1e-4 of it holds the rounding
 * with room while the absorption's errors (a wrong head's W_UK rows, the
 * k_pe term dropped, the adapter not folded) move the logits by a tenth and
 * more. The cache's bytes: L B ctx (rope + kv_rank) x 4 against 2 L B ctx
 * H (nope + rope) x 4. */
static void test_mla_latent_cache(void **state)
{
    (void)state;
    char cfgp[512], wp[512], adir[64];
    snprintf(cfgp, sizeof cfgp, "%s/tiny_deepseek_v2.json", fix_dir());
    snprintf(wp, sizeof wp, "%s/tiny_deepseek_v2.safetensors", fix_dir());
    scratch_path(adir, sizeof adir, "zo_test_mla_%d", (int)getpid());
    zo_model_config cfg;
    assert_int_equal(zo_model_config_load(cfgp, &cfg), ZO_OK);
    const size_t n = (size_t)(1 + MLA_STEPS) * B * cfg.vocab;
    float *lat = malloc(n * sizeof *lat), *full = malloc(n * sizeof *full), *plain = malloc(n * sizeof *plain);
    size_t kv_lat, kv_full;
    const size_t ctx = 5 + MLA_STEPS, L = (size_t)cfg.n_layers, H = (size_t)cfg.n_heads;
    const zo_mla *x = &cfg.mla;
    int bad = 0;
    mla_generate(&cfg, wp, TF_MLA_CACHE_LATENT, OFFLOAD_DEVICE, NULL, NULL, lat, &kv_lat);
    mla_generate(&cfg, wp, TF_MLA_CACHE_FULL, OFFLOAD_DEVICE, NULL, NULL, full, &kv_full);
    bad += mla_compare("latent against full cache", lat, full, n);
    bad += mla_prompt_same("the prompt", lat, full, (size_t)B * cfg.vocab);
    assert_int_equal(kv_lat, L * B * ctx * (size_t)(x->qk_rope + x->kv_rank) * 4);
    assert_int_equal(kv_full, 2 * L * B * ctx * H * (size_t)(x->qk_nope + x->qk_rope) * 4);
    memcpy(plain, lat, n * sizeof *plain);
    /* adapters on latent attention's four projections (kv_b_proj's too) */
    tf_lora_options lo = {.r = 4, .alpha = 8.0f, .targets = ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V};
    mla_write_adapter(&cfg, &lo, adir, 0);
    for (int nf4 = 0; nf4 < 2; nf4++) {
        lo.nf4 = nf4;
        mla_generate(&cfg, wp, TF_MLA_CACHE_LATENT, nf4 ? OFFLOAD_DEVICE : OFFLOAD_CPU, &lo, adir, lat, &kv_lat);
        mla_generate(&cfg, wp, TF_MLA_CACHE_FULL, OFFLOAD_DEVICE, &lo, adir, full, &kv_full);
        bad += mla_compare(nf4 ? "QLoRA: latent against full cache" : "LoRA: latent against full cache", lat, full,
                           n);
        bad += mla_prompt_same(nf4 ? "QLoRA: the prompt" : "LoRA: the prompt", lat, full, (size_t)B * cfg.vocab);
        /* the adapters matter: the logits move by far more than the tolerance */
        double moved = 0, scale = 0;
        for (size_t i = 0; i < n; i++) {
            moved = fmax(moved, fabs((double)lat[i] - plain[i]));
            scale = fmax(scale, fabs((double)plain[i]));
        }
        if (moved < 1e-2 * scale) fail_msg("the adapters moved the logits by %g of %g", moved, scale);
    }
    assert_int_equal(bad, 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", adir);
    assert_int_equal(system(cmd), 0);
    free(lat);
    free(full);
    free(plain);
}

/* One forward of b x t tokens at positions pos (tf_set_tokens: what
 * tf_gen_next makes for t 1), the logits of each sequence's last row. */
static void mla_call(tf_gen *g, const int32_t *tok, int t, const int *pos, float *logits)
{
    int last[B];
    for (int j = 0; j < B; j++) last[j] = t - 1;
    assert_int_equal(tf_set_tokens(&g->m, g->s, tok, B, t, pos, last), ZO_OK);
    assert_int_equal(offload_forward(g->rt, g->s), ZO_OK);
    assert_int_equal(tf_logits(&g->m, g->s, logits), ZO_OK);
}

/* The calls of mla_calls_generate: a prompt, MLA_LONG tokens after it, 3
 * more, one more; the layer forwards the latent cache took in each form
 * (mla_forms) after each call into forms [4][2]. */
#define MLA_LONG 16
#define MLA_CALLS 4
static void mla_calls_run(tf_gen *g, const zo_model_config *cfg, float *out, uint64_t forms[MLA_CALLS][2])
{
    const int V = cfg->vocab, lens[B] = {3, 5}, ts[MLA_CALLS] = {0, MLA_LONG, 3, 1};
    int32_t p0[5] = {3, 17, 40}, p1[5] = {9, 2, 33, 61, 5}, tok[B * MLA_LONG];
    const int32_t *pp[B] = {p0, p1};
    int pos[B] = {lens[0], lens[1]};
    assert_int_equal(tf_gen_prompt(g, pp, lens, B, out), ZO_OK);
    memcpy(forms[0], g->m.mla_forms, sizeof forms[0]);
    for (int k = 1; k < MLA_CALLS; k++) {
        for (int j = 0; j < B; j++)
            for (int i = 0; i < ts[k]; i++) tok[j * ts[k] + i] = (int32_t)((7 * k + 11 * j + 5 * i + 1) % V);
        mla_call(g, tok, ts[k], pos, out + (size_t)k * B * V);
        memcpy(forms[k], g->m.mla_forms, sizeof forms[k]);
        for (int j = 0; j < B; j++) pos[j] += ts[k];
    }
}

/* tiny_deepseek_v2 (fp32, adapters on q_a, q_b, kv_a and kv_b) over the
 * cache `mla_cache`: mla_calls_run with the adapter of seed 1, then with
 * the adapter of seed 2 loaded into the same model, the logits of each run
 * into out [2][MLA_CALLS B vocab]. */
static void mla_calls_generate(const zo_model_config *cfg, const char *weights, int mla_cache, const char *adir1,
                               const char *adir2, float *out, uint64_t forms[2][MLA_CALLS][2])
{
    gpu_cpu_options o = {.n_threads = 2};
    gpu_device_t dev;
    assert_int_equal(gpu_device_init_cpu(&o, &dev), ZO_OK);
    tf_gen_config gc = {.batch = B, .prompt_max = MLA_LONG, .ctx = 5 + MLA_LONG + 3 + 1, .dtype = ZO_DTYPE_F32,
                        .mla_cache = mla_cache,
                        .lora = {.r = 4, .alpha = 8.0f, .targets = ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V}};
    offload_config_defaults(&gc.oc);
    gc.oc.params_on = OFFLOAD_DEVICE;
    tf_gen g;
    assert_int_equal(tf_gen_init(&g, cfg, dev, &gc), ZO_OK);
    const size_t n = (size_t)MLA_CALLS * B * cfg->vocab;
    assert_int_equal(tf_gen_load(&g, weights, 0, adir1), ZO_OK);
    mla_calls_run(&g, cfg, out, forms[0]);
    assert_int_equal(tf_gen_load(&g, weights, 0, adir2), ZO_OK);
    mla_calls_run(&g, cfg, out + n, forms[1]);
    tf_gen_free(&g);
    gpu_device_free(dev);
}

/* The latent cache's other calls against the full cache's logits. After a
 * prompt of 3 and 5 tokens, a call of MLA_LONG (16) tokens a sequence
 * attends decompressed (mla_decompressed; at tiny_deepseek_v2's shape, H 3,
 * r 20, nope 12, v 10, D 28, d 20, the two sequences' layer is 201600 FLOPs
 * decompressed against 218880 absorbed), the cached positions decompressed
 * from their latent rows; a call of 3 tokens after those is absorbed
 * (60192 against 153120), its 2 x 3 rows wider than the absorbed form's 2
 * (B): in chunks (mla_latent_chunks); then a token. Each call's form is
 * checked (the layer forwards mla_forms counts), and its logits held to the
 * full cache's as test_mla_latent_cache's are (a cached position not
 * decompressed, a row at the wrong position, a chunk's rows or positions
 * wrong move them by far more). Then the adapters are loaded again with
 * other values into the same model and the calls run again: the absorbed
 * form's kv_b_proj adapter terms read the new ones (a fold of the first
 * adapter kept would answer with the first run's logits). */
static void test_mla_latent_calls(void **state)
{
    (void)state;
    char cfgp[512], wp[512], adir1[64], adir2[64];
    snprintf(cfgp, sizeof cfgp, "%s/tiny_deepseek_v2.json", fix_dir());
    snprintf(wp, sizeof wp, "%s/tiny_deepseek_v2.safetensors", fix_dir());
    scratch_path(adir1, sizeof adir1, "zo_test_mla1_%d", (int)getpid());
    scratch_path(adir2, sizeof adir2, "zo_test_mla2_%d", (int)getpid());
    zo_model_config cfg;
    assert_int_equal(zo_model_config_load(cfgp, &cfg), ZO_OK);
    tf_lora_options lo = {.r = 4, .alpha = 8.0f, .targets = ZO_LORA_Q | ZO_LORA_K | ZO_LORA_V};
    mla_write_adapter(&cfg, &lo, adir1, 1);
    mla_write_adapter(&cfg, &lo, adir2, 2);
    const size_t n = (size_t)MLA_CALLS * B * cfg.vocab, L = (size_t)cfg.n_layers;
    float *lat = malloc(2 * n * sizeof *lat), *full = malloc(2 * n * sizeof *full);
    uint64_t fl[2][MLA_CALLS][2], ff[2][MLA_CALLS][2];
    mla_calls_generate(&cfg, wp, TF_MLA_CACHE_LATENT, adir1, adir2, lat, fl);
    mla_calls_generate(&cfg, wp, TF_MLA_CACHE_FULL, adir1, adir2, full, ff);
    int bad = 0;
    for (int run = 0; run < 2; run++) {
        /* the forms: prompt and long call decompressed, then absorbed (counts since the model began) */
        const uint64_t *f0 = run ? fl[0][MLA_CALLS - 1] : (const uint64_t[2]){0, 0};
        static const int want_dec[MLA_CALLS] = {1, 1, 0, 0};
        for (int k = 0; k < MLA_CALLS; k++) {
            const uint64_t *prev = k ? fl[run][k - 1] : f0;
            assert_int_equal(fl[run][k][1] - prev[1], want_dec[k] ? L : 0);
            assert_int_equal(fl[run][k][0] - prev[0], want_dec[k] ? 0 : L);
        }
        static const char *const what[2][MLA_CALLS] = {
            {"adapter 1: the prompt", "adapter 1: 16 tokens after it (decompressed)",
             "adapter 1: 3 tokens after those (absorbed, chunks)", "adapter 1: a token"},
            {"adapter 2: the prompt", "adapter 2: 16 tokens after it (decompressed)",
             "adapter 2: 3 tokens after those (absorbed, chunks)", "adapter 2: a token"}};
        const size_t per = (size_t)B * cfg.vocab;
        for (int k = 0; k < MLA_CALLS; k++)
            bad += mla_compare(what[run][k], lat + run * n + k * per, full + run * n + k * per, per);
    }
    assert_int_equal(ff[1][MLA_CALLS - 1][0] + ff[1][MLA_CALLS - 1][1], 0); /* (the full cache: neither) */
    /* the second adapter moves the absorbed calls' logits by far more than the tolerance */
    double moved = 0, scale = 0;
    for (size_t i = 2 * (size_t)B * cfg.vocab; i < n; i++) {
        moved = fmax(moved, fabs((double)lat[n + i] - lat[i]));
        scale = fmax(scale, fabs((double)lat[i]));
    }
    if (moved < 1e-2 * scale) fail_msg("the second adapter moved the logits by %g of %g", moved, scale);
    assert_int_equal(bad, 0);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", adir1, adir2);
    assert_int_equal(system(cmd), 0);
    free(lat);
    free(full);
}

/* The fixture's data as a uint16 token file, so batches come from the real
 * sampler (model_batch_get, the `train` contract). */
static void write_tokens(const char *name, char *path, size_t len)
{
    size_t n;
    float *data = read_expected(name, "data", &n);
    scratch_path(path, len, "zo_test_tf_%d_%s.u16", (int)getpid(), name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)data[i];
        assert_int_equal(fwrite(&v, 2, 1, f), 1);
    }
    fclose(f);
    free(data);
}

static void run_training(const char *name)
{
    tf_adamw opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                    .weight_decay = 0.1f, .clip = 1.0f};
    fixture fx;
    fixture_open(&fx, name, ZO_DTYPE_F32, 2, &opt);
    char path[256];
    write_tokens(name, path, sizeof path);
    model_tokens tok;
    assert_int_equal(model_tokens_open(&tok, path, MODEL_TOKENS_U16, fx.cfg.vocab), ZO_OK);
    size_t n;
    float *want = read_expected(name, "train_losses", &n);
    float got[16];
    assert_true(n <= 16);
    for (size_t k = 0; k < n; k++) {
        int32_t in[B * T_MAX], tg[B * T_MAX];
        assert_int_equal(model_batch_get(&tok, B, fx.t, (int64_t)k, 0, MODEL_SAMPLE_SEQUENTIAL, in, tg), ZO_OK);
        tf_step_info info;
        assert_int_equal(tf_trainer_step(&fx.tr, fx.s, in, tg, B, fx.t, &info), ZO_OK);
        got[k] = info.loss;
    }
    assert_int_equal(check_close_f32("train losses", got, want, n, 1e-4, 1e-4), 0);
    model_tokens_close(&tok);
    unlink(path);
    free(want);
    fixture_close(&fx);
}

static void test_gpt2_training(void **state)
{
    (void)state;
    run_training("tiny_gpt2");
}

static void test_llama_training(void **state)
{
    (void)state;
    run_training("tiny_llama");
}

/* ---- Phi-3 ---------------------------------------------------------------------------------- */

/* model_hf_save's reader: the fixture's fp32 master weights, block b. */
static zo_status read_master(void *ctx, int b, float *dst)
{
    const fixture *fx = ctx;
    memcpy(dst, fx->tr.master[b], fx->m.layout.block_numel[b] * sizeof(float));
    return ZO_OK;
}

/* Every tensor of safetensors file `path` named as `l` lays it out equals
 * buffer blocks[] there, bit for bit (and the file has no other tensor). */
static void check_file_holds(const char *path, const model_layout *l, float *const *blocks)
{
    model_st_file f;
    assert_int_equal(model_st_open(&f, path), ZO_OK);
    assert_int_equal(f.n_tensors, l->n_tensors);
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *t = &l->tensors[i];
        const model_st_tensor *ft = model_st_find(&f, t->name);
        if (!ft) fail_msg("%s: no %s", path, t->name);
        assert_int_equal(ft->numel, t->numel);
        float *v = malloc(t->numel * sizeof(float));
        assert_int_equal(model_st_read(&f, ft, v, ZO_DTYPE_F32, 0), ZO_OK);
        assert_memory_equal(v, blocks[t->block] + t->offset, t->numel * sizeof(float));
        free(v);
    }
    model_st_close(&f);
}

/* The Hugging Face folder model_hf_save writes from fixture fx (one
 * shard) holds its fp32 master weights under the layout's names; its
 * config.json reads back into *back; the config.json model_hf_config
 * writes for the shape names class `cls` and reads back into *gen with the
 * same parameter count. */
static void export_round_trip(fixture *fx, const char *cls, zo_model_config *back, zo_model_config *gen)
{
    char dir[128], path[256], cfgp[256];
    scratch_path(dir, sizeof dir, "zo_test_%s_%d", fx->name, (int)getpid());
    snprintf(cfgp, sizeof cfgp, "%s/%s.json", fix_dir(), fx->name);
    model_hf_folder hf = {.dir = dir, .l = &fx->m.layout, .dtype = ZO_DTYPE_F32, .config = cfgp};
    int shards = 0;
    if (model_hf_save(&hf, read_master, fx, &shards) != ZO_OK) fail_msg("%s", zo_last_error());
    assert_int_equal(shards, 1);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    check_file_holds(path, &fx->m.layout, fx->tr.master);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (zo_model_config_load(path, back) != ZO_OK) fail_msg("%s", zo_last_error());
    cJSON *o = NULL;
    assert_int_equal(model_hf_config(&fx->cfg, ZO_DTYPE_BF16, &o), ZO_OK);
    char *text = cJSON_Print(o);
    assert_non_null(strstr(text, cls));
    if (zo_model_config_parse(text, "written.json", gen) != ZO_OK) fail_msg("%s", zo_last_error());
    assert_int_equal(zo_model_params(gen), zo_model_params(&fx->cfg));
    free(text);
    cJSON_Delete(o);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* Phi-3 (tests/fixtures/gpu/make_fixtures.py tiny_phi3): its checkpoint
 * holds q|k|v as one qkv_proj [q + 2kv, h] and gate|up as one gate_up_proj
 * [2f, h], loaded straight into the fused views; GQA, a window of 20 over
 * sequences of 56. Logits, loss, every gradient (under the fused names:
 * the split is checked row by row) and 10 AdamW steps against PyTorch; then
 * the Hugging Face folder written from it holds the same names and values,
 * with a config.json that reads back as the same model. */
/* DeepSeek-V2's latent attention (make_fixtures.py tiny_deepseek_v2, its
 * float64 DeepseekV2Attention with the interleaved rotary written out):
 * q through q_lora_rank 24, kv_lora_rank 20, 3 heads of qk_nope 12 +
 * qk_rope 8, v_head_dim 10 (padded to 20 here), dense layers, sequences of
 * 56 past the CPU attention's 48-row query blocks: logits, loss and every
 * gradient (loaded by name, the rotary rows permuted as the weights') against
 * torch's, and 10 AdamW steps. */
static void test_deepseek_v2_vs_torch(void **state)
{
    (void)state;
    run_against_torch("tiny_deepseek_v2");
    run_training("tiny_deepseek_v2");
}

static void test_phi3_vs_torch(void **state)
{
    (void)state;
    run_against_torch("tiny_phi3");
    run_training("tiny_phi3");

    fixture fx;
    fixture_open(&fx, "tiny_phi3", ZO_DTYPE_F32, 2, NULL);
    const model_layout *l = &fx.m.layout;
    assert_int_equal(fx.cfg.sliding_window, 20);
    assert_true(fx.t > 48 && fx.t > fx.cfg.sliding_window);
    const model_tensor *qkv = model_layout_find(l, "model.layers.1.self_attn.qkv_proj.weight");
    const model_tensor *gu = model_layout_find(l, "model.layers.1.mlp.gate_up_proj.weight");
    assert_non_null(qkv);
    assert_non_null(gu);
    assert_int_equal(qkv->shape[0], 32 + 2 * 16); /* 4 heads of 8, 2 kv heads */
    assert_int_equal(gu->shape[0], 2 * 48);
    assert_null(model_layout_find(l, "model.layers.1.self_attn.q_proj.weight"));
    assert_null(model_layout_find(l, "model.layers.1.mlp.up_proj.weight"));
    /* the parts are row ranges of the fused tensors, in Hugging Face's order */
    const model_view *k = model_layout_view(l, qkv->block, MODEL_ROLE_K_W);
    const model_view *up = model_layout_view(l, gu->block, MODEL_ROLE_MLP_UP_W);
    assert_int_equal(k->offset, qkv->offset + 32 * 32);
    assert_int_equal(up->offset, gu->offset + 48 * 32);

    /* export: the folder Hugging Face's from_pretrained reads */
    zo_model_config back, gen;
    export_round_trip(&fx, "Phi3ForCausalLM", &back, &gen);
    /* the fixture's own file holds the same (what was loaded is what is written) */
    char path[256];
    snprintf(path, sizeof path, "%s/tiny_phi3.safetensors", fix_dir());
    check_file_holds(path, l, fx.tr.master);
    /* the same family, window and shapes */
    assert_string_equal(back.family, "phi3");
    assert_int_equal(back.sliding_window, 20);
    assert_int_equal(back.n_kv_heads, 2);
    assert_string_equal(gen.family, "phi3");
    assert_int_equal(gen.sliding_window, 20);
    fixture_close(&fx);
}

/* A fixture's config.json. */
static zo_model_config fixture_config(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.json", fix_dir(), name);
    zo_model_config c;
    if (zo_model_config_load(path, &c) != ZO_OK) fail_msg("%s", zo_last_error());
    return c;
}

/* Phi-3's longrope (Phi-3.5-mini's rope_scaling, small: 4 factors a list,
 * an original length of 32 of 256 positions) against PyTorch: sequences of
 * 24 turn by short_factor's frequencies, of 56 by long_factor's, cos and
 * sin times sqrt(1 + ln 8 / ln 32) in both; logits, loss, every gradient
 * and 10 AdamW steps; the 24 again through a model built for 56 (short
 * factors still: Hugging Face picks by the batch's length). Generation
 * whose cache passes the original length is refused by name (Hugging
 * Face's switches factors there); the real Phi-3.5-mini config reads as
 * Hugging Face reads it. */
static void test_phi3_longrope_vs_torch(void **state)
{
    (void)state;
    const char *name = "tiny_phi3_longrope_long";
    run_against_torch("tiny_phi3_longrope_short");
    run_against_torch(name);
    fixture_build_t = 56; /* tiny_phi3_longrope_long's length, past the original 32 */
    run_against_torch("tiny_phi3_longrope_short");
    run_training(name);
    zo_model_config c = fixture_config(name);
    char path[512];
    assert_string_equal(c.rope_scaling, "longrope");
    assert_int_equal(c.rope_original_max, 32);
    assert_int_equal(c.rope_n_factors, 4);
    assert_true(fabs(c.rope_attention_factor - sqrt(1.0 + log(8.0) / log(32.0))) < 1e-6);
    gpu_device_t dev;
    gpu_cpu_options o = {.n_threads = 1};
    assert_int_equal(gpu_device_init_cpu(&o, &dev), ZO_OK);
    tf_model g;
    /* generation: a cache within the original length keeps the short table
     * only; one past it both (the crossing switches: test_generate_torch's
     * phi3_cross) */
    tf_options go = {.kv_len = 32};
    assert_int_equal(tf_init_opts(&g, &c, dev, ZO_DTYPE_F32, 1, 8, &go), ZO_OK);
    assert_null(g.rope_freq_long);
    tf_free(&g);
    go.kv_len = 33;
    assert_int_equal(tf_init_opts(&g, &c, dev, ZO_DTYPE_F32, 1, 8, &go), ZO_OK);
    assert_non_null(g.rope_freq_long);
    tf_free(&g);
    /* without long_factor (the parser's -1) refused by name, in generation too */
    c.rope_n_factors = -1;
    assert_int_equal(tf_init_opts(&g, &c, dev, ZO_DTYPE_F32, 1, 8, &go), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "long_factor"));
    /* lists that are not head_dim / 2 long are refused by name */
    c.rope_n_factors = 3;
    assert_int_equal(tf_init(&g, &c, dev, ZO_DTYPE_F32, 1, 8), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "short_factor"));
    gpu_device_free(dev);
    /* the config.json written for it reads back the same longrope */
    c.rope_n_factors = 4;
    cJSON *js = NULL;
    assert_int_equal(model_hf_config(&c, ZO_DTYPE_BF16, &js), ZO_OK);
    char *text = cJSON_Print(js);
    zo_model_config back;
    assert_int_equal(zo_model_config_parse(text, "written.json", &back), ZO_OK);
    assert_int_equal(back.rope_n_factors, 4);
    assert_int_equal(back.rope_original_max, 32);
    assert_memory_equal(back.rope_long_factor, c.rope_long_factor, 4 * sizeof(float));
    assert_memory_equal(back.rope_short_factor, c.rope_short_factor, 4 * sizeof(float));
    assert_true(fabs(back.rope_attention_factor - c.rope_attention_factor) < 1e-6);
    free(text);
    cJSON_Delete(js);
    /* Phi-3.5-mini: 48 factors a list (head_dim 96), the original length
     * 4096 of 131072: sqrt(1 + ln 32 / ln 4096) */
    snprintf(path, sizeof path, "%s/hf-configs/phi-3.5-mini-instruct.json", ZO_FIXTURES_DIR);
    assert_int_equal(zo_model_config_load(path, &c), ZO_OK);
    assert_int_equal(c.rope_n_factors, 48);
    assert_int_equal(c.rope_original_max, 4096);
    assert_true(fabs(c.rope_long_factor[47] - 64.83999633789062) < 1e-5);
    assert_true(fabs(c.rope_attention_factor - sqrt(1.0 + log(32.0) / log(4096.0))) < 1e-6);
}

/* Phi-4-mini's positions, small: partial_rotary_factor 0.75 (6 of each
 * head's 8 rotate, paired i with i + 3, the last 2 pass), longrope lists of
 * 3 past the original length, a tied head; against PyTorch. A factor that
 * leaves an odd rotary size is refused by name. */
static void test_phi3_partial_vs_torch(void **state)
{
    (void)state;
    run_against_torch("tiny_phi3_partial");
    run_training("tiny_phi3_partial");
    zo_model_config c = fixture_config("tiny_phi3_partial");
    assert_int_equal(zo_model_rope_dim(&c), 6);
    assert_int_equal(c.rope_n_factors, 3);
    assert_true(c.tied_embeddings);
    /* longrope lists of head_dim / 2 where 6 of 8 rotate: refused, naming
     * the rotary size */
    gpu_device_t dev;
    gpu_cpu_options o = {.n_threads = 1};
    assert_int_equal(gpu_device_init_cpu(&o, &dev), ZO_OK);
    tf_model g;
    c.rope_n_factors = 4;
    assert_int_equal(tf_init(&g, &c, dev, ZO_DTYPE_F32, 1, 8), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "the rotary dim (head_dim x partial_rotary_factor or rotary_pct) / 2 = 3"));
    gpu_device_free(dev);
    c.rope_n_factors = 3;
    c.rope_partial = 0.625; /* 5 of 8 */
    model_layout l;
    assert_int_equal(model_layout_init(&l, &c), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "partial_rotary_factor"));
}

/* ---- Gemma ---------------------------------------------------------------------------------- */

/* A family's checks against its PyTorch fixture: logits, loss and every
 * gradient, AdamW steps, generation, generation on every placement */
static void run_family(const char *name)
{
    run_against_torch(name);
    run_training(name);
    run_generation(name);
    run_gen_placements(name);
}

/* The fixture saved as Hugging Face class cls and read back (export_round_trip) */
static void fixture_round_trip(const char *name, const char *cls, zo_model_config *back, zo_model_config *gen)
{
    fixture fx;
    fixture_open(&fx, name, ZO_DTYPE_F32, 2, NULL);
    export_round_trip(&fx, cls, back, gen);
    fixture_close(&fx);
}

/* GPT-J (make_fixtures.py tiny_gptj, written out in PyTorch with its rotary
 * by pairs): 3 heads of 16 with rotary on 6 dimensions, its 3 pairs
 * interleaved in the file and held as rotate-half pairs here (the fixture's
 * q_proj and k_proj rows, and their gradients, reordered at load); no
 * attention biases, a biased MLP and output layer. Logits, loss, every
 * gradient, 10 AdamW steps and generation through the cache against
 * PyTorch; the config.json written from the shape reads back as the same
 * model. */
static void test_gptj_vs_torch(void **state)
{
    (void)state;
    zo_model_config c = fixture_config("tiny_gptj");
    assert_string_equal(c.family, "gptj");
    assert_true(zo_model_rope_dim(&c) == 6 && c.head_dim == 16 && !c.attn_bias && c.out_bias && c.attn_out_nobias &&
                c.head_bias && c.parallel_block && c.layer_norms == 1);
    run_family("tiny_gptj");
    cJSON *o = NULL;
    assert_int_equal(model_hf_config(&c, ZO_DTYPE_F32, &o), ZO_OK);
    char *text = cJSON_Print(o);
    assert_non_null(strstr(text, "GPTJForCausalLM"));
    zo_model_config gen;
    if (zo_model_config_parse(text, "written.json", &gen) != ZO_OK) fail_msg("%s", zo_last_error());
    assert_string_equal(gen.family, "gptj");
    assert_true(zo_model_rope_dim(&gen) == 6 && gen.ffn == c.ffn && gen.attn_out_nobias && gen.head_bias);
    assert_int_equal(zo_model_params(&gen), zo_model_params(&c));
    free(text);
    cJSON_Delete(o);
}

/* Gemma (make_fixtures.py tiny_gemma, GemmaForCausalLM written out in
 * PyTorch): the embedding times sqrt(hidden), every RMSNorm times (1 + w),
 * GeGLU, head_dim 12 of hidden 32 / 4 heads, one kv head, tied. Logits,
 * loss, every gradient, 10 AdamW steps and generation through the cache
 * against PyTorch; the config's hidden_act "gelu" is ignored as Hugging
 * Face ignores it; the Hugging Face folder written from it holds the same
 * tensors and a config.json that reads back as the same model. */
static void test_gemma_vs_torch(void **state)
{
    (void)state;
    zo_model_config c = fixture_config("tiny_gemma");
    assert_string_equal(c.family, "gemma");
    assert_string_equal(c.act, "gelu_pytorch_tanh");
    assert_int_equal(c.head_dim, 12);
    assert_true(c.tied_embeddings);
    assert_int_equal(zo_model_config_runtime_check(&c), ZO_OK);
    run_family("tiny_gemma");
    /* bf16 storage: the loss within bf16's rounding of PyTorch's (as tiny_llama's) */
    {
        fixture bf;
        fixture_open(&bf, "tiny_gemma", ZO_DTYPE_BF16, 2, NULL);
        tf_step_info info;
        assert_int_equal(tf_trainer_grads(&bf.tr, bf.s, bf.inputs, bf.targets, B, T, &info), ZO_OK);
        float *want = read_expected("tiny_gemma", "loss", NULL);
        assert_int_equal(check_close_f32("bf16", &info.loss, want, 1, 0.0, 2e-2), 0);
        assert_int_equal(info.skipped, 0);
        free(want);
        fixture_close(&bf);
    }

    /* export and reload */
    zo_model_config back, gen;
    fixture_round_trip("tiny_gemma", "GemmaForCausalLM", &back, &gen);
    const zo_model_config *both[2] = {&back, &gen};
    for (int i = 0; i < 2; i++) {
        assert_string_equal(both[i]->family, "gemma");
        assert_string_equal(both[i]->act, "gelu_pytorch_tanh");
        assert_int_equal(both[i]->head_dim, 12);
        assert_int_equal(both[i]->n_kv_heads, 1);
    }

    /* an activation Hugging Face's Gemma takes and the runtime does not
     * compute (the exact GELU) is refused by name */
    snprintf(c.act, sizeof c.act, "gelu");
    assert_int_equal(zo_model_config_runtime_check(&c), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "the activation gelu"));
}

/* Gemma-2 (make_fixtures.py tiny_gemma2, Gemma2ForCausalLM written out in
 * PyTorch): Gemma's with norms on the attention's and the MLP's outputs,
 * GQA, scores times 8^-0.5 and capped at 1 (they reach about 5), logits
 * capped at 0.5 (they reach about 1.7), a window of 5 on layer 0 and none
 * on layer 1. Logits, loss, every gradient (the two new norms' included),
 * 10 AdamW steps and generation through the cache on every placement
 * against PyTorch; the Hugging Face folder written from it reads back as
 * the same model. */
static void test_gemma2_vs_torch(void **state)
{
    (void)state;
    zo_model_config c = fixture_config("tiny_gemma2");
    assert_string_equal(c.family, "gemma2");
    assert_int_equal(c.layer_norms, 4);
    assert_int_equal(zo_model_layer_window(&c, 0), 5);
    assert_int_equal(zo_model_layer_window(&c, 1), 0);
    assert_int_equal(zo_model_config_runtime_check(&c), ZO_OK);
    run_family("tiny_gemma2");
    zo_model_config back, gen;
    fixture_round_trip("tiny_gemma2", "Gemma2ForCausalLM", &back, &gen);
    const zo_model_config *both[2] = {&back, &gen};
    for (int i = 0; i < 2; i++) {
        assert_string_equal(both[i]->family, "gemma2");
        assert_true(both[i]->query_pre_attn_scalar == 8.0f && both[i]->attn_softcap == 1.0f &&
                    both[i]->final_softcap == 0.5f);
        assert_int_equal(zo_model_layer_window(both[i], 0), 5);
        assert_int_equal(zo_model_layer_window(both[i], 1), 0);
    }
}

/* Gemma-3 text (make_fixtures.py tiny_gemma3, Gemma3ForCausalLM written
 * out in PyTorch): Gemma-2's layers without caps, an RMSNorm (1 + w) on
 * each q and k head, layers 0 and 1 local (a window of 5, rotary base
 * 10000), layer 2 global (rope_theta 1e6 with a linear rope_scaling of 8).
 * Logits, loss, every gradient (the q/k norms' included), 10 AdamW steps,
 * generation on every placement, the Hugging Face export read back. */
static void test_gemma3_vs_torch(void **state)
{
    (void)state;
    zo_model_config c = fixture_config("tiny_gemma3");
    assert_string_equal(c.family, "gemma3_text");
    assert_true(c.qk_norm && c.layer_norms == 4 && c.rope_local_theta == 10000.0f);
    assert_int_equal(zo_model_layer_window(&c, 1), 5);
    assert_int_equal(zo_model_layer_window(&c, 2), 0);
    run_family("tiny_gemma3");
    zo_model_config back, gen;
    fixture_round_trip("tiny_gemma3", "Gemma3ForCausalLM", &back, &gen);
    const zo_model_config *both[2] = {&back, &gen};
    for (int i = 0; i < 2; i++) {
        assert_string_equal(both[i]->family, "gemma3_text");
        assert_true(both[i]->qk_norm && both[i]->rope_local_theta == 10000.0f && both[i]->rope_factor == 8.0f);
        assert_int_equal(zo_model_layer_window(both[i], 0), 5);
        assert_int_equal(zo_model_layer_window(both[i], 2), 0);
    }
}

/* Gemma's embedding factor is sqrt(hidden) rounded to the model dtype
 * first, as Hugging Face's normalizer tensor: gemma-7b's sqrt(3072) =
 * 55.4256 is 55.5 in bf16 (steps of 0.25 there), and stays itself in fp32.
 * An embedding of ones through block 0 gives the factor. */
static void test_gemma_embed_scale(void **state)
{
    (void)state;
    zo_model_config c = {.family = "gemma", .arch = ZO_ARCH_LLAMA, .n_layers = 1, .hidden = 3072, .n_heads = 1,
                         .n_kv_heads = 1, .head_dim = 8, .ffn = 8, .vocab = 4, .max_seq = 8, .tied_embeddings = 1,
                         .norm_eps = 1e-6f, .rope_theta = 10000.0f, .act = "gelu_pytorch_tanh"};
    snprintf(c.name, sizeof c.name, "gemma-embed");
    assert_int_equal(zo_model_config_validate(&c), ZO_OK);
    const zo_dtype dts[2] = {ZO_DTYPE_BF16, ZO_DTYPE_F32};
    const float want[2] = {55.5f, (float)sqrt(3072.0)};
    for (int k = 0; k < 2; k++) {
        gpu_cpu_options o = {.n_threads = 2};
        gpu_device_t dev;
        gpu_stream_t s;
        assert_int_equal(gpu_device_init_cpu(&o, &dev), ZO_OK);
        assert_int_equal(gpu_stream_create(dev, &s), ZO_OK);
        tf_model m;
        if (tf_init(&m, &c, dev, dts[k], 1, 2) != ZO_OK) fail_msg("%s", zo_last_error());
        size_t n = m.layout.block_numel[0], es = zo_dtype_size(dts[k]);
        char *host = malloc(n * es), *out = malloc(2 * (size_t)c.hidden * es);
        for (size_t i = 0; i < n; i++) zo_store_f32(host, dts[k], i, 1.0f);
        void *w;
        assert_int_equal(gpu_mem_alloc(dev, n * es, &w), ZO_OK);
        assert_int_equal(gpu_memcpy_async(s, w, host, n * es, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
        const int32_t in[2] = {1, 3}, tg[2] = {3, 0};
        assert_int_equal(tf_set_batch(&m, s, in, tg, 1, 2), ZO_OK);
        tf_block_bufs bb = {.params = w, .embed_params = w};
        assert_int_equal(tf_block_forward(&m, 0, &bb, s), ZO_OK);
        assert_int_equal(gpu_memcpy_async(s, out, m.res[0], 2 * (size_t)c.hidden * es, GPU_COPY_DEVICE_TO_HOST),
                         ZO_OK);
        assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
        for (int i = 0; i < 2 * c.hidden; i++)
            if (zo_load_f32(out, dts[k], (size_t)i) != want[k])
                fail_msg("%s: element %d is %.7g, want %.7g", zo_dtype_name(dts[k]), i,
                         (double)zo_load_f32(out, dts[k], (size_t)i), (double)want[k]);
        gpu_mem_free(dev, w);
        tf_free(&m);
        free(host);
        free(out);
        gpu_stream_destroy(s);
        gpu_device_free(dev);
    }
}

/* ---- 16-bit storage ---------------------------------------------------------------------- */

static void test_bf16_fp16(void **state)
{
    (void)state;
    zo_dtype dts[2] = {ZO_DTYPE_BF16, ZO_DTYPE_F16};
    for (int i = 0; i < 2; i++) {
        fixture fx;
        fixture_open(&fx, "tiny_llama", dts[i], 2, NULL);
        tf_step_info info;
        assert_int_equal(tf_trainer_grads(&fx.tr, fx.s, fx.inputs, fx.targets, B, T, &info), ZO_OK);
        float *want = read_expected("tiny_llama", "loss", NULL);
        /* rounding of weights and activations: bf16 keeps 8 bits, fp16 11 */
        assert_int_equal(check_close_f32(zo_dtype_name(dts[i]), &info.loss, want, 1, 0.0,
                                     dts[i] == ZO_DTYPE_BF16 ? 2e-2 : 3e-3), 0);
        assert_int_equal(info.skipped, 0);
        free(want);
        fixture_close(&fx);
    }
}

/* The output layer's bias with 16-bit weights: the cross-entropy's gradient
 * is summed into the bias from fp32 before it is rounded into the copy the
 * head's GEMMs read. Every gradient of tiny_phi against PyTorch's within
 * the rounding of bf16 / fp16 weights and activations (of each tensor's
 * largest), the bias's included. */
static void test_head_bias_16bit(void **state)
{
    (void)state;
    zo_dtype dts[2] = {ZO_DTYPE_BF16, ZO_DTYPE_F16};
    for (int i = 0; i < 2; i++) {
        fixture fx;
        fixture_open(&fx, "tiny_phi", dts[i], 2, NULL);
        tf_step_info info;
        assert_int_equal(tf_trainer_grads(&fx.tr, fx.s, fx.inputs, fx.targets, B, fx.t, &info), ZO_OK);
        int nb = fx.m.layout.n_blocks, bad = 0;
        float **want = calloc(nb, sizeof(float *));
        for (int b = 0; b < nb; b++) want[b] = calloc(fx.m.layout.block_numel[b] + 1, sizeof(float));
        char path[512];
        snprintf(path, sizeof path, "%s/tiny_phi_grads.safetensors", fix_dir());
        assert_int_equal(model_load_path(path, &fx.m.layout, (void *const *)want, ZO_DTYPE_F32, 0, NULL), ZO_OK);
        const double tol = dts[i] == ZO_DTYPE_BF16 ? 5e-2 : 1e-2;
        int seen_bias = 0;
        for (int k = 0; k < fx.m.layout.n_tensors; k++) {
            const model_tensor *t = &fx.m.layout.tensors[k];
            seen_bias |= t->role == MODEL_ROLE_LM_HEAD_B;
            bad += check_close_scaled_f32(t->name, fx.tr.grad[t->block] + t->offset, want[t->block] + t->offset,
                                          t->numel, tol, 0.0);
        }
        assert_true(seen_bias);
        assert_int_equal(bad, 0);
        for (int b = 0; b < nb; b++) free(want[b]);
        free(want);
        fixture_close(&fx);
    }
}

/* ---- blocks with streamed weights ----------------------------------------------------------- */

/* The forward block by block with only two device slots for the weights of
 * the layers: a copy stream uploads layer i+1 into the other slot while the
 * compute stream runs layer i, ordered by events. The logits must equal the
 * all-resident forward bit for bit. */
static void test_block_streaming(void **state)
{
    (void)state;
    fixture fx;
    fixture_open(&fx, "tiny_llama", ZO_DTYPE_F32, 2, NULL);
    tf_model *m = &fx.m;
    int V = fx.cfg.vocab, nb = m->layout.n_blocks, L = fx.cfg.n_layers;
    size_t nl = (size_t)B * T * V;
    float *ref = malloc(nl * sizeof(float)), *got = malloc(nl * sizeof(float));
    assert_int_equal(tf_set_batch(m, fx.s, fx.inputs, fx.targets, B, T), ZO_OK);
    assert_int_equal(tf_forward(m, fx.tr.params, fx.s), ZO_OK);
    download_as(&fx, ref, m->logits, nl, ZO_DTYPE_F32);

    gpu_stream_t copy;
    gpu_event_t loaded[2], freed[2];
    assert_int_equal(gpu_stream_create(fx.dev, &copy), ZO_OK);
    void *slot[2];
    size_t layer_bytes = tf_block_bytes(m, 1);
    float *host[16];
    assert_true(nb <= 16);
    for (int b = 0; b < nb; b++) { /* host copies of every block, as a runtime keeps them */
        host[b] = malloc(tf_block_bytes(m, b) + 4);
        memcpy(host[b], fx.tr.master[b], tf_block_bytes(m, b));
    }
    for (int i = 0; i < 2; i++) {
        assert_int_equal(gpu_mem_alloc(fx.dev, layer_bytes, &slot[i]), ZO_OK);
        assert_int_equal(gpu_event_create(fx.dev, &loaded[i]), ZO_OK);
        assert_int_equal(gpu_event_create(fx.dev, &freed[i]), ZO_OK);
    }
    /* poison the resident layer weights: only the slots may be read */
    for (int l = 0; l < L; l++)
        assert_int_equal(gpu_memset_async(fx.s, fx.tr.params[l + 1], 0xff, layer_bytes), ZO_OK);
    assert_int_equal(gpu_memset_async(fx.s, m->logits, 0, nl * 4), ZO_OK);
    tf_block_bufs emb = {.params = fx.tr.params[0]};
    assert_int_equal(tf_block_forward(m, 0, &emb, fx.s), ZO_OK);
    for (int l = 0; l < L; l++) {
        int k = l % 2;
        assert_int_equal(gpu_stream_wait_event(copy, freed[k]), ZO_OK);
        assert_int_equal(gpu_memcpy_async(copy, slot[k], host[l + 1], layer_bytes, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
        assert_int_equal(gpu_event_record(loaded[k], copy), ZO_OK);
        assert_int_equal(gpu_stream_wait_event(fx.s, loaded[k]), ZO_OK);
        tf_block_bufs bb = {.params = slot[k]};
        assert_int_equal(tf_block_forward(m, l + 1, &bb, fx.s), ZO_OK);
        assert_int_equal(gpu_event_record(freed[k], fx.s), ZO_OK);
    }
    tf_block_bufs head = {.params = fx.tr.params[nb - 1], .embed_params = fx.tr.params[0]};
    assert_int_equal(tf_block_forward(m, nb - 1, &head, fx.s), ZO_OK);
    download_as(&fx, got, m->logits, nl, ZO_DTYPE_F32);
    assert_memory_equal(got, ref, nl * sizeof(float));
    for (int i = 0; i < 2; i++) {
        gpu_event_destroy(loaded[i]);
        gpu_event_destroy(freed[i]);
        gpu_mem_free(fx.dev, slot[i]);
    }
    gpu_stream_destroy(copy);
    for (int b = 0; b < nb; b++) free(host[b]);
    free(ref);
    free(got);
    fixture_close(&fx);
}

/* ---- determinism ------------------------------------------------------------------------------ */

static void test_determinism(void **state)
{
    (void)state;
    float *grads[2];
    float loss[2];
    size_t total = 0;
    for (int run = 0; run < 2; run++) {
        fixture fx;
        fixture_open(&fx, "tiny_gpt2", ZO_DTYPE_F32, run + 1, NULL); /* 1 thread, then 2 */
        tf_step_info info;
        assert_int_equal(tf_trainer_grads(&fx.tr, fx.s, fx.inputs, fx.targets, B, T, &info), ZO_OK);
        loss[run] = info.loss;
        total = fx.m.layout.total_numel;
        grads[run] = malloc(total * sizeof(float));
        size_t off = 0;
        for (int b = 0; b < fx.m.layout.n_blocks; b++) {
            memcpy(grads[run] + off, fx.tr.grad[b], fx.m.layout.block_numel[b] * sizeof(float));
            off += fx.m.layout.block_numel[b];
        }
        fixture_close(&fx);
    }
    assert_memory_equal(&loss[0], &loss[1], sizeof(float));
    assert_memory_equal(grads[0], grads[1], total * sizeof(float));
    free(grads[0]);
    free(grads[1]);
}

/* LoRA and QLoRA through train: adapters trained over a frozen random base,
 * saved as a PEFT adapter directory, and read back by a second run, whose
 * first loss is the trained adapters' (not the base's). */
static float lora_losses(const char *out, int *steps, float *last5, int nsteps)
{
    float first = -1;
    char *copy = strdup(out);
    *last5 = 0;
    *steps = 0;
    for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n")) {
        int k;
        float l;
        if (sscanf(line, "step %d loss %f", &k, &l) == 2) {
            if (k == 1) first = l; /* steps counted from 1 */
            if (k > nsteps - 5) *last5 += l / 5;
            (*steps)++;
        }
    }
    free(copy);
    return first;
}

/* A fresh folder zo_test_<tag>_<pid> in the scratch root (dir) with a small repetitive
 * text in it (text) for the LoRA runs. */
static void lora_workdir(const char *tag, char dir[64], char text[128])
{
    char cmd[128];
    scratch_path(dir, 64, "zo_test_%s_%d", tag, (int)getpid());
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    assert_int_equal(system(cmd), 0);
    snprintf(text, 128, "%s/text.txt", dir);
    FILE *f = fopen(text, "w");
    assert_non_null(f);
    for (int i = 0; i < 400; i++) fprintf(f, "the quick brown fox jumps over the lazy dog %d. ", i % 10);
    fclose(f);
}

/* A Phi-3 for train's end-to-end runs: GQA, a window of 15 over sequences of 32. */
#define PHI3_TINY_CONFIG                                                                                      \
    "{\"model_type\": \"phi3\", \"num_hidden_layers\": 2, \"hidden_size\": 32, \"num_attention_heads\": 4, " \
    "\"num_key_value_heads\": 2, \"intermediate_size\": 48, \"vocab_size\": 256, "                           \
    "\"max_position_embeddings\": 64, \"sliding_window\": 15}"

/* What a model's `train --lora 4 --lora-targets all-linear` (and --qlora)
 * run must show: the trainable count (--lora), entries adapter_config.json
 * lists and one it must not, an adapter tensor under PEFT's name (with its
 * shape when rows > 0). */
typedef struct lora_case {
    const char *tag, *config_json, *trainable;
    const char *lists[3], *not_listed;
    const char *tensor;
    int64_t rows, cols;
} lora_case;

/* `train --lora` and `--qlora` on lc's model, checked as lc says. */
static void run_train_lora(const lora_case *lc)
{
    char dir[64], text[128], ad[128], cfg[128], cmd[1400];
    lora_workdir(lc->tag, dir, text);
    snprintf(ad, sizeof ad, "%s/adapter", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    files_write_text(cfg, lc->config_json);
    static char out[1 << 16];
    const char *common = "--text --micro-batch 4 --seq 32 --threads 2 --lora 4 --lora-targets all-linear";
    for (int q = 0; q < 2; q++) {
        snprintf(cmd, sizeof cmd, "%s --model %s --data %s %s --steps 40 --lr 1e-2 %s --save %s 2>&1",
                 ZO_TRAIN_BIN, cfg, text, common, q ? "--qlora --params-on cpu" : "", ad);
        assert_int_equal(run_capture(cmd, out, sizeof out), 0);
        assert_non_null(strstr(out, q ? "(QLoRA: NF4 base)" : lc->trainable));
        int steps;
        float last5, first = lora_losses(out, &steps, &last5, 40);
        printf("  train %s %s: loss %.3f -> %.3f\n", lc->tag, q ? "--qlora" : "--lora 4", first, last5);
        assert_int_equal(steps, 40);
        assert_true(last5 < first - 0.2f);
        /* PEFT's files: the config and the adapters under PEFT's names */
        char path[256];
        snprintf(path, sizeof path, "%s/adapter_config.json", ad);
        char *cj = NULL;
        assert_int_equal(zo_file_read_all(path, 1 << 16, "adapter_config.json", &cj, NULL), ZO_OK);
        assert_non_null(strstr(cj, "\"peft_type\":\t\"LORA\""));
        for (int i = 0; i < 3 && lc->lists[i]; i++) assert_non_null(strstr(cj, lc->lists[i]));
        if (lc->not_listed) assert_null(strstr(cj, lc->not_listed));
        free(cj);
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", ad);
        model_ckpt ck;
        assert_int_equal(model_ckpt_open(&ck, path), ZO_OK);
        const model_ckpt_entry *e = model_ckpt_find(&ck, lc->tensor);
        if (!e) fail_msg("%s: no %s", path, lc->tensor);
        if (lc->rows) {
            assert_int_equal(e->tensor->shape[0], lc->rows);
            assert_int_equal(e->tensor->shape[1], lc->cols);
        }
        model_ckpt_close(&ck);
        /* a second run from the adapters starts where the first ended */
        snprintf(cmd, sizeof cmd, "%s --model %s --data %s --text --micro-batch 4 --seq 32 --threads 2 "
                                  "%s --adapter %s --steps 1 --lr 0 2>&1",
                 ZO_TRAIN_BIN, cfg, text, q ? "--qlora" : "", ad);
        assert_int_equal(run_capture(cmd, out, sizeof out), 0);
        float again = lora_losses(out, &steps, &last5, 1);
        printf("  train --adapter: first loss %.3f\n", again);
        assert_true(again < first - 0.2f);
    }
    snprintf(cmd, sizeof cmd, "%s --model %s --data %s --text --qlora 2>&1", ZO_TRAIN_BIN, cfg, text);
    assert_int_equal(run_capture(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--lora"));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_train_lora(void **state)
{
    (void)state;
    const lora_case gpt2 = {"gpt2",
                            "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 32, \"n_head\": 2,"
                            " \"n_positions\": 32, \"vocab_size\": 256}",
                            "4096 trainable parameters",
                            {"\"c_attn\""},
                            NULL,
                            "base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight",
                            0,
                            0};
    run_train_lora(&gpt2);
}

/* `train` on a Phi-3 with LoRA and QLoRA on every linear layer: the
 * adapters are PEFT's for Phi-3 (one over qkv_proj, one over gate_up_proj)
 * under its names and shapes; 2 layers x 4 x ((32 + 64) + (32 + 32) +
 * (32 + 96) + (48 + 32)) trainable parameters. */
static void test_train_phi3_lora(void **state)
{
    (void)state;
    const lora_case phi3 = {"phi3",
                            PHI3_TINY_CONFIG,
                            "2944 trainable parameters",
                            {"\"qkv_proj\"", "\"gate_up_proj\""},
                            "\"q_proj\"",
                            "base_model.model.model.layers.1.mlp.gate_up_proj.lora_B.weight",
                            96,
                            4};
    run_train_lora(&phi3);
}

/* The "step K loss ..." lines of `out` from step `from` on, in `buf`. */
static const char *steps_from(const char *out, int from, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (const char *p = out; (p = strstr(p, "step ")) != NULL; p++) {
        int k;
        if ((p != out && p[-1] != '\n') || sscanf(p, "step %d loss", &k) != 1 || k < from) continue;
        const char *tok = strstr(p, " tok/s"); /* the rest (throughput) differs run to run */
        n += (size_t)snprintf(buf + n, len - n, "%.*s\n", (int)(tok ? tok - p : 0), p);
        if (n >= len) break;
    }
    return buf;
}

/* Full fine-tuning of a Phi-3 through `train`: 5 steps into a checkpoint
 * and 5 more from it give the 10 straight steps' losses and gradient norms
 * to the digit, and --save writes Phi-3's fused names. */
static void test_train_phi3_resume(void **state)
{
    (void)state;
    char dir[64], text[128], cmd[1400];
    lora_workdir("phi3_resume", dir, text);
    snprintf(cmd, sizeof cmd, "%s/config.json", dir);
    files_write_text(cmd, PHI3_TINY_CONFIG "\n");
    static char out[1 << 16], a[4096], b[4096];
    const char *run = "%s --model %s/config.json --data %s/text.txt --text --micro-batch 4 --seq 32 --threads 2 "
                      "--lr 1e-2 %s 2>&1";
    char extra[512];
    snprintf(extra, sizeof extra, "--steps 10 --save %s/out", dir);
    snprintf(cmd, sizeof cmd, run, ZO_TRAIN_BIN, dir, dir, extra);
    assert_int_equal(run_capture(cmd, out, sizeof out), 0);
    steps_from(out, 6, a, sizeof a);
    snprintf(extra, sizeof extra, "--steps 5 --ckpt %s/ck", dir);
    snprintf(cmd, sizeof cmd, run, ZO_TRAIN_BIN, dir, dir, extra);
    assert_int_equal(run_capture(cmd, out, sizeof out), 0);
    snprintf(extra, sizeof extra, "--steps 10 --resume %s/ck", dir);
    snprintf(cmd, sizeof cmd, run, ZO_TRAIN_BIN, dir, dir, extra);
    assert_int_equal(run_capture(cmd, out, sizeof out), 0);
    steps_from(out, 6, b, sizeof b);
    assert_non_null(strstr(a, "step 10 loss"));
    assert_string_equal(a, b);
    char path[256];
    snprintf(path, sizeof path, "%s/out/model.safetensors", dir);
    model_ckpt ck;
    assert_int_equal(model_ckpt_open(&ck, path), ZO_OK);
    const model_ckpt_entry *e = model_ckpt_find(&ck, "model.layers.1.self_attn.qkv_proj.weight");
    assert_non_null(e);
    assert_int_equal(e->tensor->shape[0], 64);
    assert_non_null(model_ckpt_find(&ck, "model.layers.1.mlp.gate_up_proj.weight"));
    assert_null(model_ckpt_find(&ck, "model.layers.1.mlp.gate_proj.weight"));
    model_ckpt_close(&ck);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* Kimi-K2's model_type on a tiny DeepSeek-V3 (latent attention, a dense
 * first layer, sigmoid routing within the best 2 of 4 groups, a shared
 * expert), without its class in the config: train runs it, two steps to
 * the same losses as the config under model_type deepseek_v3 (the same
 * model: the family is V3's). */
static void test_train_kimi_k2(void **state)
{
    (void)state;
    char dir[64], text[128], cmd[1400];
    lora_workdir("kimi_k2", dir, text);
    static char out[2][1 << 15];
    const char *types[2] = {"kimi_k2", "deepseek_v3"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s/%s.json", dir, types[i]);
        FILE *f = fopen(cmd, "w");
        assert_non_null(f);
        fprintf(f, "{\"model_type\": \"%s\", \"num_hidden_layers\": 2, \"hidden_size\": 32, "
                "\"num_attention_heads\": 2, \"num_key_value_heads\": 2, \"q_lora_rank\": 16, \"kv_lora_rank\": 16, "
                "\"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8, \"intermediate_size\": 48, "
                "\"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"n_shared_experts\": 1, "
                "\"num_experts_per_tok\": 2, \"n_group\": 4, \"topk_group\": 2, \"first_k_dense_replace\": 1, "
                "\"routed_scaling_factor\": 2.827, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\", "
                "\"topk_method\": \"noaux_tc\", \"vocab_size\": 256, \"max_position_embeddings\": 64}\n",
                types[i]);
        fclose(f);
        snprintf(cmd, sizeof cmd, "%s --model %s/%s.json --data %s --text --micro-batch 2 --seq 32 --threads 2 "
                 "--dtype fp32 --steps 2 2>&1", ZO_TRAIN_BIN, dir, types[i], text);
        int rc = run_capture(cmd, out[i], sizeof out[i]);
        if (rc) fail_msg("%s: exit %d\n%s", types[i], rc, out[i]);
    }
    double loss[2][2];
    for (int i = 0; i < 2; i++) run_train_losses(out[i], loss[i], 2);
    for (int k = 0; k < 2; k++) {
        assert_true(isfinite(loss[0][k]));
        if (loss[0][k] != loss[1][k]) fail_msg("step %d: kimi_k2 %.9g, deepseek_v3 %.9g", k + 1, loss[0][k], loss[1][k]);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* LoRA on a Qwen3 model through train (q/k norms, head_dim 12 of hidden 32
 * / 4 heads, GQA): the loss falls over 40 steps; the q/k norm weights stay
 * frozen (the --merge folder holds them as initialised, 1.0, under their
 * Hugging Face names) and carry no adapters (the adapter folder names
 * none). */
/* A tiny model of `type` (hidden 32, 4 heads of 12 over kv_heads, MLP 48,
 * vocabulary 256) in a LoRA work folder: its config.json, the text, and
 * where the adapter (ad) and the merged model (mg) go. */
typedef struct lora_tiny {
    char dir[64], text[128], ad[128], mg[128], cfg[128];
} lora_tiny;

static void lora_tiny_init(lora_tiny *t, const char *tag, const char *type, int kv_heads)
{
    lora_workdir(tag, t->dir, t->text);
    snprintf(t->ad, sizeof t->ad, "%s/adapter", t->dir);
    snprintf(t->mg, sizeof t->mg, "%s/merged", t->dir);
    snprintf(t->cfg, sizeof t->cfg, "%s/config.json", t->dir);
    FILE *f = fopen(t->cfg, "w");
    assert_non_null(f);
    fprintf(f, "{\"model_type\": \"%s\", \"num_hidden_layers\": 2, \"hidden_size\": 32, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": %d, \"head_dim\": 12, "
               "\"intermediate_size\": 48, \"max_position_embeddings\": 32, \"vocab_size\": 256}\n",
            type, kv_heads);
    fclose(f);
}

/* train `method` ("--lora" or "--qlora --lora") r 4 on every linear layer
 * for 40 steps, saving and merging: the loss falls by 0.2 at least. */
static void lora_tiny_train(const lora_tiny *t, const char *method, const char *what)
{
    static char out[1 << 16];
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "%s --model %s --data %s --text --micro-batch 4 --seq 32 --threads 2 %s 4 "
                              "--lora-targets all-linear --steps 40 --lr 1e-2 --save %s --merge %s 2>&1",
             ZO_TRAIN_BIN, t->cfg, t->text, method, t->ad, t->mg);
    if (run_capture(cmd, out, sizeof out) != 0) fail_msg("%s", out);
    int steps;
    float last5, first = lora_losses(out, &steps, &last5, 40);
    printf("  train %s 4 (%s): loss %.3f -> %.3f\n", method, what, first, last5);
    assert_int_equal(steps, 40);
    assert_true(last5 < first - 0.2f);
}

static void test_train_lora_qwen3(void **state)
{
    (void)state;
    char cmd[300], path[256];
    lora_tiny t;
    lora_tiny_init(&t, "lora_q3", "qwen3", 2);
    const char *ad = t.ad, *mg = t.mg, *dir = t.dir;
    lora_tiny_train(&t, "--lora", "qwen3");
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", ad);
    model_ckpt ck;
    assert_int_equal(model_ckpt_open(&ck, path), ZO_OK);
    assert_non_null(model_ckpt_find(&ck, "base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"));
    assert_null(model_ckpt_find(&ck, "base_model.model.model.layers.1.self_attn.k_norm.lora_A.weight"));
    model_ckpt_close(&ck);
    snprintf(path, sizeof path, "%s/model.safetensors", mg);
    model_st_file st;
    assert_int_equal(model_st_open(&st, path), ZO_OK);
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 2; k++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s_norm.weight", l, k ? "k" : "q");
            const model_st_tensor *t = model_st_find(&st, name);
            if (!t) fail_msg("%s: no %s", path, name);
            assert_int_equal(t->numel, 12);
            float w[12];
            assert_int_equal(model_st_read(&st, t, w, ZO_DTYPE_F32, 0), ZO_OK);
            for (int e = 0; e < 12; e++) assert_true(w[e] == 1.0f);
        }
    model_st_close(&st);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* LoRA and QLoRA on a Gemma model through train (GeGLU, (1 + w) norms, the
 * scaled embedding, head_dim 12 of hidden 32 / 4 heads, one kv head): the
 * loss falls over 40 steps; the adapters carry PEFT's LLaMA names; the
 * norms stay frozen at their initial offset 0 (a norm of 1, as
 * GemmaRMSNorm initialises it) in the --merge folder. */
static void test_train_lora_gemma(void **state)
{
    (void)state;
    char cmd[300], path[256];
    lora_tiny t;
    lora_tiny_init(&t, "lora_gm", "gemma", 1);
    lora_tiny_train(&t, "--qlora --lora", "gemma");
    lora_tiny_train(&t, "--lora", "gemma");
    const char *ad = t.ad, *mg = t.mg, *dir = t.dir;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", ad);
    model_ckpt ck;
    assert_int_equal(model_ckpt_open(&ck, path), ZO_OK);
    assert_non_null(model_ckpt_find(&ck, "base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"));
    assert_non_null(model_ckpt_find(&ck, "base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight"));
    model_ckpt_close(&ck);
    snprintf(path, sizeof path, "%s/model.safetensors", mg);
    model_st_file st;
    assert_int_equal(model_st_open(&st, path), ZO_OK);
    const model_st_tensor *nw = model_st_find(&st, "model.layers.1.post_attention_layernorm.weight");
    if (!nw) fail_msg("%s: no post_attention_layernorm", path);
    float w[32];
    assert_int_equal(nw->numel, 32);
    assert_int_equal(model_st_read(&st, nw, w, ZO_DTYPE_F32, 0), ZO_OK);
    for (int e = 0; e < 32; e++) assert_true(w[e] == 0.0f);
    model_st_close(&st);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---- initialisation ------------------------------------------------------------------------------ */

/* The sequence the random initialisation is defined by: one splitmix64
 * stream over the layout's tensors in order, two draws (Box-Muller) per
 * element of every 2-D tensor. */
static uint64_t ref_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The MoE layouts of the init's tests: Mixtral's (gate, up, down an
 * expert) and gpt-oss's (gate_up fused, biases between the matrices), 4
 * experts each. */
static const char *const init_moe[] = {
    "{\"model_type\": \"mixtral\", \"num_hidden_layers\": 2, \"hidden_size\": 32, \"num_attention_heads\": 2, "
    "\"num_key_value_heads\": 1, \"intermediate_size\": 24, \"num_local_experts\": 4, \"num_experts_per_tok\": 2, "
    "\"vocab_size\": 40}",
    "{\"model_type\": \"gpt_oss\", \"num_hidden_layers\": 2, \"hidden_size\": 32, \"num_attention_heads\": 2, "
    "\"num_key_value_heads\": 1, \"head_dim\": 16, \"intermediate_size\": 24, \"num_local_experts\": 4, "
    "\"num_experts_per_tok\": 2, \"vocab_size\": 40}",
};

/* tf_init_weights (its elements drawn in parallel) gives the sequential
 * stream's values, bit for bit, and block by block the same: a LLaMA whose
 * matrices of 384 x 1152 pass the size the draw goes parallel at, then a
 * Mixtral-shaped and a gpt-oss-shaped layout (experts one after another,
 * their down projections at the output projections' std; gpt-oss's 1-D
 * biases and sinks drawing nothing between its matrices). */
static void init_sequence_of(const model_layout *l)
{
    int nb = l->n_blocks;
    float **w = calloc((size_t)nb, sizeof *w);
    for (int b = 0; b < nb; b++) w[b] = calloc(l->block_numel[b] + 1, sizeof(float));
    tf_init_weights(l, w, 42);
    uint64_t s = tf_init_rng(42);
    double proj_std = 0.02 / sqrt(2.0 * l->n_layers);
    for (int i = 0; i < l->n_tensors; i++) {
        const model_tensor *t = &l->tensors[i];
        if (t->ndim == 1) continue;
        double std = t->role == MODEL_ROLE_ATTN_OUT_W || t->role == MODEL_ROLE_MLP_DOWN_W ||
                             t->role == MODEL_ROLE_EXPERT_DOWN_W
                         ? proj_std
                         : 0.02;
        for (size_t e = 0; e < t->numel; e++) {
            double u1 = ((ref_splitmix(&s) >> 11) + 1.0) / 9007199254740993.0;
            double u2 = (ref_splitmix(&s) >> 11) / 9007199254740992.0;
            float want = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2) * std);
            if (memcmp(&want, &w[t->block][t->offset + e], sizeof want)) {
                fprintf(stderr, "%s[%zu]: %.9g, the sequence gives %.9g\n", t->name, e,
                        w[t->block][t->offset + e], want);
                fail();
            }
        }
    }
    float *one = calloc(l->block_numel[0] + 1, sizeof(float));
    uint64_t rng = tf_init_rng(42);
    for (int b = 0; b < nb; b++) {
        float *blk = realloc(one, (l->block_numel[b] + 1) * sizeof(float));
        assert_non_null(blk);
        one = blk;
        tf_init_block_weights(l, b, one, &rng);
        assert_memory_equal(one, w[b], l->block_numel[b] * sizeof(float));
    }
    free(one);
    for (int b = 0; b < nb; b++) free(w[b]);
    free(w);
}

static void test_init_sequence(void **state)
{
    (void)state;
    zo_model_config c = {0};
    snprintf(c.name, sizeof c.name, "init-llama");
    snprintf(c.family, sizeof c.family, "llama2");
    c.arch = ZO_ARCH_LLAMA;
    c.n_layers = 2;
    c.hidden = 384;
    c.n_heads = c.n_kv_heads = 4;
    c.ffn = 1152;
    c.vocab = 300;
    c.max_seq = 64;
    c.norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    assert_int_equal(zo_model_config_validate(&c), ZO_OK);
    model_layout lay;
    assert_int_equal(model_layout_init(&lay, &c), ZO_OK);
    init_sequence_of(&lay);
    model_layout_free(&lay);
    for (size_t k = 0; k < sizeof init_moe / sizeof *init_moe; k++) {
        assert_int_equal(zo_model_config_parse(init_moe[k], "init.json", &c), ZO_OK);
        assert_int_equal(model_layout_init(&lay, &c), ZO_OK);
        init_sequence_of(&lay);
        model_layout_free(&lay);
    }
}

/* A window of experts (expert parallelism: a rank's layout holds experts
 * first .. first + count - 1) draws each of its experts the values the
 * whole model's layout draws them (those test_init_sequence holds to the
 * sequence), and every other tensor the same: a
 * Mixtral-shaped layer (gate, up, down an expert) and a gpt-oss-shaped one
 * (gate_up fused, 1-D biases that draw nothing between the matrices), each
 * window of 4 experts. A skip counting the biases' elements (or none
 * before a fused gate_up) gave gpt-oss's windows other experts: its --ep
 * runs started from another model than one rank's. */
static void test_init_expert_windows(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof init_moe / sizeof *init_moe; k++) {
        zo_model_config c;
        assert_int_equal(zo_model_config_parse(init_moe[k], "window.json", &c), ZO_OK);
        model_layout whole;
        assert_int_equal(model_layout_init(&whole, &c), ZO_OK);
        float **w = calloc((size_t)whole.n_blocks, sizeof *w);
        for (int b = 0; b < whole.n_blocks; b++) w[b] = calloc(whole.block_numel[b] + 1, sizeof(float));
        tf_init_weights(&whole, w, 7);
        const size_t ws = model_layout_expert_stride(&whole);
        int windows = 0;
        for (int first = 0; first < 4; first++)
            for (int count = 1; first + count <= 4; count++) {
                model_layout win;
                assert_int_equal(model_layout_init_experts(&win, &c, first, count), ZO_OK);
                float **v = calloc((size_t)win.n_blocks, sizeof *v);
                for (int b = 0; b < win.n_blocks; b++) v[b] = calloc(win.block_numel[b] + 1, sizeof(float));
                tf_init_weights(&win, v, 7);
                /* each tensor of the window: the whole layout's tensor of its name
                 * (an expert's: the same expert, first + its place) */
                for (int i = 0; i < win.n_tensors; i++) {
                    const model_tensor *t = &win.tensors[i];
                    const model_view *x = model_layout_view(&win, t->block, MODEL_ROLE_EXPERT_GATE_W);
                    size_t at = t->offset;
                    int expert = (t->role >= MODEL_ROLE_EXPERT_GATE_W && t->role <= MODEL_ROLE_EXPERT_DOWN_W) ||
                                 (t->role >= MODEL_ROLE_EXPERT_GATE_UP_W && t->role <= MODEL_ROLE_EXPERT_DOWN_B);
                    if (expert && x && x->numel) {
                        /* the whole layout's expert block starts where the window's does */
                        size_t loc = (t->offset - x->offset) / model_layout_expert_stride(&win);
                        at = t->offset + ((size_t)first + loc) * ws - loc * model_layout_expert_stride(&win);
                    } else if (x && x->numel && t->offset > x->offset) {
                        at = t->offset + (size_t)(4 - count) * ws; /* after the experts */
                    }
                    if (memcmp(v[t->block] + t->offset, w[t->block] + at, t->numel * sizeof(float)))
                        fail_msg("%s, experts %d..%d: %s differs from the whole model's", c.family, first,
                                 first + count - 1, t->name);
                }
                for (int b = 0; b < win.n_blocks; b++) free(v[b]);
                free(v);
                model_layout_free(&win);
                windows++;
            }
        printf("  %s: %d windows of its 4 experts, every tensor the whole model's\n", c.family, windows);
        for (int b = 0; b < whole.n_blocks; b++) free(w[b]);
        free(w);
        model_layout_free(&whole);
    }
}

/* tf_normal_fill against Box-Muller with libm's log and cos in double
 * precision, rounded to fp32 once: element e draws the two values after
 * s0 + 2e steps. Both paths (AVX2 where the CPU has it, and the plain
 * loop), lengths around the parallel split's threshold and odd ones, three
 * seeds: every value bit for bit the reference's. */
static void test_normal_fill(void **state)
{
    (void)state;
    const long long lens[] = {0, 1, 3, 17, 65536, 65537, 1000003};
    const uint64_t seeds[] = {tf_init_rng(1), tf_init_rng(42), 0xfffffffffffffff0ull};
    const double stds[] = {0.02, 1.0, 0.0028867513459481286};
    float *got = malloc((1000003 + 1) * sizeof *got);
    assert_non_null(got);
    for (int simd = 0; simd < 2; simd++) {
        tf_normal_simd(simd);
        long long total = 0, off = 0;
        double sum = 0, sum2 = 0;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
            for (size_t si = 0; si < 3; si++) {
                long long n = lens[li];
                got[n] = 12345.0f; /* a guard past the end */
                tf_normal_fill(got, n, seeds[si], stds[si]);
                assert_true(got[n] == 12345.0f);
                for (long long e = 0; e < n; e++) {
                    uint64_t x = seeds[si] + 2 * (uint64_t)e * 0x9e3779b97f4a7c15ull;
                    double u1 = ((double)(ref_splitmix(&x) >> 11) + 1.0) / 9007199254740993.0;
                    double u2 = (double)(ref_splitmix(&x) >> 11) / 9007199254740992.0;
                    double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
                    float want = (float)(z * stds[si]);
                    if (memcmp(&got[e], &want, sizeof want) && off++ < 5)
                        fprintf(stderr, "  seed %zu n %lld e %lld: %.9g, the reference %.9g\n", si, n, e,
                                (double)got[e], (double)want);
                    if (si == 1) sum += z, sum2 += z * z;
                }
                total += n;
            }
        long long n1 = 0;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) n1 += lens[li];
        printf("  %s loop: %lld draws, %lld not bit for bit the reference's; seed 42's mean %.4f, variance %.4f\n",
               simd ? "the AVX2 (where the CPU has it)" : "the plain", total, off, sum / (double)n1,
               sum2 / (double)n1 - (sum / (double)n1) * (sum / (double)n1));
        assert_int_equal(off, 0);
    }
    tf_normal_simd(1);
    free(got);
}


/* ---- capacity ------------------------------------------------------------------------------------ */

static void test_capacity(void **state)
{
    (void)state;
    zo_model_config cfg;
    char path[512];
    snprintf(path, sizeof path, "%s/tiny_gpt2.json", fix_dir());
    assert_int_equal(zo_model_config_load(path, &cfg), ZO_OK);
    /* measure what a step needs, unlimited */
    gpu_device_t dev;
    gpu_stream_t s;
    tf_model m;
    tf_trainer tr;
    tf_adamw opt = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
    gpu_cpu_options o = {.n_threads = 2};
    assert_int_equal(gpu_device_init_cpu(&o, &dev), ZO_OK);
    assert_int_equal(tf_init(&m, &cfg, dev, ZO_DTYPE_F32, B, T), ZO_OK);
    assert_int_equal(tf_trainer_init(&tr, &m, &opt), ZO_OK);
    gpu_mem_stats ms;
    gpu_mem_get_stats(dev, &ms);
    size_t need = ms.high_water;
    tf_trainer_free(&tr);
    tf_free(&m);
    gpu_device_free(dev);

    /* one granule short: the allocation that crosses the line fails */
    o.capacity = need - 256;
    assert_int_equal(gpu_device_init_cpu(&o, &dev), ZO_OK);
    assert_int_equal(tf_init(&m, &cfg, dev, ZO_DTYPE_F32, B, T), ZO_OK);
    zo_clear_error();
    assert_int_equal(tf_trainer_init(&tr, &m, &opt), ZO_ERR_CAPACITY);
    assert_non_null(strstr(zo_last_error(), "capacity"));
    gpu_mem_get_stats(dev, &ms);
    assert_true(ms.high_water <= o.capacity);
    tf_free(&m);
    gpu_mem_get_stats(dev, &ms);
    assert_int_equal(ms.in_use, 0);
    gpu_device_free(dev);

    /* exactly enough: a training step runs within it */
    o.capacity = need;
    assert_int_equal(gpu_device_init_cpu(&o, &dev), ZO_OK);
    assert_int_equal(gpu_stream_create(dev, &s), ZO_OK);
    assert_int_equal(tf_init(&m, &cfg, dev, ZO_DTYPE_F32, B, T), ZO_OK);
    assert_int_equal(tf_trainer_init(&tr, &m, &opt), ZO_OK);
    tf_init_weights(&m.layout, tr.master, 7);
    assert_int_equal(tf_trainer_upload(&tr, s), ZO_OK);
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = tg[i] = i % cfg.vocab;
    tf_step_info info;
    assert_int_equal(tf_trainer_step(&tr, s, in, tg, B, T, &info), ZO_OK);
    gpu_mem_get_stats(dev, &ms);
    assert_true(ms.high_water <= o.capacity);
    assert_int_equal(ms.high_water, need);
    tf_trainer_free(&tr);
    tf_free(&m);
    gpu_stream_destroy(s);
    gpu_device_free(dev);
}

/* ---- what the attention computes ------------------------------------------------------------------ */

/* tf_init of a config.json text at sequence t: its status, the error in msg. */
/* tf_init of the model `json` describes at sequence t: its status, the
 * message, and (freq != NULL) the rotary frequencies it uploaded, if any. */
static zo_status init_at(gpu_device_t dev, const char *json, int t, char *msg, size_t cap, double *freq,
                         int *has_freq)
{
    zo_model_config cfg;
    zo_status st = zo_model_config_parse(json, "extent.json", &cfg);
    if (st != ZO_OK) fail_msg("%s", zo_last_error());
    tf_model m;
    zo_clear_error();
    if ((st = tf_init(&m, &cfg, dev, ZO_DTYPE_F32, 1, t)) == ZO_OK) {
        if (has_freq) *has_freq = m.rope_freq != NULL;
        if (freq && m.rope_freq) /* the CPU device's memory is the host's */
            memcpy(freq, m.rope_freq, (size_t)(zo_model_rope_dim(&cfg) / 2) * sizeof *freq);
        tf_free(&m);
    }
    snprintf(msg, cap, "%s", zo_last_error());
    return st;
}

/* Hugging Face's llama3 frequencies (_compute_llama3_parameters), written
 * here from its definition, for head size d. */
static void llama3_freq(double *f, int d, double theta, double factor, double lo, double hi, double orig)
{
    for (int i = 0; i < d / 2; i++) {
        double inv = 1.0 / pow(theta, 2.0 * i / d), wl = 2.0 * M_PI / inv;
        double scaled = wl > orig / lo ? inv / factor : inv;
        double s = (orig / wl - lo) / (hi - lo);
        int medium = !(wl < orig / hi) && !(wl > orig / lo);
        f[i] = medium ? (1.0 - s) * scaled / factor + s * scaled : scaled;
    }
}

/* YaRN's frequencies and attention factor as Hugging Face defines them
 * (_compute_yarn_parameters), written here from the definition for rotary
 * dim d: the dims where beta_fast and beta_slow turns fit in orig positions
 * bound a ramp (floor and ceil of them with truncate, clamped to [0, d -
 * 1]); pair i takes theta^(-2i/d) / factor with weight ramp(i), itself with
 * 1 - ramp(i). ms, msa: mscale and mscale_all_dim (0: not given). */
static double yarn_ref(double *f, int d, double theta, double factor, double orig, double fast, double slow,
                       int truncate, double ms, double msa)
{
    double ends[2], turns[2] = {fast, slow};
    for (int k = 0; k < 2; k++) /* d/2 ln(orig / (2 pi turns)) / ln(theta) */
        ends[k] = 0.5 * d * log(orig / (2.0 * M_PI * turns[k])) / log(theta);
    if (truncate) ends[0] = floor(ends[0]), ends[1] = ceil(ends[1]);
    if (ends[0] < 0.0) ends[0] = 0.0;
    if (ends[1] > d - 1.0) ends[1] = d - 1.0;
    if (ends[1] == ends[0]) ends[1] += 0.001;
    for (int i = 0; i < d / 2; i++) {
        double plain = 1.0 / pow(theta, (2.0 * i) / d);
        double w = fmin(1.0, fmax(0.0, (i - ends[0]) / (ends[1] - ends[0]))); /* interpolation's weight */
        f[i] = w * (plain / factor) + (1.0 - w) * plain;
    }
    double num = factor <= 1.0 ? 1.0 : 1.0 + 0.1 * (ms > 0 && msa > 0 ? ms : 1.0) * log(factor);
    double den = factor <= 1.0 || !(ms > 0 && msa > 0) ? 1.0 : 1.0 + 0.1 * msa * log(factor);
    return num / den;
}

/* tf_init of `json` at sequence t: its rotary frequencies (d/2 of them) and
 * the rotation's scale. */
static void yarn_init(gpu_device_t dev, const char *json, int t, double *f, float *scale, int *d)
{
    zo_model_config cfg;
    if (zo_model_config_parse(json, "yarn.json", &cfg) != ZO_OK) fail_msg("%s", zo_last_error());
    tf_model m;
    if (tf_init(&m, &cfg, dev, ZO_DTYPE_F32, 1, t) != ZO_OK) fail_msg("%s", zo_last_error());
    *d = zo_model_rope_dim(&cfg);
    assert_non_null(m.rope_freq);
    memcpy(f, m.rope_freq, (size_t)(*d / 2) * sizeof *f); /* the CPU device's memory is the host's */
    *scale = m.rope_scale;
    tf_free(&m);
}

/* yarn against yarn_ref: head 128 (Qwen2.5's rope_theta 1e6) with the
 * defaults, and with beta_fast 16, beta_slow 2, an original length of 128
 * and no truncation; a partial rotary dim (Phi-3 shaped, head 80 x 0.75 =
 * 60) with DeepSeek-V2's mscale and mscale_all_dim (factor 40, both 0.707:
 * an attention factor of 1) and with mscale 1 over 0.5. Each case's ramp
 * falls inside the pairs (some kept, some blended, some divided), so the
 * check tells yarn from linear and from none; generation (a cache of 200)
 * gets the same. A rope_theta of 1 is refused. */
static void test_yarn_frequencies(void **state)
{
    (void)state;
    gpu_device_t dev;
    gpu_cpu_options o = {.n_threads = 1};
    assert_int_equal(gpu_device_init_cpu(&o, &dev), ZO_OK);
#define QWEN "{\"model_type\": \"qwen2\", \"num_hidden_layers\": 1, \"hidden_size\": 256, " \
             "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"intermediate_size\": 64, " \
             "\"vocab_size\": 64, \"max_position_embeddings\": 256, \"rope_theta\": %s, "
#define PHI "{\"model_type\": \"phi3\", \"num_hidden_layers\": 1, \"hidden_size\": 160, " \
            "\"num_attention_heads\": 2, \"num_key_value_heads\": 2, \"intermediate_size\": 64, " \
            "\"vocab_size\": 64, \"max_position_embeddings\": 512, \"partial_rotary_factor\": 0.75, " \
            "\"rope_theta\": 10000.0, "
    static const struct {
        const char *json;
        int d;
        double theta, factor, orig, fast, slow;
        int truncate;
        double ms, msa;
    } cases[] = {
        {QWEN "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}", 128, 1e6, 4.0, 256, 32, 1, 1, 0, 0},
        {QWEN "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"beta_fast\": 16, \"beta_slow\": 2, "
              "\"original_max_position_embeddings\": 128, \"truncate\": false}}",
         128, 1e6, 4.0, 128, 16, 2, 0, 0, 0},
        {QWEN "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"beta_fast\": 32, \"beta_slow\": 1, "
              "\"mscale\": 0.707, \"mscale_all_dim\": 0.707, \"original_max_position_embeddings\": 64}}",
         128, 1e4, 40.0, 64, 32, 1, 1, 0.707, 0.707},
        {PHI "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"mscale\": 0.707, \"mscale_all_dim\": 0.707, "
             "\"original_max_position_embeddings\": 256}}",
         60, 1e4, 40.0, 256, 32, 1, 1, 0.707, 0.707},
        {PHI "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 8, \"mscale\": 1.0, \"mscale_all_dim\": 0.5, "
             "\"beta_fast\": 8, \"beta_slow\": 0.5, \"truncate\": false}}",
         60, 1e4, 8.0, 512, 8, 0.5, 0, 1.0, 0.5},
        /* Kimi-K2's beta_fast = beta_slow = 1 (a step, no ramp), truncated and not (one dim: 0.001 wide) */
        {QWEN "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 32, \"beta_fast\": 1.0, \"beta_slow\": 1.0, "
              "\"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 64}}",
         128, 1e4, 32.0, 64, 1, 1, 1, 1.0, 1.0},
        {QWEN "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 32, \"beta_fast\": 1.0, \"beta_slow\": 1.0, "
              "\"original_max_position_embeddings\": 64, \"truncate\": false}}",
         128, 1e4, 32.0, 64, 1, 1, 0, 0, 0},
    };
    char json[1024];
    double f[64], want[64];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *theta = cases[k].theta == 1e6 ? "1000000.0" : "10000.0";
        snprintf(json, sizeof json, cases[k].json, theta);
        double att = yarn_ref(want, cases[k].d, cases[k].theta, cases[k].factor, cases[k].orig, cases[k].fast,
                              cases[k].slow, cases[k].truncate, cases[k].ms, cases[k].msa);
        for (int gen = 0; gen < 2; gen++) {
            float scale;
            int d;
            zo_model_config cfg;
            if (zo_model_config_parse(json, "yarn.json", &cfg) != ZO_OK) fail_msg("%s", zo_last_error());
            if (gen) {
                tf_model m;
                tf_options go = {.kv_len = 200};
                if (tf_init_opts(&m, &cfg, dev, ZO_DTYPE_F32, 1, 8, &go) != ZO_OK) fail_msg("%s", zo_last_error());
                d = zo_model_rope_dim(&cfg);
                assert_non_null(m.rope_freq);
                memcpy(f, m.rope_freq, (size_t)(d / 2) * sizeof *f);
                scale = m.rope_scale;
                tf_free(&m);
            } else {
                yarn_init(dev, json, 130, f, &scale, &d);
            }
            assert_int_equal(d, cases[k].d);
            if (fabs(scale - att) > 1e-6 * att) fail_msg("case %zu: attention factor %.9g, want %.9g", k, scale, att);
            int kept = 0, blended = 0, divided = 0;
            for (int i = 0; i < d / 2; i++) {
                double plain = pow(cases[k].theta, -2.0 * i / d);
                if (fabs(f[i] - want[i]) > 1e-12 * want[i])
                    fail_msg("case %zu pair %d: %.17g, want %.17g", k, i, f[i], want[i]);
                kept += fabs(want[i] - plain) <= 1e-15 * plain;
                divided += fabs(want[i] - plain / cases[k].factor) <= 1e-15 * plain;
                blended += want[i] < plain * (1 - 1e-9) && want[i] > plain / cases[k].factor * (1 + 1e-9);
            }
            if (!(kept > 0 && (blended > 0 || cases[k].fast == cases[k].slow) && divided > 0))
                fail_msg("case %zu: kept %d, blended %d, divided %d: the ramp is not inside the pairs", k, kept,
                         blended, divided);
        }
    }
    /* rope_theta 1: no dims (ln 1 = 0), refused naming it */
    snprintf(json, sizeof json, QWEN "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}", "1.0");
    zo_model_config cfg;
    assert_int_equal(zo_model_config_parse(json, "yarn.json", &cfg), ZO_OK);
    tf_model m;
    assert_int_equal(tf_init(&m, &cfg, dev, ZO_DTYPE_F32, 1, 8), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "rope_theta"));
#undef QWEN
#undef PHI
    gpu_device_free(dev);
}

/* What tf_init computes of a config's attention extent and what it refuses:
 * sliding windows at any length (the op masks them; test_ops and
 * test_e2e_torch check the numbers); rope_scaling llama3 and linear with
 * their frequencies uploaded, dynamic within its original length; dynamic
 * past its length and an unknown kind refused by name; "default" is no
 * scaling (yarn: test_yarn_frequencies). GPT-NeoX and Falcon the same
 * (their rotary embedding is LLaMA's in Hugging Face): linear over
 * GPT-NeoX's rotated part, dynamic past its length refused by name. */
static void test_attention_extent(void **state)
{
    (void)state;
#define TINY "\"num_hidden_layers\": 1, \"hidden_size\": 32, \"num_attention_heads\": 2, " \
             "\"num_key_value_heads\": 1, \"intermediate_size\": 64, \"vocab_size\": 64"
    gpu_device_t dev;
    gpu_cpu_options o = {.n_threads = 1};
    assert_int_equal(gpu_device_init_cpu(&o, &dev), ZO_OK);
    char msg[512];
    double f[8], want[8];
    int has = -1;
    const char *window = "{\"model_type\": \"mistral\", " TINY ", \"sliding_window\": 16}";
    assert_int_equal(init_at(dev, window, 17, msg, sizeof msg, NULL, &has), ZO_OK);
    assert_int_equal(has, 0);
    assert_int_equal(init_at(dev, "{\"model_type\": \"mistral\", " TINY "}", 4097, msg, sizeof msg, NULL, NULL),
                     ZO_OK);
    /* LLaMA-3.1's rope_scaling: the frequencies Hugging Face computes (head size 16) */
    assert_int_equal(init_at(dev, "{\"model_type\": \"llama\", " TINY ", \"rope_theta\": 500000.0, "
                                  "\"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, "
                                  "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64, "
                                  "\"rope_type\": \"llama3\"}}",
                             8, msg, sizeof msg, f, &has),
                     ZO_OK);
    assert_int_equal(has, 1);
    llama3_freq(want, 16, 500000.0, 8.0, 1.0, 4.0, 64.0);
    int scaled = 0, blended = 0;
    for (int i = 0; i < 8; i++) {
        assert_true(fabs(f[i] - want[i]) <= 1e-12 * want[i]);
        double plain = pow(500000.0, -2.0 * i / 16);
        scaled += fabs(f[i] - plain / 8.0) < 1e-15 * plain;
        blended += f[i] < plain * 0.99 && f[i] > plain / 8.0 * 1.01;
    }
    assert_true(scaled > 0 && blended > 0); /* both kinds of pair occur at this shape */
    /* linear: every frequency over the factor */
    assert_int_equal(init_at(dev, "{\"model_type\": \"llama\", " TINY ", \"rope_scaling\": {\"type\": "
                                  "\"linear\", \"factor\": 4.0}}", 8, msg, sizeof msg, f, &has),
                     ZO_OK);
    for (int i = 0; i < 8; i++) assert_true(fabs(f[i] - pow(10000.0, -2.0 * i / 16) / 4.0) < 1e-15);
    /* dynamic: unchanged within max_position_embeddings, refused past it */
    const char *dyn = "{\"model_type\": \"llama\", " TINY ", \"max_position_embeddings\": 32, "
                      "\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}";
    assert_int_equal(init_at(dev, dyn, 32, msg, sizeof msg, f, &has), ZO_OK);
    for (int i = 0; i < 8; i++) assert_true(fabs(f[i] - pow(10000.0, -2.0 * i / 16)) < 1e-15);
    assert_int_equal(init_at(dev, dyn, 33, msg, sizeof msg, NULL, NULL), ZO_ERR_UNSUPPORTED);
    if (!strstr(msg, "rope_scaling \"dynamic\"") || !strstr(msg, "33")) fail_msg("%s", msg);
    /* a kind it does not compute: refused by name */
    assert_int_equal(init_at(dev, "{\"model_type\": \"qwen2\", " TINY ", \"rope_scaling\": {\"type\": \"ntk\", "
                                  "\"factor\": 4.0}}", 8, msg, sizeof msg, NULL, NULL),
                     ZO_ERR_UNSUPPORTED);
    if (!strstr(msg, "rope_scaling \"ntk\"") || !strstr(msg, "yarn")) fail_msg("%s", msg);
    /* GPT-NeoX: linear over the rotated half of each head of 16 (4 frequencies of 8 dims) */
#define NEOX "{\"model_type\": \"gpt_neox\", \"num_hidden_layers\": 1, \"hidden_size\": 32, " \
             "\"num_attention_heads\": 2, \"intermediate_size\": 64, \"vocab_size\": 64, \"rotary_pct\": 0.5, "
    assert_int_equal(init_at(dev, NEOX "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}}", 8, msg,
                             sizeof msg, f, &has),
                     ZO_OK);
    assert_int_equal(has, 1);
    for (int i = 0; i < 4; i++) assert_true(fabs(f[i] - pow(10000.0, -2.0 * i / 8) / 4.0) < 1e-15);
    assert_int_equal(init_at(dev, NEOX "\"max_position_embeddings\": 4, \"rope_scaling\": {\"rope_type\": "
                                  "\"dynamic\", \"factor\": 4.0}}", 8, msg, sizeof msg, NULL, NULL),
                     ZO_ERR_UNSUPPORTED);
    if (!strstr(msg, "rope_scaling \"dynamic\"")) fail_msg("%s", msg);
#undef NEOX
    /* Falcon: dynamic past max_position_embeddings refused by name */
    assert_int_equal(init_at(dev, "{\"model_type\": \"falcon\", \"num_hidden_layers\": 1, \"hidden_size\": 32, "
                                  "\"num_attention_heads\": 2, \"vocab_size\": 64, \"max_position_embeddings\": 32, "
                                  "\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}",
                             33, msg, sizeof msg, NULL, NULL),
                     ZO_ERR_UNSUPPORTED);
    if (!strstr(msg, "rope_scaling \"dynamic\"") || !strstr(msg, "33")) fail_msg("%s", msg);
    assert_int_equal(init_at(dev, "{\"model_type\": \"llama\", " TINY ", \"rope_scaling\": {\"rope_type\": "
                                  "\"default\"}}", 8, msg, sizeof msg, NULL, &has),
                     ZO_OK);
    assert_int_equal(has, 0);
    gpu_device_free(dev);
#undef TINY
}

/* ---- the train program ----------------------------------------------------------------------------- */

static void test_train_program(void **state)
{
    (void)state;
    char dir[64], text[128], save[128], cfg[128], cmd[1024];
    scratch_path(dir, sizeof dir, "zo_test_train_%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    assert_int_equal(system(cmd), 0);
    snprintf(text, sizeof text, "%s/text.txt", dir);
    snprintf(save, sizeof save, "%s/out.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *f = fopen(text, "w");
    assert_non_null(f);
    for (int i = 0; i < 400; i++) fprintf(f, "the quick brown fox jumps over the lazy dog %d. ", i % 10);
    fclose(f);
    f = fopen(cfg, "w");
    fprintf(f, "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 32, \"n_head\": 2,"
               " \"n_positions\": 32, \"vocab_size\": 256}\n");
    fclose(f);
    static char out[1 << 16];
    snprintf(cmd, sizeof cmd,
             "%s --model %s --data %s --text --steps 40 --micro-batch 4 --seq 32 --lr 1e-2 "
             "--device-mem 16MiB --threads 2 --save %s 2>&1", ZO_TRAIN_BIN, cfg, text, save);
    assert_int_equal(run_capture(cmd, out, sizeof out), 0);
    /* losses from "step K loss X" lines: the mean of the last 5 is well below the first */
    float first = -1, last5 = 0;
    int steps = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        int k;
        float l;
        if (sscanf(line, "step %d loss %f", &k, &l) == 2) {
            assert_int_equal(k, steps + 1); /* counted from 1 */
            if (k == 1) first = l;
            if (k > 35) last5 += l / 5;
            steps++;
        }
    }
    assert_int_equal(steps, 40);
    printf("  train: loss %.3f -> %.3f\n", first, last5);
    assert_true(first > 4.0f);        /* ~ln(256) at random init */
    assert_true(last5 < first - 1.5f);
    /* the saved checkpoint opens and holds the GPT-2 names */
    model_ckpt ck;
    assert_int_equal(model_ckpt_open(&ck, save), ZO_OK);
    assert_non_null(model_ckpt_find(&ck, "h.1.mlp.c_fc.weight"));
    model_ckpt_close(&ck);

    /* errors name the flag or the file */
    snprintf(cmd, sizeof cmd, "%s --model %s 2>&1", ZO_TRAIN_BIN, cfg);
    assert_int_equal(run_capture(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--data"));
    /* a missing input file is bad input (2), as memplan says it, not a run
     * that failed (1) */
    snprintf(cmd, sizeof cmd, "%s --model %s --data %s/missing.bin 2>&1", ZO_TRAIN_BIN, cfg, dir);
    assert_int_equal(run_capture(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "missing.bin"));
    snprintf(cmd, sizeof cmd, "%s --model %s --data %s --text --steps x 2>&1", ZO_TRAIN_BIN, cfg, text);
    assert_int_equal(run_capture(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--steps"));
    snprintf(cmd, sizeof cmd, "%s --model %s --data %s --text --seq 32 --device-mem 64KiB 2>&1", ZO_TRAIN_BIN, cfg, text);
    assert_int_equal(run_capture(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "capacity"));
    snprintf(cmd, sizeof cmd, "%s --help", ZO_TRAIN_BIN);
    assert_int_equal(run_capture(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "--device-mem"));
    /* a Mistral whose sliding window the sequence passes trains (the window
     * masks); a rope_scaling it does not compute is bad input (2), named */
    f = fopen(cfg, "w");
    fprintf(f, "{\"model_type\": \"mistral\", \"num_hidden_layers\": 1, \"hidden_size\": 32,"
               " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 64,"
               " \"vocab_size\": 256,"
               " \"sliding_window\": 16}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s --model %s --data %s --text --seq 32 --steps 1 --threads 2 2>&1", ZO_TRAIN_BIN,
             cfg, text);
    assert_int_equal(run_capture(cmd, out, sizeof out), 0);
    f = fopen(cfg, "w");
    fprintf(f, "{\"model_type\": \"llama\", \"num_hidden_layers\": 1, \"hidden_size\": 32,"
               " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 64,"
               " \"vocab_size\": 256, \"max_position_embeddings\": 16,"
               " \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 4.0}}\n");
    fclose(f);
    assert_int_equal(run_capture(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "rope_scaling \"dynamic\""));

    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_normal_fill),
        cmocka_unit_test(test_gpt2_vs_torch),
        cmocka_unit_test(test_loss_chunk),
        cmocka_unit_test(test_phi_vs_torch),
        cmocka_unit_test(test_gptj_vs_torch),
        cmocka_unit_test(test_llama_vs_torch),
        cmocka_unit_test(test_qwen2_vs_torch),
        cmocka_unit_test(test_load_refuses_unexpected),
        cmocka_unit_test(test_qwen3_vs_torch),
        cmocka_unit_test(test_phi3_vs_torch),
        cmocka_unit_test(test_deepseek_v2_vs_torch),
        cmocka_unit_test(test_mla_latent_cache),
        cmocka_unit_test(test_mla_latent_calls),
        cmocka_unit_test(test_phi3_longrope_vs_torch),
        cmocka_unit_test(test_phi3_partial_vs_torch),
        cmocka_unit_test(test_gemma_vs_torch),
        cmocka_unit_test(test_gemma2_vs_torch),
        cmocka_unit_test(test_gemma3_vs_torch),
        cmocka_unit_test(test_gemma_embed_scale),
        cmocka_unit_test(test_generation_vs_torch),
        cmocka_unit_test(test_generation_placements),
        cmocka_unit_test(test_gpt2_training),
        cmocka_unit_test(test_llama_training),
        cmocka_unit_test(test_bf16_fp16),
        cmocka_unit_test(test_head_bias_16bit),
        cmocka_unit_test(test_block_streaming),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_init_sequence),
        cmocka_unit_test(test_init_expert_windows),
        cmocka_unit_test(test_train_lora),
        cmocka_unit_test(test_train_lora_qwen3),
        cmocka_unit_test(test_train_lora_gemma),
        cmocka_unit_test(test_train_phi3_lora),
        cmocka_unit_test(test_train_phi3_resume),
        cmocka_unit_test(test_train_kimi_k2),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_attention_extent),
        cmocka_unit_test(test_yarn_frequencies),
        cmocka_unit_test(test_train_program),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
