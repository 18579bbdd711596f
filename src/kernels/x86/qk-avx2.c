/* AVX2 kernels for the K-quants (Q4_K, Q5_K, Q6_K) and IQ4_XS times Q8_K activations.
 *
 * Per (row, token) pair and super-block of 256: every sub-block's levels times the
 * activation bytes (maddubs, exact), times the sub-block's integer scale (madd with the
 * scale broadcast to int16), summed into 8 int32 lanes: all integer, so exact. Then,
 * once per super-block:
 *   Q4_K/Q5_K: acc = fma(lanes, d*dy, acc); acc = fnmadd(mins . bsums lanes, dmin*dy, acc)
 *   Q6_K:      acc = fma(lanes - 32 * (scales . bsums lanes), d*dy, acc)
 * (levels of Q6_K are kept unsigned in [0, 63]; the -32 is applied through the group
 * sums of the activations). Finally hsum8. */
#include "kernels/x86/avx2.h"

enum qk_kind { K_Q4_K, K_Q5_K, K_Q6_K };

/* Field offsets of the blocks (quant.h): the kernels address bytes of packed structs. */
#define Q8K_D offsetof(struct tern_block_q8_k, d)
#define Q8K_QS offsetof(struct tern_block_q8_k, qs)
#define Q8K_BSUMS offsetof(struct tern_block_q8_k, bsums)
#define K4_D offsetof(struct tern_block_q4_k, d)
#define K4_DMIN offsetof(struct tern_block_q4_k, dmin)
#define K5_QH offsetof(struct tern_block_q5_k, qh)
#define Q6K_QL offsetof(struct tern_block_q6_k, ql)
#define Q6K_QH offsetof(struct tern_block_q6_k, qh)
#define Q6K_SCALES offsetof(struct tern_block_q6_k, scales)
#define Q6K_D offsetof(struct tern_block_q6_k, d)
_Static_assert(offsetof(struct tern_block_q4_k, d) == offsetof(struct tern_block_q5_k, d) &&
                   offsetof(struct tern_block_q4_k, dmin) == offsetof(struct tern_block_q5_k, dmin) &&
                   offsetof(struct tern_block_q4_k, scales) == offsetof(struct tern_block_q5_k, scales),
               "Q4_K and Q5_K share their head");

AVX2_INLINE size_t qk_block_bytes(int kind) {
    return kind == K_Q4_K ? sizeof(struct tern_block_q4_k)
           : kind == K_Q5_K ? sizeof(struct tern_block_q5_k)
                            : sizeof(struct tern_block_q6_k);
}

/* Dword j (0..3) of each 128-bit lane broadcast over that lane (j is a constant after
 * unrolling; the switch keeps the immediate literal for every compiler). */
AVX2_INLINE __m256i dword_bcast(__m256i x, int j) {
    switch (j & 3) {
    case 0: return _mm256_shuffle_epi32(x, 0x00);
    case 1: return _mm256_shuffle_epi32(x, 0x55);
    case 2: return _mm256_shuffle_epi32(x, 0xAA);
    default: return _mm256_shuffle_epi32(x, 0xFF);
    }
}

/* ---- Q4_K and Q5_K ------------------------------------------------------------------- */

AVX2_INLINE void k4_tile(int kind, int R, int T, const uint8_t *w, size_t wrb, const uint8_t *a, size_t arb,
                         size_t k, float *y, size_t ldy) {
    const size_t bb = qk_block_bytes(kind);
    const size_t ab = sizeof(struct tern_block_q8_k);
    const size_t qs_off = kind == K_Q4_K ? offsetof(struct tern_block_q4_k, qs) : offsetof(struct tern_block_q5_k, qs);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[AVX2_RMAX][AVX2_TMAX];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (size_t b = 0; b < k / TERN_QK_K; b++) {
        /* scale pairs: [s0 s0 s1 s1 s2 s2 s3 s3] and [s4 s4 .. s7 s7] in both lanes */
        __m256i spl[AVX2_RMAX], sph[AVX2_RMAX], mins[AVX2_RMAX], qh[AVX2_RMAX];
        __m256 dw[AVX2_RMAX], dmw[AVX2_RMAX];
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *blk = w + (size_t)r * wrb + b * bb;
            if (T == 1)
                UNROLL for (size_t o = 0; o < bb; o += 64) avx2_prefetch(blk + (size_t)AVX2_PF_ROWS * wrb + o);
            dw[r] = lut_bcast(blk + K4_D);
            dmw[r] = lut_bcast(blk + K4_DMIN);
            const __m256i sm = k4_scales_mins16(blk);
            const __m256i s16 = _mm256_permute2x128_si256(sm, sm, 0x00); /* s0..s7 in both lanes */
            spl[r] = _mm256_unpacklo_epi16(s16, s16);
            sph[r] = _mm256_unpackhi_epi16(s16, s16);
            const __m256i m16 = _mm256_permute2x128_si256(sm, sm, 0x11); /* m0..m7 in both lanes */
            /* [m0 m0 m1 m1 m2 m2 m3 m3 | m4 m4 ... m7 m7], to pair with the 16 group sums */
            mins[r] = _mm256_shuffle_epi8(
                m16, _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7, 8, 9, 8, 9, 10, 11, 10, 11, 12,
                                      13, 12, 13, 14, 15, 14, 15));
            if (kind == K_Q5_K) qh[r] = loadu256(blk + K5_QH);
        }
        __m256i sumi[AVX2_RMAX][AVX2_TMAX];
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) sumi[r][t] = _mm256_setzero_si256();
        UNROLL for (int c = 0; c < 4; c++) {
            __m256i lo[AVX2_RMAX], hi[AVX2_RMAX], slo[AVX2_RMAX], shi[AVX2_RMAX];
            UNROLL for (int r = 0; r < R; r++) {
                const __m256i q = loadu256(w + (size_t)r * wrb + b * bb + qs_off + 32 * c);
                lo[r] = _mm256_and_si256(q, m4);
                hi[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if (kind == K_Q5_K) {
                    const __m256i one = _mm256_set1_epi8(1);
                    const __m256i b0 = _mm256_and_si256(_mm256_srli_epi16(qh[r], 2 * c), one);
                    const __m256i b1 = _mm256_and_si256(_mm256_srli_epi16(qh[r], 2 * c + 1), one);
                    lo[r] = _mm256_or_si256(lo[r], _mm256_slli_epi16(b0, 4));
                    hi[r] = _mm256_or_si256(hi[r], _mm256_slli_epi16(b1, 4));
                }
                slo[r] = dword_bcast(c < 2 ? spl[r] : sph[r], 2 * c);
                shi[r] = dword_bcast(c < 2 ? spl[r] : sph[r], 2 * c + 1);
            }
            UNROLL for (int t = 0; t < T; t++) {
                const uint8_t *aq = a + (size_t)t * arb + b * ab + Q8K_QS + 64 * c;
                const __m256i alo = loadu256(aq), ahi = loadu256(aq + 32);
                UNROLL for (int r = 0; r < R; r++) {
                    const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[r], alo), slo[r]);
                    const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi[r], ahi), shi[r]);
                    sumi[r][t] = _mm256_add_epi32(sumi[r][t], _mm256_add_epi32(p0, p1));
                }
            }
        }
        UNROLL for (int t = 0; t < T; t++) {
            const uint8_t *ablk = a + (size_t)t * arb + b * ab;
            const __m256 dy = _mm256_broadcast_ss((const float *)(ablk + Q8K_D));
            const __m256i bs = loadu256(ablk + Q8K_BSUMS);
            UNROLL for (int r = 0; r < R; r++) {
                const __m256 m = _mm256_cvtepi32_ps(_mm256_madd_epi16(mins[r], bs));
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r][t]), _mm256_mul_ps(dw[r], dy), acc[r][t]);
                acc[r][t] = _mm256_fnmadd_ps(m, _mm256_mul_ps(dmw[r], dy), acc[r][t]);
            }
        }
    }
    UNROLL for (int t = 0; t < T; t++) UNROLL for (int r = 0; r < R; r++) y[(size_t)t * ldy + r] = hsum8(acc[r][t]);
}

/* ---- Q6_K ----------------------------------------------------------------------------- */

AVX2_INLINE void q6k_tile(int R, int T, const uint8_t *w, size_t wrb, const uint8_t *a, size_t arb, size_t k,
                          float *y, size_t ldy) {
    const size_t bb = sizeof(struct tern_block_q6_k);
    const size_t ab = sizeof(struct tern_block_q8_k);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256 acc[AVX2_RMAX][AVX2_TMAX];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (size_t b = 0; b < k / TERN_QK_K; b++) {
        __m256i sc16[AVX2_RMAX]; /* the 16 scales as int16 */
        __m256 dw[AVX2_RMAX];
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *blk = w + (size_t)r * wrb + b * bb;
            if (T == 1)
                UNROLL for (size_t o = 0; o < bb; o += 64) avx2_prefetch(blk + (size_t)AVX2_PF_ROWS * wrb + o);
            dw[r] = lut_bcast(blk + Q6K_D);
            sc16[r] = _mm256_cvtepi8_epi16(loadu128(blk + Q6K_SCALES));
        }
        __m256i sumi[AVX2_RMAX][AVX2_TMAX];
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) sumi[r][t] = _mm256_setzero_si256();
        UNROLL for (int hf = 0; hf < 2; hf++) {
            /* per half: low lanes [s0 s0 s2 s2 s4 s4 s6 s6], high lanes [s1 s1 s3 s3 ..] of
             * its 8 scales, so that dword j is sub-block 2j (low) and 2j+1 (high) */
            __m256i sp[AVX2_RMAX];
            UNROLL for (int r = 0; r < R; r++) {
                const __m256i s8 = hf ? _mm256_permute2x128_si256(sc16[r], sc16[r], 0x11)
                                      : _mm256_permute2x128_si256(sc16[r], sc16[r], 0x00);
                sp[r] = _mm256_shuffle_epi8(s8, _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 2, 3,
                                                                  2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15));
            }
            UNROLL for (int j = 0; j < 4; j++) {
                __m256i q[AVX2_RMAX], sv[AVX2_RMAX];
                UNROLL for (int r = 0; r < R; r++) {
                    const uint8_t *blk = w + (size_t)r * wrb + b * bb;
                    const __m256i ql = loadu256(blk + Q6K_QL + 64 * hf + 32 * (j & 1));
                    const __m256i qhv = loadu256(blk + Q6K_QH + 32 * hf);
                    const __m256i low = j < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
                    /* qh bits 2j, 2j + 1 to bits 4-5 in one shift (none for j = 2) */
                    const __m256i top = j == 0   ? _mm256_slli_epi16(qhv, 4)
                                        : j == 1 ? _mm256_slli_epi16(qhv, 2)
                                        : j == 2 ? qhv
                                                 : _mm256_srli_epi16(qhv, 2);
                    q[r] = _mm256_or_si256(low, _mm256_and_si256(top, m30));
                    /* sub-blocks 8 hf + 2 j (low 128) and 8 hf + 2 j + 1 (high 128) */
                    sv[r] = dword_bcast(sp[r], j);
                }
                UNROLL for (int t = 0; t < T; t++) {
                    const __m256i av = loadu256(a + (size_t)t * arb + b * ab + Q8K_QS + 128 * hf + 32 * j);
                    UNROLL for (int r = 0; r < R; r++)
                        sumi[r][t] = _mm256_add_epi32(sumi[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], av), sv[r]));
                }
            }
        }
        UNROLL for (int t = 0; t < T; t++) {
            const uint8_t *ablk = a + (size_t)t * arb + b * ab;
            const __m256 dy = _mm256_broadcast_ss((const float *)(ablk + Q8K_D));
            const __m256i bs = loadu256(ablk + Q8K_BSUMS);
            UNROLL for (int r = 0; r < R; r++) {
                const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16[r], bs), 5);
                const __m256 s = _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[r][t], corr));
                acc[r][t] = _mm256_fmadd_ps(s, _mm256_mul_ps(dw[r], dy), acc[r][t]);
            }
        }
    }
    UNROLL for (int t = 0; t < T; t++) UNROLL for (int r = 0; r < R; r++) y[(size_t)t * ldy + r] = hsum8(acc[r][t]);
}

/* ---- IQ4_XS ---------------------------------------------------------------------------
 *
 * Per sub-block of 32: each nibble replaced by its table value (one byte shuffle), the
 * signed levels times the activation bytes by the sign trick (maddubs(|q|, sign(a, q)),
 * no saturation: |q|, |a| <= 127), times the sub-block's integer scale (madd), summed
 * over the super-block in 8 int32 lanes. Then per super-block acc = acc + lanes * (d*dy),
 * a multiply and an add, not fused. The portable twin (ref/matmul-ref.c) performs these
 * same operations (without needing fmaf), so both ISAs give the same bits. */

AVX2_INLINE void iq4xs_tile(int R, int T, const uint8_t *w, size_t wrb, const uint8_t *a, size_t arb, size_t k,
                            float *y, size_t ldy) {
    const size_t bb = sizeof(struct tern_block_iq4_xs);
    const size_t ab = sizeof(struct tern_block_q8_k);
    const __m256i table = iq4nl_table();
    __m256 acc[AVX2_RMAX][AVX2_TMAX];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (size_t b = 0; b < k / TERN_QK_K; b++) {
        __m256i sc[AVX2_RMAX]; /* the 8 scales ls - 32 as int16, in both 128-bit lanes */
        __m256 dw[AVX2_RMAX];
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *blk = w + (size_t)r * wrb + b * bb;
            if (T == 1)
                UNROLL for (size_t o = 0; o < bb; o += 64) avx2_prefetch(blk + (size_t)AVX2_PF_ROWS * wrb + o);
            dw[r] = lut_bcast(blk + IQ4XS_D);
            sc[r] = iq4xs_scales16(blk);
        }
        __m256i sumi[AVX2_RMAX][AVX2_TMAX];
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) sumi[r][t] = _mm256_setzero_si256();
        UNROLL for (int j = 0; j < 8; j++) {
            __m256i q[AVX2_RMAX], qa[AVX2_RMAX], s16[AVX2_RMAX];
            UNROLL for (int r = 0; r < R; r++) {
                q[r] = _mm256_shuffle_epi8(table, nibbles32(w + (size_t)r * wrb + b * bb + IQ4XS_QS + 16 * j));
                qa[r] = _mm256_sign_epi8(q[r], q[r]);
                s16[r] = _mm256_shuffle_epi8(sc[r], _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
            }
            UNROLL for (int t = 0; t < T; t++) {
                const __m256i av = loadu256(a + (size_t)t * arb + b * ab + Q8K_QS + 32 * j);
                UNROLL for (int r = 0; r < R; r++) {
                    const __m256i p = _mm256_maddubs_epi16(qa[r], _mm256_sign_epi8(av, q[r]));
                    sumi[r][t] = _mm256_add_epi32(sumi[r][t], _mm256_madd_epi16(p, s16[r]));
                }
            }
        }
        UNROLL for (int t = 0; t < T; t++) {
            const __m256 dy = _mm256_broadcast_ss((const float *)(a + (size_t)t * arb + b * ab + Q8K_D));
            UNROLL for (int r = 0; r < R; r++) /* multiply, then add: the portable twin's operations */
                acc[r][t] = _mm256_add_ps(acc[r][t], _mm256_mul_ps(_mm256_cvtepi32_ps(sumi[r][t]), _mm256_mul_ps(dw[r], dy)));
        }
    }
    UNROLL for (int t = 0; t < T; t++) UNROLL for (int r = 0; r < R; r++) y[(size_t)t * ldy + r] = hsum8(acc[r][t]);
}

#define Q4_K_TILE(R, T, ...) k4_tile(K_Q4_K, R, T, __VA_ARGS__)
#define Q5_K_TILE(R, T, ...) k4_tile(K_Q5_K, R, T, __VA_ARGS__)
#define Q6_K_TILE(R, T, ...) q6k_tile(R, T, __VA_ARGS__)
#define IQ4_XS_TILE(R, T, ...) iq4xs_tile(R, T, __VA_ARGS__)

/* GEMV: one row per tile (the per-row unpacking has no one to share it with, and one
 * row keeps everything in registers). GEMM: 1 row x 4 tokens. */
#define QK_TILES(body)                                                                           \
    AVX2_GRID1(body, 4)                                                                          \
    static const struct avx2_tiles body##_set = {{AVX2_IGRID1(body, 4)}, 1, 1, 4};

QK_TILES(Q4_K_TILE)
QK_TILES(Q5_K_TILE)
QK_TILES(Q6_K_TILE)

AVX2_MATMUL(tern_avx2_matmul_q4_k, Q4_K_TILE_set)
AVX2_MATMUL(tern_avx2_matmul_q5_k, Q5_K_TILE_set)
AVX2_MATMUL(tern_avx2_matmul_q6_k, Q6_K_TILE_set)

/* IQ4_XS: GEMV 2 rows per tile (its per-row state is 8 small scales), GEMM 1 x 4. */
AVX2_GRID1(IQ4_XS_TILE, 4)
AVX2_TILE_INST(IQ4_XS_TILE, 2, 1)
static const struct avx2_tiles iq4_xs_tiles = {{AVX2_IGRID1(IQ4_XS_TILE, 4), AVX2_TILE_SLOT(IQ4_XS_TILE, 2, 1)}, 2, 1, 4};
AVX2_MATMUL(tern_avx2_matmul_iq4_xs, iq4_xs_tiles)
