#include "cache/fingerprint.h"

#include "util/hash.h"
#include "util/mem.h"

#include <stdlib.h>
#include <string.h>

static uint64_t segment_hash(uint64_t prev, const int32_t *seg, size_t len) {
    /* first and last FP_EDGE_TOKENS tokens (overlapping for short segments) and the
     * length class is deliberately NOT included: a stripped interior changes the length. */
    int32_t edge[2 * FP_EDGE_TOKENS];
    size_t k = len < FP_EDGE_TOKENS ? len : FP_EDGE_TOKENS;
    memcpy(edge, seg, k * sizeof *seg);
    memcpy(edge + k, seg + len - k, k * sizeof *seg);
    return tern_hash64_seed(edge, 2 * k * sizeof *seg, prev ^ 0x9e3779b97f4a7c15ull);
}

static enum tern_status push(struct fingerprint *f, uint64_t h, uint32_t start) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        uint64_t *c = tern_reallocarray(f->chain, cap, sizeof *c);
        if (!c) return tern_errorf(TERN_ERR_NOMEM, "fingerprint: out of memory");
        f->chain = c;
        uint32_t *s = tern_reallocarray(f->starts, cap, sizeof *s);
        if (!s) return tern_errorf(TERN_ERR_NOMEM, "fingerprint: out of memory");
        f->starts = s;
        f->cap = cap;
    }
    f->chain[f->n] = h;
    f->starts[f->n] = start;
    f->n++;
    return TERN_OK;
}

enum tern_status fp_compute(const struct fp_separators *sep, const int32_t *toks, size_t n,
                            struct fingerprint *out) {
    out->n = 0;
    out->open_start = 0;
    uint64_t prev = 0;
    size_t start = 0;
    for (size_t i = 1; i <= n; i++) {
        if (i < n && !fp_is_separator(sep, toks[i])) continue;
        if (i == n) break; /* the open segment [start, n) stays out of the chain */
        prev = segment_hash(prev, toks + start, i - start);
        enum tern_status st = push(out, prev, (uint32_t)start);
        if (st) return st;
        start = i;
    }
    out->open_start = (uint32_t)start;
    return TERN_OK;
}

void fp_free(struct fingerprint *f) {
    if (!f) return;
    free(f->chain);
    free(f->starts);
    memset(f, 0, sizeof *f);
}

size_t fp_shared(const struct fingerprint *a, const struct fingerprint *b) {
    size_t n = a->n < b->n ? a->n : b->n, i = 0;
    while (i < n && a->chain[i] == b->chain[i]) i++;
    return i;
}
