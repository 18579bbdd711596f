/* The replay through the other doors: a transcript's chat-completions body as an
 * Anthropic Messages or OpenAI Responses body (replay.h, tern_replay_to_protocol).
 *
 * The conversion is what a client of that protocol would send for the same
 * conversation: leading system messages become `system` (text blocks) / `instructions`;
 * user text becomes text blocks / input_text parts; an assistant turn becomes thinking,
 * text and tool_use blocks / reasoning, message and function_call items; tool results
 * become tool_result blocks in one user turn / function_call_output items. A shape (the
 * first request body a real client sent, captured by bench/agent-shape.mjs) replaces
 * the system prompt and the tool list with the client's own — Claude Code's `system`
 * blocks, tools, thinking, output_config and metadata (its session identity); Codex's
 * leading developer messages, tools (namespaces included), reasoning, tool_choice and
 * prompt_cache_key — so the replay carries the prompt that client really sends. Deterministic: the same body always converts to the
 * same bytes, so both arms of a run see identical requests. */
#include "replay/replay.h"

#include "util/hash.h"
#include "util/mem.h"

#include <string.h>

static json_t *text_of(const json_t *content) {
    if (json_is_string(content)) return json_incref((json_t *)content);
    json_t *parts = json_array();
    size_t i;
    json_t *p;
    json_array_foreach(content, i, p) {
        json_t *t = json_object_get(p, "text");
        if (json_is_string(t)) json_array_append(parts, t);
    }
    /* joined with "\n", as the servers join parts */
    size_t n = 0;
    json_array_foreach(parts, i, p) n += json_string_length(p) + 1;
    char *buf = tern_malloc(n + 1);
    size_t len = 0;
    if (buf) {
        json_array_foreach(parts, i, p) {
            if (i) buf[len++] = '\n';
            memcpy(buf + len, json_string_value(p), json_string_length(p));
            len += json_string_length(p);
        }
    }
    json_decref(parts);
    json_t *s = buf ? json_stringn(buf, len) : NULL;
    free(buf);
    return s ? s : json_string("");
}

static const char *role_of(const json_t *m) {
    const char *r = json_string_value(json_object_get(m, "role"));
    return r ? r : "";
}

static json_t *args_object(const json_t *args) {
    if (json_is_object(args)) return json_incref((json_t *)args);
    json_t *o = json_is_string(args) ? json_loadb(json_string_value(args), json_string_length(args), 0, NULL) : NULL;
    if (json_is_object(o)) return o;
    json_decref(o);
    return json_object();
}

static json_t *args_string(const json_t *args) {
    if (json_is_string(args)) return json_incref((json_t *)args);
    char *s = json_dumps(args ? args : json_object(), JSON_COMPACT);
    json_t *v = json_string(s ? s : "{}");
    free(s);
    return v;
}

/* The leading system messages' text, joined with "\n\n"; *first: the index after them. */
static json_t *system_prompt(const json_t *msgs, size_t *first) {
    json_t *parts = json_array();
    size_t i = 0;
    for (; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        if (strcmp(role_of(m), "system") && strcmp(role_of(m), "developer")) break;
        json_array_append_new(parts, text_of(json_object_get(m, "content")));
    }
    *first = i;
    if (!json_array_size(parts)) {
        json_decref(parts);
        return NULL;
    }
    return parts;
}

static void copy_if(json_t *to, const char *as, const json_t *from, const char *k) {
    json_t *v = json_object_get(from, k);
    if (v) json_object_set(to, as, v);
}

/* ---- Anthropic Messages ---------------------------------------------------------------- */

/* Claude Code's first system block, "x-anthropic-billing-header: ...; cch=XXXXX;", changes
 * with every request. A replayed shape varies it the same way (cch from a hash of the
 * turn's body: the same for both arms, different every turn), so that a server which
 * keeps the block pays for it as it would with the real client. */
static void billing_vary(json_t *blocks, const json_t *chat) {
    json_t *b = json_array_get(blocks, 0);
    const char *t = json_string_value(json_object_get(b, "text"));
    const char *cch = t && !strncmp(t, "x-anthropic-billing-header:", 27) ? strstr(t, "cch=") : NULL;
    if (!cch) return;
    char *s = json_dumps(json_object_get(chat, "messages"), JSON_COMPACT);
    unsigned h = s ? (unsigned)(tern_hash64(s, strlen(s)) & 0xfffffu) : 0;
    free(s);
    const char *end = strchr(cch, ';');
    json_t *v = json_sprintf("%.*scch=%05x%s", (int)(cch - t), t, h, end ? end : ";");
    if (v) json_object_set_new(b, "text", v);
}

static json_t *to_messages(const json_t *chat, const json_t *shape) {
    json_t *out = json_object();
    copy_if(out, "model", chat, "model");
    json_t *mt = json_object_get(chat, "max_completion_tokens");
    json_object_set(out, "max_tokens", mt ? mt : json_object_get(chat, "max_tokens"));
    const json_t *msgs = json_object_get(chat, "messages");
    size_t first;
    json_t *sys = system_prompt(msgs, &first);
    if (shape && json_object_get(shape, "system")) {
        json_t *blocks = json_deep_copy(json_object_get(shape, "system"));
        billing_vary(blocks, chat);
        json_object_set_new(out, "system", blocks);
    } else if (sys) {
        json_t *blocks = json_array();
        size_t i;
        json_t *t;
        json_array_foreach(sys, i, t) json_array_append_new(blocks, json_pack("{s:s,s:O}", "type", "text", "text", t));
        json_object_set_new(out, "system", blocks);
    }
    json_decref(sys);
    json_t *turns = json_array(), *user = NULL;
    for (size_t i = first; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = role_of(m);
        if (!strcmp(role, "assistant")) {
            if (user) json_array_append_new(turns, json_pack("{s:s,s:o}", "role", "user", "content", user));
            user = NULL;
            json_t *blocks = json_array();
            const json_t *rc = json_object_get(m, "reasoning_content");
            if (json_is_string(rc) && json_string_length(rc))
                json_array_append_new(blocks, json_pack("{s:s,s:O,s:s}", "type", "thinking", "thinking", rc,
                                                        "signature", "replay"));
            json_t *text = text_of(json_object_get(m, "content"));
            if (json_string_length(text)) json_array_append_new(blocks, json_pack("{s:s,s:o}", "type", "text", "text", text));
            else json_decref(text);
            size_t k;
            json_t *c;
            json_array_foreach(json_object_get(m, "tool_calls"), k, c) {
                const json_t *fn = json_object_get(c, "function");
                json_array_append_new(blocks, json_pack("{s:s,s:O,s:O,s:o}", "type", "tool_use", "id",
                                                        json_object_get(c, "id"), "name", json_object_get(fn, "name"),
                                                        "input", args_object(json_object_get(fn, "arguments"))));
            }
            json_array_append_new(turns, json_pack("{s:s,s:o}", "role", "assistant", "content", blocks));
            continue;
        }
        if (!user) user = json_array();
        json_t *text = text_of(json_object_get(m, "content"));
        if (!strcmp(role, "tool"))
            json_array_append_new(user, json_pack("{s:s,s:O,s:o}", "type", "tool_result", "tool_use_id",
                                                  json_object_get(m, "tool_call_id"), "content", text));
        else
            json_array_append_new(user, json_pack("{s:s,s:o}", "type", "text", "text", text));
    }
    if (user) json_array_append_new(turns, json_pack("{s:s,s:o}", "role", "user", "content", user));
    json_object_set_new(out, "messages", turns);
    if (shape && json_object_get(shape, "tools")) {
        copy_if(out, "tools", shape, "tools");
    } else {
        json_t *tools = json_array();
        size_t k;
        json_t *t;
        json_array_foreach(json_object_get(chat, "tools"), k, t) {
            const json_t *fn = json_object_get(t, "function");
            json_t *tool = json_pack("{s:O}", "name", json_object_get(fn, "name"));
            copy_if(tool, "description", fn, "description");
            json_t *p = json_object_get(fn, "parameters");
            json_object_set_new(tool, "input_schema", p ? json_incref(p) : json_pack("{s:s}", "type", "object"));
            json_array_append_new(tools, tool);
        }
        if (json_array_size(tools)) json_object_set_new(out, "tools", tools);
        else json_decref(tools);
    }
    copy_if(out, "temperature", chat, "temperature");
    json_object_set_new(out, "stream", json_true());
    copy_if(out, "cache_salt", chat, "cache_salt");
    static const char *const from_shape[] = {"thinking", "output_config", "metadata"};
    for (size_t i = 0; shape && i < sizeof from_shape / sizeof *from_shape; i++) copy_if(out, from_shape[i], shape, from_shape[i]);
    return out;
}

/* ---- OpenAI Responses ------------------------------------------------------------------ */

static json_t *to_responses(const json_t *chat, const json_t *shape) {
    json_t *out = json_object();
    copy_if(out, "model", chat, "model");
    const json_t *msgs = json_object_get(chat, "messages");
    size_t first;
    json_t *sys = system_prompt(msgs, &first);
    if (shape && json_is_string(json_object_get(shape, "instructions")) &&
        json_string_length(json_object_get(shape, "instructions"))) {
        copy_if(out, "instructions", shape, "instructions");
    } else if (sys) {
        json_t *t = json_array_get(sys, 0); /* one system message in every transcript */
        json_object_set(out, "instructions", t);
    }
    json_decref(sys);
    json_t *input = json_array();
    /* the client's own system prompt: its leading developer / system messages */
    const json_t *sin = shape ? json_object_get(shape, "input") : NULL;
    for (size_t i = 0; i < json_array_size(sin); i++) {
        const json_t *it = json_array_get(sin, i);
        const char *r = role_of(it);
        if (strcmp(r, "developer") && strcmp(r, "system")) break;
        json_array_append(input, (json_t *)it);
    }
    if (json_array_size(input)) json_object_del(out, "instructions");
    for (size_t i = first; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = role_of(m);
        json_t *text = text_of(json_object_get(m, "content"));
        if (!strcmp(role, "tool")) {
            json_array_append_new(input, json_pack("{s:s,s:O,s:o}", "type", "function_call_output", "call_id",
                                                   json_object_get(m, "tool_call_id"), "output", text));
        } else if (!strcmp(role, "assistant")) {
            const json_t *rc = json_object_get(m, "reasoning_content");
            if (json_is_string(rc) && json_string_length(rc)) {
                char id[48];
                snprintf(id, sizeof id, "rs_replay_%zu", i);
                json_array_append_new(input, json_pack("{s:s,s:s,s:[],s:[{s:s,s:O}]}", "type", "reasoning", "id", id,
                                                       "summary", "content", "type", "reasoning_text", "text", rc));
            }
            if (json_string_length(text))
                json_array_append_new(input, json_pack("{s:s,s:s,s:[{s:s,s:O}]}", "type", "message", "role",
                                                       "assistant", "content", "type", "output_text", "text", text));
            json_decref(text);
            size_t k;
            json_t *c;
            json_array_foreach(json_object_get(m, "tool_calls"), k, c) {
                const json_t *fn = json_object_get(c, "function");
                json_array_append_new(input, json_pack("{s:s,s:O,s:O,s:o}", "type", "function_call", "call_id",
                                                       json_object_get(c, "id"), "name", json_object_get(fn, "name"),
                                                       "arguments", args_string(json_object_get(fn, "arguments"))));
            }
        } else {
            json_array_append_new(input, json_pack("{s:s,s:s,s:[{s:s,s:o}]}", "type", "message", "role",
                                                   !strcmp(role, "user") ? "user" : "developer", "content", "type",
                                                   "input_text", "text", text));
        }
    }
    json_object_set_new(out, "input", input);
    if (shape && json_object_get(shape, "tools")) {
        copy_if(out, "tools", shape, "tools");
    } else {
        json_t *tools = json_array();
        size_t k;
        json_t *t;
        json_array_foreach(json_object_get(chat, "tools"), k, t) {
            const json_t *fn = json_object_get(t, "function");
            json_t *tool = json_pack("{s:s,s:O}", "type", "function", "name", json_object_get(fn, "name"));
            copy_if(tool, "description", fn, "description");
            copy_if(tool, "parameters", fn, "parameters");
            json_object_set_new(tool, "strict", json_false());
            json_array_append_new(tools, tool);
        }
        json_object_set_new(out, "tools", tools);
    }
    json_t *mt = json_object_get(chat, "max_completion_tokens");
    json_object_set(out, "max_output_tokens", mt ? mt : json_object_get(chat, "max_tokens"));
    copy_if(out, "temperature", chat, "temperature");
    json_object_set_new(out, "stream", json_true());
    json_object_set_new(out, "store", json_false());
    copy_if(out, "cache_salt", chat, "cache_salt");
    static const char *const from_shape[] = {"reasoning", "tool_choice", "parallel_tool_calls", "include",
                                             "prompt_cache_key"};
    for (size_t i = 0; shape && i < sizeof from_shape / sizeof *from_shape; i++) copy_if(out, from_shape[i], shape, from_shape[i]);
    return out;
}

const char *tern_replay_protocol_path(enum tern_replay_protocol p) {
    switch (p) {
    case TERN_REPLAY_MESSAGES: return "/v1/messages";
    case TERN_REPLAY_RESPONSES: return "/v1/responses";
    default: return "/v1/chat/completions";
    }
}

bool tern_replay_protocol_parse(const char *s, enum tern_replay_protocol *out) {
    if (!strcmp(s, "chat")) *out = TERN_REPLAY_CHAT;
    else if (!strcmp(s, "messages")) *out = TERN_REPLAY_MESSAGES;
    else if (!strcmp(s, "responses")) *out = TERN_REPLAY_RESPONSES;
    else return false;
    return true;
}

enum tern_status tern_replay_to_protocol(enum tern_replay_protocol p, const json_t *shape, struct tern_buf *body) {
    if (p == TERN_REPLAY_CHAT) return TERN_OK;
    json_t *chat = json_loadb(body->data ? body->data : "", body->len, 0, NULL);
    if (!json_is_object(chat)) {
        json_decref(chat);
        return tern_errorf(TERN_ERR_FORMAT, "replay: a turn's body is not a JSON object");
    }
    json_t *o = p == TERN_REPLAY_MESSAGES ? to_messages(chat, shape) : to_responses(chat, shape);
    json_decref(chat);
    /* JSON_PRESERVE_ORDER: the same bytes every time (and in the order written above) */
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!s) return tern_errorf(TERN_ERR_NOMEM, "replay: out of memory converting a body");
    tern_buf_clear(body);
    enum tern_status st = tern_buf_puts(body, s);
    free(s);
    return st;
}
