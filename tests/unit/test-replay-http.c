/* replay/http-client: URLs, request framing, Content-Length / chunked / close-delimited
 * bodies, interim responses, malformed responses, refused connections, timeouts,
 * cancellation, early answers. A raw TCP server thread plays canned bytes. */
#include "harness.h"

#include "replay/http-client.h"
#include "util/timeutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct raw_server {
    int lfd;
    uint16_t port;
    pthread_t th;
    const char *pieces[8];  /* written in order, with delay_ms between them */
    int delay_ms;
    bool read_request;      /* read the request (headers + Content-Length body) first */
    bool hold_open_ms;      /* keep the connection open this long before closing */
    int hold_ms;
    size_t read_limit;      /* stop reading the request after this many bytes (early answer) */
    char request[1 << 16];  /* what was received (truncated) */
    size_t request_len;
    size_t body_received;
};

static void msleep(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *serve_one(void *arg) {
    struct raw_server *s = arg;
    int fd = accept(s->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    if (s->read_request) {
        size_t want = (size_t)-1;
        char buf[65536];
        size_t total = 0;
        for (;;) {
            if (s->read_limit && total >= s->read_limit) break;
            ssize_t n = recv(fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            size_t keep = s->request_len + (size_t)n < sizeof s->request ? (size_t)n : sizeof s->request - s->request_len;
            memcpy(s->request + s->request_len, buf, keep);
            s->request_len += keep;
            total += (size_t)n;
            if (want == (size_t)-1) {
                char *end = memmem(s->request, s->request_len, "\r\n\r\n", 4);
                if (end) {
                    size_t head = (size_t)(end + 4 - s->request);
                    const char *cl = strcasestr(s->request, "Content-Length:");
                    want = head + (cl && cl < end ? (size_t)atol(cl + 15) : 0);
                }
            }
            if (want != (size_t)-1 && total >= want) break;
        }
        s->body_received = total;
    }
    for (int i = 0; i < 8 && s->pieces[i]; i++) {
        if (i && s->delay_ms) msleep(s->delay_ms);
        if (send(fd, s->pieces[i], strlen(s->pieces[i]), MSG_NOSIGNAL) < 0) break;
    }
    if (s->hold_ms) msleep(s->hold_ms);
    close(fd);
    return NULL;
}

static void server_start(struct raw_server *s) {
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&a, &len), 0);
    assert_int_equal(listen(s->lfd, 4), 0);
    s->port = ntohs(a.sin_port);
    pthread_create(&s->th, NULL, serve_one, s);
}

static void server_join(struct raw_server *s) {
    pthread_join(s->th, NULL);
    close(s->lfd);
}

static struct tern_http_url url_for(uint16_t port, const char *base) {
    char u[128];
    snprintf(u, sizeof u, "http://127.0.0.1:%u%s", (unsigned)port, base);
    struct tern_http_url url;
    assert_int_equal(tern_http_url_parse(u, &url), TERN_OK);
    return url;
}

struct collect {
    struct tern_buf b;
    int n_calls;
    int stop_after;
};

static int collect_cb(void *user, const char *d, size_t n) {
    struct collect *c = user;
    c->n_calls++;
    tern_buf_append(&c->b, d, n);
    return c->stop_after && c->n_calls >= c->stop_after;
}

/* ---- tests ----------------------------------------------------------------------------- */

static void test_url_parse(void **state) {
    (void)state;
    struct tern_http_url u;
    assert_int_equal(tern_http_url_parse("http://127.0.0.1:8080", &u), TERN_OK);
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 8080);
    assert_string_equal(u.base_path, "");
    assert_int_equal(tern_http_url_parse("HTTP://example.org/api/v2/", &u), TERN_OK);
    assert_string_equal(u.host, "example.org");
    assert_int_equal(u.port, 80);
    assert_string_equal(u.base_path, "/api/v2");
    assert_int_equal(tern_http_url_parse("http://[::1]:9/x", &u), TERN_OK);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 9);
    static const char *const bad[][2] = {
        {"https://a.b", "https is not supported"}, {"ftp://a", "does not start with http://"},
        {"http://", "has no host"},                {"http://a:0", "port must be a number in 1..65535"},
        {"http://a:65536", "1..65535"},            {"http://a:12x", "1..65535"},
        {"http://u@a", "user info"},               {"http://a/b?q=1", "query or fragment"},
        {"http://[::1", "unterminated '['"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(tern_http_url_parse(bad[i][0], &u), TERN_ERR_INVALID);
        if (!strstr(tern_last_error(), bad[i][1]) || !strstr(tern_last_error(), bad[i][0] + 7)) {
            fprintf(stderr, "'%s': %s\n", bad[i][0], tern_last_error());
            fail();
        }
    }
}

static void test_content_length_and_request_framing(void **state) {
    (void)state;
    struct raw_server s = {.read_request = true,
                           .pieces = {"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Thing:  v1 \r\n"
                                      "Content-Length: 11\r\n\r\nhello",
                                      " world", "TRAILING-GARBAGE"},
                           .delay_ms = 20};
    server_start(&s);
    struct tern_http_url u = url_for(s.port, "/base");
    struct tern_http_header h[] = {{"Content-Type", "application/json"}, {"X-Session-Id", "abc"}};
    const char *body = "{\"a\":1}";
    struct tern_http_request rq = {.method = "POST", .url = &u, .path = "/v1/x", .headers = h, .n_headers = 2,
                                   .body = body, .body_len = strlen(body)};
    struct tern_http_response rs = TERN_HTTP_RESPONSE_INIT;
    assert_int_equal(tern_http_request(&rq, NULL, NULL, &rs), TERN_OK);
    server_join(&s);
    assert_int_equal(rs.status, 200);
    assert_string_equal(rs.body.data, "hello world"); /* exactly Content-Length bytes */
    char v[64];
    assert_true(tern_http_response_header(&rs, "x-thing", v, sizeof v));
    assert_string_equal(v, "v1");
    assert_false(tern_http_response_header(&rs, "x-missing", v, sizeof v));
    assert_true(rs.t_start_ns <= rs.t_sent_ns && rs.t_sent_ns <= rs.t_header_ns && rs.t_header_ns <= rs.t_end_ns);
    s.request[s.request_len] = 0;
    char host[64];
    snprintf(host, sizeof host, "Host: 127.0.0.1:%u\r\n", (unsigned)s.port);
    assert_true(!strncmp(s.request, "POST /base/v1/x HTTP/1.1\r\n", 26));
    assert_non_null(strstr(s.request, host));
    assert_non_null(strstr(s.request, "Connection: close\r\n"));
    assert_non_null(strstr(s.request, "Content-Length: 7\r\n"));
    assert_non_null(strstr(s.request, "X-Session-Id: abc\r\n"));
    assert_non_null(strstr(s.request, "\r\n\r\n{\"a\":1}"));
    tern_http_response_free(&rs);
}

static void test_chunked_streaming(void **state) {
    (void)state;
    struct raw_server s = {.read_request = true,
                           .pieces = {"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n",
                                      "data:", "\r\n7;ext=1\r\n hello\n\r\n", "3\r\nabc\r\n0\r\nTrailer: x\r\n\r\n"},
                           .delay_ms = 30};
    server_start(&s);
    struct tern_http_url u = url_for(s.port, "");
    struct tern_http_request rq = {.method = "GET", .url = &u, .path = "/events"};
    struct tern_http_response rs = TERN_HTTP_RESPONSE_INIT;
    struct collect c = {0};
    assert_int_equal(tern_http_request(&rq, collect_cb, &c, &rs), TERN_OK);
    server_join(&s);
    assert_int_equal(rs.status, 200);
    assert_string_equal(c.b.data, "data: hello\nabc");
    assert_true(c.n_calls >= 3); /* delivered as it arrived, not at the end */
    assert_int_equal(rs.body.len, 0);
    tern_buf_free(&c.b);
    tern_http_response_free(&rs);
}

static void test_close_delimited_and_no_body(void **state) {
    (void)state;
    struct raw_server s = {.read_request = true, .pieces = {"HTTP/1.0 200 OK\r\n\r\nuntil ", "the end"}, .delay_ms = 10};
    server_start(&s);
    struct tern_http_url u = url_for(s.port, "");
    struct tern_http_response rs = TERN_HTTP_RESPONSE_INIT;
    assert_int_equal(tern_http_get(&u, "/", 5, &rs), TERN_OK);
    server_join(&s);
    assert_string_equal(rs.body.data, "until the end");
    struct raw_server s2 = {.read_request = true, .pieces = {"HTTP/1.1 204 No Content\r\n\r\n"}, .hold_ms = 1000};
    server_start(&s2);
    u = url_for(s2.port, "");
    uint64_t t0 = tern_now_ns();
    assert_int_equal(tern_http_get(&u, "/", 5, &rs), TERN_OK);
    assert_int_equal(rs.status, 204);
    assert_true((tern_now_ns() - t0) < 1000000000ull); /* did not wait for the close (1 s) */
    server_join(&s2);
    tern_http_response_free(&rs);
}

static void test_malformed_responses(void **state) {
    (void)state;
    static const struct {
        const char *resp;
        enum tern_status st;
        const char *msg;
    } cases[] = {
        {"SSH-2.0-OpenSSH\r\n\r\n", TERN_ERR_FORMAT, "is not HTTP/1.x: 'SSH-2.0-OpenSSH'"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", TERN_ERR_IO, "after 5 of 10 body bytes"},
        {"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", TERN_ERR_FORMAT, "bad Content-Length '-3'"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", TERN_ERR_FORMAT, "bad chunk size line 'zz'"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n", TERN_ERR_FORMAT, "not followed by CRLF"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab", TERN_ERR_IO, "inside a chunked body"},
        {"HTTP/1.1 200 OK\r\nContent-Le", TERN_ERR_IO, "before a complete response header"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct raw_server s = {.read_request = true, .pieces = {cases[i].resp}};
        server_start(&s);
        struct tern_http_url u = url_for(s.port, "");
        struct tern_http_response rs = TERN_HTTP_RESPONSE_INIT;
        enum tern_status st = tern_http_get(&u, "/", 5, &rs);
        server_join(&s);
        if (st != cases[i].st || !strstr(tern_last_error(), cases[i].msg)) {
            fprintf(stderr, "case %zu: status %d, '%s'\n", i, st, tern_last_error());
            fail();
        }
        tern_http_response_free(&rs);
    }
}

static void test_refused_timeout_cancel(void **state) {
    (void)state;
    /* A port with nothing listening: bind, note it, close. */
    struct raw_server tmp = {0};
    tmp.lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    bind(tmp.lfd, (struct sockaddr *)&a, sizeof a);
    getsockname(tmp.lfd, (struct sockaddr *)&a, &len);
    close(tmp.lfd);
    struct tern_http_url u = url_for(ntohs(a.sin_port), "");
    struct tern_http_response rs = TERN_HTTP_RESPONSE_INIT;
    assert_int_equal(tern_http_get(&u, "/health", 2, &rs), TERN_ERR_IO);
    char want[96];
    snprintf(want, sizeof want, "connect to 127.0.0.1:%u: Connection refused", (unsigned)ntohs(a.sin_port));
    assert_non_null(strstr(tern_last_error(), want));
    assert_int_equal(tern_http_url_parse("http://no-such-host.invalid:1", &u), TERN_OK);
    assert_int_equal(tern_http_get(&u, "/", 2, &rs), TERN_ERR_IO);
    assert_non_null(strstr(tern_last_error(), "no-such-host.invalid"));

    /* Silent server: the idle timeout fires (the server would close at 0.7 s, which
     * would read as another error) and names the phase. */
    struct raw_server s = {.read_request = true, .hold_ms = 700};
    server_start(&s);
    u = url_for(s.port, "");
    struct tern_http_request rq = {.method = "GET", .url = &u, .path = "/", .idle_timeout_s = 0.3};
    assert_int_equal(tern_http_request(&rq, NULL, NULL, &rs), TERN_ERR_IO);
    assert_non_null(strstr(tern_last_error(), "timeout) while waiting for the response"));
    server_join(&s);

    /* Cancel flag already set: stops at once. */
    struct raw_server s2 = {.read_request = true, .hold_ms = 300};
    server_start(&s2);
    u = url_for(s2.port, "");
    volatile int cancel = 1;
    rq = (struct tern_http_request){.method = "GET", .url = &u, .path = "/", .cancel = &cancel};
    assert_int_equal(tern_http_request(&rq, NULL, NULL, &rs), TERN_ERR_CANCELLED);
    server_join(&s2);

    /* A body consumer that stops the transfer. */
    struct raw_server s3 = {.read_request = true,
                            .pieces = {"HTTP/1.1 200 OK\r\n\r\nfirst", "second"},
                            .delay_ms = 50};
    server_start(&s3);
    u = url_for(s3.port, "");
    struct collect c = {.stop_after = 1};
    rq = (struct tern_http_request){.method = "GET", .url = &u, .path = "/"};
    assert_int_equal(tern_http_request(&rq, collect_cb, &c, &rs), TERN_ERR_CANCELLED);
    assert_non_null(strstr(tern_last_error(), "body consumer stopped"));
    server_join(&s3);
    tern_buf_free(&c.b);
    tern_http_response_free(&rs);
}

static void test_large_body_and_early_answer(void **state) {
    (void)state;
    size_t n = 4u << 20;
    char *big = malloc(n);
    memset(big, 'x', n);
    struct raw_server s = {.read_request = true, .pieces = {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}};
    server_start(&s);
    struct tern_http_url u = url_for(s.port, "");
    struct tern_http_request rq = {.method = "POST", .url = &u, .path = "/", .body = big, .body_len = n};
    struct tern_http_response rs = TERN_HTTP_RESPONSE_INIT;
    assert_int_equal(tern_http_request(&rq, NULL, NULL, &rs), TERN_OK);
    server_join(&s);
    assert_true(s.body_received >= n);
    assert_string_equal(rs.body.data, "ok");
    /* A server that refuses after the header and closes: its answer is reported. */
    struct raw_server s2 = {.read_request = true, .read_limit = 1,
                            .pieces = {"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\n\r\ntoo big!"}};
    server_start(&s2);
    u = url_for(s2.port, "");
    rq.url = &u;
    enum tern_status st = tern_http_request(&rq, NULL, NULL, &rs);
    server_join(&s2);
    /* Either the answer arrived before the pipe broke, or the error says what broke. */
    if (st == TERN_OK) {
        assert_int_equal(rs.status, 413);
        assert_string_equal(rs.body.data, "too big!");
    } else {
        assert_int_equal(st, TERN_ERR_IO);
        assert_non_null(strstr(tern_last_error(), "127.0.0.1"));
    }
    free(big);
    tern_http_response_free(&rs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_url_parse),
        cmocka_unit_test(test_content_length_and_request_framing),
        cmocka_unit_test(test_chunked_streaming),
        cmocka_unit_test(test_close_delimited_and_no_body),
        cmocka_unit_test(test_malformed_responses),
        cmocka_unit_test(test_refused_timeout_cancel),
        cmocka_unit_test(test_large_body_and_early_answer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
