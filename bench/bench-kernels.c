/* bench-kernels: matrix kernel speed per weight type on Qwen3-0.6B-like shapes.
 *
 *   GEMV (n_tok = 1, decode): GB/s of weights streamed, over a pool of matrices much
 *   larger than the last-level cache, as a fraction of the streaming read bandwidth of
 *   the same pool measured (as `tern bench memory` does) just before each pass.
 *   GEMM (n_tok = 64 .. 512, prompt processing): GFLOP/s (2 * rows * k * n_tok / s).
 *
 * Threads split the rows as the engine does (contiguous ranges, never k), with a
 * persistent spinning pool so that small matrices are not dominated by thread start-up.
 * Timings take the best of several repetitions (the machine may be shared).
 *
 * usage: bench-kernels [--types q8_0,q4_k,...] [--threads 1,2] [--ntok 1,64,512]
 *                      [--shapes 3072x1024,...] [--isa portable|avx2] [--quick] [--cputime]
 * --cputime times 1-thread GEMM runs by thread CPU time (for a machine shared with others;
 * GEMV stays on wall time, like the bandwidth it is compared with). */
#include "bench-common.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "util/dtype.h"
#include "util/fp16.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <emmintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- a small spinning thread pool ------------------------------------------------------ */

struct job {
    enum tern_dtype type;
    const uint8_t *w;
    size_t wrb, k, rows;
    const uint8_t *a;
    size_t arb, n_tok;
    float *y;
};

#define MAX_THREADS 16
static int n_threads = 1;
static pthread_t workers[MAX_THREADS];
static _Atomic unsigned long generation;
static _Atomic int n_done;
static struct job cur;
static _Atomic int stop;

static void run_part(int i) {
    const size_t r0 = cur.rows * (size_t)i / (size_t)n_threads;
    const size_t r1 = cur.rows * (size_t)(i + 1) / (size_t)n_threads;
    tern_matmul(cur.type, cur.w, cur.wrb, cur.k, cur.a, cur.arb, cur.n_tok, cur.y, cur.rows, r0, r1);
}

static unsigned long gen_at_start;

static void *worker(void *arg) {
    const int i = (int)(intptr_t)arg;
    unsigned long seen = gen_at_start; /* jobs posted before this pool started are not ours */
    for (;;) {
        unsigned long g;
        for (int spins = 0; (g = atomic_load(&generation)) == seen; spins++) {
            if (atomic_load(&stop)) return NULL;
            if (spins < 4096) _mm_pause();
            else sched_yield(); /* a shared machine: let the other threads run */
        }
        seen = g;
        run_part(i);
        atomic_fetch_add(&n_done, 1);
    }
}

static void pool_start(int n) {
    n_threads = n;
    atomic_store(&stop, 0);
    gen_at_start = atomic_load(&generation);
    for (int i = 1; i < n; i++) pthread_create(&workers[i], NULL, worker, (void *)(intptr_t)i);
}

static void pool_stop(void) {
    atomic_store(&stop, 1);
    for (int i = 1; i < n_threads; i++) pthread_join(workers[i], NULL);
}

static void pool_run(const struct job *j) {
    cur = *j;
    atomic_store(&n_done, 0);
    atomic_fetch_add(&generation, 1);
    run_part(0);
    for (int spins = 0; atomic_load(&n_done) < n_threads - 1; spins++) {
        if (spins < 4096) _mm_pause();
        else sched_yield();
    }
}

/* ---- streaming read bound (as tern bench memory) -------------------------------------- */

static uint64_t read_stream(const uint8_t *p, size_t n) {
    __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n; i += 64) {
        s0 = _mm_add_epi64(s0, _mm_load_si128((const __m128i *)(p + i)));
        s1 = _mm_add_epi64(s1, _mm_load_si128((const __m128i *)(p + i + 16)));
        s2 = _mm_add_epi64(s2, _mm_load_si128((const __m128i *)(p + i + 32)));
        s3 = _mm_add_epi64(s3, _mm_load_si128((const __m128i *)(p + i + 48)));
    }
    uint64_t o[2];
    _mm_storeu_si128((__m128i *)o, _mm_add_epi64(_mm_add_epi64(s0, s1), _mm_add_epi64(s2, s3)));
    return o[0] + o[1];
}

struct rd {
    const uint8_t *p;
    size_t n;
    uint64_t s;
};
static void *rd_thread(void *arg) {
    struct rd *r = arg;
    r->s = read_stream(r->p, r->n);
    return NULL;
}

static double stream_bw(const uint8_t *buf, size_t size, int nt, int passes) {
    double best = 0;
    for (int p = 0; p < passes; p++) {
        struct rd r[MAX_THREADS];
        pthread_t th[MAX_THREADS];
        const size_t slice = size / (size_t)nt / 64 * 64;
        const double t0 = tern_now_s();
        for (int i = 0; i < nt; i++) {
            r[i] = (struct rd){buf + (size_t)i * slice, slice, 0};
            pthread_create(&th[i], NULL, rd_thread, &r[i]);
        }
        for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
        const double gbs = (double)slice * nt / (tern_now_s() - t0) * 1e-9;
        if (gbs > best) best = gbs;
    }
    return best;
}

/* ---- data: bench-common.h (rnd, fill_weights) ------------------------------------------ */

/* ---- measurements ---------------------------------------------------------------------- */

/* --cputime: time single-threaded runs by the thread's CPU time, so that a busy shared
 * machine (time slices taken by others) does not count against the kernel. */
static bool use_cputime;
static double now(void) {
    if (use_cputime && n_threads == 1) {
        struct timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    }
    return tern_now_s();
}

struct shape {
    size_t rows, k;
};

/* GEMV over a pool of matrices >= pool_bytes; returns GB/s of weights. Each pass is
 * preceded by a streaming read of the same pool with the same threads' count, so that
 * *bound gets the bandwidth available at that moment (a shared machine's varies). */
static double bench_gemv(enum tern_dtype t, struct shape s, size_t pool_bytes, int passes, double *bound) {
    uint64_t rb64;
    *bound = 0;
    if (!tern_dtype_row_size(t, s.k, &rb64)) return 0;
    const size_t rb = (size_t)rb64, mb = rb * s.rows;
    size_t n_mat = (pool_bytes + mb - 1) / mb;
    if (n_mat < 1) n_mat = 1;
    uint8_t *w = tern_aligned_alloc(mb * n_mat);
    float *x = malloc(s.k * sizeof(float));
    const size_t arb = tern_act_row_bytes(t, s.k);
    uint8_t *a = tern_aligned_alloc(arb);
    float *y = tern_aligned_alloc(s.rows * sizeof(float));
    if (!w || !x || !a || !y) {
        fprintf(stderr, "bench-kernels: out of memory\n");
        exit(1);
    }
    fill_weights(t, w, mb * n_mat);
    for (size_t i = 0; i < s.k; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
    tern_act_prepare(t, x, a, s.k);
    double best = 0;
    *bound = 0;
    for (int p = 0; p < passes; p++) {
        const double bw = stream_bw(w, mb * n_mat, n_threads, 1);
        if (bw > *bound) *bound = bw;
        const double t0 = tern_now_s(); /* wall time, like the bound */
        for (size_t m = 0; m < n_mat; m++) {
            const struct job j = {t, w + m * mb, rb, s.k, s.rows, a, arb, 1, y};
            pool_run(&j);
        }
        const double gbs = (double)(mb * n_mat) / (tern_now_s() - t0) * 1e-9;
        if (p > 0 && gbs > best) best = gbs; /* pass 0 warms up */
    }
    tern_aligned_free(w);
    free(x);
    tern_aligned_free(a);
    tern_aligned_free(y);
    return best;
}

/* GEMM with n_tok activation rows; returns GFLOP/s. */
static double bench_gemm(enum tern_dtype t, struct shape s, size_t n_tok, double min_seconds) {
    uint64_t rb64;
    if (!tern_dtype_row_size(t, s.k, &rb64)) return 0;
    const size_t rb = (size_t)rb64;
    const size_t arb = tern_act_row_bytes(t, s.k);
    uint8_t *w = tern_aligned_alloc(rb * s.rows);
    uint8_t *a = tern_aligned_alloc(arb * n_tok);
    float *x = malloc(s.k * sizeof(float));
    float *y = tern_aligned_alloc(s.rows * n_tok * sizeof(float));
    if (!w || !a || !x || !y) {
        fprintf(stderr, "bench-kernels: out of memory\n");
        exit(1);
    }
    fill_weights(t, w, rb * s.rows);
    for (size_t tk = 0; tk < n_tok; tk++) {
        for (size_t i = 0; i < s.k; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
        tern_act_prepare(t, x, a + tk * arb, s.k);
    }
    const struct job j = {t, w, rb, s.k, s.rows, a, arb, n_tok, y};
    pool_run(&j); /* warm-up */
    double best = 1e30, total = 0;
    int reps = 0;
    while ((total < min_seconds || reps < 3) && reps < 1000) {
        const double t0 = now();
        pool_run(&j);
        const double dt = now() - t0;
        if (dt < best) best = dt;
        total += dt;
        reps++;
    }
    tern_aligned_free(w);
    tern_aligned_free(a);
    free(x);
    tern_aligned_free(y);
    return 2.0 * (double)s.rows * (double)s.k * (double)n_tok / best * 1e-9;
}

/* ---- main -------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    const char *types_arg = "f32,f16,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,q4_k,q5_k,q6_k,iq4_nl,iq4_xs";
    const char *shapes_arg = "3072x1024,1024x3072,151936x1024";
    long threads[4] = {1, 2}, ntoks[8] = {1, 64, 512};
    int n_thr = 2, n_ntok = 3;
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--types") && i + 1 < argc) types_arg = argv[++i];
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) shapes_arg = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) n_thr = parse_list(argv[++i], threads, 4);
        else if (!strcmp(argv[i], "--ntok") && i + 1 < argc) n_ntok = parse_list(argv[++i], ntoks, 8);
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--cputime")) use_cputime = true;
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!tern_kernels_set_isa(!strcmp(v, "portable") ? TERN_ISA_PORTABLE : TERN_ISA_AVX2)) {
                fprintf(stderr, "bench-kernels: ISA %s not available\n", v);
                return 2;
            }
        } else {
            fprintf(stderr,
                    "usage: bench-kernels [--types q8_0,q4_k,...] [--threads 1,2] [--ntok 1,64,512]\n"
                    "                     [--shapes ROWSxK,...] [--isa portable|avx2] [--quick] [--cputime]\n");
            return 2;
        }
    }
    if (n_thr <= 0 || n_ntok <= 0) {
        fprintf(stderr, "bench-kernels: bad --threads or --ntok list\n");
        return 2;
    }
    struct shape shapes[8];
    int n_shapes = 0;
    for (const char *s = shapes_arg; *s && n_shapes < 8;) {
        char *end;
        shapes[n_shapes].rows = strtoul(s, &end, 10);
        if (*end != 'x') return fprintf(stderr, "bench-kernels: bad shape '%s'\n", s), 2;
        shapes[n_shapes].k = strtoul(end + 1, &end, 10);
        n_shapes++;
        s = *end == ',' ? end + 1 : end;
    }
    const size_t pool = (size_t)(quick ? 128 : 512) << 20;
    const int passes = quick ? 3 : 5;
    const double gemm_seconds = quick ? 0.2 : 0.6;

    uint8_t *buf = tern_aligned_alloc(pool);
    memset(buf, 1, pool);
    printf("kernels: isa %s; streaming read bound (%zu MiB):", tern_isa_name(tern_kernels_isa()), pool >> 20);
    double bound[4];
    for (int i = 0; i < n_thr; i++) {
        bound[i] = stream_bw(buf, pool, (int)threads[i], passes);
        printf(" %ld thr %.2f GB/s", threads[i], bound[i]);
    }
    printf("\n");
    tern_aligned_free(buf);

    enum tern_dtype types[TERN_DTYPE_COUNT];
    const char *bad = NULL;
    const int n_types = parse_types(types_arg, tern_matmul_supported, types, TERN_DTYPE_COUNT, &bad);
    if (n_types < 0) {
        fprintf(stderr, "bench-kernels: unknown or unsupported type '%s'\n", bad);
        return 2;
    }
    printf("%-5s %-12s %3s", "type", "rows x k", "thr");
    for (int n = 0; n < n_ntok; n++) {
        if (ntoks[n] == 1) printf("   GEMV GB/s (bound)");
        else printf("  GEMM n=%-3ld GFLOP/s", ntoks[n]);
    }
    printf("\n");
    for (int ty = 0; ty < n_types; ty++) {
        const enum tern_dtype t = types[ty];
        for (int si = 0; si < n_shapes; si++) {
            if (shapes[si].k % tern_matmul_k_multiple(t)) continue;
            for (int ti = 0; ti < n_thr; ti++) {
                pool_start((int)threads[ti]);
                printf("%-5s %6zux%-5zu %3ld", tern_dtype_name(t), shapes[si].rows, shapes[si].k, threads[ti]);
                fflush(stdout);
                for (int n = 0; n < n_ntok; n++) {
                    if (ntoks[n] == 1) {
                        double b = 0;
                        const double g = bench_gemv(t, shapes[si], pool, passes, &b);
                        printf("   %7.2f (%4.0f%%)    ", g, 100.0 * g / b);
                    } else {
                        /* the vocabulary projection is only ever run for a few rows */
                        if (shapes[si].rows > 65536) {
                            printf("  %18s", "-");
                            continue;
                        }
                        printf("  %18.1f", bench_gemm(t, shapes[si], (size_t)ntoks[n], gemm_seconds));
                    }
                    fflush(stdout);
                }
                printf("\n");
                pool_stop();
            }
        }
    }
    return 0;
}
