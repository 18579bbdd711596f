/* Values with Python semantics: truthiness, ==, ordering, `in`, arithmetic, attribute
 * and item access with jinja2's fallbacks (x.a tries the attribute then the item,
 * x['a'] the item then the attribute), slicing, iteration. Error messages use
 * Python's wording (TypeError, ZeroDivisionError, jinja2's UndefinedError). */
#include "template/tpl.h"

#include "util/mem.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- constructors ----------------------------------------------------------------- */

struct val v_undef_name(const char *name, size_t n) {
    struct val v = v_undef();
    v.flags = UW_NAME;
    v.u.s.p = name;
    v.u.s.n = n;
    return v;
}

struct val v_undef_attr(struct val owner, const char *name, size_t n) {
    struct val v = v_undef();
    v.flags = UW_ATTR;
    v.aux = (uint8_t)v_otype(owner);
    v.u.s.p = name;
    v.u.s.n = n;
    return v;
}

struct val v_undef_item(struct val owner, int64_t idx) {
    struct val v = v_undef();
    v.flags = UW_ITEM;
    v.aux = (uint8_t)v_otype(owner);
    v.u.i = idx;
    return v;
}

struct val v_undef_hint(const char *msg) {
    struct val v = v_undef();
    v.flags = UW_HINT;
    v.u.s.p = msg;
    v.u.s.n = strlen(msg);
    return v;
}

struct val v_from_json(json_t *j) {
    struct val v = {0};
    switch (json_typeof(j)) {
    case JSON_OBJECT:
        v.kind = V_DICT;
        v.rep = REP_JSON;
        v.u.j = j;
        break;
    case JSON_ARRAY:
        v.kind = V_LIST;
        v.rep = REP_JSON;
        v.u.j = j;
        break;
    case JSON_STRING:
        /* the variables' strings are the request's: marked (tpl-taint.c); lookup()
         * clears it for the caller's trusted names */
        v = v_str(json_string_value(j), json_string_length(j));
        v.taint = TAINT_ALL;
        break;
    case JSON_INTEGER: v = v_int((int64_t)json_integer_value(j)); break;
    case JSON_REAL: v = v_float(json_real_value(j)); break;
    case JSON_TRUE: v = v_bool(true); break;
    case JSON_FALSE: v = v_bool(false); break;
    default: v = v_none(); break;
    }
    return v;
}

struct val v_list(struct tpl_list *l, bool tuple) {
    struct val v = {0};
    v.kind = V_LIST;
    v.rep = REP_NATIVE;
    v.flags = tuple ? VF_TUPLE : 0;
    v.u.l = l;
    return v;
}

/* ---- type names ------------------------------------------------------------------- */

int v_otype(struct val v) {
    switch (v.kind) {
    case V_NONE: return OT_NONE;
    case V_BOOL: return OT_BOOL;
    case V_INT: return OT_INT;
    case V_FLOAT: return OT_FLOAT;
    case V_STR: return OT_STR;
    case V_LIST:
        return v.rep == REP_RANGE ? OT_RANGE : (v.flags & VF_VIEW) ? OT_VIEW : (v.flags & VF_TUPLE) ? OT_TUPLE : OT_LIST;
    case V_DICT: return OT_DICT;
    case V_GEN: return OT_GEN;
    case V_NS: return OT_NS;
    case V_FUNC: return OT_FUNC;
    case V_LOOP: return OT_LOOP;
    default: return OT_UNDEF;
    }
}

const char *v_type_name(struct val v) {
    switch (v.kind) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return (v.flags & VF_SAFE) ? "Markup" : "str";
    case V_LIST:
        if (v.flags & VF_VIEW) return v.aux == VIEW_ITEMS ? "dict_items" : v.aux == VIEW_KEYS ? "dict_keys" : "dict_values";
        return v.rep == REP_RANGE ? "range" : (v.flags & VF_TUPLE) ? "tuple" : "list";
    case V_DICT: return "dict";
    case V_GEN: return v.u.gen->type_name;
    case V_NS: return "Namespace";
    case V_FUNC: return v.u.fn->type == F_MACRO ? "Macro" : "function";
    case V_LOOP: return "LoopContext";
    default: return "object";
    }
}

/* jinja2's object_type_repr: "dict object", "None", ... */
static const char *otype_repr(int ot) {
    switch (ot) {
    case OT_NONE: return "None";
    case OT_BOOL: return "bool object";
    case OT_INT: return "int object";
    case OT_FLOAT: return "float object";
    case OT_STR: return "str object";
    case OT_LIST: return "list object";
    case OT_TUPLE: return "tuple object";
    case OT_DICT: return "dict object";
    case OT_RANGE: return "range object";
    case OT_NS: return "jinja2.utils.Namespace object";
    case OT_FUNC: return "jinja2.runtime.Macro object";
    case OT_LOOP: return "jinja2.runtime.LoopContext object";
    case OT_GEN: return "generator object";
    case OT_VIEW: return "dict_items object";
    default: return "jinja2.runtime.Undefined object";
    }
}

enum tern_status tpl_undef_error(struct val u) {
    int n = u.flags == UW_ITEM ? 0 : (int)utf8_clip(u.u.s.p, u.u.s.n, 300);
    switch (u.flags) {
    case UW_NAME: return tern_errorf(TERN_ERR_TEMPLATE, "'%.*s' is undefined", n, u.u.s.p);
    case UW_ATTR:
        return tern_errorf(TERN_ERR_TEMPLATE, "'%s' has no attribute '%.*s'", otype_repr(u.aux), n, u.u.s.p);
    case UW_ITEM:
        return tern_errorf(TERN_ERR_TEMPLATE, "%s has no element %lld", otype_repr(u.aux), (long long)u.u.i);
    case UW_KEY: return tern_errorf(TERN_ERR_TEMPLATE, "%s has no element %.*s", otype_repr(u.aux), n, u.u.s.p);
    default: return tern_errorf(TERN_ERR_TEMPLATE, "%.*s", n, u.u.s.p);
    }
}

/* ---- containers ------------------------------------------------------------------- */

size_t v_len_list(struct val v) {
    switch (v.rep) {
    case REP_JSON: return json_array_size(v.u.j);
    case REP_RANGE: return (size_t)v.u.r->n;
    default: return v.u.l->n;
    }
}

struct val v_list_at(struct val v, size_t i) {
    switch (v.rep) {
    case REP_JSON: return v_from_json(json_array_get(v.u.j, i));
    case REP_RANGE: return v_int(v.u.r->start + (int64_t)i * v.u.r->step);
    default: return v.u.l->items[i];
    }
}

size_t v_dict_len(struct val v) { return v.rep == REP_JSON ? json_object_size(v.u.j) : v.u.d->n; }

/* Equality of dict keys (hashable scalars and tuples of them). */
/* Nested tuples as dict keys are compared and hashed recursively; deeper than this
 * they count as unhashable (Python would run out of recursion). */
#define KEY_DEPTH 100

static bool key_eq_d(struct val a, struct val b, int depth);
static bool key_eq(struct val a, struct val b) { return key_eq_d(a, b, 0); }

static bool num_eq(struct val a, struct val b) {
    if (a.kind == V_FLOAT || b.kind == V_FLOAT) {
        long double x = a.kind == V_FLOAT ? (long double)a.u.f : a.kind == V_BOOL ? a.u.b : (long double)a.u.i;
        long double y = b.kind == V_FLOAT ? (long double)b.u.f : b.kind == V_BOOL ? b.u.b : (long double)b.u.i;
        return x == y;
    }
    int64_t x = a.kind == V_BOOL ? a.u.b : a.u.i;
    int64_t y = b.kind == V_BOOL ? b.u.b : b.u.i;
    return x == y;
}

static bool key_eq_d(struct val a, struct val b, int depth) {
    if (depth > KEY_DEPTH) return false;
    if (v_is_num(a) && v_is_num(b)) return num_eq(a, b);
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case V_NONE:
    case V_UNDEF: return true;
    case V_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case V_LIST: {
        if ((a.flags & VF_TUPLE) != (b.flags & VF_TUPLE) || a.rep == REP_RANGE || b.rep == REP_RANGE) return false;
        size_t n = v_len_list(a);
        if (n != v_len_list(b)) return false;
        for (size_t i = 0; i < n; i++)
            if (!key_eq_d(v_list_at(a, i), v_list_at(b, i), depth + 1)) return false;
        return true;
    }
    default: return a.u.d == b.u.d;
    }
}

bool v_dict_get_str(struct val d, const char *k, size_t n, struct val *out) {
    if (d.rep == REP_JSON) {
        json_t *j = json_object_getn(d.u.j, k, n);
        if (!j) return false;
        *out = v_from_json(j);
        return true;
    }
    const struct tpl_dict *dd = d.u.d;
    for (size_t i = 0; i < dd->n; i++) {
        struct val key = dd->keys[i];
        if (key.kind == V_STR && key.u.s.n == n && memcmp(key.u.s.p, k, n) == 0) {
            *out = dd->vals[i];
            return true;
        }
    }
    return false;
}

bool v_dict_get(struct ctx *c, struct val d, struct val key, struct val *out) {
    (void)c;
    if (key.kind == V_STR) return v_dict_get_str(d, key.u.s.p, key.u.s.n, out);
    if (d.rep == REP_JSON) return false; /* JSON keys are strings */
    const struct tpl_dict *dd = d.u.d;
    for (size_t i = 0; i < dd->n; i++) {
        if (key_eq(dd->keys[i], key)) {
            *out = dd->vals[i];
            return true;
        }
    }
    return false;
}

bool v_dict_next(struct val d, struct dict_iter *it, struct val *key, struct val *value) {
    if (d.rep == REP_JSON) {
        void *jit = it->i == 0 ? json_object_iter(d.u.j) : json_object_iter_next(d.u.j, it->jit);
        it->i = 1;
        it->jit = jit;
        if (!jit) return false;
        if (key) {
            *key = v_str(json_object_iter_key(jit), json_object_iter_key_len(jit));
            key->taint = TAINT_ALL; /* a key of the variables' data (tool-call argument names) */
        }
        if (value) *value = v_from_json(json_object_iter_value(jit));
        return true;
    }
    if (it->i >= d.u.d->n) return false;
    if (key) *key = d.u.d->keys[it->i];
    if (value) *value = d.u.d->vals[it->i];
    it->i++;
    return true;
}

static bool hashable_d(struct val k, int depth) {
    switch (k.kind) {
    case V_LIST:
        if (!(k.flags & VF_TUPLE) || depth > KEY_DEPTH) return false;
        for (size_t i = 0, n = v_len_list(k); i < n; i++)
            if (!hashable_d(v_list_at(k, i), depth + 1)) return false;
        return true;
    case V_DICT: return false;
    default: return true;
    }
}

static bool hashable(struct val k) { return hashable_d(k, 0); }

struct tpl_list *tpl_list_new(struct ctx *c, size_t n) {
    struct tpl_list *l = tern_arena_alloc(&c->ar, sizeof *l);
    if (!l) return NULL;
    l->n = n;
    l->items = NULL;
    if (n) {
        l->items = tern_arena_calloc(&c->ar, n, sizeof *l->items);
        if (!l->items) return NULL;
    }
    return l;
}

struct tpl_dict *tpl_dict_new(struct ctx *c, size_t cap) {
    struct tpl_dict *d = tern_arena_calloc(&c->ar, 1, sizeof *d);
    if (!d) return NULL;
    if (cap) {
        d->keys = tern_arena_calloc(&c->ar, cap, sizeof *d->keys);
        d->vals = tern_arena_calloc(&c->ar, cap, sizeof *d->vals);
        if (!d->keys || !d->vals) return NULL;
        d->cap = cap;
    }
    return d;
}

enum tern_status tpl_dict_set(struct ctx *c, struct tpl_dict *d, struct val k, struct val v) {
    if (!hashable(k)) return tern_errorf(TERN_ERR_TEMPLATE, "unhashable type: '%s'", v_type_name(k));
    for (size_t i = 0; i < d->n; i++) {
        if (key_eq(d->keys[i], k)) {
            d->vals[i] = v;
            return TERN_OK;
        }
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        struct val *nk = tern_arena_grow(&c->ar, d->keys, d->cap * sizeof *nk, cap * sizeof *nk);
        if (!nk) return tpl_oom(c);
        d->keys = nk;
        struct val *nv = tern_arena_grow(&c->ar, d->vals, d->cap * sizeof *nv, cap * sizeof *nv);
        if (!nv) return tpl_oom(c);
        d->vals = nv;
        d->cap = cap;
    }
    d->keys[d->n] = k;
    d->vals[d->n] = v;
    d->n++;
    return TERN_OK;
}

char *tpl_alloc_str(struct ctx *c, size_t n) {
    if (n > c->max_output) {
        c->ar.err = tern_errorf(TERN_ERR_LIMIT, "a string of %zu bytes exceeds max_output (%zu bytes)", n,
                                c->max_output);
        return NULL;
    }
    char *p = tern_arena_alloc(&c->ar, n + 1);
    if (p) p[n] = 0;
    return p;
}

enum tern_status tpl_new_str(struct ctx *c, const char *p, size_t n, struct val *out) {
    enum tern_status st = tpl_charge(c, n);
    if (st) return st;
    char *q = tpl_alloc_str(c, n);
    if (!q) return tpl_oom(c);
    if (n) memcpy(q, p, n);
    *out = v_str(q, n);
    return TERN_OK;
}

/* a + b for strings. When a is the arena's latest allocation (the previous step of a
 * chain like x + y + z), b is appended in place: a chain costs linear time. */
enum tern_status tpl_concat2(struct ctx *c, struct val a, struct val b, struct val *out) {
    size_t n = a.u.s.n + b.u.s.n;
    enum tern_status st = tpl_charge(c, b.u.s.n);
    if (st) return st;
    if (n < a.u.s.n || n > c->max_output)
        return tern_errorf(TERN_ERR_LIMIT, "a string of %zu bytes exceeds max_output (%zu bytes)", n, c->max_output);
    char *p;
    if (tern_arena_is_last(&c->ar, a.u.s.p, a.u.s.n + 1)) {
        /* appending in place costs only the new bytes */
        p = tern_arena_grow(&c->ar, (void *)a.u.s.p, a.u.s.n + 1, n + 1);
        if (!p) return tpl_oom(c);
        if (p != a.u.s.p) memcpy(p, a.u.s.p, a.u.s.n);
    } else {
        if ((st = tpl_charge(c, a.u.s.n))) return st;
        p = tpl_alloc_str(c, n);
        if (!p) return tpl_oom(c);
        memcpy(p, a.u.s.p, a.u.s.n);
    }
    memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
    p[n] = 0;
    *out = v_str(p, n);
    out->flags = a.flags & VF_SAFE;
    return TERN_OK;
}

/* ---- truthiness, equality, ordering ----------------------------------------------- */

bool v_truthy(struct val v) {
    switch (v.kind) {
    case V_UNDEF:
    case V_NONE: return false;
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0.0;
    case V_STR: return v.u.s.n != 0;
    case V_LIST: return v_len_list(v) != 0;
    case V_DICT: return v_dict_len(v) != 0;
    default: return true;
    }
}

enum tern_status tpl_eq(struct ctx *c, struct val a, struct val b, bool *out, uint32_t depth) {
    enum tern_status st;
    if ((st = tpl_depth_check(c, depth))) return st;
    if (v_is_num(a) && v_is_num(b)) {
        *out = num_eq(a, b);
        return TERN_OK;
    }
    *out = false;
    if (a.kind != b.kind) return TERN_OK;
    switch (a.kind) {
    case V_UNDEF:
    case V_NONE: *out = true; return TERN_OK;
    case V_STR:
        if (a.u.s.n == b.u.s.n && (st = tpl_charge(c, a.u.s.n))) return st;
        *out = a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
        return TERN_OK;
    case V_LIST: {
        if ((a.flags & (VF_TUPLE | VF_VIEW)) != (b.flags & (VF_TUPLE | VF_VIEW)) ||
            (a.rep == REP_RANGE) != (b.rep == REP_RANGE) || a.aux != b.aux)
            return TERN_OK;
        size_t n = v_len_list(a);
        if (n != v_len_list(b)) return TERN_OK;
        if ((a.flags & VF_VIEW) && a.aux != VIEW_VALUES) {
            /* keys and items views compare like sets */
            if ((st = tpl_step(c, n * n / 8 + 1))) return st;
            for (size_t i = 0; i < n; i++) {
                bool found = false;
                for (size_t j = 0; j < n && !found; j++)
                    if ((st = tpl_eq(c, v_list_at(a, i), v_list_at(b, j), &found, depth + 1))) return st;
                if (!found) return TERN_OK;
            }
            *out = true;
            return TERN_OK;
        }
        if (a.flags & VF_VIEW) return TERN_OK; /* values views compare by identity */
        if (a.rep == b.rep && a.u.l == b.u.l) {
            *out = true;
            return TERN_OK;
        }
        if ((st = tpl_step(c, n))) return st;
        for (size_t i = 0; i < n; i++) {
            bool e;
            if ((st = tpl_eq(c, v_list_at(a, i), v_list_at(b, i), &e, depth + 1))) return st;
            if (!e) return TERN_OK;
        }
        *out = true;
        return TERN_OK;
    }
    case V_DICT: {
        size_t n = v_dict_len(a);
        if (n != v_dict_len(b)) return TERN_OK;
        if ((st = tpl_step(c, n))) return st;
        struct dict_iter it = {0};
        struct val k, v;
        while (v_dict_next(a, &it, &k, &v)) {
            struct val w;
            if (!v_dict_get(c, b, k, &w)) return TERN_OK;
            bool e;
            if ((st = tpl_eq(c, v, w, &e, depth + 1))) return st;
            if (!e) return TERN_OK;
        }
        *out = true;
        return TERN_OK;
    }
    case V_NS: *out = a.u.d == b.u.d; return TERN_OK;
    case V_FUNC: *out = a.u.fn == b.u.fn; return TERN_OK;
    case V_LOOP: *out = a.u.loop == b.u.loop; return TERN_OK;
    case V_GEN: *out = a.u.gen == b.u.gen; return TERN_OK;
    default: return TERN_OK;
    }
}

#define CMP_UNORDERED 2

static const char *cmp_sym(int op) {
    switch (op) {
    case OP_LT: return "<";
    case OP_LE: return "<=";
    case OP_GT: return ">";
    case OP_GE: return ">=";
    default: return "<";
    }
}

static enum tern_status cmp_op(struct ctx *c, struct val a, struct val b, int op, int *out, uint32_t depth) {
    enum tern_status dst = tpl_depth_check(c, depth);
    if (dst) return dst;
    if (a.kind == V_UNDEF) return tpl_undef_error(a);
    if (b.kind == V_UNDEF) return tpl_undef_error(b);
    if (v_is_num(a) && v_is_num(b)) {
        if (a.kind == V_FLOAT || b.kind == V_FLOAT) {
            long double x = a.kind == V_FLOAT ? (long double)a.u.f : a.kind == V_BOOL ? a.u.b : (long double)a.u.i;
            long double y = b.kind == V_FLOAT ? (long double)b.u.f : b.kind == V_BOOL ? b.u.b : (long double)b.u.i;
            if (isnan(x) || isnan(y)) *out = CMP_UNORDERED;
            else *out = x < y ? -1 : x > y ? 1 : 0;
        } else {
            int64_t x = a.kind == V_BOOL ? a.u.b : a.u.i;
            int64_t y = b.kind == V_BOOL ? b.u.b : b.u.i;
            *out = x < y ? -1 : x > y ? 1 : 0;
        }
        return TERN_OK;
    }
    if (a.kind == V_STR && b.kind == V_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int r = n ? memcmp(a.u.s.p, b.u.s.p, n) : 0;
        if (r == 0) r = a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n ? 1 : 0;
        *out = r < 0 ? -1 : r > 0 ? 1 : 0;
        return TERN_OK;
    }
    if (a.kind == V_LIST && b.kind == V_LIST && (a.flags & VF_TUPLE) == (b.flags & VF_TUPLE) && a.rep != REP_RANGE &&
        b.rep != REP_RANGE && !((a.flags | b.flags) & VF_VIEW)) {
        size_t na = v_len_list(a), nb = v_len_list(b);
        enum tern_status st;
        for (size_t i = 0; i < na && i < nb; i++) {
            struct val x = v_list_at(a, i), y = v_list_at(b, i);
            bool e;
            if ((st = tpl_eq(c, x, y, &e, depth + 1))) return st;
            if (!e) return cmp_op(c, x, y, op, out, depth + 1);
        }
        *out = na < nb ? -1 : na > nb ? 1 : 0;
        return TERN_OK;
    }
    return tern_errorf(TERN_ERR_TEMPLATE, "'%s' not supported between instances of '%s' and '%s'", cmp_sym(op),
                       v_type_name(a), v_type_name(b));
}

enum tern_status tpl_cmp(struct ctx *c, struct val a, struct val b, int *out, uint32_t depth) {
    return cmp_op(c, a, b, OP_LT, out, depth);
}

/* a OP b for the ordering operators, as a bool. */
enum tern_status tpl_compare_op(struct ctx *c, int op, struct val a, struct val b, bool *out) {
    int r;
    enum tern_status st = cmp_op(c, a, b, op, &r, 0);
    if (st) return st;
    if (r == CMP_UNORDERED) {
        *out = false;
        return TERN_OK;
    }
    switch (op) {
    case OP_LT: *out = r < 0; break;
    case OP_LE: *out = r <= 0; break;
    case OP_GT: *out = r > 0; break;
    default: *out = r >= 0; break;
    }
    return TERN_OK;
}

enum tern_status tpl_contains(struct ctx *c, struct val container, struct val item, bool *out) {
    enum tern_status st;
    *out = false;
    switch (container.kind) {
    case V_UNDEF: return TERN_OK;
    case V_STR:
        if ((st = tpl_charge(c, container.u.s.n))) return st;
        if (item.kind != V_STR)
            return tern_errorf(TERN_ERR_TEMPLATE, "'in <string>' requires string as left operand, not %s",
                               v_type_name(item));
        if (item.u.s.n == 0) *out = true;
        else if (item.u.s.n <= container.u.s.n)
            *out = memmem(container.u.s.p, container.u.s.n, item.u.s.p, item.u.s.n) != NULL;
        return TERN_OK;
    case V_LIST: {
        size_t n = v_len_list(container);
        if ((st = tpl_step(c, n))) return st;
        for (size_t i = 0; i < n; i++) {
            bool e;
            if ((st = tpl_eq(c, v_list_at(container, i), item, &e, 0))) return st;
            if (e) {
                *out = true;
                return TERN_OK;
            }
        }
        return TERN_OK;
    }
    case V_GEN: {
        struct val seq;
        if ((st = tpl_iterable(c, container, &seq))) return st;
        return tpl_contains(c, seq, item, out);
    }
    case V_DICT: {
        if (!hashable(item)) return tern_errorf(TERN_ERR_TEMPLATE, "unhashable type: '%s'", v_type_name(item));
        struct val tmp;
        *out = v_dict_get(c, container, item, &tmp);
        return TERN_OK;
    }
    default:
        return tern_errorf(TERN_ERR_TEMPLATE, "argument of type '%s' is not iterable", v_type_name(container));
    }
}

/* ---- arithmetic ------------------------------------------------------------------- */

static const char *op_sym(int op) {
    switch (op) {
    case OP_ADD: return "+";
    case OP_SUB: return "-";
    case OP_MUL: return "*";
    case OP_DIV: return "/";
    case OP_FLOORDIV: return "//";
    case OP_MOD: return "%";
    case OP_POW: return "** or pow()";
    default: return "?";
    }
}

static enum tern_status unsupported(int op, struct val a, struct val b) {
    return tern_errorf(TERN_ERR_TEMPLATE, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op),
                       v_type_name(a), v_type_name(b));
}

static enum tern_status overflow(void) {
    return tern_errorf(TERN_ERR_TEMPLATE, "integer overflow (values beyond 64 bits are not supported)");
}

static double as_f(struct val v) { return v.kind == V_FLOAT ? v.u.f : v.kind == V_BOOL ? (double)v.u.b : (double)v.u.i; }
static int64_t as_i(struct val v) { return v.kind == V_BOOL ? (int64_t)v.u.b : v.u.i; }

static double py_fmod(double x, double y, double *floordiv) {
    double mod = fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0.0) {
        if ((y < 0) != (mod < 0)) {
            mod += y;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, y);
    }
    if (floordiv) {
        if (div != 0.0) {
            double fd = floor(div);
            if (div - fd > 0.5) fd += 1.0;
            *floordiv = fd;
        } else {
            *floordiv = copysign(0.0, x / y);
        }
    }
    return mod;
}

static enum tern_status repeat(struct ctx *c, struct val seq, int64_t times, struct val *out) {
    if (times < 0) times = 0;
    enum tern_status st;
    if (seq.kind == V_STR) {
        size_t total;
        if (tern_mul_overflow(seq.u.s.n, (size_t)times, &total) || total > c->max_output)
            return tern_errorf(TERN_ERR_LIMIT, "repeating a string of %zu bytes %lld times exceeds max_output (%zu bytes)",
                               seq.u.s.n, (long long)times, c->max_output);
        char *p = tpl_alloc_str(c, total);
        if (!p) return tpl_oom(c);
        for (int64_t i = 0; i < times; i++) memcpy(p + (size_t)i * seq.u.s.n, seq.u.s.p, seq.u.s.n);
        *out = v_str(p, total);
        return TERN_OK;
    }
    size_t n = v_len_list(seq), total;
    if (tern_mul_overflow(n, (size_t)times, &total) || total > c->max_output / sizeof(struct val))
        return tern_errorf(TERN_ERR_LIMIT, "repeating a list of %zu items %lld times is too large", n, (long long)times);
    if ((st = tpl_step(c, total))) return st;
    struct tpl_list *l = tpl_list_new(c, total);
    if (!l) return tpl_oom(c);
    for (size_t i = 0; i < total; i++) l->items[i] = v_list_at(seq, i % n);
    *out = v_list(l, seq.flags & VF_TUPLE);
    return TERN_OK;
}

/* Appends s to b with HTML escaping (Markup + str escapes the str). */
static enum tern_status html_escape_to(struct tern_buf *b, const char *s, size_t n) {
    enum tern_status st;
    size_t last = 0;
    for (size_t i = 0; i < n; i++) {
        const char *rep = NULL;
        switch (s[i]) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '"': rep = "&#34;"; break;
        case '\'': rep = "&#39;"; break;
        default: break;
        }
        if (rep) {
            if ((st = tern_buf_append(b, s + last, i - last)) || (st = tern_buf_puts(b, rep))) return st;
            last = i + 1;
        }
    }
    return tern_buf_append(b, s + last, n - last);
}

enum tern_status tpl_html_escape(struct ctx *c, struct val s, struct val *out) {
    tern_buf_clear(&c->scratch);
    enum tern_status st = html_escape_to(&c->scratch, s.u.s.p, s.u.s.n);
    if (st) return st;
    if ((st = tpl_new_str(c, c->scratch.data ? c->scratch.data : "", c->scratch.len, out))) return st;
    out->flags |= VF_SAFE;
    return TERN_OK;
}

enum tern_status tpl_binop(struct ctx *c, int op, struct val a, struct val b, struct val *out) {
    enum tern_status st;
    if (a.kind == V_UNDEF) return tpl_undef_error(a);
    /* str % x is str.__mod__(x), which accepts anything, undefined included */
    if (op == OP_MOD && a.kind == V_STR) return tpl_str_percent(c, a, b, out);
    if (b.kind == V_UNDEF) return tpl_undef_error(b);
    bool nums = v_is_num(a) && v_is_num(b);
    bool fl = nums && (a.kind == V_FLOAT || b.kind == V_FLOAT);
    switch (op) {
    case OP_ADD:
        if (nums) {
            if (fl) {
                *out = v_float(as_f(a) + as_f(b));
            } else {
                int64_t r;
                if (__builtin_add_overflow(as_i(a), as_i(b), &r)) return overflow();
                *out = v_int(r);
            }
            return TERN_OK;
        }
        if (a.kind == V_STR && b.kind == V_STR) {
            if ((a.flags & VF_SAFE) && !(b.flags & VF_SAFE)) {
                struct val e;
                if ((st = tpl_html_escape(c, b, &e))) return st;
                b = e;
            }
            return tpl_concat2(c, a, b, out);
        }
        if (a.kind == V_LIST && b.kind == V_LIST && a.rep != REP_RANGE && b.rep != REP_RANGE &&
            (a.flags & VF_TUPLE) == (b.flags & VF_TUPLE) && !((a.flags | b.flags) & VF_VIEW)) {
            size_t na = v_len_list(a), nb = v_len_list(b);
            if ((st = tpl_step(c, na + nb))) return st;
            struct tpl_list *l = tpl_list_new(c, na + nb);
            if (!l) return tpl_oom(c);
            for (size_t i = 0; i < na; i++) l->items[i] = v_list_at(a, i);
            for (size_t i = 0; i < nb; i++) l->items[na + i] = v_list_at(b, i);
            *out = v_list(l, a.flags & VF_TUPLE);
            return TERN_OK;
        }
        if (a.kind == V_STR)
            return tern_errorf(TERN_ERR_TEMPLATE, "can only concatenate str (not \"%s\") to str", v_type_name(b));
        if (a.kind == V_LIST && a.rep != REP_RANGE && !(a.flags & VF_VIEW))
            return tern_errorf(TERN_ERR_TEMPLATE, "can only concatenate %s (not \"%s\") to %s", v_type_name(a),
                               v_type_name(b), v_type_name(a));
        return unsupported(op, a, b);
    case OP_SUB:
        if (!nums) return unsupported(op, a, b);
        if (fl) {
            *out = v_float(as_f(a) - as_f(b));
        } else {
            int64_t r;
            if (__builtin_sub_overflow(as_i(a), as_i(b), &r)) return overflow();
            *out = v_int(r);
        }
        return TERN_OK;
    case OP_MUL:
        if (nums) {
            if (fl) {
                *out = v_float(as_f(a) * as_f(b));
            } else {
                int64_t r;
                if (__builtin_mul_overflow(as_i(a), as_i(b), &r)) return overflow();
                *out = v_int(r);
            }
            return TERN_OK;
        }
        if ((a.kind == V_STR || (a.kind == V_LIST && a.rep != REP_RANGE && !(a.flags & VF_VIEW))) &&
            (b.kind == V_INT || b.kind == V_BOOL))
            return repeat(c, a, as_i(b), out);
        if ((b.kind == V_STR || (b.kind == V_LIST && b.rep != REP_RANGE && !(b.flags & VF_VIEW))) &&
            (a.kind == V_INT || a.kind == V_BOOL))
            return repeat(c, b, as_i(a), out);
        if (a.kind == V_STR || a.kind == V_LIST || b.kind == V_STR || b.kind == V_LIST)
            return tern_errorf(TERN_ERR_TEMPLATE, "can't multiply sequence by non-int of type '%s'",
                               v_type_name(a.kind == V_STR || a.kind == V_LIST ? b : a));
        return unsupported(op, a, b);
    case OP_DIV:
        if (!nums) return unsupported(op, a, b);
        if (as_f(b) == 0.0) return tern_errorf(TERN_ERR_TEMPLATE, "division by zero");
        if (!fl) {
            /* int / int is exact when both fit a double mantissa */
            *out = v_float((double)((long double)as_i(a) / (long double)as_i(b)));
        } else {
            *out = v_float(as_f(a) / as_f(b));
        }
        return TERN_OK;
    case OP_FLOORDIV:
    case OP_MOD:
        if (op == OP_MOD && a.kind == V_STR) return tpl_str_percent(c, a, b, out);
        if (!nums) return unsupported(op, a, b);
        if (fl) {
            double y = as_f(b);
            if (y == 0.0)
                return tern_errorf(TERN_ERR_TEMPLATE, op == OP_MOD ? "float modulo" : "float floor division by zero");
            double fd, m = py_fmod(as_f(a), y, &fd);
            *out = v_float(op == OP_MOD ? m : fd);
        } else {
            int64_t x = as_i(a), y = as_i(b);
            if (y == 0) return tern_errorf(TERN_ERR_TEMPLATE, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) {
                if (op == OP_FLOORDIV) return overflow();
                *out = v_int(0);
                return TERN_OK;
            }
            int64_t q = x / y, r = x % y;
            if (r != 0 && ((r < 0) != (y < 0))) {
                q -= 1;
                r += y;
            }
            *out = v_int(op == OP_MOD ? r : q);
        }
        return TERN_OK;
    case OP_POW:
        if (!nums) return unsupported(op, a, b);
        if (!fl && as_i(b) >= 0) {
            int64_t base = as_i(a), e = as_i(b), r = 1;
            while (e > 0) {
                if (e & 1) {
                    if (__builtin_mul_overflow(r, base, &r)) return overflow();
                }
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base)) return overflow();
            }
            *out = v_int(r);
            return TERN_OK;
        }
        {
            double x = as_f(a), y = as_f(b);
            if (x == 0.0 && y < 0) return tern_errorf(TERN_ERR_TEMPLATE, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y))
                return tern_errorf(TERN_ERR_TEMPLATE, "a negative number raised to a fractional power is complex (not supported)");
            *out = v_float(pow(x, y));
        }
        return TERN_OK;
    default: return tern_errorf(TERN_ERR_INTERNAL, "bad binary operator %d", op);
    }
}

enum tern_status tpl_unop(struct ctx *c, int op, struct val a, struct val *out) {
    (void)c;
    if (a.kind == V_UNDEF) return tpl_undef_error(a);
    if (!v_is_num(a))
        return tern_errorf(TERN_ERR_TEMPLATE, "bad operand type for unary %s: '%s'", op == OP_NEG ? "-" : "+",
                           v_type_name(a));
    if (a.kind == V_FLOAT) {
        *out = v_float(op == OP_NEG ? -a.u.f : a.u.f);
    } else {
        int64_t x = as_i(a);
        if (op == OP_NEG) {
            if (x == INT64_MIN) return overflow();
            x = -x;
        }
        *out = v_int(x);
    }
    return TERN_OK;
}

/* ---- attribute and item access ---------------------------------------------------- */

/* Python index semantics on a sequence of n items: false when out of range. */
static bool norm_index(int64_t i, size_t n, size_t *out) {
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

/* Byte offset of code point index i in s (i <= count). */
static size_t cp_offset(const char *s, size_t n, size_t i) {
    size_t k = 0, b = 0;
    while (b < n && k < i) {
        b += utf8_seqlen((unsigned char)s[b]);
        k++;
    }
    return b < n ? b : n;
}

/* Item by position: list, tuple, range, string (a character). */
static bool seq_item(struct ctx *c, struct val obj, int64_t idx, struct val *out, enum tern_status *st) {
    *st = TERN_OK;
    if (obj.kind == V_LIST) {
        size_t i;
        if (!norm_index(idx, v_len_list(obj), &i)) return false;
        *out = v_list_at(obj, i);
        return true;
    }
    if (obj.kind == V_STR) {
        if ((*st = tpl_charge(c, obj.u.s.n))) return false;
        size_t n = utf8_count(obj.u.s.p, obj.u.s.n), i;
        if (!norm_index(idx, n, &i)) return false;
        size_t b = cp_offset(obj.u.s.p, obj.u.s.n, i);
        size_t len = utf8_seqlen((unsigned char)obj.u.s.p[b]);
        *out = v_str(obj.u.s.p + b, len);
        out->flags = obj.flags & VF_SAFE;
        return true;
    }
    return false;
}

enum tern_status tpl_getattr(struct ctx *c, struct val obj, const char *name, size_t n, int method, struct val *out) {
    enum tern_status st;
    if (obj.kind == V_UNDEF) return tpl_undef_error(obj);
    if (n >= 4 && name[0] == '_' && name[1] == '_' && name[n - 1] == '_' && name[n - 2] == '_') {
        /* dunder attributes exist on every object but the sandbox refuses them */
        *out = v_undef_attr(obj, name, n);
        return TERN_OK;
    }
    if (obj.kind == V_LOOP) return tpl_loop_attr(c, obj, name, n, out);
    if (obj.kind == V_NS) {
        if (!v_dict_get_str((struct val){.kind = V_DICT, .u.d = obj.u.d}, name, n, out))
            *out = v_undef_attr(obj, name, n);
        return TERN_OK;
    }
    bool safe;
    if (method >= 0 && tpl_has_method(obj, method, &safe)) {
        if (!safe) {
            *out = v_undef_hint("access to a method that modifies a list or dict is not allowed (sandbox)");
            return TERN_OK;
        }
        struct tpl_func *fn = tern_arena_calloc(&c->ar, 1, sizeof *fn);
        if (!fn) return tpl_oom(c);
        fn->type = F_METHOD;
        fn->id = method;
        fn->self = obj;
        fn->name = name;
        out->kind = V_FUNC;
        out->u.fn = fn;
        return TERN_OK;
    }
    if (obj.kind == V_DICT) {
        if (!v_dict_get_str(obj, name, n, out)) *out = v_undef_attr(obj, name, n);
        return TERN_OK;
    }
    (void)st;
    *out = v_undef_attr(obj, name, n);
    return TERN_OK;
}

enum tern_status tpl_getitem(struct ctx *c, struct val obj, struct val key, struct val *out) {
    enum tern_status st;
    if (obj.kind == V_UNDEF) return tpl_undef_error(obj);
    if (key.kind == V_INT || key.kind == V_BOOL) {
        if ((obj.kind == V_LIST && !(obj.flags & VF_VIEW)) || obj.kind == V_STR) {
            if (seq_item(c, obj, as_i(key), out, &st)) return TERN_OK;
            if (st) return st;
            *out = v_undef_item(obj, as_i(key));
            return TERN_OK;
        }
    }
    if (obj.kind == V_DICT) {
        if (hashable(key) && v_dict_get(c, obj, key, out)) return TERN_OK;
    }
    if (key.kind == V_STR) {
        int m = tpl_method_id(key.u.s.p, key.u.s.n);
        if (obj.kind == V_DICT) {
            /* the item failed: only a method can still match */
            bool safe;
            if (m >= 0 && tpl_has_method(obj, m, &safe)) return tpl_getattr(c, obj, key.u.s.p, key.u.s.n, m, out);
            *out = v_undef_attr(obj, key.u.s.p, key.u.s.n);
            return TERN_OK;
        }
        return tpl_getattr(c, obj, key.u.s.p, key.u.s.n, m, out);
    }
    if (key.kind == V_INT || key.kind == V_BOOL) {
        *out = v_undef_item(obj, as_i(key));
        return TERN_OK;
    }
    /* other keys: jinja2 names the key's repr */
    tern_buf_clear(&c->scratch);
    if ((st = tpl_fmt_repr(c, &c->scratch, key, 0))) return st;
    struct val r;
    if ((st = tpl_new_str(c, c->scratch.data ? c->scratch.data : "", c->scratch.len, &r))) return st;
    *out = v_undef();
    out->flags = UW_KEY;
    out->aux = (uint8_t)v_otype(obj);
    out->u.s = r.u.s;
    return TERN_OK;
}

/* Python slice.indices(): clamps start/stop for a sequence of n items. */
static enum tern_status slice_indices(struct val vstart, struct val vstop, struct val vstep, int64_t n, int64_t *start,
                                      int64_t *stop, int64_t *step, bool *ok) {
    *ok = true;
    int64_t st = 1;
    if (vstep.kind != V_NONE) {
        if (vstep.kind != V_INT && vstep.kind != V_BOOL) {
            *ok = false;
            return TERN_OK;
        }
        st = as_i(vstep);
        if (st == 0) return tern_errorf(TERN_ERR_TEMPLATE, "slice step cannot be zero");
    }
    int64_t lower = st < 0 ? -1 : 0, upper = st < 0 ? n - 1 : n;
    int64_t a, b;
    if (vstart.kind == V_NONE) {
        a = st < 0 ? upper : lower;
    } else {
        if (vstart.kind != V_INT && vstart.kind != V_BOOL) {
            *ok = false;
            return TERN_OK;
        }
        a = as_i(vstart);
        if (a < 0) {
            a = a < INT64_MIN + n ? lower : a + n;
            if (a < lower) a = lower;
        } else if (a > upper) {
            a = upper;
        }
    }
    if (vstop.kind == V_NONE) {
        b = st < 0 ? lower : upper;
    } else {
        if (vstop.kind != V_INT && vstop.kind != V_BOOL) {
            *ok = false;
            return TERN_OK;
        }
        b = as_i(vstop);
        if (b < 0) {
            b = b < INT64_MIN + n ? lower : b + n;
            if (b < lower) b = lower;
        } else if (b > upper) {
            b = upper;
        }
    }
    *start = a;
    *stop = b;
    *step = st;
    return TERN_OK;
}

static int64_t slice_len(int64_t a, int64_t b, int64_t s) {
    if (s > 0) return a < b ? (b - a - 1) / s + 1 : 0;
    return a > b ? (a - b - 1) / (-s) + 1 : 0;
}

enum tern_status tpl_slice(struct ctx *c, struct val obj, struct val vstart, struct val vstop, struct val vstep,
                           struct val *out) {
    enum tern_status st;
    if (obj.kind == V_UNDEF) return tpl_undef_error(obj);
    /* jinja2 compiles slices to plain Python subscripts: no undefined fallback */
    if (obj.kind == V_DICT) return tern_errorf(TERN_ERR_TEMPLATE, "unhashable type: 'slice'");
    if ((obj.kind != V_LIST && obj.kind != V_STR) || (obj.kind == V_LIST && (obj.flags & VF_VIEW)))
        return tern_errorf(TERN_ERR_TEMPLATE, "'%s' object is not subscriptable", v_type_name(obj));
    int64_t a, b, s;
    bool ok;
    if (obj.kind == V_STR) {
        const char *p = obj.u.s.p;
        size_t nb = obj.u.s.n;
        if ((st = tpl_charge(c, nb))) return st;
        size_t n = utf8_count(p, nb);
        if ((st = slice_indices(vstart, vstop, vstep, (int64_t)n, &a, &b, &s, &ok))) return st;
        if (!ok) return tern_errorf(TERN_ERR_TEMPLATE, "slice indices must be integers or None or have an __index__ method");
        int64_t len = slice_len(a, b, s);
        if (len <= 0) {
            *out = v_str("", 0);
            out->flags = obj.flags & VF_SAFE;
            return TERN_OK;
        }
        if (s == 1) {
            size_t ba = cp_offset(p, nb, (size_t)a), bb = cp_offset(p, nb, (size_t)b);
            *out = v_str(p + ba, bb - ba);
            out->flags = obj.flags & VF_SAFE;
            return TERN_OK;
        }
        if ((st = tpl_step(c, (uint64_t)len))) return st;
        /* general step: collect code point offsets */
        size_t *offs = tern_arena_alloc(&c->ar, (n + 1) * sizeof *offs);
        if (!offs) return tpl_oom(c);
        size_t k = 0;
        for (size_t i = 0; i < nb; i += utf8_seqlen((unsigned char)p[i])) offs[k++] = i;
        offs[n] = nb;
        size_t total = 0;
        for (int64_t j = 0, i = a; j < len; j++, i += s) total += offs[i + 1] - offs[i];
        char *q = tpl_alloc_str(c, total);
        if (!q) return tpl_oom(c);
        size_t w = 0;
        for (int64_t j = 0, i = a; j < len; j++, i += s) {
            size_t cl = offs[i + 1] - offs[i];
            memcpy(q + w, p + offs[i], cl);
            w += cl;
        }
        *out = v_str(q, total);
        return TERN_OK;
    }
    size_t n = v_len_list(obj);
    if ((st = slice_indices(vstart, vstop, vstep, (int64_t)n, &a, &b, &s, &ok))) return st;
    if (!ok) return tern_errorf(TERN_ERR_TEMPLATE, "slice indices must be integers or None or have an __index__ method");
    int64_t len = slice_len(a, b, s);
    if ((st = tpl_step(c, (uint64_t)len))) return st;
    struct tpl_list *l = tpl_list_new(c, (size_t)len);
    if (!l) return tpl_oom(c);
    for (int64_t j = 0, i = a; j < len; j++, i += s) l->items[j] = v_list_at(obj, (size_t)i);
    *out = v_list(l, obj.flags & VF_TUPLE);
    return TERN_OK;
}

enum tern_status tpl_iterable(struct ctx *c, struct val v, struct val *out) {
    enum tern_status st;
    switch (v.kind) {
    case V_LIST: *out = v; return TERN_OK;
    case V_GEN: {
        struct tpl_gen *g = v.u.gen;
        if (g->filter >= 0) {
            /* first iteration: compute the items now (errors surface here, as in jinja2) */
            int f = g->filter;
            g->filter = -1;
            if ((st = tpl_filter_eager(c, f, g->filter_name, g->input, g->args, &g->items))) return st;
        }
        size_t n = v_len_list(g->items), from = g->pos < n ? g->pos : n;
        g->pos = n;
        struct tpl_list *l = tpl_list_new(c, n - from);
        if (!l) return tpl_oom(c);
        for (size_t i = from; i < n; i++) l->items[i - from] = v_list_at(g->items, i);
        *out = v_list(l, false);
        return TERN_OK;
    }
    case V_UNDEF: {
        struct tpl_list *l = tpl_list_new(c, 0);
        if (!l) return tpl_oom(c);
        *out = v_list(l, false);
        return TERN_OK;
    }
    case V_DICT: {
        size_t n = v_dict_len(v);
        if ((st = tpl_step(c, n))) return st;
        struct tpl_list *l = tpl_list_new(c, n);
        if (!l) return tpl_oom(c);
        struct dict_iter it = {0};
        struct val k;
        size_t i = 0;
        while (i < n && v_dict_next(v, &it, &k, NULL)) l->items[i++] = k;
        l->n = i;
        *out = v_list(l, false);
        return TERN_OK;
    }
    case V_STR: {
        size_t n = utf8_count(v.u.s.p, v.u.s.n);
        if ((st = tpl_step(c, n))) return st;
        struct tpl_list *l = tpl_list_new(c, n);
        if (!l) return tpl_oom(c);
        size_t i = 0;
        for (size_t b = 0; b < v.u.s.n && i < n; i++) {
            size_t len = utf8_seqlen((unsigned char)v.u.s.p[b]);
            l->items[i] = v_str(v.u.s.p + b, len);
            l->items[i].flags = v.flags & VF_SAFE;
            b += len;
        }
        *out = v_list(l, false);
        return TERN_OK;
    }
    default: return tern_errorf(TERN_ERR_TEMPLATE, "'%s' object is not iterable", v_type_name(v));
    }
}

/* Bottom-up merge sort: stable, O(n log n) comparisons, each of which may fail. */
enum tern_status tpl_sort(struct ctx *c, struct val *items, size_t n, tpl_less_fn less, void *user) {
    enum tern_status st;
    if (n < 2) return TERN_OK;
    if ((st = tpl_step(c, n))) return st;
    struct val *tmp = tern_arena_alloc(&c->ar, n * sizeof *tmp);
    if (!tmp) return tpl_oom(c);
    struct val *src = items, *dst = tmp;
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n;
            size_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                bool lt;
                /* take from the right only when strictly less: keeps equal items in order */
                if ((st = less(c, &src[j], &src[i], user, &lt))) return st;
                dst[k++] = lt ? src[j++] : src[i++];
            }
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        if ((st = tpl_step(c, n))) return st;
        struct val *t = src;
        src = dst;
        dst = t;
    }
    if (src != items) memcpy(items, src, n * sizeof *items);
    return TERN_OK;
}
