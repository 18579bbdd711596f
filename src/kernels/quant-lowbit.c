/* Dequantization and quantization of the nine low-bit types (lowbit.h).
 *
 * Dequantization goes through the same unpacking as the kernels, then forms each float
 * the way ggml's dequantize_row_* does, so the bits are ggml's: the sub-block factor
 * first (Q2_K/Q3_K/IQ3_S/IQ1: d * scale; IQ2: (d * (0.5 + ls)) * 0.25; IQ3_XXS:
 * (d * (0.5 + ls)) * 0.5), then times the level (for IQ2/IQ3 the magnitude with its sign:
 * (f * m) * -1 == f * -m in IEEE arithmetic; for IQ1 grid + shift = q / 8 exactly), Q2_K
 * minus dmin * min. */
#include "kernels/lowbit.h"

#include <float.h>
#include <math.h>

static float sub_factor(enum tern_dtype t, const struct tern_lowbit_sb *u, int j) {
    switch (t) {
    case TERN_DTYPE_IQ2_XXS: case TERN_DTYPE_IQ2_XS: case TERN_DTYPE_IQ2_S:
        return u->d * (0.5f + (float)((u->sc[j] - 1) / 2)) * 0.25f;
    case TERN_DTYPE_IQ3_XXS: return u->d * (0.5f + (float)((u->sc[j] - 1) / 2)) * 0.5f;
    default: return u->d * (float)u->sc[j];
    }
}

bool tern_lowbit_dequantize(enum tern_dtype t, const void *src, float *dst, size_t nb) {
    if (!tern_lowbit_type(t)) return false;
    tern_iq_grids_init();
    const bool iq1 = t == TERN_DTYPE_IQ1_S || t == TERN_DTYPE_IQ1_M;
    struct tern_lowbit_sb u;
    for (size_t b = 0; b < nb; b++) {
        tern_lowbit_unpack(t, src, b, &u);
        float *y = dst + b * TERN_QK_K;
        for (int j = 0; j < 16; j++) {
            const float f = sub_factor(t, &u, j);
            if (t == TERN_DTYPE_Q2_K) {
                const float ml = u.dmin * (float)u.m[j];
                for (int l = 0; l < 16; l++) y[16 * j + l] = f * (float)u.q[16 * j + l] - ml;
            } else if (iq1) {
                for (int l = 0; l < 16; l++) y[16 * j + l] = f * ((float)u.q[16 * j + l] * 0.125f);
            } else {
                for (int l = 0; l < 16; l++) y[16 * j + l] = f * (float)u.q[16 * j + l];
            }
        }
    }
    return true;
}
