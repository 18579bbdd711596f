/* Structural fingerprints of token streams (DESIGN.md §4, implicit identity).
 *
 * The stream is split into segments at control tokens (what a chat template emits at
 * turn boundaries: <|im_start|>, <|im_end|>, ...). Each segment is hashed over its
 * first and last 8 tokens only — never the interior — so a turn whose middle was
 * rewritten (a stripped <think> block, a re-serialised tool call) keeps its hash. The
 * fingerprint is the chain h[i] = xxh3(h[i-1], segment i), so equal entries at index i
 * mean equal structure for all of segments 0..i. Two streams "share k leading segments"
 * when their chains agree on entries 0..k-1.
 *
 * A fingerprint only nominates candidates; bytes decide (planner.h). */
#ifndef TERN_CACHE_FINGERPRINT_H
#define TERN_CACHE_FINGERPRINT_H

#include "util/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FP_EDGE_TOKENS 8
/* A parked session is nominated when it shares at least this many leading segments:
 * a bare system prompt (2 segments: the turn and its end marker) is identical across
 * unrelated conversations, so fewer would cross-link them. */
#define FP_MIN_SHARED 3

/* Which token ids are segment separators: a bitmap over the vocabulary. */
struct fp_separators {
    const uint8_t *bits; /* bit i set: token i starts a segment */
    uint32_t n_vocab;
};

static inline bool fp_is_separator(const struct fp_separators *s, int32_t id) {
    return id >= 0 && (uint32_t)id < s->n_vocab && (s->bits[(uint32_t)id >> 3] >> ((uint32_t)id & 7)) & 1;
}

struct fingerprint {
    uint64_t *chain;    /* [n] */
    uint32_t *starts;   /* [n] token position where segment i starts */
    size_t n;
    size_t cap;
    /* Only complete segments enter the chain: the last segment of a stream is still
     * growing, so it is kept out (its start is `open_start`). */
    uint32_t open_start;
};

/* Computes the fingerprint of toks[0..n). The last (open) segment is excluded. */
enum tern_status fp_compute(const struct fp_separators *sep, const int32_t *toks, size_t n,
                            struct fingerprint *out);
void fp_free(struct fingerprint *f);
/* Number of leading chain entries a and b share. */
size_t fp_shared(const struct fingerprint *a, const struct fingerprint *b);

#endif
