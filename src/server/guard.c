/* The HTTP server's guard at the door (http-impl.h): a connection's first bytes checked
 * before libmicrohttpd reads them, and room kept in the connection table. */
#include "server/http-impl.h"

/* ---- the first bytes of a connection ----------------------------------------------- */

/* The 408s the watcher (and shed_waiting) send, written once at start. */
char http_timeout_reply[512], http_body_timeout_reply[512];
size_t http_timeout_reply_len, http_body_timeout_reply_len;

void http_timeouts_init(void) {
    static const char body[] = "{\"error\":{\"message\":\"the request header did not arrive in time "
                               "(--header-timeout, --idle-timeout)\",\"type\":\"invalid_request_error\","
                               "\"param\":null,\"code\":\"request_timeout\"}}";
    int n = snprintf(http_timeout_reply, sizeof http_timeout_reply,
                     "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     sizeof body - 1, body);
    http_timeout_reply_len = n > 0 && (size_t)n < sizeof http_timeout_reply ? (size_t)n : 0;
    static const char bbody[] = "{\"error\":{\"message\":\"the request body did not arrive in time "
                                "(--body-timeout, then at least 4096 bytes a second)\",\"type\":"
                                "\"invalid_request_error\",\"param\":null,\"code\":\"request_timeout\"}}";
    n = snprintf(http_body_timeout_reply, sizeof http_body_timeout_reply,
                 "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\n\r\n%s",
                 sizeof bbody - 1, bbody);
    http_body_timeout_reply_len = n > 0 && (size_t)n < sizeof http_body_timeout_reply ? (size_t)n : 0;
}

static bool is_tchar(unsigned char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* Why p[0..n) (what a client sent first) cannot be the start of a request line; NULL
 * when it can, or when too little has arrived to tell. One empty line before the
 * request line is allowed (RFC 9112 2.2); libmicrohttpd would wait for the header
 * timeout on any number of them, and on bytes without a line end. */
static const char *request_line_garbage(const unsigned char *p, size_t n) {
    size_t i = 0;
    if (n && p[0] == '\n') i = 1;
    else if (n && p[0] == '\r') i = n > 1 && p[1] == '\n' ? 2 : 1;
    if (i >= n) return NULL;
    size_t m = 0;
    while (i < n && is_tchar(p[i])) {
        i++;
        if (++m > MAX_METHOD_LEN) return "a method longer than 32 characters";
    }
    if (i >= n) return NULL;
    if (m == 0) return p[i] == '\r' || p[i] == '\n' ? "more than one empty line before the request line"
                                                   : "bytes that do not start with a method";
    if (p[i] != ' ') return "a method followed by a byte that is not a space";
    if (i + 1 < n && (p[i + 1] <= 0x20 || p[i + 1] >= 0x7f)) return "no request target after the method";
    return NULL;
}

/* In a complete header block p[0..n): a Content-Length value that is not a number.
 * libmicrohttpd 0.9.75 answers that one itself, with its status line and headers sent
 * twice (two responses for a proxy to pair with requests: the smuggling surface), and
 * never calls the handler, so it has to be caught before the library reads it. */
static bool header_has_bad_length(const unsigned char *p, size_t n) {
    const unsigned char *end = NULL;
    for (size_t i = 0; i + 1 < n && !end; i++)
        if (p[i] == '\n' && (p[i + 1] == '\n' || (p[i + 1] == '\r' && i + 2 < n && p[i + 2] == '\n'))) end = p + i + 1;
    if (!end) return false; /* not all there: libmicrohttpd decides */
    const unsigned char *line = memchr(p, '\n', (size_t)(end - p));
    while (line && line + 1 < end) {
        line++;
        const unsigned char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) break;
        size_t len = (size_t)(eol - line);
        if (len >= 15 && !strncasecmp((const char *)line, "Content-Length:", 15)) {
            const unsigned char *v = line + 15, *ve = eol;
            while (v < ve && (*v == ' ' || *v == '\t')) v++;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t')) ve--;
            if (v == ve) return true;
            for (; v < ve; v++)
                if (*v < '0' || *v > '9') return true;
        }
        line = eol;
    }
    return false;
}

/* What else a complete header block p[0..n) (the first request of a connection) may
 * hold that libmicrohttpd gets wrong, with the status to answer (0: nothing): a NUL
 * byte in a header (libmicrohttpd cut the value there and accepted it), a Content-Length
 * too large for 64 bits (its 413 came with the status line and headers twice), a first
 * chunk size of 16 or more hex digits or at least 2^63 (it closed the connection
 * without a word) or larger than max_body (413 at once instead of after the reads). */
static int header_edge_refusal(const unsigned char *p, size_t n, size_t max_body, char *msg, size_t cap) {
    const unsigned char *end = NULL;
    for (size_t i = 0; i + 1 < n && !end; i++)
        if (p[i] == '\n' && (p[i + 1] == '\n' || (p[i + 1] == '\r' && i + 2 < n && p[i + 2] == '\n'))) end = p + i + 1;
    if (!end) return 0; /* not all there: libmicrohttpd decides (and the header timeout) */
    if (memchr(p, 0, (size_t)(end - p))) {
        snprintf(msg, cap, "a header holds a NUL byte");
        return 400;
    }
    bool chunked = false;
    const unsigned char *line = memchr(p, '\n', (size_t)(end - p));
    while (line && line + 1 < end) {
        line++;
        const unsigned char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) break;
        size_t len = (size_t)(eol - line);
        if (len >= 15 && !strncasecmp((const char *)line, "Content-Length:", 15)) {
            const unsigned char *v = line + 15, *ve = eol;
            while (v < ve && (*v == ' ' || *v == '\t' || *v == '0')) v++;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t')) ve--;
            uint64_t val = 0;
            bool over = false;
            for (const unsigned char *d = v; d < ve && !over; d++) {
                if (*d < '0' || *d > '9') break; /* header_has_bad_length's case */
                if (val > (UINT64_MAX - (uint64_t)(*d - '0')) / 10) over = true;
                else val = val * 10 + (uint64_t)(*d - '0');
            }
            if (over) {
                snprintf(msg, cap, "the Content-Length does not fit in 64 bits; the limit is %zu bytes (--max-body)",
                         max_body);
                return 413;
            }
        } else if (len >= 18 && !strncasecmp((const char *)line, "Transfer-Encoding:", 18)) {
            chunked = true; /* (only "chunked" passes the framing check) */
        }
        line = eol;
    }
    if (!chunked) return 0;
    const unsigned char *c = end + (end[0] == '\r' ? 2 : 1), *e = p + n;
    while (c < e && *c == '0' && c + 1 < e && isxdigit(c[1])) c++;
    size_t digits = 0;
    uint64_t size = 0;
    for (; c < e && isxdigit(*c); c++, digits++)
        if (digits < 16) size = size * 16 + (uint64_t)(isdigit(*c) ? *c - '0' : (tolower(*c) - 'a' + 10));
    if (c == e) return 0; /* the size line is not all there: libmicrohttpd decides */
    if (digits >= 16 || size >= ((uint64_t)1 << 63)) {
        snprintf(msg, cap, "a chunk size of %zu hex digits is not a size this server can read", digits);
        return 400;
    }
    if (size > max_body) {
        snprintf(msg, cap, "a chunk of %llu bytes exceeds the limit of %zu bytes (--max-body)", (unsigned long long)size,
                 max_body);
        return 413;
    }
    return 0;
}

/* The route of a request line's target (for /metrics), R_NONE when there is none. */
static enum route first_line_route(const unsigned char *p, size_t n) {
    const unsigned char *sp = memchr(p, ' ', n);
    if (!sp) return R_NONE;
    const unsigned char *t = sp + 1, *e = t;
    while (e < p + n && *e != ' ' && *e != '?' && *e != '\r' && *e != '\n') e++;
    char url[64];
    size_t len = (size_t)(e - t);
    if (len >= sizeof url) return R_NONE;
    memcpy(url, t, len);
    url[len] = 0;
    return http_find_route(url);
}

/* Looks at what a new connection sent first, before libmicrohttpd reads it (it has not
 * yet: this runs as the connection is accepted, and TCP_DEFER_ACCEPT on the listening
 * socket makes the kernel hand it over once the first bytes are there). Garbage where
 * the request line should be, or a header with a Content-Length that is no number, is
 * answered with one 400 and a close, at once; anything else (including nothing yet) is
 * left to libmicrohttpd. A keep-alive connection's later requests are not seen here. */
static bool first_bytes_refused(struct srv_server *s, int fd) {
    unsigned char buf[FIRST_BYTES_MAX];
    ssize_t n = recv(fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0) return false;
    const char *why = request_line_garbage(buf, (size_t)n);
    enum route route = R_NONE;
    char msg[160];
    int status = 400;
    if (why) {
        snprintf(msg, sizeof msg, "the connection began with %s; expected a request line (METHOD /path HTTP/1.1)", why);
    } else if (header_has_bad_length(buf, (size_t)n)) {
        route = first_line_route(buf, (size_t)n);
        snprintf(msg, sizeof msg, "the Content-Length header is not a decimal number of bytes");
    } else if ((status = header_edge_refusal(buf, (size_t)n, s->p.max_body, msg, sizeof msg))) {
        route = first_line_route(buf, (size_t)n);
    } else {
        return false;
    }
    /* take the bytes already there, so that the close does not turn into a reset that
     * could discard the answer before the client reads it */
    ssize_t r = recv(fd, buf, (size_t)n, MSG_DONTWAIT);
    (void)r;
    struct srv_error err = {0};
    if (status == 413) srv_error_set(&err, 413, "invalid_request_error", "request_too_large", NULL, "%s", msg);
    else srv_error_bad(&err, NULL, "%s", msg);
    char *body = srv_error_json(&err);
    char head[256];
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 %s\r\nConnection: close\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      status == 413 ? "413 Content Too Large" : "400 Bad Request", body ? strlen(body) : 0);
    if (hn > 0 && (size_t)hn < sizeof head) {
        ssize_t w = send(fd, head, (size_t)hn, MSG_DONTWAIT | MSG_NOSIGNAL | (body ? MSG_MORE : 0));
        if (w == hn && body) w = send(fd, body, strlen(body), MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)w; /* best effort, as the 408: the close is what matters */
    }
    free(body);
    shutdown(fd, SHUT_RDWR); /* libmicrohttpd reads the end of the stream and closes */
    http_count_request(s, route, status);
    TERN_LOG_INFO("request - %s %d : %s", http_route_names[route], status, msg);
    return true;
}

/* How many places of the connection table are kept free for new clients: past
 * max_connections minus this, each new connection closes a waiting one (below). */
static uint32_t shed_headroom(uint32_t max_connections) {
    uint32_t h = max_connections / 16;
    return h < 2 ? 2 : h > 64 ? 64 : h;
}

/* The connection table is nearly full: close the connection that has waited longest for
 * its header or body (or sat idle in keep-alive), with a 408, so that a new client (a
 * health check, a chat) finds a place however many slow ones hold the rest. Connections
 * whose request is being prepared or run are never shed (their deadline is 0). The list
 * is newest first, so the last waiting one is the oldest. */
static void shed_waiting(struct srv_server *s, const struct sock *self) {
    pthread_mutex_lock(&s->smu);
    struct sock *victim = NULL;
    for (struct sock *sk = s->socks; sk; sk = sk->next)
        if (sk != self && sk->deadline > 0 && sk->fd >= 0) victim = sk;
    if (victim) {
        bool body = victim->wait == W_BODY;
        victim->deadline = 0;
        ssize_t w = send(victim->fd, body ? http_body_timeout_reply : http_timeout_reply,
                         body ? http_body_timeout_reply_len : http_timeout_reply_len, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)w;
        shutdown(victim->fd, SHUT_RDWR);
        atomic_fetch_add(&s->conns_shed, 1);
    }
    pthread_mutex_unlock(&s->smu);
}

void http_notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                              enum MHD_ConnectionNotificationCode code) {
    struct srv_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        struct sock *sk = tern_calloc(1, sizeof *sk);
        if (!sk) return; /* no deadline for this one; MHD's idle timeout still applies */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        sk->fd = ci ? ci->connect_fd : -1;
        sk->deadline = tern_now_s() + s->p.header_timeout_s;
        if (sk->fd >= 0 && first_bytes_refused(s, sk->fd)) sk->deadline = 0; /* answered and closing */
        pthread_mutex_lock(&s->smu);
        sk->next = s->socks;
        if (s->socks) s->socks->prev = sk;
        s->socks = sk;
        pthread_mutex_unlock(&s->smu);
        *socket_context = sk;
        int open = atomic_fetch_add(&s->conns_open, 1) + 1;
        atomic_fetch_add(&s->conns_total, 1);
        if ((uint32_t)open > s->p.max_connections - shed_headroom(s->p.max_connections)) shed_waiting(s, sk);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct sock *sk = *socket_context;
        atomic_fetch_sub(&s->conns_open, 1);
        if (!sk) return;
        /* MHD closes the descriptor after this: from here on the watcher must not touch it */
        pthread_mutex_lock(&s->smu);
        if (sk->prev) sk->prev->next = sk->next;
        else s->socks = sk->next;
        if (sk->next) sk->next->prev = sk->prev;
        pthread_mutex_unlock(&s->smu);
        free(sk);
        *socket_context = NULL;
    }
}
