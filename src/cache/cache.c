/* The session pool and the reuse planner's glue (DESIGN.md §3-§4).
 *
 * Entries are conversations: a session (its state holds T[0..n)) plus the checkpoints
 * taken in its lineage, parked under (tenant, key). Candidates for a request are
 * nominated by identity (candidates.c) — the same explicit key, or for unnamed requests
 * the structural fingerprint and a token-prefix probe over the most recent unnamed
 * entries — and the decision is made by bytes only (planner.c). cache_acquire and
 * cache_predict_begin_flags read as DESIGN.md §4's steps: candidates, decision, plan,
 * lease. A conversation that
 * resumes from its own entry replaces it (one lineage per conversation); a request that
 * merely shares a prefix with another conversation gets a copy (a fork), so the other
 * conversation keeps its state. */
#include "cache/cache-impl.h"
#include "model/mtp.h"

#include "tokenizer/tokenizer.h"
#include "util/testhook.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <malloc.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct lease_priv {
    struct cache *c;
    struct entry *e;
    struct plan_point plan[MAX_PLAN];
    size_t n_plan;
    uint32_t plan_pos[MAX_PLAN];
    struct ckpt_entry pending[MAX_PLAN];
    size_t n_pending;
    bool in_place;              /* a prediction that continues a kept one */
    bool own_state;             /* the request resumed its entry in place (RAM) or from its file */
};

const char *cache_tier_name(enum cache_tier t) {
    switch (t) {
    case CACHE_TIER_COLD: return "cold";
    case CACHE_TIER_LIVE: return "live";
    case CACHE_TIER_PREFIX: return "prefix";
    case CACHE_TIER_CHECKPOINT: return "checkpoint";
    case CACHE_TIER_AFFINITY: return "affinity";
    case CACHE_TIER_PREDICTED: return "predicted";
    case CACHE_TIER_DISK: return "disk";
    case CACHE_TIER_COUNT: break;
    }
    return "?";
}

const char *cache_decline_name(enum cache_decline d) {
    switch (d) {
    case CACHE_DECLINE_DIVERGED: return "diverged";
    case CACHE_DECLINE_MISMATCH: return "mismatch";
    case CACHE_DECLINE_COUNT: break;
    }
    return "?";
}

/* ---- entries and the LRU list ------------------------------------------------------- */

static void lru_unlink(struct cache *c, struct entry *e) {
    if (e->prev) e->prev->next = e->next;
    else c->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_head(struct cache *c, struct entry *e) {
    e->prev = NULL;
    e->next = c->head;
    if (c->head) c->head->prev = e;
    c->head = e;
    if (!c->tail) c->tail = e;
}

static void ck_drop(struct entry *e, size_t i) {
    e->ck_bytes -= e->ck[i].ck ? tern_checkpoint_bytes(e->ck[i].ck) : 0;
    tern_checkpoint_free(e->ck[i].ck);
    memmove(e->ck + i, e->ck + i + 1, (e->n_ck - i - 1) * sizeof *e->ck);
    e->n_ck--;
}

/* Inserts ce into e's ascending checkpoint list (its bytes counted). False when out of
 * memory: e is unchanged and ce still belongs to the caller. */
static bool ck_insert(struct entry *e, struct ckpt_entry ce) {
    if (e->n_ck == e->cap_ck) {
        size_t cap = e->cap_ck ? e->cap_ck * 2 : 8;
        struct ckpt_entry *p = tern_reallocarray(e->ck, cap, sizeof *p);
        if (!p) return false;
        e->ck = p;
        e->cap_ck = cap;
    }
    size_t j = plan_insert_slot(e->ck, e->n_ck, sizeof *e->ck, offsetof(struct ckpt_entry, pos), ce.pos);
    e->ck[j] = ce;
    e->n_ck++;
    e->ck_bytes += ce.ck ? tern_checkpoint_bytes(ce.ck) : 0;
    return true;
}

static void head_drop(struct entry *e) {
    tern_mtp_free(e->head);
    e->head = NULL;
    e->head_base = 0;
}

void cache_entry_free(struct entry *e) {
    if (!e) return;
    head_drop(e);
    for (size_t i = 0; i < e->n_ck; i++) tern_checkpoint_free(e->ck[i].ck);
    free(e->ck);
    fp_free(&e->fp);
    tern_session_free(e->s);
    free(e->tenant);
    free(e->key);
    free(e);
}

static size_t entry_bytes(const struct entry *e) {
    return tern_session_bytes(e->s) + e->ck_bytes + e->n_ck * sizeof *e->ck + (e->head ? tern_mtp_bytes(e->head) : 0);
}

static enum tern_status entry_new(struct cache *c, const struct cache_ident *id, struct tern_session *s,
                                  uint64_t lineage, struct entry **out) {
    struct entry *e = tern_calloc(1, sizeof *e);
    if (!e) return tern_errorf(TERN_ERR_NOMEM, "cache: out of memory for a session entry");
    e->tenant = tern_strdup(id->tenant ? id->tenant : "");
    e->key = id->key && *id->key ? tern_strdup(id->key) : NULL;
    if (!e->tenant || (id->key && *id->key && !e->key)) {
        free(e->tenant);
        free(e->key);
        free(e);
        return tern_errorf(TERN_ERR_NOMEM, "cache: out of memory for a session key");
    }
    e->s = s;
    e->lineage = lineage ? lineage : ++c->next_lineage;
    lru_push_head(c, e);
    c->n_entries++;
    *out = e;
    return TERN_OK;
}

static void entry_remove(struct cache *c, struct entry *e) {
    if (e->predicted) {
        pthread_mutex_lock(&c->stats_mu);
        c->stats.predictions_wasted++;
        pthread_mutex_unlock(&c->stats_mu);
    }
    lru_unlink(c, e);
    c->n_entries--;
    /* pinned: out of the pool now, freed by the writer when its write is done */
    pthread_mutex_lock(&c->wmu);
    const bool pinned = e->pinned;
    if (pinned) e->doomed = true;
    pthread_mutex_unlock(&c->wmu);
    if (!pinned) cache_entry_free(e);
}

/* ---- stats ------------------------------------------------------------------------ */

static size_t quota_len(const char *t);

static void stats_update_pool(struct cache *c) {
    size_t bytes = 0;
    uint32_t n_ck = 0;
    /* by tenant: the first 4 * CACHE_MAX_TENANT_STATS distinct ones, the largest kept */
    struct cache_tenant_stat ts[4 * CACHE_MAX_TENANT_STATS];
    uint32_t n_ts = 0;
    for (struct entry *e = c->head; e; e = e->next) {
        size_t eb = entry_bytes(e);
        bytes += eb;
        n_ck += (uint32_t)e->n_ck;
        const char *t = e->tenant ? e->tenant : "";
        uint64_t id = tern_hash64(t, quota_len(t));
        uint32_t k = 0;
        while (k < n_ts && ts[k].id != id) k++;
        if (k == n_ts) {
            if (n_ts == TERN_ARRAY_LEN(ts)) continue;
            ts[n_ts++] = (struct cache_tenant_stat){.id = id};
        }
        ts[k].bytes += eb;
        ts[k].sessions++;
    }
    for (uint32_t i = 1; i < n_ts; i++) /* largest first (insertion sort: few) */
        for (uint32_t j = i; j > 0 && ts[j].bytes > ts[j - 1].bytes; j--) {
            struct cache_tenant_stat x = ts[j];
            ts[j] = ts[j - 1];
            ts[j - 1] = x;
        }
    pthread_mutex_lock(&c->stats_mu);
    c->stats.n_tenants = n_ts < CACHE_MAX_TENANT_STATS ? n_ts : CACHE_MAX_TENANT_STATS;
    memcpy(c->stats.tenants, ts, c->stats.n_tenants * sizeof *ts);
    c->stats.pool_bytes = bytes;
    c->stats.n_sessions = (uint32_t)c->n_entries;
    c->stats.n_checkpoints = n_ck;
    pthread_mutex_unlock(&c->stats_mu);
}

void cache_get_stats(const struct cache *c, struct cache_stats *out) {
    pthread_mutex_lock((pthread_mutex_t *)&c->stats_mu);
    *out = c->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&c->stats_mu);
}

/* ---- budget ------------------------------------------------------------------------ */

static size_t pool_bytes(const struct cache *c) {
    size_t bytes = 0;
    for (const struct entry *e = c->head; e; e = e->next) bytes += entry_bytes(e);
    return bytes;
}

/* Evicts least recently used entries (never a leased one) until the pool fits the
 * budget; when only leased or the newest entry remain, their least valuable
 * checkpoints go. The freed memory is handed back to the system so the budget holds
 * as the process's memory, not only as counters. */
/* The quota group of a tenant namespace: its API key part (see ram_per_tenant). */
static size_t quota_len(const char *t) {
    if (!t) return 0;
    const char *sl = strstr(t, "salt:");
    size_t n = sl ? (size_t)(sl - t) : strlen(t);
    if (n && t[n - 1] == '/') n--;
    return n;
}

static bool same_quota(const char *a, const char *b) {
    size_t na = quota_len(a), nb = quota_len(b);
    return na == nb && (na == 0 || !memcmp(a, b, na));
}

static size_t quota_bytes(const struct cache *c, const char *tenant) {
    size_t bytes = 0;
    for (const struct entry *e = c->head; e; e = e->next)
        if (same_quota(e->tenant, tenant)) bytes += entry_bytes(e);
    return bytes;
}

static void enforce_budget(struct cache *c, size_t extra) {
    bool freed = false;
    size_t budget = c->p.ram_bytes;
    while (pool_bytes(c) + extra > budget) {
        struct entry *victim = NULL;
        /* a tenant over its share goes first (least recently used of its entries) */
        for (struct entry *e = c->tail; e && c->p.ram_per_tenant; e = e->prev) {
            if (!e->leased && e != c->head && quota_bytes(c, e->tenant) > c->p.ram_per_tenant &&
                !cache_entry_pinned(c, e)) {
                victim = e;
                STAT_ADD(c, quota_evictions, 1);
                break;
            }
        }
        for (struct entry *e = c->tail; e && !victim; e = e->prev) {
            if (!e->leased && e != c->head && !cache_entry_pinned(c, e)) {
                victim = e;
                break;
            }
        }
        if (victim) {
            TERN_LOG_INFO("reuse: evicted session (key=%s, %u tokens, %zu bytes) for the %zu MiB budget%s",
                          victim->key ? victim->key : "-", tern_session_n_past(victim->s), entry_bytes(victim),
                          budget >> 20, c->disk && !victim->predicted ? " (kept on disk)" : "");
            /* written ahead when it was parked; again only if that write failed (queued:
             * out of the pool now, freed when written) */
            if (cache_entry_dirty(c, victim)) cache_disk_park(c, victim);
            entry_remove(c, victim);
            STAT_ADD(c, evictions, 1);
            freed = true;
            continue;
        }
        /* Only the newest/leased/pinned entries are left: drop checkpoints, oldest first
         * (never a pinned entry's: the writer reads them). */
        struct entry *e = c->tail;
        while (e && (e->n_ck == 0 || cache_entry_pinned(c, e))) e = e->prev;
        if (!e) break;
        size_t oldest = 0;
        for (size_t i = 1; i < e->n_ck; i++)
            if (e->ck[i].stamp < e->ck[oldest].stamp) oldest = i;
        ck_drop(e, oldest);
        STAT_ADD(c, ckpt_evictions, 1);
        freed = true;
    }
    if (freed) malloc_trim(0);
    stats_update_pool(c);
}

void cache_fit(struct cache *c) {
    enforce_budget(c, 0);
}

/* ---- turns ------------------------------------------------------------------------ */

/* The role of the turn whose turn-start token is toks[i]: the longest rule of the role
 * map (cache_params.roles) that the tokens after it begin with. Ids only: the cache
 * never reads token text. */
static enum plan_role turn_role(const struct cache *c, const int32_t *toks, size_t n, size_t i) {
    enum plan_role role = PLAN_ROLE_OTHER;
    uint32_t longest = 0;
    for (uint32_t k = 0; k < c->p.n_roles; k++) {
        const struct cache_role_rule *rule = &c->p.roles[k];
        if (rule->n <= longest || rule->n > n - i - 1) continue;
        if (!memcmp(toks + i + 1, rule->toks, rule->n * sizeof *toks)) {
            longest = rule->n;
            role = rule->role;
        }
    }
    return role;
}

static size_t find_turns(struct cache *c, const int32_t *toks, size_t n) {
    size_t k = 0;
    if (c->p.turn_token < 0) return 0;
    for (size_t i = 0; i < n; i++) {
        if (toks[i] != c->p.turn_token) continue;
        if (k == c->cap_turns) {
            size_t cap = c->cap_turns ? c->cap_turns * 2 : 64;
            struct plan_turn *t = tern_reallocarray(c->turns, cap, sizeof *t);
            if (!t) return k; /* a shorter plan, not an error */
            c->turns = t;
            c->cap_turns = cap;
        }
        c->turns[k].pos = (uint32_t)i;
        c->turns[k].role = turn_role(c, toks, n, i);
        k++;
    }
    return k;
}

/* ---- construction -------------------------------------------------------------------- */

void cache_params_default(struct cache_params *p) {
    memset(p, 0, sizeof *p);
    tern_session_params_default(&p->session);
    p->ram_bytes = (size_t)4096 << 20;
    p->disk_bytes = (uint64_t)16 << 30;
    p->max_ckpts = 8;
    p->ckpt_every = 4096;
    p->turn_token = -1;
    p->affinity = true;
    p->pool = true;
}

enum tern_status cache_new(struct tern_model *m, const struct cache_params *p, struct cache **out) {
    *out = NULL;
    if (p->n_roles > CACHE_MAX_ROLES)
        return tern_errorf(TERN_ERR_INVALID, "cache: a role map of %u rules (at most %u)", p->n_roles, CACHE_MAX_ROLES);
    for (uint32_t i = 0; i < p->n_roles; i++)
        if (p->roles[i].n == 0 || p->roles[i].n > CACHE_ROLE_MAX_TOKENS)
            return tern_errorf(TERN_ERR_INVALID, "cache: role rule %u has %u tokens (1 to %u)", i, p->roles[i].n,
                               CACHE_ROLE_MAX_TOKENS);
    struct cache *c = tern_calloc(1, sizeof *c);
    if (!c) return tern_errorf(TERN_ERR_NOMEM, "cache: out of memory");
    c->model = m;
    c->p = *p;
    const struct tern_tokenizer *tok = tern_model_tokenizer(m);
    const struct tern_model_info *info = tern_model_info(m);
    c->hybrid = info->hybrid;
    uint32_t n_vocab = info->n_vocab;
    c->sep_bits = tern_calloc(n_vocab / 8 + 1, 1);
    if (!c->sep_bits) {
        free(c);
        return tern_errorf(TERN_ERR_NOMEM, "cache: out of memory");
    }
    /* Segment separators: the vocabulary's control tokens (turn markers). */
    if (tok) {
        for (uint32_t i = 0; i < n_vocab && i < tern_tokenizer_n_vocab(tok); i++)
            if (tern_token_is_control(tok, (int32_t)i)) c->sep_bits[i >> 3] |= (uint8_t)(1u << (i & 7));
    }
    if (p->turn_token >= 0 && (uint32_t)p->turn_token < n_vocab)
        c->sep_bits[(uint32_t)p->turn_token >> 3] |= (uint8_t)(1u << ((uint32_t)p->turn_token & 7));
    c->sep.bits = c->sep_bits;
    c->sep.n_vocab = n_vocab;
    pthread_mutex_init(&c->stats_mu, NULL);
    pthread_mutex_init(&c->wmu, NULL);
    pthread_cond_init(&c->wcv, NULL);
    pthread_cond_init(&c->done_cv, NULL);
    if (p->disk_dir && *p->disk_dir) {
        if (!p->pool) {
            /* TERN_REUSE_POOL=0 keeps only the live session: nothing is parked, so nothing
             * is written (the directory is not even opened). */
            TERN_LOG_INFO("reuse: the disk tier is off: TERN_REUSE_POOL=0 parks nothing");
        } else {
            struct disk_params dp = {
                .dir = p->disk_dir, .max_bytes = p->disk_bytes, .model = m, .session = p->session, .sep = &c->sep};
            const char *delay = tern_test_hook("TERN_TEST_DISK_DELAY_MS");
            if (delay && *delay) dp.test_block_delay_ms = (unsigned)strtoul(delay, NULL, 10);
            enum tern_status st = disk_open(&dp, &c->disk);
            if (st) {
                cache_free(c);
                return st;
            }
            cache_disk_stats_update(c);
            /* TERN_DISK_WRITER=0: the rollback, writes in the caller's thread as before */
            const char *w = getenv("TERN_DISK_WRITER");
            if (w && !strcmp(w, "0"))
                TERN_LOG_INFO("reuse: TERN_DISK_WRITER=0: the disk tier writes in the worker, between steps");
            else if (strcmp(tern_model_device(m), "cpu"))
                /* a device session's rows are downloaded through the device's one queue,
                 * which the worker's evaluations use: from the worker only */
                TERN_LOG_INFO("reuse: sessions on %s: the disk tier writes in the worker, between steps",
                              tern_model_device(m));
            else cache_writer_start(c);
        }
    }
    *out = c;
    return TERN_OK;
}

void cache_free(struct cache *c) {
    if (!c) return;
    cache_writer_stop(c); /* the queued writes finish first: they read entries freed below */
    while (c->head) entry_remove(c, c->head);
    disk_free(c->disk);
    fp_free(&c->req_fp);
    free(c->turns);
    free(c->sep_bits);
    pthread_mutex_destroy(&c->stats_mu);
    pthread_mutex_destroy(&c->wmu);
    pthread_cond_destroy(&c->wcv);
    pthread_cond_destroy(&c->done_cv);
    free(c);
}

/* ---- acquire ------------------------------------------------------------------------ */

/* Where the candidate's checkpoint for position r sits (or -1). */
static long find_ck(const struct entry *e, uint32_t r) {
    for (size_t i = 0; i < e->n_ck; i++)
        if (e->ck[i].pos == r) return (long)i;
    return -1;
}

/* Moves o's checkpoints that are valid for e (at or below their common prefix and e's
 * end, at a position e has none) into e. o is about to be removed. */
static void inherit_checkpoints(struct cache *c, struct entry *e, struct entry *o) {
    if (cache_entry_pinned(c, o)) return; /* the writer reads them; they go with o */
    size_t lcp = plan_lcp(tern_session_tokens(o->s), tern_session_n_past(o->s), tern_session_tokens(e->s),
                          tern_session_n_past(e->s));
    for (size_t i = 0; i < o->n_ck;) {
        struct ckpt_entry ce = o->ck[i];
        if (ce.pos > lcp || find_ck(e, ce.pos) >= 0) {
            i++;
            continue;
        }
        if (!ck_insert(e, ce)) return; /* fewer checkpoints, not an error */
        o->ck_bytes -= ce.ck ? tern_checkpoint_bytes(ce.ck) : 0;
        memmove(o->ck + i, o->ck + i + 1, (o->n_ck - i - 1) * sizeof *o->ck);
        o->n_ck--;
    }
}

/* On a device (tern_model_use_device) the sessions' states may fill the device's memory
 * before the RAM budget: the least recently used parked session that is not leased gives
 * way (kept on disk when there is a disk tier). False when none is left, or on the CPU. */
static bool evict_for_device(struct cache *c) {
    if (!strcmp(tern_model_device(c->model), "cpu")) return false;
    struct entry *victim = NULL;
    for (struct entry *e = c->tail; e && !victim; e = e->prev)
        if (!e->leased) victim = e;
    if (!victim) return false;
    TERN_LOG_INFO("reuse: evicted session (key=%s, %u tokens, %zu bytes) for device memory (%s)",
                  victim->key ? victim->key : "-", tern_session_n_past(victim->s), entry_bytes(victim),
                  tern_last_error());
    if (victim->disk_dirty) cache_disk_park(c, victim);
    entry_remove(c, victim);
    STAT_ADD(c, evictions, 1);
    return true;
}

static enum tern_status new_session(struct cache *c, struct tern_session **out) {
    enum tern_status st = tern_session_new(c->model, &c->p.session, out);
    while (st == TERN_ERR_NOMEM && evict_for_device(c)) st = tern_session_new(c->model, &c->p.session, out);
    return st;
}

enum tern_status cache_reserve(struct cache *c, struct tern_session *s, size_t n) {
    const size_t b0 = tern_session_bytes(s);
    enum tern_status st = tern_session_reserve(s, n);
    while (st == TERN_ERR_NOMEM && evict_for_device(c)) st = tern_session_reserve(s, n);
    if (!st && tern_session_bytes(s) > b0) cache_fit(c);
    return st;
}

/* Re-reads prompt[0..r) into a fresh session (TERN_CKPT_REREAD=1: proves that a
 * restored checkpoint equals a re-read). */
static enum tern_status reread(struct cache *c, const int32_t *prompt, uint32_t r, struct tern_session **out) {
    enum tern_status st = new_session(c, out);
    if (st) return st;
    st = tern_session_eval(*out, prompt, r, NULL);
    if (st) {
        tern_session_free(*out);
        *out = NULL;
    }
    return st;
}

/* Restores the disk tier's candidate as a new entry positioned at its resume point,
 * with its checkpoints at or below it. RAM copies of the same conversation (older: the
 * file offered more) give way. On error nothing changed in RAM (a file that did not
 * verify is gone). Called with disk_lock held (dc->idx was chosen under it): released
 * once the file is loaded. */
static enum tern_status disk_resume(struct cache *c, const struct cache_ident *id, const struct disk_choice *dc,
                                    struct entry **out, struct cache_decision *d) {
    const char *tenant = id->tenant ? id->tenant : "";
    const struct disk_entry *de = disk_at(c->disk, (size_t)dc->idx);
    const bool named = de->key != NULL;
    uint8_t nonce[DISK_NONCE_BYTES];
    memcpy(nonce, de->nonce, sizeof nonce);
    const uint32_t r = dc->res.r;
    struct tern_session *s = NULL;
    struct tern_checkpoint **cks = NULL;
    uint32_t *kinds = NULL;
    size_t n_cks = 0;
    const uint64_t t0 = tern_now_ns();
    struct disk_mtp head = {0};
    enum tern_status st = disk_load(c->disk, (size_t)dc->idx, r, tenant, &s, &cks, &kinds, &n_cks, &head);
    disk_unlock(c->disk);
    cache_disk_stats_update(c);
    if (st) return st;
    for (struct entry *o = c->head, *nx; o; o = nx) {
        nx = o->next;
        if (o->leased || !cache_same_str(o->tenant, tenant)) continue;
        if (named ? (o->key && !strcmp(o->key, id->key))
                  : (!o->key && o->has_nonce && !memcmp(o->disk_nonce, nonce, sizeof nonce)))
            entry_remove(c, o);
    }
    struct entry *e = NULL;
    st = entry_new(c, id, s, 0, &e);
    if (st) {
        for (size_t i = 0; i < n_cks; i++) tern_checkpoint_free(cks[i]);
        free(cks);
        free(kinds);
        tern_session_free(s);
        tern_mtp_free(head.h);
        return st;
    }
    e->head = head.h;
    e->head_base = head.base;
    if (!named) {
        memcpy(e->disk_nonce, nonce, sizeof nonce);
        e->has_nonce = true;
    }
    /* (after the load: on failure the caller still uses its RAM candidate, which the
     * budget must not have evicted; the new entry is the list's head, never evicted) */
    enforce_budget(c, 0);
    if (n_cks) {
        e->ck = tern_calloc(n_cks, sizeof *e->ck);
        if (e->ck) e->cap_ck = n_cks;
    }
    for (size_t i = 0; i < n_cks; i++) {
        if (!e->ck) { /* fewer checkpoints, not an error */
            tern_checkpoint_free(cks[i]);
            continue;
        }
        e->ck[e->n_ck++] = (struct ckpt_entry){
            .ck = cks[i], .pos = tern_checkpoint_pos(cks[i]), .kinds = kinds[i], .stamp = c->clock};
        e->ck_bytes += tern_checkpoint_bytes(cks[i]);
    }
    free(cks);
    free(kinds);
    snprintf(d->reason, sizeof d->reason, "restored from the disk tier with %zu checkpoints in %.1f ms", e->n_ck,
             (double)(tern_now_ns() - t0) * 1e-6);
    *out = e;
    return TERN_OK;
}

static void log_decision(const struct cache_decision *d) {
    char waited[32] = "";
    if (d->waited_ms) snprintf(waited, sizeof waited, " waited=%ums", d->waited_ms);
    if (d->tier == CACHE_TIER_COLD && d->reason[0])
        TERN_LOG_INFO("reuse: declined (%s) tier=cold cached=0 read=%u%s key=%s", d->reason, d->read, waited,
                      d->key_explicit ? "explicit" : "none");
    else
        TERN_LOG_INFO("reuse: tier=%s cached=%u read=%u%s key=%s%s%s%s", cache_tier_name(d->tier), d->cached,
                      d->read, waited, d->key_explicit ? "explicit" : d->key_implicit ? "implicit" : "none",
                      d->reason[0] ? " (" : "", d->reason, d->reason[0] ? ")" : "");
}

/* ---- acquire: candidates, decision, plan, lease ----------------------------------------- */

/* Drops e's checkpoints above r: their positions are about to be overwritten. */
static void drop_ckpts_above(struct cache *c, struct entry *e, uint32_t r) {
    while (e->n_ck && e->ck[e->n_ck - 1].pos > r) {
        ck_drop(e, e->n_ck - 1);
        STAT_ADD(c, ckpt_evictions, 1);
    }
}

/* TERN_REUSE_POOL=0: the live session only; every other unleased entry goes. */
static void drop_others(struct cache *c, const struct entry *keep) {
    for (struct entry *o = c->head, *nx; o; o = nx) {
        nx = o->next;
        if (o != keep && !o->leased) entry_remove(c, o);
    }
}

/* The request's decision among its candidates (DESIGN.md §4, bytes only): the best
 * resume point wins; ties go to identity (key, fingerprint), then recency (the walk is
 * most recent first). The most informative refusal is kept for the log. */
struct request_choice {
    struct candidate best;      /* best.e = NULL: none qualifies */
    struct candidate declined;
};

static bool by_identity(const struct nomination *n) { return n->by_key || n->by_fp; }

static bool choose_for_request(void *ctx, const struct candidate *cand) {
    struct request_choice *ch = ctx;
    if (cand->res.r == 0) {
        if ((by_identity(&cand->nom) || cand->res.lcp > 0) && cand->res.lcp >= ch->declined.res.lcp)
            ch->declined = *cand;
        return true;
    }
    bool better = !ch->best.e || cand->res.r > ch->best.res.r ||
                  (cand->res.r == ch->best.res.r && by_identity(&cand->nom) && !by_identity(&ch->best.nom));
    if (better) ch->best = *cand;
    return true;
}

/* "reuse: declined (...)": a refusal that offered more than the winner is explained. */
static void explain_decline(struct cache *c, const struct request_choice *ch, struct cache_decision *d) {
    const struct candidate *dc = &ch->declined;
    if (!dc->e || (ch->best.e && dc->res.lcp <= ch->best.res.r)) return;
    enum cache_decline why = dc->res.lcp > 0 ? CACHE_DECLINE_DIVERGED : CACHE_DECLINE_MISMATCH;
    if (dc->res.lcp == 0)
        snprintf(d->reason, sizeof d->reason, "%s session has no common prefix with the prompt",
                 dc->nom.by_key ? "the named" : "the nominated");
    else if (dc->res.first_unusable_ckpt)
        snprintf(d->reason, sizeof d->reason, "history diverged at %u of checkpoint %u", dc->res.lcp,
                 dc->res.first_unusable_ckpt);
    else
        snprintf(d->reason, sizeof d->reason, "history diverged at %u before any checkpoint", dc->res.lcp);
    pthread_mutex_lock(&c->stats_mu);
    c->stats.declines++;
    c->stats.declines_by_reason[why]++;
    pthread_mutex_unlock(&c->stats_mu);
}

/* The disk tier, when it offers more than RAM's best (ram_r): a restart, a peer's turn.
 * True when *out is the restored entry, positioned at *r. A failed restore is logged and
 * the request goes on with RAM or cold. */
static bool resume_from_disk(struct cache *c, const struct cache_ident *id, const int32_t *prompt, size_t m,
                             uint32_t ram_r, struct cache_decision *d, struct entry **out, uint32_t *r) {
    if (!c->disk) return false;
    /* the index stays as it is from the choice to the load (disk_resume releases it) */
    disk_lock(c->disk);
    struct disk_choice dc = cache_disk_best(c, id, prompt, m);
    if (dc.idx < 0 || dc.res.r <= ram_r) {
        disk_unlock(c->disk);
        return false;
    }
    if (disk_resume(c, id, &dc, out, d)) {
        TERN_LOG_WARN("reuse: %s; resuming from RAM or cold instead", tern_last_error());
        return false;
    }
    *r = dc.res.r;
    d->key_implicit = !d->key_explicit && dc.by_fp;
    d->tier = CACHE_TIER_DISK;
    return true;
}

/* The conversation's own entry continues at r: restored (hybrid), rewound
 * (attention-only) or re-read (TERN_CKPT_REREAD). Its lineage collapses onto it. */
static enum tern_status resume_in_place(struct cache *c, struct entry *e, const struct plan_resume *res,
                                        const struct tern_checkpoint *ck, const int32_t *prompt) {
    const uint32_t r = res->r;
    if (!res->live) {
        enum tern_status st;
        if (c->p.ckpt_reread && c->hybrid) {
            struct tern_session *fresh = NULL;
            st = reread(c, prompt, r, &fresh);
            if (!st) {
                tern_session_free(e->s);
                e->s = fresh;
            }
        } else if (c->hybrid) {
            st = tern_session_restore(e->s, ck);
        } else {
            st = tern_session_rewind(e->s, r);
        }
        if (st) return tern_error_prefix(st, "cache: resuming at %u", r);
    }
    drop_ckpts_above(c, e, r);
    if (e->predicted) {
        e->predicted = false;
        e->keep = false;
        STAT_ADD(c, predictions_used, 1);
    }
    /* One lineage per conversation: the conversation moved on from this entry, so its
     * siblings (the state it was predicted from, other predictions) are obsolete. Their
     * checkpoints below the point where they part from this entry stay valid here (a
     * prediction forked at r starts without the ones below r, e.g. the turn start after
     * the latest user message, which the next rewrite needs). */
    for (struct entry *o = c->head, *nx; o; o = nx) {
        nx = o->next;
        if (o != e && !o->leased && o->lineage == e->lineage) {
            /* ... except the kept prediction (the re-rendered history), which the
             * conversation's next prediction continues */
            if (o->keep && o->predicted) continue;
            inherit_checkpoints(c, e, o);
            /* (the conversation's parked head follows it onto a prediction; one a write is
             * reading stays and goes with its entry) */
            if (!e->head && o->head && !cache_entry_pinned(c, o)) {
                e->head = o->head;
                e->head_base = o->head_base;
                o->head = NULL;
            }
            entry_remove(c, o);
        }
    }
    if (!c->p.pool) drop_others(c, e);
    return TERN_OK;
}

/* Another conversation's prefix: a copy (fork) at r as a new entry, so that the other
 * conversation — or a wrong identity claim — never costs the original its state. The
 * copy starts its own checkpoints (the source's live in the other lineage's memory). */
static enum tern_status resume_fork(struct cache *c, const struct cache_ident *id, const struct entry *src,
                                    const struct plan_resume *res, const struct tern_checkpoint *ck,
                                    const int32_t *prompt, struct entry **out) {
    const uint32_t r = res->r;
    struct tern_session *fork = NULL;
    enum tern_status st;
    if (c->p.ckpt_reread && c->hybrid && !res->live) st = reread(c, prompt, r, &fork);
    else st = tern_session_fork(src->s, r, ck, &fork);
    if (st) return tern_error_prefix(st, "cache: copying %u tokens of another session", r);
    st = entry_new(c, id, fork, 0, out);
    if (st) {
        tern_session_free(fork);
        return st;
    }
    STAT_ADD(c, forks, 1);
    return TERN_OK;
}

/* Replace the conversation's own lineage when the request extends it entirely, when it
 * reproduces every completed turn of it (only the last, open turn — the reply — differs:
 * a retry, a re-rendered reply), or when identity nominated it (key, fingerprint) and the
 * structure confirms it (at least FP_MIN_SHARED leading segments: a compaction or a
 * template rewrite of the same conversation). Otherwise fork a copy. c->req_fp holds the
 * request's fingerprint. */
static bool resumes_in_place(struct cache *c, const struct candidate *best) {
    const struct entry *src = best->e;
    const struct plan_resume *res = &best->res;
    return res->live || res->lcp >= src->fp.open_start ||
           (by_identity(&best->nom) && fp_shared(&src->fp, &c->req_fp) >= FP_MIN_SHARED);
}

/* The request's choice when it would change an entry whose disk write is in flight
 * (in place: rewind, restore, eval); a fork only reads it. */
static struct entry *pinned_choice(struct cache *c, const struct candidate *best) {
    if (!best->e || !resumes_in_place(c, best) || !cache_entry_pinned(c, best->e)) return NULL;
    return best->e;
}

/* Resumes from the chosen RAM candidate: in place or a fork, and the tier it counts as. */
static enum tern_status resume_from_ram(struct cache *c, const struct cache_ident *id, const struct candidate *best,
                                        const int32_t *prompt, struct cache_decision *d, struct entry **out) {
    struct entry *src = best->e;
    const struct plan_resume *res = &best->res;
    const uint32_t r = res->r;
    d->key_implicit = !d->key_explicit && best->nom.by_fp;
    const bool in_place = resumes_in_place(c, best);
    long ck_i = find_ck(src, r);
    const struct tern_checkpoint *ck = (ck_i >= 0) ? src->ck[ck_i].ck : NULL;
    bool predicted = src->predicted || (ck_i >= 0 && (src->ck[ck_i].kinds & PLAN_CKPT_PREDICTED));
    enum tern_status st;
    if (in_place) {
        st = resume_in_place(c, src, res, ck, prompt);
        *out = src;
    } else {
        st = resume_fork(c, id, src, res, ck, prompt, out);
    }
    if (st) return st;
    if (predicted) d->tier = CACHE_TIER_PREDICTED;
    else if (res->live) d->tier = CACHE_TIER_LIVE;
    else if (c->hybrid) d->tier = CACHE_TIER_CHECKPOINT;
    else d->tier = CACHE_TIER_PREFIX;
    /* A parked conversation found only through its fingerprint, not the most recent one:
     * the affinity mechanism at work. */
    if (d->tier != CACHE_TIER_PREDICTED && d->key_implicit && !best->nom.by_probe) d->tier = CACHE_TIER_AFFINITY;
    return TERN_OK;
}

/* No candidate qualifies: a fresh session. Without the pool, the one live session is
 * replaced. */
static enum tern_status start_cold(struct cache *c, const struct cache_ident *id, struct cache_decision *d,
                                   struct entry **out) {
    if (!c->p.pool) drop_others(c, NULL);
    struct tern_session *s = NULL;
    enforce_budget(c, 0);
    enum tern_status st = new_session(c, &s);
    if (st) return st;
    st = entry_new(c, id, s, 0, out);
    if (st) {
        tern_session_free(s);
        return st;
    }
    d->tier = CACHE_TIER_COLD;
    return TERN_OK;
}

/* The lease: the worker owns e's session until release (or predict_end). */
static void lease_begin(struct cache *c, struct entry *e, struct lease_priv *lp, struct cache_lease *out) {
    e->leased = true;
    lru_unlink(c, e);
    lru_push_head(c, e);
    e->last_used = ++c->clock;
    lp->e = e;
    for (size_t i = 0; i < lp->n_plan; i++) lp->plan_pos[i] = lp->plan[i].pos;
    out->session = e->s;
    out->ckpt_pos = lp->plan_pos;
    out->n_ckpt = lp->n_plan;
    out->priv = lp;
}

/* The checkpoint plan of a request (hybrid models): positions in (r, m]. */
static void plan_request(struct cache *c, struct lease_priv *lp, const int32_t *prompt, uint32_t r, size_t m) {
    if (!c->hybrid || c->p.max_ckpts == 0) return;
    size_t n_turns = find_turns(c, prompt, m);
    lp->n_plan = plan_checkpoints(r, (uint32_t)m, c->turns, n_turns, c->p.ckpt_every, lp->plan, MAX_PLAN);
}

enum tern_status cache_acquire(struct cache *c, const struct cache_ident *id, const int32_t *prompt, size_t m,
                               struct cache_lease *out) {
    return cache_acquire_flags(c, id, prompt, m, 0, out);
}

/* A peer's write in flight that would give the request more than have (the best resume
 * point RAM and the disk offer now), its writer alive: *gain is the difference. */
static bool peer_pending(struct cache *c, const struct cache_ident *id, const int32_t *prompt, size_t m,
                         uint32_t have, uint32_t *gain) {
    disk_lock(c->disk);
    struct disk_choice dc = cache_disk_best(c, id, prompt, m);
    if (dc.idx >= 0 && dc.res.r > have) have = dc.res.r;
    bool pending = false;
    for (;;) {
        struct disk_choice wc = cache_disk_wip_best(c, id, prompt, m);
        if (wc.idx < 0 || wc.res.r <= have) break;
        if (disk_wip_check(c->disk, (size_t)wc.idx)) {
            pending = true;
            *gain = wc.res.r - have;
            break;
        } /* its writer is gone (and the marker with it): the next best */
    }
    disk_unlock(c->disk);
    return pending;
}

bool cache_write_pending(struct cache *c, const struct cache_ident *id, const int32_t *prompt, size_t m,
                         struct cache_wait *w) {
    struct cache_wait none = {0};
    if (!w) w = &none;
    *w = none;
    if (!c->disk || m == 0) return false;
    pthread_mutex_lock(&c->wmu);
    const bool any = c->wq_len || c->w_busy;
    pthread_mutex_unlock(&c->wmu);
    disk_refresh(c->disk);
    const bool peers = c->p.pool && disk_wip_count(c->disk) > 0;
    if ((!any && !peers) || fp_compute(&c->sep, prompt, m, &c->req_fp) != TERN_OK) return false;
    struct request_choice ch = {0};
    cache_candidates(c, id, prompt, m, choose_for_request, &ch);
    if (any && pinned_choice(c, &ch.best)) return true;
    if (peers && peer_pending(c, id, prompt, m, ch.best.e ? ch.best.res.r : 0, &w->gain)) {
        w->peer = true;
        return true;
    }
    return false;
}

void cache_lease_park_head(struct cache_lease *lease, struct tern_mtp *h, uint32_t base) {
    struct lease_priv *lp = lease->priv;
    if (!lp) {
        tern_mtp_free(h);
        return;
    }
    head_drop(lp->e);
    lp->e->head = h;
    lp->e->head_base = h ? base : 0;
}

struct tern_mtp *cache_lease_take_head(struct cache_lease *lease, uint32_t *base) {
    struct lease_priv *lp = lease->priv;
    *base = 0;
    if (!lp || !lp->own_state) return NULL;
    struct tern_mtp *h = lp->e->head;
    *base = lp->e->head_base;
    lp->e->head = NULL;
    lp->e->head_base = 0;
    return h;
}

enum tern_status cache_announce(struct cache *c, struct cache_lease *lease) {
    struct lease_priv *lp = lease->priv;
    if (!c->disk || !lp) return TERN_OK;
    struct entry *e = lp->e;
    const uint32_t n = tern_session_n_past(e->s);
    if (e->predicted || e->mark || n == 0) return TERN_OK;
    if (!e->key && !e->has_nonce) {
        enum tern_status st = disk_nonce_new(e->disk_nonce);
        if (st) return st;
        e->has_nonce = true;
    }
    /* the checkpoints the write will carry: the entry's and the request's (a hybrid
     * resumes a version at these or at its end) */
    uint32_t pos[MAX_PLAN * 5], kinds[MAX_PLAN * 5];
    uint32_t n_ck = 0;
    for (size_t i = 0, k = 0; c->hybrid && (i < e->n_ck || k < lp->n_pending) && n_ck < TERN_ARRAY_LEN(pos);) {
        const bool from_e = k >= lp->n_pending || (i < e->n_ck && e->ck[i].pos <= lp->pending[k].pos);
        const struct ckpt_entry *ce = from_e ? &e->ck[i++] : &lp->pending[k++];
        if (!ce->ck || ce->pos > n) continue;
        if (n_ck && pos[n_ck - 1] == ce->pos) {
            kinds[n_ck - 1] |= ce->kinds;
            continue;
        }
        pos[n_ck] = ce->pos;
        kinds[n_ck++] = ce->kinds;
    }
    return disk_announce(c->disk, e->tenant, e->key, e->disk_nonce, tern_session_tokens(e->s), n, pos, kinds, n_ck,
                         &e->mark);
}

enum tern_status cache_acquire_flags(struct cache *c, const struct cache_ident *id, const int32_t *prompt, size_t m,
                                     unsigned flags, struct cache_lease *out) {
    memset(out, 0, sizeof *out);
    if (m == 0) return tern_errorf(TERN_ERR_INVALID, "cache: empty prompt");
    struct lease_priv *lp = tern_calloc(1, sizeof *lp);
    if (!lp) return tern_errorf(TERN_ERR_NOMEM, "cache: out of memory for a lease");
    lp->c = c;
    struct cache_decision *d = &out->decision;
    d->key_explicit = id->key && *id->key;
    d->waited_ms = id->waited_ms;
    /* The fingerprint is computed even without affinity: it also decides whether a
     * resume replaces a lineage or forks it. */
    enum tern_status st = fp_compute(&c->sep, prompt, m, &c->req_fp);
    if (st) {
        free(lp);
        return st;
    }
    /* candidates and decision; a choice whose disk write is in flight waits for it, or,
     * past the bound (or with CACHE_ACQUIRE_NOWAIT), is left alone */
    struct request_choice ch;
    size_t n_compared;
    for (int pass = 0;; pass++) {
        ch = (struct request_choice){0};
        n_compared = cache_candidates(c, id, prompt, m, choose_for_request, &ch);
        struct entry *pe = pinned_choice(c, &ch.best);
        if (!pe || c->skip_pinned) break;
        if (!(flags & CACHE_ACQUIRE_NOWAIT) && pass < 4 &&
            cache_wait_unpinned(c, pe, tern_now_ns() + (uint64_t)CACHE_PIN_WAIT_MS * 1000000ull))
            continue;
        TERN_LOG_INFO("reuse: the conversation's disk write is still running; not resuming it (key=%s)",
                      pe->key ? pe->key : "-");
        c->skip_pinned = true;
    }
    c->skip_pinned = false;
    STAT_ADD(c, candidates, n_compared);
    explain_decline(c, &ch, d);
    struct entry *e = NULL;
    uint32_t r = 0;
    if (resume_from_disk(c, id, prompt, m, ch.best.e ? ch.best.res.r : 0, d, &e, &r)) {
        lp->own_state = true;
    } else {
        st = ch.best.e ? resume_from_ram(c, id, &ch.best, prompt, d, &e) : start_cold(c, id, d, &e);
        if (st) {
            free(lp);
            return st;
        }
        lp->own_state = ch.best.e && e == ch.best.e;
        r = ch.best.e ? ch.best.res.r : 0;
    }
    /* plan and lease */
    plan_request(c, lp, prompt, r, m);
    lease_begin(c, e, lp, out);
    d->cached = r;
    d->read = (uint32_t)(m - r);
    pthread_mutex_lock(&c->stats_mu);
    c->stats.requests_by_tier[d->tier]++;
    c->stats.tokens_cached += r;
    c->stats.tokens_read += m - r;
    pthread_mutex_unlock(&c->stats_mu);
    log_decision(d);
    return TERN_OK;
}

void cache_on_checkpoint(void *lease, struct tern_checkpoint *ckpt) {
    struct cache_lease *l = lease;
    struct lease_priv *lp = l->priv;
    uint32_t pos = tern_checkpoint_pos(ckpt);
    uint32_t kinds = 0;
    for (size_t i = 0; i < lp->n_plan; i++)
        if (lp->plan[i].pos == pos) kinds = lp->plan[i].kinds;
    if (lp->n_pending == MAX_PLAN || kinds == 0) {
        tern_checkpoint_free(ckpt);
        return;
    }
    lp->pending[lp->n_pending++] = (struct ckpt_entry){.ck = ckpt, .pos = pos, .kinds = kinds, .stamp = 0};
}

static void add_checkpoints(struct cache *c, struct entry *e, struct lease_priv *lp) {
    uint32_t n_past = tern_session_n_past(e->s);
    for (size_t i = 0; i < lp->n_pending; i++) {
        struct ckpt_entry ce = lp->pending[i];
        lp->pending[i].ck = NULL;
        if (ce.pos > n_past) { /* cancelled before the session got there: stale */
            tern_checkpoint_free(ce.ck);
            continue;
        }
        long dup = find_ck(e, ce.pos);
        if (dup >= 0) { /* same position, same tokens: keep the newer, merge kinds */
            ce.kinds |= e->ck[dup].kinds;
            ck_drop(e, (size_t)dup);
        }
        ce.stamp = e->last_used;
        if (!ck_insert(e, ce)) {
            tern_checkpoint_free(ce.ck);
            continue;
        }
        STAT_ADD(c, ckpts_made, 1);
    }
    lp->n_pending = 0;
    /* Retention: at most max_ckpts per session. */
    if (e->n_ck > c->p.max_ckpts) {
        struct plan_kept kept[e->n_ck];
        bool drop[e->n_ck];
        for (size_t i = 0; i < e->n_ck; i++) kept[i] = (struct plan_kept){e->ck[i].pos, e->ck[i].kinds, e->ck[i].stamp};
        plan_retain(kept, e->n_ck, c->p.max_ckpts, drop);
        for (size_t i = e->n_ck; i-- > 0;) {
            if (drop[i]) {
                ck_drop(e, i);
                STAT_ADD(c, ckpt_evictions, 1);
            }
        }
    }
}

void cache_release(struct cache *c, struct cache_lease *lease, bool ok) {
    struct lease_priv *lp = lease->priv;
    if (!lp) return;
    struct entry *e = lp->e;
    if (!ok) {
        for (size_t i = 0; i < lp->n_pending; i++) tern_checkpoint_free(lp->pending[i].ck);
        disk_mark_end(c->disk, e->mark);
        e->mark = NULL;
        entry_remove(c, e);
    } else {
        e->leased = false;
        add_checkpoints(c, e, lp);
        /* A session whose recurrent state cannot be trusted beyond its checkpoints is
         * still valid at its live end: the engine keeps it consistent even when a
         * request was cancelled mid-prime. */
        if (fp_compute(&c->sep, tern_session_tokens(e->s), tern_session_n_past(e->s), &e->fp) != TERN_OK) e->fp.n = 0;
        /* Written ahead as it is parked, so that a crash loses at most the turn in flight. */
        cache_set_dirty(c, e);
        cache_disk_park(c, e);
        disk_mark_end(c->disk, e->mark); /* announced, but not written (nothing to write) */
        e->mark = NULL;
        if (!c->p.pool) {
            for (struct entry *o = c->head, *nx; o; o = nx) {
                nx = o->next;
                if (o != e && !o->leased) entry_remove(c, o);
            }
        }
    }
    free(lp);
    memset(lease, 0, sizeof *lease);
    enforce_budget(c, 0);
}

/* ---- predictive priming --------------------------------------------------------------- */

enum tern_status cache_predict_begin(struct cache *c, const struct cache_ident *id, const int32_t *toks, size_t n,
                                     const uint32_t *marks, size_t n_marks, struct cache_lease *out) {
    return cache_predict_begin_flags(c, id, toks, n, marks, n_marks, 0, out);
}

/* Puts the lineage's conversation entry (not a prediction) at the head of the LRU list:
 * the budget never evicts the head, and the conversation's own state matters more than
 * what was predicted from it. */
static void lineage_to_head(struct cache *c, uint64_t lineage) {
    for (struct entry *o = c->head; o; o = o->next) {
        if (o->lineage == lineage && !o->predicted) {
            lru_unlink(c, o);
            lru_push_head(c, o);
            return;
        }
    }
}

/* The conversation's state a prediction builds on: the same candidates a request would
 * see, the best resume point (unlike a request, a prediction may be covered entirely);
 * ties go to a kept prediction, which is continued in place (no copy). */
struct predict_choice {
    size_t n;
    bool keep;
    bool covered;
    struct entry *src;
    struct plan_resume best;
};

static bool choose_for_prediction(void *ctx, const struct candidate *cand) {
    struct predict_choice *ch = ctx;
    if (cand->res.lcp >= ch->n) {
        ch->covered = true;
        return false;
    }
    const struct entry *e = cand->e;
    if (cand->res.r > ch->best.r ||
        (ch->src && cand->res.r == ch->best.r && ch->keep && e->keep && e->predicted && !ch->src->keep)) {
        ch->best = cand->res;
        ch->src = cand->e;
    }
    return true;
}

/* The previous kept prediction of the conversation (the history re-rendered up to the
 * previous turn) continues in place at r: what it held beyond r is superseded. */
static enum tern_status predict_in_place(struct cache *c, struct entry *e, const struct plan_resume *res) {
    const uint32_t r = res->r;
    if (!res->live) {
        long ck_i = find_ck(e, r);
        enum tern_status st;
        if (c->hybrid) st = ck_i >= 0 ? tern_session_restore(e->s, e->ck[ck_i].ck)
                                      : tern_errorf(TERN_ERR_STATE, "no checkpoint at %u", r);
        else st = tern_session_rewind(e->s, r);
        if (st) return tern_error_prefix(st, "predict: resuming the kept prediction at %u", r);
    }
    drop_ckpts_above(c, e, r);
    return TERN_OK;
}

/* A new predicted entry of src's lineage, copied at r. */
static enum tern_status predict_fork(struct cache *c, struct entry *src, uint32_t r, bool keep, struct entry **out) {
    long ck_i = find_ck(src, r);
    struct tern_session *fork = NULL;
    enum tern_status st = tern_session_fork(src->s, r, ck_i >= 0 ? src->ck[ck_i].ck : NULL, &fork);
    if (st) return tern_error_prefix(st, "predict: copying %u tokens", r);
    struct cache_ident pid = {.tenant = src->tenant, .key = src->key};
    struct entry *e = NULL;
    st = entry_new(c, &pid, fork, src->lineage, &e);
    if (st) {
        tern_session_free(fork);
        return st;
    }
    /* when used, it becomes the conversation's entry: the same file on disk */
    memcpy(e->disk_nonce, src->disk_nonce, sizeof e->disk_nonce);
    e->has_nonce = src->has_nonce;
    e->predicted = true;
    e->keep = keep;
    if (keep) {
        /* one kept prediction per conversation: an older one it did not build on has
         * diverged */
        for (struct entry *o = c->head, *nx; o; o = nx) {
            nx = o->next;
            if (o != e && !o->leased && o->lineage == e->lineage && o->keep && o->predicted) entry_remove(c, o);
        }
    }
    *out = e;
    return TERN_OK;
}

/* The checkpoint plan of a prediction (hybrid models): the caller's marks in (r, n]. */
static void plan_prediction(struct cache *c, struct lease_priv *lp, const uint32_t *marks, size_t n_marks, uint32_t r,
                            size_t n) {
    if (!c->hybrid || c->p.max_ckpts == 0) return;
    for (size_t i = 0; i < n_marks && lp->n_plan < MAX_PLAN; i++)
        if (marks[i] > r && marks[i] <= n)
            lp->plan[lp->n_plan++] = (struct plan_point){marks[i], PLAN_CKPT_PREDICTED | PLAN_CKPT_END};
}

enum tern_status cache_predict_begin_flags(struct cache *c, const struct cache_ident *id, const int32_t *toks,
                                           size_t n, const uint32_t *marks, size_t n_marks, unsigned flags,
                                           struct cache_lease *out) {
    memset(out, 0, sizeof *out);
    if (n == 0) return tern_errorf(TERN_ERR_STATE, "predict: empty prediction");
    const bool keep = (flags & CACHE_PREDICT_KEEP) != 0;
    enum tern_status st = fp_compute(&c->sep, toks, n, &c->req_fp);
    if (st) return st;
    /* candidates and decision: primed only beyond the best resume point */
    struct predict_choice ch = {.n = n, .keep = keep};
    cache_candidates(c, id, toks, n, choose_for_prediction, &ch);
    if (ch.covered) return tern_errorf(TERN_ERR_STATE, "predict: already covered (%zu tokens)", n);
    if (!ch.src) return tern_errorf(TERN_ERR_STATE, "predict: no state of this conversation to build on");
    if (ch.best.r >= n) return tern_errorf(TERN_ERR_STATE, "predict: the conversation's state already covers it");
    struct lease_priv *lp = tern_calloc(1, sizeof *lp);
    if (!lp) return tern_errorf(TERN_ERR_NOMEM, "predict: out of memory");
    lp->c = c;
    const uint32_t r = ch.best.r;
    struct entry *e = NULL;
    lp->in_place = keep && ch.src->keep && ch.src->predicted;
    if (lp->in_place) {
        e = ch.src;
        st = predict_in_place(c, e, &ch.best);
    } else {
        st = predict_fork(c, ch.src, r, keep, &e);
    }
    if (st) {
        free(lp);
        return st;
    }
    /* plan and lease */
    plan_prediction(c, lp, marks, n_marks, r, n);
    lease_begin(c, e, lp, out);
    lineage_to_head(c, e->lineage);
    out->decision.tier = CACHE_TIER_PREDICTED;
    out->decision.cached = r;
    out->decision.read = (uint32_t)(n - r);
    out->decision.key_explicit = id->key && *id->key;
    STAT_ADD(c, predictions_made, 1);
    enforce_budget(c, 0);
    return TERN_OK;
}

void cache_predict_end(struct cache *c, struct cache_lease *lease, bool ok) {
    struct lease_priv *lp = lease->priv;
    if (!lp) return;
    struct entry *e = lp->e;
    uint32_t n_past = tern_session_n_past(e->s);
    STAT_ADD(c, predict_tokens, n_past > lease->decision.cached ? n_past - lease->decision.cached : 0);
    if (!ok || (n_past <= lease->decision.cached && !lp->in_place)) {
        /* nothing primed (pre-empted at once) or unusable: drop it, not counted as a
         * wasted prediction of the model (a kept one pre-empted at once stays: it is
         * still valid where it was resumed) */
        for (size_t i = 0; i < lp->n_pending; i++) tern_checkpoint_free(lp->pending[i].ck);
        e->predicted = false;
        entry_remove(c, e);
    } else {
        e->leased = false;
        add_checkpoints(c, e, lp);
        if (fp_compute(&c->sep, tern_session_tokens(e->s), n_past, &e->fp) != TERN_OK) e->fp.n = 0;
        TERN_LOG_DEBUG("predict: primed %u of %u predicted tokens from %u (%zu checkpoints)",
                      n_past - lease->decision.cached, lease->decision.read, lease->decision.cached, e->n_ck);
    }
    free(lp);
    memset(lease, 0, sizeof *lease);
    enforce_budget(c, 0);
}
