/* qwen35 (hybrid Gated DeltaNet + gated attention) on the shared tiny models and on
 * generated ones (parity with llama.cpp's logits is in test-model-parity):
 * - exactness (DESIGN.md §5): bit-identical logits and state hashes for every chunking
 *   and thread count;
 * - state: checkpoint / restore / fork equal a cold run; rewinding without a
 *   checkpoint is refused;
 * - load errors name the tensor or key and the numbers. */
#include "harness.h"
#include "exact.h"

#include "gguf/gguf.h"
#include "model/mkmodel.h"
#include "util/mem.h"
#include "tern.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL_F32 "models/tiny-qwen35-f32.gguf"
#define MODEL_Q8_0 "models/tiny-qwen35-q8_0.gguf"

/* --light (the variant that also runs under ASan): fewer prompts and shorter runs of
 * the same checks. */
static bool g_light;

static struct tern_model *load_model(const char *rel, int n_threads) {
    th_require_shared(rel);
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = th_shared_path(rel);
    mp.n_threads = n_threads;
    struct tern_model *m = NULL;
    enum tern_status st = tern_model_load(&mp, &m);
    if (st) print_error("load %s: %s\n", rel, tern_last_error());
    assert_int_equal(st, TERN_OK);
    return m;
}

static struct tern_session *new_session(struct tern_model *m, uint32_t n_ctx, enum tern_kv_type kv) {
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.n_ctx = n_ctx;
    sp.kv_type = kv;
    struct tern_session *s = NULL;
    assert_int_equal(tern_session_new(m, &sp, &s), TERN_OK);
    return s;
}


/* ---- exactness ---------------------------------------------------------------------- */

static void test_exact_f32_kv(void **unused) {
    (void)unused;
    th_require_shared(MODEL_F32);
    tx_check_exact("tiny-qwen35-f32", th_shared_path(MODEL_F32), TERN_KV_F32, g_light ? 24 : 100);
}
static void test_exact_f16_kv(void **unused) {
    (void)unused;
    th_require_shared(MODEL_Q8_0);
    tx_check_exact("tiny-qwen35-q8_0", th_shared_path(MODEL_Q8_0), TERN_KV_F16, g_light ? 24 : 64);
}

/* Generated models (tern mkmodel's generator): shapes the shared files do not have. */
static void test_exact_generated(void **unused) {
    (void)unused;
    char path[512];
    /* Odd: 3 v-heads on 1 k-head, head dim 36 (vector tails on both code paths),
     * attention every 3rd layer, tied embeddings, a 3-tap convolution, and RoPE
     * sections [2,1,1,4] whose fourth section leaves pairs 4-7 unrotated. */
    struct tern_mkmodel_params p;
    tern_mkmodel_defaults(TERN_MK_QWEN35, &p);
    p.n_layer = 5;
    p.n_embd = 128;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.head_dim = 64;
    p.n_ff = 256;
    p.n_vocab = 300;
    p.tied = true;
    p.ssm_k_heads = 1;
    p.ssm_v_heads = 3;
    p.ssm_state = 36;
    p.ssm_conv = 3;
    p.full_attn_interval = 3;
    p.rope_dim = 16;
    const int32_t sec[4] = {2, 1, 1, 4};
    memcpy(p.rope_sections, sec, sizeof sec);
    snprintf(path, sizeof path, "%s/odd.gguf", th_tmpdir());
    enum tern_status st = tern_mkmodel_write(&p, path, NULL);
    if (st) print_error("mkmodel: %s\n", tern_last_error());
    assert_int_equal(st, TERN_OK);
    tx_check_exact("generated odd qwen35", path, TERN_KV_F16, g_light ? 24 : 70);

    /* The tiny shape in llama-quantize's Q4_K_M mix (Q4_K / Q6_K weights, Q8_K
     * activations). */
    assert_int_equal(tern_mkmodel_preset("tiny-qwen35", &p), TERN_OK);
    assert_int_equal(tern_mkmodel_parse_type("q4_k_m", &p.wtype, &p.mix), true);
    p.n_layer = 4;
    snprintf(path, sizeof path, "%s/q4km.gguf", th_tmpdir());
    assert_int_equal(tern_mkmodel_write(&p, path, NULL), TERN_OK);
    tx_check_exact("generated tiny-qwen35 q4_k_m", path, TERN_KV_F16, g_light ? 16 : 48);
}

/* ---- state: checkpoints, restore, fork, rewind ------------------------------------------ */

struct ckpt_sink {
    struct tern_checkpoint *c[8];
    int n;
};
static void on_ckpt(void *user, struct tern_checkpoint *c) {
    struct ckpt_sink *k = user;
    if (k->n < 8) k->c[k->n++] = c;
    else tern_checkpoint_free(c);
}

static void test_checkpoint_restore(void **unused) {
    (void)unused;
    const size_t n = 140;
    int32_t *toks = tx_prompt(n);
    struct tern_model *m = load_model(MODEL_F32, 2);
    const size_t nv = tern_model_info(m)->n_vocab;

    /* cold: the hash and logits after all n tokens, and after the first 97 */
    struct tern_session *cold = new_session(m, 512, TERN_KV_F16);
    assert_int_equal(tern_session_eval(cold, toks, 97, NULL), TERN_OK);
    const uint64_t cold97 = tern_session_hash(cold);
    assert_int_equal(tern_session_eval(cold, toks + 97, n - 97, NULL), TERN_OK);
    const uint64_t cold_n = tern_session_hash(cold);
    float *cold_logits = malloc(nv * sizeof(float));
    assert_non_null(cold_logits);
    memcpy(cold_logits, tern_session_logits(cold), nv * sizeof(float));

    /* checkpoints captured during priming (the chunking splits at them) */
    struct tern_session *s = new_session(m, 512, TERN_KV_F16);
    struct ckpt_sink sink = {.n = 0};
    const uint32_t pos[] = {40, 97};
    struct tern_eval_opts o = {.n_chunk = 64, .ckpt_pos = pos, .n_ckpt = 2, .on_ckpt = on_ckpt, .user = &sink};
    assert_int_equal(tern_session_eval(s, toks, n, &o), TERN_OK);
    assert_int_equal(sink.n, 2);
    assert_int_equal(tern_checkpoint_pos(sink.c[0]), 40);
    assert_int_equal(tern_checkpoint_pos(sink.c[1]), 97);
    /* a checkpoint holds the recurrent state: conv windows + state matrices */
    const struct tern_model_info *info = tern_model_info(m);
    assert_int_equal(info->recurrent_bytes, 6 * (3 * 512 + 4 * 64 * 64) * sizeof(float));
    assert_true(tern_checkpoint_bytes(sink.c[0]) >= info->recurrent_bytes);
    assert_int_equal(tern_session_hash(s), cold_n);
    assert_memory_equal(tern_session_logits(s), cold_logits, nv * sizeof(float));

    /* continue past n, then restore each checkpoint and re-read: equal to cold */
    int32_t more[5] = {11, 22, 33, 44, 55};
    assert_int_equal(tern_session_eval(s, more, 5, NULL), TERN_OK);
    assert_true(tern_session_hash(s) != cold_n);
    for (int i = 1; i >= 0; i--) {
        assert_int_equal(tern_session_restore(s, sink.c[i]), TERN_OK);
        assert_int_equal(tern_session_n_past(s), pos[i]);
        assert_null(tern_session_logits(s));
        if (pos[i] == 97) assert_int_equal(tern_session_hash(s), cold97);
        assert_int_equal(tern_session_eval(s, toks + pos[i], n - pos[i], NULL), TERN_OK);
        assert_int_equal(tern_session_hash(s), cold_n);
        assert_memory_equal(tern_session_logits(s), cold_logits, nv * sizeof(float));
    }

    /* a fork at a checkpoint continues like the cold session */
    struct tern_session *f = NULL;
    assert_int_equal(tern_session_fork(s, 40, sink.c[0], &f), TERN_OK);
    assert_int_equal(tern_session_eval(f, toks + 40, n - 40, NULL), TERN_OK);
    assert_int_equal(tern_session_hash(f), cold_n);
    tern_session_free(f);

    /* rewinding a hybrid session without a checkpoint is refused, session unchanged */
    const uint64_t before = tern_session_hash(s);
    assert_int_equal(tern_session_rewind(s, 100), TERN_ERR_STATE);
    print_message("rewind refused: %s\n", tern_last_error());
    assert_non_null(strstr(tern_last_error(), "checkpoint"));
    assert_int_equal(tern_session_n_past(s), n);
    assert_int_equal(tern_session_hash(s), before);
    assert_memory_equal(tern_session_logits(s), cold_logits, nv * sizeof(float));
    assert_int_equal(tern_session_rewind(s, (uint32_t)n), TERN_OK); /* the live end is fine */
    /* forking below the end without a checkpoint is refused too */
    f = NULL;
    assert_int_equal(tern_session_fork(s, 100, NULL, &f), TERN_ERR_STATE);
    assert_null(f);

    for (int i = 0; i < sink.n; i++) tern_checkpoint_free(sink.c[i]);
    tern_session_free(s);
    tern_session_free(cold);
    tern_model_free(m);
    free(cold_logits);
    free(toks);
}

/* ---- load errors ------------------------------------------------------------------------ */

static void test_load_errors(void **unused) {
    (void)unused;
    /* an unmodified copy loads */
    const struct tx_mutation none = {0};
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = tx_mutated_model(MODEL_F32, &none, "ok.gguf");
    mp.n_threads = 1;
    struct tern_model *m = NULL;
    assert_int_equal(tern_model_load(&mp, &m), TERN_OK);
    tern_model_free(m);

    tx_expect_load_error(MODEL_F32, &(struct tx_mutation){.drop = "blk.1.ssm_a"}, TERN_ERR_FORMAT,
                      (const char *const[]){"blk.1.ssm_a", "missing", NULL});
    tx_expect_load_error(MODEL_F32, &(struct tx_mutation){.drop = "blk.3.attn_q_norm.weight"}, TERN_ERR_FORMAT,
                      (const char *const[]){"blk.3.attn_q_norm.weight", "missing", NULL});
    tx_expect_load_error(MODEL_F32, &(struct tx_mutation){.reshape = "blk.2.ssm_conv1d.weight", .new_ne0 = 3}, TERN_ERR_FORMAT,
                      (const char *const[]){"blk.2.ssm_conv1d.weight", "[3, 512", "expected [4, 512]", NULL});
    tx_expect_load_error(MODEL_F32, &(struct tx_mutation){.reshape = "blk.0.ssm_norm.weight", .new_ne0 = 32}, TERN_ERR_FORMAT,
                      (const char *const[]){"blk.0.ssm_norm.weight", "[32]", "expected [64]", NULL});
    tx_expect_load_error(MODEL_F32, &(struct tx_mutation){.key = "qwen35.ssm.time_step_rank", .key_val = 3}, TERN_ERR_FORMAT,
                      (const char *const[]){"inner_size 256", "time_step_rank 3", NULL});
    tx_expect_load_error(MODEL_F32, &(struct tx_mutation){.key = "qwen35.ssm.group_count", .key_val = 3}, TERN_ERR_FORMAT,
                      (const char *const[]){"v-heads 4", "k-heads 3", NULL});
    tx_expect_load_error(MODEL_F32, &(struct tx_mutation){.key = "qwen35.ssm.state_size", .key_val = 32}, TERN_ERR_FORMAT,
                      (const char *const[]){"attn_qkv", "expected [256, 384]", NULL});
    tx_expect_load_error(MODEL_F32, &(struct tx_mutation){.key = "qwen35.full_attention_interval", .key_val = 2}, TERN_ERR_FORMAT,
                      (const char *const[]){"blk.1.attn_q.weight", "missing", NULL});
}

int main(int argc, char **argv) {
    g_light = argc > 1 && !strcmp(argv[1], "--light");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_f32_kv),
        cmocka_unit_test(test_exact_f16_kv),
        cmocka_unit_test(test_exact_generated),
        cmocka_unit_test(test_checkpoint_restore),
        cmocka_unit_test(test_load_errors),
    };
    /* TERN_TEST_FILTER=test_exact* runs a subset (cmocka's pattern syntax) */
    const char *filter = getenv("TERN_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
