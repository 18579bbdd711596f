/* AVX2 kernels for the 32-element quants (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL): the
 * tiles of q32-tiles.h with maddubs and madd. */
#include "kernels/x86/avx2.h"

#define X86_MATMUL_NAME(type) tern_avx2_matmul_##type
#include "kernels/x86/q32-tiles.h"
