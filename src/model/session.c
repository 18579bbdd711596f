/* Sessions: the state of one conversation (DESIGN.md §3) — tokens T[0..n), KV rows in
 * pages that grow with use, recurrent buffers — and the state operations: eval in
 * chunks, rewind, checkpoint/restore, fork, hashes. Everything here is generic over the
 * layer kinds a model declares; the per-architecture math is in arch-*.c.
 *
 * A device session (the model on a Vulkan device, device.c) keeps the same token list,
 * logits and host copy of the recurrent state (s->rec, refreshed lazily: rec_stale), but
 * its KV pages and recurrent state live in a tern_gpu_state (model/gpu.h: the pages taken
 * as the session grows, as kv_grow takes the CPU's); each state
 * operation below branches once on s->gpu and moves bytes to or from the device, laid
 * out as the CPU's, so checkpoints, hashes and the disk tier read the same. Fork copies
 * KV rows and recurrent state from state to state on the device; a checkpoint may live
 * in device memory (tern_model_set_ckpt_vram: "checkpoints in device memory" below) and
 * is then taken and restored by copies on the device too. tern_eval_batch on a device is
 * one device step over the items' rows (tern_gpu_eval_batch), as the CPU's is one forward. */
/* XXH3_state_t on the stack (streaming hashes over KV pages). */
#define XXH_STATIC_LINKING_ONLY
#include "model/model.h"

#include "model/backend.h"
#include "model/ctx-default.h"
#include "model/gpu.h"

#include "util/hash.h"
#include "util/log.h"
#include "util/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_N_CTX (1u << 24)

struct tern_checkpoint {
    const struct tern_model *m;
    uint32_t pos;
    uint64_t tok_hash; /* xxh3 of T[0..pos) */
    size_t n_bytes;
    /* Where the bytes are (under m->ckpt_mu when m is on a device): data, the recurrent
     * buffers layer by layer in host memory (n_bytes), and/or dev, the same bytes in a
     * device buffer. A device checkpoint gets data when something reads its bytes
     * (tern_checkpoint_data: a host copy, the device one kept) or when it is spilled (dev
     * freed). Once in host memory the bytes stay there until the checkpoint is freed. */
    uint8_t *data;
    struct tern_vk_buf *dev;
    struct tern_checkpoint *older, *newer; /* m's list of checkpoints with a dev */
};

static uint32_t vram_spill_all(struct tern_model *m);

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

/* Makes pages [0, n) exist in every attention layer. On error the pages that were there
 * stay (the new ones are freed again). */
static enum tern_status kv_grow(struct tern_session *s, uint32_t n) {
    TERN_ASSERT(n <= s->n_pages_cap);
    const uint32_t old = s->n_pages;
    if (n <= old) return TERN_OK;
    if (s->gpu) {
        /* the device's pages (tern_gpu_state_reserve); checkpoints kept on the device go
         * to host memory first when there is no room */
        const uint32_t n_pos = n * TERN_KV_PAGE < s->n_ctx ? n * TERN_KV_PAGE : s->n_ctx;
        enum tern_status st = tern_gpu_state_reserve(s->m->gpu, s->gpu, n_pos);
        if (st == TERN_ERR_NOMEM && vram_spill_all(s->m)) {
            TERN_LOG_INFO("session: checkpoints moved from the device to host memory to make room for KV pages");
            st = tern_gpu_state_reserve(s->m->gpu, s->gpu, n_pos);
        }
        return st; /* s->n_pages counts host pages: none here */
    }
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

/* Frees the pages beyond those that hold positions [0, n_pos). */
static void kv_shrink(struct tern_session *s, uint32_t n_pos) {
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

/* Pages hold each kv head's rows together: [n_kv_head][TERN_KV_PAGE][head_dim]. */
static size_t head_row_bytes(const struct tern_session *s, const struct model_layer *L, bool v) {
    return page_bytes(s, L, v) / TERN_KV_PAGE / L->n_kv_head;
}

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
    s->kv = tern_calloc(m->n_layer, sizeof *s->kv);
    s->logits = tern_malloc((size_t)m->hp.n_vocab * sizeof(float));
    if (m->rec_bytes) s->rec = tern_aligned_alloc(m->rec_bytes);
    if (!s->kv || !s->logits || (m->rec_bytes && !s->rec)) goto nomem;
    if (s->rec) memset(s->rec, 0, m->rec_bytes);
    for (uint32_t il = 0; il < m->n_layer; il++) {
        if (m->layers[il].kind != LAYER_ATTN) continue;
        s->kv[il].k_pages = tern_calloc(s->n_pages_cap, sizeof(void *));
        s->kv[il].v_pages = tern_calloc(s->n_pages_cap, sizeof(void *));
        if (!s->kv[il].k_pages || !s->kv[il].v_pages) goto nomem;
    }
    enum tern_status st;
    if (m->gpu) {
        st = tern_gpu_state_new(m->gpu, n_ctx, kv_type == TERN_KV_F16, &s->gpu);
        /* checkpoints kept on the device never keep a session from being made: they go
         * to host memory first */
        if (st == TERN_ERR_NOMEM && vram_spill_all(m)) {
            TERN_LOG_INFO("session: checkpoints moved from the device to host memory to make room for a session");
            st = tern_gpu_state_new(m->gpu, n_ctx, kv_type == TERN_KV_F16, &s->gpu);
        }
    } else {
        pthread_mutex_lock(&m->eval_mu);
        st = model_ws_reserve(m, n_chunk);
        pthread_mutex_unlock(&m->eval_mu);
    }
    if (st) {
        tern_session_free(s);
        return st;
    }
    *out = s;
    return TERN_OK;
nomem:
    tern_session_free(s);
    return tern_errorf(TERN_ERR_NOMEM, "session: out of memory");
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
    if (s->kv) {
        kv_shrink(s, 0);
        for (uint32_t il = 0; il < s->m->n_layer; il++) {
            free(s->kv[il].k_pages);
            free(s->kv[il].v_pages);
        }
    }
    free(s->kv);
    free(s->tokens);
    free(s->logits);
    tern_aligned_free(s->rec);
    tern_gpu_state_free(s->gpu);
    atomic_fetch_sub(&s->m->n_sessions, 1);
    free(s);
}

struct tern_model *tern_session_model(const struct tern_session *s) { return s->m; }
uint32_t tern_session_n_ctx(const struct tern_session *s) { return s->n_ctx; }
uint32_t tern_session_n_past(const struct tern_session *s) { return s->n_past; }
const int32_t *tern_session_tokens(const struct tern_session *s) { return s->tokens; }
const float *tern_session_logits(const struct tern_session *s) { return s->logits_valid ? s->logits : NULL; }

size_t tern_session_bytes(const struct tern_session *s) {
    size_t b = sizeof *s + (size_t)s->tokens_cap * sizeof(int32_t) + (size_t)s->m->hp.n_vocab * sizeof(float) +
               s->m->rec_bytes + (size_t)s->m->n_layer * sizeof *s->kv;
    for (uint32_t il = 0; il < s->m->n_layer; il++) {
        const struct model_layer *L = &s->m->layers[il];
        if (L->kind != LAYER_ATTN) continue;
        b += 2 * (size_t)s->n_pages_cap * sizeof(void *);
        b += (size_t)s->n_pages * (page_bytes(s, L, false) + page_bytes(s, L, true));
    }
    if (s->gpu) b += tern_gpu_state_bytes(s->gpu);
    return b;
}

/* ---- device sessions ------------------------------------------------------------ */

/* Brings s->rec up to date with the device's recurrent state. The host copy is a cache
 * of the device's bytes, so a const session may refresh it. */
static enum tern_status rec_sync(const struct tern_session *cs) {
    struct tern_session *s = (struct tern_session *)(uintptr_t)cs;
    if (!s->gpu || !s->rec_stale || !s->m->rec_bytes) return TERN_OK;
    enum tern_status st = tern_gpu_rec_download(s->m->gpu, s->gpu, s->rec);
    if (st) return tern_error_prefix(st, "session: downloading the recurrent state");
    s->rec_stale = false;
    return TERN_OK;
}

/* Sets the device's recurrent state (and the host copy) from rec (NULL: zero). */
static enum tern_status rec_put(struct tern_session *s, const void *rec) {
    if (!s->m->rec_bytes) return TERN_OK;
    if (rec) memcpy(s->rec, rec, s->m->rec_bytes);
    else memset(s->rec, 0, s->m->rec_bytes);
    if (!s->gpu) return TERN_OK;
    enum tern_status st = tern_gpu_rec_upload(s->m->gpu, s->gpu, s->rec);
    if (st) return tern_error_prefix(st, "session: uploading the recurrent state");
    s->rec_stale = false;
    return TERN_OK;
}

/* ---- checkpoints in device memory ------------------------------------------------ */

/* A device model's checkpoints may keep their bytes in a device buffer (c->dev) under the
 * model's budget: taking one is then a copy on the device, and so are restoring and
 * forking from it. The list runs from the least recently taken or restored to the most;
 * when a new one would pass the budget the oldest spill (downloaded into host memory, the
 * device buffer freed). Everything here holds m->ckpt_mu, which is taken before the
 * tern_gpu's lock (the copies take that one themselves). */

static struct tern_model *ck_model(const struct tern_checkpoint *c) { return (struct tern_model *)(uintptr_t)c->m; }

/* Whether c's model keeps checkpoints whose placement needs ckpt_mu. */
static bool ck_locked(const struct tern_checkpoint *c) { return c->n_bytes && c->m->gpu; }

static void vram_unlink(struct tern_model *m, struct tern_checkpoint *c) {
    if (c->older) c->older->newer = c->newer;
    else m->ckpt_oldest = c->newer;
    if (c->newer) c->newer->older = c->older;
    else m->ckpt_newest = c->older;
    c->older = c->newer = NULL;
}

static void vram_link_newest(struct tern_model *m, struct tern_checkpoint *c) {
    c->older = m->ckpt_newest;
    c->newer = NULL;
    if (m->ckpt_newest) m->ckpt_newest->newer = c;
    else m->ckpt_oldest = c;
    m->ckpt_newest = c;
}

/* Gives c a host copy of its device bytes (ckpt_mu held). */
static enum tern_status vram_host_copy(struct tern_model *m, struct tern_checkpoint *c) {
    if (c->data) return TERN_OK;
    uint8_t *d = tern_malloc(c->n_bytes);
    if (!d) return tern_errorf(TERN_ERR_NOMEM, "session: out of memory for a checkpoint of %zu bytes", c->n_bytes);
    enum tern_status st = tern_gpu_rec_read(m->gpu, c->dev, d);
    if (st) {
        free(d);
        return tern_error_prefix(st, "session: downloading a checkpoint at %u", c->pos);
    }
    c->data = d;
    return TERN_OK;
}

/* Moves c to host memory (ckpt_mu held). On error c stays on the device. */
static enum tern_status vram_spill(struct tern_model *m, struct tern_checkpoint *c) {
    enum tern_status st = vram_host_copy(m, c);
    if (st) return st;
    vram_unlink(m, c);
    tern_gpu_rec_free(m->gpu, c->dev);
    c->dev = NULL;
    m->ckpt_vram_bytes -= c->n_bytes;
    m->ckpt_vram_n--;
    m->ckpt_spilled++;
    return TERN_OK;
}

/* Spills the oldest until need more bytes fit the budget (ckpt_mu held); false when they
 * cannot (a spill failed: logged, the rest stay). */
static bool vram_make_room(struct tern_model *m, size_t need) {
    while (m->ckpt_oldest && m->ckpt_vram_bytes + need > m->ckpt_vram_budget) {
        if (vram_spill(m, m->ckpt_oldest)) {
            TERN_LOG_ERROR("session: spilling a checkpoint to host memory: %s", tern_last_error());
            return false;
        }
    }
    return m->ckpt_vram_bytes + need <= m->ckpt_vram_budget;
}

/* Every checkpoint on the device to host memory; how many moved. */
static uint32_t vram_spill_all(struct tern_model *m) {
    if (!m->gpu) return 0;
    pthread_mutex_lock(&m->ckpt_mu);
    const uint32_t n = m->ckpt_vram_n;
    const size_t keep = m->ckpt_vram_budget;
    m->ckpt_vram_budget = 0;
    (void)vram_make_room(m, 0);
    m->ckpt_vram_budget = keep;
    const uint32_t moved = n - m->ckpt_vram_n;
    pthread_mutex_unlock(&m->ckpt_mu);
    return moved;
}

/* Makes c a device checkpoint of s's recurrent state, if the budget and the device have
 * room: true when it did. A device that has no room leaves c to the host path (counted);
 * a copy that fails too (its message is logged: the host path then says what is wrong). */
static bool vram_take(struct tern_session *s, struct tern_checkpoint *c) {
    struct tern_model *m = s->m;
    if (!m->gpu || !c->n_bytes) return false;
    pthread_mutex_lock(&m->ckpt_mu);
    bool ok = c->n_bytes <= m->ckpt_vram_budget && vram_make_room(m, c->n_bytes);
    struct tern_vk_buf *b = NULL;
    if (ok) {
        enum tern_status st = tern_gpu_rec_new(m->gpu, &b);
        /* the device's room, not the budget: the oldest on the device makes way, once */
        if (st == TERN_ERR_NOMEM && m->ckpt_oldest && !vram_spill(m, m->ckpt_oldest))
            st = tern_gpu_rec_new(m->gpu, &b);
        if (st) {
            TERN_LOG_DEBUG("session: checkpoint at %u in host memory: %s", s->n_past, tern_last_error());
            m->ckpt_fallbacks++;
            ok = false;
        } else if ((st = tern_gpu_rec_save(m->gpu, s->gpu, b))) {
            TERN_LOG_ERROR("session: a checkpoint at %u on the device: %s", s->n_past, tern_last_error());
            tern_gpu_rec_free(m->gpu, b);
            ok = false;
        }
    }
    if (ok) {
        c->dev = b;
        vram_link_newest(m, c);
        m->ckpt_vram_bytes += c->n_bytes;
        m->ckpt_vram_n++;
        m->ckpt_kept++;
    }
    pthread_mutex_unlock(&m->ckpt_mu);
    return ok;
}

/* Sets s's recurrent state from checkpoint c, wherever c's bytes are. */
static enum tern_status rec_from_ckpt(struct tern_session *s, const struct tern_checkpoint *cc) {
    if (!cc->n_bytes) return TERN_OK;
    if (!s->gpu) return rec_put(s, cc->data);
    struct tern_model *m = s->m;
    struct tern_checkpoint *c = (struct tern_checkpoint *)(uintptr_t)cc; /* its place in the list moves */
    pthread_mutex_lock(&m->ckpt_mu);
    enum tern_status st;
    if (c->dev) {
        st = tern_gpu_rec_load(m->gpu, s->gpu, c->dev);
        s->rec_stale = true; /* also on failure: the device's state is then undefined */
        if (st) tern_error_prefix(st, "session: restoring a checkpoint on the device");
        else {
            vram_unlink(m, c);
            vram_link_newest(m, c);
            m->ckpt_restores_dev++;
        }
    } else if (c->data) {
        st = rec_put(s, c->data);
        if (!st) m->ckpt_restores_host++;
    } else {
        st = tern_errorf(TERN_ERR_IO, "session: the checkpoint at %u was lost with the device", c->pos);
    }
    pthread_mutex_unlock(&m->ckpt_mu);
    return st;
}

void tern_model_set_ckpt_vram(struct tern_model *m, size_t bytes) {
    pthread_mutex_lock(&m->ckpt_mu);
    m->ckpt_vram_budget = bytes;
    if (m->gpu) (void)vram_make_room(m, 0);
    pthread_mutex_unlock(&m->ckpt_mu);
}

void tern_model_ckpt_vram_stats(const struct tern_model *cm, struct tern_ckpt_vram_stats *out) {
    struct tern_model *m = (struct tern_model *)(uintptr_t)cm;
    pthread_mutex_lock(&m->ckpt_mu);
    *out = (struct tern_ckpt_vram_stats){.budget = m->ckpt_vram_budget, .bytes = m->ckpt_vram_bytes,
                                         .n = m->ckpt_vram_n, .kept = m->ckpt_kept, .spilled = m->ckpt_spilled,
                                         .fallbacks = m->ckpt_fallbacks, .restores_device = m->ckpt_restores_dev,
                                         .restores_host = m->ckpt_restores_host};
    pthread_mutex_unlock(&m->ckpt_mu);
}

void model_ckpt_vram_release(struct tern_model *m) {
    if (!m->gpu || !m->ckpt_vram_n) return;
    (void)vram_spill_all(m);
    /* those that could not be read back (a lost device) lose their bytes: restoring them
     * then fails, never gives a wrong state */
    pthread_mutex_lock(&m->ckpt_mu);
    if (m->ckpt_vram_n) TERN_LOG_ERROR("session: %u checkpoints lost with the device", m->ckpt_vram_n);
    while (m->ckpt_oldest) {
        struct tern_checkpoint *c = m->ckpt_oldest;
        vram_unlink(m, c);
        tern_gpu_rec_free(m->gpu, c->dev);
        c->dev = NULL;
        m->ckpt_vram_bytes -= c->n_bytes;
        m->ckpt_vram_n--;
    }
    pthread_mutex_unlock(&m->ckpt_mu);
}

/* One chunk on the device (the CPU's forward otherwise); with a trail (the state's trail
 * reserved), the recurrent state after token i goes to trail slot slot0 + i; the hidden
 * states the session captures (or, an MTP head's, reads) as on the CPU. */
static enum tern_status gpu_chunk(struct tern_session *s, const int32_t *toks, uint32_t n, float *logits, bool all,
                                  bool trail, uint32_t slot0) {
    s->rec_stale = true; /* also on failure: the device's state is then undefined */
    const struct tern_gpu_io io = {.trail = trail, .slot0 = slot0, .hidden_in = s->hidden_in,
                                   .hidden_out = s->hidden_out, .hidden_pos0 = s->hidden_pos0};
    enum tern_status st = tern_gpu_eval_io(s->m->gpu, s->gpu, s->n_past, toks, n, n, logits, all, &io);
    if (st) TERN_LOG_ERROR("session: the device failed at position %u: %s", s->n_past, tern_last_error());
    return st;
}

/* One chunk of toks[0..n) at s's end, on s's backend: the device (gpu_chunk: its lock
 * for the chunk; with dev_trail the state after token i into trail slot slot0 + i) or
 * the CPU's forward (the model's workspace borrowed for the chunk under eval_mu: the
 * callbacks between chunks run without it, so they may use other sessions of the model;
 * it only ever grows, so what the eval reserved still fits; with rec_trail the state
 * after token i into rec_trail's row slot0 + i). logits: the last row's, or every row's
 * when all; NULL: none. The caller moves n_past. */
static enum tern_status run_chunk(struct tern_session *s, const int32_t *toks, uint32_t n, float *logits, bool all,
                                  void *rec_trail, bool dev_trail, uint32_t slot0) {
    if (s->gpu) return gpu_chunk(s, toks, n, logits, all, dev_trail, slot0);
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

    enum tern_status st = TERN_OK;
    if (!s->gpu) {
        pthread_mutex_lock(&m->eval_mu);
        st = model_ws_reserve(m, n_chunk);
        pthread_mutex_unlock(&m->eval_mu);
    }
    if (!st) st = tokens_reserve(s, (size_t)s->n_past + n);
    if (!st) st = kv_grow(s, (uint32_t)((s->n_past + n + TERN_KV_PAGE - 1) / TERN_KV_PAGE));
    /* a device session keeps its trail in device memory (o->rec_trail is not written) */
    const bool dev_trail = o->rec_trail && m->rec_bytes && s->gpu;
    if (!st && dev_trail) st = tern_gpu_trail_reserve(m->gpu, s->gpu, (uint32_t)n);
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
        if ((st = run_chunk(s, toks + done, (uint32_t)len, logits, o->logits_all != NULL, o->rec_trail, dev_trail,
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

/* tern_eval_batch's step on the device: the items' rows are one device step
 * (tern_gpu_eval_batch: the matmuls over every row, attention and the DeltaNet per session
 * against its own state), split into steps of the device's chunk when they are more; each
 * item's bits are those of its own eval, which is what the batch promises. Its logits go
 * to it->logits_all (every row) or its session's logits (the last row). A device failure
 * leaves every item's device state undefined (and the sessions' positions where they
 * were): the caller fails them all. */
static enum tern_status batch_gpu(const struct tern_batch_item *items, size_t n_items, size_t rows) {
    struct tern_model *m = items[0].s->m;
    struct tern_gpu_seq *gs = tern_malloc(n_items * sizeof *gs);
    struct tern_gpu_io *io = tern_malloc(n_items * sizeof *io);
    enum tern_status st = gs && io ? TERN_OK : tern_errorf(TERN_ERR_NOMEM, "session: out of memory for a batch");
    for (size_t i = 0; i < n_items && !st; i++) {
        st = tern_session_reserve(items[i].s, items[i].n);
        /* a trail is kept in device memory (the item's rec_trail is not written) */
        if (!st && items[i].rec_trail && m->rec_bytes) st = tern_gpu_trail_reserve(m->gpu, items[i].s->gpu, items[i].n);
    }
    for (size_t i = 0; i < n_items && !st; i++) {
        const struct tern_batch_item *it = &items[i];
        struct tern_session *s = it->s;
        io[i] = (struct tern_gpu_io){.trail = it->rec_trail && m->rec_bytes, .hidden_in = s->hidden_in,
                                     .hidden_out = s->hidden_out, .hidden_pos0 = s->hidden_pos0};
        gs[i] = (struct tern_gpu_seq){.st = s->gpu, .pos0 = s->n_past, .toks = it->toks, .n = it->n,
                                      .logits = it->logits_all ? it->logits_all : it->logits ? s->logits : NULL,
                                      .all = it->logits_all != NULL, .io = &io[i]};
        /* as gpu_chunk: the host copy of the recurrent state is stale from here on (also
         * on failure: the device's state is then undefined) */
        s->trail = NULL;
        s->logits_valid = false;
        s->rec_stale = true;
    }
    if (!st) {
        st = tern_gpu_eval_batch(m->gpu, gs, (uint32_t)n_items, 0);
        /* the position is the first item's (the log's pattern for a device failure) */
        if (st)
            TERN_LOG_ERROR("session: the device failed at position %u: %s (a step of %zu sessions, %zu rows)",
                           items[0].s->n_past, tern_last_error(), n_items, rows);
    }
    free(gs);
    free(io);
    return st;
}

/* tern_eval_batch's step on the CPU: one forward over every item's rows, the model's
 * workspace borrowed for it under eval_mu; each item's logits to it->logits_all (every
 * row) or its session's logits (the last row). */
static enum tern_status batch_cpu(const struct tern_batch_item *items, size_t n_items, size_t rows, uint32_t n_want) {
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
    enum tern_status st = m->gpu ? batch_gpu(items, n_items, rows) : batch_cpu(items, n_items, rows, n_want);
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
        const uint32_t slot = p - s->trail_pos0 - 1;
        if (s->gpu) {
            s->rec_stale = true;
            enum tern_status st = tern_gpu_trail_load(s->m->gpu, s->gpu, slot);
            if (st) return tern_error_prefix(st, "session: rewinding to %u from the device's state trail", p);
        } else {
            memcpy(s->rec, s->trail + (size_t)slot * s->m->rec_bytes, s->m->rec_bytes);
        }
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
    if (s->gpu) tern_gpu_trail_release(s->m->gpu, s->gpu);
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
    if (s->gpu && vram_take(s, c)) {
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
    if (ck_locked(c)) {
        /* a device checkpoint is retaken on the device, its host copy (if any) as well */
        struct tern_model *m = ck_model(c);
        pthread_mutex_lock(&m->ckpt_mu);
        enum tern_status st = c->dev ? tern_gpu_rec_save(m->gpu, s->gpu, c->dev) : TERN_OK;
        if (!st && c->data && !(st = rec_sync(s))) memcpy(c->data, s->rec, c->n_bytes);
        if (!st) {
            c->pos = s->n_past;
            c->tok_hash = tokens_hash(s->tokens, s->n_past);
        }
        pthread_mutex_unlock(&m->ckpt_mu);
        return st;
    }
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
    if (ck_locked(c)) {
        struct tern_model *m = ck_model(c);
        pthread_mutex_lock(&m->ckpt_mu);
        if (c->dev) {
            vram_unlink(m, c);
            tern_gpu_rec_free(m->gpu, c->dev);
            m->ckpt_vram_bytes -= c->n_bytes;
            m->ckpt_vram_n--;
        }
        pthread_mutex_unlock(&m->ckpt_mu);
    }
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
    if (s->gpu) {
        /* on the device: KV rows [0, p), and the recurrent state from src's or from the
         * checkpoint's (on the device or uploaded from host memory) */
        st = tern_gpu_state_copy(s->m->gpu, src->gpu, s->gpu, p, !ckpt);
        if (st) tern_error_prefix(st, "session: forking at %u on the device", p);
        if (!st && !ckpt) s->rec_stale = true;
        if (!st && ckpt) st = rec_from_ckpt(s, ckpt);
        if (st) {
            tern_session_free(s);
            return st;
        }
    }
    for (uint32_t il = 0; il < s->m->n_layer && !s->gpu; il++) {
        const struct model_layer *L = &s->m->layers[il];
        if (L->kind != LAYER_ATTN) continue;
        for (int v = 0; v < 2; v++) {
            void **dst = v ? s->kv[il].v_pages : s->kv[il].k_pages;
            void *const *from = v ? src->kv[il].v_pages : src->kv[il].k_pages;
            const size_t hb = head_row_bytes(s, L, v);
            for (uint32_t pg = 0; pg < s->n_pages; pg++) {
                const uint32_t rows = p - pg * TERN_KV_PAGE < TERN_KV_PAGE ? p - pg * TERN_KV_PAGE : TERN_KV_PAGE;
                for (uint32_t g = 0; g < L->n_kv_head; g++)
                    memcpy((char *)dst[pg] + (size_t)g * TERN_KV_PAGE * hb,
                           (const char *)from[pg] + (size_t)g * TERN_KV_PAGE * hb, rows * hb);
            }
        }
    }
    if (s->m->rec_bytes && !s->gpu) memcpy(s->rec, ckpt ? ckpt->data : src->rec, s->m->rec_bytes);
    s->n_past = p;
    if (p == src->n_past && src->logits_valid) {
        memcpy(s->logits, src->logits, (size_t)s->m->hp.n_vocab * sizeof(float));
        s->logits_valid = true;
    }
    *out = s;
    return TERN_OK;
}

/* ---- hashes --------------------------------------------------------------------- */

/* A device session's rows [0, n) of layer il's K or V, downloaded head by head and hashed
 * in the CPU's order (page by page, heads within a page), so that the stream of bytes is
 * the one kv_hash hashes. 0 (logged) when the download fails. */
static uint64_t gpu_kv_hash(const struct tern_session *s, uint32_t il, bool v) {
    const struct model_layer *L = &s->m->layers[il];
    const size_t hb = head_row_bytes(s, L, v), run = (size_t)s->n_past * hb;
    uint8_t *tmp = tern_malloc(run * L->n_kv_head + 1);
    enum tern_status st = tmp ? tern_gpu_kv_download(s->m->gpu, s->gpu, il, v, 0, s->n_past, tmp, run)
                              : tern_errorf(TERN_ERR_NOMEM, "out of memory");
    uint64_t h = 0;
    if (!st) {
        XXH3_state_t x;
        XXH3_64bits_reset(&x);
        for (uint32_t pos = 0; pos < s->n_past; pos += TERN_KV_PAGE) {
            const uint32_t rows = s->n_past - pos < TERN_KV_PAGE ? s->n_past - pos : TERN_KV_PAGE;
            for (uint32_t g = 0; g < L->n_kv_head; g++) XXH3_64bits_update(&x, tmp + g * run + pos * hb, rows * hb);
        }
        h = XXH3_64bits_digest(&x);
    } else {
        TERN_LOG_ERROR("session: state hash of blk.%u.%c: %s", il, v ? 'v' : 'k', tern_last_error());
    }
    free(tmp);
    return h;
}

static uint64_t kv_hash(const struct tern_session *s, uint32_t il, bool v) {
    if (s->gpu) return gpu_kv_hash(s, il, v);
    const struct model_layer *L = &s->m->layers[il];
    void *const *pages = v ? s->kv[il].v_pages : s->kv[il].k_pages;
    const size_t hb = head_row_bytes(s, L, v);
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
            fn(ctx, name, kv_hash(s, il, false));
            snprintf(name, sizeof name, "blk.%u.v", il);
            fn(ctx, name, kv_hash(s, il, true));
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
static enum tern_status kv_walk(const struct tern_session *s, uint32_t p0, uint32_t p1, uint8_t *buf, bool to_pages,
                                uint32_t buf_rows) {
    for (uint32_t il = 0; il < s->m->n_layer; il++) {
        const struct model_layer *L = &s->m->layers[il];
        if (L->kind != LAYER_ATTN) continue;
        for (int v = 0; v < 2 && s->gpu; v++) {
            /* the device's cache holds each head's rows contiguously, as a run of buf does */
            const size_t run = (size_t)buf_rows * head_row_bytes(s, L, v);
            enum tern_status st = to_pages ? tern_gpu_kv_upload(s->m->gpu, s->gpu, il, v, p0, p1, buf, run)
                                           : tern_gpu_kv_download(s->m->gpu, s->gpu, il, v, p0, p1, buf, run);
            if (st)
                return tern_error_prefix(st, "session: %s KV rows [%u, %u) of layer %u",
                                         to_pages ? "uploading" : "downloading", p0, p1, il);
            buf += run * L->n_kv_head;
        }
        for (int v = 0; v < 2 && !s->gpu; v++) {
            void **pages = v ? s->kv[il].v_pages : s->kv[il].k_pages;
            const size_t hb = head_row_bytes(s, L, v);
            for (uint32_t g = 0; g < L->n_kv_head; g++) {
                uint8_t *run = buf;
                for (uint32_t pos = p0; pos < p1;) {
                    const uint32_t pg = pos / TERN_KV_PAGE, in = pos % TERN_KV_PAGE;
                    uint32_t rows = TERN_KV_PAGE - in;
                    if (rows > p1 - pos) rows = p1 - pos;
                    uint8_t *mem = (uint8_t *)pages[pg] + ((size_t)g * TERN_KV_PAGE + in) * hb;
                    if (to_pages) memcpy(mem, buf, rows * hb);
                    else memcpy(buf, mem, rows * hb);
                    buf += rows * hb;
                    pos += rows;
                }
                buf = run + (size_t)buf_rows * hb;
            }
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
    if (!ck_locked(cc)) return cc->data;
    /* a device checkpoint gets a host copy (kept until it is freed: the pointer stays
     * valid) and stays on the device */
    struct tern_checkpoint *c = (struct tern_checkpoint *)(uintptr_t)cc;
    struct tern_model *m = ck_model(c);
    pthread_mutex_lock(&m->ckpt_mu);
    const enum tern_status st = c->dev ? vram_host_copy(m, c) : TERN_OK;
    const void *d = c->data;
    pthread_mutex_unlock(&m->ckpt_mu);
    if (st) TERN_LOG_ERROR("session: %s", tern_last_error());
    return st ? NULL : d;
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
