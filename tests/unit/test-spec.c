/* Speculative decoding (src/server/spec.c, docs/spec.md):
 * - prompt lookup: the longest of the 3/2/1-token patterns, the most recent match, the
 *   cap, no match;
 * - the speculative-sampling rule: the draft's acceptance rate is p(draft), the tokens'
 *   distribution is the target's, a draft outside the candidates is a plain draw;
 * - greedy output bit-identical to plain decoding, token by token, with prompt lookup
 *   and with the oracle (all accepted, all rejected, half), draft lengths 1, 2, 4, 8, on
 *   every model of the kit (attention-only, hybrid, MoE; F32 and quantized); the state
 *   hash after the request equals the plain run's, also when the loop stops in the
 *   middle of accepted drafts (a stop string); resumed after speculation equals cold;
 * - sampling with a fixed seed is deterministic run to run;
 * - a cancelled verify leaves the accepted tokens. */
#include "harness.h"

#include "grammar/grammar.h"
#include "server/spec.h"
#include "tern.h"
#include "util/mem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- prompt lookup ---------------------------------------------------------------- */

static void test_ngram(void **unused) {
    (void)unused;
    int32_t out[8];
    /* ... 7 8 9 | 1 2 [3 4 5] ... 1 2 + last 3: the 3-gram "1 2 3" matches at 3 */
    const int32_t a[] = {7, 8, 9, 1, 2, 3, 4, 5, 6, 1, 2};
    size_t n = spec_ngram_draft(a, 11, 3, 8, out);
    assert_int_equal(n, 6); /* up to the end of the context */
    const int32_t want_a[] = {4, 5, 6, 1, 2, 3};
    assert_memory_equal(out, want_a, 6 * sizeof *out);
    /* the cap */
    assert_int_equal(spec_ngram_draft(a, 11, 3, 2, out), 2);
    assert_int_equal(out[0], 4);
    assert_int_equal(out[1], 5);
    /* the most recent match of the pattern wins: "5 6" occurs twice, last followed by 9 */
    const int32_t b[] = {5, 6, 1, 5, 6, 9, 4, 5};
    assert_int_equal(spec_ngram_draft(b, 8, 6, 1, out), 1);
    assert_int_equal(out[0], 9);
    /* no 3-gram "x 4 7", no 2-gram "4 7", the 1-gram "7" occurs: its continuation */
    const int32_t c[] = {7, 2, 3, 1, 4};
    assert_int_equal(spec_ngram_draft(c, 5, 7, 3, out), 3);
    assert_int_equal(out[0], 2);
    assert_int_equal(out[1], 3);
    assert_int_equal(out[2], 1);
    /* a 3-gram match is preferred to a more recent 1-gram one */
    const int32_t d[] = {1, 2, 3, 10, 9, 3, 11, 1, 2};
    assert_int_equal(spec_ngram_draft(d, 9, 3, 1, out), 1);
    assert_int_equal(out[0], 10);
    /* nothing: a token never seen, an empty context, max 0 */
    assert_int_equal(spec_ngram_draft(c, 5, 99, 3, out), 0);
    assert_int_equal(spec_ngram_draft(NULL, 0, 5, 3, out), 0);
    assert_int_equal(spec_ngram_draft(a, 11, 3, 0, out), 0);
    /* a run of one token continues itself */
    const int32_t e[] = {4, 4, 4};
    assert_int_equal(spec_ngram_draft(e, 3, 4, 5, out), 1);
    assert_int_equal(out[0], 4);
    assert_true(spec_mode_parse("ngram", &(enum spec_mode){0}));
    assert_false(spec_mode_parse("oracle", &(enum spec_mode){0}));
}

/* ---- the sampling rule ------------------------------------------------------------ */

static struct tern_sampler *mk_sampler(float temp, int top_k, uint64_t seed, uint32_t nv) {
    struct tern_sampler_params p;
    tern_sampler_params_default(&p);
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    struct tern_sampler *s = NULL;
    assert_int_equal(tern_sampler_new(&p, nv, &s), TERN_OK);
    return s;
}

static void test_sampling_rule(void **unused) {
    (void)unused;
    enum { V = 6, N = 200000 };
    const float l[V] = {1.0f, 0.2f, 2.0f, -1.0f, 0.7f, 1.5f};
    double p[V], z = 0;
    for (int i = 0; i < V; i++) z += exp(l[i]);
    for (int i = 0; i < V; i++) p[i] = exp(l[i]) / z;
    for (int top_k = 0; top_k <= 4; top_k += 4) {
        for (int32_t draft = 0; draft < V; draft += 3) { /* a likely and an unlikely draft */
            struct tern_sampler *s = mk_sampler(1.0f, top_k, 7, V);
            double q[V] = {0}, zk = 0;
            for (int i = 0; i < V; i++) {
                int rank = 0;
                for (int j = 0; j < V; j++) rank += l[j] > l[i];
                q[i] = !top_k || rank < top_k ? p[i] : 0;
                zk += q[i];
            }
            for (int i = 0; i < V; i++) q[i] /= zk;
            long cnt[V] = {0}, n_acc = 0;
            for (int it = 0; it < N; it++) {
                bool acc;
                int32_t t = tern_sampler_sample_draft(s, l, NULL, 0, draft, &acc);
                assert_true(t >= 0 && t < V);
                assert_true(acc == (t == draft));
                cnt[t]++;
                n_acc += acc;
            }
            /* the draft is accepted with probability q(draft) and every token comes out
             * with its probability under the target (4.5 sigma of a binomial) */
            for (int i = 0; i < V; i++) {
                const double sd = sqrt(q[i] * (1 - q[i]) / N) + 1e-9;
                assert_true(fabs((double)cnt[i] / N - q[i]) < 4.5 * sd + 1e-6);
            }
            assert_true(fabs((double)n_acc / N - q[draft]) < 4.5 * sqrt(q[draft] * (1 - q[draft]) / N) + 1e-6);
            tern_sampler_free(s);
        }
    }
    /* a draft outside the top-k candidates: the same draws as plain sampling */
    struct tern_sampler *a = mk_sampler(1.0f, 2, 11, V), *b = mk_sampler(1.0f, 2, 11, V);
    for (int it = 0; it < 1000; it++) {
        bool acc;
        assert_int_equal(tern_sampler_sample_draft(a, l, NULL, 0, 3, &acc), tern_sampler_sample(b, l, NULL, 0));
        assert_false(acc);
    }
    tern_sampler_free(a);
    tern_sampler_free(b);
    /* greedy: the argmax, accepted only when it is the draft */
    struct tern_sampler *g = mk_sampler(0.0f, 0, 1, V);
    bool acc;
    assert_int_equal(tern_sampler_sample_draft(g, l, NULL, 0, 2, &acc), 2);
    assert_true(acc);
    assert_int_equal(tern_sampler_sample_draft(g, l, NULL, 0, 5, &acc), 2);
    assert_false(acc);
    tern_sampler_free(g);
}

/* ---- decoding on the kit's models ------------------------------------------------- */

#define N_GEN 40
#define N_PROMPT 24

static const char *const g_models[] = {
    "models/stories260K.gguf",        "models/tiny-qwen3-f32.gguf",      "models/tiny-qwen3-q4_k_m.gguf",
    "models/tiny-qwen3-iq4_xs.gguf",
    "models/tiny-qwen35-f32.gguf",    "models/tiny-qwen35-q8_0.gguf",    "models/tiny-qwen35-q4_k_m.gguf",
    "models/tiny-qwen35moe-f32.gguf", "models/tiny-qwen3moe-q8_0.gguf",
};

static struct tern_model *load(const char *rel) {
    const char *path = th_shared_path(rel);
    struct stat stt;
    if (!path || stat(path, &stt) != 0) {
        printf("# %s absent from the kit: skipped\n", rel);
        return NULL;
    }
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = path;
    mp.n_threads = 2;
    struct tern_model *m = NULL;
    assert_int_equal(tern_model_load(&mp, &m), TERN_OK);
    return m;
}

static struct tern_session *primed(struct tern_model *m, const int32_t *prompt, size_t n);

/* A prompt that holds what the model likes to say, so that prompt lookup finds matches
 * even on a random-weight model: P0 (8 ids, modulo the vocabulary), the 8 tokens greedy
 * decoding continues it with, P0 again. */
static void mk_prompt(struct tern_model *m, int32_t *p) {
    const uint32_t nv = tern_model_info(m)->n_vocab;
    for (int i = 0; i < 8; i++) p[i] = p[16 + i] = (int32_t)((1 + i * 13) % nv);
    struct tern_session *s = primed(m, p, 8);
    struct tern_sampler_params sp;
    tern_sampler_params_default(&sp);
    sp.temperature = 0.0f;
    struct tern_sampler *smp = NULL;
    assert_int_equal(tern_sampler_new(&sp, nv, &smp), TERN_OK);
    for (int i = 8; i < 16; i++) {
        p[i] = tern_sampler_sample(smp, tern_session_logits(s), NULL, 0);
        assert_int_equal(tern_session_eval(s, &p[i], 1, NULL), TERN_OK);
    }
    tern_sampler_free(smp);
    tern_session_free(s);
}

static struct tern_session *primed(struct tern_model *m, const int32_t *prompt, size_t n) {
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.n_ctx = 256;
    struct tern_session *s = NULL;
    assert_int_equal(tern_session_new(m, &sp, &s), TERN_OK);
    assert_int_equal(tern_session_eval(s, prompt, n, NULL), TERN_OK);
    return s;
}

struct run {
    int32_t toks[N_GEN];
    uint64_t hash;
    uint32_t n_past;
    struct spec_stats st;
};

/* The decode loop as the server runs it: stops after n_stop tokens without telling the
 * decoder in advance (a stop string), or when the caller's budget n_gen is spent. The
 * session is left for the caller (freed when keep is NULL). */
static void decode(struct tern_model *m, const int32_t *prompt, const struct spec_params *spp, float temp,
                   uint64_t seed, int n_stop, struct run *r, struct tern_session **keep) {
    struct tern_session *s = primed(m, prompt, N_PROMPT);
    struct tern_sampler *smp = mk_sampler(temp, 0, seed, tern_model_info(m)->n_vocab);
    struct spec_dec d;
    assert_int_equal(spec_dec_init(&d, s, smp, spp, NULL), TERN_OK);
    memset(r->toks, 0xff, sizeof r->toks);
    for (int i = 0; i < N_GEN; i++) {
        r->toks[i] = spec_next(&d);
        if (i + 1 == N_GEN || i + 1 == n_stop) break;
        /* the budget as the server passes it; a stop string is not known in advance */
        assert_int_equal(spec_accept(&d, r->toks[i], (size_t)(N_GEN - i - 1)), TERN_OK);
        assert_int_equal(spec_n_past(&d), N_PROMPT + i + 1);
    }
    assert_int_equal(spec_finish(&d), TERN_OK);
    assert_int_equal(spec_finish(&d), TERN_OK); /* idempotent */
    /* the finished session is detached from the decoder's trail: a hybrid one refuses a
     * rewind again */
    if (tern_model_info(m)->hybrid && tern_session_n_past(s) > N_PROMPT)
        assert_int_equal(tern_session_rewind(s, tern_session_n_past(s) - 1), TERN_ERR_STATE);
    r->n_past = tern_session_n_past(s);
    r->hash = tern_session_hash(s);
    r->st = d.st;
    spec_dec_free(&d);
    tern_sampler_free(smp);
    if (keep) *keep = s;
    else tern_session_free(s);
}

/* The plain loop, written out without the decoder. */
static void decode_raw(struct tern_model *m, const int32_t *prompt, struct run *r) {
    struct tern_session *s = primed(m, prompt, N_PROMPT);
    struct tern_sampler *smp = mk_sampler(0.0f, 0, 1, tern_model_info(m)->n_vocab);
    for (int i = 0; i < N_GEN; i++) {
        r->toks[i] = tern_sampler_sample(smp, tern_session_logits(s), tern_session_tokens(s), tern_session_n_past(s));
        if (i + 1 < N_GEN) assert_int_equal(tern_session_eval(s, &r->toks[i], 1, NULL), TERN_OK);
    }
    r->n_past = tern_session_n_past(s);
    r->hash = tern_session_hash(s);
    tern_sampler_free(smp);
    tern_session_free(s);
}

/* The hash of a cold session over prompt + gen[0..n). */
static uint64_t cold_hash(struct tern_model *m, const int32_t *prompt, const int32_t *gen, size_t n) {
    int32_t all[N_PROMPT + N_GEN];
    memcpy(all, prompt, sizeof(int32_t) * N_PROMPT);
    memcpy(all + N_PROMPT, gen, n * sizeof *gen);
    struct tern_session *s = primed(m, all, N_PROMPT + n);
    uint64_t h = tern_session_hash(s);
    tern_session_free(s);
    return h;
}

static void check_same(const char *label, const struct run *plain, const struct run *r) {
    for (int i = 0; i < N_GEN; i++)
        if (plain->toks[i] != r->toks[i]) fail_msg("%s: token %d is %d, plain decoding gives %d", label, i, r->toks[i], plain->toks[i]);
    if (plain->n_past != r->n_past || plain->hash != r->hash)
        fail_msg("%s: state after the request %u/%016llx, plain %u/%016llx", label, r->n_past,
                 (unsigned long long)r->hash, plain->n_past, (unsigned long long)plain->hash);
}

static void test_greedy_identical(void **unused) {
    (void)unused;
    static const uint32_t lens[] = {1, 2, 4, 8};
    size_t n_models = 0;
    for (size_t im = 0; im < TERN_ARRAY_LEN(g_models); im++) {
        struct tern_model *m = load(g_models[im]);
        if (!m) continue;
        n_models++;
        int32_t prompt[N_PROMPT];
        mk_prompt(m, prompt);
        struct run plain, raw, r;
        decode(m, prompt, &(struct spec_params){.mode = SPEC_OFF}, 0.0f, 1, 0, &plain, NULL);
        decode_raw(m, prompt, &raw);
        check_same("off vs the raw loop", &raw, &plain);
        assert_int_equal(plain.st.drafted, 0);
        assert_int_equal(plain.hash, cold_hash(m, prompt, plain.toks, N_GEN - 1));
        uint64_t ngram_drafted = 0;
        for (size_t il = 0; il < TERN_ARRAY_LEN(lens); il++) {
            char label[160];
            snprintf(label, sizeof label, "%s ngram max %u", g_models[im], lens[il]);
            decode(m, prompt, &(struct spec_params){.mode = SPEC_NGRAM, .max = lens[il]}, 0.0f, 1, 0, &r, NULL);
            check_same(label, &plain, &r);
            assert_true(r.st.accepted <= r.st.drafted);
            ngram_drafted += r.st.drafted;
            for (uint32_t pct = 0; pct <= 100; pct += 50) {
              /* hybrid models: the state trail and the checkpoint + re-read alternative */
              for (int refeed = 0; refeed <= (int)tern_model_info(m)->hybrid; refeed++) {
                const struct spec_oracle o = {.toks = plain.toks, .n = N_GEN, .reject_pct = pct, .seed = 5};
                snprintf(label, sizeof label, "%s oracle %u%% wrong, max %u%s", g_models[im], pct, lens[il],
                         refeed ? ", refeed" : "");
                decode(m, prompt,
                       &(struct spec_params){.mode = SPEC_ORACLE, .max = lens[il], .oracle = &o, .refeed = refeed},
                       0.0f, 1, 0, &r, NULL);
                check_same(label, &plain, &r);
                if (!refeed) assert_int_equal(r.st.refed, 0);
                assert_true(r.st.drafted > 0);
                if (pct == 0) {
                    /* every draft accepted: a round per max + 1 tokens */
                    assert_int_equal(r.st.accepted, r.st.drafted);
                    assert_int_equal(r.st.refed, 0);
                    assert_true(r.st.rounds <= (N_GEN + lens[il]) / (lens[il] + 1));
                } else if (pct == 100) {
                    assert_int_equal(r.st.accepted, 0);
                    if (refeed) assert_int_equal(r.st.refed, r.st.rounds);
                } else {
                    assert_true(r.st.accepted > 0 && r.st.accepted < r.st.drafted);
                }
              }
            }
        }
        printf("# %s: prompt lookup drafted %llu\n", g_models[im], (unsigned long long)ngram_drafted);
        /* the attention-only models repeat themselves and draw on the prompt, so prompt
         * lookup has something to draft (the random-weight hybrids rarely do: the oracle
         * covers their partial acceptance) */
        if (!tern_model_info(m)->hybrid) assert_true(ngram_drafted > 0);
        tern_model_free(m);
    }
    if (!n_models) skip();
}

/* A stop string inside accepted drafts: the session holds exactly the tokens before the
 * last one taken, as a plain loop leaves it, whatever the decoder had verified beyond. */
static void test_stop_midway(void **unused) {
    (void)unused;
    static const int stops[] = {1, 2, 3, 4, 6, 9, 10, 17};
    size_t n_models = 0;
    for (size_t im = 0; im < TERN_ARRAY_LEN(g_models); im++) {
        struct tern_model *m = load(g_models[im]);
        if (!m) continue;
        n_models++;
        int32_t prompt[N_PROMPT];
        mk_prompt(m, prompt);
        struct run plain, r;
        decode(m, prompt, &(struct spec_params){.mode = SPEC_OFF}, 0.0f, 1, 0, &plain, NULL);
        for (size_t is = 0; is < TERN_ARRAY_LEN(stops); is++) {
            const int n = stops[is];
            const uint64_t want = cold_hash(m, prompt, plain.toks, (size_t)n - 1);
            for (uint32_t pct = 0; pct <= 50; pct += 50) {
                const struct spec_oracle o = {.toks = plain.toks, .n = N_GEN, .reject_pct = pct, .seed = 9};
                const bool refeed = tern_model_info(m)->hybrid && is % 2;
                decode(m, prompt, &(struct spec_params){.mode = SPEC_ORACLE, .max = 8, .oracle = &o, .refeed = refeed},
                       0.0f, 1, n, &r, NULL);
                assert_memory_equal(r.toks, plain.toks, (size_t)n * sizeof *r.toks);
                assert_int_equal(r.n_past, N_PROMPT + n - 1);
                if (r.hash != want)
                    fail_msg("%s: stopped after %d tokens (oracle %u%% wrong): state %016llx, cold %016llx",
                             g_models[im], n, pct, (unsigned long long)r.hash, (unsigned long long)want);
            }
        }
        tern_model_free(m);
    }
    if (!n_models) skip();
}

/* After a speculative request the session goes on like a cold one: the next turn's
 * tokens, then plain decoding, give the same tokens and state. */
static void test_resumed_equals_cold(void **unused) {
    (void)unused;
    size_t n_models = 0;
    for (size_t im = 0; im < TERN_ARRAY_LEN(g_models); im++) {
        struct tern_model *m = load(g_models[im]);
        if (!m) continue;
        n_models++;
        int32_t prompt[N_PROMPT];
        mk_prompt(m, prompt);
        struct run plain, r;
        decode(m, prompt, &(struct spec_params){.mode = SPEC_OFF}, 0.0f, 1, 0, &plain, NULL);
        const struct spec_oracle o = {.toks = plain.toks, .n = N_GEN, .reject_pct = 50, .seed = 3};
        struct tern_session *s = NULL;
        decode(m, prompt, &(struct spec_params){.mode = SPEC_ORACLE, .max = 4, .oracle = &o}, 0.0f, 1, 0, &r, &s);
        /* the next turn: the last token, a few more, and a speculative continuation */
        int32_t next[6];
        memcpy(next, &plain.toks[N_GEN - 1], sizeof *next);
        for (int i = 1; i < 6; i++) next[i] = prompt[i];
        assert_int_equal(tern_session_eval(s, next, 6, NULL), TERN_OK);
        int32_t all[N_PROMPT + N_GEN + 6];
        memcpy(all, prompt, sizeof prompt);
        memcpy(all + N_PROMPT, plain.toks, sizeof plain.toks);
        memcpy(all + N_PROMPT + N_GEN, next + 1, 5 * sizeof *next);
        struct tern_session *cold = primed(m, all, N_PROMPT + N_GEN + 5);
        assert_int_equal(tern_session_n_past(s), tern_session_n_past(cold));
        assert_int_equal(tern_session_hash(s), tern_session_hash(cold));
        const uint32_t nv = tern_model_info(m)->n_vocab;
        assert_memory_equal(tern_session_logits(s), tern_session_logits(cold), nv * sizeof(float));
        /* both go on: speculative on the resumed one, plain on the cold one */
        struct tern_sampler *a = mk_sampler(0.0f, 0, 1, nv), *b = mk_sampler(0.0f, 0, 1, nv);
        struct spec_dec da, db;
        assert_int_equal(spec_dec_init(&da, s, a, &(struct spec_params){.mode = SPEC_NGRAM, .max = 4}, NULL), TERN_OK);
        assert_int_equal(spec_dec_init(&db, cold, b, &(struct spec_params){.mode = SPEC_OFF}, NULL), TERN_OK);
        for (int i = 0; i < 16; i++) {
            const int32_t ta = spec_next(&da), tb = spec_next(&db);
            assert_int_equal(ta, tb);
            assert_int_equal(spec_accept(&da, ta, 100), TERN_OK);
            assert_int_equal(spec_accept(&db, tb, 100), TERN_OK);
        }
        assert_int_equal(spec_finish(&da), TERN_OK);
        assert_int_equal(spec_finish(&db), TERN_OK);
        assert_int_equal(tern_session_hash(s), tern_session_hash(cold));
        spec_dec_free(&da);
        spec_dec_free(&db);
        tern_sampler_free(a);
        tern_sampler_free(b);
        tern_session_free(s);
        tern_session_free(cold);
        tern_model_free(m);
    }
    if (!n_models) skip();
}

/* The state trail of an eval (tern_eval_opts.rec_trail): the eval's results do not
 * change, and rewinding to any position it reached gives the cold state there; without
 * a trail, or beyond it, a hybrid session still refuses. */
static void test_state_trail(void **unused) {
    (void)unused;
    size_t n_models = 0;
    for (size_t im = 0; im < TERN_ARRAY_LEN(g_models); im++) {
        struct tern_model *m = load(g_models[im]);
        if (!m) continue;
        const struct tern_model_info *info = tern_model_info(m);
        if (!info->hybrid) {
            tern_model_free(m);
            continue;
        }
        n_models++;
        int32_t prompt[N_PROMPT];
        mk_prompt(m, prompt);
        enum { K = 9 };
        uint8_t *trail = tern_malloc(K * info->recurrent_bytes);
        float *la = tern_malloc((size_t)K * info->n_vocab * sizeof(float)), *lb = tern_malloc((size_t)K * info->n_vocab * sizeof(float));
        struct tern_session *a = primed(m, prompt, N_PROMPT - K), *b = primed(m, prompt, N_PROMPT - K);
        assert_int_equal(tern_session_eval(a, prompt + N_PROMPT - K, K, &(struct tern_eval_opts){.logits_all = la, .rec_trail = trail}), TERN_OK);
        assert_int_equal(tern_session_eval(b, prompt + N_PROMPT - K, K, &(struct tern_eval_opts){.logits_all = lb, .n_chunk = 4}), TERN_OK);
        assert_memory_equal(la, lb, (size_t)K * info->n_vocab * sizeof(float));
        assert_int_equal(tern_session_hash(a), tern_session_hash(b));
        /* before the eval's first token: not in the trail */
        assert_int_equal(tern_session_rewind(a, N_PROMPT - K), TERN_ERR_STATE);
        assert_int_equal(tern_session_rewind(b, N_PROMPT - 2), TERN_ERR_STATE);
        for (uint32_t p = N_PROMPT - 1; p > N_PROMPT - K; p -= 3) {
            assert_int_equal(tern_session_rewind(a, p), TERN_OK);
            struct tern_session *cold = primed(m, prompt, p);
            assert_int_equal(tern_session_hash(a), tern_session_hash(cold));
            tern_session_free(cold);
        }
        /* dropping it, or the next eval, forgets the trail */
        assert_int_equal(tern_session_eval(b, prompt, 3, &(struct tern_eval_opts){.rec_trail = trail}), TERN_OK);
        tern_session_drop_trail(b);
        assert_int_equal(tern_session_rewind(b, tern_session_n_past(b) - 1), TERN_ERR_STATE);
        assert_int_equal(tern_session_eval(a, prompt, 2, NULL), TERN_OK);
        assert_int_equal(tern_session_rewind(a, tern_session_n_past(a) - 1), TERN_ERR_STATE);
        tern_session_free(a);
        tern_session_free(b);
        free(trail);
        free(la);
        free(lb);
        tern_model_free(m);
    }
    if (!n_models) skip();
}

/* Sampling with a fixed seed: the same tokens run to run, for each source. */
static void test_sampling_deterministic(void **unused) {
    (void)unused;
    struct tern_model *m = load("models/tiny-qwen35-f32.gguf");
    if (!m) m = load("models/stories260K.gguf");
    if (!m) skip();
    int32_t prompt[N_PROMPT];
    mk_prompt(m, prompt);
    struct run plain, r1, r2;
    decode(m, prompt, &(struct spec_params){.mode = SPEC_OFF}, 0.9f, 42, 0, &plain, NULL);
    const struct spec_oracle o = {.toks = plain.toks, .n = N_GEN, .reject_pct = 0, .seed = 1};
    const struct spec_params ps[] = {{.mode = SPEC_NGRAM, .max = 4}, {.mode = SPEC_ORACLE, .max = 4, .oracle = &o}};
    for (size_t i = 0; i < TERN_ARRAY_LEN(ps); i++) {
        decode(m, prompt, &ps[i], 0.9f, 42, 0, &r1, NULL);
        decode(m, prompt, &ps[i], 0.9f, 42, 0, &r2, NULL);
        assert_memory_equal(r1.toks, r2.toks, sizeof r1.toks);
        assert_int_equal(r1.hash, r2.hash);
        if (ps[i].mode == SPEC_ORACLE) assert_true(r1.st.drafted > 0);
        /* the session holds the prompt and the tokens taken, whatever was drafted */
        assert_int_equal(r1.hash, cold_hash(m, prompt, r1.toks, N_GEN - 1));
    }
    tern_model_free(m);
}

/* A cancel seen before a verify chunk: nothing is consumed, the accepted tokens stay. */
static void test_cancel(void **unused) {
    (void)unused;
    struct tern_model *m = load("models/tiny-qwen35-f32.gguf");
    if (!m) skip();
    int32_t prompt[N_PROMPT];
    mk_prompt(m, prompt);
    struct run plain;
    decode(m, prompt, &(struct spec_params){.mode = SPEC_OFF}, 0.0f, 1, 0, &plain, NULL);
    const struct spec_oracle o = {.toks = plain.toks, .n = N_GEN, .reject_pct = 50, .seed = 3};
    struct tern_session *s = primed(m, prompt, N_PROMPT);
    struct tern_sampler *smp = mk_sampler(0.0f, 0, 1, tern_model_info(m)->n_vocab);
    atomic_int cancel = 0;
    struct spec_dec d;
    assert_int_equal(spec_dec_init(&d, s, smp, &(struct spec_params){.mode = SPEC_ORACLE, .max = 4, .oracle = &o},
                                   &cancel),
                     TERN_OK);
    int i = 0;
    enum tern_status st = TERN_OK;
    for (; i < N_GEN - 1; i++) {
        const int32_t t = spec_next(&d);
        assert_int_equal(t, plain.toks[i]);
        if (i == 7) atomic_store(&cancel, 1);
        st = spec_accept(&d, t, 100);
        if (st) break;
    }
    assert_int_equal(st, TERN_ERR_CANCELLED);
    assert_int_equal(spec_finish(&d), TERN_OK);
    /* the token whose verify was cancelled is not in the session */
    assert_int_equal(tern_session_n_past(s), N_PROMPT + i);
    assert_int_equal(tern_session_hash(s), cold_hash(m, prompt, plain.toks, (size_t)i));
    spec_dec_free(&d);
    tern_sampler_free(smp);
    tern_session_free(s);
    tern_model_free(m);
}

/* A grammar handed to the decoder midway (a tool call opening) or from the start: what it
 * decided ahead without the grammar is dropped, every later position is decided under the
 * matcher's mask and taken into it, so tokens and state equal a plain loop that applies
 * the grammar from the same token on, for prompt lookup and the oracle (all accepted, half
 * wrong), draft lengths 4 and 8. */
static void grammar_plain(struct tern_model *m, const int32_t *prompt, const struct tern_gvocab *v,
                          const struct tern_grammar *g, int at, struct run *r) {
    const uint32_t nv = tern_model_info(m)->n_vocab;
    struct tern_session *s = primed(m, prompt, N_PROMPT);
    struct tern_sampler *smp = mk_sampler(0.0f, 0, 1, nv);
    uint32_t *mask = tern_malloc((nv + 31) / 32 * sizeof *mask);
    struct tern_gmatch *gm = NULL;
    for (int i = 0; i < N_GEN; i++) {
        if (i == at) assert_int_equal(tern_gmatch_new(g, v, &gm), TERN_OK);
        const float *lg = tern_session_logits(s);
        if (gm) {
            enum tern_status st;
            assert_true(tern_gmatch_mask(gm, mask, &st) > 0);
            r->toks[i] = tern_sampler_sample_masked(smp, lg, mask, tern_session_tokens(s), tern_session_n_past(s));
            assert_true(tern_gmatch_accept_token(gm, r->toks[i]));
        } else {
            r->toks[i] = tern_sampler_sample(smp, lg, tern_session_tokens(s), tern_session_n_past(s));
        }
        if (i + 1 < N_GEN) assert_int_equal(tern_session_eval(s, &r->toks[i], 1, NULL), TERN_OK);
    }
    r->n_past = tern_session_n_past(s);
    r->hash = tern_session_hash(s);
    tern_gmatch_free(gm);
    free(mask);
    tern_sampler_free(smp);
    tern_session_free(s);
}

static void grammar_spec(struct tern_model *m, const int32_t *prompt, const struct tern_gvocab *v,
                         const struct tern_grammar *g, int at, const struct spec_params *spp, struct run *r) {
    const uint32_t nv = tern_model_info(m)->n_vocab;
    struct tern_session *s = primed(m, prompt, N_PROMPT);
    struct tern_sampler *smp = mk_sampler(0.0f, 0, 1, nv);
    uint32_t *mask = tern_malloc((nv + 31) / 32 * sizeof *mask);
    struct tern_gmatch *gm = NULL;
    struct spec_dec d;
    assert_int_equal(spec_dec_init(&d, s, smp, spp, NULL), TERN_OK);
    for (int i = 0; i < N_GEN; i++) {
        if (i == at) {
            assert_int_equal(tern_gmatch_new(g, v, &gm), TERN_OK);
            spec_set_grammar(&d, gm, mask, NULL);
        }
        r->toks[i] = spec_next(&d);
        assert_true(r->toks[i] >= 0);
        if (i + 1 == N_GEN) break;
        assert_int_equal(spec_accept(&d, r->toks[i], (size_t)(N_GEN - i - 1)), TERN_OK);
    }
    assert_int_equal(spec_finish(&d), TERN_OK);
    r->n_past = tern_session_n_past(s);
    r->hash = tern_session_hash(s);
    r->st = d.st;
    spec_dec_free(&d);
    tern_gmatch_free(gm);
    free(mask);
    tern_sampler_free(smp);
    tern_session_free(s);
}

static void test_grammar_midway(void **unused) {
    (void)unused;
    static const char src[] = "root ::= [a-z ]+";
    struct tern_grammar *g = NULL;
    assert_int_equal(tern_grammar_compile(src, sizeof src - 1, NULL, &g), TERN_OK);
    /* a real model, a quantized attention-only one, a hybrid (the state trail) */
    static const char *const models[] = {"models/stories260K.gguf", "models/tiny-qwen3-q4_k_m.gguf",
                                         "models/tiny-qwen35-f32.gguf"};
    size_t n_models = 0;
    for (size_t im = 0; im < TERN_ARRAY_LEN(models); im++) {
        struct tern_model *m = load(models[im]);
        if (!m) continue;
        n_models++;
        struct tern_gvocab *v = NULL;
        assert_int_equal(tern_gvocab_from_tokenizer(tern_model_tokenizer(m), &v), TERN_OK);
        int32_t prompt[N_PROMPT];
        mk_prompt(m, prompt);
        static const int ats[] = {0, 6};
        for (size_t ia = 0; ia < TERN_ARRAY_LEN(ats); ia++) {
            struct run plain, r, free_run;
            grammar_plain(m, prompt, v, g, ats[ia], &plain);
            /* the oracle proposes the constrained tokens after the hand-over and the free
             * ones before it, so drafts decided ahead of it are accepted and then dropped */
            decode(m, prompt, &(struct spec_params){.mode = SPEC_OFF}, 0.0f, 1, 0, &free_run, NULL);
            int32_t otoks[N_GEN];
            for (int i = 0; i < N_GEN; i++) otoks[i] = i < ats[ia] ? free_run.toks[i] : plain.toks[i];
            for (uint32_t max = 4; max <= 8; max *= 2) {
                for (uint32_t pct = 0; pct <= 50; pct += 50) {
                    const struct spec_oracle o = {.toks = otoks, .n = N_GEN, .reject_pct = pct, .seed = 9};
                    char label[160];
                    snprintf(label, sizeof label, "%s grammar from token %d, oracle %u%% wrong, max %u", models[im],
                             ats[ia], pct, max);
                    grammar_spec(m, prompt, v, g, ats[ia],
                                 &(struct spec_params){.mode = SPEC_ORACLE, .max = max, .oracle = &o}, &r);
                    check_same(label, &plain, &r);
                    assert_true(r.st.accepted > 0);
                }
            }
            char label[160];
            snprintf(label, sizeof label, "%s grammar from token %d, ngram max 4", models[im], ats[ia]);
            grammar_spec(m, prompt, v, g, ats[ia], &(struct spec_params){.mode = SPEC_NGRAM, .max = 4}, &r);
            check_same(label, &plain, &r);
        }
        tern_gvocab_free(v);
        tern_model_free(m);
    }
    tern_grammar_free(g);
    if (!n_models) skip();
}

/* The state trail's bound (--spec-trail): a hybrid's drafts shrink to what it holds (room
 * for 3 states: drafts of at most 2), and where it holds fewer than 2 states the decoder
 * restores a checkpoint and re-reads instead. Greedy output and the final state stay
 * those of plain decoding. */
static void test_trail_bound(void **unused) {
    (void)unused;
    size_t n_hybrid = 0;
    for (size_t im = 0; im < TERN_ARRAY_LEN(g_models); im++) {
        struct tern_model *m = load(g_models[im]);
        if (!m) continue;
        const size_t rb = tern_model_info(m)->recurrent_bytes;
        if (!tern_model_info(m)->hybrid || !rb) {
            tern_model_free(m);
            continue;
        }
        n_hybrid++;
        int32_t prompt[N_PROMPT];
        mk_prompt(m, prompt);
        struct run plain, r;
        decode(m, prompt, &(struct spec_params){.mode = SPEC_OFF}, 0.0f, 1, 0, &plain, NULL);
        const struct spec_oracle right = {.toks = plain.toks, .n = N_GEN, .reject_pct = 0, .seed = 5};
        const struct spec_oracle wrong = {.toks = plain.toks, .n = N_GEN, .reject_pct = 100, .seed = 5};
        char label[160];
        /* three states: drafts of 2 (every one accepted: 3 tokens a round) */
        snprintf(label, sizeof label, "%s trail of 3 states", g_models[im]);
        decode(m, prompt, &(struct spec_params){.mode = SPEC_ORACLE, .max = 8, .oracle = &right, .trail_bytes = 3 * rb},
               0.0f, 1, 0, &r, NULL);
        check_same(label, &plain, &r);
        assert_true(r.st.drafted > 0 && r.st.drafted <= 2 * r.st.rounds);
        assert_int_equal(r.st.refed, 0);
        /* the default bound holds --spec-max 8 for these tiny states: 8 a round */
        decode(m, prompt, &(struct spec_params){.mode = SPEC_ORACLE, .max = 8, .oracle = &right}, 0.0f, 1, 0, &r, NULL);
        check_same(label, &plain, &r);
        assert_true(r.st.drafted > 2 * r.st.rounds);
        /* one state: no trail, a checkpoint and a re-read after each rejection */
        snprintf(label, sizeof label, "%s trail of 1 state", g_models[im]);
        decode(m, prompt, &(struct spec_params){.mode = SPEC_ORACLE, .max = 8, .oracle = &wrong, .trail_bytes = rb},
               0.0f, 1, 0, &r, NULL);
        check_same(label, &plain, &r);
        assert_true(r.st.rounds > 0);
        assert_int_equal(r.st.refed, r.st.rounds);
        tern_model_free(m);
    }
    if (!n_hybrid) skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram),
        cmocka_unit_test(test_sampling_rule),
        cmocka_unit_test(test_greedy_identical),
        cmocka_unit_test(test_stop_midway),
        cmocka_unit_test(test_resumed_equals_cold),
        cmocka_unit_test(test_state_trail),
        cmocka_unit_test(test_sampling_deterministic),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_grammar_midway),
        cmocka_unit_test(test_trail_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
