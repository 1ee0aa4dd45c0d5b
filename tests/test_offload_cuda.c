/* The offload runtime on CUDA against the CPU backend: a tiny LLaMA (bf16)
 * and a tiny GPT-2 (fp16, tied head, dynamic loss scale) train 10 steps with
 * the weights streamed from pinned host memory (prefetch 2), the optimizer
 * on the CPU and activation checkpoints in host memory, under a device
 * memory cap smaller than the weights. The losses must match the CPU
 * backend's within the tolerance of the storage dtype, the device
 * high-water mark must stay under the cap, and on the device under test the
 * data path must not change a bit (prefetch 0 against prefetch 2: a missing
 * event wait would show as a difference), nor recompute by op against full
 * recompute (the same kernels on the same inputs). With bf16 and 8-bit m
 * and v in the optimizer's device share the losses must match the CPU
 * backend's too. A short `train --device cuda` run must match
 * `train --device cpu` the same way, for a LLaMA and for a Mixtral whose
 * routed experts stream to the device apart.
 *
 * Exits 77 where no CUDA device is present (or the build has no CUDA);
 * ZO_OFFLOAD_BACKEND=cpu runs the device-under-test side on a second CPU
 * device instead (a check of the test itself, registered as
 * test_offload_cuda_selfcheck). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/units.h"         /* defines: zo_format_bytes */
#include "gpu/device.h"           /* defines: gpu_device_open, gpu_cuda_device_count */
#include "offload/offload.h"      /* defines: offload_init, offload_micro_batch, offload_step */
#include "transformer/offload_model.h" /* defines: tf_offload_model, tf_model */
#include "tests/support/files.h"       /* defines: files_remove_tree, files_write_sample_text */
#include "tests/support/models.h"      /* defines: tiny_model */
#include "tests/support/run.h"         /* defines: run_capture */
#include "tests/support/scratch.h" /* defines: scratch_path */

#define THREADS 2
#define STEPS 10
#define B 2
#define T 32

static const char *backend = "cuda"; /* the device under test */

/* ---- the models and their data ------------------------------------------------- */

/* Micro-batch k: rows of mostly-incrementing ids (the loss falls). */
static void make_batch(int vocab, int64_t k, int32_t *in, int32_t *tg)
{
    for (int r = 0; r < B; r++) {
        uint64_t s = (uint64_t)(k * B + r + 1) * 0x9e3779b97f4a7c15ull;
        int32_t prev = (int32_t)((s >> 40) % (uint64_t)vocab);
        for (int j = 0; j <= T; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int32_t id = ((s >> 33) % 4) ? (prev + 1) % vocab : (int32_t)((s >> 20) % (uint64_t)vocab);
            if (j < T) in[r * T + j] = id;
            if (j > 0) tg[r * T + j - 1] = id;
            prev = id;
        }
    }
}

/* ---- one run of the runtime on one device ---------------------------------------- */

typedef struct run {
    const char *device;   /* "cpu" (the reference, THREADS per op) or the device under test */
    zo_model_config cfg;
    zo_dtype dt;
    size_t capacity;      /* --device-mem */
    int prefetch;
    int ops;              /* recompute by op, checkpoints on the device (else full, in host memory) */
    double opt_dev;       /* the optimizer's share on the device (the rest in host memory) */
    zo_plan_opt_state state; /* its m and v: fp32, bf16, 8-bit */
    zo_plan_master master;   /* fp32, or bf16 weights updated without one */
    float lr;                /* AdamW's; 0: 1e-3 */
    /* out */
    float loss[STEPS];
    offload_step_info info[STEPS];
    offload_stats stats;
} run;

/* Streamed weights, optimizer in memory, checkpoints in host memory with
 * recompute: the configuration whose device footprint is below the weights. */
static void streamed_config(offload_config *c, int prefetch)
{
    offload_config_defaults(c);
    c->adam = (offload_adamw){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                              .weight_decay = 0.1f, .clip = 1.0f};
    c->n_threads = THREADS;
    c->sub_group = 4096;
    c->params_on = OFFLOAD_CPU;
    c->opt_frac[OFFLOAD_CPU] = 1.0;
    c->prefetch_depth = prefetch;
    c->recompute = 1;
    c->checkpoints_on = OFFLOAD_CPU;
    /* fp16: a scale well below overflow, so that no step's skip hangs on the
     * last bit of a gradient (the skip flags are compared) */
    c->loss_scale = 4096.0f;
}

static void open_device(const char *name, size_t capacity, gpu_device_t *dev)
{
    zo_status st;
    if (!strcmp(name, "cpu")) {
        gpu_cpu_options o = {.capacity = capacity, .n_threads = THREADS};
        st = gpu_device_init_cpu(&o, dev);
    } else {
        st = gpu_device_open(name, capacity, dev);
    }
    if (st != ZO_OK) fprintf(stderr, "open %s: %s\n", name, zo_last_error());
    assert_int_equal(st, ZO_OK);
}

static void do_run(run *r)
{
    gpu_device_t dev;
    gpu_stream_t s;
    open_device(r->device, r->capacity, &dev);
    assert_int_equal(gpu_stream_create(dev, &s), ZO_OK);
    offload_config oc;
    streamed_config(&oc, r->prefetch);
    if (r->lr > 0) oc.adam.lr = r->lr;
    if (r->ops) {
        oc.recompute = OFFLOAD_RECOMPUTE_OPS;
        oc.checkpoints_on = OFFLOAD_DEVICE;
    }
    oc.opt_frac[OFFLOAD_DEVICE] = r->opt_dev;
    oc.opt_frac[OFFLOAD_CPU] = 1.0 - r->opt_dev;
    oc.opt_state = r->state;
    oc.master = r->master;
    tf_model m;
    tf_options to = {.recompute = oc.recompute, .external_res = 1};
    zo_status st = tf_init_opts(&m, &r->cfg, dev, r->dt, B, T, &to);
    if (st != ZO_OK) fprintf(stderr, "tf_init (%s): %s\n", r->device, zo_last_error());
    assert_int_equal(st, ZO_OK);
    tf_offload_model tm;
    assert_int_equal(tf_offload_model_init(&tm, &m), ZO_OK);
    offload_t *rt = NULL;
    st = offload_init(&rt, dev, &tm.om, &oc);
    if (st != ZO_OK) fprintf(stderr, "offload_init (%s): %s\n", r->device, zo_last_error());
    assert_int_equal(st, ZO_OK);

    const model_layout *l = &m.layout;
    float **w = calloc((size_t)l->n_blocks, sizeof(float *));
    assert_non_null(w);
    for (int b = 0; b < l->n_blocks; b++) assert_non_null(w[b] = calloc(l->block_numel[b] + 1, sizeof(float)));
    tf_init_weights(l, w, 1234);
    assert_int_equal(offload_set_weights(rt, (const float *const *)w), ZO_OK);
    for (int b = 0; b < l->n_blocks; b++) free(w[b]);
    free(w);

    int32_t in[B * T], tg[B * T];
    for (int k = 0; k < STEPS; k++) {
        make_batch(r->cfg.vocab, 0, in, tg); /* one batch, memorized: a smooth fall */
        assert_int_equal(tf_set_batch(&m, s, in, tg, B, T), ZO_OK);
        st = offload_micro_batch(rt, s);
        if (st != ZO_OK) fprintf(stderr, "micro-batch %d (%s): %s\n", k, r->device, zo_last_error());
        assert_int_equal(st, ZO_OK);
        assert_int_equal(tf_loss(&m, s, &r->loss[k]), ZO_OK);
        st = offload_step(rt, &r->info[k]);
        if (st != ZO_OK) fprintf(stderr, "step %d (%s): %s\n", k, r->device, zo_last_error());
        assert_int_equal(st, ZO_OK);
    }
    offload_get_stats(rt, &r->stats);
    offload_free(rt);
    tf_offload_model_free(&tm);
    tf_free(&m);
    gpu_stream_destroy(s);
    gpu_mem_stats ms;
    gpu_mem_get_stats(dev, &ms);
    assert_int_equal(ms.n_allocs, 0); /* everything given back */
    gpu_device_free(dev);
}

static void print_losses(const char *name, const run *r)
{
    printf("  %-26s", name);
    for (int k = 0; k < STEPS; k++) printf(" %.5f", r->loss[k]);
    printf("\n");
}

/* Relative loss tolerance of a 10-step run against the CPU backend: fp32 runs
 * TF32 GEMMs on CUDA (10-bit mantissa); with 16-bit storage each stored
 * activation may round to the other side of a tie, and the difference grows
 * a little with every update (the model parity test's figures). */
static double loss_rtol(zo_dtype dt)
{
    return dt == ZO_DTYPE_F32 ? 5e-3 : dt == ZO_DTYPE_BF16 ? 6e-2 : 1.5e-2;
}

/* ---- the runtime: losses, high-water mark, bit-stable data path -------------------- */

static void check_model(const char *name, zo_model_config cfg, zo_dtype dt, float lr)
{
    uint64_t weights = zo_model_params(&cfg) * zo_dtype_size(dt);
    run ref = {.device = "cpu", .cfg = cfg, .dt = dt, .capacity = (size_t)(weights * 2 / 3), .prefetch = 2,
               .lr = lr};
    run dut = ref, dut0 = ref;
    dut.device = dut0.device = backend;
    dut0.prefetch = 0;
    do_run(&ref);
    do_run(&dut);
    do_run(&dut0);
    char a[32], b[32], c[32], d[32];
    printf("  %s %s: weights %s, --device-mem %s, device peak %s on cpu, %s on %s\n", name,
           zo_dtype_name(dt), zo_format_bytes(weights, a, sizeof a), zo_format_bytes(ref.capacity, b, sizeof b),
           zo_format_bytes(ref.stats.peak[OFFLOAD_DEVICE], c, sizeof c),
           zo_format_bytes(dut.stats.peak[OFFLOAD_DEVICE], d, sizeof d), backend);
    print_losses("cpu, prefetch 2", &ref);
    print_losses("device, prefetch 2", &dut);
    print_losses("device, prefetch 0", &dut0);

    /* the cap is real: the weights alone would not fit resident */
    assert_true(weights > ref.capacity);
    assert_int_equal(dut.stats.device_capacity, ref.capacity);
    assert_true(dut.stats.peak[OFFLOAD_DEVICE] > 0);
    assert_true(dut.stats.peak[OFFLOAD_DEVICE] <= ref.capacity);
    assert_true(dut0.stats.peak[OFFLOAD_DEVICE] <= ref.capacity);
    assert_true(dut.stats.n_slots == 3 && dut0.stats.n_slots <= 2);
    /* streamed: every micro-batch copied the weights in (forward and backward) */
    assert_true(dut.stats.bytes_h2d >= (uint64_t)STEPS * weights);

    /* the losses of the CPU backend within the dtype's tolerance */
    double rtol = loss_rtol(dt);
    int bad = 0;
    for (int k = 0; k < STEPS; k++) {
        double d = fabs((double)dut.loss[k] - ref.loss[k]);
        /* the first forward uses the same weights: a third of the tolerance */
        double tol = (k == 0 ? rtol / 3 : rtol) * fabs(ref.loss[k]);
        if (!(d <= tol) || !isfinite(dut.loss[k])) {
            printf("  step %d: loss %.7g on %s, %.7g on cpu (|d| %.3g > %.3g)\n", k, dut.loss[k], backend,
                   ref.loss[k], d, tol);
            bad++;
        }
        if (dut.info[k].skipped != ref.info[k].skipped) {
            printf("  step %d: skipped %d on %s, %d on cpu\n", k, dut.info[k].skipped, backend,
                   ref.info[k].skipped);
            bad++;
        }
    }
    assert_int_equal(bad, 0);
    /* it learns on the device as on the cpu */
    assert_true(dut.loss[STEPS - 1] < dut.loss[0] - 0.1f);

    /* the data path changes no bit on one device */
    for (int k = 0; k < STEPS; k++)
        if (memcmp(&dut.loss[k], &dut0.loss[k], sizeof(float))) {
            printf("  step %d: prefetch 2 loss %.9g, prefetch 0 loss %.9g on %s\n", k, dut.loss[k],
                   dut0.loss[k], backend);
            fail();
        }
    /* recompute by op (its kept outputs on the device: a larger cap) reads
     * the forward's bits: the losses of full recompute, bit for bit */
    run ops = dut;
    ops.ops = 1;
    ops.capacity = (size_t)(weights * 2);
    do_run(&ops);
    print_losses("device, recompute ops", &ops);
    for (int k = 0; k < STEPS; k++)
        if (memcmp(&ops.loss[k], &dut.loss[k], sizeof(float))) {
            printf("  step %d: recompute ops loss %.9g, full %.9g on %s\n", k, ops.loss[k], dut.loss[k],
                   backend);
            fail();
        }
}

static void test_llama_streamed(void **state)
{
    (void)state;
    /* lr 3e-4: at 1e-3 the 12 bf16 layers' loss rose and fell from step to step
     * (5.09, 4.86, 5.10, 4.75, 4.38, 4.50), and on the CPU backend alone
     * OpenBLAS's Haswell kernels instead of this host's moved step 7 by 0.35,
     * more than bf16's tolerance (the H200 run's cpu-vs-cuda 0.294 at step 8 was
     * that); at 3e-4 it falls every step, and three kernel choices stay within
     * 0.005 of each other */
    check_model("llama", tiny_model(ZO_ARCH_LLAMA, 12, 128, 256, T), ZO_DTYPE_BF16, 3e-4f);
}

static void test_gpt2_streamed(void **state)
{
    (void)state;
    check_model("gpt2", tiny_model(ZO_ARCH_GPT, 12, 128, 256, T), ZO_DTYPE_F16, 0);
}

/* bf16 and 8-bit m and v in the optimizer's device share (issue 30,
 * gpu_adam_state_update on the device under test), half the optimizer
 * there and half in host memory, and bf16 weights without an fp32 master
 * (stochastic rounding with bf16 m and v, Kahan with fp32 m and v, the
 * whole optimizer on the device in place): the CPU backend's losses within
 * bf16's tolerance, falling. */
static void test_optimizer_state_on_device(void **state)
{
    (void)state;
    static const struct {
        zo_plan_opt_state state;
        zo_plan_master master;
        double dev;
    } st[4] = {{ZO_PLAN_STATE_BF16, ZO_PLAN_MASTER_FP32, 0.5},
               {ZO_PLAN_STATE_8BIT, ZO_PLAN_MASTER_FP32, 0.5},
               {ZO_PLAN_STATE_BF16, ZO_PLAN_MASTER_STOCHASTIC, 0.5},
               {ZO_PLAN_STATE_FP32, ZO_PLAN_MASTER_KAHAN, 1.0}};
    for (int i = 0; i < 4; i++) {
        run ref = {.device = "cpu", .cfg = tiny_model(ZO_ARCH_LLAMA, 4, 128, 256, T), .dt = ZO_DTYPE_BF16,
                   .prefetch = 2, .opt_dev = st[i].dev, .state = st[i].state, .master = st[i].master};
        run dut = ref;
        dut.device = backend;
        do_run(&ref);
        do_run(&dut);
        char name[96];
        const char *sn = zo_plan_opt_state_name(st[i].state), *mn = zo_plan_master_name(st[i].master);
        snprintf(name, sizeof name, "%s m, v, master %s: cpu", sn, mn);
        print_losses(name, &ref);
        snprintf(name, sizeof name, "%s m, v, master %s: %s", sn, mn, backend);
        print_losses(name, &dut);
        for (int k = 0; k < STEPS; k++)
            if (!(fabs((double)dut.loss[k] - ref.loss[k]) <= loss_rtol(ZO_DTYPE_BF16) * fabs(ref.loss[k])))
                fail_msg("%s state, master %s, step %d: loss %.7g on %s, %.7g on cpu", sn, mn, k, dut.loss[k],
                         backend, ref.loss[k]);
        assert_true(dut.loss[STEPS - 1] < dut.loss[0] - 0.1f);
    }
}

/* ---- the train program ------------------------------------------------------------------ */

/* The "step K loss X" lines of train's output (K from 1); returns how many. */
static int parse_losses(const char *out, float *loss, int max)
{
    int n = 0;
    for (const char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        int k;
        float l;
        if (sscanf(line, "step %d loss %f", &k, &l) == 2 && k == n + 1 && n < max) loss[n++] = l;
    }
    return n;
}

/* peak_bytes.gpu and device_capacity of a --stats-json file. */
static void read_peak(const char *path, double *peak, double *capacity)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *root = cJSON_Parse(buf);
    assert_non_null(root);
    const cJSON *pk = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "peak_bytes"), "gpu");
    const cJSON *cap = cJSON_GetObjectItemCaseSensitive(root, "device_capacity");
    assert_true(cJSON_IsNumber(pk) && cJSON_IsNumber(cap));
    *peak = pk->valuedouble;
    *capacity = cap->valuedouble;
    cJSON_Delete(root);
}

/* `train --device <backend>` against `train --device cpu` on the model
 * config.json of dir holds (`extra`: flags beside the common ones): the same
 * losses within bf16's tolerance, falling, the device named in the header,
 * the peak under --device-mem. Each run's output into out[0] (cpu) and
 * out[1] (the device under test). */
static void train_both(const char *dir, const char *what, const char *extra, char out[2][1 << 16])
{
    char text[128], cfg[128], stats[128], cmd[1024];
    snprintf(text, sizeof text, "%s/text.txt", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    float loss[2][8];
    const char *devs[2] = {"cpu", backend};
    for (int i = 0; i < 2; i++) {
        snprintf(stats, sizeof stats, "%s/stats-%d.json", dir, i);
        snprintf(cmd, sizeof cmd,
                 "%s --model %s --data %s --text --steps 8 --micro-batch 2 --seq 32 --lr 3e-3 "
                 "--dtype bf16 --threads 2 --params-on cpu --prefetch 2 %s "
                 "--device %s --device-mem 4MiB --stats-json %s 2>&1",
                 ZO_TRAIN_BIN, cfg, text, extra, devs[i], stats);
        int rc = run_capture(cmd, out[i], 1 << 16);
        if (rc != 0) printf("%s\n", out[i]);
        assert_int_equal(rc, 0);
        assert_int_equal(parse_losses(out[i], loss[i], 8), 8);
        /* the header names the backend that ran */
        char want[32];
        snprintf(want, sizeof want, "device %s,", strncmp(devs[i], "cuda", 4) ? "cpu" : "cuda");
        assert_non_null(strstr(out[i], want));
        double peak, capacity;
        read_peak(stats, &peak, &capacity);
        printf("  %s, train --device %-6s device peak %.0f of %.0f bytes; losses", what, devs[i], peak, capacity);
        for (int k = 0; k < 8; k++) printf(" %.4f", loss[i][k]);
        printf("\n");
        assert_true(capacity == 4.0 * 1024.0 * 1024.0);
        assert_true(peak > 0 && peak <= capacity);
    }
    for (int k = 0; k < 8; k++)
        assert_true(fabsf(loss[1][k] - loss[0][k]) <= (float)loss_rtol(ZO_DTYPE_BF16) * loss[0][k]);
    assert_true(loss[1][7] < loss[1][0]);
}

/* A fresh folder with text.txt and config.json holding `config`. */
static void program_dir(char *dir, size_t n, const char *tag, const char *config)
{
    scratch_path(dir, n, "zo_test_offload_cuda_%s_%d", tag, (int)getpid());
    assert_int_equal(mkdir(dir, 0755), 0);
    char path[128];
    snprintf(path, sizeof path, "%s/text.txt", dir);
    files_write_sample_text(path, 300);
    snprintf(path, sizeof path, "%s/config.json", dir);
    files_write_text(path, config);
}

static void test_train_program(void **state)
{
    (void)state;
    char dir[96], cmd[1024];
    static char out[2][1 << 16];
    program_dir(dir, sizeof dir, "llama",
                "{\"model_type\": \"llama\", \"num_hidden_layers\": 6, \"hidden_size\": 128,"
                " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 384,"
                " \"max_position_embeddings\": 64, \"vocab_size\": 256, \"rms_norm_eps\": 1e-5}\n");
    train_both(dir, "llama", "--recompute full --checkpoints-on cpu", out);

    /* a malformed device name is a usage error naming the flag */
    snprintf(cmd, sizeof cmd, "%s --model %s/config.json --data %s/text.txt --text --device tpu 2>&1", ZO_TRAIN_BIN,
             dir, dir);
    assert_int_equal(run_capture(cmd, out[0], sizeof out[0]), 2);
    assert_non_null(strstr(out[0], "--device tpu"));

    files_remove_tree(dir);
}

/* A Mixtral with the weights on the host: its routed experts stream to the
 * device apart from the layer's dense part (docs/offload.md, "Experts
 * streamed apart"), through the MoE kernels (router, gather, scatter) and
 * the AdamW that skips experts without tokens; both runs say so. */
static void test_train_program_moe(void **state)
{
    (void)state;
    char dir[96];
    static char out[2][1 << 16];
    program_dir(dir, sizeof dir, "mixtral",
                "{\"model_type\": \"mixtral\", \"num_hidden_layers\": 4, \"hidden_size\": 64,"
                " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 128,"
                " \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"vocab_size\": 256,"
                " \"max_position_embeddings\": 64, \"output_router_logits\": true,"
                " \"router_aux_loss_coef\": 0.02}\n");
    train_both(dir, "mixtral", "--lr 1e-3", out);
    for (int i = 0; i < 2; i++) assert_non_null(strstr(out[i], "# experts streamed apart:"));
    files_remove_tree(dir);
}

int main(void)
{
    const char *env = getenv("ZO_OFFLOAD_BACKEND");
    if (env && *env) backend = env;
    if (strcmp(backend, "cpu") != 0 && gpu_cuda_device_count() == 0) {
        printf("test_offload_cuda: no CUDA device here (or a build without CUDA): skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_streamed),
        cmocka_unit_test(test_gpt2_streamed),
        cmocka_unit_test(test_optimizer_state_on_device),
        cmocka_unit_test(test_train_program),
        cmocka_unit_test(test_train_program_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
