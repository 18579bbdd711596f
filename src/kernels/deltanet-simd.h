/* The vector code of deltanet.c, written once for a vector type and included three times
 * by deltanet.c only: 16 lanes compiled for AVX-512, 8 lanes for AVX2, and 4 lanes (SSE2,
 * baseline x86-64, or whatever the compiler has) for the portable path. Not a public
 * header.
 *
 * Parameters (macros defined by the includer):
 *   DN_V     the float vector type, DN_L floats wide (DN_L is 4, 8 or 16)
 *   DN_SUMSQ8 (DN_L 16 only) the 8-lane instantiation's sumsq, whose order it keeps
 *   DN_VI    the int32 vector type of the same width
 *   DN_FN(x) the name of x for this instantiation (adds a suffix)
 *   DN_ATTR  attributes of the instantiated functions (the target ISA)
 * The header undefines them (and its own macros) at its end.
 *
 * Exactness: every loop here runs along lanes (channels or value indices) with one
 * accumulator per lane and no FMA, and every lane performs the same operations in the
 * same order as the scalar code for an element in a loop tail. The only reduction
 * across elements, sumsq, fixes its order independently of DN_L. So both
 * instantiations, and any split of the lanes into blocks, give the same bits. */

#define VLD(v, p) memcpy(&(v), (p), sizeof(DN_V))
#define VST(p, v) memcpy((p), &(v), sizeof(DN_V))
#define VSPLAT(f) ((DN_V){0} + (f))
#define VISPLAT(i) ((DN_VI){0} + (i))

/* silu on DN_L lanes: the vector twin of silu1() */
#define VSILU(out, in)                                                                     \
    do {                                                                                   \
        const DN_V x_ = (in);                                                              \
        DN_V a_ = -x_;                                                                     \
        DN_VI m_ = a_ < VSPLAT(EXP_LO);                                                    \
        a_ = (DN_V)((m_ & (DN_VI)VSPLAT(EXP_LO)) | (~m_ & (DN_VI)a_));                     \
        m_ = a_ > VSPLAT(EXP_HI);                                                          \
        a_ = (DN_V)((m_ & (DN_VI)VSPLAT(EXP_HI)) | (~m_ & (DN_VI)a_));                     \
        const DN_V t_ = a_ * EXP_LOG2E + 0.5f;                                             \
        DN_VI n_ = __builtin_convertvector(t_, DN_VI);                                     \
        n_ += (DN_VI)(__builtin_convertvector(n_, DN_V) > t_); /* floor: true is -1 */     \
        const DN_V nf_ = __builtin_convertvector(n_, DN_V);                                \
        DN_V r_ = a_ - nf_ * EXP_C1;                                                       \
        r_ = r_ - nf_ * EXP_C2;                                                            \
        DN_V p_ = VSPLAT(EXP_P0);                                                          \
        p_ = p_ * r_ + EXP_P1;                                                             \
        p_ = p_ * r_ + EXP_P2;                                                             \
        p_ = p_ * r_ + EXP_P3;                                                             \
        p_ = p_ * r_ + EXP_P4;                                                             \
        p_ = p_ * r_ + EXP_P5;                                                             \
        const DN_V e_ = (p_ * (r_ * r_) + r_) + 1.0f;                                      \
        const DN_V sc_ = (DN_V)((n_ + VISPLAT(127)) << 23);                                \
        (out) = x_ / (1.0f + e_ * sc_);                                                    \
    } while (0)

static inline DN_ATTR __attribute__((always_inline)) void DN_FN(silu_row)(float *y, const float *x,
                                                                          size_t n) {
    size_t i = 0;
    for (; i + DN_L <= n; i += DN_L) {
        DN_V v, r;
        VLD(v, x + i);
        VSILU(r, v);
        VST(y + i, r);
    }
    for (; i < n; i++) y[i] = silu1(x[i]);
}

/* Sum of squares in the fixed order of sumsq_order() (deltanet.c): eight lane
 * accumulators over whole blocks of 8, combined pairwise, then the tail in order. A
 * serial double sum (ggml's order) would be a chain of n dependent adds, which cost
 * more than the state update it serves. */
static inline DN_ATTR __attribute__((always_inline)) float DN_FN(sumsq)(const float *x, size_t n) {
#if DN_L > 8
    return DN_SUMSQ8(x, n); /* eight lane accumulators, whatever the vector width */
#else
    size_t i = 0;
    float total = 0.0f;
    if (n >= 8) {
        DN_V acc[8 / DN_L];
        for (int u = 0; u < 8 / DN_L; u++) acc[u] = VSPLAT(0.0f);
        for (; i + 8 <= n; i += 8)
            for (int u = 0; u < 8 / DN_L; u++) {
                DN_V v;
                VLD(v, x + i + u * DN_L);
                acc[u] += v * v;
            }
        float l[8];
        for (int u = 0; u < 8 / DN_L; u++) VST(l + u * DN_L, acc[u]);
        total = sumsq_combine8(l);
    }
    for (; i < n; i++) total += x[i] * x[i];
    return total;
#endif
}

/* ---- convolution ------------------------------------------------------------------- */

/* y[c] = a[c] * w[c] (first tap) or y[c] += a[c] * w[c] (the others), c in [0, n) */
static inline DN_ATTR __attribute__((always_inline)) void DN_FN(tap_row)(float *y, const float *a,
                                                                         const float *w, size_t n,
                                                                         bool first) {
    size_t c = 0;
    for (; c + DN_L <= n; c += DN_L) {
        DN_V va, vw, vy;
        VLD(va, a + c);
        VLD(vw, w + c);
        if (first) {
            vy = va * vw;
        } else {
            VLD(vy, y + c);
            vy = vy + va * vw;
        }
        VST(y + c, vy);
    }
    for (; c < n; c++) y[c] = first ? a[c] * w[c] : y[c] + a[c] * w[c];
}

static DN_ATTR void DN_FN(conv)(const struct tern_deltanet_shape *s, float *window,
                                const float *conv_wt, const float *x, size_t ldx, float *y,
                                size_t ldy, size_t n_tok, size_t c0, size_t c1) {
    const size_t C = tern_deltanet_channels(s);
    const size_t K = s->n_conv;
    const size_t W = K - 1; /* window rows */
    const size_t n = c1 - c0;
    for (size_t t = 0; t < n_tok; t++) {
        float *yt = y + t * ldy + c0;
        /* tap j meets row t + j of (window ++ x); taps summed in ascending order */
        for (size_t j = 0; j < K; j++) {
            const size_t r = t + j;
            const float *in = r < W ? window + r * C : x + (r - W) * ldx;
            DN_FN(tap_row)(yt, in + c0, conv_wt + j * C + c0, n, j == 0);
        }
        DN_FN(silu_row)(yt, yt, n);
    }
    /* New window row j = row n_tok + j of (old window ++ x). Ascending j reads only
     * rows at or above the one it writes, so updating in place is safe. */
    for (size_t j = 0; j < W; j++) {
        const size_t r = n_tok + j;
        float *dst = window + j * C;
        if (r < W)
            memcpy(dst + c0, window + r * C + c0, n * sizeof(float));
        else
            memcpy(dst + c0, x + (r - W) * ldx + c0, n * sizeof(float));
    }
}

static DN_ATTR void DN_FN(silu)(float *y, const float *x, size_t n) { DN_FN(silu_row)(y, x, n); }

/* ---- recurrence -------------------------------------------------------------------- */

/* The state passes for value lanes [j0, j0 + NV*DN_L), walking the key index i down
 * the rows with the lane accumulators in registers:
 *   decay_read:   S = S * dec;                kv = S^T k
 *   write_read:   S = S + k (x) delta;        o = S^T q
 *   fused:        write_read for token t, then decay_read for token t+1, in one sweep
 *                 (each element sees the same operations in the same order as with the
 *                 two passes, so the bits are the same). */
#define DN_BLOCK(NV)                                                                       \
    static inline DN_ATTR __attribute__((always_inline)) void DN_FN(decay_read_##NV)(      \
        float *S, size_t d_k, size_t d_v, size_t j0, float decay, const float *k,          \
        float *kv) {                                                                       \
        DN_V acc[NV];                                                                      \
        _Pragma("GCC unroll 4") for (int u = 0; u < NV; u++) acc[u] = VSPLAT(0.0f);        \
        for (size_t i = 0; i < d_k; i++) {                                                 \
            float *row = S + i * d_v + j0;                                                 \
            const float ki = k[i];                                                         \
            _Pragma("GCC unroll 4") for (int u = 0; u < NV; u++) {                         \
                DN_V sv;                                                                   \
                VLD(sv, row + DN_L * u);                                                   \
                sv = sv * decay;                                                           \
                VST(row + DN_L * u, sv);                                                   \
                acc[u] += sv * ki;                                                         \
            }                                                                              \
        }                                                                                  \
        _Pragma("GCC unroll 4") for (int u = 0; u < NV; u++) VST(kv + j0 + DN_L * u, acc[u]); \
    }                                                                                      \
    static inline DN_ATTR __attribute__((always_inline)) void DN_FN(write_read_##NV)(      \
        float *S, size_t d_k, size_t d_v, size_t j0, const float *k, const float *q,       \
        const float *delta, float *o) {                                                    \
        DN_V dl[NV], acc[NV];                                                              \
        _Pragma("GCC unroll 4") for (int u = 0; u < NV; u++) {                             \
            VLD(dl[u], delta + j0 + DN_L * u);                                             \
            acc[u] = VSPLAT(0.0f);                                                         \
        }                                                                                  \
        for (size_t i = 0; i < d_k; i++) {                                                 \
            float *row = S + i * d_v + j0;                                                 \
            const float ki = k[i], qi = q[i];                                              \
            _Pragma("GCC unroll 4") for (int u = 0; u < NV; u++) {                         \
                DN_V sv;                                                                   \
                VLD(sv, row + DN_L * u);                                                   \
                sv = sv + ki * dl[u];                                                      \
                VST(row + DN_L * u, sv);                                                   \
                acc[u] += sv * qi;                                                         \
            }                                                                              \
        }                                                                                  \
        _Pragma("GCC unroll 4") for (int u = 0; u < NV; u++) VST(o + j0 + DN_L * u, acc[u]); \
    }                                                                                      \
    static inline DN_ATTR __attribute__((always_inline)) void DN_FN(fused_##NV)(           \
        float *S, size_t d_k, size_t d_v, size_t j0, const float *k, const float *q,       \
        const float *delta, float *o, float decay, const float *k2, float *kv2) {          \
        DN_V dl[NV], acc[NV], acc2[NV];                                                    \
        _Pragma("GCC unroll 4") for (int u = 0; u < NV; u++) {                             \
            VLD(dl[u], delta + j0 + DN_L * u);                                             \
            acc[u] = VSPLAT(0.0f);                                                         \
            acc2[u] = VSPLAT(0.0f);                                                        \
        }                                                                                  \
        for (size_t i = 0; i < d_k; i++) {                                                 \
            float *row = S + i * d_v + j0;                                                 \
            const float ki = k[i], qi = q[i], k2i = k2[i];                                 \
            _Pragma("GCC unroll 4") for (int u = 0; u < NV; u++) {                         \
                DN_V sv;                                                                   \
                VLD(sv, row + DN_L * u);                                                   \
                sv = sv + ki * dl[u];                                                      \
                acc[u] += sv * qi;                                                         \
                sv = sv * decay;                                                           \
                VST(row + DN_L * u, sv);                                                   \
                acc2[u] += sv * k2i;                                                       \
            }                                                                              \
        }                                                                                  \
        _Pragma("GCC unroll 4") for (int u = 0; u < NV; u++) {                             \
            VST(o + j0 + DN_L * u, acc[u]);                                                \
            VST(kv2 + j0 + DN_L * u, acc2[u]);                                             \
        }                                                                                  \
    }
DN_BLOCK(4)
DN_BLOCK(1)
#undef DN_BLOCK

/* delta[j] = (v[j] - kv[j]) * beta for j in [j0, j1) */
static inline DN_ATTR __attribute__((always_inline)) void DN_FN(delta_row)(float *delta,
                                                                           const float *v,
                                                                           const float *kv,
                                                                           float beta, size_t j0,
                                                                           size_t j1) {
    size_t j = j0;
    for (; j + DN_L <= j1; j += DN_L) {
        DN_V vv, kk;
        VLD(vv, v + j);
        VLD(kk, kv + j);
        vv = (vv - kk) * beta;
        VST(delta + j, vv);
    }
    for (; j < j1; j++) delta[j] = (v[j] - kv[j]) * beta;
}

/* All tokens of a sub-chunk for value lanes [j0, j1), in token order (see heads). */
#define DN_RUN(B, DECAY_READ, WRITE_READ, FUSED)                                           \
    static inline DN_ATTR __attribute__((always_inline)) void DN_FN(run_##B)(              \
        float *S, size_t d_k, size_t d_v, size_t j0, size_t j1, const struct sub_chunk *c, \
        float *kv, float *delta) {                                                         \
        DECAY_READ(S, d_k, d_v, j0, c->decay[0], c->k[0], kv);                             \
        for (size_t t = 0; t < c->n; t++) {                                                \
            DN_FN(delta_row)(delta, c->v[t], kv, c->beta[t], j0, j1);                      \
            if (t + 1 < c->n)                                                              \
                FUSED(S, d_k, d_v, j0, c->k[t], c->q[t], delta, c->o[t], c->decay[t + 1],  \
                      c->k[t + 1], kv);                                                    \
            else                                                                           \
                WRITE_READ(S, d_k, d_v, j0, c->k[t], c->q[t], delta, c->o[t]);             \
        }                                                                                  \
    }
DN_RUN(4, DN_FN(decay_read_4), DN_FN(write_read_4), DN_FN(fused_4))
DN_RUN(1, DN_FN(decay_read_1), DN_FN(write_read_1), DN_FN(fused_1))
DN_RUN(tail, decay_read_tail, write_read_tail, fused_tail)
#undef DN_RUN

/* Per v-head, the chunk's tokens go through the state in sub-chunks of DN_SUB: the
 * inputs of a sub-chunk are prepared, then each block of value lanes runs through all
 * of its tokens before the next block. Lanes are independent (column j of S only
 * meets q, k and its own delta[j]), so this gives the same bits as running every lane
 * token by token, while the block's d_k x (4 * DN_L) slice of the state stays in L1
 * instead of the head's whole state streaming through L2 for each token. */
static DN_ATTR void DN_FN(heads)(const struct tern_deltanet_shape *s,
                                 const struct tern_deltanet_params *p, float *state,
                                 const struct tern_deltanet_io *io, uint32_t h0, uint32_t h1,
                                 float *scratch) {
    const size_t d_k = s->d_k, d_v = s->d_v, n_k = s->n_k_heads;
    float *kv = scratch + DN_SUB * 2 * d_k, *delta = kv + d_v, *sz = delta + d_v;
    const float q_scale = 1.0f / sqrtf((float)d_k);
    struct sub_chunk c;
    for (uint32_t h = h0; h < h1; h++) {
        float *S = state + (size_t)h * d_k * d_v;
        /* qwen35: ggml_repeat tiles the k-heads over the v-heads; qwen3next groups them */
        const size_t hk = s->k_grouped ? h / (s->n_v_heads / n_k) : h % n_k;
        for (size_t t0 = 0; t0 < io->n_tok; t0 += DN_SUB) {
            c.n = io->n_tok - t0 < DN_SUB ? io->n_tok - t0 : DN_SUB;
            for (size_t u = 0; u < c.n; u++) {
                const size_t t = t0 + u;
                const float *row = io->qkv + t * io->ld_qkv;
                const float *q = row + hk * d_k, *k = row + (n_k + hk) * d_k;
                float *qn = scratch + u * 2 * d_k, *kn = qn + d_k;
                const float qinv = 1.0f / fmaxf(sqrtf(DN_FN(sumsq)(q, d_k)), s->eps);
                const float kinv = 1.0f / fmaxf(sqrtf(DN_FN(sumsq)(k, d_k)), s->eps);
                for (size_t i = 0; i < d_k; i++) {
                    qn[i] = (q[i] * qinv) * q_scale;
                    kn[i] = k[i] * kinv;
                }
                c.q[u] = qn;
                c.k[u] = kn;
                c.v[u] = row + 2 * n_k * d_k + (size_t)h * d_v;
                c.o[u] = io->out + t * io->ld_out + (size_t)h * d_v;
                const float g =
                    p->ssm_a[h] * softplus(io->alpha[t * io->ld_alpha + h] + p->dt_bias[h]);
                c.decay[u] = expf(g);
                c.beta[u] = sigmoid(io->beta[t * io->ld_beta + h]);
            }
            size_t j0 = 0;
            for (; j0 + 4 * DN_L <= d_v; j0 += 4 * DN_L)
                DN_FN(run_4)(S, d_k, d_v, j0, j0 + 4 * DN_L, &c, kv, delta);
            for (; j0 + DN_L <= d_v; j0 += DN_L)
                DN_FN(run_1)(S, d_k, d_v, j0, j0 + DN_L, &c, kv, delta);
            if (j0 < d_v) DN_FN(run_tail)(S, d_k, d_v, j0, d_v, &c, kv, delta);
            /* out = rmsnorm(o) * norm_w * silu(z), in place over o */
            for (size_t u = 0; u < c.n; u++) {
                float *o = c.o[u];
                const float *z = io->z + (t0 + u) * io->ld_z + (size_t)h * d_v;
                const float r = 1.0f / sqrtf(DN_FN(sumsq)(o, d_v) / (float)d_v + s->eps);
                DN_FN(silu_row)(sz, z, d_v);
                for (size_t j = 0; j < d_v; j++) o[j] = ((o[j] * r) * p->norm_w[j]) * sz[j];
            }
        }
    }
}

#undef VLD
#undef VST
#undef VSPLAT
#undef VISPLAT
#undef VSILU
/* the includer's parameters too, so that the next instantiation defines its own */
#undef DN_V
#undef DN_VI
#undef DN_L
#undef DN_FN
#undef DN_ATTR
#undef DN_SUMSQ8
