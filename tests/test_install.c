/* The installed tree is usable: `cmake --install` into a temporary prefix,
 * then the 40-line program of docs/offload.md (examples/train_min.c) builds
 * against it through find_package(zoffload) and through pkg-config, and the
 * installed memplan writes a plan that the program trains from. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/support/run.h" /* defines: run_capture */
#include "tests/support/scratch.h" /* defines: scratch_path */

static char prefix[256];

/* Run a shell command; print the end of its output on failure; return its
 * exit code. */
static int sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[sizeof cmd + 16];
    snprintf(full, sizeof full, "(%s) 2>&1", cmd);
    static char out[1 << 16];
    int rc = run_capture(full, out, sizeof out);
    if (rc) {
        const char *tail = out + strlen(out); /* its last 30 lines */
        for (int lines = 0; tail > out && lines <= 30; tail--)
            lines += tail[-1] == '\n';
        print_error("command failed (exit %d): %s\n%s\n", rc, cmd, tail);
    }
    return rc;
}

static int setup(void **state)
{
    (void)state;
    scratch_path(prefix, sizeof prefix, "zo_test_install_%d", (int)getpid());
    char cmd[512];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", prefix);
    return system(cmd);
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", prefix);
    return system(cmd);
}

static void test_install_and_link(void **state)
{
    (void)state;
    const char *src = ZO_SOURCE_DIR, *build = ZO_BUILD_DIR;
    assert_int_equal(sh("cmake --install %s --prefix %s/usr", build, prefix), 0);
    assert_int_equal(sh("test -x %s/usr/bin/memplan && test -x %s/usr/bin/train", prefix, prefix), 0);
    assert_int_equal(sh("test -f %s/usr/include/zoffload/offload/offload.h", prefix), 0);
    /* the model is a module of its own; the tests' reference trainer is not installed */
    assert_int_equal(sh("cd %s/usr/include/zoffload && test -f transformer/transformer.h && "
                        "test -f transformer/offload_model.h && test -f gpu/device.h && "
                        "! test -e examples && ! test -e tests",
                        prefix),
                     0);

    /* a separate CMake project */
    assert_int_equal(sh("mkdir -p %s/consumer && cp %s/examples/train_min.c %s/consumer/ && "
                        "printf '%%s\\n' 'cmake_minimum_required(VERSION 3.25)' "
                        "'project(consumer C)' 'find_package(zoffload REQUIRED)' "
                        "'add_executable(train_min train_min.c)' "
                        "'target_link_libraries(train_min PRIVATE zoffload::transformer)' "
                        "> %s/consumer/CMakeLists.txt",
                        prefix, src, prefix, prefix),
                     0);
    assert_int_equal(sh("cmake -S %s/consumer -B %s/consumer/build -DCMAKE_PREFIX_PATH=%s/usr && "
                        "cmake --build %s/consumer/build",
                        prefix, prefix, prefix, prefix),
                     0);

    /* pkg-config */
    assert_int_equal(sh("PKG_CONFIG_PATH=$(dirname $(find %s/usr -name zoffload.pc)) && "
                        "export PKG_CONFIG_PATH && cc -std=c11 -o %s/train_min_pc %s/examples/train_min.c "
                        "$(pkg-config --cflags zoffload) $(pkg-config --libs --static zoffload)",
                        prefix, prefix, src),
                     0);

    /* the installed memplan writes a plan for a model folder of the tests'
     * (a 2-layer GPT-2: a step of the smallest preset, GPT-2 124M, is
     * seconds of weight initialization); both builds train from it, given
     * the folder */
    const char *model = ZO_FIXTURES_DIR "/model/gpt2-tiny";
    assert_int_equal(sh("cd %s && %s/usr/bin/memplan estimate --model %s --seq 16 --micro-batch 1 "
                        "--params cpu --optimizer cpu --gpu-mem 1GiB --plan-out plan.json > /dev/null; "
                        "test -s plan.json",
                        prefix, prefix, model),
                     0);
    assert_int_equal(sh("cd %s && ./consumer/build/train_min plan.json 1 cpu %s | grep -q '^step 0 loss' && "
                        "./train_min_pc plan.json 1 cpu %s | grep -q '^step 0 loss' && test -s stats.json",
                        prefix, model, model),
                     0);
    /* without it the program looks the plan's model up among the presets,
     * which lack it; a model other than the plan's is refused */
    assert_int_equal(sh("cd %s && ! ./consumer/build/train_min plan.json 1 > out 2>&1 && "
                        "grep -q \"gpt2-tiny\" out && ! grep -q '^step' out && "
                        "! ./train_min_pc plan.json 1 cpu %s/model/llama-tiny > out 2>&1 && "
                        "grep -q 'plan.json' out && ! grep -q '^step' out",
                        prefix, ZO_FIXTURES_DIR),
                     0);
}

int main(void)
{
    if (system("cmake --version >/dev/null 2>&1 && pkg-config --version >/dev/null 2>&1") != 0) {
        printf("skipped: cmake or pkg-config missing\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_install_and_link, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
