/* Deterministic pseudo-random numbers: splitmix64 (seeding, ids, cheap streams) and
 * xoshiro256** (the sampler, the model generator). Not for anything secret. The
 * sequences are part of tern's reproducibility: `tern mkmodel` with the same seed writes
 * the same bytes, `seed` in a request gives the same tokens, so never change them. */
#ifndef TERN_UTIL_RNG_H
#define TERN_UTIL_RNG_H

#include <stdint.h>

/* Advances *x and returns the next output of splitmix64. */
static inline uint64_t tern_splitmix64(uint64_t *x) {
    uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

struct tern_rng {
    uint64_t s[4]; /* xoshiro256** state, never all zero after tern_rng_seed */
};

static inline void tern_rng_seed(struct tern_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = tern_splitmix64(&seed);
}

static inline uint64_t tern_rng_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t tern_rng_next(struct tern_rng *r) {
    uint64_t *s = r->s;
    const uint64_t out = tern_rng_rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = tern_rng_rotl(s[3], 45);
    return out;
}

/* Uniform in [0, 1), 53 random bits. */
static inline double tern_rng_uniform(struct tern_rng *r) { return (double)(tern_rng_next(r) >> 11) * 0x1p-53; }

#endif
