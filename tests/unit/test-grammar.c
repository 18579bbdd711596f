/* The GBNF engine: accept/reject strings for each feature (the semantics of llama.cpp's
 * grammar tests: the whole string must match root), compile errors with positions,
 * partial UTF-8 across tokens, and token masks checked against brute force. */
#include "harness.h"

#include "grammar/grammar.h"
#include "tern.h"
#include "util/buf.h"
#include "util/rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct tern_grammar *compile(const char *src) {
    struct tern_grammar *g = NULL;
    enum tern_status st = tern_grammar_compile(src, strlen(src), NULL, &g);
    if (st) fprintf(stderr, "compile failed: %s\n%s\n", tern_last_error(), src);
    assert_int_equal(st, TERN_OK);
    return g;
}

static bool matches(const struct tern_grammar *g, const char *s) {
    struct tern_gmatch *m = NULL;
    assert_int_equal(tern_gmatch_new(g, NULL, &m), TERN_OK);
    bool ok = tern_gmatch_matches(m, s, strlen(s));
    /* the same through accept_bytes, one byte at a time */
    bool ok2 = true;
    for (size_t i = 0; s[i] && ok2; i++) ok2 = tern_gmatch_accept_bytes(m, s + i, 1);
    ok2 = ok2 && tern_gmatch_can_end(m);
    tern_gmatch_free(m);
    assert_int_equal(ok, ok2);
    return ok;
}

struct gcase {
    const char *grammar;
    const char *accept[8];
    const char *reject[8];
};

static void run_cases(const struct gcase *cs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        struct tern_grammar *g = compile(cs[i].grammar);
        for (size_t k = 0; k < 8 && cs[i].accept[k]; k++) {
            if (!matches(g, cs[i].accept[k])) fprintf(stderr, "should accept '%s':\n%s\n", cs[i].accept[k], cs[i].grammar);
            assert_true(matches(g, cs[i].accept[k]));
        }
        for (size_t k = 0; k < 8 && cs[i].reject[k]; k++) {
            if (matches(g, cs[i].reject[k])) fprintf(stderr, "should reject '%s':\n%s\n", cs[i].reject[k], cs[i].grammar);
            assert_false(matches(g, cs[i].reject[k]));
        }
        tern_grammar_free(g);
    }
}

static void test_features(void **state) {
    (void)state;
    static const struct gcase cs[] = {
        {"root ::= \"abc\"", {"abc"}, {"", "ab", "abcd", "abd"}},
        {"root ::= \"a\" | \"bc\" | \"\"", {"a", "bc", ""}, {"b", "abc"}},
        {"root ::= [a-z]+", {"a", "xyz"}, {"", "A", "a1"}},
        {"root ::= [^x\\n]*", {"", "abc", "yy"}, {"x", "ax", "a\n"}},
        {"root ::= [a-cx-z0-9_]*", {"ab9_z"}, {"d", "w"}},
        {"root ::= (\"a\" | \"bc\")* \"!\"", {"!", "abca!", "bcbc!"}, {"b!", "abc", "a"}},
        {"root ::= \"a\"? \"b\"", {"b", "ab"}, {"aab", "a", ""}},
        {"root ::= \"ab\"+", {"ab", "abab"}, {"", "a", "aba"}},
        {"root ::= \"a\"{3}", {"aaa"}, {"aa", "aaaa"}},
        {"root ::= \"a\"{2,4}", {"aa", "aaa", "aaaa"}, {"a", "aaaaa"}},
        {"root ::= \"a\"{2,}", {"aa", "aaaaaaa"}, {"a", ""}},
        {"root ::= \"a\"{,2} \"b\"", {"b", "ab", "aab"}, {"aaab"}},
        {"root ::= \"a\"{0} \"b\"", {"b"}, {"ab"}},
        {"root ::= ([0-9] [a-z]){1,2}", {"1a", "1a2b"}, {"1", "1a2", "1a2b3c"}},
        {"root ::= \"\\x41\\u00e9\\n\\t\\\"\\\\\"", {"A\xc3\xa9\n\t\"\\"}, {"A"}},
        {"root ::= [\\x00-\\x1f]", {"\x01", "\x1f"}, {" "}},
        {"root ::= .{2}", {"ab", "\xc3\xa9\xe6\x97\xa5", "\xf0\x9f\x98\x80!"}, {"a", "abc"}},
        {"root ::= [\xce\xb1-\xcf\x89]+", {"\xce\xb1\xce\xb2\xcf\x89"}, {"a", "\xce\x91"}},
        {"root ::= \"\xe6\x97\xa5\xe6\x9c\xac\"", {"\xe6\x97\xa5\xe6\x9c\xac"}, {"\xe6\x97\xa5", "\xe6\x97"}},
        {"root ::= [^a]", {"\xe6\x97\xa5", "b", "\xed\x9f\xbf"}, {"a", "\xe6\x97", "\xff", "\xc0\xaf", "\xed\xa6\x80"}},
        /* recursion */
        {"root ::= \"(\" root \")\" | \"\"", {"", "()", "(())"}, {"(", "(()", "())"}},
        {"root ::= item (\",\" item)*\nitem ::= [0-9]+ | \"[\" root \"]\"", {"1", "1,22", "[1,[2]],3"}, {"", "1,", "[1"}},
        /* comments, newlines inside groups and after | and ::= */
        {"# a comment\nroot ::=\n  ( \"a\" # inline\n    \"b\" )\n  | \"c\"\n\nother ::= \"x\"", {"ab", "c"}, {"a", "x"}},
        {"root ::= x y\nx ::= \"x\"\ny ::= \"y\" | x", {"xy", "xx"}, {"yy", "x"}},
        /* names with digits, dashes and underscores */
        {"root ::= my-rule_2\nmy-rule_2 ::= \"q\"", {"q"}, {""}},
        /* repetitions of empty-able items: tail calls only, accepted as llama.cpp does */
        {"root ::= ( [x]* )*", {"", "x", "xx"}, {"y", "yy"}},
        {"root ::= (\"a\"?)*", {"", "a", "aaa"}, {"b"}},
        {"root ::= root | \"a\"", {"a"}, {"", "aa"}},
        {"root ::= cons+ vowel* cons? (vowel cons)*\nvowel ::= [aeiouy]\ncons ::= [bcdfghjklmnpqrstvwxyz]",
         {"yes", "no", "noyes", "crwth", "four", "bryyyy"}, {"yess", "yesno", "forty", "catyyy"}},
        {"root ::= (\"0x\" [A-F0-9]{2} \" \"?){3,5}", {"0xFF 0x12 0xAB", "0xFF 0x12 0xAB 0x00 0x00"},
         {"", "0xFF", "0xFF 0x12", "0xFF 0x12 0xAB 0x00 0x00 0x00"}},
        {"root ::= ... \"abc\" ...", {"abcabcabc", "aaaabcccc", "\xf0\x9f\x94\xb5\xf0\x9f\x9f\xa0\xe2\x9c\x85" "abc\xe2\x9d\x8c\xf0\x9f\x9f\xa0\xf0\x9f\x94\xb5"},
         {"aaabcccc", "aaaaabcccc", "aaaabccc", "aaaabccccc"}},
        /* nullable rules in sequences */
        {"root ::= a b c\na ::= \"a\"?\nb ::= \"b\"*\nc ::= \"c\" | \"\"", {"", "a", "bbb", "ac", "abbc"}, {"ca", "aa"}},
    };
    run_cases(cs, sizeof cs / sizeof cs[0]);
}

static const char *json_gbnf =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static void test_json(void **state) {
    (void)state;
    struct gcase c = {json_gbnf,
                      {"{}", "{\"a\": [1, 2.5e3, true, null, \"x\\n\\u00e9\"]}", "{\"k\":{\"n\":{}}}",
                       "{\"\xe6\x97\xa5\": -0.5}"},
                      {"", "[]", "{\"a\" 1}", "{\"a\": 01x}", "{\"a\": \"\x01\"}", "{\"a\": tru}", "{,}"}};
    run_cases(&c, 1);
}

/* Nested repetitions of empty-able items multiply the start state's paths: refused
 * with a limit, in bounded time. */
static void test_expansion_limit(void **state) {
    (void)state;
    const char *src = "root ::= (((((([^x]*){0,99}){0,99}){0,99}){0,99}){0,99}){0,99}";
    struct tern_grammar *g = compile(src);
    struct tern_gmatch *m = NULL;
    assert_int_equal(tern_gmatch_new(g, NULL, &m), TERN_ERR_LIMIT);
    assert_null(m);
    assert_non_null(strstr(tern_last_error(), "configurations"));
    tern_grammar_free(g);
}

static void expect_error(const char *src, const char *needle) {
    struct tern_grammar *g = NULL;
    enum tern_status st = tern_grammar_compile(src, strlen(src), NULL, &g);
    assert_int_not_equal(st, TERN_OK);
    assert_null(g);
    if (!strstr(tern_last_error(), needle)) fprintf(stderr, "'%s' -> '%s' (wanted '%s')\n", src, tern_last_error(), needle);
    assert_non_null(strstr(tern_last_error(), needle));
}

static void test_errors(void **state) {
    (void)state;
    expect_error("root ::= foo", "rule 'foo' is used but never defined");
    expect_error("start ::= \"a\"", "there is no rule 'root'");
    expect_error("root ::= root \"a\" | \"a\"", "left-recursive");
    expect_error("root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"b\"", "left-recursive");
    expect_error("root ::= \"a\" root", "can never finish");
    expect_error("root ::= a | \"b\"\na ::= \"x\" a", "rule 'a' can never finish");
    expect_error("root ::= (\"a\"? \"b\"?)* \"c\" | x\nx ::= (\"d\"?)+ x \"e\" | \"f\"", "left-recursive");
    expect_error("root ::= asdf\nasdf ::= \"a\" | foo \"b\"\nfoo ::= \"c\" | empty asdf \"d\" | \"e\"\n"
                 "empty ::= \"blah\" | ", "left-recursive");
    expect_error("root ::= \"abc", "unterminated literal");
    expect_error("root ::= [abc", "unterminated character class");
    expect_error("root ::= \"\\q\"", "unknown escape");
    expect_error("root ::= [z-a]", "reversed");
    expect_error("root ::= []", "empty character class");
    expect_error("root ::= \"a\"{5,2}", "maximum is below the minimum");
    expect_error("root ::= \"a\"{99999}", "limit");
    expect_error("root ::= \"a\"\nroot ::= \"b\"", "defined twice");
    expect_error("root ::= \"a\" )", "')' without a matching '('");
    expect_error("root ::= ( \"a\"", "'(' without a matching ')'");
    expect_error("root ::= * \"a\"", "nothing before it");
    expect_error("root ::= \"a\"\n\nx \"b\"", "line 3, column 3: expected '::='");
    expect_error("root ::= <[1234]>", "token references");
    expect_error("root ::= \"\\x4\"", "hexadecimal");
    expect_error("root ::= \"a\" ::= \"b\"", "line 1");
    /* the element limit: nested bounded repetitions multiply */
    char big[400];
    snprintf(big, sizeof big, "root ::= \"%0200d\"{0,10000}", 0);
    expect_error(big, "more than");
}

/* ---- masks ---------------------------------------------------------------------------- */

struct vocab {
    char **p;
    uint32_t *len;
    bool *eog;
    uint32_t n;
};

static void vocab_free(struct vocab *v) {
    for (uint32_t i = 0; i < v->n; i++) free(v->p[i]);
    free(v->p);
    free(v->len);
    free(v->eog);
}

static void vocab_add(struct vocab *v, const char *s, size_t n, bool eog) {
    v->p = realloc(v->p, (v->n + 1) * sizeof *v->p);
    v->len = realloc(v->len, (v->n + 1) * sizeof *v->len);
    v->eog = realloc(v->eog, (v->n + 1) * sizeof *v->eog);
    v->p[v->n] = malloc(n + 1);
    memcpy(v->p[v->n], s, n);
    v->len[v->n] = (uint32_t)n;
    v->eog[v->n] = eog;
    v->n++;
}

static bool bit(const uint32_t *mask, int32_t i) { return (mask[i / 32] >> (i % 32)) & 1; }

/* Compares the mask after history with a brute-force check of every token. */
static void check_mask(const struct tern_grammar *g, const struct tern_gvocab *gv, const struct vocab *v,
                       const int32_t *hist, size_t n_hist, struct tern_gmatch *m) {
    uint32_t *mask = calloc((v->n + 31) / 32, sizeof *mask);
    enum tern_status st;
    size_t cnt = tern_gmatch_mask(m, mask, &st);
    assert_int_equal(st, TERN_OK);
    size_t want = 0;
    for (uint32_t t = 0; t < v->n; t++) {
        struct tern_gmatch *b = NULL;
        assert_int_equal(tern_gmatch_new(g, gv, &b), TERN_OK);
        for (size_t k = 0; k < n_hist; k++) assert_true(tern_gmatch_accept_token(b, hist[k]));
        bool ok = tern_gmatch_accept_token(b, (int32_t)t);
        tern_gmatch_free(b);
        if (ok != bit(mask, (int32_t)t))
            fprintf(stderr, "token %u '%.*s': brute force %d, mask %d\n", t, (int)v->len[t], v->p[t], ok, bit(mask, (int32_t)t));
        assert_int_equal(ok, bit(mask, (int32_t)t));
        want += ok;
    }
    assert_int_equal(cnt, want);
    /* the cached mask is the same */
    uint32_t *again = calloc((v->n + 31) / 32, sizeof *again);
    assert_int_equal(tern_gmatch_mask(m, again, &st), cnt);
    assert_memory_equal(mask, again, (v->n + 31) / 32 * sizeof *mask);
    free(again);
    free(mask);
}

static void test_mask_basic(void **state) {
    (void)state;
    struct vocab v = {0};
    const char *toks[] = {"a", "b", "ab", "abc", "\"", "{", "}", "x", "\xe6", "\x97\xa5", "\xe6\x97", "\xa5",
                          "\xe6\x97\xa5", "\xff", " ", "a\"", "", "c"};
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) vocab_add(&v, toks[i], strlen(toks[i]), false);
    vocab_add(&v, "</s>", 4, true);
    struct tern_gvocab *gv = NULL;
    assert_int_equal(tern_gvocab_new(v.n, (const char *const *)v.p, v.len, v.eog, NULL, &gv), TERN_OK);
    struct tern_grammar *g = compile("root ::= \"{\" [ab\xe6\x97\xa5]* \"}\"");
    struct tern_gmatch *m = NULL;
    assert_int_equal(tern_gmatch_new(g, gv, &m), TERN_OK);
    uint32_t mask[1];
    enum tern_status st;
    assert_int_equal(tern_gmatch_mask(m, mask, &st), 1);
    assert_true(bit(mask, 5));
    check_mask(g, gv, &v, NULL, 0, m);
    int32_t hist[8];
    size_t nh = 0;
    hist[nh++] = 5; /* { */
    assert_true(tern_gmatch_accept_token(m, 5));
    check_mask(g, gv, &v, hist, nh, m);
    assert_true(bit(mask, 0) || true);
    /* a code point split across tokens: \xe6 then \x97 + \xa5 */
    hist[nh++] = 8;
    assert_true(tern_gmatch_accept_token(m, 8));
    assert_false(tern_gmatch_can_end(m));
    check_mask(g, gv, &v, hist, nh, m);
    hist[nh++] = 9;
    assert_true(tern_gmatch_accept_token(m, 9));
    check_mask(g, gv, &v, hist, nh, m);
    assert_false(tern_gmatch_accept_token(m, 18)); /* eog before the end */
    hist[nh++] = 6;
    assert_true(tern_gmatch_accept_token(m, 6));
    assert_true(tern_gmatch_can_end(m));
    assert_true(tern_gmatch_done(m));
    assert_int_equal(tern_gmatch_mask(m, mask, &st), 1); /* only eog */
    assert_true(bit(mask, 18));
    assert_true(tern_gmatch_accept_token(m, 18));
    tern_gmatch_free(m);
    tern_grammar_free(g);
    tern_gvocab_free(gv);
    vocab_free(&v);
}

/* Special tokens are allowed where the grammar spells them literally, not through a
 * class; their bytes (as normal tokens) stay allowed everywhere they match. */
static void test_mask_special(void **state) {
    (void)state;
    const char *toks[] = {"<tc>", "<", "tc", ">", "a", "\"", "</s>"};
    const bool special[] = {true, false, false, false, false, false, false};
    const bool eog[] = {false, false, false, false, false, false, true};
    uint32_t lens[7];
    for (int i = 0; i < 7; i++) lens[i] = (uint32_t)strlen(toks[i]);
    struct tern_gvocab *gv = NULL;
    assert_int_equal(tern_gvocab_new(7, toks, lens, eog, special, &gv), TERN_OK);
    struct tern_grammar *g = compile("root ::= \"<tc>\" \"\\\"\" [^\"]* \"\\\"\"");
    struct tern_gmatch *m = NULL;
    assert_int_equal(tern_gmatch_new(g, gv, &m), TERN_OK);
    uint32_t mask[1];
    enum tern_status st;
    assert_int_equal(tern_gmatch_mask(m, mask, &st), 2); /* <tc> and < */
    assert_true(bit(mask, 0) && bit(mask, 1));
    assert_true(tern_gmatch_accept_token(m, 0));
    assert_true(tern_gmatch_accept_token(m, 5));
    tern_gmatch_mask(m, mask, &st);
    assert_false(bit(mask, 0)); /* inside [^"]: not the special token */
    assert_true(bit(mask, 1) && bit(mask, 2) && bit(mask, 3) && bit(mask, 4) && bit(mask, 5));
    assert_false(bit(mask, 6));
    tern_gmatch_free(m);
    tern_grammar_free(g);
    tern_gvocab_free(gv);
}

/* Random vocabularies over a small alphabet (with multi-byte code points split at
 * random), random walks through the JSON grammar: every mask equals brute force. */
static void test_mask_random(void **state) {
    (void)state;
    struct tern_rng rng;
    tern_rng_seed(&rng, 42);
    const char *atoms[] = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "a", "b", "1", "0", "-", ".", "e",
                           "true", "null", "\\", "n", "u", "\xc3\xa9", "\xe6\x97\xa5", "\x01",
                           "\xed\x9f\xbf", "\xed\xa6" /* a surrogate's prefix: never completes */, "\xf0\x9f\x98\x80"};
    const size_t n_atoms = sizeof atoms / sizeof atoms[0];
    struct vocab v = {0};
    for (size_t i = 0; i < n_atoms; i++) vocab_add(&v, atoms[i], strlen(atoms[i]), false);
    for (int i = 0; i < 300; i++) {
        char buf[32];
        size_t n = 0;
        int parts = 1 + (int)(tern_rng_next(&rng) % 4);
        for (int k = 0; k < parts; k++) {
            const char *a = atoms[tern_rng_next(&rng) % n_atoms];
            size_t l = strlen(a);
            if (n + l < sizeof buf) {
                memcpy(buf + n, a, l);
                n += l;
            }
        }
        /* sometimes cut inside a code point */
        if (n > 1 && tern_rng_next(&rng) % 4 == 0) n -= 1 + tern_rng_next(&rng) % (n - 1);
        size_t off = (n > 1 && tern_rng_next(&rng) % 5 == 0) ? 1 : 0;
        vocab_add(&v, buf + off, n - off, false);
    }
    vocab_add(&v, "<eos>", 5, true);
    struct tern_gvocab *gv = NULL;
    assert_int_equal(tern_gvocab_new(v.n, (const char *const *)v.p, v.len, v.eog, NULL, &gv), TERN_OK);
    struct tern_grammar *g = compile(json_gbnf);
    uint32_t *mask = calloc((v.n + 31) / 32, sizeof *mask);
    uint32_t *full = calloc((v.n + 31) / 32, sizeof *full);
    uint64_t cut_used = 0;
    for (int walk = 0; walk < 6; walk++) {
        struct tern_gmatch *m = NULL, *plain = NULL;
        assert_int_equal(tern_gmatch_new(g, gv, &m), TERN_OK);
        assert_int_equal(tern_gmatch_new(g, gv, &plain), TERN_OK);
        tern_gmatch_set_cut(plain, false);
        int32_t hist[40];
        size_t nh = 0;
        while (nh < 40) {
            check_mask(g, gv, &v, hist, nh, m);
            /* the context-independent reuse gives the full walk's mask */
            enum tern_status st0;
            size_t c0 = tern_gmatch_mask(m, mask, &st0), c1 = tern_gmatch_mask(plain, full, &st0);
            assert_int_equal(c0, c1);
            assert_memory_equal(mask, full, (v.n + 31) / 32 * sizeof *mask);
            enum tern_status st;
            size_t cnt = tern_gmatch_mask(m, mask, &st);
            assert_true(cnt > 0);
            /* pick a random allowed token (not eog, to keep walking) */
            size_t pick = tern_rng_next(&rng) % cnt, seen = 0;
            int32_t t = -1;
            for (uint32_t i = 0; i < v.n && t < 0; i++)
                if (bit(mask, (int32_t)i) && seen++ == pick) t = (int32_t)i;
            if (v.eog[t]) break;
            assert_true(tern_gmatch_accept_token(m, t));
            assert_true(tern_gmatch_accept_token(plain, t));
            hist[nh++] = t;
        }
        struct tern_gmatch_stats gs;
        tern_gmatch_get_stats(m, &gs);
        cut_used += gs.ci_hits + gs.ci_roots;
        tern_gmatch_free(m);
        tern_gmatch_free(plain);
    }
    assert_true(cut_used > 0); /* the context-independent reuse was exercised */
    free(full);
    free(mask);
    tern_grammar_free(g);
    tern_gvocab_free(gv);
    vocab_free(&v);
}

/* Deep nesting: stacks are interned and bounded; a right-recursive repetition runs in
 * constant stack. */
static void test_stack(void **state) {
    (void)state;
    struct tern_grammar *g = compile("root ::= \"(\" root \")\" | [a]*");
    struct tern_gmatch *m = NULL;
    assert_int_equal(tern_gmatch_new(g, NULL, &m), TERN_OK);
    for (int i = 0; i < 100; i++) assert_true(tern_gmatch_accept_bytes(m, "(", 1));
    struct tern_gmatch_stats s1, s2;
    tern_gmatch_get_stats(m, &s1);
    for (int i = 0; i < 1000; i++) assert_true(tern_gmatch_accept_bytes(m, "a", 1));
    tern_gmatch_get_stats(m, &s2);
    assert_int_equal(s1.n_stack_nodes, s2.n_stack_nodes); /* the loop pushed nothing */
    for (int i = 0; i < 100; i++) assert_true(tern_gmatch_accept_bytes(m, ")", 1));
    assert_true(tern_gmatch_can_end(m));
    assert_false(tern_gmatch_accept_bytes(m, ")", 1));
    tern_gmatch_reset(m);
    assert_true(tern_gmatch_can_end(m));
    tern_gmatch_free(m);
    tern_grammar_free(g);
}

/* Compiling was quadratic in the rules (every lookup scanned every rule; the checks'
 * fixpoint took a pass per link of a chain): a 320 KB grammar cost 35 s. Now the work
 * is counted and linear: a chain of ~14,000 rules, defined in the order that made the
 * fixpoint slowest, compiles within a few steps per source byte (a count, not a time). */
static void test_compile_work_linear(void **state) {
    (void)state;
    struct tern_buf b = TERN_BUF_INIT;
    tern_buf_puts(&b, "root ::= r0\n");
    uint32_t n = 0;
    while (b.len < 320u * 1024) {
        tern_buf_printf(&b, "r%u ::= r%u \"x\" | \"y\"%s\n", n, n + 1, n % 7 ? "" : " [a-z]");
        n++;
    }
    tern_buf_printf(&b, "r%u ::= \"z\"\n", n);
    struct tern_grammar *g = NULL;
    enum tern_status st = tern_grammar_compile(b.data, b.len, NULL, &g);
    if (st) fail_msg("%s", tern_last_error());
    assert_int_equal(tern_grammar_n_rules(g), n + 2);
    uint64_t w = tern_grammar_work(g);
    fprintf(stderr, "%zu bytes, %u rules: %llu steps\n", b.len, n + 2, (unsigned long long)w);
    assert_true(w > 0);
    assert_true(w <= 4 * (uint64_t)b.len);
    tern_grammar_free(g);
    /* a chain where every rule is productive only through the next: all found */
    tern_buf_clear(&b);
    tern_buf_puts(&b, "root ::= c0\n");
    for (uint32_t k = 0; k < 5000; k++) tern_buf_printf(&b, "c%u ::= \"a\" c%u\n", k, k + 1);
    tern_buf_puts(&b, "c5000 ::= \"b\"\n");
    assert_int_equal(tern_grammar_compile(b.data, b.len, NULL, &g), TERN_OK);
    assert_true(tern_grammar_work(g) <= 4 * (uint64_t)b.len);
    tern_grammar_free(g);
    /* and one that never finishes is still refused */
    tern_buf_clear(&b);
    tern_buf_puts(&b, "root ::= c0\n");
    for (uint32_t k = 0; k < 5000; k++) tern_buf_printf(&b, "c%u ::= \"a\" c%u\n", k, k + 1);
    tern_buf_puts(&b, "c5000 ::= \"b\" c0\n");
    assert_int_equal(tern_grammar_compile(b.data, b.len, NULL, &g), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "can never finish"));
    tern_buf_free(&b);
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_features), cmocka_unit_test(test_json),   cmocka_unit_test(test_errors), cmocka_unit_test(test_expansion_limit),
        cmocka_unit_test(test_mask_basic), cmocka_unit_test(test_mask_special), cmocka_unit_test(test_mask_random), cmocka_unit_test(test_stack),
        cmocka_unit_test(test_compile_work_linear),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
