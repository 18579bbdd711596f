/* Shared by the grammar fuzz targets: a small byte-level vocabulary (every byte, some
 * multi-byte pieces, a split code point, an end-of-generation token) and a walk that
 * checks what the masks promise: every allowed token is accepted, and a grammar that
 * compiled is never stuck before it can end. */
#ifndef TERN_FUZZ_COMMON_GRAMMAR_H
#define TERN_FUZZ_COMMON_GRAMMAR_H

#include "grammar/grammar.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static struct tern_gvocab *fuzz_vocab(void) {
    static const char *extra[] = {"ab", "{\"", "\":", "\",", "true", "null", "\xe6\x97\xa5", "\xe6\x97", "\xa5",
                                  "\xc3\xa9", "  ", "\n  ", "12", "-1", ".5", "e+", "<t>"};
    enum { N_EXTRA = sizeof extra / sizeof extra[0] };
    static char bytes[256][1];
    const char *pieces[256 + N_EXTRA + 1];
    uint32_t lens[256 + N_EXTRA + 1];
    bool eog[256 + N_EXTRA + 1], special[256 + N_EXTRA + 1];
    uint32_t n = 0;
    for (int b = 0; b < 256; b++) {
        bytes[b][0] = (char)b;
        pieces[n] = bytes[b];
        lens[n] = 1;
        eog[n] = special[n] = false;
        n++;
    }
    for (int i = 0; i < N_EXTRA; i++) {
        pieces[n] = extra[i];
        lens[n] = (uint32_t)strlen(extra[i]);
        eog[n] = false;
        special[n] = extra[i][0] == '<';
        n++;
    }
    pieces[n] = "";
    lens[n] = 0;
    eog[n] = true;
    special[n] = false;
    n++;
    struct tern_gvocab *v = NULL;
    if (tern_gvocab_new(n, pieces, lens, eog, special, &v)) abort();
    return v;
}

/* Walks up to n_steps tokens, choosing by the seed bytes. */
static void fuzz_walk(const struct tern_grammar *g, const struct tern_gvocab *v, const uint8_t *seed, size_t n_seed,
                      int n_steps) {
    struct tern_gmatch *m = NULL;
    if (tern_gmatch_new(g, v, &m)) return; /* out of memory */
    uint32_t nv = tern_gvocab_n_vocab(v);
    uint32_t *mask = calloc((nv + 31) / 32, sizeof *mask);
    if (!mask) abort();
    for (int step = 0; step < n_steps; step++) {
        enum tern_status st;
        size_t cnt = tern_gmatch_mask(m, mask, &st);
        if (st) break; /* a state limit: reported, not a crash */
        if (cnt == 0) abort(); /* a compiled grammar is never stuck (the vocabulary has every byte) */
        size_t pick = n_seed ? seed[step % n_seed] % cnt : 0, seen = 0;
        int32_t tok = -1;
        for (uint32_t i = 0; i < nv && tok < 0; i++)
            if ((mask[i / 32] >> (i % 32)) & 1 && seen++ == pick) tok = (int32_t)i;
        if (tok < 0) abort();
        bool was_end = tern_gmatch_can_end(m);
        if (!tern_gmatch_accept_token(m, tok)) abort(); /* allowed means accepted */
        if (tok == (int32_t)nv - 1) {
            if (!was_end) abort();
            break;
        }
    }
    free(mask);
    tern_gmatch_free(m);
}

#endif
