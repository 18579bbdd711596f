/* IEEE half and bfloat16 conversions (portable; exact, round-to-nearest-even). */
#ifndef TERN_UTIL_FP16_H
#define TERN_UTIL_FP16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t tern_fp16;
typedef uint16_t tern_bf16;

static inline uint32_t tern_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float tern_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float tern_fp16_to_f32(tern_fp16 h) {
    /* The classic magic-number conversion: exact for every half, including
     * subnormals, infinities and NaN. */
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = UINT32_C(0xE0) << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized = tern_bits_f32((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = UINT32_C(126) << 23;
    const float magic_bias = 0.5f;
    const float denormalized = tern_bits_f32((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denormalized_cutoff = UINT32_C(1) << 27;
    const uint32_t result =
        sign | (two_w < denormalized_cutoff ? tern_f32_bits(denormalized) : tern_f32_bits(normalized));
    return tern_bits_f32(result);
}

static inline tern_fp16 tern_f32_to_fp16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (f < 0 ? -f : f) * scale_to_inf;
    base *= scale_to_zero;
    const uint32_t w = tern_f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & UINT32_C(0x80000000);
    uint32_t bias = shl1_w & UINT32_C(0xFF000000);
    if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);
    base = tern_bits_f32((bias >> 1) + UINT32_C(0x07800000)) + base;
    const uint32_t bits = tern_f32_bits(base);
    const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
    const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (tern_fp16)((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT16_C(0x7E00) : nonsign));
}

static inline float tern_bf16_to_f32(tern_bf16 h) { return tern_bits_f32((uint32_t)h << 16); }

static inline tern_bf16 tern_f32_to_bf16(float f) {
    uint32_t u = tern_f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (tern_bf16)((u >> 16) | 64); /* quiet NaN */
    return (tern_bf16)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

#endif
