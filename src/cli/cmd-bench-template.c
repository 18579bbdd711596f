/* tern bench template: time chat-template renders of a long agent conversation.
 *
 * Takes one request of a replay transcript (shared/bench/agent-long.jsonl: each line's
 * "request" has "messages" and "tools"), normalises it as the server does before
 * templating (content-part arrays joined with "\n", tool-call arguments strings parsed
 * into objects), compiles the template once and renders it many times. */
#include "cli/cli.h"
#include "cli/opts.h"

#include "template/template.h"
#include "util/buf.h"
#include "util/timeutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct cli_spec template_cli = {
    "bench template",
    "usage: tern bench template [--transcript FILE.jsonl] [--template FILE.jinja] [--turn N] [--iters N]\n"
    "\n"
    "Renders one request of an agent transcript through a chat template, compiled once,\n"
    "rendered --iters times, and prints the time per render.\n"
    "\n",
    NULL,
};
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct tern_buf b = TERN_BUF_INIT;
    char tmp[1 << 16];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) tern_buf_append(&b, tmp, n);
    fclose(f);
    return tern_buf_detach(&b, len);
}

/* content: [{"type": "text", "text": ...}, ...] -> the texts joined with "\n" */
static void flatten_content(json_t *msg) {
    json_t *content = json_object_get(msg, "content");
    if (!json_is_array(content)) return;
    struct tern_buf b = TERN_BUF_INIT;
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(text)) continue;
        if (i) tern_buf_putc(&b, '\n');
        tern_buf_append(&b, json_string_value(text), json_string_length(text));
    }
    json_object_set_new(msg, "content", json_stringn(b.data ? b.data : "", b.len));
    tern_buf_free(&b);
}

static void parse_arguments(json_t *msg) {
    json_t *calls = json_object_get(msg, "tool_calls");
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        json_t *fn = json_object_get(call, "function");
        json_t *args = json_object_get(fn, "arguments");
        if (!json_is_string(args)) continue;
        json_t *obj = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
        if (json_is_object(obj)) json_object_set_new(fn, "arguments", obj);
        else json_decref(obj);
    }
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static size_t count_chars(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

static int bench_template_main(int argc, char **argv) {
    const char *transcript = "../shared/bench/agent-long.jsonl";
    const char *tpath = "../shared/conformance/templates/templates/qwen3.jinja";
    long turn = -1, iters = 200;
    const struct cli_opt opts[] = {
        CLI_STR1("transcript", &transcript, "FILE",
                 "JSON lines with a \"request\" each (default: ../shared/bench/agent-long.jsonl)"),
        CLI_STR1("template", &tpath, "FILE", "the chat template (default: the kit's qwen3.jinja)"),
        CLI_INT("turn", &turn, 0, 1000000, "N", "which line (default: the largest request)"),
        CLI_INT("iters", &iters, 1, 10000000, "N", "renders to time (default 200)"),
        CLI_END,
    };
    int c = cli_parse(&template_cli, opts, argc, argv, NULL);
    if (c >= 0) return c;

    size_t tlen, slen;
    char *text = slurp(transcript, &tlen);
    if (!text) return cli_fail("bench template", "cannot read %s", transcript);
    char *src = slurp(tpath, &slen);
    if (!src) {
        free(text);
        return cli_fail("bench template", "cannot read %s", tpath);
    }
    /* pick the line */
    json_t *pick = NULL;
    size_t best = 0;
    long line_no = 0;
    for (char *line = text; line && *line; line_no++) {
        char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        if ((turn < 0 && n > best) || turn == line_no) {
            json_t *j = json_loadb(line, n, 0, NULL);
            if (j) {
                json_decref(pick);
                pick = j;
                best = n;
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    free(text);
    if (!pick) {
        free(src);
        return cli_fail("bench template", "no usable line in %s", transcript);
    }
    json_t *req = json_object_get(pick, "request");
    json_t *messages = json_object_get(req, "messages");
    size_t i;
    json_t *msg;
    json_array_foreach(messages, i, msg) {
        flatten_content(msg);
        parse_arguments(msg);
    }
    json_t *vars = json_object();
    json_object_set(vars, "messages", messages);
    json_object_set(vars, "tools", json_object_get(req, "tools") ? json_object_get(req, "tools") : json_null());
    json_object_set_new(vars, "add_generation_prompt", json_true());
    json_object_set_new(vars, "eos_token", json_string("<|im_end|>"));

    struct tern_template *t;
    uint64_t t0 = tern_now_ns();
    if (tern_template_compile(src, slen, &t) != TERN_OK) {
        int rc = cli_fail("bench template", "%s: %s", tpath, tern_last_error());
        json_decref(vars);
        json_decref(pick);
        free(src);
        return rc;
    }
    uint64_t compile_ns = tern_now_ns() - t0;
    struct tern_buf out = TERN_BUF_INIT;
    uint64_t *ns = calloc((size_t)iters, sizeof *ns);
    int rc = 0;
    for (long k = 0; k < iters && ns; k++) {
        tern_buf_clear(&out);
        uint64_t a = tern_now_ns();
        if (tern_template_render(t, vars, NULL, &out) != TERN_OK) {
            rc = cli_fail("bench template", "render: %s", tern_last_error());
            break;
        }
        ns[k] = tern_now_ns() - a;
    }
    if (rc == 0 && ns) {
        uint64_t sum = 0;
        for (long k = 0; k < iters; k++) sum += ns[k];
        qsort(ns, (size_t)iters, sizeof *ns, cmp_u64);
        double med = (double)ns[iters / 2] / 1e6, mean = (double)sum / (double)iters / 1e6;
        size_t chars = count_chars(out.data, out.len);
        json_t *pc = json_object_get(pick, "prompt_chars");
        printf("template      %s (compiled in %.3f ms)\n", tpath, (double)compile_ns / 1e6);
        printf("request       line %lld of %s: %zu messages, %zu tools, %zu bytes of JSON\n",
               (long long)json_integer_value(json_object_get(pick, "turn")), transcript, json_array_size(messages),
               json_array_size(json_object_get(req, "tools")), best);
        printf("output        %zu bytes, %zu characters", out.len, chars);
        /* prompt_chars comes from the transcript generator's Python port of the Qwen3
         * template, not from jinja2 itself: informative only */
        if (json_is_integer(pc)) printf(" (the transcript's prompt_chars: %lld)", (long long)json_integer_value(pc));
        printf("\n");
        printf("render        min %.3f ms, median %.3f ms, mean %.3f ms, max %.3f ms over %ld renders "
               "(%.0f MB/s at the median)\n",
               (double)ns[0] / 1e6, med, mean, (double)ns[iters - 1] / 1e6, iters, (double)out.len / (med / 1e3) / 1e6);
    }
    free(ns);
    tern_buf_free(&out);
    tern_template_free(t);
    json_decref(vars);
    json_decref(pick);
    free(src);
    return rc;
}

TERN_BENCH("template", "chat-template render time of a long agent conversation", bench_template_main)
