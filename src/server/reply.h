/* What the model says, turned into what an OpenAI client expects.
 *
 * Two stages, both streaming (text arrives a token at a time, split anywhere):
 *
 *   stop matcher  raw text -> text with stop strings cut; never lets out a piece of
 *                 text that may turn out to be the start of a stop string.
 *   reply parser  text -> content, reasoning_content, tool_calls, for the model's
 *                 output format. Markers split across feeds are held back until they
 *                 are decided, so nothing partial ever leaks into a delta.
 *
 * Output formats are a table (struct reply_format): the Qwen family first —
 * `<think>…</think>` for reasoning and `<tool_call>{json}</tool_call>` (Qwen2.5/Qwen3)
 * or `<tool_call><function=NAME><parameter=P>…` (Qwen3-Coder / Qwen3.5) for tool calls.
 * Another family adds a row with its markers.
 *
 * The concatenation of every delta equals the final result: a streamed response and a
 * non-streamed one carry the same text. */
#ifndef TERN_SERVER_REPLY_H
#define TERN_SERVER_REPLY_H

#include "util/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- stop strings ------------------------------------------------------------------ */

struct stop_matcher {
    const char *const *stops;   /* borrowed */
    size_t n_stops;
    struct tern_buf held;       /* a suffix that may still become a stop string */
    bool stopped;
    int which;                  /* stopped: the index of the stop string found */
};

void stop_matcher_init(struct stop_matcher *m, const char *const *stops, size_t n_stops);
/* Appends to out the part of text that can no longer be the start of a stop string;
 * sets m->stopped (and drops everything from the stop string on) when one completes. */
enum tern_status stop_matcher_feed(struct stop_matcher *m, const char *text, size_t n, struct tern_buf *out);
/* End of generation: the held text was not a stop string after all. */
enum tern_status stop_matcher_flush(struct stop_matcher *m, struct tern_buf *out);
void stop_matcher_free(struct stop_matcher *m);

/* ---- output formats ---------------------------------------------------------------- */

struct reply_format {
    const char *name;
    const char *think_open, *think_close;  /* NULL: no reasoning markers */
    const char *tool_open, *tool_close;    /* NULL: no tool-call markers */
    bool harmony;                          /* OpenAI's harmony messages (below) */
};

/* "qwen": <think> and <tool_call> (JSON or XML-function bodies). */
extern const struct reply_format reply_format_qwen;
/* Plain text: everything is content. */
extern const struct reply_format reply_format_plain;
/* "harmony" (gpt-oss): a reply is a run of messages, each
 *     [<|start|>assistant]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY<|end|>
 * (the last one ends at <|call|> or <|return|>, end-of-generation tokens the text never
 * shows). The analysis channel is reasoning, final is content, commentary is content
 * unless it has a recipient: `to=functions.NAME` makes the body a tool call's JSON
 * arguments. The recipient may stand in the role part of the header instead
 * (`<|start|>assistant to=functions.NAME<|channel|>commentary json`), as the template
 * renders past calls. Anything that is not well-formed harmony goes out as content. */
extern const struct reply_format reply_format_harmony;

/* ---- the parser -------------------------------------------------------------------- */

struct reply_tool_call {
    char id[40];
    char *name;
    struct tern_buf args;       /* JSON text of the arguments, as streamed */
};

/* One step's worth of output, drained by the caller after each feed. */
struct reply_delta_call {
    uint32_t index;
    bool begin;                 /* first event for this call: id, type, name go out */
    struct tern_buf args;       /* argument fragment ("" allowed) */
};

struct reply_delta {
    struct tern_buf content;
    struct tern_buf reasoning;
    struct reply_delta_call *calls;
    size_t n_calls, cap_calls;
};

struct reply_parser {
    const struct reply_format *fmt;
    bool tools;                 /* parse tool calls (tool_choice != none, tools given) */
    uint64_t id_seed;           /* tool-call ids: "call_" + 24 chars drawn from it */

    int state;                  /* content, think, tool; harmony: text, header, body */
    struct tern_buf pending;    /* text not yet decided */
    bool strip_leading;         /* drop whitespace at the start of the current section */
    bool seen_content;          /* non-whitespace content emitted: <think> no longer opens */
    struct tern_buf ws_held;    /* trailing whitespace of the section, held */

    /* the tool call being read */
    struct tern_buf body;
    int sc_depth, sc_mode;      /* the JSON scanner: depth and where we are at depth 1 */
    bool sc_in_str, sc_esc;
    struct tern_buf sc_key;     /* key being read at depth 1 */
    struct tern_buf sc_name;    /* raw name string */
    int sc_value;               /* which value we are in: none, name, args, other */
    bool sc_args_string;        /* arguments given as a JSON string */
    struct tern_buf sc_args;    /* args text before the header went out */
    bool call_begun, name_done, args_seen, args_done;

    /* harmony: the header being read, and where the current body goes */
    struct tern_buf head;
    int h_to;                   /* body: content, reasoning or a call's arguments */

    /* totals */
    struct tern_buf content;
    struct tern_buf reasoning;
    struct reply_tool_call *calls;
    size_t n_calls, cap_calls;

    struct reply_delta delta;
    enum tern_status err;       /* sticky: NOMEM */
};

/* in_think: the prompt already opened a reasoning block (a template that ends the
 * generation prompt with "<think>\n"), so output starts as reasoning. */
void reply_parser_init(struct reply_parser *p, const struct reply_format *fmt, bool tools, bool in_think,
                       uint64_t id_seed);
enum tern_status reply_parser_feed(struct reply_parser *p, const char *text, size_t n);
/* End of output: decides what was held back (an unfinished marker is content). */
enum tern_status reply_parser_finish(struct reply_parser *p);
/* The delta accumulated since the last reset; reply_delta_reset empties it. */
struct reply_delta *reply_parser_delta(struct reply_parser *p);
bool reply_delta_empty(const struct reply_delta *d);
void reply_delta_reset(struct reply_delta *d);
void reply_parser_free(struct reply_parser *p);

/* True while the parser is inside a reasoning block (the last text fed was reasoning). */
bool reply_parser_in_think(const struct reply_parser *p);

/* True when the text ends inside an opened reasoning block: the last think_open is
 * after the last think_close (ignoring trailing whitespace). */
bool reply_prompt_opens_think(const struct reply_format *fmt, const char *prompt, size_t n);

#endif
