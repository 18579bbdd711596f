/* SentencePiece BPE (tokenizer.ggml.model = "llama"), as llama.cpp's SPM tokenizer:
 * spaces become U+2581, the text is split into UTF-8 characters, and adjacent symbols
 * whose concatenation is a token merge, highest token score first (the leftmost pair
 * on ties). What is left and is not a token is emitted as <0xNN> byte tokens.
 *
 * Symbols stay contiguous in the buffer, so a candidate pair's text is a substring
 * and no string is built per lookup. The heap uses lazy deletion: an entry is stale
 * when either symbol was merged away or grew (their lengths no longer add up). */
#include "tokenizer/tok-internal.h"

#include "util/utf8.h"

#include <string.h>

struct ssym {
    uint32_t start, len; /* len 0: merged into its left neighbour */
    int32_t prev, next;
};

struct sheap {
    float score;
    int32_t left, right;
    uint32_t size;
};

/* Higher score first; on equal scores the smaller left index. */
static inline bool before(const struct sheap *a, const struct sheap *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void sheap_push(struct sheap *h, size_t *n, struct sheap e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static struct sheap sheap_pop(struct sheap *h, size_t *n) {
    struct sheap top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= m) break;
        size_t s = l + 1 < m && before(&h[l + 1], &h[l]) ? l + 1 : l;
        if (!before(&h[s], &last)) break;
        h[i] = h[s];
        i = s;
    }
    if (m) h[i] = last;
    return top;
}

static void try_pair(struct tok_call *c, const char *buf, struct ssym *s, struct sheap *h, size_t *nh, int32_t l,
                     int32_t r) {
    if (l < 0 || r < 0) return;
    uint32_t size = s[l].len + s[r].len;
    if (c->stats) c->stats->n_pair_lookups++;
    int32_t id = strmap_find(&c->t->vocab, c->t, buf + s[l].start, size);
    if (id < 0) return;
    sheap_push(h, nh, (struct sheap){c->t->scores[id], l, r, size});
    if (c->stats) c->stats->n_heap_ops++;
}

/* Merges and emits buf[from..to). */
static enum tern_status spm_chunk(struct tok_call *c, const char *buf, size_t from, size_t to) {
    const struct tern_tokenizer *t = c->t;
    enum tern_status st;
    size_t n = to - from;
    uint64_t hash = 0;
    if (tok_cache_get(c, buf + from, n, &hash, &st)) return st;
    size_t out0 = *c->out.n;
    if ((st = tok_grow(&c->sym, &c->sym_cap, n, sizeof(struct ssym))) ||
        (st = tok_grow(&c->heap, &c->heap_cap, 3 * n, sizeof(struct sheap))))
        return st;
    struct ssym *s = c->sym;
    struct sheap *h = c->heap;
    size_t ns = 0, nh = 0;
    for (size_t off = from; off < to;) {
        /* One symbol per character. llama.cpp takes the length from the first byte
         * alone, so an invalid lead byte swallows what follows (even a U+2581 that
         * stood for a space, which then decodes as U+2581): an ill-formed byte is a
         * symbol of its own here. The same for valid UTF-8. */
        size_t cl = 1;
        if ((uint8_t)buf[off] >= 0x80) {
            size_t bad;
            cl = tern_utf8_seq((const uint8_t *)buf + off, to - off, &bad);
            if (!cl) cl = 1;
        }
        s[ns] = (struct ssym){(uint32_t)off, (uint32_t)cl, (int32_t)ns - 1, off + cl < to ? (int32_t)ns + 1 : -1};
        ns++;
        off += cl;
    }
    for (size_t i = 1; i < ns; i++) try_pair(c, buf, s, h, &nh, (int32_t)i - 1, (int32_t)i);
    while (nh) {
        struct sheap e = sheap_pop(h, &nh);
        if (c->stats) c->stats->n_heap_ops++;
        struct ssym *l = &s[e.left], *r = &s[e.right];
        if (!l->len || !r->len || l->len + r->len != e.size) continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = e.left;
        if (c->stats) c->stats->n_merges++;
        try_pair(c, buf, s, h, &nh, l->prev, e.left);
        try_pair(c, buf, s, h, &nh, e.left, l->next);
    }
    for (int32_t i = 0; i >= 0; i = s[i].next) {
        int32_t id = strmap_find(&t->vocab, t, buf + s[i].start, s[i].len);
        if (id >= 0) {
            if ((st = tok_emit(c, id))) return st;
            continue;
        }
        for (uint32_t j = 0; j < s[i].len; j++) {
            int32_t b = t->byte_tok[(uint8_t)buf[s[i].start + j]];
            if (b < 0) b = t->unk;
            if (b >= 0 && (st = tok_emit(c, b))) return st;
        }
    }
    tok_cache_put(c, buf + from, n, hash, *c->out.ids + out0, *c->out.n - out0);
    return TERN_OK;
}

enum tern_status spm_tokenize(struct tok_call *c, const char *text, size_t len, bool prefix_space) {
    const struct tern_tokenizer *t = c->t;
    enum tern_status st;
    if (c->stats) c->stats->n_words++;
    /* ' ' -> U+2581 (3 bytes), plus the dummy prefix. */
    size_t cap = 3 * (len + 1);
    if ((st = tok_grow((void **)&c->buf, &c->buf_cap, cap, 1))) return st;
    char *buf = c->buf;
    size_t n = 0;
    if (prefix_space) {
        memcpy(buf, "\xE2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + n, "\xE2\x96\x81", 3);
            n += 3;
        } else {
            buf[n++] = text[i];
        }
    }
    if (n > UINT32_MAX / 4) return tern_errorf(TERN_ERR_LIMIT, "SPM fragment of %zu bytes is too long", n);
    /* Where no token contains the two bytes on either side of a character boundary,
     * no merge can ever cross it: the text on either side is merged independently,
     * with the same result and small heaps (for llama vocabularies, word by word:
     * tokens start with U+2581 but never contain it after another character). */
    size_t from = 0;
    for (size_t i = 1; i < n; i++) {
        uint8_t y = (uint8_t)buf[i];
        if ((y & 0xC0) == 0x80) continue;
        unsigned k = (unsigned)(uint8_t)buf[i - 1] << 8 | y;
        if ((t->spm_pairs[k >> 3] >> (k & 7)) & 1) continue;
        if ((st = spm_chunk(c, buf, from, i))) return st;
        from = i;
    }
    if (n > from) return spm_chunk(c, buf, from, n);
    return TERN_OK;
}
