/* Mixture-of-experts feed-forward (moe.h): routing, the grouped expert matmul, the
 * shared expert.
 *
 * A chunk of n tokens with k experts each makes n * k "slots". Slots are laid out
 * grouped by expert (expert 0's tokens first, each group in token order), so an
 * expert's tokens are contiguous rows of one matmul and its weights are read once per
 * chunk. Each step below is one dispatch over the pool:
 *
 *   route     per token: router logits -> softmax -> top-k -> weights
 *   gather    per slot: the token's prepared activation row, copied to its slot
 *   gate/up   per (active expert, output rows): gate and up of the expert's slots
 *   act       per slot: silu(gate) * up, prepared for the down weights
 *   down      per (active expert, output rows)
 *   combine   per token: sum_j w_j down[slot(t, j)] in rank order (+ shared expert) */
#include "model/moe.h"

#include "backend/cpu/cpu.h"
#include "util/mem.h"

#include <math.h>
#include <string.h>

/* ---- the forward ------------------------------------------------------------------ */

void moe_state_free(struct moe_state *st) {
    if (!st) return;
    void *bufs[] = {st->probs, st->sel, st->wts, st->slot_of, st->slot_tok, st->cnt, st->act_tok, st->act_gu,
                    st->act_up, st->g, st->u, st->act_d, st->d, st->sg, st->su, st->sw, st->sd};
    for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) tern_aligned_free(bufs[i]);
    memset(st, 0, sizeof *st);
}

/* rows * cols elements of elem bytes, counted in *bytes. */
static void *alloc_rows(size_t rows, size_t cols, size_t elem, size_t *bytes, bool *failed) {
    size_t b;
    if (tern_mul_overflow(rows, cols ? cols : 1, &b) || tern_mul_overflow(b, elem, &b)) {
        *failed = true;
        return NULL;
    }
    void *p = tern_aligned_alloc(b);
    if (!p) *failed = true;
    else *bytes += b;
    return p;
}

enum tern_status moe_state_new(const struct tern_model *m, const struct moe_hparams *hp,
                               const struct moe_layer *layers, uint32_t n_layer, uint32_t n_chunk,
                               struct moe_state *st) {
    memset(st, 0, sizeof *st);
    st->n_chunk = n_chunk;
    const size_t E = m->hp.n_embd, F = hp->n_ff_exp, X = hp->n_expert, K = hp->n_used;
    bool split_up = false;
    for (uint32_t il = 0; il < n_layer; il++) {
        const struct moe_layer *L = &layers[il];
        if (!L->gate.data) continue; /* a dense layer */
        st->act_gu_rb = TERN_MAX(st->act_gu_rb, tern_act_row_bytes(L->gate.type, E));
        st->act_up_rb = TERN_MAX(st->act_up_rb, tern_act_row_bytes(L->up.type, E));
        st->act_d_rb = TERN_MAX(st->act_d_rb, tern_act_row_bytes(L->down.type, F));
        split_up |= tern_act_type(L->gate.type) != tern_act_type(L->up.type);
    }
    const size_t slots = (size_t)n_chunk * K, S = hp->n_ff_shexp;
    bool failed = false;
    size_t *b = &st->bytes;
    st->probs = alloc_rows(n_chunk, X, sizeof(float), b, &failed);
    st->sel = alloc_rows(n_chunk, K, sizeof(int32_t), b, &failed);
    st->wts = alloc_rows(n_chunk, K, sizeof(float), b, &failed);
    st->slot_of = alloc_rows(n_chunk, K, sizeof(int32_t), b, &failed);
    st->slot_tok = alloc_rows(slots, 1, sizeof(int32_t), b, &failed);
    st->cnt = alloc_rows(X + 1, 1, sizeof(uint32_t), b, &failed);
    st->act_tok = alloc_rows(n_chunk, TERN_MAX(st->act_gu_rb, st->act_up_rb), 1, b, &failed);
    st->act_gu = alloc_rows(slots, st->act_gu_rb, 1, b, &failed);
    if (split_up) st->act_up = alloc_rows(slots, st->act_up_rb, 1, b, &failed);
    st->g = alloc_rows(slots, F, sizeof(float), b, &failed);
    st->u = alloc_rows(slots, F, sizeof(float), b, &failed);
    st->act_d = alloc_rows(slots, st->act_d_rb, 1, b, &failed);
    st->d = alloc_rows(slots, E, sizeof(float), b, &failed);
    if (S) {
        st->sg = alloc_rows(n_chunk, S, sizeof(float), b, &failed);
        st->su = alloc_rows(n_chunk, S, sizeof(float), b, &failed);
        st->sw = alloc_rows(n_chunk, 1, sizeof(float), b, &failed);
        st->sd = alloc_rows(n_chunk, E, sizeof(float), b, &failed);
    }
    if (failed)
        return tern_errorf(TERN_ERR_NOMEM, "moe: out of memory for the expert scratch of %u-token chunks (%u experts, %u used)",
                           n_chunk, hp->n_expert, hp->n_used);
    return TERN_OK;
}

/* ---- routing ---------------------------------------------------------------------- */

void moe_route(const struct moe_hparams *hp, float *p, int32_t *sel, float *wts) {
    const uint32_t X = hp->n_expert, K = hp->n_used;
    if (!hp->softmax_weight) tern_ops()->softmax(p, X);
    uint64_t taken[MOE_MAX_EXPERTS / 64] = {0};
    float sum = 0.0f;
    for (uint32_t j = 0; j < K; j++) {
        /* The largest untaken probability; on equal values the lowest id (strict >, ids
         * ascending). A NaN never wins, so the choice is defined for any input. */
        uint32_t best = 0;
        while (taken[best / 64] >> (best % 64) & 1) best++;
        for (uint32_t e = best + 1; e < X; e++)
            if (!(taken[e / 64] >> (e % 64) & 1) && p[e] > p[best]) best = e;
        taken[best / 64] |= (uint64_t)1 << (best % 64);
        sel[j] = (int32_t)best;
        wts[j] = p[best];
        sum += p[best];
    }
    if (hp->softmax_weight) tern_ops()->softmax(wts, K);
    if (hp->norm_topk) {
        /* llama.cpp clamps the sum from below so that a vanishing sum cannot blow up. */
        if (!(sum >= 6.103515625e-5f)) sum = 6.103515625e-5f;
        for (uint32_t j = 0; j < K; j++) wts[j] /= sum;
    }
    if (hp->scale != 1.0f)
        for (uint32_t j = 0; j < K; j++) wts[j] *= hp->scale;
}

/* ---- forward ---------------------------------------------------------------------- */

struct moe_ctx {
    struct tern_work work;
    const struct moe_hparams *hp;
    const struct moe_layer *L;
    struct moe_state *st;
    const float *h;
    float *out;
    uint32_t n_tok;
    uint32_t n_active;
    uint16_t active[MOE_MAX_EXPERTS]; /* the experts with tokens, ascending */
    size_t block_rows;                /* output rows per work block */
};

static void route_item(void *ctx, uint32_t t) {
    struct moe_ctx *c = ctx;
    const struct moe_hparams *hp = c->hp;
    if (c->L->router_b) {
        float *l = c->st->probs + (size_t)t * hp->n_expert;
        for (uint32_t e = 0; e < hp->n_expert; e++) l[e] += c->L->router_b[e];
    }
    moe_route(hp, c->st->probs + (size_t)t * hp->n_expert, c->st->sel + (size_t)t * hp->n_used,
              c->st->wts + (size_t)t * hp->n_used);
}

static void prep_tok_item(void *ctx, uint32_t t) {
    struct moe_ctx *c = ctx;
    const size_t E = c->L->router.k, rb = TERN_MAX(c->st->act_gu_rb, c->st->act_up_rb);
    tern_act_prepare(c->L->gate.type, c->h + (size_t)t * E, c->st->act_tok + (size_t)t * rb, E);
}

static void gather_item(void *ctx, uint32_t slot) {
    struct moe_ctx *c = ctx;
    struct moe_state *st = c->st;
    const size_t E = c->L->router.k, rb_tok = TERN_MAX(st->act_gu_rb, st->act_up_rb);
    const size_t t = (size_t)st->slot_tok[slot];
    const size_t rb = tern_act_row_bytes(c->L->gate.type, E);
    memcpy(st->act_gu + slot * st->act_gu_rb, st->act_tok + t * rb_tok, rb);
    if (st->act_up) /* up reads another format: prepare it for this slot */
        tern_act_prepare(c->L->up.type, c->h + t * E, st->act_up + slot * st->act_up_rb, E);
}

/* Runs the expert matmuls of one projection over the active experts' slots: the row
 * space is (active expert a, output row r), cut into blocks. */
enum proj { PROJ_GATE_UP, PROJ_DOWN };

struct proj_task {
    struct moe_ctx *c;
    enum proj which;
};

static void expert_rows(struct moe_ctx *c, const struct mat *w, size_t stride, uint32_t e, const void *act,
                        size_t act_rb, float *y, size_t r0, size_t r1) {
    const struct moe_state *st = c->st;
    const size_t first = st->cnt[e], n = st->cnt[e + 1] - st->cnt[e];
    tern_matmul(w->type, (const uint8_t *)w->data + (size_t)e * stride, w->row_bytes, w->k,
                (const uint8_t *)act + first * act_rb, act_rb, n, y + first * w->n, w->n, r0, r1);
}

static void proj_task_run(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    struct proj_task *p = ctx;
    struct moe_ctx *c = p->c;
    const struct moe_layer *L = c->L;
    struct moe_state *st = c->st;
    /* gate/up: each active expert owns 2 * n_ff_exp rows (gate's, then up's); down owns
     * n_embd rows. */
    const size_t per = p->which == PROJ_GATE_UP ? 2 * (size_t)L->gate.n : L->down.n;
    size_t i0, i1;
    while (tern_work_take(&c->work, &i0, &i1)) {
        for (size_t i = i0; i < i1;) {
            const size_t a = i / per, r = i % per, end = TERN_MIN(i1, (a + 1) * per);
            const size_t r_end = r + (end - i);
            const uint32_t e = c->active[a];
            if (p->which == PROJ_DOWN) {
                expert_rows(c, &L->down, L->down_stride, e, st->act_d, st->act_d_rb, st->d, r, r_end);
            } else {
                const size_t F = L->gate.n;
                if (r < F)
                    expert_rows(c, &L->gate, L->gate_stride, e, st->act_gu, st->act_gu_rb, st->g, r,
                                TERN_MIN(r_end, F));
                if (r_end > F) {
                    const void *act = st->act_up ? st->act_up : st->act_gu;
                    const size_t rb = st->act_up ? st->act_up_rb : st->act_gu_rb;
                    expert_rows(c, &L->up, L->up_stride, e, act, rb, st->u, r > F ? r - F : 0, r_end - F);
                }
            }
            i = end;
        }
    }
}

static void run_proj(struct tern_session *s, struct moe_ctx *c, enum proj which) {
    const size_t per = which == PROJ_GATE_UP ? 2 * (size_t)c->L->gate.n : c->L->down.n;
    const size_t total = per * c->n_active;
    const int nth = tern_threadpool_n_threads(s->m->pool);
    /* Whole 16-row groups, about 8 blocks per thread (as model_matmul cuts its rows). */
    size_t block = total / ((size_t)nth * 8);
    block = (block + 15) & ~(size_t)15;
    if (block < 16) block = 16;
    tern_work_init(&c->work, total, block);
    struct proj_task p = {c, which};
    if (nth == 1) proj_task_run(&p, 0, 1);
    else tern_threadpool_run_shared(s->m->pool, proj_task_run, &p);
}

/* The expert whose group holds slot: cnt[e] <= slot < cnt[e + 1]. */
static uint32_t slot_expert(const struct moe_state *st, uint32_t n_expert, uint32_t slot) {
    uint32_t lo = 0, hi = n_expert; /* cnt[lo] <= slot < cnt[hi] */
    while (hi - lo > 1) {
        const uint32_t mid = (lo + hi) / 2;
        if (st->cnt[mid] <= slot) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* gpt-oss's swiglu_oai (ggml's operations, in its order) on the biased gate and up. */
static void swiglu_oai(float *g, const float *u, const float *bg, const float *bu, size_t n) {
    const float alpha = 1.702f, limit = 7.0f;
    for (size_t i = 0; i < n; i++) {
        float x = g[i] + bg[i], y = u[i] + bu[i];
        x = x < limit ? x : limit;
        y = y < limit ? (y > -limit ? y : -limit) : limit;
        const float glu = x / (1.0f + expf(alpha * (-x)));
        g[i] = glu * (y + 1.0f);
    }
}

static void act_item(void *ctx, uint32_t slot) {
    struct moe_ctx *c = ctx;
    struct moe_state *st = c->st;
    const size_t F = c->L->gate.n;
    float *g = st->g + (size_t)slot * F;
    if (c->hp->swiglu_oai) {
        const size_t e = slot_expert(st, c->hp->n_expert, slot);
        swiglu_oai(g, st->u + (size_t)slot * F, c->L->gate_b + e * F, c->L->up_b + e * F, F);
    } else {
        tern_ops()->swiglu(g, g, st->u + (size_t)slot * F, F);
    }
    tern_act_prepare(c->L->down.type, g, st->act_d + (size_t)slot * st->act_d_rb, F);
}

static void combine_item(void *ctx, uint32_t t) {
    struct moe_ctx *c = ctx;
    const struct moe_state *st = c->st;
    const size_t E = c->L->router.k, K = c->hp->n_used;
    float *y = c->out + (size_t)t * E;
    const int32_t *slot = st->slot_of + (size_t)t * K;
    const float *w = st->wts + (size_t)t * K;
    if (c->L->down_b) { /* (down + its expert's bias) * weight, summed in rank order */
        const int32_t *sel = st->sel + (size_t)t * K;
        for (size_t j = 0; j < K; j++) {
            const float *dj = st->d + (size_t)slot[j] * E, *bj = c->L->down_b + (size_t)sel[j] * E;
            const float wj = w[j];
            if (j == 0)
                for (size_t i = 0; i < E; i++) y[i] = (dj[i] + bj[i]) * wj;
            else
                for (size_t i = 0; i < E; i++) y[i] += (dj[i] + bj[i]) * wj;
        }
        return;
    }
    const float *d0 = st->d + (size_t)slot[0] * E;
    for (size_t i = 0; i < E; i++) y[i] = d0[i] * w[0];
    for (size_t j = 1; j < K; j++) {
        const float *dj = st->d + (size_t)slot[j] * E;
        const float wj = w[j];
        for (size_t i = 0; i < E; i++) y[i] += dj[i] * wj;
    }
    if (st->sd) {
        const float gate = 1.0f / (1.0f + expf(-st->sw[t]));
        const float *sd = st->sd + (size_t)t * E;
        for (size_t i = 0; i < E; i++) y[i] += sd[i] * gate;
    }
}

static void shared_swiglu_item(void *ctx, uint32_t t) {
    struct moe_ctx *c = ctx;
    const size_t S = c->L->sh_gate.n;
    float *g = c->st->sg + (size_t)t * S;
    tern_ops()->swiglu(g, g, c->st->su + (size_t)t * S, S);
}

void moe_forward(struct tern_session *s, const struct moe_hparams *hp, const struct moe_layer *L,
                 struct moe_state *st, const float *h, uint32_t n_tok, float *out) {
    moe_forward_shared(s, hp, L, st, h, n_tok, out, NULL, NULL);
}

void moe_forward_shared(struct tern_session *s, const struct moe_hparams *hp, const struct moe_layer *L,
                        struct moe_state *st, const float *h, uint32_t n_tok, float *out, const float *sd,
                        const float *sw) {
    TERN_ASSERT(n_tok <= st->n_chunk && h != out);
    const uint32_t X = hp->n_expert, K = hp->n_used;
    struct moe_ctx *c = &(struct moe_ctx){.hp = hp, .L = L, .st = st, .h = h, .out = out, .n_tok = n_tok};

    /* route */
    model_matmul1(s, h, n_tok, &L->router, st->probs);
    model_parallel_for(s, n_tok, route_item, c);

    /* slots grouped by expert, each group in token order */
    memset(st->cnt, 0, (X + 1) * sizeof *st->cnt);
    for (size_t i = 0; i < (size_t)n_tok * K; i++) st->cnt[st->sel[i] + 1]++;
    for (uint32_t e = 0; e < X; e++) {
        if (st->cnt[e + 1]) c->active[c->n_active++] = (uint16_t)e;
        st->cnt[e + 1] += st->cnt[e];
    }
    uint32_t fill[MOE_MAX_EXPERTS];
    memcpy(fill, st->cnt, X * sizeof *fill);
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t j = 0; j < K; j++) {
            const uint32_t slot = fill[st->sel[(size_t)t * K + j]]++;
            st->slot_tok[slot] = (int32_t)t;
            st->slot_of[(size_t)t * K + j] = (int32_t)slot;
        }

    /* experts */
    const uint32_t n_slots = n_tok * K;
    model_parallel_for(s, n_tok, prep_tok_item, c);
    model_parallel_for(s, n_slots, gather_item, c);
    run_proj(s, c, PROJ_GATE_UP);
    model_parallel_for(s, n_slots, act_item, c);
    run_proj(s, c, PROJ_DOWN);

    /* shared expert */
    if (hp->n_ff_shexp && sd) {
        memcpy(st->sd, sd, (size_t)n_tok * L->router.k * sizeof(float));
        memcpy(st->sw, sw, (size_t)n_tok * sizeof(float));
    } else if (hp->n_ff_shexp) {
        const struct mm_out gu[] = {{&L->sh_gate, st->sg}, {&L->sh_up, st->su}, {&L->sh_gate_inp, st->sw}};
        model_matmul(s, h, n_tok, gu, 3);
        model_parallel_for(s, n_tok, shared_swiglu_item, c);
        model_matmul1(s, st->sg, n_tok, &L->sh_down, st->sd);
    }
    model_parallel_for(s, n_tok, combine_item, c);
}
