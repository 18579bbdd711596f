/* Fuzz target: GBNF text -> compiled grammar -> matcher. The input is the grammar, then
 * (after a NUL byte, if any) bytes to match and to steer a walk through token masks.
 * Whatever the input: a grammar or an error with a position; a compiled grammar's
 * masks only allow tokens the matcher accepts, and it is never stuck before its end. */
#include "fuzz-common-grammar.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct tern_gvocab *v;
    if (!v) v = fuzz_vocab();
    const uint8_t *nul = memchr(data, 0, size);
    size_t glen = nul ? (size_t)(nul - data) : size;
    const uint8_t *rest = nul ? nul + 1 : data + size;
    size_t rlen = (size_t)(data + size - rest);
    struct tern_grammar *g = NULL;
    if (tern_grammar_compile((const char *)data, glen, NULL, &g)) {
        if (g) abort();
        if (!strstr(tern_last_error(), "grammar")) abort();
        return 0;
    }
    struct tern_gmatch *m = NULL;
    if (!tern_gmatch_new(g, NULL, &m)) {
        bool whole = tern_gmatch_matches(m, rest, rlen);
        bool ok = true;
        for (size_t i = 0; i < rlen && ok; i++) ok = tern_gmatch_accept_bytes(m, rest + i, 1);
        if (whole != (ok && tern_gmatch_can_end(m))) abort(); /* the two ways agree */
        tern_gmatch_free(m);
    }
    fuzz_walk(g, v, rest, rlen, 24);
    tern_grammar_free(g);
    return 0;
}
