/* The template API: compile (validate, normalise newlines, lex, parse) and render
 * (set up a context with its limits and run the evaluator). */
#include "template/template.h"

#include "template/tpl.h"
#include "util/mem.h"
#include "util/utf8.h"

#include <stdlib.h>
#include <string.h>

enum tern_status tern_template_compile(const char *src, size_t len, struct tern_template **out) {
    *out = NULL;
    if (!src && len) return tern_errorf(TERN_ERR_INVALID, "template source is NULL");
    if (len > UINT32_MAX / 2) return tern_errorf(TERN_ERR_LIMIT, "template of %zu bytes is too large", len);
    size_t bad = tern_utf8_valid_prefix(src, len);
    if (bad != len) {
        unsigned line, col;
        tpl_line_col(src, bad, bad, &line, &col);
        return tern_errorf(TERN_ERR_TEMPLATE, "line %u:%u: template is not valid UTF-8 (byte offset %zu)", line, col, bad);
    }
    struct tern_template *t = tern_calloc(1, sizeof *t);
    if (!t) return tern_errorf(TERN_ERR_NOMEM, "cannot allocate a template");
    tern_arena_init(&t->ar, len * 4 + 4096, 0);
    /* jinja2 turns \r\n and \r into \n and drops one trailing newline
     * (keep_trailing_newline=False) */
    char *s = tern_arena_alloc(&t->ar, len + 1);
    if (!s) {
        tern_template_free(t);
        return TERN_ERR_NOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[k++] = src[i];
        }
    }
    if (k && s[k - 1] == '\n') k--;
    s[k] = 0;
    t->src = s;
    t->src_len = k;
    struct tpl_tokens toks;
    enum tern_status st = tpl_lex(s, k, &t->ar, &toks);
    if (!st) st = tpl_parse(t, &toks);
    if (st) {
        tern_template_free(t);
        return st;
    }
    *out = t;
    return TERN_OK;
}

static time_t default_clock(void *user) {
    (void)user;
    return time(NULL);
}

static enum tern_status render(const struct tern_template *t, const json_t *vars, const struct tern_template_opts *opts,
                               const char *const *trusted, struct tern_buf *out, struct tern_template_spans *spans) {
    if (!t || !out) return tern_errorf(TERN_ERR_INVALID, "tern_template_render: NULL template or output");
    if (vars && !json_is_object(vars))
        return tern_errorf(TERN_ERR_INVALID, "template variables must be a JSON object");
    struct tern_template_opts o = {0};
    if (opts) o = *opts;
    struct ctx c;
    memset(&c, 0, sizeof c);
    c.t = t;
    c.vars = vars;
    c.max_output = o.max_output ? o.max_output : TERN_TEMPLATE_DEFAULT_MAX_OUTPUT;
    c.max_depth = o.max_depth ? o.max_depth : TERN_TEMPLATE_DEFAULT_MAX_DEPTH;
    c.max_steps = o.max_steps ? o.max_steps : TERN_TEMPLATE_DEFAULT_MAX_STEPS;
    c.clock = o.clock ? o.clock : default_clock;
    c.clock_user = o.clock_user;
    c.spans = spans;
    c.trusted = trusted;
    size_t spans0 = spans ? spans->n : 0;
    size_t max_memory = o.max_memory;
    if (!max_memory) {
        if (tern_mul_overflow(c.max_output, 16, &max_memory)) max_memory = SIZE_MAX;
        if (max_memory < ((size_t)256 << 20)) max_memory = (size_t)256 << 20;
    }
    tern_arena_init(&c.ar, 64 * 1024, max_memory);
    c.scratch.limit = c.max_output;
    enum tern_status st = TERN_OK;
    size_t n_syms = t->n_syms ? t->n_syms : 1;
    c.globals = tern_arena_alloc(&c.ar, n_syms * sizeof *c.globals);
    c.globals_state = tern_arena_calloc(&c.ar, n_syms, 1);
    c.root = tern_arena_calloc(&c.ar, 1, sizeof *c.root);
    if (!c.globals || !c.globals_state || !c.root) st = c.ar.err ? c.ar.err : TERN_ERR_NOMEM;
    size_t start = out->len;
    if (!st) {
        c.out = out;
        c.out_start = start;
        st = tpl_render(&c);
    }
    if (st) {
        if (out->data) {
            out->len = start;
            out->data[start] = 0;
        }
        if (spans) spans->n = spans0;
    }
    for (uint32_t i = 0; i < c.n_cap_spans; i++) tern_template_spans_free(&c.cap_spans[i]);
    free(c.cap_spans);
    tern_template_spans_free(&c.tmp);
    for (uint32_t i = 0; i < c.n_caps; i++) {
        tern_buf_free(c.caps[i]);
        free(c.caps[i]);
    }
    free(c.caps);
    tern_buf_free(&c.scratch);
    tern_arena_free(&c.ar);
    return st;
}

enum tern_status tern_template_render(const struct tern_template *t, const json_t *vars,
                                      const struct tern_template_opts *opts, struct tern_buf *out) {
    return render(t, vars, opts, NULL, out, NULL);
}

enum tern_status tern_template_render_spans(const struct tern_template *t, const json_t *vars,
                                            const struct tern_template_opts *opts, const char *const *trusted,
                                            struct tern_buf *out, struct tern_template_spans *spans) {
    if (!spans) return tern_errorf(TERN_ERR_INVALID, "tern_template_render_spans: NULL spans");
    return render(t, vars, opts, trusted, out, spans);
}

int tern_template_uses(const struct tern_template *t, const char *name) {
    if (!t || !name) return 0;
    for (uint32_t i = 0; i < t->n_syms; i++)
        if (!strcmp(t->syms[i], name)) return t->sym_loaded[i] != 0;
    return 0;
}

void tern_template_free(struct tern_template *t) {
    if (!t) return;
    tern_arena_free(&t->ar);
    free(t);
}
