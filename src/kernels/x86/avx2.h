/* Shared by the AVX2 kernel files (compiled with -mavx2 -mfma -mf16c): small helpers
 * and the tiling driver.
 *
 * How the exactness contract is kept: every kernel is a "tile" computing an R x T block
 * of outputs (R weight rows x T activation rows) over the whole of k. A tile keeps one
 * accumulator per (row, token) pair and applies to it exactly the same sequence of
 * operations, block by block in order, whatever R and T are; the final horizontal sum
 * is the same function for every pair. Tiles of every shape up to the maximum are
 * instantiated from one always-inline body, and the driver picks shapes freely (larger
 * tiles in the middle, smaller ones at the edges, different ones for n_tok = 1): the
 * shape decides only which pairs share loads, never what a pair computes. */
#ifndef TERN_KERNELS_X86_AVX2_H
#define TERN_KERNELS_X86_AVX2_H

#include "kernels/kernels-impl.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define AVX2_INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

/* The one horizontal sum every output goes through: (lo128 + hi128), then pairs. */
AVX2_INLINE float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}


/* The half at p as a float in all 8 lanes by F16C (exact, as the table): the 32-element
 * quants' scales, where a table look-up per block and row went to L2 (the table is 256 KiB). */
AVX2_INLINE __m256 cvt_bcast(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
/* A block's half scale at p, as a float in all 8 lanes (one table load, no ALU): the
 * K-quants, one scale per 256 elements. */
AVX2_INLINE __m256 lut_bcast(const uint8_t *p) {
    tern_fp16 h;
    memcpy(&h, p, 2);
    return _mm256_broadcast_ss(&tern_fp16_lut[h]);
}

/* GEMV software prefetch. A decode step streams every weight once; a matrix of short rows
 * (k = 1024: 17 cache lines of Q8_0 per row) read R rows at a time gives the hardware
 * prefetchers streams too short to lock onto, and the kernel then waits on memory
 * latency at every row start (about 55% of the streaming bound measured, 98% with this).
 * So each GEMV tile, while it reads block b of its rows, prefetches the same bytes of
 * the rows AVX2_PF_ROWS further on: the next tiles' data arrives while this one
 * computes. Prefetches past the matrix end are harmless (they never fault). */
#define AVX2_PF_ROWS 4
AVX2_INLINE void avx2_prefetch(const uint8_t *p) { _mm_prefetch((const char *)p, _MM_HINT_T0); }

AVX2_INLINE __m256i loadu256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
AVX2_INLINE __m128i loadu128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }

/* 16 bytes of nibbles -> 32 bytes: low nibbles in bytes 0-15, high nibbles in 16-31. */
AVX2_INLINE __m256i nibbles32(const uint8_t *p) {
    /* both halves hold the 16 bytes; the upper one shifted right by 4 */
    const __m256i v = _mm256_broadcastsi128_si256(loadu128(p));
    const __m256i sh = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(sh, _mm256_set1_epi8(0x0F));
}

/* The 16 IQ4 table values in both 128-bit lanes, for _mm256_shuffle_epi8 by nibble. */
AVX2_INLINE __m256i iq4nl_table(void) { return _mm256_broadcastsi128_si256(loadu128(tern_iq4nl_values)); }
/* The 16 MXFP4 levels (twice the E2M1 values) likewise. */
AVX2_INLINE __m256i mxfp4_table(void) { return _mm256_broadcastsi128_si256(loadu128(tern_mxfp4_values)); }

/* The 8 scales (words 0-7) and 8 mins (words 8-15) of a Q4_K/Q5_K block (the same head) as
 * int16, unpacked from the 12 bytes (dwords u0 u1 u2) in one xmm, per byte:
 *   sc_lo = u0 & 3f, sc_hi = (u2 & 0f) | ((u0 >> 2) & 30), m_lo = u1 & 3f,
 *   m_hi = ((u2 >> 4) & 0f) | ((u1 >> 2) & 30).
 * Reads 16 bytes: the block goes on past its scales. */
AVX2_INLINE __m256i k4_scales_mins16(const uint8_t *blk) {
    const __m128i x = loadu128(blk + offsetof(struct tern_block_q4_k, scales));
    const __m128i y = _mm_srlv_epi32(_mm_shuffle_epi32(x, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4));
    const __m128i lo = _mm_and_si128(y, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 0, 0)), 2),
                                     _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm256_cvtepu8_epi16(_mm_or_si128(lo, hi)); /* dwords [sc_lo, sc_hi, m_lo, m_hi] */
}

/* 32 bits -> 32 bytes, byte j = 0xFF where bit j is set. */
AVX2_INLINE __m256i bits_to_bytes(uint32_t bits) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits),
        _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll, 0x0101010101010101ll, 0));
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
}

/* Sum of 4 adjacent u8 x s8 products per int32 lane (no saturation for |u| <= 128,
 * |s| <= 127: pairs stay below 2^15). */
AVX2_INLINE __m256i dot_u8s8_32(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* ---- the 32-element quants' levels (q32-avx2.c and the AVX-512 tiles) ------------------- */

enum q32_kind { K_Q8_0, K_Q4_0, K_Q5_0, K_Q4_1, K_Q5_1, K_IQ4_NL, K_MXFP4 };

AVX2_INLINE size_t q32_block_bytes(int kind) {
    switch (kind) {
    case K_Q8_0: return sizeof(struct tern_block_q8_0);
    case K_Q4_0: return sizeof(struct tern_block_q4_0);
    case K_Q5_0: return sizeof(struct tern_block_q5_0);
    case K_Q4_1: return sizeof(struct tern_block_q4_1);
    case K_IQ4_NL: return sizeof(struct tern_block_iq4_nl);
    case K_MXFP4: return sizeof(struct tern_block_mxfp4);
    default: return sizeof(struct tern_block_q5_1);
    }
}

/* Levels that are signed bytes (multiplied by the sign trick); the others are unsigned. */
AVX2_INLINE bool q32_signed(int kind) { return kind == K_Q8_0 || kind == K_IQ4_NL || kind == K_MXFP4; }

/* The block's levels as 32 bytes: signed for Q8_0 and IQ4_NL (the table value of each
 * nibble, by one byte shuffle), unsigned otherwise. */
AVX2_INLINE __m256i q32_levels(int kind, const uint8_t *blk) {
    switch (kind) {
    case K_Q8_0: return loadu256(blk + 2);
    case K_IQ4_NL: return _mm256_shuffle_epi8(iq4nl_table(), nibbles32(blk + 2));
    case K_MXFP4: return _mm256_shuffle_epi8(mxfp4_table(), nibbles32(blk + 1));
    case K_Q4_0: return nibbles32(blk + 2);
    case K_Q4_1: return nibbles32(blk + 4);
    default: {
        const size_t qh_off = kind == K_Q5_0 ? 2 : 4;
        uint32_t qh;
        memcpy(&qh, blk + qh_off, 4);
        const __m256i hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
        return _mm256_or_si256(nibbles32(blk + qh_off + 4), hi);
    }
    }
}

/* Level offset subtracted through the activation sums (Q4_0: 8, Q5_0: 16). */
AVX2_INLINE int q32_offset(int kind) { return kind == K_Q4_0 ? 8 : kind == K_Q5_0 ? 16 : 0; }
AVX2_INLINE bool q32_has_min(int kind) { return kind == K_Q4_1 || kind == K_Q5_1; }

/* ---- IQ4_XS's head (qk-avx2.c and the AVX-512 tiles) --------------------------------- */

#define IQ4XS_D offsetof(struct tern_block_iq4_xs, d)
#define IQ4XS_QS offsetof(struct tern_block_iq4_xs, qs)

/* The 8 sub-block scales of a block as int16 (ls - 32), in both 128-bit lanes, without a
 * per-scale loop: the 8 low nibbles (scales_l) and the 8 two-bit highs (scales_h) are
 * spread to one byte each by shifts and masks, then widened. */
AVX2_INLINE __m256i iq4xs_scales16(const uint8_t *blk) {
    uint16_t h;
    uint32_t l;
    memcpy(&h, blk + offsetof(struct tern_block_iq4_xs, scales_h), 2);
    memcpy(&l, blk + offsetof(struct tern_block_iq4_xs, scales_l), 4);
    uint64_t x = l; /* nibble j -> low nibble of byte j */
    x = (x | (x << 16)) & 0x0000FFFF0000FFFFull;
    x = (x | (x << 8)) & 0x00FF00FF00FF00FFull;
    x = (x | (x << 4)) & 0x0F0F0F0F0F0F0F0Full;
    uint64_t y = h; /* 2-bit group j -> bits 0-1 of byte j */
    y = (y | (y << 24)) & 0x000000FF000000FFull;
    y = (y | (y << 12)) & 0x000F000F000F000Full;
    y = (y | (y << 6)) & 0x0303030303030303ull;
    const __m128i ls = _mm_cvtsi64_si128((long long)(x | (y << 4)));
    const __m128i s16 = _mm_sub_epi16(_mm_cvtepu8_epi16(ls), _mm_set1_epi16(32));
    return _mm256_broadcastsi128_si256(s16);
}

/* ---- tiling driver ------------------------------------------------------------------- */

/* Computes rows [0, R) x tokens [0, T) of one tile: y[t * ldy + r]. w points at the
 * first row, a at the first token row. */
typedef void (*avx2_tile_fn)(const uint8_t *w, size_t wrb, const uint8_t *a, size_t arb, size_t k,
                             float *y, size_t ldy);

#define AVX2_RMAX 6
#define AVX2_TMAX 4

struct avx2_tiles {
    avx2_tile_fn fn[AVX2_RMAX + 1][AVX2_TMAX + 1]; /* [R][T], 1-based */
    int gemv_r;      /* rows per tile when n_tok == 1 */
    int gemm_r, gemm_t; /* tile shape for batches */
};

/* Bytes of activation rows to keep hot while weight rows stream past (an L2 share). */
#define AVX2_ACT_BLOCK_BYTES (160 * 1024)

static inline void avx2_drive(const struct avx2_tiles *tiles, const void *wv, size_t wrb, size_t k,
                              const void *av, size_t arb, size_t n_tok, float *y, size_t ldy, size_t r0,
                              size_t r1) {
    const uint8_t *w = wv;
    const uint8_t *a = av;
    if (n_tok == 1) {
        const size_t R = (size_t)tiles->gemv_r;
        for (size_t r = r0; r < r1; r += R) {
            const size_t nr = r1 - r < R ? r1 - r : R;
            tiles->fn[nr][1](w + r * wrb, wrb, a, arb, k, y + r, ldy);
        }
        return;
    }
    const size_t R = (size_t)tiles->gemm_r, T = (size_t)tiles->gemm_t;
    size_t tb = AVX2_ACT_BLOCK_BYTES / (arb ? arb : 1);
    tb = tb < T ? T : tb / T * T;
    for (size_t t0 = 0; t0 < n_tok; t0 += tb) {
        const size_t t1 = n_tok - t0 < tb ? n_tok : t0 + tb;
        for (size_t r = r0; r < r1; r += R) {
            const size_t nr = r1 - r < R ? r1 - r : R;
            for (size_t t = t0; t < t1; t += T) {
                const size_t nt = t1 - t < T ? t1 - t : T;
                tiles->fn[nr][nt](w + r * wrb, wrb, a + t * arb, arb, k, y + t * ldy + r, ldy);
            }
        }
    }
}

/* Instantiates the wrapper BODY_RxT (a real function) of an always-inline tile body
 * BODY(R, T, args...). Only the shapes a type's driver uses are instantiated:
 * AVX2_GRID<R>(body, T) makes every shape up to R x T, AVX2_TILE_INST one more, and
 * AVX2_IGRID<R>(body, T) / AVX2_TILE_SLOT the matching designated initializers. */
#define AVX2_TILE_INST(body, R, T)                                                              \
    static void body##_##R##x##T(const uint8_t *w, size_t wrb, const uint8_t *a, size_t arb,    \
                                 size_t k, float *y, size_t ldy) {                             \
        body(R, T, w, wrb, a, arb, k, y, ldy);                                                  \
    }
#define AVX2_T1(b, R) AVX2_TILE_INST(b, R, 1)
#define AVX2_T2(b, R) AVX2_T1(b, R) AVX2_TILE_INST(b, R, 2)
#define AVX2_T3(b, R) AVX2_T2(b, R) AVX2_TILE_INST(b, R, 3)
#define AVX2_T4(b, R) AVX2_T3(b, R) AVX2_TILE_INST(b, R, 4)
#define AVX2_GRID1(b, T) AVX2_T##T(b, 1)
#define AVX2_GRID2(b, T) AVX2_GRID1(b, T) AVX2_T##T(b, 2)
#define AVX2_GRID3(b, T) AVX2_GRID2(b, T) AVX2_T##T(b, 3)
#define AVX2_GRID4(b, T) AVX2_GRID3(b, T) AVX2_T##T(b, 4)

#define AVX2_TILE_SLOT(b, R, T) [R][T] = b##_##R##x##T
#define AVX2_I1(b, R) AVX2_TILE_SLOT(b, R, 1)
#define AVX2_I2(b, R) AVX2_I1(b, R), AVX2_TILE_SLOT(b, R, 2)
#define AVX2_I3(b, R) AVX2_I2(b, R), AVX2_TILE_SLOT(b, R, 3)
#define AVX2_I4(b, R) AVX2_I3(b, R), AVX2_TILE_SLOT(b, R, 4)
#define AVX2_IGRID1(b, T) AVX2_I##T(b, 1)
#define AVX2_IGRID2(b, T) AVX2_IGRID1(b, T), AVX2_I##T(b, 2)
#define AVX2_IGRID3(b, T) AVX2_IGRID2(b, T), AVX2_I##T(b, 3)
#define AVX2_IGRID4(b, T) AVX2_IGRID3(b, T), AVX2_I##T(b, 4)

/* A matmul entry point for the kernel table from a tile table. */
#define AVX2_MATMUL(name, tiles)                                                                 \
    void name(const void *w, size_t wrb, size_t k, const void *a, size_t arb, size_t n_tok,      \
              float *y, size_t ldy, size_t r0, size_t r1) {                                      \
        avx2_drive(&(tiles), w, wrb, k, a, arb, n_tok, y, ldy, r0, r1);                         \
    }

/* Entry points defined by the x86 files, collected in matmul-avx2.c. */
void tern_avx2_matmul_f32(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_matmul_f16(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_matmul_bf16(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_matmul_q8_0(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_matmul_q4_0(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_matmul_q4_1(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_matmul_q5_0(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_matmul_q5_1(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_matmul_q4_k(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_matmul_q5_k(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_matmul_q6_k(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_matmul_iq4_nl(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_matmul_iq4_xs(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_matmul_mxfp4(const void *, size_t, size_t, const void *, size_t, size_t, float *, size_t, size_t, size_t);
void tern_avx2_act_q8_0(const float *x, void *out, size_t k);
void tern_avx2_act_q8_k(const float *x, void *out, size_t k);

#endif
