/* The mock OpenAI-compatible server (see test-replay-mock.h). */
#include "test-replay-mock.h"

#include "replay/transcript.h"
#include "util/buf.h"
#include "util/hash.h"
#include "util/timeutil.h"

#include <dirent.h>
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_HELD 256
#define MAX_BODIES 512

struct held {
    char *ns;
    char *text;
    size_t len;
};

struct mock_server {
    struct MHD_Daemon *d;
    struct mock_opts o;
    uint16_t port;
    pthread_mutex_t mu;
    struct held held[MAX_HELD];
    int n_held;
    int n_requests;
    char *bodies[MAX_BODIES];
    size_t body_lens[MAX_BODIES];
    uint64_t ready_at_ns; /* /health says 503 before */
};

static void sleep_us(double us) {
    if (us <= 0) return;
    struct timespec ts = {(time_t)(us / 1e6), (long)((us - (double)(time_t)(us / 1e6) * 1e6) * 1000)};
    nanosleep(&ts, NULL);
}

/* ---- the stream ------------------------------------------------------------------------ */

struct stream {
    struct mock_server *m;
    int phase;
    struct tern_buf out;   /* bytes ready to send */
    size_t off;
    double delay_us;
    int n_tok;
    int i_tok;
    uint64_t seed;
    long prompt_tokens, cached;
    bool usage;
    bool fault_no_usage, fault_no_finish, fault_error, fault_silent;
    char *held_ns;
    struct tern_buf held_text; /* prompt + output: what the server holds afterwards */
};

static void commit_held(struct stream *s);

static const char *const words[] = {"alpha", " beta", " gamma", " delta", " eps", " zeta", " eta", " theta",
                                    " iota", " kappa", "\n", " lambda", " mu", " nu", " xi", " omicron"};

static void chunk(struct stream *s, const char *delta_json, const char *finish) {
    tern_buf_printf(&s->out,
                    "data: {\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"created\":1,"
                    "\"model\":\"mock\",\"choices\":[{\"index\":0,\"delta\":%s,\"finish_reason\":%s}]}\n\n",
                    delta_json, finish);
}

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct stream *s = cls;
    while (s->off >= s->out.len) {
        tern_buf_clear(&s->out);
        s->off = 0;
        switch (s->phase++) {
        case 0:
            chunk(s, "{\"role\":\"assistant\",\"content\":\"\"}", "null");
            if (s->fault_error) {
                tern_buf_puts(&s->out, "data: {\"error\":{\"message\":\"mock engine failure\",\"type\":\"server_error\"}}\n\n");
                s->phase = 99;
            }
            break;
        case 1: {
            if (s->fault_silent) {
                sleep_us(0.8e6); /* longer than the harness's 0.5 s timeout in the test */
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            /* Priming: sleep, with a keep-alive comment on the way when asked. */
            if (s->m->o.comments) {
                sleep_us(s->delay_us / 2);
                tern_buf_printf(&s->out, ": priming %ld/%ld\n\n", s->prompt_tokens / 2, s->prompt_tokens);
                sleep_us(s->delay_us / 2);
            } else {
                sleep_us(s->delay_us);
                tern_buf_puts(&s->out, "\n"); /* a blank line: no event */
            }
            break;
        }
        case 2:
            if (s->i_tok < s->n_tok) {
                const char *w = words[(s->seed >> (4 * (s->i_tok % 16))) & 15];
                json_t *d = json_pack("{s:s}", s->i_tok < 2 ? "reasoning_content" : "content", w);
                char *dj = json_dumps(d, JSON_COMPACT);
                chunk(s, dj, "null");
                free(dj);
                json_decref(d);
                tern_buf_puts(&s->held_text, w);
                s->i_tok++;
                s->phase = 2;
                sleep_us(200);
            } else if (s->fault_no_finish) {
                return MHD_CONTENT_READER_END_OF_STREAM;
            } else {
                commit_held(s);
                chunk(s, "{}", s->n_tok < s->m->o.n_tokens ? "\"length\"" : "\"stop\"");
            }
            break;
        case 3:
            if (s->usage && !s->fault_no_usage)
                tern_buf_printf(&s->out,
                                "data: {\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"choices\":[],"
                                "\"usage\":{\"prompt_tokens\":%ld,\"completion_tokens\":%d,\"total_tokens\":%ld,"
                                "\"prompt_tokens_details\":{\"cached_tokens\":%ld}},"
                                "\"tern\":{\"reuse\":{\"tier\":\"%s\",\"cached\":%ld,\"read\":%ld}}}\n\n",
                                s->prompt_tokens, s->n_tok, s->prompt_tokens + s->n_tok, s->cached,
                                s->cached ? "prefix" : "cold", s->cached, s->prompt_tokens - s->cached);
            else
                tern_buf_puts(&s->out, "\n");
            break;
        case 4: tern_buf_puts(&s->out, "data: [DONE]\n\n"); break;
        default: return MHD_CONTENT_READER_END_OF_STREAM;
        }
    }
    size_t n = s->out.len - s->off;
    if (n > max) n = max;
    memcpy(buf, s->out.data + s->off, n);
    s->off += n;
    return (ssize_t)n;
}

/* The server now holds prompt + its output in this namespace (a live session). Done
 * before the last chunks go out, as a real server commits before [DONE]: the client may
 * send its next request the moment it has read them. */
static void commit_held(struct stream *s) {
    struct mock_server *m = s->m;
    if (m->o.reuse && s->held_text.len) {
        pthread_mutex_lock(&m->mu);
        if (m->n_held < MAX_HELD) {
            struct held *h = &m->held[m->n_held++];
            h->ns = s->held_ns;
            s->held_ns = NULL;
            h->len = s->held_text.len;
            h->text = tern_buf_detach(&s->held_text, NULL);
        }
        pthread_mutex_unlock(&m->mu);
    }
}

static void stream_free(void *cls) {
    struct stream *s = cls;
    free(s->held_ns);
    tern_buf_free(&s->held_text);
    tern_buf_free(&s->out);
    free(s);
}

/* ---- requests ---------------------------------------------------------------------------- */

struct conn {
    struct tern_buf body;
};

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned code, const char *json) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(json), (void *)json, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result chat(struct mock_server *m, struct MHD_Connection *c, const char *body, size_t len) {
    json_error_t jerr;
    json_t *req = json_loadb(body, len, 0, &jerr);
    if (!req) return send_json(c, 400, "{\"error\":{\"message\":\"bad json\",\"type\":\"invalid_request_error\"}}");
    pthread_mutex_lock(&m->mu);
    int idx = m->n_requests++;
    if (idx < MAX_BODIES) {
        m->bodies[idx] = malloc(len + 1);
        memcpy(m->bodies[idx], body, len);
        m->bodies[idx][len] = 0;
        m->body_lens[idx] = len;
    }
    pthread_mutex_unlock(&m->mu);
    bool fault = m->o.fault != MOCK_FAULT_NONE && m->o.fault_at >= 0 && idx >= m->o.fault_at;
    if (fault && m->o.fault == MOCK_FAULT_HTTP_500) {
        json_decref(req);
        return send_json(c, 500, "{\"error\":{\"message\":\"mock says no\",\"type\":\"server_error\"}}");
    }
    struct tern_buf prompt = TERN_BUF_INIT;
    tern_transcript_render(json_object_get(req, "messages"), json_object_get(req, "tools"), true, &prompt, NULL);
    struct stream *s = calloc(1, sizeof *s);
    s->m = m;
    s->prompt_tokens = (long)((prompt.len + 3) / 4);
    const char *salt = json_string_value(json_object_get(req, "cache_salt"));
    s->held_ns = strdup(salt && !(fault && m->o.fault == MOCK_FAULT_IGNORE_SALT) ? salt : "");
    size_t best = 0;
    if (m->o.reuse) {
        pthread_mutex_lock(&m->mu);
        for (int i = 0; i < m->n_held; i++) {
            if (strcmp(m->held[i].ns, s->held_ns)) continue;
            size_t n = m->held[i].len < prompt.len ? m->held[i].len : prompt.len, k = 0;
            while (k < n && m->held[i].text[k] == prompt.data[k]) k++;
            if (k > best) best = k;
        }
        pthread_mutex_unlock(&m->mu);
    }
    s->cached = (long)(best / 4);
    if (s->cached >= s->prompt_tokens) s->cached = s->prompt_tokens - 1;
    long read = s->prompt_tokens - s->cached;
    s->delay_us = m->o.fixed_ms * 1000.0 + m->o.us_per_token * (double)read;
    s->seed = tern_hash64(prompt.data, prompt.len);
    if (fault && m->o.fault == MOCK_FAULT_OUTPUT_DIFFERS) s->seed ^= (uint64_t)m->port * 0x9E3779B97F4A7C15ull;
    json_t *mt = json_object_get(req, "max_tokens");
    int n_tok = m->o.n_tokens > 0 ? m->o.n_tokens : 6;
    if (json_is_integer(mt) && json_integer_value(mt) < n_tok) n_tok = (int)json_integer_value(mt);
    s->n_tok = m->o.empty_output ? 0 : n_tok;
    s->usage = json_is_true(json_object_get(json_object_get(req, "stream_options"), "include_usage"));
    if (fault) {
        if (m->o.fault == MOCK_FAULT_CACHED_GT_PROMPT) s->cached = s->prompt_tokens + 5;
        if (m->o.fault == MOCK_FAULT_PROMPT_SKEW) s->prompt_tokens += 1;
        s->fault_no_usage = m->o.fault == MOCK_FAULT_NO_USAGE;
        s->fault_no_finish = m->o.fault == MOCK_FAULT_NO_FINISH;
        s->fault_error = m->o.fault == MOCK_FAULT_ERROR_EVENT;
        s->fault_silent = m->o.fault == MOCK_FAULT_SILENT;
    }
    tern_buf_append(&s->held_text, prompt.data, prompt.len);
    tern_buf_free(&prompt);
    json_decref(req);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_cb, s, stream_free);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* With MOCK_PIDDIR: logs how many of the other mock servers there are running or
 * stopped (SIGSTOP, state T) at a measured request (not a warm-up), so that a test can
 * check that the harness pauses the other arm. */
static void log_peers(uint16_t port, const char *body, size_t n) {
    const char *dir = getenv("MOCK_PIDDIR");
    if (!dir || (n && memmem(body, n, "tern-replay-warmup", 18))) return;
    DIR *d = opendir(dir);
    if (!d) return;
    int running = 0, stopped = 0;
    char own[32];
    snprintf(own, sizeof own, "%u.pid", (unsigned)port);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".pid") || !strcmp(e->d_name, own)) continue;
        char path[4096], stat[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        int pid = 0;
        if (!f) continue;
        if (fscanf(f, "%d", &pid) != 1) pid = 0;
        fclose(f);
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        f = pid > 0 ? fopen(path, "r") : NULL;
        if (!f) continue; /* gone: a server of an earlier repetition */
        size_t k = fread(stat, 1, sizeof stat - 1, f);
        fclose(f);
        stat[k] = 0;
        const char *rp = strrchr(stat, ')');
        if (!rp || rp[1] != ' ') continue;
        if (rp[2] == 'T') stopped++;
        else if (rp[2] != 'Z') running++;
    }
    closedir(d);
    fprintf(stderr, "mock serve: request with peers running %d stopped %d\n", running, stopped);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    struct mock_server *m = cls;
    if (!strcmp(method, "POST")) {
        struct conn *cn = *con_cls;
        if (!cn) {
            cn = calloc(1, sizeof *cn);
            *con_cls = cn;
            return MHD_YES;
        }
        if (*upload_size) {
            tern_buf_append(&cn->body, upload, *upload_size);
            *upload_size = 0;
            return MHD_YES;
        }
        if (!strcmp(url, "/v1/chat/completions")) {
            log_peers(m->port, cn->body.data ? cn->body.data : "", cn->body.len);
            return chat(m, c, cn->body.data ? cn->body.data : "", cn->body.len);
        }
        return send_json(c, 404, "{\"error\":{\"message\":\"not found\"}}");
    }
    if (!strcmp(url, "/health")) {
        if (tern_now_ns() < m->ready_at_ns) return send_json(c, 503, "{\"status\":\"loading\"}");
        return send_json(c, 200, "{\"status\":\"ok\"}");
    }
    if (!strcmp(url, "/v1/models"))
        return send_json(c, 200, m->o.reuse ? "{\"object\":\"list\",\"data\":[{\"id\":\"mock-reuse-on\"}]}"
                                            : "{\"object\":\"list\",\"data\":[{\"id\":\"mock-reuse-off\"}]}");
    return send_json(c, 404, "{\"error\":{\"message\":\"not found\"}}");
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    struct conn *cn = *con_cls;
    if (cn) {
        tern_buf_free(&cn->body);
        free(cn);
        *con_cls = NULL;
    }
}

struct mock_server *mock_start(const struct mock_opts *o, uint16_t port) {
    struct mock_server *m = calloc(1, sizeof *m);
    m->o = *o;
    if (m->o.n_tokens <= 0) m->o.n_tokens = 6;
    pthread_mutex_init(&m->mu, NULL);
    m->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, port, NULL, NULL, handler,
                            m, MHD_OPTION_NOTIFY_COMPLETED, completed, m, MHD_OPTION_CONNECTION_TIMEOUT, 60u,
                            MHD_OPTION_END);
    if (!m->d) {
        free(m);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT);
    m->port = info ? info->port : port;
    return m;
}

uint16_t mock_port(const struct mock_server *m) { return m->port; }

void mock_url(const struct mock_server *m, char *out, size_t cap) {
    snprintf(out, cap, "http://127.0.0.1:%u", (unsigned)m->port);
}

int mock_n_requests(struct mock_server *m) {
    pthread_mutex_lock(&m->mu);
    int n = m->n_requests;
    pthread_mutex_unlock(&m->mu);
    return n;
}

char *mock_body(struct mock_server *m, int i, size_t *len) {
    pthread_mutex_lock(&m->mu);
    char *r = NULL;
    if (i >= 0 && i < m->n_requests && i < MAX_BODIES && m->bodies[i]) {
        r = malloc(m->body_lens[i] + 1);
        memcpy(r, m->bodies[i], m->body_lens[i] + 1);
        if (len) *len = m->body_lens[i];
    }
    pthread_mutex_unlock(&m->mu);
    return r;
}

void mock_stop(struct mock_server *m) {
    if (!m) return;
    MHD_stop_daemon(m->d);
    for (int i = 0; i < m->n_held; i++) {
        free(m->held[i].ns);
        free(m->held[i].text);
    }
    for (int i = 0; i < m->n_requests && i < MAX_BODIES; i++) free(m->bodies[i]);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* ---- as a process, standing in for `tern serve` ------------------------------------------ */

int mock_serve_main(int argc, char **argv) {
    const char *port_s = NULL, *prompt_cache = NULL, *model = NULL;
    for (int i = 2; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--port")) port_s = argv[++i];
        else if (!strcmp(argv[i], "--prompt-cache")) prompt_cache = argv[++i];
        else if (!strcmp(argv[i], "--model")) model = argv[++i];
    }
    if (!port_s) {
        fprintf(stderr, "mock serve: need --port\n");
        return 2;
    }
    if (!model) model = "(built-in demo)";
    if (getenv("MOCK_EXIT_AT_START") && !strcmp(getenv("MOCK_EXIT_AT_START"), "1")) {
        fprintf(stderr, "mock serve: cannot load model '%s' (asked to fail)\n", model);
        return 3;
    }
    /* Simulates losing the port race once: the flag file is consumed. */
    const char *taken = getenv("MOCK_PORT_TAKEN_ONCE");
    if (taken && unlink(taken) == 0) {
        fprintf(stderr, "mock serve: cannot listen on 127.0.0.1:%s: Address already in use\n", port_s);
        return 1;
    }
    const char *pool = getenv("TERN_REUSE_POOL");
    struct mock_opts o = {.reuse = !(pool && !strcmp(pool, "0")) && !(prompt_cache && !strcmp(prompt_cache, "0")),
                          .us_per_token = getenv("MOCK_US_PER_TOKEN") ? atof(getenv("MOCK_US_PER_TOKEN")) : 20.0,
                          .fault_at = -1, .comments = true};
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before the daemon's threads exist */
    struct mock_server *m = mock_start(&o, (uint16_t)atoi(port_s));
    if (!m) {
        fprintf(stderr, "mock serve: cannot listen on port %s\n", port_s);
        return 1;
    }
    const char *delay = getenv("MOCK_START_DELAY_MS");
    m->ready_at_ns = tern_now_ns() + (delay ? (uint64_t)atoll(delay) * 1000000ull : 0);
    const char *dir = getenv("MOCK_PIDDIR");
    if (dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.pid", dir, port_s);
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f, "%d\n", (int)getpid());
            fclose(f);
        }
        snprintf(path, sizeof path, "%s/%s.args", dir, port_s);
        f = fopen(path, "w");
        if (f) {
            for (int i = 0; i < argc; i++) fprintf(f, "%s%s", i ? " " : "", argv[i]);
            fprintf(f, "\nTERN_AFFINITY=%s\nTERN_REUSE_POOL=%s\nTERN_PREDICT=%s\nreuse=%d\n",
                    getenv("TERN_AFFINITY") ? getenv("TERN_AFFINITY") : "", pool ? pool : "",
                    getenv("TERN_PREDICT") ? getenv("TERN_PREDICT") : "", o.reuse);
            fclose(f);
        }
    }
    fprintf(stderr, "mock serve: listening on %s (reuse %s)\n", port_s, o.reuse ? "on" : "off");
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "mock serve: signal %d, stopping\n", sig);
    mock_stop(m);
    return 0;
}
