/* Quantized block layouts, byte for byte as ggml stores them in GGUF files (weights
 * are used straight from the mapped file), plus the small helpers that every kernel
 * (portable or SIMD) shares to read them.
 *
 * All multi-byte fields are little-endian (x86 and every GGUF producer); halves are
 * IEEE binary16 bit patterns (util/fp16.h converts them exactly).
 *
 * Element order inside a block, for the 32-element types: qs[j] holds element j in
 * its low nibble and element j + 16 in its high nibble; for Q5_x bit j of qh is the
 * fifth bit of element j. For the 256-element K-quants see the struct comments. */
#ifndef TERN_KERNELS_QUANT_H
#define TERN_KERNELS_QUANT_H

#include "util/fp16.h"

#include <stddef.h>
#include <stdint.h>

#define TERN_QK 32   /* elements per block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4 */
#define TERN_QK_K 256 /* elements per super-block of the K-quants, IQ4_XS and Q8_K */

#define TERN_PACKED __attribute__((packed))

/* x = d * (q - 8), q in [0, 15] */
struct TERN_PACKED tern_block_q4_0 {
    tern_fp16 d;
    uint8_t qs[TERN_QK / 2];
};
_Static_assert(sizeof(struct tern_block_q4_0) == 18, "block_q4_0 size");

/* x = d * q + m, q in [0, 15] */
struct TERN_PACKED tern_block_q4_1 {
    tern_fp16 d;
    tern_fp16 m;
    uint8_t qs[TERN_QK / 2];
};
_Static_assert(sizeof(struct tern_block_q4_1) == 20, "block_q4_1 size");

/* x = d * (q - 16), q in [0, 31]: low nibble in qs, fifth bit in qh (bit j = element j) */
struct TERN_PACKED tern_block_q5_0 {
    tern_fp16 d;
    uint8_t qh[4];
    uint8_t qs[TERN_QK / 2];
};
_Static_assert(sizeof(struct tern_block_q5_0) == 22, "block_q5_0 size");

/* x = d * q + m, q in [0, 31] */
struct TERN_PACKED tern_block_q5_1 {
    tern_fp16 d;
    tern_fp16 m;
    uint8_t qh[4];
    uint8_t qs[TERN_QK / 2];
};
_Static_assert(sizeof(struct tern_block_q5_1) == 24, "block_q5_1 size");

/* x = d * q, q in [-127, 127] (tern never writes -128; it reads it correctly) */
struct TERN_PACKED tern_block_q8_0 {
    tern_fp16 d;
    int8_t qs[TERN_QK];
};
_Static_assert(sizeof(struct tern_block_q8_0) == 34, "block_q8_0 size");

/* ggml's activation format for Q4_1/Q5_1 (s = d * sum(qs)). tern does not compute with
 * it (see docs/kernels.md); the layout is here so files holding it can be read. */
struct TERN_PACKED tern_block_q8_1 {
    tern_fp16 d;
    tern_fp16 s;
    int8_t qs[TERN_QK];
};
_Static_assert(sizeof(struct tern_block_q8_1) == 36, "block_q8_1 size");

/* 8 sub-blocks of 32: x = d * sc[j] * q - dmin * m[j], q in [0, 15], sc and m 6-bit
 * (packed in scales[12], see tern_k4_scale_min). qs[32 * c + l] holds element
 * 64 c + l (low nibble) and 64 c + 32 + l (high nibble). */
struct TERN_PACKED tern_block_q4_k {
    tern_fp16 d;
    tern_fp16 dmin;
    uint8_t scales[12];
    uint8_t qs[TERN_QK_K / 2];
};
_Static_assert(sizeof(struct tern_block_q4_k) == 144, "block_q4_K size");

/* As Q4_K with a fifth bit: q in [0, 31]; bit 2c of qh[l] is the fifth bit of element
 * 64 c + l, bit 2c + 1 that of element 64 c + 32 + l. */
struct TERN_PACKED tern_block_q5_k {
    tern_fp16 d;
    tern_fp16 dmin;
    uint8_t scales[12];
    uint8_t qh[TERN_QK_K / 8];
    uint8_t qs[TERN_QK_K / 2];
};
_Static_assert(sizeof(struct tern_block_q5_k) == 176, "block_q5_K size");

/* 16 sub-blocks of 16: x = d * scales[j] * (q - 32), q in [0, 63]. Each half of 128
 * elements h uses ql[64 h ..], qh[32 h ..]: for l in [0, 32) the four elements
 * 128 h + l + {0, 32, 64, 96} take their low nibbles from ql[64h + l] (low),
 * ql[64h + 32 + l] (low), ql[64h + l] (high), ql[64h + 32 + l] (high) and their top two
 * bits from qh[32h + l] bits 0-1, 2-3, 4-5, 6-7. */
struct TERN_PACKED tern_block_q6_k {
    uint8_t ql[TERN_QK_K / 2];
    uint8_t qh[TERN_QK_K / 4];
    int8_t scales[TERN_QK_K / 16];
    tern_fp16 d;
};
_Static_assert(sizeof(struct tern_block_q6_k) == 210, "block_q6_K size");

/* The non-linear 4-bit levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl): a 4-bit
 * index q stands for tern_iq4nl_values[q], not for q itself. A fact of the format. */
extern const int8_t tern_iq4nl_values[16]; /* defined in quant.c */

/* x = d * tern_iq4nl_values[q], q in [0, 15]; nibbles laid out as Q4_0's (qs[j]: element
 * j low, j + 16 high). */
struct TERN_PACKED tern_block_iq4_nl {
    tern_fp16 d;
    uint8_t qs[TERN_QK / 2];
};
_Static_assert(sizeof(struct tern_block_iq4_nl) == 18, "block_iq4_nl size");

/* 8 sub-blocks of 32: x = d * (ls[j] - 32) * tern_iq4nl_values[q], ls[j] 6-bit: low 4 bits
 * in nibble j % 2 of scales_l[j / 2], top 2 bits in bits 2j, 2j + 1 of scales_h (see
 * tern_iq4xs_scale). qs[16 j + l] holds element 32 j + l (low nibble) and 32 j + 16 + l
 * (high nibble). */
struct TERN_PACKED tern_block_iq4_xs {
    tern_fp16 d;
    uint16_t scales_h;
    uint8_t scales_l[TERN_QK_K / 64];
    uint8_t qs[TERN_QK_K / 2];
};
_Static_assert(sizeof(struct tern_block_iq4_xs) == 136, "block_iq4_xs size");

/* The j-th (0..7) sub-block scale of an IQ4_XS block, ls - 32, in [-32, 31]. */
static inline int tern_iq4xs_scale(const struct tern_block_iq4_xs *b, int j) {
    const int ls = ((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b->scales_h >> (2 * j)) & 3) << 4);
    return ls - 32;
}

/* MXFP4 (OCP microscaling FP4): x = tern_mxfp4_values[q] * 2^(e - 128), q in [0, 15] an
 * E2M1 code (sign, two exponent bits, one mantissa bit), e an E8M0 exponent byte. The
 * table holds twice each E2M1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives) as
 * integers, so the scale is half of E8M0's 2^(e - 127): ggml's layout and arithmetic.
 * Nibbles laid out as Q4_0's (qs[j]: element j low, j + 16 high). */
extern const int8_t tern_mxfp4_values[16]; /* defined in quant.c */

struct TERN_PACKED tern_block_mxfp4 {
    uint8_t e;
    uint8_t qs[TERN_QK / 2];
};
_Static_assert(sizeof(struct tern_block_mxfp4) == 17, "block_mxfp4 size");

/* 2^(e - 128) as a float, exactly (e = 0 and 1 are the subnormals 2^-128, 2^-127). */
static inline float tern_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}
/* ---- the low-bit types (docs/kernels.md, "Low-bit types") ---------------------------------
 * Q2_K and Q3_K are K-quants with 16 sub-blocks of 16; the I-quants store indices into
 * fixed grids of 8 (IQ2_*, IQ1_*) or 4 (IQ3_*) magnitudes plus sign bits. Element order in
 * every one of them: for the K-quants, half h (128 elements) uses qs[32 h ..]: element
 * 128 h + 32 j + l (l < 32) takes bits 2j, 2j + 1 of qs[32 h + l]; for the I-quants,
 * groups of 8 consecutive elements, 4 groups per sub-block of 32. */

/* x = d * (sc & 15) * q - dmin * (sc >> 4), q in [0, 3], scales[i] for elements 16 i ... */
struct TERN_PACKED tern_block_q2_k {
    uint8_t scales[TERN_QK_K / 16];
    uint8_t qs[TERN_QK_K / 4];
    tern_fp16 d;
    tern_fp16 dmin;
};
_Static_assert(sizeof(struct tern_block_q2_k) == 84, "block_q2_K size");

/* x = d * (s - 32) * (q - 4 * !hbit), q in [0, 3], s 6-bit (16 of them packed in
 * scales[12]: low nibbles in bytes 0-7, top two bits in bytes 8-11); bit h * 4 + j of
 * hmask[l] is the high bit of element 128 h + 32 j + l. */
struct TERN_PACKED tern_block_q3_k {
    uint8_t hmask[TERN_QK_K / 8];
    uint8_t qs[TERN_QK_K / 4];
    uint8_t scales[12];
    tern_fp16 d;
};
_Static_assert(sizeof(struct tern_block_q3_k) == 110, "block_q3_K size");

/* Per sub-block of 32, two uint32: 4 grid indices (bytes of the first), 4 x 7 sign bits
 * and a 4-bit scale ls (top bits of the second); x = d * (0.5 + ls) / 4 * grid * sign. */
struct TERN_PACKED tern_block_iq2_xxs {
    tern_fp16 d;
    uint16_t qs[TERN_QK_K / 8];
};
_Static_assert(sizeof(struct tern_block_iq2_xxs) == 66, "block_iq2_xxs size");

/* qs[i]: 9-bit grid index, 7 sign bits; scales[j]: two 4-bit scales for sub-block j. */
struct TERN_PACKED tern_block_iq2_xs {
    tern_fp16 d;
    uint16_t qs[TERN_QK_K / 8];
    uint8_t scales[TERN_QK_K / 32];
};
_Static_assert(sizeof(struct tern_block_iq2_xs) == 74, "block_iq2_xs size");

/* qs[0..31]: low 8 bits of 10-bit grid indices, qs[32..63]: 8 sign bits per group,
 * qh[j]: the top 2 bits of sub-block j's 4 indices. */
struct TERN_PACKED tern_block_iq2_s {
    tern_fp16 d;
    uint8_t qs[TERN_QK_K / 4];
    uint8_t qh[TERN_QK_K / 32];
    uint8_t scales[TERN_QK_K / 32];
};
_Static_assert(sizeof(struct tern_block_iq2_s) == 82, "block_iq2_s size");

/* qs[0..63]: grid indices (4 magnitudes each), qs[64..95]: per sub-block a uint32 of
 * 4 x 7 sign bits and a 4-bit scale; x = d * (0.5 + ls) / 2 * grid * sign. */
struct TERN_PACKED tern_block_iq3_xxs {
    tern_fp16 d;
    uint8_t qs[3 * TERN_QK_K / 8];
};
_Static_assert(sizeof(struct tern_block_iq3_xxs) == 98, "block_iq3_xxs size");

/* 9-bit grid indices (low bits in qs, ninth in qh), 8 sign bits per group, 4-bit scales
 * per sub-block of 32: x = d * (1 + 2 ls) * grid * sign. */
struct TERN_PACKED tern_block_iq3_s {
    tern_fp16 d;
    uint8_t qs[TERN_QK_K / 4];
    uint8_t qh[TERN_QK_K / 32];
    uint8_t signs[TERN_QK_K / 8];
    uint8_t scales[TERN_QK_K / 64];
};
_Static_assert(sizeof(struct tern_block_iq3_s) == 110, "block_iq3_s size");

/* 11-bit indices into a grid of -1/0/+1 (low 8 bits in qs, top 3 in qh[j] bits 3l..3l+2),
 * qh[j] bits 12-14: scale s, bit 15: sign of the shift; x = d * (2 s + 1) * (grid +- 1/8). */
struct TERN_PACKED tern_block_iq1_s {
    tern_fp16 d;
    uint8_t qs[TERN_QK_K / 8];
    uint16_t qh[TERN_QK_K / 32];
};
_Static_assert(sizeof(struct tern_block_iq1_s) == 50, "block_iq1_s size");

/* As IQ1_S with a shift sign per group of 8 (qh bits 3 and 7) and 3-bit scales per 16;
 * the block's half d is spread over the top nibbles of the four uint16 of scales. */
struct TERN_PACKED tern_block_iq1_m {
    uint8_t qs[TERN_QK_K / 8];
    uint8_t qh[TERN_QK_K / 16];
    uint8_t scales[TERN_QK_K / 32];
};
_Static_assert(sizeof(struct tern_block_iq1_m) == 56, "block_iq1_m size");

/* The grids, derived once (tern_iq_grids_init) from their compact code lists in
 * iq-grids.c: entry i holds 8 (IQ3: 4) bytes, byte j the magnitude of element j. */
extern uint64_t tern_iq2xxs_grid[256], tern_iq2xs_grid[512], tern_iq2s_grid[1024];
extern uint32_t tern_iq3xxs_grid[256], tern_iq3s_grid[512];
extern uint64_t tern_iq1s_grid[2048]; /* bytes are int8 -1, 0, +1 */
extern uint64_t tern_iq_signmask[256]; /* byte j 0xFF where bit j of the index is set */
/* The compact codes the grids are derived from (iq-grids.c): element j of point i in
 * bits 2j, 2j + 1 (IQ3: 3j .. 3j + 2) of codes[i] as a level index. The Vulkan matmul
 * reads these (a device buffer of them) instead of the derived tables. */
extern const uint16_t tern_iq2xxs_codes[256], tern_iq2xs_codes[512], tern_iq2s_codes[1024];
extern const uint16_t tern_iq3xxs_codes[256], tern_iq3s_codes[512], tern_iq1s_codes[2048];
/* Sign byte of a 7-bit sign index: the eighth sign makes the count of negatives even. */
static inline uint8_t tern_iq_signs7(unsigned s7) {
    return (uint8_t)(s7 | ((unsigned)__builtin_parity(s7) << 7));
}
/* Thread-safe, idempotent; every user of the grids calls it first (cheap after the first). */
void tern_iq_grids_init(void);

/* Activation format for the K-quants: x = d * q, q in [-127, 127] as tern writes it;
 * bsums[g] = sum of qs[16 g .. 16 g + 15]. */
struct TERN_PACKED tern_block_q8_k {
    float d;
    int8_t qs[TERN_QK_K];
    int16_t bsums[TERN_QK_K / 16];
};
_Static_assert(sizeof(struct tern_block_q8_k) == 292, "block_q8_K size");

/* The j-th (0..7) 6-bit scale and min of a Q4_K/Q5_K block. The first four live in
 * the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); the last four keep their low
 * 4 bits in bytes 8-11 and their top 2 bits in the top bits of bytes 0-7. */
static inline void tern_k4_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Inverse of tern_k4_scale_min: packs 8 scales and 8 mins (each < 64). */
static inline void tern_k4_pack_scale_min(uint8_t *s, const uint8_t *sc, const uint8_t *m) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

/* Rounds to nearest (ties to even, like the SIMD conversion under the default MXCSR)
 * after clamping to [lo, hi] (|lo|, |hi| < 2^22); NaN becomes lo. The clamp is written as
 * the SIMD max/min instructions behave (the second operand wins when the compare is
 * false), so portable and SIMD quantizers give the same bits for every input. Adding and
 * subtracting 1.5 * 2^23 rounds to an integer in the current (nearest-even) mode without
 * a libm call. */
static inline int tern_round_clamp(float v, float lo, float hi) {
    v = v > lo ? v : lo;
    v = v < hi ? v : hi;
    return (int)((v + 12582912.0f) - 12582912.0f);
}

/* Activation quantizers (also the Q8_0 / Q8_K weight quantizers). d of a block is
 * amax / 127; a block whose amax is below 2^-100 (or NaN) is stored as zeros with
 * d = 0. Q8_0 rounds d to half first (saturating at 65504) and quantizes with 1/d of
 * the rounded value. k must be a multiple of the block size (callers check). */
void tern_quantize_q8_0_ref(const float *x, struct tern_block_q8_0 *y, size_t k);
void tern_quantize_q8_k_ref(const float *x, struct tern_block_q8_k *y, size_t k);

#endif
