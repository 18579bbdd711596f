/* The Vulkan backend (backend.h's struct tern_backend): a model's context on a device is
 * its tern_gpu (gpu.h: the weights uploaded once, the scratch of one chunk), opened on
 * device `index` as `tern devices` lists them; its sessions each own a tern_gpu_state
 * (state.c); its forward pass is forward.c's. */
#include "backend/vulkan/gpu.h"
#include "backend/vulkan/vulkan.h"
#include "util/log.h"

#include <stdio.h>

static enum tern_status vk_open(struct tern_model *m, int index, uint32_t n_chunk) {
    struct tern_vk *vk;
    enum tern_status st = tern_vk_open(index, &vk);
    if (st) return tern_error_prefix(st, "vulkan:%d", index);
    struct tern_gpu *g;
    if ((st = tern_gpu_new(vk, m, n_chunk, &g))) {
        tern_vk_close(vk);
        return st;
    }
    m->backend_ctx = g;
    snprintf(m->device, sizeof m->device, "vulkan:%d '%s'", index, tern_vk_info(vk)->name);
    tern_gpu_cpu_moe(g, &m->cpu_moe_n, &m->cpu_moe_total);
    const uint32_t gl = tern_gpu_layers(g);
    m->gpu_layers_n = gl < m->n_layer ? gl : m->n_layer;
    TERN_LOG_INFO("model: %s on %s: %.1f MiB of weights and scratch on the device, chunks of up to %u tokens", m->name,
                  m->device, (double)tern_gpu_bytes(g) / (1024.0 * 1024.0), n_chunk);
    if (m->cpu_moe_req && m->cpu_moe_total)
        TERN_LOG_INFO("model: the routed experts of %u of %u MoE layers (the first) in host memory, run on the CPU%s",
                      m->cpu_moe_n, m->cpu_moe_total, m->cpu_moe_req == TERN_CPU_MOE_AUTO ? " (auto)" : "");
    if (m->gpu_layers_n < m->n_layer)
        TERN_LOG_INFO("model: the weight matrices of layers %u.. (%u of %u) in host memory, run on the CPU%s",
                      m->gpu_layers_n, m->n_layer - m->gpu_layers_n, m->n_layer,
                      m->gpu_layers == TERN_GPU_LAYERS_AUTO ? " (auto)" : "");
    return TERN_OK;
}

static void vk_close(struct tern_model *m) {
    struct tern_gpu *g = m->backend_ctx;
    if (!g) return;
    vulkan_ckpt_release_all(m);
    struct tern_vk *vk = tern_gpu_vk(g);
    tern_gpu_free(g);
    tern_vk_close(vk);
    m->backend_ctx = NULL;
}

/* The head's weights uploaded beside the main model's, once for the model (the head's
 * tern_gpu is kept with main's and freed by it). */
static enum tern_status vk_head(const struct tern_model *main, struct tern_model *head, uint32_t n_chunk) {
    struct tern_gpu *g;
    enum tern_status st = tern_gpu_head(main->backend_ctx, head, n_chunk, &g);
    if (st) return st;
    head->backend = &tern_backend_vulkan;
    head->backend_ctx = g;
    return TERN_OK;
}

const struct tern_backend tern_backend_vulkan = {
    .name = "vulkan",
    .ops = &gpu_ops,
    .state = &vulkan_state,
    .open = vk_open,
    .close = vk_close,
    .head = vk_head,
};
