/* gpt-oss (OpenAI's open-weight mixture of experts), as llama.cpp's openai-moe computes it.
 * Pre-norm blocks, every layer attention + MoE:
 *
 *   q, k, v = Wq n(x) + bq, Wk n(x) + bk, Wv n(x) + bv     NeoX RoPE over the head, YaRN
 *   x += Wo attention(rope(q), rope(k), v) + bo            with per-head sinks; even
 *                                                          layers see a sliding window
 *   x += moe(n'(x))                                        biased router, top-k on the
 *                                                          logits, softmax over the k;
 *                                                          clamped swiglu experts with
 *                                                          biases (moe.h)
 *   logits = Wout n(x)
 *
 * The sink of head h is one more logit in that head's softmax (its max and denominator)
 * that takes no value (model.h's struct model_layer). The window is
 * {arch}.attention.sliding_window keys ending at the query's own; there is no pattern key
 * in the published files, so llama.cpp's gpt-oss default applies: layers 0, 2, 4, ... use
 * the window, the odd ones see every earlier key. The cache keeps every position of the
 * window layers too (docs/engine.md says why). */
#include "backend/backend.h"
#include "model/model.h"
#include "model/moe.h"

#include "util/mem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Read-only views into the mapping. */
struct gptoss_layer {
    const float *attn_norm;     /* (n_embd) */
    struct mat wq;              /* [n_embd, n_head * head_dim] */
    struct mat wk, wv;          /* [n_embd, n_head_kv * head_dim] */
    struct mat wo;              /* [n_head * head_dim, n_embd] */
    const float *bq;            /* (n_head * head_dim) */
    const float *bk, *bv;       /* (n_head_kv * head_dim) */
    const float *bo;            /* (n_embd) */
    const float *sinks;         /* (n_head) */
    const float *post_norm;     /* (n_embd) post_attention_norm: the MoE's input norm */
    struct moe_layer moe;       /* router, experts and their biases */
};

struct gptoss_weights {
    struct moe_hparams moe;
    uint32_t window;            /* {arch}.attention.sliding_window */
    struct mat tok_embd;        /* [n_embd, n_vocab] */
    const float *out_norm;      /* (n_embd) */
    struct mat output;          /* [n_embd, n_vocab]; token_embd when tied */
    struct gptoss_layer *layers; /* (n_layer) */
};

/* What changes per chunk, on the backend it was made for. */
struct gptoss_state {
    struct model_backend backend;
    struct model_act *x;   /* (n_chunk, n_embd) residual stream */
    struct model_act *xb;  /* (n_chunk, n_embd) normed input / projected output */
    struct model_act *xm;  /* (n_chunk, n_embd) the normed MoE input */
    struct model_act *q;   /* (n_chunk, n_head * head_dim) */
    struct model_act *k;   /* (n_chunk, n_head_kv * head_dim) */
    struct model_act *v;   /* (n_chunk, n_head_kv * head_dim) */
    struct model_act *att; /* (n_chunk, n_head * head_dim) attention output */
    struct model_act *cs;  /* (n_chunk, n_rot) RoPE cos/sin per token */
    struct model_moe_ws *moe;
    size_t bytes;
};

/* ---- load ------------------------------------------------------------------------ */

static void gptoss_unload(struct tern_model *m) {
    struct gptoss_weights *w = m->w;
    if (!w) return;
    free(w->layers);
    free(w);
    m->w = NULL;
}

static enum tern_status gptoss_load(struct tern_model *m) {
    enum tern_status st;
    struct model_hparams *hp = &m->hp;
    if ((st = model_hparams_load(m, hp))) return st;
    if (hp->head_dim_k != hp->head_dim_v)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "model: key length %u differs from value length %u", hp->head_dim_k,
                           hp->head_dim_v);
    struct gptoss_weights *w = tern_calloc(1, sizeof *w);
    if (!w) return tern_errorf(TERN_ERR_NOMEM, "model: out of memory");
    m->w = w;
    w->layers = tern_calloc(hp->n_layer, sizeof *w->layers);
    if (!w->layers) return tern_errorf(TERN_ERR_NOMEM, "model: out of memory");
    if ((st = moe_hparams_load(m, false, false, &w->moe))) return st;

    char key[96];
    snprintf(key, sizeof key, "%s.attention.sliding_window", m->arch->name);
    if (!gguf_find_kv(m->f, key)) return tern_errorf(TERN_ERR_FORMAT, "model: metadata key '%s' is missing", key);
    if ((st = gguf_get_u32(m->f, key, &w->window))) return st;
    if (w->window < 1)
        return tern_errorf(TERN_ERR_FORMAT, "model: %s = %u must be at least 1", key, w->window);

    const uint32_t E = hp->n_embd, hd = hp->head_dim_k, nq = hp->n_head * hd, nkv = hp->n_head_kv * hd;
    if ((st = model_get_embd(m, &w->tok_embd, E, "token_embd.weight")) ||
        (st = model_get_vec(m, &w->out_norm, E, true, "output_norm.weight")) ||
        (st = model_get_mat_opt(m, &w->output, E, hp->n_vocab, "output.weight")))
        return st;
    if (!w->output.data) /* tied embeddings */
        if ((st = model_get_mat(m, &w->output, E, hp->n_vocab, "token_embd.weight"))) return st;

    for (uint32_t il = 0; il < hp->n_layer; il++) {
        struct gptoss_layer *L = &w->layers[il];
        if ((st = model_get_vec(m, &L->attn_norm, E, true, "blk.%u.attn_norm.weight", il)) ||
            (st = model_get_mat(m, &L->wq, E, nq, "blk.%u.attn_q.weight", il)) ||
            (st = model_get_mat(m, &L->wk, E, nkv, "blk.%u.attn_k.weight", il)) ||
            (st = model_get_mat(m, &L->wv, E, nkv, "blk.%u.attn_v.weight", il)) ||
            (st = model_get_mat(m, &L->wo, nq, E, "blk.%u.attn_output.weight", il)) ||
            (st = model_get_vec(m, &L->bq, nq, true, "blk.%u.attn_q.bias", il)) ||
            (st = model_get_vec(m, &L->bk, nkv, true, "blk.%u.attn_k.bias", il)) ||
            (st = model_get_vec(m, &L->bv, nkv, true, "blk.%u.attn_v.bias", il)) ||
            (st = model_get_vec(m, &L->bo, E, true, "blk.%u.attn_output.bias", il)) ||
            (st = model_get_vec(m, &L->sinks, hp->n_head, true, "blk.%u.attn_sinks.weight", il)) ||
            (st = model_get_vec(m, &L->post_norm, E, true, "blk.%u.post_attention_norm.weight", il)) ||
            (st = moe_layer_load(m, &w->moe, il, &L->moe)))
            return st;
    }
    if ((st = model_layers_init(m, hp->n_layer))) return st;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        m->layers[il].window = il % 2 == 0 ? w->window : 0;
        m->layers[il].sinks = w->layers[il].sinks;
    }
    return TERN_OK;
}

/* ---- RunState ----------------------------------------------------------------------- */

static void gptoss_state_free(void *p) {
    struct gptoss_state *rs = p;
    if (!rs) return;
    struct model_act *const acts[] = {rs->x, rs->xb, rs->xm, rs->q, rs->k, rs->v, rs->att, rs->cs};
    model_acts_free(&rs->backend, acts, TERN_ARRAY_LEN(acts));
    if (rs->moe) rs->backend.ops->moe_ws_free(rs->backend.ctx, rs->moe);
    free(rs);
}

static enum tern_status gptoss_state_new(const struct tern_model *m, const struct model_backend *on, uint32_t n_chunk,
                                         void **out) {
    *out = NULL;
    const struct model_hparams *hp = &m->hp;
    const struct gptoss_weights *w = m->w;
    struct gptoss_state *rs = tern_calloc(1, sizeof *rs);
    if (!rs) return tern_errorf(TERN_ERR_NOMEM, "model: out of memory");
    rs->backend = *on;
    const size_t nq = (size_t)hp->n_head * hp->head_dim_k, nkv = (size_t)hp->n_head_kv * hp->head_dim_k;
    const struct model_act_buf bufs[] = {
        {&rs->x, hp->n_embd, false}, {&rs->xb, hp->n_embd, false}, {&rs->xm, hp->n_embd, false},
        {&rs->q, nq, false},         {&rs->k, nkv, false},         {&rs->v, nkv, false},
        {&rs->att, nq, false},       {&rs->cs, hp->rope.n_rot, false},
    };
    enum tern_status st = model_acts_new(on, bufs, TERN_ARRAY_LEN(bufs), n_chunk, &rs->bytes);
    if (!st) {
        struct moe_layer *ml = tern_calloc(hp->n_layer, sizeof *ml);
        if (!ml) st = tern_errorf(TERN_ERR_NOMEM, "model: out of memory");
        for (uint32_t il = 0; ml && il < hp->n_layer; il++) ml[il] = w->layers[il].moe;
        if (ml) st = on->ops->moe_ws_new(on->ctx, m, &w->moe, ml, hp->n_layer, n_chunk, &rs->moe, &rs->bytes);
        free(ml);
    }
    if (st) {
        gptoss_state_free(rs);
        return st;
    }
    *out = rs;
    return TERN_OK;
}

static size_t gptoss_state_bytes(const void *p) { return ((const struct gptoss_state *)p)->bytes; }

/* ---- forward ----------------------------------------------------------------------- */

static void gptoss_forward(const struct model_step *f, void *p) {
    const struct model_ops *o = f->ops;
    const struct tern_model *m = f->m;
    const struct model_hparams *hp = &m->hp;
    const struct gptoss_weights *w = m->w;
    struct gptoss_state *rs = p;
    const uint32_t E = hp->n_embd, hd = hp->head_dim_k;
    const uint32_t nq = hp->n_head * hd, nkv = hp->n_head_kv * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const struct model_rope rope = {.p = &hp->rope, .neox = true};

    o->embed(f, &w->tok_embd, rs->x);
    o->rope_angles(f, &rope, rs->cs);
    for (uint32_t il = 0; il < m->n_layer; il++) {
        const struct gptoss_layer *L = &w->layers[il];
        /* attention (the layer's window and sinks are the attention operation's) */
        o->rmsnorm(f, rs->xb, rs->x, L->attn_norm, E, hp->rms_eps);
        const struct model_mm qkv[] = {{&L->wq, rs->q}, {&L->wk, rs->k}, {&L->wv, rs->v}};
        o->matmul(f, rs->xb, qkv, 3);
        o->add_bias(f, rs->q, L->bq, nq);
        o->add_bias(f, rs->k, L->bk, nkv);
        o->add_bias(f, rs->v, L->bv, nkv);
        o->rope(f, &rope, rs->q, hp->n_head, rs->k, hp->n_head_kv, hd, rs->cs);
        o->attention(f, il, rs->q, rs->k, rs->v, rs->att, hp->n_head, scale);
        const struct model_mm wo = {&L->wo, rs->xb};
        o->matmul(f, rs->att, &wo, 1);
        o->add_bias(f, rs->xb, L->bo, E);
        o->add(f, rs->x, rs->xb, E);
        /* mixture of experts */
        o->rmsnorm(f, rs->xm, rs->x, L->post_norm, E, hp->rms_eps);
        o->moe(f, &w->moe, &L->moe, rs->moe, rs->xm, rs->xb);
        o->add(f, rs->x, rs->xb, E);
    }
    o->output(f, &w->output, w->out_norm, hp->rms_eps, rs->x, rs->xb);
}

const struct tern_arch tern_arch_gptoss = {
    .name = "gpt-oss",
    .load = gptoss_load,
    .unload = gptoss_unload,
    .state_new = gptoss_state_new,
    .state_free = gptoss_state_free,
    .state_bytes = gptoss_state_bytes,
    .forward = gptoss_forward,
};
