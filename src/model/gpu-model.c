/* Forward passes on the Vulkan backend (model/gpu.h): llama/qwen2/qwen3/qwen3moe
 * (llama_forward's operations, qwen2's q/k/v biases) and the Qwen3.5 hybrids qwen35 and
 * qwen35moe (q35_forward's: Gated DeltaNet layers with their conv windows and states on
 * the device, gated attention), on device buffers, recorded into one command buffer per
 * chunk (one submit, one wait, the logits read back). Weights are uploaded once, in their
 * own types (dequantized in the shaders); the KV cache and the recurrent state live on
 * the device.
 *
 * The MoE feed-forward (moe.h's math) stays on the device too: the router's logits, the
 * routing (softmax, top-k with ties to the lowest id, renormalised weights) per token, the
 * (token, rank) slots grouped by expert (a counting sort on the device), the experts'
 * matmuls over the slots in that order, each slot reading its own expert's rows, SwiGLU, the
 * weighted sum in rank order and qwen35moe's sigmoid-gated shared expert. No host round
 * trip: the routing decides which expert rows a slot reads and the order of the workgroups
 * (neighbours read the same expert's rows), not what is dispatched nor any slot's bits.
 *
 * What runs on the host: the embedding rows (dequantized, uploaded with the chunk) and
 * the RoPE angles (tern_rope_angles, the CPU's exact values, with Qwen3.5's position-0
 * pairs). */
#include "model/gpu.h"

#include "backend/vulkan.h"
#include "model/arch-llama.h"
#include "model/arch-qwen35.h"
#include "util/mem.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gpu_layer {
    struct tern_vk_buf *attn_norm, *ffn_norm, *q_norm, *k_norm; /* ffn_norm: qwen35's post_attention_norm */
    struct tern_vk_buf *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    /* Gated DeltaNet (qwen35) */
    struct tern_vk_buf *wqkv, *wz, *wbeta, *walpha, *wout, *conv_wt, *params;
    struct tern_vk_buf *bq, *bk, *bv; /* qwen2's biases; NULL when absent */
    /* MoE (qwen3moe, qwen35moe) */
    const struct moe_layer *moe;    /* NULL: a dense feed-forward */
    struct tern_vk_buf *router;     /* [n_embd, n_expert] F32 */
    struct tern_vk_buf *eg, *eu, *ed; /* the stacked experts, in their own types */
    struct tern_vk_buf *sh_inp, *sh_g, *sh_u, *sh_d; /* the shared expert (qwen35moe) */
};

/* One model on one device: the weights and one chunk's activations, shared by every
 * state (mu serialises the evaluations and copies that use them). */
struct tern_gpu {
    struct tern_vk *vk;
    const struct tern_model *m;
    const struct llama_weights *w;  /* llama, qwen3 */
    const struct q35_weights *qw;   /* qwen35 */
    uint32_t n_chunk;
    pthread_mutex_t mu;
    size_t bytes;        /* device bytes of the weights and the scratch */
    size_t state_bytes;  /* device bytes of the live states (under mu) */
    size_t ckpt_bytes;   /* device bytes of the checkpoints kept on the device (under mu) */
    struct gpu_layer *L;
    struct tern_vk_buf *out_norm, *output;
    /* one chunk's activations */
    struct tern_vk_buf *x, *xb, *q, *k, *v, *att, *hb, *hb2, *cs, *logits;
    struct tern_vk_buf *qg, *gate, *qkv_raw, *qkv, *z, *beta, *alpha, *o; /* qwen35 */
    const struct moe_hparams *moe_hp; /* NULL: no MoE layers */
    /* MoE scratch: router logits (n_chunk, n_expert), the slots' expert ids and weights
     * (n_chunk, n_used), their gate/up (slots, n_ff_exp) and down outputs (slots, n_embd);
     * the shared expert's gate/up (n_chunk, n_ff_shexp), gate logit (n_chunk), output */
    struct tern_vk_buf *m_probs, *m_ids, *m_order, *m_wts, *m_g, *m_u, *m_d, *s_g, *s_u, *s_w, *s_d;
    float *host_x, *host_cs; /* (n_chunk, n_embd), (n_chunk, n_rot) staging */
    float *zeros;            /* (zeros_n) for resetting the recurrent state */
    size_t zeros_n;
};

/* One conversation's device state (NULL entries for the layers of the other kind). */
struct tern_gpu_state {
    struct tern_gpu *g;
    uint32_t n_ctx;
    bool f16_kv;
    size_t bytes;
    struct tern_vk_buf **kc, **vc; /* (n_layer) [n_kv_head][n_ctx][head_dim] */
    struct tern_vk_buf **win, **S; /* (n_layer) [n_conv - 1][C], [n_v][d_k][d_v]: zero at position 0 */
};

/* The standalone model of the first API: one state, one position. */
struct tern_gpu_model {
    struct tern_gpu *g;
    struct tern_gpu_state *st;
    uint32_t n_past;
};

/* A buffer of the tern_gpu's own, counted in g->bytes. */
static enum tern_status newbuf(struct tern_gpu *g, size_t bytes, struct tern_vk_buf **out) {
    enum tern_status st = tern_vk_buf_new(g->vk, bytes, out);
    if (!st) g->bytes += bytes;
    return st;
}

static enum tern_status upload(struct tern_gpu *g, const void *src, size_t bytes, struct tern_vk_buf **out) {
    enum tern_status st = newbuf(g, bytes, out);
    if (!st) st = tern_vk_upload(*out, 0, src, bytes);
    return st;
}

static enum tern_status upload_mat(struct tern_gpu *g, const struct mat *w, struct tern_vk_buf **out) {
    if (!tern_vk_matmul_supported(w->type))
        return tern_errorf(TERN_ERR_UNSUPPORTED, "gpu: tensor '%s' is %s, which the Vulkan matmul does not handle yet",
                           w->name, tern_dtype_name((uint32_t)w->type));
    return upload(g, w->data, (size_t)w->n * w->row_bytes, out);
}

static enum tern_status scratch(struct tern_gpu *g, size_t floats, struct tern_vk_buf **out) {
    return newbuf(g, (floats ? floats : 1) * sizeof(float), out);
}

void tern_gpu_free(struct tern_gpu *g) {
    if (!g) return;
    if (g->L)
        for (uint32_t il = 0; il < g->m->n_layer; il++) {
            struct gpu_layer *L = &g->L[il];
            struct tern_vk_buf *bufs[] = {L->attn_norm, L->ffn_norm, L->q_norm, L->k_norm, L->wq,     L->wk,
                                          L->wv,        L->wo,       L->wg,     L->wu,     L->wd,     L->wqkv,
                                          L->wz,        L->wbeta,    L->walpha, L->wout,   L->conv_wt, L->params,
                                          L->bq,        L->bk,       L->bv,     L->router, L->eg,     L->eu,
                                          L->ed,        L->sh_inp,   L->sh_g,   L->sh_u,   L->sh_d};
            for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) tern_vk_buf_free(bufs[i]);
        }
    free(g->L);
    struct tern_vk_buf *bufs[] = {g->out_norm, g->output, g->x,    g->xb,      g->q,   g->k,    g->v,    g->att,
                                  g->hb,       g->hb2,    g->cs,   g->logits,  g->qg,  g->gate, g->qkv_raw,
                                  g->qkv,      g->z,      g->beta, g->alpha,   g->o,   g->m_probs, g->m_ids, g->m_order,
                                  g->m_wts,    g->m_g,    g->m_u,  g->m_d,     g->s_g, g->s_u,  g->s_w,
                                  g->s_d};
    for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) tern_vk_buf_free(bufs[i]);
    free(g->host_x);
    free(g->host_cs);
    free(g->zeros);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* The stacked experts of one matrix: n_expert slices stride bytes apart. */
static enum tern_status upload_experts(struct tern_gpu *g, const struct mat *w, size_t stride, uint32_t n_expert,
                                       struct tern_vk_buf **out) {
    if (!tern_vk_matmul_supported(w->type))
        return tern_errorf(TERN_ERR_UNSUPPORTED, "gpu: tensor '%s' is %s, which the Vulkan matmul does not handle yet",
                           w->name, tern_dtype_name((uint32_t)w->type));
    return upload(g, w->data, (size_t)n_expert * stride, out);
}

/* A layer's MoE block: router, experts, shared expert. */
static enum tern_status upload_moe(struct tern_gpu *g, struct gpu_layer *L, const struct moe_layer *ml) {
    const struct moe_hparams *hp = g->moe_hp;
    enum tern_status st;
    L->moe = ml;
    if ((st = upload_mat(g, &ml->router, &L->router)) ||
        (st = upload_experts(g, &ml->gate, ml->gate_stride, hp->n_expert, &L->eg)) ||
        (st = upload_experts(g, &ml->up, ml->up_stride, hp->n_expert, &L->eu)) ||
        (st = upload_experts(g, &ml->down, ml->down_stride, hp->n_expert, &L->ed)))
        return st;
    if (!hp->n_ff_shexp) return TERN_OK;
    if ((st = upload_mat(g, &ml->sh_gate_inp, &L->sh_inp)) || (st = upload_mat(g, &ml->sh_gate, &L->sh_g)) ||
        (st = upload_mat(g, &ml->sh_up, &L->sh_u)) || (st = upload_mat(g, &ml->sh_down, &L->sh_d)))
        return st;
    return TERN_OK;
}

/* The MoE scratch for chunks of n_chunk tokens. */
static enum tern_status moe_scratch(struct tern_gpu *g) {
    const struct moe_hparams *hp = g->moe_hp;
    const size_t n = g->n_chunk, K = hp->n_used, slots = n * K, E = g->m->hp.n_embd, S = hp->n_ff_shexp;
    enum tern_status st = scratch(g, n * hp->n_expert, &g->m_probs);
    if (!st) st = scratch(g, slots, &g->m_ids);
    if (!st) st = scratch(g, slots, &g->m_order);
    if (!st) st = scratch(g, slots, &g->m_wts);
    if (!st) st = scratch(g, slots * hp->n_ff_exp, &g->m_g);
    if (!st) st = scratch(g, slots * hp->n_ff_exp, &g->m_u);
    if (!st) st = scratch(g, slots * E, &g->m_d);
    if (!st && S) st = scratch(g, n * S, &g->s_g);
    if (!st && S) st = scratch(g, n * S, &g->s_u);
    if (!st && S) st = scratch(g, n, &g->s_w);
    if (!st && S) st = scratch(g, n * E, &g->s_d);
    return st;
}

/* The attention-only family's weights. */
static enum tern_status upload_llama(struct tern_gpu *g) {
    const struct tern_model *m = g->m;
    const struct model_hparams *hp = &m->hp;
    const size_t E = hp->n_embd, hd = hp->head_dim_k;
    enum tern_status st = TERN_OK;
    for (uint32_t il = 0; il < m->n_layer && !st; il++) {
        const struct llama_layer *l = &g->w->layers[il];
        struct gpu_layer *L = &g->L[il];
        const size_t nq = (size_t)hp->n_head * hd, nkv = (size_t)hp->n_head_kv * hd;
        st = upload(g, l->attn_norm, E * sizeof(float), &L->attn_norm);
        if (!st && l->bq) st = upload(g, l->bq, nq * sizeof(float), &L->bq);
        if (!st && l->bk) st = upload(g, l->bk, nkv * sizeof(float), &L->bk);
        if (!st && l->bv) st = upload(g, l->bv, nkv * sizeof(float), &L->bv);
        if (!st) st = upload(g, l->ffn_norm, E * sizeof(float), &L->ffn_norm);
        if (!st && l->q_norm) st = upload(g, l->q_norm, hd * sizeof(float), &L->q_norm);
        if (!st && l->k_norm) st = upload(g, l->k_norm, hd * sizeof(float), &L->k_norm);
        if (!st) st = upload_mat(g, &l->wq, &L->wq);
        if (!st) st = upload_mat(g, &l->wk, &L->wk);
        if (!st) st = upload_mat(g, &l->wv, &L->wv);
        if (!st) st = upload_mat(g, &l->wo, &L->wo);
        if (!st && g->w->var.moe) st = upload_moe(g, L, &l->moe);
        if (!st && !g->w->var.moe) st = upload_mat(g, &l->w_gate, &L->wg);
        if (!st && !g->w->var.moe) st = upload_mat(g, &l->w_up, &L->wu);
        if (!st && !g->w->var.moe) st = upload_mat(g, &l->w_down, &L->wd);
    }
    if (!st) st = upload(g, g->w->out_norm, E * sizeof(float), &g->out_norm);
    if (!st) st = upload_mat(g, &g->w->output, &g->output);
    return st;
}

/* Qwen3.5's weights and recurrent state. */
static enum tern_status upload_qwen35(struct tern_gpu *g) {
    const struct tern_model *m = g->m;
    const struct model_hparams *hp = &m->hp;
    const struct q35_weights *w = g->qw;
    const struct tern_deltanet_shape *dn = &w->dn;
    const size_t E = hp->n_embd, hd = hp->head_dim_k;
    const size_t C = tern_deltanet_channels(dn), nv = dn->n_v_heads;
    if (dn->d_k > 256 || dn->d_v > 256)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "gpu: DeltaNet heads of %u/%u (the Vulkan recurrence takes at most 256)",
                           dn->d_k, dn->d_v);
    enum tern_status st = TERN_OK;
    float *prm = tern_malloc((2 * nv + dn->d_v) * sizeof(float));
    if (!prm) return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    for (uint32_t il = 0; il < w->n_layer && !st; il++) {
        const struct q35_layer *l = &w->layers[il];
        struct gpu_layer *L = &g->L[il];
        st = upload(g, l->attn_norm, E * sizeof(float), &L->attn_norm);
        if (!st) st = upload(g, l->post_norm, E * sizeof(float), &L->ffn_norm);
        if (!st && w->moe) st = upload_moe(g, L, &l->moe);
        if (!st && !w->moe) st = upload_mat(g, &l->w_gate, &L->wg);
        if (!st && !w->moe) st = upload_mat(g, &l->w_up, &L->wu);
        if (!st && !w->moe) st = upload_mat(g, &l->w_down, &L->wd);
        if (st) break;
        if (l->recurrent) {
            memcpy(prm, l->ssm_a, nv * sizeof(float));
            memcpy(prm + nv, l->dt_bias, nv * sizeof(float));
            memcpy(prm + 2 * nv, l->ssm_norm, dn->d_v * sizeof(float));
            st = upload_mat(g, &l->wqkv, &L->wqkv);
            if (!st) st = upload_mat(g, &l->wgate, &L->wz);
            if (!st) st = upload_mat(g, &l->wbeta, &L->wbeta);
            if (!st) st = upload_mat(g, &l->walpha, &L->walpha);
            if (!st) st = upload_mat(g, &l->wout, &L->wout);
            if (!st) st = upload(g, l->conv_wt, dn->n_conv * C * sizeof(float), &L->conv_wt);
            if (!st) st = upload(g, prm, (2 * nv + dn->d_v) * sizeof(float), &L->params);
        } else {
            st = upload_mat(g, &l->wq, &L->wq);
            if (!st) st = upload_mat(g, &l->wk, &L->wk);
            if (!st) st = upload_mat(g, &l->wv, &L->wv);
            if (!st) st = upload_mat(g, &l->wo, &L->wo);
            if (!st) st = upload(g, l->q_norm, hd * sizeof(float), &L->q_norm);
            if (!st) st = upload(g, l->k_norm, hd * sizeof(float), &L->k_norm);
        }
    }
    free(prm);
    if (!st) st = upload(g, w->out_norm, E * sizeof(float), &g->out_norm);
    if (!st) st = upload_mat(g, &w->output, &g->output);
    const size_t n = g->n_chunk, nq = (size_t)hp->n_head * hd, nvd = nv * dn->d_v;
    if (!st) st = scratch(g, n * 2 * nq, &g->qg);
    if (!st) st = scratch(g, n * nq, &g->gate);
    if (!st) st = scratch(g, n * C, &g->qkv_raw);
    if (!st) st = scratch(g, n * C, &g->qkv);
    if (!st) st = scratch(g, n * nvd, &g->z);
    if (!st) st = scratch(g, n * nv, &g->beta);
    if (!st) st = scratch(g, n * nv, &g->alpha);
    if (!st) st = scratch(g, n * nvd, &g->o);
    g->zeros_n = TERN_MAX(tern_deltanet_state_floats(dn), (dn->n_conv - 1) * C);
    if (!st && !(g->zeros = tern_calloc(g->zeros_n, sizeof(float)))) st = tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    return st;
}

/* The device-local bytes of g's device (0: unknown, nothing is checked). */
static uint64_t device_bytes(const struct tern_gpu *g) { return tern_vk_info(g->vk)->device_local_bytes; }

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

enum tern_status tern_gpu_new(struct tern_vk *vk, const struct tern_model *m, uint32_t n_chunk, struct tern_gpu **out) {
    *out = NULL;
    const char *a = m->arch->name;
    const bool q35 = !strcmp(a, "qwen35") || !strcmp(a, "qwen35moe");
    if (strcmp(a, "llama") && strcmp(a, "qwen2") && strcmp(a, "qwen3") && strcmp(a, "qwen3moe") && !q35)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "gpu: the %s architecture does not run on the Vulkan backend yet "
                                                 "(llama, qwen2, qwen3, qwen3moe, qwen35 and qwen35moe do)", a);
    const struct model_hparams *hp = &m->hp;
    if (hp->head_dim_k > 256 || hp->head_dim_k % 2 || hp->head_dim_v != hp->head_dim_k)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "gpu: heads of %u/%u (the Vulkan attention takes equal K and V heads "
                                                 "of an even size, at most 256)", hp->head_dim_k, hp->head_dim_v);
    if (n_chunk == 0 || n_chunk > 65535)
        return tern_errorf(TERN_ERR_INVALID, "gpu: chunk %u must be positive (at most 65535)", n_chunk);
    /* Before anything is allocated: the weights alone against the device's memory. */
    const uint64_t have = tern_vk_info(vk)->device_local_bytes;
    if (have && m->info.weight_bytes > have)
        return tern_errorf(TERN_ERR_NOMEM, "gpu: %s: the weights need %.1f MiB, but device '%s' has %.1f MiB of "
                                           "device-local memory", m->name, mib(m->info.weight_bytes),
                           tern_vk_info(vk)->name, mib(have));
    struct tern_gpu *g = tern_calloc(1, sizeof *g);
    if (!g) return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    pthread_mutex_init(&g->mu, NULL);
    g->vk = vk;
    g->m = m;
    if (q35) g->qw = m->w;
    else g->w = m->w;
    if (q35 ? g->qw->moe : g->w->var.moe) g->moe_hp = q35 ? &g->qw->moe_hp : &g->w->moe;
    if (g->moe_hp && (uint64_t)n_chunk * g->moe_hp->n_used > 65535) {
        const uint32_t k = g->moe_hp->n_used;
        tern_gpu_free(g);
        return tern_errorf(TERN_ERR_UNSUPPORTED, "gpu: chunks of %u tokens with %u experts each exceed the Vulkan "
                                                 "matmul's 65535 slots (chunks of at most %u)", n_chunk, k, 65535 / k);
    }
    g->n_chunk = n_chunk;
    const size_t E = hp->n_embd, hd = hp->head_dim_k, nq = (size_t)hp->n_head * hd, nkv = (size_t)hp->n_head_kv * hd;
    const size_t F = hp->n_ff;
    enum tern_status st = TERN_OK;
    g->L = tern_calloc(m->n_layer, sizeof *g->L);
    g->host_x = tern_malloc((size_t)n_chunk * E * sizeof(float));
    g->host_cs = tern_malloc((size_t)n_chunk * hp->rope.n_rot * sizeof(float) + sizeof(float));
    if (!g->L || !g->host_x || !g->host_cs) st = tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    if (!st) st = q35 ? upload_qwen35(g) : upload_llama(g);
    if (!st && g->moe_hp) st = moe_scratch(g);
    const size_t C = n_chunk;
    if (!st) st = scratch(g, C * E, &g->x);
    if (!st) st = scratch(g, C * E, &g->xb);
    if (!st) st = scratch(g, C * nq, &g->q);
    if (!st) st = scratch(g, C * nkv, &g->k);
    if (!st) st = scratch(g, C * nkv, &g->v);
    if (!st) st = scratch(g, C * nq, &g->att);
    if (!st) st = scratch(g, C * F, &g->hb);
    if (!st) st = scratch(g, C * F, &g->hb2);
    if (!st) st = scratch(g, C * hp->rope.n_rot, &g->cs);
    if (!st) st = scratch(g, C * hp->n_vocab, &g->logits);
    if (st) {
        tern_error_prefix(st, "gpu: %s", m->name);
        tern_gpu_free(g);
        return st;
    }
    *out = g;
    return TERN_OK;
}

uint32_t tern_gpu_n_chunk(const struct tern_gpu *g) { return g->n_chunk; }
size_t tern_gpu_bytes(const struct tern_gpu *g) { return g->bytes; }

size_t tern_gpu_state_need(const struct tern_gpu *g, uint32_t n_ctx, bool f16_kv) {
    const struct tern_model *m = g->m;
    size_t b = 0;
    for (uint32_t il = 0; il < m->n_layer; il++) {
        const struct model_layer *L = &m->layers[il];
        if (L->kind == LAYER_ATTN) b += 2 * (size_t)L->n_kv_head * n_ctx * L->head_dim_k * (f16_kv ? 2 : 4);
        else b += L->rec_bytes;
    }
    return b;
}

void tern_gpu_state_free(struct tern_gpu_state *st) {
    if (!st) return;
    struct tern_gpu *g = st->g;
    pthread_mutex_lock(&g->mu);
    for (uint32_t il = 0; il < g->m->n_layer; il++) {
        if (st->kc) tern_vk_buf_free(st->kc[il]);
        if (st->vc) tern_vk_buf_free(st->vc[il]);
        if (st->win) tern_vk_buf_free(st->win[il]);
        if (st->S) tern_vk_buf_free(st->S[il]);
    }
    g->state_bytes -= st->bytes;
    pthread_mutex_unlock(&g->mu);
    free(st->kc);
    free(st->vc);
    free(st->win);
    free(st->S);
    free(st);
}

size_t tern_gpu_state_bytes(const struct tern_gpu_state *st) { return st->bytes; }

static enum tern_status rec_upload_locked(struct tern_gpu *g, struct tern_gpu_state *st, const uint8_t *rec) {
    const struct tern_model *m = g->m;
    for (uint32_t il = 0; il < m->n_layer; il++) {
        const struct model_layer *L = &m->layers[il];
        if (L->kind != LAYER_RECURRENT) continue;
        const void *conv = rec ? rec + L->rec_offset + L->bufs[0].offset : (const void *)g->zeros;
        const void *ssm = rec ? rec + L->rec_offset + L->bufs[1].offset : (const void *)g->zeros;
        enum tern_status s = tern_vk_upload(st->win[il], 0, conv, L->bufs[0].bytes);
        if (!s) s = tern_vk_upload(st->S[il], 0, ssm, L->bufs[1].bytes);
        if (s) return s;
    }
    return TERN_OK;
}

enum tern_status tern_gpu_state_new(struct tern_gpu *g, uint32_t n_ctx, bool f16_kv, struct tern_gpu_state **out) {
    *out = NULL;
    const struct tern_model *m = g->m;
    if (n_ctx == 0) return tern_errorf(TERN_ERR_INVALID, "gpu: a context of 0 positions");
    const size_t need = tern_gpu_state_need(g, n_ctx, f16_kv);
    const uint64_t have = device_bytes(g);
    pthread_mutex_lock(&g->mu);
    const size_t used = g->bytes + g->state_bytes + g->ckpt_bytes, ckb = g->ckpt_bytes;
    pthread_mutex_unlock(&g->mu);
    if (have && used + (uint64_t)need > have)
        return tern_errorf(TERN_ERR_NOMEM,
                           "gpu: a session of %u positions needs %.1f MiB of device memory (KV cache %s and recurrent "
                           "state), but device '%s' has %.1f MiB left of %.1f MiB (weights and scratch %.1f MiB, other "
                           "sessions %.1f MiB, checkpoints %.1f MiB): a smaller context fits",
                           n_ctx, mib(need), f16_kv ? "F16" : "F32", tern_vk_info(g->vk)->name,
                           mib(have > used ? have - used : 0), mib(have), mib(g->bytes), mib(used - g->bytes - ckb),
                           mib(ckb));
    struct tern_gpu_state *st = tern_calloc(1, sizeof *st);
    if (!st) return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    st->g = g;
    st->n_ctx = n_ctx;
    st->f16_kv = f16_kv;
    st->kc = tern_calloc(m->n_layer, sizeof *st->kc);
    st->vc = tern_calloc(m->n_layer, sizeof *st->vc);
    st->win = tern_calloc(m->n_layer, sizeof *st->win);
    st->S = tern_calloc(m->n_layer, sizeof *st->S);
    enum tern_status s = st->kc && st->vc && st->win && st->S ? TERN_OK : tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    pthread_mutex_lock(&g->mu);
    for (uint32_t il = 0; il < m->n_layer && !s; il++) {
        const struct model_layer *L = &m->layers[il];
        if (L->kind == LAYER_ATTN) {
            const size_t b = (size_t)L->n_kv_head * n_ctx * L->head_dim_k * (f16_kv ? 2 : 4);
            s = tern_vk_buf_new(g->vk, b, &st->kc[il]);
            if (!s) s = tern_vk_buf_new(g->vk, b, &st->vc[il]);
            if (!s) st->bytes += 2 * b;
        } else {
            /* the CPU's "conv" and "ssm" buffers, byte for byte */
            const struct tern_deltanet_shape *dn = &g->qw->dn;
            if (L->n_bufs != 2 || L->bufs[0].bytes != (dn->n_conv - 1) * tern_deltanet_channels(dn) * sizeof(float) ||
                L->bufs[1].bytes != tern_deltanet_state_floats(dn) * sizeof(float) ||
                TERN_MAX(L->bufs[0].bytes, L->bufs[1].bytes) > g->zeros_n * sizeof(float)) {
                s = tern_errorf(TERN_ERR_INTERNAL, "gpu: layer %u's recurrent buffers do not match the device's", il);
                break;
            }
            s = tern_vk_buf_new(g->vk, L->bufs[0].bytes, &st->win[il]);
            if (!s) s = tern_vk_buf_new(g->vk, L->bufs[1].bytes, &st->S[il]);
            if (!s) st->bytes += L->rec_bytes;
        }
    }
    if (!s) s = rec_upload_locked(g, st, NULL);
    g->state_bytes += st->bytes;
    pthread_mutex_unlock(&g->mu);
    if (s) {
        tern_error_prefix(s, "gpu: a session's state of %u positions (%.1f MiB)", n_ctx, mib(need));
        tern_gpu_state_free(st);
        return s;
    }
    *out = st;
    return TERN_OK;
}

enum tern_status tern_gpu_rec_upload(struct tern_gpu *g, struct tern_gpu_state *st, const void *rec) {
    pthread_mutex_lock(&g->mu);
    enum tern_status s = rec_upload_locked(g, st, rec);
    pthread_mutex_unlock(&g->mu);
    return s;
}

enum tern_status tern_gpu_rec_download(struct tern_gpu *g, struct tern_gpu_state *st, void *rec) {
    const struct tern_model *m = g->m;
    enum tern_status s = TERN_OK;
    pthread_mutex_lock(&g->mu);
    for (uint32_t il = 0; il < m->n_layer && !s; il++) {
        const struct model_layer *L = &m->layers[il];
        if (L->kind != LAYER_RECURRENT) continue;
        uint8_t *blk = (uint8_t *)rec + L->rec_offset;
        s = tern_vk_download(st->win[il], 0, blk + L->bufs[0].offset, L->bufs[0].bytes);
        if (!s) s = tern_vk_download(st->S[il], 0, blk + L->bufs[1].offset, L->bufs[1].bytes);
    }
    pthread_mutex_unlock(&g->mu);
    return s;
}

static enum tern_status kv_copy(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t il, bool v, uint32_t p0,
                                uint32_t p1, uint8_t *buf, size_t run_bytes, bool up) {
    const struct model_layer *L = &g->m->layers[il];
    TERN_ASSERT(L->kind == LAYER_ATTN && p0 <= p1 && p1 <= st->n_ctx);
    const size_t row = (size_t)L->head_dim_k * (st->f16_kv ? 2 : 4);
    struct tern_vk_buf *b = v ? st->vc[il] : st->kc[il];
    enum tern_status s = TERN_OK;
    if (p0 == p1) return TERN_OK;
    pthread_mutex_lock(&g->mu);
    for (uint32_t h = 0; h < L->n_kv_head && !s; h++) {
        const size_t off = ((size_t)h * st->n_ctx + p0) * row, bytes = (size_t)(p1 - p0) * row;
        s = up ? tern_vk_upload(b, off, buf + h * run_bytes, bytes) : tern_vk_download(b, off, buf + h * run_bytes, bytes);
    }
    pthread_mutex_unlock(&g->mu);
    return s;
}

enum tern_status tern_gpu_kv_download(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t il, bool v, uint32_t p0,
                                      uint32_t p1, void *buf, size_t run_bytes) {
    return kv_copy(g, st, il, v, p0, p1, buf, run_bytes, false);
}

enum tern_status tern_gpu_kv_upload(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t il, bool v, uint32_t p0,
                                    uint32_t p1, const void *buf, size_t run_bytes) {
    return kv_copy(g, st, il, v, p0, p1, (uint8_t *)(uintptr_t)buf, run_bytes, true);
}

#define DO(call)                                                                                                       \
    do {                                                                                                               \
        if (!st) st = (call);                                                                                          \
    } while (0)

/* The attention of one layer after the projections and norms: RoPE, the chunk's K/V into
 * the cache, attention over it into att. */
static enum tern_status record_attention(struct tern_gpu *g, struct tern_gpu_state *S, uint32_t il, uint32_t n,
                                         uint32_t pos0, bool neox) {
    const struct model_hparams *hp = &g->m->hp;
    struct tern_vk *vk = g->vk;
    const uint32_t hd = hp->head_dim_k, nq = hp->n_head * hd, nkv = hp->n_head_kv * hd, nr = hp->rope.n_rot;
    enum tern_status st = TERN_OK;
    DO(tern_vk_rope(vk, g->q, nq, hp->n_head, hd, nr, g->cs, n, neox));
    DO(tern_vk_rope(vk, g->k, nkv, hp->n_head_kv, hd, nr, g->cs, n, neox));
    DO(tern_vk_kv_store(vk, g->k, nkv, S->kc[il], S->n_ctx, hp->n_head_kv, hd, pos0, n, S->f16_kv));
    DO(tern_vk_kv_store(vk, g->v, nkv, S->vc[il], S->n_ctx, hp->n_head_kv, hd, pos0, n, S->f16_kv));
    DO(tern_vk_attention(vk, g->q, nq, S->kc[il], S->vc[il], S->n_ctx, g->att, nq, n, pos0, hp->n_head, hp->n_head_kv,
                         hd, 1.0f / sqrtf((float)hd), S->f16_kv));
    return st;
}

/* The MoE block (moe_forward's steps) of the normed rows h = xb, written back into xb. */
static enum tern_status record_moe(struct tern_gpu *g, const struct gpu_layer *L, uint32_t n) {
    const struct moe_hparams *mh = g->moe_hp;
    const struct moe_layer *ml = L->moe;
    struct tern_vk *vk = g->vk;
    const uint32_t E = g->m->hp.n_embd, X = mh->n_expert, K = mh->n_used, F = mh->n_ff_exp, S = mh->n_ff_shexp;
    const uint32_t slots = n * K;
    enum tern_status st = TERN_OK;
    DO(tern_vk_matmul(vk, ml->router.type, L->router, E, X, g->xb, n, g->m_probs));
    DO(tern_vk_moe_route(vk, g->m_probs, g->m_ids, g->m_wts, n, X, K, mh->norm_topk, mh->scale));
    DO(tern_vk_moe_group(vk, g->m_ids, g->m_order, slots, X));
    DO(tern_vk_matmul_id(vk, ml->gate.type, L->eg, ml->gate_stride, X, E, F, g->m_ids, g->m_order, g->xb, K, slots,
                         g->m_g));
    DO(tern_vk_matmul_id(vk, ml->up.type, L->eu, ml->up_stride, X, E, F, g->m_ids, g->m_order, g->xb, K, slots,
                         g->m_u));
    DO(tern_vk_swiglu(vk, g->m_g, g->m_u, slots, F));
    DO(tern_vk_matmul_id(vk, ml->down.type, L->ed, ml->down_stride, X, F, E, g->m_ids, g->m_order, g->m_g, 1, slots,
                         g->m_d));
    if (S) {
        DO(tern_vk_matmul(vk, ml->sh_gate.type, L->sh_g, E, S, g->xb, n, g->s_g));
        DO(tern_vk_matmul(vk, ml->sh_up.type, L->sh_u, E, S, g->xb, n, g->s_u));
        DO(tern_vk_matmul(vk, ml->sh_gate_inp.type, L->sh_inp, E, 1, g->xb, n, g->s_w));
        DO(tern_vk_swiglu(vk, g->s_g, g->s_u, n, S));
        DO(tern_vk_matmul(vk, ml->sh_down.type, L->sh_d, S, E, g->s_g, n, g->s_d));
    }
    DO(tern_vk_moe_combine(vk, g->xb, g->m_d, g->m_wts, n, E, K, S ? g->s_d : NULL, S ? g->s_w : NULL));
    return st;
}

/* The residual add of the block's output, then the feed-forward (SwiGLU, or the MoE
 * block) and its add. */
static enum tern_status record_ffn(struct tern_gpu *g, const struct gpu_layer *L, const struct mat *wg,
                                   const struct mat *wu, const struct mat *wd, uint32_t n) {
    const struct model_hparams *hp = &g->m->hp;
    struct tern_vk *vk = g->vk;
    const uint32_t E = hp->n_embd, F = hp->n_ff;
    enum tern_status st = TERN_OK;
    DO(tern_vk_add(vk, g->x, g->xb, n, E));
    DO(tern_vk_rmsnorm(vk, g->x, L->ffn_norm, g->xb, n, E, hp->rms_eps));
    if (L->moe) {
        DO(record_moe(g, L, n));
        DO(tern_vk_add(vk, g->x, g->xb, n, E));
        return st;
    }
    DO(tern_vk_matmul(vk, wg->type, L->wg, E, F, g->xb, n, g->hb));
    DO(tern_vk_matmul(vk, wu->type, L->wu, E, F, g->xb, n, g->hb2));
    DO(tern_vk_swiglu(vk, g->hb, g->hb2, n, F));
    DO(tern_vk_matmul(vk, wd->type, L->wd, F, E, g->hb, n, g->xb));
    DO(tern_vk_add(vk, g->x, g->xb, n, E));
    return st;
}

/* The attention-only layers of llama / qwen3 (llama_forward's operations). */
static enum tern_status record_llama(struct tern_gpu *g, struct tern_gpu_state *S, uint32_t n, uint32_t pos0) {
    const struct model_hparams *hp = &g->m->hp;
    const struct llama_weights *w = g->w;
    struct tern_vk *vk = g->vk;
    const uint32_t E = hp->n_embd, hd = hp->head_dim_k, nq = hp->n_head * hd, nkv = hp->n_head_kv * hd;
    enum tern_status st = TERN_OK;
    for (uint32_t il = 0; il < g->m->n_layer && !st; il++) {
        const struct llama_layer *l = &w->layers[il];
        const struct gpu_layer *L = &g->L[il];
        DO(tern_vk_rmsnorm(vk, g->x, L->attn_norm, g->xb, n, E, hp->rms_eps));
        DO(tern_vk_matmul(vk, l->wq.type, L->wq, E, nq, g->xb, n, g->q));
        DO(tern_vk_matmul(vk, l->wk.type, L->wk, E, nkv, g->xb, n, g->k));
        DO(tern_vk_matmul(vk, l->wv.type, L->wv, E, nkv, g->xb, n, g->v));
        if (L->bq) DO(tern_vk_add_bias(vk, g->q, L->bq, n, nq));
        if (L->bk) DO(tern_vk_add_bias(vk, g->k, L->bk, n, nkv));
        if (L->bv) DO(tern_vk_add_bias(vk, g->v, L->bv, n, nkv));
        if (L->q_norm) {
            DO(tern_vk_rmsnorm(vk, g->q, L->q_norm, g->q, (size_t)n * hp->n_head, hd, hp->rms_eps));
            DO(tern_vk_rmsnorm(vk, g->k, L->k_norm, g->k, (size_t)n * hp->n_head_kv, hd, hp->rms_eps));
        }
        DO(record_attention(g, S, il, n, pos0, w->var.neox));
        DO(tern_vk_matmul(vk, l->wo.type, L->wo, nq, E, g->att, n, g->xb));
        DO(record_ffn(g, L, &l->w_gate, &l->w_up, &l->w_down, n));
    }
    return st;
}

/* Qwen3.5's layers (q35_forward's operations): DeltaNet or gated attention, then the FFN. */
static enum tern_status record_qwen35(struct tern_gpu *g, struct tern_gpu_state *S, uint32_t n, uint32_t pos0) {
    const struct model_hparams *hp = &g->m->hp;
    const struct q35_weights *w = g->qw;
    const struct tern_deltanet_shape *dn = &w->dn;
    struct tern_vk *vk = g->vk;
    const uint32_t E = hp->n_embd, hd = hp->head_dim_k, nq = hp->n_head * hd, nkv = hp->n_head_kv * hd;
    const uint32_t C = (uint32_t)tern_deltanet_channels(dn), nv = dn->n_v_heads;
    const uint32_t nvd = nv * dn->d_v;
    enum tern_status st = TERN_OK;
    for (uint32_t il = 0; il < w->n_layer && !st; il++) {
        const struct q35_layer *l = &w->layers[il];
        const struct gpu_layer *L = &g->L[il];
        DO(tern_vk_rmsnorm(vk, g->x, L->attn_norm, g->xb, n, E, hp->rms_eps));
        if (l->recurrent) {
            DO(tern_vk_matmul(vk, l->wqkv.type, L->wqkv, E, C, g->xb, n, g->qkv_raw));
            DO(tern_vk_matmul(vk, l->wgate.type, L->wz, E, nvd, g->xb, n, g->z));
            DO(tern_vk_matmul(vk, l->wbeta.type, L->wbeta, E, nv, g->xb, n, g->beta));
            DO(tern_vk_matmul(vk, l->walpha.type, L->walpha, E, nv, g->xb, n, g->alpha));
            DO(tern_vk_deltanet_conv(vk, S->win[il], L->conv_wt, g->qkv_raw, C, g->qkv, C, C, dn->n_conv, n));
            DO(tern_vk_deltanet_heads(vk, S->S[il], g->qkv, g->z, g->beta, g->alpha, g->o, L->params, dn->n_k_heads, nv,
                                      dn->d_k, dn->d_v, dn->eps, n));
            DO(tern_vk_matmul(vk, l->wout.type, L->wout, nvd, E, g->o, n, g->xb));
        } else {
            DO(tern_vk_matmul(vk, l->wq.type, L->wq, E, 2 * nq, g->xb, n, g->qg));
            DO(tern_vk_matmul(vk, l->wk.type, L->wk, E, nkv, g->xb, n, g->k));
            DO(tern_vk_matmul(vk, l->wv.type, L->wv, E, nkv, g->xb, n, g->v));
            DO(tern_vk_split_heads(vk, g->qg, g->q, g->gate, n, hp->n_head, hd));
            DO(tern_vk_rmsnorm(vk, g->q, L->q_norm, g->q, (size_t)n * hp->n_head, hd, hp->rms_eps));
            DO(tern_vk_rmsnorm(vk, g->k, L->k_norm, g->k, (size_t)n * hp->n_head_kv, hd, hp->rms_eps));
            DO(record_attention(g, S, il, n, pos0, true));
            DO(tern_vk_sigmoid_mul(vk, g->att, g->gate, n, nq));
            DO(tern_vk_matmul(vk, l->wo.type, L->wo, nq, E, g->att, n, g->xb));
        }
        DO(record_ffn(g, L, &l->w_gate, &l->w_up, &l->w_down, n));
    }
    return st;
}

/* One chunk of n tokens at positions [pos0, pos0 + n) (g->mu held). */
static enum tern_status eval_chunk(struct tern_gpu *g, struct tern_gpu_state *S, uint32_t pos0, const int32_t *toks,
                                   uint32_t n, float *logits, bool logits_all) {
    const struct model_hparams *hp = &g->m->hp;
    const struct mat *embd = g->qw ? &g->qw->tok_embd : &g->w->tok_embd;
    const struct mat *output = g->qw ? &g->qw->output : &g->w->output;
    struct tern_vk *vk = g->vk;
    const uint32_t E = hp->n_embd, nr = hp->rope.n_rot;
    for (uint32_t t = 0; t < n; t++) {
        tern_dequantize_row(embd->type, (const char *)embd->data + (size_t)toks[t] * embd->row_bytes,
                            g->host_x + (size_t)t * E, E);
        float *cs = g->host_cs + (size_t)t * nr;
        tern_rope_angles(&hp->rope, pos0 + t, cs);
        if (g->qw && g->qw->any_pos0) /* IMROPE's "e" section: position 0 (as q35_forward) */
            for (uint32_t i = 0; i < nr / 2; i++)
                if (g->qw->rope_pos0[i]) cs[2 * i] = g->qw->rope_cs0[2 * i], cs[2 * i + 1] = g->qw->rope_cs0[2 * i + 1];
    }
    enum tern_status st = tern_vk_upload(g->x, 0, g->host_x, (size_t)n * E * sizeof(float));
    if (!st && nr) st = tern_vk_upload(g->cs, 0, g->host_cs, (size_t)n * nr * sizeof(float));
    if (!st) st = tern_vk_begin(vk);
    if (st) return st;
    st = g->qw ? record_qwen35(g, S, n, pos0) : record_llama(g, S, n, pos0);
    if (logits) {
        /* every row normed and projected: a row's logits do not depend on which are read */
        DO(tern_vk_rmsnorm(vk, g->x, g->out_norm, g->xb, n, E, hp->rms_eps));
        DO(tern_vk_matmul(vk, output->type, g->output, E, hp->n_vocab, g->xb, n, g->logits));
    }
    if (!st) st = tern_vk_end(vk);
    else {
        /* close the recording (a failed operation may have ended it already) and keep the
         * failure's message, not tern_vk_end's */
        char why[512];
        snprintf(why, sizeof why, "%s", tern_last_error());
        (void)tern_vk_end(vk);
        return tern_errorf(st, "%s", why);
    }
    if (!logits) return TERN_OK;
    const size_t nv = hp->n_vocab;
    if (logits_all) return tern_vk_download(g->logits, 0, logits, (size_t)n * nv * sizeof(float));
    return tern_vk_download(g->logits, (size_t)(n - 1) * nv * sizeof(float), logits, nv * sizeof(float));
}
#undef DO

enum tern_status tern_gpu_eval(struct tern_gpu *g, struct tern_gpu_state *S, uint32_t pos0, const int32_t *toks,
                               uint32_t n, uint32_t n_chunk, float *logits, bool logits_all) {
    const uint32_t nv = g->m->hp.n_vocab;
    TERN_ASSERT(S->g == g && pos0 + (uint64_t)n <= S->n_ctx);
    if (n_chunk == 0 || n_chunk > g->n_chunk) n_chunk = g->n_chunk;
    enum tern_status st = TERN_OK;
    /* the scratch is shared by every state: one chunk at a time */
    pthread_mutex_lock(&g->mu);
    for (uint32_t i = 0, c; i < n && !st; i += c) {
        c = n - i < n_chunk ? n - i : n_chunk;
        bool last = i + c == n;
        /* Only the last token's logits: the chunk's other rows go without (eval_chunk
         * projects every row it is given), the last token alone after them. The split
         * changes no bits (chunk invariance) and saves n - 1 rows of the output matmul. */
        if (last && logits && !logits_all && c > 1) c--, last = false;
        float *lg = logits_all ? logits + (size_t)i * nv : last ? logits : NULL;
        st = eval_chunk(g, S, pos0 + i, toks + i, c, lg, logits_all);
    }
    pthread_mutex_unlock(&g->mu);
    return st;
}

/* ---- the standalone model ---------------------------------------------------------- */

void tern_gpu_model_free(struct tern_gpu_model *gm) {
    if (!gm) return;
    tern_gpu_state_free(gm->st);
    tern_gpu_free(gm->g);
    free(gm);
}

enum tern_status tern_gpu_model_new(struct tern_vk *vk, const struct tern_model *m, uint32_t n_ctx, uint32_t n_chunk,
                                    bool f16_kv, struct tern_gpu_model **out) {
    *out = NULL;
    if (n_ctx == 0) return tern_errorf(TERN_ERR_INVALID, "gpu: context %u must be positive", n_ctx);
    struct tern_gpu_model *gm = tern_calloc(1, sizeof *gm);
    if (!gm) return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    enum tern_status st = tern_gpu_new(vk, m, n_chunk, &gm->g);
    if (!st) st = tern_gpu_state_new(gm->g, n_ctx, f16_kv, &gm->st);
    if (st) {
        tern_gpu_model_free(gm);
        return st;
    }
    *out = gm;
    return TERN_OK;
}

uint32_t tern_gpu_model_n_past(const struct tern_gpu_model *gm) { return gm->n_past; }
uint32_t tern_gpu_model_n_ctx(const struct tern_gpu_model *gm) { return gm->st->n_ctx; }

enum tern_status tern_gpu_model_reset(struct tern_gpu_model *gm) {
    gm->n_past = 0;
    return tern_gpu_rec_upload(gm->g, gm->st, NULL);
}

enum tern_status tern_gpu_model_eval(struct tern_gpu_model *gm, const int32_t *toks, uint32_t n, uint32_t n_chunk,
                                     float *logits, bool logits_all) {
    const uint32_t nv = gm->g->m->hp.n_vocab;
    if (n == 0) return TERN_OK;
    if (gm->n_past + (uint64_t)n > gm->st->n_ctx)
        return tern_errorf(TERN_ERR_RANGE, "gpu: %u + %u tokens exceed the context of %u", gm->n_past, n,
                           gm->st->n_ctx);
    for (uint32_t i = 0; i < n; i++)
        if (toks[i] < 0 || (uint32_t)toks[i] >= nv)
            return tern_errorf(TERN_ERR_FORMAT, "gpu: token id %d is outside the vocabulary of %u", toks[i], nv);
    enum tern_status st = tern_gpu_eval(gm->g, gm->st, gm->n_past, toks, n, n_chunk, logits, logits_all);
    if (!st) gm->n_past += n;
    return st;
}

/* ---- copies on the device (fork, checkpoints) ---------------------------------------- */

/* Every copy below is recorded into one command buffer (one submit, one wait) under mu:
 * nothing goes through the host. */
#define COPY(src, so, dst, dof, n)                                                                                     \
    do {                                                                                                               \
        if (!s) s = tern_vk_copy(g->vk, (src), (so), (dst), (dof), (n));                                              \
    } while (0)

/* Closes a recording after copies: tern_vk_end's status, or the failure's message when a
 * copy failed (a failed copy leaves the recording open: nothing of it runs). */
static enum tern_status copies_end(struct tern_gpu *g, enum tern_status s) {
    if (!s) return tern_vk_end(g->vk);
    char why[512];
    snprintf(why, sizeof why, "%s", tern_last_error());
    (void)tern_vk_end(g->vk);
    return tern_errorf(s, "%s", why);
}

enum tern_status tern_gpu_state_copy(struct tern_gpu *g, const struct tern_gpu_state *src, struct tern_gpu_state *dst,
                                     uint32_t p, bool rec) {
    const struct tern_model *m = g->m;
    TERN_ASSERT(src->g == g && dst->g == g && src->n_ctx == dst->n_ctx && src->f16_kv == dst->f16_kv &&
                p <= src->n_ctx);
    if (!p && (!rec || !m->rec_bytes)) return TERN_OK;
    pthread_mutex_lock(&g->mu);
    enum tern_status s = tern_vk_begin(g->vk);
    if (s) {
        pthread_mutex_unlock(&g->mu);
        return s;
    }
    for (uint32_t il = 0; il < m->n_layer; il++) {
        const struct model_layer *L = &m->layers[il];
        if (L->kind == LAYER_ATTN) {
            /* each KV head's rows [0, p) are contiguous: one copy per head */
            const size_t row = (size_t)L->head_dim_k * (src->f16_kv ? 2 : 4);
            for (uint32_t h = 0; h < L->n_kv_head && p; h++) {
                const size_t off = (size_t)h * src->n_ctx * row;
                COPY(src->kc[il], off, dst->kc[il], off, (size_t)p * row);
                COPY(src->vc[il], off, dst->vc[il], off, (size_t)p * row);
            }
        } else if (L->kind == LAYER_RECURRENT && rec) {
            COPY(src->win[il], 0, dst->win[il], 0, L->bufs[0].bytes);
            COPY(src->S[il], 0, dst->S[il], 0, L->bufs[1].bytes);
        }
    }
    s = copies_end(g, s);
    pthread_mutex_unlock(&g->mu);
    return s;
}

size_t tern_gpu_ckpt_bytes(struct tern_gpu *g) {
    pthread_mutex_lock(&g->mu);
    const size_t b = g->ckpt_bytes;
    pthread_mutex_unlock(&g->mu);
    return b;
}

enum tern_status tern_gpu_rec_new(struct tern_gpu *g, struct tern_vk_buf **out) {
    *out = NULL;
    const size_t need = g->m->rec_bytes;
    const uint64_t have = device_bytes(g);
    pthread_mutex_lock(&g->mu);
    const size_t used = g->bytes + g->state_bytes + g->ckpt_bytes;
    enum tern_status s = TERN_OK;
    if (have && used + (uint64_t)need > have)
        s = tern_errorf(TERN_ERR_NOMEM, "gpu: a checkpoint of %.2f MiB does not fit the %.1f MiB left of device '%s'",
                        mib(need), mib(have > used ? have - used : 0), tern_vk_info(g->vk)->name);
    if (!s) s = tern_vk_buf_new(g->vk, need, out);
    if (!s) g->ckpt_bytes += need;
    pthread_mutex_unlock(&g->mu);
    return s;
}

void tern_gpu_rec_free(struct tern_gpu *g, struct tern_vk_buf *b) {
    if (!b) return;
    pthread_mutex_lock(&g->mu);
    tern_vk_buf_free(b);
    g->ckpt_bytes -= g->m->rec_bytes;
    pthread_mutex_unlock(&g->mu);
}

/* The recurrent parts of st to (save) or from b, laid out as the recurrent block. */
static enum tern_status rec_move(struct tern_gpu *g, struct tern_gpu_state *st, struct tern_vk_buf *b, bool save) {
    const struct tern_model *m = g->m;
    TERN_ASSERT(st->g == g && tern_vk_buf_bytes(b) >= m->rec_bytes);
    pthread_mutex_lock(&g->mu);
    enum tern_status s = tern_vk_begin(g->vk);
    if (s) {
        pthread_mutex_unlock(&g->mu);
        return s;
    }
    for (uint32_t il = 0; il < m->n_layer; il++) {
        const struct model_layer *L = &m->layers[il];
        if (L->kind != LAYER_RECURRENT) continue;
        const size_t conv = L->rec_offset + L->bufs[0].offset, ssm = L->rec_offset + L->bufs[1].offset;
        if (save) {
            COPY(st->win[il], 0, b, conv, L->bufs[0].bytes);
            COPY(st->S[il], 0, b, ssm, L->bufs[1].bytes);
        } else {
            COPY(b, conv, st->win[il], 0, L->bufs[0].bytes);
            COPY(b, ssm, st->S[il], 0, L->bufs[1].bytes);
        }
    }
    s = copies_end(g, s);
    pthread_mutex_unlock(&g->mu);
    return s;
}
#undef COPY

enum tern_status tern_gpu_rec_save(struct tern_gpu *g, const struct tern_gpu_state *st, struct tern_vk_buf *b) {
    return rec_move(g, (struct tern_gpu_state *)(uintptr_t)st, b, true);
}

enum tern_status tern_gpu_rec_load(struct tern_gpu *g, struct tern_gpu_state *st, const struct tern_vk_buf *b) {
    return rec_move(g, st, (struct tern_vk_buf *)(uintptr_t)b, false);
}

enum tern_status tern_gpu_rec_read(struct tern_gpu *g, const struct tern_vk_buf *b, void *rec) {
    pthread_mutex_lock(&g->mu);
    enum tern_status s = tern_vk_download((struct tern_vk_buf *)(uintptr_t)b, 0, rec, g->m->rec_bytes);
    pthread_mutex_unlock(&g->mu);
    return s;
}
