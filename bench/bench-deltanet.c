/* bench-deltanet: speed of the Gated DeltaNet core (conv + recurrence) for one layer
 * of Qwen3.5-0.8B's shape (16 k-heads, 16 v-heads, 128 x 128 state, conv 4), single
 * thread, per code path. Usage: bench-deltanet [n_tok] [reps] */
#include "kernels/deltanet.h"
#include "util/timeutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *randbuf(size_t n, float scale) {
    float *p = malloc(n * sizeof(float));
    if (!p) exit(1);
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = scale * ((float)(x >> 8) / 8388608.0f - 1.0f);
    }
    return p;
}

int main(int argc, char **argv) {
    const size_t n_tok = argc > 1 ? (size_t)atol(argv[1]) : 512;
    const int reps = argc > 2 ? atoi(argv[2]) : 3;
    const struct tern_deltanet_shape s = {
        .n_k_heads = 16, .n_v_heads = 16, .d_k = 128, .d_v = 128, .n_conv = 4, .eps = 1e-6f};
    if (tern_deltanet_shape_check(&s) != TERN_OK || n_tok == 0 || reps <= 0) return 1;
    const size_t C = tern_deltanet_channels(&s), nvd = (size_t)s.n_v_heads * s.d_v;
    float *x = randbuf(n_tok * C, 2), *y = randbuf(n_tok * C, 1), *w = randbuf(C * s.n_conv, 0.5f);
    float *win = randbuf(tern_deltanet_conv_floats(&s), 1), *z = randbuf(n_tok * nvd, 2);
    float *beta = randbuf(n_tok * s.n_v_heads, 2), *alpha = randbuf(n_tok * s.n_v_heads, 2);
    float *state = randbuf(tern_deltanet_state_floats(&s), 0.1f), *out = randbuf(n_tok * nvd, 1);
    float *a = randbuf(s.n_v_heads, 1), *dt = randbuf(s.n_v_heads, 1), *nw = randbuf(s.d_v, 1);
    float *scratch = randbuf(tern_deltanet_scratch_floats(&s), 1);
    for (uint32_t h = 0; h < s.n_v_heads; h++) a[h] = -0.5f - (a[h] > 0 ? a[h] : -a[h]);
    const struct tern_deltanet_params p = {.ssm_a = a, .dt_bias = dt, .norm_w = nw};
    const struct tern_deltanet_io io = {.n_tok = n_tok, .qkv = y, .ld_qkv = C, .z = z, .ld_z = nvd,
                                        .beta = beta, .ld_beta = s.n_v_heads, .alpha = alpha,
                                        .ld_alpha = s.n_v_heads, .out = out, .ld_out = nvd};
    const char *names[] = {"generic", "avx2"};
    printf("shape: 16 k-heads, 16 v-heads, d_k = d_v = 128, conv 4; %zu tokens, best of %d\n", n_tok,
           reps);
    for (int path = 0; path < 2; path++) {
        if (!tern_deltanet_set_path((enum tern_deltanet_path)path)) continue;
        double best_conv = 1e30, best_heads = 1e30;
        for (int r = 0; r < reps; r++) {
            uint64_t t0 = tern_now_ns();
            tern_deltanet_conv(&s, win, w, x, C, y, C, n_tok, 0, C);
            uint64_t t1 = tern_now_ns();
            tern_deltanet_heads(&s, &p, state, &io, 0, s.n_v_heads, scratch);
            uint64_t t2 = tern_now_ns();
            if ((double)(t1 - t0) < best_conv) best_conv = (double)(t1 - t0);
            if ((double)(t2 - t1) < best_heads) best_heads = (double)(t2 - t1);
        }
        /* per token and head: 2 passes over d_k*d_v with 3 and 4 flops per element */
        const double flops = (double)n_tok * s.n_v_heads * s.d_k * s.d_v * 7.0;
        printf("%-8s conv %7.2f us/token   recurrence %7.2f us/token (%.1f GFLOP/s)\n", names[path],
               best_conv / 1e3 / n_tok, best_heads / 1e3 / n_tok, flops / best_heads);
    }
    free(x); free(y); free(w); free(win); free(z); free(beta); free(alpha); free(state);
    free(out); free(a); free(dt); free(nw); free(scratch);
    return 0;
}
