/* Multi-token prediction (Qwen3.5's nextn block; src/model/mtp.c, the SPEC_MTP source of
 * src/server/spec.c, docs/spec.md), on models `tern mkmodel --mtp 1` writes (qwen35 F32,
 * Q8_0 and Q4_K_M; qwen35moe F32):
 * - the block loads (has_mtp), a file without it loads as before, a partial or
 *   misshapen block is refused naming the tensor, a block declared without tensors
 *   loads without the head; --spec mtp without the head is refused;
 * - the hidden-state capture changes nothing in the main session, and is the same for
 *   any chunking; the head's logits, output hidden states and KV rows are the same fed
 *   in one chunk, row by row or in chunks of 7;
 * - greedy decoding with MTP drafts of at most 1, 2, 4, 8 tokens (state trail, and the
 *   checkpoint + re-read) gives the plain run's tokens, every one, and its state hash;
 *   with and without the prompt's rows fed to the head first; a stop inside the run
 *   leaves the cold state; resumed after speculation equals cold;
 *   the head's KV rows after a request are exactly those of a fresh head fed the main
 *   model's hidden states of the accepted tokens (rejected drafts dropped). */
#include "harness.h"

#include "backend/vulkan/vulkan.h"
#include "model/mkmodel.h"
#include "model/mtp.h"
#include "server/spec.h"
#include "tern.h"
#include "util/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_PROMPT 20
#define N_GEN 40

struct gen_model {
    const char *name;
    enum tern_mk_arch arch;
    enum tern_dtype wtype;
    enum tern_mk_mix mix;
    bool echo; /* tern_mkmodel_params.mtp_echo: drafts that get accepted */
};

static const struct gen_model g_models[] = {
    {"q35-mtp-f32", TERN_MK_QWEN35, TERN_DTYPE_F32, TERN_MK_UNIFORM, false},
    {"q35-mtp-q8_0", TERN_MK_QWEN35, TERN_DTYPE_Q8_0, TERN_MK_UNIFORM, false},
    {"q35-mtp-q4_k_m", TERN_MK_QWEN35, TERN_DTYPE_Q4_K, TERN_MK_Q4_K_M, false},
    {"q35moe-mtp-f32", TERN_MK_QWEN35MOE, TERN_DTYPE_F32, TERN_MK_UNIFORM, false},
    {"q35-echo-f32", TERN_MK_QWEN35, TERN_DTYPE_F32, TERN_MK_UNIFORM, true},
    {"q35-echo-q8_0", TERN_MK_QWEN35, TERN_DTYPE_Q8_0, TERN_MK_UNIFORM, true},
    {"q35moe-echo-f32", TERN_MK_QWEN35MOE, TERN_DTYPE_F32, TERN_MK_UNIFORM, true},
};

static const char *model_path(const char *name) {
    static char buf[8][512];
    static int ib;
    char *p = buf[ib++ % 8];
    snprintf(p, 512, "%s/%s.gguf", th_tmpdir(), name);
    return p;
}

/* Writes a small model: 4 layers (3 DeltaNet, 1 attention) + n_mtp MTP blocks. */
static const char *write_model(const struct gen_model *g, uint32_t n_mtp, const char *name) {
    struct tern_mkmodel_params p;
    tern_mkmodel_defaults(g->arch, &p);
    p.n_embd = 256;
    p.n_ff = 256;
    p.n_ctx = 4096;
    p.wtype = g->wtype;
    p.mix = g->mix;
    p.n_mtp = n_mtp;
    p.mtp_echo = g->echo ? 1 : 0;
    p.tied = g->echo; /* tied and weak layers: the model often repeats its input token */
    if (g->echo) p.n_layer = 8; /* ... but not always: drafts partly accepted */
    const char *path = model_path(name);
    if (tern_mkmodel_write(&p, path, NULL)) fail_msg("mkmodel %s: %s", name, tern_last_error());
    return path;
}

static struct tern_model *load_path(const char *path) {
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = path;
    mp.n_threads = 2;
    struct tern_model *m = NULL;
    if (tern_model_load(&mp, &m)) fail_msg("load %s: %s", path, tern_last_error());
    return m;
}

static enum tern_status try_load(const char *path, struct tern_model **m) {
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = path;
    mp.n_threads = 1;
    return tern_model_load(&mp, m);
}

/* A copy of src with every occurrence of the name `from` in the header replaced by
 * `to` (the same length): a tensor renamed, i.e. missing under its own name. */
static const char *patched(const char *src, const char *from, const char *to, const char *name) {
    size_t len;
    char *b = th_read_file(src, &len);
    assert_non_null(b);
    const size_t n = strlen(from);
    assert_int_equal(n, strlen(to));
    size_t hits = 0;
    for (size_t i = 0; i + n <= len && i < 1u << 20; i++)
        if (!memcmp(b + i, from, n)) {
            memcpy(b + i, to, n);
            hits++;
        }
    assert_true(hits > 0);
    const char *path = model_path(name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, len, f), len);
    fclose(f);
    free(b);
    return path;
}

/* A copy of src with the first dimension of tensor `name` set to ne0 (its header
 * record: the name, n_dims as u32, then ne[] as u64). */
static const char *patched_ne0(const char *src, const char *tname, uint64_t ne0, const char *name) {
    size_t len;
    char *b = th_read_file(src, &len);
    assert_non_null(b);
    const size_t n = strlen(tname);
    size_t at = 0;
    for (size_t i = 0; i + n + 12 <= len && i < 1u << 20 && !at; i++)
        if (!memcmp(b + i, tname, n)) at = i + n + 4;
    assert_true(at > 0);
    memcpy(b + at, &ne0, sizeof ne0);
    const char *path = model_path(name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, len, f), len);
    fclose(f);
    free(b);
    return path;
}

static void test_load(void **unused) {
    (void)unused;
    const struct gen_model *g = &g_models[0];
    const char *with = write_model(g, 1, "load-mtp"), *without = write_model(g, 0, "load-plain");
    struct tern_model *m = load_path(with);
    assert_true(tern_model_info(m)->has_mtp);
    assert_int_equal(tern_model_info(m)->n_layer, 4); /* the MTP block is not a layer of the main pass */
    tern_model_free(m);
    m = load_path(without);
    assert_false(tern_model_info(m)->has_mtp);
    /* --spec mtp without the head: refused, naming why */
    struct tern_session *s = NULL;
    assert_int_equal(tern_session_new(m, NULL, &s), TERN_OK);
    const int32_t t = 5;
    assert_int_equal(tern_session_eval(s, &t, 1, NULL), TERN_OK);
    struct tern_sampler_params sp;
    tern_sampler_params_default(&sp);
    struct tern_sampler *smp = NULL;
    assert_int_equal(tern_sampler_new(&sp, tern_model_info(m)->n_vocab, &smp), TERN_OK);
    struct spec_dec d;
    assert_int_equal(spec_dec_init(&d, s, smp, &(struct spec_params){.mode = SPEC_MTP}, NULL), TERN_ERR_UNSUPPORTED);
    assert_non_null(strstr(tern_last_error(), "multi-token-prediction"));
    spec_dec_free(&d);
    tern_sampler_free(smp);
    tern_session_free(s);
    tern_model_free(m);

    /* a partial block: each tensor missing in turn is named */
    static const char *const need[] = {"blk.4.nextn.eh_proj.weight", "blk.4.nextn.enorm.weight",
                                       "blk.4.nextn.hnorm.weight", "blk.4.attn_q.weight", "blk.4.ffn_down.weight",
                                       "blk.4.attn_k_norm.weight"};
    for (size_t i = 0; i < TERN_ARRAY_LEN(need); i++) {
        char to[64];
        snprintf(to, sizeof to, "%s", need[i]);
        to[strlen(to) - 2] = 'X'; /* ".weight" -> ".weigXt" */
        const char *bad = patched(with, need[i], to, "load-partial");
        struct tern_model *bm = NULL;
        assert_int_equal(try_load(bad, &bm), TERN_ERR_FORMAT);
        assert_null(bm);
        if (!strstr(tern_last_error(), need[i])) fail_msg("error for a missing %s: %s", need[i], tern_last_error());
    }
    /* a misshapen block: a norm of half the width is named with both shapes */
    {
        const char *bad = patched_ne0(with, "blk.4.nextn.hnorm.weight", 128, "load-shape");
        struct tern_model *bm = NULL;
        assert_int_equal(try_load(bad, &bm), TERN_ERR_FORMAT);
        if (!strstr(tern_last_error(), "blk.4.nextn.hnorm.weight") || !strstr(tern_last_error(), "256"))
            fail_msg("error for a misshapen hnorm: %s", tern_last_error());
    }
    /* declared (nextn_predict_layers 1) but without any blk.4 tensor: loads without the head */
    const char *none = patched(with, "blk.4.", "blk.9.", "load-none");
    m = load_path(none);
    assert_false(tern_model_info(m)->has_mtp);
    tern_model_free(m);
}

/* The main model's hidden states of prompt[0..n), evaluated in chunks of n_chunk. */
static float *hidden_of(struct tern_model *m, const int32_t *prompt, uint32_t n, uint32_t n_chunk, uint64_t *hash) {
    const uint32_t E = tern_model_info(m)->n_embd;
    float *h = tern_malloc((size_t)n * E * sizeof(float));
    assert_non_null(h);
    struct tern_session *s = NULL;
    assert_int_equal(tern_session_new(m, NULL, &s), TERN_OK);
    tern_session_capture_hidden(s, h, 0);
    assert_int_equal(tern_session_eval(s, prompt, n, &(struct tern_eval_opts){.n_chunk = n_chunk}), TERN_OK);
    tern_session_capture_hidden(s, NULL, 0);
    *hash = tern_session_hash(s);
    tern_session_free(s);
    return h;
}

static void mk_tokens(struct tern_model *m, int32_t *p, size_t n, uint32_t mul) {
    const uint32_t nv = tern_model_info(m)->n_vocab;
    for (size_t i = 0; i < n; i++) p[i] = (int32_t)((3 + i * mul) % nv);
}

static void head_invariance(const struct gen_model *g, struct tern_model *m);

static void test_head_chunk_invariance(void **unused) {
    (void)unused;
    for (size_t im = 0; im < TERN_ARRAY_LEN(g_models); im++) {
        const struct gen_model *g = &g_models[im];
        struct tern_model *m = load_path(write_model(g, 1, g->name));
        head_invariance(g, m);
        tern_model_free(m);
    }
}

/* The same on a Vulkan device (lavapipe in CI), where the main model's forward captures
 * the hidden states and the head runs too (docs/gpu.md): a dense and an MoE model. */
static void test_head_on_device(void **unused) {
    (void)unused;
    const int dev = th_vulkan_find();
    if (dev < 0) skip();
    const size_t picks[] = {0, 6}; /* q35-mtp-f32, q35moe-echo-f32 */
    for (size_t i = 0; i < TERN_ARRAY_LEN(picks); i++) {
        const struct gen_model *g = &g_models[picks[i]];
        struct tern_model *m = load_path(write_model(g, 1, g->name));
        if (th_use_vulkan(m, dev, 64)) fail_msg("%s on vulkan:%d: %s", g->name, dev, tern_last_error());
        head_invariance(g, m);
        tern_model_free(m);
    }
}

/* The main model's hidden-state capture and the head's logits and hidden states do not
 * depend on the chunking; rewinding the head and re-feeding gives the same bits. */
static void head_invariance(const struct gen_model *g, struct tern_model *m) {
    {
        const uint32_t E = tern_model_info(m)->n_embd, nv = tern_model_info(m)->n_vocab;
        enum { N = 41 };
        int32_t toks[N];
        mk_tokens(m, toks, N, 7);
        /* the capture changes nothing, and does not depend on the chunking */
        uint64_t h1, h2, h_plain;
        float *hid = hidden_of(m, toks, N - 1, 512, &h1);
        float *hid1 = hidden_of(m, toks, N - 1, 1, &h2);
        assert_memory_equal(hid, hid1, (size_t)(N - 1) * E * sizeof(float));
        assert_int_equal(h1, h2);
        {
            /* a capture from position 10 on, through chunks that straddle it */
            float *tail = tern_malloc((size_t)(N - 11) * E * sizeof(float));
            assert_non_null(tail);
            struct tern_session *s = NULL;
            assert_int_equal(tern_session_new(m, NULL, &s), TERN_OK);
            tern_session_capture_hidden(s, tail, 10);
            assert_int_equal(tern_session_eval(s, toks, N - 1, &(struct tern_eval_opts){.n_chunk = 7}), TERN_OK);
            tern_session_capture_hidden(s, NULL, 0);
            assert_memory_equal(tail, hid + 10 * (size_t)E, (size_t)(N - 11) * E * sizeof(float));
            tern_session_free(s);
            free(tail);
        }
        {
            struct tern_session *s = NULL;
            assert_int_equal(tern_session_new(m, NULL, &s), TERN_OK);
            assert_int_equal(tern_session_eval(s, toks, N - 1, NULL), TERN_OK);
            h_plain = tern_session_hash(s);
            tern_session_free(s);
        }
        assert_int_equal(h1, h_plain);
        /* the head: row p from the hidden state at p and the token at p + 1 */
        const uint32_t R = N - 1;
        float *la = tern_malloc((size_t)R * nv * sizeof(float)), *lb = tern_malloc((size_t)R * nv * sizeof(float));
        float *ha = tern_malloc((size_t)R * E * sizeof(float)), *hb = tern_malloc((size_t)R * E * sizeof(float));
        assert_true(la && lb && ha && hb);
        struct tern_session *ms = NULL;
        assert_int_equal(tern_session_new(m, NULL, &ms), TERN_OK);
        struct tern_mtp *a = NULL, *b = NULL;
        assert_int_equal(tern_mtp_new(ms, &a), TERN_OK);
        assert_int_equal(tern_mtp_eval(a, hid, toks + 1, R, la, ha), TERN_OK);
        assert_int_equal(tern_mtp_n_past(a), R);
        assert_memory_equal(tern_mtp_logits(a), la + (size_t)(R - 1) * nv, nv * sizeof(float));
        for (uint32_t step = 1; step <= 7; step += 6) {
            assert_int_equal(tern_mtp_new(ms, &b), TERN_OK);
            for (uint32_t r = 0; r < R; r += step) {
                const uint32_t k = r + step <= R ? step : R - r;
                assert_int_equal(tern_mtp_eval(b, hid + (size_t)r * E, toks + 1 + r, k, lb + (size_t)r * nv,
                                               hb + (size_t)r * E), TERN_OK);
            }
            for (uint32_t r = 0; r < R; r++) {
                if (memcmp(la + (size_t)r * nv, lb + (size_t)r * nv, nv * sizeof(float)))
                    fail_msg("%s: head logits of row %u differ between one chunk and chunks of %u", g->name, r, step);
                if (memcmp(ha + (size_t)r * E, hb + (size_t)r * E, E * sizeof(float)))
                    fail_msg("%s: head hidden state of row %u differs (chunks of %u)", g->name, r, step);
            }
            assert_int_equal(tern_mtp_hash(a), tern_mtp_hash(b));
            /* rewinding drops rows: re-fed, the same bits */
            assert_int_equal(tern_mtp_rewind(b, 10), TERN_OK);
            assert_int_equal(tern_mtp_eval(b, hid + 10 * (size_t)E, toks + 11, R - 10, NULL, NULL), TERN_OK);
            assert_int_equal(tern_mtp_hash(a), tern_mtp_hash(b));
            assert_memory_equal(tern_mtp_logits(a), tern_mtp_logits(b), nv * sizeof(float));
            tern_mtp_free(b);
        }
        /* the logits are not degenerate: something to draft from */
        float lo = la[0], hi = la[0];
        for (uint32_t i = 0; i < nv; i++) {
            lo = la[i] < lo ? la[i] : lo;
            hi = la[i] > hi ? la[i] : hi;
        }
        assert_true(hi > lo);
        tern_mtp_free(a);
        tern_session_free(ms);
        free(la);
        free(lb);
        free(ha);
        free(hb);
        free(hid);
        free(hid1);
    }
}

/* ---- decoding --------------------------------------------------------------------- */

struct run {
    int32_t toks[N_GEN];
    uint64_t hash, head_hash, head_cold_hash;
    uint32_t n_past;
    struct spec_stats st;
};

static struct tern_session *primed(struct tern_model *m, const int32_t *p, size_t n) {
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.n_ctx = 256;
    struct tern_session *s = NULL;
    assert_int_equal(tern_session_new(m, &sp, &s), TERN_OK);
    assert_int_equal(tern_session_eval(s, p, n, NULL), TERN_OK);
    return s;
}

static struct tern_sampler *greedy(uint32_t nv) {
    struct tern_sampler_params sp;
    tern_sampler_params_default(&sp);
    sp.temperature = 0.0f;
    struct tern_sampler *smp = NULL;
    assert_int_equal(tern_sampler_new(&sp, nv, &smp), TERN_OK);
    return smp;
}

/* The hash of a fresh head fed the cold main model's hidden states of the tokens at
 * main positions [base, base + n) (row p: hidden at p, token at p + 1). */
static uint64_t head_cold(struct tern_model *m, const int32_t *all, uint32_t base, uint32_t n) {
    uint64_t unused;
    float *hid = hidden_of(m, all, base + n, 512, &unused);
    struct tern_session *ms = primed(m, all, 1);
    struct tern_mtp *h = NULL;
    assert_int_equal(tern_mtp_new(ms, &h), TERN_OK);
    if (n) assert_int_equal(tern_mtp_eval(h, hid + (size_t)base * tern_model_info(m)->n_embd, all + base + 1, n,
                                          NULL, NULL), TERN_OK);
    const uint64_t r = tern_mtp_hash(h);
    tern_mtp_free(h);
    tern_session_free(ms);
    free(hid);
    return r;
}

/* With g_feed_prompt, the prompt's hidden states are captured while priming and fed to
 * the head (spec_params.prompt_hidden), as tern run does. */
static bool g_feed_prompt;

static void decode(struct tern_model *m, const int32_t *prompt, const struct spec_params *spp, int n_stop,
                   struct run *r, struct tern_session **keep) {
    struct spec_params pp = *spp;
    float *ph = NULL;
    struct tern_session *s = NULL;
    if (pp.mode == SPEC_MTP && g_feed_prompt) {
        ph = tern_malloc((size_t)N_PROMPT * tern_model_info(m)->n_embd * sizeof(float));
        assert_non_null(ph);
        struct tern_session_params sp;
        tern_session_params_default(&sp);
        sp.n_ctx = 256;
        assert_int_equal(tern_session_new(m, &sp, &s), TERN_OK);
        tern_session_capture_hidden(s, ph, 0);
        assert_int_equal(tern_session_eval(s, prompt, N_PROMPT, NULL), TERN_OK);
        tern_session_capture_hidden(s, NULL, 0);
        pp.prompt_hidden = ph;
    } else {
        s = primed(m, prompt, N_PROMPT);
    }
    struct tern_sampler *smp = greedy(tern_model_info(m)->n_vocab);
    struct spec_dec d;
    assert_int_equal(spec_dec_init(&d, s, smp, &pp, NULL), TERN_OK);
    free(ph); /* read by spec_dec_init only */
    /* fed the prompt, the head starts at position 0 and covers it */
    if (d.mtp && g_feed_prompt) {
        assert_int_equal(d.mtp_base, 0);
        assert_int_equal(tern_mtp_n_past(d.mtp), N_PROMPT - 1);
    }
    memset(r->toks, 0xff, sizeof r->toks);
    int n_taken = 0;
    for (int i = 0; i < N_GEN; i++) {
        r->toks[i] = spec_next(&d);
        n_taken = i + 1;
        if (i + 1 == N_GEN || i + 1 == n_stop) break;
        assert_int_equal(spec_accept(&d, r->toks[i], (size_t)(N_GEN - i - 1)), TERN_OK);
        assert_int_equal(spec_n_past(&d), N_PROMPT + i + 1);
    }
    assert_int_equal(spec_finish(&d), TERN_OK);
    r->n_past = tern_session_n_past(s);
    r->hash = tern_session_hash(s);
    r->st = d.st;
    r->head_hash = r->head_cold_hash = 0;
    if (d.mtp) {
        /* the head holds the accepted tokens' rows only: as a fresh head fed them */
        const uint32_t n_head = tern_mtp_n_past(d.mtp);
        assert_true(d.mtp_base + n_head <= r->n_past);
        int32_t all[N_PROMPT + N_GEN];
        memcpy(all, prompt, N_PROMPT * sizeof *all);
        memcpy(all + N_PROMPT, r->toks, (size_t)n_taken * sizeof *all);
        r->head_hash = tern_mtp_hash(d.mtp);
        r->head_cold_hash = head_cold(m, all, d.mtp_base, n_head);
    }
    spec_dec_free(&d);
    tern_sampler_free(smp);
    if (keep) *keep = s;
    else tern_session_free(s);
}

static void check_same(const char *label, const struct run *plain, const struct run *r, int n) {
    for (int i = 0; i < n; i++)
        if (plain->toks[i] != r->toks[i])
            fail_msg("%s: token %d is %d, plain decoding gives %d", label, i, r->toks[i], plain->toks[i]);
    if (plain->n_past != r->n_past || plain->hash != r->hash)
        fail_msg("%s: state after the request %u/%016llx, plain %u/%016llx", label, r->n_past,
                 (unsigned long long)r->hash, plain->n_past, (unsigned long long)plain->hash);
    if (r->head_hash != r->head_cold_hash) fail_msg("%s: the head's KV rows differ from a fresh head's", label);
}

static void test_greedy_identical(void **unused) {
    (void)unused;
    static const uint32_t lens[] = {1, 2, 4, 8};
    for (size_t im = 0; im < TERN_ARRAY_LEN(g_models); im++) {
        const struct gen_model *g = &g_models[im];
        struct tern_model *m = load_path(write_model(g, 1, g->name));
        int32_t prompt[N_PROMPT];
        mk_tokens(m, prompt, N_PROMPT, 11);
        struct run plain, r;
        decode(m, prompt, &(struct spec_params){.mode = SPEC_OFF}, 0, &plain, NULL);
        uint64_t drafted = 0, accepted = 0;

        for (size_t il = 0; il < TERN_ARRAY_LEN(lens); il++) {
            for (int refeed = 0; refeed <= 1; refeed++) {
              for (int feed = 0; feed <= 1; feed++) {
                g_feed_prompt = feed;
                char label[128];
                snprintf(label, sizeof label, "%s mtp max %u%s%s", g->name, lens[il], refeed ? ", refeed" : "",
                         feed ? ", prompt fed" : "");
                decode(m, prompt, &(struct spec_params){.mode = SPEC_MTP, .max = lens[il], .refeed = refeed}, 0, &r,
                       NULL);
                check_same(label, &plain, &r, N_GEN);
                assert_true(r.st.drafted > 0);
                assert_true(r.st.accepted <= r.st.drafted);
                drafted += r.st.drafted;
                accepted += r.st.accepted;
              }
            }
        }
        g_feed_prompt = false;
        /* a stop after n tokens, inside whatever the decoder verified beyond */
        for (int n_stop = 1; n_stop <= 13; n_stop += 3) {
            struct run ps, rs;
            decode(m, prompt, &(struct spec_params){.mode = SPEC_OFF}, n_stop, &ps, NULL);
            decode(m, prompt, &(struct spec_params){.mode = SPEC_MTP, .max = 4}, n_stop, &rs, NULL);
            char label[128];
            snprintf(label, sizeof label, "%s mtp stop after %d", g->name, n_stop);
            check_same(label, &ps, &rs, n_stop);
        }
        printf("# %s: mtp drafted %llu, accepted %llu (random weights)\n", g->name, (unsigned long long)drafted,
               (unsigned long long)accepted);
        /* the echo head guesses the token it was given, and the tied, weak-layered model
         * repeats its input: drafts are accepted (the random heads' are rejected) */
        if (g->echo) assert_true(accepted > drafted / 8 && accepted < drafted);
        else assert_true(accepted < drafted);
        tern_model_free(m);
    }
}

static void test_resumed_equals_cold(void **unused) {
    (void)unused;
    const struct gen_model *g = &g_models[1];
    struct tern_model *m = load_path(write_model(g, 1, g->name));
    const uint32_t nv = tern_model_info(m)->n_vocab;
    int32_t prompt[N_PROMPT];
    mk_tokens(m, prompt, N_PROMPT, 5);
    struct run plain, r;
    decode(m, prompt, &(struct spec_params){.mode = SPEC_OFF}, 0, &plain, NULL);
    struct tern_session *s = NULL;
    decode(m, prompt, &(struct spec_params){.mode = SPEC_MTP, .max = 4}, 0, &r, &s);
    check_same("resumed", &plain, &r, N_GEN);
    int32_t next[4] = {plain.toks[N_GEN - 1], prompt[1], prompt[2], prompt[3]};
    assert_int_equal(tern_session_eval(s, next, 4, NULL), TERN_OK);
    int32_t all[N_PROMPT + N_GEN + 3];
    memcpy(all, prompt, sizeof prompt);
    memcpy(all + N_PROMPT, plain.toks, sizeof plain.toks);
    memcpy(all + N_PROMPT + N_GEN, next + 1, 3 * sizeof *next);
    struct tern_session *cold = primed(m, all, TERN_ARRAY_LEN(all));
    assert_int_equal(tern_session_hash(s), tern_session_hash(cold));
    assert_memory_equal(tern_session_logits(s), tern_session_logits(cold), nv * sizeof(float));
    /* both go on: mtp drafts on the resumed one, plain on the cold one */
    struct tern_sampler *a = greedy(nv), *b = greedy(nv);
    struct spec_dec da, db;
    assert_int_equal(spec_dec_init(&da, s, a, &(struct spec_params){.mode = SPEC_MTP, .max = 3}, NULL), TERN_OK);
    assert_int_equal(spec_dec_init(&db, cold, b, &(struct spec_params){.mode = SPEC_OFF}, NULL), TERN_OK);
    for (int i = 0; i < 16; i++) {
        const int32_t ta = spec_next(&da), tb = spec_next(&db);
        assert_int_equal(ta, tb);
        assert_int_equal(spec_accept(&da, ta, 100), TERN_OK);
        assert_int_equal(spec_accept(&db, tb, 100), TERN_OK);
    }
    assert_int_equal(spec_finish(&da), TERN_OK);
    assert_int_equal(spec_finish(&db), TERN_OK);
    assert_true(da.st.drafted > 0);
    assert_int_equal(tern_session_hash(s), tern_session_hash(cold));
    spec_dec_free(&da);
    spec_dec_free(&db);
    tern_sampler_free(a);
    tern_sampler_free(b);
    tern_session_free(s);
    tern_session_free(cold);
    tern_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_head_chunk_invariance),
        cmocka_unit_test(test_head_on_device),
        cmocka_unit_test(test_greedy_identical),
        cmocka_unit_test(test_resumed_equals_cold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
