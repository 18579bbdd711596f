/* OpenAI response objects and SSE framing (see respond.h). */
#include "server/respond.h"

#include "util/utf8.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Strings from the model are valid UTF-8 (the detokenizer never splits a sequence),
 * but a cut at max_tokens or a stop string can still leave a broken tail behind a
 * byte-fallback token: drop what is not valid instead of failing the response. */
static json_t *str_n(const char *s, size_t n) {
    if (!s) return json_string("");
    json_t *v = json_stringn(s, n);
    if (v) return v;
    v = json_stringn(s, tern_utf8_valid_prefix(s, n)); /* one pass, whatever the tail */
    return v ? v : json_string("");
}

static json_t *buf_str(const struct tern_buf *b) { return str_n(b->data, b->len); }

json_t *srv_reuse_json(const struct srv_reuse *r) {
    if (!r || !r->tier) return NULL;
    json_t *o = json_pack("{s:{s:s,s:I,s:I,s:s,s:s}}", "reuse", "tier", r->tier, "cached", (json_int_t)r->cached,
                          "read", (json_int_t)r->read, "key", r->key ? r->key : "none", "reason",
                          r->reason ? r->reason : "");
    if (o && r->waited_ms) json_object_set_new(json_object_get(o, "reuse"), "waited_ms", json_integer(r->waited_ms));
    return o;
}

enum tern_status srv_sse_data(struct tern_buf *out, json_t *o) {
    if (!o) return TERN_ERR_NOMEM;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return TERN_ERR_NOMEM;
    enum tern_status st = tern_buf_printf(out, "data: %s\n\n", s);
    free(s);
    return st;
}

enum tern_status srv_sse_done(struct tern_buf *out) { return tern_buf_puts(out, "data: [DONE]\n\n"); }

enum tern_status srv_sse_comment(struct tern_buf *out, const char *fmt, ...) {
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* a comment is one line: no newline may sneak in */
    for (char *q = line; *q; q++)
        if (*q == '\n' || *q == '\r') *q = ' ';
    return tern_buf_printf(out, ": %s\n\n", line);
}

enum tern_status srv_sse_error(struct tern_buf *out, const struct srv_error *e) {
    char *s = srv_error_json(e);
    if (!s) return TERN_ERR_NOMEM;
    enum tern_status st = tern_buf_printf(out, "event: error\ndata: %s\n\n", s);
    free(s);
    return st;
}

static json_t *chunk_base(const struct srv_resp_ctx *c) {
    return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", c->id, "object",
                     c->ep == SRV_EP_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)c->created, "model", c->model, "system_fingerprint", "tern");
}

static void add_reuse(json_t *o, const struct srv_reuse *reuse) {
    json_t *r = srv_reuse_json(reuse);
    if (r) json_object_set_new(o, "tern", r);
}

static json_t *delta_tool_calls(const struct reply_delta *d, const struct reply_parser *p) {
    json_t *arr = json_array();
    for (size_t i = 0; i < d->n_calls; i++) {
        const struct reply_delta_call *dc = &d->calls[i];
        json_t *fn = json_object();
        json_t *tc = json_pack("{s:I}", "index", (json_int_t)dc->index);
        if (!fn || !tc) {
            json_decref(fn);
            json_decref(tc);
            json_decref(arr);
            return NULL;
        }
        if (dc->begin && dc->index < p->n_calls) {
            json_object_set_new(tc, "id", json_string(p->calls[dc->index].id));
            json_object_set_new(tc, "type", json_string("function"));
            json_object_set_new(fn, "name", json_string(p->calls[dc->index].name));
        }
        json_object_set_new(fn, "arguments", buf_str(&dc->args));
        json_object_set_new(tc, "function", fn);
        json_array_append_new(arr, tc);
    }
    return arr;
}

json_t *srv_chunk_chat(const struct srv_resp_ctx *c, const struct reply_delta *d, const struct reply_parser *p,
                       bool with_role, const char *finish, const struct srv_reuse *reuse) {
    json_t *o = chunk_base(c);
    json_t *delta = json_object();
    if (!o || !delta) {
        json_decref(o);
        json_decref(delta);
        return NULL;
    }
    if (with_role) {
        json_object_set_new(delta, "role", json_string("assistant"));
        json_object_set_new(delta, "content", json_string(""));
    }
    if (d && d->reasoning.len) json_object_set_new(delta, "reasoning_content", buf_str(&d->reasoning));
    if (d && d->content.len) json_object_set_new(delta, "content", buf_str(&d->content));
    if (d && d->n_calls) json_object_set_new(delta, "tool_calls", delta_tool_calls(d, p));
    json_t *choice = json_pack("{s:i,s:o,s:o}", "index", 0, "delta", delta, "finish_reason",
                               finish ? json_string(finish) : json_null());
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (finish) add_reuse(o, reuse);
    return o;
}

json_t *srv_chunk_text(const struct srv_resp_ctx *c, const char *text, size_t n, const char *finish,
                       const struct srv_reuse *reuse) {
    json_t *o = chunk_base(c);
    if (!o) return NULL;
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    json_object_set_new(choice, "text", str_n(text, n));
    json_object_set_new(choice, "logprobs", json_null());
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (finish) add_reuse(o, reuse);
    return o;
}

json_t *srv_usage_json(const struct srv_usage *u) {
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)u->prompt_tokens, "completion_tokens",
                     (json_int_t)u->completion_tokens, "total_tokens",
                     (json_int_t)u->prompt_tokens + (json_int_t)u->completion_tokens, "prompt_tokens_details",
                     "cached_tokens", (json_int_t)u->cached_tokens);
}

json_t *srv_chunk_usage(const struct srv_resp_ctx *c, const struct srv_usage *u, const struct srv_reuse *reuse) {
    json_t *o = chunk_base(c);
    if (!o) return NULL;
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", srv_usage_json(u));
    add_reuse(o, reuse);
    return o;
}

static json_t *response_base(const struct srv_resp_ctx *c) {
    return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", c->id, "object",
                     c->ep == SRV_EP_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)c->created,
                     "model", c->model, "system_fingerprint", "tern");
}

json_t *srv_response_chat(const struct srv_resp_ctx *c, const struct reply_parser *p, const char *finish,
                          const struct srv_usage *u, const struct srv_reuse *reuse) {
    json_t *o = response_base(c);
    json_t *msg = json_object();
    if (!o || !msg) {
        json_decref(o);
        json_decref(msg);
        return NULL;
    }
    json_object_set_new(msg, "role", json_string("assistant"));
    json_object_set_new(msg, "content", p->n_calls && !p->content.len ? json_null() : buf_str(&p->content));
    if (p->reasoning.len) json_object_set_new(msg, "reasoning_content", buf_str(&p->reasoning));
    if (p->n_calls) {
        json_t *calls = json_array();
        for (size_t i = 0; i < p->n_calls; i++) {
            json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:o}}", "id", p->calls[i].id, "type", "function",
                                                   "function", "name", p->calls[i].name, "arguments",
                                                   buf_str(&p->calls[i].args)));
        }
        json_object_set_new(msg, "tool_calls", calls);
    }
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    json_object_set_new(choice, "message", msg);
    json_object_set_new(choice, "logprobs", json_null());
    json_object_set_new(choice, "finish_reason", json_string(finish));
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", srv_usage_json(u));
    add_reuse(o, reuse);
    return o;
}

json_t *srv_response_text(const struct srv_resp_ctx *c, const char *text, size_t n, const char *finish,
                          const struct srv_usage *u, const struct srv_reuse *reuse) {
    json_t *o = response_base(c);
    if (!o) return NULL;
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    json_object_set_new(choice, "text", str_n(text, n));
    json_object_set_new(choice, "logprobs", json_null());
    json_object_set_new(choice, "finish_reason", json_string(finish));
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", srv_usage_json(u));
    add_reuse(o, reuse);
    return o;
}
