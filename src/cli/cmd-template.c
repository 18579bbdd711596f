/* tern template: render a chat template (from a GGUF model or a .jinja file) with
 * variables from a JSON file, and print exactly the render. */
#include "cli/cli.h"
#include "cli/opts.h"

#include "gguf/gguf.h"
#include "template/template.h"
#include "util/buf.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const struct cli_spec template_cli = {
    "template",
    "usage: tern template (--model FILE.gguf | --template FILE.jinja) --vars VARS.json [--date YYYY-MM-DD]\n"
    "\n"
    "Renders a chat template with the variables of VARS.json (a JSON object: messages, tools,\n"
    "add_generation_prompt, extra keywords) and prints the result exactly, with nothing added.\n"
    "\n",
    "Exit status 1 with the error on standard error when the template fails (a syntax error,\n"
    "raise_exception(), an undefined operation).\n",
};

static time_t fixed_clock(void *user) { return *(const time_t *)user; }

static char *read_all(FILE *f, size_t *len) {
    struct tern_buf b = TERN_BUF_INIT;
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) {
        if (tern_buf_append(&b, tmp, n)) {
            tern_buf_free(&b);
            return NULL;
        }
    }
    if (ferror(f)) {
        tern_buf_free(&b);
        return NULL;
    }
    return tern_buf_detach(&b, len);
}

static char *read_path(const char *path, size_t *len) {
    if (!strcmp(path, "-")) return read_all(stdin, len);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = read_all(f, len);
    fclose(f);
    return s;
}

static bool parse_date(const char *s, time_t *out) {
    int y, m, d;
    char extra;
    if (sscanf(s, "%4d-%2d-%2d%c", &y, &m, &d, &extra) != 3) return false;
    if (y < 1970 || y > 9999 || m < 1 || m > 12 || d < 1 || d > 31) return false;
    struct tm tm = {0};
    tm.tm_year = y - 1900;
    tm.tm_mon = m - 1;
    tm.tm_mday = d;
    time_t t = timegm(&tm);
    struct tm back;
    if (t == (time_t)-1 || !gmtime_r(&t, &back) || back.tm_mday != d) return false;
    *out = t;
    return true;
}

/* The text of token `key` (tokenizer.ggml.bos_token_id ...), or NULL. */
static const struct gguf_str *token_text(const struct gguf_file *g, const char *key) {
    const struct gguf_kv *id_kv = gguf_find_kv(g, key);
    const struct gguf_kv *toks = gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (!id_kv || !toks || toks->type != GGUF_TYPE_ARRAY || toks->v.arr.type != GGUF_TYPE_STRING) return NULL;
    uint64_t id;
    if (gguf_get_u64(g, key, &id) != TERN_OK || id >= toks->v.arr.n) return NULL;
    return &toks->v.arr.strs[id];
}

static int template_main(int argc, char **argv) {
    const char *model = NULL, *tpath = NULL, *vpath = NULL, *date = NULL;
    const struct cli_opt opts[] = {
        CLI_STR1("model", &model, "FILE",
                 "read tokenizer.chat_template from a GGUF file; bos_token and eos_token come from its vocabulary "
                 "unless VARS.json sets them"),
        CLI_STR1("template", &tpath, "FILE", "read the template from a file"),
        CLI_STR1("vars", &vpath, "FILE", "the variables ('-' reads standard input)"),
        CLI_STR1("date", &date, "DATE", "the date strftime_now() sees (00:00:00 UTC); default: now"),
        CLI_END,
    };
    int c = cli_parse(&template_cli, opts, argc, argv, NULL);
    if (c >= 0) return c;
    if (!model == !tpath) return cli_usage_error("template", "give exactly one of --model and --template");
    if (!vpath) return cli_usage_error("template", "missing --vars");
    time_t when = 0;
    if (date && !parse_date(date, &when)) return cli_usage_error("template", "bad --date '%s' (want YYYY-MM-DD)", date);

    size_t vlen;
    char *vtext = read_path(vpath, &vlen);
    if (!vtext) return cli_fail("template", "cannot read %s", vpath);
    json_error_t jerr;
    json_t *vars = json_loadb(vtext, vlen, JSON_ALLOW_NUL, &jerr);
    free(vtext);
    if (!vars) return cli_fail("template", "%s: line %d: %s", vpath, jerr.line, jerr.text);
    if (!json_is_object(vars)) {
        json_decref(vars);
        return cli_fail("template", "%s: the variables must be a JSON object", vpath);
    }

    char *src = NULL;
    size_t slen = 0;
    int rc = 1;
    struct tern_template *t = NULL;
    struct tern_buf out = TERN_BUF_INIT;
    if (model) {
        struct gguf_file *g;
        struct gguf_open_opts go = {0};
        go.no_data = true;
        if (gguf_open(model, &go, &g) != TERN_OK) {
            rc = cli_fail("template", "%s", tern_last_error());
            goto done;
        }
        const struct gguf_str *tpl;
        if (gguf_get_str(g, "tokenizer.chat_template", &tpl) != TERN_OK) {
            rc = cli_fail("template", "%s has no tokenizer.chat_template: %s", model, tern_last_error());
            gguf_close(g);
            goto done;
        }
        src = malloc(tpl->len + 1);
        if (src) {
            memcpy(src, tpl->ptr, tpl->len);
            slen = tpl->len;
        }
        static const char *const keys[2][2] = {{"bos_token", "tokenizer.ggml.bos_token_id"},
                                               {"eos_token", "tokenizer.ggml.eos_token_id"}};
        for (int i = 0; i < 2; i++) {
            const struct gguf_str *s = token_text(g, keys[i][1]);
            if (s && !json_object_get(vars, keys[i][0]))
                json_object_set_new(vars, keys[i][0], json_stringn(s->ptr, s->len));
        }
        gguf_close(g);
        if (!src) {
            rc = cli_fail("template", "out of memory");
            goto done;
        }
    } else {
        src = read_path(tpath, &slen);
        if (!src) {
            rc = cli_fail("template", "cannot read %s", tpath);
            goto done;
        }
    }
    if (tern_template_compile(src, slen, &t) != TERN_OK) {
        rc = cli_fail("template", "%s: %s", model ? model : tpath, tern_last_error());
        goto done;
    }
    struct tern_template_opts o = {0};
    if (date) {
        o.clock = fixed_clock;
        o.clock_user = &when;
    }
    if (tern_template_render(t, vars, &o, &out) != TERN_OK) {
        rc = cli_fail("template", "%s", tern_last_error());
        goto done;
    }
    if (out.len && fwrite(out.data, 1, out.len, stdout) != out.len) {
        rc = cli_fail("template", "cannot write the output");
        goto done;
    }
    rc = fflush(stdout) == 0 ? 0 : cli_fail("template", "cannot write the output");
done:
    tern_buf_free(&out);
    tern_template_free(t);
    free(src);
    json_decref(vars);
    return rc;
}

TERN_COMMAND("template", "render a model's chat template with JSON variables", template_main)
