/* Server-sent events (the text/event-stream format) parsed incrementally: feed it
 * bytes as they arrive, it calls back once per complete event and once per comment
 * line. Lines end with LF, CRLF or CR; "data:" lines of one event are joined with LF;
 * an event is dispatched at the blank line that ends it (an unterminated event at the
 * end of the stream is dropped, as the format says). Fields other than data, event and
 * id (retry, unknown names) are ignored. */
#ifndef TERN_REPLAY_SSE_H
#define TERN_REPLAY_SSE_H

#include "util/buf.h"
#include "util/status.h"

#include <stdbool.h>
#include <stddef.h>

struct tern_sse_event {
    const char *event; /* "message" unless the event named itself */
    const char *data;  /* NUL-terminated; lines joined with '\n' */
    size_t data_len;
    const char *id;    /* last event id seen ("" if none) */
};

/* A nonzero return stops tern_sse_feed, which returns TERN_ERR_CANCELLED. */
typedef int (*tern_sse_event_fn)(void *user, const struct tern_sse_event *ev);
/* A comment line (": priming 4096/20000"): text after the colon, leading space kept. */
typedef int (*tern_sse_comment_fn)(void *user, const char *text, size_t n);

struct tern_sse_parser {
    tern_sse_event_fn on_event;
    tern_sse_comment_fn on_comment; /* may be NULL */
    void *user;
    size_t max_line;                /* longest line accepted (bytes); 0 = 16 MiB */
    struct tern_buf line;
    struct tern_buf data;
    char event[64];
    char id[128];
    bool has_data;
    bool after_cr;                  /* the previous byte was CR: a following LF is part of it */
    bool bom_checked;
    size_t n_events;
};

void tern_sse_init(struct tern_sse_parser *p, tern_sse_event_fn on_event, tern_sse_comment_fn on_comment,
                   void *user);
/* TERN_ERR_LIMIT for a line longer than max_line; TERN_ERR_NOMEM; TERN_ERR_CANCELLED
 * when a callback returned nonzero. */
enum tern_status tern_sse_feed(struct tern_sse_parser *p, const char *data, size_t n);
void tern_sse_free(struct tern_sse_parser *p);

#endif
