/* Mixture-of-experts feed-forward blocks (qwen3moe, qwen35moe), as llama.cpp's
 * build_moe_ffn computes them with a softmax gate:
 *
 *   p      = softmax(Wr h)                       router over n_expert logits
 *   e_j    = the n_used largest p, j = 0..n_used-1 (descending; ties to the lowest id)
 *   w_j    = p[e_j] / sum_j p[e_j] (norm_topk), times expert_weights_scale
 *   y      = sum_j w_j Wdown_e (silu(Wgate_e h) * Wup_e h)       j in rank order
 *   y     += sigmoid(Ws h) Wdown_s (silu(Wgate_s h) * Wup_s h)    (qwen35moe: shared expert)
 *
 * gpt-oss (llama.cpp's softmax_weight gate and swiglu_oai) differs in three places:
 *   l      = Wr h + br                           router logits with a bias
 *   e_j    = the n_used largest l; w = softmax(l[e_0..e_k-1])   (softmax over the k chosen)
 *   y      = sum_j w_j (Wdown_e f(Wgate_e h + bg_e, Wup_e h + bu_e) + bd_e)
 *            f(g, u) = x sigmoid(1.702 x) (y + 1), x = min(g, 7), y = clamp(u, -7, 7)
 *
 * A chunk's tokens are grouped by expert, so each expert's weights are read once per
 * chunk (prefill) and a decode step reads only the chosen experts.
 *
 * Exactness (DESIGN.md §5): routing is per token; every expert output row comes from
 * tern_matmul, whose rows do not depend on how many tokens share the expert's group;
 * the weighted sum of a token runs over its experts in rank order. A token's output is
 * therefore the same whatever chunk, group size or thread count computed it. */
#ifndef TERN_MODEL_MOE_H
#define TERN_MODEL_MOE_H

#include "model/model.h"

#define MOE_MAX_EXPERTS 1024u
#define MOE_MAX_USED 64u

struct moe_hparams {
    uint32_t n_expert;   /* {arch}.expert_count */
    uint32_t n_used;     /* {arch}.expert_used_count */
    uint32_t n_ff_exp;   /* {arch}.expert_feed_forward_length */
    uint32_t n_ff_shexp; /* {arch}.expert_shared_feed_forward_length; 0 = no shared expert */
    bool norm_topk;      /* renormalise the chosen weights to sum 1 */
    float scale;         /* {arch}.expert_weights_scale (1 when absent) */
    bool softmax_weight; /* gpt-oss: top-k on the raw (biased) logits, softmax over the k */
    bool swiglu_oai;     /* gpt-oss: the clamped swiglu above, expert biases */
};

struct moe_layer {
    struct mat router;        /* [n_embd, n_expert] ffn_gate_inp */
    struct mat gate, up;      /* expert 0 of [n_embd, n_ff_exp, n_expert] ffn_{gate,up}_exps */
    struct mat down;          /* expert 0 of [n_ff_exp, n_embd, n_expert] ffn_down_exps */
    size_t gate_stride, up_stride, down_stride; /* bytes from one expert to the next */
    /* The shared expert (data NULL when the architecture has none). */
    struct mat sh_gate_inp;   /* [n_embd, 1] ffn_gate_inp_shexp (1-D [n_embd] in quantized files) */
    struct mat sh_gate, sh_up; /* [n_embd, n_ff_shexp] */
    struct mat sh_down;       /* [n_ff_shexp, n_embd] */
    /* gpt-oss's biases (NULL for the others). */
    const float *router_b;    /* (n_expert) ffn_gate_inp.bias */
    const float *gate_b, *up_b; /* (n_expert, n_ff_exp) ffn_{gate,up}_exps.bias */
    const float *down_b;      /* (n_expert, n_embd) ffn_down_exps.bias */
};

/* Reads the expert keys of m's architecture. norm_topk is the architecture's default
 * (an {arch}.expert_weights_norm key overrides it); a gating function other than
 * softmax is refused. Errors name the key and the value. */
enum tern_status moe_hparams_load(struct tern_model *m, bool norm_topk, bool shared, struct moe_hparams *out);
/* Binds layer il's router, stacked experts and (when hp has one) shared expert; with
 * hp->swiglu_oai also the router's and the experts' biases (all required). */
enum tern_status moe_layer_load(struct tern_model *m, const struct moe_hparams *hp, uint32_t il,
                                struct moe_layer *out);

#endif
