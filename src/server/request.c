/* OpenAI request bodies: parse, validate, normalise (see request.h). */
#include "util/json-kind.h"
#include "server/request.h"

#include "server/api/api.h"

#include "server/constrain.h"

#include "util/mem.h"
#include "util/utf8.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ------------------------------------------------------------------------ */

static void error_vset(struct srv_error *e, int status, const char *type, const char *code,
                       const char *param, const char *fmt, va_list ap) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    vsnprintf(e->message, sizeof e->message, fmt, ap);
}

void srv_error_set(struct srv_error *e, int status, const char *type, const char *code,
                   const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, status, type, code, param, fmt, ap);
    va_end(ap);
}

void srv_error_bad(struct srv_error *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, 400, "invalid_request_error", NULL, param, fmt, ap);
    va_end(ap);
}

char *srv_error_json(const struct srv_error *e) {
    /* The message may hold bytes from the request (a bad value echoed back): they were
     * valid UTF-8 when jansson accepted them, but a truncation may have cut a
     * sequence, so repair before handing it to jansson (which refuses bad UTF-8). */
    char msg[sizeof e->message];
    size_t n = tern_utf8_valid_prefix(e->message, strnlen(e->message, sizeof e->message - 1));
    memcpy(msg, e->message, n);
    msg[n] = 0;
    json_t *inner = json_object();
    if (!inner) return NULL;
    int rc = json_object_set_new(inner, "message", json_string(msg));
    rc |= json_object_set_new(inner, "type", json_string(e->type ? e->type : "server_error"));
    rc |= json_object_set_new(inner, "param", e->param[0] && tern_utf8_valid(e->param, strlen(e->param))
                                                  ? json_string(e->param)
                                                  : json_null());
    rc |= json_object_set_new(inner, "code", e->code ? json_string(e->code) : json_null());
    json_t *o = rc ? NULL : json_object();
    if (!o || json_object_set_new(o, "error", inner)) {
        if (!o) json_decref(inner);
        json_decref(o);
        return NULL; /* out of memory: never a partial error object */
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* ---- helpers ----------------------------------------------------------------------- */

/* A field that may be absent or null (both mean "not given"). */
static const json_t *opt_field(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

static bool get_number(const json_t *o, const char *key, double lo, double hi, double *out,
                       bool *given, struct srv_error *err) {
    const json_t *v = opt_field(o, key);
    if (given) *given = false;
    if (!v) return true;
    if (!json_is_number(v)) {
        srv_error_bad(err, key, "'%s' must be a number, got %s", key, tern_json_kind(v));
        return false;
    }
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) {
        srv_error_bad(err, key, "'%s' is %g; it must be between %g and %g", key, d, lo, hi);
        return false;
    }
    *out = d;
    if (given) *given = true;
    return true;
}

static bool get_int(const json_t *o, const char *key, long long lo, long long hi, long long *out,
                    bool *given, struct srv_error *err) {
    const json_t *v = opt_field(o, key);
    if (given) *given = false;
    if (!v) return true;
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (long long)json_real_value(v); /* 16.0 from clients that only have doubles */
    } else {
        srv_error_bad(err, key, "'%s' must be an integer, got %s", key, tern_json_kind(v));
        return false;
    }
    if (x < lo || x > hi) {
        srv_error_bad(err, key, "'%s' is %lld; it must be between %lld and %lld", key, x, lo, hi);
        return false;
    }
    *out = x;
    if (given) *given = true;
    return true;
}

static bool get_bool(const json_t *o, const char *key, bool *out, struct srv_error *err) {
    const json_t *v = opt_field(o, key);
    if (!v) return true;
    if (!json_is_boolean(v)) {
        srv_error_bad(err, key, "'%s' must be a boolean, got %s", key, tern_json_kind(v));
        return false;
    }
    *out = json_is_true(v);
    return true;
}

/* A bounded string field; *out is a new copy or stays NULL when absent. */
static bool get_string(const json_t *o, const char *key, size_t max_len, char **out,
                       struct srv_error *err) {
    const json_t *v = opt_field(o, key);
    if (!v) return true;
    if (!json_is_string(v)) {
        srv_error_bad(err, key, "'%s' must be a string, got %s", key, tern_json_kind(v));
        return false;
    }
    size_t n = json_string_length(v);
    if (max_len && n > max_len) {
        srv_error_bad(err, key, "'%s' is %zu bytes long; the limit is %zu", key, n, max_len);
        return false;
    }
    if (memchr(json_string_value(v), 0, n)) {
        srv_error_bad(err, key, "'%s' contains a NUL character", key);
        return false;
    }
    *out = tern_strndup(json_string_value(v), n);
    if (!*out) {
        srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    return true;
}

static bool oom(struct srv_error *err) {
    srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    return false;
}

/* ---- messages ---------------------------------------------------------------------- */

static const char *const known_roles[] = {"system", "developer", "user", "assistant", "tool"};

/* Joins text parts with "\n" (llama.cpp's flattening; the bench transcripts' too). */
static json_t *flatten_content(const json_t *content, const char *where, struct srv_error *err) {
    char param[96];
    if (json_is_string(content)) return json_incref((json_t *)content);
    if (!json_is_array(content)) {
        snprintf(param, sizeof param, "%s.content", where);
        srv_error_bad(err, param, "'%s' must be a string or an array of content parts, got %s", param,
                      tern_json_kind(content));
        return NULL;
    }
    size_t total = 0, n = json_array_size(content);
    for (size_t i = 0; i < n; i++) {
        const json_t *part = json_array_get(content, i);
        snprintf(param, sizeof param, "%s.content[%zu]", where, i);
        if (!json_is_object(part)) {
            srv_error_bad(err, param, "'%s' must be an object, got %s", param, tern_json_kind(part));
            return NULL;
        }
        const json_t *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        if (type && !json_is_string(type)) {
            srv_error_bad(err, param, "'%s.type' must be a string", param);
            return NULL;
        }
        if (type && strcmp(json_string_value(type), "text") != 0) {
            srv_error_bad(err, param, "content part type '%.40s' is not supported (only \"text\")",
                          json_string_value(type));
            return NULL;
        }
        if (!json_is_string(text)) {
            srv_error_bad(err, param, "'%s.text' must be a string, got %s", param,
                          text ? tern_json_kind(text) : "nothing");
            return NULL;
        }
        total += json_string_length(text) + 1;
    }
    char *buf = tern_malloc(total + 1);
    if (!buf) return oom(err), NULL;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *text = json_object_get(json_array_get(content, i), "text");
        if (i) buf[len++] = '\n';
        memcpy(buf + len, json_string_value(text), json_string_length(text));
        len += json_string_length(text);
    }
    json_t *s = json_stringn_nocheck(buf, len);
    free(buf);
    if (!s) oom(err);
    return s;
}

static json_t *normalise_tool_calls(const json_t *calls, const char *where, struct srv_error *err) {
    char param[96];
    snprintf(param, sizeof param, "%s.tool_calls", where);
    if (!json_is_array(calls)) {
        srv_error_bad(err, param, "'%s' must be an array, got %s", param, tern_json_kind(calls));
        return NULL;
    }
    json_t *out = json_array();
    if (!out) return oom(err), NULL;
    for (size_t i = 0; i < json_array_size(calls); i++) {
        const json_t *c = json_array_get(calls, i);
        snprintf(param, sizeof param, "%s.tool_calls[%zu]", where, i);
        const json_t *fn = json_is_object(c) ? json_object_get(c, "function") : NULL;
        const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        if (!json_is_string(name)) {
            srv_error_bad(err, param, "'%s' must be an object with function.name a string", param);
            json_decref(out);
            return NULL;
        }
        const json_t *args = json_object_get(fn, "arguments");
        json_t *nargs = NULL;
        if (json_is_string(args)) {
            /* Templates (Qwen3.5, Qwen3-Coder) iterate arguments|items: they need an
             * object. A string that is not a JSON object stays as it was. */
            const unsigned long failed0 = tern_alloc_failures();
            json_t *parsed = json_loadb(json_string_value(args), json_string_length(args),
                                        JSON_DECODE_ANY, NULL);
            if (!parsed && tern_alloc_failures() != failed0) { /* not "not JSON": no memory */
                json_decref(out);
                return oom(err), NULL;
            }
            if (json_is_object(parsed)) {
                nargs = parsed;
            } else {
                json_decref(parsed);
                nargs = json_incref((json_t *)args);
            }
        } else if (args && !json_is_null(args)) {
            nargs = json_incref((json_t *)args);
        } else {
            nargs = json_object();
        }
        json_t *nfn = json_copy((json_t *)fn);
        json_t *nc = json_copy((json_t *)c);
        /* each _set_new/_append_new takes its value, also when it fails */
        bool ok = nargs && nfn && nc;
        if (ok) ok = !json_object_set_new(nfn, "arguments", nargs), nargs = NULL;
        if (ok) ok = !json_object_set_new(nc, "function", nfn), nfn = NULL;
        if (ok) ok = !json_array_append_new(out, nc), nc = NULL;
        if (!ok) {
            json_decref(nargs);
            json_decref(nfn);
            json_decref(nc);
            json_decref(out);
            return oom(err), NULL;
        }
    }
    return out;
}

json_t *srv_messages_normalise(const json_t *messages, struct srv_error *err) {
    if (!json_is_array(messages)) {
        srv_error_bad(err, "messages", "'messages' must be an array, got %s",
                      messages ? tern_json_kind(messages) : "nothing");
        return NULL;
    }
    size_t n = json_array_size(messages);
    if (n == 0) {
        srv_error_bad(err, "messages", "'messages' must contain at least one message");
        return NULL;
    }
    json_t *out = json_array();
    if (!out) return oom(err), NULL;
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(messages, i);
        char where[48], param[96];
        snprintf(where, sizeof where, "messages[%zu]", i);
        if (!json_is_object(m)) {
            srv_error_bad(err, where, "'%s' must be an object, got %s", where, tern_json_kind(m));
            goto fail;
        }
        const json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof param, "%s.role", where);
        if (!json_is_string(role)) {
            srv_error_bad(err, param, "'%s' must be a string, got %s", param, role ? tern_json_kind(role) : "nothing");
            goto fail;
        }
        const char *r = json_string_value(role);
        bool known = false;
        for (size_t k = 0; k < TERN_ARRAY_LEN(known_roles); k++) known |= !strcmp(r, known_roles[k]);
        if (!known || strlen(r) != json_string_length(role)) {
            srv_error_bad(err, param,
                          "'%s' is '%.40s'; it must be one of system, developer, user, assistant, tool",
                          param, r);
            goto fail;
        }
        bool assistant = !strcmp(r, "assistant");
        json_t *nm = json_copy((json_t *)m);
        if (!nm || json_array_append_new(out, nm)) {
            oom(err);
            goto fail;
        }
        const json_t *calls = opt_field(m, "tool_calls");
        if (calls) {
            if (!assistant) {
                snprintf(param, sizeof param, "%s.tool_calls", where);
                srv_error_bad(err, param, "'%s': only assistant messages carry tool_calls", param);
                goto fail;
            }
            json_t *nc = normalise_tool_calls(calls, where, err);
            if (!nc) goto fail;
            if (json_object_set_new(nm, "tool_calls", nc)) {
                oom(err);
                goto fail;
            }
        } else if (json_object_get(m, "tool_calls")) {
            json_object_del(nm, "tool_calls"); /* null: as if absent */
        }
        const json_t *content = opt_field(m, "content");
        if (!content) {
            /* An assistant turn may be only tool calls (or only reasoning): "". */
            if (!assistant) {
                snprintf(param, sizeof param, "%s.content", where);
                srv_error_bad(err, param, "'%s' is missing (required for role '%s')", param, r);
                goto fail;
            }
            if (json_object_set_new(nm, "content", json_string(""))) {
                oom(err);
                goto fail;
            }
        } else {
            json_t *flat = flatten_content(content, where, err);
            if (!flat) goto fail;
            if (json_object_set_new(nm, "content", flat)) {
                oom(err);
                goto fail;
            }
        }
        const json_t *rc = opt_field(m, "reasoning_content");
        if (rc && !json_is_string(rc)) {
            snprintf(param, sizeof param, "%s.reasoning_content", where);
            srv_error_bad(err, param, "'%s' must be a string, got %s", param, tern_json_kind(rc));
            goto fail;
        }
        if (!rc && json_object_get(m, "reasoning_content")) json_object_del(nm, "reasoning_content");
        const json_t *tcid = opt_field(m, "tool_call_id");
        if (tcid && !json_is_string(tcid)) {
            snprintf(param, sizeof param, "%s.tool_call_id", where);
            srv_error_bad(err, param, "'%s' must be a string, got %s", param, tern_json_kind(tcid));
            goto fail;
        }
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

static bool check_tools(const json_t *tools, struct srv_error *err) {
    if (!json_is_array(tools)) {
        srv_error_bad(err, "tools", "'tools' must be an array, got %s", tern_json_kind(tools));
        return false;
    }
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        char param[64];
        snprintf(param, sizeof param, "tools[%zu]", i);
        if (!json_is_object(t)) {
            srv_error_bad(err, param, "'%s' must be an object, got %s", param, tern_json_kind(t));
            return false;
        }
        const json_t *type = json_object_get(t, "type");
        if (type && (!json_is_string(type) || strcmp(json_string_value(type), "function"))) {
            srv_error_bad(err, param, "'%s.type' must be \"function\"", param);
            return false;
        }
        const json_t *fn = json_object_get(t, "function");
        if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name"))) {
            srv_error_bad(err, param, "'%s.function' must be an object with a string 'name'", param);
            return false;
        }
        /* parameters may be absent (function tools without arguments are legal). */
        const json_t *params = json_object_get(fn, "parameters");
        if (params && !json_is_object(params) && !json_is_null(params)) {
            srv_error_bad(err, param, "'%s.function.parameters' must be an object, got %s", param,
                          tern_json_kind(params));
            return false;
        }
    }
    return true;
}

/* OpenAI's reasoning_effort ("none", "minimal", "low", "medium", "high", ...): the
 * template's reasoning_effort (gpt-oss reads it) and, unless the request sets it in
 * chat_template_kwargs, enable_thinking (false for none and minimal; Qwen reads it). */
static bool parse_reasoning_effort(const json_t *o, struct srv_request *req, struct srv_error *err) {
    const json_t *v = opt_field(o, "reasoning_effort");
    if (!v) return true;
    if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > 32 ||
        strlen(json_string_value(v)) != json_string_length(v)) {
        srv_error_bad(err, "reasoning_effort", "'reasoning_effort' must be a short string (low, medium, high, ...)");
        return false;
    }
    json_t *kw = req->template_kwargs ? json_deep_copy(req->template_kwargs) : json_object();
    if (!kw) return oom(err);
    const char *e = json_string_value(v);
    int rc = 0;
    if (!json_object_get(kw, "reasoning_effort")) rc |= json_object_set(kw, "reasoning_effort", (json_t *)v);
    if (!json_object_get(kw, "enable_thinking"))
        rc |= json_object_set_new(kw, "enable_thinking", json_boolean(strcmp(e, "none") && strcmp(e, "minimal")));
    if (rc) {
        json_decref(kw);
        return oom(err);
    }
    json_decref(req->template_kwargs);
    req->template_kwargs = kw;
    return true;
}

static bool parse_tool_choice(const json_t *v, enum srv_tool_choice *out, char **name, struct srv_error *err) {
    if (!v) return true;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "auto")) *out = SRV_TOOLS_AUTO;
        else if (!strcmp(s, "none")) *out = SRV_TOOLS_NONE;
        else if (!strcmp(s, "required")) *out = SRV_TOOLS_REQUIRED;
        else {
            srv_error_bad(err, "tool_choice", "'tool_choice' is '%.40s'; it must be auto, none, required or an object", s);
            return false;
        }
        return true;
    }
    const json_t *fn = json_is_object(v) ? json_object_get(v, "function") : NULL;
    if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name"))) {
        srv_error_bad(err, "tool_choice",
                      "'tool_choice' must be a string or {\"type\":\"function\",\"function\":{\"name\":...}}");
        return false;
    }
    *out = SRV_TOOLS_NAMED;
    *name = tern_strdup(json_string_value(json_object_get(fn, "name")));
    return *name ? true : oom(err);
}

static bool parse_stop(const json_t *v, struct srv_request *req, struct srv_error *err) {
    if (!v) return true;
    const json_t *one[1] = {v};
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > SRV_MAX_STOP) {
            srv_error_bad(err, "stop", "'stop' has %zu strings; the limit is %d", n, SRV_MAX_STOP);
            return false;
        }
    } else if (!json_is_string(v)) {
        srv_error_bad(err, "stop", "'stop' must be a string or an array of strings, got %s", tern_json_kind(v));
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_array(v) ? json_array_get(v, i) : one[0];
        if (!json_is_string(s)) {
            srv_error_bad(err, "stop", "'stop[%zu]' must be a string, got %s", i, tern_json_kind(s));
            return false;
        }
        size_t len = json_string_length(s);
        if (len == 0) continue; /* an empty stop string would stop before anything */
        if (len > SRV_MAX_STOP_LEN || memchr(json_string_value(s), 0, len)) {
            srv_error_bad(err, "stop", "'stop[%zu]' is %zu bytes; the limit is %d (and no NUL)", i, len,
                          SRV_MAX_STOP_LEN);
            return false;
        }
        req->stop[req->n_stop] = tern_strndup(json_string_value(s), len);
        if (!req->stop[req->n_stop]) return oom(err);
        req->n_stop++;
    }
    return true;
}

static bool parse_prompt(const json_t *v, struct srv_request *req, struct srv_error *err) {
    if (!v) {
        srv_error_bad(err, "prompt", "'prompt' is required");
        return false;
    }
    if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)))
        v = json_array_get(v, 0);
    if (json_is_string(v)) {
        if (memchr(json_string_value(v), 0, json_string_length(v))) {
            srv_error_bad(err, "prompt", "'prompt' contains a NUL character");
            return false;
        }
        req->prompt = tern_strndup(json_string_value(v), json_string_length(v));
        return req->prompt ? true : oom(err);
    }
    if (!json_is_array(v)) {
        srv_error_bad(err, "prompt", "'prompt' must be a string or an array of token ids, got %s", tern_json_kind(v));
        return false;
    }
    size_t n = json_array_size(v);
    if (n == 0) {
        srv_error_bad(err, "prompt", "'prompt' is empty");
        return false;
    }
    if (n > SRV_MAX_PROMPT_IDS) {
        srv_error_bad(err, "prompt", "'prompt' has %zu token ids; the limit is %u", n, SRV_MAX_PROMPT_IDS);
        return false;
    }
    req->prompt_ids = tern_malloc(n * sizeof *req->prompt_ids);
    if (!req->prompt_ids) return oom(err);
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(v, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX) {
            if (json_is_string(t))
                srv_error_bad(err, "prompt", "'prompt' with several strings (a batch) is not supported; send one");
            else
                srv_error_bad(err, "prompt", "'prompt[%zu]' must be a token id (a non-negative integer)", i);
            return false;
        }
        req->prompt_ids[i] = (int32_t)json_integer_value(t);
    }
    req->n_prompt_ids = n;
    return true;
}

/* ---- the request ------------------------------------------------------------------- */

void srv_request_free(struct srv_request *req) {
    if (!req) return;
    free(req->model);
    json_decref(req->messages);
    json_decref(req->tools);
    json_decref(req->template_kwargs);
    free(req->prompt);
    free(req->prompt_ids);
    for (size_t i = 0; i < req->n_stop; i++) free(req->stop[i]);
    free(req->session_key);
    free(req->cache_salt);
    free(req->forced_output);
    free(req->forced_prefix);
    json_decref(req->api_tools);
    json_decref(req->api_echo);
    free(req->bias_ids);
    free(req->bias_vals);
    srv_constraint_free(req);
    memset(req, 0, sizeof *req);
}

/* logit_bias: {"<token id>": bias}, ids in canonical decimal, biases finite numbers in
 * -100..100 (OpenAI's range: -100 bans a token, 100 all but forces it), at most
 * TERN_SAMPLER_MAX_BIAS of them; null and {} are no bias. Whether each id is in the
 * vocabulary is checked where the vocabulary is known (the backend's prepare). */
static bool parse_logit_bias(const json_t *o, struct srv_request *req, struct srv_error *err) {
    const json_t *lb = opt_field(o, "logit_bias");
    if (!lb) return true;
    if (!json_is_object(lb)) {
        srv_error_bad(err, "logit_bias", "'logit_bias' must be an object of token id -> bias, got %s",
                      tern_json_kind(lb));
        return false;
    }
    size_t n = json_object_size(lb);
    if (n == 0) return true;
    if (n > TERN_SAMPLER_MAX_BIAS) {
        srv_error_bad(err, "logit_bias", "'logit_bias' has %zu entries; the limit is %d", n, TERN_SAMPLER_MAX_BIAS);
        return false;
    }
    req->bias_ids = tern_malloc(n * sizeof *req->bias_ids);
    req->bias_vals = tern_malloc(n * sizeof *req->bias_vals);
    if (!req->bias_ids || !req->bias_vals) return oom(err);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)lb, k, v) {
        char *end;
        errno = 0;
        long id = strtol(k, &end, 10);
        bool canonical = *k && !*end && errno == 0 && id >= 0 && id <= INT32_MAX && (k[0] != '0' || !k[1]);
        if (!canonical) {
            srv_error_bad(err, "logit_bias", "'logit_bias' key '%.40s' is not a token id (a decimal number)", k);
            return false;
        }
        double b = json_is_number(v) ? json_number_value(v) : NAN;
        if (!isfinite(b) || b < -100 || b > 100) {
            srv_error_bad(err, "logit_bias", "'logit_bias' of token %ld must be a number from -100 to 100", id);
            return false;
        }
        req->bias_ids[req->n_bias] = (int32_t)id;
        req->bias_vals[req->n_bias++] = (float)b;
    }
    return true;
}

static bool parse_body(enum srv_endpoint ep, const json_t *o, const struct srv_parse_opts *opts,
                       struct srv_request *req, struct srv_error *err) {
    if (!get_string(o, "model", 1024, &req->model, err)) return false;
    if (!req->model && !(req->model = tern_strdup(""))) return oom(err);

    if (ep == SRV_EP_CHAT) {
        if (!json_object_get(o, "messages")) {
            srv_error_bad(err, "messages", "'messages' is required");
            return false;
        }
        req->messages = srv_messages_normalise(json_object_get(o, "messages"), err);
        if (!req->messages) return false;
        const json_t *tools = opt_field(o, "tools");
        if (tools) {
            if (!check_tools(tools, err)) return false;
            if (json_array_size(tools) > 0) req->tools = json_incref((json_t *)tools);
        }
        if (!parse_tool_choice(opt_field(o, "tool_choice"), &req->tool_choice, &req->tool_name, err)) return false;
        const json_t *kw = opt_field(o, "chat_template_kwargs");
        if (kw) {
            if (!json_is_object(kw)) {
                srv_error_bad(err, "chat_template_kwargs", "'chat_template_kwargs' must be an object, got %s",
                              tern_json_kind(kw));
                return false;
            }
            req->template_kwargs = json_incref((json_t *)kw);
        }
        if (!parse_reasoning_effort(o, req, err)) return false;
    } else {
        if (!parse_prompt(opt_field(o, "prompt"), req, err)) return false;
        bool echo = false;
        if (!get_bool(o, "echo", &echo, err)) return false;
        if (echo) {
            srv_error_bad(err, "echo", "'echo' is not supported");
            return false;
        }
    }

    long long n = 1;
    if (!get_int(o, "n", 1, 128, &n, NULL, err)) return false;
    if (n != 1) {
        srv_error_bad(err, "n", "'n' is %lld; only n = 1 is supported (one completion per request)", n);
        return false;
    }
    const json_t *bo = opt_field(o, "best_of");
    if (bo && !(json_is_integer(bo) && json_integer_value(bo) == 1)) {
        srv_error_bad(err, "best_of", "'best_of' must be 1 (several completions per request are not supported)");
        return false;
    }

    if (!get_bool(o, "stream", &req->stream, err)) return false;
    const json_t *so = opt_field(o, "stream_options");
    if (so) {
        if (!json_is_object(so)) {
            srv_error_bad(err, "stream_options", "'stream_options' must be an object, got %s", tern_json_kind(so));
            return false;
        }
        if (!get_bool(so, "include_usage", &req->include_usage, err)) return false;
    }

    long long mt = -1;
    bool given = false;
    if (!get_int(o, "max_completion_tokens", 1, INT32_MAX, &mt, &given, err)) return false;
    if (!given && !get_int(o, "max_tokens", 1, INT32_MAX, &mt, NULL, err)) return false;
    req->max_tokens = mt;

    struct tern_sampler_params *sp = &req->sampling;
    /* Defaults of local OpenAI-compatible servers (llama.cpp's): they suit small
     * local models better than OpenAI's temperature 1 / no truncation. */
    tern_sampler_params_default(sp);
    double d;
    long long ll;
    if (!get_number(o, "temperature", 0, 100, &d, &given, err)) return false;
    if (given) sp->temperature = (float)d;
    if (!get_number(o, "top_p", 0, 1, &d, &given, err)) return false;
    if (given) sp->top_p = (float)d;
    if (!get_int(o, "top_k", 0, INT32_MAX, &ll, &given, err)) return false;
    if (given) sp->top_k = (int32_t)ll;
    if (!get_number(o, "min_p", 0, 1, &d, &given, err)) return false;
    if (given) sp->min_p = (float)d;
    if (!get_number(o, "presence_penalty", -2, 2, &d, &given, err)) return false;
    if (given) sp->presence_penalty = (float)d;
    if (!get_number(o, "frequency_penalty", -2, 2, &d, &given, err)) return false;
    if (given) sp->frequency_penalty = (float)d;
    if (!get_number(o, "repeat_penalty", 0, 10, &d, &given, err)) return false;
    if (given) sp->repeat_penalty = (float)d;
    if (given && !(sp->repeat_penalty > 0.0f)) {
        /* 0 (or a value that rounds to 0 as a float) would make the sampler divide by 0 */
        srv_error_bad(err, "repeat_penalty", "'repeat_penalty' is %g; it must be greater than 0 and at most 10", d);
        return false;
    }
    if (!get_int(o, "seed", INT64_MIN, INT64_MAX, &ll, &req->seed_set, err)) return false;
    if (req->seed_set) sp->seed = (uint64_t)ll;
    /* whatever passed the ranges above must build a sampler: one rule, the sampler's */
    if (tern_sampler_params_check(sp)) {
        srv_error_bad(err, NULL, "%s", tern_last_error());
        return false;
    }

    if (!parse_logit_bias(o, req, err)) return false;
    if (!parse_stop(opt_field(o, "stop"), req, err)) return false;
    if (!srv_constraint_parse(o, req, err)) return false;

    char *spec = NULL;
    if (!get_string(o, "spec", 16, &spec, err)) return false;
    if (spec) {
        req->spec_set = spec_mode_parse(spec, &req->spec);
        free(spec);
        if (!req->spec_set) {
            srv_error_bad(err, "spec", "'spec' must be \"off\", \"ngram\" or \"mtp\"");
            return false;
        }
    }
    if (!get_int(o, "spec_max", 1, SPEC_MAX_DRAFT, &ll, &given, err)) return false;
    if (given) req->spec_max = (uint32_t)ll;

    /* Identity: session_id > prompt_cache_key > user (the header comes last, outside). */
    static const char *const key_fields[] = {"session_id", "prompt_cache_key", "user"};
    for (size_t i = 0; i < TERN_ARRAY_LEN(key_fields); i++) {
        char *k = NULL;
        if (!get_string(o, key_fields[i], SRV_MAX_KEY_LEN, &k, err)) return false;
        if (k && *k && !req->session_key) {
            req->session_key = k;
        } else {
            free(k);
        }
    }
    if (!get_string(o, "cache_salt", SRV_MAX_KEY_LEN, &req->cache_salt, err)) return false;

    if (opt_field(o, "tern_forced_output")) {
        if (!opts || !opts->allow_forced_output) {
            srv_error_bad(err, "tern_forced_output",
                          "'tern_forced_output' is a test-only field; start the server with "
                          "TERN_TEST_FORCED_OUTPUT=1 (a build with -DTERN_TEST_HOOKS=ON) to use it");
            return false;
        }
        if (!get_string(o, "tern_forced_output", 1 << 20, &req->forced_output, err)) return false;
    } else if (opts && opts->allow_forced_output && opts->forced_reply && ep == SRV_EP_CHAT) {
        if (!(req->forced_output = tern_strdup(opts->forced_reply))) return oom(err);
    }
    if (opt_field(o, "tern_forced_prefix")) {
        if (!opts || !opts->allow_forced_output) {
            srv_error_bad(err, "tern_forced_prefix",
                          "'tern_forced_prefix' is a test-only field; start the server with "
                          "TERN_TEST_FORCED_OUTPUT=1 (a build with -DTERN_TEST_HOOKS=ON) to use it");
            return false;
        }
        if (!get_string(o, "tern_forced_prefix", 1 << 20, &req->forced_prefix, err)) return false;
    }
    return true;
}

/* An upper bound of the values a JSON text makes (containers, and one per separator):
 * '[', '{' and ',' outside strings, plus one. Linear, no allocation. */
size_t srv_json_value_bound(const char *p, size_t n) {
    size_t count = 1;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (in_str) {
            if (ch == '\\') i++;
            else if (ch == '"') in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == '[' || ch == '{' || ch == ',') {
            count++;
        }
    }
    return count;
}

static bool parse_doc(enum srv_endpoint ep, enum srv_proto proto, bool count_only, const char *body, size_t len,
                      const struct srv_parse_opts *opts, struct srv_request *req, struct srv_error *err);

bool srv_request_parse(enum srv_endpoint ep, const char *body, size_t len,
                       const struct srv_parse_opts *opts, struct srv_request *req,
                       struct srv_error *err) {
    return parse_doc(ep, SRV_PROTO_CHAT, false, body, len, opts, req, err);
}

bool srv_request_parse_proto(enum srv_proto proto, bool count_only, const char *body, size_t len,
                             const struct srv_parse_opts *opts, struct srv_request *req, struct srv_error *err) {
    return parse_doc(SRV_EP_CHAT, proto, count_only, body, len, opts, req, err);
}

static bool parse_doc(enum srv_endpoint ep, enum srv_proto proto, bool count_only, const char *body, size_t len,
                      const struct srv_parse_opts *opts, struct srv_request *req, struct srv_error *err) {
    memset(req, 0, sizeof *req);
    req->ep = ep;
    if (opts && opts->max_body && len > opts->max_body) {
        srv_error_set(err, 413, "invalid_request_error", "request_too_large", NULL,
                      "request body is %zu bytes; the limit is %zu (--max-body)", len, opts->max_body);
        return false;
    }
    if (len == 0) {
        srv_error_bad(err, NULL, "the request body is empty; expected a JSON object");
        return false;
    }
    /* Parsing multiplies memory by up to ~50 (`[]` is 2 bytes and a node): bound the
     * values before building them. */
    size_t n_values = srv_json_value_bound(body, len);
    if (n_values > SRV_MAX_JSON_VALUES) {
        srv_error_set(err, 413, "invalid_request_error", "request_too_large", NULL,
                      "the request body holds about %zu JSON values; the limit is %u", n_values, SRV_MAX_JSON_VALUES);
        return false;
    }
    json_error_t jerr;
    const unsigned long failed0 = tern_alloc_failures();
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o) {
        /* jansson allocates through tern_malloc (tern_json_alloc_init): a failed
         * allocation during the parse is out of memory, whatever jansson calls it (its
         * lexer reports one as a syntax error) */
        if (tern_alloc_failures() != failed0 || json_error_code(&jerr) == json_error_out_of_memory)
            srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory parsing a request body of %zu bytes",
                          len);
        else if (json_error_code(&jerr) == json_error_duplicate_key)
            srv_error_bad(err, NULL, "a key appears twice in one object at line %d, column %d (byte %d): %s; "
                          "send each key once", jerr.line, jerr.column, jerr.position, jerr.text);
        else if (json_error_code(&jerr) == json_error_invalid_utf8)
            srv_error_bad(err, NULL, "invalid UTF-8 in the request body at line %d, column %d (byte %d)",
                          jerr.line, jerr.column, jerr.position);
        else
            srv_error_bad(err, NULL, "malformed JSON at line %d, column %d (byte %d): %s", jerr.line,
                          jerr.column, jerr.position, jerr.text);
        return false;
    }
    if (!json_is_object(o)) {
        srv_error_bad(err, NULL, "the request body must be a JSON object, got %s", tern_json_kind(o));
        json_decref(o);
        return false;
    }
    /* another protocol: its adapter makes the chat request this parser validates */
    json_t *chat = NULL;
    bool ok = true;
    req->proto = proto;
    req->count_only = count_only;
    if (proto == SRV_PROTO_MESSAGES) ok = (chat = api_messages_request(o, count_only, req, err)) != NULL;
    else if (proto == SRV_PROTO_RESPONSES) ok = (chat = api_responses_request(o, req, err)) != NULL;
    if (ok) ok = parse_body(ep, chat ? chat : o, opts, req, err);
    json_decref(chat);
    json_decref(o);
    /* A failed allocation makes any verdict after it unreliable (a grammar that could
     * not be built reads as one too large): the request failed for want of memory. */
    if (!ok && tern_alloc_failures() != failed0)
        srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory parsing a request body of %zu bytes", len);
    if (!ok) srv_request_free(req);
    req->ep = ep;
    req->proto = proto;
    return ok;
}

json_t *srv_template_vars(const struct srv_request *req, const char *bos_token, const char *eos_token) {
    json_t *v = json_object();
    if (!v) return NULL;
    if (req->template_kwargs) json_object_update(v, req->template_kwargs);
    int rc = 0;
    rc |= json_object_set_new(v, "messages", req->messages ? json_incref(req->messages) : json_array());
    if (req->tools) rc |= json_object_set(v, "tools", req->tools);
    else json_object_del(v, "tools");
    rc |= json_object_set_new(v, "add_generation_prompt", json_true());
    rc |= json_object_set_new(v, "bos_token", json_string(bos_token ? bos_token : ""));
    rc |= json_object_set_new(v, "eos_token", json_string(eos_token ? eos_token : ""));
    if (rc) {
        json_decref(v);
        return NULL;
    }
    return v;
}
