/* server/reply: stop strings and the Qwen output parser, fed split at every byte
 * boundary and one byte at a time; the deltas must add up to the final result and
 * never carry a piece of a marker. */
#include "harness.h"

#include "server/reply.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct expect {
    const char *content;
    const char *reasoning;
    size_t n_calls;
    const char *names[3];
    const char *args[3];
};

struct collected {
    struct tern_buf content, reasoning;
    struct tern_buf args[8];
    char names[8][64];
    char ids[8][40];
    size_t n_calls;
};

static void collect(struct reply_parser *p, struct collected *c) {
    struct reply_delta *d = reply_parser_delta(p);
    tern_buf_append(&c->content, d->content.data, d->content.len);
    tern_buf_append(&c->reasoning, d->reasoning.data, d->reasoning.len);
    for (size_t i = 0; i < d->n_calls; i++) {
        struct reply_delta_call *dc = &d->calls[i];
        assert_true(dc->index < 8);
        if (dc->begin) {
            /* a call begins exactly once, in order, before any of its arguments */
            assert_int_equal(dc->index, c->n_calls);
            snprintf(c->names[dc->index], 64, "%s", p->calls[dc->index].name);
            snprintf(c->ids[dc->index], 40, "%s", p->calls[dc->index].id);
            c->n_calls++;
        } else {
            assert_true(dc->index < c->n_calls);
        }
        tern_buf_append(&c->args[dc->index], dc->args.data, dc->args.len);
    }
    reply_delta_reset(d);
}

static const char *s_or_empty(const struct tern_buf *b) { return b->data ? b->data : ""; }

static const struct reply_format *g_fmt = &reply_format_qwen;

static void check_one(const char *text, const size_t *cuts, size_t n_cuts, bool tools, bool in_think,
                      const struct expect *e) {
    struct reply_parser p;
    reply_parser_init(&p, g_fmt, tools, in_think, 42);
    struct collected c;
    memset(&c, 0, sizeof c);
    size_t prev = 0, n = strlen(text);
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t at = i < n_cuts ? cuts[i] : n;
        assert_int_equal(reply_parser_feed(&p, text + prev, at - prev), TERN_OK);
        collect(&p, &c);
        prev = at;
    }
    assert_int_equal(reply_parser_finish(&p), TERN_OK);
    collect(&p, &c);
    const char *ctx = text;
    if (strcmp(s_or_empty(&c.content), e->content)) fail_msg("content '%s' != '%s' for %s", c.content.data, e->content, ctx);
    if (strcmp(s_or_empty(&c.reasoning), e->reasoning))
        fail_msg("reasoning '%s' != '%s' for %s", c.reasoning.data, e->reasoning, ctx);
    assert_string_equal(s_or_empty(&p.content), e->content);
    assert_string_equal(s_or_empty(&p.reasoning), e->reasoning);
    assert_int_equal(c.n_calls, e->n_calls);
    assert_int_equal(p.n_calls, e->n_calls);
    for (size_t i = 0; i < e->n_calls; i++) {
        assert_string_equal(c.names[i], e->names[i]);
        if (strcmp(s_or_empty(&c.args[i]), e->args[i])) fail_msg("args '%s' != '%s' for %s", c.args[i].data, e->args[i], ctx);
        assert_string_equal(s_or_empty(&p.calls[i].args), e->args[i]);
        assert_int_equal(strlen(c.ids[i]), 29);
        assert_memory_equal(c.ids[i], "call_", 5);
        json_t *j = json_loads(e->args[i], JSON_DECODE_ANY, NULL);
        assert_non_null(j); /* the streamed arguments are JSON */
        json_decref(j);
    }
    if (e->n_calls == 2) assert_string_not_equal(c.ids[0], c.ids[1]);
    tern_buf_free(&c.content);
    tern_buf_free(&c.reasoning);
    for (int i = 0; i < 8; i++) tern_buf_free(&c.args[i]);
    reply_parser_free(&p);
}

/* Whole, every single cut, every pair of cuts (short inputs), and byte by byte. */
static void check_all_splits(const char *text, bool tools, bool in_think, const struct expect *e) {
    size_t n = strlen(text);
    check_one(text, NULL, 0, tools, in_think, e);
    for (size_t i = 0; i <= n; i++) check_one(text, &i, 1, tools, in_think, e);
    if (n <= 80) {
        for (size_t i = 0; i <= n; i++)
            for (size_t j = i; j <= n; j++) {
                size_t cuts[2] = {i, j};
                check_one(text, cuts, 2, tools, in_think, e);
            }
    }
    size_t *all = malloc((n + 1) * sizeof *all);
    for (size_t i = 0; i < n; i++) all[i] = i + 1;
    check_one(text, all, n ? n - 1 : 0, tools, in_think, e);
    free(all);
}

static void test_plain_content(void **state) {
    (void)state;
    struct expect e = {.content = "Hello, world: x < y and <b>bold</b>", .reasoning = ""};
    check_all_splits("Hello, world: x < y and <b>bold</b>", true, false, &e);
    struct expect e2 = {.content = "a <thi", .reasoning = ""};
    check_all_splits("a <thi", true, false, &e2);
    struct expect e3 = {.content = "", .reasoning = ""};
    check_all_splits("", true, false, &e3);
}

static void test_reasoning(void **state) {
    (void)state;
    struct expect e = {.content = "The answer is 4.", .reasoning = "2 + 2\nis 4"};
    check_all_splits("<think>\n2 + 2\nis 4\n</think>\n\nThe answer is 4.", true, false, &e);
    /* the template opened <think> in the prompt */
    check_all_splits("2 + 2\nis 4\n</think>\n\nThe answer is 4.", true, true, &e);
    /* cut off while thinking */
    struct expect e2 = {.content = "", .reasoning = "still thinking"};
    check_all_splits("<think>\nstill thinking\n", true, false, &e2);
    /* <think> after content is text */
    struct expect e3 = {.content = "Hi <think>x</think>", .reasoning = ""};
    check_all_splits("Hi <think>x</think>", true, false, &e3);
    /* empty reasoning block (enable_thinking=false style output) */
    struct expect e4 = {.content = "ok", .reasoning = ""};
    check_all_splits("<think>\n\n</think>\n\nok", true, false, &e4);
}

static void test_tool_call_json(void **state) {
    (void)state;
    struct expect e = {.content = "Let me check.",
                       .reasoning = "need weather",
                       .n_calls = 1,
                       .names = {"get_weather"},
                       .args = {"{\"city\": \"Paris \\\"}\", \"n\": [1, {\"k\": 2}]}"}};
    check_all_splits("<think>need weather</think>\n\nLet me check.\n\n<tool_call>\n{\"name\": \"get_weather\", "
                     "\"arguments\": {\"city\": \"Paris \\\"}\", \"n\": [1, {\"k\": 2}]}}\n</tool_call>",
                     true, false, &e);
    struct expect e2 = {.content = "",
                        .reasoning = "",
                        .n_calls = 2,
                        .names = {"a", "b"},
                        .args = {"{\"x\":1}", "{}"}};
    check_all_splits("<tool_call>\n{\"name\":\"a\",\"arguments\":{\"x\":1}}\n</tool_call>\n"
                     "<tool_call>\n{\"name\":\"b\"}\n</tool_call>",
                     true, false, &e2);
    /* arguments before the name, and arguments given as a JSON string */
    struct expect e3 = {.content = "", .reasoning = "", .n_calls = 2, .names = {"f", "g"}, .args = {"{\"a\": 1}", "{\"q\":\"x\"}"}};
    check_all_splits("<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>"
                     "<tool_call>{\"name\": \"g\", \"arguments\": \"{\\\"q\\\":\\\"x\\\"}\"}</tool_call>",
                     true, false, &e3);
}

static void test_tool_call_xml(void **state) {
    (void)state;
    struct expect e = {.content = "",
                       .reasoning = "",
                       .n_calls = 1,
                       .names = {"get_weather"},
                       .args = {"{\"city\":\"Paris\",\"days\":3}"}};
    check_all_splits("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                     "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
                     true, false, &e);
}

/* A value that itself holds "</parameter>" (code that writes this syntax) is kept whole:
 * a value ends at the </parameter> the next parameter or </function> follows. */
static void test_tool_call_xml_nested_close(void **state) {
    (void)state;
    struct expect e = {.content = "",
                       .reasoning = "",
                       .n_calls = 1,
                       .names = {"write"},
                       .args = {"{\"text\":\"a</parameter>b\\n</parameter> c\",\"n\":2}"}};
    check_all_splits("<tool_call>\n<function=write>\n<parameter=text>\na</parameter>b\n</parameter> c\n</parameter>\n"
                     "<parameter=n>\n2\n</parameter>\n</function>\n</tool_call>",
                     true, false, &e);
}

static void test_not_a_tool_call(void **state) {
    (void)state;
    struct expect e = {.content = "<tool_call>oops</tool_call>", .reasoning = ""};
    check_all_splits("<tool_call>oops</tool_call>", true, false, &e);
    /* tools not enabled: the markers are text */
    struct expect e2 = {.content = "<tool_call>{\"name\":\"f\"}</tool_call>", .reasoning = ""};
    check_all_splits("<tool_call>{\"name\":\"f\"}</tool_call>", false, false, &e2);
}

/* harmony (gpt-oss): channels, recipients in either place of the header, and text that
 * is not harmony, all fed at every split. */
static void test_harmony(void **state) {
    (void)state;
    g_fmt = &reply_format_harmony;
    struct expect e = {.content = "It is 4.", .reasoning = "2 + 2 is 4"};
    check_all_splits("<|channel|>analysis<|message|>2 + 2 is 4<|end|><|start|>assistant<|channel|>final<|message|>"
                     "It is 4.",
                     true, false, &e);
    /* a tool call as the model writes it, after a preamble on commentary */
    struct expect e2 = {.content = "Checking.",
                        .reasoning = "need weather",
                        .n_calls = 1,
                        .names = {"get_weather"},
                        .args = {"{\"city\":\"Paris <|x\"}"}};
    check_all_splits("<|channel|>analysis<|message|>need weather<|end|><|start|>assistant<|channel|>commentary"
                     "<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
                     "<|constrain|>json<|message|>{\"city\":\"Paris <|x\"}",
                     true, false, &e2);
    /* the recipient in the role part of the header, as the template renders it; <|call|> shown */
    struct expect e3 = {.content = "", .reasoning = "", .n_calls = 1, .names = {"ls"}, .args = {"{}"}};
    check_all_splits("<|start|>assistant to=functions.ls<|channel|>commentary json<|message|><|call|>", true, false,
                     &e3);
    /* without tools a recipient's message is content */
    struct expect e4 = {.content = "{\"a\":1}", .reasoning = ""};
    check_all_splits("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":1}", false, false, &e4);
    /* two analysis messages are two paragraphs; a cut-off header is text */
    struct expect e5 = {.content = "<|channel|>fin", .reasoning = "a\n\nb"};
    check_all_splits("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
                     "<|channel|>fin",
                     true, false, &e5);
    /* plain text, and text around messages, is content */
    struct expect e6 = {.content = "Hello <|chan and bye", .reasoning = ""};
    check_all_splits("Hello <|chan and bye", true, false, &e6);
    struct expect e7 = {.content = "hi\n\nthere", .reasoning = ""};
    check_all_splits("hi<|channel|>final<|message|>there<|return|>", true, false, &e7);
    /* a header that never ends is text, however long */
    char big[1400] = "<|channel|>";
    memset(big + 11, 'x', 1300);
    big[1311] = 0;
    struct expect e8 = {.content = big, .reasoning = ""};
    check_one(big, NULL, 0, true, false, &e8);
    size_t cuts[3] = {5, 700, 1200};
    check_one(big, cuts, 3, true, false, &e8);
    g_fmt = &reply_format_qwen;
}

static void check_stop(const char *text, const char *const *stops, size_t n_stops, const char *want, bool stopped) {
    size_t n = strlen(text);
    for (size_t cut = 0; cut <= n; cut++) {
        for (int bytewise = 0; bytewise < 2; bytewise++) {
            struct stop_matcher m;
            stop_matcher_init(&m, stops, n_stops);
            struct tern_buf out = TERN_BUF_INIT;
            if (bytewise) {
                for (size_t i = 0; i < n; i++) assert_int_equal(stop_matcher_feed(&m, text + i, 1, &out), TERN_OK);
            } else {
                assert_int_equal(stop_matcher_feed(&m, text, cut, &out), TERN_OK);
                assert_int_equal(stop_matcher_feed(&m, text + cut, n - cut, &out), TERN_OK);
            }
            /* nothing that might still be a stop string has been let out */
            for (size_t s = 0; s < n_stops; s++) assert_null(out.data ? strstr(out.data, stops[s]) : NULL);
            assert_int_equal(m.stopped, stopped);
            stop_matcher_flush(&m, &out);
            assert_string_equal(out.data ? out.data : "", want);
            tern_buf_free(&out);
            stop_matcher_free(&m);
        }
    }
}

static void test_stop_strings(void **state) {
    (void)state;
    const char *stops[] = {"END", "\n\n", "ab"};
    check_stop("hello EN world END more", stops, 3, "hello EN world ", true);
    check_stop("one\ntwo\n\nthree", stops, 3, "one\ntwo", true);
    check_stop("x a EN", stops, 3, "x a EN", false);
    check_stop("aab", stops, 3, "a", true);
    check_stop("caf\xc3\xa9 ab", stops, 3, "caf\xc3\xa9 ", true);
    check_stop("no stops", NULL, 0, "no stops", false);
}

static void test_prompt_opens_think(void **state) {
    (void)state;
    const char *a = "<|im_start|>assistant\n<think>\n";
    const char *b = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    assert_true(reply_prompt_opens_think(&reply_format_qwen, a, strlen(a)));
    assert_false(reply_prompt_opens_think(&reply_format_qwen, b, strlen(b)));
    assert_false(reply_prompt_opens_think(&reply_format_plain, a, strlen(a)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_content),
        cmocka_unit_test(test_reasoning),
        cmocka_unit_test(test_tool_call_json),
        cmocka_unit_test(test_tool_call_xml),
        cmocka_unit_test(test_tool_call_xml_nested_close),
        cmocka_unit_test(test_not_a_tool_call),
        cmocka_unit_test(test_harmony),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_prompt_opens_think),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
