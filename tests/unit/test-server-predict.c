/* server/predict: the predicted prefixes of the next request, rendered with the chat
 * template. Each prediction is checked against what a client really sends next — the
 * reply as the server returned it (JSON), parsed, normalised, rendered and tokenized
 * by the request path — so "predicted" means "a prefix of the real next prompt, cut at
 * a turn start". The template is written here (Qwen-style: reasoning is rendered only
 * for assistant turns after the last user message; tool results are user turns of
 * <tool_response> blocks), on a generated model's vocabulary. */
#include "harness.h"

#include "server/chat.h"
#include "server/predict.h"
#include "server/reply.h"
#include "server/request.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "util/buf.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char tmpl[] =
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if loop.index0 > ns.last_user and m.reasoning_content -%}"
    "{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- m.content -}}"
    "{%- if m.tool_calls -%}{%- for c in m.tool_calls -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + (c.function.arguments | tojson) "
    "+ '}\\n</tool_call>' -}}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

static const char tools_json[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"read\",\"description\":\"read a file\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"}}}}}]";

struct fx {
    struct tern_model *m;
    struct chat_fmt cf;
    int32_t turn;
};
static struct fx fx;

static int setup(void **state) {
    *state = &fx;
    if (fx.m) return 0;
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = th_tiny_model();
    mp.n_threads = 1;
    if (tern_model_load(&mp, &fx.m)) return -1;
    if (chat_fmt_init(&fx.cf, fx.m, tmpl, sizeof tmpl - 1)) return -1;
    fx.turn = chat_turn_token(&fx.cf);
    return fx.turn < 0 ? -1 : 0;
}

static int teardown_all(void **state) {
    (void)state;
    chat_fmt_free(&fx.cf);
    tern_model_free(fx.m);
    return 0;
}

/* The reply as the server's parser produces it from the model's text, as the message
 * object a client gets (and sends back). */
static json_t *reply_of(const char *text) {
    struct reply_parser p;
    reply_parser_init(&p, fx.cf.fmt, true, false, 42);
    assert_int_equal(reply_parser_feed(&p, text, strlen(text)), TERN_OK);
    assert_int_equal(reply_parser_finish(&p), TERN_OK);
    json_t *msg = predict_reply_message(&p);
    reply_parser_free(&p);
    assert_non_null(msg);
    return msg;
}

static json_t *messages_of(const char *json) {
    json_error_t je;
    json_t *raw = json_loads(json, 0, &je);
    if (!raw) fail_msg("bad test JSON: %s", je.text);
    struct srv_error err;
    json_t *m = srv_messages_normalise(raw, &err);
    json_decref(raw);
    if (!m) fail_msg("%s", err.message);
    return m;
}

/* The prompt of a request body, through the request path (parse, normalise, render,
 * tokenize). */
static void prompt_of(json_t *messages, int32_t **ids, size_t *n) {
    json_t *body = json_pack("{s:s,s:O,s:o}", "model", "x", "messages", messages, "tools", json_loads(tools_json, 0, NULL));
    char *txt = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    struct srv_request req;
    struct srv_error err;
    if (!srv_request_parse(SRV_EP_CHAT, txt, strlen(txt), NULL, &req, &err)) fail_msg("%s", err.message);
    free(txt);
    json_t *vars = srv_template_vars(&req, fx.cf.bos_text, fx.cf.eos_text);
    struct tern_buf text = TERN_BUF_INIT;
    struct tern_template_spans marks = {0};
    if (chat_fmt_render(&fx.cf, vars, &text, &marks)) fail_msg("render: %s", tern_last_error());
    json_decref(vars);
    srv_request_free(&req);
    size_t cap = 0;
    *ids = NULL;
    *n = 0;
    assert_int_equal(chat_fmt_tokenize(&fx.cf, text.data, text.len, &marks, ids, n, &cap), TERN_OK);
    tern_buf_free(&text);
    tern_template_spans_free(&marks);
}

/* toks[0..n) is a prefix of the prompt and the prompt has a turn start right there. */
static void assert_prefix_at_turn(const int32_t *toks, size_t n, const int32_t *prompt, size_t m) {
    assert_true(n < m);
    assert_memory_equal(toks, prompt, n * sizeof *toks);
    assert_int_equal(prompt[n], fx.turn);
}

static size_t lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

static json_t *tools(void) { return json_loads(tools_json, 0, NULL); }

static const char *const history =
    "[{\"role\":\"system\",\"content\":\"You are a coding agent.\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"What does main.c do?\"}]},"
    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"Read it first.\","
    "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"read\","
    "\"arguments\":\"{\\\"path\\\":\\\"main.c\\\"}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"int main(void) { return run(); }\"}]";

static void test_user_variant_is_the_rewrite(void **state) {
    (void)state;
    json_t *msgs = messages_of(history);
    json_t *tl = tools();
    json_t *reply = reply_of("<think>\nIt calls run.\n</think>\n\nIt calls run() and returns its status.");
    struct predict_set set;
    assert_int_equal(predict_build(&fx.cf, fx.turn, msgs, tl, NULL, reply, PREDICT_ALL, &set), TERN_OK);
    /* no tool calls: the new-user-message prediction only, (a) inside (b) */
    assert_int_equal(set.n, 1);
    const struct predict_item *it = &set.items[0];
    assert_string_equal(it->variant, "user+reply");
    assert_true(it->keep);
    assert_int_equal(it->n_marks, 1);
    assert_true(it->marks[0] > 0 && it->marks[0] < it->n);
    assert_int_equal(it->toks[it->marks[0]], fx.turn); /* the reply's turn starts at the mark */

    /* the client sends the reply back as it got it, and a new user message */
    int32_t *now = NULL, *next = NULL;
    size_t n_now, n_next;
    prompt_of(msgs, &now, &n_now);
    json_t *m2 = json_copy(msgs);
    json_array_append(m2, reply);
    json_array_append_new(m2, json_pack("{s:s,s:s}", "role", "user", "content", "And run()?"));
    prompt_of(m2, &next, &n_next);
    assert_prefix_at_turn(it->toks, it->n, next, n_next);
    /* ... which re-renders the history: the reasoning of the earlier tool-call turn is
     * gone, so the current prompt is no prefix of it (no checkpoint could help) */
    assert_true(lcp(now, n_now, next, n_next) < it->marks[0]);

    /* a client that sends back its own record of the reply still matches up to the mark */
    free(next);
    json_decref(m2);
    m2 = json_copy(msgs);
    json_array_append_new(m2, json_pack("{s:s,s:s}", "role", "assistant", "content", "(my own record of it)"));
    json_array_append_new(m2, json_pack("{s:s,s:s}", "role", "user", "content", "And run()?"));
    prompt_of(m2, &next, &n_next);
    assert_prefix_at_turn(it->toks, it->marks[0], next, n_next);
    assert_true(lcp(it->toks, it->n, next, n_next) < it->n);

    free(now);
    free(next);
    json_decref(m2);
    predict_set_free(&set);
    json_decref(reply);
    json_decref(tl);
    json_decref(msgs);
}

static void test_tool_variant_first(void **state) {
    (void)state;
    json_t *msgs = messages_of(history);
    json_t *tl = tools();
    json_t *reply = reply_of("<think>\nAnd run.\n</think>\n\n<tool_call>\n{\"name\": \"read\", \"arguments\": "
                             "{\"path\": \"run.c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"read\", \"arguments\": "
                             "{\"path\": \"run.h\"}}\n</tool_call>");
    assert_int_equal(json_array_size(json_object_get(reply, "tool_calls")), 2);
    struct predict_set set;
    assert_int_equal(predict_build(&fx.cf, fx.turn, msgs, tl, NULL, reply, PREDICT_ALL, &set), TERN_OK);
    assert_int_equal(set.n, 2);
    assert_string_equal(set.items[0].variant, "tool");
    assert_false(set.items[0].keep);
    assert_string_equal(set.items[1].variant, "user+reply");

    /* the client runs both tools and sends the results */
    json_t *m2 = json_copy(msgs);
    json_array_append(m2, reply);
    const json_t *calls = json_object_get(reply, "tool_calls");
    for (size_t i = 0; i < 2; i++)
        json_array_append_new(m2, json_pack("{s:s,s:O,s:s}", "role", "tool", "tool_call_id",
                                            json_object_get(json_array_get(calls, i), "id"), "content", "void run(void);"));
    int32_t *next = NULL;
    size_t n_next;
    prompt_of(m2, &next, &n_next);
    assert_prefix_at_turn(set.items[0].toks, set.items[0].n, next, n_next);
    /* the reply's reasoning is kept there (it follows the last user message) */
    int32_t think = tern_token_find(fx.cf.tok, "<think>", 7);
    size_t n_think = 0;
    for (size_t i = 0; i < set.items[0].n; i++) n_think += set.items[0].toks[i] == think;
    assert_int_equal(n_think, 2);
    free(next);
    json_decref(m2);
    predict_set_free(&set);

    /* --predict user: no tool variant */
    assert_int_equal(predict_build(&fx.cf, fx.turn, msgs, tl, NULL, reply, PREDICT_USER, &set), TERN_OK);
    assert_int_equal(set.n, 1);
    assert_string_equal(set.items[0].variant, "user+reply");
    predict_set_free(&set);
    /* off: nothing */
    assert_int_equal(predict_build(&fx.cf, fx.turn, msgs, tl, NULL, reply, PREDICT_OFF, &set), TERN_OK);
    assert_int_equal(set.n, 0);
    json_decref(reply);
    json_decref(tl);
    json_decref(msgs);
}

/* The cut tokens are exactly the full render's tokens before the turn token. */
static void test_cut_equals_full_tokenization(void **state) {
    (void)state;
    json_t *msgs = messages_of(history);
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", "PLACEHOLDER-1234"));
    int32_t *cut = NULL, *full = NULL;
    size_t n_cut, n_full;
    assert_int_equal(predict_render_cut(&fx.cf, fx.turn, msgs, NULL, NULL, "PLACEHOLDER-1234", &cut, &n_cut), TERN_OK);
    struct srv_request rq = {.ep = SRV_EP_CHAT, .messages = msgs};
    json_t *vars = srv_template_vars(&rq, fx.cf.bos_text, fx.cf.eos_text);
    struct tern_buf text = TERN_BUF_INIT;
    struct tern_template_spans marks = {0};
    assert_int_equal(chat_fmt_render(&fx.cf, vars, &text, &marks), TERN_OK);
    json_decref(vars);
    size_t cap = 0;
    n_full = 0;
    assert_int_equal(chat_fmt_tokenize(&fx.cf, text.data, text.len, &marks, &full, &n_full, &cap), TERN_OK);
    tern_buf_free(&text);
    tern_template_spans_free(&marks);
    assert_prefix_at_turn(cut, n_cut, full, n_full);
    /* the turn at the cut is the placeholder's: the last turn start but the header */
    size_t n_turns = 0;
    for (size_t i = n_cut; i < n_full; i++) n_turns += full[i] == fx.turn;
    assert_int_equal(n_turns, 2); /* the placeholder's and the generation header's */
    free(cut);
    free(full);

    /* a placeholder the template does not render: no cut, no crash */
    assert_int_equal(predict_render_cut(&fx.cf, fx.turn, msgs, NULL, NULL, "NOT-IN-IT", &cut, &n_cut), TERN_ERR_STATE);
    assert_null(cut);
    /* no turn token: refused */
    assert_int_equal(predict_render_cut(&fx.cf, -1, msgs, NULL, NULL, "PLACEHOLDER-1234", &cut, &n_cut),
                     TERN_ERR_STATE);
    json_decref(msgs);
}

/* A template that refuses a variant leaves it out; the others still come. */
static void test_template_refuses(void **state) {
    (void)state;
    static const char strict[] =
        "{%- for m in messages -%}"
        "{%- if not loop.first and m.role == messages[loop.index0 - 1].role -%}"
        "{{- raise_exception('roles must alternate') -}}{%- endif -%}"
        "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";
    struct chat_fmt cf;
    assert_int_equal(chat_fmt_init(&cf, fx.m, strict, sizeof strict - 1), TERN_OK);
    json_t *msgs = messages_of("[{\"role\":\"user\",\"content\":\"hi\"}]");
    json_t *reply = reply_of("hello");
    struct predict_set set;
    assert_int_equal(predict_build(&cf, fx.turn, msgs, NULL, NULL, reply, PREDICT_ALL, &set), TERN_OK);
    /* user after user is refused; user, assistant, user is fine */
    assert_int_equal(set.n, 1);
    assert_string_equal(set.items[0].variant, "reply");
    assert_false(set.items[0].keep);
    predict_set_free(&set);
    json_decref(reply);
    json_decref(msgs);
    chat_fmt_free(&cf);
}

static void test_modes(void **state) {
    (void)state;
    enum predict_mode m;
    assert_true(predict_mode_parse("off", &m));
    assert_int_equal(m, PREDICT_OFF);
    assert_true(predict_mode_parse("user", &m));
    assert_int_equal(m, PREDICT_USER);
    assert_true(predict_mode_parse("all", &m));
    assert_int_equal(m, PREDICT_ALL);
    assert_false(predict_mode_parse("some", &m));
    assert_string_equal(predict_mode_name(PREDICT_USER), "user");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_user_variant_is_the_rewrite, setup),
        cmocka_unit_test_setup(test_tool_variant_first, setup),
        cmocka_unit_test_setup(test_cut_equals_full_tokenization, setup),
        cmocka_unit_test_setup(test_template_refuses, setup),
        cmocka_unit_test(test_modes),
    };
    return cmocka_run_group_tests_name("server-predict", tests, NULL, teardown_all);
}
