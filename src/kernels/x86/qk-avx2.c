/* AVX2 kernels for the K-quants (Q4_K, Q5_K, Q6_K) and IQ4_XS: the tiles of qk-tiles.h
 * with maddubs, madd and add. */
#include "kernels/x86/avx2.h"

#define X86_MATMUL_NAME(type) tern_avx2_matmul_##type
#include "kernels/x86/qk-tiles.h"
