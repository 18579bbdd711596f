/* Python's str() and repr() of values, float repr, and json.dumps (the tojson filter
 * as transformers defines it: ensure_ascii=False, separators ", " / ": ", indent). */
#include "template/tpl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Python repr(float): the shortest digit string that reads back as the same double,
 * in fixed notation when the decimal exponent is in [-4, 16), else d.ddde+XX. */
void tpl_fmt_float(char *buf, size_t size, double f) {
    if (isnan(f)) {
        snprintf(buf, size, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, size, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0.0) {
        snprintf(buf, size, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d.ddde[+-]XX */
    const char *s = tmp;
    bool neg = false;
    if (*s == '-') {
        neg = true;
        s++;
    }
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int e = atoi(s + 1);
    int decpt = e + 1;
    char out[64];
    int k = 0;
    if (neg) out[k++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -decpt; i++) out[k++] = '0';
            for (int i = 0; i < nd; i++) out[k++] = digits[i];
        } else if (decpt >= nd) {
            for (int i = 0; i < nd; i++) out[k++] = digits[i];
            for (int i = nd; i < decpt; i++) out[k++] = '0';
            out[k++] = '.';
            out[k++] = '0';
        } else {
            for (int i = 0; i < decpt; i++) out[k++] = digits[i];
            out[k++] = '.';
            for (int i = decpt; i < nd; i++) out[k++] = digits[i];
        }
        out[k] = 0;
    } else {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++) out[k++] = digits[i];
        }
        out[k] = 0;
        int x = decpt - 1;
        snprintf(out + k, sizeof out - (size_t)k, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    }
    snprintf(buf, size, "%s", out);
}

static enum tern_status put_int(struct tern_buf *b, int64_t i) { return tern_buf_printf(b, "%lld", (long long)i); }

static enum tern_status put_float(struct tern_buf *b, double f) {
    char tmp[64];
    tpl_fmt_float(tmp, sizeof tmp, f);
    return tern_buf_puts(b, tmp);
}

/* Python repr of a str. */
static enum tern_status put_str_repr(struct tern_buf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    enum tern_status st;
    if ((st = tern_buf_putc(b, q))) return st;
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char ch = (unsigned char)s[i];
        char esc[16];
        const char *e = NULL;
        size_t len = 1;
        if (ch < 0x80) {
            if (ch == (unsigned char)q || ch == '\\') {
                esc[0] = '\\';
                esc[1] = (char)ch;
                esc[2] = 0;
                e = esc;
            } else if (ch == '\n') {
                e = "\\n";
            } else if (ch == '\r') {
                e = "\\r";
            } else if (ch == '\t') {
                e = "\\t";
            } else if (ch < 0x20 || ch == 0x7F) {
                snprintf(esc, sizeof esc, "\\x%02x", ch);
                e = esc;
            }
        } else {
            uint32_t cp = utf8_decode(s + i, n - i, &len);
            if (!uc_isprintable(cp)) {
                if (cp < 0x100) snprintf(esc, sizeof esc, "\\x%02x", cp);
                else if (cp < 0x10000) snprintf(esc, sizeof esc, "\\u%04x", cp);
                else snprintf(esc, sizeof esc, "\\U%08x", cp);
                e = esc;
            }
        }
        if (e) {
            if ((st = tern_buf_append(b, s + i - run, run)) || (st = tern_buf_puts(b, e))) return st;
            run = 0;
        } else {
            run += len;
        }
        i += len;
    }
    if ((st = tern_buf_append(b, s + n - run, run))) return st;
    return tern_buf_putc(b, q);
}

enum tern_status tpl_fmt_repr(struct ctx *c, struct tern_buf *b, struct val v, uint32_t depth) {
    enum tern_status st;
    if ((st = tpl_depth_check(c, depth))) return st;
    switch (v.kind) {
    case V_UNDEF: return tern_buf_puts(b, "Undefined");
    case V_STR:
        if ((st = tpl_charge(c, v.u.s.n))) return st;
        if (v.flags & VF_SAFE) {
            if ((st = tern_buf_puts(b, "Markup("))) return st;
            if ((st = put_str_repr(b, v.u.s.p, v.u.s.n))) return st;
            return tern_buf_putc(b, ')');
        }
        return put_str_repr(b, v.u.s.p, v.u.s.n);
    case V_LIST: {
        if (v.rep == REP_RANGE) {
            if (v.u.r->step == 1)
                return tern_buf_printf(b, "range(%lld, %lld)", (long long)v.u.r->start, (long long)v.u.r->stop);
            return tern_buf_printf(b, "range(%lld, %lld, %lld)", (long long)v.u.r->start, (long long)v.u.r->stop,
                                   (long long)v.u.r->step);
        }
        bool tuple = v.flags & VF_TUPLE;
        size_t n = v_len_list(v);
        if ((st = tpl_step(c, n))) return st;
        if ((v.flags & VF_VIEW) && (st = tern_buf_printf(b, "%s(", v_type_name(v)))) return st;
        if ((st = tern_buf_putc(b, tuple ? '(' : '['))) return st;
        for (size_t i = 0; i < n; i++) {
            if (i && (st = tern_buf_puts(b, ", "))) return st;
            if ((st = tpl_fmt_repr(c, b, v_list_at(v, i), depth + 1))) return st;
        }
        if (tuple && n == 1 && (st = tern_buf_putc(b, ','))) return st;
        if ((st = tern_buf_putc(b, tuple ? ')' : ']'))) return st;
        return (v.flags & VF_VIEW) ? tern_buf_putc(b, ')') : TERN_OK;
    }
    case V_DICT:
    case V_NS: {
        struct val d = v;
        d.kind = V_DICT;
        if (v.kind == V_NS && (st = tern_buf_puts(b, "<Namespace "))) return st;
        if ((st = tpl_step(c, v_dict_len(d)))) return st;
        if ((st = tern_buf_putc(b, '{'))) return st;
        struct dict_iter it = {0};
        struct val k, x;
        bool first = true;
        while (v_dict_next(d, &it, &k, &x)) {
            if (!first && (st = tern_buf_puts(b, ", "))) return st;
            first = false;
            if ((st = tpl_fmt_repr(c, b, k, depth + 1)) || (st = tern_buf_puts(b, ": ")) ||
                (st = tpl_fmt_repr(c, b, x, depth + 1)))
                return st;
        }
        if ((st = tern_buf_putc(b, '}'))) return st;
        return v.kind == V_NS ? tern_buf_putc(b, '>') : TERN_OK;
    }
    case V_FUNC:
        if (v.u.fn->type == F_MACRO) return tern_buf_printf(b, "<Macro '%s'>", v.u.fn->name ? v.u.fn->name : "");
        return tern_buf_printf(b, "<function %s>", v.u.fn->name ? v.u.fn->name : "");
    case V_GEN:
        /* Python shows an address here; a fixed one keeps renders deterministic */
        return tern_buf_printf(b, "<%s object%s%s at 0x7f0000000000>", v.u.gen->type_name,
                               v.u.gen->filter_name ? " " : "", v.u.gen->filter_name ? v.u.gen->filter_name : "");
    case V_LOOP:
        return tern_buf_printf(b, "<LoopContext %lld/%lld>", (long long)(v.u.loop->index0 + 1),
                               (long long)v.u.loop->length);
    default: return tpl_fmt_str(c, b, v, depth);
    }
}

enum tern_status tpl_fmt_str(struct ctx *c, struct tern_buf *b, struct val v, uint32_t depth) {
    switch (v.kind) {
    case V_UNDEF: return TERN_OK;
    case V_NONE: return tern_buf_puts(b, "None");
    case V_BOOL: return tern_buf_puts(b, v.u.b ? "True" : "False");
    case V_INT: return put_int(b, v.u.i);
    case V_FLOAT: return put_float(b, v.u.f);
    case V_STR: return tern_buf_append(b, v.u.s.p, v.u.s.n);
    default: return tpl_fmt_repr(c, b, v, depth);
    }
}

enum tern_status tpl_to_str(struct ctx *c, struct val v, struct val *out) {
    if (v.kind == V_STR) {
        *out = v;
        return TERN_OK;
    }
    if (v.kind == V_UNDEF) {
        *out = v_str("", 0);
        return TERN_OK;
    }
    char tmp[64];
    if (v.kind == V_INT || v.kind == V_FLOAT || v.kind == V_BOOL || v.kind == V_NONE) {
        if (v.kind == V_INT) snprintf(tmp, sizeof tmp, "%lld", (long long)v.u.i);
        else if (v.kind == V_FLOAT) tpl_fmt_float(tmp, sizeof tmp, v.u.f);
        else snprintf(tmp, sizeof tmp, "%s", v.kind == V_NONE ? "None" : v.u.b ? "True" : "False");
        return tpl_new_str(c, tmp, strlen(tmp), out);
    }
    struct tern_buf b = TERN_BUF_INIT;
    b.limit = c->max_output;
    enum tern_status st = tpl_fmt_str(c, &b, v, 0);
    if (st == TERN_OK) st = tpl_new_str(c, b.data ? b.data : "", b.len, out);
    tern_buf_free(&b);
    return st;
}

/* ---- JSON ------------------------------------------------------------------------- */

static enum tern_status json_str(struct tern_buf *b, const char *s, size_t n, bool ascii) {
    enum tern_status st;
    if ((st = tern_buf_putc(b, '"'))) return st;
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char ch = (unsigned char)s[i];
        char esc[16];
        const char *e = NULL;
        size_t len = 1;
        if (ch < 0x80) {
            switch (ch) {
            case '"': e = "\\\""; break;
            case '\\': e = "\\\\"; break;
            case '\n': e = "\\n"; break;
            case '\r': e = "\\r"; break;
            case '\t': e = "\\t"; break;
            case '\b': e = "\\b"; break;
            case '\f': e = "\\f"; break;
            default:
                if (ch < 0x20 || (ascii && ch == 0x7F)) {
                    snprintf(esc, sizeof esc, "\\u%04x", ch);
                    e = esc;
                }
                break;
            }
        } else if (ascii) {
            uint32_t cp = utf8_decode(s + i, n - i, &len);
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
            e = esc;
        } else {
            len = utf8_seqlen(ch);
            if (len > n - i) len = n - i;
        }
        if (e) {
            if ((st = tern_buf_append(b, s + i - run, run)) || (st = tern_buf_puts(b, e))) return st;
            run = 0;
        } else {
            run += len;
        }
        i += len;
    }
    if ((st = tern_buf_append(b, s + n - run, run))) return st;
    return tern_buf_putc(b, '"');
}

static enum tern_status json_newline(struct tern_buf *b, const struct json_opts *o, size_t level) {
    enum tern_status st;
    if ((st = tern_buf_putc(b, '\n'))) return st;
    for (size_t i = 0; i < level; i++)
        if ((st = tern_buf_append(b, o->indent, o->indent_len))) return st;
    return TERN_OK;
}

static enum tern_status json_float(struct tern_buf *b, double f) {
    if (isnan(f)) return tern_buf_puts(b, "NaN");
    if (isinf(f)) return tern_buf_puts(b, f < 0 ? "-Infinity" : "Infinity");
    return put_float(b, f);
}

/* A dict key as JSON: str as is; int, float, bool, None converted like json.dumps. */
static enum tern_status json_key(struct tern_buf *b, struct val k, const struct json_opts *o) {
    char tmp[64];
    switch (k.kind) {
    case V_STR: return json_str(b, k.u.s.p, k.u.s.n, o->ensure_ascii);
    case V_NONE: return tern_buf_puts(b, "\"null\"");
    case V_BOOL: return tern_buf_puts(b, k.u.b ? "\"true\"" : "\"false\"");
    case V_INT: return tern_buf_printf(b, "\"%lld\"", (long long)k.u.i);
    case V_FLOAT:
        if (isnan(k.u.f)) snprintf(tmp, sizeof tmp, "NaN");
        else if (isinf(k.u.f)) snprintf(tmp, sizeof tmp, k.u.f < 0 ? "-Infinity" : "Infinity");
        else tpl_fmt_float(tmp, sizeof tmp, k.u.f);
        return tern_buf_printf(b, "\"%s\"", tmp);
    default:
        return tern_errorf(TERN_ERR_TEMPLATE, "tojson: keys must be str, int, float, bool or None, not %s",
                           v_type_name(k));
    }
}

/* (key, value) pairs ordered by key, for sort_keys */
static enum tern_status key_less(struct ctx *c, const struct val *a, const struct val *b, void *user, bool *less) {
    (void)user;
    int r;
    enum tern_status st = tpl_cmp(c, a->u.l->items[0], b->u.l->items[0], &r, 0);
    *less = r == -1;
    return st;
}

enum tern_status tpl_fmt_json(struct ctx *c, struct tern_buf *b, struct val v, const struct json_opts *o,
                              uint32_t depth, size_t level) {
    enum tern_status st;
    if ((st = tpl_depth_check(c, depth))) return st;
    switch (v.kind) {
    case V_NONE: return tern_buf_puts(b, "null");
    case V_BOOL: return tern_buf_puts(b, v.u.b ? "true" : "false");
    case V_INT: return put_int(b, v.u.i);
    case V_FLOAT: return json_float(b, v.u.f);
    case V_STR:
        if ((st = tpl_charge(c, v.u.s.n))) return st;
        return json_str(b, v.u.s.p, v.u.s.n, o->ensure_ascii);
    case V_LIST: {
        if (v.rep == REP_RANGE || (v.flags & VF_VIEW)) break;
        size_t n = v_len_list(v);
        if ((st = tpl_step(c, n))) return st;
        if (n == 0) return tern_buf_puts(b, "[]");
        if ((st = tern_buf_putc(b, '['))) return st;
        for (size_t i = 0; i < n; i++) {
            if (i && (st = tern_buf_append(b, o->item_sep, o->item_sep_len))) return st;
            if (o->indent_set && (st = json_newline(b, o, level + 1))) return st;
            if ((st = tpl_fmt_json(c, b, v_list_at(v, i), o, depth + 1, level + 1))) return st;
        }
        if (o->indent_set && (st = json_newline(b, o, level))) return st;
        return tern_buf_putc(b, ']');
    }
    case V_DICT: {
        size_t n = v_dict_len(v);
        if ((st = tpl_step(c, n))) return st;
        if (n == 0) return tern_buf_puts(b, "{}");
        struct val *items = NULL;
        if (o->sort_keys) {
            items = tern_arena_alloc(&c->ar, n * sizeof *items);
            if (!items) return tpl_oom(c);
            struct dict_iter it = {0};
            size_t i = 0;
            struct val k, x;
            while (i < n && v_dict_next(v, &it, &k, &x)) {
                struct tpl_list *pair = tpl_list_new(c, 2);
                if (!pair) return tpl_oom(c);
                pair->items[0] = k;
                pair->items[1] = x;
                items[i++] = v_list(pair, true);
            }
            n = i;
            if ((st = tpl_sort(c, items, n, key_less, NULL))) return st;
        }
        if ((st = tern_buf_putc(b, '{'))) return st;
        struct dict_iter it = {0};
        for (size_t i = 0; i < n; i++) {
            struct val k, x;
            if (items) {
                k = items[i].u.l->items[0];
                x = items[i].u.l->items[1];
            } else if (!v_dict_next(v, &it, &k, &x)) {
                break;
            }
            if (i && (st = tern_buf_append(b, o->item_sep, o->item_sep_len))) return st;
            if (o->indent_set && (st = json_newline(b, o, level + 1))) return st;
            if ((st = json_key(b, k, o))) return st;
            if ((st = tern_buf_append(b, o->key_sep, o->key_sep_len))) return st;
            if ((st = tpl_fmt_json(c, b, x, o, depth + 1, level + 1))) return st;
        }
        if (o->indent_set && (st = json_newline(b, o, level))) return st;
        return tern_buf_putc(b, '}');
    }
    default: break;
    }
    return tern_errorf(TERN_ERR_TEMPLATE, "Object of type %s is not JSON serializable", v_type_name(v));
}
