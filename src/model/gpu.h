/* Models on the GPU (the Vulkan backend, backend/vulkan.h): weights uploaded once, the KV
 * cache and recurrent state on the device, a chunk's forward pass recorded into one command
 * buffer. The llama, qwen2, qwen3, qwen3moe, qwen35 and qwen35moe architectures
 * (gpu-model.c), used by `tern bench` and `tern run --device`; the session features
 * (checkpoints, reuse, the server) still run on the CPU path only — docs/gpu.md says what
 * is left.
 *
 * Exactness within the backend (DESIGN.md §7): every operation computes a token's
 * results from that token's rows alone, in one fixed order, so the logits do not depend
 * on the chunking (tested token by token against chunks of 7 and of the whole prompt). */
#ifndef TERN_MODEL_GPU_H
#define TERN_MODEL_GPU_H

#include "model/model.h"

struct tern_vk;
struct tern_gpu_model;

/* Uploads m's weights to vk and sizes a KV cache of n_ctx positions (F16 or F32) and
 * activations for chunks of n_chunk tokens. Errors: an architecture or weight type the
 * backend lacks (TERN_ERR_UNSUPPORTED, naming it), device memory (TERN_ERR_NOMEM). The
 * model must outlive the result. */
enum tern_status tern_gpu_model_new(struct tern_vk *vk, const struct tern_model *m, uint32_t n_ctx, uint32_t n_chunk,
                                    bool f16_kv, struct tern_gpu_model **out);
void tern_gpu_model_free(struct tern_gpu_model *g);
/* Consumes toks[0..n) at the next positions, in chunks of n_chunk (0: the largest), and
 * writes the last token's logits (or every token's, [n][n_vocab], when logits_all) unless
 * logits is NULL. On error the position is unchanged and the cache rows it wrote are
 * undefined. */
enum tern_status tern_gpu_model_eval(struct tern_gpu_model *g, const int32_t *toks, uint32_t n, uint32_t n_chunk,
                                     float *logits, bool logits_all);
uint32_t tern_gpu_model_n_past(const struct tern_gpu_model *g);
uint32_t tern_gpu_model_n_ctx(const struct tern_gpu_model *g);
/* Back to position 0: the recurrent state zeroed (the cache rows are overwritten as
 * tokens come). On error (a device failure) the model must not be evaluated again. */
enum tern_status tern_gpu_model_reset(struct tern_gpu_model *g);

#endif
