/* tern bench memory: streaming read bandwidth of this machine, the bound that decode
 * (one token: every weight read once) can at best reach. Each thread sums its own
 * contiguous slice of a buffer much larger than the last-level cache; the best of
 * several passes is reported, for 1 thread and for N. */
#include "cli/cli.h"
#include "cli/opts.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <emmintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct mem_job {
    const uint8_t *p;
    size_t n;
    pthread_barrier_t *start, *done;
    int passes;
    uint64_t sink;
};

/* Reads n bytes (a multiple of 64) with 16-byte loads into four independent sums. */
static uint64_t read_stream(const uint8_t *p, size_t n) {
    __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n; i += 64) {
        s0 = _mm_add_epi64(s0, _mm_load_si128((const __m128i *)(p + i)));
        s1 = _mm_add_epi64(s1, _mm_load_si128((const __m128i *)(p + i + 16)));
        s2 = _mm_add_epi64(s2, _mm_load_si128((const __m128i *)(p + i + 32)));
        s3 = _mm_add_epi64(s3, _mm_load_si128((const __m128i *)(p + i + 48)));
    }
    const __m128i s = _mm_add_epi64(_mm_add_epi64(s0, s1), _mm_add_epi64(s2, s3));
    uint64_t out[2];
    _mm_storeu_si128((__m128i *)out, s);
    return out[0] + out[1];
}

static void *mem_worker(void *arg) {
    struct mem_job *j = arg;
    for (int i = 0; i < j->passes; i++) {
        pthread_barrier_wait(j->start);
        j->sink += read_stream(j->p, j->n);
        pthread_barrier_wait(j->done);
    }
    return NULL;
}

/* Best GB/s over passes with n_threads threads reading buf[0, size). */
static double measure(const uint8_t *buf, size_t size, int n_threads, int passes) {
    pthread_barrier_t start, done;
    pthread_barrier_init(&start, NULL, (unsigned)n_threads + 1);
    pthread_barrier_init(&done, NULL, (unsigned)n_threads + 1);
    struct mem_job jobs[64];
    pthread_t th[64];
    const size_t slice = size / (size_t)n_threads / 64 * 64;
    for (int i = 0; i < n_threads; i++) {
        jobs[i] = (struct mem_job){buf + (size_t)i * slice, slice, &start, &done, passes, 0};
        pthread_create(&th[i], NULL, mem_worker, &jobs[i]);
    }
    double best = 0;
    for (int i = 0; i < passes; i++) {
        pthread_barrier_wait(&start);
        const double t0 = tern_now_s();
        pthread_barrier_wait(&done);
        const double dt = tern_now_s() - t0;
        const double gbs = (double)slice * n_threads / dt * 1e-9;
        if (gbs > best) best = gbs;
    }
    uint64_t sink = 0;
    for (int i = 0; i < n_threads; i++) {
        pthread_join(th[i], NULL);
        sink += jobs[i].sink;
    }
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&done);
    if (sink == 42) fputc(' ', stderr); /* keeps the reads */
    return best;
}

static const struct cli_spec memory_cli = {
    "bench memory",
    "usage: tern bench memory [options]\n"
    "\n"
    "Streaming read bandwidth (GB/s = 1e9 bytes/s) of a buffer much larger than the\n"
    "caches, with 1 thread and with N threads; decode speed is bounded by it.\n"
    "\n",
    NULL,
};

static int bench_memory_main(int argc, char **argv) {
    long n_threads = sysconf(_SC_NPROCESSORS_ONLN), size_mib = 1024, passes = 5;
    bool json = false;
    const struct cli_opt opts[] = {
        CLI_INT("t|threads", &n_threads, 1, 64, "N", "threads for the parallel figure (default: online CPUs)"),
        CLI_INT("s|size-mib", &size_mib, 16, 1 << 20, "N", "buffer size in MiB (default 1024)"),
        CLI_INT("p|passes", &passes, 1, 1000, "N", "timed passes, best reported (default 5)"),
        CLI_FLAG("json", &json, "one JSON object instead of the table"),
        CLI_END,
    };
    int c = cli_parse(&memory_cli, opts, argc, argv, NULL);
    if (c >= 0) return c;
    if (n_threads < 1) n_threads = 1;
    const size_t size = (size_t)size_mib << 20;
    uint8_t *buf = tern_aligned_alloc(size);
    if (!buf) return cli_fail("bench memory", "cannot allocate %ld MiB", size_mib);
    memset(buf, 1, size); /* fault every page in before timing */
    const double one = measure(buf, size, 1, (int)passes);
    const double many = n_threads > 1 ? measure(buf, size, (int)n_threads, (int)passes) : one;
    tern_aligned_free(buf);
    if (json) {
        printf("{\"size_mib\": %ld, \"passes\": %ld, \"threads\": %ld, \"gbps_1\": %.2f, \"gbps_n\": %.2f}\n", size_mib,
               passes, n_threads, one, many);
    } else {
        printf("memory: streaming read of a %ld MiB buffer, best of %ld passes\n", size_mib, passes);
        printf("threads   GB/s\n");
        printf("%7d %6.2f\n", 1, one);
        if (n_threads > 1) printf("%7ld %6.2f\n", n_threads, many);
    }
    return 0;
}

TERN_BENCH("memory", "streaming read bandwidth (the decode bound), 1 and N threads", bench_memory_main)
