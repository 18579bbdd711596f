/* Fuzz target: tokenize arbitrary bytes, with and without special-token parsing, then
 * detokenize (whole and streamed) and check what must hold:
 *   - byte-level BPE decodes back to the input, byte for byte;
 *   - SPM does too when no special token was parsed and the text has no U+2581 (which
 *     SPM reads as a space);
 *   - the ASCII pre-tokenizer scanners give the same ids as PCRE2 alone;
 *   - every chunk of the streaming detokenizer is valid UTF-8, and all of them
 *     together equal the sanitized whole detokenization.
 * Input: byte 0 picks the vocabulary (bits 2-3) and the flags (bits 0-1); the rest is
 * the text. Vocabularies: a small one built here with the GGUF writer (always), and
 * the shared kit's qwen-mini, gpt-2 and llama-spm when $TERN_SHARED_DIR (or ../shared)
 * has them. */
#include "gguf/gguf.h"
#include "tokenizer/tok-internal.h"
#include "tokenizer/tokenizer.h"
#include "util/buf.h"
#include "util/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                                    \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            fprintf(stderr, "fuzz-tokenizer: check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            abort();                                                                                   \
        }                                                                                              \
    } while (0)

static struct tern_tokenizer *vocabs[4];

/* 256 byte tokens, a few merges, and specials of every kind. */
static struct tern_tokenizer *build_tiny(void) {
    static const char *const merges[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xc4\xa0", "w"},
                                            {"o", "r"}, {"\xc4\xa0w", "or"}, {"a", "a"}, {"aa", "aa"}, {"1", "2"},
                                            {"<", "|"}, {"\xc4\x8a", "\xc4\x8a"}, {"\xc3\xa9", "t"}};
    static const struct {
        const char *text;
        int32_t type;
    } specials[] = {{"<|endoftext|>", 3}, {"<|im_start|>", 3}, {"<|im_end|>", 3}, {"<think>", 4}, {"</think>", 4},
                    {"<|im", 3},          {"<unk>", 2}};
    enum { N_M = sizeof merges / sizeof merges[0], N_S = sizeof specials / sizeof specials[0], N = 256 + N_M + N_S };
    static char bytes[256][4], merged[N_M][16], mtext[N_M][16];
    struct gguf_str toks[N], ms[N_M];
    int32_t types[N];
    for (int b = 0; b < 256; b++) {
        size_t k = tern_utf8_encode(bytelevel_cp((uint8_t)b), bytes[b]);
        toks[b] = (struct gguf_str){bytes[b], k};
        types[b] = TERN_TOKEN_TYPE_NORMAL;
    }
    for (int i = 0; i < N_M; i++) {
        int n = snprintf(merged[i], sizeof merged[i], "%s%s", merges[i][0], merges[i][1]);
        toks[256 + i] = (struct gguf_str){merged[i], (uint64_t)n};
        types[256 + i] = TERN_TOKEN_TYPE_NORMAL;
        n = snprintf(mtext[i], sizeof mtext[i], "%s %s", merges[i][0], merges[i][1]);
        ms[i] = (struct gguf_str){mtext[i], (uint64_t)n};
    }
    for (int i = 0; i < N_S; i++) {
        toks[256 + N_M + i] = (struct gguf_str){specials[i].text, strlen(specials[i].text)};
        types[256 + N_M + i] = specials[i].type;
    }
    struct gguf_writer *w;
    void *data;
    size_t size;
    struct gguf_file *f;
    struct tern_tokenizer *t = NULL;
    CHECK(gguf_writer_new(&w) == TERN_OK);
    CHECK(gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") == TERN_OK);
    CHECK(gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2") == TERN_OK);
    CHECK(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, N) == TERN_OK);
    CHECK(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, N) == TERN_OK);
    CHECK(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", ms, N_M) == TERN_OK);
    CHECK(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 256 + N_M) == TERN_OK);
    CHECK(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 256 + N_M + 2) == TERN_OK);
    CHECK(gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true) == TERN_OK);
    CHECK(gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true) == TERN_OK);
    CHECK(gguf_writer_write_mem(w, &data, &size) == TERN_OK);
    gguf_writer_free(w);
    CHECK(gguf_open_mem(data, size, &f) == TERN_OK);
    if (tern_tokenizer_load(f, &t) != TERN_OK) fprintf(stderr, "fuzz-tokenizer: %s\n", tern_last_error());
    CHECK(t != NULL);
    gguf_close(f);
    free(data);
    return t;
}

static struct tern_tokenizer *load_shared(const char *name) {
    const char *dir = getenv("TERN_SHARED_DIR");
    if (!dir || !*dir) dir = getenv("TERN_SHARED_DIR_DEFAULT");
    char path[4096];
    snprintf(path, sizeof path, "%s/conformance/tokenizer/ggml-vocab-%s.gguf", dir && *dir ? dir : "../shared", name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fclose(f);
    struct tern_tokenizer *t = NULL;
    CHECK(tern_tokenizer_load_file(path, &t) == TERN_OK);
    return t;
}

static void init(void) {
    vocabs[0] = build_tiny();
    vocabs[1] = load_shared("qwen-mini");
    vocabs[2] = load_shared("gpt-2");
    vocabs[3] = load_shared("llama-spm");
    for (int i = 1; i < 4; i++)
        if (!vocabs[i]) vocabs[i] = vocabs[0];
}

static void check_stream(const struct tern_tokenizer *t, const int32_t *ids, size_t n, int flags) {
    struct tern_detok *d;
    struct tern_buf all = TERN_BUF_INIT, chunk = TERN_BUF_INIT, want = TERN_BUF_INIT, whole = TERN_BUF_INIT;
    CHECK(tern_detokenize(t, ids, n, flags, &whole) == TERN_OK);
    CHECK(tern_detok_new(t, flags, &d) == TERN_OK);
    for (size_t i = 0; i < n; i++) {
        tern_buf_clear(&chunk);
        CHECK(tern_detok_push(d, ids[i], &chunk) == TERN_OK);
        CHECK(tern_utf8_valid(chunk.data, chunk.len));
        CHECK(tern_detok_pending(d) <= 3);
        CHECK(tern_buf_append(&all, chunk.data, chunk.len) == TERN_OK);
    }
    tern_buf_clear(&chunk);
    CHECK(tern_detok_flush(d, &chunk) == TERN_OK);
    CHECK(tern_buf_append(&all, chunk.data, chunk.len) == TERN_OK);
    CHECK(tern_utf8_sanitize(&want, whole.data ? whole.data : "", whole.len) == TERN_OK);
    /* The stream never strips the dummy-prefix space; the whole detokenization may. */
    size_t skip = all.len == want.len + 1 && t->add_space_prefix && all.data[0] == ' ' ? 1 : 0;
    CHECK(all.len == want.len + skip);
    CHECK(!want.len || !memcmp(all.data + skip, want.data, want.len));
    tern_detok_free(d);
    tern_buf_free(&all);
    tern_buf_free(&chunk);
    tern_buf_free(&want);
    tern_buf_free(&whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!vocabs[0]) init();
    if (size < 1) return 0;
    uint8_t sel = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    struct tern_tokenizer *t = vocabs[(sel >> 2) & 3];
    int flags = (sel & 1 ? TERN_TOK_PARSE_SPECIAL : 0) | (sel & 2 ? TERN_TOK_ADD_SPECIAL : 0);

    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    CHECK(tern_tokenize(t, len ? text : NULL, len, flags, &ids, &n, &cap) == TERN_OK);
    for (size_t i = 0; i < n; i++) CHECK(ids[i] >= 0 && (uint32_t)ids[i] < tern_tokenizer_n_vocab(t));

    /* Decode with the same flags: drops what ADD_SPECIAL added, renders parsed specials. */
    struct tern_buf dec = TERN_BUF_INIT;
    CHECK(tern_detokenize(t, ids, n, flags, &dec) == TERN_OK);
    if (tern_tokenizer_model(t) == TERN_TOK_MODEL_BPE) {
        CHECK(dec.len == len && (!len || !memcmp(dec.data, text, len)));
        /* The scanners against PCRE2 alone. */
        int32_t *ids2 = NULL;
        size_t n2 = 0, cap2 = 0;
        tok_set_fast_pretok(t, false);
        CHECK(tern_tokenize(t, len ? text : NULL, len, flags, &ids2, &n2, &cap2) == TERN_OK);
        tok_set_fast_pretok(t, true);
        CHECK(n2 == n && (!n || !memcmp(ids, ids2, n * sizeof *ids)));
        free(ids2);
    } else if (!(flags & TERN_TOK_PARSE_SPECIAL) && !memmem(text, len, "\xE2\x96\x81", 3)) {
        /* SPM is lossless except for U+2581 itself, which stands for a space. */
        CHECK(dec.len == len && (!len || !memcmp(dec.data, text, len)));
    }
    check_stream(t, ids, n, flags & TERN_TOK_PARSE_SPECIAL);
    /* Plain ranges: none gives the same ids; all of the text gives the ids without
     * PARSE_SPECIAL (control tokens unmatched, USER_DEFINED ones split out as always);
     * the text cut in two at its middle is a valid pair of ranges too. */
    {
        int32_t *p = NULL;
        size_t np = 0, capp = 0;
        struct tern_tok_range whole = {0, len}, halves[2] = {{0, len / 2}, {len / 2 + (len > 1), len}};
        CHECK(tern_tokenize_plain(t, len ? text : NULL, len, flags, NULL, 0, &p, &np, &capp) == TERN_OK);
        CHECK(np == n && (!n || !memcmp(ids, p, n * sizeof *ids)));
        int32_t *q = NULL;
        size_t nq = 0, capq = 0;
        np = 0;
        CHECK(tern_tokenize_plain(t, len ? text : NULL, len, flags, &whole, 1, &p, &np, &capp) == TERN_OK);
        CHECK(tern_tokenize(t, len ? text : NULL, len, flags & ~TERN_TOK_PARSE_SPECIAL, &q, &nq, &capq) == TERN_OK);
        CHECK(np == nq && (!np || !memcmp(p, q, np * sizeof *p)));
        np = 0;
        CHECK(tern_tokenize_plain(t, len ? text : NULL, len, flags, halves, 2, &p, &np, &capp) == TERN_OK);
        for (size_t i = 0; i < np; i++) CHECK(p[i] >= 0 && (uint32_t)p[i] < tern_tokenizer_n_vocab(t));
        free(p);
        free(q);
    }
    tern_buf_free(&dec);
    free(ids);
    return 0;
}
