/* Which backend a model's sessions run on (tern.h's tern_model_use_device): the list of
 * backends, and moving a model from one to another before any session exists. */
#include "backend/backend.h"

#include "util/mem.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const struct tern_backend *const backends[] = {&tern_backend_cpu, &tern_backend_vulkan};

/* "NAME" or "NAME:INDEX" (index 0 when absent) into its backend; NULL when unknown. */
static const struct tern_backend *parse(const char *device, int *index) {
    const char *colon = strchr(device, ':');
    const size_t n = colon ? (size_t)(colon - device) : strlen(device);
    *index = 0;
    if (colon) {
        char *end;
        errno = 0;
        const long v = strtol(colon + 1, &end, 10);
        if (errno || end == colon + 1 || *end || v < 0 || v > 1024) return NULL;
        *index = (int)v;
    }
    for (size_t i = 0; i < TERN_ARRAY_LEN(backends); i++)
        if (strlen(backends[i]->name) == n && !memcmp(backends[i]->name, device, n)) return backends[i];
    return NULL;
}

void model_device_free(struct tern_model *m) {
    if (m->backend && m->backend->close) m->backend->close(m);
    m->backend = &tern_backend_cpu;
    m->backend_ctx = NULL;
    m->device[0] = '\0';
    m->cpu_moe_n = 0;
}

enum tern_status tern_model_use_device(struct tern_model *m, const char *device, uint32_t n_chunk) {
    if (atomic_load(&m->n_sessions))
        return tern_errorf(TERN_ERR_STATE, "model: the device must be chosen before any session exists (%u do)",
                           (unsigned)atomic_load(&m->n_sessions));
    int index;
    const struct tern_backend *be = device ? parse(device, &index) : NULL;
    if (!be)
        return tern_errorf(TERN_ERR_INVALID, "model: unknown device '%s' (cpu, vulkan or vulkan:N)",
                           device ? device : "(null)");
    if (be == &tern_backend_cpu) {
        model_device_free(m); /* back to the CPU */
        return TERN_OK;
    }
    if (model_on_device(m)) return tern_errorf(TERN_ERR_STATE, "model: already on %s", m->device);
    if (!n_chunk) n_chunk = TERN_DEFAULT_CHUNK;
    enum tern_status st = be->open(m, index, n_chunk);
    if (st) return st;
    /* the CPU's context (its workspace) is not needed while the model is on the device */
    tern_backend_cpu.close(m);
    m->backend = be;
    return TERN_OK;
}

const char *tern_model_device(const struct tern_model *m) { return model_on_device(m) ? m->device : "cpu"; }

void tern_model_set_cpu_moe(struct tern_model *m, uint32_t n_layers, uint64_t reserve_bytes) {
    m->cpu_moe_req = n_layers;
    m->cpu_moe_reserve = reserve_bytes;
}

void tern_model_set_gpu_layers(struct tern_model *m, uint32_t n_layers, uint64_t reserve_bytes) {
    m->gpu_layers_set = n_layers != TERN_GPU_LAYERS_ALL;
    m->gpu_layers = n_layers;
    m->gpu_layers_reserve = reserve_bytes;
}

uint32_t tern_model_cpu_layers(const struct tern_model *m) {
    if (!model_on_device(m) || !m->gpu_layers_set || m->gpu_layers_n >= m->n_layer) return 0;
    return m->n_layer - m->gpu_layers_n;
}

void tern_model_cpu_moe(const struct tern_model *m, uint32_t *n_cpu, uint32_t *n_moe) {
    *n_cpu = model_on_device(m) ? m->cpu_moe_n : 0;
    *n_moe = m->cpu_moe_total;
}
