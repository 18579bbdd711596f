/* tern bench tokenize: tokenizer throughput on a generated mix of prose and code. */
#include "cli/cli.h"
#include "cli/opts.h"

#include "tokenizer/tokenizer.h"
#include "util/buf.h"
#include "util/rng.h"
#include "util/timeutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint32_t rnd(uint64_t *s, uint32_t n) { return (uint32_t)(tern_splitmix64(s) % n); }
#define PICK(s, arr) (arr)[rnd(s, (uint32_t)(sizeof(arr) / sizeof((arr)[0])))]

static const char *const words[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
    "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would",
    "who", "so", "no", "model", "server", "token", "cache", "request", "session", "checkpoint", "memory",
    "conversation", "history", "latency", "throughput", "performance", "generation", "attention", "layer",
    "recurrent", "state", "prompt", "template", "client", "response", "stream", "buffer", "thread", "kernel",
    "matrix", "vector", "quantization", "precision", "benchmark", "measurement", "reasonably", "unfortunately",
    "nevertheless", "straightforward", "implementation", "configuration", "don't", "it's", "we're", "they've",
    "I'll", "she'd", "internationalization", "approximately", "understanding", "questions", "answered"};
static const char *const accented[] = {"café", "naïve", "Ærøskøbing", "façade", "über", "Straße", "déjà vu",
                                       "señor", "Ångström", "jalapeño"};
static const char *const other[] = {"中文的文本", "日本語のテキスト", "한국어 텍스트", "Привет, мир", "Γειά σου κόσμε",
                                    "مرحبا بالعالم", "नमस्ते दुनिया", "😀 🚀 ✅ 🦙", "→ ≤ ≥ ∑ ∞", "«quoted» „text“"};
static const char *const kw[] = {"if", "for", "while", "return", "static", "const", "int", "size_t", "def",
                                 "class", "import", "struct", "void", "else", "switch", "case", "break"};
static const char *const ops[] = {" = ", " == ", " != ", " += ", " -> ", ".", ", ", " && ", " || ", " < ", " >= ",
                                  " * ", " + ", " - ", "::", " / "};

#define N_IDENTS 3000
static char idents[N_IDENTS][48];

/* A pool of identifiers, as code reuses its names. */
static void make_idents(uint64_t seed) {
    uint64_t s = seed ^ 0x1D3A7u;
    for (int k = 0; k < N_IDENTS; k++) {
        char *o = idents[k];
        size_t n = 0;
        int parts = 1 + (int)rnd(&s, 3), camel = rnd(&s, 2);
        for (int i = 0; i < parts; i++) {
            const char *w = PICK(&s, words);
            size_t wl = strlen(w);
            if (n + wl + 2 >= sizeof idents[0] || strchr(w, '\'')) continue;
            if (i && !camel) o[n++] = '_';
            memcpy(o + n, w, wl);
            if (i && camel && o[n] >= 'a' && o[n] <= 'z') o[n] = (char)(o[n] - 32);
            n += wl;
        }
        if (!n) o[n++] = 'x';
        o[n] = 0;
    }
}

static void ident(struct tern_buf *b, uint64_t *s) { tern_buf_puts(b, idents[rnd(s, N_IDENTS)]); }

static void sentence(struct tern_buf *b, uint64_t *s) {
    int n = 4 + (int)rnd(s, 18);
    for (int i = 0; i < n; i++) {
        uint32_t r = rnd(s, 100);
        if (i) tern_buf_putc(b, ' ');
        if (r < 3)
            tern_buf_printf(b, "%u", rnd(s, 100000));
        else if (r < 5)
            tern_buf_puts(b, PICK(s, accented));
        else if (r < 6)
            tern_buf_puts(b, PICK(s, other));
        else {
            const char *w = PICK(s, words);
            if (i == 0 && w[0] >= 'a' && w[0] <= 'z') {
                tern_buf_putc(b, (char)(w[0] - 32));
                tern_buf_puts(b, w + 1);
            } else {
                tern_buf_puts(b, w);
            }
        }
        if (r >= 90 && i + 1 < n) tern_buf_putc(b, ',');
    }
    tern_buf_putc(b, rnd(s, 8) ? '.' : '?');
}

static void prose(struct tern_buf *b, uint64_t *s) {
    int sentences = 2 + (int)rnd(s, 6);
    for (int k = 0; k < sentences; k++) {
        if (k) tern_buf_putc(b, ' ');
        sentence(b, s);
    }
    tern_buf_puts(b, "\n\n");
}

static void indent(struct tern_buf *b, int depth) {
    for (int d = 0; d < depth; d++) tern_buf_puts(b, "    ");
}

static void code(struct tern_buf *b, uint64_t *s) {
    int lines = 3 + (int)rnd(s, 12), depth = 0;
    for (int l = 0; l < lines; l++) {
        uint32_t r = rnd(s, 10);
        if (r < 2 && depth > 0) {
            depth--;
            indent(b, depth);
            tern_buf_puts(b, "}\n");
            continue;
        }
        indent(b, depth);
        if (r < 4) {
            tern_buf_puts(b, PICK(s, kw));
            tern_buf_puts(b, " (");
            ident(b, s);
            tern_buf_puts(b, PICK(s, ops));
            tern_buf_printf(b, "%u) {\n", rnd(s, 1000));
            if (depth < 5) depth++;
        } else if (r < 5) {
            tern_buf_puts(b, "// ");
            sentence(b, s);
            tern_buf_putc(b, '\n');
        } else {
            ident(b, s);
            tern_buf_puts(b, PICK(s, ops));
            ident(b, s);
            tern_buf_puts(b, "(");
            ident(b, s);
            tern_buf_printf(b, ", %u, \"%s\");\n", rnd(s, 65536), PICK(s, words));
        }
    }
    while (depth-- > 0) {
        indent(b, depth);
        tern_buf_puts(b, "}\n");
    }
    tern_buf_putc(b, '\n');
}

/* A deterministic mix of prose (about half), code, and some non-Latin text. */
static int gen_text(struct tern_buf *b, size_t size, uint64_t seed) {
    uint64_t s = seed;
    make_idents(seed);
    while (b->len < size) {
        uint32_t r = rnd(&s, 10);
        if (r < 5)
            prose(b, &s);
        else
            code(b, &s);
    }
    if (!b->data) return -1;
    /* Cut at a character boundary. */
    size_t n = size;
    while (n > 0 && ((uint8_t)b->data[n] & 0xC0) == 0x80) n--;
    b->len = n;
    b->data[n] = 0;
    return 0;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const struct cli_spec tokenize_cli = {
    "bench tokenize",
    "usage: tern bench tokenize --model FILE [--size MB] [--repeat N] [--seed S]\n"
    "                           [--save-text FILE]\n"
    "\n"
    "Measures the tokenizer of a GGUF file on a generated, deterministic mix of\n"
    "prose and code (the same seed gives the same text), without special-token\n"
    "parsing. Reports the load time, the median and best MB/s of the runs, tokens/s,\n"
    "and detokenization speed.\n"
    "\n",
    NULL,
};

static int bench_tokenize_main(int argc, char **argv) {
    const char *model = NULL, *save = NULL;
    long size_mb = 10, repeat = 5, seed = 1;
    const struct cli_opt opts[] = {
        CLI_STR1("m|model", &model, "FILE", "the GGUF file (a vocab-only one works)"),
        CLI_INTU("size", &size_mb, 1, 1024, "MB", "MB", "text to generate (default 10)"),
        CLI_INT("repeat", &repeat, 1, 1000, "N", "runs (default 5)"),
        CLI_INT("seed", &seed, 0, INT32_MAX, "S", "the text generator's seed (default 1)"),
        CLI_STR1("save-text", &save, "FILE", "write the generated text to FILE"),
        CLI_END,
    };
    int o = cli_parse(&tokenize_cli, opts, argc, argv, NULL);
    if (o >= 0) return o;
    if (!model) return cli_usage_error("bench tokenize", "missing --model FILE");

    struct tern_buf text = TERN_BUF_INIT;
    if (gen_text(&text, (size_t)size_mb << 20, (uint64_t)seed)) return cli_fail("bench tokenize", "out of memory");

    if (save) {
        FILE *f = fopen(save, "wb");
        if (!f || fwrite(text.data, 1, text.len, f) != text.len || fclose(f) != 0) {
            tern_buf_free(&text);
            return cli_fail("bench tokenize", "cannot write %s", save);
        }
    }
    double t0 = tern_now_s();
    struct tern_tokenizer *t;
    if (tern_tokenizer_load_file(model, &t)) {
        tern_buf_free(&text);
        return cli_fail("bench tokenize", "%s", tern_last_error());
    }
    double load_s = tern_now_s() - t0;
    printf("model: %s\ntokenizer: %s/%s, %u tokens\nload: %.1f ms\ntext: %.2f MB (seed %ld)\n", model,
           tern_tokenizer_model_name(t), tern_tokenizer_pre(t), tern_tokenizer_n_vocab(t), load_s * 1e3,
           text.len / 1048576.0, seed);

    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    double *secs = calloc((size_t)repeat, sizeof *secs), *cpus = calloc((size_t)repeat, sizeof *cpus);
    int rc = 0;
    struct tern_tok_stats stats = {0};
    for (long r = 0; r < repeat && secs && cpus; r++) {
        n = 0;
        memset(&stats, 0, sizeof stats);
        double a = tern_now_s(), ca = cpu_now();
        if (tern_tokenize_ex(t, text.data, text.len, 0, &ids, &n, &cap, &stats)) {
            rc = cli_fail("bench tokenize", "%s", tern_last_error());
            break;
        }
        secs[r] = tern_now_s() - a;
        cpus[r] = cpu_now() - ca;
    }
    if (!rc && secs && cpus) {
        qsort(secs, (size_t)repeat, sizeof *secs, cmp_double);
        qsort(cpus, (size_t)repeat, sizeof *cpus, cmp_double);
        double med = secs[repeat / 2], best = secs[0], mb = text.len / 1048576.0;
        printf("tokenize: %.1f MB/s median, %.1f MB/s best (%ld runs); %zu tokens, %.2f bytes/token, %.2f M "
               "tokens/s\n",
               mb / med, mb / best, repeat, n, (double)text.len / (double)(n ? n : 1), n / med / 1e6);
        /* On a busy machine wall time includes waiting for a CPU; thread CPU time does not. */
        printf("tokenize (thread CPU time): %.1f MB/s median\n", mb / cpus[repeat / 2]);
        printf("work: %llu pre-tokens (%llu from the cache, %llu merged), %llu merges, %llu pair lookups\n",
               (unsigned long long)stats.n_words, (unsigned long long)stats.n_cache_hits,
               (unsigned long long)stats.n_bpe_words,
               (unsigned long long)stats.n_merges, (unsigned long long)stats.n_pair_lookups);
        struct tern_buf dec = TERN_BUF_INIT;
        double a = tern_now_s();
        if (tern_detokenize(t, ids, n, 0, &dec)) {
            rc = cli_fail("bench tokenize", "%s", tern_last_error());
        } else {
            double d = tern_now_s() - a;
            bool same = dec.len == text.len && !memcmp(dec.data, text.data, text.len);
            printf("detokenize: %.1f MB/s; round trip %s\n", dec.len / 1048576.0 / d, same ? "exact" : "DIFFERS");
        }
        tern_buf_free(&dec);
    }
    free(secs);
    free(cpus);
    free(ids);
    tern_tokenizer_free(t);
    tern_buf_free(&text);
    return rc;
}

TERN_BENCH("tokenize", "tokenizer speed (MB/s) on a generated 10 MB prose/code text", bench_tokenize_main)
