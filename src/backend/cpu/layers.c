/* Building blocks of forward passes, shared by every architecture: matmuls with
 * activation preparation, norms, embeddings, attention over the paged KV cache, logits.
 * Each splits its work across the pool by output rows, tokens or heads, never inside a
 * reduction (DESIGN.md §5). */
#include "backend/cpu/cpu.h"

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

void model_output(struct tern_session *s, const struct model_batch *b, const struct mat *out_w, const float *norm_w,
                  float eps, const float *x, float *xb) {
    if (!b->logits) return;
    const size_t E = out_w->k;
    uint32_t n_out = 0;
    for (uint32_t j = 0; j < b->n_seq; j++) {
        const struct model_seq *q = &b->seq[j];
        if (!q->want || q->n == 0) continue;
        const uint32_t first = q->all ? 0 : q->n - 1;
        memcpy(xb + (size_t)n_out * E, x + (size_t)(q->row0 + first) * E, (size_t)(q->n - first) * E * sizeof *xb);
        n_out += q->n - first;
    }
    if (n_out == 0) return;
    model_rmsnorm(s, xb, xb, norm_w, n_out, (uint32_t)E, eps);
    model_matmul1(s, xb, n_out, out_w, b->logits);
}

/* The sequence that holds row t (rows are in sequence order). */
static const struct model_seq *seq_of_row(const struct model_batch *b, uint32_t t) {
    uint32_t lo = 0, hi = b->n_seq - 1;
    while (lo < hi) {
        const uint32_t mid = (lo + hi + 1) / 2;
        if (b->seq[mid].row0 <= t) lo = mid;
        else hi = mid - 1;
    }
    return &b->seq[lo];
}

/* ---- attention -------------------------------------------------------------------- */

struct kv_store_task {
    const struct model_batch *b;
    uint32_t il;
    const float *k, *v;
    size_t k_stride, v_stride;
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
    const struct model_seq *q = seq_of_row(p->b, t);
    const struct tern_session *s = q->s;
    const struct model_layer *L = &s->m->layers[p->il];
    const struct kv_layer *kv = &s->kv[p->il];
    const bool f16 = s->kv_type == TERN_KV_F16;
    const uint32_t pos = q->pos0 + (t - q->row0);
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
    struct tern_session *s; /* the lead: its threads' scratch */
    const struct model_batch *b;
    const struct tern_ops *ops;
    uint32_t il;
    const float *q;
    size_t q_stride;
    float *out;
    size_t out_stride;
    uint32_t n_head, n_kv_head, group, head_dim;
    const uint32_t *item0; /* (n_seq + 1) the first work item of each sequence */
    float scale;
    uint32_t window;     /* the layer's (model_layer) */
    const float *sinks;
};

/* Scratch of one thread: attn_page_multi's, then the item's per-query states. */
static size_t attn_multi_floats(uint32_t max_group, uint32_t max_head_dim) {
    const size_t nq = (size_t)ATTN_QBLOCK * max_group;
    return tern_attn_multi_scratch_floats(nq < TERN_ATTN_MAX_Q ? nq : TERN_ATTN_MAX_Q, TERN_KV_PAGE, max_head_dim);
}

size_t model_attn_scratch_floats(uint32_t max_group, uint32_t max_head_dim) {
    return attn_multi_floats(max_group, max_head_dim) + (size_t)ATTN_QBLOCK * max_group * (max_head_dim + 2);
}

static uint32_t n_qblocks(uint32_t n_tok) { return (n_tok + ATTN_QBLOCK - 1) / ATTN_QBLOCK; }

/* One page for a run of queries that see the same rows of it: attn_page_multi reads
 * (and converts) the rows once for all of them; each query's bits are attn_page's. */
static void attn_run(const struct attn_task *p, const struct tern_attn_query *qs, size_t nq, const char *kp,
                     const char *vp, size_t n, bool f16, float *scratch) {
    if (nq == 1)
        p->ops->attn_page(qs[0].acc, qs[0].m, qs[0].l, qs[0].q, p->head_dim, kp, vp, p->head_dim, n, p->scale, f16,
                          scratch);
    else p->ops->attn_page_multi(qs, nq, p->head_dim, kp, vp, p->head_dim, n, p->scale, f16, scratch);
}

/* Attention of one work item: kv head g of sequence q, for its rows [t0, t1) (offsets
 * within the sequence). */
static void attn_item(const struct attn_task *p, const struct model_seq *sq_, uint32_t g, uint32_t t0, uint32_t t1,
                      float *scores) {
    const struct tern_session *s = sq_->s;
    const struct kv_layer *kv = &s->kv[p->il];
    const bool f16 = s->kv_type == TERN_KV_F16;
    const size_t es = f16 ? 2 : 4, hd = p->head_dim;
    /* kv head g's rows of a page, from row r on */
#define KV_ROWS(page, r) ((const char *)(page) + ((size_t)g * TERN_KV_PAGE + (r)) * hd * es)
    float *state = scores + attn_multi_floats(p->group, p->head_dim); /* per query: m, l, acc[hd] */
    const size_t sq = hd + 2;
    const uint32_t nq = (t1 - t0) * p->group;
    for (uint32_t k = 0; k < nq; k++) {
        float *st = state + k * sq;
        st[0] = -INFINITY;
        st[1] = 0.0f;
        memset(st + 2, 0, hd * sizeof(float));
    }
    const uint32_t pos0 = sq_->pos0, last = pos0 + t1 - 1;
    const uint32_t W = p->window;
    /* the first key a query at pos sees (a window layer's start; pages before the block's
     * first query's are not read) */
#define KEY0(pos) (W && (pos) + 1 > W ? (pos) + 1 - W : 0)
    const float *qrows = p->q + (size_t)sq_->row0 * p->q_stride;
    for (uint32_t pg = KEY0(pos0 + t0) / TERN_KV_PAGE; pg * TERN_KV_PAGE <= last; pg++) {
        const uint32_t pg0 = pg * TERN_KV_PAGE;
        /* Runs of queries with the same rows of this page: all of them on a page below the
         * block's first position, each token's GQA group on the diagonal page (and, in a
         * window layer, on the page where the window starts). A query's rows of a page are
         * [off, off + n): its pages and their rows depend on its position only. */
        struct tern_attn_query run[TERN_ATTN_MAX_Q];
        size_t n_run = 0, run_n = 0, run_off = 0;
        for (uint32_t t = t0; t < t1; t++) {
            const uint32_t pos = pos0 + t, key0 = KEY0(pos);
            if (pos < pg0 || key0 >= pg0 + TERN_KV_PAGE) continue;
            const size_t off = key0 > pg0 ? key0 - pg0 : 0;
            const size_t n = (pos - pg0 + 1 < TERN_KV_PAGE ? pos - pg0 + 1 : TERN_KV_PAGE) - off;
            for (uint32_t h = 0; h < p->group; h++) {
                if (n_run == TERN_ATTN_MAX_Q || (n_run && (n != run_n || off != run_off))) {
                    attn_run(p, run, n_run, KV_ROWS(kv->k_pages[pg], run_off), KV_ROWS(kv->v_pages[pg], run_off),
                             run_n, f16, scores);
                    n_run = 0;
                }
                float *st = state + ((t - t0) * p->group + h) * sq;
                run[n_run++] = (struct tern_attn_query){
                    .q = qrows + t * p->q_stride + (size_t)(g * p->group + h) * hd, .acc = st + 2, .m = &st[0], .l = &st[1]};
                run_n = n;
                run_off = off;
            }
        }
        if (n_run)
            attn_run(p, run, n_run, KV_ROWS(kv->k_pages[pg], run_off), KV_ROWS(kv->v_pages[pg], run_off), run_n, f16,
                     scores);
    }
#undef KEY0
#undef KV_ROWS
    float *orows = p->out + (size_t)sq_->row0 * p->out_stride;
    for (uint32_t t = t0; t < t1; t++)
        for (uint32_t h = 0; h < p->group; h++) {
            const float *st = state + ((t - t0) * p->group + h) * sq;
            float *o = orows + t * p->out_stride + (size_t)(g * p->group + h) * hd;
            float l = st[1], a = 1.0f;
            if (p->sinks) { /* one more logit in the max and the denominator, no value */
                const float sk = p->sinks[g * p->group + h];
                if (sk > st[0]) {
                    a = expf(st[0] - sk);
                    l = l * a + 1.0f;
                } else {
                    l += expf(sk - st[0]);
                }
            }
            const float inv = a / l;
            for (size_t e = 0; e < hd; e++) o[e] = st[2 + e] * inv;
        }
}

static void attn_run_task(void *ctx, int ith, int nth) {
    (void)nth;
    struct attn_task *p = ctx;
    float *scores = p->s->scores + (size_t)ith * p->s->scores_per_thread;
    size_t i0, i1;
    /* Items are (sequence, kv head, token block), sequence- then head-major:
     * consecutive items scan the same head's pages. */
    uint32_t j = 0;
    while (tern_work_take(&p->work, &i0, &i1)) {
        for (size_t i = i0; i < i1; i++) {
            while (i >= p->item0[j + 1]) j++;
            while (i < p->item0[j]) j--;
            const struct model_seq *q = &p->b->seq[j];
            const uint32_t nb = n_qblocks(q->n), local = (uint32_t)(i - p->item0[j]);
            const uint32_t g = local / nb, blk = local % nb;
            const uint32_t t0 = blk * ATTN_QBLOCK, t1 = t0 + ATTN_QBLOCK < q->n ? t0 + ATTN_QBLOCK : q->n;
            attn_item(p, q, g, t0, t1, scores);
        }
    }
}

void model_attention(struct tern_session *s, uint32_t il, const struct model_batch *b, const float *q,
                     size_t q_stride, const float *k, size_t k_stride, const float *v, size_t v_stride, float *out,
                     size_t out_stride, uint32_t n_head, float scale) {
    const struct model_layer *L = &s->m->layers[il];
    TERN_ASSERT(L->kind == LAYER_ATTN && L->head_dim_k == L->head_dim_v && n_head % L->n_kv_head == 0);
    TERN_ASSERT(b->n_seq >= 1 && b->n_seq <= MODEL_MAX_SEQS);
    uint32_t item0[MODEL_MAX_SEQS + 1];
    item0[0] = 0;
    for (uint32_t j = 0; j < b->n_seq; j++) {
        const struct model_seq *sq = &b->seq[j];
        TERN_ASSERT(sq->pos0 + sq->n <= sq->s->n_pages * TERN_KV_PAGE);
        item0[j + 1] = item0[j] + n_qblocks(sq->n) * L->n_kv_head;
    }
    /* The rows go into their caches first; every token then reads its keys and values
     * back from there, rounded as stored, whichever chunk or step wrote them. */
    struct kv_store_task st = {b, il, k, v, k_stride, v_stride};
    if (b->n >= 16) model_parallel_for(s, b->n, kv_store_item, &st);
    else
        for (uint32_t t = 0; t < b->n; t++) kv_store_item(&st, t);

    const uint32_t group = n_head / L->n_kv_head;
    TERN_ASSERT(model_attn_scratch_floats(group, L->head_dim_k) <= s->scores_per_thread);
    struct attn_task at = {
        .s = s,
        .b = b,
        .ops = tern_ops(),
        .il = il,
        .q = q,
        .q_stride = q_stride,
        .out = out,
        .out_stride = out_stride,
        .n_head = n_head,
        .n_kv_head = L->n_kv_head,
        .group = group,
        .head_dim = L->head_dim_k,
        .item0 = item0,
        .scale = scale,
        .window = L->window,
        .sinks = L->sinks,
    };
    tern_work_init(&at.work, item0[b->n_seq], 1);
    if (tern_threadpool_n_threads(s->m->pool) == 1) attn_run_task(&at, 0, 1);
    else tern_threadpool_run_shared(s->m->pool, attn_run_task, &at);
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

void model_concat_rows(struct tern_session *s, float *y, const float *a, const float *b, uint32_t n_tok, uint32_t n) {
    (void)s;
    for (uint32_t t = 0; t < n_tok; t++) {
        memcpy(y + (size_t)t * 2 * n, a + (size_t)t * n, (size_t)n * sizeof *y);
        memcpy(y + (size_t)t * 2 * n + n, b + (size_t)t * n, (size_t)n * sizeof *y);
    }
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
    const struct model_batch *b;
    float *q, *k, *cs;
    uint32_t n_head, n_head_kv, head_dim;
};

static void angles_item(void *ctx, uint32_t t) {
    struct rope_task *p = ctx;
    const struct model_seq *sq = seq_of_row(p->b, t);
    model_rope_row_angles(p->r, sq->pos0 + (t - sq->row0), p->cs + t * p->r->p->n_rot);
}

void model_rope_angles(struct tern_session *s, const struct model_batch *b, const struct model_rope *r, float *cs) {
    struct rope_task p = {.r = r, .b = b, .cs = cs};
    model_parallel_for(s, b->n, angles_item, &p);
}

static void rope_item(void *ctx, uint32_t t) {
    struct rope_task *p = ctx;
    const size_t hd = p->head_dim, nr = p->r->p->n_rot;
    const float *cs = p->cs + t * nr;
    tern_rope(p->q + t * p->n_head * hd, p->n_head, hd, nr, cs, p->r->neox);
    tern_rope(p->k + t * p->n_head_kv * hd, p->n_head_kv, hd, nr, cs, p->r->neox);
}

void model_rope(struct tern_session *s, const struct model_batch *b, const struct model_rope *r, float *q,
                uint32_t n_head, float *k, uint32_t n_head_kv, uint32_t head_dim, const float *cs) {
    struct rope_task p = {r, b, q, k, (float *)cs, n_head, n_head_kv, head_dim};
    model_parallel_for(s, b->n, rope_item, &p);
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

/* One sequence's rows of the batch (offsets applied by the caller). */
static void deltanet_seq(struct tern_session *lead, struct deltanet_task *c) {
    struct tern_session *s = c->s;
    const struct model_deltanet *d = c->d;
    const size_t C = tern_deltanet_channels(d->dn);
    const uint32_t n_conv_items = (uint32_t)((C + CONV_BLOCK - 1) / CONV_BLOCK);
    /* The convolution and the recurrence run token by token in order inside each work
     * item; items split channels, then v-heads, never a token range. */
    if (!s->rec_trail) {
        model_parallel_for(lead, n_conv_items, conv_item, c);
        model_parallel_for(lead, d->dn->n_v_heads, heads_item, c);
        return;
    }
    /* With a state trail (speculative verification): one token at a time — the same
     * per-token code, so the same bits — copying the layer's buffers after each. */
    const struct model_layer *L = &s->m->layers[c->il];
    const size_t nv = d->dn->n_v_heads, nvd = nv * d->dn->d_v;
    const uint32_t n_tok = c->n_tok;
    struct deltanet_task one = *c;
    one.n_tok = 1;
    for (uint32_t t = 0; t < n_tok; t++) {
        one.qkv_raw = c->qkv_raw + t * C;
        one.qkv = c->qkv + t * C;
        one.z = c->z + t * nvd;
        one.beta = c->beta + t * nv;
        one.alpha = c->alpha + t * nv;
        one.out = c->out + t * nvd;
        model_parallel_for(lead, n_conv_items, conv_item, &one);
        model_parallel_for(lead, d->dn->n_v_heads, heads_item, &one);
        memcpy(s->rec_trail + (size_t)t * s->m->rec_bytes + L->rec_offset, s->rec + L->rec_offset, L->rec_bytes);
    }
}

void model_deltanet(struct tern_session *s, uint32_t il, const struct model_batch *b, const struct model_deltanet *d,
                    const float *qkv_raw, float *qkv, const float *z, const float *beta, const float *alpha, float *out,
                    float *scratch) {
    const size_t C = tern_deltanet_channels(d->dn), nv = d->dn->n_v_heads, nvd = nv * d->dn->d_v;
    /* Sequences one after another: each has its own conv window and state, and the
     * heads' scratch is shared. */
    for (uint32_t j = 0; j < b->n_seq; j++) {
        const struct model_seq *q = &b->seq[j];
        if (q->n == 0) continue;
        const size_t r = q->row0;
        struct deltanet_task c = {q->s, il, d, qkv_raw + r * C, qkv + r * C, z + r * nvd, beta + r * nv,
                                  alpha + r * nv, out + r * nvd, scratch, q->n};
        deltanet_seq(s, &c);
    }
}
