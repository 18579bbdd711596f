/* AVX2+FMA kernels for float weights (F32, F16, BF16) times F32 activations.
 *
 * Per (row, token) pair: one 8-lane accumulator, acc = fma(w[i..i+8), x[i..i+8), acc)
 * for i = 0, 8, 16, ... in order; a last partial chunk is zero-padded on both sides
 * (adds exact zeros); then hsum8. */
#include "kernels/x86/avx2.h"

/* Mask with the first n (< 8) lanes set. */
AVX2_INLINE __m256i tail_mask(size_t n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), idx);
}

AVX2_INLINE __m256 load_w_f32(const uint8_t *w, size_t i) { return _mm256_loadu_ps((const float *)w + i); }
AVX2_INLINE __m256 load_w_f16(const uint8_t *w, size_t i) {
    return _mm256_cvtph_ps(loadu128(w + 2 * i));
}
AVX2_INLINE __m256 load_w_bf16(const uint8_t *w, size_t i) {
    const __m256i v = _mm256_cvtepu16_epi32(loadu128(w + 2 * i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* The last n < 8 weights, zero-padded. */
AVX2_INLINE __m256 tail_w(int kind, const uint8_t *w, size_t i, size_t n) {
    if (kind == 0) return _mm256_maskload_ps((const float *)w + i, tail_mask(n));
    uint16_t h[8] = {0};
    memcpy(h, w + 2 * i, 2 * n);
    return kind == 1 ? load_w_f16((const uint8_t *)h, 0) : load_w_bf16((const uint8_t *)h, 0);
}

/* kind: 0 F32, 1 F16, 2 BF16 (a constant after inlining). */
AVX2_INLINE void float_tile(int kind, int R, int T, const uint8_t *w, size_t wrb, const uint8_t *a,
                            size_t arb, size_t k, float *y, size_t ldy) {
    __m256 acc[AVX2_RMAX][AVX2_TMAX];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 wv[AVX2_RMAX];
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *wr = w + (size_t)r * wrb;
            /* one prefetch per 64 bytes of the row */
            if (T == 1 && (i * (kind == 0 ? 4 : 2)) % 64 == 0)
                avx2_prefetch(wr + (size_t)(R > AVX2_PF_ROWS ? R : AVX2_PF_ROWS) * wrb + i * (kind == 0 ? 4 : 2));
            wv[r] = kind == 0 ? load_w_f32(wr, i) : kind == 1 ? load_w_f16(wr, i) : load_w_bf16(wr, i);
        }
        UNROLL for (int t = 0; t < T; t++) {
            const __m256 x = _mm256_loadu_ps((const float *)(a + (size_t)t * arb) + i);
            UNROLL for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], x, acc[r][t]);
        }
    }
    if (i < k) {
        const size_t n = k - i;
        __m256 wv[AVX2_RMAX];
        UNROLL for (int r = 0; r < R; r++) wv[r] = tail_w(kind, w + (size_t)r * wrb, i, n);
        UNROLL for (int t = 0; t < T; t++) {
            const __m256 x = _mm256_maskload_ps((const float *)(a + (size_t)t * arb) + i, tail_mask(n));
            UNROLL for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], x, acc[r][t]);
        }
    }
    UNROLL for (int t = 0; t < T; t++) UNROLL for (int r = 0; r < R; r++) y[(size_t)t * ldy + r] = hsum8(acc[r][t]);
}

#define F32_TILE(R, T, ...) float_tile(0, R, T, __VA_ARGS__)
#define F16_TILE(R, T, ...) float_tile(1, R, T, __VA_ARGS__)
#define BF16_TILE(R, T, ...) float_tile(2, R, T, __VA_ARGS__)

/* GEMV: 6 rows per tile (6 accumulators + 6 weight vectors + x in 13 of the 16 registers;
 * 4 rows read F16 at 22-23 GB/s with one thread where 6 read 25.5-26, BF16 +5 %: Zen 5 with
 * TERN_AVX512=0, bench-kernels 248320x1024 and 1024x3584, 2026-12-07); GEMM: 3 rows x 4
 * tokens (12 accumulators + 3 weight vectors). */
#define FLOAT_TILES(body)                                                                        \
    AVX2_GRID3(body, 4)                                                                          \
    AVX2_TILE_INST(body, 4, 1)                                                                   \
    AVX2_TILE_INST(body, 5, 1)                                                                   \
    AVX2_TILE_INST(body, 6, 1)                                                                   \
    static const struct avx2_tiles body##_set = {                                                \
        {AVX2_IGRID3(body, 4), AVX2_TILE_SLOT(body, 4, 1), AVX2_TILE_SLOT(body, 5, 1),           \
         AVX2_TILE_SLOT(body, 6, 1)},                                                            \
        6, 3, 4};

FLOAT_TILES(F32_TILE)
FLOAT_TILES(F16_TILE)
FLOAT_TILES(BF16_TILE)

AVX2_MATMUL(tern_avx2_matmul_f32, F32_TILE_set)
AVX2_MATMUL(tern_avx2_matmul_f16, F16_TILE_set)
AVX2_MATMUL(tern_avx2_matmul_bf16, BF16_TILE_set)
