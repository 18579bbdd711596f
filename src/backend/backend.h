/* The layer-level backend seam (DESIGN.md §7): the operations a forward pass is made of,
 * as a table of functions one backend implements. An architecture's forward
 * (arch-*.c) is written once against it; the CPU (backend/cpu/forward.c, over layers.c and
 * moe.c) and the Vulkan device (backend/vulkan/forward.c) are its two implementations.
 *
 * Buffers:
 *   - activations (`struct model_act`): a backend's buffer of rows of floats, one row
 *     per row of the step (or n floats in all, `once`); allocated through the backend
 *     when an architecture makes its RunState (state_new), so the same RunState struct
 *     holds host rows on the CPU and device buffers on the GPU;
 *   - weights: the architecture's own `struct mat` and F32 vectors (views into the
 *     mapping); the CPU reads them where they are, the GPU finds the copy it uploaded by
 *     the host address (backend/vulkan/forward.c), so an architecture never names a device buffer;
 *   - KV cache and recurrent state: named by layer index (the step's sessions' pages and
 *     buffers on the CPU, the device state's on the GPU);
 *   - the MoE scratch (`struct model_moe_ws`): the backend's own, sized by state_new;
 *   - logits: written by `output` for the rows the batch wants (model_batch.logits).
 *
 * Every operation works on the step's b->n rows. Operations do not fail: the CPU's cannot
 * (everything is allocated up front), the GPU's record the first failure in the step and
 * skip the rest, and its driver returns it. Exactness is each implementation's
 * (model.h's rules on the CPU, gpu.h's on the device): the seam only fixes the order of
 * the operations, which both backends therefore share. */
#ifndef TERN_BACKEND_H
#define TERN_BACKEND_H

#include "model/model.h"
#include "model/moe.h"

/* ---- the seam's parameter types ------------------------------------------------- */

/* RoPE of the batch's rows at their positions: model_rope_angles writes each row's
 * angles into cs (b->n rows of n_rot), pairs marked in pos0_pairs (NULL: none) taking
 * position 0's angles cs0 (IMROPE's "e" section for text); model_rope rotates q (n_head
 * heads) and k (n_head_kv heads) rows of head_dim in place with them. */
struct model_rope {
    const struct tern_rope_params *p;
    bool neox;
    const bool *pos0_pairs; /* (n_rot / 2) or NULL */
    const float *cs0;       /* (n_rot) the angles at position 0, when pos0_pairs */
};
/* One row's angles (n_rot) at position pos, as every backend computes them. */
static inline void model_rope_row_angles(const struct model_rope *r, uint32_t pos, float *cs) {
    tern_rope_angles(r->p, pos, cs);
    if (r->pos0_pairs)
        for (size_t i = 0; i < r->p->n_rot / 2; i++)
            if (r->pos0_pairs[i]) { /* position 0: no rotation, only the magnitude scale */
                cs[2 * i] = r->cs0[2 * i];
                cs[2 * i + 1] = r->cs0[2 * i + 1];
            }
}

/* The Gated DeltaNet of recurrent layer il for the batch (deltanet.h has the math): for
 * each sequence, the causal conv of its rows of qkv_raw into qkv with its session's
 * "conv" window, then the recurrence per v-head into out with its "ssm" state, token by
 * token in order. */
struct model_deltanet {
    const struct tern_deltanet_shape *dn;
    const float *conv_wt;               /* (n_conv, C) tap-major */
    const struct tern_deltanet_params *p;
};
struct model_act;    /* an activation buffer */
struct model_moe_ws; /* a backend's MoE scratch */
struct model_ops;

/* The operations and context an architecture's RunState allocates its buffers through
 * (state_new): the CPU's (context NULL) or a device's (its tern_gpu). */
struct model_backend {
    const struct model_ops *ops;
    void *ctx;
};

/* One evaluation step on one backend: the batch (rows, sequences, positions, where the
 * logits go) and the backend's state for it (the CPU's: the step's lead session). */
struct model_step {
    const struct model_ops *ops;
    void *run; /* the backend's state for the step */
    const struct tern_model *m;
    const struct model_batch *b;
};

/* One output of a matmul: y = x W^T. */
struct model_mm {
    const struct mat *w;
    struct model_act *y;
};

/* One activation buffer of a RunState: n floats per row of a chunk, or n in all when
 * once (scratch a backend may not need: the GPU ignores the DeltaNet scratch). */
struct model_act_buf {
    struct model_act **p;
    size_t n;
    bool once;
};

struct model_ops {
    /* ---- the RunState's buffers ---- */
    /* Allocates every buffer for chunks of n_chunk rows (a size of 0 counts as 1 float),
     * adding their bytes to *bytes; on failure those allocated so far stay set, for
     * act_free. */
    enum tern_status (*acts_new)(void *ctx, const struct model_act_buf *bufs, size_t n_bufs, uint32_t n_chunk,
                                 size_t *bytes);
    void (*act_free)(void *ctx, struct model_act *a);
    /* The MoE scratch for the layers' experts (gate.data NULL: a layer without). On
     * failure *out holds what was made (or NULL), for moe_ws_free. */
    enum tern_status (*moe_ws_new)(void *ctx, const struct tern_model *m, const struct moe_hparams *hp,
                                   const struct moe_layer *layers, uint32_t n_layer, uint32_t n_chunk,
                                   struct model_moe_ws **out, size_t *bytes);
    void (*moe_ws_free)(void *ctx, struct model_moe_ws *ws);

    /* ---- the step's inputs: before any operation below them ---- */
    /* x[t] = row toks[t] of the table. */
    void (*embed)(const struct model_step *f, const struct mat *embd, struct model_act *x);
    /* cs[t] = the RoPE angles of row t's position (model_rope's rules). */
    void (*rope_angles)(const struct model_step *f, const struct model_rope *r, struct model_act *cs);
    /* x[t] = the MTP head's input hidden state of row t (its session's hidden_in). */
    void (*hidden_in)(const struct model_step *f, struct model_act *x);

    /* ---- per-row operations (model.h names the CPU's) ---- */
    /* One input, several matrices (one dispatch on the CPU); at most 4 outputs. */
    void (*matmul)(const struct model_step *f, const struct model_act *x, const struct model_mm *outs, size_t n_outs);
    void (*rmsnorm)(const struct model_step *f, struct model_act *y, const struct model_act *x, const float *w,
                    uint32_t n, float eps);
    void (*rmsnorm_heads)(const struct model_step *f, struct model_act *x, const float *w, uint32_t n_head,
                          uint32_t head_dim, float eps);
    void (*add_bias)(const struct model_step *f, struct model_act *x, const float *bias, uint32_t n);
    void (*add)(const struct model_step *f, struct model_act *y, const struct model_act *x, uint32_t n);
    void (*swiglu)(const struct model_step *f, struct model_act *g, const struct model_act *u, uint32_t n);
    void (*sigmoid_mul)(const struct model_step *f, struct model_act *x, const struct model_act *gate, uint32_t n);
    void (*split_heads)(const struct model_step *f, const struct model_act *ab, struct model_act *a,
                        struct model_act *b, uint32_t n_head, uint32_t head_dim);
    void (*concat_rows)(const struct model_step *f, struct model_act *y, const struct model_act *a,
                        const struct model_act *b, uint32_t n);
    /* RoPE in place with the step's angles cs (rope_angles). */
    void (*rope)(const struct model_step *f, const struct model_rope *r, struct model_act *q, uint32_t n_head,
                 struct model_act *k, uint32_t n_head_kv, uint32_t head_dim, const struct model_act *cs);
    /* MoE block: out[t] = moe(h[t]) (out may not alias h). */
    void (*moe)(const struct model_step *f, const struct moe_hparams *hp, const struct moe_layer *L,
                struct model_moe_ws *ws, const struct model_act *h, struct model_act *out);

    /* ---- operations with state ---- */
    /* Attention of layer il over its KV (model_attention's contract; rows of q, k, v and
     * out are n_head * head_dim, n_kv_head * head_dim twice and n_head * head_dim). */
    void (*attention)(const struct model_step *f, uint32_t il, const struct model_act *q, const struct model_act *k,
                      const struct model_act *v, struct model_act *out, uint32_t n_head, float scale);
    /* The Gated DeltaNet of recurrent layer il: conv + recurrence (model_deltanet's). */
    void (*deltanet)(const struct model_step *f, uint32_t il, const struct model_deltanet *d,
                     const struct model_act *qkv_raw, struct model_act *qkv, const struct model_act *z,
                     const struct model_act *beta, const struct model_act *alpha, struct model_act *out,
                     struct model_act *scratch);

    /* ---- the step's outputs ---- */
    /* The logits of the rows the batch wants: x normed with norm_w, times out_w (x is
     * left as it is; xb is scratch). */
    void (*output)(const struct model_step *f, const struct mat *out_w, const float *norm_w, float eps,
                   const struct model_act *x, struct model_act *xb);
    /* For the sequences whose sessions capture it (tern_session.hidden_out): the normed
     * hidden state of their rows. */
    void (*hidden_out)(const struct model_step *f, const float *norm_w, float eps, const struct model_act *x);
};

/* ---- the backend: one struct ------------------------------------------------------ */

struct tern_checkpoint;
struct tern_batch_item;

/* A session's state where its backend keeps it (DESIGN.md §7): the CPU (cpu/state.c: KV
 * rows in host pages, the recurrent block in s->rec) and a Vulkan device (vulkan/state.c:
 * KV pages and recurrent state in device memory, s->rec a host copy refreshed when
 * something reads it) each implement this table; model/session.c's operations — eval,
 * batches, rewind, checkpoints, restore, fork, hashes, KV export and import — are written
 * once against it and never ask where the state is. Both lay their bytes out as the
 * CPU's (pages [n_kv_head][TERN_KV_PAGE][head_dim], the recurrent block layer by layer),
 * so checkpoints, hashes and the disk tier read the same on both. */
struct backend_state {
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
    /* Checkpoints the backend keeps itself (ckpt_take true; NULL where it never does):
     * c retaken from s at s's end; c's own memory given back before c is freed; c's bytes
     * in host memory (a copy made once, then kept; NULL on error). */
    enum tern_status (*ckpt_update)(struct tern_session *s, struct tern_checkpoint *c);
    void (*ckpt_release)(struct tern_checkpoint *c);
    const void *(*ckpt_data)(struct tern_checkpoint *c);
};

/* A backend: where a model's forward pass runs and its sessions' state lives. A model
 * holds one (m->backend, the CPU's until tern_model_use_device picks another, before any
 * session exists) and that backend's context for it (m->backend_ctx: NULL on the CPU,
 * whose context is the model's workspace m->ws; a device's weights and scratch); a
 * session's state on it is s->dev. A new backend is a folder beside cpu/ and vulkan/
 * implementing this struct, and a line in backend.c's list. */
struct tern_backend {
    const char *name;                   /* as --device names it: "cpu", "vulkan" */
    const struct model_ops *ops;        /* the forward pass's operations */
    const struct backend_state *state;  /* the sessions' state */
    /* m's context on the backend's device `index` (m->backend_ctx, m->device); m is
     * unchanged on error (a missing device, an architecture or weight type the backend
     * lacks, memory: each named). */
    enum tern_status (*open)(struct tern_model *m, int index, uint32_t n_chunk);
    /* Frees m's context (no session of m is left). */
    void (*close)(struct tern_model *m);
    /* An MTP head's context beside its main model's (head: the head's model view, its
     * backend and context set on success; made once and kept with main's). NULL: the head
     * runs on the CPU. */
    enum tern_status (*head)(const struct tern_model *main, struct tern_model *head, uint32_t n_chunk);
};

extern const struct tern_backend tern_backend_cpu, tern_backend_vulkan;

/* Whether m runs on a device (a context of its own) rather than the CPU. */
static inline bool model_on_device(const struct tern_model *m) { return m->backend_ctx != NULL; }
/* Frees m's device context and brings m back to the CPU (backend.c). */
void model_device_free(struct tern_model *m);

/* The CPU backend (backend/cpu/forward.c). */
extern const struct model_ops model_cpu_ops;

/* Helpers for an architecture's RunState: its buffers made on backend be, and freed
 * (the NULL ones, never made, skipped). */
static inline enum tern_status model_acts_new(const struct model_backend *be, const struct model_act_buf *bufs,
                                              size_t n_bufs, uint32_t n_chunk, size_t *bytes) {
    return be->ops->acts_new(be->ctx, bufs, n_bufs, n_chunk, bytes);
}
static inline void model_acts_free(const struct model_backend *be, struct model_act *const *acts, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (acts[i]) be->ops->act_free(be->ctx, acts[i]);
}

#endif
