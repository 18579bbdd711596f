/* Sampling: greedy ties, seeded determinism, the filters against a brute-force
 * reference, penalties, the distribution itself, parameter checks. */
#include "harness.h"

#include "tern.h"
#include "util/mem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct tern_sampler *mk(float temp, int top_k, float top_p, float min_p, uint64_t seed, uint32_t nv) {
    struct tern_sampler_params p;
    tern_sampler_params_default(&p);
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    struct tern_sampler *s = NULL;
    assert_int_equal(tern_sampler_new(&p, nv, &s), TERN_OK);
    return s;
}

static void test_greedy(void **state) {
    (void)state;
    const float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, NAN};
    struct tern_sampler *s = mk(0.0f, 0, 1.0f, 0.0f, 1, 6);
    assert_int_equal(tern_sampler_sample(s, l, NULL, 0), 1); /* tie 1 vs 3 -> lowest id */
    tern_sampler_free(s);
    s = mk(-1.0f, 40, 0.9f, 0.1f, 1, 6);
    assert_int_equal(tern_sampler_sample(s, l, NULL, 0), 1);
    tern_sampler_free(s);
    tern_sampler_free(NULL);
}

static void test_seeded_determinism(void **state) {
    (void)state;
    const uint32_t nv = 1000;
    float *l = malloc(nv * sizeof *l);
    for (uint32_t i = 0; i < nv; i++) l[i] = sinf((float)i * 0.37f) * 3.0f;
    int32_t a[200], b[200], c[200];
    struct tern_sampler *sa = mk(1.0f, 0, 1.0f, 0.0f, 42, nv), *sb = mk(1.0f, 0, 1.0f, 0.0f, 42, nv),
                        *sc = mk(1.0f, 0, 1.0f, 0.0f, 43, nv);
    for (int i = 0; i < 200; i++) {
        a[i] = tern_sampler_sample(sa, l, NULL, 0);
        b[i] = tern_sampler_sample(sb, l, NULL, 0);
        c[i] = tern_sampler_sample(sc, l, NULL, 0);
    }
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    tern_sampler_free(sa), tern_sampler_free(sb), tern_sampler_free(sc);
    free(l);
}

static void test_distribution(void **state) {
    (void)state;
    /* p(1) / p(0) = e^{ln 2 / T}: T = 1 gives 2/3 for token 1 */
    const float l[2] = {0.0f, logf(2.0f)};
    struct tern_sampler *s = mk(1.0f, 0, 1.0f, 0.0f, 7, 2);
    int n1 = 0;
    for (int i = 0; i < 30000; i++) n1 += tern_sampler_sample(s, l, NULL, 0) == 1;
    assert_true(fabs(n1 / 30000.0 - 2.0 / 3.0) < 0.015);
    tern_sampler_free(s);
    /* T = 0.5 squares the ratio: 4/5 */
    s = mk(0.5f, 0, 1.0f, 0.0f, 8, 2);
    n1 = 0;
    for (int i = 0; i < 30000; i++) n1 += tern_sampler_sample(s, l, NULL, 0) == 1;
    assert_true(fabs(n1 / 30000.0 - 0.8) < 0.015);
    tern_sampler_free(s);
}

/* Sorted order with ties by id, for the reference. */
static const float *g_l;
static int cmp_ref(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_l[x] != g_l[y]) return g_l[x] > g_l[y] ? -1 : 1;
    return (x > y) - (x < y);
}

/* The set of tokens the filters keep, computed by sorting everything. */
static size_t ref_keep(const float *l, uint32_t nv, int top_k, float top_p, float min_p, int32_t *order) {
    for (uint32_t i = 0; i < nv; i++) order[i] = (int32_t)i;
    g_l = l;
    qsort(order, nv, sizeof *order, cmp_ref);
    size_t n = top_k > 0 && (uint32_t)top_k < nv ? (size_t)top_k : nv;
    const double mx = l[order[0]];
    if (top_p < 1.0f) {
        double z = 0, cum = 0;
        for (size_t i = 0; i < n; i++) z += exp(l[order[i]] - mx);
        for (size_t i = 0; i < n; i++) {
            cum += exp(l[order[i]] - mx) / z;
            if (cum >= top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (min_p > 0.0f) {
        size_t j = 0;
        while (j < n && l[order[j]] >= (float)mx + logf(min_p)) j++;
        n = j ? j : 1;
    }
    return n;
}

static void test_filters_match_reference(void **state) {
    (void)state;
    const uint32_t nv = 6000;
    float *l = malloc(nv * sizeof *l);
    int32_t *order = malloc(nv * sizeof *order);
    char *in = malloc(nv);
    uint64_t x = 12345;
    for (uint32_t i = 0; i < nv; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        l[i] = (float)((double)(x >> 11) * 0x1.0p-53) * 12.0f; /* flat-ish: top-p reaches deep */
    }
    l[17] = l[99] = 13.0f; /* a tie at the top: 17 first */
    const struct {
        int k;
        float p, mp;
    } cfg[] = {{0, 0.9f, 0.0f}, {0, 0.5f, 0.0f}, {40, 1.0f, 0.0f}, {40, 0.8f, 0.0f},
               {0, 1.0f, 0.3f}, {0, 0.95f, 0.05f}, {1, 1.0f, 0.0f}, {0, 0.0f, 0.0f}};
    for (size_t c = 0; c < TERN_ARRAY_LEN(cfg); c++) {
        const size_t n = ref_keep(l, nv, cfg[c].k, cfg[c].p, cfg[c].mp, order);
        memset(in, 0, nv);
        for (size_t i = 0; i < n; i++) in[order[i]] = 1;
        struct tern_sampler *s = mk(1.5f, cfg[c].k, cfg[c].p, cfg[c].mp, 100 + c, nv);
        int distinct = 0;
        char *hit = calloc(nv, 1);
        for (int i = 0; i < 100; i++) {
            const int32_t t = tern_sampler_sample(s, l, NULL, 0);
            assert_true(t >= 0 && (uint32_t)t < nv);
            if (!in[t]) fail_msg("config %zu: sampled %d outside the reference set of %zu", c, t, n);
            distinct += !hit[t];
            hit[t] = 1;
        }
        /* a wide set is really used */
        if (n > 1000) assert_true(distinct > 40);
        if (n == 1) assert_int_equal(distinct, 1);
        free(hit);
        tern_sampler_free(s);
    }
    free(l), free(order), free(in);
}

static void test_penalties(void **state) {
    (void)state;
    struct tern_sampler_params p;
    tern_sampler_params_default(&p);
    p.temperature = 0.0f;
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 2;
    struct tern_sampler *s;
    assert_int_equal(tern_sampler_new(&p, 4, &s), TERN_OK);
    const float l[4] = {1.0f, 0.9f, -0.1f, -0.2f};
    const int32_t h[3] = {1, 0, 3};
    /* only the last 2 of {1, 0, 3}: 0 (1.0 -> 0.5) and 3 penalised, 1 not: 1 wins */
    assert_int_equal(tern_sampler_sample(s, l, h, 3), 1);
    /* window {1}: 1 penalised (0.9 -> 0.45), 0 wins */
    assert_int_equal(tern_sampler_sample(s, l, h, 1), 0);
    /* window {1, 0}: both halved, 0 wins again */
    assert_int_equal(tern_sampler_sample(s, l, h, 2), 0);
    /* a negative logit is multiplied: -0.1 -> -0.2, now below -0.15 */
    const float ln[4] = {-0.1f, -0.15f, -3.0f, -3.0f};
    const int32_t hn[1] = {0};
    assert_int_equal(tern_sampler_sample(s, ln, hn, 1), 1);
    tern_sampler_free(s);
    /* presence / frequency: counts matter */
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 0;
    p.frequency_penalty = 0.3f;
    assert_int_equal(tern_sampler_new(&p, 4, &s), TERN_OK);
    const int32_t h2[3] = {0, 0, 1}; /* 0: 1.0 - 0.6 = 0.4; 1: 0.9 - 0.3 = 0.6 */
    assert_int_equal(tern_sampler_sample(s, l, h2, 3), 1);
    tern_sampler_free(s);
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 1.5f;
    assert_int_equal(tern_sampler_new(&p, 4, &s), TERN_OK);
    const int32_t h3[2] = {0, 1}; /* 0 -> -0.5, 1 -> -0.6, 2 stays -0.1 */
    assert_int_equal(tern_sampler_sample(s, l, h3, 2), 2);
    /* out-of-range ids in the history are ignored; the logits are not modified */
    const int32_t h4[2] = {-5, 99};
    assert_int_equal(tern_sampler_sample(s, l, h4, 2), 0);
    assert_true(l[0] == 1.0f);
    tern_sampler_free(s);
}

/* A mask removes tokens before anything else; an all-ones mask changes nothing. */
static void test_masked(void **state) {
    (void)state;
    const uint32_t nv = 300;
    float *l = malloc(nv * sizeof *l);
    for (uint32_t i = 0; i < nv; i++) l[i] = (float)((i * 37) % 101) * 0.05f;
    uint32_t all[10], some[10], none[10];
    memset(all, 0xff, sizeof all);
    memset(some, 0, sizeof some);
    memset(none, 0, sizeof none);
    for (uint32_t i = 5; i < nv; i += 7) some[i / 32] |= 1u << (i % 32);
    for (int cfg = 0; cfg < 3; cfg++) {
        struct tern_sampler *a = mk(cfg == 0 ? 0.0f : 1.0f, cfg == 2 ? 0 : 40, cfg == 2 ? 1.0f : 0.9f, 0.0f, 7, nv);
        struct tern_sampler *b = mk(cfg == 0 ? 0.0f : 1.0f, cfg == 2 ? 0 : 40, cfg == 2 ? 1.0f : 0.9f, 0.0f, 7, nv);
        for (int k = 0; k < 200; k++) /* bit-identical draws with an all-ones mask */
            assert_int_equal(tern_sampler_sample(a, l, NULL, 0), tern_sampler_sample_masked(b, l, all, NULL, 0));
        for (int k = 0; k < 200; k++) {
            int32_t t = tern_sampler_sample_masked(a, l, some, NULL, 0);
            assert_true(t >= 5 && (t - 5) % 7 == 0);
        }
        assert_int_equal(tern_sampler_sample_masked(a, l, none, NULL, 0), -1);
        tern_sampler_free(a);
        tern_sampler_free(b);
    }
    /* greedy: the best allowed token; even NaN and -inf logits never escape the mask */
    struct tern_sampler *g = mk(0.0f, 0, 1.0f, 0.0f, 1, nv);
    l[12] = 100.0f;
    assert_int_equal(tern_sampler_sample_masked(g, l, some, NULL, 0), 12); /* 12 = 5 + 7 is allowed */
    l[13] = 200.0f; /* not allowed */
    assert_int_equal(tern_sampler_sample_masked(g, l, some, NULL, 0), 12);
    for (uint32_t i = 0; i < nv; i++) l[i] = (i % 2) ? NAN : -INFINITY;
    int32_t t = tern_sampler_sample_masked(g, l, some, NULL, 0);
    assert_true(t >= 5 && (t - 5) % 7 == 0);
    tern_sampler_free(g);
    free(l);
}

/* The draft rule under a mask: the masked distribution is the target (each token at its
 * probability among the allowed, an allowed draft accepted at its probability), a draft
 * the mask leaves out is never accepted and costs the masked draw's random numbers,
 * greedy is the best allowed token, nothing allowed gives -1. */
static void test_draft_masked(void **state) {
    (void)state;
    enum { V = 8, N = 200000 };
    const float l[V] = {1.0f, 0.2f, 2.0f, -1.0f, 0.7f, 1.5f, 3.0f, 0.1f};
    const uint32_t allow[1] = {0x37u}; /* 0, 1, 2, 4, 5 (not 3, 6, 7) */
    double q[V] = {0}, z = 0;
    for (int i = 0; i < V; i++)
        if (allow[0] >> i & 1) z += exp(l[i]);
    for (int i = 0; i < V; i++) q[i] = (allow[0] >> i & 1) ? exp(l[i]) / z : 0;
    for (int32_t draft = 0; draft < 6; draft += 5) {
        struct tern_sampler *s = mk(1.0f, 0, 1.0f, 0.0f, 3, V);
        long cnt[V] = {0}, n_acc = 0;
        for (int it = 0; it < N; it++) {
            bool acc;
            const int32_t t = tern_sampler_sample_draft_masked(s, l, allow, NULL, 0, draft, &acc);
            assert_true(t >= 0 && t < V && (allow[0] >> t & 1));
            assert_true(acc == (t == draft));
            cnt[t]++;
            n_acc += acc;
        }
        for (int i = 0; i < V; i++) {
            const double sd = sqrt(q[i] * (1 - q[i]) / N) + 1e-9;
            assert_true(fabs((double)cnt[i] / N - q[i]) < 4.5 * sd + 1e-6);
        }
        assert_true(fabs((double)n_acc / N - q[draft]) < 4.5 * sqrt(q[draft] * (1 - q[draft]) / N) + 1e-6);
        tern_sampler_free(s);
    }
    /* a draft outside the mask (6 has the largest logit): never accepted, the plain masked draw */
    struct tern_sampler *a = mk(1.0f, 0, 1.0f, 0.0f, 11, V), *b = mk(1.0f, 0, 1.0f, 0.0f, 11, V);
    for (int it = 0; it < 1000; it++) {
        bool acc;
        assert_int_equal(tern_sampler_sample_draft_masked(a, l, allow, NULL, 0, 6, &acc),
                         tern_sampler_sample_masked(b, l, allow, NULL, 0));
        assert_false(acc);
    }
    tern_sampler_free(a);
    tern_sampler_free(b);
    struct tern_sampler *g = mk(0.0f, 0, 1.0f, 0.0f, 1, V);
    bool acc;
    assert_int_equal(tern_sampler_sample_draft_masked(g, l, allow, NULL, 0, 2, &acc), 2); /* 6 is masked */
    assert_true(acc);
    assert_int_equal(tern_sampler_sample_draft_masked(g, l, allow, NULL, 0, 6, &acc), 2);
    assert_false(acc);
    assert_int_equal(tern_sampler_sample_draft_masked(g, l, allow, NULL, 0, -1, &acc), 2);
    assert_false(acc);
    const uint32_t none[1] = {0};
    assert_int_equal(tern_sampler_sample_draft_masked(g, l, none, NULL, 0, 2, &acc), -1);
    assert_false(acc);
    tern_sampler_free(g);
}

static void test_bad_params(void **state) {
    (void)state;
    struct tern_sampler_params p;
    struct tern_sampler *s = (struct tern_sampler *)1;
    tern_sampler_params_default(&p);
    assert_int_equal(tern_sampler_new(&p, 0, &s), TERN_ERR_INVALID);
    assert_null(s);
    p.repeat_penalty = 0.0f;
    assert_int_equal(tern_sampler_new(&p, 10, &s), TERN_ERR_INVALID);
    tern_sampler_params_default(&p);
    p.top_p = NAN;
    assert_int_equal(tern_sampler_new(&p, 10, &s), TERN_ERR_INVALID);
    tern_sampler_params_default(&p);
    p.min_p = 2.0f;
    assert_int_equal(tern_sampler_new(&p, 10, &s), TERN_ERR_INVALID);
}

/* logit_bias: added before everything else, in every sample function; a masked token
 * stays masked whatever its bias; bad ids and values are refused, the sampler unchanged. */
static void test_logit_bias(void **state) {
    (void)state;
    const float l[6] = {0.5f, 2.0f, -1.0f, 1.0f, 1.9f, 0.0f};
    struct tern_sampler *s = mk(0.0f, 0, 1.0f, 0.0f, 1, 6);
    assert_int_equal(tern_sampler_sample(s, l, NULL, 0), 1);
    const int32_t ban[] = {1};
    const float ban_b[] = {-100.0f};
    assert_int_equal(tern_sampler_set_bias(s, ban, ban_b, 1), TERN_OK);
    assert_int_equal(tern_sampler_sample(s, l, NULL, 0), 4); /* the next best */
    const int32_t up[] = {2, 5};
    const float up_b[] = {3.5f, 1.5f};
    assert_int_equal(tern_sampler_set_bias(s, up, up_b, 2), TERN_OK);
    assert_int_equal(tern_sampler_sample(s, l, NULL, 0), 2); /* -1 + 3.5 beats 2 */
    bool acc = false;
    assert_int_equal(tern_sampler_sample_draft(s, l, NULL, 0, 2, &acc), 2);
    assert_true(acc);
    /* under a mask (a grammar): the biased token 2 is not allowed, so it stays out */
    uint32_t allow = (1u << 0) | (1u << 3) | (1u << 5);
    assert_int_equal(tern_sampler_sample_masked(s, l, &allow, NULL, 0), 5); /* 0 + 1.5 beats 1 and 0.5 */
    assert_int_equal(tern_sampler_sample_draft_masked(s, l, &allow, NULL, 0, 2, &acc), 5);
    assert_false(acc);
    /* a sampled draw follows the bias too: token 0 at +100 takes all the mass */
    struct tern_sampler *t = mk(1.0f, 0, 1.0f, 0.0f, 7, 6);
    const int32_t force[] = {0};
    const float force_b[] = {100.0f};
    assert_int_equal(tern_sampler_set_bias(t, force, force_b, 1), TERN_OK);
    for (int i = 0; i < 50; i++) assert_int_equal(tern_sampler_sample(t, l, NULL, 0), 0);
    tern_sampler_free(t);
    /* refused: out of range, not finite, too many; the bias set before still applies */
    const int32_t bad_id[] = {6};
    const float one[] = {1.0f};
    assert_int_equal(tern_sampler_set_bias(s, bad_id, one, 1), TERN_ERR_INVALID);
    const int32_t neg[] = {-1};
    assert_int_equal(tern_sampler_set_bias(s, neg, one, 1), TERN_ERR_INVALID);
    const float inf[] = {INFINITY};
    assert_int_equal(tern_sampler_set_bias(s, up, inf, 1), TERN_ERR_INVALID);
    assert_int_equal(tern_sampler_set_bias(s, up, up_b, TERN_SAMPLER_MAX_BIAS + 1), TERN_ERR_INVALID);
    assert_int_equal(tern_sampler_sample(s, l, NULL, 0), 2);
    /* cleared */
    assert_int_equal(tern_sampler_set_bias(s, NULL, NULL, 0), TERN_OK);
    assert_int_equal(tern_sampler_sample(s, l, NULL, 0), 1);
    tern_sampler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),       cmocka_unit_test(test_seeded_determinism),
        cmocka_unit_test(test_distribution), cmocka_unit_test(test_filters_match_reference),
        cmocka_unit_test(test_penalties),    cmocka_unit_test(test_bad_params), cmocka_unit_test(test_masked),
        cmocka_unit_test(test_draft_masked), cmocka_unit_test(test_logit_bias),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
