/* --device cpu|vulkan[:N]|auto (or $TERN_DEVICE) for tern run, serve and chat: one
 * resolver, so every command picks and explains a device the same way (docs/gpu.md). */
#include "cli/cli.h"

#include "backend/vulkan/vulkan.h"
#include "model/ctx-default.h"
#include "model/model.h" /* TERN_KV_PAGE */

#include <stdio.h>
#include <string.h>

int cli_device_resolve(const char *cmd, const char *d, int *out, bool *is_auto) {
    *out = -1;
    *is_auto = false;
    if (!d || !*d || !strcmp(d, "cpu")) return 0;
    long idx = -1;
    const bool any = !strcmp(d, "vulkan"), autod = !strcmp(d, "auto");
    if (!any && !autod && (strncmp(d, "vulkan:", 7) || !cli_parse_int(d + 7, 0, 15, &idx)))
        return cli_usage_error(cmd, "bad --device '%s' (cpu, vulkan, vulkan:N, auto)", d);
    struct tern_vk_device_info devs[16];
    uint32_t n = 0;
    if (tern_vk_enumerate(devs, 16, &n)) {
        if (autod) {
            fprintf(stderr, "device: auto: the CPU (no Vulkan: %s)\n", tern_last_error());
            return 0;
        }
        return cli_fail(cmd, "--device %s: %s", d, tern_last_error());
    }
    if (n > 16) n = 16;
    if (idx >= 0) {
        if ((uint32_t)idx >= n)
            return cli_fail(cmd, "--device %s: no such device (the loader sees %u; tern devices lists them)", d, n);
        *out = (int)idx;
        return 0;
    }
    const int pick = tern_vk_pick_auto(devs, n);
    if (autod) {
        *is_auto = true;
        if (pick < 0) {
            fprintf(stderr, "device: auto: the CPU (no discrete or integrated GPU; %u Vulkan device%s of other types, "
                            "e.g. '%s' (%s), are used only when named: --device vulkan:0)\n",
                    n, n == 1 ? "" : "s", devs[0].name, devs[0].type);
            return 0;
        }
        fprintf(stderr, "device: auto: vulkan:%d '%s' (%s GPU)\n", pick, devs[pick].name, devs[pick].type);
    }
    *out = pick >= 0 ? pick : 0;
    return 0;
}

int cli_cpu_moe_parse(const char *cmd, bool all, const char *n, uint32_t *out) {
    *out = 0;
    if (all && n && *n) return cli_usage_error(cmd, "--cpu-moe and --n-cpu-moe: give one");
    if (all) *out = TERN_CPU_MOE_ALL;
    else if (n && !strcmp(n, "auto")) *out = TERN_CPU_MOE_AUTO;
    else if (n && *n) {
        long v;
        if (!cli_parse_int(n, 0, 1 << 20, &v)) return cli_usage_error(cmd, "bad --n-cpu-moe '%s' (N or auto)", n);
        *out = (uint32_t)v;
    }
    return 0;
}

int cli_gpu_layers_parse(const char *cmd, const char *s, uint32_t cpu_moe, uint32_t *out) {
    *out = TERN_GPU_LAYERS_ALL;
    if (!s || !strcmp(s, "all")) return 0;
    if (!strcmp(s, "auto")) {
        if (cpu_moe == TERN_CPU_MOE_AUTO) return cli_usage_error(cmd, "--gpu-layers auto and --n-cpu-moe auto: give one");
        *out = TERN_GPU_LAYERS_AUTO;
        return 0;
    }
    long v;
    if (!cli_parse_int(s, 0, 1 << 20, &v)) return cli_usage_error(cmd, "bad --gpu-layers '%s' (N, all or auto)", s);
    *out = (uint32_t)v;
    return 0;
}

/* Device bytes of one session of sp's whole context (its KV pages and recurrent state):
 * what --n-cpu-moe auto leaves free. */
static uint64_t session_reserve(const struct tern_model *m, const struct tern_session_params *sp) {
    if (!sp) return 0;
    const struct tern_model_info *in = tern_model_info(m);
    uint64_t n_ctx = sp->n_ctx ? sp->n_ctx : tern_n_ctx_default(in->n_ctx_train);
    n_ctx = (n_ctx + TERN_KV_PAGE - 1) / TERN_KV_PAGE * TERN_KV_PAGE; /* whole pages */
    return n_ctx * tern_state_kv_row_bytes(m, sp->kv_type) + in->recurrent_bytes;
}

int cli_device_use(const char *cmd, struct tern_model *m, int *dev, bool is_auto, uint32_t n_chunk,
                   const struct tern_session_params *sp, uint32_t cpu_moe, uint32_t gpu_layers) {
    if (*dev < 0) {
        if (cpu_moe || gpu_layers != TERN_GPU_LAYERS_ALL)
            fprintf(stderr, "tern %s: --gpu-layers / --cpu-moe / --n-cpu-moe ignored: the sessions run on the CPU\n",
                    cmd);
        return 0;
    }
    char name[32];
    snprintf(name, sizeof name, "vulkan:%d", *dev);
    tern_model_set_cpu_moe(m, cpu_moe, session_reserve(m, sp));
    tern_model_set_gpu_layers(m, gpu_layers, session_reserve(m, sp));
    enum tern_status st = tern_model_use_device(m, name, n_chunk);
    if (!st && sp) {
        /* one session's device state of the whole context, made and freed now: a context
         * too large for the device's memory is said at start (with the sizes), not at the
         * first long request (sessions then take KV pages as they grow) */
        struct tern_session *s = NULL;
        st = tern_session_new(m, sp, &s);
        if (!st) st = tern_session_reserve(s, tern_session_n_ctx(s));
        tern_session_free(s);
        if (st) (void)tern_model_use_device(m, "cpu", 0);
    }
    if (!st) {
        const uint32_t n_layer = tern_model_info(m)->n_layer;
        uint32_t n_cpu, n_moe;
        tern_model_cpu_moe(m, &n_cpu, &n_moe);
        if (tern_model_cpu_layers(m))
            fprintf(stderr, "device: %s; the weight matrices of %u of %u layers in host memory, on the CPU\n",
                    tern_model_device(m), tern_model_cpu_layers(m), n_layer);
        else if (cpu_moe && n_moe)
            fprintf(stderr, "device: %s; the routed experts of %u of %u MoE layers in host memory, on the CPU\n",
                    tern_model_device(m), n_cpu, n_moe);
        else
            fprintf(stderr, "device: %s\n", tern_model_device(m));
        return 0;
    }
    if (!is_auto) return cli_fail(cmd, "--device vulkan:%d: %s", *dev, tern_last_error());
    fprintf(stderr, "device: auto: the CPU (%s)\n", tern_last_error());
    *dev = -1;
    return 0;
}
