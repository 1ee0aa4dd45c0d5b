/* Whole-model parity of the CUDA backend with the CPU backend: the tiny
 * GPT-2, LLaMA (GQA, untied), Qwen2, Gemma-2 and Gemma-3 models of tests/fixtures/gpu run on
 * both devices from the same weights and batch; the loss and every gradient
 * must agree, and a short training run (AdamW steps through the trainer, the
 * `train` program's loop) must give the same losses. bf16 and fp16 storage
 * are checked on the loss.
 *
 * fp32 gradients, against an error model rather than one tolerance: CUDA
 * runs fp32 GEMMs on TF32 tensor cores (cuBLASLt's
 * CUBLAS_COMPUTE_32F_FAST_TF32), so the CPU reference runs twice, exactly
 * (cpu) and with TF32 GEMMs (emu: gpu_cpu_options.tf32, A and B rounded to
 * TF32 to nearest, fp32 sums), and each element of the device's gradient is
 * held to
 *
 *     |dut - cpu| <= K |emu - cpu| + min(old, old / F + R rms)
 *
 * with old = 5e-3 max|cpu| + 2e-2 |cpu| (the fixed tolerance this replaces)
 * and rms that of emu - cpu over the tensor. Why: both TF32 runs round the
 * same operands the same way wherever their inputs are equal, so the
 * rounding moves them alike (dut - cpu ~ emu - cpu; on the H100, 0.93 to
 * 1.01 of it at the three elements the old tolerance failed). What
 * separates them is fp32-level: the order of the sums (which moves emu's
 * own effect by up to 14% between the CPU's two GEMM kernels), and the few
 * operands an upstream fp32-level difference puts on the other side of a
 * TF32 rounding boundary, whose effect spreads over a tensor at the scale
 * of its TF32 effect (rms), not of the element's own. K = 2 covers the
 * first twice over; R rms + old / F the second and the fp32 noise of
 * elements TF32 leaves alone (F = 10: checked 10 times tighter than the old
 * tolerance where TF32 moves nothing), capped at the old tolerance, so an
 * element is allowed past the old tolerance only by what the CPU's own TF32
 * run moved it (K |emu - cpu|). K = 2, R = 2: the cpu-tf32 mode below,
 * whose two TF32 runs sum in different orders, needs R <= 0.43 at K = 2
 * (1.18 at K = 1) and stays within 0.63 of every bound (docs/testing.md,
 * "fp32 against TF32").
 * The model is not exact: cuBLASLt documents TF32 compute, not its
 * conversion (PTX's cvt.rna.tf32.f32 rounds ties away from zero, emu does
 * the same; a kernel that truncated instead would make its roundings
 * independent of emu's and fail this check, which is then the finding),
 * nor its order of sums (split-K among them); C and alpha/beta stay fp32
 * in its epilogue, as in emu, and FAST_TF32 is one TF32 product per
 * operand pair (3xTF32, which would keep fp32 accuracy, is not what this
 * compute type asks for).
 *
 * ZO_PARITY_BACKEND=cpu runs it CPU-vs-CPU (a check of the test itself);
 * ZO_PARITY_BACKEND=cpu-tf32 makes the device under test a CPU device with
 * TF32 GEMMs, its gradients' GEMMs on the own kernel (cpu_gemm_set_impl, set
 * back to auto after) so that its sums run in another order than emu's
 * (OpenBLAS), as a GPU's do: the model runs without a GPU. Every mode
 * prints, per model, the largest difference as a fraction of its bound and
 * in how many tensors the device's gradient scaled by 1.01 would fail.
 * Exits 77 where no CUDA device is present (cuda mode). */
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
#include "gpu/ops_cpu.h"          /* defines: cpu_gemm_set_impl */
#include "model/safetensors.h"    /* defines: model_load_path */
#include "tests/support/check.h" /* defines: check_close_scaled_f32 */
#include "tests/support/ref_trainer.h" /* defines: tf_trainer, tf_model */

#define FIX ZO_FIXTURES_DIR "/gpu/"
#define B 2
#define T 8
#define STEPS 5

static const char *backend = "cuda";

/* The error model's constants (the header says why). */
#define TF32_K 2.0
#define TF32_R 2.0
#define FLOOR_DIV 10.0
#define OLD_ATOL 5e-3 /* the fixed tolerance this check replaces, of max|cpu| */
#define OLD_RTOL 2e-2 /* and of |cpu| */

/* A device by name: "cpu-tf32" is a CPU device with TF32 GEMMs, the rest as
 * gpu_device_open takes them. */
static zo_status device_open(const char *name, gpu_device_t *dev)
{
    if (!strcmp(name, "cpu-tf32"))
        return gpu_device_init_cpu(&(gpu_cpu_options){.tf32 = 1}, dev);
    return gpu_device_open(name, 0, dev);
}

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
    if (device_open(devname, &sd->dev) != ZO_OK) printf("  %s\n", zo_last_error());
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

/* The elements of got (scaled by `scale`: 1, or 1.01 to test the check)
 * outside the header's bound, K |emu - want| + min(old, old / F + R rms),
 * rms that of emu - want over the tensor; prints the first 5 and a summary
 * when `verbose`, adds to *looser the elements whose bound is past the old
 * fixed tolerance and raises *ratio to the largest |got - want| / bound.
 * nan never matches. */
static int check_tf32_model(const char *what, const float *got, const float *want,
                            const float *emu, size_t n, float scale, int verbose, int *looser,
                            double *ratio)
{
    double top = 0.0, ss = 0.0, worst = 0.0, at_d = 0.0, at_b = 0.0;
    for (size_t i = 0; i < n; i++) {
        top = fmax(top, fabs((double)want[i]));
        ss += ((double)emu[i] - want[i]) * ((double)emu[i] - want[i]);
    }
    const double rms = n ? sqrt(ss / (double)n) : 0.0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double w = want[i], d = fabs((double)(got[i] * scale) - w);
        const double old = OLD_ATOL * top + OLD_RTOL * fabs(w);
        const double bound =
            TF32_K * fabs((double)emu[i] - w) + fmin(old, old / FLOOR_DIV + TF32_R * rms);
        if (looser && bound > old) (*looser)++;
        if (d / bound > worst || isnan(d)) worst = d / bound, at_d = d, at_b = bound;
        if (!(d <= bound)) {
            if (verbose && bad < 5)
                printf("  %s[%zu]: got %.8g want %.8g (tf32 emulated %.8g, bound %.3g)\n", what,
                       i, got[i] * scale, w, emu[i], bound);
            bad++;
        }
    }
    if (verbose && bad)
        printf("  %s: %d of %zu mismatched, worst %.3g of its bound %.3g (scale %.3g, tf32 rms "
               "%.3g)\n", what, bad, n, at_d, at_b, top, rms);
    if (ratio && worst > *ratio) *ratio = worst;
    return bad;
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
    /* cpu-tf32: the device's gradients summed in another order than emu's
     * (the own GEMM kernel, emu OpenBLAS where the build has it), as the
     * GPU's are */
    const int own_order = !strcmp(backend, "cpu-tf32");
    /* the loss: fp32 with TF32 GEMMs on CUDA (10-bit mantissa); 16-bit: one
     * rounding of each stored activation may land on either side of a tie */
    double loss_rtol = is_f32 ? 2e-3 : (dt == ZO_DTYPE_BF16 ? 2e-2 : 5e-3);
    int bad = 0;

    /* gradients of one batch, every tensor by name */
    int32_t in[B * T], tg[B * T];
    make_batch(cfg.vocab, 0, in, tg);
    tf_step_info ir, id;
    assert_int_equal(tf_trainer_grads(&ref.tr, ref.s, in, tg, B, T, &ir), ZO_OK);
    if (own_order) cpu_gemm_set_impl(CPU_GEMM_OWN);
    assert_int_equal(tf_trainer_grads(&dut.tr, dut.s, in, tg, B, T, &id), ZO_OK);
    if (own_order) cpu_gemm_set_impl(CPU_GEMM_AUTO);
    bad += check_close_scaled_f32("loss", &id.loss, &ir.loss, 1, 0.0, loss_rtol);
    if (is_f32) {
        /* the CPU again, with TF32 GEMMs: what TF32 alone does to each element */
        side emu;
        tf_step_info ie;
        side_open(&emu, "cpu-tf32", &cfg, dt, weights, &opt);
        assert_int_equal(tf_trainer_grads(&emu.tr, emu.s, in, tg, B, T, &ie), ZO_OK);
        int looser = 0, caught = 0;
        double ratio = 0.0;
        size_t n_all = 0;
        for (int i = 0; i < ref.m.layout.n_tensors; i++) {
            const model_tensor *t = &ref.m.layout.tensors[i];
            const float *g = dut.tr.grad[t->block] + t->offset;
            const float *w = ref.tr.grad[t->block] + t->offset;
            const float *e = emu.tr.grad[t->block] + t->offset;
            bad += check_tf32_model(t->name, g, w, e, t->numel, 1.0f, 1, &looser, &ratio);
            /* how sharp the check is: would this tensor scaled by 1.01 fail? */
            caught += check_tf32_model(t->name, g, w, e, t->numel, 1.01f, 0, NULL, NULL) > 0;
            n_all += t->numel;
        }
        printf("  %s fp32 on %s: %zu gradient elements, the largest difference %.2f of its "
               "bound, %d bounds past the old tolerance; a tensor scaled by 1.01 fails in %d of "
               "%d tensors\n", name, backend, n_all, ratio, looser, caught, ref.m.layout.n_tensors);
        bad += check_close_scaled_f32("grad norm", &id.grad_norm, &ir.grad_norm, 1, 0.0, 5e-3);
        side_close(&emu);
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
    if (strcmp(backend, "cpu") != 0 && strcmp(backend, "cpu-tf32") != 0 &&
        gpu_cuda_device_count() == 0) {
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
