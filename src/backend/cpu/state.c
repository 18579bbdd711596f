/* The CPU's sessions (backend.h's state operations on host memory): KV rows in pages of
 * TERN_KV_PAGE positions taken as a session grows, the recurrent block in s->rec, and the
 * model's workspace that a session borrows for one forward (cpu.h). Everything generic
 * over where the state lives is model/session.c. */
/* XXH3_state_t on the stack (streaming hashes over KV pages). */
#define XXH_STATIC_LINKING_ONLY
#include "backend/cpu/cpu.h"

#include "model/session-impl.h"
#include "util/hash.h"
#include "util/mem.h"

#include <stdlib.h>
#include <string.h>

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
        for (size_t i = 0; i < n_items; i++) cpu_shrink(items[i].s, items[i].s->n_past);
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

static const struct backend_state cpu_state = {
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

/* The CPU's context for a model is its workspace (m->ws, borrowed by one forward at a
 * time under eval_mu). */
static void cpu_close(struct tern_model *m) {
    pthread_mutex_lock(&m->eval_mu);
    model_ws_free(m);
    pthread_mutex_unlock(&m->eval_mu);
}

const struct tern_backend tern_backend_cpu = {
    .name = "cpu",
    .ops = &model_cpu_ops,
    .state = &cpu_state,
    .close = cpu_close,
};
