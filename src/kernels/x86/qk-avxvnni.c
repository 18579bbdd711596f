/* AVX-VNNI kernels for the K-quants and IQ4_XS: the tiles of qk-tiles.h with the 256-bit
 * vpdpwssd (VEX) doing each scale multiply and its add; the AVX2 build's bits. Called
 * only where CPUID has AVX-VNNI (kernels.c). */
#include "kernels/x86/avx2.h"

#pragma GCC push_options
#pragma GCC target("avxvnni")

#define TERN_AVXVNNI 1
#define X86_MATMUL_NAME(type) tern_avxvnni_matmul_##type
#include "kernels/x86/qk-tiles.h"

#pragma GCC pop_options
