/* Structured output: request fields -> grammars (see constrain.h). */
#include "server/constrain.h"

#include "grammar/grammar.h"
#include "grammar/schema.h"
#include "util/mem.h"

#include <stdio.h>
#include <string.h>

enum srv_tool_syntax srv_tool_syntax_detect(const char *src, size_t len, bool qwen_markers) {
    if (src && memmem(src, len, "<function=", 10)) return SRV_TOOL_SYNTAX_XML;
    if (qwen_markers) return SRV_TOOL_SYNTAX_JSON;
    return SRV_TOOL_SYNTAX_NONE;
}

const char *srv_tool_syntax_name(enum srv_tool_syntax s) {
    return s == SRV_TOOL_SYNTAX_JSON      ? "json"
           : s == SRV_TOOL_SYNTAX_XML     ? "xml"
           : s == SRV_TOOL_SYNTAX_HARMONY ? "harmony"
                                          : "none";
}

bool srv_grammar_compile(const char *text, size_t len, const char *param, struct tern_grammar **out,
                         struct srv_error *err) {
    enum tern_status st = tern_grammar_compile(text, len, NULL, out);
    if (!st) {
        /* the start state must be within the limits (nested empty-able repetitions can
         * multiply it): refused now rather than when decoding starts */
        struct tern_gmatch *m = NULL;
        st = tern_gmatch_new(*out, NULL, &m);
        tern_gmatch_free(m);
        if (st) {
            tern_grammar_free(*out);
            *out = NULL;
        }
    }
    if (st == TERN_ERR_NOMEM) {
        srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory compiling the grammar");
        return false;
    }
    if (st) {
        const char *msg = tern_last_error();
        if (!strncmp(msg, "grammar: ", 9)) msg += 9;
        srv_error_bad(err, param, "'%s': %s", param, msg);
        return false;
    }
    return true;
}

/* A schema -> compiled grammar; errors name param and the schema's pointer. */
static bool schema_grammar(const json_t *schema, const char *param, struct srv_request *req, struct srv_error *err) {
    struct tern_buf b = TERN_BUF_INIT;
    char ptr[256];
    enum tern_status st = tern_json_schema_to_gbnf(schema, &b, ptr, sizeof ptr);
    if (st) {
        tern_buf_free(&b);
        if (st == TERN_ERR_NOMEM) {
            srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory converting the schema");
            return false;
        }
        char p[96];
        snprintf(p, sizeof p, "%.40s%s%.50s", param, ptr[0] ? "#" : "", ptr);
        srv_error_bad(err, p, "'%s': %s", param, tern_last_error());
        return false;
    }
    bool ok = srv_grammar_compile(b.data, b.len, param, &req->grammar, err);
    tern_buf_free(&b);
    return ok;
}

static bool set_kind(struct srv_request *req, const char *kind, struct srv_error *err) {
    if (req->grammar_kind) {
        srv_error_bad(err, kind, "'%s' and '%s' cannot be combined: give one constraint", req->grammar_kind, kind);
        return false;
    }
    req->grammar_kind = kind;
    return true;
}

bool srv_constraint_parse(const json_t *o, struct srv_request *req, struct srv_error *err) {
    req->parallel_tool_calls = true;
    const json_t *ptc = json_object_get(o, "parallel_tool_calls");
    if (ptc && !json_is_null(ptc)) {
        if (!json_is_boolean(ptc)) {
            srv_error_bad(err, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
            return false;
        }
        req->parallel_tool_calls = json_is_true(ptc);
    }
    const json_t *g = json_object_get(o, "grammar");
    if (g && !json_is_null(g)) {
        if (!json_is_string(g)) {
            srv_error_bad(err, "grammar", "'grammar' must be a string (GBNF)");
            return false;
        }
        if (!set_kind(req, "grammar", err)) return false;
        if (json_string_length(g) > TERN_GRAMMAR_MAX_SOURCE) {
            srv_error_bad(err, "grammar", "'grammar' is %zu bytes; the limit is %u", json_string_length(g),
                          TERN_GRAMMAR_MAX_SOURCE);
            return false;
        }
        if (!srv_grammar_compile(json_string_value(g), json_string_length(g), "grammar", &req->grammar, err)) return false;
    }
    const json_t *js = json_object_get(o, "json_schema");
    if (js && !json_is_null(js)) {
        if (!set_kind(req, "json_schema", err)) return false;
        if (!schema_grammar(js, "json_schema", req, err)) return false;
    }
    const json_t *rf = json_object_get(o, "response_format");
    if (rf && !json_is_null(rf)) {
        const json_t *type = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!json_is_string(type)) {
            srv_error_bad(err, "response_format", "'response_format' must be an object with a string 'type'");
            return false;
        }
        const char *t = json_string_value(type);
        if (!strcmp(t, "text")) return true;
        if (!set_kind(req, "response_format", err)) return false;
        if (!strcmp(t, "json_object")) {
            const json_t *schema = json_object_get(rf, "schema");
            if (schema && !json_is_null(schema)) return schema_grammar(schema, "response_format.schema", req, err);
            const char *txt = tern_json_object_gbnf();
            return srv_grammar_compile(txt, strlen(txt), "response_format", &req->grammar, err);
        }
        if (!strcmp(t, "json_schema")) {
            const json_t *jsn = json_object_get(rf, "json_schema");
            if (!json_is_object(jsn)) {
                srv_error_bad(err, "response_format.json_schema",
                              "'response_format.json_schema' must be an object {name, schema, strict}");
                return false;
            }
            const json_t *name = json_object_get(jsn, "name"), *strict = json_object_get(jsn, "strict");
            if (name && !json_is_string(name)) {
                srv_error_bad(err, "response_format.json_schema.name", "'response_format.json_schema.name' must be a string");
                return false;
            }
            if (strict && !json_is_boolean(strict) && !json_is_null(strict)) {
                srv_error_bad(err, "response_format.json_schema.strict",
                              "'response_format.json_schema.strict' must be a boolean");
                return false;
            }
            const json_t *schema = json_object_get(jsn, "schema");
            if (!schema || json_is_null(schema)) schema = json_true(); /* OpenAI: no schema = any JSON */
            return schema_grammar(schema, "response_format.json_schema.schema", req, err);
        }
        srv_error_bad(err, "response_format.type", "'response_format.type' is '%.40s'; it must be text, json_object or "
                      "json_schema", t);
        return false;
    }
    return true;
}

void srv_constraint_free(struct srv_request *req) {
    tern_grammar_free(req->grammar);
    req->grammar = NULL;
    free(req->tool_name);
    req->tool_name = NULL;
}

bool srv_tools_enforced(const struct srv_request *req) {
    return req->tools && (req->tool_choice == SRV_TOOLS_REQUIRED || req->tool_choice == SRV_TOOLS_NAMED);
}

/* Rules for "any text without L, then L" (a KMP automaton as rules name-0 ..). */
static enum tern_status until_rules(struct tern_buf *b, const char *name, const char *L) {
    size_t k = strlen(L);
    char chars[64];
    size_t nc = 0;
    for (size_t i = 0; i < k; i++)
        if (!memchr(chars, L[i], nc)) chars[nc++] = L[i];
    enum tern_status st = TERN_OK;
    for (size_t j = 0; j < k && !st; j++) {
        st = tern_buf_printf(b, "%s-%zu ::= ", name, j);
        for (size_t ci = 0; ci < nc && !st; ci++) {
            char c = chars[ci];
            size_t next;
            if (c == L[j]) {
                next = j + 1;
            } else {
                /* the longest prefix of L that is a suffix of L[0..j) + c */
                next = 0;
                for (size_t len = j; len > 0; len--) {
                    if (L[len - 1] != c) continue;
                    if (!memcmp(L, L + j - (len - 1), len - 1)) {
                        next = len;
                        break;
                    }
                }
            }
            char lit[2] = {c, 0};
            st = tern_buf_puts(b, ci ? " | " : "");
            st = st ? st : tern_gbnf_literal(b, lit, 1);
            if (next < k) st = st ? st : tern_buf_printf(b, " %s-%zu", name, next);
        }
        st = st ? st : tern_buf_puts(b, " | [^");
        for (size_t ci = 0; ci < nc && !st; ci++) {
            char c = chars[ci];
            if (c == ']' || c == '\\' || c == '^' || c == '-' || c == '[') st = tern_buf_putc(b, '\\');
            st = st ? st : tern_buf_putc(b, c);
        }
        st = st ? st : tern_buf_printf(b, "] %s-0\n", name);
    }
    return st;
}

static bool oom(struct srv_error *err) {
    srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory building the tool-call grammar");
    return false;
}

static bool schema_fail(struct srv_error *err, enum tern_status st, size_t ti, const char *ptr) {
    if (st == TERN_ERR_NOMEM) return oom(err);
    char p[96];
    snprintf(p, sizeof p, "tools[%zu].function.parameters%s%.50s", ti % 100000, ptr[0] ? "#" : "", ptr);
    srv_error_bad(err, p, "'%s': %s", p, tern_last_error());
    return false;
}

/* Appends the GBNF literal pre + name + post (whole, however long the name: a truncated
 * literal would hold the model to a name the tools do not have). */
static enum tern_status name_literal(struct tern_buf *body, const char *pre, const char *name, const char *post) {
    struct tern_buf t = TERN_BUF_INIT;
    enum tern_status st = tern_buf_printf(&t, "%s%s%s", pre, name, post);
    if (!st) st = tern_gbnf_literal(body, t.data, t.len);
    tern_buf_free(&t);
    return st;
}

/* The XML body of one call: <parameter=P>\nVALUE\n</parameter>\n for the properties in
 * order (required ones always, optional ones maybe); values in their JSON form. */
static bool xml_params(struct tern_schema_gbnf *c, size_t ti, const char *prefix, const json_t *params,
                       struct tern_buf *body, struct srv_error *err) {
    char p[96];
    snprintf(p, sizeof p, "tools[%zu].function.parameters", ti);
    if (!params || json_is_null(params)) return true;
    const json_t *type = json_object_get(params, "type"), *props = json_object_get(params, "properties");
    const json_t *req = json_object_get(params, "required");
    if ((type && !(json_is_string(type) && !strcmp(json_string_value(type), "object"))) ||
        (props && !json_is_object(props)) || (req && !json_is_array(req))) {
        srv_error_bad(err, p, "'%s': the template's XML tool-call syntax needs an object schema with 'properties' "
                      "(and 'required' an array)", p);
        return false;
    }
    const char *key;
    const json_t *sub;
    static const char *const top_ok[] = {"type", "properties", "required", "additionalProperties", "title",
                                         "description", "$schema", "$id", "$comment", "$defs", "definitions",
                                         "examples", "default"};
    json_object_foreach((json_t *)params, key, sub) {
        bool ok = false;
        for (size_t k = 0; k < sizeof top_ok / sizeof top_ok[0]; k++) ok = ok || !strcmp(key, top_ok[k]);
        if (!ok) {
            srv_error_bad(err, p, "'%s': '%.60s' at the top of the parameters cannot be enforced in the template's "
                          "XML tool-call syntax (one <parameter=...> per property)", p, key);
            return false;
        }
    }
    size_t i = 0;
    json_object_foreach((json_t *)props, key, sub) {
        if (strchr(key, '>') || strchr(key, '\n')) {
            srv_error_bad(err, p, "'%s': parameter name '%.60s' cannot be written in the XML tool-call syntax", p, key);
            return false;
        }
        bool r = false;
        for (size_t k = 0; k < json_array_size(req); k++)
            r = r || (json_is_string(json_array_get(req, k)) && !strcmp(json_string_value(json_array_get(req, k)), key));
        char rule[64], base[300], ptr[256];
        snprintf(rule, sizeof rule, "%s-p%zu", prefix, i++);
        snprintf(base, sizeof base, "/properties/%s", key);
        enum tern_status st = tern_schema_gbnf_add_in(c, rule, params, sub, base, ptr, sizeof ptr);
        if (st) return schema_fail(err, st, ti, ptr);
        if (tern_buf_puts(body, r ? " " : " ( ") || name_literal(body, "<parameter=", key, ">\n") ||
            tern_buf_printf(body, " %s \"\\n</parameter>\\n\"%s", rule, r ? "" : " )?"))
            return oom(err);
    }
    for (size_t k = 0; k < json_array_size(req); k++) {
        const json_t *rk = json_array_get(req, k);
        if (!json_is_string(rk) || (props && json_object_get(props, json_string_value(rk)))) continue;
        if (tern_buf_puts(body, " ") || name_literal(body, "<parameter=", json_string_value(rk), ">\n") ||
            tern_buf_puts(body, " jvalue \"\\n</parameter>\\n\""))
            return oom(err);
    }
    return true;
}

/* The arguments of one call as a JSON object that matches the tool's parameters. */
static bool json_args(struct tern_schema_gbnf *c, size_t ti, const char *rule, const json_t *params,
                      struct tern_buf *body, struct srv_error *err) {
    if (!params || json_is_null(params)) return tern_buf_puts(body, " \"{\" ws \"}\"") ? oom(err) : true;
    char arule[64], ptr[256];
    snprintf(arule, sizeof arule, "%s-args", rule);
    enum tern_status st = tern_schema_gbnf_add(c, arule, params, ptr, sizeof ptr);
    if (st) return schema_fail(err, st, ti, ptr);
    return tern_buf_printf(body, " %s", arule) ? oom(err) : true;
}

bool srv_tool_gbnf(const struct srv_request *req, enum srv_tool_syntax syn, bool in_think, struct tern_buf *out,
                   struct srv_error *err) {
    if (syn == SRV_TOOL_SYNTAX_NONE) {
        srv_error_bad(err, "tool_choice", "'tool_choice': this model's chat template has no tool-call syntax tern can "
                      "enforce (supported: Qwen's <tool_call> JSON and <function=...> XML forms, harmony)");
        return false;
    }
    struct tern_schema_gbnf *c = NULL;
    if (tern_schema_gbnf_new(&c)) return oom(err);
    struct tern_buf alts = TERN_BUF_INIT, body = TERN_BUF_INIT;
    size_t n_calls = 0;
    bool ok = false;
    for (size_t ti = 0; ti < json_array_size(req->tools); ti++) {
        const json_t *fn = json_object_get(json_array_get(req->tools, ti), "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (req->tool_choice == SRV_TOOLS_NAMED && strcmp(name, req->tool_name)) continue;
        const json_t *params = json_object_get(fn, "parameters");
        char rule[48];
        snprintf(rule, sizeof rule, "tc%zu", ti);
        tern_buf_clear(&body);
        if (syn == SRV_TOOL_SYNTAX_HARMONY) {
            if (strpbrk(name, " \t\n<")) {
                srv_error_bad(err, "tools", "tool name '%.60s' cannot be written in a harmony recipient", name);
                goto out;
            }
            if (name_literal(&body, "<|channel|>commentary to=functions.", name, " <|constrain|>json<|message|>"))
                goto nomem;
            if (!json_args(c, ti, rule, params, &body, err)) goto out;
        } else if (syn == SRV_TOOL_SYNTAX_JSON) {
            json_t *ns = json_string(name);
            char *nj = ns ? json_dumps(ns, JSON_ENCODE_ANY) : NULL;
            json_decref(ns);
            struct tern_buf head = TERN_BUF_INIT;
            bool hok = nj && !tern_buf_printf(&head, "<tool_call>\n{\"name\": %s, \"arguments\": ", nj);
            free(nj);
            if (!hok || tern_gbnf_literal(&body, head.data, head.len)) {
                tern_buf_free(&head);
                oom(err);
                goto out;
            }
            tern_buf_free(&head);
            if (!json_args(c, ti, rule, params, &body, err)) goto out;
            if (tern_buf_puts(&body, " \"}\\n</tool_call>\"")) goto nomem;
        } else {
            if (strchr(name, '>') || strchr(name, '\n')) {
                srv_error_bad(err, "tools", "tool name '%.60s' cannot be written in the XML tool-call syntax", name);
                goto out;
            }
            if (name_literal(&body, "<tool_call>\n<function=", name, ">\n")) goto nomem;
            if (!xml_params(c, ti, rule, params, &body, err)) goto out;
            if (tern_buf_puts(&body, " \"</function>\\n</tool_call>\"")) goto nomem;
        }
        if (tern_buf_printf(&alts, "%s%s", n_calls ? " | " : "", rule)) goto nomem;
        struct tern_buf line = TERN_BUF_INIT;
        if (tern_buf_printf(&line, "%s ::= %s\n", rule, body.data) || tern_schema_gbnf_raw(c, line.data)) {
            tern_buf_free(&line);
            goto nomem;
        }
        tern_buf_free(&line);
        n_calls++;
    }
    if (n_calls == 0) {
        srv_error_bad(err, "tool_choice", "'tool_choice' names the function '%.60s', which is not among the tools",
                      req->tool_name ? req->tool_name : "");
        goto out;
    }
    struct tern_buf top = TERN_BUF_INIT;
    bool tok = !tern_buf_printf(&top, "tc-call ::= %s\n", alts.data);
    if (syn == SRV_TOOL_SYNTAX_HARMONY) {
        /* the model may think first (an analysis message), then calls */
        tok = tok && !until_rules(&top, "tc-an", "<|end|>") &&
              !tern_buf_puts(&top, "root ::= ( \"<|channel|>analysis<|message|>\" tc-an-0 \"<|start|>assistant\" )? "
                                   "tc-call\n");
    } else {
        if (tok && in_think) tok = !until_rules(&top, "tc-think", "</think>");
        tok = tok && !tern_buf_printf(&top, "root ::= %s%s\n", in_think ? "tc-think-0 \"\\n\"{0,2} " : "",
                                      req->parallel_tool_calls ? "tc-call ( \"\\n\" tc-call )*" : "tc-call");
    }
    if (!tok || tern_schema_gbnf_raw(c, top.data)) {
        tern_buf_free(&top);
        goto nomem;
    }
    tern_buf_free(&top);
    size_t n = 0;
    const char *txt = tern_schema_gbnf_text(c, &n);
    if (!txt || tern_buf_append(out, txt, n)) goto nomem;
    ok = true;
    goto out;
nomem:
    oom(err);
out:
    tern_buf_free(&alts);
    tern_buf_free(&body);
    tern_schema_gbnf_free(c);
    return ok;
}
