#include "units.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static zo_status parse_number(const char *s, const char *what, double *v, char **end)
{
    if (!s || !*s)
        return zo_error(ZO_ERR_INVALID, "%s: empty value", what);
    while (isspace((unsigned char)*s)) s++;
    if (*s == '-')
        return zo_error(ZO_ERR_INVALID, "%s: '%s' is negative", what, s);
    errno = 0;
    *v = strtod(s, end);
    if (*end == s || errno == ERANGE || !isfinite(*v))
        return zo_error(ZO_ERR_INVALID, "%s: '%s' is not a number", what, s);
    return ZO_OK;
}

zo_status zo_parse_size(const char *s, const char *what, int allow_zero, uint64_t *out)
{
    static const struct { const char *unit; double mult; } units[] = {
        {"", 1},       {"b", 1},
        {"k", 1e3},    {"kb", 1e3},   {"kib", 1024.0},
        {"m", 1e6},    {"mb", 1e6},   {"mib", 1048576.0},
        {"g", 1e9},    {"gb", 1e9},   {"gib", 1073741824.0},
        {"t", 1e12},   {"tb", 1e12},  {"tib", 1099511627776.0},
        {"p", 1e15},   {"pb", 1e15},  {"pib", 1125899906842624.0},
    };
    double v;
    char *end;
    zo_status st = parse_number(s, what, &v, &end);
    if (st) return st;
    while (isspace((unsigned char)*end)) end++;
    size_t ulen = strlen(end);
    while (ulen && isspace((unsigned char)end[ulen - 1])) ulen--;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strlen(units[i].unit) != ulen || strncasecmp(end, units[i].unit, ulen)) continue;
        double bytes = v * units[i].mult;
        if (bytes >= 18446744073709551615.0)
            return zo_error(ZO_ERR_INVALID, "%s: '%s' is too large", what, s);
        uint64_t b = (uint64_t)llround(bytes);
        if (b == 0 && !allow_zero)
            return zo_error(ZO_ERR_INVALID, "%s: size must be greater than zero (got '%s')",
                            what, s);
        *out = b;
        return ZO_OK;
    }
    return zo_error(ZO_ERR_INVALID,
                    "%s: unknown unit in '%s' (use bytes or B, KB/MB/GB/TB, KiB/MiB/GiB/TiB)",
                    what, s);
}

zo_status zo_parse_count(const char *s, const char *what, uint64_t *out)
{
    double v;
    char *end;
    zo_status st = parse_number(s, what, &v, &end);
    if (st) return st;
    double mult = 1;
    if (*end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': mult = 1e3; break;
        case 'M': mult = 1e6; break;
        case 'B':
        case 'G': mult = 1e9; break;
        case 'T': mult = 1e12; break;
        default:
            return zo_error(ZO_ERR_INVALID, "%s: unknown suffix in '%s' (use K, M, B or T)",
                            what, s);
        }
        if (end[1])
            return zo_error(ZO_ERR_INVALID, "%s: trailing characters in '%s'", what, s);
    }
    double n = v * mult;
    if (n < 1)
        return zo_error(ZO_ERR_INVALID, "%s: must be at least 1 (got '%s')", what, s);
    if (n >= 9.2e18)
        return zo_error(ZO_ERR_INVALID, "%s: '%s' is too large", what, s);
    *out = (uint64_t)llround(n);
    return ZO_OK;
}

zo_status zo_parse_int(const char *s, const char *what, long min, long max, long *out)
{
    if (!s || !*s) return zo_error(ZO_ERR_INVALID, "%s: empty value", what);
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end || errno == ERANGE)
        return zo_error(ZO_ERR_INVALID, "%s: '%s' is not an integer", what, s);
    if (v < min || v > max)
        return zo_error(ZO_ERR_INVALID, "%s: %ld is out of range [%ld, %ld]", what, v, min,
                        max);
    *out = v;
    return ZO_OK;
}

zo_status zo_parse_double(const char *s, const char *what, double min, double max,
                          double *out)
{
    if (!s || !*s) return zo_error(ZO_ERR_INVALID, "%s: empty value", what);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(v))
        return zo_error(ZO_ERR_INVALID, "%s: '%s' is not a number", what, s);
    if (v < min || v > max)
        return zo_error(ZO_ERR_INVALID, "%s: %g is out of range [%g, %g]", what, v, min, max);
    *out = v;
    return ZO_OK;
}

char *zo_format_bytes(uint64_t b, char *buf, size_t len)
{
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024.0 && i < 5) {
        v /= 1024.0;
        i++;
    }
    if (i == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)b);
    else
        snprintf(buf, len, "%.2f %s", v, u[i]);
    return buf;
}

char *zo_format_count(uint64_t n, char *buf, size_t len)
{
    double v = (double)n;
    if (v >= 1e12) snprintf(buf, len, "%.2fT", v / 1e12);
    else if (v >= 1e9) snprintf(buf, len, "%.2fB", v / 1e9);
    else if (v >= 1e6) snprintf(buf, len, "%.1fM", v / 1e6);
    else if (v >= 1e3) snprintf(buf, len, "%.1fK", v / 1e3);
    else snprintf(buf, len, "%llu", (unsigned long long)n);
    return buf;
}
