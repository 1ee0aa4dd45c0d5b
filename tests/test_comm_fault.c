/* Faults in a multi-rank job (gpu/comm.h): a rank that stalls outside a
 * collective, or dies in one, must not leave the others waiting forever.
 *
 * The test runs this same binary under mpiexec in "victim" mode: every rank
 * does two all-reduces, then rank `k` stalls (never enters the third) or
 * raises SIGKILL just after starting it. With ZO_COMM_TIMEOUT=T, every other
 * rank must exit non-zero within T plus a few seconds; for the stall, the
 * message names the operation and the rank that did not arrive. When a rank
 * dies, Open MPI's mpirun ends the job itself, before the timeout; with
 * `--enable-recovery` it lets the others run on, and then the timeout ends
 * them, naming the dead rank (mpirun itself then exits 0, so that case is
 * checked by its message, its time, and no rank completing).
 *
 * On a sub-communicator ("split-stall", 4 ranks): the world is split into
 * {0,1},{2,3}, only {0,1} splits its child again (so ranks 0 and 1 hold one
 * communicator more than 2 and 3), then into {0,2},{1,3}; after two
 * all-reduces on {1,3}, world rank 3 never enters the third. World rank 1
 * must end the job naming rank 1 of the child as world rank 3, and what it
 * was doing, which it can only answer if both agree which communicator is
 * asked about. A rank that never arrives at comm_split itself
 * ("split-absent") is named the same way as in a collective. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "gpu/comm.h" /* defines: comm_init, comm_all_reduce */

#define TIMEOUT_S 3
#define SLACK_S 20 /* launch and teardown of mpiexec on a loaded 2-core machine */

static char self_path[4096];


/* ---- victim mode: runs under mpiexec ---------------------------------------------------- */

/* A stall inside a sub-communicator: world rank k of 4 (odd) stalls. */
static int victim_split(int k)
{
    comm_t w, a, a2 = NULL, b;
    comm_options o = {.backend = COMM_BACKEND_MPI};
    if (comm_init(&o, &w) != ZO_OK) {
        fprintf(stderr, "victim: %s\n", zo_last_error());
        return 2;
    }
    int rank = comm_rank(w);
    float x[1024] = {0};
    if (comm_split(w, rank < 2 ? 0 : 1, 0, &a) != ZO_OK) return 2;
    if (rank < 2 && comm_split(a, 0, 0, &a2) != ZO_OK) return 2;
    if (comm_split(w, rank % 2, 0, &b) != ZO_OK) return 2;
    for (int i = 0; i < 2; i++)
        if (comm_all_reduce(b, x, x, 1024, ZO_DTYPE_F32, NULL, NULL) != ZO_OK) return 2;
    if (rank == k)
        for (;;) pause(); /* alive, but never arrives: killed by the others' abort */
    if (comm_all_reduce(b, x, x, 1024, ZO_DTYPE_F32, NULL, NULL) != ZO_OK) return 2;
    if (rank % 2 == k % 2)
        fprintf(stderr, "victim: rank %d completed the collective without rank %d\n", rank, k);
    for (;;) pause(); /* the other child's ranks: wait for the abort */
}

/* Rank k never calls comm_split; the others must time out in it. */
static int victim_split_absent(int k)
{
    comm_t w, c;
    comm_options o = {.backend = COMM_BACKEND_MPI};
    if (comm_init(&o, &w) != ZO_OK) return 2;
    float x[16] = {0};
    if (comm_all_reduce(w, x, x, 16, ZO_DTYPE_F32, NULL, NULL) != ZO_OK) return 2;
    if (comm_rank(w) == k)
        for (;;) pause();
    if (comm_split(w, 0, 0, &c) != ZO_OK) return 2;
    fprintf(stderr, "victim: rank %d completed the collective without rank %d\n", comm_rank(w), k);
    return 0;
}

static int victim(const char *how, int k)
{
    if (!strcmp(how, "split-absent")) return victim_split_absent(k);
    if (!strcmp(how, "split-stall")) return victim_split(k);
    comm_t c;
    comm_options o = {.backend = COMM_BACKEND_MPI}; /* timeout from ZO_COMM_TIMEOUT */
    if (comm_init(&o, &c) != ZO_OK) {
        fprintf(stderr, "victim: %s\n", zo_last_error());
        return 2;
    }
    int rank = comm_rank(c);
    const size_t n = (size_t)4 << 20; /* 16 MiB: the third collective takes a while */
    float *x = calloc(n, sizeof *x);
    if (!x) return 2;
    for (int i = 0; i < 2; i++)
        if (comm_all_reduce(c, x, x, 1024, ZO_DTYPE_F32, NULL, NULL) != ZO_OK) return 2;
    if (rank == k && !strcmp(how, "stall")) {
        /* alive, but never arrives: killed by the others' abort */
        for (;;) pause();
    }
    comm_request_t req;
    if (comm_all_reduce(c, x, x, n, ZO_DTYPE_F32, NULL, &req) != ZO_OK) return 2;
    if (rank == k) raise(SIGKILL); /* dies in the middle of it */
    comm_wait(req);
    /* the collective cannot complete without rank k: reaching here is wrong */
    fprintf(stderr, "victim: rank %d completed the collective without rank %d\n", rank, k);
    comm_free(c);
    return 0;
}

/* ---- the test: launch the victims, time them, read their messages ---------------------- */

/* Run `np` victims; returns the exit status, the seconds taken and the output. */
static int run_victims(int np, const char *how, int k, const char *flags, double *seconds,
                       char *out, size_t cap)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "ZO_COMM_TIMEOUT=%d ZO_MPIEXEC_FLAGS='%s' %s %s %d %s --victim %s %d 2>&1",
             TIMEOUT_S, flags, ZO_RUN_MPI, ZO_MPIEXEC, np, self_path, how, k);
    double t0 = zo_now();
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t len = 0, got;
    while (len + 1 < cap && (got = fread(out + len, 1, cap - 1 - len, p)) > 0) len += got;
    out[len] = '\0';
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {}
    int st = pclose(p);
    *seconds = zo_now() - t0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_stall(void **state)
{
    (void)state;
    static char out[1 << 16];
    double s;
    int rc = run_victims(3, "stall", 1, "", &s, out, sizeof out);
    printf("stall: exit %d after %.1f s\n", rc, s);
    assert_int_not_equal(rc, 0);
    assert_true(s < TIMEOUT_S + SLACK_S);
    /* the operation and the missing rank are named */
    if (!strstr(out, "all_reduce #3") || !strstr(out, "did not arrive: rank 1 ("))
        fprintf(stderr, "output:\n%s\n", out);
    assert_non_null(strstr(out, "all_reduce #3"));
    assert_non_null(strstr(out, "did not arrive: rank 1 ("));
    assert_null(strstr(out, "completed the collective without"));
}

static void test_kill(void **state)
{
    (void)state;
    static char out[1 << 16];
    double s;
    int rc = run_victims(3, "kill", 2, "", &s, out, sizeof out);
    printf("kill: exit %d after %.1f s\n", rc, s);
    if (rc == 0) fprintf(stderr, "output:\n%s\n", out);
    assert_int_not_equal(rc, 0);
    assert_true(s < TIMEOUT_S + SLACK_S);
    assert_null(strstr(out, "completed the collective without"));
}

/* Run `np` victims `how` with rank k the culprit: the job must fail within
 * the timeout plus slack, print `expect` and `missing` (NULL: not checked),
 * and no rank may complete the collective. */
static void expect_fault(int np, const char *how, int k, const char *expect, const char *missing)
{
    static char out[1 << 16];
    double s;
    int rc = run_victims(np, how, k, "", &s, out, sizeof out);
    printf("%s: exit %d after %.1f s\n", how, rc, s);
    if (!strstr(out, expect) || (missing && !strstr(out, missing)))
        fprintf(stderr, "output:\n%s\n", out);
    assert_int_not_equal(rc, 0);
    assert_true(s < TIMEOUT_S + SLACK_S);
    assert_non_null(strstr(out, expect));
    if (missing) assert_non_null(strstr(out, missing));
    assert_null(strstr(out, "completed the collective without"));
}

/* A stall in a sub-communicator: the child's rank named as its world rank. */
static void test_split_stall(void **state)
{
    (void)state;
    expect_fault(4, "split-stall", 3,
                 "all_reduce #3 (fp32, 1024 elements) did not complete within 3 s on rank 0 of 2 "
                 "(world rank 1 of 4); did not arrive: rank 1, world rank 3 (not in it: busy "
                 "elsewhere after all_reduce #2)", NULL);
}

/* A rank that never arrives at the split. */
static void test_split_absent(void **state)
{
    (void)state;
    expect_fault(3, "split-absent", 2, "split #2 (MPI_Iallgather of the colors) did not complete within 3 s",
                 "did not arrive: rank 2 (not in it: busy elsewhere after all_reduce #1)");
}

/* The launcher lets the job run on after a death: the timeout must end it. */
static void test_kill_no_launcher_help(void **state)
{
    (void)state;
    if (system(ZO_MPIEXEC " --version 2>&1 | grep -qiE 'open ?mpi|openrte'") != 0) skip();
    static char out[1 << 16];
    double s;
    int rc = run_victims(3, "kill", 2, "--enable-recovery", &s, out, sizeof out);
    printf("kill, --enable-recovery: exit %d after %.1f s\n", rc, s);
    if (!strstr(out, "did not arrive: rank 2 (no answer")) fprintf(stderr, "output:\n%s\n", out);
    assert_true(s < TIMEOUT_S + SLACK_S);
    assert_non_null(strstr(out, "all_reduce #3"));
    assert_non_null(strstr(out, "did not arrive: rank 2 (no answer"));
    assert_null(strstr(out, "completed the collective without"));
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--victim")) return victim(argv[2], atoi(argv[3]));
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (n <= 0) return 1;
    self_path[n] = '\0';
    if (system("command -v " ZO_MPIEXEC " >/dev/null 2>&1") != 0) {
        printf("skipped: %s not found\n", ZO_MPIEXEC);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stall),
        cmocka_unit_test(test_kill),
        cmocka_unit_test(test_kill_no_launcher_help),
        cmocka_unit_test(test_split_stall),
        cmocka_unit_test(test_split_absent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
