/* Conformance with llama.cpp: every vocabulary of the shared kit's
 * conformance/tokenizer/ must tokenize every test string exactly as llama.cpp does
 * (add_special = false, parse_special = false), and decode back to the input.
 * Each vocabulary is one test; it prints "conformance NAME: passed/total". */
#include "harness.h"

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEP "\n__ggml_vocab_test__\n"

static int check_vocab(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "conformance/tokenizer/ggml-vocab-%s.gguf", name);
    th_require_shared(rel);
    char path[4096], inp_path[4200], out_path[4200];
    snprintf(path, sizeof path, "%s", th_shared_path(rel));
    snprintf(inp_path, sizeof inp_path, "%s.inp", path);
    snprintf(out_path, sizeof out_path, "%s.out", path);

    struct tern_tokenizer *t = NULL;
    enum tern_status st = tern_tokenizer_load_file(path, &t);
    if (st) fail_msg("loading %s: %s", path, tern_last_error());
    size_t inp_len, out_len;
    char *inp = th_read_file(inp_path, &inp_len);
    char *out = th_read_file(out_path, &out_len);
    assert_non_null(inp);
    assert_non_null(out);

    int total = 0, passed = 0, round_trip_fail = 0;
    char *p = inp, *line = out;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    struct tern_buf dec = TERN_BUF_INIT;
    for (;;) {
        char *sep = strstr(p, SEP);
        if (!sep) break;
        size_t len = (size_t)(sep - p);
        char *eol = strchr(line, '\n');
        assert_non_null(eol);
        *eol = 0;
        /* expected: " id id id" */
        int32_t want[4096];
        size_t n_want = 0;
        for (char *q = line; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            assert_true(n_want < 4096);
            want[n_want++] = (int32_t)v;
            q = end;
        }
        n = 0;
        st = tern_tokenize(t, p, len, 0, &ids, &n, &cap);
        if (st) fail_msg("%s case %d: %s", name, total, tern_last_error());
        bool ok = n == n_want && (n == 0 || !memcmp(ids, want, n * sizeof *ids));
        if (ok) {
            passed++;
        } else {
            printf("MISMATCH %s case %d: '%.*s'\n  want:", name, total, (int)len, p);
            for (size_t i = 0; i < n_want; i++) printf(" %d", want[i]);
            printf("\n  got: ");
            for (size_t i = 0; i < n; i++) printf(" %d", ids[i]);
            printf("\n");
        }
        tern_buf_clear(&dec);
        st = tern_detokenize(t, ids, n, 0, &dec);
        if (st) fail_msg("%s case %d: detokenize: %s", name, total, tern_last_error());
        if (dec.len != len || (len && memcmp(dec.data, p, len))) {
            round_trip_fail++;
            printf("ROUND TRIP %s case %d: '%.*s' -> '%.*s'\n", name, total, (int)len, p, (int)dec.len,
                   dec.data ? dec.data : "");
        }
        total++;
        p = sep + strlen(SEP);
        line = eol + 1;
    }
    printf("conformance %s: %d/%d (round trip: %d/%d)\n", name, passed, total, total - round_trip_fail, total);
    free(ids);
    tern_buf_free(&dec);
    free(inp);
    free(out);
    tern_tokenizer_free(t);
    assert_true(total > 0);
    assert_int_equal(passed, total);
    assert_int_equal(round_trip_fail, 0);
    return 0;
}

#define VOCAB_TEST(fn, name)                                                                                     \
    static void fn(void **state) {                                                                               \
        (void)state;                                                                                             \
        check_vocab(name);                                                                                       \
    }

VOCAB_TEST(test_qwen_mini, "qwen-mini")
VOCAB_TEST(test_qwen2, "qwen2-from-qwen3tok")
VOCAB_TEST(test_llama_bpe, "llama-bpe-from-llama3tok")
VOCAB_TEST(test_gpt2, "gpt-2")
VOCAB_TEST(test_deepseek_llm, "deepseek-llm")
VOCAB_TEST(test_falcon, "falcon")
VOCAB_TEST(test_starcoder, "starcoder")
VOCAB_TEST(test_refact, "refact")
VOCAB_TEST(test_llama_spm, "llama-spm")

int main(void) {
    th_require_shared("conformance/tokenizer");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen_mini),    cmocka_unit_test(test_qwen2),   cmocka_unit_test(test_llama_bpe),
        cmocka_unit_test(test_gpt2),         cmocka_unit_test(test_deepseek_llm), cmocka_unit_test(test_falcon),
        cmocka_unit_test(test_starcoder),    cmocka_unit_test(test_refact),  cmocka_unit_test(test_llama_spm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
