/* The replay loop: servers, repetitions, turns, arms, checks, turns.jsonl. */
#include "replay/replay.h"

#include "util/hash.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *tern_replay_isolate_name(enum tern_replay_isolate i) {
    switch (i) {
    case TERN_ISOLATE_RESTART: return "restart";
    case TERN_ISOLATE_SALT: return "salt";
    case TERN_ISOLATE_NONE: return "none";
    }
    return "?";
}

void tern_replay_config_default(struct tern_replay_config *c) {
    memset(c, 0, sizeof *c);
    c->n_reps = 3;
    c->max_tokens = -1;
    c->isolate = TERN_ISOLATE_RESTART;
    c->warmup = true;
    c->timeout_s = 600;
    c->start_timeout_s = 300;
}

void tern_replay_run_free(struct tern_replay_run *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n_meas; i++) tern_replay_meas_clear(&r->meas[i]);
    free(r->meas);
    free(r);
}

struct ctx {
    const struct tern_replay_config *cfg;
    struct tern_replay_run *run;
    struct tern_server_proc procs[TERN_REPLAY_MAX_ARMS];
    struct tern_http_url urls[TERN_REPLAY_MAX_ARMS];
    char urlstr[TERN_REPLAY_MAX_ARMS][600];
    FILE *jsonl;
    uint64_t t_run0;
    struct tern_buf body;
};

static void note(const struct ctx *c, const char *fmt, ...) TERN_PRINTF(2, 3);
static void note(const struct ctx *c, const char *fmt, ...) {
    if (!c->cfg->on_note) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    c->cfg->on_note(c->cfg->user, line);
}

static bool cancelled(const struct ctx *c) { return c->cfg->cancel && *c->cfg->cancel; }

/* Sleeps s seconds in slices, returning early (false) on cancel. */
static bool quiet(const struct ctx *c, double s) {
    uint64_t end = tern_now_ns() + (uint64_t)(s * 1e9);
    while (tern_now_ns() < end) {
        if (cancelled(c)) return false;
        uint64_t left = end - tern_now_ns();
        if (left > 50000000ull) left = 50000000ull;
        struct timespec ts = {0, (long)left};
        nanosleep(&ts, NULL);
    }
    return !cancelled(c);
}

static void stop_servers(struct ctx *c) {
    for (int a = 0; a < c->cfg->n_arms; a++) tern_server_stop(&c->procs[a]);
}

/* Managed arms take turns on the machine: before arm a's request every other server is
 * paused, so it gets no CPU time during a's request and a's quiet time after it. Without
 * this, work a server does when idle (predictive priming) would run during the other
 * arm's request: it would slow that arm down, and it would get idle time that the
 * protocol (--gap) does not give it. */
/* A URL arm's server process stopped (SIGSTOP) or continued; waits until it really is
 * stopped (its /proc state 'T'), bounded: it is not our child, so waitpid cannot. */
static void pause_pid(int pid, bool pause) {
    if (pid <= 0) return;
    kill((pid_t)pid, pause ? SIGSTOP : SIGCONT);
    if (!pause) return;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    for (int i = 0; i < 1000; i++) {
        FILE *f = fopen(path, "r");
        if (!f) return;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *rp = strrchr(buf, ')'); /* "pid (comm) S ..." */
        if (!rp || rp[1] != ' ' || rp[2] == 'T' || rp[2] == 't') return;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static void take_turn(struct ctx *c, int a) {
    if (!c->cfg->arms[0].managed && !c->cfg->no_pause) {
        for (int b = 0; b < c->cfg->n_arms; b++)
            if (b != a) pause_pid(c->cfg->pause_pid[b], true);
        pause_pid(c->cfg->pause_pid[a], false);
        return;
    }
    if (!c->cfg->arms[0].managed || c->cfg->no_pause) return;
    for (int b = 0; b < c->cfg->n_arms; b++)
        if (b != a) tern_server_pause(&c->procs[b], true);
    tern_server_pause(&c->procs[a], false);
}

static void resume_all(struct ctx *c) {
    for (int a = 0; a < c->cfg->n_arms; a++) {
        tern_server_pause(&c->procs[a], false);
        pause_pid(c->cfg->pause_pid[a], false);
    }
}

static enum tern_status mkdir_p(const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return tern_errorf(TERN_ERR_INVALID, "output directory path is too long (%zu bytes)", strlen(dir));
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return tern_errorf(TERN_ERR_IO, "cannot create directory '%s': %s", path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return tern_errorf(TERN_ERR_IO, "cannot create output directory '%s': %s", path, strerror(errno));
    return TERN_OK;
}

/* GET /v1/models: the first model's id, for the report. Failure is not an error. */
static void fetch_model_id(const struct tern_http_url *u, char *out, size_t cap) {
    struct tern_http_response rs = TERN_HTTP_RESPONSE_INIT;
    if (tern_http_get(u, "/v1/models", 10.0, &rs) == TERN_OK && rs.status == 200) {
        json_t *j = json_loadb(rs.body.data ? rs.body.data : "", rs.body.len, 0, NULL);
        json_t *id = json_object_get(json_array_get(json_object_get(j, "data"), 0), "id");
        if (json_is_string(id)) snprintf(out, cap, "%s", json_string_value(id));
        json_decref(j);
    }
    tern_http_response_free(&rs);
}

/* The server's error message from a non-200 body (OpenAI shape), or the body's start. */
static void error_message(const struct tern_http_response *rs, char *out, size_t cap) {
    json_t *j = json_loadb(rs->body.data ? rs->body.data : "", rs->body.len, 0, NULL);
    json_t *msg = json_object_get(json_object_get(j, "error"), "message");
    if (json_is_string(msg)) snprintf(out, cap, "%s", json_string_value(msg));
    else snprintf(out, cap, "%.200s", rs->body.data ? rs->body.data : "(empty body)");
    json_decref(j);
}

struct stream_sink {
    struct tern_chat_stream *cs;
    struct tern_buf *errbody; /* non-200: the body is kept for the message */
    int *status;
    const struct tern_http_response *rs;
    enum tern_status st;
    char err[600];
};

static int sink_body(void *user, const char *data, size_t n) {
    struct stream_sink *s = user;
    if (s->rs->status != 200) {
        if (s->errbody->len < 65536) tern_buf_append(s->errbody, data, n);
        return 0;
    }
    s->st = tern_chat_stream_feed(s->cs, data, n);
    if (s->st != TERN_OK) {
        snprintf(s->err, sizeof s->err, "%s", tern_last_error());
        return 1;
    }
    return 0;
}

/* POSTs body to arm's /v1/chat/completions (or the protocol's route) and streams the
 * answer into m. */
static enum tern_status post_to(struct ctx *c, int arm, const char *path, const char *body, size_t len,
                                struct tern_replay_meas *m, const char *what);

static enum tern_status post_chat(struct ctx *c, int arm, const char *body, size_t len, struct tern_replay_meas *m,
                                  const char *what) {
    return post_to(c, arm, "/v1/chat/completions", body, len, m, what);
}

static enum tern_status post_to(struct ctx *c, int arm, const char *path, const char *body, size_t len,
                                struct tern_replay_meas *m, const char *what) {
    static const struct tern_http_header hdr[] = {{"Content-Type", "application/json"},
                                                  {"Accept", "text/event-stream"}};
    struct tern_http_response rs = TERN_HTTP_RESPONSE_INIT;
    struct tern_http_request rq = {.method = "POST", .url = &c->urls[arm], .path = path,
                                   .headers = hdr, .n_headers = 2, .body = body, .body_len = len,
                                   .connect_timeout_s = 10.0, .idle_timeout_s = c->cfg->timeout_s,
                                   .cancel = c->cfg->cancel};
    struct tern_chat_stream *cs = NULL;
    uint64_t t0 = tern_now_ns();
    enum tern_status st = tern_chat_stream_new(m, t0, &cs);
    if (st != TERN_OK) return st;
    struct tern_buf errbody = TERN_BUF_INIT;
    int status = 0;
    struct stream_sink sink = {.cs = cs, .errbody = &errbody, .status = &status, .rs = &rs, .st = TERN_OK};
    st = tern_http_request(&rq, sink_body, &sink, &rs);
    const char *label = c->cfg->arms[arm].label;
    if (st != TERN_OK) {
        if (sink.st != TERN_OK) st = tern_errorf(sink.st, "%s, arm %s: %s", what, label, sink.err);
        else st = tern_error_prefix(st, "%s, arm %s", what, label);
    } else if (rs.status != 200) {
        rs.body = errbody;
        errbody = (struct tern_buf)TERN_BUF_INIT;
        char msg[400];
        error_message(&rs, msg, sizeof msg);
        st = tern_errorf(TERN_ERR_FORMAT, "%s, arm %s: HTTP %d from %s: %s", what, label, rs.status, c->urlstr[arm],
                         msg);
    } else {
        st = tern_chat_stream_finish(cs, rs.t_end_ns);
        if (st != TERN_OK) st = tern_error_prefix(st, "%s, arm %s", what, label);
    }
    tern_buf_free(&errbody);
    tern_chat_stream_free(cs);
    tern_http_response_free(&rs);
    return st;
}

/* Starts arm a's server on a free loopback port. */
static enum tern_status start_server(struct ctx *c, int a, uint16_t port) {
    const struct tern_replay_config *cfg = c->cfg;
    const struct tern_replay_arm *arm = &cfg->arms[a];
    char port_s[8];
    snprintf(port_s, sizeof port_s, "%u", (unsigned)port);
    size_t n_argv = 8 + (size_t)cfg->n_server_args + 2 + 1;
    char **argv = tern_calloc(n_argv, sizeof *argv);
    if (!argv) return tern_errorf(TERN_ERR_NOMEM, "out of memory for the server's arguments");
    size_t k = 0;
    argv[k++] = (char *)cfg->server_bin;
    argv[k++] = "serve";
    if (cfg->model_path) { /* none: the server's built-in demo model */
        argv[k++] = "--model";
        argv[k++] = (char *)cfg->model_path;
    }
    argv[k++] = "--host";
    argv[k++] = "127.0.0.1";
    argv[k++] = "--port";
    argv[k++] = port_s;
    for (int i = 0; i < cfg->n_server_args; i++) argv[k++] = cfg->server_args[i];
    if (!arm->reuse) {
        /* Last, so that it wins over a --prompt-cache in --server-args. */
        argv[k++] = "--prompt-cache";
        argv[k++] = "0";
    }
    argv[k] = NULL;
    static char *const off_env[] = {"TERN_AFFINITY=0", "TERN_REUSE_POOL=0", "TERN_PREDICT=0", NULL};
    static char *const no_predict_env[] = {"TERN_PREDICT=0", NULL};
    char log_path[4096];
    snprintf(log_path, sizeof log_path, "%s/server-%s.log", cfg->out_dir, arm->label);
    struct tern_server_spec spec = {.bin = cfg->server_bin, .argv = argv, .env_add = !arm->reuse ? off_env : arm->no_predict ? no_predict_env : NULL,
                                    .log_path = log_path, .start_timeout_s = cfg->start_timeout_s,
                                    .cancel = cfg->cancel};
    note(c, "starting server '%s' on port %u (log %s)", arm->label, (unsigned)port, log_path);
    uint64_t t0 = tern_now_ns();
    enum tern_status st = tern_server_start(&spec, port, &c->procs[a]);
    free(argv);
    if (st == TERN_OK) note(c, "server '%s' ready in %.1f s", arm->label, (double)(tern_now_ns() - t0) * 1e-9);
    return st;
}

static enum tern_status start_servers(struct ctx *c) {
    const struct tern_replay_config *cfg = c->cfg;
    for (int a = 0; a < cfg->n_arms; a++) {
        /* The port was free a moment ago; another process may take it before the
         * server binds it. That shows as "in use" in the server's last words: try
         * another port, a few times. */
        enum tern_status st = TERN_OK;
        for (int attempt = 0; attempt < 4; attempt++) {
            uint16_t port;
            st = tern_server_free_port(&port);
            if (st != TERN_OK) return st;
            st = start_server(c, a, port);
            if (st != TERN_ERR_IO || !strstr(tern_last_error(), "in use")) break;
            note(c, "port %u was taken before server '%s' bound it; trying another", (unsigned)port,
                 cfg->arms[a].label);
        }
        if (st != TERN_OK) return tern_error_prefix(st, "arm %s", cfg->arms[a].label);
        snprintf(c->urlstr[a], sizeof c->urlstr[a], "%s", c->procs[a].url);
        st = tern_http_url_parse(c->urlstr[a], &c->urls[a]);
        if (st != TERN_OK) return st;
    }
    return TERN_OK;
}

static enum tern_status warmup(struct ctx *c) {
    json_t *model = json_object_get(c->cfg->tr->turns[0].req, "model");
    json_t *body = json_pack("{s:O?,s:[{s:s,s:s}],s:i,s:i,s:b,s:s+}", "model", model, "messages", "role", "user",
                             "content", "Reply with one word.", "max_tokens", 4, "temperature", 0, "stream", 1,
                             "cache_salt", "tern-replay-warmup-", c->run->run_id);
    char *txt = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!txt) return tern_errorf(TERN_ERR_NOMEM, "out of memory building the warm-up request");
    enum tern_status st = TERN_OK;
    for (int a = 0; a < c->cfg->n_arms && st == TERN_OK; a++) {
        struct tern_replay_meas m = {0};
        st = post_chat(c, a, txt, strlen(txt), &m, "warm-up request");
        tern_replay_meas_clear(&m);
    }
    free(txt);
    return st;
}

/* Checks of one turn once every arm has answered: usage, identical bytes, same prompt
 * tokens across arms and repetitions; and whether repetitions leaked into each other. */
static enum tern_status check_turn(struct ctx *c, int rep, size_t t) {
    const struct tern_replay_config *cfg = c->cfg;
    struct tern_replay_run *run = c->run;
    const struct tern_replay_meas *ms[TERN_REPLAY_MAX_REPS * TERN_REPLAY_MAX_ARMS];
    const char *labels[TERN_REPLAY_MAX_ARMS];
    size_t n = 0;
    for (int a = 0; a < cfg->n_arms; a++) labels[a] = cfg->arms[a].label;
    for (int r = 0; r <= rep; r++)
        for (int a = 0; a < cfg->n_arms; a++) ms[n++] = tern_replay_meas_at(run, r, t, a);
    enum tern_status st = tern_replay_check_turn_slack(ms, n, labels, cfg->prompt_slack);
    if (st != TERN_OK) return st;
    if (t == 0 && rep > 0 && !run->isolation_leak) {
        for (int a = 0; a < cfg->n_arms; a++) {
            const struct tern_replay_meas *m0 = tern_replay_meas_at(run, 0, 0, a), *m = tern_replay_meas_at(run, rep, 0, a);
            if (m->cached_tokens > m0->cached_tokens && m0->cached_tokens >= 0) {
                run->isolation_leak = true;
                run->leak_cached = m->cached_tokens;
                run->leak_rep = rep;
                note(c, "warning: rep %d's cold turn reused %ld tokens on arm %s (rep 1: %ld): repetitions are not "
                        "independent (isolation '%s')",
                     rep + 1, m->cached_tokens, cfg->arms[a].label, m0->cached_tokens,
                     tern_replay_isolate_name(cfg->isolate));
                break;
            }
        }
    }
    return TERN_OK;
}

static enum tern_status validate(const struct tern_replay_config *cfg, size_t *n_turns) {
    if (!cfg->tr) return tern_errorf(TERN_ERR_INVALID, "no transcript");
    if (cfg->n_arms < 1 || cfg->n_arms > TERN_REPLAY_MAX_ARMS)
        return tern_errorf(TERN_ERR_INVALID, "%d arms (1 or 2)", cfg->n_arms);
    if (cfg->n_reps < 1 || cfg->n_reps > TERN_REPLAY_MAX_REPS)
        return tern_errorf(TERN_ERR_INVALID, "--reps %d out of range (1..%d)", cfg->n_reps, TERN_REPLAY_MAX_REPS);
    *n_turns = cfg->n_turns ? cfg->n_turns : cfg->tr->n_turns;
    if (*n_turns > cfg->tr->n_turns)
        return tern_errorf(TERN_ERR_INVALID, "--turns %zu but %s has %zu turns", *n_turns, cfg->tr->path,
                           cfg->tr->n_turns);
    if (!cfg->out_dir) return tern_errorf(TERN_ERR_INVALID, "no output directory");
    bool managed = cfg->arms[0].managed;
    for (int a = 0; a < cfg->n_arms; a++) {
        if (cfg->arms[a].managed != managed)
            return tern_errorf(TERN_ERR_INVALID, "arms must be all managed (--model) or all URLs");
        if (!managed && !cfg->arms[a].url[0]) return tern_errorf(TERN_ERR_INVALID, "arm %s has no URL", cfg->arms[a].label);
    }
    if (managed && !cfg->server_bin) return tern_errorf(TERN_ERR_INVALID, "managed arms need a server executable");
    if (!managed && cfg->isolate == TERN_ISOLATE_RESTART)
        return tern_errorf(TERN_ERR_INVALID, "isolation by restart needs servers the harness starts (--model); with "
                           "--url use salt or none");
    if (cfg->gap_s < 0 || cfg->user_gap_s < 0) return tern_errorf(TERN_ERR_INVALID, "negative gap");
    enum tern_status st = TERN_OK;
    if (!cfg->trust_kinds) st = tern_transcript_verify_kinds(cfg->tr, *n_turns);
    if (st == TERN_OK) st = tern_transcript_check_rewrite(cfg->tr, *n_turns);
    return st;
}

enum tern_status tern_replay_run(const struct tern_replay_config *cfg, struct tern_replay_run **out) {
    *out = NULL;
    size_t n_turns = 0;
    enum tern_status st = validate(cfg, &n_turns);
    if (st != TERN_OK) return st;
    struct ctx c = {.cfg = cfg, .t_run0 = tern_now_ns()};
    struct tern_replay_run *run = tern_calloc(1, sizeof *run);
    if (!run) return tern_errorf(TERN_ERR_NOMEM, "out of memory for the run");
    c.run = run;
    run->cfg = cfg;
    run->n_turns = n_turns;
    run->n_meas = (size_t)cfg->n_reps * n_turns * (size_t)cfg->n_arms;
    run->meas = tern_calloc(run->n_meas, sizeof *run->meas);
    if (!run->meas) {
        free(run);
        return tern_errorf(TERN_ERR_NOMEM, "out of memory for %zu measurements", (size_t)cfg->n_reps * n_turns);
    }
    for (size_t i = 0; i < run->n_meas; i++) {
        struct tern_replay_meas *m = &run->meas[i];
        m->ttft_s = m->first_byte_s = m->total_s = NAN;
        m->prompt_tokens = m->cached_tokens = m->completion_tokens = -1;
        m->ttft_at = "none";
    }
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    snprintf(run->run_id, sizeof run->run_id, "%08lx%04x", (unsigned long)wall.tv_sec,
             (unsigned)(getpid() ^ (unsigned)(wall.tv_nsec >> 10)) & 0xffffu);
    struct tm tm;
    gmtime_r(&wall.tv_sec, &tm);
    strftime(run->started_at, sizeof run->started_at, "%Y-%m-%dT%H:%M:%SZ", &tm);

    st = mkdir_p(cfg->out_dir);
    if (st != TERN_OK) goto fail;
    char path[4096];
    snprintf(path, sizeof path, "%s/turns.jsonl", cfg->out_dir);
    c.jsonl = fopen(path, "w");
    if (!c.jsonl) {
        st = tern_errorf(TERN_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
        goto fail;
    }
    bool managed = cfg->arms[0].managed;
    if (!managed) {
        for (int a = 0; a < cfg->n_arms; a++) {
            snprintf(c.urlstr[a], sizeof c.urlstr[a], "%s", cfg->arms[a].url);
            st = tern_http_url_parse(c.urlstr[a], &c.urls[a]);
            if (st != TERN_OK) goto fail;
        }
    }
    uint64_t t_first = 0, t_last = 0;
    for (int rep = 0; rep < cfg->n_reps; rep++) {
        if (managed && (rep == 0 || cfg->isolate == TERN_ISOLATE_RESTART)) {
            if (rep > 0) note(&c, "rep %d of %d: restarting the servers (no state carries over)", rep + 1, cfg->n_reps);
            stop_servers(&c);
            st = start_servers(&c);
            if (st != TERN_OK) goto fail;
        }
        if (rep == 0) {
            for (int a = 0; a < cfg->n_arms; a++) {
                fetch_model_id(&c.urls[a], run->model_id[a], sizeof run->model_id[a]);
                snprintf(run->arm_url[a], sizeof run->arm_url[a], "%s", c.urlstr[a]);
            }
        }
        resume_all(&c);
        if (cfg->warmup) {
            st = warmup(&c);
            if (st != TERN_OK) goto fail;
        }
        char salt[96];
        snprintf(salt, sizeof salt, "tern-replay-%s-rep%d", run->run_id, rep + 1);
        struct tern_body_opts bo = {.max_tokens = cfg->max_tokens,
                                    .cache_salt = cfg->isolate == TERN_ISOLATE_SALT ? salt : NULL};
        double pending_gap = 0;
        for (size_t t = 0; t < n_turns; t++) {
            const struct tern_replay_turn *turn = &cfg->tr->turns[t];
            bool flip = cfg->n_arms == 2 && ((size_t)rep + t) % 2 == 1;
            for (int k = 0; k < cfg->n_arms; k++) {
                int a = flip ? cfg->n_arms - 1 - k : k;
                if (pending_gap > 0 && !quiet(&c, pending_gap)) {
                    st = tern_errorf(TERN_ERR_CANCELLED, "cancelled");
                    goto fail;
                }
                if (cancelled(&c)) {
                    st = tern_errorf(TERN_ERR_CANCELLED, "cancelled");
                    goto fail;
                }
                take_turn(&c, a);
                struct tern_replay_meas *m = tern_replay_meas_at(run, rep, t, a);
                m->turn = t;
                m->rep = rep;
                m->arm = a;
                m->gap_before_s = pending_gap;
                /* Each arm's body is built on its own and hashed as sent: the check below
                 * compares what really went out, not an assumption. */
                st = tern_replay_body_build(turn, &bo, &c.body, &m->edits);
                if (st == TERN_OK) st = tern_replay_to_protocol(cfg->protocol, cfg->shape, &c.body);
                if (st != TERN_OK) goto fail;
                m->body_hash = tern_hash64(c.body.data, c.body.len);
                m->body_len = c.body.len;
                uint64_t t0 = tern_now_ns();
                if (!t_first) t_first = t0;
                m->t_start_s = (double)(t0 - c.t_run0) * 1e-9;
                char what[96];
                snprintf(what, sizeof what, "turn %zu (line %zu), rep %d", t, turn->line_no, rep + 1);
                st = post_to(&c, a, tern_replay_protocol_path(cfg->protocol), c.body.data, c.body.len, m, what);
                t_last = tern_now_ns();
                if (st != TERN_OK) goto fail;
                m->done = true;
                st = tern_replay_check_usage(m, cfg->arms[a].label);
                if (st != TERN_OK) goto fail;
                char *line = tern_replay_meas_json(run, m);
                if (!line) {
                    st = tern_errorf(TERN_ERR_NOMEM, "out of memory writing turns.jsonl");
                    goto fail;
                }
                fprintf(c.jsonl, "%s\n", line);
                fflush(c.jsonl);
                free(line);
                if (cfg->on_progress) {
                    struct tern_replay_progress pr = {.m = m, .arm_label = cfg->arms[a].label, .n_turns = n_turns,
                                                      .n_reps = cfg->n_reps, .kind = turn->kind};
                    cfg->on_progress(cfg->user, &pr);
                }
                /* The quiet time after this request: tools run after a tool call; a
                 * person answers after a final answer. Nothing runs on either server
                 * meanwhile, so whatever a server does with idle time it does alone. */
                pending_gap = turn->reply && !turn->reply_tool_calls ? cfg->user_gap_s : cfg->gap_s;
            }
            st = check_turn(&c, rep, t);
            if (st != TERN_OK) goto fail;
        }
    }
    resume_all(&c);
    stop_servers(&c);
    run->wall_s = t_last > t_first ? (double)(t_last - t_first) * 1e-9 : 0;
    run->wall_total_s = (double)(tern_now_ns() - c.t_run0) * 1e-9;
    if (fclose(c.jsonl) != 0) {
        c.jsonl = NULL;
        st = tern_errorf(TERN_ERR_IO, "writing turns.jsonl failed: %s", strerror(errno));
        goto fail;
    }
    tern_buf_free(&c.body);
    *out = run;
    return TERN_OK;
fail:
    {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", tern_last_error());
        resume_all(&c); /* a URL arm's server paused by --pause-pids runs again */
        stop_servers(&c);
        if (c.jsonl) fclose(c.jsonl);
        tern_buf_free(&c.body);
        tern_replay_run_free(run);
        return tern_errorf(st, "%s", msg);
    }
}
