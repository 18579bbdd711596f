#include "util/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERR_CAP 1024

static _Thread_local char err_msg[ERR_CAP];

const char *tern_status_str(enum tern_status st) {
    switch (st) {
    case TERN_OK: return "ok";
    case TERN_ERR_NOMEM: return "out of memory";
    case TERN_ERR_IO: return "I/O error";
    case TERN_ERR_FORMAT: return "malformed input";
    case TERN_ERR_UNSUPPORTED: return "unsupported";
    case TERN_ERR_INVALID: return "invalid argument";
    case TERN_ERR_RANGE: return "out of range";
    case TERN_ERR_STATE: return "invalid state";
    case TERN_ERR_CANCELLED: return "cancelled";
    case TERN_ERR_TEMPLATE: return "template error";
    case TERN_ERR_LIMIT: return "limit exceeded";
    case TERN_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *tern_last_error(void) { return err_msg[0] ? err_msg : "no error message"; }

void tern_error_clear(void) { err_msg[0] = 0; }

enum tern_status tern_verrorf(enum tern_status st, const char *fmt, va_list ap) {
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    return st;
}

enum tern_status tern_errorf(enum tern_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tern_verrorf(st, fmt, ap);
    va_end(ap);
    return st;
}

enum tern_status tern_error_prefix(enum tern_status st, const char *fmt, ...) {
    char prefix[256], old[ERR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_msg, sizeof old);
    size_t np = strlen(prefix);
    if (np > ERR_CAP - 3) np = ERR_CAP - 3;
    memcpy(err_msg, prefix, np);
    memcpy(err_msg + np, ": ", 2);
    size_t rest = ERR_CAP - np - 3;
    size_t no = strnlen(old, rest);
    memcpy(err_msg + np + 2, old, no);
    err_msg[np + 2 + no] = 0;
    return st;
}

void tern_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "tern: assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}
