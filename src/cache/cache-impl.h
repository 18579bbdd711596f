/* The cache's internals, shared by cache.c (the pool, leases, the decision's effects)
 * and candidates.c (who may be resumed). Not part of the cache's interface: nothing
 * outside src/cache includes it. The cache is used from one thread (cache.h); `stats`
 * is read from others, under stats_mu; the disk writer thread (cache.c) shares the
 * write queue and the entries' pin state with it, under wmu. */
#ifndef TERN_CACHE_IMPL_H
#define TERN_CACHE_IMPL_H

#include "cache/cache.h"
#include "cache/disk.h"
#include "cache/fingerprint.h"
#include "cache/planner.h"

#include <pthread.h>
#include <string.h>

/* Unnamed entries compared by plain token-prefix probing, most recent first. Older
 * unnamed entries are reached only through the fingerprint. */
#define PROBE_RECENT 8
/* Upper bound on the checkpoint plan of one request. */
#define MAX_PLAN 64
/* Writes queued for the disk writer thread; when full, the worker writes itself. */
#define WRITE_QUEUE 4
struct write_job;

struct ckpt_entry {
    struct tern_checkpoint *ck; /* NULL on attention-only models: a position is enough */
    uint32_t pos;
    uint32_t kinds;             /* PLAN_CKPT_* */
    uint64_t stamp;
};

struct entry {
    struct tern_session *s;
    char *tenant;
    char *key;                  /* NULL: unnamed */
    struct fingerprint fp;      /* of the session's tokens */
    struct ckpt_entry *ck;      /* ascending positions */
    size_t n_ck, cap_ck;
    size_t ck_bytes;
    uint64_t last_used;
    uint64_t lineage;           /* one conversation: its entry and its predictions */
    bool leased;
    bool predicted;             /* primed ahead of time, not yet used by a request */
    bool keep;                  /* predicted with CACHE_PREDICT_KEEP: the base of the next one */
    /* The disk tier: an unnamed conversation's file is named by a nonce it keeps for
     * its lifetime (resumed from disk: the file's), so its next park replaces it. */
    uint8_t disk_nonce[DISK_NONCE_BYTES];
    bool has_nonce;
    bool disk_dirty;            /* changed since it was last written (or the write failed); (wmu)
                                 * while pinned */
    /* A write of this entry is queued or running (wmu): the writer thread reads its
     * session and the checkpoints it was handed, so that nothing changes or frees them
     * until it is done (the pinning rule, cache.c). */
    bool pinned;
    /* The marker of the write this entry's park will make (cache_announce): handed to
     * the write, ended by whoever ends the write, or at the release when none is made. */
    struct disk_mark *mark;
    /* The MTP head parked with the conversation (cache_lease_park_head), its row 0 at
     * main position head_base: freed with the entry, moved along the lineage when the
     * conversation moves on to a prediction of it, written with it to the disk tier and
     * read back with it; never forked. Read-only while pinned, like the session. */
    struct tern_mtp *head;
    uint32_t head_base;
    bool doomed;                /* (wmu) removed from the pool while pinned: the writer frees it */
    struct entry *prev, *next;  /* LRU list, head = most recent */
};

struct cache {
    struct tern_model *model;
    struct cache_params p;
    bool hybrid;
    uint8_t *sep_bits;
    struct fp_separators sep;
    struct entry *head, *tail;
    size_t n_entries;
    uint64_t clock;
    uint64_t next_lineage;
    struct fingerprint req_fp;  /* scratch: the fingerprint of the tokens being placed */
    struct plan_turn *turns;    /* scratch */
    size_t cap_turns;
    pthread_mutex_t stats_mu;
    struct cache_stats stats;
    struct disk *disk;          /* --cache-dir; NULL = off */
    /* The disk writer thread and its bounded queue (cache.c). */
    pthread_mutex_t wmu;
    pthread_cond_t wcv;         /* a job queued, or stop */
    pthread_cond_t done_cv;     /* a write finished */
    struct write_job *wq[WRITE_QUEUE];
    size_t wq_head, wq_len;
    bool w_busy;                /* a job taken off the queue is being written */
    bool w_stop;
    bool w_hold;                /* tests: queued writes wait (cache_test_hold_writes) */
    bool writer_on;
    pthread_t writer;
    struct disk_io *wio;        /* the writer's lock descriptor and KV buffer */
    bool disk_failing;          /* (wmu) the last write failed (logged once until one succeeds) */
    bool skip_pinned;           /* scratch of a walk: pinned entries are not candidates */
};

#define STAT_ADD(c, field, v)                                                               \
    do {                                                                                    \
        pthread_mutex_lock(&(c)->stats_mu);                                                 \
        (c)->stats.field += (v);                                                            \
        pthread_mutex_unlock(&(c)->stats_mu);                                               \
    } while (0)

/* Frees an entry's session, checkpoints and aux state (cache.c). */
void cache_entry_free(struct entry *e);

/* ---- the disk writer (writer.c) ---------------------------------------------------- */

/* Whether a write of e is queued or running (the worker's view, under wmu). */
bool cache_entry_pinned(struct cache *c, struct entry *e);
/* The writer thread, started with the disk tier and stopped (its queue written) at
 * cache_free. */
void cache_writer_start(struct cache *c);
void cache_writer_stop(struct cache *c);
/* e written to the disk tier: queued for the writer (pinned), or written here when the
 * queue is full. */
void cache_disk_park(struct cache *c, struct entry *e);
/* Whether e holds state the disk tier lacks / marks it so (under wmu). */
bool cache_entry_dirty(struct cache *c, struct entry *e);
void cache_set_dirty(struct cache *c, struct entry *e);
/* Waits until e's write is done or deadline (ns) passes; false on the deadline. */
bool cache_wait_unpinned(struct cache *c, struct entry *e, uint64_t deadline);
/* The disk tier's counters into the cache's stats. */
void cache_disk_stats_update(struct cache *c);

/* Tenants and keys: NULL and "" are the same (the default tenant, no key). */
static inline bool cache_same_str(const char *a, const char *b) {
    if (!a || !*a) return !b || !*b;
    return b && !strcmp(a, b);
}

/* ---- candidates (candidates.c) ------------------------------------------------------ */

/* Why a candidate was nominated. */
struct nomination {
    bool by_key, by_fp, by_probe;
};

/* One parked entry compared with the tokens being placed. */
struct candidate {
    struct entry *e;
    struct plan_resume res;     /* what it offers (planner.h) */
    struct nomination nom;
};

/* Called for each candidate, most recent first; returns false to stop the walk. */
typedef bool (*cache_candidate_fn)(void *ctx, const struct candidate *cand);

/* The candidates of the RAM pool for id placing toks[0..n) (DESIGN.md §4): one walk for
 * requests and predictions. c->req_fp must hold the fingerprint of toks[0..n).
 * Returns how many were compared. */
size_t cache_candidates(struct cache *c, const struct cache_ident *id, const int32_t *toks, size_t n,
                        cache_candidate_fn visit, void *ctx);

/* The disk tier's best candidate for id (nominated by the same rule, decided by the
 * stored token list); idx = -1 when none offers anything or the tier is off. The caller
 * holds disk_lock until it has loaded idx (the writer thread changes the index). */
struct disk_choice {
    long idx;
    struct plan_resume res;
    bool by_fp;
};
struct disk_choice cache_disk_best(struct cache *c, const struct cache_ident *id, const int32_t *toks, size_t n);
/* The best resume point among peers' writes in flight (disk_wip_at; no refresh, no
 * stats): idx indexes disk_wip_at. The caller holds disk_lock. */
struct disk_choice cache_disk_wip_best(struct cache *c, const struct cache_ident *id, const int32_t *toks, size_t n);

#endif
