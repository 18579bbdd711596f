/* Mixture-of-experts models (qwen3moe, qwen35moe, gpt-oss; parity with llama.cpp's logits is in
 * test-model-parity):
 * - routing: softmax, top-k in descending order with ties to the lowest id, the
 *   renormalisation and scale, NaN never chosen;
 * - exactness (DESIGN.md §5): bit-identical logits and state for every chunking and
 *   thread count on the kit's MoE models and on generated shapes the kit lacks (the
 *   grouped expert matmul sees other group sizes in every chunking);
 * - resumed equals cold: a checkpoint restore (hybrid) and a rewind (attention-only);
 * - load errors name the key or tensor and the numbers. */
#include "harness.h"
#include "exact.h"

#include "model/mkmodel.h"
#include "backend/cpu/cpu.h"
#include "model/moe.h"
#include "util/mem.h"
#include "tern.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define Q3MOE_F32 "models/tiny-qwen3moe-f32.gguf"
#define Q3MOE_Q8_0 "models/tiny-qwen3moe-q8_0.gguf"
#define Q35MOE_F32 "models/tiny-qwen35moe-f32.gguf"
#define Q35MOE_Q4KM "models/tiny-qwen35moe-q4_k_m.gguf"
#define GPTOSS_F32 "models/tiny-gptoss-f32.gguf"
#define GPTOSS_MXFP4 "models/tiny-gptoss-mxfp4.gguf"
#define Q3NEXT_Q8_0 "models/tiny-qwen3next-q8_0.gguf"

/* --light (the variant that also runs under ASan): shorter prompts. */
static bool g_light;

/* ---- routing ------------------------------------------------------------------------ */

static void test_route(void **unused) {
    (void)unused;
    struct moe_hparams hp = {.n_expert = 6, .n_used = 3, .norm_topk = true, .scale = 1.0f};
    int32_t sel[8];
    float w[8];

    /* descending by probability; experts 1 and 4 tie for second: the lower id first */
    float l[6] = {0.1f, 2.0f, -1.0f, 0.5f, 2.0f, 3.0f};
    moe_route(&hp, l, sel, w);
    assert_int_equal(sel[0], 5);
    assert_int_equal(sel[1], 1);
    assert_int_equal(sel[2], 4);
    /* the probabilities are a softmax over all six, and the weights renormalise them */
    float sum = 0;
    for (int i = 0; i < 6; i++) sum += l[i];
    assert_true(fabsf(sum - 1.0f) < 1e-6f);
    assert_true(fabsf(w[0] + w[1] + w[2] - 1.0f) < 1e-6f);
    assert_true(w[1] == w[2] && w[0] > w[1]);
    assert_true(fabsf(w[0] / w[1] - expf(1.0f)) < 1e-5f);

    /* without renormalisation the weights are the probabilities; the scale multiplies */
    hp.norm_topk = false;
    hp.scale = 2.5f;
    float l2[6] = {0.1f, 2.0f, -1.0f, 0.5f, 2.0f, 3.0f};
    moe_route(&hp, l2, sel, w);
    assert_true(fabsf(w[0] - 2.5f * l2[5]) < 1e-6f);
    assert_true(fabsf(w[1] - 2.5f * l2[1]) < 1e-6f);

    /* all equal: the lowest ids, in order */
    hp = (struct moe_hparams){.n_expert = 6, .n_used = 4, .norm_topk = true, .scale = 1.0f};
    float l3[6] = {1, 1, 1, 1, 1, 1};
    moe_route(&hp, l3, sel, w);
    for (int j = 0; j < 4; j++) {
        assert_int_equal(sel[j], j);
        assert_true(fabsf(w[j] - 0.25f) < 1e-6f);
    }

    /* a NaN logit (a broken model) never wins over a number, and the choice stays
     * defined: the experts are still distinct */
    hp.n_used = 2;
    float l4[6] = {NAN, 0.0f, 1.0f, 0.0f, 0.0f, 0.0f};
    moe_route(&hp, l4, sel, w);
    assert_true(sel[0] != sel[1]);

    /* every expert used: a permutation */
    hp = (struct moe_hparams){.n_expert = 5, .n_used = 5, .norm_topk = true, .scale = 1.0f};
    float l5[5] = {0.3f, -2.0f, 4.0f, 0.3f, 1.0f};
    moe_route(&hp, l5, sel, w);
    const int32_t want[5] = {2, 4, 0, 3, 1};
    assert_memory_equal(sel, want, sizeof want);
}

/* gpt-oss's softmax_weight gate: the k largest raw logits (ties to the lowest id), their
 * weights the softmax over those k alone; the logits stay as they were. */
static void test_route_softmax_weight(void **unused) {
    (void)unused;
    struct moe_hparams hp = {.n_expert = 6, .n_used = 3, .scale = 1.0f, .softmax_weight = true};
    int32_t sel[3];
    float w[3];
    float l[6] = {0.1f, 2.0f, -1.0f, 0.5f, 2.0f, 3.0f};
    const float l0[6] = {0.1f, 2.0f, -1.0f, 0.5f, 2.0f, 3.0f};
    moe_route(&hp, l, sel, w);
    const int32_t want[3] = {5, 1, 4};
    assert_memory_equal(sel, want, sizeof want);
    assert_memory_equal(l, l0, sizeof l0);
    const double z = exp(3.0) + 2 * exp(2.0);
    assert_true(fabs(w[0] - exp(3.0) / z) < 1e-6 && fabs(w[1] - exp(2.0) / z) < 1e-6 && w[1] == w[2]);
    /* negative logits: the largest still win (a softmax over all six would agree; a sigmoid
     * gate's weights would not sum to 1) */
    float n[6] = {-9.0f, -1.0f, -3.0f, -2.0f, -8.0f, -7.0f};
    moe_route(&hp, n, sel, w);
    const int32_t want2[3] = {1, 3, 2};
    assert_memory_equal(sel, want2, sizeof want2);
    assert_true(fabsf(w[0] + w[1] + w[2] - 1.0f) < 1e-6f);
}

/* ---- exactness ---------------------------------------------------------------------- */

static void test_exact_kit(void **unused) {
    (void)unused;
    const size_t n = g_light ? 24 : 100;
    th_require_shared(Q35MOE_Q4KM);
    tx_check_exact("tiny-qwen3moe-q8_0", th_shared_path(Q3MOE_Q8_0), TERN_KV_F16, n);
    tx_check_exact("tiny-qwen35moe-f32", th_shared_path(Q35MOE_F32), TERN_KV_F32, n);
    /* Q4_K experts, Q5_0 / Q8_0 down projections, Q8_0 attention: mixed formats */
    tx_check_exact("tiny-qwen35moe-q4_k_m", th_shared_path(Q35MOE_Q4KM), TERN_KV_F16, n);
    if (!g_light) tx_check_exact("tiny-qwen3moe-f32", th_shared_path(Q3MOE_F32), TERN_KV_F32, n);
    /* gpt-oss: window 16 on even layers, sinks; 300 tokens cross a KV page (256) with
     * windows that straddle it */
    th_require_shared(GPTOSS_MXFP4);
    tx_check_exact("tiny-gptoss-mxfp4", th_shared_path(GPTOSS_MXFP4), TERN_KV_F16, g_light ? 40 : 300);
    if (!g_light) tx_check_exact("tiny-gptoss-f32", th_shared_path(GPTOSS_F32), TERN_KV_F32, 300);
    /* qwen3next: grouped k-heads, the fused ssm_ba, plain partial NeoX RoPE */
    th_require_shared(Q3NEXT_Q8_0);
    tx_check_exact("tiny-qwen3next-q8_0", th_shared_path(Q3NEXT_Q8_0), TERN_KV_F16, n);
}

/* Shapes the kit has not: more experts than a chunk of 7 touches, an odd number used,
 * expert widths that are not multiples of 256, F16 and Q4_K_M weights. */
static void test_exact_generated(void **unused) {
    (void)unused;
    char path[512];
    struct tern_mkmodel_params p;
    tern_mkmodel_defaults(TERN_MK_QWEN3MOE, &p);
    p.n_layer = 3;
    p.n_embd = 128;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.n_vocab = 300;
    p.n_expert = 13;
    p.n_expert_used = 3;
    p.n_ff_exp = 96;
    p.wtype = TERN_DTYPE_F16;
    snprintf(path, sizeof path, "%s/q3moe-f16.gguf", th_tmpdir());
    enum tern_status st = tern_mkmodel_write(&p, path, NULL);
    if (st) print_error("mkmodel: %s\n", tern_last_error());
    assert_int_equal(st, TERN_OK);
    tx_check_exact("generated qwen3moe f16 (13 experts, 3 used)", path, TERN_KV_F16, g_light ? 24 : 70);

    tern_mkmodel_defaults(TERN_MK_QWEN35MOE, &p);
    p.n_layer = 4;
    p.full_attn_interval = 2;
    p.n_vocab = 300;
    p.n_expert = 16;
    p.n_expert_used = 4;
    p.n_ff_exp = 256;
    p.n_ff_shexp = 96;
    assert_true(tern_mkmodel_parse_type("q4_k_m", &p.wtype, &p.mix));
    snprintf(path, sizeof path, "%s/q35moe-q4km.gguf", th_tmpdir());
    st = tern_mkmodel_write(&p, path, NULL);
    if (st) print_error("mkmodel: %s\n", tern_last_error());
    assert_int_equal(st, TERN_OK);
    tx_check_exact("generated qwen35moe q4_k_m (16 experts, 4 used)", path, TERN_KV_F16, g_light ? 24 : 70);

    /* gpt-oss in the real files' mix (MXFP4 experts, Q8_0 elsewhere), a window of 5 that
     * chunks of 7 and 64 straddle, 6 experts with 3 used, 3 layers (a last window layer) */
    tern_mkmodel_defaults(TERN_MK_GPTOSS, &p);
    p.n_layer = 3;
    p.n_embd = 128;
    p.n_head = 4;
    p.n_head_kv = 1;
    p.n_vocab = 300;
    p.n_expert = 6;
    p.n_expert_used = 3;
    p.n_ff_exp = 96;
    p.sliding_window = 5;
    assert_true(tern_mkmodel_parse_type("mxfp4_moe", &p.wtype, &p.mix));
    snprintf(path, sizeof path, "%s/gptoss-mxfp4.gguf", th_tmpdir());
    st = tern_mkmodel_write(&p, path, NULL);
    if (st) print_error("mkmodel: %s\n", tern_last_error());
    assert_int_equal(st, TERN_OK);
    tx_check_exact("generated gpt-oss mxfp4_moe (window 5, 6 experts, 3 used)", path, TERN_KV_F32, g_light ? 24 : 70);
}

/* ---- resumed equals cold ----------------------------------------------------------------- */

static struct tern_model *load_kit(const char *rel, int n_threads) {
    th_require_shared(rel);
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = th_shared_path(rel);
    mp.n_threads = n_threads;
    struct tern_model *m = NULL;
    if (tern_model_load(&mp, &m)) print_error("load %s: %s\n", rel, tern_last_error());
    assert_non_null(m);
    return m;
}

static struct tern_session *session(struct tern_model *m) {
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.n_ctx = 512;
    struct tern_session *s = NULL;
    assert_int_equal(tern_session_new(m, &sp, &s), TERN_OK);
    return s;
}

static void keep_ckpt(void *user, struct tern_checkpoint *c) {
    struct tern_checkpoint **slot = user;
    if (*slot) tern_checkpoint_free(*slot);
    *slot = c;
}

/* gpt-oss (window 16 on even layers): rewinds and forks whose boundary leaves the rest
 * of the prompt inside the window of the kept positions (n - at < 16) and beyond it, one
 * across a KV page; every resumed session equals the cold one, logits and state. The
 * window layers keep every position, so a rewind finds the keys its window needs. */
static void resume_gptoss(void) {
    const size_t n = g_light ? 60 : 300;
    int32_t *toks = tx_prompt(n);
    int32_t more[4] = {7, 70, 700, 3000};
    struct tern_model *m = load_kit(GPTOSS_MXFP4, 2);
    const size_t nv = tern_model_info(m)->n_vocab;
    struct tern_session *cold = session(m);
    assert_int_equal(tern_session_eval(cold, toks, n, NULL), TERN_OK);
    const size_t ats[] = {n - 5, n - 40, 9, g_light ? 30 : 250};
    for (size_t i = 0; i < TERN_ARRAY_LEN(ats); i++) {
        const size_t at = ats[i];
        struct tern_session *s = session(m);
        assert_int_equal(tern_session_eval(s, toks, at + 3 < n ? at + 3 : n, NULL), TERN_OK);
        assert_int_equal(tern_session_eval(s, more, 4, NULL), TERN_OK);
        assert_int_equal(tern_session_rewind(s, (uint32_t)at), TERN_OK);
        struct tern_session *f = NULL;
        assert_int_equal(tern_session_fork(s, (uint32_t)at, NULL, &f), TERN_OK);
        assert_int_equal(tern_session_eval(s, toks + at, n - at, NULL), TERN_OK);
        assert_int_equal(tern_session_hash(s), tern_session_hash(cold));
        assert_memory_equal(tern_session_logits(s), tern_session_logits(cold), nv * sizeof(float));
        const struct tern_eval_opts o = {.n_chunk = 7};
        assert_int_equal(tern_session_eval(f, toks + at, n - at, &o), TERN_OK);
        assert_int_equal(tern_session_hash(f), tern_session_hash(cold));
        assert_memory_equal(tern_session_logits(f), tern_session_logits(cold), nv * sizeof(float));
        tern_session_free(f);
        tern_session_free(s);
    }
    print_message("resumed equals cold: gpt-oss rewinds + forks to %zu, %zu, %zu, %zu of %zu (window 16)\n", ats[0],
                  ats[1], ats[2], ats[3], n);
    tern_session_free(cold);
    tern_model_free(m);
    free(toks);
}

/* The hybrid MoE model: a checkpoint taken while priming, restored after other tokens,
 * re-reads to the cold state; so does a fork. The attention-only one: a rewind. */
static void test_resume(void **unused) {
    (void)unused;
    const size_t n = g_light ? 60 : 140, at = n / 2;
    int32_t *toks = tx_prompt(n);
    int32_t more[4] = {7, 70, 700, 3000};

    struct tern_model *m = load_kit(Q35MOE_F32, 2);
    const size_t nv = tern_model_info(m)->n_vocab;
    struct tern_session *cold = session(m);
    assert_int_equal(tern_session_eval(cold, toks, n, NULL), TERN_OK);
    const uint64_t h_cold = tern_session_hash(cold);

    struct tern_session *s = session(m);
    struct tern_checkpoint *ck = NULL;
    const uint32_t pos = (uint32_t)at;
    struct tern_eval_opts o = {.n_chunk = 16, .ckpt_pos = &pos, .n_ckpt = 1, .on_ckpt = keep_ckpt, .user = &ck};
    assert_int_equal(tern_session_eval(s, toks, n, &o), TERN_OK);
    assert_non_null(ck);
    assert_int_equal(tern_session_hash(s), h_cold);
    assert_int_equal(tern_session_eval(s, more, 4, NULL), TERN_OK);
    assert_int_equal(tern_session_restore(s, ck), TERN_OK);
    assert_int_equal(tern_session_eval(s, toks + at, n - at, NULL), TERN_OK);
    assert_int_equal(tern_session_hash(s), h_cold);
    assert_memory_equal(tern_session_logits(s), tern_session_logits(cold), nv * sizeof(float));
    struct tern_session *f = NULL;
    assert_int_equal(tern_session_fork(s, pos, ck, &f), TERN_OK);
    assert_int_equal(tern_session_eval(f, toks + at, n - at, NULL), TERN_OK);
    assert_int_equal(tern_session_hash(f), h_cold);
    tern_session_free(f);
    tern_checkpoint_free(ck);
    tern_session_free(s);
    tern_session_free(cold);
    tern_model_free(m);

    m = load_kit(Q3MOE_Q8_0, 3);
    cold = session(m);
    assert_int_equal(tern_session_eval(cold, toks, n, NULL), TERN_OK);
    s = session(m);
    assert_int_equal(tern_session_eval(s, toks, at + 5, NULL), TERN_OK);
    assert_int_equal(tern_session_eval(s, more, 4, NULL), TERN_OK);
    assert_int_equal(tern_session_rewind(s, (uint32_t)at), TERN_OK);
    assert_int_equal(tern_session_eval(s, toks + at, n - at, NULL), TERN_OK);
    assert_int_equal(tern_session_hash(s), tern_session_hash(cold));
    assert_memory_equal(tern_session_logits(s), tern_session_logits(cold), nv * sizeof(float));
    print_message("resumed equals cold: qwen35moe checkpoint restore + fork at %zu, qwen3moe rewind to %zu of %zu\n",
                  at, at, n);
    tern_session_free(s);
    tern_session_free(cold);
    tern_model_free(m);
    free(toks);
    resume_gptoss();
}

/* ---- memory: experts nobody is routed to stay on disk ----------------------------------- */

/* Bytes of path that sit in the page cache (mincore over a mapping of our own, which
 * touches nothing). */
static size_t cached_bytes(const char *path, size_t *size) {
    const int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    *size = (size_t)st.st_size;
    void *p = mmap(NULL, *size, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (*size + pg - 1) / pg;
    unsigned char *v = malloc(n);
    assert_non_null(v);
    assert_int_equal(mincore(p, *size, v), 0);
    size_t in = 0;
    for (size_t i = 0; i < n; i++) in += v[i] & 1;
    free(v);
    munmap(p, *size);
    close(fd);
    return in * pg;
}

/* Drops path from the page cache (written back first). */
static void evict(const char *path) {
    const int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(fsync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

/* Loading a mapped model reads its metadata, not its weights (no prefaulting, no
 * checksum pass, unlike an engine that madvises the whole file WILLNEED): a 17 GB MoE
 * model on a 24 GB machine then pages in only what its tokens use. The file is dropped
 * from the page cache first; what the cache holds afterwards is what the load read.
 * (What one token then reads is not asserted: the kernel's read-around, 8 MB on some
 * disks, brings in neighbouring experts whatever tern touches.) */
static void test_load_reads_no_weights(void **unused) {
    (void)unused;
    struct tern_mkmodel_params p;
    tern_mkmodel_defaults(TERN_MK_QWEN3MOE, &p);
    p.n_layer = 1;
    p.n_embd = 1024;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = 128;
    p.n_vocab = 300;
    p.n_expert = 16;
    p.n_expert_used = 2;
    p.n_ff_exp = 1024;
    p.wtype = TERN_DTYPE_Q8_0;
    p.mix = TERN_MK_UNIFORM;
    char path[512];
    snprintf(path, sizeof path, "%s/q3moe-paging.gguf", th_tmpdir());
    assert_int_equal(tern_mkmodel_write(&p, path, NULL), TERN_OK);
    evict(path);
    size_t size;
    const size_t before = cached_bytes(path, &size);
    if (before > size / 4) {
        print_message("the page cache keeps the file (%zu of %zu bytes) after POSIX_FADV_DONTNEED; not measurable "
                      "here\n", before, size);
        skip();
    }
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = path;
    mp.n_threads = 1;
    struct tern_model *m = NULL;
    assert_int_equal(tern_model_load(&mp, &m), TERN_OK);
    const size_t after_load = cached_bytes(path, &size);
    struct tern_session *s = session(m);
    const int32_t tok = 17;
    assert_int_equal(tern_session_eval(s, &tok, 1, NULL), TERN_OK);
    const size_t after_eval = cached_bytes(path, &size);
    print_message("page cache: %zu KB after eviction, %zu KB after load, %zu KB after one token, of %zu KB\n",
                  before / 1024, after_load / 1024, after_eval / 1024, size / 1024);
    assert_true(after_eval > after_load); /* the measure sees what a token reads */
    assert_true(after_load < size / 5);
    tern_session_free(s);
    tern_model_free(m);
}

/* ---- load errors ------------------------------------------------------------------------ */

static void test_load_errors(void **unused) {
    (void)unused;
    tx_expect_load_error(Q3MOE_Q8_0, &(struct tx_mutation){.drop = "blk.2.ffn_down_exps.weight"}, TERN_ERR_FORMAT,
                         (const char *const[]){"blk.2.ffn_down_exps.weight", "missing", "[128, 256, 8]", NULL});
    tx_expect_load_error(Q3MOE_Q8_0, &(struct tx_mutation){.key = "qwen3moe.expert_used_count", .key_val = 9},
                         TERN_ERR_FORMAT, (const char *const[]){"expert_used_count 9", "[1, 8]", NULL});
    tx_expect_load_error(Q3MOE_Q8_0, &(struct tx_mutation){.key = "qwen3moe.expert_count", .key_val = 16},
                         TERN_ERR_FORMAT, (const char *const[]){"ffn_gate_inp", "expected [256, 16]", NULL});
    tx_expect_load_error(Q3MOE_Q8_0, &(struct tx_mutation){.key = "qwen3moe.expert_feed_forward_length", .key_val = 64},
                         TERN_ERR_FORMAT, (const char *const[]){"ffn_gate_exps", "[256, 128, 8]", "expected [256, 64, 8]", NULL});
    tx_expect_load_error(Q3MOE_Q8_0, &(struct tx_mutation){.key = "qwen3moe.expert_gating_func", .key_val = 2},
                         TERN_ERR_UNSUPPORTED, (const char *const[]){"expert_gating_func = 2", "softmax", NULL});
    tx_expect_load_error(Q35MOE_F32, &(struct tx_mutation){.drop = "blk.1.ffn_gate_inp_shexp.weight"}, TERN_ERR_FORMAT,
                         (const char *const[]){"blk.1.ffn_gate_inp_shexp.weight", "missing", NULL});
    tx_expect_load_error(Q35MOE_F32, &(struct tx_mutation){.key = "qwen35moe.expert_shared_feed_forward_length",
                                                           .key_val = 0},
                         TERN_ERR_FORMAT, (const char *const[]){"expert_shared_feed_forward_length 0", NULL});
    tx_expect_load_error(Q35MOE_F32, &(struct tx_mutation){.reshape = "blk.0.ffn_up_exps.weight", .new_ne0 = 128},
                         TERN_ERR_FORMAT, (const char *const[]){"blk.0.ffn_up_exps.weight", "expected [256, 64, 8]", NULL});
    /* gpt-oss: the window key, the sinks and the expert biases */
    tx_expect_load_error(GPTOSS_MXFP4, &(struct tx_mutation){.key = "gpt-oss.attention.sliding_window", .key_val = 0},
                         TERN_ERR_FORMAT, (const char *const[]){"gpt-oss.attention.sliding_window", "0", NULL});
    tx_expect_load_error(GPTOSS_MXFP4, &(struct tx_mutation){.drop = "blk.1.attn_sinks.weight"}, TERN_ERR_FORMAT,
                         (const char *const[]){"blk.1.attn_sinks.weight", "missing", "[4]", NULL});
    tx_expect_load_error(GPTOSS_MXFP4, &(struct tx_mutation){.drop = "blk.2.ffn_down_exps.bias"}, TERN_ERR_FORMAT,
                         (const char *const[]){"blk.2.ffn_down_exps.bias", "missing", "[192, 8]", NULL});
    tx_expect_load_error(GPTOSS_MXFP4, &(struct tx_mutation){.reshape = "blk.0.ffn_gate_exps.bias", .new_ne0 = 32},
                         TERN_ERR_FORMAT, (const char *const[]){"blk.0.ffn_gate_exps.bias", "expected [160, 8]", NULL});
    tx_expect_load_error(GPTOSS_MXFP4, &(struct tx_mutation){.key = "gpt-oss.expert_gating_func", .key_val = 1},
                         TERN_ERR_UNSUPPORTED, (const char *const[]){"expert_gating_func = 1", "softmax_weight", NULL});
}

int main(int argc, char **argv) {
    g_light = argc > 1 && !strcmp(argv[1], "--light");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route),         cmocka_unit_test(test_route_softmax_weight),
        cmocka_unit_test(test_exact_kit), cmocka_unit_test(test_exact_generated),
        cmocka_unit_test(test_resume),        cmocka_unit_test(test_load_reads_no_weights),
        cmocka_unit_test(test_load_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
