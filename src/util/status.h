/* Status codes and error messages.
 *
 * Every fallible function returns enum tern_status (0 = ok, negative = error) and, on
 * error, leaves a message in a thread-local buffer that names the bad value and the
 * limit. tern_errorf() sets the message and returns the status, so the idiom is
 *
 *     if (n > limit) return tern_errorf(TERN_ERR_RANGE, "n_ctx %u exceeds %u", n, limit);
 *
 * The message survives until the next tern_errorf() on the same thread. */
#ifndef TERN_UTIL_STATUS_H
#define TERN_UTIL_STATUS_H

#include "tern.h"   /* enum tern_status, tern_status_str, tern_last_error */

#include <stdarg.h>

#if defined(__GNUC__)
#define TERN_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define TERN_UNUSED_RESULT __attribute__((warn_unused_result))
#else
#define TERN_PRINTF(f, a)
#define TERN_UNUSED_RESULT
#endif

/* Sets the thread's error message and returns st. */
enum tern_status tern_errorf(enum tern_status st, const char *fmt, ...) TERN_PRINTF(2, 3);
enum tern_status tern_verrorf(enum tern_status st, const char *fmt, va_list ap);
/* Prefixes the current message with "prefix: " (adds context on the way up). */
enum tern_status tern_error_prefix(enum tern_status st, const char *fmt, ...) TERN_PRINTF(2, 3);
void tern_error_clear(void);

/* Programmer errors only (never for bad input): aborts with file:line. */
#define TERN_ASSERT(cond)                                                                 \
    do {                                                                                  \
        if (!(cond)) tern_assert_fail(#cond, __FILE__, __LINE__);                         \
    } while (0)
_Noreturn void tern_assert_fail(const char *expr, const char *file, int line);

#endif
