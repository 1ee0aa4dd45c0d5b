/* Parsing and printing of sizes and counts given on command lines.
 *
 * Sizes: a number with an optional unit. Decimal units (K, KB, M, MB, G, GB,
 * T, TB, P, PB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB, PiB)
 * powers of 1024; no unit (or B) means bytes. Case of the letters before "B"
 * is ignored: "80GB", "80gb", "80GiB", "1.5TB", "512e9". */
#ifndef ZO_COMMON_UNITS_H
#define ZO_COMMON_UNITS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define ZO_KIB 1024ull
#define ZO_MIB (1024ull * 1024)
#define ZO_GIB (1024ull * 1024 * 1024)
#define ZO_TIB (1024ull * 1024 * 1024 * 1024)

/* Parse a size in bytes; rejects empty, negative, zero (unless allow_zero),
 * unknown units and values that overflow 64 bits. `what` names the flag or
 * field in the error message. */
zo_status zo_parse_size(const char *s, const char *what, int allow_zero, uint64_t *out);

/* Parse a count such as "7.5e9", "13B", "175B", "1T", "124M", "1e12";
 * K/M/B/T suffixes are 1e3/1e6/1e9/1e12. Must be > 0. */
zo_status zo_parse_count(const char *s, const char *what, uint64_t *out);

/* Parse a positive integer (no units) that fits in an int. */
zo_status zo_parse_int(const char *s, const char *what, long min, long max, long *out);

/* Parse a finite floating-point number within [min, max]. */
zo_status zo_parse_double(const char *s, const char *what, double min, double max,
                          double *out);

/* "12.35 GiB", "512.00 MiB", "1.20 TiB", "800 B" into buf; returns buf. */
char *zo_format_bytes(uint64_t bytes, char *buf, size_t len);

/* "13.02B", "124.4M", "1.56B" into buf; returns buf. */
char *zo_format_count(uint64_t n, char *buf, size_t len);

#endif
