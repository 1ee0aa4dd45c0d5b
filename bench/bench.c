#include "bench.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"


static void cpu_model(char *buf, size_t len)
{
    snprintf(buf, len, "unknown cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *p = strchr(line, ':');
            if (p) {
                p += 2;
                p[strcspn(p, "\n")] = '\0';
                snprintf(buf, len, "%s", p);
            }
            break;
        }
    }
    fclose(f);
}

void bench_header(const char *name, const char *fmt, ...)
{
    char cpu[256], host[128] = "?", settings[512];
    cpu_model(cpu, sizeof cpu);
    gethostname(host, sizeof host);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(settings, sizeof settings, fmt, ap);
    va_end(ap);
    printf("# %s: %s, %ld cores online, host %s; %s\n", name, cpu, sysconf(_SC_NPROCESSORS_ONLN),
           host, settings);
    fflush(stdout);
}

double bench_time_best(void (*fn)(void *), void *arg, int warmup, int min_reps,
                       double min_seconds)
{
    for (int i = 0; i < warmup; i++) fn(arg);
    double best = 1e300, start = zo_now();
    int reps = 0;
    while (reps < min_reps || zo_now() - start < min_seconds) {
        double t0 = zo_now();
        fn(arg);
        double dt = zo_now() - t0;
        if (dt < best) best = dt;
        reps++;
    }
    return best;
}

void bench_row(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

void bench_result(const char *label, double value)
{
    printf("%s: %.6g\n", label, value);
    fflush(stdout);
}

void bench_sink(const void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
}

double bench_memcpy_rate(void)
{
    size_t n = 64u << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = 1e30;
    if (!a || !b) goto out;
    memset(a, 1, n);
    memset(b, 2, n);
    for (int r = 0; r < 5; r++) {
        double t0 = zo_now();
        memcpy(b, a, n);
        double dt = zo_now() - t0;
        if (dt < best) best = dt;
        bench_sink(b);
    }
out:
    free(a);
    free(b);
    return best < 1e30 ? (double)n / best : 0.0;
}
