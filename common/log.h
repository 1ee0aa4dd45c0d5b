/* Logging for programs (CLIs, examples, benchmarks). Library code does not
 * log; it returns statuses (status.h). */
#ifndef ZO_COMMON_LOG_H
#define ZO_COMMON_LOG_H

typedef enum zo_log_level {
    ZO_LOG_ERROR = 0,
    ZO_LOG_WARN,
    ZO_LOG_INFO,
    ZO_LOG_DEBUG,
} zo_log_level;

/* Messages above this level are dropped; ZO_LOG env var (error|warn|info|debug)
 * sets the initial level, default info. */
void zo_log_set_level(zo_log_level level);
zo_log_level zo_log_get_level(void);
void zo_log(zo_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define ZO_ERROR(...) zo_log(ZO_LOG_ERROR, __VA_ARGS__)
#define ZO_WARN(...) zo_log(ZO_LOG_WARN, __VA_ARGS__)
#define ZO_INFO(...) zo_log(ZO_LOG_INFO, __VA_ARGS__)
#define ZO_DEBUG(...) zo_log(ZO_LOG_DEBUG, __VA_ARGS__)

#endif
