/* AVX2 kernels of the low-bit types (lowbit.h): the shared unpacking and float steps,
 * the integer sum of a super-block by maddubs (|q| times a with q's sign) and madd with
 * the sub-block scales, 8 int32 lanes summed at the end. Exact, so the bits are the
 * portable kernels' (test-kernels compares them with memcmp). */
#include "kernels/lowbit.h"

#include <immintrin.h>

static inline int32_t lowbit_isum_avx2(const struct tern_lowbit_sb *u, const struct tern_block_q8_k *a) {
    __m256i acc = _mm256_setzero_si256();
    for (int p = 0; p < 8; p++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(u->q + 32 * p));
        const __m256i x = _mm256_loadu_si256((const __m256i *)(a->qs + 32 * p));
        const __m256i prod = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
        const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(u->sc[2 * p + 1]), _mm_set1_epi16(u->sc[2 * p]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(prod, sc));
    }
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

LOWBIT_MATMUL_UNPACK(tern_lowbit_avx2, lowbit_isum_avx2, tern_lowbit_unpack_x86, tern_lowbit_msum_x86,
                     lowbit_pre_none)
