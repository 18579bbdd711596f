/* The Vulkan compute backend's device layer: finding devices, buffers on them, and the
 * compute kernels (shaders compiled to SPIR-V at build time and embedded in the binary).
 *
 * The Vulkan loader is opened at run time (dlopen "libvulkan.so.1"), so one binary runs
 * on machines with and without Vulkan; a machine without the loader or without a device
 * gets an error that names what is missing and the Debian packages that bring it. A
 * build without the Vulkan headers or glslc compiles vulkan-off.c instead, whose calls
 * all fail with TERN_ERR_UNSUPPORTED saying so.
 *
 * Exactness (DESIGN.md §5, §7): every kernel computes each output element in one
 * invocation, reducing over k in one fixed order, whatever the number of rows or tokens
 * dispatched; so within this backend a token's results do not depend on its batch.
 * Across backends the parity rules apply, not bit equality.
 *
 * Threads: a context is used by one thread at a time (the engine's eval lock). */
#ifndef TERN_BACKEND_VULKAN_H
#define TERN_BACKEND_VULKAN_H

#include "util/dtype.h"
#include "util/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether this build has the Vulkan backend compiled in. */
bool tern_vk_built(void);

struct tern_vk_device_info {
    char name[256];
    const char *type;          /* "discrete", "integrated", "virtual", "cpu", "other" */
    uint32_t vendor_id, device_id;
    uint32_t api_version;      /* VK_MAKE_API_VERSION packed */
    uint64_t device_local_bytes; /* sum of the device-local heaps */
    uint32_t subgroup_size;
    uint32_t shared_bytes;     /* maxComputeSharedMemorySize */
    bool coopmat;              /* VK_KHR_cooperative_matrix (or the NV one) is offered */
    bool fp16;                 /* shaderFloat16 */
};

/* Lists the devices the Vulkan loader sees (at most cap, *n of them; *n may exceed cap).
 * Errors: no loader, no instance, no device — the message says which and how to install
 * what is missing. */
enum tern_status tern_vk_enumerate(struct tern_vk_device_info *out, uint32_t cap, uint32_t *n);

/* `auto` device selection: the first discrete GPU, else the first integrated one; -1
 * when there is none (a CPU implementation such as lavapipe is never picked by auto). */
int tern_vk_pick_auto(const struct tern_vk_device_info *devs, uint32_t n);

struct tern_vk;     /* an open device: queue, pipelines, command pool */
struct tern_vk_buf; /* a buffer in device memory */

/* Opens device index (as enumerated). On error *out is NULL. */
enum tern_status tern_vk_open(int index, struct tern_vk **out);
void tern_vk_close(struct tern_vk *vk);
const struct tern_vk_device_info *tern_vk_info(const struct tern_vk *vk);
/* Invocations per weight row in the matmul: 32 on a GPU (a coalesced read, a fixed tree),
 * 1 on a CPU device such as lavapipe (docs/gpu.md, "Exactness on the GPU"). */
uint32_t tern_vk_matmul_lanes(const struct tern_vk *vk);
/* Whether tern_vk_attention splits a dispatch of few workgroups over its pages (a GPU: on;
 * a CPU device: off). The same bits either way; tests turn it on and off. */
void tern_vk_set_attention_split(struct tern_vk *vk, bool on);

/* A buffer of bytes bytes (device-local, host-visible where the device offers both,
 * else uploads and downloads go through a staging copy). */
enum tern_status tern_vk_buf_new(struct tern_vk *vk, size_t bytes, struct tern_vk_buf **out);
void tern_vk_buf_free(struct tern_vk_buf *b);
size_t tern_vk_buf_bytes(const struct tern_vk_buf *b);
/* Command buffers submitted so far (a recording is one, however many dispatches it holds;
 * an upload or download through staging is one). */
uint64_t tern_vk_submits(const struct tern_vk *vk);
enum tern_status tern_vk_upload(struct tern_vk_buf *b, size_t off, const void *src, size_t bytes);
enum tern_status tern_vk_download(struct tern_vk_buf *b, size_t off, void *dst, size_t bytes);

/* Copies bytes from src at src_off to dst at dst_off on the device (vkCmdCopyBuffer): no
 * host round trip, whatever memory the buffers are in. Inside a recording it is recorded,
 * with barriers so that it sees the operations before it and those after it see its
 * writes; outside one it runs and waits. src and dst may be one buffer only for ranges
 * that do not overlap. Errors: a range past a buffer's end (TERN_ERR_RANGE, nothing
 * recorded), a lost device (TERN_ERR_IO, "device lost"). 0 bytes: nothing. */
enum tern_status tern_vk_copy(struct tern_vk *vk, const struct tern_vk_buf *src, size_t src_off, struct tern_vk_buf *dst,
                              size_t dst_off, size_t bytes);
/* n_rows copies of row_bytes, row i from src_off + i * src_stride to dst_off + i *
 * dst_stride, as one copy command (one pair of barriers), otherwise as tern_vk_copy; in
 * one buffer the two spans (first row's start to last row's end) must not overlap. */
enum tern_status tern_vk_copy_rows(struct tern_vk *vk, const struct tern_vk_buf *src, size_t src_off,
                                   size_t src_stride, struct tern_vk_buf *dst, size_t dst_off, size_t dst_stride,
                                   size_t row_bytes, size_t n_rows);

/* Whether tern_vk_matmul handles weights of this type (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4). */
bool tern_vk_matmul_supported(enum tern_dtype wtype);
/* Makes the matmul pipeline of a weight type now (indexed: tern_vk_matmul_id's) rather than
 * at its first dispatch, so that a model's load, not its first request, pays for it and
 * reports a failure. */
enum tern_status tern_vk_matmul_prepare(struct tern_vk *vk, enum tern_dtype wtype, bool indexed);

/* y[t * n + r] = dot(w row r, x row t) for r < n, t < n_tok: w holds n rows of k
 * elements of wtype (row r at r * row_bytes), x n_tok rows of k floats, y n_tok rows of
 * n floats. Each element is one invocation's sequential reduction over k (blocks in
 * order, elements in order within a block), so it does not depend on n_tok. Runs and
 * waits. Errors: an unsupported type or a k the type's blocks do not divide
 * (TERN_ERR_INVALID), buffers too small, a lost device (TERN_ERR_IO, "device lost"). */
enum tern_status tern_vk_matmul(struct tern_vk *vk, enum tern_dtype wtype, const struct tern_vk_buf *w,
                                size_t k, size_t n, const struct tern_vk_buf *x, size_t n_tok,
                                struct tern_vk_buf *y);

/* The experts' matmul (MoE): w holds n_expert matrices of n rows of k elements of wtype,
 * expert_stride bytes apart (stacked as GGUF's ffn_*_exps); for each of n_slots slots s,
 * y[s * n + r] = dot(row r of expert ids[s], x row s / x_div) (ids: n_slots uint32; x_div
 * = n_used when a token's slots share its input row, 1 when each slot has its own). order
 * is tern_vk_moe_group's (tern_vk_moe_order_words): the slots grouped by expert and cut
 * into tiles of up to tern_vk_moe_tile(n_slots) slots of one expert, each tile a workgroup
 * that reads the expert's rows once for all its slots (neighbouring workgroups read the
 * same expert). The tile decides which workgroup computes a slot and beside which
 * others, never its bits: the same fixed-order reduction as tern_vk_matmul, so a slot's
 * row does not depend on the other slots. An id past n_expert gives NaN rows, never a
 * read outside w; a malformed tile computes nothing. Errors as tern_vk_matmul's; more
 * than 1024 experts or 4 GiB of them, an order too small (TERN_ERR_RANGE). */
enum tern_status tern_vk_matmul_id(struct tern_vk *vk, enum tern_dtype wtype, const struct tern_vk_buf *w,
                                   size_t expert_stride, size_t n_expert, size_t k, size_t n,
                                   const struct tern_vk_buf *ids, const struct tern_vk_buf *order,
                                   const struct tern_vk_buf *x, size_t x_div, size_t n_slots, struct tern_vk_buf *y);
/* order[0..n_slots) = the slots 0..n_slots ordered by their expert ids[s], the slots of one
 * expert in slot order (a stable counting sort on the device, as the CPU groups them); ids
 * past n_expert last. Then the experts' matmul's tiles: order[n_slots] = how many, then a
 * (first index into the grouping, count) pair per tile, each expert's run cut into tiles of
 * up to tern_vk_moe_tile(n_slots). order holds tern_vk_moe_order_words(n_slots, n_expert)
 * uint32. At most 1024 experts. */
#define TERN_VK_MOE_ONE_SLOT 16
/* Tokens (or one expert's slots) per workgroup of the matmul: matmul.comp's TT. */
#define TERN_VK_MATMUL_TILE 8
/* Slots per tile: TERN_VK_MATMUL_TILE, or 1 for at most TERN_VK_MOE_ONE_SLOT slots — one
 * token's experts (distinct, so its tiles have a slot each anyway), or two tokens', where
 * an expert they share is read twice by the matmul's one-slot pipeline instead of once by
 * the 8-slot one. */
static inline size_t tern_vk_moe_tile(size_t n_slots) {
    return n_slots <= TERN_VK_MOE_ONE_SLOT ? 1 : TERN_VK_MATMUL_TILE;
}
static inline size_t tern_vk_moe_max_tiles(size_t n_slots, size_t n_expert) {
    /* a run per expert (and one of bad ids), each cut into tiles of up to tern_vk_moe_tile */
    const size_t t = tern_vk_moe_tile(n_slots), runs = n_expert + 1 < n_slots ? n_expert + 1 : n_slots;
    const size_t tiles = (n_slots + t - 1) / t + runs;
    return tiles < n_slots ? tiles : n_slots;
}
/* Room for a tile per slot, whatever the tile size: a buffer made for n slots holds the
 * order of any dispatch of fewer (the tile-bound count is not monotone in n_slots). */
static inline size_t tern_vk_moe_order_words(size_t n_slots, size_t n_expert) {
    (void)n_expert;
    return 3 * n_slots + 1;
}
enum tern_status tern_vk_moe_group(struct tern_vk *vk, const struct tern_vk_buf *ids, struct tern_vk_buf *order,
                                   size_t n_slots, size_t n_expert);

/* MoE routing (model/moe.h's moe_route, per token): logits (n_tok, n_expert) become the
 * softmax probabilities in place; ids and wts (n_tok, n_used) get the n_used largest in
 * descending order (ties to the lowest id) and their weights (renormalised to sum 1 when
 * norm_topk, then times scale). softmax_weight (gpt-oss): the n_used largest logits as
 * they are, their weights the softmax over those n_used alone (logits left unchanged).
 * At most 1024 experts. */
enum tern_status tern_vk_moe_route(struct tern_vk *vk, struct tern_vk_buf *logits, struct tern_vk_buf *ids,
                                   struct tern_vk_buf *wts, size_t n_tok, size_t n_expert, size_t n_used,
                                   bool norm_topk, float scale, bool softmax_weight);
/* y[s] += bias[ids[s]] for n_slots rows of n: each slot's own expert's bias row (bias:
 * (n_expert, n); gpt-oss's expert biases). An id past n_expert gives a NaN row. */
enum tern_status tern_vk_moe_expert_bias(struct tern_vk *vk, struct tern_vk_buf *y, const struct tern_vk_buf *ids,
                                         const struct tern_vk_buf *bias, size_t n_slots, size_t n, size_t n_expert);
/* y[t] = sum_j wts[t][j] d[t * n_used + j] (rank order), plus sigmoid(sw[t]) sd[t] when sd
 * and sw (the shared expert's output (n_tok, n) and gate logit (n_tok)) are given. */
enum tern_status tern_vk_moe_combine(struct tern_vk *vk, struct tern_vk_buf *y, const struct tern_vk_buf *d,
                                     const struct tern_vk_buf *wts, size_t n_tok, size_t n, size_t n_used,
                                     const struct tern_vk_buf *sd, const struct tern_vk_buf *sw);

/* Recording: operations between tern_vk_begin and tern_vk_end go into one command buffer
 * (a barrier after each, so each sees the writes of those before it) and run at
 * tern_vk_end, which waits. An operation called outside a recording runs at once. A
 * failed operation ends the recording. */
enum tern_status tern_vk_begin(struct tern_vk *vk);
enum tern_status tern_vk_end(struct tern_vk *vk);

/* The element-wise layer operations (model.h names the CPU ones), on n_tok rows of n
 * floats. Each is one invocation per element or, for rmsnorm, one workgroup per row with
 * a reduction order fixed by n: a row's bits never depend on the number of rows. add and
 * rope use only correctly rounded multiplies and adds, so they give the CPU's bits. */
enum tern_status tern_vk_rmsnorm(struct tern_vk *vk, const struct tern_vk_buf *x, const struct tern_vk_buf *w,
                                 struct tern_vk_buf *y, size_t n_tok, size_t n, float eps); /* w NULL: none */
enum tern_status tern_vk_add(struct tern_vk *vk, struct tern_vk_buf *y, const struct tern_vk_buf *x, size_t n_tok,
                             size_t n); /* y += x */
enum tern_status tern_vk_swiglu(struct tern_vk *vk, struct tern_vk_buf *g, const struct tern_vk_buf *u, size_t n_tok,
                                size_t n); /* g = silu(g) * u */
enum tern_status tern_vk_add_bias(struct tern_vk *vk, struct tern_vk_buf *y, const struct tern_vk_buf *bias,
                                  size_t n_tok, size_t n); /* y[t] += bias, every row */
enum tern_status tern_vk_sigmoid_mul(struct tern_vk *vk, struct tern_vk_buf *x, const struct tern_vk_buf *gate,
                                     size_t n_tok, size_t n); /* x *= sigmoid(gate) */
/* gpt-oss's clamped SwiGLU (model/moe.h): x = min(g, 7), y = clamp(u, -7, 7),
 * g = x sigmoid(1.702 x) (y + 1) */
enum tern_status tern_vk_swiglu_oai(struct tern_vk *vk, struct tern_vk_buf *g, const struct tern_vk_buf *u,
                                    size_t n_tok, size_t n);
/* RoPE in place on n_tok rows (row_stride floats apart) of n_head heads of head_dim;
 * cs: (n_tok, n_rot) cos/sin pairs as tern_rope_angles computes them. */
enum tern_status tern_vk_rope(struct tern_vk *vk, struct tern_vk_buf *x, size_t row_stride, size_t n_head,
                              size_t head_dim, size_t n_rot, const struct tern_vk_buf *cs, size_t n_tok, bool neox);

/* The KV cache of one attention layer on the device: pages of TERN_VK_KV_PAGE positions
 * end to end, each [n_kv_head][TERN_VK_KV_PAGE][head_dim] of F32 or F16 (the CPU's
 * pages, byte for byte), so a cache of n pages holds positions [0, n * TERN_VK_KV_PAGE).
 * kv_store writes n_tok rows (n_kv_head heads, row_stride floats apart) at positions
 * pos0.. (rounded to F16 for an F16 cache); attention then computes, for each token t and
 * query head h, softmax(scale * q . k) v over the cache rows [0, pos0 + t] read back from
 * the cache, page by page with an online softmax (as the CPU), so a token's result
 * depends on its own positions alone. Heads of at most 256. The tokens are rows row0.. of
 * x, q and out (one sequence of a step over several sessions' rows: each against its own
 * cache). window (0: none): a query at pos sees the keys [pos + 1 - window, pos] only, as
 * the CPU's window layers (from the page where the window starts; the cache keeps every
 * position). sinks (NULL: none): (n_head) learned logits, one per query head, that join
 * the softmax's max and denominator and take no value (gpt-oss). A cache without the
 * pages of the positions: TERN_ERR_RANGE. */
#define TERN_VK_KV_PAGE 256
enum tern_status tern_vk_kv_store(struct tern_vk *vk, const struct tern_vk_buf *x, size_t row_stride,
                                  struct tern_vk_buf *cache, size_t n_kv_head, size_t head_dim, size_t pos0,
                                  size_t row0, size_t n_tok, bool f16);
enum tern_status tern_vk_attention(struct tern_vk *vk, const struct tern_vk_buf *q, size_t q_stride,
                                   const struct tern_vk_buf *kc, const struct tern_vk_buf *vc, struct tern_vk_buf *out,
                                   size_t out_stride, size_t row0, size_t n_tok, size_t pos0, size_t n_head,
                                   size_t n_kv_head, size_t head_dim, float scale, bool f16, size_t window,
                                   const struct tern_vk_buf *sinks);
/* The same with the workgroup's tile of queries named: qh query heads of one KV head
 * (clamped to the group) times qt tokens, qh qt <= 8. The tile changes which workgroup
 * computes a query and which cache reads it shares, never the query's bits (tests compare
 * them; tern_vk_attention picks the group times as many tokens as fit). split: 1 gives each
 * of the dispatch's pages of 256 positions its own workgroups and folds their partials in a
 * second dispatch (TERN_ERR_RANGE where they do not fit the device's room for them), 0 folds
 * in the one dispatch, -1 (tern_vk_attention) splits a dispatch over several pages with few
 * workgroups (a decode step); the same bits either way. */
enum tern_status tern_vk_attention_tile(struct tern_vk *vk, const struct tern_vk_buf *q, size_t q_stride,
                                        const struct tern_vk_buf *kc, const struct tern_vk_buf *vc,
                                        struct tern_vk_buf *out, size_t out_stride, size_t row0, size_t n_tok,
                                        size_t pos0, size_t n_head, size_t n_kv_head, size_t head_dim, float scale,
                                        bool f16, size_t window, const struct tern_vk_buf *sinks, size_t qh,
                                        size_t qt, int split);

/* Gated DeltaNet (kernels/deltanet.h) on the device, tokens in order. conv: the causal
 * depthwise convolution + SiLU over C channels with n_conv taps (conv_wt tap-major
 * [n_conv][C]), updating window [n_conv - 1][C]. heads: the recurrence per v-head over
 * state [n_v][d_k][d_v], reading rows of qkv (C), z (n_v d_v), beta and alpha (n_v),
 * writing rows of out (n_v d_v); params = ssm_a[n_v] | dt_bias[n_v] | ssm_norm[d_v].
 * Heads of at most 256. Both take the tokens from row row0 of their row buffers (one
 * sequence of a step over several, against its own window and state). With a trail
 * (speculative verification; NULL: none) the window after token t also goes to slot
 * slot0 + t of trail, [slot][n_conv - 1][C], and the state after it to slot slot0 + t of
 * trail, [slot][n_v][d_k][d_v]: the same arithmetic, so the same bits, plus the writes.
 * TERN_ERR_RANGE when a buffer is too small for its rows, or the trail for
 * slot0 + n_tok slots. */
enum tern_status tern_vk_deltanet_conv(struct tern_vk *vk, struct tern_vk_buf *window, const struct tern_vk_buf *conv_wt,
                                       const struct tern_vk_buf *x, size_t ldx, struct tern_vk_buf *y, size_t ldy,
                                       size_t C, size_t n_conv, size_t row0, size_t n_tok, struct tern_vk_buf *trail,
                                       size_t slot0);
enum tern_status tern_vk_deltanet_heads(struct tern_vk *vk, struct tern_vk_buf *state, const struct tern_vk_buf *qkv,
                                        const struct tern_vk_buf *z, const struct tern_vk_buf *beta,
                                        const struct tern_vk_buf *alpha, struct tern_vk_buf *out,
                                        const struct tern_vk_buf *params, size_t n_k, bool k_grouped, size_t n_v, size_t d_k,
                                        size_t d_v, float eps, size_t row0, size_t n_tok, struct tern_vk_buf *trail,
                                        size_t slot0);

/* Rows of n_head heads laid out [a | b] per head (2 * head_dim each) split into a and b. */
enum tern_status tern_vk_split_heads(struct tern_vk *vk, const struct tern_vk_buf *ab, struct tern_vk_buf *a,
                                     struct tern_vk_buf *b, size_t n_tok, size_t n_head, size_t head_dim);

#endif
