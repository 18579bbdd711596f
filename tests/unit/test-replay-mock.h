/* A mock OpenAI-compatible server for the replay harness's tests (libmicrohttpd).
 *
 * POST /v1/chat/completions streams SSE like a real server: a role chunk at once,
 * then, after a "priming" delay proportional to the tokens it reads, reasoning and
 * content chunks, a finish chunk, a usage chunk (when stream_options.include_usage) and
 * [DONE]. The prompt is the request rendered by the harness's Qwen3-style renderer;
 * tokens are bytes / 4. With reuse on it keeps every prompt it has served (plus its own
 * output, as a live server would) per cache_salt namespace and reports the longest
 * common prefix as cached tokens; with reuse off, cached is always 0. The output is a
 * function of the prompt only, so both arms answer alike. Faults can be injected to
 * exercise the harness's checks. GET /health, GET /v1/models. */
#ifndef TERN_TEST_REPLAY_MOCK_H
#define TERN_TEST_REPLAY_MOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum mock_fault {
    MOCK_FAULT_NONE = 0,
    MOCK_FAULT_CACHED_GT_PROMPT, /* usage.cached_tokens = prompt + 5 */
    MOCK_FAULT_NO_USAGE,         /* never sends a usage chunk */
    MOCK_FAULT_PROMPT_SKEW,      /* prompt_tokens + 1 */
    MOCK_FAULT_HTTP_500,         /* answers 500 with an OpenAI-shaped error */
    MOCK_FAULT_NO_FINISH,        /* the stream stops without finish_reason or [DONE] */
    MOCK_FAULT_ERROR_EVENT,      /* an SSE error event after the role chunk */
    MOCK_FAULT_IGNORE_SALT,      /* reuse across cache_salt namespaces */
    MOCK_FAULT_OUTPUT_DIFFERS,   /* output depends on the server, not only the prompt */
    MOCK_FAULT_SILENT,           /* never answers (idle timeout) */
};

struct mock_opts {
    bool reuse;
    double us_per_token;   /* priming time per token read */
    double fixed_ms;       /* per request */
    enum mock_fault fault;
    int fault_at;          /* the fault applies from this chat request on (0-based); -1 = never */
    int n_tokens;          /* output tokens unless max_tokens is smaller (default 6) */
    bool empty_output;     /* finish at once without any text (ttft from the finish chunk) */
    bool comments;         /* send ": priming" comments during the delay */
};

struct mock_server;

/* Starts on a free loopback port (port 0) or the given one. NULL on failure. */
struct mock_server *mock_start(const struct mock_opts *o, uint16_t port);
uint16_t mock_port(const struct mock_server *m);
void mock_url(const struct mock_server *m, char *out, size_t cap);
/* Chat requests served so far, and a copy of the n-th body received (caller frees). */
int mock_n_requests(struct mock_server *m);
char *mock_body(struct mock_server *m, int i, size_t *len);
void mock_stop(struct mock_server *m);

/* `serve --model X --host H --port P [--prompt-cache N] ...` as `tern serve` would be
 * called by the harness: reuse off when TERN_REUSE_POOL=0 or --prompt-cache 0. Writes
 * its pid to $MOCK_PIDDIR/<port>.pid and its arguments to $MOCK_PIDDIR/<port>.args,
 * serves until SIGTERM. MOCK_START_DELAY_MS delays health; MOCK_EXIT_AT_START=1 exits
 * at once with status 3; MOCK_PORT_TAKEN_ONCE=FILE: if FILE exists, delete it and fail
 * as a server whose port was taken. Returns the exit status. */
int mock_serve_main(int argc, char **argv);

#endif
