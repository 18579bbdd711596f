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

#define INLINE static inline __attribute__((always_inline))

INLINE __m256 load8(const void *p, size_t i, const int f16) {
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

/* acc[i0 .. i0 + 8 nv) = acc * c + sum_j p_j v_j[...], j ascending; nv <= 8 vectors. */
INLINE void pv_block(float *acc, float c, const float *p, size_t n, const char *v, size_t rb, size_t i0, size_t nv,
                     const int f16) {
    const __m256 vc = _mm256_set1_ps(c);
    __m256 a[8];
    for (size_t r = 0; r < 8; r++) a[r] = r < nv ? _mm256_mul_ps(_mm256_loadu_ps(acc + i0 + 8 * r), vc) : vc;
    __m256 a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7];
    v += i0 * (f16 ? 2 : 4);
    if (nv == 8) {
        for (size_t j = 0; j < n; j++, v += rb) {
            const __m256 w = _mm256_broadcast_ss(&p[j]);
            a0 = _mm256_fmadd_ps(w, load8(v, 0, f16), a0);
            a1 = _mm256_fmadd_ps(w, load8(v, 8, f16), a1);
            a2 = _mm256_fmadd_ps(w, load8(v, 16, f16), a2);
            a3 = _mm256_fmadd_ps(w, load8(v, 24, f16), a3);
            a4 = _mm256_fmadd_ps(w, load8(v, 32, f16), a4);
            a5 = _mm256_fmadd_ps(w, load8(v, 40, f16), a5);
            a6 = _mm256_fmadd_ps(w, load8(v, 48, f16), a6);
            a7 = _mm256_fmadd_ps(w, load8(v, 56, f16), a7);
        }
    } else {
        /* fewer vectors (small heads): the same per-element arithmetic */
        for (size_t j = 0; j < n; j++, v += rb) {
            const __m256 w = _mm256_broadcast_ss(&p[j]);
            a0 = _mm256_fmadd_ps(w, load8(v, 0, f16), a0);
            if (nv > 1) a1 = _mm256_fmadd_ps(w, load8(v, 8, f16), a1);
            if (nv > 2) a2 = _mm256_fmadd_ps(w, load8(v, 16, f16), a2);
            if (nv > 3) a3 = _mm256_fmadd_ps(w, load8(v, 24, f16), a3);
            if (nv > 4) a4 = _mm256_fmadd_ps(w, load8(v, 32, f16), a4);
            if (nv > 5) a5 = _mm256_fmadd_ps(w, load8(v, 40, f16), a5);
            if (nv > 6) a6 = _mm256_fmadd_ps(w, load8(v, 48, f16), a6);
        }
    }
    const __m256 out[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
    for (size_t r = 0; r < nv; r++) _mm256_storeu_ps(acc + i0 + 8 * r, out[r]);
}

/* The sum of a vector's lanes as the tree ((0+1)+(2+3)) + ((4+5)+(6+7)): the order in
 * which eight keys' sums come out of dots8 below, so that a key scores the same alone. */
INLINE float hsum_tree(__m256 a) {
    const __m256 h = _mm256_hadd_ps(a, a); /* 0+1, 2+3, .., | 4+5, 6+7, .. */
    const __m256 h2 = _mm256_hadd_ps(h, h);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)));
}

/* q.k of one key: one accumulator over d in order, then hsum_tree. */
INLINE float dot1(const float *q, const char *k, size_t d, const int f16) {
    __m256 a = _mm256_setzero_ps();
    for (size_t i = 0; i < d; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k, i, f16), a);
    return hsum_tree(a);
}

/* q.k of eight consecutive keys (rb bytes apart), each exactly as dot1 computes it: the
 * eight accumulators are reduced together by a transposing tree of horizontal adds. */
INLINE __m256 dots8(const float *q, const char *k, size_t rb, size_t d, const int f16) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (size_t i = 0; i < d; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(qv, load8(k, i, f16), a0);
        a1 = _mm256_fmadd_ps(qv, load8(k + rb, i, f16), a1);
        a2 = _mm256_fmadd_ps(qv, load8(k + 2 * rb, i, f16), a2);
        a3 = _mm256_fmadd_ps(qv, load8(k + 3 * rb, i, f16), a3);
        a4 = _mm256_fmadd_ps(qv, load8(k + 4 * rb, i, f16), a4);
        a5 = _mm256_fmadd_ps(qv, load8(k + 5 * rb, i, f16), a5);
        a6 = _mm256_fmadd_ps(qv, load8(k + 6 * rb, i, f16), a6);
        a7 = _mm256_fmadd_ps(qv, load8(k + 7 * rb, i, f16), a7);
    }
    /* level 1: (0+1), (2+3) of two keys per vector; level 2: ((0+1)+(2+3)) of four keys
     * per 128-bit half; level 3: + the other half's ((4+5)+(6+7)). */
    const __m256 h01 = _mm256_hadd_ps(a0, a1), h23 = _mm256_hadd_ps(a2, a3);
    const __m256 h45 = _mm256_hadd_ps(a4, a5), h67 = _mm256_hadd_ps(a6, a7);
    const __m256 g0123 = _mm256_hadd_ps(h01, h23); /* lo: keys 0-3 lanes 0-3 part; hi: lanes 4-7 part */
    const __m256 g4567 = _mm256_hadd_ps(h45, h67);
    const __m256 lo = _mm256_permute2f128_ps(g0123, g4567, 0x20); /* keys 0-3 | keys 4-7, first halves */
    const __m256 hi = _mm256_permute2f128_ps(g0123, g4567, 0x31); /* second halves */
    return _mm256_add_ps(lo, hi);
}

/* The online softmax step of a page: scores become exp(score - m') with m' the running
 * max taken over them, *l = *l * c + their sum, *m = m'; returns c = exp(m - m'), the
 * factor the query's acc is scaled by before this page's rows are added. */
INLINE float page_softmax(float *scores, size_t n, float *m, float *l) {
    const float pm = max_avx2(scores, n), m0 = *m;
    const float mn = pm > m0 ? pm : m0;
    const float c = _mm_cvtss_f32(_mm256_castps256_ps128(exp256(_mm256_set1_ps(m0 - mn))));
    const float sum = expsum_avx2(scores, n, mn);
    *l = *l * c + sum;
    *m = mn;
    return c;
}

INLINE void attn_page_impl(float *acc, float *m, float *l, const float *q, size_t d, const void *k, const void *v,
                           size_t row_elems, size_t n, float scale, float *scores, const int f16) {
    const size_t rb = row_elems * (f16 ? 2 : 4);
    const char *kr = k;
    const __m256 vs = _mm256_set1_ps(scale);
    size_t j = 0;
    for (; j + 8 <= n; j += 8, kr += 8 * rb) _mm256_storeu_ps(scores + j, _mm256_mul_ps(dots8(q, kr, rb, d, f16), vs));
    for (; j < n; j++, kr += rb) scores[j] = dot1(q, kr, d, f16) * scale;
    const float c = page_softmax(scores, n, m, l);
    for (size_t i0 = 0; i0 < d; i0 += 64) pv_block(acc, c, scores, n, v, rb, i0, d - i0 >= 64 ? 8 : (d - i0) / 8, f16);
}

/* ---- several queries over one page (attn_page_multi), AVX2 ----------------------------------
 *
 * Each query runs attn_page_impl's arithmetic (dots8 and dot1 for the scores, the same
 * max, exp and sum, acc * c and then fma(p_j, v_j) for j ascending), so its bits are
 * attn_page's. What the queries share is the reading of the page: F16 rows are converted
 * once per block (8 keys, MQ2_JB values) into a float buffer that stays in L1, and every
 * query's loop reads that block there, instead of each query converting the whole page
 * again and reading it from L2 or memory. The accumulators go to memory between value
 * blocks, which changes no bits. */
#define MQ2_JB 16

/* Rows [0, cnt) of src (rb bytes apart), F16, as floats d apart in dst (d a multiple of 8). */
INLINE void rows_to_f32_avx2(float *dst, const char *src, size_t rb, size_t cnt, size_t d) {
    for (size_t r = 0; r < cnt; r++, src += rb, dst += d)
        for (size_t i = 0; i < d; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)src + i))));
}

/* acc[0 .. 64) over float rows [0, jn) ld apart at vb with weights p[0 .. jn); first:
 * acc * c before the first row (pv_block's order). */
INLINE void pv64_rows(float *acc, float c, const float *p, const float *vb, size_t ld, size_t jn, int first) {
    __m256 a0 = _mm256_loadu_ps(acc), a1 = _mm256_loadu_ps(acc + 8), a2 = _mm256_loadu_ps(acc + 16);
    __m256 a3 = _mm256_loadu_ps(acc + 24), a4 = _mm256_loadu_ps(acc + 32), a5 = _mm256_loadu_ps(acc + 40);
    __m256 a6 = _mm256_loadu_ps(acc + 48), a7 = _mm256_loadu_ps(acc + 56);
    if (first) {
        const __m256 vc = _mm256_set1_ps(c);
        a0 = _mm256_mul_ps(a0, vc), a1 = _mm256_mul_ps(a1, vc), a2 = _mm256_mul_ps(a2, vc);
        a3 = _mm256_mul_ps(a3, vc), a4 = _mm256_mul_ps(a4, vc), a5 = _mm256_mul_ps(a5, vc);
        a6 = _mm256_mul_ps(a6, vc), a7 = _mm256_mul_ps(a7, vc);
    }
    for (size_t j = 0; j < jn; j++, vb += ld) {
        const __m256 w = _mm256_broadcast_ss(&p[j]);
        a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vb), a0);
        a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vb + 8), a1);
        a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vb + 16), a2);
        a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vb + 24), a3);
        a4 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vb + 32), a4);
        a5 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vb + 40), a5);
        a6 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vb + 48), a6);
        a7 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vb + 56), a7);
    }
    _mm256_storeu_ps(acc, a0), _mm256_storeu_ps(acc + 8, a1), _mm256_storeu_ps(acc + 16, a2);
    _mm256_storeu_ps(acc + 24, a3), _mm256_storeu_ps(acc + 32, a4), _mm256_storeu_ps(acc + 40, a5);
    _mm256_storeu_ps(acc + 48, a6), _mm256_storeu_ps(acc + 56, a7);
}

/* scratch: nq score rows of n + 8, then MQ2_JB converted rows of d (within
 * tern_attn_multi_scratch_floats). */
INLINE void attn_multi_impl(const struct tern_attn_query *qs, size_t nq, size_t d, const void *k, const void *v,
                            size_t row_elems, size_t n, float scale, float *scratch, const int f16) {
    const size_t rb = row_elems * (f16 ? 2 : 4), ns = n + 8;
    float *cv = scratch + nq * ns;
    const __m256 vs = _mm256_set1_ps(scale);
    const size_t n8 = n / 8 * 8;
    for (size_t j0 = 0; j0 < n8; j0 += 8) {
        const char *kr = (const char *)k + j0 * rb, *kb = kr;
        size_t kbr = rb;
        if (f16) rows_to_f32_avx2(cv, kr, rb, 8, d), kb = (const char *)cv, kbr = d * sizeof(float);
        for (size_t a = 0; a < nq; a++)
            _mm256_storeu_ps(scratch + a * ns + j0, _mm256_mul_ps(dots8(qs[a].q, kb, kbr, d, 0), vs));
    }
    for (size_t j = n8; j < n; j++)
        for (size_t a = 0; a < nq; a++) scratch[a * ns + j] = dot1(qs[a].q, (const char *)k + j * rb, d, f16) * scale;
    float c[TERN_ATTN_MAX_Q];
    for (size_t a = 0; a < nq; a++) c[a] = page_softmax(scratch + a * ns, n, qs[a].m, qs[a].l);
    const size_t d64 = d / 64 * 64;
    for (size_t j0 = 0; j0 < n && d64; j0 += MQ2_JB) {
        const size_t jn = n - j0 < MQ2_JB ? n - j0 : MQ2_JB;
        const char *vr = (const char *)v + j0 * rb;
        const float *vb = (const float *)vr;
        size_t ld = row_elems;
        if (f16) rows_to_f32_avx2(cv, vr, rb, jn, d), vb = cv, ld = d;
        for (size_t a = 0; a < nq; a++)
            for (size_t i0 = 0; i0 < d64; i0 += 64)
                pv64_rows(qs[a].acc + i0, c[a], scratch + a * ns + j0, vb + i0, ld, jn, j0 == 0);
    }
    if (d64 < d)
        for (size_t a = 0; a < nq; a++)
            pv_block(qs[a].acc, c[a], scratch + a * ns, n, v, rb, d64, (d - d64) / 8, f16);
}

static void attn_multi_avx2(const struct tern_attn_query *qs, size_t nq, size_t d, const void *k, const void *v,
                            size_t row_elems, size_t n, float scale, bool f16, float *scratch) {
    if (f16) attn_multi_impl(qs, nq, d, k, v, row_elems, n, scale, scratch, 1);
    else attn_multi_impl(qs, nq, d, k, v, row_elems, n, scale, scratch, 0);
}

/* ---- AVX-512 (F, DQ): the same attention with the same bits ---------------------------------
 *
 * Where the kernels use their AVX-512 tiles (tern_kernels_avx512()), attn_page runs the
 * loops above on 512-bit registers holding two of the AVX2 code's vectors side by side:
 * two keys' accumulators per register in the scores (then the same hadd tree on the
 * halves), sixteen elements of the output per register in the V accumulation. Every lane
 * sees the AVX2 code's operations in its order, so the results are the same bits (the ops
 * test compares the two). */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl")

/* Elements i .. i + 8 of two rows, [row p0 | row p1]. */
INLINE __m512 load8x2(const char *p0, const char *p1, size_t i, const int f16) {
    if (f16)
        return _mm512_cvtph_ps(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)((const uint16_t *)p0 + i))),
            _mm_loadu_si128((const __m128i *)((const uint16_t *)p1 + i)), 1));
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps((const float *)p0 + i)),
                              _mm256_loadu_ps((const float *)p1 + i), 1);
}
INLINE __m256 lo8(__m512 x) { return _mm512_castps512_ps256(x); }
INLINE __m256 hi8(__m512 x) { return _mm512_extractf32x8_ps(x, 1); }

/* dots8 with keys 2i, 2i + 1 in one register. */
INLINE __m256 dots8_512(const float *q, const char *k, size_t rb, size_t d, const int f16) {
    __m512 a01 = _mm512_setzero_ps(), a23 = a01, a45 = a01, a67 = a01;
    for (size_t i = 0; i < d; i += 8) {
        const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + i));
        a01 = _mm512_fmadd_ps(qv, load8x2(k, k + rb, i, f16), a01);
        a23 = _mm512_fmadd_ps(qv, load8x2(k + 2 * rb, k + 3 * rb, i, f16), a23);
        a45 = _mm512_fmadd_ps(qv, load8x2(k + 4 * rb, k + 5 * rb, i, f16), a45);
        a67 = _mm512_fmadd_ps(qv, load8x2(k + 6 * rb, k + 7 * rb, i, f16), a67);
    }
    const __m256 h01 = _mm256_hadd_ps(lo8(a01), hi8(a01)), h23 = _mm256_hadd_ps(lo8(a23), hi8(a23));
    const __m256 h45 = _mm256_hadd_ps(lo8(a45), hi8(a45)), h67 = _mm256_hadd_ps(lo8(a67), hi8(a67));
    const __m256 g0123 = _mm256_hadd_ps(h01, h23);
    const __m256 g4567 = _mm256_hadd_ps(h45, h67);
    const __m256 lo = _mm256_permute2f128_ps(g0123, g4567, 0x20);
    const __m256 hi = _mm256_permute2f128_ps(g0123, g4567, 0x31);
    return _mm256_add_ps(lo, hi);
}

/* pv_block over NZ registers of 16 (elements i0 .. i0 + 16 NZ), NZ 4 or 8. */
INLINE void pv_512(float *acc, float c, const float *p, size_t n, const char *v, size_t rb, size_t i0, const int nz,
                   const int f16) {
    const __m512 vc = _mm512_set1_ps(c);
    __m512 a[8];
    /* unrolled, so that a[] lives in registers (a loop over memory costs a store and a
     * reload per row) */
#pragma GCC unroll 8
    for (int r = 0; r < nz; r++) a[r] = _mm512_mul_ps(_mm512_loadu_ps(acc + i0 + 16 * r), vc);
    v += i0 * (f16 ? 2 : 4);
    for (size_t j = 0; j < n; j++, v += rb) {
        const __m512 w = _mm512_set1_ps(p[j]);
#pragma GCC unroll 8
        for (int r = 0; r < nz; r++) {
            const __m512 x = f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)v + 16 * r)))
                                 : _mm512_loadu_ps((const float *)v + 16 * r);
            a[r] = _mm512_fmadd_ps(w, x, a[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < nz; r++) _mm512_storeu_ps(acc + i0 + 16 * r, a[r]);
}

INLINE void attn_page_impl512(float *acc, float *m, float *l, const float *q, size_t d, const void *k,
                              const void *v, size_t row_elems, size_t n, float scale, float *scores, const int f16) {
    const size_t rb = row_elems * (f16 ? 2 : 4);
    const char *kr = k;
    const __m256 vs = _mm256_set1_ps(scale);
    size_t j = 0;
    for (; j + 8 <= n; j += 8, kr += 8 * rb)
        _mm256_storeu_ps(scores + j, _mm256_mul_ps(dots8_512(q, kr, rb, d, f16), vs));
    for (; j < n; j++, kr += rb) scores[j] = dot1(q, kr, d, f16) * scale;
    const float c = page_softmax(scores, n, m, l);
    size_t i0 = 0;
    if (d == 128) {
        pv_512(acc, c, scores, n, v, rb, 0, 8, f16);
        i0 = 128;
    }
    for (; i0 + 64 <= d; i0 += 64) pv_512(acc, c, scores, n, v, rb, i0, 4, f16);
    if (i0 < d) pv_block(acc, c, scores, n, v, rb, i0, (d - i0) / 8, f16);
}

static void attn_page_avx512(float *acc, float *m, float *l, const float *q, size_t d, const void *k, const void *v,
                             size_t row_elems, size_t n, float scale, bool f16, float *scores) {
    if (f16) attn_page_impl512(acc, m, l, q, d, k, v, row_elems, n, scale, scores, 1);
    else attn_page_impl512(acc, m, l, q, d, k, v, row_elems, n, scale, scores, 0);
}

/* attn_page_impl512 for two queries a, b at once: each loaded (and converted) key pair and
 * value register feeds both queries' accumulators, which see exactly attn_page_impl512's
 * operations in its order (the same bits); the page is read once for the pair. */
INLINE void dots8x2_512(const float *qa, const float *qb, const char *k, size_t rb, size_t d, __m256 *sa, __m256 *sb,
                        const int f16) {
    __m512 a01 = _mm512_setzero_ps(), a23 = a01, a45 = a01, a67 = a01;
    __m512 b01 = a01, b23 = a01, b45 = a01, b67 = a01;
    for (size_t i = 0; i < d; i += 8) {
        const __m512 qva = _mm512_broadcast_f32x8(_mm256_loadu_ps(qa + i));
        const __m512 qvb = _mm512_broadcast_f32x8(_mm256_loadu_ps(qb + i));
        const __m512 k01 = load8x2(k, k + rb, i, f16), k23 = load8x2(k + 2 * rb, k + 3 * rb, i, f16);
        const __m512 k45 = load8x2(k + 4 * rb, k + 5 * rb, i, f16), k67 = load8x2(k + 6 * rb, k + 7 * rb, i, f16);
        a01 = _mm512_fmadd_ps(qva, k01, a01), b01 = _mm512_fmadd_ps(qvb, k01, b01);
        a23 = _mm512_fmadd_ps(qva, k23, a23), b23 = _mm512_fmadd_ps(qvb, k23, b23);
        a45 = _mm512_fmadd_ps(qva, k45, a45), b45 = _mm512_fmadd_ps(qvb, k45, b45);
        a67 = _mm512_fmadd_ps(qva, k67, a67), b67 = _mm512_fmadd_ps(qvb, k67, b67);
    }
    const __m512 acc[2][4] = {{a01, a23, a45, a67}, {b01, b23, b45, b67}};
    __m256 *const out[2] = {sa, sb};
    for (int q = 0; q < 2; q++) {
        const __m256 h01 = _mm256_hadd_ps(lo8(acc[q][0]), hi8(acc[q][0]));
        const __m256 h23 = _mm256_hadd_ps(lo8(acc[q][1]), hi8(acc[q][1]));
        const __m256 h45 = _mm256_hadd_ps(lo8(acc[q][2]), hi8(acc[q][2]));
        const __m256 h67 = _mm256_hadd_ps(lo8(acc[q][3]), hi8(acc[q][3]));
        const __m256 g0123 = _mm256_hadd_ps(h01, h23), g4567 = _mm256_hadd_ps(h45, h67);
        *out[q] = _mm256_add_ps(_mm256_permute2f128_ps(g0123, g4567, 0x20), _mm256_permute2f128_ps(g0123, g4567, 0x31));
    }
}

/* pv_512 for two queries (elements i0 .. i0 + 16 NZ of both accs), NZ 4 or 8. */
INLINE void pv2_512(float *acca, float *accb, float ca, float cb, const float *pa, const float *pb, size_t n,
                    const char *v, size_t rb, size_t i0, const int nz, const int f16) {
    const __m512 vca = _mm512_set1_ps(ca), vcb = _mm512_set1_ps(cb);
    __m512 a[8], b[8];
#pragma GCC unroll 8
    for (int r = 0; r < nz; r++) {
        a[r] = _mm512_mul_ps(_mm512_loadu_ps(acca + i0 + 16 * r), vca);
        b[r] = _mm512_mul_ps(_mm512_loadu_ps(accb + i0 + 16 * r), vcb);
    }
    v += i0 * (f16 ? 2 : 4);
    for (size_t j = 0; j < n; j++, v += rb) {
        const __m512 wa = _mm512_set1_ps(pa[j]), wb = _mm512_set1_ps(pb[j]);
#pragma GCC unroll 8
        for (int r = 0; r < nz; r++) {
            const __m512 x = f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)v + 16 * r)))
                                 : _mm512_loadu_ps((const float *)v + 16 * r);
            a[r] = _mm512_fmadd_ps(wa, x, a[r]);
            b[r] = _mm512_fmadd_ps(wb, x, b[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < nz; r++) {
        _mm512_storeu_ps(acca + i0 + 16 * r, a[r]);
        _mm512_storeu_ps(accb + i0 + 16 * r, b[r]);
    }
}

/* scores: 2 (n + 8) floats. */
INLINE void attn_page2_impl512(const struct tern_attn_query *qs, size_t d, const void *k, const void *v,
                               size_t row_elems, size_t n, float scale, float *scores, const int f16) {
    const size_t rb = row_elems * (f16 ? 2 : 4);
    float *sc[2] = {scores, scores + n + 8};
    const char *kr = k;
    const __m256 vs = _mm256_set1_ps(scale);
    size_t j = 0;
    for (; j + 8 <= n; j += 8, kr += 8 * rb) {
        __m256 sa, sb;
        dots8x2_512(qs[0].q, qs[1].q, kr, rb, d, &sa, &sb, f16);
        _mm256_storeu_ps(sc[0] + j, _mm256_mul_ps(sa, vs));
        _mm256_storeu_ps(sc[1] + j, _mm256_mul_ps(sb, vs));
    }
    for (; j < n; j++, kr += rb)
        for (int q = 0; q < 2; q++) sc[q][j] = dot1(qs[q].q, kr, d, f16) * scale;
    float c[2];
    for (int q = 0; q < 2; q++) c[q] = page_softmax(sc[q], n, qs[q].m, qs[q].l);
    size_t i0 = 0;
    if (d == 128) {
        pv2_512(qs[0].acc, qs[1].acc, c[0], c[1], sc[0], sc[1], n, v, rb, 0, 8, f16);
        i0 = 128;
    }
    for (; i0 + 64 <= d; i0 += 64) pv2_512(qs[0].acc, qs[1].acc, c[0], c[1], sc[0], sc[1], n, v, rb, i0, 4, f16);
    if (i0 < d)
        for (int q = 0; q < 2; q++) pv_block(qs[q].acc, c[q], sc[q], n, v, rb, i0, (d - i0) / 8, f16);
}

static void attn_page2_avx512(const struct tern_attn_query *qs, size_t d, const void *k, const void *v,
                              size_t row_elems, size_t n, float scale, bool f16, float *scores) {
    if (f16) attn_page2_impl512(qs, d, k, v, row_elems, n, scale, scores, 1);
    else attn_page2_impl512(qs, d, k, v, row_elems, n, scale, scores, 0);
}

/* ---- several queries over one page (attn_page_multi), AVX-512 -------------------------------
 *
 * A query's bits are attn_page's: its score of key j is the fma chain over d in steps of 8
 * into 8 lanes, reduced by hsum_tree's tree, times scale; max, exp and sum by the same
 * functions; acc = acc * c, then fma(p_j, v_j, acc) for j ascending. What changes is which
 * lanes share a register and how often a row is loaded:
 * - scores: a register holds two queries' 8 lanes for one key ([a | b]); a key's 8
 *   elements are broadcast to both halves and feed up to 3 pairs (6 queries), and the 8
 *   keys' registers of a pair are reduced together (the AVX2 hadd tree, on both halves at
 *   once). F16 keys are converted once per block of 8 keys into a float buffer.
 * - V sum: each 16-element register of a row feeds up to 4 queries' accumulators; F16 rows
 *   are converted once per block of MQ_JB rows. The accumulators go to memory between
 *   blocks (exact), so each element still sees its fma chain in j order. */
#define MQ_JB 16

/* _mm256_hadd_ps on both 256-bit halves: [a0+a1, a2+a3, b0+b1, b2+b3] per 128-bit lane. */
INLINE __m512 hadd512(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Rows [0, cnt) of src (rb bytes apart), F16, as floats d apart in dst. */
INLINE void rows_to_f32(float *dst, const char *src, size_t rb, size_t cnt, size_t d) {
    for (size_t r = 0; r < cnt; r++, src += rb, dst += d) {
        const uint16_t *h = (const uint16_t *)src;
        size_t i = 0;
        for (; i + 16 <= d; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
        if (i < d) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    }
}

/* Scores of keys j0 .. j0 + 8 (float rows ld apart at kb) for NP query pairs packed at qp
 * (pair p, chunk c at qp + (p * d / 8 + c) * 16), into the rows sc[2p], sc[2p + 1]. */
INLINE void mq_scores8(const float *qp, const float *kb, size_t ld, size_t d, __m512 vs, float *const *sc, size_t j0,
                       const int np) {
    __m512 acc[3][8];
#pragma GCC unroll 3
    for (int p = 0; p < np; p++)
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) acc[p][j] = _mm512_setzero_ps();
    const size_t nc = d / 8;
    for (size_t c = 0; c < nc; c++) {
        __m512 qv[3];
#pragma GCC unroll 3
        for (int p = 0; p < np; p++) qv[p] = _mm512_loadu_ps(qp + ((size_t)p * nc + c) * 16);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m512 kv = _mm512_broadcast_f32x8(_mm256_loadu_ps(kb + j * ld + c * 8));
#pragma GCC unroll 3
            for (int p = 0; p < np; p++) acc[p][j] = _mm512_fmadd_ps(qv[p], kv, acc[p][j]);
        }
    }
    const __m512i ilo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    const __m512i ihi = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
#pragma GCC unroll 3
    for (int p = 0; p < np; p++) {
        const __m512 h01 = hadd512(acc[p][0], acc[p][1]), h23 = hadd512(acc[p][2], acc[p][3]);
        const __m512 h45 = hadd512(acc[p][4], acc[p][5]), h67 = hadd512(acc[p][6], acc[p][7]);
        const __m512 g0123 = hadd512(h01, h23), g4567 = hadd512(h45, h67);
        /* per half: [g0123 lo128 | g4567 lo128] + [g0123 hi128 | g4567 hi128], as dots8 */
        const __m512 lo = _mm512_permutex2var_ps(g0123, ilo, g4567);
        const __m512 hi = _mm512_permutex2var_ps(g0123, ihi, g4567);
        const __m512 s = _mm512_mul_ps(_mm512_add_ps(lo, hi), vs);
        _mm256_storeu_ps(sc[2 * p] + j0, lo8(s));
        _mm256_storeu_ps(sc[2 * p + 1] + j0, hi8(s));
    }
}

/* Elements i0 .. i0 + 64 of NQ queries' acc over rows j0 .. j0 + jn (float rows ld apart
 * at vb, its row 0 being row j0); first: scale acc by c before the first row. */
INLINE void mq_pv64(const struct tern_attn_query *qs, const float *c, float *const *p, const float *vb, size_t ld,
                    size_t j0, size_t jn, size_t i0, int first, const int nq) {
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int q = 0; q < nq; q++) {
        const __m512 vc = _mm512_set1_ps(c[q]);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512 x = _mm512_loadu_ps(qs[q].acc + i0 + 16 * r);
            a[q][r] = first ? _mm512_mul_ps(x, vc) : x;
        }
    }
    vb += i0;
    for (size_t j = 0; j < jn; j++, vb += ld) {
        const __m512 x0 = _mm512_loadu_ps(vb), x1 = _mm512_loadu_ps(vb + 16);
        const __m512 x2 = _mm512_loadu_ps(vb + 32), x3 = _mm512_loadu_ps(vb + 48);
#pragma GCC unroll 4
        for (int q = 0; q < nq; q++) {
            const __m512 w = _mm512_set1_ps(p[q][j0 + j]);
            a[q][0] = _mm512_fmadd_ps(w, x0, a[q][0]);
            a[q][1] = _mm512_fmadd_ps(w, x1, a[q][1]);
            a[q][2] = _mm512_fmadd_ps(w, x2, a[q][2]);
            a[q][3] = _mm512_fmadd_ps(w, x3, a[q][3]);
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < nq; q++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) _mm512_storeu_ps(qs[q].acc + i0 + 16 * r, a[q][r]);
}

INLINE void attn_multi_impl512(const struct tern_attn_query *qs, size_t nq, size_t d, const void *k, const void *v,
                               size_t row_elems, size_t n, float scale, float *scratch, const int f16) {
    const size_t rb = row_elems * (f16 ? 2 : 4), np = (nq + 1) / 2, ns = n + 8;
    float *rows[TERN_ATTN_MAX_Q + 1];
    for (size_t a = 0; a < 2 * np; a++) rows[a] = scratch + a * ns; /* row nq (odd nq): a discarded copy */
    float *qp = scratch + 2 * np * ns, *cv = qp + 2 * np * d;
    for (size_t p = 0; p < np; p++) {
        const float *qa = qs[2 * p].q, *qb = qs[2 * p + 1 < nq ? 2 * p + 1 : nq - 1].q;
        for (size_t c = 0; c < d / 8; c++) {
            _mm256_storeu_ps(qp + (p * (d / 8) + c) * 16, _mm256_loadu_ps(qa + 8 * c));
            _mm256_storeu_ps(qp + (p * (d / 8) + c) * 16 + 8, _mm256_loadu_ps(qb + 8 * c));
        }
    }
    const __m512 vs = _mm512_set1_ps(scale);
    const size_t n8 = n / 8 * 8;
    for (size_t j0 = 0; j0 < n8; j0 += 8) {
        const char *kr = (const char *)k + j0 * rb;
        const float *kb = (const float *)kr;
        size_t ld = row_elems;
        if (f16) rows_to_f32(cv, kr, rb, 8, d), kb = cv, ld = d;
        size_t p = 0;
        for (; p + 3 <= np; p += 3) mq_scores8(qp + p * 2 * d, kb, ld, d, vs, rows + 2 * p, j0, 3);
        if (np - p == 2) mq_scores8(qp + p * 2 * d, kb, ld, d, vs, rows + 2 * p, j0, 2);
        else if (np - p == 1) mq_scores8(qp + p * 2 * d, kb, ld, d, vs, rows + 2 * p, j0, 1);
    }
    for (size_t j = n8; j < n; j++)
        for (size_t a = 0; a < nq; a++) rows[a][j] = dot1(qs[a].q, (const char *)k + j * rb, d, f16) * scale;
    float c[TERN_ATTN_MAX_Q];
    for (size_t a = 0; a < nq; a++) c[a] = page_softmax(rows[a], n, qs[a].m, qs[a].l);
    const size_t d64 = d / 64 * 64;
    for (size_t j0 = 0; j0 < n && d64; j0 += MQ_JB) {
        const size_t jn = n - j0 < MQ_JB ? n - j0 : MQ_JB;
        const char *vr = (const char *)v + j0 * rb;
        const float *vb = (const float *)vr;
        size_t ld = row_elems;
        if (f16) rows_to_f32(cv, vr, rb, jn, d), vb = cv, ld = d;
        for (size_t i0 = 0; i0 < d64; i0 += 64) {
            size_t a = 0;
            for (; a + 4 <= nq; a += 4) mq_pv64(qs + a, c + a, rows + a, vb, ld, j0, jn, i0, j0 == 0, 4);
            switch (nq - a) {
            case 3: mq_pv64(qs + a, c + a, rows + a, vb, ld, j0, jn, i0, j0 == 0, 3); break;
            case 2: mq_pv64(qs + a, c + a, rows + a, vb, ld, j0, jn, i0, j0 == 0, 2); break;
            case 1: mq_pv64(qs + a, c + a, rows + a, vb, ld, j0, jn, i0, j0 == 0, 1); break;
            default: break;
            }
        }
    }
    if (d64 < d)
        for (size_t a = 0; a < nq; a++) pv_block(qs[a].acc, c[a], rows[a], n, v, rb, d64, (d - d64) / 8, f16);
}

static void attn_multi_avx512(const struct tern_attn_query *qs, size_t nq, size_t d, const void *k, const void *v,
                              size_t row_elems, size_t n, float scale, bool f16, float *scratch) {
    if (f16) attn_multi_impl512(qs, nq, d, k, v, row_elems, n, scale, scratch, 1);
    else attn_multi_impl512(qs, nq, d, k, v, row_elems, n, scale, scratch, 0);
}
#pragma GCC pop_options

static void attn_page_avx2(float *acc, float *m, float *l, const float *q, size_t d, const void *k, const void *v,
                           size_t row_elems, size_t n, float scale, bool f16, float *scores) {
    if (d % 8 != 0) tern_ops_portable()->attn_page(acc, m, l, q, d, k, v, row_elems, n, scale, f16, scores);
    else if (tern_kernels_avx512()) attn_page_avx512(acc, m, l, q, d, k, v, row_elems, n, scale, f16, scores);
    else if (f16) attn_page_impl(acc, m, l, q, d, k, v, row_elems, n, scale, scores, 1);
    else attn_page_impl(acc, m, l, q, d, k, v, row_elems, n, scale, scores, 0);
}

/* The 512-bit loops share a page from 4 queries on; below that the queries run one after
 * another. The AVX2 loops share it (attn_multi_avx2) for heads of 256 from 4 queries on:
 * `bench-attn --avx512 0` (thread CPU time, F16, the same VM, loaded), 4096 positions:
 * head 256, 4 queries 0.45 -> 0.38 ms, 8 queries 0.83 -> 0.62, 16 queries 1.59 -> 1.13;
 * 32768 positions, 32 queries 28.7 -> 21.3 (a head of 256 re-reads every value row four
 * times per query, 64 elements at a time: the block in L1 saves those reads). Heads of
 * 128 gain nothing measurable (16 queries 0.82 -> 0.75 at 4096, 8.3 -> 9.4 at 32768; 2
 * queries 0.12 -> 0.16: the block's copy costs what the shared conversion saves), so they
 * run one query after another.
 * `bench-attn` (thread CPU time, 4096 positions of F16, a loaded 2-vCPU Xeon family 6
 * model 207): head 128, 16 queries 0.83 -> 0.43 ms, 4 queries 0.22 -> 0.15, 2 queries
 * 0.12 -> 0.14 (the float copy of each 8-key block does not pay for one pair); head 256,
 * 32 queries 4.3 -> 2.1, 4 queries 0.53 -> 0.45, 2 queries 0.33 -> 0.35. Converting a
 * whole F16 page to float for the AVX2 loops cut their instructions (callgrind: 0.74x for
 * 16 queries of 128) but ran slower (1.35 against 0.80 ms: twice the bytes from L2 per
 * query), so they do not. */
static void attn_page_multi_avx2(const struct tern_attn_query *qs, size_t nq, size_t d, const void *k, const void *v,
                                 size_t row_elems, size_t n, float scale, bool f16, float *scratch) {
    if (d % 8 == 0 && nq >= 4 && tern_kernels_avx512()) {
        attn_multi_avx512(qs, nq, d, k, v, row_elems, n, scale, f16, scratch);
        return;
    }
    if (d % 8 == 0 && d >= 256 && nq >= 4) { /* the AVX2 loops: heads of 256 (see above) */
        attn_multi_avx2(qs, nq, d, k, v, row_elems, n, scale, f16, scratch);
        return;
    }
    size_t a = 0;
    if (d % 8 == 0 && tern_kernels_avx512())
        for (; a + 2 <= nq; a += 2) attn_page2_avx512(qs + a, d, k, v, row_elems, n, scale, f16, scratch);
    for (; a < nq; a++)
        attn_page_avx2(qs[a].acc, qs[a].m, qs[a].l, qs[a].q, d, k, v, row_elems, n, scale, f16, scratch);
}

static void to_f16_avx2(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        uint16_t t[8];
        _mm_storeu_si128((__m128i *)t, _mm256_cvtps_ph(load_tail(src + i, n - i, 0.0f), _MM_FROUND_TO_NEAREST_INT));
        memcpy(dst + i, t, (n - i) * sizeof *t);
    }
}

void tern_ops_avx2_fill(struct tern_ops *ops) {
    ops->to_f16 = to_f16_avx2;
    ops->name = "avx2";
    ops->rmsnorm = rmsnorm_avx2;
    ops->swiglu = swiglu_avx2;
    ops->add = add_avx2;
    ops->softmax = softmax_avx2;
    ops->attn_page = attn_page_avx2;
    ops->attn_page_multi = attn_page_multi_avx2;
}
