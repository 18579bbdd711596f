/* Matrix kernels: weight rows of any supported type times activation rows.
 *
 * Exactness contract (DESIGN.md §5): every output element y[t][r] is a pure function
 * of (weight row r, activation row t, k, the ISA chosen at start-up). It does not
 * depend on n_tok, on r0/r1, or on where row t sits in the batch: each dot product
 * reduces over k in one fixed order. Threads split rows r (callers do that), never k.
 * The matrix-matrix path and the matrix-vector path (n_tok == 1) therefore give
 * bit-identical results, which is what makes a resumed session equal a cold one.
 *
 * Activations are prepared once per row for the weight type's activation format
 * (F32 for float weights; Q8_0 blocks for the 32-element quants and IQ4_NL; Q8_K blocks
 * for the K-quants and IQ4_XS), as ggml does; quantizing an activation row is per token, so
 * it is also independent of batching. IQ4_NL and IQ4_XS give the same bits on every ISA;
 * the other types differ between ISAs (docs/kernels.md). */
#ifndef TERN_KERNELS_H
#define TERN_KERNELS_H

#include "util/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum tern_isa { TERN_ISA_PORTABLE = 0, TERN_ISA_AVX2 = 1 };

/* The one ISA choice of the process, for the matrix kernels, the ops (ops.h) and the
 * Gated DeltaNet core alike: made once (CPUID; the environment variable TERN_ISA=portable
 * forces the portable code, TERN_ISA=avx2 asks for AVX2), here and nowhere else. Safe to
 * call from many threads; every entry point calls it. */
void tern_kernels_init(void);
enum tern_isa tern_kernels_isa(void);
const char *tern_isa_name(enum tern_isa isa);
/* Whether the CPU can run an ISA's code (AVX2: AVX2, FMA and F16C). */
bool tern_kernels_isa_available(enum tern_isa isa);
/* For tests and benchmarks: force an ISA for everything that follows the choice (false
 * if the CPU lacks it). Not thread-safe with respect to running kernels. */
bool tern_kernels_set_isa(enum tern_isa isa);

/* Within the AVX2 ISA, batches (n_tok > 1) and single tokens of F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1, IQ4_NL, IQ4_XS, MXFP4, Q4_K, Q5_K and Q6_K weights may run on AVX-512 tiles (F, BW, VL,
 * DQ, VNNI), and the low-bit types on their AVX-512 kernels: two (row, token) pairs per register, every lane
 * through the AVX2 tile's operations, so the bits are the AVX2 kernels' (the kernel test
 * checks that bit for bit). On by default where the CPU has them; TERN_AVX512=0 turns
 * them off. set returns false (and changes nothing) when asked for tiles the CPU lacks.
 * Not thread-safe with respect to running kernels. */
bool tern_kernels_avx512_available(void);
bool tern_kernels_avx512(void);
bool tern_kernels_set_avx512(bool on);

/* Whether weights of this type can be multiplied (dtype supported flag). */
bool tern_matmul_supported(enum tern_dtype wtype);
/* Row length granularity the type needs (its block size). */
uint32_t tern_matmul_k_multiple(enum tern_dtype wtype);

/* Activation format for a weight type, and the bytes of one prepared row of k. */
enum tern_dtype tern_act_type(enum tern_dtype wtype);
size_t tern_act_row_bytes(enum tern_dtype wtype, size_t k);
/* Prepares one activation row x[k] for weights of type wtype (out holds
 * tern_act_row_bytes(wtype, k) bytes). A pure function of x: both ISAs write the same
 * bytes. */
void tern_act_prepare(enum tern_dtype wtype, const float *x, void *out, size_t k);

/* y[t * ldy + r] = dot(w row r, act row t) for r in [r0, r1), t in [0, n_tok).
 * w: rows of k elements of type wtype, row r at w + r * w_row_bytes.
 * act: n_tok prepared rows, row t at act + t * act_row_bytes.
 * Shapes are the caller's to validate (the model loader does): an unsupported type, a k
 * that is not a multiple of tern_matmul_k_multiple(), or row strides smaller than a
 * row are programmer errors (TERN_ASSERT). No allocation; any thread may call it
 * concurrently on disjoint outputs (threads split [r0, r1), never k). */
void tern_matmul(enum tern_dtype wtype, const void *w, size_t w_row_bytes, size_t k,
                 const void *act, size_t act_row_bytes, size_t n_tok, float *y, size_t ldy,
                 size_t r0, size_t r1);

/* Dequantizes / quantizes one row of k elements (portable reference; used for
 * embeddings lookups, tests and the model generator). Both return false, with a message
 * (tern_last_error) naming the type and k, for a type they do not handle or a k that is
 * not a multiple of the type's block size; dst is then untouched.
 * Dequantization is bit-identical to ggml's. Quantization is tern's own (docs/kernels.md):
 * F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL and IQ4_XS. */
bool tern_dequantize_row(enum tern_dtype type, const void *src, float *dst, size_t k);
bool tern_quantize_row(enum tern_dtype type, const float *src, void *dst, size_t k);
bool tern_quantize_supported(enum tern_dtype type);
bool tern_dequantize_supported(enum tern_dtype type);

#endif
