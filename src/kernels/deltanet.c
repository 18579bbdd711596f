/* Gated DeltaNet per-token core. See deltanet.h for the math and the exactness rules.
 *
 * The recurrence is the hot part of a DeltaNet layer outside the matmuls: per token
 * and v-head it updates and reads the whole d_k x d_v state. The vector code
 * (deltanet-simd.h, instantiated below for 4 and 8 lanes) runs along the contiguous
 * d_v axis with the lane accumulators in registers while the key index i walks down
 * the rows, so every lane j reduces over i in the order 0, 1, ..., d_k-1 exactly as
 * the scalar tail does: no horizontal reduction, no dependence on the vector width. */
#include "kernels/deltanet.h"

#include "kernels/kernels.h"
#include "util/mem.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

enum tern_status tern_deltanet_shape_check(const struct tern_deltanet_shape *s) {
    const struct {
        const char *name;
        uint32_t v, max;
    } dims[] = {
        {"ssm.group_count (k-heads)", s->n_k_heads, TERN_DELTANET_MAX_HEADS},
        {"ssm.time_step_rank (v-heads)", s->n_v_heads, TERN_DELTANET_MAX_HEADS},
        {"ssm.state_size (d_k)", s->d_k, TERN_DELTANET_MAX_HEAD_DIM},
        {"v head dim (ssm.inner_size / v-heads)", s->d_v, TERN_DELTANET_MAX_HEAD_DIM},
        {"ssm.conv_kernel", s->n_conv, TERN_DELTANET_MAX_CONV},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (dims[i].v == 0 || dims[i].v > dims[i].max)
            return tern_errorf(TERN_ERR_FORMAT, "deltanet: %s = %u is outside [1, %u]", dims[i].name,
                               dims[i].v, dims[i].max);
    }
    if (s->n_v_heads % s->n_k_heads != 0)
        return tern_errorf(TERN_ERR_FORMAT,
                           "deltanet: v-heads %u is not a multiple of k-heads %u (each k-head "
                           "must serve the same number of v-heads)",
                           s->n_v_heads, s->n_k_heads);
    if (!(s->eps >= 0.0f) || !isfinite(s->eps))
        return tern_errorf(TERN_ERR_FORMAT, "deltanet: eps %g must be finite and >= 0", (double)s->eps);
    return TERN_OK;
}

size_t tern_deltanet_channels(const struct tern_deltanet_shape *s) {
    return 2 * (size_t)s->n_k_heads * s->d_k + (size_t)s->n_v_heads * s->d_v;
}

size_t tern_deltanet_conv_floats(const struct tern_deltanet_shape *s) {
    return (size_t)(s->n_conv - 1) * tern_deltanet_channels(s);
}

size_t tern_deltanet_state_floats(const struct tern_deltanet_shape *s) {
    return (size_t)s->n_v_heads * s->d_k * s->d_v;
}

/* Tokens per sub-chunk of the recurrence (see heads in deltanet-simd.h). */
#define DN_SUB 8

size_t tern_deltanet_scratch_floats(const struct tern_deltanet_shape *s) {
    /* normalised q and k of a sub-chunk's tokens, kv, delta, silu(z) */
    return DN_SUB * 2 * (size_t)s->d_k + 3 * (size_t)s->d_v;
}


/* ---- scalar helpers ------------------------------------------------------------------ */

/* exp(a) for a already clamped to [EXP_LO, EXP_HI]: Cody-Waite reduction by ln 2 and
 * Cephes' degree-7 polynomial, within about 2 ulp of expf. libm's expf costs ~5 ns a
 * call, which made SiLU over the 6144 conv channels of a 0.8B layer slower than the
 * whole recurrence; this one vectorises (VSILU in deltanet-simd.h performs the same
 * operations per lane, so an element gets the same bits in a vector or in a tail). */
#define EXP_LO (-87.0f)
#define EXP_HI 88.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_C1 0.693359375f
#define EXP_C2 (-2.12194440e-4f)
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

static inline float exp_clamped(float a) {
    const float t = a * EXP_LOG2E + 0.5f;
    int32_t n = (int32_t)t;
    if ((float)n > t) n -= 1; /* floor */
    const float nf = (float)n;
    float r = a - nf * EXP_C1;
    r = r - nf * EXP_C2;
    float p = EXP_P0;
    p = p * r + EXP_P1;
    p = p * r + EXP_P2;
    p = p * r + EXP_P3;
    p = p * r + EXP_P4;
    p = p * r + EXP_P5;
    const float e = (p * (r * r) + r) + 1.0f;
    const uint32_t bits = (uint32_t)(n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return e * scale;
}

static inline float silu1(float x) {
    float a = -x;
    if (a < EXP_LO) a = EXP_LO;
    if (a > EXP_HI) a = EXP_HI;
    return x / (1.0f + exp_clamped(a));
}

static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
/* As ggml: linear above 20, where log1p(exp(x)) == x in float anyway. */
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* The final step of sumsq: lane j holds the sum over elements i = j (mod 8). */
static inline float sumsq_combine8(const float *l) {
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

/* Scalar lanes [j0, d_v) of the three state passes (see DN_BLOCK). */
static inline void decay_read_tail(float *S, size_t d_k, size_t d_v, size_t j0, float decay,
                                   const float *k, float *kv) {
    for (size_t j = j0; j < d_v; j++) {
        float acc = 0.0f;
        for (size_t i = 0; i < d_k; i++) {
            const float sv = S[i * d_v + j] * decay;
            S[i * d_v + j] = sv;
            acc += sv * k[i];
        }
        kv[j] = acc;
    }
}
static inline void write_read_tail(float *S, size_t d_k, size_t d_v, size_t j0, const float *k,
                                   const float *q, const float *delta, float *o) {
    for (size_t j = j0; j < d_v; j++) {
        float acc = 0.0f;
        for (size_t i = 0; i < d_k; i++) {
            const float sv = S[i * d_v + j] + k[i] * delta[j];
            S[i * d_v + j] = sv;
            acc += sv * q[i];
        }
        o[j] = acc;
    }
}
static inline void fused_tail(float *S, size_t d_k, size_t d_v, size_t j0, const float *k,
                              const float *q, const float *delta, float *o, float decay,
                              const float *k2, float *kv2) {
    for (size_t j = j0; j < d_v; j++) {
        float acc = 0.0f, acc2 = 0.0f;
        for (size_t i = 0; i < d_k; i++) {
            float sv = S[i * d_v + j] + k[i] * delta[j];
            acc += sv * q[i];
            sv = sv * decay;
            S[i * d_v + j] = sv;
            acc2 += sv * k2[i];
        }
        o[j] = acc;
        kv2[j] = acc2;
    }
}

/* The prepared inputs of up to DN_SUB consecutive tokens for one v-head. */
struct sub_chunk {
    size_t n;
    const float *q[DN_SUB], *k[DN_SUB]; /* normalised (q also scaled), [d_k] in scratch */
    const float *v[DN_SUB];             /* this head's v, [d_v] in the conv output */
    float *o[DN_SUB];                   /* this head's output row, [d_v] */
    float decay[DN_SUB], beta[DN_SUB];
};

void tern_deltanet_conv_weights(const struct tern_deltanet_shape *s, const float *conv_w,
                                float *conv_wt) {
    const size_t C = tern_deltanet_channels(s), K = s->n_conv;
    for (size_t c = 0; c < C; c++)
        for (size_t j = 0; j < K; j++) conv_wt[j * C + c] = conv_w[c * K + j];
}

/* ---- the two instantiations of the vector code ------------------------------------- */

/* Portable: 4 lanes (SSE2 on x86-64; generic vectors elsewhere). */
typedef float dn_vf4 __attribute__((vector_size(16)));
typedef int32_t dn_vi4 __attribute__((vector_size(16)));
#define DN_V dn_vf4
#define DN_VI dn_vi4
#define DN_L 4
#define DN_FN(x) x##_generic
#define DN_ATTR
#include "kernels/deltanet-simd.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DN_HAVE_AVX2 1
/* 8 lanes compiled for AVX2. No FMA: each lane still rounds the product and the sum
 * separately, so it matches the portable path bit for bit. */
typedef float dn_vf8 __attribute__((vector_size(32)));
typedef int32_t dn_vi8 __attribute__((vector_size(32)));
#define DN_V dn_vf8
#define DN_VI dn_vi8
#define DN_L 8
#define DN_FN(x) x##_avx2
#define DN_ATTR __attribute__((target("avx2")))
#include "kernels/deltanet-simd.h"
/* 16 lanes compiled for AVX-512, taken where the kernels take their AVX-512 tiles
 * (tern_kernels_avx512(): the CPU has them and TERN_AVX512 is not 0). Still no FMA
 * (-ffp-contract=off), one accumulator per lane and sumsq in the 8-lane order: the bits
 * of the other two. */
typedef float dn_vf16 __attribute__((vector_size(64)));
typedef int32_t dn_vi16 __attribute__((vector_size(64)));
#define DN_V dn_vf16
#define DN_VI dn_vi16
#define DN_L 16
#define DN_FN(x) x##_avx512
#define DN_SUMSQ8 sumsq_avx2
#define DN_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#include "kernels/deltanet-simd.h"
#else
#define DN_HAVE_AVX2 0
#endif

/* No choice of its own: the AVX2 path runs when the kernels' one ISA choice is AVX2
 * (kernels.h; TERN_ISA=portable selects the generic path here too), read at every call
 * so that a test switching the ISA switches this as well. Both paths give the same bits. */
enum tern_deltanet_path tern_deltanet_path(void) {
    return DN_HAVE_AVX2 && tern_kernels_isa() == TERN_ISA_AVX2 ? TERN_DELTANET_AVX2 : TERN_DELTANET_GENERIC;
}

bool tern_deltanet_set_path(enum tern_deltanet_path path) {
    if (path == TERN_DELTANET_AVX2 && !DN_HAVE_AVX2) return false;
    return tern_kernels_set_isa(path == TERN_DELTANET_AVX2 ? TERN_ISA_AVX2 : TERN_ISA_PORTABLE);
}

#if DN_HAVE_AVX2
#define DISPATCH(fn, ...)                                                                  \
    do {                                                                                   \
        if (tern_deltanet_path() != TERN_DELTANET_AVX2)                                    \
            fn##_generic(__VA_ARGS__);                                                     \
        else if (tern_kernels_avx512())                                                    \
            fn##_avx512(__VA_ARGS__);                                                      \
        else                                                                               \
            fn##_avx2(__VA_ARGS__);                                                        \
    } while (0)
#else
#define DISPATCH(fn, ...) fn##_generic(__VA_ARGS__)
#endif

void tern_deltanet_heads(const struct tern_deltanet_shape *s, const struct tern_deltanet_params *p,
                         float *state, const struct tern_deltanet_io *io, uint32_t h0, uint32_t h1,
                         float *scratch) {
    DISPATCH(heads, s, p, state, io, h0, h1, scratch);
}

void tern_deltanet_conv(const struct tern_deltanet_shape *s, float *window, const float *conv_wt,
                        const float *x, size_t ldx, float *y, size_t ldy, size_t n_tok, size_t c0,
                        size_t c1) {
    DISPATCH(conv, s, window, conv_wt, x, ldx, y, ldy, n_tok, c0, c1);
}

void tern_deltanet_silu(float *y, const float *x, size_t n) { DISPATCH(silu, y, x, n); }
