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

/* One query of attn_page_multi: its q (head_dim floats) and its running state. */
struct tern_attn_query {
    const float *q;
    float *acc; /* head_dim */
    float *m, *l;
};

/* The most queries one attn_page_multi call takes. */
#define TERN_ATTN_MAX_Q 32

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
    /* One page of attention for one query head, with an online softmax: positions are
     * consumed in fixed blocks (the KV pages) from position 0, so a query's result
     * depends only on its own positions, never on the other queries of a batch.
     * For the n rows k_j, v_j (row_elems elements apart, F16 or F32):
     *   s_j = scale * q.k_j;  m' = max(*m, max_j s_j);  c = exp(*m - m');
     *   *l = *l * c + sum_j exp(s_j - m');  acc = acc * c + sum_j exp(s_j - m') v_j
     * (j ascending), then *m = m'. Start with *m = -INFINITY, *l = 0, acc = 0; the
     * attention output is acc / *l. scores: scratch of n + 8 floats; n >= 1. */
    void (*attn_page)(float *acc, float *m, float *l, const float *q, size_t head_dim, const void *k,
                      const void *v, size_t row_elems, size_t n, float scale, bool f16, float *scores);
    /* attn_page for nq (1..TERN_ATTN_MAX_Q) queries over the same n rows: each query's
     * acc, *m and *l come out with exactly the bits attn_page alone would give it (the
     * same operations in the same order per query), whatever nq and whatever the other
     * queries. Where it pays (the AVX-512 loops, from 4 queries) the rows are read, and
     * F16 rows converted to float, once for all of them instead of once per query; else
     * the queries run one after another. scratch: tern_attn_multi_scratch_floats(nq, n,
     * head_dim) floats. */
    void (*attn_page_multi)(const struct tern_attn_query *qs, size_t nq, size_t head_dim, const void *k,
                            const void *v, size_t row_elems, size_t n, float scale, bool f16, float *scratch);
};

/* Floats of scratch attn_page_multi needs for nq queries over up to n rows (any op set). */
size_t tern_attn_multi_scratch_floats(size_t nq, size_t n, size_t head_dim);

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
