/* JSON Schema -> GBNF: documents accepted and rejected per keyword, integer ranges
 * checked exhaustively, patterns, formats, $ref recursion, refusals with their JSON
 * pointers, and every tool schema of the shared kit's 15-tool qwen-code request. */
#include "harness.h"

#include "grammar/grammar.h"
#include "grammar/schema.h"
#include "tern.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct tern_grammar *from_schema(const char *schema_json) {
    json_error_t je;
    json_t *s = json_loads(schema_json, JSON_DECODE_ANY, &je);
    if (!s) fprintf(stderr, "bad test schema: %s\n", je.text);
    assert_non_null(s);
    struct tern_buf b = TERN_BUF_INIT;
    char ptr[256];
    enum tern_status st = tern_json_schema_to_gbnf(s, &b, ptr, sizeof ptr);
    if (st) fprintf(stderr, "schema failed: %s\n", tern_last_error());
    assert_int_equal(st, TERN_OK);
    struct tern_grammar *g = NULL;
    st = tern_grammar_compile(b.data, b.len, NULL, &g);
    if (st) fprintf(stderr, "grammar failed: %s\n%s\n", tern_last_error(), b.data);
    assert_int_equal(st, TERN_OK);
    tern_buf_free(&b);
    json_decref(s);
    return g;
}

static bool matches(const struct tern_grammar *g, const char *doc) {
    struct tern_gmatch *m = NULL;
    assert_int_equal(tern_gmatch_new(g, NULL, &m), TERN_OK);
    bool ok = tern_gmatch_matches(m, doc, strlen(doc));
    tern_gmatch_free(m);
    return ok;
}

struct scase {
    const char *schema;
    const char *accept[8];
    const char *reject[8];
};

static void run(const struct scase *cs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        struct tern_grammar *g = from_schema(cs[i].schema);
        for (size_t k = 0; k < 8 && cs[i].accept[k]; k++) {
            if (!matches(g, cs[i].accept[k])) fprintf(stderr, "%s should accept %s\n", cs[i].schema, cs[i].accept[k]);
            assert_true(matches(g, cs[i].accept[k]));
        }
        for (size_t k = 0; k < 8 && cs[i].reject[k]; k++) {
            if (matches(g, cs[i].reject[k])) fprintf(stderr, "%s should reject %s\n", cs[i].schema, cs[i].reject[k]);
            assert_false(matches(g, cs[i].reject[k]));
        }
        tern_grammar_free(g);
    }
}

static void test_types(void **state) {
    (void)state;
    static const struct scase cs[] = {
        {"{\"type\":\"string\"}", {"\"\"", "\"a b\"", "\"\\n\\u00e9\\\"\"", "\"\xe6\x97\xa5\""}, {"a", "\"\x01\"", "\"\\ud800\"", "1"}},
        {"{\"type\":\"integer\"}", {"0", "-12", "1234567890123456"}, {"01", "1.5", "12345678901234567", "\"1\""}},
        {"{\"type\":\"number\"}", {"0", "-1.25", "3e10", "2.5E-3"}, {".5", "1.", "1e999", "-"}},
        {"{\"type\":\"boolean\"}", {"true", "false"}, {"null", "1"}},
        {"{\"type\":\"null\"}", {"null"}, {"nul"}},
        {"{\"type\":[\"string\",\"null\"]}", {"null", "\"x\""}, {"1"}},
        {"{}", {"{\"a\":[1,{\"b\":null}]}", "\"s\"", "-2.5"}, {"{a:1}"}},
        {"true", {"[]"}, {"[,]"}},
        {"{\"const\":{\"a\":[1,\"x\"]}}", {"{\"a\":[1,\"x\"]}"}, {"{\"a\":[1]}"}},
        {"{\"enum\":[\"red\",2,null,\"q\\\"\"]}", {"\"red\"", "2", "null", "\"q\\\"\""}, {"\"blue\"", "\"red \""}},
        {"{\"type\":\"number\",\"minimum\":0}", {"0", "2.5"}, {"-1", "-0.5"}},
    };
    run(cs, sizeof cs / sizeof cs[0]);
}

static void test_objects(void **state) {
    (void)state;
    static const struct scase cs[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
         "\"required\":[\"a\"]}",
         {"{\"a\":1}", "{\"a\": 1, \"b\": \"x\"}", "{ \"a\" : 1 ,\n  \"b\" : \"\" }"},
         {"{}", "{\"b\":\"x\"}", "{\"b\":\"x\",\"a\":1}", "{\"a\":1,\"c\":2}", "{\"a\":\"1\"}"}},
        {"{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{},\"c\":{}}}",
         {"{}", "{\"a\":1}", "{\"b\":1}", "{\"c\":1}", "{\"a\":1,\"c\":2}", "{\"a\":1,\"b\":2,\"c\":3}"},
         {"{,}", "{\"a\":1,}", "{\"c\":1,\"a\":2}"}},
        {"{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{}},\"required\":[\"b\"]}",
         {"{\"b\":1}", "{\"a\":1,\"b\":2}"}, {"{\"a\":1}", "{}"}},
        {"{\"type\":\"object\"}", {"{}", "{\"x\":[1]}"}, {"[]"}},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", {"{}", "{\"x\":1,\"y\":2}"}, {"{\"x\":\"1\"}"}},
        {"{\"type\":\"object\",\"additionalProperties\":false}", {"{}"}, {"{\"x\":1}"}},
        {"{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"null\"}},"
         "\"required\":[\"n\"]}},\"required\":[\"k\"],\"additionalProperties\":false}",
         {"{\"k\":{\"n\":null}}"}, {"{\"k\":{}}", "{\"k\":{\"n\":1}}"}},
        {"{\"required\":[\"a\"]}", {"{\"a\":[]}"}, {"{}"}},
    };
    run(cs, sizeof cs / sizeof cs[0]);
}

static void test_arrays_strings(void **state) {
    (void)state;
    static const struct scase cs[] = {
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}",
         {"[1,2]", "[1, 2, 3]"}, {"[]", "[1]", "[1,2,3,4]", "[1,\"2\"]"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}", {"[]", "[1]", "[1,2,3,4]"}, {"[1,]", "[,]"}},
        {"{\"type\":\"array\",\"maxItems\":0}", {"[]"}, {"[1]"}},
        {"{\"type\":\"array\",\"minItems\":1}", {"[null]", "[1,\"a\"]"}, {"[]"}},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", {"\"ab\"", "\"abc\"", "\"\\n\xe6\x97\xa5\""},
         {"\"a\"", "\"abcd\""}},
        {"{\"type\":\"string\",\"pattern\":\"^[1-9][0-9]*$\"}", {"\"1\"", "\"905\""}, {"\"0\"", "\"\"", "\"1a\"", "\"01\""}},
        {"{\"type\":\"string\",\"pattern\":\"^(foo|ba?r)+\\\\.(?:x){2,3}$\"}", {"\"foo.xx\"", "\"brbarfoo.xxx\""},
         {"\"foo.x\"", "\"fooxx\"", "\"bor.xx\""}},
        {"{\"type\":\"string\",\"pattern\":\"ab\"}", {"\"ab\"", "\"xxabyy\""}, {"\"a\"", "\"ba\""}},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}-\\\\w+\\\\s[^a-c\\\"]$\"}", {"\"123-a_Z d\"", "\"000-x\\td\""},
         {"\"12-a d\"", "\"123-a b\""}},
        {"{\"type\":\"string\",\"pattern\":\"^a\\\"b\\\\\\\\c.$\"}", {"\"a\\\"b\\\\cz\""}, {"\"a\"b\\\\cz\""}},
        {"{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-02-28\"", "\"1999-12-31\"", "\"2024-04-30\""},
         {"\"2024-02-30\"", "\"2024-13-01\"", "\"2024-04-31\"", "\"24-01-01\""}},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", {"\"2024-01-02T03:04:05Z\"", "\"2024-01-02T23:59:59.123+05:30\""},
         {"\"2024-01-02T24:00:00Z\"", "\"2024-01-02T03:04:05\"", "\"2024-01-02 03:04:05Z\""}},
        {"{\"type\":\"string\",\"format\":\"uuid\"}", {"\"123e4567-e89b-12d3-a456-426614174000\""},
         {"\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400\""}},
        {"{\"type\":\"string\",\"format\":\"time\"}", {"\"12:00:00Z\""}, {"\"12:60:00Z\""}},
    };
    run(cs, sizeof cs / sizeof cs[0]);
}

static void test_combinators(void **state) {
    (void)state;
    static const struct scase cs[] = {
        {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}]}", {"5", "\"a\""}, {"\"ab\"", "null"}},
        {"{\"oneOf\":[{\"type\":\"string\",\"enum\":[\"all\"]},{\"type\":\"string\",\"pattern\":\"^[1-9][0-9]*$\"}],"
         "\"description\":\"x\"}",
         {"\"all\"", "\"12\""}, {"\"0\"", "\"al\""}},
        /* recursion through $defs */
        {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":"
         "\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],\"additionalProperties\":false}},"
         "\"$ref\":\"#/$defs/node\"}",
         {"{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3,\"kids\":[{\"v\":4}]}]}"},
         {"{\"v\":1,\"kids\":[{}]}", "{\"kids\":[]}"}},
        {"{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#\"},\"x\":{\"type\":\"boolean\"}}}",
         {"{}", "{\"next\":{\"next\":{\"x\":true}}}"}, {"{\"next\":1}"}},
        {"{\"definitions\":{\"a\":{\"type\":\"null\"}},\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/a\"}}",
         {"[null,null]"}, {"[1]"}},
    };
    run(cs, sizeof cs / sizeof cs[0]);
}

static void test_integer_ranges(void **state) {
    (void)state;
    static const long long ranges[][2] = {{0, 0},     {1, 9},    {0, 10},  {7, 123},  {-5, 5},   {-120, -7},
                                          {99, 1000}, {-1, 0},   {10, 19}, {300, 399}, {1, 600000}};
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
        long long lo = ranges[r][0], hi = ranges[r][1];
        char schema[160];
        snprintf(schema, sizeof schema, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}", lo, hi);
        struct tern_grammar *g = from_schema(schema);
        long long a = lo - 200, z = hi + 200;
        if (hi - lo > 5000) {
            a = lo - 50;
            z = lo + 3000; /* the start, then samples to the end */
        }
        for (long long v = a; v <= z; v++) {
            char doc[32];
            snprintf(doc, sizeof doc, "%lld", v);
            bool want = v >= lo && v <= hi;
            if (matches(g, doc) != want) fprintf(stderr, "[%lld,%lld] %lld: want %d\n", lo, hi, v, want);
            assert_int_equal(matches(g, doc), want);
        }
        for (long long v = lo; v <= hi + 10; v += (hi - lo) / 97 + 1) {
            char doc[32];
            snprintf(doc, sizeof doc, "%lld", v);
            assert_int_equal(matches(g, doc), v <= hi);
        }
        assert_false(matches(g, "01"));
        assert_false(matches(g, "-0"));
        tern_grammar_free(g);
    }
    /* exclusive bounds and open ends */
    static const struct scase cs[] = {
        {"{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":3}", {"1", "2"}, {"0", "3"}},
        {"{\"type\":\"integer\",\"minimum\":5}", {"5", "100000"}, {"4", "-5"}},
        {"{\"type\":\"integer\",\"maximum\":-5}", {"-5", "-100000"}, {"-4", "0"}},
        {"{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":3.5}", {"2", "3"}, {"1", "4"}},
    };
    run(cs, sizeof cs / sizeof cs[0]);
}

static void expect_refusal(const char *schema_json, const char *needle, const char *pointer) {
    json_t *s = json_loads(schema_json, JSON_DECODE_ANY, NULL);
    assert_non_null(s);
    struct tern_buf b = TERN_BUF_INIT;
    char ptr[256];
    enum tern_status st = tern_json_schema_to_gbnf(s, &b, ptr, sizeof ptr);
    assert_int_not_equal(st, TERN_OK);
    if (!strstr(tern_last_error(), needle) || strcmp(ptr, pointer))
        fprintf(stderr, "%s -> '%s' at '%s' (wanted '%s' at '%s')\n", schema_json, tern_last_error(), ptr, needle, pointer);
    assert_non_null(strstr(tern_last_error(), needle));
    assert_string_equal(ptr, pointer);
    tern_buf_free(&b);
    json_decref(s);
}

static void test_refusals(void **state) {
    (void)state;
    expect_refusal("{\"allOf\":[{}]}", "'allOf' is not supported", "/allOf");
    expect_refusal("{\"type\":\"object\",\"properties\":{\"a~b/c\":{\"not\":{}}}}", "'not'", "/properties/a~0b~1c/not");
    expect_refusal("{\"type\":\"array\",\"items\":{\"uniqueItems\":true}}", "uniqueItems", "/items/uniqueItems");
    expect_refusal("{\"type\":\"string\",\"format\":\"iri\"}", "format 'iri'", "/format");
    expect_refusal("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "unsupported escape", "/pattern");
    expect_refusal("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "lookarounds", "/pattern");
    expect_refusal("{\"type\":\"string\",\"pattern\":\"^a|b$\"}", "top level", "/pattern");
    expect_refusal("{\"type\":\"number\",\"minimum\":1.25,\"maximum\":1.5}", "no whole number", "");
    expect_refusal("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer", "");
    expect_refusal("{\"$ref\":\"#/$defs/missing\"}", "does not resolve", "/$ref");
    expect_refusal("{\"$ref\":\"http://example.com/s.json\"}", "does not resolve", "/$ref");
    expect_refusal("{\"type\":\"wat\"}", "unknown type", "/type");
    expect_refusal("{\"anyOf\":[{\"type\":\"integer\"},{\"minProperties\":1}]}", "minProperties", "/anyOf/1/minProperties");
    expect_refusal("{\"type\":\"string\",\"anyOf\":[{}]}", "beside 'anyOf'", "/type");
    expect_refusal("false", "matches nothing", "");
    expect_refusal("{\"type\":\"object\",\"properties\":{},\"required\":[\"a\"],\"additionalProperties\":false}",
                   "required", "/required");
    expect_refusal("{\"type\":\"array\",\"items\":[{}]}", "tuples", "/items");
    expect_refusal("{\"type\":\"string\",\"minLength\":-1}", "non-negative", "/minLength");
    expect_refusal("{\"type\":\"string\",\"minLength\":100000}", "above the supported", "");
    /* deep nesting */
    char deep[2000] = "";
    for (int i = 0; i < 80; i++) strcat(deep, "{\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 80; i++) strcat(deep, "}");
    json_t *s = json_loads(deep, 0, NULL);
    struct tern_buf b = TERN_BUF_INIT;
    char ptr[256];
    assert_int_equal(tern_json_schema_to_gbnf(s, &b, ptr, sizeof ptr), TERN_ERR_LIMIT);
    tern_buf_free(&b);
    json_decref(s);
}

/* Every tool schema of the real 15-tool qwen-code request converts and compiles. */
static void test_qwen_code_tools(void **state) {
    (void)state;
    const char *path = th_shared_path("bench/qwen-code-skeleton.json");
    if (!path) {
        skip();
        return;
    }
    json_t *d = json_load_file(path, 0, NULL);
    if (!d) {
        skip();
        return;
    }
    json_t *tools = json_object_get(d, "tools");
    assert_true(json_array_size(tools) >= 10);
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *fn = json_object_get(json_array_get(tools, i), "function");
        json_t *params = json_object_get(fn, "parameters");
        if (!params) continue;
        struct tern_buf b = TERN_BUF_INIT;
        char ptr[256];
        enum tern_status st = tern_json_schema_to_gbnf(params, &b, ptr, sizeof ptr);
        if (st) fprintf(stderr, "%s: %s\n", json_string_value(json_object_get(fn, "name")), tern_last_error());
        assert_int_equal(st, TERN_OK);
        struct tern_grammar *g = NULL;
        assert_int_equal(tern_grammar_compile(b.data, b.len, NULL, &g), TERN_OK);
        tern_grammar_free(g);
        tern_buf_free(&b);
    }
    json_decref(d);
}

/* 1,000 tools each with a `^[a-z]{1,100}$` pattern (152 KB of schemas) cost 22-70 s to
 * compile, before any limit refused them: now they compile, or are refused, within a
 * number of steps linear in the grammar's text (a count, not a time). */
static void test_many_pattern_tools(void **state) {
    (void)state;
    struct tern_schema_gbnf *c = NULL;
    assert_int_equal(tern_schema_gbnf_new(&c), TERN_OK);
    json_t *schema = json_loads("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
                                "\"pattern\":\"^[a-z]{1,100}$\"}},\"required\":[\"a\"]}",
                                0, NULL);
    assert_non_null(schema);
    struct tern_buf alts = TERN_BUF_INIT;
    for (int t = 0; t < 1000; t++) {
        char name[32], ptr[256];
        snprintf(name, sizeof name, "tool-%d", t);
        assert_int_equal(tern_schema_gbnf_add(c, name, schema, ptr, sizeof ptr), TERN_OK);
        tern_buf_printf(&alts, "%s%s", t ? " | " : "root ::= ", name);
    }
    tern_buf_puts(&alts, "\n");
    assert_int_equal(tern_schema_gbnf_raw(c, alts.data), TERN_OK);
    size_t len = 0;
    const char *txt = tern_schema_gbnf_text(c, &len);
    struct tern_grammar *g = NULL;
    enum tern_status st = tern_grammar_compile(txt, len, NULL, &g);
    if (st == TERN_OK) {
        uint64_t w = tern_grammar_work(g);
        fprintf(stderr, "%zu bytes, %zu rules, %zu elements: %llu steps\n", len, tern_grammar_n_rules(g),
                tern_grammar_n_elements(g), (unsigned long long)w);
        assert_true(w <= TERN_GRAMMAR_MAX_WORK);
        assert_true(w <= 8 * (uint64_t)(len + tern_grammar_n_elements(g)));
        assert_true(matches(g, "{\"a\":\"abc\"}"));
        assert_false(matches(g, "{\"a\":\"\"}"));
        tern_grammar_free(g);
    } else {
        fprintf(stderr, "refused: %s\n", tern_last_error());
        assert_int_equal(st, TERN_ERR_LIMIT);
    }
    tern_buf_free(&alts);
    json_decref(schema);
    tern_schema_gbnf_free(c);
}

/* Bounds on 'number' (all four keywords, inclusive and exclusive, open ends) and the
 * formats email, ipv4, ipv6, hostname, uri: each grammar accepts valid strings and
 * rejects invalid ones. Every bounded number the grammar makes lies in the range: a
 * sweep of decimal strings checks it (in range where accepted). */
static void test_number_bounds_and_formats(void **state) {
    (void)state;
    static const struct scase cs[] = {
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", {"0", "1", "0.5", "0.999"}, {"-0.5", "1.5", "2", "1e0"}},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":10}", {"1", "0.01", "9.99", "10"},
         {"0", "0.0", "0.000", "-1", "10.5", "11"}},
        {"{\"type\":\"number\",\"minimum\":-2.5,\"exclusiveMaximum\":-1}", {"-2", "-1.5", "-1.001"},
         {"-1", "-1.0", "-3", "0", "-0.5"}},
        {"{\"type\":\"number\",\"maximum\":100}", {"100", "-7", "99.5", "-1000000.25"}, {"101", "100.5"}},
        {"{\"type\":\"number\",\"minimum\":1.5}", {"2", "3.25", "1000"}, {"1", "1.4", "-2"}},
        {"{\"type\":\"number\",\"exclusiveMinimum\":-1,\"exclusiveMaximum\":1}", {"0", "-0.5", "0.5"},
         {"-1", "1", "1.0", "-1.0"}},
        {"{\"type\":\"string\",\"format\":\"ipv4\"}", {"\"1.2.3.4\"", "\"255.255.255.0\"", "\"0.0.0.0\""},
         {"\"256.1.1.1\"", "\"1.2.3\"", "\"01.2.3.4\"", "\"1.2.3.4.5\""}},
        {"{\"type\":\"string\",\"format\":\"ipv6\"}",
         {"\"2001:db8:0:0:0:0:0:1\"", "\"::1\"", "\"::\"", "\"fe80::1:2\"", "\"::ffff:1.2.3.4\"", "\"1:2:3:4:5:6:7::\""},
         {"\"1:2:3:4:5:6:7:8:9\"", "\"1::2::3\"", "\"12345::\"", "\"g::1\"", "\"1.2.3.4\""}},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", {"\"example.com\"", "\"a\"", "\"my-host.local\""},
         {"\"-a.com\"", "\"a-.com\"", "\"a..b\"", "\"a b\"", "\"\""}},
        {"{\"type\":\"string\",\"format\":\"email\"}", {"\"a.b@example.com\"", "\"x+y@mail.example.org\""},
         {"\"a@b\"", "\"@example.com\"", "\"a..b@example.com\"", "\"a@-x.com\"", "\"ab.example.com\""}},
        {"{\"type\":\"string\",\"format\":\"uri\"}",
         {"\"https://example.com\"", "\"http://a.b:8080/x/y?q=1&r=%20\"", "\"ftp://h/p;x\""},
         {"\"example.com\"", "\"http://\"", "\"http://a b\"", "\"http://x/%zz\"", "\"1http://x\""}},
    };
    run(cs, sizeof cs / sizeof cs[0]);
    /* a sweep: whatever a bounded grammar accepts is in its range */
    static const struct {
        const char *schema;
        double lo, hi;
        bool xlo, xhi;
    } rs[] = {{"{\"type\":\"number\",\"exclusiveMinimum\":-3,\"maximum\":2.5}", -3, 2.5, true, false},
              {"{\"type\":\"number\",\"minimum\":-0.5,\"exclusiveMaximum\":4}", -0.5, 4, false, true}};
    for (size_t r = 0; r < sizeof rs / sizeof rs[0]; r++) {
        struct tern_grammar *g = from_schema(rs[r].schema);
        int n_in = 0;
        for (int i = -600; i <= 600; i++) {
            char doc[32];
            for (int form = 0; form < 3; form++) {
                if (form == 0) snprintf(doc, sizeof doc, "%d", i / 100);
                else if (form == 1) snprintf(doc, sizeof doc, "%s%d.%02d", i < 0 ? "-" : "", abs(i) / 100, abs(i) % 100);
                else snprintf(doc, sizeof doc, "%s%d.0", i < 0 ? "-" : "", abs(i) / 100);
                if (!matches(g, doc)) continue;
                double v = strtod(doc, NULL);
                bool in = (rs[r].xlo ? v > rs[r].lo : v >= rs[r].lo) && (rs[r].xhi ? v < rs[r].hi : v <= rs[r].hi);
                if (!in) fail_msg("%s accepts %s", rs[r].schema, doc);
                n_in++;
            }
        }
        assert_true(n_in > 300);
        tern_grammar_free(g);
    }
    /* what cannot be expressed is still refused, with the pointer */
    expect_refusal("{\"type\":\"number\",\"minimum\":0.1,\"maximum\":0.2}", "no whole number", "");
    expect_refusal("{\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"idn-email\"}}}", "format 'idn-email'",
                   "/properties/a/format");
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_types),        cmocka_unit_test(test_objects),   cmocka_unit_test(test_arrays_strings),
        cmocka_unit_test(test_combinators),  cmocka_unit_test(test_integer_ranges), cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_qwen_code_tools), cmocka_unit_test(test_many_pattern_tools),
        cmocka_unit_test(test_number_bounds_and_formats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
