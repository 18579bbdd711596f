/* The OpenAI Responses API (Codex): its request to the one chat request, the one event
 * stream to its SSE events and response object (api.h).
 *
 * In: `instructions` become the first system message; `input` (a string, or items)
 * keeps its order: messages (a developer message is a system message here: the chat
 * templates of the models served know no developer role and would drop it), reasoning
 * items (their text becomes the next assistant turn's reasoning_content, which the
 * model's template keeps or drops as it wants), function_call and custom_tool_call
 * items (the tool calls of the assistant turn before them, or of a new one),
 * function_call_output and custom_tool_call_output (tool messages). Tools: `function`
 * as it is; `custom` (free-form input) as a function of one string argument "input",
 * answered as a custom_tool_call; `namespace` flattened to "<namespace>.<name>" and
 * split again in the answer; tool types this server cannot run (web_search,
 * image_generation, local_shell, ...) are skipped, never refused: a 400 ends a Codex
 * session. text.format json_schema / json_object go to the grammars; reasoning.effort
 * to the template (none and minimal switch thinking off). Nothing is stored: a
 * previous_response_id is refused with a 400 that says so.
 *
 * Out: response.created and response.in_progress when the request starts; one output
 * item at a time — reasoning (reasoning_text deltas), message (an output_text part),
 * function_call (argument deltas) or custom_tool_call — each with its added/done events,
 * the done item complete; then response.completed (or response.incomplete at
 * max_output_tokens) with the whole response and its usage. Every event carries its
 * sequence_number. */
#include "server/api/api-impl.h"

#include "util/json-kind.h"
#include "util/mem.h"

#include <stdio.h>
#include <string.h>

/* ---- in ---------------------------------------------------------------------------- */

static bool oom(struct srv_error *err) {
    srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    return false;
}

static bool set_new(json_t *o, const char *k, json_t *v, struct srv_error *err) {
    return v && !json_object_set_new(o, k, v) ? true : oom(err);
}

static bool push(json_t *arr, json_t *v, struct srv_error *err) {
    return v && !json_array_append_new(arr, v) ? true : oom(err);
}

static const char *type_of(const json_t *o) {
    const char *t = json_string_value(json_object_get(o, "type"));
    return t ? t : "";
}

/* A message's content: a string, or parts whose text is joined with "\n". */
static json_t *content_text(const json_t *c, const char *where, struct srv_error *err) {
    if (json_is_string(c)) return json_incref((json_t *)c);
    if (!json_is_array(c)) {
        srv_error_bad(err, where, "'%s.content' must be a string or an array of parts, got %s", where,
                      c ? tern_json_kind(c) : "nothing");
        return NULL;
    }
    json_t *parts = json_array();
    if (!parts) return oom(err), NULL;
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *p = json_array_get(c, k);
        const char *t = type_of(p);
        const json_t *text = json_object_get(p, !strcmp(t, "refusal") ? "refusal" : "text");
        if (!strncmp(t, "input_image", 11) || !strcmp(t, "input_file") || !strcmp(t, "input_audio")) {
            char param[96];
            snprintf(param, sizeof param, "%s.content[%zu]", where, k);
            srv_error_bad(err, param, "'%s' is an %s part; this server's model reads text only", param, t);
            json_decref(parts);
            return NULL;
        }
        if (json_is_string(text) && json_array_append(parts, (json_t *)text)) {
            json_decref(parts);
            return oom(err), NULL;
        }
    }
    json_t *s = api_text_of(parts);
    json_decref(parts);
    if (!s) oom(err);
    return s;
}

/* The text of a reasoning item: its reasoning_text content, else its summary. */
static json_t *reasoning_text(const json_t *item) {
    const json_t *c = json_object_get(item, "content");
    json_t *s = json_array_size(c) ? api_text_of(c) : NULL;
    if (s && json_string_length(s)) return s;
    json_decref(s);
    return api_text_of(json_object_get(item, "summary"));
}

/* "<namespace>.<name>" or the name. */
static json_t *flat_name(const json_t *ns, const json_t *name) {
    if (json_is_string(ns) && json_string_length(ns))
        return json_sprintf("%s.%s", json_string_value(ns), json_string_value(name));
    return json_incref((json_t *)name);
}

struct conv {
    json_t *out;                 /* chat messages */
    json_t *asst;                /* the last message when it is an assistant turn (borrowed) */
    json_t *reasoning;           /* reasoning text waiting for the next assistant turn */
};

static bool conv_assistant(struct conv *c, json_t *content, struct srv_error *err) {
    json_t *m = json_pack("{s:s,s:o*}", "role", "assistant", "content", content ? content : json_string(""));
    if (!m) return oom(err);
    if (c->reasoning) {
        json_object_set_new(m, "reasoning_content", c->reasoning);
        c->reasoning = NULL;
    }
    if (!push(c->out, m, err)) return false;
    c->asst = m;
    return true;
}

static bool conv_call(struct conv *c, json_t *id, json_t *name, json_t *args, struct srv_error *err) {
    json_t *call = json_pack("{s:o*,s:s,s:{s:o*,s:o*}}", "id", id, "type", "function", "function", "name", name,
                             "arguments", args);
    if (!call) return oom(err);
    if (!c->asst && !conv_assistant(c, NULL, err)) {
        json_decref(call);
        return false;
    }
    json_t *calls = json_object_get(c->asst, "tool_calls");
    if (!calls) {
        calls = json_array();
        if (!calls || json_object_set_new(c->asst, "tool_calls", calls)) return json_decref(call), oom(err);
    }
    return push(calls, call, err);
}

static bool conv_item(struct conv *c, const json_t *it, size_t i, struct srv_error *err) {
    char where[48];
    snprintf(where, sizeof where, "input[%zu]", i);
    if (!json_is_object(it)) {
        srv_error_bad(err, where, "'%s' must be an object, got %s", where, tern_json_kind(it));
        return false;
    }
    const char *t = type_of(it);
    const char *role = json_string_value(json_object_get(it, "role"));
    if (!strcmp(t, "message") || (!*t && role)) {
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                      strcmp(role, "developer"))) {
            srv_error_bad(err, where, "'%s.role' must be user, assistant, system or developer", where);
            return false;
        }
        json_t *text = content_text(json_object_get(it, "content"), where, err);
        if (!text) return false;
        if (!strcmp(role, "assistant")) return conv_assistant(c, text, err);
        c->asst = NULL;
        return push(c->out, json_pack("{s:s,s:o}", "role", !strcmp(role, "user") ? "user" : "system", "content", text),
                    err);
    }
    if (!strcmp(t, "reasoning")) {
        json_t *text = reasoning_text(it);
        if (!text) return oom(err);
        if (!c->reasoning) {
            c->reasoning = text;
            return true;
        }
        json_t *joined = json_sprintf("%s\n%s", json_string_value(c->reasoning), json_string_value(text));
        json_decref(text);
        json_decref(c->reasoning);
        c->reasoning = joined;
        return joined ? true : oom(err);
    }
    if (!strcmp(t, "function_call") || !strcmp(t, "custom_tool_call")) {
        const json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
        if (!json_is_string(id) || !json_is_string(name)) {
            srv_error_bad(err, where, "'%s' must have a string 'call_id' and 'name'", where);
            return false;
        }
        json_t *args;
        if (!strcmp(t, "custom_tool_call")) {
            const json_t *input = json_object_get(it, "input");
            args = json_pack("{s:o*}", "input", json_is_string(input) ? json_incref((json_t *)input) : json_string(""));
        } else {
            const json_t *a = json_object_get(it, "arguments");
            args = json_is_string(a) ? json_incref((json_t *)a) : json_string("{}");
        }
        return conv_call(c, json_incref((json_t *)id), flat_name(json_object_get(it, "namespace"), name), args, err);
    }
    if (!strcmp(t, "function_call_output") || !strcmp(t, "custom_tool_call_output")) {
        const json_t *id = json_object_get(it, "call_id");
        if (!json_is_string(id)) {
            srv_error_bad(err, where, "'%s.call_id' must be a string", where);
            return false;
        }
        const json_t *o = json_object_get(it, "output");
        json_t *text = json_is_string(o) ? json_incref((json_t *)o) : json_is_array(o) ? api_text_of(o) : json_string("");
        c->asst = NULL;
        return push(c->out, json_pack("{s:s,s:O,s:o*}", "role", "tool", "tool_call_id", id, "content", text), err);
    }
    /* item references, web search or shell calls of OpenAI's own tools: nothing this
     * server's templates can render, skipped */
    return true;
}

static json_t *convert_input(const json_t *body, struct srv_error *err) {
    struct conv c = {.out = json_array()};
    if (!c.out) return oom(err), NULL;
    const json_t *ins = json_object_get(body, "instructions");
    if (json_is_string(ins) && json_string_length(ins) &&
        !push(c.out, json_pack("{s:s,s:O}", "role", "system", "content", ins), err))
        goto fail;
    const json_t *in = json_object_get(body, "input");
    if (json_is_string(in)) {
        if (!push(c.out, json_pack("{s:s,s:O}", "role", "user", "content", in), err)) goto fail;
    } else if (json_is_array(in)) {
        for (size_t i = 0; i < json_array_size(in); i++)
            if (!conv_item(&c, json_array_get(in, i), i, err)) goto fail;
    } else if (in && !json_is_null(in)) {
        srv_error_bad(err, "input", "'input' must be a string or an array of items, got %s", tern_json_kind(in));
        goto fail;
    }
    json_decref(c.reasoning);
    if (json_array_size(c.out) == 0) {
        srv_error_bad(err, "input", "'input' is required (a string or an array of items)");
        json_decref(c.out);
        return NULL;
    }
    return c.out;
fail:
    json_decref(c.reasoning);
    json_decref(c.out);
    return NULL;
}

/* One tool of the request into tools (chat) and map (model-facing name -> kind). */
static bool convert_tool(const json_t *t, const json_t *ns, json_t *tools, json_t *map, struct srv_error *err) {
    const char *type = type_of(t);
    bool custom = !strcmp(type, "custom");
    if (strcmp(type, "function") && !custom) return true;
    const json_t *name = json_object_get(t, "name");
    if (!json_is_string(name)) {
        srv_error_bad(err, "tools", "a tool of type %s needs a string 'name'", type);
        return false;
    }
    json_t *flat = flat_name(ns, name);
    json_t *fn = flat ? json_pack("{s:O}", "name", flat) : NULL;
    if (!fn) return json_decref(flat), oom(err);
    const json_t *desc = json_object_get(t, "description");
    if (json_is_string(desc)) json_object_set(fn, "description", (json_t *)desc);
    if (custom) {
        json_object_set_new(fn, "parameters",
                            json_pack("{s:s,s:{s:{s:s,s:s}},s:[s]}", "type", "object", "properties", "input", "type",
                                      "string", "description", "the tool's free-form input", "required", "input"));
    } else {
        const json_t *params = json_object_get(t, "parameters");
        if (json_is_object(params)) json_object_set(fn, "parameters", (json_t *)params);
    }
    json_t *entry = json_pack("{s:s,s:O,s:O?}", "kind", custom ? "custom" : "function", "name", name, "namespace",
                              json_is_string(ns) ? ns : NULL);
    bool ok = entry && !json_object_set_new(map, json_string_value(flat), entry);
    json_decref(flat);
    if (!ok) return json_decref(fn), oom(err);
    return push(tools, json_pack("{s:s,s:o}", "type", "function", "function", fn), err);
}

static bool convert_tools(const json_t *tools, json_t *chat, struct srv_request *req, struct srv_error *err) {
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) {
        srv_error_bad(err, "tools", "'tools' must be an array, got %s", tern_json_kind(tools));
        return false;
    }
    json_t *out = json_array(), *map = json_object();
    if (!out || !map) goto oom;
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        if (!strcmp(type_of(t), "namespace")) {
            const json_t *inner = json_object_get(t, "tools"), *ns = json_object_get(t, "name");
            for (size_t k = 0; json_is_string(ns) && k < json_array_size(inner); k++)
                if (!convert_tool(json_array_get(inner, k), ns, out, map, err)) goto fail;
        } else if (!convert_tool(t, NULL, out, map, err)) {
            goto fail;
        }
    }
    req->api_tools = map;
    return set_new(chat, "tools", out, err);
oom:
    oom(err);
fail:
    json_decref(out);
    json_decref(map);
    return false;
}

static bool convert_tool_choice(const json_t *tc, json_t *chat, struct srv_error *err) {
    if (!tc || json_is_null(tc)) return true;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (strcmp(s, "auto") && strcmp(s, "none") && strcmp(s, "required")) {
            srv_error_bad(err, "tool_choice", "'tool_choice' is '%.40s'; it must be auto, none, required or an object",
                          s);
            return false;
        }
        return set_new(chat, "tool_choice", json_incref((json_t *)tc), err);
    }
    const char *t = type_of(tc);
    if (!strcmp(t, "function") || !strcmp(t, "custom")) {
        const json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name)) {
            srv_error_bad(err, "tool_choice.name", "'tool_choice' of type %s needs a string 'name'", t);
            return false;
        }
        return set_new(chat, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name),
                       err);
    }
    if (!strcmp(t, "allowed_tools")) {
        const json_t *mode = json_object_get(tc, "mode");
        if (json_is_string(mode) && !strcmp(json_string_value(mode), "required"))
            return set_new(chat, "tool_choice", json_string("required"), err);
    }
    return true; /* a hosted tool's choice (web_search, ...): auto */
}

/* text.format -> response_format */
static bool convert_format(const json_t *text, json_t *chat, struct srv_error *err) {
    const json_t *f = json_object_get(text, "format");
    const char *t = type_of(f);
    if (!strcmp(t, "json_object")) return set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"), err);
    if (strcmp(t, "json_schema")) return true;
    const json_t *schema = json_object_get(f, "schema");
    if (!json_is_object(schema)) {
        srv_error_bad(err, "text.format.schema", "'text.format.schema' must be an object");
        return false;
    }
    const json_t *name = json_object_get(f, "name");
    return set_new(chat, "response_format",
                   json_pack("{s:s,s:{s:o*,s:O,s:b}}", "type", "json_schema", "json_schema", "name",
                             json_is_string(name) ? json_incref((json_t *)name) : json_string("response"), "schema",
                             schema, "strict",
                             json_is_true(json_object_get(f, "strict"))),
                   err);
}

json_t *api_responses_request(const json_t *body, struct srv_request *req, struct srv_error *err) {
    const json_t *prev = json_object_get(body, "previous_response_id");
    if (prev && !json_is_null(prev)) {
        srv_error_bad(err, "previous_response_id",
                      "'previous_response_id' is not supported: this server stores no responses (as with store: "
                      "false); send the whole conversation in 'input'");
        return NULL;
    }
    json_t *chat = json_object();
    if (!chat) return oom(err), NULL;
    json_t *msgs = convert_input(body, err);
    if (!msgs || !set_new(chat, "messages", msgs, err)) goto fail;
    if (!convert_tools(json_object_get(body, "tools"), chat, req, err)) goto fail;
    if (!convert_tool_choice(json_object_get(body, "tool_choice"), chat, err)) goto fail;
    if (!convert_format(json_object_get(body, "text"), chat, err)) goto fail;

    json_t *kw = json_object();
    if (!set_new(chat, "chat_template_kwargs", kw, err)) goto fail;
    const json_t *effort = json_object_get(json_object_get(body, "reasoning"), "effort");
    if (json_is_string(effort)) {
        const char *e = json_string_value(effort);
        if (!set_new(kw, "reasoning_effort", json_incref((json_t *)effort), err)) goto fail;
        if (!set_new(kw, "enable_thinking", json_boolean(strcmp(e, "none") && strcmp(e, "minimal")), err)) goto fail;
    }

    static const char *const same[][2] = {
        {"model", "model"},     {"max_output_tokens", "max_tokens"},       {"temperature", "temperature"},
        {"top_p", "top_p"},     {"stream", "stream"},                      {"parallel_tool_calls", "parallel_tool_calls"},
        {"tern_forced_output", "tern_forced_output"}, {"tern_forced_prefix", "tern_forced_prefix"},
        {"spec", "spec"},       {"seed", "seed"},           {"cache_salt", "cache_salt"},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(same); i++) {
        const json_t *v = json_object_get(body, same[i][0]);
        if (v && !json_is_null(v) && !set_new(chat, same[i][1], json_incref((json_t *)v), err)) goto fail;
    }

    api_lane_of(json_object_get(chat, "messages"), json_object_get(chat, "tools"), req->lane);
    const char *key = json_string_value(json_object_get(body, "prompt_cache_key"));
    if (key && *key && !set_new(chat, "session_id", json_sprintf("%.200s#%s", key, req->lane), err)) goto fail;

    /* what the response object repeats */
    req->api_echo = json_object();
    if (!req->api_echo) goto nomem;
    static const char *const echo[] = {"instructions", "tools", "tool_choice", "temperature", "top_p",
                                       "max_output_tokens", "parallel_tool_calls", "reasoning", "text", "metadata"};
    for (size_t i = 0; i < TERN_ARRAY_LEN(echo); i++) {
        const json_t *v = json_object_get(body, echo[i]);
        if (v && json_object_set(req->api_echo, echo[i], (json_t *)v)) goto nomem;
    }
    return chat;
nomem:
    oom(err);
fail:
    json_decref(chat);
    return NULL;
}

/* ---- out --------------------------------------------------------------------------- */

static json_t *echo(const struct api_out *a, const char *k, json_t *dflt) {
    const json_t *v = a->req ? json_object_get(a->req->api_echo, k) : NULL;
    if (v) {
        json_decref(dflt);
        return json_incref((json_t *)v);
    }
    return dflt;
}

static json_t *usage_obj(const struct srv_usage *u) {
    return json_pack("{s:I,s:{s:I},s:I,s:{s:I},s:I}", "input_tokens", (json_int_t)u->prompt_tokens,
                     "input_tokens_details", "cached_tokens", (json_int_t)u->cached_tokens, "output_tokens",
                     (json_int_t)u->completion_tokens, "output_tokens_details", "reasoning_tokens",
                     (json_int_t)u->reasoning_tokens, "total_tokens",
                     (json_int_t)u->prompt_tokens + (json_int_t)u->completion_tokens);
}

/* The response object; output and usage are consumed (NULL: [] and null). */
static json_t *resp_object(const struct api_out *a, const char *status, json_t *output, json_t *usage, json_t *error,
                           const char *incomplete) {
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", a->ctx->id, "object", "response", "created_at",
                          (json_int_t)a->ctx->created, "status", status, "model", a->ctx->model);
    if (!o) {
        json_decref(output);
        json_decref(usage);
        json_decref(error);
        return NULL;
    }
    json_object_set_new(o, "output", output ? output : json_array());
    json_object_set_new(o, "usage", usage ? usage : json_null());
    json_object_set_new(o, "error", error ? error : json_null());
    json_object_set_new(o, "incomplete_details", incomplete ? json_pack("{s:s}", "reason", incomplete) : json_null());
    json_object_set_new(o, "previous_response_id", json_null());
    json_object_set_new(o, "store", json_false());
    json_object_set_new(o, "truncation", json_string("disabled"));
    json_object_set_new(o, "instructions", echo(a, "instructions", json_null()));
    json_object_set_new(o, "tools", echo(a, "tools", json_array()));
    json_object_set_new(o, "tool_choice", echo(a, "tool_choice", json_string("auto")));
    json_object_set_new(o, "parallel_tool_calls", echo(a, "parallel_tool_calls", json_true()));
    json_object_set_new(o, "temperature", echo(a, "temperature", json_null()));
    json_object_set_new(o, "top_p", echo(a, "top_p", json_null()));
    json_object_set_new(o, "max_output_tokens", echo(a, "max_output_tokens", json_null()));
    json_object_set_new(o, "reasoning", echo(a, "reasoning", json_pack("{s:n,s:n}", "effort", "summary")));
    json_object_set_new(o, "text", echo(a, "text", json_pack("{s:{s:s}}", "format", "type", "text")));
    json_object_set_new(o, "metadata", echo(a, "metadata", json_object()));
    return o;
}

/* The id of the next output item: "<prefix>_<the response id's tail>_<n>". */
static void next_item_id(struct api_out *a, const char *prefix) {
    const char *tail = strncmp(a->ctx->id, "resp_", 5) ? a->ctx->id : a->ctx->id + 5;
    snprintf(a->item_id, sizeof a->item_id, "%s_%s_%u", prefix, tail, a->n_opened);
}

static json_t *item_reasoning(const char *id, const char *text, size_t n, const char *status) {
    return json_pack("{s:s,s:s,s:[],s:[{s:s,s:o*}],s:s}", "id", id, "type", "reasoning", "summary", "content", "type",
                     "reasoning_text", "text", api_str_n(text, n), "status", status);
}

static json_t *item_message(const char *id, const char *text, size_t n, const char *status) {
    json_t *content = json_array();
    if (content && status[0] == 'c')
        json_array_append_new(content, json_pack("{s:s,s:o*,s:[],s:[]}", "type", "output_text", "text",
                                                 api_str_n(text, n), "annotations", "logprobs"));
    return json_pack("{s:s,s:s,s:s,s:s,s:o*}", "id", id, "type", "message", "role", "assistant", "status", status,
                     "content", content);
}

/* How a model-facing tool name is answered: kind and the client's own name. */
static const json_t *tool_entry(const struct api_out *a, const char *name) {
    return a->req && name ? json_object_get(a->req->api_tools, name) : NULL;
}

/* A call as a function_call or a custom_tool_call item; args: its argument text so
 * far (complete when status is "completed"). */
static json_t *item_call(const struct api_out *a, const char *id, const struct reply_tool_call *c, const char *args,
                         size_t n, const char *status) {
    const json_t *e = tool_entry(a, c->name);
    const char *kind = json_string_value(json_object_get(e, "kind"));
    json_t *name = e ? json_incref(json_object_get(e, "name")) : json_string(c->name ? c->name : "");
    if (kind && !strcmp(kind, "custom")) {
        json_t *input = NULL;
        if (status[0] == 'c') {
            json_t *o = api_parse_args(args, n);
            const json_t *in = json_object_get(o, "input");
            input = json_is_string(in) ? json_incref((json_t *)in) : api_str_n(args, n);
            json_decref(o);
        }
        return json_pack("{s:s,s:s,s:s,s:o*,s:o*,s:s}", "id", id, "type", "custom_tool_call", "call_id", c->id, "name",
                         name, "input", input ? input : json_string(""), "status", status);
    }
    json_t *item = json_pack("{s:s,s:s,s:s,s:o*,s:o*,s:s}", "id", id, "type", "function_call", "call_id", c->id,
                             "name", name, "arguments", api_str_n(args, n), "status", status);
    const json_t *ns = json_object_get(e, "namespace");
    if (item && json_is_string(ns)) json_object_set(item, "namespace", (json_t *)ns);
    return item;
}

static bool call_is_custom(const struct api_out *a, const struct reply_tool_call *c) {
    const char *kind = json_string_value(json_object_get(tool_entry(a, c->name), "kind"));
    return kind && !strcmp(kind, "custom");
}

/* One event: its type and sequence_number added to data. */
static enum tern_status ev(struct api_out *a, struct tern_buf *out, const char *type, json_t *data) {
    if (!data) return TERN_ERR_NOMEM;
    json_object_set_new(data, "type", json_string(type));
    json_object_set_new(data, "sequence_number", json_integer((json_int_t)a->seq++));
    return api_sse_event(out, type, data);
}

enum tern_status rsp_stream_start(struct api_out *a, struct tern_buf *out) {
    enum tern_status st = ev(a, out, "response.created",
                             json_pack("{s:o*}", "response", resp_object(a, "in_progress", NULL, NULL, NULL, NULL)));
    if (!st)
        st = ev(a, out, "response.in_progress",
                json_pack("{s:o*}", "response", resp_object(a, "in_progress", NULL, NULL, NULL, NULL)));
    return st;
}

static enum tern_status item_done(struct api_out *a, json_t *item, struct tern_buf *out) {
    if (!item) return TERN_ERR_NOMEM;
    if (!a->items && !(a->items = json_array())) {
        json_decref(item);
        return TERN_ERR_NOMEM;
    }
    json_array_append(a->items, item);
    return ev(a, out, "response.output_item.done", json_pack("{s:I,s:o}", "output_index", (json_int_t)a->index, "item", item));
}

static enum tern_status item_close(struct api_out *a, const struct reply_parser *p, struct tern_buf *out) {
    enum tern_status st = TERN_OK;
    const char *id = a->item_id;
    const json_int_t oi = a->index;
    const char *t = a->acc.data ? a->acc.data : "";
    const size_t n = a->acc.len;
    switch (a->open) {
    case API_OPEN_NONE: return TERN_OK;
    case API_OPEN_THINK:
        st = ev(a, out, "response.reasoning_text.done",
                json_pack("{s:s,s:I,s:i,s:o*}", "item_id", id, "output_index", oi, "content_index", 0, "text",
                          api_str_n(t, n)));
        if (!st) st = item_done(a, item_reasoning(id, t, n, "completed"), out);
        break;
    case API_OPEN_TEXT:
        st = ev(a, out, "response.output_text.done",
                json_pack("{s:s,s:I,s:i,s:o*,s:[]}", "item_id", id, "output_index", oi, "content_index", 0, "text",
                          api_str_n(t, n), "logprobs"));
        if (!st)
            st = ev(a, out, "response.content_part.done",
                    json_pack("{s:s,s:I,s:i,s:{s:s,s:o*,s:[]}}", "item_id", id, "output_index", oi, "content_index", 0,
                              "part", "type", "output_text", "text", api_str_n(t, n), "annotations"));
        if (!st) st = item_done(a, item_message(id, t, n, "completed"), out);
        break;
    case API_OPEN_CALL: {
        const struct reply_tool_call *c = &p->calls[a->call];
        json_t *item = item_call(a, id, c, t, n, "completed");
        if (!item) return TERN_ERR_NOMEM;
        if (call_is_custom(a, c))
            st = ev(a, out, "response.custom_tool_call_input.done",
                    json_pack("{s:s,s:I,s:O}", "item_id", id, "output_index", oi, "input", json_object_get(item, "input")));
        else
            st = ev(a, out, "response.function_call_arguments.done",
                    json_pack("{s:s,s:I,s:O,s:o*}", "item_id", id, "output_index", oi, "name",
                              json_object_get(item, "name"), "arguments", api_str_n(t, n)));
        if (!st) st = item_done(a, item, out);
        else json_decref(item);
        break;
    }
    }
    a->open = API_OPEN_NONE;
    tern_buf_clear(&a->acc);
    return st;
}

static enum tern_status item_open(struct api_out *a, const struct reply_parser *p, enum api_open kind,
                                  struct tern_buf *out) {
    enum tern_status st = item_close(a, p, out);
    if (st) return st;
    next_item_id(a, kind == API_OPEN_THINK                    ? "rs"
                    : kind == API_OPEN_TEXT                   ? "msg"
                    : call_is_custom(a, &p->calls[a->call]) ? "ctc"
                                                              : "fc");
    a->index = a->n_opened++;
    a->open = kind;
    json_t *item = kind == API_OPEN_THINK  ? item_reasoning(a->item_id, "", 0, "in_progress")
                   : kind == API_OPEN_TEXT ? item_message(a->item_id, "", 0, "in_progress")
                                           : item_call(a, a->item_id, &p->calls[a->call], "", 0, "in_progress");
    if (item && kind == API_OPEN_THINK) json_object_set_new(item, "content", json_array());
    st = ev(a, out, "response.output_item.added",
            json_pack("{s:I,s:o*}", "output_index", (json_int_t)a->index, "item", item));
    if (!st && kind == API_OPEN_TEXT)
        st = ev(a, out, "response.content_part.added",
                json_pack("{s:s,s:I,s:i,s:{s:s,s:s,s:[]}}", "item_id", a->item_id, "output_index", (json_int_t)a->index,
                          "content_index", 0, "part", "type", "output_text", "text", "", "annotations"));
    return st;
}

enum tern_status rsp_stream_delta(struct api_out *a, const struct reply_delta *d, const struct reply_parser *p,
                                  struct tern_buf *out) {
    enum tern_status st = TERN_OK;
    const json_int_t oi = a->index;
    (void)oi;
    if (d->reasoning.len) {
        if (a->open != API_OPEN_THINK) st = item_open(a, p, API_OPEN_THINK, out);
        if (!st) st = tern_buf_append(&a->acc, d->reasoning.data, d->reasoning.len);
        if (!st)
            st = ev(a, out, "response.reasoning_text.delta",
                    json_pack("{s:s,s:I,s:i,s:o*}", "item_id", a->item_id, "output_index", (json_int_t)a->index,
                              "content_index", 0, "delta", api_str_n(d->reasoning.data, d->reasoning.len)));
    }
    if (!st && d->content.len) {
        if (a->open != API_OPEN_TEXT) st = item_open(a, p, API_OPEN_TEXT, out);
        if (!st) st = tern_buf_append(&a->acc, d->content.data, d->content.len);
        if (!st)
            st = ev(a, out, "response.output_text.delta",
                    json_pack("{s:s,s:I,s:i,s:o*,s:[]}", "item_id", a->item_id, "output_index", (json_int_t)a->index,
                              "content_index", 0, "delta", api_str_n(d->content.data, d->content.len), "logprobs"));
    }
    for (size_t i = 0; !st && i < d->n_calls; i++) {
        const struct reply_delta_call *dc = &d->calls[i];
        if (dc->index >= p->n_calls) continue;
        if (dc->begin || a->open != API_OPEN_CALL || a->call != dc->index) {
            st = item_close(a, p, out);
            a->call = dc->index;
            if (!st) st = item_open(a, p, API_OPEN_CALL, out);
        }
        if (st || !dc->args.len) continue;
        st = tern_buf_append(&a->acc, dc->args.data, dc->args.len);
        /* a custom tool's input is a string inside the arguments' JSON: it goes out whole,
         * in its done event */
        if (!st && !call_is_custom(a, &p->calls[dc->index]))
            st = ev(a, out, "response.function_call_arguments.delta",
                    json_pack("{s:s,s:I,s:o*}", "item_id", a->item_id, "output_index", (json_int_t)a->index, "delta",
                              api_str_n(dc->args.data, dc->args.len)));
    }
    return st;
}

enum tern_status rsp_stream_end(struct api_out *a, const struct reply_parser *p, const char *finish,
                                const struct srv_usage *u, struct tern_buf *out) {
    enum tern_status st = item_close(a, p, out);
    if (st) return st;
    bool incomplete = !strcmp(finish, "length");
    json_t *items = a->items ? json_incref(a->items) : json_array();
    json_t *r = resp_object(a, incomplete ? "incomplete" : "completed", items, usage_obj(u), NULL,
                            incomplete ? "max_output_tokens" : NULL);
    return ev(a, out, incomplete ? "response.incomplete" : "response.completed", json_pack("{s:o*}", "response", r));
}

enum tern_status rsp_stream_error(struct api_out *a, const struct srv_error *e, struct tern_buf *out) {
    json_t *error = json_pack("{s:s,s:s}", "code", e->code ? e->code : e->status < 500 ? "invalid_request" : "server_error",
                              "message", e->message);
    json_t *items = a->items ? json_incref(a->items) : json_array();
    return ev(a, out, "response.failed",
              json_pack("{s:o*}", "response", resp_object(a, "failed", items, NULL, error, NULL)));
}

json_t *rsp_response(struct api_out *a, const struct reply_parser *p, const char *finish, const struct srv_usage *u) {
    json_t *items = json_array();
    if (!items) return NULL;
    if (p->reasoning.len) {
        next_item_id(a, "rs");
        a->n_opened++;
        json_array_append_new(items, item_reasoning(a->item_id, p->reasoning.data, p->reasoning.len, "completed"));
    }
    if (p->content.len) {
        next_item_id(a, "msg");
        a->n_opened++;
        json_array_append_new(items, item_message(a->item_id, p->content.data, p->content.len, "completed"));
    }
    for (size_t i = 0; i < p->n_calls; i++) {
        const struct reply_tool_call *c = &p->calls[i];
        next_item_id(a, call_is_custom(a, c) ? "ctc" : "fc");
        a->n_opened++;
        json_array_append_new(items, item_call(a, a->item_id, c, c->args.data, c->args.len, "completed"));
    }
    bool incomplete = !strcmp(finish, "length");
    return resp_object(a, incomplete ? "incomplete" : "completed", items, usage_obj(u), NULL,
                       incomplete ? "max_output_tokens" : NULL);
}
