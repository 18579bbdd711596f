/* Continuous batching at the model level (tern_eval_batch, DESIGN.md §5 and §8): a
 * sequence's logits at every generated position, its tokens and its final state hash are
 * bit-identical whether it ran alone or in steps shared with up to 7 others of other
 * lengths, joining mid-way through their decodes, with prefill chunks and decode rows
 * mixed in one step under a token budget — for every architecture of the kit (llama,
 * qwen3, qwen35 hybrid, both MoE, gpt-oss), F16 and F32 KV, 1 and 2 threads. Also: a session
 * forked from a batched one resumes equal to cold, and a refused batch leaves every
 * session unchanged. */
#include "harness.h"
#include "exact.h"

#include "util/hash.h"
#include "tern.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_SEQ 8
#define MAX_GEN 12
/* A batch item that wants its last logits. */
#define ITEM(S, T, N) ((struct tern_batch_item){.s = (S), .toks = (T), .n = (N), .logits = true})

/* --light (the variant that also runs under ASan): fewer models and configurations. */
static bool g_light;

struct seq_spec {
    size_t off, len;  /* prompt: ids [off, off + len) of the kit's prompt */
    uint32_t n_gen;   /* greedy tokens after it */
    uint32_t join;    /* the step at which it arrives (batched run) */
};

struct seq_out {
    int32_t toks[MAX_GEN];
    uint64_t lhash[MAX_GEN]; /* hash of the logits each generated token was chosen from */
    uint64_t state;
    uint32_t n_past;
};

static const struct seq_spec g_specs[N_SEQ] = {
    {0, 37, 10, 0}, {5, 3, 12, 0}, {11, 61, 6, 1}, {2, 1, 9, 2},
    {40, 19, 12, 2}, {7, 90, 4, 3}, {23, 8, 11, 5}, {60, 45, 7, 6},
};

static struct tern_model *load(const char *rel, int n_threads) {
    th_require_shared(rel);
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = th_shared_path(rel);
    mp.n_threads = n_threads;
    struct tern_model *m = NULL;
    if (tern_model_load(&mp, &m)) fail_msg("%s: %s", rel, tern_last_error());
    return m;
}

static struct tern_session *new_session(struct tern_model *m, enum tern_kv_type kv) {
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.n_ctx = 512;
    sp.kv_type = kv;
    struct tern_session *s = NULL;
    assert_int_equal(tern_session_new(m, &sp, &s), TERN_OK);
    return s;
}

static int32_t argmax(const float *l, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return (int32_t)best;
}

static void fill_prompt(const int32_t *base, const struct seq_spec *sp, uint32_t n_vocab, int32_t *out) {
    for (size_t i = 0; i < sp->len; i++) out[i] = base[sp->off + i] % (int32_t)n_vocab;
}

/* Alone: the prompt in one eval (the session's chunking), then a token at a time. */
static void run_solo(struct tern_model *m, enum tern_kv_type kv, const int32_t *base, const struct seq_spec *sp,
                     struct seq_out *out) {
    const uint32_t nv = tern_model_info(m)->n_vocab;
    int32_t prompt[256];
    fill_prompt(base, sp, nv, prompt);
    struct tern_session *s = new_session(m, kv);
    assert_int_equal(tern_session_eval(s, prompt, sp->len, NULL), TERN_OK);
    for (uint32_t g = 0; g < sp->n_gen; g++) {
        const float *l = tern_session_logits(s);
        assert_non_null(l);
        out->lhash[g] = tern_hash64(l, nv * sizeof *l);
        out->toks[g] = argmax(l, nv);
        if (g + 1 < sp->n_gen) assert_int_equal(tern_session_eval(s, &out->toks[g], 1, NULL), TERN_OK);
    }
    out->state = tern_session_hash(s);
    out->n_past = tern_session_n_past(s);
    tern_session_free(s);
}

/* Batched: each step holds one decode row of every sequence that has logits, then
 * prefill chunks of the others in arrival order within the budget. */
static void run_batched(struct tern_model *m, enum tern_kv_type kv, const int32_t *base, uint32_t budget,
                        struct seq_out *outs) {
    const uint32_t nv = tern_model_info(m)->n_vocab;
    struct tern_session *ss[N_SEQ];
    int32_t prompts[N_SEQ][256];
    size_t fed[N_SEQ] = {0};
    uint32_t gen[N_SEQ] = {0};
    bool done[N_SEQ] = {0};
    for (int i = 0; i < N_SEQ; i++) {
        ss[i] = new_session(m, kv);
        fill_prompt(base, &g_specs[i], nv, prompts[i]);
    }
    for (uint32_t step = 0; step < 1000; step++) {
        struct tern_batch_item items[N_SEQ];
        size_t n_items = 0;
        uint32_t used = 0;
        bool any = false;
        for (int i = 0; i < N_SEQ; i++) {
            if (done[i] || g_specs[i].join > step) continue;
            any = true;
            if (fed[i] < g_specs[i].len) continue;
            const float *l = tern_session_logits(ss[i]);
            assert_non_null(l);
            outs[i].lhash[gen[i]] = tern_hash64(l, nv * sizeof *l);
            outs[i].toks[gen[i]] = argmax(l, nv);
            if (++gen[i] == g_specs[i].n_gen) {
                done[i] = true;
                continue;
            }
            items[n_items++] = ITEM(ss[i], &outs[i].toks[gen[i] - 1], 1);
            used++;
        }
        for (int i = 0; i < N_SEQ; i++) {
            if (done[i] || g_specs[i].join > step || fed[i] >= g_specs[i].len || used >= budget) continue;
            uint32_t n = (uint32_t)(g_specs[i].len - fed[i]);
            if (n > budget - used) n = budget - used;
            const bool last = fed[i] + n == g_specs[i].len;
            items[n_items++] = (struct tern_batch_item){.s = ss[i], .toks = prompts[i] + fed[i], .n = n, .logits = last};
            fed[i] += n;
            used += n;
        }
        if (!any && step > N_SEQ) break;
        if (n_items) assert_int_equal(tern_eval_batch(items, n_items), TERN_OK);
    }
    for (int i = 0; i < N_SEQ; i++) {
        assert_true(done[i]);
        outs[i].state = tern_session_hash(ss[i]);
        outs[i].n_past = tern_session_n_past(ss[i]);
        tern_session_free(ss[i]);
    }
}

static void compare(const char *label, const struct seq_out *a, const struct seq_out *b) {
    for (int i = 0; i < N_SEQ; i++) {
        for (uint32_t g = 0; g < g_specs[i].n_gen; g++) {
            if (a[i].lhash[g] != b[i].lhash[g] || a[i].toks[g] != b[i].toks[g])
                fail_msg("%s: sequence %d, generated token %u: batched logits/token differ from alone (%d vs %d)",
                         label, i, g, b[i].toks[g], a[i].toks[g]);
        }
        if (a[i].state != b[i].state || a[i].n_past != b[i].n_past)
            fail_msg("%s: sequence %d: final state differs (n_past %u vs %u)", label, i, b[i].n_past, a[i].n_past);
    }
}

static void check_model(const char *rel) {
    const size_t base_n = 160;
    int32_t *base = tx_prompt(base_n);
    const int threads[] = {1, 2};
    const enum tern_kv_type kvs[] = {TERN_KV_F16, TERN_KV_F32};
    for (size_t ti = 0; ti < (g_light ? 1u : 2u); ti++) {
        struct tern_model *m = load(rel, threads[g_light ? 1 : ti]);
        for (size_t ki = 0; ki < 2; ki++) {
            struct seq_out solo[N_SEQ], bat[N_SEQ];
            memset(solo, 0, sizeof solo);
            for (int i = 0; i < N_SEQ; i++) run_solo(m, kvs[ki], base, &g_specs[i], &solo[i]);
            const uint32_t budgets[] = {16, 5, 512};
            for (size_t bi = 0; bi < (g_light ? 2u : 3u); bi++) {
                memset(bat, 0, sizeof bat);
                run_batched(m, kvs[ki], base, budgets[bi], bat);
                char label[160];
                snprintf(label, sizeof label, "%s, %d threads, %s KV, budget %u", rel, threads[g_light ? 1 : ti],
                         kvs[ki] == TERN_KV_F16 ? "F16" : "F32", budgets[bi]);
                compare(label, solo, bat);
            }
        }
        tern_model_free(m);
    }
    free(base);
}

static void test_llama(void **u) {
    (void)u;
    check_model("models/stories260K.gguf");
}
static void test_qwen3(void **u) {
    (void)u;
    check_model("models/tiny-qwen3-q8_0.gguf");
}
static void test_qwen3_q4km(void **u) {
    (void)u;
    check_model("models/tiny-qwen3-q4_k_m.gguf");
}
/* All nine low-bit types in one file (the kit's mix). */
static void test_qwen3_lowbit(void **u) {
    (void)u;
    check_model("models/tiny-qwen3-lowbit-mix.gguf");
}
static void test_qwen35(void **u) {
    (void)u;
    check_model("models/tiny-qwen35-q8_0.gguf");
}
static void test_qwen3moe(void **u) {
    (void)u;
    check_model("models/tiny-qwen3moe-q8_0.gguf");
}
/* gpt-oss: sinks, a window of 16 on even layers (prompts of up to 90 reach past it) */
static void test_gptoss(void **u) {
    (void)u;
    check_model("models/tiny-gptoss-mxfp4.gguf");
}
static void test_qwen35moe(void **u) {
    (void)u;
    check_model("models/tiny-qwen35moe-q4_k_m.gguf");
}
static void test_qwen3next(void **u) {
    (void)u;
    check_model("models/tiny-qwen3next-q8_0.gguf");
}

/* A hybrid session forked (from a checkpoint) off one that was batched, continued in a
 * batch beside another, equals the same tokens read cold and alone. */
static void test_fork_resumes_in_batch(void **u) {
    (void)u;
    const char *rel = "models/tiny-qwen35-q8_0.gguf";
    struct tern_model *m = load(rel, 2);
    const uint32_t nv = tern_model_info(m)->n_vocab;
    int32_t *base = tx_prompt(120);
    for (int i = 0; i < 120; i++) base[i] %= (int32_t)nv;
    struct tern_session *a = new_session(m, TERN_KV_F16), *b = new_session(m, TERN_KV_F16);
    struct tern_batch_item it[2] = {ITEM(a, base, 50),
                                   ITEM(b, base + 60, 30)};
    assert_int_equal(tern_eval_batch(it, 2), TERN_OK);
    struct tern_checkpoint *ck = NULL;
    assert_int_equal(tern_session_checkpoint(a, &ck), TERN_OK);
    struct tern_session *f = NULL;
    assert_int_equal(tern_session_fork(a, 50, ck, &f), TERN_OK);
    /* the fork reads 20 more tokens beside b's decode step */
    struct tern_batch_item it2[2] = {ITEM(b, base + 90, 1),
                                    ITEM(f, base + 50, 20)};
    assert_int_equal(tern_eval_batch(it2, 2), TERN_OK);
    struct tern_session *cold = new_session(m, TERN_KV_F16);
    assert_int_equal(tern_session_eval(cold, base, 70, NULL), TERN_OK);
    assert_int_equal(tern_session_hash(f), tern_session_hash(cold));
    assert_memory_equal(tern_session_logits(f), tern_session_logits(cold), nv * sizeof(float));
    tern_checkpoint_free(ck);
    tern_session_free(a);
    tern_session_free(b);
    tern_session_free(f);
    tern_session_free(cold);
    free(base);
    tern_model_free(m);
}

/* Speculative verification as rows of a step: an item with every position's logits and
 * the recurrent state trail, beside another session's decode row, gives the logits a
 * solo eval gives, and rewinds into its trail to the state of a cold read. */
static void test_verify_rows(void **u) {
    (void)u;
    struct tern_model *m = load("models/tiny-qwen35-q8_0.gguf", 2);
    const struct tern_model_info *info = tern_model_info(m);
    const uint32_t nv = info->n_vocab;
    int32_t *base = tx_prompt(100);
    for (int i = 0; i < 100; i++) base[i] %= (int32_t)nv;
    struct tern_session *a = new_session(m, TERN_KV_F16), *b = new_session(m, TERN_KV_F16);
    struct tern_session *solo = new_session(m, TERN_KV_F16);
    assert_int_equal(tern_session_eval(a, base, 40, NULL), TERN_OK);
    assert_int_equal(tern_session_eval(solo, base, 40, NULL), TERN_OK);
    assert_int_equal(tern_session_eval(b, base + 50, 30, NULL), TERN_OK);
    float *la = malloc((size_t)5 * nv * sizeof *la), *ls = malloc((size_t)5 * nv * sizeof *ls);
    uint8_t *ta = malloc(5 * info->recurrent_bytes), *ts = malloc(5 * info->recurrent_bytes);
    assert_true(la && ls && ta && ts);
    struct tern_batch_item it[2] = {{.s = b, .toks = base + 80, .n = 1, .logits = true},
                                    {.s = a, .toks = base + 40, .n = 5, .logits = true, .logits_all = la,
                                     .rec_trail = ta}};
    assert_int_equal(tern_eval_batch(it, 2), TERN_OK);
    struct tern_eval_opts o = {.logits_all = ls, .rec_trail = ts};
    assert_int_equal(tern_session_eval(solo, base + 40, 5, &o), TERN_OK);
    assert_memory_equal(la, ls, (size_t)5 * nv * sizeof *la);
    assert_memory_equal(tern_session_logits(a), ls + (size_t)4 * nv, nv * sizeof(float));
    assert_int_equal(tern_session_hash(a), tern_session_hash(solo));
    assert_int_equal(tern_session_rewind(a, 42), TERN_OK);
    struct tern_session *cold = new_session(m, TERN_KV_F16);
    assert_int_equal(tern_session_eval(cold, base, 42, NULL), TERN_OK);
    assert_int_equal(tern_session_hash(a), tern_session_hash(cold));
    free(la);
    free(ls);
    free(ta);
    free(ts);
    tern_session_free(a);
    tern_session_free(b);
    tern_session_free(solo);
    tern_session_free(cold);
    free(base);
    tern_model_free(m);
}

/* A refused batch computes nothing: every session keeps its position and state. */
static void test_refusals(void **u) {
    (void)u;
    struct tern_model *m = load("models/tiny-qwen3-q8_0.gguf", 1);
    const uint32_t nv = tern_model_info(m)->n_vocab;
    struct tern_session *a = new_session(m, TERN_KV_F16), *b = new_session(m, TERN_KV_F16);
    int32_t t[4] = {1, 2, 3, 4};
    assert_int_equal(tern_session_eval(a, t, 2, NULL), TERN_OK);
    const uint64_t ha = tern_session_hash(a), hb = tern_session_hash(b);
    int32_t bad[2] = {5, (int32_t)nv};
    struct tern_batch_item same[2] = {ITEM(a, t, 1), ITEM(a, t + 1, 1)};
    assert_int_equal(tern_eval_batch(same, 2), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "one session"));
    struct tern_batch_item oov[2] = {ITEM(a, t, 1), ITEM(b, bad, 2)};
    assert_int_equal(tern_eval_batch(oov, 2), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "item 1"));
    struct tern_batch_item empty[2] = {ITEM(a, t, 1), ITEM(b, t, 0)};
    assert_int_equal(tern_eval_batch(empty, 2), TERN_ERR_INVALID);
    int32_t *many = calloc(600, sizeof *many);
    struct tern_batch_item range[2] = {ITEM(a, t, 1), ITEM(b, many, 600)};
    assert_int_equal(tern_eval_batch(range, 2), TERN_ERR_RANGE);
    assert_non_null(strstr(tern_last_error(), "512"));
    assert_int_equal(tern_session_n_past(a), 2);
    assert_int_equal(tern_session_n_past(b), 0);
    assert_int_equal(tern_session_hash(a), ha);
    assert_int_equal(tern_session_hash(b), hb);
    assert_int_equal(tern_session_reserve(b, 513), TERN_ERR_RANGE);
    free(many);
    tern_session_free(a);
    tern_session_free(b);
    tern_model_free(m);
}

int main(int argc, char **argv) {
    g_light = argc > 1 && !strcmp(argv[1], "--light");
    const struct CMUnitTest full[] = {
        cmocka_unit_test(test_llama),     cmocka_unit_test(test_qwen3),    cmocka_unit_test(test_qwen3_q4km),
        cmocka_unit_test(test_qwen3_lowbit),
        cmocka_unit_test(test_qwen35),    cmocka_unit_test(test_qwen3moe), cmocka_unit_test(test_qwen3next),
        cmocka_unit_test(test_qwen35moe),
        cmocka_unit_test(test_gptoss),
        cmocka_unit_test(test_fork_resumes_in_batch), cmocka_unit_test(test_verify_rows),
        cmocka_unit_test(test_refusals),
    };
    const struct CMUnitTest light[] = {
        cmocka_unit_test(test_qwen3),     cmocka_unit_test(test_qwen35),   cmocka_unit_test(test_qwen35moe),
        cmocka_unit_test(test_fork_resumes_in_batch), cmocka_unit_test(test_verify_rows),
        cmocka_unit_test(test_refusals),
    };
    return g_light ? cmocka_run_group_tests(light, NULL, NULL) : cmocka_run_group_tests(full, NULL, NULL);
}
