/* The Vulkan backend's device layer on whatever device the loader offers (lavapipe on
 * the project's machines and in CI, NVIDIA's driver on a GPU machine):
 * - enumeration, open, buffers (host-visible or staged) round-trip bytes at offsets;
 * - matmul of every device weight type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
 *   Q6_K, IQ4_NL, IQ4_XS) against a double-precision reference of the dequantized weights and
 *   against the CPU kernel (tern_matmul, whose activations are quantized: a looser bound), on
 *   odd shapes;
 * - exactness within the backend (DESIGN.md §7): a token's outputs are bit-identical
 *   whether it is dispatched alone or among 64 tokens, a weight row's whether it is
 *   dispatched alone or among all rows, and run to run;
 * - the row operations (RMSNorm, add, SwiGLU, sigmoid gate, RoPE) against the CPU's ops:
 *   add and RoPE bit-identical (correctly rounded multiplies and adds only), the others
 *   within a few ulps; RMSNorm's rows bit-identical alone and in a batch;
 * - attention over a device KV cache (F32 and F16, across the 256-position blocks) against
 *   the CPU's attn_page over the same rows, and each token's output bit-identical when it
 *   is computed alone;
 * - Gated DeltaNet's conv and recurrence against the CPU's (deltanet.h), and the device's
 *   own results bit-identical token by token and in one chunk (window and state carried);
 * - the MoE steps: routing against the CPU's moe_route (the same experts, ties to the
 *   lowest id; weights within a few ulps), the grouping of slots by expert equal to a stable
 *   counting sort, the experts' indexed matmul bit-identical to the plain matmul of each
 *   expert's slice whatever the slot order (and a slot alone to its batch), the weighted
 *   combine (with the shared expert's sigmoid gate) within a few ulps of the CPU's formula;
 *   the bias add bit-identical to the CPU's;
 * - a recorded sequence (begin ... end) gives the bits of the same operations run one by one;
 * - bad calls are refused with a status, nothing dispatched.
 * Skips (77) when this build has no Vulkan backend or the machine no device, unless
 * TERN_REQUIRE_VULKAN=1 (the README's test command sets it), which makes that a failure. */
#include "harness.h"

#include "backend/vulkan/vulkan.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"
#include "kernels/deltanet.h"
#include "backend/cpu/cpu.h"
#include "model/moe.h"
#include "util/mem.h"
#include "util/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct tern_vk *vk;

static int setup(void **state) {
    (void)state;
    const int idx = th_vulkan_device();
    if (tern_vk_open(idx, &vk)) {
        fprintf(stderr, "open vulkan:%d: %s\n", idx, tern_last_error());
        return -1;
    }
    printf("device vulkan:%d: %s (%s), subgroup %u\n", idx, tern_vk_info(vk)->name, tern_vk_info(vk)->type,
           tern_vk_info(vk)->subgroup_size);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tern_vk_close(vk);
    return 0;
}

static void test_buffers(void **state) {
    (void)state;
    struct tern_vk_buf *b;
    assert_int_equal(tern_vk_buf_new(vk, 1001, &b), TERN_OK);
    assert_int_equal(tern_vk_buf_bytes(b), 1001);
    unsigned char src[1001], dst[1001];
    for (int i = 0; i < 1001; i++) src[i] = (unsigned char)(i * 7 + 3);
    assert_int_equal(tern_vk_upload(b, 0, src, 1001), TERN_OK);
    assert_int_equal(tern_vk_upload(b, 13, src, 100), TERN_OK);
    memset(dst, 0, sizeof dst);
    assert_int_equal(tern_vk_download(b, 0, dst, 1001), TERN_OK);
    assert_memory_equal(dst, src, 13);
    assert_memory_equal(dst + 13, src, 100);
    assert_memory_equal(dst + 113, src + 113, 1001 - 113);
    /* overruns are refused and change nothing */
    assert_int_equal(tern_vk_upload(b, 1000, src, 2), TERN_ERR_RANGE);
    assert_non_null(strstr(tern_last_error(), "overruns"));
    assert_int_equal(tern_vk_download(b, 2000, dst, 1), TERN_ERR_RANGE);

    /* copies on the device: at odd offsets, alone and recorded between operations (an add
     * before it is seen, one after it sees the copied bytes); overruns and overlapping
     * ranges of one buffer are refused */
    struct tern_vk_buf *c;
    assert_int_equal(tern_vk_buf_new(vk, 1001, &c), TERN_OK);
    assert_int_equal(tern_vk_upload(c, 0, src + 1, 1000), TERN_OK);
    assert_int_equal(tern_vk_copy(vk, b, 7, c, 301, 555), TERN_OK);
    assert_int_equal(tern_vk_download(c, 0, dst, 1001), TERN_OK);
    assert_memory_equal(dst, src + 1, 301);
    assert_memory_equal(dst + 301, src + 7, 6);    /* b[7..13) = src[7..13) */
    assert_memory_equal(dst + 307, src, 100);                    /* 13..112: src[0..100) */
    assert_memory_equal(dst + 407, src + 113, 555 - 106);
    assert_memory_equal(dst + 856, src + 857, 1000 - 856);
    assert_int_equal(tern_vk_copy(vk, b, 1000, c, 0, 2), TERN_ERR_RANGE);
    assert_int_equal(tern_vk_copy(vk, b, 0, c, 1000, 2), TERN_ERR_RANGE);
    assert_int_equal(tern_vk_copy(vk, b, 0, b, 10, 20), TERN_ERR_INVALID);
    assert_int_equal(tern_vk_copy(vk, b, 0, c, 0, 0), TERN_OK);
    /* rows: 9 rows of 10 bytes, 31 apart in b, interleaved 20 apart into c from 3 (one
     * copy command); the bytes between the rows stay */
    {
        uint8_t *cb = malloc(1001), *want = malloc(1001);
        assert_int_equal(tern_vk_download(c, 0, cb, 1001), TERN_OK);
        assert_int_equal(tern_vk_download(b, 0, dst, 1000), TERN_OK);
        memcpy(want, cb, 1001);
        for (size_t i = 0; i < 9; i++) memcpy(want + 3 + 20 * i, dst + 5 + 31 * i, 10);
        assert_int_equal(tern_vk_copy_rows(vk, b, 5, 31, c, 3, 20, 10, 9), TERN_OK);
        assert_int_equal(tern_vk_download(c, 0, cb, 1001), TERN_OK);
        assert_memory_equal(cb, want, 1001);
        assert_int_equal(tern_vk_copy_rows(vk, b, 5, 124, c, 3, 20, 10, 9), TERN_ERR_RANGE); /* the last row past b */
        assert_int_equal(tern_vk_copy_rows(vk, b, 0, 31, c, 3, 125, 10, 9), TERN_ERR_RANGE); /* past c */
        assert_int_equal(tern_vk_copy_rows(vk, b, 0, 31, b, 200, 31, 10, 9), TERN_ERR_INVALID); /* spans overlap */
        assert_int_equal(tern_vk_copy_rows(vk, b, 0, 10, b, 500, 10, 10, 9), TERN_OK);          /* they do not */
        assert_int_equal(tern_vk_download(c, 0, cb, 1001), TERN_OK);
        assert_memory_equal(cb, want, 1001); /* the refused ones changed nothing */
        free(cb), free(want);
    }
    const size_t nf = 37;
    float one[37], two[37], got[37];
    for (size_t i = 0; i < nf; i++) one[i] = (float)i, two[i] = 0.5f * (float)i + 1;
    struct tern_vk_buf *fa, *fb, *fc;
    assert_int_equal(tern_vk_buf_new(vk, nf * sizeof(float), &fa), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, nf * sizeof(float), &fb), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, nf * sizeof(float), &fc), TERN_OK);
    assert_int_equal(tern_vk_upload(fa, 0, one, sizeof one), TERN_OK);
    assert_int_equal(tern_vk_upload(fb, 0, two, sizeof two), TERN_OK);
    assert_int_equal(tern_vk_begin(vk), TERN_OK);
    assert_int_equal(tern_vk_add(vk, fa, fb, 1, nf), TERN_OK);     /* fa = one + two */
    assert_int_equal(tern_vk_copy(vk, fa, 0, fc, 0, sizeof one), TERN_OK); /* fc = fa */
    assert_int_equal(tern_vk_add(vk, fc, fb, 1, nf), TERN_OK);     /* fc = one + two + two */
    assert_int_equal(tern_vk_end(vk), TERN_OK);
    assert_int_equal(tern_vk_download(fc, 0, got, sizeof got), TERN_OK);
    for (size_t i = 0; i < nf; i++) assert_true(got[i] == (one[i] + two[i]) + two[i]);
    tern_vk_buf_free(fa);
    tern_vk_buf_free(fb);
    tern_vk_buf_free(fc);
    tern_vk_buf_free(c);
    tern_vk_buf_free(b);
    tern_vk_buf_free(NULL);
}

/* Runs y = W x on the device for n_tok rows of x. */
static void device_matmul(enum tern_dtype t, const void *w, size_t wbytes, size_t k, size_t n, const float *x,
                          size_t n_tok, float *y) {
    struct tern_vk_buf *bw, *bx, *by;
    assert_int_equal(tern_vk_buf_new(vk, wbytes, &bw), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, n_tok * k * sizeof(float), &bx), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, n_tok * n * sizeof(float), &by), TERN_OK);
    assert_int_equal(tern_vk_upload(bw, 0, w, wbytes), TERN_OK);
    assert_int_equal(tern_vk_upload(bx, 0, x, n_tok * k * sizeof(float)), TERN_OK);
    const enum tern_status st = tern_vk_matmul(vk, t, bw, k, n, bx, n_tok, by);
    if (st) fail_msg("matmul %s: %s", tern_dtype_name((uint32_t)t), tern_last_error());
    assert_int_equal(tern_vk_download(by, 0, y, n_tok * n * sizeof(float)), TERN_OK);
    tern_vk_buf_free(bw);
    tern_vk_buf_free(bx);
    tern_vk_buf_free(by);
}

static void check_type(enum tern_dtype t, size_t k, size_t n) {
    const size_t n_tok = 64;
    struct tern_rng r;
    tern_rng_seed(&r, 1000 * k + n + (uint64_t)t);
    uint64_t rb;
    assert_true(tern_dtype_row_size(t, k, &rb));
    float *wf = malloc(n * k * sizeof(float)), *x = malloc(n_tok * k * sizeof(float));
    unsigned char *w = malloc(n * rb);
    float *deq = malloc(k * sizeof(float));
    for (size_t i = 0; i < n * k; i++) wf[i] = (float)(tern_rng_uniform(&r) * 2 - 1);
    for (size_t i = 0; i < n_tok * k; i++) x[i] = (float)(tern_rng_uniform(&r) * 2 - 1);
    x[3] = 0.0f, x[4] = -1e-3f; /* a zero and a small value */
    for (size_t row = 0; row < n; row++) assert_true(tern_quantize_row(t, wf + row * k, w + row * rb, k));
    float *y = malloc(n_tok * n * sizeof(float)), *y1 = malloc(n * sizeof(float)), *y2 = malloc(n_tok * n * sizeof(float));
    device_matmul(t, w, n * rb, k, n, x, n_tok, y);
    /* against the dequantized weights in double */
    double worst = 0;
    for (size_t row = 0; row < n; row++) {
        assert_true(tern_dequantize_row(t, w + row * rb, deq, k));
        for (size_t tok = 0; tok < n_tok; tok++) {
            double ref = 0, mag = 0;
            for (size_t i = 0; i < k; i++) {
                ref += (double)deq[i] * x[tok * k + i];
                mag += fabs((double)deq[i] * x[tok * k + i]);
            }
            const double err = fabs(y[tok * n + row] - ref) / (mag + 1e-30);
            if (err > worst) worst = err;
        }
    }
    /* against the CPU kernel (its activations quantized to 8 bits for the quantized types) */
    assert_true(tern_matmul_supported(t));
    const size_t arb = tern_act_row_bytes(t, k);
    unsigned char *act = malloc(n_tok * arb);
    float *yc = malloc(n_tok * n * sizeof(float));
    for (size_t tok = 0; tok < n_tok; tok++) tern_act_prepare(t, x + tok * k, act + tok * arb, k);
    tern_matmul(t, w, rb, k, act, arb, n_tok, yc, n, 0, n);
    double worst_cpu = 0;
    for (size_t row = 0; row < n; row++) {
        assert_true(tern_dequantize_row(t, w + row * rb, deq, k));
        for (size_t tok = 0; tok < n_tok; tok++) {
            double mag = 0;
            for (size_t i = 0; i < k; i++) mag += fabs((double)deq[i] * x[tok * k + i]);
            const double err = fabs((double)y[tok * n + row] - yc[tok * n + row]) / (mag + 1e-30);
            if (err > worst_cpu) worst_cpu = err;
        }
    }
    printf("%-6s k %5zu n %4zu: max error %.2e of the sum of |terms| (double reference), %.2e (CPU kernel)\n",
           tern_dtype_name((uint32_t)t), k, n, worst, worst_cpu);
    assert_true(worst < 1e-5);
    assert_true(worst_cpu < 1e-2);
    free(act), free(yc);
    /* a weight row dispatched alone (one-row matrix) gives the bits it got among n */
    const size_t rows[] = {0, n / 2, n - 1};
    float *yr = malloc(n_tok * sizeof(float));
    for (size_t p = 0; p < 3; p++) {
        device_matmul(t, w + rows[p] * rb, rb, k, 1, x, n_tok, yr);
        for (size_t tok = 0; tok < n_tok; tok++) assert_memory_equal(&yr[tok], &y[tok * n + rows[p]], sizeof(float));
    }
    free(yr);
    /* exactness: token t alone gives the bits it got among 64; a rerun gives the same */
    const size_t probe[] = {0, 17, 63};
    for (size_t p = 0; p < 3; p++) {
        device_matmul(t, w, n * rb, k, n, x + probe[p] * k, 1, y1);
        assert_memory_equal(y1, y + probe[p] * n, n * sizeof(float));
    }
    device_matmul(t, w, n * rb, k, n, x, n_tok, y2);
    assert_memory_equal(y2, y, n_tok * n * sizeof(float));
    free(wf), free(x), free(w), free(deq), free(y), free(y1), free(y2);
}

static void test_matmul(void **state) {
    (void)state;
    const enum tern_dtype types[] = {TERN_DTYPE_F32,  TERN_DTYPE_F16,  TERN_DTYPE_BF16,   TERN_DTYPE_Q4_0,  TERN_DTYPE_Q4_1,
                                     TERN_DTYPE_Q5_0, TERN_DTYPE_Q5_1, TERN_DTYPE_Q8_0,   TERN_DTYPE_Q4_K,  TERN_DTYPE_Q5_K,
                                     TERN_DTYPE_Q6_K, TERN_DTYPE_IQ4_NL, TERN_DTYPE_IQ4_XS, TERN_DTYPE_MXFP4, TERN_DTYPE_Q2_K,  TERN_DTYPE_Q3_K,
                                     TERN_DTYPE_IQ2_XXS, TERN_DTYPE_IQ2_XS, TERN_DTYPE_IQ2_S, TERN_DTYPE_IQ3_XXS,
                                     TERN_DTYPE_IQ3_S, TERN_DTYPE_IQ1_S, TERN_DTYPE_IQ1_M};
    /* rows of 1 block, of 3, of many; the K-quants' blocks are 256 wide */
    /* rows of 1 block, of 3, of many (45 blocks or chunks of 32: lanes of a row with one and
     * with two); the K-quants' blocks are 256 wide (8 chunks of 32) */
    const size_t shapes[][2] = {{32, 1}, {96, 37}, {1440, 130}}, kshapes[][2] = {{256, 1}, {768, 37}, {2048, 70}};
    for (size_t i = 0; i < TERN_ARRAY_LEN(types); i++) {
        assert_true(tern_vk_matmul_supported(types[i]));
        const bool kq = tern_dtype_info((uint32_t)types[i])->blck_size == 256;
        for (size_t s = 0; s < 3; s++) check_type(types[i], kq ? kshapes[s][0] : shapes[s][0], kq ? kshapes[s][1] : shapes[s][1]);
    }
    /* with 32 invocations per row (test_matmul_lanes) a workgroup takes 4 rows, and 4100 rows
     * are more than 1024 workgroups along x hold: the last rows come from the z slice */
    check_type(TERN_DTYPE_Q8_0, 32, 4100);
}

/* fn again with the matmul's rows split over `lanes` invocations, on a second context
 * opened with TERN_TEST_VK_MATMUL_LANES (a build with -DTERN_TEST_HOOKS=ON). */
static void with_lanes(uint32_t lanes, void (*fn)(void **)) {
    char v[16];
    snprintf(v, sizeof v, "%u", lanes);
    setenv("TERN_TEST_VK_MATMUL_LANES", v, 1);
    struct tern_vk *own = vk, *other = NULL;
    const enum tern_status st = tern_vk_open(th_vulkan_device(), &other);
    unsetenv("TERN_TEST_VK_MATMUL_LANES");
    if (st) fail_msg("open vulkan:%d: %s", th_vulkan_device(), tern_last_error());
    if (tern_vk_matmul_lanes(other) != lanes)
        fail_msg("TERN_TEST_VK_MATMUL_LANES=%u was not taken (%u): build with -DTERN_TEST_HOOKS=ON", lanes,
                 tern_vk_matmul_lanes(other));
    printf("matmul with %u invocations per row:\n", lanes);
    vk = other;
    fn(NULL);
    vk = own;
    tern_vk_close(other);
}

static void test_moe(void **state);

/* The other choice of the matmul's invocations per row than the device's own: a CPU device
 * (lavapipe) takes 1, so the GPU's 32 (a tree over the lanes) is checked here too, and 4. */
static void test_matmul_lanes(void **state) {
    (void)state;
    const uint32_t own = tern_vk_matmul_lanes(vk), other = own == 32 ? 1 : 32;
    printf("the device's own matmul: %u invocations per row\n", own);
    with_lanes(other, test_matmul);
    with_lanes(other, test_moe);
    with_lanes(4, test_matmul);
}

/* A device buffer holding n floats of src. */
static struct tern_vk_buf *dev_floats(const float *src, size_t n) {
    struct tern_vk_buf *b;
    assert_int_equal(tern_vk_buf_new(vk, n * sizeof(float), &b), TERN_OK);
    assert_int_equal(tern_vk_upload(b, 0, src, n * sizeof(float)), TERN_OK);
    return b;
}

static void host_floats(struct tern_vk_buf *b, float *dst, size_t n) {
    assert_int_equal(tern_vk_download(b, 0, dst, n * sizeof(float)), TERN_OK);
}

/* b's first n floats (read into scratch) are exactly want's. */
static void assert_device_floats(struct tern_vk_buf *b, float *scratch, const float *want, size_t n) {
    host_floats(b, scratch, n);
    assert_memory_equal(scratch, want, n * sizeof(float));
}

static double max_rel(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + 1e-30);
        if (d > worst) worst = d;
    }
    return worst;
}

static void test_row_ops(void **state) {
    (void)state;
    const struct tern_ops *ops = tern_ops_portable();
    const size_t T = 9, N = 1000; /* not a multiple of the workgroup */
    struct tern_rng r;
    tern_rng_seed(&r, 77);
    float *x = malloc(T * N * sizeof(float)), *u = malloc(T * N * sizeof(float)), *w = malloc(N * sizeof(float));
    float *ref = malloc(T * N * sizeof(float)), *got = malloc(T * N * sizeof(float));
    for (size_t i = 0; i < T * N; i++) x[i] = (float)(tern_rng_uniform(&r) * 8 - 4), u[i] = (float)(tern_rng_uniform(&r) * 2 - 1);
    for (size_t i = 0; i < N; i++) w[i] = (float)(0.5 + tern_rng_uniform(&r));

    /* RMSNorm: within a few ulps of the CPU's; a row alone gives its batch bits */
    struct tern_vk_buf *bx = dev_floats(x, T * N), *bw = dev_floats(w, N), *by;
    assert_int_equal(tern_vk_buf_new(vk, T * N * sizeof(float), &by), TERN_OK);
    assert_int_equal(tern_vk_rmsnorm(vk, bx, bw, by, T, N, 1e-6f), TERN_OK);
    host_floats(by, got, T * N);
    for (size_t t = 0; t < T; t++) ops->rmsnorm(ref + t * N, x + t * N, w, N, 1e-6f);
    printf("rmsnorm: max relative difference to the CPU %.2e\n", max_rel(got, ref, T * N));
    assert_true(max_rel(got, ref, T * N) < 1e-5);
    struct tern_vk_buf *bx1 = dev_floats(x + 4 * N, N), *by1;
    assert_int_equal(tern_vk_buf_new(vk, N * sizeof(float), &by1), TERN_OK);
    assert_int_equal(tern_vk_rmsnorm(vk, bx1, bw, by1, 1, N, 1e-6f), TERN_OK);
    float *one = malloc(N * sizeof(float));
    host_floats(by1, one, N);
    assert_memory_equal(one, got + 4 * N, N * sizeof(float));

    /* add: the CPU's bits */
    struct tern_vk_buf *ba = dev_floats(x, T * N), *bu = dev_floats(u, T * N);
    assert_int_equal(tern_vk_add(vk, ba, bu, T, N), TERN_OK);
    host_floats(ba, got, T * N);
    memcpy(ref, x, T * N * sizeof(float));
    for (size_t t = 0; t < T; t++) ops->add(ref + t * N, u + t * N, N);
    assert_memory_equal(got, ref, T * N * sizeof(float));

    /* SwiGLU and the sigmoid gate: exp differs in the last bits */
    assert_int_equal(tern_vk_upload(ba, 0, x, T * N * sizeof(float)), TERN_OK);
    assert_int_equal(tern_vk_swiglu(vk, ba, bu, T, N), TERN_OK);
    host_floats(ba, got, T * N);
    for (size_t t = 0; t < T; t++) ops->swiglu(ref + t * N, x + t * N, u + t * N, N);
    printf("swiglu: max relative difference to the CPU %.2e\n", max_rel(got, ref, T * N));
    assert_true(max_rel(got, ref, T * N) < 1e-5);
    assert_int_equal(tern_vk_upload(ba, 0, x, T * N * sizeof(float)), TERN_OK);
    assert_int_equal(tern_vk_sigmoid_mul(vk, ba, bu, T, N), TERN_OK);
    host_floats(ba, got, T * N);
    for (size_t i = 0; i < T * N; i++) ref[i] = x[i] * (1.0f / (1.0f + expf(-u[i])));
    assert_true(max_rel(got, ref, T * N) < 1e-5);

    /* RoPE, NeoX and adjacent pairs, partial rotation, rows with a stride: the CPU's bits */
    const size_t nh = 3, hd = 64, nrot = 32, stride = nh * hd + 16;
    struct tern_rope_params rp = {.n_rot = (uint32_t)nrot, .freq_base = 10000.0f, .freq_scale = 1.0f,
                                  .attn_factor = 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f, .n_ctx_orig = 4096};
    float *cs = malloc(T * nrot * sizeof(float));
    for (size_t t = 0; t < T; t++) tern_rope_angles(&rp, (uint32_t)(t * 37 + 5), cs + t * nrot);
    struct tern_vk_buf *bcs = dev_floats(cs, T * nrot);
    for (int neox = 0; neox < 2; neox++) {
        struct tern_vk_buf *bq = dev_floats(x, T * stride);
        assert_int_equal(tern_vk_rope(vk, bq, stride, nh, hd, nrot, bcs, T, neox), TERN_OK);
        host_floats(bq, got, T * stride);
        memcpy(ref, x, T * stride * sizeof(float));
        for (size_t t = 0; t < T; t++) tern_rope(ref + t * stride, nh, hd, nrot, cs + t * nrot, neox);
        assert_memory_equal(got, ref, T * stride * sizeof(float));
        tern_vk_buf_free(bq);
    }

    /* a recording gives the bits of the same operations run one at a time */
    assert_int_equal(tern_vk_upload(ba, 0, x, T * N * sizeof(float)), TERN_OK);
    assert_int_equal(tern_vk_begin(vk), TERN_OK);
    assert_int_equal(tern_vk_add(vk, ba, bu, T, N), TERN_OK);
    assert_int_equal(tern_vk_rmsnorm(vk, ba, bw, by, T, N, 1e-6f), TERN_OK);
    assert_int_equal(tern_vk_swiglu(vk, by, bu, T, N), TERN_OK);
    assert_int_equal(tern_vk_end(vk), TERN_OK);
    float *rec = malloc(T * N * sizeof(float));
    host_floats(by, rec, T * N);
    assert_int_equal(tern_vk_upload(ba, 0, x, T * N * sizeof(float)), TERN_OK);
    assert_int_equal(tern_vk_add(vk, ba, bu, T, N), TERN_OK);
    assert_int_equal(tern_vk_rmsnorm(vk, ba, bw, by, T, N, 1e-6f), TERN_OK);
    assert_int_equal(tern_vk_swiglu(vk, by, bu, T, N), TERN_OK);
    host_floats(by, got, T * N);
    assert_memory_equal(rec, got, T * N * sizeof(float));
    assert_int_equal(tern_vk_end(vk), TERN_ERR_STATE); /* nothing recording */
    /* a recording of more dispatches than a descriptor pool's 1024 sets is still one
     * submit (more pools are made, and reused by the next recording), with the bits of
     * the same adds on the CPU */
    for (int round = 0; round < 2; round++) {
        const int n_add = 2600;
        assert_int_equal(tern_vk_upload(ba, 0, x, T * N * sizeof(float)), TERN_OK);
        const uint64_t s0 = tern_vk_submits(vk);
        assert_int_equal(tern_vk_begin(vk), TERN_OK);
        for (int i = 0; i < n_add; i++) assert_int_equal(tern_vk_add(vk, ba, bu, T, N), TERN_OK);
        assert_int_equal(tern_vk_end(vk), TERN_OK);
        assert_int_equal(tern_vk_submits(vk) - s0, 1);
        host_floats(ba, got, T * N);
        for (size_t i = 0; i < T * N; i++) {
            float want = x[i];
            for (int k = 0; k < n_add; k++) want += u[i];
            assert_true(got[i] == want);
        }
    }

    tern_vk_buf_free(bx), tern_vk_buf_free(bw), tern_vk_buf_free(by), tern_vk_buf_free(bx1), tern_vk_buf_free(by1);
    tern_vk_buf_free(ba), tern_vk_buf_free(bu), tern_vk_buf_free(bcs);
    free(x), free(u), free(w), free(ref), free(got), free(one), free(cs), free(rec);
}

/* window (0: none) and sinks: gpt-oss's attention (the CPU's attn_item) */
static void check_attention(bool f16, size_t hd, size_t window, bool with_sinks) {
    const size_t nkv = 2, nh = 6, pos0 = 560, T = 7, P = pos0 + T, n_pages = (P + 255) / 256;
    const float scale = 1.0f / sqrtf((float)hd);
    struct tern_rng r;
    tern_rng_seed(&r, 5 + hd + f16);
    float *k = malloc(P * nkv * hd * sizeof(float)), *v = malloc(P * nkv * hd * sizeof(float));
    float *q = malloc(T * nh * hd * sizeof(float)), *out = malloc(T * nh * hd * sizeof(float));
    for (size_t i = 0; i < P * nkv * hd; i++) k[i] = (float)(tern_rng_uniform(&r) * 2 - 1), v[i] = (float)(tern_rng_uniform(&r) * 2 - 1);
    for (size_t i = 0; i < T * nh * hd; i++) q[i] = (float)(tern_rng_uniform(&r) * 4 - 2);
    float sinks[6];
    for (size_t h = 0; h < nh; h++) sinks[h] = (float)(tern_rng_uniform(&r) * 6 - 3);
    struct tern_vk_buf *bs = with_sinks ? dev_floats(sinks, nh) : NULL;
    const size_t es = f16 ? 2 : 4;
    struct tern_vk_buf *bk = dev_floats(k, P * nkv * hd), *bv = dev_floats(v, P * nkv * hd), *bq = dev_floats(q, T * nh * hd);
    struct tern_vk_buf *kc, *vc, *bo;
    const size_t page = 256 * nkv * hd * es; /* [n_kv_head][256][head_dim], pages end to end */
    assert_int_equal(tern_vk_buf_new(vk, n_pages * page, &kc), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, n_pages * page, &vc), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, T * nh * hd * sizeof(float), &bo), TERN_OK);
    /* rows [0, P) in one go (rows of nkv heads), then the queries of the last T */
    assert_int_equal(tern_vk_begin(vk), TERN_OK);
    assert_int_equal(tern_vk_kv_store(vk, bk, nkv * hd, kc, nkv, hd, 0, 0, P, f16), TERN_OK);
    assert_int_equal(tern_vk_kv_store(vk, bv, nkv * hd, vc, nkv, hd, 0, 0, P, f16), TERN_OK);
    assert_int_equal(
        tern_vk_attention(vk, bq, nh * hd, kc, vc, bo, nh * hd, 0, T, pos0, nh, nkv, hd, scale, f16, window, bs),
        TERN_OK);
    assert_int_equal(tern_vk_end(vk), TERN_OK);
    host_floats(bo, out, T * nh * hd);
    /* the CPU: per head, rows of that head contiguous (as in its pages), in pages of 256 */
    const struct tern_ops *ops = tern_ops();
    float *kh = malloc(P * hd * sizeof(float)), *vh = malloc(P * hd * sizeof(float));
    uint16_t *kh16 = malloc(P * hd * 2), *vh16 = malloc(P * hd * 2);
    float *acc = malloc(hd * sizeof(float)), *scores = malloc((256 + 8) * sizeof(float)), *ref = malloc(hd * sizeof(float));
    double worst = 0;
    for (size_t h = 0; h < nh; h++) {
        const size_t g = h / (nh / nkv);
        for (size_t p = 0; p < P; p++) {
            memcpy(kh + p * hd, k + (p * nkv + g) * hd, hd * sizeof(float));
            memcpy(vh + p * hd, v + (p * nkv + g) * hd, hd * sizeof(float));
        }
        ops->to_f16(kh16, kh, P * hd);
        ops->to_f16(vh16, vh, P * hd);
        for (size_t t = 0; t < T; t++) {
            const size_t pos = pos0 + t;
            float m = -INFINITY, l = 0;
            memset(acc, 0, hd * sizeof(float));
            const size_t key0 = window && pos + 1 > window ? pos + 1 - window : 0;
            for (size_t pg = key0 / 256; pg * 256 <= pos; pg++) {
                const size_t off = key0 > pg * 256 ? key0 - pg * 256 : 0;
                const size_t n = (pos + 1 - pg * 256 < 256 ? pos + 1 - pg * 256 : 256) - off;
                const size_t r0 = pg * 256 + off;
                const void *kp = f16 ? (const void *)(kh16 + r0 * hd) : (const void *)(kh + r0 * hd);
                const void *vp = f16 ? (const void *)(vh16 + r0 * hd) : (const void *)(vh + r0 * hd);
                ops->attn_page(acc, &m, &l, q + (t * nh + h) * hd, hd, kp, vp, hd, n, scale, f16, scores);
            }
            double den = l, a = 1;
            if (with_sinks) { /* one more logit in the max and the denominator */
                const double mm = fmax(m, sinks[h]);
                a = exp(m - mm);
                den = l * a + exp(sinks[h] - mm);
            }
            for (size_t e = 0; e < hd; e++) ref[e] = (float)(acc[e] * a / den);
            const float *got = out + (t * nh + h) * hd;
            for (size_t e = 0; e < hd; e++) {
                const double d = fabs((double)got[e] - ref[e]) / (fabs((double)ref[e]) + 1e-3);
                if (d > worst) worst = d;
            }
        }
    }
    printf("attention %s, heads of %zu, %zu positions, window %zu%s: max difference to the CPU %.2e\n",
           f16 ? "F16" : "F32", hd, P, window, with_sinks ? ", sinks" : "", worst);
    assert_true(worst < 1e-4);
    /* the cache holds the CPU's pages byte for byte: row p of head g at page p / 256,
     * [g][p % 256], F16 rows as the CPU rounds them */
    {
        uint8_t *cache = malloc(n_pages * page), *want = malloc(hd * es);
        assert_int_equal(tern_vk_download(kc, 0, cache, n_pages * page), TERN_OK);
        for (size_t p = 0; p < P; p++)
            for (size_t g = 0; g < nkv; g++) {
                if (f16) ops->to_f16((uint16_t *)want, k + (p * nkv + g) * hd, hd);
                else memcpy(want, k + (p * nkv + g) * hd, hd * es);
                assert_memory_equal(cache + (p / 256) * page + ((g * 256) + p % 256) * hd * es, want, hd * es);
            }
        free(cache), free(want);
    }
    /* a position beyond the cache's pages: refused, nothing recorded */
    assert_int_equal(tern_vk_kv_store(vk, bk, nkv * hd, kc, nkv, hd, n_pages * 256 - 1, 0, 2, f16), TERN_ERR_RANGE);
    assert_int_equal(tern_vk_attention(vk, bq, nh * hd, kc, vc, bo, nh * hd, 0, 2, n_pages * 256 - 1, nh, nkv, hd,
                                       scale, f16, window, bs),
                     TERN_ERR_RANGE);
    /* every tile shape (query heads x tokens per workgroup), folded in one dispatch or
     * split over the pages: the same bits; heads of two where the group has three (tiles of
     * 2 and 1), tokens past the chunk's end */
    {
        static const size_t tiles[][2] = {{1, 1}, {3, 1}, {2, 4}, {1, 8}, {3, 2}, {8, 1}};
        float *other = malloc(T * nh * hd * sizeof(float));
        struct tern_vk_buf *bo3;
        assert_int_equal(tern_vk_buf_new(vk, T * nh * hd * sizeof(float), &bo3), TERN_OK);
        for (size_t i = 0; i < 2 * TERN_ARRAY_LEN(tiles); i++) {
            const size_t *tl = tiles[i / 2];
            memset(other, 0xff, T * nh * hd * sizeof(float)); /* NaNs where nothing is written */
            assert_int_equal(tern_vk_upload(bo3, 0, other, T * nh * hd * sizeof(float)), TERN_OK);
            assert_int_equal(tern_vk_attention_tile(vk, bq, nh * hd, kc, vc, bo3, nh * hd, 0, T, pos0, nh, nkv, hd,
                                                    scale, f16, window, bs, tl[0], tl[1], (int)(i % 2)),
                             TERN_OK);
            host_floats(bo3, other, T * nh * hd);
            assert_memory_equal(other, out, T * nh * hd * sizeof(float));
        }
        assert_int_equal(tern_vk_attention_tile(vk, bq, nh * hd, kc, vc, bo3, nh * hd, 0, T, pos0, nh, nkv, hd, scale,
                                                f16, window, bs, 3, 3, 0),
                         TERN_ERR_INVALID);
        tern_vk_buf_free(bo3);
        free(other);
    }
    /* a token alone: the bits it got among T */
    float *one = malloc(nh * hd * sizeof(float));
    struct tern_vk_buf *bq1 = dev_floats(q + 3 * nh * hd, nh * hd), *bo1;
    assert_int_equal(tern_vk_buf_new(vk, nh * hd * sizeof(float), &bo1), TERN_OK);
    assert_int_equal(
        tern_vk_attention(vk, bq1, nh * hd, kc, vc, bo1, nh * hd, 0, 1, pos0 + 3, nh, nkv, hd, scale, f16, window, bs),
        TERN_OK);
    host_floats(bo1, one, nh * hd);
    assert_memory_equal(one, out + 3 * nh * hd, nh * hd * sizeof(float));
    /* tokens 3.. as rows 3.. of the whole buffers (row0: one sequence of a step over
     * several): their bits among T, the rows before them untouched */
    if (T > 3) {
        float *rest = malloc(T * nh * hd * sizeof(float));
        for (size_t i = 0; i < T * nh * hd; i++) rest[i] = -7.0f;
        struct tern_vk_buf *bo2 = dev_floats(rest, T * nh * hd);
        assert_int_equal(tern_vk_attention(vk, bq, nh * hd, kc, vc, bo2, nh * hd, 3, T - 3, pos0 + 3, nh, nkv, hd,
                                           scale, f16, window, bs),
                         TERN_OK);
        host_floats(bo2, rest, T * nh * hd);
        assert_memory_equal(rest + 3 * nh * hd, out + 3 * nh * hd, (T - 3) * nh * hd * sizeof(float));
        for (size_t i = 0; i < 3 * nh * hd; i++) assert_true(rest[i] == -7.0f);
        /* past the buffer's rows: refused */
        assert_int_equal(tern_vk_attention(vk, bq, nh * hd, kc, vc, bo2, nh * hd, 4, T - 3, pos0 + 3, nh, nkv, hd,
                                           scale, f16, window, bs),
                         TERN_ERR_RANGE);
        tern_vk_buf_free(bo2);
        free(rest);
    }
    tern_vk_buf_free(bk), tern_vk_buf_free(bv), tern_vk_buf_free(bq), tern_vk_buf_free(kc), tern_vk_buf_free(vc);
    tern_vk_buf_free(bo), tern_vk_buf_free(bq1), tern_vk_buf_free(bo1), tern_vk_buf_free(bs);
    free(k), free(v), free(q), free(out), free(kh), free(vh), free(kh16), free(vh16), free(acc), free(scores), free(ref);
    free(one);
}

static void test_attention(void **state) {
    (void)state;
    check_attention(false, 64, 0, false);
    check_attention(true, 64, 0, false);
    check_attention(false, 40, 0, false);
    check_attention(true, 256, 0, false);
    /* gpt-oss: windows that start on the second page (300: keys from 261), across a page
     * boundary (60: keys from 501..507) and inside the last page (20), with and without
     * sinks; queries at 560..566, three pages */
    check_attention(false, 64, 60, true);
    check_attention(true, 64, 60, false);
    check_attention(false, 64, 300, false);
    check_attention(true, 64, 20, true);
    check_attention(false, 64, 0, true);
}

static void check_deltanet(uint32_t n_k, uint32_t n_v, uint32_t d, size_t T) {
    const struct tern_deltanet_shape sh = {.n_k_heads = n_k, .n_v_heads = n_v, .d_k = d, .d_v = d, .n_conv = 4, .eps = 1e-6f};
    const size_t C = tern_deltanet_channels(&sh), W = 3, nvd = (size_t)n_v * d;
    struct tern_rng r;
    tern_rng_seed(&r, 900 + d);
    float *x = malloc(T * C * sizeof(float)), *cw = malloc(4 * C * sizeof(float)), *z = malloc(T * nvd * sizeof(float));
    float *beta = malloc(T * n_v * sizeof(float)), *alpha = malloc(T * n_v * sizeof(float));
    float *prm = malloc((2 * n_v + d) * sizeof(float));
    for (size_t i = 0; i < T * C; i++) x[i] = (float)(tern_rng_uniform(&r) * 2 - 1);
    for (size_t i = 0; i < 4 * C; i++) cw[i] = (float)(tern_rng_uniform(&r) * 0.6 - 0.3);
    for (size_t i = 0; i < T * nvd; i++) z[i] = (float)(tern_rng_uniform(&r) * 2 - 1);
    for (size_t i = 0; i < T * n_v; i++) beta[i] = (float)(tern_rng_uniform(&r) * 2 - 1), alpha[i] = (float)(tern_rng_uniform(&r) * 2 - 1);
    for (size_t h = 0; h < n_v; h++) prm[h] = -(float)exp(tern_rng_uniform(&r) * log(16.0)), prm[n_v + h] = 1.0f;
    for (size_t j = 0; j < d; j++) prm[2 * n_v + j] = (float)(0.9 + 0.2 * tern_rng_uniform(&r));
    /* the CPU */
    float *win = calloc(W * C, sizeof(float)), *S = calloc(nvd * d, sizeof(float)), *y = malloc(T * C * sizeof(float));
    float *out = malloc(T * nvd * sizeof(float)), *scr = malloc(n_v * tern_deltanet_scratch_floats(&sh) * sizeof(float));
    tern_deltanet_conv(&sh, win, cw, x, C, y, C, T, 0, C);
    const struct tern_deltanet_params p = {.ssm_a = prm, .dt_bias = prm + n_v, .norm_w = prm + 2 * n_v};
    const struct tern_deltanet_io io = {.n_tok = T, .qkv = y, .ld_qkv = C, .z = z, .ld_z = nvd, .beta = beta,
                                        .ld_beta = n_v, .alpha = alpha, .ld_alpha = n_v, .out = out, .ld_out = nvd};
    tern_deltanet_heads(&sh, &p, S, &io, 0, n_v, scr);
    /* the device, one chunk */
    float *zeros = calloc(nvd * d > W * C ? nvd * d : W * C, sizeof(float));
    struct tern_vk_buf *bwin = dev_floats(zeros, W * C), *bcw = dev_floats(cw, 4 * C), *bx = dev_floats(x, T * C);
    struct tern_vk_buf *bS = dev_floats(zeros, nvd * d), *bz = dev_floats(z, T * nvd), *bb = dev_floats(beta, T * n_v);
    struct tern_vk_buf *ba = dev_floats(alpha, T * n_v), *bp = dev_floats(prm, 2 * n_v + d), *by, *bo;
    assert_int_equal(tern_vk_buf_new(vk, T * C * sizeof(float), &by), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, T * nvd * sizeof(float), &bo), TERN_OK);
    assert_int_equal(tern_vk_begin(vk), TERN_OK);
    assert_int_equal(tern_vk_deltanet_conv(vk, bwin, bcw, bx, C, by, C, C, 4, 0, T, NULL, 0), TERN_OK);
    assert_int_equal(tern_vk_deltanet_heads(vk, bS, by, bz, bb, ba, bo, bp, n_k, false, n_v, d, d, 1e-6f,
                                            0, T, NULL, 0), TERN_OK);
    assert_int_equal(tern_vk_end(vk), TERN_OK);
    float *gy = malloc(T * C * sizeof(float)), *go = malloc(T * nvd * sizeof(float)), *gS = malloc(nvd * d * sizeof(float));
    host_floats(by, gy, T * C);
    host_floats(bo, go, T * nvd);
    host_floats(bS, gS, nvd * d);
    const double ey = max_rel(gy, y, T * C);
    double eo = 0, eS = 0;
    for (size_t i = 0; i < T * nvd; i++) eo = fmax(eo, fabs((double)go[i] - out[i]) / (fabs((double)out[i]) + 1e-2));
    for (size_t i = 0; i < nvd * d; i++) eS = fmax(eS, fabs((double)gS[i] - S[i]) / (fabs((double)S[i]) + 1e-2));
    printf("deltanet %u/%u heads of %u, %zu tokens: conv %.2e, output %.2e, state %.2e from the CPU\n", n_k, n_v, d, T,
           ey, eo, eS);
    assert_true(ey < 1e-5 && eo < 1e-4 && eS < 1e-4);
    /* token by token on the device: the chunk's bits */
    assert_int_equal(tern_vk_upload(bwin, 0, zeros, W * C * sizeof(float)), TERN_OK);
    assert_int_equal(tern_vk_upload(bS, 0, zeros, nvd * d * sizeof(float)), TERN_OK);
    float *ty = malloc(C * sizeof(float)), *to = malloc(nvd * sizeof(float)), *tS = malloc(nvd * d * sizeof(float));
    /* the window and state after each token, for the trail below */
    float *twin = malloc(T * W * C * sizeof(float)), *tst = malloc(T * nvd * d * sizeof(float));
    for (size_t t = 0; t < T; t++) {
        struct tern_vk_buf *x1 = dev_floats(x + t * C, C), *z1 = dev_floats(z + t * nvd, nvd);
        struct tern_vk_buf *b1 = dev_floats(beta + t * n_v, n_v), *a1 = dev_floats(alpha + t * n_v, n_v);
        assert_int_equal(tern_vk_begin(vk), TERN_OK);
        assert_int_equal(tern_vk_deltanet_conv(vk, bwin, bcw, x1, C, by, C, C, 4, 0, 1, NULL, 0), TERN_OK);
        assert_int_equal(tern_vk_deltanet_heads(vk, bS, by, z1, b1, a1, bo, bp, n_k, false, n_v, d, d, 1e-6f,
                                                0, 1, NULL, 0), TERN_OK);
        assert_int_equal(tern_vk_end(vk), TERN_OK);
        host_floats(by, ty, C);
        host_floats(bo, to, nvd);
        assert_memory_equal(ty, gy + t * C, C * sizeof(float));
        assert_memory_equal(to, go + t * nvd, nvd * sizeof(float));
        host_floats(bwin, twin + t * W * C, W * C);
        host_floats(bS, tst + t * nvd * d, nvd * d);
        tern_vk_buf_free(x1), tern_vk_buf_free(z1), tern_vk_buf_free(b1), tern_vk_buf_free(a1);
    }
    host_floats(bS, tS, nvd * d);
    assert_memory_equal(tS, gS, nvd * d * sizeof(float));
    /* the tokens as two dispatches over row ranges of the same buffers (row0: one
     * sequence of a step over several): the chunk's bits */
    const size_t cut = T / 2;
    assert_int_equal(tern_vk_upload(bwin, 0, zeros, W * C * sizeof(float)), TERN_OK);
    assert_int_equal(tern_vk_upload(bS, 0, zeros, nvd * d * sizeof(float)), TERN_OK);
    assert_int_equal(tern_vk_begin(vk), TERN_OK);
    assert_int_equal(tern_vk_deltanet_conv(vk, bwin, bcw, bx, C, by, C, C, 4, 0, cut, NULL, 0), TERN_OK);
    assert_int_equal(tern_vk_deltanet_heads(vk, bS, by, bz, bb, ba, bo, bp, n_k, false, n_v, d, d, 1e-6f,
                                            0, cut, NULL, 0), TERN_OK);
    assert_int_equal(tern_vk_deltanet_conv(vk, bwin, bcw, bx, C, by, C, C, 4, cut, T - cut, NULL, 0), TERN_OK);
    assert_int_equal(tern_vk_deltanet_heads(vk, bS, by, bz, bb, ba, bo, bp, n_k, false, n_v, d, d, 1e-6f,
                                            cut, T - cut, NULL, 0),
                     TERN_OK);
    assert_int_equal(tern_vk_end(vk), TERN_OK);
    float *sy = malloc(T * C * sizeof(float)), *so = malloc(T * nvd * sizeof(float));
    assert_device_floats(by, sy, gy, T * C);
    assert_device_floats(bo, so, go, T * nvd);
    assert_device_floats(bS, tS, gS, nvd * d);
    assert_int_equal(tern_vk_deltanet_conv(vk, bwin, bcw, bx, C, by, C, C, 4,
                                           cut + 1, T - cut, NULL, 0), TERN_ERR_RANGE);
    assert_int_equal(tern_vk_deltanet_heads(vk, bS, by, bz, bb, ba, bo, bp, n_k, false, n_v, d, d, 1e-6f,
                                            cut + 1, T - cut, NULL, 0),
                     TERN_ERR_RANGE);
    /* with a trail, from slot 1: the chunk's bits, and slot 1 + t holds the window and
     * state after token t as the token-by-token run left them; too small a trail refused */
    struct tern_vk_buf *trw, *trs;
    assert_int_equal(tern_vk_buf_new(vk, (T + 1) * W * C * sizeof(float), &trw), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, (T + 1) * nvd * d * sizeof(float), &trs), TERN_OK);
    assert_int_equal(tern_vk_upload(bwin, 0, zeros, W * C * sizeof(float)), TERN_OK);
    assert_int_equal(tern_vk_upload(bS, 0, zeros, nvd * d * sizeof(float)), TERN_OK);
    assert_int_equal(tern_vk_begin(vk), TERN_OK);
    assert_int_equal(tern_vk_deltanet_conv(vk, bwin, bcw, bx, C, by, C, C, 4, 0, T, trw, 1), TERN_OK);
    assert_int_equal(tern_vk_deltanet_heads(vk, bS, by, bz, bb, ba, bo, bp, n_k, false, n_v, d, d, 1e-6f, 0, T, trs, 1),
                     TERN_OK);
    assert_int_equal(tern_vk_end(vk), TERN_OK);
    assert_device_floats(by, sy, gy, T * C);
    assert_device_floats(bo, so, go, T * nvd);
    assert_device_floats(bS, tS, gS, nvd * d);
    float *gw = malloc(T * W * C * sizeof(float)), *gs = malloc(T * nvd * d * sizeof(float));
    assert_int_equal(tern_vk_download(trw, W * C * sizeof(float), gw, T * W * C * sizeof(float)), TERN_OK);
    assert_int_equal(tern_vk_download(trs, nvd * d * sizeof(float), gs, T * nvd * d * sizeof(float)), TERN_OK);
    assert_memory_equal(gw, twin, T * W * C * sizeof(float));
    assert_memory_equal(gs, tst, T * nvd * d * sizeof(float));
    assert_int_equal(tern_vk_deltanet_conv(vk, bwin, bcw, bx, C, by, C, C, 4, 0, T, trw, 2), TERN_ERR_RANGE);
    assert_int_equal(tern_vk_deltanet_heads(vk, bS, by, bz, bb, ba, bo, bp, n_k, false, n_v, d, d, 1e-6f, 0, T, trs, 2),
                     TERN_ERR_RANGE);
    tern_vk_buf_free(trw), tern_vk_buf_free(trs);
    free(gw), free(gs), free(twin), free(tst);
    free(sy), free(so);
    struct tern_vk_buf *all[] = {bwin, bcw, bx, bS, bz, bb, ba, bp, by, bo};
    for (size_t i = 0; i < TERN_ARRAY_LEN(all); i++) tern_vk_buf_free(all[i]);
    float *fr[] = {x, cw, z, beta, alpha, prm, win, S, y, out, scr, zeros, gy, go, gS, ty, to, tS};
    for (size_t i = 0; i < TERN_ARRAY_LEN(fr); i++) free(fr[i]);
}

static void test_deltanet(void **state) {
    (void)state;
    check_deltanet(2, 4, 64, 11);
    check_deltanet(1, 2, 128, 5);
}

static void test_moe(void **state) {
    (void)state;
    const size_t X = 8, K = 2, T = 13, k = 256, n = 40;
    struct tern_rng r;
    tern_rng_seed(&r, 4242);
    /* routing: random logits, and two tokens with ties (equal logits) */
    float *lg = malloc(T * X * sizeof(float)), *lg_cpu = malloc(T * X * sizeof(float));
    for (size_t i = 0; i < T * X; i++) lg[i] = (float)(tern_rng_uniform(&r) * 4 - 2);
    for (size_t e = 0; e < X; e++) lg[1 * X + e] = 0.5f;                 /* all equal: experts 0 and 1 */
    lg[2 * X + 5] = lg[2 * X + 3] = lg[2 * X + 6] = 3.0f;                 /* a three-way tie at the top: 3 and 5 */
    memcpy(lg_cpu, lg, T * X * sizeof(float));
    struct moe_hparams hp = {.n_expert = (uint32_t)X, .n_used = (uint32_t)K, .norm_topk = true, .scale = 1.0f};
    int32_t sel_cpu[13 * 2];
    float wts_cpu[13 * 2];
    for (size_t t = 0; t < T; t++) moe_route(&hp, lg_cpu + t * X, sel_cpu + t * K, wts_cpu + t * K);
    struct tern_vk_buf *blg = dev_floats(lg, T * X), *bids, *bw;
    assert_int_equal(tern_vk_buf_new(vk, T * K * sizeof(uint32_t), &bids), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, T * K * sizeof(float), &bw), TERN_OK);
    assert_int_equal(tern_vk_moe_route(vk, blg, bids, bw, T, X, K, true, 1.0f, false), TERN_OK);
    uint32_t ids[13 * 2];
    float wts[13 * 2], probs[13 * 8];
    assert_int_equal(tern_vk_download(bids, 0, ids, sizeof ids), TERN_OK);
    host_floats(bw, wts, T * K);
    host_floats(blg, probs, T * X);
    for (size_t i = 0; i < T * K; i++) assert_int_equal(ids[i], (uint32_t)sel_cpu[i]);
    assert_int_equal(ids[1 * K], 0), assert_int_equal(ids[1 * K + 1], 1);
    assert_int_equal(ids[2 * K], 3), assert_int_equal(ids[2 * K + 1], 5);
    printf("moe route: weights within %.2e, probabilities within %.2e of the CPU's\n", max_rel(wts, wts_cpu, T * K),
           max_rel(probs, lg_cpu, T * X));
    assert_true(max_rel(wts, wts_cpu, T * K) < 1e-5);
    assert_true(max_rel(probs, lg_cpu, T * X) < 1e-5);
    /* a scale and no renormalisation */
    assert_int_equal(tern_vk_upload(blg, 0, lg, T * X * sizeof(float)), TERN_OK);
    assert_int_equal(tern_vk_moe_route(vk, blg, bids, bw, T, X, K, false, 2.5f, false), TERN_OK);
    memcpy(lg_cpu, lg, T * X * sizeof(float));
    hp.norm_topk = false, hp.scale = 2.5f;
    for (size_t t = 0; t < T; t++) moe_route(&hp, lg_cpu + t * X, sel_cpu + t * K, wts_cpu + t * K);
    host_floats(bw, wts, T * K);
    assert_true(max_rel(wts, wts_cpu, T * K) < 1e-5);
    /* gpt-oss's gate: top-k on the raw logits, the softmax over the k (logits untouched) */
    {
        const size_t K4 = 4;
        struct tern_vk_buf *bids4, *bw4;
        assert_int_equal(tern_vk_buf_new(vk, T * K4 * sizeof(uint32_t), &bids4), TERN_OK);
        assert_int_equal(tern_vk_buf_new(vk, T * K4 * sizeof(float), &bw4), TERN_OK);
        assert_int_equal(tern_vk_upload(blg, 0, lg, T * X * sizeof(float)), TERN_OK);
        assert_int_equal(tern_vk_moe_route(vk, blg, bids4, bw4, T, X, K4, false, 1.0f, true), TERN_OK);
        struct moe_hparams oai = {.n_expert = (uint32_t)X, .n_used = (uint32_t)K4, .scale = 1.0f, .softmax_weight = true};
        int32_t sel4[13 * 4];
        float w4_cpu[13 * 4], w4[13 * 4], after[13 * 8];
        uint32_t ids4[13 * 4];
        memcpy(lg_cpu, lg, T * X * sizeof(float));
        for (size_t t = 0; t < T; t++) moe_route(&oai, lg_cpu + t * X, sel4 + t * K4, w4_cpu + t * K4);
        assert_int_equal(tern_vk_download(bids4, 0, ids4, sizeof ids4), TERN_OK);
        host_floats(bw4, w4, T * K4);
        host_floats(blg, after, T * X);
        for (size_t i = 0; i < T * K4; i++) assert_int_equal(ids4[i], (uint32_t)sel4[i]);
        assert_memory_equal(after, lg, T * X * sizeof(float));
        for (size_t t = 0; t < T; t++) { /* a softmax: positive, summing to 1, descending */
            float sum = 0;
            for (size_t j = 0; j < K4; j++) sum += w4[t * K4 + j];
            assert_true(fabsf(sum - 1.0f) < 1e-5f && w4[t * K4] >= w4[t * K4 + K4 - 1] && w4[t * K4 + K4 - 1] > 0);
        }
        printf("moe route (softmax over the chosen): weights within %.2e of the CPU's\n", max_rel(w4, w4_cpu, T * K4));
        assert_true(max_rel(w4, w4_cpu, T * K4) < 1e-5);
        tern_vk_buf_free(bids4), tern_vk_buf_free(bw4);
    }

    /* the experts' matmul (Q4_K stacked experts, gate/up style: slots share their token's row) */
    uint64_t rb;
    assert_true(tern_dtype_row_size(TERN_DTYPE_Q4_K, k, &rb));
    /* a gap between experts, as a stride need not be tight; 146 (even, for the F16 scales)
     * puts the experts' rows at offsets 0, 2, 4, ... mod 16: matmul.comp's 16-byte loads
     * and its fallback for rows they cannot take */
    const size_t stride = rb * n + 146;
    unsigned char *w = calloc(X, stride);
    float *wf = malloc(k * sizeof(float)), *x = malloc(T * k * sizeof(float));
    for (size_t e = 0; e < X; e++)
        for (size_t row = 0; row < n; row++) {
            for (size_t i = 0; i < k; i++) wf[i] = (float)(tern_rng_uniform(&r) * 2 - 1);
            assert_true(tern_quantize_row(TERN_DTYPE_Q4_K, wf, w + e * stride + row * rb, k));
        }
    for (size_t i = 0; i < T * k; i++) x[i] = (float)(tern_rng_uniform(&r) * 2 - 1);
    struct tern_vk_buf *bwt, *bx = dev_floats(x, T * k), *by;
    assert_int_equal(tern_vk_buf_new(vk, X * stride, &bwt), TERN_OK);
    assert_int_equal(tern_vk_upload(bwt, 0, w, X * stride), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, T * K * n * sizeof(float), &by), TERN_OK);
    assert_int_equal(tern_vk_upload(bids, 0, ids, sizeof ids), TERN_OK);
    /* the slots grouped by expert (a stable counting sort of the ids), then the tiles: each
     * expert's run cut into tiles of up to 8 (more than TERN_VK_MOE_ONE_SLOT slots) */
    const size_t ow = tern_vk_moe_order_words(T * K, X);
    struct tern_vk_buf *bord;
    assert_int_equal(tern_vk_buf_new(vk, ow * sizeof(uint32_t), &bord), TERN_OK);
    assert_int_equal(tern_vk_moe_group(vk, bids, bord, T * K, X), TERN_OK);
    uint32_t order[13 * 2 + 1 + 2 * 26], want[13 * 2 + 1 + 2 * 26];
    assert_true(ow <= sizeof order / sizeof *order);
    assert_int_equal(tern_vk_download(bord, 0, order, ow * sizeof(uint32_t)), TERN_OK);
    size_t nw = 0, nt = 0, multi = 0;
    for (uint32_t e = 0; e < X; e++) {
        const size_t from = nw;
        for (uint32_t sl = 0; sl < T * K; sl++)
            if (ids[sl] == e) want[nw++] = sl;
        for (size_t i = from; i < nw; i += 8, nt++) {
            want[T * K + 1 + 2 * nt] = (uint32_t)i;
            want[T * K + 2 + 2 * nt] = (uint32_t)(nw - i < 8 ? nw - i : 8);
            multi += nw - i > 1;
        }
    }
    want[T * K] = (uint32_t)nt;
    assert_int_equal(nw, T * K);
    assert_true(multi > 0 && nt < T * K); /* tiles of several slots: the test means something */
    assert_memory_equal(order, want, (T * K + 1 + 2 * nt) * sizeof(uint32_t));
    assert_int_equal(tern_vk_matmul_id(vk, TERN_DTYPE_Q4_K, bwt, stride, X, k, n, bids, bord, bx, K, T * K, by), TERN_OK);
    float *y = malloc(T * K * n * sizeof(float)), *yp = malloc(n * sizeof(float));
    host_floats(by, y, T * K * n);
    /* the tiles change no bits: each slot's row is the plain matmul's of its token alone */
    for (size_t s = 0; s < T * K; s++) {
        device_matmul(TERN_DTYPE_Q4_K, w + ids[s] * stride, rb * n, k, n, x + (s / K) * k, 1, yp);
        assert_memory_equal(yp, y + s * n, n * sizeof(float));
    }
    /* runs longer than a tile: 13 slots each of experts 3 and 5, cut into tiles of 8 and 5 */
    {
        uint32_t ids2[13 * 2], o2[13 * 2 + 1];
        for (uint32_t sl = 0; sl < T * K; sl++) ids2[sl] = sl % 2 ? 3 : 5;
        struct tern_vk_buf *bids2, *by2;
        assert_int_equal(tern_vk_buf_new(vk, sizeof ids2, &bids2), TERN_OK);
        assert_int_equal(tern_vk_buf_new(vk, T * K * n * sizeof(float), &by2), TERN_OK);
        assert_int_equal(tern_vk_upload(bids2, 0, ids2, sizeof ids2), TERN_OK);
        assert_int_equal(tern_vk_moe_group(vk, bids2, bord, T * K, X), TERN_OK);
        assert_int_equal(tern_vk_download(bord, 0, o2, sizeof o2), TERN_OK);
        assert_int_equal(o2[T * K], 4); /* 8 + 5 slots of expert 3, then of expert 5 */
        assert_int_equal(tern_vk_matmul_id(vk, TERN_DTYPE_Q4_K, bwt, stride, X, k, n, bids2, bord, bx, K, T * K, by2),
                         TERN_OK);
        float *y2 = malloc(T * K * n * sizeof(float));
        host_floats(by2, y2, T * K * n);
        for (size_t sl = 0; sl < T * K; sl++) {
            device_matmul(TERN_DTYPE_Q4_K, w + ids2[sl] * stride, rb * n, k, n, x + (sl / K) * k, 1, yp);
            assert_memory_equal(yp, y2 + sl * n, n * sizeof(float));
        }
        free(y2);
        tern_vk_buf_free(bids2), tern_vk_buf_free(by2);
    }
    /* at most TERN_VK_MOE_ONE_SLOT slots (one or two tokens' experts): tiles of one slot
     * each, read by the one-slot pipeline, and the same bits as in tiles of up to 8 */
    {
        const size_t ns = TERN_VK_MOE_ONE_SLOT;
        assert_true(ns < T * K && tern_vk_moe_tile(ns) == 1 && tern_vk_moe_tile(T * K) == 8);
        uint32_t o1[3 * TERN_VK_MOE_ONE_SLOT + 1];
        assert_int_equal(tern_vk_moe_order_words(ns, X), TERN_ARRAY_LEN(o1));
        assert_int_equal(tern_vk_moe_group(vk, bids, bord, ns, X), TERN_OK);
        assert_int_equal(tern_vk_download(bord, 0, o1, sizeof o1), TERN_OK);
        assert_int_equal(o1[ns], ns);
        size_t shared = 0;
        for (size_t i = 0; i < ns; i++) {
            assert_int_equal(o1[ns + 2 + 2 * i], 1);
            assert_int_equal(o1[ns + 1 + 2 * i], i);
            shared += i > 0 && ids[o1[i]] == ids[o1[i - 1]];
        }
        assert_true(shared > 0); /* an expert with several slots, read once per slot here */
        struct tern_vk_buf *by16;
        assert_int_equal(tern_vk_buf_new(vk, ns * n * sizeof(float), &by16), TERN_OK);
        assert_int_equal(tern_vk_matmul_id(vk, TERN_DTYPE_Q4_K, bwt, stride, X, k, n, bids, bord, bx, K, ns, by16),
                         TERN_OK);
        float *y16 = malloc(ns * n * sizeof(float));
        host_floats(by16, y16, ns * n);
        assert_memory_equal(y16, y, ns * n * sizeof(float));
        free(y16);
        tern_vk_buf_free(by16);
    }
    /* a slot alone (x_div 1: its own row) gives its batch bits */
    struct tern_vk_buf *bx1 = dev_floats(x + 6 * k, k), *bid1, *by1, *bord1;
    assert_int_equal(tern_vk_buf_new(vk, sizeof(uint32_t), &bid1), TERN_OK);
    assert_int_equal(tern_vk_upload(bid1, 0, &ids[13], sizeof(uint32_t)), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, n * sizeof(float), &by1), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, tern_vk_moe_order_words(1, X) * sizeof(uint32_t), &bord1), TERN_OK);
    assert_int_equal(tern_vk_moe_group(vk, bid1, bord1, 1, X), TERN_OK);
    assert_int_equal(tern_vk_matmul_id(vk, TERN_DTYPE_Q4_K, bwt, stride, X, k, n, bid1, bord1, bx1, 1, 1, by1), TERN_OK);
    host_floats(by1, yp, n);
    assert_memory_equal(yp, y + 13 * n, n * sizeof(float));
    /* an id past the experts gives NaN, not a stray read; bad shapes are refused */
    const uint32_t bad = 9;
    assert_int_equal(tern_vk_upload(bid1, 0, &bad, sizeof bad), TERN_OK);
    assert_int_equal(tern_vk_moe_group(vk, bid1, bord1, 1, X), TERN_OK);
    assert_int_equal(tern_vk_matmul_id(vk, TERN_DTYPE_Q4_K, bwt, stride, X, k, n, bid1, bord1, bx1, 1, 1, by1), TERN_OK);
    host_floats(by1, yp, n);
    assert_true(isnan(yp[0]) && isnan(yp[n - 1]));
    assert_int_equal(tern_vk_matmul_id(vk, TERN_DTYPE_Q4_K, bwt, stride, X + 1, k, n, bids, bord, bx, K, T * K, by),
                     TERN_ERR_RANGE);
    assert_int_equal(tern_vk_matmul_id(vk, TERN_DTYPE_Q4_K, bwt, rb, X, k, n, bids, bord, bx, K, T * K, by), TERN_ERR_RANGE);
    assert_int_equal(tern_vk_matmul_id(vk, TERN_DTYPE_Q4_K, bwt, stride, X, k, n, bids, bid1, bx, K, T * K, by),
                     TERN_ERR_RANGE); /* an order shorter than the slots */
    assert_int_equal(tern_vk_moe_group(vk, bids, bord, T * K, 2000), TERN_ERR_INVALID);

    /* combine: d = the slots' rows (n floats each), with and without a shared expert */
    float *sd = malloc(T * n * sizeof(float)), sw[13], *ref = malloc(T * n * sizeof(float)), *got = malloc(T * n * sizeof(float));
    for (size_t i = 0; i < T * n; i++) sd[i] = (float)(tern_rng_uniform(&r) * 2 - 1);
    for (size_t t = 0; t < T; t++) sw[t] = (float)(tern_rng_uniform(&r) * 6 - 3);
    struct tern_vk_buf *bsd = dev_floats(sd, T * n), *bsw = dev_floats(sw, T), *bout;
    assert_int_equal(tern_vk_buf_new(vk, T * n * sizeof(float), &bout), TERN_OK);
    assert_int_equal(tern_vk_upload(bw, 0, wts_cpu, T * K * sizeof(float)), TERN_OK);
    for (int shared = 0; shared < 2; shared++) {
        assert_int_equal(tern_vk_moe_combine(vk, bout, by, bw, T, n, K, shared ? bsd : NULL, shared ? bsw : NULL), TERN_OK);
        host_floats(bout, got, T * n);
        for (size_t t = 0; t < T; t++)
            for (size_t i = 0; i < n; i++) {
                float v = y[(t * K) * n + i] * wts_cpu[t * K];
                for (size_t j = 1; j < K; j++) v += y[(t * K + j) * n + i] * wts_cpu[t * K + j];
                if (shared) v += sd[t * n + i] * (1.0f / (1.0f + expf(-sw[t])));
                ref[t * n + i] = v;
            }
        double worst = 0;
        for (size_t i = 0; i < T * n; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]));
        printf("moe combine%s: max difference to the CPU formula %.2e\n", shared ? " + shared expert" : "", worst);
        if (shared) assert_true(worst < 1e-6);
        else assert_memory_equal(got, ref, T * n * sizeof(float)); /* multiplies and adds only */
    }
    assert_int_equal(tern_vk_moe_combine(vk, bout, by, bw, T, n, K, bsd, NULL), TERN_ERR_INVALID);

    /* the bias add: the CPU's bits */
    float bias[40];
    for (size_t i = 0; i < n; i++) bias[i] = (float)(tern_rng_uniform(&r) - 0.5);
    struct tern_vk_buf *bb = dev_floats(bias, n);
    assert_int_equal(tern_vk_upload(bout, 0, sd, T * n * sizeof(float)), TERN_OK);
    assert_int_equal(tern_vk_add_bias(vk, bout, bb, T, n), TERN_OK);
    host_floats(bout, got, T * n);
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < n; i++) ref[t * n + i] = sd[t * n + i] + bias[i];
    assert_memory_equal(got, ref, T * n * sizeof(float));

    /* gpt-oss: each slot's expert's bias row (an id past the experts: a NaN row), then the
     * clamped swiglu (the CPU's swiglu_oai: bias, clamp, x sigmoid(1.702 x) (y + 1)) */
    {
        const size_t S = T * K;
        float *eb = malloc(X * n * sizeof(float)), *g0 = malloc(S * n * sizeof(float)), *u0 = malloc(S * n * sizeof(float));
        float *gg = malloc(S * n * sizeof(float)), *gr = malloc(S * n * sizeof(float));
        for (size_t i = 0; i < X * n; i++) eb[i] = (float)(tern_rng_uniform(&r) * 4 - 2);
        for (size_t i = 0; i < S * n; i++) /* beyond the clamp on both sides, often */
            g0[i] = (float)(tern_rng_uniform(&r) * 24 - 12), u0[i] = (float)(tern_rng_uniform(&r) * 24 - 12);
        uint32_t ids_bad[13 * 2];
        memcpy(ids_bad, ids, sizeof ids_bad);
        ids_bad[5] = (uint32_t)X; /* past the experts */
        struct tern_vk_buf *beb = dev_floats(eb, X * n), *bg = dev_floats(g0, S * n), *bu = dev_floats(u0, S * n), *bidb;
        assert_int_equal(tern_vk_buf_new(vk, sizeof ids_bad, &bidb), TERN_OK);
        assert_int_equal(tern_vk_upload(bidb, 0, ids_bad, sizeof ids_bad), TERN_OK);
        assert_int_equal(tern_vk_moe_expert_bias(vk, bg, bidb, beb, S, n, X), TERN_OK);
        host_floats(bg, gg, S * n);
        for (size_t sl = 0; sl < S; sl++)
            for (size_t i = 0; i < n; i++)
                if (sl == 5) assert_true(isnan(gg[sl * n + i]));
                else assert_true(gg[sl * n + i] == g0[sl * n + i] + eb[ids[sl] * n + i]);
        assert_int_equal(tern_vk_upload(bg, 0, g0, S * n * sizeof(float)), TERN_OK);
        assert_int_equal(tern_vk_swiglu_oai(vk, bg, bu, S, n), TERN_OK);
        host_floats(bg, gg, S * n);
        size_t clamped = 0;
        double worst = 0;
        for (size_t i = 0; i < S * n; i++) {
            const float xc = g0[i] < 7.0f ? g0[i] : 7.0f, yc = u0[i] < 7.0f ? (u0[i] > -7.0f ? u0[i] : -7.0f) : 7.0f;
            gr[i] = xc / (1.0f + expf(1.702f * -xc)) * (yc + 1.0f);
            clamped += g0[i] > 7.0f || fabsf(u0[i]) > 7.0f;
            worst = fmax(worst, fabs((double)gg[i] - gr[i]) / (fabs((double)gr[i]) + 1e-3));
        }
        printf("swiglu_oai: %zu of %zu values clamped, max difference to the CPU formula %.2e\n", clamped, S * n, worst);
        assert_true(clamped > S * n / 4 && worst < 1e-4);
        assert_int_equal(tern_vk_moe_expert_bias(vk, bg, bidb, beb, S, n, 0), TERN_ERR_INVALID);
        assert_int_equal(tern_vk_moe_expert_bias(vk, bg, bidb, bb, S, n, X), TERN_ERR_RANGE); /* too few bias rows */
        tern_vk_buf_free(beb), tern_vk_buf_free(bg), tern_vk_buf_free(bu), tern_vk_buf_free(bidb);
        free(eb), free(g0), free(u0), free(gg), free(gr);
    }

    struct tern_vk_buf *bufs[] = {blg, bids, bw, bwt, bx, by, bx1, bid1, by1, bsd, bsw, bout, bb, bord, bord1};
    for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) tern_vk_buf_free(bufs[i]);
    free(lg), free(lg_cpu), free(w), free(wf), free(x), free(y), free(yp), free(sd), free(ref), free(got);
}

static void test_refusals(void **state) {
    (void)state;
    struct tern_vk_buf *a, *b, *c;
    assert_int_equal(tern_vk_buf_new(vk, 4096, &a), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, 4096, &b), TERN_OK);
    assert_int_equal(tern_vk_buf_new(vk, 16, &c), TERN_OK);
    assert_false(tern_vk_matmul_supported(TERN_DTYPE_TQ1_0));
    assert_int_equal(tern_vk_matmul(vk, TERN_DTYPE_TQ1_0, a, 256, 4, b, 1, c), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "TQ1_0"));
    assert_int_equal(tern_vk_matmul(vk, TERN_DTYPE_Q8_0, a, 33, 4, b, 1, c), TERN_ERR_INVALID); /* k % 32 */
    assert_int_equal(tern_vk_matmul(vk, TERN_DTYPE_F32, a, 64, 8, b, 1, c), TERN_ERR_RANGE);   /* y: 32 > 16 bytes */
    assert_non_null(strstr(tern_last_error(), "too small"));
    tern_vk_buf_free(a), tern_vk_buf_free(b), tern_vk_buf_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buffers),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_row_ops),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_deltanet),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_matmul_lanes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
