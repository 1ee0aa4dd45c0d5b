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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu/ops_cpu.h"     /* defines: gpu_cpu_inject_faults */
#include "offload/offload.h" /* defines: offload_init, offload_plan_load, offload_save */

static char tmp_dir[256];

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* ---- plans -------------------------------------------------------------------------- */

static zo_status load_plan_text(const char *text, offload_plan *p)
{
    char path[400];
    snprintf(path, sizeof path, "%s/plan.json", tmp_dir);
    write_file(path, text);
    offload_plan_defaults(p);
    zo_status st = offload_plan_load(path, p);
    remove(path);
    return st;
}

/* A bad buffers.sub_group is refused (it was silently skipped), as is a
 * bad nvme.sub_group. */
static void test_plan_bad_sub_group(void **state)
{
    (void)state;
    offload_plan p;
    const char *bad[] = {
        "{\"buffers\": {\"sub_group\": \"big\"}}",
        "{\"buffers\": {\"sub_group\": -4096}}",
        "{\"nvme\": {\"sub_group\": \"big\"}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(load_plan_text(bad[i], &p), ZO_ERR_FORMAT);
        assert_non_null(strstr(zo_last_error(), "sub_group"));
    }
    assert_int_equal(load_plan_text("{\"buffers\": {\"sub_group\": 4096}}", &p), ZO_OK);
    assert_int_equal(p.cfg.sub_group, 4096);
}

/* placement.optimizer: fractions in [0, 1] summing to 1, named by the plan's
 * message. */
static void test_plan_fractions(void **state)
{
    (void)state;
    offload_plan p;
    const char *bad[] = {
        "{\"placement\": {\"optimizer\": {\"gpu\": 0.5, \"cpu\": 0.7}}}",
        "{\"placement\": {\"optimizer\": {\"cpu\": -0.5, \"nvme\": 1.5}}}",
        "{\"placement\": {\"optimizer\": {}}}",
        "{\"placement\": {\"optimizer\": {\"cpu\": 0.3}}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(load_plan_text(bad[i], &p), ZO_ERR_FORMAT);
        assert_non_null(strstr(zo_last_error(), "placement.optimizer"));
        assert_non_null(strstr(zo_last_error(), "plan.json"));
    }
    assert_int_equal(load_plan_text("{\"placement\": {\"optimizer\": {\"cpu\": 0.5, \"nvme\": 0.5}}}", &p),
                     ZO_OK);
    assert_true(p.cfg.opt_frac[OFFLOAD_CPU] == 0.5 && p.cfg.opt_frac[OFFLOAD_NVME] == 0.5 &&
                p.cfg.opt_frac[OFFLOAD_DEVICE] == 0.0);
    /* a plan for SGD is not run as AdamW */
    assert_int_equal(load_plan_text("{\"training\": {\"optimizer\": \"sgd\"}}", &p), ZO_ERR_FORMAT);
    assert_non_null(strstr(zo_last_error(), "training.optimizer"));
    assert_int_equal(load_plan_text("{\"training\": {\"optimizer\": \"adamw\"}}", &p), ZO_OK);
    /* integers far out of range are refused, not converted */
    assert_int_equal(load_plan_text("{\"training\": {\"grad_accum\": 1e300}}", &p), ZO_ERR_FORMAT);
    assert_int_equal(load_plan_text("{\"training\": {\"grad_accum\": -1e300}}", &p), ZO_ERR_FORMAT);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/zo_test_offload_edges_%d", (int)getpid());
    mkdir(tmp_dir, 0755);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_bad_sub_group),
        cmocka_unit_test(test_plan_fractions),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(tmp_dir);
    return rc;
}
