/* Edge cases of the offload runtime, fast: plan files that say nonsense,
 * allocation failures at every point of offload_init, a micro-batch whose
 * model fails with work still queued, checkpoints whose state.json was
 * tampered with, train flags that must not be accepted and ignored, and
 * the partition of an MoE block for ZeRO with expert parallelism.
 * The model is a stub of a few blocks whose forward/backward copy weights
 * around on the compute stream (the runtime's data path, no transformer). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/dtype.h"      /* defines: zo_bf16_to_f32 */
#include "cpu_adam/cpu_adam.h" /* defines: adam_update, adam_grad_stats (the reference) */
#include "gpu/ops_cpu.h"     /* defines: gpu_cpu_inject_faults */
#include "model/safetensors.h" /* defines: model_st_open */
#include "offload/ckpt_meta.h" /* defines: ckpt_manifest_write (to re-sign an edited checkpoint) */
#include "gpu/comm.h"          /* defines: comm_init (a one-rank expert_comm) */
#include "offload/dp.h"        /* defines: offload_dp_segments, offload_seg_at, offload_dp_part_bytes_experts */
#include "common/plan_schema.h" /* defines: zo_plan_load */
#include "common/units.h"       /* defines: zo_format_bytes */
#include "offload/offload.h" /* defines: offload_init, offload_plan_load, offload_save */
#include "tests/support/files.h" /* defines: files_write_plan, files_write_text, files_remove_tree */
#include "tests/support/run.h"   /* defines: run_program, run_capture, run_paused */
#include "tests/support/scratch.h" /* defines: scratch_path */

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
/* The rank's part of an MoE block under expert parallelism at ZeRO 1-3
 * (offload_dp_segments): on W ranks in groups of N (expert_comm: the ranks
 * with the same r % N, rank r / N in it), every dense element belongs to
 * exactly one rank of the world and every expert element to exactly one
 * rank of each expert_comm; a rank's part maps onto the block in runs that
 * stay inside one segment, in block order; the segments are padded to
 * their communicator's size. One case is written out by hand. */
static void test_ep_partition(void **state)
{
    (void)state;
    /* by hand: 10 elements, experts [3, 7), 4 ranks, --ep 2. Dense before
     * [0, 3) in parts of 1, the experts in parts of 2 over 2 ranks each,
     * dense after [7, 10) in parts of 1; rank 3 holds no dense element */
    static const size_t want[4][4] = {{0, 3, 4, 7}, {1, 3, 4, 8}, {2, 5, 6, 9}, {5, 6}};
    static const size_t want_n[4] = {4, 4, 4, 2};
    for (int r = 0; r < 4; r++) {
        offload_seg seg[3];
        int ns = offload_dp_segments(10, 3, 7, 4, r, 2, r / 2, seg);
        assert_int_equal(ns, 3);
        size_t total = seg[ns - 1].loc + seg[ns - 1].own_n, run;
        assert_int_equal(total, want_n[r]);
        for (size_t i = 0; i < total; i++) assert_int_equal(offload_seg_at(seg, ns, i, &run), want[r][i]);
    }
    static const struct { size_t n, xlo, xhi; } blocks[] = {
        {1000, 137, 901}, {1000, 0, 1000}, {1000, 0, 600}, {1000, 400, 1000}, {7, 2, 5}, {999, 999, 999}, {3, 1, 2},
    };
    static const int layouts[][2] = {{2, 2}, {4, 2}, {4, 4}, {8, 2}, {8, 4}, {6, 3}, {2, 1}};
    for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++)
        for (size_t li = 0; li < sizeof layouts / sizeof *layouts; li++) {
            const size_t n = blocks[bi].n, xlo = blocks[bi].xlo, xhi = blocks[bi].xhi;
            const int W = layouts[li][0], N = layouts[li][1], S = W / N;
            /* owners[i * N + c]: how many ranks of color c hold element i */
            int *owners = calloc(n * (size_t)N, sizeof *owners);
            assert_non_null(owners);
            for (int r = 0; r < W; r++) {
                offload_seg seg[3];
                int ns = offload_dp_segments(n, xlo, xhi, W, r, S, r / N, seg);
                size_t total = ns ? seg[ns - 1].loc + seg[ns - 1].own_n : 0, prev = 0;
                for (int k = 0; k < ns; k++) {
                    size_t P = (size_t)(seg[k].expert ? S : W);
                    assert_true(seg[k].pad % P == 0 && seg[k].pad >= seg[k].n && seg[k].pad < seg[k].n + P);
                    /* the parts are equal: rank q's starts at q pad / P */
                    size_t q = (size_t)(seg[k].expert ? r / N : r);
                    assert_int_equal(seg[k].own_off, q * (seg[k].pad / P));
                    assert_true(seg[k].own_n <= seg[k].pad / P);
                    assert_int_equal(seg[k].expert, seg[k].lo == xlo && xhi > xlo);
                }
                for (size_t i = 0; i < total;) {
                    size_t run, at = offload_seg_at(seg, ns, i, &run);
                    assert_true(run >= 1 && at + run <= n);
                    assert_true(i == 0 || at > prev); /* block order */
                    /* a run is all dense or all experts */
                    int in = at >= xlo && at < xhi;
                    assert_int_equal(at + run - 1 >= xlo && at + run - 1 < xhi, in);
                    for (size_t j = 0; j < run; j++) owners[(at + j) * (size_t)N + (size_t)(r % N)]++;
                    prev = at + run - 1;
                    i += run;
                }
            }
            for (size_t i = 0; i < n; i++) {
                int expert = i >= xlo && i < xhi, sum = 0;
                for (int c = 0; c < N; c++) {
                    if (expert && owners[i * (size_t)N + (size_t)c] != 1)
                        fail_msg("n %zu experts [%zu, %zu) on %d ranks, --ep %d: expert element %zu held by %d "
                                 "ranks of expert_comm %d (want 1)", n, xlo, xhi, W, N, i,
                                 owners[i * (size_t)N + (size_t)c], c);
                    sum += owners[i * (size_t)N + (size_t)c];
                }
                if (!expert && sum != 1)
                    fail_msg("n %zu experts [%zu, %zu) on %d ranks, --ep %d: dense element %zu held by %d ranks "
                             "(want 1)", n, xlo, xhi, W, N, i, sum);
            }
            free(owners);
        }
}

/* A frozen base's expert bytes (offload_model.frozen_expert_lo/hi) are the
 * caller's: a range past its block, or one that ends before it starts, is
 * refused by name before any segment is laid (else the segments run past
 * the block and the base is read past its buffer); a range inside is laid
 * in the three segments. */
static void test_ep_frozen_range(void **state)
{
    (void)state;
    comm_t c = NULL;
    comm_options co = {.backend = COMM_BACKEND_SELF};
    assert_int_equal(comm_init(&co, &c), ZO_OK);
    offload_dp dp = {.rank = 1, .size = 4, .xrank = 0, .xsize = 2, .xcomm_part = c};
    static const size_t bytes[2] = {100, 40};
    static const struct { size_t lo[2], hi[2]; int bad; size_t want[3]; } cases[] = {
        {{20, 40}, {80, 40}, -1, {0}},
        {{20, 0}, {101, 0}, 0, {20, 101, 100}},
        {{20, 30}, {80, 20}, 1, {30, 20, 40}},
        {{20, 41}, {80, 41}, 1, {41, 41, 40}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        offload_part p;
        assert_int_equal(offload_dp_part_bytes(&dp, 2, bytes, &p), ZO_OK);
        zo_status st = offload_dp_part_bytes_experts(&dp, bytes, cases[i].lo, cases[i].hi, &p);
        if (cases[i].bad < 0) {
            assert_int_equal(st, ZO_OK);
            assert_int_equal(p.nseg[0], 3);
            assert_int_equal(p.nseg[1], 0);
        } else {
            char want[160];
            snprintf(want, sizeof want, "block %d: offload_model.frozen_expert_lo/hi [%zu, %zu) outside its %zu bytes",
                     cases[i].bad, cases[i].want[0], cases[i].want[1], cases[i].want[2]);
            assert_int_equal(st, ZO_ERR_INVALID);
            if (!strstr(zo_last_error(), want)) fail_msg("got \"%s\", want \"%s\"", zo_last_error(), want);
        }
        offload_dp_part_free(&p);
    }
    comm_free(c);
}

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
    int nan_block;          /* backward of this block writes a nan into its gradient; -1 none */
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
    static const uint16_t nan16[4] = {0x7fc0, 0x7fc0, 0x7e00, 0x7e00}; /* bf16, fp16 nan */
    if (st == ZO_OK && block == m->nan_block) /* its element 1 (bf16) or 3 (fp16) */
        st = gpu_memcpy_async(s, io->grads, nan16, sizeof nan16, GPU_COPY_HOST_TO_DEVICE);
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
    m->fail_block = m->fail_back_block = m->nan_block = -1;
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

/* A runtime on the (open) stub model with its weights set: of configuration
 * c0, or the default one when c0 is NULL. */
static offload_t *stub_runtime(stub *m, zo_dtype dt, const offload_config *c0)
{
    offload_model om = stub_model(m);
    om.dtype = dt;
    offload_config c;
    if (c0) c = *c0;
    else offload_config_defaults(&c);
    offload_t *rt;
    assert_int_equal(offload_init(&rt, m->dev, &om, &c), ZO_OK);
    static float w[NB * NUMEL];
    stub_weights(w);
    assert_int_equal(set_weights(rt, w), ZO_OK);
    return rt;
}

/* A checkpoint test's start: the stub open, a runtime of the default
 * configuration on it, and the folder <tmp>/<name> to save into in dir. */
static offload_t *ckpt_setup(stub *m, zo_dtype dt, const char *name, char *dir, size_t len)
{
    stub_open(m);
    snprintf(dir, len, "%s/%s", tmp_dir, name);
    return stub_runtime(m, dt, NULL);
}

/* ... and its end: the runtime, the stub and the folder gone. */
static void ckpt_teardown(offload_t *rt, stub *m, const char *dir)
{
    offload_free(rt);
    stub_close(m);
    files_remove_tree(dir);
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
    char dir[400], state_path[500];
    offload_t *rt = ckpt_setup(&m, ZO_DTYPE_F16, "ck", dir, sizeof dir);
    offload_ckpt_meta meta = {.data_step = 7, .seed = 3};
    assert_int_equal(offload_save(rt, dir, &meta, NULL, NULL), ZO_OK);
    snprintf(state_path, sizeof state_path, "%s/step-00000000/state.json", dir);
    char *saved = files_read_text(state_path);
    offload_ckpt_meta got;
    assert_int_equal(offload_load(rt, dir, &got), ZO_OK);
    assert_int_equal(got.data_step, 7);

    const char *bad[][2] = {
        {"loss_scale", "0"}, {"loss_scale", "-2"}, {"step", "-1"}, {"step", "1.5"},
        {"skipped", "-3"},   {"good_steps", "-1"}, {"params", "-1"}, {"data_rows", "-5"},
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
    ckpt_teardown(rt, &m, dir);
}

/* Saving twice at the same step count (an fp16 step skipped for overflow
 * leaves it unchanged) keeps the second state: it becomes the latest, under
 * a name of its own, and loads. */
static void test_ckpt_same_step(void **state)
{
    (void)state;
    stub m;
    char dir[400], path[500];
    offload_t *rt = ckpt_setup(&m, ZO_DTYPE_BF16, "same", dir, sizeof dir);
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
    ckpt_teardown(rt, &m, dir);
}

/* ---- checkpoints: checksums, strict state, rotation, locks ------------------------------ */

static char *slurp_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* A model.safetensors of the weights, block by block (what train writes). */
static zo_status stub_writer(void *user, const char *path, offload_block_reader read, void *ctx)
{
    (void)user;
    static float w[NB * NUMEL];
    zo_status st;
    for (int b = 0; b < NB; b++)
        if ((st = read(ctx, b, w + (size_t)b * NUMEL)) != ZO_OK) return st;
    model_st_entry e = {.name = "w", .dtype = ZO_DTYPE_F32, .ndim = 1, .shape = {NB * NUMEL}, .data = w};
    return model_st_write(path, &e, 1, NULL, NULL);
}

/* Every file of a checkpoint checksummed: one byte flipped anywhere in any
 * of them, or a file cut short, is refused naming the file, before any
 * state is overwritten (it loaded silently, the losses changed). */
static void test_ckpt_checksums(void **state)
{
    (void)state;
    stub m;
    char dir[400], ck[500], path[700];
    offload_t *rt = ckpt_setup(&m, ZO_DTYPE_BF16, "sums", dir, sizeof dir);
    offload_ckpt_meta meta = {.data_step = 7, .seed = 3};
    assert_int_equal(offload_save_streamed(rt, dir, &meta, stub_writer, NULL), ZO_OK);
    snprintf(ck, sizeof ck, "%s/step-00000000", dir);
    static float before[NUMEL], after[NUMEL];
    assert_int_equal(offload_get_block(rt, 1, before), ZO_OK);
    const char *files[] = {"optimizer.safetensors", "model.safetensors", "state.json"};
    int trials = 0;
    for (size_t fi = 0; fi < sizeof files / sizeof files[0]; fi++) {
        snprintf(path, sizeof path, "%s/%s", ck, files[fi]);
        size_t len;
        char *orig = slurp_file(path, &len);
        /* bytes spread over the file: header, data, the last one */
        for (int t = 0; t < 9; t++) {
            size_t at = t == 8 ? len - 1 : (len / 8) * (size_t)t + 3;
            if (!strcmp(files[fi], "state.json") && strchr(" \n\t\r:,\"{}", orig[at])) at = len / 2;
            orig[at] ^= 0x01;
            files_write(path, orig, len);
            orig[at] ^= 0x01;
            offload_ckpt_meta got = {0};
            zo_status st = offload_load(rt, dir, &got);
            trials++;
            if (st == ZO_OK) {
                fprintf(stderr, "%s, byte %zu of %zu flipped: loaded\n", files[fi], at, len);
                fail();
            }
            assert_non_null(strstr(zo_last_error(), files[fi]));
            if (strcmp(files[fi], "state.json")) assert_int_equal(st, ZO_ERR_CHECKSUM);
        }
        files_write(path, orig, len - 1); /* cut short */
        assert_int_not_equal(offload_load(rt, dir, NULL), ZO_OK);
        assert_non_null(strstr(zo_last_error(), files[fi]));
        files_write(path, orig, len);
        free(orig);
    }
    /* nothing was overwritten by the refused loads */
    assert_int_equal(offload_get_block(rt, 1, after), ZO_OK);
    assert_memory_equal(before, after, sizeof before);
    printf("  %d corruptions, every one refused naming its file\n", trials);
    /* the manifest itself: edited, or missing */
    snprintf(path, sizeof path, "%s/manifest.json", ck);
    size_t len;
    char *man = slurp_file(path, &len);
    char *hex = strstr(man, "\"xxh3\":");
    assert_non_null(hex);
    hex = strchr(hex + 7, '"') + 1;
    char was = hex[0];
    hex[0] = was == '0' ? '1' : '0';
    files_write(path, man, len);
    assert_int_equal(offload_load(rt, dir, NULL), ZO_ERR_CHECKSUM);
    remove(path);
    assert_int_equal(offload_load(rt, dir, NULL), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "manifest.json: missing"));
    hex[0] = was;
    files_write(path, man, len);
    free(man);
    offload_ckpt_meta got;
    assert_int_equal(offload_load(rt, dir, &got), ZO_OK);
    assert_int_equal(got.data_step, 7);
    assert_int_equal(got.seed, 3);
    ckpt_teardown(rt, &m, dir);
}

/* state.json: every field required, nothing unknown, version 4, and its
 * parameters, blocks and dtype those of the run (a fp16 run resumed from a
 * bf16 checkpoint loaded). */
static void test_ckpt_state_strict(void **state)
{
    (void)state;
    stub m;
    char dir[400], path[700];
    offload_t *rt = ckpt_setup(&m, ZO_DTYPE_BF16, "strict", dir, sizeof dir);
    offload_ckpt_meta meta = {.data_step = 7, .seed = 18446744073709551615ull};
    assert_int_equal(offload_save(rt, dir, &meta, NULL, NULL), ZO_OK);
    offload_ckpt_meta got;
    assert_int_equal(offload_load(rt, dir, &got), ZO_OK);
    assert_true(got.seed == 18446744073709551615ull); /* exact: a string in the file */
    snprintf(path, sizeof path, "%s/step-00000000/state.json", dir);
    size_t len;
    char *saved = slurp_file(path, &len);
    const char *fields[] = {"format", "version", "step", "loss_scale", "good_steps", "skipped",
                            "skipped_in_a_row", "params", "blocks", "dtype", "data_rows", "batch", "seed"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        cJSON *o = cJSON_Parse(saved);
        assert_non_null(o);
        cJSON_DeleteItemFromObjectCaseSensitive(o, fields[i]);
        char *text = cJSON_Print(o);
        cJSON_Delete(o);
        files_write(path, text, strlen(text));
        free(text);
        assert_int_equal(offload_load(rt, dir, NULL), ZO_ERR_FORMAT);
        if (!strstr(zo_last_error(), fields[i])) {
            fprintf(stderr, "state.json without \"%s\": %s\n", fields[i], zo_last_error());
            fail();
        }
    }
    struct {
        const char *key, *value, *said;
    } bad[] = {
        {"version", "2", "version"}, {"dtype", "\"fp16\"", "fp16"}, {"blocks", "5", "blocks"},
        {"seed", "\"-1\"", "seed"}, {"skipped_in_a_row", "-1", "skipped_in_a_row"},
        {"extra", "1", "extra"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *o = cJSON_Parse(saved);
        cJSON_DeleteItemFromObjectCaseSensitive(o, bad[i].key);
        cJSON_AddItemToObject(o, bad[i].key, cJSON_Parse(bad[i].value));
        char *text = cJSON_Print(o);
        cJSON_Delete(o);
        files_write(path, text, strlen(text));
        free(text);
        zo_status st = offload_load(rt, dir, NULL);
        if (st == ZO_OK || !strstr(zo_last_error(), bad[i].said)) {
            fprintf(stderr, "state.json %s = %s: %s (%s)\n", bad[i].key, bad[i].value,
                    zo_status_name(st), zo_last_error());
            fail();
        }
    }
    files_write(path, saved, len);
    free(saved);
    offload_free(rt);
    /* the same checkpoint into a fp16 run: refused, naming both */
    rt = stub_runtime(&m, ZO_DTYPE_F16, NULL);
    assert_int_equal(offload_load(rt, dir, NULL), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "a checkpoint of a bf16 run; this run trains in fp16"));
    ckpt_teardown(rt, &m, dir);
}

/* state.json's batch shape: saved and loaded as given, null when none is
 * given, checked (its global batch the product of the rest); a version-3
 * state.json (its data position "data_step" in micro-batches, no shape) is
 * read as it was written, its version said. */
static void test_ckpt_state_batch(void **state)
{
    (void)state;
    stub m;
    char dir[400], ck[500], path[700];
    offload_t *rt = ckpt_setup(&m, ZO_DTYPE_BF16, "batch", dir, sizeof dir);
    offload_ckpt_meta meta = {.data_step = 24, .seed = 5, .batch = {.micro_batch = 2, .grad_accum = 3, .ranks = 2, .seq = 16}};
    assert_int_equal(offload_save(rt, dir, &meta, NULL, NULL), ZO_OK);
    offload_ckpt_meta got;
    assert_int_equal(offload_load(rt, dir, &got), ZO_OK);
    assert_int_equal(got.state_version, 4);
    assert_int_equal(got.data_step, 24);
    assert_int_equal(got.batch.micro_batch, 2);
    assert_int_equal(got.batch.grad_accum, 3);
    assert_int_equal(got.batch.ranks, 2);
    assert_int_equal(got.batch.seq, 16);
    snprintf(ck, sizeof ck, "%s/step-00000000", dir);
    snprintf(path, sizeof path, "%s/state.json", ck);
    char *text = files_read_text(path);
    assert_non_null(strstr(text, "\"global_batch\":\t12"));
    free(text);
    ckpt_layout lay = {.blocks = NB, .params = NB * NUMEL, .dtype = ZO_DTYPE_BF16, .state_version = CKPT_STATE_VERSION};
    const char *names[] = {"optimizer.safetensors", "state.json"};
    /* a global batch that is not the product of the rest */
    set_state_field(path, "global_batch", "13");
    assert_int_equal(ckpt_manifest_write(ck, &lay, names, 2), ZO_OK);
    assert_int_equal(offload_load(rt, dir, NULL), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "\"batch.global_batch\" = 13 is not micro_batch 2 x grad_accum 3 x ranks 2"));
    /* no shape given: null, loaded as 0s */
    meta = (offload_ckpt_meta){.data_step = 7, .seed = 5};
    assert_int_equal(offload_save(rt, dir, &meta, NULL, NULL), ZO_OK);
    assert_int_equal(offload_load(rt, dir, &got), ZO_OK);
    assert_int_equal(got.batch.micro_batch, 0);
    assert_int_equal(got.batch.seq, 0);
    /* a version-3 checkpoint, as the runtime wrote it before */
    const char *v3 = "{\"format\": \"zoffload-train-state\", \"version\": 3, \"step\": 0, \"loss_scale\": 1, "
                     "\"good_steps\": 0, \"skipped\": 0, \"skipped_in_a_row\": 0, \"params\": %d, "
                     "\"blocks\": %d, \"dtype\": \"bf16\", \"data_step\": 6, \"seed\": \"9\"}";
    char buf[1024];
    snprintf(ck, sizeof ck, "%s/step-00000000.1", dir);
    snprintf(path, sizeof path, "%s/state.json", ck);
    snprintf(buf, sizeof buf, v3, NB * NUMEL, NB);
    files_write_text(path, buf);
    lay.state_version = 3;
    assert_int_equal(ckpt_manifest_write(ck, &lay, names, 2), ZO_OK);
    assert_int_equal(offload_load(rt, dir, &got), ZO_OK);
    assert_int_equal(got.state_version, 3);
    assert_int_equal(got.data_step, 6);
    assert_int_equal(got.seed, 9);
    assert_int_equal(got.batch.micro_batch, 0);
    /* version 3 with version 4's fields, or the manifest's version another */
    snprintf(buf, sizeof buf, v3, NB * NUMEL, NB);
    strcpy(strstr(buf, "\"data_step\""), "\"data_rows\": 6, \"seed\": \"9\"}");
    files_write_text(path, buf);
    assert_int_equal(ckpt_manifest_write(ck, &lay, names, 2), ZO_OK);
    assert_int_equal(offload_load(rt, dir, NULL), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "unknown field \"data_rows\""));
    snprintf(buf, sizeof buf, v3, NB * NUMEL, NB);
    files_write_text(path, buf);
    lay.state_version = 4;
    assert_int_equal(ckpt_manifest_write(ck, &lay, names, 2), ZO_OK);
    assert_int_equal(offload_load(rt, dir, NULL), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "state version 4"));
    ckpt_teardown(rt, &m, dir);
}

/* At "before-rename": the save's temporary folder moved away and a link to
 * another folder (hook_user: "DIR\nTARGET") put at its name. */
static void swap_tmp_hook(void *user, const char *point)
{
    if (strcmp(point, "before-rename")) return;
    char dir[400], target[400], from[900], to[900];
    assert_int_equal(sscanf(user, "%399[^\n]\n%399s", dir, target), 2);
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, ".tmp-", 5)) {
            snprintf(from, sizeof from, "%s/%s", dir, de->d_name);
            snprintf(to, sizeof to, "%s/moved", dir);
            assert_int_equal(rename(from, to), 0);
            assert_int_equal(symlink(target, from), 0);
        }
    closedir(d);
}

/* The checkpoint's folders are made 0777 less the umask (a group's shared
 * folder gets group-writable checkpoints; they were 0755 whatever the
 * umask), and the temporary folder is known by its descriptor: one moved
 * away mid-save with a link to another folder put at its name is not
 * published (the link was renamed to step-N and `latest` named it: the next
 * resume read whatever the link pointed to). */
static void test_ckpt_tmp_dir(void **state)
{
    (void)state;
    stub m;
    char dir[400], p[900], outside[400], spec[900];
    offload_t *rt = ckpt_setup(&m, ZO_DTYPE_BF16, "tmpdir", dir, sizeof dir);
    files_remove_tree(dir);
    mode_t old = umask(0002);
    zo_status st = offload_save(rt, dir, NULL, NULL, NULL);
    umask(old);
    assert_int_equal(st, ZO_OK);
    struct stat sb;
    assert_int_equal(stat(dir, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0775);
    snprintf(p, sizeof p, "%s/step-00000000", dir);
    assert_int_equal(stat(p, &sb), 0);
    printf("  umask 002: the folder and the checkpoint are %o\n", (unsigned)(sb.st_mode & 0777));
    assert_int_equal(sb.st_mode & 0777, 0775);
    offload_free(rt);

    snprintf(outside, sizeof outside, "%s/tmpdir-outside", tmp_dir);
    files_remove_tree(outside);
    assert_int_equal(mkdir(outside, 0755), 0);
    snprintf(spec, sizeof spec, "%s\n%s", dir, outside);
    offload_config c;
    offload_config_defaults(&c);
    c.ckpt_hook = swap_tmp_hook;
    c.ckpt_hook_user = spec;
    rt = stub_runtime(&m, ZO_DTYPE_BF16, &c);
    st = offload_save(rt, dir, NULL, NULL, NULL);
    printf("  a link put at the temporary folder's name: %s\n", zo_last_error());
    assert_int_equal(st, ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "/.tmp-step-00000000.1: no longer the folder this save made (a link "
                                            "put in its place while it was written)"));
    /* the latest is the earlier checkpoint; the link is left, not followed */
    snprintf(p, sizeof p, "%s/latest", dir);
    char *latest = files_read_text(p);
    assert_string_equal(latest, "step-00000000\n");
    free(latest);
    snprintf(p, sizeof p, "%s/step-00000000.1", dir);
    assert_int_not_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/.tmp-step-00000000.1", dir);
    assert_int_equal(lstat(p, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    DIR *d = opendir(outside);
    assert_non_null(d);
    int entries = 0;
    for (struct dirent *de; (de = readdir(d));) entries += de->d_name[0] != '.';
    closedir(d);
    assert_int_equal(entries, 0);
    offload_ckpt_meta got;
    assert_int_equal(offload_load(rt, dir, &got), ZO_OK);
    ckpt_teardown(rt, &m, dir);
    files_remove_tree(outside);
}

/* Non-finite values are refused at every door: a weight set with
 * offload_set_block, a master or moment in a checkpoint (even one whose
 * checksums match), naming the block or tensor and element. */
static void test_nonfinite_weights(void **state)
{
    (void)state;
    stub m;
    stub_open(&m);
    offload_t *rt = stub_runtime(&m, ZO_DTYPE_BF16, NULL);
    static float w[NB * NUMEL], back[NUMEL];
    stub_weights(w); /* block 2 is w's first NUMEL values */
    w[77] = NAN;
    assert_int_equal(offload_set_block(rt, 2, w), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "block 2 element 77"));
    w[77] = INFINITY;
    assert_int_equal(offload_set_block(rt, 2, w), ZO_ERR_INVALID);
    assert_int_equal(offload_get_block(rt, 2, back), ZO_OK);
    assert_true(isfinite(back[77])); /* nothing changed */
    char dir[400], ck[500], path[700];
    snprintf(dir, sizeof dir, "%s/nonfinite", tmp_dir);
    assert_int_equal(offload_save(rt, dir, NULL, NULL, NULL), ZO_OK);
    snprintf(ck, sizeof ck, "%s/step-00000000", dir);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", ck);
    struct {
        const char *tensor;
        float value;
    } bad[] = {{"block.1.master", NAN}, {"block.3.exp_avg", -INFINITY}, {"block.0.exp_avg_sq", -1.0f}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t len;
        char *orig = slurp_file(path, &len);
        model_st_file f;
        assert_int_equal(model_st_open(&f, path), ZO_OK);
        const model_st_tensor *t = model_st_find(&f, bad[i].tensor);
        assert_non_null(t);
        size_t at = f.data_start + t->begin + 5 * 4;
        model_st_close(&f);
        char *copy = malloc(len);
        memcpy(copy, orig, len);
        memcpy(copy + at, &bad[i].value, 4);
        files_write(path, copy, len);
        free(copy);
        /* signed again, as a checkpoint saved that way would be */
        ckpt_layout lay = {.blocks = NB, .params = NB * NUMEL, .dtype = ZO_DTYPE_BF16,
                           .state_version = CKPT_STATE_VERSION};
        const char *names[] = {"optimizer.safetensors", "state.json"};
        assert_int_equal(ckpt_manifest_write(ck, &lay, names, 2), ZO_OK);
        zo_status st = offload_load(rt, dir, NULL);
        assert_int_equal(st, ZO_ERR_FORMAT);
        char want[64];
        snprintf(want, sizeof want, "\"%s\" element 5", bad[i].tensor);
        if (!strstr(zo_last_error(), want)) {
            fprintf(stderr, "%s\n", zo_last_error());
            fail();
        }
        files_write(path, orig, len);
        free(orig);
    }
    ckpt_teardown(rt, &m, dir);
}

/* Gradients that are not finite: without a loss scale to lower (bf16) the
 * step fails naming the block; with fp16 scaling, skipped steps halve the
 * scale up to max_skipped_steps in a row, then the step fails; at scale 1
 * it fails at once. Nothing is updated either way (every step was
 * "overflow: skipped", forever, and the run ended with exit 0). */
static void test_nonfinite_gradients(void **state)
{
    (void)state;
    stub m;
    stub_open(&m);
    gpu_stream_t s;
    assert_int_equal(gpu_stream_create(m.dev, &s), ZO_OK);
    static float before[NUMEL], after[NUMEL];
    offload_step_info info;

    offload_t *rt = stub_runtime(&m, ZO_DTYPE_BF16, NULL);
    assert_int_equal(offload_get_block(rt, 2, before), ZO_OK);
    m.nan_block = 2;
    assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
    assert_int_equal(offload_step(rt, &info), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "gradients of block 2 hold inf or nan"));
    assert_non_null(strstr(zo_last_error(), "in bf16 there is no loss scale to lower"));
    assert_int_equal(offload_get_block(rt, 2, after), ZO_OK);
    assert_memory_equal(before, after, sizeof before);
    /* a good step after it trains */
    m.nan_block = -1;
    assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
    assert_int_equal(offload_step(rt, &info), ZO_OK);
    assert_int_equal(info.step, 1);
    offload_free(rt);

    offload_config c;
    offload_config_defaults(&c);
    c.loss_scale = 1024;
    c.max_skipped_steps = 3;
    rt = stub_runtime(&m, ZO_DTYPE_F16, &c);
    m.nan_block = 1;
    for (int k = 0; k < 3; k++) {
        assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
        assert_int_equal(offload_step(rt, &info), ZO_OK);
        assert_int_equal(info.skipped, 1);
        assert_true(offload_loss_scale(rt) == 1024.0f / (float)(2 << k));
    }
    assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
    assert_int_equal(offload_step(rt, &info), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "block 1"));
    assert_non_null(strstr(zo_last_error(), "3 steps in a row"));
    offload_free(rt);
    /* at scale 1 nothing is left to lower */
    c.loss_scale = 1;
    rt = stub_runtime(&m, ZO_DTYPE_F16, &c);
    assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
    assert_int_equal(offload_step(rt, &info), ZO_ERR_INVALID);
    assert_non_null(strstr(zo_last_error(), "already 1"));
    offload_free(rt);

    /* the optimizer's schedules: the same error, from the step on the host
     * thread, naming the block, whether the updates would run after the norm
     * (overlap with clipping, dpu) or had started during backward (overlap
     * without clipping: the block's own update never starts); the next good
     * step trains */
    const struct {
        offload_schedule sched;
        float clip;
        const char *tail;
    } sc[] = {
        {OFFLOAD_SCHEDULE_OVERLAP, 1.0f, "nothing was updated"},
        {OFFLOAD_SCHEDULE_OVERLAP, 0.0f, "had started (schedule overlap without exact clipping)"},
        {OFFLOAD_SCHEDULE_DPU, 1.0f, "nothing was updated"},
    };
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) {
        offload_config_defaults(&c);
        c.schedule = sc[i].sched;
        c.adam.clip = sc[i].clip;
        rt = stub_runtime(&m, ZO_DTYPE_BF16, &c);
        assert_int_equal(offload_get_block(rt, 2, before), ZO_OK);
        m.nan_block = 2;
        assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
        assert_int_equal(offload_step(rt, &info), ZO_ERR_INVALID);
        if (!strstr(zo_last_error(), "gradients of block 2 hold inf or nan") || !strstr(zo_last_error(), sc[i].tail))
            fail_msg("schedule %s, clip %g: %s", offload_schedule_name(sc[i].sched), (double)sc[i].clip,
                     zo_last_error());
        assert_int_equal(offload_get_block(rt, 2, after), ZO_OK);
        assert_memory_equal(before, after, sizeof before);
        m.nan_block = -1;
        assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
        assert_int_equal(offload_step(rt, &info), ZO_OK);
        assert_int_equal(info.step, 1);
        offload_free(rt);
    }
    /* the optimizer on the device, whole (its gradients' sum of squares
     * taken there: a sum that is not finite is what sends it looking for
     * the block) and beside a host share (the device blocks summed on the
     * host, bit for bit as the host's own); the block in either share */
    const struct {
        double dev;
        int block;
    } dv[] = {{1.0, 2}, {1.0, 0}, {0.5, 2}, {0.5, 0}};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) {
        offload_config_defaults(&c);
        c.opt_frac[OFFLOAD_DEVICE] = dv[i].dev;
        c.opt_frac[OFFLOAD_CPU] = 1.0 - dv[i].dev;
        rt = stub_runtime(&m, ZO_DTYPE_BF16, &c);
        assert_int_equal(offload_get_block(rt, dv[i].block, before), ZO_OK);
        m.nan_block = dv[i].block;
        assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
        assert_int_equal(offload_step(rt, &info), ZO_ERR_INVALID);
        char want[64];
        snprintf(want, sizeof want, "gradients of block %d hold inf or nan", dv[i].block);
        if (!strstr(zo_last_error(), want))
            fail_msg("device share %g, block %d: %s", dv[i].dev, dv[i].block, zo_last_error());
        assert_int_equal(offload_get_block(rt, dv[i].block, after), ZO_OK);
        assert_memory_equal(before, after, sizeof before);
        m.nan_block = -1;
        assert_int_equal(offload_micro_batch(rt, s), ZO_OK);
        assert_int_equal(offload_step(rt, &info), ZO_OK);
        offload_free(rt);
    }
    gpu_stream_destroy(s);
    stub_close(&m);
}

static int exists(const char *dir, const char *name)
{
    char p[800];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return lstat(p, &sb) == 0;
}

/* Rotation removes only what the runtime wrote, never through a link: a
 * user's step-best folder, a link named like a checkpoint (and the folder
 * it points to) and a link named like a save's leftovers stay untouched;
 * the newest keep_checkpoints are kept (the rotation emptied step-best and
 * the link's target). */
static void test_ckpt_rotation(void **state)
{
    (void)state;
    char dir[400], mine[400], p[800];
    snprintf(dir, sizeof dir, "%s/rot", tmp_dir);
    snprintf(mine, sizeof mine, "%s/users-own", tmp_dir);
    files_remove_tree(dir);
    files_remove_tree(mine);
    assert_int_equal(mkdir(dir, 0755), 0);
    assert_int_equal(mkdir(mine, 0755), 0);
    snprintf(p, sizeof p, "%s/keep.txt", mine);
    files_write_text(p, "precious");
    snprintf(p, sizeof p, "%s/step-best", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/step-best/notes.txt", dir);
    files_write_text(p, "mine");
    const char *links[] = {"step-00000009", ".tmp-step-00000000.3", "step-00000000.9x"};
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, links[i]);
        assert_int_equal(symlink(mine, p), 0);
    }
    stub m;
    stub_open(&m);
    offload_config c;
    offload_config_defaults(&c);
    c.keep_checkpoints = 2;
    offload_t *rt = stub_runtime(&m, ZO_DTYPE_BF16, &c);
    for (int k = 0; k < 4; k++) assert_int_equal(offload_save(rt, dir, NULL, NULL, NULL), ZO_OK);
    /* names grow past anything named step-00000000.<k> (the .3 link): the
     * latest and the next newest are kept, and both load */
    assert_true(exists(dir, "step-00000000.6") && exists(dir, "step-00000000.7"));
    assert_false(exists(dir, "step-00000000.4") || exists(dir, "step-00000000.5") ||
                 exists(dir, "step-00000000"));
    snprintf(p, sizeof p, "%s/step-00000000.6", dir);
    assert_int_equal(offload_load(rt, p, NULL), ZO_OK);
    assert_int_equal(offload_load(rt, dir, NULL), ZO_OK);
    snprintf(p, sizeof p, "%s/latest", dir);
    size_t len;
    char *latest = slurp_file(p, &len);
    assert_string_equal(latest, "step-00000000.7\n");
    free(latest);
    /* the user's things */
    snprintf(p, sizeof p, "%s/step-best/notes.txt", dir);
    assert_int_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/keep.txt", mine);
    assert_int_equal(access(p, F_OK), 0);
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) assert_true(exists(dir, links[i]));
    /* a `latest` pointing out of the folder is refused */
    snprintf(p, sizeof p, "%s/latest", dir);
    files_write_text(p, "../users-own\n");
    assert_int_equal(offload_load(rt, dir, NULL), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "not a checkpoint's name"));
    ckpt_teardown(rt, &m, dir);
    files_remove_tree(mine);
}

/* One runtime per checkpoint folder: a second is refused at init, naming the
 * folder and the holder, and so is a save into a folder another holds (two
 * runs removed each other's temporary folders). */
static void test_ckpt_lock(void **state)
{
    (void)state;
    char dir[400], want[64];
    snprintf(dir, sizeof dir, "%s/locked", tmp_dir);
    stub m;
    stub_open(&m);
    offload_model om = stub_model(&m);
    offload_config c;
    offload_config_defaults(&c);
    c.ckpt_dir = dir;
    offload_t *a, *b;
    assert_int_equal(offload_init(&a, m.dev, &om, &c), ZO_OK);
    assert_int_equal(offload_init(&b, m.dev, &om, &c), ZO_ERR_BUSY);
    assert_null(b);
    assert_non_null(strstr(zo_last_error(), dir));
    snprintf(want, sizeof want, "(pid %ld on host ", (long)getpid());
    assert_non_null(strstr(zo_last_error(), want));
    c.ckpt_dir = NULL;
    b = stub_runtime(&m, ZO_DTYPE_BF16, &c);
    assert_int_equal(offload_save(b, dir, NULL, NULL, NULL), ZO_ERR_BUSY);
    offload_free(a);
    assert_int_equal(offload_save(b, dir, NULL, NULL, NULL), ZO_OK);
    offload_free(b);
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
#ifdef ZO_TRAIN_BIN
/* A small LLaMA run in tmp_dir/NAME (dir[400], cfg[500] and data[500]):
 * config.json (4 heads, 2 of keys and values, ffn 2 x hidden, 256 byte
 * tokens, hidden positions) and text.txt. */
static void llama_run_files(const char *name, int layers, int hidden, char *dir, char *cfg, char *data)
{
    char text[400];
    snprintf(dir, 400, "%s/%s", tmp_dir, name);
    mkdir(dir, 0755);
    snprintf(cfg, 500, "%s/config.json", dir);
    snprintf(data, 500, "%s/text.txt", dir);
    snprintf(text, sizeof text,
             "{\"model_type\": \"llama\", \"num_hidden_layers\": %d, \"hidden_size\": %d, "
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": %d, "
             "\"vocab_size\": 256, \"max_position_embeddings\": %d}",
             layers, hidden, 2 * hidden, hidden);
    files_write_text(cfg, text);
    files_write_sample_text(data, 3000);
}

/* One set of flags (issue 27): every row of memplan estimate's "fits with"
 * list (--params cpu --grads cpu --optimizer cpu --checkpoints cpu,
 * --recompute full, --lora R --qlora, ...) added as it is printed to train's
 * command line runs within the device capacity memplan was given; train
 * checks --grads against --optimizer as memplan plans them, names the flag
 * as given (the deprecated --params-on and --optimizer-on still work), and
 * every program says its --version. */
static void test_memplan_advice_runs(void **state)
{
    (void)state;
    char dir[400], cfg[500], data[500], cmd[3000], args[3000];
    static char out[1 << 18];
    llama_run_files("advice", 8, 128, dir, cfg, data);
    snprintf(cmd, sizeof cmd,
             "%s estimate --model %s --gpu-mem 6MiB --cpu-mem 1GiB --nvme 1GiB --seq 64 --micro-batch 2 --dtype fp32 "
             "--cuda-context 0 --cublas-workspace 0 --fragmentation 0 --json",
             ZO_MEMPLAN_BIN, cfg);
    assert_int_equal(run_capture(cmd, out, sizeof out), 1); /* full fine-tuning does not fit */
    cJSON *doc = cJSON_Parse(out);
    assert_non_null(doc);
    const cJSON *rows = cJSON_GetObjectItem(doc, "suggestions"); /* the "fits with" list */
    assert_true(cJSON_GetArraySize(rows) >= 4);
    int seen_all = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows)
    {
        const char *flags = cJSON_GetObjectItem(row, "flags")->valuestring;
        seen_all |= strstr(flags, "--params cpu") && strstr(flags, "--grads cpu") && strstr(flags, "--optimizer cpu");
        snprintf(args, sizeof args,
                 "--model %s --data %s --text --steps 1 --threads 1 --seq 64 --micro-batch 2 --dtype fp32 --device-mem 6MiB "
                 "--nvme-dir %s %s",
                 cfg, data, dir, flags);
        int rc = run_train(args, out, sizeof out);
        printf("  train ... %s: exit %d\n", flags, rc);
        if (rc) fprintf(stderr, "%s\n", out);
        assert_int_equal(rc, 0);
    }
    cJSON_Delete(doc);
    assert_true(seen_all);
    /* --grads against --optimizer; the flag named as given */
    const struct {
        const char *flags, *want;
    } bad[] = {
        {"--grads gpu --optimizer cpu", "--grads gpu with the optimizer on cpu=1 (--optimizer)"},
        {"--grads cpu --optimizer gpu", "--grads cpu with the optimizer on gpu"},
        {"--grads nvme", "--grads: "},
        {"--params disk", "--params: "},
        {"--params-on disk", "--params-on: "},
        {"--optimizer cpu=2", "--optimizer: "},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "--model %s --data %s --text --steps 1 --threads 1 %s", cfg, data, bad[i].flags);
        int rc = run_train(args, out, sizeof out);
        if (rc != 2 || !strstr(out, bad[i].want)) fprintf(stderr, "%s: exit %d\n%s\n", bad[i].flags, rc, out);
        assert_int_equal(rc, 2);
        assert_non_null(strstr(out, bad[i].want));
    }
    /* memplan's names for every kind of state, --checkpoints included */
    snprintf(args, sizeof args,
             "--model %s --data %s --text --steps 1 --threads 1 --seq 64 --micro-batch 2 --dtype fp32 --device-mem 6MiB "
             "--recompute full --params cpu --grads cpu --optimizer cpu --checkpoints cpu --nvme-dir %s",
             cfg, data, dir);
    assert_int_equal(run_train(args, out, sizeof out), 0);
    assert_non_null(strstr(out, "checkpoints cpu"));
    /* memplan plan --method qlora: a plan file train runs as written */
    snprintf(cmd, sizeof cmd,
             "%s plan --model %s --gpu-mem 6MiB --cpu-mem 1GiB --nvme 1GiB --seq 64 --global-batch 2 --dtype fp32 "
             "--cuda-context 0 --cublas-workspace 0 --fragmentation 0 --method qlora --top 1 --json-out %s/q.json",
             ZO_MEMPLAN_BIN, cfg, dir);
    assert_int_equal(run_capture(cmd, out, sizeof out), 0);
    snprintf(args, sizeof args, "--model %s --data %s --text --steps 1 --threads 1 --plan %s/q.json --nvme-dir %s", cfg,
             data, dir, dir);
    int qrc = run_train(args, out, sizeof out);
    if (qrc || !strstr(out, "QLoRA")) fprintf(stderr, "%s\n", out);
    assert_int_equal(qrc, 0);
    /* the deprecated spellings run as before */
    snprintf(args, sizeof args,
             "--model %s --data %s --text --steps 1 --threads 1 --seq 64 --micro-batch 2 --params-on cpu "
             "--optimizer-on cpu=0.5,nvme=0.5 --checkpoints-on gpu --nvme-dir %s",
             cfg, data, dir);
    assert_int_equal(run_train(args, out, sizeof out), 0);
    assert_non_null(strstr(out, "weights cpu"));
    /* --version: one line, exit 0, in memplan, train, tokenize and plot
     * (the last two built beside train) */
    const char *progs[][2] = {{ZO_MEMPLAN_BIN, "memplan"}, {ZO_TRAIN_BIN, "train"}, {"tokenize", "tokenize"},
                              {"plot", "plot"}};
    char bin[600];
    snprintf(bin, sizeof bin, "%s", ZO_TRAIN_BIN);
    *strrchr(bin, '/') = '\0';
    for (int i = 0; i < 4; i++) {
        if (i < 2) snprintf(cmd, sizeof cmd, "%s --version", progs[i][0]);
        else snprintf(cmd, sizeof cmd, "%s/%s --version", bin, progs[i][0]);
        assert_int_equal(run_capture(cmd, out, sizeof out), 0);
        char want[64];
        snprintf(want, sizeof want, "%s (zoffload) ", progs[i][1]);
        assert_ptr_equal(strstr(out, want), out);
        assert_non_null(strstr(out, "plan format zoffload-plan"));
    }
    files_remove_tree(dir);
}
#endif

#ifdef ZO_TRAIN_BIN
/* Planning for the CPU device (issue 27): `memplan --hw cpu` sizes train
 * --device cpu, with no CUDA context, no cuBLAS workspace and no allocator
 * slack to zero by hand, the host a preset's (--host); train --plan runs
 * the plan within 3% of its device and host peaks. */
static void test_plan_hw_cpu(void **state)
{
    (void)state;
    char dir[400], cfg[500], data[500], plan[500], cmd[3000];
    static char out[1 << 16];
    llama_run_files("hwcpu", 4, 64, dir, cfg, data);
    snprintf(plan, sizeof plan, "%s/plan.json", dir);
    const char *flags[] = {"", "--params cpu --grads cpu --optimizer cpu=0.5,nvme=0.5 --host workstation"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd,
                 "%s estimate --hw cpu --gpu-mem 32MiB --model %s --seq 32 --micro-batch 2 --dtype fp32 --no-dropout "
                 "%s --plan-out %s",
                 ZO_MEMPLAN_BIN, cfg, flags[i], plan);
        int rc = run_capture(cmd, out, sizeof out);
        if (rc) fprintf(stderr, "%s\n", out);
        assert_int_equal(rc, 0);
        assert_non_null(strstr(out, "train --device cpu"));
        zo_plan p;
        assert_int_equal(zo_plan_load(plan, &p), ZO_OK);
        assert_string_equal(p.hardware.gpu, "CPU");
        assert_true(p.buffers.cuda_context == 0 && p.buffers.cublas_workspace == 0);
        assert_true(p.buffers.fragmentation == 0);
        assert_true(p.hardware.gpu_mem == 32u << 20);
        snprintf(cmd, sizeof cmd, "--model %s --data %s --text --plan %s --device cpu --steps 2 --threads 1 --nvme-dir %s",
                 cfg, data, plan, dir);
        rc = run_train(cmd, out, sizeof out);
        if (rc) fprintf(stderr, "%s\n", out);
        assert_int_equal(rc, 0);
        const char *line = strstr(out, "# peak bytes per tier: ");
        assert_non_null(line);
        const char *nl = strchr(line, '\n');
        int n = 0;
        for (const char *pl = strstr(line, "(plan "); pl && pl < nl; pl = strstr(pl + 1, "(plan ")) {
            double pct = atof(strchr(pl, ',') + 1);
            printf("  --hw cpu %s: %.1f%% of the plan\n", flags[i], pct);
            if (!(pct > 97 && pct < 103)) fail_msg("%.*s", (int)(nl - line), line);
            n++;
        }
        assert_true(n >= 2);
    }
    /* --host goes with --gpu or --hw cpu; an unknown host is named */
    snprintf(cmd, sizeof cmd, "%s estimate --hw h100-80gb --host workstation --model %s 2>&1", ZO_MEMPLAN_BIN, cfg);
    assert_int_equal(run_capture(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "%s estimate --hw cpu --host nothere --model %s 2>&1", ZO_MEMPLAN_BIN, cfg);
    assert_int_equal(run_capture(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "nothere"));
    files_remove_tree(dir);
}
#endif

#ifdef ZO_TRAIN_BIN
/* Files for a tiny GPT-2 run in `dir`: config.json and text.txt. */
static void tiny_run_files(const char *dir, char *cfg, char *data, size_t len)
{
    snprintf(cfg, len, "%s/config.json", dir);
    snprintf(data, len, "%s/text.txt", dir);
    FILE *f = fopen(data, "w");
    assert_non_null(f);
    for (int i = 0; i < 200; i++) fprintf(f, "the quick brown fox %d. ", i % 10);
    fclose(f);
    files_write_text(cfg, "{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_embd\": 32, \"n_head\": 2,"
                    " \"n_positions\": 32, \"vocab_size\": 256}\n");
}


/* predicted.alloc_bytes: what the runtime's allocations reach, which train
 * compares its measured peak with. On a GPU plan it is the peak less the
 * CUDA context, the cuBLAS workspace and the fragmentation allowance (a
 * fraction of everything before it); on the CPU backend, the peak. train
 * prints the allocations' figure and percentage, then the plan's total where
 * it is larger; a plan written before the field compares with the peak. */
static void test_plan_alloc_bytes(void **state)
{
    (void)state;
    char dir[400], cfg[500], data[500], plan[500], edited[500], stats[500], cmd[3000];
    static char out[1 << 16];
    llama_run_files("alloc", 4, 64, dir, cfg, data);
    snprintf(plan, sizeof plan, "%s/plan.json", dir);
    snprintf(edited, sizeof edited, "%s/edited.json", dir);
    snprintf(stats, sizeof stats, "%s/stats.json", dir);
    zo_plan p;
    /* a GPU plan */
    snprintf(cmd, sizeof cmd, "%s estimate --hw h100-80gb --model %s --seq 32 --micro-batch 2 --plan-out %s",
             ZO_MEMPLAN_BIN, cfg, plan);
    assert_int_equal(run_capture(cmd, out, sizeof out), 0);
    assert_int_equal(zo_plan_load(plan, &p), ZO_OK);
    assert_true(p.predicted.has_alloc);
    const double ctx = (double)p.buffers.cuda_context + (double)p.buffers.cublas_workspace;
    const double alloc = (double)p.predicted.alloc_bytes[ZO_PLAN_GPU];
    const double want_peak = (alloc + ctx) * (1.0 + p.buffers.fragmentation);
    printf("  h100 plan: allocations %.0f, peak %llu (context and workspace %.0f, allowance %.2f)\n", alloc,
           (unsigned long long)p.predicted.peak_bytes[ZO_PLAN_GPU], ctx, p.buffers.fragmentation);
    assert_true(ctx > 0 && p.buffers.fragmentation > 0);
    assert_true(fabs((double)p.predicted.peak_bytes[ZO_PLAN_GPU] - want_peak) <= 2.0);
    assert_true(p.predicted.alloc_bytes[ZO_PLAN_CPU] == p.predicted.peak_bytes[ZO_PLAN_CPU]);
    assert_true(p.predicted.alloc_bytes[ZO_PLAN_NVME] == p.predicted.peak_bytes[ZO_PLAN_NVME]);
    /* a CPU-backend plan: nothing reserved */
    snprintf(cmd, sizeof cmd,
             "%s estimate --hw cpu --gpu-mem 32MiB --model %s --seq 32 --micro-batch 2 --dtype fp32 --no-dropout "
             "--plan-out %s",
             ZO_MEMPLAN_BIN, cfg, plan);
    assert_int_equal(run_capture(cmd, out, sizeof out), 0);
    assert_int_equal(zo_plan_load(plan, &p), ZO_OK);
    assert_true(p.predicted.has_alloc);
    for (int t = 0; t < ZO_PLAN_TIERS; t++) assert_true(p.predicted.alloc_bytes[t] == p.predicted.peak_bytes[t]);
    /* the runtime: the same plan with a total 25% above its allocations */
    const uint64_t a = p.predicted.alloc_bytes[ZO_PLAN_GPU], total = a + a / 4;
    char v[32], fa[32], ft[32];
    snprintf(v, sizeof v, "%llu", (unsigned long long)total);
    files_write_plan(edited, &p, "predicted.peak_bytes.gpu", v);
    snprintf(cmd, sizeof cmd, "--model %s --data %s --text --plan %s --device cpu --steps 1 --threads 1 --stats-json %s",
             cfg, data, edited, stats);
    int rc = run_train(cmd, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    const char *line = strstr(out, "# peak bytes per tier: gpu ");
    assert_non_null(line);
    char want[200];
    snprintf(want, sizeof want, "(plan %s, ", zo_format_bytes(a, fa, sizeof fa));
    snprintf(want + strlen(want), sizeof want - strlen(want), "%%; %s with the CUDA context",
             zo_format_bytes(total, ft, sizeof ft));
    const char *pl = strstr(line, "(plan ");
    assert_non_null(pl);
    printf("  %.*s", (int)(strchr(line, '\n') - line + 1), line);
    assert_true(!strncmp(pl, want, strlen(fa) + 8));          /* "(plan A, " */
    assert_non_null(strstr(pl, strchr(want, '%') + 1));      /* "; T with the CUDA context" */
    char *js = files_read_text(stats);
    cJSON *doc = cJSON_Parse(js);
    assert_non_null(doc);
    const cJSON *pb = cJSON_GetObjectItemCaseSensitive(doc, "predicted_bytes"),
                *tb = cJSON_GetObjectItemCaseSensitive(doc, "planned_total_bytes");
    assert_true(cJSON_GetObjectItemCaseSensitive(pb, "gpu")->valuedouble == (double)a);
    assert_true(cJSON_GetObjectItemCaseSensitive(tb, "gpu")->valuedouble == (double)total);
    cJSON_Delete(doc);
    free(js);
    /* a plan without the field: its peak is what the run is compared with */
    files_write_plan(edited, &p, "predicted.alloc_bytes", NULL);
    assert_int_equal(run_train(cmd, out, sizeof out), 0);
    line = strstr(out, "# peak bytes per tier: gpu ");
    assert_non_null(line);
    snprintf(want, sizeof want, "(plan %s, ", zo_format_bytes(p.predicted.peak_bytes[ZO_PLAN_GPU], fa, sizeof fa));
    assert_non_null(strstr(line, want));
    files_remove_tree(dir);
}

/* `timeout 60 train ARGS`: a run that hangs (a FIFO waited on) fails. */
static int run_train_limited(const char *args, char *out, size_t len)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "timeout 60 %s %s 2>&1", ZO_TRAIN_BIN, args);
    return run_capture(cmd, out, len);
}

/* Bad input is exit 2 (memplan's convention; missing files were exit 1),
 * naming the file: a FIFO given for any input (it hung: config, data, eval
 * data, tokenizer, weights, plan, an adapter's config), a missing tokenizer
 * or adapter, a config whose constants or shape make no sense, weights that
 * are not finite, a damaged checkpoint to resume from. */
static void test_train_bad_inputs(void **state)
{
    (void)state;
    char dir[400], cfg[500], data[500], fifo[500], bad[500], args[2500];
    static char out[1 << 16];
    snprintf(dir, sizeof dir, "%s/inputs", tmp_dir);
    files_remove_tree(dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    tiny_run_files(dir, cfg, data, sizeof cfg);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const char *forms[] = {"--model %s --data %s --text", "--model %s --text --data %s",
                           "--model %s --data %s --text --weights %s", "--model %s --data %s --text --plan %s",
                           "--model %s --data %s --tokenizer %s", "--model %s --data %s --text --eval-data %s"};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        const char *a1 = i == 0 ? fifo : cfg, *a2 = i == 1 ? fifo : data;
        char form[200];
        snprintf(form, sizeof form, "%s --steps 1 --threads 1 --seq 16", forms[i]);
        snprintf(args, sizeof args, form, a1, a2, fifo);
        int rc = run_train_limited(args, out, sizeof out);
        if (rc != 2 || !strstr(out, "fifo: not a regular file (a FIFO)")) {
            fprintf(stderr, "train %s: exit %d\n%s\n", args, rc, out);
            fail();
        }
    }
    snprintf(args, sizeof args, "--model %s --data %s/missing.bin --steps 1 --seq 16", cfg, dir);
    assert_int_equal(run_train_limited(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "missing.bin"));
    snprintf(args, sizeof args, "--model %s --data %s --tokenizer %s/missing.json --steps 1 --seq 16", cfg, data, dir);
    assert_int_equal(run_train_limited(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "missing.json"));
    /* a PEFT adapter directory whose config is a FIFO, or missing */
    char adapter[600];
    snprintf(adapter, sizeof adapter, "%s/adapter", dir);
    assert_int_equal(mkdir(adapter, 0755), 0);
    snprintf(args, sizeof args, "--model %s --data %s --text --adapter %s --steps 1 --threads 1 --seq 16", cfg, data,
             adapter);
    assert_int_equal(run_train_limited(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "adapter_config.json"));
    char acfg[700];
    snprintf(acfg, sizeof acfg, "%s/adapter_config.json", adapter);
    assert_int_equal(mkfifo(acfg, 0600), 0);
    assert_int_equal(run_train_limited(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "adapter_config.json: not a regular file (a FIFO)"));

    /* constants and shapes that parse but make no sense */
    struct {
        const char *config, *said;
    } cfgs[] = {
        {"{\"model_type\": \"llama\", \"num_hidden_layers\": 1, \"hidden_size\": 32, "
         "\"num_attention_heads\": 2, \"intermediate_size\": 64, \"vocab_size\": 256, "
         "\"rms_norm_eps\": -1e-6}", "rms_norm_eps"},
        {"{\"model_type\": \"llama\", \"num_hidden_layers\": 1, \"hidden_size\": 32, "
         "\"num_attention_heads\": 2, \"intermediate_size\": 64, \"vocab_size\": 256, "
         "\"rope_theta\": -10000}", "rope_theta"},
        {"{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_embd\": 32, \"n_head\": 2, "
         "\"n_positions\": 32, \"vocab_size\": 256, \"layer_norm_epsilon\": -1e-5}", "layer_norm_epsilon"},
        {"{\"model_type\": \"llama\", \"num_hidden_layers\": 2147483647, \"hidden_size\": 32, "
         "\"num_attention_heads\": 2, \"intermediate_size\": 64, \"vocab_size\": 256}", "layers"},
        {"{\"model_type\": \"llama\", \"num_hidden_layers\": 1, \"hidden_size\": 2147483646, "
         "\"num_attention_heads\": 2, \"intermediate_size\": 64, \"vocab_size\": 256}", "2^53"},
    };
    snprintf(bad, sizeof bad, "%s/bad.json", dir);
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        files_write_text(bad, cfgs[i].config);
        snprintf(args, sizeof args, "--model %s --data %s --text --steps 1 --threads 1 --seq 16", bad, data);
        int rc = run_train_limited(args, out, sizeof out);
        if (rc != 2 || !strstr(out, cfgs[i].said)) {
            fprintf(stderr, "config %zu: exit %d\n%s\n", i, rc, out);
            fail();
        }
    }

    /* weights with a nan: refused naming the tensor (--save writes a Hugging
     * Face folder; the nan goes into its model.safetensors) */
    char w[500], wf[520];
    snprintf(w, sizeof w, "%s/w", dir);
    snprintf(wf, sizeof wf, "%s/model.safetensors", w);
    snprintf(args, sizeof args, "--model %s --data %s --text --steps 1 --threads 1 --seq 16 --dtype fp32 --save %s",
             cfg, data, w);
    assert_int_equal(run_train_limited(args, out, sizeof out), 0);
    model_st_file f;
    assert_int_equal(model_st_open(&f, wf), ZO_OK);
    const model_st_tensor *t = model_st_find(&f, "h.0.mlp.c_fc.weight");
    assert_non_null(t);
    size_t at = f.data_start + t->begin + 4 * 10;
    model_st_close(&f);
    int fd = open(wf, O_RDWR);
    float nan = NAN;
    assert_int_equal(pwrite(fd, &nan, 4, (off_t)at), 4);
    close(fd);
    snprintf(args, sizeof args, "--model %s --data %s --text --steps 1 --threads 1 --seq 16 --weights %s", cfg, data, w);
    assert_int_equal(run_train_limited(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "tensor \"h.0.mlp.c_fc.weight\" element 10 is nan"));

    /* a damaged checkpoint to resume from */
    char ck[500], opt[600];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(args, sizeof args, "--model %s --data %s --text --steps 2 --threads 1 --seq 16 --ckpt %s", cfg, data, ck);
    assert_int_equal(run_train_limited(args, out, sizeof out), 0);
    snprintf(opt, sizeof opt, "%s/step-00000002/optimizer.safetensors", ck);
    fd = open(opt, O_RDWR);
    unsigned char c;
    assert_int_equal(pread(fd, &c, 1, 5000), 1);
    c ^= 0x40;
    assert_int_equal(pwrite(fd, &c, 1, 5000), 1);
    close(fd);
    snprintf(args, sizeof args, "--model %s --data %s --text --steps 3 --threads 1 --seq 16 --resume %s", cfg, data, ck);
    assert_int_equal(run_train_limited(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "optimizer.safetensors: checksum mismatch"));
    assert_null(strstr(out, "step 3 loss"));
    files_remove_tree(dir);
}

/* Swap files in --nvme-dir of the run in progress, by prefix: weights
 * (zo-par), a LoRA run's frozen base (zo-frz), optimizer state (zo-opt). */
static int swap_files(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *de;
    while ((de = readdir(d)))
        n += (!strncmp(de->d_name, "zo-opt-", 7) || !strncmp(de->d_name, "zo-par-", 7) ||
              !strncmp(de->d_name, "zo-frz-", 7)) &&
             strstr(de->d_name, ".swap");
    closedir(d);
    return n;
}

/* `train ARGS` started in the background, paused at the start of its first
 * checkpoint (the test seam); returns its pid. */
static pid_t start_paused(const char *args)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "%s %s", ZO_TRAIN_BIN, args);
    return run_paused(cmd, "begin", 1);
}

/* A second run on a --ckpt folder in use is refused at start (exit 1),
 * naming the folder and the holder. Swap files: a live run's are left alone
 * by another run on the same --nvme-dir; a run stopped by SIGTERM removes
 * its own; a run killed (SIGKILL) leaves them, and the next run removes
 * them (20 of 20 killed runs left theirs, and nothing removed them). */
static void test_train_locks_and_swap_files(void **state)
{
    (void)state;
    char dir[400], cfg[500], data[500], nv[500], ck[500], args[4096], base[2000], want[600];
    static char out[1 << 16];
    snprintf(dir, sizeof dir, "%s/swap", tmp_dir);
    files_remove_tree(dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    tiny_run_files(dir, cfg, data, sizeof cfg);
    snprintf(nv, sizeof nv, "%s/nvme", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    assert_int_equal(mkdir(nv, 0755), 0);
    snprintf(base, sizeof base, "--model %s --data %s --text --steps 2 --threads 1 --seq 16 --params-on nvme "
             "--optimizer-on cpu=0.5,nvme=0.5 --nvme-dir %s", cfg, data, nv);
    snprintf(args, sizeof args, "%s --ckpt %s/probe", base, dir);
    if (run_train_limited(args, out, sizeof out) != 0) {
        if (strstr(out, "nvme module")) skip(); /* a build without liburing */
        fprintf(stderr, "%s\n", out);
        fail();
    }
    assert_int_equal(swap_files(nv), 0);

    snprintf(args, sizeof args, "%s --ckpt %s --save-every 1", base, ck);
    pid_t a = start_paused(args);
    assert_int_equal(swap_files(nv), 2);
    /* the same checkpoint folder: refused, exit 1, naming folder and holder */
    assert_int_equal(run_train_limited(args, out, sizeof out), 1);
    snprintf(want, sizeof want, "%s: the checkpoint folder is in use by another run (pid %ld on host ", ck,
             (long)a);
    if (!strstr(out, want)) {
        fprintf(stderr, "%s\nwanted: %s\n", out, want);
        fail();
    }
    assert_null(strstr(out, "step 1 "));
    /* another folder, the same NVMe folder: runs beside it, leaves its files */
    snprintf(args, sizeof args, "%s --ckpt %s/other --keep-checkpoints 2 --save-every 1 --steps 3", base, dir);
    assert_int_equal(run_train_limited(args, out, sizeof out), 0);
    assert_int_equal(swap_files(nv), 2);
    char p[700];
    snprintf(p, sizeof p, "%s/other", dir);
    assert_true(exists(p, "step-00000002") && exists(p, "step-00000003") && !exists(p, "step-00000001"));
    /* SIGTERM: it stops after its checkpoint, its swap files removed */
    assert_int_equal(kill(a, SIGTERM), 0);
    int ws;
    assert_int_equal(waitpid(a, &ws, 0), a);
    assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGTERM);
    assert_int_equal(swap_files(nv), 0);
    /* SIGKILL leaves them; the next run removes them */
    files_remove_tree(ck);
    snprintf(args, sizeof args, "%s --ckpt %s --save-every 1", base, ck);
    a = start_paused(args);
    assert_int_equal(kill(a, SIGKILL), 0);
    assert_int_equal(waitpid(a, &ws, 0), a);
    assert_int_equal(swap_files(nv), 2);
    /* the killed run held the folder: the lock went with it */
    int rc = run_train_limited(args, out, sizeof out);
    if (rc) fprintf(stderr, "train %s\n=> %s\n", args, out);
    assert_int_equal(rc, 0);
    assert_int_equal(swap_files(nv), 0);

    /* LoRA with the optimizer on its own thread: the frozen base (zo-frz),
     * the adapters (zo-par) and their optimizer state (zo-opt) each in a
     * swap file of its own; SIGTERM removes them, SIGKILL leaves them to the
     * next run */
    files_remove_tree(ck);
    snprintf(args, sizeof args, "%s --ckpt %s --save-every 1 --lora 2 --adapters-on nvme --schedule overlap", base,
             ck);
    a = start_paused(args);
    assert_int_equal(swap_files(nv), 3);
    assert_int_equal(kill(a, SIGTERM), 0);
    assert_int_equal(waitpid(a, &ws, 0), a);
    assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGTERM);
    assert_int_equal(swap_files(nv), 0);
    files_remove_tree(ck);
    a = start_paused(args);
    assert_int_equal(kill(a, SIGKILL), 0);
    assert_int_equal(waitpid(a, &ws, 0), a);
    assert_int_equal(swap_files(nv), 3);
    rc = run_train_limited(args, out, sizeof out);
    if (rc) fprintf(stderr, "train %s\n=> %s\n", args, out);
    assert_int_equal(rc, 0);
    assert_int_equal(swap_files(nv), 0);
    files_remove_tree(dir);
}
#endif

/* The planner's search and the runtime end to end: `memplan plan --json-out` for
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
             "--json-out plan.json --top 1 > /dev/null",
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
    scratch_path(tmp_dir, sizeof tmp_dir, "zo_test_offload_edges_%d", (int)getpid());
    mkdir(tmp_dir, 0755);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ep_partition),
        cmocka_unit_test(test_ep_frozen_range),
        cmocka_unit_test(test_plan_bad_sub_group),
        cmocka_unit_test(test_plan_fractions),
        cmocka_unit_test(test_init_alloc_faults),
        cmocka_unit_test(test_failed_micro_batch),
        cmocka_unit_test(test_dpu_one_step_late),
        cmocka_unit_test(test_ckpt_bad_state),
        cmocka_unit_test(test_ckpt_same_step),
        cmocka_unit_test(test_ckpt_checksums),
        cmocka_unit_test(test_ckpt_state_strict),
        cmocka_unit_test(test_ckpt_state_batch),
        cmocka_unit_test(test_ckpt_tmp_dir),
        cmocka_unit_test(test_nonfinite_weights),
        cmocka_unit_test(test_nonfinite_gradients),
        cmocka_unit_test(test_ckpt_rotation),
        cmocka_unit_test(test_ckpt_lock),
        cmocka_unit_test(test_searched_plan_runs),
#ifdef ZO_TRAIN_BIN
        cmocka_unit_test(test_train_flags),
        cmocka_unit_test(test_memplan_advice_runs),
        cmocka_unit_test(test_plan_hw_cpu),
        cmocka_unit_test(test_plan_alloc_bytes),
        cmocka_unit_test(test_train_bad_inputs),
        cmocka_unit_test(test_train_locks_and_swap_files),
#endif
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(tmp_dir);
    return rc;
}
