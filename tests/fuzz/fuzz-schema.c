/* Fuzz target: JSON Schema -> GBNF -> compiled grammar. Whatever the input: a grammar
 * or a refusal with a JSON pointer; a grammar the converter produced always compiles
 * (or hits a documented size limit), and a walk through its masks never gets stuck. */
#include "fuzz-common-grammar.h"
#include "grammar/schema.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct tern_gvocab *v;
    if (!v) v = fuzz_vocab();
    json_t *s = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!s) return 0;
    struct tern_buf b = TERN_BUF_INIT;
    char ptr[256];
    enum tern_status st = tern_json_schema_to_gbnf(s, &b, ptr, sizeof ptr);
    json_decref(s);
    if (st) {
        if (!strstr(tern_last_error(), "json schema")) abort();
        tern_buf_free(&b);
        return 0;
    }
    struct tern_grammar *g = NULL;
    st = tern_grammar_compile(b.data, b.len, NULL, &g);
    if (st && st != TERN_ERR_LIMIT && st != TERN_ERR_NOMEM) abort(); /* the converter wrote a bad grammar */
    if (!st) fuzz_walk(g, v, data, size, 32);
    tern_grammar_free(g);
    tern_buf_free(&b);
    return 0;
}
