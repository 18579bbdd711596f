/* AVX2 kernels of the low-bit types (lowbit.h): the shared unpacking and float steps,
 * the integer sum of a super-block by maddubs (|q| times a with q's sign) and madd with
 * the sub-block scales, 8 int32 lanes summed at the end. Exact, so the bits are the
 * portable kernels' (test-kernels compares them with memcmp). */
#include "kernels/lowbit.h"

#include <immintrin.h>
#include <stddef.h>

static inline int32_t lowbit_isum_avx2(const struct tern_lowbit_sb *u, const struct tern_block_q8_k *a) {
    __m256i acc = _mm256_setzero_si256();
    for (int p = 0; p < 8; p++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(u->q + 32 * p));
        const __m256i x = _mm256_loadu_si256((const __m256i *)(a->qs + 32 * p));
        const __m256i prod = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
        const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(u->sc[2 * p + 1]), _mm_set1_epi16(u->sc[2 * p]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(prod, sc));
    }
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* Decode (one token) of Q2_K and Q3_K straight from the packed bits, eight rows at a time
 * (the AVX-512 kernel's method in 256-bit registers): step (h, j) of a row's block holds
 * elements 128 h + 32 j + l in byte l, whose activations lie together; its 16-bit products
 * take sub-block 8 h + 2 j's scale in the low lane and 8 h + 2 j + 1's in the high lane
 * (one pshufb of the 16 scale bytes). Q3_K as u = q + 4, less 4 * sum_j sc[j] bsum[j].
 * The same exact sums and the same float steps per lane: the driver's bits. */
static const uint8_t lowbit_avx2_spread[8][32] = {
#define LB_W(x) x, 0x80, x, 0x80, x, 0x80, x, 0x80, x, 0x80, x, 0x80, x, 0x80, x, 0x80
    {LB_W(0), LB_W(1)}, {LB_W(2), LB_W(3)},   {LB_W(4), LB_W(5)},   {LB_W(6), LB_W(7)},
    {LB_W(8), LB_W(9)}, {LB_W(10), LB_W(11)}, {LB_W(12), LB_W(13)}, {LB_W(14), LB_W(15)},
#undef LB_W
};

/* Eight rows' 8-lane vectors to one vector of their sums (row i in lane i). */
static inline __m256i lowbit_avx2_fold8(const __m256i *v) {
    const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}

static size_t lowbit_decode8_avx2(enum tern_dtype t, const void *w, size_t wrb, size_t k, const void *act,
                                  size_t act_row_bytes, size_t n_tok, float *y, size_t ldy, size_t r0, size_t r1) {
    (void)act_row_bytes, (void)ldy;
    const bool q2 = t == TERN_DTYPE_Q2_K;
    if (n_tok != 1 || (!q2 && t != TERN_DTYPE_Q3_K)) return r0;
    const size_t nb = k / TERN_QK_K;
    const size_t bb = q2 ? sizeof(struct tern_block_q2_k) : sizeof(struct tern_block_q3_k);
    const size_t doff = q2 ? offsetof(struct tern_block_q2_k, d) : offsetof(struct tern_block_q3_k, d);
    const float post = tern_lowbit_post(t);
    const struct tern_block_q8_k *a = act;
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4), m4 = _mm256_set1_epi8(0xF);
    for (; r0 + 8 <= r1; r0 += 8) {
        const uint8_t *w0 = (const uint8_t *)w + r0 * wrb;
        __m256 acc = _mm256_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const struct tern_block_q8_k *ab = a + b;
            const __m256i bs = _mm256_loadu_si256((const __m256i *)ab->bsums);
            __m256i sv[8], mv[8];
            for (int i = 0; i < 8; i++) {
                const uint8_t *blk = w0 + i * wrb + b * bb;
                TERN_LOWBIT_PREFETCH8(w, wrb, bb, nb, r0 + i, b, r1);
                __m256i s = _mm256_setzero_si256(), scb, hm = _mm256_setzero_si256();
                const uint8_t *qs;
                if (q2) {
                    const __m128i raw = _mm_loadu_si128((const __m128i *)blk);
                    scb = _mm256_and_si256(_mm256_broadcastsi128_si256(raw), m4);
                    mv[i] = _mm256_madd_epi16(
                        _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm256_castsi256_si128(m4))), bs);
                    qs = blk + offsetof(struct tern_block_q2_k, qs);
                } else {
                    /* the scales as bytes for the pshufb, the words sign-extended below */
                    const __m128i sc8 = tern_lowbit_q3_k_scales8(blk + offsetof(struct tern_block_q3_k, scales));
                    mv[i] = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), bs);
                    scb = _mm256_broadcastsi128_si256(sc8);
                    hm = _mm256_loadu_si256((const __m256i *)blk);
                    qs = blk + offsetof(struct tern_block_q3_k, qs);
                }
                for (int h = 0; h < 2; h++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) {
                        __m256i l = _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), three);
                        const int hb = 4 * h + j; /* Q3_K: that bit of hmask to bit 2 */
                        if (!q2)
                            l = _mm256_or_si256(l, _mm256_and_si256(hb >= 2 ? _mm256_srli_epi16(hm, hb - 2)
                                                                            : _mm256_slli_epi16(hm, 2 - hb),
                                                                    four));
                        const __m256i x = _mm256_loadu_si256((const __m256i *)(ab->qs + 128 * h + 32 * j));
                        __m256i sc = _mm256_shuffle_epi8(
                            scb, _mm256_loadu_si256((const __m256i *)lowbit_avx2_spread[4 * h + j]));
                        if (!q2) sc = _mm256_srai_epi16(_mm256_slli_epi16(sc, 8), 8);
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(l, x), sc));
                    }
                }
                sv[i] = s;
            }
            const __m256i s8 = lowbit_avx2_fold8(sv);
            const __m256i m8 = lowbit_avx2_fold8(mv);
            const uint8_t *dp = w0 + b * bb + doff;
            acc =
                tern_lowbit_kacc8(acc, s8, m8, tern_lowbit_f16x8(dp, wrb),
                                  q2 ? tern_lowbit_f16x8(dp + 2, wrb) : _mm256_setzero_ps(), _mm256_set1_ps(ab->d), q2);
        }
        _mm256_storeu_ps(y + r0, _mm256_mul_ps(acc, _mm256_set1_ps(post)));
    }
    return r0;
}

/* Prompts (two tokens or more) of Q2_K and Q3_K: one row at a time, eight tokens at a
 * time, a row's block unpacked in registers once per eight tokens (step (h, j) is the
 * activations' own order here: elements 32 (4 h + j) ..), then per token and 32 levels
 * one maddubs and one madd with the spread scales. The fold, the float steps per lane
 * and the last group's repeated token as in the AVX-512 kernel. */
static size_t lowbit_prompt_avx2(enum tern_dtype t, const void *w, size_t wrb, size_t k, const void *act,
                                 size_t act_row_bytes, size_t n_tok, float *y, size_t ldy, size_t r0, size_t r1) {
    const bool q2 = t == TERN_DTYPE_Q2_K;
    if (n_tok < 2 || (!q2 && t != TERN_DTYPE_Q3_K)) return r0;
    const size_t nb = k / TERN_QK_K;
    const size_t bb = q2 ? sizeof(struct tern_block_q2_k) : sizeof(struct tern_block_q3_k);
    const float post = tern_lowbit_post(t);
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4), m4 = _mm256_set1_epi8(0xF);
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w + r * wrb;
        for (size_t t0 = 0; t0 < n_tok; t0 += 8) {
            const struct tern_block_q8_k *at[8];
            for (size_t i = 0; i < 8; i++)
                at[i] = (const void *)((const uint8_t *)act + (t0 + i < n_tok ? t0 + i : n_tok - 1) * act_row_bytes);
            __m256 acc = _mm256_setzero_ps();
            for (size_t b = 0; b < nb; b++) {
                const uint8_t *blk = wr + b * bb;
                __m256i lv[8], scv[8], msc, scb, hm = _mm256_setzero_si256();
                const uint8_t *qs;
                float d, dmin = 0.0f;
                if (q2) {
                    const struct tern_block_q2_k *q = (const void *)blk;
                    const __m128i raw = _mm_loadu_si128((const __m128i *)q->scales);
                    scb = _mm256_and_si256(_mm256_broadcastsi128_si256(raw), m4);
                    msc = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm256_castsi256_si128(m4)));
                    qs = q->qs;
                    d = _cvtsh_ss(q->d);
                    dmin = _cvtsh_ss(q->dmin);
                } else {
                    const struct tern_block_q3_k *q = (const void *)blk;
                    const __m128i sc8 = tern_lowbit_q3_k_scales8(q->scales);
                    msc = _mm256_cvtepi8_epi16(sc8);
                    scb = _mm256_broadcastsi128_si256(sc8);
                    hm = _mm256_loadu_si256((const __m256i *)q->hmask);
                    qs = q->qs;
                    d = _cvtsh_ss(q->d);
                }
                for (int h = 0; h < 2; h++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
                    for (int j = 0; j < 4; j++) {
                        __m256i l = _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), three);
                        const int hb = 4 * h + j;
                        if (!q2)
                            l = _mm256_or_si256(l, _mm256_and_si256(hb >= 2 ? _mm256_srli_epi16(hm, hb - 2)
                                                                            : _mm256_slli_epi16(hm, 2 - hb),
                                                                    four));
                        __m256i sc =
                            _mm256_shuffle_epi8(scb, _mm256_loadu_si256((const __m256i *)lowbit_avx2_spread[hb]));
                        if (!q2) sc = _mm256_srai_epi16(_mm256_slli_epi16(sc, 8), 8);
                        lv[hb] = l;
                        scv[hb] = sc;
                    }
                }
                __m256i sv[8], mv[8];
                for (int i = 0; i < 8; i++) {
                    const struct tern_block_q8_k *a = at[i] + b;
                    __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
                    for (int p = 0; p < 8; p++)
                        s = _mm256_add_epi32(
                            s, _mm256_madd_epi16(
                                   _mm256_maddubs_epi16(lv[p], _mm256_loadu_si256((const __m256i *)(a->qs + 32 * p))),
                                   scv[p]));
                    sv[i] = s;
                    mv[i] = _mm256_madd_epi16(msc, _mm256_loadu_si256((const __m256i *)a->bsums));
                }
                const __m256i s8 = lowbit_avx2_fold8(sv);
                const __m256i m8 = lowbit_avx2_fold8(mv);
                const __m256 dav = _mm256_setr_ps(at[0][b].d, at[1][b].d, at[2][b].d, at[3][b].d, at[4][b].d,
                                                  at[5][b].d, at[6][b].d, at[7][b].d);
                acc = tern_lowbit_kacc8(acc, s8, m8, _mm256_set1_ps(d), _mm256_set1_ps(dmin), dav, q2);
            }
            float out[8];
            _mm256_storeu_ps(out, _mm256_mul_ps(acc, _mm256_set1_ps(post)));
            for (size_t i = 0; i < 8 && t0 + i < n_tok; i++) y[(t0 + i) * ldy + r] = out[i];
        }
    }
    return r1;
}

/* Decode of IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S without the unpacked block, eight
 * rows at a time (the AVX-512 kernel's method, 32 elements per register): per sub-block
 * the grid magnitudes by scalar table loads, its 32 sign bits spread to byte masks
 * (pshufb, and, cmpeq) and put on the activations with psignb, maddubs, and madd with
 * the two scales spread by one pshufb. The exact integer sum, folded and finished per
 * lane as the Q2_K path. */
struct lowbit_iq_rb2 {
    __m256i g[8];
    __m256i sg;  /* dword ib: the 32 sign bits of sub-block ib */
    __m256i scb; /* the 16 scales as bytes, in both lanes */
};

static inline __m256i lowbit_avx2_signs7x4(__m256i w) {
    const __m256i m7 = _mm256_set1_epi32(0x7F);
    __m256i x = _mm256_and_si256(w, m7);
    x = _mm256_or_si256(x, _mm256_and_si256(_mm256_slli_epi32(w, 1), _mm256_slli_epi32(m7, 8)));
    x = _mm256_or_si256(x, _mm256_and_si256(_mm256_slli_epi32(w, 2), _mm256_slli_epi32(m7, 16)));
    x = _mm256_or_si256(x, _mm256_and_si256(_mm256_slli_epi32(w, 3), _mm256_slli_epi32(m7, 24)));
    __m256i y = _mm256_xor_si256(x, _mm256_srli_epi32(x, 4));
    y = _mm256_xor_si256(y, _mm256_srli_epi32(y, 2));
    y = _mm256_xor_si256(y, _mm256_srli_epi32(y, 1));
    return _mm256_or_si256(x, _mm256_slli_epi32(_mm256_and_si256(y, _mm256_set1_epi8(1)), 7));
}

/* 16 scale bytes 2 ls + 1 from 16 ls bytes */
static inline __m256i lowbit_avx2_sc(__m128i ls) {
    return _mm256_broadcastsi128_si256(_mm_add_epi8(_mm_add_epi8(ls, ls), _mm_set1_epi8(1)));
}

/* the ls of 8 sub-blocks in the top nibble of eight dwords, each twice, as 16 bytes */
static inline __m128i lowbit_avx2_ls_top(__m256i w) {
    const __m256i v = _mm256_shuffle_epi8(_mm256_srli_epi32(w, 28),
                                          _mm256_setr_epi8(0, 0, 4, 4, 8, 8, 12, 12, -1, -1, -1, -1, -1, -1, -1, -1, 0,
                                                           0, 4, 4, 8, 8, 12, 12, -1, -1, -1, -1, -1, -1, -1, -1));
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(v, 0x08));
}

/* the nibbles of the low 8 bytes of b, low then high, as bytes (each twice if twice) */
static inline __m128i lowbit_avx2_ls_nib(__m128i b, bool twice) {
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128i n = _mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    return twice ? _mm_unpacklo_epi8(n, n) : n;
}

static inline __attribute__((always_inline)) void lowbit_iq_prep_avx2(enum tern_dtype t, const uint8_t *blk, struct lowbit_iq_rb2 *o) {
    switch (t) {
    case TERN_DTYPE_IQ2_XXS: {
        const uint8_t *q = blk + 2;
        const __m256i lo = _mm256_loadu_si256((const __m256i *)q), hi = _mm256_loadu_si256((const __m256i *)(q + 32));
        /* the odd dwords of the 64 bytes: the sign and scale words */
        const __m256i pick = _mm256_setr_epi32(1, 3, 5, 7, 0, 0, 0, 0);
        const __m256i w = _mm256_permute2x128_si256(_mm256_permutevar8x32_epi32(lo, pick),
                                                    _mm256_permutevar8x32_epi32(hi, pick), 0x20);
        o->sg = lowbit_avx2_signs7x4(w);
        o->scb = lowbit_avx2_sc(lowbit_avx2_ls_top(w));
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *i = q + 8 * ib;
            o->g[ib] = _mm256_setr_epi64x((long long)tern_iq2xxs_grid[i[0]], (long long)tern_iq2xxs_grid[i[1]],
                                          (long long)tern_iq2xxs_grid[i[2]], (long long)tern_iq2xxs_grid[i[3]]);
        }
        break;
    }
    case TERN_DTYPE_IQ3_XXS: {
        const uint8_t *q = blk + 2;
        const __m256i w = _mm256_loadu_si256((const __m256i *)(q + 64));
        o->sg = lowbit_avx2_signs7x4(w);
        o->scb = lowbit_avx2_sc(lowbit_avx2_ls_top(w));
        const uint32_t *G = tern_iq3xxs_grid;
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *i = q + 8 * ib;
            o->g[ib] = _mm256_setr_epi32((int)G[i[0]], (int)G[i[1]], (int)G[i[2]], (int)G[i[3]], (int)G[i[4]],
                                         (int)G[i[5]], (int)G[i[6]], (int)G[i[7]]);
        }
        break;
    }
    case TERN_DTYPE_IQ2_XS: {
        const uint8_t *q = blk + 2;
        const __m256i lo = _mm256_loadu_si256((const __m256i *)q), hi = _mm256_loadu_si256((const __m256i *)(q + 32));
        __m256i sb[2];
        for (int h = 0; h < 2; h++) {
            const __m256i s7 = _mm256_srli_epi16(h ? hi : lo, 9);
            __m256i y = _mm256_xor_si256(s7, _mm256_srli_epi16(s7, 4));
            y = _mm256_xor_si256(y, _mm256_srli_epi16(y, 2));
            y = _mm256_xor_si256(y, _mm256_srli_epi16(y, 1));
            sb[h] = _mm256_or_si256(s7, _mm256_slli_epi16(_mm256_and_si256(y, _mm256_set1_epi16(1)), 7));
        }
        /* words to bytes in order: packus works per lane, permute4x64 restores it */
        o->sg = _mm256_permute4x64_epi64(_mm256_packus_epi16(sb[0], sb[1]), 0xD8);
        o->scb = lowbit_avx2_sc(lowbit_avx2_ls_nib(_mm_loadl_epi64((const __m128i *)(q + 64)), false));
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ib++) {
            uint16_t v[4];
            memcpy(v, q + 8 * ib, 8);
            o->g[ib] =
                _mm256_setr_epi64x((long long)tern_iq2xs_grid[v[0] & 511u], (long long)tern_iq2xs_grid[v[1] & 511u],
                                   (long long)tern_iq2xs_grid[v[2] & 511u], (long long)tern_iq2xs_grid[v[3] & 511u]);
        }
        break;
    }
    case TERN_DTYPE_IQ2_S: {
        const struct tern_block_iq2_s *b = (const void *)blk;
        o->sg = _mm256_loadu_si256((const __m256i *)(b->qs + 32));
        o->scb = lowbit_avx2_sc(lowbit_avx2_ls_nib(_mm_loadl_epi64((const __m128i *)b->scales), false));
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *i = b->qs + 4 * ib;
            const unsigned h = b->qh[ib];
            o->g[ib] = _mm256_setr_epi64x((long long)tern_iq2s_grid[i[0] | ((h << 8) & 0x300)],
                                          (long long)tern_iq2s_grid[i[1] | ((h << 6) & 0x300)],
                                          (long long)tern_iq2s_grid[i[2] | ((h << 4) & 0x300)],
                                          (long long)tern_iq2s_grid[i[3] | ((h << 2) & 0x300)]);
        }
        break;
    }
    case TERN_DTYPE_IQ1_S:
    case TERN_DTYPE_IQ1_M: {
        /* levels q = 8 g + delta (g in -1, 0, 1) go in as u = q + 9 in 1 .. 18 (one pshufb
         * of g + 1 from 1, 9, 17, plus delta); 9 sum sc bsum comes off after. No signs. */
        const __m256i tab = _mm256_setr_epi8(1, 9, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 9, 17, 0, 0, 0, 0, 0,
                                             0, 0, 0, 0, 0, 0, 0, 0);
        const __m256i one = _mm256_set1_epi8(1);
        if (t == TERN_DTYPE_IQ1_S) {
            const struct tern_block_iq1_s *b = (const void *)blk;
            uint16_t qh[8];
            memcpy(qh, b->qh, 16);
            /* the 8 scales (bits 12..14 of each qh), each twice, as 16 bytes: by vector ops,
             * not bytes stored and read back (a store-forwarding stall per row and block) */
            const __m128i l7 = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)b->qh), 12),
                                             _mm_set1_epi16(7));
#pragma GCC unroll 8
            for (int ib = 0; ib < 8; ib++) {
                const unsigned h = qh[ib];
                const uint8_t *i = b->qs + 4 * ib;
                const __m256i g = _mm256_setr_epi64x((long long)tern_iq1s_grid[i[0] | ((h << 8) & 0x700)],
                                                     (long long)tern_iq1s_grid[i[1] | ((h << 5) & 0x700)],
                                                     (long long)tern_iq1s_grid[i[2] | ((h << 2) & 0x700)],
                                                     (long long)tern_iq1s_grid[i[3] | ((h >> 1) & 0x700)]);
                o->g[ib] = _mm256_add_epi8(_mm256_shuffle_epi8(tab, _mm256_add_epi8(g, one)),
                                           _mm256_set1_epi8((h & 0x8000) ? -1 : 1));
            }
            o->scb = lowbit_avx2_sc(_mm_or_si128(l7, _mm_slli_epi16(l7, 8)));
        } else {
            const struct tern_block_iq1_m *b = (const void *)blk;
            /* the 16 3-bit scales (bits 0..11 of each of the 4 scale words, 4 per word) as
             * 16 bytes, in registers (see IQ1_S) */
            uint64_t sc64;
            memcpy(&sc64, b->scales, 8);
            uint64_t lo = 0, hi = 0;
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const uint64_t wj = (sc64 >> (16 * j)) & 0xFFF;
                const uint64_t v = (wj & 7) | ((wj >> 3 & 7) << 8) | ((wj >> 6 & 7) << 16) | ((wj >> 9 & 7) << 24);
                if (j < 2)
                    lo |= v << (32 * j);
                else
                    hi |= v << (32 * (j - 2));
            }
#pragma GCC unroll 8
            for (int ib = 0; ib < 8; ib++) {
                const unsigned h0 = b->qh[2 * ib], h1 = b->qh[2 * ib + 1];
                const uint8_t *i = b->qs + 4 * ib;
                const __m256i g = _mm256_setr_epi64x((long long)tern_iq1s_grid[i[0] | ((h0 << 8) & 0x700)],
                                                     (long long)tern_iq1s_grid[i[1] | ((h0 << 4) & 0x700)],
                                                     (long long)tern_iq1s_grid[i[2] | ((h1 << 8) & 0x700)],
                                                     (long long)tern_iq1s_grid[i[3] | ((h1 << 4) & 0x700)]);
                const __m256i delta = _mm256_setr_epi64x(
                    (h0 & 0x08) ? -1 : 0x0101010101010101ll, (h0 & 0x80) ? -1 : 0x0101010101010101ll,
                    (h1 & 0x08) ? -1 : 0x0101010101010101ll, (h1 & 0x80) ? -1 : 0x0101010101010101ll);
                o->g[ib] = _mm256_add_epi8(_mm256_shuffle_epi8(tab, _mm256_add_epi8(g, one)), delta);
            }
            o->scb = lowbit_avx2_sc(_mm_set_epi64x((long long)hi, (long long)lo));
        }
        break;
    }
    default: { /* IQ3_S */
        const struct tern_block_iq3_s *b = (const void *)blk;
        o->sg = _mm256_loadu_si256((const __m256i *)b->signs);
        uint32_t sc4;
        memcpy(&sc4, b->scales, 4);
        o->scb = lowbit_avx2_sc(lowbit_avx2_ls_nib(_mm_cvtsi32_si128((int)sc4), true));
        const uint32_t *G = tern_iq3s_grid;
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *i = b->qs + 8 * ib;
            const unsigned h = b->qh[ib];
            o->g[ib] = _mm256_setr_epi32((int)G[i[0] | ((h << 8) & 256)], (int)G[i[1] | ((h << 7) & 256)],
                                         (int)G[i[2] | ((h << 6) & 256)], (int)G[i[3] | ((h << 5) & 256)],
                                         (int)G[i[4] | ((h << 4) & 256)], (int)G[i[5] | ((h << 3) & 256)],
                                         (int)G[i[6] | ((h << 2) & 256)], (int)G[i[7] | ((h << 1) & 256)]);
        }
        break;
    }
    }
}

/* One type's rows (t a constant after inlining: the prep's switch and IQ1's missing signs
 * resolved at compile time). */
static inline __attribute__((always_inline)) size_t lowbit_decode8_iq_avx2_t(enum tern_dtype t, const void *w,
                                                                             size_t wrb, size_t k, const void *act,
                                                                             float *y, size_t r0, size_t r1) {
    const size_t nb = k / TERN_QK_K;
    const bool iq1 = t == TERN_DTYPE_IQ1_S || t == TERN_DTYPE_IQ1_M;
    const size_t bb = t == TERN_DTYPE_IQ2_XXS   ? sizeof(struct tern_block_iq2_xxs)
                      : t == TERN_DTYPE_IQ2_XS  ? sizeof(struct tern_block_iq2_xs)
                      : t == TERN_DTYPE_IQ2_S   ? sizeof(struct tern_block_iq2_s)
                      : t == TERN_DTYPE_IQ3_XXS ? sizeof(struct tern_block_iq3_xxs)
                      : t == TERN_DTYPE_IQ3_S   ? sizeof(struct tern_block_iq3_s)
                      : t == TERN_DTYPE_IQ1_S   ? sizeof(struct tern_block_iq1_s)
                                                : sizeof(struct tern_block_iq1_m);
    const float post = tern_lowbit_post(t);
    const struct tern_block_q8_k *a = act;
    /* byte e of a sub-block's mask: the byte e / 8 of its sign dword, bit e % 8 */
    const __m256i rep = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                         3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i one = _mm256_set1_epi8(1);
    for (; r0 + 8 <= r1; r0 += 8) {
        const uint8_t *w0 = (const uint8_t *)w + r0 * wrb;
        __m256 acc = _mm256_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const struct tern_block_q8_k *ab = a + b;
            __m256i sv[8];
            for (int i = 0; i < 8; i++) {
                const uint8_t *blk = w0 + i * wrb + b * bb;
                TERN_LOWBIT_PREFETCH8(w, wrb, bb, nb, r0 + i, b, r1);
                struct lowbit_iq_rb2 rb;
                lowbit_iq_prep_avx2(t, blk, &rb);
                __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int ib = 0; ib < 8; ib++) {
                    __m256i x = _mm256_loadu_si256((const __m256i *)(ab->qs + 32 * ib));
                    if (!iq1) { /* IQ1 has no signs */
                        const __m256i sd = _mm256_permutevar8x32_epi32(rb.sg, _mm256_set1_epi32(ib));
                        const __m256i neg =
                            _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(sd, rep), bit), bit);
                        x = _mm256_sign_epi8(x, _mm256_or_si256(neg, one));
                    }
                    const __m256i sc =
                        _mm256_shuffle_epi8(rb.scb, _mm256_loadu_si256((const __m256i *)lowbit_avx2_spread[ib]));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(rb.g[ib], x), sc));
                }
                if (iq1) { /* u = q + 9: less 9 sum sc bsum */
                    const __m256i m = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(rb.scb)),
                                                        _mm256_loadu_si256((const __m256i *)ab->bsums));
                    s = _mm256_sub_epi32(s, _mm256_add_epi32(_mm256_slli_epi32(m, 3), m));
                }
                sv[i] = s;
            }
            const __m256i s8 = lowbit_avx2_fold8(sv);
            __m256 d;
            if (t == TERN_DTYPE_IQ1_M) { /* its d is spread over the scales' top nibbles */
                const uint8_t *sp = w0 + b * bb + offsetof(struct tern_block_iq1_m, scales);
                d = _mm256_cvtph_ps(
                    _mm_setr_epi16((short)lowbit_iq1_m_d(sp), (short)lowbit_iq1_m_d(sp + wrb),
                                   (short)lowbit_iq1_m_d(sp + 2 * wrb), (short)lowbit_iq1_m_d(sp + 3 * wrb),
                                   (short)lowbit_iq1_m_d(sp + 4 * wrb), (short)lowbit_iq1_m_d(sp + 5 * wrb),
                                   (short)lowbit_iq1_m_d(sp + 6 * wrb), (short)lowbit_iq1_m_d(sp + 7 * wrb)));
            } else {
                d = tern_lowbit_f16x8(w0 + b * bb, wrb); /* d leads these blocks */
            }
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(s8), _mm256_mul_ps(d, _mm256_set1_ps(ab->d))));
        }
        _mm256_storeu_ps(y + r0, _mm256_mul_ps(acc, _mm256_set1_ps(post)));
    }
    return r0;
}

size_t tern_lowbit_decode8_iq_avx2(enum tern_dtype t, const void *w, size_t wrb, size_t k, const void *act,
                                   size_t n_tok, float *y, size_t r0, size_t r1) {
    if (n_tok != 1) return r0;
    switch (t) {
#define IQ_CASE(T)                                                                                                     \
    case T: return lowbit_decode8_iq_avx2_t(T, w, wrb, k, act, y, r0, r1);
        IQ_CASE(TERN_DTYPE_IQ2_XXS)
        IQ_CASE(TERN_DTYPE_IQ2_XS)
        IQ_CASE(TERN_DTYPE_IQ2_S)
        IQ_CASE(TERN_DTYPE_IQ3_XXS)
        IQ_CASE(TERN_DTYPE_IQ3_S)
        IQ_CASE(TERN_DTYPE_IQ1_S)
        IQ_CASE(TERN_DTYPE_IQ1_M)
#undef IQ_CASE
    default: return r0;
    }
}

static size_t lowbit_pre_avx2(enum tern_dtype t, const void *w, size_t wrb, size_t k, const void *act,
                              size_t act_row_bytes, size_t n_tok, float *y, size_t ldy, size_t r0, size_t r1) {
    if (n_tok == 1) {
        r0 = lowbit_decode8_avx2(t, w, wrb, k, act, act_row_bytes, n_tok, y, ldy, r0, r1);
        return tern_lowbit_decode8_iq_avx2(t, w, wrb, k, act, n_tok, y, r0, r1);
    }
    return lowbit_prompt_avx2(t, w, wrb, k, act, act_row_bytes, n_tok, y, ldy, r0, r1);
}

LOWBIT_MATMUL_UNPACK(tern_lowbit_avx2, lowbit_isum_avx2, tern_lowbit_unpack_x86, tern_lowbit_msum_x86, lowbit_pre_avx2)
