/* server/request: OpenAI request parsing, validation, normalisation, error shapes. */
#include "harness.h"

#include "server/request.h"
#include "util/mem.h"

#include <jansson.h>
#include <stdio.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif
#include <stdlib.h>
#include <string.h>

static bool parse(enum srv_endpoint ep, const char *body, struct srv_request *req, struct srv_error *err) {
    struct srv_parse_opts o = {.max_body = 1 << 20};
    return srv_request_parse(ep, body, strlen(body), &o, req, err);
}

/* Parses a body that must fail; checks status and that param/message mention `what`. */
static void expect_error(enum srv_endpoint ep, const char *body, int status, const char *param,
                         const char *in_message) {
    struct srv_request req;
    struct srv_error err;
    memset(&err, 0, sizeof err);
    bool ok = parse(ep, body, &req, &err);
    if (ok) fail_msg("accepted: %s", body);
    assert_int_equal(err.status, status);
    if (param) assert_string_equal(err.param, param);
    if (in_message && !strstr(err.message, in_message))
        fail_msg("message '%s' lacks '%s' (body %s)", err.message, in_message, body);
    /* every error renders to the OpenAI shape */
    char *js = srv_error_json(&err);
    assert_non_null(js);
    json_t *o = json_loads(js, 0, NULL);
    assert_non_null(o);
    json_t *e = json_object_get(o, "error");
    assert_true(json_is_object(e));
    assert_true(json_is_string(json_object_get(e, "message")));
    assert_true(json_is_string(json_object_get(e, "type")));
    assert_non_null(json_object_get(e, "param"));
    assert_non_null(json_object_get(e, "code"));
    json_decref(o);
    free(js);
}

static void test_minimal_chat(void **state) {
    (void)state;
    struct srv_request req;
    struct srv_error err;
    assert_true(parse(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &req, &err));
    assert_int_equal(req.ep, SRV_EP_CHAT);
    assert_string_equal(req.model, "");
    assert_false(req.stream);
    assert_int_equal(req.max_tokens, -1);
    assert_int_equal(json_array_size(req.messages), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(req.messages, 0), "content")), "hi");
    assert_null(req.tools);
    assert_null(req.session_key);
    srv_request_free(&req);
}

static void test_all_fields(void **state) {
    (void)state;
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
        "{\"role\":\"user\",\"content\":\"q\"}],\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"max_tokens\":7,\"max_completion_tokens\":9,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,"
        "\"min_p\":0.05,\"seed\":-3,\"stop\":[\"x\",\"\",\"yz\"],\"presence_penalty\":1,"
        "\"frequency_penalty\":-0.5,\"chat_template_kwargs\":{\"enable_thinking\":false},"
        "\"prompt_cache_key\":\"pk\",\"user\":\"u\",\"cache_salt\":\"salt\",\"unknown_field\":[1,2,{}],"
        "\"n\":1,\"logprobs\":null,\"tools\":[],\"tool_choice\":\"auto\"}";
    struct srv_request req;
    struct srv_error err;
    assert_true(parse(SRV_EP_CHAT, body, &req, &err));
    assert_string_equal(req.model, "m");
    assert_true(req.stream);
    assert_true(req.include_usage);
    assert_int_equal(req.max_tokens, 9); /* max_completion_tokens wins */
    assert_float_equal(req.sampling.temperature, 0.5, 1e-6);
    assert_float_equal(req.sampling.top_p, 0.9, 1e-6);
    assert_int_equal(req.sampling.top_k, 40);
    assert_float_equal(req.sampling.min_p, 0.05, 1e-6);
    assert_float_equal(req.sampling.presence_penalty, 1, 1e-6);
    assert_float_equal(req.sampling.frequency_penalty, -0.5, 1e-6);
    assert_true(req.seed_set);
    assert_int_equal((int64_t)req.sampling.seed, -3);
    assert_int_equal(req.n_stop, 2); /* the empty stop string is dropped */
    assert_string_equal(req.stop[1], "yz");
    assert_string_equal(req.session_key, "pk"); /* prompt_cache_key beats user */
    assert_string_equal(req.cache_salt, "salt");
    assert_null(req.tools); /* an empty tools array is no tools */
    json_t *vars = srv_template_vars(&req, "<s>", "</s>");
    assert_non_null(vars);
    assert_true(json_is_false(json_object_get(vars, "enable_thinking")));
    assert_true(json_is_true(json_object_get(vars, "add_generation_prompt")));
    assert_string_equal(json_string_value(json_object_get(vars, "bos_token")), "<s>");
    assert_null(json_object_get(vars, "tools"));
    json_decref(vars);
    srv_request_free(&req);

    assert_true(parse(SRV_EP_CHAT,
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"session_id\":\"sid\","
                      "\"prompt_cache_key\":\"pk\",\"max_tokens\":3.0,\"stop\":\"END\"}",
                      &req, &err));
    assert_string_equal(req.session_key, "sid");
    assert_int_equal(req.max_tokens, 3);
    assert_int_equal(req.n_stop, 1);
    assert_string_equal(req.stop[0], "END");
    srv_request_free(&req);
}

static void test_normalise_messages(void **state) {
    (void)state;
    const char *body =
        "{\"messages\":["
        "{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"text\":\"b\"}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"only\"}],\"name\":\"bob\"},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"hmm\",\"tool_calls\":["
        "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}},"
        "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"not json\"}},"
        "{\"id\":\"call_3\",\"type\":\"function\",\"function\":{\"name\":\"h\",\"arguments\":{\"y\":[2]}}},"
        "{\"id\":\"call_4\",\"type\":\"function\",\"function\":{\"name\":\"k\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":[{\"type\":\"text\",\"text\":\"r1\"},"
        "{\"type\":\"text\",\"text\":\"r2\"}]},"
        "{\"role\":\"assistant\"}]}";
    struct srv_request req;
    struct srv_error err;
    if (!parse(SRV_EP_CHAT, body, &req, &err)) fail_msg("%s", err.message);
    json_t *m = req.messages;
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 0), "content")), "a\nb");
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 1), "content")), "only");
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 1), "name")), "bob");
    json_t *a = json_array_get(m, 2);
    assert_string_equal(json_string_value(json_object_get(a, "content")), "");
    assert_string_equal(json_string_value(json_object_get(a, "reasoning_content")), "hmm");
    json_t *calls = json_object_get(a, "tool_calls");
    assert_int_equal(json_array_size(calls), 4);
    json_t *a0 = json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments");
    assert_true(json_is_object(a0));
    assert_int_equal(json_integer_value(json_object_get(a0, "x")), 1);
    json_t *a1 = json_object_get(json_object_get(json_array_get(calls, 1), "function"), "arguments");
    assert_string_equal(json_string_value(a1), "not json");
    json_t *a2 = json_object_get(json_object_get(json_array_get(calls, 2), "function"), "arguments");
    assert_true(json_is_array(json_object_get(a2, "y")));
    json_t *a3 = json_object_get(json_object_get(json_array_get(calls, 3), "function"), "arguments");
    assert_true(json_is_object(a3) && json_object_size(a3) == 0);
    assert_string_equal(json_string_value(json_object_get(json_array_get(calls, 0), "id")), "call_1");
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 3), "content")), "r1\nr2");
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 3), "tool_call_id")), "call_1");
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 4), "content")), "");
    srv_request_free(&req);
}

static void test_tools_without_parameters(void **state) {
    (void)state;
    const char *body =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":["
        "{\"type\":\"function\",\"function\":{\"name\":\"now\",\"description\":\"time\"}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"type\":\"object\"}}}],"
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get\"}}}";
    struct srv_request req;
    struct srv_error err;
    if (!parse(SRV_EP_CHAT, body, &req, &err)) fail_msg("%s", err.message);
    assert_int_equal(json_array_size(req.tools), 2);
    assert_int_equal(req.tool_choice, SRV_TOOLS_NAMED);
    /* tools pass to the template unchanged (bytes matter: no parameters added) */
    json_t *vars = srv_template_vars(&req, "", "");
    json_t *t0 = json_object_get(json_array_get(json_object_get(vars, "tools"), 0), "function");
    assert_null(json_object_get(t0, "parameters"));
    json_decref(vars);
    srv_request_free(&req);
}

static void test_completion_prompts(void **state) {
    (void)state;
    struct srv_request req;
    struct srv_error err;
    assert_true(parse(SRV_EP_COMPLETION, "{\"prompt\":\"Once upon\",\"max_tokens\":4}", &req, &err));
    assert_string_equal(req.prompt, "Once upon");
    srv_request_free(&req);
    assert_true(parse(SRV_EP_COMPLETION, "{\"prompt\":[\"one\"]}", &req, &err));
    assert_string_equal(req.prompt, "one");
    srv_request_free(&req);
    assert_true(parse(SRV_EP_COMPLETION, "{\"prompt\":[1,403,407]}", &req, &err));
    assert_null(req.prompt);
    assert_int_equal(req.n_prompt_ids, 3);
    assert_int_equal(req.prompt_ids[1], 403);
    srv_request_free(&req);
}

static void test_errors(void **state) {
    (void)state;
    expect_error(SRV_EP_CHAT, "", 400, "", "empty");
    expect_error(SRV_EP_CHAT, "{\"messages\": [", 400, "", "line 1, column");
    expect_error(SRV_EP_CHAT, "[1,2]", 400, "", "must be a JSON object");
    expect_error(SRV_EP_CHAT, "{}", 400, "messages", "required");
    expect_error(SRV_EP_CHAT, "{\"messages\":[]}", 400, "messages", "at least one");
    expect_error(SRV_EP_CHAT, "{\"messages\":\"hi\"}", 400, "messages", "must be an array");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages[0].role",
                 "wizard");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"content\":\"x\"}]}", 400,
                 "messages[1].role", "must be a string");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content", "missing");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":7}]}", 400, "messages[0].content",
                 "an integer");
    expect_error(SRV_EP_CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}", 400,
                 "messages[0].content[0]", "image_url");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", 400, "n",
                 "only n = 1");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", 400,
                 "temperature", "must be a number");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":1.5}", 400, "top_p",
                 "between 0 and 1");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", 400,
                 "max_tokens", "between 1");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}", 400,
                 "max_tokens", "integer");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}", 400,
                 "stream", "boolean");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[1]}", 400, "stop",
                 "must be a string");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}",
                 400, "tools[0]", "name");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"always\"}",
                 400, "tool_choice", "always");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"user\":5}", 400, "user",
                 "must be a string");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tern_forced_output\":\"x\"}",
                 400, "tern_forced_output", "test-only");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\\u0000\"}]}", 400, "", "NUL");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400, "", "UTF-8");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}", 400, "", NULL);
    expect_error(SRV_EP_CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[{\"function\":{\"name\":\"f\"}}]}]}",
                 400, "messages[0].tool_calls", "only assistant");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"spec\":\"medusa\"}", 400,
                 "spec", "\"mtp\"");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"spec\":1}", 400, "spec",
                 "must be a string");
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"spec_max\":33}", 400,
                 "spec_max", "between 1");
    expect_error(SRV_EP_COMPLETION, "{}", 400, "prompt", "required");
    expect_error(SRV_EP_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt", "batch");
    expect_error(SRV_EP_COMPLETION, "{\"prompt\":[1,-2]}", 400, "prompt", "token id");
    expect_error(SRV_EP_COMPLETION, "{\"prompt\":\"x\",\"echo\":true}", 400, "echo", "not supported");
    /* a deeply nested body is refused, not a stack overflow */
    char deep[5000];
    memset(deep, '[', 4000);
    deep[4000] = 0;
    expect_error(SRV_EP_CHAT, deep, 400, "", NULL);
}

/* speculative decoding per request: absent = the server's, or a mode and a length */
static void test_spec_fields(void **state) {
    (void)state;
    struct srv_request req;
    struct srv_error err;
    assert_true(parse(SRV_EP_COMPLETION, "{\"prompt\":\"x\"}", &req, &err));
    assert_false(req.spec_set);
    assert_int_equal(req.spec_max, 0);
    srv_request_free(&req);
    assert_true(parse(SRV_EP_COMPLETION, "{\"prompt\":\"x\",\"spec\":\"ngram\",\"spec_max\":5}", &req, &err));
    assert_true(req.spec_set);
    assert_int_equal(req.spec, SPEC_NGRAM);
    assert_int_equal(req.spec_max, 5);
    srv_request_free(&req);
    assert_true(parse(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"spec\":\"off\"}", &req,
                      &err));
    assert_true(req.spec_set);
    assert_int_equal(req.spec, SPEC_OFF);
    srv_request_free(&req);
    /* the MTP head is a per-request mode too (a model without it answers 400 later) */
    assert_true(parse(SRV_EP_COMPLETION, "{\"prompt\":\"x\",\"spec\":\"mtp\"}", &req, &err));
    assert_true(req.spec_set);
    assert_int_equal(req.spec, SPEC_MTP);
    srv_request_free(&req);
}

static void test_body_limit(void **state) {
    (void)state;
    struct srv_request req;
    struct srv_error err;
    struct srv_parse_opts o = {.max_body = 10};
    const char *b = "{\"messages\":[]}";
    assert_false(srv_request_parse(SRV_EP_CHAT, b, strlen(b), &o, &req, &err));
    assert_int_equal(err.status, 413);
    assert_non_null(strstr(err.message, "limit is 10"));
}

static void test_forced_output_allowed(void **state) {
    (void)state;
    struct srv_request req;
    struct srv_error err;
    struct srv_parse_opts o = {.allow_forced_output = true};
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tern_forced_output\":\"<think>a</think>b\"}";
    assert_true(srv_request_parse(SRV_EP_CHAT, b, strlen(b), &o, &req, &err));
    assert_string_equal(req.forced_output, "<think>a</think>b");
    srv_request_free(&req);
}

/* Every request body of the shared agent transcripts is accepted and normalised. */
static void test_bench_bodies(void **state) {
    (void)state;
    const char *files[] = {"bench/agent-short.jsonl", "bench/agent-long-stripped.jsonl", "bench/compaction-short.jsonl"};
    if (!th_shared_dir()) skip();
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        size_t len;
        char *data = th_read_file(th_shared_path(files[f]), &len);
        assert_non_null(data);
        int n = 0;
        for (char *line = data; line && *line;) {
            char *nl = strchr(line, '\n');
            size_t ll = nl ? (size_t)(nl - line) : strlen(line);
            json_t *rec = json_loadb(line, ll, 0, NULL);
            assert_non_null(rec);
            char *body = json_dumps(json_object_get(rec, "request"), JSON_COMPACT);
            struct srv_request req;
            struct srv_error err;
            if (!parse(SRV_EP_CHAT, body, &req, &err)) fail_msg("%s line %d: %s", files[f], n, err.message);
            assert_true(req.stream);
            assert_int_equal(req.max_tokens, 16);
            assert_non_null(req.tools);
            /* content parts were flattened: every message content is a string */
            for (size_t i = 0; i < json_array_size(req.messages); i++)
                assert_true(json_is_string(json_object_get(json_array_get(req.messages, i), "content")));
            srv_request_free(&req);
            free(body);
            json_decref(rec);
            n++;
            line = nl ? nl + 1 : NULL;
        }
        assert_true(n >= 12);
        free(data);
    }
}

/* Validation and the sampler agree: every numeric sampling parameter at and around its
 * edges (and at values that overflow or round to 0 as a float) is either refused with a
 * 400 that names it, or accepted and then builds a sampler that samples a valid token.
 * (repeat_penalty 0 used to pass validation and fail in the sampler: a 500.) */
static void test_sampling_edges_agree_with_sampler(void **state) {
    (void)state;
    static const char *const keys[] = {"temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                       "frequency_penalty", "repeat_penalty", "seed", "max_tokens",
                                       "max_completion_tokens"};
    static const char *const vals[] = {
        "-1e300", "-10.0001", "-10", "-2.0001", "-2", "-1", "-1e-45", "-0.0", "0", "0.0", "1e-46", "1e-45",
        "1e-300", "0.5", "1", "1.0000001", "2", "2.0001", "10", "10.0001", "100", "100.0001", "3.5e38",
        "1e39", "1e300", "2147483647", "2147483648", "-2147483649", "9223372036854775807",
        "-9223372036854775808", "16.0", "16.5", "true", "\"1\"", "null",
    };
    float logits[100];
    for (int i = 0; i < 100; i++) logits[i] = (float)((i * 37) % 11) - 5.0f;
    int32_t hist[4] = {1, 2, 3, 2};
    int n_ok = 0, n_refused = 0;
    for (size_t k = 0; k < TERN_ARRAY_LEN(keys); k++) {
        for (size_t v = 0; v < TERN_ARRAY_LEN(vals); v++) {
            char body[256];
            snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"%s\":%s}", keys[k],
                     vals[v]);
            struct srv_request req;
            struct srv_error err;
            memset(&err, 0, sizeof err);
            if (!parse(SRV_EP_CHAT, body, &req, &err)) {
                if (err.status != 400) fail_msg("%s: status %d", body, err.status);
                if (!strstr(err.message, keys[k]) && strcmp(err.param, keys[k]))
                    fail_msg("%s: the message '%s' does not name the field", body, err.message);
                n_refused++;
                continue;
            }
            struct tern_sampler *smp = NULL;
            if (tern_sampler_new(&req.sampling, 100, &smp) != TERN_OK)
                fail_msg("%s passed validation but the sampler refuses it: %s", body, tern_last_error());
            int32_t t = tern_sampler_sample(smp, logits, hist, 4);
            assert_true(t >= 0 && t < 100);
            tern_sampler_free(smp);
            srv_request_free(&req);
            n_ok++;
        }
    }
    assert_true(n_ok > 50 && n_refused > 50);
    expect_error(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"repeat_penalty\":0}", 400,
                 "repeat_penalty", "greater than 0");
}

/* jansson's allocations fail from the N-th on: parsing and normalising must then refuse
 * the request (400 or 500, with a message) or accept it whole — never accept a message
 * that lost its content or its tool calls on the way (json_object_set_new results used
 * to be ignored). Also renders every error under the same failures. */
static long jfail_after = -1;
static void *jmalloc(size_t n) {
    if (jfail_after == 0) return NULL;
    if (jfail_after > 0) jfail_after--;
    return malloc(n);
}

static void test_json_alloc_failures(void **state) {
    (void)state;
    const char *body =
        "{\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"be brief\"}]},"
        "{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\",\"type\":"
        "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"}],\"temperature\":0}";
    int n_ok = 0;
    for (long n = 0; n < 400 && n_ok < 3; n++) {
        struct srv_request req;
        struct srv_error err;
        memset(&err, 0, sizeof err);
        jfail_after = n;
        json_set_alloc_funcs(jmalloc, free);
        bool ok = parse(SRV_EP_CHAT, body, &req, &err);
        char *ej = ok ? NULL : srv_error_json(&err); /* may fail too: NULL, never partial */
        jfail_after = -1;
        if (!ok) {
            assert_true(err.status == 400 || err.status == 500);
            assert_true(err.message[0] != 0);
            if (ej) {
                json_t *o = json_loads(ej, 0, NULL);
                assert_non_null(o);
                assert_true(json_is_string(json_object_get(json_object_get(o, "error"), "message")));
                json_decref(o);
            }
            free(ej);
            continue;
        }
        n_ok++;
        assert_int_equal(json_array_size(req.messages), 4);
        for (size_t i = 0; i < 4; i++)
            assert_true(json_is_string(json_object_get(json_array_get(req.messages, i), "content")));
        assert_true(json_is_array(json_object_get(json_array_get(req.messages, 2), "tool_calls")));
        srv_request_free(&req);
    }
    tern_json_alloc_init(); /* back to tern's allocator, as the server runs */
    assert_true(n_ok >= 1);
}

/* Every allocation of request parsing fails in turn — tern's and jansson's alike, since
 * jansson allocates through tern_malloc — and each failure is a clear error: a 500 that
 * says "out of memory", rendered to the OpenAI shape (or not at all, never partially),
 * and nothing leaks (LeakSanitizer in the ASan build, checked after the loop). */
static void test_request_parse_alloc_failures(void **state) {
    (void)state;
    const char *bodies[] = {
        "{\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"be brief\"}]},"
        "{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"reasoning_content\":\"hm\",\"tool_calls\":"
        "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"}],\"temperature\":0,\"stop\":[\"x\",\"y\"],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
        "\"session_id\":\"s1\",\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"chat_template_kwargs\":{\"enable_thinking\":false},\"response_format\":{\"type\":\"json_object\"}}",
        "{\"prompt\":\"one two\",\"max_tokens\":5,\"seed\":1,\"logit_bias\":{\"5\":-1}}",
    };
    const enum srv_endpoint eps[] = {SRV_EP_CHAT, SRV_EP_COMPLETION};
    tern_json_alloc_init();
    for (size_t b = 0; b < TERN_ARRAY_LEN(bodies); b++) {
        long n_failed = 0;
        bool parsed = false;
        for (long n = 0; !parsed; n++) {
            if (n == 100000) fail_msg("body %zu: still failing after %ld allocations", b, n);
            struct srv_request req;
            struct srv_error err;
            memset(&err, 0, sizeof err);
            tern_alloc_fail_after(n);
            bool ok = srv_request_parse(eps[b], bodies[b], strlen(bodies[b]), NULL, &req, &err);
            char *ej = ok ? NULL : srv_error_json(&err); /* may fail too: NULL, never partial */
            tern_alloc_fail_after(-1);
            if (ok) {
                parsed = true;
                assert_true(json_is_array(req.messages) || req.prompt);
                srv_request_free(&req);
                break;
            }
            n_failed++;
            if (err.status != 500 || !strstr(err.message, "out of memory"))
                fail_msg("body %zu, allocation %ld failed: %d '%s' (want 500 'out of memory')", b, n, err.status,
                         err.message);
            if (ej) {
                json_t *o = json_loads(ej, 0, NULL);
                assert_non_null(o);
                assert_string_equal(json_string_value(json_object_get(json_object_get(o, "error"), "message")),
                                    err.message);
                json_decref(o);
                free(ej);
            }
        }
        assert_true(n_failed > 10); /* the injection reached the parse (jansson's nodes too) */
    }
#if defined(__SANITIZE_ADDRESS__)
    assert_int_equal(__lsan_do_recoverable_leak_check(), 0);
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minimal_chat),
        cmocka_unit_test(test_all_fields),
        cmocka_unit_test(test_normalise_messages),
        cmocka_unit_test(test_tools_without_parameters),
        cmocka_unit_test(test_completion_prompts),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_spec_fields),
        cmocka_unit_test(test_body_limit),
        cmocka_unit_test(test_forced_output_allowed),
        cmocka_unit_test(test_bench_bodies),
        cmocka_unit_test(test_sampling_edges_agree_with_sampler),
        cmocka_unit_test(test_json_alloc_failures),
        cmocka_unit_test(test_request_parse_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
