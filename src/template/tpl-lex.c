/* Tokeniser: template text, tags and the expressions inside them.
 *
 * Reproduces jinja2's lexer with trim_blocks and lstrip_blocks on:
 * - "{%-", "{{-", "{#-" strip all whitespace (newlines too) before the tag;
 *   "-%}", "-}}", "-#}" strip all whitespace after it;
 * - trim_blocks: the first newline after "%}" or "#}" is dropped ("+%}" keeps it);
 * - lstrip_blocks: spaces and tabs between a line start and "{%" / "{#" are dropped
 *   ("{%+" keeps them); a line start is the start of the source or a position right
 *   after a tag whose match ended with a newline;
 * - inside brackets "}}" and "%}" do not end a tag ({{ {'a': {'b': 1}} }}).
 * Whitespace means Python's str.isspace() (Unicode), as jinja2's regular expressions
 * (\s) do. String literals are decoded like Python's "unicode-escape" codec. */
#include "template/tpl.h"

#include "util/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lexer {
    const char *s;
    size_t n;
    struct tern_arena *ar;
    struct tpl_tokens *out;
};

void tpl_line_col(const char *src, size_t len, size_t pos, unsigned *line, unsigned *col) {
    unsigned l = 1, c = 1;
    if (pos > len) pos = len;
    for (size_t i = 0; i < pos; i++) {
        if (src[i] == '\n') {
            l++;
            c = 1;
        } else if (((unsigned char)src[i] & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static enum tern_status lex_error(struct lexer *lx, size_t pos, const char *fmt, const char *arg) {
    unsigned line, col;
    tpl_line_col(lx->s, lx->n, pos, &line, &col);
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    return tern_errorf(TERN_ERR_TEMPLATE, "line %u:%u: %s", line, col, msg);
}

static enum tern_status push(struct lexer *lx, struct token tk) {
    struct tpl_tokens *o = lx->out;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        struct token *t = tern_arena_grow(lx->ar, o->t, o->cap * sizeof *t, cap * sizeof *t);
        if (!t) return TERN_ERR_NOMEM;
        o->t = t;
        o->cap = cap;
    }
    o->t[o->n++] = tk;
    return TERN_OK;
}

static enum tern_status push_simple(struct lexer *lx, int type, size_t pos) {
    struct token tk = {0};
    tk.type = (uint8_t)type;
    tk.pos = (uint32_t)pos;
    return push(lx, tk);
}

/* Whitespace (Python str.isspace) starting at p, or 0. */
static size_t space_at(const char *s, size_t n, size_t p) {
    if (p >= n) return 0;
    unsigned char ch = (unsigned char)s[p];
    if (ch < 0x80) return (ch == ' ' || (ch >= 0x09 && ch <= 0x0D) || (ch >= 0x1C && ch <= 0x1F)) ? 1 : 0;
    size_t len;
    uint32_t cp = utf8_decode(s + p, n - p, &len);
    return uc_isspace(cp) ? len : 0;
}

static size_t skip_space(const char *s, size_t n, size_t p) {
    size_t k;
    while ((k = space_at(s, n, p)) > 0) p += k;
    return p;
}

/* Length of the text [a, b) without its trailing whitespace. */
static size_t rstrip_end(const char *s, size_t a, size_t b) {
    while (b > a) {
        size_t q = b - 1;
        while (q > a && ((unsigned char)s[q] & 0xC0) == 0x80) q--;
        if (space_at(s, b, q) != b - q) break;
        b = q;
    }
    return b;
}

/* Applies the whitespace control of a tag to the text [a, b) before it and emits it. */
static enum tern_status emit_text(struct lexer *lx, size_t a, size_t b, char sign, bool is_var, bool line_starting) {
    if (sign == '-') {
        b = rstrip_end(lx->s, a, b);
    } else if (sign != '+' && !is_var) {
        /* lstrip_blocks: drop whitespace between the last line start and the tag. */
        size_t l = b;
        while (l > a && lx->s[l - 1] != '\n') l--;
        if ((l > a || line_starting) && l < b && skip_space(lx->s, b, l) == b) b = l;
    }
    if (b > a) {
        struct token tk = {0};
        tk.type = TK_TEXT;
        tk.pos = (uint32_t)a;
        tk.u.s.p = lx->s + a;
        tk.u.s.n = b - a;
        return push(lx, tk);
    }
    return TERN_OK;
}

static bool starts(const char *s, size_t n, size_t p, const char *lit) {
    size_t k = strlen(lit);
    return p + k <= n && memcmp(s + p, lit, k) == 0;
}

/* Matches "raw" / "endraw" tag bodies: \s* WORD \s* then an end "-%}" / "+%}" / "%}".
 * Returns the position after the match (with trim rules applied), or 0. */
static size_t match_raw_tag(const char *s, size_t n, size_t p, const char *word, bool endraw) {
    p = skip_space(s, n, p);
    if (!starts(s, n, p, word)) return 0;
    p += strlen(word);
    p = skip_space(s, n, p);
    if (starts(s, n, p, "-%}")) return skip_space(s, n, p + 3);
    if (endraw && starts(s, n, p, "+%}")) return p + 3;
    if (starts(s, n, p, "%}")) {
        p += 2;
        /* trim_blocks applies to endraw, not to the raw opening tag */
        if (endraw && p < n && s[p] == '\n') p++;
        return p;
    }
    return 0;
}

static int is_name_start(unsigned char c) { return c == '_' || (unsigned)((c | 32) - 'a') < 26u || c >= 0x80; }
static int is_digit(unsigned char c) { return (unsigned)(c - '0') < 10u; }
static int is_name_char(unsigned char c) { return is_name_start(c) || is_digit(c); }

/* A run of digits with single underscores between them (Python numeric literal). */
static size_t digits_(const char *s, size_t n, size_t p) {
    if (p >= n || !is_digit((unsigned char)s[p])) return 0;
    size_t q = p + 1;
    for (;;) {
        if (q < n && is_digit((unsigned char)s[q])) {
            q++;
        } else if (q + 1 < n && s[q] == '_' && is_digit((unsigned char)s[q + 1])) {
            q += 2;
        } else {
            break;
        }
    }
    return q - p;
}

static int hexval(unsigned char c) {
    if ((unsigned)(c - '0') < 10u) return c - '0';
    c |= 32;
    if ((unsigned)(c - 'a') < 6u) return c - 'a' + 10;
    return -1;
}

/* Decodes a string literal body [a, b) like Python's
 * body.encode("ascii", "backslashreplace").decode("unicode-escape"). */
static enum tern_status decode_string(struct lexer *lx, size_t a, size_t b, struct token *tk) {
    const char *s = lx->s;
    /* Output is never longer than 4x... escapes only shrink, except "\<non-ascii>"
     * which becomes "\" + "\\U0001xxxx" (11 bytes for 4): bound by 3x. */
    char *o = tern_arena_alloc(lx->ar, (b - a) * 3 + 1);
    if (!o) return TERN_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = a; i < b;) {
        unsigned char ch = (unsigned char)s[i];
        if (ch != '\\') {
            o[k++] = (char)ch;
            i++;
            continue;
        }
        /* a backslash: the literal regex guarantees a following character */
        size_t esc = i;
        i++;
        unsigned char e = (unsigned char)s[i];
        if (e >= 0x80) {
            /* backslashreplace turns the character into an escape sequence first; its
             * backslash pairs with this one, so the sequence's text comes out literally:
             * '\é' is the four characters \xe9. */
            size_t len;
            uint32_t cp = utf8_decode(s + i, b - i, &len);
            char tmp[16];
            int m = cp < 0x100     ? snprintf(tmp, sizeof tmp, "\\x%02x", cp)
                    : cp < 0x10000 ? snprintf(tmp, sizeof tmp, "\\u%04x", cp)
                                   : snprintf(tmp, sizeof tmp, "\\U%08x", cp);
            memcpy(o + k, tmp, (size_t)m);
            k += (size_t)m;
            i += len;
            continue;
        }
        i++;
        switch (e) {
        case '\n': break; /* line continuation */
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'v': o[k++] = '\v'; break;
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
            uint32_t cp = e - '0';
            for (int d = 0; d < 2 && i < b && s[i] >= '0' && s[i] <= '7'; d++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
            k += utf8_encode(cp, o + k);
            break;
        }
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int d = 0; d < nd; d++) {
                int h = i < b ? hexval((unsigned char)s[i]) : -1;
                if (h < 0) return lex_error(lx, esc, "truncated \\%s escape in string literal", e == 'x' ? "xXX" : e == 'u' ? "uXXXX" : "UXXXXXXXX");
                cp = cp * 16 + (uint32_t)h;
                i++;
            }
            if (cp > 0x10FFFF) return lex_error(lx, esc, "illegal Unicode character in string literal%s", "");
            if (cp >= 0xD800 && cp <= 0xDFFF)
                return lex_error(lx, esc, "surrogate code point in string literal (not representable in UTF-8)%s", "");
            k += utf8_encode(cp, o + k);
            break;
        }
        case 'N':
            return lex_error(lx, esc, "\\N{...} escapes are not supported in string literals%s", "");
        default:
            /* unknown escapes keep their backslash */
            o[k++] = '\\';
            o[k++] = (char)e;
            break;
        }
    }
    o[k] = 0;
    tk->u.s.p = o;
    tk->u.s.n = k;
    return TERN_OK;
}

struct opdef {
    const char *s;
    uint8_t op;
};
static const struct opdef ops2[] = {
    {"//", OP_FLOORDIV}, {"**", OP_POW}, {"==", OP_EQ}, {"!=", OP_NE}, {">=", OP_GE}, {"<=", OP_LE},
};
static const struct opdef ops1[] = {
    {"+", OP_ADD},      {"-", OP_SUB},      {"/", OP_DIV},      {"*", OP_MUL},    {"%", OP_MOD},
    {"~", OP_TILDE},    {"[", OP_LBRACKET}, {"]", OP_RBRACKET}, {"(", OP_LPAREN}, {")", OP_RPAREN},
    {"{", OP_LBRACE},   {"}", OP_RBRACE},   {">", OP_GT},       {"<", OP_LT},     {"=", OP_ASSIGN},
    {".", OP_DOT},      {":", OP_COLON},    {"|", OP_PIPE},     {",", OP_COMMA},  {";", OP_SEMICOLON},
};

/* Lexes the inside of a {{ }} or {% %} tag starting at p. Returns the position after
 * the closing delimiter in *end and whether the match ended with a newline. */
static enum tern_status lex_tag(struct lexer *lx, size_t p, bool is_block, size_t open_pos, size_t *end,
                                bool *ends_nl) {
    const char *s = lx->s;
    size_t n = lx->n;
    char stack[64];
    size_t depth = 0;
    for (;;) {
        if (depth == 0) {
            size_t q = 0;
            bool close = false;
            if (is_block) {
                if (starts(s, n, p, "-%}")) {
                    q = skip_space(s, n, p + 3);
                    close = true;
                } else if (starts(s, n, p, "+%}")) {
                    q = p + 3;
                    close = true;
                } else if (starts(s, n, p, "%}")) {
                    q = p + 2;
                    if (q < n && s[q] == '\n') q++;
                    close = true;
                }
            } else {
                if (starts(s, n, p, "-}}")) {
                    q = skip_space(s, n, p + 3);
                    close = true;
                } else if (starts(s, n, p, "}}")) {
                    q = p + 2;
                    close = true;
                }
            }
            if (close) {
                enum tern_status st = push_simple(lx, is_block ? TK_BLOCK_END : TK_VAR_END, p);
                if (st) return st;
                *end = q;
                *ends_nl = q > 0 && s[q - 1] == '\n';
                return TERN_OK;
            }
        }
        size_t k = space_at(s, n, p);
        if (k) {
            p += k;
            continue;
        }
        if (p >= n) {
            return lex_error(lx, open_pos, "tag is never closed: expected '%s', got end of template",
                             is_block ? "%}" : "}}");
        }
        unsigned char ch = (unsigned char)s[p];
        struct token tk = {0};
        tk.pos = (uint32_t)p;
        /* float: digits ( . digits [exponent] | exponent ), not right after a dot */
        if (is_digit(ch) && !(p > 0 && s[p - 1] == '.')) {
            size_t d = digits_(s, n, p);
            size_t q = p + d;
            bool is_float = false;
            if (q + 1 < n && s[q] == '.' && is_digit((unsigned char)s[q + 1])) {
                q += 1 + digits_(s, n, q + 1);
                is_float = true;
            }
            if (q < n && (s[q] | 32) == 'e') {
                size_t r = q + 1;
                if (r < n && (s[r] == '+' || s[r] == '-')) r++;
                size_t ed = digits_(s, n, r);
                if (ed) {
                    q = r + ed;
                    is_float = true;
                }
            }
            if (is_float) {
                char buf[128];
                size_t m = 0;
                for (size_t i = p; i < q && m + 1 < sizeof buf; i++)
                    if (s[i] != '_') buf[m++] = s[i];
                buf[m] = 0;
                tk.type = TK_FLOAT;
                tk.u.f = strtod(buf, NULL);
                enum tern_status st = push(lx, tk);
                if (st) return st;
                p = q;
                continue;
            }
        }
        if (is_digit(ch)) {
            /* integer: 0b.. 0o.. 0x.. or decimal; "0" may only be followed by more 0s */
            size_t q = p;
            int base = 10;
            if (ch == '0' && p + 1 < n && ((s[p + 1] | 32) == 'b' || (s[p + 1] | 32) == 'o' || (s[p + 1] | 32) == 'x')) {
                char b = (char)(s[p + 1] | 32);
                base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
                size_t r = p + 2;
                size_t start = r;
                for (;;) {
                    size_t r2 = r;
                    if (r2 < n && s[r2] == '_') r2++;
                    int h = r2 < n ? hexval((unsigned char)s[r2]) : -1;
                    if (h < 0 || h >= base) break;
                    r = r2 + 1;
                }
                if (r == start) base = 10; /* just "0" */
                else q = r;
            }
            if (base == 10) {
                if (ch == '0') {
                    q = p + 1;
                    for (;;) {
                        if (q < n && s[q] == '0') q++;
                        else if (q + 1 < n && s[q] == '_' && s[q + 1] == '0') q += 2;
                        else break;
                    }
                } else {
                    q = p + digits_(s, n, p);
                }
            }
            uint64_t v = 0;
            size_t i0 = base == 10 ? p : p + 2;
            for (size_t i = i0; i < q; i++) {
                if (s[i] == '_') continue;
                int h = hexval((unsigned char)s[i]);
                if (v > (UINT64_MAX - (uint64_t)h) / (uint64_t)base || v * (uint64_t)base + (uint64_t)h > (uint64_t)INT64_MAX)
                    return lex_error(lx, p, "integer literal too large%s", "");
                v = v * (uint64_t)base + (uint64_t)h;
            }
            tk.type = TK_INT;
            tk.u.i = (int64_t)v;
            enum tern_status st = push(lx, tk);
            if (st) return st;
            p = q;
            continue;
        }
        if (is_name_start(ch)) {
            size_t q = p;
            while (q < n && is_name_char((unsigned char)s[q])) q++;
            tk.type = TK_NAME;
            char *nm = tern_arena_strndup(lx->ar, s + p, q - p);
            if (!nm) return TERN_ERR_NOMEM;
            tk.u.s.p = nm;
            tk.u.s.n = q - p;
            enum tern_status st = push(lx, tk);
            if (st) return st;
            p = q;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            size_t q = p + 1;
            while (q < n && (unsigned char)s[q] != ch) {
                if (s[q] == '\\') q++;
                q++;
            }
            if (q >= n) return lex_error(lx, p, "unterminated string literal%s", "");
            tk.type = TK_STRING;
            enum tern_status st = decode_string(lx, p + 1, q, &tk);
            if (st) return st;
            st = push(lx, tk);
            if (st) return st;
            p = q + 1;
            continue;
        }
        const struct opdef *od = NULL;
        for (size_t i = 0; i < TERN_ARRAY_LEN(ops2) && !od; i++)
            if (starts(s, n, p, ops2[i].s)) od = &ops2[i];
        for (size_t i = 0; i < TERN_ARRAY_LEN(ops1) && !od; i++)
            if ((unsigned char)ops1[i].s[0] == ch) od = &ops1[i];
        if (!od) {
            char c1[8];
            size_t len = utf8_seqlen(ch);
            if (len > n - p) len = n - p;
            memcpy(c1, s + p, len);
            c1[len] = 0;
            return lex_error(lx, p, "unexpected character '%s'", c1);
        }
        if (od->op == OP_LPAREN || od->op == OP_LBRACKET || od->op == OP_LBRACE) {
            if (depth == sizeof stack) return lex_error(lx, p, "brackets nested too deeply%s", "");
            stack[depth++] = od->op == OP_LPAREN ? ')' : od->op == OP_LBRACKET ? ']' : '}';
        } else if (od->op == OP_RPAREN || od->op == OP_RBRACKET || od->op == OP_RBRACE) {
            if (depth == 0) {
                char c1[2] = {(char)ch, 0};
                return lex_error(lx, p, "unexpected '%s'", c1);
            }
            if (stack[depth - 1] != (char)ch) {
                char msg[16];
                snprintf(msg, sizeof msg, "%c', got '%c", stack[depth - 1], (char)ch);
                return lex_error(lx, p, "expected '%s'", msg);
            }
            depth--;
        }
        tk.type = TK_OP;
        tk.op = od->op;
        enum tern_status st = push(lx, tk);
        if (st) return st;
        p += strlen(od->s);
    }
}

enum tern_status tpl_lex(const char *src, size_t len, struct tern_arena *ar, struct tpl_tokens *out) {
    struct lexer lx = {src, len, ar, out};
    memset(out, 0, sizeof *out);
    size_t p = 0;
    bool line_starting = true;
    enum tern_status st;
    while (p < len) {
        /* next tag opener */
        size_t q = p;
        const char *hit = NULL;
        while (q + 1 < len) {
            const char *b = memchr(src + q, '{', len - q - 1);
            if (!b) break;
            char k = b[1];
            if (k == '{' || k == '%' || k == '#') {
                hit = b;
                break;
            }
            q = (size_t)(b - src) + 1;
        }
        if (!hit) {
            struct token tk = {0};
            tk.type = TK_TEXT;
            tk.pos = (uint32_t)p;
            tk.u.s.p = src + p;
            tk.u.s.n = len - p;
            if ((st = push(&lx, tk))) return st;
            break;
        }
        size_t tag = (size_t)(hit - src);
        char kind = hit[1];
        size_t r = tag + 2;
        char sign = 0;
        if (r < len && (src[r] == '-' || src[r] == '+')) sign = src[r++];
        if (kind == '%') {
            size_t after = match_raw_tag(src, len, r, "raw", false);
            if (after) {
                if ((st = emit_text(&lx, p, tag, sign, false, line_starting))) return st;
                /* raw body up to the first {% endraw %} */
                size_t scan = after;
                for (;;) {
                    const char *b = NULL;
                    while (scan + 1 < len) {
                        const char *x = memchr(src + scan, '{', len - scan - 1);
                        if (!x) break;
                        if (x[1] == '%') {
                            b = x;
                            break;
                        }
                        scan = (size_t)(x - src) + 1;
                    }
                    if (!b) return lex_error(&lx, tag, "missing end of raw directive: expected '{%% endraw %%}'%s", "");
                    size_t et = (size_t)(b - src);
                    size_t e2 = et + 2;
                    char esign = 0;
                    if (e2 < len && (src[e2] == '-' || src[e2] == '+')) esign = src[e2++];
                    size_t eend = match_raw_tag(src, len, e2, "endraw", true);
                    if (eend) {
                        bool ls = after > 0 && src[after - 1] == '\n';
                        if ((st = emit_text(&lx, after, et, esign, false, ls))) return st;
                        p = eend;
                        line_starting = src[eend - 1] == '\n';
                        break;
                    }
                    scan = et + 2;
                }
                continue;
            }
        }
        if ((st = emit_text(&lx, p, tag, sign, kind == '{', line_starting))) return st;
        if (kind == '#') {
            size_t c = r;
            size_t endp = 0;
            for (; c + 1 < len; c++) {
                if (src[c] == '+' && starts(src, len, c + 1, "#}")) {
                    endp = c + 3;
                    break;
                }
                if (src[c] == '-' && starts(src, len, c + 1, "#}")) {
                    endp = skip_space(src, len, c + 3);
                    break;
                }
                if (src[c] == '#' && src[c + 1] == '}') {
                    endp = c + 2;
                    if (endp < len && src[endp] == '\n') endp++;
                    break;
                }
            }
            if (!endp) return lex_error(&lx, tag, "comment is never closed: expected '#}'%s", "");
            p = endp;
            line_starting = src[endp - 1] == '\n';
            continue;
        }
        if ((st = push_simple(&lx, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, tag))) return st;
        size_t endp = 0;
        bool nl = false;
        if ((st = lex_tag(&lx, r, kind == '%', tag, &endp, &nl))) return st;
        p = endp;
        line_starting = nl;
    }
    return push_simple(&lx, TK_EOF, len);
}
