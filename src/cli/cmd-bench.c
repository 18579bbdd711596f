/* tern bench: dispatch to the registered benchmarks (model, memory, tokenize, ...). */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

#define MAX_BENCH 32
static const struct cli_bench *benches[MAX_BENCH];
static int n_benches;

void cli_register_bench(const struct cli_bench *b) {
    if (n_benches < MAX_BENCH) benches[n_benches++] = b;
}

static const struct cli_bench *find(const char *name) {
    for (int i = 0; i < n_benches; i++)
        if (!strcmp(benches[i]->name, name)) return benches[i];
    return NULL;
}

static int bench_main(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) && !find("model")) {
        printf("usage: tern bench <what> [options]\n\nbenchmarks:\n");
        for (int i = 0; i < n_benches; i++) printf("  %-12s %s\n", benches[i]->name, benches[i]->summary);
        return 0;
    }
    if (argc >= 2 && argv[1][0] != '-') {
        const struct cli_bench *b = find(argv[1]);
        if (!b) return cli_usage_error("bench", "unknown benchmark '%s'", argv[1]);
        return b->main(argc - 1, argv + 1);
    }
    const struct cli_bench *m = find("model");
    if (!m) return cli_usage_error("bench", "missing benchmark name");
    return m->main(argc, argv);
}

TERN_COMMAND("bench", "benchmarks: model speed (default), memory bandwidth, tokenizer, ...", bench_main)
