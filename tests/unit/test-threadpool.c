/* The compute pool: every thread runs every task exactly once, dynamic work sharing
 * hands out every item exactly once, sleeping workers wake, concurrent callers are
 * serialised. */
#include "harness.h"

#include "util/mem.h"
#include "util/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct count_ctx {
    atomic_int calls[16];
    atomic_int nth_seen;
};

static void count_task(void *ctx, int ith, int nth) {
    struct count_ctx *c = ctx;
    atomic_fetch_add(&c->calls[ith], 1);
    atomic_store(&c->nth_seen, nth);
}

static void test_every_thread_runs_once(void **state) {
    (void)state;
    for (int n = 1; n <= 4; n++) {
        struct tern_threadpool *tp;
        assert_int_equal(tern_threadpool_new(n, &tp), TERN_OK);
        assert_int_equal(tern_threadpool_n_threads(tp), n);
        struct count_ctx c;
        memset(&c, 0, sizeof c);
        for (int r = 0; r < 5000; r++) tern_threadpool_run(tp, count_task, &c);
        for (int i = 0; i < n; i++) assert_int_equal(atomic_load(&c.calls[i]), 5000);
        for (int i = n; i < 16; i++) assert_int_equal(atomic_load(&c.calls[i]), 0);
        assert_int_equal(atomic_load(&c.nth_seen), n);
        tern_threadpool_free(tp);
    }
    tern_threadpool_free(NULL);
    struct tern_threadpool *tp;
    assert_int_equal(tern_threadpool_new(0, &tp), TERN_OK);
    assert_int_equal(tern_threadpool_n_threads(tp), tern_n_cores());
    tern_threadpool_free(tp);
    assert_int_equal(tern_threadpool_new(100000, &tp), TERN_ERR_RANGE);
}

struct work_ctx {
    struct tern_work work;
    atomic_uchar *seen;
};

static void work_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    struct work_ctx *w = ctx;
    size_t i0, i1;
    while (tern_work_take(&w->work, &i0, &i1))
        for (size_t i = i0; i < i1; i++) atomic_fetch_add(&w->seen[i], 1);
}

static void test_work_sharing(void **state) {
    (void)state;
    struct tern_threadpool *tp;
    assert_int_equal(tern_threadpool_new(3, &tp), TERN_OK);
    const size_t sizes[] = {0, 1, 7, 16, 1000, 4099};
    const size_t blocks[] = {1, 3, 16, 5000};
    for (size_t a = 0; a < TERN_ARRAY_LEN(sizes); a++) {
        for (size_t b = 0; b < 4; b++) {
            struct work_ctx w;
            w.seen = calloc(sizes[a] + 1, 1);
            tern_work_init(&w.work, sizes[a], blocks[b]);
            tern_threadpool_run(tp, work_task, &w);
            for (size_t i = 0; i < sizes[a]; i++) assert_int_equal(w.seen[i], 1);
            assert_int_equal(w.seen[sizes[a]], 0);
            free(w.seen);
        }
    }
    tern_threadpool_free(tp);
}

struct shared_ctx {
    struct tern_work work;
    atomic_uchar *seen;
    atomic_int calls[16];
};

static void shared_task(void *ctx, int ith, int nth) {
    struct shared_ctx *w = ctx;
    assert_true(nth >= 1 && ith < nth);
    atomic_fetch_add(&w->calls[ith], 1);
    size_t i0, i1;
    while (tern_work_take(&w->work, &i0, &i1))
        for (size_t i = i0; i < i1; i++) atomic_fetch_add(&w->seen[i], 1);
}

/* Shared-work tasks: every item exactly once, each thread at most once per task, the
 * caller always; also with more threads than cores. */
static void test_shared_tasks(void **state) {
    (void)state;
    for (int n = 1; n <= 6; n++) {
        struct tern_threadpool *tp;
        assert_int_equal(tern_threadpool_new(n, &tp), TERN_OK);
        for (int r = 0; r < 300; r++) {
            struct shared_ctx w;
            memset(&w, 0, sizeof w);
            const size_t items = (size_t)(r % 7) * 100 + 1;
            w.seen = calloc(items, 1);
            tern_work_init(&w.work, items, (size_t)(r % 5) + 1);
            tern_threadpool_run_shared(tp, shared_task, &w);
            for (size_t i = 0; i < items; i++) assert_int_equal(w.seen[i], 1);
            assert_int_equal(atomic_load(&w.calls[0]), 1);
            for (int i = 1; i < 16; i++) assert_true(atomic_load(&w.calls[i]) <= 1);
            free(w.seen);
        }
        /* static tasks still reach every thread after shared ones */
        struct count_ctx c;
        memset(&c, 0, sizeof c);
        for (int r = 0; r < 50; r++) tern_threadpool_run(tp, count_task, &c);
        for (int i = 0; i < n; i++) assert_int_equal(atomic_load(&c.calls[i]), 50);
        tern_threadpool_free(tp);
    }
}

static void test_wakes_after_sleep(void **state) {
    (void)state;
    struct tern_threadpool *tp;
    assert_int_equal(tern_threadpool_new(3, &tp), TERN_OK);
    struct count_ctx c;
    memset(&c, 0, sizeof c);
    for (int r = 0; r < 4; r++) {
        /* longer than the spin: the workers are asleep when the task comes */
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
        tern_threadpool_run(tp, count_task, &c);
    }
    for (int i = 0; i < 3; i++) assert_int_equal(atomic_load(&c.calls[i]), 4);
    tern_threadpool_free(tp);
}

struct caller_ctx {
    struct tern_threadpool *tp;
    struct count_ctx c;
};

static void *caller(void *arg) {
    struct caller_ctx *cc = arg;
    for (int r = 0; r < 2000; r++) tern_threadpool_run(cc->tp, count_task, &cc->c);
    return NULL;
}

static void test_concurrent_callers(void **state) {
    (void)state;
    struct tern_threadpool *tp;
    assert_int_equal(tern_threadpool_new(2, &tp), TERN_OK);
    struct caller_ctx a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.tp = b.tp = tp;
    pthread_t ta, tb;
    pthread_create(&ta, NULL, caller, &a);
    pthread_create(&tb, NULL, caller, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(atomic_load(&a.c.calls[i]), 2000);
        assert_int_equal(atomic_load(&b.c.calls[i]), 2000);
    }
    tern_threadpool_free(tp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_thread_runs_once),
        cmocka_unit_test(test_work_sharing),
        cmocka_unit_test(test_shared_tasks),
        cmocka_unit_test(test_wakes_after_sleep),
        cmocka_unit_test(test_concurrent_callers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
