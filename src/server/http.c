/* The HTTP server: routing, auth, limits, queue, worker, streaming (see server.h).
 *
 * No thread belongs to a connection, so that idle or slow clients cost a socket and a
 * few KiB, never a thread: libmicrohttpd polls every connection from a small pool of
 * threads (epoll), and nothing that can take long runs on them.
 *
 * - A request's header and body are read by the polling threads; GET routes are
 *   answered there (cheap). A POST body goes to the prepare threads (parse, render,
 *   tokenize: all 4xx are decided there) while its connection is suspended.
 * - A queued job's connection stays suspended (parked) until the job writes output or
 *   ends; srv_job_write / srv_job_finish resume it. A streamed response's content
 *   reader parks the connection again when it has nothing to send.
 * - MHD does not watch suspended connections, so the watcher thread polls the sockets
 *   of parked jobs every ~100 ms: a client that hangs up cancels its request even while
 *   the engine is still priming and nothing is being written. It also resumes a parked
 *   stream every 10 s for a keep-alive comment, and closes connections that have not
 *   sent a complete request header in time (408: slowloris, idle sockets), or a whole
 *   body (--body-timeout, then SRV_MIN_BODY_RATE: a body trickled a byte every few
 *   seconds never trips MHD's inactivity timeout).
 * - The connection table keeps room for new clients: near max_connections each new
 *   connection sheds the one that has waited longest for its header or body (or idled
 *   in keep-alive), so thousands of slow sockets cannot lock out /health and chat.
 *
 * Lock order: jmu -> job mu -> MHD's internal mutex (resume/suspend are called with the
 * job's mu held, which is what makes "park, then resume" free of lost wake-ups). */
#include "server/http-impl.h"

/* The body sent when even an error message cannot be allocated. */
static const char oom_json[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                               "\"code\":null}}";

const char *const http_route_names[R_COUNT] = {
    "other", "/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions", "/tokenize",
    "/detokenize", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"};


/* ---- connections ------------------------------------------------------------------- */

/* Called with j->mu held: a parked connection goes back to MHD's polling. */
void http_job_wake(struct srv_job *j) {
    if (!j->parked) return;
    j->parked = false;
    MHD_resume_connection((struct MHD_Connection *)j->conn);
}

bool http_peer_gone_revents(int fd, short revents) {
    if (revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (revents & POLLIN) {
        char c;
        ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false;
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

/* The answer of a request decided on a prepare thread, sent when its connection
 * resumes. Takes ownership of txt (NULL: out of memory). */
static void conn_reply(struct conn *cn, int status, char *txt, const char *ctype, const char *hdr, const char *val) {
    free(cn->reply);
    cn->status = txt ? status : 500;
    cn->reply = txt ? txt : tern_strdup(oom_json);
    cn->reply_len = cn->reply ? strlen(cn->reply) : 0;
    cn->ctype = ctype;
    cn->hdr = txt ? hdr : NULL;
    cn->val = val;
    cn->state = C_REPLY;
}

static void conn_reply_error(struct srv_server *s, struct conn *cn, const struct srv_error *e, const char *hdr,
                             const char *val) {
    http_count_request(s, cn->route, e->status);
    if (route_is_post(cn->route))
        TERN_LOG_INFO("request - %s %d : %s", http_route_names[cn->route], e->status, e->message);
    conn_reply(cn, e->status, api_error_json(route_proto(cn->route), e), "application/json", hdr, val);
}

static void conn_reply_json(struct srv_server *s, struct conn *cn, int status, json_t *o) {
    char *txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    http_count_request(s, cn->route, txt ? status : 500);
    conn_reply(cn, status, txt, "application/json", NULL, NULL);
}

static MHD_Result send_json(struct srv_server *s, struct MHD_Connection *c, enum route route, int status, json_t *o) {
    char *txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    http_count_request(s, route, txt ? status : 500);
    if (!txt) return send_bytes(c, 500, "application/json", oom_json, sizeof oom_json - 1, NULL, NULL);
    MHD_Result r = send_bytes(c, status, "application/json", txt, strlen(txt), NULL, NULL);
    free(txt);
    return r;
}

static MHD_Result send_error(struct srv_server *s, struct MHD_Connection *c, enum route route,
                             const struct srv_error *e, const char *hdr, const char *val) {
    char *txt = api_error_json(route_proto(route), e);
    http_count_request(s, route, e->status);
    if (route_is_post(route))
        TERN_LOG_INFO("request - %s %d : %s", http_route_names[route], e->status, e->message);
    if (!txt) return MHD_NO;
    MHD_Result r = send_bytes(c, e->status, "application/json", txt, strlen(txt), hdr, val);
    free(txt);
    return r;
}

/* The route of a request target; a query string is no part of it (Claude Code sends
 * /v1/messages?beta=true). */
enum route http_find_route(const char *url) {
    static const struct {
        const char *path;
        enum route r;
    } table[] = {
        {"/health", R_HEALTH},           {"/metrics", R_METRICS},       {"/v1/models", R_MODELS},
        {"/models", R_MODELS},           {"/v1/chat/completions", R_CHAT}, {"/chat/completions", R_CHAT},
        {"/v1/completions", R_COMPLETIONS}, {"/completions", R_COMPLETIONS}, {"/tokenize", R_TOKENIZE},
        {"/detokenize", R_DETOKENIZE},   {"/v1/messages", R_MESSAGES},  {"/messages", R_MESSAGES},
        {"/v1/messages/count_tokens", R_COUNT_TOKENS}, {"/messages/count_tokens", R_COUNT_TOKENS},
        {"/v1/responses", R_RESPONSES},  {"/responses", R_RESPONSES},
    };
    size_t n = strcspn(url, "?");
    for (size_t i = 0; i < TERN_ARRAY_LEN(table); i++)
        if (strlen(table[i].path) == n && !strncmp(url, table[i].path, n)) return table[i].r;
    return R_NONE;
}

/* The tenant of an API key: a hash of the key, so that a tenant stays the same when the
 * --api-key list is reordered or grows, and the key itself never reaches a log line,
 * /metrics or a file of the disk tier. 128 bits: two keys never share a namespace by
 * accident. Not a secret-keyed hash: the tenant must be the same in every replica that
 * shares a --cache-dir; a key weak enough to be guessed from its hash is weak anyway. */
void srv_tenant_of_key(const char *key, char *out, size_t size) {
    /* a seed of its own, so that the name is no other hash of the same bytes */
    const uint64_t tenant_seed = 0x74656e616e743a31ull; /* "tenant:1" */
    XXH128_hash_t hv = XXH3_128bits_withSeed(key, strlen(key), tenant_seed);
    snprintf(out, size, "key-%016llx%016llx", (unsigned long long)hv.high64, (unsigned long long)hv.low64);
}

/* Equal strings, in a time that depends on the lengths only (not on where they differ). */
static bool ct_equal(const char *a, size_t na, const char *b, size_t nb) {
    unsigned diff = na != nb;
    for (size_t i = 0; i < nb; i++) diff |= (unsigned char)(i < na ? a[i] : 0) ^ (unsigned char)b[i];
    return diff == 0;
}

/* Checks "Authorization: Bearer KEY" against --api-key; fills the tenant. Every key is
 * compared, in constant time, so that timing tells nothing about a key's bytes. */
static bool authorised(struct srv_server *s, struct MHD_Connection *c, struct conn *cn) {
    if (s->p.n_api_keys == 0) return true;
    /* "Authorization: Bearer KEY" (OpenAI's clients, Claude Code's ANTHROPIC_AUTH_TOKEN) or
     * "x-api-key: KEY" (Anthropic's clients, Claude Code's ANTHROPIC_API_KEY) */
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (h) {
        while (*h == ' ') h++;
        if (strncasecmp(h, "Bearer ", 7) != 0) return false;
        h += 7;
    } else if (!(h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"))) {
        return false;
    }
    while (*h == ' ') h++;
    size_t nh = strlen(h);
    size_t found = SIZE_MAX;
    for (size_t i = 0; i < s->p.n_api_keys; i++)
        if (ct_equal(h, nh, s->api_keys[i], strlen(s->api_keys[i])) && found == SIZE_MAX) found = i;
    if (found == SIZE_MAX) return false;
    srv_tenant_of_key(s->api_keys[found], cn->tenant, sizeof cn->tenant);
    return true;
}

/* Streaming: hands the job's bytes to MHD as they come; parks the connection when
 * there is nothing to send (the job's next write, its end, the watcher resume it). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    struct srv_job *j = cls;
    struct srv_server *s = (struct srv_server *)j->priv_server;
    (void)pos;
    pthread_mutex_lock(&j->mu);
    size_t avail = j->out.len - j->out_read;
    if (avail > 0) {
        size_t n = avail < max ? avail : max;
        memcpy(buf, j->out.data + j->out_read, n);
        j->out_read += n;
        if (j->out_read == j->out.len) {
            tern_buf_clear(&j->out);
            j->out_read = 0;
        }
        j->t_out = tern_now_s();
        pthread_mutex_unlock(&j->mu);
        return (ssize_t)n;
    }
    if (j->done) {
        pthread_mutex_unlock(&j->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (atomic_load(&s->stopping) || atomic_load(&j->cancel)) {
        atomic_store(&j->cancel, 1);
        pthread_mutex_unlock(&j->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    double now = tern_now_s();
    if (now - j->t_out >= KEEPALIVE_S) {
        /* waiting in the queue: keep proxies and clients from timing out */
        static const char ka[] = ": waiting\n\n";
        j->t_out = now;
        pthread_mutex_unlock(&j->mu);
        size_t n = sizeof ka - 1 < max ? sizeof ka - 1 : max;
        memcpy(buf, ka, n);
        return (ssize_t)n;
    }
    j->parked = true;
    MHD_suspend_connection((struct MHD_Connection *)j->conn);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

static void stream_free(void *cls) {
    struct srv_job *j = cls;
    struct srv_server *s = (struct srv_server *)j->priv_server;
    pthread_mutex_lock(&j->mu);
    if (!j->done) atomic_store(&j->cancel, 1); /* the connection ended before the response did */
    j->parked = false;
    pthread_mutex_unlock(&j->mu);
    http_job_unref(s, j);
}

/* The answer to a request that found no place: 429 (the queue is full), or 503 when the
 * server is stopping. */
static void reply_not_admitted(struct srv_server *s, struct conn *cn) {
    struct srv_error err = {0};
    if (atomic_load(&s->stopping)) {
        srv_error_set(&err, 503, "unavailable_error", "shutting_down", NULL, "the server is shutting down");
        conn_reply_error(s, cn, &err, NULL, NULL);
    } else {
        srv_error_set(&err, 429, "rate_limit_error", "queue_full", NULL,
                      "the server is busy: %u requests are already waiting (--queue %u); retry shortly",
                      s->p.n_queue, s->p.n_queue);
        conn_reply_error(s, cn, &err, "Retry-After", "1");
    }
}

/* /tokenize and /detokenize run on a prepare thread, not the worker (they need no model
 * state), but under the same admission as generation: each takes a place of the queue
 * while it runs, so that the queue's bound (--queue) bounds all admitted work, and a
 * full server answers them 429 as it answers a chat. */
static bool admit_simple(struct srv_server *s) {
    pthread_mutex_lock(&s->qmu);
    bool ok = s->q_len + s->n_simple < s->p.n_queue && !atomic_load(&s->stopping);
    if (ok) s->n_simple++;
    pthread_mutex_unlock(&s->qmu);
    return ok;
}

static void release_simple(struct srv_server *s) {
    pthread_mutex_lock(&s->qmu);
    s->n_simple--;
    pthread_mutex_unlock(&s->qmu);
}

static char *key_in_lane(const char *key, const char *lane) {
    size_t n = strlen(key) + strlen(lane) + 2;
    char *s = tern_malloc(n);
    if (s) snprintf(s, n, "%s#%s", key, lane);
    return s;
}

/* A prepare thread: parse, validate, prepare, queue. Leaves cn in C_REPLY, C_STREAM
 * or C_WAIT; returns false when the connection must stay suspended (C_WAIT: the job
 * resumes it). */
static bool prep_generate(struct srv_server *s, struct conn *cn, const struct srv_backend *b) {
    struct srv_error err = {0};
    struct srv_job *j = http_job_new(s);
    if (!j) {
        srv_error_set(&err, 500, "server_error", NULL, NULL, "out of memory");
        conn_reply_error(s, cn, &err, NULL, NULL);
        return true;
    }
    j->priv_server = s;
    j->fd = cn->fd;
    j->conn = cn->c;
    j->big_body = cn->body.len >= BIG_BODY || srv_json_value_bound(cn->body.data, cn->body.len) >= BIG_VALUES;
    j->ep = cn->route == R_COMPLETIONS ? SRV_EP_COMPLETION : SRV_EP_CHAT;
    j->route = cn->route;
    j->path = http_route_names[cn->route];
    const enum srv_proto proto = route_proto(cn->route);
    static const char *const id_prefix[] = {[SRV_PROTO_CHAT] = "chatcmpl-", [SRV_PROTO_MESSAGES] = "msg_",
                                            [SRV_PROTO_RESPONSES] = "resp_"};
    snprintf(j->id, sizeof j->id, "%s%llu%08x", j->ep == SRV_EP_CHAT ? id_prefix[proto] : "cmpl-",
             (unsigned long long)j->seq, (unsigned)(tern_now_ns() & 0xffffffffu));
    struct srv_parse_opts po = {.max_body = s->p.max_body, .allow_forced_output = s->p.allow_forced_output,
                                .forced_reply = s->p.forced_reply};
    const char *body = cn->body.data ? cn->body.data : "";
    bool parsed = proto == SRV_PROTO_CHAT
                      ? srv_request_parse(j->ep, body, cn->body.len, &po, &j->req, &err)
                      : srv_request_parse_proto(proto, cn->route == R_COUNT_TOKENS, body, cn->body.len, &po, &j->req,
                                                &err);
    if (!parsed) goto reject;
    tern_buf_free(&cn->body); /* parsed: the bytes are not needed any more */

    /* identity: tenant = API key and/or cache_salt; key: body beats the header */
    {
        struct tern_buf t = TERN_BUF_INIT;
        tern_buf_puts(&t, cn->tenant);
        if (j->req.cache_salt) tern_buf_printf(&t, "%ssalt:%s", cn->tenant[0] ? "/" : "", j->req.cache_salt);
        j->tenant = tern_buf_detach(&t, NULL);
        if (!j->tenant) j->tenant = tern_strdup("");
        const char *hk = cn->session_hdr;
        /* a client's session header names an agent session, and the adapter's lane
         * the conversation inside it (api.h) */
        if (j->req.session_key) j->key = tern_strdup(j->req.session_key);
        else if (hk && *hk && strlen(hk) <= SRV_MAX_KEY_LEN && j->req.lane[0]) j->key = key_in_lane(hk, j->req.lane);
        else if (hk && *hk && strlen(hk) <= SRV_MAX_KEY_LEN) j->key = tern_strdup(hk);
        if (!j->tenant || ((j->req.session_key || (hk && *hk && strlen(hk) <= SRV_MAX_KEY_LEN)) && !j->key)) {
            srv_error_set(&err, 500, "server_error", NULL, NULL, "out of memory");
            goto reject;
        }
    }
    if (!b->prepare(b->self, j, &err)) goto reject;
    if (j->req.count_only) {
        /* /v1/messages/count_tokens: rendered and tokenized as /v1/messages would be, never run */
        conn_reply_json(s, cn, 200, json_pack("{s:I}", "input_tokens", (json_int_t)j->n_prompt));
        http_job_unref(s, j);
        return true;
    }

    j->t_out = tern_now_s();
    if (!http_enqueue(s, j)) {
        reply_not_admitted(s, cn);
        http_job_unref(s, j);
        return true;
    }
    cn->job = j;
    if (j->req.stream) {
        cn->state = C_STREAM;
        return true;
    }
    cn->state = C_WAIT;
    pthread_mutex_lock(&j->mu);
    bool done = j->done;
    if (!done) j->parked = true; /* srv_job_finish (or the watcher) resumes it */
    pthread_mutex_unlock(&j->mu);
    return done;

reject:
    conn_reply_error(s, cn, &err, NULL, NULL);
    http_job_unref(s, j);
    return true;
}

static void run_simple(struct srv_server *s, struct conn *cn, const struct srv_backend *b) {
    struct srv_error err = {0};
    if (cn->body.len == 0) {
        srv_error_bad(&err, NULL, "the request body is empty; expected a JSON object");
        conn_reply_error(s, cn, &err, NULL, NULL);
        return;
    }
    size_t n_values = srv_json_value_bound(cn->body.data, cn->body.len);
    if (n_values > SRV_MAX_JSON_VALUES) {
        tern_buf_free(&cn->body);
        srv_error_set(&err, 413, "invalid_request_error", "request_too_large", NULL,
                      "the request body holds about %zu JSON values; the limit is %u", n_values, SRV_MAX_JSON_VALUES);
        conn_reply_error(s, cn, &err, NULL, NULL);
        return;
    }
    json_error_t jerr;
    json_t *body = json_loadb(cn->body.data, cn->body.len, JSON_REJECT_DUPLICATES, &jerr);
    tern_buf_free(&cn->body);
    if (!json_is_object(body)) {
        if (body) srv_error_bad(&err, NULL, "the request body must be a JSON object");
        else srv_error_bad(&err, NULL, "malformed JSON at line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
        json_decref(body);
        conn_reply_error(s, cn, &err, NULL, NULL);
        return;
    }
    json_t *res = cn->route == R_TOKENIZE ? b->tokenize(b->self, body, &err) : b->detokenize(b->self, body, &err);
    json_decref(body);
    if (!res) conn_reply_error(s, cn, &err, NULL, NULL);
    else conn_reply_json(s, cn, 200, res);
}

static void prep_simple(struct srv_server *s, struct conn *cn, const struct srv_backend *b) {
    if (!admit_simple(s)) {
        tern_buf_free(&cn->body);
        reply_not_admitted(s, cn);
        return;
    }
    run_simple(s, cn, b);
    release_simple(s);
}

static void *prep_main(void *arg) {
    struct srv_server *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->pmu);
        while (!s->prep_head && !s->prep_stopping) pthread_cond_wait(&s->pcv, &s->pmu);
        struct conn *cn = s->prep_head;
        if (!cn) {
            pthread_mutex_unlock(&s->pmu);
            break;
        }
        cn->body_len = cn->body.len;
        s->prep_head = cn->next_prep;
        if (!s->prep_head) s->prep_tail = NULL;
        cn->next_prep = NULL;
        pthread_mutex_unlock(&s->pmu);

        const struct srv_backend *b = atomic_load(&s->backend);
        bool resume = true;
        /* a large body of a route without a job left its parse's memory in the
         * allocator's arenas: give it back (a job does so when it is freed). Decided
         * now: once the connection is parked or resumed, cn may be gone. */
        bool big = cn->body_len >= BIG_BODY && !route_generates(cn->route);
        if (atomic_load(&s->stopping)) {
            struct srv_error err = {0};
            srv_error_set(&err, 503, "unavailable_error", "shutting_down", NULL, "the server is shutting down");
            conn_reply_error(s, cn, &err, NULL, NULL);
        } else if (route_generates(cn->route)) {
            resume = prep_generate(s, cn, b);
        } else {
            prep_simple(s, cn, b);
        }
        if (resume) MHD_resume_connection(cn->c);
        if (big) malloc_trim(0);
    }
    return NULL;
}

/* Hands a suspended connection to the prepare threads; false once they are stopping. */
static bool prep_submit(struct srv_server *s, struct conn *cn) {
    pthread_mutex_lock(&s->pmu);
    if (s->prep_stopping) {
        pthread_mutex_unlock(&s->pmu);
        return false;
    }
    if (s->prep_tail) s->prep_tail->next_prep = cn;
    else s->prep_head = cn;
    s->prep_tail = cn;
    pthread_cond_signal(&s->pcv);
    pthread_mutex_unlock(&s->pmu);
    return true;
}

static struct sock *conn_sock(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void sock_set_deadline_for(struct srv_server *s, struct MHD_Connection *c, double deadline,
                                  enum sock_wait wait) {
    struct sock *sk = conn_sock(c);
    if (!sk) return;
    pthread_mutex_lock(&s->smu);
    sk->deadline = deadline;
    sk->wait = wait;
    pthread_mutex_unlock(&s->smu);
}

static void sock_set_deadline(struct srv_server *s, struct MHD_Connection *c, double deadline) {
    sock_set_deadline_for(s, c, deadline, W_HEADER);
}

/* A body is due body_timeout_s after its header, plus a second per SRV_MIN_BODY_RATE
 * bytes received: a client that keeps up the rate is never cut off, one that trickles
 * (a byte every few seconds never trips MHD's inactivity timeout) is, after the grace.
 * Called as each piece arrives; the watcher enforces it. */
static void body_deadline_update(struct srv_server *s, struct conn *cn) {
    double d = cn->t_start + (double)s->p.body_timeout_s + (double)cn->n_received / SRV_MIN_BODY_RATE;
    sock_set_deadline_for(s, cn->c, d, W_BODY);
}

/* The answer after a suspended connection resumed. */
static MHD_Result conn_resumed(struct srv_server *s, struct MHD_Connection *c, struct conn *cn) {
    MHD_Result ret = MHD_YES;
    struct srv_job *j = cn->job;
    switch (cn->state) {
    case C_REPLY:
        ret = send_bytes(c, cn->status, cn->ctype, cn->reply ? cn->reply : "", cn->reply_len, cn->hdr, cn->val);
        free(cn->reply);
        cn->reply = NULL;
        cn->state = C_SENT;
        return ret;
    case C_STREAM: {
        /* The response takes cn's reference (released by stream_free). */
        cn->job = NULL;
        cn->state = C_SENT;
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_reader, j,
                                                                   stream_free);
        if (!r) {
            atomic_store(&j->cancel, 1);
            http_job_unref(s, j);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    case C_WAIT: {
        pthread_mutex_lock(&j->mu);
        bool done = j->done;
        j->parked = false;
        pthread_mutex_unlock(&j->mu);
        cn->job = NULL;
        cn->state = C_SENT;
        if (!done) {
            /* the client went away (the watcher saw it) or the server stops */
            atomic_store(&j->cancel, 1);
            http_job_unref(s, j);
            return MHD_NO; /* close the connection */
        }
        ret = send_bytes(c, j->status, "application/json", j->out.data ? j->out.data : "", j->out.len, NULL, NULL);
        http_job_unref(s, j);
        return ret;
    }
    default:
        return MHD_YES;
    }
}

/* Message framing headers, counted before the body is read: behind a proxy, a request
 * whose length two parties can read differently smuggles a second request. */
struct framing {
    int n_cl, n_te;
    bool cl_bad, te_bad;
};

static MHD_Result scan_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    struct framing *f = cls;
    (void)kind;
    if (!key) return MHD_YES;
    if (!strcasecmp(key, "Content-Length")) {
        f->n_cl++;
        if (!value || !*value || strspn(value, "0123456789") != strlen(value)) f->cl_bad = true;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->n_te++;
        if (!value || strcasecmp(value, "chunked")) f->te_bad = true;
    }
    return MHD_YES;
}

/* 400 + close for ambiguous framing; MHD_NO when MHD has already answered. */
static bool framing_refused(struct srv_server *s, struct MHD_Connection *c, enum route route, MHD_Result *ret) {
    struct framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, scan_framing, &f);
    const char *why = NULL;
    if (f.cl_bad) {
        /* libmicrohttpd has queued its own 400 for this one: close after it, so that
         * no second status line follows */
        http_count_request(s, route, 400);
        *ret = MHD_NO;
        return true;
    }
    if (f.n_cl > 1) why = "more than one Content-Length header";
    else if (f.n_cl && f.n_te) why = "both Content-Length and Transfer-Encoding";
    else if (f.n_te > 1 || f.te_bad) why = "a Transfer-Encoding other than one 'chunked'";
    if (!why) return false;
    struct srv_error err = {0};
    srv_error_bad(&err, NULL, "the request has %s; its length is ambiguous, so it is refused", why);
    *ret = send_error(s, c, route, &err, "Connection", "close");
    return true;
}

/* An HTTP/1.1 request must name its Host (RFC 9112 3.2): 400 + close without one
 * (libmicrohttpd accepted it). */
static bool host_missing(struct srv_server *s, struct MHD_Connection *c, const char *version, enum route route,
                         MHD_Result *ret) {
    if (!version || strcmp(version, MHD_HTTP_VERSION_1_1)) return false;
    if (MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST)) return false;
    struct srv_error err = {0};
    srv_error_bad(&err, NULL, "an HTTP/1.1 request must have a Host header");
    *ret = send_error(s, c, route, &err, "Connection", "close");
    return true;
}

/* Refuses a request before its body is read. A client waiting for "100 Continue" is
 * answered at once (it sends nothing more); one that sends its body anyway would see a
 * reset if the connection closed with the body unread, so the body is read and
 * discarded first (bounded: DRAIN_MAX_BYTES, DRAIN_MAX_S). */
static MHD_Result refuse_before_body(struct srv_server *s, struct MHD_Connection *c, struct conn *cn,
                                     const struct srv_error *e, const char *hdr, const char *val) {
    const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Expect");
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding");
    unsigned long long n = cl ? strtoull(cl, NULL, 10) : 0;
    bool has_body = n > 0 || te;
    if (!has_body || (expect && !strcasecmp(expect, "100-continue")) || n > DRAIN_MAX_BYTES)
        return send_error(s, c, cn->route, e, hdr, val);
    cn->drain = true;
    cn->derr = *e;
    cn->dhdr = hdr;
    cn->dval = val;
    return MHD_YES;
}

static MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                          const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    struct srv_server *s = cls;
    struct conn *cn = *con_cls;
    struct srv_error err = {0};
    if (!cn) {
        cn = tern_calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        *con_cls = cn;
        cn->c = c;
        cn->t_start = tern_now_s();
        body_deadline_update(s, cn); /* the header is complete; the body is due next */
        cn->route = http_find_route(url);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        cn->fd = ci ? ci->connect_fd : -1;
        bool is_post = !strcmp(method, "POST"), is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        /* Decide everything that does not need the body before reading it. */
        MHD_Result fr;
        if (framing_refused(s, c, cn->route, &fr)) return fr;
        if (host_missing(s, c, version, cn->route, &fr)) return fr;
        if (cn->route == R_NONE) {
            srv_error_set(&err, 404, "not_found_error", "not_found", NULL, "no route for %.10s %.200s", method, url);
            return send_error(s, c, R_NONE, &err, NULL, NULL);
        }
        if (route_is_post(cn->route) ? !is_post : !is_get) {
            srv_error_set(&err, 405, "invalid_request_error", "method_not_allowed", NULL,
                          "%s does not accept %.10s (use %s)", http_route_names[cn->route], method,
                          route_is_post(cn->route) ? "POST" : "GET");
            return send_error(s, c, cn->route, &err, "Allow", route_is_post(cn->route) ? "POST" : "GET");
        }
        if (cn->route != R_HEALTH && !authorised(s, c, cn)) {
            srv_error_set(&err, 401, "authentication_error", "invalid_api_key", NULL,
                          "a valid API key is required: send 'Authorization: Bearer <key>' (--api-key)");
            return refuse_before_body(s, c, cn, &err, "WWW-Authenticate", "Bearer");
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            unsigned long long v = strtoull(cl, &end, 10);
            if (v > s->p.max_body) {
                srv_error_set(&err, 413, "invalid_request_error", "request_too_large", NULL,
                              "request body is %llu bytes; the limit is %zu (--max-body)", v, s->p.max_body);
                return refuse_before_body(s, c, cn, &err, NULL, NULL);
            }
        }
        /* the session headers of the clients, in order: ours, Claude Code's, Codex's */
        static const char *const session_headers[] = {"x-session-id", "x-claude-code-session-id", "session_id",
                                                      "session-id", "thread-id", "thread_id", "conversation_id"};
        const char *hk = NULL;
        for (size_t i = 0; !hk && i < TERN_ARRAY_LEN(session_headers); i++)
            hk = MHD_lookup_connection_value(c, MHD_HEADER_KIND, session_headers[i]);
        if (hk && !(cn->session_hdr = tern_strdup(hk))) return MHD_NO;
        return MHD_YES;
    }
    if (cn->state != C_BODY) return conn_resumed(s, c, cn);
    if (*upload_size) {
        cn->n_received += *upload_size;
        body_deadline_update(s, cn);
        if (cn->drain || cn->too_large) {
            /* discarded; a client that keeps sending past the bounds is cut off */
            cn->n_discarded += *upload_size;
            *upload_size = 0;
            if (cn->n_discarded > DRAIN_MAX_BYTES || tern_now_s() - cn->t_start > DRAIN_MAX_S) return MHD_NO;
            return MHD_YES;
        }
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
    sock_set_deadline(s, c, 0); /* the body is whole */
    if (cn->drain) return send_error(s, c, cn->route, &cn->derr, cn->dhdr, cn->dval);
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
        http_render_metrics(s, &m);
        http_count_request(s, cn->route, 200);
        MHD_Result r = send_bytes(c, 200, "text/plain; version=0.0.4", m.data ? m.data : "", m.len, NULL, NULL);
        tern_buf_free(&m);
        return r;
    }
    if (!b) {
        srv_error_set(&err, 503, "unavailable_error", "loading", NULL, "the model is still loading; retry shortly");
        return send_error(s, c, cn->route, &err, "Retry-After", "2");
    }
    if (cn->route == R_MODELS) {
        json_t *data = json_array();
        json_t *e = b->model_entry ? b->model_entry(b->self) : NULL;
        if (e) json_array_append_new(data, e);
        /* one list that OpenAI clients, Claude Code (has_more, first_id, last_id) and Codex accept */
        const char *id = json_string_value(json_object_get(e, "id"));
        return send_json(s, c, cn->route, 200,
                         json_pack("{s:s,s:o,s:b,s:s?,s:s?}", "object", "list", "data", data, "has_more", 0, "first_id",
                                   id, "last_id", id));
    }
    /* POST routes: the work goes to a prepare thread while the connection waits,
     * suspended (suspend first: the prepare thread may resume it at once) */
    cn->state = C_PREP;
    MHD_suspend_connection(c);
    if (!prep_submit(s, cn)) {
        MHD_resume_connection(c);
        srv_error_set(&err, 503, "unavailable_error", "shutting_down", NULL, "the server is shutting down");
        conn_reply_error(s, cn, &err, NULL, NULL);
    }
    return MHD_YES;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    struct srv_server *s = cls;
    (void)toe;
    struct conn *cn = *con_cls;
    /* keep-alive: the next request's header is due within the idle timeout */
    sock_set_deadline(s, c, tern_now_s() + s->p.idle_timeout_s);
    if (!cn) return;
    if (cn->job) {
        atomic_store(&cn->job->cancel, 1);
        pthread_mutex_lock(&cn->job->mu);
        cn->job->parked = false;
        pthread_mutex_unlock(&cn->job->mu);
        http_job_unref(s, cn->job);
    }
    tern_buf_free(&cn->body);
    free(cn->reply);
    free(cn->session_hdr);
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
    p->max_body = DEFAULT_MAX_BODY;
    p->max_connections = DEFAULT_MAX_CONNECTIONS;
    p->max_conn_per_ip = 128;
    p->header_timeout_s = DEFAULT_HEADER_TIMEOUT_S;
    p->idle_timeout_s = DEFAULT_IDLE_TIMEOUT_S;
    p->body_timeout_s = DEFAULT_BODY_TIMEOUT_S;
    p->n_http_threads = DEFAULT_HTTP_THREADS;
    p->n_prep_threads = DEFAULT_PREP_THREADS;
}

/* Every connection is a descriptor: raise the soft limit towards what the connection
 * cap needs, and lower the cap to what the hard limit allows. */
static uint32_t fit_fd_limit(uint32_t want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return want;
    rlim_t need = (rlim_t)want + FD_RESERVE;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        rlim_t cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
        struct rlimit nl = {cur, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &nl) == 0) rl.rlim_cur = cur;
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        uint32_t fit = rl.rlim_cur > 2 * FD_RESERVE ? (uint32_t)(rl.rlim_cur - FD_RESERVE) : FD_RESERVE;
        TERN_LOG_WARN("http: %u connections need %llu file descriptors; RLIMIT_NOFILE allows %llu: serving at most %u",
                      want, (unsigned long long)need, (unsigned long long)rl.rlim_cur, fit);
        return fit;
    }
    return want;
}

enum tern_status srv_start(const struct srv_params *params, struct srv_server **out) {
    *out = NULL;
    struct srv_server *s = tern_calloc(1, sizeof *s);
    if (!s) return tern_errorf(TERN_ERR_NOMEM, "out of memory");
    s->p = *params;
    if (s->p.n_queue == 0) s->p.n_queue = 1;
    if (s->p.max_connections == 0) s->p.max_connections = DEFAULT_MAX_CONNECTIONS;
    if (s->p.max_body == 0) s->p.max_body = DEFAULT_MAX_BODY;
    if (s->p.header_timeout_s == 0) s->p.header_timeout_s = DEFAULT_HEADER_TIMEOUT_S;
    if (s->p.idle_timeout_s == 0) s->p.idle_timeout_s = DEFAULT_IDLE_TIMEOUT_S;
    if (s->p.body_timeout_s == 0) s->p.body_timeout_s = DEFAULT_BODY_TIMEOUT_S;
    if (s->p.n_http_threads == 0) s->p.n_http_threads = DEFAULT_HTTP_THREADS;
    if (s->p.n_prep_threads == 0) s->p.n_prep_threads = DEFAULT_PREP_THREADS;
    s->p.max_connections = fit_fd_limit(s->p.max_connections);
    if (s->p.max_connections < s->p.n_http_threads) s->p.max_connections = s->p.n_http_threads;
    s->t_start = tern_now_s();
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    pthread_mutex_init(&s->jmu, NULL);
    pthread_mutex_init(&s->smu, NULL);
    pthread_cond_init(&s->scv, NULL);
    pthread_mutex_init(&s->pmu, NULL);
    pthread_cond_init(&s->pcv, NULL);
    http_timeouts_init();
    s->queue = tern_calloc(s->p.n_queue, sizeof *s->queue);
    s->api_keys = s->p.n_api_keys ? tern_calloc(s->p.n_api_keys, sizeof *s->api_keys) : NULL;
    s->prep = tern_calloc(s->p.n_prep_threads, sizeof *s->prep);
    bool ok = s->queue && s->prep && (!s->p.n_api_keys || s->api_keys);
    for (size_t i = 0; ok && i < s->p.n_api_keys; i++) ok = (s->api_keys[i] = tern_strdup(params->api_keys[i])) != NULL;
    s->p.api_keys = NULL;
    if (!ok) {
        srv_stop(s);
        return tern_errorf(TERN_ERR_NOMEM, "out of memory");
    }

    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
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
    if (pthread_create(&s->worker, NULL, http_worker_main, s) != 0) {
        srv_stop(s);
        return tern_errorf(TERN_ERR_NOMEM, "cannot start the engine worker thread");
    }
    s->worker_started = true;
    for (; s->n_prep < s->p.n_prep_threads; s->n_prep++) {
        if (pthread_create(&s->prep[s->n_prep], NULL, prep_main, s) != 0) {
            srv_stop(s);
            return tern_errorf(TERN_ERR_NOMEM, "cannot start the request preparation threads");
        }
    }
    if (pthread_create(&s->watcher, NULL, http_watch_main, s) != 0) {
        srv_stop(s);
        return tern_errorf(TERN_ERR_NOMEM, "cannot start the connection watcher thread");
    }
    s->watcher_started = true;
    /* MHD's own inactivity timeout (stalled uploads, clients that stop reading) fires
     * after the watcher's deadlines, so that those always answer 408 first */
    unsigned mhd_timeout = (s->p.header_timeout_s > s->p.idle_timeout_s ? s->p.header_timeout_s : s->p.idle_timeout_s) +
                           MHD_TIMEOUT_SLACK_S;
    s->mhd = MHD_start_daemon(flags, (uint16_t)s->p.port, NULL, NULL, handler, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                              s, MHD_OPTION_SOCK_ADDR,
                              (struct sockaddr *)&ss, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                              MHD_OPTION_NOTIFY_CONNECTION, http_notify_connection, s, MHD_OPTION_THREAD_POOL_SIZE,
                              (unsigned)s->p.n_http_threads, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)s->p.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                              (unsigned)s->p.max_conn_per_ip, MHD_OPTION_CONNECTION_TIMEOUT, mhd_timeout,
                              MHD_OPTION_END);
    if (!s->mhd) {
        int port = s->p.port;
        srv_stop(s);
        return tern_errorf(TERN_ERR_IO, "cannot listen on %s:%d (in use, or not an address of this machine?)", host,
                           port);
    }
    const union MHD_DaemonInfo *li = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_LISTEN_FD);
    int defer_s = DEFER_ACCEPT_S;
    if (!li || setsockopt(li->listen_fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer_s, sizeof defer_s) != 0)
        TERN_LOG_WARN("http: cannot set TCP_DEFER_ACCEPT (%s): garbage sent right after connecting may wait for the "
                      "header timeout", li ? strerror(errno) : "no listening socket");
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->p.port;
    *out = s;
    return TERN_OK;
}

void srv_set_backend(struct srv_server *s, const struct srv_backend *b) {
    pthread_mutex_lock(&s->qmu);
    atomic_store(&s->backend, b);
    pthread_cond_broadcast(&s->qcv); /* the worker waits for it */
    pthread_mutex_unlock(&s->qmu);
}

int srv_port(const struct srv_server *s) { return s->port; }

void srv_stop(struct srv_server *s) { srv_stop_within(s, 0); }

bool srv_stop_within(struct srv_server *s, unsigned ms) {
    if (!s) return true;
    atomic_store(&s->stopping, true);
    /* cancel everything in flight so that the worker and the connections finish */
    pthread_mutex_lock(&s->jmu);
    for (size_t i = 0; i < s->n_live; i++) atomic_store(&s->live[i]->cancel, 1);
    pthread_mutex_unlock(&s->jmu);
    pthread_mutex_lock(&s->qmu);
    atomic_store(&s->preempt, 1);
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    /* the worker drains the queue (finishing each job as cancelled, which resumes its
     * connection); the prepare threads answer what they still hold with 503 */
    if (s->worker_started && ms) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const uint64_t t = (uint64_t)ts.tv_nsec + (uint64_t)ms * 1000000ull;
        ts.tv_sec += (time_t)(t / 1000000000ull);
        ts.tv_nsec = (long)(t % 1000000000ull);
        if (pthread_timedjoin_np(s->worker, NULL, &ts)) return false;
    } else if (s->worker_started) {
        pthread_join(s->worker, NULL);
    }
    pthread_mutex_lock(&s->pmu);
    s->prep_stopping = true;
    pthread_cond_broadcast(&s->pcv);
    pthread_mutex_unlock(&s->pmu);
    for (uint32_t i = 0; i < s->n_prep; i++) pthread_join(s->prep[i], NULL);
    pthread_mutex_lock(&s->smu);
    pthread_cond_broadcast(&s->scv);
    pthread_mutex_unlock(&s->smu);
    if (s->watcher_started) pthread_join(s->watcher, NULL);
    if (s->mhd) MHD_stop_daemon(s->mhd);
    for (size_t i = 0; i < s->p.n_api_keys && s->api_keys; i++) free(s->api_keys[i]);
    free(s->api_keys);
    free(s->queue);
    free(s->prep);
    free(s->live);
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
    pthread_mutex_destroy(&s->jmu);
    pthread_mutex_destroy(&s->smu);
    pthread_cond_destroy(&s->scv);
    pthread_mutex_destroy(&s->pmu);
    pthread_cond_destroy(&s->pcv);
    free(s);
    return true;
}
