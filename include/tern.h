/* tern — public C API: models, sessions, session state, sampling.
 *
 * Conventions (STYLE.md):
 * - Fallible calls return enum tern_status (0 = ok, negative = error); on error
 *   tern_last_error() gives a message naming the bad value and the limit.
 * - Opaque handles; every constructor has a free function; free(NULL) is a no-op.
 * - Library code never prints to stdout and never exits; it logs through a hook.
 *
 * The state model is DESIGN.md §3: a session is a model state plus the exact token
 * sequence T[0..n) it has consumed. Attention layers keep KV rows [0, n) and can be
 * rewound to any p <= n. Recurrent layers (Gated DeltaNet) are valid only at n; a
 * checkpoint copies them so that a session can later be restored to that position.
 * Every computation is independent of chunking and thread count (DESIGN.md §5), so a
 * resumed session is bit-identical to a cold one over the same tokens. */
#ifndef TERN_H
#define TERN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status and errors ------------------------------------------------------------ */

enum tern_status {
    TERN_OK = 0,
    TERN_ERR_NOMEM = -1,       /* an allocation failed */
    TERN_ERR_IO = -2,          /* a file could not be opened, read or mapped */
    TERN_ERR_FORMAT = -3,      /* malformed input: GGUF, JSON, token ids ... */
    TERN_ERR_UNSUPPORTED = -4, /* well-formed but not supported (arch, type, version) */
    TERN_ERR_INVALID = -5,     /* an invalid argument or request */
    TERN_ERR_RANGE = -6,       /* a value out of range, e.g. a prompt longer than the context */
    TERN_ERR_STATE = -7,       /* not valid in this state, e.g. rewinding a hybrid session */
    TERN_ERR_CANCELLED = -8,   /* stopped by a cancel flag or callback */
    TERN_ERR_TEMPLATE = -9,    /* a chat template failed to parse or render */
    TERN_ERR_LIMIT = -10,      /* a configured limit (size, depth, iterations) was hit */
    TERN_ERR_INTERNAL = -11,   /* a bug */
};

const char *tern_status_str(enum tern_status st);
/* The calling thread's message for the last error (never NULL). */
const char *tern_last_error(void);

/* ---- logging ---------------------------------------------------------------------- */

enum tern_log_level { TERN_LOG_ERROR = 0, TERN_LOG_WARN = 1, TERN_LOG_INFO = 2, TERN_LOG_DEBUG = 3 };
typedef void (*tern_log_hook)(enum tern_log_level level, const char *msg, void *user);
/* NULL restores the default hook (stderr). */
void tern_log_set_hook(tern_log_hook hook, void *user);
void tern_log_set_level(enum tern_log_level level);

/* ---- models ----------------------------------------------------------------------- */

struct tern_model;
struct tern_tokenizer; /* src/tokenizer/tokenizer.h */

struct tern_model_params {
    const char *path;  /* GGUF file */
    bool no_mmap;      /* read the weights into anonymous memory instead of mapping */
    bool mlock;        /* pin the weights in memory */
    int n_threads;     /* compute threads; 0 = number of online cores */
};

void tern_model_params_default(struct tern_model_params *p);
/* Loads a model. Weights are used in place from the mapping (no dequantization at
 * load). On error *out is NULL. */
enum tern_status tern_model_load(const struct tern_model_params *p, struct tern_model **out);
void tern_model_free(struct tern_model *m);

struct tern_model_info {
    const char *arch;           /* "llama", "qwen2", "qwen3", "qwen35" */
    const char *name;           /* general.name, or the file name */
    uint32_t n_vocab;
    uint32_t n_ctx_train;
    uint32_t n_embd;
    uint32_t n_layer;
    uint32_t n_attn_layers;      /* layers with a KV cache */
    uint32_t n_recurrent_layers; /* layers with recurrent state (0 for attention-only) */
    bool hybrid;                 /* n_recurrent_layers > 0: rewinding needs checkpoints */
    uint64_t n_params;
    uint64_t weight_bytes;       /* bytes of all tensors, as read per decoded token */
    size_t kv_bytes_per_token_f16; /* KV bytes per position, F16 cache */
    size_t recurrent_bytes;      /* bytes of the recurrent state (= a checkpoint's payload) */
    bool has_mtp;                /* a multi-token-prediction head (Qwen3.5 nextn): --spec mtp */
    int n_threads;
};

const struct tern_model_info *tern_model_info(const struct tern_model *m);
/* The model's tokenizer (owned by the model). */
const struct tern_tokenizer *tern_model_tokenizer(const struct tern_model *m);
/* tokenizer.chat_template, or NULL when the file has none. Owned by the model. */
const char *tern_model_chat_template(const struct tern_model *m);

/* ---- devices (docs/gpu.md) --------------------------------------------------------- */

/* Runs the model's sessions on `device`: "cpu" (where a model starts; a model on a device
 * comes back to the CPU), or "vulkan:N" ("vulkan" is vulkan:0), Vulkan device N as
 * `tern devices` lists them. On a device the weights are uploaded once and every session
 * made afterwards keeps its KV cache and recurrent state on the device (the KV cache in
 * pages of 256 positions taken as the session grows, as on the CPU; tern_session_reserve
 * takes them ahead and says TERN_ERR_NOMEM, with the sizes, when the device has no room);
 * its chunks are evaluated there, one step at a time (the device's activations are
 * shared), in chunks of at most n_chunk tokens (0 = TERN_DEFAULT_CHUNK). Every session
 * call works on a device session, with these differences:
 * - exactness holds within the device (chunking, batches, resume: bit for bit), not
 *   across backends; a checkpoint is host memory, its bytes laid out as the CPU's,
 *   unless tern_model_set_ckpt_vram keeps it on the device; fork and restore copy KV
 *   rows and recurrent state on the device (no host round trip);
 * - tern_eval_batch runs its items' rows as one device step (the weights read once for
 *   all; attention and recurrent layers per session), split into steps of at most
 *   n_chunk rows when they are more; a device failure leaves every item's state
 *   undefined;
 * - rec_trail (speculative verification on hybrid models): the states stay in device
 *   memory (the session's trail there; the caller's buffer is not written) and
 *   tern_session_rewind copies the one it needs on the device; an MTP head (spec) is
 *   made on the device too;
 * - a failure of the device (TERN_ERR_IO, "device lost") during an eval leaves the
 *   session unusable; later calls fail the same way.
 * Call it before any session of m exists (else TERN_ERR_STATE). Errors, m unchanged: an
 * unknown device name (TERN_ERR_INVALID), no Vulkan or no such device
 * (TERN_ERR_UNSUPPORTED / TERN_ERR_IO, naming what is missing), an architecture or weight
 * type the backend lacks (TERN_ERR_UNSUPPORTED, naming the tensor), device memory too
 * small (TERN_ERR_NOMEM, with both sizes, checked before allocating). */
enum tern_status tern_model_use_device(struct tern_model *m, const char *device, uint32_t n_chunk);
/* Partial offload of a mixture-of-experts model (docs/gpu.md, "Partial offload"): on a
 * device, the routed experts of the first n MoE layers stay in host memory and run on the
 * CPU's kernels (the router and the experts' matmuls); everything else of those layers
 * (attention or the DeltaNet, the norms, the shared expert) and every other layer runs on
 * the device, the layer's normed rows crossing to the host and its output back, once per
 * MoE layer per step. TERN_CPU_MOE_ALL: every MoE layer; TERN_CPU_MOE_AUTO: the fewest
 * first layers that leave reserve_bytes of the device's memory (a session's state)
 * free after the weights and the scratch; 0 (the default): none. Set it before
 * tern_model_use_device; a model without experts, or on the CPU, ignores it. Within one
 * setting a token's logits do not depend on its chunk or batch (the CPU's MoE block is
 * batch-invariant too); across settings the parity rules apply. */
#define TERN_CPU_MOE_ALL UINT32_MAX
#define TERN_CPU_MOE_AUTO (UINT32_MAX - 1)
void tern_model_set_cpu_moe(struct tern_model *m, uint32_t n_layers, uint64_t reserve_bytes);
/* The MoE layers whose experts run on the CPU (after tern_model_use_device resolved
 * auto), and the MoE layers in all. */
void tern_model_cpu_moe(const struct tern_model *m, uint32_t *n_cpu, uint32_t *n_moe);
/* Partial offload of any model (docs/gpu.md, "Partial offload"): on a device, the weight
 * matrices of the first n layers (the file's blk.0 .. blk.n-1) are uploaded and those of
 * the later layers stay in host memory, their matmuls run by the CPU's kernels (the
 * step's rows read back, multiplied, the products uploaded: one round trip per matmul of
 * such a layer; a MoE layer's router and routed experts as with tern_model_set_cpu_moe).
 * Everything else of every layer runs on the device: attention or the DeltaNet, the norms,
 * the shared expert, the KV cache and the recurrent state, so sessions, checkpoints,
 * reuse and state hashes are unchanged. TERN_GPU_LAYERS_ALL (the default): every layer.
 * Set it before tern_model_use_device; on the CPU it is ignored. Within one setting a
 * token's logits do not depend on its chunk or batch; across settings the parity rules
 * apply (the CPU's kernels read quantized activations). */
#define TERN_GPU_LAYERS_ALL UINT32_MAX
/* TERN_GPU_LAYERS_AUTO: as many first layers as fit the device's memory with reserve_bytes
 * (a session's state) left free after everything else (not with TERN_CPU_MOE_AUTO). */
#define TERN_GPU_LAYERS_AUTO (UINT32_MAX - 1)
void tern_model_set_gpu_layers(struct tern_model *m, uint32_t n_layers, uint64_t reserve_bytes);
/* The layers whose weight matrices stay in host memory (0 on the CPU or without
 * --gpu-layers). */
uint32_t tern_model_cpu_layers(const struct tern_model *m);
/* "cpu", or "vulkan:N 'device name'". Owned by the model. */
const char *tern_model_device(const struct tern_model *m);

/* Checkpoints of a device model's sessions kept in device memory (tern serve
 * --cache-vram): while their device bytes stay within `bytes`, a new checkpoint stays on
 * the device (taken, restored and forked from by copies on the device). When one more
 * would pass the budget, the least recently taken or restored are spilled to host memory
 * first, their bytes laid out as the CPU's (tern_checkpoint_data, the disk tier and the
 * hashes read them as before); when the device has no room for it, the new one is made in
 * host memory instead (counted as a fallback). Restoring from either place gives the same
 * bits. 0, the default: every checkpoint is host memory. A smaller budget spills at
 * once; a model on the CPU ignores it. A device checkpoint's tern_checkpoint_bytes
 * counts its host size all the same (the pool's budget then holds when it spills).
 * Free every checkpoint before its model. */
void tern_model_set_ckpt_vram(struct tern_model *m, size_t bytes);
struct tern_ckpt_vram_stats {
    size_t budget;            /* the budget set, bytes */
    size_t bytes;             /* device bytes of the checkpoints on the device now */
    uint32_t n;               /* checkpoints on the device now */
    uint64_t kept;            /* checkpoints made on the device, in all */
    uint64_t spilled;         /* moved to host memory for the budget (or by the device's room) */
    uint64_t fallbacks;       /* made in host memory because the device had no room */
    uint64_t restores_device; /* restores and forks from a checkpoint on the device */
    uint64_t restores_host;   /* ... from one in host memory (uploaded), on a device model */
};
void tern_model_ckpt_vram_stats(const struct tern_model *m, struct tern_ckpt_vram_stats *out);

/* ---- sessions --------------------------------------------------------------------- */

/* The default tokens per priming chunk (tern_session_params.n_chunk). */
#define TERN_DEFAULT_CHUNK 512u

struct tern_session;
struct tern_checkpoint;

enum tern_kv_type { TERN_KV_F16 = 0, TERN_KV_F32 = 1 };

struct tern_session_params {
    uint32_t n_ctx;    /* 0 = min(model context, 32768) */
    enum tern_kv_type kv_type;
    uint32_t n_chunk;  /* tokens per priming chunk; 0 = TERN_DEFAULT_CHUNK */
};

void tern_session_params_default(struct tern_session_params *p);
/* KV memory grows with use (it is not reserved for n_ctx up front). */
enum tern_status tern_session_new(struct tern_model *m, const struct tern_session_params *p,
                                  struct tern_session **out);
void tern_session_free(struct tern_session *s);

struct tern_model *tern_session_model(const struct tern_session *s);
uint32_t tern_session_n_ctx(const struct tern_session *s);
/* Number of consumed tokens n, and the tokens T[0..n). */
uint32_t tern_session_n_past(const struct tern_session *s);
const int32_t *tern_session_tokens(const struct tern_session *s);
/* Bytes of memory the session holds (tokens, logits, KV pages in use, recurrent state;
 * on a device also its device state: the KV cache for n_ctx and the recurrent state).
 * The evaluation workspace (one chunk's activations) belongs to the model and is
 * shared by its sessions. */
size_t tern_session_bytes(const struct tern_session *s);

/* The callbacks run between chunks, with the session consistent at n_past: they may
 * read, hash, checkpoint and fork it, and use other sessions of the same model, but
 * must not eval, rewind, restore or free it. */
/* Called when evaluation reaches a checkpoint position; takes ownership of ckpt. */
typedef void (*tern_ckpt_cb)(void *user, struct tern_checkpoint *ckpt);
/* Called after every chunk with tokens done so far; a nonzero return cancels. */
typedef int (*tern_progress_cb)(void *user, size_t done, size_t total);

struct tern_eval_opts {
    uint32_t n_chunk;              /* 0 = the session's */
    float *logits_all;             /* if set: [n][n_vocab] logits of every evaluated token */
    const atomic_int *cancel;      /* checked between chunks (another thread sets it): nonzero stops */
    tern_progress_cb progress;
    void *user;                    /* passed to progress and on_ckpt */
    /* Checkpoint positions, ascending, each in (n_past, n_past + n]: a checkpoint of
     * the state after consuming T[0..p) is taken before token p is consumed (p ==
     * n_past + n means after the last one). Priming splits chunks at these positions;
     * results do not depend on it. */
    const uint32_t *ckpt_pos;
    size_t n_ckpt;
    tern_ckpt_cb on_ckpt;
    void *ckpt_user;               /* passed to on_ckpt (NULL: user): each callback its own context */
    /* Hybrid models (speculative verification): if set, [n][recurrent_bytes] receives
     * the recurrent state after each evaluated token, so that tern_session_rewind can
     * go back to any position this eval reached without a checkpoint. The caller owns
     * the buffer and keeps it unchanged while it may rewind; the next eval, restore or
     * fork forgets it. Results do not depend on it. */
    void *rec_trail;
};

/* Consumes toks[0..n) in chunks. The logits after the last token are then available
 * from tern_session_logits().
 * Errors: TERN_ERR_RANGE when n_past + n exceeds n_ctx (checked before anything is
 * computed: the session is unchanged; the message has both numbers); TERN_ERR_FORMAT
 * for a token id outside the vocabulary (unchanged); TERN_ERR_CANCELLED when cancelled
 * (the session has consumed a prefix ending at a chunk boundary: see n_past, and it
 * is consistent and usable). */
enum tern_status tern_session_eval(struct tern_session *s, const int32_t *toks, size_t n,
                                   const struct tern_eval_opts *opts);
/* Makes room for n more tokens (the token list and the KV pages up to n_past + n), so
 * that an eval or a batch of that many cannot fail for memory. TERN_ERR_RANGE when
 * n_past + n exceeds n_ctx. The state is unchanged either way. */
enum tern_status tern_session_reserve(struct tern_session *s, size_t n);

/* One session's part of a batched step: n > 0 tokens consumed at its position; logits:
 * whether the logits after its last token are wanted (tern_session_logits; without
 * them it has none until its next eval). logits_all and rec_trail as in
 * tern_eval_opts (speculative verification: every position's logits, the recurrent
 * state after each token); either may be NULL. */
struct tern_batch_item {
    struct tern_session *s;
    const int32_t *toks;
    uint32_t n;
    bool logits;
    float *logits_all;
    void *rec_trail;
};

/* Continuous batching (DESIGN.md §8): one forward over the tokens of several sessions
 * of one model (distinct sessions, at most 256), the weights read once for all of them.
 * Each session's logits and state are bit-identical to consuming its tokens alone with
 * tern_session_eval, whatever else is in the batch. No chunking, checkpoints or
 * callbacks: the caller sizes the step. Errors (every session unchanged): as
 * tern_session_eval's, naming the item; TERN_ERR_INVALID for an empty item, another
 * model's session, or one session twice. */
enum tern_status tern_eval_batch(const struct tern_batch_item *items, size_t n_items);

/* Logits [n_vocab] after the last consumed token; NULL when none (n_past == 0, or
 * after a rewind/restore until the next eval). */
const float *tern_session_logits(const struct tern_session *s);

/* Rewinds to position p <= n_past. Attention-only models: always possible. Hybrid
 * models: p == n_past, or a position the last eval reached with a rec_trail (p after
 * its first token, the trail buffer unchanged); otherwise TERN_ERR_STATE saying a
 * checkpoint is needed (the session is unchanged). */
enum tern_status tern_session_rewind(struct tern_session *s, uint32_t p);

/* Forgets the rec_trail of the last eval (before its buffer is freed or reused; the
 * next eval, restore or fork forgets it too). The state is unchanged. */
void tern_session_drop_trail(struct tern_session *s);

/* Takes a checkpoint at the current position n_past: a copy of every non-positional
 * part of the state (conv windows, recurrent matrices) plus the position and a hash of
 * T[0..n). For attention-only models it holds only the position. */
enum tern_status tern_session_checkpoint(struct tern_session *s, struct tern_checkpoint **out);
/* Restores a checkpoint taken from this session's lineage: requires pos <= n_past and
 * the session's tokens T[0..pos) to hash as the checkpoint's (else TERN_ERR_STATE, the
 * session unchanged). Copies the recurrent parts back and sets every attention layer's
 * length to pos. */
enum tern_status tern_session_restore(struct tern_session *s, const struct tern_checkpoint *c);
uint32_t tern_checkpoint_pos(const struct tern_checkpoint *c);
size_t tern_checkpoint_bytes(const struct tern_checkpoint *c);
void tern_checkpoint_free(struct tern_checkpoint *c);
/* Retakes c (from a session of the same model) at s's current position, reusing its
 * memory: for loops that checkpoint at every step (speculative verification). Another
 * model's checkpoint: TERN_ERR_INVALID, c unchanged. */
enum tern_status tern_session_checkpoint_update(struct tern_session *s, struct tern_checkpoint *c);

/* A new session holding src's state at position p: KV rows [0, p) copied, recurrent
 * parts from src (p == n_past) or from ckpt (ckpt pos == p, taken from src's lineage).
 * Hybrid with p < n_past and no matching checkpoint: TERN_ERR_STATE. */
enum tern_status tern_session_fork(const struct tern_session *src, uint32_t p,
                                   const struct tern_checkpoint *ckpt, struct tern_session **out);

/* ---- export / import (the disk tier, DESIGN.md §9) ------------------------------ */

/* Binds stored state to a model: xxh3 over the GGUF metadata (keys, types, values), the
 * tensor table (names, types, shapes, offsets) and a sample of every tensor's bytes. */
uint64_t tern_model_identity(const struct tern_model *m);
/* Binds stored state to tern's state layout for a KV type: the state format version,
 * every layer's kind and geometry, the recurrent buffers. Equal = importable. */
uint64_t tern_state_layout(const struct tern_model *m, enum tern_kv_type kv);
/* Bytes of one position's KV rows over every attention layer (K and V). */
size_t tern_state_kv_row_bytes(const struct tern_model *m, enum tern_kv_type kv);
/* Copies KV rows [p0, p1) (p1 <= n_past) to buf, in this order: attention layers
 * ascending, K then V, KV heads ascending, rows p0..p1 contiguous. buf holds
 * (p1 - p0) * tern_state_kv_row_bytes() bytes. Fails only on a device session (the
 * download: TERN_ERR_IO); buf is then undefined. */
enum tern_status tern_session_kv_export(const struct tern_session *s, uint32_t p0, uint32_t p1, void *buf);
/* The reverse: fills rows [p0, p1) (p1 <= n_past) of an imported session from buf, an
 * export of buf_rows >= p1 - p0 rows starting at p0 (its first p1 - p0 rows per run).
 * Fails only on a device session (the upload). */
enum tern_status tern_session_kv_import(struct tern_session *s, uint32_t p0, uint32_t p1, const void *buf,
                                        uint32_t buf_rows);
/* The recurrent state at n_past / a checkpoint's (recurrent_bytes; NULL when none; a
 * device session's is downloaded first, and NULL with the error set when that fails). */
const void *tern_session_rec_data(const struct tern_session *s);
const void *tern_checkpoint_data(const struct tern_checkpoint *c);
/* A new session that has consumed toks[0..n) (ids checked against the vocabulary, n
 * against n_ctx), its recurrent state copied from rec (recurrent_bytes; NULL = zero)
 * and its KV rows [0, n) allocated for tern_session_kv_import to fill. No logits until
 * the next eval. On error *out is NULL. */
enum tern_status tern_session_import(struct tern_model *m, const struct tern_session_params *p, const int32_t *toks,
                                     uint32_t n, const void *rec, struct tern_session **out);
/* A checkpoint of s's lineage at pos <= n_past from stored recurrent bytes (n must be
 * the model's recurrent_bytes). */
enum tern_status tern_checkpoint_import(const struct tern_session *s, uint32_t pos, const void *data, size_t n,
                                        struct tern_checkpoint **out);

/* ---- state hashes (DESIGN.md §5, TERN_STATE_HASH=1) ------------------------------- */

struct tern_hash_component {
    char name[48];  /* "blk.3.k", "blk.3.v", "blk.0.conv", "blk.0.ssm", "tokens" */
    uint64_t hash;  /* xxh3-64 of the component's bytes ([0, n) rows for KV) */
};

/* Fills up to cap components and returns how many there are in total. A device
 * session's bytes are downloaded and hashed as the CPU's are laid out; a download that
 * fails is logged and its component hashes as 0. */
size_t tern_session_hash_components(const struct tern_session *s, struct tern_hash_component *out,
                                    size_t cap);
/* One hash over every component, in order. */
uint64_t tern_session_hash(const struct tern_session *s);

/* ---- sampling --------------------------------------------------------------------- */

struct tern_sampler;

struct tern_sampler_params {
    float temperature;       /* <= 0: greedy (argmax, ties -> lowest id) */
    int32_t top_k;           /* <= 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float repeat_penalty;    /* 1: off */
    int32_t repeat_last_n;   /* window for the penalties; 0 = the whole history */
    float presence_penalty;  /* 0: off */
    float frequency_penalty; /* 0: off */
    uint64_t seed;
};

void tern_sampler_params_default(struct tern_sampler_params *p);
/* The parameters tern_sampler_new accepts (TERN_ERR_INVALID naming the value otherwise):
 * one rule for the sampler and for whoever validates requests before building one. */
enum tern_status tern_sampler_params_check(const struct tern_sampler_params *p);
enum tern_status tern_sampler_new(const struct tern_sampler_params *p, uint32_t n_vocab,
                                  struct tern_sampler **out);
void tern_sampler_free(struct tern_sampler *s);
/* Biases added to the logits of the given tokens before penalties, filters and any
 * mask (a masked token stays masked), in every sample function below: OpenAI's
 * logit_bias. ids < n_vocab, biases finite, n <= TERN_SAMPLER_MAX_BIAS, else
 * TERN_ERR_INVALID and the sampler is unchanged. The arrays are copied; n = 0 clears. */
#define TERN_SAMPLER_MAX_BIAS 1024
enum tern_status tern_sampler_set_bias(struct tern_sampler *s, const int32_t *ids, const float *bias, size_t n);
/* Picks the next token from logits [n_vocab]; history is the generated (and, for the
 * repetition penalty, prompt) tokens the penalties look at. */
int32_t tern_sampler_sample(struct tern_sampler *s, const float *logits, const int32_t *history,
                            size_t n_history);
/* The same over the tokens whose bit is set in allow (bit i of allow[i / 32]; NULL =
 * all): the others are removed before penalties, filters and temperature, as if their
 * logits were -inf. Returns -1 when allow has no token of the vocabulary. */
int32_t tern_sampler_sample_masked(struct tern_sampler *s, const float *logits, const uint32_t *allow,
                                   const int32_t *history, size_t n_history);
/* Speculative decoding with a deterministic draft (a point mass on token draft): returns
 * the token to emit and sets *accepted when it is the draft. Greedy: the argmax (accepted
 * when it equals the draft), exactly what tern_sampler_sample picks. Sampling: the draft
 * is accepted with probability p(draft), else a token is drawn from p with the draft
 * taken out and renormalised (the speculative-sampling rule), so the token's
 * distribution is exactly p. A draft outside the candidate set costs the same single
 * draw as tern_sampler_sample. */
int32_t tern_sampler_sample_draft(struct tern_sampler *s, const float *logits, const int32_t *history,
                                  size_t n_history, int32_t draft, bool *accepted);
/* The same over the tokens whose bit is set in allow (as tern_sampler_sample_masked): a
 * draft allow leaves out is never accepted. -1 when allow has no token. */
int32_t tern_sampler_sample_draft_masked(struct tern_sampler *s, const float *logits, const uint32_t *allow,
                                         const int32_t *history, size_t n_history, int32_t draft, bool *accepted);

#ifdef __cplusplus
}
#endif

#endif
