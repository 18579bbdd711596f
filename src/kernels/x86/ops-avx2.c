/* AVX2 + FMA + F16C twins of the portable ops (compiled with -mavx2 -mfma -mf16c,
 * called only when the CPU has them). Every element an op writes is computed by the
 * same vector code whatever its index: tails go through a padded vector, so a value
 * never depends on where a row starts or how long the call is. Reductions run in an
 * order fixed by the row length alone. */
#include "kernels/ops.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* exp(x) for float lanes: range reduction by ln 2 and a degree-6 polynomial (the
 * Cephes coefficients), about 1-2 ulp. Lanes below -87.33 give 0 (no subnormals),
 * lanes above 88.72 give the largest finite float. */
static inline __m256 exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.336544f);
    const __m256 hi = _mm256_set1_ps(88.722839f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 r2 = _mm256_mul_ps(r, r);
    __m256 y = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n in two steps so that n = 128 (x near 88.7) stays finite. */
    const __m256i n = _mm256_cvtps_epi32(fx);
    const __m256i n1 = _mm256_srai_epi32(n, 1);
    const __m256i n2 = _mm256_sub_epi32(n, n1);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    y = _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
    return _mm256_andnot_ps(under, y);
}

static inline float hsum256(__m256 v) {
    const __m128 lo = _mm256_castps256_ps128(v);
    const __m128 hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);                 /* lanes (0+4)(1+5)(2+6)(3+7) */
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));        /* (0+4)+(2+6), (1+5)+(3+7) */
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* Loads the n < 8 tail elements into a vector padded with pad. */
static inline __m256 load_tail(const float *x, size_t n, float pad) {
    float t[8];
    for (int i = 0; i < 8; i++) t[i] = pad;
    memcpy(t, x, n * sizeof *x);
    return _mm256_loadu_ps(t);
}

static inline void store_tail(float *y, __m256 v, size_t n) {
    float t[8];
    _mm256_storeu_ps(t, v);
    memcpy(y, t, n * sizeof *y);
}

static void rmsnorm_avx2(float *y, const float *x, const float *w, size_t n, float eps) {
    __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 sq = _mm256_mul_ps(v, v);
        acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    if (i < n) {
        const __m256 v = load_tail(x + i, n - i, 0.0f);
        const __m256 sq = _mm256_mul_ps(v, v);
        acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    double t[4];
    _mm256_storeu_pd(t, _mm256_add_pd(acc0, acc1));
    const double sum = (t[0] + t[2]) + (t[1] + t[3]);
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    const __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
        if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(y + i, v);
    }
    for (; i < n; i++) y[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

static inline __m256 swiglu8(__m256 g, __m256 u) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

static void swiglu_avx2(float *y, const float *g, const float *u, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, swiglu8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) store_tail(y + i, swiglu8(load_tail(g + i, n - i, 0), load_tail(u + i, n - i, 0)), n - i);
}

static void add_avx2(float *y, const float *x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

/* x[i] = exp(x[i] - max) for i < n; returns their sum (8 lanes, then hsum256). */
static float expsum_avx2(float *x, size_t n, float max) {
    const __m256 vm = _mm256_set1_ps(max);
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (i < n) {
        const __m256 e = exp256(_mm256_sub_ps(load_tail(x + i, n - i, -INFINITY), vm));
        store_tail(x + i, e, n - i);
        acc = _mm256_add_ps(acc, e);
    }
    return hsum256(acc);
}

static float max_avx2(const float *x, size_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    float r = hmax256(m);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

static void softmax_avx2(float *x, size_t n) {
    if (!n) return;
    const float sum = expsum_avx2(x, n, max_avx2(x, n));
    const __m256 inv = _mm256_set1_ps(1.0f / sum);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (; i < n; i++) x[i] *= 1.0f / sum;
}

static inline __m256 load8(const void *p, size_t i, int f16) {
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

/* q.k over d (a multiple of 8) with four accumulators: vector v goes to acc[v % 4]. */
static inline float dot_qk(const float *q, const void *k, size_t d, int f16) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
           a3 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= d; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k, i, f16), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8(k, i + 8, f16), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 16), load8(k, i + 16, f16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 24), load8(k, i + 24, f16), a3);
    }
    for (; i < d; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k, i, f16), a0);
    return hsum256(_mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)));
}

static inline const void *kv_row(const void *const *pages, const struct tern_kv_view *kv, size_t j) {
    const size_t es = kv->f16 ? 2 : 4;
    const char *page = pages[j / kv->page_rows];
    return page + ((j % kv->page_rows) * kv->row_elems + kv->head_off) * es;
}

static void attn_head_portable_fallback(float *out, const float *q, size_t d, size_t n_kv, float scale,
                                        const struct tern_kv_view *kv, float *scores) {
    tern_ops_portable()->attn_head(out, q, d, n_kv, scale, kv, scores);
}

static void attn_head_avx2(float *out, const float *q, size_t d, size_t n_kv, float scale,
                           const struct tern_kv_view *kv, float *scores) {
    if (d % 8 != 0) {
        attn_head_portable_fallback(out, q, d, n_kv, scale, kv, scores);
        return;
    }
    const int f16 = kv->f16;
    for (size_t j = 0; j < n_kv; j++) scores[j] = dot_qk(q, kv_row(kv->k_pages, kv, j), d, f16) * scale;
    const float sum = expsum_avx2(scores, n_kv, max_avx2(scores, n_kv));
    /* out = sum_j p_j v_j, 64 elements (8 registers) at a time, j ascending. */
    for (size_t i0 = 0; i0 < d; i0 += 64) {
        const size_t nv = (d - i0) >= 64 ? 8 : (d - i0) / 8;
        __m256 acc[8];
        for (size_t r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
        if (nv == 8) {
            for (size_t j = 0; j < n_kv; j++) {
                const __m256 p = _mm256_broadcast_ss(&scores[j]);
                const void *v = kv_row(kv->v_pages, kv, j);
                for (size_t r = 0; r < 8; r++) acc[r] = _mm256_fmadd_ps(p, load8(v, i0 + 8 * r, f16), acc[r]);
            }
        } else {
            for (size_t j = 0; j < n_kv; j++) {
                const __m256 p = _mm256_broadcast_ss(&scores[j]);
                const void *v = kv_row(kv->v_pages, kv, j);
                for (size_t r = 0; r < nv; r++) acc[r] = _mm256_fmadd_ps(p, load8(v, i0 + 8 * r, f16), acc[r]);
            }
        }
        const __m256 inv = _mm256_set1_ps(1.0f / sum);
        for (size_t r = 0; r < nv; r++) _mm256_storeu_ps(out + i0 + 8 * r, _mm256_mul_ps(acc[r], inv));
    }
}

void tern_ops_avx2_fill(struct tern_ops *ops) {
    ops->name = "avx2";
    ops->rmsnorm = rmsnorm_avx2;
    ops->swiglu = swiglu_avx2;
    ops->add = add_avx2;
    ops->softmax = softmax_avx2;
    ops->attn_head = attn_head_avx2;
}
