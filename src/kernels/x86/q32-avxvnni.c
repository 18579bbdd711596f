/* AVX-VNNI kernels for the 32-element quants: the tiles of q32-tiles.h with the 256-bit
 * vpdpbusd (VEX) in place of sign, maddubs and madd; the AVX2 build's bits. Called only
 * where CPUID has AVX-VNNI (kernels.c). */
#include "kernels/x86/avx2.h"

#pragma GCC push_options
#pragma GCC target("avxvnni")

#define TERN_AVXVNNI 1
#define X86_MATMUL_NAME(type) tern_avxvnni_matmul_##type
#include "kernels/x86/q32-tiles.h"

#pragma GCC pop_options
