/* mkmodel: determinism, the layout of each architecture, the weight distributions,
 * quantized outputs (types as llama-quantize picks them, values close to the F32 ones),
 * vocabularies (built-in, copied, padded), the CLI and `tern inspect --json` on its
 * output. With the shared kit (`test-mkmodel-shared`): the tiny presets give the same
 * tensor names, types, shapes, key set and file size as the shared tiny models. */
#include "harness.h"

#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "model/mkmodel.h"
#include "util/hash.h"
#include "util/mem.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define CHECK_OK(expr)                                                                    \
    do {                                                                                  \
        enum tern_status st_ = (expr);                                                    \
        if (st_ != TERN_OK) fail_msg("%s -> %d: %s", #expr, st_, tern_last_error());      \
    } while (0)

static const char *tmp_path(const char *name) {
    static char path[8][512];
    static int i;
    i = (i + 1) % 8;
    snprintf(path[i], sizeof path[i], "%s/%s", th_tmpdir(), name);
    return path[i];
}

static uint64_t file_hash(const char *path, size_t *len) {
    char *b = th_read_file(path, len);
    assert_non_null(b);
    uint64_t h = tern_hash64(b, *len);
    free(b);
    return h;
}

/* A small qwen35 that still has every kind of tensor (layer 0 Gated DeltaNet, layer 1
 * full attention) and rows that K-quant blocks divide; small because the K-quant
 * quantizers are slow. */
static void small_qwen35(struct tern_mkmodel_params *p) {
    tern_mkmodel_defaults(TERN_MK_QWEN35, p);
    p->n_layer = 2;
    p->full_attn_interval = 2;
    p->n_embd = 256;
    p->n_ff = 256;
    p->n_head = 4;
    p->n_head_kv = 1;
    p->ssm_k_heads = 1;
    p->ssm_v_heads = 4;
    p->n_vocab = 300;
}

/* The plan's entry for name (fails the test when absent). */
static const struct tern_mkmodel_tensor *planned(const struct tern_mkmodel_tensor *t, uint32_t n, const char *name) {
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    fail_msg("tensor %s is not in the plan", name);
    return NULL;
}

static struct gguf_file *open_ok(const char *path) {
    struct gguf_file *f = NULL;
    CHECK_OK(gguf_open(path, NULL, &f));
    return f;
}

static const struct gguf_tensor *tensor(const struct gguf_file *f, const char *name) {
    const struct gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) fail_msg("tensor %s missing", name);
    return t;
}

static void assert_shape(const struct gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1) {
    const struct gguf_tensor *t = tensor(f, name);
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->n_dims != (ne1 > 1 ? 2u : 1u))
        fail_msg("%s: shape [%llu, %llu] (%u dims), want [%llu, %llu]", name, (unsigned long long)t->ne[0],
                 (unsigned long long)t->ne[1], t->n_dims, (unsigned long long)ne0, (unsigned long long)ne1);
}

/* ---- determinism ---------------------------------------------------------------------- */

static void test_same_seed_same_bytes(void **state) {
    (void)state;
    struct tern_mkmodel_params p;
    small_qwen35(&p);
    p.wtype = TERN_DTYPE_Q4_K;
    p.mix = TERN_MK_Q4_K_M;
    size_t la, lb, lc;
    CHECK_OK(tern_mkmodel_write(&p, tmp_path("a.gguf"), NULL));
    CHECK_OK(tern_mkmodel_write(&p, tmp_path("b.gguf"), NULL));
    uint64_t ha = file_hash(tmp_path("a.gguf"), &la), hb = file_hash(tmp_path("b.gguf"), &lb);
    assert_int_equal(la, lb);
    assert_true(ha == hb);
    p.seed = 1235;
    CHECK_OK(tern_mkmodel_write(&p, tmp_path("c.gguf"), NULL));
    uint64_t hc = file_hash(tmp_path("c.gguf"), &lc);
    assert_int_equal(la, lc);
    assert_true(ha != hc);

    /* Each tensor has its own stream: a deeper model starts with the same layer 0. */
    struct tern_mkmodel_params q;
    small_qwen35(&q);
    q.full_attn_interval = 4;
    CHECK_OK(tern_mkmodel_write(&q, tmp_path("d2.gguf"), NULL));
    q.n_layer = 3;
    CHECK_OK(tern_mkmodel_write(&q, tmp_path("d3.gguf"), NULL));
    struct gguf_file *f2 = open_ok(tmp_path("d2.gguf")), *f3 = open_ok(tmp_path("d3.gguf"));
    const struct gguf_tensor *a = tensor(f2, "blk.0.attn_qkv.weight"), *b = tensor(f3, "blk.0.attn_qkv.weight");
    assert_int_equal(a->size, b->size);
    assert_memory_equal(a->data, b->data, a->size);
    a = tensor(f3, "blk.1.ssm_a");
    b = tensor(f3, "blk.2.ssm_a");
    assert_memory_not_equal(a->data, b->data, a->size);
    gguf_close(f2);
    gguf_close(f3);
}

/* ---- layouts ---------------------------------------------------------------------------- */

static void test_qwen35_layout(void **state) {
    (void)state;
    struct tern_mkmodel_params p;
    CHECK_OK(tern_mkmodel_preset("tiny-qwen35", &p));
    struct tern_mkmodel_stats s;
    CHECK_OK(tern_mkmodel_write(&p, tmp_path("q35.gguf"), &s));
    assert_int_equal(s.n_tensors, 109);
    assert_int_equal(s.n_vocab, 4122);
    assert_int_equal(s.n_params, 8955824); /* the shared tiny model's count */
    struct gguf_file *f = open_ok(tmp_path("q35.gguf"));
    assert_int_equal(gguf_n_tensors(f), 109);
    assert_shape(f, "token_embd.weight", 256, 4122);
    assert_shape(f, "output.weight", 256, 4122);
    assert_shape(f, "blk.0.attn_qkv.weight", 256, 512); /* q and k: 2 x 2 x 64, v: 4 x 64 */
    assert_shape(f, "blk.0.attn_gate.weight", 256, 256);
    assert_shape(f, "blk.0.ssm_conv1d.weight", 4, 512);
    assert_shape(f, "blk.0.ssm_dt.bias", 4, 1);
    assert_shape(f, "blk.0.ssm_a", 4, 1);
    assert_shape(f, "blk.0.ssm_beta.weight", 256, 4);
    assert_shape(f, "blk.0.ssm_alpha.weight", 256, 4);
    assert_shape(f, "blk.0.ssm_norm.weight", 64, 1);
    assert_shape(f, "blk.0.ssm_out.weight", 256, 256);
    assert_shape(f, "blk.0.post_attention_norm.weight", 256, 1);
    assert_null(gguf_find_tensor(f, "blk.0.attn_q.weight"));
    assert_null(gguf_find_tensor(f, "blk.0.ffn_norm.weight"));
    assert_shape(f, "blk.3.attn_q.weight", 256, 512); /* q + gate, 4 heads x 64 each */
    assert_shape(f, "blk.3.attn_k.weight", 256, 128);
    assert_shape(f, "blk.3.attn_v.weight", 256, 128);
    assert_shape(f, "blk.3.attn_output.weight", 256, 256);
    assert_shape(f, "blk.3.attn_q_norm.weight", 64, 1);
    assert_shape(f, "blk.3.attn_k_norm.weight", 64, 1);
    assert_null(gguf_find_tensor(f, "blk.3.attn_qkv.weight"));
    assert_shape(f, "blk.7.attn_q.weight", 256, 512);
    assert_shape(f, "blk.7.ffn_down.weight", 768, 256);
    uint32_t v;
    CHECK_OK(gguf_get_u32(f, "qwen35.full_attention_interval", &v));
    assert_int_equal(v, 4);
    CHECK_OK(gguf_get_u32(f, "qwen35.ssm.inner_size", &v));
    assert_int_equal(v, 256);
    CHECK_OK(gguf_get_u32(f, "qwen35.rope.dimension_count", &v));
    assert_int_equal(v, 16);
    const struct gguf_kv *sec;
    CHECK_OK(gguf_get_arr(f, "qwen35.rope.dimension_sections", GGUF_TYPE_INT32, &sec));
    assert_int_equal(sec->v.arr.n, 4);
    assert_int_equal(gguf_arr_get_i64(sec, 0), 3);
    assert_int_equal(gguf_arr_get_i64(sec, 1), 3);
    assert_int_equal(gguf_arr_get_i64(sec, 2), 2);
    assert_int_equal(gguf_arr_get_i64(sec, 3), 0);
    float theta;
    CHECK_OK(gguf_get_f32(f, "qwen35.rope.freq_base", &theta));
    assert_true(theta == 1e7f);
    gguf_close(f);
}

static void test_other_archs(void **state) {
    (void)state;
    struct tern_mkmodel_params p;
    tern_mkmodel_defaults(TERN_MK_QWEN2, &p);
    p.n_layer = 2;
    CHECK_OK(tern_mkmodel_write(&p, tmp_path("q2.gguf"), NULL));
    struct gguf_file *f = open_ok(tmp_path("q2.gguf"));
    assert_shape(f, "blk.1.attn_q.bias", 256, 1);
    assert_shape(f, "blk.1.attn_k.bias", 128, 1);
    assert_shape(f, "blk.1.attn_v.bias", 128, 1);
    assert_null(gguf_find_tensor(f, "blk.1.attn_q_norm.weight"));
    assert_null(gguf_find_kv(f, "qwen2.attention.key_length")); /* 64 x 4 == 256: the default */
    assert_int_equal(gguf_n_tensors(f), 3 + 2 * 12);
    gguf_close(f);

    /* llama with stories260K's shape: head_dim 8 differs from nothing, ffn 172. */
    tern_mkmodel_defaults(TERN_MK_LLAMA, &p);
    p.n_layer = 5;
    p.n_embd = 64;
    p.n_head = 8;
    p.n_head_kv = 4;
    p.head_dim = 8;
    p.n_ff = 172;
    p.n_vocab = 512;
    p.n_ctx = 2048;
    p.wtype = TERN_DTYPE_Q8_0;
    p.mix = TERN_MK_LIKE_QUANTIZE;
    struct tern_mkmodel_stats s;
    CHECK_OK(tern_mkmodel_write(&p, tmp_path("ll.gguf"), &s));
    assert_int_equal(s.n_tensors, 48);
    assert_int_equal(s.n_params, 292800); /* stories260K's parameter count */
    assert_int_equal(s.n_f32_fallback, 5); /* ffn_down rows of 172 are not a multiple of 32 */
    f = open_ok(tmp_path("ll.gguf"));
    assert_int_equal(tensor(f, "blk.0.ffn_down.weight")->type, TERN_DTYPE_F32);
    assert_int_equal(tensor(f, "blk.0.ffn_up.weight")->type, TERN_DTYPE_Q8_0);
    assert_int_equal(tensor(f, "output.weight")->type, TERN_DTYPE_Q8_0); /* Q8_0 output stays Q8_0 */
    uint32_t v;
    CHECK_OK(gguf_get_u32(f, "llama.rope.dimension_count", &v));
    assert_int_equal(v, 8);
    CHECK_OK(gguf_get_u32(f, "general.file_type", &v));
    assert_int_equal(v, 7);
    CHECK_OK(gguf_get_u32(f, "general.quantization_version", &v));
    assert_int_equal(v, 2);
    gguf_close(f);

    /* Tied: no output.weight, and a K-quant mix gives token_embd the output's Q6_K. */
    CHECK_OK(tern_mkmodel_preset("tiny-qwen3", &p));
    p.tied = true;
    p.wtype = TERN_DTYPE_Q4_K;
    p.mix = TERN_MK_Q4_K_M;
    struct tern_mkmodel_tensor *plan;
    uint32_t n;
    CHECK_OK(tern_mkmodel_plan(&p, &plan, &n, &s));
    assert_int_equal(n, 46);
    for (uint32_t i = 0; i < n; i++) assert_string_not_equal(plan[i].name, "output.weight");
    assert_int_equal(planned(plan, n, "token_embd.weight")->type, TERN_DTYPE_Q6_K);
    free(plan);
    /* The same model written: the file holds what the plan said. */
    p.wtype = TERN_DTYPE_Q8_0;
    p.mix = TERN_MK_LIKE_QUANTIZE;
    p.n_layer = 1;
    CHECK_OK(tern_mkmodel_plan(&p, &plan, &n, &s));
    CHECK_OK(tern_mkmodel_write(&p, tmp_path("tied.gguf"), NULL));
    f = open_ok(tmp_path("tied.gguf"));
    assert_int_equal(gguf_n_tensors(f), n);
    for (uint32_t i = 0; i < n; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        assert_string_equal(t->name.ptr, plan[i].name);
        assert_int_equal(t->type, plan[i].type);
        assert_memory_equal(t->ne, plan[i].ne, sizeof t->ne);
    }
    assert_int_equal(tensor(f, "token_embd.weight")->type, TERN_DTYPE_Q8_0); /* Q8_0 keeps Q8_0 */
    CHECK_OK(gguf_get_u32(f, "general.file_type", &v));
    assert_int_equal(v, 7);
    free(plan);
    gguf_close(f);

    /* The big presets have the shapes conformance/perf-reference.md measures. */
    CHECK_OK(tern_mkmodel_preset("qwen3.5-0.8b", &p));
    assert_true(tern_mkmodel_parse_type("q8_0", &p.wtype, &p.mix));
    CHECK_OK(tern_mkmodel_plan(&p, &plan, &n, &s));
    assert_int_equal(s.n_params, 752393024);
    assert_int_equal(s.n_bytes, 800881920);
    assert_int_equal(planned(plan, n, "blk.3.attn_q.weight")->ne[1], 2 * 8 * 256);
    assert_int_equal(planned(plan, n, "blk.0.attn_qkv.weight")->ne[1], (2 * 16 + 16) * 128);
    free(plan);
    CHECK_OK(tern_mkmodel_preset("qwen3-0.6b", &p));
    assert_true(tern_mkmodel_parse_type("q4_k_m", &p.wtype, &p.mix));
    CHECK_OK(tern_mkmodel_plan(&p, &plan, &n, &s));
    assert_int_equal(s.n_params, 596049920);
    assert_int_equal(s.n_bytes, 390753280);
    free(plan);
}

static void test_check_errors(void **state) {
    (void)state;
    struct tern_mkmodel_params p;
    tern_mkmodel_defaults(TERN_MK_QWEN3, &p);
    p.n_head_kv = 8;
    assert_int_equal(tern_mkmodel_check(&p), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "n_head_kv 8 is outside 1..4"));
    p.n_head_kv = 3;
    assert_int_equal(tern_mkmodel_check(&p), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "n_head 4 is not a multiple of n_head_kv 3"));
    tern_mkmodel_defaults(TERN_MK_QWEN35, &p);
    p.ssm_v_heads = 3;
    assert_int_equal(tern_mkmodel_check(&p), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "ssm v-heads 3 is not a multiple of ssm k-heads 2"));
    tern_mkmodel_defaults(TERN_MK_QWEN35, &p);
    p.rope_sections[0] = 5;
    assert_int_equal(tern_mkmodel_check(&p), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "rope sections sum to 5 pairs"));
    tern_mkmodel_defaults(TERN_MK_LLAMA, &p);
    p.wtype = TERN_DTYPE_TQ1_0;
    assert_int_equal(tern_mkmodel_check(&p), TERN_ERR_UNSUPPORTED);
    tern_mkmodel_defaults(TERN_MK_LLAMA, &p);
    p.n_vocab = 10;
    assert_int_equal(tern_mkmodel_write(&p, tmp_path("x.gguf"), NULL), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "n_vocab 10 is smaller than the built-in vocabulary"));
    assert_int_equal(tern_mkmodel_preset("qwen9", &p), TERN_ERR_INVALID);
    tern_mkmodel_defaults(TERN_MK_GPTOSS, &p);
    p.sliding_window = 0;
    assert_int_equal(tern_mkmodel_check(&p), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "sliding window 0"));
    tern_mkmodel_defaults(TERN_MK_QWEN3, &p);
    assert_true(tern_mkmodel_parse_type("mxfp4_moe", &p.wtype, &p.mix));
    assert_int_equal(tern_mkmodel_check(&p), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "mixture-of-experts"));
    /* gpt-oss-20b (its published config): the real files' mix, about 12 GB */
    CHECK_OK(tern_mkmodel_preset("gpt-oss-20b", &p));
    assert_true(p.n_layer == 24 && p.n_embd == 2880 && p.n_head == 64 && p.n_head_kv == 8 && p.head_dim == 64);
    assert_true(p.n_expert == 32 && p.n_expert_used == 4 && p.n_ff_exp == 2880 && p.sliding_window == 128);
    assert_int_equal(p.n_vocab, 201088);
    enum tern_dtype t;
    enum tern_mk_mix mix;
    assert_true(tern_mkmodel_parse_type("Q4_K_M", &t, &mix));
    assert_int_equal(t, TERN_DTYPE_Q4_K);
    assert_int_equal(mix, TERN_MK_Q4_K_M);
    assert_false(tern_mkmodel_parse_type("tq1_0", &t, &mix));
    assert_true(tern_mkmodel_parse_type("IQ2_XS", &t, &mix)); /* the low-bit types */
    assert_int_equal(t, TERN_DTYPE_IQ2_XS);
    assert_true(tern_mkmodel_parse_type("q3_k", &t, &mix));
    assert_int_equal(t, TERN_DTYPE_Q3_K);
    assert_true(tern_mkmodel_parse_type("q3_k_m", &t, &mix) && t == TERN_DTYPE_Q3_K && mix == TERN_MK_Q3_K_M);
    assert_true(tern_mkmodel_parse_type("q2_k", &t, &mix) && t == TERN_DTYPE_Q2_K && mix == TERN_MK_Q2_K);
    assert_true(tern_mkmodel_parse_type("ud_q2", &t, &mix) && mix == TERN_MK_UD_Q2);
}

/* ---- weights ------------------------------------------------------------------------------ */

struct moments {
    double mean, sd, min, max;
};

static struct moments moments(const struct gguf_tensor *t) {
    TERN_ASSERT(t->type == TERN_DTYPE_F32);
    const float *x = t->data;
    double s = 0, s2 = 0, mn = INFINITY, mx = -INFINITY;
    for (uint64_t i = 0; i < t->n_elements; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
        mn = fmin(mn, x[i]);
        mx = fmax(mx, x[i]);
    }
    double n = (double)t->n_elements, mean = s / n;
    return (struct moments){mean, sqrt(fmax(s2 / n - mean * mean, 0)), mn, mx};
}

static void test_weight_distributions(void **state) {
    (void)state;
    struct tern_mkmodel_params p;
    small_qwen35(&p);
    p.ssm_k_heads = 2;
    p.ssm_v_heads = 32; /* enough ssm_a / ssm_dt / ssm_conv1d values for statistics */
    CHECK_OK(tern_mkmodel_write(&p, tmp_path("w.gguf"), NULL));
    struct gguf_file *f = open_ok(tmp_path("w.gguf"));
    struct moments m = moments(tensor(f, "blk.0.attn_qkv.weight")); /* 131072 values */
    assert_true(fabs(m.mean) < 0.001 && fabs(m.sd - 0.02) < 0.001);
    m = moments(tensor(f, "token_embd.weight"));
    assert_true(fabs(m.mean) < 0.001 && fabs(m.sd - 0.02) < 0.001);
    m = moments(tensor(f, "blk.0.post_attention_norm.weight"));
    assert_true(fabs(m.mean - 1) < 0.01 && m.sd > 0.01 && m.sd < 0.03);
    m = moments(tensor(f, "blk.0.ssm_conv1d.weight")); /* 4 x 2304 */
    assert_true(fabs(m.mean) < 0.03 && fabs(m.sd - 0.3) < 0.03);
    m = moments(tensor(f, "blk.0.ssm_dt.bias"));
    assert_true(m.min > 0.9 && m.max < 1.1);
    m = moments(tensor(f, "blk.0.ssm_a"));
    assert_true(m.min >= -16.0 && m.max <= -1.0 && m.max - m.min > 5);
    gguf_close(f);
}

/* Every quantized type reads back as that type, and its values dequantize to about the
 * F32 model's values for the same seed. */
static void test_quantized_types(void **state) {
    (void)state;
    struct tern_mkmodel_params p;
    small_qwen35(&p);
    CHECK_OK(tern_mkmodel_write(&p, tmp_path("ref.gguf"), NULL));
    struct gguf_file *ref = open_ok(tmp_path("ref.gguf"));
    static const struct {
        const char *name;
        enum tern_dtype type;
        double max_rel_rms;
    } types[] = {
        {"f16", TERN_DTYPE_F16, 0.001}, {"bf16", TERN_DTYPE_BF16, 0.005}, {"q8_0", TERN_DTYPE_Q8_0, 0.01},
        {"q4_0", TERN_DTYPE_Q4_0, 0.15}, {"q4_1", TERN_DTYPE_Q4_1, 0.12}, {"q5_0", TERN_DTYPE_Q5_0, 0.07},
        {"q5_1", TERN_DTYPE_Q5_1, 0.06}, {"q4_k", TERN_DTYPE_Q4_K, 0.12}, {"q5_k", TERN_DTYPE_Q5_K, 0.06},
        {"q6_k", TERN_DTYPE_Q6_K, 0.03},
    };
    float *row = malloc(4096 * sizeof(float));
    for (size_t ti = 0; ti < TERN_ARRAY_LEN(types); ti++) {
        enum tern_mk_mix mix;
        assert_true(tern_mkmodel_parse_type(types[ti].name, &p.wtype, &mix));
        p.mix = TERN_MK_UNIFORM; /* --pure */
        CHECK_OK(tern_mkmodel_write(&p, tmp_path("qt.gguf"), NULL));
        struct gguf_file *f = open_ok(tmp_path("qt.gguf"));
        for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
            const struct gguf_tensor *t = gguf_tensor_at(f, i), *r = tensor(ref, t->name.ptr);
            bool stays_f32 = t->n_dims == 1 || strstr(t->name.ptr, "_norm") || strstr(t->name.ptr, "ssm_conv1d");
            if (t->type != (stays_f32 ? TERN_DTYPE_F32 : types[ti].type))
                fail_msg("%s: %s is %s", types[ti].name, t->name.ptr, tern_dtype_name(t->type));
            if (stays_f32) {
                assert_memory_equal(t->data, r->data, r->size);
                continue;
            }
            uint64_t row_bytes = t->size / (t->n_elements / t->ne[0]);
            double se = 0, s2 = 0;
            for (uint64_t rr = 0; rr < t->ne[1]; rr++) {
                tern_dequantize_row(t->type, (const uint8_t *)t->data + rr * row_bytes, row, t->ne[0]);
                const float *x = (const float *)r->data + rr * t->ne[0];
                for (uint64_t c = 0; c < t->ne[0]; c++) {
                    se += (double)(row[c] - x[c]) * (row[c] - x[c]);
                    s2 += (double)x[c] * x[c];
                }
            }
            double rel = sqrt(se / s2);
            if (rel > types[ti].max_rel_rms)
                fail_msg("%s: %s relative rms error %g > %g", types[ti].name, t->name.ptr, rel, types[ti].max_rel_rms);
        }
        gguf_close(f);
    }
    free(row);
    gguf_close(ref);
}

/* llama-quantize's Q4_K_M choices on a qwen35: output Q6_K; attn_v/attn_qkv and ffn_down
 * Q6_K in the layers use_more_bits picks (first and last eighth, every third between). */
static void test_q4_k_m_mix(void **state) {
    (void)state;
    struct tern_mkmodel_params p;
    CHECK_OK(tern_mkmodel_preset("tiny-qwen35", &p));
    p.wtype = TERN_DTYPE_Q4_K;
    p.mix = TERN_MK_Q4_K_M;
    struct tern_mkmodel_tensor *plan;
    uint32_t n;
    CHECK_OK(tern_mkmodel_plan(&p, &plan, &n, NULL));
    assert_int_equal(planned(plan, n, "output.weight")->type, TERN_DTYPE_Q6_K);
    assert_int_equal(planned(plan, n, "token_embd.weight")->type, TERN_DTYPE_Q4_K);
    const char *q6[] = {"blk.0.attn_qkv.weight", "blk.3.attn_v.weight", "blk.6.attn_qkv.weight", "blk.7.attn_v.weight",
                        "blk.0.ffn_down.weight", "blk.3.ffn_down.weight", "blk.6.ffn_down.weight", "blk.7.ffn_down.weight"};
    int n_q6 = 0, n_q4 = 0, n_f32 = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct tern_mkmodel_tensor *t = &plan[i];
        bool want_q6 = !strcmp(t->name, "output.weight");
        for (size_t k = 0; k < TERN_ARRAY_LEN(q6); k++) want_q6 |= !strcmp(t->name, q6[k]);
        if (want_q6 != (t->type == TERN_DTYPE_Q6_K)) fail_msg("%s is %s", t->name, tern_dtype_name(t->type));
        n_q6 += t->type == TERN_DTYPE_Q6_K;
        n_q4 += t->type == TERN_DTYPE_Q4_K;
        n_f32 += t->type == TERN_DTYPE_F32;
    }
    /* The counts of the shared tiny-qwen35-q4_k_m.gguf (models/README.md). */
    assert_int_equal(n_f32, 45);
    assert_int_equal(n_q4, 55);
    assert_int_equal(n_q6, 9);
    assert_int_equal(planned(plan, n, "blk.1.ssm_alpha.weight")->type, TERN_DTYPE_Q4_K);
    free(plan);
}

/* The type of every planned matrix of a qwen35moe cut of the 35B-A3B shape (16 layers, 16
 * experts: not 8, which llama-quantize treats apart) against the rule table read back from
 * llama-quantize's Q2_K and Q3_K_M files of the same shape (2026-12-06, the reference's
 * llama-quantize on an F16 file of `--preset qwen3.5-35b-a3b --n-layer 16 --experts 16
 * --experts-used 4 --n-vocab 4096`: all 271 *.weight tensors equal by name). want(role, layer)
 * gives the type; every role the plan holds must be in the table. */
#define MIX_MORE_BITS UINT32_MAX /* until: hi in the layers use_more_bits picks */
struct mix_rule {
    const char *role;       /* the name after "blk.N." (or the whole name) */
    enum tern_dtype lo, hi; /* hi for the layers below `until` (or the first `until` of the role) */
    uint32_t until;
};

/* use_more_bits over 16 layers: the first and last eighth, every third between */
static const bool more_bits16[16] = {1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1, 1};

static void check_mix(const char *type, const struct mix_rule *rules, size_t n_rules) {
    struct tern_mkmodel_params p;
    CHECK_OK(tern_mkmodel_preset("qwen3.5-35b-a3b", &p));
    p.n_layer = 16, p.n_expert = 16, p.n_expert_used = 4, p.n_vocab = 4096;
    assert_true(tern_mkmodel_parse_type(type, &p.wtype, &p.mix));
    struct tern_mkmodel_tensor *plan;
    uint32_t n;
    CHECK_OK(tern_mkmodel_plan(&p, &plan, &n, NULL));
    uint32_t seen[16] = {0}, n_mat = 0;
    bool used[32] = {false};
    assert_true(n_rules <= 32);
    for (uint32_t i = 0; i < n; i++) {
        const struct tern_mkmodel_tensor *t = &plan[i];
        if (t->type == TERN_DTYPE_F32) continue;
        unsigned layer = 0;
        const char *role = t->name;
        if (sscanf(t->name, "blk.%u.", &layer) == 1) role = strchr(t->name + 4, '.') + 1;
        size_t r = 0;
        while (r < n_rules && strcmp(rules[r].role, role)) r++;
        if (r == n_rules) fail_msg("%s: no rule for %s (%s)", type, t->name, tern_dtype_name(t->type));
        used[r] = true;
        /* attn_v and attn_qkv share llama-quantize's counter: `until` counts those tensors */
        const bool wv = !strcmp(rules[r].role, "attn_qkv.weight") || !strcmp(rules[r].role, "attn_v.weight");
        const bool hi = rules[r].until == MIX_MORE_BITS ? more_bits16[layer % 16]
                        : wv                            ? seen[0]++ < rules[r].until
                                                        : layer < rules[r].until;
        const enum tern_dtype want = hi ? rules[r].hi : rules[r].lo;
        if (t->type != want)
            fail_msg("%s: %s is %s, the mix's rule says %s", type, t->name, tern_dtype_name(t->type),
                     tern_dtype_name(want));
        n_mat++;
    }
    assert_int_equal(n_mat, 174); /* the quantized matrices of the 271 *.weight tensors */
    for (size_t r = 0; r < n_rules; r++)
        if (!used[r]) fail_msg("%s: no tensor has the role %s", type, rules[r].role);
    free(plan);
}

static void test_low_bit_mixes(void **state) {
    (void)state;
    const struct mix_rule q3_k_m[] = {
        {"output.weight", TERN_DTYPE_Q6_K, TERN_DTYPE_Q6_K, 0},
        {"token_embd.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
        {"attn_qkv.weight", TERN_DTYPE_Q4_K, TERN_DTYPE_Q5_K, 2}, /* the first two of attn_v/attn_qkv */
        {"attn_v.weight", TERN_DTYPE_Q4_K, TERN_DTYPE_Q5_K, 2},
        {"attn_output.weight", TERN_DTYPE_Q4_K, TERN_DTYPE_Q4_K, 0},
        {"ffn_down_exps.weight", TERN_DTYPE_Q4_K, TERN_DTYPE_Q5_K, 1}, /* n_layer / 16 */
        {"ffn_down_shexp.weight", TERN_DTYPE_Q4_K, TERN_DTYPE_Q5_K, 1},
        {"attn_gate.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
        {"attn_q.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
        {"attn_k.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
        {"ffn_gate_exps.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
        {"ffn_up_exps.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
        {"ffn_gate_shexp.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
        {"ffn_up_shexp.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
        {"ssm_alpha.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
        {"ssm_beta.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
        {"ssm_out.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
    };
    check_mix("q3_k_m", q3_k_m, TERN_ARRAY_LEN(q3_k_m));
    /* Q2_K: the attn_v/attn_qkv rule sees 8 query heads per KV head (>= 4: Q4_K) */
    const struct mix_rule q2_k[] = {
        {"output.weight", TERN_DTYPE_Q6_K, TERN_DTYPE_Q6_K, 0},
        {"token_embd.weight", TERN_DTYPE_Q2_K, TERN_DTYPE_Q2_K, 0},
        {"attn_qkv.weight", TERN_DTYPE_Q4_K, TERN_DTYPE_Q4_K, 0},
        {"attn_v.weight", TERN_DTYPE_Q4_K, TERN_DTYPE_Q4_K, 0},
        {"attn_output.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
        {"ffn_down_exps.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
        {"ffn_down_shexp.weight", TERN_DTYPE_Q3_K, TERN_DTYPE_Q3_K, 0},
        {"attn_gate.weight", TERN_DTYPE_Q2_K, TERN_DTYPE_Q2_K, 0},
        {"attn_q.weight", TERN_DTYPE_Q2_K, TERN_DTYPE_Q2_K, 0},
        {"attn_k.weight", TERN_DTYPE_Q2_K, TERN_DTYPE_Q2_K, 0},
        {"ffn_gate_exps.weight", TERN_DTYPE_Q2_K, TERN_DTYPE_Q2_K, 0},
        {"ffn_up_exps.weight", TERN_DTYPE_Q2_K, TERN_DTYPE_Q2_K, 0},
        {"ffn_gate_shexp.weight", TERN_DTYPE_Q2_K, TERN_DTYPE_Q2_K, 0},
        {"ffn_up_shexp.weight", TERN_DTYPE_Q2_K, TERN_DTYPE_Q2_K, 0},
        {"ssm_alpha.weight", TERN_DTYPE_Q2_K, TERN_DTYPE_Q2_K, 0},
        {"ssm_beta.weight", TERN_DTYPE_Q2_K, TERN_DTYPE_Q2_K, 0},
        {"ssm_out.weight", TERN_DTYPE_Q2_K, TERN_DTYPE_Q2_K, 0},
    };
    check_mix("q2_k", q2_k, TERN_ARRAY_LEN(q2_k));
    /* ud_q2: routed experts 2/3-bit I-quants, more bits in use_more_bits layers (0, 1, 4,
     * 7, 10, 13, 14, 15 of 16) */
    const struct mix_rule ud[] = {
        {"output.weight", TERN_DTYPE_Q6_K, TERN_DTYPE_Q6_K, 0},
        {"token_embd.weight", TERN_DTYPE_Q4_K, TERN_DTYPE_Q4_K, 0},
        {"attn_qkv.weight", TERN_DTYPE_IQ3_S, TERN_DTYPE_IQ3_S, 0},
        {"attn_v.weight", TERN_DTYPE_Q8_0, TERN_DTYPE_Q8_0, 0},
        {"attn_k.weight", TERN_DTYPE_Q8_0, TERN_DTYPE_Q8_0, 0},
        {"ssm_alpha.weight", TERN_DTYPE_Q8_0, TERN_DTYPE_Q8_0, 0},
        {"ssm_beta.weight", TERN_DTYPE_Q8_0, TERN_DTYPE_Q8_0, 0},
        {"attn_output.weight", TERN_DTYPE_IQ3_S, TERN_DTYPE_IQ3_S, 0},
        {"attn_gate.weight", TERN_DTYPE_IQ3_S, TERN_DTYPE_IQ3_S, 0},
        {"attn_q.weight", TERN_DTYPE_IQ3_S, TERN_DTYPE_IQ3_S, 0},
        {"ssm_out.weight", TERN_DTYPE_IQ3_S, TERN_DTYPE_IQ3_S, 0},
        {"ffn_gate_shexp.weight", TERN_DTYPE_Q4_K, TERN_DTYPE_Q4_K, 0},
        {"ffn_up_shexp.weight", TERN_DTYPE_Q4_K, TERN_DTYPE_Q4_K, 0},
        {"ffn_down_shexp.weight", TERN_DTYPE_Q4_K, TERN_DTYPE_Q4_K, 0},
        {"ffn_gate_exps.weight", TERN_DTYPE_IQ2_XXS, TERN_DTYPE_IQ2_S, MIX_MORE_BITS},
        {"ffn_up_exps.weight", TERN_DTYPE_IQ2_XXS, TERN_DTYPE_IQ2_S, MIX_MORE_BITS},
        {"ffn_down_exps.weight", TERN_DTYPE_IQ3_XXS, TERN_DTYPE_IQ3_S, MIX_MORE_BITS},
    };
    check_mix("ud_q2", ud, TERN_ARRAY_LEN(ud));
}

/* ---- vocabulary ------------------------------------------------------------------------------ */

static void test_builtin_vocab(void **state) {
    (void)state;
    struct tern_mkmodel_params p;
    tern_mkmodel_defaults(TERN_MK_QWEN3, &p);
    p.n_layer = 1;
    p.n_vocab = 300;
    CHECK_OK(tern_mkmodel_write(&p, tmp_path("bv.gguf"), NULL));
    struct gguf_file *f = open_ok(tmp_path("bv.gguf"));
    const struct gguf_kv *tok, *types, *merges;
    CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tok));
    CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types));
    CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges));
    assert_int_equal(tok->v.arr.n, 300);
    assert_int_equal(types->v.arr.n, 300);
    assert_string_equal(tok->v.arr.strs[0].ptr, "!");
    assert_string_equal(tok->v.arr.strs[93].ptr, "~");
    assert_string_equal(tok->v.arr.strs[188].ptr, "\xc4\x80");  /* byte 0 as U+0100 */
    assert_string_equal(tok->v.arr.strs[220].ptr, "\xc4\xa0");  /* the space, "Ġ" */
    /* 256 distinct one-character byte tokens. */
    for (int i = 0; i < 256; i++)
        for (int j = 0; j < i; j++) assert_string_not_equal(tok->v.arr.strs[i].ptr, tok->v.arr.strs[j].ptr);
    /* Every merge's result is a token. */
    for (uint64_t m = 0; m < merges->v.arr.n; m++) {
        char joined[64];
        const char *s = merges->v.arr.strs[m].ptr, *sp = strchr(s, ' ');
        assert_non_null(sp);
        snprintf(joined, sizeof joined, "%.*s%s", (int)(sp - s), s, sp + 1);
        bool found = false;
        for (uint64_t i = 0; i < tok->v.arr.n && !found; i++) found = !strcmp(tok->v.arr.strs[i].ptr, joined);
        if (!found) fail_msg("merge '%s' makes '%s', not a token", s, joined);
    }
    uint32_t eos, bos;
    CHECK_OK(gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &eos));
    CHECK_OK(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &bos));
    assert_string_equal(tok->v.arr.strs[eos].ptr, "<|im_end|>");
    assert_string_equal(tok->v.arr.strs[bos].ptr, "<|endoftext|>");
    assert_string_equal(tok->v.arr.strs[eos - 1].ptr, "<|im_start|>");
    assert_int_equal(gguf_arr_get_i64(types, eos), 3);
    assert_string_equal(tok->v.arr.strs[299].ptr, "[PAD299]");
    assert_int_equal(gguf_arr_get_i64(types, 299), 5);
    const struct gguf_str *tmpl;
    CHECK_OK(gguf_get_str(f, "tokenizer.chat_template", &tmpl));
    assert_non_null(strstr(tmpl->ptr, "<|im_start|>"));
    assert_shape(f, "token_embd.weight", 256, 300);
    gguf_close(f);
}

/* ---- the CLI ----------------------------------------------------------------------------------- */

static int run(const char *args, const char *out_path) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s.err", th_tern_bin(), args, out_path ? out_path : "/dev/null",
             out_path ? out_path : tmp_path("cmd"));
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_cli(void **state) {
    (void)state;
    char args[2048];
    assert_int_equal(run("mkmodel --help", NULL), 0);
    assert_int_equal(run("mkmodel --arch qwen9 -o x.gguf", NULL), 2);
    assert_int_equal(run("mkmodel --arch qwen3", NULL), 2);              /* no --out */
    assert_int_equal(run("mkmodel --preset tiny-qwen3 --type tq1_0 -o x.gguf", NULL), 2);
    assert_int_equal(run("mkmodel --arch qwen3 --n-head 5 --n-head-kv 2 -o x.gguf", NULL), 2);
    assert_int_equal(run("mkmodel --arch qwen3 --n-layer 0 -o x.gguf", NULL), 2);
    assert_int_equal(run("mkmodel --arch qwen3 --n-layer", NULL), 2);
    assert_int_equal(run("mkmodel --preset tiny-qwen3 --arch llama -o x.gguf", NULL), 2);
    snprintf(args, sizeof args, "mkmodel --arch qwen3 --vocab %s -o %s", tmp_path("nonexistent.gguf"),
             tmp_path("x.gguf"));
    assert_int_equal(run(args, NULL), 1);

    /* Preset + overrides, then inspect --json on the result. */
    const char *model = tmp_path("cli.gguf");
    snprintf(args, sizeof args,
             "mkmodel --preset tiny-qwen35 --n-layer 4 --n-vocab 5000 --type q8_0 --seed 7 --tied -o %s", model);
    assert_int_equal(run(args, NULL), 0);
    const char *json_path = tmp_path("cli.json");
    snprintf(args, sizeof args, "inspect --json %s", model);
    assert_int_equal(run(args, json_path), 0);
    json_error_t err;
    json_t *doc = json_load_file(json_path, 0, &err);
    if (!doc) fail_msg("inspect --json: %s", err.text);
    json_t *tensors = json_object_get(doc, "tensors");
    assert_int_equal(json_array_size(tensors), 2 + 3 * 14 + 11); /* tied: no output.weight */
    json_t *t0 = json_array_get(tensors, 0);
    assert_string_equal(json_string_value(json_object_get(t0, "name")), "token_embd.weight");
    assert_string_equal(json_string_value(json_object_get(t0, "type")), "Q8_0");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(t0, "shape"), 1)), 5000);
    json_t *meta = json_object_get(doc, "metadata");
    bool found = false;
    for (size_t i = 0; i < json_array_size(meta); i++) {
        json_t *m = json_array_get(meta, i);
        if (strcmp(json_string_value(json_object_get(m, "key")), "qwen35.block_count")) continue;
        assert_int_equal(json_integer_value(json_object_get(m, "value")), 4);
        found = true;
    }
    assert_true(found);
    json_t *by_type = json_object_get(json_object_get(doc, "totals"), "by_type");
    assert_non_null(json_object_get(by_type, "Q8_0"));
    assert_non_null(json_object_get(by_type, "F32"));
    json_decref(doc);

    /* The text form, and inspect's error path. */
    snprintf(args, sizeof args, "inspect %s", model);
    assert_int_equal(run(args, json_path), 0);
    size_t len;
    char *text = th_read_file(json_path, &len);
    assert_non_null(strstr(text, "tokenizer.ggml.tokens                    arr[str]  5000: [\"!\""));
    assert_non_null(strstr(text, "blk.3.attn_q.weight"));
    assert_non_null(strstr(text, "totals:"));
    free(text);
    snprintf(args, sizeof args, "inspect %s", json_path); /* not a GGUF */
    assert_int_equal(run(args, tmp_path("bad.out")), 1);
    char errp[600];
    snprintf(errp, sizeof errp, "%s.err", tmp_path("bad.out"));
    text = th_read_file(errp, &len);
    assert_non_null(strstr(text, "bad magic"));
    free(text);
}

/* ---- against the shared tiny models ------------------------------------------------------------ */

/* The generated file has the same tensors (names in order, types, shapes), the same key
 * set and the same size as the shared one. */
/* Quantized: the plan (no data is generated; the K-quant quantizers are slow) against
 * the shared file's tensors, by name (llama-quantize sorts them). */
static void compare_plan_with_shared(const char *preset, const char *type, const char *shared_rel) {
    struct tern_mkmodel_params p;
    CHECK_OK(tern_mkmodel_preset(preset, &p));
    assert_true(tern_mkmodel_parse_type(type, &p.wtype, &p.mix));
    p.vocab_path = th_shared_path("conformance/tokenizer/ggml-vocab-qwen-mini.gguf");
    struct tern_mkmodel_tensor *plan;
    uint32_t n;
    struct tern_mkmodel_stats s;
    CHECK_OK(tern_mkmodel_plan(&p, &plan, &n, &s));
    struct gguf_file *b = open_ok(th_shared_path(shared_rel));
    assert_int_equal(n, gguf_n_tensors(b));
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(b); i++) {
        const struct gguf_tensor *tb = gguf_tensor_at(b, i);
        const struct tern_mkmodel_tensor *ta = planned(plan, n, tb->name.ptr);
        if (ta->type != tb->type || ta->n_dims != tb->n_dims || memcmp(ta->ne, tb->ne, sizeof ta->ne))
            fail_msg("%s %s: '%s' is %s, the shared file has %s", preset, type, ta->name, tern_dtype_name(ta->type),
                     tern_dtype_name(tb->type));
        bytes += tb->size;
    }
    assert_int_equal(s.n_bytes, bytes);
    free(plan);
    gguf_close(b);
}

static void compare_with_shared(const char *preset, const char *type, const char *shared_rel, bool same_order) {
    struct tern_mkmodel_params p;
    CHECK_OK(tern_mkmodel_preset(preset, &p));
    char name[64];
    snprintf(name, sizeof name, "%s-random", preset);
    p.name = name;
    assert_true(tern_mkmodel_parse_type(type, &p.wtype, &p.mix));
    p.vocab_path = th_shared_path("conformance/tokenizer/ggml-vocab-qwen-mini.gguf");
    const char *path = tmp_path("cmp.gguf");
    CHECK_OK(tern_mkmodel_write(&p, path, NULL));
    struct gguf_file *a = open_ok(path), *b = open_ok(th_shared_path(shared_rel));
    assert_int_equal(gguf_n_tensors(a), gguf_n_tensors(b));
    for (uint64_t i = 0; i < gguf_n_tensors(b); i++) {
        const struct gguf_tensor *tb = gguf_tensor_at(b, i);
        const struct gguf_tensor *ta = same_order ? gguf_tensor_at(a, i) : gguf_find_tensor(a, tb->name.ptr);
        if (!ta || strcmp(ta->name.ptr, tb->name.ptr))
            fail_msg("%s %s: tensor %llu is '%s', shared has '%s'", preset, type, (unsigned long long)i,
                     ta ? ta->name.ptr : "(none)", tb->name.ptr);
        if (ta->type != tb->type || ta->n_dims != tb->n_dims || memcmp(ta->ne, tb->ne, sizeof ta->ne))
            fail_msg("%s %s: '%s' differs in type or shape (%s vs %s)", preset, type, ta->name.ptr,
                     tern_dtype_name(ta->type), tern_dtype_name(tb->type));
    }
    assert_int_equal(gguf_n_kv(a), gguf_n_kv(b));
    for (uint64_t i = 0; i < gguf_n_kv(b); i++) {
        const struct gguf_kv *kb = gguf_kv_at(b, i), *ka = gguf_find_kv(a, kb->key.ptr);
        if (!ka) fail_msg("%s %s: key '%s' missing", preset, type, kb->key.ptr);
        assert_int_equal(ka->type, kb->type);
        if (!strncmp(kb->key.ptr, "general.", 8)) continue;
        if (kb->type == GGUF_TYPE_ARRAY) {
            assert_int_equal(ka->v.arr.n, kb->v.arr.n);
        } else if (kb->type == GGUF_TYPE_STRING) {
            assert_string_equal(ka->v.str.ptr, kb->v.str.ptr);
        } else if (kb->type == GGUF_TYPE_FLOAT32) {
            assert_true(ka->v.f64 == kb->v.f64);
        } else {
            if (ka->v.u64 != kb->v.u64) fail_msg("%s: '%s' differs", preset, kb->key.ptr);
        }
    }
    assert_int_equal(gguf_file_size(a), gguf_file_size(b));
    gguf_close(a);
    gguf_close(b);
}

static void test_shared_tiny_models(void **state) {
    (void)state;
    compare_with_shared("tiny-qwen3", "f32", "models/tiny-qwen3-f32.gguf", true);
    compare_with_shared("tiny-qwen35", "f32", "models/tiny-qwen35-f32.gguf", true);
    /* llama-quantize sorts tensors by name, so quantized files are compared by name;
     * one is written in full (Q8_0 quantizes quickly), the others are planned. */
    compare_with_shared("tiny-qwen3", "q8_0", "models/tiny-qwen3-q8_0.gguf", false);
    compare_plan_with_shared("tiny-qwen3", "q4_0", "models/tiny-qwen3-q4_0.gguf");
    compare_plan_with_shared("tiny-qwen3", "q6_k", "models/tiny-qwen3-q6_k.gguf");
    compare_plan_with_shared("tiny-qwen3", "q4_k_m", "models/tiny-qwen3-q4_k_m.gguf");
    compare_plan_with_shared("tiny-qwen3", "iq4_xs", "models/tiny-qwen3-iq4_xs.gguf");
    compare_plan_with_shared("tiny-qwen3", "q2_k", "models/tiny-qwen3-q2_k.gguf"); /* llama-quantize's Q2_K mix */
    compare_plan_with_shared("tiny-qwen35", "q8_0", "models/tiny-qwen35-q8_0.gguf");
    compare_plan_with_shared("tiny-qwen35", "q4_k_m", "models/tiny-qwen35-q4_k_m.gguf");
    /* gpt-oss: biases, sinks, the window and YaRN keys; MXFP4 experts, Q8_0 elsewhere */
    compare_with_shared("tiny-gptoss", "f32", "models/tiny-gptoss-f32.gguf", true);
    compare_plan_with_shared("tiny-gptoss", "mxfp4_moe", "models/tiny-gptoss-mxfp4.gguf");
    /* qwen3next: the fused ssm_ba, no rope sections, the unused feed_forward_length */
    compare_with_shared("tiny-qwen3next", "q8_0", "models/tiny-qwen3next-q8_0.gguf", false);
}

/* --vocab copies every tokenizer.* key verbatim; n_vocab comes from it. */
static void test_shared_vocab_copy(void **state) {
    (void)state;
    const char *vocab = th_shared_path("conformance/tokenizer/ggml-vocab-llama-spm.gguf");
    struct tern_mkmodel_params p;
    tern_mkmodel_defaults(TERN_MK_LLAMA, &p);
    p.n_layer = 1;
    p.vocab_path = vocab;
    struct tern_mkmodel_stats s;
    CHECK_OK(tern_mkmodel_write(&p, tmp_path("spm.gguf"), &s));
    struct gguf_file *a = open_ok(tmp_path("spm.gguf")), *v = open_ok(vocab);
    const struct gguf_kv *tok;
    CHECK_OK(gguf_get_arr(v, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tok));
    assert_int_equal(s.n_vocab, tok->v.arr.n);
    assert_shape(a, "token_embd.weight", 256, tok->v.arr.n);
    int n_copied = 0;
    for (uint64_t i = 0; i < gguf_n_kv(v); i++) {
        const struct gguf_kv *kv = gguf_kv_at(v, i);
        if (strncmp(kv->key.ptr, "tokenizer.", 10)) continue;
        const struct gguf_kv *ka = gguf_find_kv(a, kv->key.ptr);
        if (!ka) fail_msg("'%s' was not copied", kv->key.ptr);
        assert_int_equal(ka->type, kv->type);
        if (kv->type == GGUF_TYPE_ARRAY) {
            assert_int_equal(ka->v.arr.n, kv->v.arr.n);
            for (uint64_t j = 0; j < kv->v.arr.n; j++) {
                if (kv->v.arr.type == GGUF_TYPE_STRING)
                    assert_memory_equal(ka->v.arr.strs[j].ptr, kv->v.arr.strs[j].ptr, kv->v.arr.strs[j].len + 1);
                else
                    assert_true(gguf_arr_get_f64(ka, j) == gguf_arr_get_f64(kv, j));
            }
        } else if (kv->type == GGUF_TYPE_STRING) {
            assert_string_equal(ka->v.str.ptr, kv->v.str.ptr);
        } else {
            assert_memory_equal(&ka->v, &kv->v, sizeof ka->v);
        }
        n_copied++;
    }
    assert_true(n_copied >= 8);
    gguf_close(a);

    /* Padding a copied vocabulary: tokens, types and scores grow with [PAD<id>]. */
    p.n_vocab = 40000;
    CHECK_OK(tern_mkmodel_write(&p, tmp_path("spm-pad.gguf"), &s));
    assert_int_equal(s.n_vocab, 40000);
    a = open_ok(tmp_path("spm-pad.gguf"));
    const struct gguf_kv *ta, *sc, *ty;
    CHECK_OK(gguf_get_arr(a, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &ta));
    CHECK_OK(gguf_get_arr(a, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, &sc));
    CHECK_OK(gguf_get_arr(a, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &ty));
    assert_int_equal(ta->v.arr.n, 40000);
    assert_int_equal(sc->v.arr.n, 40000);
    assert_int_equal(ty->v.arr.n, 40000);
    assert_string_equal(ta->v.arr.strs[39999].ptr, "[PAD39999]");
    assert_int_equal(gguf_arr_get_i64(ty, 39999), 5);
    assert_string_equal(ta->v.arr.strs[tok->v.arr.n - 1].ptr, tok->v.arr.strs[tok->v.arr.n - 1].ptr);
    gguf_close(a);
    gguf_close(v);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "shared")) {
        th_require_shared("models/tiny-qwen35-q4_k_m.gguf");
        th_require_shared("conformance/tokenizer/ggml-vocab-qwen-mini.gguf");
        const struct CMUnitTest shared[] = {
            cmocka_unit_test(test_shared_tiny_models),
            cmocka_unit_test(test_shared_vocab_copy),
        };
        return cmocka_run_group_tests(shared, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_same_bytes),
        cmocka_unit_test(test_qwen35_layout),
        cmocka_unit_test(test_other_archs),
        cmocka_unit_test(test_check_errors),
        cmocka_unit_test(test_weight_distributions),
        cmocka_unit_test(test_quantized_types),
        cmocka_unit_test(test_q4_k_m_mix),
        cmocka_unit_test(test_low_bit_mixes),
        cmocka_unit_test(test_builtin_vocab),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
