/* kernels: the exactness contract (y[t][r] independent of n_tok, r0/r1 and the
 * position of t in the batch: memcmp equality against one-row-at-a-time results), each
 * kernel against a double-precision dot of the dequantized operands, each AVX2 kernel
 * against its portable twin on odd sizes and edge values, and activation preparation
 * (identical bytes on every ISA). */
#include "harness.h"

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "util/dtype.h"
#include "util/fp16.h"
#include "util/mem.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
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

static const enum tern_dtype mm_types[] = {
    TERN_DTYPE_F32,  TERN_DTYPE_F16,  TERN_DTYPE_BF16, TERN_DTYPE_Q8_0, TERN_DTYPE_Q4_0, TERN_DTYPE_Q4_1,
    TERN_DTYPE_Q5_0, TERN_DTYPE_Q5_1, TERN_DTYPE_Q4_K, TERN_DTYPE_Q5_K, TERN_DTYPE_Q6_K,
    TERN_DTYPE_IQ4_NL, TERN_DTYPE_IQ4_XS, TERN_DTYPE_MXFP4, TERN_DTYPE_Q2_K, TERN_DTYPE_Q3_K, TERN_DTYPE_IQ2_XXS,
    TERN_DTYPE_IQ2_XS, TERN_DTYPE_IQ2_S, TERN_DTYPE_IQ3_XXS, TERN_DTYPE_IQ3_S, TERN_DTYPE_IQ1_S, TERN_DTYPE_IQ1_M,
};
#define N_TYPES (sizeof mm_types / sizeof mm_types[0])

static enum tern_isa isas[2];
static int n_isas;

static int setup(void **state) {
    (void)state;
    n_isas = 0;
    isas[n_isas++] = TERN_ISA_PORTABLE;
    if (tern_kernels_set_isa(TERN_ISA_AVX2)) isas[n_isas++] = TERN_ISA_AVX2;
    else printf("note: this CPU lacks AVX2/FMA/F16C; only the portable kernels are tested\n");
    return 0;
}

static size_t row_bytes(enum tern_dtype t, size_t k) {
    uint64_t b;
    assert_true(tern_dtype_row_size(t, k, &b));
    return (size_t)b;
}

/* ---- weight generators ------------------------------------------------------------------ */

enum wmode {
    W_GAUSS,     /* quantized N(0, s) rows, s varying per row */
    W_RAW,       /* random bits in every quant field, normal scales of both signs */
    W_RAW_SUB,   /* random bits, subnormal half scales */
    W_RAW_ZERO,  /* random bits, zero scales */
    W_ALL_FF,    /* every quant byte 0xFF (largest levels), scales 1 */
    W_ALL_80,    /* every quant byte 0x80 (-128 for Q8_0), scales -1 */
    W_N_MODES
};

static tern_fp16 scale_for(enum wmode m) {
    switch (m) {
    case W_RAW: return tern_f32_to_fp16((rng_u32() & 1 ? -1.0f : 1.0f) * (0.001f + rng_unit() * 0.05f));
    case W_RAW_SUB: return (tern_fp16)((rng_u32() & 0x3FF) | (rng_u32() & 1 ? 0x8000 : 0));
    case W_RAW_ZERO: return 0;
    case W_ALL_FF: return 0x3C00;  /* 1 */
    default: return 0xBC00;        /* -1 */
    }
}

/* Offsets of the half scale fields in each block type. */
static void scale_fields(enum tern_dtype t, int off[2], int *n) {
    *n = 1;
    off[0] = 0;
    switch (t) {
    case TERN_DTYPE_Q4_1: case TERN_DTYPE_Q5_1: case TERN_DTYPE_Q4_K: case TERN_DTYPE_Q5_K:
        *n = 2;
        off[1] = 2;
        break;
    case TERN_DTYPE_Q6_K: off[0] = 208; break;
    case TERN_DTYPE_Q2_K:
        *n = 2;
        off[0] = 80;
        off[1] = 82;
        break;
    case TERN_DTYPE_Q3_K: off[0] = 108; break;
    case TERN_DTYPE_IQ1_M: *n = 0; break; /* its half is spread over the scale words */
    default: break;
    }
}

static void make_float_row(enum tern_dtype t, enum wmode m, size_t k, uint8_t *dst) {
    float *x = malloc(k * sizeof(float));
    assert_non_null(x);
    for (size_t i = 0; i < k; i++) {
        switch (m) {
        case W_GAUSS: x[i] = rng_gauss() * 0.05f; break;
        case W_RAW: x[i] = rng_gauss() * ldexpf(1.0f, (int)(rng_u32() % 24) - 12); break;
        case W_RAW_SUB: /* subnormal F32 (and tiny halves) */
            x[i] = (t == TERN_DTYPE_F32 ? 1e-40f : t == TERN_DTYPE_F16 ? 3e-6f : 1e-39f) * rng_gauss();
            break;
        case W_RAW_ZERO: x[i] = 0.0f; break;
        case W_ALL_FF: x[i] = t == TERN_DTYPE_F32 ? 3e30f : t == TERN_DTYPE_F16 ? 65504.0f : 3e30f; break;
        default: x[i] = (i & 1) ? -65504.0f : 65504.0f; break;
        }
    }
    assert_true(tern_quantize_row(t, x, dst, k));
    free(x);
}

static void make_weights(enum tern_dtype t, enum wmode m, size_t rows, size_t k, uint8_t *w) {
    const size_t rb = row_bytes(t, k);
    const struct tern_dtype_info *info = tern_dtype_info(t);
    if (info->blck_size == 1) {
        for (size_t r = 0; r < rows; r++) make_float_row(t, m, k, w + r * rb);
        return;
    }
    if (m == W_GAUSS) {
        float *x = malloc(k * sizeof(float));
        assert_non_null(x);
        for (size_t r = 0; r < rows; r++) {
            const float s = 0.01f + rng_unit() * 0.1f;
            for (size_t i = 0; i < k; i++) x[i] = rng_gauss() * s;
            assert_true(tern_quantize_row(t, x, w + r * rb, k));
        }
        free(x);
        return;
    }
    const size_t nb = rows * (k / info->blck_size);
    for (size_t b = 0; b < nb; b++) {
        uint8_t *blk = w + b * info->type_size;
        for (uint32_t i = 0; i < info->type_size; i++)
            blk[i] = m == W_ALL_FF ? 0xFF : m == W_ALL_80 ? 0x80 : (uint8_t)rng_u32();
        if (t == TERN_DTYPE_MXFP4) {
            /* the E8M0 byte: normal scales of many sizes, small ones (whose products with the
             * activation scales stay normal floats, as the double reference needs), the
             * smallest (2^-128, subnormal) with zero levels (codes 0 and 8, +0 and -0), 1 */
            if (m == W_RAW) blk[0] = (uint8_t)(100 + rng_u32() % 50);
            else if (m == W_RAW_SUB) blk[0] = (uint8_t)(40 + rng_u32() % 20);
            else if (m == W_RAW_ZERO) {
                blk[0] = (uint8_t)(rng_u32() & 1);
                for (uint32_t i = 1; i < info->type_size; i++) blk[i] &= 0x88;
            } else blk[0] = 128;
            continue;
        }
        int off[2], n;
        scale_fields(t, off, &n);
        for (int f = 0; f < n; f++) {
            const tern_fp16 h = scale_for(m);
            memcpy(blk + off[f], &h, 2);
        }
        if (t == TERN_DTYPE_IQ1_M) { /* the half's nibbles: tops of the four scale words */
            const tern_fp16 h = scale_for(m);
            for (int wi = 0; wi < 4; wi++)
                blk[48 + 2 * wi + 1] = (uint8_t)((blk[48 + 2 * wi + 1] & 0x0F) | (((h >> (4 * wi)) & 0xF) << 4));
        }
    }
}

/* ---- activations ------------------------------------------------------------------------ */

enum amode { A_GAUSS, A_ZERO, A_CONST_BIG, A_ALT_MAX, A_TINY, A_N_MODES };

static void make_act_floats(enum amode m, size_t k, float *x) {
    for (size_t i = 0; i < k; i++) {
        switch (m) {
        case A_GAUSS: x[i] = rng_gauss() * (0.5f + rng_unit()); break;
        case A_ZERO: x[i] = 0.0f; break;
        case A_CONST_BIG: x[i] = 1000.0f; break;
        case A_ALT_MAX: x[i] = (i % 3) ? -7.0f : 7.0f; break;
        default: x[i] = rng_gauss() * 1e-20f; break;
        }
    }
}

/* Prepares n rows of activations for wtype; returns the buffer (caller frees). */
static uint8_t *prepare_acts(enum tern_dtype wt, const float *x, size_t n, size_t k, size_t *abytes) {
    *abytes = tern_act_row_bytes(wt, k);
    uint8_t *a = malloc(n * *abytes + 1);
    assert_non_null(a);
    for (size_t t = 0; t < n; t++) tern_act_prepare(wt, x + t * k, a + t * *abytes, k);
    return a;
}

static size_t k_multiple(enum tern_dtype t) { return tern_matmul_k_multiple(t); }

/* ---- 1. exactness: batching never changes a bit ------------------------------------------ */

#define N_TOK_ACT 24
#define MAX_BATCH 19

static void exactness_case(enum tern_dtype t, size_t rows, size_t k, bool full_sweep) {
    const size_t rb = row_bytes(t, k);
    uint8_t *w = malloc(rows * rb);
    float *x = malloc(N_TOK_ACT * k * sizeof(float));
    assert_non_null(w);
    assert_non_null(x);
    make_weights(t, W_GAUSS, rows, k, w);
    for (size_t i = 0; i < N_TOK_ACT * k; i++) x[i] = rng_gauss();
    size_t ab;
    uint8_t *a = prepare_acts(t, x, N_TOK_ACT, k, &ab);
    const size_t ldy = rows + 3;
    float *yref = malloc(N_TOK_ACT * rows * sizeof(float));
    float *y = malloc(MAX_BATCH * ldy * sizeof(float));
    assert_non_null(yref);
    assert_non_null(y);
    /* reference: one token, one row per call */
    for (size_t tok = 0; tok < N_TOK_ACT; tok++)
        for (size_t r = 0; r < rows; r++)
            tern_matmul(t, w, rb, k, a + tok * ab, ab, 1, yref + tok * rows, rows, r, r + 1);
    for (size_t n = 1; n <= MAX_BATCH; n++) {
        if (!full_sweep && n % 4 != 1 && n != MAX_BATCH) continue;
        const size_t t0 = (n * 5) % (N_TOK_ACT - n + 1);
        const size_t pieces = 1 + n % 3;
        memset(y, 0x7F, MAX_BATCH * ldy * sizeof(float));
        for (size_t p = 0; p < pieces; p++) {
            const size_t r0 = rows * p / pieces, r1 = rows * (p + 1) / pieces;
            tern_matmul(t, w, rb, k, a + t0 * ab, ab, n, y, ldy, r0, r1);
        }
        for (size_t tok = 0; tok < n; tok++) {
            for (size_t r = 0; r < rows; r++) {
                const float got = y[tok * ldy + r], want = yref[(t0 + tok) * rows + r];
                if (memcmp(&got, &want, sizeof got) != 0)
                    fail_msg("%s isa=%s rows=%zu k=%zu n_tok=%zu t0=%zu pieces=%zu: y[%zu][%zu] = %.9g, "
                             "one-at-a-time %.9g",
                             tern_dtype_name(t), tern_isa_name(tern_kernels_isa()), rows, k, n, t0, pieces,
                             tok, r, got, want);
            }
            for (size_t r = rows; r < ldy; r++) {
                uint32_t bits;
                memcpy(&bits, &y[tok * ldy + r], 4);
                assert_int_equal(bits, 0x7F7F7F7Fu); /* nothing written outside [r0, r1) */
            }
        }
    }
    free(w);
    free(x);
    free(a);
    free(yref);
    free(y);
}

static void test_exactness(void **state) {
    (void)state;
    static const size_t rows_list[] = {1, 3, 17, 67};
    for (int ii = 0; ii < n_isas; ii++) {
        assert_true(tern_kernels_set_isa(isas[ii]));
        for (size_t ti = 0; ti < N_TYPES; ti++) {
            const enum tern_dtype t = mm_types[ti];
            const size_t m = k_multiple(t);
            size_t ks[3];
            int nk;
            if (m == 1) {
                ks[0] = 5, ks[1] = 67, ks[2] = 264, nk = 3;
            } else if (m == TERN_QK) {
                ks[0] = 32, ks[1] = 96, ks[2] = 544, nk = 3;
            } else {
                ks[0] = 256, ks[1] = 768, nk = 2;
            }
            for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++)
                for (int ki = 0; ki < nk; ki++)
                    exactness_case(t, rows_list[ri], ks[ki], rows_list[ri] <= 17 || ki == 0);
        }
    }
    tern_kernels_set_isa(isas[n_isas - 1]);
}

/* ---- 2. correctness against double precision, and twins against each other ------------- */

/* y for n_tok rows of activations, on the given ISA. */
static void run_mm(enum tern_isa isa, enum tern_dtype t, const uint8_t *w, size_t rows, size_t k,
                   const uint8_t *a, size_t ab, size_t n, float *y) {
    assert_true(tern_kernels_set_isa(isa));
    tern_matmul(t, w, row_bytes(t, k), k, a, ab, n, y, rows, 0, rows);
}

static bool same_bits_on_every_isa(enum tern_dtype t) {
    switch (t) {
    case TERN_DTYPE_Q2_K: case TERN_DTYPE_Q3_K: case TERN_DTYPE_IQ2_XXS: case TERN_DTYPE_IQ2_XS:
    case TERN_DTYPE_IQ2_S: case TERN_DTYPE_IQ3_XXS: case TERN_DTYPE_IQ3_S: case TERN_DTYPE_IQ1_S:
    case TERN_DTYPE_IQ1_M: return true;
    default: break;
    }
    return t == TERN_DTYPE_IQ4_NL || t == TERN_DTYPE_IQ4_XS || t == TERN_DTYPE_MXFP4;
}

static void check_case(enum tern_dtype t, enum wmode wm, enum amode am, size_t rows, size_t k, size_t n) {
    const size_t rb = row_bytes(t, k);
    uint8_t *w = malloc(rows * rb);
    float *x = malloc(n * k * sizeof(float));
    float *wd = malloc(k * sizeof(float)), *ad = malloc(n * k * sizeof(float));
    float *y[2] = {malloc(n * rows * sizeof(float)), malloc(n * rows * sizeof(float))};
    assert_true(w && x && wd && ad && y[0] && y[1]);
    make_weights(t, wm, rows, k, w);
    for (size_t tok = 0; tok < n; tok++) make_act_floats(am, k, x + tok * k);
    size_t ab;
    uint8_t *a = prepare_acts(t, x, n, k, &ab);
    for (size_t tok = 0; tok < n; tok++)
        assert_true(tern_dequantize_row(tern_act_type(t), a + tok * ab, ad + tok * k, k));
    for (int ii = 0; ii < n_isas; ii++) run_mm(isas[ii], t, w, rows, k, a, ab, n, y[ii]);
    for (size_t r = 0; r < rows; r++) {
        assert_true(tern_dequantize_row(t, w + r * rb, wd, k));
        for (size_t tok = 0; tok < n; tok++) {
            double ref = 0, mag = 0;
            for (size_t i = 0; i < k; i++) {
                ref += (double)wd[i] * ad[tok * k + i];
                mag += fabs((double)wd[i] * ad[tok * k + i]);
            }
            /* Integer parts are exact; what remains is float rounding of block scales and
             * of the accumulation, far below 1e-4 of the magnitude. A wrong element, scale
             * or offset shows up at the size of the terms themselves. */
            const double tol = 1e-4 * mag + (double)k * 1.5e-45; /* + float underflow */
            for (int ii = 0; ii < n_isas; ii++) {
                const double got = y[ii][tok * rows + r];
                if (!(fabs(got - ref) <= tol))
                    fail_msg("%s (weights mode %d, acts mode %d) isa=%s rows=%zu k=%zu: y[%zu][%zu] = %.9g, "
                             "double reference %.9g (tolerance %.3g)",
                             tern_dtype_name(t), wm, am, tern_isa_name(isas[ii]), rows, k, tok, r, got, ref, tol);
            }
            /* The IQ4 twins perform the same operations: the same bits (docs/kernels.md). */
            if (n_isas == 2 && same_bits_on_every_isa(t) &&
                memcmp(&y[0][tok * rows + r], &y[1][tok * rows + r], sizeof(float)) != 0)
                fail_msg("%s (weights mode %d, acts mode %d) rows=%zu k=%zu: avx2 y[%zu][%zu] = %.9g (%a), portable "
                         "%.9g (%a): not the same bits",
                         tern_dtype_name(t), wm, am, rows, k, tok, r, y[1][tok * rows + r], y[1][tok * rows + r],
                         y[0][tok * rows + r], y[0][tok * rows + r]);
            if (n_isas == 2) {
                const double d = fabs((double)y[0][tok * rows + r] - y[1][tok * rows + r]);
                if (!(d <= 1e-5 * mag))
                    fail_msg("%s avx2 vs portable twin: y[%zu][%zu] %.9g vs %.9g (magnitude %.3g)",
                             tern_dtype_name(t), tok, r, y[1][tok * rows + r], y[0][tok * rows + r], mag);
            }
        }
    }
    free(w);
    free(x);
    free(wd);
    free(ad);
    free(a);
    free(y[0]);
    free(y[1]);
}

static void test_against_double_and_twin(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const enum tern_dtype t = mm_types[ti];
        const size_t m = k_multiple(t);
        const size_t k = m == 1 ? 1027 : m == TERN_QK ? 32 * 37 : 256 * 5;
        for (int wm = 0; wm < W_N_MODES; wm++)
            for (int am = 0; am < A_N_MODES; am++)
                check_case(t, (enum wmode)wm, (enum amode)am, 7, k, 5);
        check_case(t, W_GAUSS, A_GAUSS, 1, m == 1 ? 9 : m, 1); /* one block */
    }
    tern_kernels_set_isa(isas[n_isas - 1]);
}

/* The IQ4 kernels give the same bits on every ISA: odd row counts and token counts (GEMV
 * tiles, GEMM tiles and their edges), several k, random, gaussian and extreme blocks. */
static void test_iq4_twins_same_bits(void **state) {
    (void)state;
    if (n_isas < 2) {
        printf("note: one ISA only; nothing to compare\n");
        return;
    }
    static const size_t rows_list[] = {1, 2, 3, 5, 67};
    static const size_t n_list[] = {1, 2, 3, 4, 5, 19};
    static const enum tern_dtype types[] = {TERN_DTYPE_IQ4_NL, TERN_DTYPE_IQ4_XS, TERN_DTYPE_MXFP4, TERN_DTYPE_Q2_K,
                                            TERN_DTYPE_Q3_K,   TERN_DTYPE_IQ2_XXS, TERN_DTYPE_IQ2_XS,
                                            TERN_DTYPE_IQ2_S,  TERN_DTYPE_IQ3_XXS, TERN_DTYPE_IQ3_S,
                                            TERN_DTYPE_IQ1_S,  TERN_DTYPE_IQ1_M};
    int n_compared = 0;
    for (size_t ti = 0; ti < TERN_ARRAY_LEN(types); ti++) {
        const enum tern_dtype t = types[ti];
        const size_t m = k_multiple(t);
        const size_t ks[3] = {m, 3 * m, 17 * m};
        for (size_t ri = 0; ri < TERN_ARRAY_LEN(rows_list); ri++) {
            for (size_t ki = 0; ki < 3; ki++) {
                const size_t rows = rows_list[ri], k = ks[ki], rb = row_bytes(t, k);
                const enum wmode wm = (enum wmode)((ri + ki) % W_N_MODES);
                uint8_t *w = malloc(rows * rb);
                float *x = malloc(19 * k * sizeof(float));
                assert_true(w && x);
                make_weights(t, wm, rows, k, w);
                for (size_t tok = 0; tok < 19; tok++) make_act_floats((enum amode)((tok + ki) % A_N_MODES), k, x + tok * k);
                size_t ab;
                uint8_t *a = prepare_acts(t, x, 19, k, &ab);
                float *y[2] = {malloc(19 * rows * sizeof(float)), malloc(19 * rows * sizeof(float))};
                assert_true(y[0] && y[1]);
                for (size_t ni = 0; ni < TERN_ARRAY_LEN(n_list); ni++) {
                    const size_t n = n_list[ni];
                    for (int ii = 0; ii < 2; ii++) run_mm(isas[ii], t, w, rows, k, a, ab, n, y[ii]);
                    for (size_t i = 0; i < n * rows; i++) {
                        if (memcmp(&y[0][i], &y[1][i], sizeof(float)) != 0)
                            fail_msg("%s rows=%zu k=%zu n_tok=%zu weights mode %d: y[%zu][%zu] avx2 %a, portable %a",
                                     tern_dtype_name(t), rows, k, n, wm, i / rows, i % rows, y[1][i], y[0][i]);
                        n_compared++;
                    }
                }
                free(w), free(x), free(a), free(y[0]), free(y[1]);
            }
        }
    }
    assert_true(n_compared > 1000);
    tern_kernels_set_isa(isas[n_isas - 1]);
}

/* The AVX-512 tiles for batches give the AVX2 tiles' bits: every type (those without such
 * tiles trivially), row counts that leave every tile shape and a last odd row, token counts
 * from a single token (the one-row AVX-512 GEMV for Q4_K, Q5_K, Q6_K and IQ4_XS, the tiles'
 * one-token column for the other tiled types) to several full tiles and their edges,
 * several k (F16 also one that is not a multiple of 8), every weight and activation mode. */
static void test_avx512_tiles_same_bits(void **state) {
    (void)state;
    if (n_isas < 2 || !tern_kernels_avx512_available()) {
        printf("note: no AVX-512 tiles on this CPU; nothing to compare\n");
        return;
    }
    static const size_t rows_list[] = {1, 2, 3, 4, 5, 6, 7, 13, 67};
    static const size_t n_list[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 19};
    int n_compared = 0;
    assert_true(tern_kernels_set_isa(TERN_ISA_AVX2));
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const enum tern_dtype t = mm_types[ti];
        const size_t m = k_multiple(t);
        const size_t ks[3] = {m == 1 ? 1027 : m, m == 1 ? 64 : 3 * m, m == 1 ? 1024 : 9 * m};
        for (size_t ri = 0; ri < TERN_ARRAY_LEN(rows_list); ri++) {
            for (size_t ki = 0; ki < 3; ki++) {
                const size_t rows = rows_list[ri], k = ks[ki], rb = row_bytes(t, k);
                const enum wmode wm = (enum wmode)((ri + ki) % W_N_MODES);
                uint8_t *w = malloc(rows * rb);
                float *x = malloc(19 * k * sizeof(float));
                assert_true(w && x);
                make_weights(t, wm, rows, k, w);
                for (size_t tok = 0; tok < 19; tok++) make_act_floats((enum amode)((tok + ri) % A_N_MODES), k, x + tok * k);
                size_t ab;
                uint8_t *a = prepare_acts(t, x, 19, k, &ab);
                float *y[2] = {malloc(19 * rows * sizeof(float)), malloc(19 * rows * sizeof(float))};
                assert_true(y[0] && y[1]);
                for (size_t ni = 0; ni < TERN_ARRAY_LEN(n_list); ni++) {
                    const size_t n = n_list[ni];
                    for (int wide = 0; wide < 2; wide++) {
                        assert_true(tern_kernels_set_avx512(wide));
                        tern_matmul(t, w, rb, k, a, ab, n, y[wide], rows, 0, rows);
                    }
                    for (size_t i = 0; i < n * rows; i++) {
                        if (memcmp(&y[0][i], &y[1][i], sizeof(float)) != 0)
                            fail_msg("%s rows=%zu k=%zu n_tok=%zu weights mode %d: y[%zu][%zu] avx512 %a, avx2 %a",
                                     tern_dtype_name(t), rows, k, n, wm, i / rows, i % rows, y[1][i], y[0][i]);
                        n_compared++;
                    }
                }
                free(w), free(x), free(a), free(y[0]), free(y[1]);
            }
        }
    }
    assert_true(n_compared > 10000);
    assert_true(tern_kernels_set_avx512(true));
    tern_kernels_set_isa(isas[n_isas - 1]);
}

/* Outputs are exactly zero when either operand is. */
static void test_zero_operands(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const enum tern_dtype t = mm_types[ti];
        const size_t k = k_multiple(t) == 1 ? 40 : 512;
        const size_t rb = row_bytes(t, k);
        uint8_t *w = calloc(5, rb);
        float x[512 * 3];
        assert_non_null(w);
        make_weights(t, W_GAUSS, 5, k, w);
        memset(x, 0, sizeof x);
        size_t ab;
        uint8_t *a = prepare_acts(t, x, 3, k, &ab);
        for (int ii = 0; ii < n_isas; ii++) {
            float y[15];
            run_mm(isas[ii], t, w, 5, k, a, ab, 3, y);
            for (int i = 0; i < 15; i++) assert_true(y[i] == 0.0f);
        }
        free(a);
        free(w);
    }
    tern_kernels_set_isa(isas[n_isas - 1]);
}

/* ---- 3. activation preparation ----------------------------------------------------------- */

static void test_act_prepare_same_bytes_on_every_isa(void **state) {
    (void)state;
    const enum tern_dtype wts[] = {TERN_DTYPE_F32, TERN_DTYPE_Q8_0, TERN_DTYPE_Q4_K};
    const size_t k = 1024;
    static float x[1024];
    for (size_t wi = 0; wi < 3; wi++) {
        for (int am = 0; am < A_N_MODES + 2; am++) {
            if (am < A_N_MODES) make_act_floats((enum amode)am, k, x);
            else if (am == A_N_MODES) /* values on rounding ties and block maxima */
                for (size_t i = 0; i < k; i++) x[i] = (float)((int)(i % 255) - 127) * 0.5f;
            else /* NaN and infinity inside, must not crash; bytes still identical */
                for (size_t i = 0; i < k; i++) x[i] = i == 17 ? NAN : i == 300 ? -INFINITY : rng_gauss();
            const size_t ab = tern_act_row_bytes(wts[wi], k);
            uint8_t *out[2] = {malloc(ab), malloc(ab)};
            assert_true(out[0] && out[1]);
            for (int ii = 0; ii < n_isas; ii++) {
                assert_true(tern_kernels_set_isa(isas[ii]));
                tern_act_prepare(wts[wi], x, out[ii], k);
            }
            if (n_isas == 2 && memcmp(out[0], out[1], ab) != 0)
                fail_msg("act prepare for %s weights (mode %d) differs between ISAs", tern_dtype_name(wts[wi]), am);
            free(out[0]);
            free(out[1]);
        }
    }
    assert_int_equal(tern_act_type(TERN_DTYPE_Q4_1), TERN_DTYPE_Q8_0);
    assert_int_equal(tern_act_type(TERN_DTYPE_Q6_K), TERN_DTYPE_Q8_K);
    assert_int_equal(tern_act_type(TERN_DTYPE_BF16), TERN_DTYPE_F32);
    assert_int_equal(tern_act_row_bytes(TERN_DTYPE_Q8_0, 64), 68);
    assert_int_equal(tern_act_row_bytes(TERN_DTYPE_Q5_K, 512), 584);
    assert_int_equal(tern_act_row_bytes(TERN_DTYPE_F16, 10), 40);
    tern_kernels_set_isa(isas[n_isas - 1]);
}

static void test_dispatch(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TYPES; ti++) assert_true(tern_matmul_supported(mm_types[ti]));
    assert_false(tern_matmul_supported(TERN_DTYPE_TQ1_0));
    assert_false(tern_matmul_supported(TERN_DTYPE_TQ2_0));
    assert_true(tern_matmul_supported(TERN_DTYPE_IQ4_NL));
    assert_true(tern_matmul_supported(TERN_DTYPE_IQ4_XS));
    assert_int_equal(tern_act_type(TERN_DTYPE_IQ4_NL), TERN_DTYPE_Q8_0);
    assert_int_equal(tern_act_type(TERN_DTYPE_IQ4_XS), TERN_DTYPE_Q8_K);
    assert_int_equal(tern_matmul_k_multiple(TERN_DTYPE_IQ4_NL), 32);
    assert_int_equal(tern_matmul_k_multiple(TERN_DTYPE_IQ4_XS), 256);
    assert_false(tern_matmul_supported((enum tern_dtype)77));
    assert_int_equal(tern_matmul_k_multiple(TERN_DTYPE_Q6_K), 256);
    assert_int_equal(tern_matmul_k_multiple(TERN_DTYPE_F16), 1);
    assert_string_equal(tern_isa_name(TERN_ISA_PORTABLE), "portable");
    assert_true(tern_kernels_set_isa(TERN_ISA_PORTABLE));
    assert_int_equal(tern_kernels_isa(), TERN_ISA_PORTABLE);
    tern_kernels_set_isa(isas[n_isas - 1]);
}


/* ---- 4. threads: concurrent calls on disjoint rows give the single-call bytes -------- */

struct mm_thread_arg {
    enum tern_dtype t;
    const uint8_t *w, *a;
    size_t rb, k, ab, n, rows, r0, r1;
    float *y;
};

static void *mm_thread(void *p) {
    const struct mm_thread_arg *m = p;
    for (int rep = 0; rep < 3; rep++)
        tern_matmul(m->t, m->w, m->rb, m->k, m->a, m->ab, m->n, m->y, m->rows, m->r0, m->r1);
    return NULL;
}

static void test_threads_split_rows(void **state) {
    (void)state;
    const enum tern_dtype types[] = {TERN_DTYPE_F16, TERN_DTYPE_Q8_0, TERN_DTYPE_Q4_K, TERN_DTYPE_Q6_K};
    /* 7 tokens (the GEMM tiles) and a single token (the GEMV, which for the K-quants on
     * AVX-512 takes its own row ranges [r0, r1)) */
    for (size_t ci = 0; ci < 2 * sizeof types / sizeof types[0]; ci++) {
        const enum tern_dtype t = types[ci / 2];
        const size_t rows = 61, k = 512, n = ci % 2 ? 1 : 7, rb = row_bytes(t, k);
        uint8_t *w = malloc(rows * rb);
        float *x = malloc(n * k * sizeof(float));
        float *y1 = malloc(n * rows * sizeof(float)), *y4 = malloc(n * rows * sizeof(float));
        assert_true(w && x && y1 && y4);
        make_weights(t, W_GAUSS, rows, k, w);
        for (size_t i = 0; i < n * k; i++) x[i] = rng_gauss();
        size_t ab;
        uint8_t *a = prepare_acts(t, x, n, k, &ab);
        tern_matmul(t, w, rb, k, a, ab, n, y1, rows, 0, rows);
        pthread_t th[4];
        struct mm_thread_arg args[4];
        for (int i = 0; i < 4; i++) {
            args[i] = (struct mm_thread_arg){t, w, a, rb, k, ab, n, rows, rows * (size_t)i / 4, rows * (size_t)(i + 1) / 4, y4};
            assert_int_equal(pthread_create(&th[i], NULL, mm_thread, &args[i]), 0);
        }
        for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
        assert_memory_equal(y1, y4, n * rows * sizeof(float));
        free(w);
        free(x);
        free(a);
        free(y1);
        free(y4);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dispatch),
        cmocka_unit_test(test_act_prepare_same_bytes_on_every_isa),
        cmocka_unit_test(test_zero_operands),
        cmocka_unit_test(test_against_double_and_twin),
        cmocka_unit_test(test_iq4_twins_same_bits),
        cmocka_unit_test(test_avx512_tiles_same_bits),
        cmocka_unit_test(test_exactness),
        cmocka_unit_test(test_threads_split_rows),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
