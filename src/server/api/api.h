/* The front doors (DESIGN.md §10): one adapter per protocol.
 *
 *   chat        OpenAI chat completions: request.c parses it, respond.c renders it
 *   messages    the Anthropic Messages API (Claude Code): messages.c
 *   responses   the OpenAI Responses API (Codex): responses.c
 *
 * An adapter does two things and nothing else. On the way in it turns its protocol's
 * JSON into the one request: a chat-completions object (messages with roles, tools,
 * tool choice, sampling, the reasoning switch as a template keyword, identity) that
 * request.c then validates exactly as it validates a chat completion, so the template,
 * the tokenizer, the cache, the engine, the grammars and the reply parser below never
 * learn which door a request came in by. On the way out it renders the one event
 * stream — start, the reply parser's deltas (reasoning, text, tool-call begin and
 * argument fragments), the finish, usage, an error — in its own wire format.
 *
 * Prefix stability is the adapters' first duty (the flat line must hold through every
 * door): a conversation renders to the same tokens whatever the client's spelling —
 * a string or a list of text blocks (both become one string, parts joined with "\n"),
 * a system message where it stands (never hoisted), the same tool list in the same
 * order, and volatile client metadata (Claude Code's billing header) dropped. */
#ifndef TERN_SERVER_API_H
#define TERN_SERVER_API_H

#include "server/reply.h"
#include "server/request.h"
#include "server/respond.h"
#include "util/buf.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* ---- in: protocol JSON -> a chat-completions object --------------------------------- */

/* Each returns a new chat-completions object (request.c's parse_body reads it), or NULL
 * with *err set (a 400 naming the protocol's own parameter). They may set the request's
 * adapter fields (proto, lane, api_tools, api_echo); nothing else. count_only: the body
 * of /v1/messages/count_tokens (no max_tokens needed). */
json_t *api_messages_request(const json_t *body, bool count_only, struct srv_request *req, struct srv_error *err);
json_t *api_responses_request(const json_t *body, struct srv_request *req, struct srv_error *err);

/* A client's session id is a key of the explicit identity (DESIGN.md §4), but one agent
 * session sends several conversations under it (Claude Code's title and summary calls and
 * subagents, Codex's review and compaction: each with its own system prompt). The lane
 * (16 hex digits of a hash of the system prompt and the tool names) is appended to such
 * keys, so each conversation parks in a lane of its own and side traffic never takes
 * the main conversation's place. Writes "" when there is nothing to hash. */
void api_lane_of(const json_t *chat_messages, const json_t *chat_tools, char out[17]);

/* ---- out: the one event stream -> wire bytes ----------------------------------------- */

enum api_open { API_OPEN_NONE = 0, API_OPEN_THINK, API_OPEN_TEXT, API_OPEN_CALL };

/* A response being rendered (the engine keeps one per request). */
struct api_out {
    enum srv_proto proto;
    const struct srv_resp_ctx *ctx;   /* borrowed */
    const struct srv_request *req;    /* borrowed */
    uint64_t seq;                     /* responses: the next sequence_number */
    enum api_open open;               /* the content block / output item now open */
    uint32_t index;                   /* its content-block index / output_index */
    uint32_t n_opened;                /* blocks / items opened so far */
    uint32_t call;                    /* API_OPEN_CALL: the parser's call index */
    char item_id[64];                 /* responses: the open item's id */
    struct tern_buf acc;              /* the open block's text so far */
    json_t *items;                    /* responses: the finished output items (owned) */
};

void api_out_init(struct api_out *a, enum srv_proto proto, const struct srv_resp_ctx *ctx,
                  const struct srv_request *req);
void api_out_free(struct api_out *a);

/* Streaming. start: the first events (message_start; response.created + in_progress),
 * sent when the request starts, before its prompt is read. delta: one step's output.
 * end: closes what is open and sends the last events. keepalive: a ping while the
 * prompt is read. error: the stream's last event after a failure. */
enum tern_status api_stream_start(struct api_out *a, const struct srv_usage *u, struct tern_buf *out);
enum tern_status api_stream_delta(struct api_out *a, const struct reply_delta *d, const struct reply_parser *p,
                                  struct tern_buf *out);
enum tern_status api_stream_end(struct api_out *a, const struct reply_parser *p, const char *finish,
                                const char *stop_seq, const struct srv_usage *u, struct tern_buf *out);
enum tern_status api_stream_keepalive(struct api_out *a, struct tern_buf *out);
enum tern_status api_stream_error(struct api_out *a, const struct srv_error *e, struct tern_buf *out);

/* The whole (non-streamed) response; a new reference or NULL. */
json_t *api_response(struct api_out *a, const struct reply_parser *p, const char *finish, const char *stop_seq,
                     const struct srv_usage *u);

/* An error body in the protocol's shape (caller frees; NULL on allocation failure). */
char *api_error_json(enum srv_proto proto, const struct srv_error *e);

/* The protocol's name of a finish ("stop", "length", "tool_calls"). */
const char *api_messages_stop_reason(const char *finish, const char *stop_seq);

/* Shared by the adapters (api.c). */
json_t *api_text_of(const json_t *v);                 /* a string, or text parts joined "\n"; NULL: none */
json_t *api_parse_args(const char *s, size_t n);     /* a call's argument text as an object ({} when not one) */
enum tern_status api_sse_event(struct tern_buf *out, const char *event, json_t *data); /* consumes data */

#endif
