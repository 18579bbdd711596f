/* bench-vulkan: the Vulkan kernels' speed, per kernel, on one device (docs/gpu.md).
 *
 *   copy: a device-to-device copy of a buffer (vkCmdCopyBuffer), bytes read + written per
 *   second: the device's memory bandwidth as this API reaches it, the bound the figures
 *   below are read against (Vulkan reports no peak; `nvidia-smi` and the data sheet do).
 *   matmul, one token (decode): GB/s of weights read, and that as a share of the copy's.
 *   matmul, n tokens (prefill): GFLOP/s (2 rows k n per dispatch).
 *   attention, one token at a context of C positions (F16 cache): GB/s of K and V read,
 *   folded in one dispatch and split over the cache's pages (the split is what a GPU
 *   takes; their ratio is the split's gain), and a chunk of --chunk tokens (512) ending
 *   at C: GFLOP/s (4 d_head per key, query and head).
 *
 * Each figure is the best of three timed recordings, each of as many dispatches as take
 * 0.2 s (at least 2), after one warm-up; a recording is one submit and one wait, so the
 * host's share is small. Timings are for reading, never a pass or fail: the smoke test
 * (bench-vulkan --quick) checks only that every kernel ran.
 *
 * usage: bench-vulkan [--device N] [--types q8_0,q4_k,...] [--shape ROWSxK] [--ntok 1,8,512]
 *                     [--ctx 4096,16384] [--chunk 512] [--quick]
 * --quick: small shapes (a smoke test's, or lavapipe's). */
#include "bench-common.h"
#include "backend/vulkan/vulkan.h"
#include "util/dtype.h"
#include "util/fp16.h"
#include "util/timeutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct tern_vk *vk;

static struct tern_vk_buf *dev_buf(size_t bytes) {
    struct tern_vk_buf *b = NULL;
    if (tern_vk_buf_new(vk, bytes, &b)) {
        fprintf(stderr, "bench-vulkan: %s\n", tern_last_error());
        exit(1);
    }
    return b;
}

static void upload(struct tern_vk_buf *b, const void *src, size_t bytes) {
    if (tern_vk_upload(b, 0, src, bytes)) {
        fprintf(stderr, "bench-vulkan: %s\n", tern_last_error());
        exit(1);
    }
}

/* One operation to time: records itself once (the kernel's own entry point). */
struct op {
    enum tern_status (*run)(const struct op *o);
    enum tern_dtype type;
    struct tern_vk_buf *w, *x, *y, *k, *v;
    size_t rows, kdim, n_tok, pos0, n_head, n_kv, hd;
    int split;
};

/* Seconds per operation: the best of three recordings of as many as take 0.2 s. Exits on
 * an error (the benchmark's kernels must all run). */
static double time_op(const struct op *o, const char *what) {
    enum tern_status st = o->run(o); /* warm-up: pipelines, caches */
    if (st) {
        fprintf(stderr, "bench-vulkan: %s: %s\n", what, tern_last_error());
        exit(1);
    }
    double t0 = tern_now_s();
    st = o->run(o);
    const double one = tern_now_s() - t0;
    int reps = one > 0 ? (int)(0.2 / one) : 100;
    if (reps < 2) reps = 2;
    if (reps > 1000) reps = 1000;
    double best = 1e30;
    for (int trial = 0; trial < 3 && !st; trial++) {
        if ((st = tern_vk_begin(vk))) break;
        t0 = tern_now_s();
        for (int r = 0; r < reps && !st; r++) st = o->run(o);
        if (!st) st = tern_vk_end(vk);
        const double dt = (tern_now_s() - t0) / reps;
        if (dt < best) best = dt;
    }
    if (st) {
        fprintf(stderr, "bench-vulkan: %s: %s\n", what, tern_last_error());
        exit(1);
    }
    return best;
}

static enum tern_status run_copy(const struct op *o) { return tern_vk_copy(vk, o->x, 0, o->y, 0, o->rows); }

static enum tern_status run_matmul(const struct op *o) {
    return tern_vk_matmul(vk, o->type, o->w, o->kdim, o->rows, o->x, o->n_tok, o->y);
}

static enum tern_status run_attention(const struct op *o) {
    const size_t group = o->n_head / o->n_kv, qh = group < 8 ? group : 8, qt = 8 / qh;
    return tern_vk_attention_tile(vk, o->x, o->n_head * o->hd, o->k, o->v, o->y, o->n_head * o->hd, 0, o->n_tok,
                                  o->pos0, o->n_head, o->n_kv, o->hd, 1.0f / sqrtf((float)o->hd), true, 0, NULL, qh,
                                  qt < o->n_tok ? qt : o->n_tok, o->split);
}

static double bench_copy(size_t bytes) {
    struct op o = {.run = run_copy, .rows = bytes};
    o.x = dev_buf(bytes);
    o.y = dev_buf(bytes);
    uint8_t *h = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) h[i] = (uint8_t)rnd();
    upload(o.x, h, bytes);
    free(h);
    const double t = time_op(&o, "copy");
    tern_vk_buf_free(o.x), tern_vk_buf_free(o.y);
    return 2.0 * (double)bytes / t * 1e-9;
}

static void bench_matmul(enum tern_dtype t, size_t rows, size_t k, const long *ntoks, int n_ntok, double copy_gbs) {
    uint64_t rb;
    if (!tern_dtype_row_size(t, k, &rb)) {
        printf("%-8s %zux%zu: k is not a whole number of blocks\n", tern_dtype_name(t), rows, k);
        return;
    }
    const size_t wb = (size_t)rb * rows;
    size_t max_tok = 1;
    for (int i = 0; i < n_ntok; i++)
        if ((size_t)ntoks[i] > max_tok) max_tok = (size_t)ntoks[i];
    struct op o = {.run = run_matmul, .type = t, .rows = rows, .kdim = k};
    o.w = dev_buf(wb);
    o.x = dev_buf(max_tok * k * sizeof(float));
    o.y = dev_buf(max_tok * rows * sizeof(float));
    uint8_t *h = malloc(wb > max_tok * k * sizeof(float) ? wb : max_tok * k * sizeof(float));
    fill_weights(t, h, wb);
    upload(o.w, h, wb);
    float *x = (float *)h;
    for (size_t i = 0; i < max_tok * k; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
    upload(o.x, x, max_tok * k * sizeof(float));
    free(h);
    if (tern_vk_matmul_prepare(vk, t, false)) {
        fprintf(stderr, "bench-vulkan: %s\n", tern_last_error());
        exit(1);
    }
    char what[64];
    for (int i = 0; i < n_ntok; i++) {
        o.n_tok = (size_t)ntoks[i];
        snprintf(what, sizeof what, "matmul %s n=%zu", tern_dtype_name(t), o.n_tok);
        const double s = time_op(&o, what);
        const double gflops = 2.0 * (double)rows * (double)k * (double)o.n_tok / s * 1e-9;
        if (o.n_tok == 1)
            printf("%-8s %6zux%-6zu n=%-4zu %9.1f us  %8.1f GB/s of weights (%3.0f%% of copy)  %8.1f GFLOP/s\n",
                   tern_dtype_name(t), rows, k, o.n_tok, s * 1e6, (double)wb / s * 1e-9,
                   100.0 * (double)wb / s * 1e-9 / copy_gbs, gflops);
        else
            printf("%-8s %6zux%-6zu n=%-4zu %9.1f us  %8.1f GB/s of weights                 %8.1f GFLOP/s\n",
                   tern_dtype_name(t), rows, k, o.n_tok, s * 1e6, (double)wb / s * 1e-9, gflops);
    }
    tern_vk_buf_free(o.w), tern_vk_buf_free(o.x), tern_vk_buf_free(o.y);
}

/* Attention of a Qwen3-8B layer's shape (32 query heads, 8 KV heads of 128, F16 cache). */
static void bench_attention(size_t ctx, size_t chunk, double copy_gbs) {
    const size_t nh = 32, nkv = 8, hd = 128;
    if (chunk > ctx + 1) chunk = ctx + 1;
    const size_t pages = (ctx + 1 + 255) / 256, cache = pages * 256 * nkv * hd * 2;
    struct op o = {.run = run_attention, .n_head = nh, .n_kv = nkv, .hd = hd};
    o.k = dev_buf(cache);
    o.v = dev_buf(cache);
    o.x = dev_buf(chunk * nh * hd * sizeof(float));
    o.y = dev_buf(chunk * nh * hd * sizeof(float));
    uint16_t *h = malloc(cache);
    for (size_t i = 0; i < cache / 2; i++) h[i] = tern_f32_to_fp16((float)((int)(rnd() % 2001) - 1000) * 1e-3f);
    upload(o.k, h, cache);
    upload(o.v, h, cache);
    free(h);
    float *q = malloc(chunk * nh * hd * sizeof(float));
    for (size_t i = 0; i < chunk * nh * hd; i++) q[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
    upload(o.x, q, chunk * nh * hd * sizeof(float));
    free(q);
    /* decode: one token at position ctx (ctx + 1 keys), folded, then split */
    const double kv_bytes = 2.0 * (double)(ctx + 1) * nkv * hd * 2;
    o.n_tok = 1, o.pos0 = ctx;
    double s[2];
    for (int split = 0; split < 2; split++) {
        o.split = split;
        char what[64];
        snprintf(what, sizeof what, "attention ctx %zu %s", ctx, split ? "split" : "folded");
        s[split] = time_op(&o, what);
    }
    printf("attention 32x128 (8 kv) ctx %-6zu n=1    folded %9.1f us %7.1f GB/s (%3.0f%%) | split %9.1f us %7.1f "
           "GB/s (%3.0f%%) | split %.2fx\n",
           ctx, s[0] * 1e6, kv_bytes / s[0] * 1e-9, 100.0 * kv_bytes / s[0] * 1e-9 / copy_gbs, s[1] * 1e6,
           kv_bytes / s[1] * 1e-9, 100.0 * kv_bytes / s[1] * 1e-9 / copy_gbs, s[0] / s[1]);
    /* prefill: a chunk ending at ctx (the tiles; a GPU folds them in the shader) */
    o.n_tok = chunk, o.pos0 = ctx + 1 - chunk, o.split = -1;
    const double t = time_op(&o, "attention chunk");
    double keys = 0;
    for (size_t i = 0; i < chunk; i++) keys += (double)(o.pos0 + i + 1);
    printf("attention 32x128 (8 kv) ctx %-6zu n=%-4zu %9.1f us  %8.1f GFLOP/s\n", ctx, chunk, t * 1e6,
           4.0 * keys * (double)hd * (double)nh / t * 1e-9);
    tern_vk_buf_free(o.k), tern_vk_buf_free(o.v), tern_vk_buf_free(o.x), tern_vk_buf_free(o.y);
}

int main(int argc, char **argv) {
    const char *types_arg = "f16,q8_0,q4_0,q4_k,q5_k,q6_k,iq4_xs,mxfp4,q2_k,iq2_xxs,iq3_xxs";
    size_t rows = 4096, k = 4096, copy_bytes = (size_t)256 << 20;
    long ntoks[8] = {1, 8, 512}, ctxs[8] = {4096, 16384};
    int n_ntok = 3, n_ctx = 2, device = 0;
    size_t chunk = 512;
    bool types_set = false; /* --quick keeps the types named */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--types") && i + 1 < argc) types_arg = argv[++i], types_set = true;
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            if (sscanf(argv[++i], "%zux%zu", &rows, &k) != 2 || !rows || !k) n_ntok = -1;
        } else if (!strcmp(argv[i], "--ntok") && i + 1 < argc) n_ntok = parse_list(argv[++i], ntoks, 8);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) n_ctx = parse_list(argv[++i], ctxs, 8);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--quick")) {
            if (!types_set) types_arg = "q8_0,q4_k";
            rows = 512, k = 1024, copy_bytes = (size_t)16 << 20;
            ntoks[0] = 1, ntoks[1] = 16, n_ntok = 2, ctxs[0] = 600, n_ctx = 1, chunk = 16;
        } else {
            fprintf(stderr, "usage: bench-vulkan [--device N] [--types q8_0,q4_k,...] [--shape ROWSxK] "
                            "[--ntok 1,8,512] [--ctx 4096,16384] [--chunk 512] [--quick]\n");
            return 2;
        }
    }
    if (n_ntok <= 0 || n_ctx <= 0 || chunk == 0) {
        fprintf(stderr, "bench-vulkan: bad --shape, --ntok, --ctx or --chunk\n");
        return 2;
    }
    enum tern_dtype types[TERN_DTYPE_COUNT];
    const char *bad = NULL;
    const int n_types = parse_types(types_arg, tern_vk_matmul_supported, types, TERN_DTYPE_COUNT, &bad);
    if (n_types < 0) {
        fprintf(stderr, "bench-vulkan: no device matmul for type '%s'\n", bad);
        return 2;
    }
    if (tern_vk_open(device, &vk)) {
        /* 77 (the smoke test's skip) where no device was asked for: a build without
         * Vulkan, or a run without TERN_REQUIRE_VULKAN=1 */
        const char *req = getenv("TERN_REQUIRE_VULKAN"), *built = getenv("TERN_VULKAN_BUILT");
        fprintf(stderr, "bench-vulkan: %s\n", tern_last_error());
        return (built && !strcmp(built, "0")) || !req || strcmp(req, "1") ? 77 : 1;
    }
    const struct tern_vk_device_info *di = tern_vk_info(vk);
    printf("device %d: %s (%s), subgroup %u, %u KiB shared, %.1f GiB device-local, matmul lanes %u\n", device,
           di->name, di->type, di->subgroup_size, di->shared_bytes / 1024,
           (double)di->device_local_bytes / (1u << 30), tern_vk_matmul_lanes(vk));
    const double copy_gbs = bench_copy(copy_bytes);
    printf("copy %zu MiB device to device: %.1f GB/s read + written (the bound below)\n", copy_bytes >> 20, copy_gbs);
    for (int i = 0; i < n_types; i++) bench_matmul(types[i], rows, k, ntoks, n_ntok, copy_gbs);
    for (int i = 0; i < n_ctx; i++) bench_attention((size_t)ctxs[i], chunk, copy_gbs);
    tern_vk_close(vk);
    return 0;
}
