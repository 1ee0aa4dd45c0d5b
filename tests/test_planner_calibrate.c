/* `memplan calibrate`: the profile it writes holds this machine's measured
 * sizes and rates, --hw FILE reads it, and the cost model then uses the
 * measured CPU AdamW rate. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "planner/calibrate.h"  /* defines: plan_calibrate_sizes, plan_calibrate_llc_bytes */
#include "tests/support/run.h" /* defines: run_memplan */
#include "tests/support/scratch.h" /* defines: scratch_path */

static cJSON *load_json(const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    cJSON *doc = cJSON_Parse(buf);
    assert_non_null(doc);
    return doc;
}

static double num(cJSON *o, const char *k)
{
    cJSON *v = cJSON_GetObjectItem(o, k);
    assert_non_null(v);
    assert_true(cJSON_IsNumber(v));
    return v->valuedouble;
}

static void test_calibrate_profile(void **state)
{
    (void)state;
    static char out[1 << 18];
    char dir[64], args[1024], path[512];
    scratch_path(dir, sizeof dir, "memplan-cal-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/local.json", dir);
    snprintf(args, sizeof args,
             "calibrate --out %s --base a100-80gb --nvme-dir %s --adam-params 2M --stream-bytes 64MiB "
             "--seconds 0.05 --nvme-bytes 64MiB",
             path, dir);
    int rc = run_memplan(args, out, sizeof out);
    if (rc) print_error("%s\n", out);
    assert_int_equal(rc, 0);
    cJSON *hw = load_json(path);
    assert_string_equal(cJSON_GetObjectItem(hw, "format")->valuestring, "zoffload-hw");
    assert_true(num(hw, "measured") == 1);
    /* sizes: what the kernel reports */
    struct sysinfo si;
    assert_int_equal(sysinfo(&si), 0);
    assert_true(num(hw, "cpu_mem") == (double)si.totalram * si.mem_unit);
    assert_true(num(hw, "cpu_cores") == (double)sysconf(_SC_NPROCESSORS_ONLN));
    assert_true(num(hw, "nvme") > 0);
    /* rates: plausible for any machine that runs this test (AdamW moves
     * ~28 bytes per parameter; even cache-resident it moves more than one) */
    double rate = num(hw, "cpu_adam_rate"), bw = num(hw, "cpu_mem_bw");
    assert_true(rate > 1e6 && rate < 1e12);
    assert_true(bw > 1e8 && bw < 1e13);
    assert_true(rate < bw);
    /* one thread's AdamW, as plausible (on a busy machine it may beat all
     * of them: no order between the two is asserted) */
    double one = num(hw, "cpu_adam_thread_rate");
    assert_true(one > 1e6 && one < bw);
    /* what could not be measured is said, and comes from the base */
    const char *note = cJSON_GetObjectItem(hw, "note")->valuestring;
    if (access("/dev/nvidia0", F_OK) != 0) assert_non_null(strstr(note, "no GPU"));
    assert_non_null(strstr(note, "NVMe rates measured in"));
    /* the NVMe rates are this directory's, not the base preset's (25/12 GB/s) */
    double rd = num(hw, "nvme_read_bw"), wr = num(hw, "nvme_write_bw");
    assert_true(rd > 1e6 && wr > 1e6);
    assert_true(rd != 25e9 && wr != 12e9);
    /* and the read beside a compute load on every thread (no order between
     * the two asserted: a shared disk swings more than the load moves it) */
    assert_true(num(hw, "nvme_read_bw_busy") > 1e6);
    /* the measuring file is gone */
    char ls[600];
    snprintf(ls, sizeof ls, "ls %s | grep -q memplan-calibrate", dir);
    assert_int_not_equal(system(ls), 0);
    assert_true(num(hw, "peak_flops_16") == 312e12);

    /* --hw FILE: the cost model uses the measured AdamW rate */
    snprintf(args, sizeof args,
             "estimate --model gpt2 --hw %s --grads cpu --optimizer cpu --json", path);
    rc = run_memplan(args, out, sizeof out);
    assert_int_equal(rc, 0);
    cJSON *doc = cJSON_Parse(out);
    assert_non_null(doc);
    double adam = num(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "time"), "parts"), "cpu_adam");
    double params = num(cJSON_GetObjectItem(doc, "model"), "params");
    assert_true(adam > 0);
    /* one rank holds every parameter of gpt2 (plus nothing else) */
    assert_true(adam * rate / params > 0.999 && adam * rate / params < 1.001);
    cJSON_Delete(doc);
    cJSON_Delete(hw);

    /* bad input */
    assert_int_equal(run_memplan("calibrate --base nosuchgpu", out, sizeof out), 2);
    assert_non_null(strstr(out, "nosuchgpu"));
    assert_int_equal(run_memplan("calibrate --nvme-dir /nonexistent/dir --adam-params 2M --stream-bytes 64MiB "
                                 "--seconds 0.01",
                                 out, sizeof out),
                     2);
    assert_non_null(strstr(out, "/nonexistent/dir"));
    snprintf(path, sizeof path, "%s/bad.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"format\": \"zoffload-hw\", \"base\": \"h100\", \"gpus\": -1}", f);
    fclose(f);
    snprintf(args, sizeof args, "estimate --model gpt2 --hw %s", path);
    assert_int_equal(run_memplan(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "bad.json: field \"gpus\""));
    snprintf(args, sizeof args, "rm -rf %s", dir);
    assert_int_equal(system(args), 0);
}

/* The timings' working sets are past the last-level cache: the default
 * ones of 64 MiB arrays and 16M parameters sat in a Xeon's L3 of 300-500
 * MiB and measured it, 5x the rate a step's state streams at. */
static void test_calibrate_sizes(void **state)
{
    (void)state;
    const uint64_t MiB = 1u << 20;
    uint64_t llcs[] = {0, 32 * MiB, 105 * MiB, 300 * MiB, 480 * MiB, 1536 * MiB};
    for (size_t i = 0; i < sizeof llcs / sizeof *llcs; i++) {
        plan_calibrate_opts o;
        plan_calibrate_defaults(&o);
        plan_calibrate_sizes(&o, llcs[i]);
        /* every triad array, and the AdamW state (p, m, v fp32; g, w bf16) */
        assert_true(o.stream_bytes >= 4 * llcs[i] && o.stream_bytes >= 64 * MiB);
        assert_true((uint64_t)o.adam_params * 16 >= 4 * llcs[i] && o.adam_params >= (16u << 20));
        assert_int_equal(o.stream_bytes % 4096, 0);
        /* no more than needed: the 4x rounded up */
        if (llcs[i] >= 64 * MiB) assert_true(o.stream_bytes < 4 * llcs[i] + 4096);
    }
    /* what the user sets is kept */
    plan_calibrate_opts o;
    plan_calibrate_defaults(&o);
    o.adam_params = 2u << 20;
    plan_calibrate_sizes(&o, 480 * MiB);
    assert_int_equal(o.adam_params, 2u << 20);
    /* this machine's: at least the L3 glibc reports (sysconf) */
    uint64_t llc = plan_calibrate_llc_bytes();
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 > 0) assert_true(llc >= (uint64_t)l3);
    plan_calibrate_defaults(&o);
    plan_calibrate_sizes(&o, llc);
    assert_true(o.stream_bytes > llc && (uint64_t)o.adam_params * 16 > llc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_calibrate_sizes),
                                       cmocka_unit_test(test_calibrate_profile)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
