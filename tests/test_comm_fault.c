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
 * ("split-absent") is named the same way as in a collective.
 *
 * The jobs spend their seconds waiting out the timeout: the group's setup
 * runs them side by side (run_jobs), each timed alone, and each test reads
 * its job's result. */
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
#include "tests/support/scratch.h" /* defines: scratch_path */

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

/* The jobs of the tests below. Each waits out the timeout (3 s) with its
 * ranks asleep or yielding, so they run side by side, JOBS_AT_ONCE at a
 * time (the ranks' start-up stays well inside the timeout on a loaded
 * 2-core machine): the group's wall is about the longest job's, not the
 * sum. Each is timed from its own start to its own end. */
enum { JOB_STALL, JOB_KILL, JOB_KILL_RECOVERY, JOB_SPLIT_STALL, JOB_SPLIT_ABSENT, N_JOBS };
#define JOBS_AT_ONCE 3
static struct job {
    int np, k;
    const char *how, *flags;
    int wanted;      /* started by the group's setup (test_kill_no_launcher_help: Open MPI only) */
    pid_t pid;       /* running: > 0 */
    double t0, seconds;
    int rc;          /* exit status, 128 + signal */
    char file[64];   /* its output */
} jobs[N_JOBS] = {
    [JOB_STALL] = {3, 1, "stall", ""},
    [JOB_KILL] = {3, 2, "kill", ""},
    [JOB_KILL_RECOVERY] = {3, 2, "kill", "--enable-recovery"},
    [JOB_SPLIT_STALL] = {4, 3, "split-stall", ""},
    [JOB_SPLIT_ABSENT] = {3, 2, "split-absent", ""},
};

static int is_open_mpi(void)
{
    return system(ZO_MPIEXEC " --version 2>&1 | grep -qiE 'open ?mpi|openrte'") == 0;
}

/* Start job j: `np` victims `how` with rank k the culprit, output in its file. */
static int job_start(struct job *j)
{
    char cmd[8192];
    scratch_path(j->file, sizeof j->file, "zo_comm_fault_XXXXXX");
    int fd = mkstemp(j->file);
    if (fd < 0) return -1;
    close(fd);
    snprintf(cmd, sizeof cmd, "ZO_COMM_TIMEOUT=%d ZO_MPIEXEC_FLAGS='%s' %s %s %d %s --victim %s %d > %s 2>&1",
             TIMEOUT_S, j->flags, ZO_RUN_MPI, ZO_MPIEXEC, j->np, self_path, j->how, j->k, j->file);
    j->t0 = zo_now();
    j->pid = fork();
    if (j->pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return j->pid > 0 ? 0 : -1;
}

/* The group's setup: every wanted job run, JOBS_AT_ONCE at a time, each
 * one's exit status and seconds recorded as it ends. */
static int run_jobs(void **state)
{
    (void)state;
    int next = 0, running = 0;
    jobs[JOB_KILL_RECOVERY].wanted = is_open_mpi();
    for (int i = 0; i < N_JOBS; i++)
        if (i != JOB_KILL_RECOVERY) jobs[i].wanted = 1;
    for (;;) {
        while (running < JOBS_AT_ONCE && next < N_JOBS) {
            struct job *j = &jobs[next++];
            if (!j->wanted) continue;
            if (job_start(j)) return -1;
            running++;
        }
        if (!running) return 0;
        int st;
        pid_t pid = waitpid(-1, &st, 0);
        if (pid < 0) return -1;
        for (int i = 0; i < N_JOBS; i++)
            if (jobs[i].pid == pid) {
                jobs[i].seconds = zo_now() - jobs[i].t0;
                jobs[i].rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                jobs[i].pid = 0;
                running--;
            }
    }
}

static int remove_outputs(void **state)
{
    (void)state;
    for (int i = 0; i < N_JOBS; i++)
        if (jobs[i].file[0]) remove(jobs[i].file);
    return 0;
}

/* Job i's exit status, seconds and output (what run_jobs recorded). */
static int job_result(int i, double *seconds, char *out, size_t cap)
{
    struct job *j = &jobs[i];
    assert_true(j->wanted);
    FILE *f = fopen(j->file, "r");
    assert_non_null(f);
    size_t len = fread(out, 1, cap - 1, f);
    out[len] = '\0';
    fclose(f);
    *seconds = j->seconds;
    return j->rc;
}

static void test_stall(void **state)
{
    (void)state;
    static char out[1 << 16];
    double s;
    int rc = job_result(JOB_STALL, &s, out, sizeof out);
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
    int rc = job_result(JOB_KILL, &s, out, sizeof out);
    printf("kill: exit %d after %.1f s\n", rc, s);
    if (rc == 0) fprintf(stderr, "output:\n%s\n", out);
    assert_int_not_equal(rc, 0);
    assert_true(s < TIMEOUT_S + SLACK_S);
    assert_null(strstr(out, "completed the collective without"));
}

/* Job i (`how`, rank k the culprit): the job must fail within the timeout
 * plus slack, print `expect` and `missing` (NULL: not checked), and no rank
 * may complete the collective. */
static void expect_fault(int i, const char *expect, const char *missing)
{
    static char out[1 << 16];
    double s;
    int rc = job_result(i, &s, out, sizeof out);
    printf("%s: exit %d after %.1f s\n", jobs[i].how, rc, s);
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
    expect_fault(JOB_SPLIT_STALL,
                 "all_reduce #3 (fp32, 1024 elements) did not complete within 3 s on rank 0 of 2 "
                 "(world rank 1 of 4); did not arrive: rank 1, world rank 3 (not in it: busy "
                 "elsewhere after all_reduce #2)", NULL);
}

/* A rank that never arrives at the split. */
static void test_split_absent(void **state)
{
    (void)state;
    expect_fault(JOB_SPLIT_ABSENT, "split #2 (MPI_Iallgather of the colors) did not complete within 3 s",
                 "did not arrive: rank 2 (not in it: busy elsewhere after all_reduce #1)");
}

/* The launcher lets the job run on after a death: the timeout must end it. */
static void test_kill_no_launcher_help(void **state)
{
    (void)state;
    if (!jobs[JOB_KILL_RECOVERY].wanted) skip();
    static char out[1 << 16];
    double s;
    int rc = job_result(JOB_KILL_RECOVERY, &s, out, sizeof out);
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
    return cmocka_run_group_tests(tests, run_jobs, remove_outputs);
}
