/* The engine on generated models: exactness (DESIGN.md §5: logits at every position and
 * the state hashes are bit-identical for every chunking, token-by-token decoding and
 * thread count, for every architecture and weight type), the session state API
 * (checkpoint/restore, rewind, fork, cancel, refusals), and weight validation. */
#include "harness.h"
#include "test-model-gen.h"

#include "tern.h"
#include "kernels/kernels.h"
#include "util/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "lite" (the variant run under sanitizers): fewer configurations and tokens, the same
 * assertions. */
static bool lite;

static struct tern_model *load(const char *path, int n_threads) {
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = path;
    mp.n_threads = n_threads;
    struct tern_model *m = NULL;
    enum tern_status st = tern_model_load(&mp, &m);
    if (st) fprintf(stderr, "load %s: %s\n", path, tern_last_error());
    assert_int_equal(st, TERN_OK);
    return m;
}

static struct tern_session *new_session(struct tern_model *m, enum tern_kv_type kv, uint32_t n_chunk) {
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.kv_type = kv;
    sp.n_chunk = n_chunk;
    sp.n_ctx = 1024;
    struct tern_session *s = NULL;
    assert_int_equal(tern_session_new(m, &sp, &s), TERN_OK);
    return s;
}

static void random_tokens(int32_t *t, size_t n, uint32_t n_vocab, uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        t[i] = (int32_t)(x % n_vocab);
    }
}

/* One way of consuming a prompt: chunk size (0 = one token per eval call). */
struct run {
    uint64_t hash;
    float *logits; /* [n][n_vocab] */
    float last[8]; /* a few final logits from tern_session_logits */
};

static void run_prompt(struct tern_model *m, const int32_t *toks, size_t n, uint32_t chunk, enum tern_kv_type kv,
                       struct run *r) {
    const uint32_t nv = tern_model_info(m)->n_vocab;
    r->logits = malloc(sizeof(float) * n * nv);
    struct tern_session *s = new_session(m, kv, chunk ? chunk : 1);
    if (chunk) {
        struct tern_eval_opts o = {.n_chunk = chunk, .logits_all = r->logits};
        assert_int_equal(tern_session_eval(s, toks, n, &o), TERN_OK);
    } else {
        for (size_t i = 0; i < n; i++) {
            struct tern_eval_opts o = {.logits_all = r->logits + i * nv};
            assert_int_equal(tern_session_eval(s, toks + i, 1, &o), TERN_OK);
        }
    }
    assert_int_equal(tern_session_n_past(s), n);
    const float *l = tern_session_logits(s);
    assert_non_null(l);
    memcpy(r->last, l, sizeof r->last);
    assert_memory_equal(l, r->logits + (n - 1) * nv, nv * sizeof(float));
    r->hash = tern_session_hash(s);
    tern_session_free(s);
}

/* A way of consuming a prompt: thread count and chunk size (0 = one eval call per
 * token). */
struct way {
    int threads;
    uint32_t chunk;
};

/* Every chunking on 1, 2 and 3 threads. */
static const struct way ways_full[] = {{1, 1}, {1, 7}, {1, 64}, {1, 0}, {2, 1}, {2, 7}, {2, 64},
                                       {2, 0}, {3, 1}, {3, 7}, {3, 64}, {3, 0}};
/* A lighter subset for the other configurations. */
static const struct way ways_lite[] = {{1, 7}, {1, 64}, {1, 0}, {3, 7}};

/* Primes the same prompt in every way and asserts bit equality of all logits and of the
 * state hash with the one-chunk run on one thread. */
static void check_exact_file(const char *label, const char *path, uint64_t seed, size_t n, enum tern_kv_type kv,
                             const struct way *ways, size_t n_ways) {
    struct tern_model *models[3] = {load(path, 1), NULL, NULL};
    const uint32_t nv = tern_model_info(models[0])->n_vocab;
    int32_t *toks = malloc(sizeof(int32_t) * n);
    random_tokens(toks, n, nv, seed);
    struct run ref;
    run_prompt(models[0], toks, n, (uint32_t)n, kv, &ref);
    /* Sanity: the model computes something that depends on the input. */
    bool varies = false;
    for (size_t i = 1; i < n && !varies; i++) varies = ref.logits[i * nv] != ref.logits[0];
    assert_true(varies);
    for (size_t wi = 0; wi < n_ways; wi++) {
        const int ti = ways[wi].threads - 1;
        if (!models[ti]) models[ti] = load(path, ways[wi].threads);
        const uint32_t chunk = ways[wi].chunk;
        struct run r;
        run_prompt(models[ti], toks, n, chunk, kv, &r);
        if (memcmp(r.logits, ref.logits, sizeof(float) * n * nv) != 0 || r.hash != ref.hash) {
            size_t bad = 0;
            while (bad < n * nv && r.logits[bad] == ref.logits[bad]) bad++;
            fail_msg("%s: %d threads, chunk %u differs from one chunk: first logit %zu (pos %zu), hash %016llx vs "
                     "%016llx",
                     label, ti + 1, chunk, bad, bad / nv, (unsigned long long)r.hash, (unsigned long long)ref.hash);
        }
        free(r.logits);
    }
    printf("%s: %zu ways bit-identical over %zu tokens (hash %016llx)\n", label, n_ways, n,
           (unsigned long long)ref.hash);
    free(ref.logits);
    free(toks);
    for (int i = 0; i < 3; i++) tern_model_free(models[i]);
}

static void check_exact(const char *label, const struct tgen *g, size_t n, enum tern_kv_type kv,
                        const struct way *ways, size_t n_ways) {
    const char *path = tgen_path(label);
    assert_int_equal(tgen_write(g, path), 0);
    check_exact_file(label, path, g->seed, n, kv, ways, n_ways);
}

#define FULL ways_full, TERN_ARRAY_LEN(ways_full)
#define LITE ways_lite, TERN_ARRAY_LEN(ways_lite)

static void test_exact_llama_f32(void **state) {
    (void)state;
    struct tgen g;
    tgen_defaults(&g, "llama", TERN_DTYPE_F32);
    g.tied = true;
    check_exact("llama-f32", &g, lite ? 40 : 70, TERN_KV_F16, FULL);
    if (lite) return;
    check_exact("llama-f32-kvf32", &g, 70, TERN_KV_F32, LITE);
}

static void test_exact_llama_f16(void **state) {
    (void)state;
    if (lite) return; /* F16 weights: covered on the portable path below */
    struct tgen g;
    tgen_defaults(&g, "llama", TERN_DTYPE_F16);
    g.rope_scaling = "linear";
    g.rope_factor = 2.0f;
    check_exact("llama-f16", &g, 70, TERN_KV_F16, LITE);
}

static void test_exact_qwen2_q8_0(void **state) {
    (void)state;
    struct tgen g;
    tgen_defaults(&g, "qwen2", TERN_DTYPE_Q8_0);
    g.rope_scaling = "yarn";
    g.rope_factor = 4.0f;
    if (lite) check_exact("qwen2-q8_0", &g, 40, TERN_KV_F16, LITE);
    else check_exact("qwen2-q8_0", &g, 70, TERN_KV_F16, FULL);
}

static void test_exact_qwen3_quants(void **state) {
    (void)state;
    static const struct {
        enum tern_dtype w, out;
        const char *label;
    } cfg[] = {
        {TERN_DTYPE_Q4_0, TERN_DTYPE_Q6_K, "qwen3-q4_0"},   {TERN_DTYPE_Q4_K, TERN_DTYPE_Q6_K, "qwen3-q4_k"},
        {TERN_DTYPE_Q6_K, TERN_DTYPE_Q6_K, "qwen3-q6_k"},   {TERN_DTYPE_Q8_0, TERN_DTYPE_Q8_0, "qwen3-q8_0"},
        {TERN_DTYPE_Q4_1, TERN_DTYPE_Q8_0, "qwen3-q4_1"},   {TERN_DTYPE_Q5_0, TERN_DTYPE_Q8_0, "qwen3-q5_0"},
        {TERN_DTYPE_Q5_1, TERN_DTYPE_Q8_0, "qwen3-q5_1"},   {TERN_DTYPE_Q5_K, TERN_DTYPE_Q6_K, "qwen3-q5_k"},
        {TERN_DTYPE_BF16, TERN_DTYPE_F16, "qwen3-bf16"},     {TERN_DTYPE_IQ4_XS, TERN_DTYPE_Q6_K, "qwen3-iq4_xs"},
        {TERN_DTYPE_IQ4_NL, TERN_DTYPE_Q8_0, "qwen3-iq4_nl"},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(cfg); i++) {
        if (lite && i != 1) continue; /* Q4_K with a Q6_K output only */
        if (!tern_matmul_supported(cfg[i].w) || !tern_quantize_supported(cfg[i].w)) {
            printf("%s: the kernels do not support %s yet; not checked\n", cfg[i].label, tern_dtype_name(cfg[i].w));
            continue;
        }
        struct tgen g;
        tgen_defaults(&g, "qwen3", cfg[i].w);
        g.out_type = cfg[i].out;
        g.seed = 100 + i;
        if (i == 0) check_exact(cfg[i].label, &g, 70, TERN_KV_F16, FULL);
        else check_exact(cfg[i].label, &g, lite ? 40 : 70, TERN_KV_F16, LITE);
    }
}

/* The kit's IQ4_XS model (llama-quantize's blocks, a Q6_K output): chunks 1, 7, 64 and
 * 512 and token by token, on 1, 2 and 3 threads, over 600 tokens (past two KV pages and
 * one 512 chunk). Where the kit is absent there is nothing to check (with
 * TERN_REQUIRE_SHARED=1 that fails instead). */
static const struct way ways_chunks[] = {{1, 1}, {1, 7}, {1, 64}, {1, 512}, {1, 0}, {2, 1}, {2, 7}, {2, 64},
                                         {2, 512}, {2, 0}, {3, 1}, {3, 7}, {3, 64}, {3, 512}, {3, 0}};
static const struct way ways_chunks_lite[] = {{1, 7}, {1, 512}, {1, 0}, {3, 64}};

static void test_exact_shared_iq4_xs(void **state) {
    (void)state;
    if (!th_have_shared("models/tiny-qwen3-iq4_xs.gguf")) {
        printf("the shared kit's tiny-qwen3-iq4_xs.gguf is absent; not checked\n");
        return;
    }
    const char *path = th_shared_path("models/tiny-qwen3-iq4_xs.gguf");
    if (lite) check_exact_file("tiny-qwen3-iq4_xs", path, 7, 80, TERN_KV_F16, ways_chunks_lite,
                               TERN_ARRAY_LEN(ways_chunks_lite));
    else check_exact_file("tiny-qwen3-iq4_xs", path, 7, 600, TERN_KV_F16, ways_chunks, TERN_ARRAY_LEN(ways_chunks));
}

/* The kit's low-bit files (llama-quantize's blocks): the mix holds all nine types
 * (Q2_K ... IQ1_M) and is read in every way over 300 tokens (past a KV page); the two
 * stock mixes in the lighter set. */
static void test_exact_shared_lowbit(void **state) {
    (void)state;
    static const char *const stems[] = {"tiny-qwen3-lowbit-mix", "tiny-qwen3-q2_k", "tiny-qwen3-iq2_xs"};
    for (size_t i = 0; i < TERN_ARRAY_LEN(stems); i++) {
        if (lite && i > 0) break;
        char rel[128];
        snprintf(rel, sizeof rel, "models/%s.gguf", stems[i]);
        if (!th_have_shared(rel)) {
            printf("the shared kit's %s is absent; not checked\n", rel);
            continue;
        }
        const char *path = th_shared_path(rel);
        if (lite) check_exact_file(stems[i], path, 11, 60, TERN_KV_F16, ways_chunks_lite, TERN_ARRAY_LEN(ways_chunks_lite));
        else if (i == 0) check_exact_file(stems[i], path, 11, 300, TERN_KV_F16, ways_chunks, TERN_ARRAY_LEN(ways_chunks));
        else check_exact_file(stems[i], path, 11 + i, 100, TERN_KV_F16, ways_chunks_lite, TERN_ARRAY_LEN(ways_chunks_lite));
    }
}

/* Crosses KV page boundaries (256 positions) in every way. */
static void test_exact_long(void **state) {
    (void)state;
    struct tgen g;
    tgen_defaults(&g, "qwen3", TERN_DTYPE_Q8_0);
    g.n_embd = 64;
    g.n_ff = 128;
    g.head_dim = 16;
    g.n_vocab = 128;
    check_exact("long-q8_0", &g, 300, TERN_KV_F16, LITE);
    if (lite) return;
    g.wtype = TERN_DTYPE_F32;
    check_exact("long-f32", &g, 300, TERN_KV_F32, LITE);
}

/* The portable kernels honour the same contract. */
static void test_exact_portable(void **state) {
    (void)state;
    if (!tern_kernels_set_isa(TERN_ISA_PORTABLE)) fail_msg("cannot select the portable kernels");
    struct tgen g;
    tgen_defaults(&g, "qwen3", TERN_DTYPE_Q4_K);
    g.out_type = TERN_DTYPE_Q6_K;
    check_exact("portable-qwen3-q4_k", &g, lite ? 20 : 40, TERN_KV_F16, LITE);
    tgen_defaults(&g, "llama", TERN_DTYPE_F16);
    check_exact("portable-llama-f16", &g, lite ? 20 : 40, TERN_KV_F16, LITE);
    tern_kernels_init();
    /* back to the best ISA */
    tern_kernels_set_isa(TERN_ISA_AVX2);
}

/* ---- session state API ------------------------------------------------------------ */

static const char *small_model(void) {
    static char path[512];
    if (!path[0]) {
        struct tgen g;
        tgen_defaults(&g, "qwen3", TERN_DTYPE_Q8_0);
        g.n_embd = 128;
        g.n_ff = 256;
        g.head_dim = 32;
        g.n_vocab = 256;
        snprintf(path, sizeof path, "%s", tgen_path("small-qwen3"));
        assert_int_equal(tgen_write(&g, path), 0);
    }
    return path;
}

static uint64_t cold_hash(struct tern_model *m, const int32_t *toks, size_t n, float *last_logits) {
    struct tern_session *s = new_session(m, TERN_KV_F16, 512);
    assert_int_equal(tern_session_eval(s, toks, n, NULL), TERN_OK);
    const uint64_t h = tern_session_hash(s);
    if (last_logits) memcpy(last_logits, tern_session_logits(s), sizeof(float) * tern_model_info(m)->n_vocab);
    tern_session_free(s);
    return h;
}

struct ckpt_sink {
    struct tern_checkpoint *c[8];
    int n;
};

static void on_ckpt(void *user, struct tern_checkpoint *c) {
    struct ckpt_sink *k = user;
    assert_true(k->n < 8);
    k->c[k->n++] = c;
}

static void test_checkpoint_restore(void **state) {
    (void)state;
    struct tern_model *m = load(small_model(), 2);
    const uint32_t nv = tern_model_info(m)->n_vocab;
    int32_t toks[120];
    random_tokens(toks, 120, nv, 7);
    float *l_cold = malloc(sizeof(float) * nv), *l = malloc(sizeof(float) * nv);

    struct tern_session *s = new_session(m, TERN_KV_F16, 16);
    struct ckpt_sink sink = {0};
    const uint32_t pos[] = {37, 80};
    struct tern_eval_opts o = {.ckpt_pos = pos, .n_ckpt = 2, .on_ckpt = on_ckpt, .user = &sink};
    assert_int_equal(tern_session_eval(s, toks, 80, &o), TERN_OK);
    assert_int_equal(sink.n, 2);
    assert_int_equal(tern_checkpoint_pos(sink.c[0]), 37);
    assert_int_equal(tern_checkpoint_pos(sink.c[1]), 80);
    assert_true(tern_checkpoint_bytes(sink.c[0]) > 0);
    /* Continue, restore to 37, continue again over the same tokens: same state. */
    assert_int_equal(tern_session_eval(s, toks + 80, 40, NULL), TERN_OK);
    const uint64_t h120 = tern_session_hash(s);
    memcpy(l, tern_session_logits(s), sizeof(float) * nv);
    assert_int_equal(tern_session_restore(s, sink.c[0]), TERN_OK);
    assert_int_equal(tern_session_n_past(s), 37);
    assert_null(tern_session_logits(s));
    assert_int_equal(tern_session_hash(s), cold_hash(m, toks, 37, NULL));
    assert_int_equal(tern_session_eval(s, toks + 37, 83, NULL), TERN_OK);
    assert_int_equal(tern_session_hash(s), h120);
    assert_memory_equal(tern_session_logits(s), l, sizeof(float) * nv);
    /* A cold run over the same tokens agrees. */
    assert_int_equal(cold_hash(m, toks, 120, l_cold), h120);
    assert_memory_equal(l_cold, l, sizeof(float) * nv);
    /* A checkpoint whose tokens differ from the session's is refused, session unchanged. */
    struct tern_session *s2 = new_session(m, TERN_KV_F16, 16);
    int32_t other[40];
    memcpy(other, toks, sizeof other);
    other[5] = (other[5] + 1) % (int32_t)nv;
    assert_int_equal(tern_session_eval(s2, other, 40, NULL), TERN_OK);
    const uint64_t h2 = tern_session_hash(s2);
    assert_int_equal(tern_session_restore(s2, sink.c[0]), TERN_ERR_STATE);
    assert_int_equal(tern_session_hash(s2), h2);
    /* ... and one beyond the session's end. */
    assert_int_equal(tern_session_restore(s2, sink.c[1]), TERN_ERR_STATE);
    assert_int_equal(tern_session_n_past(s2), 40);
    tern_session_free(s2);
    for (int i = 0; i < sink.n; i++) tern_checkpoint_free(sink.c[i]);
    tern_session_free(s);
    free(l);
    free(l_cold);
    tern_model_free(m);
}

static void test_rewind_and_fork(void **state) {
    (void)state;
    struct tern_model *m = load(small_model(), 3);
    const uint32_t nv = tern_model_info(m)->n_vocab;
    int32_t toks[300];
    random_tokens(toks, 300, nv, 9);
    struct tern_session *s = new_session(m, TERN_KV_F16, 64);
    assert_int_equal(tern_session_eval(s, toks, 300, NULL), TERN_OK);
    const size_t bytes300 = tern_session_bytes(s);
    const uint64_t h300 = tern_session_hash(s);

    /* fork at a position inside the first page and at the end */
    struct tern_session *f;
    assert_int_equal(tern_session_fork(s, 100, NULL, &f), TERN_OK);
    assert_int_equal(tern_session_n_past(f), 100);
    assert_memory_equal(tern_session_tokens(f), toks, 100 * sizeof(int32_t));
    assert_int_equal(tern_session_hash(f), cold_hash(m, toks, 100, NULL));
    assert_null(tern_session_logits(f));
    tern_session_free(f);
    assert_int_equal(tern_session_fork(s, 300, NULL, &f), TERN_OK);
    assert_int_equal(tern_session_hash(f), h300);
    assert_memory_equal(tern_session_logits(f), tern_session_logits(s), sizeof(float) * nv);
    tern_session_free(f);
    assert_int_equal(tern_session_fork(s, 301, NULL, &f), TERN_ERR_RANGE);

    /* rewind to 10, then a different continuation equals a cold run over it */
    assert_int_equal(tern_session_rewind(s, 301), TERN_ERR_RANGE);
    assert_int_equal(tern_session_rewind(s, 10), TERN_OK);
    assert_true(tern_session_bytes(s) < bytes300); /* pages above were given back */
    assert_int_equal(tern_session_hash(s), cold_hash(m, toks, 10, NULL));
    int32_t alt[50];
    memcpy(alt, toks, 10 * sizeof(int32_t));
    random_tokens(alt + 10, 40, nv, 99);
    assert_int_equal(tern_session_eval(s, alt + 10, 40, NULL), TERN_OK);
    assert_int_equal(tern_session_hash(s), cold_hash(m, alt, 50, NULL));
    /* rewinding to 0 leaves an empty session */
    assert_int_equal(tern_session_rewind(s, 0), TERN_OK);
    assert_int_equal(tern_session_n_past(s), 0);
    assert_int_equal(tern_session_eval(s, toks, 300, NULL), TERN_OK);
    assert_int_equal(tern_session_hash(s), h300);
    tern_session_free(s);
    tern_model_free(m);
}

static int cancel_after_first(void *user, size_t done, size_t total) {
    (void)total;
    size_t *calls = user;
    (*calls)++;
    return done >= 24;
}

static void test_cancel_and_refusals(void **state) {
    (void)state;
    struct tern_model *m = load(small_model(), 2);
    /* tern_model_use_device: names it cannot parse are refused, m unchanged; "cpu" is a no-op here */
    for (const char *const *d = (const char *const[]){"npu", "vulkan:", "vulkan:x", "vulkan:-1", "cpu:", "", NULL}; *d;
         d++)
        assert_int_equal(tern_model_use_device(m, *d, 0), TERN_ERR_INVALID);
    assert_int_equal(tern_model_use_device(m, NULL, 0), TERN_ERR_INVALID);
    assert_int_equal(tern_model_use_device(m, "cpu", 0), TERN_OK);
    assert_string_equal(tern_model_device(m), "cpu");
    const uint32_t nv = tern_model_info(m)->n_vocab;
    int32_t toks[100];
    random_tokens(toks, 100, nv, 11);
    float *cold = malloc(sizeof(float) * nv);
    const uint64_t h100 = cold_hash(m, toks, 100, cold);

    /* cancelled through the progress callback at a chunk boundary: consistent */
    struct tern_session *s = new_session(m, TERN_KV_F16, 12);
    size_t calls = 0;
    struct tern_eval_opts o = {.progress = cancel_after_first, .user = &calls};
    assert_int_equal(tern_session_eval(s, toks, 100, &o), TERN_ERR_CANCELLED);
    assert_int_equal(tern_session_n_past(s), 24);
    assert_int_equal(calls, 2);
    assert_int_equal(tern_session_hash(s), cold_hash(m, toks, 24, NULL));
    assert_int_equal(tern_session_eval(s, toks + 24, 76, NULL), TERN_OK);
    assert_int_equal(tern_session_hash(s), h100);
    assert_memory_equal(tern_session_logits(s), cold, sizeof(float) * nv);
    tern_session_free(s);

    /* cancelled through the flag before anything ran */
    s = new_session(m, TERN_KV_F16, 12);
    atomic_int flag = 1;
    struct tern_eval_opts oc = {.cancel = &flag};
    assert_int_equal(tern_session_eval(s, toks, 100, &oc), TERN_ERR_CANCELLED);
    assert_int_equal(tern_session_n_past(s), 0);
    atomic_store(&flag, 0);
    assert_int_equal(tern_session_eval(s, toks, 100, &oc), TERN_OK);
    assert_int_equal(tern_session_hash(s), h100);

    /* a prompt that does not fit: refused before computing, both numbers named */
    const uint64_t h = tern_session_hash(s);
    const size_t bytes = tern_session_bytes(s);
    int32_t *big = calloc(1000, sizeof(int32_t));
    assert_int_equal(tern_session_eval(s, big, 925, NULL), TERN_ERR_RANGE);
    assert_non_null(strstr(tern_last_error(), "1025"));
    assert_non_null(strstr(tern_last_error(), "1024"));
    assert_int_equal(tern_session_n_past(s), 100);
    assert_int_equal(tern_session_hash(s), h);
    assert_int_equal(tern_session_bytes(s), bytes);
    assert_memory_equal(tern_session_logits(s), cold, sizeof(float) * nv);
    /* exactly filling the context is fine */
    assert_int_equal(tern_session_eval(s, big, 924, NULL), TERN_OK);
    assert_int_equal(tern_session_n_past(s), 1024);
    assert_int_equal(tern_session_eval(s, big, 1, NULL), TERN_ERR_RANGE);
    free(big);
    assert_int_equal(tern_session_rewind(s, 100), TERN_OK);

    /* an out-of-vocabulary id: refused, unchanged */
    int32_t bad[3] = {1, (int32_t)nv, 2};
    assert_int_equal(tern_session_eval(s, bad, 3, NULL), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "256"));
    bad[1] = -1;
    assert_int_equal(tern_session_eval(s, bad, 3, NULL), TERN_ERR_FORMAT);
    assert_int_equal(tern_session_n_past(s), 100);
    assert_int_equal(tern_session_hash(s), h);
    /* checkpoint positions must lie in (n_past, n_past + n] */
    const uint32_t bad_pos[] = {100};
    struct tern_eval_opts ob = {.ckpt_pos = bad_pos, .n_ckpt = 1};
    assert_int_equal(tern_session_eval(s, toks, 3, &ob), TERN_ERR_INVALID);
    assert_int_equal(tern_session_hash(s), h);
    tern_session_free(s);
    free(cold);
    tern_model_free(m);
}

/* Callbacks run between chunks without the model's lock: they may fork the session
 * they are called for and evaluate other sessions of the same model. */
struct reenter {
    struct tern_session *s, *other, *fork;
    const int32_t *toks;
    int n_progress;
};

static int reenter_progress(void *user, size_t done, size_t total) {
    (void)total;
    struct reenter *r = user;
    r->n_progress++;
    assert_int_equal(tern_session_eval(r->other, r->toks + done % 50, 1, NULL), TERN_OK);
    return 0;
}

static void reenter_ckpt(void *user, struct tern_checkpoint *c) {
    struct reenter *r = user;
    assert_int_equal(tern_checkpoint_pos(c), tern_session_n_past(r->s));
    assert_int_equal(tern_session_fork(r->s, tern_checkpoint_pos(c), c, &r->fork), TERN_OK);
    tern_checkpoint_free(c);
}

static void test_callbacks_reenter(void **state) {
    (void)state;
    struct tern_model *m = load(small_model(), 2);
    int32_t toks[100];
    random_tokens(toks, 100, tern_model_info(m)->n_vocab, 13);
    struct reenter r = {new_session(m, TERN_KV_F16, 16), new_session(m, TERN_KV_F16, 4), NULL, toks, 0};
    const uint32_t pos[] = {40};
    struct tern_eval_opts o = {.progress = reenter_progress, .on_ckpt = reenter_ckpt, .user = &r, .ckpt_pos = pos,
                               .n_ckpt = 1};
    assert_int_equal(tern_session_eval(r.s, toks, 100, &o), TERN_OK);
    assert_int_equal(r.n_progress, 7); /* chunks 16,16,8 | 16,16,16,12 */
    assert_non_null(r.fork);
    assert_int_equal(tern_session_hash(r.fork), cold_hash(m, toks, 40, NULL));
    assert_int_equal(tern_session_hash(r.s), cold_hash(m, toks, 100, NULL));
    assert_int_equal(tern_session_n_past(r.other), 7);
    tern_session_free(r.fork);
    tern_session_free(r.other);
    tern_session_free(r.s);
    tern_model_free(m);
}

static void test_session_memory_grows(void **state) {
    (void)state;
    struct tern_model *m = load(small_model(), 1);
    const struct tern_model_info *in = tern_model_info(m);
    assert_false(in->hybrid);
    assert_int_equal(in->n_attn_layers, 2);
    assert_int_equal(in->kv_bytes_per_token_f16, 2 * 2 * 2 * 32 * 2); /* layers * (K+V) * kv heads * 32 * 2 */
    struct tern_session *s = new_session(m, TERN_KV_F16, 64);
    const size_t b0 = tern_session_bytes(s);
    int32_t toks[300];
    random_tokens(toks, 300, in->n_vocab, 5);
    assert_int_equal(tern_session_eval(s, toks, 10, NULL), TERN_OK);
    const size_t b10 = tern_session_bytes(s);
    assert_int_equal(tern_session_eval(s, toks + 10, 290, NULL), TERN_OK);
    const size_t b300 = tern_session_bytes(s);
    /* one page (256 positions) per layer for 10 tokens, two for 300; never n_ctx up front */
    assert_true(b10 > b0);
    assert_true(b10 - b0 >= 256 * in->kv_bytes_per_token_f16);
    assert_true(b300 - b10 >= 256 * in->kv_bytes_per_token_f16);
    assert_true(b300 < b0 + 1024 * in->kv_bytes_per_token_f16);
    struct tern_hash_component comps[16];
    const size_t nc = tern_session_hash_components(s, comps, 16);
    assert_int_equal(nc, 5); /* blk.0.k blk.0.v blk.1.k blk.1.v tokens */
    assert_string_equal(comps[0].name, "blk.0.k");
    assert_string_equal(comps[3].name, "blk.1.v");
    assert_string_equal(comps[4].name, "tokens");
    assert_int_equal(tern_session_hash_components(s, NULL, 0), 5);
    tern_session_free(s);
    tern_model_free(m);
}

/* Every allocation on the way fails in turn: each call reports TERN_ERR_NOMEM (or
 * succeeds), nothing crashes or leaks (ASan), and a session that refused an eval is
 * unchanged. */
static void test_alloc_failures(void **state) {
    (void)state;
    const char *path = small_model();
    int32_t toks[300];
    random_tokens(toks, 300, 256, 3);
    uint64_t want = 0;
    {
        struct tern_model *m = load(path, 2);
        want = cold_hash(m, toks, 300, NULL);
        tern_model_free(m);
    }
    int completed = 0;
    long n = 0;
    for (; n < 400 && !completed; n++) {
        struct tern_model_params mp;
        tern_model_params_default(&mp);
        mp.path = path;
        mp.n_threads = 2;
        struct tern_model *m = NULL;
        struct tern_session *s = NULL, *f = NULL;
        struct tern_checkpoint *c = NULL;
        tern_alloc_fail_after(n);
        enum tern_status st = tern_model_load(&mp, &m);
        if (!st) {
            struct tern_session_params sp;
            tern_session_params_default(&sp);
            sp.n_ctx = 512;
            sp.n_chunk = 64;
            st = tern_session_new(m, &sp, &s);
        }
        if (!st) {
            st = tern_session_eval(s, toks, 100, NULL);
            if (st) assert_int_equal(tern_session_n_past(s), 0);
        }
        if (!st) {
            /* crosses into a second KV page */
            st = tern_session_eval(s, toks + 100, 200, NULL);
            if (st) assert_int_equal(tern_session_n_past(s), 100);
        }
        if (!st) st = tern_session_checkpoint(s, &c);
        if (!st) st = tern_session_fork(s, 300, c, &f);
        tern_alloc_fail_after(-1);
        if (st) {
            assert_int_equal(st, TERN_ERR_NOMEM);
        } else {
            assert_int_equal(tern_session_hash(f), want);
            completed = 1;
        }
        tern_session_free(f);
        tern_checkpoint_free(c);
        tern_session_free(s);
        tern_model_free(m);
    }
    assert_true(completed);
    printf("alloc failures: every one of the first %ld allocations failed in turn, cleanly\n", n - 1);
}

/* ---- validation -------------------------------------------------------------------- */

static void expect_load_error(const struct tgen *g, const char *label, enum tern_status want, const char *needle1,
                              const char *needle2) {
    const char *path = tgen_path(label);
    assert_int_equal(tgen_write(g, path), 0);
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = path;
    mp.n_threads = 1;
    struct tern_model *m = (struct tern_model *)1;
    assert_int_equal(tern_model_load(&mp, &m), want);
    assert_null(m);
    if (!strstr(tern_last_error(), needle1) || (needle2 && !strstr(tern_last_error(), needle2)))
        fail_msg("%s: message '%s' lacks '%s' / '%s'", label, tern_last_error(), needle1, needle2 ? needle2 : "");
}

static void test_validation(void **state) {
    (void)state;
    struct tgen g;
    tgen_defaults(&g, "qwen3", TERN_DTYPE_Q8_0);
    g.skip_tensor = "blk.1.attn_k_norm.weight";
    expect_load_error(&g, "missing", TERN_ERR_FORMAT, "blk.1.attn_k_norm.weight", "missing");
    g.skip_tensor = NULL;
    g.bad_tensor = "blk.0.ffn_up.weight";
    expect_load_error(&g, "badshape", TERN_ERR_FORMAT, "blk.0.ffn_up.weight", "[256, 256]");
    g.bad_tensor = NULL;
    tgen_defaults(&g, "qwen2", TERN_DTYPE_F32);
    g.skip_tensor = "blk.0.attn_v.bias";
    expect_load_error(&g, "nobias", TERN_ERR_FORMAT, "blk.0.attn_v.bias", NULL);
    tgen_defaults(&g, "mamba9", TERN_DTYPE_F32);
    expect_load_error(&g, "arch", TERN_ERR_UNSUPPORTED, "mamba9", "qwen3");
    /* a llama without output.weight uses the embeddings (tied) */
    tgen_defaults(&g, "llama", TERN_DTYPE_Q8_0);
    g.tied = true;
    assert_int_equal(tgen_write(&g, tgen_path("tied")), 0);
    struct tern_model *m = load(tgen_path("tied"), 1);
    assert_string_equal(tern_model_info(m)->arch, "llama");
    assert_int_equal(tern_model_info(m)->n_vocab, 256);
    assert_int_equal(tern_model_info(m)->n_threads, 1);
    tern_model_free(m);
    /* a missing file */
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = "/nonexistent/x.gguf";
    assert_int_not_equal(tern_model_load(&mp, &m), TERN_OK);
    assert_null(m);
}

int main(int argc, char **argv) {
    tern_log_set_level(TERN_LOG_WARN);
    const struct CMUnitTest all[] = {
        cmocka_unit_test(test_exact_llama_f32),     cmocka_unit_test(test_exact_llama_f16),
        cmocka_unit_test(test_exact_qwen2_q8_0),    cmocka_unit_test(test_exact_qwen3_quants),
        cmocka_unit_test(test_exact_long),          cmocka_unit_test(test_exact_portable),
        cmocka_unit_test(test_exact_shared_iq4_xs),
        cmocka_unit_test(test_exact_shared_lowbit),
        cmocka_unit_test(test_checkpoint_restore),  cmocka_unit_test(test_rewind_and_fork),
        cmocka_unit_test(test_cancel_and_refusals), cmocka_unit_test(test_session_memory_grows),
        cmocka_unit_test(test_callbacks_reenter),   cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_validation),
    };
    lite = argc > 1 && !strcmp(argv[1], "lite");
    return cmocka_run_group_tests(all, NULL, NULL);
}
