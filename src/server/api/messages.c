/* The Anthropic Messages API (Claude Code): its request to the one chat request, the one
 * event stream to its SSE events and message object (api.h).
 *
 * In: `system` (a string or text blocks) becomes the first system message; `messages`
 * keep their order — a system message inside them stays where it stands, a user turn's
 * tool_result blocks become tool messages, an assistant turn's thinking blocks its
 * reasoning_content and its tool_use blocks its tool_calls; tools become function
 * tools (server tools such as web search are skipped: this server cannot run them);
 * tool_choice any/tool are enforced by the tool-call grammar like required/named;
 * thinking and output_config.effort become the template's enable_thinking and
 * reasoning_effort. Every field not named here is accepted and ignored.
 *
 * Out: message_start when the request starts (so that pings may follow while the
 * prompt is read), then one content block at a time — thinking (closed with a
 * signature_delta), text, tool_use (its input as input_json_delta fragments) — then
 * message_delta with the stop reason and usage, and message_stop. Usage in Anthropic's
 * meaning: input_tokens excludes what was read from the cache, which is
 * cache_read_input_tokens (tern's cached tokens). */
#include "server/api/api-impl.h"

#include "util/hash.h"
#include "util/json-kind.h"
#include "util/mem.h"

#include <stdio.h>
#include <string.h>

/* ---- in ---------------------------------------------------------------------------- */

/* Claude Code's first system block: per-request billing metadata (its cch= field changes
 * every request), not an instruction. Kept, it would break the prompt's prefix on every
 * turn. */
static bool billing_block(const char *s) { return !strncmp(s, "x-anthropic-billing-header:", 27); }

static bool set_new(json_t *o, const char *k, json_t *v, struct srv_error *err) {
    if (v && !json_object_set_new(o, k, v)) return true;
    srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    return false;
}

static bool push(json_t *arr, json_t *v, struct srv_error *err) {
    if (v && !json_array_append_new(arr, v)) return true;
    srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    return false;
}

/* Text blocks (or a string) joined with "\n"; the billing block dropped. */
static json_t *system_text(const json_t *sys, struct srv_error *err) {
    if (json_is_string(sys)) return json_incref((json_t *)sys);
    if (!json_is_array(sys)) {
        srv_error_bad(err, "system", "'system' must be a string or an array of text blocks, got %s",
                      tern_json_kind(sys));
        return NULL;
    }
    json_t *kept = json_array();
    for (size_t i = 0; kept && i < json_array_size(sys); i++) {
        const json_t *b = json_array_get(sys, i);
        const json_t *t = json_object_get(b, "text");
        if (!json_is_string(t)) {
            srv_error_bad(err, "system", "'system[%zu]' must be a text block with a string 'text'", i);
            json_decref(kept);
            return NULL;
        }
        if (billing_block(json_string_value(t))) continue;
        json_array_append(kept, (json_t *)t);
    }
    json_t *s = kept ? api_text_of(kept) : NULL;
    json_decref(kept);
    if (!s) srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    return s;
}

static const char *block_type(const json_t *b) {
    const char *t = json_string_value(json_object_get(b, "type"));
    return t ? t : "";
}

/* A tool_result's content: a string, or blocks whose text is joined (an image inside a
 * tool result becomes a note: refusing it would end the agent's session). */
static json_t *tool_result_text(const json_t *b) {
    const json_t *c = json_object_get(b, "content");
    json_t *s;
    if (!c || json_is_null(c)) {
        s = json_string("");
    } else if (json_is_array(c)) {
        json_t *parts = json_array();
        for (size_t i = 0; parts && i < json_array_size(c); i++) {
            const json_t *p = json_array_get(c, i);
            if (!strcmp(block_type(p), "text")) json_array_append(parts, json_object_get(p, "text"));
            else if (!strcmp(block_type(p), "image")) json_array_append_new(parts, json_string("[image omitted: the model reads text only]"));
        }
        s = parts ? api_text_of(parts) : NULL;
        json_decref(parts);
    } else {
        s = api_text_of(c);
    }
    if (s && json_is_true(json_object_get(b, "is_error"))) {
        json_t *e = json_sprintf("Error: %s", json_string_value(s));
        json_decref(s);
        s = e;
    }
    return s;
}

static bool flush_user(json_t *out, json_t **parts, struct srv_error *err) {
    if (!*parts || !json_array_size(*parts)) return true;
    json_t *text = api_text_of(*parts);
    json_decref(*parts);
    *parts = NULL;
    return push(out, json_pack("{s:s,s:o*}", "role", "user", "content", text), err);
}

static bool user_turn(const json_t *content, size_t i, json_t *out, struct srv_error *err) {
    char param[64];
    if (json_is_string(content)) return push(out, json_pack("{s:s,s:O}", "role", "user", "content", content), err);
    json_t *parts = NULL;
    for (size_t k = 0; k < json_array_size(content); k++) {
        const json_t *b = json_array_get(content, k);
        const char *t = block_type(b);
        snprintf(param, sizeof param, "messages[%zu].content[%zu]", i, k);
        if (!strcmp(t, "text")) {
            const json_t *text = json_object_get(b, "text");
            if (!json_is_string(text)) {
                srv_error_bad(err, param, "'%s.text' must be a string", param);
                goto fail;
            }
            if (!parts && !(parts = json_array())) goto oom;
            if (json_array_append(parts, (json_t *)text)) goto oom;
        } else if (!strcmp(t, "tool_result")) {
            const json_t *id = json_object_get(b, "tool_use_id");
            if (!json_is_string(id)) {
                srv_error_bad(err, param, "'%s.tool_use_id' must be a string", param);
                goto fail;
            }
            if (!flush_user(out, &parts, err)) goto fail;
            json_t *text = tool_result_text(b);
            if (!push(out, json_pack("{s:s,s:O,s:o*}", "role", "tool", "tool_call_id", id, "content", text), err))
                goto fail;
        } else if (!strcmp(t, "image") || !strcmp(t, "document")) {
            srv_error_bad(err, param, "'%s' is an %s block; this server's model reads text only", param, t);
            goto fail;
        }
        /* anything else (search results, server tool results, thinking echoed in a user
         * turn) carries nothing the template renders: skipped */
    }
    if (!flush_user(out, &parts, err)) goto fail;
    return true;
oom:
    srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
fail:
    json_decref(parts);
    return false;
}

static bool assistant_turn(const json_t *content, size_t i, json_t *out, struct srv_error *err) {
    char param[64];
    if (json_is_string(content))
        return push(out, json_pack("{s:s,s:O}", "role", "assistant", "content", content), err);
    json_t *text = json_array(), *think = json_array(), *calls = json_array(), *m = NULL;
    if (!text || !think || !calls) goto oom;
    for (size_t k = 0; k < json_array_size(content); k++) {
        const json_t *b = json_array_get(content, k);
        const char *t = block_type(b);
        snprintf(param, sizeof param, "messages[%zu].content[%zu]", i, k);
        if (!strcmp(t, "text")) {
            if (!json_is_string(json_object_get(b, "text"))) {
                srv_error_bad(err, param, "'%s.text' must be a string", param);
                goto fail;
            }
            if (json_array_append(text, json_object_get(b, "text"))) goto oom;
        } else if (!strcmp(t, "thinking")) {
            const json_t *th = json_object_get(b, "thinking");
            if (json_is_string(th) && json_array_append(think, (json_t *)th)) goto oom;
        } else if (!strcmp(t, "tool_use")) {
            const json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
            const json_t *input = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name)) {
                srv_error_bad(err, param, "'%s' must have a string 'id' and 'name'", param);
                goto fail;
            }
            json_t *args = json_is_object(input) ? json_incref((json_t *)input) : json_object();
            if (!push(calls, json_pack("{s:O,s:s,s:{s:O,s:o*}}", "id", id, "type", "function", "function", "name",
                                       name, "arguments", args),
                      err))
                goto fail;
        }
        /* redacted_thinking (nothing to render) and server tool blocks: skipped */
    }
    m = json_pack("{s:s,s:o*}", "role", "assistant", "content", api_text_of(text));
    if (!m) goto oom;
    if (json_array_size(think) && !set_new(m, "reasoning_content", api_text_of(think), err)) goto fail;
    if (json_array_size(calls) && !set_new(m, "tool_calls", json_incref(calls), err)) goto fail;
    json_decref(text);
    json_decref(think);
    json_decref(calls);
    return push(out, m, err);
oom:
    srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
fail:
    json_decref(text);
    json_decref(think);
    json_decref(calls);
    json_decref(m);
    return false;
}

static json_t *convert_messages(const json_t *body, struct srv_error *err) {
    const json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs)) {
        srv_error_bad(err, "messages", "'messages' must be an array, got %s", msgs ? tern_json_kind(msgs) : "nothing");
        return NULL;
    }
    json_t *out = json_array();
    if (!out) return srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    const json_t *sys = json_object_get(body, "system");
    if (sys && !json_is_null(sys)) {
        json_t *s = system_text(sys, err);
        if (!s) goto fail;
        if (json_string_length(s) == 0) json_decref(s); /* only the billing block */
        else if (!push(out, json_pack("{s:s,s:o}", "role", "system", "content", s), err)) goto fail;
    }
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        char param[48];
        snprintf(param, sizeof param, "messages[%zu]", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *content = json_object_get(m, "content");
        if (!role) {
            srv_error_bad(err, param, "'%s.role' must be a string", param);
            goto fail;
        }
        if (!json_is_string(content) && !json_is_array(content)) {
            srv_error_bad(err, param, "'%s.content' must be a string or an array of content blocks, got %s", param,
                          content ? tern_json_kind(content) : "nothing");
            goto fail;
        }
        bool ok;
        if (!strcmp(role, "user")) {
            ok = user_turn(content, i, out, err);
        } else if (!strcmp(role, "assistant")) {
            ok = assistant_turn(content, i, out, err);
        } else if (!strcmp(role, "system")) {
            /* where it stands: hoisting it to the front would change the prompt's
             * prefix on every request that adds one */
            json_t *s = json_is_string(content) ? json_incref((json_t *)content) : system_text(content, err);
            ok = s && push(out, json_pack("{s:s,s:o}", "role", "system", "content", s), err);
        } else {
            srv_error_bad(err, param, "'%s.role' is '%.40s'; it must be user, assistant or system", param, role);
            goto fail;
        }
        if (!ok) goto fail;
    }
    if (json_array_size(out) == 0) {
        srv_error_bad(err, "messages", "'messages' must contain at least one message");
        goto fail;
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

static json_t *convert_tools(const json_t *tools, struct srv_error *err) {
    if (!json_is_array(tools)) {
        srv_error_bad(err, "tools", "'tools' must be an array, got %s", tern_json_kind(tools));
        return NULL;
    }
    json_t *out = json_array();
    for (size_t i = 0; out && i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        const char *type = json_string_value(json_object_get(t, "type"));
        /* server tools (web_search_*, bash_*, text_editor_*, ...) run at Anthropic's: skipped */
        if (type && strcmp(type, "custom")) continue;
        const json_t *name = json_object_get(t, "name");
        if (!json_is_string(name)) {
            srv_error_bad(err, "tools", "'tools[%zu].name' must be a string", i);
            json_decref(out);
            return NULL;
        }
        json_t *fn = json_pack("{s:O}", "name", name);
        const json_t *desc = json_object_get(t, "description");
        if (fn && json_is_string(desc)) json_object_set(fn, "description", (json_t *)desc);
        const json_t *schema = json_object_get(t, "input_schema");
        if (fn && json_is_object(schema)) json_object_set(fn, "parameters", (json_t *)schema);
        if (!push(out, json_pack("{s:s,s:o*}", "type", "function", "function", fn), err)) {
            json_decref(out);
            return NULL;
        }
    }
    if (!out) srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    return out;
}

/* tool_choice {type: auto | any | tool | none, name, disable_parallel_tool_use} */
static bool convert_tool_choice(const json_t *tc, json_t *chat, struct srv_error *err) {
    if (!tc || json_is_null(tc)) return true;
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!type) {
        srv_error_bad(err, "tool_choice", "'tool_choice' must be an object with a string 'type'");
        return false;
    }
    json_t *v;
    if (!strcmp(type, "auto")) v = json_string("auto");
    else if (!strcmp(type, "any")) v = json_string("required");
    else if (!strcmp(type, "none")) v = json_string("none");
    else if (!strcmp(type, "tool")) {
        const json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name)) {
            srv_error_bad(err, "tool_choice.name", "'tool_choice' of type tool needs a string 'name'");
            return false;
        }
        v = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name);
    } else {
        srv_error_bad(err, "tool_choice.type", "'tool_choice.type' is '%.40s'; it must be auto, any, tool or none",
                      type);
        return false;
    }
    if (!set_new(chat, "tool_choice", v, err)) return false;
    if (json_is_true(json_object_get(tc, "disable_parallel_tool_use")))
        return set_new(chat, "parallel_tool_calls", json_false(), err);
    return true;
}

/* The session id of metadata.user_id: a JSON string {"session_id": ...} (current Claude
 * Code), or "user_<hash>_account_<uuid>_session_<uuid>" (older ones); else the whole id. */
static char *session_of_user_id(const char *uid) {
    if (uid[0] == '{') {
        json_t *o = json_loads(uid, 0, NULL);
        const char *sid = json_string_value(json_object_get(o, "session_id"));
        char *r = sid && *sid ? tern_strdup(sid) : NULL;
        json_decref(o);
        if (r) return r;
    }
    const char *s = strstr(uid, "_session_");
    return tern_strdup(s && s[9] ? s + 9 : uid);
}

static bool copy_field(const json_t *from, const char *k, json_t *to, const char *as, struct srv_error *err) {
    const json_t *v = json_object_get(from, k);
    if (!v || json_is_null(v)) return true;
    return set_new(to, as, json_incref((json_t *)v), err);
}

json_t *api_messages_request(const json_t *body, bool count_only, struct srv_request *req, struct srv_error *err) {
    (void)count_only;
    json_t *chat = json_object();
    if (!chat) return srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    json_t *msgs = convert_messages(body, err);
    if (!msgs || !set_new(chat, "messages", msgs, err)) goto fail;
    const json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_null(tools)) {
        json_t *t = convert_tools(tools, err);
        if (!t || !set_new(chat, "tools", t, err)) goto fail;
    }
    if (!convert_tool_choice(json_object_get(body, "tool_choice"), chat, err)) goto fail;

    /* the reasoning switch: thinking {type: enabled | adaptive | disabled} and
     * output_config.effort, as the template's keywords; absent: the template's default */
    json_t *kw = json_object();
    if (!kw || !set_new(chat, "chat_template_kwargs", kw, err)) goto fail;
    const json_t *th = json_object_get(body, "thinking");
    const char *tt = json_string_value(json_object_get(th, "type"));
    if (tt && !set_new(kw, "enable_thinking", json_boolean(strcmp(tt, "disabled") != 0), err)) goto fail;
    const json_t *effort = json_object_get(json_object_get(body, "output_config"), "effort");
    if (json_is_string(effort) && !set_new(kw, "reasoning_effort", json_incref((json_t *)effort), err)) goto fail;

    static const char *const same[][2] = {
        {"model", "model"},           {"max_tokens", "max_tokens"}, {"temperature", "temperature"},
        {"top_p", "top_p"},           {"top_k", "top_k"},           {"stream", "stream"},
        {"stop_sequences", "stop"},   {"tern_forced_output", "tern_forced_output"},
        {"tern_forced_prefix", "tern_forced_prefix"}, {"spec", "spec"}, {"seed", "seed"},
        {"cache_salt", "cache_salt"},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(same); i++)
        if (!copy_field(body, same[i][0], chat, same[i][1], err)) goto fail;

    api_lane_of(json_object_get(chat, "messages"), json_object_get(chat, "tools"), req->lane);
    const json_t *md = json_object_get(body, "metadata");
    const char *uid = json_string_value(json_object_get(md, "user_id"));
    if (uid && *uid) {
        char *sid = session_of_user_id(uid);
        json_t *key = sid ? json_sprintf("%.200s#%s", sid, req->lane) : NULL;
        free(sid);
        if (!set_new(chat, "session_id", key, err)) goto fail;
    }
    return chat;
fail:
    json_decref(chat);
    return NULL;
}

/* ---- out --------------------------------------------------------------------------- */

const char *api_messages_stop_reason(const char *finish, const char *stop_seq) {
    if (!strcmp(finish, "tool_calls")) return "tool_use";
    if (!strcmp(finish, "length")) return "max_tokens";
    return stop_seq ? "stop_sequence" : "end_turn";
}

static json_t *usage_obj(const struct srv_usage *u, bool with_input) {
    json_t *o = json_pack("{s:I}", "output_tokens", (json_int_t)(u ? u->completion_tokens : 0));
    if (o && with_input && u) {
        json_object_set_new(o, "input_tokens", json_integer((json_int_t)u->prompt_tokens - u->cached_tokens));
        json_object_set_new(o, "cache_creation_input_tokens", json_integer(0));
        json_object_set_new(o, "cache_read_input_tokens", json_integer(u->cached_tokens));
    }
    return o;
}

/* The signature of a thinking block: clients send it back and never read it; a hash of
 * the text, so the same thinking always carries the same signature. */
static json_t *signature_of(const char *s, size_t n) {
    return json_sprintf("tern-%016llx", (unsigned long long)tern_hash64(s ? s : "", n));
}

enum tern_status msg_stream_start(struct api_out *a, const struct srv_usage *u, struct tern_buf *out) {
    json_t *usage = usage_obj(u, true);
    if (usage) json_object_set_new(usage, "output_tokens", json_integer(0));
    json_t *msg = json_pack("{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:o*}", "id", a->ctx->id, "type", "message", "role",
                            "assistant", "model", a->ctx->model, "content", "stop_reason", "stop_sequence", "usage",
                            usage);
    return api_sse_event(out, "message_start", json_pack("{s:s,s:o*}", "type", "message_start", "message", msg));
}

static enum tern_status block_close(struct api_out *a, struct tern_buf *out) {
    enum tern_status st = TERN_OK;
    if (a->open == API_OPEN_NONE) return st;
    if (a->open == API_OPEN_THINK)
        st = api_sse_event(out, "content_block_delta",
                           json_pack("{s:s,s:I,s:{s:s,s:o*}}", "type", "content_block_delta", "index",
                                     (json_int_t)a->index, "delta", "type", "signature_delta", "signature",
                                     signature_of(a->acc.data, a->acc.len)));
    if (!st)
        st = api_sse_event(out, "content_block_stop",
                           json_pack("{s:s,s:I}", "type", "content_block_stop", "index", (json_int_t)a->index));
    a->open = API_OPEN_NONE;
    tern_buf_clear(&a->acc);
    return st;
}

static enum tern_status block_open(struct api_out *a, enum api_open kind, json_t *block, struct tern_buf *out) {
    enum tern_status st = block_close(a, out);
    if (st) {
        json_decref(block);
        return st;
    }
    a->index = a->n_opened++;
    a->open = kind;
    return api_sse_event(out, "content_block_start",
                         json_pack("{s:s,s:I,s:o*}", "type", "content_block_start", "index", (json_int_t)a->index,
                                   "content_block", block));
}

static enum tern_status block_delta(struct api_out *a, const char *dtype, const char *field, const struct tern_buf *b,
                                    struct tern_buf *out) {
    enum tern_status st = tern_buf_append(&a->acc, b->data, b->len);
    if (st) return st;
    return api_sse_event(out, "content_block_delta",
                         json_pack("{s:s,s:I,s:{s:s,s:o*}}", "type", "content_block_delta", "index",
                                   (json_int_t)a->index, "delta", "type", dtype, field, api_str_n(b->data, b->len)));
}

enum tern_status msg_stream_delta(struct api_out *a, const struct reply_delta *d, const struct reply_parser *p,
                                  struct tern_buf *out) {
    enum tern_status st = TERN_OK;
    if (d->reasoning.len) {
        if (a->open != API_OPEN_THINK)
            st = block_open(a, API_OPEN_THINK, json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "",
                                                         "signature", ""), out);
        if (!st) st = block_delta(a, "thinking_delta", "thinking", &d->reasoning, out);
    }
    if (!st && d->content.len) {
        if (a->open != API_OPEN_TEXT)
            st = block_open(a, API_OPEN_TEXT, json_pack("{s:s,s:s}", "type", "text", "text", ""), out);
        if (!st) st = block_delta(a, "text_delta", "text", &d->content, out);
    }
    for (size_t i = 0; !st && i < d->n_calls; i++) {
        const struct reply_delta_call *dc = &d->calls[i];
        if (dc->index >= p->n_calls) continue;
        if (dc->begin || a->open != API_OPEN_CALL || a->call != dc->index) {
            const struct reply_tool_call *c = &p->calls[dc->index];
            st = block_open(a, API_OPEN_CALL, json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", c->id,
                                                        "name", c->name ? c->name : "", "input"), out);
            a->call = dc->index;
        }
        if (!st && dc->args.len) st = block_delta(a, "input_json_delta", "partial_json", &dc->args, out);
    }
    return st;
}

enum tern_status msg_stream_end(struct api_out *a, const struct reply_parser *p, const char *finish,
                                const char *stop_seq, const struct srv_usage *u, struct tern_buf *out) {
    (void)p;
    enum tern_status st = block_close(a, out);
    if (st) return st;
    json_t *delta = json_pack("{s:s,s:o}", "stop_reason", api_messages_stop_reason(finish, stop_seq), "stop_sequence",
                              stop_seq ? json_string(stop_seq) : json_null());
    st = api_sse_event(out, "message_delta",
                       json_pack("{s:s,s:o*,s:o*}", "type", "message_delta", "delta", delta, "usage",
                                 usage_obj(u, true)));
    if (!st) st = api_sse_event(out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
    return st;
}

/* Anthropic's error types by HTTP status. */
static const char *error_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status < 500 ? "invalid_request_error" : "api_error";
    }
}

json_t *msg_error_object(const struct srv_error *e) {
    /* Claude Code compacts the conversation when a 400 says "prompt is too long" */
    char msg[700];
    if (e->code && !strcmp(e->code, "context_length_exceeded")) snprintf(msg, sizeof msg, "prompt is too long: %s",
                                                                         e->message);
    else snprintf(msg, sizeof msg, "%s", e->message);
    return json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type", error_type(e->status), "message", msg);
}

enum tern_status msg_stream_error(struct api_out *a, const struct srv_error *e, struct tern_buf *out) {
    (void)a;
    return api_sse_event(out, "error", msg_error_object(e));
}

json_t *msg_response(struct api_out *a, const struct reply_parser *p, const char *finish, const char *stop_seq,
                     const struct srv_usage *u) {
    json_t *content = json_array();
    if (!content) return NULL;
    if (p->reasoning.len)
        json_array_append_new(content, json_pack("{s:s,s:o*,s:o*}", "type", "thinking", "thinking",
                                                 api_str_n(p->reasoning.data, p->reasoning.len), "signature",
                                                 signature_of(p->reasoning.data, p->reasoning.len)));
    if (p->content.len)
        json_array_append_new(content,
                              json_pack("{s:s,s:o*}", "type", "text", "text", api_str_n(p->content.data, p->content.len)));
    for (size_t i = 0; i < p->n_calls; i++) {
        const struct reply_tool_call *c = &p->calls[i];
        json_array_append_new(content, json_pack("{s:s,s:s,s:s,s:o*}", "type", "tool_use", "id", c->id, "name",
                                                 c->name ? c->name : "", "input",
                                                 api_parse_args(c->args.data, c->args.len)));
    }
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:s,s:o,s:o*}", "id", a->ctx->id, "type", "message", "role", "assistant",
                     "model", a->ctx->model, "content", content, "stop_reason",
                     api_messages_stop_reason(finish, stop_seq), "stop_sequence",
                     stop_seq ? json_string(stop_seq) : json_null(), "usage", usage_obj(u, true));
}
