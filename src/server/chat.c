/* Chat formatting shared by the server and `tern run --chat` (see chat.h). */
#include "server/chat.h"

#include "server/constrain.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "util/mem.h"

#include <string.h>

/* ChatML, the format most instruction-tuned models without a stored template expect. */
static const char chatml_src[] =
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

static char *token_text_dup(const struct tern_tokenizer *tok, int32_t id) {
    size_t n = 0;
    const char *s = id >= 0 ? tern_token_text(tok, id, &n) : NULL;
    return s ? tern_strndup(s, n) : tern_strdup("");
}

enum tern_status chat_fmt_init(struct chat_fmt *cf, const struct tern_model *m, const char *override_src,
                               size_t override_len) {
    memset(cf, 0, sizeof *cf);
    cf->tok = tern_model_tokenizer(m);
    if (!cf->tok) return tern_errorf(TERN_ERR_UNSUPPORTED, "the model file has no tokenizer: chat needs one");
    const char *src = override_src;
    size_t len = override_len;
    cf->source = "file";
    if (!src) {
        src = tern_model_chat_template(m);
        len = src ? strlen(src) : 0;
        cf->source = "model";
    }
    if (!src) {
        TERN_LOG_WARN("the model has no chat template (tokenizer.chat_template): using ChatML; "
                      "pass --chat-template FILE if the model expects another format");
        src = chatml_src;
        len = sizeof chatml_src - 1;
        cf->fallback = true;
        cf->source = "chatml";
    }
    enum tern_status st = tern_template_compile(src, len, &cf->tmpl);
    if (st) return tern_error_prefix(st, "chat template (%s)", cf->source);
    cf->bos_text = token_text_dup(cf->tok, tern_token_bos(cf->tok));
    cf->eos_text = token_text_dup(cf->tok, tern_token_eos(cf->tok));
    if (!cf->bos_text || !cf->eos_text) {
        chat_fmt_free(cf);
        return tern_errorf(TERN_ERR_NOMEM, "out of memory");
    }
    /* The Qwen family's markers: in the vocabulary or in the template. */
    bool qwen = tern_token_find(cf->tok, "<think>", 7) >= 0 || tern_token_find(cf->tok, "<tool_call>", 11) >= 0 ||
                memmem(src, len, "<tool_call>", 11) || memmem(src, len, "<think>", 7);
    /* harmony (gpt-oss): its channel marker in the template or the vocabulary */
    bool harmony = memmem(src, len, "<|channel|>", 11) || tern_token_find(cf->tok, "<|channel|>", 11) >= 0;
    cf->fmt = harmony ? &reply_format_harmony : qwen ? &reply_format_qwen : &reply_format_plain;
    cf->tool_syntax = harmony ? (int)SRV_TOOL_SYNTAX_HARMONY : (int)srv_tool_syntax_detect(src, len, qwen);
    return TERN_OK;
}

void chat_fmt_free(struct chat_fmt *cf) {
    if (!cf) return;
    tern_template_free(cf->tmpl);
    free(cf->bos_text);
    free(cf->eos_text);
    memset(cf, 0, sizeof *cf);
}

/* The variables whose strings are the server's, not the request's (srv_template_vars
 * sets them after the request's extra keywords, so a request cannot supply them). */
static const char *const trusted_vars[] = {"bos_token", "eos_token", NULL};

enum tern_status chat_fmt_render(const struct chat_fmt *cf, const json_t *vars, struct tern_buf *out,
                                 struct tern_template_spans *marks) {
    if (marks) marks->n = 0;
    if (!marks || cf->parse_special_in_content) return tern_template_render(cf->tmpl, vars, NULL, out);
    return tern_template_render_spans(cf->tmpl, vars, NULL, trusted_vars, out, marks);
}

enum tern_status chat_fmt_tokenize(const struct chat_fmt *cf, const char *text, size_t n,
                                   const struct tern_template_spans *marks, int32_t **ids, size_t *n_ids, size_t *cap) {
    struct tern_tok_range *plain = NULL;
    size_t n_plain = 0;
    if (marks && marks->n && !cf->parse_special_in_content) {
        plain = tern_reallocarray(NULL, marks->n, sizeof *plain);
        if (!plain) return tern_errorf(TERN_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < marks->n && marks->v[i].start < n; i++)
            plain[n_plain++] = (struct tern_tok_range){marks->v[i].start, marks->v[i].end < n ? marks->v[i].end : n};
    }
    size_t start = *n_ids;
    int32_t bos = tern_token_bos(cf->tok);
    if (tern_tokenizer_add_bos(cf->tok) && bos >= 0) {
        /* put BOS first; removed below when the render starts with BOS itself */
        if (*n_ids == *cap) {
            size_t nc = *cap ? *cap * 2 : 64;
            int32_t *p = tern_reallocarray(*ids, nc, sizeof *p);
            if (!p) {
                free(plain);
                return tern_errorf(TERN_ERR_NOMEM, "out of memory");
            }
            *ids = p;
            *cap = nc;
        }
        (*ids)[(*n_ids)++] = bos;
    }
    size_t after_bos = *n_ids;
    enum tern_status st = tern_tokenize_plain(cf->tok, text, n, TERN_TOK_PARSE_SPECIAL, plain, n_plain, ids, n_ids, cap);
    free(plain);
    if (st) {
        *n_ids = start;
        return st;
    }
    if (after_bos > start && *n_ids > after_bos && (*ids)[after_bos] == bos) {
        memmove(*ids + start, *ids + after_bos, (*n_ids - after_bos) * sizeof **ids);
        *n_ids -= after_bos - start;
    }
    return TERN_OK;
}

static int32_t default_turn_token(const struct tern_tokenizer *tok) { return tern_token_find(tok, "<|im_start|>", 12); }

int32_t chat_turn_token(const struct chat_fmt *cf) {
    int32_t id = default_turn_token(cf->tok);
    if (id < 0 && cf->fmt && cf->fmt->harmony) id = tern_token_find(cf->tok, "<|start|>", 9);
    return id;
}

/* ---- harmony's messages --------------------------------------------------------------- */

static json_t *harmony_assistant(const json_t *m, const json_t *call, bool first) {
    json_t *a = json_copy((json_t *)m); /* shallow: only top-level keys are set or removed */
    if (!a) return NULL;
    const char *rc = json_string_value(json_object_get(a, "reasoning_content"));
    const char *th = json_string_value(json_object_get(a, "thinking"));
    const char *content = json_string_value(json_object_get(a, "content"));
    int bad = 0;
    if (!first) {
        /* the next calls of one turn: the thinking and text went with the first */
        json_object_del(a, "reasoning_content");
        json_object_del(a, "thinking");
        bad |= json_object_set_new(a, "content", json_string(""));
    } else if (!th && rc && *rc) {
        bad |= json_object_set_new(a, "thinking", json_string(rc));
        th = rc;
    }
    if (call) {
        json_t *one = json_array();
        bad |= !one || json_array_append(one, (json_t *)call) || json_object_set_new(a, "tool_calls", one);
        /* the template takes thinking or text before a call, not both: both were the
         * model's words before the call, so they join as its analysis */
        if (first && th && *th && content && *content) {
            struct tern_buf b = TERN_BUF_INIT;
            bad |= tern_buf_printf(&b, "%s\n\n%s", th, content) != TERN_OK;
            bad |= json_object_set_new(a, "thinking", json_stringn(b.data ? b.data : "", b.len));
            bad |= json_object_set_new(a, "content", json_string(""));
            tern_buf_free(&b);
        }
    }
    if (bad) {
        json_decref(a);
        return NULL;
    }
    return a;
}

static bool role_is(const json_t *m, const char *role) {
    const char *r = json_string_value(json_object_get(m, "role"));
    return r && !strcmp(r, role);
}

static bool same_id(const json_t *tool_msg, const json_t *call) {
    const char *a = json_string_value(json_object_get(tool_msg, "tool_call_id"));
    const char *b = json_string_value(json_object_get(call, "id"));
    return a && b && !strcmp(a, b);
}

json_t *chat_harmony_messages(const json_t *messages) {
    json_t *out = json_array();
    size_t n = json_array_size(messages);
    for (size_t i = 0; out && i < n; i++) {
        const json_t *m = json_array_get(messages, i);
        const json_t *calls = json_object_get(m, "tool_calls");
        bool assistant = role_is(m, "assistant");
        size_t nc = json_array_size(calls);
        if (!assistant || nc <= 1) {
            json_t *a = assistant ? harmony_assistant(m, nc ? json_array_get(calls, 0) : NULL, true) : json_incref((json_t *)m);
            if (!a || json_array_append_new(out, a)) goto fail;
            continue;
        }
        /* harmony makes one call per message: each call, then its result */
        size_t t0 = i + 1, t1 = t0;
        while (t1 < n && role_is(json_array_get(messages, t1), "tool")) t1++;
        bool *used = tern_calloc(t1 - t0 + 1, sizeof *used);
        if (!used) goto fail;
        for (size_t c = 0; c < nc; c++) {
            const json_t *call = json_array_get(calls, c);
            json_t *a = harmony_assistant(m, call, c == 0);
            if (!a || json_array_append_new(out, a)) {
                free(used);
                goto fail;
            }
            size_t pick = t1;
            for (size_t t = t0; t < t1 && pick == t1; t++)
                if (!used[t - t0] && same_id(json_array_get(messages, t), call)) pick = t;
            for (size_t t = t0; t < t1 && pick == t1; t++) /* no ids: in order */
                if (!used[t - t0] && !json_object_get(json_array_get(messages, t), "tool_call_id")) pick = t;
            if (pick < t1) {
                used[pick - t0] = true;
                if (json_array_append(out, json_array_get(messages, pick))) {
                    free(used);
                    goto fail;
                }
            }
        }
        for (size_t t = t0; t < t1; t++) /* results no call claimed keep their place at the end */
            if (!used[t - t0] && json_array_append(out, json_array_get(messages, t))) {
                free(used);
                goto fail;
            }
        free(used);
        i = t1 - 1;
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

enum tern_status chat_role_map(const struct tern_tokenizer *tok, struct cache_params *p) {
    static const struct {
        const char *header;
        enum plan_role role;
    } heads[] = {
        {"system", PLAN_ROLE_SYSTEM},   {"developer", PLAN_ROLE_SYSTEM}, {"user", PLAN_ROLE_USER},
        {"user\n<tool_response>", PLAN_ROLE_TOOL}, {"assistant", PLAN_ROLE_ASSISTANT}, {"model", PLAN_ROLE_ASSISTANT},
        {"tool", PLAN_ROLE_TOOL},       {"ipython", PLAN_ROLE_TOOL},
    };
    _Static_assert(sizeof heads / sizeof heads[0] <= CACHE_MAX_ROLES, "the role map's size");
    p->n_roles = 0;
    if (!tok) return TERN_OK;
    const int32_t turn_id = p->turn_token >= 0 ? p->turn_token : default_turn_token(tok);
    size_t tl = 0;
    const char *turn = turn_id >= 0 ? tern_token_text(tok, turn_id, &tl) : NULL;
    if (!turn) return TERN_OK;
    struct tern_buf text = TERN_BUF_INIT;
    int32_t *ids = NULL;
    size_t cap = 0;
    enum tern_status st = TERN_OK;
    for (size_t h = 0; h < sizeof heads / sizeof heads[0] && !st; h++) {
        const size_t hl = strlen(heads[h].header);
        size_t n = 0;
        tern_buf_clear(&text);
        if ((st = tern_buf_append(&text, turn, tl)) || (st = tern_buf_append(&text, heads[h].header, hl)) ||
            (st = tern_buf_append(&text, "\n", 1)) ||
            (st = tern_tokenize(tok, text.data, text.len, TERN_TOK_PARSE_SPECIAL, &ids, &n, &cap)))
            break;
        if (n < 2 || ids[0] != turn_id) continue; /* the turn token did not survive: no rule */
        struct cache_role_rule rule = {.role = heads[h].role};
        size_t bytes = 0;
        for (size_t i = 1; i < n && rule.n < CACHE_ROLE_MAX_TOKENS; i++) {
            size_t len = 0;
            if (!tern_token_piece_ref(tok, ids[i], TERN_TOK_PARSE_SPECIAL, &len) || bytes + len > hl) break;
            bytes += len;
            rule.toks[rule.n++] = ids[i];
        }
        /* at most the header's last byte may have merged with its newline; a rule that
         * covers less could pass for a shorter header's ("user" for the tool result) */
        if (rule.n && bytes + 1 >= hl) p->roles[p->n_roles++] = rule;
    }
    free(ids);
    tern_buf_free(&text);
    if (st) p->n_roles = 0;
    return st;
}
