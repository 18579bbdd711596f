/* Element-wise and attention ops: portable and AVX2 twins against a double-precision
 * reference on odd sizes and edge values; RoPE angles and orderings; element values
 * that do not depend on where a row starts (exactness). */
#include "harness.h"

#include "kernels/ops.h"
#include "util/fp16.h"
#include "util/mem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rs = 88172645463325252ull;
static float frand(float lo, float hi) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return lo + (hi - lo) * (float)((double)(rs >> 11) * 0x1.0p-53);
}

static const size_t sizes[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 64, 100, 257, 1024, 1031};

/* The op sets to check: portable always, AVX2 when the CPU has it. */
static const struct tern_ops *sets[2];
static int n_sets;

static void setup_sets(void) {
    n_sets = 0;
    sets[n_sets++] = tern_ops_portable();
    if (tern_ops_avx2()) sets[n_sets++] = tern_ops_avx2();
    else printf("no AVX2 on this CPU: only the portable ops are checked\n");
}

static void test_rmsnorm(void **state) {
    (void)state;
    for (size_t si = 0; si < TERN_ARRAY_LEN(sizes); si++) {
        const size_t n = sizes[si];
        float *x = malloc(n * 4), *w = malloc(n * 4), *y = malloc(n * 4);
        for (size_t i = 0; i < n; i++) x[i] = frand(-3, 3), w[i] = frand(0.5f, 1.5f);
        double ss = 0;
        for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
        const double sc = 1.0 / sqrt(ss / (double)n + 1e-5);
        for (int k = 0; k < n_sets; k++) {
            sets[k]->rmsnorm(y, x, w, n, 1e-5f);
            for (size_t i = 0; i < n; i++) {
                const double want = x[i] * sc * w[i];
                if (fabs(y[i] - want) > 1e-5 * (fabs(want) + 1e-3))
                    fail_msg("%s rmsnorm n=%zu i=%zu: %g vs %g", sets[k]->name, n, i, y[i], want);
            }
            /* in place, no weight */
            memcpy(y, x, n * 4);
            sets[k]->rmsnorm(y, y, NULL, n, 1e-5f);
            for (size_t i = 0; i < n; i++) assert_true(fabs(y[i] - x[i] * sc) <= 1e-5 * (fabs(x[i] * sc) + 1e-3));
        }
        free(x), free(w), free(y);
    }
}

static void test_swiglu_and_add(void **state) {
    (void)state;
    for (size_t si = 0; si < TERN_ARRAY_LEN(sizes); si++) {
        const size_t n = sizes[si];
        float *g = malloc(n * 4), *u = malloc(n * 4), *y = malloc(n * 4);
        for (size_t i = 0; i < n; i++) g[i] = frand(-20, 20), u[i] = frand(-2, 2);
        g[0] = -100.0f; /* exp overflows in silu's denominator: result -0 */
        if (n > 1) g[1] = 90.0f;
        for (int k = 0; k < n_sets; k++) {
            sets[k]->swiglu(y, g, u, n);
            for (size_t i = 0; i < n; i++) {
                const double want = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
                if (fabs(y[i] - want) > 2e-6 * (fabs(want) + 1e-6))
                    fail_msg("%s swiglu n=%zu i=%zu g=%g: %g vs %g", sets[k]->name, n, i, g[i], y[i], want);
            }
            float *a = malloc(n * 4);
            memcpy(a, u, n * 4);
            sets[k]->add(a, g, n);
            for (size_t i = 0; i < n; i++) assert_true(a[i] == u[i] + g[i]);
            free(a);
        }
        free(g), free(u), free(y);
    }
}

/* An element's value must not depend on the call it is part of: swiglu over a block of
 * rows equals swiglu row by row, whatever the row length (tails). */
static void test_elementwise_position_independent(void **state) {
    (void)state;
    const size_t n = 37 * 5;
    float g[37 * 5], u[37 * 5], all[37 * 5], row[37];
    for (size_t i = 0; i < n; i++) g[i] = frand(-10, 10), u[i] = frand(-1, 1);
    for (int k = 0; k < n_sets; k++) {
        sets[k]->swiglu(all, g, u, n);
        for (size_t r = 0; r < 5; r++) {
            sets[k]->swiglu(row, g + r * 37, u + r * 37, 37);
            assert_memory_equal(row, all + r * 37, sizeof row);
        }
    }
}

static void test_to_f16(void **state) {
    (void)state;
    for (size_t si = 0; si < TERN_ARRAY_LEN(sizes); si++) {
        const size_t n = sizes[si];
        float *x = malloc(n * 4);
        uint16_t *h = malloc(n * 2);
        for (size_t i = 0; i < n; i++) x[i] = frand(-70000, 70000) * (i % 3 ? 1.0f : 1e-6f);
        x[0] = 65520.0f; /* rounds to infinity */
        if (n > 1) x[1] = 1e-8f; /* subnormal half */
        if (n > 2) x[2] = -0.0f;
        for (int k = 0; k < n_sets; k++) {
            sets[k]->to_f16(h, x, n);
            for (size_t i = 0; i < n; i++)
                if (h[i] != tern_f32_to_fp16(x[i])) fail_msg("%s to_f16 n=%zu i=%zu x=%g", sets[k]->name, n, i, x[i]);
        }
        free(x), free(h);
    }
}

static void test_softmax(void **state) {
    (void)state;
    for (size_t si = 0; si < TERN_ARRAY_LEN(sizes); si++) {
        const size_t n = sizes[si];
        float *x = malloc(n * 4), *y = malloc(n * 4);
        for (size_t i = 0; i < n; i++) x[i] = frand(-30, 30);
        if (n > 3) x[2] = -INFINITY, x[3] = -1e30f;
        double mx = -INFINITY, z = 0;
        for (size_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        for (size_t i = 0; i < n; i++) z += exp((double)x[i] - mx);
        for (int k = 0; k < n_sets; k++) {
            memcpy(y, x, n * 4);
            sets[k]->softmax(y, n);
            for (size_t i = 0; i < n; i++) {
                const double want = exp((double)x[i] - mx) / z;
                if (fabs(y[i] - want) > 2e-6 * want + 1e-12)
                    fail_msg("%s softmax n=%zu i=%zu: %g vs %g", sets[k]->name, n, i, y[i], want);
            }
        }
        free(x), free(y);
    }
}

/* Attention over pages of 4 rows (so that every test crosses pages, and the online
 * softmax rescales), rows of two heads interleaved, F32 and F16. */
static void check_attn(size_t d, size_t n_kv, bool f16) {
    const size_t page_rows = 4, n_kvh = 2, row = n_kvh * d;
    const size_t n_pages = (n_kv + page_rows - 1) / page_rows;
    const size_t es = f16 ? 2 : 4;
    void **kp = calloc(n_pages, sizeof(void *)), **vp = calloc(n_pages, sizeof(void *));
    double *kf = malloc(sizeof(double) * n_kv * d), *vf = malloc(sizeof(double) * n_kv * d);
    const size_t head = 1;
    for (size_t p = 0; p < n_pages; p++) kp[p] = malloc(page_rows * row * es), vp[p] = malloc(page_rows * row * es);
    for (size_t j = 0; j < n_kv; j++) {
        for (size_t e = 0; e < row; e++) {
            float kv = frand(-1, 1), vv = frand(-1, 1);
            const size_t off = (j % page_rows) * row + e;
            if (f16) {
                ((uint16_t *)kp[j / page_rows])[off] = tern_f32_to_fp16(kv);
                ((uint16_t *)vp[j / page_rows])[off] = tern_f32_to_fp16(vv);
                kv = tern_fp16_to_f32(tern_f32_to_fp16(kv));
                vv = tern_fp16_to_f32(tern_f32_to_fp16(vv));
            } else {
                ((float *)kp[j / page_rows])[off] = kv;
                ((float *)vp[j / page_rows])[off] = vv;
            }
            if (e / d == head) kf[j * d + e % d] = kv, vf[j * d + e % d] = vv;
        }
    }
    float *q = malloc(d * 4), *out = malloc(d * 4), *scores = malloc((n_kv + 8) * 4);
    for (size_t i = 0; i < d; i++) q[i] = frand(-2, 2);
    const float scale = 1.0f / sqrtf((float)d);
    double *s = malloc(sizeof(double) * n_kv), mx = -INFINITY, z = 0;
    for (size_t j = 0; j < n_kv; j++) {
        double a = 0;
        for (size_t i = 0; i < d; i++) a += (double)q[i] * kf[j * d + i];
        s[j] = a * scale;
        mx = s[j] > mx ? s[j] : mx;
    }
    for (size_t j = 0; j < n_kv; j++) z += (s[j] = exp(s[j] - mx));
    for (int k = 0; k < n_sets; k++) {
        /* page by page, as the engine calls it */
        float m = -INFINITY, l = 0.0f;
        memset(out, 0, d * 4);
        for (size_t pg = 0; pg < n_pages; pg++) {
            const size_t nr = n_kv - pg * page_rows < page_rows ? n_kv - pg * page_rows : page_rows;
            sets[k]->attn_page(out, &m, &l, q, d, (const char *)kp[pg] + head * d * es,
                               (const char *)vp[pg] + head * d * es, row, nr, scale, f16, scores);
        }
        for (size_t i = 0; i < d; i++) out[i] /= l;
        for (size_t i = 0; i < d; i++) {
            double want = 0;
            for (size_t j = 0; j < n_kv; j++) want += s[j] / z * vf[j * d + i];
            if (fabs(out[i] - want) > 1e-5)
                fail_msg("%s attn d=%zu n_kv=%zu f16=%d i=%zu: %g vs %g", sets[k]->name, d, n_kv, f16, i, out[i], want);
        }
    }
    for (size_t p = 0; p < n_pages; p++) free(kp[p]), free(vp[p]);
    free(kp), free(vp), free(kf), free(vf), free(q), free(out), free(scores), free(s);
}

static void test_attention(void **state) {
    (void)state;
    const size_t dims[] = {8, 12, 16, 64, 72, 128, 256};
    const size_t lens[] = {1, 3, 4, 5, 9, 33, 100};
    for (size_t a = 0; a < TERN_ARRAY_LEN(dims); a++)
        for (size_t b = 0; b < TERN_ARRAY_LEN(lens); b++) {
            check_attn(dims[a], lens[b], false);
            check_attn(dims[a], lens[b], true);
        }
}

/* With the kernels' AVX-512 tiles on, attn_page runs 512-bit loops that must give the AVX2
 * loops' bits: head sizes around the 8-, 64- and 128-element paths, key counts around
 * the groups of eight, F16 and F32 rows, several pages in a row. */
static void test_attention_avx512_same_bits(void **state) {
    (void)state;
    const struct tern_ops *o = tern_ops_avx2();
    if (!o || !tern_kernels_avx512_available()) {
        printf("note: no AVX-512 on this CPU; nothing to compare\n");
        return;
    }
    const size_t dims[] = {8, 16, 64, 72, 128, 136, 256};
    const size_t lens[] = {1, 5, 8, 9, 17, 256};
    int compared = 0;
    for (size_t a = 0; a < TERN_ARRAY_LEN(dims); a++)
        for (size_t b = 0; b < TERN_ARRAY_LEN(lens); b++)
            for (int f16 = 0; f16 < 2; f16++) {
                const size_t d = dims[a], n = lens[b], row = 2 * d, es = f16 ? 2 : 4;
                char *k = malloc(n * row * es), *v = malloc(n * row * es);
                float *q = malloc(d * 4), *scores = malloc((n + 8) * 4), *out[2] = {malloc(d * 4), malloc(d * 4)};
                float ml[2][2];
                assert_true(k && v && q && scores && out[0] && out[1]);
                for (size_t e = 0; e < n * row; e++) {
                    const float kv = frand(-1, 1), vv = frand(-1, 1);
                    if (f16) ((uint16_t *)k)[e] = tern_f32_to_fp16(kv), ((uint16_t *)v)[e] = tern_f32_to_fp16(vv);
                    else ((float *)k)[e] = kv, ((float *)v)[e] = vv;
                }
                for (size_t i = 0; i < d; i++) q[i] = frand(-2, 2);
                for (int w = 0; w < 2; w++) {
                    assert_true(tern_kernels_set_avx512(w));
                    ml[w][0] = -INFINITY, ml[w][1] = 0.0f;
                    memset(out[w], 0, d * 4);
                    for (int pg = 0; pg < 3; pg++) /* the same page three times: a running state */
                        o->attn_page(out[w], &ml[w][0], &ml[w][1], q, d, k + d * es, v + d * es, row, n,
                                     0.125f + 0.5f * (float)pg, f16, scores);
                }
                if (memcmp(out[0], out[1], d * 4) || memcmp(ml[0], ml[1], sizeof ml[0]))
                    fail_msg("attn_page d=%zu n=%zu f16=%d: AVX-512 and AVX2 differ (out[0] %a vs %a, l %a vs %a)", d,
                             n, f16, out[1][0], out[0][0], ml[1][1], ml[0][1]);
                compared++;
                free(k), free(v), free(q), free(scores), free(out[0]), free(out[1]);
            }
    assert_int_equal(compared, 84);
    assert_true(tern_kernels_set_avx512(true));
}

/* attn_page_multi must give every query exactly attn_page's bits, whatever the number of
 * queries sharing the call: nq around the kernels' pairs and groups of 4 and 6, head sizes
 * around the 8-, 16- and 64-element paths (12: the portable fallback), row counts around
 * the groups of 8 and 16, F16 and F32 rows, three pages in a row (a running state), for the
 * portable ops and the AVX2 ops with the AVX-512 loops off and on. */
static int check_attn_multi(const struct tern_ops *o, size_t d, size_t n, size_t nq, bool f16) {
    const size_t row = 2 * d, es = f16 ? 2 : 4, n_pg = 3;
    char *k = malloc(n_pg * n * row * es), *v = malloc(n_pg * n * row * es);
    float *q = malloc(nq * d * 4), *acc[2] = {malloc(nq * d * 4), malloc(nq * d * 4)}, ml[2][2 * TERN_ATTN_MAX_Q];
    float *scratch = malloc(tern_attn_multi_scratch_floats(nq, n, d) * 4);
    assert_true(k && v && q && acc[0] && acc[1] && scratch);
    for (size_t e = 0; e < n_pg * n * row; e++) {
        const float kv = frand(-1, 1), vv = frand(-1, 1);
        if (f16) ((uint16_t *)k)[e] = tern_f32_to_fp16(kv), ((uint16_t *)v)[e] = tern_f32_to_fp16(vv);
        else ((float *)k)[e] = kv, ((float *)v)[e] = vv;
    }
    /* query 1 is large: its exps underflow to 0 for most rows */
    for (size_t i = 0; i < nq * d; i++) q[i] = frand(-2, 2) * (i / d == 1 ? 40.0f : 1.0f);
    struct tern_attn_query qs[TERN_ATTN_MAX_Q];
    for (int w = 0; w < 2; w++) { /* 0: one query at a time, 1: all in one call */
        for (size_t a = 0; a < nq; a++) {
            ml[w][2 * a] = -INFINITY, ml[w][2 * a + 1] = 0.0f;
            qs[a] = (struct tern_attn_query){q + a * d, acc[w] + a * d, &ml[w][2 * a], &ml[w][2 * a + 1]};
        }
        memset(acc[w], 0, nq * d * 4);
        for (size_t pg = 0; pg < n_pg; pg++) {
            const char *kp = k + (pg * n * row + d) * es, *vp = v + (pg * n * row + d) * es;
            const float scale = 0.125f + 0.25f * (float)pg;
            if (w == 0)
                for (size_t a = 0; a < nq; a++)
                    o->attn_page(qs[a].acc, qs[a].m, qs[a].l, qs[a].q, d, kp, vp, row, n, scale, f16, scratch);
            else o->attn_page_multi(qs, nq, d, kp, vp, row, n, scale, f16, scratch);
        }
    }
    if (memcmp(acc[0], acc[1], nq * d * 4) || memcmp(ml[0], ml[1], 2 * nq * sizeof(float))) {
        size_t a = 0, i = 0;
        while (a < nq && !memcmp(acc[0] + a * d, acc[1] + a * d, d * 4) && ml[0][2 * a] == ml[1][2 * a] &&
               ml[0][2 * a + 1] == ml[1][2 * a + 1])
            a++;
        while (a < nq && i + 1 < d && acc[0][a * d + i] == acc[1][a * d + i]) i++;
        fail_msg("%s (avx512 %d) attn_page_multi d=%zu n=%zu nq=%zu f16=%d: query %zu differs (acc[%zu] %a vs %a, "
                 "l %a vs %a)",
                 o->name, tern_kernels_avx512(), d, n, nq, f16, a, i, acc[1][a * d + i], acc[0][a * d + i],
                 ml[1][2 * a + 1], ml[0][2 * a + 1]);
    }
    free(k), free(v), free(q), free(acc[0]), free(acc[1]), free(scratch);
    return 1;
}

static void test_attention_multi_same_bits(void **state) {
    (void)state;
    const size_t dims[] = {8, 12, 16, 64, 72, 128, 136, 256, 264};
    const size_t lens[] = {1, 5, 8, 9, 16, 17, 255, 256};
    const size_t nqs[] = {1, 2, 3, 4, 5, 6, 7, 8, 13, 16, TERN_ATTN_MAX_Q};
    const int n_wide = tern_ops_avx2() && tern_kernels_avx512_available() ? 2 : 1;
    int compared = 0, configs = 0;
    for (int k = 0; k < n_sets; k++)
        for (int wide = 0; wide < (k == 0 ? 1 : n_wide); wide++, configs++) {
            if (tern_kernels_avx512_available()) assert_true(tern_kernels_set_avx512(wide));
            for (size_t a = 0; a < TERN_ARRAY_LEN(dims); a++)
                for (size_t b = 0; b < TERN_ARRAY_LEN(lens); b++)
                    for (size_t c = 0; c < TERN_ARRAY_LEN(nqs); c++) {
                        /* the long pages with the smaller query counts only: time */
                        if (lens[b] > 17 && nqs[c] > 8 && dims[a] != 128) continue;
                        compared += check_attn_multi(sets[k], dims[a], lens[b], nqs[c], false);
                        compared += check_attn_multi(sets[k], dims[a], lens[b], nqs[c], true);
                    }
        }
    if (tern_kernels_avx512_available()) assert_true(tern_kernels_set_avx512(true));
    if (n_wide == 1) printf("note: %s\n", n_sets == 1 ? "no AVX2: the portable ops only" : "no AVX-512 loops to compare");
    assert_int_equal(compared, configs * 2 * (9 * 8 * 11 - 8 * 2 * 3));
}

static void test_rope(void **state) {
    (void)state;
    /* angles: pair i at position p turns by p * base^(-2i/n_rot) */
    struct tern_rope_params rp = {.n_rot = 16, .freq_base = 10000.0f, .freq_scale = 1.0f, .attn_factor = 1.0f,
                                  .beta_fast = 32, .beta_slow = 1, .n_ctx_orig = 4096};
    float cs[16], cs2[16];
    tern_rope_angles(&rp, 0, cs);
    for (int i = 0; i < 8; i++) assert_true(cs[2 * i] == 1.0f && cs[2 * i + 1] == 0.0f);
    tern_rope_angles(&rp, 37, cs);
    for (int i = 0; i < 8; i++) {
        const double th = 37.0 * pow(10000.0, -2.0 * i / 16.0);
        assert_true(fabs(cs[2 * i] - cos(th)) < 1e-5 && fabs(cs[2 * i + 1] - sin(th)) < 1e-5);
    }
    /* linear scaling: position p with factor 2 turns like p / 2 */
    rp.freq_scale = 0.5f;
    tern_rope_angles(&rp, 74, cs2);
    for (int i = 0; i < 16; i++) assert_true(fabs(cs2[i] - cs[i]) < 1e-5);
    /* YaRN: the fastest pairs extrapolate (unscaled angle), the slowest interpolate;
     * magnitudes scale by 1 + 0.1 ln(factor) */
    rp.freq_scale = 0.25f;
    rp.ext_factor = 1.0f;
    rp.n_ctx_orig = 1024;
    struct tern_rope_params plain = rp;
    plain.freq_scale = 1.0f;
    plain.ext_factor = 0.0f;
    float y[16], e[16];
    tern_rope_angles(&rp, 300, y);
    tern_rope_angles(&plain, 300, e);
    const float ms = 1.0f + 0.1f * logf(4.0f);
    assert_true(fabs(y[0] - e[0] * ms) < 1e-4 && fabs(y[1] - e[1] * ms) < 1e-4);
    const double th_last = 300.0 * pow(10000.0, -2.0 * 7 / 16.0) * 0.25;
    assert_true(fabs(y[14] - cos(th_last) * ms) < 1e-4 && fabs(y[15] - sin(th_last) * ms) < 1e-4);

    /* orderings: a 90 degree turn of pair 0 */
    float c90[4] = {0.0f, 1.0f, 1.0f, 0.0f}; /* pair 0: cos 0 sin 1; pair 1: identity */
    float x[2 * 6] = {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6};
    tern_rope(x, 2, 6, 4, c90, false); /* adjacent: (1,2) -> (-2,1); (3,4) unchanged; 5,6 pass */
    const float want_norm[6] = {-2, 1, 3, 4, 5, 6};
    assert_memory_equal(x, want_norm, sizeof want_norm);
    assert_memory_equal(x + 6, want_norm, sizeof want_norm);
    float z[6] = {1, 2, 3, 4, 5, 6};
    tern_rope(z, 1, 6, 4, c90, true); /* neox: pairs (0,2) and (1,3): (1,3) -> (-3,1) */
    const float want_neox[6] = {-3, 2, 1, 4, 5, 6};
    assert_memory_equal(z, want_neox, sizeof want_neox);
}

int main(void) {
    setup_sets();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),  cmocka_unit_test(test_swiglu_and_add),
        cmocka_unit_test(test_elementwise_position_independent),
        cmocka_unit_test(test_softmax),  cmocka_unit_test(test_attention), cmocka_unit_test(test_attention_avx512_same_bits),
        cmocka_unit_test(test_attention_multi_same_bits),
        cmocka_unit_test(test_to_f16),
        cmocka_unit_test(test_rope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
