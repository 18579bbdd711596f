/* JSON Schema -> GBNF (see schema.h). Every schema node becomes a rule; a $ref target
 * gets its rule once (by pointer) before its body is generated, so recursive schemas
 * become recursive rules. */
#include "util/json-kind.h"
#include "grammar/schema.h"

#include "grammar/grammar.h"
#include "util/mem.h"
#include "util/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INT_DIGITS 16
#define TERN_GRAMMAR_MAX_REPEAT_SCHEMA 1000 /* minLength, minItems; larger maxima are lowered to it */
#define INT_MAX_ABS 9999999999999999LL /* 16 digits */

/* Shared rules, emitted once at the end. The formats make a subset of what their RFCs
 * allow, each string of which every validator accepts: hostnames of at most 8 labels of
 * at most 30 characters (under 253 in all), e-mail as dot-atoms of at most 4 x 15 before
 * '@' and a hostname of 2-7 labels after it, IPv6 in RFC 3986's nine forms, URIs as
 * scheme://host[:port][/path][?query]. */
#define SHARED_RULES\
    "ws ::= ( \" \" | \"\\n\" [ \\t]{0,16} )?\n"\
    "jhex ::= [0-9a-fA-F]\n"\
    "jchar ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-Ce-fE-F] jhex jhex jhex | "\
    "[dD] [0-7] jhex jhex ) )\n"\
    "jstring ::= \"\\\"\" jchar* \"\\\"\"\n"\
    "jint ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"\
    "jnumber ::= jint ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?\n"\
    "jnumber-nonneg ::= ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?\n"\
    "jboolean ::= \"true\" | \"false\"\n"\
    "jnull ::= \"null\"\n"\
    "jvalue ::= jobject | jarray | jstring | jnumber | jboolean | jnull\n"\
    "jobject ::= \"{\" ws ( jstring ws \":\" ws jvalue ( ws \",\" ws jstring ws \":\" ws jvalue )* )? ws \"}\"\n"\
    "jarray ::= \"[\" ws ( jvalue ( ws \",\" ws jvalue )* )? ws \"]\"\n"\
    "jd2 ::= [0-9] [0-9]\n"\
    "jdate ::= [0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | "\
    "( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | "\
    "\"2\" [0-8] ) )\n"\
    "jhour ::= [01] [0-9] | \"2\" [0-3]\n"\
    "jtime ::= jhour \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? ( \"Z\" | [+-] jhour \":\" [0-5] [0-9] )\n"\
    "jdatetime ::= jdate \"T\" jtime\n"\
    "juuid ::= [0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}\n"\
    "jipv4 ::= jipv4-o \".\" jipv4-o \".\" jipv4-o \".\" jipv4-o\n"\
    "jipv4-o ::= \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]\n"\
    "jh16 ::= jhex{1,4}\n"\
    "jh16c ::= jh16 \":\"\n"\
    "jls32 ::= jh16 \":\" jh16 | jipv4\n"\
    "jipv6 ::= jh16c{6} jls32 | \"::\" jh16c{5} jls32 | jh16? \"::\" jh16c{4} jls32 | "\
    "( jh16c{0,1} jh16 )? \"::\" jh16c{3} jls32 | ( jh16c{0,2} jh16 )? \"::\" jh16c{2} jls32 | "\
    "( jh16c{0,3} jh16 )? \"::\" jh16c jls32 | ( jh16c{0,4} jh16 )? \"::\" jls32 | "\
    "( jh16c{0,5} jh16 )? \"::\" jh16 | ( jh16c{0,6} jh16 )? \"::\"\n"\
    "jlabel ::= [a-zA-Z0-9] ( [a-zA-Z0-9-]{0,28} [a-zA-Z0-9] )?\n"\
    "jhostname ::= jlabel ( \".\" jlabel ){0,7}\n"\
    "jemail ::= jatom ( \".\" jatom ){0,3} \"@\" jlabel ( \".\" jlabel ){1,6}\n"\
    "jatom ::= [a-zA-Z0-9!#$%&'*+=?^_`{|}~-]{1,15}\n"\
    "juric ::= [a-zA-Z0-9._~!$&'()*+,;=:@-] | \"%\" jhex jhex\n"\
    "juri ::= [a-zA-Z] [a-zA-Z0-9+.-]{0,31} \"://\" jhostname ( \":\" [0-9]{1,5} )? ( \"/\" juric* )* "\
    "( \"?\" ( juric | [/?] )* )?\n"
static const char shared_rules[] = SHARED_RULES;

struct refmap {
    char *ptr;
    char name[32];
};

struct tern_schema_gbnf {
    struct tern_buf g;        /* the rules so far */
    struct tern_buf text;     /* g + shared rules, for tern_schema_gbnf_text */
    unsigned n_rules;
    const json_t *doc;        /* the schema being added ($ref root) */
    char prefix[64];
    struct refmap *refs;
    size_t n_refs, cap_refs;
    char *err_ptr;
    size_t err_cap;
    enum tern_status err;
    unsigned depth;
};

/* ---- helpers ----------------------------------------------------------------------- */

static enum tern_status fail(struct tern_schema_gbnf *c, const char *ptr, enum tern_status st, const char *fmt, ...)
    TERN_PRINTF(4, 5);
static enum tern_status fail(struct tern_schema_gbnf *c, const char *ptr, enum tern_status st, const char *fmt, ...) {
    if (c->err) return c->err;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->err_ptr && c->err_cap) snprintf(c->err_ptr, c->err_cap, "%s", ptr);
    c->err = tern_errorf(st, "json schema at '%s': %s", ptr[0] ? ptr : "/", msg);
    return c->err;
}

static enum tern_status nomem(struct tern_schema_gbnf *c) {
    if (!c->err) c->err = tern_errorf(TERN_ERR_NOMEM, "json schema: out of memory");
    return c->err;
}

/* ptr + "/" + key (escaped as a JSON pointer token) into out[cap]. */
static void ptr_join(char *out, size_t cap, const char *ptr, const char *key) {
    size_t n = (size_t)snprintf(out, cap, "%s/", ptr);
    for (const char *k = key; *k && n + 3 < cap; k++) {
        if (*k == '~') {
            out[n++] = '~';
            out[n++] = '0';
        } else if (*k == '/') {
            out[n++] = '~';
            out[n++] = '1';
        } else {
            out[n++] = *k;
        }
    }
    if (n < cap) out[n] = 0;
}

enum tern_status tern_gbnf_literal(struct tern_buf *out, const char *s, size_t n) {
    enum tern_status st = tern_buf_putc(out, '"');
    for (size_t i = 0; i < n && !st; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"') st = tern_buf_puts(out, "\\\"");
        else if (ch == '\\') st = tern_buf_puts(out, "\\\\");
        else if (ch == '\n') st = tern_buf_puts(out, "\\n");
        else if (ch == '\r') st = tern_buf_puts(out, "\\r");
        else if (ch == '\t') st = tern_buf_puts(out, "\\t");
        else if (ch < 0x20 || ch == 0x7f) st = tern_buf_printf(out, "\\x%02X", ch);
        else st = tern_buf_putc(out, (char)ch);
    }
    if (!st) st = tern_buf_putc(out, '"');
    return st;
}

static void new_name(struct tern_schema_gbnf *c, char out[32]) {
    snprintf(out, 32, "%.20s-%u", c->prefix, c->n_rules++);
}

static bool check_size(struct tern_schema_gbnf *c, const char *ptr) {
    if (c->g.len > TERN_SCHEMA_MAX_GBNF) {
        fail(c, ptr, TERN_ERR_LIMIT, "the schema expands to more than %u bytes of grammar", TERN_SCHEMA_MAX_GBNF);
        return false;
    }
    return true;
}

/* Emits "name ::= body\n" where body is in b. */
static enum tern_status emit_rule(struct tern_schema_gbnf *c, const char *name, const struct tern_buf *b) {
    if (tern_buf_printf(&c->g, "%s ::= %s\n", name, b->data ? b->data : "\"\"")) return nomem(c);
    return TERN_OK;
}

/* ---- integer ranges ---------------------------------------------------------------- */

/* Decimal strings lo, hi of equal length n (lo <= hi): a GBNF expression for the
 * numbers between them. */
static enum tern_status digits_range(struct tern_buf *b, const char *lo, const char *hi, size_t n) {
    if (n == 0) return TERN_OK;
    if (!memcmp(lo, hi, n)) return tern_gbnf_literal(b, lo, n);
    bool lo0 = true, hi9 = true;
    for (size_t i = 0; i < n; i++) {
        lo0 = lo0 && lo[i] == '0';
        hi9 = hi9 && hi[i] == '9';
    }
    if (lo0 && hi9) return tern_buf_printf(b, "[0-9]{%zu}", n);
    if (lo[0] == hi[0]) {
        enum tern_status st = tern_buf_printf(b, "\"%c\" ", lo[0]);
        return st ? st : digits_range(b, lo + 1, hi + 1, n - 1);
    }
    char nines[INT_DIGITS + 2], zeros[INT_DIGITS + 2];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    bool rest_lo0 = true, rest_hi9 = true;
    for (size_t i = 1; i < n; i++) {
        rest_lo0 = rest_lo0 && lo[i] == '0';
        rest_hi9 = rest_hi9 && hi[i] == '9';
    }
    enum tern_status st = tern_buf_puts(b, "( ");
    bool first = true;
    char a = lo[0], z = hi[0];
    if (!rest_lo0) {
        st = st ? st : tern_buf_printf(b, "\"%c\" ", lo[0]);
        st = st ? st : tern_buf_puts(b, "( ");
        st = st ? st : digits_range(b, lo + 1, nines, n - 1);
        st = st ? st : tern_buf_puts(b, " )");
        first = false;
        a++;
    }
    char zz = rest_hi9 ? z : (char)(z - 1);
    if (a <= zz) {
        st = st ? st : tern_buf_printf(b, "%s[%c-%c]", first ? "" : " | ", a, zz);
        if (n > 1) st = st ? st : tern_buf_printf(b, " [0-9]{%zu}", n - 1);
        first = false;
    }
    if (!rest_hi9) {
        st = st ? st : tern_buf_printf(b, "%s\"%c\" ( ", first ? "" : " | ", hi[0]);
        st = st ? st : digits_range(b, zeros, hi + 1, n - 1);
        st = st ? st : tern_buf_puts(b, " )");
    }
    return st ? st : tern_buf_puts(b, " )");
}

/* Non-negative integers in [a, b] without leading zeros. */
static enum tern_status nonneg_range(struct tern_buf *b, long long a, long long z) {
    enum tern_status st = tern_buf_puts(b, "( ");
    bool first = true;
    long long p = 1;
    for (int len = 1; len <= INT_DIGITS && !st; len++) {
        long long lo = len == 1 ? 0 : p, hi = p * 10 - 1;
        p *= 10;
        if (lo < a) lo = a;
        if (hi > z) hi = z;
        if (lo > hi) continue;
        char ls[24], hs[24];
        snprintf(ls, sizeof ls, "%0*lld", len, lo);
        snprintf(hs, sizeof hs, "%0*lld", len, hi);
        if (!first) st = tern_buf_puts(b, " | ");
        st = st ? st : tern_buf_puts(b, "( ");
        st = st ? st : digits_range(b, ls, hs, (size_t)len);
        st = st ? st : tern_buf_puts(b, " )");
        first = false;
    }
    return st ? st : tern_buf_puts(b, " )");
}

static enum tern_status int_range(struct tern_buf *b, long long lo, long long hi) {
    enum tern_status st = tern_buf_puts(b, "( ");
    bool first = true;
    if (lo < 0) {
        long long nlo = hi < 0 ? -hi : 1, nhi = -lo;
        st = st ? st : tern_buf_puts(b, "\"-\" ");
        st = st ? st : nonneg_range(b, nlo, nhi);
        first = false;
    }
    if (hi >= 0) {
        if (!first) st = st ? st : tern_buf_puts(b, " | ");
        st = st ? st : nonneg_range(b, lo < 0 ? 0 : lo, hi);
    }
    return st ? st : tern_buf_puts(b, " )");
}

/* ---- regular expressions (pattern) -------------------------------------------------- */

struct rx {
    const char *s;
    size_t n, i;
    struct tern_buf *b;
    const char *ptr;
    struct tern_schema_gbnf *c;
    unsigned depth;
    bool anchored;
};

struct cset {
    uint32_t r[256][2];
    size_t n;
    bool neg;
};

static bool cset_add(struct rx *x, struct cset *cs, uint32_t lo, uint32_t hi) {
    if (cs->n >= 256) {
        fail(x->c, x->ptr, TERN_ERR_LIMIT, "pattern: character class with more than 256 ranges");
        return false;
    }
    cs->r[cs->n][0] = lo;
    cs->r[cs->n][1] = hi;
    cs->n++;
    return true;
}

static bool cset_class(struct rx *x, struct cset *cs, char e) {
    switch (e) {
    case 'd': return cset_add(x, cs, '0', '9');
    case 'w':
        return cset_add(x, cs, '0', '9') && cset_add(x, cs, 'A', 'Z') && cset_add(x, cs, 'a', 'z') &&
               cset_add(x, cs, '_', '_');
    case 's':
        return cset_add(x, cs, '\t', '\r') && cset_add(x, cs, ' ', ' ') && cset_add(x, cs, 0xa0, 0xa0) &&
               cset_add(x, cs, 0x1680, 0x1680) && cset_add(x, cs, 0x2000, 0x200a) &&
               cset_add(x, cs, 0x2028, 0x2029) && cset_add(x, cs, 0x202f, 0x202f) &&
               cset_add(x, cs, 0x205f, 0x205f) && cset_add(x, cs, 0x3000, 0x3000) && cset_add(x, cs, 0xfeff, 0xfeff);
    }
    return false;
}

static int cmp_r(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

/* Normalises cs (sorted, merged, negation applied) into out ranges. */
static size_t cset_resolve(const struct cset *cs, uint32_t out[][2]) {
    uint32_t tmp[257][2];
    size_t n = cs->n;
    memcpy(tmp, cs->r, n * sizeof tmp[0]);
    qsort(tmp, n, sizeof tmp[0], cmp_r);
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (w && tmp[i][0] <= tmp[w - 1][1] + 1) {
            if (tmp[i][1] > tmp[w - 1][1]) tmp[w - 1][1] = tmp[i][1];
        } else {
            tmp[w][0] = tmp[i][0];
            tmp[w][1] = tmp[i][1];
            w++;
        }
    }
    if (!cs->neg) {
        memcpy(out, tmp, w * sizeof tmp[0]);
        return w;
    }
    size_t m = 0;
    uint32_t cur = 0;
    for (size_t i = 0; i < w; i++) {
        if (tmp[i][0] > cur) {
            out[m][0] = cur;
            out[m][1] = tmp[i][0] - 1;
            m++;
        }
        cur = tmp[i][1] + 1;
    }
    if (cur <= 0x10ffff) {
        out[m][0] = cur;
        out[m][1] = 0x10ffff;
        m++;
    }
    return m;
}

static enum tern_status put_cp_class(struct tern_buf *b, uint32_t cp) {
    if (cp < 0x20 || cp == '"' || cp == '\\' || cp == ']' || cp == '[' || cp == '-' || cp == '^' || cp == 0x7f ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return cp > 0xffff ? tern_buf_printf(b, "\\U%08X", cp) : tern_buf_printf(b, "\\u%04X", cp);
    char u[4];
    size_t k = 0;
    if (cp < 0x80) u[k++] = (char)cp;
    else if (cp < 0x800) {
        u[k++] = (char)(0xc0 | (cp >> 6));
        u[k++] = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        u[k++] = (char)(0xe0 | (cp >> 12));
        u[k++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[k++] = (char)(0x80 | (cp & 0x3f));
    } else {
        u[k++] = (char)(0xf0 | (cp >> 18));
        u[k++] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[k++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[k++] = (char)(0x80 | (cp & 0x3f));
    }
    return tern_buf_append(b, u, k);
}

/* The JSON-escaped form of a code point that cannot appear raw in a JSON string. */
static enum tern_status put_escaped(struct tern_buf *b, uint32_t cp) {
    if (cp == '"') return tern_buf_puts(b, "\"\\\\\\\"\"");
    if (cp == '\\') return tern_buf_puts(b, "\"\\\\\\\\\"");
    if (cp == '\n') return tern_buf_puts(b, "\"\\\\n\"");
    if (cp == '\t') return tern_buf_puts(b, "\"\\\\t\"");
    if (cp == '\r') return tern_buf_puts(b, "\"\\\\r\"");
    return tern_buf_printf(b, "\"\\\\u%04x\"", cp);
}

static bool unsafe_cp(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\' || cp == 0x7f; }

/* A set of code points as a GBNF expression producing their JSON-string form. */
static bool emit_cset(struct rx *x, const struct cset *cs) {
    uint32_t r[260][2];
    size_t n = cset_resolve(cs, r);
    struct tern_buf *b = x->b;
    /* raw part: r minus the unsafe points and surrogates */
    struct tern_buf raw = TERN_BUF_INIT;
    size_t n_raw = 0, n_esc = 0;
    enum tern_status st = TERN_OK;
    struct tern_buf esc = TERN_BUF_INIT;
    for (size_t i = 0; i < n && !st; i++) {
        uint32_t lo = r[i][0], hi = r[i][1];
        for (uint32_t cp = lo; cp <= hi && cp < 0x80; cp++)
            if (unsafe_cp(cp)) {
                st = tern_buf_puts(&esc, n_esc++ ? " | " : "");
                st = st ? st : put_escaped(&esc, cp);
            }
        /* split around unsafe points and surrogates */
        uint32_t cur = lo;
        while (cur <= hi && !st) {
            while (cur <= hi && (unsafe_cp(cur) || (cur >= 0xd800 && cur <= 0xdfff))) cur = cur >= 0xd800 && cur <= 0xdfff ? 0xe000 : cur + 1;
            if (cur > hi) break;
            uint32_t end = cur;
            while (end + 1 <= hi && !unsafe_cp(end + 1) && !(end + 1 >= 0xd800 && end + 1 <= 0xdfff)) end++;
            st = put_cp_class(&raw, cur);
            if (end > cur) {
                st = st ? st : tern_buf_putc(&raw, '-');
                st = st ? st : put_cp_class(&raw, end);
            }
            n_raw++;
            cur = end + 1;
            if (end == 0x10ffff) break;
        }
    }
    if (!st && n_raw == 0 && n_esc == 0) {
        tern_buf_free(&raw);
        tern_buf_free(&esc);
        fail(x->c, x->ptr, TERN_ERR_UNSUPPORTED, "pattern: a character class that matches nothing (at offset %zu)", x->i);
        return false;
    }
    st = st ? st : tern_buf_puts(b, "( ");
    if (n_raw) st = st ? st : tern_buf_printf(b, "[%s]", raw.data);
    if (n_esc) st = st ? st : tern_buf_printf(b, "%s%s", n_raw ? " | " : "", esc.data);
    st = st ? st : tern_buf_puts(b, " )");
    tern_buf_free(&raw);
    tern_buf_free(&esc);
    if (st) {
        nomem(x->c);
        return false;
    }
    return true;
}

static bool rx_fail(struct rx *x, const char *what) {
    fail(x->c, x->ptr, TERN_ERR_UNSUPPORTED, "pattern '%.80s': %s at offset %zu (supported: literals, ., classes "
         "[...], \\d \\w \\s and their negations, groups (...) and (?:...), |, * + ? {m} {m,} {m,n}, ^ at the start, $ "
         "at the end)", x->s, what, x->i);
    return false;
}

static bool rx_cp(struct rx *x, uint32_t *cp) {
    unsigned char c = (unsigned char)x->s[x->i];
    size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : 4;
    if (x->i + len > x->n) return rx_fail(x, "invalid UTF-8");
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1fu) : len == 3 ? (c & 0x0fu) : (c & 0x07u);
    for (size_t k = 1; k < len; k++) v = (v << 6) | ((unsigned char)x->s[x->i + k] & 0x3fu);
    x->i += len;
    *cp = v;
    return true;
}

/* An escape after '\': a class (d w s D W S) into cs, or a literal code point. */
static bool rx_escape(struct rx *x, struct cset *cs, bool *is_class, uint32_t *cp) {
    if (x->i >= x->n) return rx_fail(x, "a trailing backslash");
    char e = x->s[x->i++];
    *is_class = false;
    if (e == 'd' || e == 'w' || e == 's' || e == 'D' || e == 'W' || e == 'S') {
        *is_class = true;
        if (e >= 'a') return cset_class(x, cs, e);
        struct cset inner = {.n = 0};
        if (!cset_class(x, &inner, (char)(e + 32))) return false;
        inner.neg = true;
        uint32_t r[260][2];
        size_t n = cset_resolve(&inner, r);
        for (size_t i = 0; i < n; i++)
            if (!cset_add(x, cs, r[i][0], r[i][1])) return false;
        return true;
    }
    switch (e) {
    case 'n': *cp = '\n'; return true;
    case 't': *cp = '\t'; return true;
    case 'r': *cp = '\r'; return true;
    case 'f': *cp = '\f'; return true;
    case 'v': *cp = '\v'; return true;
    case '0': *cp = 0; return true;
    case 'u': {
        uint32_t v = 0;
        for (int k = 0; k < 4; k++) {
            char h = x->i < x->n ? x->s[x->i] : 0;
            int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) return rx_fail(x, "\\u needs 4 hexadecimal digits");
            v = v * 16 + (uint32_t)d;
            x->i++;
        }
        *cp = v;
        return true;
    }
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
        x->i--;
        return rx_fail(x, "an unsupported escape (backreferences, \\b, \\p ...)");
    }
    x->i--;
    return rx_cp(x, cp);
}

static bool rx_alt(struct rx *x);

static bool rx_atom(struct rx *x) {
    char c = x->s[x->i];
    struct tern_buf *b = x->b;
    if (c == '(') {
        x->i++;
        if (x->i < x->n && x->s[x->i] == '?') {
            if (x->i + 1 < x->n && x->s[x->i + 1] == ':') x->i += 2;
            else return rx_fail(x, "lookarounds and named groups are not supported");
        }
        if (++x->depth > 32) return rx_fail(x, "groups nested deeper than 32");
        if (tern_buf_puts(b, "( ")) return nomem(x->c), false;
        if (!rx_alt(x)) return false;
        x->depth--;
        if (x->i >= x->n || x->s[x->i] != ')') return rx_fail(x, "an unclosed '('");
        x->i++;
        return !tern_buf_puts(b, " )") || (nomem(x->c), false);
    }
    struct cset cs = {.n = 0};
    if (c == '[') {
        x->i++;
        if (x->i < x->n && x->s[x->i] == '^') {
            cs.neg = true;
            x->i++;
        }
        bool first = true;
        for (;;) {
            if (x->i >= x->n) return rx_fail(x, "an unclosed '['");
            if (x->s[x->i] == ']' && !first) {
                x->i++;
                break;
            }
            first = false;
            uint32_t lo, hi;
            bool is_class = false;
            if (x->s[x->i] == '\\') {
                x->i++;
                if (!rx_escape(x, &cs, &is_class, &lo)) return false;
                if (is_class) continue;
            } else if (!rx_cp(x, &lo)) {
                return false;
            }
            hi = lo;
            if (x->i + 1 < x->n && x->s[x->i] == '-' && x->s[x->i + 1] != ']') {
                x->i++;
                if (x->s[x->i] == '\\') {
                    x->i++;
                    if (!rx_escape(x, &cs, &is_class, &hi)) return false;
                    if (is_class) return rx_fail(x, "a class escape as the end of a range");
                } else if (!rx_cp(x, &hi)) {
                    return false;
                }
                if (hi < lo) return rx_fail(x, "a reversed range");
            }
            if (!cset_add(x, &cs, lo, hi)) return false;
        }
        return emit_cset(x, &cs);
    }
    if (c == '.') {
        x->i++;
        cs.neg = true;
        cset_add(x, &cs, '\n', '\n');
        cset_add(x, &cs, '\r', '\r');
        cset_add(x, &cs, 0x2028, 0x2029);
        return emit_cset(x, &cs);
    }
    if (c == '\\') {
        x->i++;
        bool is_class;
        uint32_t cp;
        if (!rx_escape(x, &cs, &is_class, &cp)) return false;
        if (is_class) return emit_cset(x, &cs);
        cset_add(x, &cs, cp, cp);
        return emit_cset(x, &cs);
    }
    if (c == '^' || c == '$') return rx_fail(x, "'^' or '$' in the middle of a pattern");
    if (c == '*' || c == '+' || c == '?' || c == '{') return rx_fail(x, "a quantifier with nothing before it");
    uint32_t cp;
    if (!rx_cp(x, &cp)) return false;
    cset_add(x, &cs, cp, cp);
    return emit_cset(x, &cs);
}

static bool rx_seq(struct rx *x) {
    struct tern_buf *b = x->b;
    bool any = false;
    while (x->i < x->n) {
        char c = x->s[x->i];
        if (c == '|' || c == ')') break;
        if (c == '$' && x->i + 1 == x->n) break;
        size_t at = b->len;
        if (any && tern_buf_putc(b, ' ')) return nomem(x->c), false;
        at = b->len;
        if (!rx_atom(x)) return false;
        any = true;
        /* quantifier */
        if (x->i < x->n) {
            char q = x->s[x->i];
            long mn = -1, mx = -1;
            if (q == '*' || q == '+' || q == '?') {
                x->i++;
                mn = q == '+' ? 1 : 0;
                mx = q == '?' ? 1 : -1;
            } else if (q == '{') {
                size_t save = x->i++;
                long v = 0;
                bool g1 = false;
                while (x->i < x->n && x->s[x->i] >= '0' && x->s[x->i] <= '9' && v < 100000) {
                    v = v * 10 + (x->s[x->i++] - '0');
                    g1 = true;
                }
                mn = v;
                mx = v;
                if (x->i < x->n && x->s[x->i] == ',') {
                    x->i++;
                    v = 0;
                    bool g2 = false;
                    while (x->i < x->n && x->s[x->i] >= '0' && x->s[x->i] <= '9' && v < 100000) {
                        v = v * 10 + (x->s[x->i++] - '0');
                        g2 = true;
                    }
                    mx = g2 ? v : -1;
                }
                if (!g1 || x->i >= x->n || x->s[x->i] != '}') {
                    x->i = save;
                    return rx_fail(x, "a malformed {m,n} quantifier");
                }
                x->i++;
                if (mx >= 0 && mx < mn) return rx_fail(x, "a {m,n} quantifier with n < m");
                if (mn > 1000 || mx > 1000) return rx_fail(x, "a quantifier count above 1000");
            }
            if (mn >= 0) {
                if (x->i < x->n && x->s[x->i] == '?') x->i++; /* lazy: the same language */
                /* wrap the atom: ( atom ){m,n} */
                if (tern_buf_reserve(b, 4)) return nomem(x->c), false;
                memmove(b->data + at + 2, b->data + at, b->len - at + 1);
                b->data[at] = '(';
                b->data[at + 1] = ' ';
                b->len += 2;
                enum tern_status st = tern_buf_puts(b, " )");
                if (mx < 0) st = st ? st : (mn == 0 ? tern_buf_puts(b, "*") : tern_buf_printf(b, "{%ld,}", mn));
                else st = st ? st : tern_buf_printf(b, "{%ld,%ld}", mn, mx);
                if (st) return nomem(x->c), false;
            }
        }
    }
    if (!any && tern_buf_puts(b, "\"\"")) return nomem(x->c), false;
    return true;
}

static bool rx_alt(struct rx *x) {
    if (!rx_seq(x)) return false;
    while (x->i < x->n && x->s[x->i] == '|') {
        if (x->depth == 0 && x->anchored)
            return rx_fail(x, "'|' at the top level together with '^' or '$' (write ^(a|b)$)");
        x->i++;
        if (tern_buf_puts(x->b, " | ")) return nomem(x->c), false;
        if (!rx_seq(x)) return false;
    }
    return true;
}

/* A pattern as a GBNF expression for the string's JSON form, quotes included. */
static bool pattern_expr(struct tern_schema_gbnf *c, const char *pat, size_t n, const char *ptr, struct tern_buf *b) {
    struct rx x = {.s = pat, .n = n, .b = b, .ptr = ptr, .c = c};
    bool start = n > 0 && pat[0] == '^';
    bool end = n > 0 && pat[n - 1] == '$' && (n < 2 || pat[n - 2] != '\\');
    if (start) x.i = 1;
    x.anchored = start || end;
    if (tern_buf_puts(b, "\"\\\"\" ")) return nomem(c), false;
    if (!start && tern_buf_puts(b, "jchar* ")) return nomem(c), false;
    if (tern_buf_puts(b, "( ")) return nomem(c), false;
    if (!rx_alt(&x)) return false;
    if (x.i < x.n && pat[x.i] == ')') return rx_fail(&x, "an unmatched ')'");
    if (end && x.i == n - 1) x.i++;
    if (x.i != x.n) return rx_fail(&x, "unexpected character");
    if (tern_buf_puts(b, " )")) return nomem(c), false;
    if (!end && tern_buf_puts(b, " jchar*")) return nomem(c), false;
    if (tern_buf_puts(b, " \"\\\"\"")) return nomem(c), false;
    return true;
}

/* ---- schemas ----------------------------------------------------------------------- */

static const char *const annotations[] = {"title",    "description", "default",  "examples",  "$schema",
                                          "$id",      "$comment",    "deprecated", "readOnly", "writeOnly",
                                          "$defs",    "definitions"};

static const char *const known[] = {"type",      "properties", "required",  "additionalProperties",
                                    "items",     "enum",       "const",     "anyOf",
                                    "oneOf",     "$ref",       "minItems",  "maxItems",
                                    "minLength", "maxLength",  "pattern",   "format",
                                    "minimum",   "maximum",    "exclusiveMinimum", "exclusiveMaximum"};

static bool in_list(const char *k, const char *const *l, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, l[i])) return true;
    return false;
}

static enum tern_status gen(struct tern_schema_gbnf *c, const json_t *s, const char *ptr, char name[32]);

/* An expression for a JSON literal value (const / enum members). */
static enum tern_status value_literal(struct tern_schema_gbnf *c, const json_t *v, struct tern_buf *b, const char *ptr) {
    char *txt = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!txt) return nomem(c);
    enum tern_status st = tern_gbnf_literal(b, txt, strlen(txt));
    free(txt);
    (void)ptr;
    return st ? nomem(c) : TERN_OK;
}

static bool get_count(struct tern_schema_gbnf *c, const json_t *s, const char *key, const char *ptr, long long *out) {
    const json_t *v = json_object_get(s, key);
    if (!v) return true;
    char p[512];
    ptr_join(p, sizeof p, ptr, key);
    double d = json_number_value(v);
    if (!json_is_number(v) || d < 0 || d != floor(d)) {
        fail(c, p, TERN_ERR_INVALID, "'%s' must be a non-negative integer, got %s", key, tern_json_kind(v));
        return false;
    }
    *out = d > 1e15 ? (long long)1e15 : (long long)d;
    return true;
}

static enum tern_status gen_string(struct tern_schema_gbnf *c, const json_t *s, const char *ptr, struct tern_buf *b) {
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    long long mn = 0, mx = -1;
    if (!get_count(c, s, "minLength", ptr, &mn) || !get_count(c, s, "maxLength", ptr, &mx)) return c->err;
    bool lens = json_object_get(s, "minLength") || json_object_get(s, "maxLength");
    char p[512];
    if (pat) {
        ptr_join(p, sizeof p, ptr, "pattern");
        if (!json_is_string(pat)) return fail(c, p, TERN_ERR_INVALID, "'pattern' must be a string");
        if (fmt || lens)
            return fail(c, p, TERN_ERR_UNSUPPORTED, "'pattern' together with '%s' is not supported",
                        fmt ? "format" : json_object_get(s, "minLength") ? "minLength" : "maxLength");
        return pattern_expr(c, json_string_value(pat), json_string_length(pat), p, b) ? TERN_OK : c->err;
    }
    if (fmt) {
        ptr_join(p, sizeof p, ptr, "format");
        if (!json_is_string(fmt)) return fail(c, p, TERN_ERR_INVALID, "'format' must be a string");
        const char *f = json_string_value(fmt), *rule = NULL;
        if (!strcmp(f, "date")) rule = "jdate";
        else if (!strcmp(f, "time")) rule = "jtime";
        else if (!strcmp(f, "date-time")) rule = "jdatetime";
        else if (!strcmp(f, "uuid")) rule = "juuid";
        else if (!strcmp(f, "email")) rule = "jemail";
        else if (!strcmp(f, "ipv4")) rule = "jipv4";
        else if (!strcmp(f, "ipv6")) rule = "jipv6";
        else if (!strcmp(f, "hostname")) rule = "jhostname";
        else if (!strcmp(f, "uri")) rule = "juri";
        else return fail(c, p, TERN_ERR_UNSUPPORTED, "format '%.40s' is not supported (date, time, date-time, uuid, "
                         "email, ipv4, ipv6, hostname, uri are)", f);
        if (lens) return fail(c, p, TERN_ERR_UNSUPPORTED, "'format' together with minLength/maxLength is not supported");
        return tern_buf_printf(b, "\"\\\"\" %s \"\\\"\"", rule) ? nomem(c) : TERN_OK;
    }
    if (mx >= 0 && mx < mn) return fail(c, ptr, TERN_ERR_INVALID, "maxLength %lld is below minLength %lld", mx, mn);
    if (mn > TERN_GRAMMAR_MAX_REPEAT_SCHEMA)
        return fail(c, ptr, TERN_ERR_LIMIT, "minLength %lld is above the supported %d", mn, TERN_GRAMMAR_MAX_REPEAT_SCHEMA);
    if (mx > TERN_GRAMMAR_MAX_REPEAT_SCHEMA) mx = TERN_GRAMMAR_MAX_REPEAT_SCHEMA; /* fewer is still valid */
    enum tern_status st;
    if (mn == 0 && mx < 0) st = tern_buf_puts(b, "jstring");
    else if (mx < 0) st = tern_buf_printf(b, "\"\\\"\" jchar{%lld,} \"\\\"\"", mn);
    else st = tern_buf_printf(b, "\"\\\"\" jchar{%lld,%lld} \"\\\"\"", mn, mx);
    return st ? nomem(c) : TERN_OK;
}

static bool get_bound(struct tern_schema_gbnf *c, const json_t *s, const char *key, const char *ptr, double *out) {
    const json_t *v = json_object_get(s, key);
    if (!v) return false;
    if (!json_is_number(v)) {
        char p[512];
        ptr_join(p, sizeof p, ptr, key);
        fail(c, p, TERN_ERR_INVALID, "'%s' must be a number, got %s", key, tern_json_kind(v));
        return false;
    }
    *out = json_number_value(v);
    return true;
}

/* A bounded 'number': the values lo <= x <= hi, xlo < x < xhi as the union of
 *   - the integers in the range (int_range),
 *   - k.ddd for whole k >= 0 with [k, k+1) inside the range,
 *   - -k.ddd for whole k >= 0 with (-(k+1), -k] inside it,
 * where a fraction that touches an exclusive bound must have a nonzero digit. No
 * exponents. Every string it makes is in the range (what matters for generation);
 * a value between a fractional bound and the next whole number (0.7 for minimum 0.5)
 * is never produced. A range that holds none of these (minimum 0.1, maximum 0.2) is
 * refused with the pointer. */
static enum tern_status number_range(struct tern_schema_gbnf *c, double lo, double hi, double xlo, double xhi,
                                     const char *ptr, struct tern_buf *b) {
    const double M = (double)INT_MAX_ABS;
    /* the effective bounds: v > xlo and v >= lo, v < xhi and v <= hi */
    double L = lo > xlo ? lo : xlo, H = hi < xhi ? hi : xhi;
    bool lx = xlo >= lo, hx = xhi <= hi; /* is the bound that binds exclusive? */
    if (L < -M) L = -M, lx = false;
    if (H > M) H = M, hx = false;
    /* integers */
    double ilo = lx ? floor(L) + 1 : ceil(L), ihi = hx ? ceil(H) - 1 : floor(H);
    /* k.ddd, k >= 0: k >= L (k == L exclusive: nonzero fraction), k + 1 <= H */
    double plo = ceil(L) < 0 ? 0 : ceil(L), phi = floor(H) - 1;
    bool p_nz = lx && plo == L; /* the first k needs a nonzero fraction */
    /* -k.ddd, k >= 0: -(k+1) >= L, -k <= H (-k == H exclusive: nonzero fraction) */
    double nlo = ceil(-H) < 0 ? 0 : ceil(-H), nhi = floor(-L) - 1;
    bool n_nz = hx && -nlo == H;
    bool has_i = ilo <= ihi, has_p = plo <= phi, has_n = nlo <= nhi;
    if (!has_i && !has_p && !has_n) {
        return fail(c, ptr, TERN_ERR_UNSUPPORTED,
                    "the bounds of this 'number' hold no whole number and no whole unit interval (%g to %g); "
                    "only such ranges can be expressed", L, H);
    }
    enum tern_status st = tern_buf_puts(b, "( ");
    const char *sep = "";
    if (has_i) {
        st = st ? st : int_range(b, (long long)ilo, (long long)ihi);
        sep = " | ";
    }
    /* one side: the first k alone when it needs a nonzero fraction, then the rest */
    for (int side = 0; side < 2; side++) {
        bool has = side ? has_n : has_p, nz = side ? n_nz : p_nz;
        long long a = (long long)(side ? nlo : plo), z = (long long)(side ? nhi : phi);
        if (!has) continue;
        const char *sign = side ? "\"-\" " : "";
        if (nz) {
            st = st ? st : tern_buf_printf(b, "%s%s\"%lld.\" \"0\"{0,15} [1-9] [0-9]{0,15}", sep, sign, a);
            sep = " | ";
            a++;
        }
        if (a <= z) {
            st = st ? st : tern_buf_printf(b, "%s%s", sep, sign);
            st = st ? st : nonneg_range(b, a, z);
            st = st ? st : tern_buf_puts(b, " \".\" [0-9]{1,16}");
            sep = " | ";
        }
    }
    st = st ? st : tern_buf_puts(b, " )");
    return st ? nomem(c) : TERN_OK;
}

static enum tern_status gen_number(struct tern_schema_gbnf *c, const json_t *s, const char *ptr, struct tern_buf *b,
                                   bool integer) {
    double lo = -INFINITY, hi = INFINITY, v;
    bool any = false;
    if (get_bound(c, s, "minimum", ptr, &v)) lo = v, any = true;
    if (c->err) return c->err;
    if (get_bound(c, s, "maximum", ptr, &v)) hi = v, any = true;
    if (c->err) return c->err;
    /* exclusive bounds: draft 6+ numbers (a boolean is draft 4's form) */
    const json_t *xl = json_object_get(s, "exclusiveMinimum"), *xh = json_object_get(s, "exclusiveMaximum");
    char p[512];
    if (xl && !json_is_number(xl)) {
        ptr_join(p, sizeof p, ptr, "exclusiveMinimum");
        return fail(c, p, TERN_ERR_UNSUPPORTED, "'exclusiveMinimum' must be a number (the draft-4 boolean form is not supported)");
    }
    if (xh && !json_is_number(xh)) {
        ptr_join(p, sizeof p, ptr, "exclusiveMaximum");
        return fail(c, p, TERN_ERR_UNSUPPORTED, "'exclusiveMaximum' must be a number (the draft-4 boolean form is not supported)");
    }
    if (!integer) {
        if (!xl && !xh && (!any || (lo == 0 && hi == INFINITY)))
            return tern_buf_puts(b, any ? "jnumber-nonneg" : "jnumber") ? nomem(c) : TERN_OK;
        return number_range(c, lo, hi, xl ? json_number_value(xl) : -INFINITY, xh ? json_number_value(xh) : INFINITY,
                            ptr, b);
    }
    if (xl) {
        double x = json_number_value(xl);
        double e = floor(x) + 1;
        if (e > lo) lo = e;
        any = true;
    }
    if (xh) {
        double x = json_number_value(xh);
        double e = ceil(x) - 1;
        if (e < hi) hi = e;
        any = true;
    }
    if (!any) return tern_buf_puts(b, "jint") ? nomem(c) : TERN_OK;
    lo = ceil(lo);
    hi = floor(hi);
    if (lo < -(double)INT_MAX_ABS) lo = -(double)INT_MAX_ABS;
    if (hi > (double)INT_MAX_ABS) hi = (double)INT_MAX_ABS;
    if (lo > hi) return fail(c, ptr, TERN_ERR_INVALID, "no integer lies between the minimum and the maximum (of at most 16 digits)");
    return int_range(b, (long long)lo, (long long)hi) ? nomem(c) : TERN_OK;
}

static enum tern_status gen_array(struct tern_schema_gbnf *c, const json_t *s, const char *ptr, struct tern_buf *b) {
    const json_t *items = json_object_get(s, "items");
    char p[512], item[32] = "jvalue";
    if (items) {
        ptr_join(p, sizeof p, ptr, "items");
        if (json_is_array(items))
            return fail(c, p, TERN_ERR_UNSUPPORTED, "'items' as an array (tuples) is not supported");
        if (gen(c, items, p, item)) return c->err;
    }
    long long mn = 0, mx = -1;
    if (!get_count(c, s, "minItems", ptr, &mn) || !get_count(c, s, "maxItems", ptr, &mx)) return c->err;
    if (mx >= 0 && mx < mn) return fail(c, ptr, TERN_ERR_INVALID, "maxItems %lld is below minItems %lld", mx, mn);
    if (mn > TERN_GRAMMAR_MAX_REPEAT_SCHEMA)
        return fail(c, ptr, TERN_ERR_LIMIT, "minItems %lld is above the supported %d", mn, TERN_GRAMMAR_MAX_REPEAT_SCHEMA);
    if (mx > TERN_GRAMMAR_MAX_REPEAT_SCHEMA) mx = TERN_GRAMMAR_MAX_REPEAT_SCHEMA;
    enum tern_status st;
    if (mx == 0) st = tern_buf_puts(b, "\"[\" ws \"]\"");
    else {
        char rep[48];
        long long rmn = mn > 0 ? mn - 1 : 0, rmx = mx < 0 ? -1 : mx - 1;
        if (rmx < 0 && rmn) snprintf(rep, sizeof rep, "{%lld,}", rmn);
        else if (rmx < 0) snprintf(rep, sizeof rep, "*");
        else snprintf(rep, sizeof rep, "{%lld,%lld}", rmn, rmx);
        st = tern_buf_printf(b, "\"[\" ws %s%s ( ws \",\" ws %s )%s %s ws \"]\"", mn > 0 ? "" : "( ", item, item, rep,
                             mn > 0 ? "" : ")?");
    }
    return st ? nomem(c) : TERN_OK;
}

static enum tern_status gen_object(struct tern_schema_gbnf *c, const json_t *s, const char *ptr, struct tern_buf *b) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    char p[512];
    if (props && !json_is_object(props)) {
        ptr_join(p, sizeof p, ptr, "properties");
        return fail(c, p, TERN_ERR_INVALID, "'properties' must be an object, got %s", tern_json_kind(props));
    }
    if (req && !json_is_array(req)) {
        ptr_join(p, sizeof p, ptr, "required");
        return fail(c, p, TERN_ERR_INVALID, "'required' must be an array, got %s", tern_json_kind(req));
    }
    if (addl && !json_is_boolean(addl) && !json_is_object(addl)) {
        ptr_join(p, sizeof p, ptr, "additionalProperties");
        return fail(c, p, TERN_ERR_INVALID, "'additionalProperties' must be a boolean or a schema, got %s", tern_json_kind(addl));
    }
    size_t n_req = req ? json_array_size(req) : 0;
    for (size_t i = 0; i < n_req; i++) {
        const json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) {
            char rp[32];
            snprintf(rp, sizeof rp, "%zu", i);
            ptr_join(p, sizeof p, ptr, "required");
            ptr_join(p, sizeof p, p, rp);
            return fail(c, p, TERN_ERR_INVALID, "'required' entries must be strings");
        }
    }
    /* no declared properties: a map (any keys) of additionalProperties values */
    if (!props || json_object_size(props) == 0) {
        if (n_req) {
            ptr_join(p, sizeof p, ptr, "required");
            if (json_is_false(addl))
                return fail(c, p, TERN_ERR_INVALID, "required properties with additionalProperties false and no properties");
        }
        char val[32] = "jvalue";
        if (json_is_false(addl)) return tern_buf_puts(b, "\"{\" ws \"}\"") ? nomem(c) : TERN_OK;
        if (json_is_object(addl)) {
            ptr_join(p, sizeof p, ptr, "additionalProperties");
            if (gen(c, addl, p, val)) return c->err;
        }
        if (n_req) {
            /* the required keys first, then any others: a key may repeat a required one,
             * so only the required ones are generated */
            if (tern_buf_puts(b, "\"{\" ws ")) return nomem(c);
            for (size_t i = 0; i < n_req; i++) {
                const json_t *r = json_array_get(req, i);
                if (i && tern_buf_puts(b, " ws \",\" ws ")) return nomem(c);
                char *txt = json_dumps(r, JSON_ENCODE_ANY);
                if (!txt || tern_gbnf_literal(b, txt, strlen(txt))) {
                    free(txt);
                    return nomem(c);
                }
                free(txt);
                if (tern_buf_printf(b, " ws \":\" ws %s", val)) return nomem(c);
            }
            return tern_buf_puts(b, " ws \"}\"") ? nomem(c) : TERN_OK;
        }
        return tern_buf_printf(b, "\"{\" ws ( jstring ws \":\" ws %s ( ws \",\" ws jstring ws \":\" ws %s )* )? ws \"}\"",
                               val, val)
                   ? nomem(c)
                   : TERN_OK;
    }
    /* required names that are not declared: refused unless extra keys are allowed, in
     * which case they are generated with any value */
    size_t n = json_object_size(props) + n_req;
    char (*kv)[32] = tern_calloc(n, sizeof *kv);
    bool *isreq = tern_calloc(n, sizeof *isreq);
    size_t k = 0;
    enum tern_status st = TERN_OK;
    if (!kv || !isreq) {
        st = nomem(c);
        goto out;
    }
    const char *key;
    const json_t *sub;
    char pp[512];
    ptr_join(pp, sizeof pp, ptr, "properties");
    json_object_foreach((json_t *)props, key, sub) {
        char sp[512], val[32];
        ptr_join(sp, sizeof sp, pp, key);
        if ((st = gen(c, sub, sp, val))) goto out;
        bool r = false;
        for (size_t i = 0; i < n_req; i++) r = r || !strcmp(json_string_value(json_array_get(req, i)), key);
        struct tern_buf kb = TERN_BUF_INIT;
        json_t *ks = json_string(key);
        char *txt = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!txt || tern_gbnf_literal(&kb, txt, strlen(txt)) || tern_buf_printf(&kb, " ws \":\" ws %s", val)) {
            free(txt);
            tern_buf_free(&kb);
            st = nomem(c);
            goto out;
        }
        free(txt);
        new_name(c, kv[k]);
        st = emit_rule(c, kv[k], &kb);
        tern_buf_free(&kb);
        if (st) goto out;
        isreq[k++] = r;
    }
    for (size_t i = 0; i < n_req; i++) {
        const char *rk = json_string_value(json_array_get(req, i));
        if (json_object_get(props, rk)) continue;
        if (json_is_false(addl)) {
            ptr_join(p, sizeof p, ptr, "required");
            st = fail(c, p, TERN_ERR_INVALID, "'%.60s' is required but not among the properties, and "
                      "additionalProperties is false", rk);
            goto out;
        }
        struct tern_buf kb = TERN_BUF_INIT;
        json_t *ks = json_string(rk);
        char *txt = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!txt || tern_gbnf_literal(&kb, txt, strlen(txt)) || tern_buf_puts(&kb, " ws \":\" ws jvalue")) {
            free(txt);
            tern_buf_free(&kb);
            st = nomem(c);
            goto out;
        }
        free(txt);
        new_name(c, kv[k]);
        st = emit_rule(c, kv[k], &kb);
        tern_buf_free(&kb);
        if (st) goto out;
        isreq[k++] = true;
    }
    /* C_i ::= ( "," KV_i )? C_{i+1} (optional) or "," KV_i C_{i+1} (required): what
     * follows once something was written; S_i: the first item written is at i or later */
    {
        char (*cn)[32] = tern_calloc(k + 1, sizeof *cn), (*sn)[32] = tern_calloc(k + 1, sizeof *sn);
        if (!cn || !sn) {
            free(cn);
            free(sn);
            st = nomem(c);
            goto out;
        }
        for (size_t i = k; i-- > 0 && !st;) {
            struct tern_buf rb = TERN_BUF_INIT;
            new_name(c, cn[i]);
            if (tern_buf_printf(&rb, isreq[i] ? "ws \",\" ws %s%s%s" : "( ws \",\" ws %s )?%s%s", kv[i],
                                i + 1 < k ? " " : "", i + 1 < k ? cn[i + 1] : ""))
                st = nomem(c);
            if (!st) st = emit_rule(c, cn[i], &rb);
            tern_buf_free(&rb);
            if (st) break;
            new_name(c, sn[i]);
            if (isreq[i]) {
                if (tern_buf_printf(&rb, "%s%s%s", kv[i], i + 1 < k ? " " : "", i + 1 < k ? cn[i + 1] : "")) st = nomem(c);
            } else {
                if (tern_buf_printf(&rb, "%s%s%s", kv[i], i + 1 < k ? " " : "", i + 1 < k ? cn[i + 1] : "") ||
                    (i + 1 < k ? tern_buf_printf(&rb, " | %s", sn[i + 1]) : tern_buf_puts(&rb, " | \"\"")))
                    st = nomem(c);
            }
            if (!st) st = emit_rule(c, sn[i], &rb);
            tern_buf_free(&rb);
        }
        if (!st && tern_buf_printf(b, "\"{\" ws %s ws \"}\"", sn[0])) st = nomem(c);
        free(cn);
        free(sn);
    }
out:
    free(kv);
    free(isreq);
    return st;
}

/* Resolves a local $ref ("#", "#/a/b") in the document. */
static const json_t *resolve_ref(const json_t *doc, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *cur = doc;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/') return NULL;
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p += 2;
            else if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p += 2;
            else tok[n++] = *p++;
        }
        tok[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) {
            char *end;
            long i = strtol(tok, &end, 10);
            cur = (*end || i < 0) ? NULL : json_array_get(cur, (size_t)i);
        } else {
            return NULL;
        }
        if (!cur) return NULL;
    }
    return cur;
}

/* One type's grammar for schema s into b. */
static enum tern_status gen_type(struct tern_schema_gbnf *c, const json_t *s, const char *ptr, const char *t,
                                 struct tern_buf *b) {
    if (!strcmp(t, "string")) return gen_string(c, s, ptr, b);
    if (!strcmp(t, "integer")) return gen_number(c, s, ptr, b, true);
    if (!strcmp(t, "number")) return gen_number(c, s, ptr, b, false);
    if (!strcmp(t, "object")) return gen_object(c, s, ptr, b);
    if (!strcmp(t, "array")) return gen_array(c, s, ptr, b);
    if (!strcmp(t, "boolean")) return tern_buf_puts(b, "jboolean") ? nomem(c) : TERN_OK;
    if (!strcmp(t, "null")) return tern_buf_puts(b, "jnull") ? nomem(c) : TERN_OK;
    char p[512];
    ptr_join(p, sizeof p, ptr, "type");
    return fail(c, p, TERN_ERR_INVALID, "unknown type '%.40s'", t);
}

/* Defines a rule for schema s (at ptr) and puts its name in name. */
static enum tern_status gen(struct tern_schema_gbnf *c, const json_t *s, const char *ptr, char name[32]) {
    if (c->err) return c->err;
    if (!check_size(c, ptr)) return c->err;
    if (json_is_true(s)) {
        strcpy(name, "jvalue");
        return TERN_OK;
    }
    if (json_is_false(s)) return fail(c, ptr, TERN_ERR_INVALID, "the schema 'false' matches nothing");
    if (!json_is_object(s)) return fail(c, ptr, TERN_ERR_INVALID, "a schema must be an object or a boolean, got %s", tern_json_kind(s));
    if (++c->depth > TERN_SCHEMA_MAX_DEPTH) {
        c->depth--;
        return fail(c, ptr, TERN_ERR_LIMIT, "schemas nested deeper than %d", TERN_SCHEMA_MAX_DEPTH);
    }
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        if (in_list(key, annotations, TERN_ARRAY_LEN(annotations)) || in_list(key, known, TERN_ARRAY_LEN(known))) continue;
        char p[512];
        ptr_join(p, sizeof p, ptr, key);
        c->depth--;
        return fail(c, p, TERN_ERR_UNSUPPORTED, "the keyword '%.60s' is not supported", key);
    }
    struct tern_buf b = TERN_BUF_INIT;
    enum tern_status st = TERN_OK;
    const json_t *ref = json_object_get(s, "$ref");
    const json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    const json_t *any = json_object_get(s, "anyOf");
    if (!any) any = json_object_get(s, "oneOf");
    char p[512];
    if (ref) {
        ptr_join(p, sizeof p, ptr, "$ref");
        if (!json_is_string(ref)) {
            st = fail(c, p, TERN_ERR_INVALID, "'$ref' must be a string");
            goto out;
        }
        json_object_foreach((json_t *)s, key, v) {
            if (strcmp(key, "$ref") && !in_list(key, annotations, TERN_ARRAY_LEN(annotations))) {
                char kp[512];
                ptr_join(kp, sizeof kp, ptr, key);
                st = fail(c, kp, TERN_ERR_UNSUPPORTED, "'%.60s' beside '$ref' is not supported", key);
                goto out;
            }
        }
        const char *r = json_string_value(ref);
        for (size_t i = 0; i < c->n_refs; i++)
            if (!strcmp(c->refs[i].ptr, r)) {
                strcpy(name, c->refs[i].name);
                goto out;
            }
        const json_t *target = resolve_ref(c->doc, r);
        if (!target) {
            st = fail(c, p, TERN_ERR_UNSUPPORTED, "'$ref' '%.80s' does not resolve (only local references \"#/...\" "
                      "are supported)", r);
            goto out;
        }
        if (c->n_refs == c->cap_refs) {
            size_t nc = c->cap_refs ? c->cap_refs * 2 : 8;
            struct refmap *nr = tern_reallocarray(c->refs, nc, sizeof *nr);
            if (!nr) {
                st = nomem(c);
                goto out;
            }
            c->refs = nr;
            c->cap_refs = nc;
        }
        struct refmap *m = &c->refs[c->n_refs];
        m->ptr = tern_strdup(r);
        if (!m->ptr) {
            st = nomem(c);
            goto out;
        }
        new_name(c, m->name);
        c->n_refs++;
        strcpy(name, m->name);
        char target_name[32];
        char tp[512];
        snprintf(tp, sizeof tp, "%s", r + 1);
        /* the target's own rule, then name ::= target */
        if ((st = gen(c, target, tp, target_name))) goto out;
        st = tern_buf_puts(&b, target_name) ? nomem(c) : TERN_OK;
        if (!st) st = emit_rule(c, name, &b);
        goto out;
    }
    if (cst) {
        st = value_literal(c, cst, &b, ptr);
    } else if (en) {
        ptr_join(p, sizeof p, ptr, "enum");
        if (!json_is_array(en) || json_array_size(en) == 0) {
            st = fail(c, p, TERN_ERR_INVALID, "'enum' must be a non-empty array");
            goto out;
        }
        for (size_t i = 0; i < json_array_size(en) && !st; i++) {
            if (i && tern_buf_puts(&b, " | ")) st = nomem(c);
            if (!st) st = value_literal(c, json_array_get(en, i), &b, p);
        }
    } else if (any) {
        const char *kw = json_object_get(s, "anyOf") ? "anyOf" : "oneOf";
        ptr_join(p, sizeof p, ptr, kw);
        if (!json_is_array(any) || json_array_size(any) == 0) {
            st = fail(c, p, TERN_ERR_INVALID, "'%s' must be a non-empty array", kw);
            goto out;
        }
        json_object_foreach((json_t *)s, key, v) {
            if (strcmp(key, kw) && !in_list(key, annotations, TERN_ARRAY_LEN(annotations))) {
                char kp[512];
                ptr_join(kp, sizeof kp, ptr, key);
                st = fail(c, kp, TERN_ERR_UNSUPPORTED, "'%.60s' beside '%s' is not supported (move it into the branches)",
                          key, kw);
                goto out;
            }
        }
        for (size_t i = 0; i < json_array_size(any) && !st; i++) {
            char ip[512], idx[24], sub[32];
            snprintf(idx, sizeof idx, "%zu", i);
            ptr_join(ip, sizeof ip, p, idx);
            if ((st = gen(c, json_array_get(any, i), ip, sub))) break;
            if (tern_buf_printf(&b, "%s%s", i ? " | " : "", sub)) st = nomem(c);
        }
    } else {
        const json_t *type = json_object_get(s, "type");
        const char *types[8];
        size_t n_types = 0;
        ptr_join(p, sizeof p, ptr, "type");
        if (json_is_string(type)) {
            types[n_types++] = json_string_value(type);
        } else if (json_is_array(type)) {
            if (json_array_size(type) == 0 || json_array_size(type) > 7) {
                st = fail(c, p, TERN_ERR_INVALID, "'type' must list 1 to 7 types");
                goto out;
            }
            for (size_t i = 0; i < json_array_size(type); i++) {
                if (!json_is_string(json_array_get(type, i))) {
                    st = fail(c, p, TERN_ERR_INVALID, "'type' entries must be strings");
                    goto out;
                }
                types[n_types++] = json_string_value(json_array_get(type, i));
            }
        } else if (type) {
            st = fail(c, p, TERN_ERR_INVALID, "'type' must be a string or an array of strings, got %s", tern_json_kind(type));
            goto out;
        } else {
            /* no type: the kinds the keywords constrain, or any value */
            if (json_object_get(s, "properties") || json_object_get(s, "required") ||
                json_object_get(s, "additionalProperties"))
                types[n_types++] = "object";
            if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems"))
                types[n_types++] = "array";
            if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") || json_object_get(s, "pattern") ||
                json_object_get(s, "format"))
                types[n_types++] = "string";
            if (json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
                json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum"))
                types[n_types++] = "number";
            if (!n_types) {
                strcpy(name, "jvalue");
                goto out;
            }
        }
        for (size_t i = 0; i < n_types && !st; i++) {
            if (i && tern_buf_puts(&b, " | ")) st = nomem(c);
            if (!st) st = gen_type(c, s, ptr, types[i], &b);
        }
    }
    if (!st) {
        new_name(c, name);
        st = emit_rule(c, name, &b);
    }
out:
    c->depth--;
    tern_buf_free(&b);
    if (!st && !check_size(c, ptr)) st = c->err;
    return st;
}

/* ---- interface --------------------------------------------------------------------- */

enum tern_status tern_schema_gbnf_new(struct tern_schema_gbnf **out) {
    *out = tern_calloc(1, sizeof **out);
    return *out ? TERN_OK : tern_errorf(TERN_ERR_NOMEM, "json schema: out of memory");
}

void tern_schema_gbnf_free(struct tern_schema_gbnf *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_refs; i++) free(c->refs[i].ptr);
    free(c->refs);
    tern_buf_free(&c->g);
    tern_buf_free(&c->text);
    free(c);
}

enum tern_status tern_schema_gbnf_add_in(struct tern_schema_gbnf *c, const char *name, const json_t *doc,
                                         const json_t *schema, const char *base, char *ptr, size_t ptr_cap) {
    if (ptr && ptr_cap) ptr[0] = 0;
    for (size_t i = 0; i < c->n_refs; i++) free(c->refs[i].ptr);
    c->n_refs = 0;
    c->doc = doc ? doc : schema;
    c->err = TERN_OK;
    c->err_ptr = ptr;
    c->err_cap = ptr_cap;
    c->depth = 0;
    snprintf(c->prefix, sizeof c->prefix, "%.40s", name);
    char top[32];
    enum tern_status st = gen(c, schema, base ? base : "", top);
    if (st) return st;
    if (tern_buf_printf(&c->g, "%s ::= %s\n", name, top)) return nomem(c);
    return TERN_OK;
}

enum tern_status tern_schema_gbnf_add(struct tern_schema_gbnf *c, const char *name, const json_t *schema, char *ptr,
                                      size_t ptr_cap) {
    return tern_schema_gbnf_add_in(c, name, NULL, schema, NULL, ptr, ptr_cap);
}

enum tern_status tern_schema_gbnf_raw(struct tern_schema_gbnf *c, const char *text) {
    return tern_buf_puts(&c->g, text) ? tern_errorf(TERN_ERR_NOMEM, "json schema: out of memory") : TERN_OK;
}

const char *tern_schema_gbnf_text(struct tern_schema_gbnf *c, size_t *len) {
    tern_buf_clear(&c->text);
    if (tern_buf_append(&c->text, c->g.data ? c->g.data : "", c->g.len) || tern_buf_puts(&c->text, shared_rules))
        return NULL;
    if (len) *len = c->text.len;
    return c->text.data;
}

enum tern_status tern_json_schema_to_gbnf(const json_t *schema, struct tern_buf *out, char *ptr, size_t ptr_cap) {
    struct tern_schema_gbnf *c;
    enum tern_status st = tern_schema_gbnf_new(&c);
    if (st) return st;
    st = tern_schema_gbnf_add(c, "root", schema, ptr, ptr_cap);
    size_t n = 0;
    const char *t = st ? NULL : tern_schema_gbnf_text(c, &n);
    if (!st && !t) st = tern_errorf(TERN_ERR_NOMEM, "json schema: out of memory");
    if (!st && tern_buf_append(out, t, n)) st = tern_errorf(TERN_ERR_NOMEM, "json schema: out of memory");
    tern_schema_gbnf_free(c);
    return st;
}

const char *tern_json_object_gbnf(void) { return "root ::= jobject\n" SHARED_RULES; }
