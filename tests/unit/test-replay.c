/* replay: transcripts (parsing, kinds, body edits), SSE, the response stream, the
 * integrity checks, medians and class tables, the SVG, synthetic transcripts. */
#include "harness.h"

#include "replay/replay.h"
#include "replay/sse.h"
#include "util/hash.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers -------------------------------------------------------------------------- */

static struct tern_replay_transcript *parse_ok(const char *text) {
    struct tern_replay_transcript *t = NULL;
    enum tern_status st = tern_transcript_parse(text, strlen(text), "t.jsonl", &t);
    if (st != TERN_OK) fprintf(stderr, "unexpected error: %s\n", tern_last_error());
    assert_int_equal(st, TERN_OK);
    assert_non_null(t);
    return t;
}

static void parse_fails(const char *text, const char *needle) {
    struct tern_replay_transcript *t = (void *)1;
    enum tern_status st = tern_transcript_parse(text, strlen(text), "t.jsonl", &t);
    assert_int_not_equal(st, TERN_OK);
    assert_null(t);
    if (!strstr(tern_last_error(), needle)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", tern_last_error(), needle);
        fail();
    }
}

#define SYS "{\"role\":\"system\",\"content\":\"be brief\"}"
#define U1 "{\"role\":\"user\",\"content\":\"fix the bug\"}"
#define U2 "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"now add a test\"}]}"
#define A_TC                                                                                                   \
    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","      \
    "\"function\":{\"name\":\"grep\",\"arguments\":\"{\\\"p\\\":\\\"x\\\"}\"}}],\"reasoning_content\":\"look first\"}"
#define A_TC_STRIPPED                                                                                          \
    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","      \
    "\"function\":{\"name\":\"grep\",\"arguments\":\"{\\\"p\\\":\\\"x\\\"}\"}}]}"
#define TOOL "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"src/a.c:3: x\"}"
#define A_FIN "{\"role\":\"assistant\",\"content\":\"fixed\",\"reasoning_content\":\"it was the bound\"}"
#define REQ(msgs) "{\"model\":\"default\",\"messages\":[" msgs "],\"max_tokens\":16,\"stream\":true}"

/* A 4-turn transcript: cold, extension (tool result), extension (answer follows),
 * template rewrite (a new user message drops the earlier reasoning). Unlabeled. */
static const char *const four_turns =
    "{\"turn\":0,\"request\":" REQ(SYS "," U1) ",\"reply\":" A_TC "}\n"
    "{\"turn\":1,\"request\":" REQ(SYS "," U1 "," A_TC "," TOOL) ",\"reply\":" A_FIN "}\n"
    "{\"turn\":2,\"request\":" REQ(SYS "," U1 "," A_TC "," TOOL "," A_FIN "," U2) ",\"reply\":" A_FIN "}\n"
    "{\"turn\":3,\"request\":" REQ(SYS "," U1 "," A_TC_STRIPPED "," TOOL "," A_FIN "," U2 "," A_FIN "," U1) "}\n";

/* ---- transcript parsing ------------------------------------------------------------------ */

static void test_transcript_parse_malformed(void **state) {
    (void)state;
    parse_fails("", "no turns");
    parse_fails("\n\n", "no turns");
    parse_fails("{\"turn\":0,\"request\":" REQ(U1) "}\n{\"turn\":1,\"request\":{\"messages\":[\n",
                "t.jsonl line 2: invalid JSON");
    parse_fails("[1,2]\n", "line 1: a turn must be a JSON object");
    parse_fails("{\"turn\":0}\n", "line 1: no 'request'");
    parse_fails("{\"request\":[]}\n", "line 1: 'request' is not an object");
    parse_fails("{\"request\":{\"messages\":[]}}\n", "line 1: request.messages must be a non-empty array");
    parse_fails("{\"request\":{\"messages\":[{\"content\":\"x\"}]}}\n", "line 1: request.messages[0] has no string 'role'");
    parse_fails("{\"turn\":0,\"request\":" REQ(U1) "}\n\n{\"turn\":5,\"request\":" REQ(U1) "}\n",
                "line 3: turn 5 out of order (expected 1)");
    parse_fails("{\"turn\":\"0\",\"request\":" REQ(U1) "}\n", "line 1: 'turn' is not an integer");
    parse_fails("{\"kind\":\"warm\",\"request\":" REQ(U1) "}\n", "line 1: unknown kind 'warm'");
    parse_fails("{\"kind\":\"extension\",\"request\":" REQ(U1) "}\n", "line 1: turn 0 is labeled 'extension'");
    parse_fails("{\"kind\":\"cold\",\"request\":" REQ(U1) "}\n{\"kind\":\"cold\",\"request\":" REQ(U1) "}\n",
                "line 2: turn 1 is labeled 'cold'");
    parse_fails("{\"request\":" REQ(U1) ",\"reply\":7}\n", "line 1: 'reply' is not an object");
    parse_fails("{\"request\":{\"messages\":[" U1 "],\"tools\":{}}}\n", "line 1: request.tools is not an array");
    parse_fails("{\"request\":" REQ(U1) ",\"request\":" REQ(U1) "}\n", "line 1: invalid JSON");
    /* Not found on disk: named. */
    struct tern_replay_transcript *t = NULL;
    assert_int_equal(tern_transcript_load("/nonexistent/t.jsonl", &t), TERN_ERR_IO);
    assert_non_null(strstr(tern_last_error(), "/nonexistent/t.jsonl"));
}

static void test_transcript_raw_bytes_and_fields(void **state) {
    (void)state;
    /* Spaces and key order kept exactly; CRLF line ends; blank lines skipped. */
    const char *req0 = "{ \"model\" : \"m\",  \"messages\":[{\"role\":\"user\",\"content\":\"h\\u00e9\"}] ,"
                       "\"max_completion_tokens\": 9 }";
    char text[1024];
    snprintf(text, sizeof text, "\r\n{\"turn\":0, \"kind\":\"cold\", \"request\": %s , \"body_bytes\":3}\r\n", req0);
    struct tern_replay_transcript *t = parse_ok(text);
    assert_int_equal(t->n_turns, 1);
    assert_int_equal(t->turns[0].line_no, 2);
    assert_int_equal(t->turns[0].request_len, strlen(req0));
    assert_memory_equal(t->turns[0].request, req0, strlen(req0));
    assert_int_equal(t->turns[0].max_tokens, 9);
    assert_int_equal(t->turns[0].body_bytes, 3);
    assert_true(t->turns[0].labeled);
    assert_int_equal(t->turns[0].kind, TERN_TURN_COLD);
    tern_transcript_free(t);
}

static void test_transcript_kinds_derived(void **state) {
    (void)state;
    struct tern_replay_transcript *t = parse_ok(four_turns);
    assert_int_equal(t->n_turns, 4);
    char *k = tern_transcript_kinds_string(t, t->n_turns);
    /* turn 1: appends the reply and a tool result; turn 2: appends the answer and a new
     * user message, which drops the earlier reasoning under the Qwen3 template; turn 3:
     * the client stripped an old reply's reasoning. */
    assert_string_equal(k, "CeRR");
    free(k);
    assert_string_equal(t->turns[2].rewrite_by, "template");
    assert_string_equal(t->turns[3].rewrite_by, "client");
    assert_true(t->turns[0].reply_tool_calls);
    assert_false(t->turns[1].reply_tool_calls);
    struct tern_turn_class c;
    assert_int_equal(tern_transcript_classify(t, 2, &c), TERN_OK);
    assert_int_equal(c.kind, TERN_TURN_REWRITE);
    assert_int_equal(c.diverge_msg, 2); /* the first assistant message after the previous user message */
    assert_true(c.shared_prefix_chars > 0 && c.shared_prefix_chars < c.prompt_chars);
    /* Turn 3: the client stripped reasoning the template had already dropped (message
     * 2), so the render first differs at the previous reply (message 6), which the new
     * user message makes lose its reasoning; a client rewrite all the same. */
    assert_int_equal(tern_transcript_classify(t, 3, &c), TERN_OK);
    assert_int_equal(c.diverge_msg, 6);
    assert_int_equal(tern_transcript_verify_kinds(t, 4), TERN_OK);
    assert_int_equal(tern_transcript_check_rewrite(t, 4), TERN_OK);
    /* The first two turns alone hold no rewrite: refused. */
    assert_int_equal(tern_transcript_check_rewrite(t, 2), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "rewrite"));
    tern_transcript_free(t);
}

static void test_transcript_mislabeled_kind_fails(void **state) {
    (void)state;
    /* Turn 1 appends only, but says rewrite; turn 1 of the second one rewrites but says extension. */
    const char *a = "{\"kind\":\"cold\",\"request\":" REQ(SYS "," U1) ",\"reply\":" A_TC "}\n"
                    "{\"kind\":\"rewrite\",\"request\":" REQ(SYS "," U1 "," A_TC "," TOOL) "}\n";
    struct tern_replay_transcript *t = parse_ok(a);
    assert_int_equal(tern_transcript_verify_kinds(t, 2), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "line 2: turn 1 is labeled 'rewrite' but its messages make it 'extension'"));
    tern_transcript_free(t);
    const char *b = "{\"kind\":\"cold\",\"request\":" REQ(SYS "," U1) ",\"reply\":" A_TC "}\n"
                    "{\"kind\":\"extension\",\"request\":" REQ(SYS "," U1 "," A_TC_STRIPPED "," TOOL) "}\n";
    t = parse_ok(b);
    assert_int_equal(tern_transcript_verify_kinds(t, 2), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "labeled 'extension' but its messages make it 'rewrite' by client"));
    /* A transcript whose only "rewrite" is a label on an extension must not pass the
     * rewrite check once kinds are verified; with the labels trusted it would. */
    tern_transcript_free(t);
    const char *c = "{\"kind\":\"cold\",\"request\":" REQ(SYS "," U1) ",\"reply\":" A_TC "}\n"
                    "{\"kind\":\"rewrite\",\"rewrite_by\":\"template\",\"request\":" REQ(SYS "," U1 "," A_TC_STRIPPED "," TOOL) "}\n";
    t = parse_ok(c);
    assert_int_equal(tern_transcript_verify_kinds(t, 2), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "rewrite by 'template' but its messages show a rewrite by client"));
    tern_transcript_free(t);
}

static void test_body_build_edits(void **state) {
    (void)state;
    /* No stream, no stream_options: both added; messages' bytes untouched. */
    const char *line = "{\"request\":{\"model\":\"m\", \"messages\":[" U1 "], \"max_tokens\":16}}\n";
    struct tern_replay_transcript *t = parse_ok(line);
    struct tern_buf b = TERN_BUF_INIT;
    struct tern_body_edits e;
    struct tern_body_opts o = {.max_tokens = -1};
    assert_int_equal(tern_replay_body_build(&t->turns[0], &o, &b, &e), TERN_OK);
    assert_string_equal(b.data, "{\"model\":\"m\", \"messages\":[" U1 "], \"max_tokens\":16,\"stream\":true,"
                                "\"stream_options\":{\"include_usage\":true}}");
    assert_int_equal(e.n, 2);
    /* max_tokens override and a salt. */
    o.max_tokens = 4;
    o.cache_salt = "rep1";
    assert_int_equal(tern_replay_body_build(&t->turns[0], &o, &b, &e), TERN_OK);
    assert_string_equal(b.data, "{\"model\":\"m\", \"messages\":[" U1 "], \"max_tokens\":4,\"stream\":true,"
                                "\"stream_options\":{\"include_usage\":true},\"cache_salt\":\"rep1\"}");
    assert_int_equal(e.n, 4);
    tern_transcript_free(t);
    /* Already streaming with usage: the body is the recorded bytes exactly. */
    const char *req = "{\"model\":\"m\",\"messages\":[" U1 "],\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
    char text[512];
    snprintf(text, sizeof text, "{\"request\":%s}", req);
    t = parse_ok(text);
    o = (struct tern_body_opts){.max_tokens = -1};
    assert_int_equal(tern_replay_body_build(&t->turns[0], &o, &b, &e), TERN_OK);
    assert_string_equal(b.data, req);
    assert_int_equal(e.n, 0);
    tern_transcript_free(t);
    /* stream_options without include_usage keeps its other members; a recorded salt is kept as a prefix. */
    t = parse_ok("{\"request\":{\"messages\":[" U1 "],\"stream\":false,\"stream_options\":{\"x\":1},"
                 "\"cache_salt\":\"t1\",\"max_completion_tokens\":3}}");
    o = (struct tern_body_opts){.max_tokens = 8, .cache_salt = "r2"};
    assert_int_equal(tern_replay_body_build(&t->turns[0], &o, &b, &e), TERN_OK);
    assert_string_equal(b.data, "{\"messages\":[" U1 "],\"stream\":true,\"stream_options\":{\"x\":1,"
                                "\"include_usage\":true},\"cache_salt\":\"t1/r2\",\"max_completion_tokens\":8}");
    tern_transcript_free(t);
    tern_buf_free(&b);
}

/* ---- SSE ------------------------------------------------------------------------------------ */

struct sse_log {
    char events[16][128];
    int n;
    int n_comments;
    int stop_at;
};

static int log_event(void *user, const struct tern_sse_event *ev) {
    struct sse_log *l = user;
    if (l->n < 16) snprintf(l->events[l->n], 128, "%s|%s|%s", ev->event, ev->data, ev->id);
    l->n++;
    return l->stop_at && l->n >= l->stop_at;
}

static int log_comment(void *user, const char *text, size_t n) {
    (void)text, (void)n;
    ((struct sse_log *)user)->n_comments++;
    return 0;
}

static void test_sse_parser(void **state) {
    (void)state;
    const char *stream = "\xEF\xBB\xBF: hello\r\ndata: a\r\ndata:b\r\n\r\nevent: x\nid: 7\ndata: {\"k\":1}\n\n"
                         "data\n\n: keep-alive\rdata: cr\r\rretry: 5\nunknown: y\ndata: tail-not-dispatched";
    /* Fed whole and fed byte by byte: the same events. */
    for (int mode = 0; mode < 2; mode++) {
        struct sse_log l = {0};
        struct tern_sse_parser p;
        tern_sse_init(&p, log_event, log_comment, &l);
        if (mode == 0) assert_int_equal(tern_sse_feed(&p, stream, strlen(stream)), TERN_OK);
        else
            for (size_t i = 0; stream[i]; i++) assert_int_equal(tern_sse_feed(&p, stream + i, 1), TERN_OK);
        assert_int_equal(l.n, 4);
        assert_string_equal(l.events[0], "message|a\nb|");
        assert_string_equal(l.events[1], "x|{\"k\":1}|7");
        assert_string_equal(l.events[2], "message||7");
        assert_string_equal(l.events[3], "message|cr|7");
        assert_int_equal(l.n_comments, 2);
        tern_sse_free(&p);
    }
    /* A callback can stop the stream; an overlong line is refused. */
    struct sse_log l = {.stop_at = 1};
    struct tern_sse_parser p;
    tern_sse_init(&p, log_event, NULL, &l);
    assert_int_equal(tern_sse_feed(&p, "data: 1\n\ndata: 2\n\n", 18), TERN_ERR_CANCELLED);
    tern_sse_free(&p);
    tern_sse_init(&p, log_event, NULL, &l);
    p.max_line = 8;
    assert_int_equal(tern_sse_feed(&p, "data: 123456789\n", 16), TERN_ERR_LIMIT);
    tern_sse_free(&p);
}

/* ---- the response stream ------------------------------------------------------------------- */

static enum tern_status consume(const char *sse, struct tern_replay_meas *m) {
    struct tern_chat_stream *cs = NULL;
    memset(m, 0, sizeof *m);
    assert_int_equal(tern_chat_stream_new(m, tern_now_ns(), &cs), TERN_OK);
    enum tern_status st = tern_chat_stream_feed(cs, sse, strlen(sse));
    if (st == TERN_OK) st = tern_chat_stream_finish(cs, tern_now_ns());
    tern_chat_stream_free(cs);
    return st;
}

#define CH(delta, fin) "data: {\"choices\":[{\"index\":0,\"delta\":" delta ",\"finish_reason\":" fin "}]}\n\n"
#define USAGE(p, c)                                                                                   \
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":" #p ",\"completion_tokens\":2,"              \
    "\"prompt_tokens_details\":{\"cached_tokens\":" #c "}},\"tern\":{\"reuse\":{\"tier\":\"checkpoint\"}}}\n\n"

static void test_chat_stream(void **state) {
    (void)state;
    struct tern_replay_meas m;
    /* Role chunk and an empty content delta carry no text: TTFT waits for "hi". */
    assert_int_equal(consume(CH("{\"role\":\"assistant\",\"content\":\"\"}", "null") ": priming 1/2\n\n"
                             CH("{\"reasoning_content\":\"think\"}", "null") CH("{\"content\":\"hi\"}", "null")
                             CH("{}", "\"length\"") USAGE(100, 40) "data: [DONE]\n\n", &m),
                     TERN_OK);
    assert_true(isfinite(m.ttft_s));
    assert_string_equal(m.ttft_at, "text");
    assert_int_equal(m.prompt_tokens, 100);
    assert_int_equal(m.cached_tokens, 40);
    assert_int_equal(m.completion_tokens, 2);
    assert_string_equal(m.finish_reason, "length");
    assert_string_equal(m.out_content, "hi");
    assert_string_equal(m.out_reasoning, "think");
    assert_string_equal(m.reuse_json, "{\"tier\":\"checkpoint\"}");
    assert_int_equal(m.n_comments, 1);
    uint64_t h1 = m.out_hash;
    tern_replay_meas_clear(&m);
    /* The same text split differently hashes the same; moved between reasoning and content, not. */
    assert_int_equal(consume(CH("{\"reasoning_content\":\"th\"}", "null") CH("{\"reasoning_content\":\"ink\"}", "null")
                             CH("{\"content\":\"h\"}", "null") CH("{\"content\":\"i\"}", "\"stop\"") USAGE(100, 0), &m),
                     TERN_OK);
    assert_true(m.out_hash == h1);
    tern_replay_meas_clear(&m);
    assert_int_equal(consume(CH("{\"content\":\"thinkhi\"}", "\"stop\"") USAGE(100, 0), &m), TERN_OK);
    assert_true(m.out_hash != h1);
    tern_replay_meas_clear(&m);
    /* A generated NUL byte arrives as \u0000: accepted, kept, and it counts in the hash. */
    assert_int_equal(consume(CH("{\"content\":\"a\\u0000b\"}", "\"stop\"") USAGE(100, 0), &m), TERN_OK);
    assert_int_equal(m.out_content_len, 3);
    assert_memory_equal(m.out_content, "a\0b", 4);
    uint64_t h_nul = m.out_hash;
    tern_replay_meas_clear(&m);
    assert_int_equal(consume(CH("{\"content\":\"a\"}", "\"stop\"") USAGE(100, 0), &m), TERN_OK);
    assert_true(m.out_hash != h_nul);
    tern_replay_meas_clear(&m);
    /* Tool calls are output too; no text at all: the finish chunk. */
    assert_int_equal(consume(CH("{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"grep\",\"arguments\":\"\"}}]}", "null")
                             CH("{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]}", "\"tool_calls\"") USAGE(9, 0), &m),
                     TERN_OK);
    assert_string_equal(m.ttft_at, "tool_call");
    assert_string_equal(m.out_tool_calls, "grep({})");
    tern_replay_meas_clear(&m);
    assert_int_equal(consume(CH("{\"role\":\"assistant\"}", "null") CH("{}", "\"stop\"") USAGE(9, 0), &m), TERN_OK);
    assert_string_equal(m.ttft_at, "finish");
    assert_true(isfinite(m.ttft_s));
    tern_replay_meas_clear(&m);
    /* Errors: an error event, a stream that never finishes, an event that is not JSON. */
    assert_int_equal(consume(CH("{\"content\":\"a\"}", "null") "data: {\"error\":{\"message\":\"engine died\"}}\n\n", &m),
                     TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "engine died"));
    tern_replay_meas_clear(&m);
    assert_int_equal(consume(CH("{\"content\":\"a\"}", "null"), &m), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "without a finish_reason"));
    tern_replay_meas_clear(&m);
    assert_int_equal(consume("data: {oops\n\n", &m), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "not JSON"));
    tern_replay_meas_clear(&m);
}

/* ---- integrity checks -------------------------------------------------------------------- */

static void test_check_usage(void **state) {
    (void)state;
    struct tern_replay_meas m = {.turn = 3, .rep = 1, .usage_seen = true, .prompt_tokens = 100, .cached_tokens = 40};
    assert_int_equal(tern_replay_check_usage(&m, "on"), TERN_OK);
    m.cached_tokens = -1; /* not reported: unknown, not inconsistent */
    assert_int_equal(tern_replay_check_usage(&m, "on"), TERN_OK);
    m.cached_tokens = 101;
    assert_int_equal(tern_replay_check_usage(&m, "on"), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "turn 3, arm on, rep 2: the server reports 101 cached tokens of a 100-token prompt"));
    m.cached_tokens = 0;
    m.prompt_tokens = -1;
    assert_int_equal(tern_replay_check_usage(&m, "on"), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "prompt_tokens is missing"));
    m.usage_seen = false;
    assert_int_equal(tern_replay_check_usage(&m, "off"), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "no usage"));
}

static void test_check_turn(void **state) {
    (void)state;
    const char *labels[2] = {"on", "off"};
    struct tern_replay_meas a = {.turn = 5, .rep = 0, .arm = 0, .body_hash = 7, .body_len = 100, .prompt_tokens = 50};
    struct tern_replay_meas b = a;
    b.arm = 1;
    struct tern_replay_meas c = a; /* rep 2 may carry another salt: other bytes, same prompt */
    c.rep = 1;
    c.body_hash = 8;
    c.body_len = 110;
    struct tern_replay_meas d = c;
    d.arm = 1;
    const struct tern_replay_meas *ms[4] = {&a, &b, &c, &d};
    assert_int_equal(tern_replay_check_turn(ms, 4, labels), TERN_OK);
    /* Different bytes to the two arms of one rep. */
    d.body_hash = 9;
    assert_int_equal(tern_replay_check_turn(ms, 4, labels), TERN_ERR_INTERNAL);
    assert_non_null(strstr(tern_last_error(), "turn 5, rep 2: the request sent to arm on"));
    d.body_hash = 8;
    /* Prompt tokens differ between arms. */
    b.prompt_tokens = 51;
    assert_int_equal(tern_replay_check_turn(ms, 4, labels), TERN_ERR_FORMAT);
    assert_non_null(strstr(tern_last_error(), "arm on rep 1 counts 50 prompt tokens, arm off rep 1 counts 51"));
    /* ... or between repetitions of one arm. */
    b.prompt_tokens = 50;
    c.prompt_tokens = 49;
    assert_int_equal(tern_replay_check_turn(ms, 4, labels), TERN_ERR_FORMAT);
}

/* ---- statistics ----------------------------------------------------------------------------- */

static void test_median_and_range(void **state) {
    (void)state;
    double v[] = {3, NAN, 1, 2};
    assert_true(tern_stats_median(v, 4) == 2.0);
    double w[] = {4, 1, 3, 2};
    assert_true(tern_stats_median(w, 4) == 2.5);
    double x[] = {NAN, NAN};
    assert_true(isnan(tern_stats_median(x, 2)));
    assert_true(isnan(tern_stats_median(x, 0)));
    double lo, hi;
    tern_stats_range(v, 4, &lo, &hi);
    assert_true(lo == 1 && hi == 3);
    tern_stats_range(x, 2, &lo, &hi);
    assert_true(isnan(lo) && isnan(hi));
}

static void test_summary_tables(void **state) {
    (void)state;
    /* 4 turns (C e R e), 3 reps, 2 arms; [rep][turn][arm]. */
    enum tern_turn_kind kinds[4] = {TERN_TURN_COLD, TERN_TURN_EXTENSION, TERN_TURN_REWRITE, TERN_TURN_EXTENSION};
    double ttft[3][4][2] = {
        {{1.0, 1.1}, {0.1, 1.2}, {0.3, 1.5}, {0.2, 1.6}},
        {{1.2, 1.0}, {0.3, 1.4}, {0.2, 1.4}, {0.1, 2.0}},
        {{1.1, 1.2}, {0.2, 1.3}, {0.4, 1.3}, {NAN, 1.8}},
    };
    double total[3][4][2];
    long prompt[3][4][2], cached[3][4][2];
    uint64_t hash[3][4][2];
    for (int r = 0; r < 3; r++)
        for (int t = 0; t < 4; t++)
            for (int a = 0; a < 2; a++) {
                total[r][t][a] = ttft[r][t][a] + 1;
                prompt[r][t][a] = 1000 * (t + 1);
                cached[r][t][a] = a == 0 && t > 0 ? 1000 * t - r : 0;
                hash[r][t][a] = t == 2 && a == 1 && r == 2 ? 99 : (uint64_t)t;
            }
    struct tern_replay_summary s;
    assert_int_equal(tern_replay_summarize_arrays(4, 3, 2, kinds, &ttft[0][0][0], &total[0][0][0], &prompt[0][0][0],
                                                  &cached[0][0][0], &hash[0][0][0], &s),
                     TERN_OK);
    /* Per-turn medians over reps. */
    assert_true(fabs(s.turns[0].ttft[0] - 1.1) < 1e-12);
    assert_true(fabs(s.turns[0].ttft[1] - 1.1) < 1e-12);
    assert_true(fabs(s.turns[1].ttft[1] - 1.3) < 1e-12);
    assert_true(fabs(s.turns[3].ttft[0] - 0.15) < 1e-12); /* NAN rep skipped: median of 0.2, 0.1 */
    assert_true(fabs(s.turns[1].ttft_lo[0] - 0.1) < 1e-12 && fabs(s.turns[1].ttft_hi[0] - 0.3) < 1e-12);
    assert_true(fabs(s.turns[1].ratio - 1.3 / 0.2) < 1e-9);
    assert_int_equal(s.turns[2].prompt_tokens, 3000);
    assert_true(s.turns[2].cached[0] == 1999.0);      /* median of 2000, 1999, 1998 */
    assert_true(s.turns[2].read[0] == 1001.0);
    assert_true(s.turns[2].read[1] == 3000.0);
    /* Output identity: turn 2 differs in one measurement. */
    assert_int_equal(s.n_identical, 3);
    assert_false(s.turns[2].output_identical);
    /* Classes: extension turns 1 and 3. */
    const struct tern_class_summary *e = &s.classes[TERN_TURN_EXTENSION];
    assert_int_equal(e->n_turns, 2);
    assert_true(fabs(e->med[0] - (0.2 + 0.15) / 2) < 1e-12);
    assert_true(fabs(e->lo[1] - 1.3) < 1e-12 && fabs(e->hi[1] - 1.8) < 1e-12);
    assert_true(fabs(e->ratio_lo - 1.3 / 0.2) < 1e-9 && fabs(e->ratio_hi - 1.8 / 0.15) < 1e-9);
    assert_int_equal(s.classes[TERN_TURN_COLD].n_turns, 1);
    assert_true(fabs(s.classes[TERN_TURN_COLD].ratio_med - 1.0) < 1e-12);
    /* Sums of per-turn medians. */
    assert_true(fabs(s.sum_ttft[0] - (1.1 + 0.2 + 0.3 + 0.15)) < 1e-12);
    assert_true(fabs(s.sum_ttft[1] - (1.1 + 1.3 + 1.4 + 1.8)) < 1e-12);
    assert_int_equal(s.first_rewrite, 2);
    assert_int_equal(s.last_rewrite, 2);
    /* The rewrite turn against the extension turns around it (1 and 3). */
    assert_int_equal(s.n_vs_ext, 1);
    assert_true(fabs(s.turns[2].vs_ext[0] - 0.3 / ((0.2 + 0.15) / 2)) < 1e-9);
    assert_true(fabs(s.turns[2].vs_ext[1] - 1.4 / ((1.3 + 1.8) / 2)) < 1e-9);
    assert_true(isnan(s.turns[1].vs_ext[0]) && isnan(s.turns[0].vs_ext[1]));
    assert_true(s.vs_ext_lo[0] == s.turns[2].vs_ext[0] && s.vs_ext_hi[1] == s.turns[2].vs_ext[1]);
    tern_replay_summary_free(&s);
    /* Only rewrite turns after the cold one (a stripped transcript): no yardstick. */
    enum tern_turn_kind all_rw[4] = {TERN_TURN_COLD, TERN_TURN_REWRITE, TERN_TURN_REWRITE, TERN_TURN_REWRITE};
    assert_int_equal(tern_replay_summarize_arrays(4, 3, 2, all_rw, &ttft[0][0][0], &total[0][0][0], &prompt[0][0][0],
                                                  &cached[0][0][0], &hash[0][0][0], &s),
                     TERN_OK);
    assert_int_equal(s.n_vs_ext, 0);
    assert_true(isnan(s.turns[2].vs_ext[0]));
    tern_replay_summary_free(&s);
}

/* ---- SVG ------------------------------------------------------------------------------------ */

/* A minimal XML well-formedness check: tags nest and close, attributes are quoted, no
 * stray '<' or '&' in text. Counts elements by name. */
static int count_elem(const char *xml, const char *name) {
    int n = 0;
    size_t k = strlen(name);
    for (const char *p = xml; (p = strchr(p, '<')); p++)
        if (!strncmp(p + 1, name, k) && (p[1 + k] == ' ' || p[1 + k] == '>' || p[1 + k] == '/')) n++;
    return n;
}

static void xml_check(const char *x) {
    char stack[64][32];
    int depth = 0;
    const char *p = x;
    if (!strncmp(p, "<?xml", 5)) p = strstr(p, "?>") + 2;
    int roots = 0;
    while (*p) {
        if (*p == '&') {
            assert_true(!strncmp(p, "&amp;", 5) || !strncmp(p, "&lt;", 4) || !strncmp(p, "&gt;", 4) ||
                        !strncmp(p, "&quot;", 6) || !strncmp(p, "&apos;", 6));
            p++;
            continue;
        }
        if (*p != '<') {
            assert_true(*p != '>');
            p++;
            continue;
        }
        bool closing = p[1] == '/';
        const char *nm = p + 1 + closing;
        size_t nl = strcspn(nm, " />\n");
        assert_true(nl > 0 && nl < 32);
        const char *q = nm + nl;
        /* Attributes: name="value" pairs. */
        while (*q && *q != '>' && !(q[0] == '/' && q[1] == '>')) {
            if (*q == ' ' || *q == '\n') {
                q++;
                continue;
            }
            size_t an = strcspn(q, "=");
            assert_true(an > 0 && an < 40);
            q += an;
            assert_true(q[0] == '=' && q[1] == '"');
            const char *end = strchr(q + 2, '"');
            assert_non_null(end);
            for (const char *v = q + 2; v < end; v++) assert_true(*v != '<');
            q = end + 1;
        }
        assert_true(*q);
        bool self = q[0] == '/';
        if (closing) {
            assert_true(depth > 0);
            depth--;
            assert_true(strlen(stack[depth]) == nl && !strncmp(stack[depth], nm, nl));
        } else if (!self) {
            assert_true(depth < 64);
            if (depth == 0) roots++;
            memcpy(stack[depth], nm, nl);
            stack[depth][nl] = 0;
            depth++;
        }
        p = q + (self ? 2 : 1);
    }
    assert_int_equal(depth, 0);
    assert_int_equal(roots, 1);
}

static void test_svg(void **state) {
    (void)state;
    enum tern_turn_kind kinds[6] = {TERN_TURN_COLD, TERN_TURN_EXTENSION, TERN_TURN_EXTENSION, TERN_TURN_REWRITE,
                                    TERN_TURN_EXTENSION, TERN_TURN_REWRITE};
    double on[6] = {1.2, 0.2, 0.25, 0.3, 0.2, NAN}, off[6] = {1.2, 1.4, 1.6, 1.9, 2.1, 2.3};
    double lo[6] = {1.1, 0.1, 0.2, 0.3, 0.2, NAN}, hi[6] = {1.3, 0.3, 0.3, 0.3, 0.2, NAN};
    double prompt[6] = {1000, 1300, 1600, 1900, 2100, 2300}, read[6] = {1000, 300, 300, 600, 200, 700};
    struct tern_plot p = {.title = "TTFT <a & b>", .subtitle = "model \"x\"", .n = 6, .kinds = kinds,
                          .prompt_tokens = prompt, .read_tokens = read, .read_label = "read by on", .n_series = 2,
                          .series = {{.label = "on", .y = on, .y_lo = lo, .y_hi = hi}, {.label = "off", .y = off}}};
    struct tern_buf b = TERN_BUF_INIT;
    assert_int_equal(tern_plot_svg(&p, &b), TERN_OK);
    xml_check(b.data);
    assert_non_null(strstr(b.data, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_non_null(strstr(b.data, "TTFT &lt;a &amp; b&gt;"));
    /* One polyline per series (the on series' NAN ends it), one marker per point. */
    assert_int_equal(count_elem(b.data, "polyline"), 2);
    assert_non_null(strstr(b.data, "time to first token (s)"));
    assert_non_null(strstr(b.data, "prompt tokens"));
    /* 5 + 6 points: rewrites as diamonds (path), cold as squares, extensions circles;
     * plus one legend marker of each. */
    assert_int_equal(count_elem(b.data, "circle"), 3 + 3 + 1);
    /* Points of the off series climb: y decreases along the polyline. */
    const char *pl = strstr(strstr(b.data, "<polyline") + 1, "<polyline");
    const char *pts = strstr(pl, "points=\"") + 8;
    double prev_y = 1e9;
    for (int i = 0; i < 6; i++) {
        double x, y;
        assert_int_equal(sscanf(pts, "%lf,%lf", &x, &y), 2);
        assert_true(y < prev_y);
        prev_y = y;
        pts = strchr(pts, ' ') + 1;
    }
    tern_buf_free(&b);
    /* Sub-second data switches to milliseconds. */
    double small[6] = {0.01, 0.02, 0.03, 0.04, 0.05, 0.06};
    p.series[0] = (struct tern_plot_series){.label = "on", .y = small};
    p.n_series = 1;
    assert_int_equal(tern_plot_svg(&p, &b), TERN_OK);
    xml_check(b.data);
    assert_non_null(strstr(b.data, "time to first token (ms)"));
    tern_buf_free(&b);
}

static void test_ticks(void **state) {
    (void)state;
    double t[32];
    size_t n = tern_plot_ticks(0, 2.3, 5, t, 32);
    assert_int_equal(n, 6); /* 0, 0.5, ..., 2.5 */
    assert_true(fabs(t[1] - 0.5) < 1e-12 && fabs(t[5] - 2.5) < 1e-12);
    n = tern_plot_ticks(0, 34937, 5, t, 32);
    assert_true(t[n - 1] >= 34937 && fabs(t[1] - 10000) < 1e-9);
    n = tern_plot_ticks(0, 0, 5, t, 32);
    assert_true(n >= 2 && t[n - 1] > 0);
}

/* ---- synthetic transcripts ------------------------------------------------------------------ */

static struct tern_replay_transcript *synth(enum tern_synth_kind k, size_t n, uint64_t seed, bool strip,
                                            struct tern_buf *b) {
    struct tern_synth_opts o = {.kind = k, .n_turns = n, .seed = seed, .strip = strip};
    tern_buf_clear(b);
    assert_int_equal(tern_synth_transcript(&o, b), TERN_OK);
    return parse_ok(b->data);
}

static void test_synth_deterministic(void **state) {
    (void)state;
    struct tern_buf a = TERN_BUF_INIT, b = TERN_BUF_INIT;
    struct tern_replay_transcript *t1 = synth(TERN_SYNTH_AGENT, 20, 7, false, &a);
    struct tern_replay_transcript *t2 = synth(TERN_SYNTH_AGENT, 20, 7, false, &b);
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.data, b.data, a.len);
    tern_transcript_free(t2);
    t2 = synth(TERN_SYNTH_AGENT, 20, 8, false, &b);
    assert_true(a.len != b.len || memcmp(a.data, b.data, a.len) != 0);
    tern_transcript_free(t1);
    tern_transcript_free(t2);
    tern_buf_free(&a);
    tern_buf_free(&b);
}

/* The kinds a generated session must have, stated from its shape (independent of the
 * classifier): a turn after a final answer opens with a new user message, i.e. a
 * template rewrite; a turn after tool calls extends; with stripping every later turn is
 * a client rewrite. */
static void test_synth_kinds(void **state) {
    (void)state;
    struct tern_buf b = TERN_BUF_INIT;
    for (uint64_t seed = 1; seed <= 2; seed++) {
        for (size_t n = 2; n <= 26; n += 8) {
            struct tern_replay_transcript *t = synth(TERN_SYNTH_AGENT, n, seed, false, &b);
            assert_int_equal(t->n_turns, n);
            assert_int_equal(tern_transcript_verify_kinds(t, n), TERN_OK); /* labels = derived */
            assert_int_equal(tern_transcript_check_rewrite(t, n), TERN_OK);
            for (size_t i = 1; i < n; i++) {
                const struct tern_replay_turn *pv = &t->turns[i - 1], *tu = &t->turns[i];
                assert_non_null(pv->reply);
                assert_true(json_string_length(json_object_get(pv->reply, "reasoning_content")) > 0);
                if (pv->reply_tool_calls) {
                    assert_int_equal(tu->kind, TERN_TURN_EXTENSION);
                } else {
                    assert_int_equal(tu->kind, TERN_TURN_REWRITE);
                    assert_string_equal(tu->rewrite_by, "template");
                }
            }
            tern_transcript_free(t);
            t = synth(TERN_SYNTH_AGENT, n, seed, true, &b);
            for (size_t i = 1; i < n; i++) {
                assert_int_equal(t->turns[i].kind, TERN_TURN_REWRITE);
                assert_string_equal(t->turns[i].rewrite_by, "client");
                /* No assistant message the client sends carries reasoning. */
                json_t *msgs = json_object_get(t->turns[i].req, "messages");
                size_t k;
                json_t *m;
                json_array_foreach(msgs, k, m) assert_null(json_object_get(m, "reasoning_content"));
            }
            tern_transcript_free(t);
        }
        /* Compaction: exactly one turn shrinks the message list, and it is a client rewrite. */
        struct tern_replay_transcript *t = synth(TERN_SYNTH_COMPACTION, 12, seed, false, &b);
        int n_shrink = 0;
        for (size_t i = 1; i < t->n_turns; i++) {
            size_t a = json_array_size(json_object_get(t->turns[i - 1].req, "messages"));
            size_t c = json_array_size(json_object_get(t->turns[i].req, "messages"));
            if (c < a) {
                n_shrink++;
                assert_int_equal(t->turns[i].kind, TERN_TURN_REWRITE);
                assert_string_equal(t->turns[i].rewrite_by, "client");
                assert_true(i >= 8);
                json_t *sum = json_array_get(json_object_get(t->turns[i].req, "messages"), 2);
                assert_non_null(strstr(json_string_value(json_object_get(json_array_get(json_object_get(sum, "content"), 0), "text")),
                                       "<state_snapshot>"));
            }
        }
        assert_int_equal(n_shrink, 1);
        tern_transcript_free(t);
    }
    struct tern_synth_opts o = {.kind = TERN_SYNTH_AGENT, .n_turns = 1};
    assert_int_equal(tern_synth_transcript(&o, &b), TERN_ERR_INVALID);
    assert_non_null(strstr(tern_last_error(), "--turns 1 out of range"));
    tern_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transcript_parse_malformed),
        cmocka_unit_test(test_transcript_raw_bytes_and_fields),
        cmocka_unit_test(test_transcript_kinds_derived),
        cmocka_unit_test(test_transcript_mislabeled_kind_fails),
        cmocka_unit_test(test_body_build_edits),
        cmocka_unit_test(test_sse_parser),
        cmocka_unit_test(test_chat_stream),
        cmocka_unit_test(test_check_usage),
        cmocka_unit_test(test_check_turn),
        cmocka_unit_test(test_median_and_range),
        cmocka_unit_test(test_summary_tables),
        cmocka_unit_test(test_svg),
        cmocka_unit_test(test_ticks),
        cmocka_unit_test(test_synth_deterministic),
        cmocka_unit_test(test_synth_kinds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
