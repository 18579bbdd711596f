/* The `tern` command line: one file per command (cmd-NAME.c), each registering itself
 * with TERN_COMMAND so that commands can be added without touching a shared table.
 *
 * Conventions: GNU-style long options, each command's in one table (opts.h: the parser
 * and --help come from it); `tern CMD --help` prints usage
 * to stdout and exits 0; a usage error prints one line "tern CMD: reason" (plus a hint
 * to use --help) to stderr and exits 2; other failures exit 1 with the error message. */
#ifndef TERN_CLI_H
#define TERN_CLI_H

#include "tern.h"

#include <stdbool.h>
#include <stdio.h>

typedef int (*cli_main_fn)(int argc, char **argv);

struct cli_command {
    const char *name;
    const char *summary; /* one line for `tern --help` */
    cli_main_fn main;
};

void cli_register(const struct cli_command *cmd);

#define TERN_COMMAND(cname, summary_, fn)                                                   \
    static const struct cli_command cli_cmd_##fn = {cname, summary_, fn};                  \
    __attribute__((constructor)) static void cli_register_##fn(void) { cli_register(&cli_cmd_##fn); }

/* The sampler's options as tern run and tern chat spell them: entries of an option table
 * (opts.h) that fill *p; *seed_seen says whether --seed was given. */
#define CLI_SAMPLER_OPTS(p, seed_seen)                                                                           \
    CLI_NUM("temp", &(p)->temperature, 0, 100, "T", "temperature (default 0.8; 0 = greedy)"),                     \
    CLI_INT("top-k", &(p)->top_k, 0, 1 << 24, "K", "sample from the K likeliest tokens (default 40; 0 = off)"),   \
    CLI_NUM("top-p", &(p)->top_p, 0, 1, "P",                                                                      \
            "sample from the likeliest tokens that make up P of the probability (default 0.95; 1 = off)"),        \
    CLI_NUM("min-p", &(p)->min_p, 0, 1, "P",                                                                      \
            "drop the tokens less likely than P times the likeliest (default 0.05; 0 = off)"),                     \
    CLI_NUM("repeat-penalty", &(p)->repeat_penalty, 0.01, 100, "R",                                               \
            "divide the logits of recent tokens by R (default 1 = off)"),                                          \
    CLI_INT("repeat-last-n", &(p)->repeat_last_n, 0, 1 << 24, "N",                                                \
            "the penalties' window (default 64; 0 = all tokens)"),                                                 \
    CLI_NUM("presence-penalty", &(p)->presence_penalty, -100, 100, "P",                                           \
            "subtract P from the logits of tokens seen in the window (default 0)"),                                \
    CLI_NUM("frequency-penalty", &(p)->frequency_penalty, -100, 100, "P",                                         \
            "subtract P per occurrence in the window (default 0)"),                                                \
    {.name = "seed", .kind = CLI_K_U64, .dst = &(p)->seed, .seen = (seed_seen), .arg = "S",                       \
     .help = "sampling seed (default: from the clock)"}

/* --spec off|ngram|mtp into an enum spec_mode (spec.c), and its option-table entry. */
bool cli_parse_spec_mode(const char *v, void *dst);
#define CLI_SPEC(p, h) CLI_FN("spec", (p), cli_parse_spec_mode, "off, ngram or mtp", "off|ngram|mtp", (h))

/* Prints "tern <cmd>: <reason>" and a --help hint to stderr; returns 2 (exit status). */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "tern <cmd>: <message>" to stderr; returns 1. */
int cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Strict number parsing for option values: false on junk, overflow or out of range. */
bool cli_parse_int(const char *s, long min, long max, long *out);
bool cli_parse_float(const char *s, double min, double max, double *out);

/* --device D (cpu, vulkan, vulkan:N, auto; NULL or "" = cpu), before the model is loaded
 * (device.c): *out = -1 for the CPU, else a Vulkan device index; *is_auto when the choice
 * may still fall back to the CPU. auto says on stderr which device it took and why.
 * Returns 0, or the exit code of a bad value or of a Vulkan the user named and the
 * machine lacks (the message names what is missing). */
int cli_device_resolve(const char *cmd, const char *d, int *out, bool *is_auto);
/* Puts the loaded model's sessions on Vulkan device *dev (nothing when -1), chunks of at
 * most n_chunk tokens, with the partial offload cpu_moe and gpu_layers asks for (below),
 * and says so on stderr; with sp, one session of those parameters is
 * made and freed to check that its state fits. A failure (an unsupported tensor, too
 * little device memory: the message has the sizes) is the exit code 1 for a named
 * device; for auto it is logged and *dev becomes -1 (the model back on the CPU). */
int cli_device_use(const char *cmd, struct tern_model *m, int *dev, bool is_auto, uint32_t n_chunk,
                   const struct tern_session_params *sp, uint32_t cpu_moe, uint32_t gpu_layers);
/* Partial offload, the option table's entries: --gpu-layers N|all|auto (the weight
 * matrices of the first N layers on the device, tern_model_set_gpu_layers; also
 * --n-gpu-layers), and for a MoE model (tern_model_set_cpu_moe) --cpu-moe (every layer's
 * routed experts in host memory) and --n-cpu-moe N|auto (the first N layers'; auto: as
 * few as let the rest and one session of the whole context fit the device), whose value
 * cli_cpu_moe_parse puts into *out: 0 (none), N, TERN_CPU_MOE_ALL or TERN_CPU_MOE_AUTO.
 * Returns 0 or a usage error's exit code. */
#define CLI_OFFLOAD_OPTS(all, n, gl)                                                                               \
    CLI_STR("gpu-layers", (gl), "N|all|auto",                                                                      \
            "with --device: the weight matrices of the first N layers on the device, the later layers' in host "    \
            "memory, their matmuls on the CPU (partial offload; default all; auto: as many as fit beside a "        \
            "session of the whole context)"),                                                                       \
    CLI_STR("n-gpu-layers", (gl), "N|all|auto", NULL),                                                             \
    CLI_FLAG("cpu-moe", (all),                                                                                     \
             "with --device: every MoE layer's routed experts stay in host memory and run on the CPU (partial "    \
             "offload)"),                                                                                          \
    CLI_STR("n-cpu-moe", (n), "N|auto",                                                                            \
            "with --device: the routed experts of the first N layers stay in host memory; auto: as few as let the " \
            "rest and a session of the whole context fit the device's memory")
int cli_cpu_moe_parse(const char *cmd, bool all, const char *n, uint32_t *out);
/* --gpu-layers N|all|auto (tern_model_set_gpu_layers) into *out: N, TERN_GPU_LAYERS_AUTO,
 * or TERN_GPU_LAYERS_ALL for all or NULL (auto not with --n-cpu-moe auto, cpu_moe).
 * Returns 0 or a usage error's exit code. */
int cli_gpu_layers_parse(const char *cmd, const char *s, uint32_t cpu_moe, uint32_t *out);


/* `tern bench <what>`: benchmarks register themselves the same way. `tern bench` with
 * no subcommand (or options first) runs the one registered as "model". */
struct cli_bench {
    const char *name;
    const char *summary;
    cli_main_fn main;
};
void cli_register_bench(const struct cli_bench *b);
#define TERN_BENCH(bname, summary_, fn)                                                      \
    static const struct cli_bench cli_bench_##fn = {bname, summary_, fn};                   \
    __attribute__((constructor)) static void cli_register_bench_##fn(void) {                \
        cli_register_bench(&cli_bench_##fn);                                                \
    }

#endif
