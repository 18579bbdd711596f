/* The engine's internal API, shared by the architecture files (arch-*.c), the session
 * code and the layer building blocks. The public API is include/tern.h.
 *
 * A model is a list of layers, each either ATTENTION (it keeps K/V rows per position in
 * the session's paged KV cache: positional state, rewindable) or RECURRENT (it keeps
 * fixed-size byte buffers the architecture declares by name, e.g. a conv window and a
 * state matrix: valid only at the session's end, DESIGN.md §3). Sessions, checkpoints,
 * restore, fork and state hashes handle both kinds generically, so a new architecture
 * only provides a `struct tern_arch` (extension points below and in docs/engine.md):
 *
 *   load     read its hyperparameters, bind and validate its weights (views into the
 *            mapping), and declare its layers with model_layers_init();
 *   state_*  its scratch (the RunState: activations for one chunk, allocated through a
 *            backend);
 *   forward  consume a chunk of tokens at positions [pos0, pos0 + n) through the layer
 *            operations of the backend seam (backend.h), once for every backend: the
 *            attention operation writes K/V rows, the recurrent ones advance their
 *            buffers token by token, the output one produces logits.
 *
 * Exactness (DESIGN.md §5): every per-token computation goes through tern_matmul (batch
 * independent by contract), the per-row ops of kernels/ops.h, and model_attention()
 * (which writes the chunk's K/V rows into the cache first and always reads keys and
 * values back from the cache, so a token sees the same bytes whatever chunk wrote
 * them). Threads split rows, tokens or heads, never a reduction. */
#ifndef TERN_MODEL_MODEL_H
#define TERN_MODEL_MODEL_H

#include "tern.h"

#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"
#include "kernels/deltanet.h"
#include "util/status.h"
#include "util/threadpool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Positions per KV page: KV memory grows a page at a time as a session consumes
 * tokens, so a parked session holds what it used, not n_ctx. */
#define TERN_KV_PAGE 256u

#define MODEL_MAX_REC_BUFS 4
/* Sequences one evaluation step may hold (tern_eval_batch). */
#define MODEL_MAX_SEQS 256
/* Distinct activation formats a single model_matmul() call may need. */
#define MODEL_MAX_ACT_KINDS 3

struct tern_session;
struct tern_backend;
struct model_backend;
struct model_step;

/* ---- the batch of one evaluation step ---------------------------------------------- *
 * Rows of several sessions evaluated together (DESIGN.md §8): every per-row operation
 * (matmuls, norms, the feed-forward) sees all rows of the step as one batch, so the
 * weights are read once per step; the positional and stateful operations (RoPE,
 * attention, the recurrent layers) read each row's sequence. Since every row's result
 * is independent of the rows beside it (kernels.h), a sequence's bits do not depend on
 * what else is in its step. A single-session chunk is a batch of one sequence. */

/* Rows [row0, row0 + n) of the batch: session s's tokens at positions [pos0, pos0 + n). */
struct model_seq {
    struct tern_session *s;
    uint32_t row0, n, pos0;
    bool want; /* the logits after its last row are wanted */
    bool all;  /* the logits after every one of its rows are wanted (with want) */
};

struct model_batch {
    const int32_t *toks; /* (n) every row's token */
    uint32_t n;          /* rows in all */
    const struct model_seq *seq;
    uint32_t n_seq;
    /* NULL: no logits. Else [n_out][n_vocab], sequence by sequence in order: every row's
     * of a sequence with all, the last row's of one with want (only), none of the others. */
    float *logits;
};

/* ---- architecture hooks ------------------------------------------------------------ */

struct tern_arch {
    const char *name; /* general.architecture */
    /* Reads hyperparameters (model_hparams_load helps), binds and validates every tensor
     * it needs (model_get_mat / model_get_vec), declares the layers
     * (model_layers_init + model_layer_attn / model_layer_recurrent), and stores its
     * weights struct in m->w. On error everything it allocated is freed by unload. */
    enum tern_status (*load)(struct tern_model *m);
    void (*unload)(struct tern_model *m); /* frees m->w; must accept a partial load */
    /* Scratch for chunks of up to n_chunk tokens (the arch's RunState), its buffers
     * allocated through the backend be (backend.h): the CPU's for the model's workspace,
     * the GPU's for its device (backend/vulkan/forward.c). */
    enum tern_status (*state_new)(const struct tern_model *m, const struct model_backend *on, uint32_t n_chunk,
                                  void **out);
    void (*state_free)(void *rs);
    size_t (*state_bytes)(const void *rs);
    /* Consumes one step (backend.h's struct model_step) with the RunState rs, made for
     * the step's backend, through the step's operations only: b->n rows of tokens, each
     * sequence's rows at its own positions in its own state; b->n <= the chunk size the
     * state was made for. Logits as the output operation writes them. On the CPU, s is
     * the step's lead session (b->seq[0].s): it and every sequence's session point at
     * the model's workspace, and KV pages for every row's position exist; the recurrent
     * trail (tern_eval_opts.rec_trail) is the deltanet operation's. Must not fail
     * (everything is allocated up front) other than by a bug or a device's failure
     * (which the GPU's step keeps). */
    void (*forward)(const struct model_step *f, void *rs);
};

/* The registered architectures (arch.c); NULL when unknown. */
const struct tern_arch *tern_arch_find(const char *name);
/* Comma-separated names, for error messages. */
const char *tern_arch_names(void);

/* ---- model ------------------------------------------------------------------------- */

enum model_layer_kind { LAYER_ATTN = 0, LAYER_RECURRENT = 1 };

struct model_rec_buf {
    char name[24]; /* hash component suffix: "conv", "ssm" */
    size_t bytes;
    size_t offset; /* within the layer's recurrent block */
};

struct model_layer {
    enum model_layer_kind kind;
    /* ATTENTION: one K row and one V row per position, holding every kv head. */
    uint32_t n_kv_head;
    uint32_t head_dim_k, head_dim_v;
    /* ATTENTION, gpt-oss: a query at position p sees only the keys at (p - window, p]
     * (0: every key up to p), and sinks[h] (NULL: none) is head h's learned logit, which
     * joins the softmax's max and denominator and receives no value. Set by the
     * architecture after model_layers_init. The cache keeps every position's row of a
     * window layer all the same (docs/engine.md: a rewind or a resume needs them). */
    uint32_t window;
    const float *sinks;
    /* RECURRENT: named buffers, zero at position 0. */
    uint32_t n_bufs;
    struct model_rec_buf bufs[MODEL_MAX_REC_BUFS];
    size_t rec_bytes;  /* sum of bufs */
    size_t rec_offset; /* offset of this layer's block in a checkpoint */
};

/* Bytes of one position's K and V rows in an attention layer (0 for other kinds). */
static inline size_t model_layer_kv_row_bytes(const struct model_layer *L, enum tern_kv_type kv) {
    if (L->kind != LAYER_ATTN) return 0;
    return (size_t)L->n_kv_head * (L->head_dim_k + L->head_dim_v) * (kv == TERN_KV_F16 ? 2 : 4);
}

/* Hyperparameters every transformer in GGUF shares ({arch}.* keys). */
struct model_hparams {
    uint32_t n_vocab;     /* rows of token_embd */
    uint32_t n_ctx_train; /* {arch}.context_length */
    uint32_t n_embd;
    uint32_t n_layer;
    uint32_t n_ff;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim_k; /* {arch}.attention.key_length, default n_embd / n_head */
    uint32_t head_dim_v;
    float rms_eps;
    struct tern_rope_params rope; /* n_rot from {arch}.rope.dimension_count (default head_dim_k) */
};

/* A weight matrix: n rows (outputs) of k elements, a view into the mapping. */
struct mat {
    const char *name; /* tensor name (owned by the gguf file) */
    const void *data;
    enum tern_dtype type;
    uint32_t k, n;
    size_t row_bytes;
};

struct tern_model {
    struct tern_model_info info;
    const struct tern_arch *arch;
    struct gguf_file *f;
    struct tern_threadpool *pool;
    struct tern_tokenizer *tok; /* NULL when the file has no tokenizer */
    char *name;
    const char *chat_template; /* into the gguf file, or NULL */
    struct model_hparams hp;
    uint32_t n_layer;
    struct model_layer *layers; /* (n_layer) */
    size_t rec_bytes;           /* all recurrent buffers: a checkpoint's payload */
    size_t max_act_row_bytes;   /* largest prepared activation row of any bound matrix */
    uint32_t max_mat_n;         /* largest output count of any bound matrix */
    uint32_t n_act_kinds;       /* distinct activation formats of the bound matrices */
    enum tern_dtype act_kinds[8];
    void *w;                    /* the architecture's weights struct */
    /* Where the forward pass runs and the sessions' state lives (backend/backend.h): the
     * CPU's (backend_ctx NULL; its context is the workspace below) until
     * tern_model_use_device picks another, before any session exists; backend_ctx is then
     * the device's context (its weights and scratch). */
    const struct tern_backend *backend;
    void *backend_ctx;
    char device[300]; /* tern_model_device(): "" = "cpu" */
    atomic_uint n_sessions; /* live sessions, so that the device is chosen before there are any */
    /* Partial offload (tern_model_set_cpu_moe): the request, read when a device opens,
     * and what it resolved to there (the MoE layers whose experts stay on the CPU, of
     * cpu_moe_total). */
    uint32_t cpu_moe_req;
    uint64_t cpu_moe_reserve;
    uint32_t cpu_moe_n, cpu_moe_total;
    /* tern_model_set_gpu_layers: the weight matrices of layers [gpu_layers, ...) stay in
     * host memory (TERN_GPU_LAYERS_ALL, or gpu_layers_set false: none) */
    bool gpu_layers_set;
    uint32_t gpu_layers;
    uint64_t gpu_layers_reserve;
    uint32_t gpu_layers_n; /* what it resolved to on the device (auto) */
    /* Checkpoints kept in device memory (session.c, tern_model_set_ckpt_vram): the budget,
     * the list of those on the device (least recently taken or restored first) and the
     * counters, under ckpt_mu (taken before the tern_gpu's lock, never while holding it;
     * used only on a device and when checkpoints have bytes). */
    pthread_mutex_t ckpt_mu;
    size_t ckpt_vram_budget, ckpt_vram_bytes;
    uint32_t ckpt_vram_n;
    struct tern_checkpoint *ckpt_oldest, *ckpt_newest;
    uint64_t ckpt_kept, ckpt_spilled, ckpt_fallbacks, ckpt_restores_dev, ckpt_restores_host;

    /* The workspace of an evaluation: one chunk's activations, shared by every session
     * of the model (evaluations take eval_mu, one at a time, as they share the pool),
     * so that a parked session holds only its state. Grown when a session or an eval
     * needs a longer chunk or context, never during one. */
    pthread_mutex_t eval_mu;
    struct {
        uint32_t n_chunk;
        size_t scores_per_thread;
        void *rs;                       /* the architecture's RunState for n_chunk tokens */
        void *act[MODEL_MAX_ACT_KINDS]; /* (n_chunk, max_act_row_bytes) prepared activations */
        float *scores;                  /* (n_threads, scores_per_thread) attention scratch */
        float *logits;                  /* (logits_rows, n_vocab) a batch's logits, before they go to its sessions */
        uint32_t logits_rows;
        size_t bytes;
    } ws;
};

/* Reads the shared {arch}.* hyperparameters; n_vocab from token_embd's shape. */
enum tern_status model_hparams_load(struct tern_model *m, struct model_hparams *hp);

/* Binds a matrix named by the format (e.g. "blk.%u.attn_q.weight", il) of shape [k, n]
 * (ne[0] = k, the row length): present, a type tern_matmul supports, k a multiple of its
 * block, and exactly that shape. Errors name the tensor and the expected and actual
 * shape. The _opt variant accepts an absent tensor (out->data = NULL). */
enum tern_status model_get_mat(struct tern_model *m, struct mat *out, uint32_t k, uint32_t n, const char *fmt, ...)
    TERN_PRINTF(5, 6);
enum tern_status model_get_mat_opt(struct tern_model *m, struct mat *out, uint32_t k, uint32_t n, const char *fmt,
                                   ...) TERN_PRINTF(5, 6);
/* A stack of n_mat matrices [k, n] in one 3-D tensor [k, n, n_mat] (MoE experts): out is
 * the first matrix (checked as model_get_mat checks one), *stride the bytes from one
 * matrix to the next. */
enum tern_status model_get_mats(struct tern_model *m, struct mat *out, size_t *stride, uint32_t k, uint32_t n,
                                uint32_t n_mat, const char *fmt, ...) TERN_PRINTF(7, 8);
/* For dense feed-forward architectures: {arch}.feed_forward_length must be present and
 * non-zero (model_hparams_load reads it as optional, for the MoE architectures). */
enum tern_status model_require_ff(struct tern_model *m);
/* An F32 vector of n elements (norm weights, biases); *out = NULL when absent and
 * !required. */
enum tern_status model_get_vec(struct tern_model *m, const float **out, uint32_t n, bool required, const char *fmt,
                               ...) TERN_PRINTF(5, 6);
/* The token embedding table [n_embd, n_vocab] (n_vocab from the tensor): any type with
 * a dequantizer; when also used as the output matrix it must be a matmul type. */
enum tern_status model_get_embd(struct tern_model *m, struct mat *out, uint32_t n_embd, const char *name);

/* Declares n_layer layers (all ATTENTION by default, with the hparams' head geometry). */
enum tern_status model_layers_init(struct tern_model *m, uint32_t n_layer);
void model_layer_attn(struct tern_model *m, uint32_t il, uint32_t n_kv_head, uint32_t head_dim_k, uint32_t head_dim_v);
/* Declares a recurrent layer's buffers (names and sizes; n <= MODEL_MAX_REC_BUFS). */
enum tern_status model_layer_recurrent(struct tern_model *m, uint32_t il, const char *const *names,
                                       const size_t *bytes, uint32_t n);


/* ---- session ----------------------------------------------------------------------- */

struct kv_layer {
    void **k_pages; /* (n_pages_cap) pages of TERN_KV_PAGE rows of n_kv_head * head_dim_k */
    void **v_pages; /* (n_pages_cap) likewise with head_dim_v */
};


struct tern_session {
    struct tern_model *m;
    uint32_t n_ctx;
    enum tern_kv_type kv_type;
    uint32_t n_chunk;
    uint32_t n_past;
    int32_t *tokens; /* (tokens_cap) T[0..n_past) */
    uint32_t tokens_cap;
    struct kv_layer *kv; /* (n_layer) on the CPU (NULL on a device); NULL pages for recurrent layers */
    uint32_t n_pages;     /* CPU: pages allocated in every attention layer */
    uint32_t n_pages_cap; /* ceil(n_ctx / TERN_KV_PAGE) */
    uint8_t *rec;         /* (m->rec_bytes) all recurrent buffers, layer by layer */
    float *logits;        /* (n_vocab) after the last consumed token */
    bool logits_valid;
    /* During an evaluation: the model's workspace (m->ws), for chunks of up to rs_chunk
     * tokens; NULL otherwise. */
    uint32_t rs_chunk;
    void *rs;                       /* the architecture's RunState */
    void *act[MODEL_MAX_ACT_KINDS]; /* prepared activations */
    float *scores;                  /* (n_threads, scores_per_thread) attention scratch */
    size_t scores_per_thread;
    /* During a chunk of an eval with tern_eval_opts.rec_trail: [n][rec_bytes] where the
     * forward copies each recurrent layer's buffers after each token; NULL otherwise. */
    uint8_t *rec_trail;
    /* The trail of the last eval (tern_session_rewind may use it): the states after
     * positions trail_pos0 + 1 .. trail_end; NULL once any other state change happens. */
    const uint8_t *trail;
    uint32_t trail_pos0, trail_end;
    /* Multi-token prediction (model/mtp.h): while set, the forward writes the
     * output-normed hidden state of the row at position p to hidden_out + (p -
     * hidden_pos0) * n_embd; an MTP head's session reads the main model's hidden state
     * for its row at position p from hidden_in likewise. NULL otherwise. */
    float *hidden_out;
    const float *hidden_in;
    uint32_t hidden_pos0;
    /* A device session (tern_model_use_device): its state on the device (the backend's
     * own type; NULL on the CPU); kv pages stay empty. rec is then a host copy of the
     * recurrent state, valid unless rec_stale (set by every eval, cleared by a download or
     * an upload). */
    void *dev;
    bool rec_stale;
};

/* The layer il's recurrent buffer ib (zeroed at position 0). */
static inline void *session_rec_buf(struct tern_session *s, uint32_t il, uint32_t ib) {
    const struct model_layer *L = &s->m->layers[il];
    return s->rec + L->rec_offset + L->bufs[ib].offset;
}

/* The registered architectures' objects (one per file). */
extern const struct tern_arch tern_arch_llama;
extern const struct tern_arch tern_arch_qwen2;
extern const struct tern_arch tern_arch_qwen3;
extern const struct tern_arch tern_arch_qwen3moe;  /* arch-llama.c */
extern const struct tern_arch tern_arch_qwen35;    /* arch-qwen35.c */
extern const struct tern_arch tern_arch_qwen35moe; /* arch-qwen35.c */
extern const struct tern_arch tern_arch_qwen3next; /* arch-qwen35.c: Qwen3-Next, Qwen3-Coder-Next */
extern const struct tern_arch tern_arch_gptoss;    /* arch-gptoss.c */

#endif
