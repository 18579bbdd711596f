/* Element-wise and attention ops on F32 rows: RMSNorm, RoPE, SwiGLU, softmax, vector
 * adds, and attention of one query head over a paged KV cache.
 *
 * Each op has a portable implementation (always built) and, where it matters, an AVX2
 * twin (x86/ops-avx2.c); the set is chosen once with the kernels' ISA (TERN_ISA=portable
 * forces the portable one). For a given ISA every op is a pure function of its inputs:
 * one row at a time, reductions in one fixed order. Results therefore never depend on
 * how tokens are batched or how many threads run (DESIGN.md §5). Callers split work
 * across threads by rows, tokens or heads, never inside an op call. */
#ifndef TERN_KERNELS_OPS_H
#define TERN_KERNELS_OPS_H

#include "kernels/kernels.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A paged KV cache seen by one (layer, kv head): position j is in page j / page_rows,
 * at element head_off + (j % page_rows) * row_elems of it. Elements are F32 or F16 (IEEE
 * half). */
struct tern_kv_view {
    const void *const *k_pages;
    const void *const *v_pages;
    size_t page_rows;  /* positions per page */
    size_t row_elems;  /* elements from one position's row to the next */
    size_t head_off;   /* element offset of this head's first row in a page */
    bool f16;
};

struct tern_ops {
    const char *name; /* "portable", "avx2" */
    /* y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] (w NULL: no weight). y may be x. */
    void (*rmsnorm)(float *y, const float *x, const float *w, size_t n, float eps);
    /* y[i] = silu(g[i]) * u[i]. y may alias g or u. */
    void (*swiglu)(float *y, const float *g, const float *u, size_t n);
    /* y[i] += x[i] */
    void (*add)(float *y, const float *x, size_t n);
    /* In place x = softmax(x) (max subtracted; sum in ascending index order). */
    void (*softmax)(float *x, size_t n);
    /* dst[i] = src[i] rounded to IEEE half (round to nearest even). */
    void (*to_f16)(uint16_t *dst, const float *src, size_t n);
    /* One query head over KV positions [0, n_kv) in ascending order:
     * out[d] = sum_j softmax_j(scale * q.k_j) v_j[d]. scores: scratch of n_kv floats. */
    void (*attn_head)(float *out, const float *q, size_t head_dim, size_t n_kv, float scale,
                      const struct tern_kv_view *kv, float *scores);
};

/* The ops for the ISA the kernels chose (tern_kernels_isa()). */
const struct tern_ops *tern_ops(void);
/* For tests and benchmarks. tern_ops_avx2() is NULL when the CPU lacks AVX2/FMA/F16C. */
const struct tern_ops *tern_ops_portable(void);
const struct tern_ops *tern_ops_avx2(void);

/* RoPE on one token's heads, in place: x holds n_head heads of head_dim; the first
 * n_rot elements of each head rotate by the angles whose cos/sin are given
 * (cs[2i] = cos, cs[2i+1] = sin for pair i < n_rot/2). neox pairs element i with
 * i + n_rot/2 (GPT-NeoX, Qwen); otherwise adjacent elements 2i, 2i+1 (LLaMA). */
void tern_rope(float *x, size_t n_head, size_t head_dim, size_t n_rot, const float *cs, bool neox);

/* RoPE angles (YaRN / linear scaling as ggml defines them). */
struct tern_rope_params {
    uint32_t n_rot;        /* rotated dimensions per head (even) */
    float freq_base;       /* theta base, e.g. 10000 */
    float freq_scale;      /* 1 / linear or YaRN factor; 1 = no scaling */
    float ext_factor;      /* YaRN extrapolation mix (0 = off, 1 for YaRN) */
    float attn_factor;     /* magnitude scale (1 = none) */
    float beta_fast, beta_slow;
    uint32_t n_ctx_orig;   /* original training context for YaRN */
    const float *freq_factors; /* optional [n_rot/2] divisors of each frequency (rope_freqs) */
};
/* cs[2i], cs[2i+1] = cos, sin of pair i at position pos. Pure function of (params, pos). */
void tern_rope_angles(const struct tern_rope_params *p, uint32_t pos, float *cs);

/* ---- AVX2 implementations (x86/ops-avx2.c; never call directly) ---------------- */
void tern_ops_avx2_fill(struct tern_ops *ops);

#endif
