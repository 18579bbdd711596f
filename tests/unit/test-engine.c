/* The engine's step scheduler without HTTP (engine-run.c): jobs made as the server makes
 * them (parsed request, backend prepare), started and stepped directly.
 * - fairness: while a long prompt is read, every decoding request gets exactly one token
 *   per step, and no step holds more prompt rows than --batch-tokens leaves;
 * - exactness: each request's output equals its solo run (greedy and seeded sampling),
 *   on a dense and a hybrid model;
 * - cancellation: a request cancelled mid-decode ends (499) at the next step, the others
 *   go on unchanged;
 * - metrics: the step counters and the histogram of requests per step add up. */
#include "harness.h"

#include "server/engine-impl.h"
#include "server/server.h"
#include "util/mem.h"
#include "tern.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_JOBS 8

static struct tern_model *load(const char *rel) {
    th_require_shared(rel);
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = th_shared_path(rel);
    mp.n_threads = 2;
    struct tern_model *m = NULL;
    if (tern_model_load(&mp, &m)) fail_msg("%s: %s", rel, tern_last_error());
    return m;
}

static struct srv_engine *engine_ram(struct tern_model *m, uint32_t parallel, uint32_t batch_tokens, size_t ram) {
    struct srv_engine_params ep = {
        .model = m,
        .parallel = parallel,
        .batch_tokens = batch_tokens,
        .predict = PREDICT_OFF,
    };
    tern_session_params_default(&ep.cache.session);
    ep.cache.session.n_ctx = 1024;
    ep.cache.ram_bytes = ram;
    ep.cache.max_ckpts = 4;
    ep.cache.ckpt_every = 64;
    ep.cache.turn_token = -1;
    ep.cache.pool = true;
    struct srv_engine *e = NULL;
    if (srv_engine_new(&ep, &e)) fail_msg("engine: %s", tern_last_error());
    return e;
}

static struct srv_engine *engine(struct tern_model *m, uint32_t parallel, uint32_t batch_tokens) {
    return engine_ram(m, parallel, batch_tokens, (size_t)256 << 20);
}

static struct srv_job *job(struct srv_engine *e, uint64_t seq, const char *body) {
    struct srv_job *j = tern_calloc(1, sizeof *j);
    assert_non_null(j);
    j->seq = seq;
    snprintf(j->id, sizeof j->id, "cmpl-%llu", (unsigned long long)seq);
    j->ep = SRV_EP_COMPLETION;
    j->path = "/v1/completions";
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    struct srv_error err;
    const struct srv_parse_opts po = {0};
    if (!srv_request_parse(j->ep, body, strlen(body), &po, &j->req, &err)) fail_msg("parse: %s", err.message);
    const struct srv_backend *b = srv_engine_backend(e);
    if (!b->prepare(b->self, j, &err)) fail_msg("prepare: %s", err.message);
    return j;
}

static void job_free(struct srv_engine *e, struct srv_job *j) {
    const struct srv_backend *b = srv_engine_backend(e);
    b->job_free(b->self, j);
    free(j->prompt);
    srv_request_free(&j->req);
    tern_buf_free(&j->out);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Steps until every started job ended; returns the steps taken. */
static int drain(struct srv_engine *e, size_t n_running) {
    const struct srv_backend *b = srv_engine_backend(e);
    struct srv_job *ended[MAX_JOBS];
    int steps = 0;
    while (n_running > 0) {
        n_running -= b->step(b->self, ended, MAX_JOBS);
        assert_true(++steps < 10000);
    }
    return steps;
}

/* The response's "text" (or the whole body when it has none). */
static char *text_of(const struct srv_job *j) {
    json_error_t je;
    json_t *r = json_loadb(j->out.data, j->out.len, 0, &je);
    if (!r) fail_msg("%s: not JSON: %.*s", j->id, (int)j->out.len, j->out.data);
    const char *t = json_string_value(json_object_get(json_array_get(json_object_get(r, "choices"), 0), "text"));
    char *out = strdup(t ? t : "");
    json_decref(r);
    return out;
}

static char *solo(struct tern_model *m, const char *body) {
    struct srv_engine *e = engine(m, 1, 16);
    struct srv_job *j = job(e, 1, body);
    const struct srv_backend *b = srv_engine_backend(e);
    assert_true(b->start(b->self, j));
    drain(e, 1);
    assert_int_equal(j->status, 200);
    char *t = text_of(j);
    job_free(e, j);
    srv_engine_free(e);
    return t;
}

static void body_for(char *buf, size_t cap, int k, int n_prompt, int max_tokens) {
    size_t at = (size_t)snprintf(buf, cap, "{\"prompt\":[");
    for (int i = 0; i < n_prompt; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%d", i ? "," : "", 30 + (i * 37 + k * 11) % 3000);
    if (k % 2) snprintf(buf + at, cap - at, "],\"max_tokens\":%d,\"temperature\":0.9,\"seed\":%d}", max_tokens, 40 + k);
    else snprintf(buf + at, cap - at, "],\"max_tokens\":%d,\"temperature\":0}", max_tokens);
}

static void check_model(const char *rel) {
    struct tern_model *m = load(rel);
    enum { N = 4, BUDGET = 16 };
    static char bodies[N][16384];
    const int lens[N] = {5, 23, 11, 300}, gens[N] = {24, 18, 30, 6};
    char *want[N];
    for (int k = 0; k < N; k++) {
        body_for(bodies[k], sizeof bodies[k], k, lens[k], gens[k]);
        want[k] = solo(m, bodies[k]);
    }
    size_t chars = 0;
    for (int k = 0; k < N; k++) chars += strlen(want[k]);
    assert_true(chars > 20); /* the comparison below compares something */
    struct srv_engine *e = engine(m, N, BUDGET);
    const struct srv_backend *b = srv_engine_backend(e);
    struct srv_job *jobs[N];
    struct srv_job *ended[MAX_JOBS];
    size_t running = 0;
    for (int k = 0; k < 3; k++) {
        jobs[k] = job(e, (uint64_t)k + 1, bodies[k]);
        assert_true(b->start(b->self, jobs[k]));
        running++;
    }
    /* until the three decode */
    for (int s = 0; s < 20 && atomic_load(&e->n_priming) > 0; s++) running -= b->step(b->self, ended, MAX_JOBS);
    assert_int_equal(atomic_load(&e->n_priming), 0);
    jobs[3] = job(e, 4, bodies[3]);
    assert_true(b->start(b->self, jobs[3]));
    running++;
    /* the long prompt is read beside the decoding ones: one token each per step, at most
     * the budget's rest of prompt rows */
    int long_steps = 0;
    while (atomic_load(&e->n_priming) > 0) {
        uint32_t before[3];
        for (int k = 0; k < 3; k++) before[k] = jobs[k]->n_generated;
        const uint64_t pre0 = atomic_load(&e->step_prefill_rows), dec0 = atomic_load(&e->step_decode_rows);
        running -= b->step(b->self, ended, MAX_JOBS);
        const uint64_t pre = atomic_load(&e->step_prefill_rows) - pre0, dec = atomic_load(&e->step_decode_rows) - dec0;
        assert_true(pre + dec <= BUDGET);
        for (int k = 0; k < 3; k++)
            if (!jobs[k]->done) assert_int_equal(jobs[k]->n_generated, before[k] + 1);
        assert_true(++long_steps < 1000);
    }
    assert_true(long_steps >= (300 + BUDGET - 1) / BUDGET); /* it took several steps */
    drain(e, running);
    for (int k = 0; k < N; k++) {
        assert_int_equal(jobs[k]->status, 200);
        char *got = text_of(jobs[k]);
        if (strcmp(got, want[k])) fail_msg("%s: request %d batched differs from solo:\n%s\nvs\n%s", rel, k, got, want[k]);
        free(got);
        free(want[k]);
    }
    /* the counters add up: every step is in the histogram, and some held several */
    uint64_t hist = 0;
    for (int k = 0; k < ENG_STEP_HIST; k++) hist += atomic_load(&e->step_hist[k]);
    assert_int_equal(hist, atomic_load(&e->steps));
    assert_true(atomic_load(&e->step_hist[0]) < hist);
    assert_int_equal(atomic_load(&e->n_running), 0);
    for (int k = 0; k < N; k++) job_free(e, jobs[k]);
    srv_engine_free(e);
    tern_model_free(m);
}

static void test_dense(void **u) {
    (void)u;
    check_model("models/tiny-qwen3-q8_0.gguf");
}

static void test_hybrid(void **u) {
    (void)u;
    check_model("models/tiny-qwen35-q8_0.gguf");
}

/* A request cancelled mid-decode ends at the next step (499); the other is unchanged. */
static void test_cancel(void **u) {
    (void)u;
    struct tern_model *m = load("models/tiny-qwen35-q8_0.gguf");
    char a[4096], c[4096];
    body_for(a, sizeof a, 0, 20, 40);
    body_for(c, sizeof c, 1, 9, 40);
    char *want = solo(m, a);
    struct srv_engine *e = engine(m, 4, 16);
    const struct srv_backend *b = srv_engine_backend(e);
    struct srv_job *ja = job(e, 1, a), *jc = job(e, 2, c);
    assert_true(b->start(b->self, ja));
    assert_true(b->start(b->self, jc));
    struct srv_job *ended[MAX_JOBS];
    size_t running = 2;
    for (int s = 0; s < 30 && jc->n_generated < 5; s++) running -= b->step(b->self, ended, MAX_JOBS);
    assert_true(jc->n_generated >= 5 && !jc->done);
    atomic_store(&jc->cancel, 1);
    const size_t k = b->step(b->self, ended, MAX_JOBS);
    assert_int_equal(k, 1);
    assert_ptr_equal(ended[0], jc);
    assert_int_equal(jc->status, 499);
    running -= k;
    drain(e, running);
    char *got = text_of(ja);
    assert_string_equal(got, want);
    free(got);
    free(want);
    job_free(e, ja);
    job_free(e, jc);
    srv_engine_free(e);
    tern_model_free(m);
}

/* Admission by memory: each request holds what its session can grow to (prompt +
 * max_tokens rows of KV, the recurrent state); with a budget of two and a half such
 * requests, the third waits (it has not started reading) until one ends, the held bytes
 * never pass the budget, and every output equals its solo run. A request larger than the
 * whole budget runs when it is alone. */
static void test_admission(void **u) {
    (void)u;
    struct tern_model *m = load("models/tiny-qwen35-q8_0.gguf");
    enum { N = 3, LEN = 20, GEN = 30 };
    static char bodies[N][4096];
    char *want[N];
    for (int k = 0; k < N; k++) {
        body_for(bodies[k], sizeof bodies[k], k, LEN, GEN);
        want[k] = solo(m, bodies[k]);
    }
    const struct tern_model_info *mi = tern_model_info(m);
    const size_t need = (size_t)(LEN + GEN) * mi->kv_bytes_per_token_f16 + mi->recurrent_bytes;
    const size_t budget = need * 5 / 2;
    struct srv_engine *e = engine_ram(m, 4, 16, budget);
    const struct srv_backend *b = srv_engine_backend(e);
    struct srv_job *jobs[N], *ended[MAX_JOBS];
    for (int k = 0; k < N; k++) {
        jobs[k] = job(e, (uint64_t)k + 1, bodies[k]);
        assert_true(b->start(b->self, jobs[k]));
    }
    assert_int_equal(e->admitted_bytes, 2 * need);
    size_t running = N;
    bool third_waited = false;
    while (running > 0) {
        const bool first_two_running = !jobs[0]->done && !jobs[1]->done;
        running -= b->step(b->self, ended, MAX_JOBS);
        assert_true(e->admitted_bytes <= budget);
        if (first_two_running) {
            assert_int_equal(jobs[2]->n_generated, 0);
            third_waited = true;
        }
    }
    assert_true(third_waited);
    assert_int_equal(e->admitted_bytes, 0);
    for (int k = 0; k < N; k++) {
        assert_int_equal(jobs[k]->status, 200);
        char *got = text_of(jobs[k]);
        if (strcmp(got, want[k])) fail_msg("request %d under admission differs from solo:\n%s\nvs\n%s", k, got, want[k]);
        free(got);
        job_free(e, jobs[k]);
    }
    srv_engine_free(e);
    /* larger than the whole budget: runs alone */
    e = engine_ram(m, 4, 16, need / 2);
    b = srv_engine_backend(e);
    jobs[0] = job(e, 1, bodies[0]);
    assert_true(b->start(b->self, jobs[0]));
    assert_int_equal(e->admitted_bytes, need);
    drain(e, 1);
    char *got = text_of(jobs[0]);
    assert_string_equal(got, want[0]);
    free(got);
    job_free(e, jobs[0]);
    srv_engine_free(e);
    for (int k = 0; k < N; k++) free(want[k]);
    tern_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_hybrid),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_admission),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
