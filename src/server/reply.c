/* Stop strings and the model-output parser (see reply.h). */
#include "server/reply.h"

#include "util/mem.h"
#include "util/rng.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* ---- stop strings ------------------------------------------------------------------ */

void stop_matcher_init(struct stop_matcher *m, const char *const *stops, size_t n_stops) {
    memset(m, 0, sizeof *m);
    m->stops = stops;
    m->n_stops = n_stops;
}

/* Length of the longest proper suffix of s[0..n) that is a prefix of marker. */
static size_t partial_suffix(const char *s, size_t n, const char *marker) {
    size_t ml = strlen(marker);
    size_t k = ml - 1 < n ? ml - 1 : n;
    for (; k > 0; k--) {
        if (!memcmp(s + n - k, marker, k)) return k;
    }
    return 0;
}

static const char *find_bytes(const char *hay, size_t n, const char *needle) {
    size_t nl = strlen(needle);
    if (nl == 0 || nl > n) return NULL;
    return memmem(hay, n, needle, nl);
}

enum tern_status stop_matcher_feed(struct stop_matcher *m, const char *text, size_t n, struct tern_buf *out) {
    if (m->stopped) return TERN_OK;
    if (m->n_stops == 0) return tern_buf_append(out, text, n);
    enum tern_status st = tern_buf_append(&m->held, text, n);
    if (st) return st;
    const char *h = m->held.data;
    size_t len = m->held.len;
    const char *first = NULL;
    for (size_t i = 0; i < m->n_stops; i++) {
        const char *at = find_bytes(h, len, m->stops[i]);
        if (at && (!first || at < first)) {
            first = at;
            m->which = (int)i;
        }
    }
    if (first) {
        m->stopped = true;
        st = tern_buf_append(out, h, (size_t)(first - h));
        tern_buf_clear(&m->held);
        return st;
    }
    size_t keep = 0;
    for (size_t i = 0; i < m->n_stops; i++) {
        size_t k = partial_suffix(h, len, m->stops[i]);
        if (k > keep) keep = k;
    }
    st = tern_buf_append(out, h, len - keep);
    if (st) return st;
    memmove(m->held.data, h + len - keep, keep);
    m->held.len = keep;
    if (m->held.data) m->held.data[keep] = 0;
    return TERN_OK;
}

enum tern_status stop_matcher_flush(struct stop_matcher *m, struct tern_buf *out) {
    enum tern_status st = TERN_OK;
    if (!m->stopped && m->held.len) st = tern_buf_append(out, m->held.data, m->held.len);
    tern_buf_clear(&m->held);
    return st;
}

void stop_matcher_free(struct stop_matcher *m) {
    if (!m) return;
    tern_buf_free(&m->held);
}

/* ---- formats ----------------------------------------------------------------------- */

const struct reply_format reply_format_qwen = {
    .name = "qwen",
    .think_open = "<think>",
    .think_close = "</think>",
    .tool_open = "<tool_call>",
    .tool_close = "</tool_call>",
};

const struct reply_format reply_format_plain = {.name = "plain"};

const struct reply_format reply_format_harmony = {.name = "harmony", .harmony = true};

bool reply_prompt_opens_think(const struct reply_format *fmt, const char *prompt, size_t n) {
    if (!fmt->think_open || !prompt) return false;
    size_t ol = strlen(fmt->think_open);
    while (n > 0 && (prompt[n - 1] == ' ' || prompt[n - 1] == '\n' || prompt[n - 1] == '\r' || prompt[n - 1] == '\t'))
        n--;
    return n >= ol && !memcmp(prompt + n - ol, fmt->think_open, ol);
}

/* ---- parser ------------------------------------------------------------------------ */

enum { ST_CONTENT = 0, ST_THINK = 1, ST_TOOL = 2, ST_H_HEAD = 3, ST_H_BODY = 4 };
enum { TO_CONTENT = 0, TO_REASONING, TO_CALL };

bool reply_parser_in_think(const struct reply_parser *p) {
    return p->state == ST_THINK || (p->state == ST_H_BODY && p->h_to == TO_REASONING);
}

/* JSON scanner modes (where we are at depth 1 of the tool-call object). */
enum { M_START = 0, M_KEY_EXPECT, M_IN_KEY, M_COLON, M_VALUE_EXPECT, M_IN_VALUE, M_AFTER_VALUE, M_DONE,
       M_ERR, M_XML };
enum { V_OTHER = 0, V_NAME, V_ARGS };
enum { VK_SCALAR = 0, VK_STRING, VK_CONTAINER };

void reply_parser_init(struct reply_parser *p, const struct reply_format *fmt, bool tools, bool in_think,
                       uint64_t id_seed) {
    memset(p, 0, sizeof *p);
    p->fmt = fmt ? fmt : &reply_format_plain;
    p->tools = tools && (p->fmt->tool_open || p->fmt->harmony);
    p->id_seed = id_seed;
    if (in_think && p->fmt->think_open) {
        p->state = ST_THINK;
        p->strip_leading = true;
    }
}

static void note(struct reply_parser *p, enum tern_status st) {
    if (st && !p->err) p->err = st;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* Emits section text with leading whitespace stripped (after a marker) and trailing
 * whitespace held until something follows it (it is dropped at a marker). */
static void emit_text(struct reply_parser *p, bool reasoning, const char *s, size_t n) {
    if (p->strip_leading) {
        while (n > 0 && is_ws(*s)) s++, n--;
        if (n == 0) return;
        p->strip_leading = false;
    }
    size_t body = n;
    while (body > 0 && is_ws(s[body - 1])) body--;
    if (body == 0) {
        note(p, tern_buf_append(&p->ws_held, s, n));
        return;
    }
    struct tern_buf *total = reasoning ? &p->reasoning : &p->content;
    struct tern_buf *delta = reasoning ? &p->delta.reasoning : &p->delta.content;
    if (p->ws_held.len) {
        note(p, tern_buf_append(total, p->ws_held.data, p->ws_held.len));
        note(p, tern_buf_append(delta, p->ws_held.data, p->ws_held.len));
        tern_buf_clear(&p->ws_held);
    }
    note(p, tern_buf_append(total, s, body));
    note(p, tern_buf_append(delta, s, body));
    if (!reasoning) p->seen_content = true;
    if (body < n) note(p, tern_buf_append(&p->ws_held, s + body, n - body));
}

static void end_section(struct reply_parser *p) {
    tern_buf_clear(&p->ws_held);
}

static struct reply_delta_call *delta_call(struct reply_parser *p, uint32_t index, bool begin) {
    struct reply_delta *d = &p->delta;
    if (!begin && d->n_calls > 0 && d->calls[d->n_calls - 1].index == index) return &d->calls[d->n_calls - 1];
    if (d->n_calls == d->cap_calls) {
        size_t cap = d->cap_calls ? d->cap_calls * 2 : 4;
        struct reply_delta_call *c = tern_reallocarray(d->calls, cap, sizeof *c);
        if (!c) {
            note(p, TERN_ERR_NOMEM);
            return NULL;
        }
        d->calls = c;
        d->cap_calls = cap;
    }
    struct reply_delta_call *c = &d->calls[d->n_calls++];
    memset(c, 0, sizeof *c);
    c->index = index;
    c->begin = begin;
    return c;
}

static void call_args(struct reply_parser *p, const char *s, size_t n) {
    if (!p->call_begun) {
        note(p, tern_buf_append(&p->sc_args, s, n));
        return;
    }
    struct reply_tool_call *c = &p->calls[p->n_calls - 1];
    note(p, tern_buf_append(&c->args, s, n));
    struct reply_delta_call *dc = delta_call(p, (uint32_t)(p->n_calls - 1), false);
    if (dc) note(p, tern_buf_append(&dc->args, s, n));
}

static void call_begin(struct reply_parser *p, const char *name, size_t name_len) {
    if (p->n_calls == p->cap_calls) {
        size_t cap = p->cap_calls ? p->cap_calls * 2 : 4;
        struct reply_tool_call *c = tern_reallocarray(p->calls, cap, sizeof *c);
        if (!c) {
            note(p, TERN_ERR_NOMEM);
            return;
        }
        p->calls = c;
        p->cap_calls = cap;
    }
    struct reply_tool_call *c = &p->calls[p->n_calls];
    memset(c, 0, sizeof *c);
    c->name = tern_strndup(name, name_len);
    if (!c->name) {
        note(p, TERN_ERR_NOMEM);
        return;
    }
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t x = p->id_seed ^ ((uint64_t)p->n_calls * 0x2545f4914f6cdd1dull);
    memcpy(c->id, "call_", 5);
    for (int i = 0; i < 24; i++) c->id[5 + i] = alnum[tern_splitmix64(&x) % 62];
    c->id[29] = 0;
    p->n_calls++;
    p->call_begun = true;
    delta_call(p, (uint32_t)(p->n_calls - 1), true);
    if (p->sc_args.len) {
        struct tern_buf pre = p->sc_args;
        p->sc_args = (struct tern_buf)TERN_BUF_INIT;
        call_args(p, pre.data, pre.len);
        tern_buf_free(&pre);
    }
}

/* Decodes a JSON string literal given without its quotes. */
static char *decode_json_string(const char *raw, size_t n, size_t *out_len) {
    struct tern_buf b = TERN_BUF_INIT;
    if (tern_buf_putc(&b, '"') || tern_buf_append(&b, raw, n) || tern_buf_putc(&b, '"')) {
        tern_buf_free(&b);
        return NULL;
    }
    json_t *v = json_loadb(b.data, b.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    tern_buf_free(&b);
    if (!json_is_string(v)) {
        json_decref(v);
        return NULL;
    }
    char *s = tern_strndup(json_string_value(v), json_string_length(v));
    *out_len = json_string_length(v);
    json_decref(v);
    return s;
}

static void value_end(struct reply_parser *p) {
    if (p->sc_value == V_NAME && !p->name_done) {
        size_t n = 0;
        char *name = decode_json_string(p->sc_name.data ? p->sc_name.data : "", p->sc_name.len, &n);
        if (name && n > 0 && !memchr(name, 0, n)) {
            p->name_done = true;
            call_begin(p, name, n);
        }
        free(name);
    } else if (p->sc_value == V_ARGS) {
        p->args_done = true;
        if (p->sc_args_string) {
            /* arguments sent as a JSON string: its content is the arguments text. */
            struct tern_buf raw = p->sc_args;
            p->sc_args = (struct tern_buf)TERN_BUF_INIT;
            size_t n = 0;
            char *s = raw.len >= 2 ? decode_json_string(raw.data + 1, raw.len - 2, &n) : NULL;
            p->sc_args_string = false;
            if (s) call_args(p, s, n);
            free(s);
            tern_buf_free(&raw);
        }
    }
    p->sc_value = V_OTHER;
}

/* One character of a tool-call body. */
static void scan_char(struct reply_parser *p, char c) {
    switch (p->sc_mode) {
    case M_START:
        if (is_ws(c)) return;
        if (c == '{') {
            p->sc_depth = 1;
            p->sc_mode = M_KEY_EXPECT;
        } else {
            p->sc_mode = c == '<' ? M_XML : M_ERR;
        }
        return;
    case M_KEY_EXPECT:
        if (is_ws(c)) return;
        if (c == '"') {
            p->sc_mode = M_IN_KEY;
            tern_buf_clear(&p->sc_key);
        } else {
            p->sc_mode = c == '}' ? M_DONE : M_ERR;
        }
        return;
    case M_IN_KEY:
        if (p->sc_esc) {
            p->sc_esc = false;
        } else if (c == '\\') {
            p->sc_esc = true;
        } else if (c == '"') {
            p->sc_mode = M_COLON;
            return;
        }
        if (p->sc_key.len < 64) note(p, tern_buf_putc(&p->sc_key, c));
        return;
    case M_COLON:
        if (is_ws(c)) return;
        p->sc_mode = c == ':' ? M_VALUE_EXPECT : M_ERR;
        return;
    case M_VALUE_EXPECT: {
        if (is_ws(c)) return;
        const char *k = p->sc_key.data ? p->sc_key.data : "";
        p->sc_value = !strcmp(k, "name") ? V_NAME
                      : (!strcmp(k, "arguments") || !strcmp(k, "parameters")) && !p->args_seen ? V_ARGS
                                                                                                : V_OTHER;
        if (p->sc_value == V_NAME && (c != '"' || p->name_done)) p->sc_value = V_OTHER;
        p->sc_mode = M_IN_VALUE;
        p->sc_in_str = false;
        p->sc_esc = false;
        if (p->sc_value == V_ARGS) {
            p->args_seen = true;
            p->sc_args_string = c == '"';
        }
        /* The kind of value shows in the scanner: a container raises the depth, a
         * string sets in_str, a scalar does neither. */
        if (c == '"') {
            p->sc_in_str = true;
            if (p->sc_value == V_ARGS) note(p, tern_buf_putc(&p->sc_args, c));
            tern_buf_clear(&p->sc_name);
            return;
        }
        if (c == '{' || c == '[') p->sc_depth++;
        if (p->sc_value == V_ARGS) call_args(p, &c, 1);
        if (p->sc_depth == 1 && (c == '}' || c == ']' || c == ',')) p->sc_mode = M_ERR;
        return;
    }
    case M_IN_VALUE: {
        if (p->sc_in_str) {
            bool closing = false;
            if (p->sc_esc) {
                p->sc_esc = false;
            } else if (c == '\\') {
                p->sc_esc = true;
            } else if (c == '"') {
                p->sc_in_str = false;
                closing = p->sc_depth == 1;
            }
            if (p->sc_value == V_ARGS && (p->sc_args_string || !closing || p->sc_depth > 1)) {
                if (p->sc_args_string) note(p, tern_buf_putc(&p->sc_args, c));
                else call_args(p, &c, 1);
            } else if (p->sc_value == V_NAME && !closing) {
                note(p, tern_buf_putc(&p->sc_name, c));
            }
            if (closing) {
                value_end(p);
                p->sc_mode = M_AFTER_VALUE;
            }
            return;
        }
        if (p->sc_depth == 1 && (c == ',' || c == '}')) {
            /* end of a scalar value */
            value_end(p);
            if (c == ',') {
                p->sc_mode = M_KEY_EXPECT;
            } else {
                p->sc_depth = 0;
                p->sc_mode = M_DONE;
            }
            return;
        }
        if (c == '"') p->sc_in_str = true;
        if (c == '{' || c == '[') p->sc_depth++;
        bool closed = false;
        if (c == '}' || c == ']') {
            p->sc_depth--;
            closed = p->sc_depth == 1;
        }
        if (p->sc_value == V_ARGS) {
            if (p->sc_args_string) note(p, tern_buf_putc(&p->sc_args, c));
            else if (!(p->sc_depth == 1 && !closed && is_ws(c))) call_args(p, &c, 1);
        }
        if (closed) {
            value_end(p);
            p->sc_mode = M_AFTER_VALUE;
        }
        return;
    }
    case M_AFTER_VALUE:
        if (is_ws(c)) return;
        if (c == ',') p->sc_mode = M_KEY_EXPECT;
        else if (c == '}') p->sc_mode = M_DONE, p->sc_depth = 0;
        else p->sc_mode = M_ERR;
        return;
    default:
        return;
    }
}

static void tool_feed(struct reply_parser *p, const char *s, size_t n) {
    note(p, tern_buf_append(&p->body, s, n));
    for (size_t i = 0; i < n; i++) {
        if (p->sc_mode == M_XML || p->sc_mode == M_ERR) break;
        scan_char(p, s[i]);
    }
}

static void tool_start(struct reply_parser *p) {
    tern_buf_clear(&p->body);
    tern_buf_clear(&p->sc_key);
    tern_buf_clear(&p->sc_name);
    tern_buf_clear(&p->sc_args);
    p->sc_depth = 0;
    p->sc_mode = M_START;
    p->sc_in_str = p->sc_esc = false;
    p->sc_value = V_OTHER;
    p->sc_args_string = false;
    p->call_begun = p->name_done = p->args_seen = p->args_done = false;
}

static const char *trim_nl(const char *s, size_t *n) {
    if (*n > 0 && s[0] == '\n') s++, (*n)--;
    if (*n > 0 && s[*n - 1] == '\n') (*n)--;
    return s;
}

/* Where a parameter's value ends: at the </parameter> that the next parameter, the
 * </function> or the end of the body follows (white space between), so a value that
 * itself contains "</parameter>" (code that writes this syntax) is kept whole. Else
 * the first </parameter>; NULL when there is none. */
static const char *param_end(const char *v, const char *end) {
    static const char close[] = "</parameter>";
    const size_t cl = sizeof close - 1;
    const char *first = find_bytes(v, (size_t)(end - v), close);
    for (const char *c = first; c; c = find_bytes(c + 1, (size_t)(end - c - 1), close)) {
        const char *q = c + cl;
        while (q < end && is_ws(*q)) q++;
        size_t left = (size_t)(end - q);
        if (q == end || (left >= 11 && !memcmp(q, "<parameter=", 11)) || (left >= 11 && !memcmp(q, "</function>", 11)))
            return c;
    }
    return first;
}

/* <function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function> (Qwen3-Coder,
 * Qwen3.5). Values that parse as JSON are kept as JSON, others become strings. */
static bool tool_end_xml(struct reply_parser *p) {
    const char *b = p->body.data ? p->body.data : "";
    const char *end = b + p->body.len;
    const char *f = find_bytes(b, p->body.len, "<function=");
    if (!f) return false;
    f += 10;
    const char *gt = memchr(f, '>', (size_t)(end - f));
    if (!gt || gt == f) return false;
    json_t *args = json_object();
    if (!args) return note(p, TERN_ERR_NOMEM), false;
    const char *q = gt + 1;
    for (;;) {
        const char *pa = find_bytes(q, (size_t)(end - q), "<parameter=");
        if (!pa) break;
        pa += 11;
        const char *pgt = memchr(pa, '>', (size_t)(end - pa));
        if (!pgt) break;
        const char *vend = param_end(pgt + 1, end);
        const char *next = find_bytes(pgt + 1, (size_t)(end - pgt - 1), "<parameter=");
        const char *fend = find_bytes(pgt + 1, (size_t)(end - pgt - 1), "</function>");
        if (!vend || (next && next < vend)) vend = next ? next : fend ? fend : end;
        size_t vn = (size_t)(vend - pgt - 1);
        const char *v = trim_nl(pgt + 1, &vn);
        char *key = tern_strndup(pa, (size_t)(pgt - pa));
        json_t *val = json_loadb(v, vn, JSON_DECODE_ANY, NULL);
        if (!val) val = json_stringn(v, vn);
        if (!val) val = json_string("");
        if (key && val) json_object_set_new(args, key, val);
        else json_decref(val);
        free(key);
        q = vend;
        if (q < end && !strncmp(q, "</parameter>", (size_t)(end - q) < 12 ? (size_t)(end - q) : 12)) q += 12;
    }
    call_begin(p, f, (size_t)(gt - f));
    char *s = json_dumps(args, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(args);
    if (!s) return note(p, TERN_ERR_NOMEM), true;
    call_args(p, s, strlen(s));
    free(s);
    return true;
}

/* The close marker arrived (or output ended inside a call). */
static void tool_end(struct reply_parser *p, bool closed) {
    bool done = false;
    if (p->sc_mode == M_XML) {
        done = tool_end_xml(p);
    } else if (p->name_done) {
        if (!p->args_seen) call_args(p, "{}", 2);
        else if (p->sc_args_string && !p->args_done) p->sc_args_string = false;
        done = true;
    }
    if (!done) {
        /* Not a tool call after all: the text goes out as content. */
        const struct reply_format *f = p->fmt;
        p->strip_leading = false;
        emit_text(p, false, f->tool_open, strlen(f->tool_open));
        if (p->body.len) emit_text(p, false, p->body.data, p->body.len);
        if (closed) emit_text(p, false, f->tool_close, strlen(f->tool_close));
    }
    p->call_begun = false;
    tern_buf_clear(&p->body);
    tern_buf_clear(&p->sc_args);
}

static const char *earliest(const char *h, size_t n, const char *a, const char *b, const char **which) {
    const char *pa = a ? find_bytes(h, n, a) : NULL;
    const char *pb = b ? find_bytes(h, n, b) : NULL;
    if (pa && (!pb || pa <= pb)) {
        *which = a;
        return pa;
    }
    *which = b;
    return pb;
}

static size_t holdback(const char *h, size_t n, const char *a, const char *b) {
    size_t ka = a ? partial_suffix(h, n, a) : 0;
    size_t kb = b ? partial_suffix(h, n, b) : 0;
    return ka > kb ? ka : kb;
}

static void consume(struct tern_buf *b, size_t n) {
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

static void harmony_feed(struct reply_parser *p);
static void harmony_finish(struct reply_parser *p);

enum tern_status reply_parser_feed(struct reply_parser *p, const char *text, size_t n) {
    if (p->err) return p->err;
    note(p, tern_buf_append(&p->pending, text, n));
    if (p->fmt->harmony) {
        harmony_feed(p);
        return p->err;
    }
    const struct reply_format *f = p->fmt;
    while (!p->err && p->pending.len) {
        const char *h = p->pending.data;
        size_t len = p->pending.len;
        const char *m1 = NULL, *m2 = NULL;
        if (p->state == ST_CONTENT) {
            m1 = !p->seen_content && p->n_calls == 0 ? f->think_open : NULL;
            m2 = p->tools ? f->tool_open : NULL;
            if (m1) {
                /* <think> opens reasoning only as the first thing the model says */
                size_t j = 0, ml = strlen(m1);
                while (j < len && is_ws(h[j])) j++;
                if (j < len && memcmp(h + j, m1, len - j < ml ? len - j : ml) != 0) m1 = NULL;
            }
        } else if (p->state == ST_THINK) {
            m1 = f->think_close;
        } else {
            m1 = f->tool_close;
        }
        const char *which = NULL;
        const char *at = earliest(h, len, m1, m2, &which);
        size_t upto = at ? (size_t)(at - h) : len - holdback(h, len, m1, m2);
        if (p->state == ST_TOOL) tool_feed(p, h, upto);
        else emit_text(p, p->state == ST_THINK, h, upto);
        if (!at) {
            consume(&p->pending, upto);
            break;
        }
        consume(&p->pending, upto + strlen(which));
        if (p->state == ST_CONTENT) {
            end_section(p);
            if (which == f->think_open) {
                p->state = ST_THINK;
            } else {
                p->state = ST_TOOL;
                tool_start(p);
            }
        } else {
            if (p->state == ST_TOOL) tool_end(p, true);
            end_section(p);
            p->state = ST_CONTENT;
        }
        p->strip_leading = true;
    }
    return p->err;
}

enum tern_status reply_parser_finish(struct reply_parser *p) {
    if (p->err) return p->err;
    if (p->fmt->harmony) {
        harmony_finish(p);
        return p->err;
    }
    if (p->pending.len) {
        /* a partial marker that never completed is ordinary text */
        if (p->state == ST_TOOL) tool_feed(p, p->pending.data, p->pending.len);
        else emit_text(p, p->state == ST_THINK, p->pending.data, p->pending.len);
        tern_buf_clear(&p->pending);
    }
    if (p->state == ST_TOOL) tool_end(p, false);
    end_section(p);
    p->state = ST_CONTENT;
    return p->err;
}

/* ---- harmony ----------------------------------------------------------------------- */

static const char H_START[] = "<|start|>", H_CHANNEL[] = "<|channel|>", H_MESSAGE[] = "<|message|>";
/* A header longer than this is not harmony: it goes out as text. */
#define H_HEAD_MAX 1024

/* The earliest of the markers in h[0..n) (*which: its text), or NULL. */
static const char *first_marker(const char *h, size_t n, const char *const *m, size_t k, const char **which) {
    const char *best = NULL;
    for (size_t i = 0; i < k; i++) {
        const char *at = find_bytes(h, n, m[i]);
        if (at && (!best || at < best)) best = at, *which = m[i];
    }
    return best;
}

static size_t marker_holdback(const char *h, size_t n, const char *const *m, size_t k) {
    size_t keep = 0;
    for (size_t i = 0; i < k; i++) {
        size_t x = partial_suffix(h, n, m[i]);
        if (x > keep) keep = x;
    }
    return keep;
}

/* The word after key in the header ("<|channel|>" -> "analysis", "to=" -> a recipient):
 * up to white space, '<' or the end. */
static const char *head_word(const char *h, size_t n, const char *key, size_t *len) {
    const char *at = NULL;
    for (const char *q = h; (q = find_bytes(q, (size_t)(h + n - q), key)) != NULL; q++) {
        /* "to=" counts only as a word of its own */
        if (key[0] != 't' || q == h || is_ws(q[-1]) || q[-1] == '>') {
            at = q;
            break;
        }
    }
    if (!at) return NULL;
    at += strlen(key);
    const char *e = at;
    while (e < h + n && !is_ws(*e) && *e != '<') e++;
    *len = (size_t)(e - at);
    return at;
}

/* <|message|> arrived: the header decides where the body goes. */
static void harmony_body_begin(struct reply_parser *p) {
    const char *h = p->head.data ? p->head.data : "";
    size_t n = p->head.len, cl = 0, rl = 0;
    const char *chan = head_word(h, n, H_CHANNEL, &cl);
    const char *to = head_word(h, n, "to=", &rl);
    p->state = ST_H_BODY;
    p->strip_leading = true;
    tern_buf_clear(&p->ws_held);
    if (to && rl > 0 && p->tools) {
        if (rl > 10 && !memcmp(to, "functions.", 10)) to += 10, rl -= 10;
        p->h_to = TO_CALL;
        p->args_seen = false;
        call_begin(p, to, rl);
        return;
    }
    p->h_to = chan && cl == 8 && !memcmp(chan, "analysis", 8) ? TO_REASONING : TO_CONTENT;
    /* a second message of the same kind is a new paragraph (sent only if it has text) */
    const struct tern_buf *total = p->h_to == TO_REASONING ? &p->reasoning : &p->content;
    if (total->len) note(p, tern_buf_append(&p->ws_held, "\n\n", 2));
}

static void harmony_body_text(struct reply_parser *p, const char *s, size_t n) {
    if (p->h_to != TO_CALL) {
        emit_text(p, p->h_to == TO_REASONING, s, n);
        return;
    }
    if (!p->args_seen) {
        while (n > 0 && is_ws(*s)) s++, n--;
        if (n == 0) return;
        p->args_seen = true;
    }
    call_args(p, s, n);
}

static void harmony_body_end(struct reply_parser *p) {
    if (p->h_to == TO_CALL) {
        if (!p->args_seen) call_args(p, "{}", 2);
        p->call_begun = false;
    }
    end_section(p);
    p->h_to = TO_CONTENT;
}

/* The header was not harmony after all: it is text. */
static void harmony_head_as_text(struct reply_parser *p) {
    p->state = ST_CONTENT;
    p->strip_leading = false;
    if (p->head.len) emit_text(p, false, p->head.data, p->head.len);
    tern_buf_clear(&p->head);
}

static void harmony_feed(struct reply_parser *p) {
    static const char *const opens[] = {H_START, H_CHANNEL};
    static const char *const heads[] = {H_MESSAGE};
    static const char *const ends[] = {"<|end|>", "<|call|>", "<|return|>", H_START, H_CHANNEL};
    while (!p->err && p->pending.len) {
        const char *h = p->pending.data;
        size_t len = p->pending.len;
        const char *const *m = p->state == ST_H_HEAD ? heads : p->state == ST_H_BODY ? ends : opens;
        size_t k = p->state == ST_H_HEAD ? 1 : p->state == ST_H_BODY ? 5 : 2;
        const char *which = NULL;
        const char *at = first_marker(h, len, m, k, &which);
        size_t upto = at ? (size_t)(at - h) : len - marker_holdback(h, len, m, k);
        if (p->state == ST_H_HEAD) {
            note(p, tern_buf_append(&p->head, h, upto));
            if (p->head.len > H_HEAD_MAX) {
                consume(&p->pending, upto);
                harmony_head_as_text(p);
                continue;
            }
        } else if (p->state == ST_H_BODY) {
            harmony_body_text(p, h, upto);
        } else {
            emit_text(p, false, h, upto);
        }
        if (!at) {
            consume(&p->pending, upto);
            break;
        }
        size_t ml = strlen(which);
        if (p->state == ST_H_HEAD) {
            consume(&p->pending, upto + ml);
            harmony_body_begin(p);
            tern_buf_clear(&p->head);
            continue;
        }
        if (p->state == ST_H_BODY) harmony_body_end(p);
        else end_section(p);
        if (which == H_START || which == H_CHANNEL) {
            p->state = ST_H_HEAD;
            tern_buf_clear(&p->head);
            note(p, tern_buf_append(&p->head, which, ml));
        } else {
            p->state = ST_CONTENT;
            p->strip_leading = true;
        }
        consume(&p->pending, upto + ml);
    }
}

static void harmony_finish(struct reply_parser *p) {
    if (p->state == ST_H_HEAD) {
        note(p, tern_buf_append(&p->head, p->pending.data, p->pending.len));
        harmony_head_as_text(p);
    } else if (p->state == ST_H_BODY) {
        harmony_body_text(p, p->pending.data, p->pending.len);
        harmony_body_end(p);
    } else if (p->pending.len) {
        emit_text(p, false, p->pending.data, p->pending.len);
    }
    tern_buf_clear(&p->pending);
    end_section(p);
    p->state = ST_CONTENT;
}

struct reply_delta *reply_parser_delta(struct reply_parser *p) { return &p->delta; }

bool reply_delta_empty(const struct reply_delta *d) {
    return d->content.len == 0 && d->reasoning.len == 0 && d->n_calls == 0;
}

void reply_delta_reset(struct reply_delta *d) {
    tern_buf_clear(&d->content);
    tern_buf_clear(&d->reasoning);
    for (size_t i = 0; i < d->n_calls; i++) tern_buf_free(&d->calls[i].args);
    d->n_calls = 0;
}

void reply_parser_free(struct reply_parser *p) {
    if (!p) return;
    tern_buf_free(&p->pending);
    tern_buf_free(&p->ws_held);
    tern_buf_free(&p->body);
    tern_buf_free(&p->sc_key);
    tern_buf_free(&p->sc_name);
    tern_buf_free(&p->sc_args);
    tern_buf_free(&p->head);
    tern_buf_free(&p->content);
    tern_buf_free(&p->reasoning);
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        tern_buf_free(&p->calls[i].args);
    }
    free(p->calls);
    reply_delta_reset(&p->delta);
    tern_buf_free(&p->delta.content);
    tern_buf_free(&p->delta.reasoning);
    free(p->delta.calls);
    memset(p, 0, sizeof *p);
}
