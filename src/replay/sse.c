#include "replay/sse.h"

#include <stdio.h>
#include <string.h>

#define DEFAULT_MAX_LINE ((size_t)16 << 20)

void tern_sse_init(struct tern_sse_parser *p, tern_sse_event_fn on_event, tern_sse_comment_fn on_comment,
                   void *user) {
    memset(p, 0, sizeof *p);
    p->on_event = on_event;
    p->on_comment = on_comment;
    p->user = user;
}

void tern_sse_free(struct tern_sse_parser *p) {
    if (!p) return;
    tern_buf_free(&p->line);
    tern_buf_free(&p->data);
}

static enum tern_status dispatch(struct tern_sse_parser *p) {
    if (!p->has_data) {
        p->event[0] = 0;
        return TERN_OK;
    }
    /* The format appends LF after every data line; the last one is not part of the data. */
    if (p->data.len > 0 && p->data.data[p->data.len - 1] == '\n') p->data.data[--p->data.len] = 0;
    struct tern_sse_event ev = {
        .event = p->event[0] ? p->event : "message",
        .data = p->data.data ? p->data.data : "",
        .data_len = p->data.len,
        .id = p->id,
    };
    p->n_events++;
    int stop = p->on_event ? p->on_event(p->user, &ev) : 0;
    tern_buf_clear(&p->data);
    p->has_data = false;
    p->event[0] = 0;
    if (stop) return tern_errorf(TERN_ERR_CANCELLED, "SSE consumer stopped at event %zu", p->n_events);
    return TERN_OK;
}

static enum tern_status line_done(struct tern_sse_parser *p) {
    const char *s = p->line.data ? p->line.data : "";
    size_t n = p->line.len;
    enum tern_status st = TERN_OK;
    if (n == 0) {
        st = dispatch(p);
    } else if (s[0] == ':') {
        if (p->on_comment && p->on_comment(p->user, s + 1, n - 1))
            st = tern_errorf(TERN_ERR_CANCELLED, "SSE consumer stopped at a comment");
    } else {
        const char *colon = memchr(s, ':', n);
        size_t name_len = colon ? (size_t)(colon - s) : n;
        const char *v = colon ? colon + 1 : s + n;
        size_t vlen = (size_t)(s + n - v);
        if (vlen > 0 && *v == ' ') {
            v++;
            vlen--;
        }
        if (name_len == 4 && !memcmp(s, "data", 4)) {
            st = tern_buf_append(&p->data, v, vlen);
            if (st == TERN_OK) st = tern_buf_putc(&p->data, '\n');
            p->has_data = true;
        } else if (name_len == 5 && !memcmp(s, "event", 5)) {
            snprintf(p->event, sizeof p->event, "%.*s", (int)vlen, v);
        } else if (name_len == 2 && !memcmp(s, "id", 2) && !memchr(v, 0, vlen)) {
            snprintf(p->id, sizeof p->id, "%.*s", (int)vlen, v);
        }
    }
    tern_buf_clear(&p->line);
    return st;
}

enum tern_status tern_sse_feed(struct tern_sse_parser *p, const char *data, size_t n) {
    size_t max_line = p->max_line ? p->max_line : DEFAULT_MAX_LINE;
    size_t i = 0;
    if (!p->bom_checked && n > 0) {
        /* A UTF-8 byte order mark may open the stream; it may also arrive split. */
        static const char bom[3] = {(char)0xEF, (char)0xBB, (char)0xBF};
        size_t have = p->line.len;
        size_t k = 0;
        while (have + k < 3 && k < n && data[k] == bom[have + k]) k++;
        if (have + k == 3) {
            tern_buf_clear(&p->line);
            i = k;
            p->bom_checked = true;
        } else if (k == n && have + k < 3) {
            return tern_buf_append(&p->line, data, n); /* still could be a BOM */
        } else {
            p->bom_checked = true; /* not a BOM: any held bytes are ordinary line bytes */
        }
    }
    while (i < n) {
        char c = data[i];
        if (c == '\n' && p->after_cr) {
            p->after_cr = false;
            i++;
            continue;
        }
        p->after_cr = false;
        if (c == '\n' || c == '\r') {
            p->after_cr = c == '\r';
            enum tern_status st = line_done(p);
            if (st != TERN_OK) return st;
            i++;
            continue;
        }
        /* Copy the run of ordinary bytes at once. */
        size_t j = i;
        while (j < n && data[j] != '\n' && data[j] != '\r') j++;
        if (p->line.len + (j - i) > max_line)
            return tern_errorf(TERN_ERR_LIMIT, "SSE line exceeds %zu bytes", max_line);
        enum tern_status st = tern_buf_append(&p->line, data + i, j - i);
        if (st != TERN_OK) return st;
        i = j;
    }
    return TERN_OK;
}
