/* jinja2's builtin filters and tests (jinja2/filters.py, jinja2/tests.py), with the
 * tojson filter replaced by transformers' json.dumps(ensure_ascii=False) version.
 * Filters that jinja2 implements as generators (map, select, ...) return lists. */
#include "template/tpl.h"

#include "util/mem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>



enum filter {
    FL_ABS, FL_ATTR, FL_BATCH, FL_CAPITALIZE, FL_CENTER, FL_COUNT, FL_D, FL_DEFAULT, FL_DICTSORT, FL_E, FL_ESCAPE,
    FL_FIRST, FL_FLOAT, FL_FORCEESCAPE, FL_FORMAT, FL_INDENT, FL_INT, FL_ITEMS, FL_JOIN, FL_LAST, FL_LENGTH,
    FL_LIST, FL_LOWER, FL_MAP, FL_MAX, FL_MIN, FL_REJECT, FL_REJECTATTR, FL_REPLACE, FL_REVERSE, FL_ROUND,
    FL_SAFE, FL_SELECT, FL_SELECTATTR, FL_SLICE, FL_SORT, FL_STRING, FL_STRIPTAGS, FL_SUM, FL_TITLE, FL_TOJSON,
    FL_TRIM, FL_TRUNCATE, FL_UNIQUE, FL_UPPER, FL_WORDCOUNT,
    FL_N
};

/* A filter: its arguments bound and checked by itself; id is the one called (a function
 * may serve a family: upper, lower, capitalize). */
typedef enum tern_status (*filter_fn)(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                     struct val *out);
struct filter_def {
    const char *name;
    filter_fn fn;
};
static const struct filter_def filters[FL_N]; /* below the functions */

int tpl_filter_id(const char *name) {
    for (int i = 0; i < FL_N; i++)
        if (!strcmp(filters[i].name, name)) return i;
    return -1;
}

enum test {
    TS_BOOLEAN, TS_CALLABLE, TS_DEFINED, TS_DIVISIBLEBY, TS_EQ, TS_EQUALTO, TS_EQ_OP, TS_ESCAPED, TS_EVEN, TS_FALSE,
    TS_FILTER, TS_FLOAT, TS_GE, TS_GE_OP, TS_GT, TS_GREATERTHAN, TS_GT_OP, TS_IN, TS_INTEGER, TS_ITERABLE, TS_LE,
    TS_LE_OP, TS_LESSTHAN, TS_LOWER, TS_LT, TS_LT_OP, TS_MAPPING, TS_NE, TS_NE_OP, TS_NONE, TS_NUMBER, TS_ODD,
    TS_SAMEAS, TS_SEQUENCE, TS_STRING, TS_TEST, TS_TRUE, TS_UNDEFINED, TS_UPPER,
    TS_N
};

static const char *const test_names[TS_N] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false",
    "filter", "float", "ge", ">=", "gt", "greaterthan", ">", "in", "integer", "iterable", "le",
    "<=", "lessthan", "lower", "lt", "<", "mapping", "ne", "!=", "none", "number", "odd",
    "sameas", "sequence", "string", "test", "true", "undefined", "upper",
};

int tpl_test_id(const char *name) {
    for (int i = 0; i < TS_N; i++)
        if (!strcmp(test_names[i], name)) return i;
    return -1;
}

/* ---- helpers ---------------------------------------------------------------------- */

static struct val dict_val(struct tpl_dict *d) {
    struct val v = {0};
    v.kind = V_DICT;
    v.u.d = d;
    return v;
}

/* len(): code points for strings, items for lists and dicts, 0 for undefined. */
static enum tern_status py_len(struct val v, int64_t *out) {
    switch (v.kind) {
    case V_STR: *out = (int64_t)utf8_count(v.u.s.p, v.u.s.n); return TERN_OK;
    case V_LIST: *out = (int64_t)v_len_list(v); return TERN_OK;
    case V_DICT: *out = (int64_t)v_dict_len(v); return TERN_OK;
    case V_UNDEF: *out = 0; return TERN_OK;
    default: return tern_errorf(TERN_ERR_TEMPLATE, "object of type '%s' has no len()", v_type_name(v));
    }
}

/* jinja2's make_attrgetter: "a.b.0" walks getitem (with attribute fallback). */
static enum tern_status get_path(struct ctx *c, struct val item, struct val attr, struct val *out) {
    enum tern_status st;
    if (attr.kind != V_STR) return tpl_getitem(c, item, attr, out);
    const char *p = attr.u.s.p;
    size_t n = attr.u.s.n, i = 0;
    struct val v = item;
    for (;;) {
        size_t j = i;
        while (j < n && p[j] != '.') j++;
        struct val key = v_str(p + i, j - i);
        bool digits = j > i;
        int64_t idx = 0;
        for (size_t k = i; k < j; k++) {
            if (p[k] < '0' || p[k] > '9' || idx > 100000000) digits = false;
            else idx = idx * 10 + (p[k] - '0');
        }
        if ((st = tpl_getitem(c, v, digits ? v_int(idx) : key, &v))) return st;
        if (j >= n) break;
        i = j + 1;
    }
    *out = v;
    return TERN_OK;
}

static enum tern_status lower_if_str(struct ctx *c, struct val v, bool case_sensitive, struct val *out) {
    if (!case_sensitive && v.kind == V_STR) return tpl_case(c, v, CM_LOWER, out);
    *out = v;
    return TERN_OK;
}

static struct val empty_list(struct ctx *c) {
    struct tpl_list *l = tpl_list_new(c, 0);
    struct val v = v_none();
    if (l) v = v_list(l, false);
    return v;
}

static enum tern_status soft_str(struct ctx *c, struct val v, struct val *out) { return tpl_to_str(c, v, out); }

/* ---- sorting ---------------------------------------------------------------------- */

struct sort_key {
    bool reverse;
};

/* items are (key, original) pairs; compare keys */
static enum tern_status pair_less(struct ctx *c, const struct val *a, const struct val *b, void *user, bool *less) {
    const struct sort_key *sk = user;
    int r;
    struct val ka = a->u.l->items[0], kb = b->u.l->items[0];
    enum tern_status st = tpl_cmp(c, sk->reverse ? kb : ka, sk->reverse ? ka : kb, &r, 0);
    *less = r == -1;
    return st;
}

/* Sorts seq by key(item) (computed once per item), stably; returns the items. */
static enum tern_status sort_by_keys(struct ctx *c, struct val *items, struct val *keys, size_t n, bool reverse,
                                     struct tpl_list **out) {
    enum tern_status st;
    struct val *pairs = tern_arena_alloc(&c->ar, (n ? n : 1) * sizeof *pairs);
    if (!pairs) return tpl_oom(c);
    for (size_t i = 0; i < n; i++) {
        struct tpl_list *p = tpl_list_new(c, 2);
        if (!p) return tpl_oom(c);
        p->items[0] = keys[i];
        p->items[1] = items[i];
        pairs[i] = v_list(p, true);
    }
    struct sort_key sk = {reverse};
    if ((st = tpl_sort(c, pairs, n, pair_less, &sk))) return st;
    struct tpl_list *l = tpl_list_new(c, n);
    if (!l) return tpl_oom(c);
    for (size_t i = 0; i < n; i++) l->items[i] = pairs[i].u.l->items[1];
    *out = l;
    return TERN_OK;
}

/* Key of an item for sort/unique/min/max: attribute path (comma-separated for sort)
 * and case folding. */
static enum tern_status item_key(struct ctx *c, struct val item, const struct val *attr, bool case_sensitive,
                                 struct val *out) {
    enum tern_status st;
    struct val k = item;
    if (attr && attr->kind != V_NONE) {
        if (attr->kind == V_STR && memchr(attr->u.s.p, ',', attr->u.s.n)) {
            /* "a,b": a tuple of keys */
            size_t parts = 1;
            for (size_t i = 0; i < attr->u.s.n; i++) parts += attr->u.s.p[i] == ',';
            struct tpl_list *l = tpl_list_new(c, parts);
            if (!l) return tpl_oom(c);
            size_t i = 0, k2 = 0;
            while (k2 < parts) {
                size_t j = i;
                while (j < attr->u.s.n && attr->u.s.p[j] != ',') j++;
                struct val part = v_str(attr->u.s.p + i, j - i), x;
                if ((st = get_path(c, item, part, &x)) || (st = lower_if_str(c, x, case_sensitive, &x))) return st;
                l->items[k2++] = x;
                i = j + 1;
            }
            *out = v_list(l, true);
            return TERN_OK;
        }
        if ((st = get_path(c, item, *attr, &k))) return st;
    }
    return lower_if_str(c, k, case_sensitive, out);
}

/* ---- tests ------------------------------------------------------------------------ */

static enum tern_status one_arg(const char *name, const struct argv *a, struct val *out) {
    if (a->n_pos + a->n_kw != 1) return tern_errorf(TERN_ERR_TEMPLATE, "test '%s' takes exactly one argument", name);
    *out = a->n_pos ? a->pos[0] : a->kw[0];
    return TERN_OK;
}

enum tern_status tpl_apply_test(struct ctx *c, int id, const char *name, struct val v, const struct argv *a, bool *out) {
    enum tern_status st;
    struct val x;
    bool takes_arg = id == TS_DIVISIBLEBY || id == TS_SAMEAS || id == TS_IN || id == TS_EQ || id == TS_EQUALTO ||
                     id == TS_EQ_OP || id == TS_NE || id == TS_NE_OP || id == TS_LT || id == TS_LT_OP ||
                     id == TS_LESSTHAN || id == TS_LE || id == TS_LE_OP || id == TS_GT || id == TS_GT_OP ||
                     id == TS_GREATERTHAN || id == TS_GE || id == TS_GE_OP;
    if (id >= 0 && !takes_arg && (a->n_pos || a->n_kw))
        return tern_errorf(TERN_ERR_TEMPLATE, "test '%s' takes no arguments (%u given)", name, a->n_pos + a->n_kw);
    switch (id) {
    case TS_DEFINED: *out = v.kind != V_UNDEF; return TERN_OK;
    case TS_UNDEFINED: *out = v.kind == V_UNDEF; return TERN_OK;
    case TS_NONE: *out = v.kind == V_NONE; return TERN_OK;
    case TS_BOOLEAN: *out = v.kind == V_BOOL; return TERN_OK;
    case TS_FALSE: *out = v.kind == V_BOOL && !v.u.b; return TERN_OK;
    case TS_TRUE: *out = v.kind == V_BOOL && v.u.b; return TERN_OK;
    case TS_INTEGER: *out = v.kind == V_INT; return TERN_OK;
    case TS_FLOAT: *out = v.kind == V_FLOAT; return TERN_OK;
    case TS_NUMBER: *out = v_is_num(v); return TERN_OK;
    case TS_STRING: *out = v.kind == V_STR; return TERN_OK;
    case TS_MAPPING: *out = v.kind == V_DICT; return TERN_OK;
    case TS_ITERABLE:
        *out = v.kind == V_STR || v.kind == V_LIST || v.kind == V_DICT || v.kind == V_UNDEF || v.kind == V_LOOP ||
               v.kind == V_GEN;
        return TERN_OK;
    case TS_SEQUENCE:
        *out = v.kind == V_STR || (v.kind == V_LIST && !(v.flags & VF_VIEW)) || v.kind == V_DICT || v.kind == V_UNDEF;
        return TERN_OK;
    case TS_CALLABLE: *out = v.kind == V_FUNC || v.kind == V_LOOP || v.kind == V_UNDEF; return TERN_OK;
    case TS_ESCAPED: *out = v.kind == V_STR && (v.flags & VF_SAFE); return TERN_OK;
    case TS_LOWER:
    case TS_UPPER: {
        struct val s, r;
        if ((st = soft_str(c, v, &s))) return st;
        int m = tpl_method_id(id == TS_LOWER ? "islower" : "isupper", 7);
        struct argv none = {0};
        if ((st = tpl_call_method(c, s, m, id == TS_LOWER ? "islower" : "isupper", &none, &r))) return st;
        *out = r.u.b;
        return TERN_OK;
    }
    case TS_ODD:
    case TS_EVEN:
    case TS_DIVISIBLEBY: {
        struct val d = v_int(2), r;
        if (id == TS_DIVISIBLEBY && (st = one_arg(name, a, &d))) return st;
        if ((st = tpl_binop(c, OP_MOD, v, d, &r))) return st;
        bool z;
        if ((st = tpl_eq(c, r, v_int(id == TS_ODD ? 1 : 0), &z, 0))) return st;
        *out = z;
        return TERN_OK;
    }
    case TS_SAMEAS:
        if ((st = one_arg(name, a, &x))) return st;
        if (v.kind != x.kind) *out = false;
        else if (v.kind == V_NONE || v.kind == V_UNDEF) *out = true;
        else if (v.kind == V_BOOL) *out = v.u.b == x.u.b;
        else if (v.kind == V_INT) *out = v.u.i == x.u.i && v.u.i >= -5 && v.u.i <= 256;
        else if (v.kind == V_STR) *out = v.u.s.n == x.u.s.n && !memcmp(v.u.s.p, x.u.s.p, v.u.s.n); /* interned */
        else *out = v.rep == x.rep && v.u.l == x.u.l;
        return TERN_OK;
    case TS_IN:
        if ((st = one_arg(name, a, &x))) return st;
        return tpl_contains(c, x, v, out);
    case TS_EQ:
    case TS_EQUALTO:
    case TS_EQ_OP:
    case TS_NE:
    case TS_NE_OP:
        if ((st = one_arg(name, a, &x))) return st;
        if ((st = tpl_eq(c, v, x, out, 0))) return st;
        if (id == TS_NE || id == TS_NE_OP) *out = !*out;
        return TERN_OK;
    case TS_LT:
    case TS_LT_OP:
    case TS_LESSTHAN:
        if ((st = one_arg(name, a, &x))) return st;
        return tpl_compare_op(c, OP_LT, v, x, out);
    case TS_LE:
    case TS_LE_OP:
        if ((st = one_arg(name, a, &x))) return st;
        return tpl_compare_op(c, OP_LE, v, x, out);
    case TS_GT:
    case TS_GT_OP:
    case TS_GREATERTHAN:
        if ((st = one_arg(name, a, &x))) return st;
        return tpl_compare_op(c, OP_GT, v, x, out);
    case TS_GE:
    case TS_GE_OP:
        if ((st = one_arg(name, a, &x))) return st;
        return tpl_compare_op(c, OP_GE, v, x, out);
    case TS_FILTER:
    case TS_TEST:
        if (v.kind != V_STR) {
            *out = false;
            return TERN_OK;
        }
        {
            char buf[64];
            size_t n = v.u.s.n < sizeof buf - 1 ? v.u.s.n : sizeof buf - 1;
            memcpy(buf, v.u.s.p, n);
            buf[n] = 0;
            *out = n == v.u.s.n && !memchr(buf, 0, n) &&
                   (id == TS_FILTER ? tpl_filter_id(buf) : tpl_test_id(buf)) >= 0;
        }
        return TERN_OK;
    default: return tern_errorf(TERN_ERR_TEMPLATE, "no test named '%s'", name);
    }
}

/* ---- select / reject / map -------------------------------------------------------- */

/* select, reject, selectattr, rejectattr */
static enum tern_status select_reject(struct ctx *c, struct val seq_in, const struct argv *a, bool keep_if,
                                      bool attr_mode, const char *fname, struct val *out) {
    enum tern_status st;
    if (!v_truthy(seq_in)) {
        *out = empty_list(c);
        return out->kind == V_LIST ? TERN_OK : tpl_oom(c);
    }
    struct val seq;
    if ((st = tpl_iterable(c, seq_in, &seq))) return st;
    uint32_t ai = 0;
    struct val attr = v_none();
    if (attr_mode) {
        if (a->n_pos < 1) return tern_errorf(TERN_ERR_TEMPLATE, "%s() missing the attribute argument", fname);
        attr = a->pos[ai++];
    }
    int test = -1;
    const char *test_name = NULL;
    char name_buf[64];
    if (ai < a->n_pos) {
        struct val tn = a->pos[ai++];
        if (tn.kind != V_STR || tn.u.s.n >= sizeof name_buf || memchr(tn.u.s.p, 0, tn.u.s.n))
            return tern_errorf(TERN_ERR_TEMPLATE, "%s(): the test name must be a string", fname);
        memcpy(name_buf, tn.u.s.p, tn.u.s.n);
        name_buf[tn.u.s.n] = 0;
        test_name = name_buf;
        test = tpl_test_id(name_buf);
        if (test < 0) return tern_errorf(TERN_ERR_TEMPLATE, "no test named '%s'", name_buf);
    }
    struct argv targs = {0};
    targs.pos = a->pos + ai;
    targs.n_pos = a->n_pos - ai;
    targs.kw = a->kw;
    targs.kw_names = a->kw_names;
    targs.kw_lens = a->kw_lens;
    targs.n_kw = a->n_kw;
    size_t n = v_len_list(seq);
    if ((st = tpl_step(c, n))) return st;
    struct tpl_list *l = tpl_list_new(c, n);
    if (!l) return tpl_oom(c);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        struct val item = v_list_at(seq, i), x = item;
        if (attr_mode && (st = get_path(c, item, attr, &x))) return st;
        bool r;
        if (test >= 0) {
            if ((st = tpl_apply_test(c, test, test_name, x, &targs, &r))) return st;
        } else {
            r = v_truthy(x);
        }
        if (r == keep_if) l->items[k++] = item;
    }
    l->n = k;
    *out = v_list(l, false);
    return TERN_OK;
}

static enum tern_status do_map(struct ctx *c, struct val seq_in, const struct argv *a, struct val *out) {
    enum tern_status st;
    struct val seq;
    if (!v_truthy(seq_in)) {
        *out = empty_list(c);
        return out->kind == V_LIST ? TERN_OK : tpl_oom(c);
    }
    if ((st = tpl_iterable(c, seq_in, &seq))) return st;
    size_t n = v_len_list(seq);
    if ((st = tpl_step(c, n))) return st;
    struct tpl_list *l = tpl_list_new(c, n);
    if (!l) return tpl_oom(c);
    if (a->n_pos == 0) {
        /* map(attribute='x', default=...) */
        struct val attr = v_none(), def = v_none();
        bool have_attr = false, have_def = false;
        for (uint32_t i = 0; i < a->n_kw; i++) {
            if (!strcmp(a->kw_names[i], "attribute")) {
                attr = a->kw[i];
                have_attr = true;
            } else if (!strcmp(a->kw_names[i], "default")) {
                def = a->kw[i];
                have_def = true;
            } else {
                return tern_errorf(TERN_ERR_TEMPLATE, "map(): unexpected keyword argument '%s'", a->kw_names[i]);
            }
        }
        if (!have_attr) return tern_errorf(TERN_ERR_TEMPLATE, "map requires a filter argument");
        for (size_t i = 0; i < n; i++) {
            struct val x;
            if ((st = get_path(c, v_list_at(seq, i), attr, &x))) return st;
            if (have_def && x.kind == V_UNDEF) x = def;
            l->items[i] = x;
        }
    } else {
        struct val fname = a->pos[0];
        char buf[64];
        if (fname.kind != V_STR || fname.u.s.n >= sizeof buf || memchr(fname.u.s.p, 0, fname.u.s.n))
            return tern_errorf(TERN_ERR_TEMPLATE, "map(): the filter name must be a string");
        memcpy(buf, fname.u.s.p, fname.u.s.n);
        buf[fname.u.s.n] = 0;
        int id = tpl_filter_id(buf);
        if (id < 0) return tern_errorf(TERN_ERR_TEMPLATE, "no filter named '%s'", buf);
        struct argv fa = *a;
        fa.pos = a->pos + 1;
        fa.n_pos = a->n_pos - 1;
        for (size_t i = 0; i < n; i++)
            if ((st = tpl_apply_filter(c, id, buf, v_list_at(seq, i), &fa, &l->items[i]))) return st;
    }
    *out = v_list(l, false);
    return TERN_OK;
}

/* ---- tojson ----------------------------------------------------------------------- */

static enum tern_status do_tojson(struct ctx *c, struct val v, const struct argv *a, struct val *out) {
    static const char *const nm[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    struct val p[4];
    bool set[4];
    enum tern_status st;
    if ((st = tpl_bind_args("tojson", a, nm, 4, p, set))) return st;
    struct json_opts o = {0};
    o.ensure_ascii = set[0] && v_truthy(p[0]);
    o.sort_keys = set[3] && v_truthy(p[3]);
    char spaces[64];
    if (set[1] && p[1].kind != V_NONE) {
        o.indent_set = true;
        if (p[1].kind == V_STR) {
            o.indent = p[1].u.s.p;
            o.indent_len = p[1].u.s.n;
        } else if (p[1].kind == V_INT || p[1].kind == V_BOOL) {
            int64_t k = p[1].kind == V_BOOL ? p[1].u.b : p[1].u.i;
            if (k < 0) k = 0;
            if (k > (int64_t)sizeof spaces) return tern_errorf(TERN_ERR_TEMPLATE, "tojson: indent %lld is too large", (long long)k);
            memset(spaces, ' ', sizeof spaces);
            o.indent = spaces;
            o.indent_len = (size_t)k;
        } else {
            return tern_errorf(TERN_ERR_TEMPLATE, "tojson: indent must be an int or a string, not %s", v_type_name(p[1]));
        }
    }
    o.item_sep = o.indent_set ? "," : ", ";
    o.item_sep_len = o.indent_set ? 1 : 2;
    o.key_sep = ": ";
    o.key_sep_len = 2;
    if (set[2] && p[2].kind != V_NONE) {
        struct val s = p[2];
        if (s.kind != V_LIST || v_len_list(s) != 2 || v_list_at(s, 0).kind != V_STR || v_list_at(s, 1).kind != V_STR)
            return tern_errorf(TERN_ERR_TEMPLATE, "tojson: separators must be a pair of strings");
        struct val x = v_list_at(s, 0), y = v_list_at(s, 1);
        o.item_sep = x.u.s.p;
        o.item_sep_len = x.u.s.n;
        o.key_sep = y.u.s.p;
        o.key_sep_len = y.u.s.n;
    }
    struct tern_buf b = TERN_BUF_INIT;
    b.limit = c->max_output;
    st = tpl_fmt_json(c, &b, v, &o, 0, 0);
    if (!st) st = tpl_new_str(c, b.data ? b.data : "", b.len, out);
    tern_buf_free(&b);
    return st;
}

/* ---- numbers ---------------------------------------------------------------------- */

/* Python int(str, base) for base 10 (underscores and surrounding whitespace allowed). */
static bool parse_int(const char *s, size_t n, int base, int64_t *out) {
    size_t i = 0;
    while (i < n && (s[i] == ' ' || (s[i] >= 9 && s[i] <= 13))) i++;
    while (n > i && (s[n - 1] == ' ' || (s[n - 1] >= 9 && s[n - 1] <= 13))) n--;
    bool neg = false;
    if (i < n && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (base == 16 && i + 1 < n && s[i] == '0' && (s[i + 1] | 32) == 'x') i += 2;
    else if (base == 8 && i + 1 < n && s[i] == '0' && (s[i + 1] | 32) == 'o') i += 2;
    else if (base == 2 && i + 1 < n && s[i] == '0' && (s[i + 1] | 32) == 'b') i += 2;
    if (i >= n) return false;
    uint64_t v = 0;
    bool prev_digit = false;
    for (; i < n; i++) {
        char ch = s[i];
        if (ch == '_' && prev_digit && i + 1 < n && s[i + 1] != '_') {
            prev_digit = false;
            continue;
        }
        int d = ch >= '0' && ch <= '9' ? ch - '0' : (ch | 32) >= 'a' && (ch | 32) <= 'z' ? (ch | 32) - 'a' + 10 : 99;
        if (d >= base) return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
        if (v > (uint64_t)INT64_MAX + (neg ? 1 : 0)) return false;
        prev_digit = true;
    }
    if (!prev_digit) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static bool parse_float(const char *s, size_t n, double *out) {
    char buf[128];
    size_t i = 0;
    while (i < n && (s[i] == ' ' || (s[i] >= 9 && s[i] <= 13))) i++;
    while (n > i && (s[n - 1] == ' ' || (s[n - 1] >= 9 && s[n - 1] <= 13))) n--;
    if (n - i == 0 || n - i >= sizeof buf) return false;
    size_t k = 0;
    for (; i < n; i++) {
        if (s[i] == '_') continue;
        buf[k++] = s[i];
    }
    buf[k] = 0;
    /* Python accepts inf/nan spellings and decimal forms; refuse hex floats */
    for (size_t j = 0; j < k; j++)
        if ((buf[j] | 32) == 'x') return false;
    char *end;
    double d = strtod(buf, &end);
    if (end != buf + k) return false;
    *out = d;
    return true;
}

static enum tern_status do_round(struct ctx *c, struct val v, const struct argv *a, struct val *out) {
    static const char *const nm[] = {"precision", "method"};
    struct val p[2];
    bool set[2];
    enum tern_status st;
    if ((st = tpl_bind_args("round", a, nm, 2, p, set))) return st;
    int64_t prec = 0;
    if (set[0]) {
        if (p[0].kind != V_INT && p[0].kind != V_BOOL)
            return tern_errorf(TERN_ERR_TEMPLATE, "round: precision must be an integer");
        prec = p[0].kind == V_BOOL ? p[0].u.b : p[0].u.i;
    }
    const char *method = "common";
    size_t mn = 6;
    if (set[1]) {
        if (p[1].kind != V_STR) return tern_errorf(TERN_ERR_TEMPLATE, "round: method must be a string");
        method = p[1].u.s.p;
        mn = p[1].u.s.n;
    }
    bool common = mn == 6 && !memcmp(method, "common", 6);
    bool ceil_ = mn == 4 && !memcmp(method, "ceil", 4);
    bool floor_ = mn == 5 && !memcmp(method, "floor", 5);
    if (!common && !ceil_ && !floor_)
        return tern_errorf(TERN_ERR_TEMPLATE, "method must be common, ceil or floor");
    if (v.kind == V_UNDEF) return tpl_undef_error(v);
    if (!v_is_num(v)) return tern_errorf(TERN_ERR_TEMPLATE, "type %s doesn't define __round__ method", v_type_name(v));
    if (prec > 300) prec = 300;
    if (prec < -300) prec = -300;
    if (common && v.kind != V_FLOAT) {
        /* round(int, n) stays an int */
        int64_t x = v.kind == V_BOOL ? v.u.b : v.u.i;
        if (prec < 0) {
            int64_t m = 1;
            for (int64_t i = 0; i < -prec && m < INT64_MAX / 10; i++) m *= 10;
            int64_t q = x / m, r = x % m;
            if (r < 0) {
                r += m;
                q -= 1;
            }
            if (2 * r > m || (2 * r == m && (q & 1))) q += 1;
            x = q * m;
        }
        *out = v_int(x);
        return TERN_OK;
    }
    double x = v.kind == V_FLOAT ? v.u.f : v.kind == V_BOOL ? v.u.b : (double)v.u.i;
    if (common) {
        if (!isfinite(x)) {
            *out = v_float(x);
            return TERN_OK;
        }
        if (prec >= 0) {
            /* correctly rounded decimal, ties to even: what Python's round() does */
            char buf[512];
            snprintf(buf, sizeof buf, "%.*f", (int)(prec > 300 ? 300 : prec), x);
            *out = v_float(strtod(buf, NULL));
        } else {
            double m = pow(10.0, (double)-prec);
            *out = v_float(nearbyint(x / m) * m);
        }
        return TERN_OK;
    }
    double m = pow(10.0, (double)prec);
    *out = v_float((ceil_ ? ceil(x * m) : floor(x * m)) / m);
    return TERN_OK;
}

/* ---- the filters ------------------------------------------------------------------ */

static enum tern_status no_args(const char *name, const struct argv *a) {
    if (a->n_pos || a->n_kw) return tern_errorf(TERN_ERR_TEMPLATE, "filter '%s' takes no arguments", name);
    return TERN_OK;
}

/* ---- the filters, one function each ------------------------------------------------- */

static enum tern_status f_default(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                  struct val *out) {
    (void)c, (void)id;
    enum tern_status st;
    struct val p[5];
    bool set[5];
    static const char *const nm[] = {"default_value", "boolean"};
    if ((st = tpl_bind_args(name, a, nm, 2, p, set))) return st;
    bool boolean = set[1] && v_truthy(p[1]);
    if (v.kind == V_UNDEF || (boolean && !v_truthy(v))) *out = set[0] ? p[0] : v_str("", 0);
    else *out = v;
    return TERN_OK;
}

static enum tern_status f_length(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                 struct val *out) {
    (void)c, (void)id;
    enum tern_status st;
    int64_t n = 0;
    if ((st = no_args(name, a)) || (st = py_len(v, &n))) return st;
    *out = v_int(n);
    return TERN_OK;
}

static enum tern_status f_trim(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                               struct val *out) {
    (void)id;
    enum tern_status st;
    struct val p[5];
    bool set[5];
    static const char *const nm[] = {"chars"};
    if ((st = tpl_bind_args(name, a, nm, 1, p, set))) return st;
    struct val s;
    if ((st = soft_str(c, v, &s))) return st;
    return tpl_strip(c, s, set[0] ? &p[0] : NULL, 3, out);
}

static enum tern_status f_upper(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                struct val *out) {
    enum tern_status st;
    struct val s;
    if ((st = no_args(name, a)) || (st = soft_str(c, v, &s))) return st;
    return tpl_case(c, s, id == FL_UPPER ? CM_UPPER : id == FL_LOWER ? CM_LOWER : CM_CAPITALIZE, out);
}

static enum tern_status f_title(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                struct val *out) {
    (void)id;
    enum tern_status st;
    /* jinja2: split before runs of [-\s({[<], capitalise the first character of
     * each piece and lowercase the rest */
    struct val s;
    if ((st = no_args(name, a)) || (st = soft_str(c, v, &s))) return st;
    struct tern_buf b = TERN_BUF_INIT;
    b.limit = c->max_output;
    const char *q = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    bool word_start = true;
    st = TERN_OK;
    while (i < n && !st) {
        size_t len;
        uint32_t cp = utf8_decode(q + i, n - i, &len);
        bool sep = uc_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
        struct val piece = v_str(q + i, len), r;
        if (sep) {
            st = tern_buf_append(&b, q + i, len);
            word_start = true;
        } else {
            st = tpl_case(c, piece, word_start ? CM_UPPER : CM_LOWER, &r);
            if (!st) st = tern_buf_append(&b, r.u.s.p, r.u.s.n);
            word_start = false;
        }
        i += len;
    }
    if (!st) st = tpl_new_str(c, b.data ? b.data : "", b.len, out);
    tern_buf_free(&b);
    return st;
}

static enum tern_status f_string(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                 struct val *out) {
    (void)id;
    enum tern_status st;
    if ((st = no_args(name, a))) return st;
    return soft_str(c, v, out);
}

static enum tern_status f_safe(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                               struct val *out) {
    (void)id;
    enum tern_status st;
    if ((st = no_args(name, a)) || (st = soft_str(c, v, out))) return st;
    out->flags |= VF_SAFE;
    return TERN_OK;
}

static enum tern_status f_e(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                            struct val *out) {
    enum tern_status st;
    if ((st = no_args(name, a))) return st;
    if (v.kind == V_STR && (v.flags & VF_SAFE) && id != FL_FORCEESCAPE) {
        *out = v;
        return TERN_OK;
    }
    struct val s;
    if ((st = soft_str(c, v, &s))) return st;
    return tpl_html_escape(c, s, out);
}

static enum tern_status f_tojson(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                 struct val *out) {
    (void)id, (void)name;
    return do_tojson(c, v, a, out);
}

static enum tern_status f_items(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                struct val *out) {
    (void)id;
    enum tern_status st;
    if ((st = no_args(name, a))) return st;
    if (v.kind == V_UNDEF) {
        *out = empty_list(c);
        return out->kind == V_LIST ? TERN_OK : tpl_oom(c);
    }
    if (v.kind != V_DICT) return tern_errorf(TERN_ERR_TEMPLATE, "Can only get item pairs from a mapping.");
    return tpl_dict_items(c, v, 0, out);
}

static enum tern_status f_list(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                               struct val *out) {
    (void)id;
    enum tern_status st;
    if ((st = no_args(name, a))) return st;
    struct val seq;
    if ((st = tpl_iterable(c, v, &seq))) return st;
    size_t n = v_len_list(seq);
    struct tpl_list *l = tpl_list_new(c, n);
    if (!l) return tpl_oom(c);
    for (size_t i = 0; i < n; i++) l->items[i] = v_list_at(seq, i);
    *out = v_list(l, false);
    return TERN_OK;
}

static enum tern_status f_join(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                               struct val *out) {
    (void)id;
    enum tern_status st;
    struct val p[5];
    bool set[5];
    static const char *const nm[] = {"d", "attribute"};
    if ((st = tpl_bind_args(name, a, nm, 2, p, set))) return st;
    struct val sep = v_str("", 0), seq;
    if (set[0] && (st = soft_str(c, p[0], &sep))) return st;
    if ((st = tpl_iterable(c, v, &seq))) return st;
    size_t n = v_len_list(seq);
    if ((st = tpl_step(c, n))) return st;
    struct tern_buf b = TERN_BUF_INIT;
    b.limit = c->max_output;
    st = TERN_OK;
    for (size_t i = 0; i < n && !st; i++) {
        struct val x = v_list_at(seq, i);
        if (set[1] && p[1].kind != V_NONE && (st = get_path(c, x, p[1], &x))) break;
        if (i) st = tern_buf_append(&b, sep.u.s.p, sep.u.s.n);
        if (!st) st = tpl_fmt_str(c, &b, x, 0);
    }
    if (!st) st = tpl_new_str(c, b.data ? b.data : "", b.len, out);
    tern_buf_free(&b);
    return st;
}

static enum tern_status f_first(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                struct val *out) {
    enum tern_status st;
    if ((st = no_args(name, a))) return st;
    if (v.kind == V_GEN) {
        if (id == FL_LAST) return tern_errorf(TERN_ERR_TEMPLATE, "'%s' object is not reversible", v_type_name(v));
        /* next(iter(gen)): takes one item */
        struct tpl_gen *g = v.u.gen;
        size_t pos = g->pos;
        struct val rest;
        if ((st = tpl_iterable(c, v, &rest))) return st;
        g->pos = pos + (v_len_list(rest) ? 1 : 0);
        *out = v_len_list(rest) ? v_list_at(rest, 0) : v_undef_hint("No first item, sequence was empty.");
        return TERN_OK;
    }
    if (v.kind == V_UNDEF) {
        *out = v_undef_hint(id == FL_FIRST ? "No first item, sequence was empty." : "No last item, sequence was empty.");
        return TERN_OK;
    }
    struct val seq;
    if ((st = tpl_iterable(c, v, &seq))) return st;
    size_t n = v_len_list(seq);
    if (n == 0) *out = v_undef_hint(id == FL_FIRST ? "No first item, sequence was empty." : "No last item, sequence was empty.");
    else *out = v_list_at(seq, id == FL_FIRST ? 0 : n - 1);
    return TERN_OK;
}

static enum tern_status f_reverse(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                  struct val *out) {
    (void)id;
    enum tern_status st;
    if ((st = no_args(name, a))) return st;
    if (v.kind == V_STR) return tpl_slice(c, v, v_none(), v_none(), v_int(-1), out);
    struct val seq;
    bool was_gen = v.kind == V_GEN;
    if ((st = tpl_iterable(c, v, &seq))) return st;
    if (seq.flags & VF_VIEW) {
        struct val copy;
        if ((st = tpl_slice(c, v_list(seq.u.l, false), v_none(), v_none(), v_int(-1), &copy))) return st;
        seq = copy;
    } else if ((st = tpl_slice(c, seq, v_none(), v_none(), v_int(-1), &seq))) {
        return st;
    }
    if (was_gen) {
        /* reversed() refuses generators; jinja2 falls back to a reversed list */
        *out = v_list(seq.u.l, false);
        return TERN_OK;
    }
    /* reversed(list): an iterator over the items */
    struct tpl_gen *g = tern_arena_calloc(&c->ar, 1, sizeof *g);
    if (!g) return tpl_oom(c);
    g->type_name = v.kind == V_DICT ? "dict_reversekeyiterator" : v.rep == REP_RANGE ? "range_iterator"
                   : (v.flags & VF_TUPLE) ? "reversed" : "list_reverseiterator";
    g->filter = -1;
    g->items = v_list(seq.u.l, false);
    *out = v_undef();
    out->kind = V_GEN;
    out->u.gen = g;
    return TERN_OK;
}

static enum tern_status f_replace(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                  struct val *out) {
    (void)id;
    enum tern_status st;
    struct val p[5];
    bool set[5];
    static const char *const nm[] = {"old", "new", "count"};
    if ((st = tpl_bind_args(name, a, nm, 3, p, set))) return st;
    if (!set[0] || !set[1]) return tern_errorf(TERN_ERR_TEMPLATE, "replace() needs old and new");
    struct val s, o, w;
    if ((st = soft_str(c, v, &s)) || (st = soft_str(c, p[0], &o)) || (st = soft_str(c, p[1], &w))) return st;
    int64_t count = -1;
    if (set[2] && p[2].kind != V_NONE) {
        if (p[2].kind != V_INT) return tern_errorf(TERN_ERR_TEMPLATE, "replace(): count must be an integer");
        count = p[2].u.i;
    }
    return tpl_replace(c, s, o, w, count, out);
}

static enum tern_status f_int(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                              struct val *out) {
    (void)c, (void)id;
    enum tern_status st;
    struct val p[5];
    bool set[5];
    static const char *const nm[] = {"default", "base"};
    if ((st = tpl_bind_args(name, a, nm, 2, p, set))) return st;
    struct val def = set[0] ? p[0] : v_int(0);
    int64_t base = 10;
    if (set[1]) {
        if (p[1].kind != V_INT) return tern_errorf(TERN_ERR_TEMPLATE, "int(): base must be an integer");
        base = p[1].u.i;
        if (base < 2 || base > 36) return tern_errorf(TERN_ERR_TEMPLATE, "int() base must be >= 2 and <= 36");
    }
    if (v.kind == V_UNDEF) return tpl_undef_error(v);
    int64_t i;
    double f;
    if (v.kind == V_INT || v.kind == V_BOOL) *out = v_int(v.kind == V_BOOL ? v.u.b : v.u.i);
    else if (v.kind == V_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) *out = v_int((int64_t)v.u.f);
    else if (v.kind == V_STR && parse_int(v.u.s.p, v.u.s.n, (int)base, &i)) *out = v_int(i);
    else if (v.kind == V_STR && parse_float(v.u.s.p, v.u.s.n, &f) && isfinite(f) && fabs(f) < 9.2e18)
        *out = v_int((int64_t)f);
    else *out = def;
    return TERN_OK;
}

static enum tern_status f_float(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                struct val *out) {
    (void)c, (void)id;
    enum tern_status st;
    struct val p[5];
    bool set[5];
    static const char *const nm[] = {"default"};
    if ((st = tpl_bind_args(name, a, nm, 1, p, set))) return st;
    if (v.kind == V_UNDEF) return tpl_undef_error(v);
    double f;
    if (v.kind == V_FLOAT) *out = v;
    else if (v.kind == V_INT || v.kind == V_BOOL) *out = v_float(v.kind == V_BOOL ? v.u.b : (double)v.u.i);
    else if (v.kind == V_STR && parse_float(v.u.s.p, v.u.s.n, &f)) *out = v_float(f);
    else *out = set[0] ? p[0] : v_float(0.0);
    return TERN_OK;
}

static enum tern_status f_abs(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                              struct val *out) {
    (void)c, (void)id;
    enum tern_status st;
    if ((st = no_args(name, a))) return st;
    if (v.kind == V_UNDEF) return tpl_undef_error(v);
    if (v.kind == V_FLOAT) *out = v_float(fabs(v.u.f));
    else if (v.kind == V_INT || v.kind == V_BOOL) {
        int64_t x = v.kind == V_BOOL ? v.u.b : v.u.i;
        if (x == INT64_MIN) return tern_errorf(TERN_ERR_TEMPLATE, "integer overflow");
        *out = v_int(x < 0 ? -x : x);
    } else {
        return tern_errorf(TERN_ERR_TEMPLATE, "bad operand type for abs(): '%s'", v_type_name(v));
    }
    return TERN_OK;
}

static enum tern_status f_round(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                struct val *out) {
    (void)id, (void)name;
    return do_round(c, v, a, out);
}

static enum tern_status f_attr(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                               struct val *out) {
    (void)id;
    if (a->n_pos != 1 || a->n_kw) return tern_errorf(TERN_ERR_TEMPLATE, "attr() takes exactly one argument");
    if (a->pos[0].kind != V_STR) return tern_errorf(TERN_ERR_TEMPLATE, "attribute name must be string");
    /* attributes only: unlike x.name, no fallback to the item x['name'] */
    struct val nm = a->pos[0];
    if (v.kind == V_DICT) {
        bool safe;
        int m = tpl_method_id(nm.u.s.p, nm.u.s.n);
        if (!tpl_has_method(v, m, &safe)) {
            *out = v_undef_attr(v, nm.u.s.p, nm.u.s.n);
            return TERN_OK;
        }
    }
    return tpl_getattr(c, v, nm.u.s.p, nm.u.s.n, tpl_method_id(nm.u.s.p, nm.u.s.n), out);
}

static enum tern_status f_map(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                              struct val *out) {
    (void)id, (void)name;
    return do_map(c, v, a, out);
}

/* select, reject, selectattr, rejectattr: one walk, which the id names. */
static enum tern_status f_select(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                 struct val *out) {
    const bool keep = id == FL_SELECT || id == FL_SELECTATTR, attr = id == FL_SELECTATTR || id == FL_REJECTATTR;
    return select_reject(c, v, a, keep, attr, name, out);
}

static enum tern_status f_dictsort(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                   struct val *out) {
    (void)id;
    enum tern_status st;
    struct val p[5];
    bool set[5];
    static const char *const nm[] = {"case_sensitive", "by", "reverse"};
    if ((st = tpl_bind_args(name, a, nm, 3, p, set))) return st;
    if (v.kind == V_UNDEF) return tpl_undef_error(v);
    if (v.kind != V_DICT) return tern_errorf(TERN_ERR_TEMPLATE, "'%s' object has no attribute 'items'", v_type_name(v));
    bool cs = set[0] && v_truthy(p[0]);
    int pos = 0;
    if (set[1]) {
        if (p[1].kind == V_STR && p[1].u.s.n == 5 && !memcmp(p[1].u.s.p, "value", 5)) pos = 1;
        else if (!(p[1].kind == V_STR && p[1].u.s.n == 3 && !memcmp(p[1].u.s.p, "key", 3)))
            return tern_errorf(TERN_ERR_TEMPLATE, "You can only sort by either \"key\" or \"value\"");
    }
    struct val items;
    if ((st = tpl_dict_items(c, v, 0, &items))) return st;
    size_t n = v_len_list(items);
    struct val *keys = tern_arena_alloc(&c->ar, (n ? n : 1) * sizeof *keys);
    if (!keys) return tpl_oom(c);
    for (size_t i = 0; i < n; i++)
        if ((st = lower_if_str(c, items.u.l->items[i].u.l->items[pos], cs, &keys[i]))) return st;
    struct tpl_list *l;
    if ((st = sort_by_keys(c, items.u.l->items, keys, n, set[2] && v_truthy(p[2]), &l))) return st;
    *out = v_list(l, false);
    return TERN_OK;
}

static enum tern_status f_sort(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                               struct val *out) {
    enum tern_status st;
    struct val p[5];
    bool set[5];
    static const char *const sort_nm[] = {"reverse", "case_sensitive", "attribute"};
    static const char *const other_nm[] = {"case_sensitive", "attribute"};
    bool is_sort = id == FL_SORT;
    if ((st = tpl_bind_args(name, a, is_sort ? sort_nm : other_nm, is_sort ? 3 : 2, p, set))) return st;
    bool reverse = is_sort && set[0] && v_truthy(p[0]);
    struct val cs_v = is_sort ? p[1] : p[0];
    bool cs = (is_sort ? set[1] : set[0]) && v_truthy(cs_v);
    const struct val *attr = (is_sort ? set[2] : set[1]) ? (is_sort ? &p[2] : &p[1]) : NULL;
    struct val seq;
    if ((st = tpl_iterable(c, v, &seq))) return st;
    size_t n = v_len_list(seq);
    if ((st = tpl_step(c, n))) return st;
    struct val *items = tern_arena_alloc(&c->ar, (n ? n : 1) * sizeof *items);
    struct val *keys = tern_arena_alloc(&c->ar, (n ? n : 1) * sizeof *keys);
    if (!items || !keys) return tpl_oom(c);
    for (size_t i = 0; i < n; i++) {
        items[i] = v_list_at(seq, i);
        if ((st = item_key(c, items[i], attr, cs, &keys[i]))) return st;
    }
    if (id == FL_SORT) {
        struct tpl_list *l;
        if ((st = sort_by_keys(c, items, keys, n, reverse, &l))) return st;
        *out = v_list(l, false);
        return TERN_OK;
    }
    if (id == FL_UNIQUE) {
        struct tpl_list *l = tpl_list_new(c, n);
        if (!l) return tpl_oom(c);
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            bool seen = false;
            if ((st = tpl_step(c, i / 8 + 1))) return st;
            for (size_t j = 0; j < i && !seen; j++) {
                if ((st = tpl_eq(c, keys[i], keys[j], &seen, 0))) return st;
            }
            if (!seen) l->items[k++] = items[i];
        }
        l->n = k;
        *out = v_list(l, false);
        return TERN_OK;
    }
    if (n == 0) {
        *out = v_undef_hint("No aggregated item, sequence was empty.");
        return TERN_OK;
    }
    size_t best = 0;
    for (size_t i = 1; i < n; i++) {
        int r;
        if ((st = tpl_cmp(c, keys[i], keys[best], &r, 0))) return st;
        if ((id == FL_MIN && r == -1) || (id == FL_MAX && r == 1)) best = i;
    }
    *out = items[best];
    return TERN_OK;
}

static enum tern_status f_sum(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                              struct val *out) {
    (void)id;
    enum tern_status st;
    struct val p[5];
    bool set[5];
    static const char *const nm[] = {"attribute", "start"};
    if ((st = tpl_bind_args(name, a, nm, 2, p, set))) return st;
    struct val seq, acc = set[1] ? p[1] : v_int(0);
    if ((st = tpl_iterable(c, v, &seq))) return st;
    size_t n = v_len_list(seq);
    for (size_t i = 0; i < n; i++) {
        struct val x = v_list_at(seq, i);
        if (set[0] && p[0].kind != V_NONE && (st = get_path(c, x, p[0], &x))) return st;
        if ((st = tpl_binop(c, OP_ADD, acc, x, &acc)) || (st = tpl_step(c, 1))) return st;
    }
    *out = acc;
    return TERN_OK;
}

static enum tern_status f_center(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                 struct val *out) {
    (void)id;
    enum tern_status st;
    struct val p[5];
    bool set[5];
    static const char *const nm[] = {"width"};
    if ((st = tpl_bind_args(name, a, nm, 1, p, set))) return st;
    struct val s;
    if ((st = soft_str(c, v, &s))) return st;
    struct argv ca = {0};
    struct val w = set[0] ? p[0] : v_int(80);
    ca.pos = &w;
    ca.n_pos = 1;
    return tpl_call_method(c, s, tpl_method_id("center", 6), "center", &ca, out);
}

static enum tern_status f_indent(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                 struct val *out) {
    (void)id;
    enum tern_status st;
    struct val p[5];
    bool set[5];
    static const char *const nm[] = {"width", "first", "blank"};
    if ((st = tpl_bind_args(name, a, nm, 3, p, set))) return st;
    struct val ind;
    char spaces[256];
    if (set[0] && p[0].kind == V_STR) {
        ind = p[0];
    } else {
        int64_t w = 4;
        if (set[0]) {
            if (p[0].kind != V_INT) return tern_errorf(TERN_ERR_TEMPLATE, "indent(): width must be an int or a string");
            w = p[0].u.i;
        }
        if (w < 0) w = 0;
        if (w > (int64_t)sizeof spaces) return tern_errorf(TERN_ERR_TEMPLATE, "indent(): width %lld is too large", (long long)w);
        memset(spaces, ' ', (size_t)w);
        ind = v_str(spaces, (size_t)w);
    }
    bool first = set[1] && v_truthy(p[1]), blank = set[2] && v_truthy(p[2]);
    struct val s = v, lines;
    /* jinja2 appends "\n" to the value itself: only strings work */
    if (v.kind == V_UNDEF) return tpl_undef_error(v);
    if (v.kind != V_STR)
        return tern_errorf(TERN_ERR_TEMPLATE, "unsupported operand type(s) for +=: '%s' and 'str'", v_type_name(v));
    /* jinja2 appends a newline before splitting (so a trailing newline survives) */
    struct val nl = v_str("\n", 1), s2;
    if ((st = tpl_concat2(c, s, nl, &s2)) || (st = tpl_splitlines(c, s2, false, &lines))) return st;
    struct tern_buf b = TERN_BUF_INIT;
    b.limit = c->max_output;
    size_t n = v_len_list(lines);
    st = TERN_OK;
    if (first) st = tern_buf_append(&b, ind.u.s.p, ind.u.s.n);
    for (size_t i = 0; i < n && !st; i++) {
        struct val line = v_list_at(lines, i);
        if (i) {
            st = tern_buf_putc(&b, '\n');
            if (!st && (blank || line.u.s.n)) st = tern_buf_append(&b, ind.u.s.p, ind.u.s.n);
        }
        if (!st) st = tern_buf_append(&b, line.u.s.p, line.u.s.n);
    }
    if (!st) st = tpl_new_str(c, b.data ? b.data : "", b.len, out);
    tern_buf_free(&b);
    return st;
}

static enum tern_status f_truncate(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                   struct val *out) {
    (void)id;
    enum tern_status st;
    struct val p[5];
    bool set[5];
    static const char *const nm[] = {"length", "killwords", "end", "leeway"};
    if ((st = tpl_bind_args(name, a, nm, 4, p, set))) return st;
    struct val s = v, end = v_str("...", 3);
    int64_t length = 255, leeway = 5;
    if (set[0] && p[0].kind == V_INT) length = p[0].u.i;
    if (set[2] && (st = soft_str(c, p[2], &end))) return st;
    if (set[3] && p[3].kind == V_INT) leeway = p[3].u.i;
    int64_t end_len = (int64_t)utf8_count(end.u.s.p, end.u.s.n);
    if (length < end_len) return tern_errorf(TERN_ERR_TEMPLATE, "expected length >= %lld, got %lld", (long long)end_len, (long long)length);
    if (leeway < 0) return tern_errorf(TERN_ERR_TEMPLATE, "expected leeway >= 0, got %lld", (long long)leeway);
    int64_t len;
    if ((st = py_len(s, &len))) return st;
    if (len <= length + leeway) {
        *out = s;
        return TERN_OK;
    }
    if (s.kind != V_STR)
        return tern_errorf(TERN_ERR_TEMPLATE, "'%s' object has no attribute 'rsplit'", v_type_name(s));
    struct val head;
    if ((st = tpl_slice(c, s, v_none(), v_int(length - end_len), v_none(), &head))) return st;
    if (!(set[1] && v_truthy(p[1]))) {
        const char *sp = NULL;
        for (size_t i = head.u.s.n; i-- > 0;)
            if (head.u.s.p[i] == ' ') {
                sp = head.u.s.p + i;
                break;
            }
        if (sp) head.u.s.n = (size_t)(sp - head.u.s.p);
    }
    return tpl_concat2(c, head, end, out);
}

static enum tern_status f_wordcount(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                    struct val *out) {
    (void)id;
    enum tern_status st;
    struct val s;
    if ((st = no_args(name, a)) || (st = soft_str(c, v, &s))) return st;
    int64_t words = 0;
    bool in = false;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t len;
        uint32_t cp = utf8_decode(s.u.s.p + i, s.u.s.n - i, &len);
        bool w = cp == '_' || uc_isalpha(cp) || uc_isnumeric(cp);
        if (w && !in) words++;
        in = w;
        i += len;
    }
    *out = v_int(words);
    return TERN_OK;
}

static enum tern_status f_striptags(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                    struct val *out) {
    (void)id;
    enum tern_status st;
    struct val s;
    if ((st = no_args(name, a)) || (st = soft_str(c, v, &s))) return st;
    struct tern_buf b = TERN_BUF_INIT;
    b.limit = c->max_output;
    bool space = false, any = false;
    st = TERN_OK;
    for (size_t i = 0; i < s.u.s.n && !st;) {
        if (s.u.s.p[i] == '<') {
            const char *e = memchr(s.u.s.p + i, '>', s.u.s.n - i);
            if (e) {
                i = (size_t)(e - s.u.s.p) + 1;
                continue;
            }
        }
        size_t len;
        uint32_t cp = utf8_decode(s.u.s.p + i, s.u.s.n - i, &len);
        if (uc_isspace(cp)) {
            space = any;
        } else {
            if (space) st = tern_buf_putc(&b, ' ');
            if (!st) st = tern_buf_append(&b, s.u.s.p + i, len);
            space = false;
            any = true;
        }
        i += len;
    }
    if (!st) st = tpl_new_str(c, b.data ? b.data : "", b.len, out);
    tern_buf_free(&b);
    return st;
}

static enum tern_status f_format(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                 struct val *out) {
    (void)id, (void)name;
    enum tern_status st;
    struct val s;
    if ((st = soft_str(c, v, &s))) return st;
    if (a->n_pos && a->n_kw) return tern_errorf(TERN_ERR_TEMPLATE, "can't handle positional and keyword arguments at the same time");
    if (a->n_kw) {
        struct tpl_dict *d = tpl_dict_new(c, a->n_kw);
        if (!d) return tpl_oom(c);
        for (uint32_t i = 0; i < a->n_kw; i++)
            if ((st = tpl_dict_set(c, d, v_str(a->kw_names[i], a->kw_lens[i]), a->kw[i]))) return st;
        return tpl_str_percent(c, s, dict_val(d), out);
    }
    struct tpl_list *l = tpl_list_new(c, a->n_pos);
    if (!l) return tpl_oom(c);
    for (uint32_t i = 0; i < a->n_pos; i++) l->items[i] = a->pos[i];
    return tpl_str_percent(c, s, v_list(l, true), out);
}

static enum tern_status f_batch(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                struct val *out) {
    enum tern_status st;
    struct val p[5];
    bool set[5];
    static const char *const nm[] = {"n", "fill_with"};
    if ((st = tpl_bind_args(name, a, nm, 2, p, set))) return st;
    if (!set[0] || (p[0].kind != V_INT && p[0].kind != V_BOOL))
        return tern_errorf(TERN_ERR_TEMPLATE, "%s(): the count must be an integer", name);
    int64_t k = p[0].kind == V_BOOL ? p[0].u.b : p[0].u.i;
    if (k <= 0) return tern_errorf(TERN_ERR_TEMPLATE, "%s(): the count must be positive", name);
    struct val seq;
    if ((st = tpl_iterable(c, v, &seq))) return st;
    size_t n = v_len_list(seq);
    if ((st = tpl_step(c, n))) return st;
    bool fill = set[1] && p[1].kind != V_NONE;
    size_t groups, per;
    if (id == FL_BATCH) {
        per = (size_t)k;
        groups = (n + per - 1) / per;
    } else {
        groups = (size_t)k;
        per = n / groups;
    }
    if (groups > n + 1 && id == FL_SLICE && groups > 100000)
        return tern_errorf(TERN_ERR_LIMIT, "slice(): too many slices");
    struct tpl_list *outl = tpl_list_new(c, groups);
    if (!outl) return tpl_oom(c);
    size_t at = 0;
    size_t extra = id == FL_SLICE ? n % groups : 0;
    for (size_t g = 0; g < groups; g++) {
        size_t cnt = id == FL_BATCH ? (n - at < per ? n - at : per) : per + (g < extra ? 1 : 0);
        size_t total = cnt;
        if (fill && ((id == FL_BATCH && cnt < per) || (id == FL_SLICE && extra && g >= extra))) total = id == FL_BATCH ? per : cnt + 1;
        struct tpl_list *gl = tpl_list_new(c, total);
        if (!gl) return tpl_oom(c);
        for (size_t i = 0; i < cnt; i++) gl->items[i] = v_list_at(seq, at + i);
        for (size_t i = cnt; i < total; i++) gl->items[i] = p[1];
        at += cnt;
        outl->items[g] = v_list(gl, false);
    }
    *out = v_list(outl, false);
    return TERN_OK;
}

/* jinja2's filters by id: name and function. */
static const struct filter_def filters[FL_N] = {
    [FL_ABS] = {"abs", f_abs},
    [FL_ATTR] = {"attr", f_attr},
    [FL_BATCH] = {"batch", f_batch},
    [FL_CAPITALIZE] = {"capitalize", f_upper},
    [FL_CENTER] = {"center", f_center},
    [FL_COUNT] = {"count", f_length},
    [FL_D] = {"d", f_default},
    [FL_DEFAULT] = {"default", f_default},
    [FL_DICTSORT] = {"dictsort", f_dictsort},
    [FL_E] = {"e", f_e},
    [FL_ESCAPE] = {"escape", f_e},
    [FL_FIRST] = {"first", f_first},
    [FL_FLOAT] = {"float", f_float},
    [FL_FORCEESCAPE] = {"forceescape", f_e},
    [FL_FORMAT] = {"format", f_format},
    [FL_INDENT] = {"indent", f_indent},
    [FL_INT] = {"int", f_int},
    [FL_ITEMS] = {"items", f_items},
    [FL_JOIN] = {"join", f_join},
    [FL_LAST] = {"last", f_first},
    [FL_LENGTH] = {"length", f_length},
    [FL_LIST] = {"list", f_list},
    [FL_LOWER] = {"lower", f_upper},
    [FL_MAP] = {"map", f_map},
    [FL_MAX] = {"max", f_sort},
    [FL_MIN] = {"min", f_sort},
    [FL_REJECT] = {"reject", f_select},
    [FL_REJECTATTR] = {"rejectattr", f_select},
    [FL_REPLACE] = {"replace", f_replace},
    [FL_REVERSE] = {"reverse", f_reverse},
    [FL_ROUND] = {"round", f_round},
    [FL_SAFE] = {"safe", f_safe},
    [FL_SELECT] = {"select", f_select},
    [FL_SELECTATTR] = {"selectattr", f_select},
    [FL_SLICE] = {"slice", f_batch},
    [FL_SORT] = {"sort", f_sort},
    [FL_STRING] = {"string", f_string},
    [FL_STRIPTAGS] = {"striptags", f_striptags},
    [FL_SUM] = {"sum", f_sum},
    [FL_TITLE] = {"title", f_title},
    [FL_TOJSON] = {"tojson", f_tojson},
    [FL_TRIM] = {"trim", f_trim},
    [FL_TRUNCATE] = {"truncate", f_truncate},
    [FL_UNIQUE] = {"unique", f_sort},
    [FL_UPPER] = {"upper", f_upper},
    [FL_WORDCOUNT] = {"wordcount", f_wordcount},
};

enum tern_status tpl_filter_eager(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                  struct val *out) {
    if (id < 0 || id >= FL_N) return tern_errorf(TERN_ERR_TEMPLATE, "no filter named '%s'", name);
    enum tern_status st;
    if (v.kind == V_STR && (st = tpl_charge(c, v.u.s.n))) return st;
    return filters[id].fn(c, id, name, v, a, out);
}

/* jinja2's map, select, reject, selectattr, rejectattr, unique, items, batch and slice
 * are generators: they compute (and fail) only when iterated. */
static bool is_generator_filter(int id) {
    return id == FL_MAP || id == FL_SELECT || id == FL_REJECT || id == FL_SELECTATTR || id == FL_REJECTATTR ||
           id == FL_UNIQUE || id == FL_ITEMS || id == FL_BATCH || id == FL_SLICE;
}

static const char *generator_name(int id) {
    switch (id) {
    case FL_MAP: return "sync_do_map";
    case FL_UNIQUE: return "do_unique";
    case FL_ITEMS: return "do_items";
    case FL_BATCH: return "do_batch";
    case FL_SLICE: return "sync_do_slice";
    default: return "select_or_reject";
    }
}

enum tern_status tpl_apply_filter(struct ctx *c, int id, const char *name, struct val v, const struct argv *a,
                                  struct val *out) {
    if (!is_generator_filter(id)) return tpl_filter_eager(c, id, name, v, a, out);
    struct tpl_gen *g = tern_arena_calloc(&c->ar, 1, sizeof *g);
    struct argv *copy = tern_arena_calloc(&c->ar, 1, sizeof *copy);
    if (!g || !copy) return tpl_oom(c);
    *copy = *a;
    if (a->n_pos) {
        copy->pos = tern_arena_alloc(&c->ar, a->n_pos * sizeof *copy->pos);
        if (!copy->pos) return tpl_oom(c);
        memcpy(copy->pos, a->pos, a->n_pos * sizeof *copy->pos);
    }
    if (a->n_kw) {
        copy->kw = tern_arena_alloc(&c->ar, a->n_kw * sizeof *copy->kw);
        if (!copy->kw) return tpl_oom(c);
        memcpy(copy->kw, a->kw, a->n_kw * sizeof *copy->kw);
    }
    g->type_name = "generator";
    g->filter = id;
    g->filter_name = generator_name(id);
    g->input = v;
    g->args = copy;
    *out = v_undef();
    out->kind = V_GEN;
    out->u.gen = g;
    return TERN_OK;
}
