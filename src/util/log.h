/* Logging through a settable hook (library code never prints to stdout). The default
 * hook writes "tern: LEVEL: message" lines to stderr; the level threshold comes from
 * tern_log_set_level() or the TERN_LOG environment variable (error|warn|info|debug). */
#ifndef TERN_UTIL_LOG_H
#define TERN_UTIL_LOG_H

#include "tern.h"
#include "util/status.h"

void tern_log(enum tern_log_level level, const char *fmt, ...) TERN_PRINTF(2, 3);
int tern_log_enabled(enum tern_log_level level);

#define TERN_LOG_ERROR(...) tern_log(TERN_LOG_ERROR, __VA_ARGS__)
#define TERN_LOG_WARN(...) tern_log(TERN_LOG_WARN, __VA_ARGS__)
#define TERN_LOG_INFO(...) tern_log(TERN_LOG_INFO, __VA_ARGS__)
#define TERN_LOG_DEBUG(...) tern_log(TERN_LOG_DEBUG, __VA_ARGS__)

#endif
