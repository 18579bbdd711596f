/* Sessions: the state of one conversation (DESIGN.md §3) — tokens T[0..n), KV rows in
 * pages that grow with use, recurrent buffers — and the state operations: eval in
 * chunks, rewind, checkpoint/restore, fork, hashes. Everything here is generic over the
 * layer kinds a model declares; the per-architecture math is in arch-*.c.
 *
 * Where the state lives is the session's backend (session-impl.h): the CPU's, below (KV
 * rows in host pages, the recurrent block in s->rec), or a Vulkan device's
 * (session-gpu.c). Every operation here is written once against that table: it never asks
 * which one a session has. tern_eval_batch is one step over the items' rows on either. */
/* XXH3_state_t on the stack (streaming hashes over KV pages). */
#define XXH_STATIC_LINKING_ONLY
#include "model/model.h"

#include "model/backend.h"
#include "model/ctx-default.h"
#include "model/session-impl.h"

#include "util/hash.h"
#include "util/log.h"
#include "util/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_N_CTX (1u << 24)


/* ---- workspace ------------------------------------------------------------------ */

void model_ws_free(struct tern_model *m) {
    if (m->ws.rs && m->arch && m->arch->state_free) m->arch->state_free(m->ws.rs);
    for (int i = 0; i < MODEL_MAX_ACT_KINDS; i++) tern_aligned_free(m->ws.act[i]);
    tern_aligned_free(m->ws.scores);
    tern_aligned_free(m->ws.logits);
    memset(&m->ws, 0, sizeof m->ws);
}

static uint32_t n_act_buffers(const struct tern_model *m) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->n_act_kinds; i++) n += m->act_kinds[i] != TERN_DTYPE_F32;
    return n < MODEL_MAX_ACT_KINDS ? n : MODEL_MAX_ACT_KINDS;
}

/* Attention scratch per thread: the largest GQA group of any attention layer. */
static size_t attn_scratch_floats(const struct tern_model *m) {
    uint32_t max_hd = 8;
    for (uint32_t il = 0; il < m->n_layer; il++)
        if (m->layers[il].kind == LAYER_ATTN && m->layers[il].head_dim_k > max_hd) max_hd = m->layers[il].head_dim_k;
    return model_attn_scratch_floats(m->hp.n_head ? m->hp.n_head : 1, max_hd);
}

enum tern_status model_ws_reserve(struct tern_model *m, uint32_t n_chunk) {
    if (m->ws.rs && m->ws.n_chunk >= n_chunk) return TERN_OK;
    if (n_chunk < m->ws.n_chunk) n_chunk = m->ws.n_chunk;
    const int nth = tern_threadpool_n_threads(m->pool);
    void *rs = NULL;
    void *act[MODEL_MAX_ACT_KINDS] = {0};
    float *scores = NULL;
    size_t act_bytes = 0, scores_bytes = 0;
    const struct model_backend cpu = {&model_cpu_ops, NULL};
    enum tern_status st = m->arch->state_new(m, &cpu, n_chunk, &rs);
    if (st) return st;
    const uint32_t n_act = n_act_buffers(m);
    if (tern_mul_overflow(n_chunk, m->max_act_row_bytes, &act_bytes) ||
        tern_mul_overflow((size_t)nth * attn_scratch_floats(m), sizeof(float), &scores_bytes))
        goto nomem;
    for (uint32_t i = 0; i < n_act; i++)
        if (!(act[i] = tern_aligned_alloc(act_bytes))) goto nomem;
    /* Padded by 8 floats: vector code may round a row of scores up to a whole vector. */
    if (!(scores = tern_aligned_alloc(scores_bytes + 64))) goto nomem;
    float *keep_logits = m->ws.logits;
    const uint32_t keep_rows = m->ws.logits_rows;
    m->ws.logits = NULL;
    model_ws_free(m);
    m->ws.logits = keep_logits;
    m->ws.logits_rows = keep_rows;
    m->ws.rs = rs;
    memcpy(m->ws.act, act, sizeof act);
    m->ws.scores = scores;
    m->ws.n_chunk = n_chunk;
    m->ws.scores_per_thread = attn_scratch_floats(m);
    m->ws.bytes = m->arch->state_bytes(rs) + n_act * act_bytes + scores_bytes +
                  (size_t)m->ws.logits_rows * m->hp.n_vocab * sizeof(float);
    return TERN_OK;
nomem:
    m->arch->state_free(rs);
    for (uint32_t i = 0; i < n_act; i++) tern_aligned_free(act[i]);
    tern_aligned_free(scores);
    return tern_errorf(TERN_ERR_NOMEM, "session: out of memory for the workspace of %u-token chunks", n_chunk);
}

/* Grows the workspace's batch logits to n rows (call with eval_mu held). */
static enum tern_status ws_logits_reserve(struct tern_model *m, uint32_t n) {
    if (m->ws.logits_rows >= n) return TERN_OK;
    size_t bytes;
    if (tern_mul_overflow((size_t)n * m->hp.n_vocab, sizeof(float), &bytes))
        return tern_errorf(TERN_ERR_NOMEM, "session: the logits of %u sequences overflow", n);
    float *l = tern_aligned_alloc(bytes);
    if (!l) return tern_errorf(TERN_ERR_NOMEM, "session: out of memory for the logits of %u sequences", n);
    m->ws.bytes += bytes - (size_t)m->ws.logits_rows * m->hp.n_vocab * sizeof(float);
    tern_aligned_free(m->ws.logits);
    m->ws.logits = l;
    m->ws.logits_rows = n;
    return TERN_OK;
}

/* The session borrows the model's workspace for one forward (eval_mu held). */
static void ws_bind(struct tern_session *s) {
    struct tern_model *m = s->m;
    s->rs = m->ws.rs;
    s->rs_chunk = m->ws.n_chunk;
    memcpy(s->act, m->ws.act, sizeof s->act);
    s->scores = m->ws.scores;
    s->scores_per_thread = m->ws.scores_per_thread;
}

static void ws_unbind(struct tern_session *s) {
    s->rec_trail = NULL;
    s->rs = NULL;
    s->scores = NULL;
    memset(s->act, 0, sizeof s->act);
}

/* ---- KV pages ------------------------------------------------------------------- */

static size_t page_bytes(const struct tern_session *s, const struct model_layer *L, bool v) {
    const size_t es = s->kv_type == TERN_KV_F16 ? 2 : 4;
    return (size_t)TERN_KV_PAGE * L->n_kv_head * (v ? L->head_dim_v : L->head_dim_k) * es;
}

/* Makes host pages [0, n) exist in every attention layer. On error the pages that were
 * there stay (the new ones are freed again). */
static enum tern_status cpu_grow(struct tern_session *s, uint32_t n) {
    const uint32_t old = s->n_pages;
    if (n <= old) return TERN_OK;
    for (uint32_t il = 0; il < s->m->n_layer; il++) {
        const struct model_layer *L = &s->m->layers[il];
        if (L->kind != LAYER_ATTN) continue;
        for (uint32_t p = old; p < n; p++) {
            s->kv[il].k_pages[p] = tern_aligned_alloc(page_bytes(s, L, false));
            s->kv[il].v_pages[p] = tern_aligned_alloc(page_bytes(s, L, true));
            if (!s->kv[il].k_pages[p] || !s->kv[il].v_pages[p]) {
                s->n_pages = n; /* so that the shrink below frees this partial growth */
                for (uint32_t jl = 0; jl < s->m->n_layer; jl++) {
                    if (s->m->layers[jl].kind != LAYER_ATTN) continue;
                    for (uint32_t q = old; q < n; q++) {
                        tern_aligned_free(s->kv[jl].k_pages[q]);
                        tern_aligned_free(s->kv[jl].v_pages[q]);
                        s->kv[jl].k_pages[q] = s->kv[jl].v_pages[q] = NULL;
                    }
                }
                s->n_pages = old;
                return tern_errorf(TERN_ERR_NOMEM, "session: out of memory for KV pages up to position %u",
                                   n * TERN_KV_PAGE);
            }
        }
    }
    s->n_pages = n;
    return TERN_OK;
}

/* Frees the host pages beyond those that hold positions [0, n_pos). */
static void cpu_shrink(struct tern_session *s, uint32_t n_pos) {
    const uint32_t keep = (n_pos + TERN_KV_PAGE - 1) / TERN_KV_PAGE;
    if (keep >= s->n_pages) return;
    for (uint32_t il = 0; il < s->m->n_layer; il++) {
        if (s->m->layers[il].kind != LAYER_ATTN) continue;
        for (uint32_t p = keep; p < s->n_pages; p++) {
            tern_aligned_free(s->kv[il].k_pages[p]);
            tern_aligned_free(s->kv[il].v_pages[p]);
            s->kv[il].k_pages[p] = s->kv[il].v_pages[p] = NULL;
        }
    }
    s->n_pages = keep;
}

/* On the session's backend: its pages [0, n) / pages beyond positions [0, n_pos) may go. */
static enum tern_status kv_grow(struct tern_session *s, uint32_t n) {
    TERN_ASSERT(n <= s->n_pages_cap);
    return s->be->grow(s, n);
}

static void kv_shrink(struct tern_session *s, uint32_t n_pos) { s->be->shrink(s, n_pos); }

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
    s->be = m->gpu ? &session_be_gpu : &session_be_cpu;
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
    enum tern_status st = s->be->make(s);
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
    s->be->release(s);
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
    return b + s->be->bytes(s);
}

/* The recurrent block: s->rec up to date with the backend's state (a cache of it, so a
 * const session may refresh it); and the backend's set from rec (NULL: zero). */
static enum tern_status rec_sync(const struct tern_session *cs) {
    struct tern_session *s = (struct tern_session *)(uintptr_t)cs;
    return s->be->rec_sync(s);
}

static enum tern_status rec_put(struct tern_session *s, const void *rec) {
    if (!s->m->rec_bytes) return TERN_OK;
    if (rec) memcpy(s->rec, rec, s->m->rec_bytes);
    else memset(s->rec, 0, s->m->rec_bytes);
    return s->be->rec_push(s);
}

/* Sets s's recurrent state from checkpoint c, wherever c's bytes are. */
static enum tern_status rec_from_ckpt(struct tern_session *s, const struct tern_checkpoint *c) {
    return c->n_bytes ? s->be->ckpt_restore(s, c) : TERN_OK;
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

    enum tern_status st = s->be->eval_prepare(s, n_chunk, (uint32_t)n, o->rec_trail != NULL);
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
        if ((st = s->be->chunk(s, toks + done, (uint32_t)len, logits, o->logits_all != NULL, o->rec_trail,
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

/* tern_eval_batch's step on the CPU: one forward over every item's rows, the model's
 * workspace borrowed for it under eval_mu; each item's logits to it->logits_all (every
 * row) or its session's logits (the last row). */
static enum tern_status cpu_batch(const struct tern_batch_item *items, size_t n_items, size_t rows, uint32_t n_want) {
    struct tern_model *m = items[0].s->m;
    const uint32_t n_vocab = m->hp.n_vocab;
    int32_t *toks = tern_malloc(rows * sizeof *toks);
    struct model_seq *seq = tern_malloc(n_items * sizeof *seq);
    enum tern_status st = toks && seq ? TERN_OK : tern_errorf(TERN_ERR_NOMEM, "session: out of memory for a batch");
    for (size_t i = 0; i < n_items && !st; i++) st = tern_session_reserve(items[i].s, items[i].n);
    if (!st) {
        pthread_mutex_lock(&m->eval_mu);
        st = model_ws_reserve(m, (uint32_t)rows);
        if (!st && n_want) st = ws_logits_reserve(m, n_want);
        pthread_mutex_unlock(&m->eval_mu);
    }
    if (st) {
        for (size_t i = 0; i < n_items; i++) kv_shrink(items[i].s, items[i].s->n_past);
        free(toks);
        free(seq);
        return st;
    }
    uint32_t row = 0;
    for (size_t i = 0; i < n_items; i++) {
        const struct tern_batch_item *it = &items[i];
        seq[i] = (struct model_seq){.s = it->s, .row0 = row, .n = it->n, .pos0 = it->s->n_past,
                                    .want = it->logits || it->logits_all, .all = it->logits_all != NULL};
        memcpy(toks + row, it->toks, it->n * sizeof *toks);
        row += it->n;
    }
    pthread_mutex_lock(&m->eval_mu);
    TERN_ASSERT(m->ws.n_chunk >= rows && m->ws.logits_rows >= n_want);
    for (size_t i = 0; i < n_items; i++) {
        ws_bind(items[i].s);
        items[i].s->rec_trail = m->rec_bytes ? items[i].rec_trail : NULL;
    }
    const struct model_batch b = {.toks = toks, .n = (uint32_t)rows, .seq = seq, .n_seq = (uint32_t)n_items,
                                  .logits = n_want ? m->ws.logits : NULL};
    const struct model_step f = {&model_cpu_ops, items[0].s, m, &b};
    m->arch->forward(&f, items[0].s->rs);
    uint32_t k = 0; /* the wanted rows are the workspace's logits rows in item order */
    for (size_t i = 0; i < n_items; i++) {
        const struct tern_batch_item *it = &items[i];
        ws_unbind(it->s);
        if (it->logits_all) {
            memcpy(it->logits_all, m->ws.logits + (size_t)k * n_vocab, (size_t)it->n * n_vocab * sizeof(float));
            k += it->n;
        } else if (it->logits) {
            memcpy(it->s->logits, m->ws.logits + (size_t)k++ * n_vocab, n_vocab * sizeof(float));
        }
    }
    pthread_mutex_unlock(&m->eval_mu);
    free(toks);
    free(seq);
    return TERN_OK;
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
    enum tern_status st = items[0].s->be->batch(items, n_items, rows, n_want);
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
        enum tern_status st = s->be->trail_load(s, p - s->trail_pos0 - 1);
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
    s->be->trail_drop(s);
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
    if (s->be->ckpt_take(s, c)) {
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
    if (session_ckpt_on_device_model(c)) return session_gpu_ckpt_update(s, c);
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
    if (session_ckpt_on_device_model(c)) session_gpu_ckpt_release(c);
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
    if ((st = s->be->fork(s, src, p, ckpt))) {
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

static uint64_t cpu_kv_hash(const struct tern_session *s, uint32_t il, bool v) {
    const struct model_layer *L = &s->m->layers[il];
    void *const *pages = v ? s->kv[il].v_pages : s->kv[il].k_pages;
    const size_t hb = session_head_row_bytes(s, L, v);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    /* rows [0, n) of each page, head by head, as they lie in the page */
    for (uint32_t pos = 0; pos < s->n_past; pos += TERN_KV_PAGE) {
        const uint32_t rows = s->n_past - pos < TERN_KV_PAGE ? s->n_past - pos : TERN_KV_PAGE;
        for (uint32_t g = 0; g < L->n_kv_head; g++)
            XXH3_64bits_update(&st, (const char *)pages[pos / TERN_KV_PAGE] + (size_t)g * TERN_KV_PAGE * hb, rows * hb);
    }
    return XXH3_64bits_digest(&st);
}

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
            fn(ctx, name, s->be->kv_hash(s, il, false));
            snprintf(name, sizeof name, "blk.%u.v", il);
            fn(ctx, name, s->be->kv_hash(s, il, true));
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
    const size_t es = kv == TERN_KV_F16 ? 2 : 4;
    size_t b = 0;
    for (uint32_t il = 0; il < m->n_layer; il++) {
        const struct model_layer *L = &m->layers[il];
        if (L->kind == LAYER_ATTN) b += (size_t)L->n_kv_head * (L->head_dim_k + L->head_dim_v) * es;
    }
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
            enum tern_status st = s->be->kv_rows(s, il, v, p0, p1, buf, buf_rows, to_pages);
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
    if (!session_ckpt_on_device_model(cc)) return cc->data;
    return session_gpu_ckpt_data((struct tern_checkpoint *)(uintptr_t)cc);
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

/* ---- the CPU's backend (session-impl.h) ------------------------------------------ */

/* The page tables (n_pages_cap pointers per attention layer, the pages themselves taken
 * as the session grows) and the model's workspace for chunks of n_chunk. */
static enum tern_status cpu_make(struct tern_session *s) {
    const struct tern_model *m = s->m;
    s->kv = tern_calloc(m->n_layer, sizeof *s->kv);
    if (!s->kv) return tern_errorf(TERN_ERR_NOMEM, "session: out of memory");
    for (uint32_t il = 0; il < m->n_layer; il++) {
        if (m->layers[il].kind != LAYER_ATTN) continue;
        s->kv[il].k_pages = tern_calloc(s->n_pages_cap, sizeof(void *));
        s->kv[il].v_pages = tern_calloc(s->n_pages_cap, sizeof(void *));
        if (!s->kv[il].k_pages || !s->kv[il].v_pages) return tern_errorf(TERN_ERR_NOMEM, "session: out of memory");
    }
    pthread_mutex_lock(&s->m->eval_mu);
    const enum tern_status st = model_ws_reserve(s->m, s->n_chunk);
    pthread_mutex_unlock(&s->m->eval_mu);
    return st;
}

static void cpu_release(struct tern_session *s) {
    if (!s->kv) return;
    cpu_shrink(s, 0);
    for (uint32_t il = 0; il < s->m->n_layer; il++) {
        free(s->kv[il].k_pages);
        free(s->kv[il].v_pages);
    }
    free(s->kv);
    s->kv = NULL;
}

static size_t cpu_bytes(const struct tern_session *s) {
    size_t b = (size_t)s->m->n_layer * sizeof *s->kv;
    for (uint32_t il = 0; il < s->m->n_layer; il++) {
        const struct model_layer *L = &s->m->layers[il];
        if (L->kind == LAYER_ATTN)
            b += 2 * (size_t)s->n_pages_cap * sizeof(void *) +
                 (size_t)s->n_pages * (page_bytes(s, L, false) + page_bytes(s, L, true));
    }
    return b;
}

static enum tern_status cpu_rec_none(struct tern_session *s) {
    (void)s; /* s->rec is the state itself */
    return TERN_OK;
}

/* The model's workspace for chunks of n_chunk (the trail is the caller's buffer). */
static enum tern_status cpu_eval_prepare(struct tern_session *s, uint32_t n_chunk, uint32_t n, bool trail) {
    (void)n, (void)trail;
    pthread_mutex_lock(&s->m->eval_mu);
    const enum tern_status st = model_ws_reserve(s->m, n_chunk);
    pthread_mutex_unlock(&s->m->eval_mu);
    return st;
}

/* The forward over one chunk, the model's workspace borrowed for it under eval_mu (the
 * callbacks between chunks run without it, so they may use other sessions of the model;
 * it only ever grows, so what eval_prepare reserved still fits); with rec_trail the state
 * after token i into rec_trail's row slot0 + i. */
static enum tern_status cpu_chunk(struct tern_session *s, const int32_t *toks, uint32_t n, float *logits, bool all,
                                  void *rec_trail, uint32_t slot0) {
    struct tern_model *m = s->m;
    pthread_mutex_lock(&m->eval_mu);
    TERN_ASSERT(m->ws.n_chunk >= n);
    ws_bind(s);
    s->rec_trail = rec_trail && m->rec_bytes ? (uint8_t *)rec_trail + (size_t)slot0 * m->rec_bytes : NULL;
    const struct model_seq seq = {.s = s, .row0 = 0, .n = n, .pos0 = s->n_past, .want = logits != NULL, .all = all};
    const struct model_batch b = {.toks = toks, .n = n, .seq = &seq, .n_seq = 1, .logits = logits};
    const struct model_step f = {&model_cpu_ops, s, m, &b};
    m->arch->forward(&f, s->rs);
    ws_unbind(s);
    pthread_mutex_unlock(&m->eval_mu);
    return TERN_OK;
}

static enum tern_status cpu_trail_load(struct tern_session *s, uint32_t slot) {
    memcpy(s->rec, s->trail + (size_t)slot * s->m->rec_bytes, s->m->rec_bytes);
    return TERN_OK;
}

static void cpu_trail_drop(struct tern_session *s) { (void)s; /* the trail is the caller's buffer */ }

static bool cpu_ckpt_take(struct tern_session *s, struct tern_checkpoint *c) {
    (void)s, (void)c; /* made from s->rec by the host path */
    return false;
}

static enum tern_status cpu_ckpt_restore(struct tern_session *s, const struct tern_checkpoint *c) {
    memcpy(s->rec, c->data, c->n_bytes);
    return TERN_OK;
}

/* src's rows [0, p) page by page (dst's pages exist), and the recurrent block. */
static enum tern_status cpu_fork(struct tern_session *s, const struct tern_session *src, uint32_t p,
                                 const struct tern_checkpoint *ckpt) {
    for (uint32_t il = 0; il < s->m->n_layer; il++) {
        const struct model_layer *L = &s->m->layers[il];
        if (L->kind != LAYER_ATTN) continue;
        for (int v = 0; v < 2; v++) {
            void **dst = v ? s->kv[il].v_pages : s->kv[il].k_pages;
            void *const *from = v ? src->kv[il].v_pages : src->kv[il].k_pages;
            const size_t hb = session_head_row_bytes(s, L, v);
            for (uint32_t pg = 0; pg < s->n_pages; pg++) {
                const uint32_t rows = p - pg * TERN_KV_PAGE < TERN_KV_PAGE ? p - pg * TERN_KV_PAGE : TERN_KV_PAGE;
                for (uint32_t g = 0; g < L->n_kv_head; g++)
                    memcpy((char *)dst[pg] + (size_t)g * TERN_KV_PAGE * hb,
                           (const char *)from[pg] + (size_t)g * TERN_KV_PAGE * hb, rows * hb);
            }
        }
    }
    if (s->m->rec_bytes) memcpy(s->rec, ckpt ? ckpt->data : src->rec, s->m->rec_bytes);
    return TERN_OK;
}

static enum tern_status cpu_kv_rows(const struct tern_session *s, uint32_t il, bool v, uint32_t p0, uint32_t p1,
                                    uint8_t *buf, uint32_t buf_rows, bool to_pages) {
    const struct model_layer *L = &s->m->layers[il];
    void *const *pages = v ? s->kv[il].v_pages : s->kv[il].k_pages;
    const size_t hb = session_head_row_bytes(s, L, v);
    for (uint32_t g = 0; g < L->n_kv_head; g++) {
        uint8_t *run = buf + (size_t)g * buf_rows * hb;
        for (uint32_t pos = p0; pos < p1;) {
            const uint32_t pg = pos / TERN_KV_PAGE, in = pos % TERN_KV_PAGE;
            uint32_t rows = TERN_KV_PAGE - in;
            if (rows > p1 - pos) rows = p1 - pos;
            uint8_t *mem = (uint8_t *)pages[pg] + ((size_t)g * TERN_KV_PAGE + in) * hb;
            if (to_pages) memcpy(mem, run, rows * hb);
            else memcpy(run, mem, rows * hb);
            run += rows * hb;
            pos += rows;
        }
    }
    return TERN_OK;
}

const struct session_be session_be_cpu = {
    .make = cpu_make,
    .release = cpu_release,
    .bytes = cpu_bytes,
    .grow = cpu_grow,
    .shrink = cpu_shrink,
    .rec_sync = cpu_rec_none,
    .rec_push = cpu_rec_none,
    .eval_prepare = cpu_eval_prepare,
    .chunk = cpu_chunk,
    .batch = cpu_batch,
    .trail_load = cpu_trail_load,
    .trail_drop = cpu_trail_drop,
    .ckpt_take = cpu_ckpt_take,
    .ckpt_restore = cpu_ckpt_restore,
    .fork = cpu_fork,
    .kv_hash = cpu_kv_hash,
    .kv_rows = cpu_kv_rows,
};
