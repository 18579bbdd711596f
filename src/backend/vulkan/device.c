/* Which device a model's sessions run on (tern.h, tern_model_use_vulkan): the CPU, or a
 * Vulkan device holding the weights once (backend/vulkan/gpu.h's tern_gpu) and a state per
 * session (session.c). */
#include "model/model.h"

#include "backend/vulkan/vulkan.h"
#include "backend/vulkan/gpu.h"
#include "util/log.h"

#include <stdio.h>

enum tern_status tern_model_use_vulkan(struct tern_model *m, int index, uint32_t n_chunk) {
    if (atomic_load(&m->n_sessions))
        return tern_errorf(TERN_ERR_STATE, "model: the device must be chosen before any session exists (%u do)",
                           (unsigned)atomic_load(&m->n_sessions));
    if (index < 0) {
        model_device_free(m); /* back to the CPU */
        return TERN_OK;
    }
    if (m->gpu) return tern_errorf(TERN_ERR_STATE, "model: already on %s", m->device);
    if (!n_chunk) n_chunk = TERN_DEFAULT_CHUNK;
    struct tern_vk *vk;
    enum tern_status st = tern_vk_open(index, &vk);
    if (st) return tern_error_prefix(st, "vulkan:%d", index);
    struct tern_gpu *g;
    if ((st = tern_gpu_new(vk, m, n_chunk, &g))) {
        tern_vk_close(vk);
        return st;
    }
    m->vk = vk;
    m->gpu = g;
    snprintf(m->device, sizeof m->device, "vulkan:%d '%s'", index, tern_vk_info(vk)->name);
    TERN_LOG_INFO("model: %s on %s: %.1f MiB of weights and scratch on the device, chunks of up to %u tokens", m->name,
                  m->device, (double)tern_gpu_bytes(g) / (1024.0 * 1024.0), n_chunk);
    return TERN_OK;
}

const char *tern_model_device(const struct tern_model *m) { return m->gpu ? m->device : "cpu"; }

void model_device_free(struct tern_model *m) {
    model_ckpt_vram_release(m);
    tern_gpu_free(m->gpu);
    tern_vk_close(m->vk);
    m->gpu = NULL;
    m->vk = NULL;
}
