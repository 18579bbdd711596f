/* AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c; chosen at run time). */
#include "kernels/kernels-impl.h"

const struct tern_kernel_table tern_kernels_avx2 = {0};
