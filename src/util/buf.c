#include "util/buf.h"

#include "util/mem.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum tern_status tern_buf_reserve(struct tern_buf *b, size_t extra) {
    size_t need;
    if (tern_add_overflow(b->len, extra, &need) || tern_add_overflow(need, 1, &need))
        return tern_errorf(TERN_ERR_NOMEM, "buffer size overflow");
    if (b->limit && need - 1 > b->limit)
        return tern_errorf(TERN_ERR_LIMIT, "output of %zu bytes exceeds the limit of %zu", need - 1,
                           b->limit);
    if (need <= b->cap) return TERN_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    char *p = tern_reallocarray(b->data, cap, 1);
    if (!p) return tern_errorf(TERN_ERR_NOMEM, "cannot grow buffer to %zu bytes", cap);
    b->data = p;
    b->cap = cap;
    return TERN_OK;
}

enum tern_status tern_buf_append(struct tern_buf *b, const void *p, size_t n) {
    enum tern_status st = tern_buf_reserve(b, n);
    if (st) return st;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return TERN_OK;
}

enum tern_status tern_buf_puts(struct tern_buf *b, const char *s) { return tern_buf_append(b, s, strlen(s)); }

enum tern_status tern_buf_putc(struct tern_buf *b, char c) { return tern_buf_append(b, &c, 1); }

enum tern_status tern_buf_printf(struct tern_buf *b, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        va_end(ap2);
        return tern_errorf(TERN_ERR_INTERNAL, "bad format string");
    }
    enum tern_status st = tern_buf_reserve(b, (size_t)n);
    if (st) {
        va_end(ap2);
        return st;
    }
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    b->len += (size_t)n;
    return TERN_OK;
}

void tern_buf_clear(struct tern_buf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

char *tern_buf_detach(struct tern_buf *b, size_t *len) {
    char *p = b->data;
    if (!p) p = tern_strndup("", 0);
    if (len) *len = b->len;
    size_t limit = b->limit;
    memset(b, 0, sizeof *b);
    b->limit = limit;
    return p;
}

void tern_buf_free(struct tern_buf *b) {
    free(b->data);
    size_t limit = b->limit;
    memset(b, 0, sizeof *b);
    b->limit = limit;
}
