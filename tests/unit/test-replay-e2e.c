/* replay end to end against mock OpenAI-compatible servers (test-replay-mock.c): the
 * protocol (interleaving, isolation, identical bytes, think time), every integrity
 * failure, the outputs, and `tern replay` as a command, including the servers it
 * starts itself (this binary stands in for `tern serve` when run as `... serve`) and
 * that none survives the harness: normal end, Ctrl-C, SIGKILL, a server that fails. */
#include "harness.h"
#include "test-replay-mock.h"

#include "replay/replay.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char self_exe[4096];

static void msleep(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A synthetic transcript file in the temp dir; returns its path (static buffer per kind). */
static const char *make_transcript(const char *name, enum tern_synth_kind kind, size_t n, bool strip) {
    static char paths[4][512];
    static int next;
    char *path = paths[next++ % 4];
    snprintf(path, 512, "%s/%s", th_tmpdir(), name);
    struct tern_synth_opts o = {.kind = kind, .n_turns = n, .seed = 3, .strip = strip};
    struct tern_buf b = TERN_BUF_INIT;
    assert_int_equal(tern_synth_transcript(&o, &b), TERN_OK);
    FILE *f = fopen(path, "wb");
    fwrite(b.data, 1, b.len, f);
    fclose(f);
    tern_buf_free(&b);
    return path;
}

static struct tern_replay_transcript *load(const char *path) {
    struct tern_replay_transcript *t = NULL;
    assert_int_equal(tern_transcript_load(path, &t), TERN_OK);
    return t;
}

struct pair {
    struct mock_server *a, *b;
};

static struct pair start_pair(struct mock_opts oa, struct mock_opts ob) {
    struct pair p = {mock_start(&oa, 0), mock_start(&ob, 0)};
    assert_non_null(p.a);
    assert_non_null(p.b);
    return p;
}

static void url_config(struct tern_replay_config *c, struct pair *p, const struct tern_replay_transcript *t,
                       const char *out) {
    tern_replay_config_default(c);
    c->tr = t;
    c->n_reps = 2;
    c->isolate = TERN_ISOLATE_SALT;
    c->n_arms = 2;
    c->timeout_s = 10;
    c->out_dir = out;
    snprintf(c->arms[0].label, sizeof c->arms[0].label, "on");
    snprintf(c->arms[1].label, sizeof c->arms[1].label, "off");
    mock_url(p->a, c->arms[0].url, sizeof c->arms[0].url);
    mock_url(p->b, c->arms[1].url, sizeof c->arms[1].url);
    snprintf(c->arms[0].settings, sizeof c->arms[0].settings, "mock, reuse on");
    snprintf(c->arms[1].settings, sizeof c->arms[1].settings, "mock, reuse off");
}

static int count_lines(const char *path) {
    size_t len = 0;
    char *s = th_read_file(path, &len);
    if (!s) return -1;
    int n = 0;
    for (size_t i = 0; i < len; i++) n += s[i] == '\n';
    free(s);
    return n;
}

static const struct mock_opts on_opts = {.reuse = true, .us_per_token = 3, .fault_at = -1, .comments = true};
static const struct mock_opts off_opts = {.reuse = false, .us_per_token = 3, .fault_at = -1};

/* ---- the protocol, against two in-process mocks --------------------------------------- */

static void test_replay_two_arms(void **state) {
    (void)state;
    const char *tp = make_transcript("agent8.jsonl", TERN_SYNTH_AGENT, 8, false);
    struct tern_replay_transcript *t = load(tp);
    struct pair p = start_pair(on_opts, off_opts);
    char out[512];
    snprintf(out, sizeof out, "%s/out-two/nested", th_tmpdir());
    struct tern_replay_config c;
    url_config(&c, &p, t, out);
    struct tern_replay_run *r = NULL;
    enum tern_status st = tern_replay_run(&c, &r);
    if (st != TERN_OK) fprintf(stderr, "%s\n", tern_last_error());
    assert_int_equal(st, TERN_OK);
    assert_int_equal(r->n_meas, 2 * 8 * 2);
    /* Warm-up + 8 turns per rep on each server. */
    assert_int_equal(mock_n_requests(p.a), 2 * (1 + 8));
    assert_int_equal(mock_n_requests(p.b), 2 * (1 + 8));
    for (int rep = 0; rep < 2; rep++) {
        for (size_t turn = 0; turn < 8; turn++) {
            const struct tern_replay_meas *on = tern_replay_meas_at(r, rep, turn, 0);
            const struct tern_replay_meas *off = tern_replay_meas_at(r, rep, turn, 1);
            assert_true(on->done && off->done);
            assert_string_equal(on->ttft_at, "text");
            assert_true(on->ttft_s > 0 && on->ttft_s <= on->total_s);
            assert_true(on->first_byte_s <= on->ttft_s);
            assert_int_equal(on->prompt_tokens, off->prompt_tokens);
            assert_int_equal(off->cached_tokens, 0);
            /* Reps are isolated by their salt: the cold turn reuses nothing in either rep;
             * later turns reuse the conversation so far. */
            if (turn == 0) assert_int_equal(on->cached_tokens, 0);
            else assert_true(on->cached_tokens > 0);
            assert_true(on->out_hash == off->out_hash);
            assert_true(on->body_hash == off->body_hash);
            assert_non_null(on->reuse_json);
            assert_true(on->n_comments >= 1);
            /* Interleaving: the first arm alternates by turn and rep. */
            bool on_first = on->t_start_s < off->t_start_s;
            assert_true(on_first == ((rep + turn) % 2 == 0));
            /* The bytes each server received, in the order of requests (warm-up first). */
            int idx = rep * 9 + 1 + (int)turn;
            size_t la, lb;
            char *ba = mock_body(p.a, idx, &la), *bb = mock_body(p.b, idx, &lb);
            assert_non_null(ba);
            assert_non_null(bb);
            assert_int_equal(la, lb);
            assert_memory_equal(ba, bb, la);
            /* = the recorded request plus the rep's salt, nothing else. */
            const struct tern_replay_turn *tu = &t->turns[turn];
            assert_int_equal(la, tu->request_len + strlen(",\"cache_salt\":\"tern-replay-\"") + strlen(r->run_id) +
                                     strlen("-repN"));
            assert_memory_equal(ba, tu->request, tu->request_len - 1);
            char salt[128];
            snprintf(salt, sizeof salt, "\"cache_salt\":\"tern-replay-%s-rep%d\"}", r->run_id, rep + 1);
            assert_non_null(strstr(ba, salt));
            free(ba);
            free(bb);
        }
    }
    assert_false(r->isolation_leak);
    struct tern_replay_summary s;
    assert_int_equal(tern_replay_summarize(r, &s), TERN_OK);
    assert_int_equal(s.n_identical, 8);
    /* The on arm reads fewer tokens than the off arm on every later turn. */
    for (size_t turn = 1; turn < 8; turn++) assert_true(s.turns[turn].read[0] < s.turns[turn].read[1]);
    assert_int_equal(tern_replay_write_outputs(r, &s), TERN_OK);
    char path[600];
    snprintf(path, sizeof path, "%s/turns.jsonl", out);
    assert_int_equal(count_lines(path), 32);
    /* Every line is JSON with the fields a reader needs. */
    char *jl = th_read_file(path, NULL);
    json_t *first = json_loadb(jl, strcspn(jl, "\n"), 0, NULL);
    assert_non_null(first);
    static const char *const keys[] = {"rep", "turn", "arm", "kind", "ttft_s", "total_s", "prompt_tokens",
                                       "cached_tokens", "read_tokens", "output_xxh3", "body_xxh3", "tern_reuse"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) assert_non_null(json_object_get(first, keys[i]));
    json_decref(first);
    free(jl);
    snprintf(path, sizeof path, "%s/RESULTS.md", out);
    char *md = th_read_file(path, NULL);
    assert_non_null(md);
    static const char *const parts[] = {"# tern replay: agent8.jsonl", "## By turn class", "| extension |",
                                        "| rewrite |", "| cold |", "sum of per-turn medians", "## Per turn",
                                        "## Wall clock", "## Integrity", "byte-identical across arms and repetitions on 8 of 8 turns",
                                        "**No class of turn left behind.**",
                                        "per-repetition `cache_salt`", "off/on", "**The flat line.**", "machine",
                                        "| reuse tier |", "| prefix / cold |"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (!strstr(md, parts[i])) {
            fprintf(stderr, "RESULTS.md lacks '%s'\n", parts[i]);
            fail();
        }
    }
    free(md);
    snprintf(path, sizeof path, "%s/ttft.svg", out);
    char *svg = th_read_file(path, NULL);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "</svg>"));
    free(svg);
    tern_replay_summary_free(&s);
    tern_replay_run_free(r);
    mock_stop(p.a);
    mock_stop(p.b);
    tern_transcript_free(t);
}

static void test_replay_gap(void **state) {
    (void)state;
    const char *tp = make_transcript("agent6.jsonl", TERN_SYNTH_AGENT, 6, false);
    struct tern_replay_transcript *t = load(tp);
    struct pair p = start_pair(on_opts, off_opts);
    char out[512];
    snprintf(out, sizeof out, "%s/out-gap", th_tmpdir());
    struct tern_replay_config c;
    url_config(&c, &p, t, out);
    c.n_reps = 1;
    c.warmup = false;
    c.gap_s = 0.06;
    c.user_gap_s = 0.02;
    struct tern_replay_run *r = NULL;
    assert_int_equal(tern_replay_run(&c, &r), TERN_OK);
    /* Requests in time order; before each one after the first, the quiet time the
     * previous request's reply calls for, and at least that much time really passed. */
    const struct tern_replay_meas *order[12];
    int n = 0;
    for (size_t turn = 0; turn < 6; turn++) {
        const struct tern_replay_meas *a = tern_replay_meas_at(r, 0, turn, 0), *b = tern_replay_meas_at(r, 0, turn, 1);
        order[n++] = a->t_start_s < b->t_start_s ? a : b;
        order[n++] = a->t_start_s < b->t_start_s ? b : a;
    }
    assert_true(order[0]->gap_before_s == 0);
    for (int i = 1; i < n; i++) {
        const struct tern_replay_turn *prev = &t->turns[order[i - 1]->turn];
        double want = prev->reply_tool_calls ? 0.06 : 0.02;
        assert_true(order[i]->gap_before_s == want);
        assert_true(order[i]->t_start_s - (order[i - 1]->t_start_s + order[i - 1]->total_s) >= want - 1e-3);
    }
    tern_replay_run_free(r);
    mock_stop(p.a);
    mock_stop(p.b);
    tern_transcript_free(t);
}

/* ---- integrity failures ------------------------------------------------------------------ */

static void expect_failure(enum mock_fault fault, int fault_at, bool on_b_only, const char *needle) {
    const char *tp = make_transcript("agent5.jsonl", TERN_SYNTH_AGENT, 5, false);
    struct tern_replay_transcript *t = load(tp);
    struct mock_opts oa = on_opts, ob = off_opts;
    ob.fault = fault;
    ob.fault_at = fault_at;
    if (!on_b_only) {
        oa.fault = fault;
        oa.fault_at = fault_at;
    }
    struct pair p = start_pair(oa, ob);
    char out[512];
    snprintf(out, sizeof out, "%s/out-fault-%d", th_tmpdir(), (int)fault);
    struct tern_replay_config c;
    url_config(&c, &p, t, out);
    c.timeout_s = 0.5;
    struct tern_replay_run *r = NULL;
    enum tern_status st = tern_replay_run(&c, &r);
    assert_int_not_equal(st, TERN_OK);
    assert_null(r);
    if (!strstr(tern_last_error(), needle)) {
        fprintf(stderr, "fault %d: message '%s' lacks '%s'\n", (int)fault, tern_last_error(), needle);
        fail();
    }
    /* What was measured before the failure is kept. */
    char path[600];
    snprintf(path, sizeof path, "%s/turns.jsonl", out);
    int lines = count_lines(path);
    assert_true(lines >= 0);
    mock_stop(p.a);
    mock_stop(p.b);
    tern_transcript_free(t);
}

static void test_integrity_failures(void **state) {
    (void)state;
    /* Request 3 of a server = rep 1, turn 2 (request 0 is the warm-up). */
    expect_failure(MOCK_FAULT_CACHED_GT_PROMPT, 3, true, "turn 2, arm off, rep 1: the server reports");
    expect_failure(MOCK_FAULT_NO_USAGE, 2, true, "turn 1, arm off, rep 1: the response carried no usage");
    expect_failure(MOCK_FAULT_PROMPT_SKEW, 3, true, "turn 2: arm on rep 1 counts");
    expect_failure(MOCK_FAULT_HTTP_500, 1, true, "turn 0 (line 1), rep 1, arm off: HTTP 500 from http://127.0.0.1");
    expect_failure(MOCK_FAULT_NO_FINISH, 2, false, "without a finish_reason or [DONE]");
    expect_failure(MOCK_FAULT_ERROR_EVENT, 2, false, "the server sent an error event: mock engine failure");
    expect_failure(MOCK_FAULT_SILENT, 1, true, "timeout");
    expect_failure(MOCK_FAULT_HTTP_500, 0, true, "warm-up request, arm off: HTTP 500");
}

static void test_refuses_transcript_without_rewrite(void **state) {
    (void)state;
    /* The first turns of an agent session only extend: no rewrite among them. */
    const char *tp = make_transcript("agent12.jsonl", TERN_SYNTH_AGENT, 12, false);
    struct tern_replay_transcript *t = load(tp);
    size_t first_rewrite = 0;
    while (t->turns[first_rewrite].kind != TERN_TURN_REWRITE) first_rewrite++;
    struct pair p = start_pair(on_opts, off_opts);
    char out[512];
    snprintf(out, sizeof out, "%s/out-norewrite", th_tmpdir());
    struct tern_replay_config c;
    url_config(&c, &p, t, out);
    c.n_turns = first_rewrite;
    struct tern_replay_run *r = NULL;
    assert_int_equal(tern_replay_run(&c, &r), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "rewrites its history"));
    assert_int_equal(mock_n_requests(p.a) + mock_n_requests(p.b), 0); /* refused before sending */
    /* With the rewrite turn included it runs. */
    c.n_turns = first_rewrite + 1;
    c.n_reps = 1;
    assert_int_equal(tern_replay_run(&c, &r), TERN_OK);
    tern_replay_run_free(r);
    mock_stop(p.a);
    mock_stop(p.b);
    tern_transcript_free(t);
}

static void test_isolation_leak_and_output_differs(void **state) {
    (void)state;
    const char *tp = make_transcript("agent5b.jsonl", TERN_SYNTH_AGENT, 5, false);
    struct tern_replay_transcript *t = load(tp);
    struct mock_opts oa = on_opts;
    oa.fault = MOCK_FAULT_IGNORE_SALT;
    oa.fault_at = 0;
    struct mock_opts ob = off_opts;
    ob.fault = MOCK_FAULT_OUTPUT_DIFFERS;
    ob.fault_at = 0;
    struct pair p = start_pair(oa, ob);
    char out[512];
    snprintf(out, sizeof out, "%s/out-leak", th_tmpdir());
    struct tern_replay_config c;
    url_config(&c, &p, t, out);
    struct tern_replay_run *r = NULL;
    assert_int_equal(tern_replay_run(&c, &r), TERN_OK);
    assert_true(r->isolation_leak);
    assert_int_equal(r->leak_rep, 1);
    struct tern_replay_summary s;
    assert_int_equal(tern_replay_summarize(r, &s), TERN_OK);
    assert_int_equal(s.n_identical, 0);
    assert_int_equal(tern_replay_write_outputs(r, &s), TERN_OK);
    char path[600];
    snprintf(path, sizeof path, "%s/RESULTS.md", out);
    char *md = th_read_file(path, NULL);
    assert_non_null(strstr(md, "**Warning:** repetition 2's cold turn reported"));
    assert_non_null(strstr(md, "on 0 of 5 turns (differs on turn 0, 1, 2, 3, 4"));
    assert_non_null(strstr(md, "**differs**"));
    free(md);
    tern_replay_summary_free(&s);
    tern_replay_run_free(r);
    mock_stop(p.a);
    mock_stop(p.b);
    tern_transcript_free(t);
}

/* ---- the command ---------------------------------------------------------------------------- */

/* Runs `tern replay args...` with extra environment; returns the exit status; stdout
 * and stderr go to files in the temp dir. If pid_out, returns at once with the pid. */
static int run_tern(char *const args[], char *const env_add[], const char *tag, pid_t *pid_out) {
    char outp[600], errp[600];
    snprintf(outp, sizeof outp, "%s/%s.stdout", th_tmpdir(), tag);
    snprintf(errp, sizeof errp, "%s/%s.stderr", th_tmpdir(), tag);
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)th_tern_bin();
    argv[n++] = "replay";
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int o = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644), e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        for (int i = 0; env_add && env_add[i]; i++) putenv(env_add[i]);
        execv(argv[0], argv);
        _exit(127);
    }
    if (pid_out) {
        *pid_out = pid;
        return 0;
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *slurp_tag(const char *tag, const char *ext) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s.%s", th_tmpdir(), tag, ext);
    char *s = th_read_file(p, NULL);
    return s ? s : strdup("");
}

/* The pids the mock servers wrote into dir. */
static int read_pids(const char *dir, pid_t *pids, int cap) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        if (!strstr(e->d_name, ".pid")) continue;
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        char *s = th_read_file(p, NULL);
        if (s && atoi(s) > 0) pids[n++] = atoi(s);
        free(s);
    }
    closedir(d);
    return n;
}

static bool alive(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

static bool wait_dead(const pid_t *pids, int n, int ms) {
    for (int waited = 0; waited <= ms; waited += 20) {
        bool any = false;
        for (int i = 0; i < n; i++) any |= alive(pids[i]);
        if (!any) return true;
        msleep(20);
    }
    return false;
}

static void test_cli_url_arms(void **state) {
    (void)state;
    const char *tp = make_transcript("cli.jsonl", TERN_SYNTH_AGENT, 6, true);
    struct pair p = start_pair(on_opts, off_opts);
    char ua[64], ub[64], out[600];
    mock_url(p.a, ua, sizeof ua);
    mock_url(p.b, ub, sizeof ub);
    snprintf(out, sizeof out, "%s/cli-out", th_tmpdir());
    char *args[] = {"--transcript", (char *)tp, "--url", ua, "--url-b", ub, "--labels", "tern,other", "--reps", "1",
                    "--out", out, "--max-tokens", "3", NULL};
    int rc = run_tern(args, NULL, "cli", NULL);
    char *so = slurp_tag("cli", "stdout"), *se = slurp_tag("cli", "stderr");
    if (rc != 0) fprintf(stderr, "exit %d\nstdout:\n%s\nstderr:\n%s\n", rc, so, se);
    assert_int_equal(rc, 0);
    /* Progress on stderr, a table and the paths on stdout. */
    assert_non_null(strstr(se, "[rep 1/1] turn   5/6 rewrite   tern TTFT"));
    assert_non_null(strstr(so, "rewrite"));
    assert_non_null(strstr(so, "ttft.svg"));
    char path[700];
    snprintf(path, sizeof path, "%s/turns.jsonl", out);
    assert_int_equal(count_lines(path), 12);
    snprintf(path, sizeof path, "%s/RESULTS.md", out);
    char *md = th_read_file(path, NULL);
    assert_non_null(md);
    assert_non_null(strstr(md, "max_tokens overridden to 3"));
    assert_non_null(strstr(md, "| command | `tern replay --transcript"));
    free(md);
    /* max_tokens went out as 3. */
    char *body = mock_body(p.a, 1, NULL);
    assert_non_null(strstr(body, "\"max_tokens\":3"));
    free(body);
    free(so);
    free(se);
    /* Usage errors: one line, exit 2. */
    char *bad[][8] = {{"--transcript", (char *)tp, NULL},
                      {"--transcript", (char *)tp, "--url", ua, "--model", "x", NULL},
                      {"--transcript", (char *)tp, "--url", ua, "--isolate", "restart", NULL},
                      {"--transcript", (char *)tp, "--url", ua, "--reps", "0", NULL},
                      {"--transcript", (char *)tp, "--url", "https://x", NULL},
                      {"--make-transcript", "chat", "--out", "/dev/null", NULL}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = run_tern(bad[i], NULL, "bad", NULL);
        char *e = slurp_tag("bad", "stderr");
        if (rc != 2 || strchr(e, '\n') != e + strlen(e) - 1) fprintf(stderr, "case %zu: exit %d, '%s'\n", i, rc, e);
        assert_int_equal(rc, 2);
        free(e);
    }
    /* A transcript error is named, exit 1. */
    char tpath[600];
    snprintf(tpath, sizeof tpath, "%s/broken.jsonl", th_tmpdir());
    FILE *f = fopen(tpath, "w");
    fputs("{\"request\":{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}}\n{\"request\":\n", f);
    fclose(f);
    char *args2[] = {"--transcript", tpath, "--url", ua, NULL};
    assert_int_equal(run_tern(args2, NULL, "broken", NULL), 1);
    char *e = slurp_tag("broken", "stderr");
    assert_non_null(strstr(e, "broken.jsonl line 2: invalid JSON"));
    free(e);
    mock_stop(p.a);
    mock_stop(p.b);
}

static void managed_args(char **args, const char *tp, const char *model, const char *out) {
    int n = 0;
    args[n++] = "--transcript";
    args[n++] = (char *)tp;
    args[n++] = "--model";
    args[n++] = (char *)model;
    args[n++] = "--server-bin";
    args[n++] = self_exe;
    args[n++] = "--out";
    args[n++] = (char *)out;
    args[n++] = "--start-timeout";
    args[n++] = "20";
    args[n] = NULL;
}

static void test_cli_managed_servers(void **state) {
    (void)state;
    const char *tp = make_transcript("managed.jsonl", TERN_SYNTH_AGENT, 6, false);
    char model[600], out[600], piddir[600];
    snprintf(model, sizeof model, "%s/model.gguf", th_tmpdir());
    FILE *f = fopen(model, "w");
    fputs("not really a model", f);
    fclose(f);
    snprintf(out, sizeof out, "%s/managed-out", th_tmpdir());
    snprintf(piddir, sizeof piddir, "%s/pids-managed", th_tmpdir());
    mkdir(piddir, 0755);
    static char env_pid[700], env_delay[] = "MOCK_START_DELAY_MS=60";
    snprintf(env_pid, sizeof env_pid, "MOCK_PIDDIR=%s", piddir);
    char *env[] = {env_pid, env_delay, "MOCK_US_PER_TOKEN=2", NULL};
    char *args[32];
    managed_args(args, tp, model, out);
    int n = 0;
    while (args[n]) n++;
    args[n++] = "--reps";
    args[n++] = "2";
    args[n++] = "--server-args";
    args[n++] = "--threads 2 --prompt-cache 4";
    args[n] = NULL;
    int rc = run_tern(args, env, "managed", NULL);
    char *se = slurp_tag("managed", "stderr");
    if (rc != 0) fprintf(stderr, "stderr:\n%s\n", se);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(se, "rep 2 of 2: restarting the servers"));
    free(se);
    /* Restart isolation: 2 reps x 2 arms = 4 distinct server processes, all gone now. */
    pid_t pids[16];
    int np = read_pids(piddir, pids, 16);
    assert_int_equal(np, 4);
    assert_true(wait_dead(pids, np, 0));
    /* The off arm got the switches, the on arm none; both got --server-args. */
    DIR *d = opendir(piddir);
    struct dirent *e;
    int n_on = 0, n_off = 0;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".args")) continue;
        char pth[1200];
        snprintf(pth, sizeof pth, "%s/%s", piddir, e->d_name);
        char *a = th_read_file(pth, NULL);
        assert_non_null(strstr(a, " serve --model "));
        assert_non_null(strstr(a, "--host 127.0.0.1 --port "));
        assert_non_null(strstr(a, "--threads 2 --prompt-cache 4"));
        if (strstr(a, "reuse=1")) {
            n_on++;
            assert_null(strstr(a, "--prompt-cache 0"));
            assert_non_null(strstr(a, "TERN_REUSE_POOL=\n"));
        } else {
            n_off++;
            assert_non_null(strstr(a, "--prompt-cache 4 --prompt-cache 0"));
            assert_non_null(strstr(a, "TERN_AFFINITY=0\nTERN_REUSE_POOL=0\nTERN_PREDICT=0"));
        }
        free(a);
    }
    closedir(d);
    assert_int_equal(n_on, 2);
    assert_int_equal(n_off, 2);
    /* The measurements: the on arm reuses, the off arm does not, cold turns never. */
    char path[700];
    snprintf(path, sizeof path, "%s/turns.jsonl", out);
    char *jl = th_read_file(path, NULL);
    int lines = 0;
    for (char *l = jl; l && *l; l = strchr(l, '\n') + 1) {
        json_t *j = json_loadb(l, strcspn(l, "\n"), 0, NULL);
        assert_non_null(j);
        long turn = (long)json_integer_value(json_object_get(j, "turn"));
        long cached = (long)json_integer_value(json_object_get(j, "cached_tokens"));
        const char *arm = json_string_value(json_object_get(j, "arm"));
        if (turn == 0 || !strcmp(arm, "off")) assert_int_equal(cached, 0);
        else assert_true(cached > 0);
        json_decref(j);
        lines++;
        if (!strchr(l, '\n')) break;
    }
    assert_int_equal(lines, 24);
    free(jl);
    snprintf(path, sizeof path, "%s/server-off.log", out);
    char *log = th_read_file(path, NULL);
    assert_non_null(strstr(log, "reuse off"));
    free(log);
    snprintf(path, sizeof path, "%s/RESULTS.md", out);
    char *md = th_read_file(path, NULL);
    assert_non_null(strstr(md, "fresh server processes for every repetition"));
    assert_non_null(strstr(md, "TERN_AFFINITY=0 TERN_REUSE_POOL=0 TERN_PREDICT=0"));
    assert_non_null(strstr(md, "mock-reuse-on"));
    free(md);
}

/* --arms on,nopredict: both arms reuse; only the nopredict arm gets TERN_PREDICT=0. */
static void test_cli_managed_nopredict_arm(void **state) {
    (void)state;
    const char *tp = make_transcript("nopredict.jsonl", TERN_SYNTH_AGENT, 6, false);
    char model[600], out[600], piddir[600];
    snprintf(model, sizeof model, "%s/model.gguf", th_tmpdir());
    FILE *f = fopen(model, "w");
    fputs("not really a model", f);
    fclose(f);
    snprintf(out, sizeof out, "%s/nopredict-out", th_tmpdir());
    snprintf(piddir, sizeof piddir, "%s/pids-nopredict", th_tmpdir());
    mkdir(piddir, 0755);
    static char env_pid[700];
    snprintf(env_pid, sizeof env_pid, "MOCK_PIDDIR=%s", piddir);
    char *env[] = {env_pid, "MOCK_US_PER_TOKEN=2", NULL};
    char *args[32];
    managed_args(args, tp, model, out);
    int n = 0;
    while (args[n]) n++;
    args[n++] = "--reps";
    args[n++] = "1";
    args[n++] = "--arms";
    args[n++] = "on,nopredict";
    args[n] = NULL;
    int rc = run_tern(args, env, "nopredict", NULL);
    char *se = slurp_tag("nopredict", "stderr");
    if (rc != 0) fprintf(stderr, "stderr:\n%s\n", se);
    assert_int_equal(rc, 0);
    free(se);
    DIR *d = opendir(piddir);
    struct dirent *e;
    int n_on = 0, n_nopredict = 0;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".args")) continue;
        char pth[1200];
        snprintf(pth, sizeof pth, "%s/%s", piddir, e->d_name);
        char *a = th_read_file(pth, NULL);
        assert_non_null(strstr(a, "reuse=1"));
        assert_null(strstr(a, "--prompt-cache 0"));
        assert_non_null(strstr(a, "TERN_AFFINITY=\nTERN_REUSE_POOL=\n"));
        if (strstr(a, "TERN_PREDICT=0\n")) n_nopredict++;
        else if (strstr(a, "TERN_PREDICT=\n")) n_on++;
        free(a);
    }
    closedir(d);
    assert_int_equal(n_on, 1);
    assert_int_equal(n_nopredict, 1);
    char path[700];
    snprintf(path, sizeof path, "%s/RESULTS.md", out);
    char *md = th_read_file(path, NULL);
    assert_non_null(strstr(md, "predictive priming off"));
    assert_non_null(strstr(md, "`nopredict`"));
    assert_non_null(strstr(md, "paused (SIGSTOP)"));
    free(md);
    /* The arms took turns: at every measured request the other server was stopped. */
    int n_req = 0;
    for (int arm = 0; arm < 2; arm++) {
        snprintf(path, sizeof path, "%s/server-%s.log", out, arm ? "nopredict" : "on");
        char *log = th_read_file(path, NULL);
        assert_non_null(log);
        assert_null(strstr(log, "peers running 1"));
        for (const char *q = log; (q = strstr(q, "peers running 0 stopped 1")); q++) n_req++;
        free(log);
    }
    assert_int_equal(n_req, 12); /* 6 turns x 2 arms */
    /* An unknown arm name is a usage error naming the choices. */
    char *bad[32];
    managed_args(bad, tp, model, out);
    n = 0;
    while (bad[n]) n++;
    bad[n++] = "--arms";
    bad[n++] = "on,maybe";
    bad[n] = NULL;
    assert_int_equal(run_tern(bad, NULL, "badarm", NULL), 2);
    se = slurp_tag("badarm", "stderr");
    assert_non_null(strstr(se, "'nopredict'"));
    free(se);
}

/* Interrupted runs leave no server behind: Ctrl-C (SIGINT) and SIGKILL of the harness. */
static void interrupted(int sig, const char *tag) {
    const char *tp = make_transcript("slow.jsonl", TERN_SYNTH_AGENT, 10, false);
    char model[600], out[600], piddir[600];
    snprintf(model, sizeof model, "%s/model.gguf", th_tmpdir());
    FILE *f = fopen(model, "w");
    fputs("x", f);
    fclose(f);
    snprintf(out, sizeof out, "%s/%s-out", th_tmpdir(), tag);
    snprintf(piddir, sizeof piddir, "%s/pids-%s", th_tmpdir(), tag);
    mkdir(piddir, 0755);
    static char env_pid[2][700];
    char *env_pid_s = env_pid[sig == SIGKILL];
    snprintf(env_pid_s, 700, "MOCK_PIDDIR=%s", piddir);
    char *env[] = {env_pid_s, "MOCK_US_PER_TOKEN=400", NULL};
    char *args[32];
    managed_args(args, tp, model, out);
    int n = 0;
    while (args[n]) n++;
    args[n++] = "--gap";
    args[n++] = "1";
    args[n] = NULL;
    pid_t harness;
    run_tern(args, env, tag, &harness);
    /* Wait until both servers are up and a request is under way. */
    pid_t pids[8];
    int np = 0;
    for (int i = 0; i < 500 && np < 2; i++) {
        msleep(20);
        np = read_pids(piddir, pids, 8);
    }
    assert_int_equal(np, 2);
    msleep(300);
    kill(harness, sig);
    int st;
    waitpid(harness, &st, 0);
    if (sig == SIGINT) {
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 130);
        char *se = slurp_tag(tag, "stderr");
        assert_non_null(strstr(se, "interrupted; servers stopped"));
        free(se);
        assert_true(wait_dead(pids, np, 0)); /* stopped and reaped before the harness exited */
    } else {
        assert_true(WIFSIGNALED(st));
        /* The kernel sends each server SIGTERM when its parent dies. */
        assert_true(wait_dead(pids, np, 10000));
    }
}

static void test_cli_ctrl_c_and_kill_leave_no_server(void **state) {
    (void)state;
    interrupted(SIGINT, "sigint");
    interrupted(SIGKILL, "sigkill");
}

/* --demo: the managed servers get no --model (the server's built-in demo); one arm. */
static void test_cli_demo_one_arm(void **state) {
    (void)state;
    const char *tp = make_transcript("demo.jsonl", TERN_SYNTH_AGENT, 5, false);
    char out[600], piddir[600];
    snprintf(out, sizeof out, "%s/demo-out", th_tmpdir());
    snprintf(piddir, sizeof piddir, "%s/pids-demo", th_tmpdir());
    mkdir(piddir, 0755);
    static char env_pid[700];
    snprintf(env_pid, sizeof env_pid, "MOCK_PIDDIR=%s", piddir);
    /* And the first server start loses its port to another process: a new port is tried. */
    static char env_taken[700], flag[600];
    snprintf(flag, sizeof flag, "%s/port-taken-flag", th_tmpdir());
    FILE *ff = fopen(flag, "w");
    fclose(ff);
    snprintf(env_taken, sizeof env_taken, "MOCK_PORT_TAKEN_ONCE=%s", flag);
    char *env[] = {env_pid, "MOCK_US_PER_TOKEN=1", env_taken, NULL};
    char *args[] = {"--transcript", (char *)tp, "--demo", "--arms", "on", "--server-bin", self_exe, "--reps", "1",
                    "--out", out, NULL};
    assert_int_equal(run_tern(args, env, "demo", NULL), 0);
    char *se = slurp_tag("demo", "stderr");
    assert_non_null(strstr(se, "was taken before server 'on' bound it; trying another"));
    free(se);
    DIR *d = opendir(piddir);
    struct dirent *e;
    int n_args = 0;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".args")) continue;
        char pth[1200];
        snprintf(pth, sizeof pth, "%s/%s", piddir, e->d_name);
        char *a = th_read_file(pth, NULL);
        assert_null(strstr(a, "--model"));
        assert_non_null(strstr(a, "reuse=1"));
        free(a);
        n_args++;
    }
    closedir(d);
    assert_int_equal(n_args, 1);
    char path[700];
    snprintf(path, sizeof path, "%s/RESULTS.md", out);
    char *md = th_read_file(path, NULL);
    assert_non_null(strstr(md, "the built-in demo model of `tern serve`"));
    assert_null(strstr(md, "| on/"));
    free(md);
    snprintf(path, sizeof path, "%s/turns.jsonl", out);
    assert_int_equal(count_lines(path), 5);
}

static void test_cli_server_fails_to_start(void **state) {
    (void)state;
    const char *tp = make_transcript("fail.jsonl", TERN_SYNTH_AGENT, 6, false);
    char model[600], out[600];
    snprintf(model, sizeof model, "%s/model.gguf", th_tmpdir());
    FILE *f = fopen(model, "w");
    fputs("x", f);
    fclose(f);
    snprintf(out, sizeof out, "%s/fail-out", th_tmpdir());
    char *env[] = {"MOCK_EXIT_AT_START=1", NULL};
    char *args[32];
    managed_args(args, tp, model, out);
    assert_int_equal(run_tern(args, env, "fail", NULL), 1);
    char *se = slurp_tag("fail", "stderr");
    assert_non_null(strstr(se, "arm on: server"));
    assert_non_null(strstr(se, "exited with status 3 before it was ready"));
    assert_non_null(strstr(se, "cannot load model"));
    free(se);
    /* A missing model is named before anything starts. */
    char *args2[32];
    managed_args(args2, tp, "/nonexistent/m.gguf", out);
    assert_int_equal(run_tern(args2, NULL, "nomodel", NULL), 1);
    se = slurp_tag("nomodel", "stderr");
    assert_non_null(strstr(se, "cannot read model '/nonexistent/m.gguf'"));
    free(se);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "serve")) return mock_serve_main(argc, argv);
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n > 0) self_exe[n] = 0;
    signal(SIGPIPE, SIG_IGN);
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_two_arms),
        cmocka_unit_test(test_replay_gap),
        cmocka_unit_test(test_integrity_failures),
        cmocka_unit_test(test_refuses_transcript_without_rewrite),
        cmocka_unit_test(test_isolation_leak_and_output_differs),
        cmocka_unit_test(test_cli_url_arms),
        cmocka_unit_test(test_cli_managed_servers),
        cmocka_unit_test(test_cli_managed_nopredict_arm),
        cmocka_unit_test(test_cli_ctrl_c_and_kill_leave_no_server),
        cmocka_unit_test(test_cli_demo_one_arm),
        cmocka_unit_test(test_cli_server_fails_to_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
