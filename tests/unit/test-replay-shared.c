/* replay on the shared kit's recorded transcripts (bench/ transcripts): the derived kinds,
 * divergence points and rendered sizes equal what the kit's generator recorded, and
 * the bodies the harness sends are the recorded bytes exactly. Skipped without the kit. */
#include "harness.h"

#include "replay/replay.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *file;
    const char *kinds; /* from the kit's README */
} files[] = {
    {"bench/agent-short.jsonl", "CeeeeReeeReeeReeeReeeeRee"},
    {"bench/agent-short-stripped.jsonl", "CRRRRRRRRRRRRRRRRRRRRRRRR"},
    {"bench/compaction-short.jsonl", "CeeeeReeRRee"},
    {"bench/agent-long.jsonl", "CeeeeReeeReeeReeeReeeeRee"},
    {"bench/agent-long-stripped.jsonl", "CRRRRRRRRRRRRRRRRRRRRRRRR"},
    {"bench/compaction.jsonl", "CeeeeReeRRee"},
};

static void check_file(const char *rel, const char *want_kinds) {
    th_require_shared(rel);
    const char *path = th_shared_path(rel);
    struct tern_replay_transcript *t = NULL;
    enum tern_status st = tern_transcript_load(path, &t);
    if (st != TERN_OK) fprintf(stderr, "%s\n", tern_last_error());
    assert_int_equal(st, TERN_OK);
    char *k = tern_transcript_kinds_string(t, t->n_turns);
    assert_string_equal(k, want_kinds);
    free(k);
    assert_int_equal(tern_transcript_verify_kinds(t, t->n_turns), TERN_OK);
    assert_int_equal(tern_transcript_check_rewrite(t, t->n_turns), TERN_OK);
    struct tern_buf body = TERN_BUF_INIT;
    for (size_t i = 0; i < t->n_turns; i++) {
        const struct tern_replay_turn *tu = &t->turns[i];
        /* The recorded annotations, read independently of the transcript module. */
        const char *line = tu->request;
        while (line > t->text && line[-1] != '\n') line--;
        const char *eol = strchr(line, '\n');
        json_t *j = json_loadb(line, eol ? (size_t)(eol - line) : strlen(line), 0, NULL);
        assert_non_null(j);
        struct tern_turn_class c;
        assert_int_equal(tern_transcript_classify(t, i, &c), TERN_OK);
        assert_string_equal(tern_turn_kind_name(c.kind), json_string_value(json_object_get(j, "kind")));
        json_t *by = json_object_get(j, "rewrite_by"), *dm = json_object_get(j, "diverge_msg");
        if (json_is_string(by)) assert_string_equal(c.rewrite_by, json_string_value(by));
        else assert_null(c.rewrite_by);
        if (json_is_integer(dm)) assert_int_equal(c.diverge_msg, json_integer_value(dm));
        if ((long)c.prompt_chars != (long)json_integer_value(json_object_get(j, "prompt_chars")))
            fprintf(stderr, "%s turn %zu: prompt_chars %zu, recorded %lld\n", rel, i, c.prompt_chars,
                    json_integer_value(json_object_get(j, "prompt_chars")));
        assert_int_equal(c.prompt_chars, json_integer_value(json_object_get(j, "prompt_chars")));
        assert_int_equal(c.shared_prefix_chars, json_integer_value(json_object_get(j, "shared_prefix_chars")));
        /* The bytes sent are the recorded request: its length is body_bytes and no
         * edit is needed (stream and include_usage are recorded). */
        assert_int_equal(tu->request_len, json_integer_value(json_object_get(j, "body_bytes")));
        struct tern_body_edits e;
        struct tern_body_opts o = {.max_tokens = -1};
        assert_int_equal(tern_replay_body_build(tu, &o, &body, &e), TERN_OK);
        assert_int_equal(e.n, 0);
        assert_int_equal(body.len, tu->request_len);
        assert_memory_equal(body.data, tu->request, body.len);
        json_decref(j);
    }
    tern_buf_free(&body);
    tern_transcript_free(t);
}

static void test_short(void **state) {
    (void)state;
    for (int i = 0; i < 3; i++) check_file(files[i].file, files[i].kinds);
}

static void test_long(void **state) {
    (void)state;
    for (int i = 3; i < 6; i++) check_file(files[i].file, files[i].kinds);
}

int main(void) {
    th_require_shared("bench/agent-short.jsonl");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_short),
        cmocka_unit_test(test_long),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
