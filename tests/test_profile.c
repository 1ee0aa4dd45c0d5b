/* Tests for the op profile (gpu/profile.h) and train --profile:
 * - timed events on the CPU backend: the elapsed time of work that runs a
 *   known time on the stream, and the refusals (a plain event, a record not
 *   complete);
 * - FLOP counts of a GEMM and an attention shape (LLaMA-2-13B's) against
 *   counts written out here product by product;
 * - the profile itself: one row per op, shape class and stream, its calls,
 *   FLOPs and bytes; nothing timed outside a step, and no event created
 *   when no profile is attached (the device's own list of events);
 * - train --profile on a small LLaMA: the table, every op a LLaMA step runs
 *   (QLoRA: the NF4 dequantization too), attention called once per layer
 *   and micro-batch each way, the stats JSON's "profile"; the compute
 *   stream's busy time against the runtime's own count of the host's waits
 *   for the device, from --stats-json's time split (within 5%);
 * - without --profile, train's output and stats JSON are what they were:
 *   no profile lines or member, and the same losses, bit for bit, as with it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/clock.h"     /* defines: zo_now */
#include "gpu/device_impl.h"  /* defines: struct gpu_device (its list of events) */
#include "gpu/profile.h"      /* defines: gpu_profile_start, gpu_gemm_flops, ... */
#include "tests/support/files.h" /* defines: files_write_text, files_read_text, files_remove_tree */
#include "tests/support/run.h"   /* defines: run_capture, run_train_losses */
#include "tests/support/scratch.h" /* defines: scratch_path */

static char dir[64];

static int setup_dir(void **state)
{
    (void)state;
    scratch_path(dir, sizeof dir, "zo_test_profile.XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
    (void)state;
    files_remove_tree(dir);
    return 0;
}

/* ---- timed events -------------------------------------------------------------------------- */

/* Work of a known length on a stream: the host func spins on the clock
 * for 20 ms (the work measured, not a wait for another thread). */
static void spin_20ms(void *arg)
{
    (void)arg;
    double t0 = zo_now();
    while (zo_now() - t0 < 0.020) {
    }
}

static void test_event_elapsed(void **state)
{
    (void)state;
    gpu_device_t dev;
    gpu_stream_t s;
    gpu_event_t a, b, plain;
    assert_int_equal(gpu_device_init_cpu(NULL, &dev), ZO_OK);
    assert_int_equal(gpu_stream_create(dev, &s), ZO_OK);
    assert_int_equal(gpu_event_create_timed(dev, &a), ZO_OK);
    assert_int_equal(gpu_event_create_timed(dev, &b), ZO_OK);
    assert_int_equal(gpu_event_create(dev, &plain), ZO_OK);
    double ms = -1;
    /* never recorded: no time to take */
    assert_int_equal(gpu_event_elapsed(a, b, &ms), ZO_ERR_INVALID);
    double t0 = zo_now();
    assert_int_equal(gpu_event_record(a, s), ZO_OK);
    assert_int_equal(gpu_launch_host_func(s, spin_20ms, NULL), ZO_OK);
    assert_int_equal(gpu_event_record(b, s), ZO_OK);
    assert_int_equal(gpu_event_record(plain, s), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
    double wall = 1e3 * (zo_now() - t0);
    assert_int_equal(gpu_event_elapsed(a, b, &ms), ZO_OK);
    /* at least the 20 ms of work, at most what the host saw around it */
    if (ms < 20.0 || ms > wall) fail_msg("elapsed %.3f ms: the work took 20 ms, the host saw %.3f ms", ms, wall);
    assert_int_equal(gpu_event_elapsed(a, plain, &ms), ZO_ERR_INVALID); /* not timed */
    gpu_event_destroy(plain);
    gpu_event_destroy(b);
    gpu_event_destroy(a);
    gpu_stream_destroy(s);
    gpu_device_free(dev);
}

/* ---- FLOPs -------------------------------------------------------------------------------- */

static void test_flops(void **state)
{
    (void)state;
    /* LLaMA-2-13B's q_proj over a micro-batch of 4 x 2048 tokens: each of
     * the m x n outputs is a sum of k products, a multiply and an add each */
    gpu_gemm_desc g = {.trans_b = 1, .m = 8192, .n = 5120, .k = 5120};
    double outputs = 8192.0 * 5120.0, per_output = 2.0 * 5120.0;
    assert_true(gpu_gemm_flops(&g) == outputs * per_output);
    g.batch = 3; /* three such products */
    assert_true(gpu_gemm_flops(&g) == 3 * outputs * per_output);

    /* its attention: b 4, t 2048, 40 heads of 128. Per head the scores
     * Q K^T are t x t outputs of d products, the output P V is t x d of t
     * products; causal, half of the t x t pairs are counted */
    gpu_attn_desc at = {.b = 4, .t = 2048, .hq = 40, .hkv = 40, .d = 128};
    double t = 2048, d = 128;
    double scores = 2 * t * t * d, values = 2 * t * d * t;
    double fwd = 4 * 40 * (scores + values) / 2;
    assert_true(gpu_attention_flops(&at, 0) == fwd);
    /* backward: the scores again, dV = P^T dO, dP = dO V^T, dQ = dS K,
     * dK = dS^T Q: five products of the same size */
    double bwd = 4 * 40 * 5 * scores / 2;
    assert_true(gpu_attention_flops(&at, 1) == bwd);
    /* a window as long as the sequence changes nothing; a window w of
     * 512 counts the band of w keys a query sees: t w - w^2 / 2 pairs */
    at.window = 2048;
    assert_true(gpu_attention_flops(&at, 0) == fwd);
    at.window = 512;
    double band = t * 512 - 512.0 * 512 / 2;
    assert_true(gpu_attention_flops(&at, 0) == 4 * 40 * 4 * d * band);
}

/* ---- the profile on the CPU backend ---------------------------------------------------------- */

static int count_events(gpu_device_t dev)
{
    int n = 0;
    for (struct gpu_event *e = dev->events; e; e = e->next) n++;
    return n;
}

static const gpu_profile_row *find_row(const gpu_profile_row *rows, size_t n, const char *op, const char *shape)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(rows[i].op, op) && (!shape || !strcmp(rows[i].shape, shape))) return &rows[i];
    return NULL;
}

static void test_profile_rows(void **state)
{
    (void)state;
    gpu_device_t dev;
    gpu_stream_t s;
    assert_int_equal(gpu_device_init_cpu(&(gpu_cpu_options){.n_threads = 1}, &dev), ZO_OK);
    assert_int_equal(gpu_stream_create(dev, &s), ZO_OK);
    enum { M = 48, N = 40, K = 32, B = 2, T = 16, H = 2, D = 8 };
    float *a, *b, *c, *lse;
    uint16_t *qkv, *out;
    assert_int_equal(gpu_mem_alloc(dev, M * K * 4, (void **)&a), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, N * K * 4, (void **)&b), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, M * N * 4, (void **)&c), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, B * T * 3 * H * D * 2, (void **)&qkv), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, B * T * H * D * 2, (void **)&out), ZO_OK);
    assert_int_equal(gpu_mem_alloc(dev, B * H * T * 4, (void **)&lse), ZO_OK);
    gpu_memset_async(s, a, 0, M * K * 4);
    gpu_memset_async(s, b, 0, N * K * 4);
    gpu_memset_async(s, qkv, 0, B * T * 3 * H * D * 2);
    gpu_gemm_desc g = {.trans_b = 1, .m = M, .n = N, .k = K, .alpha = 1, .a = gpu_t(a, ZO_DTYPE_F32),
                       .b = gpu_t(b, ZO_DTYPE_F32), .c = gpu_t(c, ZO_DTYPE_F32), .lda = K, .ldb = K, .ldc = N};
    gpu_attn_desc at = {.b = B, .t = T, .hq = H, .hkv = H, .d = D};

    /* no profile: the ops create no event */
    int ev0 = count_events(dev);
    assert_int_equal(gpu_gemm(s, &g), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
    assert_int_equal(count_events(dev), ev0);

    gpu_profile *p;
    assert_int_equal(gpu_profile_start(dev, &p), ZO_OK);
    gpu_profile *p2;
    assert_int_equal(gpu_profile_start(dev, &p2), ZO_ERR_BUSY); /* one a device */
    gpu_profile_name_stream(p, s, "compute");
    /* attached, outside a step: untimed, no event either */
    assert_int_equal(gpu_gemm(s, &g), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
    assert_int_equal(count_events(dev), ev0);

    for (int step = 0; step < 2; step++) {
        gpu_profile_step_begin(p);
        for (int i = 0; i < 3; i++) assert_int_equal(gpu_gemm(s, &g), ZO_OK);
        assert_int_equal(gpu_attention_forward(s, &at, gpu_t(out, ZO_DTYPE_BF16), lse, gpu_t(qkv, ZO_DTYPE_BF16)),
                         ZO_OK);
        assert_int_equal(gpu_memcpy_async(s, c, a, 1000, GPU_COPY_DEVICE_TO_DEVICE), ZO_OK);
        if (step == 1) assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
        /* step 0 ends with its work perhaps still queued: kept, not waited for */
        assert_int_equal(gpu_profile_step_end(p), ZO_OK);
    }
    gpu_profile_add_host(p, "adamw (cpu)", 0.004, 2);
    assert_int_equal(gpu_profile_stop(p), ZO_OK);
    assert_int_equal(gpu_profile_steps(p), 2);
    const gpu_profile_row *rows;
    size_t n = gpu_profile_rows(p, &rows);
    assert_int_equal(n, 4);
    for (size_t i = 1; i < n; i++) assert_true(rows[i - 1].seconds >= rows[i].seconds); /* longest first */
    const gpu_profile_row *r = find_row(rows, n, "gemm", "48x40x32 NT fp32");
    if (!r) fail_msg("no gemm row of shape 48x40x32 NT fp32 (first row: %s %s)", rows[0].op, rows[0].shape);
    assert_string_equal(r->stream, "compute");
    assert_true(r->calls == 6);
    assert_true(r->flops == 6 * 2.0 * M * N * K);
    assert_true(r->seconds > 0);
    r = find_row(rows, n, "attention_forward", "b2 t16 hq2 hkv2 d8");
    assert_non_null(r);
    assert_true(r->calls == 2);
    assert_true(r->flops == 2 * 4.0 * B * H * D * T * T / 2);
    r = find_row(rows, n, "copy d2d", NULL);
    assert_non_null(r);
    assert_true(r->bytes == 2000);
    r = find_row(rows, n, "adamw (cpu)", NULL);
    assert_non_null(r);
    assert_true(r->host && r->seconds == 0.004);
    /* detached: an op runs untimed again */
    int ev1 = count_events(dev);
    assert_int_equal(gpu_gemm(s, &g), ZO_OK);
    assert_int_equal(gpu_stream_synchronize(s), ZO_OK);
    assert_int_equal(count_events(dev), ev1);
    gpu_profile_free(p);
    assert_int_equal(count_events(dev), ev0); /* its pool destroyed */
    gpu_mem_free(dev, lse);
    gpu_mem_free(dev, out);
    gpu_mem_free(dev, qkv);
    gpu_mem_free(dev, c);
    gpu_mem_free(dev, b);
    gpu_mem_free(dev, a);
    gpu_stream_destroy(s);
    gpu_device_free(dev);
}

/* ---- train --profile ------------------------------------------------------------------------- */

static char out[1 << 18];

/* A small LLaMA (2 layers, hidden 128, vocab 512) and random tokens. */
static void write_model(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    files_write_text(path, "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 128, "
                           "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 256, "
                           "\"vocab_size\": 512, \"max_position_embeddings\": 256}\n");
    enum { NTOK = 20000 };
    static uint16_t tok[NTOK];
    unsigned x = 7;
    for (int i = 0; i < NTOK; i++) {
        x = x * 1103515245u + 12345u;
        tok[i] = (uint16_t)((x >> 16) % 512);
    }
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    files_write(path, tok, sizeof tok);
}

/* train on the small LLaMA with `extra`; exit status 0 expected. */
static void train(const char *extra)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --model %s/config.json --data %s/tokens.bin --micro-batch 4 --seq 128 "
             "--threads 2 %s 2>&1", ZO_TRAIN_BIN, dir, dir, extra);
    int rc = run_capture(cmd, out, sizeof out);
    if (rc != 0) fail_msg("train exited %d:\n%s", rc, out);
}

static cJSON *read_json(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = files_read_text(path);
    cJSON *doc = cJSON_Parse(text);
    free(text);
    assert_non_null(doc);
    return doc;
}

/* The profile's row of `op` in the stats JSON (the first, the longest), or NULL. */
static const cJSON *json_op(const cJSON *prof, const char *op)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(prof, "ops"))
        if (!strcmp(cJSON_GetObjectItem(e, "op")->valuestring, op)) return e;
    return NULL;
}

/* The calls per step of every row of `op`, summed. */
static double json_calls(const cJSON *prof, const char *op)
{
    const cJSON *e;
    double n = 0;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(prof, "ops"))
        if (!strcmp(cJSON_GetObjectItem(e, "op")->valuestring, op))
            n += cJSON_GetObjectItem(e, "calls_per_step")->valuedouble;
    return n;
}

/* Every op a LLaMA training step runs, in the JSON and in train's table:
 * QLoRA dequantizes its NF4 base and leaves the embedding frozen (LoRA on
 * the linear layers: no embedding_backward). */
static void check_llama_ops(const cJSON *prof, int qlora)
{
    static const char *ops[] = {"embedding_forward", "rmsnorm_forward", "rmsnorm_backward", "gemm",
                                "rope_forward", "rope_backward", "attention_forward", "attention_backward",
                                "swiglu_forward", "swiglu_backward", "add", "cross_entropy_forward",
                                "cross_entropy_backward", "copy h2d", "copy d2h", "adamw (cpu)",
                                "embedding_backward", "nf4_dequantize"};
    size_t n = sizeof ops / sizeof *ops;
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(ops[i], qlora ? "embedding_backward" : "nf4_dequantize")) {
            if (json_op(prof, ops[i])) fail_msg("%s a step does not run has a row:\n%s", ops[i], out);
            continue;
        }
        if (!json_op(prof, ops[i])) fail_msg("the profile has no row for %s:\n%s", ops[i], out);
        char line[64];
        snprintf(line, sizeof line, "# profile: %s ", ops[i]);
        if (!strstr(out, line)) fail_msg("the table has no line for %s:\n%s", ops[i], out);
    }
    /* 2 layers x 2 micro-batches: one attention each way a layer and micro-batch */
    assert_true(json_calls(prof, "attention_forward") == 4);
    assert_true(json_calls(prof, "attention_backward") == 4);
    const cJSON *g = json_op(prof, "gemm");
    assert_non_null(cJSON_GetObjectItem(g, "tflops"));
    assert_non_null(cJSON_GetObjectItem(json_op(prof, "attention_forward"), "flops_per_step"));
    assert_non_null(cJSON_GetObjectItem(json_op(prof, "copy h2d"), "gbps"));
}

static void test_train_profile(void **state)
{
    (void)state;
    write_model();
    char extra[256];
    snprintf(extra, sizeof extra, "--steps 3 --grad-accum 2 --profile --stats-json %s/on.json", dir);
    train(extra);
    assert_non_null(strstr(out, "# profile: 2 steps profiled"));
    assert_non_null(strstr(out, "# profile: op "));
    assert_non_null(strstr(out, "# profile: streams busy, ms per step: compute "));
    cJSON *doc = read_json("on.json");
    const cJSON *prof = cJSON_GetObjectItem(doc, "profile");
    assert_non_null(prof);
    assert_true(cJSON_GetObjectItem(prof, "steps")->valueint == 2);
    check_llama_ops(prof, 0);
    cJSON_Delete(doc);

    /* QLoRA: the frozen NF4 base dequantized before its GEMMs */
    snprintf(extra, sizeof extra, "--steps 2 --grad-accum 2 --lora 4 --qlora --profile --stats-json %s/q.json", dir);
    train(extra);
    doc = read_json("q.json");
    check_llama_ops(cJSON_GetObjectItem(doc, "profile"), 1);
    cJSON_Delete(doc);
}

/* The compute stream's ops, summed, against the time the host waited for
 * the device's forward and backward (the time split's compute), which the
 * runtime counts on the host's clock: with the weights, gradients and
 * optimizer on the device (QLoRA 13B's placement) the host waits for
 * nothing else. The stream is busy at least that long, less the worker's
 * steps between commands (5% allowed), and at most the step: 0.997-1.003
 * of the waits on an idle machine; on a loaded one the host's own work,
 * on the same 2 cores as the worker, overlaps the ops, and the stream's
 * busy time runs up to 8% past the host's waits. */
static void test_train_profile_sum(void **state)
{
    (void)state;
    write_model();
    char extra[256];
    snprintf(extra, sizeof extra, "--steps 4 --grad-accum 2 --optimizer gpu --profile --stats-json %s/gpu.json", dir);
    train(extra);
    cJSON *doc = read_json("gpu.json");
    const cJSON *prof = cJSON_GetObjectItem(doc, "profile");
    double waits = cJSON_GetObjectItem(cJSON_GetObjectItem(prof, "host_ms_per_step"), "compute")->valuedouble;
    double busy = cJSON_GetObjectItem(cJSON_GetObjectItem(prof, "streams_busy_ms_per_step"), "compute")->valuedouble;
    double step = cJSON_GetObjectItem(prof, "step_ms")->valuedouble;
    if (busy < 0.95 * waits || busy > step)
        fail_msg("compute stream busy %.3f ms a step, the host waited %.3f ms for it, the step %.3f ms: not "
                 "within [0.95 x the waits, the step]\n%s", busy, waits, step, out);
    /* the host's split is the runtime's: over the 3 profiled steps of 4,
     * at most what --stats-json counts for all 4 */
    double all = 1e3 * cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "time_s"), "compute")->valuedouble;
    assert_true(3 * waits <= all * (1 + 1e-9));
    cJSON_Delete(doc);
}

/* The lines of `text` that are not the profile's, into lines[] (modified in place). */
static int other_lines(char *text, char **lines, int max)
{
    int n = 0;
    char *save;
    for (char *l = strtok_r(text, "\n", &save); l && n < max; l = strtok_r(NULL, "\n", &save))
        if (strncmp(l, "# profile", 9)) lines[n++] = l;
    return n;
}

static void test_train_profile_off(void **state)
{
    (void)state;
    write_model();
    char extra[256];
    snprintf(extra, sizeof extra, "--steps 3 --stats-json %s/off.json", dir);
    train(extra);
    char *off = strdup(out);
    assert_non_null(off);
    assert_null(strstr(off, "# profile"));
    snprintf(extra, sizeof extra, "--steps 3 --profile --stats-json %s/on.json", dir);
    train(extra);
    /* the same losses, bit for bit: the profile changes no result */
    double l_off[3], l_on[3];
    run_train_losses(off, l_off, 3);
    run_train_losses(out, l_on, 3);
    for (int k = 0; k < 3; k++) assert_true(l_off[k] == l_on[k]);
    /* the same lines but the profile's, each starting with the same word */
    char *on = strdup(out), *a[256], *b[256];
    assert_non_null(on);
    int na = other_lines(off, a, 256), nb = other_lines(on, b, 256);
    assert_int_equal(na, nb);
    for (int i = 0; i < na; i++) {
        size_t w = strcspn(a[i], " :");
        if (strncmp(a[i], b[i], w + 1)) fail_msg("line %d: \"%s\" off, \"%s\" with --profile", i, a[i], b[i]);
    }
    /* the stats JSON: the same members but "profile" */
    cJSON *doff = read_json("off.json"), *don = read_json("on.json");
    assert_null(cJSON_GetObjectItem(doff, "profile"));
    assert_non_null(cJSON_GetObjectItem(don, "profile"));
    cJSON_DeleteItemFromObject(don, "profile");
    assert_int_equal(cJSON_GetArraySize(doff), cJSON_GetArraySize(don));
    const cJSON *e;
    cJSON_ArrayForEach(e, doff) assert_non_null(cJSON_GetObjectItem(don, e->string));
    cJSON_Delete(doff);
    cJSON_Delete(don);
    free(on);
    free(off);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_event_elapsed),
        cmocka_unit_test(test_flops),
        cmocka_unit_test(test_profile_rows),
        cmocka_unit_test_setup_teardown(test_train_profile, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_train_profile_sum, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_train_profile_off, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
