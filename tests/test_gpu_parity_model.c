/* Whole-model parity of the CUDA backend with the CPU backend: the tiny
 * GPT-2, LLaMA (GQA, untied), Qwen2, Gemma-2 and Gemma-3 models of tests/fixtures/gpu run on
 * both devices from the same weights and batch; the loss and every gradient
 * must agree, and a short training run (AdamW steps through the trainer, the
 * `train` program's loop) must give the same losses. fp32 runs with TF32
 * GEMMs on CUDA, so tolerances are those of a 10-bit mantissa; bf16 and fp16
 * storage are checked on the loss. Exits 77 where no CUDA device is present;
 * ZO_PARITY_BACKEND=cpu runs it CPU-vs-CPU (a check of the test itself). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/device.h"           /* defines: gpu_device_open, gpu_cuda_device_count */
#include "model/safetensors.h"    /* defines: model_load_path */
#include "tests/support/check.h" /* defines: check_close_scaled_f32 */
#include "tests/support/ref_trainer.h" /* defines: tf_trainer, tf_model */

#define FIX ZO_FIXTURES_DIR "/gpu/"
#define B 2
#define T 8
#define STEPS 5

static const char *backend = "cuda";

/* One model on one device with its trainer. */
typedef struct side {
    gpu_device_t dev;
    gpu_stream_t s;
    tf_model m;
    tf_trainer tr;
} side;

static void side_open(side *sd, const char *devname, const zo_model_config *cfg, zo_dtype dt,
                      const char *weights, const tf_adamw *opt)
{
    memset(sd, 0, sizeof *sd);
    if (gpu_device_open(devname, 0, &sd->dev) != ZO_OK) printf("  %s\n", zo_last_error());
    assert_non_null(sd->dev);
    assert_int_equal(gpu_stream_create(sd->dev, &sd->s), ZO_OK);
    assert_int_equal(tf_init(&sd->m, cfg, sd->dev, dt, B, T), ZO_OK);
    assert_int_equal(tf_trainer_init(&sd->tr, &sd->m, opt), ZO_OK);
    model_load_report rep;
    assert_int_equal(model_load_path(weights, &sd->m.layout, (void *const *)sd->tr.master,
                                     ZO_DTYPE_F32, MODEL_LOAD_STRICT, &rep), ZO_OK);
    assert_int_equal(tf_trainer_upload(&sd->tr, sd->s), ZO_OK);
}

static void side_close(side *sd)
{
    tf_trainer_free(&sd->tr);
    tf_free(&sd->m);
    gpu_stream_destroy(sd->s);
    gpu_mem_stats ms;
    gpu_mem_get_stats(sd->dev, &ms);
    assert_int_equal(ms.n_allocs, 0);
    gpu_device_free(sd->dev);
}

/* A deterministic batch of ids below vocab, targets shifted by one. */
static void make_batch(int vocab, int step, int32_t *in, int32_t *tg)
{
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)((i * 7 + step * 13 + 3) % vocab);
        tg[i] = (int32_t)((i * 7 + step * 13 + 10) % vocab);
    }
    tg[5] = -1; /* an ignored target */
}

static void run_model(const char *name, zo_dtype dt)
{
    char cfg_path[512], weights[512];
    snprintf(cfg_path, sizeof cfg_path, FIX "%s.json", name);
    snprintf(weights, sizeof weights, FIX "%s.safetensors", name);
    zo_model_config cfg;
    assert_int_equal(zo_model_config_load(cfg_path, &cfg), ZO_OK);
    tf_adamw opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                    .weight_decay = 0.1f, .clip = 1.0f};
    side ref, dut;
    side_open(&ref, "cpu", &cfg, dt, weights, &opt);
    side_open(&dut, backend, &cfg, dt, weights, &opt);
    int is_f32 = dt == ZO_DTYPE_F32;
    /* fp32: TF32 GEMMs on CUDA (10-bit mantissa); 16-bit: one rounding of
     * each stored activation may land on either side of a tie */
    double loss_rtol = is_f32 ? 2e-3 : (dt == ZO_DTYPE_BF16 ? 2e-2 : 5e-3);
    int bad = 0;

    /* gradients of one batch, every tensor by name */
    int32_t in[B * T], tg[B * T];
    make_batch(cfg.vocab, 0, in, tg);
    tf_step_info ir, id;
    assert_int_equal(tf_trainer_grads(&ref.tr, ref.s, in, tg, B, T, &ir), ZO_OK);
    assert_int_equal(tf_trainer_grads(&dut.tr, dut.s, in, tg, B, T, &id), ZO_OK);
    bad += check_close_scaled_f32("loss", &id.loss, &ir.loss, 1, 0.0, loss_rtol);
    if (is_f32) {
        for (int i = 0; i < ref.m.layout.n_tensors; i++) {
            const model_tensor *t = &ref.m.layout.tensors[i];
            bad += check_close_scaled_f32(t->name, dut.tr.grad[t->block] + t->offset,
                                          ref.tr.grad[t->block] + t->offset, t->numel, 5e-3, 2e-2);
        }
        bad += check_close_scaled_f32("grad norm", &id.grad_norm, &ir.grad_norm, 1, 0.0, 5e-3);
    }

    /* a short training run: the same losses step after step */
    float lr[STEPS], ld[STEPS];
    for (int k = 0; k < STEPS; k++) {
        make_batch(cfg.vocab, k + 1, in, tg);
        assert_int_equal(tf_trainer_step(&ref.tr, ref.s, in, tg, B, T, &ir), ZO_OK);
        assert_int_equal(tf_trainer_step(&dut.tr, dut.s, in, tg, B, T, &id), ZO_OK);
        lr[k] = ir.loss;
        ld[k] = id.loss;
        assert_int_equal(id.skipped, ir.skipped);
    }
    bad += check_close_scaled_f32("train losses", ld, lr, STEPS, 0.0,
                                  is_f32 ? 5e-3 : 3 * loss_rtol);
    if (bad) printf("  in %s %s\n", name, zo_dtype_name(dt));
    assert_int_equal(bad, 0);
    side_close(&dut);
    side_close(&ref);
}

static void test_gpt2(void **state)
{
    (void)state;
    run_model("tiny_gpt2", ZO_DTYPE_F32);
    run_model("tiny_gpt2", ZO_DTYPE_BF16);
}

static void test_llama(void **state)
{
    (void)state;
    run_model("tiny_llama", ZO_DTYPE_F32);
    run_model("tiny_llama", ZO_DTYPE_BF16);
    run_model("tiny_llama", ZO_DTYPE_F16);
}

static void test_qwen2(void **state)
{
    (void)state;
    run_model("tiny_qwen2", ZO_DTYPE_F32);
}

/* Gemma-2: four norms a layer, scores scaled and soft-capped, logits
 * capped, a window of 5 (of T 8) on layer 0 */
static void test_gemma2(void **state)
{
    (void)state;
    run_model("tiny_gemma2", ZO_DTYPE_F32);
    run_model("tiny_gemma2", ZO_DTYPE_BF16);
    run_model("tiny_gemma3", ZO_DTYPE_F32); /* q/k norms, the local layers' own rotary base */
}

int main(void)
{
    const char *env = getenv("ZO_PARITY_BACKEND");
    if (env && *env) backend = env;
    if (strcmp(backend, "cpu") != 0 && gpu_cuda_device_count() == 0) {
        printf("test_gpu_parity_model: no CUDA device here (or a build without CUDA): skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_gemma2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
