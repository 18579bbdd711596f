/* Gated DeltaNet per-token core. See deltanet.h for the math and the exactness rules.
 *
 * The recurrence is the hot part of a DeltaNet layer outside the matmuls: per token
 * and v-head it reads and writes the d_k x d_v state twice. Both passes run along the
 * contiguous d_v axis in blocks of 32 lanes whose accumulators stay in registers
 * while the key index i walks down the rows, so every lane j reduces over i in the
 * order 0, 1, ..., d_k-1 exactly as the scalar tail does. There is no horizontal
 * reduction anywhere, hence no dependence on the vector width. */
#include "model/deltanet.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
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

size_t tern_deltanet_scratch_floats(const struct tern_deltanet_shape *s) {
    /* normalised q and k, then delta and o */
    return 2 * (size_t)s->d_k + 2 * (size_t)s->d_v;
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
/* As ggml: linear above 20, where log1p(exp(x)) == x in float anyway. */
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* ---- convolution ------------------------------------------------------------------- */

void tern_deltanet_conv(const struct tern_deltanet_shape *s, float *window, const float *conv_w,
                        const float *x, size_t ldx, float *y, size_t ldy, size_t n_tok, size_t c0,
                        size_t c1) {
    const size_t C = tern_deltanet_channels(s);
    const size_t K = s->n_conv;
    const size_t W = K - 1; /* window rows */
    for (size_t t = 0; t < n_tok; t++) {
        float *yt = y + t * ldy;
        for (size_t c = c0; c < c1; c++) {
            const float *w = conv_w + c * K;
            float acc = 0.0f;
            /* tap j meets the input at relative time j - W: the window for j + t < W */
            for (size_t j = 0; j < K; j++) {
                const size_t r = t + j; /* index into window ++ x */
                const float in = r < W ? window[r * C + c] : x[(r - W) * ldx + c];
                acc += in * w[j];
            }
            yt[c] = silu(acc);
        }
    }
    /* New window row j = row n_tok + j of (old window ++ x). Ascending j reads only
     * rows at or above the one it writes, so updating in place is safe. */
    for (size_t j = 0; j < W; j++) {
        const size_t r = n_tok + j;
        float *dst = window + j * C;
        if (r < W)
            memcpy(dst + c0, window + r * C + c0, (c1 - c0) * sizeof(float));
        else
            memcpy(dst + c0, x + (r - W) * ldx + c0, (c1 - c0) * sizeof(float));
    }
}

/* ---- recurrence -------------------------------------------------------------------- */

/* Sum of squares in double (as ggml's l2/rms norms), one fixed order. */
static inline double sumsq(const float *x, size_t n) {
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) acc += (double)(x[i] * x[i]);
    return acc;
}

typedef float vf8 __attribute__((vector_size(32)));

/* Loads, stores and broadcasts as macros: passing 32-byte vectors by value to functions
 * would change the ABI of a non-AVX build (the compilers warn). */
#define LD8(v, p) memcpy(&(v), (p), sizeof(vf8))
#define ST8(p, v) memcpy((p), &(v), sizeof(vf8))
#define SPLAT8(f) ((vf8){(f), (f), (f), (f), (f), (f), (f), (f)})

/* Pass 1 for value lanes [j0, j0 + 8*NV): S[i][j] *= decay; kv[j] = sum_i S[i][j]*k[i].
 * Pass 2: S[i][j] += k[i]*delta[j]; o[j] = sum_i S[i][j]*q[i]. */
#define DN_BLOCK(NV)                                                                           \
    static inline __attribute__((always_inline)) void pass1_##NV(                              \
        float *S, size_t d_k, size_t d_v, size_t j0, float decay, const float *k, float *kv) { \
        const vf8 dec = SPLAT8(decay);                                                         \
        vf8 acc[NV];                                                                           \
        for (int u = 0; u < NV; u++) acc[u] = SPLAT8(0.0f);                                    \
        for (size_t i = 0; i < d_k; i++) {                                                     \
            float *row = S + i * d_v + j0;                                                     \
            const vf8 ki = SPLAT8(k[i]);                                                       \
            for (int u = 0; u < NV; u++) {                                                     \
                vf8 sv;                                                                        \
                LD8(sv, row + 8 * u);                                                          \
                sv = sv * dec;                                                                 \
                ST8(row + 8 * u, sv);                                                          \
                acc[u] += sv * ki;                                                             \
            }                                                                                  \
        }                                                                                      \
        for (int u = 0; u < NV; u++) ST8(kv + j0 + 8 * u, acc[u]);                             \
    }                                                                                          \
    static inline __attribute__((always_inline)) void pass2_##NV(                              \
        float *S, size_t d_k, size_t d_v, size_t j0, const float *k, const float *q,           \
        const float *delta, float *o) {                                                        \
        vf8 dl[NV], acc[NV];                                                                   \
        for (int u = 0; u < NV; u++) {                                                         \
            LD8(dl[u], delta + j0 + 8 * u);                                                    \
            acc[u] = SPLAT8(0.0f);                                                             \
        }                                                                                      \
        for (size_t i = 0; i < d_k; i++) {                                                     \
            float *row = S + i * d_v + j0;                                                     \
            const vf8 ki = SPLAT8(k[i]), qi = SPLAT8(q[i]);                                    \
            for (int u = 0; u < NV; u++) {                                                     \
                vf8 sv;                                                                        \
                LD8(sv, row + 8 * u);                                                          \
                sv = sv + ki * dl[u];                                                          \
                ST8(row + 8 * u, sv);                                                          \
                acc[u] += sv * qi;                                                             \
            }                                                                                  \
        }                                                                                      \
        for (int u = 0; u < NV; u++) ST8(o + j0 + 8 * u, acc[u]);                              \
    }
DN_BLOCK(4)
DN_BLOCK(1)
#undef DN_BLOCK

/* One v-head, one token: the state update and o = S^T q. The scalar tail lanes do
 * the same operations in the same order as the vector lanes. */
static inline __attribute__((always_inline)) void delta_rule(float *S, size_t d_k, size_t d_v,
                                                             float decay, float b, const float *k,
                                                             const float *q, const float *v,
                                                             float *delta, float *o) {
    size_t j0 = 0;
    for (; j0 + 32 <= d_v; j0 += 32) pass1_4(S, d_k, d_v, j0, decay, k, delta);
    for (; j0 + 8 <= d_v; j0 += 8) pass1_1(S, d_k, d_v, j0, decay, k, delta);
    for (size_t j = j0; j < d_v; j++) {
        float acc = 0.0f;
        for (size_t i = 0; i < d_k; i++) {
            const float sv = S[i * d_v + j] * decay;
            S[i * d_v + j] = sv;
            acc += sv * k[i];
        }
        delta[j] = acc;
    }
    /* delta = (v - kv) * beta, in place over kv */
    for (size_t j = 0; j < d_v; j++) delta[j] = (v[j] - delta[j]) * b;
    j0 = 0;
    for (; j0 + 32 <= d_v; j0 += 32) pass2_4(S, d_k, d_v, j0, k, q, delta, o);
    for (; j0 + 8 <= d_v; j0 += 8) pass2_1(S, d_k, d_v, j0, k, q, delta, o);
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

static inline __attribute__((always_inline)) void heads_body(const struct tern_deltanet_shape *s,
                                                             const struct tern_deltanet_params *p,
                                                             float *state,
                                                             const struct tern_deltanet_io *io,
                                                             uint32_t h0, uint32_t h1,
                                                             float *scratch) {
    const size_t d_k = s->d_k, d_v = s->d_v;
    const size_t n_k = s->n_k_heads;
    const float q_scale = 1.0f / sqrtf((float)d_k);
    float *qn = scratch, *kn = scratch + d_k, *delta = scratch + 2 * d_k, *o = delta + d_v;
    for (uint32_t h = h0; h < h1; h++) {
        const size_t hk = h % n_k; /* ggml_repeat tiles the k-heads over the v-heads */
        float *S = state + (size_t)h * d_k * d_v;
        const float a = p->ssm_a[h], dt = p->dt_bias[h];
        for (size_t t = 0; t < io->n_tok; t++) {
            const float *row = io->qkv + t * io->ld_qkv;
            const float *q = row + hk * d_k;
            const float *k = row + (n_k + hk) * d_k;
            const float *v = row + 2 * n_k * d_k + (size_t)h * d_v;

            const float qinv = 1.0f / fmaxf(sqrtf((float)sumsq(q, d_k)), s->eps);
            const float kinv = 1.0f / fmaxf(sqrtf((float)sumsq(k, d_k)), s->eps);
            for (size_t i = 0; i < d_k; i++) {
                qn[i] = (q[i] * qinv) * q_scale;
                kn[i] = k[i] * kinv;
            }
            const float g = a * softplus(io->alpha[t * io->ld_alpha + h] + dt);
            const float b = sigmoid(io->beta[t * io->ld_beta + h]);

            delta_rule(S, d_k, d_v, expf(g), b, kn, qn, v, delta, o);

            /* out = rmsnorm(o) * norm_w * silu(z) */
            const float *z = io->z + t * io->ld_z + (size_t)h * d_v;
            float *out = io->out + t * io->ld_out + (size_t)h * d_v;
            const float r = 1.0f / sqrtf((float)(sumsq(o, d_v) / (double)d_v) + s->eps);
            for (size_t j = 0; j < d_v; j++) out[j] = ((o[j] * r) * p->norm_w[j]) * silu(z[j]);
        }
    }
}

static void heads_generic(const struct tern_deltanet_shape *s, const struct tern_deltanet_params *p,
                          float *state, const struct tern_deltanet_io *io, uint32_t h0, uint32_t h1,
                          float *scratch) {
    heads_body(s, p, state, io, h0, h1, scratch);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DN_HAVE_AVX2 1
/* The same body compiled for 256-bit registers. No FMA: each lane still rounds the
 * product and the sum separately, so it matches the generic path bit for bit. */
__attribute__((target("avx2"))) static void heads_avx2(const struct tern_deltanet_shape *s,
                                                       const struct tern_deltanet_params *p,
                                                       float *state,
                                                       const struct tern_deltanet_io *io,
                                                       uint32_t h0, uint32_t h1, float *scratch) {
    heads_body(s, p, state, io, h0, h1, scratch);
}
#else
#define DN_HAVE_AVX2 0
#endif

static bool cpu_has_avx2(void) {
#if DN_HAVE_AVX2
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
#else
    return false;
#endif
}

static enum tern_deltanet_path g_path = TERN_DELTANET_GENERIC;
static pthread_once_t g_path_once = PTHREAD_ONCE_INIT;

static void path_init(void) {
    const char *isa = getenv("TERN_ISA");
    bool portable = isa && strcmp(isa, "portable") == 0;
    g_path = (!portable && cpu_has_avx2()) ? TERN_DELTANET_AVX2 : TERN_DELTANET_GENERIC;
}

enum tern_deltanet_path tern_deltanet_path(void) {
    pthread_once(&g_path_once, path_init);
    return g_path;
}

bool tern_deltanet_set_path(enum tern_deltanet_path path) {
    pthread_once(&g_path_once, path_init);
    if (path == TERN_DELTANET_AVX2 && !cpu_has_avx2()) return false;
    g_path = path;
    return true;
}

void tern_deltanet_heads(const struct tern_deltanet_shape *s, const struct tern_deltanet_params *p,
                         float *state, const struct tern_deltanet_io *io, uint32_t h0, uint32_t h1,
                         float *scratch) {
#if DN_HAVE_AVX2
    if (tern_deltanet_path() == TERN_DELTANET_AVX2) {
        heads_avx2(s, p, state, io, h0, h1, scratch);
        return;
    }
#endif
    heads_generic(s, p, state, io, h0, h1, scratch);
}
