/* Predictive priming: the predicted prefixes (see predict.h). */
#include "server/predict.h"

#include "server/request.h"
#include "server/respond.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <stdio.h>
#include <string.h>

const char *predict_mode_name(enum predict_mode m) {
    switch (m) {
    case PREDICT_OFF: return "off";
    case PREDICT_USER: return "user";
    case PREDICT_ALL: return "all";
    }
    return "?";
}

bool predict_mode_parse(const char *s, enum predict_mode *out) {
    if (!strcmp(s, "off")) *out = PREDICT_OFF;
    else if (!strcmp(s, "user")) *out = PREDICT_USER;
    else if (!strcmp(s, "all")) *out = PREDICT_ALL;
    else return false;
    return true;
}

void predict_set_free(struct predict_set *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) free(s->items[i].toks);
    memset(s, 0, sizeof *s);
}

json_t *predict_reply_message(const struct reply_parser *p) {
    /* The very message object the client received, so that what is predicted is what
     * a client that sends the reply back verbatim sends. */
    struct srv_resp_ctx ctx = {.id = "predict", .model = "", .created = 0, .ep = SRV_EP_CHAT};
    struct srv_usage u = {0};
    json_t *resp = srv_response_chat(&ctx, p, "stop", &u, NULL);
    json_t *msg = json_object_get(json_array_get(json_object_get(resp, "choices"), 0), "message");
    json_t *arr = msg ? json_pack("[O]", msg) : NULL;
    json_decref(resp);
    if (!arr) return NULL;
    struct srv_error err;
    json_t *norm = srv_messages_normalise(arr, &err);
    json_decref(arr);
    json_t *out = norm ? json_incref(json_array_get(norm, 0)) : NULL;
    json_decref(norm);
    return out;
}

/* The last occurrence of needle in hay[0..n), or NULL. */
static const char *find_last(const char *hay, size_t n, const char *needle, size_t nl) {
    if (nl == 0 || nl > n) return NULL;
    for (size_t i = n - nl + 1; i-- > 0;)
        if (hay[i] == needle[0] && !memcmp(hay + i, needle, nl)) return hay + i;
    return NULL;
}

enum tern_status predict_render_cut(const struct chat_fmt *cf, int32_t turn_token, const json_t *messages,
                                    const json_t *tools, const json_t *kwargs, const char *placeholder,
                                    int32_t **toks, size_t *n) {
    *toks = NULL;
    *n = 0;
    size_t tl = 0;
    const char *turn_text = turn_token >= 0 ? tern_token_text(cf->tok, turn_token, &tl) : NULL;
    if (!turn_text || tl == 0) return tern_errorf(TERN_ERR_STATE, "predict: no turn-start token to cut at");
    /* The same variables a request gets (srv_template_vars), with these messages. */
    struct srv_request rq = {.ep = SRV_EP_CHAT};
    rq.messages = (json_t *)messages;
    rq.tools = (json_t *)tools;
    rq.template_kwargs = (json_t *)kwargs;
    json_t *vars = srv_template_vars(&rq, cf->bos_text, cf->eos_text);
    if (!vars) return tern_errorf(TERN_ERR_NOMEM, "predict: out of memory for template variables");
    struct tern_buf text = TERN_BUF_INIT;
    struct tern_template_spans marks = {0}; /* tokenized as a request's prompt is */
    enum tern_status st = chat_fmt_render(cf, vars, &text, &marks);
    json_decref(vars);
    if (st) {
        tern_buf_free(&text);
        tern_template_spans_free(&marks);
        return st == TERN_ERR_NOMEM ? st : tern_error_prefix(TERN_ERR_STATE, "predict: the template refused");
    }
    size_t pl = strlen(placeholder);
    const char *ph = text.data ? memmem(text.data, text.len, placeholder, pl) : NULL;
    const char *cut = ph ? find_last(text.data, (size_t)(ph - text.data), turn_text, tl) : NULL;
    if (!cut) {
        tern_buf_free(&text);
        tern_template_spans_free(&marks);
        return tern_errorf(TERN_ERR_STATE, "predict: %s", ph ? "no turn start before the placeholder"
                                                            : "the template did not render the placeholder");
    }
    /* Tokenize through the turn token itself: it must come out as the turn token, which
     * proves the cut is a token boundary of the full render. */
    size_t cap = 0;
    st = chat_fmt_tokenize(cf, text.data, (size_t)(cut - text.data) + tl, &marks, toks, n, &cap);
    tern_buf_free(&text);
    tern_template_spans_free(&marks);
    if (st) {
        free(*toks);
        *toks = NULL;
        *n = 0;
        return st == TERN_ERR_NOMEM ? st : tern_error_prefix(TERN_ERR_STATE, "predict: tokenizing");
    }
    if (*n < 2 || (*toks)[*n - 1] != turn_token) {
        free(*toks);
        *toks = NULL;
        *n = 0;
        return tern_errorf(TERN_ERR_STATE, "predict: the cut does not fall on the turn token");
    }
    (*n)--;
    return TERN_OK;
}

/* base + extra messages, as a new array (the elements are shared). */
static json_t *with_messages(const json_t *base, json_t *const *extra, size_t n_extra) {
    json_t *a = json_array();
    if (!a || json_array_extend(a, (json_t *)base)) {
        json_decref(a);
        return NULL;
    }
    for (size_t i = 0; i < n_extra; i++) {
        if (!extra[i] || json_array_append(a, extra[i])) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* Renders and cuts one variant. NOMEM is an error; any other failure leaves the variant
 * out (*toks NULL). */
static enum tern_status variant(const struct chat_fmt *cf, int32_t turn_token, json_t *msgs, const json_t *tools,
                                const json_t *kwargs, const char *ph, const char *name, int32_t **toks, size_t *n) {
    *toks = NULL;
    *n = 0;
    if (msgs && cf->fmt && cf->fmt->harmony) {
        json_t *hm = chat_harmony_messages(msgs);
        json_decref(msgs);
        msgs = hm;
    }
    if (!msgs) return tern_errorf(TERN_ERR_NOMEM, "predict: out of memory");
    enum tern_status st = predict_render_cut(cf, turn_token, msgs, tools, kwargs, ph, toks, n);
    json_decref(msgs);
    if (st == TERN_ERR_NOMEM) return st;
    if (st) TERN_LOG_DEBUG("predict: variant %s left out: %s", name, tern_last_error());
    return TERN_OK;
}

static void add_item(struct predict_set *s, const char *name, int32_t *toks, size_t n, uint32_t mark, bool keep) {
    struct predict_item *it = &s->items[s->n++];
    it->keep = keep;
    it->variant = name;
    it->toks = toks;
    it->n = n;
    it->n_marks = 0;
    if (mark > 0) it->marks[it->n_marks++] = mark;
}

enum tern_status predict_build(const struct chat_fmt *cf, int32_t turn_token, const json_t *messages,
                               const json_t *tools, const json_t *kwargs, const json_t *reply, enum predict_mode mode,
                               struct predict_set *out) {
    memset(out, 0, sizeof *out);
    if (mode == PREDICT_OFF || !json_is_array(messages) || !json_is_object(reply)) return TERN_OK;
    /* A placeholder no conversation contains: the render is cut where it appears. */
    char ph[48];
    snprintf(ph, sizeof ph, "tern-predict-%016llx", (unsigned long long)(tern_now_ns() * 0x9e3779b97f4a7c15ull));
    enum tern_status st = TERN_OK;
    json_t *user = json_pack("{s:s,s:s}", "role", "user", "content", ph);
    if (!user) return tern_errorf(TERN_ERR_NOMEM, "predict: out of memory");

    const json_t *calls = json_object_get(reply, "tool_calls");
    size_t n_calls = json_array_size(calls);
    if (mode == PREDICT_ALL && n_calls > 0) {
        /* The client runs the tools and sends one result per call. */
        json_t *extra[1 + 64] = {(json_t *)reply};
        size_t n_extra = 1;
        for (size_t i = 0; i < n_calls && n_extra < TERN_ARRAY_LEN(extra); i++) {
            const json_t *id = json_object_get(json_array_get(calls, i), "id");
            extra[n_extra++] = json_pack("{s:s,s:s,s:s}", "role", "tool", "tool_call_id",
                                         json_is_string(id) ? json_string_value(id) : "", "content", ph);
        }
        int32_t *t = NULL;
        size_t n = 0;
        st = variant(cf, turn_token, with_messages(messages, extra, n_extra), tools, kwargs, ph, "tool", &t, &n);
        for (size_t i = 1; i < n_extra; i++) json_decref(extra[i]);
        if (st) goto fail;
        if (t) add_item(out, "tool", t, n, 0, false);
    }

    int32_t *ta = NULL, *tb = NULL;
    size_t na = 0, nb = 0;
    json_t *ea[1] = {user};
    st = variant(cf, turn_token, with_messages(messages, ea, 1), tools, kwargs, ph, "user", &ta, &na);
    if (st) goto fail;
    json_t *eb[2] = {(json_t *)reply, user};
    st = variant(cf, turn_token, with_messages(messages, eb, 2), tools, kwargs, ph, "reply", &tb, &nb);
    if (st) {
        free(ta);
        goto fail;
    }
    if (ta && tb && na < nb && !memcmp(ta, tb, na * sizeof *ta)) {
        /* One prediction: the reply's prefix with a checkpoint where the request's own
         * messages end (what a client that re-serialises the reply still matches). */
        free(ta);
        add_item(out, "user+reply", tb, nb, (uint32_t)na, true);
    } else {
        if (ta) add_item(out, "user", ta, na, 0, true);
        if (tb) add_item(out, "reply", tb, nb, 0, false);
    }
    json_decref(user);
    return TERN_OK;

fail:
    json_decref(user);
    predict_set_free(out);
    return st;
}
