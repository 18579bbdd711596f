/* The Vulkan backend of the layer seam (backend/backend.h, backend/vulkan/gpu.h): the
 * architectures' own forward passes (llama/qwen2/qwen3/qwen3moe's llama_forward, the
 * Qwen3.5 hybrids' q35_forward, the MTP head's q35_mtp_forward) run on device buffers,
 * each operation recorded into one command buffer per step (one submit, one wait, the
 * wanted logits read back); a step is the rows of one or several states
 * (tern_gpu_eval_batch: the row operations once over every row, attention and the
 * DeltaNet per sequence against its state). Weights are uploaded once, in their own
 * types (dequantized in the shaders) — which ones, the forward itself says: it runs once
 * on an uploading backend whose operations upload every weight they are handed — and
 * found again by their host address; the activations of the architecture's RunState, the
 * KV cache and the recurrent state live on the device.
 *
 * The MoE feed-forward (moe.h's math) stays on the device too: the router's logits, the
 * routing (softmax, top-k with ties to the lowest id, renormalised weights) per token, the
 * (token, rank) slots grouped by expert (a counting sort on the device), the experts'
 * matmuls over the slots in that order, each slot reading its own expert's rows, SwiGLU, the
 * weighted sum in rank order and qwen35moe's sigmoid-gated shared expert. No host round
 * trip: the routing decides which expert rows a slot reads and the order of the workgroups
 * (neighbours read the same expert's rows), not what is dispatched nor any slot's bits.
 *
 * Partial offload (tern_model_set_cpu_moe): the routed experts of the first n_host layers
 * stay in host memory (never uploaded) and run on the CPU's MoE block (backend/cpu/moe.c:
 * the router, the experts' matmuls, the combine), the layer's shared expert on the device
 * before it; the step's recording is submitted there, the normed rows and the shared
 * expert's output read back, and the block's output uploaded for the rest of the step.
 * Both halves compute a token from its own rows alone, so the bits still do not depend on
 * the chunk or the batch.
 *
 * What runs on the host: the step's inputs, the embedding rows (dequantized) and the RoPE
 * angles (model_rope_row_angles, the CPU's exact values), uploaded before the step's
 * recording starts (an upload may need the command buffer, vulkan.c), and the MTP head's
 * input rows (the main model's hidden states, read back after its steps). */
#include "backend/vulkan/gpu.h"

#include "backend/vulkan/vulkan.h"
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "util/log.h"
#include "util/mem.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A weight on the device, found by the address of its host copy (the architecture's
 * struct mat data or F32 vector; a DeltaNet layer's packed parameters by its ssm_a). */
struct gpu_weight {
    uintptr_t host;
    struct tern_vk_buf *buf;
};

/* One model on one device: the weights and the architecture's RunState for one chunk,
 * shared by every state (mu serialises the evaluations and copies that use them). */
struct tern_gpu {
    struct tern_vk *vk;
    const struct tern_model *m;
    /* An MTP head's tern_gpu (tern_gpu_head): the main model's, whose weights it finds
     * too (only its own are uploaded) and whose lock it takes (one Vulkan context). */
    const struct tern_gpu *parent;
    /* The model's MTP head on the device, made at the first tern_gpu_head and kept with
     * the model (its weights uploaded once, not per request), and its model view. */
    struct tern_gpu *head;
    struct tern_model *head_m;
    uint32_t n_chunk;
    pthread_mutex_t *mu, own_mu; /* mu: own_mu, or the parent's */
    size_t bytes;        /* device bytes of the weights and the scratch */
    size_t state_bytes;  /* device bytes of the live states (under mu) */
    size_t ckpt_bytes;   /* device bytes of the checkpoints kept on the device (under mu) */
    struct gpu_weight *wt; /* (n_wt) sorted by host address */
    uint32_t n_wt, cap_wt;
    void *rs;            /* the architecture's RunState, its activations on the device */
    struct tern_vk_buf *logits; /* (n_chunk, n_vocab): the step's wanted rows, in order */
    float *host_x, *host_cs; /* (n_chunk, n_embd), (n_chunk, n_rot) staging of the inputs */
    int32_t *host_toks;      /* (n_chunk) the step's tokens */
    /* one step's sequences (under mu): their rows, their states, and which part of which
     * caller's sequence each one is (index, rows of it already consumed) */
    struct model_seq step_seq[MODEL_MAX_SEQS];
    struct tern_gpu_state *step_S[MODEL_MAX_SEQS];
    const struct tern_gpu_io *step_io[MODEL_MAX_SEQS];
    uint32_t step_src[MODEL_MAX_SEQS], step_done[MODEL_MAX_SEQS];
    float *zeros;            /* (zeros_n) for resetting the recurrent state */
    size_t zeros_n;
    const struct tern_deltanet_shape *dn; /* the DeltaNet layers' shape (NULL: none) */
    struct tern_vk_buf *hid; /* (n_chunk, n_embd) the output-normed hidden rows (models with an MTP head) */
    /* Partial offload: the model's MoE layers (a copy the upload pass makes: n_layer
     * entries, gate.data NULL for a dense layer) and their hyperparameters; the routed
     * experts of layers [0, n_host) stay in host memory and run on the CPU (host_moe).
     * auto_moe: n_host is chosen once the rest is on the device (offload_auto). */
    struct moe_layer *moe_l;
    struct moe_hparams moe_hp;
    uint32_t n_moe_l, n_host;
    bool auto_moe;
    struct gpu_moe_ws *moe_ws; /* the RunState's MoE scratch (NULL: none) */
    /* --gpu-layers (tern_model_set_gpu_layers): the matrices of layers [gpu_layers, ...)
     * stay in host memory and their matmuls run on the CPU (host_mm: scratch for the
     * largest k, n and prepared row among them) */
    uint32_t gpu_layers, n_host_mats;
    uint64_t host_mat_bytes;
    size_t hm_k, hm_n, hm_rb;
    struct host_mm *hmm;
    bool auto_layers;               /* gpu_layers chosen once the rest is on the device */
    const struct mat **host_mats;   /* (n_host_mats) the matrices kept in host memory */
    uint32_t cap_host_mats;
};

/* The host half of --gpu-layers: a session view for the CPU's matmul (the model's pool,
 * its prepared-activation buffers) and the rows that cross: the input (n_chunk, hm_k) and
 * up to four products (n_chunk, hm_n) each. */
struct host_mm {
    struct tern_session s;
    float *x, *y;
};

static void host_mm_free(struct host_mm *h) {
    if (!h) return;
    for (int i = 0; i < MODEL_MAX_ACT_KINDS; i++) tern_aligned_free(h->s.act[i]);
    tern_aligned_free(h->x);
    tern_aligned_free(h->y);
    free(h);
}

/* The layer of a "blk.N." tensor, UINT32_MAX for the others (embeddings, output). */
static uint32_t tensor_layer(const char *name) {
    unsigned v;
    int used = 0;
    if (name && sscanf(name, "blk.%u.%n", &v, &used) == 1 && used) return v;
    return UINT32_MAX;
}

/* Whether matrix w stays in host memory (--gpu-layers: its layer is past the device's). */
static bool host_matrix(const struct tern_gpu *g, const struct mat *w) {
    if (g->gpu_layers == UINT32_MAX) return false; /* (the usual case: no name to parse) */
    const uint32_t il = tensor_layer(w->name);
    return il != UINT32_MAX && il >= g->gpu_layers;
}

/* One conversation's device state (NULL entries for the layers of the other kind). */
struct tern_gpu_state {
    struct tern_gpu *g;
    uint32_t n_ctx;
    bool f16_kv;
    size_t bytes;
    /* (n_layer) the KV cache in pages of TERN_VK_KV_PAGE positions, end to end, each
     * [n_kv_head][TERN_VK_KV_PAGE][head_dim] (the CPU's pages): at least n_pages pages in
     * every attention layer (a layer may hold more after a growth that failed part way, or
     * a shrink the device had no room to re-lay), none when the state is made;
     * tern_gpu_state_reserve grows them, tern_gpu_state_shrink gives them back */
    struct tern_vk_buf **kc, **vc;
    uint32_t n_pages;
    struct tern_vk_buf **win, **S; /* (n_layer) [n_conv - 1][C], [n_v][d_k][d_v]: zero at position 0 */
    /* The trail (tern_gpu_trail_reserve), per recurrent layer: trail_cap windows and
     * states, [slot][n_conv - 1][C] and [slot][n_v][d_k][d_v] (NULL: none) */
    struct tern_vk_buf **tw, **tS;
    uint32_t trail_cap;
};

/* Device bytes held by g (and by its parent: one device), under mu. */
static size_t used_bytes(const struct tern_gpu *g) {
    size_t b = g->bytes + g->state_bytes + g->ckpt_bytes;
    if (g->parent) b += g->parent->bytes + g->parent->state_bytes + g->parent->ckpt_bytes;
    return b;
}

/* A buffer of the tern_gpu's own, counted in g->bytes. */
static enum tern_status newbuf(struct tern_gpu *g, size_t bytes, struct tern_vk_buf **out) {
    enum tern_status st = tern_vk_buf_new(g->vk, bytes, out);
    if (!st) g->bytes += bytes;
    return st;
}

static enum tern_status scratch(struct tern_gpu *g, size_t floats, struct tern_vk_buf **out) {
    return newbuf(g, (floats ? floats : 1) * sizeof(float), out);
}

static struct tern_vk_buf *weight(const struct tern_gpu *g, const void *host);

/* Uploads bytes of host data as the weight found by key (once: a tensor bound twice,
 * e.g. tied embeddings or a shared norm, is one buffer; a head's parent's not again). */
static enum tern_status put(struct tern_gpu *g, const void *key, const void *src, size_t bytes) {
    for (uint32_t i = 0; i < g->n_wt; i++)
        if (g->wt[i].host == (uintptr_t)key) return TERN_OK;
    if (g->parent && weight(g->parent, key)) return TERN_OK; /* the main model's copy */
    if (g->n_wt == g->cap_wt) {
        const uint32_t cap = g->cap_wt ? 2 * g->cap_wt : 64;
        struct gpu_weight *wt = realloc(g->wt, cap * sizeof *wt);
        if (!wt) return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
        g->wt = wt;
        g->cap_wt = cap;
    }
    const uint64_t have = tern_vk_info(g->vk)->device_local_bytes;
    if (have && used_bytes(g) + bytes > have)
        return tern_errorf(TERN_ERR_NOMEM, "gpu: the weights do not fit device '%s' (%.1f MiB): %.1f MiB are "
                                           "uploaded and a tensor of %.1f MiB is next (--gpu-layers N keeps the "
                                           "later layers' matrices in host memory, --n-cpu-moe a MoE model's "
                                           "experts)", tern_vk_info(g->vk)->name,
                           (double)have / 1048576.0, (double)used_bytes(g) / 1048576.0, (double)bytes / 1048576.0);
    struct tern_vk_buf *b;
    enum tern_status st = newbuf(g, bytes, &b);
    if (!st && (st = tern_vk_upload(b, 0, src, bytes))) tern_vk_buf_free(b);
    if (!st) g->wt[g->n_wt++] = (struct gpu_weight){(uintptr_t)key, b};
    return st;
}

static enum tern_status put_vec(struct tern_gpu *g, const float *v, size_t n) {
    return v ? put(g, v, v, n * sizeof(float)) : TERN_OK;
}

/* A matrix that stays in host memory (--gpu-layers), counted once. */
static enum tern_status note_host_mat(struct tern_gpu *g, const struct mat *w) {
    if (g->n_host_mats == g->cap_host_mats) {
        const uint32_t cap = g->cap_host_mats ? 2 * g->cap_host_mats : 64;
        const struct mat **hm = realloc(g->host_mats, cap * sizeof *hm);
        if (!hm) return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
        g->host_mats = hm;
        g->cap_host_mats = cap;
    }
    g->host_mats[g->n_host_mats++] = w;
    g->host_mat_bytes += (uint64_t)w->n * w->row_bytes;
    g->hm_k = TERN_MAX(g->hm_k, (size_t)w->k);
    g->hm_n = TERN_MAX(g->hm_n, (size_t)w->n);
    g->hm_rb = TERN_MAX(g->hm_rb, tern_act_row_bytes(w->type, w->k));
    return TERN_OK;
}

/* A matrix, or n_mat of them stride bytes apart (the stacked experts); one past the
 * device's layers (--gpu-layers) stays in host memory unless dev. */
static enum tern_status put_mats_on(struct tern_gpu *g, const struct mat *w, size_t stride, uint32_t n_mat,
                                    bool dev) {
    if (!dev && n_mat == 1 && host_matrix(g, w)) return note_host_mat(g, w);
    if (!tern_vk_matmul_supported(w->type))
        return tern_errorf(TERN_ERR_UNSUPPORTED, "gpu: tensor '%s' is %s, which the Vulkan matmul does not handle yet",
                           w->name, tern_dtype_name((uint32_t)w->type));
    enum tern_status st = tern_vk_matmul_prepare(g->vk, w->type, n_mat > 1);
    return st ? st : put(g, w->data, w->data, n_mat > 1 ? (size_t)n_mat * stride : (size_t)w->n * w->row_bytes);
}

static enum tern_status put_mats(struct tern_gpu *g, const struct mat *w, size_t stride, uint32_t n_mat) {
    return put_mats_on(g, w, stride, n_mat, false);
}
static enum tern_status put_mat(struct tern_gpu *g, const struct mat *w) { return put_mats(g, w, 0, 1); }
/* (the shared expert: on the device in every layer, as gpu_shared_expert reads it) */
static enum tern_status put_dev_mat(struct tern_gpu *g, const struct mat *w) { return put_mats_on(g, w, 0, 1, true); }

static int weight_cmp(const void *a, const void *b) {
    const uintptr_t x = ((const struct gpu_weight *)a)->host, y = ((const struct gpu_weight *)b)->host;
    return x < y ? -1 : x > y;
}

/* The device copy of the weight keyed by host (NULL: never uploaded). */
static struct tern_vk_buf *weight(const struct tern_gpu *g, const void *host) {
    const struct gpu_weight key = {(uintptr_t)host, NULL};
    const struct gpu_weight *w = bsearch(&key, g->wt, g->n_wt, sizeof *g->wt, weight_cmp);
    return w ? w->buf : g->parent ? weight(g->parent, host) : NULL;
}

void tern_gpu_free(struct tern_gpu *g) {
    if (!g) return;
    if (g->head) {
        tern_gpu_free(g->head);
        free(g->head_m->layers);
        free(g->head_m);
    }
    if (g->rs) g->m->arch->state_free(g->rs);
    for (uint32_t i = 0; i < g->n_wt; i++) tern_vk_buf_free(g->wt[i].buf);
    free(g->wt);
    tern_vk_buf_free(g->logits);
    free(g->host_x);
    free(g->host_cs);
    free(g->host_toks);
    free(g->zeros);
    free(g->moe_l);
    host_mm_free(g->hmm);
    free(g->host_mats);
    tern_vk_buf_free(g->hid);
    if (!g->parent) pthread_mutex_destroy(&g->own_mu);
    free(g);
}

/* Whether layer ml's routed experts stay in host memory (partial offload). */
static bool host_experts(const struct tern_gpu *g, const struct moe_layer *ml) {
    if (ml->gate.data && host_matrix(g, &ml->gate)) return true;
    for (uint32_t il = 0; il < g->n_host && il < g->n_moe_l; il++)
        if (g->moe_l[il].gate.data && g->moe_l[il].gate.data == ml->gate.data) return true;
    return false;
}

/* Bytes of a layer's router, routed experts and their biases (what partial offload keeps
 * in host memory; 0 for a dense layer). */
static uint64_t expert_bytes(const struct moe_hparams *hp, const struct moe_layer *ml) {
    if (!ml->gate.data) return 0;
    const uint64_t X = hp->n_expert, F = ml->gate.n, E = ml->down.n;
    uint64_t b = (uint64_t)ml->router.n * ml->router.row_bytes + X * (ml->gate_stride + ml->up_stride + ml->down_stride);
    if (ml->router_b) b += X * sizeof(float);
    if (ml->gate_b) b += X * F * sizeof(float);
    if (ml->up_b) b += X * F * sizeof(float);
    if (ml->down_b) b += X * E * sizeof(float);
    return b;
}

/* A layer's router, routed experts and their biases. */
static enum tern_status upload_experts(struct tern_gpu *g, const struct moe_hparams *hp, const struct moe_layer *ml) {
    enum tern_status st;
    const size_t X = hp->n_expert;
    if ((st = put_mat(g, &ml->router)) || (st = put_mats(g, &ml->gate, ml->gate_stride, hp->n_expert)) ||
        (st = put_mats(g, &ml->up, ml->up_stride, hp->n_expert)) ||
        (st = put_mats(g, &ml->down, ml->down_stride, hp->n_expert)))
        return st;
    /* gpt-oss's biases (NULL for the others: nothing) */
    if ((st = put_vec(g, ml->router_b, X)) || (st = put_vec(g, ml->gate_b, X * ml->gate.n)) ||
        (st = put_vec(g, ml->up_b, X * ml->up.n)) || (st = put_vec(g, ml->down_b, X * ml->down.n)))
        return st;
    return TERN_OK;
}

/* A layer's MoE block: router, experts (unless they stay in host memory), shared expert,
 * biases. */
static enum tern_status upload_moe(struct tern_gpu *g, const struct moe_hparams *hp, const struct moe_layer *ml) {
    enum tern_status st;
    if (!host_experts(g, ml) && (st = upload_experts(g, hp, ml))) return st;
    if (!hp->n_ff_shexp) return TERN_OK;
    if ((st = put_dev_mat(g, &ml->sh_gate_inp)) || (st = put_dev_mat(g, &ml->sh_gate)) ||
        (st = put_dev_mat(g, &ml->sh_up)) || (st = put_dev_mat(g, &ml->sh_down)))
        return st;
    return TERN_OK;
}

/* ---- the seam's operations on the device (backend.h) ---------------------------------- *
 * An activation is a device buffer. The step records every operation into one command
 * buffer, begun at the first operation after the inputs (which are uploaded, and an
 * upload may use the command buffer); the first failure is kept and the rest skipped. */

/* One step of n rows (g->mu held): the rows of f->b's sequences, sequence j's rows
 * [row0, row0 + n) at its positions [pos0, pos0 + n) against its state S[j], with what
 * io[j] asks besides the logits (NULL: nothing); done[j] of that sequence's rows came in
 * earlier steps (its trail slots follow on from there). Matmuls, norms and the other row
 * operations run once over all n rows (the weights read once for every sequence);
 * attention and the DeltaNet run sequence by sequence. hid_rows: the hidden_out op normed
 * every row into g->hid, for the driver to read the wanted ones back. */
struct gpu_step {
    struct tern_gpu *g;
    struct tern_gpu_state *const *S;     /* (f->b->n_seq) */
    const struct tern_gpu_io *const *io; /* (f->b->n_seq) */
    const uint32_t *done;                /* (f->b->n_seq) */
    uint32_t n;
    bool hid_rows;
    bool recording;
    enum tern_status st;
};

#define STEP(f) ((struct gpu_step *)(f)->run)
#define BUF(a) ((struct tern_vk_buf *)(a))

static enum tern_status gpu_acts_new(void *ctx, const struct model_act_buf *bufs, size_t n_bufs, uint32_t n_chunk,
                                     size_t *bytes) {
    for (size_t i = 0; i < n_bufs; i++) {
        const size_t n = (bufs[i].once ? 1 : (size_t)n_chunk) * (bufs[i].n ? bufs[i].n : 1);
        struct tern_vk_buf *b;
        enum tern_status st = scratch(ctx, n, &b);
        if (st) return st;
        *bufs[i].p = (struct model_act *)b;
        *bytes += n * sizeof(float);
    }
    return TERN_OK;
}

static void gpu_act_free(void *ctx, struct model_act *a) {
    (void)ctx;
    tern_vk_buf_free(BUF(a));
}

/* The MoE scratch: router logits (n_chunk, n_expert), the slots' expert ids, order and
 * weights (n_chunk, n_used), their gate/up (slots, n_ff_exp) and down outputs (slots,
 * n_embd); the shared expert's gate/up (n_chunk, n_ff_shexp), gate logit (n_chunk),
 * output (n_chunk, n_embd). */
struct gpu_moe_ws {
    struct tern_vk_buf *probs, *ids, *order, *wts, *g, *u, *d, *s_g, *s_u, *s_w, *s_d;
    struct host_moe *host; /* partial offload (NULL: none) */
};

/* The host half of partial offload: the CPU's MoE scratch for one chunk, a session view
 * of it for the CPU's kernels (the model's pool, one prepared-activation buffer for the
 * router) and the rows that cross: the normed input, the output, the shared expert's
 * output and gate logits (each (n_chunk, n_embd) but the last, (n_chunk)). */
struct host_moe {
    struct tern_session s;
    struct moe_state st;
    float *h, *y, *sd, *sw;
};

static void host_moe_free(struct host_moe *hm) {
    if (!hm) return;
    moe_state_free(&hm->st);
    tern_aligned_free(hm->s.act[0]);
    tern_aligned_free(hm->h);
    tern_aligned_free(hm->y);
    tern_aligned_free(hm->sd);
    tern_aligned_free(hm->sw);
    free(hm);
}

/* The host half for g's MoE layers (n_layer entries, sized for the largest), chunks of
 * n_chunk rows. */
static enum tern_status host_moe_new(struct tern_gpu *g, const struct moe_hparams *hp, const struct moe_layer *layers,
                                     uint32_t n_layer, uint32_t n_chunk, struct host_moe **out, size_t *bytes) {
    const struct tern_model *m = g->m;
    struct host_moe *hm = tern_calloc(1, sizeof *hm);
    if (!hm) return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    *out = hm;
    enum tern_status st = moe_state_new(m, hp, layers, n_layer, n_chunk, &hm->st);
    if (st) return st;
    size_t rb = 0;
    for (uint32_t il = 0; il < n_layer; il++)
        if (layers[il].gate.data) rb = TERN_MAX(rb, tern_act_row_bytes(layers[il].router.type, layers[il].router.k));
    const size_t E = m->hp.n_embd, n = n_chunk;
    hm->s.m = (struct tern_model *)(uintptr_t)m; /* the pool, the layers: read only */
    hm->s.rs_chunk = n_chunk;
    hm->s.act[0] = tern_aligned_alloc(n * (rb ? rb : 1));
    hm->h = tern_aligned_alloc(n * E * sizeof(float));
    hm->y = tern_aligned_alloc(n * E * sizeof(float));
    hm->sd = tern_aligned_alloc(n * E * sizeof(float));
    hm->sw = tern_aligned_alloc(n * sizeof(float));
    if (!hm->s.act[0] || !hm->h || !hm->y || !hm->sd || !hm->sw) return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    *bytes += hm->st.bytes + n * rb + n * (3 * E + 1) * sizeof(float);
    return TERN_OK;
}

static void gpu_moe_ws_free(void *ctx, struct model_moe_ws *p) {
    (void)ctx;
    struct gpu_moe_ws *ws = (struct gpu_moe_ws *)p;
    if (!ws) return;
    struct tern_vk_buf *bufs[] = {ws->probs, ws->ids, ws->order, ws->wts, ws->g,  ws->u,
                                  ws->d,     ws->s_g, ws->s_u,   ws->s_w, ws->s_d};
    for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) tern_vk_buf_free(bufs[i]);
    host_moe_free(ws->host);
    free(ws);
}

static enum tern_status gpu_moe_ws_new(void *ctx, const struct tern_model *m, const struct moe_hparams *hp,
                                       const struct moe_layer *layers, uint32_t n_layer, uint32_t n_chunk,
                                       struct model_moe_ws **out, size_t *bytes) {
    struct tern_gpu *g = ctx;
    *out = NULL;
    struct gpu_moe_ws *ws = tern_calloc(1, sizeof *ws);
    if (!ws) return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    *out = (struct model_moe_ws *)ws;
    const size_t n = n_chunk, K = hp->n_used, slots = n * K, E = m->hp.n_embd, S = hp->n_ff_shexp;
    const size_t before = g->bytes;
    enum tern_status st = scratch(g, n * hp->n_expert, &ws->probs);
    if (!st) st = scratch(g, slots, &ws->ids);
    if (!st) st = scratch(g, tern_vk_moe_order_words(slots, hp->n_expert), &ws->order);
    if (!st) st = scratch(g, slots, &ws->wts);
    if (!st) st = scratch(g, slots * hp->n_ff_exp, &ws->g);
    if (!st) st = scratch(g, slots * hp->n_ff_exp, &ws->u);
    if (!st) st = scratch(g, slots * E, &ws->d);
    if (!st && S) st = scratch(g, n * S, &ws->s_g);
    if (!st && S) st = scratch(g, n * S, &ws->s_u);
    if (!st && S) st = scratch(g, n, &ws->s_w);
    if (!st && S) st = scratch(g, n * E, &ws->s_d);
    *bytes += g->bytes - before;
    bool host = g->n_host > 0; /* --n-cpu-moe, or a layer past --gpu-layers */
    for (uint32_t il = 0; il < n_layer && !host; il++) host = host_experts(g, &layers[il]);
    if (!st && host) st = host_moe_new(g, hp, layers, n_layer, n_chunk, &ws->host, bytes);
    g->moe_ws = ws;
    return st;
}

/* Whether the step may record its next operation (its recording begun). */
static bool live(const struct model_step *f) {
    struct gpu_step *p = STEP(f);
    if (!p->st && !p->recording) {
        p->st = tern_vk_begin(p->g->vk);
        p->recording = !p->st;
    }
    return !p->st;
}

static void keep(const struct model_step *f, enum tern_status st) {
    if (!STEP(f)->st) STEP(f)->st = st;
}

#define DO(f, call)                                                                                                    \
    do {                                                                                                               \
        if (live(f)) keep((f), (call));                                                                                \
    } while (0)

/* The device copy of a weight; a miss is a bug (every weight the forward names is
 * uploaded by upload_*). */
static struct tern_vk_buf *wbuf(const struct model_step *f, const void *host, const char *what) {
    struct tern_vk_buf *b = weight(STEP(f)->g, host);
    if (!b) keep(f, tern_errorf(TERN_ERR_INTERNAL, "gpu: %s was not uploaded to the device", what));
    return b;
}

static struct tern_vk_buf *vbuf(const struct model_step *f, const float *v) {
    return v ? wbuf(f, v, "a weight vector") : NULL;
}

/* An input of the step: uploaded before its recording begins. */
static bool input(const struct model_step *f) {
    struct gpu_step *p = STEP(f);
    if (!p->st && p->recording)
        p->st = tern_errorf(TERN_ERR_INTERNAL, "gpu: a step's inputs must come before its operations");
    return !p->st;
}

static void gpu_embed(const struct model_step *f, const struct mat *embd, struct model_act *x) {
    struct gpu_step *p = STEP(f);
    if (!input(f)) return;
    for (uint32_t t = 0; t < p->n; t++)
        tern_dequantize_row(embd->type, (const char *)embd->data + (size_t)f->b->toks[t] * embd->row_bytes,
                            p->g->host_x + (size_t)t * embd->k, embd->k);
    keep(f, tern_vk_upload(BUF(x), 0, p->g->host_x, (size_t)p->n * embd->k * sizeof(float)));
}

static void gpu_rope_angles(const struct model_step *f, const struct model_rope *r, struct model_act *cs) {
    struct gpu_step *p = STEP(f);
    const uint32_t nr = r->p->n_rot;
    if (!input(f) || !nr) return;
    /* each row at its own sequence's position */
    for (uint32_t j = 0; j < f->b->n_seq; j++) {
        const struct model_seq *q = &f->b->seq[j];
        for (uint32_t t = 0; t < q->n; t++)
            model_rope_row_angles(r, q->pos0 + t, p->g->host_cs + (size_t)(q->row0 + t) * nr);
    }
    keep(f, tern_vk_upload(BUF(cs), 0, p->g->host_cs, (size_t)p->n * nr * sizeof(float)));
}

/* The MTP head's input rows: the main model's hidden states at each sequence's positions. */
static void gpu_hidden_in(const struct model_step *f, struct model_act *x) {
    const struct gpu_step *p = STEP(f);
    const size_t E = f->m->hp.n_embd;
    if (!input(f)) return;
    for (uint32_t j = 0; j < f->b->n_seq; j++) {
        const struct model_seq *q = &f->b->seq[j];
        const struct tern_gpu_io *io = p->io[j];
        if (!io || !io->hidden_in || q->pos0 < io->hidden_pos0) {
            keep(f, tern_errorf(TERN_ERR_INTERNAL, "gpu: an MTP head's rows at %u without the hidden states", q->pos0));
            return;
        }
        keep(f, tern_vk_upload(BUF(x), (size_t)q->row0 * E * sizeof(float),
                               io->hidden_in + (size_t)(q->pos0 - io->hidden_pos0) * E,
                               (size_t)q->n * E * sizeof(float)));
    }
}

/* Ends the step's recording (submitted, waited for): what a host half needs before it
 * reads rows back. */
static void step_flush(const struct model_step *f) {
    struct gpu_step *p = STEP(f);
    if (p->recording) {
        p->recording = false;
        keep(f, tern_vk_end(p->g->vk));
    }
}

/* A matmul whose matrices stay in host memory (--gpu-layers): the recording submitted,
 * the input rows read back, the CPU's matmul (model_matmul: batch-invariant rows), the
 * products uploaded. Bytes moved per row: k + the outputs' n floats. */
static void gpu_matmul_host(const struct model_step *f, const struct model_act *x, const struct model_mm *outs,
                            size_t n_outs) {
    struct gpu_step *p = STEP(f);
    struct host_mm *h = p->g->hmm;
    if (!h || n_outs > 4) {
        keep(f, tern_errorf(TERN_ERR_INTERNAL, "gpu: a host matmul without its scratch"));
        return;
    }
    step_flush(f);
    if (p->st) return;
    const size_t n = p->n, k = outs[0].w->k;
    keep(f, tern_vk_download(BUF(x), 0, h->x, n * k * sizeof(float)));
    if (p->st) return;
    struct mm_out mo[4];
    float *y = h->y;
    for (size_t i = 0; i < n_outs; i++) {
        mo[i] = (struct mm_out){outs[i].w, y};
        y += n * outs[i].w->n;
    }
    model_matmul(&h->s, h->x, (uint32_t)n, mo, n_outs);
    for (size_t i = 0; i < n_outs; i++)
        keep(f, tern_vk_upload(BUF(outs[i].y), 0, mo[i].y, n * outs[i].w->n * sizeof(float)));
}

static void gpu_matmul(const struct model_step *f, const struct model_act *x, const struct model_mm *outs,
                       size_t n_outs) {
    /* (the outputs of one input: one layer's; an uploaded matrix needs no name parsed) */
    if (!weight(STEP(f)->g, outs[0].w->data) && host_matrix(STEP(f)->g, outs[0].w)) {
        gpu_matmul_host(f, x, outs, n_outs);
        return;
    }
    for (size_t i = 0; i < n_outs; i++) {
        const struct mat *w = outs[i].w;
        struct tern_vk_buf *b = wbuf(f, w->data, w->name);
        DO(f, tern_vk_matmul(STEP(f)->g->vk, w->type, b, w->k, w->n, BUF(x), STEP(f)->n, BUF(outs[i].y)));
    }
}

static void gpu_rmsnorm(const struct model_step *f, struct model_act *y, const struct model_act *x, const float *w,
                        uint32_t n, float eps) {
    struct tern_vk_buf *wb = vbuf(f, w);
    DO(f, tern_vk_rmsnorm(STEP(f)->g->vk, BUF(x), wb, BUF(y), STEP(f)->n, n, eps));
}

static void gpu_rmsnorm_heads(const struct model_step *f, struct model_act *x, const float *w, uint32_t n_head,
                              uint32_t head_dim, float eps) {
    struct tern_vk_buf *wb = vbuf(f, w);
    DO(f, tern_vk_rmsnorm(STEP(f)->g->vk, BUF(x), wb, BUF(x), (size_t)STEP(f)->n * n_head, head_dim, eps));
}

static void gpu_add_bias(const struct model_step *f, struct model_act *x, const float *bias, uint32_t n) {
    struct tern_vk_buf *b = vbuf(f, bias);
    DO(f, tern_vk_add_bias(STEP(f)->g->vk, BUF(x), b, STEP(f)->n, n));
}

static void gpu_add(const struct model_step *f, struct model_act *y, const struct model_act *x, uint32_t n) {
    DO(f, tern_vk_add(STEP(f)->g->vk, BUF(y), BUF(x), STEP(f)->n, n));
}

static void gpu_swiglu(const struct model_step *f, struct model_act *g, const struct model_act *u, uint32_t n) {
    DO(f, tern_vk_swiglu(STEP(f)->g->vk, BUF(g), BUF(u), STEP(f)->n, n));
}

static void gpu_sigmoid_mul(const struct model_step *f, struct model_act *x, const struct model_act *gate,
                            uint32_t n) {
    DO(f, tern_vk_sigmoid_mul(STEP(f)->g->vk, BUF(x), BUF(gate), STEP(f)->n, n));
}

static void gpu_split_heads(const struct model_step *f, const struct model_act *ab, struct model_act *a,
                            struct model_act *b, uint32_t n_head, uint32_t head_dim) {
    DO(f, tern_vk_split_heads(STEP(f)->g->vk, BUF(ab), BUF(a), BUF(b), STEP(f)->n, n_head, head_dim));
}

/* y[t] = [a[t] | b[t]], rows of n: two copies a row (the MTP head's input, a few rows). */
static void gpu_concat_rows(const struct model_step *f, struct model_act *y, const struct model_act *a,
                            const struct model_act *b, uint32_t n) {
    struct tern_vk *vk = STEP(f)->g->vk;
    const size_t row = (size_t)n * sizeof(float), rows = STEP(f)->n;
    /* every row of a to the first half of y's, of b to the second: two copy commands */
    DO(f, tern_vk_copy_rows(vk, BUF(a), 0, row, BUF(y), 0, 2 * row, row, rows));
    DO(f, tern_vk_copy_rows(vk, BUF(b), 0, row, BUF(y), row, 2 * row, row, rows));
}

static void gpu_rope(const struct model_step *f, const struct model_rope *r, struct model_act *q, uint32_t n_head,
                     struct model_act *k, uint32_t n_head_kv, uint32_t head_dim, const struct model_act *cs) {
    struct tern_vk *vk = STEP(f)->g->vk;
    const size_t n = STEP(f)->n, nr = r->p->n_rot;
    DO(f, tern_vk_rope(vk, BUF(q), (size_t)n_head * head_dim, n_head, head_dim, nr, BUF(cs), n, r->neox));
    DO(f, tern_vk_rope(vk, BUF(k), (size_t)n_head_kv * head_dim, n_head_kv, head_dim, nr, BUF(cs), n, r->neox));
}

/* The shared expert's gate/up, gate logit and down (ws->s_w, ws->s_d) of the rows h. */
static void gpu_shared_expert(const struct model_step *f, const struct moe_layer *ml, struct gpu_moe_ws *ws,
                              const struct model_act *h, uint32_t S) {
    struct tern_vk *vk = STEP(f)->g->vk;
    const uint32_t E = f->m->hp.n_embd, n = STEP(f)->n;
    const struct mat *sm[] = {&ml->sh_gate, &ml->sh_up, &ml->sh_gate_inp, &ml->sh_down};
    struct tern_vk_buf *sb[4];
    for (int i = 0; i < 4; i++) sb[i] = wbuf(f, sm[i]->data, sm[i]->name);
    DO(f, tern_vk_matmul(vk, ml->sh_gate.type, sb[0], E, S, BUF(h), n, ws->s_g));
    DO(f, tern_vk_matmul(vk, ml->sh_up.type, sb[1], E, S, BUF(h), n, ws->s_u));
    DO(f, tern_vk_matmul(vk, ml->sh_gate_inp.type, sb[2], E, 1, BUF(h), n, ws->s_w));
    DO(f, tern_vk_swiglu(vk, ws->s_g, ws->s_u, n, S));
    DO(f, tern_vk_matmul(vk, ml->sh_down.type, sb[3], S, E, ws->s_g, n, ws->s_d));
}

/* A layer whose routed experts stay in host memory: the shared expert on the device, the
 * recording submitted, the rows read back, the CPU's MoE block over them (its router, the
 * experts, the combine with the shared expert's rows), the output uploaded. Bytes moved
 * per row: 2 n_embd floats (3 n_embd + 1 with a shared expert). */
static void gpu_moe_host(const struct model_step *f, const struct moe_hparams *mh, const struct moe_layer *ml,
                         struct gpu_moe_ws *ws, const struct model_act *h, struct model_act *out) {
    struct gpu_step *p = STEP(f);
    struct host_moe *hm = ws->host;
    const uint32_t S = mh->n_ff_shexp, n = p->n;
    const size_t rb = (size_t)n * f->m->hp.n_embd * sizeof(float);
    if (!hm) {
        keep(f, tern_errorf(TERN_ERR_INTERNAL, "gpu: a host MoE layer without its scratch"));
        return;
    }
    if (S) gpu_shared_expert(f, ml, ws, h, S);
    step_flush(f);
    if (p->st) return;
    keep(f, tern_vk_download(BUF(h), 0, hm->h, rb));
    if (S) keep(f, tern_vk_download(ws->s_d, 0, hm->sd, rb));
    if (S) keep(f, tern_vk_download(ws->s_w, 0, hm->sw, (size_t)n * sizeof(float)));
    if (p->st) return;
    moe_forward_shared(&hm->s, mh, ml, &hm->st, hm->h, n, hm->y, S ? hm->sd : NULL, S ? hm->sw : NULL);
    keep(f, tern_vk_upload(BUF(out), 0, hm->y, rb));
}

/* moe_forward's steps on the device, from the normed rows h into out. */
static void gpu_moe(const struct model_step *f, const struct moe_hparams *mh, const struct moe_layer *ml,
                    struct model_moe_ws *p, const struct model_act *h, struct model_act *out) {
    struct gpu_moe_ws *ws = (struct gpu_moe_ws *)p;
    if (host_experts(STEP(f)->g, ml)) {
        gpu_moe_host(f, mh, ml, ws, h, out);
        return;
    }
    struct tern_vk *vk = STEP(f)->g->vk;
    const uint32_t E = f->m->hp.n_embd, X = mh->n_expert, K = mh->n_used, F = mh->n_ff_exp, S = mh->n_ff_shexp;
    const uint32_t n = STEP(f)->n, slots = n * K;
    struct tern_vk_buf *r = wbuf(f, ml->router.data, ml->router.name), *eg = wbuf(f, ml->gate.data, ml->gate.name);
    struct tern_vk_buf *eu = wbuf(f, ml->up.data, ml->up.name), *ed = wbuf(f, ml->down.data, ml->down.name);
    DO(f, tern_vk_matmul(vk, ml->router.type, r, E, X, BUF(h), n, ws->probs));
    if (ml->router_b) DO(f, tern_vk_add_bias(vk, ws->probs, vbuf(f, ml->router_b), n, X));
    DO(f, tern_vk_moe_route(vk, ws->probs, ws->ids, ws->wts, n, X, K, mh->norm_topk, mh->scale, mh->softmax_weight));
    DO(f, tern_vk_moe_group(vk, ws->ids, ws->order, slots, X));
    DO(f, tern_vk_matmul_id(vk, ml->gate.type, eg, ml->gate_stride, X, E, F, ws->ids, ws->order, BUF(h), K, slots,
                            ws->g));
    DO(f, tern_vk_matmul_id(vk, ml->up.type, eu, ml->up_stride, X, E, F, ws->ids, ws->order, BUF(h), K, slots, ws->u));
    if (mh->swiglu_oai) { /* gpt-oss: each slot's expert's biases, the clamped swiglu */
        DO(f, tern_vk_moe_expert_bias(vk, ws->g, ws->ids, vbuf(f, ml->gate_b), slots, F, X));
        DO(f, tern_vk_moe_expert_bias(vk, ws->u, ws->ids, vbuf(f, ml->up_b), slots, F, X));
        DO(f, tern_vk_swiglu_oai(vk, ws->g, ws->u, slots, F));
    } else {
        DO(f, tern_vk_swiglu(vk, ws->g, ws->u, slots, F));
    }
    DO(f, tern_vk_matmul_id(vk, ml->down.type, ed, ml->down_stride, X, F, E, ws->ids, ws->order, ws->g, 1, slots,
                            ws->d));
    /* (down + its expert's bias), then times the weight in the combine: the CPU's order */
    if (ml->down_b) DO(f, tern_vk_moe_expert_bias(vk, ws->d, ws->ids, vbuf(f, ml->down_b), slots, E, X));
    if (S) gpu_shared_expert(f, ml, ws, h, S);
    DO(f, tern_vk_moe_combine(vk, BUF(out), ws->d, ws->wts, n, E, K, S ? ws->s_d : NULL, S ? ws->s_w : NULL));
}

/* Per sequence: its rows' K/V into layer il of its own cache, then its rows' attention
 * over that cache (a row's result depends on its own positions alone). */
static void gpu_attention(const struct model_step *f, uint32_t il, const struct model_act *q,
                          const struct model_act *k, const struct model_act *v, struct model_act *out,
                          uint32_t n_head, float scale) {
    const struct gpu_step *p = STEP(f);
    const struct model_layer *L = &f->m->layers[il];
    struct tern_vk *vk = p->g->vk;
    const size_t hd = L->head_dim_k, nq = (size_t)n_head * hd, nkv = (size_t)L->n_kv_head * hd;
    struct tern_vk_buf *sinks = vbuf(f, L->sinks);
    for (uint32_t j = 0; j < f->b->n_seq; j++) {
        const struct model_seq *sq = &f->b->seq[j];
        const struct tern_gpu_state *S = p->S[j];
        DO(f, tern_vk_kv_store(vk, BUF(k), nkv, S->kc[il], L->n_kv_head, hd, sq->pos0, sq->row0, sq->n, S->f16_kv));
        DO(f, tern_vk_kv_store(vk, BUF(v), nkv, S->vc[il], L->n_kv_head, hd, sq->pos0, sq->row0, sq->n, S->f16_kv));
        DO(f, tern_vk_attention(vk, BUF(q), nq, S->kc[il], S->vc[il], BUF(out), nq, sq->row0, sq->n, sq->pos0, n_head,
                                L->n_kv_head, hd, scale, S->f16_kv, L->window, sinks));
    }
}

/* Per sequence: the conv over its rows (its own window on the device) and the recurrence
 * (its own state on the device), tokens in order; the CPU's scratch is not needed. */
static void gpu_deltanet(const struct model_step *f, uint32_t il, const struct model_deltanet *d,
                         const struct model_act *qkv_raw, struct model_act *qkv, const struct model_act *z,
                         const struct model_act *beta, const struct model_act *alpha, struct model_act *out,
                         struct model_act *scratch) {
    (void)scratch;
    const struct gpu_step *p = STEP(f);
    const struct tern_deltanet_shape *dn = d->dn;
    struct tern_vk *vk = p->g->vk;
    const size_t C = tern_deltanet_channels(dn);
    struct tern_vk_buf *conv_wt = wbuf(f, d->conv_wt, "a DeltaNet conv weight");
    struct tern_vk_buf *params = wbuf(f, d->p->ssm_a, "a DeltaNet layer's parameters");
    for (uint32_t j = 0; j < f->b->n_seq; j++) {
        const struct model_seq *q = &f->b->seq[j];
        struct tern_gpu_state *S = p->S[j];
        const struct tern_gpu_io *io = p->io[j];
        /* with a trail the dispatches also write the window and state after each token
         * into its slot (the same arithmetic, the same bits) */
        const bool tr = io && io->trail && f->m->rec_bytes;
        const size_t slot = tr ? io->slot0 + p->done[j] : 0;
        DO(f, tern_vk_deltanet_conv(vk, S->win[il], conv_wt, BUF(qkv_raw), C, BUF(qkv), C, C, dn->n_conv, q->row0,
                                    q->n, tr ? S->tw[il] : NULL, slot));
        DO(f, tern_vk_deltanet_heads(vk, S->S[il], BUF(qkv), BUF(z), BUF(beta), BUF(alpha), BUF(out), params,
                                     dn->n_k_heads, dn->k_grouped, dn->n_v_heads, dn->d_k, dn->d_v, dn->eps, q->row0, q->n,
                                     tr ? S->tS[il] : NULL, slot));
    }
}

/* The wanted rows (the sequences' want and all: every row of one with all, the last row
 * of one with want only, sequence by sequence) normed and projected into rows 0.. of the
 * tern_gpu's logits; the driver reads them back after the step. Only those rows are
 * projected: when they are not already rows 0.. of x they are first copied, in order,
 * into xb (on the device) and normed there in place. A row's logits do not depend on
 * which rows are projected with it (the norm is per row, the matmul one reduction per
 * element). */
static void gpu_output(const struct model_step *f, const struct mat *out_w, const float *norm_w, float eps,
                       const struct model_act *x, struct model_act *xb) {
    const struct gpu_step *p = STEP(f);
    const struct model_batch *b = f->b;
    struct tern_vk *vk = p->g->vk;
    const size_t rb = (size_t)out_w->k * sizeof(float);
    uint32_t n_out = 0;
    bool in_place = true; /* the wanted rows are rows [0, n_out) of x */
    for (uint32_t j = 0; j < b->n_seq; j++) {
        const struct model_seq *q = &b->seq[j];
        if (!q->want) continue;
        if ((q->all ? q->row0 : q->row0 + q->n - 1) != n_out) in_place = false;
        n_out += q->all ? q->n : 1;
    }
    if (!n_out) return;
    struct tern_vk_buf *nb = vbuf(f, norm_w), *wb = wbuf(f, out_w->data, out_w->name);
    if (in_place) {
        DO(f, tern_vk_rmsnorm(vk, BUF(x), nb, BUF(xb), n_out, out_w->k, eps));
    } else {
        uint32_t o = 0;
        for (uint32_t j = 0; j < b->n_seq; j++) {
            const struct model_seq *q = &b->seq[j];
            if (!q->want) continue;
            const uint32_t r0 = q->all ? q->row0 : q->row0 + q->n - 1, c = q->all ? q->n : 1;
            DO(f, tern_vk_copy(vk, BUF(x), r0 * rb, BUF(xb), o * rb, c * rb));
            o += c;
        }
        DO(f, tern_vk_rmsnorm(vk, BUF(xb), nb, BUF(xb), n_out, out_w->k, eps));
    }
    DO(f, tern_vk_matmul(vk, out_w->type, wb, out_w->k, out_w->n, BUF(xb), n_out, p->g->logits));
}

/* Every row output-normed into g->hid when a sequence captures its hidden states (the MTP
 * head's input); the driver reads back each one's rows at or above its hidden_pos0. */
static void gpu_hidden_out(const struct model_step *f, const float *norm_w, float eps, const struct model_act *x) {
    struct gpu_step *p = STEP(f);
    bool any = false;
    for (uint32_t j = 0; j < f->b->n_seq; j++) {
        const struct model_seq *q = &f->b->seq[j];
        const struct tern_gpu_io *io = p->io[j];
        any |= io && io->hidden_out && q->pos0 + q->n > io->hidden_pos0;
    }
    if (!any) return;
    if (!p->g->hid) {
        keep(f, tern_errorf(TERN_ERR_INTERNAL, "gpu: %s keeps no hidden rows", f->m->name));
        return;
    }
    struct tern_vk_buf *nb = vbuf(f, norm_w);
    DO(f, tern_vk_rmsnorm(p->g->vk, BUF(x), nb, p->g->hid, p->n, f->m->hp.n_embd, eps));
    p->hid_rows = true;
}

const struct model_ops gpu_ops = {
    .acts_new = gpu_acts_new,
    .act_free = gpu_act_free,
    .moe_ws_new = gpu_moe_ws_new,
    .moe_ws_free = gpu_moe_ws_free,
    .embed = gpu_embed,
    .rope_angles = gpu_rope_angles,
    .hidden_in = gpu_hidden_in,
    .matmul = gpu_matmul,
    .rmsnorm = gpu_rmsnorm,
    .rmsnorm_heads = gpu_rmsnorm_heads,
    .add_bias = gpu_add_bias,
    .add = gpu_add,
    .swiglu = gpu_swiglu,
    .sigmoid_mul = gpu_sigmoid_mul,
    .split_heads = gpu_split_heads,
    .concat_rows = gpu_concat_rows,
    .rope = gpu_rope,
    .moe = gpu_moe,
    .attention = gpu_attention,
    .deltanet = gpu_deltanet,
    .output = gpu_output,
    .hidden_out = gpu_hidden_out,
};
#undef DO

/* ---- the weights: the forward run once on an uploading backend ------------------------ *
 * Every operation handed a weight uploads it (once; a head's parent's are found, not
 * uploaded again), so the device holds exactly the weights the architecture's forward
 * names, whatever the architecture: the seam says which weights a forward uses by using
 * them. The embedding table stays on the host (the step's input rows are dequantized
 * there). The pass also sizes what the operations need on the device: the DeltaNet's
 * zeros, the hidden rows of a model with an MTP head. */

struct gpu_upload {
    struct tern_gpu *g;
    enum tern_status st;
    float *prm; /* a DeltaNet layer's packed parameters, staged */
    size_t n_prm;
};

#define UP(f) ((struct gpu_upload *)(f)->run)

static void up_keep(const struct model_step *f, enum tern_status st) {
    if (!UP(f)->st) UP(f)->st = st;
}

static char up_act; /* every activation and MoE scratch of the pass: never read or written */

static enum tern_status up_acts_new(void *ctx, const struct model_act_buf *bufs, size_t n_bufs, uint32_t n_chunk,
                                    size_t *bytes) {
    (void)ctx, (void)n_chunk, (void)bytes;
    for (size_t i = 0; i < n_bufs; i++) *bufs[i].p = (struct model_act *)&up_act;
    return TERN_OK;
}

static void up_act_free(void *ctx, struct model_act *a) { (void)ctx, (void)a; }

static enum tern_status up_moe_ws_new(void *ctx, const struct tern_model *m, const struct moe_hparams *hp,
                                      const struct moe_layer *layers, uint32_t n_layer, uint32_t n_chunk,
                                      struct model_moe_ws **out, size_t *bytes) {
    (void)m, (void)n_chunk, (void)bytes;
    struct tern_gpu *g = ((struct gpu_upload *)ctx)->g;
    *out = (struct model_moe_ws *)&up_act;
    /* the MoE layers, for partial offload; an MTP head's (the model's last layer) stay in
     * host memory when the main model keeps every MoE layer's there */
    const uint32_t req = g->m->cpu_moe_req;
    if (g->moe_l) return TERN_OK;
    if (g->parent) {
        uint32_t n_host, n_moe;
        tern_gpu_cpu_moe(g->parent, &n_host, &n_moe);
        if (!n_moe || n_host < n_moe) return TERN_OK;
    }
    if (!(g->moe_l = tern_malloc((n_layer ? n_layer : 1) * sizeof *g->moe_l)))
        return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    memcpy(g->moe_l, layers, n_layer * sizeof *layers);
    g->n_moe_l = n_layer;
    g->moe_hp = *hp;
    g->auto_moe = !g->parent && req == TERN_CPU_MOE_AUTO;
    /* auto: every layer's experts in host memory until the rest is on the device */
    g->n_host = g->parent || g->auto_moe ? n_layer : TERN_MIN(req, n_layer);
    return TERN_OK;
}

static void up_moe_ws_free(void *ctx, struct model_moe_ws *ws) { (void)ctx, (void)ws; }

/* the operations without weights */
static void up_embed(const struct model_step *f, const struct mat *e, struct model_act *x) {
    (void)f, (void)e, (void)x;
}
static void up_rope_angles(const struct model_step *f, const struct model_rope *r, struct model_act *cs) {
    (void)f, (void)r, (void)cs;
}
static void up_hidden_in(const struct model_step *f, struct model_act *x) { (void)f, (void)x; }
static void up_add(const struct model_step *f, struct model_act *y, const struct model_act *x, uint32_t n) {
    (void)f, (void)y, (void)x, (void)n;
}
static void up_swiglu(const struct model_step *f, struct model_act *g, const struct model_act *u, uint32_t n) {
    (void)f, (void)g, (void)u, (void)n;
}
static void up_sigmoid_mul(const struct model_step *f, struct model_act *x, const struct model_act *g, uint32_t n) {
    (void)f, (void)x, (void)g, (void)n;
}
static void up_split_heads(const struct model_step *f, const struct model_act *ab, struct model_act *a,
                           struct model_act *b, uint32_t n_head, uint32_t head_dim) {
    (void)f, (void)ab, (void)a, (void)b, (void)n_head, (void)head_dim;
}
static void up_concat_rows(const struct model_step *f, struct model_act *y, const struct model_act *a,
                           const struct model_act *b, uint32_t n) {
    (void)f, (void)y, (void)a, (void)b, (void)n;
}
static void up_rope(const struct model_step *f, const struct model_rope *r, struct model_act *q, uint32_t n_head,
                    struct model_act *k, uint32_t n_head_kv, uint32_t head_dim, const struct model_act *cs) {
    (void)f, (void)r, (void)q, (void)n_head, (void)k, (void)n_head_kv, (void)head_dim, (void)cs;
}
static void up_attention(const struct model_step *f, uint32_t il, const struct model_act *q, const struct model_act *k,
                         const struct model_act *v, struct model_act *out, uint32_t n_head, float scale) {
    (void)q, (void)k, (void)v, (void)out, (void)scale;
    up_keep(f, put_vec(UP(f)->g, f->m->layers[il].sinks, n_head)); /* gpt-oss's; NULL: none */
}

/* the operations with weights */
static void up_matmul(const struct model_step *f, const struct model_act *x, const struct model_mm *outs,
                      size_t n_outs) {
    (void)x;
    for (size_t i = 0; i < n_outs; i++) up_keep(f, put_mat(UP(f)->g, outs[i].w));
}

static void up_rmsnorm(const struct model_step *f, struct model_act *y, const struct model_act *x, const float *w,
                       uint32_t n, float eps) {
    (void)y, (void)x, (void)eps;
    up_keep(f, put_vec(UP(f)->g, w, n));
}

static void up_rmsnorm_heads(const struct model_step *f, struct model_act *x, const float *w, uint32_t n_head,
                             uint32_t head_dim, float eps) {
    (void)x, (void)n_head, (void)eps;
    up_keep(f, put_vec(UP(f)->g, w, head_dim));
}

static void up_add_bias(const struct model_step *f, struct model_act *x, const float *bias, uint32_t n) {
    (void)x;
    up_keep(f, put_vec(UP(f)->g, bias, n));
}

static void up_moe(const struct model_step *f, const struct moe_hparams *hp, const struct moe_layer *L,
                   struct model_moe_ws *ws, const struct model_act *h, struct model_act *out) {
    (void)ws, (void)h, (void)out;
    const uint32_t n_chunk = UP(f)->g->n_chunk;
    if ((uint64_t)n_chunk * hp->n_used > 65535) {
        up_keep(f, tern_errorf(TERN_ERR_UNSUPPORTED, "gpu: chunks of %u tokens with %u experts each exceed the Vulkan "
                                                     "matmul's 65535 slots (chunks of at most %u)",
                               n_chunk, hp->n_used, 65535 / hp->n_used));
        return;
    }
    up_keep(f, upload_moe(UP(f)->g, hp, L));
}

static void up_deltanet(const struct model_step *f, uint32_t il, const struct model_deltanet *d,
                        const struct model_act *qkv_raw, struct model_act *qkv, const struct model_act *z,
                        const struct model_act *beta, const struct model_act *alpha, struct model_act *out,
                        struct model_act *dn_scratch) {
    (void)il, (void)qkv_raw, (void)qkv, (void)z, (void)beta, (void)alpha, (void)out, (void)dn_scratch;
    struct gpu_upload *u = UP(f);
    struct tern_gpu *g = u->g;
    const struct tern_deltanet_shape *dn = d->dn;
    const size_t C = tern_deltanet_channels(dn), nv = dn->n_v_heads, n_prm = 2 * nv + dn->d_v;
    if (dn->d_k > 256 || dn->d_v > 256) {
        up_keep(f, tern_errorf(TERN_ERR_UNSUPPORTED, "gpu: DeltaNet heads of %u/%u (the Vulkan recurrence takes at "
                                                     "most 256)", dn->d_k, dn->d_v));
        return;
    }
    if (u->n_prm < n_prm) {
        float *p = realloc(u->prm, n_prm * sizeof(float));
        if (!p) {
            up_keep(f, tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory"));
            return;
        }
        u->prm = p;
        u->n_prm = n_prm;
    }
    /* the deltanet shader's parameters: ssm_a | dt_bias | ssm_norm, keyed by ssm_a */
    memcpy(u->prm, d->p->ssm_a, nv * sizeof(float));
    memcpy(u->prm + nv, d->p->dt_bias, nv * sizeof(float));
    memcpy(u->prm + 2 * nv, d->p->norm_w, dn->d_v * sizeof(float));
    up_keep(f, put(g, d->conv_wt, d->conv_wt, dn->n_conv * C * sizeof(float)));
    up_keep(f, put(g, d->p->ssm_a, u->prm, n_prm * sizeof(float)));
    g->dn = dn;
    g->zeros_n = TERN_MAX(g->zeros_n, TERN_MAX(tern_deltanet_state_floats(dn), (dn->n_conv - 1) * C));
}

static void up_output(const struct model_step *f, const struct mat *out_w, const float *norm_w, float eps,
                      const struct model_act *x, struct model_act *xb) {
    (void)eps, (void)x, (void)xb;
    up_keep(f, put_vec(UP(f)->g, norm_w, out_w->k));
    up_keep(f, put_mat(UP(f)->g, out_w));
}

static void up_hidden_out(const struct model_step *f, const float *norm_w, float eps, const struct model_act *x) {
    (void)eps, (void)x;
    struct tern_gpu *g = UP(f)->g;
    if (!f->m->info.has_mtp) return; /* no head reads it */
    up_keep(f, put_vec(g, norm_w, f->m->hp.n_embd));
    if (!g->hid) up_keep(f, scratch(g, (size_t)g->n_chunk * f->m->hp.n_embd, &g->hid));
}

static const struct model_ops upload_ops = {
    .acts_new = up_acts_new,
    .act_free = up_act_free,
    .moe_ws_new = up_moe_ws_new,
    .moe_ws_free = up_moe_ws_free,
    .embed = up_embed,
    .rope_angles = up_rope_angles,
    .hidden_in = up_hidden_in,
    .matmul = up_matmul,
    .rmsnorm = up_rmsnorm,
    .rmsnorm_heads = up_rmsnorm_heads,
    .add_bias = up_add_bias,
    .add = up_add,
    .swiglu = up_swiglu,
    .sigmoid_mul = up_sigmoid_mul,
    .split_heads = up_split_heads,
    .concat_rows = up_concat_rows,
    .rope = up_rope,
    .moe = up_moe,
    .attention = up_attention,
    .deltanet = up_deltanet,
    .output = up_output,
    .hidden_out = up_hidden_out,
};
#undef UP

/* The weights g->m's forward names, uploaded: the forward run once over one row. */
static enum tern_status upload_weights(struct tern_gpu *g) {
    const struct tern_model *m = g->m;
    struct gpu_upload u = {.g = g};
    const struct model_backend be = {&upload_ops, &u};
    void *rs = NULL;
    enum tern_status st = m->arch->state_new(m, &be, 1, &rs);
    if (!st) {
        static float no_logits; /* output's target: the pass writes nothing */
        const int32_t tok = 0;
        const struct model_seq seq = {.n = 1, .want = true};
        const struct model_batch b = {.toks = &tok, .n = 1, .seq = &seq, .n_seq = 1, .logits = &no_logits};
        const struct model_step f = {&upload_ops, &u, m, &b};
        m->arch->forward(&f, rs);
        st = u.st;
    }
    if (rs) m->arch->state_free(rs);
    free(u.prm);
    if (!st && g->zeros_n && !(g->zeros = tern_calloc(g->zeros_n, sizeof(float))))
        st = tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    return st;
}

/* The device-local bytes of g's device (0: unknown, nothing is checked). */
static uint64_t device_bytes(const struct tern_gpu *g) { return tern_vk_info(g->vk)->device_local_bytes; }

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

/* Partial offload's auto: the routed experts of the last layers uploaded, last first,
 * while they fit with the model's reserve (a session's state) left free beside the weights
 * and scratch already on the device; the first layers' stay in host memory. A device
 * that does not say its memory takes them all. */
static enum tern_status offload_auto(struct tern_gpu *g) {
    const uint64_t have = device_bytes(g), reserve = g->m->cpu_moe_reserve;
    uint64_t used = used_bytes(g);
    uint32_t n = have ? g->n_moe_l : 0;
    for (; n > 0; n--) {
        const uint64_t b = expert_bytes(&g->moe_hp, &g->moe_l[n - 1]);
        if (used + b + reserve > have) break;
        used += b;
    }
    const uint32_t was = g->n_host;
    g->n_host = n;
    if (!n && g->moe_ws) { /* every layer's experts on the device: no host half */
        host_moe_free(g->moe_ws->host);
        g->moe_ws->host = NULL;
    }
    enum tern_status st = TERN_OK;
    for (uint32_t il = n; il < was && il < g->n_moe_l && !st; il++)
        if (g->moe_l[il].gate.data) st = upload_experts(g, &g->moe_hp, &g->moe_l[il]);
    qsort(g->wt, g->n_wt, sizeof *g->wt, weight_cmp);
    return st;
}

uint32_t tern_gpu_layers(const struct tern_gpu *g) { return g->gpu_layers; }

void tern_gpu_cpu_moe(const struct tern_gpu *g, uint32_t *n_host, uint32_t *n_moe) {
    uint32_t h = 0, t = 0;
    for (uint32_t il = 0; il < g->n_moe_l; il++) {
        if (!g->moe_l[il].gate.data) continue;
        t++;
        if (il < g->n_host) h++;
    }
    *n_host = h;
    *n_moe = t;
}

/* --gpu-layers auto: everything but the layers' matrices (and their experts) is on the
 * device; the layers' are uploaded in order, first layer first, while they fit beside
 * the model's reserve (a session's state); the rest stay in host memory. A device that
 * does not say its memory takes them all. */
static enum tern_status layers_auto(struct tern_gpu *g) {
    const uint64_t have = device_bytes(g), reserve = g->m->gpu_layers_reserve;
    uint64_t used = used_bytes(g);
    uint32_t top = 0; /* layers with host matrices: [0, top) */
    for (uint32_t i = 0; i < g->n_host_mats; i++) top = TERN_MAX(top, tensor_layer(g->host_mats[i]->name) + 1);
    uint32_t n = 0;
    for (; n < top; n++) {
        uint64_t b = 0;
        for (uint32_t i = 0; i < g->n_host_mats; i++)
            if (tensor_layer(g->host_mats[i]->name) == n) b += (uint64_t)g->host_mats[i]->n * g->host_mats[i]->row_bytes;
        if (n < g->n_moe_l && n >= g->n_host) b += expert_bytes(&g->moe_hp, &g->moe_l[n]);
        if (have && used + b + reserve > have) break;
        used += b;
    }
    g->gpu_layers = n == top ? UINT32_MAX : n;
    /* upload what now belongs on the device; the rest is noted again */
    const struct mat **hm = g->host_mats;
    const uint32_t nh = g->n_host_mats;
    g->host_mats = NULL;
    g->n_host_mats = g->cap_host_mats = 0;
    g->host_mat_bytes = 0;
    g->hm_k = g->hm_n = g->hm_rb = 0;
    enum tern_status st = TERN_OK;
    for (uint32_t i = 0; i < nh && !st; i++) st = put_mats(g, hm[i], 0, 1);
    free(hm);
    for (uint32_t il = g->n_host; il < n && il < g->n_moe_l && !st; il++)
        if (g->moe_l[il].gate.data) st = upload_experts(g, &g->moe_hp, &g->moe_l[il]);
    bool host_moe = false;
    for (uint32_t il = 0; il < g->n_moe_l; il++) host_moe |= host_experts(g, &g->moe_l[il]);
    if (!host_moe && g->moe_ws) { /* every layer's experts on the device: no host half */
        host_moe_free(g->moe_ws->host);
        g->moe_ws->host = NULL;
    }
    qsort(g->wt, g->n_wt, sizeof *g->wt, weight_cmp);
    return st;
}

/* The host half of --gpu-layers, for the matrices upload_weights kept in host memory. */
static enum tern_status host_mm_new(struct tern_gpu *g) {
    struct host_mm *h = g->hmm = tern_calloc(1, sizeof *h);
    if (!h) return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    const size_t n = g->n_chunk;
    h->s.m = (struct tern_model *)(uintptr_t)g->m; /* the pool: read only */
    h->s.rs_chunk = g->n_chunk;
    for (int i = 0; i < MODEL_MAX_ACT_KINDS; i++)
        if (!(h->s.act[i] = tern_aligned_alloc(n * (g->hm_rb ? g->hm_rb : 1))))
            return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    h->x = tern_aligned_alloc(n * g->hm_k * sizeof(float));
    h->y = tern_aligned_alloc(4 * n * g->hm_n * sizeof(float));
    if (!h->x || !h->y) return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    TERN_LOG_DEBUG("gpu: %u matrices (%.1f MiB) of layers %u.. in host memory, on the CPU", g->n_host_mats,
                   (double)g->host_mat_bytes / 1048576.0, g->gpu_layers);
    return TERN_OK;
}

/* tern_gpu_new, or with parent an MTP head's (its arch qwen35-mtp). */
static enum tern_status gpu_make(struct tern_vk *vk, const struct tern_model *m, const struct tern_gpu *parent,
                                 uint32_t n_chunk, struct tern_gpu **out) {
    *out = NULL;
    const bool head = parent != NULL;
    const struct model_hparams *hp = &m->hp;
    if (hp->head_dim_k > 256 || hp->head_dim_k % 2 || hp->head_dim_v != hp->head_dim_k)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "gpu: heads of %u/%u (the Vulkan attention takes equal K and V heads "
                                                 "of an even size, at most 256)", hp->head_dim_k, hp->head_dim_v);
    if (n_chunk == 0 || n_chunk > 65535)
        return tern_errorf(TERN_ERR_INVALID, "gpu: chunk %u must be positive (at most 65535)", n_chunk);
    /* Before anything is allocated: the weights alone against the device's memory. */
    const uint64_t have = tern_vk_info(vk)->device_local_bytes;
    if (!head && have && !m->cpu_moe_req && !m->gpu_layers_set && m->info.weight_bytes > have)
        return tern_errorf(TERN_ERR_NOMEM, "gpu: %s: the weights need %.1f MiB, but device '%s' has %.1f MiB of "
                                           "device-local memory", m->name, mib(m->info.weight_bytes),
                           tern_vk_info(vk)->name, mib(have));
    struct tern_gpu *g = tern_calloc(1, sizeof *g);
    if (!g) return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    g->mu = parent ? parent->mu : &g->own_mu;
    if (!parent) pthread_mutex_init(&g->own_mu, NULL);
    g->parent = parent;
    g->vk = vk;
    g->m = m;
    g->n_chunk = n_chunk;
    g->auto_layers = m->gpu_layers_set && m->gpu_layers == TERN_GPU_LAYERS_AUTO && !head &&
                     m->cpu_moe_req != TERN_CPU_MOE_AUTO; /* (one auto at a time: the CLI refuses both) */
    /* auto: every layer's matrices in host memory until the rest is on the device */
    g->gpu_layers = head                                                  ? parent->gpu_layers
                    : !m->gpu_layers_set || m->gpu_layers == TERN_GPU_LAYERS_AUTO ? (g->auto_layers ? 0 : UINT32_MAX)
                                                                          : m->gpu_layers;
    enum tern_status st = TERN_OK;
    g->host_x = tern_malloc((size_t)n_chunk * hp->n_embd * sizeof(float));
    g->host_cs = tern_malloc((size_t)n_chunk * hp->rope.n_rot * sizeof(float) + sizeof(float));
    g->host_toks = tern_malloc((size_t)n_chunk * sizeof *g->host_toks);
    if (!g->host_x || !g->host_cs || !g->host_toks) st = tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    /* (a head's caller holds the main model's lock: one Vulkan context) */
    if (!st) st = upload_weights(g);
    if (!st) qsort(g->wt, g->n_wt, sizeof *g->wt, weight_cmp);
    const struct model_backend be = {&gpu_ops, g};
    if (!st) st = m->arch->state_new(m, &be, n_chunk, &g->rs);
    if (!st) st = scratch(g, (size_t)n_chunk * hp->n_vocab, &g->logits);
    if (!st && g->auto_moe) st = offload_auto(g);
    if (!st && g->auto_layers) st = layers_auto(g);
    if (!st && g->n_host_mats) st = host_mm_new(g);
    if (st) {
        tern_error_prefix(st, "gpu: %s", m->name);
        tern_gpu_free(g);
        return st;
    }
    *out = g;
    return TERN_OK;
}

enum tern_status tern_gpu_new(struct tern_vk *vk, const struct tern_model *m, uint32_t n_chunk, struct tern_gpu **out) {
    return gpu_make(vk, m, NULL, n_chunk, out);
}

enum tern_status tern_gpu_head(struct tern_gpu *main, const struct tern_model *view, uint32_t n_chunk,
                               struct tern_gpu **out) {
    *out = NULL;
    pthread_mutex_lock(main->mu);
    enum tern_status st = TERN_OK;
    if (!main->head) {
        /* its own copy of the view (the caller's lives as long as one request) */
        struct tern_model *hm = tern_malloc(sizeof *hm);
        struct model_layer *hl = tern_malloc((view->n_layer ? view->n_layer : 1) * sizeof *hl);
        if (!hm || !hl) st = tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
        if (!st) {
            *hm = *view;
            memcpy(hl, view->layers, view->n_layer * sizeof *hl);
            hm->layers = hl;
            st = gpu_make(main->vk, hm, main, n_chunk, &main->head);
        }
        if (st) {
            free(hm);
            free(hl);
        } else {
            main->head_m = hm;
            if (main->head->n_host)
                TERN_LOG_INFO("gpu: the MTP head's routed experts in host memory, on the CPU (as the model's)");
        }
    }
    *out = main->head;
    pthread_mutex_unlock(main->mu);
    return st;
}

struct tern_vk *tern_gpu_vk(const struct tern_gpu *g) { return g->vk; }

uint32_t tern_gpu_n_chunk(const struct tern_gpu *g) { return g->n_chunk; }
size_t tern_gpu_bytes(const struct tern_gpu *g) { return g->bytes; }

/* Bytes of one KV page of attention layer L (K or V: the device's heads are square). */
static size_t kv_page_bytes(const struct model_layer *L, bool f16_kv) {
    return (size_t)TERN_VK_KV_PAGE * L->n_kv_head * L->head_dim_k * (f16_kv ? 2 : 4);
}

static uint32_t pages_of(uint32_t n_pos) { return (n_pos + TERN_VK_KV_PAGE - 1) / TERN_VK_KV_PAGE; }

/* Device bytes of n_pages KV pages in every attention layer (K and V), plus the
 * recurrent parts when rec. */
static size_t state_bytes_of(const struct tern_gpu *g, uint32_t n_pages, bool f16_kv, bool rec) {
    const struct tern_model *m = g->m;
    size_t b = 0;
    for (uint32_t il = 0; il < m->n_layer; il++) {
        const struct model_layer *L = &m->layers[il];
        if (L->kind == LAYER_ATTN) b += 2 * (size_t)n_pages * kv_page_bytes(L, f16_kv);
        else if (rec) b += L->rec_bytes;
    }
    return b;
}

size_t tern_gpu_state_need(const struct tern_gpu *g, uint32_t n_ctx, bool f16_kv) {
    return state_bytes_of(g, pages_of(n_ctx), f16_kv, true);
}

void tern_gpu_state_free(struct tern_gpu_state *st) {
    if (!st) return;
    struct tern_gpu *g = st->g;
    pthread_mutex_lock(g->mu);
    for (uint32_t il = 0; il < g->m->n_layer; il++) {
        if (st->kc) tern_vk_buf_free(st->kc[il]);
        if (st->vc) tern_vk_buf_free(st->vc[il]);
        if (st->win) tern_vk_buf_free(st->win[il]);
        if (st->S) tern_vk_buf_free(st->S[il]);
    }
    for (uint32_t il = 0; il < g->m->n_layer && st->tw; il++) {
        tern_vk_buf_free(st->tw[il]);
        tern_vk_buf_free(st->tS[il]);
    }
    g->state_bytes -= st->bytes;
    pthread_mutex_unlock(g->mu);
    free(st->tw);
    free(st->tS);
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
    const size_t need = state_bytes_of(g, 0, f16_kv, true); /* the recurrent parts; KV pages come with use */
    const uint64_t have = device_bytes(g);
    pthread_mutex_lock(g->mu);
    const size_t used = used_bytes(g), ckb = g->ckpt_bytes;
    pthread_mutex_unlock(g->mu);
    if (have && used + (uint64_t)need > have)
        return tern_errorf(TERN_ERR_NOMEM,
                           "gpu: a session needs %.1f MiB of device memory for its recurrent state, but device '%s' "
                           "has %.1f MiB left of %.1f MiB (weights and scratch %.1f MiB, other sessions %.1f MiB, "
                           "checkpoints %.1f MiB)",
                           mib(need), tern_vk_info(g->vk)->name, mib(have > used ? have - used : 0), mib(have),
                           mib(g->bytes), mib(used - g->bytes - ckb), mib(ckb));
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
    pthread_mutex_lock(g->mu);
    for (uint32_t il = 0; il < m->n_layer && !s; il++) {
        const struct model_layer *L = &m->layers[il];
        if (L->kind != LAYER_RECURRENT) continue;
        /* the CPU's "conv" and "ssm" buffers, byte for byte */
        const struct tern_deltanet_shape *dn = g->dn;
        if (!dn || L->n_bufs != 2 || L->bufs[0].bytes != (dn->n_conv - 1) * tern_deltanet_channels(dn) * sizeof(float) ||
            L->bufs[1].bytes != tern_deltanet_state_floats(dn) * sizeof(float) ||
            TERN_MAX(L->bufs[0].bytes, L->bufs[1].bytes) > g->zeros_n * sizeof(float)) {
            s = tern_errorf(TERN_ERR_INTERNAL, "gpu: layer %u's recurrent buffers do not match the device's", il);
            break;
        }
        s = tern_vk_buf_new(g->vk, L->bufs[0].bytes, &st->win[il]);
        if (!s) s = tern_vk_buf_new(g->vk, L->bufs[1].bytes, &st->S[il]);
        if (!s) st->bytes += L->rec_bytes;
    }
    if (!s) s = rec_upload_locked(g, st, NULL);
    g->state_bytes += st->bytes;
    pthread_mutex_unlock(g->mu);
    if (s) {
        tern_error_prefix(s, "gpu: a session's state (%.1f MiB)", mib(need));
        tern_gpu_state_free(st);
        return s;
    }
    *out = st;
    return TERN_OK;
}

/* Layer il's K or V cache re-laid as n_pages pages (g->mu held): a new buffer, the pages
 * both hold copied into it on the device, the old one freed (n_pages 0: freed). Checked
 * against the device's memory first (the old pages and the new buffer exist together for
 * the copy); on error the layer keeps what it had. */
static enum tern_status kv_layer_relay(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t il, bool v,
                                       uint32_t n_pages, uint64_t have) {
    const struct model_layer *L = &g->m->layers[il];
    struct tern_vk_buf **slot = v ? &st->vc[il] : &st->kc[il];
    const size_t pb = kv_page_bytes(L, st->f16_kv), had = *slot ? tern_vk_buf_bytes(*slot) : 0;
    const size_t b = (size_t)n_pages * pb;
    if (b == had) return TERN_OK;
    struct tern_vk_buf *nb = NULL;
    if (b) {
        if (have && used_bytes(g) + (uint64_t)b > have)
            return tern_errorf(TERN_ERR_NOMEM,
                               "gpu: re-laying layer %u's KV cache as %u positions needs %.1f MiB of device memory "
                               "while its %.1f MiB are copied, but device '%s' has %.1f MiB left of %.1f MiB",
                               il, n_pages * TERN_VK_KV_PAGE, mib(b), mib(had), tern_vk_info(g->vk)->name,
                               mib(have > used_bytes(g) ? have - used_bytes(g) : 0), mib(have));
        enum tern_status s = tern_vk_buf_new(g->vk, b, &nb);
        if (!s && had) s = tern_vk_copy(g->vk, *slot, 0, nb, 0, had < b ? had : b); /* its own submit */
        if (s) {
            tern_vk_buf_free(nb);
            return s;
        }
    }
    tern_vk_buf_free(*slot);
    *slot = nb;
    st->bytes = st->bytes + b - had;
    g->state_bytes = g->state_bytes + b - had;
    return TERN_OK;
}

enum tern_status tern_gpu_state_reserve(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t n_pos) {
    TERN_ASSERT(st->g == g);
    if (n_pos > st->n_ctx)
        return tern_errorf(TERN_ERR_RANGE, "gpu: %u positions exceed the state's context of %u", n_pos, st->n_ctx);
    const uint32_t need = pages_of(n_pos), cap = pages_of(st->n_ctx);
    if (need <= st->n_pages) return TERN_OK;
    /* a quarter more than it had (within the context), so that a growing conversation
     * copies its cache O(log n) times; exactly what is asked when that does not fit */
    uint32_t want = st->n_pages + st->n_pages / 4;
    want = want < need ? need : want > cap ? cap : want;
    const uint64_t have = device_bytes(g);
    enum tern_status s = TERN_OK;
    pthread_mutex_lock(g->mu);
    const size_t more = state_bytes_of(g, need, st->f16_kv, false) - state_bytes_of(g, st->n_pages, st->f16_kv, false);
    if (have && used_bytes(g) + (uint64_t)more > have) {
        s = tern_errorf(TERN_ERR_NOMEM,
                        "gpu: a session's KV cache of %u positions needs %.1f MiB more device memory, but device '%s' "
                        "has %.1f MiB left of %.1f MiB (weights and scratch %.1f MiB, sessions %.1f MiB, checkpoints "
                        "%.1f MiB)",
                        need * TERN_VK_KV_PAGE, mib(more), tern_vk_info(g->vk)->name,
                        mib(have > used_bytes(g) ? have - used_bytes(g) : 0), mib(have), mib(g->bytes),
                        mib(g->state_bytes), mib(g->ckpt_bytes));
        pthread_mutex_unlock(g->mu);
        return s;
    }
    for (int pass = 0; pass < 2; pass++) {
        const uint32_t n = pass ? need : want;
        s = TERN_OK;
        for (uint32_t il = 0; il < g->m->n_layer && !s; il++) {
            if (g->m->layers[il].kind != LAYER_ATTN) continue;
            /* a layer a failed first pass already grew keeps its pages */
            const size_t b = (size_t)n * kv_page_bytes(&g->m->layers[il], st->f16_kv);
            if (!st->kc[il] || tern_vk_buf_bytes(st->kc[il]) < b) s = kv_layer_relay(g, st, il, false, n, have);
            if (!s && (!st->vc[il] || tern_vk_buf_bytes(st->vc[il]) < b)) s = kv_layer_relay(g, st, il, true, n, have);
        }
        if (!s) {
            st->n_pages = n;
            break;
        }
        if (s != TERN_ERR_NOMEM || want == need) break;
    }
    pthread_mutex_unlock(g->mu);
    return s;
}

void tern_gpu_state_shrink(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t n_pos) {
    TERN_ASSERT(st->g == g);
    const uint32_t keep = pages_of(n_pos), cap = pages_of(st->n_ctx);
    /* what a growth from keep pages would hold, and a page: a session rewound a little (a
     * rejected draft across a page boundary, a turn that re-reads its last answer) keeps
     * its room and copies nothing */
    uint32_t room = keep + keep / 4 + 1;
    room = room > cap ? cap : room;
    if (st->n_pages <= room) return;
    const uint64_t have = device_bytes(g);
    enum tern_status s = TERN_OK;
    pthread_mutex_lock(g->mu);
    for (uint32_t il = 0; il < g->m->n_layer && !s; il++) {
        if (g->m->layers[il].kind != LAYER_ATTN) continue;
        s = kv_layer_relay(g, st, il, false, keep, have);
        if (!s) s = kv_layer_relay(g, st, il, true, keep, have);
    }
    /* a layer the device had no room to re-lay keeps all its pages, [0, keep) among them */
    if (s) TERN_LOG_DEBUG("gpu: a session's KV pages were not all given back (%s)", tern_last_error());
    st->n_pages = keep;
    pthread_mutex_unlock(g->mu);
}

enum tern_status tern_gpu_rec_upload(struct tern_gpu *g, struct tern_gpu_state *st, const void *rec) {
    pthread_mutex_lock(g->mu);
    enum tern_status s = rec_upload_locked(g, st, rec);
    pthread_mutex_unlock(g->mu);
    return s;
}

enum tern_status tern_gpu_rec_download(struct tern_gpu *g, struct tern_gpu_state *st, void *rec) {
    const struct tern_model *m = g->m;
    enum tern_status s = TERN_OK;
    pthread_mutex_lock(g->mu);
    for (uint32_t il = 0; il < m->n_layer && !s; il++) {
        const struct model_layer *L = &m->layers[il];
        if (L->kind != LAYER_RECURRENT) continue;
        uint8_t *blk = (uint8_t *)rec + L->rec_offset;
        s = tern_vk_download(st->win[il], 0, blk + L->bufs[0].offset, L->bufs[0].bytes);
        if (!s) s = tern_vk_download(st->S[il], 0, blk + L->bufs[1].offset, L->bufs[1].bytes);
    }
    pthread_mutex_unlock(g->mu);
    return s;
}

/* Rows [p0, p1) of layer il's K or V between the cache's pages and buf's head runs (up:
 * into the pages). The pages that hold them go through one host copy (downloaded, and for
 * an upload patched and uploaded again: the rows of those pages outside [p0, p1) stay). */
static enum tern_status kv_copy(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t il, bool v, uint32_t p0,
                                uint32_t p1, uint8_t *buf, size_t run_bytes, bool up) {
    const struct model_layer *L = &g->m->layers[il];
    TERN_ASSERT(L->kind == LAYER_ATTN && p0 <= p1 && p1 <= st->n_pages * TERN_VK_KV_PAGE);
    if (p0 == p1) return TERN_OK;
    const size_t row = (size_t)L->head_dim_k * (st->f16_kv ? 2 : 4), pb = kv_page_bytes(L, st->f16_kv);
    const uint32_t pg0 = p0 / TERN_VK_KV_PAGE, pg1 = pages_of(p1);
    uint8_t *tmp = tern_malloc((size_t)(pg1 - pg0) * pb);
    if (!tmp) return tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory for %u KV pages", pg1 - pg0);
    struct tern_vk_buf *b = v ? st->vc[il] : st->kc[il];
    pthread_mutex_lock(g->mu);
    enum tern_status s = tern_vk_download(b, (size_t)pg0 * pb, tmp, (size_t)(pg1 - pg0) * pb);
    for (uint32_t pos = p0; pos < p1 && !s;) {
        const uint32_t pg = pos / TERN_VK_KV_PAGE, in = pos % TERN_VK_KV_PAGE;
        const uint32_t rows = TERN_MIN(TERN_VK_KV_PAGE - in, p1 - pos);
        for (uint32_t h = 0; h < L->n_kv_head; h++) {
            uint8_t *mem = tmp + (size_t)(pg - pg0) * pb + ((size_t)h * TERN_VK_KV_PAGE + in) * row;
            uint8_t *run = buf + h * run_bytes + (size_t)(pos - p0) * row;
            if (up) memcpy(mem, run, rows * row);
            else memcpy(run, mem, rows * row);
        }
        pos += rows;
    }
    if (!s && up) s = tern_vk_upload(b, (size_t)pg0 * pb, tmp, (size_t)(pg1 - pg0) * pb);
    pthread_mutex_unlock(g->mu);
    free(tmp);
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

/* One step of rows over k sequences (g->step_seq, g->step_S, g->step_io, g->step_done;
 * g->step_seq's rows of g->host_toks; g->mu held): the architecture's forward on the
 * device, one command buffer, one submit; then the hidden rows the sequences capture are
 * read back. The wanted rows' logits are then rows 0.. of g->logits. */
static enum tern_status step_run(struct tern_gpu *g, uint32_t k, uint32_t rows) {
    const struct tern_model *m = g->m;
    /* the GPU's output reads the sequences' want and all, not the batch's host logits */
    const struct model_batch b = {.toks = g->host_toks, .n = rows, .seq = g->step_seq, .n_seq = k, .logits = NULL};
    struct gpu_step p = {.g = g, .S = g->step_S, .io = g->step_io, .done = g->step_done, .n = rows};
    const struct model_step f = {&gpu_ops, &p, m, &b};
    m->arch->forward(&f, g->rs);
    if (!p.st && p.recording) {
        p.st = tern_vk_end(g->vk);
    } else if (p.recording) {
        /* close the recording (a failed operation may have ended it already) and keep the
         * failure's message, not tern_vk_end's */
        char why[512];
        snprintf(why, sizeof why, "%s", tern_last_error());
        (void)tern_vk_end(g->vk);
        return tern_errorf(p.st, "%s", why);
    }
    if (p.st || !p.hid_rows) return p.st;
    const size_t E = m->hp.n_embd;
    for (uint32_t j = 0; j < k && !p.st; j++) {
        const struct model_seq *q = &g->step_seq[j];
        const struct tern_gpu_io *io = g->step_io[j];
        if (!io || !io->hidden_out || q->pos0 + q->n <= io->hidden_pos0) continue;
        const uint32_t skip = q->pos0 < io->hidden_pos0 ? io->hidden_pos0 - q->pos0 : 0;
        p.st = tern_vk_download(g->hid, (size_t)(q->row0 + skip) * E * sizeof(float),
                                io->hidden_out + (size_t)(q->pos0 + skip - io->hidden_pos0) * E,
                                (size_t)(q->n - skip) * E * sizeof(float));
    }
    return p.st;
}

/* The batch's sequences in steps of at most n_chunk rows (g->mu held). */
static enum tern_status eval_locked(struct tern_gpu *g, const struct tern_gpu_seq *seqs, uint32_t n_seq,
                                    uint32_t n_chunk) {
    const size_t nv = g->m->hp.n_vocab, lb = nv * sizeof(float);
    enum tern_status st = TERN_OK;
    uint32_t i = 0, done = 0; /* the next row: row done of sequence i */
    while (!st) {
        while (i < n_seq && done == seqs[i].n) i++, done = 0;
        if (i == n_seq) break;
        /* Fill the step: the rest of sequence i, then the next ones, up to n_chunk rows; a
         * sequence cut at the step's end goes on in the next (a chunk boundary, which
         * changes no bits). */
        uint32_t k = 0, rows = 0;
        while (i < n_seq && rows < n_chunk) {
            const struct tern_gpu_seq *q = &seqs[i];
            const uint32_t take = q->n - done < n_chunk - rows ? q->n - done : n_chunk - rows;
            if (take) {
                g->step_seq[k] = (struct model_seq){.row0 = rows, .n = take, .pos0 = q->pos0 + done,
                                                    .want = q->logits && (q->all || done + take == q->n),
                                                    .all = q->all};
                g->step_S[k] = q->st;
                g->step_io[k] = q->io;
                g->step_src[k] = i;
                g->step_done[k] = done;
                memcpy(g->host_toks + rows, q->toks + done, take * sizeof *q->toks);
                k++;
                rows += take;
                done += take;
            }
            if (done == q->n) i++, done = 0;
        }
        if ((st = step_run(g, k, rows))) break;
        /* the wanted rows, in the step's order */
        size_t o = 0;
        for (uint32_t j = 0; j < k && !st; j++) {
            const struct model_seq *sq = &g->step_seq[j];
            const struct tern_gpu_seq *q = &seqs[g->step_src[j]];
            if (!sq->want) continue;
            if (q->all) {
                st = tern_vk_download(g->logits, o * lb, q->logits + (size_t)g->step_done[j] * nv, sq->n * lb);
                o += sq->n;
            } else {
                st = tern_vk_download(g->logits, o * lb, q->logits, lb);
                o++;
            }
        }
    }
    return st;
}

enum tern_status tern_gpu_eval_batch(struct tern_gpu *g, const struct tern_gpu_seq *seqs, uint32_t n_seq,
                                     uint32_t n_chunk) {
    if (n_seq > MODEL_MAX_SEQS)
        return tern_errorf(TERN_ERR_INVALID, "gpu: a step holds at most %d sequences, not %u", MODEL_MAX_SEQS, n_seq);
    for (uint32_t i = 0; i < n_seq; i++) {
        const struct tern_gpu_seq *q = &seqs[i];
        TERN_ASSERT(q->st && q->st->g == g && q->pos0 + (uint64_t)q->n <= q->st->n_ctx && (q->toks || !q->n));
        /* the pages of its positions (a caller that reserved them finds them there) */
        enum tern_status s = tern_gpu_state_reserve(g, q->st, q->pos0 + q->n);
        if (s) return tern_error_prefix(s, "gpu: sequence %u of a step", i);
        TERN_ASSERT(!q->io || !q->io->trail || !g->m->rec_bytes || q->io->slot0 + (uint64_t)q->n <= q->st->trail_cap);
        /* two parts of one state in a step would each read the state as it was before
         * the step's other part */
        for (uint32_t j = 0; j < i; j++)
            if (seqs[j].st == q->st)
                return tern_errorf(TERN_ERR_INVALID, "gpu: sequences %u and %u of a step are one state", j, i);
    }
    if (n_chunk == 0 || n_chunk > g->n_chunk) n_chunk = g->n_chunk;
    /* the scratch is shared by every state: one step at a time */
    pthread_mutex_lock(g->mu);
    const enum tern_status st = eval_locked(g, seqs, n_seq, n_chunk);
    pthread_mutex_unlock(g->mu);
    return st;
}

enum tern_status tern_gpu_eval_io(struct tern_gpu *g, struct tern_gpu_state *S, uint32_t pos0, const int32_t *toks,
                                  uint32_t n, uint32_t n_chunk, float *logits, bool logits_all,
                                  const struct tern_gpu_io *io) {
    TERN_ASSERT(S->g == g && pos0 + (uint64_t)n <= S->n_ctx);
    /* One sequence: its chunks are the steps, and only the wanted rows are projected (the
     * last token's, unless logits_all), so the chunk's other rows cost no output matmul. */
    const struct tern_gpu_seq q = {.st = S, .pos0 = pos0, .toks = toks, .n = n, .logits = logits, .all = logits_all,
                                   .io = io};
    return tern_gpu_eval_batch(g, &q, 1, n_chunk);
}

enum tern_status tern_gpu_eval(struct tern_gpu *g, struct tern_gpu_state *S, uint32_t pos0, const int32_t *toks,
                               uint32_t n, uint32_t n_chunk, float *logits, bool logits_all) {
    return tern_gpu_eval_io(g, S, pos0, toks, n, n_chunk, logits, logits_all, NULL);
}

/* Frees st's trail buffers (g->mu held); their bytes are st's. */
static void trail_free_locked(struct tern_gpu *g, struct tern_gpu_state *st) {
    const size_t b = (size_t)st->trail_cap * g->m->rec_bytes;
    for (uint32_t il = 0; il < g->m->n_layer && st->tw; il++) {
        tern_vk_buf_free(st->tw[il]);
        tern_vk_buf_free(st->tS[il]);
        st->tw[il] = st->tS[il] = NULL;
    }
    st->trail_cap = 0;
    st->bytes -= b;
    g->state_bytes -= b;
}

enum tern_status tern_gpu_trail_reserve(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t n) {
    const struct tern_model *m = g->m;
    const size_t rb = m->rec_bytes;
    if (!rb || n <= st->trail_cap) return TERN_OK;
    const size_t need = (size_t)n * rb, had = (size_t)st->trail_cap * rb;
    const uint64_t have = device_bytes(g);
    pthread_mutex_lock(g->mu);
    const size_t used = used_bytes(g) - had;
    enum tern_status s = TERN_OK;
    if (have && used + (uint64_t)need > have)
        s = tern_errorf(TERN_ERR_NOMEM, "gpu: a state trail of %u positions (%.1f MiB) does not fit the %.1f MiB left "
                                        "of device '%s'", n, mib(need), mib(have > used ? have - used : 0),
                        tern_vk_info(g->vk)->name);
    if (!s && !st->tw) {
        st->tw = tern_calloc(m->n_layer, sizeof *st->tw);
        st->tS = tern_calloc(m->n_layer, sizeof *st->tS);
        if (!st->tw || !st->tS) s = tern_errorf(TERN_ERR_NOMEM, "gpu: out of memory");
    }
    /* what it held is lost: a trail grows only before an eval that fills it */
    if (!s) trail_free_locked(g, st);
    for (uint32_t il = 0; il < m->n_layer && !s; il++) {
        const struct model_layer *L = &m->layers[il];
        if (L->kind != LAYER_RECURRENT) continue;
        s = tern_vk_buf_new(g->vk, (size_t)n * L->bufs[0].bytes, &st->tw[il]);
        if (!s) s = tern_vk_buf_new(g->vk, (size_t)n * L->bufs[1].bytes, &st->tS[il]);
    }
    if (!s) {
        st->trail_cap = n;
        st->bytes += need;
        g->state_bytes += need;
    } else if (st->tw) {
        for (uint32_t il = 0; il < m->n_layer; il++) {
            tern_vk_buf_free(st->tw[il]);
            tern_vk_buf_free(st->tS[il]);
            st->tw[il] = st->tS[il] = NULL;
        }
    }
    pthread_mutex_unlock(g->mu);
    return s;
}

/* ---- copies on the device (fork, checkpoints) ---------------------------------------- */

/* Every copy below is recorded into one command buffer (one submit, one wait) under mu:
 * nothing goes through the host. */
#define COPY(src, so, dst, dof, n)                                                                                     \
    do {                                                                                                               \
        if (!s) s = tern_vk_copy(g->vk, (src), (so), (dst), (dof), (n));                                              \
    } while (0)

/* Takes mu and opens a recording for copies; on failure mu is not held. */
static enum tern_status copies_begin(struct tern_gpu *g) {
    pthread_mutex_lock(g->mu);
    const enum tern_status s = tern_vk_begin(g->vk);
    if (s) pthread_mutex_unlock(g->mu);
    return s;
}

/* Closes a recording after copies and gives mu back: tern_vk_end's status, or the
 * failure's message when a copy failed (a failed copy leaves the recording open: nothing
 * of it runs). */
static enum tern_status copies_end(struct tern_gpu *g, enum tern_status s) {
    if (!s) s = tern_vk_end(g->vk);
    else {
        char why[512];
        snprintf(why, sizeof why, "%s", tern_last_error());
        (void)tern_vk_end(g->vk);
        s = tern_errorf(s, "%s", why);
    }
    pthread_mutex_unlock(g->mu);
    return s;
}

enum tern_status tern_gpu_state_copy(struct tern_gpu *g, const struct tern_gpu_state *src, struct tern_gpu_state *dst,
                                     uint32_t p, bool rec) {
    const struct tern_model *m = g->m;
    TERN_ASSERT(src->g == g && dst->g == g && src->n_ctx == dst->n_ctx && src->f16_kv == dst->f16_kv &&
                p <= src->n_pages * TERN_VK_KV_PAGE);
    if (!p && (!rec || !m->rec_bytes)) return TERN_OK;
    enum tern_status s = tern_gpu_state_reserve(g, dst, p);
    if (s) return s;
    s = copies_begin(g);
    if (s) return s;
    for (uint32_t il = 0; il < m->n_layer; il++) {
        const struct model_layer *L = &m->layers[il];
        if (L->kind == LAYER_ATTN) {
            /* the pages of rows [0, p), whole: one copy each for K and V (the rows of the
             * last page beyond p are written before anything reads them) */
            const size_t b = (size_t)pages_of(p) * kv_page_bytes(L, src->f16_kv);
            COPY(src->kc[il], 0, dst->kc[il], 0, b);
            COPY(src->vc[il], 0, dst->vc[il], 0, b);
        } else if (L->kind == LAYER_RECURRENT && rec) {
            COPY(src->win[il], 0, dst->win[il], 0, L->bufs[0].bytes);
            COPY(src->S[il], 0, dst->S[il], 0, L->bufs[1].bytes);
        }
    }
    return copies_end(g, s);
}

size_t tern_gpu_ckpt_bytes(struct tern_gpu *g) {
    pthread_mutex_lock(g->mu);
    const size_t b = g->ckpt_bytes;
    pthread_mutex_unlock(g->mu);
    return b;
}

enum tern_status tern_gpu_rec_new(struct tern_gpu *g, struct tern_vk_buf **out) {
    *out = NULL;
    const size_t need = g->m->rec_bytes;
    const uint64_t have = device_bytes(g);
    pthread_mutex_lock(g->mu);
    const size_t used = used_bytes(g);
    enum tern_status s = TERN_OK;
    if (have && used + (uint64_t)need > have)
        s = tern_errorf(TERN_ERR_NOMEM, "gpu: a checkpoint of %.2f MiB does not fit the %.1f MiB left of device '%s'",
                        mib(need), mib(have > used ? have - used : 0), tern_vk_info(g->vk)->name);
    if (!s) s = tern_vk_buf_new(g->vk, need, out);
    if (!s) g->ckpt_bytes += need;
    pthread_mutex_unlock(g->mu);
    return s;
}

void tern_gpu_rec_free(struct tern_gpu *g, struct tern_vk_buf *b) {
    if (!b) return;
    pthread_mutex_lock(g->mu);
    tern_vk_buf_free(b);
    g->ckpt_bytes -= g->m->rec_bytes;
    pthread_mutex_unlock(g->mu);
}

/* The recurrent parts of st to (save) or from b, laid out as the recurrent block. */
static enum tern_status rec_move(struct tern_gpu *g, struct tern_gpu_state *st, struct tern_vk_buf *b, bool save) {
    const struct tern_model *m = g->m;
    TERN_ASSERT(st->g == g && tern_vk_buf_bytes(b) >= m->rec_bytes);
    enum tern_status s = copies_begin(g);
    if (s) return s;
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
    return copies_end(g, s);
}
#undef COPY

enum tern_status tern_gpu_rec_save(struct tern_gpu *g, const struct tern_gpu_state *st, struct tern_vk_buf *b) {
    return rec_move(g, (struct tern_gpu_state *)(uintptr_t)st, b, true);
}

enum tern_status tern_gpu_rec_load(struct tern_gpu *g, struct tern_gpu_state *st, const struct tern_vk_buf *b) {
    return rec_move(g, st, (struct tern_vk_buf *)(uintptr_t)b, false);
}

void tern_gpu_trail_release(struct tern_gpu *g, struct tern_gpu_state *st) {
    pthread_mutex_lock(g->mu);
    if (st->trail_cap) trail_free_locked(g, st);
    pthread_mutex_unlock(g->mu);
}

enum tern_status tern_gpu_trail_load(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t slot) {
    const struct tern_model *m = g->m;
    TERN_ASSERT(slot < st->trail_cap);
    enum tern_status s = copies_begin(g);
    if (s) return s;
    for (uint32_t il = 0; il < m->n_layer && !s; il++) {
        const struct model_layer *L = &m->layers[il];
        if (L->kind != LAYER_RECURRENT) continue;
        const size_t w = L->bufs[0].bytes, b = L->bufs[1].bytes;
        s = tern_vk_copy(g->vk, st->tw[il], slot * w, st->win[il], 0, w);
        if (!s) s = tern_vk_copy(g->vk, st->tS[il], slot * b, st->S[il], 0, b);
    }
    return copies_end(g, s);
}

enum tern_status tern_gpu_rec_read(struct tern_gpu *g, const struct tern_vk_buf *b, void *rec) {
    pthread_mutex_lock(g->mu);
    enum tern_status s = tern_vk_download((struct tern_vk_buf *)(uintptr_t)b, 0, rec, g->m->rec_bytes);
    pthread_mutex_unlock(g->mu);
    return s;
}
