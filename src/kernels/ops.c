/* Portable ops (always built), RoPE, and the choice of the op set. */
#include "kernels/ops.h"

#include "util/fp16.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* ---- portable ------------------------------------------------------------------- */

static void rmsnorm_portable(float *y, const float *x, const float *w, size_t n, float eps) {
    /* Sum of squares in double, in index order (as ggml does): a long row of small
     * values loses nothing, and the order is fixed. */
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    if (w)
        for (size_t i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
    else
        for (size_t i = 0; i < n; i++) y[i] = x[i] * scale;
}

static void swiglu_portable(float *y, const float *g, const float *u, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const float a = g[i];
        y[i] = a / (1.0f + expf(-a)) * u[i];
    }
}

static void add_portable(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

static void softmax_portable(float *x, size_t n) {
    if (!n) return;
    float max = x[0];
    for (size_t i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const float inv = 1.0f / sum;
    for (size_t i = 0; i < n; i++) x[i] *= inv;
}

/* Eight partial sums (lane i takes elements i, i+8, ...) combined pairwise: a fixed
 * order the compiler may keep in vector registers without reassociating. */
static float dot8_f32(const float *a, const float *b, size_t n) {
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

static float dot8_f16(const float *a, const tern_fp16 *b, size_t n) {
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * tern_fp16_to_f32(b[i + l]);
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * tern_fp16_to_f32(b[i]);
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

static void attn_page_portable(float *acc, float *m, float *l, const float *q, size_t d, const void *k,
                               const void *v, size_t row_elems, size_t n, float scale, bool f16, float *scores) {
    float pm = -INFINITY;
    for (size_t j = 0; j < n; j++) {
        const float s = (f16 ? dot8_f16(q, (const tern_fp16 *)k + j * row_elems, d)
                             : dot8_f32(q, (const float *)k + j * row_elems, d)) * scale;
        scores[j] = s;
        if (s > pm) pm = s;
    }
    const float mn = pm > *m ? pm : *m;
    const float c = expf(*m - mn);
    float sum = 0.0f;
    for (size_t j = 0; j < n; j++) {
        scores[j] = expf(scores[j] - mn);
        sum += scores[j];
    }
    *l = *l * c + sum;
    *m = mn;
    for (size_t i = 0; i < d; i++) acc[i] *= c;
    for (size_t j = 0; j < n; j++) {
        const float p = scores[j];
        if (f16) {
            const tern_fp16 *vh = (const tern_fp16 *)v + j * row_elems;
            for (size_t i = 0; i < d; i++) acc[i] += p * tern_fp16_to_f32(vh[i]);
        } else {
            const float *vf = (const float *)v + j * row_elems;
            for (size_t i = 0; i < d; i++) acc[i] += p * vf[i];
        }
    }
}

/* The portable twin: one query after another (the definition of the bits). */
static void attn_page_multi_portable(const struct tern_attn_query *qs, size_t nq, size_t d, const void *k,
                                     const void *v, size_t row_elems, size_t n, float scale, bool f16,
                                     float *scratch) {
    for (size_t a = 0; a < nq; a++)
        attn_page_portable(qs[a].acc, qs[a].m, qs[a].l, qs[a].q, d, k, v, row_elems, n, scale, f16, scratch);
}

size_t tern_attn_multi_scratch_floats(size_t nq, size_t n, size_t head_dim) {
    /* AVX-512: the scores of an even number of queries, the queries packed in pairs and 16
     * converted rows (at least attn_page's n + 8: fewer queries run one by one). */
    const size_t np = (nq + 1) / 2;
    return 2 * np * (n + 8) + 2 * np * head_dim + 16 * head_dim + 16;
}

static void to_f16_portable(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = tern_f32_to_fp16(src[i]);
}

static const struct tern_ops ops_portable = {
    .name = "portable",
    .rmsnorm = rmsnorm_portable,
    .swiglu = swiglu_portable,
    .add = add_portable,
    .softmax = softmax_portable,
    .to_f16 = to_f16_portable,
    .attn_page = attn_page_portable,
    .attn_page_multi = attn_page_multi_portable,
};

/* ---- choice --------------------------------------------------------------------- */

static struct tern_ops ops_avx2;
static pthread_once_t ops_once = PTHREAD_ONCE_INIT;

/* The AVX2 table is filled only where the CPU runs AVX2 code (the fill function is
 * compiled for it). Which set runs follows the kernels' one ISA choice (kernels.h). */
static void ops_init(void) {
    if (tern_kernels_isa_available(TERN_ISA_AVX2)) {
        ops_avx2 = ops_portable;
        tern_ops_avx2_fill(&ops_avx2);
    }
}

const struct tern_ops *tern_ops_portable(void) { return &ops_portable; }

const struct tern_ops *tern_ops_avx2(void) {
    pthread_once(&ops_once, ops_init);
    return tern_kernels_isa_available(TERN_ISA_AVX2) ? &ops_avx2 : NULL;
}

const struct tern_ops *tern_ops(void) {
    pthread_once(&ops_once, ops_init);
    /* Follow the kernels' ISA every time: tests may switch it. */
    return tern_kernels_isa() == TERN_ISA_AVX2 ? &ops_avx2 : &ops_portable;
}

/* ---- RoPE ------------------------------------------------------------------------ */

void tern_rope(float *x, size_t n_head, size_t head_dim, size_t n_rot, const float *cs, bool neox) {
    const size_t half = n_rot / 2;
    for (size_t h = 0; h < n_head; h++) {
        float *xh = x + h * head_dim;
        for (size_t i = 0; i < half; i++) {
            const float c = cs[2 * i], s = cs[2 * i + 1];
            float *a = neox ? &xh[i] : &xh[2 * i];
            float *b = neox ? &xh[i + half] : &xh[2 * i + 1];
            const float x0 = *a, x1 = *b;
            *a = x0 * c - x1 * s;
            *b = x0 * s + x1 * c;
        }
    }
}

/* YaRN: dimensions below corr_dims[0] extrapolate, above corr_dims[1] interpolate,
 * with a linear ramp between (the formulas of the YaRN paper as ggml applies them). */
static float yarn_corr_dim(uint32_t n_dims, uint32_t n_ctx_orig, float n_rot, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

static float yarn_ramp(float low, float high, size_t i0) {
    const float y = ((float)(i0 / 2) - low) / fmaxf(0.001f, high - low);
    return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

void tern_rope_angles(const struct tern_rope_params *p, uint32_t pos, float *cs) {
    const uint32_t n_dims = p->n_rot;
    const float theta_scale = powf(p->freq_base, -2.0f / (float)n_dims);
    float corr[2] = {0, 0};
    if (p->ext_factor != 0.0f) {
        const float lo = floorf(yarn_corr_dim(n_dims, p->n_ctx_orig, p->beta_fast, p->freq_base));
        const float hi = ceilf(yarn_corr_dim(n_dims, p->n_ctx_orig, p->beta_slow, p->freq_base));
        corr[0] = fmaxf(0.0f, lo);
        corr[1] = fminf((float)n_dims - 1.0f, hi);
    }
    /* theta advances by repeated multiplication, as ggml computes it: the angles must
     * match the reference to the last bit of float rounding at large positions. */
    float theta = (float)pos;
    for (uint32_t i0 = 0; i0 < n_dims; i0 += 2) {
        const float ff = p->freq_factors ? p->freq_factors[i0 / 2] : 1.0f;
        const float theta_extrap = theta / ff;
        const float theta_interp = p->freq_scale * theta_extrap;
        float t = theta_interp;
        float mscale = p->attn_factor;
        if (p->ext_factor != 0.0f) {
            const float mix = yarn_ramp(corr[0], corr[1], i0) * p->ext_factor;
            t = theta_interp * (1.0f - mix) + theta_extrap * mix;
            mscale *= 1.0f + 0.1f * logf(1.0f / p->freq_scale);
        }
        cs[i0] = cosf(t) * mscale;
        cs[i0 + 1] = sinf(t) * mscale;
        theta *= theta_scale;
    }
}
