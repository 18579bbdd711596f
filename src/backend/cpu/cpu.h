/* The CPU backend (backend.h's seam on host memory): the layer operations on host rows
 * (layers.c), the mixture-of-experts block (moe.c), the forward table over them
 * (forward.c) and the sessions' state in host pages (state.c). The model's workspace
 * (the RunState for one chunk, activation buffers, attention scratch, batch logits) is
 * this backend's context: sessions borrow it for one forward under eval_mu. */
#ifndef TERN_BACKEND_CPU_H
#define TERN_BACKEND_CPU_H

#include "backend/backend.h"
#include "model/model.h"
#include "model/moe.h"

/* Grows the model's workspace to chunks of n_chunk tokens (call with eval_mu held). On
 * error it is unchanged. */
enum tern_status model_ws_reserve(struct tern_model *m, uint32_t n_chunk);
void model_ws_free(struct tern_model *m);

/* ---- building blocks of the forward pass (layers.c) -------------------------------- */

/* One input x[n_tok][k] multiplied by several matrices that share it (Q, K, V; gate,
 * up): activations are prepared once per format, and one dispatch computes every
 * output y_i[n_tok][w_i->n]. */
struct mm_out {
    const struct mat *w;
    float *y;
};

void model_matmul(struct tern_session *s, const float *x, uint32_t n_tok, const struct mm_out *outs, size_t n_outs);
static inline void model_matmul1(struct tern_session *s, const float *x, uint32_t n_tok, const struct mat *w, float *y) {
    const struct mm_out o = {w, y};
    model_matmul(s, x, n_tok, &o, 1);
}

/* y[t] = rmsnorm(x[t]) * w for n_tok rows of n (w may be NULL). y may be x. */
void model_rmsnorm(struct tern_session *s, float *y, const float *x, const float *w, uint32_t n_tok,
                   uint32_t n, float eps);
/* Per-head RMSNorm (QK-norm): each of n_tok * n_head rows of head_dim. In place. */
void model_rmsnorm_heads(struct tern_session *s, float *x, const float *w, uint32_t n_tok, uint32_t n_head,
                         uint32_t head_dim, float eps);
/* x[t][i] += b[i] */
void model_add_bias(float *x, const float *b, uint32_t n_tok, uint32_t n);
/* Token embeddings: x[t] = row toks[t] of the table. */
void model_embed(struct tern_session *s, const struct mat *embd, const int32_t *toks, uint32_t n_tok, float *x);

/* Attention of layer il for the batch: writes each row's k, v (n_kv_head *
 * head_dim_{k,v} each, stride given) as the cache row of its position in its sequence's
 * session (rounded to F16 for an F16 cache), then for each row t and head h computes
 * out[t][h] over that session's cache rows [0, pos] read back from the cache. q (b->n
 * rows of n_head * head_dim_k, stride q_stride) already has RoPE applied. */
void model_attention(struct tern_session *s, uint32_t il, const struct model_batch *b, const float *q,
                     size_t q_stride, const float *k, size_t k_stride, const float *v, size_t v_stride, float *out,
                     size_t out_stride, uint32_t n_head, float scale);

/* Floats of attention scratch one thread needs (a page of scores and the online
 * softmax state of a block of queries). */
size_t model_attn_scratch_floats(uint32_t max_group, uint32_t max_head_dim);

/* Runs fn(ctx, t) for t in [0, n) on the pool (tokens or heads split across threads). */
typedef void (*model_item_fn)(void *ctx, uint32_t i);
void model_parallel_for(struct tern_session *s, uint32_t n, model_item_fn fn, void *ctx);

/* The output head: the rows whose logits the batch wants (model_batch.logits) are
 * gathered from x (b->n rows of out_w->k floats) into xb, normed with norm_w
 * and multiplied by the output matrix in one matmul. x is left as it is. */
void model_output(struct tern_session *s, const struct model_batch *b, const struct mat *out_w, const float *norm_w,
                  float eps, const float *x, float *xb);

/* ---- the rest of the layer operations (layers.c) ----------------------------------- *
 * With the ones above (and moe_forward), these are everything the CPU's forward pass
 * computes: the CPU backend (backend/cpu/forward.c) forwards the seam's operations (backend.h)
 * to them. Each is per token (rows split across threads) and in place where it says
 * so. */

/* y[t] += x[t] for n_tok rows of n (the residual add). */
void model_add(struct tern_session *s, float *y, const float *x, uint32_t n_tok, uint32_t n);
/* y[t] = [a[t] | b[t]] for n_tok rows of n each (y has rows of 2n). */
void model_concat_rows(struct tern_session *s, float *y, const float *a, const float *b, uint32_t n_tok, uint32_t n);
/* g[t] = silu(g[t]) * u[t] for n_tok rows of n. */
void model_swiglu(struct tern_session *s, float *g, const float *u, uint32_t n_tok, uint32_t n);
/* x[t] *= sigmoid(gate[t]) for n_tok rows of n. */
void model_sigmoid_mul(struct tern_session *s, float *x, const float *gate, uint32_t n_tok, uint32_t n);
/* Splits rows of n_head heads laid out [a | b] per head (2 * head_dim each) into a and b,
 * n_head * head_dim each (Qwen3.5's gated query). */
void model_split_heads(struct tern_session *s, const float *ab, float *a, float *b, uint32_t n_tok, uint32_t n_head,
                       uint32_t head_dim);

void model_rope_angles(struct tern_session *s, const struct model_batch *b, const struct model_rope *r, float *cs);
void model_rope(struct tern_session *s, const struct model_batch *b, const struct model_rope *r, float *q,
                uint32_t n_head, float *k, uint32_t n_head_kv, uint32_t head_dim, const float *cs);

void model_deltanet(struct tern_session *s, uint32_t il, const struct model_batch *b, const struct model_deltanet *d,
                    const float *qkv_raw, float *qkv, const float *z, const float *beta, const float *alpha, float *out,
                    float *scratch);

/* ---- the mixture-of-experts block (moe.c) ------------------------------------------ */

/* Per-chunk scratch of the MoE block (part of an architecture's RunState). */
struct moe_state {
    uint32_t n_chunk;
    float *probs;      /* (n_chunk, n_expert) router logits, then probabilities */
    int32_t *sel;      /* (n_chunk, n_used) chosen experts in rank order */
    float *wts;        /* (n_chunk, n_used) their weights */
    int32_t *slot_of;  /* (n_chunk, n_used) the slot of (token, rank) */
    int32_t *slot_tok; /* (n_chunk * n_used) the token of each slot; slots are grouped by expert */
    uint32_t *cnt;     /* (n_expert + 1) tokens per expert, then prefix offsets */
    uint8_t *act_tok;  /* (n_chunk, act row) h prepared for the gate/up weights */
    uint8_t *act_gu;   /* (n_chunk * n_used, act row) the same rows gathered by slot */
    uint8_t *act_up;   /* likewise for up when its activation format differs from gate's; else NULL */
    float *g;          /* (n_chunk * n_used, n_ff_exp) gate, then silu(gate) * up */
    float *u;          /* (n_chunk * n_used, n_ff_exp) up */
    uint8_t *act_d;    /* (n_chunk * n_used, act row) g prepared for the down weights */
    float *d;          /* (n_chunk * n_used, n_embd) each slot's expert output */
    float *sg, *su;    /* (n_chunk, n_ff_shexp) shared expert gate / up */
    float *sw;         /* (n_chunk) shared expert gate logit */
    float *sd;         /* (n_chunk, n_embd) shared expert output */
    size_t act_gu_rb, act_up_rb, act_d_rb;
    size_t bytes;
};

/* Sizes the scratch for chunks of n_chunk tokens and the largest activation rows of the
 * layers' expert types (layers without experts, gate.data NULL, are skipped). On error
 * *st holds what was allocated, for moe_state_free. */
enum tern_status moe_state_new(const struct tern_model *m, const struct moe_hparams *hp,
                               const struct moe_layer *layers, uint32_t n_layer, uint32_t n_chunk,
                               struct moe_state *st);
void moe_state_free(struct moe_state *st);

/* out[t] = the MoE block of h[t] for n_tok rows of n_embd (h is the normed input;
 * out may not alias h). */
void moe_forward(struct tern_session *s, const struct moe_hparams *hp, const struct moe_layer *L,
                 struct moe_state *st, const float *h, uint32_t n_tok, float *out);
/* moe_forward with the shared expert's output sd (n_tok, n_embd) and gate logits sw
 * (n_tok) computed elsewhere (a device: partial offload, backend/vulkan/forward.c); NULL:
 * computed here. The routed experts and the combine are moe_forward's. */
void moe_forward_shared(struct tern_session *s, const struct moe_hparams *hp, const struct moe_layer *L,
                        struct moe_state *st, const float *h, uint32_t n_tok, float *out, const float *sd,
                        const float *sw);

/* The routing of one token: softmax over logits[n_expert] in place (probabilities), the
 * n_used largest in descending order (ties to the lowest id) into sel, their weights
 * (renormalised, scaled) into wts; with hp->softmax_weight the n_used largest logits
 * (left as they are) and the softmax of those into wts. Exposed for tests. */
void moe_route(const struct moe_hparams *hp, float *logits, int32_t *sel, float *wts);

#endif
