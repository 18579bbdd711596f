/* server/respond: SSE framing, chunk and response shapes, error events. */
#include "harness.h"

#include "server/respond.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const struct srv_resp_ctx ctx = {.id = "chatcmpl-1", .model = "m", .created = 1700000000, .ep = SRV_EP_CHAT};

static json_t *data_json(const struct tern_buf *b) {
    assert_memory_equal(b->data, "data: ", 6);
    assert_string_equal(b->data + b->len - 2, "\n\n");
    json_t *o = json_loadb(b->data + 6, b->len - 8, 0, NULL);
    assert_non_null(o);
    return o;
}

static void test_sse_frames(void **state) {
    (void)state;
    struct tern_buf b = TERN_BUF_INIT;
    assert_int_equal(srv_sse_comment(&b, "priming %d/%d\nsneaky", 4096, 20000), TERN_OK);
    assert_string_equal(b.data, ": priming 4096/20000 sneaky\n\n"); /* one line, whatever the text */
    tern_buf_clear(&b);
    assert_int_equal(srv_sse_done(&b), TERN_OK);
    assert_string_equal(b.data, "data: [DONE]\n\n");
    tern_buf_clear(&b);
    struct srv_error e;
    srv_error_set(&e, 500, "server_error", NULL, NULL, "decoding failed: %s", "boom");
    assert_int_equal(srv_sse_error(&b, &e), TERN_OK);
    assert_memory_equal(b.data, "event: error\ndata: {\"error\":{", 29);
    json_t *o = json_loads(strstr(b.data, "data: ") + 6, JSON_DISABLE_EOF_CHECK, NULL);
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "error"), "message")), "decoding failed: boom");
    assert_true(json_is_null(json_object_get(json_object_get(o, "error"), "code")));
    json_decref(o);
    tern_buf_free(&b);
}

static void test_chunks(void **state) {
    (void)state;
    struct reply_parser p;
    reply_parser_init(&p, &reply_format_qwen, true, false, 1);
    struct tern_buf b = TERN_BUF_INIT;
    /* the first chunk: role and empty content, finish_reason null, no tern object */
    srv_sse_data(&b, srv_chunk_chat(&ctx, NULL, &p, true, NULL, NULL));
    json_t *o = data_json(&b);
    assert_string_equal(json_string_value(json_object_get(o, "object")), "chat.completion.chunk");
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(ch, "delta"), "role")), "assistant");
    assert_true(json_is_null(json_object_get(ch, "finish_reason")));
    assert_null(json_object_get(o, "tern"));
    json_decref(o);
    tern_buf_clear(&b);
    /* a tool call's first delta has index, id, type, name; the next only arguments */
    const char *part1 = "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\"";
    reply_parser_feed(&p, part1, strlen(part1));
    srv_sse_data(&b, srv_chunk_chat(&ctx, reply_parser_delta(&p), &p, false, NULL, NULL));
    reply_delta_reset(reply_parser_delta(&p));
    o = data_json(&b);
    json_t *tc = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "delta"), "tool_calls"), 0);
    assert_int_equal(json_integer_value(json_object_get(tc, "index")), 0);
    assert_string_equal(json_string_value(json_object_get(tc, "type")), "function");
    assert_memory_equal(json_string_value(json_object_get(tc, "id")), "call_", 5);
    assert_string_equal(json_string_value(json_object_get(json_object_get(tc, "function"), "name")), "f");
    json_decref(o);
    tern_buf_clear(&b);
    reply_parser_feed(&p, ":1}}</tool_call>", strlen(":1}}</tool_call>"));
    reply_parser_finish(&p);
    srv_sse_data(&b, srv_chunk_chat(&ctx, reply_parser_delta(&p), &p, false, NULL, NULL));
    o = data_json(&b);
    tc = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "delta"), "tool_calls"), 0);
    assert_null(json_object_get(tc, "id"));
    assert_null(json_object_get(json_object_get(tc, "function"), "name"));
    assert_string_equal(json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")), ":1}");
    json_decref(o);
    tern_buf_clear(&b);
    /* the finish chunk carries the reuse report; the usage chunk has choices [] */
    struct srv_reuse r = {.tier = "checkpoint", .cached = 100, .read = 5, .key = "implicit", .reason = "why"};
    srv_sse_data(&b, srv_chunk_chat(&ctx, NULL, &p, false, "tool_calls", &r));
    o = data_json(&b);
    json_t *reuse = json_object_get(json_object_get(o, "tern"), "reuse");
    assert_string_equal(json_string_value(json_object_get(reuse, "tier")), "checkpoint");
    assert_int_equal(json_integer_value(json_object_get(reuse, "cached")), 100);
    assert_string_equal(json_string_value(json_object_get(reuse, "key")), "implicit");
    json_decref(o);
    tern_buf_clear(&b);
    struct srv_usage u = {.prompt_tokens = 105, .completion_tokens = 7, .cached_tokens = 100};
    srv_sse_data(&b, srv_chunk_usage(&ctx, &u, &r));
    o = data_json(&b);
    assert_int_equal(json_array_size(json_object_get(o, "choices")), 0);
    json_t *us = json_object_get(o, "usage");
    assert_int_equal(json_integer_value(json_object_get(us, "total_tokens")), 112);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(us, "prompt_tokens_details"), "cached_tokens")), 100);
    json_decref(o);
    /* the whole response: content null when only tool calls */
    o = srv_response_chat(&ctx, &p, "tool_calls", &u, &r);
    json_t *msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0),
                                                                          "function"), "arguments")), "{\"a\":1}");
    json_decref(o);
    tern_buf_free(&b);
    reply_parser_free(&p);
}

static void test_text_and_broken_utf8(void **state) {
    (void)state;
    struct srv_resp_ctx c = ctx;
    c.ep = SRV_EP_COMPLETION;
    struct srv_usage u = {.prompt_tokens = 3, .completion_tokens = 2};
    /* a cut inside a UTF-8 sequence does not fail the response: the broken tail goes */
    json_t *o = srv_response_text(&c, "ab\xe2\x82", 4, "length", &u, NULL);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "text")), "ab");
    assert_string_equal(json_string_value(json_object_get(o, "object")), "text_completion");
    assert_null(json_object_get(o, "tern"));
    json_decref(o);
    /* a long text with a long broken tail: one pass (the old back-off re-validated the
     * text once per byte of the tail, 2^40 steps here) */
    const size_t half = (size_t)1 << 20;
    char *t = malloc(2 * half);
    assert_non_null(t);
    memset(t, 'a', half);
    memset(t + half, 0xff, half);
    o = srv_response_text(&c, t, 2 * half, "length", &u, NULL);
    assert_non_null(o);
    assert_int_equal(strlen(json_string_value(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "text"))),
                     half);
    json_decref(o);
    free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_frames),
        cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_text_and_broken_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
