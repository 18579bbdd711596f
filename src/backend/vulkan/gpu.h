/* Models on the GPU (the Vulkan backend, backend/vulkan/vulkan.h): the llama, qwen2, qwen3,
 * qwen3moe, qwen35 and qwen35moe architectures (backend/vulkan/forward.c). The forward pass is the
 * architecture's own (arch-*.c), run through the layer seam (backend.h) with
 * backend/vulkan/forward.c's device implementation of its operations.
 *
 * Two objects. A `tern_gpu` holds what one model needs once on a device: its weights,
 * uploaded in their own types, and the architecture's RunState for one chunk (the
 * scratch every evaluation writes). A `tern_gpu_state` holds what one conversation owns: per attention
 * layer the KV cache in pages of TERN_VK_KV_PAGE (256) positions, each [n_kv_head][256]
 * [head_dim] (F16 or F32, the CPU's pages byte for byte), taken as the conversation
 * grows (tern_gpu_state_reserve), per Gated DeltaNet layer
 * its conv window [n_conv - 1][C] and state [n_v][d_k][d_v] (F32, the CPU's "conv" and
 * "ssm" layouts, so a checkpoint's bytes read the same on both backends). Sessions of a
 * model loaded for a device (tern_model_use_device, session.c) each own a state; they
 * share the tern_gpu, whose scratch makes evaluations run one at a time: every call
 * below that touches the device takes the tern_gpu's lock (the Vulkan context is used
 * by one thread at a time, vulkan.h), for one eval's steps (a step: one command buffer
 * over the rows of one or several states, tern_gpu_eval_batch) or one copy.
 *
 * Exactness within the backend (DESIGN.md §7): every operation computes a token's
 * results from that token's rows alone, in one fixed order, so the logits and the state
 * do not depend on the chunking (tested token by token against chunks of 7 and of the
 * whole prompt, and through sessions: tests/unit/test-gpu-session.c). */
#ifndef TERN_MODEL_GPU_H
#define TERN_MODEL_GPU_H

#include "backend/backend.h"
#include "model/model.h"

struct tern_vk;
struct tern_gpu;
struct tern_gpu_state;
struct tern_gpu_io;
struct tern_vk_buf;

/* Uploads m's weights to vk and sizes activations for chunks of n_chunk tokens. Errors:
 * an architecture or weight type the backend lacks (TERN_ERR_UNSUPPORTED, naming it),
 * device memory (TERN_ERR_NOMEM; the sizes are checked against the device's memory
 * before anything is allocated, and the message has both). vk and m must outlive it. */
enum tern_status tern_gpu_new(struct tern_vk *vk, const struct tern_model *m, uint32_t n_chunk, struct tern_gpu **out);
void tern_gpu_free(struct tern_gpu *g);
/* The MTP head of main's model on main's device (view: the head's model view, arch
 * qwen35-mtp, model/mtp.c; copied), made at the first call and kept with main, freed by
 * tern_gpu_free(main): its own weights uploaded once, the rest (a shared output matrix)
 * found in main's; it takes main's lock. */
enum tern_status tern_gpu_head(struct tern_gpu *main, const struct tern_model *view, uint32_t n_chunk,
                               struct tern_gpu **out);
uint32_t tern_gpu_n_chunk(const struct tern_gpu *g);
/* Partial offload (tern_model_set_cpu_moe, read from g's model when it is made): of the
 * n_moe MoE layers, the n_host whose routed experts stay in host memory and run on the
 * CPU (auto resolved). */
void tern_gpu_cpu_moe(const struct tern_gpu *g, uint32_t *n_host, uint32_t *n_moe);
/* --gpu-layers: the layers whose matrices are on the device, [0, n) (UINT32_MAX: all). */
uint32_t tern_gpu_layers(const struct tern_gpu *g);
/* Device bytes of the weights and the scratch. */
size_t tern_gpu_bytes(const struct tern_gpu *g);
/* Device bytes of one state holding all of n_ctx positions. */
size_t tern_gpu_state_need(const struct tern_gpu *g, uint32_t n_ctx, bool f16_kv);

/* A state of a context of n_ctx positions at position 0 (recurrent parts zeroed), with no
 * KV pages yet. TERN_ERR_NOMEM when the device's memory (less what this tern_gpu's
 * weights, states and checkpoints hold) is too small for the recurrent parts, the sizes in
 * the message, before anything is allocated. */
enum tern_status tern_gpu_state_new(struct tern_gpu *g, uint32_t n_ctx, bool f16_kv, struct tern_gpu_state **out);
/* The KV pages of positions [0, n_pos) in every attention layer (n_pos <= n_ctx, else
 * TERN_ERR_RANGE). A layer's pages lie end to end in one device buffer: growing makes a
 * larger one and copies the pages it had on the device (a quarter more than it had, so a
 * growing conversation copies O(log n) times, or exactly what is asked when that is all
 * that fits). TERN_ERR_NOMEM, with the sizes, when the device has no room (checked before
 * each allocation): the state keeps what it had, and its positions stay as they were.
 * Evaluations reserve their positions themselves; a caller reserves first to see the
 * error before anything is computed. */
enum tern_status tern_gpu_state_reserve(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t n_pos);
/* Gives back the pages beyond those of positions [0, n_pos) when st holds more than a
 * growth from there would take (a quarter more) and a page: a rewind or restore far back, or an eval
 * cancelled before the positions it reserved. The pages kept are re-laid into a smaller
 * buffer by a copy on the device; where the device has no room for that copy a layer keeps
 * what it had (logged). Rows [0, n_pos) are unchanged either way. */
void tern_gpu_state_shrink(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t n_pos);
void tern_gpu_state_free(struct tern_gpu_state *st);
/* Device bytes st holds now: its KV pages, recurrent parts and trail. */
size_t tern_gpu_state_bytes(const struct tern_gpu_state *st);

/* Consumes toks[0..n) (ids already checked) at positions [pos0, pos0 + n), pos0 + n <=
 * n_ctx, in chunks of n_chunk (0 or more than the tern_gpu's: the largest), and writes
 * the last token's logits (or every token's, [n][n_vocab], when logits_all) unless
 * logits is NULL. On error (a lost device: TERN_ERR_IO) the state is undefined. */
enum tern_status tern_gpu_eval(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t pos0, const int32_t *toks,
                               uint32_t n, uint32_t n_chunk, float *logits, bool logits_all);

/* One sequence of a batch: toks[0..n) (ids already checked) of state st at positions
 * [pos0, pos0 + n), pos0 + n <= st's n_ctx; logits NULL: none, else the last token's
 * [n_vocab] or, when all, every token's [n][n_vocab]. */
struct tern_gpu_seq {
    struct tern_gpu_state *st;
    uint32_t pos0;
    const int32_t *toks;
    uint32_t n;
    float *logits;
    bool all;
    const struct tern_gpu_io *io; /* the trail and hidden states (below), or NULL */
};
/* Continuous batching on the device (DESIGN.md §8): the rows of n_seq sequences (distinct
 * states of g, at most MODEL_MAX_SEQS), laid end to end, in steps of at most n_chunk rows
 * (0 or more than the tern_gpu's: the largest); a sequence cut at a step's end goes on in
 * the next, as at a chunk boundary. A step is one command buffer: the matmuls and the
 * other row operations run once over all its rows (the weights are read once for every
 * sequence), attention and the DeltaNet sequence by sequence against each one's own KV
 * cache, conv window and state, the RoPE angles from each row's own position, and only
 * the wanted rows are projected to logits. Each sequence's logits and state are
 * bit-identical to tern_gpu_eval of it alone, whatever the other rows (every operation
 * computes a row from that row alone, in one fixed order); a sequence's io as
 * tern_gpu_eval_io's (below). Errors: more than MODEL_MAX_SEQS sequences or one state
 * twice (TERN_ERR_INVALID, nothing computed); a lost device (TERN_ERR_IO): every
 * sequence's state is then undefined. */
enum tern_status tern_gpu_eval_batch(struct tern_gpu *g, const struct tern_gpu_seq *seqs, uint32_t n_seq,
                                     uint32_t n_chunk);
/* The recurrent-state trail (speculative verification of a hybrid model, tern_eval_opts.
 * rec_trail), kept on the device: trail_reserve makes room in st for n states (a device
 * buffer [n][rec_bytes] laid out as the recurrent block; what it held is lost when it
 * grows; TERN_ERR_NOMEM, with the sizes, when the device has no room). tern_gpu_eval_io
 * with io->trail (below) also copies the recurrent state after token i into slot
 * slot0 + i (slot0 + n within the room): each DeltaNet layer then runs token by token,
 * the same dispatches as chunks of one, so the bits are the eval's. trail_load sets st's
 * recurrent state from a slot. tern_gpu_eval_io is tern_gpu_eval with what io asks
 * besides the logits: the trail, the MTP head's hidden states in and out. */
enum tern_status tern_gpu_trail_reserve(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t n);
struct tern_gpu_io {
    bool trail;     /* the recurrent state after token i into trail slot slot0 + i */
    uint32_t slot0;
    /* An MTP head's input: the main model's hidden state of position p at
     * hidden_in + (p - hidden_pos0) * n_embd. The output-normed hidden state of every
     * position p >= hidden_pos0 goes to hidden_out likewise (a model with an MTP head, or
     * the head itself). NULL: none. */
    const float *hidden_in;
    float *hidden_out;
    uint32_t hidden_pos0;
};
enum tern_status tern_gpu_eval_io(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t pos0, const int32_t *toks,
                                  uint32_t n, uint32_t n_chunk, float *logits, bool logits_all,
                                  const struct tern_gpu_io *io);
enum tern_status tern_gpu_trail_load(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t slot);
/* Frees st's trail (a parked session keeps none: a hybrid's is slots of its whole
 * recurrent state). */
void tern_gpu_trail_release(struct tern_gpu *g, struct tern_gpu_state *st);

/* The recurrent parts to / from rec, laid out as the model's recurrent block
 * (m->rec_bytes: each recurrent layer's buffers at its rec_offset). rec NULL on upload:
 * zero. */
enum tern_status tern_gpu_rec_download(struct tern_gpu *g, struct tern_gpu_state *st, void *rec);
enum tern_status tern_gpu_rec_upload(struct tern_gpu *g, struct tern_gpu_state *st, const void *rec);
/* Rows [p0, p1) of attention layer il's K (v false) or V cache (within its reserved
 * pages), KV head by KV head, each head's rows contiguous: buf holds n_kv_head runs, run
 * h at h * run_bytes, of (p1 - p0) rows of head_dim elements (2 bytes for an F16 cache,
 * else 4). The pages that hold them pass through host memory once (an upload keeps their
 * other rows). */
enum tern_status tern_gpu_kv_download(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t il, bool v, uint32_t p0,
                                      uint32_t p1, void *buf, size_t run_bytes);
enum tern_status tern_gpu_kv_upload(struct tern_gpu *g, struct tern_gpu_state *st, uint32_t il, bool v, uint32_t p0,
                                    uint32_t p1, const void *buf, size_t run_bytes);

/* ---- copies on the device: fork and checkpoints (no host round trip) ---- */

/* KV rows [0, p) of every attention layer (the pages that hold them, whole; dst's are
 * reserved first), and the recurrent parts too when rec, from src to dst (states of g with
 * the same n_ctx and cache type): buffer copies on the device, one submit. On error (no
 * room for dst's pages: TERN_ERR_NOMEM; a lost device: TERN_ERR_IO) dst is undefined, src
 * unchanged. */
enum tern_status tern_gpu_state_copy(struct tern_gpu *g, const struct tern_gpu_state *src, struct tern_gpu_state *dst,
                                     uint32_t p, bool rec);
/* A device buffer for one checkpoint: the model's recurrent block (m->rec_bytes, laid out
 * as tern_gpu_rec_download's), counted with the states against the device's memory.
 * TERN_ERR_NOMEM when the device has no room for it (checked before allocating, and a
 * failed allocation says the same); nothing is then allocated. */
enum tern_status tern_gpu_rec_new(struct tern_gpu *g, struct tern_vk_buf **out);
void tern_gpu_rec_free(struct tern_gpu *g, struct tern_vk_buf *b); /* NULL: no-op */
/* Device bytes of the checkpoint buffers now held. */
size_t tern_gpu_ckpt_bytes(struct tern_gpu *g);
/* st's recurrent parts into b (save) / from b into st (load), copies on the device; on
 * error the destination is undefined. read: b's bytes into rec (m->rec_bytes). */
enum tern_status tern_gpu_rec_save(struct tern_gpu *g, const struct tern_gpu_state *st, struct tern_vk_buf *b);
enum tern_status tern_gpu_rec_load(struct tern_gpu *g, struct tern_gpu_state *st, const struct tern_vk_buf *b);
enum tern_status tern_gpu_rec_read(struct tern_gpu *g, const struct tern_vk_buf *b, void *rec);

/* ---- the backend's pieces (backend.h's struct tern_backend, device.c) ---- */

extern const struct model_ops gpu_ops;           /* forward.c */
extern const struct backend_state vulkan_state;  /* state.c */
/* The device g's weights are on. */
struct tern_vk *tern_gpu_vk(const struct tern_gpu *g);
/* Moves every checkpoint of m kept on the device to host memory (state.c), before the
 * device goes; those that cannot be read back lose their bytes (restoring them then
 * fails). */
void vulkan_ckpt_release_all(struct tern_model *m);

#endif
