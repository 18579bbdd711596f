/* Parity with the reference engine (llama.cpp) on the shared models: the rules of
 * conformance/README.md §4 (the numbers come from each JSON's "tolerance" object), for
 * every prompt of every model we run, plus stories260K's 40-token greedy story.
 * Arguments: "lite" (fewer models and prompts, for sanitizer builds), "vulkan" (the
 * models' sessions on a Vulkan device, tern_model_use_device: the same rules against the
 * same reference; the device's activations are F32, so a quantized model is held to the
 * default bounds, as an engine with F32 activations is).
 * Skips (exit 77) without the shared kit, or without a Vulkan device for "vulkan" unless
 * TERN_REQUIRE_VULKAN=1. */
#include "harness.h"

#include "tern.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Model stems of the shared kit this test checks. */
static const char *const stems[] = {
    "stories260K",      "tiny-qwen3-f32",  "tiny-qwen3-q8_0",   "tiny-qwen3-q4_0", "tiny-qwen3-q4_k_m",
    "tiny-qwen3-q6_k",  "tiny-qwen35-f32", "tiny-qwen35-q8_0", "tiny-qwen35-q4_k_m", "tiny-qwen3-iq4_xs",
    "tiny-qwen3moe-f32", "tiny-qwen3moe-q8_0", "tiny-qwen35moe-f32", "tiny-qwen35moe-q4_k_m",
    "tiny-gptoss-f32",  "tiny-gptoss-mxfp4",
    "tiny-qwen3-q2_k",  "tiny-qwen3-iq2_xs", "tiny-qwen3-lowbit-mix", "tiny-qwen3next-q8_0",
};

/* "lite" (the variant run under sanitizers): stories260K, three quantized qwen3 (Q4_K_M,
 * IQ4_XS, the low-bit mix) and the F32 qwen35, short prompts only. */
static bool lite;
static bool vulkan; /* "vulkan": the sessions on a Vulkan device */
static int dev = -1; /* its index */
static const char *only; /* "only=STEM": that model alone (for working on one) */

static int32_t argmax(const float *l, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return (int32_t)b;
}

static float *read_f32(const char *path, size_t n) {
    size_t len = 0;
    char *d = th_read_file(path, &len);
    if (!d) return NULL;
    if (len != n * sizeof(float)) fail_msg("%s: %zu bytes, expected %zu", path, len, n * sizeof(float));
    return (float *)d;
}

static int32_t *ids_of(json_t *arr, size_t *n) {
    *n = json_array_size(arr);
    int32_t *ids = malloc(sizeof(int32_t) * (*n ? *n : 1));
    for (size_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

static double num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    if (!v) fail_msg("reference JSON lacks '%s'", key);
    return json_number_value(v);
}

/* Checks one prompt; returns true on PASS and prints the figures. */
static bool check_prompt(struct tern_model *m, const char *dir, const char *json_name) {
    char path[8192];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, json_name) >= sizeof path) fail_msg("path too long");
    json_error_t jerr;
    json_t *R = json_load_file(path, 0, &jerr);
    if (!R) fail_msg("%s: %s", path, jerr.text);
    size_t n;
    int32_t *prompt = ids_of(json_object_get(R, "prompt_ids"), &n);
    const uint32_t nv = (uint32_t)num(R, "n_vocab");
    assert_int_equal(nv, tern_model_info(m)->n_vocab);
    assert_int_equal((size_t)num(R, "n_tokens"), n);
    json_t *tol = json_object_get(R, "tolerance");
    const bool f32 = !strcmp(json_string_value(json_object_get(tol, "kind")), "f32");
    json_t *lf = json_object_get(R, "logits_file");
    float *ref = NULL;
    if (json_is_string(lf)) {
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, json_string_value(lf)) >= sizeof path)
            fail_msg("path too long");
        ref = read_f32(path, n * nv);
        assert_non_null(ref);
    }
    json_t *margins = json_object_get(R, "margins"), *top5 = json_object_get(R, "top5");

    /* Candidate: the prompt in one eval with every position's logits, F32 KV cache
     * (the reference's setting), then 32 greedy tokens one at a time. */
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.kv_type = TERN_KV_F32;
    sp.n_ctx = (uint32_t)n + 64;
    struct tern_session *s;
    assert_int_equal(tern_session_new(m, &sp, &s), TERN_OK);
    float *cand = malloc(sizeof(float) * n * nv);
    struct tern_eval_opts o = {.logits_all = cand};
    assert_int_equal(tern_session_eval(s, prompt, n, &o), TERN_OK);
    size_t n_greedy_ref;
    int32_t *greedy_ref = ids_of(json_object_get(R, "greedy_ids"), &n_greedy_ref);
    json_t *g40 = json_object_get(R, "greedy_40");
    size_t n40 = 0;
    int32_t *ids40 = g40 ? ids_of(json_object_get(g40, "ids"), &n40) : NULL;
    const size_t n_gen = n40 > n_greedy_ref ? n40 : n_greedy_ref;
    int32_t *greedy = malloc(sizeof(int32_t) * n_gen);
    for (size_t i = 0; i < n_gen; i++) {
        greedy[i] = argmax(tern_session_logits(s), nv);
        assert_int_equal(tern_session_eval(s, &greedy[i], 1, NULL), TERN_OK);
    }
    tern_session_free(s);

    /* The rules (check_logits.py). */
    const double thr = f32 ? num(tol, "max_abs_rel_to_pos_max") : 0.0;
    double max_rel = 0, max_abs = 0, sq = 0;
    size_t cnt = 0, top1_dis = 0, top1_bad = 0, worst = 0;
    for (size_t p = 0; p < n; p++) {
        const float *c = cand + p * nv;
        double scale = 0, d = 0;
        int32_t ref_top;
        if (ref) {
            const float *r = ref + p * nv;
            for (uint32_t v = 0; v < nv; v++) {
                scale = fmax(scale, fabs(r[v]));
                const double e = (double)r[v] - c[v];
                sq += e * e;
                d = fmax(d, fabs(e));
            }
            cnt += nv;
            ref_top = argmax(r, nv);
        } else {
            json_t *t = json_array_get(top5, p), *tid = json_object_get(t, "ids"), *tv = json_object_get(t, "values");
            for (size_t i = 0; i < json_array_size(tid); i++) {
                const double rv = json_number_value(json_array_get(tv, i));
                const int64_t id = json_integer_value(json_array_get(tid, i));
                scale = fmax(scale, fabs(rv));
                const double e = rv - c[id];
                sq += e * e;
                d = fmax(d, fabs(e));
                cnt++;
            }
            ref_top = (int32_t)json_integer_value(json_array_get(tid, 0));
        }
        const double rel = scale > 0 ? d / scale : d;
        if (rel > max_rel) max_rel = rel, worst = p;
        max_abs = fmax(max_abs, d);
        if (argmax(c, nv) != ref_top) {
            top1_dis++;
            const double need = f32 ? 2 * thr * scale : num(tol, "top1_margin");
            if (json_number_value(json_array_get(margins, p)) >= need) top1_bad++;
        }
    }
    const double top1_frac = 1.0 - (double)top1_dis / (double)n;
    size_t agree = 0;
    while (agree < n_greedy_ref && greedy[agree] == greedy_ref[agree]) agree++;
    const size_t need_prefix = (size_t)num(tol, "greedy_required_prefix");
    bool ok = top1_bad == 0 && agree >= need_prefix;
    char fig[256];
    if (f32) {
        ok = ok && max_rel <= thr;
        snprintf(fig, sizeof fig, "max rel %.2e (bound %.0e, pos %zu)", max_rel, thr, worst);
    } else {
        const double rms_rel = sqrt(sq / (double)cnt) / num(R, "ref_logits_rms");
        const double bound = num(tol, "rms_rel_max"), strict = num(tol, "rms_rel_strict");
        ok = ok && rms_rel <= bound;
        if (n >= 100) ok = ok && top1_frac >= num(tol, "top1_min_frac");
        snprintf(fig, sizeof fig, "RMS rel %.4f (bound %.3f, strict %.3f: %s), max|diff| %.3g", rms_rel, bound, strict,
                 rms_rel <= strict ? "passes" : "fails", max_abs);
    }
    printf("  %-10s n=%3zu %s; top-1 %zu/%zu = %.3f (%zu clear-margin misses); greedy %zu/%zu (need %zu) -> %s\n",
           json_name, n, fig, n - top1_dis, n, top1_frac, top1_bad, agree, n_greedy_ref, need_prefix,
           ok ? "PASS" : "FAIL");
    if (ids40) {
        const bool same = !memcmp(greedy, ids40, n40 * sizeof(int32_t));
        printf("  %-10s greedy_40: %s\n", json_name, same ? "all 40 ids equal" : "DIFFERS");
        ok = ok && same;
    }
    free(prompt), free(ref), free(cand), free(greedy_ref), free(ids40), free(greedy);
    json_decref(R);
    return ok;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_parity(void **state) {
    (void)state;
    bool all = true;
    for (size_t i = 0; i < sizeof stems / sizeof stems[0]; i++) {
        if (lite && strcmp(stems[i], "stories260K") && strcmp(stems[i], "tiny-qwen3-q4_k_m") &&
            strcmp(stems[i], "tiny-qwen35-f32") && strcmp(stems[i], "tiny-qwen3-iq4_xs") &&
            strcmp(stems[i], "tiny-qwen3-lowbit-mix"))
            continue;
        if (only && strcmp(stems[i], only)) continue;
        char rel[256];
        snprintf(rel, sizeof rel, "models/%s.gguf", stems[i]);
        struct tern_model_params mp;
        tern_model_params_default(&mp);
        mp.path = th_shared_path(rel);
        mp.n_threads = 2;
        struct tern_model *m;
        if (tern_model_load(&mp, &m)) fail_msg("%s: %s", rel, tern_last_error());
        if (dev >= 0 && th_use_vulkan(m, dev, 64))
            fail_msg("%s on vulkan:%d: %s", rel, dev, tern_last_error());
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/conformance/logits/%s", th_shared_dir(), stems[i]);
        DIR *d = opendir(dir);
        assert_non_null(d);
        char *names[64];
        size_t nn = 0;
        for (struct dirent *e; (e = readdir(d)) && nn < 64;) {
            const size_t l = strlen(e->d_name);
            if (l > 5 && !strcmp(e->d_name + l - 5, ".json")) names[nn++] = strdup(e->d_name);
        }
        closedir(d);
        qsort(names, nn, sizeof *names, cmp_str);
        assert_true(nn > 0);
        printf("%s (%s):\n", stems[i], tern_model_device(m));
        for (size_t k = 0; k < nn; k++) {
            if (!lite || strcmp(stems[i], "stories260K") == 0 || !strcmp(names[k], "p16.json") ||
                !strcmp(names[k], "chat.json"))
                all &= check_prompt(m, dir, names[k]);
            free(names[k]);
        }
        tern_model_free(m);
    }
    assert_true(all);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "lite")) lite = true;
        else if (!strcmp(argv[i], "vulkan")) vulkan = true;
        else if (!strncmp(argv[i], "only=", 5)) only = argv[i] + 5;
        else {
            fprintf(stderr, "usage: %s [lite] [vulkan] [only=STEM]\n", argv[0]);
            return 2;
        }
    }
    th_require_shared("conformance/logits/stories260K/once.json");
    if (vulkan) dev = th_vulkan_device();
    tern_log_set_level(TERN_LOG_WARN);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_parity)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
