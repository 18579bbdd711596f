/* The AVX2 + FMA + F16C kernel table (these files are compiled with -mavx2 -mfma
 * -mf16c and only called when CPUID has all three). */
#include "kernels/lowbit.h"
#include "kernels/x86/avx2.h"

const struct tern_kernel_table tern_kernels_avx2 = {
    .matmul =
        {
            [TERN_DTYPE_F32] = tern_avx2_matmul_f32,
            [TERN_DTYPE_F16] = tern_avx2_matmul_f16,
            [TERN_DTYPE_BF16] = tern_avx2_matmul_bf16,
            [TERN_DTYPE_Q8_0] = tern_avx2_matmul_q8_0,
            [TERN_DTYPE_Q4_0] = tern_avx2_matmul_q4_0,
            [TERN_DTYPE_Q4_1] = tern_avx2_matmul_q4_1,
            [TERN_DTYPE_Q5_0] = tern_avx2_matmul_q5_0,
            [TERN_DTYPE_Q5_1] = tern_avx2_matmul_q5_1,
            [TERN_DTYPE_Q4_K] = tern_avx2_matmul_q4_k,
            [TERN_DTYPE_Q5_K] = tern_avx2_matmul_q5_k,
            [TERN_DTYPE_Q6_K] = tern_avx2_matmul_q6_k,
            [TERN_DTYPE_IQ4_NL] = tern_avx2_matmul_iq4_nl,
            [TERN_DTYPE_IQ4_XS] = tern_avx2_matmul_iq4_xs,
            [TERN_DTYPE_MXFP4] = tern_avx2_matmul_mxfp4,
            LOWBIT_TABLE(tern_lowbit_avx2),
        },
    .act =
        {
            [TERN_DTYPE_Q8_0] = tern_avx2_act_q8_0,
            [TERN_DTYPE_Q8_K] = tern_avx2_act_q8_k,
        },
};
