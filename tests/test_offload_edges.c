/* Edge cases of the offload runtime, fast: plan files that say nonsense,
 * allocation failures at every point of offload_init, a micro-batch whose
 * model fails with work still queued, checkpoints whose state.json was
 * tampered with, and train flags that must not be accepted and ignored.
 * The model is a stub of a few blocks whose forward/backward copy weights
 * around on the compute stream (the runtime's data path, no transformer). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/dtype.h"      /* defines: zo_bf16_to_f32 */
#include "cpu_adam/cpu_adam.h" /* defines: adam_update, adam_grad_stats (the reference) */
#include "gpu/ops_cpu.h"     /* defines: gpu_cpu_inject_faults */
#include "offload/offload.h" /* defines: offload_init, offload_plan_load, offload_save */
#include "tests/support/files.h" /* defines: files_write_plan, files_write_text, files_remove_tree */
#include "tests/support/run.h"   /* defines: run_program */

static char tmp_dir[256];

/* ---- plans -------------------------------------------------------------------------- */

/* A complete plan as the schema's writer writes it (its defaults for GPT-2),
 * with the member at the dotted `field` replaced by the JSON `value` (NULL:
 * removed), as the runtime reads it. */
static zo_status load_plan_with(const char *field, const char *value, offload_plan *p)
{
    zo_model_config m;
    assert_int_equal(zo_model_preset_find("gpt2", &m), ZO_OK);
    zo_plan *pl = malloc(sizeof *pl);
    assert_non_null(pl);
    zo_plan_defaults(pl, &m);
    char path[400];
    snprintf(path, sizeof path, "%s/plan.json", tmp_dir);
    files_write_plan(path, pl, field, value);
    free(pl);
    offload_plan_defaults(p);
    zo_status st = offload_plan_load(path, p);
    remove(path);
    return st;
}

/* A bad nvme.sub_group is refused; buffers.sub_group (where `memplan
 * estimate --json` kept it) is not a plan's field. */
static void test_plan_bad_sub_group(void **state)
{
    (void)state;
    offload_plan p;
    struct {
        const char *field, *value;
    } bad[] = {
        {"buffers.sub_group", "\"big\""},
        {"buffers.sub_group", "-4096"},
        {"nvme.sub_group", "\"big\""},
        {"nvme.sub_group", "-4096"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(load_plan_with(bad[i].field, bad[i].value, &p), ZO_ERR_FORMAT);
        assert_non_null(strstr(zo_last_error(), "sub_group"));
    }
    assert_int_equal(load_plan_with("nvme.sub_group", "4096", &p), ZO_OK);
    assert_int_equal(p.cfg.sub_group, 4096);
}

/* placement.optimizer: fractions in [0, 1] summing to 1, named by the plan's
 * message. */
static void test_plan_fractions(void **state)
{
    (void)state;
    offload_plan p;
    const char *bad[] = {
        "{\"gpu\": 0.5, \"cpu\": 0.7, \"nvme\": 0}",
        "{\"gpu\": 0, \"cpu\": -0.5, \"nvme\": 1.5}",
        "{}",
        "{\"cpu\": 0.3}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(load_plan_with("placement.optimizer", bad[i], &p), ZO_ERR_FORMAT);
        assert_non_null(strstr(zo_last_error(), "placement.optimizer"));
        assert_non_null(strstr(zo_last_error(), "plan.json"));
    }
    assert_int_equal(load_plan_with("placement.optimizer", "{\"gpu\": 0, \"cpu\": 0.5, \"nvme\": 0.5}", &p),
                     ZO_OK);
    assert_true(p.cfg.opt_frac[OFFLOAD_CPU] == 0.5 && p.cfg.opt_frac[OFFLOAD_NVME] == 0.5 &&
                p.cfg.opt_frac[OFFLOAD_DEVICE] == 0.0);
    /* a plan for SGD is not run as AdamW */
    assert_int_equal(load_plan_with("training.optimizer", "\"sgd\"", &p), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "training.optimizer"));
    assert_int_equal(load_plan_with("training.optimizer", "\"adamw\"", &p), ZO_OK);
    /* integers far out of range are refused, not converted */
    assert_int_equal(load_plan_with("training.grad_accum", "1e300", &p), ZO_ERR_FORMAT);
    assert_int_equal(load_plan_with("training.grad_accum", "-1e300", &p), ZO_ERR_FORMAT);
}

/* ---- a stub model ------------------------------------------------------------------------ */

#define NB 4
#define NUMEL 4096

typedef struct stub {
    gpu_device_t dev;
    void *scratch;          /* device, NUMEL * 4: where forward copies weights */
    void *marker_dev;       /* device int: 1 */
    int *marker_host;       /* pinned: set by the last copy of a failing forward */
    int fail_block;         /* forward of this block enqueues work and fails; -1 none */
    int fail_back_block;    /* backward of this block fails; -1 none */
    int slow_copies;        /* copies the failing forward enqueues first */
} stub;

static zo_status stub_forward(void *user, int block, const offload_block_io *io, gpu_stream_t s)
{
    stub *m = user;
    zo_status st;
    if ((st = gpu_memcpy_async(s, m->scratch, io->params, NUMEL * 2, GPU_COPY_DEVICE_TO_DEVICE)) != ZO_OK)
        return st;
    if (io->out && (st = gpu_memcpy_async(s, io->out, io->params, 64, GPU_COPY_DEVICE_TO_DEVICE)) != ZO_OK)
        return st;
    if (block != m->fail_block) return ZO_OK;
    /* work still queued when the model reports its failure, the way a
     * model fails at its n-th op: reading the runtime's weights */
    for (int i = 0; i < m->slow_copies; i++)
        if ((st = gpu_memcpy_async(s, m->scratch, io->params, NUMEL * 2, GPU_COPY_DEVICE_TO_DEVICE)) != ZO_OK)
            return st;
    if ((st = gpu_memcpy_async(s, m->marker_host, m->marker_dev, sizeof(int), GPU_COPY_DEVICE_TO_HOST)) != ZO_OK)
        return st;
    return zo_error(ZO_ERR_INTERNAL, "stub: block %d fails", block);
}

static zo_status stub_backward(void *user, int block, const offload_block_io *io, float scale,
                               gpu_stream_t s)
{
    stub *m = user;
    (void)scale;
    /* d weight = the weights: a gradient the runtime copies out */
    zo_status st = gpu_memcpy_async(s, io->grads, io->params, NUMEL * 2, GPU_COPY_DEVICE_TO_DEVICE);
    if (st == ZO_OK && block == m->fail_back_block)
        st = zo_error(ZO_ERR_INTERNAL, "stub: backward of block %d fails", block);
    return st;
}

static zo_status stub_recompute(void *user, int block, const offload_block_io *io, gpu_stream_t s)
{
    (void)user, (void)block, (void)io, (void)s;
    return ZO_OK;
}

static const size_t stub_numel[NB] = {NUMEL, NUMEL, NUMEL, NUMEL};

static offload_model stub_model(stub *m)
{
    return (offload_model){.n_blocks = NB, .block_numel = stub_numel, .dtype = ZO_DTYPE_BF16,
                           .boundary_bytes = 64, .user = m, .forward = stub_forward,
                           .backward = stub_backward, .recompute = stub_recompute};
}

static void stub_open(stub *m)
{
    memset(m, 0, sizeof *m);
    m->fail_block = m->fail_back_block = -1;
    gpu_cpu_options o = {.n_threads = 1};
    assert_int_equal(gpu_device_init_cpu(&o, &m->dev), ZO_OK);
    assert_int_equal(gpu_mem_alloc(m->dev, NUMEL * 4, &m->scratch), ZO_OK);
    assert_int_equal(gpu_mem_alloc(m->dev, sizeof(int), &m->marker_dev), ZO_OK);
    assert_int_equal(gpu_host_alloc(m->dev, sizeof(int), (void **)&m->marker_host), ZO_OK);
}

static void stub_close(stub *m)
{
    gpu_mem_free(m->dev, m->scratch);
    gpu_mem_free(m->dev, m->marker_dev);
    gpu_host_free(m->dev, m->marker_host);
    gpu_device_free(m->dev);
}

static void stub_weights(float *w)
{
    for (int i = 0; i < NB * NUMEL; i++) w[i] = (float)((i * 37) % 101 - 50) * 1e-3f;
}

static zo_status set_weights(offload_t *rt, float *w)
{
    const float *blocks[NB];
    for (int b = 0; b < NB; b++) blocks[b] = w + (size_t)b * NUMEL;
    return offload_set_weights(rt, blocks);
}

/* The stub with its weights in a runtime of the default configuration. */
static offload_t *stub_runtime(stub *m, zo_dtype dt)
{
    stub_open(m);
    offload_model om = stub_model(m);
    om.dtype = dt;
    offload_config c;
    offload_config_defaults(&c);
    offload_t *rt;
    assert_int_equal(offload_init(&rt, m->dev, &om, &c), ZO_OK);
    static float w[NB * NUMEL];
    stub_weights(w);
    assert_int_equal(set_weights(rt, w), ZO_OK);
    return rt;
}

/* ---- allocation failures in offload_init ---------------------------------------------- */

/* Every device and pinned allocation of offload_init fails in turn: init
 * returns the error and leaves nothing allocated on the device. */
static void test_init_alloc_faults(void **state)
{
    (void)state;
    struct {
        offload_tier params, ckpt;
        int recompute;
        double dev;
    } v[] = {
        {OFFLOAD_DEVICE, OFFLOAD_DEVICE, 0, 0},
        {OFFLOAD_CPU, OFFLOAD_CPU, 1, 0},
        {OFFLOAD_CPU, OFFLOAD_DEVICE, 0, 0.5},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        stub m;
        stub_open(&m);
        offload_model om = stub_model(&m);
        offload_config c;
        offload_config_defaults(&c);
        c.params_on = v[i].params;
        c.checkpoints_on = v[i].ckpt;
        c.recompute = v[i].recompute;
        c.opt_frac[OFFLOAD_DEVICE] = v[i].dev;
        c.opt_frac[OFFLOAD_CPU] = 1 - v[i].dev;
        gpu_mem_stats before;
        gpu_mem_get_stats(m.dev, &before);
        int k;
        for (k = 0; k < 200; k++) {
            gpu_cpu_faults f = {.alloc_skip = k, .alloc_fail = 1};
            assert_int_equal(gpu_cpu_inject_faults(m.dev, &f), ZO_OK);
            offload_t *rt = NULL;
            zo_status st = offload_init(&rt, m.dev, &om, &c);
            gpu_cpu_faults off = {0};
            assert_int_equal(gpu_cpu_inject_faults(m.dev, &off), ZO_OK);
            if (st == ZO_OK) {
                offload_free(rt);
                break;
            }
            assert_null(rt);
            gpu_mem_stats after;
            gpu_mem_get_stats(m.dev, &after);
            if (after.in_use != before.in_use || after.n_allocs != before.n_allocs ||
                after.host_pinned != before.host_pinned) {
                fprintf(stderr, "config %zu, allocation %d failing: %zu bytes in %zu allocations left\n",
                        i, k, after.in_use - before.in_use, (size_t)(after.n_allocs - before.n_allocs));
                fail();
            }
        }
        assert_true(k > 3 && k < 200);
        stub_close(&m);
    }
}

/* ---- a failing micro-batch ---------------------------------------------------------------- */

/* The model fails with work queued on the compute stream that reads the
 * runtime's weights: offload_micro_batch returns only once that work has
 * run (offload_free right after must not free buffers in use), and the
 * runtime trains again after it, as if the failed micro-batch never was. */
static void test_failed_micro_batch(void **state)
{
    (void)state;
    for (int mode = 0; mode < 4; mode++) {
        int params = mode & 1, in_backward = mode >> 1;
        stub m;
        stub_open(&m);
        offload_model om = stub_model(&m);
        offload_config c;
        offload_config_defaults(&c);
        c.params_on = params ? OFFLOAD_CPU : OFFLOAD_DEVICE;
        c.prefetch_depth = 1;
        c.grad_accum = 2;
        static float w[NB * NUMEL];
        stub_weights(w);

        /* the reference: two good micro-batches, one step */
        offload_t *rt;
        assert_int_equal(offload_init(&rt, m.dev, &om, &c), ZO_OK);
        gpu_stream_t s;
        assert_int_equal(gpu_stream_create(m.dev, &s), ZO_OK);
        assert_int_equal(set_weights(rt, w), ZO_OK);
        assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
        assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
        offload_step_info ref;
        assert_int_equal(offload_step(rt, &ref), ZO_OK);
        offload_free(rt);

        /* one good micro-batch, one that fails, then two good ones */
        assert_int_equal(offload_init(&rt, m.dev, &om, &c), ZO_OK);
        assert_int_equal(set_weights(rt, w), ZO_OK);
        assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
        if (in_backward) m.fail_back_block = 1;
        else m.fail_block = 2;
        m.slow_copies = 400;
        *m.marker_host = 0;
        int one = 1;
        assert_int_equal(gpu_memcpy_async(s, m.marker_dev, &one, sizeof one, GPU_COPY_HOST_TO_DEVICE), ZO_OK);
        assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
        assert_int_equal(offload_micro_batch(rt, s), ZO_ERR_INTERNAL);
        /* the failing block's queued work has run by now */
        if (!in_backward) assert_int_equal(__atomic_load_n(m.marker_host, __ATOMIC_ACQUIRE), 1);
        m.fail_block = m.fail_back_block = -1;
        assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
        assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
        offload_step_info info;
        assert_int_equal(offload_step(rt, &info), ZO_OK);
        if (info.grad_norm != ref.grad_norm) {
            fprintf(stderr, "mode %d: norm %.9g after a failed micro-batch, %.9g without\n", mode,
                    info.grad_norm, ref.grad_norm);
            fail();
        }
        assert_int_equal(info.step, 1);
        offload_free(rt);
        gpu_stream_destroy(s);
        stub_close(&m);
    }
}

/* ---- the delayed parameter update ------------------------------------------------------ */

/* The stub's gradient is the 16-bit weights its micro-batch used, so the
 * delayed update can be computed here in closed form: after `warmup` serial
 * steps, step t's micro-batch uses the weights of step t - 1 while step
 * t - 1's update runs; with cpu_adam's own functions the reference gives
 * the runtime's gradient norm at every step and its final master weights,
 * bit for bit. */
static void test_dpu_one_step_late(void **state)
{
    (void)state;
    enum { STEPS = 9, WARMUP = 2, N = NB * NUMEL };
    stub m;
    stub_open(&m);
    offload_model om = stub_model(&m);
    offload_config c;
    offload_config_defaults(&c);
    c.schedule = OFFLOAD_SCHEDULE_DPU;
    c.dpu_warmup = WARMUP;
    c.opt_threads = 1;
    c.adam.clip = 0.5f; /* engages: the gradient is the weights */
    static float w[N], P[N], M[N], V[N], g[N];
    static uint16_t hist[STEPS + 1][N]; /* the 16-bit weights after each update */
    stub_weights(w);
    memcpy(P, w, sizeof P);
    zo_convert(hist[0], ZO_DTYPE_BF16, P, ZO_DTYPE_F32, N);
    offload_t *rt;
    gpu_stream_t s;
    assert_int_equal(offload_init(&rt, m.dev, &om, &c), ZO_OK);
    assert_int_equal(gpu_stream_create(m.dev, &s), ZO_OK);
    assert_int_equal(set_weights(rt, w), ZO_OK);
    for (int t = 0; t < STEPS; t++) {
        /* the runtime */
        assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
        offload_step_info info;
        assert_int_equal(offload_step(rt, &info), ZO_OK);
        /* the reference: the weights the micro-batch used, a step late once
         * the warmup is over */
        const uint16_t *used = hist[t <= WARMUP ? t : t - 1];
        for (int i = 0; i < N; i++) g[i] = zo_bf16_to_f32(used[i]);
        double sumsq = 0;
        for (int b = 0; b < NB; b++) {
            double ss;
            int nf;
            assert_int_equal(adam_grad_stats(g + b * NUMEL, ZO_DTYPE_F32, NUMEL, 1, &ss, &nf), ZO_OK);
            sumsq += ss;
        }
        double norm = sqrt(sumsq), coef = c.adam.clip / (norm + 1e-6);
        if (memcmp(&info.grad_norm, &(float){(float)norm}, sizeof(float))) {
            fprintf(stderr, "step %d: norm %.9g, the one-step-late reference %.9g\n", t, info.grad_norm, norm);
            fail();
        }
        adam_hparams hp = adam_hparams_default();
        hp.lr = c.adam.lr;
        hp.beta1 = c.adam.beta1;
        hp.beta2 = c.adam.beta2;
        hp.eps = c.adam.eps;
        hp.weight_decay = c.adam.weight_decay;
        hp.decay = ADAM_DECAY_ADAMW;
        hp.step = t + 1;
        hp.grad_mult = (float)(coef < 1.0 ? coef : 1.0);
        assert_int_equal(adam_update(&hp, N, P, g, ZO_DTYPE_F32, M, V, hist[t + 1], ZO_DTYPE_BF16, 1), ZO_OK);
    }
    /* the last update, published: the runtime's master is the reference's */
    static float got[N];
    float *blocks[NB];
    for (int b = 0; b < NB; b++) blocks[b] = got + b * NUMEL;
    assert_int_equal(offload_get_weights(rt, blocks), ZO_OK);
    assert_memory_equal(got, P, sizeof got);
    /* and the serial schedule differs from it: the delay is real */
    offload_free(rt);
    c.schedule = OFFLOAD_SCHEDULE_SERIAL;
    assert_int_equal(offload_init(&rt, m.dev, &om, &c), ZO_OK);
    assert_int_equal(set_weights(rt, w), ZO_OK);
    for (int t = 0; t < STEPS; t++) {
        offload_step_info info;
        assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
        assert_int_equal(offload_step(rt, &info), ZO_OK);
    }
    assert_int_equal(offload_get_weights(rt, blocks), ZO_OK);
    assert_true(memcmp(got, P, sizeof got) != 0);
    offload_free(rt);
    gpu_stream_destroy(s);
    stub_close(&m);
}

/* ---- checkpoints ----------------------------------------------------------------------- */

static void set_state_field(const char *state_path, const char *key, const char *value)
{
    char *buf = files_read_text(state_path), out[4200];
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    char *at = strstr(buf, pat);
    assert_non_null(at);
    char *val = at + strlen(pat);
    char *end = val + strcspn(val, ",\n}");
    snprintf(out, sizeof out, "%.*s %s%s", (int)(val - buf), buf, value, end);
    free(buf);
    files_write_text(state_path, out);
}

/* A state.json whose counters are out of range (a loss scale of 0 would
 * turn every weight into NaN at the next step) is refused. */
static void test_ckpt_bad_state(void **state)
{
    (void)state;
    stub m;
    offload_t *rt = stub_runtime(&m, ZO_DTYPE_F16);
    char dir[400], state_path[500];
    snprintf(dir, sizeof dir, "%s/ck", tmp_dir);
    offload_ckpt_meta meta = {.data_step = 7, .seed = 3};
    assert_int_equal(offload_save(rt, dir, &meta, NULL, NULL), ZO_OK);
    snprintf(state_path, sizeof state_path, "%s/step-00000000/state.json", dir);
    char *saved = files_read_text(state_path);
    offload_ckpt_meta got;
    assert_int_equal(offload_load(rt, dir, &got), ZO_OK);
    assert_int_equal(got.data_step, 7);

    const char *bad[][2] = {
        {"loss_scale", "0"}, {"loss_scale", "-2"}, {"step", "-1"}, {"step", "1.5"},
        {"skipped", "-3"},   {"good_steps", "-1"}, {"params", "-1"}, {"data_step", "-5"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        files_write_text(state_path, saved);
        set_state_field(state_path, bad[i][0], bad[i][1]);
        zo_status st = offload_load(rt, dir, &got);
        if (st != ZO_ERR_FORMAT) {
            fprintf(stderr, "state.json %s = %s: loaded (%d)\n", bad[i][0], bad[i][1], (int)st);
            fail();
        }
        assert_non_null(strstr(zo_last_error(), bad[i][0]));
    }
    files_write_text(state_path, saved);
    free(saved);
    assert_int_equal(offload_load(rt, dir, &got), ZO_OK);
    offload_free(rt);
    stub_close(&m);
    files_remove_tree(dir);
}

/* Saving twice at the same step count (an fp16 step skipped for overflow
 * leaves it unchanged) keeps the second state: it becomes the latest, under
 * a name of its own, and loads. */
static void test_ckpt_same_step(void **state)
{
    (void)state;
    stub m;
    offload_t *rt = stub_runtime(&m, ZO_DTYPE_BF16);
    char dir[400], path[500];
    snprintf(dir, sizeof dir, "%s/same", tmp_dir);
    offload_ckpt_meta meta = {.data_step = 7, .seed = 3};
    assert_int_equal(offload_save(rt, dir, &meta, NULL, NULL), ZO_OK);
    meta.data_step = 8; /* the data moved on, the step count did not */
    assert_int_equal(offload_save(rt, dir, &meta, NULL, NULL), ZO_OK);
    offload_ckpt_meta got;
    assert_int_equal(offload_load(rt, dir, &got), ZO_OK);
    assert_int_equal(got.data_step, 8);
    /* only the latest is kept */
    snprintf(path, sizeof path, "%s/step-00000000", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    meta.data_step = 9;
    assert_int_equal(offload_save(rt, dir, &meta, NULL, NULL), ZO_OK);
    assert_int_equal(offload_load(rt, dir, &got), ZO_OK);
    assert_int_equal(got.data_step, 9);
    offload_free(rt);
    stub_close(&m);
    files_remove_tree(dir);
}

/* ---- train's flags -------------------------------------------------------------------------- */

#ifdef ZO_TRAIN_BIN
static int run_train(const char *args, char *out, size_t len)
{
    return run_program(ZO_TRAIN_BIN, args, out, len);
}

/* --plan=FILE and an abbreviated --pla FILE are read like --plan FILE (they
 * were accepted and ignored); --save-every without --ckpt is refused. */
static void test_train_flags(void **state)
{
    (void)state;
    char data[400], cfg[400], plan[400], args[1500];
    static char out[1 << 16];
    snprintf(data, sizeof data, "%s/text.txt", tmp_dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", tmp_dir);
    snprintf(plan, sizeof plan, "%s/train-plan.json", tmp_dir);
    files_write_sample_text(data, 100);
    files_write_text(cfg, "{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_embd\": 32, \"n_head\": 2,"
                          " \"n_positions\": 32, \"vocab_size\": 256}\n");
    /* a plan for this model: fp32, weights streamed from the host, the
     * optimizer and its gradients there too */
    zo_model_config mc;
    assert_int_equal(zo_model_config_load(cfg, &mc), ZO_OK);
    zo_plan *pl = malloc(sizeof *pl);
    assert_non_null(pl);
    zo_plan_defaults(pl, &mc);
    pl->training.seq = 8;
    pl->training.micro_batch = 3;
    pl->training.dtype = pl->training.grad_dtype = ZO_DTYPE_F32;
    pl->placement.params = pl->placement.grads = ZO_PLAN_CPU;
    pl->placement.optimizer[ZO_PLAN_GPU] = 0;
    pl->placement.optimizer[ZO_PLAN_CPU] = 1;
    files_write_plan(plan, pl, NULL, NULL);
    free(pl);
    const char *forms[] = {"--plan %s", "--plan=%s", "--pla %s"};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        char pl[500];
        snprintf(pl, sizeof pl, forms[i], plan);
        snprintf(args, sizeof args, "--model %s --data %s --text --steps 1 --threads 1 %s", cfg, data, pl);
        assert_int_equal(run_train(args, out, sizeof out), 0);
        if (!strstr(out, "batch 3 x 8 x 1") || !strstr(out, "weights cpu")) {
            fprintf(stderr, "train %s: the plan was not read:\n%s\n", pl, out);
            fail();
        }
    }
    /* a malformed plan given as --plan=FILE is an error too */
    files_write_text(plan, "{\"format\": \"not-a-plan\"}\n");
    snprintf(args, sizeof args, "--model %s --data %s --text --steps 1 --threads 1 --plan=%s", cfg, data, plan);
    assert_int_equal(run_train(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "zoffload-plan"));
    /* --save-every needs --ckpt */
    snprintf(args, sizeof args, "--model %s --data %s --text --steps 1 --threads 1 --save-every 1", cfg, data);
    assert_int_equal(run_train(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "--ckpt"));
    remove(data);
    remove(cfg);
    remove(plan);
}
#endif

/* The planner's search and the runtime end to end: `memplan plan --json` for
 * a tiny LLaMA on a 6 MiB device, then `train --plan` runs that plan within
 * the capacity, and its measured device peak is within 3% of the plan's. */
static void test_searched_plan_runs(void **state)
{
    (void)state;
    char dir[400], cmd[3000], out[16384];
    snprintf(dir, sizeof dir, "%s/searched", tmp_dir);
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && cd %s && printf '%%s' '{\"model_type\": \"llama\", "
             "\"num_hidden_layers\": 8, \"hidden_size\": 128, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": 2, \"intermediate_size\": 256, \"vocab_size\": 256, "
             "\"max_position_embeddings\": 128}' > config.json && "
             "for i in $(seq 200); do printf 'hello world %%d. ' $i; done > text.txt && "
             "%s plan --model config.json --gpu-mem 6MiB --cpu-mem 1GiB --nvme 1GiB --seq 64 "
             "--global-batch 4 --cuda-context 0 --cublas-workspace 0 --fragmentation 0 "
             "--json plan.json --top 1 > /dev/null",
             dir, dir, ZO_MEMPLAN_BIN);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "--model %s/config.json --plan %s/plan.json --data %s/text.txt --text --steps 3 "
             "--nvme-dir %s --stats-json %s/stats.json",
             dir, dir, dir, dir, dir);
    int rc = run_train(cmd, out, sizeof out);
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    const char *line = strstr(out, "# peak bytes per tier: gpu ");
    assert_non_null(line);
    const char *pct = strstr(line, "(plan ");
    assert_non_null(pct);
    const char *comma = strchr(pct, ',');
    assert_non_null(comma);
    double ratio = atof(comma + 1) / 100.0;
    if (!(ratio > 0.97 && ratio < 1.03)) {
        fprintf(stderr, "measured/planned GPU peak %.4f: %.*s\n", ratio, (int)(strchr(line, '\n') - line), line);
        fail();
    }
    files_remove_tree(dir);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/zo_test_offload_edges_%d", (int)getpid());
    mkdir(tmp_dir, 0755);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_bad_sub_group),
        cmocka_unit_test(test_plan_fractions),
        cmocka_unit_test(test_init_alloc_faults),
        cmocka_unit_test(test_failed_micro_batch),
        cmocka_unit_test(test_dpu_one_step_late),
        cmocka_unit_test(test_ckpt_bad_state),
        cmocka_unit_test(test_ckpt_same_step),
        cmocka_unit_test(test_searched_plan_runs),
#ifdef ZO_TRAIN_BIN
        cmocka_unit_test(test_train_flags),
#endif
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(tmp_dir);
    return rc;
}
