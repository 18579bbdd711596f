/* The LLaMA family's weights (arch-llama.c), shared with the GPU backend's upload
 * (backend/vulkan/forward.c). Internal to model/. */
#ifndef TERN_MODEL_ARCH_LLAMA_H
#define TERN_MODEL_ARCH_LLAMA_H

#include "model/model.h"
#include "model/moe.h"

struct llama_variant {
    bool neox;    /* RoPE pairs i and i + n_rot/2 (else adjacent pairs) */
    bool qk_norm; /* attn_q_norm / attn_k_norm required */
    bool biases;  /* attn_{q,k,v}.bias required */
    bool moe;     /* the feed-forward is a mixture of experts (qwen3moe) */
};

/* Read-only views into the mapping. */
struct llama_layer {
    const float *attn_norm;      /* (n_embd) */
    struct mat wq;               /* [n_embd, n_head * head_dim] */
    struct mat wk;               /* [n_embd, n_head_kv * head_dim] */
    struct mat wv;               /* [n_embd, n_head_kv * head_dim] */
    struct mat wo;               /* [n_head * head_dim, n_embd] */
    const float *bq, *bk, *bv;   /* (n_head * head_dim), (n_head_kv * head_dim) x2; NULL if absent */
    const float *q_norm, *k_norm; /* (head_dim); NULL if absent */
    const float *ffn_norm;       /* (n_embd) */
    struct mat w_gate;           /* [n_embd, n_ff] */
    struct mat w_up;             /* [n_embd, n_ff] */
    struct mat w_down;           /* [n_ff, n_embd] */
    struct moe_layer moe;        /* qwen3moe: router and experts instead of w_gate/up/down */
};

struct llama_weights {
    struct llama_variant var;
    struct moe_hparams moe;    /* qwen3moe */
    struct mat tok_embd;       /* [n_embd, n_vocab] */
    const float *out_norm;     /* (n_embd) */
    struct mat output;         /* [n_embd, n_vocab]; token_embd when tied */
    const float *rope_freqs;   /* (n_rot / 2) frequency divisors; NULL if absent */
    struct llama_layer *layers; /* (n_layer) */
};

#endif
