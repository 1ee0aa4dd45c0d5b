#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int level = -1;

static zo_log_level level_from_env(void)
{
    const char *e = getenv("ZO_LOG");
    if (!e) return ZO_LOG_INFO;
    if (!strcmp(e, "error")) return ZO_LOG_ERROR;
    if (!strcmp(e, "warn")) return ZO_LOG_WARN;
    if (!strcmp(e, "debug")) return ZO_LOG_DEBUG;
    return ZO_LOG_INFO;
}

void zo_log_set_level(zo_log_level l) { level = (int)l; }

zo_log_level zo_log_get_level(void)
{
    if (level < 0) level = (int)level_from_env();
    return (zo_log_level)level;
}

void zo_log(zo_log_level l, const char *fmt, ...)
{
    static const char *tag[] = {"error", "warn", "info", "debug"};
    if (l > zo_log_get_level()) return;
    va_list ap;
    va_start(ap, fmt);
    if (l <= ZO_LOG_WARN) fprintf(stderr, "%s: ", tag[l]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
