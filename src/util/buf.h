/* A growable byte buffer, always NUL-terminated (data[len] == 0 once anything was
 * appended). Appends return TERN_OK or TERN_ERR_NOMEM; on error the buffer is unchanged.
 * An optional cap makes appends beyond it fail with TERN_ERR_LIMIT (output limits). */
#ifndef TERN_UTIL_BUF_H
#define TERN_UTIL_BUF_H

#include "util/status.h"

#include <stddef.h>

struct tern_buf {
    char *data;
    size_t len;
    size_t cap;
    size_t limit; /* 0 = unlimited */
};

#define TERN_BUF_INIT {0}

enum tern_status tern_buf_reserve(struct tern_buf *b, size_t extra);
enum tern_status tern_buf_append(struct tern_buf *b, const void *p, size_t n);
enum tern_status tern_buf_puts(struct tern_buf *b, const char *s);
enum tern_status tern_buf_putc(struct tern_buf *b, char c);
enum tern_status tern_buf_printf(struct tern_buf *b, const char *fmt, ...) TERN_PRINTF(2, 3);
void tern_buf_clear(struct tern_buf *b);                 /* len = 0, keeps memory */
char *tern_buf_detach(struct tern_buf *b, size_t *len);  /* caller frees; b is reset */
void tern_buf_free(struct tern_buf *b);

#endif
