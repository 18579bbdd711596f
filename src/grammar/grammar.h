/* Grammars for constrained decoding: GBNF (llama.cpp's format) compiled to a pushdown
 * automaton, run over the UTF-8 bytes of tokens, with per-state token masks.
 *
 *   tern_grammar       a compiled grammar: rules as flat element arrays (immutable, may be
 *                      shared by any number of matchers on one thread at a time)
 *   tern_gvocab        the token pieces of a vocabulary as a byte trie (immutable)
 *   tern_gmatch        one generation's position in a grammar: a set of configurations
 *                      (a grammar position + an interned return stack) and a pending
 *                      partial UTF-8 code point; caches token masks by state.
 *
 * Semantics follow llama.cpp's grammar engine: the whole output must match `root`;
 * a token is allowed when all of its bytes can be consumed (a token may end inside a
 * code point: the code point is finished by the next token, and a token is allowed only
 * if some completion of it could match); end-of-generation tokens are allowed exactly
 * when the output so far is a complete match.
 *
 * Refused at compile time with the line and column (or the rule): syntax errors,
 * undefined rules, a missing root, left recursion (a rule reaching itself without
 * consuming input, unless only through tail calls, which push nothing), rules that can
 * never finish, and grammars past the size limits below. A state whose expansion passes
 * TERN_GRAMMAR_MAX_EXPANSION is an error of tern_gmatch_new or of a mask. */
#ifndef TERN_GRAMMAR_H
#define TERN_GRAMMAR_H

#include "tern.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TERN_GRAMMAR_MAX_SOURCE (1u << 20)   /* bytes of GBNF text */
#define TERN_GRAMMAR_MAX_ELEMENTS (1u << 20) /* compiled elements (repetitions expand) */
#define TERN_GRAMMAR_MAX_REPEAT 10000        /* m and n of {m,n} */
#define TERN_GRAMMAR_MAX_STACK 4096          /* nesting depth of a configuration's stack */
#define TERN_GRAMMAR_MAX_TOKEN_BYTES 512     /* longer token pieces are never allowed */
#define TERN_GRAMMAR_MAX_EXPANSION (1u << 18) /* configurations visited expanding one state */
/* Steps of one compile (each element made, rule name probed, call looked at by the
 * checks): the compile is linear in the grammar, and this bounds it whatever the shape
 * (a 1 MiB grammar takes a few million); past it, TERN_ERR_LIMIT. */
#define TERN_GRAMMAR_MAX_WORK (1u << 24)

struct tern_grammar;
struct tern_gvocab;
struct tern_gmatch;
struct tern_tokenizer;

/* Compiles GBNF src[0..len) with start rule root (NULL: "root"). On error *out is NULL
 * and the message says where: "line 3, column 7: expected '::='" or names the rule. */
enum tern_status tern_grammar_compile(const char *src, size_t len, const char *root, struct tern_grammar **out);
void tern_grammar_free(struct tern_grammar *g);
size_t tern_grammar_n_rules(const struct tern_grammar *g);
/* The steps its compile took (at most TERN_GRAMMAR_MAX_WORK): for tests and logs. */
uint64_t tern_grammar_work(const struct tern_grammar *g);
/* Same source and start rule (so a matcher's tables and mask cache built for one serve
 * the other). */
bool tern_grammar_same(const struct tern_grammar *a, const struct tern_grammar *b);
size_t tern_grammar_n_elements(const struct tern_grammar *g);

/* A vocabulary for masks. pieces[i] (lens[i] bytes) is token i's text; tokens with an
 * empty or NULL piece are never allowed; eog tokens (eog may be NULL) are allowed
 * exactly at a complete match; special tokens (special may be NULL) only where a
 * configuration expects exactly their first character, i.e. where the grammar spells
 * them as a literal (so "<tool_call>" may come as its one token, but never inside a
 * JSON string through [^"]). The arrays are copied. */
enum tern_status tern_gvocab_new(uint32_t n_vocab, const char *const *pieces, const uint32_t *lens,
                                 const bool *eog, const bool *special, struct tern_gvocab **out);
/* From a tokenizer: pieces as the server's detokenizer renders them (control tokens
 * with their text), the end-of-generation tokens; control and user-defined tokens are
 * special, and control tokens spelled "<|...|>" (turn markers, fill-in-the-middle,
 * vision ...) never allowed. */
enum tern_status tern_gvocab_from_tokenizer(const struct tern_tokenizer *t, struct tern_gvocab **out);
void tern_gvocab_free(struct tern_gvocab *v);
uint32_t tern_gvocab_n_vocab(const struct tern_gvocab *v);
size_t tern_gvocab_n_nodes(const struct tern_gvocab *v);

/* A matcher at the start of g (borrowed: g and v outlive it). v may be NULL for byte-level
 * use only (no masks). A matcher may be reset and reused for the next generation with
 * the same grammar: its interned stacks and mask cache carry over, so a grammar used
 * again (the same tools every turn of an agent session) starts warm. */
enum tern_status tern_gmatch_new(const struct tern_grammar *g, const struct tern_gvocab *v, struct tern_gmatch **out);
void tern_gmatch_free(struct tern_gmatch *m);
void tern_gmatch_reset(struct tern_gmatch *m);

/* Consumes bytes; false (state unchanged) when they cannot continue a match. */
bool tern_gmatch_accept_bytes(struct tern_gmatch *m, const void *bytes, size_t n);
/* True when the output so far is a complete match of root. */
bool tern_gmatch_can_end(const struct tern_gmatch *m);
/* True when no byte at all can follow (only ending is possible). */
bool tern_gmatch_done(const struct tern_gmatch *m);
/* True when the whole of bytes[0..n) is a complete match (from the current state;
 * the state is unchanged). */
bool tern_gmatch_matches(struct tern_gmatch *m, const void *bytes, size_t n);

/* The allowed tokens as a bit set, bit i of mask[i / 32] (n_vocab bits; the caller's
 * array has (n_vocab + 31) / 32 words). Returns how many tokens are allowed (0: the
 * grammar is stuck, which a well-formed grammar never is unless it is complete and
 * the vocabulary has no end-of-generation token). TERN_ERR_LIMIT via *st when the
 * state tables outgrow their limit. */
size_t tern_gmatch_mask(struct tern_gmatch *m, uint32_t *mask, enum tern_status *st);
/* Consumes a token's bytes (an eog token: only when can_end). False if not allowed. */
bool tern_gmatch_accept_token(struct tern_gmatch *m, int32_t id);

/* Masks normally reuse the context-independent part of a state's walk (match.c); off,
 * every mask is one full walk (the same masks: for tests and the benchmark). */
void tern_gmatch_set_cut(struct tern_gmatch *m, bool on);

/* Mask statistics (for the benchmark and logs). */
struct tern_gmatch_stats {
    uint64_t masks, cache_hits, nodes_visited;
    uint64_t ci_hits, ci_roots;   /* context-independent walks reused; context-dependent subtrees walked */
    size_t n_stack_nodes, n_cached;
};
void tern_gmatch_get_stats(const struct tern_gmatch *m, struct tern_gmatch_stats *s);

#endif
