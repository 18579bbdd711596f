/* bench-attn: the attention page kernels alone, single thread: nq queries of one kv head
 * over a context of n_pos positions in pages of 256, the way the driver calls them —
 * attn_page once per query and page ("single", the driver before attn_page_multi) or
 * attn_page_multi once per page for all the queries ("multi") — and whether the two gave
 * the same bits. For timing and for instruction counts under callgrind (which runs the
 * AVX2 loops: valgrind has no AVX-512). Times are the thread's CPU time (best of reps),
 * so that a machine shared with other work still gives usable figures.
 *
 *   bench-attn [--d 128] [--nq 16] [--pos 4096] [--f32] [--mode both|single|multi]
 *              [--reps 3] [--isa portable|avx2] [--avx512 0|1] */
#include "kernels/ops.h"
#include "util/fp16.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PAGE 256

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench-attn: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static uint32_t rnd = 12345;
static float frand(void) {
    rnd = rnd * 1664525u + 1013904223u;
    return (float)(rnd >> 8) / 8388608.0f - 1.0f;
}

static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One pass over the context for all queries; returns seconds. */
static double run(const struct tern_ops *o, int multi, size_t d, size_t nq, size_t n_pages, size_t n_pos, bool f16,
                  void *const *kp, void *const *vp, const float *q, float *acc, float *ml, float *scratch) {
    struct tern_attn_query qs[TERN_ATTN_MAX_Q];
    for (size_t a = 0; a < nq; a++) {
        ml[2 * a] = -INFINITY, ml[2 * a + 1] = 0.0f;
        qs[a] = (struct tern_attn_query){q + a * d, acc + a * d, &ml[2 * a], &ml[2 * a + 1]};
    }
    memset(acc, 0, nq * d * sizeof(float));
    const uint64_t t0 = cpu_ns();
    for (size_t pg = 0; pg < n_pages; pg++) {
        const size_t n = n_pos - pg * PAGE < PAGE ? n_pos - pg * PAGE : PAGE;
        if (multi) o->attn_page_multi(qs, nq, d, kp[pg], vp[pg], d, n, 0.088f, f16, scratch);
        else
            for (size_t a = 0; a < nq; a++)
                o->attn_page(qs[a].acc, qs[a].m, qs[a].l, qs[a].q, d, kp[pg], vp[pg], d, n, 0.088f, f16, scratch);
    }
    return (double)(cpu_ns() - t0) * 1e-9;
}

int main(int argc, char **argv) {
    size_t d = 128, nq = 16, n_pos = 4096;
    int reps = 3, modes = 3; /* bit 0 single, bit 1 multi */
    bool f16 = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--f32")) f16 = false;
        else if (!v) goto usage;
        else if (!strcmp(a, "--d")) d = (size_t)atol(v), i++;
        else if (!strcmp(a, "--nq")) nq = (size_t)atol(v), i++;
        else if (!strcmp(a, "--pos")) n_pos = (size_t)atol(v), i++;
        else if (!strcmp(a, "--reps")) reps = atoi(v), i++;
        else if (!strcmp(a, "--mode")) modes = !strcmp(v, "single") ? 1 : !strcmp(v, "multi") ? 2 : 3, i++;
        else if (!strcmp(a, "--isa")) {
            if (!tern_kernels_set_isa(!strcmp(v, "portable") ? TERN_ISA_PORTABLE : TERN_ISA_AVX2)) goto usage;
            i++;
        } else if (!strcmp(a, "--avx512")) tern_kernels_set_avx512(atoi(v) != 0), i++;
        else goto usage;
    }
    if (d == 0 || nq == 0 || nq > TERN_ATTN_MAX_Q || n_pos == 0 || reps <= 0) goto usage;
    const struct tern_ops *o = tern_ops();
    const size_t n_pages = (n_pos + PAGE - 1) / PAGE, es = f16 ? 2 : 4;
    void **kp = xmalloc(n_pages * sizeof *kp), **vp = xmalloc(n_pages * sizeof *vp);
    for (size_t pg = 0; pg < n_pages; pg++) {
        kp[pg] = xmalloc(PAGE * d * es), vp[pg] = xmalloc(PAGE * d * es);
        for (size_t e = 0; e < PAGE * d; e++) {
            const float kv = frand(), vv = frand();
            if (f16) ((uint16_t *)kp[pg])[e] = tern_f32_to_fp16(kv), ((uint16_t *)vp[pg])[e] = tern_f32_to_fp16(vv);
            else ((float *)kp[pg])[e] = kv, ((float *)vp[pg])[e] = vv;
        }
    }
    float *q = xmalloc(nq * d * 4), *acc[2] = {xmalloc(nq * d * 4), xmalloc(nq * d * 4)}, ml[2][2 * TERN_ATTN_MAX_Q];
    float *scratch = xmalloc(tern_attn_multi_scratch_floats(nq, PAGE, d) * 4);
    for (size_t i = 0; i < nq * d; i++) q[i] = 2.0f * frand();
    const double flops = 4.0 * (double)nq * (double)n_pos * (double)d;
    printf("ops %s%s, head_dim %zu, %zu queries, %zu positions (%zu pages), %s KV, best of %d\n", o->name,
           tern_kernels_avx512() ? " (AVX-512 loops)" : "", d, nq, n_pos, n_pages, f16 ? "F16" : "F32", reps);
    for (int multi = 0; multi < 2; multi++) {
        if (!(modes & (1 << multi))) continue;
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            const double t = run(o, multi, d, nq, n_pages, n_pos, f16, kp, vp, q, acc[multi], ml[multi], scratch);
            if (t < best) best = t;
        }
        printf("%-6s %9.3f ms  %6.1f GFLOP/s\n", multi ? "multi" : "single", best * 1e3, flops / best * 1e-9);
    }
    if (modes == 3)
        printf("same bits: %s\n",
               !memcmp(acc[0], acc[1], nq * d * 4) && !memcmp(ml[0], ml[1], 2 * nq * sizeof(float)) ? "yes" : "NO");
    for (size_t pg = 0; pg < n_pages; pg++) free(kp[pg]), free(vp[pg]);
    free(kp), free(vp), free(q), free(acc[0]), free(acc[1]), free(scratch);
    return 0;
usage:
    fprintf(stderr, "usage: bench-attn [--d N] [--nq 1..%d] [--pos N] [--f32] [--mode both|single|multi] [--reps N] "
                    "[--isa portable|avx2] [--avx512 0|1]\n",
            TERN_ATTN_MAX_Q);
    return 2;
}
