/* GBNF -> the compiled grammar (grammar-impl.h).
 *
 * The syntax is llama.cpp's: `name ::= alternatives` rules separated by newlines,
 * `|` alternatives, `( )` groups, "literals" and [classes] (ranges, ^ negation) with
 * the escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH, `.` for any code point,
 * postfix `* + ?` and `{m}`, `{m,}`, `{m,n}`, `{,n}`, `#` comments. Newlines end a rule
 * except inside parentheses and after `::=` or `|`.
 *
 * Groups and repetitions become rules of their own (x* is `r ::= x r |`, right
 * recursive, which the matcher runs as a loop: a call in tail position pushes nothing).
 * After parsing, the grammar is checked: every referenced rule defined, the root
 * present, no rule reaching itself without consuming input (that would make the
 * matcher's expansion endless), and every reachable rule able to finish. */
#include "grammar/grammar-impl.h"

#include "util/buf.h"
#include "util/mem.h"
#include "util/status.h"
#include "util/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RULES 65536u
#define MAX_NAME 128

struct elvec {
    struct gel *v;
    size_t n, cap;
};

struct prule {
    char *name;
    struct elvec body;
    bool defined;
    size_t ref_at;       /* source offset of the first reference (for "undefined rule") */
    size_t def_at;       /* source offset of the definition / of the group or repetition */
    bool repetition;     /* synthesized for a repetition (error wording) */
};

struct gp {
    const char *s;
    size_t n, i;
    struct prule *rules;
    size_t n_rules, cap_rules;
    uint32_t *htab;      /* (cap_htab) open addressing over rules by name: index + 1, 0 = empty */
    size_t cap_htab;
    uint64_t work;       /* steps taken so far (see TERN_GRAMMAR_MAX_WORK) */
    uint32_t *ranges;    /* pairs */
    size_t n_ranges, cap_ranges;
    size_t n_total;      /* elements so far, all rules */
    enum tern_status err;
    unsigned depth;
};

static void where(const struct gp *p, size_t at, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static bool fail(struct gp *p, size_t at, enum tern_status st, const char *fmt, ...) TERN_PRINTF(4, 5);
static bool fail(struct gp *p, size_t at, enum tern_status st, const char *fmt, ...) {
    if (p->err) return false;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    where(p, at, &line, &col);
    p->err = tern_errorf(st, "grammar: line %d, column %d: %s", line, col, msg);
    return false;
}

static bool oom(struct gp *p) {
    if (!p->err) p->err = tern_errorf(TERN_ERR_NOMEM, "grammar: out of memory");
    return false;
}

static bool work(struct gp *p, uint64_t n);

static bool el_push(struct gp *p, struct elvec *v, struct gel e) {
    if (!work(p, 1)) return false;
    if (p->n_total >= TERN_GRAMMAR_MAX_ELEMENTS)
        return fail(p, p->i, TERN_ERR_LIMIT, "the grammar expands to more than %u elements (repetitions count "
                    "once per copy)", TERN_GRAMMAR_MAX_ELEMENTS);
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 16;
        struct gel *nv = tern_reallocarray(v->v, nc, sizeof *nv);
        if (!nv) return oom(p);
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = e;
    p->n_total++;
    return true;
}

/* One step of work; false (and the error) past TERN_GRAMMAR_MAX_WORK. Every loop of
 * the compiler that grows with the input counts here, so that whatever its shape a
 * grammar costs at most that many steps before it is compiled or refused. */
static bool work(struct gp *p, uint64_t n) {
    p->work += n;
    if (p->work <= TERN_GRAMMAR_MAX_WORK) return true;
    return fail(p, p->i, TERN_ERR_LIMIT, "compiling the grammar takes more than %u steps", TERN_GRAMMAR_MAX_WORK);
}

static uint64_t name_hash(const char *name, size_t len) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t k = 0; k < len; k++) h = (h ^ (unsigned char)name[k]) * 1099511628211ull;
    return h;
}

/* The slot of name[0..len) in htab: its rule's, or the empty one it would take. Rule
 * lookups were a scan of every rule (a 320 KB grammar took 35 s): now a probe or two. */
static size_t htab_slot(struct gp *p, const char *name, size_t len) {
    size_t mask = p->cap_htab - 1;
    for (size_t h = (size_t)name_hash(name, len) & mask;; h = (h + 1) & mask) {
        p->work++;
        uint32_t v = p->htab[h];
        if (!v) return h;
        const char *rn = p->rules[v - 1].name;
        if (!strncmp(rn, name, len) && rn[len] == 0) return h; /* (rn may be shorter: strncmp stops at its end) */
    }
}

/* Keeps the table at most half full. */
static bool htab_grow(struct gp *p) {
    if (p->cap_htab && (p->n_rules + 1) * 2 <= p->cap_htab) return true;
    size_t nc = p->cap_htab ? p->cap_htab * 2 : 64;
    uint32_t *nt = tern_calloc(nc, sizeof *nt);
    if (!nt) return oom(p);
    free(p->htab);
    p->htab = nt;
    p->cap_htab = nc;
    for (size_t r = 0; r < p->n_rules; r++)
        p->htab[htab_slot(p, p->rules[r].name, strlen(p->rules[r].name))] = (uint32_t)r + 1;
    return work(p, p->n_rules);
}

/* The rule named name[0..len) (created undefined when new); UINT32_MAX on error. */
static uint32_t rule_get(struct gp *p, const char *name, size_t len, size_t at) {
    if (!htab_grow(p) || !work(p, 1)) return UINT32_MAX;
    size_t slot = htab_slot(p, name, len);
    if (p->htab[slot]) return p->htab[slot] - 1;
    if (p->n_rules >= MAX_RULES) {
        fail(p, at, TERN_ERR_LIMIT, "more than %u rules", MAX_RULES);
        return UINT32_MAX;
    }
    if (p->n_rules == p->cap_rules) {
        size_t nc = p->cap_rules ? p->cap_rules * 2 : 16;
        struct prule *nr = tern_reallocarray(p->rules, nc, sizeof *nr);
        if (!nr) {
            oom(p);
            return UINT32_MAX;
        }
        p->rules = nr;
        p->cap_rules = nc;
    }
    struct prule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    r->name = tern_strndup(name, len);
    if (!r->name) {
        oom(p);
        return UINT32_MAX;
    }
    r->ref_at = at;
    p->htab[slot] = (uint32_t)p->n_rules + 1;
    return (uint32_t)p->n_rules++;
}

/* A new rule for a group or repetition inside rule parent: "parent-N". */
static uint32_t rule_synth(struct gp *p, uint32_t parent, size_t at, bool repetition) {
    char name[MAX_NAME + 24];
    for (unsigned k = (unsigned)p->n_rules;; k++) {
        int n = snprintf(name, sizeof name, "%.*s-%u", MAX_NAME, p->rules[parent].name, k);
        if (!htab_grow(p) || !work(p, 1)) return UINT32_MAX;
        bool taken = n > 0 && p->htab[htab_slot(p, name, (size_t)n)] != 0;
        if (!taken) {
            uint32_t id = rule_get(p, name, (size_t)n, at);
            if (id != UINT32_MAX) {
                p->rules[id].defined = true;
                p->rules[id].def_at = at;
                p->rules[id].repetition = repetition;
            }
            return id;
        }
    }
}

static uint32_t range_add(struct gp *p, const uint32_t *pairs, size_t n_pairs) {
    if (p->n_ranges + n_pairs > p->cap_ranges) {
        size_t nc = p->cap_ranges ? p->cap_ranges * 2 : 64;
        while (nc < p->n_ranges + n_pairs) nc *= 2;
        uint32_t *nr = tern_reallocarray(p->ranges, nc * 2, sizeof *nr);
        if (!nr) {
            oom(p);
            return UINT32_MAX;
        }
        p->ranges = nr;
        p->cap_ranges = nc;
    }
    uint32_t at = (uint32_t)p->n_ranges;
    memcpy(p->ranges + 2 * p->n_ranges, pairs, n_pairs * 2 * sizeof *pairs);
    p->n_ranges += n_pairs;
    return at;
}

/* ---- lexing ------------------------------------------------------------------------ */

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static void skip_space(struct gp *p, bool newline_ok) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t') {
            p->i++;
        } else if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        } else if (newline_ok && (c == '\n' || c == '\r')) {
            p->i++;
        } else {
            break;
        }
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One (possibly escaped) code point of a literal or class. */
static bool read_char(struct gp *p, uint32_t *cp) {
    size_t at = p->i;
    if (p->i >= p->n) return fail(p, at, TERN_ERR_FORMAT, "unexpected end of the grammar");
    unsigned char c = (unsigned char)p->s[p->i];
    if (c == '\\') {
        if (p->i + 1 >= p->n) return fail(p, at, TERN_ERR_FORMAT, "unexpected end of the grammar after '\\'");
        char e = p->s[p->i + 1];
        p->i += 2;
        int nhex = 0;
        switch (e) {
        case 'n': *cp = '\n'; return true;
        case 'r': *cp = '\r'; return true;
        case 't': *cp = '\t'; return true;
        case '0': *cp = 0; return true;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '\'':
            *cp = (uint32_t)e;
            return true;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        default: return fail(p, at, TERN_ERR_FORMAT, "unknown escape '\\%c'", e);
        }
        uint32_t v = 0;
        for (int k = 0; k < nhex; k++) {
            int h = p->i < p->n ? hexval(p->s[p->i]) : -1;
            if (h < 0) return fail(p, at, TERN_ERR_FORMAT, "'\\%c' needs %d hexadecimal digits", e, nhex);
            v = v * 16 + (uint32_t)h;
            p->i++;
        }
        if (v > 0x10ffff) return fail(p, at, TERN_ERR_FORMAT, "code point U+%X is above U+10FFFF", v);
        *cp = v;
        return true;
    }
    /* UTF-8: one well-formed sequence (util/utf8.h) */
    size_t bad;
    const size_t len = tern_utf8_seq((const uint8_t *)p->s + p->i, p->n - p->i, &bad);
    if (!len) return fail(p, at, TERN_ERR_FORMAT, "invalid UTF-8 in the grammar");
    *cp = tern_utf8_decode((const uint8_t *)p->s + p->i, len);
    p->i += len;
    return true;
}

static int cmp_pair(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

/* Sorts and merges ranges in place; returns the new count. */
static size_t merge_ranges(uint32_t *r, size_t n) {
    if (n < 2) return n;
    qsort(r, n, 2 * sizeof *r, cmp_pair);
    size_t w = 0;
    for (size_t i = 1; i < n; i++) {
        if (r[2 * i] <= r[2 * w + 1] + 1 && r[2 * w + 1] != UINT32_MAX) {
            if (r[2 * i + 1] > r[2 * w + 1]) r[2 * w + 1] = r[2 * i + 1];
        } else {
            w++;
            r[2 * w] = r[2 * i];
            r[2 * w + 1] = r[2 * i + 1];
        }
    }
    return w + 1;
}

/* ---- parsing ----------------------------------------------------------------------- */

static bool parse_alternates(struct gp *p, uint32_t rule, bool nested);

static bool parse_repeat_count(struct gp *p, long *out, bool *given) {
    *given = false;
    long v = 0;
    size_t at = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        v = v * 10 + (p->s[p->i] - '0');
        *given = true;
        p->i++;
        if (v > TERN_GRAMMAR_MAX_REPEAT)
            return fail(p, at, TERN_ERR_LIMIT, "repetition count above the limit of %d", TERN_GRAMMAR_MAX_REPEAT);
    }
    *out = v;
    return true;
}

/* Replaces the atom seq[start..) by its repetition {min, max} (max < 0: unbounded). */
static bool apply_repeat(struct gp *p, uint32_t rule, size_t start, long min, long max, size_t at) {
    struct elvec *seq = &p->rules[rule].body;
    size_t alen = seq->n - start;
    if (alen == 0) return fail(p, at, TERN_ERR_FORMAT, "a repetition operator with nothing before it");
    struct gel *atom = tern_malloc(alen * sizeof *atom);
    if (!atom) return oom(p);
    memcpy(atom, seq->v + start, alen * sizeof *atom);
    seq->n = start;
    p->n_total -= alen;
    bool ok = true;
    for (long k = 0; k < min && ok; k++)
        for (size_t j = 0; j < alen && ok; j++) ok = el_push(p, &p->rules[rule].body, atom[j]);
    if (ok && max != min) {
        if (max < 0) {
            /* r ::= atom r | */
            uint32_t r = rule_synth(p, rule, at, true);
            ok = r != UINT32_MAX;
            for (size_t j = 0; j < alen && ok; j++) ok = el_push(p, &p->rules[r].body, atom[j]);
            ok = ok && el_push(p, &p->rules[r].body, (struct gel){GE_RULE, 0, r, 0}) &&
                 el_push(p, &p->rules[r].body, (struct gel){GE_ALT, 0, 0, 0}) &&
                 el_push(p, &p->rules[r].body, (struct gel){GE_END, 0, 0, 0}) &&
                 el_push(p, &p->rules[rule].body, (struct gel){GE_RULE, 0, r, 0});
        } else {
            /* r1 ::= atom | ; rk ::= atom r(k-1) | */
            uint32_t prev = UINT32_MAX;
            for (long k = 0; k < max - min && ok; k++) {
                uint32_t r = rule_synth(p, rule, at, true);
                ok = r != UINT32_MAX;
                for (size_t j = 0; j < alen && ok; j++) ok = el_push(p, &p->rules[r].body, atom[j]);
                if (ok && prev != UINT32_MAX) ok = el_push(p, &p->rules[r].body, (struct gel){GE_RULE, 0, prev, 0});
                ok = ok && el_push(p, &p->rules[r].body, (struct gel){GE_ALT, 0, 0, 0}) &&
                     el_push(p, &p->rules[r].body, (struct gel){GE_END, 0, 0, 0});
                prev = r;
            }
            if (ok) ok = el_push(p, &p->rules[rule].body, (struct gel){GE_RULE, 0, prev, 0});
        }
    }
    free(atom);
    return ok;
}

static bool parse_sequence(struct gp *p, uint32_t rule, bool nested) {
    size_t last_start = SIZE_MAX; /* the last atom's first element (for postfix operators) */
    for (;;) {
        if (p->i >= p->n) return true;
        char c = p->s[p->i];
        size_t at = p->i;
        struct elvec *seq = &p->rules[rule].body;
        if (c == '"') {
            p->i++;
            last_start = seq->n;
            for (;;) {
                if (p->i >= p->n) return fail(p, at, TERN_ERR_FORMAT, "unterminated literal");
                if (p->s[p->i] == '"') {
                    p->i++;
                    break;
                }
                if (p->s[p->i] == '\n') return fail(p, at, TERN_ERR_FORMAT, "unterminated literal (end of line)");
                uint32_t cp;
                if (!read_char(p, &cp)) return false;
                uint32_t pair[2] = {cp, cp};
                uint32_t ri = range_add(p, pair, 1);
                if (ri == UINT32_MAX || !el_push(p, &p->rules[rule].body, (struct gel){GE_CHAR, 0, ri, 1})) return false;
            }
        } else if (c == '[') {
            p->i++;
            bool neg = false;
            if (p->i < p->n && p->s[p->i] == '^') {
                neg = true;
                p->i++;
            }
            uint32_t *pairs = NULL;
            size_t np = 0, cap = 0;
            for (;;) {
                if (p->i >= p->n) {
                    free(pairs);
                    return fail(p, at, TERN_ERR_FORMAT, "unterminated character class");
                }
                if (p->s[p->i] == ']') {
                    p->i++;
                    break;
                }
                uint32_t lo, hi;
                size_t cat = p->i;
                if (!read_char(p, &lo)) {
                    free(pairs);
                    return false;
                }
                hi = lo;
                if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
                    p->i++;
                    if (!read_char(p, &hi)) {
                        free(pairs);
                        return false;
                    }
                    if (hi < lo) {
                        free(pairs);
                        return fail(p, cat, TERN_ERR_FORMAT, "range U+%04X-U+%04X is reversed", lo, hi);
                    }
                }
                if (np == cap) {
                    cap = cap ? cap * 2 : 8;
                    uint32_t *nv = tern_reallocarray(pairs, cap * 2, sizeof *nv);
                    if (!nv) {
                        free(pairs);
                        return oom(p);
                    }
                    pairs = nv;
                }
                pairs[2 * np] = lo;
                pairs[2 * np + 1] = hi;
                np++;
            }
            if (np == 0 && !neg) {
                free(pairs);
                return fail(p, at, TERN_ERR_FORMAT, "empty character class '[]' matches nothing");
            }
            np = merge_ranges(pairs, np);
            uint32_t ri = np ? range_add(p, pairs, np) : 0;
            free(pairs);
            if (ri == UINT32_MAX) return false;
            last_start = seq->n;
            if (!el_push(p, &p->rules[rule].body, (struct gel){GE_CHAR, (uint8_t)neg, ri, (uint32_t)np})) return false;
        } else if (c == '.') {
            p->i++;
            last_start = seq->n;
            if (!el_push(p, seq, (struct gel){GE_CHAR, 1, 0, 0})) return false;
        } else if (is_word(c)) {
            size_t s0 = p->i;
            while (p->i < p->n && is_word(p->s[p->i])) p->i++;
            if (p->i - s0 > MAX_NAME) return fail(p, s0, TERN_ERR_LIMIT, "rule name longer than %d", MAX_NAME);
            /* `name ::=` starts the next rule: the sequence ends before it */
            size_t save = p->i;
            skip_space(p, false);
            if (p->i + 2 < p->n + 0 && !strncmp(p->s + p->i, "::=", 3)) {
                p->i = s0;
                return true;
            }
            p->i = save;
            uint32_t r = rule_get(p, p->s + s0, p->i - s0, s0);
            if (r == UINT32_MAX) return false;
            last_start = p->rules[rule].body.n;
            if (!el_push(p, &p->rules[rule].body, (struct gel){GE_RULE, 0, r, 0})) return false;
        } else if (c == '(') {
            p->i++;
            if (++p->depth > 256) return fail(p, at, TERN_ERR_LIMIT, "groups nested deeper than 256");
            uint32_t r = rule_synth(p, rule, at, false);
            if (r == UINT32_MAX) return false;
            skip_space(p, true);
            if (!parse_alternates(p, r, true)) return false;
            p->depth--;
            if (p->i >= p->n || p->s[p->i] != ')') return fail(p, at, TERN_ERR_FORMAT, "'(' without a matching ')'");
            p->i++;
            last_start = p->rules[rule].body.n;
            if (!el_push(p, &p->rules[rule].body, (struct gel){GE_RULE, 0, r, 0})) return false;
        } else if (c == '*' || c == '+' || c == '?') {
            p->i++;
            if (last_start == SIZE_MAX) return fail(p, at, TERN_ERR_FORMAT, "'%c' with nothing before it", c);
            long mn = c == '+' ? 1 : 0, mx = c == '?' ? 1 : -1;
            if (!apply_repeat(p, rule, last_start, mn, mx, at)) return false;
            last_start = SIZE_MAX;
        } else if (c == '{') {
            p->i++;
            if (last_start == SIZE_MAX) return fail(p, at, TERN_ERR_FORMAT, "'{' with nothing before it");
            long mn = 0, mx = 0;
            bool g1, g2;
            skip_space(p, false);
            if (!parse_repeat_count(p, &mn, &g1)) return false;
            skip_space(p, false);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                skip_space(p, false);
                if (!parse_repeat_count(p, &mx, &g2)) return false;
                if (!g2) mx = -1;
                if (!g1) mn = 0;
            } else {
                if (!g1) return fail(p, at, TERN_ERR_FORMAT, "'{' needs a count: {m}, {m,}, {m,n} or {,n}");
                mx = mn;
            }
            skip_space(p, false);
            if (p->i >= p->n || p->s[p->i] != '}') return fail(p, at, TERN_ERR_FORMAT, "'{' without a matching '}'");
            p->i++;
            if (mx >= 0 && mx < mn) return fail(p, at, TERN_ERR_FORMAT, "repetition {%ld,%ld}: the maximum is below the minimum", mn, mx);
            if (!apply_repeat(p, rule, last_start, mn, mx, at)) return false;
            last_start = SIZE_MAX;
        } else if (c == '<') {
            return fail(p, at, TERN_ERR_UNSUPPORTED, "token references (<...>) are not supported");
        } else {
            return true; /* '|', ')', newline, or something the caller reports */
        }
        skip_space(p, nested);
    }
}

static bool parse_alternates(struct gp *p, uint32_t rule, bool nested) {
    for (;;) {
        if (!parse_sequence(p, rule, nested)) return false;
        /* a line that starts with '|' continues the rule (a superset of llama.cpp) */
        size_t save = p->i;
        skip_space(p, true);
        if (p->i >= p->n || p->s[p->i] != '|') p->i = save;
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            skip_space(p, true);
            if (!el_push(p, &p->rules[rule].body, (struct gel){GE_ALT, 0, 0, 0})) return false;
            continue;
        }
        return el_push(p, &p->rules[rule].body, (struct gel){GE_END, 0, 0, 0});
    }
}

static bool parse_rule(struct gp *p) {
    size_t at = p->i;
    size_t s0 = p->i;
    while (p->i < p->n && is_word(p->s[p->i])) p->i++;
    if (p->i == s0) {
        return fail(p, at, TERN_ERR_FORMAT, "expected a rule name, got '%c'", p->s[p->i]);
    }
    if (p->i - s0 > MAX_NAME) return fail(p, s0, TERN_ERR_LIMIT, "rule name longer than %d", MAX_NAME);
    uint32_t r = rule_get(p, p->s + s0, p->i - s0, s0);
    if (r == UINT32_MAX) return false;
    if (p->rules[r].defined)
        return fail(p, at, TERN_ERR_FORMAT, "rule '%s' is defined twice", p->rules[r].name);
    p->rules[r].defined = true;
    p->rules[r].def_at = at;
    skip_space(p, false);
    if (p->i + 3 > p->n || strncmp(p->s + p->i, "::=", 3)) return fail(p, p->i, TERN_ERR_FORMAT, "expected '::=' after the rule name");
    p->i += 3;
    skip_space(p, true);
    if (!parse_alternates(p, r, false)) return false;
    skip_space(p, false);
    if (p->i < p->n && p->s[p->i] != '\n' && p->s[p->i] != '\r') {
        if (p->s[p->i] == ')') return fail(p, p->i, TERN_ERR_FORMAT, "')' without a matching '('");
        return fail(p, p->i, TERN_ERR_FORMAT, "unexpected '%c'", p->s[p->i]);
    }
    return true;
}

/* ---- checks ------------------------------------------------------------------------ */

/* An alternative is productive when every rule it calls is, nullable when it has no
 * character and every rule it calls is nullable; a rule is either when one of its
 * alternatives is. Each alternative counts the calls still unknown; a rule found
 * productive (nullable) decrements the alternatives that call it (an index of the
 * calls by rule), so each call is looked at once per property. */
static enum tern_status nullable_productive(const struct tern_grammar *g, bool *nullable, bool *productive,
                                           uint64_t *n_work) {
    size_t R = g->n_rules, A = g->alt_first[R];
    uint32_t *alt_rule = tern_malloc((A ? A : 1) * sizeof *alt_rule);
    uint32_t *need_p = tern_malloc((A ? A : 1) * sizeof *need_p), *need_n = tern_malloc((A ? A : 1) * sizeof *need_n);
    uint32_t *call_first = tern_calloc(R + 1, sizeof *call_first);
    uint32_t *queue = tern_malloc((2 * R + 1) * sizeof *queue);
    uint32_t *calls = NULL;
    enum tern_status st = TERN_OK;
    if (!alt_rule || !need_p || !need_n || !call_first || !queue) goto nomem;
    size_t n_calls = 0;
    for (size_t r = 0; r < R; r++) {
        for (uint32_t a = g->alt_first[r]; a < g->alt_first[r + 1]; a++) {
            alt_rule[a] = (uint32_t)r;
            need_p[a] = need_n[a] = 0;
            bool has_char = false;
            for (const struct gel *e = g->el + g->alts[a]; !gel_is_end(e); e++) {
                if (e->type == GE_CHAR) {
                    has_char = true;
                } else {
                    need_p[a]++;
                    need_n[a]++;
                    call_first[e->a]++;
                    n_calls++;
                }
            }
            if (has_char) need_n[a] = UINT32_MAX; /* never nullable */
        }
    }
    *n_work += n_calls + A;
    for (size_t r = 0, sum = 0; r <= R; r++) {
        size_t c = r < R ? call_first[r] : 0;
        call_first[r] = (uint32_t)sum;
        sum += c;
    }
    calls = tern_malloc((n_calls ? n_calls : 1) * sizeof *calls);
    if (!calls) goto nomem;
    {
        uint32_t *fill = tern_malloc((R + 1) * sizeof *fill);
        if (!fill) goto nomem;
        memcpy(fill, call_first, (R + 1) * sizeof *fill);
        for (size_t a = 0; a < A; a++)
            for (const struct gel *e = g->el + g->alts[a]; !gel_is_end(e); e++)
                if (e->type == GE_RULE) calls[fill[e->a]++] = (uint32_t)a;
        free(fill);
    }
    /* queue entries: rule * 2 + (0 productive, 1 nullable) */
    size_t qh = 0, qt = 0;
    for (size_t a = 0; a < A; a++) {
        uint32_t r = alt_rule[a];
        if (need_p[a] == 0 && !productive[r]) {
            productive[r] = true;
            queue[qt++] = r * 2;
        }
        if (need_n[a] == 0 && !nullable[r]) {
            nullable[r] = true;
            queue[qt++] = r * 2 + 1;
        }
    }
    while (qh < qt) {
        uint32_t q = queue[qh++], x = q / 2;
        bool nul = q & 1;
        *n_work += call_first[x + 1] - call_first[x];
        for (uint32_t k = call_first[x]; k < call_first[x + 1]; k++) {
            uint32_t a = calls[k], r = alt_rule[a];
            if (nul) {
                if (need_n[a] != UINT32_MAX && --need_n[a] == 0 && !nullable[r]) {
                    nullable[r] = true;
                    queue[qt++] = r * 2 + 1;
                }
            } else if (--need_p[a] == 0 && !productive[r]) {
                productive[r] = true;
                queue[qt++] = r * 2;
            }
        }
    }
    goto out;
nomem:
    st = tern_errorf(TERN_ERR_NOMEM, "grammar: out of memory");
out:
    free(alt_rule);
    free(need_p);
    free(need_n);
    free(call_first);
    free(queue);
    free(calls);
    return st;
}

/* The rules reachable from the root (reach[r]); stack: room for every rule. */
static void reachable(const struct tern_grammar *g, bool *reach, uint32_t *stack) {
    size_t sp = 0;
    stack[sp++] = g->root;
    reach[g->root] = true;
    while (sp) {
        uint32_t r = stack[--sp];
        for (const struct gel *e = g->el + g->rule_start[r]; e->type != GE_END; e++)
            if (e->type == GE_RULE && !reach[e->a]) {
                reach[e->a] = true;
                stack[sp++] = e->a;
            }
    }
}

/* A reachable rule that can never finish is an error, named with its line. */
static enum tern_status check_productive(const struct tern_grammar *g, const struct gp *p, const bool *reach,
                                         const bool *productive) {
    for (size_t r = 0; r < g->n_rules; r++) {
        if (reach[r] && !productive[r]) {
            int line, col;
            where(p, p->rules[r].def_at, &line, &col);
            return tern_errorf(TERN_ERR_FORMAT,
                               "grammar: line %d, column %d: rule '%s' can never finish (every alternative needs "
                               "the rule itself, or another rule that never finishes)",
                               line, col, g->names[r]);
        }
    }
    return TERN_OK;
}

/* Left recursion: a rule that reaches itself through a prefix of nullable elements
 * ("may start with" edges). A cycle of tail calls only (each reference the last
 * element of its alternative) pushes nothing and the matcher's expansion stops on
 * states already seen, so it is harmless (llama.cpp accepts `( [x]* )*`); an edge
 * that pushes a return inside a cycle would grow the stack forever: refused. Edges
 * inside one strongly connected component lie on a cycle (Tarjan, iterative). stack and
 * it: room for every rule. */
static enum tern_status check_left_recursion(const struct tern_grammar *g, const struct gp *p, const bool *reach,
                                             const bool *nullable, uint32_t *stack, uint32_t *it) {
    size_t R = g->n_rules, sp;
    enum tern_status st = TERN_OK;
    size_t n_e = 0, cap_e = 64;
    uint32_t *ef = tern_malloc((R + 1) * sizeof *ef), *et = tern_malloc(cap_e * sizeof *et);
    bool *etail = tern_malloc(cap_e * sizeof *etail);
    uint32_t *idx = tern_malloc(R * sizeof *idx), *low = tern_malloc(R * sizeof *low);
    uint32_t *comp = tern_malloc(R * sizeof *comp), *tstack = tern_malloc(R * sizeof *tstack);
    bool *on = tern_calloc(R, 1);
    if (!ef || !et || !etail || !idx || !low || !comp || !tstack || !on) goto scc_nomem;
    for (size_t r = 0; r < R; r++) {
        ef[r] = (uint32_t)n_e;
        if (!reach[r]) continue;
        for (uint32_t a = g->alt_first[r]; a < g->alt_first[r + 1]; a++) {
            for (const struct gel *e = g->el + g->alts[a]; !gel_is_end(e); e++) {
                if (e->type == GE_CHAR) break;
                if (n_e == cap_e) {
                    cap_e *= 2;
                    uint32_t *n1 = tern_reallocarray(et, cap_e, sizeof *et);
                    if (n1) et = n1;
                    bool *n2 = tern_reallocarray(etail, cap_e, sizeof *etail);
                    if (n2) etail = n2;
                    if (!n1 || !n2) goto scc_nomem;
                }
                et[n_e] = e->a;
                etail[n_e] = gel_is_end(e + 1);
                n_e++;
                if (!nullable[e->a]) break;
            }
        }
    }
    ef[R] = (uint32_t)n_e;
    for (size_t r = 0; r < R; r++) idx[r] = UINT32_MAX;
    uint32_t counter = 0, n_comp = 0;
    size_t tsp = 0;
    for (size_t r0 = 0; r0 < R; r0++) {
        if (!reach[r0] || idx[r0] != UINT32_MAX) continue;
        sp = 0;
        stack[sp] = (uint32_t)r0;
        it[sp++] = 0;
        idx[r0] = low[r0] = counter++;
        tstack[tsp++] = (uint32_t)r0;
        on[r0] = true;
        while (sp) {
            uint32_t u = stack[sp - 1];
            if (it[sp - 1] < ef[u + 1] - ef[u]) {
                uint32_t w = et[ef[u] + it[sp - 1]++];
                if (idx[w] == UINT32_MAX) {
                    idx[w] = low[w] = counter++;
                    tstack[tsp++] = w;
                    on[w] = true;
                    stack[sp] = w;
                    it[sp++] = 0;
                } else if (on[w] && idx[w] < low[u]) {
                    low[u] = idx[w];
                }
                continue;
            }
            if (low[u] == idx[u]) {
                uint32_t w;
                do {
                    w = tstack[--tsp];
                    on[w] = false;
                    comp[w] = n_comp;
                } while (w != u);
                n_comp++;
            }
            sp--;
            if (sp && low[u] < low[stack[sp - 1]]) low[stack[sp - 1]] = low[u];
        }
    }
    for (size_t u = 0; u < R && !st; u++) {
        if (!reach[u]) continue;
        for (uint32_t k = ef[u]; k < ef[u + 1]; k++) {
            if (etail[k] || comp[et[k]] != comp[u]) continue;
            uint32_t bad = et[k];
            int line, col;
            where(p, p->rules[bad].def_at, &line, &col);
            if (p->rules[bad].repetition)
                st = tern_errorf(TERN_ERR_FORMAT,
                                 "grammar: line %d, column %d: a repetition of something that can match the "
                                 "empty string, followed by more (it could nest forever without progress)",
                                 line, col);
            else
                st = tern_errorf(TERN_ERR_FORMAT,
                                 "grammar: line %d, column %d: rule '%s' is left-recursive (it can reach itself "
                                 "without consuming input)",
                                 line, col, g->names[bad]);
            break;
        }
    }
    if (0) {
    scc_nomem:
        st = tern_errorf(TERN_ERR_NOMEM, "grammar: out of memory");
    }
    free(ef);
    free(et);
    free(etail);
    free(idx);
    free(low);
    free(comp);
    free(tstack);
    free(on);
    return st;
}

/* The three analyses of a parsed grammar: which rules can match the empty string and
 * which can finish at all (nullable_productive), which the root reaches, and left
 * recursion among those. */
static enum tern_status check(struct tern_grammar *g, const struct gp *p, uint64_t *n_work) {
    size_t R = g->n_rules;
    bool *nullable = tern_calloc(R, 1), *productive = tern_calloc(R, 1), *reach = tern_calloc(R, 1);
    uint32_t *stack = tern_malloc((R + 1) * sizeof *stack), *it = tern_malloc((R + 1) * sizeof *it);
    enum tern_status st = TERN_OK;
    if (!nullable || !productive || !reach || !stack || !it) {
        st = tern_errorf(TERN_ERR_NOMEM, "grammar: out of memory");
        goto out;
    }
    /* nullable and productive: least fixpoints over alternatives, by work lists (a pass
     * over every rule until nothing changed was quadratic in a chain of rules) */
    st = nullable_productive(g, nullable, productive, n_work);
    if (st) goto out;
    *n_work += 2 * g->n_el; /* reachability and the search for left recursion: linear */
    reachable(g, reach, stack);
    if (!(st = check_productive(g, p, reach, productive)))
        st = check_left_recursion(g, p, reach, nullable, stack, it);
out:
    free(nullable);
    free(productive);
    free(reach);
    free(stack);
    free(it);
    return st;
}

/* ---- compile ----------------------------------------------------------------------- */

void tern_grammar_free(struct tern_grammar *g) {
    if (!g) return;
    for (size_t r = 0; r < g->n_rules; r++) free(g->names ? g->names[r] : NULL);
    free(g->names);
    free(g->src);
    free(g->root_name);
    free(g->el);
    free(g->ranges);
    free(g->rule_start);
    free(g->alt_first);
    free(g->alts);
    free(g);
}

size_t tern_grammar_n_rules(const struct tern_grammar *g) { return g->n_rules; }
uint64_t tern_grammar_work(const struct tern_grammar *g) { return g->work; }

bool tern_grammar_same(const struct tern_grammar *a, const struct tern_grammar *b) {
    return a == b || (a->src_len == b->src_len && !memcmp(a->src, b->src, a->src_len) &&
                      !strcmp(a->root_name, b->root_name));
}
size_t tern_grammar_n_elements(const struct tern_grammar *g) { return g->n_el; }

enum tern_status tern_grammar_compile(const char *src, size_t len, const char *root, struct tern_grammar **out) {
    *out = NULL;
    if (!root) root = "root";
    if (len > TERN_GRAMMAR_MAX_SOURCE)
        return tern_errorf(TERN_ERR_LIMIT, "grammar: %zu bytes; the limit is %u", len, TERN_GRAMMAR_MAX_SOURCE);
    if (memchr(src, 0, len)) return tern_errorf(TERN_ERR_FORMAT, "grammar: contains a NUL byte");
    struct gp p = {.s = src, .n = len};
    struct tern_grammar *g = NULL;
    enum tern_status st = TERN_OK;
    skip_space(&p, true);
    while (p.i < p.n && !p.err) {
        if (!parse_rule(&p)) break;
        skip_space(&p, true);
    }
    if (p.err) {
        st = p.err;
        goto out;
    }
    for (size_t r = 0; r < p.n_rules; r++) {
        if (!p.rules[r].defined) {
            fail(&p, p.rules[r].ref_at, TERN_ERR_FORMAT, "rule '%s' is used but never defined", p.rules[r].name);
            st = p.err;
            goto out;
        }
    }
    uint32_t root_id = UINT32_MAX;
    if (p.cap_htab) {
        size_t slot = htab_slot(&p, root, strlen(root));
        if (p.htab[slot]) root_id = p.htab[slot] - 1;
    }
    if (root_id == UINT32_MAX) {
        st = tern_errorf(TERN_ERR_FORMAT, "grammar: there is no rule '%s' (the start rule)", root);
        goto out;
    }
    g = tern_calloc(1, sizeof *g);
    if (!g) goto nomem;
    g->n_rules = p.n_rules;
    g->root = root_id;
    g->src = tern_malloc(len + 1);
    g->root_name = tern_strdup(root);
    if (!g->src || !g->root_name) goto nomem;
    memcpy(g->src, src, len);
    g->src[len] = 0;
    g->src_len = len;
    g->el = tern_malloc((p.n_total ? p.n_total : 1) * sizeof *g->el);
    g->rule_start = tern_malloc(p.n_rules * sizeof *g->rule_start);
    g->alt_first = tern_malloc((p.n_rules + 1) * sizeof *g->alt_first);
    g->names = tern_calloc(p.n_rules, sizeof *g->names);
    g->ranges = p.ranges;
    g->n_ranges = p.n_ranges;
    p.ranges = NULL;
    if (!g->el || !g->rule_start || !g->alt_first || !g->names) goto nomem;
    size_t n_alts = 0;
    for (size_t r = 0; r < p.n_rules; r++) {
        g->rule_start[r] = (uint32_t)g->n_el;
        memcpy(g->el + g->n_el, p.rules[r].body.v, p.rules[r].body.n * sizeof *g->el);
        g->n_el += p.rules[r].body.n;
        for (size_t k = 0; k < p.rules[r].body.n; k++) n_alts += gel_is_end(&p.rules[r].body.v[k]);
        g->names[r] = p.rules[r].name;
        p.rules[r].name = NULL;
    }
    g->alts = tern_malloc((n_alts ? n_alts : 1) * sizeof *g->alts);
    if (!g->alts) goto nomem;
    size_t a = 0;
    for (size_t r = 0; r < g->n_rules; r++) {
        g->alt_first[r] = (uint32_t)a;
        uint32_t s = g->rule_start[r];
        g->alts[a++] = s;
        for (uint32_t k = s; g->el[k].type != GE_END; k++)
            if (g->el[k].type == GE_ALT) g->alts[a++] = k + 1;
    }
    g->alt_first[g->n_rules] = (uint32_t)a;
    st = check(g, &p, &p.work);
    if (st) goto out;
    g->work = p.work;
    *out = g;
    g = NULL;
    goto out;
nomem:
    st = tern_errorf(TERN_ERR_NOMEM, "grammar: out of memory");
out:
    for (size_t r = 0; r < p.n_rules; r++) {
        free(p.rules[r].name);
        free(p.rules[r].body.v);
    }
    free(p.rules);
    free(p.htab);
    free(p.ranges);
    tern_grammar_free(g);
    return st;
}
