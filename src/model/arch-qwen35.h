/* Qwen3.5's weights (arch-qwen35.c), shared with the GPU backend's upload
 * (backend/vulkan/forward.c). Internal to model/. */
#ifndef TERN_MODEL_ARCH_QWEN35_H
#define TERN_MODEL_ARCH_QWEN35_H

#include "kernels/deltanet.h"
#include "model/model.h"
#include "model/moe.h"

/* Read-only views into the mapping, except conv_wt (owned). */
struct q35_layer {
    bool recurrent;
    const float *attn_norm; /* (n_embd) */
    const float *post_norm; /* (n_embd) post_attention_norm: the FFN's input norm */
    /* DeltaNet */
    struct mat wqkv;        /* [n_embd, C] attn_qkv */
    struct mat wgate;       /* [n_embd, n_v * d_v] attn_gate (z) */
    struct mat wbeta;       /* [n_embd, n_v] ssm_beta */
    struct mat walpha;      /* [n_embd, n_v] ssm_alpha */
    struct mat wba;         /* qwen3next: [n_embd, 2 n_v] ssm_ba, per k-head [beta | alpha] (else wbeta, walpha) */
    float *conv_wt;         /* (n_conv, C) ssm_conv1d, tap-major copy */
    const float *ssm_a;     /* (n_v) -exp(A_log) */
    const float *dt_bias;   /* (n_v) ssm_dt.bias */
    const float *ssm_norm;  /* (d_v) */
    struct mat wout;        /* [n_v * d_v, n_embd] ssm_out */
    /* attention */
    struct mat wq;          /* [n_embd, n_head * 2 * head_dim]: per head [q | gate] */
    struct mat wk;          /* [n_embd, n_head_kv * head_dim] */
    struct mat wv;          /* [n_embd, n_head_kv * head_dim] */
    struct mat wo;          /* [n_head * head_dim, n_embd] */
    const float *q_norm;    /* (head_dim) */
    const float *k_norm;    /* (head_dim) */
    /* feed-forward */
    struct mat w_gate;      /* [n_embd, n_ff] */
    struct mat w_up;        /* [n_embd, n_ff] */
    struct mat w_down;      /* [n_ff, n_embd] */
    struct moe_layer moe;   /* qwen35moe: instead of w_gate/up/down */
};

struct q35_weights {
    bool moe;                  /* qwen35moe, qwen3next */
    bool next;                 /* qwen3next: fused ssm_ba, k-heads grouped (not tiled) over the v-heads */
    struct moe_hparams moe_hp; /* qwen35moe */
    struct tern_deltanet_shape dn;
    uint32_t n_layer;          /* layers run (block_count minus MTP layers) */
    uint32_t full_attn_interval;
    bool rope_pos0[64];        /* per RoPE pair: true when it takes position 0 (section e) */
    bool any_pos0;
    float rope_cs0[128];       /* (n_rot) cos/sin of every pair at position 0 */
    struct mat tok_embd;       /* [n_embd, n_vocab] */
    const float *out_norm;     /* (n_embd) */
    struct mat output;         /* [n_embd, n_vocab]; token_embd when tied */
    struct q35_layer *layers;  /* (n_layer) */
    /* The multi-token-prediction head (docs/spec.md, MTP), when the file has one: the
     * block blk.{n_layer}, a full-attention decoder layer plus the nextn tensors.
     *   x = eh_proj [rmsnorm(embd(t)) * enorm | rmsnorm(h) * hnorm]   (h: the main
     *       model's output-normed hidden state at the previous position)
     *   x = layer(x);  h' = rmsnorm(x) * head_norm;  logits = head h' */
    bool has_mtp;
    struct q35_layer mtp;      /* the decoder layer (recurrent = false) */
    struct mat eh_proj;        /* [2 n_embd, n_embd] nextn.eh_proj: input [embedding | hidden] */
    const float *enorm;        /* (n_embd) nextn.enorm, the embedding's norm */
    const float *hnorm;        /* (n_embd) nextn.hnorm, the hidden state's norm */
    const float *head_norm;    /* (n_embd) nextn.shared_head_norm, else output_norm */
    struct mat mtp_embd;       /* nextn.embed_tokens, else token_embd */
    struct mat mtp_head;       /* nextn.shared_head_head, else the output matrix */
};

/* The MTP head's forward (arch-qwen35.c), run on the head's own session (model/mtp.c). */
extern const struct tern_arch tern_arch_qwen35_mtp;

#endif
