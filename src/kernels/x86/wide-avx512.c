/* AVX-512 tiles for batches (prompt processing) and single tokens (decode), used by the
 * AVX2 kernel table where the CPU has AVX-512 F, BW, VL and VNNI (CPUID, kernels.c;
 * TERN_AVX512=0 turns them off).
 *
 * Same bits as the AVX2 tiles, by construction: a 512-bit register holds two (row, token)
 * pairs side by side, rows 2p in the low 256 bits and 2p + 1 in the high ones, and every
 * lane goes through exactly the operations the AVX2 tile applies to that lane of that pair
 * (the same float multiplies, fused multiply-adds and conversions, in the same order; the
 * integer parts are exact, so how they are formed does not matter), then the same hsum8
 * on each half. What changes is how many pairs one instruction serves, and the integer
 * dot products:
 *   the 32-element quants (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL, MXFP4): vpdpbusd of the
 *               levels as unsigned bytes (the signed ones + 128) by the signed activation
 *               bytes, started from minus the offset's lanes (once per token and block),
 *               instead of sign / maddubs / madd: the same exact lane sums in one
 *               instruction per two pairs;
 *   Q4_K/Q5_K/Q6_K, IQ4_XS: maddubs, then vpdpwssd (the scale multiply and the add in one);
 *   F16, BF16:  the AVX2 tile's conversions and fmas, two pairs per instruction.
 * A single token (GEMV, decode) of Q4_K, Q5_K, Q6_K or IQ4_XS goes to the one-row GEMV below
 * (the same construction, one row at a time), of the others to the tiles' one-token column;
 * a last odd row and a k the tiles do not handle go to the AVX2 entry points: the mix is
 * free, as every pair's bits are the same either way (the kernel test compares the two tile
 * sets bit for bit on odd shapes, single tokens included). */
#include "kernels/lowbit.h"
#include "kernels/x86/avx2.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")

#define W_RPMAX 3 /* row pairs per tile */
#define W_TMAX 6  /* tokens per tile */

/* [lo | hi]: two 32-byte loads in one register. */
AVX2_INLINE __m512i pair_i(const void *lo, const void *hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(loadu256(lo)), loadu256(hi), 1);
}
AVX2_INLINE __m512 pair_ps(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1); }
/* 32 bytes in both halves (a broadcast load, no ALU work). */
AVX2_INLINE __m512i bcast_i(const void *p) { return _mm512_broadcast_i64x4(loadu256(p)); }
/* A block's half scale as a float in all 16 lanes: by F16C (cvt16, exact, as cvt_bcast)
 * or by the table (lut16; the batches' tiles, where the look-ups stay in L1 and a load
 * costs less than a conversion). */
AVX2_INLINE __m512 cvt16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
AVX2_INLINE __m512 lut16(const uint8_t *p) {
    tern_fp16 h;
    memcpy(&h, p, 2);
    return _mm512_set1_ps(tern_fp16_lut[h]);
}
/* The halves at p0 and p1 as floats, [p0's in 8 lanes | p1's in 8], by F16C: the 32-element
 * quants' scales, where a table look-up per block and row went to L2. */
AVX2_INLINE __m512 cvt_pair(const uint8_t *p0, const uint8_t *p1) {
    uint16_t h0, h1;
    memcpy(&h0, p0, 2);
    memcpy(&h1, p1, 2);
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)(h0 | ((uint32_t)h1 << 16))));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(f));
}
/* Both halves of two rows' blocks that start with (d, m), as [d0 | d1] and [m0 | m1]: one
 * conversion of the four halves. */
AVX2_INLINE void cvt_pair_dm(const uint8_t *p0, const uint8_t *p1, __m512 *d, __m512 *m) {
    uint32_t h0, h1;
    memcpy(&h0, p0, 4);
    memcpy(&h1, p1, 4);
    const __m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_set_epi32(0, 0, (int)h1, (int)h0)));
    *d = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2), f);
    *m = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3), f);
}
/* The same by the table (the K-quants: one scale per 256 elements). */
AVX2_INLINE __m512 lut_pair(const uint8_t *p0, const uint8_t *p1) { return pair_ps(lut_bcast(p0), lut_bcast(p1)); }
/* Prefetches a super-block (bytes long) of two rows at distance pf (0: none). */
AVX2_INLINE void pf_pair(const uint8_t *b0, const uint8_t *b1, size_t bytes, size_t pf) {
    if (!pf) return;
    for (size_t o = 0; o < bytes; o += 64) {
        avx2_prefetch(b0 + pf + o);
        avx2_prefetch(b1 + pf + o);
    }
}

/* The two outputs of a register: hsum8 of each half, as the AVX2 tiles do. */
AVX2_INLINE void store_pair(__m512 acc, float *y0, float *y1) {
    *y0 = hsum8(_mm512_castps512_ps256(acc));
    *y1 = hsum8(_mm512_extractf32x8_ps(acc, 1));
}

#define W_STORE(RP, T)                                                                                          \
    UNROLL for (int t = 0; t < (T); t++) UNROLL for (int p = 0; p < (RP); p++)                                  \
        store_pair(acc[p][t], y + (size_t)t * ldy + 2 * p, y + (size_t)t * ldy + 2 * p + 1)

/* ---- the 32-element quants (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL, MXFP4) -----------------
 *
 * The AVX2 tile's exact lane sums (q32-avx2.c: 4 products level x activation byte per int32
 * lane) by one vpdpbusd of unsigned levels by the signed activation bytes, then its float
 * operations on each lane. The signed levels (Q8_0, IQ4_NL, MXFP4) are read + 128 (a byte
 * xor, or the table + 128), and every lane starts from minus its offset times the lane's
 * activation sum, once per token and block for all rows: 128 for those, Q4_0's 8 and Q5_0's
 * 16 (which the AVX2 tile subtracts the same way); Q4_1/Q5_1's activation sums by one more
 * vpdpbusd. The unsigned levels are q32_levels', two rows side by side. */
AVX2_INLINE __m256i q32_ulevels(int kind, const uint8_t *blk) {
    const __m256i x80 = _mm256_set1_epi8((char)0x80);
    switch (kind) {
    case K_Q8_0: return _mm256_xor_si256(loadu256(blk + 2), x80);
    case K_IQ4_NL: return _mm256_shuffle_epi8(_mm256_xor_si256(iq4nl_table(), x80), nibbles32(blk + 2));
    case K_MXFP4: return _mm256_shuffle_epi8(_mm256_xor_si256(mxfp4_table(), x80), nibbles32(blk + 1));
    default: return q32_levels(kind, blk);
    }
}

AVX2_INLINE void q32_wtile(int kind, int RP, int T, const uint8_t *w, size_t wrb, const uint8_t *a, size_t arb,
                           size_t k, float *y, size_t ldy, size_t pf) {
    const size_t bb = q32_block_bytes(kind), ab = sizeof(struct tern_block_q8_0);
    const __m512i zero = _mm512_setzero_si512();
    const int off = q32_signed(kind) ? 128 : q32_offset(kind);
    __m512 acc[W_RPMAX][W_TMAX];
    UNROLL for (int p = 0; p < RP; p++) UNROLL for (int t = 0; t < T; t++) acc[p][t] = _mm512_setzero_ps();
    for (size_t b = 0; b < k / TERN_QK; b++) {
        __m512i wu[W_RPMAX];
        __m512 dw[W_RPMAX], mw[W_RPMAX];
        UNROLL for (int p = 0; p < RP; p++) {
            const uint8_t *b0 = w + (size_t)(2 * p) * wrb + b * bb, *b1 = b0 + wrb;
            if (pf) {
                avx2_prefetch(b0 + pf);
                avx2_prefetch(b1 + pf);
            }
            wu[p] = _mm512_inserti64x4(_mm512_castsi256_si512(q32_ulevels(kind, b0)), q32_ulevels(kind, b1), 1);
            /* one token: the scales by F16C (the table's look-ups went to L2); a batch: by
             * the table (hot in L1, a load instead of a conversion per token) */
            if (kind == K_MXFP4)
                dw[p] = pair_ps(_mm256_broadcast_ss(&tern_e8m0_half_lut[b0[0]]),
                                _mm256_broadcast_ss(&tern_e8m0_half_lut[b1[0]]));
            else if (T > 1) {
                dw[p] = lut_pair(b0, b1);
                if (q32_has_min(kind)) mw[p] = lut_pair(b0 + 2, b1 + 2);
            } else if (q32_has_min(kind))
                cvt_pair_dm(b0, b1, &dw[p], &mw[p]);
            else
                dw[p] = cvt_pair(b0, b1);
        }
        UNROLL for (int t = 0; t < T; t++) {
            const uint8_t *ablk = a + (size_t)t * arb + b * ab;
            const __m512i aq = bcast_i(ablk + 2);
            const __m512 da = T > 1 ? lut16(ablk) : cvt16(ablk);
            __m512i start = zero;
            __m512 asum = _mm512_setzero_ps();
            if (off) start = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8((char)off), aq));
            if (q32_has_min(kind)) asum = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, _mm512_set1_epi8(1), aq));
            UNROLL for (int p = 0; p < RP; p++) {
                const __m512i l = _mm512_dpbusd_epi32(start, wu[p], aq);
                if (kind == K_IQ4_NL || kind == K_MXFP4) /* multiply, then add: the AVX2 tile's */
                    acc[p][t] = _mm512_add_ps(acc[p][t], _mm512_mul_ps(_mm512_cvtepi32_ps(l), _mm512_mul_ps(dw[p], da)));
                else
                    acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l), _mm512_mul_ps(dw[p], da), acc[p][t]);
                if (q32_has_min(kind)) acc[p][t] = _mm512_fmadd_ps(asum, _mm512_mul_ps(mw[p], da), acc[p][t]);
            }
        }
    }
    W_STORE(RP, T);
}

/* ---- F16 and BF16 ----------------------------------------------------------------------- */

/* Eight weights of rows 2p and 2p + 1 as floats, [row 2p | row 2p + 1]: F16 by F16C,
 * BF16 by a shift into the top half (exact, as the AVX2 tile converts them). */
AVX2_INLINE __m512 half_pair(int bf16, const uint8_t *w0, size_t wrb) {
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(loadu128(w0)), loadu128(w0 + wrb), 1);
    if (!bf16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* k a multiple of 8 (the driver sends other k to the AVX2 tiles, which pad the tail). */
AVX2_INLINE void half_wtile(int bf16, int RP, int T, const uint8_t *w, size_t wrb, const uint8_t *a, size_t arb,
                            size_t k, float *y, size_t ldy, size_t pf) {
    __m512 acc[W_RPMAX][W_TMAX];
    UNROLL for (int p = 0; p < RP; p++) UNROLL for (int t = 0; t < T; t++) acc[p][t] = _mm512_setzero_ps();
    for (size_t i = 0; i < k; i += 8) {
        __m512 wv[W_RPMAX];
        UNROLL for (int p = 0; p < RP; p++) {
            const uint8_t *w0 = w + (size_t)(2 * p) * wrb + 2 * i;
            if (pf && i % 32 == 0) { /* a cache line of each row per 32 elements */
                avx2_prefetch(w0 + pf);
                avx2_prefetch(w0 + wrb + pf);
            }
            wv[p] = half_pair(bf16, w0, wrb);
        }
        UNROLL for (int t = 0; t < T; t++) {
            const __m512 x = _mm512_broadcast_f32x8(_mm256_loadu_ps((const float *)(a + (size_t)t * arb) + i));
            UNROLL for (int p = 0; p < RP; p++) acc[p][t] = _mm512_fmadd_ps(wv[p], x, acc[p][t]);
        }
    }
    W_STORE(RP, T);
}

/* ---- Q4_K and Q5_K ---------------------------------------------------------------------- */

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

/* A Q4_K/Q5_K block's 8 scales and 8 mins, each as int16. */
AVX2_INLINE void k4_scales(const uint8_t *blk, __m128i *sc, __m128i *mn) {
    const __m256i sm = k4_scales_mins16(blk);
    *sc = _mm256_castsi256_si128(sm);
    *mn = _mm256_extracti128_si256(sm, 1);
}

/* The one-row GEMVs' step c (64 weights: sub-blocks 2c and 2c + 1 side by side): the byte
 * shuffle that spreads int16 scale 2c over the low 256 bits and 2c + 1 over the high ones. */
AVX2_INLINE __m512i scale_pair_idx(int c) {
    return _mm512_inserti64x4(_mm512_set1_epi16((short)(0x0100 + 0x0202 * (2 * c))),
                              _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * c + 1))), 1);
}

/* int16 element j of each 128-bit lane, in all of that lane's int16 slots. */
AVX2_INLINE __m512i i16_bcast(__m512i x, int j) {
    return _mm512_shuffle_epi8(x, _mm512_set1_epi16((short)(0x0100 + 0x0202 * j)));
}

AVX2_INLINE void k4_wtile(int kind5, int RP, int T, const uint8_t *w, size_t wrb, const uint8_t *a, size_t arb,
                          size_t k, float *y, size_t ldy, size_t pf) {
    const size_t bb = kind5 ? sizeof(struct tern_block_q5_k) : sizeof(struct tern_block_q4_k);
    const size_t ab = sizeof(struct tern_block_q8_k);
    const size_t qs_off = kind5 ? offsetof(struct tern_block_q5_k, qs) : offsetof(struct tern_block_q4_k, qs);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* [m0 m0 m1 m1 m2 m2 m3 m3 | m4 m4 .. m7 m7] per 256 bits, to pair with the 16 group sums */
    const __m256i mins_idx = _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7, 8, 9, 8, 9, 10, 11, 10,
                                              11, 12, 13, 12, 13, 14, 15, 14, 15);
    __m512 acc[W_RPMAX][W_TMAX];
    UNROLL for (int p = 0; p < RP; p++) UNROLL for (int t = 0; t < T; t++) acc[p][t] = _mm512_setzero_ps();
    for (size_t b = 0; b < k / TERN_QK_K; b++) {
        __m512i sc[W_RPMAX], mins[W_RPMAX], qh[W_RPMAX];
        __m512 dw[W_RPMAX], dmw[W_RPMAX];
        UNROLL for (int p = 0; p < RP; p++) {
            const uint8_t *b0 = w + (size_t)(2 * p) * wrb + b * bb, *b1 = b0 + wrb;
            pf_pair(b0, b1, bb, pf);
            dw[p] = lut_pair(b0 + K4_D, b1 + K4_D);
            dmw[p] = lut_pair(b0 + K4_DMIN, b1 + K4_DMIN);
            __m128i s0, m0, s1, m1;
            k4_scales(b0, &s0, &m0);
            k4_scales(b1, &s1, &m1);
            sc[p] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(s0)),
                                       _mm256_broadcastsi128_si256(s1), 1);
            const __m256i mm0 = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(m0), mins_idx);
            const __m256i mm1 = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(m1), mins_idx);
            mins[p] = _mm512_inserti64x4(_mm512_castsi256_si512(mm0), mm1, 1);
            if (kind5) qh[p] = pair_i(b0 + K5_QH, b1 + K5_QH);
        }
        __m512i sumi[W_RPMAX][W_TMAX];
        UNROLL for (int p = 0; p < RP; p++) UNROLL for (int t = 0; t < T; t++) sumi[p][t] = _mm512_setzero_si512();
        UNROLL for (int c = 0; c < 4; c++) {
            __m512i lo[W_RPMAX], hi[W_RPMAX], slo[W_RPMAX], shi[W_RPMAX];
            UNROLL for (int p = 0; p < RP; p++) {
                const uint8_t *q0 = w + (size_t)(2 * p) * wrb + b * bb + qs_off + 32 * c;
                const __m512i q = pair_i(q0, q0 + wrb);
                lo[p] = _mm512_and_si512(q, m4);
                hi[p] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                if (kind5) {
                    const __m512i one = _mm512_set1_epi8(1);
                    const __m512i h0 = _mm512_and_si512(_mm512_srli_epi16(qh[p], 2 * c), one);
                    const __m512i h1 = _mm512_and_si512(_mm512_srli_epi16(qh[p], 2 * c + 1), one);
                    lo[p] = _mm512_or_si512(lo[p], _mm512_slli_epi16(h0, 4));
                    hi[p] = _mm512_or_si512(hi[p], _mm512_slli_epi16(h1, 4));
                }
                slo[p] = i16_bcast(sc[p], 2 * c);
                shi[p] = i16_bcast(sc[p], 2 * c + 1);
            }
            UNROLL for (int t = 0; t < T; t++) {
                const uint8_t *aq = a + (size_t)t * arb + b * ab + Q8K_QS + 64 * c;
                const __m512i alo = bcast_i(aq), ahi = bcast_i(aq + 32);
                UNROLL for (int p = 0; p < RP; p++) {
                    sumi[p][t] = _mm512_dpwssd_epi32(sumi[p][t], _mm512_maddubs_epi16(lo[p], alo), slo[p]);
                    sumi[p][t] = _mm512_dpwssd_epi32(sumi[p][t], _mm512_maddubs_epi16(hi[p], ahi), shi[p]);
                }
            }
        }
        UNROLL for (int t = 0; t < T; t++) {
            const uint8_t *ablk = a + (size_t)t * arb + b * ab;
            const __m512 dy = _mm512_set1_ps(*(const float *)(ablk + Q8K_D));
            const __m512i bs = bcast_i(ablk + Q8K_BSUMS);
            UNROLL for (int p = 0; p < RP; p++) {
                const __m512 m = _mm512_cvtepi32_ps(_mm512_madd_epi16(mins[p], bs));
                acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[p][t]), _mm512_mul_ps(dw[p], dy), acc[p][t]);
                acc[p][t] = _mm512_fnmadd_ps(m, _mm512_mul_ps(dmw[p], dy), acc[p][t]);
            }
        }
    }
    W_STORE(RP, T);
}

/* ---- Q6_K ------------------------------------------------------------------------------- */

AVX2_INLINE void q6k_wtile(int RP, int T, const uint8_t *w, size_t wrb, const uint8_t *a, size_t arb, size_t k,
                           float *y, size_t ldy, size_t pf) {
    const size_t bb = sizeof(struct tern_block_q6_k);
    const size_t ab = sizeof(struct tern_block_q8_k);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3);
    __m512 acc[W_RPMAX][W_TMAX];
    UNROLL for (int p = 0; p < RP; p++) UNROLL for (int t = 0; t < T; t++) acc[p][t] = _mm512_setzero_ps();
    for (size_t b = 0; b < k / TERN_QK_K; b++) {
        __m512i sc16[W_RPMAX]; /* the 16 scales of row 2p, then of row 2p + 1, as int16 */
        __m512 dw[W_RPMAX];
        UNROLL for (int p = 0; p < RP; p++) {
            const uint8_t *b0 = w + (size_t)(2 * p) * wrb + b * bb, *b1 = b0 + wrb;
            pf_pair(b0, b1, bb, pf);
            dw[p] = lut_pair(b0 + Q6K_D, b1 + Q6K_D);
            sc16[p] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepi8_epi16(loadu128(b0 + Q6K_SCALES))),
                                         _mm256_cvtepi8_epi16(loadu128(b1 + Q6K_SCALES)), 1);
        }
        __m512i sumi[W_RPMAX][W_TMAX];
        UNROLL for (int p = 0; p < RP; p++) UNROLL for (int t = 0; t < T; t++) sumi[p][t] = _mm512_setzero_si512();
        UNROLL for (int hf = 0; hf < 2; hf++) {
            UNROLL for (int j = 0; j < 4; j++) {
                /* 128-bit lane L takes scale 8 hf + 2 j + (L & 1) of its row (L >> 1): the
                 * AVX2 tile's sub-blocks 8 hf + 2 j (low 128 bits) and + 1 (high) */
                const int s = 8 * hf + 2 * j;
                const __m512i sidx = _mm512_setr_epi32(
                    s | s << 16, s | s << 16, s | s << 16, s | s << 16, (s + 1) | (s + 1) << 16, (s + 1) | (s + 1) << 16,
                    (s + 1) | (s + 1) << 16, (s + 1) | (s + 1) << 16, (s + 16) | (s + 16) << 16,
                    (s + 16) | (s + 16) << 16, (s + 16) | (s + 16) << 16, (s + 16) | (s + 16) << 16,
                    (s + 17) | (s + 17) << 16, (s + 17) | (s + 17) << 16, (s + 17) | (s + 17) << 16,
                    (s + 17) | (s + 17) << 16);
                __m512i q[W_RPMAX], sv[W_RPMAX];
                UNROLL for (int p = 0; p < RP; p++) {
                    const uint8_t *b0 = w + (size_t)(2 * p) * wrb + b * bb;
                    const __m512i ql = pair_i(b0 + 64 * hf + 32 * (j & 1), b0 + wrb + 64 * hf + 32 * (j & 1));
                    const __m512i qhv = pair_i(b0 + Q6K_QH + 32 * hf, b0 + wrb + Q6K_QH + 32 * hf);
                    const __m512i low = j < 2 ? _mm512_and_si512(ql, m4) : _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
                    const __m512i top = _mm512_and_si512(_mm512_srli_epi16(qhv, 2 * j), m2);
                    q[p] = _mm512_or_si512(low, _mm512_slli_epi16(top, 4));
                    sv[p] = _mm512_permutexvar_epi16(sidx, sc16[p]);
                }
                UNROLL for (int t = 0; t < T; t++) {
                    const __m512i av = bcast_i(a + (size_t)t * arb + b * ab + Q8K_QS + 128 * hf + 32 * j);
                    UNROLL for (int p = 0; p < RP; p++)
                        sumi[p][t] = _mm512_dpwssd_epi32(sumi[p][t], _mm512_maddubs_epi16(q[p], av), sv[p]);
                }
            }
        }
        UNROLL for (int t = 0; t < T; t++) {
            const uint8_t *ablk = a + (size_t)t * arb + b * ab;
            const __m512 dy = _mm512_set1_ps(*(const float *)(ablk + Q8K_D));
            const __m512i bs = bcast_i(ablk + Q8K_BSUMS);
            UNROLL for (int p = 0; p < RP; p++) {
                const __m512i corr = _mm512_slli_epi32(_mm512_madd_epi16(sc16[p], bs), 5);
                const __m512 s = _mm512_cvtepi32_ps(_mm512_sub_epi32(sumi[p][t], corr));
                acc[p][t] = _mm512_fmadd_ps(s, _mm512_mul_ps(dw[p], dy), acc[p][t]);
            }
        }
    }
    W_STORE(RP, T);
}

/* ---- IQ4_XS -------------------------------------------------------------------------------
 *
 * The AVX2 tile's lanes (qk-avx2.c): per sub-block of 32, the table levels times the
 * activation bytes by the sign trick, maddubs(|q|, a * sign(q)) (AVX-512 has no vpsignb: the
 * activation bytes under q's sign mask are negated, the same wrapping byte), and the int16
 * pairs times the sub-block's scale into the int32 lanes by vpdpwssd (exact: the same
 * integers as madd then add). Per super-block acc + lanes * (d * dy), unfused. */
AVX2_INLINE void iq4xs_wtile(int RP, int T, const uint8_t *w, size_t wrb, const uint8_t *a, size_t arb, size_t k,
                             float *y, size_t ldy, size_t pf) {
    const size_t bb = sizeof(struct tern_block_iq4_xs), ab = sizeof(struct tern_block_q8_k);
    const __m256i table = iq4nl_table();
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc[W_RPMAX][W_TMAX];
    UNROLL for (int p = 0; p < RP; p++) UNROLL for (int t = 0; t < T; t++) acc[p][t] = _mm512_setzero_ps();
    for (size_t b = 0; b < k / TERN_QK_K; b++) {
        __m512i sc[W_RPMAX];
        __m512 dw[W_RPMAX];
        UNROLL for (int p = 0; p < RP; p++) {
            const uint8_t *b0 = w + (size_t)(2 * p) * wrb + b * bb, *b1 = b0 + wrb;
            pf_pair(b0, b1, bb, pf);
            dw[p] = lut_pair(b0 + IQ4XS_D, b1 + IQ4XS_D);
            sc[p] = _mm512_inserti64x4(_mm512_castsi256_si512(iq4xs_scales16(b0)), iq4xs_scales16(b1), 1);
        }
        __m512i sumi[W_RPMAX][W_TMAX];
        UNROLL for (int p = 0; p < RP; p++) UNROLL for (int t = 0; t < T; t++) sumi[p][t] = zero;
        UNROLL for (int j = 0; j < 8; j++) {
            __m512i qa[W_RPMAX], s16[W_RPMAX];
            __mmask64 neg[W_RPMAX];
            UNROLL for (int p = 0; p < RP; p++) {
                const uint8_t *q0 = w + (size_t)(2 * p) * wrb + b * bb + IQ4XS_QS + 16 * j;
                const __m256i l0 = _mm256_shuffle_epi8(table, nibbles32(q0));
                const __m256i l1 = _mm256_shuffle_epi8(table, nibbles32(q0 + wrb));
                const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1);
                qa[p] = _mm512_abs_epi8(q);
                neg[p] = _mm512_movepi8_mask(q);
                s16[p] = i16_bcast(sc[p], j);
            }
            UNROLL for (int t = 0; t < T; t++) {
                const __m512i av = bcast_i(a + (size_t)t * arb + b * ab + Q8K_QS + 32 * j);
                UNROLL for (int p = 0; p < RP; p++) {
                    const __m512i sa = _mm512_mask_sub_epi8(av, neg[p], zero, av);
                    sumi[p][t] = _mm512_dpwssd_epi32(sumi[p][t], _mm512_maddubs_epi16(qa[p], sa), s16[p]);
                }
            }
        }
        UNROLL for (int t = 0; t < T; t++) {
            const __m512 dy = _mm512_set1_ps(*(const float *)(a + (size_t)t * arb + b * ab + Q8K_D));
            UNROLL for (int p = 0; p < RP; p++)
                acc[p][t] = _mm512_add_ps(acc[p][t], _mm512_mul_ps(_mm512_cvtepi32_ps(sumi[p][t]), _mm512_mul_ps(dw[p], dy)));
        }
    }
    W_STORE(RP, T);
}

/* One token: one row at a time, 64 weights (two sub-blocks) per register with their 64
 * activation bytes (one load), the two halves' lanes summed at the end of the super-block. */
AVX2_INLINE void iq4xs_gemv(const uint8_t *w, size_t wrb, const uint8_t *a, size_t k, float *y, size_t n_rows) {
    const size_t bb = sizeof(struct tern_block_iq4_xs), ab = sizeof(struct tern_block_q8_k);
    const __m512i table = _mm512_broadcast_i32x4(loadu128(tern_iq4nl_values));
    const __m512i m4 = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
    __m512i sidx[4];
    UNROLL for (int c = 0; c < 4; c++) sidx[c] = scale_pair_idx(c);
    for (size_t r = 0; r < n_rows; r++) {
        const uint8_t *row = w + r * wrb;
        __m256 acc = _mm256_setzero_ps();
        for (size_t b = 0; b < k / TERN_QK_K; b++) {
            const uint8_t *blk = row + b * bb, *ablk = a + b * ab;
            UNROLL for (size_t o = 0; o < bb; o += 64) avx2_prefetch(blk + (size_t)AVX2_PF_ROWS * wrb + o);
            const __m512i sc = _mm512_broadcast_i32x4(_mm256_castsi256_si128(iq4xs_scales16(blk)));
            __m512i sum = zero;
            UNROLL for (int c = 0; c < 4; c++) {
                /* bytes 32c..32c+31 hold sub-blocks 2c and 2c + 1: [x0 x0 x1 x1], the second
                 * copy of each shifted to its high nibbles: weights 64c..64c+63 in order */
                const __m512i x = _mm512_castsi256_si512(loadu256(blk + IQ4XS_QS + 32 * c));
                const __m512i z = _mm512_shuffle_i64x2(x, x, _MM_SHUFFLE(1, 1, 0, 0));
                const __m512i q = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4), m4));
                const __m512i av = _mm512_loadu_si512(ablk + Q8K_QS + 64 * c);
                const __m512i sa = _mm512_mask_sub_epi8(av, _mm512_movepi8_mask(q), zero, av);
                sum = _mm512_dpwssd_epi32(sum, _mm512_maddubs_epi16(_mm512_abs_epi8(q), sa), _mm512_shuffle_epi8(sc, sidx[c]));
            }
            const __m256i sumi = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
            const __m256 dw = lut_bcast(blk + IQ4XS_D);
            const __m256 dy = _mm256_broadcast_ss((const float *)(ablk + Q8K_D));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dw, dy)));
        }
        y[r] = hsum8(acc);
    }
}

/* ---- single-token GEMV (decode) for the K-quants ----------------------------------------
 *
 * One row at a time, as the AVX2 GEMV tile (R = 1, T = 1), and the same float operations on
 * the same 8 lanes: cvt of the 8 int32 lanes, fma with d*dy, fnmadd of the mins term (Q4_K,
 * Q5_K) or the -32 correction in the integers (Q6_K), hsum8; only the integer lane sums are
 * formed differently. A 512-bit register holds 64 consecutive weights of a super-block with
 * their 64 consecutive activation bytes (one load): the AVX2 tile's two 256-bit halves of a
 * step side by side, its lanes i and 8 + i summed at the end of the super-block (exact).
 * maddubs, then vpdpwssd by the sub-block scales (the multiply and the add in one): about
 * half the AVX2 tile's instructions per weight byte, which matters when two hyper-threads
 * share a core's ports (decode is otherwise bound by memory). */

AVX2_INLINE void k4_gemv(int kind5, const uint8_t *w, size_t wrb, const uint8_t *a, size_t k, float *y,
                         size_t n_rows) {
    const size_t bb = kind5 ? sizeof(struct tern_block_q5_k) : sizeof(struct tern_block_q4_k);
    const size_t ab = sizeof(struct tern_block_q8_k);
    const size_t qs_off = kind5 ? offsetof(struct tern_block_q5_k, qs) : offsetof(struct tern_block_q4_k, qs);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* [m0 m0 m1 m1 .. m7 m7] from words 8-15: pairs with the 16 group sums (AVX2 tile) */
    const __m256i mins_idx = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    /* step c: int16 scale 2c in the low 256 bits, 2c + 1 in the high ones (sidx); Q5_K: bit
     * 2c (low) or 2c + 1 (high) of each qh byte (hsel). Set once, not per row. */
    __m512i sidx[4], hsel[4];
    UNROLL for (int c = 0; c < 4; c++) {
        sidx[c] = scale_pair_idx(c);
        hsel[c] = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))),
                                     _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
    }
    for (size_t r = 0; r < n_rows; r++) {
        const uint8_t *row = w + r * wrb;
        __m256 acc = _mm256_setzero_ps();
        for (size_t b = 0; b < k / TERN_QK_K; b++) {
            const uint8_t *blk = row + b * bb, *ablk = a + b * ab;
            UNROLL for (size_t o = 0; o < bb; o += 64) avx2_prefetch(blk + (size_t)AVX2_PF_ROWS * wrb + o);
            const __m256i sm = k4_scales_mins16(blk);
            const __m512i sc = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sm)); /* s0..s7 per 128 bits */
            const __m512i qh = kind5 ? bcast_i(blk + K5_QH) : _mm512_setzero_si512();
            __m512i sum = _mm512_setzero_si512();
            UNROLL for (int c = 0; c < 4; c++) {
                /* [low nibbles | high nibbles] of bytes 32c..32c+31: sub-blocks 2c and 2c + 1,
                 * weights 64c..64c+63 in order */
                const __m512i q = bcast_i(blk + qs_off + 32 * c);
                __m512i v = _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xFFFF0000u, q, 4), m4);
                if (kind5) /* the fifth bit: qh bit 2c (low half) or 2c + 1 (high half) */
                    v = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(qh, hsel[c]), v, _mm512_set1_epi8(0x10));
                const __m512i p = _mm512_maddubs_epi16(v, _mm512_loadu_si512(ablk + Q8K_QS + 64 * c));
                sum = _mm512_dpwssd_epi32(sum, p, _mm512_shuffle_epi8(sc, sidx[c]));
            }
            const __m256i sumi = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
            const __m256 dw = lut_bcast(blk + K4_D), dmw = lut_bcast(blk + K4_DMIN);
            const __m256 dy = _mm256_broadcast_ss((const float *)(ablk + Q8K_D));
            const __m256i bs = loadu256(ablk + Q8K_BSUMS);
            const __m256 m = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_permutexvar_epi16(mins_idx, sm), bs));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dw, dy), acc);
            acc = _mm256_fnmadd_ps(m, _mm256_mul_ps(dmw, dy), acc);
        }
        y[r] = hsum8(acc);
    }
}

AVX2_INLINE void q6k_gemv(const uint8_t *w, size_t wrb, const uint8_t *a, size_t k, float *y, size_t n_rows) {
    const size_t bb = sizeof(struct tern_block_q6_k);
    const size_t ab = sizeof(struct tern_block_q8_k);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* qh bits 0-1 (low 256 bits) and 2-3 (high) to bits 4-5; bits 4-5 and 6-7 likewise */
    const __m512i sh0 = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), sh1 = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    /* every int16 slot holds the index of its 128-bit lane */
    const long long l1 = 0x0001000100010001ll;
    const __m512i lane16 = _mm512_setr_epi64(0, 0, l1, l1, 2 * l1, 2 * l1, 3 * l1, 3 * l1);
    for (size_t r = 0; r < n_rows; r++) {
        const uint8_t *row = w + r * wrb;
        __m256 acc = _mm256_setzero_ps();
        for (size_t b = 0; b < k / TERN_QK_K; b++) {
            const uint8_t *blk = row + b * bb, *ablk = a + b * ab;
            UNROLL for (size_t o = 0; o < bb; o += 64) avx2_prefetch(blk + (size_t)AVX2_PF_ROWS * wrb + o);
            const __m256i sc16 = _mm256_cvtepi8_epi16(loadu128(blk + Q6K_SCALES));
            const __m512i scz = _mm512_castsi256_si512(sc16);
            __m512i sum = _mm512_setzero_si512();
            UNROLL for (int hf = 0; hf < 2; hf++) {
                const __m512i ql = _mm512_loadu_si512(blk + Q6K_QL + 64 * hf);
                const __m512i qh = bcast_i(blk + Q6K_QH + 32 * hf);
                /* weights 128 hf + 0..63: low nibbles of ql, qh bits 0-1 | 2-3 (the AVX2
                 * tile's j = 0, 1); 128 hf + 64..127: high nibbles, bits 4-5 | 6-7 (j = 2, 3).
                 * ternlog 0xEC: (A & C) | B */
                const __m512i t0 = _mm512_and_si512(_mm512_sllv_epi64(qh, sh0), m30);
                const __m512i t1 = _mm512_and_si512(_mm512_srlv_epi64(qh, sh1), m30);
                const __m512i w0 = _mm512_ternarylogic_epi32(ql, t0, m4, 0xEC);
                const __m512i w1 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), t1, m4, 0xEC);
                /* 128-bit lane L of w0 is sub-block 8 hf + L, of w1 8 hf + 4 + L */
                const __m512i i0 = _mm512_add_epi16(lane16, _mm512_set1_epi16((short)(8 * hf)));
                const __m512i i1 = _mm512_add_epi16(lane16, _mm512_set1_epi16((short)(8 * hf + 4)));
                const __m512i p0 = _mm512_maddubs_epi16(w0, _mm512_loadu_si512(ablk + Q8K_QS + 128 * hf));
                const __m512i p1 = _mm512_maddubs_epi16(w1, _mm512_loadu_si512(ablk + Q8K_QS + 128 * hf + 64));
                sum = _mm512_dpwssd_epi32(sum, p0, _mm512_permutexvar_epi16(i0, scz));
                sum = _mm512_dpwssd_epi32(sum, p1, _mm512_permutexvar_epi16(i1, scz));
            }
            const __m256i sumi = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
            const __m256 dw = lut_bcast(blk + Q6K_D);
            const __m256 dy = _mm256_broadcast_ss((const float *)(ablk + Q8K_D));
            const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, loadu256(ablk + Q8K_BSUMS)), 5);
            const __m256 s = _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi, corr));
            acc = _mm256_fmadd_ps(s, _mm256_mul_ps(dw, dy), acc);
        }
        y[r] = hsum8(acc);
    }
}

/* Rows [0, n_rows) of a single-token product: y[r]. */
typedef void (*w_gemv_fn)(const uint8_t *w, size_t wrb, const uint8_t *a, size_t k, float *y, size_t n_rows);
static void q4_k_gemv(const uint8_t *w, size_t wrb, const uint8_t *a, size_t k, float *y, size_t n_rows) {
    k4_gemv(0, w, wrb, a, k, y, n_rows);
}
static void q5_k_gemv(const uint8_t *w, size_t wrb, const uint8_t *a, size_t k, float *y, size_t n_rows) {
    k4_gemv(1, w, wrb, a, k, y, n_rows);
}
static void q6_k_gemv(const uint8_t *w, size_t wrb, const uint8_t *a, size_t k, float *y, size_t n_rows) {
    q6k_gemv(w, wrb, a, k, y, n_rows);
}
static void iq4_xs_gemv(const uint8_t *w, size_t wrb, const uint8_t *a, size_t k, float *y, size_t n_rows) {
    iq4xs_gemv(w, wrb, a, k, y, n_rows);
}

/* ---- the driver ------------------------------------------------------------------------- */

/* pf: 0, or how far ahead (bytes) to prefetch the weight rows as they are read: the
 * first token tile of a row tile reads them from memory, the next ones from L1. */
typedef void (*w_tile_fn)(const uint8_t *w, size_t wrb, const uint8_t *a, size_t arb, size_t k, float *y,
                          size_t ldy, size_t pf);

struct w_tiles {
    w_tile_fn fn[W_RPMAX + 1][W_TMAX + 1]; /* [row pairs][tokens], 1-based */
    int rp, t;                              /* the shape of the tiles in the middle */
    size_t k_multiple;                      /* k the tiles handle; others go to AVX2 */
    tern_matmul_fn avx2;                    /* single tokens, the last odd row, other k */
    w_gemv_fn gemv;                         /* single tokens where not NULL (k a multiple of k_multiple) */
    bool wide_gemv;                         /* single tokens (gemv NULL) on the tiles' one-token column */
};

static void w_drive(const struct w_tiles *tl, const void *wv, size_t wrb, size_t k, const void *av, size_t arb,
                    size_t n_tok, float *y, size_t ldy, size_t r0, size_t r1) {
    if (n_tok == 1 && tl->gemv && k % tl->k_multiple == 0) {
        tl->gemv((const uint8_t *)wv + r0 * wrb, wrb, av, k, y + r0, r1 - r0);
        return;
    }
    if ((n_tok == 1 && !tl->wide_gemv) || k % tl->k_multiple || r1 - r0 < 2) {
        tl->avx2(wv, wrb, k, av, arb, n_tok, y, ldy, r0, r1);
        return;
    }
    const uint8_t *w = wv;
    const uint8_t *a = av;
    /* every type's one-token column takes as many rows as its batches' tiles: F16 and BF16
     * once ran decode on 4 rows, faster then than 6, but on the Zen 5 guest of 2026-12-07 6
     * rows were faster (Qwen3.5-0.8B F16, one thread: 1.12x, bench/vs-llama.sh --tern-base;
     * two threads 1.06-1.10x; bench-kernels F16 248320x1024: 22-24 -> 24-27 GB/s) */
    const size_t RP = (size_t)tl->rp, T = (size_t)tl->t;
    const size_t r_even = r0 + (r1 - r0) / 2 * 2;
    size_t tb = AVX2_ACT_BLOCK_BYTES / (arb ? arb : 1);
    tb = tb < T ? T : tb / T * T;
    for (size_t t0 = 0; t0 < n_tok; t0 += tb) {
        const size_t t1 = n_tok - t0 < tb ? n_tok : t0 + tb;
        for (size_t r = r0; r < r_even; r += 2 * RP) {
            const size_t np = (r_even - r) / 2 < RP ? (r_even - r) / 2 : RP;
            for (size_t t = t0; t < t1; t += T) {
                const size_t nt = t1 - t < T ? t1 - t : T;
                tl->fn[np][nt](w + r * wrb, wrb, a + t * arb, arb, k, y + t * ldy + r, ldy,
                               t == t0 ? 2 * RP * wrb : 0);
            }
        }
    }
    if (r_even < r1) tl->avx2(wv, wrb, k, av, arb, n_tok, y, ldy, r_even, r1);
}

#define W_TILE_INST(body, RP, T)                                                                             \
    static void body##_##RP##x##T(const uint8_t *w, size_t wrb, const uint8_t *a, size_t arb, size_t k,      \
                                  float *y, size_t ldy, size_t pf) {                                        \
        body(RP, T, w, wrb, a, arb, k, y, ldy, pf);                                                          \
    }
/* Tiles of RP row pairs x 1 .. T tokens (only the token counts the driver can ask for:
 * the middle tiles' T and the edges below it). */
#define W_ROW4(b, RP) W_TILE_INST(b, RP, 1) W_TILE_INST(b, RP, 2) W_TILE_INST(b, RP, 3) W_TILE_INST(b, RP, 4)
#define W_ROW6(b, RP) W_ROW4(b, RP) W_TILE_INST(b, RP, 5) W_TILE_INST(b, RP, 6)
#define W_SLOTS4(b, RP) [RP][1] = b##_##RP##x1, [RP][2] = b##_##RP##x2, [RP][3] = b##_##RP##x3, [RP][4] = b##_##RP##x4
#define W_SLOTS6(b, RP) W_SLOTS4(b, RP), [RP][5] = b##_##RP##x5, [RP][6] = b##_##RP##x6
#define W_ENTRY(name)                                                                                        \
    void name(const void *w, size_t wrb, size_t k, const void *a, size_t arb, size_t n_tok, float *y,        \
              size_t ldy, size_t r0, size_t r1) {                                                            \
        w_drive(&name##_tiles, w, wrb, k, a, arb, n_tok, y, ldy, r0, r1);                                    \
    }
/* Tiles up to 2 (W_TILES2) or 3 (W_TILES3) row pairs x T (4 or 6) tokens, the middle ones
 * the largest; single tokens on W_TILES2's gemvfn, on W_TILES3's one-token column. */
#define W_TILES2(name, body, T, kmul, avx2fn, gemvfn)                                                        \
    W_ROW##T(body, 1) W_ROW##T(body, 2)                                                                      \
    static const struct w_tiles name##_tiles = {                                                             \
        {W_SLOTS##T(body, 1), W_SLOTS##T(body, 2)}, 2, T, kmul, avx2fn, gemvfn, false};                      \
    W_ENTRY(name)
#define W_TILES3(name, body, T, kmul, avx2fn)                                                                \
    W_ROW##T(body, 1) W_ROW##T(body, 2) W_ROW##T(body, 3)                                                    \
    static const struct w_tiles name##_tiles = {                                                             \
        {W_SLOTS##T(body, 1), W_SLOTS##T(body, 2), W_SLOTS##T(body, 3)}, 3, T, kmul, avx2fn, NULL, true};    \
    W_ENTRY(name)

#define Q8_0_W(RP, T, ...) q32_wtile(K_Q8_0, RP, T, __VA_ARGS__)
#define Q4_0_W(RP, T, ...) q32_wtile(K_Q4_0, RP, T, __VA_ARGS__)
#define Q5_0_W(RP, T, ...) q32_wtile(K_Q5_0, RP, T, __VA_ARGS__)
#define Q4_1_W(RP, T, ...) q32_wtile(K_Q4_1, RP, T, __VA_ARGS__)
#define Q5_1_W(RP, T, ...) q32_wtile(K_Q5_1, RP, T, __VA_ARGS__)
#define IQ4_NL_W(RP, T, ...) q32_wtile(K_IQ4_NL, RP, T, __VA_ARGS__)
#define IQ4_XS_W(RP, T, ...) iq4xs_wtile(RP, T, __VA_ARGS__)
#define F16_W(RP, T, ...) half_wtile(0, RP, T, __VA_ARGS__)
#define BF16_W(RP, T, ...) half_wtile(1, RP, T, __VA_ARGS__)
#define Q4_K_W(RP, T, ...) k4_wtile(0, RP, T, __VA_ARGS__)
#define Q5_K_W(RP, T, ...) k4_wtile(1, RP, T, __VA_ARGS__)
#define Q6_K_W(RP, T, ...) q6k_wtile(RP, T, __VA_ARGS__)
#define MXFP4_W(RP, T, ...) q32_wtile(K_MXFP4, RP, T, __VA_ARGS__)

W_TILES3(tern_avx512_matmul_q8_0, Q8_0_W, 4, TERN_QK, tern_avx2_matmul_q8_0)
W_TILES3(tern_avx512_matmul_mxfp4, MXFP4_W, 4, TERN_QK, tern_avx2_matmul_mxfp4)
W_TILES3(tern_avx512_matmul_q4_0, Q4_0_W, 4, TERN_QK, tern_avx2_matmul_q4_0)
W_TILES3(tern_avx512_matmul_q5_0, Q5_0_W, 4, TERN_QK, tern_avx2_matmul_q5_0)
W_TILES3(tern_avx512_matmul_q4_1, Q4_1_W, 4, TERN_QK, tern_avx2_matmul_q4_1)
W_TILES3(tern_avx512_matmul_q5_1, Q5_1_W, 4, TERN_QK, tern_avx2_matmul_q5_1)
W_TILES3(tern_avx512_matmul_iq4_nl, IQ4_NL_W, 4, TERN_QK, tern_avx2_matmul_iq4_nl)
W_TILES3(tern_avx512_matmul_f16, F16_W, 6, 8, tern_avx2_matmul_f16)
W_TILES3(tern_avx512_matmul_bf16, BF16_W, 6, 8, tern_avx2_matmul_bf16)
W_TILES2(tern_avx512_matmul_q4_k, Q4_K_W, 4, TERN_QK_K, tern_avx2_matmul_q4_k, q4_k_gemv)
W_TILES2(tern_avx512_matmul_q5_k, Q5_K_W, 4, TERN_QK_K, tern_avx2_matmul_q5_k, q5_k_gemv)
W_TILES2(tern_avx512_matmul_q6_k, Q6_K_W, 4, TERN_QK_K, tern_avx2_matmul_q6_k, q6_k_gemv)
W_TILES2(tern_avx512_matmul_iq4_xs, IQ4_XS_W, 4, TERN_QK_K, tern_avx2_matmul_iq4_xs, iq4_xs_gemv)

#pragma GCC pop_options

/* Entries by weight type; NULL: the AVX2 table's. */
const struct tern_kernel_table tern_kernels_avx512_tiles = {
    .matmul =
        {
            [TERN_DTYPE_F16] = tern_avx512_matmul_f16,
            [TERN_DTYPE_BF16] = tern_avx512_matmul_bf16,
            [TERN_DTYPE_Q8_0] = tern_avx512_matmul_q8_0,
            [TERN_DTYPE_Q4_K] = tern_avx512_matmul_q4_k,
            [TERN_DTYPE_Q5_K] = tern_avx512_matmul_q5_k,
            [TERN_DTYPE_Q6_K] = tern_avx512_matmul_q6_k,
            [TERN_DTYPE_MXFP4] = tern_avx512_matmul_mxfp4,
            [TERN_DTYPE_Q4_0] = tern_avx512_matmul_q4_0,
            [TERN_DTYPE_Q5_0] = tern_avx512_matmul_q5_0,
            [TERN_DTYPE_Q4_1] = tern_avx512_matmul_q4_1,
            [TERN_DTYPE_Q5_1] = tern_avx512_matmul_q5_1,
            [TERN_DTYPE_IQ4_NL] = tern_avx512_matmul_iq4_nl,
            [TERN_DTYPE_IQ4_XS] = tern_avx512_matmul_iq4_xs,
            LOWBIT_TABLE(tern_lowbit_avx512),
        },
};
