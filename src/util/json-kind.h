/* What a JSON value is, as error messages name it ("expected a string, got an array").
 * Shared by request parsing and the schema converter. */
#ifndef TERN_UTIL_JSON_KIND_H
#define TERN_UTIL_JSON_KIND_H

#include <jansson.h>

static inline const char *tern_json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

#endif
