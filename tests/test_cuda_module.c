/* The CUDA backend is a module opened when a CUDA device is asked for
 * (gpu/cuda_module.h): programs do not map CUDA, cuBLAS or NCCL otherwise,
 * and a machine without the driver or the module gets a message naming
 * what is missing.
 *
 * - `train --help` and a CPU-only run of a tiny model stay under 40 MiB
 *   resident (the peak, from the kernel's rusage of the child);
 * - this program, which links zo_gpu alone (as test_gpu_parity and
 *   bench_gpu_cuda do: no communicator), opens the module: every symbol it
 *   needs resolves against the program (--export-dynamic), so the error is
 *   the driver's, not an undefined symbol. (The module once named the
 *   communicator's functions, which only programs linking zo_comm have: on
 *   the first GPU, those tests saw no device.)
 * - without a driver, `train --device cuda` exits 2 naming libcuda.so.1;
 *   with ZO_CUDA_MODULE pointing nowhere, it names the path it tried. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu/device.h" /* defines: gpu_device_open, gpu_cuda_device_count */
#include "tests/support/scratch.h" /* defines: scratch_path */

#define LIMIT_KIB (40 * 1024)

static char dir[128];

/* Run argv (with `env` NAME=VALUE added when not NULL), its output into
 * out; returns the exit status; *peak_kib = its peak resident set. */
static int run(char *const argv[], const char *env, char *out, size_t cap, long *peak_kib)
{
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        if (env) putenv((char *)env);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fd[1]);
    size_t len = 0;
    ssize_t got;
    char sink[4096];
    while ((got = read(fd[0], len + 1 < cap ? out + len : sink,
                       len + 1 < cap ? cap - 1 - len : sizeof sink)) > 0)
        if (len + 1 < cap) len += (size_t)got;
    out[len] = '\0';
    close(fd[0]);
    int status;
    struct rusage ru;
    assert_int_equal(wait4(pid, &status, 0, &ru), pid);
    if (peak_kib) *peak_kib = ru.ru_maxrss;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* dir/name holding `text`, `repeat` times */
static int write_file(const char *name, const char *text, int repeat)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    for (int i = 0; i < repeat; i++) fputs(text, f);
    return fclose(f) != 0;
}

static void test_resident(void **state)
{
    (void)state;
    static char out[1 << 16];
    long kib;
    char *help[] = {ZO_TRAIN_BIN, "--help", NULL};
    assert_int_equal(run(help, NULL, out, sizeof out, &kib), 0);
    printf("  train --help: %ld KiB resident at most\n", kib);
    assert_true(kib < LIMIT_KIB);
    /* a tiny LLaMA (about 0.2 M parameters) trained on the CPU */
    char cfg[256], text[256];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(text, sizeof text, "%s/text.txt", dir);
    char *train[] = {ZO_TRAIN_BIN, "--model", cfg, "--data", text, "--text", "--steps", "3", "--seq", "32",
                     "--micro-batch", "2", "--threads", "2", NULL};
    int rc = run(train, NULL, out, sizeof out, &kib);
    if (rc) printf("%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "step 2 loss"));
    printf("  train, 3 CPU steps of a tiny model: %ld KiB resident at most\n", kib);
    assert_true(kib < LIMIT_KIB);
}

static void test_cuda_errors(void **state)
{
    (void)state;
    gpu_device_t d = NULL;
    zo_status st = gpu_device_open("cuda", 0, &d);
    if (st == ZO_OK) { /* a GPU: the module opened, nothing more to see here */
        gpu_device_free(d);
        skip();
    }
    const char *msg = zo_last_error();
    printf("  gpu_device_open(\"cuda\"): %s\n", msg);
    assert_int_equal(st, ZO_ERR_UNSUPPORTED);
    assert_null(strstr(msg, "undefined symbol")); /* the module resolved against this program */
#if defined(ZO_HAVE_CUDA) && ZO_HAVE_CUDA
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    if (drv) { /* a driver without a device: the module's own error */
        dlclose(drv);
        skip();
    }
    assert_non_null(strstr(msg, "libcuda.so.1"));
    assert_int_equal(gpu_cuda_device_count(), 0);
    static char out[1 << 16];
    char cfg[256], text[256];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(text, sizeof text, "%s/text.txt", dir);
    char *train[] = {ZO_TRAIN_BIN, "--device", "cuda", "--model", cfg, "--data", text, "--text",
                     "--steps", "1", "--seq", "8", NULL};
    assert_int_equal(run(train, NULL, out, sizeof out, NULL), 2);
    printf("  train --device cuda: %s", out);
    assert_non_null(strstr(out, "libcuda.so.1"));
    assert_int_equal(run(train, "ZO_CUDA_MODULE=/nonexistent/libzo_cuda.so", out, sizeof out, NULL), 2);
    printf("  with ZO_CUDA_MODULE=/nonexistent/libzo_cuda.so: %s", out);
    assert_non_null(strstr(out, "/nonexistent/libzo_cuda.so"));
#else
    assert_non_null(strstr(msg, "no CUDA backend"));
#endif
}

int main(void)
{
    scratch_path(dir, sizeof dir, "zo_test_cuda_module_%d", (int)getpid());
    if (mkdir(dir, 0700) ||
        write_file("config.json",
                   "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
                   "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 128, "
                   "\"vocab_size\": 256, \"max_position_embeddings\": 64}",
                   1) ||
        write_file("text.txt", "the quick brown fox jumps over the lazy dog. ", 600))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resident),
        cmocka_unit_test(test_cuda_errors),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = 1;
    return rc;
}
