/* tern tokenize: shows how a model's tokenizer splits a text. */
#include "cli/cli.h"
#include "cli/opts.h"

#include "tokenizer/tokenizer.h"
#include "util/mem.h"
#include "util/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct cli_spec tokenize_cli = {
    "tokenize",
    "usage: tern tokenize --model FILE [--ids] [--raw] (TEXT | -)\n"
    "\n"
    "Tokenizes TEXT with the tokenizer of a GGUF file (a vocab-only GGUF works) and\n"
    "prints one token per line: the id and the piece it stands for, escaped. TEXT '-'\n"
    "reads it verbatim from standard input.\n"
    "\n",
    NULL,
};

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (n == cap) {
            char *p = tern_reallocarray(buf, cap, 2);
            if (!p) {
                free(buf);
                return NULL;
            }
            buf = p;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* Prints a piece quoted, with control characters, quotes, backslashes and bytes that
 * are not valid UTF-8 escaped; valid non-ASCII characters as they are. */
static void print_piece(const char *s, size_t n) {
    const uint8_t *p = (const uint8_t *)s;
    putchar('\'');
    for (size_t i = 0; i < n;) {
        uint8_t c = p[i];
        if (c >= 0x80) {
            size_t bad, k = tern_utf8_seq(p + i, n - i, &bad);
            if (k) {
                fwrite(p + i, 1, k, stdout);
                i += k;
            } else {
                printf("\\x%02x", c);
                i++;
            }
            continue;
        }
        switch (c) {
        case '\n': fputs("\\n", stdout); break;
        case '\t': fputs("\\t", stdout); break;
        case '\r': fputs("\\r", stdout); break;
        case '\'': fputs("\\'", stdout); break;
        case '\\': fputs("\\\\", stdout); break;
        default:
            if (c < 0x20 || c == 0x7F)
                printf("\\x%02x", c);
            else
                putchar(c);
        }
        i++;
    }
    putchar('\'');
}

static int tokenize_main(int argc, char **argv) {
    const char *model = NULL;
    bool ids_only = false, raw = false;
    const struct cli_opt opts[] = {
        CLI_STR1("m|model", &model, "FILE", "the GGUF file"),
        CLI_FLAG("ids", &ids_only, "print only the ids, space-separated, on one line"),
        CLI_FLAG("raw", &raw,
                 "add no BOS/EOS and do not parse special-token text such as <|im_start|> (the setting of "
                 "llama.cpp's tokenizer tests)"),
        CLI_END,
    };
    int text_at;
    int o = cli_parse(&tokenize_cli, opts, argc, argv, &text_at);
    if (o >= 0) return o;
    if (!model) return cli_usage_error("tokenize", "missing --model FILE");
    if (text_at != argc - 1)
        return cli_usage_error("tokenize", text_at >= argc ? "missing TEXT (or '-' for standard input)"
                                                          : "expected one TEXT argument, got %d", argc - text_at);
    const char *arg = argv[text_at];
    char *text = NULL;
    size_t len;
    if (!strcmp(arg, "-")) {
        text = read_stdin(&len);
        if (!text) return cli_fail("tokenize", "cannot read standard input");
    } else {
        len = strlen(arg);
    }

    struct tern_tokenizer *t;
    if (tern_tokenizer_load_file(model, &t)) {
        free(text);
        return cli_fail("tokenize", "%s", tern_last_error());
    }
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int flags = raw ? 0 : TERN_TOK_ADD_SPECIAL | TERN_TOK_PARSE_SPECIAL;
    if (tern_tokenize(t, text ? text : arg, len, flags, &ids, &n, &cap)) {
        int rc = cli_fail("tokenize", "%s", tern_last_error());
        free(text);
        tern_tokenizer_free(t);
        return rc;
    }
    if (ids_only) {
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
    } else {
        for (size_t i = 0; i < n; i++) {
            size_t plen;
            const char *p = tern_token_piece_ref(t, ids[i], TERN_TOK_PARSE_SPECIAL, &plen);
            printf("%6d ", ids[i]);
            print_piece(p, plen);
            putchar('\n');
        }
    }
    free(ids);
    free(text);
    tern_tokenizer_free(t);
    return fflush(stdout) == 0 ? 0 : 1;
}

TERN_COMMAND("tokenize", "tokenize a text with a model's tokenizer (ids and pieces)", tokenize_main)
