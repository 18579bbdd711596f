/* tern: command dispatch. */
#include "cli/cli.h"

#include "util/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COMMANDS 64

static const struct cli_command *commands[MAX_COMMANDS];
static int n_commands;

void cli_register(const struct cli_command *cmd) {
    if (n_commands < MAX_COMMANDS) commands[n_commands++] = cmd;
}

static int cmp_cmd(const void *a, const void *b) {
    return strcmp((*(const struct cli_command *const *)a)->name, (*(const struct cli_command *const *)b)->name);
}

static void print_help(FILE *out) {
    fprintf(out,
            "usage: tern <command> [options]\n"
            "\n"
            "tern is an LLM inference server for GGUF models that keeps conversations warm.\n"
            "\n"
            "commands:\n");
    for (int i = 0; i < n_commands; i++) fprintf(out, "  %-18s %s\n", commands[i]->name, commands[i]->summary);
    fprintf(out, "\n'tern <command> --help' describes a command's options.\n");
}

int main(int argc, char **argv) {
    tern_json_alloc_init(); /* jansson allocates through tern's allocator (util/mem.h) */
    qsort(commands, (size_t)n_commands, sizeof commands[0], cmp_cmd);
    if (argc < 2) {
        fprintf(stderr, "tern: missing command (see 'tern --help')\n");
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_help(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("tern 0.1.0\n");
        return 0;
    }
    for (int i = 0; i < n_commands; i++) {
        if (!strcmp(argv[1], commands[i]->name)) return commands[i]->main(argc - 1, argv + 1);
    }
    fprintf(stderr, "tern: unknown command '%s' (see 'tern --help')\n", argv[1]);
    return 2;
}
