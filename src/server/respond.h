/* OpenAI response objects and SSE framing (pure: JSON in, bytes out).
 *
 * Streaming chat follows OpenAI's chunk sequence: a first chunk with
 * delta.role = "assistant", content/reasoning_content/tool_calls deltas, a chunk with
 * the finish_reason (and tern's reuse report), then — when stream_options.include_usage
 * — a usage chunk with "choices": [], then "data: [DONE]". Errors after the headers went
 * out are "event: error" + "data: {"error":{...}}", after which the stream ends. */
#ifndef TERN_SERVER_RESPOND_H
#define TERN_SERVER_RESPOND_H

#include "server/reply.h"
#include "server/request.h"
#include "util/buf.h"

#include <jansson.h>
#include <stdint.h>

struct srv_resp_ctx {
    const char *id;          /* "chatcmpl-..." / "cmpl-..." */
    const char *model;
    int64_t created;         /* unix seconds */
    enum srv_endpoint ep;
};

struct srv_usage {
    uint32_t prompt_tokens;
    uint32_t completion_tokens;
    uint32_t cached_tokens;
    uint32_t reasoning_tokens;   /* of completion_tokens, those generated inside a reasoning block */
};

/* The reuse report ({"reuse":{tier,cached,read,key,reason}}); a new reference or NULL
 * when there is none (e.g. before the cache is wired in). */
struct srv_reuse {
    const char *tier;        /* NULL: no report */
    uint32_t cached, read;
    const char *key;         /* "explicit" | "implicit" | "none" */
    const char *reason;
    uint32_t waited_ms;      /* it waited for a write in flight (0: did not) */
};
json_t *srv_reuse_json(const struct srv_reuse *r);

/* "data: <compact json>\n\n"; consumes a reference to o. */
enum tern_status srv_sse_data(struct tern_buf *out, json_t *o);
enum tern_status srv_sse_done(struct tern_buf *out);
enum tern_status srv_sse_comment(struct tern_buf *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
enum tern_status srv_sse_error(struct tern_buf *out, const struct srv_error *e);

/* A streamed chunk with one choice: the delta of a chat (role on the first one) or a
 * text completion's text. finish may be NULL; reuse may be NULL. */
json_t *srv_chunk_chat(const struct srv_resp_ctx *c, const struct reply_delta *d, const struct reply_parser *p,
                       bool with_role, const char *finish, const struct srv_reuse *reuse);
json_t *srv_chunk_text(const struct srv_resp_ctx *c, const char *text, size_t n, const char *finish,
                       const struct srv_reuse *reuse);
/* The usage chunk: "choices": [] and "usage". */
json_t *srv_chunk_usage(const struct srv_resp_ctx *c, const struct srv_usage *u, const struct srv_reuse *reuse);

json_t *srv_usage_json(const struct srv_usage *u);

/* Whole (non-streamed) responses. */
json_t *srv_response_chat(const struct srv_resp_ctx *c, const struct reply_parser *p, const char *finish,
                          const struct srv_usage *u, const struct srv_reuse *reuse);
json_t *srv_response_text(const struct srv_resp_ctx *c, const char *text, size_t n, const char *finish,
                          const struct srv_usage *u, const struct srv_reuse *reuse);

#endif
