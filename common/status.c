#include "status.h"

#include <stdio.h>
#include <string.h>

#define ZO_ERRBUF 1024
static _Thread_local char errbuf[ZO_ERRBUF];

const char *zo_status_name(zo_status s)
{
    switch (s) {
    case ZO_OK: return "ZO_OK";
    case ZO_ERR_INVALID: return "ZO_ERR_INVALID";
    case ZO_ERR_FORMAT: return "ZO_ERR_FORMAT";
    case ZO_ERR_NOMEM: return "ZO_ERR_NOMEM";
    case ZO_ERR_CAPACITY: return "ZO_ERR_CAPACITY";
    case ZO_ERR_IO: return "ZO_ERR_IO";
    case ZO_ERR_CHECKSUM: return "ZO_ERR_CHECKSUM";
    case ZO_ERR_DEVICE: return "ZO_ERR_DEVICE";
    case ZO_ERR_UNSUPPORTED: return "ZO_ERR_UNSUPPORTED";
    case ZO_ERR_NOT_FOUND: return "ZO_ERR_NOT_FOUND";
    case ZO_ERR_INTERNAL: return "ZO_ERR_INTERNAL";
    case ZO_ERR_BUSY: return "ZO_ERR_BUSY";
    }
    return "ZO_ERR_?";
}

zo_status zo_verror(zo_status s, const char *fmt, va_list ap)
{
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    return s;
}

zo_status zo_error(zo_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    zo_verror(s, fmt, ap);
    va_end(ap);
    return s;
}

zo_status zo_error_wrap(zo_status s, const char *fmt, ...)
{
    char msg[2 * ZO_ERRBUF + 2];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, ZO_ERRBUF, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if (n >= ZO_ERRBUF) n = ZO_ERRBUF - 1;
    if (errbuf[0]) {
        memcpy(msg + n, ": ", 2);
        memcpy(msg + n + 2, errbuf, strlen(errbuf) + 1);
    }
    memcpy(errbuf, msg, ZO_ERRBUF - 1);
    errbuf[ZO_ERRBUF - 1] = '\0';
    return s;
}

const char *zo_last_error(void) { return errbuf; }

void zo_clear_error(void) { errbuf[0] = '\0'; }

zo_status zo_check_failed(zo_status s, const char *expr, const char *func,
                          const char *file, int line)
{
    if (!errbuf[0])
        snprintf(errbuf, sizeof errbuf, "%s", zo_status_name(s));
    return zo_error_wrap(s, "%s failed in %s (%s:%d)", expr, func, file, line);
}

int zo_exit_status(zo_status s, int reading_inputs, int running)
{
    switch (s) {
    case ZO_OK: return 0;
    case ZO_ERR_NOMEM:
    case ZO_ERR_CAPACITY:
    case ZO_ERR_DEVICE:
    case ZO_ERR_INTERNAL:
    case ZO_ERR_BUSY: return 1;
    case ZO_ERR_IO: return reading_inputs ? 2 : 1; /* an input that cannot be read */
    default: return running ? 1 : 2;
    }
}
