#include "util/threadpool.h"

#include "util/mem.h"
#include "util/timeutil.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

/* How long an idle worker spins for the next task before it sleeps. Decode dispatches
 * tasks microseconds apart, so spinning keeps the wake-up latency (tens of
 * microseconds through the scheduler) off the per-token path; after this long the
 * pool is idle and the core is given back. */
#define SPIN_NS 300000ull

struct worker {
    struct tern_threadpool *tp;
    pthread_t thread;
    int ith;
};

struct tern_threadpool {
    int n_threads;
    struct worker *workers; /* n_threads - 1 */

    /* The current task. Published by incrementing gen (seq_cst); workers read it after
     * seeing gen change and joining the task. */
    tern_task_fn fn;
    void *ctx;
    _Alignas(64) atomic_uint_fast64_t gen;
    /* Joining: (gen & 0xffffffff) << 32 | CLOSED | number of workers that joined. A
     * worker joins with a CAS that requires the task's gen and no CLOSED bit, so it never
     * runs a task twice or one that has already been wrapped up. */
    _Alignas(64) atomic_uint_fast64_t join;
    _Alignas(64) atomic_int done; /* joined workers that finished */
    _Alignas(64) atomic_int n_sleeping;
    atomic_bool stop;

    pthread_mutex_t mu; /* guards sleeping and waking */
    pthread_cond_t cv;
    pthread_mutex_t run_mu; /* serialises tern_threadpool_run callers */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

int tern_n_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

/* Waits until gen differs from seen (or stop); returns the new gen. */
static uint64_t wait_for_task(struct tern_threadpool *tp, uint64_t seen) {
    uint64_t g;
    uint64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&tp->stop, memory_order_relaxed)) return g;
        /* Pause first; then yield, so that on an oversubscribed machine (more threads
         * than free cores) a spinning worker lets the busy ones run. */
        if (i < 2048) cpu_relax();
        else sched_yield();
        if ((i & 255) == 255) {
            uint64_t now = tern_now_ns();
            if (!t0) t0 = now;
            else if (now - t0 > SPIN_NS) break;
        }
    }
    pthread_mutex_lock(&tp->mu);
    /* seq_cst pairs with the dispatcher's gen increment then n_sleeping read: either
     * it sees us sleeping and broadcasts under mu, or we see the new gen here. */
    atomic_fetch_add(&tp->n_sleeping, 1);
    while ((g = atomic_load(&tp->gen)) == seen && !atomic_load(&tp->stop))
        pthread_cond_wait(&tp->cv, &tp->mu);
    atomic_fetch_sub(&tp->n_sleeping, 1);
    pthread_mutex_unlock(&tp->mu);
    return g;
}

#define JOIN_CLOSED (UINT64_C(1) << 31)

static bool join_task(struct tern_threadpool *tp, uint64_t g) {
    uint64_t s = atomic_load(&tp->join);
    for (;;) {
        if ((s >> 32) != (g & 0xffffffffu) || (s & JOIN_CLOSED)) return false;
        if (atomic_compare_exchange_weak(&tp->join, &s, s + 1)) return true;
    }
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    struct tern_threadpool *tp = w->tp;
    uint64_t seen = 0;
    for (;;) {
        seen = wait_for_task(tp, seen);
        if (atomic_load(&tp->stop)) break;
        if (!join_task(tp, seen)) continue; /* wrapped up without us */
        tp->fn(tp->ctx, w->ith, tp->n_threads);
        atomic_fetch_add_explicit(&tp->done, 1, memory_order_release);
    }
    return NULL;
}

enum tern_status tern_threadpool_new(int n_threads, struct tern_threadpool **out) {
    *out = NULL;
    if (n_threads <= 0) n_threads = tern_n_cores();
    if (n_threads > 1024)
        return tern_errorf(TERN_ERR_RANGE, "thread count %d exceeds the limit 1024", n_threads);
    struct tern_threadpool *tp = tern_calloc(1, sizeof *tp);
    if (!tp) return tern_errorf(TERN_ERR_NOMEM, "thread pool: out of memory");
    tp->n_threads = n_threads;
    atomic_init(&tp->gen, 0);
    atomic_init(&tp->join, JOIN_CLOSED);
    atomic_init(&tp->done, 0);
    atomic_init(&tp->n_sleeping, 0);
    atomic_init(&tp->stop, false);
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    pthread_mutex_init(&tp->run_mu, NULL);
    if (n_threads > 1) {
        tp->workers = tern_calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) {
            tern_threadpool_free(tp);
            return tern_errorf(TERN_ERR_NOMEM, "thread pool: out of memory");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker *w = &tp->workers[i - 1];
        w->tp = tp;
        w->ith = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            tp->n_threads = i; /* only the started ones are joined */
            tern_threadpool_free(tp);
            return tern_errorf(TERN_ERR_NOMEM, "thread pool: cannot start thread %d of %d", i, n_threads);
        }
    }
    *out = tp;
    return TERN_OK;
}

void tern_threadpool_free(struct tern_threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, true);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    if (tp->workers)
        for (int i = 1; i < tp->n_threads; i++) pthread_join(tp->workers[i - 1].thread, NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    pthread_mutex_destroy(&tp->run_mu);
    free(tp->workers);
    free(tp);
}

int tern_threadpool_n_threads(const struct tern_threadpool *tp) { return tp->n_threads; }

static void run(struct tern_threadpool *tp, tern_task_fn fn, void *ctx, bool all) {
    if (tp->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&tp->run_mu);
    tp->fn = fn;
    tp->ctx = ctx;
    const uint64_t g = atomic_load(&tp->gen) + 1; /* only run_mu holders change gen */
    atomic_store(&tp->done, 0);
    atomic_store(&tp->join, (g & 0xffffffffu) << 32);
    atomic_store(&tp->gen, g); /* seq_cst: publishes fn, ctx, join */
    if (atomic_load(&tp->n_sleeping) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
    fn(ctx, 0, tp->n_threads);
    /* A task every thread must run waits for all workers; a shared-work task is closed
     * now, so a worker that has not started (descheduled on a busy machine) is not
     * waited for: the work it would have taken is done already. */
    int want = tp->n_threads - 1;
    if (!all) want = (int)(atomic_fetch_or(&tp->join, JOIN_CLOSED) & (JOIN_CLOSED - 1));
    for (unsigned i = 0; atomic_load_explicit(&tp->done, memory_order_acquire) < want; i++) {
        if (i < 4096) cpu_relax();
        else sched_yield();
    }
    atomic_fetch_or(&tp->join, JOIN_CLOSED);
    pthread_mutex_unlock(&tp->run_mu);
}

void tern_threadpool_run(struct tern_threadpool *tp, tern_task_fn fn, void *ctx) { run(tp, fn, ctx, true); }

void tern_threadpool_run_shared(struct tern_threadpool *tp, tern_task_fn fn, void *ctx) { run(tp, fn, ctx, false); }
