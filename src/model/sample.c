/* Sampling: penalties, then (as llama.cpp orders them) top-k, top-p, min-p, temperature,
 * and a draw from a seeded xoshiro256** generator. Greedy (temperature <= 0) is argmax
 * with ties going to the lowest id. logit_bias is added first (before penalties). The
 * input logits are never modified. */
#include "tern.h"

#include "util/mem.h"
#include "util/rng.h"
#include "util/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cand {
    int32_t id;
    float v;
};

struct tern_sampler {
    struct tern_sampler_params p;
    uint32_t n_vocab;
    struct tern_rng rng;
    float *work;       /* (n_vocab) logits after penalties */
    struct cand *cand; /* (n_vocab) sorted candidates */
    int32_t *hist;     /* penalty window, sorted (grown as needed) */
    size_t hist_cap;
    int32_t *bias_id;  /* (n_bias) logit_bias: tokens and what is added to their logits */
    float *bias;
    size_t n_bias;
};

void tern_sampler_params_default(struct tern_sampler_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->seed = 0;
}

enum tern_status tern_sampler_params_check(const struct tern_sampler_params *p) {
    if (isnan(p->temperature) || isnan(p->top_p) || isnan(p->min_p) || isnan(p->repeat_penalty) ||
        isnan(p->presence_penalty) || isnan(p->frequency_penalty))
        return tern_errorf(TERN_ERR_INVALID, "sampler: a parameter is NaN");
    if (!(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty))
        return tern_errorf(TERN_ERR_INVALID, "sampler: repeat_penalty %g must be positive and finite",
                           (double)p->repeat_penalty);
    if (p->repeat_last_n < 0)
        return tern_errorf(TERN_ERR_INVALID, "sampler: repeat_last_n %d must be >= 0", p->repeat_last_n);
    if (p->min_p > 1.0f) return tern_errorf(TERN_ERR_INVALID, "sampler: min_p %g exceeds 1", (double)p->min_p);
    return TERN_OK;
}

enum tern_status tern_sampler_new(const struct tern_sampler_params *p, uint32_t n_vocab, struct tern_sampler **out) {
    *out = NULL;
    if (n_vocab == 0) return tern_errorf(TERN_ERR_INVALID, "sampler: vocabulary size is 0");
    enum tern_status st = tern_sampler_params_check(p);
    if (st) return st;
    struct tern_sampler *s = tern_calloc(1, sizeof *s);
    if (!s) return tern_errorf(TERN_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->work = tern_malloc((size_t)n_vocab * sizeof *s->work);
    s->cand = tern_malloc((size_t)n_vocab * sizeof *s->cand);
    if (!s->work || !s->cand) {
        tern_sampler_free(s);
        return tern_errorf(TERN_ERR_NOMEM, "sampler: out of memory for %u logits", n_vocab);
    }
    uint64_t x = p->seed;
    tern_rng_seed(&s->rng, x);
    *out = s;
    return TERN_OK;
}

void tern_sampler_free(struct tern_sampler *s) {
    if (!s) return;
    free(s->work);
    free(s->cand);
    free(s->hist);
    free(s->bias_id);
    free(s->bias);
    free(s);
}

enum tern_status tern_sampler_set_bias(struct tern_sampler *s, const int32_t *ids, const float *bias, size_t n) {
    if (n > TERN_SAMPLER_MAX_BIAS)
        return tern_errorf(TERN_ERR_INVALID, "sampler: %zu biased tokens; the limit is %d", n, TERN_SAMPLER_MAX_BIAS);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= s->n_vocab)
            return tern_errorf(TERN_ERR_INVALID, "sampler: bias for token %d; the vocabulary has %u tokens", ids[i],
                               s->n_vocab);
        if (!isfinite(bias[i]))
            return tern_errorf(TERN_ERR_INVALID, "sampler: the bias of token %d is not finite", ids[i]);
    }
    int32_t *ni = n ? tern_malloc(n * sizeof *ni) : NULL;
    float *nb = n ? tern_malloc(n * sizeof *nb) : NULL;
    if (n && (!ni || !nb)) {
        free(ni);
        free(nb);
        return tern_errorf(TERN_ERR_NOMEM, "sampler: out of memory");
    }
    if (n) {
        memcpy(ni, ids, n * sizeof *ni);
        memcpy(nb, bias, n * sizeof *nb);
    }
    free(s->bias_id);
    free(s->bias);
    s->bias_id = ni;
    s->bias = nb;
    s->n_bias = n;
    return TERN_OK;
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Penalties over the window of the history (the last repeat_last_n tokens; 0 = all). If
 * the window cannot be sorted (out of memory) the penalties are skipped. */
static void apply_penalties(struct tern_sampler *s, float *l, const int32_t *hist, size_t n_hist) {
    const struct tern_sampler_params *p = &s->p;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return;
    if (!hist || !n_hist) return;
    size_t n = n_hist;
    if (p->repeat_last_n > 0 && (size_t)p->repeat_last_n < n) n = (size_t)p->repeat_last_n;
    const int32_t *w = hist + (n_hist - n);
    if (n > s->hist_cap) {
        int32_t *h = tern_reallocarray(s->hist, n, sizeof *h);
        if (!h) return;
        s->hist = h;
        s->hist_cap = n;
    }
    memcpy(s->hist, w, n * sizeof *w);
    qsort(s->hist, n, sizeof *s->hist, cmp_i32);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && s->hist[j] == s->hist[i]) j++;
        const int32_t id = s->hist[i];
        const float count = (float)(j - i);
        i = j;
        if (id < 0 || (uint32_t)id >= s->n_vocab) continue;
        float v = l[id];
        if (p->repeat_penalty != 1.0f) v = v <= 0.0f ? v * p->repeat_penalty : v / p->repeat_penalty;
        v -= count * p->frequency_penalty + p->presence_penalty;
        l[id] = v;
    }
}

/* a before b: larger value first, then lower id. */
static inline bool cand_before(struct cand a, struct cand b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }

static int cmp_cand(const void *pa, const void *pb) {
    const struct cand a = *(const struct cand *)pa, b = *(const struct cand *)pb;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

/* The n best of l[0..V), sorted: a heap of the n best seen (its root the worst of
 * them), then a sort. NaN logits are never selected ahead of a number. */
static void select_top(const float *l, uint32_t V, size_t n, struct cand *c) {
    if (n >= V) {
        for (uint32_t i = 0; i < V; i++) c[i] = (struct cand){(int32_t)i, isnan(l[i]) ? -INFINITY : l[i]};
        qsort(c, V, sizeof *c, cmp_cand);
        return;
    }
    size_t h = 0;
    for (uint32_t i = 0; i < V; i++) {
        const struct cand x = {(int32_t)i, isnan(l[i]) ? -INFINITY : l[i]};
        if (h < n) {
            /* sift up: the heap keeps its worst element at the root */
            size_t j = h++;
            while (j > 0 && cand_before(c[(j - 1) / 2], x)) {
                c[j] = c[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            c[j] = x;
        } else if (cand_before(x, c[0])) {
            size_t j = 0;
            for (;;) {
                size_t a = 2 * j + 1, b = a + 1, w = j;
                struct cand worst = x;
                if (a < h && cand_before(worst, c[a])) w = a, worst = c[a];
                if (b < h && cand_before(worst, c[b])) w = b;
                if (w == j) break;
                c[j] = c[w];
                j = w;
            }
            c[j] = x;
        }
    }
    qsort(c, h, sizeof *c, cmp_cand);
}

static int32_t argmax(const float *l, uint32_t V) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < V; i++)
        if (l[i] > l[best] || (isnan(l[best]) && !isnan(l[i]))) best = i;
    return (int32_t)best;
}

static int32_t sample_work(struct tern_sampler *s, float *l, const int32_t *history, size_t n_history);

int32_t tern_sampler_sample(struct tern_sampler *s, const float *logits, const int32_t *history, size_t n_history) {
    memcpy(s->work, logits, (size_t)s->n_vocab * sizeof *s->work);
    return sample_work(s, s->work, history, n_history);
}

static inline bool allowed(const uint32_t *allow, int32_t i) { return (allow[i / 32] >> (i % 32)) & 1u; }

/* The logits into s->work, the tokens allow leaves out at -inf; the lowest allowed id (-1:
 * none). */
static int32_t mask_into_work(struct tern_sampler *s, const float *logits, const uint32_t *allow) {
    float *l = s->work;
    int32_t first = -1;
    for (uint32_t i = 0; i < s->n_vocab; i++) {
        if (allowed(allow, (int32_t)i)) {
            l[i] = logits[i];
            if (first < 0) first = (int32_t)i;
        } else {
            l[i] = -INFINITY;
        }
    }
    return first;
}

int32_t tern_sampler_sample_masked(struct tern_sampler *s, const float *logits, const uint32_t *allow,
                                   const int32_t *history, size_t n_history) {
    if (!allow) return tern_sampler_sample(s, logits, history, n_history);
    const int32_t first = mask_into_work(s, logits, allow);
    if (first < 0) return -1;
    int32_t t = sample_work(s, s->work, history, n_history);
    /* NaN or -inf logits among the allowed tokens can leave the draw on a removed token:
     * the lowest allowed id is the deterministic answer then */
    return allowed(allow, t) ? t : first;
}

/* The distribution a draw is made from, after penalties and filters: either the whole
 * vocabulary (s->work, unsorted) or the sorted candidates s->cand[0..n). Each weight is
 * exp((v - max) / T), computed the same way for the plain draw and the draft rule. */
struct dist {
    bool full;
    size_t n;
    float max, inv_t;
};

static inline double dist_w(const struct tern_sampler *s, const struct dist *d, size_t i, int32_t *id) {
    if (d->full) {
        *id = (int32_t)i;
        return exp((double)((s->work[i] - d->max) * d->inv_t));
    }
    *id = s->cand[i].id;
    return exp((double)((s->cand[i].v - d->max) * d->inv_t));
}

/* Applies penalties and filters; returns true with *greedy set when the temperature
 * makes it an argmax. */
static bool dist_build(struct tern_sampler *s, const int32_t *history, size_t n_history, struct dist *d,
                       int32_t *greedy) {
    const struct tern_sampler_params *p = &s->p;
    const uint32_t V = s->n_vocab;
    float *l = s->work;
    for (size_t i = 0; i < s->n_bias; i++) l[s->bias_id[i]] += s->bias[i]; /* -inf (masked) stays -inf */
    apply_penalties(s, l, history, n_history);
    if (!(p->temperature > 0.0f)) {
        *greedy = argmax(l, V);
        return true;
    }

    const bool top_k = p->top_k > 0 && (uint32_t)p->top_k < V;
    const bool top_p = p->top_p < 1.0f;
    const bool min_p = p->min_p > 0.0f;
    d->inv_t = 1.0f / p->temperature;
    if (!top_k && !top_p && !min_p) {
        /* The whole distribution: no sort needed. */
        d->full = true;
        d->n = V;
        d->max = l[argmax(l, V)];
        return false;
    }

    /* The candidate set is a sorted prefix cand[0..n) of the (top-k) order, extended by
     * re-selection while a cut-off still lies beyond it. */
    const size_t limit = top_k ? (size_t)p->top_k : V;
    size_t n = top_k ? limit : (limit < 64 ? limit : 64);
    select_top(l, V, n, s->cand);
    struct cand *c = s->cand;
    const float max = c[0].v;
    size_t keep = limit;
    if (top_p) {
        double z = 0.0;
        if (top_k)
            for (size_t i = 0; i < n; i++) z += exp((double)(c[i].v - max));
        else
            for (uint32_t i = 0; i < V; i++) z += isnan(l[i]) ? 0.0 : exp((double)(l[i] - max));
        double cum = 0.0;
        size_t i = 0;
        for (;;) {
            for (; i < n; i++) {
                cum += exp((double)(c[i].v - max)) / z;
                if (cum >= p->top_p) break;
            }
            if (i < n) {
                keep = i + 1;
                break;
            }
            if (n == limit) {
                keep = n;
                break;
            }
            n = n * 4 < limit ? n * 4 : limit;
            select_top(l, V, n, c);
        }
    }
    if (min_p) {
        /* p_i >= min_p * p_max  <=>  l_i >= max + ln(min_p) */
        const float thr = max + logf(p->min_p);
        for (;;) {
            const size_t upto = keep < n ? keep : n;
            size_t j = 0;
            while (j < upto && c[j].v >= thr) j++;
            if (j < upto || upto == keep) {
                keep = j ? j : 1;
                break;
            }
            n = n * 4 < limit ? n * 4 : limit; /* the threshold lies beyond the prefix */
            select_top(l, V, n, c);
        }
    }
    if (keep > n) keep = n;
    d->full = false;
    d->n = keep;
    d->max = max;
    return false;
}

/* A draw from the distribution with token skip (if >= 0) taken out and the rest
 * renormalised: skip = -1 is the plain draw. */
static int32_t dist_draw(struct tern_sampler *s, const struct dist *d, int32_t skip) {
    int32_t id, first = -1;
    double z = 0.0;
    for (size_t i = 0; i < d->n; i++) {
        const double w = dist_w(s, d, i, &id);
        if (id != skip) z += w;
    }
    const double r = tern_rng_uniform(&s->rng) * z;
    double cum = 0.0;
    for (size_t i = 0; i < d->n; i++) {
        const double w = dist_w(s, d, i, &id);
        if (id == skip) continue;
        if (first < 0) first = id;
        cum += w;
        if (cum > r) return id;
    }
    if (d->full) return argmax(s->work, s->n_vocab);
    return first >= 0 ? first : s->cand[0].id;
}

/* s->work holds the logits (l is s->work). */
static int32_t sample_work(struct tern_sampler *s, float *l, const int32_t *history, size_t n_history) {
    TERN_ASSERT(l == s->work);
    struct dist d;
    int32_t g;
    if (dist_build(s, history, n_history, &d, &g)) return g;
    return dist_draw(s, &d, -1);
}

/* The draft rule over s->work (the logits, disallowed ones at -inf). */
static int32_t draft_work(struct tern_sampler *s, const int32_t *history, size_t n_history, int32_t draft,
                          bool *accepted) {
    struct dist d;
    int32_t g;
    *accepted = false;
    if (dist_build(s, history, n_history, &d, &g)) {
        *accepted = g == draft;
        return g;
    }
    /* The draft's weight w_d and the total z: accept with probability w_d / z. */
    double z = 0.0, wd = 0.0;
    int32_t id;
    for (size_t i = 0; i < d.n; i++) {
        const double w = dist_w(s, &d, i, &id);
        z += w;
        if (id == draft) wd = w;
    }
    /* A draft outside the candidates has probability 0: a plain draw (the same random
     * numbers as without a draft). */
    if (!(wd > 0.0)) return dist_draw(s, &d, -1);
    if (tern_rng_uniform(&s->rng) * z < wd) {
        *accepted = true;
        return draft;
    }
    return dist_draw(s, &d, draft);
}

int32_t tern_sampler_sample_draft(struct tern_sampler *s, const float *logits, const int32_t *history,
                                  size_t n_history, int32_t draft, bool *accepted) {
    memcpy(s->work, logits, (size_t)s->n_vocab * sizeof *s->work);
    return draft_work(s, history, n_history, draft, accepted);
}

int32_t tern_sampler_sample_draft_masked(struct tern_sampler *s, const float *logits, const uint32_t *allow,
                                         const int32_t *history, size_t n_history, int32_t draft, bool *accepted) {
    if (!allow) return tern_sampler_sample_draft(s, logits, history, n_history, draft, accepted);
    *accepted = false;
    const int32_t first = mask_into_work(s, logits, allow);
    if (first < 0) return -1;
    const int32_t t = draft_work(s, history, n_history, draft >= 0 && allowed(allow, draft) ? draft : -1, accepted);
    /* as tern_sampler_sample_masked: a draw left on a removed token (NaN or -inf logits
     * among the allowed) gives the lowest allowed id */
    if (allowed(allow, t)) return t;
    *accepted = first == draft;
    return first;
}
