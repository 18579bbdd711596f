/* What the C benchmarks share (bench-kernels, bench-vulkan): random weights with the same
 * generator and contents, so that their figures are about the same data, and the
 * comma-separated number lists of their options. */
#ifndef TERN_BENCH_COMMON_H
#define TERN_BENCH_COMMON_H

#include "util/dtype.h"
#include "util/fp16.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static inline uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* Random contents with sane scales: speed does not depend on the values. */
static inline void fill_weights(enum tern_dtype t, uint8_t *w, size_t bytes) {
    const struct tern_dtype_info *info = tern_dtype_info(t);
    if (t == TERN_DTYPE_F32) {
        for (size_t i = 0; i + 4 <= bytes; i += 4) {
            const float v = ((float)(rnd() & 0xFFFF) - 32768.0f) * 1e-6f;
            memcpy(w + i, &v, 4);
        }
        return;
    }
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rnd();
    if (t == TERN_DTYPE_F16 || t == TERN_DTYPE_BF16) {
        for (size_t i = 0; i + 2 <= bytes; i += 2) {
            const float v = ((float)(rnd() & 0xFFFF) - 32768.0f) * 1e-6f;
            const uint16_t h = t == TERN_DTYPE_F16 ? tern_f32_to_fp16(v) : tern_f32_to_bf16(v);
            memcpy(w + i, &h, 2);
        }
        return;
    }
    if (t == TERN_DTYPE_MXFP4) { /* E8M0 exponent bytes of 2^-8 (no subnormal products) */
        for (size_t b = 0; b + info->type_size <= bytes; b += info->type_size) w[b] = 120;
        return;
    }
    const tern_fp16 s = tern_f32_to_fp16(0.01f);
    const size_t off = t == TERN_DTYPE_Q6_K ? 208 : 0;
    for (size_t b = 0; b + info->type_size <= bytes; b += info->type_size) {
        memcpy(w + b + off, &s, 2);
        if (t == TERN_DTYPE_Q4_1 || t == TERN_DTYPE_Q5_1 || t == TERN_DTYPE_Q4_K || t == TERN_DTYPE_Q5_K)
            memcpy(w + b + 2, &s, 2);
    }
}

/* "q8_0,q4_k" into out (at most max types), each one supported() takes; their count, or
 * -1 with the name that is not such a type in *bad (pointing into a static copy). */
static inline int parse_types(const char *arg, bool (*supported)(enum tern_dtype), enum tern_dtype *out, int max,
                              const char **bad) {
    static char names[256];
    snprintf(names, sizeof names, "%s", arg);
    int n = 0;
    for (char *tok = strtok(names, ","); tok && n < max; tok = strtok(NULL, ",")) {
        if (!tern_dtype_from_name(tok, &out[n]) || !supported(out[n])) {
            *bad = tok;
            return -1;
        }
        n++;
    }
    return n;
}

/* "1,64,512" into out (at most max numbers, each > 0); their count, or -1 when malformed. */
static inline int parse_list(const char *s, long *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        out[n++] = strtol(s, &end, 10);
        if (end == s || out[n - 1] <= 0) return -1;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

#endif
