/* The HTTP server: routing, auth, limits, queue, worker, streaming (see server.h).
 *
 * libmicrohttpd runs one thread per connection. That makes the waiting simple and
 * correct: a connection thread may block on its job (a non-streamed request) or inside
 * the content reader of a streamed one, and while it waits it polls its own socket so
 * that a client that hangs up cancels its request within ~100 ms, even while the
 * engine is still priming and nothing is being written. */
#include "server/server.h"

#include "server/respond.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#if MHD_VERSION < 0x00097002
typedef int MHD_Result;
#else
typedef enum MHD_Result MHD_Result;
#endif

#define WAIT_SLICE_MS 100
#define KEEPALIVE_S 10.0

enum route {
    R_NONE = 0, R_HEALTH, R_METRICS, R_MODELS, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE, R_COUNT
};

static const char *const route_names[R_COUNT] = {"other", "/health", "/metrics", "/v1/models", "/v1/chat/completions",
                                                 "/v1/completions", "/tokenize", "/detokenize"};

/* status classes counted per route for /metrics */
static const int counted_status[] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
#define N_COUNTED TERN_ARRAY_LEN(counted_status)

struct srv_server {
    struct srv_params p;
    char **api_keys;
    struct MHD_Daemon *mhd;
    int port;
    _Atomic(const struct srv_backend *) backend;
    atomic_bool stopping;
    atomic_uint_fast64_t seq;

    /* the queue and the worker */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    struct srv_job **queue;      /* ring of n_queue */
    uint32_t q_head, q_len;
    struct srv_job *running;
    pthread_t worker;
    bool worker_started;
    /* idle work (backend->idle): pending after a job ran; running while the worker is
     * in it; preempt is set (under qmu) by every enqueue and by srv_stop, and read by
     * the idle work between chunks */
    bool idle_pending, idle_running;
    volatile int preempt;

    /* live jobs, to cancel them all at shutdown */
    pthread_mutex_t jmu;
    struct srv_job **live;
    size_t n_live, cap_live;

    /* metrics */
    atomic_uint_fast64_t requests[R_COUNT][N_COUNTED + 1];
    atomic_uint_fast64_t prompt_tokens, cached_tokens, read_tokens, generated_tokens, cancelled;
    atomic_uint_fast64_t ttft_us_sum, ttft_count, overhead_us_sum;
    atomic_uint_fast64_t preempt_us_sum, preempt_count;
    double t_start;
};

/* ---- jobs -------------------------------------------------------------------------- */

void srv_job_write(struct srv_job *j, const char *data, size_t n) {
    pthread_mutex_lock(&j->mu);
    /* A client that stopped reading must not make the server hold an unbounded
     * backlog: past 64 MiB unread the request is cancelled. */
    if (j->out.len - j->out_read > ((size_t)64 << 20)) {
        j->cancel = 1;
    } else if (tern_buf_append(&j->out, data, n) != TERN_OK) {
        j->cancel = 1;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void srv_job_finish(struct srv_job *j, int status) {
    pthread_mutex_lock(&j->mu);
    j->done = true;
    j->status = status;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static struct srv_job *job_new(struct srv_server *s) {
    struct srv_job *j = tern_calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->seq = atomic_fetch_add(&s->seq, 1) + 1;
    j->created = (int64_t)time(NULL);
    j->t_arrive = tern_now_s();
    pthread_mutex_lock(&s->jmu);
    if (s->n_live == s->cap_live) {
        size_t cap = s->cap_live ? s->cap_live * 2 : 64;
        struct srv_job **l = tern_reallocarray(s->live, cap, sizeof *l);
        if (!l) {
            pthread_mutex_unlock(&s->jmu);
            pthread_mutex_destroy(&j->mu);
            pthread_cond_destroy(&j->cv);
            free(j);
            return NULL;
        }
        s->live = l;
        s->cap_live = cap;
    }
    s->live[s->n_live++] = j;
    pthread_mutex_unlock(&s->jmu);
    return j;
}

static void job_ref(struct srv_job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

static void job_unref(struct srv_server *s, struct srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    pthread_mutex_lock(&s->jmu);
    for (size_t i = 0; i < s->n_live; i++) {
        if (s->live[i] == j) {
            s->live[i] = s->live[--s->n_live];
            break;
        }
    }
    pthread_mutex_unlock(&s->jmu);
    const struct srv_backend *b = atomic_load(&s->backend);
    if (j->priv && b && b->job_free) b->job_free(b->self, j);
    srv_request_free(&j->req);
    free(j->tenant);
    free(j->key);
    free(j->prompt);
    tern_buf_free(&j->out);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* ---- metrics and the log line ------------------------------------------------------ */

static void count_request(struct srv_server *s, enum route r, int status) {
    size_t k = N_COUNTED;
    for (size_t i = 0; i < N_COUNTED; i++)
        if (counted_status[i] == status) k = i;
    atomic_fetch_add(&s->requests[r][k], 1);
}

static void log_job(struct srv_server *s, const struct srv_job *j, int status) {
    double now = tern_now_s();
    double total = now - j->t_arrive;
    double ttft = j->t_first > 0 ? j->t_first - j->t_arrive : -1;
    double gen_s = j->t_first > 0 ? now - j->t_first : 0;
    double tps = gen_s > 0 && j->n_generated > 1 ? (j->n_generated - 1) / gen_s : 0;
    /* what the first token cost beyond reading the prompt's tokens: the wait in the queue,
     * parsing, rendering, tokenizing, the reuse decision, restoring a checkpoint, the first
     * sample */
    double overhead = ttft >= 0 ? ttft - j->t_prime : -1;
    char ttft_s[64];
    if (ttft >= 0) snprintf(ttft_s, sizeof ttft_s, "%.3fs prime=%.3fs", ttft, j->t_prime);
    else snprintf(ttft_s, sizeof ttft_s, "-");
    char pre_s[48] = "", spec_s[48] = "";
    if (j->t_preempt_from > 0) snprintf(pre_s, sizeof pre_s, " preempt_wait=%.3fs", j->t_preempt_wait);
    if (j->n_drafted) snprintf(spec_s, sizeof spec_s, " drafted=%u accepted=%u", j->n_drafted, j->n_accepted);
    TERN_LOG_INFO("request %s %s %d prompt=%zu cached=%u read=%u generated=%u ttft=%s total=%.3fs %.1f tok/s%s%s%s%s",
                  j->id, j->path, status, j->n_prompt, j->n_cached, j->n_read, j->n_generated, ttft_s, total, tps,
                  spec_s, pre_s, j->note[0] ? " : " : "", j->note);
    atomic_fetch_add(&s->prompt_tokens, j->n_prompt);
    atomic_fetch_add(&s->cached_tokens, j->n_cached);
    atomic_fetch_add(&s->read_tokens, j->n_read);
    atomic_fetch_add(&s->generated_tokens, j->n_generated);
    if (ttft >= 0) {
        atomic_fetch_add(&s->ttft_us_sum, (uint64_t)(ttft * 1e6));
        atomic_fetch_add(&s->ttft_count, 1);
        atomic_fetch_add(&s->overhead_us_sum, (uint64_t)(overhead > 0 ? overhead * 1e6 : 0));
    }
}

static void render_metrics(struct srv_server *s, struct tern_buf *b) {
    tern_buf_puts(b, "# HELP tern_requests_total HTTP requests by route and status.\n"
                     "# TYPE tern_requests_total counter\n");
    for (int r = 0; r < R_COUNT; r++) {
        for (size_t k = 0; k <= N_COUNTED; k++) {
            uint64_t v = atomic_load(&s->requests[r][k]);
            if (!v) continue;
            if (k < N_COUNTED)
                tern_buf_printf(b, "tern_requests_total{route=\"%s\",status=\"%d\"} %llu\n", route_names[r],
                                counted_status[k], (unsigned long long)v);
            else
                tern_buf_printf(b, "tern_requests_total{route=\"%s\",status=\"other\"} %llu\n", route_names[r],
                                (unsigned long long)v);
        }
    }
    pthread_mutex_lock(&s->qmu);
    uint32_t q = s->q_len;
    bool busy = s->running != NULL;
    pthread_mutex_unlock(&s->qmu);
    tern_buf_printf(b,
                    "# TYPE tern_queue_depth gauge\ntern_queue_depth %u\n"
                    "# TYPE tern_queue_capacity gauge\ntern_queue_capacity %u\n"
                    "# TYPE tern_engine_busy gauge\ntern_engine_busy %d\n"
                    "# TYPE tern_prompt_tokens_total counter\ntern_prompt_tokens_total %llu\n"
                    "# TYPE tern_prompt_tokens_cached_total counter\ntern_prompt_tokens_cached_total %llu\n"
                    "# TYPE tern_prompt_tokens_read_total counter\ntern_prompt_tokens_read_total %llu\n"
                    "# TYPE tern_generated_tokens_total counter\ntern_generated_tokens_total %llu\n"
                    "# TYPE tern_requests_cancelled_total counter\ntern_requests_cancelled_total %llu\n"
                    "# HELP tern_ttft_seconds Time from arrival to the first generated token.\n"
                    "# TYPE tern_ttft_seconds summary\ntern_ttft_seconds_sum %.6f\ntern_ttft_seconds_count %llu\n"
                    "# HELP tern_ttft_overhead_seconds The part of the time to first token not spent reading "
                    "prompt tokens (queue wait, parse, render, tokenize, reuse decision, restore, first sample).\n"
                    "# TYPE tern_ttft_overhead_seconds summary\ntern_ttft_overhead_seconds_sum %.6f\n"
                    "tern_ttft_overhead_seconds_count %llu\n"
                    "# HELP tern_preempt_wait_seconds How long requests that arrived during idle work waited for it.\n"
                    "# TYPE tern_preempt_wait_seconds summary\ntern_preempt_wait_seconds_sum %.6f\n"
                    "tern_preempt_wait_seconds_count %llu\n"
                    "# TYPE tern_uptime_seconds gauge\ntern_uptime_seconds %.1f\n",
                    q, s->p.n_queue, busy ? 1 : 0, (unsigned long long)atomic_load(&s->prompt_tokens),
                    (unsigned long long)atomic_load(&s->cached_tokens),
                    (unsigned long long)atomic_load(&s->read_tokens),
                    (unsigned long long)atomic_load(&s->generated_tokens),
                    (unsigned long long)atomic_load(&s->cancelled), (double)atomic_load(&s->ttft_us_sum) * 1e-6,
                    (unsigned long long)atomic_load(&s->ttft_count), (double)atomic_load(&s->overhead_us_sum) * 1e-6,
                    (unsigned long long)atomic_load(&s->ttft_count), (double)atomic_load(&s->preempt_us_sum) * 1e-6,
                    (unsigned long long)atomic_load(&s->preempt_count), tern_now_s() - s->t_start);
    const struct srv_backend *be = atomic_load(&s->backend);
    if (be && be->metrics) be->metrics(be->self, b);
}

/* ---- the worker -------------------------------------------------------------------- */

static void *worker_main(void *arg) {
    struct srv_server *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->qmu);
        while (s->q_len == 0 && !atomic_load(&s->stopping)) {
            const struct srv_backend *ib = atomic_load(&s->backend);
            if (s->idle_pending && ib && ib->idle) {
                /* Nothing queued: background work, which yields to the next enqueue
                 * at its next chunk boundary. Never started while a job waits. */
                s->preempt = 0;
                s->idle_running = true;
                pthread_mutex_unlock(&s->qmu);
                bool more = ib->idle(ib->self, &s->preempt);
                pthread_mutex_lock(&s->qmu);
                s->idle_running = false;
                s->idle_pending = more;
                continue;
            }
            pthread_cond_wait(&s->qcv, &s->qmu);
        }
        if (s->q_len == 0) {
            pthread_mutex_unlock(&s->qmu);
            break;
        }
        struct srv_job *j = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->p.n_queue;
        s->q_len--;
        s->running = j;
        s->idle_pending = true;
        if (j->t_preempt_from > 0) j->t_preempt_wait = tern_now_s() - j->t_preempt_from;
        pthread_mutex_unlock(&s->qmu);
        if (j->t_preempt_from > 0) {
            atomic_fetch_add(&s->preempt_us_sum, (uint64_t)(j->t_preempt_wait * 1e6));
            atomic_fetch_add(&s->preempt_count, 1);
        }

        const struct srv_backend *b = atomic_load(&s->backend);
        if (j->cancel || atomic_load(&s->stopping)) {
            snprintf(j->note, sizeof j->note, "cancelled before it started");
            srv_job_finish(j, 499);
        } else {
            b->run(b->self, j);
            pthread_mutex_lock(&j->mu);
            bool done = j->done;
            pthread_mutex_unlock(&j->mu);
            if (!done) srv_job_finish(j, 500); /* a backend bug; never leave a client hanging */
        }
        int status = j->status;
        if (j->cancel) {
            atomic_fetch_add(&s->cancelled, 1);
            if (!j->note[0]) snprintf(j->note, sizeof j->note, "cancelled (client went away)");
        }
        log_job(s, j, j->req.stream && status < 400 ? 200 : status);

        pthread_mutex_lock(&s->qmu);
        s->running = NULL;
        pthread_mutex_unlock(&s->qmu);
        job_unref(s, j);
    }
    return NULL;
}

/* Queues a job (the queue takes a reference). false when the queue is full. */
static bool enqueue(struct srv_server *s, struct srv_job *j) {
    pthread_mutex_lock(&s->qmu);
    if (s->q_len >= s->p.n_queue || atomic_load(&s->stopping)) {
        pthread_mutex_unlock(&s->qmu);
        return false;
    }
    job_ref(j);
    s->queue[(s->q_head + s->q_len) % s->p.n_queue] = j;
    s->q_len++;
    s->preempt = 1;
    if (s->idle_running) j->t_preempt_from = tern_now_s();
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return true;
}

/* ---- connections ------------------------------------------------------------------- */

struct conn {
    enum route route;
    struct tern_buf body;
    bool too_large;
    int fd;
    char tenant[SRV_MAX_KEY_LEN + 8];
};

static bool peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd pfd = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pfd, 1, 0) <= 0) return false;
    if (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (pfd.revents & POLLIN) {
        char c;
        ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false;
}

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

static MHD_Result send_bytes(struct MHD_Connection *c, int status, const char *ctype, const char *data, size_t n,
                             const char *extra_header, const char *extra_value) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (extra_header) MHD_add_response_header(r, extra_header, extra_value);
    MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static MHD_Result send_json(struct srv_server *s, struct MHD_Connection *c, enum route route, int status, json_t *o) {
    char *txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    count_request(s, route, txt ? status : 500);
    if (!txt) return send_bytes(c, 500, "application/json", "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                "\"server_error\",\"param\":null,\"code\":null}}", 84, NULL, NULL);
    MHD_Result r = send_bytes(c, status, "application/json", txt, strlen(txt), NULL, NULL);
    free(txt);
    return r;
}

static MHD_Result send_error(struct srv_server *s, struct MHD_Connection *c, enum route route,
                             const struct srv_error *e, const char *hdr, const char *val) {
    char *txt = srv_error_json(e);
    count_request(s, route, e->status);
    if (route >= R_CHAT && route <= R_DETOKENIZE)
        TERN_LOG_INFO("request - %s %d : %s", route_names[route], e->status, e->message);
    if (!txt) return MHD_NO;
    MHD_Result r = send_bytes(c, e->status, "application/json", txt, strlen(txt), hdr, val);
    free(txt);
    return r;
}

static enum route find_route(const char *url) {
    static const struct {
        const char *path;
        enum route r;
    } table[] = {
        {"/health", R_HEALTH},           {"/metrics", R_METRICS},       {"/v1/models", R_MODELS},
        {"/models", R_MODELS},           {"/v1/chat/completions", R_CHAT}, {"/chat/completions", R_CHAT},
        {"/v1/completions", R_COMPLETIONS}, {"/completions", R_COMPLETIONS}, {"/tokenize", R_TOKENIZE},
        {"/detokenize", R_DETOKENIZE},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(table); i++)
        if (!strcmp(url, table[i].path)) return table[i].r;
    return R_NONE;
}

static bool route_is_post(enum route r) { return r >= R_CHAT; }

/* Checks "Authorization: Bearer KEY" against --api-key; fills the tenant. */
static bool authorised(struct srv_server *s, struct MHD_Connection *c, struct conn *cn) {
    if (s->p.n_api_keys == 0) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h) return false;
    while (*h == ' ') h++;
    if (strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    for (size_t i = 0; i < s->p.n_api_keys; i++) {
        if (!strcmp(h, s->api_keys[i])) {
            /* the tenant is which key, not the key itself (it ends up in logs) */
            snprintf(cn->tenant, sizeof cn->tenant, "key%zu", i);
            return true;
        }
    }
    return false;
}

/* Streaming: hands the job's bytes to MHD as they come. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    struct srv_job *j = cls;
    struct srv_server *s = (struct srv_server *)j->priv_server;
    (void)pos;
    pthread_mutex_lock(&j->mu);
    double last = tern_now_s();
    for (;;) {
        size_t avail = j->out.len - j->out_read;
        if (avail > 0) {
            size_t n = avail < max ? avail : max;
            memcpy(buf, j->out.data + j->out_read, n);
            j->out_read += n;
            if (j->out_read == j->out.len) {
                tern_buf_clear(&j->out);
                j->out_read = 0;
            }
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (j->done) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (atomic_load(&s->stopping) || peer_gone(j->fd)) {
            j->cancel = 1;
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (tern_now_s() - last > KEEPALIVE_S) {
            /* waiting in the queue: keep proxies and clients from timing out */
            static const char ka[] = ": waiting\n\n";
            pthread_mutex_unlock(&j->mu);
            memcpy(buf, ka, sizeof ka - 1 < max ? sizeof ka - 1 : max);
            return (ssize_t)(sizeof ka - 1 < max ? sizeof ka - 1 : max);
        }
        timed_wait(&j->cv, &j->mu, WAIT_SLICE_MS);
    }
}

static void stream_free(void *cls) {
    struct srv_job *j = cls;
    struct srv_server *s = (struct srv_server *)j->priv_server;
    pthread_mutex_lock(&j->mu);
    if (!j->done) j->cancel = 1; /* the connection ended before the response did */
    pthread_mutex_unlock(&j->mu);
    job_unref(s, j);
}

static MHD_Result handle_generate(struct srv_server *s, struct MHD_Connection *c, struct conn *cn,
                                  const struct srv_backend *b) {
    struct srv_error err = {0};
    struct srv_job *j = job_new(s);
    if (!j) {
        srv_error_set(&err, 500, "server_error", NULL, NULL, "out of memory");
        return send_error(s, c, cn->route, &err, NULL, NULL);
    }
    j->priv_server = s;
    j->fd = cn->fd;
    j->ep = cn->route == R_CHAT ? SRV_EP_CHAT : SRV_EP_COMPLETION;
    j->path = route_names[cn->route];
    snprintf(j->id, sizeof j->id, "%s-%llu%08x", j->ep == SRV_EP_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)j->seq, (unsigned)(tern_now_ns() & 0xffffffffu));
    struct srv_parse_opts po = {.max_body = s->p.max_body, .allow_forced_output = s->p.allow_forced_output};
    MHD_Result ret;
    if (!srv_request_parse(j->ep, cn->body.data ? cn->body.data : "", cn->body.len, &po, &j->req, &err)) goto reject;

    /* identity: tenant = API key and/or cache_salt; key: body beats the header */
    {
        struct tern_buf t = TERN_BUF_INIT;
        tern_buf_puts(&t, cn->tenant);
        if (j->req.cache_salt) tern_buf_printf(&t, "%ssalt:%s", cn->tenant[0] ? "/" : "", j->req.cache_salt);
        j->tenant = tern_buf_detach(&t, NULL);
        if (!j->tenant) j->tenant = tern_strdup("");
        const char *hk = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-session-id");
        if (j->req.session_key) j->key = tern_strdup(j->req.session_key);
        else if (hk && *hk && strlen(hk) <= SRV_MAX_KEY_LEN) j->key = tern_strdup(hk);
    }
    if (!b->prepare(b->self, j, &err)) goto reject;

    if (!enqueue(s, j)) {
        srv_error_set(&err, 429, "rate_limit_error", "queue_full", NULL,
                      "the server is busy: %u requests are already waiting (--queue %u); retry shortly",
                      s->p.n_queue, s->p.n_queue);
        ret = send_error(s, c, cn->route, &err, "Retry-After", "1");
        job_unref(s, j);
        return ret;
    }

    if (j->req.stream) {
        /* The response reference is released by stream_free. */
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, j,
                                                                   stream_free);
        if (!r) {
            j->cancel = 1;
            job_unref(s, j);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        count_request(s, cn->route, 200);
        ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ret;
    }

    /* Not streamed: wait for the whole answer, watching the socket meanwhile. */
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        if (atomic_load(&s->stopping) || peer_gone(cn->fd)) {
            j->cancel = 1;
            pthread_mutex_unlock(&j->mu);
            count_request(s, cn->route, 499);
            job_unref(s, j);
            return MHD_NO; /* close the connection */
        }
        timed_wait(&j->cv, &j->mu, WAIT_SLICE_MS);
    }
    pthread_mutex_unlock(&j->mu);
    count_request(s, cn->route, j->status);
    ret = send_bytes(c, j->status, "application/json", j->out.data ? j->out.data : "", j->out.len, NULL, NULL);
    job_unref(s, j);
    return ret;

reject:
    ret = send_error(s, c, cn->route, &err, NULL, NULL);
    job_unref(s, j);
    return ret;
}

static MHD_Result handle_simple_post(struct srv_server *s, struct MHD_Connection *c, struct conn *cn,
                                     const struct srv_backend *b) {
    struct srv_error err = {0};
    if (cn->body.len == 0) {
        srv_error_bad(&err, NULL, "the request body is empty; expected a JSON object");
        return send_error(s, c, cn->route, &err, NULL, NULL);
    }
    json_error_t jerr;
    json_t *body = json_loadb(cn->body.data, cn->body.len, 0, &jerr);
    if (!json_is_object(body)) {
        if (body) srv_error_bad(&err, NULL, "the request body must be a JSON object");
        else srv_error_bad(&err, NULL, "malformed JSON at line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
        json_decref(body);
        return send_error(s, c, cn->route, &err, NULL, NULL);
    }
    json_t *res = cn->route == R_TOKENIZE ? b->tokenize(b->self, body, &err) : b->detokenize(b->self, body, &err);
    json_decref(body);
    if (!res) return send_error(s, c, cn->route, &err, NULL, NULL);
    return send_json(s, c, cn->route, 200, res);
}

static MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                          const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    struct srv_server *s = cls;
    struct conn *cn = *con_cls;
    struct srv_error err = {0};
    (void)version;
    if (!cn) {
        cn = tern_calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        *con_cls = cn;
        cn->route = find_route(url);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        cn->fd = ci ? ci->connect_fd : -1;
        bool is_post = !strcmp(method, "POST"), is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        /* Decide everything that does not need the body before reading it. */
        if (cn->route == R_NONE) {
            srv_error_set(&err, 404, "not_found_error", "not_found", NULL, "no route for %.10s %.200s", method, url);
            return send_error(s, c, R_NONE, &err, NULL, NULL);
        }
        if (route_is_post(cn->route) ? !is_post : !is_get) {
            srv_error_set(&err, 405, "invalid_request_error", "method_not_allowed", NULL,
                          "%s does not accept %.10s (use %s)", route_names[cn->route], method,
                          route_is_post(cn->route) ? "POST" : "GET");
            return send_error(s, c, cn->route, &err, "Allow", route_is_post(cn->route) ? "POST" : "GET");
        }
        if (cn->route != R_HEALTH && !authorised(s, c, cn)) {
            srv_error_set(&err, 401, "authentication_error", "invalid_api_key", NULL,
                          "a valid API key is required: send 'Authorization: Bearer <key>' (--api-key)");
            return send_error(s, c, cn->route, &err, "WWW-Authenticate", "Bearer");
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            unsigned long long v = strtoull(cl, &end, 10);
            if (v > s->p.max_body) {
                srv_error_set(&err, 413, "invalid_request_error", "request_too_large", NULL,
                              "request body is %llu bytes; the limit is %zu (--max-body)", v, s->p.max_body);
                return send_error(s, c, cn->route, &err, NULL, NULL);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cn->too_large) {
            if (cn->body.len + *upload_size > s->p.max_body) {
                cn->too_large = true;
                tern_buf_free(&cn->body);
            } else if (tern_buf_append(&cn->body, upload_data, *upload_size) != TERN_OK) {
                cn->too_large = true;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cn->too_large) {
        srv_error_set(&err, 413, "invalid_request_error", "request_too_large", NULL,
                      "request body exceeds the limit of %zu bytes (--max-body)", s->p.max_body);
        return send_error(s, c, cn->route, &err, NULL, NULL);
    }

    const struct srv_backend *b = atomic_load(&s->backend);
    if (cn->route == R_HEALTH) {
        int st = b ? 200 : 503;
        return send_json(s, c, cn->route, st, json_pack("{s:s}", "status", b ? "ok" : "loading model"));
    }
    if (cn->route == R_METRICS) {
        struct tern_buf m = TERN_BUF_INIT;
        render_metrics(s, &m);
        count_request(s, cn->route, 200);
        MHD_Result r = send_bytes(c, 200, "text/plain; version=0.0.4", m.data ? m.data : "", m.len, NULL, NULL);
        tern_buf_free(&m);
        return r;
    }
    if (!b) {
        srv_error_set(&err, 503, "unavailable_error", "loading", NULL, "the model is still loading; retry shortly");
        return send_error(s, c, cn->route, &err, "Retry-After", "2");
    }
    switch (cn->route) {
    case R_MODELS: {
        json_t *data = json_array();
        json_t *e = b->model_entry ? b->model_entry(b->self) : NULL;
        if (e) json_array_append_new(data, e);
        return send_json(s, c, cn->route, 200, json_pack("{s:s,s:o}", "object", "list", "data", data));
    }
    case R_CHAT:
    case R_COMPLETIONS:
        return handle_generate(s, c, cn, b);
    case R_TOKENIZE:
    case R_DETOKENIZE:
        return handle_simple_post(s, c, cn, b);
    default:
        break;
    }
    srv_error_set(&err, 404, "not_found_error", "not_found", NULL, "no route for %.200s", url);
    return send_error(s, c, cn->route, &err, NULL, NULL);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    struct conn *cn = *con_cls;
    if (!cn) return;
    tern_buf_free(&cn->body);
    free(cn);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    TERN_LOG_DEBUG("http: %s", msg);
}

/* ---- lifecycle --------------------------------------------------------------------- */

void srv_params_default(struct srv_params *p) {
    memset(p, 0, sizeof *p);
    p->host = "127.0.0.1";
    p->port = 8080;
    p->n_queue = 16;
    p->max_body = (size_t)16 << 20;
    p->max_connections = 256;
}

enum tern_status srv_start(const struct srv_params *params, struct srv_server **out) {
    *out = NULL;
    struct srv_server *s = tern_calloc(1, sizeof *s);
    if (!s) return tern_errorf(TERN_ERR_NOMEM, "out of memory");
    s->p = *params;
    if (s->p.n_queue == 0) s->p.n_queue = 1;
    if (s->p.max_connections == 0) s->p.max_connections = 256;
    if (s->p.max_body == 0) s->p.max_body = (size_t)16 << 20;
    s->t_start = tern_now_s();
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    pthread_mutex_init(&s->jmu, NULL);
    s->queue = tern_calloc(s->p.n_queue, sizeof *s->queue);
    s->api_keys = s->p.n_api_keys ? tern_calloc(s->p.n_api_keys, sizeof *s->api_keys) : NULL;
    if (!s->queue || (s->p.n_api_keys && !s->api_keys)) {
        srv_stop(s);
        return tern_errorf(TERN_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < s->p.n_api_keys; i++) s->api_keys[i] = tern_strdup(params->api_keys[i]);
    s->p.api_keys = NULL;

    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    const char *host = s->p.host ? s->p.host : "127.0.0.1";
    if (s->p.port < 0 || s->p.port > 65535) {
        srv_stop(s);
        return tern_errorf(TERN_ERR_INVALID, "port %d is out of range (0-65535)", params->port);
    }
    if (strchr(host, ':')) {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)s->p.port);
        if (inet_pton(AF_INET6, host, &a6->sin6_addr) != 1) {
            srv_stop(s);
            return tern_errorf(TERN_ERR_INVALID, "host '%s' is not an IPv6 address", host);
        }
        flags |= MHD_USE_IPv6;
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)s->p.port);
        if (!strcmp(host, "localhost")) host = "127.0.0.1";
        if (inet_pton(AF_INET, host, &a4->sin_addr) != 1) {
            srv_stop(s);
            return tern_errorf(TERN_ERR_INVALID, "host '%s' is not an IPv4 address (use e.g. 127.0.0.1 or 0.0.0.0)",
                               host);
        }
    }
    if (pthread_create(&s->worker, NULL, worker_main, s) != 0) {
        srv_stop(s);
        return tern_errorf(TERN_ERR_NOMEM, "cannot start the engine worker thread");
    }
    s->worker_started = true;
    s->mhd = MHD_start_daemon(flags, (uint16_t)s->p.port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR,
                              (struct sockaddr *)&ss, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->p.max_connections,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                              MHD_OPTION_END);
    if (!s->mhd) {
        int port = s->p.port;
        srv_stop(s);
        return tern_errorf(TERN_ERR_IO, "cannot listen on %s:%d (in use, or not an address of this machine?)", host,
                           port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->p.port;
    *out = s;
    return TERN_OK;
}

void srv_set_backend(struct srv_server *s, const struct srv_backend *b) { atomic_store(&s->backend, b); }

int srv_port(const struct srv_server *s) { return s->port; }

void srv_stop(struct srv_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, true);
    /* cancel everything in flight so that the worker and the connections finish */
    pthread_mutex_lock(&s->jmu);
    for (size_t i = 0; i < s->n_live; i++) s->live[i]->cancel = 1;
    pthread_mutex_unlock(&s->jmu);
    pthread_mutex_lock(&s->qmu);
    s->preempt = 1;
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    if (s->worker_started) pthread_join(s->worker, NULL);
    /* the worker drained the queue (finishing each job as cancelled) */
    if (s->mhd) MHD_stop_daemon(s->mhd);
    for (size_t i = 0; i < s->p.n_api_keys && s->api_keys; i++) free(s->api_keys[i]);
    free(s->api_keys);
    free(s->queue);
    free(s->live);
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
    pthread_mutex_destroy(&s->jmu);
    free(s);
}
