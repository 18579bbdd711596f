/* cache: the disk tier's writer thread, driven the way the engine worker drives the
 * cache (acquire -> prime -> release). The write of a parked conversation runs on the
 * cache's own thread while the entry is pinned: a restart restores exactly the state a
 * cold run reaches; a request for the conversation that comes while its write is in
 * flight waits for it (or, told not to wait, leaves it alone) and resumes the right
 * state; the budget leaves a pinned entry alone and a removal defers its free to the
 * writer; cache_free finishes queued writes; a failing write is logged once and keeps
 * the conversation in RAM. Runs under ThreadSanitizer too (label tsan). */
#include "harness.h"

#include "cache/cache.h"
#include "cache/disk.h"
#include "util/mem.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N_TOK 300u
#define N_EXT 24u

struct fixture {
    const char *arch;
    char path[512];
    struct tern_model *m;
    int32_t toks[N_TOK + 4 * N_EXT];
};

static struct fixture fx_q3 = {.arch = "tiny-qwen3"};
static struct fixture fx_q35 = {.arch = "tiny-qwen35"};

static int fixture_setup(struct fixture *f) {
    snprintf(f->path, sizeof f->path, "%s/%s.gguf", th_tmpdir(), f->arch);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' mkmodel --preset %s --n-layer 4 --out '%s' >/dev/null", th_tern_bin(), f->arch,
             f->path);
    if (system(cmd) != 0) return -1;
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = f->path;
    mp.n_threads = 2;
    if (tern_model_load(&mp, &f->m) != TERN_OK) return -1;
    uint32_t n_vocab = tern_model_info(f->m)->n_vocab;
    for (uint32_t i = 0; i < TERN_ARRAY_LEN(f->toks); i++) f->toks[i] = (int32_t)((i * 2654435761u + 17) % n_vocab);
    return 0;
}

static int setup_q3(void **state) {
    *state = &fx_q3;
    return fx_q3.m ? 0 : fixture_setup(&fx_q3);
}
static int setup_q35(void **state) {
    *state = &fx_q35;
    return fx_q35.m ? 0 : fixture_setup(&fx_q35);
}

static void params(struct cache_params *p, const char *dir, size_t ram) {
    memset(p, 0, sizeof *p);
    tern_session_params_default(&p->session);
    p->session.n_ctx = 2048;
    p->session.n_chunk = 64;
    p->ram_bytes = ram;
    p->max_ckpts = 8;
    p->ckpt_every = 64;
    p->turn_token = -1;
    p->pool = true;
    p->disk_dir = dir;
    p->disk_bytes = 1ull << 30;
}

static struct cache *open_cache(struct fixture *f, const char *dir, size_t ram) {
    struct cache_params p;
    params(&p, dir, ram);
    struct cache *c = NULL;
    if (cache_new(f->m, &p, &c)) fail_msg("cache_new %s: %s", dir ? dir : "-", tern_last_error());
    return c;
}

static void fresh_dir(char *out, size_t cap, const struct fixture *f, const char *name) {
    snprintf(out, cap, "%s/dw-%s-%s", th_tmpdir(), name, f->arch);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    assert_int_equal(system(cmd), 0);
}

/* (memoized: ThreadSanitizer makes every eval slow) */
static uint64_t cold_hash(struct fixture *f, const int32_t *toks, uint32_t n) {
    static struct memo {
        const struct fixture *f;
        const int32_t *toks;
        uint32_t n;
        uint64_t h;
    } memo[32];
    static size_t n_memo;
    for (size_t i = 0; i < n_memo; i++)
        if (memo[i].f == f && memo[i].toks == toks && memo[i].n == n) return memo[i].h;
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.n_ctx = 2048;
    sp.n_chunk = 64;
    struct tern_session *s;
    assert_int_equal(tern_session_new(f->m, &sp, &s), TERN_OK);
    assert_int_equal(tern_session_eval(s, toks, n, NULL), TERN_OK);
    uint64_t h = tern_session_hash(s);
    tern_session_free(s);
    if (n_memo < TERN_ARRAY_LEN(memo)) memo[n_memo++] = (struct memo){f, toks, n, h};
    return h;
}

/* One request as the worker runs it, split where the tests act between its steps. */
static void begin(struct cache *c, const char *key, const int32_t *toks, uint32_t n, unsigned flags,
                  struct cache_lease *l) {
    struct cache_ident id = {.tenant = "t", .key = key};
    assert_int_equal(cache_acquire_flags(c, &id, toks, n, flags, l), TERN_OK);
    assert_int_equal(tern_session_n_past(l->session), l->decision.cached);
    assert_memory_equal(tern_session_tokens(l->session), toks, l->decision.cached * sizeof(int32_t));
}

/* Primes the rest of the prompt; returns the final state hash (then released). */
static uint64_t finish(struct cache *c, const int32_t *toks, uint32_t n, struct cache_lease *l) {
    struct tern_eval_opts o = {.n_chunk = 64, .user = l, .ckpt_pos = l->ckpt_pos, .n_ckpt = l->n_ckpt,
                               .on_ckpt = cache_on_checkpoint};
    assert_int_equal(tern_session_eval(l->session, toks + l->decision.cached, n - l->decision.cached, &o), TERN_OK);
    uint64_t h = tern_session_hash(l->session);
    assert_int_equal(cache_announce(c, l), TERN_OK); /* as the engine does before the last byte */
    cache_release(c, l, true);
    return h;
}

static uint64_t request(struct cache *c, const char *key, const int32_t *toks, uint32_t n, struct cache_decision *d) {
    struct cache_lease l;
    begin(c, key, toks, n, 0, &l);
    if (d) *d = l.decision;
    return finish(c, toks, n, &l);
}

static struct cache_stats stats(struct cache *c) {
    struct cache_stats st;
    cache_get_stats(c, &st);
    return st;
}

static size_t files_like(const char *dir, bool (*like)(const char *name)) {
    DIR *dd = opendir(dir);
    if (!dd) return 0;
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(dd))) n += like(de->d_name);
    closedir(dd);
    return n;
}

static bool is_tmp(const char *name) { return !strncmp(name, ".tmp-", 5); }
static bool is_marker(const char *name) {
    size_t n = strlen(name);
    return n > 4 && !strcmp(name + n - 4, ".wip");
}
static size_t tmp_files(const char *dir) { return files_like(dir, is_tmp); }

struct release_later {
    struct cache *c;
    unsigned ms;
};

static void *unhold_after(void *arg) {
    struct release_later *r = arg;
    struct timespec ts = {r->ms / 1000, (long)(r->ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    cache_test_hold_writes(r->c, false);
    return NULL;
}

/* Written by the writer thread; a restart restores the cold run's state at its end. */
static void test_async_roundtrip(void **state) {
    struct fixture *f = *state;
    char dir[600];
    fresh_dir(dir, sizeof dir, f, "rt");
    struct cache *c = open_cache(f, dir, (size_t)1 << 30);
    request(c, "k", f->toks, N_TOK, NULL);
    cache_flush(c);
    assert_int_equal(stats(c).disk_writes, 1);
    assert_int_equal(stats(c).disk_write_errors, 0);
    cache_free(c);
    c = open_cache(f, dir, (size_t)1 << 30);
    struct cache_lease l;
    begin(c, "k", f->toks, N_TOK + N_EXT, 0, &l);
    assert_int_equal(l.decision.tier, CACHE_TIER_DISK);
    assert_int_equal(l.decision.cached, N_TOK);
    assert_true(tern_session_hash(l.session) == cold_hash(f, f->toks, N_TOK));
    assert_true(finish(c, f->toks, N_TOK + N_EXT, &l) == cold_hash(f, f->toks, N_TOK + N_EXT));
    cache_free(c);
    assert_int_equal(tmp_files(dir), 0);
}

/* The next turn comes while the previous turn's write is in flight: it waits for the
 * write and resumes the live state; told not to wait, it leaves the conversation alone
 * (here: resumes the previous turn's file), and the RAM copy it replaced is freed by the
 * writer when its write is done. */
static void test_resume_waits(void **state) {
    struct fixture *f = *state;
    char dir[600];
    fresh_dir(dir, sizeof dir, f, "wait");
    struct cache *c = open_cache(f, dir, (size_t)1 << 30);
    cache_test_hold_writes(c, true);
    request(c, "k", f->toks, N_TOK, NULL);
    struct cache_ident id = {.tenant = "t", .key = "k"};
    const uint32_t n2 = N_TOK + N_EXT;
    assert_true(cache_write_pending(c, &id, f->toks, n2, NULL));
    assert_false(cache_write_pending(c, &(struct cache_ident){.tenant = "t", .key = "other"}, f->toks, n2, NULL));
    assert_int_equal(stats(c).disk_writes, 0);
    pthread_t th;
    struct release_later rl = {c, 300};
    assert_int_equal(pthread_create(&th, NULL, unhold_after, &rl), 0);
    struct cache_lease l;
    begin(c, "k", f->toks, n2, 0, &l); /* waits for the write */
    assert_int_equal(stats(c).disk_writes, 1);
    assert_int_equal(l.decision.tier, CACHE_TIER_LIVE);
    assert_int_equal(l.decision.cached, N_TOK);
    assert_true(tern_session_hash(l.session) == cold_hash(f, f->toks, N_TOK));
    assert_true(finish(c, f->toks, n2, &l) == cold_hash(f, f->toks, n2));
    pthread_join(th, NULL);
    cache_flush(c);
    assert_int_equal(stats(c).disk_writes, 2);

    /* not waiting: the pinned RAM entry is skipped; the file of the turn before offers
     * n2; the RAM entry gives way to it (removed while pinned: freed by the writer) */
    cache_test_hold_writes(c, true);
    const uint32_t n3 = n2 + N_EXT, n4 = n3 + N_EXT;
    request(c, "k", f->toks, n3, NULL); /* from RAM (live), parked and pinned */
    assert_true(cache_write_pending(c, &id, f->toks, n4, NULL));
    begin(c, "k", f->toks, n4, CACHE_ACQUIRE_NOWAIT, &l);
    assert_int_equal(l.decision.tier, CACHE_TIER_DISK);
    assert_int_equal(l.decision.cached, n2);
    assert_int_equal(stats(c).n_sessions, 1); /* the pinned copy is out of the pool */
    cache_test_hold_writes(c, false);
    assert_true(finish(c, f->toks, n4, &l) == cold_hash(f, f->toks, n4));
    cache_flush(c);
    assert_int_equal(stats(c).disk_writes, 4);
    assert_int_equal(stats(c).disk_write_errors, 0);
    cache_free(c);
    /* the last write (n4) is the file */
    c = open_cache(f, dir, (size_t)1 << 30);
    struct cache_decision d;
    assert_true(request(c, "k", f->toks, n4 + N_EXT, &d) == cold_hash(f, f->toks, n4 + N_EXT));
    assert_int_equal(d.tier, CACHE_TIER_DISK);
    assert_int_equal(d.cached, n4);
    cache_free(c);
}

/* The budget leaves a pinned entry (and its checkpoints) alone, and evicts it once the
 * write is done; a prediction forks from a pinned entry (a read), and the request that
 * uses it removes the pinned entry, whose free waits for the writer (ASan: no leak, no
 * use after free). */
static void test_evict_pinned(void **state) {
    struct fixture *f = *state;
    char dir[600];
    fresh_dir(dir, sizeof dir, f, "evict");
    /* one conversation's bytes, to size the budget at one and a half */
    struct cache *c = open_cache(f, NULL, (size_t)1 << 30);
    request(c, "a", f->toks, N_TOK, NULL);
    const size_t one = stats(c).pool_bytes;
    cache_free(c);
    c = open_cache(f, dir, one * 3 / 2);
    cache_test_hold_writes(c, true);
    request(c, "a", f->toks, N_TOK, NULL);
    request(c, "b", f->toks + N_EXT, N_TOK, NULL); /* over the budget: a is pinned, b too */
    struct cache_stats st = stats(c);
    assert_int_equal(st.n_sessions, 2);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.ckpt_evictions, 0);
    cache_test_hold_writes(c, false);
    cache_flush(c);
    cache_fit(c);
    st = stats(c);
    assert_int_equal(st.disk_writes, 2);
    assert_int_equal(st.evictions, 1); /* a: already on disk, not written again */
    assert_int_equal(st.n_sessions, 1);
    struct cache_decision d;
    assert_true(request(c, "a", f->toks, N_TOK + N_EXT, &d) == cold_hash(f, f->toks, N_TOK + N_EXT));
    assert_int_equal(d.tier, CACHE_TIER_DISK);
    cache_flush(c);
    cache_free(c);

    /* a prediction forked from a pinned entry; the request that uses it drops the entry */
    fresh_dir(dir, sizeof dir, f, "evict2");
    c = open_cache(f, dir, (size_t)1 << 30);
    cache_test_hold_writes(c, true);
    request(c, "p", f->toks, N_TOK, NULL);
    struct cache_ident id = {.tenant = "t", .key = "p"};
    struct cache_lease l;
    const uint32_t np = N_TOK + N_EXT;
    assert_int_equal(cache_predict_begin(c, &id, f->toks, np, NULL, 0, &l), TERN_OK);
    assert_int_equal(l.decision.cached, N_TOK);
    struct tern_eval_opts o = {.n_chunk = 64, .user = &l, .ckpt_pos = l.ckpt_pos, .n_ckpt = l.n_ckpt,
                               .on_ckpt = cache_on_checkpoint};
    assert_int_equal(tern_session_eval(l.session, f->toks + N_TOK, N_EXT, &o), TERN_OK);
    cache_predict_end(c, &l, true);
    assert_int_equal(stats(c).n_sessions, 2);
    assert_true(request(c, "p", f->toks, np + N_EXT, &d) == cold_hash(f, f->toks, np + N_EXT));
    assert_int_equal(d.tier, CACHE_TIER_PREDICTED);
    assert_int_equal(stats(c).n_sessions, 1); /* the pinned entry left the pool */
    cache_test_hold_writes(c, false);
    cache_flush(c);
    assert_int_equal(stats(c).disk_writes, 2);
    cache_free(c);
}

/* cache_free with writes queued (held) and one slowed block by block: they finish, the
 * files restore exactly, no temporary file is left. */
static void test_shutdown_inflight(void **state) {
    struct fixture *f = *state;
    char dir[600];
    fresh_dir(dir, sizeof dir, f, "stop");
    setenv("TERN_TEST_DISK_DELAY_MS", "20", 1);
    struct cache *c = open_cache(f, dir, (size_t)1 << 30);
    unsetenv("TERN_TEST_DISK_DELAY_MS");
    request(c, "x", f->toks, N_TOK, NULL);
    cache_test_hold_writes(c, true);
    request(c, "y", f->toks + N_EXT, N_TOK, NULL);
    assert_true(stats(c).disk_writes < 2);
    cache_free(c);
    assert_int_equal(tmp_files(dir), 0);
    c = open_cache(f, dir, (size_t)1 << 30);
    assert_int_equal(stats(c).disk_entries, 2);
    struct cache_decision d;
    assert_true(request(c, "x", f->toks, N_TOK + N_EXT, &d) == cold_hash(f, f->toks, N_TOK + N_EXT));
    assert_int_equal(d.tier, CACHE_TIER_DISK);
    assert_true(request(c, "y", f->toks + N_EXT, N_TOK + N_EXT, &d) == cold_hash(f, f->toks + N_EXT, N_TOK + N_EXT));
    assert_int_equal(d.tier, CACHE_TIER_DISK);
    cache_free(c);
}

static atomic_int n_ram_only, n_writes_again;

static void count_log(enum tern_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == TERN_LOG_WARN && strstr(msg, "stays in RAM only")) atomic_fetch_add(&n_ram_only, 1);
    if (strstr(msg, "the disk tier writes again")) atomic_fetch_add(&n_writes_again, 1);
    fprintf(stderr, "tern: %s\n", msg);
}

static void file_limit(rlim_t bytes) {
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &rl), 0);
    rl.rlim_cur = bytes == RLIM_INFINITY ? rl.rlim_max : bytes;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &rl), 0);
}

/* Writes that fail (a file size limit: EFBIG, as a full disk fails them; root ignores a
 * read-only mode): logged once until one succeeds, counted, temporary files removed,
 * the conversation served from RAM. */
static void test_write_fails(void **state) {
    struct fixture *f = *state;
    char dir[600];
    fresh_dir(dir, sizeof dir, f, "fail");
    struct cache *c = open_cache(f, dir, (size_t)1 << 30);
    tern_log_set_hook(count_log, NULL);
    signal(SIGXFSZ, SIG_IGN);
    file_limit(4096);
    request(c, "k1", f->toks, N_TOK, NULL);
    request(c, "k2", f->toks + N_EXT, N_TOK, NULL);
    cache_flush(c);
    struct cache_stats st = stats(c);
    assert_int_equal(st.disk_write_errors, 2);
    assert_int_equal(st.disk_writes, 0);
    assert_int_equal(atomic_load(&n_ram_only), 1);
    assert_int_equal(tmp_files(dir), 0);
    /* still in RAM: the next turn resumes live */
    struct cache_decision d;
    assert_true(request(c, "k1", f->toks, N_TOK + N_EXT, &d) == cold_hash(f, f->toks, N_TOK + N_EXT));
    assert_int_equal(d.tier, CACHE_TIER_LIVE);
    cache_flush(c);
    assert_int_equal(stats(c).disk_write_errors, 3);
    assert_int_equal(atomic_load(&n_ram_only), 1);
    file_limit(RLIM_INFINITY);
    request(c, "k2", f->toks + N_EXT, N_TOK + N_EXT, NULL);
    cache_flush(c);
    st = stats(c);
    assert_int_equal(st.disk_writes, 1);
    assert_int_equal(st.disk_write_errors, 3);
    assert_int_equal(atomic_load(&n_writes_again), 1);
    cache_free(c);
    tern_log_set_hook(NULL, NULL);
    signal(SIGXFSZ, SIG_DFL);
}

/* The queue full (4 writes held): the fifth conversation is written by the caller, at
 * once; the held ones follow. */
static void test_queue_full(void **state) {
    struct fixture *f = *state;
    char dir[600];
    fresh_dir(dir, sizeof dir, f, "full");
    struct cache *c = open_cache(f, dir, (size_t)1 << 30);
    cache_test_hold_writes(c, true);
    const char *keys[] = {"q0", "q1", "q2", "q3", "q4"};
    for (int i = 0; i < 4; i++) request(c, keys[i], f->toks + i, N_TOK, NULL);
    assert_int_equal(stats(c).disk_writes, 0);
    request(c, keys[4], f->toks + 4, N_TOK, NULL);
    assert_int_equal(stats(c).disk_writes, 1);
    cache_test_hold_writes(c, false);
    cache_flush(c);
    assert_int_equal(stats(c).disk_writes, 5);
    assert_int_equal(stats(c).disk_entries, 5);
    cache_free(c);
}

/* TERN_DISK_WRITER=0 (the rollback): written by the caller, before cache_release
 * returns, with the same file. */
static void test_rollback_switch(void **state) {
    struct fixture *f = *state;
    char dir[600];
    fresh_dir(dir, sizeof dir, f, "sync");
    setenv("TERN_DISK_WRITER", "0", 1);
    struct cache *c = open_cache(f, dir, (size_t)1 << 30);
    unsetenv("TERN_DISK_WRITER");
    cache_test_hold_writes(c, true); /* no writer to hold */
    request(c, "k", f->toks, N_TOK, NULL);
    assert_int_equal(stats(c).disk_writes, 1);
    struct cache_ident id = {.tenant = "t", .key = "k"};
    assert_false(cache_write_pending(c, &id, f->toks, N_TOK + N_EXT, NULL));
    cache_free(c);
    c = open_cache(f, dir, (size_t)1 << 30);
    struct cache_decision d;
    assert_true(request(c, "k", f->toks, N_TOK + N_EXT, &d) == cold_hash(f, f->toks, N_TOK + N_EXT));
    assert_int_equal(d.tier, CACHE_TIER_DISK);
    cache_free(c);
}

/* Two replicas on one directory, the next turn at once on the peer: A's write of turn 2
 * is announced before its response's end and held in flight; B, whose best is turn 1's
 * file, sees that waiting would save it turn 2's tokens, waits (polling, as the engine
 * does) until the write lands, and resumes turn 2's end from the file: the cold state.
 * A writer that dies mid-write (a child process announces, then SIGKILL) leaves a marker
 * that no one waits for, and that the next look removes. */
static void test_peer_write_in_flight(void **state) {
    struct fixture *f = *state;
    char dir[600];
    fresh_dir(dir, sizeof dir, f, "peer");
    struct cache *a = open_cache(f, dir, (size_t)1 << 30);
    struct cache *b = open_cache(f, dir, (size_t)1 << 30);
    const struct cache_ident id = {.tenant = "t", .key = "k"};
    const uint32_t n2 = N_TOK + N_EXT, n3 = n2 + N_EXT, n4 = n3 + N_EXT;
    struct cache_wait w;
    request(a, "k", f->toks, N_TOK, NULL);
    cache_flush(a);
    assert_false(cache_write_pending(b, &id, f->toks, n2, &w)); /* nothing in flight: turn 1's file */
    cache_test_hold_writes(a, true);
    request(a, "k", f->toks, n2, NULL); /* announced and queued, not written */
    assert_int_equal(files_like(dir, is_marker), 1);
    assert_true(cache_write_pending(b, &id, f->toks, n3, &w));
    assert_true(w.peer);
    assert_int_equal(w.gain, n2 - N_TOK);
    assert_false(cache_write_pending(b, &(struct cache_ident){.tenant = "t", .key = "other"}, f->toks, n3, &w));
    assert_false(cache_write_pending(b, &(struct cache_ident){.tenant = "u", .key = "k"}, f->toks, n3, &w));
    /* the prompt leaves turn 2 three tokens after turn 1's end: a hybrid resumes the
     * version in flight only at its end (nothing to wait for); an attention-only model
     * at any position (3 tokens to gain, which the caller weighs against the wait) */
    int32_t other[N_TOK + N_EXT];
    memcpy(other, f->toks, sizeof other);
    other[N_TOK + 3] ^= 1;
    if (tern_model_info(f->m)->hybrid) {
        assert_false(cache_write_pending(b, &id, other, n2, &w));
    } else {
        assert_true(cache_write_pending(b, &id, other, n2, &w));
        assert_int_equal(w.gain, 3);
    }
    pthread_t th;
    struct release_later rl = {a, 300};
    assert_int_equal(pthread_create(&th, NULL, unhold_after, &rl), 0);
    int polls = 0;
    while (cache_write_pending(b, &id, f->toks, n3, &w)) {
        assert_true(++polls < 3000); /* 30 s */
        nanosleep(&(struct timespec){0, 10000000L}, NULL);
    }
    pthread_join(th, NULL);
    assert_true(polls > 0);
    assert_int_equal(files_like(dir, is_marker), 0); /* removed once the file had its name */
    struct cache_lease l;
    begin(b, "k", f->toks, n3, CACHE_ACQUIRE_NOWAIT, &l);
    assert_int_equal(l.decision.tier, CACHE_TIER_DISK);
    assert_int_equal(l.decision.cached, n2);
    assert_true(tern_session_hash(l.session) == cold_hash(f, f->toks, n2));
    assert_true(finish(b, f->toks, n3, &l) == cold_hash(f, f->toks, n3));
    cache_flush(b);

    /* a writer killed mid-write: its marker is there, its lock is not */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct disk_params dp = {.dir = dir, .max_bytes = 1ull << 30, .model = f->m};
        tern_session_params_default(&dp.session);
        dp.session.n_ctx = 2048;
        struct disk *d = NULL;
        struct disk_mark *mk = NULL;
        if (disk_open(&dp, &d) || disk_announce(d, "t", "k", NULL, f->toks, n4, NULL, NULL, 0, &mk)) _exit(3);
        raise(SIGKILL);
        _exit(4);
    }
    int wst = 0;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
    assert_int_equal(files_like(dir, is_marker), 1);
    assert_false(cache_write_pending(a, &id, f->toks, n4 + N_EXT, &w)); /* never waited for */
    assert_int_equal(files_like(dir, is_marker), 0);                    /* and removed */
    struct cache_decision d;
    assert_true(request(a, "k", f->toks, n4 + N_EXT, &d) == cold_hash(f, f->toks, n4 + N_EXT));
    assert_int_equal(d.tier, CACHE_TIER_DISK); /* turn 3's file, from b */
    assert_int_equal(d.cached, n3);
    cache_free(a);
    cache_free(b);
    assert_int_equal(files_like(dir, is_marker), 0);
    assert_int_equal(tmp_files(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_async_roundtrip, setup_q35),
        cmocka_unit_test_setup(test_async_roundtrip, setup_q3),
        cmocka_unit_test_setup(test_resume_waits, setup_q35),
        cmocka_unit_test_setup(test_resume_waits, setup_q3),
        cmocka_unit_test_setup(test_evict_pinned, setup_q35),
        cmocka_unit_test_setup(test_shutdown_inflight, setup_q35),
        cmocka_unit_test_setup(test_write_fails, setup_q35),
        cmocka_unit_test_setup(test_queue_full, setup_q3),
        cmocka_unit_test_setup(test_rollback_switch, setup_q35),
        cmocka_unit_test_setup(test_peer_write_in_flight, setup_q35),
        cmocka_unit_test_setup(test_peer_write_in_flight, setup_q3),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tern_model_free(fx_q3.m);
    tern_model_free(fx_q35.m);
    return rc;
}
