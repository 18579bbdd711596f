/* Agent-session transcripts for the replay harness: one JSON line per turn, the format
 * of the shared kit's bench/ transcripts (see docs/replay.md):
 *
 *   {"turn": 0, "kind": "cold"|"extension"|"rewrite", "rewrite_by": ..., "request": {...},
 *    "reply": {...}, ...}
 *
 * Only "request" is required. "kind" is checked against what the messages show (or
 * derived when absent); "reply" is the assistant message the client recorded for the
 * turn (never sent; it tells which turns made tool calls and what the server held).
 *
 * The request is kept as the exact bytes it has in the file, so that every arm of a
 * replay receives the same bytes; the harness's few edits (stream, stream_options,
 * max_tokens, cache_salt) are made on those bytes, top-level keys only. */
#ifndef TERN_REPLAY_TRANSCRIPT_H
#define TERN_REPLAY_TRANSCRIPT_H

#include "util/buf.h"
#include "util/status.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum tern_turn_kind { TERN_TURN_COLD = 0, TERN_TURN_EXTENSION = 1, TERN_TURN_REWRITE = 2, TERN_TURN_KIND_COUNT };

const char *tern_turn_kind_name(enum tern_turn_kind k); /* "cold", "extension", "rewrite" */
char tern_turn_kind_letter(enum tern_turn_kind k);      /* 'C', 'e', 'R' (the bench README's kinds string) */

struct tern_replay_turn {
    size_t line_no;             /* 1-based line of the file */
    long turn;                  /* 0-based turn number (the line's "turn", checked) */
    bool labeled;               /* the line had a "kind" */
    enum tern_turn_kind kind;   /* the label, or the derived kind when unlabeled */
    char rewrite_by[16];        /* "template" or "client" for a rewrite, else "" */
    const char *request;        /* exact bytes of the "request" value (into the transcript text) */
    size_t request_len;
    json_t *req;                /* the request, parsed (owned) */
    json_t *reply;              /* the recorded reply, or NULL (owned) */
    bool reply_tool_calls;      /* the reply made tool calls (the next turn carries results) */
    long max_tokens;            /* request max_tokens (or max_completion_tokens); -1 if absent */
    long body_bytes;            /* the line's "body_bytes", or -1 */
};

struct tern_replay_transcript {
    char *path;                 /* as given (for messages) */
    char *text;                 /* the whole file; turns point into it */
    size_t text_len;
    struct tern_replay_turn *turns;
    size_t n_turns;
};

/* Reads and validates a transcript. Every problem is an error naming the file and the
 * line: "t.jsonl line 4: invalid JSON at column 17: ...", "line 3: 'request' is not an
 * object", "line 5: turn 7 out of order (expected 4)", "line 2: unknown kind 'x'".
 * Blank lines are skipped. On error *out is NULL. */
enum tern_status tern_transcript_load(const char *path, struct tern_replay_transcript **out);
/* The same from memory (text is copied); `name` stands for the path in messages. */
enum tern_status tern_transcript_parse(const char *text, size_t len, const char *name,
                                       struct tern_replay_transcript **out);
void tern_transcript_free(struct tern_replay_transcript *t);

/* ---- kinds ---------------------------------------------------------------------------
 * A turn's kind, derived the way bench/README.md defines it: against what a server had
 * after the previous turn (its messages plus the recorded reply, as generated), both
 * rendered with a Qwen3-style chat template (reasoning kept only for assistant messages
 * after the last user message). extension: the messages only append and the rendered
 * prompt extends; rewrite by template: the messages only append but the render changed
 * earlier (old reasoning dropped); rewrite by client: earlier messages changed. */
struct tern_turn_class {
    enum tern_turn_kind kind;
    const char *rewrite_by;     /* "template", "client" or NULL */
    long diverge_msg;           /* message index where the render first differs; -1 if none */
    size_t prompt_chars;        /* characters (code points) of the rendered prompt */
    size_t shared_prefix_chars; /* characters shared with the previous turn's rendered prompt */
};

enum tern_status tern_transcript_classify(const struct tern_replay_transcript *t, size_t i,
                                          struct tern_turn_class *out);

/* Checks the labels of turns [0, n_turns) against the derived kinds; the first
 * mismatch is an error naming the turn, the line, both kinds and why. */
enum tern_status tern_transcript_verify_kinds(const struct tern_replay_transcript *t, size_t n_turns);

/* The integrity check of DESIGN.md §6: turns [0, n_turns) must contain a rewrite, or
 * the replay would not test what it claims to (TERN_ERR_INVALID, saying so). */
enum tern_status tern_transcript_check_rewrite(const struct tern_replay_transcript *t, size_t n_turns);

/* "CeeeeR..." for turns [0, n_turns); caller frees. */
char *tern_transcript_kinds_string(const struct tern_replay_transcript *t, size_t n_turns);

/* The Qwen3-style render used for kinds (add_generation_prompt as given). spans, if
 * not NULL, receives n_messages (start, end) byte offsets (caller frees). Exposed for
 * tests and for the synthetic-transcript generator. */
enum tern_status tern_transcript_render(json_t *messages, json_t *tools, bool add_generation_prompt,
                                        struct tern_buf *out, size_t **spans);

/* ---- request bodies ------------------------------------------------------------------ */

struct tern_body_opts {
    long max_tokens;        /* >= 0: set max_tokens (or max_completion_tokens if the request uses
                               that name); < 0: keep the recorded value */
    const char *cache_salt; /* non-NULL: set "cache_salt" (appended to a recorded one after '/') */
};

#define TERN_BODY_EDITS_MAX 8

struct tern_body_edits {
    size_t n;
    char what[TERN_BODY_EDITS_MAX][96]; /* e.g. "added stream_options.include_usage=true" */
};

/* The body to POST for turn `turn`: its recorded bytes with only these top-level edits
 * (each listed in *edits): "stream": true when it is not already; "stream_options":
 * include_usage true when not already (other stream_options members kept); max_tokens
 * and cache_salt per opts. "messages", "tools" and every other member keep their bytes
 * (checked: TERN_ERR_INTERNAL if not). */
enum tern_status tern_replay_body_build(const struct tern_replay_turn *turn, const struct tern_body_opts *opts,
                                        struct tern_buf *out, struct tern_body_edits *edits);

#endif
