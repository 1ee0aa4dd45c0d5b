/* The monotonic clock, in seconds: what every timing in the project reads
 * (step times, benchmark rounds, collective deadlines). */
#ifndef ZO_COMMON_CLOCK_H
#define ZO_COMMON_CLOCK_H

/* CLOCK_MONOTONIC in seconds (nanosecond resolution). */
double zo_now(void);

#endif
