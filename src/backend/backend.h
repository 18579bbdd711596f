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

/* A backend, for making a RunState: its operations and its own context (the CPU's is
 * NULL, the GPU's its tern_gpu). */
struct model_backend {
    const struct model_ops *ops;
    void *ctx;
};

/* One evaluation step on one backend: the batch (rows, sequences, positions, where the
 * logits go) and the backend's state for it (the CPU's: the step's lead session). */
struct model_step {
    const struct model_ops *ops;
    void *be;
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
