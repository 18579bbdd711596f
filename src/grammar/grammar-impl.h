/* The compiled form of a grammar, shared by the compiler (gbnf.c) and the matcher
 * (match.c). Not part of the module's interface. */
#ifndef TERN_GRAMMAR_IMPL_H
#define TERN_GRAMMAR_IMPL_H

#include "grammar/grammar.h"

#include <stdint.h>

/* One element of a rule body. A rule is its alternatives one after another, each
 * ended by GE_ALT, the last by GE_END. */
enum gel_type { GE_END = 0, GE_ALT = 1, GE_RULE = 2, GE_CHAR = 3 };

struct gel {
    uint8_t type;  /* enum gel_type */
    uint8_t neg;   /* GE_CHAR: the class is negated ([^...], and '.' = negated empty) */
    uint32_t a;    /* GE_RULE: the rule; GE_CHAR: first range in ranges[] */
    uint32_t n;    /* GE_CHAR: number of ranges (sorted, merged, inclusive) */
};

struct tern_grammar {
    struct gel *el;         /* (n_el) every rule's elements */
    size_t n_el;
    uint32_t *ranges;       /* (n_ranges, 2) code point ranges lo, hi */
    size_t n_ranges;
    uint32_t *rule_start;   /* (n_rules) position of each rule's first element */
    uint32_t *alt_first;    /* (n_rules + 1) index into alts[] of each rule's alternatives */
    uint32_t *alts;         /* start positions of alternatives, by rule */
    char **names;           /* (n_rules) */
    size_t n_rules;
    uint32_t root;
    char *src;              /* the source and the start rule, for tern_grammar_same */
    size_t src_len;
    char *root_name;
    uint64_t work;          /* steps the compile took (tern_grammar_work) */
};

static inline bool gel_is_end(const struct gel *e) { return e->type == GE_END || e->type == GE_ALT; }

/* Does the class at e match code point c? */
static inline bool gel_match(const struct tern_grammar *g, const struct gel *e, uint32_t c) {
    const uint32_t *r = g->ranges + 2 * (size_t)e->a;
    bool in = false;
    for (uint32_t i = 0; i < e->n; i++) {
        if (c < r[2 * i]) break; /* sorted */
        if (c <= r[2 * i + 1]) {
            in = true;
            break;
        }
    }
    return in != (e->neg != 0);
}

/* Does the class at e match some code point of [lo, hi]? */
static inline bool gel_match_any(const struct tern_grammar *g, const struct gel *e, uint32_t lo, uint32_t hi) {
    const uint32_t *r = g->ranges + 2 * (size_t)e->a;
    if (!e->neg) {
        for (uint32_t i = 0; i < e->n; i++)
            if (r[2 * i] <= hi && r[2 * i + 1] >= lo) return true;
        return false;
    }
    uint32_t cur = lo; /* the first point of [lo, hi] not yet known to be covered */
    for (uint32_t i = 0; i < e->n; i++) {
        if (r[2 * i] > cur) break;
        if (r[2 * i + 1] >= cur) {
            if (r[2 * i + 1] >= hi) return false;
            cur = r[2 * i + 1] + 1;
        }
    }
    return true;
}

#endif
