/* The compute thread pool: persistent workers that run one task at a time on every
 * thread (the caller included), with low dispatch overhead.
 *
 * A task is a function called once per thread with (ith, nth); it splits its work by
 * output rows/columns (or by tokens/heads), never by a reduction, so results do not
 * depend on the thread count (DESIGN.md §5). Between tasks, idle workers spin briefly
 * (a decode step dispatches a few hundred tasks per token, microseconds apart) and then
 * sleep on a condition variable, so an idle pool costs nothing.
 *
 * tern_threadpool_run() may be called from any thread; concurrent calls are
 * serialised. It must not be called from inside a task. */
#ifndef TERN_UTIL_THREADPOOL_H
#define TERN_UTIL_THREADPOOL_H

#include "util/status.h"

#include <stddef.h>
#include <stdint.h>

struct tern_threadpool;

typedef void (*tern_task_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0: the number of online cores. The pool has n_threads - 1 workers; the
 * calling thread of tern_threadpool_run() is thread 0. */
enum tern_status tern_threadpool_new(int n_threads, struct tern_threadpool **out);
void tern_threadpool_free(struct tern_threadpool *tp);
int tern_threadpool_n_threads(const struct tern_threadpool *tp);
/* The number of online cores (at least 1). */
int tern_n_cores(void);

/* Runs fn(ctx, ith, nth) on every thread, ith in [0, nth), and returns when all are
 * done. nth is the pool's thread count. */
void tern_threadpool_run(struct tern_threadpool *tp, tern_task_fn fn, void *ctx);
/* For tasks whose threads share their work dynamically (tern_work): the caller runs
 * fn(ctx, 0, nth), and so does every worker that starts before the caller has finished
 * its own call; a worker that has not started by then (descheduled on a busy machine)
 * is not waited for. fn must therefore leave no work behind when it returns (take
 * blocks until none is left), and may be run by fewer than nth threads (each ith at
 * most once). */
void tern_threadpool_run_shared(struct tern_threadpool *tp, tern_task_fn fn, void *ctx);

/* Dynamic work sharing inside a task: an atomic counter handing out items [0, n) in
 * blocks, so threads that run faster take more (which block goes to which thread does
 * not change any result). Reset it before tern_threadpool_run(). */
struct tern_work {
    _Alignas(64) volatile size_t next; /* accessed atomically */
    size_t n;
    size_t block;
};
static inline void tern_work_init(struct tern_work *w, size_t n, size_t block) {
    w->next = 0;
    w->n = n;
    w->block = block ? block : 1;
}
/* Takes the next block: true with [*i0, *i1) set, false when all are handed out. */
static inline int tern_work_take(struct tern_work *w, size_t *i0, size_t *i1) {
    size_t i = __atomic_fetch_add(&w->next, w->block, __ATOMIC_RELAXED);
    if (i >= w->n) return 0;
    *i0 = i;
    *i1 = i + w->block < w->n ? i + w->block : w->n;
    return 1;
}

#endif
