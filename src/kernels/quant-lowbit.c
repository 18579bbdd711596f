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
#include <pthread.h>

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

/* ---- quantization ------------------------------------------------------------------------
 * tern's own, simple and correct rather than clever: per sub-block a scale from its
 * largest magnitude, the block scale from the largest sub-block scale, then for the
 * I-quants each group's nearest grid point (each element's nearest level first, looked up
 * in a map from codes to grid entries; a search over the whole grid when that point is not
 * on it). Signs that the format cannot store (IQ2_XXS, IQ2_XS, IQ3_XXS keep 7 of 8 and
 * make the count of negatives even) are fixed by flipping the smallest element. */

static int16_t map2_xxs[1 << 16], map2_xs[1 << 16], map2_s[1 << 16], map1[1 << 16];
static int16_t map3_xxs[1 << 12], map3_s[1 << 12];
static pthread_once_t maps_once = PTHREAD_ONCE_INIT;

static uint32_t code_of(uint64_t point, int n, const int8_t *levels, int n_levels, int bits) {
    uint32_t c = 0;
    for (int j = 0; j < n; j++) {
        const int8_t v = (int8_t)(point >> (8 * j));
        int l = 0;
        while (l < n_levels && levels[l] != v) l++;
        c |= (uint32_t)l << (bits * j);
    }
    return c;
}

static const int8_t lv2[3] = {8, 25, 43}, lv3xxs[8] = {4, 12, 20, 28, 36, 44, 52, 62},
                    lv3s[8] = {1, 3, 5, 7, 9, 11, 13, 15}, lv1[3] = {-1, 0, 1};

static void build_maps(void) {
    tern_iq_grids_init();
    memset(map2_xxs, 0xFF, sizeof map2_xxs);
    memset(map2_xs, 0xFF, sizeof map2_xs);
    memset(map2_s, 0xFF, sizeof map2_s);
    memset(map1, 0xFF, sizeof map1);
    memset(map3_xxs, 0xFF, sizeof map3_xxs);
    memset(map3_s, 0xFF, sizeof map3_s);
    for (int i = 0; i < 256; i++) map2_xxs[code_of(tern_iq2xxs_grid[i], 8, lv2, 3, 2)] = (int16_t)i;
    for (int i = 0; i < 512; i++) map2_xs[code_of(tern_iq2xs_grid[i], 8, lv2, 3, 2)] = (int16_t)i;
    for (int i = 0; i < 1024; i++) map2_s[code_of(tern_iq2s_grid[i], 8, lv2, 3, 2)] = (int16_t)i;
    for (int i = 0; i < 2048; i++) map1[code_of(tern_iq1s_grid[i], 8, lv1, 3, 2)] = (int16_t)i;
    for (int i = 0; i < 256; i++) map3_xxs[code_of(tern_iq3xxs_grid[i], 4, lv3xxs, 8, 3)] = (int16_t)i;
    for (int i = 0; i < 512; i++) map3_s[code_of(tern_iq3s_grid[i], 4, lv3s, 8, 3)] = (int16_t)i;
}

static int nearest_level(float v, const int8_t *levels, int n) {
    int best = 0;
    float be = INFINITY;
    for (int l = 0; l < n; l++) {
        const float e = fabsf(v - (float)levels[l]);
        if (e < be) be = e, best = l;
    }
    return best;
}

/* The grid entry nearest to v[0..n) (n = 8 or 4), grid entry i at bytes 8 i (n = 8) or
 * 4 i (n = 4) of g; levels as signed bytes. */
static int nearest_point(const float *v, int n, const void *g, int n_entries, const int8_t *levels, int n_levels,
                         int bits, const int16_t *map) {
    uint32_t c = 0;
    for (int j = 0; j < n; j++) c |= (uint32_t)nearest_level(v[j], levels, n_levels) << (bits * j);
    if (map[c] >= 0) return map[c];
    const int8_t *gb = g;
    int best = 0;
    float be = INFINITY;
    for (int i = 0; i < n_entries; i++) {
        float e = 0;
        for (int j = 0; j < n; j++) {
            const float d = v[j] - (float)gb[n * i + j];
            e += d * d;
        }
        if (e < be) be = e, best = i;
    }
    return best;
}

static float maxabs(const float *x, int n) {
    float m = 0;
    for (int i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

static tern_fp16 half_of(float v) {
    if (!(v < 65504.0f)) v = 65504.0f;
    return tern_f32_to_fp16(v);
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Signs of x[0..8) as a byte; with parity set, the count of negatives is made even by
 * flipping the element of smallest magnitude. */
static uint8_t signs_of(const float *x, bool parity) {
    uint8_t s = 0;
    for (int j = 0; j < 8; j++)
        if (x[j] < 0) s |= (uint8_t)(1u << j);
    if (parity && (__builtin_popcount(s) & 1)) {
        int m = 0;
        for (int j = 1; j < 8; j++)
            if (fabsf(x[j]) < fabsf(x[m])) m = j;
        s ^= (uint8_t)(1u << m);
    }
    return s;
}

static void quantize_q2_k(const float *x, struct tern_block_q2_k *y) {
    float sc[16], mn[16];
    float msc = 0, mmn = 0;
    for (int j = 0; j < 16; j++) {
        float lo = 0, hi = 0;
        for (int l = 0; l < 16; l++) lo = fminf(lo, x[16 * j + l]), hi = fmaxf(hi, x[16 * j + l]);
        sc[j] = (hi - lo) / 3.0f;
        mn[j] = -lo;
        msc = fmaxf(msc, sc[j]);
        mmn = fmaxf(mmn, mn[j]);
    }
    y->d = half_of(msc / 15.0f);
    y->dmin = half_of(mmn / 15.0f);
    const float d = tern_fp16_to_f32(y->d), dmin = tern_fp16_to_f32(y->dmin);
    memset(y->qs, 0, sizeof y->qs);
    for (int j = 0; j < 16; j++) {
        const int is = d > 0 ? clampi((int)lrintf(sc[j] / d), 0, 15) : 0;
        const int im = dmin > 0 ? clampi((int)lrintf(mn[j] / dmin), 0, 15) : 0;
        y->scales[j] = (uint8_t)(is | (im << 4));
        const float dl = d * (float)is, ml = dmin * (float)im;
        for (int l = 0; l < 16; l++) {
            const int i = 16 * j + l;
            const int q = dl > 0 ? clampi((int)lrintf((x[i] + ml) / dl), 0, 3) : 0;
            y->qs[32 * (i / 128) + i % 32] |= (uint8_t)(q << (2 * ((i % 128) / 32)));
        }
    }
}

static void quantize_q3_k(const float *x, struct tern_block_q3_k *y) {
    float sc[16], m = 0;
    for (int j = 0; j < 16; j++) {
        int im = 0; /* largest magnitude takes level -4 */
        for (int l = 1; l < 16; l++)
            if (fabsf(x[16 * j + l]) > fabsf(x[16 * j + im])) im = l;
        sc[j] = x[16 * j + im] / -4.0f;
        m = fmaxf(m, fabsf(sc[j]));
    }
    y->d = half_of(m / 31.0f);
    const float d = tern_fp16_to_f32(y->d);
    memset(y->hmask, 0, sizeof y->hmask);
    memset(y->qs, 0, sizeof y->qs);
    memset(y->scales, 0, sizeof y->scales);
    for (int j = 0; j < 16; j++) {
        const int s = d > 0 ? clampi((int)lrintf(sc[j] / d), -32, 31) : 0;
        const unsigned u = (unsigned)(s + 32);
        y->scales[j % 8] |= (uint8_t)((u & 0xF) << (4 * (j / 8)));
        y->scales[8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
        const float dl = d * (float)s;
        for (int l = 0; l < 16; l++) {
            const int i = 16 * j + l;
            const int q = dl != 0 ? clampi((int)lrintf(x[i] / dl), -4, 3) : 0;
            const int h = i / 128, jj = (i % 128) / 32, ll = i % 32;
            y->qs[32 * h + ll] |= (uint8_t)((q & 3) << (2 * jj));
            if (q >= 0) y->hmask[ll] |= (uint8_t)(1u << (4 * h + jj));
        }
    }
}

/* IQ2_XXS, IQ2_XS, IQ2_S: groups of 8 magnitudes from the 2-bit grids. */
static void quantize_iq2(enum tern_dtype t, const float *x, void *blk) {
    const bool per16 = t != TERN_DTYPE_IQ2_XXS;
    const int nsub = per16 ? 16 : 8, len = 256 / nsub;
    float s[16], m = 0;
    for (int j = 0; j < nsub; j++) m = fmaxf(m, s[j] = maxabs(x + len * j, len) / 43.0f);
    const tern_fp16 dh = half_of(m / (15.5f / 4.0f));
    const float d = tern_fp16_to_f32(dh);
    int ls[16];
    for (int j = 0; j < nsub; j++) ls[j] = d > 0 ? clampi((int)lrintf(s[j] / d * 4.0f - 0.5f), 0, 15) : 0;
    const void *grid = t == TERN_DTYPE_IQ2_XXS ? (const void *)tern_iq2xxs_grid
                       : t == TERN_DTYPE_IQ2_XS ? (const void *)tern_iq2xs_grid : (const void *)tern_iq2s_grid;
    const int n_entries = t == TERN_DTYPE_IQ2_XXS ? 256 : t == TERN_DTYPE_IQ2_XS ? 512 : 1024;
    const int16_t *map = t == TERN_DTYPE_IQ2_XXS ? map2_xxs : t == TERN_DTYPE_IQ2_XS ? map2_xs : map2_s;
    uint8_t *p = blk;
    memset(p, 0, tern_dtype_info(t)->type_size);
    memcpy(p, &dh, 2);
    for (int g = 0; g < 32; g++) {
        const float *xg = x + 8 * g;
        const int j = per16 ? g / 2 : g / 4;
        const float db = d * (0.5f + (float)ls[j]) * 0.25f;
        float v[8];
        for (int e = 0; e < 8; e++) v[e] = db > 0 ? fabsf(xg[e]) / db : 0;
        const int idx = nearest_point(v, 8, grid, n_entries, lv2, 3, 2, map);
        const uint8_t sg = signs_of(xg, t != TERN_DTYPE_IQ2_S);
        const int ib = g / 4, l = g % 4;
        if (t == TERN_DTYPE_IQ2_XXS) {
            struct tern_block_iq2_xxs *b = blk;
            uint8_t *q = (uint8_t *)b->qs;
            q[8 * ib + l] = (uint8_t)idx;
            uint32_t aux = lowbit_u32(q + 8 * ib + 4);
            aux |= (uint32_t)(sg & 127) << (7 * l);
            if (l == 0) aux |= (uint32_t)ls[ib] << 28;
            for (int k = 0; k < 4; k++) q[8 * ib + 4 + k] = (uint8_t)(aux >> (8 * k));
        } else if (t == TERN_DTYPE_IQ2_XS) {
            struct tern_block_iq2_xs *b = blk;
            const uint16_t v16 = (uint16_t)(idx | ((sg & 127) << 9));
            memcpy((uint8_t *)b->qs + 2 * g, &v16, 2);
            b->scales[ib] = (uint8_t)(ls[2 * ib] | (ls[2 * ib + 1] << 4));
        } else {
            struct tern_block_iq2_s *b = blk;
            b->qs[g] = (uint8_t)idx;
            b->qh[ib] |= (uint8_t)((idx >> 8) << (2 * l));
            b->qs[32 + g] = sg;
            b->scales[ib] = (uint8_t)(ls[2 * ib] | (ls[2 * ib + 1] << 4));
        }
    }
}

/* IQ3_XXS, IQ3_S: groups of 8 as two points of 4 magnitudes. */
static void quantize_iq3(enum tern_dtype t, const float *x, void *blk) {
    const bool xxs = t == TERN_DTYPE_IQ3_XXS;
    const float top = xxs ? 62.0f : 15.0f;
    float s[8], m = 0;
    for (int j = 0; j < 8; j++) m = fmaxf(m, s[j] = maxabs(x + 32 * j, 32) / top);
    const tern_fp16 dh = half_of(xxs ? m / (15.5f / 2.0f) : m / 31.0f);
    const float d = tern_fp16_to_f32(dh);
    int ls[8];
    for (int j = 0; j < 8; j++)
        ls[j] = d > 0 ? clampi((int)lrintf(xxs ? s[j] / d * 2.0f - 0.5f : (s[j] / d - 1.0f) / 2.0f), 0, 15) : 0;
    uint8_t *p = blk;
    memset(p, 0, tern_dtype_info(t)->type_size);
    memcpy(p, &dh, 2);
    for (int g = 0; g < 32; g++) {
        const float *xg = x + 8 * g;
        const int ib = g / 4, l = g % 4;
        const float db = xxs ? d * (0.5f + (float)ls[ib]) * 0.5f : d * (float)(1 + 2 * ls[ib]);
        float v[8];
        for (int e = 0; e < 8; e++) v[e] = db > 0 ? fabsf(xg[e]) / db : 0;
        const int i1 = xxs ? nearest_point(v, 4, tern_iq3xxs_grid, 256, lv3xxs, 8, 3, map3_xxs)
                           : nearest_point(v, 4, tern_iq3s_grid, 512, lv3s, 8, 3, map3_s);
        const int i2 = xxs ? nearest_point(v + 4, 4, tern_iq3xxs_grid, 256, lv3xxs, 8, 3, map3_xxs)
                           : nearest_point(v + 4, 4, tern_iq3s_grid, 512, lv3s, 8, 3, map3_s);
        const uint8_t sg = signs_of(xg, xxs);
        if (xxs) {
            struct tern_block_iq3_xxs *b = blk;
            b->qs[8 * ib + 2 * l] = (uint8_t)i1;
            b->qs[8 * ib + 2 * l + 1] = (uint8_t)i2;
            uint32_t aux = lowbit_u32(b->qs + 64 + 4 * ib);
            aux |= (uint32_t)(sg & 127) << (7 * l);
            if (l == 0) aux |= (uint32_t)ls[ib] << 28;
            for (int k = 0; k < 4; k++) b->qs[64 + 4 * ib + k] = (uint8_t)(aux >> (8 * k));
        } else {
            struct tern_block_iq3_s *b = blk;
            b->qs[8 * ib + 2 * l] = (uint8_t)i1;
            b->qs[8 * ib + 2 * l + 1] = (uint8_t)i2;
            b->qh[ib] |= (uint8_t)(((i1 >> 8) << (2 * l)) | ((i2 >> 8) << (2 * l + 1)));
            b->signs[g] = sg;
            b->scales[ib / 2] |= (uint8_t)(ls[ib] << (4 * (ib % 2)));
        }
    }
}

/* One group of 8 of IQ1: the nearest point to x / dl - delta; returns its squared error
 * (in units of dl). */
static float iq1_group(const float *x, float dl, float delta, int *idx) {
    float v[8];
    for (int e = 0; e < 8; e++) v[e] = dl > 0 ? x[e] / dl - delta : 0;
    *idx = nearest_point(v, 8, tern_iq1s_grid, 2048, lv1, 3, 2, map1);
    const int8_t *gb = (const int8_t *)&tern_iq1s_grid[*idx];
    float err = 0;
    for (int e = 0; e < 8; e++) err += (v[e] - gb[e]) * (v[e] - gb[e]);
    return err;
}

static void quantize_iq1(enum tern_dtype t, const float *x, void *blk) {
    const bool m_type = t == TERN_DTYPE_IQ1_M;
    const int nsub = m_type ? 16 : 8, len = 256 / nsub;
    float s[16], m = 0;
    for (int j = 0; j < nsub; j++) m = fmaxf(m, s[j] = maxabs(x + len * j, len) / 1.125f);
    const tern_fp16 dh = half_of(m / 15.0f);
    const float d = tern_fp16_to_f32(dh);
    int ls[16];
    for (int j = 0; j < nsub; j++) ls[j] = d > 0 ? clampi((int)lrintf((s[j] / d - 1.0f) / 2.0f), 0, 7) : 0;
    uint8_t *p = blk;
    memset(p, 0, tern_dtype_info(t)->type_size);
    if (!m_type) {
        struct tern_block_iq1_s *b = blk;
        b->d = dh;
        for (int ib = 0; ib < 8; ib++) {
            const float dl = d * (float)(2 * ls[ib] + 1);
            int idx[2][4];
            float err[2] = {0, 0};
            for (int sg = 0; sg < 2; sg++)
                for (int l = 0; l < 4; l++) err[sg] += iq1_group(x + 32 * ib + 8 * l, dl, sg ? -0.125f : 0.125f, &idx[sg][l]);
            const int sg = err[1] < err[0];
            uint16_t qh = (uint16_t)((ls[ib] << 12) | (sg << 15));
            for (int l = 0; l < 4; l++) {
                b->qs[4 * ib + l] = (uint8_t)idx[sg][l];
                qh |= (uint16_t)((idx[sg][l] >> 8) << (3 * l));
            }
            memcpy((uint8_t *)b->qh + 2 * ib, &qh, 2);
        }
        return;
    }
    struct tern_block_iq1_m *b = blk;
    uint16_t sw[4] = {0, 0, 0, 0};
    for (int ib = 0; ib < 8; ib++) {
        int idx[4], neg[4];
        for (int l = 0; l < 4; l++) {
            const float dl = d * (float)(2 * ls[2 * ib + l / 2] + 1);
            int i0, i1;
            const float e0 = iq1_group(x + 32 * ib + 8 * l, dl, 0.125f, &i0);
            const float e1 = iq1_group(x + 32 * ib + 8 * l, dl, -0.125f, &i1);
            neg[l] = e1 < e0;
            idx[l] = neg[l] ? i1 : i0;
            b->qs[4 * ib + l] = (uint8_t)idx[l];
        }
        b->qh[2 * ib] = (uint8_t)((idx[0] >> 8) | ((idx[1] >> 8) << 4) | (neg[0] << 3) | (neg[1] << 7));
        b->qh[2 * ib + 1] = (uint8_t)((idx[2] >> 8) | ((idx[3] >> 8) << 4) | (neg[2] << 3) | (neg[3] << 7));
        sw[ib / 2] |= (uint16_t)((ls[2 * ib] | (ls[2 * ib + 1] << 3)) << (6 * (ib % 2)));
    }
    for (int w = 0; w < 4; w++) {
        sw[w] |= (uint16_t)(((dh >> (4 * w)) & 0xF) << 12);
        memcpy(b->scales + 2 * w, &sw[w], 2);
    }
}

bool tern_lowbit_quantize(enum tern_dtype t, const float *src, void *dst, size_t nb) {
    if (!tern_lowbit_type(t)) return false;
    pthread_once(&maps_once, build_maps);
    const size_t bs = tern_dtype_info(t)->type_size;
    for (size_t b = 0; b < nb; b++) {
        const float *x = src + b * TERN_QK_K;
        void *y = (uint8_t *)dst + b * bs;
        switch (t) {
        case TERN_DTYPE_Q2_K: quantize_q2_k(x, y); break;
        case TERN_DTYPE_Q3_K: quantize_q3_k(x, y); break;
        case TERN_DTYPE_IQ2_XXS: case TERN_DTYPE_IQ2_XS: case TERN_DTYPE_IQ2_S: quantize_iq2(t, x, y); break;
        case TERN_DTYPE_IQ3_XXS: case TERN_DTYPE_IQ3_S: quantize_iq3(t, x, y); break;
        default: quantize_iq1(t, x, y); break;
        }
    }
    return true;
}
