/* A small HTTP/1.1 client over TCP sockets, for talking to OpenAI-compatible servers
 * (the replay harness, tests that drive `tern serve`).
 *
 * Scope: http:// URLs only (no TLS), one request per connection ("Connection: close":
 * no pool to go stale between requests that are seconds apart), request bodies given
 * whole, response bodies delimited by Content-Length, chunked transfer coding or the
 * end of the connection. The body can be consumed as it arrives through a callback
 * (SSE streams), which runs on the calling thread right after each recv(), so a
 * timestamp taken inside it is the arrival time of those bytes.
 *
 * Every wait is bounded: connecting by connect_timeout_s, and every later wait for a
 * byte (or for the socket to accept more of the request) by idle_timeout_s. A server
 * that keeps a long priming alive with SSE comments is therefore never timed out, one
 * that goes silent is. The cancel flag is polled at least every 100 ms.
 *
 * Errors name what failed and where: "connect to 127.0.0.1:8080: Connection refused",
 * "no byte from 127.0.0.1:8080 for 30.0 s (idle timeout) while reading the body". */
#ifndef TERN_REPLAY_HTTP_CLIENT_H
#define TERN_REPLAY_HTTP_CLIENT_H

#include "util/buf.h"
#include "util/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tern_http_url {
    char host[256];      /* host name or address, without brackets for IPv6 */
    uint16_t port;       /* 80 when the URL names none */
    char base_path[512]; /* the URL's path without a trailing '/' ("" for the root) */
};

/* Parses "http://host[:port][/base/path]". Anything else (https, user info, a query,
 * a port outside 1..65535, a host longer than the field) fails with TERN_ERR_INVALID
 * and a message quoting the URL. */
enum tern_status tern_http_url_parse(const char *url, struct tern_http_url *out);

struct tern_http_header {
    const char *name;
    const char *value;
};

struct tern_http_request {
    const char *method;                     /* "GET", "POST" ... */
    const struct tern_http_url *url;
    const char *path;                       /* appended to url->base_path; starts with '/' */
    const struct tern_http_header *headers; /* extra headers (Host, Content-Length,
                                               Connection are written by the client) */
    size_t n_headers;
    const void *body;                       /* sent as is; NULL with body_len 0 for none */
    size_t body_len;
    double connect_timeout_s;               /* 0 = 10 s */
    double idle_timeout_s;                  /* 0 = 300 s */
    const volatile int *cancel;             /* nonzero stops the request (TERN_ERR_CANCELLED) */
    size_t max_body;                        /* cap on rs->body when no callback; 0 = 64 MiB */
};

/* Receives the decoded body (chunked framing removed) piece by piece. A nonzero
 * return aborts the request with TERN_ERR_CANCELLED (the message says so). */
typedef int (*tern_http_body_fn)(void *user, const char *data, size_t n);

struct tern_http_response {
    int status;             /* HTTP status code */
    struct tern_buf header; /* the raw header lines (status line excluded), CRLF-separated */
    struct tern_buf body;   /* the body, when the request was made without a callback */
    uint64_t t_start_ns;    /* monotonic clock (util/timeutil.h): before connect() */
    uint64_t t_sent_ns;     /* the request's last byte was written */
    uint64_t t_header_ns;   /* the response's header block was complete */
    uint64_t t_end_ns;      /* the body was complete */
};

#define TERN_HTTP_RESPONSE_INIT {0}

/* Performs one request. With on_body, the body goes to the callback and rs->body
 * stays empty; without, it is collected into rs->body. The status line and headers
 * are in rs whatever the status code (a 4xx/5xx is not an error of this function).
 * On error rs holds whatever arrived before it (status 0 if the header never
 * completed); the caller still frees rs. */
enum tern_status tern_http_request(const struct tern_http_request *rq, tern_http_body_fn on_body, void *user,
                                   struct tern_http_response *rs);

/* GET url->base_path + path, body collected. */
enum tern_status tern_http_get(const struct tern_http_url *url, const char *path, double timeout_s,
                               struct tern_http_response *rs);

/* Copies the value of the first header called `name` (case-insensitive), trimmed, into
 * out (truncated to cap - 1 bytes). false when absent. */
bool tern_http_response_header(const struct tern_http_response *rs, const char *name, char *out, size_t cap);

void tern_http_response_free(struct tern_http_response *rs);

#endif
