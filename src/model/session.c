/* Sessions: the state of one conversation (DESIGN.md §3) — tokens T[0..n), KV rows in
 * pages that grow with use, recurrent buffers — and the state operations: eval in
 * chunks, rewind, checkpoint/restore, fork, hashes. Everything here is generic over the
 * layer kinds a model declares; the per-architecture math is in arch-*.c.
 *
 * Where the state lives is the model's backend (backend/backend.h's state operations):
 * the CPU's (backend/cpu/state.c: KV rows in host pages, the recurrent block in s->rec)
 * or a Vulkan device's (backend/vulkan/state.c). Every operation here is written once
 * against that table: it never asks which one a session has. tern_eval_batch is one step
 * over the items' rows on either. */
/* XXH3_state_t on the stack (streaming hashes over KV pages). */
#define XXH_STATIC_LINKING_ONLY
#include "model/model.h"

#include "backend/backend.h"
#include "model/ctx-default.h"
#include "model/session-impl.h"

#include "util/hash.h"
#include "util/log.h"
#include "util/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_N_CTX (1u << 24)

/* The state operations of s's backend (backend/backend.h). */
#define STATE(s) ((s)->m->backend->state)

/* The state operations of the backend that keeps checkpoint c's bytes itself, or NULL
 * when they are host memory (c->data). */
static const struct backend_state *ckpt_keeper(const struct tern_checkpoint *c) {
    return c->n_bytes && c->m->backend->state->ckpt_data ? c->m->backend->state : NULL;
}


/* ---- KV pages ------------------------------------------------------------------- */

/* On the session's backend: its pages [0, n) / pages beyond positions [0, n_pos) may go. */
static enum tern_status kv_grow(struct tern_session *s, uint32_t n) {
    TERN_ASSERT(n <= s->n_pages_cap);
    return STATE(s)->grow(s, n);
}

static void kv_shrink(struct tern_session *s, uint32_t n_pos) { STATE(s)->shrink(s, n_pos); }

/* ---- sessions ------------------------------------------------------------------- */

void tern_session_params_default(struct tern_session_params *p) {
    memset(p, 0, sizeof *p);
    p->kv_type = TERN_KV_F16;
}

static enum tern_status tokens_reserve(struct tern_session *s, size_t n) {
    if (n <= s->tokens_cap) return TERN_OK;
    size_t cap = s->tokens_cap ? s->tokens_cap : 256;
    while (cap < n) cap *= 2;
    if (cap > s->n_ctx) cap = s->n_ctx;
    int32_t *t = tern_reallocarray(s->tokens, cap, sizeof *t);
    if (!t) return tern_errorf(TERN_ERR_NOMEM, "session: out of memory for %zu tokens", cap);
    s->tokens = t;
    s->tokens_cap = (uint32_t)cap;
    return TERN_OK;
}

static enum tern_status session_alloc(struct tern_model *m, uint32_t n_ctx, enum tern_kv_type kv_type,
                                      uint32_t n_chunk, struct tern_session **out) {
    *out = NULL;
    struct tern_session *s = tern_calloc(1, sizeof *s);
    if (!s) return tern_errorf(TERN_ERR_NOMEM, "session: out of memory");
    s->m = m;
    atomic_fetch_add(&m->n_sessions, 1); /* tern_session_free takes it back */
    s->n_ctx = n_ctx;
    s->kv_type = kv_type;
    s->n_chunk = n_chunk;
    s->n_pages_cap = (n_ctx + TERN_KV_PAGE - 1) / TERN_KV_PAGE;
    s->logits = tern_malloc((size_t)m->hp.n_vocab * sizeof(float));
    if (m->rec_bytes) s->rec = tern_aligned_alloc(m->rec_bytes);
    if (!s->logits || (m->rec_bytes && !s->rec)) {
        tern_session_free(s);
        return tern_errorf(TERN_ERR_NOMEM, "session: out of memory");
    }
    if (s->rec) memset(s->rec, 0, m->rec_bytes);
    enum tern_status st = STATE(s)->make(s);
    if (st) {
        tern_session_free(s);
        return st;
    }
    *out = s;
    return TERN_OK;
}

enum tern_status tern_session_new(struct tern_model *m, const struct tern_session_params *p,
                                  struct tern_session **out) {
    *out = NULL;
    struct tern_session_params def;
    if (!p) {
        tern_session_params_default(&def);
        p = &def;
    }
    uint32_t n_ctx = p->n_ctx;
    if (n_ctx == 0) n_ctx = tern_n_ctx_default(m->hp.n_ctx_train);
    if (n_ctx > MAX_N_CTX)
        return tern_errorf(TERN_ERR_RANGE, "session: context size %u exceeds the limit %u", n_ctx, MAX_N_CTX);
    if (m->hp.n_ctx_train && n_ctx > m->hp.n_ctx_train)
        TERN_LOG_WARN("session: context size %u exceeds the model's training context %u", n_ctx, m->hp.n_ctx_train);
    if (p->kv_type != TERN_KV_F16 && p->kv_type != TERN_KV_F32)
        return tern_errorf(TERN_ERR_INVALID, "session: unknown KV cache type %d", (int)p->kv_type);
    uint32_t n_chunk = p->n_chunk ? p->n_chunk : TERN_DEFAULT_CHUNK;
    if (n_chunk > n_ctx) n_chunk = n_ctx;
    return session_alloc(m, n_ctx, p->kv_type, n_chunk, out);
}

void tern_session_free(struct tern_session *s) {
    if (!s) return;
    free(s->tokens);
    free(s->logits);
    tern_aligned_free(s->rec);
    STATE(s)->release(s);
    atomic_fetch_sub(&s->m->n_sessions, 1);
    free(s);
}

struct tern_model *tern_session_model(const struct tern_session *s) { return s->m; }
uint32_t tern_session_n_ctx(const struct tern_session *s) { return s->n_ctx; }
uint32_t tern_session_n_past(const struct tern_session *s) { return s->n_past; }
const int32_t *tern_session_tokens(const struct tern_session *s) { return s->tokens; }
const float *tern_session_logits(const struct tern_session *s) { return s->logits_valid ? s->logits : NULL; }

size_t tern_session_bytes(const struct tern_session *s) {
    const size_t b = sizeof *s + (size_t)s->tokens_cap * sizeof(int32_t) + (size_t)s->m->hp.n_vocab * sizeof(float) +
                     s->m->rec_bytes;
    return b + STATE(s)->bytes(s);
}

/* The recurrent block: s->rec up to date with the backend's state (a cache of it, so a
 * const session may refresh it); and the backend's set from rec (NULL: zero). */
static enum tern_status rec_sync(const struct tern_session *cs) {
    struct tern_session *s = (struct tern_session *)(uintptr_t)cs;
    return STATE(s)->rec_sync(s);
}

static enum tern_status rec_put(struct tern_session *s, const void *rec) {
    if (!s->m->rec_bytes) return TERN_OK;
    if (rec) memcpy(s->rec, rec, s->m->rec_bytes);
    else memset(s->rec, 0, s->m->rec_bytes);
    return STATE(s)->rec_push(s);
}

/* Sets s's recurrent state from checkpoint c, wherever c's bytes are. */
static enum tern_status rec_from_ckpt(struct tern_session *s, const struct tern_checkpoint *c) {
    return c->n_bytes ? STATE(s)->ckpt_restore(s, c) : TERN_OK;
}

/* ---- eval ----------------------------------------------------------------------- */

static size_t s_room(const struct tern_session *s) { return (size_t)s->n_ctx - s->n_past; }

static enum tern_status take_checkpoint(struct tern_session *s, const struct tern_eval_opts *o) {
    struct tern_checkpoint *c;
    enum tern_status st = tern_session_checkpoint(s, &c);
    if (st) return st;
    if (o->on_ckpt) o->on_ckpt(o->ckpt_user ? o->ckpt_user : o->user, c);
    else tern_checkpoint_free(c);
    return TERN_OK;
}

enum tern_status tern_session_eval(struct tern_session *s, const int32_t *toks, size_t n,
                                   const struct tern_eval_opts *opts) {
    static const struct tern_eval_opts no_opts;
    const struct tern_eval_opts *o = opts ? opts : &no_opts;
    struct tern_model *m = s->m;
    const uint32_t n_vocab = m->hp.n_vocab;

    /* Everything that can be refused is refused before anything is computed, leaving
     * the session unchanged. */
    if (n > (size_t)s->n_ctx - s->n_past)
        return tern_errorf(TERN_ERR_RANGE,
                           "session: %zu tokens at position %u need a context of %llu positions, but it is %u", n,
                           s->n_past, (unsigned long long)s->n_past + n, s->n_ctx);
    if (n == 0) return TERN_OK;
    if (!toks) return tern_errorf(TERN_ERR_INVALID, "session: no tokens given");
    for (size_t i = 0; i < n; i++)
        if (toks[i] < 0 || (uint32_t)toks[i] >= n_vocab)
            return tern_errorf(TERN_ERR_FORMAT, "session: token id %d at index %zu is outside the vocabulary [0, %u)",
                               toks[i], i, n_vocab);
    for (size_t i = 0; i < o->n_ckpt; i++) {
        const uint32_t p = o->ckpt_pos[i];
        if (p <= s->n_past || p > s->n_past + n || (i && p <= o->ckpt_pos[i - 1]))
            return tern_errorf(TERN_ERR_INVALID,
                               "session: checkpoint position %u (index %zu) must be ascending and in (%u, %llu]", p, i,
                               s->n_past, (unsigned long long)s->n_past + n);
    }
    uint32_t n_chunk = o->n_chunk ? o->n_chunk : s->n_chunk;
    if (n_chunk > s->n_ctx) n_chunk = s->n_ctx;
    if (o->rec_trail && o->n_ckpt)
        return tern_errorf(TERN_ERR_INVALID, "session: an eval with a state trail takes no checkpoints");
    s->trail = NULL;
    const uint32_t pos0 = s->n_past;

    enum tern_status st = STATE(s)->eval_prepare(s, n_chunk, (uint32_t)n, o->rec_trail != NULL);
    if (!st) st = tokens_reserve(s, (size_t)s->n_past + n);
    if (!st) st = kv_grow(s, (uint32_t)((s->n_past + n + TERN_KV_PAGE - 1) / TERN_KV_PAGE));
    if (st) return st;

    size_t done = 0, ick = 0;
    while (done < n) {
        if (o->cancel && atomic_load(o->cancel)) {
            st = tern_errorf(TERN_ERR_CANCELLED, "session: evaluation cancelled after %zu of %zu tokens", done, n);
            break;
        }
        /* A checkpoint at the current position is taken before its token is consumed. */
        if (ick < o->n_ckpt && o->ckpt_pos[ick] == s->n_past) {
            if ((st = take_checkpoint(s, o))) break;
            ick++;
        }
        size_t len = n - done;
        if (len > n_chunk) len = n_chunk;
        if (ick < o->n_ckpt && o->ckpt_pos[ick] - s->n_past < len) len = o->ckpt_pos[ick] - s->n_past;
        const bool last = done + len == n;
        float *logits = NULL;
        if (o->logits_all) logits = o->logits_all + done * n_vocab;
        else if (last) logits = s->logits;
        s->logits_valid = false;
        if ((st = STATE(s)->chunk(s, toks + done, (uint32_t)len, logits, o->logits_all != NULL, o->rec_trail,
                               (uint32_t)done)))
            break;
        memcpy(s->tokens + s->n_past, toks + done, len * sizeof *toks);
        s->n_past += (uint32_t)len;
        done += len;
        if (last) {
            if (o->logits_all) memcpy(s->logits, o->logits_all + (n - 1) * n_vocab, n_vocab * sizeof(float));
            s->logits_valid = true;
        }
        if (o->progress && o->progress(o->user, done, n) && done < n) {
            st = tern_errorf(TERN_ERR_CANCELLED, "session: evaluation cancelled after %zu of %zu tokens", done, n);
            break;
        }
    }
    if (!st && ick < o->n_ckpt && o->ckpt_pos[ick] == s->n_past) {
        st = take_checkpoint(s, o);
        ick++;
    }
    /* Pages reserved for tokens a cancelled eval never reached are given back. */
    kv_shrink(s, s->n_past);
    if (o->rec_trail && m->rec_bytes && s->n_past > pos0) {
        s->trail = o->rec_trail;
        s->trail_pos0 = pos0;
        s->trail_end = s->n_past;
    }
    return st;
}

enum tern_status tern_session_reserve(struct tern_session *s, size_t n) {
    if (n > (size_t)s->n_ctx - s->n_past)
        return tern_errorf(TERN_ERR_RANGE,
                           "session: %zu tokens at position %u need a context of %llu positions, but it is %u", n,
                           s->n_past, (unsigned long long)s->n_past + n, s->n_ctx);
    enum tern_status st = tokens_reserve(s, (size_t)s->n_past + n);
    if (!st) st = kv_grow(s, (uint32_t)((s->n_past + n + TERN_KV_PAGE - 1) / TERN_KV_PAGE));
    return st;
}

enum tern_status tern_eval_batch(const struct tern_batch_item *items, size_t n_items) {
    if (n_items == 0) return TERN_OK;
    if (n_items > MODEL_MAX_SEQS)
        return tern_errorf(TERN_ERR_INVALID, "session: a batch holds at most %d sequences, not %zu", MODEL_MAX_SEQS,
                           n_items);
    struct tern_model *m = items[0].s->m;
    const uint32_t n_vocab = m->hp.n_vocab;
    size_t rows = 0;
    uint32_t n_want = 0;
    /* Everything that can be refused is refused before anything is computed: every
     * session stays unchanged. */
    for (size_t i = 0; i < n_items; i++) {
        const struct tern_batch_item *it = &items[i];
        if (it->s->m != m) return tern_errorf(TERN_ERR_INVALID, "session: batch item %zu is another model's", i);
        if (it->n == 0 || !it->toks) return tern_errorf(TERN_ERR_INVALID, "session: batch item %zu has no tokens", i);
        for (size_t k = 0; k < i; k++)
            if (items[k].s == it->s)
                return tern_errorf(TERN_ERR_INVALID, "session: batch items %zu and %zu are one session", k, i);
        if (it->n > s_room(it->s))
            return tern_errorf(TERN_ERR_RANGE,
                               "session: batch item %zu: %u tokens at position %u need a context of %llu positions, "
                               "but it is %u",
                               i, it->n, it->s->n_past, (unsigned long long)it->s->n_past + it->n, it->s->n_ctx);
        for (uint32_t t = 0; t < it->n; t++)
            if (it->toks[t] < 0 || (uint32_t)it->toks[t] >= n_vocab)
                return tern_errorf(TERN_ERR_FORMAT,
                                   "session: batch item %zu: token id %d at index %u is outside the vocabulary [0, %u)",
                                   i, it->toks[t], t, n_vocab);
        rows += it->n;
        n_want += it->logits_all ? it->n : it->logits;
    }
    if (rows > UINT32_MAX / 2) return tern_errorf(TERN_ERR_INVALID, "session: a batch of %zu rows", rows);
    enum tern_status st = STATE(items[0].s)->batch(items, n_items, rows, n_want);
    if (st) return st;
    /* each item's tokens, position, trail and logits: one bookkeeping for both backends */
    for (size_t i = 0; i < n_items; i++) {
        const struct tern_batch_item *it = &items[i];
        struct tern_session *s = it->s;
        s->trail = NULL;
        if (it->rec_trail && m->rec_bytes) {
            s->trail = it->rec_trail;
            s->trail_pos0 = s->n_past;
            s->trail_end = s->n_past + it->n;
        }
        memcpy(s->tokens + s->n_past, it->toks, it->n * sizeof *it->toks);
        s->n_past += it->n;
        s->logits_valid = it->logits || it->logits_all;
        if (it->logits_all) memcpy(s->logits, it->logits_all + (size_t)(it->n - 1) * n_vocab, n_vocab * sizeof(float));
    }
    return TERN_OK;
}

/* ---- rewind, checkpoints, fork -------------------------------------------------- */

enum tern_status tern_session_rewind(struct tern_session *s, uint32_t p) {
    if (p > s->n_past)
        return tern_errorf(TERN_ERR_RANGE, "session: cannot rewind to position %u beyond the end %u", p, s->n_past);
    if (p == s->n_past) return TERN_OK;
    if (s->m->info.hybrid && s->trail && p > s->trail_pos0 && p <= s->trail_end) {
        /* the state after token p - 1, as the trail recorded it (on a device: its slot) */
        enum tern_status st = STATE(s)->trail_load(s, p - s->trail_pos0 - 1);
        if (st) return tern_error_prefix(st, "session: rewinding to %u from the state trail", p);
        s->trail_end = p;
    } else if (s->m->info.hybrid) {
        return tern_errorf(TERN_ERR_STATE,
                           "session: cannot rewind a hybrid model's session from %u to %u: recurrent state is valid "
                           "only at %u, restore a checkpoint taken at %u instead",
                           s->n_past, p, s->n_past, p);
    }
    s->n_past = p;
    s->logits_valid = false;
    kv_shrink(s, p);
    return TERN_OK;
}

void tern_session_drop_trail(struct tern_session *s) {
    s->trail = NULL;
    STATE(s)->trail_drop(s);
}

static uint64_t tokens_hash(const int32_t *t, uint32_t n) { return tern_hash64(t, (size_t)n * sizeof *t); }

enum tern_status tern_session_checkpoint(struct tern_session *s, struct tern_checkpoint **out) {
    *out = NULL;
    struct tern_checkpoint *c = tern_calloc(1, sizeof *c);
    if (!c) return tern_errorf(TERN_ERR_NOMEM, "session: out of memory for a checkpoint");
    c->m = s->m;
    c->pos = s->n_past;
    c->tok_hash = tokens_hash(s->tokens, s->n_past);
    c->n_bytes = s->m->rec_bytes;
    if (STATE(s)->ckpt_take(s, c)) {
        *out = c;
        return TERN_OK;
    }
    enum tern_status st = rec_sync(s);
    if (st) {
        free(c);
        return st;
    }
    if (c->n_bytes) {
        c->data = tern_malloc(c->n_bytes);
        if (!c->data) {
            free(c);
            return tern_errorf(TERN_ERR_NOMEM, "session: out of memory for a checkpoint of %zu bytes", s->m->rec_bytes);
        }
        memcpy(c->data, s->rec, c->n_bytes);
    }
    *out = c;
    return TERN_OK;
}

/* Checks that c belongs to s's model and lineage, at a position <= limit. */
static enum tern_status ckpt_check(const struct tern_session *s, const struct tern_checkpoint *c, uint32_t limit) {
    if (c->m != s->m || c->n_bytes != s->m->rec_bytes)
        return tern_errorf(TERN_ERR_INVALID, "session: the checkpoint was taken with another model");
    if (c->pos > limit)
        return tern_errorf(TERN_ERR_STATE, "session: checkpoint position %u is beyond the session's %u tokens", c->pos,
                           limit);
    if (tokens_hash(s->tokens, c->pos) != c->tok_hash)
        return tern_errorf(TERN_ERR_STATE,
                           "session: the checkpoint at position %u does not match the session's tokens before it",
                           c->pos);
    return TERN_OK;
}

enum tern_status tern_session_restore(struct tern_session *s, const struct tern_checkpoint *c) {
    enum tern_status st = ckpt_check(s, c, s->n_past);
    if (st) return st;
    if ((st = rec_from_ckpt(s, c))) return st;
    s->trail = NULL;
    if (c->pos != s->n_past || c->n_bytes) s->logits_valid = false;
    s->n_past = c->pos;
    kv_shrink(s, c->pos);
    return TERN_OK;
}

enum tern_status tern_session_checkpoint_update(struct tern_session *s, struct tern_checkpoint *c) {
    if (c->m != s->m || c->n_bytes != s->m->rec_bytes)
        return tern_errorf(TERN_ERR_INVALID, "session: the checkpoint was taken with another model");
    if (ckpt_keeper(c)) return ckpt_keeper(c)->ckpt_update(s, c);
    enum tern_status st = rec_sync(s);
    if (st) return st;
    c->pos = s->n_past;
    c->tok_hash = tokens_hash(s->tokens, s->n_past);
    if (c->n_bytes) memcpy(c->data, s->rec, c->n_bytes);
    return TERN_OK;
}

uint32_t tern_checkpoint_pos(const struct tern_checkpoint *c) { return c->pos; }
size_t tern_checkpoint_bytes(const struct tern_checkpoint *c) { return sizeof *c + c->n_bytes; }

void tern_checkpoint_free(struct tern_checkpoint *c) {
    if (!c) return;
    if (ckpt_keeper(c)) ckpt_keeper(c)->ckpt_release(c);
    free(c->data);
    free(c);
}

enum tern_status tern_session_fork(const struct tern_session *src, uint32_t p, const struct tern_checkpoint *ckpt,
                                   struct tern_session **out) {
    *out = NULL;
    if (p > src->n_past)
        return tern_errorf(TERN_ERR_RANGE, "session: cannot fork at position %u beyond the end %u", p, src->n_past);
    enum tern_status st;
    if (ckpt) {
        if ((st = ckpt_check(src, ckpt, src->n_past))) return st;
        if (ckpt->pos != p)
            return tern_errorf(TERN_ERR_INVALID, "session: fork at position %u with a checkpoint at %u", p, ckpt->pos);
    } else if (src->m->info.hybrid && p != src->n_past) {
        return tern_errorf(TERN_ERR_STATE,
                           "session: forking a hybrid model's session at %u (its end is %u) needs a checkpoint taken "
                           "at %u",
                           p, src->n_past, p);
    }
    struct tern_session *s;
    if ((st = session_alloc(src->m, src->n_ctx, src->kv_type, src->n_chunk, &s))) return st;
    if ((st = tokens_reserve(s, p ? p : 1)) || (st = kv_grow(s, (p + TERN_KV_PAGE - 1) / TERN_KV_PAGE))) {
        tern_session_free(s);
        return st;
    }
    if (p) memcpy(s->tokens, src->tokens, (size_t)p * sizeof *s->tokens);
    if ((st = STATE(s)->fork(s, src, p, ckpt))) {
        tern_session_free(s);
        return st;
    }
    s->n_past = p;
    if (p == src->n_past && src->logits_valid) {
        memcpy(s->logits, src->logits, (size_t)s->m->hp.n_vocab * sizeof(float));
        s->logits_valid = true;
    }
    *out = s;
    return TERN_OK;
}

/* ---- hashes --------------------------------------------------------------------- */

/* Calls fn for every state component in order: per layer K and V rows [0, n) or the
 * recurrent buffers, then the tokens. */
typedef void (*component_fn)(void *ctx, const char *name, uint64_t hash);

static void each_component(const struct tern_session *s, component_fn fn, void *ctx) {
    char name[48];
    const bool rec_ok = !rec_sync(s);
    if (!rec_ok) TERN_LOG_ERROR("session: state hash: %s", tern_last_error());
    for (uint32_t il = 0; il < s->m->n_layer; il++) {
        const struct model_layer *L = &s->m->layers[il];
        if (L->kind == LAYER_ATTN) {
            snprintf(name, sizeof name, "blk.%u.k", il);
            fn(ctx, name, STATE(s)->kv_hash(s, il, false));
            snprintf(name, sizeof name, "blk.%u.v", il);
            fn(ctx, name, STATE(s)->kv_hash(s, il, true));
        } else {
            for (uint32_t b = 0; b < L->n_bufs; b++) {
                snprintf(name, sizeof name, "blk.%u.%s", il, L->bufs[b].name);
                fn(ctx, name, rec_ok ? tern_hash64(s->rec + L->rec_offset + L->bufs[b].offset, L->bufs[b].bytes) : 0);
            }
        }
    }
    fn(ctx, "tokens", tokens_hash(s->tokens, s->n_past));
}

struct fill_ctx {
    struct tern_hash_component *out;
    size_t cap, n;
};

static void fill_component(void *ctx, const char *name, uint64_t hash) {
    struct fill_ctx *f = ctx;
    if (f->n < f->cap) {
        snprintf(f->out[f->n].name, sizeof f->out[f->n].name, "%s", name);
        f->out[f->n].hash = hash;
    }
    f->n++;
}

size_t tern_session_hash_components(const struct tern_session *s, struct tern_hash_component *out, size_t cap) {
    struct fill_ctx f = {out, out ? cap : 0, 0};
    each_component(s, fill_component, &f);
    return f.n;
}

static void chain_component(void *ctx, const char *name, uint64_t hash) {
    (void)name;
    XXH3_64bits_update(ctx, &hash, sizeof hash);
}

uint64_t tern_session_hash(const struct tern_session *s) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    each_component(s, chain_component, &st);
    return XXH3_64bits_digest(&st);
}

/* ---- export / import (the disk tier, DESIGN.md §9) -------------------------------- */

size_t tern_state_kv_row_bytes(const struct tern_model *m, enum tern_kv_type kv) {
    size_t b = 0;
    for (uint32_t il = 0; il < m->n_layer; il++) b += model_layer_kv_row_bytes(&m->layers[il], kv);
    return b;
}

/* Copies rows [p0, p1) between the pages and buf in the export order (layer, K then V,
 * kv head, then rows); buf holds buf_rows >= p1 - p0 rows per (layer, K/V, head) run. */
/* Copies rows [p0, p1) between the state and buf in the export order (layer, K then V,
 * kv head, then rows); buf holds buf_rows >= p1 - p0 rows per (layer, K/V, head) run. */
static enum tern_status kv_walk(const struct tern_session *s, uint32_t p0, uint32_t p1, uint8_t *buf, bool to_pages,
                                uint32_t buf_rows) {
    for (uint32_t il = 0; il < s->m->n_layer; il++) {
        const struct model_layer *L = &s->m->layers[il];
        if (L->kind != LAYER_ATTN) continue;
        for (int v = 0; v < 2; v++) {
            enum tern_status st = STATE(s)->kv_rows(s, il, v, p0, p1, buf, buf_rows, to_pages);
            if (st)
                return tern_error_prefix(st, "session: %s KV rows [%u, %u) of layer %u",
                                         to_pages ? "writing" : "reading", p0, p1, il);
            buf += (size_t)buf_rows * session_head_row_bytes(s, L, v) * L->n_kv_head;
        }
    }
    return TERN_OK;
}

enum tern_status tern_session_kv_export(const struct tern_session *s, uint32_t p0, uint32_t p1, void *buf) {
    TERN_ASSERT(p0 <= p1 && p1 <= s->n_past);
    return kv_walk(s, p0, p1, buf, false, p1 - p0);
}

enum tern_status tern_session_kv_import(struct tern_session *s, uint32_t p0, uint32_t p1, const void *buf,
                                        uint32_t buf_rows) {
    TERN_ASSERT(p0 <= p1 && p1 <= s->n_past && buf_rows >= p1 - p0);
    return kv_walk(s, p0, p1, (uint8_t *)(uintptr_t)buf, true, buf_rows);
}

const void *tern_session_rec_data(const struct tern_session *s) {
    if (!s->m->rec_bytes || rec_sync(s)) return NULL;
    return s->rec;
}

const void *tern_checkpoint_data(const struct tern_checkpoint *cc) {
    if (!cc->n_bytes) return NULL;
    if (!ckpt_keeper(cc)) return cc->data;
    return ckpt_keeper(cc)->ckpt_data((struct tern_checkpoint *)(uintptr_t)cc);
}

enum tern_status tern_session_import(struct tern_model *m, const struct tern_session_params *p, const int32_t *toks,
                                     uint32_t n, const void *rec, struct tern_session **out) {
    *out = NULL;
    struct tern_session *s;
    enum tern_status st = tern_session_new(m, p, &s);
    if (st) return st;
    if (n > s->n_ctx) {
        st = tern_errorf(TERN_ERR_RANGE, "session: %u stored tokens exceed the context size %u", n, s->n_ctx);
        goto fail;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (toks[i] < 0 || (uint32_t)toks[i] >= m->hp.n_vocab) {
            st = tern_errorf(TERN_ERR_FORMAT, "session: stored token id %d at index %u is outside the vocabulary [0, %u)",
                             toks[i], i, m->hp.n_vocab);
            goto fail;
        }
    }
    if ((st = tokens_reserve(s, n ? n : 1)) || (st = kv_grow(s, (n + TERN_KV_PAGE - 1) / TERN_KV_PAGE))) goto fail;
    if (n) memcpy(s->tokens, toks, (size_t)n * sizeof *toks);
    if ((st = rec_put(s, rec))) goto fail;
    s->n_past = n;
    s->logits_valid = false;
    *out = s;
    return TERN_OK;
fail:
    tern_session_free(s);
    return st;
}

enum tern_status tern_checkpoint_import(const struct tern_session *s, uint32_t pos, const void *data, size_t n,
                                        struct tern_checkpoint **out) {
    *out = NULL;
    if (pos > s->n_past)
        return tern_errorf(TERN_ERR_RANGE, "session: stored checkpoint at %u is beyond the session's %u tokens", pos,
                           s->n_past);
    if (n != s->m->rec_bytes)
        return tern_errorf(TERN_ERR_FORMAT, "session: stored checkpoint holds %zu bytes, the model's state %zu", n,
                           s->m->rec_bytes);
    struct tern_checkpoint *c = tern_calloc(1, sizeof *c);
    if (!c) return tern_errorf(TERN_ERR_NOMEM, "session: out of memory for a checkpoint");
    c->m = s->m;
    c->pos = pos;
    c->tok_hash = tokens_hash(s->tokens, pos);
    c->n_bytes = n;
    if (n) {
        if (!(c->data = tern_malloc(n))) {
            free(c);
            return tern_errorf(TERN_ERR_NOMEM, "session: out of memory for a checkpoint of %zu bytes", n);
        }
        memcpy(c->data, data, n);
    }
    *out = c;
    return TERN_OK;
}
