/* Internal to the kernels module: the per-ISA operation tables that kernels.c
 * dispatches through. Each ISA fills one table; a NULL entry means "use the portable
 * one" (so an ISA can be brought up type by type). */
#ifndef TERN_KERNELS_IMPL_H
#define TERN_KERNELS_IMPL_H

#include "util/dtype.h"

#include <stddef.h>

/* y[t * ldy + r] = dot(w row r, act row t), r in [r0, r1), t in [0, n_tok). */
typedef void (*tern_matmul_fn)(const void *w, size_t w_row_bytes, size_t k, const void *act,
                               size_t act_row_bytes, size_t n_tok, float *y, size_t ldy, size_t r0,
                               size_t r1);
/* Prepares one activation row of k (a multiple of the format's block size). */
typedef void (*tern_act_fn)(const float *x, void *out, size_t k);

struct tern_kernel_table {
    tern_matmul_fn matmul[TERN_DTYPE_COUNT]; /* by weight type */
    tern_act_fn act[TERN_DTYPE_COUNT];       /* by activation type (F32, Q8_0, Q8_K) */
};

extern const struct tern_kernel_table tern_kernels_portable;

/* Every half as a float (filled by tern_kernels_init before any kernel runs): the
 * SIMD kernels turn block scales into floats with one load instead of three ALU ops. */
extern float tern_fp16_lut[65536];
/* tern_e8m0_half of every byte (MXFP4's block scales), likewise. */
extern float tern_e8m0_half_lut[256];

extern const struct tern_kernel_table tern_kernels_avx2;
/* AVX-512 tiles for batches with the AVX2 tiles' bits (x86/wide-avx512.c); consulted before
 * tern_kernels_avx2 when the AVX2 ISA is active and the CPU has AVX-512 F, BW, VL, DQ and
 * VNNI. */
extern const struct tern_kernel_table tern_kernels_avx512_tiles;

#endif
