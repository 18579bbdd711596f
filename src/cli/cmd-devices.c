/* tern devices: what tern can compute on — the CPU, and every device the Vulkan loader
 * sees (backend/vulkan/vulkan.h), with the one `--device auto` would pick. */
#include "cli/cli.h"
#include "cli/opts.h"

#include "backend/vulkan/vulkan.h"
#include "kernels/kernels.h"
#include "util/threadpool.h"

#include <stdio.h>
#include <string.h>

static const struct cli_spec devices_cli = {
    "devices",
    "usage: tern devices [--json]\n"
    "\n"
    "Lists the CPU and the Vulkan devices: index (for --device vulkan:N), name, type,\n"
    "device-local memory, subgroup size, cooperative-matrix and FP16 support, and\n"
    "which one --device auto picks (a discrete GPU, else an integrated one, else the\n"
    "CPU). Without a Vulkan loader or device it says what is missing.\n"
    "\n",
    NULL,
};

#define MAX_LISTED 16

static int devices_main(int argc, char **argv) {
    bool json = false;
    const struct cli_opt opts[] = {
        CLI_FLAG("json", &json, "one JSON object"),
        CLI_END,
    };
    int c = cli_parse(&devices_cli, opts, argc, argv, NULL);
    if (c >= 0) return c;
    struct tern_vk_device_info d[MAX_LISTED];
    uint32_t n = 0;
    const enum tern_status st = tern_vk_enumerate(d, MAX_LISTED, &n);
    const char *why = st ? tern_last_error() : NULL;
    if (n > MAX_LISTED) n = MAX_LISTED;
    const int pick = st ? -1 : tern_vk_pick_auto(d, n);
    const char *isa = tern_isa_name(tern_kernels_isa());
    if (json) {
        printf("{\"cpu\":{\"cores\":%d,\"kernels\":\"%s\",\"avx512_tiles\":%s},\"vulkan_built\":%s,\"vulkan\":[",
               tern_n_cores(), isa, tern_kernels_isa() == TERN_ISA_AVX2 && tern_kernels_avx512() ? "true" : "false",
               tern_vk_built() ? "true" : "false");
        for (uint32_t i = 0; i < n; i++) {
            printf("%s{\"index\":%u,\"name\":\"", i ? "," : "", i);
            for (const char *p = d[i].name; *p; p++)
                if (*p == '"' || *p == '\\') printf("\\%c", *p);
                else if ((unsigned char)*p >= 0x20) putchar(*p);
            printf("\",\"type\":\"%s\",\"device_local_bytes\":%llu,\"subgroup_size\":%u,\"shared_bytes\":%u,\"coopmat\":%s,\"fp16\":%s,"
                   "\"vulkan\":\"%u.%u\"}",
                   d[i].type, (unsigned long long)d[i].device_local_bytes, d[i].subgroup_size, d[i].shared_bytes,
                   d[i].coopmat ? "true" : "false", d[i].fp16 ? "true" : "false", d[i].api_version >> 22,
                   (d[i].api_version >> 12) & 0x3ff);
        }
        printf("],\"auto\":\"%s", pick >= 0 ? "vulkan:" : "cpu");
        if (pick >= 0) printf("%d", pick);
        printf("\"");
        if (why) {
            printf(",\"vulkan_error\":\"");
            for (const char *p = why; *p; p++)
                if (*p == '"' || *p == '\\') printf("\\%c", *p);
                else if ((unsigned char)*p >= 0x20) putchar(*p);
            printf("\"");
        }
        printf("}\n");
        return 0;
    }
    printf("cpu          %d cores, %s kernels%s%s\n", tern_n_cores(), isa,
           tern_kernels_isa() == TERN_ISA_AVX2 && tern_kernels_avx512() ? " with AVX-512 tiles" : "",
           pick < 0 ? "   <- auto" : "");
    for (uint32_t i = 0; i < n; i++)
        printf("vulkan:%-5u %s (%s, Vulkan %u.%u), %.1f GiB device-local, subgroup %u, %u KiB shared%s%s%s\n", i, d[i].name,
               d[i].type,
               d[i].api_version >> 22, (d[i].api_version >> 12) & 0x3ff, (double)d[i].device_local_bytes / (1 << 30),
               d[i].subgroup_size, d[i].shared_bytes / 1024, d[i].coopmat ? ", cooperative matrix" : "", d[i].fp16 ? ", fp16" : "",
               (int)i == pick ? "   <- auto" : "");
    if (why) printf("%s\n", why);
    else if (pick < 0 && n) printf("auto picks the CPU: no discrete or integrated GPU (a CPU Vulkan device is used only when named)\n");
    return 0;
}

TERN_COMMAND("devices", "list the CPU and the Vulkan devices tern can compute on", devices_main)
