/* AVX-512 kernels of the low-bit types (lowbit.h), used where the AVX2 table would be
 * (kernels.c; TERN_AVX512=0 turns them off): 64 levels per step, |q| times a with q's
 * sign by maddubs, the four sub-block scales spread by one permute and applied with
 * vpdpwssd, 16 int32 lanes summed at the end. The sum is exact, and the shared float
 * steps make the bits the AVX2 and portable kernels' (test-kernels checks it). */
#include "kernels/lowbit.h"

#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")

static inline int32_t lowbit_isum_avx512(const struct tern_lowbit_sb *u, const struct tern_block_q8_k *a) {
    /* word i (of 32: a pair of products) takes scale i / 8 of the four loaded */
    static const uint16_t spread_idx[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    const __m512i spread = _mm512_loadu_si512((const void *)spread_idx);
    __m512i acc = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++) {
        const __m512i q = _mm512_loadu_si512((const void *)(u->q + 64 * p));
        const __m512i x = _mm512_loadu_si512((const void *)(a->qs + 64 * p));
        const __mmask64 neg = _mm512_movepi8_mask(q);
        const __m512i xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
        const __m512i prod = _mm512_maddubs_epi16(_mm512_abs_epi8(q), xs);
        int64_t sc4;
        memcpy(&sc4, u->sc + 4 * p, 8);
        const __m512i sc = _mm512_permutexvar_epi16(spread, _mm512_set1_epi64(sc4));
        acc = _mm512_dpwssd_epi32(acc, prod, sc);
    }
    return _mm512_reduce_add_epi32(acc);
}

LOWBIT_MATMUL_UNPACK(tern_lowbit_avx512, lowbit_isum_avx512, tern_lowbit_unpack_x86, tern_lowbit_msum_x86)

#pragma GCC pop_options
