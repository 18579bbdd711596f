/* server/constrain: the structured-output fields of a request (grammar, response_format,
 * json_schema, parallel_tool_calls, a named tool_choice) and the tool-call grammars in
 * both syntaxes, checked by matching the texts the reply parser reads. */
#include "harness.h"

#include "grammar/grammar.h"
#include "server/constrain.h"
#include "server/reply.h"
#include "server/request.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool parse(enum srv_endpoint ep, const char *body, struct srv_request *req, struct srv_error *err) {
    struct srv_parse_opts o = {.max_body = 1 << 20};
    memset(err, 0, sizeof *err);
    return srv_request_parse(ep, body, strlen(body), &o, req, err);
}

static bool matches(const struct tern_grammar *g, const char *s) {
    struct tern_gmatch *m = NULL;
    assert_int_equal(tern_gmatch_new(g, NULL, &m), TERN_OK);
    bool ok = tern_gmatch_matches(m, s, strlen(s));
    tern_gmatch_free(m);
    return ok;
}

static void expect_error(enum srv_endpoint ep, const char *body, const char *param, const char *needle) {
    struct srv_request req;
    struct srv_error err;
    if (parse(ep, body, &req, &err)) fail_msg("accepted: %s", body);
    assert_int_equal(err.status, 400);
    if (strcmp(err.param, param)) fail_msg("param '%s', wanted '%s' (%s)", err.param, param, err.message);
    if (!strstr(err.message, needle)) fail_msg("message '%s' lacks '%s'", err.message, needle);
}

static void test_fields(void **state) {
    (void)state;
    struct srv_request req;
    struct srv_error err;
    /* no constraint: nothing compiled */
    assert_true(parse(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &req, &err));
    assert_null(req.grammar);
    assert_true(req.parallel_tool_calls);
    srv_request_free(&req);
    assert_true(parse(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"text\"}}",
                      &req, &err));
    assert_null(req.grammar);
    srv_request_free(&req);
    /* json_object */
    assert_true(parse(SRV_EP_COMPLETION, "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}", &req, &err));
    assert_non_null(req.grammar);
    assert_true(matches(req.grammar, "{\"a\": [1, {\"b\": null}]}"));
    assert_false(matches(req.grammar, "[1]"));
    srv_request_free(&req);
    /* json_schema, its llama.cpp forms, grammar */
    const char *bodies[] = {
        "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"strict\":true,"
        "\"schema\":{\"type\":\"integer\",\"minimum\":3,\"maximum\":5}}}}",
        "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\",\"schema\":{\"type\":\"integer\",\"minimum\":3,"
        "\"maximum\":5}}}",
        "{\"prompt\":\"x\",\"json_schema\":{\"type\":\"integer\",\"minimum\":3,\"maximum\":5}}",
        "{\"prompt\":\"x\",\"grammar\":\"root ::= [3-5]\"}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        assert_true(parse(SRV_EP_COMPLETION, bodies[i], &req, &err));
        assert_non_null(req.grammar);
        assert_true(matches(req.grammar, "4"));
        assert_false(matches(req.grammar, "6"));
        srv_request_free(&req);
    }
    /* no schema: any JSON value */
    assert_true(parse(SRV_EP_COMPLETION, "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\"}}}",
                      &req, &err));
    assert_true(matches(req.grammar, "\"s\""));
    srv_request_free(&req);
    /* named tool_choice and parallel_tool_calls */
    assert_true(parse(SRV_EP_CHAT,
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":"
                      "{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                      "\"parallel_tool_calls\":false}",
                      &req, &err));
    assert_int_equal(req.tool_choice, SRV_TOOLS_NAMED);
    assert_string_equal(req.tool_name, "f");
    assert_false(req.parallel_tool_calls);
    assert_true(srv_tools_enforced(&req));
    srv_request_free(&req);
}

static void test_errors(void **state) {
    (void)state;
    expect_error(SRV_EP_COMPLETION, "{\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\\\"\\nfoo ::= [z-a]\"}", "grammar",
                 "line 2, column 10");
    expect_error(SRV_EP_COMPLETION, "{\"prompt\":\"x\",\"grammar\":5}", "grammar", "must be a string");
    expect_error(SRV_EP_COMPLETION, "{\"prompt\":\"x\",\"response_format\":{\"type\":\"xml\"}}", "response_format.type",
                 "must be text, json_object or json_schema");
    expect_error(SRV_EP_COMPLETION, "{\"prompt\":\"x\",\"response_format\":\"json\"}", "response_format", "object");
    expect_error(SRV_EP_COMPLETION, "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\"}}",
                 "response_format.json_schema", "must be an object");
    expect_error(SRV_EP_COMPLETION,
                 "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":"
                 "\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"idn-email\"}}}}}}",
                 "response_format.json_schema.schema#/properties/a/format", "format 'idn-email'");
    expect_error(SRV_EP_COMPLETION, "{\"prompt\":\"x\",\"json_schema\":{\"if\":{}}}", "json_schema#/if", "'if'");
    expect_error(SRV_EP_COMPLETION, "{\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\\\"\",\"json_schema\":{}}",
                 "json_schema", "cannot be combined");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"parallel_tool_calls\":1}",
                 "parallel_tool_calls", "boolean");
}

static struct tern_grammar *tool_grammar(const char *tools_json, enum srv_tool_choice choice, const char *name,
                                         bool parallel, enum srv_tool_syntax syn, bool in_think) {
    struct srv_request req;
    memset(&req, 0, sizeof req);
    req.tools = json_loads(tools_json, 0, NULL);
    assert_non_null(req.tools);
    req.tool_choice = choice;
    req.tool_name = (char *)name;
    req.parallel_tool_calls = parallel;
    struct tern_buf b = TERN_BUF_INIT;
    struct srv_error err;
    if (!srv_tool_gbnf(&req, syn, in_think, &b, &err)) fail_msg("tool grammar: %s", err.message);
    struct tern_grammar *g = NULL;
    if (tern_grammar_compile(b.data, b.len, NULL, &g)) fail_msg("%s\n%s", tern_last_error(), b.data);
    tern_buf_free(&b);
    json_decref(req.tools);
    return g;
}

static const char *tools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"read\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"path\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"}},\"required\":[\"path\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"ls\"}}]";

static void test_tool_json(void **state) {
    (void)state;
    struct tern_grammar *g = tool_grammar(tools, SRV_TOOLS_REQUIRED, NULL, true, SRV_TOOL_SYNTAX_JSON, false);
    const char *a = "<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"a.c\", \"n\": 2}}\n</tool_call>";
    const char *b = "<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}\n</tool_call>";
    char two[512];
    snprintf(two, sizeof two, "%s\n%s", a, b);
    assert_true(matches(g, a));
    assert_true(matches(g, b));
    assert_true(matches(g, two));
    assert_false(matches(g, "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>"));
    assert_false(matches(g, "<tool_call>\n{\"name\": \"read\", \"arguments\": {\"n\": 2}}\n</tool_call>"));
    assert_false(matches(g, "hello"));
    assert_false(matches(g, ""));
    tern_grammar_free(g);
    /* one call only; a named function */
    g = tool_grammar(tools, SRV_TOOLS_NAMED, "ls", false, SRV_TOOL_SYNTAX_JSON, false);
    assert_true(matches(g, b));
    assert_false(matches(g, a));
    snprintf(two, sizeof two, "%s\n%s", b, b);
    assert_false(matches(g, two));
    tern_grammar_free(g);
    /* a prompt that opened <think>: the output closes it first */
    g = tool_grammar(tools, SRV_TOOLS_REQUIRED, NULL, true, SRV_TOOL_SYNTAX_JSON, true);
    snprintf(two, sizeof two, "let me see </thin </think>\n\n%s", b);
    assert_true(matches(g, two));
    snprintf(two, sizeof two, "</think>%s", b);
    assert_true(matches(g, two));
    snprintf(two, sizeof two, "x </think> y </think>\n%s", b);
    assert_false(matches(g, two));
    assert_false(matches(g, b));
    tern_grammar_free(g);
}

static void test_tool_xml(void **state) {
    (void)state;
    struct tern_grammar *g = tool_grammar(tools, SRV_TOOLS_REQUIRED, NULL, true, SRV_TOOL_SYNTAX_XML, false);
    assert_true(matches(g, "<tool_call>\n<function=read>\n<parameter=path>\n\"a.c\"\n</parameter>\n"
                           "<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>"));
    assert_true(matches(g, "<tool_call>\n<function=read>\n<parameter=path>\n\"a.c\"\n</parameter>\n</function>\n</tool_call>"));
    assert_true(matches(g, "<tool_call>\n<function=ls>\n</function>\n</tool_call>"));
    assert_false(matches(g, "<tool_call>\n<function=read>\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>"));
    assert_false(matches(g, "<tool_call>\n<function=read>\n<parameter=path>\na.c\n</parameter>\n</function>\n</tool_call>"));
    tern_grammar_free(g);
    /* refusals */
    struct srv_request req;
    memset(&req, 0, sizeof req);
    req.tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"anyOf\":[{}]}}}]", 0, NULL);
    req.tool_choice = SRV_TOOLS_REQUIRED;
    struct tern_buf b = TERN_BUF_INIT;
    struct srv_error err;
    assert_false(srv_tool_gbnf(&req, SRV_TOOL_SYNTAX_XML, false, &b, &err));
    assert_string_equal(err.param, "tools[0].function.parameters");
    assert_false(srv_tool_gbnf(&req, SRV_TOOL_SYNTAX_NONE, false, &b, &err));
    assert_string_equal(err.param, "tool_choice");
    json_decref(req.tools);
    req.tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                           "\"properties\":{\"q\":{\"not\":{}}}}}}]", 0, NULL);
    assert_false(srv_tool_gbnf(&req, SRV_TOOL_SYNTAX_JSON, false, &b, &err));
    assert_string_equal(err.param, "tools[0].function.parameters#/properties/q/not");
    req.tool_choice = SRV_TOOLS_NAMED;
    req.tool_name = "g";
    assert_false(srv_tool_gbnf(&req, SRV_TOOL_SYNTAX_JSON, false, &b, &err));
    assert_non_null(strstr(err.message, "not among the tools"));
    json_decref(req.tools);
    tern_buf_free(&b);
    /* detection */
    assert_int_equal(srv_tool_syntax_detect("{{ '<function=' }}", 17, true), SRV_TOOL_SYNTAX_XML);
    assert_int_equal(srv_tool_syntax_detect("<tool_call>", 11, true), SRV_TOOL_SYNTAX_JSON);
    assert_int_equal(srv_tool_syntax_detect("plain", 5, false), SRV_TOOL_SYNTAX_NONE);
}

/* harmony (gpt-oss): an optional analysis message, then exactly one call in the form
 * the reply parser reads; the parser turns each accepted text into that call. */
static void test_tool_harmony(void **state) {
    (void)state;
    struct tern_grammar *g = tool_grammar(tools, SRV_TOOLS_REQUIRED, NULL, true, SRV_TOOL_SYNTAX_HARMONY, false);
    const char *a = "<|channel|>commentary to=functions.read <|constrain|>json<|message|>{\"path\": \"a.c\"}";
    const char *b = "<|channel|>analysis<|message|>I should list <|en it.<|end|><|start|>assistant"
                    "<|channel|>commentary to=functions.ls <|constrain|>json<|message|>{}";
    assert_true(matches(g, a));
    assert_true(matches(g, b));
    assert_false(matches(g, "<|channel|>commentary to=functions.rm <|constrain|>json<|message|>{}"));
    assert_false(matches(g, "<|channel|>commentary to=functions.read <|constrain|>json<|message|>{\"n\": 2}"));
    assert_false(matches(g, "<|channel|>final<|message|>hello"));
    assert_false(matches(g, "<|channel|>analysis<|message|>x<|end|> y<|end|><|start|>assistant<|channel|>commentary "
                            "to=functions.ls <|constrain|>json<|message|>{}"));
    char two[600];
    snprintf(two, sizeof two, "%s%s", a, a);
    assert_false(matches(g, two)); /* a call ends the turn */
    tern_grammar_free(g);
    g = tool_grammar(tools, SRV_TOOLS_NAMED, "ls", true, SRV_TOOL_SYNTAX_HARMONY, false);
    assert_true(matches(g, b));
    assert_false(matches(g, a));
    tern_grammar_free(g);
    const char *texts[] = {a, b};
    const char *names[] = {"read", "ls"};
    for (size_t i = 0; i < 2; i++) {
        struct reply_parser p;
        reply_parser_init(&p, &reply_format_harmony, true, false, 7);
        assert_int_equal(reply_parser_feed(&p, texts[i], strlen(texts[i])), TERN_OK);
        assert_int_equal(reply_parser_finish(&p), TERN_OK);
        assert_int_equal(p.n_calls, 1);
        assert_string_equal(p.calls[0].name, names[i]);
        json_t *args = json_loadb(p.calls[0].args.data, p.calls[0].args.len, 0, NULL);
        assert_true(json_is_object(args));
        json_decref(args);
        reply_parser_free(&p);
    }
    assert_string_equal(srv_tool_syntax_name(SRV_TOOL_SYNTAX_HARMONY), "harmony");
    /* a long name is held whole in both syntaxes that write it into a literal */
    char name[301], lt[700], text[1000];
    memset(name, 'n', 300);
    name[300] = 0;
    snprintf(lt, sizeof lt, "[{\"type\":\"function\",\"function\":{\"name\":\"%s\"}}]", name);
    g = tool_grammar(lt, SRV_TOOLS_REQUIRED, NULL, false, SRV_TOOL_SYNTAX_HARMONY, false);
    snprintf(text, sizeof text, "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>{}", name);
    assert_true(matches(g, text));
    tern_grammar_free(g);
    g = tool_grammar(lt, SRV_TOOLS_REQUIRED, NULL, false, SRV_TOOL_SYNTAX_XML, false);
    snprintf(text, sizeof text, "<tool_call>\n<function=%s>\n</function>\n</tool_call>", name);
    assert_true(matches(g, text));
    tern_grammar_free(g);
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_tool_json),
        cmocka_unit_test(test_tool_xml),
        cmocka_unit_test(test_tool_harmony),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
