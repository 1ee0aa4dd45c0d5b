/* The benchmark harness shared by every bench_* program.
 *
 * Each program prints a header naming the machine and its settings
 * (bench_header), one row per case (bench_row, printf-style so each program
 * chooses its columns), and a last line with the figure that matters: a
 * ratio against a baseline measured in the same run (bench_result). */
#ifndef ZO_BENCH_H
#define ZO_BENCH_H

#include <stddef.h>

#include "common/clock.h" /* defines: zo_now (monotonic seconds) */

/* Print "# <name>: <cpu model>, <n> cores online, <host>; <settings>". */
void bench_header(const char *name, const char *settings_fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Time fn(arg) repeatedly: `warmup` untimed calls, then repeats until at
 * least `min_seconds` and `min_reps` calls have run; returns the best
 * (smallest) seconds per call, the figure least disturbed by a shared
 * machine. */
double bench_time_best(void (*fn)(void *), void *arg, int warmup, int min_reps,
                       double min_seconds);

/* A row: printf to stdout, newline added. */
void bench_row(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The last line: "<label>: <value>". */
void bench_result(const char *label, double value);

/* memcpy's bytes/s over 64 MiB, the best of 5 (the CPU backend's copy
 * between host and "device" memory); 0 when the buffers cannot be had. */
double bench_memcpy_rate(void);

/* Keep the compiler from dropping a computed value. */
void bench_sink(const void *p);

#endif
