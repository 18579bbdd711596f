/* Shared model-test helpers (exact.h). */
#include "harness.h"
#include "exact.h"

#include "gguf/gguf.h"
#include "util/mem.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct tern_session *new_session(struct tern_model *m, uint32_t n_ctx, enum tern_kv_type kv) {
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.n_ctx = n_ctx;
    sp.kv_type = kv;
    struct tern_session *s = NULL;
    assert_int_equal(tern_session_new(m, &sp, &s), TERN_OK);
    return s;
}

int32_t *tx_prompt(size_t n) {
    const char *rel = "conformance/logits/tiny-qwen35-f32/p400.json";
    th_require_shared(rel);
    json_error_t err;
    json_t *j = json_load_file(th_shared_path(rel), 0, &err);
    if (!j) fail_msg("%s: %s", rel, err.text);
    json_t *ids = json_object_get(j, "prompt_ids");
    assert_true(json_array_size(ids) >= n);
    int32_t *toks = malloc(n * sizeof *toks);
    assert_non_null(toks);
    for (size_t i = 0; i < n; i++) toks[i] = (int32_t)json_integer_value(json_array_get(ids, i));
    json_decref(j);
    return toks;
}

struct run {
    float *logits; /* [n][n_vocab] */
    uint64_t hash;
    struct tern_hash_component comp[64];
    size_t n_comp;
};

/* chunk 0: one eval call per token (decoding); else one call with that n_chunk. */
static void run_prompt(struct tern_model *m, const int32_t *toks, size_t n, uint32_t chunk,
                       enum tern_kv_type kv, struct run *r) {
    const size_t nv = tern_model_info(m)->n_vocab;
    struct tern_session *s = new_session(m, 1024, kv);
    r->logits = malloc(n * nv * sizeof(float));
    assert_non_null(r->logits);
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
    r->hash = tern_session_hash(s);
    r->n_comp = tern_session_hash_components(s, r->comp, TERN_ARRAY_LEN(r->comp));
    assert_true(r->n_comp <= TERN_ARRAY_LEN(r->comp));
    tern_session_free(s);
}

void tx_check_exact(const char *label, const char *path, enum tern_kv_type kv, size_t n) {
    struct tern_model *models[3];
    for (int t = 0; t < 3; t++) {
        struct tern_model_params mp;
        tern_model_params_default(&mp);
        mp.path = path;
        mp.n_threads = t + 1;
        models[t] = NULL;
        if (tern_model_load(&mp, &models[t])) print_error("%s: %s\n", path, tern_last_error());
        assert_non_null(models[t]);
    }
    const struct tern_model_info *info = tern_model_info(models[0]);
    const size_t nv = info->n_vocab;
    int32_t *toks = tx_prompt(n);
    for (size_t i = 0; i < n; i++) toks[i] %= (int32_t)nv;
    /* Reference: 1 thread, one eval call per token (decoding). Then every chunking on 1
     * thread, and on 2 and 3 threads a mix (the per-token ones are what costs). */
    static const struct {
        int threads;
        uint32_t chunk; /* 0: one eval call per token */
    } runs[] = {{1, 1}, {1, 7}, {1, 64}, {1, 512}, {2, 0}, {2, 7}, {2, 512}, {3, 1}, {3, 64}};
    struct run ref;
    run_prompt(models[0], toks, n, 0, kv, &ref);
    /* the components: tokens, K/V of the attention layers, conv + ssm of the others */
    size_t n_conv = 0, n_ssm = 0, n_k = 0;
    for (size_t i = 0; i < ref.n_comp; i++) {
        const char *dot = strrchr(ref.comp[i].name, '.');
        if (!dot) continue;
        n_conv += !strcmp(dot, ".conv");
        n_ssm += !strcmp(dot, ".ssm");
        n_k += !strcmp(dot, ".k");
    }
    assert_int_equal(n_conv, info->n_recurrent_layers);
    assert_int_equal(n_ssm, info->n_recurrent_layers);
    assert_int_equal(n_k, info->n_attn_layers);
    int n_runs = 0;
    for (size_t i = 0; i < TERN_ARRAY_LEN(runs); i++) {
        const int t = runs[i].threads - 1;
        const uint32_t chunk = runs[i].chunk;
        struct run r;
        run_prompt(models[t], toks, n, chunk, kv, &r);
        if (memcmp(r.logits, ref.logits, n * nv * sizeof(float)) != 0 || r.hash != ref.hash) {
            size_t bad = 0;
            while (bad < n * nv && r.logits[bad] == ref.logits[bad]) bad++;
            print_error("%s: %d threads, chunk %u: differs from 1 thread token by token (first logit "
                        "difference at position %zu)\n",
                        label, t + 1, chunk, bad / nv);
            for (size_t c = 0; c < r.n_comp; c++)
                if (r.comp[c].hash != ref.comp[c].hash) print_error("  component %s differs\n", r.comp[c].name);
            fail();
        }
        assert_int_equal(r.n_comp, ref.n_comp);
        free(r.logits);
        n_runs++;
    }
    print_message("%s, %s KV, %zu tokens: %d runs (1-3 threads; token by token, chunks 1, 7, 64, 512) "
                  "bit-identical, hash %016llx\n",
                  label, kv == TERN_KV_F32 ? "F32" : "F16", n, n_runs, (unsigned long long)ref.hash);
    free(ref.logits);
    for (int t = 0; t < 3; t++) tern_model_free(models[t]);
    free(toks);
}

const char *tx_mutated_model(const char *src_rel, const struct tx_mutation *mu, const char *file) {
    th_require_shared(src_rel);
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(th_shared_path(src_rel), NULL, &f), TERN_OK);
    struct gguf_writer *w = NULL;
    assert_int_equal(gguf_writer_new(&w), TERN_OK);
    bool key_set = false;
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        if (mu->key && !strcmp(kv->key.ptr, mu->key)) {
            assert_int_equal(gguf_writer_set_u32(w, mu->key, mu->key_val), TERN_OK);
            key_set = true;
        } else {
            assert_int_equal(gguf_writer_set_kv(w, kv), TERN_OK);
        }
    }
    if (mu->key && !key_set) assert_int_equal(gguf_writer_set_u32(w, mu->key, mu->key_val), TERN_OK);
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        if (mu->drop && !strcmp(t->name.ptr, mu->drop)) continue;
        uint64_t ne[GGUF_MAX_DIMS];
        memcpy(ne, t->ne, sizeof ne);
        uint64_t size = t->size;
        if (mu->reshape && !strcmp(t->name.ptr, mu->reshape)) {
            size = size / ne[0] * mu->new_ne0;
            ne[0] = mu->new_ne0;
        }
        assert_int_equal(gguf_writer_add_tensor(w, t->name.ptr, t->type, t->n_dims, ne, t->data, size), TERN_OK);
    }
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", th_tmpdir(), file);
    assert_int_equal(gguf_writer_write(w, path), TERN_OK);
    gguf_writer_free(w);
    gguf_close(f);
    return path;
}

void tx_expect_load_error(const char *src_rel, const struct tx_mutation *mu, enum tern_status want,
                          const char *const *needles) {
    const char *path = tx_mutated_model(src_rel, mu, "bad.gguf");
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = path;
    mp.n_threads = 1;
    struct tern_model *m = (struct tern_model *)1;
    assert_int_equal(tern_model_load(&mp, &m), want);
    assert_null(m);
    print_message("load error: %s\n", tern_last_error());
    for (const char *const *n = needles; *n; n++) assert_non_null(strstr(tern_last_error(), *n));
}

