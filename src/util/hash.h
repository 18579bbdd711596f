/* Hashing: xxHash (XXH3-64) from libxxhash, the one hash used everywhere (state
 * hashes, fingerprints, hash tables). */
#ifndef TERN_UTIL_HASH_H
#define TERN_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

static inline uint64_t tern_hash64(const void *p, size_t n) { return XXH3_64bits(p, n); }
static inline uint64_t tern_hash64_seed(const void *p, size_t n, uint64_t seed) {
    return XXH3_64bits_withSeed(p, n, seed);
}

#endif
