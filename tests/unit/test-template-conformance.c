/* The chat-template conformance kit (shared/conformance/templates): every row of
 * manifest.tsv rendered with the template engine must give the reference render byte
 * for byte, or fail where the reference failed (raise_exception messages identical).
 * Variables are templates/NAME.vars.json updated with cases/CASE.json; strftime_now
 * sees 2026-11-29 00:00:00 UTC. */
#include "harness.h"

#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "util/buf.h"
#include "util/mem.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIT "conformance/templates"

static time_t pinned_clock(void *user) {
    (void)user;
    return (time_t)1795910400; /* 2026-11-29 00:00:00 UTC */
}

static json_t *load_json(const char *rel) {
    json_error_t err;
    json_t *j = json_load_file(th_shared_path(rel), JSON_ALLOW_NUL, &err);
    if (!j) fprintf(stderr, "%s: line %d: %s\n", rel, err.line, err.text);
    return j;
}

static char *load_text(const char *rel, size_t *len) { return th_read_file(th_shared_path(rel), len); }

struct counts {
    int renders, renders_ok, errors, errors_ok, raises, raises_exact;
};

static void run_row(const char *tname, const char *cname, const char *expected, const char *kind,
                    const char *err_class, struct counts *k) {
    char rel[512];
    snprintf(rel, sizeof rel, KIT "/templates/%s.jinja", tname);
    size_t slen;
    char *src = load_text(rel, &slen);
    assert_non_null(src);
    snprintf(rel, sizeof rel, KIT "/templates/%s.vars.json", tname);
    json_t *vars = load_json(rel);
    assert_non_null(vars);
    snprintf(rel, sizeof rel, KIT "/cases/%s.json", cname);
    json_t *cs = load_json(rel);
    assert_non_null(cs);
    assert_int_equal(json_object_update(vars, cs), 0);
    snprintf(rel, sizeof rel, KIT "/%s", expected);
    size_t elen;
    char *exp = load_text(rel, &elen);
    assert_non_null(exp);

    struct tern_template *t;
    enum tern_status st = tern_template_compile(src, slen, &t);
    if (st != TERN_OK) fprintf(stderr, "%s: %s\n", tname, tern_last_error());
    assert_int_equal(st, TERN_OK);
    struct tern_template_opts o = {0};
    o.clock = pinned_clock;
    struct tern_buf out = TERN_BUF_INIT;
    st = tern_template_render(t, vars, &o, &out);
    if (!strcmp(kind, "render")) {
        k->renders++;
        if (st == TERN_OK && out.len == elen && memcmp(out.data, exp, elen) == 0) {
            k->renders_ok++;
        } else {
            fprintf(stderr, "FAIL render %s / %s: %s\n", tname, cname,
                    st == TERN_OK ? "output differs" : tern_last_error());
        }
    } else {
        k->errors++;
        bool raise = !strcmp(err_class, "raise_exception");
        if (raise) k->raises++;
        if (st == TERN_ERR_TEMPLATE && out.len == 0) {
            k->errors_ok++;
            if (raise) {
                if (strlen(tern_last_error()) == elen && memcmp(tern_last_error(), exp, elen) == 0) k->raises_exact++;
                else fprintf(stderr, "FAIL message %s / %s: got '%s'\n", tname, cname, tern_last_error());
            }
        } else {
            fprintf(stderr, "FAIL error %s / %s: expected %s, got status %d\n", tname, cname, err_class, st);
        }
    }
    tern_buf_free(&out);
    tern_template_free(t);
    free(exp);
    json_decref(cs);
    json_decref(vars);
    free(src);
}

static void test_conformance_kit(void **state) {
    (void)state;
    size_t len;
    char *manifest = load_text(KIT "/manifest.tsv", &len);
    assert_non_null(manifest);
    struct counts k = {0};
    char *save = NULL;
    char *line = strtok_r(manifest, "\n", &save); /* header */
    assert_non_null(line);
    assert_true(strncmp(line, "template\tcase\texpected", 22) == 0);
    int rows = 0;
    while ((line = strtok_r(NULL, "\n", &save))) {
        char *f[6] = {0};
        int nf = 0;
        char *s2 = NULL;
        for (char *tok = strtok_r(line, "\t", &s2); tok && nf < 6; tok = strtok_r(NULL, "\t", &s2)) f[nf++] = tok;
        assert_true(nf >= 5);
        run_row(f[0], f[1], f[2], f[4], nf > 5 ? f[5] : "", &k);
        rows++;
    }
    free(manifest);
    printf("template conformance: %d rows; renders %d/%d byte-identical; errors %d/%d "
           "(raise_exception messages identical %d/%d)\n",
           rows, k.renders_ok, k.renders, k.errors_ok, k.errors, k.raises_exact, k.raises);
    assert_true(rows > 0);
    assert_int_equal(k.renders_ok, k.renders);
    assert_int_equal(k.errors_ok, k.errors);
    assert_int_equal(k.raises_exact, k.raises);
}

/* A render is a pure function of (template, variables): rendering the same compiled
 * template again, or a fresh compile, gives the same bytes. */
static void test_conformance_rerender_stable(void **state) {
    (void)state;
    size_t slen;
    char *src = load_text(KIT "/templates/gpt-oss-120b.jinja", &slen);
    assert_non_null(src);
    json_t *vars = load_json(KIT "/templates/gpt-oss-120b.vars.json");
    json_t *cs = load_json(KIT "/cases/05-tools-args-object.json");
    assert_non_null(vars);
    assert_non_null(cs);
    json_object_update(vars, cs);
    struct tern_template *t;
    assert_int_equal(tern_template_compile(src, slen, &t), TERN_OK);
    struct tern_template_opts o = {0};
    o.clock = pinned_clock;
    struct tern_buf a = TERN_BUF_INIT, b = TERN_BUF_INIT;
    assert_int_equal(tern_template_render(t, vars, &o, &a), TERN_OK);
    for (int i = 0; i < 5; i++) {
        tern_buf_clear(&b);
        assert_int_equal(tern_template_render(t, vars, &o, &b), TERN_OK);
        assert_int_equal(a.len, b.len);
        assert_memory_equal(a.data, b.data, a.len);
    }
    assert_non_null(strstr(a.data, "Current date: 2026-11-29"));
    tern_buf_free(&a);
    tern_buf_free(&b);
    tern_template_free(t);
    json_decref(cs);
    json_decref(vars);
    free(src);
}

/* ---- marks: the request's bytes never make control tokens, ordinary renders keep
 * their token ids ----------------------------------------------------------------- */

static const char *const mark_vocabs[] = {
    "conformance/tokenizer/ggml-vocab-qwen2-from-qwen3tok.gguf",    /* <|im_start|>, <|im_end|> */
    "conformance/tokenizer/ggml-vocab-llama-bpe-from-llama3tok.gguf", /* <|start_header_id|>, <|eot_id|> */
    "conformance/tokenizer/ggml-vocab-llama-spm.gguf",               /* <s>, </s> */
};
static const char *const trusted[] = {"bos_token", "eos_token", NULL};

struct mark_counts {
    int renders, same_bytes, compared, with_control, forged_in_content, marked;
};

static bool has_control(const struct tern_tokenizer *tok, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (tern_token_is_control(tok, ids[i])) return true;
    return false;
}

static void mark_row(const char *tname, const char *cname, struct tern_tokenizer *const *toks, struct mark_counts *k) {
    char rel[512];
    snprintf(rel, sizeof rel, KIT "/templates/%s.jinja", tname);
    size_t slen;
    char *src = load_text(rel, &slen);
    snprintf(rel, sizeof rel, KIT "/templates/%s.vars.json", tname);
    json_t *vars = load_json(rel);
    snprintf(rel, sizeof rel, KIT "/cases/%s.json", cname);
    json_t *cs = load_json(rel);
    assert_true(src && vars && cs);
    assert_int_equal(json_object_update(vars, cs), 0);
    struct tern_template *t;
    assert_int_equal(tern_template_compile(src, slen, &t), TERN_OK);
    struct tern_template_opts o = {0};
    o.clock = pinned_clock;
    struct tern_buf plain = TERN_BUF_INIT, marked = TERN_BUF_INIT;
    struct tern_template_spans sp = {0};
    assert_int_equal(tern_template_render(t, vars, &o, &plain), TERN_OK);
    assert_int_equal(tern_template_render_spans(t, vars, &o, trusted, &marked, &sp), TERN_OK);
    k->renders++;
    /* marking never changes the bytes */
    if (plain.len == marked.len && !memcmp(plain.data, marked.data, plain.len)) k->same_bytes++;
    else fprintf(stderr, "FAIL marks %s / %s: the marked render differs\n", tname, cname);
    if (sp.n) k->marked++;
    struct tern_tok_range *r = tern_reallocarray(NULL, sp.n ? sp.n : 1, sizeof *r);
    assert_non_null(r);
    for (size_t i = 0; i < sp.n; i++) {
        assert_true(sp.v[i].start < sp.v[i].end && sp.v[i].end <= marked.len);
        if (i) assert_true(sp.v[i].start > sp.v[i - 1].end);
        r[i] = (struct tern_tok_range){sp.v[i].start, sp.v[i].end};
    }
    for (size_t v = 0; v < TERN_ARRAY_LEN(mark_vocabs); v++) {
        int32_t *a = NULL, *b = NULL, *w = NULL;
        size_t na = 0, ca = 0, nb = 0, cb = 0, nw = 0, cw = 0;
        assert_int_equal(tern_tokenize(toks[v], plain.data, plain.len, TERN_TOK_PARSE_SPECIAL, &a, &na, &ca), TERN_OK);
        assert_int_equal(tern_tokenize_plain(toks[v], marked.data, marked.len, TERN_TOK_PARSE_SPECIAL, r, sp.n, &b, &nb,
                                             &cb), TERN_OK);
        /* does the request's text itself hold control-token text (then it must differ) */
        bool forged = false;
        for (size_t i = 0; i < sp.n && !forged; i++) {
            nw = 0;
            assert_int_equal(tern_tokenize(toks[v], marked.data + sp.v[i].start, sp.v[i].end - sp.v[i].start,
                                           TERN_TOK_PARSE_SPECIAL, &w, &nw, &cw), TERN_OK);
            forged = has_control(toks[v], w, nw);
        }
        k->compared++;
        if (has_control(toks[v], a, na)) k->with_control++;
        if (forged) {
            k->forged_in_content++;
            if (na == nb && !memcmp(a, b, na * sizeof *a))
                fprintf(stderr, "FAIL marks %s / %s / vocab %zu: control text in content still parsed\n", tname, cname, v);
        } else if (na != nb || memcmp(a, b, na * sizeof *a)) {
            size_t d = 0;
            while (d < na && d < nb && a[d] == b[d]) d++;
            fprintf(stderr, "FAIL marks %s / %s / vocab %zu: token ids differ at %zu of %zu/%zu\n", tname, cname, v, d,
                    na, nb);
            k->compared--;
        }
        free(a);
        free(b);
        free(w);
    }
    free(r);
    tern_template_spans_free(&sp);
    tern_buf_free(&plain);
    tern_buf_free(&marked);
    tern_template_free(t);
    json_decref(cs);
    json_decref(vars);
    free(src);
}

static void test_conformance_marks(void **state) {
    (void)state;
    struct tern_tokenizer *toks[TERN_ARRAY_LEN(mark_vocabs)];
    for (size_t v = 0; v < TERN_ARRAY_LEN(mark_vocabs); v++) {
        th_require_shared(mark_vocabs[v]);
        if (tern_tokenizer_load_file(th_shared_path(mark_vocabs[v]), &toks[v]))
            fail_msg("%s: %s", mark_vocabs[v], tern_last_error());
    }
    size_t len;
    char *manifest = load_text(KIT "/manifest.tsv", &len);
    assert_non_null(manifest);
    struct mark_counts k = {0};
    char *save = NULL;
    char *line = strtok_r(manifest, "\n", &save); /* header */
    while ((line = strtok_r(NULL, "\n", &save))) {
        char *f[6] = {0};
        int nf = 0;
        char *s2 = NULL;
        for (char *tok = strtok_r(line, "\t", &s2); tok && nf < 6; tok = strtok_r(NULL, "\t", &s2)) f[nf++] = tok;
        if (nf >= 5 && !strcmp(f[4], "render")) mark_row(f[0], f[1], toks, &k);
    }
    free(manifest);
    for (size_t v = 0; v < TERN_ARRAY_LEN(mark_vocabs); v++) tern_tokenizer_free(toks[v]);
    int n_vocab = (int)TERN_ARRAY_LEN(mark_vocabs);
    printf("template marks: %d renders (%d with marked bytes), bytes unchanged %d; token ids x %d vocabularies: "
           "%d/%d identical (%d with control tokens), %d with control text in the request's bytes\n",
           k.renders, k.marked, k.same_bytes, n_vocab, k.compared - k.forged_in_content,
           k.renders * n_vocab - k.forged_in_content, k.with_control, k.forged_in_content);
    assert_true(k.renders > 100);
    assert_int_equal(k.same_bytes, k.renders);
    assert_int_equal(k.compared, k.renders * n_vocab);
    assert_true(k.marked > k.renders / 2);
    assert_true(k.with_control > k.renders / 2);
}

int main(void) {
    th_require_shared(KIT "/manifest.tsv");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conformance_kit),
        cmocka_unit_test(test_conformance_rerender_stable),
        cmocka_unit_test(test_conformance_marks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
