/* Gated DeltaNet: the per-token core of a Qwen3.5 / Qwen3-Next linear-attention layer.
 *
 * A layer sees, per token t, the projections of its normalised input (done by the
 * caller with batched matmuls):
 *   qkv_raw[C]   attn_qkv:  q (n_k_heads x d_k) | k (n_k_heads x d_k) | v (n_v_heads x d_v)
 *   z[n_v*d_v]   attn_gate: the output gate, per v-head
 *   beta[n_v]    ssm_beta:  the delta-rule write strength (before the sigmoid)
 *   alpha[n_v]   ssm_alpha: the decay input (before softplus)
 * and computes, in two steps that this module provides:
 *
 * 1. tern_deltanet_conv: a causal depthwise convolution over the C = 2*n_k*d_k +
 *    n_v*d_v channels with n_conv taps (ssm_conv1d), then SiLU. Its state is the
 *    window of the last n_conv - 1 inputs.
 * 2. tern_deltanet_heads: per v-head h (sharing k-head h % n_k_heads, as ggml's
 *    repeat broadcasts it), per token in order:
 *      q = l2norm(q) / sqrt(d_k);  k = l2norm(k)
 *      g = ssm_a[h] * softplus(alpha[h] + dt_bias[h])   (ssm_a = -exp(A_log) < 0)
 *      S = S * exp(g)                                   S: [d_k][d_v]
 *      delta = (v - S^T k) * sigmoid(beta[h])
 *      S = S + k (outer) delta
 *      o = S^T q
 *      out = rmsnorm(o) * ssm_norm * silu(z)
 *    The caller then applies ssm_out.
 *
 * Exactness (DESIGN.md §5): both functions run token by token in order with the same
 * code for one token (decoding) and for many (priming), and every result for token t
 * is a pure function of the state before t and token t's inputs. Work splits over
 * channels (conv) or v-heads (recurrence), never over a reduction, so the results do
 * not depend on the chunking or on the thread count. All vector loops run along the
 * d_v / channel axis with one accumulator per lane and no FMA, so the SIMD and the
 * portable paths give bit-identical results.
 *
 * State layouts (F32, what checkpoints copy and hashes cover):
 *   conv window [n_conv - 1][C]       row 0 = the oldest input
 *   recurrent   [n_v_heads][d_k][d_v] S[h][i][j]: key index i, value index j */
#ifndef TERN_MODEL_DELTANET_H
#define TERN_MODEL_DELTANET_H

#include "util/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Limits checked by tern_deltanet_shape_check (far above real models; they keep
 * every size product well inside size_t and the per-thread scratch small). */
#define TERN_DELTANET_MAX_HEADS 4096u
#define TERN_DELTANET_MAX_HEAD_DIM 4096u
#define TERN_DELTANET_MAX_CONV 64u

struct tern_deltanet_shape {
    uint32_t n_k_heads; /* ssm.group_count: heads of q and k */
    uint32_t n_v_heads; /* ssm.time_step_rank: heads of v, of the state and the output */
    uint32_t d_k;       /* ssm.state_size: q/k head dimension */
    uint32_t d_v;       /* ssm.inner_size / n_v_heads: v head dimension */
    uint32_t n_conv;    /* ssm.conv_kernel: taps of the causal convolution (>= 1) */
    bool k_grouped;     /* v-head h reads k-head h / (n_v / n_k) (qwen3next), else h % n_k (qwen35) */
    float eps;          /* floor of the q/k L2 norms and eps of the gated RMSNorm */
};

/* Checks the shape: nonzero dims, n_v_heads a multiple of n_k_heads, the limits
 * above, eps finite and >= 0. TERN_ERR_FORMAT naming the value otherwise. */
enum tern_status tern_deltanet_shape_check(const struct tern_deltanet_shape *s);

/* Sizes, in floats, for a checked shape. */
size_t tern_deltanet_channels(const struct tern_deltanet_shape *s);    /* C */
size_t tern_deltanet_conv_floats(const struct tern_deltanet_shape *s); /* (n_conv-1)*C */
size_t tern_deltanet_state_floats(const struct tern_deltanet_shape *s); /* n_v*d_k*d_v */
/* Scratch one call of tern_deltanet_heads needs (per thread). */
size_t tern_deltanet_scratch_floats(const struct tern_deltanet_shape *s);

/* Converts ssm_conv1d as stored (ggml shape {n_conv, C}: row c holds the n_conv taps
 * of channel c, oldest first) to the tap-major layout tern_deltanet_conv reads:
 * conv_wt[j][c] = conv_w[c][j]. Done once at load, so the per-token loop runs along
 * channels. */
void tern_deltanet_conv_weights(const struct tern_deltanet_shape *s, const float *conv_w,
                                float *conv_wt);

/* Causal convolution + SiLU of n_tok tokens for channels [c0, c1).
 *   window  [n_conv-1][C], updated: afterwards it holds the last n_conv-1 inputs
 *   conv_wt [n_conv][C]    tap-major weights (tern_deltanet_conv_weights); tap n_conv-1
 *                          meets the current token
 *   x       [n_tok] rows of C (row t at x + t*ldx): the attn_qkv projections
 *   y       [n_tok] rows of C (row t at y + t*ldy): silu(conv) written for [c0, c1)
 * x and y may not overlap. Channels are independent, so callers may split [0, C)
 * across threads. */
void tern_deltanet_conv(const struct tern_deltanet_shape *s, float *window, const float *conv_wt,
                        const float *x, size_t ldx, float *y, size_t ldy, size_t n_tok, size_t c0,
                        size_t c1);

/* y[i] = x[i] * sigmoid(x[i]) with the module's exp (a polynomial, vectorised, the
 * same bits in every lane and path). y may be x. */
void tern_deltanet_silu(float *y, const float *x, size_t n);

/* The small per-layer F32 vectors. */
struct tern_deltanet_params {
    const float *ssm_a;   /* [n_v_heads] = -exp(A_log), as stored in GGUF */
    const float *dt_bias; /* [n_v_heads] ssm_dt.bias */
    const float *norm_w;  /* [d_v] ssm_norm, shared by all heads */
};

/* The activations of a chunk of n_tok tokens; row t of each at base + t * ld. */
struct tern_deltanet_io {
    size_t n_tok;
    const float *qkv;   /* [n_tok][C] after tern_deltanet_conv */
    size_t ld_qkv;
    const float *z;     /* [n_tok][n_v*d_v] attn_gate projection */
    size_t ld_z;
    const float *beta;  /* [n_tok][n_v] ssm_beta projection (pre-sigmoid) */
    size_t ld_beta;
    const float *alpha; /* [n_tok][n_v] ssm_alpha projection (pre-softplus) */
    size_t ld_alpha;
    float *out;         /* [n_tok][n_v*d_v] gated-normed output, written for heads [h0, h1) */
    size_t ld_out;
};

/* Runs the gated delta rule for v-heads [h0, h1) over the chunk's tokens in order,
 * updating state [n_v][d_k][d_v] and writing io->out. scratch holds
 * tern_deltanet_scratch_floats() floats. Heads are independent: callers split
 * [0, n_v_heads) across threads, each with its own scratch. */
void tern_deltanet_heads(const struct tern_deltanet_shape *s, const struct tern_deltanet_params *p,
                         float *state, const struct tern_deltanet_io *io, uint32_t h0, uint32_t h1,
                         float *scratch);

/* Which implementation the functions above use. Both give bit-identical results; the
 * AVX2 one runs while the kernels' ISA (kernels.h, the one choice) is AVX2, so
 * TERN_ISA=portable forces the generic one. For tests and benchmarks: force one, which
 * sets the kernels' ISA with it (tern_kernels_set_isa); false if unavailable. */
enum tern_deltanet_path { TERN_DELTANET_GENERIC = 0, TERN_DELTANET_AVX2 = 1 };
bool tern_deltanet_set_path(enum tern_deltanet_path path);
enum tern_deltanet_path tern_deltanet_path(void);

#endif
