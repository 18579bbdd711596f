/* Byte-level BPE: pre-tokenization with PCRE2, then merges within each pre-token.
 *
 * Merging works on token ids, not strings: a pre-token's bytes start as the tokens of
 * their GPT-2 characters, and the merge table maps (left id, right id) to (rank, result
 * id). At each step the adjacent pair with the lowest rank is merged, the leftmost one
 * on ties -- the order llama.cpp's priority queue produces. Short pre-tokens (the
 * usual case) use a scan over a small array; long ones a binary heap with lazy
 * deletion, so that a megabyte without a space costs O(n log n), not O(n^2).
 *
 * A per-call cache maps pre-tokens to their ids for long texts, where words repeat. */
#include "tokenizer/tok-internal.h"

#define XXH_INLINE_ALL
#include "util/hash.h"
#include "util/mem.h"

#include <stdlib.h>
#include <string.h>

/* ---- per-call pre-token cache ------------------------------------------------------
 *
 * Direct-mapped, one cache line per entry, the word and its ids inline: a lookup costs
 * one (L2-resident) memory access. A colliding word simply replaces the old one, so
 * the cache follows the text (words are Zipf-distributed: a few thousand entries
 * catch most of them). */

#define WC_SLOTS (1u << 14)
#define WC_KEY 24
#define WC_IDS 8

struct wc_slot {
    uint32_t tag;  /* high half of the word's hash */
    uint8_t len;   /* word length; 0 = empty */
    uint8_t n_ids;
    char key[WC_KEY];
    int32_t ids[WC_IDS];
};

struct word_cache {
    struct wc_slot slots[WC_SLOTS];
};

static void wc_free(struct word_cache *wc) { free(wc); }

static const struct wc_slot *wc_find(const struct word_cache *wc, const char *w, size_t n, uint64_t h) {
    const struct wc_slot *s = &wc->slots[h & (WC_SLOTS - 1)];
    if (s->len == n && s->tag == (uint32_t)(h >> 32) && !memcmp(s->key, w, n)) return s;
    return NULL;
}

static void wc_insert(struct word_cache *wc, const char *w, size_t n, uint64_t h, const int32_t *ids, size_t n_ids) {
    if (n_ids > WC_IDS) return;
    struct wc_slot *s = &wc->slots[h & (WC_SLOTS - 1)];
    s->tag = (uint32_t)(h >> 32);
    s->len = (uint8_t)n;
    s->n_ids = (uint8_t)n_ids;
    memcpy(s->key, w, n);
    memcpy(s->ids, ids, n_ids * sizeof *ids);
}

static bool wc_usable(struct tok_call *c, size_t n) {
    if (!c->use_cache || n > WC_KEY) return false;
    if (!c->cache) {
        /* Best effort: without memory for it, go on without a cache. */
        c->cache = tern_calloc(1, sizeof *c->cache);
        if (!c->cache) c->use_cache = false;
    }
    return c->cache != NULL;
}

bool tok_cache_get(struct tok_call *c, const char *w, size_t n, uint64_t *h, enum tern_status *st) {
    *st = TERN_OK;
    if (!wc_usable(c, n)) return false;
    *h = tern_hash64(w, n);
    const struct wc_slot *e = wc_find(c->cache, w, n, *h);
    if (!e) return false;
    if (c->stats) c->stats->n_cache_hits++;
    *st = tok_emit_n(c, e->ids, e->n_ids);
    return true;
}

void tok_cache_put(struct tok_call *c, const char *w, size_t n, uint64_t h, const int32_t *ids, size_t n_ids) {
    if (c->cache && n <= WC_KEY) wc_insert(c->cache, w, n, h, ids, n_ids);
}

void tok_call_release(struct tok_call *c) {
    for (int i = 0; i < TOK_MAX_REGEX; i++) pcre2_match_data_free(c->md[i]);
    pcre2_match_context_free(c->mctx);
    pcre2_jit_stack_free(c->jstack);
    free(c->sym);
    free(c->heap);
    free(c->buf);
    wc_free(c->cache);
    memset(c, 0, sizeof *c);
}

/* ---- merging ------------------------------------------------------------------------- */

static inline const struct pairslot *lookup(struct tok_call *c, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return NULL;
    if (c->stats) c->stats->n_pair_lookups++;
    return pairmap_find(&c->t->merges, l, r);
}

/* A symbol whose text is not a token (a byte missing from the vocabulary, or a merge
 * whose result is not a token) falls back to the tokens of its single bytes. */
static enum tern_status emit_bytes(struct tok_call *c, const uint8_t *w, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = c->t->byte_tok[w[i]];
        if (id >= 0) {
            enum tern_status st = tok_emit(c, id);
            if (st) return st;
        }
    }
    return TERN_OK;
}

#define SMALL_WORD 40

/* Pre-tokens of up to SMALL_WORD bytes: O(n^2) scans of a tiny array beat a heap. The
 * resulting ids go to out[] (at most n), their byte starts to start[]. */
static size_t merge_small(struct tok_call *c, const uint8_t *w, size_t n, int32_t *id, uint32_t *start) {
    const struct tern_tokenizer *t = c->t;
    uint32_t rank[SMALL_WORD];
    int32_t res[SMALL_WORD];
    size_t m = n;
    for (size_t i = 0; i < n; i++) {
        id[i] = t->byte_tok[w[i]];
        start[i] = (uint32_t)i;
    }
    start[n] = (uint32_t)n;
    for (size_t i = 0; i + 1 < m; i++) {
        const struct pairslot *p = lookup(c, id[i], id[i + 1]);
        rank[i] = p ? p->rank : UINT32_MAX;
        res[i] = p ? p->result : -1;
    }
    while (m > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < m; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == UINT32_MAX) break;
        id[best] = res[best];
        memmove(id + best + 1, id + best + 2, (m - best - 2) * sizeof *id);
        memmove(start + best + 1, start + best + 2, (m - best - 1) * sizeof *start);
        memmove(rank + best, rank + best + 1, (m - best - 2) * sizeof *rank);
        memmove(res + best, res + best + 1, (m - best - 2) * sizeof *res);
        m--;
        if (c->stats) c->stats->n_merges++;
        if (best > 0) {
            const struct pairslot *p = lookup(c, id[best - 1], id[best]);
            rank[best - 1] = p ? p->rank : UINT32_MAX;
            res[best - 1] = p ? p->result : -1;
        }
        if (best + 1 < m) {
            const struct pairslot *p = lookup(c, id[best], id[best + 1]);
            rank[best] = p ? p->rank : UINT32_MAX;
            res[best] = p ? p->result : -1;
        }
    }
    return m;
}

struct bsym {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* bytes; 0 once merged into its left neighbour */
};

struct bheap {
    uint64_t key; /* rank << 32 | left symbol: the lowest pops first */
    int32_t lid, rid;
};

static void heap_push(struct bheap *h, size_t *n, struct bheap e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].key <= e.key) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static struct bheap heap_pop(struct bheap *h, size_t *n) {
    struct bheap top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= m) break;
        size_t s = l + 1 < m && h[l + 1].key < h[l].key ? l + 1 : l;
        if (h[s].key >= last.key) break;
        h[i] = h[s];
        i = s;
    }
    if (m) h[i] = last;
    return top;
}

static void push_pair(struct tok_call *c, struct bsym *s, struct bheap *h, size_t *nh, int32_t l) {
    if (l < 0 || s[l].next < 0) return;
    int32_t r = s[l].next;
    const struct pairslot *p = lookup(c, s[l].id, s[r].id);
    if (!p) return;
    heap_push(h, nh, (struct bheap){((uint64_t)p->rank << 32) | (uint32_t)l, s[l].id, s[r].id});
    if (c->stats) c->stats->n_heap_ops++;
}

static enum tern_status merge_large(struct tok_call *c, const uint8_t *w, size_t n) {
    const struct tern_tokenizer *t = c->t;
    enum tern_status st;
    /* Every merge pushes at most two pairs, so n - 1 + 2 (n - 1) bounds the heap. */
    if ((st = tok_grow(&c->sym, &c->sym_cap, n, sizeof(struct bsym))) ||
        (st = tok_grow(&c->heap, &c->heap_cap, 3 * n, sizeof(struct bheap))))
        return st;
    struct bsym *s = c->sym;
    struct bheap *h = c->heap;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++)
        s[i] = (struct bsym){t->byte_tok[w[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, 1};
    for (size_t i = 0; i + 1 < n; i++) push_pair(c, s, h, &nh, (int32_t)i);
    while (nh) {
        struct bheap e = heap_pop(h, &nh);
        if (c->stats) c->stats->n_heap_ops++;
        int32_t l = (int32_t)(uint32_t)e.key;
        /* Stale entries: the left symbol was merged away or changed, or its right
         * neighbour changed (a symbol's id changes whenever it grows). */
        if (!s[l].len || s[l].id != e.lid || s[l].next < 0) continue;
        int32_t r = s[l].next;
        if (s[r].id != e.rid) continue;
        const struct pairslot *p = pairmap_find(&t->merges, s[l].id, s[r].id);
        s[l].id = p->result;
        s[l].len += s[r].len;
        s[r].len = 0;
        s[l].next = s[r].next;
        if (s[r].next >= 0) s[s[r].next].prev = l;
        if (c->stats) c->stats->n_merges++;
        push_pair(c, s, h, &nh, s[l].prev);
        push_pair(c, s, h, &nh, l);
    }
    for (int32_t i = 0, pos = 0; i >= 0; pos += (int32_t)s[i].len, i = s[i].next) {
        st = s[i].id >= 0 ? tok_emit(c, s[i].id) : emit_bytes(c, w + pos, s[i].len);
        if (st) return st;
    }
    return TERN_OK;
}

static enum tern_status bpe_word(struct tok_call *c, const char *word, size_t n) {
    const struct tern_tokenizer *t = c->t;
    const uint8_t *w = (const uint8_t *)word;
    enum tern_status st;
    if (c->stats) c->stats->n_words++;
    if (n == 1) {
        int32_t id = t->byte_tok[w[0]];
        return id >= 0 ? tok_emit(c, id) : TERN_OK;
    }
    uint64_t h = 0;
    bool cacheable = wc_usable(c, n);
    if (cacheable) {
        h = tern_hash64(w, n);
        const struct wc_slot *e = wc_find(c->cache, word, n, h);
        if (e) {
            if (c->stats) c->stats->n_cache_hits++;
            return tok_emit_n(c, e->ids, e->n_ids);
        }
    }
    if (t->ignore_merges) {
        /* A pre-token that is a token as a whole is that token (llama3). */
        if ((st = tok_grow((void **)&c->buf, &c->buf_cap, 2 * n, 1))) return st;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t cp = bytelevel_cp(w[i]);
            if (cp < 0x80) {
                c->buf[k++] = (char)cp;
            } else {
                c->buf[k++] = (char)(0xC0 | (cp >> 6));
                c->buf[k++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        int32_t id = strmap_find(&t->vocab, t, c->buf, k);
        if (id >= 0) {
            if (cacheable) wc_insert(c->cache, word, n, h, &id, 1);
            return tok_emit(c, id);
        }
    }
    if (c->stats) c->stats->n_bpe_words++;
    if (n > SMALL_WORD) return merge_large(c, w, n);

    int32_t ids[SMALL_WORD];
    uint32_t start[SMALL_WORD + 1];
    size_t m = merge_small(c, w, n, ids, start);
    bool all_tokens = true;
    for (size_t i = 0; i < m; i++) all_tokens &= ids[i] >= 0;
    if (all_tokens) {
        if (cacheable) wc_insert(c->cache, word, n, h, ids, m);
        return tok_emit_n(c, ids, m);
    }
    for (size_t i = 0; i < m; i++) {
        st = ids[i] >= 0 ? tok_emit(c, ids[i]) : emit_bytes(c, w + start[i], start[i + 1] - start[i]);
        if (st) return st;
    }
    return TERN_OK;
}

/* ---- pre-tokenization ----------------------------------------------------------------- */

#define JIT_STACK_MAX (64u << 20)

/* Long runs (a megabyte of letters) can need more JIT stack than PCRE2's default 32
 * KiB; the stack grows on demand, per call (a JIT stack serves one thread). */
static enum tern_status grow_jit_stack(struct tok_call *c) {
    size_t size = c->jstack_size ? c->jstack_size * 8 : (size_t)1 << 20;
    if (size > JIT_STACK_MAX)
        return tern_errorf(TERN_ERR_LIMIT, "pre-tokenizer regex needs more than %u bytes of JIT stack",
                           JIT_STACK_MAX);
    if (!c->mctx && !(c->mctx = pcre2_match_context_create(NULL)))
        return tern_errorf(TERN_ERR_NOMEM, "no memory for a regex match context");
    pcre2_jit_stack *js = pcre2_jit_stack_create(32 * 1024, size, NULL);
    if (!js) return tern_errorf(TERN_ERR_NOMEM, "no memory for a %zu-byte regex JIT stack", size);
    pcre2_jit_stack_assign(c->mctx, NULL, js);
    pcre2_jit_stack_free(c->jstack);
    c->jstack = js;
    c->jstack_size = size;
    return TERN_OK;
}

/* Splits s[0..n) with regex `level` and passes every match and every gap between
 * matches to the next level; after the last level, each piece is a pre-token. */
static enum tern_status split(struct tok_call *c, uint32_t level, const char *s, size_t n) {
    const struct pretok *p = &c->t->pre;
    if (level == p->n_re) return bpe_word(c, s, n);
    pcre2_code *re = p->re[level];
    if (!c->md[level] && !(c->md[level] = pcre2_match_data_create_from_pattern(re, NULL)))
        return tern_errorf(TERN_ERR_NOMEM, "no memory for regex match data");
    pcre2_match_data *md = c->md[level];
    enum tern_status st;
    size_t pos = 0, gap = 0;
    int fast = p->fast_off ? FAST_NONE : p->fast[level];
    while (pos < n) {
        if (fast) {
            long e = pretok_fast_match(fast, (const uint8_t *)s, n, pos);
            if (e == 0) { /* this byte belongs to the gap before the next match */
                pos++;
                continue;
            }
            if (e > 0) {
                if (pos > gap && (st = split(c, level + 1, s + gap, pos - gap))) return st;
                if ((st = split(c, level + 1, s + pos, (size_t)e - pos))) return st;
                pos = gap = (size_t)e;
                continue;
            }
        }
        int rc = p->jit[level] ? pcre2_jit_match(re, (PCRE2_SPTR)s, n, pos, 0, md, c->mctx)
                               : pcre2_match(re, (PCRE2_SPTR)s, n, pos, 0, md, c->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
            if ((st = grow_jit_stack(c))) return st;
            continue;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tern_errorf(TERN_ERR_LIMIT, "pre-tokenizer regex %u failed at byte %zu of a %zu-byte piece: %s",
                               level, pos, n, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* an empty match (no pattern here has one): step over a character */
            pos = ms + 1;
            while (pos < n && ((uint8_t)s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (ms > gap && (st = split(c, level + 1, s + gap, ms - gap))) return st;
        if ((st = split(c, level + 1, s + ms, me - ms))) return st;
        pos = gap = me;
    }
    if (gap < n) return split(c, level + 1, s + gap, n - gap);
    return TERN_OK;
}

enum tern_status bpe_tokenize(struct tok_call *c, const char *text, size_t len) { return split(c, 0, text, len); }
