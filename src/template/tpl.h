/* Internal declarations of the template module (not part of its API).
 *
 * Pipeline: tpl-lex.c turns the source into tokens (applying jinja2's whitespace rules),
 * tpl-parse.c builds an AST in the template's arena, tpl-eval.c walks it. Values
 * (tpl-value.c) have Python semantics; filters, tests, methods and globals live in
 * tpl-lib.c; Python's str()/repr() and json.dumps in tpl-format.c; Unicode character
 * classes in tpl-unicode.c.
 *
 * Memory: a render allocates everything (strings, lists, scopes) from one arena that is
 * freed when the render ends, so values are plain structs copied by value and never
 * reference-counted. Input JSON is never copied: lists and dicts can be views of jansson
 * nodes, strings views of jansson strings. */
#ifndef TERN_TEMPLATE_TPL_H
#define TERN_TEMPLATE_TPL_H

#include "template/template.h"
#include "util/arena.h"
#include "util/buf.h"
#include "util/utf8.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- values ----------------------------------------------------------------------- */

enum vkind {
    V_UNDEF, /* jinja2 Undefined (lenient): prints "", falsy, iterates empty */
    V_NONE,
    V_BOOL,
    V_INT,
    V_FLOAT,
    V_STR,
    V_LIST,  /* list, tuple (VF_TUPLE) or range (REP_RANGE) */
    V_DICT,
    V_NS,    /* jinja2 namespace(): the one mutable object */
    V_FUNC,  /* macro, builtin function, bound method, caller */
    V_LOOP,  /* the `loop` variable of a for loop */
    V_GEN,   /* a lazy iterator: what jinja2's map/select/unique/items/... filters return */
};

enum vrep { REP_NATIVE = 0, REP_JSON = 1, REP_RANGE = 2 };

/* flags */
#define VF_TUPLE 1 /* V_LIST: a tuple */
#define VF_SAFE 2  /* V_STR: a Markup string (from |safe, |escape) */
#define VF_VIEW 4  /* V_LIST: a dict view (dict.items(), keys(), values()); aux: enum view */

enum view { VIEW_ITEMS = 1, VIEW_KEYS, VIEW_VALUES };

/* Why a value is undefined (V_UNDEF flags): picks the jinja2 error message. */
enum undef_why {
    UW_NAME = 0, /* "'x' is undefined" (u.s = name) */
    UW_ATTR,     /* "'dict object' has no attribute 'x'" (u.s = attribute, aux = owner type) */
    UW_ITEM,     /* "list object has no element 3" (u.i = index, aux = owner type) */
    UW_KEY,      /* "'dict object' has no attribute 'k'" for a missing non-str key (u.s = repr) */
    UW_HINT,     /* a full message (u.s) */
};

/* Owner types named in undefined messages (aux). */
enum otype { OT_NONE, OT_BOOL, OT_INT, OT_FLOAT, OT_STR, OT_LIST, OT_TUPLE, OT_DICT, OT_RANGE,
             OT_NS, OT_FUNC, OT_LOOP, OT_UNDEF, OT_GEN, OT_VIEW };

struct tpl_list;
struct tpl_dict;
struct tpl_range;
struct tpl_func;
struct tpl_loop;
struct tpl_gen;
struct argv;

struct val {
    uint8_t kind;  /* enum vkind */
    uint8_t rep;   /* enum vrep (V_LIST, V_DICT) */
    uint8_t flags; /* VF_* ; V_UNDEF: enum undef_why */
    uint8_t aux;   /* V_UNDEF: enum otype of the owner */
    uint32_t taint; /* V_STR: which bytes came from the caller's variables (tpl-taint.c):
                     * 0 none, TAINT_ALL all, else 1 + an index into ctx.tmaps */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        struct tpl_list *l;
        struct tpl_dict *d; /* V_DICT native, V_NS */
        json_t *j;          /* REP_JSON */
        struct tpl_range *r;
        struct tpl_func *fn;
        struct tpl_loop *loop;
        struct tpl_gen *gen;
    } u;
};

struct tpl_list {
    size_t n;
    struct val *items;
};

/* Insertion-ordered; keys compared with Python ==. Small in practice (literals,
 * namespaces), so lookups are linear. */
struct tpl_dict {
    size_t n, cap;
    struct val *keys;
    struct val *vals;
};

/* A generator: nothing is computed (and nothing can fail) until it is iterated, it is
 * always true, has no len(), and iterating it a second time yields nothing. */
struct tpl_gen {
    const char *type_name; /* "generator", "list_reverseiterator" */
    int filter;            /* the filter that computes the items, or -1 when done */
    const char *filter_name;
    struct val input;
    struct argv *args;
    struct val items; /* V_LIST once computed */
    size_t pos;       /* items already consumed */
};

struct tpl_range {
    int64_t start, stop, step;
    int64_t n;
};

struct node;
struct scope;

enum func_type { F_MACRO, F_BUILTIN, F_METHOD, F_CALLER, F_LOOPCALL };

struct tpl_func {
    uint8_t type;
    int id;                   /* F_BUILTIN: enum builtin; F_METHOD: enum method */
    struct val self;          /* F_METHOD: bound object */
    const struct node *node;  /* F_MACRO: the macro; F_CALLER: the call block */
    struct scope *closure;    /* scope the macro / call block was defined in */
    struct tpl_loop *loop;    /* F_LOOPCALL */
    const char *name;
};

struct tpl_loop {
    int64_t index0;
    int64_t length;
    struct val seq;          /* a list value (any rep) being iterated */
    int64_t depth0;
    const struct node *node; /* the for loop (recursive loops) */
    struct scope *scope;     /* scope the loop runs in (recursive loops) */
    struct val last_changed; /* loop.changed() */
    bool has_changed;
};

#define TAINT_ALL UINT32_MAX

/* A string whose bytes came partly from the variables (a concatenation, a capture): the
 * byte ranges of base[0..n) that did, relative to base. A string value refers to it
 * while it points into base (a view made by slicing or stripping keeps it). */
struct tmap {
    const char *base;
    size_t n;
    struct tern_template_span *spans;
    size_t n_spans;
};

/* ---- lexer ------------------------------------------------------------------------ */

enum tok_type {
    TK_EOF,
    TK_TEXT,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_OP,
};

enum op {
    OP_NONE,
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_POW, OP_MOD, OP_TILDE,
    OP_LBRACKET, OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE,
    OP_EQ, OP_NE, OP_GT, OP_GE, OP_LT, OP_LE,
    OP_ASSIGN, OP_DOT, OP_COLON, OP_PIPE, OP_COMMA, OP_SEMICOLON,
    /* not tokens: AST operators */
    OP_AND, OP_OR, OP_NOT, OP_NEG, OP_POS, OP_IN, OP_NOTIN,
};

struct token {
    uint8_t type; /* enum tok_type */
    uint8_t op;   /* TK_OP: enum op */
    uint32_t pos; /* byte offset in the (newline-normalised) source */
    union {
        struct {
            const char *p;
            size_t n;
        } s; /* TK_TEXT, TK_NAME, TK_STRING (decoded, in the template arena) */
        int64_t i;
        double f;
    } u;
};

struct tpl_tokens {
    struct token *t;
    size_t n, cap;
};

/* Tokenises src (already newline-normalised, trailing newline dropped). Strings and
 * names are allocated in ar. */
enum tern_status tpl_lex(const char *src, size_t len, struct tern_arena *ar, struct tpl_tokens *out);

/* ---- AST -------------------------------------------------------------------------- */

enum node_type {
    /* expressions */
    N_CONST,
    N_NAME,
    N_GETATTR,
    N_GETITEM,
    N_SLICE,
    N_CALL,
    N_FILTER,
    N_TEST,
    N_UNARY,   /* op: OP_NEG, OP_POS, OP_NOT */
    N_BINARY,  /* op: OP_ADD..OP_MOD, OP_AND, OP_OR */
    N_COMPARE, /* chain: a < b <= c */
    N_COND,    /* a if c else b */
    N_CONCAT,  /* a ~ b ~ c */
    N_LIST,
    N_TUPLE,
    N_DICT,
    /* statements */
    S_TEXT,
    S_OUTPUT,
    S_IF,
    S_FOR,
    S_SET,
    S_SET_BLOCK,
    S_MACRO,
    S_CALL_BLOCK,
    S_FILTER_BLOCK,
    S_WITH,
    S_BREAK,
    S_CONTINUE,
};

struct body {
    struct node **stmts;
    uint32_t n;
};

enum target_type { TG_NAME, TG_TUPLE, TG_NSATTR };

struct target {
    uint8_t type;
    uint32_t sym;      /* TG_NAME, TG_NSATTR (the namespace variable) */
    const char *name;  /* TG_NAME, TG_NSATTR */
    const char *attr;  /* TG_NSATTR */
    size_t attr_len;
    struct target **items; /* TG_TUPLE */
    uint32_t n;
    uint32_t pos;
};

struct args {
    struct node **pos;
    uint32_t n_pos;
    const char **kw_names;
    size_t *kw_lens;
    struct node **kw;
    uint32_t n_kw;
};

struct node {
    uint8_t type; /* enum node_type */
    uint8_t op;   /* enum op */
    uint8_t flag; /* N_TEST: negated; S_FOR: recursive; S_MACRO: MF_* */
    uint32_t pos; /* byte offset of the construct (for error locations) */
    union {
        struct val cval; /* N_CONST */
        struct {
            uint32_t sym;
            const char *name;
        } name; /* N_NAME */
        struct {
            struct node *obj;
            const char *name;
            size_t len;
            int method; /* enum method, or -1 */
        } attr; /* N_GETATTR */
        struct {
            struct node *obj, *key;
        } item; /* N_GETITEM */
        struct {
            struct node *obj, *start, *stop, *step;
        } slice; /* N_SLICE */
        struct {
            struct node *fn;
            struct args a;
        } call; /* N_CALL */
        struct {
            struct node *arg; /* NULL: the filter block's body */
            const char *name;
            int id; /* enum filter / enum test, or -1 (unknown: fails when used) */
            struct args a;
        } filter; /* N_FILTER, N_TEST */
        struct {
            struct node *a, *b;
        } bin; /* N_UNARY (a), N_BINARY */
        struct {
            struct node *first;
            uint8_t *ops;
            struct node **rhs;
            uint32_t n;
        } cmp; /* N_COMPARE */
        struct {
            struct node *cond, *a, *b; /* b may be NULL */
        } cond;
        struct {
            struct node **items;
            struct node **vals; /* N_DICT */
            uint32_t n;
        } seq; /* N_LIST, N_TUPLE, N_DICT (items = keys), N_CONCAT */
        struct {
            const char *p;
            size_t n;
        } text; /* S_TEXT */
        struct node *expr; /* S_OUTPUT */
        struct {
            struct node **conds;
            struct body *bodies;
            uint32_t n;
            struct body else_;
        } if_;
        struct {
            struct target *target;
            struct node *iter, *filter;
            struct body body, else_;
        } for_;
        struct {
            struct target *target;
            struct node *expr;    /* S_SET */
            struct body body;     /* S_SET_BLOCK */
            struct node *filters; /* S_SET_BLOCK: filter chain applied to the body, or NULL */
        } set;
        struct {
            uint32_t sym; /* S_MACRO: the macro's name */
            const char *name;
            uint32_t *params;
            const char **param_names;
            struct node **defaults; /* per param, NULL if none */
            uint32_t n_params;
            struct body body;
            struct node *call; /* S_CALL_BLOCK: the call expression */
        } macro; /* S_MACRO, S_CALL_BLOCK (params of caller) */
        struct {
            struct node *filters; /* chain, innermost arg NULL */
            struct body body;
        } fblock;
        struct {
            struct target **targets;
            struct node **vals;
            uint32_t n;
            struct body body;
        } with;
    } u;
};

/* Macro flags */
#define MF_VARARGS 1
#define MF_KWARGS 2
#define MF_CALLER 4

/* Symbols: every variable name of a template gets a small integer. */
enum { SYM_LOOP = 0, SYM_VARARGS, SYM_KWARGS, SYM_CALLER, SYM_N_FIXED };

struct tern_template {
    struct tern_arena ar; /* AST, strings, source */
    const char *src;      /* normalised source */
    size_t src_len;
    struct body body;
    const char **syms;
    uint32_t n_syms;
    int *sym_builtin;     /* per symbol: enum builtin, or -1 */
    uint8_t *sym_loaded;  /* per symbol: read somewhere in the template */
};

/* Parses tokens into t->body (t->ar, t->src set). */
enum tern_status tpl_parse(struct tern_template *t, const struct tpl_tokens *toks);

/* Line and column (1-based, column in characters) of a byte offset. */
void tpl_line_col(const char *src, size_t len, size_t pos, unsigned *line, unsigned *col);

/* ---- render context --------------------------------------------------------------- */

struct binding {
    uint32_t sym;
    struct val v;
};

struct scope {
    struct scope *parent;
    struct binding *b;
    uint32_t n, cap;
    uint32_t *index; /* for scopes with many names: per symbol, binding position + 1 */
};

struct ctx {
    const struct tern_template *t;
    struct tern_arena ar;
    const json_t *vars;
    struct tern_buf *out;  /* where output goes now (the result or a capture buffer) */
    size_t out_start;      /* out->len when writing to it began (max_output counts from here) */
    struct tern_buf **caps; /* capture buffers, one per nesting level */
    uint32_t n_caps, cap_depth;
    struct tern_buf scratch; /* temporary formatting */
    size_t max_output;
    uint32_t max_depth, depth;
    uint64_t steps, max_steps;
    time_t (*clock)(void *user);
    void *clock_user;
    struct scope *root;
    struct scope *cur;      /* innermost scope */
    void *stack_base;       /* address near the bottom of the render's stack */
    struct val *globals;    /* per symbol: cached lookup in vars/builtins */
    uint8_t *globals_state; /* 0 = not looked up yet */
    bool located;           /* the error message already says where */
    /* marking (tern_template_render_spans): NULL when not asked for */
    struct tern_template_spans *spans;     /* the spans of what c->out holds now */
    struct tern_template_spans *cap_spans; /* per capture level, like caps */
    uint32_t n_cap_spans;
    struct tern_template_spans tmp;        /* scratch for building a tmap */
    struct tmap *tmaps;
    uint32_t n_tmaps, cap_tmaps;
    const char *const *trusted;            /* top-level names whose strings are not marked */
};

/* ---- marking (tpl-taint.c): which output bytes came from the variables ------------ */

static inline bool tpl_marking(const struct ctx *c) { return c->spans != NULL; }
/* Adds [a, b) to a span list (merged with the last one when they touch). */
enum tern_status tpl_spans_add(struct tern_template_spans *l, size_t a, size_t b);
/* Appends to l the marked ranges of string v, shifted by `at` (v's bytes start there). */
enum tern_status tpl_str_spans(struct ctx *c, struct val v, size_t at, struct tern_template_spans *l);
/* Whether any string inside v (strings, containers, namespaces) is marked; data of the
 * variables (REP_JSON) always is. */
bool tpl_tainted(struct ctx *c, struct val v);
/* The taint of a new string p[0..n) whose marked ranges are l (relative to p). */
enum tern_status tpl_taint_from_spans(struct ctx *c, const char *p, size_t n, const struct tern_template_spans *l,
                                      uint32_t *taint);
/* After an operation on inputs in[0..n) made *out: a string result (or the strings of a
 * list result) that carries no marking of its own is marked as the input it is a view
 * of, else wholly when any input is marked (conservative: a filter or method result is
 * not tracked byte by byte). */
void tpl_taint_derive(struct ctx *c, const struct val *in, size_t n, struct val *out);
/* For a+b of two strings: out marked byte by byte. */
enum tern_status tpl_taint_concat(struct ctx *c, struct val a, struct val b, struct val *out);

/* Internal status codes beyond enum tern_status (never returned by the API). */
#define ST_BREAK 1
#define ST_CONTINUE 2

/* ---- value helpers (tpl-value.c) --------------------------------------------------- */

static inline struct val v_undef(void) { struct val v = {0}; v.kind = V_UNDEF; return v; }
static inline struct val v_none(void) { struct val v = {0}; v.kind = V_NONE; return v; }
static inline struct val v_bool(bool b) { struct val v = {0}; v.kind = V_BOOL; v.u.b = b; return v; }
static inline struct val v_int(int64_t i) { struct val v = {0}; v.kind = V_INT; v.u.i = i; return v; }
static inline struct val v_float(double f) { struct val v = {0}; v.kind = V_FLOAT; v.u.f = f; return v; }
static inline struct val v_str(const char *p, size_t n) {
    struct val v = {0};
    v.kind = V_STR;
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
struct val v_undef_name(const char *name, size_t n);
struct val v_undef_attr(struct val owner, const char *name, size_t n);
struct val v_undef_item(struct val owner, int64_t idx);
struct val v_undef_hint(const char *msg);
struct val v_from_json(json_t *j);
struct val v_list(struct tpl_list *l, bool tuple);

const char *v_type_name(struct val v);   /* Python's type name: 'str', 'NoneType', ... */
int v_otype(struct val v);
bool v_truthy(struct val v);
static inline bool v_is_num(struct val v) { return v.kind == V_BOOL || v.kind == V_INT || v.kind == V_FLOAT; }
static inline bool v_is_seq(struct val v) { return v.kind == V_LIST; }

/* Lists of any representation */
size_t v_len_list(struct val v);
struct val v_list_at(struct val v, size_t i); /* i < len */
/* Dicts of any representation */
size_t v_dict_len(struct val v);
bool v_dict_get(struct ctx *c, struct val d, struct val key, struct val *out); /* false: missing */
bool v_dict_get_str(struct val d, const char *k, size_t n, struct val *out);
/* Iterates keys and values of a dict in order: *it starts at NULL / 0. */
struct dict_iter {
    void *jit;  /* jansson iterator */
    size_t i;
};
bool v_dict_next(struct val d, struct dict_iter *it, struct val *key, struct val *value);

/* Allocation in the render arena; on failure the message is set and NULL returned. */
struct tpl_list *tpl_list_new(struct ctx *c, size_t n);
struct tpl_dict *tpl_dict_new(struct ctx *c, size_t cap);
enum tern_status tpl_dict_set(struct ctx *c, struct tpl_dict *d, struct val k, struct val v);
char *tpl_alloc_str(struct ctx *c, size_t n); /* n bytes + NUL; checks max_output; NULL: see tpl_oom */
/* Status of the last failed allocation (TERN_ERR_NOMEM or TERN_ERR_LIMIT). */
static inline enum tern_status tpl_oom(struct ctx *c) { return c->ar.err ? c->ar.err : TERN_ERR_NOMEM; }
enum tern_status tpl_new_str(struct ctx *c, const char *p, size_t n, struct val *out);
enum tern_status tpl_concat2(struct ctx *c, struct val a, struct val b, struct val *out);

/* Python semantics. Errors are TERN_ERR_TEMPLATE with Python's wording. */
enum tern_status tpl_eq(struct ctx *c, struct val a, struct val b, bool *out, uint32_t depth);
enum tern_status tpl_cmp(struct ctx *c, struct val a, struct val b, int *out, uint32_t depth); /* <0,0,>0 */
enum tern_status tpl_contains(struct ctx *c, struct val container, struct val item, bool *out);
enum tern_status tpl_binop(struct ctx *c, int op, struct val a, struct val b, struct val *out);
enum tern_status tpl_unop(struct ctx *c, int op, struct val a, struct val *out);
enum tern_status tpl_undef_error(struct val u); /* UndefinedError for an operation on u */
enum tern_status tpl_getattr(struct ctx *c, struct val obj, const char *name, size_t n, int method, struct val *out);
enum tern_status tpl_getitem(struct ctx *c, struct val obj, struct val key, struct val *out);
enum tern_status tpl_slice(struct ctx *c, struct val obj, struct val start, struct val stop, struct val step,
                           struct val *out);
/* Stable sort (Python's sorted): less() may fail (mixed types). */
typedef enum tern_status (*tpl_less_fn)(struct ctx *c, const struct val *a, const struct val *b, void *user,
                                        bool *less);
enum tern_status tpl_sort(struct ctx *c, struct val *items, size_t n, tpl_less_fn less, void *user);
/* a OP b for <, <=, >, >= */
enum tern_status tpl_compare_op(struct ctx *c, int op, struct val a, struct val b, bool *out);
enum tern_status tpl_html_escape(struct ctx *c, struct val s, struct val *out);
enum tern_status tpl_str_percent(struct ctx *c, struct val fmt, struct val args, struct val *out);
/* A list value holding the items a for loop / filter iterates (dict keys, string
 * characters, list items); undefined iterates as empty. */
enum tern_status tpl_iterable(struct ctx *c, struct val v, struct val *out);

/* ---- formatting (tpl-format.c) ----------------------------------------------------- */

/* Python str(v) appended to b. */
enum tern_status tpl_fmt_str(struct ctx *c, struct tern_buf *b, struct val v, uint32_t depth);
/* Python repr(v) */
enum tern_status tpl_fmt_repr(struct ctx *c, struct tern_buf *b, struct val v, uint32_t depth);
/* str(v) as a value (strings returned as is). */
enum tern_status tpl_to_str(struct ctx *c, struct val v, struct val *out);
void tpl_fmt_float(char *buf, size_t size, double f); /* Python repr of a float */

struct json_opts {
    bool ensure_ascii;
    bool sort_keys;
    bool indent_set;
    const char *indent; /* indent string when indent_set */
    size_t indent_len;
    const char *item_sep, *key_sep;
    size_t item_sep_len, key_sep_len;
};
enum tern_status tpl_fmt_json(struct ctx *c, struct tern_buf *b, struct val v, const struct json_opts *o,
                              uint32_t depth, size_t level);

/* ---- Unicode (tpl-unicode.c) ------------------------------------------------------- */

/* Decodes one code point of valid UTF-8 at p (n > 0 bytes left); *len gets its size. */
uint32_t utf8_decode(const char *p, size_t n, size_t *len);
/* Encodes a code point (<= U+10FFFF); out has room for 4. */
static inline size_t utf8_encode(uint32_t cp, char *out) { return tern_utf8_encode(cp, out); }
size_t utf8_count(const char *p, size_t n);  /* code points */
/* The longest prefix of p[0..n) of at most max bytes that ends on a character boundary. */
size_t utf8_clip(const char *p, size_t n, size_t max);
/* Cuts a NUL-terminated string before an incomplete final character (after snprintf). */
void utf8_trim_partial(char *s);
bool uc_isspace(uint32_t cp);
bool uc_isprintable(uint32_t cp);
bool uc_isalpha(uint32_t cp);
bool uc_isdigit(uint32_t cp);    /* str.isdigit */
bool uc_isdecimal(uint32_t cp);  /* str.isdecimal */
bool uc_isnumeric(uint32_t cp);  /* str.isnumeric (approximate: decimal + digit) */
bool uc_islower(uint32_t cp);
bool uc_isupper(uint32_t cp);
/* Case mapping: writes up to 3 code points, returns how many. */
int uc_toupper(uint32_t cp, uint32_t out[3]);
int uc_tolower(uint32_t cp, uint32_t out[3]);
int uc_totitle(uint32_t cp, uint32_t out[3]);
bool uc_iscased(uint32_t cp);
bool uc_is_case_ignorable(uint32_t cp);
static inline size_t utf8_seqlen(unsigned char b) {
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

/* ---- library (tpl-lib.c) ----------------------------------------------------------- */

enum builtin { B_RANGE, B_DICT, B_NAMESPACE, B_RAISE_EXCEPTION, B_STRFTIME_NOW, B_COUNT };
int tpl_builtin_id(const char *name);
int tpl_filter_id(const char *name);
int tpl_test_id(const char *name);
int tpl_method_id(const char *name, size_t n);

/* Evaluated arguments of a call. */
struct argv {
    struct val *pos;
    uint32_t n_pos;
    const char **kw_names;
    size_t *kw_lens;
    struct val *kw;
    uint32_t n_kw;
};

enum tern_status tpl_call_builtin(struct ctx *c, int id, const struct argv *a, struct val *out);
enum tern_status tpl_call_method(struct ctx *c, struct val self, int method, const char *name,
                                 const struct argv *a, struct val *out);
/* Is `name` a method of self's type? Sets *is_safe false for sandbox-blocked ones. */
bool tpl_has_method(struct val self, int method, bool *is_safe);
/* Helpers shared by tpl-lib.c and tpl-filters.c */
enum casemode { CM_UPPER, CM_LOWER, CM_TITLE, CM_CAPITALIZE, CM_SWAPCASE };
enum tern_status tpl_bind_args(const char *fname, const struct argv *a, const char *const *names, uint32_t n,
                               struct val *vals, bool *set);
enum tern_status tpl_strip(struct ctx *c, struct val s, const struct val *chars, int mode, struct val *out);
enum tern_status tpl_case(struct ctx *c, struct val s, int mode, struct val *out);
enum tern_status tpl_splitlines(struct ctx *c, struct val s, bool keepends, struct val *out);
enum tern_status tpl_replace(struct ctx *c, struct val s, struct val old, struct val new_, int64_t count,
                             struct val *out);
enum tern_status tpl_dict_items(struct ctx *c, struct val d, int which, struct val *out);
enum tern_status tpl_str_format(struct ctx *c, struct val fmt, const struct argv *a, struct val *out);
/* The filter's result computed now (generator filters included). */
enum tern_status tpl_filter_eager(struct ctx *c, int id, const char *name, struct val in, const struct argv *a,
                                  struct val *out);
enum tern_status tpl_apply_filter(struct ctx *c, int id, const char *name, struct val in, const struct argv *a,
                                  struct val *out);
enum tern_status tpl_apply_test(struct ctx *c, int id, const char *name, struct val in, const struct argv *a,
                                bool *out);
/* Loop attributes (loop.index ...). */
enum tern_status tpl_loop_attr(struct ctx *c, struct val loop, const char *name, size_t n, struct val *out);

/* ---- evaluator (tpl-eval.c) -------------------------------------------------------- */

enum tern_status tpl_call_value(struct ctx *c, struct val fn, const struct argv *a, struct val *out);
/* loop(...) of a recursive for loop, as a callable value. */
enum tern_status tpl_loop_call_value(struct ctx *c, struct tpl_loop *loop, struct val *out);
/* Runs the template body (c fully set up). */
enum tern_status tpl_render(struct ctx *c);
enum tern_status tpl_step(struct ctx *c, uint64_t n);
/* Fails (TERN_ERR_LIMIT) when the render's C stack use exceeds its budget. */
enum tern_status tpl_stack_check(struct ctx *c);
/* For recursive walks over data: a stack check every 16 levels. */
static inline enum tern_status tpl_depth_check(struct ctx *c, uint32_t depth) {
    if (depth > c->max_depth)
        return tern_errorf(TERN_ERR_LIMIT, "data nested deeper than max_depth (%u)", c->max_depth);
    return (depth & 15) == 15 ? tpl_stack_check(c) : TERN_OK;
}
/* Steps for work proportional to the size of a value (scanning, copying): one per 256
 * bytes, so that repeating a cheap-looking operation on a huge string is bounded too. */
static inline enum tern_status tpl_charge(struct ctx *c, size_t bytes) {
    return bytes >= 256 ? tpl_step(c, bytes / 256) : TERN_OK;
}
/* Errors with a location prefix "line L:C: " for the node at pos. */
enum tern_status tpl_errorf(struct ctx *c, enum tern_status st, const char *fmt, ...) TERN_PRINTF(3, 4);

#endif
