/* Status codes and error messages shared by every module.
 *
 * Library code never prints or exits on its own behalf: it returns a
 * zo_status and, for anything but ZO_OK, leaves a one-line message (naming the
 * file, field or call) in a thread-local buffer that the caller can read with
 * zo_last_error(). */
#ifndef ZO_COMMON_STATUS_H
#define ZO_COMMON_STATUS_H

#include <stdarg.h>

typedef enum zo_status {
    ZO_OK = 0,
    ZO_ERR_INVALID,     /* bad argument or input value */
    ZO_ERR_FORMAT,      /* malformed file: JSON, safetensors, checkpoint */
    ZO_ERR_NOMEM,       /* host allocation failed */
    ZO_ERR_CAPACITY,    /* a tier's capacity would be exceeded */
    ZO_ERR_IO,          /* read/write/open failed; errno kept in the message */
    ZO_ERR_CHECKSUM,    /* data read back does not match what was written */
    ZO_ERR_DEVICE,      /* device (GPU) call failed */
    ZO_ERR_UNSUPPORTED, /* feature not built or not available here */
    ZO_ERR_NOT_FOUND,   /* named thing (preset, tensor, file) does not exist */
    ZO_ERR_INTERNAL,    /* a bug: an invariant did not hold */
    ZO_ERR_BUSY,        /* held by another process (a lock on a folder or a file) */
} zo_status;

/* A fixed string naming the status, e.g. "ZO_ERR_IO". */
const char *zo_status_name(zo_status s);

/* The programs' exit status for a failure (0 for ZO_OK): 1 when the
 * machine failed the run (memory, capacity, the device, a bug, a lock held
 * elsewhere) or, for the other statuses, when it happened while running
 * (`running`); else 2, bad input. An I/O error is bad input while the inputs
 * are read (`reading_inputs`), a failure at run time after. */
int zo_exit_status(zo_status s, int reading_inputs, int running);

/* Record a message for the current thread and return `s`, so callers can
 * write `return zo_error(ZO_ERR_INVALID, "%s: field %s missing", path, f);`. */
zo_status zo_error(zo_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
zo_status zo_verror(zo_status s, const char *fmt, va_list ap);

/* Prefix the current message with more context: "ctx: <old message>". */
zo_status zo_error_wrap(zo_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The last message recorded on this thread ("" when none). */
const char *zo_last_error(void);
void zo_clear_error(void);

/* Evaluate a status expression; on failure record where it happened (the
 * expression, function, file and line) and evaluate to the status, leaving the
 * caller to decide where to go:
 *     if ((st = ZO_CHECK(nvme_read(...))) != ZO_OK) goto out_free_buf; */
zo_status zo_check_failed(zo_status s, const char *expr, const char *func,
                          const char *file, int line);
#define ZO_CHECK(expr)                                                         \
    ({                                                                         \
        zo_status zo_check_s_ = (expr);                                        \
        zo_check_s_ == ZO_OK ? ZO_OK                                           \
                             : zo_check_failed(zo_check_s_, #expr, __func__,   \
                                               __FILE__, __LINE__);            \
    })

#endif
