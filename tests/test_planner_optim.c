/* Tests for memplan's optimizer-state encodings (issue 30): `--optim
 * adamw8bit`, `--optim-dtype bf16`, `--master none|stochastic|kahan`, the
 * QLoRA recipe (`--recipe qlora`), `--loss-chunk N`; their bytes per tier
 * against the encodings' layout written here, the NVMe traffic and step
 * they give, the search over them, plan files, and the two targets:
 * LLaMA-2-13B full fine-tuning on an RTX 4090 with 64 GB of RAM at most 0.6x
 * of the fp32 state's 54.5 s, and QLoRA r 64 all-linear of LLaMA-65B on an
 * RTX A6000. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "common/model_config.h"
#include "planner/cost.h"
#include "planner/hardware.h"
#include "planner/memory.h"
#include "planner/search.h"
#include "tests/support/run.h" /* defines: run_memplan, run_memplan_json, run_json_num */

/* the desktop of the issue, and its NVMe placement (memplan max-model's) */
#include "tests/support/scratch.h" /* defines: scratch_path */
#define DESKTOP "--model llama-2-13b --gpu rtx-4090 --cpu-mem 64GB --seq 4096"
#define NVME_PLACEMENT "--recompute full --params nvme --grads cpu --optimizer nvme --prefetch 1"


/* bytes of `kind` on `tier` (per rank) */
static double tier_bytes(const cJSON *doc, const char *tier, const char *kind)
{
    return run_json_num(cJSON_GetObjectItemCaseSensitive(doc, "per_rank"), tier, kind);
}

static double step_of(const cJSON *doc) { return run_json_num(doc, "time", "step_s"); }

static double part_of(const cJSON *doc, const char *part)
{
    return run_json_num(cJSON_GetObjectItemCaseSensitive(doc, "time"), "parts", part);
}

/* The state's bytes a parameter, from the encodings' layout (docs/cpu_adam.md,
 * "State encodings"), written out here: fp32 m and v 4 + 4; bf16 2 + 2; 8-bit
 * a code each (1 + 1) and an fp32 absmax per block of 2048 of each (8 / 2048);
 * the fp32 master 4. */
static double ref_bytes(const char *state, int master)
{
    double mv = !strcmp(state, "fp32") ? 8 : !strcmp(state, "bf16") ? 4 : 2 + 2 * 4.0 / 2048;
    return mv + (master ? 4 : 0);
}

/* Every encoding's bytes per tier: the optimizer state of LLaMA-2-13B on NVMe
 * is the trainable count times the layout's bytes; the NVMe traffic of the
 * step (read and written once) and the swap buffers scale with it. */
static void test_state_bytes(void **state)
{
    (void)state;
    static const struct {
        const char *flags, *state;
        int master;
    } c[] = {
        {"", "fp32", 1},
        {"--optim adamw8bit", "8bit", 1},
        {"--optim-dtype bf16", "bf16", 1},
        {"--optim-dtype 8bit", "8bit", 1},
        {"--optim adamw8bit --master stochastic", "8bit", 0},
        {"--optim-dtype bf16 --master none", "bf16", 0},
    };
    char args[1024];
    double nvme_fp32 = 0, t_fp32 = 0;
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        snprintf(args, sizeof args, "estimate " DESKTOP " " NVME_PLACEMENT " %s", c[i].flags);
        cJSON *doc = run_memplan_json(args, 0);
        double p = run_json_num(doc, "trainable_params", NULL);
        /* without a master the CPU optimizer keeps a bf16 copy of the weights
         * (they live on NVMe, not where it updates them): 2 B */
        double per = ref_bytes(c[i].state, c[i].master) + (c[i].master ? 0 : 2);
        double opt = tier_bytes(doc, "nvme", "optimizer");
        /* (fp32 state: the store starts each tensor of a sub-group on 4 KiB,
         * at most a few MiB over 13B parameters) */
        if (opt < p * per - 1.0 || opt > p * per * (1 + 1e-5))
            fail_msg("%s: NVMe optimizer %.0f B, the layout gives %.0f (%.4f B/param)", c[i].flags, opt,
                     p * per, per);
        assert_true(tier_bytes(doc, "gpu", "optimizer") == 0);
        const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(doc, "config");
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(cfg, "optim_dtype")->valuestring, c[i].state);
        assert_true(fabs(run_json_num(cfg, "optimizer_bytes_per_param", NULL) - per) < 1e-9);
        /* the accuracy finding is cited where the state is not fp32 */
        const char *acc = cJSON_GetObjectItemCaseSensitive(cfg, "optimizer_accuracy")->valuestring;
        if (!strcmp(c[i].state, "8bit")) assert_non_null(strstr(acc, "Dettmers et al"));
        if (!strcmp(c[i].state, "bf16")) assert_non_null(strstr(acc, "bf16 m and v"));
        if (i == 0) {
            assert_string_equal(acc, "");
            nvme_fp32 = run_json_num(cJSON_GetObjectItemCaseSensitive(doc, "time"), "before_overlap", "nvme");
            t_fp32 = part_of(doc, "cpu_adam");
        } else {
            /* the drive moves the state's bytes (and the weights' 16-bit
             * write-back, the same for all): less with every encoding */
            double nv = run_json_num(cJSON_GetObjectItemCaseSensitive(doc, "time"), "before_overlap", "nvme");
            assert_true(nv < nvme_fp32);
            /* the CPU update moves fewer bytes too (8-bit's coding
             * instructions stay under its memory roof on 16 cores) */
            assert_true(part_of(doc, "cpu_adam") < t_fp32);
        }
        cJSON_Delete(doc);
    }
}

/* The first target: LLaMA-2-13B full fine-tuning on an RTX 4090 with
 * 64 GB of RAM: 54.5 s per step with fp32 state (memplan max-model's
 * placement); 8-bit m and v with the fp32 master kept: at most 0.6x on the
 * same placement, and the best plan of the search over the encodings
 * (`memplan plan --optim-dtype auto`) at most 0.6x of the best fp32 plan. */
static void test_13b_rtx4090(void **state)
{
    (void)state;
    cJSON *f = run_memplan_json("estimate " DESKTOP " " NVME_PLACEMENT, 0);
    cJSON *q = run_memplan_json("estimate " DESKTOP " " NVME_PLACEMENT " --optim adamw8bit", 0);
    double s32 = step_of(f), s8 = step_of(q);
    printf("  llama-2-13b, rtx-4090, 64 GB: fp32 state %.3f s, adamw8bit %.3f s (%.3fx)\n", s32, s8,
           s8 / s32);
    assert_true(fabs(s32 - 54.46) < 0.05); /* today's figure (README.md, docs/memplan.md) */
    assert_true(s8 <= 0.6 * s32);
    /* NVMe bytes of the optimizer: 6.004 of 12 a parameter */
    double r = tier_bytes(q, "nvme", "optimizer") / tier_bytes(f, "nvme", "optimizer");
    assert_true(fabs(r - ref_bytes("8bit", 1) / 12) < 1e-5); /* (fp32's 4 KiB alignment) */
    cJSON_Delete(f);
    cJSON_Delete(q);

    static char out[1 << 18];
    assert_int_equal(run_memplan("plan " DESKTOP " --global-batch 1", out, sizeof out), 0);
    double best32 = 0, best_auto = 0, hinted = 0;
    const char *b = strstr(out, "best: ");
    assert_non_null(b);
    assert_int_equal(sscanf(b, "best: %lf s per step", &best32), 1);
    /* the state not given: a line names the other encodings' best (checked against the
     * search over them below) */
    const char *h = strstr(out, "(AdamW's m and v in 32 bits; --optim-dtype 8bit (6.004 B/param with the fp32 "
                                "master) takes ");
    assert_non_null(h);
    assert_true(h < b);
    assert_int_equal(sscanf(strstr(h, "takes ") + 6, "%lf s per step", &hinted), 1);
    assert_non_null(strstr(h, "its accuracy: 8-bit AdamW (Dettmers et al."));
    assert_int_equal(run_memplan("plan " DESKTOP " --global-batch 1 --optim-dtype auto", out, sizeof out), 0);
    b = strstr(out, "best: ");
    assert_non_null(b);
    assert_int_equal(sscanf(b, "best: %lf s per step", &best_auto), 1);
    printf("  best plan: fp32 state %.2f s, searched encodings %.2f s (%.3fx)\n", best32, best_auto,
           best_auto / best32);
    assert_true(best_auto <= 0.6 * best32);
    /* it says which state, and what that costs in accuracy, citing the paper */
    assert_non_null(strstr(out, "AdamW state: 8bit m, v"));
    assert_non_null(strstr(out, "accuracy of that state: 8-bit AdamW (Dettmers et al."));
    /* the hint's step is that search's best (4 significant digits both) */
    assert_true(fabs(hinted - best_auto) <= 1e-3 * best_auto);
    assert_null(strstr(out, "(AdamW's m and v in 32 bits;"));
    /* given explicitly, the 32-bit state gets no line; nor does a model it trains fast */
    assert_int_equal(run_memplan("plan " DESKTOP " --global-batch 1 --optim-dtype fp32", out, sizeof out), 0);
    assert_null(strstr(out, "(AdamW's m and v in 32 bits;"));
    assert_int_equal(run_memplan("plan --model gpt2 --gpu h100-80gb --seq 1024 --global-batch 8", out, sizeof out), 0);
    assert_null(strstr(out, "(AdamW's m and v in 32 bits;"));
    /* nothing fits with 32-bit state (no disk, 100 GiB of host memory on an H100): the line
     * says what does, beside "nothing fits" (exit 1) */
    assert_int_equal(run_memplan("plan --model llama-2-13b --gpu h100-80gb --cpu-mem 100GiB --nvme 0 --seq 2048 "
                                 "--global-batch 4", out, sizeof out), 1);
    h = strstr(out, "(AdamW's m and v in 32 bits; --optim-dtype 8bit");
    assert_non_null(h);
    assert_non_null(strstr(h, "where the 32-bit state fits nowhere: "));
    assert_non_null(strstr(out, "nothing fits"));
}

/* When full fine-tuning does not fit, the suggestions include 8-bit AdamW on
 * the offload ladder (kind adamw8bit), and its flags, applied, fit and take
 * that long: on the desktop, 0.6x of the same placement with fp32 state. */
static void test_suggestion(void **state)
{
    (void)state;
    cJSON *doc = run_memplan_json("estimate " DESKTOP, 1);
    const cJSON *a, *hit = NULL;
    cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(doc, "suggestions"))
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(a, "kind")->valuestring, "adamw8bit")) hit = a;
    assert_non_null(hit);
    const char *flags = cJSON_GetObjectItemCaseSensitive(hit, "flags")->valuestring;
    assert_non_null(strstr(flags, "--optim adamw8bit"));
    char args[1024];
    snprintf(args, sizeof args, "estimate " DESKTOP " %s", flags);
    cJSON *d = run_memplan_json(args, 0);
    assert_true(fabs(step_of(d) - run_json_num(hit, "step_s", NULL)) < 1e-9 * step_of(d));
    printf("  suggested: %s: %.3f s\n", flags, step_of(d));
    assert_true(step_of(d) <= 0.6 * 54.461);
    cJSON_Delete(d);
    cJSON_Delete(doc);
}

/* max-model with 8-bit state: ZeRO-Offload's largest LLaMA on the desktop
 * grows from 3.69B (fp32 state, README.md) as the state shrinks from 12 to
 * 6 bytes a parameter, and the largest preset's check carries the flag and
 * the 8-bit step. */
static void test_max_model(void **state)
{
    (void)state;
    cJSON *f = run_memplan_json("max-model --family llama --gpu rtx-4090 --cpu-mem 64GB", 0);
    cJSON *q = run_memplan_json("max-model --family llama --gpu rtx-4090 --cpu-mem 64GB --optim adamw8bit", 0);
    double off32 = 0, off8 = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, f)
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(r, "strategy")->valuestring, "zero-offload"))
            off32 = run_json_num(r, "params", NULL);
    cJSON_ArrayForEach(r, q) {
        const char *name = cJSON_GetObjectItemCaseSensitive(r, "strategy")->valuestring;
        if (!strcmp(name, "zero-offload")) off8 = run_json_num(r, "params", NULL);
        if (!strcmp(name, "zero-infinity-nvme")) {
            const cJSON *pr = cJSON_GetObjectItemCaseSensitive(r, "preset");
            assert_non_null(strstr(cJSON_GetObjectItemCaseSensitive(pr, "check")->valuestring, "--optim adamw8bit"));
        }
    }
    printf("  zero-offload's largest llama: fp32 state %.3gB, 8-bit %.3gB parameters\n", off32 / 1e9, off8 / 1e9);
    assert_true(off32 > 3e9 && off8 > 1.5 * off32);
    cJSON_Delete(f);
    cJSON_Delete(q);
}

/* The search tries the encodings only when asked; with them it ranks the
 * 8-bit state first on the desktop, and each ranked plan is what the
 * estimate says of it. */
static void test_search_states(void **state)
{
    (void)state;
    zo_model_config m;
    plan_hw hw;
    assert_int_equal(zo_model_preset_find("llama-2-13b", &m), ZO_OK);
    assert_int_equal(plan_hw_find("rtx-4090", &hw), ZO_OK);
    hw.cpu_mem = 64000000000ull;
    plan_space s;
    plan_space_defaults(&s, &m, &hw);
    s.base.seq = 4096;
    s.global_batch = 1;
    plan_result r;
    assert_int_equal(plan_search(&m, &hw, &s, 5, &r), ZO_OK);
    assert_true(r.n_best > 0);
    for (int i = 0; i < r.n_best; i++) assert_int_equal(r.best[i].t.opt_state, ZO_PLAN_STATE_FP32);
    double fp32 = r.best[0].time.step;
    s.opt_states = (1u << ZO_PLAN_STATES) - 1;
    assert_int_equal(plan_search(&m, &hw, &s, 5, &r), ZO_OK);
    assert_int_equal(r.best[0].t.opt_state, ZO_PLAN_STATE_8BIT);
    assert_true(r.best[0].time.step < fp32);
    for (int i = 0; i < r.n_best; i++) {
        plan_estimate e;
        plan_time pt;
        assert_int_equal(plan_estimate_run(&m, &hw, &r.best[i].t, &e), ZO_OK);
        assert_int_equal(plan_time_run(&m, &hw, &r.best[i].t, &e, &pt), ZO_OK);
        assert_true(e.fits);
        assert_true(pt.step == r.best[i].time.step);
    }
}

/* The second target: QLoRA r 64 on every linear layer of LLaMA-65B
 * on one RTX A6000 (47.99 GiB), everything on the GPU, 512 tokens, full
 * recompute: with an fp32 master for the adapters (12 B each) it is over;
 * the paper's recipe (bf16 adapters, 32-bit AdamW, no master: 8 B) fits. */
static void test_qlora_recipe_65b(void **state)
{
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "estimate --model %s/hf-configs/llama-65b.json --gpu rtx-a6000 --seq 512 "
             "--recompute full", ZO_FIXTURES_DIR);
    char a[1200];
    snprintf(a, sizeof a, "%s --lora 64 --lora-targets all-linear --qlora", args);
    cJSON *old = run_memplan_json(a, 1);
    snprintf(a, sizeof a, "%s --recipe qlora", args);
    cJSON *rec = run_memplan_json(a, 0);
    double p = run_json_num(rec, "trainable_params", NULL);
    assert_true(p == 799539200.0); /* PEFT's count: r 64, every linear layer */
    assert_true(run_json_num(old, "trainable_params", NULL) == p);
    assert_true(tier_bytes(old, "gpu", "optimizer") == 12 * p);
    assert_true(tier_bytes(rec, "gpu", "optimizer") == 8 * p);
    double cap = tier_bytes(rec, "gpu", "capacity");
    printf("  llama-65b QLoRA r 64 all-linear on rtx-a6000: fp32 master %.2f GiB, the recipe %.2f GiB of "
           "%.2f\n", tier_bytes(old, "gpu", "total") / (1 << 30), tier_bytes(rec, "gpu", "total") / (1 << 30),
           cap / (1 << 30));
    assert_true(tier_bytes(rec, "gpu", "total") <= cap);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(rec, "config");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(cfg, "method")->valuestring, "qlora");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(cfg, "master")->valuestring, "none");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(cfg, "optim_dtype")->valuestring, "fp32");
    assert_non_null(strstr(cJSON_GetObjectItemCaseSensitive(cfg, "optimizer_accuracy")->valuestring,
                           "QLoRA"));
    cJSON_Delete(old);
    cJSON_Delete(rec);
}

/* --loss-chunk N: the logits of N tokens in fp32 (4 x N x vocab), and their
 * 16-bit gradient of N tokens, in place of the micro-batch's. */
static void test_loss_chunk(void **state)
{
    (void)state;
    cJSON *w = run_memplan_json("estimate --model llama-3-8b --seq 8192 --micro-batch 8 --recompute full", 1);
    cJSON *c = run_memplan_json("estimate --model llama-3-8b --seq 8192 --micro-batch 8 --recompute full "
                            "--loss-chunk 4096", 1);
    const double vocab = 128256, tokens = 8192.0 * 8;
    double got_w = 0, got_c = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(
                               cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(w, "per_rank"),
                                                                "gpu"), "items"))
        if (strstr(cJSON_GetObjectItemCaseSensitive(it, "name")->valuestring, "logits"))
            got_w = run_json_num(it, "bytes", NULL);
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(
                               cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "per_rank"),
                                                                "gpu"), "items"))
        if (strstr(cJSON_GetObjectItemCaseSensitive(it, "name")->valuestring, "logits"))
            got_c = run_json_num(it, "bytes", NULL);
    assert_true(got_w == 4 * tokens * vocab); /* 31.3 GiB: the 31 GB for 60k tokens */
    assert_true(got_c == 4 * 4096 * vocab);
    assert_true(tier_bytes(w, "gpu", "total") - tier_bytes(c, "gpu", "total") >= got_w - got_c);
    cJSON_Delete(w);
    cJSON_Delete(c);
}

/* Bad combinations exit 2 naming the flag; a plan file carries the state,
 * the master and the chunk, and estimates to the same figures. */
static void test_flags_and_plan_files(void **state)
{
    (void)state;
    static char out[1 << 18];
    static const struct {
        const char *flags, *msg;
    } bad[] = {
        {"--optim adamw8bit --optim-dtype bf16", "--optim-dtype bf16: --optim adamw8bit"},
        {"--optim-dtype bf16 --optim adamw8bit", "--optim adamw8bit keeps m and v in 8 bits"},
        {"--optim-dtype fp8", "--optim-dtype: 'fp8' is not"},
        {"--optim adam4bit", "--optim: 'adam4bit' is not adamw, adamw8bit or sgd"},
        {"--optim sgd --optim-dtype bf16", "--optim-dtype bf16: the bf16 and 8-bit encodings are AdamW's"},
        {"--master stochastic --dtype fp16", "--master stochastic: without an fp32 master"},
        {"--master half", "--master: 'half' is not"},
        {"--recipe lora", "--recipe: 'lora' is not qlora"},
        {"--recipe qlora --optim adamw8bit", "--recipe qlora runs 32-bit AdamW"},
        {"--loss-chunk -1", "--loss-chunk"},
    };
    char args[1024];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "estimate --model llama-2-7b %s", bad[i].flags);
        int rc = run_memplan(args, out, sizeof out);
        if (rc != 2 || !strstr(out, bad[i].msg))
            fail_msg("memplan %s: exit %d, wanted 2 and '%s':\n%s", args, rc, bad[i].msg, out);
    }
    char dir[64];
    scratch_path(dir, sizeof dir, "memplan-optim-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(args, sizeof args, "estimate " DESKTOP " " NVME_PLACEMENT " --optim adamw8bit --master kahan "
             "--loss-chunk 1024 --plan-out %s/p.json", dir);
    cJSON *a = run_memplan_json(args, 0);
    snprintf(args, sizeof args, "%s/p.json", dir);
    FILE *fp = fopen(args, "r");
    assert_non_null(fp);
    size_t n = fread(out, 1, sizeof out - 1, fp);
    out[n] = '\0';
    fclose(fp);
    cJSON *pf = cJSON_Parse(out);
    assert_non_null(pf);
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(pf, "training");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(tr, "optim_dtype")->valuestring, "8bit");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(tr, "master")->valuestring, "kahan");
    assert_true(run_json_num(tr, "loss_chunk", NULL) == 1024);
    cJSON_Delete(pf);
    snprintf(args, sizeof args, "estimate --plan %s/p.json", dir);
    cJSON *b = run_memplan_json(args, 0);
    assert_true(step_of(a) == step_of(b));
    assert_true(tier_bytes(a, "nvme", "optimizer") == tier_bytes(b, "nvme", "optimizer"));
    assert_true(tier_bytes(a, "gpu", "total") == tier_bytes(b, "gpu", "total"));
    cJSON_Delete(a);
    cJSON_Delete(b);
    snprintf(args, sizeof args, "rm -rf %s", dir);
    assert_int_equal(system(args), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_bytes),       cmocka_unit_test(test_13b_rtx4090),
        cmocka_unit_test(test_search_states),     cmocka_unit_test(test_qlora_recipe_65b),
        cmocka_unit_test(test_loss_chunk),        cmocka_unit_test(test_suggestion),
        cmocka_unit_test(test_max_model),        cmocka_unit_test(test_flags_and_plan_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
