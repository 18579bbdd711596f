/* Parser: tokens -> AST, following jinja2's grammar (jinja2/parser.py) so that
 * precedence and the odd corners agree: `-x|f` is `(-x)|f`, `a is not b` is
 * `not (a is b)`, `**` is left-associative, adjacent string literals concatenate,
 * `{% if %}` and `{% for ... in %}` take an expression without inline-if.
 *
 * Recursion is bounded: block nesting and expression depth are limited (MAX_NEST), so
 * neither parsing nor rendering can exhaust the stack on hostile input. */
#include "template/tpl.h"

#include "util/mem.h"

#include <stdio.h>
#include <string.h>

#define MAX_NEST 128        /* parser recursion: nested blocks, brackets, unary operators */
#define MAX_EXPR_DEPTH 1000 /* depth of expression trees (a + b + c ... chains are deep) */

struct parser {
    struct tern_template *t;
    const struct token *tk;
    size_t n, i;
    uint32_t nest;       /* current parser recursion depth */
    uint32_t loop_depth; /* for break/continue */
    uint32_t expr_nest;  /* parse_expression recursion */
    struct node *macros[MAX_NEST + 8];
    uint32_t n_macros;
    uint32_t cap_syms;
    uint32_t *hash; /* symbol table index */
    uint32_t hash_cap;
};

/* ---- errors ----------------------------------------------------------------------- */

static const char *op_text(int op) {
    switch (op) {
    case OP_ADD: return "+";
    case OP_SUB: return "-";
    case OP_MUL: return "*";
    case OP_DIV: return "/";
    case OP_FLOORDIV: return "//";
    case OP_POW: return "**";
    case OP_MOD: return "%";
    case OP_TILDE: return "~";
    case OP_LBRACKET: return "[";
    case OP_RBRACKET: return "]";
    case OP_LPAREN: return "(";
    case OP_RPAREN: return ")";
    case OP_LBRACE: return "{";
    case OP_RBRACE: return "}";
    case OP_EQ: return "==";
    case OP_NE: return "!=";
    case OP_GT: return ">";
    case OP_GE: return ">=";
    case OP_LT: return "<";
    case OP_LE: return "<=";
    case OP_ASSIGN: return "=";
    case OP_DOT: return ".";
    case OP_COLON: return ":";
    case OP_PIPE: return "|";
    case OP_COMMA: return ",";
    case OP_SEMICOLON: return ";";
    default: return "?";
    }
}

static void describe(const struct token *tk, char *buf, size_t size) {
    switch (tk->type) {
    case TK_EOF: snprintf(buf, size, "end of template"); break;
    case TK_TEXT: snprintf(buf, size, "template text"); break;
    case TK_VAR_BEGIN: snprintf(buf, size, "'{{'"); break;
    case TK_VAR_END: snprintf(buf, size, "'}}'"); break;
    case TK_BLOCK_BEGIN: snprintf(buf, size, "'{%%'"); break;
    case TK_BLOCK_END: snprintf(buf, size, "'%%}'"); break;
    case TK_NAME: snprintf(buf, size, "'%.*s'", (int)utf8_clip(tk->u.s.p, tk->u.s.n, 40), tk->u.s.p); break;
    case TK_STRING: snprintf(buf, size, "a string"); break;
    case TK_INT: snprintf(buf, size, "an integer"); break;
    case TK_FLOAT: snprintf(buf, size, "a number"); break;
    case TK_OP: snprintf(buf, size, "'%s'", op_text(tk->op)); break;
    default: snprintf(buf, size, "?"); break;
    }
}

static enum tern_status fail_at(struct parser *p, size_t pos, const char *fmt, ...) TERN_PRINTF(3, 4);
static enum tern_status fail_at(struct parser *p, size_t pos, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    utf8_trim_partial(msg);
    unsigned line, col;
    tpl_line_col(p->t->src, p->t->src_len, pos, &line, &col);
    return tern_errorf(TERN_ERR_TEMPLATE, "line %u:%u: %s", line, col, msg);
}

static const struct token *cur(struct parser *p) { return &p->tk[p->i]; }
static const struct token *peek(struct parser *p, size_t k) {
    size_t j = p->i + k;
    return &p->tk[j < p->n ? j : p->n - 1];
}
static void advance(struct parser *p) {
    if (p->i + 1 < p->n) p->i++;
}

static enum tern_status expected(struct parser *p, const char *what) {
    char got[64];
    describe(cur(p), got, sizeof got);
    return fail_at(p, cur(p)->pos, "expected %s, got %s", what, got);
}

static bool is_op(struct parser *p, int op) { return cur(p)->type == TK_OP && cur(p)->op == op; }
static bool is_name(const struct token *tk, const char *kw) {
    return tk->type == TK_NAME && strcmp(tk->u.s.p, kw) == 0;
}
static bool at_name(struct parser *p, const char *kw) { return is_name(cur(p), kw); }

static enum tern_status expect_op(struct parser *p, int op) {
    if (!is_op(p, op)) {
        char what[16];
        snprintf(what, sizeof what, "'%s'", op_text(op));
        return expected(p, what);
    }
    advance(p);
    return TERN_OK;
}

static enum tern_status expect_type(struct parser *p, int type, const char *what) {
    if (cur(p)->type != type) return expected(p, what);
    advance(p);
    return TERN_OK;
}

/* ---- allocation ------------------------------------------------------------------- */

static struct node *mk(struct parser *p, int type, size_t pos) {
    struct node *n = tern_arena_calloc(&p->t->ar, 1, sizeof *n);
    if (!n) return NULL;
    n->type = (uint8_t)type;
    n->pos = (uint32_t)pos;
    return n;
}

/* Growable arrays of pointers in the arena. */
struct vec {
    void **items;
    uint32_t n, cap;
};

static enum tern_status vec_push(struct parser *p, struct vec *v, void *item) {
    if (v->n == v->cap) {
        uint32_t cap = v->cap ? v->cap * 2 : 4;
        void **items = tern_arena_grow(&p->t->ar, v->items, v->cap * sizeof(void *), cap * sizeof(void *));
        if (!items) return TERN_ERR_NOMEM;
        v->items = items;
        v->cap = cap;
    }
    v->items[v->n++] = item;
    return TERN_OK;
}

static uint32_t name_hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* Symbols are interned through an open-addressing table (hash_cap slots, holding
 * symbol + 1; 0 = empty), so templates with many names compile in linear time. */
static bool sym_rehash(struct parser *p, uint32_t cap) {
    uint32_t *h = tern_arena_calloc(&p->t->ar, cap, sizeof *h);
    if (!h) return false;
    for (uint32_t i = 0; i < p->t->n_syms; i++) {
        uint32_t k = name_hash(p->t->syms[i]) & (cap - 1);
        while (h[k]) k = (k + 1) & (cap - 1);
        h[k] = i + 1;
    }
    p->hash = h;
    p->hash_cap = cap;
    return true;
}

static uint32_t sym_intern(struct parser *p, const char *name, bool *err) {
    struct tern_template *t = p->t;
    if (!p->hash && !sym_rehash(p, 64)) {
        *err = true;
        return 0;
    }
    uint32_t k = name_hash(name) & (p->hash_cap - 1);
    for (; p->hash[k]; k = (k + 1) & (p->hash_cap - 1))
        if (strcmp(t->syms[p->hash[k] - 1], name) == 0) return p->hash[k] - 1;
    if (t->n_syms == p->cap_syms) {
        uint32_t cap = p->cap_syms ? p->cap_syms * 2 : 32;
        const char **s = tern_arena_grow(&t->ar, (void *)t->syms, p->cap_syms * sizeof(char *), cap * sizeof(char *));
        uint8_t *l = tern_arena_grow(&t->ar, t->sym_loaded, p->cap_syms, cap);
        if (!s || !l) {
            *err = true;
            return 0;
        }
        memset(l + p->cap_syms, 0, cap - p->cap_syms);
        t->syms = s;
        t->sym_loaded = l;
        p->cap_syms = cap;
    }
    t->syms[t->n_syms] = name;
    p->hash[k] = t->n_syms + 1;
    uint32_t sym = t->n_syms++;
    if (t->n_syms * 2 > p->hash_cap && !sym_rehash(p, p->hash_cap * 2)) {
        *err = true;
        return 0;
    }
    return sym;
}

/* ---- expressions ------------------------------------------------------------------ */

typedef enum tern_status (*parse_fn)(struct parser *p, struct node **out);

static enum tern_status parse_expression(struct parser *p, bool with_condexpr, struct node **out);
static enum tern_status parse_or(struct parser *p, struct node **out);
static enum tern_status parse_unary(struct parser *p, bool with_filter, struct node **out);
static enum tern_status parse_primary(struct parser *p, struct node **out);
static enum tern_status parse_postfix(struct parser *p, struct node **n);
static enum tern_status parse_filter_expr(struct parser *p, struct node **n);
static enum tern_status parse_filter(struct parser *p, struct node *arg, bool start_inline, struct node **out);

static enum tern_status enter(struct parser *p) {
    if (++p->nest > MAX_NEST)
        return fail_at(p, cur(p)->pos, "template nested too deeply (limit %d levels)", MAX_NEST);
    return TERN_OK;
}
static void leave(struct parser *p) { p->nest--; }

static bool is_tuple_end(struct parser *p, const char *extra_end) {
    const struct token *tk = cur(p);
    if (tk->type == TK_VAR_END || tk->type == TK_BLOCK_END || (tk->type == TK_OP && tk->op == OP_RPAREN)) return true;
    return extra_end && is_name(tk, extra_end);
}

/* parse_tuple of jinja2: a, b, c -> tuple; a -> a. mode: 0 expression, 1 without
 * inline-if. */
static enum tern_status parse_tuple(struct parser *p, bool with_condexpr, const char *extra_end, bool explicit_parens,
                                    struct node **out) {
    size_t pos = cur(p)->pos;
    struct vec items = {0};
    bool is_tuple = false;
    enum tern_status st;
    for (;;) {
        if (items.n && (st = expect_op(p, OP_COMMA))) return st;
        if (is_tuple_end(p, extra_end)) break;
        struct node *e;
        if ((st = parse_expression(p, with_condexpr, &e))) return st;
        if ((st = vec_push(p, &items, e))) return st;
        if (is_op(p, OP_COMMA)) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (items.n) {
            *out = items.items[0];
            return TERN_OK;
        }
        if (!explicit_parens) return expected(p, "an expression");
    }
    struct node *n = mk(p, N_TUPLE, pos);
    if (!n) return TERN_ERR_NOMEM;
    n->u.seq.items = (struct node **)items.items;
    n->u.seq.n = items.n;
    *out = n;
    return TERN_OK;
}

static enum tern_status parse_call_args(struct parser *p, struct args *a) {
    enum tern_status st;
    size_t pos = cur(p)->pos;
    if ((st = expect_op(p, OP_LPAREN))) return st;
    struct vec pos_args = {0}, kw_names = {0}, kw_vals = {0};
    bool need_comma = false;
    while (!is_op(p, OP_RPAREN)) {
        if (need_comma) {
            if ((st = expect_op(p, OP_COMMA))) return st;
            if (is_op(p, OP_RPAREN)) break;
        }
        if (is_op(p, OP_MUL) || is_op(p, OP_POW))
            return fail_at(p, cur(p)->pos, "*args and **kwargs in calls are not supported");
        if (cur(p)->type == TK_NAME && peek(p, 1)->type == TK_OP && peek(p, 1)->op == OP_ASSIGN) {
            const char *key = cur(p)->u.s.p;
            advance(p);
            advance(p);
            struct node *v;
            if ((st = parse_expression(p, true, &v))) return st;
            if ((st = vec_push(p, &kw_names, (void *)key)) || (st = vec_push(p, &kw_vals, v))) return st;
        } else {
            if (kw_names.n) return fail_at(p, cur(p)->pos, "positional argument follows keyword argument");
            struct node *v;
            if ((st = parse_expression(p, true, &v))) return st;
            if ((st = vec_push(p, &pos_args, v))) return st;
        }
        need_comma = true;
    }
    (void)pos;
    if ((st = expect_op(p, OP_RPAREN))) return st;
    a->pos = (struct node **)pos_args.items;
    a->n_pos = pos_args.n;
    a->kw_names = (const char **)kw_names.items;
    a->kw = (struct node **)kw_vals.items;
    a->n_kw = kw_names.n;
    if (a->n_kw) {
        a->kw_lens = tern_arena_alloc(&p->t->ar, a->n_kw * sizeof(size_t));
        if (!a->kw_lens) return TERN_ERR_NOMEM;
        for (uint32_t i = 0; i < a->n_kw; i++) a->kw_lens[i] = strlen(a->kw_names[i]);
    }
    return TERN_OK;
}

static enum tern_status mark_name_load(struct parser *p, struct node *n) {
    p->t->sym_loaded[n->u.name.sym] = 1;
    uint32_t sym = n->u.name.sym;
    uint8_t f = sym == SYM_VARARGS ? MF_VARARGS : sym == SYM_KWARGS ? MF_KWARGS : sym == SYM_CALLER ? MF_CALLER : 0;
    if (f)
        for (uint32_t i = 0; i < p->n_macros; i++) p->macros[i]->flag |= f;
    return TERN_OK;
}

static enum tern_status parse_list(struct parser *p, struct node **out) {
    enum tern_status st;
    struct node *n = mk(p, N_LIST, cur(p)->pos);
    if (!n) return TERN_ERR_NOMEM;
    advance(p); /* [ */
    struct vec items = {0};
    while (!is_op(p, OP_RBRACKET)) {
        if (items.n && (st = expect_op(p, OP_COMMA))) return st;
        if (is_op(p, OP_RBRACKET)) break;
        struct node *e;
        if ((st = parse_expression(p, true, &e))) return st;
        if ((st = vec_push(p, &items, e))) return st;
    }
    if ((st = expect_op(p, OP_RBRACKET))) return st;
    n->u.seq.items = (struct node **)items.items;
    n->u.seq.n = items.n;
    *out = n;
    return TERN_OK;
}

static enum tern_status parse_dict(struct parser *p, struct node **out) {
    enum tern_status st;
    struct node *n = mk(p, N_DICT, cur(p)->pos);
    if (!n) return TERN_ERR_NOMEM;
    advance(p); /* { */
    struct vec keys = {0}, vals = {0};
    while (!is_op(p, OP_RBRACE)) {
        if (keys.n && (st = expect_op(p, OP_COMMA))) return st;
        if (is_op(p, OP_RBRACE)) break;
        struct node *k, *v;
        if ((st = parse_expression(p, true, &k))) return st;
        if ((st = expect_op(p, OP_COLON))) return st;
        if ((st = parse_expression(p, true, &v))) return st;
        if ((st = vec_push(p, &keys, k)) || (st = vec_push(p, &vals, v))) return st;
    }
    if ((st = expect_op(p, OP_RBRACE))) return st;
    n->u.seq.items = (struct node **)keys.items;
    n->u.seq.vals = (struct node **)vals.items;
    n->u.seq.n = keys.n;
    *out = n;
    return TERN_OK;
}

static enum tern_status parse_primary(struct parser *p, struct node **out) {
    const struct token *tk = cur(p);
    enum tern_status st;
    struct node *n;
    switch (tk->type) {
    case TK_NAME: {
        const char *s = tk->u.s.p;
        if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "false") || !strcmp(s, "False")) {
            if (!(n = mk(p, N_CONST, tk->pos))) return TERN_ERR_NOMEM;
            n->u.cval = v_bool(s[0] == 't' || s[0] == 'T');
        } else if (!strcmp(s, "none") || !strcmp(s, "None")) {
            if (!(n = mk(p, N_CONST, tk->pos))) return TERN_ERR_NOMEM;
            n->u.cval = v_none();
        } else {
            if (!(n = mk(p, N_NAME, tk->pos))) return TERN_ERR_NOMEM;
            bool err = false;
            n->u.name.sym = sym_intern(p, s, &err);
            if (err) return TERN_ERR_NOMEM;
            n->u.name.name = p->t->syms[n->u.name.sym];
            mark_name_load(p, n);
        }
        advance(p);
        *out = n;
        return TERN_OK;
    }
    case TK_STRING: {
        if (!(n = mk(p, N_CONST, tk->pos))) return TERN_ERR_NOMEM;
        const char *s = tk->u.s.p;
        size_t len = tk->u.s.n;
        advance(p);
        if (cur(p)->type == TK_STRING) {
            /* adjacent literals concatenate */
            size_t total = len;
            for (size_t j = p->i; p->tk[j].type == TK_STRING; j++) total += p->tk[j].u.s.n;
            char *buf = tern_arena_alloc(&p->t->ar, total + 1);
            if (!buf) return TERN_ERR_NOMEM;
            memcpy(buf, s, len);
            size_t k = len;
            while (cur(p)->type == TK_STRING) {
                memcpy(buf + k, cur(p)->u.s.p, cur(p)->u.s.n);
                k += cur(p)->u.s.n;
                advance(p);
            }
            buf[k] = 0;
            s = buf;
            len = k;
        }
        n->u.cval = v_str(s, len);
        *out = n;
        return TERN_OK;
    }
    case TK_INT:
    case TK_FLOAT:
        if (!(n = mk(p, N_CONST, tk->pos))) return TERN_ERR_NOMEM;
        n->u.cval = tk->type == TK_INT ? v_int(tk->u.i) : v_float(tk->u.f);
        advance(p);
        *out = n;
        return TERN_OK;
    case TK_OP:
        if (tk->op == OP_LPAREN) {
            advance(p);
            if ((st = enter(p))) return st;
            st = parse_tuple(p, true, NULL, true, out);
            leave(p);
            if (st) return st;
            return expect_op(p, OP_RPAREN);
        }
        if (tk->op == OP_LBRACKET) {
            if ((st = enter(p))) return st;
            st = parse_list(p, out);
            leave(p);
            return st;
        }
        if (tk->op == OP_LBRACE) {
            if ((st = enter(p))) return st;
            st = parse_dict(p, out);
            leave(p);
            return st;
        }
        break;
    default:
        break;
    }
    return expected(p, "an expression");
}

/* One subscript inside [ ]: an expression or a slice a:b:c. */
static enum tern_status parse_subscribed(struct parser *p, struct node **key, struct node *sl[3], bool *is_slice) {
    enum tern_status st;
    *is_slice = false;
    sl[0] = sl[1] = sl[2] = NULL;
    if (is_op(p, OP_COLON)) {
        advance(p);
    } else {
        if ((st = parse_expression(p, true, key))) return st;
        if (!is_op(p, OP_COLON)) return TERN_OK;
        advance(p);
        sl[0] = *key;
    }
    *is_slice = true;
    if (!is_op(p, OP_COLON) && !is_op(p, OP_RBRACKET) && !is_op(p, OP_COMMA)) {
        if ((st = parse_expression(p, true, &sl[1]))) return st;
    }
    if (is_op(p, OP_COLON)) {
        advance(p);
        if (!is_op(p, OP_RBRACKET) && !is_op(p, OP_COMMA)) {
            if ((st = parse_expression(p, true, &sl[2]))) return st;
        }
    }
    return TERN_OK;
}

static enum tern_status parse_subscript(struct parser *p, struct node **n) {
    enum tern_status st;
    const struct token *tk = cur(p);
    size_t pos = tk->pos;
    if (tk->op == OP_DOT) {
        advance(p);
        const struct token *a = cur(p);
        if (a->type == TK_NAME) {
            struct node *g = mk(p, N_GETATTR, pos);
            if (!g) return TERN_ERR_NOMEM;
            g->u.attr.obj = *n;
            g->u.attr.name = a->u.s.p;
            g->u.attr.len = a->u.s.n;
            g->u.attr.method = tpl_method_id(a->u.s.p, a->u.s.n);
            advance(p);
            *n = g;
            return TERN_OK;
        }
        if (a->type != TK_INT) return expected(p, "an attribute name or number after '.'");
        struct node *k = mk(p, N_CONST, a->pos), *g = mk(p, N_GETITEM, pos);
        if (!k || !g) return TERN_ERR_NOMEM;
        k->u.cval = v_int(a->u.i);
        g->u.item.obj = *n;
        g->u.item.key = k;
        advance(p);
        *n = g;
        return TERN_OK;
    }
    /* [ */
    advance(p);
    struct vec keys = {0};
    struct node *slice_node = NULL;
    while (!is_op(p, OP_RBRACKET)) {
        if (keys.n || slice_node) {
            if ((st = expect_op(p, OP_COMMA))) return st;
        }
        struct node *key = NULL, *sl[3];
        bool is_slice;
        if ((st = parse_subscribed(p, &key, sl, &is_slice))) return st;
        if (is_slice) {
            if (keys.n || slice_node) return fail_at(p, pos, "multi-dimensional subscripts are not supported");
            if (!(slice_node = mk(p, N_SLICE, pos))) return TERN_ERR_NOMEM;
            slice_node->u.slice.obj = *n;
            slice_node->u.slice.start = sl[0];
            slice_node->u.slice.stop = sl[1];
            slice_node->u.slice.step = sl[2];
        } else {
            if (slice_node) return fail_at(p, pos, "multi-dimensional subscripts are not supported");
            if ((st = vec_push(p, &keys, key))) return st;
        }
    }
    if ((st = expect_op(p, OP_RBRACKET))) return st;
    if (slice_node) {
        *n = slice_node;
        return TERN_OK;
    }
    if (keys.n == 0) return fail_at(p, pos, "expected a subscript inside '[]'");
    struct node *g = mk(p, N_GETITEM, pos);
    if (!g) return TERN_ERR_NOMEM;
    g->u.item.obj = *n;
    if (keys.n == 1) {
        g->u.item.key = keys.items[0];
    } else {
        struct node *tup = mk(p, N_TUPLE, pos);
        if (!tup) return TERN_ERR_NOMEM;
        tup->u.seq.items = (struct node **)keys.items;
        tup->u.seq.n = keys.n;
        g->u.item.key = tup;
    }
    *n = g;
    return TERN_OK;
}

static enum tern_status parse_call(struct parser *p, struct node **n) {
    struct node *c = mk(p, N_CALL, cur(p)->pos);
    if (!c) return TERN_ERR_NOMEM;
    c->u.call.fn = *n;
    enum tern_status st = parse_call_args(p, &c->u.call.a);
    if (st) return st;
    *n = c;
    return TERN_OK;
}

static enum tern_status parse_postfix(struct parser *p, struct node **n) {
    enum tern_status st;
    for (;;) {
        if (is_op(p, OP_DOT) || is_op(p, OP_LBRACKET)) {
            if ((st = parse_subscript(p, n))) return st;
        } else if (is_op(p, OP_LPAREN)) {
            if ((st = parse_call(p, n))) return st;
        } else {
            return TERN_OK;
        }
    }
}

static enum tern_status parse_dotted_name(struct parser *p, const char **name) {
    if (cur(p)->type != TK_NAME) return expected(p, "a name");
    const char *s = cur(p)->u.s.p;
    advance(p);
    while (is_op(p, OP_DOT)) {
        advance(p);
        if (cur(p)->type != TK_NAME) return expected(p, "a name");
        size_t a = strlen(s), b = cur(p)->u.s.n;
        char *j = tern_arena_alloc(&p->t->ar, a + b + 2);
        if (!j) return TERN_ERR_NOMEM;
        memcpy(j, s, a);
        j[a] = '.';
        memcpy(j + a + 1, cur(p)->u.s.p, b + 1);
        s = j;
        advance(p);
    }
    *name = s;
    return TERN_OK;
}

static enum tern_status parse_filter(struct parser *p, struct node *arg, bool start_inline, struct node **out) {
    enum tern_status st;
    struct node *node = arg;
    while (is_op(p, OP_PIPE) || start_inline) {
        if (!start_inline) advance(p);
        size_t pos = cur(p)->pos;
        struct node *f = mk(p, N_FILTER, pos);
        if (!f) return TERN_ERR_NOMEM;
        if ((st = parse_dotted_name(p, &f->u.filter.name))) return st;
        f->u.filter.id = tpl_filter_id(f->u.filter.name);
        if (is_op(p, OP_LPAREN) && (st = parse_call_args(p, &f->u.filter.a))) return st;
        f->u.filter.arg = node;
        node = f;
        start_inline = false;
    }
    *out = node;
    return TERN_OK;
}

static enum tern_status parse_test(struct parser *p, struct node **n) {
    enum tern_status st;
    size_t pos = cur(p)->pos;
    advance(p); /* is */
    bool negated = false;
    if (at_name(p, "not")) {
        advance(p);
        negated = true;
    }
    struct node *t = mk(p, N_TEST, pos);
    if (!t) return TERN_ERR_NOMEM;
    if ((st = parse_dotted_name(p, &t->u.filter.name))) return st;
    t->u.filter.id = tpl_test_id(t->u.filter.name);
    t->u.filter.arg = *n;
    t->flag = negated;
    const struct token *tk = cur(p);
    if (is_op(p, OP_LPAREN)) {
        if ((st = parse_call_args(p, &t->u.filter.a))) return st;
    } else if ((tk->type == TK_NAME || tk->type == TK_STRING || tk->type == TK_INT || tk->type == TK_FLOAT ||
                (tk->type == TK_OP && (tk->op == OP_LBRACKET || tk->op == OP_LBRACE))) &&
               !is_name(tk, "else") && !is_name(tk, "or") && !is_name(tk, "and")) {
        if (is_name(tk, "is")) return fail_at(p, tk->pos, "tests cannot be chained with 'is'");
        struct node *a;
        if ((st = parse_primary(p, &a))) return st;
        if ((st = parse_postfix(p, &a))) return st;
        struct node **one = tern_arena_alloc(&p->t->ar, sizeof *one);
        if (!one) return TERN_ERR_NOMEM;
        one[0] = a;
        t->u.filter.a.pos = one;
        t->u.filter.a.n_pos = 1;
    }
    *n = t;
    return TERN_OK;
}

static enum tern_status parse_filter_expr(struct parser *p, struct node **n) {
    enum tern_status st;
    for (;;) {
        if (is_op(p, OP_PIPE)) {
            if ((st = parse_filter(p, *n, false, n))) return st;
        } else if (at_name(p, "is")) {
            if ((st = parse_test(p, n))) return st;
        } else if (is_op(p, OP_LPAREN)) {
            if ((st = parse_call(p, n))) return st;
        } else {
            return TERN_OK;
        }
    }
}

static enum tern_status parse_unary(struct parser *p, bool with_filter, struct node **out) {
    enum tern_status st;
    if ((st = enter(p))) return st;
    const struct token *tk = cur(p);
    struct node *n;
    if (tk->type == TK_OP && (tk->op == OP_SUB || tk->op == OP_ADD)) {
        advance(p);
        struct node *a;
        if ((st = parse_unary(p, false, &a))) goto done;
        if (!(n = mk(p, N_UNARY, tk->pos))) {
            st = TERN_ERR_NOMEM;
            goto done;
        }
        n->op = tk->op == OP_SUB ? OP_NEG : OP_POS;
        n->u.bin.a = a;
    } else {
        if ((st = parse_primary(p, &n))) goto done;
    }
    if ((st = parse_postfix(p, &n))) goto done;
    if (with_filter && (st = parse_filter_expr(p, &n))) goto done;
    *out = n;
done:
    leave(p);
    return st;
}

static enum tern_status binary(struct parser *p, int op, size_t pos, struct node *a, struct node *b, struct node **out) {
    struct node *n = mk(p, N_BINARY, pos);
    if (!n) return TERN_ERR_NOMEM;
    n->op = (uint8_t)op;
    n->u.bin.a = a;
    n->u.bin.b = b;
    *out = n;
    return TERN_OK;
}

static enum tern_status parse_pow(struct parser *p, struct node **out) {
    enum tern_status st;
    struct node *left;
    if ((st = parse_unary(p, true, &left))) return st;
    while (is_op(p, OP_POW)) {
        size_t pos = cur(p)->pos;
        advance(p);
        struct node *right;
        if ((st = parse_unary(p, true, &right))) return st;
        if ((st = binary(p, OP_POW, pos, left, right, &left))) return st;
    }
    *out = left;
    return TERN_OK;
}

static enum tern_status parse_math2(struct parser *p, struct node **out) {
    enum tern_status st;
    struct node *left;
    if ((st = parse_pow(p, &left))) return st;
    while (is_op(p, OP_MUL) || is_op(p, OP_DIV) || is_op(p, OP_FLOORDIV) || is_op(p, OP_MOD)) {
        int op = cur(p)->op;
        size_t pos = cur(p)->pos;
        advance(p);
        struct node *right;
        if ((st = parse_pow(p, &right))) return st;
        if ((st = binary(p, op, pos, left, right, &left))) return st;
    }
    *out = left;
    return TERN_OK;
}

static enum tern_status parse_concat(struct parser *p, struct node **out) {
    enum tern_status st;
    struct node *first;
    size_t pos = cur(p)->pos;
    if ((st = parse_math2(p, &first))) return st;
    if (!is_op(p, OP_TILDE)) {
        *out = first;
        return TERN_OK;
    }
    struct vec items = {0};
    if ((st = vec_push(p, &items, first))) return st;
    while (is_op(p, OP_TILDE)) {
        advance(p);
        struct node *e;
        if ((st = parse_math2(p, &e))) return st;
        if ((st = vec_push(p, &items, e))) return st;
    }
    struct node *n = mk(p, N_CONCAT, pos);
    if (!n) return TERN_ERR_NOMEM;
    n->u.seq.items = (struct node **)items.items;
    n->u.seq.n = items.n;
    *out = n;
    return TERN_OK;
}

static enum tern_status parse_math1(struct parser *p, struct node **out) {
    enum tern_status st;
    struct node *left;
    if ((st = parse_concat(p, &left))) return st;
    while (is_op(p, OP_ADD) || is_op(p, OP_SUB)) {
        int op = cur(p)->op;
        size_t pos = cur(p)->pos;
        advance(p);
        struct node *right;
        if ((st = parse_concat(p, &right))) return st;
        if ((st = binary(p, op, pos, left, right, &left))) return st;
    }
    *out = left;
    return TERN_OK;
}

static enum tern_status parse_compare(struct parser *p, struct node **out) {
    enum tern_status st;
    size_t pos = cur(p)->pos;
    struct node *first;
    if ((st = parse_math1(p, &first))) return st;
    struct vec rhs = {0};
    uint8_t ops[64];
    for (;;) {
        const struct token *tk = cur(p);
        int op = 0;
        if (tk->type == TK_OP && (tk->op == OP_EQ || tk->op == OP_NE || tk->op == OP_LT || tk->op == OP_LE ||
                                  tk->op == OP_GT || tk->op == OP_GE)) {
            op = tk->op;
            advance(p);
        } else if (is_name(tk, "in")) {
            op = OP_IN;
            advance(p);
        } else if (is_name(tk, "not") && is_name(peek(p, 1), "in")) {
            op = OP_NOTIN;
            advance(p);
            advance(p);
        } else {
            break;
        }
        if (rhs.n == sizeof ops) return fail_at(p, tk->pos, "comparison chain too long");
        ops[rhs.n] = (uint8_t)op;
        struct node *r;
        if ((st = parse_math1(p, &r))) return st;
        if ((st = vec_push(p, &rhs, r))) return st;
    }
    if (!rhs.n) {
        *out = first;
        return TERN_OK;
    }
    struct node *n = mk(p, N_COMPARE, pos);
    uint8_t *o = tern_arena_alloc(&p->t->ar, rhs.n);
    if (!n || !o) return TERN_ERR_NOMEM;
    memcpy(o, ops, rhs.n);
    n->u.cmp.first = first;
    n->u.cmp.ops = o;
    n->u.cmp.rhs = (struct node **)rhs.items;
    n->u.cmp.n = rhs.n;
    *out = n;
    return TERN_OK;
}

static enum tern_status parse_not(struct parser *p, struct node **out) {
    enum tern_status st;
    if (at_name(p, "not")) {
        size_t pos = cur(p)->pos;
        advance(p);
        if ((st = enter(p))) return st;
        struct node *a;
        st = parse_not(p, &a);
        leave(p);
        if (st) return st;
        struct node *n = mk(p, N_UNARY, pos);
        if (!n) return TERN_ERR_NOMEM;
        n->op = OP_NOT;
        n->u.bin.a = a;
        *out = n;
        return TERN_OK;
    }
    return parse_compare(p, out);
}

static enum tern_status parse_and(struct parser *p, struct node **out) {
    enum tern_status st;
    struct node *left;
    if ((st = parse_not(p, &left))) return st;
    while (at_name(p, "and")) {
        size_t pos = cur(p)->pos;
        advance(p);
        struct node *right;
        if ((st = parse_not(p, &right))) return st;
        if ((st = binary(p, OP_AND, pos, left, right, &left))) return st;
    }
    *out = left;
    return TERN_OK;
}

static enum tern_status parse_or(struct parser *p, struct node **out) {
    enum tern_status st;
    struct node *left;
    if ((st = parse_and(p, &left))) return st;
    while (at_name(p, "or")) {
        size_t pos = cur(p)->pos;
        advance(p);
        struct node *right;
        if ((st = parse_and(p, &right))) return st;
        if ((st = binary(p, OP_OR, pos, left, right, &left))) return st;
    }
    *out = left;
    return TERN_OK;
}

static enum tern_status parse_condexpr(struct parser *p, struct node **out) {
    enum tern_status st;
    struct node *e1;
    if ((st = parse_or(p, &e1))) return st;
    while (at_name(p, "if")) {
        size_t pos = cur(p)->pos;
        advance(p);
        struct node *e2, *e3 = NULL;
        if ((st = parse_or(p, &e2))) return st;
        if (at_name(p, "else")) {
            advance(p);
            if ((st = enter(p))) return st;
            st = parse_condexpr(p, &e3);
            leave(p);
            if (st) return st;
        }
        struct node *n = mk(p, N_COND, pos);
        if (!n) return TERN_ERR_NOMEM;
        n->u.cond.cond = e2;
        n->u.cond.a = e1;
        n->u.cond.b = e3;
        e1 = n;
    }
    *out = e1;
    return TERN_OK;
}

/* Expression trees built by loops (a + b + c ..., x.a.b.c ..., x|f|g ...) are deep
 * without deep parser recursion; the evaluator recurses over them, so their depth is
 * bounded here. */
static enum tern_status check_depth(struct parser *p, const struct node *n, uint32_t d);

static enum tern_status check_args_depth(struct parser *p, const struct args *a, uint32_t d) {
    enum tern_status st;
    for (uint32_t i = 0; i < a->n_pos; i++)
        if ((st = check_depth(p, a->pos[i], d))) return st;
    for (uint32_t i = 0; i < a->n_kw; i++)
        if ((st = check_depth(p, a->kw[i], d))) return st;
    return TERN_OK;
}

static enum tern_status check_depth(struct parser *p, const struct node *n, uint32_t d) {
    if (!n) return TERN_OK;
    if (d > MAX_EXPR_DEPTH)
        return fail_at(p, n->pos, "expression nested too deeply (limit %d levels)", MAX_EXPR_DEPTH);
    enum tern_status st;
    switch (n->type) {
    case N_GETATTR: return check_depth(p, n->u.attr.obj, d + 1);
    case N_GETITEM:
        if ((st = check_depth(p, n->u.item.obj, d + 1))) return st;
        return check_depth(p, n->u.item.key, d + 1);
    case N_SLICE:
        if ((st = check_depth(p, n->u.slice.obj, d + 1)) || (st = check_depth(p, n->u.slice.start, d + 1)) ||
            (st = check_depth(p, n->u.slice.stop, d + 1)))
            return st;
        return check_depth(p, n->u.slice.step, d + 1);
    case N_CALL:
        if ((st = check_depth(p, n->u.call.fn, d + 1))) return st;
        return check_args_depth(p, &n->u.call.a, d + 1);
    case N_FILTER:
    case N_TEST:
        if ((st = check_depth(p, n->u.filter.arg, d + 1))) return st;
        return check_args_depth(p, &n->u.filter.a, d + 1);
    case N_UNARY: return check_depth(p, n->u.bin.a, d + 1);
    case N_BINARY:
        if ((st = check_depth(p, n->u.bin.a, d + 1))) return st;
        return check_depth(p, n->u.bin.b, d + 1);
    case N_COMPARE:
        if ((st = check_depth(p, n->u.cmp.first, d + 1))) return st;
        for (uint32_t i = 0; i < n->u.cmp.n; i++)
            if ((st = check_depth(p, n->u.cmp.rhs[i], d + 1))) return st;
        return TERN_OK;
    case N_COND:
        if ((st = check_depth(p, n->u.cond.cond, d + 1)) || (st = check_depth(p, n->u.cond.a, d + 1))) return st;
        return check_depth(p, n->u.cond.b, d + 1);
    case N_CONCAT:
    case N_LIST:
    case N_TUPLE:
    case N_DICT:
        for (uint32_t i = 0; i < n->u.seq.n; i++) {
            if ((st = check_depth(p, n->u.seq.items[i], d + 1))) return st;
            if (n->type == N_DICT && (st = check_depth(p, n->u.seq.vals[i], d + 1))) return st;
        }
        return TERN_OK;
    default: return TERN_OK;
    }
}

static enum tern_status parse_expression(struct parser *p, bool with_condexpr, struct node **out) {
    enum tern_status st;
    if ((st = enter(p))) return st;
    p->expr_nest++;
    st = with_condexpr ? parse_condexpr(p, out) : parse_or(p, out);
    p->expr_nest--;
    leave(p);
    if (st == TERN_OK && p->expr_nest == 0) st = check_depth(p, *out, 0);
    return st;
}

/* ---- statements ------------------------------------------------------------------- */

static enum tern_status subparse(struct parser *p, const char *const *end_tags, struct body *out);

/* Targets: name, (nested) tuple of names, or with_ns: ns.attr. */
static enum tern_status parse_target_primary(struct parser *p, struct target **out);

static enum tern_status parse_target_list(struct parser *p, const char *extra_end, bool parens, struct target **out) {
    enum tern_status st;
    size_t pos = cur(p)->pos;
    struct vec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n && (st = expect_op(p, OP_COMMA))) return st;
        if (is_tuple_end(p, extra_end) || (extra_end && at_name(p, extra_end))) break;
        if (!parens && is_op(p, OP_ASSIGN)) break;
        struct target *t;
        if ((st = parse_target_primary(p, &t))) return st;
        if ((st = vec_push(p, &items, t))) return st;
        if (is_op(p, OP_COMMA)) is_tuple = true;
        else break;
    }
    if (!is_tuple && items.n == 1) {
        *out = items.items[0];
        return TERN_OK;
    }
    if (items.n == 0) return expected(p, "a variable name");
    struct target *t = tern_arena_calloc(&p->t->ar, 1, sizeof *t);
    if (!t) return TERN_ERR_NOMEM;
    t->type = TG_TUPLE;
    t->items = (struct target **)items.items;
    t->n = items.n;
    t->pos = (uint32_t)pos;
    *out = t;
    return TERN_OK;
}

static enum tern_status name_target(struct parser *p, struct target **out) {
    const struct token *tk = cur(p);
    if (tk->type != TK_NAME) return expected(p, "a variable name");
    const char *s = tk->u.s.p;
    if (!strcmp(s, "true") || !strcmp(s, "false") || !strcmp(s, "none") || !strcmp(s, "True") ||
        !strcmp(s, "False") || !strcmp(s, "None"))
        return fail_at(p, tk->pos, "cannot assign to constant '%s'", s);
    struct target *t = tern_arena_calloc(&p->t->ar, 1, sizeof *t);
    if (!t) return TERN_ERR_NOMEM;
    bool err = false;
    t->type = TG_NAME;
    t->sym = sym_intern(p, s, &err);
    if (err) return TERN_ERR_NOMEM;
    t->name = p->t->syms[t->sym];
    t->pos = tk->pos;
    advance(p);
    *out = t;
    return TERN_OK;
}

static enum tern_status parse_target_primary(struct parser *p, struct target **out) {
    enum tern_status st;
    if (is_op(p, OP_LPAREN)) {
        advance(p);
        if ((st = enter(p))) return st;
        st = parse_target_list(p, NULL, true, out);
        leave(p);
        if (st) return st;
        return expect_op(p, OP_RPAREN);
    }
    return name_target(p, out);
}

static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_FOR2[] = {"endfor", NULL};
static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_IF2[] = {"endif", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_CALL[] = {"endcall", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};
static const char *const END_WITH[] = {"endwith", NULL};

/* After a statement header: "%}", the body, up to one of end_tags (the "{%" and the
 * tag name are consumed; the name is returned in *which). */
static enum tern_status parse_statements(struct parser *p, const char *const *end_tags, struct body *body,
                                         const char **which) {
    enum tern_status st;
    if (is_op(p, OP_COLON)) advance(p);
    if ((st = expect_type(p, TK_BLOCK_END, "'%}'"))) return st;
    if ((st = enter(p))) return st;
    st = subparse(p, end_tags, body);
    leave(p);
    if (st) return st;
    if (cur(p)->type == TK_EOF) {
        char what[128] = "";
        size_t k = 0;
        for (int i = 0; end_tags[i]; i++)
            k += (size_t)snprintf(what + k, sizeof what - k, "%s'%s'", i ? (end_tags[i + 1] ? ", " : " or ") : "",
                                  end_tags[i]);
        return expected(p, what);
    }
    if (which) *which = cur(p)->u.s.p;
    advance(p);
    return TERN_OK;
}

static enum tern_status parse_for(struct parser *p, struct node *n) {
    enum tern_status st;
    if ((st = parse_target_list(p, "in", false, &n->u.for_.target))) return st;
    if (!at_name(p, "in")) return expected(p, "'in'");
    advance(p);
    if ((st = parse_tuple(p, false, "recursive", false, &n->u.for_.iter))) return st;
    if (at_name(p, "if")) {
        advance(p);
        if ((st = parse_expression(p, true, &n->u.for_.filter))) return st;
    }
    if (at_name(p, "recursive")) {
        advance(p);
        n->flag = 1;
    }
    const char *which;
    p->loop_depth++;
    st = parse_statements(p, END_FOR, &n->u.for_.body, &which);
    p->loop_depth--;
    if (st) return st;
    if (!strcmp(which, "else")) {
        if ((st = parse_statements(p, END_FOR2, &n->u.for_.else_, NULL))) return st;
    }
    return TERN_OK;
}

static enum tern_status parse_if(struct parser *p, struct node *n) {
    enum tern_status st;
    struct vec conds = {0}, bodies = {0};
    for (;;) {
        struct node *c;
        if ((st = parse_tuple(p, false, NULL, false, &c))) return st;
        if ((st = vec_push(p, &conds, c))) return st;
        struct body *b = tern_arena_calloc(&p->t->ar, 1, sizeof *b);
        if (!b) return TERN_ERR_NOMEM;
        const char *which;
        if ((st = parse_statements(p, END_IF, b, &which))) return st;
        if ((st = vec_push(p, &bodies, b))) return st;
        if (!strcmp(which, "elif")) continue;
        if (!strcmp(which, "else")) {
            if ((st = parse_statements(p, END_IF2, &n->u.if_.else_, NULL))) return st;
        }
        break;
    }
    struct body *bs = tern_arena_alloc(&p->t->ar, bodies.n * sizeof *bs);
    if (!bs) return TERN_ERR_NOMEM;
    for (uint32_t i = 0; i < bodies.n; i++) bs[i] = *(struct body *)bodies.items[i];
    n->u.if_.conds = (struct node **)conds.items;
    n->u.if_.bodies = bs;
    n->u.if_.n = bodies.n;
    return TERN_OK;
}

static enum tern_status parse_set(struct parser *p, struct node *n) {
    enum tern_status st;
    /* ns.attr = ... */
    if (cur(p)->type == TK_NAME && peek(p, 1)->type == TK_OP && peek(p, 1)->op == OP_DOT) {
        struct target *t = tern_arena_calloc(&p->t->ar, 1, sizeof *t);
        if (!t) return TERN_ERR_NOMEM;
        bool err = false;
        t->type = TG_NSATTR;
        t->pos = cur(p)->pos;
        t->sym = sym_intern(p, cur(p)->u.s.p, &err);
        if (err) return TERN_ERR_NOMEM;
        p->t->sym_loaded[t->sym] = 1;
        t->name = p->t->syms[t->sym];
        advance(p);
        advance(p);
        if (cur(p)->type != TK_NAME) return expected(p, "an attribute name");
        t->attr = cur(p)->u.s.p;
        t->attr_len = cur(p)->u.s.n;
        advance(p);
        n->u.set.target = t;
    } else {
        if ((st = parse_target_list(p, NULL, false, &n->u.set.target))) return st;
    }
    if (is_op(p, OP_ASSIGN)) {
        advance(p);
        return parse_tuple(p, true, NULL, false, &n->u.set.expr);
    }
    n->type = S_SET_BLOCK;
    if ((st = parse_filter(p, NULL, false, &n->u.set.filters))) return st;
    return parse_statements(p, END_SET, &n->u.set.body, NULL);
}

static enum tern_status parse_signature(struct parser *p, struct node *n) {
    enum tern_status st;
    if ((st = expect_op(p, OP_LPAREN))) return st;
    struct vec names = {0}, defaults = {0};
    bool have_default = false;
    while (!is_op(p, OP_RPAREN)) {
        if (names.n && (st = expect_op(p, OP_COMMA))) return st;
        struct target *t;
        if ((st = name_target(p, &t))) return st;
        struct node *d = NULL;
        if (is_op(p, OP_ASSIGN)) {
            advance(p);
            if ((st = parse_expression(p, true, &d))) return st;
            have_default = true;
        } else if (have_default) {
            return fail_at(p, t->pos, "non-default argument '%s' follows default argument", t->name);
        }
        if ((st = vec_push(p, &names, (void *)t)) || (st = vec_push(p, &defaults, d))) return st;
    }
    advance(p);
    n->u.macro.n_params = names.n;
    if (names.n) {
        n->u.macro.params = tern_arena_alloc(&p->t->ar, names.n * sizeof(uint32_t));
        n->u.macro.param_names = tern_arena_alloc(&p->t->ar, names.n * sizeof(char *));
        if (!n->u.macro.params || !n->u.macro.param_names) return TERN_ERR_NOMEM;
        for (uint32_t i = 0; i < names.n; i++) {
            struct target *t = names.items[i];
            n->u.macro.params[i] = t->sym;
            n->u.macro.param_names[i] = t->name;
        }
    }
    n->u.macro.defaults = (struct node **)defaults.items;
    return TERN_OK;
}

static enum tern_status parse_macro_body(struct parser *p, struct node *n, const char *const *end) {
    enum tern_status st;
    if (p->n_macros >= (uint32_t)TERN_ARRAY_LEN(p->macros)) return fail_at(p, n->pos, "macros nested too deeply");
    p->macros[p->n_macros++] = n;
    uint32_t saved_loops = p->loop_depth;
    p->loop_depth = 0; /* break/continue cannot cross a macro */
    st = parse_statements(p, end, &n->u.macro.body, NULL);
    p->loop_depth = saved_loops;
    p->n_macros--;
    return st;
}

static enum tern_status parse_macro(struct parser *p, struct node *n) {
    enum tern_status st;
    struct target *t;
    if ((st = name_target(p, &t))) return st;
    n->u.macro.sym = t->sym;
    n->u.macro.name = t->name;
    if ((st = parse_signature(p, n))) return st;
    return parse_macro_body(p, n, END_MACRO);
}

static enum tern_status parse_call_block(struct parser *p, struct node *n) {
    enum tern_status st;
    if (is_op(p, OP_LPAREN) && (st = parse_signature(p, n))) return st;
    struct node *call;
    if ((st = parse_expression(p, true, &call))) return st;
    if (call->type != N_CALL) return fail_at(p, call->pos, "expected a call after 'call'");
    n->u.macro.call = call;
    n->u.macro.name = "caller";
    return parse_macro_body(p, n, END_CALL);
}

static enum tern_status parse_with(struct parser *p, struct node *n) {
    enum tern_status st;
    struct vec targets = {0}, vals = {0};
    while (cur(p)->type != TK_BLOCK_END) {
        if (targets.n && (st = expect_op(p, OP_COMMA))) return st;
        struct target *t;
        if ((st = parse_target_primary(p, &t))) return st;
        if ((st = expect_op(p, OP_ASSIGN))) return st;
        struct node *v;
        if ((st = parse_expression(p, true, &v))) return st;
        if ((st = vec_push(p, &targets, t)) || (st = vec_push(p, &vals, v))) return st;
    }
    n->u.with.targets = (struct target **)targets.items;
    n->u.with.vals = (struct node **)vals.items;
    n->u.with.n = targets.n;
    return parse_statements(p, END_WITH, &n->u.with.body, NULL);
}

static enum tern_status parse_statement(struct parser *p, struct node **out) {
    enum tern_status st;
    const struct token *tk = cur(p);
    if (tk->type != TK_NAME) return expected(p, "a tag name");
    const char *tag = tk->u.s.p;
    size_t pos = tk->pos;
    struct node *n = mk(p, S_TEXT, pos);
    if (!n) return TERN_ERR_NOMEM;
    advance(p);
    if (!strcmp(tag, "for")) {
        n->type = S_FOR;
        st = parse_for(p, n);
    } else if (!strcmp(tag, "if")) {
        n->type = S_IF;
        st = parse_if(p, n);
    } else if (!strcmp(tag, "set")) {
        n->type = S_SET;
        st = parse_set(p, n);
    } else if (!strcmp(tag, "macro")) {
        n->type = S_MACRO;
        st = parse_macro(p, n);
    } else if (!strcmp(tag, "call")) {
        n->type = S_CALL_BLOCK;
        st = parse_call_block(p, n);
    } else if (!strcmp(tag, "filter")) {
        n->type = S_FILTER_BLOCK;
        if ((st = parse_filter(p, NULL, true, &n->u.fblock.filters))) return st;
        st = parse_statements(p, END_FILTER, &n->u.fblock.body, NULL);
    } else if (!strcmp(tag, "with")) {
        n->type = S_WITH;
        st = parse_with(p, n);
    } else if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        if (!p->loop_depth) return fail_at(p, pos, "'%s' outside of a loop", tag);
        n->type = tag[0] == 'b' ? S_BREAK : S_CONTINUE;
        st = TERN_OK;
    } else if (!strcmp(tag, "include") || !strcmp(tag, "import") || !strcmp(tag, "from") ||
               !strcmp(tag, "extends") || !strcmp(tag, "block") || !strcmp(tag, "do") ||
               !strcmp(tag, "autoescape") || !strcmp(tag, "trans")) {
        return fail_at(p, pos, "tag '%s' is not supported", tag);
    } else {
        return fail_at(p, pos, "unknown tag '%s'", tag);
    }
    if (st) return st;
    *out = n;
    return TERN_OK;
}

static enum tern_status subparse(struct parser *p, const char *const *end_tags, struct body *out) {
    enum tern_status st;
    struct vec stmts = {0};
    for (;;) {
        const struct token *tk = cur(p);
        if (tk->type == TK_EOF) break;
        if (tk->type == TK_TEXT) {
            struct node *n = mk(p, S_TEXT, tk->pos);
            if (!n) return TERN_ERR_NOMEM;
            n->u.text.p = tk->u.s.p;
            n->u.text.n = tk->u.s.n;
            if ((st = vec_push(p, &stmts, n))) return st;
            advance(p);
        } else if (tk->type == TK_VAR_BEGIN) {
            advance(p);
            struct node *n = mk(p, S_OUTPUT, tk->pos);
            if (!n) return TERN_ERR_NOMEM;
            if ((st = parse_tuple(p, true, NULL, false, &n->u.expr))) return st;
            if ((st = expect_type(p, TK_VAR_END, "'}}'"))) return st;
            if ((st = vec_push(p, &stmts, n))) return st;
        } else if (tk->type == TK_BLOCK_BEGIN) {
            advance(p);
            const struct token *name = cur(p);
            if (name->type == TK_NAME && end_tags) {
                bool end = false;
                for (int i = 0; end_tags[i]; i++)
                    if (!strcmp(name->u.s.p, end_tags[i])) end = true;
                if (end) break;
            }
            if (name->type == TK_NAME && !strncmp(name->u.s.p, "end", 3) &&
                (!strcmp(name->u.s.p, "endif") || !strcmp(name->u.s.p, "endfor") || !strcmp(name->u.s.p, "endset") ||
                 !strcmp(name->u.s.p, "endmacro") || !strcmp(name->u.s.p, "endcall") ||
                 !strcmp(name->u.s.p, "endfilter") || !strcmp(name->u.s.p, "endwith") ||
                 !strcmp(name->u.s.p, "endraw")))
                return fail_at(p, name->pos, "unexpected '%s'%s", name->u.s.p,
                               end_tags ? "" : " (no block is open)");
            if (name->type == TK_NAME && (!strcmp(name->u.s.p, "else") || !strcmp(name->u.s.p, "elif")))
                return fail_at(p, name->pos, "unexpected '%s'", name->u.s.p);
            struct node *n = NULL;
            if ((st = parse_statement(p, &n))) return st;
            if ((st = expect_type(p, TK_BLOCK_END, "'%}'"))) return st;
            if ((st = vec_push(p, &stmts, n))) return st;
        } else {
            return expected(p, "template text or a tag");
        }
    }
    out->stmts = (struct node **)stmts.items;
    out->n = stmts.n;
    return TERN_OK;
}

enum tern_status tpl_parse(struct tern_template *t, const struct tpl_tokens *toks) {
    struct parser p = {0};
    p.t = t;
    p.tk = toks->t;
    p.n = toks->n;
    static const char *const fixed[SYM_N_FIXED] = {"loop", "varargs", "kwargs", "caller"};
    bool err = false;
    for (int i = 0; i < SYM_N_FIXED; i++) sym_intern(&p, fixed[i], &err);
    if (err) return TERN_ERR_NOMEM;
    enum tern_status st = subparse(&p, NULL, &t->body);
    if (st) return st;
    if (cur(&p)->type != TK_EOF) return expected(&p, "end of template");
    t->sym_builtin = tern_arena_alloc(&t->ar, (t->n_syms ? t->n_syms : 1) * sizeof(int));
    if (!t->sym_builtin) return TERN_ERR_NOMEM;
    for (uint32_t i = 0; i < t->n_syms; i++) t->sym_builtin[i] = tpl_builtin_id(t->syms[i]);
    return TERN_OK;
}
