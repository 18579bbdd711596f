/* Sessions on a Vulkan device (backend.h's state operations over gpu.h): a
 * session's KV pages and recurrent state live in a tern_gpu_state, taken as it grows;
 * s->rec is a host copy of the recurrent state, refreshed only when something reads it
 * (rec_stale). Fork copies KV pages and recurrent state from state to state on the
 * device; a checkpoint may live in device memory (tern_model_set_ckpt_vram: "checkpoints
 * in device memory" below) and is then taken and restored by copies on the device too;
 * tern_eval_batch is one device step over the items' rows (tern_gpu_eval_batch). Every
 * byte that leaves the device is laid out as the CPU's, so hashes, checkpoints and the
 * disk tier read the same on both backends. */
/* XXH3_state_t on the stack (the hashes of KV rows). */
#define XXH_STATIC_LINKING_ONLY
#include "model/session-impl.h"

#include "backend/vulkan/gpu.h"

#include "util/hash.h"
#include "util/log.h"
#include "util/mem.h"

#include <stdlib.h>
#include <string.h>

/* The model's device context (NULL on another backend) and a session's state on it. */
static struct tern_gpu *GPU(const struct tern_model *m) {
    return m->backend == &tern_backend_vulkan ? m->backend_ctx : NULL;
}
static struct tern_gpu_state *GST(const struct tern_session *s) { return s->dev; }

/* ---- the state ------------------------------------------------------------------- */

static uint32_t vram_spill_all(struct tern_model *m);

static enum tern_status gpu_make(struct tern_session *s) {
    struct tern_model *m = s->m;
    const bool f16 = s->kv_type == TERN_KV_F16;
    struct tern_gpu_state *gs = NULL;
    enum tern_status st = tern_gpu_state_new(GPU(m), s->n_ctx, f16, &gs);
    /* checkpoints kept on the device never keep a session from being made: they go to
     * host memory first */
    if (st == TERN_ERR_NOMEM && vram_spill_all(m)) {
        TERN_LOG_INFO("session: checkpoints moved from the device to host memory to make room for a session");
        st = tern_gpu_state_new(GPU(m), s->n_ctx, f16, &gs);
    }
    s->dev = gs;
    return st;
}

static void gpu_release(struct tern_session *s) {
    tern_gpu_state_free(GST(s));
    s->dev = NULL;
}

static size_t gpu_bytes(const struct tern_session *s) { return GST(s) ? tern_gpu_state_bytes(GST(s)) : 0; }

/* The device's pages (tern_gpu_state_reserve); checkpoints kept on the device go to host
 * memory first when there is no room. */
static enum tern_status gpu_grow(struct tern_session *s, uint32_t n) {
    const uint32_t n_pos = n * TERN_KV_PAGE < s->n_ctx ? n * TERN_KV_PAGE : s->n_ctx;
    enum tern_status st = tern_gpu_state_reserve(GPU(s->m), GST(s), n_pos);
    if (st == TERN_ERR_NOMEM && vram_spill_all(s->m)) {
        TERN_LOG_INFO("session: checkpoints moved from the device to host memory to make room for KV pages");
        st = tern_gpu_state_reserve(GPU(s->m), GST(s), n_pos);
    }
    return st;
}

/* A session rewound, restored or cancelled far below the pages it holds gives them back
 * (a parked conversation holds the device memory of its tokens, not of its longest
 * extent); one rewound a little keeps them and grows into them again. */
static void gpu_shrink(struct tern_session *s, uint32_t n_pos) {
    if (GST(s)) tern_gpu_state_shrink(GPU(s->m), GST(s), n_pos);
}

/* Brings s->rec up to date with the device's recurrent state. */
static enum tern_status gpu_rec_sync(struct tern_session *s) {
    if (!s->rec_stale || !s->m->rec_bytes) return TERN_OK;
    enum tern_status st = tern_gpu_rec_download(GPU(s->m), GST(s), s->rec);
    if (st) return tern_error_prefix(st, "session: downloading the recurrent state");
    s->rec_stale = false;
    return TERN_OK;
}

/* Sets the device's recurrent state from s->rec. */
static enum tern_status gpu_rec_push(struct tern_session *s) {
    if (!s->m->rec_bytes) return TERN_OK;
    enum tern_status st = tern_gpu_rec_upload(GPU(s->m), GST(s), s->rec);
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

/* Takes c off the device: out of the list, its buffer freed, the counts down (ckpt_mu
 * held). Its host copy, if any, stays. */
static void vram_drop(struct tern_model *m, struct tern_checkpoint *c) {
    vram_unlink(m, c);
    tern_gpu_rec_free(GPU(m), c->dev);
    c->dev = NULL;
    m->ckpt_vram_bytes -= c->n_bytes;
    m->ckpt_vram_n--;
}

/* Gives c a host copy of its device bytes (ckpt_mu held). */
static enum tern_status vram_host_copy(struct tern_model *m, struct tern_checkpoint *c) {
    if (c->data) return TERN_OK;
    uint8_t *d = tern_malloc(c->n_bytes);
    if (!d) return tern_errorf(TERN_ERR_NOMEM, "session: out of memory for a checkpoint of %zu bytes", c->n_bytes);
    enum tern_status st = tern_gpu_rec_read(GPU(m), c->dev, d);
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
    vram_drop(m, c);
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
    if (!GPU(m)) return 0;
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
static bool gpu_ckpt_take(struct tern_session *s, struct tern_checkpoint *c) {
    struct tern_model *m = s->m;
    if (!c->n_bytes) return false;
    pthread_mutex_lock(&m->ckpt_mu);
    bool ok = c->n_bytes <= m->ckpt_vram_budget && vram_make_room(m, c->n_bytes);
    struct tern_vk_buf *b = NULL;
    if (ok) {
        enum tern_status st = tern_gpu_rec_new(GPU(m), &b);
        /* the device's room, not the budget: the oldest on the device makes way, once */
        if (st == TERN_ERR_NOMEM && m->ckpt_oldest && !vram_spill(m, m->ckpt_oldest))
            st = tern_gpu_rec_new(GPU(m), &b);
        if (st) {
            TERN_LOG_DEBUG("session: checkpoint at %u in host memory: %s", s->n_past, tern_last_error());
            m->ckpt_fallbacks++;
            ok = false;
        } else if ((st = tern_gpu_rec_save(GPU(m), GST(s), b))) {
            TERN_LOG_ERROR("session: a checkpoint at %u on the device: %s", s->n_past, tern_last_error());
            tern_gpu_rec_free(GPU(m), b);
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

/* s's recurrent state from checkpoint c: a copy on the device, or an upload of its host
 * bytes. */
static enum tern_status gpu_ckpt_restore(struct tern_session *s, const struct tern_checkpoint *cc) {
    struct tern_model *m = s->m;
    struct tern_checkpoint *c = (struct tern_checkpoint *)(uintptr_t)cc; /* its place in the list moves */
    pthread_mutex_lock(&m->ckpt_mu);
    enum tern_status st;
    if (c->dev) {
        st = tern_gpu_rec_load(GPU(m), GST(s), c->dev);
        s->rec_stale = true; /* also on failure: the device's state is then undefined */
        if (st) tern_error_prefix(st, "session: restoring a checkpoint on the device");
        else {
            vram_unlink(m, c);
            vram_link_newest(m, c);
            m->ckpt_restores_dev++;
        }
    } else if (c->data) {
        memcpy(s->rec, c->data, c->n_bytes);
        st = gpu_rec_push(s);
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
    if (GPU(m)) (void)vram_make_room(m, 0);
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

void vulkan_ckpt_release_all(struct tern_model *m) {
    if (!GPU(m) || !m->ckpt_vram_n) return;
    (void)vram_spill_all(m);
    /* those that could not be read back (a lost device) lose their bytes: restoring them
     * then fails, never gives a wrong state */
    pthread_mutex_lock(&m->ckpt_mu);
    if (m->ckpt_vram_n) TERN_LOG_ERROR("session: %u checkpoints lost with the device", m->ckpt_vram_n);
    while (m->ckpt_oldest) vram_drop(m, m->ckpt_oldest);
    pthread_mutex_unlock(&m->ckpt_mu);
}

/* Retakes c at s's end: on the device when c is there, its host copy (if any) as well. */
static enum tern_status gpu_ckpt_update(struct tern_session *s, struct tern_checkpoint *c) {
    struct tern_model *m = ck_model(c);
    pthread_mutex_lock(&m->ckpt_mu);
    enum tern_status st = c->dev ? tern_gpu_rec_save(GPU(m), GST(s), c->dev) : TERN_OK;
    if (!st && c->data && !(st = gpu_rec_sync(s))) memcpy(c->data, s->rec, c->n_bytes);
    if (!st) {
        c->pos = s->n_past;
        c->tok_hash = tern_hash64(s->tokens, (size_t)s->n_past * sizeof *s->tokens);
    }
    pthread_mutex_unlock(&m->ckpt_mu);
    return st;
}

static void gpu_ckpt_release(struct tern_checkpoint *c) {
    struct tern_model *m = ck_model(c);
    pthread_mutex_lock(&m->ckpt_mu);
    if (c->dev) vram_drop(m, c);
    pthread_mutex_unlock(&m->ckpt_mu);
}

/* A device checkpoint gets a host copy (kept until it is freed: the pointer stays valid)
 * and stays on the device. */
static const void *gpu_ckpt_data(struct tern_checkpoint *c) {
    struct tern_model *m = ck_model(c);
    pthread_mutex_lock(&m->ckpt_mu);
    const enum tern_status st = c->dev ? vram_host_copy(m, c) : TERN_OK;
    const void *d = c->data;
    pthread_mutex_unlock(&m->ckpt_mu);
    if (st) TERN_LOG_ERROR("session: %s", tern_last_error());
    return st ? NULL : d;
}

/* ---- eval ------------------------------------------------------------------------ */

/* A trail of n states kept in device memory (tern_eval_opts.rec_trail is not written). */
static enum tern_status gpu_eval_prepare(struct tern_session *s, uint32_t n_chunk, uint32_t n, bool trail) {
    (void)n_chunk; /* the device's chunk is its own (tern_gpu_eval splits) */
    return trail && s->m->rec_bytes ? tern_gpu_trail_reserve(GPU(s->m), GST(s), n) : TERN_OK;
}

/* One chunk on the device, under the tern_gpu's lock (as the CPU's takes eval_mu); with a
 * trail (reserved by gpu_eval_prepare), the recurrent state after token i goes to the
 * device's trail slot slot0 + i (rec_trail is not written); the hidden states the session
 * captures (or, an MTP head's, reads) as on the CPU. */
static enum tern_status gpu_chunk(struct tern_session *s, const int32_t *toks, uint32_t n, float *logits, bool all,
                                  void *rec_trail, uint32_t slot0) {
    s->rec_stale = true; /* also on failure: the device's state is then undefined */
    const struct tern_gpu_io io = {.trail = rec_trail && s->m->rec_bytes, .slot0 = slot0, .hidden_in = s->hidden_in,
                                   .hidden_out = s->hidden_out, .hidden_pos0 = s->hidden_pos0};
    enum tern_status st = tern_gpu_eval_io(GPU(s->m), GST(s), s->n_past, toks, n, n, logits, all, &io);
    if (st) TERN_LOG_ERROR("session: the device failed at position %u: %s", s->n_past, tern_last_error());
    return st;
}

/* tern_eval_batch's step on the device: the items' rows are one device step
 * (tern_gpu_eval_batch: the matmuls over every row, attention and the DeltaNet per session
 * against its own state), split into steps of the device's chunk when they are more; each
 * item's bits are those of its own eval, which is what the batch promises. Its logits go
 * to it->logits_all (every row) or its session's logits (the last row). A device failure
 * leaves every item's device state undefined (and the sessions' positions where they
 * were): the caller fails them all. */
static enum tern_status gpu_batch(const struct tern_batch_item *items, size_t n_items, size_t rows, uint32_t n_want) {
    (void)n_want; /* the device projects the wanted rows itself */
    struct tern_model *m = items[0].s->m;
    struct tern_gpu_seq *gs = tern_malloc(n_items * sizeof *gs);
    struct tern_gpu_io *io = tern_malloc(n_items * sizeof *io);
    enum tern_status st = gs && io ? TERN_OK : tern_errorf(TERN_ERR_NOMEM, "session: out of memory for a batch");
    for (size_t i = 0; i < n_items && !st; i++) {
        st = tern_session_reserve(items[i].s, items[i].n);
        /* a trail is kept in device memory (the item's rec_trail is not written) */
        if (!st && items[i].rec_trail && m->rec_bytes) st = tern_gpu_trail_reserve(GPU(m), GST(items[i].s), items[i].n);
    }
    for (size_t i = 0; i < n_items && !st; i++) {
        const struct tern_batch_item *it = &items[i];
        struct tern_session *s = it->s;
        io[i] = (struct tern_gpu_io){.trail = it->rec_trail && m->rec_bytes, .hidden_in = s->hidden_in,
                                     .hidden_out = s->hidden_out, .hidden_pos0 = s->hidden_pos0};
        gs[i] = (struct tern_gpu_seq){.st = GST(s), .pos0 = s->n_past, .toks = it->toks, .n = it->n,
                                      .logits = it->logits_all ? it->logits_all : it->logits ? s->logits : NULL,
                                      .all = it->logits_all != NULL, .io = &io[i]};
        /* as gpu_chunk: the host copy of the recurrent state is stale from here on (also
         * on failure: the device's state is then undefined) */
        s->trail = NULL;
        s->logits_valid = false;
        s->rec_stale = true;
    }
    if (!st) {
        st = tern_gpu_eval_batch(GPU(m), gs, (uint32_t)n_items, 0);
        /* the position is the first item's (the log's pattern for a device failure) */
        if (st)
            TERN_LOG_ERROR("session: the device failed at position %u: %s (a step of %zu sessions, %zu rows)",
                           items[0].s->n_past, tern_last_error(), n_items, rows);
    }
    free(gs);
    free(io);
    return st;
}


static enum tern_status gpu_trail_load(struct tern_session *s, uint32_t slot) {
    s->rec_stale = true;
    return tern_gpu_trail_load(GPU(s->m), GST(s), slot);
}

static void gpu_trail_drop(struct tern_session *s) { tern_gpu_trail_release(GPU(s->m), GST(s)); }

/* ---- fork, hashes, KV rows --------------------------------------------------------- */

/* On the device: KV pages [0, p), and the recurrent state from src's or from the
 * checkpoint's (on the device, or uploaded from host memory). */
static enum tern_status gpu_fork(struct tern_session *s, const struct tern_session *src, uint32_t p,
                                 const struct tern_checkpoint *ckpt) {
    enum tern_status st = tern_gpu_state_copy(GPU(s->m), GST(src), GST(s), p, !ckpt);
    if (st) return tern_error_prefix(st, "session: forking at %u on the device", p);
    if (!ckpt) s->rec_stale = true;
    else if (ckpt->n_bytes) st = gpu_ckpt_restore(s, ckpt);
    return st;
}

/* A device session's rows [0, n) of layer il's K or V, downloaded head by head and hashed
 * in the CPU's order (page by page, heads within a page), so that the stream of bytes is
 * the one the CPU's pages give. 0 (logged) when the download fails. */
static uint64_t gpu_kv_hash(const struct tern_session *s, uint32_t il, bool v) {
    const struct model_layer *L = &s->m->layers[il];
    const size_t hb = session_head_row_bytes(s, L, v), run = (size_t)s->n_past * hb;
    uint8_t *tmp = tern_malloc(run * L->n_kv_head + 1);
    enum tern_status st = tmp ? tern_gpu_kv_download(GPU(s->m), GST(s), il, v, 0, s->n_past, tmp, run)
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


/* The device's pages hold each head's rows of a page contiguously; tern_gpu_kv_* lay them
 * out as buf's runs. */
static enum tern_status gpu_kv_rows(const struct tern_session *s, uint32_t il, bool v, uint32_t p0, uint32_t p1,
                                    uint8_t *buf, uint32_t buf_rows, bool to_pages) {
    const size_t run = (size_t)buf_rows * session_head_row_bytes(s, &s->m->layers[il], v);
    return to_pages ? tern_gpu_kv_upload(GPU(s->m), GST(s), il, v, p0, p1, buf, run)
                    : tern_gpu_kv_download(GPU(s->m), GST(s), il, v, p0, p1, buf, run);
}

const struct backend_state vulkan_state = {
    .make = gpu_make,
    .release = gpu_release,
    .bytes = gpu_bytes,
    .grow = gpu_grow,
    .shrink = gpu_shrink,
    .rec_sync = gpu_rec_sync,
    .rec_push = gpu_rec_push,
    .eval_prepare = gpu_eval_prepare,
    .chunk = gpu_chunk,
    .batch = gpu_batch,
    .trail_load = gpu_trail_load,
    .trail_drop = gpu_trail_drop,
    .ckpt_take = gpu_ckpt_take,
    .ckpt_restore = gpu_ckpt_restore,
    .fork = gpu_fork,
    .kv_hash = gpu_kv_hash,
    .kv_rows = gpu_kv_rows,
    .ckpt_update = gpu_ckpt_update,
    .ckpt_release = gpu_ckpt_release,
    .ckpt_data = gpu_ckpt_data,
};
