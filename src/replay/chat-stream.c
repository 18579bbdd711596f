/* One streamed chat-completions response, consumed into a measurement. */
#include "replay/replay.h"
#include "replay/sse.h"

#include "util/hash.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOOL_CALLS 64

struct tool_acc {
    struct tern_buf name;
    struct tern_buf args;
};

struct tern_chat_stream {
    struct tern_replay_meas *m;
    uint64_t t0_ns;
    struct tern_sse_parser sse;
    struct tern_buf content, reasoning;
    struct tool_acc tools[MAX_TOOL_CALLS];
    size_t n_tools;
    bool got_byte, got_output, finished, done;
    uint64_t t_finish_ns;
    char error[512];
    size_t n_events;
};

static double since(const struct tern_chat_stream *cs, uint64_t t) { return (double)(t - cs->t0_ns) * 1e-9; }

static void mark_output(struct tern_chat_stream *cs, const char *at) {
    if (cs->got_output) return;
    cs->got_output = true;
    cs->m->ttft_s = since(cs, tern_now_ns());
    cs->m->ttft_at = at;
}

static long usage_int(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

static enum tern_status on_delta_text(struct tern_chat_stream *cs, json_t *v, struct tern_buf *into) {
    if (!json_is_string(v) || json_string_length(v) == 0) return TERN_OK;
    mark_output(cs, "text");
    return tern_buf_append(into, json_string_value(v), json_string_length(v));
}

static void finish_with(struct tern_chat_stream *cs, const char *reason) {
    if (!cs->finished) cs->t_finish_ns = tern_now_ns();
    cs->finished = true;
    snprintf(cs->m->finish_reason, sizeof cs->m->finish_reason, "%s", reason);
}

static struct tool_acc *tool_at(struct tern_chat_stream *cs, size_t idx) {
    if (idx >= MAX_TOOL_CALLS) return NULL;
    if (idx >= cs->n_tools) cs->n_tools = idx + 1;
    return &cs->tools[idx];
}

/* The Anthropic Messages events (server/api/messages.c): usage at message_start and
 * message_delta (input_tokens there excludes cache reads), one content block at a time. */
static enum tern_status on_messages_event(struct tern_chat_stream *cs, const char *type, json_t *j) {
    json_t *usage = NULL;
    if (!strcmp(type, "message_start")) {
        usage = json_object_get(json_object_get(j, "message"), "usage");
    } else if (!strcmp(type, "content_block_start")) {
        json_t *b = json_object_get(j, "content_block");
        const char *bt = json_string_value(json_object_get(b, "type"));
        if (bt && !strcmp(bt, "tool_use")) {
            struct tool_acc *t = tool_at(cs, cs->n_tools);
            json_t *name = json_object_get(b, "name");
            mark_output(cs, "tool_call");
            if (t && json_is_string(name)) return tern_buf_append(&t->name, json_string_value(name), json_string_length(name));
        }
    } else if (!strcmp(type, "content_block_delta")) {
        json_t *d = json_object_get(j, "delta");
        const char *dt = json_string_value(json_object_get(d, "type"));
        if (!dt) return TERN_OK;
        if (!strcmp(dt, "text_delta")) return on_delta_text(cs, json_object_get(d, "text"), &cs->content);
        if (!strcmp(dt, "thinking_delta")) return on_delta_text(cs, json_object_get(d, "thinking"), &cs->reasoning);
        if (!strcmp(dt, "input_json_delta") && cs->n_tools) {
            json_t *pj = json_object_get(d, "partial_json");
            if (json_is_string(pj))
                return tern_buf_append(&cs->tools[cs->n_tools - 1].args, json_string_value(pj), json_string_length(pj));
        }
    } else if (!strcmp(type, "message_delta")) {
        const char *sr = json_string_value(json_object_get(json_object_get(j, "delta"), "stop_reason"));
        if (sr) finish_with(cs, sr);
        usage = json_object_get(j, "usage");
    } else if (!strcmp(type, "message_stop")) {
        cs->done = true;
    }
    if (json_is_object(usage)) {
        long in = usage_int(usage, "input_tokens"), rd = usage_int(usage, "cache_read_input_tokens"),
             cr = usage_int(usage, "cache_creation_input_tokens"), out = usage_int(usage, "output_tokens");
        if (in >= 0) {
            cs->m->usage_seen = true;
            cs->m->prompt_tokens = in + (rd > 0 ? rd : 0) + (cr > 0 ? cr : 0);
            cs->m->cached_tokens = rd >= 0 ? rd : 0;
        }
        if (out >= 0) cs->m->completion_tokens = out;
    }
    return TERN_OK;
}

/* The OpenAI Responses events (server/api/responses.c): output items one at a time, the
 * usage in response.completed / response.incomplete. */
static enum tern_status on_responses_event(struct tern_chat_stream *cs, const char *type, json_t *j) {
    if (!strcmp(type, "response.output_text.delta")) return on_delta_text(cs, json_object_get(j, "delta"), &cs->content);
    if (!strcmp(type, "response.reasoning_text.delta") || !strcmp(type, "response.reasoning_summary_text.delta"))
        return on_delta_text(cs, json_object_get(j, "delta"), &cs->reasoning);
    if (!strcmp(type, "response.output_item.added")) {
        json_t *item = json_object_get(j, "item");
        const char *it = json_string_value(json_object_get(item, "type"));
        if (it && (!strcmp(it, "function_call") || !strcmp(it, "custom_tool_call"))) {
            struct tool_acc *t = tool_at(cs, cs->n_tools);
            json_t *name = json_object_get(item, "name");
            mark_output(cs, "tool_call");
            if (t && json_is_string(name)) return tern_buf_append(&t->name, json_string_value(name), json_string_length(name));
        }
        return TERN_OK;
    }
    if (!strcmp(type, "response.function_call_arguments.delta") && cs->n_tools) {
        json_t *d = json_object_get(j, "delta");
        if (json_is_string(d)) return tern_buf_append(&cs->tools[cs->n_tools - 1].args, json_string_value(d), json_string_length(d));
        return TERN_OK;
    }
    if (!strcmp(type, "response.completed") || !strcmp(type, "response.incomplete")) {
        json_t *r = json_object_get(j, "response");
        finish_with(cs, !strcmp(type, "response.completed") ? "stop" : "length");
        cs->done = true;
        json_t *usage = json_object_get(r, "usage");
        if (json_is_object(usage)) {
            cs->m->usage_seen = true;
            cs->m->prompt_tokens = usage_int(usage, "input_tokens");
            cs->m->completion_tokens = usage_int(usage, "output_tokens");
            long c = usage_int(json_object_get(usage, "input_tokens_details"), "cached_tokens");
            cs->m->cached_tokens = c >= 0 ? c : 0;
        }
        return TERN_OK;
    }
    if (!strcmp(type, "response.failed")) {
        json_t *msg = json_object_get(json_object_get(json_object_get(j, "response"), "error"), "message");
        snprintf(cs->error, sizeof cs->error, "the server sent response.failed: %s",
                 json_is_string(msg) ? json_string_value(msg) : "?");
        return TERN_ERR_FORMAT;
    }
    return TERN_OK;
}

static int on_event(void *user, const struct tern_sse_event *ev) {
    struct tern_chat_stream *cs = user;
    cs->n_events++;
    if (ev->data_len == 6 && !memcmp(ev->data, "[DONE]", 6)) {
        cs->done = true;
        return 0;
    }
    json_error_t jerr;
    /* A model may generate a NUL byte (a byte-level token); JSON carries it as \u0000. */
    json_t *j = json_loadb(ev->data, ev->data_len, JSON_ALLOW_NUL, &jerr);
    if (!j) {
        snprintf(cs->error, sizeof cs->error, "SSE event %zu is not JSON (%s): '%.80s'", cs->n_events, jerr.text,
                 ev->data);
        return 1;
    }
    enum tern_status st = TERN_OK;
    json_t *err = json_object_get(j, "error");
    if (err && !json_is_null(err)) {
        json_t *msg = json_object_get(err, "message");
        snprintf(cs->error, sizeof cs->error, "the server sent an error event: %s",
                 json_is_string(msg) ? json_string_value(msg) : json_is_string(err) ? json_string_value(err) : "?");
        json_decref(j);
        return 1;
    }
    /* the Messages and Responses doors: events named by their "type" */
    const char *type = json_string_value(json_object_get(j, "type"));
    json_t *choice = type ? NULL : json_array_get(json_object_get(j, "choices"), 0);
    if (type) {
        st = !strncmp(type, "response.", 9) ? on_responses_event(cs, type, j) : on_messages_event(cs, type, j);
        if (st != TERN_OK && cs->error[0]) {
            json_decref(j);
            return 1;
        }
    }
    if (choice) {
        json_t *delta = json_object_get(choice, "delta");
        if (!delta) delta = json_object_get(choice, "message"); /* a non-conforming server; accept */
        if (json_is_object(delta)) {
            st = on_delta_text(cs, json_object_get(delta, "reasoning_content"), &cs->reasoning);
            if (st == TERN_OK) st = on_delta_text(cs, json_object_get(delta, "reasoning"), &cs->reasoning);
            if (st == TERN_OK) st = on_delta_text(cs, json_object_get(delta, "content"), &cs->content);
            json_t *calls = json_object_get(delta, "tool_calls");
            size_t k;
            json_t *tc;
            json_array_foreach(calls, k, tc) {
                if (st != TERN_OK) break;
                json_t *jidx = json_object_get(tc, "index");
                size_t idx = json_is_integer(jidx) ? (size_t)json_integer_value(jidx) : k;
                if (idx >= MAX_TOOL_CALLS) continue;
                if (idx >= cs->n_tools) cs->n_tools = idx + 1;
                json_t *f = json_object_get(tc, "function");
                json_t *name = json_object_get(f, "name");
                json_t *args = json_object_get(f, "arguments");
                if (json_is_string(name) && json_string_length(name) > 0) {
                    mark_output(cs, "tool_call");
                    st = tern_buf_append(&cs->tools[idx].name, json_string_value(name), json_string_length(name));
                }
                if (st == TERN_OK && json_is_string(args) && json_string_length(args) > 0) {
                    mark_output(cs, "tool_call");
                    st = tern_buf_append(&cs->tools[idx].args, json_string_value(args), json_string_length(args));
                }
            }
        }
        json_t *fr = json_object_get(choice, "finish_reason");
        if (json_is_string(fr)) {
            if (!cs->finished) cs->t_finish_ns = tern_now_ns();
            cs->finished = true;
            snprintf(cs->m->finish_reason, sizeof cs->m->finish_reason, "%s", json_string_value(fr));
        }
    }
    json_t *usage = type ? NULL : json_object_get(j, "usage");
    if (json_is_object(usage)) {
        cs->m->usage_seen = true;
        cs->m->prompt_tokens = usage_int(usage, "prompt_tokens");
        cs->m->completion_tokens = usage_int(usage, "completion_tokens");
        cs->m->cached_tokens = usage_int(json_object_get(usage, "prompt_tokens_details"), "cached_tokens");
    }
    json_t *reuse = json_object_get(json_object_get(j, "tern"), "reuse");
    if (json_is_object(reuse)) {
        char *s = json_dumps(reuse, JSON_COMPACT);
        if (s) {
            free(cs->m->reuse_json);
            cs->m->reuse_json = s;
        }
    }
    json_decref(j);
    if (st != TERN_OK) {
        snprintf(cs->error, sizeof cs->error, "%s", tern_last_error());
        return 1;
    }
    return 0;
}

static int on_comment(void *user, const char *text, size_t n) {
    struct tern_chat_stream *cs = user;
    (void)text;
    (void)n;
    cs->m->n_comments++;
    return 0;
}

enum tern_status tern_chat_stream_new(struct tern_replay_meas *m, uint64_t t0_ns, struct tern_chat_stream **out) {
    *out = NULL;
    struct tern_chat_stream *cs = tern_calloc(1, sizeof *cs);
    if (!cs) return tern_errorf(TERN_ERR_NOMEM, "out of memory for a response stream");
    cs->m = m;
    cs->t0_ns = t0_ns;
    m->ttft_s = NAN;
    m->ttft_at = "none";
    m->first_byte_s = NAN;
    m->total_s = NAN;
    m->prompt_tokens = m->cached_tokens = m->completion_tokens = -1;
    m->usage_seen = false;
    m->finish_reason[0] = 0;
    m->n_comments = 0;
    tern_sse_init(&cs->sse, on_event, on_comment, cs);
    *out = cs;
    return TERN_OK;
}

enum tern_status tern_chat_stream_feed(struct tern_chat_stream *cs, const char *data, size_t n) {
    if (!cs->got_byte && n > 0) {
        cs->got_byte = true;
        cs->m->first_byte_s = since(cs, tern_now_ns());
    }
    enum tern_status st = tern_sse_feed(&cs->sse, data, n);
    if (st != TERN_OK && cs->error[0]) return tern_errorf(TERN_ERR_FORMAT, "%s", cs->error);
    return st;
}

/* Each field followed by a NUL, so that ("ab", "") and ("a", "b") hash differently. */
static void hash_field(XXH3_state_t *h, const char *p, size_t n) {
    if (n) XXH3_64bits_update(h, p, n);
    XXH3_64bits_update(h, "", 1);
}

enum tern_status tern_chat_stream_finish(struct tern_chat_stream *cs, uint64_t t_end_ns) {
    struct tern_replay_meas *m = cs->m;
    m->total_s = since(cs, t_end_ns);
    if (cs->error[0]) return tern_errorf(TERN_ERR_FORMAT, "%s", cs->error);
    if (!cs->done && !cs->finished)
        return tern_errorf(TERN_ERR_FORMAT, "the stream ended without a finish_reason or [DONE] (%zu events)",
                           cs->n_events);
    if (!cs->got_output && cs->finished) {
        /* The first token generated ended the answer: the finish chunk is when it came. */
        m->ttft_s = since(cs, cs->t_finish_ns);
        m->ttft_at = "finish";
    }
    /* Output identity: reasoning, content and tool calls, unambiguously separated. */
    XXH3_state_t *h = XXH3_createState();
    if (!h) return tern_errorf(TERN_ERR_NOMEM, "out of memory hashing the output");
    XXH3_64bits_reset(h);
    hash_field(h, cs->reasoning.data, cs->reasoning.len);
    hash_field(h, cs->content.data, cs->content.len);
    struct tern_buf tools = TERN_BUF_INIT;
    enum tern_status st = tern_buf_puts(&tools, "");
    for (size_t i = 0; i < cs->n_tools && st == TERN_OK; i++) {
        const char *nm = cs->tools[i].name.data ? cs->tools[i].name.data : "";
        const char *ar = cs->tools[i].args.data ? cs->tools[i].args.data : "";
        hash_field(h, nm, cs->tools[i].name.len);
        hash_field(h, ar, cs->tools[i].args.len);
        st = tern_buf_printf(&tools, "%s%s(%s)", i ? ";" : "", nm, ar);
    }
    m->out_hash = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    if (st != TERN_OK) {
        tern_buf_free(&tools);
        return st;
    }
    free(m->out_content);
    free(m->out_reasoning);
    free(m->out_tool_calls);
    /* Kept with their lengths: the text may hold NUL bytes. */
    m->out_content_len = cs->content.len;
    m->out_reasoning_len = cs->reasoning.len;
    m->out_content = cs->content.data ? tern_buf_detach(&cs->content, NULL) : tern_strdup("");
    m->out_reasoning = cs->reasoning.data ? tern_buf_detach(&cs->reasoning, NULL) : tern_strdup("");
    m->out_tool_calls = tern_buf_detach(&tools, NULL);
    if (!m->out_content || !m->out_reasoning || !m->out_tool_calls)
        return tern_errorf(TERN_ERR_NOMEM, "out of memory keeping the output");
    return TERN_OK;
}

void tern_chat_stream_free(struct tern_chat_stream *cs) {
    if (!cs) return;
    tern_sse_free(&cs->sse);
    tern_buf_free(&cs->content);
    tern_buf_free(&cs->reasoning);
    for (size_t i = 0; i < MAX_TOOL_CALLS; i++) {
        tern_buf_free(&cs->tools[i].name);
        tern_buf_free(&cs->tools[i].args);
    }
    free(cs);
}

void tern_replay_meas_clear(struct tern_replay_meas *m) {
    if (!m) return;
    free(m->out_content);
    free(m->out_reasoning);
    free(m->out_tool_calls);
    free(m->reuse_json);
    m->out_content = m->out_reasoning = m->out_tool_calls = m->reuse_json = NULL;
}

/* ---- integrity checks ------------------------------------------------------------------ */

enum tern_status tern_replay_check_usage(const struct tern_replay_meas *m, const char *arm) {
    if (!m->usage_seen)
        return tern_errorf(TERN_ERR_FORMAT, "turn %zu, arm %s, rep %d: the response carried no usage (the request "
                           "asks for stream_options.include_usage)", m->turn, arm, m->rep + 1);
    if (m->prompt_tokens <= 0)
        return tern_errorf(TERN_ERR_FORMAT, "turn %zu, arm %s, rep %d: usage.prompt_tokens is %s", m->turn, arm,
                           m->rep + 1, m->prompt_tokens < 0 ? "missing" : "0");
    if (m->cached_tokens > m->prompt_tokens)
        return tern_errorf(TERN_ERR_FORMAT, "turn %zu, arm %s, rep %d: the server reports %ld cached tokens of a "
                           "%ld-token prompt (cached > prompt)", m->turn, arm, m->rep + 1, m->cached_tokens,
                           m->prompt_tokens);
    return TERN_OK;
}

enum tern_status tern_replay_check_turn(const struct tern_replay_meas *const *ms, size_t n,
                                        const char *const *arm_labels) {
    return tern_replay_check_turn_slack(ms, n, arm_labels, 0);
}

enum tern_status tern_replay_check_turn_slack(const struct tern_replay_meas *const *ms, size_t n,
                                              const char *const *arm_labels, long slack) {
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i; j++) {
            const struct tern_replay_meas *a = ms[j], *b = ms[i];
            if (a->rep == b->rep && a->arm != b->arm &&
                (a->body_hash != b->body_hash || a->body_len != b->body_len))
                return tern_errorf(TERN_ERR_INTERNAL, "turn %zu, rep %d: the request sent to arm %s (%zu bytes, "
                                   "xxh3 %016llx) differs from the one sent to arm %s (%zu bytes, xxh3 %016llx); both "
                                   "arms must receive the same bytes", b->turn, b->rep + 1, arm_labels[a->arm],
                                   a->body_len, (unsigned long long)a->body_hash, arm_labels[b->arm], b->body_len,
                                   (unsigned long long)b->body_hash);
            if (a->prompt_tokens >= 0 && b->prompt_tokens >= 0 &&
                (a->prompt_tokens > b->prompt_tokens + slack || b->prompt_tokens > a->prompt_tokens + slack))
                return tern_errorf(TERN_ERR_FORMAT, "turn %zu: arm %s rep %d counts %ld prompt tokens, arm %s rep %d "
                                   "counts %ld; the same prompt must tokenize the same (different models or "
                                   "templates cannot be compared)", b->turn, arm_labels[a->arm], a->rep + 1,
                                   a->prompt_tokens, arm_labels[b->arm], b->rep + 1, b->prompt_tokens);
        }
    }
    return TERN_OK;
}
