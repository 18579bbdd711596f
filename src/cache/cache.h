/* Conversation reuse: parked sessions, checkpoints, affinity, and the planner
 * (DESIGN.md §3-§4). "Identity nominates, bytes decide."
 *
 * The server's engine worker brackets every request with cache_acquire() and
 * cache_release(). In between it owns the lease's session exclusively: it primes
 * P[r..m) (passing the lease's checkpoint plan to tern_session_eval, whose checkpoints
 * go to cache_on_checkpoint), decodes, and then releases, which parks the session
 * under the request's key. The cache is used from the engine worker thread only
 * (its stats can be read from any thread); with the disk tier it runs a writer thread of
 * its own (cache_free waits for its queued writes). */
#ifndef TERN_CACHE_H
#define TERN_CACHE_H

#include "cache/planner.h"
#include "tern.h"
#include "util/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cache;
struct tern_mtp;

#define CACHE_MAX_TENANT_STATS 16
#define CACHE_MAX_ROLES 16
#define CACHE_ROLE_MAX_TOKENS 24 /* a header read byte by byte fits (a small vocabulary) */

/* One rule of the role map: a turn plays `role` when the tokens right after its
 * turn-start token begin with toks[0..n). The checkpoint plan needs the roles (the turn
 * after the latest real user message, the end of a system prompt, DESIGN.md §4); the
 * cache learns them from these ids only and never reads token text: which header means
 * which role is the chat template's business, so the server builds the map
 * (chat_role_map in server/chat.h). */
struct cache_role_rule {
    int32_t toks[CACHE_ROLE_MAX_TOKENS];
    uint32_t n;               /* 1..CACHE_ROLE_MAX_TOKENS */
    enum plan_role role;
};

struct cache_params {
    struct tern_session_params session; /* for sessions the cache creates */
    size_t ram_bytes;        /* --cache-ram: budget over all parked state */
    /* --cache-ram-per-key: a tenant's fair share of ram_bytes (0 = none). When the
     * budget forces an eviction, a tenant over its share loses its least recently used
     * state first, so that one API key filling the pool evicts itself, not the others.
     * A tenant is the API key part of the namespace ("key3" of "key3/salt:x"): salts
     * are the client's choice and share their key's share. */
    size_t ram_per_tenant;
    uint32_t max_ckpts;      /* --prompt-cache: checkpoints per session (0 = none) */
    uint32_t ckpt_every;     /* --prompt-cache-every: periodic checkpoint spacing */
    int32_t turn_token;      /* --turn-token: id of the turn-start control token, -1 = none */
    /* The role map: the longest matching rule wins; no rule matches = PLAN_ROLE_OTHER.
     * Empty (n_roles = 0): every turn is OTHER (the plan keeps its end, boundary and
     * periodic points only). */
    struct cache_role_rule roles[CACHE_MAX_ROLES];
    uint32_t n_roles;
    bool affinity;           /* TERN_AFFINITY (fingerprint nomination) */
    bool pool;               /* TERN_REUSE_POOL (parked sessions beyond the live one) */
    bool ckpt_reread;        /* TERN_CKPT_REREAD: re-read instead of restoring */
    const char *disk_dir;    /* --cache-dir: the disk tier (disk.h); NULL = off */
    uint64_t disk_bytes;     /* --cache-disk: its byte budget */
    uint32_t peer_wait_ms;   /* --cache-peer-wait: the longest wait for a peer's write in flight
                              * (0 = auto: while waiting costs less than reading what it saves) */
};

enum cache_key_kind { CACHE_KEY_NONE = 0, CACHE_KEY_EXPLICIT = 1 };

/* Who is asking: the tenant namespace (API key or cache_salt; "" = default) and the
 * session key (body session_id > prompt_cache_key > user > header x-session-id). */
struct cache_ident {
    const char *tenant;
    const char *key;        /* NULL or "" = unnamed */
    uint32_t waited_ms;     /* the request waited this long for a write in flight (logged) */
};

enum cache_tier {
    CACHE_TIER_COLD = 0,
    CACHE_TIER_LIVE,        /* the live session's end extended */
    CACHE_TIER_PREFIX,      /* a rewind of an attention-only session / prefix probe */
    CACHE_TIER_CHECKPOINT,  /* a restored checkpoint (hybrid) */
    CACHE_TIER_AFFINITY,    /* a session nominated by the structural fingerprint */
    CACHE_TIER_PREDICTED,   /* a checkpoint primed ahead of time (predictive priming) */
    CACHE_TIER_DISK,        /* a conversation restored from the disk tier (--cache-dir) */
    CACHE_TIER_COUNT
};
const char *cache_tier_name(enum cache_tier t);

/* The decision for one request, reported in the log line, metrics and the response. */
struct cache_decision {
    enum cache_tier tier;
    uint32_t cached;        /* tokens not read again (the resume point r) */
    uint32_t read;          /* tokens to prime: m - r */
    bool key_explicit;      /* the request named a session key */
    bool key_implicit;      /* the winner was nominated by the fingerprint */
    uint32_t waited_ms;     /* cache_ident.waited_ms */
    char reason[160];       /* why (e.g. "history diverged at 12233 of checkpoint 12234") */
};

struct cache_lease {
    struct tern_session *session;  /* positioned at r: tokens[0..r) == prompt[0..r) */
    struct cache_decision decision;
    uint32_t *ckpt_pos;            /* checkpoint plan for priming prompt[r..m) */
    size_t n_ckpt;
    void *priv;                    /* the cache's bookkeeping */
};

/* With p->disk_dir (and the pool on) the disk tier is opened: its index is rebuilt from
 * the directory; an unusable directory is an error. A role map with more than
 * CACHE_MAX_ROLES rules or a rule of 0 or more than CACHE_ROLE_MAX_TOKENS ids is
 * TERN_ERR_INVALID. */
/* The defaults every command starts from (tern serve's and tern chat's): a 4096 MiB RAM
 * budget, 16 GiB on disk when a directory is given, 8 checkpoints per session every 4096
 * tokens, no turn token, nomination and parking on. */
void cache_params_default(struct cache_params *p);
enum tern_status cache_new(struct tern_model *m, const struct cache_params *p, struct cache **out);
void cache_free(struct cache *c);

/* Picks the state to resume from for prompt[0..m) and positions a session at r.
 * On error no state is lost (the candidates stay parked). */
enum tern_status cache_acquire(struct cache *c, const struct cache_ident *id, const int32_t *prompt,
                               size_t m, struct cache_lease *out);
/* The disk tier writes parked conversations on a thread of its own (cache.c: the
 * pinning rule). A request that would resume a conversation in place while its write is
 * queued or running waits for the write: cache_acquire waits in the caller's thread, at
 * most CACHE_PIN_WAIT_MS, then leaves that conversation alone (reads from elsewhere or
 * cold). A caller that must not wait (the engine: other streams run in its thread) asks
 * cache_write_pending first and keeps only that request back until it is false, then
 * calls cache_acquire_flags with CACHE_ACQUIRE_NOWAIT. */
#define CACHE_PIN_WAIT_MS 30000u
enum { CACHE_ACQUIRE_NOWAIT = 1u << 0 };
enum tern_status cache_acquire_flags(struct cache *c, const struct cache_ident *id, const int32_t *prompt,
                                     size_t m, unsigned flags, struct cache_lease *out);
/* Replicas sharing the directory: a request whose best resume point would be a peer's
 * write in flight (disk.h: markers) is pending too (w->peer, w->gain: the tokens the
 * write would save it over what it can resume from now); how long to wait for it is the
 * caller's choice (the engine: while waiting costs less than reading the gain). A
 * writer that died is never waited for. w may be NULL. */
struct cache_wait {
    bool peer;
    uint32_t gain;
};
bool cache_write_pending(struct cache *c, const struct cache_ident *id, const int32_t *prompt, size_t m,
                         struct cache_wait *w);
/* Parks the MTP head (model/mtp.h; its row 0 at main position base) with the lease's
 * conversation, replacing what it held; taken over (freed when the conversation goes),
 * counted in the pool, written with the conversation by the disk tier. Call it before
 * the release. */
void cache_lease_park_head(struct cache_lease *lease, struct tern_mtp *h, uint32_t base);
/* The head parked with the conversation this lease resumed — in place in RAM (its own
 * lineage, not a fork) or from the disk tier (its rows below the resume point); the
 * caller owns it. NULL: none. */
struct tern_mtp *cache_lease_take_head(struct cache_lease *lease, uint32_t *base);
/* Announces the write that releasing this lease will make (replicas: disk.h markers),
 * with the session's tokens as they are now; call it before the response's last byte,
 * after the last change to the session. Without a disk tier it does nothing. */
enum tern_status cache_announce(struct cache *c, struct cache_lease *lease);
/* Waits for every queued disk write (tests, benchmarks). */
void cache_flush(struct cache *c);
/* Waits until a disk write of this cache finishes, at most ms (a peer's write is not
 * signalled: the caller polls cache_write_pending after it). */
void cache_wait_write(struct cache *c, unsigned ms);
/* Tests only: while held, queued disk writes wait (a write "in flight" for as long as a
 * test needs); cache_free writes them anyway. */
void cache_test_hold_writes(struct cache *c, bool hold);

/* tern_eval_opts.on_ckpt target (ckpt_user = the lease). */
void cache_on_checkpoint(void *lease, struct tern_checkpoint *ckpt);
/* Parks the session (prompt + generated tokens) under the request's key. ok = false
 * when the request failed in a way that leaves the state unusable: it is dropped. */
void cache_release(struct cache *c, struct cache_lease *lease, bool ok);
/* A leased session grew (its prompt or reply took new KV pages): parked state that is not
 * leased is evicted, least recently used first, until the pool (leased sessions
 * included) fits the budget again. Leased sessions are never touched, so running ones
 * alone may still exceed it. */
void cache_fit(struct cache *c);
/* Room in a leased session s for n more tokens (tern_session_reserve). On a device, when
 * its memory has no room for the KV pages, parked sessions that are not leased give way,
 * least recently used first (kept on disk with a disk tier, logged), until they fit or
 * none is left (TERN_ERR_NOMEM then, with the sizes). When that took memory, cache_fit. */
enum tern_status cache_reserve(struct cache *c, struct tern_session *s, size_t n);

/* Why a candidate that was compared gave nothing (or less than its common prefix). */
enum cache_decline {
    CACHE_DECLINE_DIVERGED = 0, /* the history diverged below every resume point it had */
    CACHE_DECLINE_MISMATCH,     /* nominated (by key or fingerprint) but no common prefix */
    CACHE_DECLINE_COUNT
};
const char *cache_decline_name(enum cache_decline d);

/* Predictive priming (idle time after a response): prime the predicted prefix of the
 * next request, toks[0..n) — rendered by the server with the model's own template —
 * from the longest valid resume point of the conversation's state, as a separate
 * entry of the same lineage, tagged predicted. marks: extra checkpoint positions
 * (e.g. where the request's own messages end). The worker primes
 * toks[decision.cached..n) with lease.ckpt_pos (cancellable between chunks: a partial
 * prediction is still valid at its end) and calls cache_predict_end. A later request
 * uses it only where its bytes equal the prompt's; a wrong prediction costs idle
 * compute, never a wrong answer.
 * Returns TERN_ERR_STATE when there is nothing worth priming (no state of the
 * conversation to build on, or the prediction is already covered). */
enum tern_status cache_predict_begin(struct cache *c, const struct cache_ident *id, const int32_t *toks, size_t n,
                                     const uint32_t *marks, size_t n_marks, struct cache_lease *out);
void cache_predict_end(struct cache *c, struct cache_lease *lease, bool ok);

/* Flags of cache_predict_begin_flags. */
enum {
    /* The prediction is the re-rendered history the conversation's next prediction
     * builds on. When the next request of the conversation does not use it (an
     * extension turn), it stays parked — one per conversation — instead of being
     * dropped with the rest of the lineage, and the next kept prediction that resumes
     * from it continues it in place (no copy), so each turn primes only what the turn
     * added. A kept prediction superseded that way is not counted as wasted. */
    CACHE_PREDICT_KEEP = 1u << 0,
};
/* cache_predict_begin with flags (cache_predict_begin = flags 0). */
enum tern_status cache_predict_begin_flags(struct cache *c, const struct cache_ident *id, const int32_t *toks,
                                           size_t n, const uint32_t *marks, size_t n_marks, unsigned flags,
                                           struct cache_lease *out);

struct cache_stats {
    uint64_t requests_by_tier[CACHE_TIER_COUNT];
    uint64_t declines;          /* candidates compared and refused */
    uint64_t declines_by_reason[CACHE_DECLINE_COUNT];
    uint64_t candidates;        /* candidates compared */
    uint64_t tokens_cached;
    uint64_t tokens_read;
    uint64_t evictions;         /* whole sessions evicted for the budget */
    uint64_t quota_evictions;   /* of those, sessions of a tenant over --cache-ram-per-key */
    uint64_t ckpt_evictions;    /* checkpoints dropped (retention or budget) */
    uint64_t ckpts_made;
    uint64_t forks;             /* resumes that copied another conversation's prefix */
    uint64_t predictions_made;  /* predicted prefixes primed (fully or partly) */
    uint64_t predictions_used;  /* ... that a later request resumed from */
    uint64_t predictions_wasted;/* ... dropped unused (wrong, superseded or evicted) */
    uint64_t predict_tokens;    /* tokens primed speculatively (idle compute spent) */
    size_t pool_bytes;
    uint32_t n_sessions;
    uint32_t n_checkpoints;
    /* the disk tier (all zero when off) */
    bool disk_on;
    uint64_t disk_writes, disk_write_bytes, disk_write_errors;
    uint64_t disk_loads, disk_load_bytes, disk_invalid, disk_evictions;
    uint64_t disk_bytes;
    uint32_t disk_entries;
    /* the pool by tenant (API key part of the namespace, see ram_per_tenant), the
     * largest CACHE_MAX_TENANT_STATS; id is a hash of the tenant (never the key) */
    struct cache_tenant_stat {
        uint64_t id;
        size_t bytes;
        uint32_t sessions;
    } tenants[CACHE_MAX_TENANT_STATS];
    uint32_t n_tenants;
};
void cache_get_stats(const struct cache *c, struct cache_stats *out);

#endif
