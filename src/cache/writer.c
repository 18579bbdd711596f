/* The disk tier's writer thread (cache-impl.h): parked conversations written behind
 * the engine, pinned while their write is queued or running. */
#include "cache/cache-impl.h"

#include "util/log.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the disk tier ------------------------------------------------------------------- */

void cache_disk_stats_update(struct cache *c) {
    if (!c->disk) return;
    struct disk_stats ds;
    disk_get_stats(c->disk, &ds);
    pthread_mutex_lock(&c->stats_mu);
    c->stats.disk_on = true;
    c->stats.disk_writes = ds.writes;
    c->stats.disk_write_bytes = ds.write_bytes;
    c->stats.disk_write_errors = ds.write_errors;
    c->stats.disk_loads = ds.loads;
    c->stats.disk_load_bytes = ds.load_bytes;
    c->stats.disk_invalid = ds.invalid;
    c->stats.disk_evictions = ds.evictions;
    c->stats.disk_bytes = ds.bytes;
    c->stats.disk_entries = ds.entries;
    pthread_mutex_unlock(&c->stats_mu);
}

/* ---- the disk writer ------------------------------------------------------------------
 *
 * A parked conversation is written by a thread of its own, so that the streams the
 * worker batches do not pause for it (a long conversation is hundreds of MB). Nothing is
 * copied: the entry is *pinned* while its write is queued or running, and the writer
 * reads its session (tokens, KV rows [0, n), the recurrent state at n) and the
 * checkpoints it was handed, straight from RAM.
 *
 * The pinning rule. A pinned entry's session and those checkpoints are read-only:
 *   - reading them is allowed (a fork of its prefix, a prediction forked from it, the
 *     candidate walk comparing its tokens): readers do not race with a reader;
 *   - changing them waits for the write: a request that would resume the entry in place
 *     (eval past n, or a rewind or a checkpoint restore below n, which overwrite rows and
 *     the recurrent state; appending alone would leave rows < n as they are, but not the
 *     recurrent state at n, which the writer reads too) waits until the write is done
 *     (cache_write_pending, the engine defers only that request; cache_acquire itself
 *     waits, bounded by CACHE_PIN_WAIT_MS, then leaves the entry alone);
 *   - the budget treats it like a leased entry (neither it nor its checkpoints are
 *     evicted; the pool is evicted again after the write);
 *   - any other removal (lineage collapse, a newer copy from disk, TERN_REUSE_POOL=0)
 *     takes it out of the pool at once and leaves the free to the writer (doomed);
 *   - its checkpoints are not moved to another entry (that one could free them).
 * A pinned entry is never leased: it is pinned only when parked, and a lease waits.
 *
 * Failures: a write that fails leaves the entry dirty (written again when evicted) and
 * is logged once until a write succeeds, by the thread that wrote. The queue holds
 * WRITE_QUEUE writes; when it is full the worker writes itself, as before the writer
 * existed (the write-ahead bound holds: a crash loses at most the turns in flight). At
 * cache_free the queued writes finish before anything is freed. */
struct write_job {
    struct entry *e;
    struct tern_checkpoint *cks[MAX_PLAN * 4];
    uint32_t kinds[MAX_PLAN * 4];
    size_t n_cks;
    uint8_t nonce[DISK_NONCE_BYTES];
    struct disk_mark *mark;     /* the write's announcement, ended when it is done */
};

bool cache_entry_pinned(struct cache *c, struct entry *e) {
    pthread_mutex_lock(&c->wmu);
    bool p = e->pinned;
    pthread_mutex_unlock(&c->wmu);
    return p;
}

/* The outcome of a write, under wmu: the entry's dirt and the once-until-it-works log. */
static void write_outcome(struct cache *c, struct entry *e, enum tern_status st, const char *msg) {
    if (st) {
        e->disk_dirty = true;
        if (!c->disk_failing)
            TERN_LOG_WARN("reuse: %s; the conversation stays in RAM only (logged once until a write succeeds)", msg);
        c->disk_failing = true;
    } else {
        e->disk_dirty = false;
        if (c->disk_failing) TERN_LOG_INFO("reuse: the disk tier writes again");
        c->disk_failing = false;
    }
}

static void job_fill(struct write_job *j, struct entry *e) {
    j->e = e;
    j->n_cks = 0;
    for (size_t i = 0; i < e->n_ck && j->n_cks < TERN_ARRAY_LEN(j->cks); i++) {
        if (!e->ck[i].ck) continue;
        j->kinds[j->n_cks] = e->ck[i].kinds;
        j->cks[j->n_cks++] = e->ck[i].ck;
    }
    memcpy(j->nonce, e->disk_nonce, sizeof j->nonce);
    j->mark = NULL;
}

static void *writer_main(void *arg) {
    struct cache *c = arg;
    pthread_mutex_lock(&c->wmu);
    for (;;) {
        while ((c->wq_len == 0 || c->w_hold) && !c->w_stop) pthread_cond_wait(&c->wcv, &c->wmu);
        if (c->wq_len == 0) break; /* stopping, and every queued write is done */
        struct write_job *j = c->wq[c->wq_head];
        c->wq_head = (c->wq_head + 1) % WRITE_QUEUE;
        c->wq_len--;
        c->w_busy = true;
        pthread_mutex_unlock(&c->wmu);
        struct entry *e = j->e;
        const struct disk_mtp head = {e->head, e->head_base};
        enum tern_status st =
            disk_put_io(c->disk, c->wio, e->tenant, e->key, j->nonce, e->s, j->cks, j->kinds, j->n_cks, &head);
        disk_mark_end(c->disk, j->mark); /* (after the file has its name: a peer never waits for nothing) */
        cache_disk_stats_update(c);
        pthread_mutex_lock(&c->wmu);
        write_outcome(c, e, st, st ? tern_last_error() : NULL);
        e->pinned = false;
        const bool doomed = e->doomed;
        c->w_busy = false;
        pthread_cond_broadcast(&c->done_cv);
        pthread_mutex_unlock(&c->wmu);
        if (doomed) {
            cache_entry_free(e);
            malloc_trim(0);
        }
        free(j);
        pthread_mutex_lock(&c->wmu);
    }
    pthread_mutex_unlock(&c->wmu);
    return NULL;
}

/* Starts the writer (cache_new). On failure the worker writes itself. */
void cache_writer_start(struct cache *c) {
    if (disk_io_new(c->disk, &c->wio)) {
        TERN_LOG_WARN("reuse: %s; the disk tier writes in the worker", tern_last_error());
        return;
    }
    if (pthread_create(&c->writer, NULL, writer_main, c)) {
        TERN_LOG_WARN("reuse: cannot start the disk writer thread; the disk tier writes in the worker");
        disk_io_free(c->wio);
        c->wio = NULL;
        return;
    }
    c->writer_on = true;
}

/* Stops the writer after the queued writes (cache_free). */
void cache_writer_stop(struct cache *c) {
    if (!c->writer_on) return;
    pthread_mutex_lock(&c->wmu);
    c->w_stop = true;
    pthread_cond_signal(&c->wcv);
    pthread_mutex_unlock(&c->wmu);
    pthread_join(c->writer, NULL);
    c->writer_on = false;
    disk_io_free(c->wio);
    c->wio = NULL;
}

/* Writes a parked conversation (its session and checkpoints) to the disk tier: queued
 * for the writer (the entry pinned), or, when the queue is full, here. A failure (disk
 * full, a state larger than the budget) leaves the conversation in RAM only: the server
 * keeps serving and says why, once until a write succeeds again. */
void cache_disk_park(struct cache *c, struct entry *e) {
    if (!c->disk || e->predicted || e->leased || tern_session_n_past(e->s) == 0) return;
    if (cache_entry_pinned(c, e)) return; /* (its write is in flight) */
    if (!e->key && !e->has_nonce) {
        if (disk_nonce_new(e->disk_nonce)) {
            pthread_mutex_lock(&c->wmu);
            write_outcome(c, e, TERN_ERR_IO, tern_last_error());
            pthread_mutex_unlock(&c->wmu);
            return;
        }
        e->has_nonce = true;
    }
    struct write_job *j = c->writer_on ? tern_malloc(sizeof *j) : NULL;
    if (j) {
        job_fill(j, e);
        pthread_mutex_lock(&c->wmu);
        if (c->wq_len < WRITE_QUEUE) {
            j->mark = e->mark;
            e->mark = NULL;
            c->wq[(c->wq_head + c->wq_len) % WRITE_QUEUE] = j;
            c->wq_len++;
            e->pinned = true;
            pthread_cond_signal(&c->wcv);
            j = NULL;
        }
        pthread_mutex_unlock(&c->wmu);
        if (!j) return;
    }
    /* the queue is full (or no writer): written here, as the worker always did */
    struct write_job *sync = j ? j : tern_malloc(sizeof *sync);
    enum tern_status st;
    if (sync) {
        job_fill(sync, e);
        const struct disk_mtp head = {e->head, e->head_base};
        st = disk_put(c->disk, e->tenant, e->key, e->disk_nonce, &e->has_nonce, e->s, sync->cks, sync->kinds,
                      sync->n_cks, &head);
        free(sync);
        disk_mark_end(c->disk, e->mark);
        e->mark = NULL;
    } else {
        st = tern_errorf(TERN_ERR_NOMEM, "disk tier: out of memory for a write");
    }
    pthread_mutex_lock(&c->wmu);
    write_outcome(c, e, st, st ? tern_last_error() : NULL);
    pthread_mutex_unlock(&c->wmu);
    cache_disk_stats_update(c);
}

/* True when e's disk copy is stale (under wmu: the writer sets it). */
bool cache_entry_dirty(struct cache *c, struct entry *e) {
    pthread_mutex_lock(&c->wmu);
    bool d = e->disk_dirty;
    pthread_mutex_unlock(&c->wmu);
    return d;
}

void cache_set_dirty(struct cache *c, struct entry *e) {
    pthread_mutex_lock(&c->wmu);
    e->disk_dirty = true;
    pthread_mutex_unlock(&c->wmu);
}

/* Waits until e's write is done or deadline (ns, tern_now_ns clock) passes. */
bool cache_wait_unpinned(struct cache *c, struct entry *e, uint64_t deadline) {
    pthread_mutex_lock(&c->wmu);
    while (e->pinned) {
        uint64_t now = tern_now_ns();
        if (now >= deadline) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t left = deadline - now;
        if (left > 100000000ull) left = 100000000ull; /* re-check the clock every 100 ms */
        uint64_t t = (uint64_t)ts.tv_nsec + left;
        ts.tv_sec += (time_t)(t / 1000000000ull);
        ts.tv_nsec = (long)(t % 1000000000ull);
        pthread_cond_timedwait(&c->done_cv, &c->wmu, &ts);
    }
    bool done = !e->pinned;
    pthread_mutex_unlock(&c->wmu);
    return done;
}

void cache_test_hold_writes(struct cache *c, bool hold) {
    pthread_mutex_lock(&c->wmu);
    c->w_hold = hold;
    pthread_cond_broadcast(&c->wcv);
    pthread_mutex_unlock(&c->wmu);
}

void cache_flush(struct cache *c) {
    pthread_mutex_lock(&c->wmu);
    while (c->wq_len || c->w_busy) pthread_cond_wait(&c->done_cv, &c->wmu);
    pthread_mutex_unlock(&c->wmu);
}

void cache_wait_write(struct cache *c, unsigned ms) {
    pthread_mutex_lock(&c->wmu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t t = (uint64_t)ts.tv_nsec + (uint64_t)ms * 1000000ull;
    ts.tv_sec += (time_t)(t / 1000000000ull);
    ts.tv_nsec = (long)(t % 1000000000ull);
    pthread_cond_timedwait(&c->done_cv, &c->wmu, &ts);
    pthread_mutex_unlock(&c->wmu);
}
