/* Running the project's programs from a test: one shell command, its output
 * captured, its exit code returned. Used by every test that runs memplan,
 * train or a build (tests only; links cmocka). */
#ifndef ZO_TESTS_SUPPORT_RUN_H
#define ZO_TESTS_SUPPORT_RUN_H

#include <stddef.h>
#include <sys/types.h>

/* Run `cmd` through /bin/sh and capture its standard output (add 2>&1 to
 * the command for its errors too): the first len - 1 bytes are kept in
 * `out`, NUL-terminated, and the rest is read and dropped so the program
 * never blocks on a full pipe. Returns the exit code, or -1 when a signal
 * ended it. Fails the running test when the shell cannot be started. */
int run_capture(const char *cmd, char *out, size_t len);

/* run_capture of "PROGRAM ARGS 2>&1": stdout and stderr together. */
int run_program(const char *program, const char *args, char *out, size_t len);

/* The memplan under test: $MEMPLAN (set by ctest), else the build tree's. */
const char *run_memplan_bin(void);

/* run_program of memplan. */
int run_memplan(const char *args, char *out, size_t len);

/* memplan ARGS --json: its document (the caller deletes it); fails the test
 * when the exit code is not `want_rc` or the output is not JSON. */
struct cJSON;
struct cJSON *run_memplan_json(const char *args, int want_rc);

/* The number at o.a (o.a.b when b is not NULL); fails the test when there is none. */
double run_json_num(const struct cJSON *o, const char *a, const char *b);

/* The losses of train's "step K loss X" lines in `out` (K counted from 1):
 * loss[K - 1] for K <= n (NAN for a step with no line). */
void run_train_losses(const char *out, double *loss, int n);

/* Start the shell command `cmd` (its output dropped) with train's test seam
 * ZO_TRAIN_CKPT_PAUSE="POINT:NTH:FD" set, and return its pid once it waits
 * at `point` of its nth checkpoint write (it wrote a byte to FD there). The
 * caller signals and reaps it. */
pid_t run_paused(const char *cmd, const char *point, int nth);

#endif
