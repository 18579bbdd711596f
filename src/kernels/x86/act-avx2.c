/* AVX2 activation quantizers. They write exactly the bytes of the portable ones
 * (tern_quantize_q8_0_ref / _q8_k_ref): the same scalar scale arithmetic, MAXPS/MINPS
 * clamps that tern_round_clamp mirrors, and round-to-nearest-even conversion. */
#include "kernels/x86/avx2.h"

#define TINY_AMAX 0x1p-100f

/* max(|x|) over n (a multiple of 8) floats; NaN never wins, as in the portable code. */
AVX2_INLINE float amax_n(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* 32 floats * id -> 32 int8 in [-127, 127] (RNE). */
AVX2_INLINE __m256i quant32(const float *x, __m256 id) {
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i q[4];
    for (int j = 0; j < 4; j++) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), id);
        v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
        q[j] = _mm256_cvtps_epi32(v);
    }
    /* packs interleave 128-bit lanes: restore element order with one permute */
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    return _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void tern_avx2_act_q8_0(const float *x, void *out, size_t k) {
    struct tern_block_q8_0 *y = out;
    for (size_t b = 0; b < k / TERN_QK; b++, x += TERN_QK) {
        const float amax = amax_n(x, TERN_QK);
        float d = 0.0f;
        tern_fp16 h = 0;
        if (amax >= TINY_AMAX) {
            float v = amax / 127.0f;
            if (v > 65504.0f) v = 65504.0f;
            h = tern_f32_to_fp16(v);
            d = tern_fp16_to_f32(h);
        }
        if (d == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        y[b].d = h;
        _mm256_storeu_si256((__m256i *)y[b].qs, quant32(x, _mm256_set1_ps(1.0f / d)));
    }
}

void tern_avx2_act_q8_k(const float *x, void *out, size_t k) {
    struct tern_block_q8_k *y = out;
    for (size_t b = 0; b < k / TERN_QK_K; b++, x += TERN_QK_K) {
        const float amax = amax_n(x, TERN_QK_K);
        if (!(amax >= TINY_AMAX)) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float d = amax / 127.0f;
        const __m256 id = _mm256_set1_ps(1.0f / d);
        y[b].d = d;
        for (int c = 0; c < TERN_QK_K / 32; c++) {
            const __m256i q = quant32(x + 32 * c, id);
            _mm256_storeu_si256((__m256i *)(y[b].qs + 32 * c), q);
            /* group sums of 16: widen to int16, pairwise-add to int32, fold each half */
            const __m256i s = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)), _mm256_set1_epi16(1));
            const __m256i s2 =
                _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)), _mm256_set1_epi16(1));
            /* hadd folds 8 lanes to (within each 128 half) pairs; two rounds give the sum
             * of each 128 half = one group of 16 for s and s2. */
            __m256i h = _mm256_hadd_epi32(s, s2);
            h = _mm256_hadd_epi32(h, h);
            /* lanes: [s.lo, s2.lo, s.lo, s2.lo | s.hi, s2.hi, ...] */
            const int g0 = _mm256_extract_epi32(h, 0) + _mm256_extract_epi32(h, 4);
            const int g1 = _mm256_extract_epi32(h, 1) + _mm256_extract_epi32(h, 5);
            y[b].bsums[2 * c] = (int16_t)g0;
            y[b].bsums[2 * c + 1] = (int16_t)g1;
        }
    }
}
