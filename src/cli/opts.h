/* Command-line options as a table: each command lists its options once — name, where
 * the value goes, its range, its line in --help — and cli_parse reads argv by that
 * table: the same checks and the same messages for every command, and a --help that
 * cannot forget an option.
 *
 *     long port = 8080;
 *     const struct cli_opt opts[] = {
 *         CLI_INT("port", &port, 0, 65535, "N", "port (default 8080; 0 picks a free one)"),
 *         CLI_END,
 *     };
 *     static const struct cli_spec spec = {"serve", "usage: tern serve [options]\n", NULL};
 *     int rc = cli_parse(&spec, opts, argc, argv, NULL);
 *     if (rc >= 0) return rc;   // 0 after --help, 2 after a usage error
 *
 * Integers go to any integer type (_Generic picks the store), scaled by a unit
 * (CLI_MIB: MiB in, bytes out); numbers to float or double; a choice stores the index
 * of the word given. getopt_long does the scanning: unique prefixes of long options
 * work, options and arguments may mix, "--" ends the options. */
#ifndef TERN_CLI_OPTS_H
#define TERN_CLI_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum cli_kind {
    CLI_K_END,
    CLI_K_FLAG,   /* no value: *(bool *)dst = true */
    CLI_K_SET,    /* no value: *dst = min, any integer or bool (--mmap / --no-mmap on one variable) */
    CLI_K_STR,    /* *(const char **)dst = the value; min 1: it must not be empty */
    CLI_K_LIST,   /* repeatable: appended to a struct cli_list (non-empty values) */
    CLI_K_INT,    /* an integer in [min, max], times scale, into the integer dst */
    CLI_K_NUM,    /* a finite number in [min, max] into float or double dst */
    CLI_K_U64,    /* any unsigned 64-bit integer (seeds) into uint64_t dst */
    CLI_K_CHOICE, /* one of choices[] (NULL-terminated): its index into int dst */
    CLI_K_FN,     /* parse(value, dst) says whether it is good; expect says what is */
    CLI_K_SECTION /* not an option: a heading in --help ("arms:") */
};

/* The type of an integer or number destination (so that one table entry fits them all). */
enum cli_store {
    CLI_S_NONE, CLI_S_BOOL, CLI_S_INT, CLI_S_UINT, CLI_S_LONG, CLI_S_ULONG, CLI_S_LLONG, CLI_S_ULLONG,
    CLI_S_FLOAT, CLI_S_DOUBLE
};

#define CLI_STORE(p)                                                                                    \
    _Generic((p), bool *: CLI_S_BOOL, int *: CLI_S_INT, unsigned *: CLI_S_UINT, long *: CLI_S_LONG,     \
             unsigned long *: CLI_S_ULONG, long long *: CLI_S_LLONG, unsigned long long *: CLI_S_ULLONG, \
             float *: CLI_S_FLOAT, double *: CLI_S_DOUBLE)

/* The values of a repeatable option: v has room for cap of them. */
struct cli_list {
    const char **v;
    size_t n, cap;
};

struct cli_opt {
    const char *name; /* the long option, without "--"; "m|model": with the short option -m */
    enum cli_kind kind;
    enum cli_store store;
    void *dst;
    double min, max;
    uint64_t scale;               /* CLI_K_INT: the value is multiplied by this (0 = 1) */
    const char *const *choices;   /* CLI_K_CHOICE */
    bool (*parse)(const char *value, void *dst); /* CLI_K_FN */
    const char *expect;           /* what a bad value should have been, for the message */
    const char *unit;             /* CLI_K_INT: the range's unit in the message ("MiB") */
    const char *arg;              /* the value's name in --help ("N", "FILE"); NULL: a flag */
    const char *help;             /* its --help text; NULL: not listed (test-only options) */
    bool *seen;                   /* set when the option is given, if not NULL */
};

#define CLI_END {.kind = CLI_K_END}
#define CLI_SECTION(title) {.name = (title), .kind = CLI_K_SECTION}
#define CLI_FLAG(n, p, h) {.name = (n), .kind = CLI_K_FLAG, .dst = (bool *){p}, .help = (h)}
#define CLI_SET(n, p, v, h) {.name = (n), .kind = CLI_K_SET, .store = CLI_STORE(p), .dst = (p), .min = (v), .help = (h)}
#define CLI_STR(n, p, a, h) {.name = (n), .kind = CLI_K_STR, .dst = (const char **){p}, .arg = (a), .help = (h)}
/* a value that must not be empty */
#define CLI_STR1(n, p, a, h) \
    {.name = (n), .kind = CLI_K_STR, .dst = (const char **){p}, .min = 1, .arg = (a), .help = (h)}
#define CLI_LIST(n, p, a, h) {.name = (n), .kind = CLI_K_LIST, .dst = (struct cli_list *){p}, .arg = (a), .help = (h)}
#define CLI_INT(n, p, lo, hi, a, h) \
    {.name = (n), .kind = CLI_K_INT, .store = CLI_STORE(p), .dst = (p), .min = (lo), .max = (hi), .arg = (a), \
     .help = (h)}
/* MiB on the command line, bytes in *p */
#define CLI_MIB(n, p, lo, hi, a, h)                                                                             \
    {.name = (n), .kind = CLI_K_INT, .store = CLI_STORE(p), .dst = (p), .min = (lo), .max = (hi), .scale = 1u << 20, \
     .unit = "MiB", .arg = (a), .help = (h)}
/* an integer with a unit its message names ("seconds") */
#define CLI_INTU(n, p, lo, hi, u, a, h) \
    {.name = (n), .kind = CLI_K_INT, .store = CLI_STORE(p), .dst = (p), .min = (lo), .max = (hi), .unit = (u), \
     .arg = (a), .help = (h)}
#define CLI_NUM(n, p, lo, hi, a, h) \
    {.name = (n), .kind = CLI_K_NUM, .store = CLI_STORE(p), .dst = (p), .min = (lo), .max = (hi), .arg = (a), \
     .help = (h)}
#define CLI_U64(n, p, a, h) {.name = (n), .kind = CLI_K_U64, .dst = (uint64_t *){p}, .arg = (a), .help = (h)}
#define CLI_CHOICE(n, p, words, a, h) \
    {.name = (n), .kind = CLI_K_CHOICE, .dst = (int *){p}, .choices = (words), .arg = (a), .help = (h)}
#define CLI_FN(n, p, fn, what, a, h) \
    {.name = (n), .kind = CLI_K_FN, .dst = (p), .parse = (fn), .expect = (what), .arg = (a), .help = (h)}

/* What a command says around its option list in --help. */
struct cli_spec {
    const char *cmd;  /* "serve": messages say "tern serve: ..." */
    const char *head; /* the usage line(s) and what the command does, ending in a blank line */
    const char *foot; /* after the options (environment, examples), or NULL */
};

/* Reads argv[1..] by opts. Returns -1 to go on; otherwise the exit status, with
 * everything said: 0 after --help (printed to stdout), 2 after a usage error (one line
 * to stderr). *first (when not NULL) is the index of the first argument that is not an
 * option; with first NULL any such argument is a usage error. */
int cli_parse(const struct cli_spec *spec, const struct cli_opt *opts, int argc, char **argv, int *first);

/* --help: spec->head, the options of the table (wrapped to 100 columns), -h/--help,
 * spec->foot. */
void cli_help(FILE *out, const struct cli_spec *spec, const struct cli_opt *opts);

/* Choices shared by several commands. */
extern const char *const cli_kv_types[];   /* "f16", "f32": the order of enum tern_kv_type */

#endif
