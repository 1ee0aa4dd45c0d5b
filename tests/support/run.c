/* Running a program from a test and capturing what it prints. */
#include "tests/support/run.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

int run_capture(const char *cmd, char *out, size_t len)
{
    FILE *p = popen(cmd, "r");
    if (!p) fail_msg("popen failed: %s", cmd);
    size_t got = len ? fread(out, 1, len - 1, p) : 0;
    if (len) out[got] = '\0';
    char drop[4096];
    while (fread(drop, 1, sizeof drop, p) > 0) {}
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

cJSON *run_memplan_json(const char *args, int want_rc)
{
    static char out[1 << 20];
    char a[4096];
    snprintf(a, sizeof a, "%s --json", args);
    int rc = run_memplan(a, out, sizeof out);
    if (rc != want_rc) fail_msg("memplan %s: exit %d, wanted %d\n%s", a, rc, want_rc, out);
    cJSON *doc = cJSON_Parse(out);
    if (!doc) fail_msg("memplan %s: not JSON:\n%s", a, out);
    return doc;
}

double run_json_num(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    if (!cJSON_IsNumber(x)) fail_msg("no number %s.%s", a, b ? b : "");
    return x->valuedouble;
}

void run_train_losses(const char *out, double *loss, int n)
{
    for (int k = 0; k < n; k++) loss[k] = NAN;
    for (const char *p = out; (p = strstr(p, "step ")); p++) {
        if (p != out && p[-1] != '\n') continue;
        int k;
        double x;
        if (sscanf(p, "step %d loss %lf", &k, &x) == 2 && k >= 1 && k <= n) loss[k - 1] = x;
    }
}

int run_program(const char *program, const char *args, char *out, size_t len)
{
    size_t n = snprintf(NULL, 0, "%s %s 2>&1", program, args) + 1;
    char *cmd = malloc(n);
    if (!cmd) fail_msg("out of memory for a command of %zu bytes", n);
    snprintf(cmd, n, "%s %s 2>&1", program, args);
    int rc = run_capture(cmd, out, len);
    free(cmd);
    return rc;
}

const char *run_memplan_bin(void)
{
    const char *p = getenv("MEMPLAN");
    return p ? p : ZO_BUILD_DIR "/planner/memplan";
}

int run_memplan(const char *args, char *out, size_t len)
{
    return run_program(run_memplan_bin(), args, out, len);
}

pid_t run_paused(const char *cmd, const char *point, int nth)
{
    int fds[2];
    if (pipe(fds)) fail_msg("pipe failed");
    size_t n = snprintf(NULL, 0, "exec %s >/dev/null 2>&1", cmd) + 1;
    char *full = malloc(n);
    if (!full) fail_msg("out of memory for a command of %zu bytes", n);
    snprintf(full, n, "exec %s >/dev/null 2>&1", cmd);
    pid_t pid = fork();
    if (pid < 0) fail_msg("fork failed");
    if (pid == 0) {
        close(fds[0]);
        char env[128];
        snprintf(env, sizeof env, "%s:%d:%d", point, nth, fds[1]);
        setenv("ZO_TRAIN_CKPT_PAUSE", env, 1);
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(127);
    }
    free(full);
    close(fds[1]);
    char c;
    ssize_t got = read(fds[0], &c, 1);
    close(fds[0]);
    if (got != 1) fail_msg("%s: ended before it paused at %s of checkpoint %d", cmd, point, nth);
    return pid;
}
