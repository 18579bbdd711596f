/* Jobs, the queue and the worker of the HTTP server (http-impl.h), and what each
 * request leaves behind: its metrics and its log line. */
#include "server/http-impl.h"

/* status classes counted per route for /metrics */
const int http_counted_status[N_COUNTED] = {200, 400, 401, 404, 405, 408, 413, 429, 499, 500, 503};

/* ---- jobs -------------------------------------------------------------------------- */

void srv_job_write(struct srv_job *j, const char *data, size_t n) {
    pthread_mutex_lock(&j->mu);
    /* A client that stopped reading must not make the server hold an unbounded
     * backlog: past MAX_UNREAD_OUTPUT unread the request is cancelled. */
    if (j->out.len - j->out_read > MAX_UNREAD_OUTPUT) {
        atomic_store(&j->cancel, 1);
    } else if (tern_buf_append(&j->out, data, n) != TERN_OK) {
        atomic_store(&j->cancel, 1);
    }
    if (j->req.stream) http_job_wake(j); /* a non-streamed body goes out whole, at the end */
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void srv_job_finish(struct srv_job *j, int status) {
    pthread_mutex_lock(&j->mu);
    j->done = true;
    j->status = status;
    http_job_wake(j);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

struct srv_job *http_job_new(struct srv_server *s) {
    struct srv_job *j = tern_calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->fd = -1;
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

void http_job_unref(struct srv_server *s, struct srv_job *j) {
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
    bool big = j->big_body;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
    /* parsing amplifies a body up to ~50x in small allocations that glibc keeps in its
     * arenas (8 parallel 16 MiB bodies held 5.9 GB afterwards): give them back */
    if (big) malloc_trim(0);
}

/* ---- metrics and the log line ------------------------------------------------------ */

void http_count_request(struct srv_server *s, enum route r, int status) {
    size_t k = N_COUNTED;
    for (size_t i = 0; i < N_COUNTED; i++)
        if (http_counted_status[i] == status) k = i;
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

/* A summary's head, _sum (seconds from microseconds) and _count. */
static void put_summary(struct tern_buf *b, const char *name, const char *help, uint64_t us_sum, uint64_t count) {
    srv_metric_head(b, name, "summary", help);
    tern_buf_printf(b, "%s_sum %.6f\n%s_count %llu\n", name, (double)us_sum * 1e-6, name, (unsigned long long)count);
}

void http_render_metrics(struct srv_server *s, struct tern_buf *b) {
    srv_metric_head(b, "tern_requests_total", "counter", "HTTP requests by route and status.");
    for (int r = 0; r < R_COUNT; r++) {
        for (size_t k = 0; k <= N_COUNTED; k++) {
            uint64_t v = atomic_load(&s->requests[r][k]);
            if (!v) continue;
            if (k < N_COUNTED)
                tern_buf_printf(b, "tern_requests_total{route=\"%s\",status=\"%d\"} %llu\n", http_route_names[r],
                                http_counted_status[k], (unsigned long long)v);
            else
                tern_buf_printf(b, "tern_requests_total{route=\"%s\",status=\"other\"} %llu\n", http_route_names[r],
                                (unsigned long long)v);
        }
    }
    pthread_mutex_lock(&s->qmu);
    uint32_t q = s->q_len;
    uint32_t n_running = s->n_running;
    uint32_t n_simple = s->n_simple;
    pthread_mutex_unlock(&s->qmu);
    const struct srv_metric rows[] = {
        {"tern_queue_depth", "gauge", "Requests waiting in the queue for the engine.", SRV_U(q)},
        {"tern_queue_capacity", "gauge", "Requests the queue holds before answering 503 (--queue).", SRV_U(s->p.n_queue)},
        {"tern_engine_busy", "gauge", "1 while the engine runs at least one request.", SRV_U(n_running ? 1 : 0)},
        {"tern_requests_running", "gauge", "Requests the engine is running (priming or decoding).", SRV_U(n_running)},
        {"tern_requests_waiting", "gauge", "Requests queued for a place among the running ones.", SRV_U(q)},
        {"tern_tokenize_running", "gauge", "/tokenize and /detokenize requests admitted and not yet answered.",
         SRV_U(n_simple)},
        {"tern_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
         SRV_U(atomic_load(&s->prompt_tokens))},
        {"tern_prompt_tokens_cached_total", "counter", "Prompt tokens reused from a cached state, not read.",
         SRV_U(atomic_load(&s->cached_tokens))},
        {"tern_prompt_tokens_read_total", "counter", "Prompt tokens read (evaluated) by the model.",
         SRV_U(atomic_load(&s->read_tokens))},
        {"tern_generated_tokens_total", "counter", "Tokens generated.", SRV_U(atomic_load(&s->generated_tokens))},
        {"tern_requests_cancelled_total", "counter", "Requests whose client went away or that a stop cancelled (499).",
         SRV_U(atomic_load(&s->cancelled))},
    };
    srv_metrics_put(b, rows, TERN_ARRAY_LEN(rows));
    const uint64_t ttft_count = atomic_load(&s->ttft_count);
    put_summary(b, "tern_ttft_seconds", "Time from arrival to the first generated token.", atomic_load(&s->ttft_us_sum),
                ttft_count);
    put_summary(b, "tern_ttft_overhead_seconds",
                "The part of the time to first token not spent reading prompt tokens (queue wait, parse, render, "
                "tokenize, reuse decision, restore, first sample).",
                atomic_load(&s->overhead_us_sum), ttft_count);
    put_summary(b, "tern_preempt_wait_seconds", "How long requests that arrived during idle work waited for it.",
                atomic_load(&s->preempt_us_sum), atomic_load(&s->preempt_count));
    const struct srv_metric conns[] = {
        {"tern_uptime_seconds", "gauge", "Seconds since the server started.", SRV_F(tern_now_s() - s->t_start)},
        {"tern_http_connections_open", "gauge", "Open client connections (idle keep-alive ones included).",
         SRV_U(atomic_load(&s->conns_open))},
        {"tern_http_connections_total", "counter", "Client connections accepted.", SRV_U(atomic_load(&s->conns_total))},
        {"tern_http_header_timeouts_total", "counter",
         "Connections closed (408) for not sending a complete request header in time (--header-timeout, "
         "--idle-timeout).",
         SRV_U(atomic_load(&s->header_timeouts))},
        {"tern_http_body_timeouts_total", "counter",
         "Connections closed (408) for not sending their request body in time (--body-timeout, then 4096 bytes a "
         "second).",
         SRV_U(atomic_load(&s->body_timeouts))},
        {"tern_http_connections_shed_total", "counter",
         "Waiting connections closed to make room for new ones when the connection table was nearly full.",
         SRV_U(atomic_load(&s->conns_shed))},
    };
    srv_metrics_put(b, conns, TERN_ARRAY_LEN(conns));
    const struct srv_backend *be = atomic_load(&s->backend);
    if (be && be->metrics) be->metrics(be->self, b);
}

/* ---- the worker -------------------------------------------------------------------- */

/* The end of a job the worker ran: its status for the log and /metrics, then the
 * worker's reference goes. */
static void job_retire(struct srv_server *s, struct srv_job *j) {
    pthread_mutex_lock(&j->mu);
    bool done = j->done;
    pthread_mutex_unlock(&j->mu);
    if (!done) srv_job_finish(j, 500); /* a backend bug; never leave a client hanging */
    pthread_mutex_lock(&j->mu);
    int status = j->status;
    pthread_mutex_unlock(&j->mu);
    bool cancelled = atomic_load(&j->cancel) != 0;
    if (cancelled) {
        if (!j->note[0]) snprintf(j->note, sizeof j->note, "cancelled (client went away)");
        status = 499;
    }
    /* A stream's status line said 200 long ago; the log and /metrics say how it
     * ended (499: the client went away; 5xx: an error event ended it). */
    status = j->req.stream && status < 400 ? 200 : status;
    http_count_request(s, j->route, status);
    if (cancelled) atomic_fetch_add(&s->cancelled, 1);
    log_job(s, j, status);
    http_job_unref(s, j);
}

/* Takes the next queued job (qmu held, q_len > 0). */
static struct srv_job *dequeue(struct srv_server *s) {
    struct srv_job *j = s->queue[s->q_head];
    s->q_head = (s->q_head + 1) % s->p.n_queue;
    s->q_len--;
    s->idle_pending = true;
    if (j->t_preempt_from > 0) j->t_preempt_wait = tern_now_s() - j->t_preempt_from;
    return j;
}

static void count_preempt(struct srv_server *s, const struct srv_job *j) {
    if (j->t_preempt_from > 0) {
        atomic_fetch_add(&s->preempt_us_sum, (uint64_t)(j->t_preempt_wait * 1e6));
        atomic_fetch_add(&s->preempt_count, 1);
    }
}

static bool cancelled_before_start(struct srv_server *s, struct srv_job *j) {
    if (!atomic_load(&j->cancel) && !atomic_load(&s->stopping)) return false;
    snprintf(j->note, sizeof j->note, "cancelled before it started");
    srv_job_finish(j, 499);
    return true;
}

/* Nothing queued and nothing running: background work, which yields to the next
 * an enqueue at its next chunk boundary; else sleep until a job comes. (qmu held) */
static void worker_wait(struct srv_server *s) {
    const struct srv_backend *ib = atomic_load(&s->backend);
    if (s->idle_pending && ib && ib->idle) {
        atomic_store(&s->preempt, 0);
        s->idle_running = true;
        pthread_mutex_unlock(&s->qmu);
        bool more = ib->idle(ib->self, &s->preempt);
        pthread_mutex_lock(&s->qmu);
        s->idle_running = false;
        s->idle_pending = more;
        return;
    }
    pthread_cond_wait(&s->qcv, &s->qmu);
}

/* A backend that runs one job at a time (backend->run). */
static void *worker_serial(struct srv_server *s) {
    for (;;) {
        pthread_mutex_lock(&s->qmu);
        while (s->q_len == 0 && !atomic_load(&s->stopping)) worker_wait(s);
        if (s->q_len == 0) {
            pthread_mutex_unlock(&s->qmu);
            break;
        }
        struct srv_job *j = dequeue(s);
        s->n_running = 1;
        pthread_mutex_unlock(&s->qmu);
        count_preempt(s, j);
        const struct srv_backend *b = atomic_load(&s->backend);
        if (!cancelled_before_start(s, j)) b->run(b->self, j);
        job_retire(s, j);
        pthread_mutex_lock(&s->qmu);
        s->n_running = 0;
        pthread_mutex_unlock(&s->qmu);
    }
    return NULL;
}

/* A batched backend (backend->start, ->step): jobs join the running set between steps
 * while it has room; every step advances all of them. At shutdown the running jobs
 * are cancelled (srv_stop) and end in the next step. */
static void *worker_batched(struct srv_server *s, const struct srv_backend *b) {
    uint32_t max_running = b->max_running ? b->max_running : 1;
    struct srv_job *one[1];
    struct srv_job **ended = tern_calloc(max_running, sizeof *ended);
    if (!ended) {
        TERN_LOG_ERROR("server: out of memory for the worker; running one request at a time");
        max_running = 1;
    }
    struct srv_job **out = ended ? ended : one;
    for (;;) {
        pthread_mutex_lock(&s->qmu);
        while (s->q_len == 0 && s->n_running == 0 && !atomic_load(&s->stopping)) worker_wait(s);
        if (s->q_len == 0 && s->n_running == 0) {
            pthread_mutex_unlock(&s->qmu);
            break;
        }
        while (s->q_len > 0 && s->n_running < max_running) {
            struct srv_job *j = dequeue(s);
            s->n_running++;
            pthread_mutex_unlock(&s->qmu);
            count_preempt(s, j);
            if (cancelled_before_start(s, j)) {
                job_retire(s, j);
                pthread_mutex_lock(&s->qmu);
                s->n_running--;
                continue;
            }
            const bool runs = b->start(b->self, j);
            if (!runs) job_retire(s, j);
            pthread_mutex_lock(&s->qmu);
            if (!runs) s->n_running--;
        }
        const bool any = s->n_running > 0;
        pthread_mutex_unlock(&s->qmu);
        if (!any) continue;
        size_t k = b->step(b->self, out, max_running);
        for (size_t i = 0; i < k; i++) job_retire(s, out[i]);
        pthread_mutex_lock(&s->qmu);
        s->n_running -= (uint32_t)k;
        pthread_mutex_unlock(&s->qmu);
    }
    free(ended);
    return NULL;
}

void *http_worker_main(void *arg) {
    struct srv_server *s = arg;
    /* the backend is set before the first job is queued */
    pthread_mutex_lock(&s->qmu);
    while (!atomic_load(&s->backend) && !atomic_load(&s->stopping)) pthread_cond_wait(&s->qcv, &s->qmu);
    pthread_mutex_unlock(&s->qmu);
    const struct srv_backend *b = atomic_load(&s->backend);
    if (b && b->start && b->step) return worker_batched(s, b);
    return worker_serial(s);
}

/* Queues a job (the queue takes a reference). false when the queue is full. */
bool http_enqueue(struct srv_server *s, struct srv_job *j) {
    pthread_mutex_lock(&s->qmu);
    if (s->q_len + s->n_simple >= s->p.n_queue || atomic_load(&s->stopping)) {
        pthread_mutex_unlock(&s->qmu);
        return false;
    }
    job_ref(j);
    s->queue[(s->q_head + s->q_len) % s->p.n_queue] = j;
    s->q_len++;
    atomic_store(&s->preempt, 1);
    if (s->idle_running) j->t_preempt_from = tern_now_s();
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return true;
}
