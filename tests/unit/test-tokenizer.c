/* tokenizer: a small byte-level BPE vocabulary built here with the GGUF writer (merge
 * order, special tokens, attributes, bad metadata), and the shared kit's vocabularies
 * (qwen-mini special tokens and end-of-generation ids, BOS/EOS, the streaming
 * detokenizer on split UTF-8, invalid UTF-8, linear work on long inputs, and the ASCII
 * pre-tokenizer scanners against PCRE2 on random text). */
#include "harness.h"

#include "gguf/gguf.h"
#include "tokenizer/tok-internal.h"
#include "tokenizer/tokenizer.h"
#include "util/buf.h"
#include "util/mem.h"
#include "util/utf8.h"

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

/* ---- helpers ------------------------------------------------------------------------- */

struct ids {
    int32_t *v;
    size_t n, cap;
};

static void tok(const struct tern_tokenizer *t, const char *s, size_t len, int flags, struct ids *out) {
    out->n = 0;
    CHECK_OK(tern_tokenize(t, s, len, flags, &out->v, &out->n, &out->cap));
}

static void assert_ids(const struct ids *got, const int32_t *want, size_t n) {
    bool same = got->n == n && (n == 0 || !memcmp(got->v, want, n * sizeof *want));
    if (!same) {
        char msg[1024];
        size_t o = (size_t)snprintf(msg, sizeof msg, "want");
        for (size_t i = 0; i < n && o < 900; i++) o += (size_t)snprintf(msg + o, sizeof msg - o, " %d", want[i]);
        o += (size_t)snprintf(msg + o, sizeof msg - o, ", got");
        for (size_t i = 0; i < got->n && o < 1000; i++)
            o += (size_t)snprintf(msg + o, sizeof msg - o, " %d", got->v[i]);
        fail_msg("%s", msg);
    }
}

static void assert_round_trip(const struct tern_tokenizer *t, const char *s, size_t len, int flags) {
    struct ids ids = {0};
    tok(t, s, len, flags, &ids);
    struct tern_buf b = TERN_BUF_INIT;
    CHECK_OK(tern_detokenize(t, ids.v, ids.n, flags, &b));
    if (b.len != len || (len && memcmp(b.data, s, len)))
        fail_msg("round trip of %zu bytes gave %zu bytes", len, b.len);
    tern_buf_free(&b);
    free(ids.v);
}

/* NULL (the test then skips) when the shared kit is absent. */
static struct tern_tokenizer *shared_vocab(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "conformance/tokenizer/ggml-vocab-%s.gguf", name);
    if (!th_have_shared(rel)) { /* fails instead under TERN_REQUIRE_SHARED=1 */
        printf("SKIP: %s is absent (the shared data kit is needed)\n", rel);
        return NULL;
    }
    const char *path = th_shared_path(rel);
    struct tern_tokenizer *t;
    CHECK_OK(tern_tokenizer_load_file(path, &t));
    return t;
}

#define SHARED(var, name)                                                                 \
    struct tern_tokenizer *var = shared_vocab(name);                                      \
    if (!var) skip()

/* ---- a tiny byte-level BPE vocabulary made with the writer --------------------------- */

enum tiny_flaw {
    TINY_OK,
    TINY_NO_TOKENS,
    TINY_BAD_MODEL,
    TINY_BAD_PRE,
    TINY_DUPLICATE,
    TINY_SHORT_TYPES,
    TINY_NO_MERGES,
    TINY_ADD_BOS_NO_BOS,
    TINY_ADD_EOS,
    TINY_TOKENS_NOT_STRINGS,
    TINY_EMPTY_TOKEN,
};

/* ids: 0..255 the bytes (GPT-2 characters, in byte order), then the merges' results,
 * then the specials. */
static const char *const tiny_merges[] = {"h e", "l l", "he ll", "hell o", "\xc4\xa0 w", "\xc4\xa0w o", "r l",
                                          "\xc4\xa0wo rl", "\xc4\xa0worl d", "a a", "aa aa", "a b", "b c"};
static const char *const tiny_merged[] = {"he", "ll", "hell", "hello", "\xc4\xa0w", "\xc4\xa0wo", "rl",
                                          "\xc4\xa0worl", "\xc4\xa0world", "aa", "aaaa", "ab", "bc"};
#define N_MERGES 13
static const char *const tiny_special[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "<|im"};
static const int32_t tiny_special_type[] = {3, 3, 3, 4, 3};
#define N_SPECIAL 5
#define TINY_HELLO 259
#define TINY_WORLD 264
#define TINY_EOT 269
#define TINY_IM_START 270
#define TINY_IM_END 271
#define TINY_THINK 272
#define TINY_IM 273

static void tiny_bytes(enum tiny_flaw flaw, void **data, size_t *size) {
    struct gguf_writer *w;
    CHECK_OK(gguf_writer_new(&w));
    size_t n = 256 + N_MERGES + N_SPECIAL;
    struct gguf_str *strs = calloc(n, sizeof *strs);
    int32_t *types = calloc(n, sizeof *types);
    char (*bytes)[4] = calloc(256, 4);
    assert_non_null(strs);
    for (int b = 0; b < 256; b++) {
        size_t k = tern_utf8_encode(bytelevel_cp((uint8_t)b), bytes[b]);
        strs[b] = (struct gguf_str){bytes[b], k};
        types[b] = 1;
    }
    for (int i = 0; i < N_MERGES; i++) {
        strs[256 + i] = (struct gguf_str){tiny_merged[i], strlen(tiny_merged[i])};
        types[256 + i] = 1;
    }
    for (int i = 0; i < N_SPECIAL; i++) {
        strs[256 + N_MERGES + i] = (struct gguf_str){tiny_special[i], strlen(tiny_special[i])};
        types[256 + N_MERGES + i] = tiny_special_type[i];
    }
    if (flaw == TINY_DUPLICATE) strs[300 - 30] = strs[259];
    if (flaw == TINY_EMPTY_TOKEN) strs[5] = (struct gguf_str){"", 0};
    CHECK_OK(gguf_writer_set_str(w, "general.architecture", "qwen2"));
    CHECK_OK(gguf_writer_set_str(w, "tokenizer.ggml.model", flaw == TINY_BAD_MODEL ? "wordpiece-x" : "gpt2"));
    /* glm4's pre-tokenizer is llama3's, for models without a BOS token. */
    CHECK_OK(gguf_writer_set_str(w, "tokenizer.ggml.pre",
                                 flaw == TINY_BAD_PRE ? "no-such-pre" : flaw == TINY_ADD_BOS_NO_BOS ? "glm4" : "qwen2"));
    if (flaw == TINY_TOKENS_NOT_STRINGS)
        CHECK_OK(gguf_writer_set_arr(w, "tokenizer.ggml.tokens", GGUF_TYPE_INT32, types, n));
    else if (flaw != TINY_NO_TOKENS)
        CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, n));
    CHECK_OK(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types,
                                 flaw == TINY_SHORT_TYPES ? n - 1 : n));
    struct gguf_str merges[N_MERGES];
    for (int i = 0; i < N_MERGES; i++) merges[i] = (struct gguf_str){tiny_merges[i], strlen(tiny_merges[i])};
    if (flaw != TINY_NO_MERGES) CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, N_MERGES));
    CHECK_OK(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", TINY_IM_END));
    if (flaw == TINY_ADD_BOS_NO_BOS) {
        CHECK_OK(gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 99999)); /* out of range: ignored */
        CHECK_OK(gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true));
    } else {
        CHECK_OK(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", TINY_EOT));
    }
    if (flaw == TINY_ADD_EOS) CHECK_OK(gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true));
    CHECK_OK(gguf_writer_write_mem(w, data, size));
    gguf_writer_free(w);
    free(strs);
    free(types);
    free(bytes);
}

static enum tern_status load_mem(const void *data, size_t size, struct tern_tokenizer **out) {
    struct gguf_file *f;
    enum tern_status st = gguf_open_mem(data, size, &f);
    if (st) {
        *out = NULL;
        return st;
    }
    st = tern_tokenizer_load(f, out);
    gguf_close(f);
    return st;
}

static enum tern_status tiny_load(enum tiny_flaw flaw, struct tern_tokenizer **out) {
    void *data;
    size_t size;
    tiny_bytes(flaw, &data, &size);
    enum tern_status st = load_mem(data, size, out);
    free(data);
    return st;
}

static struct tern_tokenizer *tiny(void) {
    struct tern_tokenizer *t;
    CHECK_OK(tiny_load(TINY_OK, &t));
    return t;
}

static void test_tiny_merges(void **state) {
    (void)state;
    struct tern_tokenizer *t = tiny();
    struct ids ids = {0};
    assert_int_equal(tern_tokenizer_n_vocab(t), 256 + N_MERGES + N_SPECIAL);
    assert_string_equal(tern_tokenizer_pre(t), "qwen2");
    tok(t, "hello world", 11, 0, &ids);
    assert_ids(&ids, (int32_t[]){TINY_HELLO, TINY_WORLD}, 2);
    /* Rank order, not left to right: "abc" merges "a b" (rank 11) before "b c" (12). */
    tok(t, "abc", 3, 0, &ids);
    assert_ids(&ids, (int32_t[]){267, 'c'}, 2);
    tok(t, "bbc", 3, 0, &ids);
    assert_ids(&ids, (int32_t[]){'b', 268}, 2);
    /* Equal ranks go left first: "aaaaa" -> aa aa a -> aaaa a. */
    tok(t, "aaaaa", 5, 0, &ids);
    assert_ids(&ids, (int32_t[]){266, 'a'}, 2);
    /* The same with more than the small-word limit, through the heap. */
    char big[200];
    memset(big, 'a', sizeof big);
    tok(t, big, sizeof big, 0, &ids);
    assert_int_equal(ids.n, 50);
    for (size_t i = 0; i < ids.n; i++) assert_int_equal(ids.v[i], 266);
    tok(t, big, 199, 0, &ids); /* 199 a: 49 aaaa, then aa a */
    assert_int_equal(ids.n, 51);
    assert_int_equal(ids.v[49], 265);
    assert_int_equal(ids.v[50], 'a');
    /* Empty text, and text that is only a special token. */
    tok(t, "", 0, TERN_TOK_PARSE_SPECIAL, &ids);
    assert_int_equal(ids.n, 0);
    free(ids.v);
    tern_tokenizer_free(t);
}

static void test_tiny_special(void **state) {
    (void)state;
    struct tern_tokenizer *t = tiny();
    struct ids ids = {0};
    const char *s = "<|im_start|>hello<|im_end|>";
    tok(t, s, strlen(s), TERN_TOK_PARSE_SPECIAL, &ids);
    assert_ids(&ids, (int32_t[]){TINY_IM_START, TINY_HELLO, TINY_IM_END}, 3);
    /* Without parsing, control text is plain text. */
    tok(t, s, strlen(s), 0, &ids);
    assert_true(ids.n > 5);
    for (size_t i = 0; i < ids.n; i++) assert_false(tern_token_is_control(t, ids.v[i]));
    /* User-defined tokens are split out either way (as llama.cpp does). */
    s = "<think>hello</think>";
    tok(t, s, strlen(s), 0, &ids);
    assert_int_equal(ids.v[0], TINY_THINK);
    assert_int_equal(ids.v[1], TINY_HELLO);
    /* Longer special tokens win over their prefixes ("<|im" is a control token too). */
    s = "<|im<|im_end|><|im";
    tok(t, s, strlen(s), TERN_TOK_PARSE_SPECIAL, &ids);
    assert_ids(&ids, (int32_t[]){TINY_IM, TINY_IM_END, TINY_IM}, 3);
    /* Adjacent, and at both ends. */
    s = "<|im_end|><|im_start|>";
    tok(t, s, strlen(s), TERN_TOK_PARSE_SPECIAL, &ids);
    assert_ids(&ids, (int32_t[]){TINY_IM_END, TINY_IM_START}, 2);
    /* A truncated special text is text. */
    s = "<|im_sta";
    tok(t, s, strlen(s), TERN_TOK_PARSE_SPECIAL, &ids);
    assert_int_equal(ids.v[0], TINY_IM);
    /* Attributes and accessors. */
    assert_true(tern_token_is_control(t, TINY_IM_START));
    assert_false(tern_token_is_control(t, TINY_THINK));
    assert_int_equal(tern_token_type(t, TINY_THINK), TERN_TOKEN_TYPE_USER_DEFINED);
    assert_int_equal(tern_token_type(t, TINY_HELLO), TERN_TOKEN_TYPE_NORMAL);
    assert_int_equal(tern_token_type(t, -1), -1);
    assert_int_equal(tern_token_find(t, "<|im_end|>", 10), TINY_IM_END);
    assert_int_equal(tern_token_find(t, "hello", 5), TINY_HELLO);
    assert_int_equal(tern_token_find(t, "nope", 4), -1);
    size_t len;
    assert_string_equal(tern_token_text(t, TINY_WORLD, &len), "\xc4\xa0world");
    assert_int_equal(len, 7);
    assert_null(tern_token_text(t, 100000, &len));
    const int32_t *sp;
    size_t n_sp = tern_tokenizer_special_tokens(t, &sp);
    assert_int_equal(n_sp, N_SPECIAL);
    assert_int_equal(sp[0], TINY_EOT); /* the longest text first */
    /* Pieces: control text only when rendering specials; user-defined always. */
    struct tern_buf b = TERN_BUF_INIT;
    CHECK_OK(tern_token_piece(t, TINY_IM_END, 0, &b));
    assert_int_equal(b.len, 0);
    CHECK_OK(tern_token_piece(t, TINY_IM_END, TERN_TOK_PARSE_SPECIAL, &b));
    assert_string_equal(b.data, "<|im_end|>");
    tern_buf_clear(&b);
    CHECK_OK(tern_token_piece(t, TINY_THINK, 0, &b));
    CHECK_OK(tern_token_piece(t, TINY_WORLD, 0, &b));
    assert_string_equal(b.data, "<think> world");
    assert_error(tern_token_piece(t, 100000, 0, &b), TERN_ERR_RANGE, "outside the vocabulary");
    assert_error(tern_token_piece(t, -3, 0, &b), TERN_ERR_RANGE, "-3");
    int32_t bad[] = {TINY_HELLO, 4000};
    tern_buf_clear(&b);
    assert_error(tern_detokenize(t, bad, 2, 0, &b), TERN_ERR_RANGE, "4000");
    assert_int_equal(b.len, 0);
    tern_buf_free(&b);
    free(ids.v);
    tern_tokenizer_free(t);
}

static void test_tiny_bos_eos(void **state) {
    (void)state;
    struct tern_tokenizer *t = tiny();
    struct ids ids = {0};
    /* qwen2 pre-tokenizer: no BOS by default; eos from the file. */
    assert_false(tern_tokenizer_add_bos(t));
    assert_false(tern_tokenizer_add_eos(t));
    assert_int_equal(tern_token_eos(t), TINY_IM_END);
    assert_int_equal(tern_token_bos(t), TINY_EOT);
    tok(t, "hello", 5, TERN_TOK_ADD_SPECIAL, &ids);
    assert_ids(&ids, (int32_t[]){TINY_HELLO}, 1);
    tern_tokenizer_free(t);
    CHECK_OK(tiny_load(TINY_ADD_EOS, &t));
    assert_true(tern_tokenizer_add_eos(t));
    tok(t, "hello", 5, TERN_TOK_ADD_SPECIAL, &ids);
    assert_ids(&ids, (int32_t[]){TINY_HELLO, TINY_IM_END}, 2);
    tok(t, "hello", 5, 0, &ids);
    assert_ids(&ids, (int32_t[]){TINY_HELLO}, 1);
    /* Detokenizing with ADD_SPECIAL drops the EOS tokenize added. */
    struct tern_buf b = TERN_BUF_INIT;
    int32_t seq[] = {TINY_HELLO, TINY_IM_END};
    CHECK_OK(tern_detokenize(t, seq, 2, TERN_TOK_ADD_SPECIAL | TERN_TOK_PARSE_SPECIAL, &b));
    assert_string_equal(b.data, "hello");
    tern_buf_clear(&b);
    CHECK_OK(tern_detokenize(t, seq, 2, TERN_TOK_PARSE_SPECIAL, &b));
    assert_string_equal(b.data, "hello<|im_end|>");
    tern_buf_free(&b);
    /* eog: eos, and the texts llama.cpp recognises. */
    assert_true(tern_token_is_eog(t, TINY_IM_END));
    assert_true(tern_token_is_eog(t, TINY_EOT));
    assert_false(tern_token_is_eog(t, TINY_IM_START));
    assert_false(tern_token_is_eog(t, TINY_HELLO));
    assert_false(tern_token_is_eog(t, -1));
    assert_false(tern_token_is_eog(t, 1 << 30));
    free(ids.v);
    tern_tokenizer_free(t);
}

static void test_tiny_bad_metadata(void **state) {
    (void)state;
    struct tern_tokenizer *t = (struct tern_tokenizer *)1;
    assert_error(tiny_load(TINY_NO_TOKENS, &t), TERN_ERR_FORMAT, "tokenizer.ggml.tokens");
    assert_null(t);
    assert_error(tiny_load(TINY_BAD_MODEL, &t), TERN_ERR_UNSUPPORTED, "'wordpiece-x'");
    assert_error(tiny_load(TINY_BAD_PRE, &t), TERN_ERR_UNSUPPORTED, "'no-such-pre'");
    assert_error(tiny_load(TINY_DUPLICATE, &t), TERN_ERR_FORMAT, "duplicate token");
    assert_error(tiny_load(TINY_SHORT_TYPES, &t), TERN_ERR_FORMAT, "token_type has");
    assert_error(tiny_load(TINY_NO_MERGES, &t), TERN_ERR_FORMAT, "merges");
    assert_error(tiny_load(TINY_ADD_BOS_NO_BOS, &t), TERN_ERR_FORMAT, "add_bos_token is true");
    assert_error(tiny_load(TINY_TOKENS_NOT_STRINGS, &t), TERN_ERR_FORMAT, "array of strings");
    assert_null(t);
    /* An empty token text becomes "[EMPTY_<id>]", as in llama.cpp. */
    CHECK_OK(tiny_load(TINY_EMPTY_TOKEN, &t));
    assert_string_equal(tern_token_text(t, 5, NULL), "[EMPTY_5]");
    tern_tokenizer_free(t);
    tern_tokenizer_free(NULL);
}

/* Allocation failures at every step of loading and tokenizing fail cleanly. */
static void test_tiny_alloc_failures(void **state) {
    (void)state;
    const char *text = "<|im_start|>hello world aaaa<think>\xff\xfe";
    void *data;
    size_t size;
    tiny_bytes(TINY_OK, &data, &size);
    struct tern_tokenizer *t = NULL;
    long k = 0;
    for (;; k++) {
        tern_alloc_fail_after(k);
        enum tern_status st = load_mem(data, size, &t);
        tern_alloc_fail_after(-1);
        if (st == TERN_OK) break;
        assert_int_equal(st, TERN_ERR_NOMEM);
        assert_null(t);
    }
    assert_true(k > 5);
    struct ids ids = {0};
    for (long j = 0;; j++) {
        ids.n = 0;
        tern_alloc_fail_after(j);
        enum tern_status st = tern_tokenize(t, text, strlen(text), TERN_TOK_PARSE_SPECIAL, &ids.v, &ids.n, &ids.cap);
        tern_alloc_fail_after(-1);
        if (st == TERN_OK) break;
        assert_int_equal(st, TERN_ERR_NOMEM);
        assert_int_equal(ids.n, 0);
    }
    assert_round_trip(t, text, strlen(text), TERN_TOK_PARSE_SPECIAL);
    free(ids.v);
    free(data);
    tern_tokenizer_free(t);
}

static int reset_alloc(void **state) {
    (void)state;
    tern_alloc_fail_after(-1);
    return 0;
}

/* ---- shared vocabularies ------------------------------------------------------------ */

static void test_qwen_mini_special(void **state) {
    (void)state;
    SHARED(t, "qwen-mini");
    struct ids ids = {0};
    /* The kit's chat prompt: the template emits control tokens as text. */
    const char *chat = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                       "Write a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n";
    tok(t, chat, strlen(chat), TERN_TOK_PARSE_SPECIAL | TERN_TOK_ADD_SPECIAL, &ids);
    /* The ids llama.cpp gives (conformance/logits/tiny-qwen3-f32/chat.json). */
    static const int32_t want[] = {4097, 82,  612, 198, 2610, 525, 264, 1492, 1262, 1071, 380, 517, 13,
                                   4098, 198, 4097, 872, 198, 54,  1247, 264, 305,  64,   1579, 84,  911,
                                   279,  511, 64,  13,  4098, 198, 4097, 395, 380,  517,  198};
    assert_ids(&ids, want, sizeof want / sizeof want[0]);
    assert_int_equal(ids.v[0], 4097);
    size_t n_control = 0;
    for (size_t i = 0; i < ids.n; i++) n_control += tern_token_is_control(t, ids.v[i]);
    assert_int_equal(n_control, 5);
    assert_round_trip(t, chat, strlen(chat), TERN_TOK_PARSE_SPECIAL);
    /* Without parsing, no control token comes out of the same text. */
    tok(t, chat, strlen(chat), 0, &ids);
    for (size_t i = 0; i < ids.n; i++) assert_false(tern_token_is_control(t, ids.v[i]));
    assert_round_trip(t, chat, strlen(chat), 0);
    /* <think> (USER_DEFINED) is always one token. */
    int32_t think = tern_token_find(t, "<think>", 7);
    assert_int_equal(tern_token_type(t, think), TERN_TOKEN_TYPE_USER_DEFINED);
    tok(t, "<think>\nok</think>", 18, 0, &ids);
    assert_int_equal(ids.v[0], think);
    assert_int_equal(ids.v[ids.n - 1], tern_token_find(t, "</think>", 8));
    free(ids.v);
    tern_tokenizer_free(t);
}

static void test_qwen_mini_eog(void **state) {
    (void)state;
    SHARED(t, "qwen-mini");
    assert_int_equal(tern_tokenizer_n_vocab(t), 4122);
    assert_int_equal(tern_token_eos(t), 4098);
    assert_true(tern_token_is_eog(t, 4098)); /* <|im_end|> */
    assert_true(tern_token_is_eog(t, 4096)); /* <|endoftext|> */
    assert_false(tern_token_is_eog(t, 4097)); /* <|im_start|> */
    assert_false(tern_token_is_eog(t, 872));
    const int32_t *eog;
    size_t n = tern_tokenizer_eog_tokens(t, &eog);
    /* eos/eot and the FIM pad/repo/file-separator tokens, as llama.cpp lists them. */
    bool has_4096 = false, has_4098 = false;
    for (size_t i = 0; i < n; i++) {
        has_4096 |= eog[i] == 4096;
        has_4098 |= eog[i] == 4098;
        if (i) assert_true(eog[i] > eog[i - 1]);
    }
    assert_true(has_4096 && has_4098);
    assert_false(tern_tokenizer_add_bos(t));
    assert_int_equal(tern_token_bos(t), 4096);
    assert_int_equal(tern_token_pad(t), 4096);
    tern_tokenizer_free(t);
}

static void test_bos_defaults(void **state) {
    (void)state;
    struct ids ids = {0};
    /* SPM adds BOS (and the dummy space prefix); detokenize removes the prefix. */
    SHARED(t, "llama-spm");
    assert_true(tern_tokenizer_add_bos(t));
    assert_true(tern_tokenizer_add_space_prefix(t));
    tok(t, "Hello", 5, TERN_TOK_ADD_SPECIAL, &ids);
    assert_int_equal(ids.v[0], 1);
    assert_int_equal(ids.n, 2);
    struct tern_buf b = TERN_BUF_INIT;
    CHECK_OK(tern_detokenize(t, ids.v, ids.n, TERN_TOK_ADD_SPECIAL, &b));
    assert_string_equal(b.data, "Hello");
    tern_buf_clear(&b);
    CHECK_OK(tern_detokenize(t, ids.v, ids.n, TERN_TOK_PARSE_SPECIAL, &b));
    assert_string_equal(b.data, "<s> Hello"); /* BOS rendered: the space is kept, as in llama.cpp */
    tern_buf_free(&b);
    tern_tokenizer_free(t);
    /* llama3 (llama-bpe): BOS by default, no key in the file. */
    t = shared_vocab("llama-bpe-from-llama3tok");
    if (!t) skip();
    assert_true(tern_tokenizer_add_bos(t));
    tok(t, "Hello", 5, TERN_TOK_ADD_SPECIAL, &ids);
    assert_int_equal(ids.v[0], 128000);
    assert_true(tern_token_is_eog(t, tern_token_find(t, "<|eot_id|>", 10)));
    assert_true(tern_token_is_eog(t, 128001));
    tern_tokenizer_free(t);
    /* qwen2 with no bos key: llama.cpp's gpt2 default id 11, not added. */
    t = shared_vocab("qwen2-from-qwen3tok");
    if (!t) skip();
    assert_false(tern_tokenizer_add_bos(t));
    assert_int_equal(tern_token_bos(t), 11);
    tok(t, "Hello", 5, TERN_TOK_ADD_SPECIAL, &ids);
    assert_int_equal(ids.n, 1);
    assert_int_equal(tern_token_type(t, 151935), TERN_TOKEN_TYPE_UNUSED);
    size_t len;
    assert_non_null(tern_token_piece_ref(t, 151935, TERN_TOK_PARSE_SPECIAL, &len));
    assert_int_equal(len, 0); /* [PAD...] tokens render as nothing */
    free(ids.v);
    tern_tokenizer_free(t);
}

/* A 4-byte emoji split over four byte tokens: nothing comes out until it is whole. */
static void test_stream_split_emoji(void **state) {
    (void)state;
    SHARED(t, "qwen-mini");
    struct ids ids = {0};
    const char *s = "a\xF0\x9F\x98\x80" "b"; /* a😀b */
    tok(t, s, strlen(s), 0, &ids);
    assert_ids(&ids, (int32_t[]){64, 172, 253, 246, 222, 65}, 6);
    struct tern_detok *d;
    CHECK_OK(tern_detok_new(t, 0, &d));
    struct tern_buf out = TERN_BUF_INIT;
    size_t lens[6];
    for (size_t i = 0; i < ids.n; i++) {
        size_t before = out.len;
        CHECK_OK(tern_detok_push(d, ids.v[i], &out));
        assert_true(tern_utf8_valid(out.data, out.len));
        lens[i] = out.len - before;
    }
    assert_int_equal(lens[0], 1);
    assert_int_equal(lens[1], 0);
    assert_int_equal(lens[2], 0);
    assert_int_equal(lens[3], 0);
    assert_int_equal(lens[4], 4);
    assert_int_equal(lens[5], 1);
    assert_int_equal(tern_detok_pending(d), 0);
    CHECK_OK(tern_detok_flush(d, &out));
    assert_string_equal(out.data, s);
    /* Cut off after two bytes of the emoji: flush gives one U+FFFD. */
    tern_buf_clear(&out);
    CHECK_OK(tern_detok_push(d, 172, &out));
    CHECK_OK(tern_detok_push(d, 253, &out));
    assert_int_equal(out.len, 0);
    assert_int_equal(tern_detok_pending(d), 2);
    CHECK_OK(tern_detok_flush(d, &out));
    assert_string_equal(out.data, TERN_UTF8_REPLACEMENT);
    /* A broken sequence (lead byte, then ASCII): U+FFFD, then the ASCII. */
    tern_buf_clear(&out);
    CHECK_OK(tern_detok_push(d, 172, &out));
    CHECK_OK(tern_detok_push(d, 64, &out));
    assert_string_equal(out.data, TERN_UTF8_REPLACEMENT "a");
    /* A stray continuation byte. */
    tern_buf_clear(&out);
    CHECK_OK(tern_detok_push(d, 222, &out));
    assert_string_equal(out.data, TERN_UTF8_REPLACEMENT);
    assert_error(tern_detok_push(d, 5000, &out), TERN_ERR_RANGE, "5000");
    tern_detok_free(d);
    tern_detok_free(NULL);
    tern_buf_free(&out);
    free(ids.v);
    tern_tokenizer_free(t);
}

/* Random id sequences: every chunk the stream hands out is valid UTF-8, and all of it
 * equals the sanitized detokenization. */
static void test_stream_random(void **state) {
    (void)state;
    SHARED(t, "qwen-mini");
    uint64_t rng = 12345;
    struct tern_buf all = TERN_BUF_INIT, out = TERN_BUF_INIT, want = TERN_BUF_INIT;
    for (int round = 0; round < 200; round++) {
        int32_t seq[64];
        size_t n = 1 + round % 64;
        for (size_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(rng >> 33);
            /* mostly byte tokens >= 0x80 (ids 94..255 hold most of them), some others */
            seq[i] = (int32_t)(r % 4 ? 94 + r % 162 : r % 4122);
        }
        struct tern_detok *d;
        CHECK_OK(tern_detok_new(t, TERN_TOK_PARSE_SPECIAL, &d));
        tern_buf_clear(&all);
        for (size_t i = 0; i < n; i++) {
            tern_buf_clear(&out);
            CHECK_OK(tern_detok_push(d, seq[i], &out));
            assert_true(tern_utf8_valid(out.data, out.len));
            CHECK_OK(tern_buf_append(&all, out.data, out.len));
        }
        tern_buf_clear(&out);
        CHECK_OK(tern_detok_flush(d, &out));
        CHECK_OK(tern_buf_append(&all, out.data, out.len));
        tern_detok_free(d);
        tern_buf_clear(&out);
        CHECK_OK(tern_detokenize(t, seq, n, TERN_TOK_PARSE_SPECIAL, &out));
        tern_buf_clear(&want);
        CHECK_OK(tern_utf8_sanitize(&want, out.data, out.len));
        assert_int_equal(all.len, want.len);
        assert_memory_equal(all.data, want.data, want.len);
    }
    tern_buf_free(&all);
    tern_buf_free(&out);
    tern_buf_free(&want);
    tern_tokenizer_free(t);
}

static void test_invalid_utf8(void **state) {
    (void)state;
    SHARED(bpe, "qwen-mini");
    SHARED(spm, "llama-spm");
    uint64_t rng = 99;
    char buf[512];
    for (int round = 0; round < 300; round++) {
        size_t n = (size_t)round % sizeof buf;
        for (size_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint8_t r = (uint8_t)(rng >> 56);
            buf[i] = (char)(round % 3 == 0 ? r : (r < 200 ? 'a' + r % 26 : r)); /* some text, some junk */
        }
        assert_round_trip(bpe, buf, n, 0);
        assert_round_trip(bpe, buf, n, TERN_TOK_PARSE_SPECIAL);
        if (n && buf[0] != ' ') assert_round_trip(spm, buf, n, 0);
    }
    /* Overlong, surrogate, truncated, stray continuation. */
    static const char *const bad[] = {"\xC0\x80", "\xED\xA0\x80", "\xE2\x82", "\x80\x80x", "\xF4\x90\x80\x80",
                                      "a\xFF b", "\xF0\x9F\x98"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_round_trip(bpe, bad[i], strlen(bad[i]), 0);
        assert_round_trip(spm, bad[i], strlen(bad[i]), 0);
    }
    tern_tokenizer_free(bpe);
    tern_tokenizer_free(spm);
}

/* A megabyte without a space: the merge work grows like n log n, not n^2. */
static void test_long_input_linear(void **state) {
    (void)state;
    SHARED(t, "qwen-mini");
    SHARED(spm, "llama-spm");
    size_t n = 1 << 20;
    char *s = malloc(n);
    assert_non_null(s);
    struct ids ids = {0};
    for (int kind = 0; kind < 3; kind++) {
        uint64_t rng = 7;
        for (size_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(rng >> 40);
            s[i] = kind == 0 ? 'a' : kind == 1 ? (char)('a' + r % 26) : "abcdefghijklmnopqrstuvwxyz0123456789"[r % 36];
        }
        struct tern_tokenizer *tt[2] = {t, spm};
        for (int j = 0; j < 2; j++) {
            struct tern_tok_stats st = {0};
            ids.n = 0;
            CHECK_OK(tern_tokenize_ex(tt[j], s, n, 0, &ids.v, &ids.n, &ids.cap, &st));
            uint64_t work = st.n_pair_lookups + st.n_heap_ops + st.n_merges;
            printf("kind %d %s: %zu tokens, %llu merges, %llu lookups, %llu heap ops\n", kind, j ? "spm" : "bpe",
                   ids.n, (unsigned long long)st.n_merges, (unsigned long long)st.n_pair_lookups,
                   (unsigned long long)st.n_heap_ops);
            /* A quadratic algorithm would do ~n^2 / 2 = 5e11 lookups here. */
            assert_true(work < 40 * (uint64_t)n);
            assert_true(ids.n > 0 && ids.n <= n);
            struct tern_buf b = TERN_BUF_INIT;
            CHECK_OK(tern_detokenize(tt[j], ids.v, ids.n, 0, &b));
            assert_int_equal(b.len, n);
            assert_memory_equal(b.data, s, n);
            tern_buf_free(&b);
        }
    }
    free(ids.v);
    free(s);
    tern_tokenizer_free(t);
    tern_tokenizer_free(spm);
}

/* The ASCII scanners against PCRE2 alone, on random text built from characters that
 * exercise every branch: ASCII classes, contractions, non-ASCII letters, digits and
 * spaces, and invalid bytes. */
static void test_fast_pretok_vs_pcre(void **state) {
    (void)state;
    static const char *const atoms[] = {
        "a", "Z", "q", "0", "7", " ", "  ", "\t", "\n", "\r\n", "\v", "\f", "'", "'s", "'S", "'re", "'LL", "'ve", "'d",
        "'m", "'t", "!", "?!", ".", "+=", "_", "-", "\"", "(", "\x01", "\x7f", "é", "ß", "Ж", "中", "٣", "²",
        "\xC2\xA0", "\xE3\x80\x80", "\xC2\x85", "\xE2\x80\xA8", "😀", "\xCC\x81", "\xFF", "\x80", "\xE2\x82",
        "Hello", "world", "123", "1234567", "   x", "\n\n  ", " \n", "x'", "it's"};
    static const char *const vocabs[] = {"qwen-mini", "llama-bpe-from-llama3tok", "gpt-2", "starcoder", "falcon"};
    uint64_t rng = 2024;
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
        struct tern_tokenizer *t = shared_vocab(vocabs[v]);
        if (!t) skip();
        struct ids fast = {0}, slow = {0};
        char buf[400];
        for (int round = 0; round < 400; round++) {
            size_t len = 0;
            int n_atoms = 1 + round % 40;
            for (int i = 0; i < n_atoms; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                const char *a = atoms[(rng >> 33) % (sizeof atoms / sizeof atoms[0])];
                size_t al = strlen(a);
                if (len + al > sizeof buf) break;
                memcpy(buf + len, a, al);
                len += al;
            }
            tok_set_fast_pretok(t, true);
            tok(t, buf, len, 0, &fast);
            tok_set_fast_pretok(t, false);
            tok(t, buf, len, 0, &slow);
            if (fast.n != slow.n || memcmp(fast.v, slow.v, fast.n * sizeof *fast.v))
                fail_msg("%s: scanner and PCRE2 differ on '%.*s'", vocabs[v], (int)len, buf);
        }
        free(fast.v);
        free(slow.v);
        tern_tokenizer_free(t);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_merges),
        cmocka_unit_test(test_tiny_special),
        cmocka_unit_test(test_tiny_bos_eos),
        cmocka_unit_test(test_tiny_bad_metadata),
        cmocka_unit_test_teardown(test_tiny_alloc_failures, reset_alloc),
        cmocka_unit_test(test_qwen_mini_special),
        cmocka_unit_test(test_qwen_mini_eog),
        cmocka_unit_test(test_bos_defaults),
        cmocka_unit_test(test_stream_split_emoji),
        cmocka_unit_test(test_stream_random),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_long_input_linear),
        cmocka_unit_test(test_fast_pretok_vs_pcre),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
