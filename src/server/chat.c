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
    cf->fmt = qwen ? &reply_format_qwen : &reply_format_plain;
    cf->tool_syntax = (int)srv_tool_syntax_detect(src, len, qwen);
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

int32_t chat_turn_token(const struct chat_fmt *cf) { return default_turn_token(cf->tok); }

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
