/* cli/opts: the option table's parser — every kind of value, its range and its message,
 * short and long spellings, --help generated from the table, positional arguments. */
#include "harness.h"

#include "cli/cli.h"
#include "cli/opts.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct cli_spec spec = {"t", "usage: tern t [options]\n\n", "the foot\n"};

/* What cli_parse wrote to stderr (one usage line) is captured here. */
static char err[1024];

static int parse(const struct cli_opt *opts, int *first, ...) {
    char *argv[32] = {"t"};
    int argc = 1;
    va_list ap;
    va_start(ap, first);
    for (char *a; (a = va_arg(ap, char *));) argv[argc++] = a;
    va_end(ap);
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    dup2(fileno(tmp), 2);
    int rc = cli_parse(&spec, opts, argc, argv, first);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(err, 1, sizeof err - 1, tmp);
    err[n] = 0;
    fclose(tmp);
    return rc;
}

struct vals {
    const char *model;
    long n;
    uint32_t u;
    size_t bytes;
    float temp;
    double d;
    uint64_t seed;
    bool flag, seed_seen;
    int kv, mode;
    const char *keys_v[2];
    struct cli_list keys;
};

static bool parse_even(const char *v, void *dst) {
    long x;
    if (!cli_parse_int(v, 0, 100, &x) || x % 2) return false;
    *(int *)dst = (int)x;
    return true;
}

#define TABLE(v)                                                                                      \
    const struct cli_opt opts[] = {                                                                   \
        CLI_STR1("m|model", &(v).model, "FILE", "the model"),                                         \
        CLI_INT("n|count", &(v).n, -5, 5, "N", "a count"),                                            \
        CLI_INTU("wait", &(v).u, 1, 60, "seconds", "S", "a wait"),                                    \
        CLI_MIB("ram", &(v).bytes, 0, 1024, "MiB", "memory"),                                         \
        CLI_NUM("temp", &(v).temp, 0, 2, "T", "temperature"),                                         \
        CLI_NUM("ratio", &(v).d, -1, 1, "R", "a ratio"),                                              \
        {.name = "seed", .kind = CLI_K_U64, .dst = &(v).seed, .seen = &(v).seed_seen, .arg = "S",     \
         .help = "a seed"},                                                                           \
        CLI_FLAG("flag", &(v).flag, "a flag"),                                                        \
        CLI_CHOICE("kv-type", &(v).kv, cli_kv_types, "f16|f32", "KV type"),                           \
        CLI_SET("low", &(v).mode, 1, "mode 1"),                                                       \
        CLI_SET("high", &(v).mode, 2, "mode 2"),                                                      \
        CLI_FN("even", &(v).mode, parse_even, "an even number", "N", "an even number"),               \
        CLI_LIST("key", &(v).keys, "KEY", "a key (repeatable)"),                                      \
        CLI_STR("hidden", &(v).model, "X", NULL),                                                     \
        CLI_END,                                                                                      \
    }

static void test_every_kind_stores(void **state) {
    (void)state;
    struct vals v = {.n = 9};
    v.keys = (struct cli_list){v.keys_v, 0, 2};
    TABLE(v);
    assert_int_equal(parse(opts, NULL, "-m", "a.gguf", "--count=-3", "--wait", "7", "--ram", "3", "--temp", "0.5",
                           "--ratio", "-0.25", "--seed", "18446744073709551615", "--flag", "--kv-type", "f32",
                           "--low", "--high", "--key", "k1", "--key", "k2", NULL),
                     -1);
    assert_string_equal(v.model, "a.gguf");
    assert_int_equal(v.n, -3);
    assert_int_equal(v.u, 7);
    assert_int_equal(v.bytes, 3u << 20);
    assert_true(v.temp == 0.5f);
    assert_true(v.d == -0.25);
    assert_true(v.seed == UINT64_MAX && v.seed_seen);
    assert_true(v.flag);
    assert_int_equal(v.kv, 1);
    assert_int_equal(v.mode, 2); /* the last of --low --high */
    assert_int_equal(v.keys.n, 2);
    assert_string_equal(v.keys_v[1], "k2");
    /* a unique prefix of a long option, and the short spelling with its value attached */
    assert_int_equal(parse(opts, NULL, "--ev", "8", "-n4", NULL), -1);
    assert_int_equal(v.mode, 8);
    assert_int_equal(v.n, 4);
}

static void test_bad_values_say_what_was_wanted(void **state) {
    (void)state;
    struct vals v = {0};
    v.keys = (struct cli_list){v.keys_v, 0, 2};
    TABLE(v);
    static const struct {
        const char *a, *b, *msg;
    } cases[] = {
        {"--count", "6", "tern t: --count '6' is not an integer from -5 to 5"},
        {"-n", "x", "tern t: --count 'x' is not an integer from -5 to 5"},
        {"--wait", "0", "tern t: --wait '0' is not 1-60 seconds"},
        {"--ram", "1025", "tern t: --ram '1025' is not 0-1024 MiB"},
        {"--temp", "nan", "tern t: --temp 'nan' is not a number from 0 to 2"},
        {"--temp", "2.5", "tern t: --temp '2.5' is not a number from 0 to 2"},
        {"--seed", "-1", "tern t: --seed '-1' is not 0-18446744073709551615"},
        {"--seed", "18446744073709551616", "tern t: --seed '18446744073709551616' is not 0-18446744073709551615"},
        {"--kv-type", "q8", "tern t: --kv-type 'q8' is not f16 or f32"},
        {"--even", "3", "tern t: --even '3' is not an even number"},
        {"--model", "", "tern t: --model needs a value"},
        {"--key", "", "tern t: --key needs a value"},
        {"--flag=1", NULL, "tern t: --flag takes no value"},
        {"--nope", NULL, "tern t: unknown option '--nope'"},
        {"-z", NULL, "tern t: unknown option '-z'"},
        {"--wait", NULL, "tern t: --wait needs a value"},
        {"stray", NULL, "tern t: unexpected argument 'stray'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(parse(opts, NULL, cases[i].a, cases[i].b, NULL), 2);
        char want[256];
        snprintf(want, sizeof want, "%s (see 'tern t --help')\n", cases[i].msg);
        assert_string_equal(err, want);
    }
    /* a value is left as it was when its option is refused */
    v.n = 1;
    assert_int_equal(parse(opts, NULL, "--count", "9", NULL), 2);
    assert_int_equal(v.n, 1);
    /* a list takes as many as it has room for */
    assert_int_equal(parse(opts, NULL, "--key", "a", "--key", "b", "--key", "c", NULL), 2);
    assert_string_equal(err, "tern t: at most 2 --key (see 'tern t --help')\n");
}

static void test_positional_arguments(void **state) {
    (void)state;
    struct vals v = {0};
    v.keys = (struct cli_list){v.keys_v, 0, 2};
    TABLE(v);
    int first = -1;
    char *argv[] = {"t", "in.txt", "--flag", "out.txt", "--", "--flag2", NULL};
    assert_int_equal(cli_parse(&spec, opts, 6, argv, &first), -1);
    assert_true(v.flag);
    /* options first (GNU order), then the arguments, "--" ending the options */
    assert_int_equal(first, 3);
    assert_string_equal(argv[first], "in.txt");
    assert_string_equal(argv[first + 1], "out.txt");
    assert_string_equal(argv[first + 2], "--flag2");
    assert_int_equal(parse(opts, &first, "--flag", NULL), -1);
    assert_int_equal(first, 2); /* none: argc */
}

static void test_help_lists_the_table(void **state) {
    (void)state;
    struct vals v = {0};
    v.keys = (struct cli_list){v.keys_v, 0, 2};
    TABLE(v);
    char buf[8192];
    FILE *f = fmemopen(buf, sizeof buf, "w");
    assert_non_null(f);
    cli_help(f, &spec, opts);
    fclose(f);
    assert_non_null(strstr(buf, "usage: tern t [options]\n\noptions:\n"));
    assert_non_null(strstr(buf, "  -m, --model FILE          the model\n"));
    assert_non_null(strstr(buf, "      --kv-type f16|f32     KV type\n"));
    assert_non_null(strstr(buf, "  -h, --help                this help\n\nthe foot\n"));
    assert_null(strstr(buf, "--hidden")); /* no help text: not listed */
    /* --help is answered with exit status 0 whatever else is on the line */
    fflush(stdout);
    int saved = dup(1);
    FILE *tmp = tmpfile();
    dup2(fileno(tmp), 1);
    int rc = parse(opts, NULL, "--nope-later", "--help", NULL);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fclose(tmp);
    assert_int_equal(rc, 2); /* the unknown option came first */
    saved = dup(1);
    tmp = tmpfile();
    dup2(fileno(tmp), 1);
    rc = parse(opts, NULL, "-h", "--nope-later", NULL);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fclose(tmp);
    assert_int_equal(rc, 0);
}

static void test_long_help_wraps(void **state) {
    (void)state;
    const char *words = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
                        "fifteen sixteen seventeen eighteen nineteen twenty";
    bool flag = false;
    const struct cli_opt opts[] = {
        CLI_FLAG("a-very-long-option-name-indeed", &flag, words),
        CLI_SECTION("more"),
        CLI_FLAG("b", &flag, "short"),
        CLI_END,
    };
    char buf[4096];
    FILE *f = fmemopen(buf, sizeof buf, "w");
    cli_help(f, &spec, opts);
    fclose(f);
    /* a name past the column puts its text on the next line; no line passes 100 columns */
    assert_non_null(strstr(buf, "  --a-very-long-option-name-indeed\n                            one two"));
    for (char *line = buf, *nl; (nl = strchr(line, '\n')); line = nl + 1) assert_true(nl - line <= 100);
    assert_non_null(strstr(buf, "\nmore:\n  --b                       short\n"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind_stores),
        cmocka_unit_test(test_bad_values_say_what_was_wanted),
        cmocka_unit_test(test_positional_arguments),
        cmocka_unit_test(test_help_lists_the_table),
        cmocka_unit_test(test_long_help_wraps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
