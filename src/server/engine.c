/* The engine backend (engine.h; its files: engine-impl.h). This file: the engine's
 * lifecycle, prepare (connection threads), the model entry. */
#include "server/engine-impl.h"

#include "model/ctx-default.h"
#include "server/constrain.h"
#include "server/reply.h"
#include "server/respond.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "util/mem.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* ---- prepare (connection threads) -------------------------------------------------- */

static bool fail_status(struct srv_error *err, enum tern_status st, const char *what) {
    if (st == TERN_ERR_NOMEM) srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory (%s)", what);
    else if (st == TERN_ERR_TEMPLATE || st == TERN_ERR_LIMIT)
        srv_error_bad(err, "messages", "the chat template failed: %s", tern_last_error());
    else srv_error_set(err, 500, "server_error", NULL, NULL, "%s: %s", what, tern_last_error());
    return false;
}

/* The messages with every system (or developer) message that follows a non-system one
 * turned into a user message; NULL when there is none (or no memory). Clients put
 * system messages mid-conversation (Claude Code's reminders, Codex's developer
 * messages), and some templates refuse them there (Qwen3.5: "System message must be at
 * the beginning"). The message stays where it stands, as a user turn: a template's
 * refusal is a property of the template, so a conversation always takes the same path
 * and renders to the same prefix every turn. */
static json_t *late_system_as_user(const json_t *messages) {
    bool begun = false, any = false;
    for (size_t i = 0; i < json_array_size(messages); i++) {
        const char *role = json_string_value(json_object_get(json_array_get(messages, i), "role"));
        bool sys = role && (!strcmp(role, "system") || !strcmp(role, "developer"));
        any |= sys && begun;
        begun |= !sys;
    }
    if (!any) return NULL;
    json_t *out = json_deep_copy(messages);
    begun = false;
    for (size_t i = 0; out && i < json_array_size(out); i++) {
        json_t *m = json_array_get(out, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        bool sys = role && (!strcmp(role, "system") || !strcmp(role, "developer"));
        if (sys && begun && json_object_set_new(m, "role", json_string("user"))) {
            json_decref(out);
            return NULL;
        }
        begun |= !sys;
    }
    return out;
}

/* Bounds the work by the context before rendering: every message renders to at least
 * one token (a role marker at least, in every template we know), so a chat with as
 * many messages as the context holds positions cannot fit. 340K one-character messages
 * (11 MB) were rendered and tokenized whole before the context check (a 501 MB peak). */
static bool chat_may_fit(const struct srv_engine *e, const struct srv_job *j, struct srv_error *err) {
    size_t n = json_array_size(j->req.messages);
    if (n < e->n_ctx) return true;
    srv_error_set(err, 400, "invalid_request_error", "context_length_exceeded", "messages",
                  "the request has %zu messages; each takes at least one token and the context holds %u "
                  "(--ctx-size), with at least one left to generate",
                  n, e->n_ctx);
    return false;
}

/* logit_bias ids must be tokens of this vocabulary. */
static bool bias_in_vocab(const struct srv_engine *e, const struct srv_job *j, struct srv_error *err) {
    uint32_t nv = e->info->n_vocab; /* the sampler's */
    for (size_t i = 0; i < j->req.n_bias; i++) {
        if ((uint32_t)j->req.bias_ids[i] >= nv) {
            srv_error_bad(err, "logit_bias", "'logit_bias' names token %d; the vocabulary has %u tokens",
                          j->req.bias_ids[i], nv);
            return false;
        }
    }
    return true;
}

bool engine_prepare(void *self, struct srv_job *j, struct srv_error *err) {
    struct srv_engine *e = self;
    if (!bias_in_vocab(e, j, err)) return false;
    struct eng_job *ej = tern_calloc(1, sizeof *ej);
    if (!ej) return fail_status(err, TERN_ERR_NOMEM, "job");
    j->priv = ej;
    size_t cap = 0;
    enum tern_status st;
    if (j->ep == SRV_EP_CHAT) {
        if (!chat_may_fit(e, j, err)) return false;
        if (e->chat.fmt->harmony) {
            json_t *hm = chat_harmony_messages(j->req.messages);
            if (!hm) return fail_status(err, TERN_ERR_NOMEM, "harmony messages");
            json_decref(j->req.messages);
            j->req.messages = hm;
        }
        json_t *vars = srv_template_vars(&j->req, e->chat.bos_text, e->chat.eos_text);
        if (!vars) return fail_status(err, TERN_ERR_NOMEM, "template variables");
        struct tern_buf text = TERN_BUF_INIT;
        struct tern_template_spans marks = {0}; /* the request's bytes: never control tokens */
        st = chat_fmt_render(&e->chat, vars, &text, &marks);
        json_decref(vars);
        json_t *moved = st == TERN_ERR_TEMPLATE ? late_system_as_user(j->req.messages) : NULL;
        if (moved) {
            TERN_LOG_INFO("template: %s refused a system message after the first turn (%s); rendered as a user turn",
                          j->id, tern_last_error());
            json_decref(j->req.messages);
            j->req.messages = moved;
            tern_buf_clear(&text);
            vars = srv_template_vars(&j->req, e->chat.bos_text, e->chat.eos_text);
            st = vars ? chat_fmt_render(&e->chat, vars, &text, &marks) : TERN_ERR_NOMEM;
            json_decref(vars);
        }
        if (st) {
            tern_buf_free(&text);
            tern_template_spans_free(&marks);
            return fail_status(err, st, "template");
        }
        ej->in_think = reply_prompt_opens_think(e->chat.fmt, text.data, text.len);
        if (!j->req.tools && (j->req.tool_choice == SRV_TOOLS_REQUIRED || j->req.tool_choice == SRV_TOOLS_NAMED)) {
            tern_buf_free(&text);
            tern_template_spans_free(&marks);
            srv_error_bad(err, "tool_choice", "'tool_choice' asks for a tool call, but the request has no 'tools'");
            return false;
        }
        if (j->req.count_only) {
            /* /v1/messages/count_tokens: the prompt is all it needs (clients fire bursts of
             * them: no grammar is built) */
        } else if (srv_tools_enforced(&j->req)) {
            if (j->req.grammar) {
                tern_buf_free(&text);
            tern_template_spans_free(&marks);
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
            tern_template_spans_free(&marks);
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
        st = chat_fmt_tokenize(&e->chat, text.data ? text.data : "", text.len, &marks, &j->prompt, &j->n_prompt, &cap);
        tern_buf_free(&text);
            tern_template_spans_free(&marks);
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
    if (j->n_prompt >= e->n_ctx && !j->req.count_only) {
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

void engine_job_free(void *self, struct srv_job *j) {
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

json_t *engine_model_entry(void *self) {
    struct srv_engine *e = self;
    json_t *meta = json_pack("{s:s,s:I,s:i,s:i,s:b,s:s}", "arch", e->info->arch ? e->info->arch : "",
                             "n_params", (json_int_t)e->info->n_params, "n_ctx", (int)e->n_ctx, "n_vocab",
                             (int)e->info->n_vocab, "hybrid", e->info->hybrid, "chat_template", e->chat.source);
    if (e->demo_note) {
        json_object_set_new(meta, "demo", json_true());
        json_object_set_new(meta, "note", json_string(e->demo_note));
    }
    /* OpenAI's fields and Anthropic's (type, display_name, created_at) side by side */
    char when[32];
    time_t t = (time_t)e->created;
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:s,s:o}", "id", e->model_id, "object", "model", "created",
                     (json_int_t)e->created, "owned_by", "tern", "type", "model", "display_name", e->model_id,
                     "created_at", when, "meta", meta);
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
    e->chat.parse_special_in_content = p->parse_special_in_content;
    struct cache_params cp = p->cache;
    uint32_t n_ctx = cp.session.n_ctx;
    if (n_ctx == 0) n_ctx = tern_n_ctx_default(e->info->n_ctx_train); /* the session's own default */
    cp.session.n_ctx = n_ctx;
    e->n_ctx = n_ctx;
    if (cp.turn_token < 0) cp.turn_token = chat_turn_token(&e->chat);
    e->turn_token = cp.turn_token;
    e->peer_wait_ms = cp.peer_wait_ms;
    e->admit_budget = cp.ram_bytes;
    e->kv_per_token = e->info->kv_bytes_per_token_f16 * (cp.session.kv_type == TERN_KV_F32 ? 2 : 1);
    e->predict = p->predict;
    e->predict_chunk = p->predict_chunk ? p->predict_chunk : PREDICT_CHUNK_DEFAULT;
    if (cp.session.n_chunk && e->predict_chunk > cp.session.n_chunk) e->predict_chunk = cp.session.n_chunk;
    e->predict_delay_ms = p->predict_test_delay_ms;
    e->max_tokens = p->max_tokens;
    e->spec = p->spec;
    e->spec_max = p->spec_max;
    e->spec_trail_bytes = p->spec_trail_bytes ? p->spec_trail_bytes : (size_t)SPEC_TRAIL_DEFAULT_MIB << 20;
    /* --spec mtp on a model without the head is refused at startup, not per request */
    if (e->spec == SPEC_MTP && !e->info->has_mtp) {
        st = tern_errorf(TERN_ERR_UNSUPPORTED,
                         "--spec mtp: the model (%s) has no multi-token-prediction head (no nextn block)",
                         e->info->arch ? e->info->arch : "?");
        srv_engine_free(e); /* the message first: it reads e */
        return st;
    }
    if (e->spec != SPEC_OFF) {
        const uint32_t max = e->spec_max ? e->spec_max : SPEC_DEFAULT_MAX;
        const size_t rb = e->info->hybrid ? e->info->recurrent_bytes : 0, slots = rb ? e->spec_trail_bytes / rb : 0;
        if (rb && slots < 2)
            TERN_LOG_INFO("speculative decoding: %s, up to %u tokens per draft; the state trail (--spec-trail %zu "
                          "MiB) holds no draft's states (%.1f MiB each): a checkpoint and a re-read instead",
                          spec_mode_name(e->spec), max, e->spec_trail_bytes >> 20, (double)rb / (1 << 20));
        else
            TERN_LOG_INFO("speculative decoding: %s, up to %u tokens per draft%s", spec_mode_name(e->spec),
                          rb && slots - 1 < max ? (uint32_t)(slots - 1) : max,
                          rb && slots - 1 < max ? " (what the --spec-trail bound holds)" : "");
    }
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
    /* The step scheduler: --parallel requests at once (default: as many full contexts
     * as the pool's budget holds, 4 to 8), --batch-tokens rows per step (default: the
     * session's prefill chunk). */
    e->batch_tokens = p->batch_tokens ? p->batch_tokens : cp.session.n_chunk ? cp.session.n_chunk : TERN_DEFAULT_CHUNK;
    e->parallel = p->parallel;
    if (!e->parallel) {
        const size_t per_token = e->info->kv_bytes_per_token_f16 * (cp.session.kv_type == TERN_KV_F32 ? 2 : 1);
        const size_t full = per_token * n_ctx + e->info->recurrent_bytes + 1;
        const size_t fit = cp.ram_bytes / full;
        e->parallel = fit < 4 ? 4 : fit > 8 ? 8 : (uint32_t)fit;
        if (fit < e->parallel)
            TERN_LOG_INFO("scheduler: %u full contexts of %u tokens (%zu MiB each) exceed --cache-ram %zu MiB; parked "
                          "sessions give way as running ones grow (set --parallel or --ctx-size to bound it)",
                          e->parallel, n_ctx, full >> 20, cp.ram_bytes >> 20);
    }
    if (e->parallel > MODEL_MAX_PARALLEL) e->parallel = MODEL_MAX_PARALLEL;
    e->step_items = tern_calloc(e->parallel, sizeof *e->step_items);
    e->step_owner = tern_calloc(e->parallel, sizeof *e->step_owner);
    if (!e->step_items || !e->step_owner) {
        srv_engine_free(e);
        return tern_errorf(TERN_ERR_NOMEM, "out of memory");
    }
    TERN_LOG_INFO("scheduler: up to %u requests at once (--parallel), %u tokens per step (--batch-tokens); running "
                  "requests admitted by the memory they can grow to, within --cache-ram %zu MiB (a full context: %zu "
                  "MiB)",
                  e->parallel, e->batch_tokens, e->admit_budget >> 20,
                  (e->kv_per_token * n_ctx + e->info->recurrent_bytes) >> 20);
    e->model_id = tern_strdup(p->model_id ? p->model_id : e->info->name);
    e->demo_note = p->demo_note ? tern_strdup(p->demo_note) : NULL;
    if (!e->model_id || (p->demo_note && !e->demo_note)) {
        srv_engine_free(e);
        return tern_errorf(TERN_ERR_NOMEM, "out of memory");
    }
    e->backend = (struct srv_backend){
        .self = e,
        .prepare = engine_prepare,
        .start = engine_start,
        .step = engine_step,
        .max_running = e->parallel,
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

void srv_engine_flush(struct srv_engine *e) {
    if (e && e->cache) cache_flush(e->cache);
}

void srv_engine_free(struct srv_engine *e) {
    if (!e) return;
    engine_run_free(e);
    free(e->step_items);
    free(e->step_owner);
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
