/* The session layer's two backends (DESIGN.md §7): where one session's state lives and how
 * it moves. The CPU (session.c: KV rows in host pages, the recurrent block in s->rec) and a
 * Vulkan device (backend/vulkan/state.c over backend/vulkan/gpu.h: KV pages and recurrent state in device
 * memory, s->rec a host copy refreshed when something reads it) each implement this table;
 * session.c's operations — eval, batches, rewind, checkpoints, restore, fork, hashes, KV
 * export and import — are written once against it and never ask where the state is, and
 * the cache and the planner see only tern.h. A session takes its model's backend when it
 * is made (tern_model_use_vulkan comes before any session). Both lay their bytes out as
 * the CPU's (pages [n_kv_head][TERN_KV_PAGE][head_dim], the recurrent block layer by
 * layer), so checkpoints, hashes and the disk tier read the same on both. */
#ifndef TERN_MODEL_SESSION_IMPL_H
#define TERN_MODEL_SESSION_IMPL_H

#include "model/model.h"

struct tern_vk_buf;

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

struct session_be {
    /* The backend's part of a new session (s's tokens, page arrays and s->rec exist); on
     * error tern_session_free (release) frees what it made. */
    enum tern_status (*make)(struct tern_session *s);
    void (*release)(struct tern_session *s);
    /* Bytes of the state the backend holds for s (its KV pages, device state). */
    size_t (*bytes)(const struct tern_session *s);
    /* KV pages [0, n) in every attention layer; on error the pages that were there stay. */
    enum tern_status (*grow)(struct tern_session *s, uint32_t n);
    /* Pages beyond those that hold positions [0, n_pos) may go. */
    void (*shrink)(struct tern_session *s, uint32_t n_pos);
    /* s->rec up to date with the backend's recurrent state / the backend's from s->rec. */
    enum tern_status (*rec_sync)(struct tern_session *s);
    enum tern_status (*rec_push)(struct tern_session *s);
    /* Before an eval of n tokens in chunks of n_chunk (trail: tern_eval_opts.rec_trail),
     * what its chunks need; nothing is computed yet. */
    enum tern_status (*eval_prepare)(struct tern_session *s, uint32_t n_chunk, uint32_t n, bool trail);
    /* One chunk of toks[0..n) at s's end: logits the last row's, or every row's when all
     * (NULL: none); with rec_trail, the recurrent state after token i into trail slot
     * slot0 + i (the CPU: rec_trail's row; a device: its own trail). The caller moves
     * n_past and keeps the tokens. */
    enum tern_status (*chunk)(struct tern_session *s, const int32_t *toks, uint32_t n, float *logits, bool all,
                              void *rec_trail, uint32_t slot0);
    /* tern_eval_batch's step over items already checked (rows in all, n_want wanted
     * logits rows): each item's logits to it->logits_all or its session's logits. The
     * caller keeps the tokens, positions and trails. */
    enum tern_status (*batch)(const struct tern_batch_item *items, size_t n_items, size_t rows, uint32_t n_want);
    /* The recurrent state after trail slot `slot` of the last eval, back into s. */
    enum tern_status (*trail_load)(struct tern_session *s, uint32_t slot);
    void (*trail_drop)(struct tern_session *s);
    /* c (its position, hash and size set) made from s's state where the backend keeps
     * checkpoints itself: true when it did (false: the host path makes it from s->rec). */
    bool (*ckpt_take)(struct tern_session *s, struct tern_checkpoint *c);
    /* s's recurrent state from checkpoint c (n_bytes > 0), wherever c's bytes are. */
    enum tern_status (*ckpt_restore)(struct tern_session *s, const struct tern_checkpoint *c);
    /* dst (made, its pages reserved for [0, p)) gets src's KV rows [0, p) and the
     * recurrent state of src (ckpt NULL) or of ckpt. */
    enum tern_status (*fork)(struct tern_session *dst, const struct tern_session *src, uint32_t p,
                             const struct tern_checkpoint *ckpt);
    /* xxh3 of layer il's K or V rows [0, n_past): each page's rows, head by head, as they
     * lie in the CPU's page (0, logged, when they cannot be read). */
    uint64_t (*kv_hash)(const struct tern_session *s, uint32_t il, bool v);
    /* Layer il's K or V rows [p0, p1) between the state and buf (to_pages: into the
     * state), KV head by KV head: head h's rows at buf + h * buf_rows * row bytes. */
    enum tern_status (*kv_rows)(const struct tern_session *s, uint32_t il, bool v, uint32_t p0, uint32_t p1,
                                uint8_t *buf, uint32_t buf_rows, bool to_pages);
};

extern const struct session_be session_be_cpu, session_be_gpu;

/* Bytes of one row of one KV head of layer L (v: the V cache). */
static inline size_t session_head_row_bytes(const struct tern_session *s, const struct model_layer *L, bool v) {
    return (size_t)(v ? L->head_dim_v : L->head_dim_k) * (s->kv_type == TERN_KV_F16 ? 2 : 4);
}

/* Checkpoints of a model on a device (backend/vulkan/state.c): their placement is under
 * m->ckpt_mu, which these take. */
static inline bool session_ckpt_on_device_model(const struct tern_checkpoint *c) { return c->n_bytes && c->m->gpu; }
/* Retakes c from s at s's end (on the device when c is there, its host copy too). */
enum tern_status session_gpu_ckpt_update(struct tern_session *s, struct tern_checkpoint *c);
/* Gives c's device buffer back (before c is freed). */
void session_gpu_ckpt_release(struct tern_checkpoint *c);
/* c's bytes in host memory (a copy made from the device once, then kept); NULL on error. */
const void *session_gpu_ckpt_data(struct tern_checkpoint *c);

#endif
