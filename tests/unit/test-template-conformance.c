/* The chat-template conformance kit (shared/conformance/templates): every row of
 * manifest.tsv rendered with the template engine must give the reference render byte
 * for byte, or fail where the reference failed (raise_exception messages identical).
 * Variables are templates/NAME.vars.json updated with cases/CASE.json; strftime_now
 * sees 2026-11-29 00:00:00 UTC. */
#include "harness.h"

#include "template/template.h"
#include "util/buf.h"

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

int main(void) {
    th_require_shared(KIT "/manifest.tsv");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conformance_kit),
        cmocka_unit_test(test_conformance_rerender_stable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
