/* Where the tests write their scratch folders and files: under $TMPDIR when
 * it is set, not empty and at most SCRATCH_ROOT_MAX bytes long (the tests'
 * path buffers were sized for /tmp: a longer root could cut a path that is
 * built on one), else /tmp. scripts/test.sh points TMPDIR at a folder on a
 * tmpfs for the plain build's pass, so that the runtime tests' NVMe tier
 * (O_DIRECT works on tmpfs) does not wait on a virtual disk, and leaves the
 * sanitizer build's pass on the disk, where transfers complete late.
 * Header-only, so that every test can use it whatever it links. */
#ifndef ZO_TESTS_SUPPORT_SCRATCH_H
#define ZO_TESTS_SUPPORT_SCRATCH_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCRATCH_ROOT_MAX 24

/* The folder scratch paths start with. */
static inline const char *scratch_root(void)
{
    const char *t = getenv("TMPDIR");
    return t && *t && strlen(t) <= SCRATCH_ROOT_MAX ? t : "/tmp";
}

/* dst (len bytes) = scratch_root() "/" then fmt's text (a name, or a
 * mkdtemp template). A path that does not fit ends the test program
 * (exit 2) naming it, rather than one cut short. */
static inline __attribute__((format(printf, 3, 4))) void scratch_path(char *dst, size_t len,
                                                                       const char *fmt, ...)
{
    char rest[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(rest, sizeof rest, fmt, ap);
    va_end(ap);
    int m = n >= 0 && (size_t)n < sizeof rest ? snprintf(dst, len, "%s/%s", scratch_root(), rest) : -1;
    if (m < 0 || (size_t)m >= len) {
        fprintf(stderr, "scratch_path: %s/%s does not fit in %zu bytes\n", scratch_root(), rest, len);
        exit(2);
    }
}

#endif
