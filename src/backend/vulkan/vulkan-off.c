/* The Vulkan backend when this build has none (no Vulkan headers or no glslc at
 * configure time): every call says so. */
#include "backend/vulkan/vulkan.h"

#define NOT_BUILT                                                                                                     \
    tern_errorf(TERN_ERR_UNSUPPORTED, "vulkan: this tern was built without the Vulkan backend (install libvulkan-dev " \
                                      "and glslc, then rebuild)")

bool tern_vk_built(void) { return false; }
enum tern_status tern_vk_enumerate(struct tern_vk_device_info *out, uint32_t cap, uint32_t *n) {
    (void)out, (void)cap;
    *n = 0;
    return NOT_BUILT;
}
int tern_vk_pick_auto(const struct tern_vk_device_info *devs, uint32_t n) {
    (void)devs, (void)n;
    return -1;
}
enum tern_status tern_vk_open(int index, struct tern_vk **out) {
    (void)index;
    *out = NULL;
    return NOT_BUILT;
}
void tern_vk_close(struct tern_vk *vk) { (void)vk; }
const struct tern_vk_device_info *tern_vk_info(const struct tern_vk *vk) {
    (void)vk;
    return NULL;
}
uint32_t tern_vk_matmul_lanes(const struct tern_vk *vk) {
    (void)vk;
    return 0;
}
void tern_vk_set_attention_split(struct tern_vk *vk, bool on) { (void)vk, (void)on; }

enum tern_status tern_vk_buf_new(struct tern_vk *vk, size_t bytes, struct tern_vk_buf **out) {
    (void)vk, (void)bytes;
    *out = NULL;
    return NOT_BUILT;
}
void tern_vk_buf_free(struct tern_vk_buf *b) { (void)b; }
size_t tern_vk_buf_bytes(const struct tern_vk_buf *b) {
    (void)b;
    return 0;
}
uint64_t tern_vk_submits(const struct tern_vk *vk) {
    (void)vk;
    return 0;
}
enum tern_status tern_vk_upload(struct tern_vk_buf *b, size_t off, const void *src, size_t bytes) {
    (void)b, (void)off, (void)src, (void)bytes;
    return NOT_BUILT;
}
enum tern_status tern_vk_download(struct tern_vk_buf *b, size_t off, void *dst, size_t bytes) {
    (void)b, (void)off, (void)dst, (void)bytes;
    return NOT_BUILT;
}
enum tern_status tern_vk_copy(struct tern_vk *vk, const struct tern_vk_buf *src, size_t src_off, struct tern_vk_buf *dst,
                              size_t dst_off, size_t bytes) {
    (void)vk, (void)src, (void)src_off, (void)dst, (void)dst_off, (void)bytes;
    return NOT_BUILT;
}
enum tern_status tern_vk_copy_rows(struct tern_vk *vk, const struct tern_vk_buf *src, size_t src_off,
                                   size_t src_stride, struct tern_vk_buf *dst, size_t dst_off, size_t dst_stride,
                                   size_t row_bytes, size_t n_rows) {
    (void)vk, (void)src, (void)src_off, (void)src_stride, (void)dst, (void)dst_off, (void)dst_stride, (void)row_bytes,
        (void)n_rows;
    return NOT_BUILT;
}
bool tern_vk_matmul_supported(enum tern_dtype wtype) {
    (void)wtype;
    return false;
}
enum tern_status tern_vk_matmul_prepare(struct tern_vk *vk, enum tern_dtype wtype, bool indexed) {
    (void)vk, (void)wtype, (void)indexed;
    return NOT_BUILT;
}
enum tern_status tern_vk_matmul(struct tern_vk *vk, enum tern_dtype wtype, const struct tern_vk_buf *w, size_t k,
                                size_t n, const struct tern_vk_buf *x, size_t n_tok, struct tern_vk_buf *y) {
    (void)vk, (void)wtype, (void)w, (void)k, (void)n, (void)x, (void)n_tok, (void)y;
    return NOT_BUILT;
}
enum tern_status tern_vk_begin(struct tern_vk *vk) {
    (void)vk;
    return NOT_BUILT;
}
enum tern_status tern_vk_end(struct tern_vk *vk) {
    (void)vk;
    return NOT_BUILT;
}
enum tern_status tern_vk_rmsnorm(struct tern_vk *vk, const struct tern_vk_buf *x, const struct tern_vk_buf *w,
                                 struct tern_vk_buf *y, size_t n_tok, size_t n, float eps) {
    (void)vk, (void)x, (void)w, (void)y, (void)n_tok, (void)n, (void)eps;
    return NOT_BUILT;
}
enum tern_status tern_vk_add(struct tern_vk *vk, struct tern_vk_buf *y, const struct tern_vk_buf *x, size_t n_tok,
                             size_t n) {
    (void)vk, (void)y, (void)x, (void)n_tok, (void)n;
    return NOT_BUILT;
}
enum tern_status tern_vk_swiglu(struct tern_vk *vk, struct tern_vk_buf *g, const struct tern_vk_buf *u, size_t n_tok,
                                size_t n) {
    (void)vk, (void)g, (void)u, (void)n_tok, (void)n;
    return NOT_BUILT;
}
enum tern_status tern_vk_swiglu_oai(struct tern_vk *vk, struct tern_vk_buf *g, const struct tern_vk_buf *u,
                                    size_t n_tok, size_t n) {
    (void)vk, (void)g, (void)u, (void)n_tok, (void)n;
    return NOT_BUILT;
}
enum tern_status tern_vk_sigmoid_mul(struct tern_vk *vk, struct tern_vk_buf *x, const struct tern_vk_buf *gate,
                                     size_t n_tok, size_t n) {
    (void)vk, (void)x, (void)gate, (void)n_tok, (void)n;
    return NOT_BUILT;
}
enum tern_status tern_vk_rope(struct tern_vk *vk, struct tern_vk_buf *x, size_t row_stride, size_t n_head,
                              size_t head_dim, size_t n_rot, const struct tern_vk_buf *cs, size_t n_tok, bool neox) {
    (void)vk, (void)x, (void)row_stride, (void)n_head, (void)head_dim, (void)n_rot, (void)cs, (void)n_tok, (void)neox;
    return NOT_BUILT;
}
enum tern_status tern_vk_kv_store(struct tern_vk *vk, const struct tern_vk_buf *x, size_t row_stride,
                                  struct tern_vk_buf *cache, size_t n_kv_head, size_t head_dim, size_t pos0,
                                  size_t row0, size_t n_tok, bool f16) {
    (void)vk, (void)x, (void)row_stride, (void)cache, (void)n_kv_head, (void)head_dim, (void)pos0, (void)row0,
        (void)n_tok, (void)f16;
    return NOT_BUILT;
}
enum tern_status tern_vk_attention(struct tern_vk *vk, const struct tern_vk_buf *q, size_t q_stride,
                                   const struct tern_vk_buf *kc, const struct tern_vk_buf *vc, struct tern_vk_buf *out,
                                   size_t out_stride, size_t row0, size_t n_tok, size_t pos0, size_t n_head,
                                   size_t n_kv_head, size_t head_dim, float scale, bool f16, size_t window,
                                   const struct tern_vk_buf *sinks) {
    (void)vk, (void)q, (void)q_stride, (void)kc, (void)vc, (void)out, (void)out_stride, (void)row0, (void)n_tok,
        (void)pos0, (void)n_head, (void)n_kv_head, (void)head_dim, (void)scale, (void)f16, (void)window, (void)sinks;
    return NOT_BUILT;
}
enum tern_status tern_vk_attention_tile(struct tern_vk *vk, const struct tern_vk_buf *q, size_t q_stride,
                                        const struct tern_vk_buf *kc, const struct tern_vk_buf *vc,
                                        struct tern_vk_buf *out, size_t out_stride, size_t row0, size_t n_tok,
                                        size_t pos0, size_t n_head, size_t n_kv_head, size_t head_dim, float scale,
                                        bool f16, size_t window, const struct tern_vk_buf *sinks, size_t qh,
                                        size_t qt, int split) {
    (void)qh, (void)qt, (void)split;
    return tern_vk_attention(vk, q, q_stride, kc, vc, out, out_stride, row0, n_tok, pos0, n_head, n_kv_head,
                             head_dim, scale, f16, window, sinks);
}
enum tern_status tern_vk_deltanet_conv(struct tern_vk *vk, struct tern_vk_buf *window,
                                             const struct tern_vk_buf *conv_wt, const struct tern_vk_buf *x, size_t ldx,
                                             struct tern_vk_buf *y, size_t ldy, size_t C, size_t n_conv, size_t row0,
                                             size_t n_tok, struct tern_vk_buf *trail, size_t slot0) {
    (void)vk, (void)window, (void)conv_wt, (void)x, (void)ldx, (void)y, (void)ldy, (void)C, (void)n_conv, (void)row0,
        (void)n_tok, (void)trail, (void)slot0;
    return NOT_BUILT;
}
enum tern_status tern_vk_deltanet_heads(struct tern_vk *vk, struct tern_vk_buf *state, const struct tern_vk_buf *qkv,
                                              const struct tern_vk_buf *z, const struct tern_vk_buf *beta,
                                              const struct tern_vk_buf *alpha, struct tern_vk_buf *out,
                                              const struct tern_vk_buf *params, size_t n_k, bool k_grouped, size_t n_v, size_t d_k,
                                              size_t d_v, float eps, size_t row0, size_t n_tok, struct tern_vk_buf *trail,
                                              size_t slot0) {
    (void)vk, (void)state, (void)qkv, (void)z, (void)beta, (void)alpha, (void)out, (void)params, (void)n_k, (void)k_grouped, (void)n_v,
        (void)d_k, (void)d_v, (void)eps, (void)row0, (void)n_tok, (void)trail, (void)slot0;
    return NOT_BUILT;
}
enum tern_status tern_vk_split_heads(struct tern_vk *vk, const struct tern_vk_buf *ab, struct tern_vk_buf *a,
                                     struct tern_vk_buf *b, size_t n_tok, size_t n_head, size_t head_dim) {
    (void)vk, (void)ab, (void)a, (void)b, (void)n_tok, (void)n_head, (void)head_dim;
    return NOT_BUILT;
}
enum tern_status tern_vk_add_bias(struct tern_vk *vk, struct tern_vk_buf *y, const struct tern_vk_buf *bias,
                                  size_t n_tok, size_t n) {
    (void)vk, (void)y, (void)bias, (void)n_tok, (void)n;
    return NOT_BUILT;
}
enum tern_status tern_vk_matmul_id(struct tern_vk *vk, enum tern_dtype wtype, const struct tern_vk_buf *w,
                                   size_t expert_stride, size_t n_expert, size_t k, size_t n,
                                   const struct tern_vk_buf *ids, const struct tern_vk_buf *order,
                                   const struct tern_vk_buf *x, size_t x_div, size_t n_slots, struct tern_vk_buf *y) {
    (void)vk, (void)wtype, (void)w, (void)expert_stride, (void)n_expert, (void)k, (void)n, (void)ids, (void)x;
    (void)order, (void)x_div, (void)n_slots, (void)y;
    return NOT_BUILT;
}
enum tern_status tern_vk_moe_group(struct tern_vk *vk, const struct tern_vk_buf *ids, struct tern_vk_buf *order,
                                   size_t n_slots, size_t n_expert) {
    (void)vk, (void)ids, (void)order, (void)n_slots, (void)n_expert;
    return NOT_BUILT;
}
enum tern_status tern_vk_moe_route(struct tern_vk *vk, struct tern_vk_buf *logits, struct tern_vk_buf *ids,
                                   struct tern_vk_buf *wts, size_t n_tok, size_t n_expert, size_t n_used,
                                   bool norm_topk, float scale, bool softmax_weight) {
    (void)vk, (void)logits, (void)ids, (void)wts, (void)n_tok, (void)n_expert, (void)n_used, (void)norm_topk;
    (void)scale, (void)softmax_weight;
    return NOT_BUILT;
}
enum tern_status tern_vk_moe_expert_bias(struct tern_vk *vk, struct tern_vk_buf *y, const struct tern_vk_buf *ids,
                                         const struct tern_vk_buf *bias, size_t n_slots, size_t n, size_t n_expert) {
    (void)vk, (void)y, (void)ids, (void)bias, (void)n_slots, (void)n, (void)n_expert;
    return NOT_BUILT;
}
enum tern_status tern_vk_moe_combine(struct tern_vk *vk, struct tern_vk_buf *y, const struct tern_vk_buf *d,
                                     const struct tern_vk_buf *wts, size_t n_tok, size_t n, size_t n_used,
                                     const struct tern_vk_buf *sd, const struct tern_vk_buf *sw) {
    (void)vk, (void)y, (void)d, (void)wts, (void)n_tok, (void)n, (void)n_used, (void)sd, (void)sw;
    return NOT_BUILT;
}
