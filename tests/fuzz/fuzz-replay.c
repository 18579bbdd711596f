/* Fuzz target for the replay harness's parsers: transcripts (parse, classify every turn,
 * verify kinds, build every body) and streamed chat-completions responses (SSE framing
 * and chunk JSON, fed in pieces). The first byte picks the parser and the piece size. */
#include "replay/replay.h"
#include "util/timeutil.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void fuzz_transcript(const char *p, size_t n) {
    struct tern_replay_transcript *t = NULL;
    if (tern_transcript_parse(p, n, "fuzz", &t) != TERN_OK) return;
    for (size_t i = 0; i < t->n_turns; i++) {
        struct tern_turn_class c;
        (void)tern_transcript_classify(t, i, &c);
        struct tern_buf b = TERN_BUF_INIT;
        struct tern_body_edits e;
        struct tern_body_opts o = {.max_tokens = (long)(i % 3) - 1, .cache_salt = i % 2 ? "salt" : NULL};
        enum tern_status st = tern_replay_body_build(&t->turns[i], &o, &b, &e);
        /* An edit must never break the body or the prompt's bytes. */
        if (st == TERN_ERR_INTERNAL) abort();
        tern_buf_free(&b);
    }
    (void)tern_transcript_verify_kinds(t, t->n_turns);
    (void)tern_transcript_check_rewrite(t, t->n_turns);
    free(tern_transcript_kinds_string(t, t->n_turns));
    tern_transcript_free(t);
}

static void fuzz_stream(const char *p, size_t n, size_t piece) {
    struct tern_replay_meas m = {0};
    struct tern_chat_stream *cs = NULL;
    if (tern_chat_stream_new(&m, tern_now_ns(), &cs) != TERN_OK) return;
    enum tern_status st = TERN_OK;
    for (size_t i = 0; i < n && st == TERN_OK; i += piece)
        st = tern_chat_stream_feed(cs, p + i, n - i < piece ? n - i : piece);
    if (st == TERN_OK) (void)tern_chat_stream_finish(cs, tern_now_ns());
    (void)tern_replay_check_usage(&m, "fuzz");
    tern_chat_stream_free(cs);
    tern_replay_meas_clear(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] & 1) fuzz_stream(p, n, 1 + (data[0] >> 1));
    else fuzz_transcript(p, n);
    return 0;
}
