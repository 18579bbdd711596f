/* Hash tables of the tokenizer: vocabulary text -> id and merge pair -> rank. Both are
 * open addressing with linear probing at a load factor below 0.62, sized once at
 * load (the tokenizer is immutable afterwards), and hashed with xxh3. Lookups are
 * dominated by cache misses, so a slot carries what a probe needs. */
#include "tokenizer/tok-internal.h"

/* The hash is on the hot path of every lookup: let the compiler inline xxh3. */
#define XXH_INLINE_ALL
#include "util/hash.h"
#include "util/mem.h"

#include <stdlib.h>
#include <string.h>

static size_t table_size(size_t n) {
    size_t sz = 16;
    while (sz < n + n / 2 + n / 8 + 1) sz <<= 1;
    return sz;
}

enum tern_status strmap_init(struct strmap *m, size_t n) {
    size_t sz = table_size(n);
    m->slots = tern_calloc(sz, sizeof *m->slots);
    m->mask = sz - 1;
    if (!m->slots) {
        return tern_errorf(TERN_ERR_NOMEM, "no memory for a vocabulary table of %zu entries", sz);
    }
    return TERN_OK;
}

void strmap_free(struct strmap *m) {
    free(m->slots);
    m->slots = NULL;
}

int32_t strmap_insert_h(struct strmap *m, const struct tern_tokenizer *t, int32_t id, uint64_t h) {
    const char *s = t->text_pool + t->text_off[id];
    size_t n = t->text_len[id];
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        struct strslot *sl = &m->slots[i];
        if (!sl->id1) {
            *sl = (struct strslot){(uint32_t)id + 1, tag, t->text_off[id], (uint32_t)n};
            return -1;
        }
        if (sl->tag == tag && sl->len == n && !memcmp(t->text_pool + sl->off, s, n)) return (int32_t)(sl->id1 - 1);
    }
}

uint64_t strmap_hash(const char *s, size_t n) { return tern_hash64(s, n); }

void strmap_prefetch(const struct strmap *m, uint64_t h) { __builtin_prefetch(&m->slots[h & m->mask]); }

/* The text of the first occupied slot on h's probe path (to prefetch it). */
const char *strmap_first_text(const struct strmap *m, const struct tern_tokenizer *t, uint64_t h) {
    const struct strslot *sl = &m->slots[h & m->mask];
    return sl->id1 ? t->text_pool + sl->off : NULL;
}

int32_t strmap_find(const struct strmap *m, const struct tern_tokenizer *t, const char *s, size_t n) {
    return strmap_find_h(m, t, s, n, tern_hash64(s, n));
}

int32_t strmap_find_h(const struct strmap *m, const struct tern_tokenizer *t, const char *s, size_t n, uint64_t h) {
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const struct strslot *sl = &m->slots[i];
        if (!sl->id1) return -1;
        if (sl->tag == tag && sl->len == n && !memcmp(t->text_pool + sl->off, s, n)) return (int32_t)(sl->id1 - 1);
    }
}

enum tern_status pairmap_init(struct pairmap *m, size_t n) {
    size_t sz = table_size(n);
    m->slots = tern_calloc(sz, sizeof *m->slots);
    m->mask = sz - 1;
    m->n = 0;
    if (!m->slots) return tern_errorf(TERN_ERR_NOMEM, "no memory for a merge table of %zu entries", sz);
    return TERN_OK;
}

void pairmap_free(struct pairmap *m) {
    free(m->slots);
    m->slots = NULL;
}

static inline uint64_t pair_key(int32_t l, int32_t r) {
    return ((uint64_t)((uint32_t)l + 1) << 32) | ((uint32_t)r + 1);
}

uint64_t pairmap_hash(int32_t l, int32_t r) {
    uint64_t key = pair_key(l, r);
    return tern_hash64(&key, sizeof key);
}

void pairmap_prefetch(const struct pairmap *m, uint64_t h) { __builtin_prefetch(&m->slots[h & m->mask], 1); }

void pairmap_insert_h(struct pairmap *m, int32_t l, int32_t r, uint32_t rank, int32_t result, uint64_t h) {
    uint64_t key = pair_key(l, r);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        struct pairslot *s = &m->slots[i];
        if (!s->key) {
            s->key = key;
            s->rank = rank;
            s->result = result;
            m->n++;
            return;
        }
        if (s->key == key) return; /* the first (lowest) rank wins */
    }
}

const struct pairslot *pairmap_find(const struct pairmap *m, int32_t l, int32_t r) {
    uint64_t key = pair_key(l, r);
    uint64_t h = tern_hash64(&key, sizeof key);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const struct pairslot *s = &m->slots[i];
        if (s->key == key) return s;
        if (!s->key) return NULL;
    }
}
