/* AVX-512 kernels of the low-bit types (lowbit.h), used where the AVX2 table would be
 * (kernels.c; TERN_AVX512=0 turns them off): 64 levels per step, |q| times a with q's
 * sign by maddubs, the four sub-block scales spread by one permute and applied with
 * vpdpwssd, 16 int32 lanes summed at the end. The sum is exact, and the shared float
 * steps make the bits the AVX2 and portable kernels' (test-kernels checks it). */
#include "kernels/lowbit.h"

#include <immintrin.h>
#include <stdint.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c,avx2")

static inline int32_t lowbit_isum_avx512(const struct tern_lowbit_sb *u, const struct tern_block_q8_k *a) {
    /* word i (of 32: a pair of products) takes scale i / 8 of the four loaded */
    static const uint16_t spread_idx[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    const __m512i spread = _mm512_loadu_si512((const void *)spread_idx);
    __m512i acc = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++) {
        const __m512i q = _mm512_loadu_si512((const void *)(u->q + 64 * p));
        const __m512i x = _mm512_loadu_si512((const void *)(a->qs + 64 * p));
        const __mmask64 neg = _mm512_movepi8_mask(q);
        const __m512i xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
        const __m512i prod = _mm512_maddubs_epi16(_mm512_abs_epi8(q), xs);
        int64_t sc4;
        memcpy(&sc4, u->sc + 4 * p, 8);
        const __m512i sc = _mm512_permutexvar_epi16(spread, _mm512_set1_epi64(sc4));
        acc = _mm512_dpwssd_epi32(acc, prod, sc);
    }
    return _mm512_reduce_add_epi32(acc);
}

/* Decode (one token) of Q2_K and Q3_K without the unpacked block: eight rows at a time,
 * each row's block read once into one register, its levels shifted out two bits at a
 * time and multiplied with the activations where they lie. Half h, step j of a block
 * holds elements 128 h + 32 j + l (l < 32) in byte l of half h of the register, so the
 * activations are gathered to match once per block and shared by the eight rows; the
 * 16-bit products of step j take the scales of sub-blocks 2 j, 2 j + 1 (low half) and
 * 8 + 2 j, 9 + 2 j (high half). Q3_K's levels q in [-4, 3] go in as u = q + 4 >= 0 and
 * 4 * sum_j sc[j] bsum[j] comes off after: the same exact s. The eight rows' sums are
 * folded into one vector, and the float steps of lowbit_acc run on the eight rows in
 * lanes, each lane in the scalar order: the driver's bits (test-kernels compares). */
#define SP8(x) x, x, x, x, x, x, x, x
static const uint16_t lowbit_spread_j[4][32] = {
    {SP8(0), SP8(1), SP8(8), SP8(9)},
    {SP8(2), SP8(3), SP8(10), SP8(11)},
    {SP8(4), SP8(5), SP8(12), SP8(13)},
    {SP8(6), SP8(7), SP8(14), SP8(15)},
};
#undef SP8

/* Eight rows' [s parts | m parts] (8 + 8 int32 lanes each) to S (low 256: row i's s in
 * lane i) and M (high 256). */
static inline __m512i lowbit_fold8(const __m512i *rv) {
    __m512i u[2];
    for (int g = 0; g < 2; g++) {
        const __m512i *v = rv + 4 * g;
        const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
        const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
        u[g] = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
    }
    const __m512i x = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x88), _mm512_shuffle_i32x4(u[0], u[1], 0xDD));
    return _mm512_shuffle_i32x4(x, x, 0xD8);
}

static size_t lowbit_decode8_avx512(enum tern_dtype t, const void *w, size_t wrb, size_t k, const void *act,
                                    size_t n_tok, float *y, size_t r0, size_t r1) {
    const bool q2 = t == TERN_DTYPE_Q2_K;
    if (n_tok != 1 || (!q2 && t != TERN_DTYPE_Q3_K)) return r0;
    const size_t nb = k / TERN_QK_K;
    const size_t bb = q2 ? sizeof(struct tern_block_q2_k) : sizeof(struct tern_block_q3_k);
    const size_t doff = q2 ? offsetof(struct tern_block_q2_k, d) : offsetof(struct tern_block_q3_k, d);
    const float post = tern_lowbit_post(t);
    const struct tern_block_q8_k *a = act;
    __m512i idx[4], hsel[4];
    for (int j = 0; j < 4; j++) {
        idx[j] = _mm512_loadu_si512((const void *)lowbit_spread_j[j]);
        hsel[j] = _mm512_inserti64x4(_mm512_set1_epi8((char)(1u << j)), _mm256_set1_epi8((char)(1u << (4 + j))), 1);
    }
    const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    const __m256i m4w = _mm256_set1_epi16(0xF);
    for (; r0 + 8 <= r1; r0 += 8) {
        const uint8_t *w0 = (const uint8_t *)w + r0 * wrb;
        __m256 acc = _mm256_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const struct tern_block_q8_k *ab = a + b;
            __m512i x[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                x[j] =
                    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ab->qs + 32 * j))),
                                       _mm256_loadu_si256((const __m256i *)(ab->qs + 128 + 32 * j)), 1);
            const __m256i bs = _mm256_loadu_si256((const __m256i *)ab->bsums);
            __m512i rv[8];
            for (int i = 0; i < 8; i++) {
                const uint8_t *blk = w0 + i * wrb + b * bb;
                TERN_LOWBIT_PREFETCH8(w, wrb, bb, nb, r0 + i, b, r1);
                __m512i s = _mm512_setzero_si512();
                __m256i sc, m;
                if (q2) {
                    const __m256i sm = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)blk));
                    sc = _mm256_and_si256(sm, m4w);
                    m = _mm256_madd_epi16(_mm256_srli_epi16(sm, 4), bs);
                    const __m512i qs = _mm512_loadu_si512((const void *)(blk + 16)), scz = _mm512_zextsi256_si512(sc);
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) {
                        const __m512i l = _mm512_and_si512(_mm512_srli_epi16(qs, 2 * j), three);
                        s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(l, x[j]),
                                                _mm512_permutexvar_epi16(idx[j], scz));
                    }
                } else {
                    sc = _mm256_cvtepi8_epi16(tern_lowbit_q3_k_scales8(blk + 96));
                    m = _mm256_madd_epi16(sc, bs);
                    const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)blk));
                    const __m512i qs = _mm512_loadu_si512((const void *)(blk + 32)), scz = _mm512_zextsi256_si512(sc);
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) {
                        __m512i l = _mm512_and_si512(_mm512_srli_epi16(qs, 2 * j), three);
                        l = _mm512_mask_add_epi8(l, _mm512_test_epi8_mask(hm, hsel[j]), l, four);
                        s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(l, x[j]),
                                                _mm512_permutexvar_epi16(idx[j], scz));
                    }
                }
                const __m256i f = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
                rv[i] = _mm512_inserti64x4(_mm512_castsi256_si512(f), m, 1);
            }
            const __m512i sm8 = lowbit_fold8(rv);
            const __m256i s8 = _mm512_castsi512_si256(sm8);
            const __m256i m8 = _mm512_extracti64x4_epi64(sm8, 1);
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
 * time. A row's block is unpacked in registers once per eight tokens: the four 64-level
 * steps of the decode path rearranged to the activations' own order (register p holds
 * elements 64 p .. 64 p + 63: half p / 2, steps 2 (p % 2) and 2 (p % 2) + 1), each 16-bit
 * product taking scale 4 p + w / 8, so each token costs per 64 levels one maddubs (with
 * its load) and one vpdpwssd. Levels are unsigned (Q3_K as q + 4, less 4 sum sc bsum).
 * The eight tokens' sums fold into one vector; a lane is a token, its float steps in the
 * scalar order. A token group past the last token repeats the last token and stores
 * only the real ones. */
#define SP8(x) x, x, x, x, x, x, x, x
static const uint16_t lowbit_spread_nat[4][32] = {
    {SP8(0), SP8(1), SP8(2), SP8(3)},
    {SP8(4), SP8(5), SP8(6), SP8(7)},
    {SP8(8), SP8(9), SP8(10), SP8(11)},
    {SP8(12), SP8(13), SP8(14), SP8(15)},
};
#undef SP8

static size_t lowbit_prompt_avx512(enum tern_dtype t, const void *w, size_t wrb, size_t k, const void *act,
                                   size_t act_row_bytes, size_t n_tok, float *y, size_t ldy, size_t r0, size_t r1) {
    const bool q2 = t == TERN_DTYPE_Q2_K;
    if (n_tok < 2 || (!q2 && t != TERN_DTYPE_Q3_K)) return r0;
    const size_t nb = k / TERN_QK_K;
    const size_t bb = q2 ? sizeof(struct tern_block_q2_k) : sizeof(struct tern_block_q3_k);
    const float post = tern_lowbit_post(t);
    __m512i idx[4], hsel[4];
    for (int j = 0; j < 4; j++) {
        idx[j] = _mm512_loadu_si512((const void *)lowbit_spread_nat[j]);
        hsel[j] = _mm512_inserti64x4(_mm512_set1_epi8((char)(1u << j)), _mm256_set1_epi8((char)(1u << (4 + j))), 1);
    }
    const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    /* tokens outer: the eight tokens' activations stay in the cache for all the rows */
    for (size_t t0 = 0; t0 < n_tok; t0 += 8) {
        const struct tern_block_q8_k *at[8];
        for (size_t i = 0; i < 8; i++)
            at[i] = (const void *)((const uint8_t *)act + (t0 + i < n_tok ? t0 + i : n_tok - 1) * act_row_bytes);
        for (size_t r = r0; r < r1; r++) {
            const uint8_t *wr = (const uint8_t *)w + r * wrb;
            __m256 acc = _mm256_setzero_ps();
            for (size_t b = 0; b < nb; b++) {
                const uint8_t *blk = wr + b * bb;
                __m512i lv[4], nat[4], scv[4];
                __m256i sc;
                float d, dmin = 0.0f;
                if (q2) {
                    const struct tern_block_q2_k *q = (const void *)blk;
                    const __m256i sm = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)q->scales));
                    sc = _mm256_srli_epi16(sm, 4); /* the mins, for the m part */
                    const __m512i qs = _mm512_loadu_si512((const void *)q->qs);
                    for (int j = 0; j < 4; j++) lv[j] = _mm512_and_si512(_mm512_srli_epi16(qs, 2 * j), three);
                    d = _cvtsh_ss(q->d);
                    dmin = _cvtsh_ss(q->dmin);
                } else {
                    const struct tern_block_q3_k *q = (const void *)blk;
                    sc = _mm256_cvtepi8_epi16(tern_lowbit_q3_k_scales8(q->scales));
                    const __m512i scz = _mm512_zextsi256_si512(sc);
                    const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)q->hmask));
                    const __m512i qs = _mm512_loadu_si512((const void *)q->qs);
                    for (int j = 0; j < 4; j++) {
                        lv[j] = _mm512_and_si512(_mm512_srli_epi16(qs, 2 * j), three);
                        lv[j] = _mm512_mask_add_epi8(lv[j], _mm512_test_epi8_mask(hm, hsel[j]), lv[j], four);
                        scv[j] = _mm512_permutexvar_epi16(idx[j], scz);
                    }
                    d = _cvtsh_ss(q->d);
                }
                nat[0] = _mm512_shuffle_i64x2(lv[0], lv[1], 0x44);
                nat[1] = _mm512_shuffle_i64x2(lv[2], lv[3], 0x44);
                nat[2] = _mm512_shuffle_i64x2(lv[0], lv[1], 0xEE);
                nat[3] = _mm512_shuffle_i64x2(lv[2], lv[3], 0xEE);
                __m512i rv[8];
                if (q2) {
                    /* Q2_K: the levels times their scale (at most 3 * 15) as bytes, one
                     * pshufb per register from a table 0, sc, 2 sc, 3 sc per lane (a lane
                     * is a sub-block), so one vpdpbusd per 64 levels and token */
                    const __m512i sb = _mm512_broadcast_i32x4(
                        _mm_and_si128(_mm_loadu_si128((const __m128i *)blk), _mm_set1_epi8(0xF)));
                    for (int p = 0; p < 4; p++) {
                        const int c0 = 0x01010101 * (4 * p), c1 = c0 + 0x01010101, c2 = c1 + 0x01010101,
                                  c3 = c2 + 0x01010101;
                        const __m512i sp = _mm512_shuffle_epi8(
                            sb, _mm512_set_epi32(c3, c3, c3, c3, c2, c2, c2, c2, c1, c1, c1, c1, c0, c0, c0, c0));
                        const __m512i tab = _mm512_add_epi8(
                            _mm512_and_si512(sp, _mm512_set1_epi32(0xFF00FF00)),
                            _mm512_and_si512(_mm512_add_epi8(sp, sp), _mm512_set1_epi32((int)0xFFFF0000)));
                        nat[p] = _mm512_shuffle_epi8(tab, nat[p]);
                    }
                    for (int i = 0; i < 8; i++) {
                        const struct tern_block_q8_k *a = at[i] + b;
                        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
                        s0 = _mm512_dpbusd_epi32(s0, nat[0], _mm512_loadu_si512((const void *)a->qs));
                        s1 = _mm512_dpbusd_epi32(s1, nat[1], _mm512_loadu_si512((const void *)(a->qs + 64)));
                        s0 = _mm512_dpbusd_epi32(s0, nat[2], _mm512_loadu_si512((const void *)(a->qs + 128)));
                        s1 = _mm512_dpbusd_epi32(s1, nat[3], _mm512_loadu_si512((const void *)(a->qs + 192)));
                        const __m512i s = _mm512_add_epi32(s0, s1);
                        const __m256i m = _mm256_madd_epi16(sc, _mm256_loadu_si256((const __m256i *)a->bsums));
                        const __m256i f = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
                        rv[i] = _mm512_inserti64x4(_mm512_castsi256_si512(f), m, 1);
                    }
                } else {
                    for (int i = 0; i < 8; i++) {
                        const struct tern_block_q8_k *a = at[i] + b;
                        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
#pragma GCC unroll 2
                        for (int p = 0; p < 4; p += 2) {
                            s0 = _mm512_dpwssd_epi32(
                                s0, _mm512_maddubs_epi16(nat[p], _mm512_loadu_si512((const void *)(a->qs + 64 * p))),
                                scv[p]);
                            s1 = _mm512_dpwssd_epi32(
                                s1,
                                _mm512_maddubs_epi16(nat[p + 1],
                                                     _mm512_loadu_si512((const void *)(a->qs + 64 * (p + 1)))),
                                scv[p + 1]);
                        }
                        const __m512i s = _mm512_add_epi32(s0, s1);
                        const __m256i m = _mm256_madd_epi16(sc, _mm256_loadu_si256((const __m256i *)a->bsums));
                        const __m256i f = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
                        rv[i] = _mm512_inserti64x4(_mm512_castsi256_si512(f), m, 1);
                    }
                }
                const __m512i sm8 = lowbit_fold8(rv);
                const __m256i s8 = _mm512_castsi512_si256(sm8);
                const __m256i m8 = _mm512_extracti64x4_epi64(sm8, 1);
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

/* Decode of the I-quants IQ2_XXS, IQ2_XS and IQ2_S without the unpacked block, eight rows
 * at a time (IQ3_XXS and IQ3_S take the AVX2 kernel's, faster here): per row's block the
 * magnitudes (unsigned grid bytes, 64 elements per register in the activations' order)
 * are gathered from the grid tables by scalar loads, the signs become one 64-bit mask per
 * register (the sign bytes of eight groups of eight are that mask: bit e is element e's
 * sign), and the scales one int16 per product pair. The activations, loaded once per
 * block for the eight rows, take the signs (a masked negate), then maddubs with the
 * magnitudes and vpdpwssd with the scales: the driver's exact integer sum, folded and
 * finished in lanes as the Q2_K path is. */
struct lowbit_iq_rb {
    __m512i g[4];
    __mmask64 k[4];
    __m256i sc16; /* the 16 scales, one per 16 elements */
};

static inline __m512i lowbit_g8(const uint64_t *grid, unsigned i0, unsigned i1, unsigned i2, unsigned i3, unsigned i4,
                                unsigned i5, unsigned i6, unsigned i7) {
    return _mm512_set_epi64((long long)grid[i7], (long long)grid[i6], (long long)grid[i5], (long long)grid[i4],
                            (long long)grid[i3], (long long)grid[i2], (long long)grid[i1], (long long)grid[i0]);
}

/* Eight uint32 of 4 x 7 sign bits (the IQ2_XXS words) to their four sign bytes
 * each: seven bits and the parity bit (tern_iq_signs7), in lanes. */
static inline __m256i lowbit_signs7x4(__m256i w) {
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

/* The 2 ls + 1 scales of eight sub-blocks (8 nibbles, or 16 for two per sub-block) */
static inline __m256i lowbit_sc_pairs(__m256i ls32) { /* one ls per sub-block, in dwords */
    const __m256i s = _mm256_add_epi32(_mm256_slli_epi32(ls32, 1), _mm256_set1_epi32(1));
    return _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
}
static inline __m256i lowbit_sc_nibbles(const uint8_t *p) { /* two per sub-block: lo, hi */
    const __m128i b = _mm_loadl_epi64((const __m128i *)p), m4 = _mm_set1_epi8(0xF);
    const __m128i n = _mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    return _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(n), 1), _mm256_set1_epi16(1));
}

static inline void lowbit_iq_prep(enum tern_dtype t, const uint8_t *blk, struct lowbit_iq_rb *o) {
    switch (t) {
    case TERN_DTYPE_IQ2_XXS: {
        const uint8_t *q = blk + 2;
        const __m256i w = _mm512_castsi512_si256(_mm512_permutexvar_epi32(
            _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0), _mm512_loadu_si512((const void *)q)));
        const __m256i sg = lowbit_signs7x4(w);
        o->sc16 = lowbit_sc_pairs(_mm256_srli_epi32(w, 28));
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const uint8_t *i = q + 16 * p;
            o->g[p] = lowbit_g8(tern_iq2xxs_grid, i[0], i[1], i[2], i[3], i[8], i[9], i[10], i[11]);
        }
        o->k[0] = _cvtu64_mask64((uint64_t)_mm256_extract_epi64(sg, 0));
        o->k[1] = _cvtu64_mask64((uint64_t)_mm256_extract_epi64(sg, 1));
        o->k[2] = _cvtu64_mask64((uint64_t)_mm256_extract_epi64(sg, 2));
        o->k[3] = _cvtu64_mask64((uint64_t)_mm256_extract_epi64(sg, 3));
        break;
    }
    case TERN_DTYPE_IQ2_XS: {
        const uint8_t *q = blk + 2;
        const __m512i w = _mm512_loadu_si512((const void *)q);
        const __m512i s7 = _mm512_srli_epi16(w, 9);
        __m512i y = _mm512_xor_si512(s7, _mm512_srli_epi16(s7, 4));
        y = _mm512_xor_si512(y, _mm512_srli_epi16(y, 2));
        y = _mm512_xor_si512(y, _mm512_srli_epi16(y, 1));
        const __m256i sg =
            _mm512_cvtepi16_epi8(_mm512_or_si512(s7, _mm512_slli_epi16(_mm512_and_si512(y, _mm512_set1_epi16(1)), 7)));
        o->sc16 = lowbit_sc_nibbles(q + 64);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            uint16_t v[8];
            memcpy(v, q + 16 * p, 16);
            o->g[p] = lowbit_g8(tern_iq2xs_grid, v[0] & 511u, v[1] & 511u, v[2] & 511u, v[3] & 511u, v[4] & 511u,
                                v[5] & 511u, v[6] & 511u, v[7] & 511u);
        }
        o->k[0] = _cvtu64_mask64((uint64_t)_mm256_extract_epi64(sg, 0));
        o->k[1] = _cvtu64_mask64((uint64_t)_mm256_extract_epi64(sg, 1));
        o->k[2] = _cvtu64_mask64((uint64_t)_mm256_extract_epi64(sg, 2));
        o->k[3] = _cvtu64_mask64((uint64_t)_mm256_extract_epi64(sg, 3));
        break;
    }
    default: { /* IQ2_S */ const struct tern_block_iq2_s *b = (const void *)blk; o->sc16 = lowbit_sc_nibbles(b->scales);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const uint8_t *i = b->qs + 8 * p;
            const unsigned h0 = b->qh[2 * p], h1 = b->qh[2 * p + 1];
            o->g[p] = lowbit_g8(tern_iq2s_grid, i[0] | ((h0 << 8) & 0x300), i[1] | ((h0 << 6) & 0x300),
                                i[2] | ((h0 << 4) & 0x300), i[3] | ((h0 << 2) & 0x300), i[4] | ((h1 << 8) & 0x300),
                                i[5] | ((h1 << 6) & 0x300), i[6] | ((h1 << 4) & 0x300), i[7] | ((h1 << 2) & 0x300));
            uint64_t m;
            memcpy(&m, b->qs + 32 + 8 * p, 8);
            o->k[p] = _cvtu64_mask64(m);
        }
        break;
    }
    }
}

static size_t lowbit_decode8_iq_avx512(enum tern_dtype t, const void *w, size_t wrb, size_t k, const void *act,
                                       size_t n_tok, float *y, size_t r0, size_t r1) {
    if (n_tok != 1 || !(t == TERN_DTYPE_IQ2_XXS || t == TERN_DTYPE_IQ2_XS || t == TERN_DTYPE_IQ2_S)) return r0;
    const size_t nb = k / TERN_QK_K;
    const size_t bb = t == TERN_DTYPE_IQ2_XXS  ? sizeof(struct tern_block_iq2_xxs)
                      : t == TERN_DTYPE_IQ2_XS ? sizeof(struct tern_block_iq2_xs)
                                               : sizeof(struct tern_block_iq2_s);
    const float post = tern_lowbit_post(t);
    const struct tern_block_q8_k *a = act;
    __m512i idx[4];
    for (int p = 0; p < 4; p++) idx[p] = _mm512_loadu_si512((const void *)lowbit_spread_nat[p]);
    for (; r0 + 8 <= r1; r0 += 8) {
        const uint8_t *w0 = (const uint8_t *)w + r0 * wrb;
        __m256 acc = _mm256_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const struct tern_block_q8_k *ab = a + b;
            __m512i x[4];
            for (int p = 0; p < 4; p++) x[p] = _mm512_loadu_si512((const void *)(ab->qs + 64 * p));
            __m512i rv[8];
            for (int i = 0; i < 8; i++) {
                const uint8_t *blk = w0 + i * wrb + b * bb;
                TERN_LOWBIT_PREFETCH8(w, wrb, bb, nb, r0 + i, b, r1);
                struct lowbit_iq_rb rb;
                lowbit_iq_prep(t, blk, &rb);
                const __m512i scz = _mm512_zextsi256_si512(rb.sc16);
                __m512i s = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++) {
                    const __m512i xs = _mm512_mask_sub_epi8(x[p], rb.k[p], _mm512_setzero_si512(), x[p]);
                    s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(rb.g[p], xs),
                                            _mm512_permutexvar_epi16(idx[p], scz));
                }
                const __m256i f = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
                rv[i] = _mm512_castsi256_si512(f);
            }
            const __m256i s8 = _mm512_castsi512_si256(lowbit_fold8(rv));
            const __m256 d = tern_lowbit_f16x8(w0 + b * bb, wrb); /* d leads these blocks */
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(s8), _mm256_mul_ps(d, _mm256_set1_ps(ab->d))));
        }
        _mm256_storeu_ps(y + r0, _mm256_mul_ps(acc, _mm256_set1_ps(post)));
    }
    return r0;
}

static size_t lowbit_pre_avx512(enum tern_dtype t, const void *w, size_t wrb, size_t k, const void *act,
                                size_t act_row_bytes, size_t n_tok, float *y, size_t ldy, size_t r0, size_t r1) {
    if (n_tok == 1) {
        r0 = lowbit_decode8_avx512(t, w, wrb, k, act, n_tok, y, r0, r1);
        /* the IQ3 grids (4-byte entries) assemble faster in 256-bit registers here; IQ1 has
         * only that kernel */
        if (t == TERN_DTYPE_IQ3_XXS || t == TERN_DTYPE_IQ3_S || t == TERN_DTYPE_IQ1_S || t == TERN_DTYPE_IQ1_M)
            return tern_lowbit_decode8_iq_avx2(t, w, wrb, k, act, n_tok, y, r0, r1);
        return lowbit_decode8_iq_avx512(t, w, wrb, k, act, n_tok, y, r0, r1);
    }
    return lowbit_prompt_avx512(t, w, wrb, k, act, act_row_bytes, n_tok, y, ldy, r0, r1);
}

LOWBIT_MATMUL_UNPACK(tern_lowbit_avx512, lowbit_isum_avx512, tern_lowbit_unpack_x86, tern_lowbit_msum_x86,
                     lowbit_pre_avx512)

#pragma GCC pop_options
