/* Qwen3.5 (`qwen35`): a hybrid of Gated DeltaNet layers (linear attention with a
 * recurrent state, deltanet.h) and, every full_attention_interval-th layer, gated full
 * attention. docs/qwen35.md has the math and the llama.cpp facts it was checked on.
 * `qwen35moe` (Qwen3.5-35B-A3B) is the same hybrid with a mixture-of-experts
 * feed-forward and a gated shared expert in every layer (moe.h); its keys carry the
 * `qwen35moe.` prefix.
 *
 *   DeltaNet layer:   h = n(x)
 *                     qkv = conv+silu(Wqkv h)  (causal, per channel; state: the window)
 *                     o = gated_delta_rule(qkv, beta = Wbeta h, alpha = Walpha h)
 *                     x += Wout (rmsnorm(o) * ssm_norm * silu(Wgate h))
 *   attention layer:  [q | g] per head = Wq h; k = Wk h; v = Wv h
 *                     x += Wo (attention(rope(norm_q(q)), rope(norm_k(k)), v) * sigmoid(g))
 *   every layer:      x += Wdown (silu(Wgate n2(x)) * Wup n2(x))     (n2 = post_attention_norm)
 *                     (qwen35moe: x += moe(n2(x)), routed experts + sigmoid-gated shared expert)
 *   logits = Wout n(x)
 *
 * RoPE is IMROPE (interleaved multimodal sections) over the first n_rot dims of each
 * head, pairing i with i + n_rot/2. For text every section's position is the token's
 * position except the fourth ("e"), which is 0; pairs that fall in no t/h/w section
 * therefore do not rotate. With Qwen3.5's sections every pair is covered, so this is
 * plain NeoX RoPE over n_rot dims.
 *
 * Recurrent state per DeltaNet layer (model.h buffers, zero at position 0):
 *   "conv"  [n_conv - 1][C] F32, C = 2 * n_k_heads * d_k + n_v_heads * d_v
 *   "ssm"   [n_v_heads][d_k][d_v] F32 */
#include "model/arch-qwen35.h"
#include "backend/backend.h"
#include "kernels/deltanet.h"
#include "model/model.h"
#include "model/moe.h"

#include "util/log.h"
#include "util/mem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What changes per chunk (the RunState), on the backend it was made for. Rows of
 * n_chunk tokens. */
struct q35_state {
    struct model_backend backend;
    uint32_t n_chunk;
    struct model_act *x;       /* (n_chunk, n_embd) residual stream */
    struct model_act *xb;      /* (n_chunk, n_embd) normed input / projected output */
    struct model_act *qkv_raw; /* (n_chunk, C) attn_qkv projection */
    struct model_act *qkv;     /* (n_chunk, C) after conv + silu */
    struct model_act *z;       /* (n_chunk, n_v * d_v) attn_gate projection */
    struct model_act *beta;    /* (n_chunk, n_v) */
    struct model_act *alpha;   /* (n_chunk, n_v) */
    struct model_act *ba;      /* (n_chunk, 2 n_v) qwen3next: the fused ssm_ba projection */
    struct model_act *o;       /* (n_chunk, n_v * d_v) DeltaNet output, gated-normed */
    struct model_act *dn_scratch; /* (n_v, tern_deltanet_scratch_floats) one per v-head */
    struct model_act *qg;      /* (n_chunk, n_head * 2 * head_dim) */
    struct model_act *q;       /* (n_chunk, n_head * head_dim) */
    struct model_act *gate;    /* (n_chunk, n_head * head_dim) */
    struct model_act *k;       /* (n_chunk, n_head_kv * head_dim) */
    struct model_act *v;       /* (n_chunk, n_head_kv * head_dim) */
    struct model_act *att;     /* (n_chunk, n_head * head_dim) */
    struct model_act *cs;      /* (n_chunk, n_rot) RoPE cos/sin per token */
    struct model_act *hb;      /* (n_chunk, n_ff) */
    struct model_act *hb2;     /* (n_chunk, n_ff) */
    struct model_act *xm;      /* (n_chunk, n_embd) qwen35moe: the normed FFN input */
    struct model_act *h;       /* (n_chunk, n_embd) the MTP head's input hidden state */
    struct model_act *cat;     /* (n_chunk, 2 n_embd) the MTP head's [embedding | hidden] input */
    struct model_moe_ws *moe;  /* qwen35moe */
    size_t bytes;
};

/* ---- load ------------------------------------------------------------------------ */

static void q35_unload(struct tern_model *m) {
    struct q35_weights *w = m->w;
    if (!w) return;
    if (w->layers)
        for (uint32_t il = 0; il < w->n_layer; il++) free(w->layers[il].conv_wt);
    free(w->layers);
    free(w);
    m->w = NULL;
}

static enum tern_status get_u32(struct tern_model *m, const char *suffix, bool required, uint32_t def,
                                uint32_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch->name, suffix);
    if (!gguf_find_kv(m->f, key)) {
        if (required) return tern_errorf(TERN_ERR_FORMAT, "%s: metadata key '%s' is missing", m->arch->name, key);
        *out = def;
        return TERN_OK;
    }
    return gguf_get_u32(m->f, key, out);
}

/* Which RoPE pairs take position 0 for text (see the top of the file). */
static enum tern_status load_rope_sections(struct tern_model *m, struct q35_weights *w) {
    const uint32_t n_pairs = m->hp.rope.n_rot / 2;
    if (n_pairs > TERN_ARRAY_LEN(w->rope_pos0))
        return tern_errorf(TERN_ERR_UNSUPPORTED, "qwen35: rope.dimension_count %u exceeds %zu",
                           m->hp.rope.n_rot, 2 * TERN_ARRAY_LEN(w->rope_pos0));
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", m->arch->name);
    if (!gguf_find_kv(m->f, key)) return TERN_OK; /* plain NeoX */
    const struct gguf_kv *kv;
    enum tern_status st = gguf_get_arr(m->f, key, GGUF_TYPE_INT32, &kv);
    if (st) return st;
    if (kv->v.arr.n < 3 || kv->v.arr.n > 4)
        return tern_errorf(TERN_ERR_FORMAT, "qwen35: rope.dimension_sections has %llu entries, expected 3 or 4",
                           (unsigned long long)kv->v.arr.n);
    int64_t sec[4] = {0, 0, 0, 0}, total = 0;
    for (uint64_t i = 0; i < kv->v.arr.n; i++) {
        sec[i] = gguf_arr_get_i64(kv, i);
        if (sec[i] < 0 || sec[i] > 4096)
            return tern_errorf(TERN_ERR_FORMAT, "qwen35: rope.dimension_sections[%llu] = %lld is out of range [0, 4096]",
                               (unsigned long long)i, (long long)sec[i]);
        total += sec[i];
    }
    if (total == 0) return tern_errorf(TERN_ERR_FORMAT, "qwen35: rope.dimension_sections are all 0");
    /* Interleaved sections as ggml's IMROPE assigns them: sector s of each run of total
     * pairs goes to t, h, w by s mod 3 while that section lasts, else to e. */
    for (uint32_t i = 0; i < n_pairs; i++) {
        const int64_t s = (int64_t)i % total;
        const bool thw = (s % 3 == 1 && s < 3 * sec[1]) || (s % 3 == 2 && s < 3 * sec[2]) ||
                         (s % 3 == 0 && s < 3 * sec[0]);
        w->rope_pos0[i] = !thw;
        w->any_pos0 |= !thw;
    }
    tern_rope_angles(&m->hp.rope, 0, w->rope_cs0);
    return TERN_OK;
}

static enum tern_status load_deltanet_shape(struct tern_model *m, struct q35_weights *w) {
    enum tern_status st;
    uint32_t inner;
    struct tern_deltanet_shape *dn = &w->dn;
    if ((st = get_u32(m, "ssm.conv_kernel", true, 0, &dn->n_conv)) ||
        (st = get_u32(m, "ssm.state_size", true, 0, &dn->d_k)) ||
        (st = get_u32(m, "ssm.group_count", true, 0, &dn->n_k_heads)) ||
        (st = get_u32(m, "ssm.time_step_rank", true, 0, &dn->n_v_heads)) ||
        (st = get_u32(m, "ssm.inner_size", true, 0, &inner)))
        return st;
    if (dn->n_v_heads == 0 || inner % dn->n_v_heads != 0)
        return tern_errorf(TERN_ERR_FORMAT, "qwen35: ssm.inner_size %u is not a multiple of ssm.time_step_rank %u",
                           inner, dn->n_v_heads);
    dn->d_v = inner / dn->n_v_heads;
    dn->eps = m->hp.rms_eps;
    return tern_deltanet_shape_check(dn);
}

/* ssm_conv1d: F32 [n_conv, C], copied tap-major. */
static enum tern_status load_conv(struct tern_model *m, const struct q35_weights *w, uint32_t il,
                                  float **out) {
    char name[64];
    snprintf(name, sizeof name, "blk.%u.ssm_conv1d.weight", il);
    const size_t K = w->dn.n_conv, C = tern_deltanet_channels(&w->dn);
    const struct gguf_tensor *t = gguf_find_tensor(m->f, name);
    if (!t)
        return tern_errorf(TERN_ERR_FORMAT, "qwen35: tensor '%s' is missing (expected shape [%zu, %zu])", name, K, C);
    if (t->ne[0] != K || t->ne[1] != C || t->ne[2] != 1 || t->ne[3] != 1)
        return tern_errorf(TERN_ERR_FORMAT, "qwen35: tensor '%s' has shape [%llu, %llu, %llu], expected [%zu, %zu]",
                           name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                           (unsigned long long)t->ne[2], K, C);
    if (t->type != TERN_DTYPE_F32)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "qwen35: tensor '%s' has type %s, expected F32", name,
                           tern_dtype_name(t->type));
    *out = tern_malloc(K * C * sizeof(float));
    if (!*out) return tern_errorf(TERN_ERR_NOMEM, "qwen35: out of memory");
    tern_deltanet_conv_weights(&w->dn, t->data, *out);
    return TERN_OK;
}

/* The tensors of a full-attention layer and its feed-forward block, blk.{il}. */
static enum tern_status load_attn_ffn(struct tern_model *m, struct q35_weights *w, struct q35_layer *L, uint32_t il) {
    const struct model_hparams *hp = &m->hp;
    const uint32_t E = hp->n_embd, hd = hp->head_dim_k, nq = hp->n_head * hd, nkv = hp->n_head_kv * hd;
    enum tern_status st;
    if ((st = model_get_vec(m, &L->attn_norm, E, true, "blk.%u.attn_norm.weight", il)) ||
        (st = model_get_vec(m, &L->post_norm, E, true, "blk.%u.post_attention_norm.weight", il)) ||
        (st = model_get_mat(m, &L->wq, E, 2 * nq, "blk.%u.attn_q.weight", il)) ||
        (st = model_get_mat(m, &L->wk, E, nkv, "blk.%u.attn_k.weight", il)) ||
        (st = model_get_mat(m, &L->wv, E, nkv, "blk.%u.attn_v.weight", il)) ||
        (st = model_get_mat(m, &L->wo, nq, E, "blk.%u.attn_output.weight", il)) ||
        (st = model_get_vec(m, &L->q_norm, hd, true, "blk.%u.attn_q_norm.weight", il)) ||
        (st = model_get_vec(m, &L->k_norm, hd, true, "blk.%u.attn_k_norm.weight", il)))
        return st;
    if (w->moe) return moe_layer_load(m, &w->moe_hp, il, &L->moe);
    if ((st = model_get_mat(m, &L->w_gate, E, hp->n_ff, "blk.%u.ffn_gate.weight", il)) ||
        (st = model_get_mat(m, &L->w_up, E, hp->n_ff, "blk.%u.ffn_up.weight", il)))
        return st;
    return model_get_mat(m, &L->w_down, hp->n_ff, E, "blk.%u.ffn_down.weight", il);
}

/* The MTP block blk.{n_layer} (llama.cpp's names: a full-attention decoder layer's
 * tensors plus blk.N.nextn.{eh_proj,enorm,hnorm} and the optional
 * nextn.{embed_tokens,shared_head_head,shared_head_norm}). A file that declares the
 * layer but carries none of its tensors (a converter that dropped them) loads without
 * the head; one that carries some of them must carry all. */
static enum tern_status load_mtp(struct tern_model *m, struct q35_weights *w, uint32_t n_nextn) {
    const uint32_t il = w->n_layer, E = m->hp.n_embd;
    char name[96];
    snprintf(name, sizeof name, "blk.%u.", il);
    const size_t n_prefix = strlen(name);
    bool any = false;
    for (uint64_t i = 0; i < gguf_n_tensors(m->f) && !any; i++) {
        const struct gguf_str *tn = &gguf_tensor_at(m->f, i)->name;
        any = tn->len > n_prefix && !memcmp(tn->ptr, name, n_prefix);
    }
    if (!any) {
        TERN_LOG_INFO("qwen35: nextn_predict_layers is %u but block %u has no tensors: no MTP head", n_nextn, il);
        return TERN_OK;
    }
    if (n_nextn > 1)
        TERN_LOG_WARN("qwen35: nextn_predict_layers is %u; only the first MTP layer (block %u) is used", n_nextn, il);
    enum tern_status st;
    struct q35_layer *L = &w->mtp;
    if ((st = model_get_mat(m, &w->eh_proj, 2 * E, E, "blk.%u.nextn.eh_proj.weight", il)) ||
        (st = model_get_vec(m, &w->enorm, E, true, "blk.%u.nextn.enorm.weight", il)) ||
        (st = model_get_vec(m, &w->hnorm, E, true, "blk.%u.nextn.hnorm.weight", il)) ||
        (st = model_get_vec(m, &w->head_norm, E, false, "blk.%u.nextn.shared_head_norm.weight", il)) ||
        (st = load_attn_ffn(m, w, L, il)))
        return st;
    snprintf(name, sizeof name, "blk.%u.nextn.embed_tokens.weight", il);
    if (gguf_find_tensor(m->f, name)) {
        if ((st = model_get_embd(m, &w->mtp_embd, E, name))) return st;
        if (w->mtp_embd.n != m->hp.n_vocab)
            return tern_errorf(TERN_ERR_FORMAT, "qwen35: tensor '%s' has %u rows, expected the vocabulary's %u", name,
                               w->mtp_embd.n, m->hp.n_vocab);
    } else {
        w->mtp_embd = w->tok_embd;
    }
    if ((st = model_get_mat_opt(m, &w->mtp_head, E, m->hp.n_vocab, "blk.%u.nextn.shared_head_head.weight", il)))
        return st;
    if (!w->mtp_head.data) w->mtp_head = w->output;
    if (!w->head_norm) w->head_norm = w->out_norm;
    L->recurrent = false;
    w->has_mtp = true;
    m->info.has_mtp = true;
    return TERN_OK;
}

static enum tern_status q35_load(struct tern_model *m) {
    enum tern_status st;
    struct model_hparams *hp = &m->hp;
    if ((st = model_hparams_load(m, hp))) return st;
    if (hp->head_dim_k != hp->head_dim_v)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "qwen35: key length %u differs from value length %u",
                           hp->head_dim_k, hp->head_dim_v);
    struct q35_weights *w = tern_calloc(1, sizeof *w);
    if (!w) return tern_errorf(TERN_ERR_NOMEM, "qwen35: out of memory");
    m->w = w;
    w->next = !strcmp(m->arch->name, "qwen3next");
    w->moe = w->next || !strcmp(m->arch->name, "qwen35moe");
    /* qwen35moe: softmax gate, renormalised top-k, a shared expert (llama.cpp's qwen35moe) */
    if (w->moe) st = moe_hparams_load(m, true, true, &w->moe_hp);
    else st = model_require_ff(m);
    if (st) return st;

    /* Multi-token-prediction layers (nextn) are appended to the block count and not run
     * by the main pass. */
    uint32_t n_nextn;
    if ((st = get_u32(m, "nextn_predict_layers", false, 0, &n_nextn))) return st;
    if (n_nextn >= hp->n_layer)
        return tern_errorf(TERN_ERR_FORMAT, "qwen35: nextn_predict_layers %u leaves no layers of block_count %u",
                           n_nextn, hp->n_layer);
    w->n_layer = hp->n_layer - n_nextn;
    if ((st = get_u32(m, "full_attention_interval", false, 4, &w->full_attn_interval))) return st;
    if (w->full_attn_interval == 0)
        return tern_errorf(TERN_ERR_FORMAT, "qwen35: full_attention_interval is 0");
    if ((st = load_deltanet_shape(m, w)) || (st = load_rope_sections(m, w))) return st;
    w->dn.k_grouped = w->next;
    w->layers = tern_calloc(w->n_layer, sizeof *w->layers);
    if (!w->layers) return tern_errorf(TERN_ERR_NOMEM, "qwen35: out of memory");

    const uint32_t E = hp->n_embd, hd = hp->head_dim_k, nq = hp->n_head * hd, nkv = hp->n_head_kv * hd;
    const uint32_t F = hp->n_ff;
    const uint32_t C = (uint32_t)tern_deltanet_channels(&w->dn);
    const uint32_t nv = w->dn.n_v_heads, nvd = nv * w->dn.d_v;
    if ((st = model_get_embd(m, &w->tok_embd, E, "token_embd.weight")) ||
        (st = model_get_vec(m, &w->out_norm, E, true, "output_norm.weight")) ||
        (st = model_get_mat_opt(m, &w->output, E, hp->n_vocab, "output.weight")))
        return st;
    if (!w->output.data) /* tied embeddings */
        if ((st = model_get_mat(m, &w->output, E, hp->n_vocab, "token_embd.weight"))) return st;

    for (uint32_t il = 0; il < w->n_layer; il++) {
        struct q35_layer *L = &w->layers[il];
        L->recurrent = (il + 1) % w->full_attn_interval != 0;
        if ((st = model_get_vec(m, &L->attn_norm, E, true, "blk.%u.attn_norm.weight", il)) ||
            (st = model_get_vec(m, &L->post_norm, E, true, "blk.%u.post_attention_norm.weight", il)))
            return st;
        if (w->moe) st = moe_layer_load(m, &w->moe_hp, il, &L->moe);
        else if ((st = model_get_mat(m, &L->w_gate, E, F, "blk.%u.ffn_gate.weight", il)) ||
                 (st = model_get_mat(m, &L->w_up, E, F, "blk.%u.ffn_up.weight", il)))
            ;
        else st = model_get_mat(m, &L->w_down, F, E, "blk.%u.ffn_down.weight", il);
        if (st) return st;
        if (L->recurrent) {
            if ((st = model_get_mat(m, &L->wqkv, E, C, "blk.%u.attn_qkv.weight", il)) ||
                (st = model_get_mat(m, &L->wgate, E, nvd, "blk.%u.attn_gate.weight", il)) ||
                (w->next ? (st = model_get_mat(m, &L->wba, E, 2 * nv, "blk.%u.ssm_ba.weight", il))
                         : ((st = model_get_mat(m, &L->wbeta, E, nv, "blk.%u.ssm_beta.weight", il)) ||
                            (st = model_get_mat(m, &L->walpha, E, nv, "blk.%u.ssm_alpha.weight", il)))) ||
                (st = model_get_vec(m, &L->ssm_a, nv, true, "blk.%u.ssm_a", il)) ||
                (st = model_get_vec(m, &L->dt_bias, nv, true, "blk.%u.ssm_dt.bias", il)) ||
                (st = model_get_vec(m, &L->ssm_norm, w->dn.d_v, true, "blk.%u.ssm_norm.weight", il)) ||
                (st = model_get_mat(m, &L->wout, nvd, E, "blk.%u.ssm_out.weight", il)) ||
                (st = load_conv(m, w, il, &L->conv_wt)))
                return st;
        } else {
            if ((st = model_get_mat(m, &L->wq, E, 2 * nq, "blk.%u.attn_q.weight", il)) ||
                (st = model_get_mat(m, &L->wk, E, nkv, "blk.%u.attn_k.weight", il)) ||
                (st = model_get_mat(m, &L->wv, E, nkv, "blk.%u.attn_v.weight", il)) ||
                (st = model_get_mat(m, &L->wo, nq, E, "blk.%u.attn_output.weight", il)) ||
                (st = model_get_vec(m, &L->q_norm, hd, true, "blk.%u.attn_q_norm.weight", il)) ||
                (st = model_get_vec(m, &L->k_norm, hd, true, "blk.%u.attn_k_norm.weight", il)))
                return st;
        }
    }
    if (n_nextn > 0 && (st = load_mtp(m, w, n_nextn))) return st;

    if ((st = model_layers_init(m, w->n_layer))) return st;
    const char *const names[] = {"conv", "ssm"};
    const size_t bytes[] = {tern_deltanet_conv_floats(&w->dn) * sizeof(float),
                            tern_deltanet_state_floats(&w->dn) * sizeof(float)};
    for (uint32_t il = 0; il < w->n_layer; il++)
        if (w->layers[il].recurrent && (st = model_layer_recurrent(m, il, names, bytes, 2))) return st;
    return TERN_OK;
}

/* ---- RunState ----------------------------------------------------------------------- */

static void q35_state_free(void *p) {
    struct q35_state *rs = p;
    if (!rs) return;
    struct model_act *const acts[] = {rs->x,  rs->xb, rs->qkv_raw, rs->qkv, rs->z,  rs->beta, rs->alpha, rs->ba,
                                      rs->o,  rs->dn_scratch, rs->qg, rs->q, rs->gate, rs->k, rs->v,
                                      rs->att, rs->cs, rs->hb, rs->hb2, rs->xm, rs->h, rs->cat};
    model_acts_free(&rs->backend, acts, TERN_ARRAY_LEN(acts));
    if (rs->moe) rs->backend.ops->moe_ws_free(rs->backend.ctx, rs->moe);
    free(rs);
}

static enum tern_status q35_state_new(const struct tern_model *m, const struct model_backend *on, uint32_t n_chunk,
                                      void **out) {
    *out = NULL;
    const struct model_hparams *hp = &m->hp;
    const struct q35_weights *w = m->w;
    struct q35_state *rs = tern_calloc(1, sizeof *rs);
    if (!rs) return tern_errorf(TERN_ERR_NOMEM, "qwen35: out of memory");
    rs->backend = *on;
    rs->n_chunk = n_chunk;
    const size_t nq = (size_t)hp->n_head * hp->head_dim_k, nkv = (size_t)hp->n_head_kv * hp->head_dim_k;
    const size_t C = tern_deltanet_channels(&w->dn), nv = w->dn.n_v_heads, nvd = nv * w->dn.d_v;
    const struct model_act_buf bufs[] = {
        {&rs->x, hp->n_embd, false},    {&rs->xb, hp->n_embd, false}, {&rs->qkv_raw, C, false},
        {&rs->qkv, C, false},           {&rs->z, nvd, false},         {&rs->beta, nv, false},
        {&rs->alpha, nv, false},        {&rs->o, nvd, false},         {&rs->ba, w->next ? 2 * nv : 0, false},
        {&rs->dn_scratch, nv * tern_deltanet_scratch_floats(&w->dn), true},
        {&rs->qg, 2 * nq, false},       {&rs->q, nq, false},          {&rs->gate, nq, false},
        {&rs->k, nkv, false},           {&rs->v, nkv, false},         {&rs->att, nq, false},
        {&rs->cs, hp->rope.n_rot, false}, {&rs->hb, hp->n_ff, false}, {&rs->hb2, hp->n_ff, false},
        {&rs->xm, w->moe ? hp->n_embd : 0, false},
        {&rs->h, w->has_mtp ? hp->n_embd : 0, false},
        {&rs->cat, w->has_mtp ? 2 * (size_t)hp->n_embd : 0, false},
    };
    enum tern_status st = model_acts_new(on, bufs, TERN_ARRAY_LEN(bufs), n_chunk, &rs->bytes);
    if (!st && w->moe) {
        const uint32_t n_ml = w->n_layer + w->has_mtp;
        struct moe_layer *ml = tern_calloc(n_ml, sizeof *ml);
        if (!ml) st = tern_errorf(TERN_ERR_NOMEM, "qwen35: out of memory");
        for (uint32_t il = 0; ml && il < w->n_layer; il++) ml[il] = w->layers[il].moe;
        if (ml && w->has_mtp) ml[w->n_layer] = w->mtp.moe;
        if (ml) st = on->ops->moe_ws_new(on->ctx, m, &w->moe_hp, ml, n_ml, n_chunk, &rs->moe, &rs->bytes);
        free(ml);
    }
    if (st) {
        q35_state_free(rs);
        return st;
    }
    *out = rs;
    return TERN_OK;
}

static size_t q35_state_bytes(const void *p) { return ((const struct q35_state *)p)->bytes; }

/* ---- forward ----------------------------------------------------------------------- */

/* The text positions' RoPE (see the top of the file). */
static struct model_rope q35_rope(const struct model_hparams *hp, const struct q35_weights *w) {
    return (struct model_rope){.p = &hp->rope, .neox = true, .pos0_pairs = w->any_pos0 ? w->rope_pos0 : NULL,
                               .cs0 = w->rope_cs0};
}

/* One DeltaNet layer: projections, conv + recurrence, output. */
static void deltanet_layer(const struct model_step *f, const struct q35_weights *w, const struct q35_layer *L,
                           struct q35_state *rs, uint32_t il) {
    const struct model_ops *o = f->ops;
    if (w->next) {
        /* ssm_ba: per k-head g, [beta | alpha] of its n_v / n_k v-heads */
        const struct model_mm proj[] = {{&L->wqkv, rs->qkv_raw}, {&L->wgate, rs->z}, {&L->wba, rs->ba}};
        o->matmul(f, rs->xb, proj, TERN_ARRAY_LEN(proj));
        o->split_heads(f, rs->ba, rs->beta, rs->alpha, w->dn.n_k_heads, w->dn.n_v_heads / w->dn.n_k_heads);
    } else {
        const struct model_mm proj[] = {
            {&L->wqkv, rs->qkv_raw}, {&L->wgate, rs->z}, {&L->wbeta, rs->beta}, {&L->walpha, rs->alpha}};
        o->matmul(f, rs->xb, proj, TERN_ARRAY_LEN(proj));
    }
    const struct tern_deltanet_params p = {.ssm_a = L->ssm_a, .dt_bias = L->dt_bias, .norm_w = L->ssm_norm};
    const struct model_deltanet d = {.dn = &w->dn, .conv_wt = L->conv_wt, .p = &p};
    o->deltanet(f, il, &d, rs->qkv_raw, rs->qkv, rs->z, rs->beta, rs->alpha, rs->o, rs->dn_scratch);
    const struct model_mm out = {&L->wout, rs->xb};
    o->matmul(f, rs->o, &out, 1);
}

/* One gated attention layer: [q | gate] per head, QK-norm, RoPE with the step's angles,
 * attention, the sigmoid gate, output. */
static void attention_layer(const struct model_step *f, const struct model_hparams *hp, const struct q35_weights *w,
                            const struct q35_layer *L, struct q35_state *rs, uint32_t il) {
    const struct model_ops *o = f->ops;
    const uint32_t hd = hp->head_dim_k, nq = hp->n_head * hd;
    const struct model_mm qkv[] = {{&L->wq, rs->qg}, {&L->wk, rs->k}, {&L->wv, rs->v}};
    o->matmul(f, rs->xb, qkv, 3);
    o->split_heads(f, rs->qg, rs->q, rs->gate, hp->n_head, hd);
    o->rmsnorm_heads(f, rs->q, L->q_norm, hp->n_head, hd, hp->rms_eps);
    o->rmsnorm_heads(f, rs->k, L->k_norm, hp->n_head_kv, hd, hp->rms_eps);
    const struct model_rope rope = q35_rope(hp, w);
    o->rope(f, &rope, rs->q, hp->n_head, rs->k, hp->n_head_kv, hd, rs->cs);
    o->attention(f, il, rs->q, rs->k, rs->v, rs->att, hp->n_head, 1.0f / sqrtf((float)hd));
    o->sigmoid_mul(f, rs->att, rs->gate, nq);
    const struct model_mm wo = {&L->wo, rs->xb};
    o->matmul(f, rs->att, &wo, 1);
}

/* The feed-forward block of layer L on x, into xb. */
static void ffn_block(const struct model_step *f, const struct model_hparams *hp, const struct q35_weights *w,
                      const struct q35_layer *L, struct q35_state *rs) {
    const struct model_ops *o = f->ops;
    const uint32_t E = hp->n_embd;
    if (w->moe) {
        o->rmsnorm(f, rs->xm, rs->x, L->post_norm, E, hp->rms_eps);
        o->moe(f, &w->moe_hp, &L->moe, rs->moe, rs->xm, rs->xb);
    } else {
        o->rmsnorm(f, rs->xb, rs->x, L->post_norm, E, hp->rms_eps);
        const struct model_mm gu[] = {{&L->w_gate, rs->hb}, {&L->w_up, rs->hb2}};
        o->matmul(f, rs->xb, gu, 2);
        o->swiglu(f, rs->hb, rs->hb2, hp->n_ff);
        const struct model_mm down = {&L->w_down, rs->xb};
        o->matmul(f, rs->hb, &down, 1);
    }
}

static void q35_forward(const struct model_step *f, void *p) {
    const struct model_ops *o = f->ops;
    const struct model_hparams *hp = &f->m->hp;
    const struct q35_weights *w = f->m->w;
    struct q35_state *rs = p;
    const uint32_t E = hp->n_embd;
    const struct model_rope rope = q35_rope(hp, w);

    o->embed(f, &w->tok_embd, rs->x);
    o->rope_angles(f, &rope, rs->cs);
    for (uint32_t il = 0; il < w->n_layer; il++) {
        const struct q35_layer *L = &w->layers[il];
        o->rmsnorm(f, rs->xb, rs->x, L->attn_norm, E, hp->rms_eps);
        if (L->recurrent) deltanet_layer(f, w, L, rs, il);
        else attention_layer(f, hp, w, L, rs, il);
        o->add(f, rs->x, rs->xb, E);
        ffn_block(f, hp, w, L, rs);
        o->add(f, rs->x, rs->xb, E);
    }
    /* the MTP head's input, for the sequences that asked for it (tern_session.hidden_out) */
    o->hidden_out(f, w->out_norm, hp->rms_eps, rs->x);
    o->output(f, &w->output, w->out_norm, hp->rms_eps, rs->x, rs->xb);
}

/* The MTP head (docs/spec.md): one row per position p of its own session, from the main
 * model's hidden state at p (hidden_in) and the embedding of the token at p + 1 (the
 * batch's token); its own output-normed hidden state goes to hidden_out (the input of
 * a chained draft). Its single attention layer is layer 0 of the head's session. */
static void q35_mtp_forward(const struct model_step *f, void *p) {
    const struct model_ops *o = f->ops;
    const struct model_hparams *hp = &f->m->hp;
    const struct q35_weights *w = f->m->w;
    struct q35_state *rs = p;
    const uint32_t E = hp->n_embd;
    const struct q35_layer *L = &w->mtp;
    const struct model_rope rope = q35_rope(hp, w);

    /* cat = [enorm(embd(t)) | hnorm(h)] per row */
    o->embed(f, &w->mtp_embd, rs->x);
    o->hidden_in(f, rs->h);
    o->rope_angles(f, &rope, rs->cs);
    o->rmsnorm(f, rs->xb, rs->x, w->enorm, E, hp->rms_eps);
    o->rmsnorm(f, rs->x, rs->h, w->hnorm, E, hp->rms_eps);
    o->concat_rows(f, rs->cat, rs->xb, rs->x, E);
    const struct model_mm eh = {&w->eh_proj, rs->x};
    o->matmul(f, rs->cat, &eh, 1);

    o->rmsnorm(f, rs->xb, rs->x, L->attn_norm, E, hp->rms_eps);
    attention_layer(f, hp, w, L, rs, 0);
    o->add(f, rs->x, rs->xb, E);
    ffn_block(f, hp, w, L, rs);
    o->add(f, rs->x, rs->xb, E);
    o->hidden_out(f, w->head_norm, hp->rms_eps, rs->x);
    o->output(f, &w->mtp_head, w->head_norm, hp->rms_eps, rs->x, rs->xb);
}

#define Q35_ARCH(NAME)                                                                                                 \
    {                                                                                                                  \
        .name = NAME, .load = q35_load, .unload = q35_unload, .state_new = q35_state_new,                              \
        .state_free = q35_state_free, .state_bytes = q35_state_bytes, .forward = q35_forward,                          \
    }

const struct tern_arch tern_arch_qwen35 = Q35_ARCH("qwen35");
const struct tern_arch tern_arch_qwen35_mtp = {
    .name = "qwen35-mtp", .load = NULL, .unload = NULL, .state_new = q35_state_new,
    .state_free = q35_state_free, .state_bytes = q35_state_bytes, .forward = q35_mtp_forward,
};
const struct tern_arch tern_arch_qwen35moe = Q35_ARCH("qwen35moe");
const struct tern_arch tern_arch_qwen3next = Q35_ARCH("qwen3next");
