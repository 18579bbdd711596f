/* The engine backend (see engine.h). */
#include "server/engine.h"

#include "grammar/grammar.h"
#include "model/ctx-default.h"
#include "server/chat.h"
#include "server/constrain.h"
#include "server/reply.h"
#include "server/respond.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timeutil.h"
#include "util/utf8.h"

#include <malloc.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define PRIME_COMMENT_EVERY_S 2.0
/* /tokenize bounds (docs/SERVING.md, Limits and abuse): the response is ~10 bytes per
 * token, ~200 with pieces, and built as JSON nodes first, so the work and the memory of
 * one request are bounded by its text and, with pieces, by its tokens. */
#define TOKENIZE_MAX_BYTES ((size_t)1 << 20)
#define TOKENIZE_MAX_PIECES 65536
#define PREDICT_CHUNK_DEFAULT 128
#define ENG_GRAMMARS 4              /* matchers kept for grammars that come again */
#define ENG_GRAMMAR_MAX_NODES (1u << 20) /* a kept matcher with more interned stacks starts afresh */

/* Predictive priming of the most recent conversation (worker thread only). The
 * predictions are rendered lazily, in the first idle step, so that a request that
 * follows at once does not wait for the rendering. */
struct eng_predict {
    char *tenant, *key;
    json_t *messages, *tools, *kwargs, *reply;
    bool built;
    struct predict_set set;
    size_t next;                 /* the next item to prime */
    char id[48];                 /* the request the predictions follow */
    bool big;                    /* copied from a large request: trim the allocator when freed */
};

struct srv_engine {
    struct tern_model *model;
    const struct tern_model_info *info;
    const struct tern_tokenizer *tok;
    struct chat_fmt chat;
    struct cache *cache;
    uint32_t n_ctx;
    char *model_id;
    char *demo_note;
    bool state_hash;
    int64_t created;
    struct srv_backend backend;

    enum predict_mode predict;
    uint32_t predict_chunk;
    uint32_t predict_delay_ms;   /* tests only */
    uint32_t max_tokens;         /* --max-tokens (0 = no cap) */
    int32_t turn_token;
    struct eng_predict pred;
    struct tern_gvocab *gvocab;  /* token pieces for grammar masks (built on first use, worker only) */
    /* matchers of the grammars used last (worker only): a grammar that comes again
     * (an agent's tools, every turn) finds its mask cache warm */
    struct eng_gram {
        struct tern_grammar *g;  /* owned */
        struct tern_gmatch *m;
        uint64_t used;
    } gram[ENG_GRAMMARS];
    uint64_t gram_tick;
    /* figures for /metrics (read from other threads) */
    atomic_uint_fast64_t pred_us, pred_runs, pred_preempted, pred_skipped;
    atomic_int pred_active;

    enum spec_mode spec;
    uint32_t spec_max;
    atomic_uint_fast64_t spec_drafted, spec_accepted, spec_rounds, spec_refed;
};

/* What prepare found out, for run. */
struct eng_job {
    bool in_think;               /* the prompt opened <think> */
    int32_t *forced;             /* test-only forced output tokens */
    size_t n_forced;
    struct tern_grammar *tool_grammar; /* tool_choice required / named (owned) */
    struct tern_grammar *lazy_grammar; /* tool_choice auto: the calls, from the trigger on (owned) */
    int32_t *prefix;             /* test-only forced prefix tokens */
    size_t n_prefix;
};

/* ---- prepare (connection threads) -------------------------------------------------- */

static bool fail_status(struct srv_error *err, enum tern_status st, const char *what) {
    if (st == TERN_ERR_NOMEM) srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory (%s)", what);
    else if (st == TERN_ERR_TEMPLATE || st == TERN_ERR_LIMIT)
        srv_error_bad(err, "messages", "the chat template failed: %s", tern_last_error());
    else srv_error_set(err, 500, "server_error", NULL, NULL, "%s: %s", what, tern_last_error());
    return false;
}

static bool engine_prepare(void *self, struct srv_job *j, struct srv_error *err) {
    struct srv_engine *e = self;
    struct eng_job *ej = tern_calloc(1, sizeof *ej);
    if (!ej) return fail_status(err, TERN_ERR_NOMEM, "job");
    j->priv = ej;
    size_t cap = 0;
    enum tern_status st;
    if (j->ep == SRV_EP_CHAT) {
        json_t *vars = srv_template_vars(&j->req, e->chat.bos_text, e->chat.eos_text);
        if (!vars) return fail_status(err, TERN_ERR_NOMEM, "template variables");
        struct tern_buf text = TERN_BUF_INIT;
        st = chat_fmt_render(&e->chat, vars, &text);
        json_decref(vars);
        if (st) {
            tern_buf_free(&text);
            return fail_status(err, st, "template");
        }
        ej->in_think = reply_prompt_opens_think(e->chat.fmt, text.data, text.len);
        if (!j->req.tools && (j->req.tool_choice == SRV_TOOLS_REQUIRED || j->req.tool_choice == SRV_TOOLS_NAMED)) {
            tern_buf_free(&text);
            srv_error_bad(err, "tool_choice", "'tool_choice' asks for a tool call, but the request has no 'tools'");
            return false;
        }
        if (srv_tools_enforced(&j->req)) {
            if (j->req.grammar) {
                tern_buf_free(&text);
                srv_error_bad(err, j->req.grammar_kind, "'%s' cannot be combined with tool_choice '%s'",
                              j->req.grammar_kind, j->req.tool_choice == SRV_TOOLS_NAMED ? "function" : "required");
                return false;
            }
            struct tern_buf g = TERN_BUF_INIT;
            bool ok = srv_tool_gbnf(&j->req, (enum srv_tool_syntax)e->chat.tool_syntax, ej->in_think, &g, err) &&
                      srv_grammar_compile(g.data, g.len, "tools", &ej->tool_grammar, err);
            if (!ok && err->status == 400 && !strcmp(err->param, "tools"))
                TERN_LOG_WARN("tool-call grammar refused: %s\n%s", err->message, g.data ? g.data : "");
            tern_buf_free(&g);
            if (!ok) {
                tern_buf_free(&text);
                return false;
            }
        } else if (j->req.tools && j->req.tool_choice == SRV_TOOLS_AUTO && !j->req.grammar && !j->req.forced_output &&
                   e->chat.tool_syntax != SRV_TOOL_SYNTAX_NONE) {
            /* lazy: free text until the model opens a call, then the call is held to the
             * tools' schemas. A schema the converter refuses leaves auto unconstrained, as
             * it always was (no 400 for a request that worked before). */
            struct srv_request rq = j->req;
            rq.tool_choice = SRV_TOOLS_REQUIRED;
            struct tern_buf g = TERN_BUF_INIT;
            struct srv_error lerr;
            if (!srv_tool_gbnf(&rq, (enum srv_tool_syntax)e->chat.tool_syntax, false, &g, &lerr) ||
                !srv_grammar_compile(g.data, g.len, "tools", &ej->lazy_grammar, &lerr))
                TERN_LOG_INFO("tool calls of this request are not constrained: %s", lerr.message);
            tern_buf_free(&g);
        }
        st = chat_fmt_tokenize(&e->chat, text.data ? text.data : "", text.len, &j->prompt, &j->n_prompt, &cap);
        tern_buf_free(&text);
        if (st) return fail_status(err, st, "tokenizer");
    } else if (j->req.prompt) {
        st = tern_tokenize(e->tok, j->req.prompt, strlen(j->req.prompt), TERN_TOK_ADD_SPECIAL | TERN_TOK_PARSE_SPECIAL,
                           &j->prompt, &j->n_prompt, &cap);
        if (st) return fail_status(err, st, "tokenizer");
    } else {
        uint32_t nv = tern_tokenizer_n_vocab(e->tok);
        for (size_t i = 0; i < j->req.n_prompt_ids; i++) {
            if ((uint32_t)j->req.prompt_ids[i] >= nv) {
                srv_error_bad(err, "prompt", "'prompt[%zu]' is token %d; the vocabulary has %u tokens", i,
                              j->req.prompt_ids[i], nv);
                return false;
            }
        }
        j->prompt = tern_malloc(j->req.n_prompt_ids * sizeof *j->prompt);
        if (!j->prompt) return fail_status(err, TERN_ERR_NOMEM, "prompt");
        memcpy(j->prompt, j->req.prompt_ids, j->req.n_prompt_ids * sizeof *j->prompt);
        j->n_prompt = j->req.n_prompt_ids;
    }
    if (j->n_prompt == 0) {
        srv_error_bad(err, j->ep == SRV_EP_CHAT ? "messages" : "prompt", "the prompt is empty (0 tokens)");
        return false;
    }
    if (j->n_prompt >= e->n_ctx) {
        srv_error_set(err, 400, "invalid_request_error", "context_length_exceeded",
                      j->ep == SRV_EP_CHAT ? "messages" : "prompt",
                      "the prompt is %zu tokens; the context holds %u (--ctx-size), and at least one token must be "
                      "left to generate",
                      j->n_prompt, e->n_ctx);
        return false;
    }
    if (j->req.forced_prefix) {
        size_t pcap = 0;
        st = tern_tokenize(e->tok, j->req.forced_prefix, strlen(j->req.forced_prefix), TERN_TOK_PARSE_SPECIAL,
                           &ej->prefix, &ej->n_prefix, &pcap);
        if (st) return fail_status(err, st, "tokenizer");
    }
    if (j->req.forced_output) {
        size_t fcap = 0;
        st = tern_tokenize(e->tok, j->req.forced_output, strlen(j->req.forced_output), TERN_TOK_PARSE_SPECIAL,
                           &ej->forced, &ej->n_forced, &fcap);
        if (st) return fail_status(err, st, "tokenizer");
    }
    return true;
}

static void engine_job_free(void *self, struct srv_job *j) {
    (void)self;
    struct eng_job *ej = j->priv;
    if (!ej) return;
    free(ej->forced);
    free(ej->prefix);
    tern_grammar_free(ej->tool_grammar);
    tern_grammar_free(ej->lazy_grammar);
    free(ej);
    j->priv = NULL;
}

/* ---- run (the worker) -------------------------------------------------------------- */

/* The lease must be the first member: tern_eval_opts passes one user pointer to both
 * the progress callback (which wants the job) and cache_on_checkpoint (the lease). */
struct prime_ctx {
    struct cache_lease lease;
    struct srv_job *job;
    size_t base;                 /* tokens already there (r) */
    size_t total;                /* m */
    double t_last;
};

static int prime_progress(void *user, size_t done, size_t total) {
    struct prime_ctx *pc = user;
    (void)total;
    double now = tern_now_s();
    if (pc->job->req.stream && now - pc->t_last >= PRIME_COMMENT_EVERY_S) {
        char line[96];
        int n = snprintf(line, sizeof line, ": priming %zu/%zu\n\n", pc->base + done, pc->total);
        srv_job_write(pc->job, line, (size_t)n);
        pc->t_last = now;
    }
    return atomic_load(&pc->job->cancel) ? 1 : 0;
}

struct out_state {
    struct srv_job *job;
    struct srv_resp_ctx ctx;
    struct reply_parser parser;  /* chat */
    struct tern_buf text;        /* completions: the whole text */
    struct stop_matcher stop;
    struct tern_detok *detok;
    struct tern_buf piece, safe, frame;
    bool role_sent;
};

/* Pushes text through the stop matcher and the parser; streams what is decided. */
static enum tern_status out_text(struct out_state *o, const char *s, size_t n, bool flush) {
    enum tern_status st = TERN_OK;
    tern_buf_clear(&o->safe);
    if (n) st = stop_matcher_feed(&o->stop, s, n, &o->safe);
    if (!st && flush) st = stop_matcher_flush(&o->stop, &o->safe);
    if (st) return st;
    struct srv_job *j = o->job;
    if (j->ep == SRV_EP_CHAT) {
        if (o->safe.len) st = reply_parser_feed(&o->parser, o->safe.data, o->safe.len);
        if (!st && flush) st = reply_parser_finish(&o->parser);
        if (st) return st;
        struct reply_delta *d = reply_parser_delta(&o->parser);
        if (j->req.stream && !reply_delta_empty(d)) {
            st = srv_sse_data(&o->frame, srv_chunk_chat(&o->ctx, d, &o->parser, !o->role_sent, NULL, NULL));
            o->role_sent = true;
        }
        reply_delta_reset(d);
    } else if (o->safe.len) {
        st = tern_buf_append(&o->text, o->safe.data, o->safe.len);
        if (!st && j->req.stream) st = srv_sse_data(&o->frame, srv_chunk_text(&o->ctx, o->safe.data, o->safe.len, NULL, NULL));
    }
    if (o->frame.len) {
        srv_job_write(j, o->frame.data, o->frame.len);
        tern_buf_clear(&o->frame);
    }
    return st;
}

static void log_state_hashes(struct tern_session *s, const char *id) {
    struct tern_hash_component comps[256];
    size_t n = tern_session_hash_components(s, comps, TERN_ARRAY_LEN(comps));
    struct tern_buf b = TERN_BUF_INIT;
    tern_buf_printf(&b, "state-hash %s n_past=%u total=%016llx", id, tern_session_n_past(s),
                    (unsigned long long)tern_session_hash(s));
    for (size_t i = 0; i < n && i < TERN_ARRAY_LEN(comps); i++)
        tern_buf_printf(&b, " %s=%016llx", comps[i].name, (unsigned long long)comps[i].hash);
    TERN_LOG_INFO("%s", b.data);
    tern_buf_free(&b);
}

static void send_failure(struct srv_job *j, int status, const char *type, const char *fmt, const char *msg) {
    struct srv_error err;
    srv_error_set(&err, status, type, NULL, NULL, fmt, msg);
    size_t nl = strnlen(err.message, sizeof j->note - 1);
    memcpy(j->note, err.message, nl);
    j->note[nl] = 0;
    struct tern_buf b = TERN_BUF_INIT;
    if (j->req.stream) {
        srv_sse_error(&b, &err);
    } else {
        char *s = srv_error_json(&err);
        if (s) tern_buf_puts(&b, s);
        free(s);
    }
    if (b.len) srv_job_write(j, b.data, b.len);
    tern_buf_free(&b);
    srv_job_finish(j, status);
}

/* ---- predictive priming (the worker, idle) ---------------------------------------------- */

static void pred_clear(struct eng_predict *p) {
    free(p->tenant);
    free(p->key);
    json_decref(p->messages);
    json_decref(p->tools);
    json_decref(p->kwargs);
    json_decref(p->reply);
    predict_set_free(&p->set);
    bool big = p->big;
    memset(p, 0, sizeof *p);
    if (big) malloc_trim(0); /* its JSON copy was many small allocations */
}

/* Records the conversation a response just completed, for the idle steps. */
static void predict_follow(struct srv_engine *e, struct srv_job *j, const struct reply_parser *parser) {
    struct eng_predict *p = &e->pred;
    if (p->messages && (!p->built || p->next < p->set.n))
        TERN_LOG_DEBUG("predict: the rest of %s's predictions gives way to %s's", p->id, j->id);
    pred_clear(p);
    p->reply = predict_reply_message(parser);
    p->tenant = tern_strdup(j->tenant ? j->tenant : "");
    p->key = j->key ? tern_strdup(j->key) : NULL;
    if (!p->reply || !p->tenant || (j->key && !p->key) || !j->req.messages) {
        pred_clear(p);
        return;
    }
    /* Copies, not references: the request's JSON is freed by whichever thread drops the
     * job last (often a connection's), while these are read and freed by the worker.
     * jansson's reference counts do not order those reads before that free (TSan). */
    p->big = j->big_body;
    p->messages = json_deep_copy(j->req.messages);
    p->tools = j->req.tools ? json_deep_copy(j->req.tools) : NULL;
    p->kwargs = j->req.template_kwargs ? json_deep_copy(j->req.template_kwargs) : NULL;
    if (!p->messages || (j->req.tools && !p->tools) || (j->req.template_kwargs && !p->kwargs)) {
        pred_clear(p);
        return;
    }
    snprintf(p->id, sizeof p->id, "%s", j->id);
    atomic_store(&e->pred_active, 1);
}

/* The lease must be the first member (see prime_ctx). */
struct pred_ctx {
    struct cache_lease lease;
    const atomic_int *preempt;
    uint32_t delay_ms;
};

/* Tests only (TERN_TEST_PREDICT_DELAY_MS): a pause after every chunk, cut short by a
 * request, so that a test can be sure to send one mid-prediction. */
static int pred_progress(void *user, size_t done, size_t total) {
    struct pred_ctx *pc = user;
    (void)done;
    (void)total;
    for (uint32_t t = 0; t < pc->delay_ms && !atomic_load(pc->preempt); t += 5) {
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return atomic_load(pc->preempt) ? 1 : 0;
}

static bool prime_one(struct srv_engine *e, struct eng_predict *p, const struct predict_item *it,
                      const atomic_int *preempt);

/* One idle step: renders the predictions, or primes the next one. */
static bool engine_idle(void *self, const atomic_int *preempt) {
    struct srv_engine *e = self;
    struct eng_predict *p = &e->pred;
    if (!p->messages) {
        atomic_store(&e->pred_active, 0);
        return false;
    }
    if (!p->built) {
        double t0 = tern_now_s();
        enum tern_status st = predict_build(&e->chat, e->turn_token, p->messages, p->tools, p->kwargs, p->reply,
                                            e->predict, &p->set);
        p->built = true;
        p->next = 0;
        if (st) TERN_LOG_WARN("predict: after %s: %s", p->id, tern_last_error());
        else TERN_LOG_DEBUG("predict: after %s: %zu predictions rendered in %.3fs", p->id, p->set.n,
                            tern_now_s() - t0);
        atomic_fetch_add(&e->pred_us, (uint64_t)((tern_now_s() - t0) * 1e6));
        /* the JSON is not needed any more */
        json_decref(p->reply);
        p->reply = NULL;
        return true;
    }
    if (p->next >= p->set.n) {
        pred_clear(p);
        atomic_store(&e->pred_active, 0);
        return false;
    }
    const struct predict_item *it = &p->set.items[p->next++];
    bool more = prime_one(e, p, it, preempt);
    if (!more) {
        pred_clear(p);
        atomic_store(&e->pred_active, 0);
    }
    return more;
}

/* Primes one prediction; returns whether more are left. */
static bool prime_one(struct srv_engine *e, struct eng_predict *p, const struct predict_item *it,
                      const atomic_int *preempt) {
    bool more = p->next < p->set.n;
    if (it->n >= e->n_ctx) {
        atomic_fetch_add(&e->pred_skipped, 1);
        return more;
    }
    struct cache_ident ident = {.tenant = p->tenant, .key = p->key};
    struct pred_ctx pc = {.preempt = preempt, .delay_ms = e->predict_delay_ms};
    double t0 = tern_now_s();
    enum tern_status st = cache_predict_begin_flags(e->cache, &ident, it->toks, it->n, it->marks, it->n_marks,
                                                    it->keep ? CACHE_PREDICT_KEEP : 0, &pc.lease);
    if (st) {
        /* nothing to build on, or already covered: not an error */
        if (st == TERN_ERR_STATE) TERN_LOG_DEBUG("predict: %s after %s: %s", it->variant, p->id, tern_last_error());
        else TERN_LOG_WARN("predict: %s after %s: %s", it->variant, p->id, tern_last_error());
        atomic_fetch_add(&e->pred_skipped, 1);
        return more;
    }
    uint32_t r = pc.lease.decision.cached;
    struct tern_eval_opts eo = {
        .n_chunk = e->predict_chunk,
        .cancel = preempt,
        .progress = e->predict_delay_ms ? pred_progress : NULL,
        .user = &pc,
        .ckpt_pos = pc.lease.ckpt_pos,
        .n_ckpt = pc.lease.n_ckpt,
        .on_ckpt = cache_on_checkpoint,
    };
    st = tern_session_eval(pc.lease.session, it->toks + r, it->n - r, &eo);
    uint32_t primed = tern_session_n_past(pc.lease.session) - r;
    bool preempted = st == TERN_ERR_CANCELLED;
    if (st && !preempted) TERN_LOG_WARN("predict: %s after %s: %s", it->variant, p->id, tern_last_error());
    cache_predict_end(e->cache, &pc.lease, !st || preempted);
    double dt = tern_now_s() - t0;
    atomic_fetch_add(&e->pred_us, (uint64_t)(dt * 1e6));
    atomic_fetch_add(&e->pred_runs, 1);
    if (preempted) atomic_fetch_add(&e->pred_preempted, 1);
    TERN_LOG_INFO("predict: %s after %s: %zu tokens, resumed at %u, primed %u in %.3fs%s", it->variant, p->id, it->n, r,
                  primed, dt, preempted ? " (pre-empted by a request; kept up to there)" : "");
    return more;
}

/* The vocabulary trie (built once, on the first constrained request) and a mask buffer. */
static enum tern_status grammar_runtime(struct srv_engine *e, uint32_t **mask) {
    if (!e->gvocab) {
        double t0 = tern_now_s();
        enum tern_status st = tern_gvocab_from_tokenizer(e->tok, &e->gvocab);
        if (st) return st;
        TERN_LOG_INFO("grammar: vocabulary trie of %zu nodes built in %.3fs", tern_gvocab_n_nodes(e->gvocab),
                      tern_now_s() - t0);
    }
    if (!*mask && !(*mask = tern_malloc(((size_t)e->info->n_vocab + 31) / 32 * sizeof **mask)))
        return tern_errorf(TERN_ERR_NOMEM, "out of memory for the token mask");
    return TERN_OK;
}

/* The matcher for a job's grammar (*owner): a kept one (reset) when the same grammar
 * came before, else a new one that is kept, taking the grammar over from the job. */
static enum tern_status grammar_matcher(struct srv_engine *e, struct tern_grammar **owner, struct tern_gmatch **out) {
    size_t lru = 0;
    for (size_t i = 0; i < ENG_GRAMMARS; i++) {
        struct eng_gram *k = &e->gram[i];
        if (k->g && tern_grammar_same(k->g, *owner)) {
            struct tern_gmatch_stats gs;
            tern_gmatch_get_stats(k->m, &gs);
            if (gs.n_stack_nodes <= ENG_GRAMMAR_MAX_NODES) {
                tern_gmatch_reset(k->m);
                k->used = ++e->gram_tick;
                *out = k->m;
                return TERN_OK;
            }
            lru = i;
            break;
        }
        if (!k->g || k->used < e->gram[lru].used) lru = i;
    }
    struct eng_gram *k = &e->gram[lru];
    tern_gmatch_free(k->m);
    tern_grammar_free(k->g);
    k->g = NULL;
    k->m = NULL;
    enum tern_status st = tern_gmatch_new(*owner, e->gvocab, &k->m);
    if (st) return st;
    k->g = *owner;
    *owner = NULL;
    k->used = ++e->gram_tick;
    *out = k->m;
    return TERN_OK;
}

/* Is text[0..at) inside a reasoning block (after the last <think> and no </think> since,
 * or the prompt opened one that is still open)? */
static bool in_reasoning(const char *text, size_t at, bool prompt_opened) {
    const char *last_open = NULL, *last_close = NULL;
    for (const char *p = text; (p = memmem(p, (size_t)(text + at - p), "<think>", 7)); p += 7) last_open = p;
    for (const char *p = text; (p = memmem(p, (size_t)(text + at - p), "</think>", 8)); p += 8) last_close = p;
    if (last_open) return !last_close || last_close < last_open;
    return prompt_opened && !last_close;
}

static void engine_run(void *self, struct srv_job *j) {
    struct srv_engine *e = self;
    struct eng_job *ej = j->priv;
    struct prime_ctx pc = {.job = j, .total = j->n_prompt, .t_last = tern_now_s()};
    struct cache_ident ident = {.tenant = j->tenant ? j->tenant : "", .key = j->key};
    enum tern_status st = cache_acquire(e->cache, &ident, j->prompt, j->n_prompt, &pc.lease);
    if (st) {
        send_failure(j, st == TERN_ERR_NOMEM ? 503 : 500, "server_error", "cannot start the request: %s",
                     tern_last_error());
        return;
    }
    struct tern_session *s = pc.lease.session;
    const struct cache_decision *dec = &pc.lease.decision;
    j->n_cached = dec->cached;
    j->n_read = dec->read;
    pc.base = dec->cached;
    struct srv_reuse reuse = {
        .tier = cache_tier_name(dec->tier),
        .cached = dec->cached,
        .read = dec->read,
        .key = dec->key_explicit ? "explicit" : dec->key_implicit ? "implicit" : "none",
        .reason = dec->reason,
    };

    struct out_state o = {.job = j};
    o.ctx = (struct srv_resp_ctx){.id = j->id, .model = e->model_id, .created = j->created, .ep = j->ep};
    reply_parser_init(&o.parser, e->chat.fmt, j->req.tools && j->req.tool_choice != SRV_TOOLS_NONE, ej->in_think,
                      j->seq * 0x9e3779b97f4a7c15ull ^ (uint64_t)j->created);
    stop_matcher_init(&o.stop, (const char *const *)j->req.stop, j->req.n_stop);
    struct tern_sampler *sampler = NULL;
    struct spec_dec sd = {0};
    struct tern_gmatch *gm = NULL;   /* the grammar's matcher (NULL: unconstrained) */
    uint32_t *gmask = NULL;
    double t_mask = 0;
    struct tern_gmatch_stats gstats0 = {0};
    struct tern_buf gtail = TERN_BUF_INIT; /* the output so far, under a grammar (for the lazy trigger and the log) */
    size_t lazy_scan = 0;                  /* where the lazy trigger search goes on */
    bool release_ok = true, completed = false;
    const char *finish = "stop";
    int status = 200;

    /* prime P[r..m) */
    struct tern_eval_opts eo = {
        .cancel = &j->cancel,
        .progress = prime_progress,
        .user = &pc,
        .ckpt_pos = pc.lease.ckpt_pos,
        .n_ckpt = pc.lease.n_ckpt,
        .on_ckpt = cache_on_checkpoint,
    };
    uint32_t r = dec->cached;
    double t_prime = tern_now_s();
    st = tern_session_eval(s, j->prompt + r, j->n_prompt - r, &eo);
    j->t_prime = tern_now_s() - t_prime;
    if (st == TERN_ERR_CANCELLED) goto cancelled;
    if (st) {
        release_ok = false;
        send_failure(j, st == TERN_ERR_RANGE ? 400 : 500, st == TERN_ERR_RANGE ? "invalid_request_error" : "server_error",
                     "reading the prompt failed: %s", tern_last_error());
        goto out;
    }

    struct tern_sampler_params sp = j->req.sampling;
    if (!j->req.seed_set) sp.seed = tern_now_ns() ^ (j->seq << 32);
    st = tern_sampler_new(&sp, e->info->n_vocab, &sampler);
    if (!st) st = tern_detok_new(e->tok, TERN_TOK_PARSE_SPECIAL, &o.detok);
    struct tern_grammar **grammar = ej->tool_grammar ? &ej->tool_grammar : j->req.grammar ? &j->req.grammar : NULL;
    if (!st && grammar) {
        st = grammar_runtime(e, &gmask);
        if (!st) st = grammar_matcher(e, grammar, &gm);
        if (!st) tern_gmatch_get_stats(gm, &gstats0);
    }
    if (st) {
        send_failure(j, 500, "server_error", "cannot start decoding: %s", tern_last_error());
        goto out;
    }
    if (j->req.stream && j->ep == SRV_EP_CHAT) {
        if (srv_sse_data(&o.frame, srv_chunk_chat(&o.ctx, NULL, &o.parser, true, NULL, NULL))) {
            send_failure(j, 500, "server_error", "%s", "out of memory building the first stream event");
            goto out;
        }
        o.role_sent = true;
    }

    /* Speculative decoding (spec.h): the decoder samples and evaluates for the loop.
     * Forced output (tests) bypasses it. A grammar (also one that a tool call may
     * trigger later) or a forced prefix turns drafting off: the mask is applied to each
     * sampled token in turn and the loop reads the session's logits itself, so the
     * session must never run ahead of the accepted tokens (docs/spec.md). */
    if (!ej->forced) {
        struct spec_params spp = {.mode = j->req.spec_set ? j->req.spec : e->spec,
                                  .max = j->req.spec_max ? j->req.spec_max : e->spec_max};
        if (gm || ej->lazy_grammar || ej->n_prefix) spp.mode = SPEC_OFF;
        if ((st = spec_dec_init(&sd, s, sampler, &spp, &j->cancel))) {
            send_failure(j, 500, "server_error", "cannot start decoding: %s", tern_last_error());
            goto out;
        }
    }
    uint32_t n_ctx = tern_session_n_ctx(s);
    /* the request's max_tokens, within the server's cap: a request that names none (or
     * more) still ends, with finish_reason "length", instead of holding the worker until
     * the context is full */
    int64_t max_new = j->req.max_tokens > 0 ? j->req.max_tokens : INT64_MAX;
    if (e->max_tokens > 0 && max_new > (int64_t)e->max_tokens) max_new = e->max_tokens;
    finish = "length";
    for (int64_t i = 0; i < max_new; i++) {
        if (atomic_load(&j->cancel)) goto cancelled;
        int32_t tok;
        if (ej->forced) {
            if ((size_t)i >= ej->n_forced) {
                finish = "stop";
                break;
            }
            tok = ej->forced[i];
            if (gm && !tern_gmatch_accept_token(gm, tok)) {
                char msg[160];
                snprintf(msg, sizeof msg, "forced output token %d (at %lld) is not allowed by the grammar", tok,
                         (long long)i);
                send_failure(j, 500, "server_error", "%s", msg);
                goto out;
            }
        } else if ((size_t)i < ej->n_prefix) {
            tok = ej->prefix[i];
            if (gm && !tern_gmatch_accept_token(gm, tok)) {
                char msg[160];
                snprintf(msg, sizeof msg, "forced prefix token %d (at %lld) is not allowed by the grammar", tok,
                         (long long)i);
                send_failure(j, 500, "server_error", "%s", msg);
                goto out;
            }
        } else if (gm) {
            double t0 = tern_now_s();
            enum tern_status gst;
            size_t n_allowed = tern_gmatch_mask(gm, gmask, &gst);
            t_mask += tern_now_s() - t0;
            const float *logits = tern_session_logits(s);
            tok = n_allowed ? tern_sampler_sample_masked(sampler, logits, gmask, tern_session_tokens(s),
                                                         tern_session_n_past(s))
                            : -1;
            if (tok < 0 || !tern_gmatch_accept_token(gm, tok)) {
                char msg[300];
                if (gst) snprintf(msg, sizeof msg, "%s", tern_last_error());
                else snprintf(msg, sizeof msg, "the grammar allows no token of the vocabulary after %lld generated "
                              "tokens (the output so far is not a complete match)", (long long)i);
                TERN_LOG_WARN("grammar: %s stuck after: %.*s", j->id, (int)(gtail.len > 2000 ? 2000 : gtail.len),
                              gtail.data ? gtail.data + (gtail.len > 2000 ? gtail.len - 2000 : 0) : "");
                send_failure(j, 500, "server_error", "constrained decoding stopped: %s", msg);
                goto out;
            }
            if (tern_token_is_eog(e->tok, tok)) {
                finish = "stop";
                break;
            }
        } else {
            tok = spec_next(&sd);
            if (tern_token_is_eog(e->tok, tok)) {
                finish = "stop";
                break;
            }
        }
        if (j->n_generated == 0) j->t_first = tern_now_s();
        j->n_generated++;
        tern_buf_clear(&o.piece);
        st = tern_detok_push(o.detok, tok, &o.piece);
        if (!st) st = out_text(&o, o.piece.data, o.piece.len, false);
        if (!st && (gm || ej->lazy_grammar)) st = tern_buf_append(&gtail, o.piece.data ? o.piece.data : "", o.piece.len);
        if (!st && !gm && ej->lazy_grammar) {
            /* the lazy trigger: a call opened outside reasoning */
            static const char trig[] = "<tool_call>";
            const char *f = gtail.len > lazy_scan ? memmem(gtail.data + lazy_scan, gtail.len - lazy_scan, trig, sizeof trig - 1) : NULL;
            lazy_scan = gtail.len >= sizeof trig - 1 ? gtail.len - (sizeof trig - 2) : 0;
            if (f && !in_reasoning(gtail.data, (size_t)(f - gtail.data), ej->in_think)) {
                st = grammar_runtime(e, &gmask);
                if (!st) st = grammar_matcher(e, &ej->lazy_grammar, &gm);
                if (!st) {
                    tern_gmatch_get_stats(gm, &gstats0);
                    size_t at = (size_t)(f - gtail.data);
                    if (!tern_gmatch_accept_bytes(gm, f, gtail.len - at)) {
                        /* the token that opened the call ran on in a way the grammar does
                         * not allow: too late to hold it; the call is parsed as it comes */
                        TERN_LOG_WARN("grammar: %s: the tool call opened as '%.*s', which the tools' grammar does not "
                                      "allow; it is not constrained",
                                      j->id, (int)(gtail.len - at > 80 ? 80 : gtail.len - at), f);
                        gm = NULL;
                    }
                    tern_grammar_free(ej->lazy_grammar);
                    ej->lazy_grammar = NULL;
                }
            }
        }
        if (st) {
            send_failure(j, 500, "server_error", "output: %s", tern_last_error());
            goto out;
        }
        if (o.stop.stopped) {
            finish = "stop";
            break;
        }
        if (i + 1 >= max_new) break;
        if ((ej->forced ? tern_session_n_past(s) : spec_n_past(&sd)) + 1 >= n_ctx)
            break; /* the context is full (prompt + reply = n_ctx): length */
        if (ej->forced) {
            struct tern_eval_opts de = {.cancel = &j->cancel};
            st = tern_session_eval(s, &tok, 1, &de);
        } else {
            st = spec_accept(&sd, tok, (size_t)(max_new - i - 1)); /* drafts stop at max_tokens */
        }
        if (st == TERN_ERR_CANCELLED) goto cancelled;
        if (st == TERN_ERR_RANGE) break;
        if (st) {
            release_ok = false;
            send_failure(j, 500, "server_error", "decoding failed: %s", tern_last_error());
            goto out;
        }
    }
    tern_buf_clear(&o.piece);
    tern_detok_flush(o.detok, &o.piece);
    if (out_text(&o, o.piece.data, o.piece.len, true)) {
        send_failure(j, 500, "server_error", "output: %s", "out of memory");
        goto out;
    }
    if (j->ep == SRV_EP_CHAT && o.parser.n_calls > 0 && !strcmp(finish, "stop")) finish = "tool_calls";

    {
        struct srv_usage u = {.prompt_tokens = (uint32_t)j->n_prompt, .completion_tokens = j->n_generated,
                              .cached_tokens = dec->cached};
        if (j->req.stream) {
            /* the stream ends with [DONE] only when every event before it was built; else
             * with an error event (never silently short) */
            enum tern_status fst =
                j->ep == SRV_EP_CHAT ? srv_sse_data(&o.frame, srv_chunk_chat(&o.ctx, NULL, &o.parser, false, finish, &reuse))
                                     : srv_sse_data(&o.frame, srv_chunk_text(&o.ctx, "", 0, finish, &reuse));
            if (!fst && j->req.include_usage) fst = srv_sse_data(&o.frame, srv_chunk_usage(&o.ctx, &u, &reuse));
            if (!fst) fst = srv_sse_done(&o.frame);
            if (fst) {
                if (o.frame.len) srv_job_write(j, o.frame.data, o.frame.len);
                send_failure(j, 500, "server_error", "%s", "out of memory building the stream's last events");
                goto out;
            }
        } else {
            json_t *resp = j->ep == SRV_EP_CHAT ? srv_response_chat(&o.ctx, &o.parser, finish, &u, &reuse)
                                                : srv_response_text(&o.ctx, o.text.data, o.text.len, finish, &u, &reuse);
            char *txt = resp ? json_dumps(resp, JSON_COMPACT) : NULL;
            json_decref(resp);
            if (!txt) {
                send_failure(j, 500, "server_error", "%s", "out of memory building the response");
                goto out;
            }
            tern_buf_puts(&o.frame, txt);
            free(txt);
        }
        srv_job_write(j, o.frame.data, o.frame.len);
        srv_job_finish(j, status);
        completed = true;
    }
    goto out;

cancelled:
    /* the session holds a consistent prefix (chunk boundary): it stays usable */
    snprintf(j->note, sizeof j->note, "cancelled (client went away)");
    srv_job_finish(j, 499);

out:
    /* The session holds exactly the accepted tokens before it is hashed or parked. */
    if (sd.s && spec_finish(&sd)) {
        TERN_LOG_WARN("spec: %s: %s", j->id, tern_last_error());
        release_ok = false;
    }
    if (sd.st.rounds) {
        j->n_drafted = (uint32_t)sd.st.drafted;
        j->n_accepted = (uint32_t)sd.st.accepted;
        TERN_LOG_DEBUG("spec: %s %s drafted=%llu accepted=%llu rounds=%llu refed=%llu", j->id, spec_mode_name(sd.mode),
                       (unsigned long long)sd.st.drafted, (unsigned long long)sd.st.accepted,
                       (unsigned long long)sd.st.rounds, (unsigned long long)sd.st.refed);
        atomic_fetch_add(&e->spec_drafted, sd.st.drafted);
        atomic_fetch_add(&e->spec_accepted, sd.st.accepted);
        atomic_fetch_add(&e->spec_rounds, sd.st.rounds);
        atomic_fetch_add(&e->spec_refed, sd.st.refed);
    }
    spec_dec_free(&sd);
    if (e->state_hash) log_state_hashes(s, j->id);
    if (gm) {
        struct tern_gmatch_stats gs;
        tern_gmatch_get_stats(gm, &gs);
        TERN_LOG_INFO("grammar: %s %llu masks (%llu from the cache) in %.3fs, %llu trie nodes walked, %zu stack nodes",
                      j->id, (unsigned long long)(gs.masks - gstats0.masks),
                      (unsigned long long)(gs.cache_hits - gstats0.cache_hits), t_mask,
                      (unsigned long long)(gs.nodes_visited - gstats0.nodes_visited), gs.n_stack_nodes);
    }
    free(gmask);
    tern_buf_free(&gtail);
    cache_release(e->cache, &pc.lease, release_ok);
    /* The most recent conversation is the one predicted (the previous one's
     * predictions, primed or not, give way). */
    if (completed && release_ok && j->ep == SRV_EP_CHAT && e->predict != PREDICT_OFF) predict_follow(e, j, &o.parser);
    tern_sampler_free(sampler);
    tern_detok_free(o.detok);
    reply_parser_free(&o.parser);
    stop_matcher_free(&o.stop);
    tern_buf_free(&o.text);
    tern_buf_free(&o.piece);
    tern_buf_free(&o.safe);
    tern_buf_free(&o.frame);
}

/* ---- other routes ------------------------------------------------------------------ */

static json_t *engine_tokenize(void *self, const json_t *body, struct srv_error *err) {
    struct srv_engine *e = self;
    const json_t *c = json_object_get(body, "content");
    if (!json_is_string(c)) {
        srv_error_bad(err, "content", "'content' must be a string");
        return NULL;
    }
    const json_t *as = json_object_get(body, "add_special"), *ps = json_object_get(body, "parse_special");
    const json_t *wp = json_object_get(body, "with_pieces");
    if ((as && !json_is_boolean(as)) || (ps && !json_is_boolean(ps)) || (wp && !json_is_boolean(wp))) {
        srv_error_bad(err, NULL, "'add_special', 'parse_special' and 'with_pieces' must be booleans");
        return NULL;
    }
    int flags = (json_is_true(as) ? TERN_TOK_ADD_SPECIAL : 0) | (ps && json_is_false(ps) ? 0 : TERN_TOK_PARSE_SPECIAL);
    if (json_string_length(c) > TOKENIZE_MAX_BYTES) {
        srv_error_set(err, 413, "invalid_request_error", "request_too_large", "content",
                      "'content' is %zu bytes; /tokenize takes at most %zu (send it in parts)", json_string_length(c),
                      TOKENIZE_MAX_BYTES);
        return NULL;
    }
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    if (tern_tokenize(e->tok, json_string_value(c), json_string_length(c), flags, &ids, &n, &cap)) {
        free(ids);
        srv_error_set(err, 500, "server_error", NULL, NULL, "tokenizer: %s", tern_last_error());
        return NULL;
    }
    if (json_is_true(wp) && n > TOKENIZE_MAX_PIECES) {
        free(ids);
        srv_error_bad(err, "with_pieces", "'with_pieces' returns at most %d tokens; the content has %zu (send it in "
                      "parts, or without with_pieces)", TOKENIZE_MAX_PIECES, n);
        return NULL;
    }
    json_t *arr = json_array();
    struct tern_buf piece = TERN_BUF_INIT;
    for (size_t i = 0; i < n; i++) {
        if (json_is_true(wp)) {
            tern_buf_clear(&piece);
            tern_token_piece(e->tok, ids[i], TERN_TOK_PARSE_SPECIAL, &piece);
            json_t *pv = json_stringn(piece.data ? piece.data : "", piece.len);
            if (!pv) { /* a partial UTF-8 sequence: give the bytes */
                pv = json_array();
                for (size_t k = 0; k < piece.len; k++) json_array_append_new(pv, json_integer((unsigned char)piece.data[k]));
            }
            json_array_append_new(arr, json_pack("{s:i,s:o}", "id", (int)ids[i], "piece", pv));
        } else {
            json_array_append_new(arr, json_integer(ids[i]));
        }
    }
    tern_buf_free(&piece);
    free(ids);
    return json_pack("{s:o}", "tokens", arr);
}

static json_t *engine_detokenize(void *self, const json_t *body, struct srv_error *err) {
    struct srv_engine *e = self;
    const json_t *t = json_object_get(body, "tokens");
    if (!json_is_array(t)) {
        srv_error_bad(err, "tokens", "'tokens' must be an array of token ids");
        return NULL;
    }
    size_t n = json_array_size(t);
    int32_t *ids = tern_malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    uint32_t nv = tern_tokenizer_n_vocab(e->tok);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= nv) {
            free(ids);
            srv_error_bad(err, "tokens", "'tokens[%zu]' must be a token id below %u", i, nv);
            return NULL;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    struct tern_buf out = TERN_BUF_INIT;
    enum tern_status st = tern_detokenize(e->tok, ids, n, TERN_TOK_PARSE_SPECIAL, &out);
    free(ids);
    if (st) {
        tern_buf_free(&out);
        srv_error_set(err, 500, "server_error", NULL, NULL, "detokenize: %s", tern_last_error());
        return NULL;
    }
    /* ids that split or end inside a UTF-8 sequence: replace what is broken (U+FFFD) */
    struct tern_buf text = TERN_BUF_INIT;
    st = tern_utf8_sanitize(&text, out.data ? out.data : "", out.len);
    tern_buf_free(&out);
    json_t *s = st ? NULL : json_stringn(text.data ? text.data : "", text.len);
    tern_buf_free(&text);
    if (!s) {
        srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    return json_pack("{s:o}", "content", s);
}

static json_t *engine_model_entry(void *self) {
    struct srv_engine *e = self;
    json_t *meta = json_pack("{s:s,s:I,s:i,s:i,s:b,s:s}", "arch", e->info->arch ? e->info->arch : "",
                             "n_params", (json_int_t)e->info->n_params, "n_ctx", (int)e->n_ctx, "n_vocab",
                             (int)e->info->n_vocab, "hybrid", e->info->hybrid, "chat_template", e->chat.source);
    if (e->demo_note) {
        json_object_set_new(meta, "demo", json_true());
        json_object_set_new(meta, "note", json_string(e->demo_note));
    }
    return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", e->model_id, "object", "model", "created", (json_int_t)e->created,
                     "owned_by", "tern", "meta", meta);
}

static void engine_metrics(void *self, struct tern_buf *b) {
    struct srv_engine *e = self;
    struct cache_stats cs;
    cache_get_stats(e->cache, &cs);
    tern_buf_puts(b, "# HELP tern_cache_requests_total Requests by reuse tier.\n"
                     "# TYPE tern_cache_requests_total counter\n");
    for (int t = CACHE_TIER_COLD; t < CACHE_TIER_COUNT; t++)
        tern_buf_printf(b, "tern_cache_requests_total{tier=\"%s\"} %llu\n", cache_tier_name((enum cache_tier)t),
                        (unsigned long long)cs.requests_by_tier[t]);
    tern_buf_puts(b, "# HELP tern_cache_declines_total Candidates compared and refused, by reason.\n"
                     "# TYPE tern_cache_declines_total counter\n");
    for (int d = 0; d < CACHE_DECLINE_COUNT; d++)
        tern_buf_printf(b, "tern_cache_declines_total{reason=\"%s\"} %llu\n", cache_decline_name((enum cache_decline)d),
                        (unsigned long long)cs.declines_by_reason[d]);
    tern_buf_printf(b,
                    "# TYPE tern_cache_candidates_total counter\ntern_cache_candidates_total %llu\n"
                    "# TYPE tern_cache_checkpoints_made_total counter\ntern_cache_checkpoints_made_total %llu\n"
                    "# TYPE tern_cache_checkpoint_evictions_total counter\ntern_cache_checkpoint_evictions_total %llu\n"
                    "# TYPE tern_cache_forks_total counter\ntern_cache_forks_total %llu\n"
                    "# TYPE tern_cache_predictions_made_total counter\ntern_cache_predictions_made_total %llu\n"
                    "# TYPE tern_cache_predictions_used_total counter\ntern_cache_predictions_used_total %llu\n"
                    "# TYPE tern_cache_predictions_wasted_total counter\ntern_cache_predictions_wasted_total %llu\n"
                    "# TYPE tern_cache_predict_tokens_total counter\ntern_cache_predict_tokens_total %llu\n",
                    (unsigned long long)cs.candidates, (unsigned long long)cs.ckpts_made,
                    (unsigned long long)cs.ckpt_evictions, (unsigned long long)cs.forks,
                    (unsigned long long)cs.predictions_made, (unsigned long long)cs.predictions_used,
                    (unsigned long long)cs.predictions_wasted, (unsigned long long)cs.predict_tokens);
    tern_buf_printf(b,
                    "# HELP tern_predict_seconds_total Idle time spent rendering and priming predictions.\n"
                    "# TYPE tern_predict_seconds_total counter\ntern_predict_seconds_total %.6f\n"
                    "# TYPE tern_predict_runs_total counter\ntern_predict_runs_total %llu\n"
                    "# TYPE tern_predict_preempted_total counter\ntern_predict_preempted_total %llu\n"
                    "# TYPE tern_predict_skipped_total counter\ntern_predict_skipped_total %llu\n"
                    "# HELP tern_predict_active 1 while predictions of the last conversation are still to be primed.\n"
                    "# TYPE tern_predict_active gauge\ntern_predict_active %d\n",
                    (double)atomic_load(&e->pred_us) * 1e-6, (unsigned long long)atomic_load(&e->pred_runs),
                    (unsigned long long)atomic_load(&e->pred_preempted),
                    (unsigned long long)atomic_load(&e->pred_skipped), atomic_load(&e->pred_active));
    tern_buf_printf(b,
                    "# HELP tern_spec_drafted_tokens_total Tokens proposed by speculative decoding and verified.\n"
                    "# TYPE tern_spec_drafted_tokens_total counter\ntern_spec_drafted_tokens_total %llu\n"
                    "# HELP tern_spec_accepted_tokens_total Drafted tokens the model itself picked.\n"
                    "# TYPE tern_spec_accepted_tokens_total counter\ntern_spec_accepted_tokens_total %llu\n"
                    "# TYPE tern_spec_rounds_total counter\ntern_spec_rounds_total %llu\n"
                    "# HELP tern_spec_refed_tokens_total Tokens read again to bring a hybrid state back after a rejection.\n"
                    "# TYPE tern_spec_refed_tokens_total counter\ntern_spec_refed_tokens_total %llu\n",
                    (unsigned long long)atomic_load(&e->spec_drafted), (unsigned long long)atomic_load(&e->spec_accepted),
                    (unsigned long long)atomic_load(&e->spec_rounds), (unsigned long long)atomic_load(&e->spec_refed));
    tern_buf_printf(b,
                    "# TYPE tern_cache_tokens_cached_total counter\ntern_cache_tokens_cached_total %llu\n"
                    "# TYPE tern_cache_tokens_read_total counter\ntern_cache_tokens_read_total %llu\n"
                    "# TYPE tern_cache_evictions_total counter\ntern_cache_evictions_total %llu\n"
                    "# HELP tern_cache_quota_evictions_total Evictions of a tenant over --cache-ram-per-key.\n"
                    "# TYPE tern_cache_quota_evictions_total counter\ntern_cache_quota_evictions_total %llu\n"
                    "# TYPE tern_cache_pool_bytes gauge\ntern_cache_pool_bytes %zu\n"
                    "# TYPE tern_cache_sessions gauge\ntern_cache_sessions %u\n"
                    "# TYPE tern_cache_checkpoints gauge\ntern_cache_checkpoints %u\n",
                    (unsigned long long)cs.tokens_cached,
                    (unsigned long long)cs.tokens_read, (unsigned long long)cs.evictions,
                    (unsigned long long)cs.quota_evictions, cs.pool_bytes,
                    cs.n_sessions, cs.n_checkpoints);
    if (cs.disk_on)
        tern_buf_printf(b,
                        "# HELP tern_cache_disk_writes_total Conversations written to the disk tier (--cache-dir).\n"
                        "# TYPE tern_cache_disk_writes_total counter\ntern_cache_disk_writes_total %llu\n"
                        "# TYPE tern_cache_disk_write_bytes_total counter\ntern_cache_disk_write_bytes_total %llu\n"
                        "# HELP tern_cache_disk_write_errors_total Writes that failed (disk full, over the budget): "
                        "the conversation stayed in RAM only.\n"
                        "# TYPE tern_cache_disk_write_errors_total counter\ntern_cache_disk_write_errors_total %llu\n"
                        "# TYPE tern_cache_disk_loads_total counter\ntern_cache_disk_loads_total %llu\n"
                        "# TYPE tern_cache_disk_load_bytes_total counter\ntern_cache_disk_load_bytes_total %llu\n"
                        "# HELP tern_cache_disk_invalid_total Files that did not verify (model, layout, checksum, "
                        "size, name) and were deleted.\n"
                        "# TYPE tern_cache_disk_invalid_total counter\ntern_cache_disk_invalid_total %llu\n"
                        "# TYPE tern_cache_disk_evictions_total counter\ntern_cache_disk_evictions_total %llu\n"
                        "# TYPE tern_cache_disk_bytes gauge\ntern_cache_disk_bytes %llu\n"
                        "# TYPE tern_cache_disk_entries gauge\ntern_cache_disk_entries %u\n",
                        (unsigned long long)cs.disk_writes, (unsigned long long)cs.disk_write_bytes,
                        (unsigned long long)cs.disk_write_errors, (unsigned long long)cs.disk_loads,
                        (unsigned long long)cs.disk_load_bytes, (unsigned long long)cs.disk_invalid,
                        (unsigned long long)cs.disk_evictions, (unsigned long long)cs.disk_bytes, cs.disk_entries);
    if (cs.n_tenants)
        tern_buf_puts(b, "# HELP tern_cache_tenant_bytes Parked state by tenant (API key; the label is a hash of "
                         "which key, never the key).\n# TYPE tern_cache_tenant_bytes gauge\n"
                         "# TYPE tern_cache_tenant_sessions gauge\n");
    for (uint32_t i = 0; i < cs.n_tenants; i++)
        tern_buf_printf(b,
                        "tern_cache_tenant_bytes{tenant=\"%016llx\"} %zu\n"
                        "tern_cache_tenant_sessions{tenant=\"%016llx\"} %u\n",
                        (unsigned long long)cs.tenants[i].id, cs.tenants[i].bytes,
                        (unsigned long long)cs.tenants[i].id, cs.tenants[i].sessions);
}

/* ---- lifecycle --------------------------------------------------------------------- */

enum tern_status srv_engine_new(const struct srv_engine_params *p, struct srv_engine **out) {
    *out = NULL;
    struct srv_engine *e = tern_calloc(1, sizeof *e);
    if (!e) return tern_errorf(TERN_ERR_NOMEM, "out of memory");
    e->model = p->model;
    e->info = tern_model_info(p->model);
    e->tok = tern_model_tokenizer(p->model);
    e->state_hash = p->state_hash;
    e->created = (int64_t)time(NULL);
    enum tern_status st = chat_fmt_init(&e->chat, p->model, p->chat_template, p->chat_template_len);
    if (st) {
        srv_engine_free(e);
        return st;
    }
    struct cache_params cp = p->cache;
    uint32_t n_ctx = cp.session.n_ctx;
    if (n_ctx == 0) n_ctx = tern_n_ctx_default(e->info->n_ctx_train); /* the session's own default */
    cp.session.n_ctx = n_ctx;
    e->n_ctx = n_ctx;
    if (cp.turn_token < 0) cp.turn_token = chat_turn_token(&e->chat);
    e->turn_token = cp.turn_token;
    e->predict = p->predict;
    e->predict_chunk = p->predict_chunk ? p->predict_chunk : PREDICT_CHUNK_DEFAULT;
    if (cp.session.n_chunk && e->predict_chunk > cp.session.n_chunk) e->predict_chunk = cp.session.n_chunk;
    e->predict_delay_ms = p->predict_test_delay_ms;
    e->max_tokens = p->max_tokens;
    e->spec = p->spec;
    e->spec_max = p->spec_max;
    if (e->spec != SPEC_OFF)
        TERN_LOG_INFO("speculative decoding: %s, up to %u tokens per draft", spec_mode_name(e->spec),
                      e->spec_max ? e->spec_max : SPEC_DEFAULT_MAX);
    if (e->predict != PREDICT_OFF && e->turn_token < 0) {
        TERN_LOG_WARN("predictive priming is off: the vocabulary has no turn-start token (--turn-token)");
        e->predict = PREDICT_OFF;
    }
    if (e->predict != PREDICT_OFF)
        TERN_LOG_INFO("predictive priming: %s (idle steps of %u tokens)", predict_mode_name(e->predict),
                      e->predict_chunk);
    st = cache_new(p->model, &cp, &e->cache);
    if (st) {
        srv_engine_free(e);
        return st;
    }
    e->model_id = tern_strdup(p->model_id ? p->model_id : e->info->name);
    e->demo_note = p->demo_note ? tern_strdup(p->demo_note) : NULL;
    if (!e->model_id || (p->demo_note && !e->demo_note)) {
        srv_engine_free(e);
        return tern_errorf(TERN_ERR_NOMEM, "out of memory");
    }
    e->backend = (struct srv_backend){
        .self = e,
        .prepare = engine_prepare,
        .run = engine_run,
        .job_free = engine_job_free,
        .tokenize = engine_tokenize,
        .detokenize = engine_detokenize,
        .model_entry = engine_model_entry,
        .metrics = engine_metrics,
        .idle = e->predict != PREDICT_OFF ? engine_idle : NULL,
    };
    *out = e;
    return TERN_OK;
}

const struct srv_backend *srv_engine_backend(struct srv_engine *e) { return &e->backend; }

void srv_engine_free(struct srv_engine *e) {
    if (!e) return;
    pred_clear(&e->pred);
    for (size_t i = 0; i < ENG_GRAMMARS; i++) {
        tern_gmatch_free(e->gram[i].m);
        tern_grammar_free(e->gram[i].g);
    }
    tern_gvocab_free(e->gvocab);
    cache_free(e->cache);
    chat_fmt_free(&e->chat);
    free(e->model_id);
    free(e->demo_note);
    free(e);
}
