/* JSON Schema -> GBNF, for constrained decoding of JSON (response_format, tool-call
 * arguments).
 *
 * Supported: type (object, array, string, number, integer, boolean, null, and arrays
 * of them), properties, required, additionalProperties, items, enum, const, anyOf,
 * oneOf, $ref (JSON pointers into the same document: #/$defs/x, #/definitions/x, #),
 * $defs/definitions, minItems/maxItems, minLength/maxLength, pattern (the regex subset
 * of docs/SERVING.md), format (date, time, date-time, uuid), minimum/maximum and
 * exclusiveMinimum/exclusiveMaximum on integers (and minimum 0 on numbers).
 * Annotations (title, description, default, examples, $schema, $id, $comment,
 * deprecated, readOnly, writeOnly) are ignored. Any other keyword is refused, naming it
 * and its JSON pointer; nothing is silently ignored.
 *
 * What the grammar generates is always valid against the schema, but not every valid
 * document can be generated: declared properties come in the declared order, no
 * undeclared property is generated when `properties` is given, whitespace is bounded
 * (at most a newline and 16 spaces or tabs between tokens), numbers have at most 16
 * integer and 16 fraction digits, integers at most 16 digits, and oneOf is generated
 * as anyOf (the branches are expected to be disjoint, as in the usual "a or b" use). */
#ifndef TERN_GRAMMAR_SCHEMA_H
#define TERN_GRAMMAR_SCHEMA_H

#include "tern.h"
#include "util/buf.h"

#include <jansson.h>
#include <stddef.h>

#define TERN_SCHEMA_MAX_GBNF (1u << 20) /* bytes of generated grammar */
#define TERN_SCHEMA_MAX_DEPTH 64        /* nesting of schemas (not of $ref recursion) */

struct tern_schema_gbnf;

enum tern_status tern_schema_gbnf_new(struct tern_schema_gbnf **out);
void tern_schema_gbnf_free(struct tern_schema_gbnf *c);
/* Defines the rule `name` (letters, digits, '-') as the values valid against schema;
 * $refs resolve inside schema. On error the message names the problem and ptr (cap
 * bytes) holds its JSON pointer within schema ("" = the schema itself). */
enum tern_status tern_schema_gbnf_add(struct tern_schema_gbnf *c, const char *name, const json_t *schema, char *ptr,
                                      size_t ptr_cap);
/* The same for a schema inside the document doc ($refs resolve in doc; base is
 * schema's JSON pointer in doc, for error pointers). */
enum tern_status tern_schema_gbnf_add_in(struct tern_schema_gbnf *c, const char *name, const json_t *doc,
                                         const json_t *schema, const char *base, char *ptr, size_t ptr_cap);
/* Appends GBNF text as is (the caller's own rules). */
enum tern_status tern_schema_gbnf_raw(struct tern_schema_gbnf *c, const char *text);
/* The grammar so far plus the shared JSON rules; valid until the next call. */
const char *tern_schema_gbnf_text(struct tern_schema_gbnf *c, size_t *len);

/* The whole thing for one schema: root ::= <a value valid against schema>. */
enum tern_status tern_json_schema_to_gbnf(const json_t *schema, struct tern_buf *out, char *ptr, size_t ptr_cap);

/* GBNF for any JSON object (response_format json_object). */
const char *tern_json_object_gbnf(void);

/* Appends to out a GBNF literal ("...") for the bytes s[0..n). */
enum tern_status tern_gbnf_literal(struct tern_buf *out, const char *s, size_t n);

#endif
