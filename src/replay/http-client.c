#include "replay/http-client.h"

#include "util/mem.h"
#include "util/timeutil.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define HEADER_LIMIT (64u * 1024u)
#define CHUNK_LINE_LIMIT 4096u
#define DEFAULT_MAX_BODY ((size_t)64 << 20)
#define POLL_SLICE_MS 100

/* ---- URLs ------------------------------------------------------------------------- */

enum tern_status tern_http_url_parse(const char *url, struct tern_http_url *out) {
    memset(out, 0, sizeof *out);
    if (!url) return tern_errorf(TERN_ERR_INVALID, "missing URL");
    if (strncasecmp(url, "http://", 7) != 0) {
        if (strncasecmp(url, "https://", 8) == 0)
            return tern_errorf(TERN_ERR_INVALID, "URL '%s': https is not supported (http:// only)", url);
        return tern_errorf(TERN_ERR_INVALID, "URL '%s' does not start with http://", url);
    }
    const char *p = url + 7;
    const char *host_end;
    const char *host = p;
    if (*p == '[') { /* [v6addr] */
        host = p + 1;
        host_end = strchr(host, ']');
        if (!host_end) return tern_errorf(TERN_ERR_INVALID, "URL '%s': unterminated '[' in the host", url);
        p = host_end + 1;
    } else {
        while (*p && *p != ':' && *p != '/' && *p != '?' && *p != '#' && *p != '@') p++;
        host_end = p;
    }
    if (*p == '@') return tern_errorf(TERN_ERR_INVALID, "URL '%s': user info is not supported", url);
    size_t host_len = (size_t)(host_end - host);
    if (host_len == 0) return tern_errorf(TERN_ERR_INVALID, "URL '%s' has no host", url);
    if (host_len >= sizeof out->host)
        return tern_errorf(TERN_ERR_INVALID, "URL '%s': host is %zu bytes (limit %zu)", url, host_len,
                           sizeof out->host - 1);
    memcpy(out->host, host, host_len);
    out->port = 80;
    if (*p == ':') {
        p++;
        long port = 0;
        int n_digits = 0;
        while (*p >= '0' && *p <= '9') {
            port = port * 10 + (*p - '0');
            if (port > 65535) break;
            p++;
            n_digits++;
        }
        if (n_digits == 0 || port < 1 || port > 65535 || (*p && *p != '/'))
            return tern_errorf(TERN_ERR_INVALID, "URL '%s': port must be a number in 1..65535", url);
        out->port = (uint16_t)port;
    }
    if (*p && *p != '/') return tern_errorf(TERN_ERR_INVALID, "URL '%s': unexpected '%c' after the host", url, *p);
    if (strpbrk(p, "?#")) return tern_errorf(TERN_ERR_INVALID, "URL '%s': a query or fragment is not supported", url);
    size_t path_len = strlen(p);
    while (path_len > 0 && p[path_len - 1] == '/') path_len--;
    if (path_len >= sizeof out->base_path)
        return tern_errorf(TERN_ERR_INVALID, "URL '%s': path is %zu bytes (limit %zu)", url, path_len,
                           sizeof out->base_path - 1);
    memcpy(out->base_path, p, path_len);
    return TERN_OK;
}

/* ---- connection ------------------------------------------------------------------- */

struct conn {
    int fd;
    const struct tern_http_request *rq;
    char where[300]; /* "host:port" for messages */
};

static double ms_since(uint64_t t0) { return (double)(tern_now_ns() - t0) * 1e-6; }

/* Waits until fd is ready for `events`, in slices so that the cancel flag is seen.
 * `what` names the phase for the timeout message. */
static enum tern_status wait_fd(struct conn *c, short events, double timeout_s, const char *what) {
    uint64_t t0 = tern_now_ns();
    double limit_ms = timeout_s * 1000.0;
    for (;;) {
        if (c->rq->cancel && *c->rq->cancel)
            return tern_errorf(TERN_ERR_CANCELLED, "request to %s cancelled while %s", c->where, what);
        double left = limit_ms - ms_since(t0);
        if (left <= 0)
            return tern_errorf(TERN_ERR_IO, "no progress from %s for %.1f s (timeout) while %s", c->where, timeout_s,
                               what);
        int slice = left < POLL_SLICE_MS ? (int)left + 1 : POLL_SLICE_MS;
        struct pollfd pfd = {.fd = c->fd, .events = events};
        int r = poll(&pfd, 1, slice);
        if (r < 0) {
            if (errno == EINTR) continue;
            return tern_errorf(TERN_ERR_IO, "poll on %s: %s", c->where, strerror(errno));
        }
        if (r > 0) return TERN_OK; /* ready, or an error condition that the next call reports */
    }
}

static enum tern_status conn_open(struct conn *c, double timeout_s) {
    const struct tern_http_url *u = c->rq->url;
    char port[8];
    snprintf(port, sizeof port, "%u", (unsigned)u->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(u->host, port, &hints, &res);
    if (gai != 0) return tern_errorf(TERN_ERR_IO, "cannot resolve host '%s': %s", u->host, gai_strerror(gai));
    enum tern_status st = TERN_ERR_IO;
    char last_err[128] = "no address";
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) {
            snprintf(last_err, sizeof last_err, "socket: %s", strerror(errno));
            continue;
        }
        c->fd = fd;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            st = TERN_OK;
        } else if (errno == EINPROGRESS) {
            st = wait_fd(c, POLLOUT, timeout_s, "connecting");
            if (st == TERN_OK) {
                int err = 0;
                socklen_t len = sizeof err;
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
                if (err) {
                    snprintf(last_err, sizeof last_err, "%s", strerror(err));
                    st = TERN_ERR_IO;
                }
            } else if (st == TERN_ERR_CANCELLED) {
                close(fd);
                c->fd = -1;
                freeaddrinfo(res);
                return st;
            } else {
                snprintf(last_err, sizeof last_err, "timed out after %.1f s", timeout_s);
            }
        } else {
            snprintf(last_err, sizeof last_err, "%s", strerror(errno));
        }
        if (st == TERN_OK) break;
        close(fd);
        c->fd = -1;
    }
    freeaddrinfo(res);
    if (st != TERN_OK) return tern_errorf(TERN_ERR_IO, "connect to %s: %s", c->where, last_err);
    int one = 1; /* small requests and SSE reads: no Nagle delay on the request's tail */
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return TERN_OK;
}

static enum tern_status send_all(struct conn *c, const char *p, size_t n, double idle_s) {
    while (n > 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            enum tern_status st = wait_fd(c, POLLOUT, idle_s, "sending the request");
            if (st != TERN_OK) return st;
            continue;
        }
        return tern_errorf(TERN_ERR_IO, "sending the request to %s: %s", c->where, strerror(errno));
    }
    return TERN_OK;
}

/* ---- response parsing ------------------------------------------------------------- */

enum body_mode { BODY_NONE, BODY_LENGTH, BODY_CHUNKED, BODY_CLOSE };
enum chunk_state { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER, CH_DONE };

struct reader {
    struct conn *c;
    struct tern_http_response *rs;
    tern_http_body_fn on_body;
    void *user;
    size_t max_body;
    bool head_done;
    enum body_mode mode;
    uint64_t remaining;  /* BODY_LENGTH: bytes left; BODY_CHUNKED: bytes left in the chunk */
    uint64_t content_length;
    enum chunk_state cstate;
    char line[CHUNK_LINE_LIMIT];
    size_t line_len;
    bool done;
};

static enum tern_status deliver(struct reader *r, const char *p, size_t n) {
    if (n == 0) return TERN_OK;
    if (r->on_body) {
        if (r->on_body(r->user, p, n) != 0)
            return tern_errorf(TERN_ERR_CANCELLED, "response from %s: the body consumer stopped the request",
                               r->c->where);
        return TERN_OK;
    }
    if (r->rs->body.len + n > r->max_body)
        return tern_errorf(TERN_ERR_LIMIT, "response body from %s exceeds %zu bytes", r->c->where, r->max_body);
    return tern_buf_append(&r->rs->body, p, n);
}

/* Value of header `name` within the raw block (lines separated by CRLF or LF). */
static bool find_header(const char *blk, size_t len, const char *name, char *out, size_t cap) {
    size_t nl = strlen(name);
    const char *p = blk, *end = blk + len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        const char *colon = memchr(p, ':', (size_t)(eol - p));
        if (colon && (size_t)(colon - p) == nl && strncasecmp(p, name, nl) == 0) {
            const char *v = colon + 1, *ve = eol;
            while (v < ve && (*v == ' ' || *v == '\t')) v++;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t')) ve--;
            if (cap > 0) {
                size_t n = (size_t)(ve - v);
                if (n >= cap) n = cap - 1;
                memcpy(out, v, n);
                out[n] = 0;
            }
            return true;
        }
        p = eol + 1;
    }
    return false;
}

bool tern_http_response_header(const struct tern_http_response *rs, const char *name, char *out, size_t cap) {
    if (!rs->header.data) return false;
    return find_header(rs->header.data, rs->header.len, name, out, cap);
}

/* Parses the header block held in rs->header (status line first). Returns the number
 * of bytes it took (through the blank line), 0 if incomplete. Sets r->mode. A 1xx
 * interim response is dropped and parsing restarts on what follows. */
static enum tern_status parse_head(struct reader *r, size_t *used) {
    struct tern_buf *h = &r->rs->header;
    *used = 0;
    char *end = NULL;
    size_t blank_len = 0;
    for (size_t i = 0; i + 1 < h->len; i++) {
        if (h->data[i] == '\n' && h->data[i + 1] == '\n') {
            end = h->data + i;
            blank_len = 2;
            break;
        }
        if (i + 3 < h->len && memcmp(h->data + i, "\r\n\r\n", 4) == 0) {
            end = h->data + i;
            blank_len = 4;
            break;
        }
    }
    if (!end) {
        if (h->len > HEADER_LIMIT)
            return tern_errorf(TERN_ERR_LIMIT, "response header from %s exceeds %u bytes", r->c->where,
                               HEADER_LIMIT);
        return TERN_OK;
    }
    size_t head_len = (size_t)(end - h->data);
    *used = head_len + blank_len;
    int major = 0, minor = 0, code = 0;
    if (sscanf(h->data, "HTTP/%d.%d %d", &major, &minor, &code) != 3 || major != 1 || code < 100 || code > 999) {
        char first[80];
        size_t n = strcspn(h->data, "\r\n");
        snprintf(first, sizeof first, "%.*s", (int)TERN_MIN(n, sizeof first - 1), h->data);
        return tern_errorf(TERN_ERR_FORMAT, "response from %s is not HTTP/1.x: '%s'", r->c->where, first);
    }
    r->rs->status = code;
    /* Keep only the header lines in rs->header. */
    char *lines = memchr(h->data, '\n', head_len);
    size_t lines_off = lines ? (size_t)(lines + 1 - h->data) : head_len;
    if (lines_off > head_len) lines_off = head_len;
    char tmp[256];
    r->mode = BODY_CLOSE;
    const char *blk = h->data + lines_off;
    size_t blk_len = head_len - lines_off;
    if (code < 200 || code == 204 || code == 304) r->mode = BODY_NONE;
    else if (find_header(blk, blk_len, "Transfer-Encoding", tmp, sizeof tmp)) {
        if (strcasestr(tmp, "chunked")) r->mode = BODY_CHUNKED;
    } else if (find_header(blk, blk_len, "Content-Length", tmp, sizeof tmp)) {
        char *e;
        errno = 0;
        unsigned long long v = strtoull(tmp, &e, 10);
        if (errno || *e || tmp[0] == '-' || tmp[0] == 0)
            return tern_errorf(TERN_ERR_FORMAT, "response from %s: bad Content-Length '%s'", r->c->where, tmp);
        r->mode = BODY_LENGTH;
        r->remaining = r->content_length = v;
    }
    if (!strcasecmp(r->c->rq->method, "HEAD")) r->mode = BODY_NONE;
    if (code >= 100 && code < 200) {
        r->rs->status = 0;
        return TERN_OK; /* interim: caller drops *used bytes and parses again */
    }
    /* Move header lines to the front: rs->header holds just them. */
    memmove(h->data, blk, blk_len);
    h->len = blk_len;
    h->data[h->len] = 0;
    r->head_done = true;
    if (r->mode == BODY_NONE || (r->mode == BODY_LENGTH && r->remaining == 0)) r->done = true;
    return TERN_OK;
}

static enum tern_status chunk_line_done(struct reader *r) {
    r->line[r->line_len] = 0;
    if (r->line_len > 0 && r->line[r->line_len - 1] == '\r') r->line[--r->line_len] = 0;
    if (r->cstate == CH_SIZE) {
        char *e;
        errno = 0;
        unsigned long long v = strtoull(r->line, &e, 16);
        if (e == r->line || errno || (*e && *e != ';' && *e != ' ' && *e != '\t'))
            return tern_errorf(TERN_ERR_FORMAT, "response from %s: bad chunk size line '%.40s'", r->c->where,
                               r->line);
        r->remaining = v;
        r->cstate = v == 0 ? CH_TRAILER : CH_DATA;
    } else if (r->cstate == CH_DATA_END) {
        if (r->line_len != 0)
            return tern_errorf(TERN_ERR_FORMAT, "response from %s: chunk data not followed by CRLF", r->c->where);
        r->cstate = CH_SIZE;
    } else if (r->cstate == CH_TRAILER) {
        if (r->line_len == 0) {
            r->cstate = CH_DONE;
            r->done = true;
        }
    }
    r->line_len = 0;
    return TERN_OK;
}

static enum tern_status feed_body(struct reader *r, const char *p, size_t n) {
    enum tern_status st;
    switch (r->mode) {
    case BODY_NONE: return TERN_OK;
    case BODY_CLOSE: return deliver(r, p, n);
    case BODY_LENGTH: {
        size_t take = n < r->remaining ? n : (size_t)r->remaining;
        st = deliver(r, p, take);
        if (st != TERN_OK) return st;
        r->remaining -= take;
        if (r->remaining == 0) r->done = true;
        return TERN_OK;
    }
    case BODY_CHUNKED:
        while (n > 0 && !r->done) {
            if (r->cstate == CH_DATA) {
                size_t take = n < r->remaining ? n : (size_t)r->remaining;
                st = deliver(r, p, take);
                if (st != TERN_OK) return st;
                r->remaining -= take;
                p += take;
                n -= take;
                if (r->remaining == 0) r->cstate = CH_DATA_END;
                continue;
            }
            char ch = *p++;
            n--;
            if (ch == '\n') {
                st = chunk_line_done(r);
                if (st != TERN_OK) return st;
            } else {
                if (r->line_len + 1 >= sizeof r->line)
                    return tern_errorf(TERN_ERR_FORMAT, "response from %s: chunk framing line exceeds %u bytes",
                                       r->c->where, CHUNK_LINE_LIMIT);
                r->line[r->line_len++] = ch;
            }
        }
        return TERN_OK;
    }
    return TERN_OK;
}

static enum tern_status feed(struct reader *r, const char *p, size_t n) {
    if (!r->head_done) {
        size_t before = r->rs->header.len;
        enum tern_status st = tern_buf_append(&r->rs->header, p, n);
        if (st != TERN_OK) return st;
        for (;;) {
            size_t used;
            st = parse_head(r, &used);
            if (st != TERN_OK) return st;
            if (used == 0) return TERN_OK; /* need more */
            if (r->head_done) {
                r->rs->t_header_ns = tern_now_ns();
                /* Bytes of this read beyond the header block belong to the body. */
                size_t consumed_from_p = used - before;
                return feed_body(r, p + consumed_from_p, n - consumed_from_p);
            }
            /* An interim 1xx: drop it and parse what follows as a new head. */
            struct tern_buf *h = &r->rs->header;
            memmove(h->data, h->data + used, h->len - used);
            h->len -= used;
            h->data[h->len] = 0;
            if (used > before) {
                p += used - before;
                n -= used - before;
                before = 0;
            } else {
                before -= used;
            }
        }
    }
    return feed_body(r, p, n);
}

enum tern_status tern_http_request(const struct tern_http_request *rq, tern_http_body_fn on_body, void *user,
                                   struct tern_http_response *rs) {
    rs->status = 0;
    tern_buf_clear(&rs->header);
    tern_buf_clear(&rs->body);
    rs->t_start_ns = tern_now_ns();
    rs->t_sent_ns = rs->t_header_ns = rs->t_end_ns = 0;
    if (!rq->url || !rq->method || !rq->path || rq->path[0] != '/')
        return tern_errorf(TERN_ERR_INVALID, "HTTP request needs a URL, a method and a path starting with '/'");
    double connect_s = rq->connect_timeout_s > 0 ? rq->connect_timeout_s : 10.0;
    double idle_s = rq->idle_timeout_s > 0 ? rq->idle_timeout_s : 300.0;
    struct conn c = {.fd = -1, .rq = rq};
    if (strchr(rq->url->host, ':'))
        snprintf(c.where, sizeof c.where, "[%s]:%u", rq->url->host, (unsigned)rq->url->port);
    else
        snprintf(c.where, sizeof c.where, "%s:%u", rq->url->host, (unsigned)rq->url->port);

    enum tern_status st = conn_open(&c, connect_s);
    if (st != TERN_OK) return st;

    struct tern_buf head = TERN_BUF_INIT;
    st = tern_buf_printf(&head, "%s %s%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", rq->method,
                         rq->url->base_path, rq->path, c.where);
    if (st == TERN_OK && (rq->body_len > 0 || !strcmp(rq->method, "POST") || !strcmp(rq->method, "PUT")))
        st = tern_buf_printf(&head, "Content-Length: %zu\r\n", rq->body_len);
    for (size_t i = 0; st == TERN_OK && i < rq->n_headers; i++) {
        const char *nm = rq->headers[i].name, *v = rq->headers[i].value;
        if (strpbrk(nm, "\r\n:") || strpbrk(v, "\r\n")) {
            st = tern_errorf(TERN_ERR_INVALID, "HTTP header '%s' contains a line break or colon", nm);
            break;
        }
        st = tern_buf_printf(&head, "%s: %s\r\n", nm, v);
    }
    if (st == TERN_OK) st = tern_buf_puts(&head, "\r\n");
    if (st == TERN_OK) st = send_all(&c, head.data, head.len, idle_s);
    tern_buf_free(&head);
    if (st == TERN_OK && rq->body_len > 0) st = send_all(&c, rq->body, rq->body_len, idle_s);
    /* A server that refuses a request early (413, 401) may answer and close before the
     * body is all sent: then the answer is worth more than the broken pipe. */
    char send_err[512] = "";
    if (st == TERN_ERR_IO) {
        snprintf(send_err, sizeof send_err, "%s", tern_last_error());
        idle_s = TERN_MIN(idle_s, 2.0);
    } else if (st != TERN_OK) {
        close(c.fd);
        return st;
    }
    if (!send_err[0]) rs->t_sent_ns = tern_now_ns();

    struct reader r = {.c = &c, .rs = rs, .on_body = on_body, .user = user,
                       .max_body = rq->max_body ? rq->max_body : DEFAULT_MAX_BODY};
    char *buf = tern_malloc(64 * 1024);
    if (!buf) {
        close(c.fd);
        return tern_errorf(TERN_ERR_NOMEM, "out of memory for the receive buffer");
    }
    while (!r.done) {
        st = wait_fd(&c, POLLIN, idle_s, r.head_done ? "reading the body" : "waiting for the response");
        if (st != TERN_OK) break;
        ssize_t n = recv(c.fd, buf, 64 * 1024, 0);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            st = tern_errorf(TERN_ERR_IO, "reading from %s: %s", c.where, strerror(errno));
            break;
        }
        if (n == 0) {
            if (r.head_done && r.mode == BODY_CLOSE) {
                r.done = true;
                break;
            }
            if (!r.head_done)
                st = tern_errorf(TERN_ERR_IO, "%s closed the connection before a complete response header",
                                 c.where);
            else if (r.mode == BODY_LENGTH)
                st = tern_errorf(TERN_ERR_IO, "%s closed the connection after %llu of %llu body bytes", c.where,
                                 (unsigned long long)(r.content_length - r.remaining),
                                 (unsigned long long)r.content_length);
            else
                st = tern_errorf(TERN_ERR_IO, "%s closed the connection inside a chunked body", c.where);
            break;
        }
        st = feed(&r, buf, (size_t)n);
        if (st != TERN_OK) break;
    }
    free(buf);
    close(c.fd);
    if (send_err[0] && !r.head_done) return tern_errorf(TERN_ERR_IO, "%s", send_err);
    if (st == TERN_OK) rs->t_end_ns = tern_now_ns();
    return st;
}

enum tern_status tern_http_get(const struct tern_http_url *url, const char *path, double timeout_s,
                               struct tern_http_response *rs) {
    struct tern_http_request rq = {.method = "GET", .url = url, .path = path,
                                   .connect_timeout_s = timeout_s, .idle_timeout_s = timeout_s};
    return tern_http_request(&rq, NULL, NULL, rs);
}

void tern_http_response_free(struct tern_http_response *rs) {
    if (!rs) return;
    tern_buf_free(&rs->header);
    tern_buf_free(&rs->body);
}
