/* cache: conversation reuse on real (generated) models, driven at the token level the
 * way the server's worker drives it: acquire -> prime prompt[r..m) with the checkpoint
 * plan -> greedy decode -> release. Every resumed request is checked against a cold
 * run over the same prompt: same greedy tokens, same final state hash. */
#include "harness.h"

#include "cache/cache.h"
#include "server/chat.h"
#include "tokenizer/tokenizer.h"
#include "util/buf.h"
#include "util/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GEN 6

struct fixture {
    const char *arch;
    char path[512];
    struct tern_model *m;
    const struct tern_tokenizer *tok;
    int32_t im_start;
    bool hybrid;
};

static struct fixture fx_q3 = {.arch = "tiny-qwen3"};
static struct fixture fx_q35 = {.arch = "tiny-qwen35"};

static int fixture_setup(struct fixture *f) {
    snprintf(f->path, sizeof f->path, "%s/%s.gguf", th_tmpdir(), f->arch);
    char cmd[1024];
    /* a small context keeps the test fast; the shape is the tiny preset's */
    snprintf(cmd, sizeof cmd, "'%s' mkmodel --preset %s --n-layer 4 --out '%s' >/dev/null", th_tern_bin(), f->arch,
             f->path);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot make %s\n", f->arch);
        return -1;
    }
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = f->path;
    mp.n_threads = 2;
    if (tern_model_load(&mp, &f->m) != TERN_OK) {
        fprintf(stderr, "load %s: %s\n", f->path, tern_last_error());
        return -1;
    }
    f->tok = tern_model_tokenizer(f->m);
    f->im_start = tern_token_find(f->tok, "<|im_start|>", 12);
    f->hybrid = tern_model_info(f->m)->hybrid;
    return f->im_start < 0 ? -1 : 0;
}

static int setup_q3(void **state) {
    *state = &fx_q3;
    return fx_q3.m ? 0 : fixture_setup(&fx_q3);
}
static int setup_q35(void **state) {
    *state = &fx_q35;
    return fx_q35.m ? 0 : fixture_setup(&fx_q35);
}

static void default_params(struct fixture *f, struct cache_params *p) {
    memset(p, 0, sizeof *p);
    tern_session_params_default(&p->session);
    p->session.n_ctx = 4096;
    p->session.n_chunk = 64;
    p->ram_bytes = (size_t)1 << 30;
    p->max_ckpts = 8;
    p->ckpt_every = 256;
    p->turn_token = f->im_start;
    assert_int_equal(chat_role_map(f->tok, p), TERN_OK); /* the server's role map */
    p->affinity = true;
    p->pool = true;
}

/* A growable token array. */
struct toks {
    int32_t *v;
    size_t n, cap;
};

static void toks_add_text(struct fixture *f, struct toks *t, const char *text) {
    assert_int_equal(tern_tokenize(f->tok, text, strlen(text), TERN_TOK_PARSE_SPECIAL, &t->v, &t->n, &t->cap), TERN_OK);
}

static void toks_free(struct toks *t) {
    free(t->v);
    memset(t, 0, sizeof *t);
}

static void toks_copy(struct toks *dst, const struct toks *src) {
    toks_free(dst);
    dst->v = malloc((src->n + 1) * sizeof *dst->v);
    memcpy(dst->v, src->v, src->n * sizeof *dst->v);
    dst->n = dst->cap = src->n;
}

/* What one request did. */
struct result {
    struct cache_decision d;
    int32_t gen[GEN];
    uint64_t hash;     /* final state hash */
};

static int32_t argmax(const float *l, uint32_t n) {
    int32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = (int32_t)i;
    return best;
}

/* Greedy-decodes GEN tokens after the prompt (the last one is not consumed, as the
 * server does). */
static void decode(struct tern_session *s, uint32_t n_vocab, int32_t *gen) {
    for (int i = 0; i < GEN; i++) {
        gen[i] = argmax(tern_session_logits(s), n_vocab);
        if (i + 1 < GEN) assert_int_equal(tern_session_eval(s, &gen[i], 1, NULL), TERN_OK);
    }
}

static struct result request(struct fixture *f, struct cache *c, const char *tenant, const char *key,
                             const struct toks *prompt, uint32_t n_chunk) {
    struct result res;
    struct cache_ident id = {.tenant = tenant, .key = key};
    struct cache_lease l;
    assert_int_equal(cache_acquire(c, &id, prompt->v, prompt->n, &l), TERN_OK);
    res.d = l.decision;
    assert_int_equal(tern_session_n_past(l.session), l.decision.cached);
    assert_memory_equal(tern_session_tokens(l.session), prompt->v, l.decision.cached * sizeof(int32_t));
    struct tern_eval_opts o = {.n_chunk = n_chunk, .user = &l, .ckpt_pos = l.ckpt_pos, .n_ckpt = l.n_ckpt,
                               .on_ckpt = cache_on_checkpoint};
    assert_int_equal(tern_session_eval(l.session, prompt->v + l.decision.cached, prompt->n - l.decision.cached, &o),
                     TERN_OK);
    decode(l.session, tern_model_info(f->m)->n_vocab, res.gen);
    res.hash = tern_session_hash(l.session);
    cache_release(c, &l, true);
    return res;
}

/* The same prompt read cold in a fresh session. */
static struct result cold(struct fixture *f, const struct toks *prompt, uint32_t n_chunk) {
    struct result res;
    memset(&res, 0, sizeof res);
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.n_ctx = 4096;
    sp.n_chunk = n_chunk;
    struct tern_session *s;
    assert_int_equal(tern_session_new(f->m, &sp, &s), TERN_OK);
    assert_int_equal(tern_session_eval(s, prompt->v, prompt->n, NULL), TERN_OK);
    decode(s, tern_model_info(f->m)->n_vocab, res.gen);
    res.hash = tern_session_hash(s);
    tern_session_free(s);
    return res;
}

static void assert_equals_cold(struct fixture *f, const struct result *r, const struct toks *prompt) {
    struct result c = cold(f, prompt, 512);
    assert_memory_equal(r->gen, c.gen, sizeof c.gen);
    assert_true(r->hash == c.hash);
}

/* Appends the generated tokens as the session holds them (all but the last). */
static void add_generated(struct toks *t, const struct result *r) {
    for (int i = 0; i < GEN - 1; i++) {
        if (t->n == t->cap) {
            t->cap = t->cap * 2 + 16;
            t->v = realloc(t->v, t->cap * sizeof *t->v);
        }
        t->v[t->n++] = r->gen[i];
    }
}

static const char *SYS = "<|im_start|>system\nYou are a coding agent. Use the tools to read and edit files.<|im_end|>\n";

/* Turn 1: system + user; turn 2: the reply sent back verbatim plus a tool result (an
 * extension); turn 3: a new user message after the template dropped the reasoning of
 * the assistant turn (a rewrite). */
static void test_extension_and_rewrite(void **state) {
    struct fixture *f = *state;
    struct cache_params p;
    default_params(f, &p);
    struct cache *c;
    assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);

    struct toks p1 = {0};
    toks_add_text(f, &p1, SYS);
    toks_add_text(f, &p1, "<|im_start|>user\nFix the failing test in parser.c<|im_end|>\n<|im_start|>assistant\n");
    struct result r1 = request(f, c, "", NULL, &p1, 64);
    assert_int_equal(r1.d.tier, CACHE_TIER_COLD);
    assert_int_equal(r1.d.cached, 0);
    assert_equals_cold(f, &r1, &p1);

    /* The client sends the reply back exactly as generated, then a tool result. */
    struct toks p2 = {0};
    toks_copy(&p2, &p1);
    add_generated(&p2, &r1);
    uint32_t live_end = (uint32_t)p2.n;
    toks_add_text(f, &p2, "<think>\nread the file\n</think>\n<|im_end|>\n<|im_start|>user\n<tool_response>\nint main(){}\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    struct result r2 = request(f, c, "", NULL, &p2, 64);
    assert_int_equal(r2.d.tier, CACHE_TIER_LIVE);
    assert_int_equal(r2.d.cached, live_end);
    assert_int_equal(r2.d.read, p2.n - live_end);
    assert_equals_cold(f, &r2, &p2);

    /* A new user message: the template re-renders the last assistant turn without its
     * reasoning, so the history diverges right after the previous prompt's end. */
    struct toks p3 = {0};
    toks_copy(&p3, &p2);
    toks_add_text(f, &p3, "Done.<|im_end|>\n<|im_start|>user\nNow run the tests.<|im_end|>\n<|im_start|>assistant\n");
    struct result r3 = request(f, c, "", NULL, &p3, 64);
    if (f->hybrid) {
        assert_int_equal(r3.d.tier, CACHE_TIER_CHECKPOINT);
        assert_int_equal(r3.d.cached, p2.n); /* the prompt-end checkpoint of turn 2 */
    } else {
        assert_int_equal(r3.d.tier, CACHE_TIER_PREFIX);
        assert_true(r3.d.cached >= p2.n);
    }
    assert_equals_cold(f, &r3, &p3);

    struct cache_stats st;
    cache_get_stats(c, &st);
    assert_int_equal(st.n_sessions, 1); /* one lineage, no pile of near-copies */
    assert_true(st.tokens_cached > 0);
    toks_free(&p1);
    toks_free(&p2);
    toks_free(&p3);
    cache_free(c);
}

/* Resumed equals cold for several chunk sizes and with TERN_CKPT_REREAD. */
static void test_resumed_equals_cold_any_chunking(void **state) {
    struct fixture *f = *state;
    const uint32_t chunks[] = {1, 64, 512};
    for (int reread = 0; reread < 2; reread++) {
        for (size_t ci = 0; ci < TERN_ARRAY_LEN(chunks); ci++) {
            struct cache_params p;
            default_params(f, &p);
            p.ckpt_reread = reread;
            struct cache *c;
            assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);
            struct toks a = {0}, b = {0};
            toks_add_text(f, &a, SYS);
            toks_add_text(f, &a, "<|im_start|>user\nList the files.<|im_end|>\n<|im_start|>assistant\n");
            struct result r1 = request(f, c, "", NULL, &a, chunks[ci]);
            toks_copy(&b, &a);
            toks_add_text(f, &b, "ls<|im_end|>\n<|im_start|>user\nThanks. And the sizes?<|im_end|>\n<|im_start|>assistant\n");
            struct result r2 = request(f, c, "", NULL, &b, chunks[ci]);
            assert_true(r2.d.cached >= a.n);
            assert_equals_cold(f, &r2, &b);
            (void)r1;
            toks_free(&a);
            toks_free(&b);
            cache_free(c);
        }
    }
}

/* Tenants never mix; named and unnamed never mix; a named claim with other bytes gets
 * no resume. */
static void test_identity_cannot_poison(void **state) {
    struct fixture *f = *state;
    struct cache_params p;
    default_params(f, &p);
    struct cache *c;
    assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);
    struct toks a = {0}, a2 = {0}, other = {0};
    toks_add_text(f, &a, SYS);
    toks_add_text(f, &a, "<|im_start|>user\nsecret project plan<|im_end|>\n<|im_start|>assistant\n");
    struct result r = request(f, c, "tenantA", "conv-1", &a, 64);
    assert_int_equal(r.d.tier, CACHE_TIER_COLD);
    toks_copy(&a2, &a);
    add_generated(&a2, &r);
    toks_add_text(f, &a2, "<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n");

    /* tenant B, identical bytes and key: cold */
    r = request(f, c, "tenantB", "conv-1", &a2, 64);
    assert_int_equal(r.d.tier, CACHE_TIER_COLD);
    /* tenant A unnamed, identical bytes: named and unnamed never mix */
    r = request(f, c, "tenantA", NULL, &a2, 64);
    assert_int_equal(r.d.tier, CACHE_TIER_COLD);
    /* tenant A, key conv-1, different bytes: declined, cold */
    toks_add_text(f, &other, "Summarise: <|im_start|>system\nsomething else<|im_end|>\n<|im_start|>assistant\n");
    r = request(f, c, "tenantA", "conv-1", &other, 64);
    assert_int_equal(r.d.tier, CACHE_TIER_COLD);
    assert_true(strstr(r.d.reason, "no common prefix") != NULL);
    assert_equals_cold(f, &r, &other);
    /* the same claim sharing only the system prompt's first tokens: at most that
     * prefix is reused, and the claimed conversation keeps its state (a fork) */
    toks_free(&other);
    toks_add_text(f, &other, "<|im_start|>system\nsomething else entirely<|im_end|>\n<|im_start|>assistant\n");
    r = request(f, c, "tenantA", "conv-1", &other, 64);
    assert_true(r.d.cached < 20);
    assert_equals_cold(f, &r, &other);
    /* tenant A, key conv-1, the real continuation: resumes its own state */
    r = request(f, c, "tenantA", "conv-1", &a2, 64);
    assert_int_not_equal(r.d.tier, CACHE_TIER_COLD);
    assert_true(r.d.key_explicit);
    assert_true(r.d.cached >= a.n);
    assert_equals_cold(f, &r, &a2);
    toks_free(&a);
    toks_free(&a2);
    toks_free(&other);
    cache_free(c);
}

/* Interleaved unnamed conversations A, B, A, B sharing a system prompt each resume
 * their own state. */
static void test_interleaved_conversations(void **state) {
    struct fixture *f = *state;
    struct cache_params p;
    default_params(f, &p);
    struct cache *c;
    assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);
    struct toks conv[2] = {{0}, {0}};
    const char *first[2] = {"<|im_start|>user\nTask A: refactor the lexer<|im_end|>\n<|im_start|>assistant\n",
                            "<|im_start|>user\nTask B: write docs for the API<|im_end|>\n<|im_start|>assistant\n"};
    for (int i = 0; i < 2; i++) {
        toks_add_text(f, &conv[i], SYS);
        toks_add_text(f, &conv[i], first[i]);
    }
    size_t held[2] = {0, 0};
    for (int turn = 0; turn < 3; turn++) {
        for (int i = 0; i < 2; i++) {
            struct result r = request(f, c, "", NULL, &conv[i], 64);
            if (turn > 0) { /* its own live end, not the other conversation's */
                assert_int_equal(r.d.tier, CACHE_TIER_LIVE);
                assert_int_equal(r.d.cached, held[i]);
            }
            assert_equals_cold(f, &r, &conv[i]);
            add_generated(&conv[i], &r);
            held[i] = conv[i].n;
            toks_add_text(f, &conv[i], "<|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
        }
    }
    struct cache_stats st;
    cache_get_stats(c, &st);
    assert_int_equal(st.n_sessions, 2);
    toks_free(&conv[0]);
    toks_free(&conv[1]);
    cache_free(c);
}

/* A deep rewrite (compaction) resumes at the longest valid checkpoint below the
 * divergence, never above it. */
static void test_compaction_uses_longest_valid_point(void **state) {
    struct fixture *f = *state;
    struct cache_params p;
    default_params(f, &p);
    p.ckpt_every = 32;
    struct cache *c;
    assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);
    struct toks a = {0}, b = {0};
    toks_add_text(f, &a, SYS);
    toks_add_text(f, &a, "<|im_start|>user\nA long task description that goes on for a while so that periodic checkpoints appear along the way, with several sentences of detail about what to do.<|im_end|>\n<|im_start|>assistant\n");
    struct result r = request(f, c, "", NULL, &a, 64);
    /* diverge in the middle of the user message */
    size_t cut = a.n - 20;
    toks_copy(&b, &a);
    b.n = cut;
    toks_add_text(f, &b, "[summary of earlier turns]<|im_end|>\n<|im_start|>assistant\n");
    r = request(f, c, "", NULL, &b, 64);
    assert_true(r.d.cached <= cut);
    if (f->hybrid) {
        assert_int_equal(r.d.tier, CACHE_TIER_CHECKPOINT);
        /* periodic points every 32 tokens, thinned to at most 8 by retention */
        assert_true(r.d.cached > 0);
        assert_true(r.d.cached + 96 >= cut);
    } else {
        assert_int_equal(r.d.cached, cut);
    }
    assert_equals_cold(f, &r, &b);
    toks_free(&a);
    toks_free(&b);
    cache_free(c);
}

/* The budget: eviction keeps the pool under --cache-ram. */
static void test_budget_evicts_lru(void **state) {
    struct fixture *f = *state;
    struct cache_params p;
    default_params(f, &p);
    struct cache *c;
    assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);
    struct toks t = {0};
    toks_add_text(f, &t, SYS);
    toks_add_text(f, &t, "<|im_start|>user\nconversation number 0<|im_end|>\n<|im_start|>assistant\n");
    request(f, c, "", "k0", &t, 64);
    struct cache_stats st;
    cache_get_stats(c, &st);
    size_t one = st.pool_bytes;
    cache_free(c);
    /* room for about three sessions */
    p.ram_bytes = one * 3 + one / 2;
    assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);
    for (int i = 0; i < 8; i++) {
        char key[16], text[128];
        snprintf(key, sizeof key, "k%d", i);
        snprintf(text, sizeof text, "<|im_start|>user\nconversation number %d<|im_end|>\n<|im_start|>assistant\n", i);
        toks_free(&t);
        toks_add_text(f, &t, SYS);
        toks_add_text(f, &t, text);
        request(f, c, "", key, &t, 64);
        cache_get_stats(c, &st);
        assert_true(st.pool_bytes <= p.ram_bytes);
    }
    assert_true(st.evictions >= 4);
    assert_true(st.n_sessions <= 4);
    toks_free(&t);
    cache_free(c);
}

/* A running (leased) session that grows makes parked ones give way: cache_fit keeps the
 * pool, leased sessions included, within the budget while the lease is held, and the
 * running session's answer is still the cold one. */
static void test_budget_counts_running(void **state) {
    struct fixture *f = *state;
    struct cache_params p;
    default_params(f, &p);
    struct cache *c;
    assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);
    struct toks t = {0};
    toks_add_text(f, &t, SYS);
    toks_add_text(f, &t, "<|im_start|>user\nconversation number 0<|im_end|>\n<|im_start|>assistant\n");
    request(f, c, "", "k0", &t, 64);
    struct cache_stats st;
    cache_get_stats(c, &st);
    const size_t one = st.pool_bytes;
    cache_free(c);
    p.ram_bytes = one * 3 + one / 2;
    assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);
    for (int i = 0; i < 3; i++) {
        char key[16], text[128];
        snprintf(key, sizeof key, "k%d", i);
        snprintf(text, sizeof text, "<|im_start|>user\nconversation number %d<|im_end|>\n<|im_start|>assistant\n", i);
        toks_free(&t);
        toks_add_text(f, &t, SYS);
        toks_add_text(f, &t, text);
        request(f, c, "", key, &t, 64);
    }
    cache_get_stats(c, &st);
    assert_int_equal(st.n_sessions, 3);
    const uint64_t ev0 = st.evictions;
    /* a long conversation, leased while it reads three more KV pages */
    toks_free(&t);
    toks_add_text(f, &t, SYS);
    toks_add_text(f, &t, "<|im_start|>user\n");
    while (t.n < 3 * 256 + 40) toks_add_text(f, &t, "a long request that goes on and on about many things, ");
    toks_add_text(f, &t, "<|im_end|>\n<|im_start|>assistant\n");
    struct cache_ident id = {.tenant = "", .key = "long"};
    struct cache_lease l;
    assert_int_equal(cache_acquire(c, &id, t.v, t.n, &l), TERN_OK);
    for (size_t at = 0; at < t.n; at += 64) {
        const size_t n = t.n - at < 64 ? t.n - at : 64;
        const size_t b0 = tern_session_bytes(l.session);
        assert_int_equal(tern_session_reserve(l.session, n), TERN_OK);
        if (tern_session_bytes(l.session) > b0) cache_fit(c);
        struct tern_eval_opts o = {.n_chunk = 64};
        assert_int_equal(tern_session_eval(l.session, t.v + at, n, &o), TERN_OK);
    }
    cache_get_stats(c, &st);
    assert_true(st.evictions > ev0);                      /* parked sessions gave way ... */
    assert_true(st.pool_bytes <= p.ram_bytes || st.n_sessions == 1); /* ... until it fit, or only it is left */
    struct result r;
    memset(&r, 0, sizeof r);
    decode(l.session, tern_model_info(f->m)->n_vocab, r.gen);
    r.hash = tern_session_hash(l.session);
    cache_release(c, &l, true);
    assert_equals_cold(f, &r, &t);
    toks_free(&t);
    cache_free(c);
}

/* The rollback switches serve correctly: no pool (live session only), no checkpoints. */
static void test_switches(void **state) {
    struct fixture *f = *state;
    for (int sw = 0; sw < 2; sw++) {
        struct cache_params p;
        default_params(f, &p);
        if (sw == 0) p.pool = false;
        else p.max_ckpts = 0;
        struct cache *c;
        assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);
        struct toks a = {0}, b = {0};
        toks_add_text(f, &a, SYS);
        toks_add_text(f, &a, "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n");
        toks_add_text(f, &b, SYS);
        toks_add_text(f, &b, "<|im_start|>user\ngoodbye<|im_end|>\n<|im_start|>assistant\n");
        struct result r = request(f, c, "", NULL, &a, 64);
        assert_equals_cold(f, &r, &a);
        r = request(f, c, "", NULL, &b, 64);
        assert_equals_cold(f, &r, &b);
        r = request(f, c, "", NULL, &a, 64);
        assert_equals_cold(f, &r, &a);
        struct cache_stats st;
        cache_get_stats(c, &st);
        if (sw == 0) assert_int_equal(st.n_sessions, 1);
        else assert_int_equal(st.n_checkpoints, 0);
        toks_free(&a);
        toks_free(&b);
        cache_free(c);
    }
}


/* One API key filling the pool evicts itself, not the others: with a per-tenant share,
 * the budget's victims come from the tenant over its share first. */
static void test_tenant_share(void **state) {
    struct fixture *f = *state;
    struct cache_params p;
    default_params(f, &p);
    struct cache *c;
    assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);
    struct toks t = {0};
    toks_add_text(f, &t, SYS);
    toks_add_text(f, &t, "<|im_start|>user\nconversation number 0<|im_end|>\n<|im_start|>assistant\n");
    request(f, c, "key0", "k", &t, 64);
    struct cache_stats st;
    cache_get_stats(c, &st);
    size_t one = st.pool_bytes;
    cache_free(c);
    for (int share = 0; share < 2; share++) {
        p.ram_bytes = one * 4 + one / 2; /* room for about four sessions */
        p.ram_per_tenant = share ? p.ram_bytes / 2 : 0;
        assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);
        struct toks victim = {0};
        toks_add_text(f, &victim, SYS);
        toks_add_text(f, &victim, "<|im_start|>user\nthe other tenant's conversation<|im_end|>\n<|im_start|>assistant\n");
        struct result r = request(f, c, "key1", "mine", &victim, 64);
        add_generated(&victim, &r);
        size_t held = victim.n;
        toks_add_text(f, &victim, "<|im_end|>\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n");
        /* key0 (with salts of its own choosing) parks many small conversations */
        for (int i = 0; i < 10; i++) {
            char key[16], text[128], tenant[32];
            snprintf(key, sizeof key, "k%d", i);
            snprintf(tenant, sizeof tenant, i % 2 ? "key0/salt:s%d" : "key0", i);
            snprintf(text, sizeof text, "<|im_start|>user\nconversation number %d<|im_end|>\n<|im_start|>assistant\n", i);
            toks_free(&t);
            toks_add_text(f, &t, SYS);
            toks_add_text(f, &t, text);
            request(f, c, tenant, key, &t, 64);
        }
        cache_get_stats(c, &st);
        assert_true(st.evictions >= 5);
        r = request(f, c, "key1", "mine", &victim, 64);
        if (share) {
            assert_int_equal(r.d.cached, held); /* still parked */
            assert_true(st.quota_evictions >= 5);
            /* the pool by tenant: key0 (its salts included) and key1, hashed */
            assert_int_equal(st.n_tenants, 2);
            assert_true(st.tenants[0].bytes >= st.tenants[1].bytes);
            assert_true(st.tenants[0].id != st.tenants[1].id);
        } else {
            assert_int_equal(r.d.cached, 0); /* without a share, LRU evicted it */
        }
        assert_equals_cold(f, &r, &victim);
        toks_free(&victim);
        cache_free(c);
    }
    toks_free(&t);
}

/* TERN_AFFINITY=0 switches fingerprint nomination off for requests and for predictions
 * alike (one candidate rule): a conversation parked behind more than the probed most
 * recent ones is then reached by neither; with affinity both reach its live end. */
static void test_affinity_switch_both_paths(void **state) {
    struct fixture *f = *state;
    for (int aff = 1; aff >= 0; aff--) {
        struct cache_params p;
        default_params(f, &p);
        p.affinity = aff != 0;
        struct cache *c;
        assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);
        struct toks a = {0}, other = {0}, next = {0};
        toks_add_text(f, &a, SYS);
        toks_add_text(f, &a, "<|im_start|>user\nTask A: refactor the lexer<|im_end|>\n<|im_start|>assistant\n");
        struct result r = request(f, c, "", NULL, &a, 64);
        add_generated(&a, &r);
        size_t held = a.n;
        toks_add_text(f, &a, "<|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
                             "<|im_start|>assistant\n");
        /* more unrelated conversations than the prefix probe looks at */
        for (int i = 0; i < 10; i++) {
            char u[128];
            snprintf(u, sizeof u, "<|im_start|>user\nUnrelated task %d: %s<|im_end|>\n<|im_start|>assistant\n", i,
                     i % 2 ? "write docs" : "fix the build");
            toks_free(&other);
            toks_add_text(f, &other, SYS);
            toks_add_text(f, &other, u);
            request(f, c, "", NULL, &other, 64);
        }
        /* the prediction path */
        struct cache_ident id = {.tenant = "", .key = NULL};
        struct cache_lease l;
        enum tern_status st = cache_predict_begin(c, &id, a.v, a.n, NULL, 0, &l);
        if (aff) {
            assert_int_equal(st, TERN_OK);
            assert_int_equal(l.decision.cached, held);
        } else if (st == TERN_OK) {
            assert_true(l.decision.cached < held); /* at most the shared system prompt of another */
        }
        if (st == TERN_OK) cache_predict_end(c, &l, false); /* dropped: not primed */
        /* the request path */
        toks_copy(&next, &a);
        r = request(f, c, "", NULL, &next, 64);
        if (aff) {
            assert_true(r.d.key_implicit); /* the fingerprint nominated it */
            assert_int_equal(r.d.cached, held);
        } else {
            assert_true(r.d.cached < held);
            assert_false(r.d.key_implicit);
        }
        assert_equals_cold(f, &r, &next);
        toks_free(&a);
        toks_free(&other);
        toks_free(&next);
        cache_free(c);
    }
}

/* The plan's roles come from the role map the server hands over, never from token text:
 * the same prompt gets the turn-after-the-user-message and system-prompt checkpoints
 * only under a map that names its headers. */
static bool plan_has(const struct cache_lease *l, uint32_t pos) {
    for (size_t i = 0; i < l->n_ckpt; i++)
        if (l->ckpt_pos[i] == pos) return true;
    return false;
}

static void plan_of(struct fixture *f, const struct cache_params *p, const struct toks *t, struct cache_lease *l,
                    struct cache **c) {
    (void)f;
    assert_int_equal(cache_new(f->m, p, c), TERN_OK);
    struct cache_ident id = {.tenant = "", .key = NULL};
    assert_int_equal(cache_acquire(*c, &id, t->v, t->n, l), TERN_OK);
}

/* Position of the k-th turn-start token of t. */
static uint32_t turn_pos(const struct fixture *f, const struct toks *t, int k) {
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i] == f->im_start && k-- == 0) return (uint32_t)i;
    fail_msg("no turn %d", k);
    return 0;
}

static void test_role_map_is_data(void **state) {
    struct fixture *f = *state;
    /* the server's map on a Qwen-style prompt: the tool result is no user message, so
     * the user point is the turn after the real user message (turn 2), not the header */
    struct toks q = {0};
    toks_add_text(f, &q, SYS);
    toks_add_text(f, &q, "<|im_start|>user\nlist the files<|im_end|>\n<|im_start|>assistant\nls<|im_end|>\n"
                         "<|im_start|>user\n<tool_response>\na.c b.c\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\n");
    struct cache_params p;
    default_params(f, &p);
    p.ckpt_every = 0;
    assert_true(p.n_roles >= 6);
    struct cache *c;
    struct cache_lease l;
    plan_of(f, &p, &q, &l, &c);
    assert_true(plan_has(&l, turn_pos(f, &q, 1)));  /* end of the system prompt */
    assert_true(plan_has(&l, turn_pos(f, &q, 2)));  /* after the latest real user message */
    assert_true(plan_has(&l, turn_pos(f, &q, 4)));  /* the generation header */
    assert_int_equal(l.n_ckpt, 4);                  /* ... and the end */
    cache_release(c, &l, false);
    cache_free(c);

    /* a template with other headers: "human" and "narrator" mean nothing to the server's
     * map, so that plan has only the header and the end */
    struct toks h = {0};
    toks_add_text(f, &h, "<|im_start|>narrator\nA story.<|im_end|>\n<|im_start|>human\nGo on.<|im_end|>\n"
                         "<|im_start|>gpt\nOnce<|im_end|>\n<|im_start|>human\nMore.<|im_end|>\n"
                         "<|im_start|>gpt\nTwice<|im_end|>\n<|im_start|>gpt\n");
    plan_of(f, &p, &h, &l, &c);
    assert_false(plan_has(&l, turn_pos(f, &h, 1)));
    assert_false(plan_has(&l, turn_pos(f, &h, 4)));
    assert_true(plan_has(&l, turn_pos(f, &h, 5)));  /* the generation header */
    assert_int_equal(l.n_ckpt, 2);                  /* ... and the end */
    cache_release(c, &l, false);
    cache_free(c);
    /* a custom map naming them changes the decision: the system prompt's end and the
     * turn after the latest user message become checkpoints */
    struct toks ids = {0};
    p.n_roles = 0;
    const struct {
        const char *text;
        enum plan_role role;
    } custom[] = {{"narrator", PLAN_ROLE_SYSTEM}, {"human", PLAN_ROLE_USER}, {"gpt", PLAN_ROLE_ASSISTANT}};
    for (size_t i = 0; i < 3; i++) {
        toks_free(&ids);
        char text[64];
        snprintf(text, sizeof text, "<|im_start|>%s", custom[i].text);
        toks_add_text(f, &ids, text);
        assert_true(ids.n >= 2 && ids.n - 1 <= CACHE_ROLE_MAX_TOKENS);
        struct cache_role_rule *r = &p.roles[p.n_roles++];
        r->n = (uint32_t)(ids.n - 1);
        memcpy(r->toks, ids.v + 1, r->n * sizeof *ids.v);
        r->role = custom[i].role;
    }
    plan_of(f, &p, &h, &l, &c);
    assert_true(plan_has(&l, turn_pos(f, &h, 1)));  /* end of the narrator's (system) turn */
    assert_true(plan_has(&l, turn_pos(f, &h, 4)));  /* after the latest human (user) turn */
    assert_true(plan_has(&l, turn_pos(f, &h, 5)));
    assert_int_equal(l.n_ckpt, 4);
    cache_release(c, &l, false);
    cache_free(c);
    /* a malformed map is refused */
    p.roles[0].n = 0;
    assert_int_equal(cache_new(f->m, &p, &c), TERN_ERR_INVALID);
    toks_free(&ids);
    toks_free(&q);
    toks_free(&h);
}

/* Predictive priming: the predicted prefix is primed ahead; a request that matches it
 * resumes at its end (tier predicted) and equals a cold run; a wrong prediction is never
 * used; a pre-empted one is still valid up to where it got. */
static int stop_after_first_chunk(void *user, size_t done, size_t total) {
    (void)total;
    (void)user;
    return done > 0;
}

static void predict(struct fixture *f, struct cache *c, const struct toks *q, uint32_t mark, bool preempt) {
    struct cache_ident id = {.tenant = "", .key = NULL};
    struct cache_lease l;
    assert_int_equal(cache_predict_begin(c, &id, q->v, q->n, &mark, 1, &l), TERN_OK);
    assert_int_equal(l.decision.tier, CACHE_TIER_PREDICTED);
    struct tern_eval_opts o = {.n_chunk = 16, .user = &l, .ckpt_pos = l.ckpt_pos, .n_ckpt = l.n_ckpt,
                               .on_ckpt = cache_on_checkpoint, .progress = preempt ? stop_after_first_chunk : NULL};
    enum tern_status st = tern_session_eval(l.session, q->v + l.decision.cached, q->n - l.decision.cached, &o);
    assert_int_equal(st, preempt ? TERN_ERR_CANCELLED : TERN_OK);
    (void)f;
    cache_predict_end(c, &l, true);
}

static void test_predictions(void **state) {
    struct fixture *f = *state;
    struct cache_params p;
    default_params(f, &p);
    struct cache *c;
    assert_int_equal(cache_new(f->m, &p, &c), TERN_OK);
    struct toks p1 = {0}, q = {0}, p2 = {0}, wrong = {0};
    toks_add_text(f, &p1, SYS);
    toks_add_text(f, &p1, "<|im_start|>user\nWhat does main.c do?<|im_end|>\n<|im_start|>assistant\n");
    struct result r = request(f, c, "", NULL, &p1, 64);
    /* the template will re-render the reply without its reasoning once a user message
     * follows: that is the prediction */
    toks_copy(&q, &p1);
    toks_add_text(f, &q, "It parses arguments and calls run().<|im_end|>\n");
    predict(f, c, &q, (uint32_t)p1.n, false);
    struct cache_stats st;
    cache_get_stats(c, &st);
    assert_int_equal(st.predictions_made, 1);
    assert_true(st.predict_tokens > 0);
    assert_int_equal(st.n_sessions, 2);
    toks_copy(&p2, &q);
    toks_add_text(f, &p2, "<|im_start|>user\nAnd run()?<|im_end|>\n<|im_start|>assistant\n");
    r = request(f, c, "", NULL, &p2, 64);
    assert_int_equal(r.d.tier, CACHE_TIER_PREDICTED);
    assert_int_equal(r.d.cached, q.n);
    assert_equals_cold(f, &r, &p2);
    cache_get_stats(c, &st);
    assert_int_equal(st.predictions_used, 1);
    assert_int_equal(st.n_sessions, 1); /* the lineage collapsed onto the used prediction */

    /* a wrong prediction: the client sends something else */
    toks_copy(&q, &p2);
    add_generated(&q, &r);
    size_t live = q.n;
    toks_copy(&wrong, &q);
    toks_add_text(f, &q, " (predicted reply text)<|im_end|>\n");
    predict(f, c, &q, (uint32_t)live, false);
    toks_add_text(f, &wrong, "<|im_end|>\n<|im_start|>user\nsomething unexpected<|im_end|>\n<|im_start|>assistant\n");
    r = request(f, c, "", NULL, &wrong, 64);
    assert_int_not_equal(r.d.tier, CACHE_TIER_PREDICTED);
    assert_int_equal(r.d.cached, live);
    assert_equals_cold(f, &r, &wrong);
    cache_get_stats(c, &st);
    assert_int_equal(st.predictions_wasted, 1);

    /* pre-empted after its first chunk: still valid where it stopped */
    toks_copy(&q, &wrong);
    add_generated(&q, &r);
    toks_add_text(f, &q, "A long predicted reply that will not be primed to its end because a request arrives.<|im_end|>\n");
    predict(f, c, &q, (uint32_t)wrong.n, true);
    toks_copy(&p2, &q);
    toks_add_text(f, &p2, "<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n");
    r = request(f, c, "", NULL, &p2, 64);
    assert_equals_cold(f, &r, &p2);
    toks_free(&p1);
    toks_free(&q);
    toks_free(&p2);
    toks_free(&wrong);
    cache_free(c);
}

int main(void) {
    const struct CMUnitTest q3[] = {
        cmocka_unit_test_setup(test_extension_and_rewrite, setup_q3),
        cmocka_unit_test_setup(test_resumed_equals_cold_any_chunking, setup_q3),
        cmocka_unit_test_setup(test_identity_cannot_poison, setup_q3),
        cmocka_unit_test_setup(test_interleaved_conversations, setup_q3),
        cmocka_unit_test_setup(test_compaction_uses_longest_valid_point, setup_q3),
        cmocka_unit_test_setup(test_budget_evicts_lru, setup_q3),
        cmocka_unit_test_setup(test_budget_counts_running, setup_q3),
        cmocka_unit_test_setup(test_switches, setup_q3),
        cmocka_unit_test_setup(test_affinity_switch_both_paths, setup_q3),
        cmocka_unit_test_setup(test_tenant_share, setup_q3),
        cmocka_unit_test_setup(test_predictions, setup_q3),
    };
    const struct CMUnitTest q35[] = {
        cmocka_unit_test_setup(test_extension_and_rewrite, setup_q35),
        cmocka_unit_test_setup(test_resumed_equals_cold_any_chunking, setup_q35),
        cmocka_unit_test_setup(test_identity_cannot_poison, setup_q35),
        cmocka_unit_test_setup(test_interleaved_conversations, setup_q35),
        cmocka_unit_test_setup(test_compaction_uses_longest_valid_point, setup_q35),
        cmocka_unit_test_setup(test_budget_evicts_lru, setup_q35),
        cmocka_unit_test_setup(test_budget_counts_running, setup_q35),
        cmocka_unit_test_setup(test_switches, setup_q35),
        cmocka_unit_test_setup(test_affinity_switch_both_paths, setup_q35),
        cmocka_unit_test_setup(test_role_map_is_data, setup_q35),
        cmocka_unit_test_setup(test_predictions, setup_q35),
    };
    int rc = cmocka_run_group_tests_name("qwen3 (attention-only)", q3, NULL, NULL);
    rc |= cmocka_run_group_tests_name("qwen35 (hybrid)", q35, NULL, NULL);
    tern_model_free(fx_q3.m);
    tern_model_free(fx_q35.m);
    return rc;
}
