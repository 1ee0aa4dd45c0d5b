/* Running a program from a test and capturing what it prints. */
#include "tests/support/run.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cmocka.h>

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
