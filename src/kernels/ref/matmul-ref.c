/* Portable kernels: activation preparation and one dot product per (weight row,
 * activation row). Always compiled; the reference the SIMD kernels are tested against
 * and the fallback when the CPU lacks AVX2/FMA/F16C (or TERN_ISA=portable).
 *
 * Every output is computed by the same dot function whatever the batch, so the
 * exactness contract (kernels.h) holds trivially here. Integer block sums are exact;
 * the float accumulation runs over blocks in order. */
#include "kernels/kernels-impl.h"
#include "kernels/lowbit.h"
#include "kernels/quant.h"

#include <string.h>

/* ---- activations -------------------------------------------------------------------- */

static void act_f32(const float *x, void *out, size_t k) { memcpy(out, x, k * sizeof(float)); }
static void act_q8_0(const float *x, void *out, size_t k) { tern_quantize_q8_0_ref(x, out, k); }
static void act_q8_k(const float *x, void *out, size_t k) { tern_quantize_q8_k_ref(x, out, k); }

/* ---- float weights ------------------------------------------------------------------ */

/* Eight interleaved partial sums (lane i takes elements i mod 8), then a fixed tree.
 * Plain C that compilers can vectorize without reassociating anything. */
static float sum8(const float *a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

static float dot_f32(const void *wv, const float *x, size_t k) {
    const float *w = wv;
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= k; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += w[i + j] * x[i + j];
    for (int j = 0; i + (size_t)j < k; j++) acc[j] += w[i + j] * x[i + j];
    return sum8(acc);
}

static float dot_f16(const void *wv, const float *x, size_t k) {
    const uint8_t *w = wv;
    float acc[8] = {0};
    for (size_t i = 0; i < k; i++) {
        tern_fp16 h;
        memcpy(&h, w + 2 * i, 2);
        acc[i % 8] += tern_fp16_to_f32(h) * x[i];
    }
    return sum8(acc);
}

static float dot_bf16(const void *wv, const float *x, size_t k) {
    const uint8_t *w = wv;
    float acc[8] = {0};
    for (size_t i = 0; i < k; i++) {
        tern_bf16 h;
        memcpy(&h, w + 2 * i, 2);
        acc[i % 8] += tern_bf16_to_f32(h) * x[i];
    }
    return sum8(acc);
}

/* ---- 32-element quants x Q8_0 ------------------------------------------------------- */

static float dot_q8_0(const void *wv, const void *av, size_t k) {
    const struct tern_block_q8_0 *w = wv;
    const struct tern_block_q8_0 *a = av;
    float acc = 0.0f;
    for (size_t b = 0; b < k / TERN_QK; b++) {
        int isum = 0;
        for (int j = 0; j < TERN_QK; j++) isum += w[b].qs[j] * a[b].qs[j];
        acc += (float)isum * (tern_fp16_to_f32(w[b].d) * tern_fp16_to_f32(a[b].d));
    }
    return acc;
}

static float dot_q4_0(const void *wv, const void *av, size_t k) {
    const struct tern_block_q4_0 *w = wv;
    const struct tern_block_q8_0 *a = av;
    float acc = 0.0f;
    for (size_t b = 0; b < k / TERN_QK; b++) {
        int isum = 0;
        for (int j = 0; j < TERN_QK / 2; j++) {
            isum += ((w[b].qs[j] & 0xF) - 8) * a[b].qs[j];
            isum += ((w[b].qs[j] >> 4) - 8) * a[b].qs[j + 16];
        }
        acc += (float)isum * (tern_fp16_to_f32(w[b].d) * tern_fp16_to_f32(a[b].d));
    }
    return acc;
}

/* Q4_1/Q5_1: (d q + m) . (da a) = d da sum(q a) + m da sum(a), both sums exact. */
static float dot_q4_1(const void *wv, const void *av, size_t k) {
    const struct tern_block_q4_1 *w = wv;
    const struct tern_block_q8_0 *a = av;
    float acc = 0.0f;
    for (size_t b = 0; b < k / TERN_QK; b++) {
        int isum = 0, asum = 0;
        for (int j = 0; j < TERN_QK / 2; j++) {
            isum += (w[b].qs[j] & 0xF) * a[b].qs[j] + (w[b].qs[j] >> 4) * a[b].qs[j + 16];
            asum += a[b].qs[j] + a[b].qs[j + 16];
        }
        const float da = tern_fp16_to_f32(a[b].d);
        acc += (float)isum * (tern_fp16_to_f32(w[b].d) * da);
        acc += (float)asum * (tern_fp16_to_f32(w[b].m) * da);
    }
    return acc;
}

static uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static float dot_q5_0(const void *wv, const void *av, size_t k) {
    const struct tern_block_q5_0 *w = wv;
    const struct tern_block_q8_0 *a = av;
    float acc = 0.0f;
    for (size_t b = 0; b < k / TERN_QK; b++) {
        const uint32_t qh = load_u32(w[b].qh);
        int isum = 0;
        for (int j = 0; j < TERN_QK / 2; j++) {
            const int q0 = ((w[b].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4)) - 16;
            const int q1 = ((w[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16;
            isum += q0 * a[b].qs[j] + q1 * a[b].qs[j + 16];
        }
        acc += (float)isum * (tern_fp16_to_f32(w[b].d) * tern_fp16_to_f32(a[b].d));
    }
    return acc;
}

static float dot_q5_1(const void *wv, const void *av, size_t k) {
    const struct tern_block_q5_1 *w = wv;
    const struct tern_block_q8_0 *a = av;
    float acc = 0.0f;
    for (size_t b = 0; b < k / TERN_QK; b++) {
        const uint32_t qh = load_u32(w[b].qh);
        int isum = 0, asum = 0;
        for (int j = 0; j < TERN_QK / 2; j++) {
            const int q0 = (w[b].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            const int q1 = (w[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            isum += q0 * a[b].qs[j] + q1 * a[b].qs[j + 16];
            asum += a[b].qs[j] + a[b].qs[j + 16];
        }
        const float da = tern_fp16_to_f32(a[b].d);
        acc += (float)isum * (tern_fp16_to_f32(w[b].d) * da);
        acc += (float)asum * (tern_fp16_to_f32(w[b].m) * da);
    }
    return acc;
}

/* ---- K-quants x Q8_K ---------------------------------------------------------------- */

/* Q4_K/Q5_K: sum_j sc_j sum(q a) exactly in integers, minus sum_j m_j (bsums of the
 * sub-block), each scaled once per super-block. */
static float dot_q4_k(const void *wv, const void *av, size_t k) {
    const struct tern_block_q4_k *w = wv;
    const struct tern_block_q8_k *a = av;
    float acc = 0.0f;
    for (size_t b = 0; b < k / TERN_QK_K; b++) {
        int sumi = 0, summ = 0;
        const uint8_t *q = w[b].qs;
        const int8_t *y = a[b].qs;
        for (int c = 0; c < 4; c++) {
            uint8_t sc0, m0, sc1, m1;
            tern_k4_scale_min(w[b].scales, 2 * c, &sc0, &m0);
            tern_k4_scale_min(w[b].scales, 2 * c + 1, &sc1, &m1);
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (q[l] & 0xF) * y[l];
                s1 += (q[l] >> 4) * y[l + 32];
            }
            sumi += sc0 * s0 + sc1 * s1;
            summ += m0 * (a[b].bsums[4 * c] + a[b].bsums[4 * c + 1]) +
                    m1 * (a[b].bsums[4 * c + 2] + a[b].bsums[4 * c + 3]);
            q += 32;
            y += 64;
        }
        acc += (float)sumi * (tern_fp16_to_f32(w[b].d) * a[b].d);
        acc -= (float)summ * (tern_fp16_to_f32(w[b].dmin) * a[b].d);
    }
    return acc;
}

static float dot_q5_k(const void *wv, const void *av, size_t k) {
    const struct tern_block_q5_k *w = wv;
    const struct tern_block_q8_k *a = av;
    float acc = 0.0f;
    for (size_t b = 0; b < k / TERN_QK_K; b++) {
        int sumi = 0, summ = 0;
        const uint8_t *q = w[b].qs;
        const uint8_t *qh = w[b].qh;
        const int8_t *y = a[b].qs;
        for (int c = 0; c < 4; c++) {
            uint8_t sc0, m0, sc1, m1;
            tern_k4_scale_min(w[b].scales, 2 * c, &sc0, &m0);
            tern_k4_scale_min(w[b].scales, 2 * c + 1, &sc1, &m1);
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += ((q[l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4)) * y[l];
                s1 += ((q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) * y[l + 32];
            }
            sumi += sc0 * s0 + sc1 * s1;
            summ += m0 * (a[b].bsums[4 * c] + a[b].bsums[4 * c + 1]) +
                    m1 * (a[b].bsums[4 * c + 2] + a[b].bsums[4 * c + 3]);
            q += 32;
            y += 64;
        }
        acc += (float)sumi * (tern_fp16_to_f32(w[b].d) * a[b].d);
        acc -= (float)summ * (tern_fp16_to_f32(w[b].dmin) * a[b].d);
    }
    return acc;
}

static float dot_q6_k(const void *wv, const void *av, size_t k) {
    const struct tern_block_q6_k *w = wv;
    const struct tern_block_q8_k *a = av;
    float acc = 0.0f;
    for (size_t b = 0; b < k / TERN_QK_K; b++) {
        int sumi = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[b].ql + 64 * h, *qh = w[b].qh + 32 * h;
            const int8_t *sc = w[b].scales + 8 * h;
            const int8_t *y = a[b].qs + 128 * h;
            int s[8] = {0}; /* per sub-block of 16: index 2 * quarter + (l >= 16) */
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                s[is + 0] += q1 * y[l];
                s[is + 2] += q2 * y[l + 32];
                s[is + 4] += q3 * y[l + 64];
                s[is + 6] += q4 * y[l + 96];
            }
            for (int j = 0; j < 8; j++) sumi += sc[j] * s[j];
        }
        acc += (float)sumi * (tern_fp16_to_f32(w[b].d) * a[b].d);
    }
    return acc;
}

/* ---- IQ4_NL x Q8_0, IQ4_XS x Q8_K: the AVX2 kernels' bits -------------------------------
 *
 * These two compute what their AVX2 twins compute, operation for operation, so the two
 * ISAs give the same bits: per block (IQ4_XS: per super-block) eight exact integer lanes,
 * lane i holding the products of elements 4i .. 4i + 3 of each 32 (IQ4_XS: each times
 * its sub-block scale, summed over the 8 sub-blocks); each lane converted to float and
 * accumulated as acc[i] = acc[i] + lane * (dw * da), a multiply and an add, each rounded
 * (the build has -ffp-contract=off, so neither side fuses them; a fused multiply-add
 * would need fmaf here, a slow library call on CPUs without FMA); at the end sum8, the
 * same tree as the AVX2 horizontal sum. */

/* The 32 levels of 16 bytes of nibbles (element j low nibble of qs[j], j + 16 high), each
 * nibble an index into table (IQ4's or MXFP4's). */
static void iq4_unpack(const uint8_t *qs, const int8_t *table, int8_t *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = table[qs[j] & 0xF];
        q[j + 16] = table[qs[j] >> 4];
    }
}

/* lane[i] += scale * (products of elements 4i .. 4i + 3) */
static void iq4_lanes(const int8_t *q, const int8_t *y, int scale, int *lane) {
    for (int i = 0; i < 8; i++) {
        const int s = q[4 * i] * y[4 * i] + q[4 * i + 1] * y[4 * i + 1] + q[4 * i + 2] * y[4 * i + 2] +
                      q[4 * i + 3] * y[4 * i + 3];
        lane[i] += scale * s;
    }
}

static float dot_iq4_nl(const void *wv, const void *av, size_t k) {
    const struct tern_block_iq4_nl *w = wv;
    const struct tern_block_q8_0 *a = av;
    float acc[8] = {0};
    int8_t q[32];
    for (size_t b = 0; b < k / TERN_QK; b++) {
        const float dd = tern_fp16_to_f32(w[b].d) * tern_fp16_to_f32(a[b].d);
        int lane[8] = {0};
        iq4_unpack(w[b].qs, tern_iq4nl_values, q);
        iq4_lanes(q, a[b].qs, 1, lane);
        for (int i = 0; i < 8; i++) acc[i] = acc[i] + (float)lane[i] * dd;
    }
    return sum8(acc);
}

static float dot_iq4_xs(const void *wv, const void *av, size_t k) {
    const struct tern_block_iq4_xs *w = wv;
    const struct tern_block_q8_k *a = av;
    float acc[8] = {0};
    int8_t q[32];
    for (size_t b = 0; b < k / TERN_QK_K; b++) {
        int lane[8] = {0};
        for (int j = 0; j < TERN_QK_K / 32; j++) {
            iq4_unpack(w[b].qs + 16 * j, tern_iq4nl_values, q);
            iq4_lanes(q, a[b].qs + 32 * j, tern_iq4xs_scale(&w[b], j), lane);
        }
        const float dd = tern_fp16_to_f32(w[b].d) * a[b].d;
        for (int i = 0; i < 8; i++) acc[i] = acc[i] + (float)lane[i] * dd;
    }
    return sum8(acc);
}

/* MXFP4 x Q8_0: as IQ4_NL with the MXFP4 levels and the E8M0 half scale (the AVX2
 * kernel's bits, the same construction). */
static float dot_mxfp4(const void *wv, const void *av, size_t k) {
    const struct tern_block_mxfp4 *w = wv;
    const struct tern_block_q8_0 *a = av;
    float acc[8] = {0};
    int8_t q[32];
    for (size_t b = 0; b < k / TERN_QK; b++) {
        const float dd = tern_e8m0_half(w[b].e) * tern_fp16_to_f32(a[b].d);
        int lane[8] = {0};
        iq4_unpack(w[b].qs, tern_mxfp4_values, q);
        iq4_lanes(q, a[b].qs, 1, lane);
        for (int i = 0; i < 8; i++) acc[i] = acc[i] + (float)lane[i] * dd;
    }
    return sum8(acc);
}

/* ---- the matmul driver -------------------------------------------------------------- */

typedef float (*dot_fn)(const void *w, const void *act, size_t k);

static void matmul_generic(dot_fn dot, const void *w, size_t w_row_bytes, size_t k, const void *act,
                           size_t act_row_bytes, size_t n_tok, float *y, size_t ldy, size_t r0,
                           size_t r1) {
    for (size_t r = r0; r < r1; r++) {
        const void *wr = (const uint8_t *)w + r * w_row_bytes;
        for (size_t t = 0; t < n_tok; t++)
            y[t * ldy + r] = dot(wr, (const uint8_t *)act + t * act_row_bytes, k);
    }
}

#define MATMUL_REF(name, dot)                                                                     \
    static void name(const void *w, size_t w_row_bytes, size_t k, const void *act,               \
                     size_t act_row_bytes, size_t n_tok, float *y, size_t ldy, size_t r0,        \
                     size_t r1) {                                                                 \
        matmul_generic(dot, w, w_row_bytes, k, act, act_row_bytes, n_tok, y, ldy, r0,  \
                       r1);                                                                       \
    }

/* The float dots take the activation as float *; adapt them to the generic shape. */
static float dotv_f32(const void *w, const void *a, size_t k) { return dot_f32(w, a, k); }
static float dotv_f16(const void *w, const void *a, size_t k) { return dot_f16(w, a, k); }
static float dotv_bf16(const void *w, const void *a, size_t k) { return dot_bf16(w, a, k); }

MATMUL_REF(mm_f32, dotv_f32)
MATMUL_REF(mm_f16, dotv_f16)
MATMUL_REF(mm_bf16, dotv_bf16)
MATMUL_REF(mm_q4_0, dot_q4_0)
MATMUL_REF(mm_q4_1, dot_q4_1)
MATMUL_REF(mm_q5_0, dot_q5_0)
MATMUL_REF(mm_q5_1, dot_q5_1)
MATMUL_REF(mm_q8_0, dot_q8_0)
MATMUL_REF(mm_q4_k, dot_q4_k)
MATMUL_REF(mm_q5_k, dot_q5_k)
MATMUL_REF(mm_q6_k, dot_q6_k)
MATMUL_REF(mm_iq4_nl, dot_iq4_nl)
MATMUL_REF(mm_iq4_xs, dot_iq4_xs)
MATMUL_REF(mm_mxfp4, dot_mxfp4)

/* The low-bit types: unpacked super-blocks (lowbit.h), the integer sum in scalar code. */
static int32_t lowbit_isum_ref(const struct tern_lowbit_sb *u, const struct tern_block_q8_k *a) {
    int32_t s = 0;
    for (int j = 0; j < 16; j++) {
        int32_t p = 0;
        for (int l = 0; l < 16; l++) p += (int32_t)u->q[16 * j + l] * a->qs[16 * j + l];
        s += (int32_t)u->sc[j] * p;
    }
    return s;
}

LOWBIT_MATMUL(tern_lowbit_ref, lowbit_isum_ref)

const struct tern_kernel_table tern_kernels_portable = {
    .matmul =
        {
            [TERN_DTYPE_F32] = mm_f32,
            [TERN_DTYPE_F16] = mm_f16,
            [TERN_DTYPE_BF16] = mm_bf16,
            [TERN_DTYPE_Q4_0] = mm_q4_0,
            [TERN_DTYPE_Q4_1] = mm_q4_1,
            [TERN_DTYPE_Q5_0] = mm_q5_0,
            [TERN_DTYPE_Q5_1] = mm_q5_1,
            [TERN_DTYPE_Q8_0] = mm_q8_0,
            [TERN_DTYPE_Q4_K] = mm_q4_k,
            [TERN_DTYPE_Q5_K] = mm_q5_k,
            [TERN_DTYPE_Q6_K] = mm_q6_k,
            [TERN_DTYPE_IQ4_NL] = mm_iq4_nl,
            [TERN_DTYPE_IQ4_XS] = mm_iq4_xs,
            [TERN_DTYPE_MXFP4] = mm_mxfp4,
            LOWBIT_TABLE(tern_lowbit_ref),
        },
    .act =
        {
            [TERN_DTYPE_F32] = act_f32,
            [TERN_DTYPE_Q8_0] = act_q8_0,
            [TERN_DTYPE_Q8_K] = act_q8_k,
        },
};
