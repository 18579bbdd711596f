/* AVX2 kernels for the 32-element quants (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL, MXFP4) times Q8_0
 * activations.
 *
 * Per (row, token) pair and block, 8 int32 lanes each hold the exact sum of 4 products
 * level * activation byte (madd of maddubs):
 *   Q8_0:       signed levels by the sign trick, maddubs(|w|, sign(a, w)) (|w| <= 128,
 *               |a| <= 127: no saturation);
 *   Q4_0/Q5_0:  unsigned levels q (0..15 / 0..31) directly, minus the lanes of 8 a / 16 a
 *               (computed once per token and block): the lanes of (q - 8) a exactly;
 *   Q4_1/Q5_1:  unsigned levels directly;
 *   IQ4_NL:     each nibble replaced by its table value (one byte shuffle), then as Q8_0,
 *               but accumulated as acc + lanes * (dw*da), unfused, as its portable twin
 *               does (the two give the same bits);
 *   MXFP4:      as IQ4_NL with the MXFP4 table, the scale the E8M0 byte's 2^(e - 128).
 * The lanes are converted exactly to float and accumulated as acc = fma(lanes, dw*da, acc)
 * (dw*da, a product of two halves, is exact); Q4_1/Q5_1 then add their offset as
 * acc = fma(lanes of a, m*da, acc). hsum8 at the end. */
#include "kernels/x86/avx2.h"

AVX2_INLINE void q32_tile(int kind, int R, int T, const uint8_t *w, size_t wrb, const uint8_t *a, size_t arb,
                          size_t k, float *y, size_t ldy) {
    const size_t bb = q32_block_bytes(kind);
    const size_t ab = sizeof(struct tern_block_q8_0);
    const size_t nb = k / TERN_QK;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[AVX2_RMAX][AVX2_TMAX];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; b++) {
        __m256i wq[AVX2_RMAX], wu[AVX2_RMAX];
        __m256 dw[AVX2_RMAX], mw[AVX2_RMAX];
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *blk = w + (size_t)r * wrb + b * bb;
            if (T == 1) avx2_prefetch(blk + (size_t)(R > AVX2_PF_ROWS ? R : AVX2_PF_ROWS) * wrb);
            dw[r] = kind == K_MXFP4 ? _mm256_set1_ps(tern_e8m0_half(blk[0])) : T > 1 ? lut_bcast(blk) : cvt_bcast(blk);
            if (q32_has_min(kind)) mw[r] = T > 1 ? lut_bcast(blk + 2) : cvt_bcast(blk + 2);
            wq[r] = q32_levels(kind, blk);
            wu[r] = q32_signed(kind) ? _mm256_sign_epi8(wq[r], wq[r]) : wq[r];
        }
        UNROLL for (int t = 0; t < T; t++) {
            const uint8_t *ablk = a + (size_t)t * arb + b * ab;
            const __m256 da = T > 1 ? lut_bcast(ablk) : cvt_bcast(ablk);
            const __m256i aq = loadu256(ablk + 2);
            __m256i corr = _mm256_setzero_si256();
            __m256 asum = _mm256_setzero_ps();
            if (q32_offset(kind))
                corr = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8((char)q32_offset(kind)), aq), ones);
            if (q32_has_min(kind)) asum = _mm256_cvtepi32_ps(dot_u8s8_32(_mm256_set1_epi8(1), aq));
            UNROLL for (int r = 0; r < R; r++) {
                const __m256i s = q32_signed(kind) ? _mm256_sign_epi8(aq, wq[r]) : aq;
                __m256i l = _mm256_madd_epi16(_mm256_maddubs_epi16(wu[r], s), ones);
                if (q32_offset(kind)) l = _mm256_sub_epi32(l, corr);
                if (kind == K_IQ4_NL || kind == K_MXFP4) /* multiply, then add: the portable twin's */
                    acc[r][t] = _mm256_add_ps(acc[r][t], _mm256_mul_ps(_mm256_cvtepi32_ps(l), _mm256_mul_ps(dw[r], da)));
                else
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), _mm256_mul_ps(dw[r], da), acc[r][t]);
                if (q32_has_min(kind)) acc[r][t] = _mm256_fmadd_ps(asum, _mm256_mul_ps(mw[r], da), acc[r][t]);
            }
        }
    }
    UNROLL for (int t = 0; t < T; t++) UNROLL for (int r = 0; r < R; r++) y[(size_t)t * ldy + r] = hsum8(acc[r][t]);
}

#define Q8_0_TILE(R, T, ...) q32_tile(K_Q8_0, R, T, __VA_ARGS__)
#define Q4_0_TILE(R, T, ...) q32_tile(K_Q4_0, R, T, __VA_ARGS__)
#define Q5_0_TILE(R, T, ...) q32_tile(K_Q5_0, R, T, __VA_ARGS__)
#define Q4_1_TILE(R, T, ...) q32_tile(K_Q4_1, R, T, __VA_ARGS__)
#define Q5_1_TILE(R, T, ...) q32_tile(K_Q5_1, R, T, __VA_ARGS__)
#define IQ4_NL_TILE(R, T, ...) q32_tile(K_IQ4_NL, R, T, __VA_ARGS__)
#define MXFP4_TILE(R, T, ...) q32_tile(K_MXFP4, R, T, __VA_ARGS__)

/* GEMV: 4 rows per tile. GEMM: Q8_0 3 rows x 2 tokens, the others (which unpack their
 * levels per row) 2 rows x 4 tokens. */
AVX2_GRID3(Q8_0_TILE, 2)
AVX2_TILE_INST(Q8_0_TILE, 4, 1)
static const struct avx2_tiles q8_0_tiles = {{AVX2_IGRID3(Q8_0_TILE, 2), AVX2_TILE_SLOT(Q8_0_TILE, 4, 1)}, 4, 3, 2};

#define Q32_TILES(body)                                                                          \
    AVX2_GRID2(body, 4)                                                                          \
    AVX2_TILE_INST(body, 3, 1)                                                                   \
    AVX2_TILE_INST(body, 4, 1)                                                                   \
    static const struct avx2_tiles body##_set = {                                                \
        {AVX2_IGRID2(body, 4), AVX2_TILE_SLOT(body, 3, 1), AVX2_TILE_SLOT(body, 4, 1)}, 4, 2, 4};

Q32_TILES(Q4_0_TILE)
Q32_TILES(Q5_0_TILE)
Q32_TILES(Q4_1_TILE)
Q32_TILES(Q5_1_TILE)
Q32_TILES(IQ4_NL_TILE)
Q32_TILES(MXFP4_TILE)

AVX2_MATMUL(tern_avx2_matmul_q8_0, q8_0_tiles)
AVX2_MATMUL(tern_avx2_matmul_q4_0, Q4_0_TILE_set)
AVX2_MATMUL(tern_avx2_matmul_q5_0, Q5_0_TILE_set)
AVX2_MATMUL(tern_avx2_matmul_q4_1, Q4_1_TILE_set)
AVX2_MATMUL(tern_avx2_matmul_q5_1, Q5_1_TILE_set)
AVX2_MATMUL(tern_avx2_matmul_iq4_nl, IQ4_NL_TILE_set)
AVX2_MATMUL(tern_avx2_matmul_mxfp4, MXFP4_TILE_set)
