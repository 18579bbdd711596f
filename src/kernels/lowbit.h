/* Internal to the kernels module: the one arithmetic of the nine low-bit weight types
 * (Q2_K, Q3_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) times Q8_K
 * activations, shared by the portable and the SIMD kernels so that every ISA gives the
 * same bits.
 *
 * A super-block of 256 weights is first unpacked (scalar code, here) into 256 signed
 * integer levels and 16 integer scales, one per 16 elements, such that
 *     weight[i] = d * post * sc[i / 16] * q[i]   (Q2_K: minus dmin * m[i / 16])
 * holds exactly, post being a power of two of the type (IQ2: 1/8, IQ3_XXS: 1/4, IQ1:
 * 1/8, where the IQ1 shift of +-1/8 is folded in as q = 8 grid +- 1). The integer sum
 *     s = sum_j sc[j] * sum_{i in sub-block j} q[i] a[i]
 * is exact (int32: |s| < 2^26 for every type), so how a kernel forms it (scalar, AVX2,
 * AVX-512) does not matter. What follows is fixed, the same C in every kernel
 * (lowbit_acc): per super-block in order, acc = acc + float(s) * (d * da), Q2_K then
 * acc = acc - float(sum_j m[j] bsum[j]) * (dmin * da); at the end acc * post. */
#ifndef TERN_KERNELS_LOWBIT_H
#define TERN_KERNELS_LOWBIT_H

#include "kernels/quant.h"
#include "util/dtype.h"

#include <stdbool.h>
#include <string.h>

struct tern_lowbit_sb {
    int8_t q[TERN_QK_K];
    int16_t sc[TERN_QK_K / 16];
    int16_t m[TERN_QK_K / 16]; /* Q2_K only */
    float d, dmin;
};

static inline bool tern_lowbit_type(enum tern_dtype t) {
    switch (t) {
    case TERN_DTYPE_Q2_K: case TERN_DTYPE_Q3_K: case TERN_DTYPE_IQ2_XXS: case TERN_DTYPE_IQ2_XS:
    case TERN_DTYPE_IQ2_S: case TERN_DTYPE_IQ3_XXS: case TERN_DTYPE_IQ3_S: case TERN_DTYPE_IQ1_S:
    case TERN_DTYPE_IQ1_M: return true;
    default: return false;
    }
}

static inline float tern_lowbit_post(enum tern_dtype t) {
    switch (t) {
    case TERN_DTYPE_IQ2_XXS: case TERN_DTYPE_IQ2_XS: case TERN_DTYPE_IQ2_S:
    case TERN_DTYPE_IQ1_S: case TERN_DTYPE_IQ1_M: return 0.125f;
    case TERN_DTYPE_IQ3_XXS: return 0.25f;
    default: return 1.0f;
    }
}

static inline uint16_t lowbit_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t lowbit_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* 8 magnitudes (bytes of g, each in 1..127) with the signs of byte s (bit j: element j
 * negative) as int8: two's complement per byte without carries between bytes (no byte of
 * g is 0, so none of ~g is 0xFF). */
static inline void lowbit_signed8(int8_t *out, uint64_t g, uint8_t s) {
    const uint64_t m = tern_iq_signmask[s];
    const uint64_t v = (g ^ m) + (m & 0x0101010101010101ull);
    memcpy(out, &v, 8);
}

static inline void lowbit_unpack_q2_k(const struct tern_block_q2_k *b, struct tern_lowbit_sb *u) {
    u->d = tern_fp16_to_f32(b->d);
    u->dmin = tern_fp16_to_f32(b->dmin);
    for (int j = 0; j < 16; j++) {
        u->sc[j] = b->scales[j] & 0xF;
        u->m[j] = b->scales[j] >> 4;
    }
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) u->q[128 * h + 32 * j + l] = (int8_t)((b->qs[32 * h + l] >> (2 * j)) & 3);
}

/* The 16 6-bit scales of Q3_K (s - 32, in [-32, 31]). */
static inline void lowbit_q3_k_scales(const uint8_t *s, int16_t *sc) {
    for (int j = 0; j < 16; j++) {
        const int lo = (s[j % 8] >> (4 * (j / 8))) & 0xF;
        const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (int16_t)((lo | (hi << 4)) - 32);
    }
}

static inline void lowbit_unpack_q3_k(const struct tern_block_q3_k *b, struct tern_lowbit_sb *u) {
    u->d = tern_fp16_to_f32(b->d);
    u->dmin = 0;
    lowbit_q3_k_scales(b->scales, u->sc);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++) {
            const uint8_t m = (uint8_t)(1u << (4 * h + j));
            for (int l = 0; l < 32; l++)
                u->q[128 * h + 32 * j + l] =
                    (int8_t)(((b->qs[32 * h + l] >> (2 * j)) & 3) - ((b->hmask[l] & m) ? 0 : 4));
        }
}

static inline void lowbit_unpack_iq2_xxs(const struct tern_block_iq2_xxs *b, struct tern_lowbit_sb *u) {
    const uint8_t *p = (const uint8_t *)b->qs;
    u->d = tern_fp16_to_f32(b->d);
    u->dmin = 0;
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t s = lowbit_u32(p + 8 * ib + 4);
        u->sc[2 * ib] = u->sc[2 * ib + 1] = (int16_t)(2 * (s >> 28) + 1);
        for (int l = 0; l < 4; l++)
            lowbit_signed8(u->q + 32 * ib + 8 * l, tern_iq2xxs_grid[p[8 * ib + l]], tern_iq_signs7((s >> (7 * l)) & 127));
    }
}

static inline void lowbit_unpack_iq2_xs(const struct tern_block_iq2_xs *b, struct tern_lowbit_sb *u) {
    const uint8_t *p = (const uint8_t *)b->qs;
    u->d = tern_fp16_to_f32(b->d);
    u->dmin = 0;
    for (int ib = 0; ib < 8; ib++) {
        u->sc[2 * ib] = (int16_t)(2 * (b->scales[ib] & 0xF) + 1);
        u->sc[2 * ib + 1] = (int16_t)(2 * (b->scales[ib] >> 4) + 1);
        for (int l = 0; l < 4; l++) {
            const uint16_t v = lowbit_u16(p + 2 * (4 * ib + l));
            lowbit_signed8(u->q + 32 * ib + 8 * l, tern_iq2xs_grid[v & 511], tern_iq_signs7(v >> 9));
        }
    }
}

static inline void lowbit_unpack_iq2_s(const struct tern_block_iq2_s *b, struct tern_lowbit_sb *u) {
    u->d = tern_fp16_to_f32(b->d);
    u->dmin = 0;
    for (int ib = 0; ib < 8; ib++) {
        u->sc[2 * ib] = (int16_t)(2 * (b->scales[ib] & 0xF) + 1);
        u->sc[2 * ib + 1] = (int16_t)(2 * (b->scales[ib] >> 4) + 1);
        for (int l = 0; l < 4; l++) {
            const unsigned idx = b->qs[4 * ib + l] | ((b->qh[ib] << (8 - 2 * l)) & 0x300);
            lowbit_signed8(u->q + 32 * ib + 8 * l, tern_iq2s_grid[idx], b->qs[32 + 4 * ib + l]);
        }
    }
}

static inline void lowbit_unpack_iq3_xxs(const struct tern_block_iq3_xxs *b, struct tern_lowbit_sb *u) {
    u->d = tern_fp16_to_f32(b->d);
    u->dmin = 0;
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t s = lowbit_u32(b->qs + 64 + 4 * ib);
        u->sc[2 * ib] = u->sc[2 * ib + 1] = (int16_t)(2 * (s >> 28) + 1);
        for (int l = 0; l < 4; l++) {
            const uint64_t g = (uint64_t)tern_iq3xxs_grid[b->qs[8 * ib + 2 * l]] |
                               ((uint64_t)tern_iq3xxs_grid[b->qs[8 * ib + 2 * l + 1]] << 32);
            lowbit_signed8(u->q + 32 * ib + 8 * l, g, tern_iq_signs7((s >> (7 * l)) & 127));
        }
    }
}

static inline void lowbit_unpack_iq3_s(const struct tern_block_iq3_s *b, struct tern_lowbit_sb *u) {
    u->d = tern_fp16_to_f32(b->d);
    u->dmin = 0;
    for (int ib = 0; ib < 8; ib++) {
        const int ls = (b->scales[ib / 2] >> (4 * (ib % 2))) & 0xF;
        u->sc[2 * ib] = u->sc[2 * ib + 1] = (int16_t)(1 + 2 * ls);
        const unsigned qh = b->qh[ib];
        for (int l = 0; l < 4; l++) {
            const unsigned i1 = b->qs[8 * ib + 2 * l] | ((qh << (8 - 2 * l)) & 256);
            const unsigned i2 = b->qs[8 * ib + 2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
            const uint64_t g = (uint64_t)tern_iq3s_grid[i1] | ((uint64_t)tern_iq3s_grid[i2] << 32);
            lowbit_signed8(u->q + 32 * ib + 8 * l, g, b->signs[4 * ib + l]);
        }
    }
}

/* 8 grid values (-1, 0, +1 bytes) as 8 g + delta, delta = +-1 (no byte overflows). */
static inline void lowbit_iq1_8(int8_t *out, uint64_t g, int delta) {
    int8_t v[8];
    memcpy(v, &g, 8);
    for (int j = 0; j < 8; j++) out[j] = (int8_t)(8 * v[j] + delta);
}

static inline void lowbit_unpack_iq1_s(const struct tern_block_iq1_s *b, struct tern_lowbit_sb *u) {
    const uint8_t *qh8 = (const uint8_t *)b->qh;
    u->d = tern_fp16_to_f32(b->d);
    u->dmin = 0;
    for (int ib = 0; ib < 8; ib++) {
        const unsigned qh = lowbit_u16(qh8 + 2 * ib);
        u->sc[2 * ib] = u->sc[2 * ib + 1] = (int16_t)(2 * ((qh >> 12) & 7) + 1);
        const int delta = (qh & 0x8000) ? -1 : 1;
        for (int l = 0; l < 4; l++)
            lowbit_iq1_8(u->q + 32 * ib + 8 * l, tern_iq1s_grid[b->qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)], delta);
    }
}

/* The half d of an IQ1_M block, spread over the top nibbles of its four scale words. */
static inline tern_fp16 lowbit_iq1_m_d(const uint8_t *scales) {
    const unsigned s0 = lowbit_u16(scales), s1 = lowbit_u16(scales + 2), s2 = lowbit_u16(scales + 4),
                   s3 = lowbit_u16(scales + 6);
    return (tern_fp16)((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000));
}

static inline void lowbit_unpack_iq1_m(const struct tern_block_iq1_m *b, struct tern_lowbit_sb *u) {
    u->d = tern_fp16_to_f32(lowbit_iq1_m_d(b->scales));
    u->dmin = 0;
    for (int ib = 0; ib < 8; ib++) {
        const unsigned sw = lowbit_u16(b->scales + 2 * (ib / 2));
        u->sc[2 * ib] = (int16_t)(2 * ((sw >> (6 * (ib % 2))) & 7) + 1);
        u->sc[2 * ib + 1] = (int16_t)(2 * ((sw >> (6 * (ib % 2) + 3)) & 7) + 1);
        const unsigned h0 = b->qh[2 * ib], h1 = b->qh[2 * ib + 1];
        const unsigned idx[4] = {b->qs[4 * ib] | ((h0 << 8) & 0x700), b->qs[4 * ib + 1] | ((h0 << 4) & 0x700),
                                 b->qs[4 * ib + 2] | ((h1 << 8) & 0x700), b->qs[4 * ib + 3] | ((h1 << 4) & 0x700)};
        const int delta[4] = {(h0 & 0x08) ? -1 : 1, (h0 & 0x80) ? -1 : 1, (h1 & 0x08) ? -1 : 1, (h1 & 0x80) ? -1 : 1};
        for (int l = 0; l < 4; l++) lowbit_iq1_8(u->q + 32 * ib + 8 * l, tern_iq1s_grid[idx[l]], delta[l]);
    }
}

/* Block b of a row of type t. */
static inline void tern_lowbit_unpack(enum tern_dtype t, const void *row, size_t b, struct tern_lowbit_sb *u) {
    const uint8_t *p = row;
    switch (t) {
    case TERN_DTYPE_Q2_K: lowbit_unpack_q2_k((const void *)(p + b * sizeof(struct tern_block_q2_k)), u); break;
    case TERN_DTYPE_Q3_K: lowbit_unpack_q3_k((const void *)(p + b * sizeof(struct tern_block_q3_k)), u); break;
    case TERN_DTYPE_IQ2_XXS: lowbit_unpack_iq2_xxs((const void *)(p + b * sizeof(struct tern_block_iq2_xxs)), u); break;
    case TERN_DTYPE_IQ2_XS: lowbit_unpack_iq2_xs((const void *)(p + b * sizeof(struct tern_block_iq2_xs)), u); break;
    case TERN_DTYPE_IQ2_S: lowbit_unpack_iq2_s((const void *)(p + b * sizeof(struct tern_block_iq2_s)), u); break;
    case TERN_DTYPE_IQ3_XXS: lowbit_unpack_iq3_xxs((const void *)(p + b * sizeof(struct tern_block_iq3_xxs)), u); break;
    case TERN_DTYPE_IQ3_S: lowbit_unpack_iq3_s((const void *)(p + b * sizeof(struct tern_block_iq3_s)), u); break;
    case TERN_DTYPE_IQ1_S: lowbit_unpack_iq1_s((const void *)(p + b * sizeof(struct tern_block_iq1_s)), u); break;
    case TERN_DTYPE_IQ1_M: lowbit_unpack_iq1_m((const void *)(p + b * sizeof(struct tern_block_iq1_m)), u); break;
    default: memset(u, 0, sizeof *u); break;
    }
}

#if defined(__GNUC__)
#define LOWBIT_PREFETCH(p) __builtin_prefetch((p), 0, 3)
#else
#define LOWBIT_PREFETCH(p) ((void)(p))
#endif

#if defined(__AVX2__)
#include <immintrin.h>
/* Q2_K and Q3_K unpacked 32 levels at a time with vector shifts and masks (the same
 * levels as lowbit_unpack_q2_k / _q3_k: test-kernels compares the kernels' bits); the
 * other types through tern_lowbit_unpack. For the files that build with AVX2. */
static inline void tern_lowbit_unpack_x86(enum tern_dtype t, const void *row, size_t b, struct tern_lowbit_sb *u) {
    const uint8_t *p = row;
    const __m256i three = _mm256_set1_epi8(3);
    if (t == TERN_DTYPE_Q2_K) {
        const struct tern_block_q2_k *blk = (const void *)(p + b * sizeof(struct tern_block_q2_k));
        u->d = tern_fp16_to_f32(blk->d);
        u->dmin = tern_fp16_to_f32(blk->dmin);
        const __m256i sm = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)blk->scales));
        _mm256_storeu_si256((__m256i *)u->sc, _mm256_and_si256(sm, _mm256_set1_epi16(0xF)));
        _mm256_storeu_si256((__m256i *)u->m, _mm256_srli_epi16(sm, 4));
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * h));
            for (int j = 0; j < 4; j++)
                _mm256_storeu_si256((__m256i *)(u->q + 128 * h + 32 * j),
                                    _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), three));
        }
        return;
    }
    if (t == TERN_DTYPE_Q3_K) {
        const struct tern_block_q3_k *blk = (const void *)(p + b * sizeof(struct tern_block_q3_k));
        u->d = tern_fp16_to_f32(blk->d);
        u->dmin = 0;
        lowbit_q3_k_scales(blk->scales, u->sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)blk->hmask), four = _mm256_set1_epi8(4);
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * h));
            for (int j = 0; j < 4; j++) {
                const __m256i bit = _mm256_set1_epi8((char)(1u << (4 * h + j)));
                const __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
                const __m256i lv = _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), three);
                _mm256_storeu_si256((__m256i *)(u->q + 128 * h + 32 * j),
                                    _mm256_sub_epi8(lv, _mm256_and_si256(clear, four)));
            }
        }
        return;
    }
    tern_lowbit_unpack(t, row, b, u);
}

/* The 16 scales s - 32 of a Q3_K block as int8 (lowbit_q3_k_scales, vectorized): low
 * nibbles of bytes 0-7 then their high nibbles; two bits of bytes 8-11 shifted by 0, 2,
 * 4, 6 for j / 4. Reads the 12 bytes only. */
static inline __m128i tern_lowbit_q3_k_scales8(const uint8_t *s) {
    const __m128i lo8 = _mm_loadl_epi64((const __m128i *)s), m4 = _mm_set1_epi8(0xF);
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(lo8, m4), _mm_and_si128(_mm_srli_epi16(lo8, 4), m4));
    uint32_t h32;
    memcpy(&h32, s + 8, 4);
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)h32), _mm_setr_epi32(0, 2, 4, 6)),
                                     _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

/* What the fused x86 kernels (x86/lowbit-avx2.c, x86/lowbit-avx512.c) share. */
#ifndef LOWBIT_PF
#define LOWBIT_PF 6 /* prefetch distance in blocks */
#endif
/* Prefetch for row `row` at block b of an eight-row group: LOWBIT_PF blocks on in this row,
 * or in the next group's row; two lines, as a block straddles up to three and blocks are
 * under two lines apart. Nothing at or past row r1. (A macro: as an inline function it
 * halved the Q2_K decode speed here, measured.) */
#define TERN_LOWBIT_PREFETCH8(w, wrb, bb, nb, row, b, r1)                                                         \
    do {                                                                                                           \
        const size_t pb_ = (b) + LOWBIT_PF;                                                                        \
        const size_t pf_ = pb_ < (nb) ? (row) * (wrb) + pb_ * (bb) : ((row) + 8) * (wrb) + (pb_ - (nb)) * (bb);   \
        if (pf_ + 64 < (r1) * (wrb)) {                                                                             \
            LOWBIT_PREFETCH((const uint8_t *)(w) + pf_);                                                           \
            LOWBIT_PREFETCH((const uint8_t *)(w) + pf_ + 64);                                                      \
        }                                                                                                          \
    } while (0)

/* Eight half floats at p, p + stride, ... (one per row of an eight-row group) as floats:
 * scalar loads (a gather costs several times more on the CPUs with the
 * gather-data-sampling microcode). */
static inline __m256 tern_lowbit_f16x8(const uint8_t *p, size_t stride) {
    uint16_t v[8];
    for (int i = 0; i < 8; i++) memcpy(&v[i], p + i * stride, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)v));
}

/* lowbit_acc for eight lanes of a Q2_K / Q3_K super-block: s8 the sums, m8 the min sums
 * (Q2_K) or sum sc bsum (Q3_K, whose levels went in as q + 4), d, dmin, da per lane. */
static inline __m256 tern_lowbit_kacc8(__m256 acc, __m256i s8, __m256i m8, __m256 d, __m256 dmin, __m256 da,
                                       bool q2) {
    if (!q2) s8 = _mm256_sub_epi32(s8, _mm256_slli_epi32(m8, 2));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(s8), _mm256_mul_ps(d, da)));
    if (q2) acc = _mm256_sub_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(m8), _mm256_mul_ps(dmin, da)));
    return acc;
}

/* lowbit_msum with one madd: 16 products of int16 in exact int32 pairs, then summed. */
static inline int32_t tern_lowbit_msum_x86(const struct tern_lowbit_sb *u, const struct tern_block_q8_k *a) {
    const __m256i p = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)u->m),
                                        _mm256_loadu_si256((const __m256i *)a->bsums));
    __m128i v = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4E));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xB1));
    return _mm_cvtsi128_si32(v);
}
#endif

/* The float steps after a super-block's exact integer sums s (and, Q2_K, msum). */
static inline float lowbit_acc(float acc, const struct tern_lowbit_sb *u, const struct tern_block_q8_k *a,
                               int32_t s, int32_t msum, bool has_min) {
    acc = acc + (float)s * (u->d * a->d);
    if (has_min) acc = acc - (float)msum * (u->dmin * a->d);
    return acc;
}

static inline int32_t lowbit_msum(const struct tern_lowbit_sb *u, const struct tern_block_q8_k *a) {
    int32_t m = 0;
    for (int j = 0; j < 16; j++) m += (int32_t)u->m[j] * a->bsums[j];
    return m;
}

/* The driver every ISA instantiates with its integer sum isum(u, a): rows [r0, r1) by all
 * tokens; a row's super-block is unpacked once per block of LOWBIT_TB tokens, whose
 * accumulators stay in acc[]. The order of the float steps per (row, token) is fixed. */
#define LOWBIT_TB 32
/* A kernel's own path for some calls, run first: it computes rows [r0, r') and returns
 * r' (r0 when it takes none). The portable kernels have none. */
static inline size_t lowbit_pre_none(enum tern_dtype t, const void *w, size_t w_row_bytes, size_t k,
                                     const void *act, size_t act_row_bytes, size_t n_tok, float *y, size_t ldy,
                                     size_t r0, size_t r1) {
    (void)t, (void)w, (void)w_row_bytes, (void)k, (void)act, (void)act_row_bytes, (void)n_tok, (void)y, (void)ldy,
        (void)r1;
    return r0;
}
#define LOWBIT_MATMUL(name, isum) LOWBIT_MATMUL_UNPACK(name, isum, tern_lowbit_unpack, lowbit_msum, lowbit_pre_none)
/* The same with the ISA's own unpack(t, row, b, u) and msum(u, a): they must give
 * tern_lowbit_unpack's levels and scales and lowbit_msum's sum exactly (the x86 kernels
 * unpack Q2_K and Q3_K with vector shifts and sum the mins with one madd); and its own
 * pre (lowbit_pre_none's arguments), whose rows must have the bits the driver's would. */
#define LOWBIT_MATMUL_UNPACK(name, isum, unpack, msum, pre)                                         \
    static void name##_drive(enum tern_dtype t, const void *w, size_t w_row_bytes, size_t k,        \
                             const void *act, size_t act_row_bytes, size_t n_tok, float *y,         \
                             size_t ldy, size_t r0, size_t r1) {                                    \
        const size_t nb = k / TERN_QK_K;                                                            \
        const bool has_min = t == TERN_DTYPE_Q2_K;                                                  \
        const float post = tern_lowbit_post(t);                                                     \
        struct tern_lowbit_sb u;                                                                    \
        float acc[LOWBIT_TB];                                                                       \
        tern_iq_grids_init();                                                                       \
        r0 = pre(t, w, w_row_bytes, k, act, act_row_bytes, n_tok, y, ldy, r0, r1);                  \
        if (n_tok == 1) { /* decode: four rows side by side, four independent chains */             \
            const struct tern_block_q8_k *a1 = act;                                                 \
            struct tern_lowbit_sb u4[4];                                                            \
            const size_t bb = w_row_bytes / nb; /* a block's bytes (rows are whole blocks) */     \
            for (; r0 + 4 <= r1; r0 += 4) {                                                         \
                float a4[4] = {0.0f, 0.0f, 0.0f, 0.0f};                                             \
                for (size_t b = 0; b < nb; b++)                                                     \
                    for (int j = 0; j < 4; j++) {                                                   \
                        /* the rows are contiguous: a few blocks on may be the next group's */    \
                        const size_t pf = (r0 + j) * w_row_bytes + (b + 4) * bb;                    \
                        if (pf < r1 * w_row_bytes) LOWBIT_PREFETCH((const uint8_t *)w + pf);        \
                        unpack(t, (const uint8_t *)w + (r0 + j) * w_row_bytes, b, &u4[j]);          \
                        const int32_t s = isum(&u4[j], a1 + b);                                     \
                        a4[j] = lowbit_acc(a4[j], &u4[j], a1 + b, s,                                \
                                           has_min ? msum(&u4[j], a1 + b) : 0, has_min);            \
                    }                                                                               \
                for (int j = 0; j < 4; j++) y[r0 + j] = a4[j] * post;                               \
            }                                                                                       \
        }                                                                                           \
        for (size_t r = r0; r < r1; r++) {                                                          \
            const uint8_t *wr = (const uint8_t *)w + r * w_row_bytes;                               \
            for (size_t t0 = 0; t0 < n_tok; t0 += LOWBIT_TB) {                                      \
                const size_t nt = n_tok - t0 < LOWBIT_TB ? n_tok - t0 : LOWBIT_TB;                  \
                for (size_t i = 0; i < nt; i++) acc[i] = 0.0f;                                      \
                for (size_t b = 0; b < nb; b++) {                                                   \
                    unpack(t, wr, b, &u);                                                           \
                    for (size_t i = 0; i < nt; i++) {                                               \
                        const struct tern_block_q8_k *a =                                           \
                            (const struct tern_block_q8_k *)((const uint8_t *)act +                 \
                                                             (t0 + i) * act_row_bytes) + b;         \
                        const int32_t s = isum(&u, a);                                              \
                        acc[i] = lowbit_acc(acc[i], &u, a, s, has_min ? msum(&u, a) : 0,            \
                                            has_min);                                               \
                    }                                                                               \
                }                                                                                   \
                for (size_t i = 0; i < nt; i++) y[(t0 + i) * ldy + r] = acc[i] * post;              \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
    LOWBIT_ENTRY(name, q2_k, TERN_DTYPE_Q2_K)                                                       \
    LOWBIT_ENTRY(name, q3_k, TERN_DTYPE_Q3_K)                                                       \
    LOWBIT_ENTRY(name, iq2_xxs, TERN_DTYPE_IQ2_XXS)                                                 \
    LOWBIT_ENTRY(name, iq2_xs, TERN_DTYPE_IQ2_XS)                                                   \
    LOWBIT_ENTRY(name, iq2_s, TERN_DTYPE_IQ2_S)                                                     \
    LOWBIT_ENTRY(name, iq3_xxs, TERN_DTYPE_IQ3_XXS)                                                 \
    LOWBIT_ENTRY(name, iq3_s, TERN_DTYPE_IQ3_S)                                                     \
    LOWBIT_ENTRY(name, iq1_s, TERN_DTYPE_IQ1_S)                                                     \
    LOWBIT_ENTRY(name, iq1_m, TERN_DTYPE_IQ1_M)

#define LOWBIT_ENTRY(name, sfx, type)                                                               \
    void name##_##sfx(const void *w, size_t w_row_bytes, size_t k, const void *act,                 \
                      size_t act_row_bytes, size_t n_tok, float *y, size_t ldy, size_t r0,          \
                      size_t r1) {                                                                  \
        name##_drive(type, w, w_row_bytes, k, act, act_row_bytes, n_tok, y, ldy, r0, r1);           \
    }

#define LOWBIT_DECLARE(name)                                                                        \
    void name##_q2_k(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t,   \
                     size_t, size_t);                                                               \
    void name##_q3_k(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t,   \
                     size_t, size_t);                                                               \
    void name##_iq2_xxs(const void *, size_t, size_t, const void *, size_t, size_t, float *,        \
                        size_t, size_t, size_t);                                                    \
    void name##_iq2_xs(const void *, size_t, size_t, const void *, size_t, size_t, float *,         \
                       size_t, size_t, size_t);                                                     \
    void name##_iq2_s(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t,  \
                      size_t, size_t);                                                              \
    void name##_iq3_xxs(const void *, size_t, size_t, const void *, size_t, size_t, float *,        \
                        size_t, size_t, size_t);                                                    \
    void name##_iq3_s(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t,  \
                      size_t, size_t);                                                              \
    void name##_iq1_s(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t,  \
                      size_t, size_t);                                                              \
    void name##_iq1_m(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t,  \
                      size_t, size_t);

#define LOWBIT_TABLE(name)                                                                          \
    [TERN_DTYPE_Q2_K] = name##_q2_k, [TERN_DTYPE_Q3_K] = name##_q3_k,                               \
    [TERN_DTYPE_IQ2_XXS] = name##_iq2_xxs, [TERN_DTYPE_IQ2_XS] = name##_iq2_xs,                     \
    [TERN_DTYPE_IQ2_S] = name##_iq2_s, [TERN_DTYPE_IQ3_XXS] = name##_iq3_xxs,                       \
    [TERN_DTYPE_IQ3_S] = name##_iq3_s, [TERN_DTYPE_IQ1_S] = name##_iq1_s,                           \
    [TERN_DTYPE_IQ1_M] = name##_iq1_m

/* Portable (ref/matmul-ref.c), AVX2 (x86/lowbit-avx2.c), AVX-512 (x86/lowbit-avx512.c). */
LOWBIT_DECLARE(tern_lowbit_ref)
LOWBIT_DECLARE(tern_lowbit_avx2)
LOWBIT_DECLARE(tern_lowbit_avx512)

/* The AVX2 kernel's I-quant decode of eight rows at a time (x86/lowbit-avx2.c), which the
 * AVX-512 kernel uses for IQ3_XXS and IQ3_S, where it was faster on the Intel guest it
 * was measured on; it returns the first row it did not compute, as a pre hook does. */
size_t tern_lowbit_decode8_iq_avx2(enum tern_dtype t, const void *w, size_t wrb, size_t k, const void *act,
                                   size_t n_tok, float *y, size_t r0, size_t r1);

/* Dequantization of nb super-blocks (ggml's formulas in ggml's order) and tern's
 * quantizers (quant-lowbit.c); false for a type that is not one of the nine. */
bool tern_lowbit_dequantize(enum tern_dtype t, const void *src, float *dst, size_t nb);
bool tern_lowbit_quantize(enum tern_dtype t, const float *src, void *dst, size_t nb);

#endif
