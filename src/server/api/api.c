/* What the protocol adapters share, and the dispatch from the engine's one event stream
 * to the adapter of the request's protocol (api.h). */
#include "server/api/api.h"

#include "server/api/api-impl.h"
#include "util/hash.h"
#include "util/mem.h"
#include "util/utf8.h"

#include <string.h>

json_t *api_str_n(const char *s, size_t n) {
    if (!s) return json_string("");
    json_t *v = json_stringn(s, n);
    if (v) return v;
    v = json_stringn(s, tern_utf8_valid_prefix(s, n)); /* a cut tail of a byte-fallback token */
    return v ? v : json_string("");
}

json_t *api_text_of(const json_t *v) {
    if (json_is_string(v)) return json_incref((json_t *)v);
    if (!json_is_array(v)) return NULL;
    struct tern_buf b = TERN_BUF_INIT;
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *part = json_array_get(v, i);
        const json_t *t = json_is_string(part) ? part : json_object_get(part, "text");
        if (!json_is_string(t)) continue;
        if (n++ && tern_buf_putc(&b, '\n')) goto oom;
        if (tern_buf_append(&b, json_string_value(t), json_string_length(t))) goto oom;
    }
    json_t *s = json_stringn_nocheck(b.data ? b.data : "", b.len);
    tern_buf_free(&b);
    return s;
oom:
    tern_buf_free(&b);
    return NULL;
}

json_t *api_parse_args(const char *s, size_t n) {
    json_t *o = n ? json_loadb(s, n, 0, NULL) : NULL;
    if (json_is_object(o)) return o;
    json_decref(o);
    return json_object();
}

enum tern_status api_sse_event(struct tern_buf *out, const char *event, json_t *data) {
    if (!data) return TERN_ERR_NOMEM;
    char *s = json_dumps(data, JSON_COMPACT);
    json_decref(data);
    if (!s) return TERN_ERR_NOMEM;
    enum tern_status st = tern_buf_printf(out, "event: %s\ndata: %s\n\n", event, s);
    free(s);
    return st;
}

void api_lane_of(const json_t *messages, const json_t *tools, char out[17]) {
    out[0] = 0;
    XXH3_state_t *h = XXH3_createState();
    if (!h) return;
    XXH3_64bits_reset(h);
    bool any = false;
    /* the system prompt: the system (and developer) messages before the first other one */
    for (size_t i = 0; i < json_array_size(messages); i++) {
        const json_t *m = json_array_get(messages, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || (strcmp(role, "system") && strcmp(role, "developer"))) break;
        const json_t *c = json_object_get(m, "content");
        if (json_is_string(c)) XXH3_64bits_update(h, json_string_value(c), json_string_length(c) + 1);
        any = true;
    }
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        const json_t *name = json_object_get(fn, "name");
        if (json_is_string(name)) XXH3_64bits_update(h, json_string_value(name), json_string_length(name) + 1);
        any = true;
    }
    if (any) snprintf(out, 17, "%016llx", (unsigned long long)XXH3_64bits_digest(h));
    XXH3_freeState(h);
}

/* ---- the dispatch ------------------------------------------------------------------ */

void api_out_init(struct api_out *a, enum srv_proto proto, const struct srv_resp_ctx *ctx,
                  const struct srv_request *req) {
    memset(a, 0, sizeof *a);
    a->proto = proto;
    a->ctx = ctx;
    a->req = req;
}

void api_out_free(struct api_out *a) {
    if (!a) return;
    tern_buf_free(&a->acc);
    json_decref(a->items);
    a->items = NULL;
}

enum tern_status api_stream_start(struct api_out *a, const struct srv_usage *u, struct tern_buf *out) {
    switch (a->proto) {
    case SRV_PROTO_MESSAGES: return msg_stream_start(a, u, out);
    case SRV_PROTO_RESPONSES: return rsp_stream_start(a, out);
    default: return TERN_OK;
    }
}

enum tern_status api_stream_delta(struct api_out *a, const struct reply_delta *d, const struct reply_parser *p,
                                  struct tern_buf *out) {
    switch (a->proto) {
    case SRV_PROTO_MESSAGES: return msg_stream_delta(a, d, p, out);
    case SRV_PROTO_RESPONSES: return rsp_stream_delta(a, d, p, out);
    default: return TERN_OK;
    }
}

enum tern_status api_stream_end(struct api_out *a, const struct reply_parser *p, const char *finish,
                                const char *stop_seq, const struct srv_usage *u, struct tern_buf *out) {
    switch (a->proto) {
    case SRV_PROTO_MESSAGES: return msg_stream_end(a, p, finish, stop_seq, u, out);
    case SRV_PROTO_RESPONSES: return rsp_stream_end(a, p, finish, u, out);
    default: return TERN_OK;
    }
}

enum tern_status api_stream_keepalive(struct api_out *a, struct tern_buf *out) {
    if (a->proto == SRV_PROTO_MESSAGES) return tern_buf_puts(out, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    return tern_buf_puts(out, ": keep-alive\n\n");
}

enum tern_status api_stream_error(struct api_out *a, const struct srv_error *e, struct tern_buf *out) {
    switch (a->proto) {
    case SRV_PROTO_MESSAGES: return msg_stream_error(a, e, out);
    case SRV_PROTO_RESPONSES: return rsp_stream_error(a, e, out);
    default: return srv_sse_error(out, e);
    }
}

json_t *api_response(struct api_out *a, const struct reply_parser *p, const char *finish, const char *stop_seq,
                     const struct srv_usage *u) {
    switch (a->proto) {
    case SRV_PROTO_MESSAGES: return msg_response(a, p, finish, stop_seq, u);
    case SRV_PROTO_RESPONSES: return rsp_response(a, p, finish, u);
    default: return NULL;
    }
}

char *api_error_json(enum srv_proto proto, const struct srv_error *e) {
    if (proto != SRV_PROTO_MESSAGES) return srv_error_json(e);
    json_t *o = msg_error_object(e);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}
