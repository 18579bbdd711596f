/* Building blocks of forward passes, shared by every architecture: matmuls with
 * activation preparation, norms, embeddings, attention over the paged KV cache, logits.
 * Each splits its work across the pool by output rows, tokens or heads, never inside a
 * reduction (DESIGN.md §5). */
#include "model/model.h"

#include "util/fp16.h"
#include "util/mem.h"

#include <math.h>
#include <string.h>

/* ---- parallel loops ------------------------------------------------------------- */

struct pfor {
    struct tern_work work;
    model_item_fn fn;
    void *ctx;
};

static void pfor_task(void *ctx, int ith, int nth) {
    struct pfor *p = ctx;
    size_t i0, i1;
    while (tern_work_take(&p->work, &i0, &i1))
        for (size_t i = i0; i < i1; i++) p->fn(p->ctx, (uint32_t)i);
}

void model_parallel_for(struct tern_session *s, uint32_t n, model_item_fn fn, void *ctx) {
    if (n == 0) return;
    if (n == 1 || tern_threadpool_n_threads(s->m->pool) == 1) {
        for (uint32_t i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    struct pfor p = {.fn = fn, .ctx = ctx};
    tern_work_init(&p.work, n, 1);
    tern_threadpool_run_shared(s->m->pool, pfor_task, &p);
}

/* ---- matmul ---------------------------------------------------------------------- */

#define MM_MAX_OUTS 8

struct mm_task {
    struct tern_work work;
    uint32_t n_tok;
    size_t n_outs;
    const struct mm_out *outs;
    const void *act[MM_MAX_OUTS];
    size_t act_rb[MM_MAX_OUTS];
    size_t start[MM_MAX_OUTS + 1]; /* first row of each output in the concatenated row space */
};

static void mm_run_task(void *ctx, int ith, int nth) {
    struct mm_task *t = ctx;
    size_t i0, i1;
    while (tern_work_take(&t->work, &i0, &i1)) {
        for (size_t o = 0; o < t->n_outs; o++) {
            const size_t a = i0 > t->start[o] ? i0 : t->start[o];
            const size_t b = i1 < t->start[o + 1] ? i1 : t->start[o + 1];
            if (a >= b) continue;
            const struct mat *w = t->outs[o].w;
            tern_matmul(w->type, w->data, w->row_bytes, w->k, t->act[o], t->act_rb[o], t->n_tok, t->outs[o].y, w->n,
                        a - t->start[o], b - t->start[o]);
        }
    }
}

struct prep_task {
    enum tern_dtype wtype;
    const float *x;
    size_t k;
    void *out;
    size_t rb;
};

static void prep_item(void *ctx, uint32_t t) {
    struct prep_task *p = ctx;
    tern_act_prepare(p->wtype, p->x + (size_t)t * p->k, (char *)p->out + (size_t)t * p->rb, p->k);
}

void model_matmul(struct tern_session *s, const float *x, uint32_t n_tok, const struct mm_out *outs, size_t n_outs) {
    TERN_ASSERT(n_outs >= 1 && n_outs <= MM_MAX_OUTS && n_tok <= s->rs_chunk);
    struct mm_task t;
    memset(&t, 0, sizeof t);
    t.n_tok = n_tok;
    t.n_outs = n_outs;
    t.outs = outs;
    /* Prepare the input once per activation format (Q8_0 for the 32-blocks, Q8_K for
     * the K-quants, F32 for float weights: then x itself is the prepared form). */
    enum tern_dtype kinds[MODEL_MAX_ACT_KINDS];
    size_t n_kinds = 0;
    const size_t k = outs[0].w->k;
    for (size_t o = 0; o < n_outs; o++) {
        const struct mat *w = outs[o].w;
        TERN_ASSERT(w->k == k);
        const enum tern_dtype at = tern_act_type(w->type);
        const size_t rb = tern_act_row_bytes(w->type, k);
        t.act_rb[o] = rb;
        if (at == TERN_DTYPE_F32 && rb == k * sizeof(float)) {
            t.act[o] = x;
            continue;
        }
        size_t ki = 0;
        while (ki < n_kinds && kinds[ki] != at) ki++;
        if (ki == n_kinds) {
            TERN_ASSERT(n_kinds < MODEL_MAX_ACT_KINDS);
            kinds[n_kinds++] = at;
            struct prep_task p = {w->type, x, k, s->act[ki], rb};
            model_parallel_for(s, n_tok, prep_item, &p);
        }
        t.act[o] = s->act[ki];
    }
    size_t total = 0;
    for (size_t o = 0; o < n_outs; o++) {
        t.start[o] = total;
        total += outs[o].w->n;
    }
    t.start[n_outs] = total;
    const int nth = tern_threadpool_n_threads(s->m->pool);
    /* Blocks of whole 16-row groups, about 8 per thread: enough for threads that run at
     * different speeds to even out, few enough that taking one costs nothing. */
    size_t block = total / ((size_t)nth * 8);
    block = (block + 15) & ~(size_t)15;
    if (block < 16) block = 16;
    tern_work_init(&t.work, total, block);
    if (nth == 1) mm_run_task(&t, 0, 1);
    else tern_threadpool_run_shared(s->m->pool, mm_run_task, &t);
}

/* ---- norms, embeddings ---------------------------------------------------------- */

struct norm_task {
    const struct tern_ops *ops;
    float *y;
    const float *x;
    const float *w;
    uint32_t n;
    float eps;
};

static void norm_item(void *ctx, uint32_t t) {
    struct norm_task *p = ctx;
    p->ops->rmsnorm(p->y + (size_t)t * p->n, p->x + (size_t)t * p->n, p->w, p->n, p->eps);
}

void model_rmsnorm(struct tern_session *s, float *y, const float *x, const float *w, uint32_t n_tok, uint32_t n,
                   float eps) {
    struct norm_task p = {tern_ops(), y, x, w, n, eps};
    model_parallel_for(s, n_tok, norm_item, &p);
}

void model_rmsnorm_heads(struct tern_session *s, float *x, const float *w, uint32_t n_tok, uint32_t n_head,
                         uint32_t head_dim, float eps) {
    struct norm_task p = {tern_ops(), x, x, w, head_dim, eps};
    if (n_tok == 1) /* a decode step: too little work to hand out */
        for (uint32_t h = 0; h < n_head; h++) norm_item(&p, h);
    else
        model_parallel_for(s, n_tok * n_head, norm_item, &p);
}

void model_add_bias(float *x, const float *b, uint32_t n_tok, uint32_t n) {
    const struct tern_ops *ops = tern_ops();
    for (uint32_t t = 0; t < n_tok; t++) ops->add(x + (size_t)t * n, b, n);
}

void model_embed(struct tern_session *s, const struct mat *embd, const int32_t *toks, uint32_t n_tok, float *x) {
    (void)s;
    for (uint32_t t = 0; t < n_tok; t++)
        tern_dequantize_row(embd->type, (const char *)embd->data + (size_t)toks[t] * embd->row_bytes,
                            x + (size_t)t * embd->k, embd->k);
}

void model_logits(struct tern_session *s, const struct mat *out_w, const float *x, uint32_t n_tok, float *logits,
                  bool logits_all) {
    if (!logits || n_tok == 0) return;
    if (logits_all) model_matmul1(s, x, n_tok, out_w, logits);
    else model_matmul1(s, x + (size_t)(n_tok - 1) * out_w->k, 1, out_w, logits);
}

/* ---- attention -------------------------------------------------------------------- */

struct kv_store_task {
    struct tern_session *s;
    uint32_t il;
    const float *k, *v;
    size_t k_stride, v_stride;
    uint32_t pos0;
};

/* A page holds each kv head's rows contiguously ([n_kv_head][TERN_KV_PAGE][head_dim]):
 * attention scans one head's keys and values, which then sit together in cache. */
static void store_row(void *page, size_t row, uint32_t n_head, size_t hd, const float *src, bool f16) {
    for (uint32_t g = 0; g < n_head; g++) {
        const size_t off = ((size_t)g * TERN_KV_PAGE + row) * hd;
        if (f16) {
            tern_ops()->to_f16((tern_fp16 *)page + off, src + g * hd, hd);
        } else {
            memcpy((float *)page + off, src + g * hd, hd * sizeof(float));
        }
    }
}

static void kv_store_item(void *ctx, uint32_t t) {
    struct kv_store_task *p = ctx;
    const struct model_layer *L = &p->s->m->layers[p->il];
    const struct kv_layer *kv = &p->s->kv[p->il];
    const bool f16 = p->s->kv_type == TERN_KV_F16;
    const uint32_t pos = p->pos0 + t;
    const size_t page = pos / TERN_KV_PAGE, row = pos % TERN_KV_PAGE;
    store_row(kv->k_pages[page], row, L->n_kv_head, L->head_dim_k, p->k + (size_t)t * p->k_stride, f16);
    store_row(kv->v_pages[page], row, L->n_kv_head, L->head_dim_v, p->v + (size_t)t * p->v_stride, f16);
}

/* Tokens per attention work item: the item's queries (this many tokens times the GQA
 * group) consume each KV page while it is in cache, so a long context is read from
 * memory once per block instead of once per query. Each query's arithmetic is the same
 * whatever the block (attn_page per page, pages from 0). */
#define ATTN_QBLOCK 8

struct attn_task {
    struct tern_work work;
    struct tern_session *s;
    const struct tern_ops *ops;
    uint32_t il;
    const float *q;
    size_t q_stride;
    float *out;
    size_t out_stride;
    uint32_t n_head, group, head_dim;
    uint32_t n_tok, n_blocks, pos0;
    float scale;
};

size_t model_attn_scratch_floats(uint32_t max_group, uint32_t max_head_dim) {
    return TERN_KV_PAGE + 8 + (size_t)ATTN_QBLOCK * max_group * (max_head_dim + 2);
}

static void attn_run_task(void *ctx, int ith, int nth) {
    struct attn_task *p = ctx;
    struct tern_session *s = p->s;
    const struct kv_layer *kv = &s->kv[p->il];
    const bool f16 = s->kv_type == TERN_KV_F16;
    const size_t es = f16 ? 2 : 4, hd = p->head_dim;
    float *scores = s->scores + (size_t)ith * s->scores_per_thread;
    float *state = scores + TERN_KV_PAGE + 8; /* per query: m, l, acc[hd] */
    const size_t sq = hd + 2;
    size_t i0, i1;
    /* Items are (kv head, token block), head-major: consecutive items scan the same
     * head's pages. */
    while (tern_work_take(&p->work, &i0, &i1)) {
        for (size_t i = i0; i < i1; i++) {
            const uint32_t g = (uint32_t)(i / p->n_blocks), b = (uint32_t)(i % p->n_blocks);
            const uint32_t t0 = b * ATTN_QBLOCK, t1 = t0 + ATTN_QBLOCK < p->n_tok ? t0 + ATTN_QBLOCK : p->n_tok;
            const uint32_t nq = (t1 - t0) * p->group;
            for (uint32_t k = 0; k < nq; k++) {
                float *st = state + k * sq;
                st[0] = -INFINITY;
                st[1] = 0.0f;
                memset(st + 2, 0, hd * sizeof(float));
            }
            const uint32_t last = p->pos0 + t1 - 1;
            for (uint32_t pg = 0; pg * TERN_KV_PAGE <= last; pg++) {
                const char *kp = (const char *)kv->k_pages[pg] + (size_t)g * TERN_KV_PAGE * hd * es;
                const char *vp = (const char *)kv->v_pages[pg] + (size_t)g * TERN_KV_PAGE * hd * es;
                for (uint32_t t = t0; t < t1; t++) {
                    const uint32_t pos = p->pos0 + t;
                    if (pos < pg * TERN_KV_PAGE) continue;
                    const size_t n = pos - pg * TERN_KV_PAGE + 1 < TERN_KV_PAGE ? pos - pg * TERN_KV_PAGE + 1
                                                                                : TERN_KV_PAGE;
                    for (uint32_t h = 0; h < p->group; h++) {
                        float *st = state + ((t - t0) * p->group + h) * sq;
                        const float *q = p->q + t * p->q_stride + (size_t)(g * p->group + h) * hd;
                        p->ops->attn_page(st + 2, &st[0], &st[1], q, hd, kp, vp, hd, n, p->scale, f16, scores);
                    }
                }
            }
            for (uint32_t t = t0; t < t1; t++)
                for (uint32_t h = 0; h < p->group; h++) {
                    const float *st = state + ((t - t0) * p->group + h) * sq;
                    float *o = p->out + t * p->out_stride + (size_t)(g * p->group + h) * hd;
                    const float inv = 1.0f / st[1];
                    for (size_t e = 0; e < hd; e++) o[e] = st[2 + e] * inv;
                }
        }
    }
}

void model_attention(struct tern_session *s, uint32_t il, const float *q, size_t q_stride, const float *k,
                     size_t k_stride, const float *v, size_t v_stride, float *out, size_t out_stride,
                     uint32_t n_tok, uint32_t pos0, uint32_t n_head, float scale) {
    const struct model_layer *L = &s->m->layers[il];
    TERN_ASSERT(L->kind == LAYER_ATTN && L->head_dim_k == L->head_dim_v && n_head % L->n_kv_head == 0);
    TERN_ASSERT(pos0 + n_tok <= s->n_pages * TERN_KV_PAGE);
    /* The chunk's rows go into the cache first; every token then reads its keys and
     * values back from there, rounded as stored, whichever chunk wrote them. */
    struct kv_store_task st = {s, il, k, v, k_stride, v_stride, pos0};
    if (n_tok >= 16) model_parallel_for(s, n_tok, kv_store_item, &st);
    else
        for (uint32_t t = 0; t < n_tok; t++) kv_store_item(&st, t);

    const uint32_t group = n_head / L->n_kv_head;
    TERN_ASSERT(model_attn_scratch_floats(group, L->head_dim_k) <= s->scores_per_thread);
    struct attn_task at = {
        .s = s,
        .ops = tern_ops(),
        .il = il,
        .q = q,
        .q_stride = q_stride,
        .out = out,
        .out_stride = out_stride,
        .n_head = n_head,
        .group = n_head / L->n_kv_head,
        .head_dim = L->head_dim_k,
        .n_tok = n_tok,
        .n_blocks = (n_tok + ATTN_QBLOCK - 1) / ATTN_QBLOCK,
        .pos0 = pos0,
        .scale = scale,
    };
    tern_work_init(&at.work, (size_t)at.n_blocks * L->n_kv_head, 1);
    if (tern_threadpool_n_threads(s->m->pool) == 1) attn_run_task(&at, 0, 1);
    else tern_threadpool_run_shared(s->m->pool, attn_run_task, &at);
}

enum tern_status model_bufs_alloc(const struct model_buf *bufs, size_t n_bufs, uint32_t n_chunk, size_t *bytes,
                                  const char *who) {
    for (size_t i = 0; i < n_bufs; i++) {
        size_t b;
        const size_t rows = bufs[i].once ? 1 : n_chunk;
        if (tern_mul_overflow(rows * sizeof(float), bufs[i].n ? bufs[i].n : 1, &b) || !(*bufs[i].p = tern_aligned_alloc(b)))
            return tern_errorf(TERN_ERR_NOMEM, "%s: out of memory for the state of %u-token chunks", who, n_chunk);
        *bytes += b;
    }
    return TERN_OK;
}

/* ---- element-wise layer operations -------------------------------------------------- */

struct rows_task {
    float *y;
    const float *x;
    uint32_t n;
};

static void add_item(void *ctx, uint32_t t) {
    struct rows_task *r = ctx;
    tern_ops()->add(r->y + (size_t)t * r->n, r->x + (size_t)t * r->n, r->n);
}

void model_add(struct tern_session *s, float *y, const float *x, uint32_t n_tok, uint32_t n) {
    struct rows_task r = {y, x, n};
    model_parallel_for(s, n_tok, add_item, &r);
}

static void swiglu_item(void *ctx, uint32_t t) {
    struct rows_task *r = ctx;
    float *g = r->y + (size_t)t * r->n;
    tern_ops()->swiglu(g, g, r->x + (size_t)t * r->n, r->n);
}

void model_swiglu(struct tern_session *s, float *g, const float *u, uint32_t n_tok, uint32_t n) {
    struct rows_task r = {g, u, n};
    model_parallel_for(s, n_tok, swiglu_item, &r);
}

static void sigmoid_mul_item(void *ctx, uint32_t t) {
    struct rows_task *r = ctx;
    float *a = r->y + (size_t)t * r->n;
    const float *g = r->x + (size_t)t * r->n;
    for (size_t i = 0; i < r->n; i++) a[i] = a[i] * (1.0f / (1.0f + expf(-g[i])));
}

void model_sigmoid_mul(struct tern_session *s, float *x, const float *gate, uint32_t n_tok, uint32_t n) {
    struct rows_task r = {x, gate, n};
    model_parallel_for(s, n_tok, sigmoid_mul_item, &r);
}

struct split_task {
    const float *ab;
    float *a, *b;
    uint32_t n_head, head_dim;
};

static void split_item(void *ctx, uint32_t t) {
    struct split_task *p = ctx;
    const size_t hd = p->head_dim, nh = p->n_head, nq = nh * hd;
    const float *ab = p->ab + t * 2 * nq;
    for (size_t h = 0; h < nh; h++) {
        memcpy(p->a + t * nq + h * hd, ab + 2 * h * hd, hd * sizeof(float));
        memcpy(p->b + t * nq + h * hd, ab + (2 * h + 1) * hd, hd * sizeof(float));
    }
}

void model_split_heads(struct tern_session *s, const float *ab, float *a, float *b, uint32_t n_tok, uint32_t n_head,
                       uint32_t head_dim) {
    struct split_task p = {ab, a, b, n_head, head_dim};
    model_parallel_for(s, n_tok, split_item, &p);
}

struct rope_task {
    const struct model_rope *r;
    float *q, *k, *cs;
    uint32_t n_head, n_head_kv, head_dim, pos0;
};

static void rope_item(void *ctx, uint32_t t) {
    struct rope_task *p = ctx;
    const struct model_rope *r = p->r;
    const size_t hd = p->head_dim, nr = r->p->n_rot;
    float *cs = p->cs + t * nr;
    tern_rope_angles(r->p, p->pos0 + t, cs);
    if (r->pos0_pairs)
        for (size_t i = 0; i < nr / 2; i++)
            if (r->pos0_pairs[i]) { /* position 0: no rotation, only the magnitude scale */
                cs[2 * i] = r->cs0[2 * i];
                cs[2 * i + 1] = r->cs0[2 * i + 1];
            }
    tern_rope(p->q + t * p->n_head * hd, p->n_head, hd, nr, cs, r->neox);
    tern_rope(p->k + t * p->n_head_kv * hd, p->n_head_kv, hd, nr, cs, r->neox);
}

void model_rope(struct tern_session *s, const struct model_rope *r, float *q, uint32_t n_head, float *k,
                uint32_t n_head_kv, uint32_t head_dim, float *cs, uint32_t n_tok, uint32_t pos0) {
    struct rope_task p = {r, q, k, cs, n_head, n_head_kv, head_dim, pos0};
    model_parallel_for(s, n_tok, rope_item, &p);
}

/* Channels per conv work item: a few items per thread, whole vectors. */
#define CONV_BLOCK 512u

struct deltanet_task {
    struct tern_session *s;
    uint32_t il;
    const struct model_deltanet *d;
    const float *qkv_raw;
    float *qkv;
    const float *z, *beta, *alpha;
    float *out, *scratch;
    uint32_t n_tok;
};

static void conv_item(void *ctx, uint32_t i) {
    struct deltanet_task *c = ctx;
    const size_t C = tern_deltanet_channels(c->d->dn);
    const size_t c0 = (size_t)i * CONV_BLOCK, c1 = TERN_MIN(c0 + CONV_BLOCK, C);
    float *window = session_rec_buf(c->s, c->il, 0);
    tern_deltanet_conv(c->d->dn, window, c->d->conv_wt, c->qkv_raw, C, c->qkv, C, c->n_tok, c0, c1);
}

static void heads_item(void *ctx, uint32_t h) {
    struct deltanet_task *c = ctx;
    const struct tern_deltanet_shape *dn = c->d->dn;
    const size_t C = tern_deltanet_channels(dn), nv = dn->n_v_heads, nvd = nv * dn->d_v;
    const struct tern_deltanet_io io = {
        .n_tok = c->n_tok,
        .qkv = c->qkv, .ld_qkv = C,
        .z = c->z, .ld_z = nvd,
        .beta = c->beta, .ld_beta = nv,
        .alpha = c->alpha, .ld_alpha = nv,
        .out = c->out, .ld_out = nvd,
    };
    float *state = session_rec_buf(c->s, c->il, 1);
    float *scratch = c->scratch + (size_t)h * tern_deltanet_scratch_floats(dn);
    tern_deltanet_heads(dn, c->d->p, state, &io, h, h + 1, scratch);
}

void model_deltanet(struct tern_session *s, uint32_t il, const struct model_deltanet *d, const float *qkv_raw,
                    float *qkv, const float *z, const float *beta, const float *alpha, float *out, float *scratch,
                    uint32_t n_tok) {
    struct deltanet_task c = {s, il, d, qkv_raw, qkv, z, beta, alpha, out, scratch, n_tok};
    const size_t C = tern_deltanet_channels(d->dn);
    const uint32_t n_conv_items = (uint32_t)((C + CONV_BLOCK - 1) / CONV_BLOCK);
    /* The convolution and the recurrence run token by token in order inside each work
     * item; items split channels, then v-heads, never a token range. */
    if (!s->rec_trail) {
        model_parallel_for(s, n_conv_items, conv_item, &c);
        model_parallel_for(s, d->dn->n_v_heads, heads_item, &c);
        return;
    }
    /* With a state trail (speculative verification): one token at a time — the same
     * per-token code, so the same bits — copying the layer's buffers after each. */
    const struct model_layer *L = &s->m->layers[il];
    const size_t nv = d->dn->n_v_heads, nvd = nv * d->dn->d_v;
    for (uint32_t t = 0; t < n_tok; t++) {
        c.qkv_raw = qkv_raw + t * C;
        c.qkv = qkv + t * C;
        c.z = z + t * nvd;
        c.beta = beta + t * nv;
        c.alpha = alpha + t * nv;
        c.out = out + t * nvd;
        c.n_tok = 1;
        model_parallel_for(s, n_conv_items, conv_item, &c);
        model_parallel_for(s, d->dn->n_v_heads, heads_item, &c);
        memcpy(s->rec_trail + (size_t)t * s->m->rec_bytes + L->rec_offset, s->rec + L->rec_offset, L->rec_bytes);
    }
}
