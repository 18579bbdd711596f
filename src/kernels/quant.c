/* Reference (portable) dequantization and quantization of every supported type.
 *
 * Dequantization follows ggml's formulas in ggml's order of operations, so that the
 * values are bit-identical to ggml's (checked against shared/conformance/dequant):
 * e.g. Q4_K forms d*sc and dmin*m first and then computes (d*sc)*q - dmin*m.
 *
 * Quantization is tern's own: each block (or sub-block) tries a small set of scales
 * around the obvious one, refits the least-squares scale (and offset) for each
 * candidate's integer levels, and keeps the candidate with the smallest squared error;
 * the final levels are recomputed from the scales as they are stored (half precision,
 * 6- or 8-bit sub-block scales), so the stored scale is the one the levels were
 * rounded against. */
#include "kernels/kernels.h"
#include "kernels/lowbit.h"
#include "kernels/quant.h"
#include "util/status.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ---- dequantization --------------------------------------------------------------- */

static void dequant_q4_0(const struct tern_block_q4_0 *x, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++) {
        const float d = tern_fp16_to_f32(x[i].d);
        for (int j = 0; j < TERN_QK / 2; j++) {
            const int x0 = (x[i].qs[j] & 0x0F) - 8;
            const int x1 = (x[i].qs[j] >> 4) - 8;
            y[i * TERN_QK + j] = (float)x0 * d;
            y[i * TERN_QK + j + TERN_QK / 2] = (float)x1 * d;
        }
    }
}

static void dequant_q4_1(const struct tern_block_q4_1 *x, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++) {
        const float d = tern_fp16_to_f32(x[i].d);
        const float m = tern_fp16_to_f32(x[i].m);
        for (int j = 0; j < TERN_QK / 2; j++) {
            y[i * TERN_QK + j] = (float)(x[i].qs[j] & 0x0F) * d + m;
            y[i * TERN_QK + j + TERN_QK / 2] = (float)(x[i].qs[j] >> 4) * d + m;
        }
    }
}

static uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void dequant_q5_0(const struct tern_block_q5_0 *x, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++) {
        const float d = tern_fp16_to_f32(x[i].d);
        const uint32_t qh = load_u32(x[i].qh);
        for (int j = 0; j < TERN_QK / 2; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1) << 4;
            const int x0 = ((x[i].qs[j] & 0x0F) | h0) - 16;
            const int x1 = ((x[i].qs[j] >> 4) | h1) - 16;
            y[i * TERN_QK + j] = (float)x0 * d;
            y[i * TERN_QK + j + TERN_QK / 2] = (float)x1 * d;
        }
    }
}

static void dequant_q5_1(const struct tern_block_q5_1 *x, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++) {
        const float d = tern_fp16_to_f32(x[i].d);
        const float m = tern_fp16_to_f32(x[i].m);
        const uint32_t qh = load_u32(x[i].qh);
        for (int j = 0; j < TERN_QK / 2; j++) {
            const int x0 = (x[i].qs[j] & 0x0F) | ((int)((qh >> j) & 1) << 4);
            const int x1 = (x[i].qs[j] >> 4) | ((int)((qh >> (j + 16)) & 1) << 4);
            y[i * TERN_QK + j] = (float)x0 * d + m;
            y[i * TERN_QK + j + TERN_QK / 2] = (float)x1 * d + m;
        }
    }
}

static void dequant_q8_0(const struct tern_block_q8_0 *x, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++) {
        const float d = tern_fp16_to_f32(x[i].d);
        for (int j = 0; j < TERN_QK; j++) y[i * TERN_QK + j] = (float)x[i].qs[j] * d;
    }
}

static void dequant_q8_1(const struct tern_block_q8_1 *x, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++) {
        const float d = tern_fp16_to_f32(x[i].d);
        for (int j = 0; j < TERN_QK; j++) y[i * TERN_QK + j] = (float)x[i].qs[j] * d;
    }
}

static void dequant_q4_k(const struct tern_block_q4_k *x, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++) {
        const float d = tern_fp16_to_f32(x[i].d);
        const float dmin = tern_fp16_to_f32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int c = 0; c < 4; c++) {
            uint8_t sc, m;
            tern_k4_scale_min(x[i].scales, 2 * c, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            tern_k4_scale_min(x[i].scales, 2 * c + 1, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
            q += 32;
        }
    }
}

static void dequant_q5_k(const struct tern_block_q5_k *x, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++) {
        const float d = tern_fp16_to_f32(x[i].d);
        const float dmin = tern_fp16_to_f32(x[i].dmin);
        const uint8_t *ql = x[i].qs;
        const uint8_t *qh = x[i].qh;
        for (int c = 0; c < 4; c++) {
            uint8_t sc, m;
            tern_k4_scale_min(x[i].scales, 2 * c, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            tern_k4_scale_min(x[i].scales, 2 * c + 1, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            const uint8_t u1 = (uint8_t)(1u << (2 * c)), u2 = (uint8_t)(2u << (2 * c));
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
        }
    }
}

static void dequant_q6_k(const struct tern_block_q6_k *x, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++) {
        const float d = tern_fp16_to_f32(x[i].d);
        const uint8_t *ql = x[i].ql;
        const uint8_t *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int h = 0; h < 2; h++) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                /* ggml: d * sc * q, left to right */
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

/* The non-linear table (ggml's kvalues_iq4nl), a fact of the IQ4 formats. */
const int8_t tern_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void dequant_iq4_nl(const struct tern_block_iq4_nl *x, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++) {
        const float d = tern_fp16_to_f32(x[i].d);
        for (int j = 0; j < TERN_QK / 2; j++) {
            y[i * TERN_QK + j] = d * (float)tern_iq4nl_values[x[i].qs[j] & 0xF];
            y[i * TERN_QK + j + TERN_QK / 2] = d * (float)tern_iq4nl_values[x[i].qs[j] >> 4];
        }
    }
}

/* Twice the E2M1 values (ggml's kvalues_mxfp4), a fact of the MXFP4 format. */
const int8_t tern_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static void dequant_mxfp4(const struct tern_block_mxfp4 *x, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++) {
        const float d = tern_e8m0_half(x[i].e);
        for (int j = 0; j < TERN_QK / 2; j++) {
            y[i * TERN_QK + j] = (float)tern_mxfp4_values[x[i].qs[j] & 0xF] * d;
            y[i * TERN_QK + j + TERN_QK / 2] = (float)tern_mxfp4_values[x[i].qs[j] >> 4] * d;
        }
    }
}

/* ggml: dl = d * (ls - 32) first, then dl * value. */
static void dequant_iq4_xs(const struct tern_block_iq4_xs *x, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++) {
        const float d = tern_fp16_to_f32(x[i].d);
        const uint8_t *q = x[i].qs;
        for (int j = 0; j < TERN_QK_K / 32; j++) {
            const float dl = d * (float)tern_iq4xs_scale(&x[i], j);
            for (int l = 0; l < 16; l++) {
                y[l] = dl * (float)tern_iq4nl_values[q[l] & 0xF];
                y[l + 16] = dl * (float)tern_iq4nl_values[q[l] >> 4];
            }
            y += 32;
            q += 16;
        }
    }
}

static void dequant_q8_k(const struct tern_block_q8_k *x, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++)
        for (int j = 0; j < TERN_QK_K; j++) y[i * TERN_QK_K + j] = x[i].d * (float)x[i].qs[j];
}

static bool k_ok(enum tern_dtype type, size_t k, const char *what) {
    const struct tern_dtype_info *info = tern_dtype_info((uint32_t)type);
    if (!info) {
        tern_errorf(TERN_ERR_UNSUPPORTED, "%s: unknown tensor type %d", what, (int)type);
        return false;
    }
    if (k % info->blck_size) {
        tern_errorf(TERN_ERR_INVALID, "%s: row length %zu is not a multiple of the %s block size %u",
                    what, k, info->name, info->blck_size);
        return false;
    }
    return true;
}

bool tern_dequantize_row(enum tern_dtype type, const void *src, float *dst, size_t k) {
    if (!k_ok(type, k, "dequantize")) return false;
    switch (type) {
    case TERN_DTYPE_F32: memcpy(dst, src, k * sizeof(float)); return true;
    case TERN_DTYPE_F16: {
        const uint8_t *p = src;
        for (size_t i = 0; i < k; i++) {
            tern_fp16 h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = tern_fp16_to_f32(h);
        }
        return true;
    }
    case TERN_DTYPE_BF16: {
        const uint8_t *p = src;
        for (size_t i = 0; i < k; i++) {
            tern_bf16 h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = tern_bf16_to_f32(h);
        }
        return true;
    }
    case TERN_DTYPE_Q4_0: dequant_q4_0(src, dst, k / TERN_QK); return true;
    case TERN_DTYPE_Q4_1: dequant_q4_1(src, dst, k / TERN_QK); return true;
    case TERN_DTYPE_Q5_0: dequant_q5_0(src, dst, k / TERN_QK); return true;
    case TERN_DTYPE_Q5_1: dequant_q5_1(src, dst, k / TERN_QK); return true;
    case TERN_DTYPE_Q8_0: dequant_q8_0(src, dst, k / TERN_QK); return true;
    case TERN_DTYPE_Q8_1: dequant_q8_1(src, dst, k / TERN_QK); return true;
    case TERN_DTYPE_Q4_K: dequant_q4_k(src, dst, k / TERN_QK_K); return true;
    case TERN_DTYPE_Q5_K: dequant_q5_k(src, dst, k / TERN_QK_K); return true;
    case TERN_DTYPE_Q6_K: dequant_q6_k(src, dst, k / TERN_QK_K); return true;
    case TERN_DTYPE_Q8_K: dequant_q8_k(src, dst, k / TERN_QK_K); return true;
    case TERN_DTYPE_IQ4_NL: dequant_iq4_nl(src, dst, k / TERN_QK); return true;
    case TERN_DTYPE_IQ4_XS: dequant_iq4_xs(src, dst, k / TERN_QK_K); return true;
    case TERN_DTYPE_MXFP4: dequant_mxfp4(src, dst, k / TERN_QK); return true;
    default:
        if (tern_lowbit_dequantize(type, src, dst, k / TERN_QK_K)) return true;
        tern_errorf(TERN_ERR_UNSUPPORTED, "dequantize: tensor type %s is not supported",
                    tern_dtype_name((uint32_t)type));
        return false;
    }
}

bool tern_dequantize_supported(enum tern_dtype type) {
    switch (type) {
    case TERN_DTYPE_F32: case TERN_DTYPE_F16: case TERN_DTYPE_BF16:
    case TERN_DTYPE_Q4_0: case TERN_DTYPE_Q4_1: case TERN_DTYPE_Q5_0: case TERN_DTYPE_Q5_1:
    case TERN_DTYPE_Q8_0: case TERN_DTYPE_Q8_1: case TERN_DTYPE_Q4_K: case TERN_DTYPE_Q5_K:
    case TERN_DTYPE_Q6_K: case TERN_DTYPE_Q8_K: case TERN_DTYPE_IQ4_NL: case TERN_DTYPE_IQ4_XS:
    case TERN_DTYPE_MXFP4:
        return true;
    default:
        return tern_lowbit_type(type);
    }
}

/* ---- quantization: shared fitting helpers ----------------------------------------- */

/* Below this a block is treated as all zeros: keeps 1/d finite for every stored d. */
#define TINY_AMAX 0x1p-100f

static float amax_of(const float *x, int n) {
    float a = 0.0f;
    for (int i = 0; i < n; i++) {
        const float v = fabsf(x[i]);
        a = v > a ? v : a; /* NaN never wins */
    }
    return a;
}

/* The value with the largest magnitude, with its sign (0 if none is finite-nonzero). */
static float signed_max_of(const float *x, int n) {
    float a = 0.0f, m = 0.0f;
    for (int i = 0; i < n; i++) {
        const float v = fabsf(x[i]);
        if (v > a) {
            a = v;
            m = x[i];
        }
    }
    return m;
}

/* Half with saturation instead of overflow to infinity. */
static tern_fp16 fp16_sat(float v) {
    if (v > 65504.0f) v = 65504.0f;
    if (v < -65504.0f) v = -65504.0f;
    return tern_f32_to_fp16(v);
}

/* Sums over a block (n a multiple of 8) of the levels q = round_clamp((x - off) * inv,
 * lo, hi): sum q, sum q^2, sum q x. Eight interleaved partial sums keep the loop free of
 * long dependency chains. */
struct level_sums {
    float sq, sq2, sqx;
};

static struct level_sums level_sums(const float *x, int n, float off, float inv, float lo, float hi) {
    float sq[8] = {0}, sq2[8] = {0}, sqx[8] = {0};
    for (int i = 0; i < n; i += 8) {
        for (int j = 0; j < 8; j++) {
            const float q = (float)tern_round_clamp((x[i + j] - off) * inv, lo, hi);
            sq[j] += q;
            sq2[j] += q * q;
            sqx[j] += q * x[i + j];
        }
    }
    struct level_sums r = {0, 0, 0};
    for (int j = 0; j < 8; j++) {
        r.sq += sq[j];
        r.sq2 += sq2[j];
        r.sqx += sqx[j];
    }
    return r;
}

/* Symmetric fit: x ~ s * q with integer q in [qmin, qmax]. Tries scales m / L for L
 * around the end of the range that the largest-magnitude value m maps to (both ends:
 * the negative end of an asymmetric range is one level longer). For each candidate's
 * levels the least-squares scale is sqx / sq2 and the squared error sxx - sqx^2 / sq2,
 * so the best candidate maximizes sqx^2 / sq2. Returns its scale (0 for a zero block). */
static float fit_sym(const float *x, int n, int qmin, int qmax) {
    const float m = signed_max_of(x, n);
    if (!(fabsf(m) >= TINY_AMAX)) return 0.0f;
    float best_s = 0.0f, best_gain = -1.0f;
    for (int side = 0; side < 2; side++) {
        const float end = side ? (float)qmin : (float)qmax; /* m maps to this level */
        for (int step = 0; step <= 12; step++) {
            const float lv = end + (end > 0 ? 0.1f : -0.1f) * (float)(step - 4);
            if (lv == 0.0f) continue;
            const struct level_sums ls = level_sums(x, n, 0.0f, lv / m, (float)qmin, (float)qmax);
            if (!(ls.sq2 > 0)) continue;
            const float gain = ls.sqx * ls.sqx / ls.sq2;
            if (gain > best_gain) {
                best_gain = gain;
                best_s = ls.sqx / ls.sq2;
            }
        }
    }
    return best_s;
}

/* Affine fit: x ~ s * q + c with q in [0, qmax], s >= 0. With nonpositive_c the
 * offset is kept <= 0 (K-quants store it as an unsigned min). Candidates are level
 * spacings around (max - min) / qmax; for each candidate's levels (s, c) is the
 * least-squares line and its squared error comes from the same sums. Returns s and *c. */
static float fit_affine(const float *x, int n, int qmax, bool nonpositive_c, float *c_out) {
    float lo = x[0], hi = x[0], sx = 0, sxx = 0;
    for (int i = 0; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        sx += x[i];
        sxx += x[i] * x[i];
    }
    if (nonpositive_c && lo > 0) lo = 0;
    if (!(hi - lo >= TINY_AMAX)) {
        /* constant block: all of it in the offset */
        *c_out = nonpositive_c ? lo : x[0];
        if (nonpositive_c && x[0] > 0) { /* positive constant: needs a scale */
            *c_out = 0;
            return x[0] / (float)qmax;
        }
        return 0.0f;
    }
    float best_s = (hi - lo) / (float)qmax, best_c = lo;
    double best_err = INFINITY;
    for (int step = -4; step <= 8; step++) {
        const float inv = ((float)qmax + 0.1f * (float)step) / (hi - lo);
        if (!(inv > 0)) continue;
        const struct level_sums ls = level_sums(x, n, lo, inv, 0.0f, (float)qmax);
        const double q1 = ls.sq, q2 = ls.sq2, qx = ls.sqx;
        const double det = (double)n * q2 - q1 * q1;
        double s, c;
        if (det > 0) {
            s = ((double)n * qx - q1 * sx) / det;
            c = (sx - s * q1) / n;
        } else {
            s = 1.0 / inv;
            c = lo;
        }
        if (nonpositive_c && c > 0) {
            c = 0;
            s = q2 > 0 ? qx / q2 : 0;
        }
        if (!(s > 0)) continue;
        /* sum (s q + c - x)^2 expanded in the sums */
        const double err = s * s * q2 + 2 * s * c * q1 + n * c * c - 2 * s * qx - 2 * c * sx + sxx;
        if (err < best_err) {
            best_err = err;
            best_s = (float)s;
            best_c = (float)c;
        }
    }
    *c_out = best_c;
    return best_s;
}

/* ---- quantization: 32-element blocks ------------------------------------------------ */

void tern_quantize_q8_0_ref(const float *x, struct tern_block_q8_0 *y, size_t k) {
    for (size_t i = 0; i < k / TERN_QK; i++, x += TERN_QK) {
        const float amax = amax_of(x, TERN_QK);
        float d = 0.0f;
        tern_fp16 h = 0;
        if (amax >= TINY_AMAX) {
            h = fp16_sat(amax / 127.0f);
            d = tern_fp16_to_f32(h);
        }
        y[i].d = d != 0.0f ? h : 0;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < TERN_QK; j++)
            y[i].qs[j] = (int8_t)(d != 0.0f ? tern_round_clamp(x[j] * id, -127.0f, 127.0f) : 0);
    }
}

void tern_quantize_q8_k_ref(const float *x, struct tern_block_q8_k *y, size_t k) {
    for (size_t i = 0; i < k / TERN_QK_K; i++, x += TERN_QK_K) {
        const float amax = amax_of(x, TERN_QK_K);
        if (!(amax >= TINY_AMAX)) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float d = amax / 127.0f;
        const float id = 1.0f / d;
        y[i].d = d;
        for (int g = 0; g < TERN_QK_K / 16; g++) {
            int sum = 0;
            for (int j = 16 * g; j < 16 * g + 16; j++) {
                y[i].qs[j] = (int8_t)tern_round_clamp(x[j] * id, -127.0f, 127.0f);
                sum += y[i].qs[j];
            }
            y[i].bsums[g] = (int16_t)sum;
        }
    }
}

/* Levels for a stored symmetric scale d: q = round(x / d) + bias, in [0, qmax]. */
static void levels_sym(const float *x, int n, float d, int bias, int qmax, uint8_t *q) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++)
        q[i] = (uint8_t)(d != 0.0f ? tern_round_clamp(x[i] * id + (float)bias, 0.0f, (float)qmax) : bias);
}

static void levels_affine(const float *x, int n, float d, float m, int qmax, uint8_t *q) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++)
        q[i] = (uint8_t)(d != 0.0f ? tern_round_clamp((x[i] - m) * id, 0.0f, (float)qmax) : 0);
}

static void quantize_q4_0(const float *x, struct tern_block_q4_0 *y, size_t nb) {
    uint8_t q[TERN_QK];
    for (size_t i = 0; i < nb; i++, x += TERN_QK) {
        y[i].d = fp16_sat(fit_sym(x, TERN_QK, -8, 7));
        levels_sym(x, TERN_QK, tern_fp16_to_f32(y[i].d), 8, 15, q);
        for (int j = 0; j < 16; j++) y[i].qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    }
}

static void quantize_q4_1(const float *x, struct tern_block_q4_1 *y, size_t nb) {
    uint8_t q[TERN_QK];
    for (size_t i = 0; i < nb; i++, x += TERN_QK) {
        float c;
        const float s = fit_affine(x, TERN_QK, 15, false, &c);
        y[i].d = fp16_sat(s);
        y[i].m = fp16_sat(c);
        levels_affine(x, TERN_QK, tern_fp16_to_f32(y[i].d), tern_fp16_to_f32(y[i].m), 15, q);
        for (int j = 0; j < 16; j++) y[i].qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    }
}

static void pack_q5(const uint8_t *q, uint8_t *qs, uint8_t *qh4) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
        qh |= (uint32_t)(q[j] >> 4) << j;
        qh |= (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    memcpy(qh4, &qh, 4);
}

static void quantize_q5_0(const float *x, struct tern_block_q5_0 *y, size_t nb) {
    uint8_t q[TERN_QK];
    for (size_t i = 0; i < nb; i++, x += TERN_QK) {
        y[i].d = fp16_sat(fit_sym(x, TERN_QK, -16, 15));
        levels_sym(x, TERN_QK, tern_fp16_to_f32(y[i].d), 16, 31, q);
        pack_q5(q, y[i].qs, y[i].qh);
    }
}

static void quantize_q5_1(const float *x, struct tern_block_q5_1 *y, size_t nb) {
    uint8_t q[TERN_QK];
    for (size_t i = 0; i < nb; i++, x += TERN_QK) {
        float c;
        const float s = fit_affine(x, TERN_QK, 31, false, &c);
        y[i].d = fp16_sat(s);
        y[i].m = fp16_sat(c);
        levels_affine(x, TERN_QK, tern_fp16_to_f32(y[i].d), tern_fp16_to_f32(y[i].m), 31, q);
        pack_q5(q, y[i].qs, y[i].qh);
    }
}

/* ---- quantization: K-quants --------------------------------------------------------- */

/* Q4_K / Q5_K: per sub-block of 32 an affine fit with a nonpositive offset; the 8
 * scales and 8 mins are then quantized to 6 bits against the block's d and dmin, and
 * the levels recomputed from the stored values. */
static void quantize_k4(const float *x, int qmax, tern_fp16 *d_out, tern_fp16 *dmin_out,
                        uint8_t *scales, uint8_t *L /* [256] */) {
    float s[8], mn[8];
    float smax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        float c;
        s[j] = fit_affine(x + 32 * j, 32, qmax, true, &c);
        mn[j] = -c;
        smax = s[j] > smax ? s[j] : smax;
        mmax = mn[j] > mmax ? mn[j] : mmax;
    }
    const tern_fp16 dh = fp16_sat(smax / 63.0f), mh = fp16_sat(mmax / 63.0f);
    const float d = tern_fp16_to_f32(dh), dmin = tern_fp16_to_f32(mh);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(d != 0.0f ? tern_round_clamp(s[j] / d, 0.0f, 63.0f) : 0);
        m[j] = (uint8_t)(dmin != 0.0f ? tern_round_clamp(mn[j] / dmin, 0.0f, 63.0f) : 0);
    }
    *d_out = dh;
    *dmin_out = mh;
    tern_k4_pack_scale_min(scales, sc, m);
    for (int j = 0; j < 8; j++) {
        const float ds = d * (float)sc[j], dm = dmin * (float)m[j];
        levels_affine(x + 32 * j, 32, ds, -dm, qmax, L + 32 * j);
    }
}

static void quantize_q4_k(const float *x, struct tern_block_q4_k *y, size_t nb) {
    uint8_t L[TERN_QK_K];
    for (size_t i = 0; i < nb; i++, x += TERN_QK_K) {
        tern_fp16 d, dmin;
        quantize_k4(x, 15, &d, &dmin, y[i].scales, L);
        y[i].d = d;
        y[i].dmin = dmin;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

static void quantize_q5_k(const float *x, struct tern_block_q5_k *y, size_t nb) {
    uint8_t L[TERN_QK_K];
    for (size_t i = 0; i < nb; i++, x += TERN_QK_K) {
        tern_fp16 d, dmin;
        quantize_k4(x, 31, &d, &dmin, y[i].scales, L);
        y[i].d = d;
        y[i].dmin = dmin;
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
                y[i].qs[32 * c + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
                y[i].qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
            }
        }
    }
}

static void quantize_q6_k(const float *x, struct tern_block_q6_k *y, size_t nb) {
    uint8_t L[TERN_QK_K];
    for (size_t i = 0; i < nb; i++, x += TERN_QK_K) {
        float s[16];
        float amax = 0, m = 0;
        for (int j = 0; j < 16; j++) {
            s[j] = fit_sym(x + 16 * j, 16, -32, 31);
            if (fabsf(s[j]) > amax) {
                amax = fabsf(s[j]);
                m = s[j];
            }
        }
        /* The sub-block scale with the largest magnitude takes level -128 (one longer
         * than +127), which keeps one more bit of its precision. */
        const tern_fp16 dh = fp16_sat(m / -128.0f);
        const float d = tern_fp16_to_f32(dh);
        y[i].d = dh;
        for (int j = 0; j < 16; j++) {
            const int sc = d != 0.0f ? tern_round_clamp(s[j] / d, -128.0f, 127.0f) : 0;
            y[i].scales[j] = (int8_t)sc;
            levels_sym(x + 16 * j, 16, d * (float)sc, 32, 63, L + 16 * j);
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *Lh = L + 128 * h;
            uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                const int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
                ql[l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
                ql[l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
                qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
    }
}

/* ---- quantization: the non-linear IQ4 types --------------------------------------- */

/* fit_iq4's search: starts at 0.9, 1.0 and 1.1 times m / end, 3 refinements each (18
 * passes over a sub-block; on the kit's rows as good as a grid of 30 scales, 0.96x
 * llama-quantize's error, in 60 % of the time). */
#define IQ4_STARTS 3
#define IQ4_START0 0.9f
#define IQ4_START_STEP 0.1f
#define IQ4_ITERS 3

/* Midpoints between neighbouring table values (exact in float). */
static const float iq4_mid[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                                  7.0f,    19.0f,  31.5f, 45.5f,  61.0f,  79.0f,  101.0f};

/* Index of the table value nearest to t (ties and NaN to the lower index): the number
 * of midpoints that t exceeds, found by binary search (4 comparisons, not 15; the
 * quantizer calls this for every element of every candidate scale). */
static int iq4_index(float t) {
    int q = 0;
    for (int step = 8; step > 0; step /= 2)
        if (t > iq4_mid[q + step - 1]) q += step;
    return q;
}

static void iq4_levels(const float *x, int n, float d, uint8_t *q) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++) q[i] = (uint8_t)(d != 0.0f ? iq4_index(x[i] * id) : 8);
}

/* x ~ s * value[q]. The table is asymmetric (-127 .. 113), so the value of largest
 * magnitude m is tried at both ends (s of either sign), each from a few starting scales
 * around m / end; from each start, levels and scale are refined in turn (each element's
 * nearest table value, then the least-squares scale sum(v x) / sum(v^2) of those levels),
 * and the best levels seen maximize sum(v x)^2 / sum(v^2) (the squared error is sum(x^2)
 * minus that). Returns the scale (0 for a zero block). */
static float fit_iq4(const float *x, int n) {
    const float m = signed_max_of(x, n);
    if (!(fabsf(m) >= TINY_AMAX)) return 0.0f;
    float best_s = 0.0f, best_gain = -1.0f;
    uint8_t q[TERN_QK];
    for (int side = 0; side < 2; side++) {
        const float end = side ? -127.0f : 113.0f;
        for (int start = 0; start < IQ4_STARTS; start++) {
            float s = m / (end * (IQ4_START0 + IQ4_START_STEP * (float)start));
            for (int it = 0; it < IQ4_ITERS; it++) {
                iq4_levels(x, n, s, q);
                float svx = 0, sv2 = 0;
                for (int i = 0; i < n; i++) {
                    const float v = (float)tern_iq4nl_values[q[i]];
                    svx += v * x[i];
                    sv2 += v * v;
                }
                if (!(sv2 > 0)) break;
                const float gain = svx * svx / sv2;
                s = svx / sv2;
                if (gain > best_gain) {
                    best_gain = gain;
                    best_s = s;
                }
                if (!(s != 0.0f)) break;
            }
        }
    }
    return best_s;
}

static void pack_nibbles(const uint8_t *q, uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
}

static void quantize_iq4_nl(const float *x, struct tern_block_iq4_nl *y, size_t nb) {
    uint8_t q[TERN_QK];
    for (size_t i = 0; i < nb; i++, x += TERN_QK) {
        y[i].d = fp16_sat(fit_iq4(x, TERN_QK));
        iq4_levels(x, TERN_QK, tern_fp16_to_f32(y[i].d), q);
        pack_nibbles(q, y[i].qs);
    }
}

/* IQ4_XS: a scale per sub-block of 32 (fit_iq4), then the 8 scales as 6-bit integers
 * (ls - 32 in [-32, 31]) of one half d: the scale of largest magnitude takes -32, the
 * longer end. The levels are recomputed against d * (ls - 32) as stored. */
static void quantize_iq4_xs(const float *x, struct tern_block_iq4_xs *y, size_t nb) {
    uint8_t q[32];
    for (size_t i = 0; i < nb; i++, x += TERN_QK_K) {
        float s[8], m = 0.0f;
        for (int j = 0; j < 8; j++) {
            s[j] = fit_iq4(x + 32 * j, 32);
            if (fabsf(s[j]) > fabsf(m)) m = s[j];
        }
        y[i].d = fp16_sat(m / -32.0f);
        const float d = tern_fp16_to_f32(y[i].d);
        y[i].scales_h = 0;
        memset(y[i].scales_l, 0, sizeof y[i].scales_l);
        for (int j = 0; j < 8; j++) {
            const int l = d != 0.0f ? tern_round_clamp(s[j] / d, -32.0f, 31.0f) : 0;
            const int ls = l + 32;
            y[i].scales_l[j / 2] |= (uint8_t)((ls & 0xF) << (4 * (j % 2)));
            y[i].scales_h |= (uint16_t)((ls >> 4) << (2 * j));
            iq4_levels(x + 32 * j, 32, d * (float)l, q);
            pack_nibbles(q, y[i].qs + 16 * j);
        }
    }
}

/* MXFP4: the smallest exponent whose largest level (12 * 2^(e - 128)) reaches the block's
 * largest magnitude, so nothing clips; then the nearest level per element (ties to the
 * lower code). A block whose amax is 0 or not finite is stored as zeros with e = 0. */
static void quantize_mxfp4(const float *x, struct tern_block_mxfp4 *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, x += TERN_QK) {
        float amax = 0.0f;
        for (int j = 0; j < TERN_QK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        memset(y[i].qs, 0, sizeof y[i].qs);
        y[i].e = 0;
        if (!(amax > 0.0f) || !isfinite(amax)) continue;
        int ex;
        frexpf(amax / 12.0f, &ex); /* amax / 12 in [2^(ex-1), 2^ex) */
        int e = ex + 127 - 1;
        if (e < 0) e = 0;
        while (e < 254 && 12.0f * tern_e8m0_half((uint8_t)e) < amax) e++;
        while (e > 0 && 12.0f * tern_e8m0_half((uint8_t)(e - 1)) >= amax) e--;
        y[i].e = (uint8_t)e;
        const float d = tern_e8m0_half((uint8_t)e); /* a division: 1 / 2^-128 overflows */
        uint8_t q[TERN_QK];
        for (int j = 0; j < TERN_QK; j++) {
            const float v = x[j] / d;
            int best = 0;
            float berr = fabsf(v - (float)tern_mxfp4_values[0]);
            for (int c = 1; c < 16; c++) {
                const float err = fabsf(v - (float)tern_mxfp4_values[c]);
                if (err < berr) {
                    berr = err;
                    best = c;
                }
            }
            q[j] = (uint8_t)best;
        }
        pack_nibbles(q, y[i].qs);
    }
}

bool tern_quantize_supported(enum tern_dtype type) {
    switch (type) {
    case TERN_DTYPE_F32: case TERN_DTYPE_F16: case TERN_DTYPE_BF16:
    case TERN_DTYPE_Q4_0: case TERN_DTYPE_Q4_1: case TERN_DTYPE_Q5_0: case TERN_DTYPE_Q5_1:
    case TERN_DTYPE_Q8_0: case TERN_DTYPE_Q4_K: case TERN_DTYPE_Q5_K: case TERN_DTYPE_Q6_K:
    case TERN_DTYPE_Q8_K: case TERN_DTYPE_IQ4_NL: case TERN_DTYPE_IQ4_XS: case TERN_DTYPE_MXFP4:
        return true;
    default:
        return tern_lowbit_type(type);
    }
}

bool tern_quantize_row(enum tern_dtype type, const float *src, void *dst, size_t k) {
    if (!tern_quantize_supported(type)) {
        tern_errorf(TERN_ERR_UNSUPPORTED, "quantize: no quantizer for tensor type %s",
                    tern_dtype_name((uint32_t)type));
        return false;
    }
    if (!k_ok(type, k, "quantize")) return false;
    switch (type) {
    case TERN_DTYPE_F32: memcpy(dst, src, k * sizeof(float)); break;
    case TERN_DTYPE_F16: {
        uint8_t *p = dst;
        for (size_t i = 0; i < k; i++) {
            const tern_fp16 h = tern_f32_to_fp16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        break;
    }
    case TERN_DTYPE_BF16: {
        uint8_t *p = dst;
        for (size_t i = 0; i < k; i++) {
            const tern_bf16 h = tern_f32_to_bf16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        break;
    }
    case TERN_DTYPE_Q4_0: quantize_q4_0(src, dst, k / TERN_QK); break;
    case TERN_DTYPE_Q4_1: quantize_q4_1(src, dst, k / TERN_QK); break;
    case TERN_DTYPE_Q5_0: quantize_q5_0(src, dst, k / TERN_QK); break;
    case TERN_DTYPE_Q5_1: quantize_q5_1(src, dst, k / TERN_QK); break;
    case TERN_DTYPE_Q8_0: tern_quantize_q8_0_ref(src, dst, k); break;
    case TERN_DTYPE_Q4_K: quantize_q4_k(src, dst, k / TERN_QK_K); break;
    case TERN_DTYPE_Q5_K: quantize_q5_k(src, dst, k / TERN_QK_K); break;
    case TERN_DTYPE_Q6_K: quantize_q6_k(src, dst, k / TERN_QK_K); break;
    case TERN_DTYPE_Q8_K: tern_quantize_q8_k_ref(src, dst, k); break;
    case TERN_DTYPE_IQ4_NL: quantize_iq4_nl(src, dst, k / TERN_QK); break;
    case TERN_DTYPE_IQ4_XS: quantize_iq4_xs(src, dst, k / TERN_QK_K); break;
    case TERN_DTYPE_MXFP4: quantize_mxfp4(src, dst, k / TERN_QK); break;
    default: return tern_lowbit_quantize(type, src, dst, k / TERN_QK_K);
    }
    return true;
}
