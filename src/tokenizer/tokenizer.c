/* Loading a tokenizer from GGUF metadata, the accessors, and the top of tokenize():
 * BOS/EOS and the splitting of text at special tokens. The rules follow llama.cpp's
 * llama-vocab.cpp (defaults per model type, special ids, end-of-generation detection
 * by token text, the order in which special tokens are split out). */
#include "tokenizer/tok-internal.h"

#include "util/log.h"
#include "util/mem.h"
#include "util/utf8.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_PREFIX "tokenizer.ggml."

/* ---- small helpers ---------------------------------------------------------------- */

enum tern_status tok_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return TERN_OK;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 4) {
            c = need;
            break;
        }
        c *= 2;
    }
    void *q = tern_reallocarray(*p, c, elem);
    if (!q) return tern_errorf(TERN_ERR_NOMEM, "tokenizer: no memory for %zu elements of %zu bytes", c, elem);
    *p = q;
    *cap = c;
    return TERN_OK;
}

enum tern_status tok_emit_slow(struct tok_call *c, const int32_t *ids, size_t n) {
    size_t need;
    if (tern_add_overflow(*c->out.n, n, &need))
        return tern_errorf(TERN_ERR_NOMEM, "tokenizer: output of more than SIZE_MAX ids");
    void *p = *c->out.ids;
    enum tern_status st = tok_grow(&p, c->out.cap, need, sizeof(int32_t));
    if (st) return st;
    *c->out.ids = p;
    memcpy(*c->out.ids + *c->out.n, ids, n * sizeof *ids);
    *c->out.n = need;
    return TERN_OK;
}

static bool in_vocab(const struct tern_tokenizer *t, int32_t id) { return id >= 0 && (uint32_t)id < t->n_vocab; }

static const char *tok_text(const struct tern_tokenizer *t, int32_t id) { return t->text_pool + t->text_off[id]; }

static int32_t find_cstr(const struct tern_tokenizer *t, const char *s) {
    return strmap_find(&t->vocab, t, s, strlen(s));
}

/* ---- loading ------------------------------------------------------------------------ */

static enum tern_status get_str_opt(const struct gguf_file *f, const char *key, const char **out) {
    *out = NULL;
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return TERN_OK;
    if (kv->type != GGUF_TYPE_STRING)
        return tern_errorf(TERN_ERR_FORMAT, "%s has type %s, expected string", key, gguf_type_name(kv->type));
    *out = kv->v.str.ptr;
    return TERN_OK;
}

/* A token id from an integer key: absent -> unchanged; out of range -> warning, unchanged
 * (llama.cpp keeps its default then). */
static enum tern_status get_id(const struct gguf_file *f, const char *key, uint32_t n_vocab, int32_t *id) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return TERN_OK;
    int64_t v;
    switch (kv->type) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_UINT64: v = kv->v.u64 > (uint64_t)INT64_MAX ? -1 : (int64_t)kv->v.u64; break;
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_INT16:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_INT64: v = kv->v.i64; break;
    default:
        return tern_errorf(TERN_ERR_FORMAT, "%s has type %s, expected an integer token id", key,
                           gguf_type_name(kv->type));
    }
    if (v < 0 || v >= (int64_t)n_vocab) {
        TERN_LOG_WARN("tokenizer: %s = %lld is outside the vocabulary (%u tokens); using %d", key, (long long)v,
                      n_vocab, *id);
        return TERN_OK;
    }
    *id = (int32_t)v;
    return TERN_OK;
}

static bool is_int_type(enum gguf_type ty) {
    return ty == GGUF_TYPE_UINT8 || ty == GGUF_TYPE_INT8 || ty == GGUF_TYPE_UINT16 || ty == GGUF_TYPE_INT16 ||
           ty == GGUF_TYPE_UINT32 || ty == GGUF_TYPE_INT32 || ty == GGUF_TYPE_UINT64 || ty == GGUF_TYPE_INT64;
}

static uint16_t attr_of_type(int64_t type) {
    switch (type) {
    case TERN_TOKEN_TYPE_NORMAL: return ATTR_NORMAL;
    case TERN_TOKEN_TYPE_UNKNOWN: return ATTR_UNKNOWN;
    case TERN_TOKEN_TYPE_CONTROL: return ATTR_CONTROL;
    case TERN_TOKEN_TYPE_USER_DEFINED: return ATTR_USER_DEFINED;
    case TERN_TOKEN_TYPE_UNUSED: return ATTR_UNUSED;
    case TERN_TOKEN_TYPE_BYTE: return ATTR_BYTE;
    default: return 0;
    }
}

static enum tern_status load_tokens(struct tern_tokenizer *t, const struct gguf_file *f) {
    const struct gguf_kv *kv = gguf_find_kv(f, KEY_PREFIX "tokens");
    if (!kv) return tern_errorf(TERN_ERR_FORMAT, "no " KEY_PREFIX "tokens in the file: it has no vocabulary");
    if (kv->type != GGUF_TYPE_ARRAY || kv->v.arr.type != GGUF_TYPE_STRING)
        return tern_errorf(TERN_ERR_FORMAT, KEY_PREFIX "tokens must be an array of strings");
    uint64_t n = kv->v.arr.n;
    if (n == 0) return tern_errorf(TERN_ERR_FORMAT, KEY_PREFIX "tokens is empty");
    if (n > (uint64_t)INT32_MAX - 1)
        return tern_errorf(TERN_ERR_LIMIT, KEY_PREFIX "tokens has %llu entries; the limit is %d",
                           (unsigned long long)n, INT32_MAX - 1);
    t->n_vocab = (uint32_t)n;
    const struct gguf_str *strs = kv->v.arr.strs;

    /* Empty texts become "[EMPTY_<id>]", as llama.cpp does, so that every token has a
     * distinct, non-empty text. */
    uint64_t pool = 0;
    for (uint64_t i = 0; i < n; i++) pool += (strs[i].len ? strs[i].len : 24) + 1;
    if (pool > UINT32_MAX)
        return tern_errorf(TERN_ERR_LIMIT, "vocabulary text of %llu bytes exceeds the limit of 4 GiB",
                           (unsigned long long)pool);
    t->text_pool = tern_malloc((size_t)pool);
    t->text_off = tern_calloc(n, sizeof *t->text_off);
    t->text_len = tern_calloc(n, sizeof *t->text_len);
    t->scores = tern_calloc(n, sizeof *t->scores);
    t->types = tern_calloc(n, sizeof *t->types);
    t->attrs = tern_calloc(n, sizeof *t->attrs);
    if (!t->text_pool || !t->text_off || !t->text_len || !t->scores || !t->types || !t->attrs)
        return tern_errorf(TERN_ERR_NOMEM, "no memory for a vocabulary of %llu tokens", (unsigned long long)n);
    size_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        t->text_off[i] = (uint32_t)off;
        if (strs[i].len) {
            memcpy(t->text_pool + off, strs[i].ptr, strs[i].len);
            t->text_len[i] = (uint32_t)strs[i].len;
        } else {
            TERN_LOG_WARN("tokenizer: token %llu has an empty text", (unsigned long long)i);
            t->text_len[i] = (uint32_t)snprintf(t->text_pool + off, 24, "[EMPTY_%llu]", (unsigned long long)i);
        }
        off += t->text_len[i];
        t->text_pool[off++] = 0;
    }

    const struct gguf_kv *sc = gguf_find_kv(f, KEY_PREFIX "scores");
    if (sc) {
        if (sc->type != GGUF_TYPE_ARRAY || (sc->v.arr.type != GGUF_TYPE_FLOAT32 && sc->v.arr.type != GGUF_TYPE_INT32))
            return tern_errorf(TERN_ERR_FORMAT, KEY_PREFIX "scores must be an array of float32 or int32");
        if (sc->v.arr.n < n)
            return tern_errorf(TERN_ERR_FORMAT, KEY_PREFIX "scores has %llu entries for %llu tokens",
                               (unsigned long long)sc->v.arr.n, (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) t->scores[i] = (float)gguf_arr_get_f64(sc, i);
    }
    const struct gguf_kv *ty = gguf_find_kv(f, KEY_PREFIX "token_type");
    if (ty) {
        if (ty->type != GGUF_TYPE_ARRAY || !is_int_type(ty->v.arr.type))
            return tern_errorf(TERN_ERR_FORMAT, KEY_PREFIX "token_type must be an array of integers");
        if (ty->v.arr.n < n)
            return tern_errorf(TERN_ERR_FORMAT, KEY_PREFIX "token_type has %llu entries for %llu tokens",
                               (unsigned long long)ty->v.arr.n, (unsigned long long)n);
    }
    for (uint64_t i = 0; i < n; i++) {
        int64_t v = ty ? gguf_arr_get_i64(ty, i) : TERN_TOKEN_TYPE_NORMAL;
        t->types[i] = (int8_t)(v >= 0 && v <= TERN_TOKEN_TYPE_BYTE ? v : TERN_TOKEN_TYPE_UNDEFINED);
        t->attrs[i] = attr_of_type(v);
    }

    enum tern_status st = strmap_init(&t->vocab, (size_t)n);
    if (st) return st;
    /* Hash ahead and prefetch: the table is larger than the caches. */
    uint64_t hq[16];
    for (uint64_t i = 0; i < n && i < 16; i++) hq[i] = strmap_hash(tok_text(t, (int32_t)i), t->text_len[i]);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t h = hq[i & 15];
        if (i + 16 < n) {
            hq[i & 15] = strmap_hash(tok_text(t, (int32_t)(i + 16)), t->text_len[i + 16]);
            strmap_prefetch(&t->vocab, hq[i & 15]);
        }
        int32_t dup = strmap_insert_h(&t->vocab, t, (int32_t)i, h);
        if (dup >= 0)
            return tern_errorf(TERN_ERR_FORMAT, "duplicate token in the vocabulary: '%s' has ids %d and %llu",
                               tok_text(t, dup), dup, (unsigned long long)i);
    }
    return TERN_OK;
}

struct mrec {
    const char *s; /* "left right" */
    uint32_t nl, nr;
    uint64_t hl, hr, hres;
    int32_t l, r, res; /* res -2: not found yet */
};

#define AHEAD 12

/* Merges are looked up in passes that prefetch AHEAD entries in front: a 150k-merge
 * table is far larger than the caches, and each lookup would otherwise wait for
 * memory two or three times. */
static enum tern_status load_merges(struct tern_tokenizer *t, const struct gguf_file *f) {
    const struct gguf_kv *kv = gguf_find_kv(f, KEY_PREFIX "merges");
    if (!kv) return tern_errorf(TERN_ERR_FORMAT, "a gpt2 (BPE) tokenizer needs " KEY_PREFIX "merges; the file has none");
    if (kv->type != GGUF_TYPE_ARRAY || kv->v.arr.type != GGUF_TYPE_STRING)
        return tern_errorf(TERN_ERR_FORMAT, KEY_PREFIX "merges must be an array of strings");
    uint64_t n64 = kv->v.arr.n;
    if (n64 > UINT32_MAX - 1)
        return tern_errorf(TERN_ERR_LIMIT, KEY_PREFIX "merges has %llu entries; the limit is %u",
                           (unsigned long long)n64, UINT32_MAX - 1);
    size_t n = (size_t)n64;
    enum tern_status st = pairmap_init(&t->merges, n);
    if (st) return st;
    struct mrec *m = tern_calloc(n ? n : 1, sizeof *m);
    char *cat = NULL;
    size_t cat_cap = 0, n_dropped = 0;
    if (!m) return tern_errorf(TERN_ERR_NOMEM, "no memory to read %zu merges", n);

    /* 1: split "left right" at the first space after the first byte (a part may
     * itself start with a space in some vocabularies), hash the parts. */
    for (size_t i = 0; i < n; i++) {
        const struct gguf_str *s = &kv->v.arr.strs[i];
        const char *sp = s->len > 1 ? memchr(s->ptr + 1, ' ', s->len - 1) : NULL;
        m[i].s = s->ptr;
        m[i].l = m[i].r = m[i].res = -1;
        if (!sp) continue;
        m[i].nl = (uint32_t)(sp - s->ptr);
        m[i].nr = (uint32_t)(s->len - m[i].nl - 1);
        m[i].hl = strmap_hash(s->ptr, m[i].nl);
        m[i].hr = strmap_hash(sp + 1, m[i].nr);
    }
    /* 2: the parts' ids. The result is usually the id after the previous result
     * (byte-level vocabularies list merges' results in merge order): a sequential
     * check; otherwise it is hashed for pass 3. */
    int32_t prev = -1;
    for (size_t i = 0; i < n; i++) {
        if (i + AHEAD < n) {
            strmap_prefetch(&t->vocab, m[i + AHEAD].hl);
            strmap_prefetch(&t->vocab, m[i + AHEAD].hr);
        }
        if (i + AHEAD / 2 < n) {
            const char *p1 = strmap_first_text(&t->vocab, t, m[i + AHEAD / 2].hl);
            const char *p2 = strmap_first_text(&t->vocab, t, m[i + AHEAD / 2].hr);
            if (p1) __builtin_prefetch(p1);
            if (p2) __builtin_prefetch(p2);
        }
        struct mrec *r = &m[i];
        if (!r->nl) continue;
        const char *right = r->s + r->nl + 1;
        r->l = strmap_find_h(&t->vocab, t, r->s, r->nl, r->hl);
        r->r = strmap_find_h(&t->vocab, t, right, r->nr, r->hr);
        if (r->l < 0 || r->r < 0) continue;
        int32_t guess = prev + 1;
        if (prev >= 0 && in_vocab(t, guess) && t->text_len[guess] == r->nl + r->nr &&
            !memcmp(tok_text(t, guess), r->s, r->nl) && !memcmp(tok_text(t, guess) + r->nl, right, r->nr)) {
            r->res = prev = guess;
            continue;
        }
        if ((st = tok_grow((void **)&cat, &cat_cap, r->nl + r->nr + 1, 1))) goto done;
        memcpy(cat, r->s, r->nl);
        memcpy(cat + r->nl, right, r->nr);
        r->hres = strmap_hash(cat, r->nl + r->nr);
        r->res = -2;
    }
    /* 3: the results that were not where expected. */
    for (size_t i = 0, ahead = 0; i < n; i++) {
        for (; ahead < n && ahead < i + AHEAD; ahead++)
            if (m[ahead].res == -2) strmap_prefetch(&t->vocab, m[ahead].hres);
        struct mrec *r = &m[i];
        if (r->res != -2) continue;
        memcpy(cat, r->s, r->nl);
        memcpy(cat + r->nl, r->s + r->nl + 1, r->nr);
        r->res = strmap_find_h(&t->vocab, t, cat, r->nl + r->nr, r->hres);
        if (r->res >= 0) prev = r->res;
    }
    /* 4: the pair table (hashes reuse hl: it is free now). */
    for (size_t i = 0; i < n; i++)
        if (m[i].l >= 0 && m[i].r >= 0) m[i].hl = pairmap_hash(m[i].l, m[i].r);
    for (size_t i = 0; i < n; i++) {
        if (i + AHEAD < n && m[i + AHEAD].l >= 0 && m[i + AHEAD].r >= 0) pairmap_prefetch(&t->merges, m[i + AHEAD].hl);
        if (m[i].l < 0 || m[i].r < 0) {
            n_dropped++;
            continue;
        }
        pairmap_insert_h(&t->merges, m[i].l, m[i].r, (uint32_t)i, m[i].res, m[i].hl);
    }
    if (n_dropped)
        TERN_LOG_WARN("tokenizer: %zu of %zu merges name a part that is not a token; they are ignored", n_dropped, n);
done:
    free(m);
    free(cat);
    return st;
}

/* The bytes a token renders, by the rules of llama.cpp's token_to_piece. */
static enum tern_status build_pieces(struct tern_tokenizer *t) {
    uint32_t n = t->n_vocab;
    t->piece_off = tern_calloc(n, sizeof *t->piece_off);
    t->piece_len = tern_calloc(n, sizeof *t->piece_len);
    t->piece_kind = tern_calloc(n, 1);
    if (!t->piece_off || !t->piece_len || !t->piece_kind) return tern_errorf(TERN_ERR_NOMEM, "no memory for token pieces");
    struct tern_buf pool = TERN_BUF_INIT;
    enum tern_status st = TERN_OK;
    int16_t byte_of[324]; /* GPT-2 code point -> byte; all of them are below 324 */
    for (uint32_t cp = 0; cp < 324; cp++) byte_of[cp] = (int16_t)bytelevel_byte(cp);
    for (uint32_t id = 0; id < n && !st; id++) {
        uint16_t a = t->attrs[id];
        const char *s = tok_text(t, (int32_t)id);
        size_t len = t->text_len[id];
        size_t start = pool.len;
        if (start > UINT32_MAX - len * 2 - 8) {
            st = tern_errorf(TERN_ERR_LIMIT, "token pieces exceed 4 GiB");
            break;
        }
        uint8_t kind = PIECE_ALWAYS;
        if (a & (ATTR_UNKNOWN | ATTR_CONTROL)) {
            kind = PIECE_SPECIAL;
            st = tern_buf_append(&pool, s, len);
        } else if (a & ATTR_USER_DEFINED) {
            st = tern_buf_append(&pool, s, len);
        } else if (a & ATTR_NORMAL) {
            /* Decoding never makes a piece longer than its text. */
            if ((st = tern_buf_reserve(&pool, len))) break;
            char *d = pool.data + pool.len;
            const uint8_t *p = (const uint8_t *)s;
            if (t->model == TERN_TOK_MODEL_BPE) {
                /* Undo the byte-level encoding; a code point that stands for no byte is
                 * kept as its UTF-8 (llama.cpp would print a marker). */
                for (size_t i = 0; i < len;) {
                    if (p[i] > 0x20 && p[i] < 0x7F) { /* printable ASCII stands for itself */
                        *d++ = (char)p[i++];
                        continue;
                    }
                    size_t bad, k = p[i] < 0x80 ? 1 : tern_utf8_seq(p + i, len - i, &bad);
                    int b = -1;
                    if (k) {
                        uint32_t cp = tern_utf8_decode(p + i, k);
                        b = cp < sizeof byte_of ? byte_of[cp] : -1;
                    }
                    if (!k) k = bad ? bad : len - i;
                    if (b >= 0) {
                        *d++ = (char)b;
                    } else {
                        memcpy(d, p + i, k);
                        d += k;
                    }
                    i += k;
                }
            } else {
                for (size_t i = 0; i < len;) {
                    if (i + 3 <= len && !memcmp(p + i, "\xE2\x96\x81", 3)) {
                        *d++ = ' ';
                        i += 3;
                    } else {
                        *d++ = (char)p[i++];
                    }
                }
            }
            pool.len = (size_t)(d - pool.data);
            pool.data[pool.len] = 0;
        } else if (a & ATTR_BYTE) {
            unsigned v;
            char tail;
            if (len == 6 && sscanf(s, "<0x%2x%c", &v, &tail) == 2 && tail == '>')
                st = tern_buf_putc(&pool, (char)v);
            else
                st = tern_buf_append(&pool, s, len);
        } else {
            kind = PIECE_NONE;
        }
        t->piece_kind[id] = kind;
        t->piece_off[id] = (uint32_t)start;
        t->piece_len[id] = (uint32_t)(pool.len - start);
    }
    if (st) {
        tern_buf_free(&pool);
        return st;
    }
    t->piece_pool = pool.data ? pool.data : tern_strdup("");
    if (!t->piece_pool) return tern_errorf(TERN_ERR_NOMEM, "no memory for token pieces");
    return TERN_OK;
}

static int cmp_special(const void *a, const void *b, void *arg) {
    const struct tern_tokenizer *t = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->text_len[x] != t->text_len[y]) return t->text_len[x] > t->text_len[y] ? -1 : 1;
    return (x > y) - (x < y);
}

static enum tern_status build_specials(struct tern_tokenizer *t) {
    size_t n = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++)
        if (t->attrs[id] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) n++;
    t->specials = tern_calloc(n ? n : 1, sizeof *t->specials);
    if (!t->specials) return tern_errorf(TERN_ERR_NOMEM, "no memory for the special tokens");
    for (uint32_t id = 0; id < t->n_vocab; id++)
        if (t->attrs[id] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) t->specials[t->n_specials++] = (int32_t)id;
    /* llama.cpp sorts by length only (unstable); ties by id keep this deterministic. */
    qsort_r(t->specials, t->n_specials, sizeof *t->specials, cmp_special, t);

    size_t cap = 0;
    enum tern_status st = tok_grow((void **)&t->trie, &cap, 1, sizeof *t->trie);
    if (st) return st;
    t->trie[0] = (struct trie_node){.child = -1, .sibling = -1, .special = -1};
    t->n_trie = 1;
    for (size_t k = 0; k < t->n_specials; k++) {
        int32_t id = t->specials[k];
        const uint8_t *s = (const uint8_t *)tok_text(t, id);
        size_t len = t->text_len[id];
        if (!((t->special_first[s[0] >> 3] >> (s[0] & 7)) & 1)) {
            t->special_first[s[0] >> 3] |= (uint8_t)(1u << (s[0] & 7));
            t->n_special_first++;
            t->special_first_byte = s[0];
        }
        int32_t node = 0;
        for (size_t i = 0; i < len; i++) {
            int32_t c = t->trie[node].child;
            while (c >= 0 && t->trie[c].byte != s[i]) c = t->trie[c].sibling;
            if (c < 0) {
                st = tok_grow((void **)&t->trie, &cap, t->n_trie + 1, sizeof *t->trie);
                if (st) return st;
                c = (int32_t)t->n_trie++;
                t->trie[c] = (struct trie_node){.child = -1, .sibling = t->trie[node].child, .special = -1, .byte = s[i]};
                t->trie[node].child = c;
            }
            node = c;
        }
        t->trie[node].special = (int32_t)k;
    }
    return TERN_OK;
}

static void force_control(struct tern_tokenizer *t, int32_t id) {
    if (!(t->attrs[id] & ATTR_CONTROL)) {
        TERN_LOG_DEBUG("tokenizer: token %d '%s' looks like a control token; treating it as one", id, tok_text(t, id));
        t->attrs[id] |= ATTR_CONTROL;
    }
}

/* The first of the texts that is in the vocabulary becomes *id (if unset), and a
 * control token. */
static void detect_special(struct tern_tokenizer *t, int32_t *id, const char *const *texts) {
    if (*id >= 0) return;
    for (size_t i = 0; texts[i]; i++) {
        int32_t x = find_cstr(t, texts[i]);
        if (x >= 0) {
            *id = x;
            force_control(t, x);
            return;
        }
    }
}

#define FW_BAR "\xEF\xBD\x9C" /* U+FF5C FULLWIDTH VERTICAL LINE */
#define SPM_SP "\xE2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */

static const char *const eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                        "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                                        "<" FW_BAR "end" SPM_SP "of" SPM_SP "sentence" FW_BAR ">",
                                        "<end_of_utterance>", NULL};
static const char *const eom_texts[] = {"<|eom_id|>", NULL};
static const char *const fim_pre_texts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                            "<" FW_BAR "fim" SPM_SP "begin" FW_BAR ">", "<PRE>", SPM_SP "<PRE>",
                                            "<|code_prefix|>", "<|prefix|>", NULL};
static const char *const fim_suf_texts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                            "<" FW_BAR "fim" SPM_SP "hole" FW_BAR ">", "<SUF>", SPM_SP "<SUF>",
                                            "<|code_suffix|>", "<|suffix|>", NULL};
static const char *const fim_mid_texts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                            "<" FW_BAR "fim" SPM_SP "end" FW_BAR ">", "<MID>", SPM_SP "<MID>",
                                            "<|code_middle|>", "<|middle|>", NULL};
static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL};
static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
static const char *const eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
                                        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
                                        "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
                                        "<turn|>", "<|tool_response>",
                                        "<" FW_BAR "end" SPM_SP "of" SPM_SP "sentence" FW_BAR ">", "[e~[", NULL};

static void eog_set(struct tern_tokenizer *t, int32_t id, bool on) {
    if (!in_vocab(t, id)) return;
    if (on)
        t->eog_bits[id >> 3] |= (uint8_t)(1u << (id & 7));
    else
        t->eog_bits[id >> 3] &= (uint8_t)~(1u << (id & 7));
}

static bool eog_has(const struct tern_tokenizer *t, int32_t id) {
    return in_vocab(t, id) && (t->eog_bits[id >> 3] >> (id & 7)) & 1;
}

static enum tern_status build_eog(struct tern_tokenizer *t) {
    t->eog_bits = tern_calloc(t->n_vocab / 8 + 1, 1);
    if (!t->eog_bits) return tern_errorf(TERN_ERR_NOMEM, "no memory for the end-of-generation set");
    eog_set(t, t->fim_pad, true);
    eog_set(t, t->fim_rep, true);
    eog_set(t, t->fim_sep, true);
    for (size_t i = 0; eog_texts[i]; i++) {
        int32_t id = find_cstr(t, eog_texts[i]);
        if (id >= 0) {
            eog_set(t, id, true);
            force_control(t, id);
        }
    }
    /* gpt-oss: these always render (llama.cpp makes them user-defined). */
    static const char *const gpt_oss_texts[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
    for (size_t i = 0; gpt_oss_texts[i]; i++) {
        int32_t id = find_cstr(t, gpt_oss_texts[i]);
        if (id >= 0) t->attrs[id] = ATTR_USER_DEFINED;
    }
    eog_set(t, t->eos, true);
    eog_set(t, t->eot, true);
    eog_set(t, t->eom, true);
    /* o200k_harmony and solar-open end a message with <|end|> but keep generating. */
    int32_t end = find_cstr(t, "<|end|>");
    bool has_return = eog_has(t, find_cstr(t, "<|return|>"));
    bool has_call = eog_has(t, find_cstr(t, "<|call|>")) || eog_has(t, find_cstr(t, "<|calls|>"));
    bool has_flush = eog_has(t, find_cstr(t, "<|flush|>"));
    if (eog_has(t, end) && has_call && (has_return || has_flush)) {
        eog_set(t, end, false);
        t->attrs[end] = ATTR_USER_DEFINED;
    }
    /* gemma4 and paddleocr: </s> is not an end of generation there. */
    int32_t s_end = find_cstr(t, "</s>");
    if (eog_has(t, s_end) && eog_has(t, find_cstr(t, "<|tool_response>"))) {
        eog_set(t, s_end, false);
        t->attrs[s_end] = ATTR_NORMAL;
    }
    for (uint32_t id = 0; id < t->n_vocab; id++)
        if (eog_has(t, (int32_t)id)) t->n_eog++;
    t->eog = tern_calloc(t->n_eog ? t->n_eog : 1, sizeof *t->eog);
    if (!t->eog) return tern_errorf(TERN_ERR_NOMEM, "no memory for the end-of-generation set");
    size_t k = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++)
        if (eog_has(t, (int32_t)id)) t->eog[k++] = (int32_t)id;
    return TERN_OK;
}

/* Per-model token attributes llama.cpp sets from the model name (the file lacks them). */
static void apply_name_attrs(struct tern_tokenizer *t, const struct gguf_file *f) {
    const char *name = NULL, *arch = NULL;
    if (get_str_opt(f, "general.name", &name) != TERN_OK) name = NULL;
    if (get_str_opt(f, "general.architecture", &arch) != TERN_OK) arch = NULL;
    char lname[256] = {0};
    if (name) {
        size_t i = 0;
        for (; name[i] && i + 1 < sizeof lname; i++) lname[i] = (char)tolower((unsigned char)name[i]);
    }
    const char *pre = t->pre_name ? t->pre_name : "";
    if (strstr(pre, "jina-v2-de") || strstr(pre, "jina-v2-es") || strstr(pre, "jina-v2-code") ||
        (arch && (strstr(arch, "nomic-bert-moe") || strstr(arch, "jina-bert-v3")))) {
        int32_t id = find_cstr(t, "<mask>");
        if (id >= 0) t->attrs[id] |= ATTR_LSTRIP;
    } else if (strstr(lname, "phi-3") || strstr(lname, "phi3")) {
        for (size_t k = 0; k < t->n_specials; k++) t->attrs[t->specials[k]] |= ATTR_RSTRIP;
        int32_t id = find_cstr(t, "</s>");
        if (id >= 0) t->attrs[id] |= ATTR_RSTRIP;
        static const char *const off[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (size_t i = 0; i < 3; i++) {
            id = find_cstr(t, off[i]);
            if (id >= 0) t->attrs[id] &= (uint16_t)~ATTR_RSTRIP;
        }
    } else if (strstr(lname, "modern-bert")) {
        int32_t id = find_cstr(t, "[MASK]");
        if (id >= 0) t->attrs[id] |= ATTR_LSTRIP;
    }
}

static enum tern_status load(struct tern_tokenizer *t, const struct gguf_file *f) {
    const char *model, *pre;
    enum tern_status st = get_str_opt(f, KEY_PREFIX "model", &model);
    if (st) return st;
    if (!model) return tern_errorf(TERN_ERR_FORMAT, "no " KEY_PREFIX "model in the file: it has no tokenizer");
    if ((st = get_str_opt(f, KEY_PREFIX "pre", &pre))) return st;

    struct pre_info info = {0};
    if (!strcmp(model, "gpt2")) {
        t->model = TERN_TOK_MODEL_BPE;
        t->bos = t->eos = 11; /* llama.cpp's defaults for gpt2 vocabularies */
        t->unk = -1;
        if (!pre || !*pre) {
            TERN_LOG_WARN("tokenizer: no " KEY_PREFIX "pre; using the 'default' pre-tokenizer (quality suffers)");
            pre = "default";
        }
    } else if (!strcmp(model, "llama")) {
        t->model = TERN_TOK_MODEL_SPM;
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
        pre = "default";
    } else {
        return tern_errorf(TERN_ERR_UNSUPPORTED,
                           KEY_PREFIX "model '%s' is not supported (supported: gpt2 = byte-level BPE, llama = SPM)", model);
    }
    t->eot = t->eom = t->sep = t->pad = t->mask = -1;
    t->fim_pre = t->fim_suf = t->fim_mid = t->fim_pad = t->fim_rep = t->fim_sep = -1;
    t->model_name = tern_strdup(model);
    t->pre_name = tern_strdup(pre);
    if (!t->model_name || !t->pre_name) return tern_errorf(TERN_ERR_NOMEM, "no memory");

    if (t->model == TERN_TOK_MODEL_BPE) {
        if ((st = pretok_init(&t->pre, pre, &info))) return st;
        t->ignore_merges = info.ignore_merges;
        t->add_bos = info.add_bos;
        if (info.bos_none) t->bos = -1;
    }
    if ((st = gguf_get_bool_or(f, KEY_PREFIX "add_space_prefix", t->add_space_prefix, &t->add_space_prefix)))
        return st;

    if ((st = load_tokens(t, f))) return st;

    for (int b = 0; b < 256; b++) {
        char buf[8];
        if (t->model == TERN_TOK_MODEL_BPE) {
            size_t k = tern_utf8_encode(bytelevel_cp((uint8_t)b), buf);
            t->byte_tok[b] = strmap_find(&t->vocab, t, buf, k);
        } else {
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            t->byte_tok[b] = find_cstr(t, buf);
            if (t->byte_tok[b] < 0) {
                buf[0] = (char)b;
                t->byte_tok[b] = strmap_find(&t->vocab, t, buf, 1);
            }
        }
    }
    if (t->model == TERN_TOK_MODEL_BPE && (st = load_merges(t, f))) return st;
    if (t->model == TERN_TOK_MODEL_SPM) {
        if (!(t->spm_pairs = tern_calloc(65536 / 8, 1))) return tern_errorf(TERN_ERR_NOMEM, "no memory");
        for (uint32_t id = 0; id < t->n_vocab; id++) {
            const uint8_t *s = (const uint8_t *)tok_text(t, (int32_t)id);
            for (uint32_t i = 1; i < t->text_len[id]; i++) {
                unsigned k = (unsigned)s[i - 1] << 8 | s[i];
                t->spm_pairs[k >> 3] |= (uint8_t)(1u << (k & 7));
            }
        }
    }
    /* Special ids: the defaults above, unless out of range, then the file's keys. */
    int32_t *ids[] = {&t->bos, &t->eos, &t->eot, &t->eom, &t->unk, &t->sep, &t->pad, &t->mask,
                      &t->fim_pre, &t->fim_suf, &t->fim_mid, &t->fim_pad, &t->fim_rep, &t->fim_sep,
                      &t->fim_pre, &t->fim_suf, &t->fim_mid};
    static const char *const keys[] = {
        KEY_PREFIX "bos_token_id", KEY_PREFIX "eos_token_id", KEY_PREFIX "eot_token_id", KEY_PREFIX "eom_token_id",
        KEY_PREFIX "unknown_token_id", KEY_PREFIX "seperator_token_id", KEY_PREFIX "padding_token_id",
        KEY_PREFIX "mask_token_id", KEY_PREFIX "fim_pre_token_id", KEY_PREFIX "fim_suf_token_id",
        KEY_PREFIX "fim_mid_token_id", KEY_PREFIX "fim_pad_token_id", KEY_PREFIX "fim_rep_token_id",
        KEY_PREFIX "fim_sep_token_id", KEY_PREFIX "prefix_token_id", KEY_PREFIX "suffix_token_id",
        KEY_PREFIX "middle_token_id"};
    for (size_t i = 0; i < TERN_ARRAY_LEN(keys); i++) {
        if (*ids[i] >= 0 && !in_vocab(t, *ids[i])) *ids[i] = -1;
        if ((st = get_id(f, keys[i], t->n_vocab, ids[i]))) return st;
    }
    if ((st = gguf_get_bool_or(f, KEY_PREFIX "add_bos_token", t->add_bos, &t->add_bos))) return st;
    if ((st = gguf_get_bool_or(f, KEY_PREFIX "add_eos_token", t->add_eos, &t->add_eos))) return st;
    if (t->add_bos && t->bos < 0)
        return tern_errorf(TERN_ERR_FORMAT, KEY_PREFIX "add_bos_token is true, but " KEY_PREFIX "bos_token_id is not set");
    if (t->add_eos && t->eos < 0)
        return tern_errorf(TERN_ERR_FORMAT, KEY_PREFIX "add_eos_token is true, but " KEY_PREFIX "eos_token_id is not set");

    detect_special(t, &t->eot, eot_texts);
    detect_special(t, &t->eom, eom_texts);
    detect_special(t, &t->fim_pre, fim_pre_texts);
    detect_special(t, &t->fim_suf, fim_suf_texts);
    detect_special(t, &t->fim_mid, fim_mid_texts);
    detect_special(t, &t->fim_pad, fim_pad_texts);
    detect_special(t, &t->fim_rep, fim_rep_texts);
    detect_special(t, &t->fim_sep, fim_sep_texts);
    for (uint32_t id = 0; id < t->n_vocab; id++)
        if ((t->attrs[id] & ATTR_CONTROL) && strstr(tok_text(t, (int32_t)id), "unused")) t->attrs[id] |= ATTR_UNUSED;

    if ((st = build_eog(t))) return st;
    if ((st = build_specials(t))) return st;
    if ((st = build_pieces(t))) return st;
    apply_name_attrs(t, f);
    return TERN_OK;
}

enum tern_status tern_tokenizer_load(const struct gguf_file *f, struct tern_tokenizer **out) {
    if (!out) return tern_errorf(TERN_ERR_INVALID, "tern_tokenizer_load: out is NULL");
    *out = NULL;
    if (!f) return tern_errorf(TERN_ERR_INVALID, "tern_tokenizer_load: no file");
    struct tern_tokenizer *t = tern_calloc(1, sizeof *t);
    if (!t) return tern_errorf(TERN_ERR_NOMEM, "no memory for a tokenizer");
    enum tern_status st = load(t, f);
    if (st) {
        tern_tokenizer_free(t);
        return tern_error_prefix(st, "tokenizer");
    }
    TERN_LOG_DEBUG("tokenizer: %s/%s, %u tokens, %zu merges, %zu special, %zu end-of-generation", t->model_name,
                   t->pre_name, t->n_vocab, t->merges.n, t->n_specials, t->n_eog);
    *out = t;
    return TERN_OK;
}

enum tern_status tern_tokenizer_load_file(const char *path, struct tern_tokenizer **out) {
    if (!out) return tern_errorf(TERN_ERR_INVALID, "tern_tokenizer_load_file: out is NULL");
    *out = NULL;
    struct gguf_open_opts opts = {.no_data = true};
    struct gguf_file *f;
    enum tern_status st = gguf_open(path, &opts, &f);
    if (st) return st;
    st = tern_tokenizer_load(f, out);
    gguf_close(f);
    if (st) return tern_error_prefix(st, "%s", path);
    return TERN_OK;
}

void tern_tokenizer_free(struct tern_tokenizer *t) {
    if (!t) return;
    free(t->model_name);
    free(t->pre_name);
    free(t->text_pool);
    free(t->text_off);
    free(t->text_len);
    free(t->scores);
    free(t->types);
    free(t->attrs);
    strmap_free(&t->vocab);
    free(t->piece_pool);
    free(t->piece_off);
    free(t->piece_len);
    free(t->piece_kind);
    pairmap_free(&t->merges);
    pretok_free(&t->pre);
    free(t->eog);
    free(t->eog_bits);
    free(t->specials);
    free(t->trie);
    free(t->spm_pairs);
    free(t);
}

/* ---- accessors -------------------------------------------------------------------- */

uint32_t tern_tokenizer_n_vocab(const struct tern_tokenizer *t) { return t->n_vocab; }
enum tern_tok_model tern_tokenizer_model(const struct tern_tokenizer *t) { return t->model; }
const char *tern_tokenizer_model_name(const struct tern_tokenizer *t) { return t->model_name; }
const char *tern_tokenizer_pre(const struct tern_tokenizer *t) { return t->pre_name; }
int32_t tern_token_bos(const struct tern_tokenizer *t) { return t->bos; }
int32_t tern_token_eos(const struct tern_tokenizer *t) { return t->eos; }
int32_t tern_token_eot(const struct tern_tokenizer *t) { return t->eot; }
int32_t tern_token_pad(const struct tern_tokenizer *t) { return t->pad; }
int32_t tern_token_unk(const struct tern_tokenizer *t) { return t->unk; }
bool tern_tokenizer_add_bos(const struct tern_tokenizer *t) { return t->add_bos; }
bool tern_tokenizer_add_eos(const struct tern_tokenizer *t) { return t->add_eos; }
bool tern_tokenizer_add_space_prefix(const struct tern_tokenizer *t) { return t->add_space_prefix; }

bool tern_token_is_eog(const struct tern_tokenizer *t, int32_t id) { return eog_has(t, id); }

bool tern_token_is_control(const struct tern_tokenizer *t, int32_t id) {
    return in_vocab(t, id) && (t->attrs[id] & ATTR_CONTROL);
}

int32_t tern_token_type(const struct tern_tokenizer *t, int32_t id) { return in_vocab(t, id) ? t->types[id] : -1; }

float tern_token_score(const struct tern_tokenizer *t, int32_t id) { return in_vocab(t, id) ? t->scores[id] : 0.0f; }

const char *tern_token_text(const struct tern_tokenizer *t, int32_t id, size_t *len) {
    if (!in_vocab(t, id)) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->text_len[id];
    return tok_text(t, id);
}

int32_t tern_token_find(const struct tern_tokenizer *t, const char *text, size_t len) {
    if (!text && len) return -1;
    return strmap_find(&t->vocab, t, text ? text : "", len);
}

size_t tern_tokenizer_special_tokens(const struct tern_tokenizer *t, const int32_t **ids) {
    if (ids) *ids = t->specials;
    return t->n_specials;
}

size_t tern_tokenizer_eog_tokens(const struct tern_tokenizer *t, const int32_t **ids) {
    if (ids) *ids = t->eog;
    return t->n_eog;
}

/* ---- tokenize: special-token partition --------------------------------------------- */

struct occ {
    uint32_t prio; /* index into specials[] */
    size_t pos;
};

struct seg {
    size_t start, end;
    int32_t tok; /* -1: raw text [start, end) */
};

static int cmp_occ(const void *a, const void *b) {
    const struct occ *x = a, *y = b;
    if (x->prio != y->prio) return x->prio < y->prio ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static bool special_active(const struct tern_tokenizer *t, int32_t id, bool parse_special) {
    return parse_special || !(t->attrs[id] & (ATTR_CONTROL | ATTR_UNKNOWN));
}

/* Whether [a, b) overlaps a plain range (c->plain sorted; *hint: a search position
 * that only moves forward, as occurrences are found left to right). */
static bool in_plain(const struct tok_call *c, size_t a, size_t b, size_t *hint) {
    size_t i = *hint;
    while (i < c->n_plain && c->plain[i].end <= a) i++;
    *hint = i;
    return i < c->n_plain && c->plain[i].start < b;
}

static bool c_isspace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

static enum tern_status process_raw(struct tok_call *c, const char *s, size_t n, bool *prev_special) {
    enum tern_status st;
    if (c->t->model == TERN_TOK_MODEL_SPM)
        st = spm_tokenize(c, s, n, c->t->add_space_prefix && *prev_special);
    else
        st = bpe_tokenize(c, s, n);
    *prev_special = false;
    return st;
}

/* Splits text at special tokens exactly as llama.cpp's tokenizer_st_partition does:
 * for each special token, longest first, every leftmost non-overlapping occurrence
 * inside a still-raw fragment becomes a token fragment. Done here by first finding all
 * occurrences (one pass over the text with a trie), then replaying that order. */
static enum tern_status partition(struct tok_call *c, const char *text, size_t len, bool parse_special) {
    const struct tern_tokenizer *t = c->t;
    struct occ *occ = NULL;
    size_t n_occ = 0, occ_cap = 0;
    struct seg *segs = NULL, *next = NULL;
    size_t n_segs = 0, segs_cap = 0, next_cap = 0;
    bool prev_special = true;
    enum tern_status st = TERN_OK;
    size_t plain_hint = 0;

    if (t->n_specials) {
        const uint8_t *p = (const uint8_t *)text;
        for (size_t i = 0; i < len; i++) {
            if (t->n_special_first == 1) {
                /* Usually every special text starts with '<': memchr is far faster. */
                const uint8_t *q = memchr(p + i, t->special_first_byte, len - i);
                if (!q) break;
                i = (size_t)(q - p);
            } else if (!((t->special_first[p[i] >> 3] >> (p[i] & 7)) & 1)) {
                continue;
            }
            int32_t node = 0;
            for (size_t j = i; j < len; j++) {
                int32_t ch = t->trie[node].child;
                while (ch >= 0 && t->trie[ch].byte != p[j]) ch = t->trie[ch].sibling;
                if (ch < 0) break;
                node = ch;
                int32_t k = t->trie[node].special;
                if (k >= 0 && special_active(t, t->specials[k], parse_special) &&
                    !(c->n_plain && (t->attrs[t->specials[k]] & (ATTR_CONTROL | ATTR_UNKNOWN)) &&
                      in_plain(c, i, j + 1, &plain_hint))) {
                    if ((st = tok_grow((void **)&occ, &occ_cap, n_occ + 1, sizeof *occ))) goto done;
                    occ[n_occ++] = (struct occ){.prio = (uint32_t)k, .pos = i};
                }
            }
        }
    }
    if (!n_occ) {
        st = process_raw(c, text, len, &prev_special);
        goto done;
    }
    qsort(occ, n_occ, sizeof *occ, cmp_occ);
    if ((st = tok_grow((void **)&segs, &segs_cap, 1, sizeof *segs))) goto done;
    segs[n_segs++] = (struct seg){0, len, -1};
    for (size_t g = 0; g < n_occ;) {
        size_t ge = g;
        while (ge < n_occ && occ[ge].prio == occ[g].prio) ge++;
        int32_t id = t->specials[occ[g].prio];
        size_t tl = t->text_len[id];
        uint16_t a = t->attrs[id];
        size_t n_next = 0, k = g;
        for (size_t si = 0; si < n_segs; si++) {
            struct seg sg = segs[si];
            if (sg.tok >= 0) {
                if ((st = tok_grow((void **)&next, &next_cap, n_next + 1, sizeof *next))) goto done;
                next[n_next++] = sg;
                continue;
            }
            size_t cur = sg.start;
            for (;;) {
                while (k < ge && occ[k].pos < cur) k++;
                if (k == ge || occ[k].pos + tl > sg.end) {
                    if (cur < sg.end) {
                        if ((st = tok_grow((void **)&next, &next_cap, n_next + 1, sizeof *next))) goto done;
                        next[n_next++] = (struct seg){cur, sg.end, -1};
                    }
                    break;
                }
                size_t pos = occ[k++].pos, left_end = pos;
                if (a & ATTR_LSTRIP)
                    while (left_end > cur && c_isspace(text[left_end - 1])) left_end--;
                if ((st = tok_grow((void **)&next, &next_cap, n_next + 2, sizeof *next))) goto done;
                if (left_end > cur) next[n_next++] = (struct seg){cur, left_end, -1};
                next[n_next++] = (struct seg){pos, pos + tl, id};
                cur = pos + tl;
                if (a & ATTR_RSTRIP)
                    while (cur < sg.end && c_isspace(text[cur])) cur++;
                if (cur >= sg.end) break;
            }
        }
        struct seg *tmp = segs;
        segs = next;
        next = tmp;
        size_t tc = segs_cap;
        segs_cap = next_cap;
        next_cap = tc;
        n_segs = n_next;
        g = ge;
    }
    for (size_t si = 0; si < n_segs && !st; si++) {
        if (segs[si].tok >= 0) {
            st = tok_emit(c, segs[si].tok);
            prev_special = true;
        } else {
            st = process_raw(c, text + segs[si].start, segs[si].end - segs[si].start, &prev_special);
        }
    }
done:
    free(occ);
    free(segs);
    free(next);
    return st;
}

/* Texts up to this size are tokenized without a pre-token cache (it would cost more
 * than it saves). */
#define CACHE_MIN_TEXT 4096

static enum tern_status tokenize_impl(const struct tern_tokenizer *t, const char *text, size_t len, int flags,
                                      const struct tern_tok_range *plain, size_t n_plain, int32_t **ids, size_t *n,
                                      size_t *cap, struct tern_tok_stats *stats) {
    if (!t || !ids || !n || !cap || (!text && len))
        return tern_errorf(TERN_ERR_INVALID, "tern_tokenize: NULL argument");
    if (len > (size_t)INT32_MAX)
        return tern_errorf(TERN_ERR_LIMIT, "text of %zu bytes exceeds the tokenizer's limit of %d bytes", len,
                           INT32_MAX);
    if (*n > *cap || (*cap && !*ids)) return tern_errorf(TERN_ERR_INVALID, "tern_tokenize: inconsistent id array");
    size_t n0 = *n;
    struct tok_call c = {.t = t, .out = {ids, n, cap}, .stats = stats, .plain = plain, .n_plain = n_plain};
    enum tern_status st = TERN_OK;
    bool add_special = flags & TERN_TOK_ADD_SPECIAL;
    if (add_special && t->add_bos) st = tok_emit(&c, t->bos);
    if (!st && len) {
        c.use_cache = len >= CACHE_MIN_TEXT;
        st = partition(&c, text, len, flags & TERN_TOK_PARSE_SPECIAL);
    }
    if (!st && add_special && t->add_eos) st = tok_emit(&c, t->eos);
    tok_call_release(&c);
    if (st) *n = n0;
    return st;
}

enum tern_status tern_tokenize_ex(const struct tern_tokenizer *t, const char *text, size_t len, int flags,
                                  int32_t **ids, size_t *n, size_t *cap, struct tern_tok_stats *stats) {
    return tokenize_impl(t, text, len, flags, NULL, 0, ids, n, cap, stats);
}

enum tern_status tern_tokenize(const struct tern_tokenizer *t, const char *text, size_t len, int flags,
                               int32_t **ids, size_t *n, size_t *cap) {
    return tern_tokenize_ex(t, text, len, flags, ids, n, cap, NULL);
}

enum tern_status tern_tokenize_plain(const struct tern_tokenizer *t, const char *text, size_t len, int flags,
                                     const struct tern_tok_range *plain, size_t n_plain, int32_t **ids, size_t *n,
                                     size_t *cap) {
    for (size_t i = 0; i < n_plain; i++)
        if (plain[i].end < plain[i].start || (i && plain[i].start < plain[i - 1].end))
            return tern_errorf(TERN_ERR_INVALID, "tern_tokenize_plain: range %zu [%zu, %zu) is not sorted and disjoint", i,
                               plain[i].start, plain[i].end);
    return tokenize_impl(t, text, len, flags, plain, n_plain, ids, n, cap, NULL);
}
