/* The LLaMA family of decoder-only transformers: `llama`, `qwen2` (q/k/v biases, NeoX
 * RoPE), `qwen3` (per-head RMSNorm of q and k, NeoX RoPE) and `qwen3moe` (qwen3 with a
 * mixture-of-experts feed-forward, moe.h). Pre-norm blocks:
 *
 *   x += Wo attention(rope(norm_q(Wq n(x) + bq)), rope(norm_k(Wk n(x) + bk)), Wv n(x) + bv)
 *   x += Wdown (silu(Wgate n(x)) * Wup n(x))          (qwen3moe: x += moe(n(x)))
 *   logits = Wout n(x)
 *
 * Every layer is an attention layer (model.h). */
#include "model/arch-llama.h"
#include "backend/backend.h"
#include "model/model.h"
#include "model/moe.h"

#include "util/mem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What changes per chunk (llama2.c's RunState), on the backend it was made for. */
struct llama_state {
    struct model_backend backend;
    uint32_t n_chunk;
    struct model_act *x;   /* (n_chunk, n_embd) residual stream */
    struct model_act *xb;  /* (n_chunk, n_embd) normed input / projected output */
    struct model_act *q;   /* (n_chunk, n_head * head_dim) */
    struct model_act *k;   /* (n_chunk, n_head_kv * head_dim) */
    struct model_act *v;   /* (n_chunk, n_head_kv * head_dim) */
    struct model_act *att; /* (n_chunk, n_head * head_dim) attention output */
    struct model_act *hb;  /* (n_chunk, n_ff) gate, then silu(gate) * up */
    struct model_act *hb2; /* (n_chunk, n_ff) up */
    struct model_act *cs;  /* (n_chunk, n_rot) RoPE cos/sin per token */
    struct model_act *xm;  /* (n_chunk, n_embd) qwen3moe: the normed FFN input */
    struct model_moe_ws *moe; /* qwen3moe */
    size_t bytes;
};

/* ---- load ------------------------------------------------------------------------ */

static void llama_unload(struct tern_model *m) {
    struct llama_weights *w = m->w;
    if (!w) return;
    free(w->layers);
    free(w);
    m->w = NULL;
}

static enum tern_status llama_load_variant(struct tern_model *m, struct llama_variant var) {
    enum tern_status st;
    struct model_hparams *hp = &m->hp;
    if ((st = model_hparams_load(m, hp))) return st;
    if (hp->head_dim_k != hp->head_dim_v)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "model: key length %u differs from value length %u", hp->head_dim_k,
                           hp->head_dim_v);
    struct llama_weights *w = tern_calloc(1, sizeof *w);
    if (!w) return tern_errorf(TERN_ERR_NOMEM, "model: out of memory");
    m->w = w;
    w->var = var;
    w->layers = tern_calloc(hp->n_layer, sizeof *w->layers);
    if (!w->layers) return tern_errorf(TERN_ERR_NOMEM, "model: out of memory");

    const uint32_t E = hp->n_embd, hd = hp->head_dim_k, nq = hp->n_head * hd, nkv = hp->n_head_kv * hd;
    const uint32_t F = hp->n_ff;
    if (var.moe) {
        /* qwen3moe: softmax gate, the chosen weights renormalised (HF norm_topk_prob) */
        if ((st = moe_hparams_load(m, true, false, &w->moe))) return st;
    } else if ((st = model_require_ff(m))) {
        return st;
    }
    if ((st = model_get_embd(m, &w->tok_embd, E, "token_embd.weight")) ||
        (st = model_get_vec(m, &w->out_norm, E, true, "output_norm.weight")) ||
        (st = model_get_mat_opt(m, &w->output, E, hp->n_vocab, "output.weight")))
        return st;
    if (!w->output.data) /* tied embeddings */
        if ((st = model_get_mat(m, &w->output, E, hp->n_vocab, "token_embd.weight"))) return st;
    if ((st = model_get_vec(m, &w->rope_freqs, hp->rope.n_rot / 2, false, "rope_freqs.weight"))) return st;
    hp->rope.freq_factors = w->rope_freqs;

    for (uint32_t il = 0; il < hp->n_layer; il++) {
        struct llama_layer *L = &w->layers[il];
        if ((st = model_get_vec(m, &L->attn_norm, E, true, "blk.%u.attn_norm.weight", il)) ||
            (st = model_get_mat(m, &L->wq, E, nq, "blk.%u.attn_q.weight", il)) ||
            (st = model_get_mat(m, &L->wk, E, nkv, "blk.%u.attn_k.weight", il)) ||
            (st = model_get_mat(m, &L->wv, E, nkv, "blk.%u.attn_v.weight", il)) ||
            (st = model_get_mat(m, &L->wo, nq, E, "blk.%u.attn_output.weight", il)) ||
            (st = model_get_vec(m, &L->bq, nq, var.biases, "blk.%u.attn_q.bias", il)) ||
            (st = model_get_vec(m, &L->bk, nkv, var.biases, "blk.%u.attn_k.bias", il)) ||
            (st = model_get_vec(m, &L->bv, nkv, var.biases, "blk.%u.attn_v.bias", il)) ||
            (st = model_get_vec(m, &L->q_norm, hd, var.qk_norm, "blk.%u.attn_q_norm.weight", il)) ||
            (st = model_get_vec(m, &L->k_norm, hd, var.qk_norm, "blk.%u.attn_k_norm.weight", il)) ||
            (st = model_get_vec(m, &L->ffn_norm, E, true, "blk.%u.ffn_norm.weight", il)))
            return st;
        if (var.moe) st = moe_layer_load(m, &w->moe, il, &L->moe);
        else if ((st = model_get_mat(m, &L->w_gate, E, F, "blk.%u.ffn_gate.weight", il)) ||
                 (st = model_get_mat(m, &L->w_up, E, F, "blk.%u.ffn_up.weight", il)))
            ;
        else st = model_get_mat(m, &L->w_down, F, E, "blk.%u.ffn_down.weight", il);
        if (st) return st;
        if (!L->q_norm != !L->k_norm)
            return tern_errorf(TERN_ERR_FORMAT, "model: layer %u has only one of attn_q_norm and attn_k_norm", il);
    }
    return model_layers_init(m, hp->n_layer);
}

static enum tern_status load_llama(struct tern_model *m) {
    return llama_load_variant(m, (struct llama_variant){.neox = false});
}
static enum tern_status load_qwen2(struct tern_model *m) {
    return llama_load_variant(m, (struct llama_variant){.neox = true, .biases = true});
}
static enum tern_status load_qwen3(struct tern_model *m) {
    return llama_load_variant(m, (struct llama_variant){.neox = true, .qk_norm = true});
}
static enum tern_status load_qwen3moe(struct tern_model *m) {
    return llama_load_variant(m, (struct llama_variant){.neox = true, .qk_norm = true, .moe = true});
}

/* ---- RunState ----------------------------------------------------------------------- */

static void llama_state_free(void *p) {
    struct llama_state *rs = p;
    if (!rs) return;
    struct model_act *const acts[] = {rs->x, rs->xb, rs->q, rs->k, rs->v, rs->att, rs->hb, rs->hb2, rs->cs, rs->xm};
    model_acts_free(&rs->backend, acts, TERN_ARRAY_LEN(acts));
    if (rs->moe) rs->backend.ops->moe_ws_free(rs->backend.ctx, rs->moe);
    free(rs);
}

static enum tern_status llama_state_new(const struct tern_model *m, const struct model_backend *on, uint32_t n_chunk,
                                        void **out) {
    *out = NULL;
    const struct model_hparams *hp = &m->hp;
    const struct llama_weights *w = m->w;
    struct llama_state *rs = tern_calloc(1, sizeof *rs);
    if (!rs) return tern_errorf(TERN_ERR_NOMEM, "model: out of memory");
    rs->backend = *on;
    rs->n_chunk = n_chunk;
    const size_t nq = (size_t)hp->n_head * hp->head_dim_k, nkv = (size_t)hp->n_head_kv * hp->head_dim_k;
    const struct model_act_buf bufs[] = {
        {&rs->x, hp->n_embd, false},   {&rs->xb, hp->n_embd, false}, {&rs->q, nq, false},
        {&rs->k, nkv, false},          {&rs->v, nkv, false},         {&rs->att, nq, false},
        {&rs->hb, hp->n_ff, false},    {&rs->hb2, hp->n_ff, false},
        {&rs->cs, hp->rope.n_rot, false}, {&rs->xm, w->var.moe ? hp->n_embd : 0, false},
    };
    enum tern_status st = model_acts_new(on, bufs, TERN_ARRAY_LEN(bufs), n_chunk, &rs->bytes);
    if (!st && w->var.moe) {
        struct moe_layer *ml = tern_calloc(hp->n_layer, sizeof *ml);
        if (!ml) st = tern_errorf(TERN_ERR_NOMEM, "model: out of memory");
        for (uint32_t il = 0; ml && il < hp->n_layer; il++) ml[il] = w->layers[il].moe;
        if (ml) st = on->ops->moe_ws_new(on->ctx, m, &w->moe, ml, hp->n_layer, n_chunk, &rs->moe, &rs->bytes);
        free(ml);
    }
    if (st) {
        llama_state_free(rs);
        return st;
    }
    *out = rs;
    return TERN_OK;
}

static size_t llama_state_bytes(const void *p) { return ((const struct llama_state *)p)->bytes; }

/* ---- forward ----------------------------------------------------------------------- */

static void llama_forward(const struct model_step *f, void *p) {
    const struct model_ops *o = f->ops;
    const struct tern_model *m = f->m;
    const struct model_hparams *hp = &m->hp;
    const struct llama_weights *w = m->w;
    struct llama_state *rs = p;
    const uint32_t E = hp->n_embd, hd = hp->head_dim_k;
    const uint32_t nq = hp->n_head * hd, nkv = hp->n_head_kv * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const struct model_rope rope = {.p = &hp->rope, .neox = w->var.neox};

    o->embed(f, &w->tok_embd, rs->x);
    o->rope_angles(f, &rope, rs->cs);
    for (uint32_t il = 0; il < m->n_layer; il++) {
        const struct llama_layer *L = &w->layers[il];
        /* attention */
        o->rmsnorm(f, rs->xb, rs->x, L->attn_norm, E, hp->rms_eps);
        const struct model_mm qkv[] = {{&L->wq, rs->q}, {&L->wk, rs->k}, {&L->wv, rs->v}};
        o->matmul(f, rs->xb, qkv, 3);
        if (L->bq) o->add_bias(f, rs->q, L->bq, nq);
        if (L->bk) o->add_bias(f, rs->k, L->bk, nkv);
        if (L->bv) o->add_bias(f, rs->v, L->bv, nkv);
        if (L->q_norm) {
            o->rmsnorm_heads(f, rs->q, L->q_norm, hp->n_head, hd, hp->rms_eps);
            o->rmsnorm_heads(f, rs->k, L->k_norm, hp->n_head_kv, hd, hp->rms_eps);
        }
        o->rope(f, &rope, rs->q, hp->n_head, rs->k, hp->n_head_kv, hd, rs->cs);
        o->attention(f, il, rs->q, rs->k, rs->v, rs->att, hp->n_head, scale);
        const struct model_mm wo = {&L->wo, rs->xb};
        o->matmul(f, rs->att, &wo, 1);
        o->add(f, rs->x, rs->xb, E);
        /* feed-forward */
        if (w->var.moe) {
            o->rmsnorm(f, rs->xm, rs->x, L->ffn_norm, E, hp->rms_eps);
            o->moe(f, &w->moe, &L->moe, rs->moe, rs->xm, rs->xb);
        } else {
            o->rmsnorm(f, rs->xb, rs->x, L->ffn_norm, E, hp->rms_eps);
            const struct model_mm gu[] = {{&L->w_gate, rs->hb}, {&L->w_up, rs->hb2}};
            o->matmul(f, rs->xb, gu, 2);
            o->swiglu(f, rs->hb, rs->hb2, hp->n_ff);
            const struct model_mm down = {&L->w_down, rs->xb};
            o->matmul(f, rs->hb, &down, 1);
        }
        o->add(f, rs->x, rs->xb, E);
    }
    /* Only the rows whose logits are wanted are normed and projected. */
    o->output(f, &w->output, w->out_norm, hp->rms_eps, rs->x, rs->xb);
}

#define LLAMA_ARCH(NAME, LOAD)                                                                                         \
    {                                                                                                                  \
        .name = NAME, .load = LOAD, .unload = llama_unload, .state_new = llama_state_new,                              \
        .state_free = llama_state_free, .state_bytes = llama_state_bytes, .forward = llama_forward,                    \
    }

const struct tern_arch tern_arch_llama = LLAMA_ARCH("llama", load_llama);
const struct tern_arch tern_arch_qwen2 = LLAMA_ARCH("qwen2", load_qwen2);
const struct tern_arch tern_arch_qwen3 = LLAMA_ARCH("qwen3", load_qwen3);
const struct tern_arch tern_arch_qwen3moe = LLAMA_ARCH("qwen3moe", load_qwen3moe);
