/* The CPU backend of the layer seam (backend.h): each operation is the layers.c (or
 * moe.c) function of the same name on host rows, so the CPU's bits and speed are those
 * functions'. An activation is its float rows; the step's backend state is its lead
 * session (the pool, the workspace, the sequences' KV pages and recurrent buffers). */
#include "backend/cpu/cpu.h"

#include "util/mem.h"

#include <stdlib.h>
#include <string.h>

#define ROWS(a) ((float *)(a))
#define CROWS(a) ((const float *)(a))
#define SESSION(f) ((struct tern_session *)(f)->run)

static enum tern_status acts_new(void *ctx, const struct model_act_buf *bufs, size_t n_bufs, uint32_t n_chunk,
                                 size_t *bytes) {
    (void)ctx;
    for (size_t i = 0; i < n_bufs; i++) {
        size_t b;
        const size_t rows = bufs[i].once ? 1 : n_chunk;
        float *p;
        if (tern_mul_overflow(rows * sizeof(float), bufs[i].n ? bufs[i].n : 1, &b) || !(p = tern_aligned_alloc(b)))
            return tern_errorf(TERN_ERR_NOMEM, "model: out of memory for the state of %u-token chunks", n_chunk);
        *bufs[i].p = (struct model_act *)p;
        *bytes += b;
    }
    return TERN_OK;
}

static void act_free(void *ctx, struct model_act *a) {
    (void)ctx;
    tern_aligned_free(a);
}

static enum tern_status moe_ws_new(void *ctx, const struct tern_model *m, const struct moe_hparams *hp,
                                   const struct moe_layer *layers, uint32_t n_layer, uint32_t n_chunk,
                                   struct model_moe_ws **out, size_t *bytes) {
    (void)ctx;
    *out = NULL;
    struct moe_state *st = tern_calloc(1, sizeof *st);
    if (!st) return tern_errorf(TERN_ERR_NOMEM, "model: out of memory");
    *out = (struct model_moe_ws *)st;
    enum tern_status s = moe_state_new(m, hp, layers, n_layer, n_chunk, st);
    *bytes += st->bytes;
    return s;
}

static void moe_ws_free(void *ctx, struct model_moe_ws *ws) {
    (void)ctx;
    moe_state_free((struct moe_state *)ws);
    free(ws);
}

static void embed(const struct model_step *f, const struct mat *embd, struct model_act *x) {
    model_embed(SESSION(f), embd, f->b->toks, f->b->n, ROWS(x));
}

static void rope_angles(const struct model_step *f, const struct model_rope *r, struct model_act *cs) {
    model_rope_angles(SESSION(f), f->b, r, ROWS(cs));
}

static void hidden_in(const struct model_step *f, struct model_act *x) {
    const struct model_batch *b = f->b;
    const size_t E = f->m->hp.n_embd;
    for (uint32_t j = 0; j < b->n_seq; j++) {
        const struct model_seq *q = &b->seq[j];
        const struct tern_session *qs = q->s;
        TERN_ASSERT(qs->hidden_in && q->pos0 >= qs->hidden_pos0);
        memcpy(ROWS(x) + (size_t)q->row0 * E, qs->hidden_in + (size_t)(q->pos0 - qs->hidden_pos0) * E,
               (size_t)q->n * E * sizeof(float));
    }
}

static void matmul(const struct model_step *f, const struct model_act *x, const struct model_mm *outs,
                   size_t n_outs) {
    struct mm_out o[4];
    TERN_ASSERT(n_outs <= TERN_ARRAY_LEN(o));
    for (size_t i = 0; i < n_outs; i++) o[i] = (struct mm_out){outs[i].w, ROWS(outs[i].y)};
    model_matmul(SESSION(f), CROWS(x), f->b->n, o, n_outs);
}

static void rmsnorm(const struct model_step *f, struct model_act *y, const struct model_act *x, const float *w,
                    uint32_t n, float eps) {
    model_rmsnorm(SESSION(f), ROWS(y), CROWS(x), w, f->b->n, n, eps);
}

static void rmsnorm_heads(const struct model_step *f, struct model_act *x, const float *w, uint32_t n_head,
                          uint32_t head_dim, float eps) {
    model_rmsnorm_heads(SESSION(f), ROWS(x), w, f->b->n, n_head, head_dim, eps);
}

static void add_bias(const struct model_step *f, struct model_act *x, const float *bias, uint32_t n) {
    model_add_bias(ROWS(x), bias, f->b->n, n);
}

static void add(const struct model_step *f, struct model_act *y, const struct model_act *x, uint32_t n) {
    model_add(SESSION(f), ROWS(y), CROWS(x), f->b->n, n);
}

static void swiglu(const struct model_step *f, struct model_act *g, const struct model_act *u, uint32_t n) {
    model_swiglu(SESSION(f), ROWS(g), CROWS(u), f->b->n, n);
}

static void sigmoid_mul(const struct model_step *f, struct model_act *x, const struct model_act *gate, uint32_t n) {
    model_sigmoid_mul(SESSION(f), ROWS(x), CROWS(gate), f->b->n, n);
}

static void split_heads(const struct model_step *f, const struct model_act *ab, struct model_act *a,
                        struct model_act *b, uint32_t n_head, uint32_t head_dim) {
    model_split_heads(SESSION(f), CROWS(ab), ROWS(a), ROWS(b), f->b->n, n_head, head_dim);
}

static void concat_rows(const struct model_step *f, struct model_act *y, const struct model_act *a,
                        const struct model_act *b, uint32_t n) {
    model_concat_rows(SESSION(f), ROWS(y), CROWS(a), CROWS(b), f->b->n, n);
}

static void rope(const struct model_step *f, const struct model_rope *r, struct model_act *q, uint32_t n_head,
                 struct model_act *k, uint32_t n_head_kv, uint32_t head_dim, const struct model_act *cs) {
    model_rope(SESSION(f), f->b, r, ROWS(q), n_head, ROWS(k), n_head_kv, head_dim, CROWS(cs));
}

static void moe(const struct model_step *f, const struct moe_hparams *hp, const struct moe_layer *L,
                struct model_moe_ws *ws, const struct model_act *h, struct model_act *out) {
    moe_forward(SESSION(f), hp, L, (struct moe_state *)ws, CROWS(h), f->b->n, ROWS(out));
}

static void attention(const struct model_step *f, uint32_t il, const struct model_act *q, const struct model_act *k,
                      const struct model_act *v, struct model_act *out, uint32_t n_head, float scale) {
    const struct model_layer *L = &f->m->layers[il];
    const size_t nq = (size_t)n_head * L->head_dim_k, nk = (size_t)L->n_kv_head * L->head_dim_k;
    const size_t nv = (size_t)L->n_kv_head * L->head_dim_v;
    model_attention(SESSION(f), il, f->b, CROWS(q), nq, CROWS(k), nk, CROWS(v), nv, ROWS(out),
                    (size_t)n_head * L->head_dim_v, n_head, scale);
}

static void deltanet(const struct model_step *f, uint32_t il, const struct model_deltanet *d,
                     const struct model_act *qkv_raw, struct model_act *qkv, const struct model_act *z,
                     const struct model_act *beta, const struct model_act *alpha, struct model_act *out,
                     struct model_act *scratch) {
    model_deltanet(SESSION(f), il, f->b, d, CROWS(qkv_raw), ROWS(qkv), CROWS(z), CROWS(beta), CROWS(alpha), ROWS(out),
                   ROWS(scratch));
}

static void output(const struct model_step *f, const struct mat *out_w, const float *norm_w, float eps,
                   const struct model_act *x, struct model_act *xb) {
    model_output(SESSION(f), f->b, out_w, norm_w, eps, CROWS(x), ROWS(xb));
}

/* The normed hidden state of every row at or above its session's hidden_pos0, the same
 * per-row norm the output head applies. */
static void hidden_out(const struct model_step *f, const float *norm_w, float eps, const struct model_act *x) {
    const struct model_batch *b = f->b;
    const uint32_t E = f->m->hp.n_embd;
    for (uint32_t j = 0; j < b->n_seq; j++) {
        const struct model_seq *q = &b->seq[j];
        struct tern_session *qs = q->s;
        if (!qs->hidden_out || q->pos0 + q->n <= qs->hidden_pos0) continue;
        const uint32_t skip = q->pos0 < qs->hidden_pos0 ? qs->hidden_pos0 - q->pos0 : 0;
        model_rmsnorm(SESSION(f), qs->hidden_out + (size_t)(q->pos0 + skip - qs->hidden_pos0) * E,
                      CROWS(x) + (size_t)(q->row0 + skip) * E, norm_w, q->n - skip, E, eps);
    }
}

const struct model_ops model_cpu_ops = {
    .acts_new = acts_new,
    .act_free = act_free,
    .moe_ws_new = moe_ws_new,
    .moe_ws_free = moe_ws_free,
    .embed = embed,
    .rope_angles = rope_angles,
    .hidden_in = hidden_in,
    .matmul = matmul,
    .rmsnorm = rmsnorm,
    .rmsnorm_heads = rmsnorm_heads,
    .add_bias = add_bias,
    .add = add,
    .swiglu = swiglu,
    .sigmoid_mul = sigmoid_mul,
    .split_heads = split_heads,
    .concat_rows = concat_rows,
    .rope = rope,
    .moe = moe,
    .attention = attention,
    .deltanet = deltanet,
    .output = output,
    .hidden_out = hidden_out,
};
