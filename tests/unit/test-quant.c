/* kernels/quant: block layouts, dequantization (hand-built blocks with independently
 * computed values), quantize -> dequantize round trips within per-type error budgets
 * on random and edge data, and refusal of row lengths that are not a block multiple. */
#include "harness.h"

#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"
#include "kernels/deltanet.h"
#include "kernels/quant.h"
#include "tern.h"
#include "util/dtype.h"
#include "util/fp16.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* xorshift + Box-Muller: deterministic data, independent of libc's rand(). */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static float rng_unit(void) { return ((float)rng_u32() + 0.5f) * 0x1p-32f; }
static float rng_gauss(void) {
    const float u = rng_unit(), v = rng_unit();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static const enum tern_dtype quant_types[] = {
    TERN_DTYPE_F32,  TERN_DTYPE_F16,  TERN_DTYPE_BF16, TERN_DTYPE_Q4_0, TERN_DTYPE_Q4_1,
    TERN_DTYPE_Q5_0, TERN_DTYPE_Q5_1, TERN_DTYPE_Q8_0, TERN_DTYPE_Q4_K, TERN_DTYPE_Q5_K,
    TERN_DTYPE_Q6_K, TERN_DTYPE_Q8_K, TERN_DTYPE_IQ4_NL, TERN_DTYPE_IQ4_XS, TERN_DTYPE_MXFP4,
};

/* TERN_ISA=portable forces the portable kernels, ops and DeltaNet path (one choice,
 * kernels.c). Runs first: the ISA is chosen once per process, at the first kernel call. */
static void test_isa_env_forces_portable(void **state) {
    (void)state;
    setenv("TERN_ISA", "portable", 1);
    assert_int_equal(tern_kernels_isa(), TERN_ISA_PORTABLE);
    unsetenv("TERN_ISA");
    assert_int_equal(tern_kernels_isa(), TERN_ISA_PORTABLE); /* chosen once */
    /* One choice for the whole process: the ops and the Gated DeltaNet core follow it. */
    assert_ptr_equal(tern_ops(), tern_ops_portable());
    assert_int_equal(tern_deltanet_path(), TERN_DELTANET_GENERIC);
    if (tern_kernels_set_isa(TERN_ISA_AVX2)) {
        assert_true(tern_kernels_isa_available(TERN_ISA_AVX2));
        assert_ptr_equal(tern_ops(), tern_ops_avx2());
        assert_int_equal(tern_deltanet_path(), TERN_DELTANET_AVX2);
        assert_true(tern_deltanet_set_path(TERN_DELTANET_GENERIC)); /* switches the one choice */
        assert_int_equal(tern_kernels_isa(), TERN_ISA_PORTABLE);
        assert_ptr_equal(tern_ops(), tern_ops_portable());
    } else {
        assert_null(tern_ops_avx2());
    }
    assert_true(tern_kernels_isa_available(TERN_ISA_PORTABLE));
}

static void test_block_sizes_match_dtype_table(void **state) {
    (void)state;
    const struct {
        enum tern_dtype t;
        size_t size, blck;
    } s[] = {
        {TERN_DTYPE_Q4_0, sizeof(struct tern_block_q4_0), TERN_QK},
        {TERN_DTYPE_Q4_1, sizeof(struct tern_block_q4_1), TERN_QK},
        {TERN_DTYPE_Q5_0, sizeof(struct tern_block_q5_0), TERN_QK},
        {TERN_DTYPE_Q5_1, sizeof(struct tern_block_q5_1), TERN_QK},
        {TERN_DTYPE_Q8_0, sizeof(struct tern_block_q8_0), TERN_QK},
        {TERN_DTYPE_Q8_1, sizeof(struct tern_block_q8_1), TERN_QK},
        {TERN_DTYPE_Q4_K, sizeof(struct tern_block_q4_k), TERN_QK_K},
        {TERN_DTYPE_Q5_K, sizeof(struct tern_block_q5_k), TERN_QK_K},
        {TERN_DTYPE_Q6_K, sizeof(struct tern_block_q6_k), TERN_QK_K},
        {TERN_DTYPE_Q8_K, sizeof(struct tern_block_q8_k), TERN_QK_K},
        {TERN_DTYPE_IQ4_NL, sizeof(struct tern_block_iq4_nl), TERN_QK},
        {TERN_DTYPE_IQ4_XS, sizeof(struct tern_block_iq4_xs), TERN_QK_K},
        {TERN_DTYPE_MXFP4, sizeof(struct tern_block_mxfp4), TERN_QK},
        {TERN_DTYPE_Q2_K, sizeof(struct tern_block_q2_k), TERN_QK_K},
        {TERN_DTYPE_Q3_K, sizeof(struct tern_block_q3_k), TERN_QK_K},
        {TERN_DTYPE_IQ2_XXS, sizeof(struct tern_block_iq2_xxs), TERN_QK_K},
        {TERN_DTYPE_IQ2_XS, sizeof(struct tern_block_iq2_xs), TERN_QK_K},
        {TERN_DTYPE_IQ2_S, sizeof(struct tern_block_iq2_s), TERN_QK_K},
        {TERN_DTYPE_IQ3_XXS, sizeof(struct tern_block_iq3_xxs), TERN_QK_K},
        {TERN_DTYPE_IQ3_S, sizeof(struct tern_block_iq3_s), TERN_QK_K},
        {TERN_DTYPE_IQ1_S, sizeof(struct tern_block_iq1_s), TERN_QK_K},
        {TERN_DTYPE_IQ1_M, sizeof(struct tern_block_iq1_m), TERN_QK_K},
    };
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        const struct tern_dtype_info *info = tern_dtype_info(s[i].t);
        assert_non_null(info);
        assert_int_equal(info->type_size, s[i].size);
        assert_int_equal(info->blck_size, s[i].blck);
    }
    for (size_t i = 0; i < sizeof quant_types / sizeof quant_types[0]; i++) {
        assert_true(tern_quantize_supported(quant_types[i]));
        assert_true(tern_dequantize_supported(quant_types[i]));
    }
    assert_false(tern_quantize_supported(TERN_DTYPE_TQ1_0));
    assert_false(tern_dequantize_supported(TERN_DTYPE_TQ2_0));
    assert_true(tern_dequantize_supported(TERN_DTYPE_Q2_K));
    assert_true(tern_dequantize_supported(TERN_DTYPE_IQ1_M));
}

/* ---- dequantization of hand-built blocks: each expected value is computed here from
 * the format's definition (ggml's formulas), element by element. */

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static void test_dequant_q4_0_q4_1_layout(void **state) {
    (void)state;
    struct tern_block_q4_0 b0;
    b0.d = tern_f32_to_fp16(0.5f);
    for (int j = 0; j < 16; j++) b0.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float y[32];
    assert_true(tern_dequantize_row(TERN_DTYPE_Q4_0, &b0, y, 32));
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == (float)(j - 8) * 0.5f);
        assert_true(y[j + 16] == (float)(15 - j - 8) * 0.5f);
    }
    struct tern_block_q4_1 b1;
    b1.d = tern_f32_to_fp16(0.25f);
    b1.m = tern_f32_to_fp16(-1.5f);
    for (int j = 0; j < 16; j++) b1.qs[j] = (uint8_t)((j ^ 5) | (j << 4));
    assert_true(tern_dequantize_row(TERN_DTYPE_Q4_1, &b1, y, 32));
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == (float)(j ^ 5) * 0.25f + -1.5f);
        assert_true(y[j + 16] == (float)j * 0.25f + -1.5f);
    }
}

static void test_dequant_q5_layout(void **state) {
    (void)state;
    /* fifth bits: element j <- bit j of qh (little-endian u32) */
    const uint32_t qh = 0xA5C3F00Fu;
    struct tern_block_q5_0 b0;
    b0.d = tern_f32_to_fp16(-0.75f);
    put_u32(b0.qh, qh);
    for (int j = 0; j < 16; j++) b0.qs[j] = (uint8_t)((j * 3 & 15) | ((j * 7 & 15) << 4));
    struct tern_block_q5_1 b1;
    b1.d = tern_f32_to_fp16(0.125f);
    b1.m = tern_f32_to_fp16(2.0f);
    memcpy(b1.qh, b0.qh, 4);
    memcpy(b1.qs, b0.qs, 16);
    float y0[32], y1[32];
    assert_true(tern_dequantize_row(TERN_DTYPE_Q5_0, &b0, y0, 32));
    assert_true(tern_dequantize_row(TERN_DTYPE_Q5_1, &b1, y1, 32));
    for (int e = 0; e < 32; e++) {
        const int nib = e < 16 ? (b0.qs[e] & 15) : (b0.qs[e - 16] >> 4);
        const int q = nib + (int)((qh >> e) & 1) * 16;
        assert_true(y0[e] == (float)(q - 16) * -0.75f);
        assert_true(y1[e] == (float)q * 0.125f + 2.0f);
    }
}

/* Fills a K-quant scales[12] so that sub-block j has scale sc[j] and min m[j], packed
 * by hand from the format's description (independent of tern_k4_pack_scale_min). */
static void pack_k4_by_hand(uint8_t s[12], const uint8_t sc[8], const uint8_t m[8]) {
    memset(s, 0, 12);
    for (int j = 0; j < 4; j++) {
        s[j] = sc[j];
        s[j + 4] = m[j];
    }
    for (int j = 4; j < 8; j++) {
        s[j + 4] = (uint8_t)((sc[j] & 15) | ((m[j] & 15) << 4));
        s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
        s[j] |= (uint8_t)((m[j] >> 4) << 6);
    }
}

static void test_dequant_k4_k5_layout(void **state) {
    (void)state;
    const uint8_t sc[8] = {1, 63, 17, 40, 5, 33, 62, 48};
    const uint8_t m[8] = {60, 2, 31, 16, 47, 0, 63, 21};
    struct tern_block_q4_k b4;
    struct tern_block_q5_k b5;
    b4.d = b5.d = tern_f32_to_fp16(0.01f);
    b4.dmin = b5.dmin = tern_f32_to_fp16(0.003f);
    pack_k4_by_hand(b4.scales, sc, m);
    memcpy(b5.scales, b4.scales, 12);
    for (int i = 0; i < 128; i++) b4.qs[i] = b5.qs[i] = (uint8_t)(rng_u32() & 0xFF);
    for (int i = 0; i < 32; i++) b5.qh[i] = (uint8_t)(rng_u32() & 0xFF);
    for (int j = 0; j < 8; j++) {
        uint8_t s1, m1;
        tern_k4_scale_min(b4.scales, j, &s1, &m1);
        assert_int_equal(s1, sc[j]);
        assert_int_equal(m1, m[j]);
    }
    float y4[256], y5[256];
    assert_true(tern_dequantize_row(TERN_DTYPE_Q4_K, &b4, y4, 256));
    assert_true(tern_dequantize_row(TERN_DTYPE_Q5_K, &b5, y5, 256));
    const float d = tern_fp16_to_f32(b4.d), dmin = tern_fp16_to_f32(b4.dmin);
    for (int e = 0; e < 256; e++) {
        const int c = e / 64, hi = (e % 64) >= 32, l = e % 32, j = e / 32;
        const int nib = hi ? b4.qs[32 * c + l] >> 4 : b4.qs[32 * c + l] & 15;
        const int bit5 = (b5.qh[l] >> (2 * c + hi)) & 1;
        const float dsc = d * (float)sc[j], dm = dmin * (float)m[j];
        assert_true(y4[e] == dsc * (float)nib - dm);
        assert_true(y5[e] == dsc * (float)(nib + 16 * bit5) - dm);
    }
}

static void test_dequant_q6_k_layout(void **state) {
    (void)state;
    struct tern_block_q6_k b;
    for (int i = 0; i < 128; i++) b.ql[i] = (uint8_t)(rng_u32() & 0xFF);
    for (int i = 0; i < 64; i++) b.qh[i] = (uint8_t)(rng_u32() & 0xFF);
    for (int i = 0; i < 16; i++) b.scales[i] = (int8_t)(i * 17 - 128);
    b.d = tern_f32_to_fp16(0.002f);
    float y[256];
    assert_true(tern_dequantize_row(TERN_DTYPE_Q6_K, &b, y, 256));
    const float d = tern_fp16_to_f32(b.d);
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
        const uint8_t lo = b.ql[64 * h + l + (quarter & 1) * 32];
        const int nib = quarter >= 2 ? lo >> 4 : lo & 15;
        const int top = (b.qh[32 * h + l] >> (2 * quarter)) & 3;
        const int q = (nib | (top << 4)) - 32;
        assert_true(y[e] == d * (float)b.scales[e / 16] * (float)q);
    }
}

/* IQ4_NL / IQ4_XS: the 16 levels written out here from the format (ggml's
 * kvalues_iq4nl), independently of the kernels' copy. */
static const int iq4_levels_by_hand[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void test_dequant_iq4_layout(void **state) {
    (void)state;
    for (int i = 0; i < 16; i++) assert_int_equal(tern_iq4nl_values[i], iq4_levels_by_hand[i]);
    struct tern_block_iq4_nl nl[2];
    nl[0].d = tern_f32_to_fp16(0.0125f);
    nl[1].d = tern_f32_to_fp16(-3.5f);
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 16; j++) nl[b].qs[j] = (uint8_t)(((j + b) & 15) | ((15 - j) << 4));
    float y[256];
    assert_true(tern_dequantize_row(TERN_DTYPE_IQ4_NL, nl, y, 64));
    for (int b = 0; b < 2; b++) {
        const float d = tern_fp16_to_f32(nl[b].d);
        for (int j = 0; j < 16; j++) {
            assert_true(y[32 * b + j] == d * (float)iq4_levels_by_hand[(j + b) & 15]);
            assert_true(y[32 * b + j + 16] == d * (float)iq4_levels_by_hand[15 - j]);
        }
    }
    /* IQ4_XS: sub-block scales 0..63 (so ls - 32 covers -32 and 31), low nibbles in
     * scales_l (sub-block 2i in the low half of byte i), top bits in scales_h. */
    const int ls[8] = {0, 63, 32, 1, 17, 40, 31, 48};
    struct tern_block_iq4_xs xs;
    xs.d = tern_f32_to_fp16(0.007f);
    xs.scales_h = 0;
    memset(xs.scales_l, 0, sizeof xs.scales_l);
    for (int j = 0; j < 8; j++) {
        xs.scales_l[j / 2] |= (uint8_t)((ls[j] & 15) << (j % 2 ? 4 : 0));
        xs.scales_h |= (uint16_t)((ls[j] >> 4) << (2 * j));
    }
    for (int i = 0; i < 128; i++) xs.qs[i] = (uint8_t)(i * 37 + 11); /* every nibble pair */
    assert_true(tern_dequantize_row(TERN_DTYPE_IQ4_XS, &xs, y, 256));
    const float d = tern_fp16_to_f32(xs.d);
    for (int e = 0; e < 256; e++) {
        const int j = e / 32, l = e % 32;
        const int nib = l < 16 ? xs.qs[16 * j + l] & 15 : xs.qs[16 * j + l - 16] >> 4;
        const float dl = d * (float)(ls[j] - 32); /* ggml's order: d * (ls - 32), then the level */
        assert_true(y[e] == dl * (float)iq4_levels_by_hand[nib]);
    }
}

/* MXFP4: the 16 E2M1 codes (sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3,
 * 4, 6 and their negatives) written out here from the format, doubled as ggml stores them;
 * the scale is 2^(e - 128) (E8M0's 2^(e - 127) halved), subnormal for e = 0 and 1. */
static void test_dequant_mxfp4_layout(void **state) {
    (void)state;
    static const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    for (int c = 0; c < 16; c++) assert_true((double)tern_mxfp4_values[c] == 2.0 * (c & 8 ? -1 : 1) * e2m1[c & 7]);
    static const uint8_t es[] = {0, 1, 2, 100, 127, 128, 129, 200, 254, 255};
    struct tern_block_mxfp4 blk[10];
    for (int b = 0; b < 10; b++) {
        blk[b].e = es[b];
        for (int j = 0; j < 16; j++) blk[b].qs[j] = (uint8_t)(((j + b) & 15) | ((15 - j) << 4));
    }
    float y[320];
    assert_true(tern_dequantize_row(TERN_DTYPE_MXFP4, blk, y, 320));
    for (int b = 0; b < 10; b++) {
        const double scale = ldexp(1.0, (int)es[b] - 128);
        for (int j = 0; j < 16; j++) {
            const int lo = (j + b) & 15, hi = 15 - j;
            const double want_lo = 2.0 * (lo & 8 ? -1 : 1) * e2m1[lo & 7] * scale;
            const double want_hi = 2.0 * (hi & 8 ? -1 : 1) * e2m1[hi & 7] * scale;
            /* beyond float's range (e = 255 with a level of 8 or 12) it is an infinity */
            assert_true((double)y[32 * b + j] == (fabs(want_lo) > FLT_MAX ? copysign(INFINITY, want_lo) : want_lo));
            assert_true((double)y[32 * b + j + 16] == (fabs(want_hi) > FLT_MAX ? copysign(INFINITY, want_hi) : want_hi));
        }
    }
    assert_false(tern_dequantize_row(TERN_DTYPE_MXFP4, blk, y, 48)); /* not a whole block */
}

static void test_dequant_q8_and_floats(void **state) {
    (void)state;
    struct tern_block_q8_0 b;
    b.d = tern_f32_to_fp16(-0.0625f);
    for (int j = 0; j < 32; j++) b.qs[j] = (int8_t)(j * 8 - 128);
    float y[256];
    assert_true(tern_dequantize_row(TERN_DTYPE_Q8_0, &b, y, 32));
    for (int j = 0; j < 32; j++) assert_true(y[j] == (float)(j * 8 - 128) * -0.0625f);
    struct tern_block_q8_k bk;
    bk.d = 0.5f;
    for (int j = 0; j < 256; j++) bk.qs[j] = (int8_t)(j - 128);
    assert_true(tern_dequantize_row(TERN_DTYPE_Q8_K, &bk, y, 256));
    for (int j = 0; j < 256; j++) assert_true(y[j] == 0.5f * (float)(j - 128));
    const uint16_t h[3] = {0x3C00, 0xC000, 0x0001}; /* 1, -2, smallest subnormal */
    assert_true(tern_dequantize_row(TERN_DTYPE_F16, h, y, 3));
    assert_true(y[0] == 1.0f && y[1] == -2.0f && y[2] == 0x1p-24f);
    const uint16_t bf[2] = {0x3F80, 0x4049}; /* 1, 3.140625 */
    assert_true(tern_dequantize_row(TERN_DTYPE_BF16, bf, y, 2));
    assert_true(y[0] == 1.0f && y[1] == 3.140625f);
}

/* ---- round trips ----------------------------------------------------------------------- */

/* RMS relative error budgets for N(0, 1)-like rows. Measured values (tern's quantizers,
 * k = 4096): see docs/kernels.md; budgets leave about 1.3x headroom. */
#define IQ4_NL_BUDGET 9.5e-2
#define IQ4_XS_BUDGET 9.5e-2
#define MXFP4_BUDGET 1.5e-1

/* Round-trip budgets of the low-bit types (rms relative error on N(0,1) rows). */
#define LB_Q2_K 0.39
#define LB_Q3_K 0.19
#define LB_IQ2_XXS 0.43
#define LB_IQ2_XS 0.37
#define LB_IQ2_S 0.32
#define LB_IQ3_XXS 0.235
#define LB_IQ3_S 0.165
#define LB_IQ1_S 0.69
#define LB_IQ1_M 0.6

static double budget(enum tern_dtype t) {
    switch (t) {
    case TERN_DTYPE_F32: return 0.0;
    case TERN_DTYPE_F16: return 4e-4;
    case TERN_DTYPE_BF16: return 3e-3;
    case TERN_DTYPE_Q8_0: return 6e-3;
    case TERN_DTYPE_Q8_K: return 8e-3;
    case TERN_DTYPE_Q6_K: return 2.2e-2;
    case TERN_DTYPE_Q5_0: return 4.5e-2;
    case TERN_DTYPE_Q5_1: return 4.5e-2;
    case TERN_DTYPE_Q5_K: return 4.5e-2;
    case TERN_DTYPE_Q4_0: return 9.5e-2;
    case TERN_DTYPE_Q4_1: return 9.5e-2;
    case TERN_DTYPE_Q4_K: return 9.5e-2;
    case TERN_DTYPE_IQ4_NL: return IQ4_NL_BUDGET;
    case TERN_DTYPE_IQ4_XS: return IQ4_XS_BUDGET;
    case TERN_DTYPE_MXFP4: return MXFP4_BUDGET;
    default: return 0.0;
    }
}

static double rms_rel(const float *x, const float *y, size_t n) {
    double se = 0, sx = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = (double)y[i] - x[i];
        se += e * e;
        sx += (double)x[i] * x[i];
    }
    if (sx == 0) return se == 0 ? 0 : INFINITY;
    return sqrt(se / sx);
}

/* Quantizes and dequantizes x[k]; returns the RMS relative error. */
static double round_trip(enum tern_dtype t, const float *x, float *y, size_t k) {
    uint64_t bytes;
    assert_true(tern_dtype_row_size(t, k, &bytes));
    void *q = malloc(bytes);
    assert_non_null(q);
    assert_true(tern_quantize_row(t, x, q, k));
    assert_true(tern_dequantize_row(t, q, y, k));
    free(q);
    for (size_t i = 0; i < k; i++) assert_true(isfinite(y[i]));
    return rms_rel(x, y, k);
}

static void check(enum tern_dtype t, const char *what, double err, double limit) {
    if (!(err <= limit))
        fail_msg("%s %s: RMS relative error %.3g exceeds the budget %.3g", tern_dtype_name(t), what, err,
                 limit);
}

#define K_RT 4096

static void test_round_trip_random(void **state) {
    (void)state;
    static float x[K_RT], y[K_RT];
    for (size_t ti = 0; ti < sizeof quant_types / sizeof quant_types[0]; ti++) {
        const enum tern_dtype t = quant_types[ti];
        for (int i = 0; i < K_RT; i++) x[i] = rng_gauss();
        const double e = round_trip(t, x, y, K_RT);
        if (getenv("TERN_TEST_VERBOSE")) printf("  %-5s gauss rms rel %.4g\n", tern_dtype_name(t), e);
        check(t, "gaussian", e, budget(t));
        if (t == TERN_DTYPE_F32) assert_memory_equal(x, y, sizeof x);
        /* uniform and heavy-tailed (Laplace-like) rows */
        for (int i = 0; i < K_RT; i++) x[i] = 2.0f * rng_unit() - 1.0f;
        check(t, "uniform", round_trip(t, x, y, K_RT), budget(t));
        for (int i = 0; i < K_RT; i++) x[i] = logf(rng_unit()) * (rng_u32() & 1 ? 1.0f : -1.0f);
        check(t, "laplace", round_trip(t, x, y, K_RT), budget(t) * 1.25);
    }
}

static void test_round_trip_edges(void **state) {
    (void)state;
    static float x[K_RT], y[K_RT];
    for (size_t ti = 0; ti < sizeof quant_types / sizeof quant_types[0]; ti++) {
        const enum tern_dtype t = quant_types[ti];
        const double b = budget(t);
        /* zeros come back exactly */
        memset(x, 0, sizeof x);
        round_trip(t, x, y, K_RT);
        for (int i = 0; i < K_RT; i++) assert_true(y[i] == 0.0f);
        /* constant rows, both signs */
        for (int sgn = -1; sgn <= 1; sgn += 2) {
            for (int i = 0; i < K_RT; i++) x[i] = 0.37f * (float)sgn;
            check(t, "constant", round_trip(t, x, y, K_RT), b > 0 ? b : 0);
        }
        /* huge and tiny magnitudes, within what each format can hold: half values and
         * half offsets (Q4_1/Q5_1 m) stop at 65504 */
        const bool f32_range = t == TERN_DTYPE_F32 || t == TERN_DTYPE_BF16 || t == TERN_DTYPE_Q8_K;
        const float huge = f32_range ? 1e30f : 1e4f;
        for (int i = 0; i < K_RT; i++) x[i] = rng_gauss() * huge;
        check(t, "huge", round_trip(t, x, y, K_RT), b);
        const float tiny = f32_range ? 1e-25f : 1e-2f;
        for (int i = 0; i < K_RT; i++) x[i] = rng_gauss() * tiny;
        check(t, "tiny", round_trip(t, x, y, K_RT), b);
        /* a single outlier among small values: the row error stays in budget and the
         * outlier itself is kept to its block's precision */
        for (int i = 0; i < K_RT; i++) x[i] = rng_gauss() * 0.01f;
        x[1000] = 50.0f;
        check(t, "outlier", round_trip(t, x, y, K_RT), b);
        assert_true(fabsf(y[1000] - 50.0f) <= 50.0f * (float)(b > 0 ? b : 1e-7) * 2.0f);
    }
}

/* The low-bit types' quantizers (tern's own; what matters is that tern reads what it
 * writes): gaussian, uniform and scaled rows come back within each type's error budget
 * (measured: about 0.85 of it), zeros exactly, and dequantizing goes through the layout
 * the kit's ggml rows check. */
static void test_lowbit_round_trip(void **state) {
    (void)state;
    static const struct {
        enum tern_dtype t;
        double budget;
    } lb[] = {
        {TERN_DTYPE_Q2_K, LB_Q2_K},       {TERN_DTYPE_Q3_K, LB_Q3_K},   {TERN_DTYPE_IQ2_XXS, LB_IQ2_XXS},
        {TERN_DTYPE_IQ2_XS, LB_IQ2_XS},   {TERN_DTYPE_IQ2_S, LB_IQ2_S}, {TERN_DTYPE_IQ3_XXS, LB_IQ3_XXS},
        {TERN_DTYPE_IQ3_S, LB_IQ3_S},     {TERN_DTYPE_IQ1_S, LB_IQ1_S}, {TERN_DTYPE_IQ1_M, LB_IQ1_M},
    };
    static float x[K_RT], y[K_RT];
    for (size_t ti = 0; ti < sizeof lb / sizeof lb[0]; ti++) {
        const enum tern_dtype t = lb[ti].t;
        assert_true(tern_quantize_supported(t));
        for (int i = 0; i < K_RT; i++) x[i] = rng_gauss();
        const double e = round_trip(t, x, y, K_RT);
        if (getenv("TERN_TEST_VERBOSE")) printf("  %-7s gauss rms rel %.4g\n", tern_dtype_name(t), e);
        check(t, "gaussian", e, lb[ti].budget);
        for (int i = 0; i < K_RT; i++) x[i] = 2.0f * rng_unit() - 1.0f;
        check(t, "uniform", round_trip(t, x, y, K_RT), lb[ti].budget);
        for (int i = 0; i < K_RT; i++) x[i] = rng_gauss() * 3e3f;
        check(t, "large", round_trip(t, x, y, K_RT), lb[ti].budget);
        memset(x, 0, sizeof x);
        round_trip(t, x, y, K_RT);
        for (int i = 0; i < K_RT; i++) assert_true(y[i] == 0.0f);
    }
}

/* Values whose blocks are exactly representable come back exactly. */
static void test_round_trip_exact_grids(void **state) {
    (void)state;
    float x[256], y[256];
    /* Q8_0: integers in [-127, 127] times a power of two */
    for (int i = 0; i < 256; i++) x[i] = (float)((i * 37) % 255 - 127) * 0x1p-6f;
    for (int i = 0; i < 256; i += 32) x[i] = 127 * 0x1p-6f; /* every block reaches +127 */
    round_trip(TERN_DTYPE_Q8_0, x, y, 256);
    assert_memory_equal(x, y, sizeof x);
    /* Q4_0: levels -8..7 times 0.5, each block reaching -8 */
    for (int i = 0; i < 256; i++) x[i] = (float)((i * 5) % 16 - 8) * 0.5f;
    for (int i = 0; i < 256; i += 32) x[i] = -4.0f;
    round_trip(TERN_DTYPE_Q4_0, x, y, 256);
    assert_memory_equal(x, y, sizeof x);
    /* IQ4_NL: table values times 0.5, each block holding -127 (its largest magnitude) */
    for (int i = 0; i < 256; i++) x[i] = 0.5f * (float)iq4_levels_by_hand[(i * 7 + 3) % 16];
    for (int i = 0; i < 256; i += 32) x[i] = 0.5f * -127.0f;
    round_trip(TERN_DTYPE_IQ4_NL, x, y, 256);
    assert_memory_equal(x, y, sizeof x);
    /* IQ4_XS: d = 0.25, sub-block scales ls - 32 of both signs, -32 among them, and zero */
    static const int l[8] = {-32, 31, 5, -7, 17, 1, -1, 0};
    for (int i = 0; i < 256; i++) {
        const int lv = i % 32 == 0 ? -127 : iq4_levels_by_hand[(i * 5 + 1) % 16];
        x[i] = 0.25f * (float)l[i / 32] * (float)lv;
    }
    round_trip(TERN_DTYPE_IQ4_XS, x, y, 256);
    for (int i = 0; i < 256; i++)
        if (x[i] != y[i]) fail_msg("IQ4_XS exact grid: element %d is %g, came back %g", i, x[i], y[i]);
    /* MXFP4: E2M1 values times a power of two per block (2^-127, the smallest scale, .. 2^48), each block reaching
     * 6 (its largest magnitude) */
    static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int i = 0; i < 256; i++) {
        const int blk = i / 32;
        x[i] = ldexpf(i % 32 == 5 ? -6.0f : e2m1[(i * 11 + 3) % 16], blk * 25 - 127);
    }
    round_trip(TERN_DTYPE_MXFP4, x, y, 256);
    for (int i = 0; i < 256; i++)
        if (x[i] != y[i]) fail_msg("MXFP4 exact grid: element %d is %g, came back %g", i, x[i], y[i]);
}

static void test_odd_lengths_refused(void **state) {
    (void)state;
    float x[512] = {0}, y[512];
    uint8_t q[1024];
    const struct {
        enum tern_dtype t;
        size_t k;
    } bad[] = {{TERN_DTYPE_Q8_0, 33}, {TERN_DTYPE_Q4_0, 16},  {TERN_DTYPE_Q5_1, 48},
               {TERN_DTYPE_Q4_K, 255}, {TERN_DTYPE_Q6_K, 288}, {TERN_DTYPE_Q8_K, 100}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(q, 0xAB, sizeof q);
        assert_false(tern_quantize_row(bad[i].t, x, q, bad[i].k));
        assert_non_null(strstr(tern_last_error(), "not a multiple"));
        char num[32];
        snprintf(num, sizeof num, "%zu", bad[i].k);
        assert_non_null(strstr(tern_last_error(), num));
        for (size_t j = 0; j < sizeof q; j++) assert_int_equal(q[j], 0xAB); /* untouched */
        for (size_t j = 0; j < 512; j++) y[j] = 1.0f;
        assert_false(tern_dequantize_row(bad[i].t, q, y, bad[i].k));
        for (size_t j = 0; j < 512; j++) assert_true(y[j] == 1.0f);
    }
    assert_false(tern_quantize_row(TERN_DTYPE_TQ1_0, x, q, 256));
    assert_non_null(strstr(tern_last_error(), "TQ1_0"));
    assert_false(tern_dequantize_row(TERN_DTYPE_TQ2_0, q, y, 256));
    assert_true(tern_quantize_row(TERN_DTYPE_F16, x, q, 7)); /* float types take any k */
}

/* Activation quantizers: Q8_K bsums are the sums of their groups; -128 never appears;
 * NaN and infinity give finite scales or zeros, never a crash. */
static void test_activation_blocks(void **state) {
    (void)state;
    float x[512];
    for (int i = 0; i < 512; i++) x[i] = rng_gauss() * 3.0f;
    struct tern_block_q8_k bk[2];
    assert_true(tern_quantize_row(TERN_DTYPE_Q8_K, x, bk, 512));
    for (int b = 0; b < 2; b++) {
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += bk[b].qs[16 * g + j];
            assert_int_equal(bk[b].bsums[g], s);
        }
        for (int j = 0; j < 256; j++) assert_true(bk[b].qs[j] >= -127);
    }
    struct tern_block_q8_0 b0[16];
    x[3] = NAN;
    x[40] = INFINITY;
    assert_true(tern_quantize_row(TERN_DTYPE_Q8_0, x, b0, 512));
    assert_true(tern_quantize_row(TERN_DTYPE_Q8_K, x, bk, 512));
    for (int b = 0; b < 16; b++)
        for (int j = 0; j < 32; j++) assert_true(b0[b].qs[j] >= -127);
}


/* ---- the shared models ------------------------------------------------------------------ */

/* shared/conformance/dequant: rows dequantized by ggml, compared bit for bit. */
static void test_conformance_dequant_bit_exact(void **state) {
    (void)state;
    th_require_shared("conformance/dequant");
    static const char *stems[] = {"tiny-qwen3-q8_0",    "tiny-qwen3-q4_0",      "tiny-qwen3-q4_k_m",
                                  "tiny-qwen3-q6_k",    "tiny-qwen35-q8_0",     "tiny-qwen35-q4_k_m",
                                  "tiny-qwen3-iq4_xs",  "tiny-qwen3moe-q8_0",   "tiny-qwen35moe-q4_k_m",
                                  "tiny-gptoss-mxfp4",
                                  "tiny-qwen3-q2_k",    "tiny-qwen3-iq2_xs",    "tiny-qwen3-lowbit-mix"};
    int n_checked = 0, n_expert_rows = 0;
    bool type_seen[TERN_DTYPE_COUNT] = {false};
    for (size_t si = 0; si < sizeof stems / sizeof stems[0]; si++) {
        char rel[256];
        snprintf(rel, sizeof rel, "conformance/dequant/%s.json", stems[si]);
        json_error_t jerr;
        json_t *doc = json_load_file(th_shared_path(rel), 0, &jerr);
        if (!doc) fail_msg("%s: %s", rel, jerr.text);
        snprintf(rel, sizeof rel, "conformance/dequant/%s.f32", stems[si]);
        size_t ref_len;
        char *ref = th_read_file(th_shared_path(rel), &ref_len);
        assert_non_null(ref);
        snprintf(rel, sizeof rel, "models/%s.gguf", stems[si]);
        th_require_shared(rel);
        struct gguf_file *g;
        if (gguf_open(th_shared_path(rel), NULL, &g) != TERN_OK) fail_msg("%s: %s", rel, tern_last_error());
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(doc, "entries"), i, e) {
            const char *name = json_string_value(json_object_get(e, "tensor"));
            const size_t r0 = (size_t)json_integer_value(json_array_get(json_object_get(e, "rows"), 0));
            const size_t r1 = (size_t)json_integer_value(json_array_get(json_object_get(e, "rows"), 1));
            const size_t n_cols = (size_t)json_integer_value(json_object_get(e, "n_cols"));
            const size_t off = (size_t)json_integer_value(json_object_get(e, "byte_offset"));
            const struct gguf_tensor *t = gguf_find_tensor(g, name);
            if (!t) fail_msg("%s: tensor '%s' of the dequant file is not in the model", stems[si], name);
            assert_int_equal(t->ne[0], n_cols);
            /* A 3-D expert tensor [n_cols, rows, experts]: rows [0, 4) are expert 0's. */
            json_t *shape = json_object_get(e, "shape_ggml");
            assert_int_equal(json_array_size(shape), t->n_dims);
            for (size_t d = 0; d < t->n_dims; d++)
                assert_int_equal((uint64_t)json_integer_value(json_array_get(shape, d)), t->ne[d]);
            assert_true(r1 <= t->ne[1]);
            if (t->n_dims == 3) n_expert_rows += (int)(r1 - r0);
            type_seen[t->type] = true;
            assert_string_equal(tern_dtype_name(t->type), json_string_value(json_object_get(e, "type")));
            assert_true(off + (r1 - r0) * n_cols * 4 <= ref_len);
            uint64_t rb;
            assert_true(tern_dtype_row_size(t->type, n_cols, &rb));
            float *y = malloc(n_cols * sizeof(float));
            assert_non_null(y);
            for (size_t r = r0; r < r1; r++) {
                assert_true(tern_dequantize_row(t->type, (const uint8_t *)t->data + r * rb, y, n_cols));
                const char *want = ref + off + (r - r0) * n_cols * 4;
                for (size_t c = 0; c < n_cols; c++) {
                    if (memcmp(&y[c], want + 4 * c, 4) != 0) {
                        float wv;
                        memcpy(&wv, want + 4 * c, 4);
                        fail_msg("%s %s (%s) row %zu col %zu: %.9g, ggml %.9g", stems[si], name,
                                 tern_dtype_name(t->type), r, c, y[c], wv);
                    }
                }
                n_checked++;
            }
            free(y);
        }
        gguf_close(g);
        free(ref);
        json_decref(doc);
    }
    assert_true(n_checked >= 80);
    /* the kit's types, expert tensors among them */
    static const enum tern_dtype kit_types[] = {TERN_DTYPE_Q8_0, TERN_DTYPE_Q4_0, TERN_DTYPE_Q5_0, TERN_DTYPE_Q4_K,
                                                TERN_DTYPE_Q5_K, TERN_DTYPE_Q6_K, TERN_DTYPE_IQ4_XS, TERN_DTYPE_MXFP4,
                                                TERN_DTYPE_Q2_K, TERN_DTYPE_Q3_K, TERN_DTYPE_IQ2_XXS,
                                                TERN_DTYPE_IQ2_XS, TERN_DTYPE_IQ2_S, TERN_DTYPE_IQ3_XXS,
                                                TERN_DTYPE_IQ3_S, TERN_DTYPE_IQ1_S, TERN_DTYPE_IQ1_M};
    for (size_t i = 0; i < sizeof kit_types / sizeof kit_types[0]; i++)
        if (!type_seen[kit_types[i]]) fail_msg("no %s rows were checked", tern_dtype_name(kit_types[i]));
    assert_true(n_expert_rows >= 8);
    printf("  %d rows bit-identical to ggml, %d of them from 3-D expert tensors\n", n_checked, n_expert_rows);
}

/* IQ4_NL, which no kit file holds: blocks written by the reference engine's quantizer and
 * the floats ggml dequantizes them to, kept in tests/data (tests/data/mk-iq4_nl.sh says
 * how they were made and why they are a fixture). Needs no kit. */
static void test_dequant_iq4_nl_ggml_fixture(void **state) {
    (void)state;
    const char *src = getenv("TERN_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/iq4_nl-ggml.json", src && *src ? src : "..");
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    if (!doc) fail_msg("%s: %s", path, jerr.text);
    snprintf(path, sizeof path, "%s/tests/data/iq4_nl-ggml.bin", src && *src ? src : "..");
    size_t len;
    char *bin = th_read_file(path, &len);
    if (!bin) fail_msg("%s: cannot read", path);
    size_t i;
    json_t *e;
    int n_rows = 0;
    json_array_foreach(json_object_get(doc, "entries"), i, e) {
        const size_t n_cols = (size_t)json_integer_value(json_object_get(e, "n_cols"));
        const size_t r0 = (size_t)json_integer_value(json_array_get(json_object_get(e, "rows"), 0));
        const size_t r1 = (size_t)json_integer_value(json_array_get(json_object_get(e, "rows"), 1));
        const size_t qoff = (size_t)json_integer_value(json_object_get(e, "blocks_offset"));
        const size_t qbytes = (size_t)json_integer_value(json_object_get(e, "blocks_bytes"));
        const size_t foff = (size_t)json_integer_value(json_object_get(e, "f32_offset"));
        uint64_t rb;
        assert_true(tern_dtype_row_size(TERN_DTYPE_IQ4_NL, n_cols, &rb));
        assert_int_equal(qbytes, (r1 - r0) * rb);
        assert_true(qoff + qbytes <= len && foff + (r1 - r0) * n_cols * 4 <= len);
        float *y = malloc(n_cols * sizeof(float));
        assert_non_null(y);
        for (size_t r = 0; r < r1 - r0; r++) {
            assert_true(tern_dequantize_row(TERN_DTYPE_IQ4_NL, bin + qoff + r * rb, y, n_cols));
            for (size_t c = 0; c < n_cols; c++) {
                float want;
                memcpy(&want, bin + foff + (r * n_cols + c) * 4, 4);
                if (memcmp(&y[c], &want, 4) != 0)
                    fail_msg("IQ4_NL %s row %zu col %zu: %.9g, ggml %.9g",
                             json_string_value(json_object_get(e, "tensor")), r0 + r, c, y[c], want);
            }
            n_rows++;
        }
        free(y);
    }
    assert_true(n_rows >= 16);
    free(bin);
    json_decref(doc);
}

/* Every quantized tensor of the tiny-qwen3 files dequantizes to values consistent with
 * the F32 file they were made from (llama-quantize, no imatrix): per-row RMS error
 * relative to the row's RMS within the type's budget. tern's own quantizer on the same
 * rows must do about as well as llama-quantize did. */
static void test_models_consistent_with_f32(void **state) {
    (void)state;
    th_require_shared("models/tiny-qwen3-f32.gguf");
    struct gguf_file *f32;
    if (gguf_open(th_shared_path("models/tiny-qwen3-f32.gguf"), NULL, &f32) != TERN_OK)
        fail_msg("%s", tern_last_error());
    static const char *models[] = {"tiny-qwen3-q8_0", "tiny-qwen3-q4_0", "tiny-qwen3-q4_k_m", "tiny-qwen3-q6_k",
                                   "tiny-qwen3-iq4_xs"};
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        char rel[256];
        snprintf(rel, sizeof rel, "models/%s.gguf", models[mi]);
        th_require_shared(rel);
        struct gguf_file *q;
        if (gguf_open(th_shared_path(rel), NULL, &q) != TERN_OK) fail_msg("%s: %s", rel, tern_last_error());
        int n_tensors = 0;
        for (uint64_t ti = 0; ti < gguf_n_tensors(q); ti++) {
            const struct gguf_tensor *tq = gguf_tensor_at(q, ti);
            if (tq->type == TERN_DTYPE_F32) continue;
            const struct gguf_tensor *tf = gguf_find_tensor(f32, tq->name.ptr);
            assert_non_null(tf);
            assert_int_equal(tf->type, TERN_DTYPE_F32);
            assert_int_equal(tf->n_elements, tq->n_elements);
            const size_t k = tq->ne[0], rows = tq->n_elements / k;
            uint64_t rb;
            assert_true(tern_dtype_row_size(tq->type, k, &rb));
            float *y = malloc(k * sizeof(float)), *mine = malloc(k * sizeof(float));
            void *requant = malloc(rb);
            assert_true(y && mine && requant);
            double se_file = 0, se_mine = 0, sx = 0;
            /* Requantizing every row is the slow part: do it for a spread of rows. */
            const size_t requant_every = rows > 64 ? rows / 64 : 1;
            double se_file_sub = 0;
            for (size_t r = 0; r < rows; r++) {
                const float *x = (const float *)tf->data + r * k;
                assert_true(tern_dequantize_row(tq->type, (const uint8_t *)tq->data + r * rb, y, k));
                const double e = rms_rel(x, y, k);
                if (!(e <= budget(tq->type) * 1.6))
                    fail_msg("%s %s (%s) row %zu: RMS relative error %.3g vs the F32 file exceeds %.3g", models[mi],
                             tq->name.ptr, tern_dtype_name(tq->type), r, e, budget(tq->type) * 1.6);
                double rx = 0;
                for (size_t c = 0; c < k; c++) {
                    rx += (double)x[c] * x[c];
                    se_file += ((double)y[c] - x[c]) * ((double)y[c] - x[c]);
                }
                sx += rx;
                if (r % requant_every == 0) {
                    assert_true(tern_quantize_row(tq->type, x, requant, k));
                    assert_true(tern_dequantize_row(tq->type, requant, mine, k));
                    for (size_t c = 0; c < k; c++) {
                        se_mine += ((double)mine[c] - x[c]) * ((double)mine[c] - x[c]);
                        se_file_sub += ((double)y[c] - x[c]) * ((double)y[c] - x[c]);
                    }
                }
            }
            const double err_file = sqrt(se_file / sx);
            check(tq->type, tq->name.ptr, err_file, budget(tq->type));
            if (getenv("TERN_TEST_VERBOSE"))
                printf("  %s %-24s %-5s file %.4g, tern requantized / file on sampled rows %.3f\n", models[mi],
                       tq->name.ptr, tern_dtype_name(tq->type), err_file, sqrt(se_mine / se_file_sub));
            if (!(se_mine <= se_file_sub * 1.1 * 1.1))
                fail_msg("%s %s (%s): tern's quantizer error is %.3fx llama-quantize's", models[mi], tq->name.ptr,
                         tern_dtype_name(tq->type), sqrt(se_mine / se_file_sub));
            free(y);
            free(mine);
            free(requant);
            n_tensors++;
        }
        assert_true(n_tensors >= 25);
        gguf_close(q);
    }
    gguf_close(f32);
}

/* tern's IQ4_NL quantizer against llama-quantize's on the rows of the fixture (which
 * llama-quantize made from the kit's tiny-qwen3-f32): about as small an error. */
static void test_iq4_nl_quantizer_vs_reference(void **state) {
    (void)state;
    th_require_shared("models/tiny-qwen3-f32.gguf");
    const char *src = getenv("TERN_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/iq4_nl-ggml.json", src && *src ? src : "..");
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    if (!doc) fail_msg("%s: %s", path, jerr.text);
    snprintf(path, sizeof path, "%s/tests/data/iq4_nl-ggml.bin", src && *src ? src : "..");
    size_t len;
    char *bin = th_read_file(path, &len);
    assert_non_null(bin);
    struct gguf_file *f32;
    if (gguf_open(th_shared_path("models/tiny-qwen3-f32.gguf"), NULL, &f32) != TERN_OK)
        fail_msg("%s", tern_last_error());
    double se_ref = 0, se_mine = 0;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(doc, "entries"), i, e) {
        const char *name = json_string_value(json_object_get(e, "tensor"));
        const size_t n_cols = (size_t)json_integer_value(json_object_get(e, "n_cols"));
        const size_t r0 = (size_t)json_integer_value(json_array_get(json_object_get(e, "rows"), 0));
        const size_t r1 = (size_t)json_integer_value(json_array_get(json_object_get(e, "rows"), 1));
        const size_t foff = (size_t)json_integer_value(json_object_get(e, "f32_offset"));
        const struct gguf_tensor *t = gguf_find_tensor(f32, name);
        if (!t) fail_msg("tiny-qwen3-f32 has no '%s'", name);
        assert_int_equal(t->type, TERN_DTYPE_F32);
        assert_int_equal(t->ne[0], n_cols);
        uint8_t q[768 / 32 * 18];
        float y[768];
        assert_true(n_cols <= 768);
        for (size_t r = r0; r < r1; r++) {
            const float *x = (const float *)t->data + r * n_cols;
            assert_true(tern_quantize_row(TERN_DTYPE_IQ4_NL, x, q, n_cols));
            assert_true(tern_dequantize_row(TERN_DTYPE_IQ4_NL, q, y, n_cols));
            for (size_t c = 0; c < n_cols; c++) {
                float ref;
                memcpy(&ref, bin + foff + ((r - r0) * n_cols + c) * 4, 4);
                se_ref += ((double)ref - x[c]) * ((double)ref - x[c]);
                se_mine += ((double)y[c] - x[c]) * ((double)y[c] - x[c]);
            }
        }
    }
    const double ratio = sqrt(se_mine / se_ref);
    printf("  IQ4_NL: tern's quantizer error / llama-quantize's on the fixture rows: %.3f\n", ratio);
    if (!(ratio <= 1.1)) fail_msg("tern's IQ4_NL quantizer error is %.3fx llama-quantize's", ratio);
    gguf_close(f32);
    free(bin);
    json_decref(doc);
}

/* Two binaries from this file: test-quant (self-contained) and test-quant-shared (argument
 * "shared": the tests that need the shared kit, skipped as a whole when it is absent). */
int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isa_env_forces_portable),
        cmocka_unit_test(test_block_sizes_match_dtype_table),
        cmocka_unit_test(test_dequant_q4_0_q4_1_layout),
        cmocka_unit_test(test_dequant_q5_layout),
        cmocka_unit_test(test_dequant_k4_k5_layout),
        cmocka_unit_test(test_dequant_q6_k_layout),
        cmocka_unit_test(test_dequant_q8_and_floats),
        cmocka_unit_test(test_dequant_iq4_layout),
        cmocka_unit_test(test_dequant_mxfp4_layout),
        cmocka_unit_test(test_round_trip_random),
        cmocka_unit_test(test_round_trip_edges),
        cmocka_unit_test(test_round_trip_exact_grids),
        cmocka_unit_test(test_lowbit_round_trip),
        cmocka_unit_test(test_odd_lengths_refused),
        cmocka_unit_test(test_activation_blocks),
        cmocka_unit_test(test_dequant_iq4_nl_ggml_fixture),
    };
    const struct CMUnitTest shared_tests[] = {
        cmocka_unit_test(test_conformance_dequant_bit_exact),
        cmocka_unit_test(test_models_consistent_with_f32),
        cmocka_unit_test(test_iq4_nl_quantizer_vs_reference),
    };
    if (argc > 1 && !strcmp(argv[1], "shared")) {
        th_require_shared("conformance/dequant");
        return cmocka_run_group_tests(shared_tests, NULL, NULL);
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
