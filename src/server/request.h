/* OpenAI request bodies: parse, validate, normalise.
 *
 * This is the boundary where untrusted bytes become a request the engine can run.
 * Everything here is pure (no model, no I/O) so that it can be fuzzed: a body either
 * becomes a struct srv_request or a struct srv_error carrying the HTTP status, the
 * OpenAI error type, the offending parameter and a message naming the bad value.
 *
 * Chat messages are normalised into the shape chat templates expect (issue 5):
 * content-part arrays joined with "\n" into one string (as llama.cpp does), null
 * content on an assistant that calls tools -> "", tool-call `arguments` given as a JSON
 * string parsed into an object (kept as the string when it is not a JSON object), and
 * everything else (reasoning_content, name, tool_call_id, unknown keys) passed
 * through unchanged. */
#ifndef TERN_SERVER_REQUEST_H
#define TERN_SERVER_REQUEST_H

#include "server/spec.h"
#include "tern.h"

#include <jansson.h>

struct tern_grammar;
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Hard limits on what a request may ask for (Redis-style: every size is bounded). */
#define SRV_MAX_STOP 16          /* stop strings */
#define SRV_MAX_STOP_LEN 256     /* bytes per stop string */
#define SRV_MAX_KEY_LEN 256      /* session_id / prompt_cache_key / user / cache_salt */
#define SRV_MAX_PROMPT_IDS (1u << 24)
#define SRV_MAX_JSON_VALUES (1u << 20) /* values in a request body (~100 B of memory each once parsed) */

enum srv_endpoint { SRV_EP_CHAT = 0, SRV_EP_COMPLETION = 1 };

/* The protocol a request came in by (server/api/api.h). Every protocol but completions
 * becomes a chat request (SRV_EP_CHAT); the protocol only says how it is answered. */
enum srv_proto { SRV_PROTO_CHAT = 0, SRV_PROTO_MESSAGES, SRV_PROTO_RESPONSES };

/* An error in OpenAI's shape {"error":{"message","type","param","code"}}. */
struct srv_error {
    int status;          /* HTTP status */
    const char *type;    /* "invalid_request_error", "authentication_error", ... */
    const char *code;    /* NULL -> null */
    char param[96];      /* "" -> null; e.g. "messages[3].role" */
    char message[640];
};

void srv_error_set(struct srv_error *e, int status, const char *type, const char *code,
                   const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* 400 invalid_request_error with a parameter name. */
void srv_error_bad(struct srv_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* {"error":{...}} as a new JSON string (caller frees); NULL on allocation failure. */
char *srv_error_json(const struct srv_error *e);
/* An upper bound of the JSON values the text body[0..len) parses into (no allocation):
 * compared with SRV_MAX_JSON_VALUES before parsing. */
size_t srv_json_value_bound(const char *body, size_t len);

enum srv_tool_choice { SRV_TOOLS_AUTO = 0, SRV_TOOLS_NONE, SRV_TOOLS_REQUIRED, SRV_TOOLS_NAMED };

struct srv_request {
    enum srv_endpoint ep;
    char *model;                 /* as sent ("" when absent); echoed in responses */

    /* chat */
    json_t *messages;            /* normalised array (owned) */
    json_t *tools;               /* array or NULL (owned) */
    enum srv_tool_choice tool_choice;
    char *tool_name;             /* SRV_TOOLS_NAMED: the function (owned) */
    bool parallel_tool_calls;    /* default true */

    /* structured output (server/constrain.h): the compiled grammar of `grammar`,
     * `response_format` or `json_schema` (owned; NULL = unconstrained) */
    struct tern_grammar *grammar;
    const char *grammar_kind;    /* which field gave it (static) */
    json_t *template_kwargs;     /* chat_template_kwargs object or NULL (owned) */

    /* completions: either text or token ids */
    char *prompt;                /* NULL when prompt_ids is used */
    int32_t *prompt_ids;
    size_t n_prompt_ids;

    bool stream;
    bool include_usage;          /* stream_options.include_usage */
    int64_t max_tokens;          /* -1 = until the context is full */
    struct tern_sampler_params sampling;
    bool seed_set;
    int32_t *bias_ids;           /* (n_bias) logit_bias: token ids (checked against the vocabulary in prepare) */
    float *bias_vals;            /* (n_bias) their biases, -100..100 */
    size_t n_bias;
    char *stop[SRV_MAX_STOP];
    size_t n_stop;
    /* speculative decoding (docs/spec.md): "spec": "off" | "ngram", "spec_max": 1..32 */
    bool spec_set;               /* false: the server's --spec */
    enum spec_mode spec;
    uint32_t spec_max;           /* 0: the server's --spec-max */

    /* identity (DESIGN.md §4): body keys; the header x-session-id is the caller's */
    char *session_key;           /* session_id > prompt_cache_key > user; NULL = none */
    char *cache_salt;            /* NULL = none */

    /* the front door (server/api/api.h) */
    enum srv_proto proto;
    bool count_only;             /* /v1/messages/count_tokens: render and count, never run */
    char lane[17];               /* the conversation's lane under a client's session id ("" = none) */
    json_t *api_tools;           /* responses: model-facing tool name -> {kind, name, namespace} (owned) */
    json_t *api_echo;            /* responses: the request's fields the response object repeats (owned) */

    /* test-only (accepted only when the server allows it): text the engine emits
     * instead of sampling, streamed through the real detokenizer, parser and SSE. */
    char *forced_output;
    /* test-only, the same switch: text emitted first, then sampling goes on (under the
     * request's constraints: a tool call begun here is completed by the lazy grammar) */
    char *forced_prefix;
};

struct srv_parse_opts {
    size_t max_body;             /* 0 = no limit here (the HTTP layer enforces it) */
    bool allow_forced_output;    /* accept the test-only body field "tern_forced_output" */
    const char *forced_reply;    /* with allow_forced_output: the forced output of a request that names none
                                  * (TERN_TEST_FORCED_REPLY: real agent clients, which send no test fields) */
};

/* Parses and validates body[0..len) for endpoint ep. On success fills *req (free with
 * srv_request_free) and returns true; on failure fills *err, leaves *req empty and
 * returns false. Never crashes on any input. */
bool srv_request_parse(enum srv_endpoint ep, const char *body, size_t len,
                       const struct srv_parse_opts *opts, struct srv_request *req,
                       struct srv_error *err);
void srv_request_free(struct srv_request *req);

/* The same for a body of another protocol (server/api/api.h): the adapter turns it into
 * a chat request first. count_only: /v1/messages/count_tokens. */
bool srv_request_parse_proto(enum srv_proto proto, bool count_only, const char *body, size_t len,
                             const struct srv_parse_opts *opts, struct srv_request *req, struct srv_error *err);

/* Template variables for a chat request: {messages, tools?, add_generation_prompt,
 * bos_token, eos_token, <chat_template_kwargs...>}. kwargs never override messages or
 * tools. Returns a new reference, NULL on allocation failure. */
json_t *srv_template_vars(const struct srv_request *req, const char *bos_token, const char *eos_token);

/* Normalises one messages array (exposed for `tern run --chat` and tests). Returns a
 * new array or NULL with *err set. */
json_t *srv_messages_normalise(const json_t *messages, struct srv_error *err);


#endif
