/* Structured output: the request fields that constrain decoding (issue 16), turned
 * into a compiled grammar.
 *
 *   grammar                         GBNF text (chat and completions; llama.cpp's field)
 *   response_format                 {type: "text" | "json_object" | "json_schema",
 *                                    json_schema: {name, schema, strict}} (OpenAI); also
 *                                    llama.cpp's {type: "json_object", schema: {...}}
 *   json_schema                     a schema at the top level (llama.cpp's field)
 *   tool_choice "required" / named  a tool call in the model's tool-call syntax whose
 *                                    arguments match the tool's parameters (chat)
 *   parallel_tool_calls             false: exactly one call (default true: one or more)
 *
 * Everything is checked while the request is parsed, so bad grammars and schemas are a
 * 400 before the request is queued: the message has the GBNF line and column or the
 * schema's JSON pointer, and param names the field. Pure functions (no model). */
#ifndef TERN_SERVER_CONSTRAIN_H
#define TERN_SERVER_CONSTRAIN_H

#include "server/request.h"
#include "util/buf.h"

#include <jansson.h>
#include <stdbool.h>

struct tern_grammar;

/* The tool-call syntax of a chat template. */
enum srv_tool_syntax {
    SRV_TOOL_SYNTAX_NONE = 0, /* no tool-call markers tern knows */
    SRV_TOOL_SYNTAX_JSON,     /* <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (Qwen2.5, Qwen3) */
    SRV_TOOL_SYNTAX_XML,      /* <tool_call>\n<function=NAME>\n<parameter=P>\nV\n</parameter>\n... (Qwen3-Coder, Qwen3.5) */
    SRV_TOOL_SYNTAX_HARMONY,  /* <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...} (gpt-oss) */
};

/* From the template's source (and whether the output format has tool-call markers). */
enum srv_tool_syntax srv_tool_syntax_detect(const char *template_src, size_t len, bool qwen_markers);
const char *srv_tool_syntax_name(enum srv_tool_syntax s);

/* Parses grammar / response_format / json_schema / parallel_tool_calls from the body o
 * into req (req->grammar, req->parallel_tool_calls). False with *err (400) on bad input. */
bool srv_constraint_parse(const json_t *o, struct srv_request *req, struct srv_error *err);
void srv_constraint_free(struct srv_request *req);

/* True when the request's tool_choice asks for an enforced call. */
bool srv_tools_enforced(const struct srv_request *req);

/* The GBNF of an enforced tool call (tool_choice required or named) in syntax syn.
 * in_think: the prompt opened a reasoning block, which the output must close first.
 * Harmony: an optional analysis message, then one call (a call ends the turn: <|call|>
 * is an end-of-generation token, so parallel_tool_calls cannot ask for more).
 * Appends to out; false with *err (400 naming tools[i].function.parameters and the
 * schema's pointer) when a schema cannot be enforced. */
bool srv_tool_gbnf(const struct srv_request *req, enum srv_tool_syntax syn, bool in_think, struct tern_buf *out,
                   struct srv_error *err);

/* Compiles GBNF text into *out; false with *err (400, param) on a bad grammar. */
bool srv_grammar_compile(const char *text, size_t len, const char *param, struct tern_grammar **out,
                         struct srv_error *err);

#endif
