/* Tests for fine-tuning in `train` (examples/finetune.h and examples/train/):
 * - learning-rate schedules: ft_lr_at and the lr train applies at every step
 *   against the closed form written out here; a run resumed mid-warmup and
 *   mid-decay prints the lr and loss sequence of an uninterrupted one;
 * - evaluation: the forward-only eval loss equals the mean training loss of
 *   the same batches at lr 0, perplexity is its exp; an MoE model's
 *   evaluation counts and reports the pairs its capacity factor drops;
 * - the metrics log (every field, eval members on eval steps) and its SVG
 *   (train --plot, the plot program);
 * - the masked loss of prompt/completion data: loss and every gradient
 *   against PyTorch's cross_entropy(ignore_index=-1)
 *   (tests/fixtures/gpu/make_masked.py; test_finetune_torch remakes the
 *   references with /usr/bin/python3);
 * - train on text through a tokenizer and on prompt/completion JSONL;
 * - the conventions fine-tuners expect: steps and checkpoints counted from
 *   1 alike, a resume with nothing left says so, AdamW's defaults the
 *   Hugging Face Trainer's and the dtype memplan's (the header says both,
 *   and they are what runs), the time line's parts add up to its total, the
 *   header names the model's family ("mixtral"). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "examples/finetune.h"  /* defines: ft_lr_at, ft_log_read */
#include "tests/support/files.h" /* defines: files_write_text */
#include "tests/support/ref_trainer.h" /* defines: tf_trainer */
#include "tests/support/run.h"  /* defines: run_memplan */
#include "model/safetensors.h"  /* defines: model_st_open, model_load_path */

/* ---- helpers --------------------------------------------------------------------------- */
#include "tests/support/scratch.h" /* defines: scratch_path */

static char dir[64];

static int setup_dir(void **state)
{
    (void)state;
    scratch_path(dir, sizeof dir, "zo_test_ft.XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Run a command, its stdout and stderr into out; returns the exit status. */
static int run_cmd(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A small LLaMA (vocab 1024: the shipped tokenizers), some text, held-out
 * text and prompt/completion pairs in dir. */
static void write_inputs(void)
{
    char path[160];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 32, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 64, "
               "\"vocab_size\": 1024, \"max_position_embeddings\": 128}\n");
    fclose(f);
    static const char *words[] = {"the", "runtime", "streams", "weights", "to", "device", "memory", "and",
                                  "offloads", "optimizer", "state", "NVMe", "planner", "sizes", "model", "GPU"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s.txt", dir, k ? "eval" : "train");
        f = fopen(path, "w");
        assert_non_null(f);
        unsigned x = k ? 7 : 1;
        for (int i = 0; i < (k ? 300 : 1500); i++) {
            x = x * 1103515245u + 12345u;
            fprintf(f, "%s%s", words[(x >> 16) % 16], (x >> 8) % 7 ? " " : ".\n");
        }
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/pairs.jsonl", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 64; i++)
        fprintf(f, "{\"prompt\": \"Where do %s live?\", \"completion\": \" on the %s.\"}\n", words[i % 16],
                words[(i * 5 + 3) % 16]);
    fclose(f);
}

/* The "step K loss X lr Y" and "eval step K loss X" lines of train's output. */
typedef struct run_out {
    int n;
    long step[64];
    char loss[64][32], lr[64][32];
    int n_eval;
    long eval_step[64];
    double eval_loss[64], eval_ppl[64];
} run_out;

static void parse_run(const char *output, run_out *r)
{
    memset(r, 0, sizeof *r);
    char *text = strdup(output), *save;
    assert_non_null(text);
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        long k;
        char l[32], lr[32];
        double el, ep;
        if (sscanf(line, "step %ld loss %31s lr %31s", &k, l, lr) == 3 && r->n < 64) {
            r->step[r->n] = k;
            snprintf(r->loss[r->n], 32, "%s", l);
            snprintf(r->lr[r->n], 32, "%s", lr);
            r->n++;
        } else if (sscanf(line, "eval step %ld loss %lf ppl %lf", &k, &el, &ep) == 3 && r->n_eval < 64) {
            r->eval_step[r->n_eval] = k;
            r->eval_loss[r->n_eval] = el;
            r->eval_ppl[r->n_eval] = ep;
            r->n_eval++;
        }
    }
    free(text);
}

static char out[1 << 18];

/* train with the common flags and `extra`; exit status 0 expected. */
static void train(const char *extra, run_out *r)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s --model %s/config.json --tokenizer %s/tokenizer/small-bpe.json --data %s/train.txt "
             "--micro-batch 2 --seq 32 --threads 2 %s 2>&1",
             ZO_TRAIN_BIN, dir, ZO_FIXTURES_DIR, dir, extra);
    int rc = run_cmd(cmd, out, sizeof out);
    if (rc != 0) fail_msg("train exited %d:\n%s", rc, out);
    parse_run(out, r);
}

/* ---- a Hugging Face model folder ------------------------------------------------------------ */

/* --model DIR (issue 27): a Hugging Face folder (config.json, tokenizer.json,
 * model.safetensors) gives train its config, weights and tokenizer, and the
 * model its name: the losses are those of the same files named one by one,
 * the report, the plot and the adapter's base_model_name_or_path say
 * "Tiny-Llama-1k", and memplan estimate and plan size the folder. */
static void test_model_dir(void **state)
{
    (void)state;
    char cmd[4096], md[160];
    write_inputs();
    snprintf(md, sizeof md, "%s/Tiny-Llama-1k", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/ && cp %s/tokenizer/small-bpe.json %s/tokenizer.json",
             md, dir, md, ZO_FIXTURES_DIR, md);
    assert_int_equal(system(cmd), 0);
    run_out one, folder;
    /* a full fine-tune saved as a Hugging Face folder; its weights file
     * copied into the model folder */
    snprintf(cmd, sizeof cmd, "--steps 1 --save %s/full", dir);
    train(cmd, &one);
    snprintf(cmd, sizeof cmd, "cp %s/full/model.safetensors %s/", dir, md);
    assert_int_equal(system(cmd), 0);
    /* the files one by one, then the folder */
    snprintf(cmd, sizeof cmd, "--steps 3 --weights %s/model.safetensors --lora 4 --save %s/ad1", md, dir);
    train(cmd, &one);
    snprintf(cmd, sizeof cmd,
             "%s --model %s/ --data %s/train.txt --micro-batch 2 --seq 32 --threads 2 --steps 3 --lora 4 "
             "--save %s/ad2 --log %s/run.jsonl --plot %s/run.svg 2>&1",
             ZO_TRAIN_BIN, md, dir, dir, dir, dir);
    int rc = run_cmd(cmd, out, sizeof out);
    if (rc) fail_msg("train exited %d:\n%s", rc, out);
    parse_run(out, &folder);
    assert_int_equal(folder.n, 3);
    for (int k = 0; k < 3; k++) assert_string_equal(folder.loss[k], one.loss[k]);
    assert_non_null(strstr(out, "Tiny-Llama-1k"));
    assert_non_null(strstr(out, "tokenizer.json"));
    char path[256];
    snprintf(path, sizeof path, "%s/ad2/adapter_config.json", dir);
    cJSON *cfg = NULL;
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char text[1 << 16];
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    cfg = cJSON_Parse(text);
    assert_non_null(cfg);
    assert_string_equal(cJSON_GetObjectItem(cfg, "base_model_name_or_path")->valuestring, "Tiny-Llama-1k");
    cJSON_Delete(cfg);
    snprintf(path, sizeof path, "%s/run.svg", dir);
    f = fopen(path, "r");
    assert_non_null(f);
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    assert_non_null(strstr(text, "Tiny-Llama-1k"));
    /* memplan: the folder as --model */
    const char *cmds[] = {"estimate", "plan --gpu rtx-4090"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s %s --model %s --seq 32 2>&1", ZO_MEMPLAN_BIN, cmds[i], md);
        rc = run_cmd(cmd, out, sizeof out);
        if (rc || !strstr(out, "Tiny-Llama-1k")) fail_msg("%s: exit %d\n%s", cmd, rc, out);
    }
}

/* ---- schedules --------------------------------------------------------------------------- */

/* The closed form, written out again. */
static double closed_form(int kind, double lr, double min_lr, long warmup, long steps, long k)
{
    if (k < warmup) return lr * (double)(k + 1) / (double)warmup;
    if (kind == FT_LR_CONSTANT) return lr;
    double p = steps > warmup ? (double)(k - warmup) / (double)(steps - warmup) : 1.0;
    p = p > 1 ? 1 : p;
    if (kind == FT_LR_LINEAR) return lr - (lr - min_lr) * p;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(3.14159265358979323846 * p));
}

static void test_schedules(void **state)
{
    (void)state;
    static const struct {
        int kind;
        double lr, min_lr;
        long warmup, steps;
    } cases[] = {
        {FT_LR_CONSTANT, 3e-4, 0, 0, 10},  {FT_LR_CONSTANT, 3e-4, 0, 4, 10}, {FT_LR_COSINE, 1e-3, 1e-5, 0, 10},
        {FT_LR_COSINE, 1e-3, 1e-4, 3, 20}, {FT_LR_LINEAR, 2e-3, 0, 5, 17},   {FT_LR_LINEAR, 2e-3, 1e-4, 0, 1},
        {FT_LR_COSINE, 1e-3, 0, 30, 20},   /* warmup longer than the schedule */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ft_schedule s = {.kind = (ft_schedule_kind)cases[i].kind, .lr = cases[i].lr, .min_lr = cases[i].min_lr,
                         .warmup = cases[i].warmup, .steps = cases[i].steps};
        for (long k = 0; k < cases[i].steps + 5; k++) {
            double want = closed_form(cases[i].kind, cases[i].lr, cases[i].min_lr, cases[i].warmup,
                                      cases[i].steps, k);
            if (fabs(ft_lr_at(&s, k) - want) > 1e-15 * cases[i].lr)
                fail_msg("case %zu step %ld: %.17g, closed form %.17g", i, k, ft_lr_at(&s, k), want);
        }
        /* warmup ends at the peak; a decay ends at the floor */
        if (cases[i].warmup && cases[i].warmup <= cases[i].steps)
            assert_true(fabs(ft_lr_at(&s, cases[i].warmup - 1) - cases[i].lr) < 1e-18);
        if (cases[i].kind != FT_LR_CONSTANT && cases[i].warmup <= cases[i].steps)
            assert_true(fabs(ft_lr_at(&s, cases[i].steps) - cases[i].min_lr) < 1e-15);
    }
    ft_schedule_kind k;
    assert_int_equal(ft_schedule_parse("cosine", "--lr-schedule", &k), ZO_OK);
    assert_int_equal(k, FT_LR_COSINE);
    assert_int_equal(ft_schedule_parse("step", "--lr-schedule", &k), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "--lr-schedule step"));
}

/* Every step's lr (from the log, %.9g) is the closed form; resumed runs
 * print the lines of the uninterrupted one. */
static void test_train_schedule_resume(void **state)
{
    (void)state;
    write_inputs();
    const char *sched = "--lr 3e-3 --lr-schedule cosine --warmup 3 --min-lr 3e-4";
    char extra[1024], log[160];
    snprintf(log, sizeof log, "%s/full.jsonl", dir);
    snprintf(extra, sizeof extra, "%s --steps 8 --log %s", sched, log);
    run_out full, a, b, c;
    train(extra, &full);
    assert_int_equal(full.n, 8);
    ft_record *recs;
    size_t n;
    assert_int_equal(ft_log_read(log, &recs, &n), ZO_OK);
    assert_int_equal(n, 8);
    for (size_t i = 0; i < n; i++) {
        double want = closed_form(FT_LR_COSINE, 3e-3, 3e-4, 3, 8, (long)i);
        assert_int_equal(recs[i].step, (long)i + 1); /* counted from 1 */
        if (fabs(recs[i].lr - want) > 1e-8 * want) fail_msg("step %zu: lr %.9g, closed form %.9g", i, recs[i].lr, want);
        if (fabs(strtod(full.lr[i], NULL) - want) > 1e-5 * want) fail_msg("step %zu: printed lr %s", i, full.lr[i]);
    }
    free(recs);

    /* stop after step 2 (mid-warmup), resume to step 5 (mid-decay), resume to the end */
    snprintf(extra, sizeof extra, "%s --steps 2 --schedule-steps 8 --ckpt %s/ck", sched, dir);
    train(extra, &a);
    /* the checkpoint is labelled as the step line before it: steps counted the same way */
    assert_int_equal(a.n, 2);
    assert_int_equal(a.step[a.n - 1], 2);
    char label[256];
    snprintf(label, sizeof label, "step 2 loss %s", a.loss[1]);
    const char *last = strstr(out, label), *ck = strstr(out, "# checkpoint ");
    assert_non_null(last);
    assert_non_null(ck);
    assert_true(ck > last);
    assert_true(!strncmp(strchr(ck, '\n') - 7, " step 2", 7));
    snprintf(extra, sizeof extra, "%s --steps 5 --schedule-steps 8 --resume %s/ck --ckpt %s/ck", sched, dir, dir);
    train(extra, &b);
    assert_non_null(strstr(out, "resumed"));
    snprintf(extra, sizeof extra, "%s --steps 8 --resume %s/ck --ckpt %s/ck", sched, dir, dir);
    train(extra, &c);
    assert_int_equal(a.n + b.n + c.n, 8);
    run_out *parts[3] = {&a, &b, &c};
    int k = 0;
    for (int p = 0; p < 3; p++)
        for (int i = 0; i < parts[p]->n; i++, k++) {
            assert_int_equal(parts[p]->step[i], full.step[k]);
            if (strcmp(parts[p]->loss[i], full.loss[k]) || strcmp(parts[p]->lr[i], full.lr[k]))
                fail_msg("step %d: resumed loss %s lr %s, uninterrupted loss %s lr %s", k, parts[p]->loss[i],
                         parts[p]->lr[i], full.loss[k], full.lr[k]);
        }
    /* a resume with nothing left to train says so, trains nothing and ends well;
     * so does one whose checkpoint is past --steps */
    const char *steps[] = {"8", "6"};
    for (int i = 0; i < 2; i++) {
        snprintf(extra, sizeof extra, "%s --steps %s --schedule-steps 8 --resume %s/ck", sched, steps[i], dir);
        train(extra, &c);
        assert_int_equal(c.n, 0);
        char want[128];
        snprintf(want, sizeof want, "# nothing left to train: %s/ck is at step 8 of --steps %s\n", dir, steps[i]);
        if (!strstr(out, want)) fail_msg("no \"%s\" in:\n%s", want, out);
    }
    /* bad flags */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --model %s/config.json --data %s/train.txt --text --lr 1e-3 --min-lr 1e-2 2>&1",
             ZO_TRAIN_BIN, dir, dir);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--min-lr"));
    snprintf(cmd, sizeof cmd, "%s --model %s/config.json --data %s/train.txt --text --lr-schedule exp 2>&1",
             ZO_TRAIN_BIN, dir, dir);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--lr-schedule exp"));
}

/* ---- evaluation, the log, the picture ------------------------------------------------------- */

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

static void test_eval_log_plot(void **state)
{
    (void)state;
    write_inputs();
    char extra[1024], log[160], svg[160], svg2[160], cmd[1024];
    snprintf(log, sizeof log, "%s/log.jsonl", dir);
    snprintf(svg, sizeof svg, "%s/train.svg", dir);
    snprintf(svg2, sizeof svg2, "%s/plot.svg", dir);
    snprintf(extra, sizeof extra,
             "--steps 6 --lr 3e-3 --lr-schedule linear --warmup 2 --eval-data %s/eval.txt --eval-every 2 "
             "--eval-batches 3 --log %s --plot %s",
             dir, log, svg);
    run_out r;
    train(extra, &r);
    assert_int_equal(r.n, 6);
    assert_int_equal(r.n_eval, 3); /* after steps 2, 4, 6 (counted from 1, as the checkpoints) */
    for (int i = 0; i < r.n_eval; i++) {
        assert_int_equal(r.eval_step[i], 2 * i + 2);
        assert_true(fabs(r.eval_ppl[i] - exp(r.eval_loss[i])) <= 1e-4 * r.eval_ppl[i]);
    }
    /* the log: every member, eval members on eval steps only */
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char line[1024];
    int lines = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        static const char *members[] = {"step", "loss", "lr", "grad_norm", "tokens_per_s"};
        for (int m = 0; m < 5; m++) assert_true(cJSON_IsNumber(cJSON_GetObjectItem(o, members[m])));
        const cJSON *pk = cJSON_GetObjectItem(o, "peak_bytes");
        assert_true(cJSON_GetObjectItem(pk, "gpu")->valuedouble > 0);
        assert_true(cJSON_GetObjectItem(pk, "cpu")->valuedouble > 0);
        assert_true(cJSON_IsNumber(cJSON_GetObjectItem(pk, "nvme")));
        int step = cJSON_GetObjectItem(o, "step")->valueint;
        assert_int_equal(step, lines + 1);
        assert_int_equal(cJSON_HasObjectItem(o, "eval_loss"), step % 2 == 0);
        if (step % 2 == 0)
            assert_true(fabs(cJSON_GetObjectItem(o, "eval_loss")->valuedouble - r.eval_loss[step / 2 - 1]) < 1e-5);
        cJSON_Delete(o);
        lines++;
    }
    fclose(f);
    assert_int_equal(lines, 6);
    /* the pictures: two panels, three lines, three eval points */
    for (int k = 0; k < 2; k++) {
        if (k) {
            snprintf(cmd, sizeof cmd, "%s %s --out %s 2>&1", ZO_PLOT_BIN, log, svg2);
            assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
        }
        f = fopen(k ? svg2 : svg, "r");
        assert_non_null(f);
        size_t len = fread(out, 1, sizeof out - 1, f);
        out[len] = 0;
        fclose(f);
        assert_non_null(strstr(out, "<svg"));
        assert_non_null(strstr(out, "</svg>"));
        assert_int_equal(count(out, "<polyline"), 3);
        assert_int_equal(count(out, "<circle"), 3);
        assert_non_null(strstr(out, "learning rate"));
    }
    snprintf(cmd, sizeof cmd, "%s %s/missing.jsonl --out %s 2>&1", ZO_PLOT_BIN, dir, svg2);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);

    /* the eval loss is the mean training loss of the same batches with nothing learned:
     * train on the held-out text at lr 0, eval over the first 3 batches */
    snprintf(cmd, sizeof cmd,
             "%s --model %s/config.json --tokenizer %s/tokenizer/small-bpe.json --data %s/eval.txt "
             "--micro-batch 2 --seq 32 --threads 2 --steps 3 --lr 0 --eval-data %s/eval.txt --eval-batches 3 2>&1",
             ZO_TRAIN_BIN, dir, ZO_FIXTURES_DIR, dir, dir);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    parse_run(out, &r);
    assert_int_equal(r.n, 3);
    assert_int_equal(r.n_eval, 1);
    double mean = (strtod(r.loss[0], NULL) + strtod(r.loss[1], NULL) + strtod(r.loss[2], NULL)) / 3;
    printf("  eval loss %.6f, mean training loss at lr 0 %.6f\n", r.eval_loss[0], mean);
    assert_true(fabs(r.eval_loss[0] - mean) < 2e-6 * mean);

    /* flags that need others */
    snprintf(cmd, sizeof cmd, "%s --model %s/config.json --data %s/train.txt --text --eval-every 2 2>&1",
             ZO_TRAIN_BIN, dir, dir);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--eval-data"));
    snprintf(cmd, sizeof cmd, "%s --model %s/config.json --data %s/train.txt --text --tokenizer x.json 2>&1",
             ZO_TRAIN_BIN, dir, dir);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--text"));
}

/* ---- prompt/completion data --------------------------------------------------------------------- */

#define B 2
#define T 8

static const char *masked_dir(void)
{
    const char *d = getenv("ZO_GPU_FIXTURES");
    return d && *d ? d : ZO_FIXTURES_DIR "/gpu";
}

static float *read_tensor(const char *path, const char *name, size_t *n)
{
    model_st_file f;
    assert_int_equal(model_st_open(&f, path), ZO_OK);
    const model_st_tensor *t = model_st_find(&f, name);
    if (!t) fail_msg("%s: no tensor %s", path, name);
    float *v = malloc(t->numel * sizeof(float));
    assert_int_equal(model_st_read(&f, t, v, ZO_DTYPE_F32, 0), ZO_OK);
    if (n) *n = t->numel;
    model_st_close(&f);
    return v;
}

static int close_enough(const char *what, const float *got, const float *want, size_t n, double atol, double rtol)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= atol + rtol * fabs(want[i]))) {
            if (bad < 5) printf("  %s[%zu]: got %.8g want %.8g\n", what, i, got[i], want[i]);
            bad++;
        }
    return bad;
}

/* The model's masked mean loss and every gradient against PyTorch's
 * cross_entropy(ignore_index=-1), within test_transformer's tolerances. */
static void masked_vs_torch(const char *name)
{
    char path[512];
    zo_model_config cfg;
    snprintf(path, sizeof path, "%s/gpu/%s.json", ZO_FIXTURES_DIR, name);
    assert_int_equal(zo_model_config_load(path, &cfg), ZO_OK);
    gpu_device_t dev;
    gpu_stream_t s;
    gpu_cpu_options o = {.n_threads = 2};
    assert_int_equal(gpu_device_init_cpu(&o, &dev), ZO_OK);
    assert_int_equal(gpu_stream_create(dev, &s), ZO_OK);
    tf_model m;
    tf_trainer tr;
    tf_adamw none = {.lr = 0};
    assert_int_equal(tf_init(&m, &cfg, dev, ZO_DTYPE_F32, B, T), ZO_OK);
    assert_int_equal(tf_trainer_init(&tr, &m, &none), ZO_OK);
    snprintf(path, sizeof path, "%s/gpu/%s.safetensors", ZO_FIXTURES_DIR, name);
    assert_int_equal(model_load_path(path, &m.layout, (void *const *)tr.master, ZO_DTYPE_F32, 0, NULL), ZO_OK);
    assert_int_equal(tf_trainer_upload(&tr, s), ZO_OK);
    snprintf(path, sizeof path, "%s/gpu/%s_expected.safetensors", ZO_FIXTURES_DIR, name);
    float *in = read_tensor(path, "inputs", NULL);
    char masked[512];
    snprintf(masked, sizeof masked, "%s/%s_masked.safetensors", masked_dir(), name);
    float *tg = read_tensor(masked, "targets", NULL), *want_loss = read_tensor(masked, "loss", NULL);
    int32_t inputs[B * T], targets[B * T], counted = 0;
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int32_t)in[i];
        targets[i] = (int32_t)tg[i];
        counted += targets[i] >= 0;
    }
    assert_true(counted > 0 && counted < B * T);
    tf_step_info info;
    assert_int_equal(tf_trainer_grads(&tr, s, inputs, targets, B, T, &info), ZO_OK);
    assert_int_equal(m.n_targets, counted);
    assert_int_equal(close_enough("masked loss", &info.loss, want_loss, 1, 1e-5, 1e-5), 0);
    /* every gradient, by name */
    int nb = m.layout.n_blocks, bad = 0;
    float **want = calloc((size_t)nb, sizeof(float *));
    for (int b = 0; b < nb; b++) want[b] = calloc(m.layout.block_numel[b] + 1, sizeof(float));
    assert_int_equal(model_load_path(masked, &m.layout, (void *const *)want, ZO_DTYPE_F32, 0, NULL), ZO_OK);
    for (int i = 0; i < m.layout.n_tensors; i++) {
        const model_tensor *t = &m.layout.tensors[i];
        bad += close_enough(t->name, tr.grad[t->block] + t->offset, want[t->block] + t->offset, t->numel, 1e-5, 1e-3);
    }
    printf("  %s: masked loss %.6f (PyTorch %.6f) over %d of %d targets\n", name, info.loss, want_loss[0], counted,
           B * T);
    assert_int_equal(bad, 0);
    for (int b = 0; b < nb; b++) free(want[b]);
    free(want);
    free(in);
    free(tg);
    free(want_loss);
    tf_trainer_free(&tr);
    tf_free(&m);
    gpu_stream_destroy(s);
    gpu_device_free(dev);
}

static void test_masked_loss_vs_torch(void **state)
{
    (void)state;
    masked_vs_torch("tiny_gpt2");
    masked_vs_torch("tiny_llama");
    masked_vs_torch("tiny_qwen2");
}

/* train on prompt/completion pairs, padded rows, through the SentencePiece tokenizer */
static void test_train_pairs(void **state)
{
    (void)state;
    write_inputs();
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s --model %s/config.json --tokenizer %s/tokenizer/small-sp.json --data %s/pairs.jsonl "
             "--eval-data %s/pairs.jsonl --eval-batches 2 --micro-batch 4 --seq 24 --threads 2 --steps 30 "
             "--lr 1e-2 2>&1",
             ZO_TRAIN_BIN, dir, ZO_FIXTURES_DIR, dir, dir);
    int rc = run_cmd(cmd, out, sizeof out);
    if (rc) fail_msg("train exited %d:\n%s", rc, out);
    assert_non_null(strstr(out, "64 prompt/completion pairs"));
    assert_non_null(strstr(out, "of them completion targets; one record per row"));
    run_out r;
    parse_run(out, &r);
    assert_int_equal(r.n, 30);
    double first = strtod(r.loss[0], NULL), last = 0;
    for (int i = 25; i < 30; i++) last += strtod(r.loss[i], NULL) / 5;
    printf("  pairs: completion loss %.3f -> %.3f, eval %.3f\n", first, last, r.eval_loss[0]);
    assert_true(last < first - 1.0);
    /* packed instead of padded; a malformed record names its line */
    snprintf(cmd, sizeof cmd,
             "%s --model %s/config.json --tokenizer %s/tokenizer/small-sp.json --data %s/pairs.jsonl "
             "--packing stream --micro-batch 2 --seq 24 --threads 2 --steps 2 2>&1",
             ZO_TRAIN_BIN, dir, ZO_FIXTURES_DIR, dir);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    assert_null(strstr(out, "one record per row"));
    char path[160];
    snprintf(path, sizeof path, "%s/pairs.jsonl", dir);
    FILE *f = fopen(path, "a");
    fprintf(f, "{\"prompt\": 3}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "%s --model %s/config.json --tokenizer %s/tokenizer/small-sp.json --data %s/pairs.jsonl --steps 1 2>&1",
             ZO_TRAIN_BIN, dir, ZO_FIXTURES_DIR, dir);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2); /* bad input */
    assert_non_null(strstr(out, "pairs.jsonl:65:"));
}

/* Inputs checked before step 0, and the flags that would fail later:
 * --eps 0; eval data too short for --seq (it was noticed after the last
 * step, losing the run's --save); pairs whose completions --seq cuts off
 * (it trained on nothing at loss 0 and exited 0); an adapter saved with
 * all-linear taken back with all-linear (its resolved list was compared
 * with the word); the plot written through no planted name. */
static void test_inputs_before_step0(void **state)
{
    (void)state;
    write_inputs();
    char cmd[2048], path[200], save[200];
    const char *base = "--model %s/config.json --tokenizer %s/tokenizer/small-bpe.json --data %s/train.txt "
                       "--micro-batch 2 --seq 32 --threads 2";
    char common[600];
    snprintf(common, sizeof common, base, dir, ZO_FIXTURES_DIR, dir);
    snprintf(cmd, sizeof cmd, "%s %s --steps 1 --eps 0 2>&1", ZO_TRAIN_BIN, common);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--eps: 0 must be > 0"));
    /* eval text of a few tokens, shorter than --seq + 1 */
    snprintf(path, sizeof path, "%s/tiny.txt", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "the model.\n");
    fclose(f);
    snprintf(save, sizeof save, "%s/saved.safetensors", dir);
    snprintf(cmd, sizeof cmd, "%s %s --steps 2 --eval-data %s --save %s 2>&1", ZO_TRAIN_BIN, common, path, save);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "tiny.txt"));
    assert_null(strstr(out, "step 1 loss")); /* refused before training */
    /* prompts longer than --seq: no completion token is left to train on */
    snprintf(path, sizeof path, "%s/long.jsonl", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 8; i++)
        fprintf(f, "{\"prompt\": \"the runtime streams weights to device memory and offloads the optimizer "
                   "state to NVMe while the planner sizes the model for the GPU %d\", \"completion\": \" yes.\"}\n", i);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "%s --model %s/config.json --tokenizer %s/tokenizer/small-sp.json --data %s --micro-batch 2 --seq 8 "
             "--threads 2 --steps 1 2>&1",
             ZO_TRAIN_BIN, dir, ZO_FIXTURES_DIR, path);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "cut off by --seq 8"));
    /* an adapter saved with all-linear, loaded back with all-linear */
    snprintf(save, sizeof save, "%s/adapter", dir);
    snprintf(cmd, sizeof cmd, "%s %s --steps 1 --lora 2 --lora-targets all-linear --save %s 2>&1", ZO_TRAIN_BIN,
             common, save);
    int rc = run_cmd(cmd, out, sizeof out);
    if (rc) fail_msg("train exited %d:\n%s", rc, out);
    snprintf(cmd, sizeof cmd, "%s %s --steps 1 --lora 2 --lora-targets all-linear --adapter %s 2>&1", ZO_TRAIN_BIN,
             common, save);
    rc = run_cmd(cmd, out, sizeof out);
    if (rc) fail_msg("train exited %d:\n%s", rc, out);
}

/* The plot is written whole through a temporary no other process can plant:
 * a link at the old name (<path>.tmp.<pid>) is not followed. */
static void test_plot_no_follow(void **state)
{
    (void)state;
    char path[200], planted[240], victim[200];
    snprintf(path, sizeof path, "%s/plot.svg", dir);
    snprintf(victim, sizeof victim, "%s/victim.txt", dir);
    snprintf(planted, sizeof planted, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(victim, "w");
    assert_non_null(f);
    fputs("precious", f);
    fclose(f);
    assert_int_equal(symlink(victim, planted), 0);
    ft_record r[2] = {{.step = 0, .loss = 5.0, .lr = 1e-3}, {.step = 1, .loss = 4.0, .lr = 1e-3}};
    assert_int_equal(ft_plot_write(path, r, 2, "plot"), ZO_OK);
    char buf[32] = {0};
    f = fopen(victim, "r");
    assert_non_null(f);
    assert_true(fread(buf, 1, sizeof buf - 1, f) > 0);
    fclose(f);
    assert_string_equal(buf, "precious");
    char svg[512] = {0};
    f = fopen(path, "r");
    assert_non_null(f);
    assert_true(fread(svg, 1, sizeof svg - 1, f) > 0);
    fclose(f);
    assert_non_null(strstr(svg, "<svg")); /* the plot landed at its own name */
}

/* ---- the conventions fine-tuners expect -------------------------------------------------- */

/* The line of `out` that starts with `prefix` (NULL when none). */
static const char *line_of(const char *out, const char *prefix)
{
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, prefix, strlen(prefix))) return p;
    return NULL;
}

/* train's header names its AdamW settings and its dtype, and they are what
 * runs: the defaults are the Hugging Face Trainer's (betas 0.9/0.999, eps
 * 1e-8, no weight decay, so none on LoRA adapters; clip 1) and the same
 * losses come out with them given as flags; the dtype is memplan's default
 * (its estimate's "<dtype> weights"). */
static void test_conventions(void **state)
{
    (void)state;
    write_inputs();
    run_out d, e;
    train("--steps 3", &d);
    const char *adamw = line_of(out, "# adamw:"), *head = line_of(out, "# train:");
    assert_non_null(adamw);
    assert_non_null(head);
    const char *hf = "# adamw: lr 0.0003, betas 0.9/0.999, eps 1e-08, weight decay 0 on 2-D weights, clip 1 "
                     "(Hugging Face Trainer's defaults)\n";
    if (strncmp(adamw, hf, strlen(hf))) fail_msg("want %s got %.*s", hf, (int)strcspn(adamw, "\n"), adamw);
    char memplan_out[1 << 14], args[256], dtype[16] = "", want[64];
    snprintf(args, sizeof args, "estimate --model %s/config.json", dir);
    assert_int_equal(run_memplan(args, memplan_out, sizeof memplan_out), 0);
    const char *w = strstr(memplan_out, " weights, ");
    assert_non_null(w);
    const char *sp = w;
    while (sp > memplan_out && sp[-1] != ' ') sp--;
    snprintf(dtype, sizeof dtype, "%.*s", (int)(w - sp), sp);
    snprintf(want, sizeof want, "; dtype %s (the default, memplan's);", dtype);
    printf("  memplan's default: %s weights; train's header: %.*s\n", dtype, (int)strcspn(head, "\n"), head);
    assert_true(strstr(head, want) && strstr(head, want) < strchr(head, '\n'));
    /* the same run with every default given as a flag */
    train("--steps 3 --beta1 0.9 --beta2 0.999 --eps 1e-8 --weight-decay 0 --clip 1 --dtype bf16", &e);
    assert_int_equal(d.n, 3);
    assert_int_equal(e.n, 3);
    for (int i = 0; i < 3; i++) assert_string_equal(d.loss[i], e.loss[i]);
    assert_non_null(line_of(out, "# train:"));
    assert_non_null(strstr(line_of(out, "# train:"), "dtype bf16 (--dtype)"));
    /* a flag that changes them says so, and changes the run */
    train("--steps 3 --beta2 0.95 --weight-decay 0.1", &e);
    assert_non_null(strstr(line_of(out, "# adamw:"), "betas 0.9/0.95, eps 1e-08, weight decay 0.1 on 2-D weights, "
                                                     "clip 1 (set by flags)"));
    assert_true(strcmp(d.loss[2], e.loss[2]) != 0);
    /* LoRA: no decay on the adapters */
    train("--steps 2 --lora 2", &e);
    assert_non_null(strstr(line_of(out, "# adamw:"), "weight decay 0 on the adapters' 2-D weights"));
}

/* A small Mixtral (vocab 1024, as write_inputs' LLaMA) as dir/config.json:
 * 2 layers of 4 experts, 2 a token. */
static void write_mixtral(void)
{
    char path[160];
    snprintf(path, sizeof path, "%s/config.json", dir);
    files_write_text(path, "{\"model_type\": \"mixtral\", \"num_hidden_layers\": 2, \"hidden_size\": 32, "
                           "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 24, "
                           "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"vocab_size\": 1024, "
                           "\"max_position_embeddings\": 128}\n");
}

/* Before its header, train prints a line per phase of its start-up, in the
 * order they run, each with its seconds, the runtime's parts by name, the
 * last the whole, which is at least the phases' sum (each rounded to 0.01 s). */
static void check_start_lines(const char *head)
{
    static const char *const phases[] = {
        "# start: inputs read in ", "# start: device cpu opened in ", "# start: model in ",
        "# start: runtime's weights in ", "# start: runtime's optimizer state in ", "# start: runtime's optimizer in ",
        "# start: runtime's gradients in ", "# start: runtime's streaming in ", "# start: initial weights ",
        "# start: ready in "};
    const int n = (int)(sizeof phases / sizeof *phases);
    const char *at = out;
    double sum = 0, secs = -1;
    for (int i = 0; i < n; i++) {
        const char *l = line_of(at, phases[i]);
        if (!l || l > head) fail_msg("no \"%s\" line before the header, after the one before it:\n%s", phases[i], out);
        const char *in = strstr(l, " in ");
        assert_true(in && in < strchr(l, '\n') && sscanf(in, " in %lf s", &secs) == 1 && secs >= 0);
        if (i < n - 1) sum += secs;
        at = strchr(l, '\n') + 1;
    }
    if (secs + 0.06 < sum) fail_msg("ready in %.2f s, the phases' sum %.2f s:\n%s", secs, sum, out);
}

/* train's header names the model's family, the config's model_type: a
 * Mixtral is "mixtral", not the LLaMA layers it is built of; the start-up's
 * lines come before it. */
static void test_header_family(void **state)
{
    (void)state;
    write_inputs();
    run_out r;
    train("--steps 1", &r);
    const char *head = line_of(out, "# train:");
    assert_non_null(head);
    assert_true(strstr(head, " (llama), ") && strstr(head, " (llama), ") < strchr(head, '\n'));
    check_start_lines(head);
    write_mixtral();
    train("--steps 1", &r);
    head = line_of(out, "# train:");
    assert_non_null(head);
    printf("  %.*s\n", (int)strcspn(head, "\n"), head);
    assert_true(strstr(head, " (mixtral), ") && strstr(head, " (mixtral), ") < strchr(head, '\n'));
}

/* An evaluation routes with the capacity factor and its dropped pairs are
 * counted apart from the steps': the Mixtral trained at lr 0 on the
 * held-out text (3 steps of one micro-batch, weights unchanged) and then
 * evaluated on its 3 first batches routes the same pairs. By hand: a batch
 * of 2 x 32 tokens chooses 64 x 2 pairs in each of 2 layers, 768 in 3
 * batches; at F 0.5 an expert keeps C = ceil(0.5 x 64 x 2 / 4) = 16, at
 * most 4 x 16 of a layer's 128, so at least 3 x 2 x 64 = 384 drop. The
 * eval line says the share; dropless, it says nothing and none drop. */
static void test_eval_moe_drops(void **state)
{
    (void)state;
    write_inputs();
    write_mixtral();
    const char *factor[2] = {"0", "0.5"};
    for (int k = 0; k < 2; k++) {
        char cmd[2048], stats[160];
        snprintf(stats, sizeof stats, "%s/stats-%d.json", dir, k);
        snprintf(cmd, sizeof cmd,
                 "%s --model %s/config.json --tokenizer %s/tokenizer/small-bpe.json --data %s/eval.txt "
                 "--micro-batch 2 --seq 32 --threads 2 --steps 3 --lr 0 --eval-data %s/eval.txt --eval-batches 3 "
                 "--capacity-factor %s --stats-json %s 2>&1",
                 ZO_TRAIN_BIN, dir, ZO_FIXTURES_DIR, dir, dir, factor[k], stats);
        int rc = run_cmd(cmd, out, sizeof out);
        if (rc) fail_msg("train exited %d:\n%s", rc, out);
        const char *ev = line_of(out, "eval step 3 ");
        assert_non_null(ev);
        char line[256];
        snprintf(line, sizeof line, "%.*s", (int)strcspn(ev, "\n"), ev);
        printf("  --capacity-factor %s: %s\n", factor[k], line);
        char *text = files_read_text(stats);
        assert_non_null(text);
        cJSON *doc = cJSON_Parse(text);
        free(text);
        double pairs = run_json_num(doc, "moe", "pairs"), dropped = run_json_num(doc, "moe", "dropped");
        double epairs = run_json_num(doc, "moe", "eval_pairs"), edropped = run_json_num(doc, "moe", "eval_dropped");
        cJSON_Delete(doc);
        assert_true(pairs == 768 && epairs == 768);
        assert_true(edropped == dropped);
        const char *d = strstr(line, " dropped ");
        if (!k) {
            assert_true(edropped == 0);
            assert_null(d);
            continue;
        }
        assert_true(edropped >= 384);
        assert_non_null(d);
        char want[64];
        snprintf(want, sizeof want, " dropped %.2f%%", 100.0 * edropped / epairs);
        assert_string_equal(d, want);
    }
}

/* The time line's parts (the runtime's, and "other": the host's own work)
 * add up to its total, the training's wall time, in every schedule and
 * with the optimizer's state half on NVMe; the optimizer thread's time is
 * a line of its own. */
static void test_time_line(void **state)
{
    (void)state;
    write_inputs();
    char extra[512];
    snprintf(extra, sizeof extra, "--params-on cpu --optimizer-on cpu=0.5,nvme=0.5 --nvme-dir %s", dir);
    const char *cases[] = {"", "--schedule overlap", "--schedule dpu", extra, "--lora 2 --schedule overlap"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[768];
        run_out r;
        snprintf(args, sizeof args, "--steps 4 %s", cases[i]);
        train(args, &r);
        const char *t = line_of(out, "# time:");
        assert_non_null(t);
        double sum = 0, total = -1;
        int n = 0;
        const char *p = t + 7, *end = strchr(t, '\n');
        while (p < end) {
            char name[32];
            double v;
            int used;
            if (sscanf(p, " %31[a-z] %lfs,%n", name, &v, &used) == 2) {
                assert_true(v >= 0); /* "other" included: no part counted twice */
                sum += v;
                n++;
                p += used;
            } else if (sscanf(p, " = total %lfs%n", &total, &used) == 1) {
                p += used;
            } else {
                fail_msg("cannot read the time line: %.*s", (int)(end - t), t);
            }
        }
        printf("  %-60s %.*s\n", cases[i], (int)(end - t), t);
        assert_int_equal(n, 7); /* compute, weights, grads, optimizer, disk, comm, other */
        assert_true(total > 0);
        assert_true(fabs(sum - total) <= 0.0005 * (n + 1)); /* each printed to the millisecond */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedules),
        cmocka_unit_test_setup_teardown(test_train_schedule_resume, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_eval_log_plot, setup_dir, teardown_dir),
        cmocka_unit_test(test_masked_loss_vs_torch),
        cmocka_unit_test_setup_teardown(test_train_pairs, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_inputs_before_step0, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_plot_no_follow, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_conventions, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_time_line, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_model_dir, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_header_family, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_eval_moe_drops, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
