/* The model generator behind `tern mkmodel`: writes a deterministic random-weight GGUF
 * with the metadata keys and tensor names/shapes that real models of an architecture
 * carry (llama, qwen2, qwen3, qwen35, qwen3moe, qwen35moe), so that the engine, benchmarks and tests can run
 * on any shape without downloading weights.
 *
 * Weights (as /work/shared/models/README.md describes the reference generator):
 * matmul weights, embeddings and biases ~ N(0, 0.02); norm weights 1 + N(0, 0.02);
 * qwen35 ssm_a = -exp(U(ln 1, ln 16)), ssm_dt.bias = 1 + N(0, 0.02),
 * ssm_conv1d ~ N(0, 0.3). Each tensor draws from its own stream, seeded from the seed and
 * the tensor's name, so one tensor's values do not depend on the others (a model with
 * more layers starts with the same layers). Same parameters, same bytes. */
#ifndef TERN_MODEL_MKMODEL_H
#define TERN_MODEL_MKMODEL_H

#include "util/dtype.h"
#include "util/status.h"

#include <stdbool.h>
#include <stdint.h>

enum tern_mk_arch {
    TERN_MK_LLAMA,
    TERN_MK_QWEN2,
    TERN_MK_QWEN3,
    TERN_MK_QWEN35,
    TERN_MK_QWEN3MOE,
    TERN_MK_QWEN35MOE,
    TERN_MK_GPTOSS,
    TERN_MK_QWEN3NEXT /* qwen35moe's layout with a fused ssm_ba, grouped k-heads, plain partial RoPE */
};

/* How tensors are typed. */
enum tern_mk_mix {
    TERN_MK_UNIFORM = 0, /* every matmul weight and embedding in wtype */
    TERN_MK_LIKE_QUANTIZE, /* as llama-quantize: output (or tied token_embd) Q6_K below Q6_K */
    TERN_MK_Q4_K_M,      /* llama-quantize's Q4_K_M: Q4_K, output and some attn_v/attn_qkv/ffn_down Q6_K */
    TERN_MK_MXFP4_MOE,   /* llama-quantize's MXFP4_MOE: expert matrices MXFP4, the other matrices wtype (Q8_0) */
    TERN_MK_Q2_K,        /* llama-quantize's Q2_K: Q2_K; attn_v/attn_qkv Q4_K (GQA >= 4) or Q3_K,
                            attn_output and ffn_down Q3_K, output Q6_K */
    TERN_MK_Q3_K_M,      /* llama-quantize's Q3_K_M: Q3_K; the first two attn_v/attn_qkv Q5_K, the
                            rest Q4_K; attn_output Q4_K; ffn_down Q5_K in the first sixteenth of the
                            layers, else Q4_K; output Q6_K */
    TERN_MK_UD_Q2,       /* a low-bit MoE mix in the manner of unsloth's UD-Q2_K_XL (not its exact
                            choices): routed experts' gate/up IQ2_XXS, down IQ3_XXS (IQ2_S / IQ3_S in
                            the use_more_bits layers); attention and DeltaNet projections IQ3_S,
                            their small k/v/alpha/beta Q8_0; shared experts and token_embd Q4_K;
                            output Q6_K */
};

struct tern_mkmodel_params {
    enum tern_mk_arch arch;
    const char *name;       /* general.name; NULL = "<preset or arch>-random" */
    uint32_t n_layer;
    uint32_t n_embd;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim;
    uint32_t n_ff;
    uint32_t n_ctx;         /* context_length written to the file */
    uint32_t n_vocab;       /* 0 = the vocabulary's own size; larger pads with [PAD<id>] tokens */
    bool tied;              /* no output.weight: the output projection is token_embd */
    float rope_theta;
    float rms_eps;
    uint32_t rope_dim;      /* rope.dimension_count; 0 = head_dim (qwen35: head_dim / 4) */
    /* qwen35 (Gated DeltaNet layers) */
    uint32_t ssm_k_heads;   /* ssm.group_count */
    uint32_t ssm_v_heads;   /* ssm.time_step_rank */
    uint32_t ssm_state;     /* ssm.state_size: the head dimension of both */
    uint32_t ssm_conv;      /* ssm.conv_kernel */
    uint32_t full_attn_interval; /* every n-th layer (n-1, 2n-1, ...) is full attention */
    int32_t rope_sections[4];    /* all 0 = derived from rope_dim as Qwen3.5 splits it */
    uint32_t n_mtp;              /* MTP (nextn) blocks after the main layers (qwen35, qwen35moe; 0 or 1) */
    /* Tests: an MTP block that echoes the main model: eh_proj passes the hidden half
     * through and the feed-forward's output projection is zero; 1: the attention's too,
     * so its guess for the token at p + 2 is nearly the main model's for p + 1 (a model
     * that repeats itself gets its drafts accepted); 2: the attention stays random, a
     * perturbation that depends on the head's KV rows. */
    uint32_t mtp_echo;
    /* qwen3moe / qwen35moe (mixture of experts; n_ff is then only written as a key) */
    uint32_t n_expert;           /* expert_count */
    uint32_t n_expert_used;      /* expert_used_count */
    uint32_t n_ff_exp;           /* expert_feed_forward_length */
    uint32_t n_ff_shexp;         /* expert_shared_feed_forward_length (qwen35moe) */
    /* gpt-oss: attention.sliding_window (even layers), YaRN rope.scaling.factor and
     * original_context_length; the sinks and biases are drawn as the kit's generator does. */
    uint32_t sliding_window;
    float yarn_factor;
    uint32_t yarn_orig_ctx;

    enum tern_dtype wtype;  /* F32, F16, BF16 or a quantized type */
    enum tern_mk_mix mix;
    /* The padding tokens up to n_vocab are NORMAL tokens whose text ("[PAD<id>]") is
     * rendered, not UNUSED ones (benchmarks that count streamed tokens of a random model). */
    bool pad_normal;
    uint64_t seed;
    const char *vocab_path; /* a GGUF whose tokenizer.* keys are copied verbatim; NULL = built-in */
};

/* Defaults for an architecture (a small model: 4 layers, n_embd 256 ...). */
void tern_mkmodel_defaults(enum tern_mk_arch arch, struct tern_mkmodel_params *p);
/* Presets: "tiny-qwen3", "tiny-qwen35", "tiny-qwen3moe", "tiny-qwen35moe" (the shapes of
 * the shared tiny models), "qwen3-0.6b", "qwen3.5-0.8b", "qwen3-30b-a3b",
 * "qwen3.5-35b-a3b", "tiny-llama", "tiny-qwen2", "tiny-gptoss", "gpt-oss-20b". TERN_ERR_INVALID
 * if unknown. */
enum tern_status tern_mkmodel_preset(const char *name, struct tern_mkmodel_params *p);
/* Comma-separated preset names, for usage texts. */
const char *tern_mkmodel_preset_names(void);
bool tern_mk_arch_from_name(const char *s, enum tern_mk_arch *out);
const char *tern_mk_arch_name(enum tern_mk_arch a);
/* Parses a --type value: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m
 * iq4_xs iq4_nl mxfp4_moe, the low-bit types, the q2_k and q3_k_m mixes and ud_q2. */
bool tern_mkmodel_parse_type(const char *s, enum tern_dtype *wtype, enum tern_mk_mix *mix);

/* Checks the shape (divisibility, ranges); TERN_ERR_INVALID naming the value. */
enum tern_status tern_mkmodel_check(const struct tern_mkmodel_params *p);

struct tern_mkmodel_stats {
    uint64_t n_params;
    uint64_t n_bytes;       /* tensor data */
    uint32_t n_tensors;
    uint32_t n_vocab;
    uint32_t n_f32_fallback; /* tensors kept F32 because their rows do not fit the block size */
};

/* Writes the model to path (atomically: a failed write leaves no file). Tensor data is
 * produced while writing, a few MB at a time, so memory stays small whatever the
 * model size. stats may be NULL. */
enum tern_status tern_mkmodel_write(const struct tern_mkmodel_params *p, const char *path,
                                    struct tern_mkmodel_stats *stats);

/* One tensor of the plan: what the file will hold. */
struct tern_mkmodel_tensor {
    char name[96];
    enum tern_dtype type;
    uint32_t n_dims;
    uint64_t ne[4];
};

/* The tensors tern_mkmodel_write would write, in file order, without generating any
 * data (caller frees *out). stats may be NULL. */
enum tern_status tern_mkmodel_plan(const struct tern_mkmodel_params *p, struct tern_mkmodel_tensor **out,
                                   uint32_t *n, struct tern_mkmodel_stats *stats);

#endif
