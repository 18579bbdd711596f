/* server/http: routing, auth, limits, queue (429), SSE framing, cancellation on
 * disconnect, /health before and after the model is ready, /metrics — over real
 * sockets against a scripted backend (no model: the engine backend has its own e2e
 * tests). The backend streams its text through the real output parser and response
 * builders, one byte per "token". */
#include "harness.h"

#include "server/reply.h"
#include "server/respond.h"
#include "server/server.h"
#include "util/mem.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* ---- the scripted backend ---------------------------------------------------------- */

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static bool gate_open = true;
static atomic_int runs, cancelled_runs, running_now;
static atomic_int cancelled_at; /* tokens a cancelled run had produced when it saw the flag */

static const char *last_content(const struct srv_job *j) {
    size_t n = json_array_size(j->req.messages);
    return n ? json_string_value(json_object_get(json_array_get(j->req.messages, n - 1), "content")) : "";
}

static bool fake_prepare(void *self, struct srv_job *j, struct srv_error *err) {
    (void)self;
    const char *text = j->ep == SRV_EP_CHAT ? last_content(j) : (j->req.prompt ? j->req.prompt : "");
    if (!strcmp(text, "toolong")) {
        srv_error_bad(err, "messages", "the prompt is 9000 tokens; the context holds 4096");
        return false;
    }
    j->n_prompt = strlen(text);
    j->prompt = tern_malloc((j->n_prompt + 1) * sizeof *j->prompt);
    for (size_t i = 0; i < j->n_prompt; i++) j->prompt[i] = (unsigned char)text[i];
    return true;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Every wait of these tests is bounded: a server that never gets there fails the test
 * with what was awaited, instead of hanging until ctest's timeout. The bound is a count
 * of polls, far above what any machine needs; no test asserts how long anything took. */
#define WAIT_POLLS 5000 /* x 2 ms */
#define ENDLESS_TOKENS 500
#define WAIT_UNTIL(cond, what)                                                              \
    do {                                                                                    \
        int polls_ = 0;                                                                     \
        while (!(cond)) {                                                                   \
            if (++polls_ > WAIT_POLLS) fail_msg("gave up waiting for %s", what);           \
            sleep_ms(2);                                                                    \
        }                                                                                   \
    } while (0)

static void fake_run(void *self, struct srv_job *j) {
    (void)self;
    atomic_fetch_add(&runs, 1);
    atomic_fetch_add(&running_now, 1);
    const char *prompt = j->ep == SRV_EP_CHAT ? last_content(j) : (j->req.prompt ? j->req.prompt : "");
    if (!strcmp(prompt, "block")) {
        pthread_mutex_lock(&gate_mu);
        while (!gate_open) pthread_cond_wait(&gate_cv, &gate_mu);
        pthread_mutex_unlock(&gate_mu);
    }
    /* "endless": 20 ms a token for longer than any bounded wait (ENDLESS_TOKENS x 20 ms =
     * 10 s), so it ends by being cancelled, whatever the machine's speed */
    static char endless_text[ENDLESS_TOKENS + 1];
    if (!endless_text[0]) memset(endless_text, 'x', ENDLESS_TOKENS);
    bool endless = !strcmp(prompt, "endless");
    bool slow = endless || !strcmp(prompt, "slow");
    const char *text = j->req.forced_output ? j->req.forced_output
                       : endless            ? endless_text
                       : slow               ? "abcdefghijklmnopqrstuvwxyz"
                                            : "Hello world";
    struct srv_resp_ctx ctx = {.id = j->id, .model = "fake", .created = j->created, .ep = j->ep};
    struct reply_parser p;
    reply_parser_init(&p, &reply_format_qwen, j->req.tools != NULL, false, j->seq);
    struct tern_buf out = TERN_BUF_INIT;
    if (j->req.stream && j->ep == SRV_EP_CHAT) srv_sse_data(&out, srv_chunk_chat(&ctx, NULL, &p, true, NULL, NULL));
    if (j->req.stream) srv_sse_comment(&out, "priming %zu/%zu", j->n_prompt, j->n_prompt);
    size_t n = strlen(text);
    for (size_t i = 0; i < n && !atomic_load(&j->cancel); i++) {
        if (slow) sleep_ms(endless ? 20 : 40);
        if (i == 0) j->t_first = 1e-9;
        j->n_generated++;
        reply_parser_feed(&p, text + i, 1);
        if (j->req.stream && !reply_delta_empty(reply_parser_delta(&p))) {
            srv_sse_data(&out, srv_chunk_chat(&ctx, reply_parser_delta(&p), &p, false, NULL, NULL));
            reply_delta_reset(reply_parser_delta(&p));
        }
        if (out.len) {
            srv_job_write(j, out.data, out.len);
            tern_buf_clear(&out);
        }
    }
    if (atomic_load(&j->cancel)) {
        atomic_store(&cancelled_at, (int)j->n_generated);
        atomic_fetch_add(&cancelled_runs, 1);
        srv_job_finish(j, 499);
    } else {
        reply_parser_finish(&p);
        const char *finish = p.n_calls ? "tool_calls" : "stop";
        struct srv_usage u = {.prompt_tokens = (uint32_t)j->n_prompt, .completion_tokens = j->n_generated};
        struct srv_reuse r = {.tier = "cold", .read = (uint32_t)j->n_prompt, .key = j->key ? "explicit" : "none"};
        if (j->req.stream) {
            srv_sse_data(&out, srv_chunk_chat(&ctx, reply_parser_delta(&p), &p, false, finish, &r));
            if (j->req.include_usage) srv_sse_data(&out, srv_chunk_usage(&ctx, &u, &r));
            srv_sse_done(&out);
        } else {
            json_t *o = srv_response_chat(&ctx, &p, finish, &u, &r);
            json_object_set_new(o, "seen_key", json_string(j->key ? j->key : ""));
            json_object_set_new(o, "seen_tenant", json_string(j->tenant));
            char *s = json_dumps(o, JSON_COMPACT);
            tern_buf_puts(&out, s);
            free(s);
            json_decref(o);
        }
        srv_job_write(j, out.data, out.len);
        srv_job_finish(j, 200);
    }
    tern_buf_free(&out);
    reply_parser_free(&p);
    atomic_fetch_sub(&running_now, 1);
}

static json_t *fake_tokenize(void *self, const json_t *body, struct srv_error *err) {
    (void)self;
    const char *s = json_string_value(json_object_get(body, "content"));
    if (!s) {
        srv_error_bad(err, "content", "'content' must be a string");
        return NULL;
    }
    if (!strcmp(s, "block")) {
        atomic_fetch_add(&running_now, 1);
        pthread_mutex_lock(&gate_mu);
        while (!gate_open) pthread_cond_wait(&gate_cv, &gate_mu);
        pthread_mutex_unlock(&gate_mu);
        atomic_fetch_sub(&running_now, 1);
    }
    json_t *a = json_array();
    for (const char *q = s; *q; q++) json_array_append_new(a, json_integer((unsigned char)*q));
    return json_pack("{s:o}", "tokens", a);
}

static json_t *fake_model(void *self) {
    (void)self;
    return json_pack("{s:s,s:s}", "id", "fake", "object", "model");
}

static const struct srv_backend fake = {
    .prepare = fake_prepare, .run = fake_run, .tokenize = fake_tokenize, .detokenize = fake_tokenize,
    .model_entry = fake_model,
};

/* ---- a tiny HTTP client ------------------------------------------------------------ */

static int port;

/* A client socket from a loopback source address (127.0.0.x), reads bounded by 20 s so
 * that a server that never answers fails the test instead of hanging it. */
static int connect_from(const char *src) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (src) {
        struct sockaddr_in b = {.sin_family = AF_INET};
        inet_pton(AF_INET, src, &b.sin_addr);
        assert_int_equal(bind(fd, (struct sockaddr *)&b, sizeof b), 0);
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static int connect_port(void) { return connect_from(NULL); }

static void send_request(int fd, const char *method, const char *path, const char *headers, const char *body) {
    char head[1024];
    size_t bl = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n",
                     method, path, headers ? headers : "", bl);
    assert_int_equal(write(fd, head, (size_t)n), n);
    if (bl) assert_int_equal(write(fd, body, bl), (ssize_t)bl);
}

struct reply {
    int status;
    char *head;
    char *body; /* de-chunked */
};

static void dechunk(char *b) {
    char *in = b, *out = b;
    for (;;) {
        char *end;
        unsigned long n = strtoul(in, &end, 16);
        if (end == in || strncmp(end, "\r\n", 2)) break;
        in = end + 2;
        if (n == 0) break;
        memmove(out, in, n);
        out += n;
        in += n + 2;
    }
    *out = 0;
}

static struct reply http(const char *method, const char *path, const char *headers, const char *body) {
    int fd = connect_port();
    send_request(fd, method, path, headers, body);
    struct tern_buf b = TERN_BUF_INIT;
    char tmp[4096];
    ssize_t r;
    while ((r = read(fd, tmp, sizeof tmp)) > 0) tern_buf_append(&b, tmp, (size_t)r);
    close(fd);
    struct reply rep = {0};
    assert_non_null(b.data);
    assert_int_equal(sscanf(b.data, "HTTP/1.1 %d", &rep.status), 1);
    char *sep = strstr(b.data, "\r\n\r\n");
    assert_non_null(sep);
    *sep = 0;
    rep.head = tern_strdup(b.data);
    rep.body = tern_strdup(sep + 4);
    if (strcasestr(rep.head, "transfer-encoding: chunked")) dechunk(rep.body);
    tern_buf_free(&b);
    return rep;
}

static void reply_free(struct reply *r) {
    free(r->head);
    free(r->body);
}

static void assert_error_shape(const struct reply *r, int status, const char *type) {
    assert_int_equal(r->status, status);
    json_t *o = json_loads(r->body, 0, NULL);
    if (!o) fail_msg("not JSON: %s", r->body);
    json_t *e = json_object_get(o, "error");
    assert_true(json_is_string(json_object_get(e, "message")));
    assert_string_equal(json_string_value(json_object_get(e, "type")), type);
    assert_non_null(json_object_get(e, "param"));
    assert_non_null(json_object_get(e, "code"));
    json_decref(o);
}

static void test_params(struct srv_params *p, uint32_t n_queue) {
    srv_params_default(p);
    p->port = 0;
    p->n_queue = n_queue;
    p->max_body = 4096;
    p->allow_forced_output = true;
}

static struct srv_server *start_with(const struct srv_params *p) {
    struct srv_server *s;
    assert_int_equal(srv_start(p, &s), TERN_OK);
    port = srv_port(s);
    assert_true(port > 0);
    return s;
}

static struct srv_server *start(uint32_t n_queue, const char *const *keys, size_t n_keys) {
    struct srv_params p;
    test_params(&p, n_queue);
    p.api_keys = keys;
    p.n_api_keys = n_keys;
    struct srv_server *s;
    assert_int_equal(srv_start(&p, &s), TERN_OK);
    port = srv_port(s);
    assert_true(port > 0);
    return s;
}

#define CHAT(content) "{\"messages\":[{\"role\":\"user\",\"content\":\"" content "\"}]"

/* ---- tests ------------------------------------------------------------------------- */

static void test_routes_and_errors(void **state) {
    (void)state;
    struct srv_server *s = start(4, NULL, 0);
    struct reply r = http("GET", "/health", NULL, NULL);
    assert_int_equal(r.status, 503); /* no backend yet: loading */
    reply_free(&r);
    r = http("POST", "/v1/chat/completions", NULL, CHAT("hi") "}");
    assert_error_shape(&r, 503, "unavailable_error");
    reply_free(&r);
    srv_set_backend(s, &fake);
    r = http("GET", "/health", NULL, NULL);
    assert_int_equal(r.status, 200);
    reply_free(&r);
    r = http("GET", "/nope", NULL, NULL);
    assert_error_shape(&r, 404, "not_found_error");
    reply_free(&r);
    r = http("GET", "/v1/chat/completions", NULL, NULL);
    assert_error_shape(&r, 405, "invalid_request_error");
    assert_non_null(strcasestr(r.head, "Allow: POST"));
    reply_free(&r);
    r = http("POST", "/v1/chat/completions", NULL, "{\"messages\":[{\"role\":\"user\",");
    assert_error_shape(&r, 400, "invalid_request_error");
    assert_non_null(strstr(r.body, "column"));
    reply_free(&r);
    r = http("POST", "/v1/chat/completions", NULL, CHAT("toolong") "}");
    assert_error_shape(&r, 400, "invalid_request_error");
    assert_non_null(strstr(r.body, "9000"));
    reply_free(&r);
    char big[6000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    r = http("POST", "/v1/chat/completions", NULL, big);
    assert_error_shape(&r, 413, "invalid_request_error");
    reply_free(&r);
    r = http("GET", "/v1/models", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"id\":\"fake\""));
    reply_free(&r);
    r = http("POST", "/tokenize", NULL, "{\"content\":\"ab\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"tokens\":[97,98]}");
    reply_free(&r);
    r = http("GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "tern_requests_total{route=\"/v1/chat/completions\",status=\"400\"} 2"));
    assert_non_null(strstr(r.body, "tern_queue_capacity 4"));
    reply_free(&r);
    srv_stop(s);
}

static void test_auth(void **state) {
    (void)state;
    const char *keys[] = {"k1", "k2"};
    struct srv_server *s = start(4, keys, 2);
    srv_set_backend(s, &fake);
    struct reply r = http("POST", "/v1/chat/completions", NULL, CHAT("hi") "}");
    assert_error_shape(&r, 401, "authentication_error");
    reply_free(&r);
    r = http("POST", "/v1/chat/completions", "Authorization: Bearer nope\r\n", CHAT("hi") "}");
    assert_error_shape(&r, 401, "authentication_error");
    reply_free(&r);
    r = http("GET", "/health", NULL, NULL); /* health needs no key */
    assert_int_equal(r.status, 200);
    reply_free(&r);
    r = http("POST", "/v1/chat/completions", "Authorization: Bearer k2\r\nx-session-id: hdr\r\n",
             CHAT("hi") ",\"cache_salt\":\"s1\"}");
    assert_int_equal(r.status, 200);
    json_t *o = json_loads(r.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(o, "seen_key")), "hdr");
    char t1[64], t2[64], want[80];
    srv_tenant_of_key("k1", t1, sizeof t1);
    srv_tenant_of_key("k2", t2, sizeof t2);
    assert_int_equal(strlen(t2), SRV_TENANT_LEN);
    assert_string_not_equal(t1, t2);
    snprintf(want, sizeof want, "%s/salt:s1", t2);
    assert_string_equal(json_string_value(json_object_get(o, "seen_tenant")), want);
    assert_null(strstr(json_string_value(json_object_get(o, "seen_tenant")), "k2/"));
    json_decref(o);
    reply_free(&r);
    /* the body's key beats the header */
    r = http("POST", "/v1/chat/completions", "Authorization: Bearer k1\r\nx-session-id: hdr\r\n",
             CHAT("hi") ",\"user\":\"body\"}");
    o = json_loads(r.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(o, "seen_key")), "body");
    assert_string_equal(json_string_value(json_object_get(o, "seen_tenant")), t1);
    json_decref(o);
    reply_free(&r);
    srv_stop(s);
    /* the tenant is the key's, not its position: reordered and extended, k2 keeps it */
    const char *keys2[] = {"k0", "k2", "k1"};
    s = start(4, keys2, 3);
    srv_set_backend(s, &fake);
    r = http("POST", "/v1/chat/completions", "Authorization: Bearer k2\r\n", CHAT("hi") "}");
    assert_int_equal(r.status, 200);
    o = json_loads(r.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(o, "seen_tenant")), t2);
    json_decref(o);
    reply_free(&r);
    srv_stop(s);
}

static void test_non_stream_and_stream(void **state) {
    (void)state;
    struct srv_server *s = start(4, NULL, 0);
    srv_set_backend(s, &fake);
    struct reply r = http("POST", "/v1/chat/completions", NULL, CHAT("hi") ",\"tern_forced_output\":\"<think>r</think>ok\"}");
    assert_int_equal(r.status, 200);
    json_t *o = json_loads(r.body, 0, NULL);
    json_t *msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "ok");
    assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")), "r");
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_object_get(o, "tern"), "reuse"), "tier")),
                        "cold");
    json_decref(o);
    reply_free(&r);

    r = http("POST", "/v1/chat/completions", NULL,
             CHAT("hi") ",\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                        "\"tern_forced_output\":\"<tool_call>{\\\"name\\\":\\\"f\\\",\\\"arguments\\\":{\\\"a\\\":1}}</tool_call>\"}");
    assert_int_equal(r.status, 200);
    assert_non_null(strcasestr(r.head, "text/event-stream"));
    /* frames: data lines, a comment, the usage chunk with choices [], [DONE] last */
    assert_non_null(strstr(r.body, ": priming 2/2\n\n"));
    const char *done = strstr(r.body, "data: [DONE]\n\n");
    assert_non_null(done);
    assert_string_equal(done, "data: [DONE]\n\n");
    struct tern_buf args = TERN_BUF_INIT;
    int n_data = 0, n_begin = 0;
    bool saw_usage = false, saw_finish = false;
    for (char *line = strtok(r.body, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "data: ", 6) || !strcmp(line, "data: [DONE]")) continue;
        n_data++;
        json_t *c = json_loads(line + 6, 0, NULL);
        assert_non_null(c);
        json_t *choices = json_object_get(c, "choices");
        if (json_array_size(choices) == 0) {
            saw_usage = true;
            assert_int_equal(json_integer_value(json_object_get(json_object_get(c, "usage"), "completion_tokens")),
                             strlen("<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":1}}</tool_call>"));
        } else {
            json_t *ch = json_array_get(choices, 0);
            json_t *tc = json_object_get(json_object_get(ch, "delta"), "tool_calls");
            for (size_t i = 0; i < json_array_size(tc); i++) {
                json_t *t = json_array_get(tc, i);
                json_t *fn = json_object_get(t, "function");
                if (json_object_get(t, "id")) {
                    n_begin++;
                    assert_string_equal(json_string_value(json_object_get(fn, "name")), "f");
                }
                tern_buf_puts(&args, json_string_value(json_object_get(fn, "arguments")));
            }
            const char *fin = json_string_value(json_object_get(ch, "finish_reason"));
            if (fin) {
                saw_finish = true;
                assert_string_equal(fin, "tool_calls");
                assert_non_null(json_object_get(c, "tern"));
            }
        }
        json_decref(c);
    }
    assert_true(n_data > 3);
    assert_int_equal(n_begin, 1);
    assert_true(saw_usage && saw_finish);
    assert_string_equal(args.data, "{\"a\":1}");
    tern_buf_free(&args);
    reply_free(&r);
    srv_stop(s);
}

struct bg {
    const char *body;
    struct reply r;
};

static void *bg_request(void *arg) {
    struct bg *b = arg;
    b->r = http("POST", "/v1/chat/completions", NULL, b->body);
    return NULL;
}

/* True when /metrics holds the line (or fragment) want. */
static bool metrics_has(const char *want) {
    struct reply m = http("GET", "/metrics", NULL, NULL);
    bool has = strstr(m.body, want) != NULL;
    reply_free(&m);
    return has;
}

static void test_queue_full_429(void **state) {
    (void)state;
    struct srv_server *s = start(1, NULL, 0);
    srv_set_backend(s, &fake);
    pthread_mutex_lock(&gate_mu);
    gate_open = false;
    pthread_mutex_unlock(&gate_mu);
    struct bg a = {.body = CHAT("block") "}"}, b = {.body = CHAT("block") "}"};
    pthread_t ta, tb;
    atomic_store(&running_now, 0);
    pthread_create(&ta, NULL, bg_request, &a);
    WAIT_UNTIL(atomic_load(&running_now) > 0, "the first request to run (blocked)");
    pthread_create(&tb, NULL, bg_request, &b);
    WAIT_UNTIL(metrics_has("tern_queue_depth 1\n"), "the second request in the queue");
    struct reply r = http("POST", "/v1/chat/completions", NULL, CHAT("hi") "}");
    assert_error_shape(&r, 429, "rate_limit_error");
    assert_non_null(strcasestr(r.head, "Retry-After: 1"));
    reply_free(&r);
    pthread_mutex_lock(&gate_mu);
    gate_open = true;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a.r.status, 200);
    assert_int_equal(b.r.status, 200);
    reply_free(&a.r);
    reply_free(&b.r);
    srv_stop(s);
}

static void test_disconnect_cancels(void **state) {
    (void)state;
    struct srv_server *s = start(4, NULL, 0);
    srv_set_backend(s, &fake);
    atomic_store(&cancelled_runs, 0);
    atomic_store(&running_now, 0);
    for (int stream = 0; stream < 2; stream++) {
        int fd = connect_port();
        atomic_store(&cancelled_at, -1);
        send_request(fd, "POST", "/v1/chat/completions", NULL,
                     stream ? CHAT("endless") ",\"stream\":true}" : CHAT("endless") "}");
        if (stream) {
            char tmp[256];
            assert_true(read(fd, tmp, sizeof tmp) > 0); /* the stream has started */
        }
        WAIT_UNTIL(atomic_load(&running_now) == 1, "the endless request to run");
        close(fd);
        /* The running request sees the cancel flag (the client went away) and stops: one
         * more cancelled run, counted on /metrics, before its last token (the flag is
         * checked between tokens). */
        char want[64];
        snprintf(want, sizeof want, "tern_requests_cancelled_total %d\n", stream + 1);
        WAIT_UNTIL(metrics_has(want), want);
        WAIT_UNTIL(atomic_load(&running_now) == 0, "the cancelled run to return");
        assert_int_equal(atomic_load(&cancelled_runs), stream + 1);
        assert_true(atomic_load(&cancelled_at) >= 0 && atomic_load(&cancelled_at) < ENDLESS_TOKENS);
    }
    /* /metrics counts both as 499, as the log does (a stream's status line said 200) */
    struct reply m = http("GET", "/metrics", NULL, NULL);
    assert_non_null(strstr(m.body, "tern_requests_total{route=\"/v1/chat/completions\",status=\"499\"} 2\n"));
    assert_null(strstr(m.body, "tern_requests_total{route=\"/v1/chat/completions\",status=\"200\"}"));
    reply_free(&m);
    /* and the server serves the next request normally */
    struct reply r = http("POST", "/v1/chat/completions", NULL, CHAT("hi") "}");
    assert_int_equal(r.status, 200);
    reply_free(&r);
    assert_int_equal(atomic_load(&cancelled_runs), 2); /* the served one was not cancelled */
    srv_stop(s);
}

static void test_stop_with_requests_in_flight(void **state) {
    (void)state;
    struct srv_server *s = start(4, NULL, 0);
    srv_set_backend(s, &fake);
    struct bg a = {.body = CHAT("slow") ",\"stream\":true}"};
    pthread_t ta;
    atomic_store(&running_now, 0);
    pthread_create(&ta, NULL, bg_request, &a);
    WAIT_UNTIL(atomic_load(&running_now) > 0, "the slow request to run");
    srv_stop(s); /* must not hang or leak */
    pthread_join(ta, NULL);
    reply_free(&a.r);
}

/* ---- idle work (predictive priming's slot) ---------------------------------------- */

static atomic_int idle_calls, idle_now, idle_preempted, idle_during_run, idle_chunks_left;
static atomic_int idle_left_at_preempt; /* chunks still to do when the pre-emption came */

/* Idle work in 10 ms "chunks", yielding when a request is queued. */
static bool fake_idle(void *self, const atomic_int *preempt) {
    (void)self;
    atomic_fetch_add(&idle_calls, 1);
    atomic_store(&idle_now, 1);
    bool more = false;
    while (atomic_load(&idle_chunks_left) > 0) {
        if (atomic_load(preempt)) {
            atomic_store(&idle_left_at_preempt, atomic_load(&idle_chunks_left));
            atomic_fetch_add(&idle_preempted, 1);
            more = true;
            break;
        }
        sleep_ms(10);
        atomic_fetch_sub(&idle_chunks_left, 1);
    }
    atomic_store(&idle_now, 0);
    return more;
}

static void idle_run(void *self, struct srv_job *j) {
    if (atomic_load(&idle_now)) atomic_fetch_add(&idle_during_run, 1);
    fake_run(self, j);
}

static void test_idle_work_yields(void **state) {
    (void)state;
    struct srv_server *s = start(4, NULL, 0);
    struct srv_backend b = fake;
    b.run = idle_run;
    b.idle = fake_idle;
    srv_set_backend(s, &b);
    /* no job yet: no idle work */
    sleep_ms(50);
    assert_int_equal(atomic_load(&idle_calls), 0);

    /* more idle work than any wait below lasts (WAIT_POLLS x 2 ms = 10 s): it can only
     * end by being pre-empted */
    atomic_store(&idle_chunks_left, 1 << 20);
    struct reply r = http("POST", "/v1/chat/completions", NULL, CHAT("hi") "}");
    assert_int_equal(r.status, 200);
    reply_free(&r);
    WAIT_UNTIL(atomic_load(&idle_now), "the idle work to start after the job");
    /* a request pre-empts it at its next chunk boundary and is served, never while the
     * idle work runs; the idle work had work left (it yielded, it did not finish) */
    r = http("POST", "/v1/chat/completions", NULL, CHAT("hi") "}");
    assert_int_equal(r.status, 200);
    reply_free(&r);
    assert_int_equal(atomic_load(&idle_preempted), 1);
    assert_int_equal(atomic_load(&idle_during_run), 0);
    assert_true(atomic_load(&idle_left_at_preempt) > 0);
    struct reply m = http("GET", "/metrics", NULL, NULL);
    assert_non_null(strstr(m.body, "tern_preempt_wait_seconds_count 1\n"));
    reply_free(&m);

    /* it resumes when the queue is empty again, and stops being called once done */
    WAIT_UNTIL(atomic_load(&idle_now), "the idle work to resume");
    atomic_store(&idle_chunks_left, 2);
    WAIT_UNTIL(!atomic_load(&idle_now), "the idle work to finish");
    int calls = atomic_load(&idle_calls);
    sleep_ms(100);
    assert_int_equal(atomic_load(&idle_calls), calls);
    srv_stop(s);
}

/* ---- hostile clients ----------------------------------------------------------------- */

/* Everything the server sends until it closes (or 20 s pass: then NULL-terminated what came). */
static char *read_all(int fd) {
    struct tern_buf b = TERN_BUF_INIT;
    char tmp[4096];
    ssize_t r;
    while ((r = read(fd, tmp, sizeof tmp)) > 0) tern_buf_append(&b, tmp, (size_t)r);
    tern_buf_puts(&b, "");
    return tern_buf_detach(&b, NULL);
}

/* True when the server closed fd (EOF or reset) within the read timeout. */
static bool closed_by_server(int fd, char **got) {
    struct tern_buf b = TERN_BUF_INIT;
    char tmp[4096];
    ssize_t r;
    while ((r = read(fd, tmp, sizeof tmp)) > 0) tern_buf_append(&b, tmp, (size_t)r);
    bool closed = r == 0 || (r < 0 && errno == ECONNRESET);
    tern_buf_puts(&b, "");
    if (got) *got = tern_buf_detach(&b, NULL);
    else tern_buf_free(&b);
    return closed;
}

/* Idle sockets cost no thread: with 600 open (256 used to lock everyone out), /health,
 * /metrics and a chat are served. */
static void test_idle_connections_lock_nobody_out(void **state) {
    (void)state;
    struct srv_params p;
    test_params(&p, 4);
    p.max_conn_per_ip = 0;
    struct srv_server *s = start_with(&p);
    srv_set_backend(s, &fake);
    enum { N_IDLE = 600 };
    static int fds[N_IDLE];
    for (int i = 0; i < N_IDLE; i++) fds[i] = connect_port();
    /* a few of them send half a header (slowloris) */
    for (int i = 0; i < 8; i++) assert_int_equal(write(fds[i], "GET /health HTTP/1.1\r\nHo", 25), 25);
    struct reply r = http("GET", "/health", NULL, NULL);
    assert_int_equal(r.status, 200);
    reply_free(&r);
    r = http("POST", "/v1/chat/completions", NULL, CHAT("hi") "}");
    assert_int_equal(r.status, 200);
    reply_free(&r);
    /* the sockets that sent nothing are handed over by the kernel after DEFER_ACCEPT_S
     * (1 s): then they are open connections of the server's, and it still serves */
    int open = 0;
    for (int i = 0; i < 100 && open < N_IDLE; i++) {
        if (i) sleep_ms(100);
        r = http("GET", "/metrics", NULL, NULL);
        const char *m = strstr(r.body, "\ntern_http_connections_open ");
        assert_non_null(m);
        assert_int_equal(sscanf(m, "\ntern_http_connections_open %d", &open), 1);
        reply_free(&r);
    }
    assert_true(open >= N_IDLE);
    r = http("GET", "/health", NULL, NULL);
    assert_int_equal(r.status, 200);
    reply_free(&r);
    for (int i = 0; i < N_IDLE; i++) close(fds[i]);
    srv_stop(s);
}

/* A header that does not arrive in time (idle socket, slowloris, garbage without a line
 * end) gets a 408 and a close; so does a keep-alive connection left idle. */
static void test_header_and_idle_timeouts(void **state) {
    (void)state;
    struct srv_params p;
    test_params(&p, 4);
    p.header_timeout_s = 1;
    p.idle_timeout_s = 1;
    struct srv_server *s = start_with(&p);
    srv_set_backend(s, &fake);
    char *got;

    int idle = connect_port();
    assert_true(closed_by_server(idle, &got));
    assert_non_null(strstr(got, "HTTP/1.1 408 "));
    assert_non_null(strstr(got, "\"type\":\"invalid_request_error\""));
    free(got);
    close(idle);

    /* one byte every 100 ms keeps the connection active, but not its header in time:
     * the server closes it (the loop is bounded: 200 bytes, 20 s) */
    int slow = connect_port();
    const char *hdr = "GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                      "aaaaaaaaaaaaaaaaaaaaaaaa";
    bool cut = false;
    for (size_t i = 0; i < strlen(hdr) && !cut; i++) {
        if (send(slow, hdr + i, 1, MSG_NOSIGNAL) != 1) cut = true;
        sleep_ms(100);
        char c;
        if (recv(slow, &c, 1, MSG_PEEK | MSG_DONTWAIT) >= 0) cut = true;
    }
    assert_true(cut);
    assert_true(closed_by_server(slow, &got));
    /* the 408 is sent, but a byte that arrives after the close makes the kernel reset
     * the connection, which may discard it before it is read */
    assert_true(!got[0] || strstr(got, "HTTP/1.1 408 "));
    free(got);
    close(slow);

    /* bare line ends and bytes that never make a request line */
    const char *garbage[] = {"\r\n\r\n\r\n\r\n\r\n\r\n", "\x01\x02\x03\x04"};
    for (size_t g = 0; g < TERN_ARRAY_LEN(garbage); g++) {
        int fd = connect_port();
        assert_int_equal(write(fd, garbage[g], strlen(garbage[g])), (ssize_t)strlen(garbage[g]));
        assert_true(closed_by_server(fd, NULL));
        close(fd);
    }

    /* keep-alive: a response, then silence -> closed */
    int ka = connect_port();
    const char *req = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(write(ka, req, strlen(req)), (ssize_t)strlen(req));
    assert_true(closed_by_server(ka, &got));
    assert_non_null(strstr(got, "HTTP/1.1 200 "));
    free(got);
    close(ka);

    struct reply r = http("GET", "/metrics", NULL, NULL);
    unsigned n = 0;
    const char *m = strstr(r.body, "\ntern_http_header_timeouts_total ");
    assert_non_null(m);
    assert_int_equal(sscanf(m, "\ntern_http_header_timeouts_total %u", &n), 1);
    assert_true(n >= 3);
    reply_free(&r);
    srv_stop(s);
}

static int open_connections(void) {
    struct reply r = http("GET", "/metrics", NULL, NULL);
    int open = -1;
    const char *m = strstr(r.body, "\ntern_http_connections_open ");
    if (m) sscanf(m, "\ntern_http_connections_open %d", &open);
    reply_free(&r);
    return open;
}

/* One client address cannot take every connection. */
static void test_per_address_cap(void **state) {
    (void)state;
    struct srv_params p;
    test_params(&p, 4);
    p.max_conn_per_ip = 3;
    struct srv_server *s = start_with(&p);
    srv_set_backend(s, &fake);
    /* three slow clients (a connection that has sent nothing yet stays in the kernel's
     * queue until its first bytes or DEFER_ACCEPT_S: it holds nothing of the server's) */
    int fds[3];
    for (int i = 0; i < 3; i++) fds[i] = connect_from("127.0.0.2");
    /* the server has taken the three (this /metrics request is the fourth open one) */
    WAIT_UNTIL(open_connections() >= 4, "the server to accept three connections");
    int extra = connect_from("127.0.0.2"); /* the kernel accepts; the server closes it */
    const char *req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    ssize_t w = send(extra, req, strlen(req), MSG_NOSIGNAL);
    (void)w;
    char *got;
    assert_true(closed_by_server(extra, &got));
    assert_null(strstr(got, "200 OK"));
    free(got);
    close(extra);
    /* another address is served */
    struct reply r = http("GET", "/health", NULL, NULL);
    assert_int_equal(r.status, 200);
    reply_free(&r);
    /* and the capped address again once its sockets close */
    for (int i = 0; i < 3; i++) close(fds[i]);
    /* (the server notices the closes on its own time: until then it refuses, so retry,
     * boundedly) */
    bool served = false;
    for (int tries = 0; !served; tries++) {
        if (tries == WAIT_POLLS) fail_msg("the capped address was never served again");
        int again = connect_from("127.0.0.2");
        ssize_t wr = send(again, req, strlen(req), MSG_NOSIGNAL);
        got = wr == (ssize_t)strlen(req) ? read_all(again) : NULL;
        served = got && strstr(got, "HTTP/1.1 200 ");
        free(got);
        close(again);
        if (!served) sleep_ms(2);
    }
    srv_stop(s);
}

/* Framing two parties could read differently is refused with 400 and a close, before
 * the body is read. */
static void test_ambiguous_framing(void **state) {
    (void)state;
    struct srv_server *s = start(4, NULL, 0);
    srv_set_backend(s, &fake);
    const char *reqs[] = {
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\nContent-Length: 5\r\n\r\n{\"content\":\"ab\"}",
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(reqs); i++) {
        int fd = connect_port();
        assert_int_equal(write(fd, reqs[i], strlen(reqs[i])), (ssize_t)strlen(reqs[i]));
        char *got;
        assert_true(closed_by_server(fd, &got));
        if (!strstr(got, "HTTP/1.1 400 ")) fail_msg("request %zu: %s", i, got);
        assert_non_null(strstr(got, "ambiguous"));
        /* one response only */
        assert_null(strstr(strstr(got, "HTTP/1.1 400 ") + 1, "HTTP/1.1 "));
        free(got);
        close(fd);
    }
    srv_stop(s);
}

/* A client that sends its whole (too large, or unauthorised) body before reading reads
 * the 413 / 401, not a reset; one that asks for 100 Continue is answered at once. */
static void send_body_then_read(const char *headers, size_t n_body, int want_status) {
    int fd = connect_port();
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    char head[512];
    /* Connection: close, so that read_all ends with the response, not the idle timeout */
    int n = snprintf(head, sizeof head,
                     "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n",
                     headers, n_body);
    assert_int_equal(send(fd, head, (size_t)n, MSG_NOSIGNAL), n);
    static char chunk[65536];
    memset(chunk, ' ', sizeof chunk);
    size_t sent = 0;
    while (sent < n_body) {
        size_t k = n_body - sent < sizeof chunk ? n_body - sent : sizeof chunk;
        ssize_t w = send(fd, chunk, k, MSG_NOSIGNAL);
        if (w <= 0) fail_msg("the server stopped reading after %zu of %zu body bytes (%s)", sent, n_body, strerror(errno));
        sent += (size_t)w;
    }
    char *got = read_all(fd);
    char want[32];
    snprintf(want, sizeof want, "HTTP/1.1 %d ", want_status);
    if (!strstr(got, want)) fail_msg("wanted %d, got '%.200s'", want_status, got);
    free(got);
    close(fd);
}

static void test_refused_bodies_are_read(void **state) {
    (void)state;
    const char *keys[] = {"k1"};
    struct srv_server *s = start(4, NULL, 0);
    srv_set_backend(s, &fake);
    send_body_then_read("", (size_t)8 << 20, 413); /* max_body is 4096 */
    srv_stop(s);
    s = start(4, keys, 1);
    srv_set_backend(s, &fake);
    send_body_then_read("", (size_t)8 << 20, 401);
    send_body_then_read("Authorization: Bearer k1\r\n", (size_t)8 << 20, 413);
    /* Expect: 100-continue -> the answer instead of the 100, without the body */
    int fd = connect_port();
    const char *req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k1\r\n"
                      "Expect: 100-continue\r\nContent-Length: 100000000\r\n\r\n";
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    char buf[512] = {0};
    assert_true(read(fd, buf, sizeof buf - 1) > 0);
    assert_non_null(strstr(buf, "HTTP/1.1 413 "));
    close(fd);
    srv_stop(s);
}

/* A Content-Length that is not a number is refused with one 400 (libmicrohttpd's own
 * answer used to be followed by a second status line and headers). */
static void test_bad_content_length(void **state) {
    (void)state;
    struct srv_server *s = start(4, NULL, 0);
    srv_set_backend(s, &fake);
    const char *cls[] = {"-5", "abc", "5x", "-0"};
    for (size_t i = 0; i < TERN_ARRAY_LEN(cls); i++) {
        char req[256];
        snprintf(req, sizeof req, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\n\r\n{}", cls[i]);
        int fd = connect_port();
        assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
        char *got;
        assert_true(closed_by_server(fd, &got));
        if (strncmp(got, "HTTP/1.1 400 ", 13)) fail_msg("Content-Length %s: '%.200s'", cls[i], got);
        if (strstr(got, "\nHTTP/1.")) fail_msg("Content-Length %s: two responses: [%s]", cls[i], got);
        assert_non_null(strstr(got, "Content-Length"));
        free(got);
        close(fd);
    }
    /* (the count follows the close: a bounded wait for it) */
    bool counted = false;
    for (int i = 0; i < 250 && !counted; i++) {
        struct reply r = http("GET", "/metrics", NULL, NULL);
        counted = strstr(r.body, "tern_requests_total{route=\"/tokenize\",status=\"400\"} 4\n") != NULL;
        reply_free(&r);
        if (!counted) usleep(20000);
    }
    if (!counted) fail_msg("the four 400s were not counted on /metrics within 5 s");
    srv_stop(s);
}

/* Bytes that cannot start a request line (binary, a TLS hello, a run of bare line ends)
 * get a 400 and a close at once, not the 408 of the header timeout. */
static void test_garbage_request_line(void **state) {
    (void)state;
    struct srv_params p;
    test_params(&p, 4);
    p.header_timeout_s = 8;
    p.idle_timeout_s = 8;
    struct srv_server *s = start_with(&p);
    srv_set_backend(s, &fake);
    static const struct {
        const char *bytes;
        size_t n;
    } garbage[] = {
        {"\x00\x01\x02\x03", 4},
        {"\r\n\r\n\r\n\r\n\r\n\r\n", 12},
        {"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11},
        {"GET\x01/ HTTP/1.1\r\n", 16},
        {"\n\n", 2},
    };
    for (size_t g = 0; g < TERN_ARRAY_LEN(garbage); g++) {
        int fd = connect_port();
        assert_int_equal(send(fd, garbage[g].bytes, garbage[g].n, MSG_NOSIGNAL), (ssize_t)garbage[g].n);
        char *got;
        assert_true(closed_by_server(fd, &got));
        if (strncmp(got, "HTTP/1.1 400 ", 13)) fail_msg("garbage %zu: '%.200s'", g, got);
        assert_non_null(strstr(got, "\"type\":\"invalid_request_error\""));
        assert_null(strstr(got, "\nHTTP/1."));
        free(got);
        close(fd);
    }
    /* one empty line before the request line is allowed (RFC 9112 2.2), and so is a
     * request line that arrives in pieces */
    int fd = connect_port();
    const char *req = "\r\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    char *got = read_all(fd);
    assert_non_null(strstr(got, "HTTP/1.1 200 "));
    free(got);
    close(fd);
    fd = connect_port();
    assert_int_equal(write(fd, "GE", 2), 2);
    sleep_ms(50);
    req = "T /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    got = read_all(fd);
    assert_non_null(strstr(got, "HTTP/1.1 200 "));
    free(got);
    close(fd);
    struct reply r = http("GET", "/metrics", NULL, NULL);
    unsigned n = 99;
    const char *m = strstr(r.body, "\ntern_http_header_timeouts_total ");
    assert_non_null(m);
    assert_int_equal(sscanf(m, "\ntern_http_header_timeouts_total %u", &n), 1);
    assert_int_equal(n, 0);
    assert_non_null(strstr(r.body, "tern_requests_total{route=\"other\",status=\"400\"} 5\n"));
    reply_free(&r);
    srv_stop(s);
}

struct bg_tok {
    const char *content;
    struct reply r;
};

static void *bg_tokenize(void *arg) {
    struct bg_tok *b = arg;
    char body[128];
    snprintf(body, sizeof body, "{\"content\":\"%s\"}", b->content);
    b->r = http("POST", "/tokenize", NULL, body);
    return NULL;
}

/* Every admitted request answered and its place given back: a client sees its reply
 * before the server has released the request's place, so a phase that counts places
 * waits for this first. */
static void wait_idle(void) {
    WAIT_UNTIL(atomic_load(&running_now) == 0, "the fake backend to return");
    WAIT_UNTIL(metrics_has("tern_queue_depth 0\n") && metrics_has("tern_requests_running 0\n") &&
                   metrics_has("tern_tokenize_running 0\n"),
               "every place to be given back");
}

static void wait_running(int n) {
    for (int i = 0; i < 2000 && atomic_load(&running_now) < n; i++) sleep_ms(5);
    assert_int_equal(atomic_load(&running_now), n);
}

/* /tokenize and /detokenize take a place in the same bounded admission as generation:
 * when the queue is full they get 429, and while they hold the last place so does a chat. */
static void test_tokenize_admission(void **state) {
    (void)state;
    struct srv_server *s = start(1, NULL, 0);
    srv_set_backend(s, &fake);
    pthread_mutex_lock(&gate_mu);
    gate_open = false;
    pthread_mutex_unlock(&gate_mu);
    atomic_store(&running_now, 0);
    /* a blocked chat runs, a second waits in the queue (full): tokenize is refused */
    struct bg a = {.body = CHAT("block") "}"}, b = {.body = CHAT("block") "}"};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, bg_request, &a);
    wait_running(1);
    pthread_create(&tb, NULL, bg_request, &b);
    bool queued = false;
    for (int i = 0; i < 400 && !queued; i++) {
        struct reply m = http("GET", "/metrics", NULL, NULL);
        queued = strstr(m.body, "tern_queue_depth 1\n") != NULL;
        reply_free(&m);
        if (!queued) sleep_ms(5);
    }
    assert_true(queued);
    const char *routes[] = {"/tokenize", "/detokenize"};
    for (int i = 0; i < 2; i++) {
        struct reply r = http("POST", routes[i], NULL, "{\"content\":\"ab\"}");
        assert_error_shape(&r, 429, "rate_limit_error");
        assert_non_null(strcasestr(r.head, "Retry-After: 1"));
        reply_free(&r);
    }
    pthread_mutex_lock(&gate_mu);
    gate_open = true;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a.r.status, 200);
    assert_int_equal(b.r.status, 200);
    reply_free(&a.r);
    reply_free(&b.r);
    wait_idle();

    /* a tokenize that holds the only place: a chat and another tokenize get 429 */
    pthread_mutex_lock(&gate_mu);
    gate_open = false;
    pthread_mutex_unlock(&gate_mu);
    struct bg_tok t = {.content = "block"};
    pthread_t tt;
    pthread_create(&tt, NULL, bg_tokenize, &t);
    wait_running(1);
    struct reply r = http("POST", "/v1/chat/completions", NULL, CHAT("hi") "}");
    assert_error_shape(&r, 429, "rate_limit_error");
    reply_free(&r);
    r = http("POST", "/tokenize", NULL, "{\"content\":\"ab\"}");
    assert_error_shape(&r, 429, "rate_limit_error");
    reply_free(&r);
    pthread_mutex_lock(&gate_mu);
    gate_open = true;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
    pthread_join(tt, NULL);
    assert_int_equal(t.r.status, 200);
    reply_free(&t.r);
    /* the place is given back */
    wait_idle();
    r = http("POST", "/tokenize", NULL, "{\"content\":\"ab\"}");
    assert_int_equal(r.status, 200);
    reply_free(&r);
    r = http("POST", "/v1/chat/completions", NULL, CHAT("hi") "}");
    assert_int_equal(r.status, 200);
    reply_free(&r);
    srv_stop(s);
}

/* A body trickled a byte at a time never tripped the inactivity timeout (a byte every
 * 2-4 s held a connection for ever): past --body-timeout (and then SRV_MIN_BODY_RATE)
 * the server answers 408 and closes. Bounded: 100 bytes, one per 100 ms. */
static void test_slow_body_cut_off(void **state) {
    (void)state;
    struct srv_params p;
    test_params(&p, 4);
    p.body_timeout_s = 1;
    struct srv_server *s = start_with(&p);
    srv_set_backend(s, &fake);
    int fd = connect_port();
    const char *head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n";
    assert_int_equal(write(fd, head, strlen(head)), (ssize_t)strlen(head));
    bool cut = false;
    for (int i = 0; i < 100 && !cut; i++) {
        if (send(fd, " ", 1, MSG_NOSIGNAL) != 1) cut = true;
        sleep_ms(100);
        char c;
        if (recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) >= 0) cut = true;
    }
    if (!cut) fail_msg("the whole body was trickled in without the server closing the connection");
    char *got;
    assert_true(closed_by_server(fd, &got));
    /* (a byte that arrives after the close may turn it into a reset that drops the 408) */
    if (got[0] && !strstr(got, "HTTP/1.1 408 ")) fail_msg("not a 408: %.200s", got);
    if (got[0]) assert_non_null(strstr(got, "request body"));
    free(got);
    close(fd);
    struct reply r = http("GET", "/metrics", NULL, NULL);
    unsigned n = 0;
    const char *m = strstr(r.body, "\ntern_http_body_timeouts_total ");
    assert_non_null(m);
    assert_int_equal(sscanf(m, "\ntern_http_body_timeouts_total %u", &n), 1);
    assert_int_equal(n, 1);
    reply_free(&r);
    srv_stop(s);
}

/* Slow bodies filling the whole connection table used to lock everyone out (4,200 of
 * them held all 4,096 places): near the limit the longest-waiting connection is shed,
 * so /health and a chat are still served. */
static void test_slow_bodies_lock_nobody_out(void **state) {
    (void)state;
    struct srv_params p;
    test_params(&p, 4);
    p.max_conn_per_ip = 0;
    p.max_connections = 32;
    p.body_timeout_s = 3600; /* shedding, not the deadline, is what is tested */
    struct srv_server *s = start_with(&p);
    srv_set_backend(s, &fake);
    enum { N_SLOW = 48 };
    int fds[N_SLOW];
    const char *head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{";
    for (int i = 0; i < N_SLOW; i++) {
        fds[i] = connect_port();
        assert_int_equal(send(fds[i], head, strlen(head), MSG_NOSIGNAL), (ssize_t)strlen(head));
    }
    /* bounded retries: a place is made as the new connection arrives, and the shed one
     * is closed by its polling thread a moment later */
    bool served = false;
    for (int tries = 0; tries < 50 && !served; tries++) {
        int fd = connect_port();
        send_request(fd, "GET", "/health", NULL, NULL);
        char *got = read_all(fd);
        served = strstr(got, "HTTP/1.1 200 ") != NULL;
        free(got);
        close(fd);
        if (!served) sleep_ms(20);
    }
    if (!served) fail_msg("/health was not served with %d slow bodies open", N_SLOW);
    struct reply r = http("POST", "/v1/chat/completions", NULL, CHAT("hi") "}");
    assert_int_equal(r.status, 200);
    reply_free(&r);
    /* the oldest slow body was the one shed, with a 408 */
    char *got;
    assert_true(closed_by_server(fds[0], &got));
    if (got[0] && !strstr(got, "HTTP/1.1 408 ")) fail_msg("not a 408: %.200s", got);
    free(got);
    r = http("GET", "/metrics", NULL, NULL);
    unsigned n = 0;
    const char *m = strstr(r.body, "\ntern_http_connections_shed_total ");
    assert_non_null(m);
    assert_int_equal(sscanf(m, "\ntern_http_connections_shed_total %u", &n), 1);
    assert_true(n >= 1);
    reply_free(&r);
    for (int i = 0; i < N_SLOW; i++) close(fds[i]);
    srv_stop(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routes_and_errors),
        cmocka_unit_test(test_auth),
        cmocka_unit_test(test_non_stream_and_stream),
        cmocka_unit_test(test_queue_full_429),
        cmocka_unit_test(test_disconnect_cancels),
        cmocka_unit_test(test_stop_with_requests_in_flight),
        cmocka_unit_test(test_idle_work_yields),
        cmocka_unit_test(test_idle_connections_lock_nobody_out),
        cmocka_unit_test(test_header_and_idle_timeouts),
        cmocka_unit_test(test_per_address_cap),
        cmocka_unit_test(test_ambiguous_framing),
        cmocka_unit_test(test_refused_bodies_are_read),
        cmocka_unit_test(test_bad_content_length),
        cmocka_unit_test(test_garbage_request_line),
        cmocka_unit_test(test_tokenize_admission),
        cmocka_unit_test(test_slow_body_cut_off),
        cmocka_unit_test(test_slow_bodies_lock_nobody_out),
    };
    /* TERN_TEST_FILTER=test_auth (a cmocka glob) runs only the matching tests */
    if (getenv("TERN_TEST_FILTER")) cmocka_set_test_filter(getenv("TERN_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
