/* The step scheduler (engine.h; DESIGN.md §2, §8): continuous batching.
 *
 * A request joins the running set in engine_start (cache_acquire: its lease's session
 * is positioned at the resume point r), and from then on every engine_step advances it:
 *
 *   decode   a request with logits samples its next token (grammar mask, forced
 *            tokens, or speculative decoding), streams what the stop matcher and the
 *            reply parser decide, and either ends or adds the token as one row of the
 *            step's batch (with speculative decoding: the token and its draft, the
 *            verify chunk, whose logits decide the accepted tokens after the step);
 *   prefill  the requests still reading their prompts, in arrival order, add chunks
 *            of up to the step's remaining budget (--batch-tokens minus the decode
 *            rows), cut at the checkpoint plan's positions, where the checkpoint is
 *            taken before the chunk;
 *   forward  one tern_eval_batch over all rows: the weights are read once per step.
 *
 * Every row's result is independent of the rows beside it (kernels.h), so a request's
 * tokens and state do not depend on what else runs (test-batch, test-server-batch).
 * Decode streams get their token every step, and a long prompt delays them by at most
 * one step's budget. A request that ends is committed (cache_release) at once. */
#include "server/engine-impl.h"

#include "grammar/grammar.h"
#include "model/mtp.h"
#include "server/api/api.h"
#include "server/constrain.h"
#include "server/reply.h"
#include "server/respond.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <stdio.h>
#include <string.h>

#define PRIME_COMMENT_EVERY_S 2.0

struct out_state {
    struct srv_job *job;
    struct srv_resp_ctx ctx;
    struct reply_parser parser;  /* chat */
    struct tern_buf text;        /* completions: the whole text */
    struct stop_matcher stop;
    struct tern_detok *detok;
    struct tern_buf piece, safe, frame;
    bool role_sent;
    struct api_out api;          /* the Messages and Responses doors' rendering state */
    uint32_t n_reasoning;        /* tokens generated inside a reasoning block */
};

/* RQ_WAIT: not started yet, the conversation it resumes is being written to the disk
 * tier (cache_write_pending); it holds a running slot and no lease. */
enum rq_phase { RQ_WAIT, RQ_PRIME, RQ_DECODE };

/* How long a request waits for its conversation's disk write before it reads from
 * elsewhere (cache.h: CACHE_ACQUIRE_NOWAIT leaves the conversation alone). */
#define DISK_WAIT_S 30.0
/* A peer's write (--cache-peer-wait auto): waited for while waiting costs less than
 * reading the tokens it saves, at the measured reading speed, but at least this long:
 * below it the estimate is noise, and a small conversation's write lands sooner. */
#define PEER_WAIT_MIN_S 0.1

/* How long a request may wait for a peer's write that saves it gain tokens. */
static double peer_wait_limit(const struct srv_engine *e, uint32_t gain) {
    if (e->peer_wait_ms) return e->peer_wait_ms / 1000.0;
    if (e->prime_s_per_tok <= 0) return DISK_WAIT_S; /* nothing read yet: the writer's life bounds it */
    const double t = gain * e->prime_s_per_tok;
    return t < PEER_WAIT_MIN_S ? PEER_WAIT_MIN_S : t > DISK_WAIT_S ? DISK_WAIT_S : t;
}

/* One running request: what engine_run's locals were when a request ran alone. */
/* --spec mtp: the prompt rows whose hidden states the MTP head reads (the last ones of
 * the part read; 16 KiB per row at n_embd 4096). */
#define ENG_MTP_PROMPT_ROWS 8192u

struct eng_req {
    struct eng_req *next;
    struct srv_job *j;
    struct eng_job *ej;
    struct cache_lease lease;
    struct tern_session *s;
    enum rq_phase phase;
    size_t ick;                  /* the next position of the lease's checkpoint plan */
    double t_prime0, t_comment, t_wait0, t_begin;
    bool waited;                 /* it waited in RQ_WAIT before it began */
    size_t admit_bytes;          /* what it holds of the memory budget (0: not admitted yet) */
    bool mem_wait;               /* in RQ_WAIT for memory */
    struct tern_mtp *head;       /* --spec mtp: the head the conversation's previous request parked */
    uint32_t head_base;          /* (the main position of its row 0) */
    bool spec_settled;           /* spec_finish ran (before the response's last byte) */
    struct srv_reuse reuse;
    struct out_state o;
    struct tern_sampler *sampler;
    struct spec_dec sd;          /* sd.s set: speculative decoding drafts for this request */
    struct tern_gmatch *gm;      /* the grammar's matcher (NULL: unconstrained) */
    struct tern_gmatch *gm_own;  /* gm when it is this request's own (every kept one was in use) */
    struct tern_grammar *g_own;  /* gm_own's grammar */
    uint32_t *gmask;
    double t_mask;
    struct tern_gmatch_stats gstats0;
    struct tern_buf gtail;       /* the output so far, under a grammar (for the lazy trigger and the log) */
    size_t lazy_scan;            /* where the lazy trigger search goes on */
    int64_t max_new, i;          /* tokens allowed; the index of the next one */
    int32_t feed;                /* the token this step evaluates for it */
    struct spec_rows rows;       /* its rows of the step: feed, or a verify chunk */
    float *mtp_hid;              /* --spec mtp: (n_prompt - mtp_pos0, n_embd) the prompt's hidden states read here */
    uint32_t mtp_pos0;
    bool release_ok, completed, ended;
    const char *finish;
};

/* ---- output ------------------------------------------------------------------------ */

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
            if (j->req.proto == SRV_PROTO_CHAT)
                st = srv_sse_data(&o->frame, srv_chunk_chat(&o->ctx, d, &o->parser, !o->role_sent, NULL, NULL));
            else
                st = api_stream_delta(&o->api, d, &o->parser, &o->frame);
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

/* The request failed: an error event ends its stream, or an error body in its
 * protocol's shape answers it. a: its rendering state (NULL: not started). */
static void send_failure(struct srv_job *j, struct api_out *a, int status, const char *type, const char *fmt,
                         const char *msg) {
    struct srv_error err;
    srv_error_set(&err, status, type, NULL, NULL, fmt, msg);
    size_t nl = strnlen(err.message, sizeof j->note - 1);
    memcpy(j->note, err.message, nl);
    j->note[nl] = 0;
    struct tern_buf b = TERN_BUF_INIT;
    if (j->req.stream) {
        struct srv_resp_ctx ctx = {.id = j->id, .model = j->req.model ? j->req.model : "", .created = j->created};
        struct api_out tmp;
        if (!a) api_out_init(a = &tmp, j->req.proto, &ctx, &j->req);
        api_stream_error(a, &err, &b);
        if (a == &tmp) api_out_free(&tmp);
    } else {
        char *s = api_error_json(j->req.proto, &err);
        if (s) tern_buf_puts(&b, s);
        free(s);
    }
    if (b.len) srv_job_write(j, b.data, b.len);
    tern_buf_free(&b);
    srv_job_finish(j, status);
}

/* ---- grammars ---------------------------------------------------------------------- */

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

/* Whether one of the running requests uses matcher k (a kept matcher is shared only
 * by requests that run one after another). */
static bool matcher_in_use(const struct srv_engine *e, const struct tern_gmatch *m) {
    for (const struct eng_req *r = e->run_head; r; r = r->next)
        if (r->gm == m && !r->ended) return true;
    return false;
}

/* Room in r's session for n more tokens; when that took new KV pages, parked sessions
 * give way so that the pool, running sessions included, stays within --cache-ram (and on a
 * device, for its memory: cache_reserve). */
static enum tern_status session_grow(struct srv_engine *e, struct eng_req *r, size_t n) {
    return cache_reserve(e->cache, r->s, n);
}

/* The request lets its matcher go (a kept one stays for the next request). */
static void req_drop_matcher(struct eng_req *r) {
    tern_gmatch_free(r->gm_own);
    tern_grammar_free(r->g_own);
    r->gm_own = NULL;
    r->g_own = NULL;
    r->gm = NULL;
}

/* The matcher for a job's grammar (*owner) into r->gm: a kept one (reset) when the same
 * grammar came before and no running request holds it, else a new one that is kept,
 * taking the grammar over from the job; when every kept matcher is held by a running
 * request, a new one of the request's own (freed when it ends). */
static enum tern_status grammar_matcher(struct srv_engine *e, struct tern_grammar **owner, struct eng_req *r) {
    struct tern_gmatch **out = &r->gm;
    size_t lru = ENG_GRAMMARS;
    for (size_t i = 0; i < ENG_GRAMMARS; i++) {
        struct eng_gram *k = &e->gram[i];
        if (k->m && matcher_in_use(e, k->m)) continue;
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
        if (lru == ENG_GRAMMARS || !k->g || k->used < e->gram[lru].used) lru = i;
    }
    if (lru == ENG_GRAMMARS) { /* every kept matcher is in use: this request's own */
        enum tern_status st = tern_gmatch_new(*owner, e->gvocab, &r->gm_own);
        if (st) return st;
        r->g_own = *owner;
        *owner = NULL;
        *out = r->gm_own;
        return TERN_OK;
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

/* ---- the MTP head between requests ------------------------------------------------------
 * A conversation's MTP head (its KV rows over the hidden states it was fed) is parked with
 * the conversation (cache_lease_park_head: in the RAM pool and with it in the disk tier's
 * file) and taken back by the next request that resumes it — in place, or from its file
 * after a restart or on a replica — so that the head's drafts attend over the earlier
 * turns too, as they would without the pause (docs/spec.md). It changes which tokens
 * are drafted, never which are accepted. */
static void park_head(struct eng_req *r) {
    uint32_t base = 0;
    struct tern_mtp *h = spec_take_head(&r->sd, &base);
    if (h) cache_lease_park_head(&r->lease, h, base);
}

/* ---- the end of a request ------------------------------------------------------------ */

/* Commits and frees what the request holds (the job was finished before). */
static void req_end(struct srv_engine *e, struct eng_req *r) {
    struct srv_job *j = r->j;
    if (r->mtp_hid) { /* ended while priming */
        tern_session_capture_hidden(r->s, NULL, 0);
        free(r->mtp_hid);
        r->mtp_hid = NULL;
    }
    /* The session holds exactly the accepted tokens before it is hashed or parked. */
    if (r->sd.s && !r->spec_settled && spec_finish(&r->sd)) {
        TERN_LOG_WARN("spec: %s: %s", j->id, tern_last_error());
        r->release_ok = false;
    }
    struct spec_dec *sd = &r->sd;
    if (sd->st.rounds) {
        j->n_drafted = (uint32_t)sd->st.drafted;
        j->n_accepted = (uint32_t)sd->st.accepted;
        TERN_LOG_DEBUG("spec: %s %s drafted=%llu accepted=%llu rounds=%llu refed=%llu", j->id, spec_mode_name(sd->mode),
                       (unsigned long long)sd->st.drafted, (unsigned long long)sd->st.accepted,
                       (unsigned long long)sd->st.rounds, (unsigned long long)sd->st.refed);
        atomic_fetch_add(&e->spec_drafted, sd->st.drafted);
        atomic_fetch_add(&e->spec_accepted, sd->st.accepted);
        atomic_fetch_add(&e->spec_rounds, sd->st.rounds);
        atomic_fetch_add(&e->spec_refed, sd->st.refed);
    }
    if (r->s && r->release_ok && r->completed) park_head(r);
    spec_dec_free(sd);
    tern_mtp_free(r->head); /* (taken back, never used: the request ended before decoding) */
    r->head = NULL;
    if (r->s) {
        if (e->state_hash) log_state_hashes(r->s, j->id);
        if (r->gm) {
            struct tern_gmatch_stats gs;
            tern_gmatch_get_stats(r->gm, &gs);
            TERN_LOG_INFO("grammar: %s %llu masks (%llu from the cache) in %.3fs, %llu trie nodes walked, %zu stack "
                          "nodes",
                          j->id, (unsigned long long)(gs.masks - r->gstats0.masks),
                          (unsigned long long)(gs.cache_hits - r->gstats0.cache_hits), r->t_mask,
                          (unsigned long long)(gs.nodes_visited - r->gstats0.nodes_visited), gs.n_stack_nodes);
        }
        cache_release(e->cache, &r->lease, r->release_ok);
        r->s = NULL;
    }
    req_drop_matcher(r);
    free(r->gmask);
    r->gmask = NULL;
    tern_buf_free(&r->gtail);
    /* The most recent conversation is the one predicted (the previous one's
     * predictions, primed or not, give way). */
    if (r->completed && r->release_ok && j->ep == SRV_EP_CHAT && e->predict != PREDICT_OFF)
        predict_follow(e, j, &r->o.parser);
    tern_sampler_free(r->sampler);
    r->sampler = NULL;
    tern_detok_free(r->o.detok);
    r->o.detok = NULL;
    reply_parser_free(&r->o.parser);
    stop_matcher_free(&r->o.stop);
    tern_buf_free(&r->o.text);
    tern_buf_free(&r->o.piece);
    tern_buf_free(&r->o.safe);
    tern_buf_free(&r->o.frame);
    api_out_free(&r->o.api);
    r->ended = true;
}

static void req_fail(struct srv_engine *e, struct eng_req *r, int status, const char *fmt, const char *msg) {
    send_failure(r->j, r->o.api.ctx ? &r->o.api : NULL, status, status < 500 ? "invalid_request_error" : "server_error", fmt, msg);
    req_end(e, r);
}

/* The client went away: the session holds a consistent prefix (a step boundary) and
 * stays usable. */
static void req_cancelled(struct srv_engine *e, struct eng_req *r) {
    snprintf(r->j->note, sizeof r->j->note, "cancelled (client went away)");
    srv_job_finish(r->j, 499);
    req_end(e, r);
}

/* Before the response's last byte: the session holds exactly the accepted tokens, and
 * the disk write its release will make is announced, so that a replica that gets the
 * next turn at once (an agent's tool call takes milliseconds) waits for that write
 * instead of resuming from the turn before (cache.h: cache_announce). */
static void req_settle(struct srv_engine *e, struct eng_req *r) {
    if (r->sd.s && !r->spec_settled) {
        r->spec_settled = true;
        if (spec_finish(&r->sd)) {
            TERN_LOG_WARN("spec: %s: %s", r->j->id, tern_last_error());
            r->release_ok = false;
        }
    }
    if (r->s && r->release_ok && cache_announce(e->cache, &r->lease))
        TERN_LOG_WARN("reuse: %s: announcing its disk write: %s (a peer may resume the turn before)", r->j->id,
                      tern_last_error());
}

/* The reply is complete: the detokenizer's and the stop matcher's tails, then the
 * response (or the stream's last events). */
static void req_complete(struct srv_engine *e, struct eng_req *r) {
    struct srv_job *j = r->j;
    struct out_state *o = &r->o;
    tern_buf_clear(&o->piece);
    tern_detok_flush(o->detok, &o->piece);
    if (out_text(o, o->piece.data, o->piece.len, true)) {
        req_fail(e, r, 500, "output: %s", "out of memory");
        return;
    }
    const char *finish = r->finish;
    if (j->ep == SRV_EP_CHAT && o->parser.n_calls > 0 && !strcmp(finish, "stop")) finish = "tool_calls";
    const char *stop_seq = o->stop.stopped && (size_t)o->stop.which < j->req.n_stop ? j->req.stop[o->stop.which] : NULL;
    struct srv_usage u = {.prompt_tokens = (uint32_t)j->n_prompt, .completion_tokens = j->n_generated,
                          .cached_tokens = r->lease.decision.cached, .reasoning_tokens = o->n_reasoning};
    const bool other_door = j->ep == SRV_EP_CHAT && j->req.proto != SRV_PROTO_CHAT;
    if (j->req.stream && other_door) {
        if (api_stream_end(&o->api, &o->parser, finish, stop_seq, &u, &o->frame)) {
            if (o->frame.len) srv_job_write(j, o->frame.data, o->frame.len);
            req_fail(e, r, 500, "%s", "out of memory building the stream's last events");
            return;
        }
    } else if (j->req.stream) {
        /* the stream ends with [DONE] only when every event before it was built; else
         * with an error event (never silently short) */
        enum tern_status fst =
            j->ep == SRV_EP_CHAT ? srv_sse_data(&o->frame, srv_chunk_chat(&o->ctx, NULL, &o->parser, false, finish, &r->reuse))
                                 : srv_sse_data(&o->frame, srv_chunk_text(&o->ctx, "", 0, finish, &r->reuse));
        if (!fst && j->req.include_usage) fst = srv_sse_data(&o->frame, srv_chunk_usage(&o->ctx, &u, &r->reuse));
        if (!fst) fst = srv_sse_done(&o->frame);
        if (fst) {
            if (o->frame.len) srv_job_write(j, o->frame.data, o->frame.len);
            req_fail(e, r, 500, "%s", "out of memory building the stream's last events");
            return;
        }
    } else {
        json_t *resp = other_door              ? api_response(&o->api, &o->parser, finish, stop_seq, &u)
                       : j->ep == SRV_EP_CHAT ? srv_response_chat(&o->ctx, &o->parser, finish, &u, &r->reuse)
                                              : srv_response_text(&o->ctx, o->text.data, o->text.len, finish, &u, &r->reuse);
        char *txt = resp ? json_dumps(resp, JSON_COMPACT) : NULL;
        json_decref(resp);
        if (!txt) {
            req_fail(e, r, 500, "%s", "out of memory building the response");
            return;
        }
        tern_buf_puts(&o->frame, txt);
        free(txt);
    }
    req_settle(e, r);
    srv_job_write(j, o->frame.data, o->frame.len);
    srv_job_finish(j, 200);
    r->completed = true;
    req_end(e, r);
}

/* ---- start ------------------------------------------------------------------------- */

static void run_append(struct srv_engine *e, struct eng_req *r) {
    if (e->run_tail) e->run_tail->next = r;
    else e->run_head = r;
    e->run_tail = r;
    atomic_fetch_add(&e->n_running, 1);
}

/* The lease and what the request needs to run. false: it failed (answered). */
static bool req_begin(struct srv_engine *e, struct eng_req *r) {
    struct srv_job *j = r->j;
    struct cache_ident ident = {.tenant = j->tenant ? j->tenant : "", .key = j->key};
    r->t_begin = tern_now_s();
    if (r->waited) ident.waited_ms = (uint32_t)((r->t_begin - r->t_wait0) * 1000.0 + 0.5);
    enum tern_status st =
        cache_acquire_flags(e->cache, &ident, j->prompt, j->n_prompt, CACHE_ACQUIRE_NOWAIT, &r->lease);
    if (st) {
        send_failure(j, NULL, st == TERN_ERR_NOMEM ? 503 : 500, "server_error", "cannot start the request: %s",
                     tern_last_error());
        return false;
    }
    r->s = r->lease.session;
    r->head = cache_lease_take_head(&r->lease, &r->head_base);
    const struct cache_decision *dec = &r->lease.decision;
    j->n_cached = dec->cached;
    j->n_read = dec->read;
    r->reuse = (struct srv_reuse){
        .tier = cache_tier_name(dec->tier),
        .cached = dec->cached,
        .read = dec->read,
        .key = dec->key_explicit ? "explicit" : dec->key_implicit ? "implicit" : "none",
        .reason = dec->reason,
        .waited_ms = dec->waited_ms,
    };
    r->o.job = j;
    r->o.ctx = (struct srv_resp_ctx){.id = j->id, .model = e->model_id, .created = j->created, .ep = j->ep};
    api_out_init(&r->o.api, j->req.proto, &r->o.ctx, &j->req);
    if (j->req.stream && j->req.proto != SRV_PROTO_CHAT) {
        /* the stream's first events go out at once, so that its keep-alives may follow
         * while the prompt is read */
        struct srv_usage u0 = {.prompt_tokens = (uint32_t)j->n_prompt, .cached_tokens = dec->cached};
        if (api_stream_start(&r->o.api, &u0, &r->o.frame)) {
            send_failure(j, NULL, 503, "server_error", "cannot start the request: %s", "out of memory");
            cache_release(e->cache, &r->lease, true);
            api_out_free(&r->o.api);
            tern_buf_free(&r->o.frame);
            return false;
        }
        srv_job_write(j, r->o.frame.data, r->o.frame.len);
        tern_buf_clear(&r->o.frame);
    }
    reply_parser_init(&r->o.parser, e->chat.fmt, j->req.tools && j->req.tool_choice != SRV_TOOLS_NONE, r->ej->in_think,
                      j->seq * 0x9e3779b97f4a7c15ull ^ (uint64_t)j->created);
    stop_matcher_init(&r->o.stop, (const char *const *)j->req.stop, j->req.n_stop);
    r->release_ok = true;
    r->finish = "stop";
    r->phase = RQ_PRIME;
    /* --spec mtp: the hidden states of the prompt's rows read here (the last
     * ENG_MTP_PROMPT_ROWS of them; a resumed prefix has none), for the MTP head to attend
     * over (docs/spec.md); without the memory the head starts with the first token */
    const enum spec_mode sm = j->req.spec_set ? j->req.spec : e->spec;
    if (sm == SPEC_MTP && e->info->has_mtp && !r->ej->forced) {
        const uint32_t n0 = tern_session_n_past(r->s), m = (uint32_t)j->n_prompt;
        const uint32_t p0 = m - n0 > ENG_MTP_PROMPT_ROWS ? m - ENG_MTP_PROMPT_ROWS : n0;
        if (m > p0 && (r->mtp_hid = tern_malloc((size_t)(m - p0) * e->info->n_embd * sizeof(float)))) {
            r->mtp_pos0 = p0;
            tern_session_capture_hidden(r->s, r->mtp_hid, p0);
        }
    }
    /* checkpoints at or below the resume point are not in the plan (it is in (r, m]) */
    atomic_fetch_add(&e->n_priming, 1);
    return true;
}

/* The most memory a request's session can take: its prompt and what it may generate,
 * within the context, the recurrent state, and a hybrid's speculative trail. */
static size_t request_bytes(const struct srv_engine *e, const struct srv_job *j) {
    const uint64_t n_ctx = e->n_ctx;
    uint64_t tok = j->n_prompt + (j->req.max_tokens > 0 ? (uint64_t)j->req.max_tokens : n_ctx);
    if (e->max_tokens > 0 && j->n_prompt + e->max_tokens < tok) tok = j->n_prompt + e->max_tokens;
    if (tok > n_ctx) tok = n_ctx;
    size_t b = (size_t)tok * e->kv_per_token + e->info->recurrent_bytes;
    const enum spec_mode sm = j->req.spec_set ? j->req.spec : e->spec;
    if (sm != SPEC_OFF && e->info->hybrid) b += e->spec_trail_bytes;
    return b;
}

/* Admits r when what it can grow to fits beside the admitted requests (or nothing else
 * is admitted: a request larger than the budget runs alone). */
static bool admit(struct srv_engine *e, struct eng_req *r) {
    if (r->admit_bytes) return true;
    const size_t need = request_bytes(e, r->j);
    if (e->admitted_bytes && e->admitted_bytes + need > e->admit_budget) return false;
    e->admitted_bytes += need;
    r->admit_bytes = need;
    return true;
}

bool engine_start(void *self, struct srv_job *j) {
    struct srv_engine *e = self;
    struct eng_req *r = tern_calloc(1, sizeof *r);
    if (!r) {
        send_failure(j, NULL, 503, "server_error", "cannot start the request: %s", "out of memory");
        return false;
    }
    r->j = j;
    r->ej = j->priv;
    r->t_prime0 = r->t_comment = r->t_wait0 = tern_now_s();
    /* The conversation it resumes is being written to disk (the agent's next turn often
     * comes within the write): only this request waits, in the running set, while the
     * others step (engine_step starts it when the write is done). */
    struct cache_ident ident = {.tenant = j->tenant ? j->tenant : "", .key = j->key};
    struct cache_wait w;
    if (cache_write_pending(e->cache, &ident, j->prompt, j->n_prompt, &w)) {
        if (w.peer)
            TERN_LOG_INFO("engine: %s waits for a peer's disk write in flight (it saves reading %u tokens)", j->id,
                          w.gain);
        else
            TERN_LOG_INFO("engine: %s waits for its conversation's disk write", j->id);
        r->phase = RQ_WAIT;
        r->waited = true;
        run_append(e, r);
        return true;
    }
    /* memory: behind any request that already waits for it, and within the budget */
    bool queued = false;
    for (struct eng_req *q = e->run_head; q && !queued; q = q->next) queued = !q->ended && q->mem_wait;
    if (queued || !admit(e, r)) {
        r->mem_wait = true;
        TERN_LOG_INFO("engine: %s waits for memory (%zu MiB it can grow to; %zu of %zu MiB held by running requests)",
                      j->id, request_bytes(e, j) >> 20, e->admitted_bytes >> 20, e->admit_budget >> 20);
        r->phase = RQ_WAIT;
        run_append(e, r);
        return true;
    }
    if (!req_begin(e, r)) {
        free(r);
        return false;
    }
    run_append(e, r);
    return true;
}

/* The requests waiting for a disk write or for memory: started once the write is done
 * (or after DISK_WAIT_S, leaving that conversation alone) and they fit; memory is given
 * in arrival order (a large request is not passed by small ones). True when any still
 * waits. */
static bool start_waiting(struct srv_engine *e) {
    bool waiting = false, mem_blocked = false;
    for (struct eng_req *r = e->run_head; r; r = r->next) {
        if (r->ended || r->phase != RQ_WAIT) continue;
        struct srv_job *j = r->j;
        if (atomic_load(&j->cancel)) {
            snprintf(j->note, sizeof j->note, "cancelled (client went away)");
            srv_job_finish(j, 499);
            r->ended = true;
            continue;
        }
        struct cache_ident ident = {.tenant = j->tenant ? j->tenant : "", .key = j->key};
        struct cache_wait w;
        const double waited = tern_now_s() - r->t_wait0;
        if (!r->mem_wait && waited < DISK_WAIT_S && cache_write_pending(e->cache, &ident, j->prompt, j->n_prompt, &w) &&
            (!w.peer || waited < peer_wait_limit(e, w.gain))) {
            waiting = true;
            continue;
        }
        if (mem_blocked || !admit(e, r)) {
            r->mem_wait = mem_blocked = waiting = true;
            continue;
        }
        r->mem_wait = false;
        if (!req_begin(e, r)) r->ended = true;
    }
    return waiting;
}

/* ---- decode ------------------------------------------------------------------------ */

/* The prompt is read: sampler, detokenizer, grammar, the stream's first event, the
 * speculative decoder. false: the request ended. */
static bool decode_begin(struct srv_engine *e, struct eng_req *r) {
    struct srv_job *j = r->j;
    struct eng_job *ej = r->ej;
    r->phase = RQ_DECODE;
    atomic_fetch_sub(&e->n_priming, 1);
    j->t_prime = tern_now_s() - r->t_prime0;
    /* the reading speed (seconds per prompt token, beside whatever else ran), which
     * bounds how long a request waits for a peer's write */
    if (j->n_read >= 32) {
        const double spt = (tern_now_s() - r->t_begin) / j->n_read;
        e->prime_s_per_tok = e->prime_s_per_tok > 0 ? 0.75 * e->prime_s_per_tok + 0.25 * spt : spt;
    }
    struct tern_sampler_params sp = j->req.sampling;
    if (!j->req.seed_set) sp.seed = tern_now_ns() ^ (j->seq << 32);
    enum tern_status st = tern_sampler_new(&sp, e->info->n_vocab, &r->sampler);
    if (!st && j->req.n_bias) st = tern_sampler_set_bias(r->sampler, j->req.bias_ids, j->req.bias_vals, j->req.n_bias);
    if (!st) st = tern_detok_new(e->tok, TERN_TOK_PARSE_SPECIAL, &r->o.detok);
    struct tern_grammar **grammar = ej->tool_grammar ? &ej->tool_grammar : j->req.grammar ? &j->req.grammar : NULL;
    if (!st && grammar) {
        st = grammar_runtime(e, &r->gmask);
        if (!st) st = grammar_matcher(e, grammar, r);
        if (!st) tern_gmatch_get_stats(r->gm, &r->gstats0);
    }
    if (st) {
        req_fail(e, r, st == TERN_ERR_LIMIT ? 503 : 500, "cannot start decoding: %s", tern_last_error());
        return false;
    }
    if (j->req.stream && j->ep == SRV_EP_CHAT && j->req.proto == SRV_PROTO_CHAT) {
        if (srv_sse_data(&r->o.frame, srv_chunk_chat(&r->o.ctx, NULL, &r->o.parser, true, NULL, NULL))) {
            req_fail(e, r, 500, "%s", "out of memory building the first stream event");
            return false;
        }
        r->o.role_sent = true;
    }
    /* Speculative decoding (spec.h): the decoder samples for this request and its verify
     * chunks are the request's rows of a step. Forced output (tests) bypasses it. Under a
     * grammar the decoder decides each position under the mask of the matcher's state
     * there, taking every decided token into the matcher, so the states, masks and tokens
     * are a plain constrained loop's (docs/spec.md); a grammar that a tool call opens
     * later is handed over then (lazy_trigger). A forced prefix (tests) is fed as plain
     * rows, drafting from its last token on. Without drafting, each token is a row. */
    if (!ej->forced) {
        struct spec_params spp = {.mode = j->req.spec_set ? j->req.spec : e->spec,
                                  .max = j->req.spec_max ? j->req.spec_max : e->spec_max,
                                  .trail_bytes = e->spec_trail_bytes,
                                  .head = r->head,
                                  .head_base = r->head_base,
                                  .head_upto = r->lease.decision.cached ? r->lease.decision.cached - 1 : 0,
                                  .prompt_hidden = r->mtp_hid, .prompt_hidden_pos0 = r->mtp_pos0};
        if (spp.head && spp.mode == SPEC_MTP)
            TERN_LOG_INFO("spec: %s resumes the conversation's MTP head (%u rows, tier=%s)", j->id,
                          tern_mtp_n_past(spp.head), cache_tier_name(r->lease.decision.tier));
        if (r->head) { /* the decoder takes the head over (or frees it) */
            if (spp.mode == SPEC_OFF) tern_mtp_free(r->head);
            r->head = NULL;
        }
        st = spp.mode != SPEC_OFF ? spec_dec_init(&r->sd, r->s, r->sampler, &spp, &j->cancel) : TERN_OK;
        free(r->mtp_hid); /* read by spec_dec_init only */
        r->mtp_hid = NULL;
        if (st) {
            /* "spec": "mtp" on a model without the head is the request's mistake */
            req_fail(e, r, st == TERN_ERR_UNSUPPORTED ? 400 : 500, "cannot start decoding: %s", tern_last_error());
            return false;
        }
        if (r->sd.s && r->gm) spec_set_grammar(&r->sd, r->gm, r->gmask, &r->t_mask);
    }
    /* the request's max_tokens, within the server's cap: a request that names none (or
     * more) still ends, with finish_reason "length", instead of holding a place until
     * the context is full */
    r->max_new = j->req.max_tokens > 0 ? j->req.max_tokens : INT64_MAX;
    if (e->max_tokens > 0 && r->max_new > (int64_t)e->max_tokens) r->max_new = e->max_tokens;
    r->finish = "length";
    r->i = 0;
    if (r->max_new <= 0) {
        req_complete(e, r);
        return false;
    }
    return true;
}

/* A token the request forces (tests: forced output; a forced prefix), held to the
 * grammar when there is one; -1 when the grammar refuses it (the request ended). */
static int32_t forced_token(struct srv_engine *e, struct eng_req *r, int32_t tok, const char *what) {
    if (r->gm && !tern_gmatch_accept_token(r->gm, tok)) {
        char msg[160];
        snprintf(msg, sizeof msg, "forced %s token %d (at %lld) is not allowed by the grammar", what, tok,
                 (long long)r->i);
        req_fail(e, r, 500, "%s", msg);
        return -1;
    }
    return tok;
}

/* The request ends with 500 when its grammar allows no further token (gst: the mask's
 * error, TERN_OK when it simply allows none); -1 for next_token. */
static int32_t grammar_stuck(struct srv_engine *e, struct eng_req *r, enum tern_status gst) {
    char msg[300];
    if (gst) snprintf(msg, sizeof msg, "%s", tern_last_error());
    else snprintf(msg, sizeof msg, "the grammar allows no token of the vocabulary after %lld generated "
                  "tokens (the output so far is not a complete match)", (long long)r->i);
    TERN_LOG_WARN("grammar: %s stuck after: %.*s", r->j->id, (int)(r->gtail.len > 2000 ? 2000 : r->gtail.len),
                  r->gtail.data ? r->gtail.data + (r->gtail.len > 2000 ? r->gtail.len - 2000 : 0) : "");
    req_fail(e, r, 500, "constrained decoding stopped: %s", msg);
    return -1;
}

/* The token the request produces next; -1 when it ended (failed). */
static int32_t next_token(struct srv_engine *e, struct eng_req *r, bool *eog) {
    struct eng_job *ej = r->ej;
    const int64_t i = r->i;
    int32_t tok;
    *eog = false;
    if (ej->forced) {
        if ((size_t)i >= ej->n_forced) {
            *eog = true;
            return 0;
        }
        /* an end-of-generation token ends it, as it would a model's output */
        *eog = tern_token_is_eog(e->tok, ej->forced[i]);
        return forced_token(e, r, ej->forced[i], "output");
    }
    if ((size_t)i < ej->n_prefix) return forced_token(e, r, ej->prefix[i], "prefix");
    if (r->sd.s) {
        tok = spec_next(&r->sd); /* under the grammar, if any: taken into the matcher already */
        if (tok < 0) return grammar_stuck(e, r, r->sd.gst);
    } else if (r->gm) {
        double t0 = tern_now_s();
        enum tern_status gst;
        size_t n_allowed = tern_gmatch_mask(r->gm, r->gmask, &gst);
        r->t_mask += tern_now_s() - t0;
        tok = n_allowed ? tern_sampler_sample_masked(r->sampler, tern_session_logits(r->s), r->gmask,
                                                     tern_session_tokens(r->s), tern_session_n_past(r->s))
                        : -1;
        if (tok < 0 || !tern_gmatch_accept_token(r->gm, tok)) return grammar_stuck(e, r, n_allowed ? TERN_OK : gst);
    } else {
        tok = tern_sampler_sample(r->sampler, tern_session_logits(r->s), tern_session_tokens(r->s),
                                  tern_session_n_past(r->s));
    }
    *eog = tern_token_is_eog(e->tok, tok);
    return tok;
}

/* The lazy tool-call trigger: a call opened outside reasoning puts the rest of the
 * output under the tools' grammar. */
static enum tern_status lazy_trigger(struct srv_engine *e, struct eng_req *r) {
    /* harmony: the call as the model writes it (a recipient in the role part of the
     * header is parsed, not constrained) */
    const char *trig = e->chat.tool_syntax == SRV_TOOL_SYNTAX_HARMONY ? "<|channel|>commentary to=functions."
                                                                      : "<tool_call>";
    const size_t tl = strlen(trig);
    struct tern_buf *g = &r->gtail;
    const char *f = g->len > r->lazy_scan ? memmem(g->data + r->lazy_scan, g->len - r->lazy_scan, trig, tl) : NULL;
    r->lazy_scan = g->len >= tl ? g->len - (tl - 1) : 0;
    if (!f || in_reasoning(g->data, (size_t)(f - g->data), r->ej->in_think)) return TERN_OK;
    enum tern_status st = grammar_runtime(e, &r->gmask);
    if (!st) st = grammar_matcher(e, &r->ej->lazy_grammar, r);
    if (st) return st;
    tern_gmatch_get_stats(r->gm, &r->gstats0);
    size_t at = (size_t)(f - g->data);
    if (!tern_gmatch_accept_bytes(r->gm, f, g->len - at)) {
        /* the token that opened the call ran on in a way the grammar does not allow: too
         * late to hold it; the call is parsed as it comes */
        TERN_LOG_WARN("grammar: %s: the tool call opened as '%.*s', which the tools' grammar does not allow; it is "
                      "not constrained",
                      r->j->id, (int)(g->len - at > 80 ? 80 : g->len - at), f);
        req_drop_matcher(r);
    }
    if (r->gm && r->sd.s) spec_set_grammar(&r->sd, r->gm, r->gmask, &r->t_mask);
    tern_grammar_free(r->ej->lazy_grammar);
    r->ej->lazy_grammar = NULL;
    return TERN_OK;
}

/* One decode step of a request: its next token out, then either the end or the token
 * to evaluate. Returns true when r->feed is to be a row of this step's batch. */
static bool decode_step(struct srv_engine *e, struct eng_req *r) {
    struct srv_job *j = r->j;
    if (atomic_load(&j->cancel)) {
        req_cancelled(e, r);
        return false;
    }
    bool eog;
    const int32_t tok = next_token(e, r, &eog);
    if (tok < 0) return false;
    if (eog) {
        r->finish = "stop";
        req_complete(e, r);
        return false;
    }
    if (j->n_generated == 0) j->t_first = tern_now_s();
    j->n_generated++;
    struct out_state *o = &r->o;
    tern_buf_clear(&o->piece);
    enum tern_status st = tern_detok_push(o->detok, tok, &o->piece);
    if (!st) st = out_text(o, o->piece.data, o->piece.len, false);
    if (!st && j->ep == SRV_EP_CHAT && reply_parser_in_think(&o->parser)) o->n_reasoning++;
    if (!st && (r->gm || r->ej->lazy_grammar)) st = tern_buf_append(&r->gtail, o->piece.data ? o->piece.data : "", o->piece.len);
    if (!st && !r->gm && r->ej->lazy_grammar) st = lazy_trigger(e, r);
    if (st) {
        req_fail(e, r, 500, "output: %s", tern_last_error());
        return false;
    }
    if (o->stop.stopped) {
        r->finish = "stop";
        req_complete(e, r);
        return false;
    }
    const int64_t i = r->i++;
    if (i + 1 >= r->max_new) {
        req_complete(e, r);
        return false;
    }
    const uint32_t n_past = r->sd.s ? spec_n_past(&r->sd) : tern_session_n_past(r->s);
    if (n_past + 1 >= tern_session_n_ctx(r->s)) { /* the context is full (prompt + reply = n_ctx): length */
        req_complete(e, r);
        return false;
    }
    r->feed = tok;
    r->rows = (struct spec_rows){.toks = &r->feed, .n = 1};
    if (r->sd.s) {
        /* the verify chunk (the token and its draft) is this request's rows of the step */
        /* drafts stop at max_tokens, and wait while the next token is a forced one */
        const size_t want = (size_t)i + 1 < r->ej->n_prefix ? 0 : (size_t)(r->max_new - i - 1);
        st = spec_prepare(&r->sd, tok, want, &r->rows);
        if (st) {
            r->release_ok = false;
            req_fail(e, r, 500, "decoding failed: %s", tern_last_error());
            return false;
        }
        if (r->rows.n == 0) return false; /* an accepted draft: the session has it already */
    }
    if ((st = session_grow(e, r, r->rows.n))) {
        if (r->sd.s) spec_abort(&r->sd);
        req_fail(e, r, 503, "decoding failed: %s", tern_last_error());
        return false;
    }
    return true;
}

/* ---- prefill ----------------------------------------------------------------------- */

static bool take_checkpoint(struct srv_engine *e, struct eng_req *r) {
    struct tern_checkpoint *c;
    if (tern_session_checkpoint(r->s, &c)) {
        r->release_ok = false;
        req_fail(e, r, 500, "reading the prompt failed: %s", tern_last_error());
        return false;
    }
    cache_on_checkpoint(&r->lease, c);
    r->ick++;
    return true;
}

/* Checkpoints due at the session's position are taken before its next token. */
static bool checkpoints_due(struct srv_engine *e, struct eng_req *r) {
    const uint32_t n_past = tern_session_n_past(r->s);
    while (r->ick < r->lease.n_ckpt && r->lease.ckpt_pos[r->ick] <= n_past)
        if (r->lease.ckpt_pos[r->ick] < n_past) r->ick++; /* below the resume point: not planned, skipped */
        else if (!take_checkpoint(e, r)) return false;
    return true;
}

/* Keep-alive comments for a streamed request still reading its prompt. */
static void prime_comment(struct eng_req *r) {
    double now = tern_now_s();
    if (!r->j->req.stream || now - r->t_comment < PRIME_COMMENT_EVERY_S) return;
    if (r->j->req.proto != SRV_PROTO_CHAT) {
        struct tern_buf b = TERN_BUF_INIT;
        if (!api_stream_keepalive(&r->o.api, &b)) srv_job_write(r->j, b.data, b.len);
        tern_buf_free(&b);
        r->t_comment = now;
        return;
    }
    char line[96];
    int n = snprintf(line, sizeof line, ": priming %u/%zu\n\n", tern_session_n_past(r->s), r->j->n_prompt);
    srv_job_write(r->j, line, (size_t)n);
    r->t_comment = now;
}

/* The next chunk of a request's prompt, within budget: its length (0: none now). */
static uint32_t prefill_chunk(struct srv_engine *e, struct eng_req *r, uint32_t budget) {
    if (atomic_load(&r->j->cancel)) {
        req_cancelled(e, r);
        return 0;
    }
    if (!checkpoints_due(e, r)) return 0;
    const uint32_t n_past = tern_session_n_past(r->s), m = (uint32_t)r->j->n_prompt;
    uint32_t len = m - n_past;
    if (len > budget) len = budget;
    if (r->ick < r->lease.n_ckpt && r->lease.ckpt_pos[r->ick] - n_past < len) len = r->lease.ckpt_pos[r->ick] - n_past;
    if (len == 0) return 0;
    enum tern_status st = session_grow(e, r, len);
    if (st) {
        req_fail(e, r, st == TERN_ERR_RANGE ? 400 : 503, "reading the prompt failed: %s", tern_last_error());
        return 0;
    }
    return len;
}

/* ---- the step ---------------------------------------------------------------------- */

static void count_step(struct srv_engine *e, size_t n_seq, uint32_t decode_rows, uint32_t prefill_rows, double dt) {
    atomic_fetch_add(&e->steps, 1);
    atomic_fetch_add(&e->step_seqs, n_seq);
    atomic_fetch_add(&e->step_decode_rows, decode_rows);
    atomic_fetch_add(&e->step_prefill_rows, prefill_rows);
    atomic_fetch_add(&e->step_us, (uint64_t)(dt * 1e6));
    size_t b = 0;
    while (b + 1 < ENG_STEP_HIST && n_seq > ((size_t)1 << b)) b++;
    atomic_fetch_add(&e->step_hist[b], 1);
}

size_t engine_step(void *self, struct srv_job **ended, size_t cap) {
    struct srv_engine *e = self;
    struct tern_batch_item *items = e->step_items;
    struct eng_req **owner = e->step_owner;
    size_t n_items = 0;
    uint32_t decode_rows = 0, prefill_rows = 0;
    const bool waiting = start_waiting(e);

    /* decode rows first: every stream gets its token each step */
    for (struct eng_req *r = e->run_head; r; r = r->next) {
        if (r->ended || r->phase != RQ_DECODE) continue;
        if (!decode_step(e, r)) continue;
        owner[n_items] = r;
        items[n_items++] = (struct tern_batch_item){
            .s = r->s, .toks = r->rows.toks, .n = r->rows.n, .logits = true, .logits_all = r->rows.logits_all,
            .rec_trail = r->rows.rec_trail};
        decode_rows += r->rows.n;
    }
    /* then the prompts, in arrival order, within the step's budget */
    uint32_t budget = e->batch_tokens > decode_rows ? e->batch_tokens - decode_rows : 0;
    for (struct eng_req *r = e->run_head; r; r = r->next) {
        if (r->ended || r->phase != RQ_PRIME) continue;
        const uint32_t len = prefill_chunk(e, r, budget);
        if (r->ended || len == 0) continue;
        const uint32_t n_past = tern_session_n_past(r->s);
        owner[n_items] = r;
        items[n_items++] = (struct tern_batch_item){
            .s = r->s, .toks = r->j->prompt + n_past, .n = len, .logits = n_past + len == r->j->n_prompt};
        budget -= len;
        prefill_rows += len;
    }
    if (n_items) {
        const double t0 = tern_now_s();
        enum tern_status st = tern_eval_batch(items, n_items);
        count_step(e, n_items, decode_rows, prefill_rows, tern_now_s() - t0);
        for (size_t k = 0; k < n_items; k++) {
            struct eng_req *r = owner[k];
            if (st) {
                if (r->phase == RQ_DECODE && r->sd.s) spec_abort(&r->sd);
                r->release_ok = false;
                req_fail(e, r, 500, "evaluation failed: %s", tern_last_error());
            } else if (r->phase == RQ_DECODE && r->sd.s) {
                spec_commit(&r->sd, &r->rows);
            } else if (r->phase == RQ_PRIME && tern_session_n_past(r->s) == r->j->n_prompt) {
                if (r->mtp_hid) tern_session_capture_hidden(r->s, NULL, 0); /* the prompt is read */
                if (checkpoints_due(e, r)) decode_begin(e, r);
            }
        }
    } else if (waiting) {
        cache_wait_write(e->cache, 5); /* only waiting requests: no step to run (a peer's write: polled) */
    }
    /* (the cache resumes at r < m: every request reads at least its last prompt token) */
    for (struct eng_req *r = e->run_head; r; r = r->next)
        if (!r->ended && r->phase == RQ_PRIME) prime_comment(r);
    /* the requests that ended leave the running set */
    size_t n_ended = 0;
    struct eng_req **pp = &e->run_head, *prev = NULL;
    while (*pp) {
        struct eng_req *r = *pp;
        if (r->ended && n_ended < cap) {
            *pp = r->next;
            if (r->phase == RQ_PRIME) atomic_fetch_sub(&e->n_priming, 1);
            atomic_fetch_sub(&e->n_running, 1);
            e->admitted_bytes -= r->admit_bytes;
            ended[n_ended++] = r->j;
            free(r);
        } else {
            prev = r;
            pp = &r->next;
        }
    }
    e->run_tail = prev;
    return n_ended;
}

void engine_run_free(struct srv_engine *e) {
    while (e->run_head) {
        struct eng_req *r = e->run_head;
        e->run_head = r->next;
        if (!r->ended && r->phase == RQ_WAIT) srv_job_finish(r->j, 503);
        else if (!r->ended) req_end(e, r);
        free(r);
    }
    e->run_tail = NULL;
}
