/* The option table's parser and --help (opts.h), and the messages and strict number
 * parsing of every command (cli.h). */
#include "cli/opts.h"

#include "cli/cli.h"
#include "util/mem.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tern %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see 'tern %s --help')\n", cmd);
    va_end(ap);
    return 2;
}

int cli_fail(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tern %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

bool cli_parse_int(const char *s, long min, long max, long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < min || v > max) return false;
    *out = v;
    return true;
}

bool cli_parse_float(const char *s, double min, double max, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || isnan(v) || v < min || v > max) return false;
    *out = v;
    return true;
}

const char *const cli_kv_types[] = {"f16", "f32", NULL};

/* "m|model" -> 'm' and "model"; "model" -> 0 and "model" */
static char short_of(const char *name) { return name[0] && name[1] == '|' ? name[0] : 0; }
static const char *long_of(const char *name) { return short_of(name) ? name + 2 : name; }

static bool takes_value(const struct cli_opt *o) { return o->kind != CLI_K_FLAG && o->kind != CLI_K_SET; }

/* Stores v (already in range) into an integer of o->store. */
static void store_int(const struct cli_opt *o, long long v) {
    switch (o->store) {
    case CLI_S_BOOL: *(bool *)o->dst = v != 0; break;
    case CLI_S_INT: *(int *)o->dst = (int)v; break;
    case CLI_S_UINT: *(unsigned *)o->dst = (unsigned)v; break;
    case CLI_S_LONG: *(long *)o->dst = (long)v; break;
    case CLI_S_ULONG: *(unsigned long *)o->dst = (unsigned long)v; break;
    case CLI_S_LLONG: *(long long *)o->dst = v; break;
    case CLI_S_ULLONG: *(unsigned long long *)o->dst = (unsigned long long)v; break;
    case CLI_S_FLOAT: *(float *)o->dst = (float)v; break;
    case CLI_S_DOUBLE: *(double *)o->dst = (double)v; break;
    case CLI_S_NONE: break;
    }
}

static void store_num(const struct cli_opt *o, double v) {
    if (o->store == CLI_S_FLOAT) *(float *)o->dst = (float)v;
    else *(double *)o->dst = v;
}

/* "f16 or f32", "off, ngram or mtp" */
static void say_choices(char *buf, size_t cap, const char *const *w) {
    size_t n = 0, len = 0;
    while (w[n]) n++;
    buf[0] = 0;
    for (size_t i = 0; i < n && len < cap; i++) {
        const char *sep = i == 0 ? "" : i + 1 == n ? " or " : ", ";
        int k = snprintf(buf + len, cap - len, "%s%s", sep, w[i]);
        if (k < 0) break;
        len += (size_t)k;
    }
}

/* Reads one option's value; a usage error (2) when it is bad. */
static int take(const struct cli_spec *spec, const struct cli_opt *o, const char *v) {
    const char *name = long_of(o->name);
    char want[160];
    switch (o->kind) {
    case CLI_K_FLAG: *(bool *)o->dst = true; return 0;
    case CLI_K_SET: store_int(o, (long long)o->min); return 0;
    case CLI_K_STR:
        if (o->min > 0 && !*v) return cli_usage_error(spec->cmd, "--%s needs a value", name);
        *(const char **)o->dst = v;
        return 0;
    case CLI_K_LIST: {
        struct cli_list *l = o->dst;
        if (!*v) return cli_usage_error(spec->cmd, "--%s needs a value", name);
        if (l->n == l->cap) return cli_usage_error(spec->cmd, "at most %zu --%s", l->cap, name);
        l->v[l->n++] = v;
        return 0;
    }
    case CLI_K_INT: {
        long lv;
        if (cli_parse_int(v, (long)o->min, (long)o->max, &lv)) {
            store_int(o, (long long)lv * (long long)(o->scale ? o->scale : 1));
            return 0;
        }
        if (o->expect) return cli_usage_error(spec->cmd, "--%s '%s' is not %s", name, v, o->expect);
        if (o->min < 0)
            return cli_usage_error(spec->cmd, "--%s '%s' is not an integer from %.0f to %.0f", name, v, o->min, o->max);
        return cli_usage_error(spec->cmd, "--%s '%s' is not %.0f-%.0f%s%s", name, v, o->min, o->max,
                               o->unit ? " " : "", o->unit ? o->unit : "");
    }
    case CLI_K_NUM: {
        double dv;
        if (cli_parse_float(v, o->min, o->max, &dv) && isfinite(dv)) {
            store_num(o, dv);
            return 0;
        }
        return cli_usage_error(spec->cmd, "--%s '%s' is not a number from %g to %g", name, v, o->min, o->max);
    }
    case CLI_K_U64: {
        char *end;
        errno = 0;
        unsigned long long u = strtoull(v, &end, 10);
        if (!*v || *end || errno || v[0] == '-' || v[0] == '+' || v[0] == ' ')
            return cli_usage_error(spec->cmd, "--%s '%s' is not 0-%" PRIu64, name, v, UINT64_MAX);
        *(uint64_t *)o->dst = (uint64_t)u;
        return 0;
    }
    case CLI_K_CHOICE:
        for (int i = 0; o->choices[i]; i++) {
            if (!strcmp(v, o->choices[i])) {
                *(int *)o->dst = i;
                return 0;
            }
        }
        say_choices(want, sizeof want, o->choices);
        return cli_usage_error(spec->cmd, "--%s '%s' is not %s", name, v, want);
    case CLI_K_FN:
        if (o->parse(v, o->dst)) return 0;
        return cli_usage_error(spec->cmd, "--%s '%s' is not %s", name, v, o->expect ? o->expect : "valid");
    case CLI_K_END:
    case CLI_K_SECTION: break;
    }
    return cli_usage_error(spec->cmd, "--%s: an option of no kind (a bug)", name);
}

int cli_parse(const struct cli_spec *spec, const struct cli_opt *opts, int argc, char **argv, int *first) {
    size_t n = 0;
    while (opts[n].kind != CLI_K_END) n++;
    struct option *lo = tern_calloc(n + 2, sizeof *lo);
    char *shorts = tern_malloc(3 * n + 4);
    if (!lo || !shorts) {
        free(lo);
        free(shorts);
        return cli_fail(spec->cmd, "out of memory");
    }
    /* ':' first: a missing value is told apart from an unknown option */
    size_t ns = 0;
    shorts[ns++] = ':';
    shorts[ns++] = 'h';
    size_t nl = 0;
    for (size_t i = 0; i < n; i++) {
        if (opts[i].kind == CLI_K_SECTION) continue;
        lo[nl++] = (struct option){long_of(opts[i].name), takes_value(&opts[i]) ? required_argument : no_argument,
                                   NULL, 256 + (int)i};
        char s = short_of(opts[i].name);
        if (s) {
            shorts[ns++] = s;
            if (takes_value(&opts[i])) shorts[ns++] = ':';
        }
    }
    shorts[ns] = 0;
    lo[nl] = (struct option){"help", no_argument, NULL, 'h'};
    int rc = -1, c;
    optind = 0; /* glibc: start afresh (a command may parse twice) */
    opterr = 0;
    while (rc < 0 && (c = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
        for (size_t i = 0; c > 0 && c < 256 && c != 'h' && i < n; i++)
            if (opts[i].kind != CLI_K_SECTION && short_of(opts[i].name) == c) c = 256 + (int)i; /* -m: --model */
        if (c == 'h') {
            cli_help(stdout, spec, opts);
            rc = 0;
        } else if (c >= 256 && c < 256 + (int)n) {
            const struct cli_opt *o = &opts[c - 256];
            if (o->seen) *o->seen = true;
            if (take(spec, o, optarg) != 0) rc = 2;
        } else if (c == ':') {
            rc = cli_usage_error(spec->cmd, "%s needs a value", argv[optind - 1]);
        } else if (optopt >= 256 && optopt < 256 + (int)n) {
            rc = cli_usage_error(spec->cmd, "--%s takes no value", long_of(opts[optopt - 256].name));
        } else if (optopt && optopt < 256) {
            /* an unknown short option: getopt names the letter, not the word */
            rc = cli_usage_error(spec->cmd, "unknown option '-%c'", optopt);
        } else {
            rc = cli_usage_error(spec->cmd, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (rc < 0 && optind < argc) {
        if (first) *first = optind;
        else rc = cli_usage_error(spec->cmd, "unexpected argument '%s'", argv[optind]);
    } else if (rc < 0 && first) {
        *first = argc;
    }
    free(lo);
    free(shorts);
    return rc;
}

/* Writes text from column col on, wrapped at 100 columns, continuation lines at col. */
static void wrap(FILE *out, const char *text, int col, int at) {
    enum { WIDTH = 100 };
    int x = at;
    const char *p = text;
    while (*p) {
        if (*p == '\n') { /* the author's own line break */
            fprintf(out, "\n%*s", col, "");
            x = col;
            p++;
            continue;
        }
        size_t w = strcspn(p, " \n");
        if (x > col && x + 1 + (int)w > WIDTH) {
            fprintf(out, "\n%*s", col, "");
            x = col;
        } else if (x > col) {
            fputc(' ', out);
            x++;
        }
        fwrite(p, 1, w, out);
        x += (int)w;
        p += w;
        while (*p == ' ') p++;
    }
    fputc('\n', out);
}

void cli_help(FILE *out, const struct cli_spec *spec, const struct cli_opt *opts) {
    enum { COL = 28 };
    bool shorts = false;
    for (const struct cli_opt *o = opts; o->kind != CLI_K_END; o++)
        shorts |= o->kind != CLI_K_SECTION && short_of(o->name) != 0;
    fputs(spec->head, out);
    if (opts[0].kind != CLI_K_SECTION) fputs("options:\n", out);
    for (const struct cli_opt *o = opts; o->kind != CLI_K_END; o++) {
        if (o->kind == CLI_K_SECTION) {
            fprintf(out, "%s:\n", o->name);
            continue;
        }
        if (!o->help) continue; /* test-only */
        char s = short_of(o->name);
        char lead[8] = "  ";
        if (s) snprintf(lead, sizeof lead, "  -%c, ", s);
        else if (shorts) snprintf(lead, sizeof lead, "      ");
        int x = fprintf(out, "%s--%s%s%s", lead, long_of(o->name), o->arg ? " " : "", o->arg ? o->arg : "");
        if (x >= COL - 1) {
            fprintf(out, "\n%*s", COL, "");
            x = COL;
        } else {
            fprintf(out, "%*s", COL - x, "");
            x = COL;
        }
        wrap(out, o->help, COL, x);
    }
    fprintf(out, "  -h, --help%*sthis help\n", COL - 12, "");
    if (spec->foot) {
        fputc('\n', out);
        fputs(spec->foot, out);
    }
}
