/* deltanet: the Gated DeltaNet core against a slow double-precision reference written
 * here from the math (a different code path: state in [v][k] order, no blocking, no
 * vectors), plus the exactness properties: chunking, head splits, channel splits and
 * the SIMD path change no bit. */
#include "harness.h"

#include "kernels/kernels.h"
#include "kernels/deltanet.h"
#include "util/mem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* xorshift64*: deterministic inputs independent of libc's rand. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) * 0x1p-53;
}
static float frand(float lo, float hi) { return (float)(lo + (hi - lo) * urand()); }
static float *frand_buf(size_t n, float lo, float hi) {
    float *p = tern_malloc(n * sizeof(float));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = frand(lo, hi);
    return p;
}
static float *fdup(const float *src, size_t n) {
    float *p = tern_malloc(n * sizeof(float));
    assert_non_null(p);
    memcpy(p, src, n * sizeof(float));
    return p;
}

/* ---- the double reference ------------------------------------------------------------ */

static double ref_silu(double x) { return x / (1.0 + exp(-x)); }

/* Causal conv + SiLU for all channels: y[t][c] = silu(sum_j w[c][j] * in(t - (K-1) + j)). */
static void ref_conv(const struct tern_deltanet_shape *s, const float *window, const float *w,
                     const float *x, size_t n_tok, double *y) {
    const size_t C = tern_deltanet_channels(s), K = s->n_conv, W = K - 1;
    for (size_t t = 0; t < n_tok; t++)
        for (size_t c = 0; c < C; c++) {
            double acc = 0.0;
            for (size_t j = 0; j < K; j++) {
                long rel = (long)t - (long)W + (long)j; /* time relative to the chunk */
                double in = rel < 0 ? window[(size_t)(rel + (long)W) * C + c] : x[(size_t)rel * C + c];
                acc += in * w[c * K + j];
            }
            y[t * C + c] = ref_silu(acc);
        }
}

/* Reference recurrence over all heads; state sv[h][j][i] (value-major, the transpose of
 * the module's layout) in double. */
static void ref_heads(const struct tern_deltanet_shape *s, const struct tern_deltanet_params *p,
                      double *sv, const float *qkv, const float *z, const float *beta,
                      const float *alpha, size_t n_tok, double *out) {
    const size_t dk = s->d_k, dv = s->d_v, nk = s->n_k_heads, nv = s->n_v_heads;
    const size_t C = tern_deltanet_channels(s);
    double *q = calloc(dk, sizeof(double)), *k = calloc(dk, sizeof(double));
    double *o = calloc(dv, sizeof(double));
    assert_true(q && k && o);
    for (size_t t = 0; t < n_tok; t++) {
        const float *row = qkv + t * C;
        for (size_t h = 0; h < nv; h++) {
            const size_t hk = h % nk;
            double nq = 0, nkk = 0;
            for (size_t i = 0; i < dk; i++) {
                q[i] = row[hk * dk + i];
                k[i] = row[(nk + hk) * dk + i];
                nq += q[i] * q[i];
                nkk += k[i] * k[i];
            }
            nq = fmax(sqrt(nq), s->eps);
            nkk = fmax(sqrt(nkk), s->eps);
            for (size_t i = 0; i < dk; i++) {
                q[i] = q[i] / nq / sqrt((double)dk);
                k[i] /= nkk;
            }
            double x = (double)alpha[t * nv + h] + p->dt_bias[h];
            double g = p->ssm_a[h] * log1p(exp(x));
            double decay = exp(g);
            double b = 1.0 / (1.0 + exp(-(double)beta[t * nv + h]));
            double *S = sv + h * dv * dk;
            for (size_t n = 0; n < dv * dk; n++) S[n] *= decay;
            for (size_t j = 0; j < dv; j++) {
                double kv = 0;
                for (size_t i = 0; i < dk; i++) kv += S[j * dk + i] * k[i];
                double d = ((double)row[2 * nk * dk + h * dv + j] - kv) * b;
                for (size_t i = 0; i < dk; i++) S[j * dk + i] += k[i] * d;
            }
            double ss = 0;
            for (size_t j = 0; j < dv; j++) {
                o[j] = 0;
                for (size_t i = 0; i < dk; i++) o[j] += S[j * dk + i] * q[i];
                ss += o[j] * o[j];
            }
            double r = 1.0 / sqrt(ss / (double)dv + s->eps);
            for (size_t j = 0; j < dv; j++)
                out[t * nv * dv + h * dv + j] =
                    o[j] * r * p->norm_w[j] * ref_silu(z[t * nv * dv + h * dv + j]);
        }
    }
    free(q);
    free(k);
    free(o);
}

/* ---- fixtures -------------------------------------------------------------------------- */

struct fixture {
    struct tern_deltanet_shape s;
    size_t n_tok, C, nvd;
    float *window, *conv_w, *x; /* conv inputs; conv_w as stored [C][K]; x [n_tok][C] */
    float *conv_wt;             /* conv_w tap-major [K][C] */
    float *qkv;                 /* [n_tok][C]: random post-conv activations for the heads */
    float *z, *beta, *alpha;
    float *state;
    float *a, *dt, *nw;
    struct tern_deltanet_params p;
};

static void fixture_init(struct fixture *f, struct tern_deltanet_shape s, size_t n_tok) {
    memset(f, 0, sizeof *f);
    f->s = s;
    assert_int_equal(tern_deltanet_shape_check(&s), TERN_OK);
    f->n_tok = n_tok;
    f->C = tern_deltanet_channels(&s);
    f->nvd = (size_t)s.n_v_heads * s.d_v;
    f->window = frand_buf(tern_deltanet_conv_floats(&s) + 1, -1, 1);
    f->conv_w = frand_buf(f->C * s.n_conv, -0.6f, 0.6f);
    f->conv_wt = frand_buf(f->C * s.n_conv, 0, 1);
    tern_deltanet_conv_weights(&s, f->conv_w, f->conv_wt);
    f->x = frand_buf(n_tok * f->C, -2, 2);
    f->qkv = frand_buf(n_tok * f->C, -1, 1);
    f->z = frand_buf(n_tok * f->nvd, -3, 3);
    f->beta = frand_buf(n_tok * s.n_v_heads, -3, 3);
    f->alpha = frand_buf(n_tok * s.n_v_heads, -3, 3);
    /* a recurrent state that has already seen something */
    f->state = frand_buf(tern_deltanet_state_floats(&s), -0.5f, 0.5f);
    f->a = tern_malloc(s.n_v_heads * sizeof(float));
    assert_non_null(f->a);
    for (uint32_t h = 0; h < s.n_v_heads; h++) f->a[h] = -expf(frand(0.0f, logf(16.0f)));
    f->dt = frand_buf(s.n_v_heads, 0.9f, 1.1f);
    f->nw = frand_buf(s.d_v, 0.9f, 1.1f);
    f->p = (struct tern_deltanet_params){.ssm_a = f->a, .dt_bias = f->dt, .norm_w = f->nw};
}

static void fixture_free(struct fixture *f) {
    free(f->window);
    free(f->conv_w);
    free(f->conv_wt);
    free(f->x);
    free(f->qkv);
    free(f->z);
    free(f->beta);
    free(f->alpha);
    free(f->state);
    free(f->a);
    free(f->dt);
    free(f->nw);
}

/* tokens [t0, t0+n) of the fixture as an io block writing into out (rows of nvd) */
static struct tern_deltanet_io io_at(const struct fixture *f, size_t t0, size_t n, float *out) {
    const size_t nv = f->s.n_v_heads;
    return (struct tern_deltanet_io){
        .n_tok = n,
        .qkv = f->qkv + t0 * f->C, .ld_qkv = f->C,
        .z = f->z + t0 * f->nvd, .ld_z = f->nvd,
        .beta = f->beta + t0 * nv, .ld_beta = nv,
        .alpha = f->alpha + t0 * nv, .ld_alpha = nv,
        .out = out + t0 * f->nvd, .ld_out = f->nvd,
    };
}

static const struct tern_deltanet_shape shapes[] = {
    /* tiny-qwen35 */
    {.n_k_heads = 2, .n_v_heads = 4, .d_k = 64, .d_v = 64, .n_conv = 4, .eps = 1e-6f},
    /* odd sizes: scalar tails of every loop, 3 v-heads per k-head */
    {.n_k_heads = 1, .n_v_heads = 3, .d_k = 19, .d_v = 45, .n_conv = 3, .eps = 1e-6f},
    /* Qwen3.5-0.8B's head dims */
    {.n_k_heads = 2, .n_v_heads = 2, .d_k = 128, .d_v = 128, .n_conv = 4, .eps = 1e-6f},
    /* blocks of 4 and of 1 vector of 16 and of 8 lanes, no tail */
    {.n_k_heads = 1, .n_v_heads = 2, .d_k = 33, .d_v = 80, .n_conv = 4, .eps = 1e-6f},
};

/* The code paths of the module: generic (4 lanes), AVX2 (8), AVX-512 (16). use_path(i)
 * switches to path i and says whether this machine has it; paths_restore() goes back to
 * the path the test started on. */
enum { N_PATHS = 3 };
static const char *const path_names[N_PATHS] = {"generic", "AVX2", "AVX-512"};
static enum tern_deltanet_path start_path;
static bool start_avx512;
static bool use_path(int i) {
    if (i == 0) return tern_deltanet_set_path(TERN_DELTANET_GENERIC);
    if (!tern_deltanet_set_path(TERN_DELTANET_AVX2)) return false;
    return tern_kernels_set_avx512(i == 2);
}
static void paths_restore(void) {
    assert_true(tern_deltanet_set_path(start_path));
    tern_kernels_set_avx512(start_avx512);
}

/* ---- tests ----------------------------------------------------------------------------- */

static void test_shape_check(void **unused) {
    (void)unused;
    struct tern_deltanet_shape s = shapes[0];
    assert_int_equal(tern_deltanet_shape_check(&s), TERN_OK);
    assert_int_equal(tern_deltanet_channels(&s), 512);
    assert_int_equal(tern_deltanet_conv_floats(&s), 3 * 512);
    assert_int_equal(tern_deltanet_state_floats(&s), 4 * 64 * 64);
    s.n_v_heads = 5;
    assert_int_equal(tern_deltanet_shape_check(&s), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "v-heads 5 is not a multiple of k-heads 2"));
    s = shapes[0];
    s.d_k = 0;
    assert_int_equal(tern_deltanet_shape_check(&s), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "ssm.state_size (d_k) = 0"));
    s = shapes[0];
    s.n_conv = 1000;
    assert_int_equal(tern_deltanet_shape_check(&s), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "1000"));
    s = shapes[0];
    s.eps = NAN;
    assert_int_equal(tern_deltanet_shape_check(&s), TERN_ERR_FORMAT);
}

static void test_conv_matches_reference(void **unused) {
    (void)unused;
    for (size_t si = 0; si < TERN_ARRAY_LEN(shapes); si++) {
        struct fixture f;
        const size_t n = 9;
        fixture_init(&f, shapes[si], n);
        double *ref = malloc(n * f.C * sizeof(double));
        float *y = calloc(n * f.C, sizeof(float));
        assert_true(ref && y);
        ref_conv(&f.s, f.window, f.conv_w, f.x, n, ref);
        float *win = fdup(f.window, tern_deltanet_conv_floats(&f.s));
        tern_deltanet_conv(&f.s, win, f.conv_wt, f.x, f.C, y, f.C, n, 0, f.C);
        double worst = 0;
        for (size_t i = 0; i < n * f.C; i++) worst = fmax(worst, fabs(y[i] - ref[i]));
        assert_true(worst < 1e-5);
        /* the window now holds the last K-1 inputs */
        const size_t W = f.s.n_conv - 1;
        assert_memory_equal(win, f.x + (n - W) * f.C, W * f.C * sizeof(float));
        free(win);
        free(ref);
        free(y);
        fixture_free(&f);
    }
}

/* Splitting the tokens into chunks (including chunks shorter than the window) or the
 * channels into ranges gives the same bits as one call. */
static void test_conv_chunking_exact(void **unused) {
    (void)unused;
    for (size_t si = 0; si < TERN_ARRAY_LEN(shapes); si++) {
        struct fixture f;
        const size_t n = 11;
        fixture_init(&f, shapes[si], n);
        const size_t nw = tern_deltanet_conv_floats(&f.s);
        float *win1 = fdup(f.window, nw), *win2 = fdup(f.window, nw), *win3 = fdup(f.window, nw);
        float *y1 = calloc(n * f.C, sizeof(float)), *y2 = calloc(n * f.C, sizeof(float));
        float *y3 = calloc(n * f.C, sizeof(float));
        assert_true(y1 && y2 && y3);
        tern_deltanet_conv(&f.s, win1, f.conv_wt, f.x, f.C, y1, f.C, n, 0, f.C);
        const size_t chunks[] = {1, 1, 2, 4, 3};
        for (size_t c = 0, t0 = 0; c < TERN_ARRAY_LEN(chunks); t0 += chunks[c++])
            tern_deltanet_conv(&f.s, win2, f.conv_wt, f.x + t0 * f.C, f.C, y2 + t0 * f.C, f.C,
                               chunks[c], 0, f.C);
        const size_t cuts[] = {0, 7, f.C / 2, f.C - 1, f.C};
        for (size_t c = 0; c + 1 < TERN_ARRAY_LEN(cuts); c++)
            tern_deltanet_conv(&f.s, win3, f.conv_wt, f.x, f.C, y3, f.C, n, cuts[c], cuts[c + 1]);
        assert_memory_equal(y1, y2, n * f.C * sizeof(float));
        assert_memory_equal(y1, y3, n * f.C * sizeof(float));
        assert_memory_equal(win1, win2, nw * sizeof(float));
        assert_memory_equal(win1, win3, nw * sizeof(float));
        for (int pi = 0; pi < N_PATHS; pi++) { /* every path: the same bits */
            if (!use_path(pi)) continue;
            float *w4 = fdup(f.window, nw), *y4 = calloc(n * f.C, sizeof(float));
            assert_non_null(y4);
            tern_deltanet_conv(&f.s, w4, f.conv_wt, f.x, f.C, y4, f.C, n, 0, f.C);
            assert_memory_equal(y1, y4, n * f.C * sizeof(float));
            assert_memory_equal(win1, w4, nw * sizeof(float));
            free(w4);
            free(y4);
        }
        paths_restore();
        free(win1);
        free(win2);
        free(win3);
        free(y1);
        free(y2);
        free(y3);
        fixture_free(&f);
    }
}

/* The module's SiLU (polynomial exp): close to the exact function everywhere, finite at
 * the extremes, and the same bits for an element whether it is computed alone (a loop
 * tail), inside a vector, or on the other code path. */
static void test_silu(void **unused) {
    (void)unused;
    enum { N = 4099 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    float *y1 = malloc(N * sizeof(float));
    assert_true(x && y && y1);
    for (size_t i = 0; i < N; i++) x[i] = -30.0f + 60.0f * (float)i / (N - 1);
    const float edge[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 87.5f, -87.5f, 88.7f, -88.7f,
                          100.0f, -100.0f, 1e30f, -1e30f, 0.5f, -0.5f, 20.0f, -20.0f};
    memcpy(x, edge, sizeof edge);
    tern_deltanet_silu(y, x, N);
    double worst = 0;
    for (size_t i = 0; i < N; i++) {
        const double xd = x[i], want = xd / (1.0 + exp(-xd));
        assert_true(isfinite(y[i]));
        const double err = fabs(y[i] - want) / fmax(fabs(want), 1e-30);
        if (fabs(want) > 1e-30) worst = fmax(worst, err);
        tern_deltanet_silu(y1 + i, x + i, 1);
    }
    print_message("silu: max rel err %.3g\n", worst);
    assert_true(worst < 1e-6);
    assert_memory_equal(y, y1, N * sizeof(float));
    for (int pi = 0; pi < N_PATHS; pi++) { /* every path: the same bits */
        if (!use_path(pi)) continue;
        memset(y1, 0, N * sizeof(float));
        tern_deltanet_silu(y1, x, N);
        assert_memory_equal(y, y1, N * sizeof(float));
    }
    paths_restore();
    free(x);
    free(y);
    free(y1);
}

static void test_heads_match_reference(void **unused) {
    (void)unused;
    for (size_t run = 0; run < 2 * TERN_ARRAY_LEN(shapes); run++) {
        const size_t si = run / 2;
        struct fixture f;
        const size_t n = 24;
        fixture_init(&f, shapes[si], n);
        /* odd runs: slow decay (g near 0), so the state keeps and compounds what it
         * was written instead of forgetting it within a few tokens */
        if (run % 2)
            for (uint32_t h = 0; h < f.s.n_v_heads; h++) f.a[h] *= 0.002f;
        const size_t dk = f.s.d_k, dv = f.s.d_v, nv = f.s.n_v_heads;
        /* reference state in [h][j][i] */
        double *sv = malloc(nv * dk * dv * sizeof(double));
        double *ref = malloc(n * f.nvd * sizeof(double));
        float *out = calloc(n * f.nvd, sizeof(float));
        float *scratch = malloc(tern_deltanet_scratch_floats(&f.s) * sizeof(float));
        assert_true(sv && ref && out && scratch);
        for (size_t h = 0; h < nv; h++)
            for (size_t i = 0; i < dk; i++)
                for (size_t j = 0; j < dv; j++)
                    sv[(h * dv + j) * dk + i] = f.state[(h * dk + i) * dv + j];
        ref_heads(&f.s, &f.p, sv, f.qkv, f.z, f.beta, f.alpha, n, ref);
        struct tern_deltanet_io io = io_at(&f, 0, n, out);
        tern_deltanet_heads(&f.s, &f.p, f.state, &io, 0, nv, scratch);
        /* F32 against double over 24 steps of a contracting recurrence: a few ulps of
         * the output scale, which rmsnorm keeps near 1 */
        double worst_out = 0, worst_state = 0, max_state = 0;
        for (size_t i = 0; i < n * f.nvd; i++) worst_out = fmax(worst_out, fabs(out[i] - ref[i]));
        for (size_t h = 0; h < nv; h++)
            for (size_t i = 0; i < dk; i++)
                for (size_t j = 0; j < dv; j++) {
                    double r = sv[(h * dv + j) * dk + i];
                    worst_state = fmax(worst_state, fabs(f.state[(h * dk + i) * dv + j] - r));
                    max_state = fmax(max_state, fabs(r));
                }
        print_message("shape %zu%s: max |out - ref| %.3g, max |S - ref| %.3g (max |S| %.3g)\n", si,
                      run % 2 ? " slow decay" : "", worst_out, worst_state, max_state);
        assert_true(worst_out < 2e-5);
        assert_true(worst_state < 1e-5 * fmax(1.0, max_state));
        free(sv);
        free(ref);
        free(out);
        free(scratch);
        fixture_free(&f);
    }
}

/* Token by token, in uneven chunks, and with the heads split in ranges: every bit of
 * the outputs and of the state is the same. Also across the generic, AVX2 and AVX-512
 * paths (those the machine has). */
static void test_heads_chunking_exact(void **unused) {
    (void)unused;
    for (size_t si = 0; si < TERN_ARRAY_LEN(shapes); si++) {
        struct fixture f;
        const size_t n = 17;
        fixture_init(&f, shapes[si], n);
        const size_t nv = f.s.n_v_heads, ns = tern_deltanet_state_floats(&f.s);
        float *scratch = malloc(tern_deltanet_scratch_floats(&f.s) * sizeof(float));
        float *s1 = fdup(f.state, ns), *s2 = fdup(f.state, ns), *s3 = fdup(f.state, ns);
        float *o1 = calloc(n * f.nvd, sizeof(float)), *o2 = calloc(n * f.nvd, sizeof(float));
        float *o3 = calloc(n * f.nvd, sizeof(float));
        assert_true(scratch && o1 && o2 && o3);

        struct tern_deltanet_io io = io_at(&f, 0, n, o1);
        tern_deltanet_heads(&f.s, &f.p, s1, &io, 0, (uint32_t)nv, scratch);
        for (size_t t = 0; t < n; t++) { /* decoding: one token at a time */
            io = io_at(&f, t, 1, o2);
            tern_deltanet_heads(&f.s, &f.p, s2, &io, 0, (uint32_t)nv, scratch);
        }
        const size_t chunks[] = {7, 1, 9};
        for (size_t c = 0, t0 = 0; c < TERN_ARRAY_LEN(chunks); t0 += chunks[c++])
            for (uint32_t h = 0; h < nv; h++) { /* one head per "thread" */
                io = io_at(&f, t0, chunks[c], o3);
                tern_deltanet_heads(&f.s, &f.p, s3, &io, h, h + 1, scratch);
            }
        assert_memory_equal(o1, o2, n * f.nvd * sizeof(float));
        assert_memory_equal(o1, o3, n * f.nvd * sizeof(float));
        assert_memory_equal(s1, s2, ns * sizeof(float));
        assert_memory_equal(s1, s3, ns * sizeof(float));

        /* every code path: the same bits */
        int n_run = 0;
        for (int pi = 0; pi < N_PATHS; pi++) {
            if (!use_path(pi)) continue;
            n_run++;
            float *s4 = fdup(f.state, ns), *o4 = calloc(n * f.nvd, sizeof(float));
            assert_non_null(o4);
            io = io_at(&f, 0, n, o4);
            tern_deltanet_heads(&f.s, &f.p, s4, &io, 0, (uint32_t)nv, scratch);
            assert_memory_equal(o1, o4, n * f.nvd * sizeof(float));
            assert_memory_equal(s1, s4, ns * sizeof(float));
            free(s4);
            free(o4);
            if (si == 0) print_message("heads: the %s path gives the same bits\n", path_names[pi]);
        }
        paths_restore();
        assert_true(n_run >= 1);
        free(scratch);
        free(s1);
        free(s2);
        free(s3);
        free(o1);
        free(o2);
        free(o3);
        fixture_free(&f);
    }
}

/* The delta rule's defining property, checked without the reference: with no decay
 * (ssm_a = 0) and beta = 1, writing value v under key k makes S^T k == v exactly
 * (up to rounding), whatever S held before. Reading it back with q = k gives
 * o = v / sqrt(d_k); with norm_w = 1 the output is rmsnorm(v) * silu(z). */
static void test_delta_rule_writes_value(void **unused) {
    (void)unused;
    struct tern_deltanet_shape s = shapes[0];
    struct fixture f;
    fixture_init(&f, s, 2);
    const size_t dk = s.d_k, dv = s.d_v, nk = s.n_k_heads, nv = s.n_v_heads;
    for (size_t h = 0; h < nv; h++) f.a[h] = 0.0f;
    for (size_t j = 0; j < dv; j++) f.nw[j] = 1.0f;
    for (size_t i = 0; i < 2 * nv; i++) f.beta[i] = 100.0f; /* sigmoid == 1.0f */
    /* token 1 queries with the key of token 0 (same k-head rows) and writes nothing new
     * that could disturb it: its k equals token 0's k and its v equals token 0's v */
    for (size_t i = 0; i < 2 * nk * dk + nv * dv; i++) f.qkv[f.C + i] = f.qkv[i];
    for (size_t hk = 0; hk < nk; hk++)
        for (size_t i = 0; i < dk; i++) f.qkv[f.C + hk * dk + i] = f.qkv[(nk + hk) * dk + i];
    float *out = calloc(2 * f.nvd, sizeof(float));
    float *scratch = malloc(tern_deltanet_scratch_floats(&s) * sizeof(float));
    assert_true(out && scratch);
    struct tern_deltanet_io io = io_at(&f, 0, 2, out);
    tern_deltanet_heads(&s, &f.p, f.state, &io, 0, (uint32_t)nv, scratch);
    for (size_t h = 0; h < nv; h++) {
        const float *v = f.qkv + f.C + 2 * nk * dk + h * dv;
        const double scale = 1.0 / sqrt((double)dk); /* o = v / sqrt(d_k) */
        double ss = 0;
        for (size_t j = 0; j < dv; j++) ss += (v[j] * scale) * (v[j] * scale);
        const double r = 1.0 / sqrt(ss / (double)dv + s.eps);
        for (size_t j = 0; j < dv; j++) {
            const double z = f.z[f.nvd + h * dv + j];
            const double want = v[j] * scale * r * (z / (1.0 + exp(-z)));
            assert_true(fabs(out[f.nvd + h * dv + j] - want) < 1e-4);
        }
    }
    free(out);
    free(scratch);
    fixture_free(&f);
}

int main(void) {
    start_path = tern_deltanet_path();
    start_avx512 = tern_kernels_avx512();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape_check),
        cmocka_unit_test(test_conv_matches_reference),
        cmocka_unit_test(test_conv_chunking_exact),
        cmocka_unit_test(test_silu),
        cmocka_unit_test(test_heads_match_reference),
        cmocka_unit_test(test_heads_chunking_exact),
        cmocka_unit_test(test_delta_rule_writes_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
