/* Tree-walking evaluator.
 *
 * Scoping follows jinja2: a for loop's body gets a fresh scope on every iteration
 * (assignments inside do not leak out, which is why templates use namespace()); a
 * macro runs in a scope whose parent is the scope it was defined in (it sees the
 * template's top-level variables as they are when it is called, not the caller's
 * loop variables); `if` creates no scope. Name lookup: scopes, then the render
 * variables, then the globals (range, namespace, raise_exception ...).
 *
 * Every statement and expression evaluated counts as a step (max_steps); macro calls
 * count towards max_depth; output and every string built are bounded by max_output;
 * and a stack budget backs these up, so no template can run away. */
#include "template/tpl.h"

#include "util/mem.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of C stack a render may use below its entry point. The parser bounds nesting
 * and max_depth bounds macro recursion; this is the backstop for their product. */
#define STACK_BUDGET ((size_t)1 << 20)

static enum tern_status eval(struct ctx *c, const struct node *n, struct val *out);
static enum tern_status exec_body(struct ctx *c, const struct body *b);

enum tern_status tpl_step(struct ctx *c, uint64_t n) {
    c->steps += n;
    if (c->steps > c->max_steps)
        return tern_errorf(TERN_ERR_LIMIT, "the template ran more than max_steps (%llu) steps",
                           (unsigned long long)c->max_steps);
    return TERN_OK;
}

enum tern_status tpl_stack_check(struct ctx *c) {
    char here;
    uintptr_t a = (uintptr_t)&here, b = (uintptr_t)c->stack_base;
    size_t used = a < b ? b - a : a - b;
    if (used > STACK_BUDGET)
        return tern_errorf(TERN_ERR_LIMIT, "template recursion exceeds the stack budget (%zu bytes)", STACK_BUDGET);
    return TERN_OK;
}

enum tern_status tpl_errorf(struct ctx *c, enum tern_status st, const char *fmt, ...) {
    (void)c;
    va_list ap;
    va_start(ap, fmt);
    tern_verrorf(st, fmt, ap);
    va_end(ap);
    return st;
}

static enum tern_status locate(struct ctx *c, uint32_t pos, enum tern_status st) {
    if (st < 0 && !c->located) {
        unsigned line, col;
        tpl_line_col(c->t->src, c->t->src_len, pos, &line, &col);
        tern_error_prefix(st, "line %u:%u", line, col);
        c->located = true;
    }
    return st;
}

/* ---- scopes ----------------------------------------------------------------------- */

static struct scope *scope_new(struct ctx *c, struct scope *parent) {
    struct scope *s = tern_arena_calloc(&c->ar, 1, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

/* Small scopes are searched linearly; past SCOPE_INDEX_AT names a scope gets an index by
 * symbol, so a template with thousands of variables still looks them up in O(1). */
#define SCOPE_INDEX_AT 16

static enum tern_status bind(struct ctx *c, struct scope *s, uint32_t sym, struct val v) {
    if (s->index) {
        if (s->index[sym]) {
            s->b[s->index[sym] - 1].v = v;
            return TERN_OK;
        }
    } else {
        for (uint32_t i = 0; i < s->n; i++) {
            if (s->b[i].sym == sym) {
                s->b[i].v = v;
                return TERN_OK;
            }
        }
    }
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 8;
        struct binding *b = tern_arena_grow(&c->ar, s->b, s->cap * sizeof *b, cap * sizeof *b);
        if (!b) return tpl_oom(c);
        s->b = b;
        s->cap = cap;
    }
    s->b[s->n].sym = sym;
    s->b[s->n].v = v;
    s->n++;
    if (s->index) {
        s->index[sym] = s->n;
    } else if (s->n > SCOPE_INDEX_AT) {
        s->index = tern_arena_calloc(&c->ar, c->t->n_syms, sizeof *s->index);
        if (!s->index) return tpl_oom(c);
        for (uint32_t i = 0; i < s->n; i++) s->index[s->b[i].sym] = i + 1;
    }
    return TERN_OK;
}

/* Empties a scope for reuse (each loop iteration starts fresh). */
static void scope_reset(struct scope *s) {
    if (s->index)
        for (uint32_t i = 0; i < s->n; i++) s->index[s->b[i].sym] = 0;
    s->n = 0;
}

static struct val builtin_value(struct ctx *c, int id, const char *name, enum tern_status *st) {
    struct tpl_func *fn = tern_arena_calloc(&c->ar, 1, sizeof *fn);
    struct val v = v_undef();
    if (!fn) {
        *st = tpl_oom(c);
        return v;
    }
    fn->type = F_BUILTIN;
    fn->id = id;
    fn->name = name;
    v.kind = V_FUNC;
    v.u.fn = fn;
    return v;
}

static enum tern_status lookup(struct ctx *c, uint32_t sym, struct val *out) {
    for (struct scope *s = c->cur; s; s = s->parent) {
        if (s->index) {
            if (s->index[sym]) {
                *out = s->b[s->index[sym] - 1].v;
                return TERN_OK;
            }
            continue;
        }
        for (uint32_t i = s->n; i-- > 0;) {
            if (s->b[i].sym == sym) {
                *out = s->b[i].v;
                return TERN_OK;
            }
        }
    }
    if (c->globals_state[sym]) {
        *out = c->globals[sym];
        return TERN_OK;
    }
    const char *name = c->t->syms[sym];
    json_t *j = c->vars ? json_object_get(c->vars, name) : NULL;
    struct val v;
    enum tern_status st = TERN_OK;
    if (j) {
        v = v_from_json(j);
        for (const char *const *t = c->trusted; t && *t && v.kind == V_STR; t++)
            if (!strcmp(*t, name)) v.taint = 0;
    } else if (c->t->sym_builtin[sym] >= 0) {
        v = builtin_value(c, c->t->sym_builtin[sym], name, &st);
        if (st) return st;
    } else {
        v = v_undef_name(name, strlen(name));
    }
    c->globals[sym] = v;
    c->globals_state[sym] = 1;
    *out = v;
    return TERN_OK;
}

static enum tern_status assign(struct ctx *c, const struct target *t, struct val v) {
    enum tern_status st;
    switch (t->type) {
    case TG_NAME: return bind(c, c->cur, t->sym, v);
    case TG_NSATTR: {
        struct val ns;
        if ((st = lookup(c, t->sym, &ns))) return st;
        if (ns.kind != V_NS) return locate(c, t->pos, tern_errorf(TERN_ERR_TEMPLATE, "cannot assign attribute on non-namespace object"));
        struct val key = v_str(t->attr, t->attr_len);
        return tpl_dict_set(c, ns.u.d, key, v);
    }
    case TG_TUPLE: {
        struct val seq;
        if (v.kind == V_UNDEF) return locate(c, t->pos, tern_errorf(TERN_ERR_TEMPLATE, "cannot unpack an undefined value"));
        if ((st = tpl_iterable(c, v, &seq))) return locate(c, t->pos, st);
        size_t n = v_len_list(seq);
        if (n != t->n)
            return locate(c, t->pos, n > t->n ? tern_errorf(TERN_ERR_TEMPLATE, "too many values to unpack (expected %u)", t->n)
                                              : tern_errorf(TERN_ERR_TEMPLATE, "not enough values to unpack (expected %u, got %zu)", t->n, n));
        for (uint32_t i = 0; i < t->n; i++)
            if ((st = assign(c, t->items[i], v_list_at(seq, i)))) return st;
        return TERN_OK;
    }
    default: return TERN_ERR_INTERNAL;
    }
}

/* ---- output ----------------------------------------------------------------------- */

static enum tern_status emit(struct ctx *c, const char *p, size_t n) {
    if (c->out->len - c->out_start + n > c->max_output)
        return tern_errorf(TERN_ERR_LIMIT, "template output exceeds max_output (%zu bytes)", c->max_output);
    return tern_buf_append(c->out, p, n);
}

/* A string to the output, its marks with it. */
static enum tern_status emit_str(struct ctx *c, struct val v) {
    size_t at = c->out->len;
    enum tern_status st = emit(c, v.u.s.p, v.u.s.n);
    if (!st && tpl_marking(c)) st = tpl_str_spans(c, v, at, c->spans);
    return st;
}

static enum tern_status emit_val(struct ctx *c, struct val v) {
    if (v.kind == V_STR) return emit_str(c, v);
    if (v.kind == V_UNDEF) return TERN_OK;
    size_t before = c->out->len;
    enum tern_status st = tpl_fmt_str(c, c->out, v, 0);
    if (st == TERN_OK && c->out->len - c->out_start > c->max_output) {
        c->out->len = before;
        c->out->data[before] = 0;
        return tern_errorf(TERN_ERR_LIMIT, "template output exceeds max_output (%zu bytes)", c->max_output);
    }
    /* the printed form of data that holds marked strings is marked as a whole */
    if (!st && tpl_marking(c) && tpl_tainted(c, v)) st = tpl_spans_add(c->spans, before, c->out->len);
    return st;
}

struct capture {
    struct tern_buf *out;
    size_t out_start;
    struct tern_template_spans *spans;
};

static enum tern_status capture_begin(struct ctx *c, struct capture *save) {
    if (c->cap_depth == c->n_caps) {
        struct tern_buf **caps = tern_reallocarray(c->caps, c->n_caps + 8, sizeof *caps);
        if (!caps) return tern_errorf(TERN_ERR_NOMEM, "cannot allocate capture buffers");
        c->caps = caps;
        for (uint32_t i = 0; i < 8; i++) {
            caps[c->n_caps + i] = tern_calloc(1, sizeof(struct tern_buf));
            if (!caps[c->n_caps + i]) {
                c->n_caps += i;
                return tern_errorf(TERN_ERR_NOMEM, "cannot allocate capture buffers");
            }
        }
        c->n_caps += 8;
    }
    save->out = c->out;
    save->out_start = c->out_start;
    save->spans = c->spans;
    if (tpl_marking(c)) {
        if (c->cap_depth >= c->n_cap_spans) {
            uint32_t nc = c->n_caps;
            struct tern_template_spans *cs = tern_reallocarray(c->cap_spans, nc, sizeof *cs);
            if (!cs) return tern_errorf(TERN_ERR_NOMEM, "cannot allocate capture buffers");
            memset(cs + c->n_cap_spans, 0, (nc - c->n_cap_spans) * sizeof *cs);
            c->cap_spans = cs;
            c->n_cap_spans = nc;
        }
        c->spans = &c->cap_spans[c->cap_depth];
        c->spans->n = 0;
    }
    struct tern_buf *b = c->caps[c->cap_depth++];
    tern_buf_clear(b);
    c->out = b;
    c->out_start = 0;
    return TERN_OK;
}

/* Ends a capture; *out (if not NULL) gets what was written as a string. */
static enum tern_status capture_end(struct ctx *c, struct capture *save, struct val *out) {
    struct tern_buf *b = c->out;
    struct tern_template_spans *marks = c->spans;
    c->out = save->out;
    c->out_start = save->out_start;
    c->spans = save->spans;
    c->cap_depth--;
    if (!out) return TERN_OK;
    enum tern_status st = tpl_new_str(c, b->data ? b->data : "", b->len, out);
    if (!st && tpl_marking(c)) st = tpl_taint_from_spans(c, out->u.s.p, out->u.s.n, marks, &out->taint);
    return st;
}

/* ---- calls ------------------------------------------------------------------------ */

#define SMALL_ARGS 8

static enum tern_status eval_args(struct ctx *c, const struct args *a, struct argv *av, struct val *pos_buf,
                                  struct val *kw_buf) {
    enum tern_status st;
    av->n_pos = a->n_pos;
    av->n_kw = a->n_kw;
    av->kw_names = a->kw_names;
    av->kw_lens = a->kw_lens;
    av->pos = pos_buf;
    av->kw = kw_buf;
    if (a->n_pos > SMALL_ARGS) {
        av->pos = tern_arena_alloc(&c->ar, a->n_pos * sizeof(struct val));
        if (!av->pos) return tpl_oom(c);
    }
    if (a->n_kw > SMALL_ARGS) {
        av->kw = tern_arena_alloc(&c->ar, a->n_kw * sizeof(struct val));
        if (!av->kw) return tpl_oom(c);
    }
    for (uint32_t i = 0; i < a->n_pos; i++)
        if ((st = eval(c, a->pos[i], &av->pos[i]))) return st;
    for (uint32_t i = 0; i < a->n_kw; i++)
        if ((st = eval(c, a->kw[i], &av->kw[i]))) return st;
    return TERN_OK;
}

/* Runs a macro (or a call block's body, for caller()) with bound arguments. */
static enum tern_status call_macro(struct ctx *c, const struct tpl_func *fn, const struct argv *a, struct val *out) {
    enum tern_status st;
    const struct node *m = fn->node;
    const char *name = m->type == S_MACRO ? m->u.macro.name : "caller";
    if (c->depth >= c->max_depth)
        return tern_errorf(TERN_ERR_LIMIT, "macro calls nested deeper than max_depth (%u)", c->max_depth);
    if ((st = tpl_stack_check(c))) return st;
    struct scope *s = scope_new(c, fn->closure);
    if (!s) return tpl_oom(c);
    uint32_t np = m->u.macro.n_params;
    uint8_t flags = m->flag;
    bool *have = np ? tern_arena_calloc(&c->ar, np, sizeof(bool)) : NULL;
    if (np && !have) return tpl_oom(c);
    for (uint32_t i = 0; i < a->n_pos && i < np; i++) {
        if ((st = bind(c, s, m->u.macro.params[i], a->pos[i]))) return st;
        have[i] = true;
    }
    if (a->n_pos > np && !(flags & MF_VARARGS))
        return tern_errorf(TERN_ERR_TEMPLATE, "macro '%s' takes not more than %u argument(s)", name, np);
    struct tpl_dict *kwargs = NULL;
    if (flags & MF_KWARGS) {
        if (!(kwargs = tpl_dict_new(c, 0))) return tpl_oom(c);
    }
    bool have_caller = false;
    for (uint32_t k = 0; k < a->n_kw; k++) {
        const char *kn = a->kw_names[k];
        uint32_t i;
        for (i = 0; i < np; i++)
            if (!strcmp(m->u.macro.param_names[i], kn)) break;
        if (i < np) {
            if (have[i]) return tern_errorf(TERN_ERR_TEMPLATE, "macro '%s' got multiple values for argument '%s'", name, kn);
            if ((st = bind(c, s, m->u.macro.params[i], a->kw[k]))) return st;
            have[i] = true;
        } else if (!strcmp(kn, "caller") && a->kw[k].kind == V_FUNC && a->kw[k].u.fn->type == F_CALLER) {
            if ((st = bind(c, s, SYM_CALLER, a->kw[k]))) return st;
            have_caller = true;
        } else if (kwargs) {
            if ((st = tpl_dict_set(c, kwargs, v_str(kn, a->kw_lens[k]), a->kw[k]))) return st;
        } else {
            return tern_errorf(TERN_ERR_TEMPLATE, "macro '%s' takes no keyword argument '%s'", name, kn);
        }
    }
    if (flags & MF_VARARGS) {
        uint32_t extra = a->n_pos > np ? a->n_pos - np : 0;
        struct tpl_list *l = tpl_list_new(c, extra);
        if (!l) return tpl_oom(c);
        for (uint32_t i = 0; i < extra; i++) l->items[i] = a->pos[np + i];
        if ((st = bind(c, s, SYM_VARARGS, v_list(l, true)))) return st;
    }
    if (kwargs) {
        struct val kv = {0};
        kv.kind = V_DICT;
        kv.u.d = kwargs;
        if ((st = bind(c, s, SYM_KWARGS, kv))) return st;
    }
    if ((flags & MF_CALLER) && !have_caller && m->type == S_MACRO) {
        if ((st = bind(c, s, SYM_CALLER, v_undef_hint("the macro was not called from a call block")))) return st;
    }
    struct scope *saved = c->cur;
    c->cur = s;
    c->depth++;
    /* defaults are evaluated in the macro's scope: they may use earlier parameters */
    for (uint32_t i = 0; i < np; i++) {
        if (have[i]) continue;
        struct val v;
        if (m->u.macro.defaults && m->u.macro.defaults[i]) {
            if ((st = eval(c, m->u.macro.defaults[i], &v))) goto out;
        } else {
            char *hint = tern_arena_alloc(&c->ar, strlen(m->u.macro.param_names[i]) + 40);
            if (!hint) {
                st = tpl_oom(c);
                goto out;
            }
            sprintf(hint, "parameter '%s' was not provided", m->u.macro.param_names[i]);
            v = v_undef_hint(hint);
        }
        if ((st = bind(c, s, m->u.macro.params[i], v))) goto out;
    }
    struct capture cap;
    if ((st = capture_begin(c, &cap))) goto out;
    st = exec_body(c, &m->u.macro.body);
    if (st > 0) st = TERN_OK; /* cannot happen: the parser keeps break/continue inside loops */
    enum tern_status st2 = capture_end(c, &cap, st ? NULL : out);
    if (!st) st = st2;
out:
    c->depth--;
    c->cur = saved;
    return st;
}

static enum tern_status run_for(struct ctx *c, const struct node *n, struct val seq, int64_t depth0);

enum tern_status tpl_call_value(struct ctx *c, struct val fn, const struct argv *a, struct val *out) {
    if (fn.kind == V_UNDEF) return tpl_undef_error(fn);
    if (fn.kind == V_LOOP) {
        enum tern_status st = tpl_loop_call_value(c, fn.u.loop, &fn);
        if (st) return st;
        if (fn.kind == V_UNDEF) return tpl_undef_error(fn);
    }
    if (fn.kind != V_FUNC) return tern_errorf(TERN_ERR_TEMPLATE, "'%s' object is not callable", v_type_name(fn));
    const struct tpl_func *f = fn.u.fn;
    switch (f->type) {
    case F_MACRO:
    case F_CALLER: return call_macro(c, f, a, out);
    case F_BUILTIN: return tpl_call_builtin(c, f->id, a, out);
    case F_METHOD: return tpl_call_method(c, f->self, f->id, f->name, a, out);
    case F_LOOPCALL: {
        if (a->n_pos != 1 || a->n_kw)
            return tern_errorf(TERN_ERR_TEMPLATE, "loop() takes exactly one argument (the items to recurse into)");
        struct val seq;
        enum tern_status st = tpl_iterable(c, a->pos[0], &seq);
        if (st) return st;
        if (c->depth >= c->max_depth)
            return tern_errorf(TERN_ERR_LIMIT, "recursive loop nested deeper than max_depth (%u)", c->max_depth);
        struct capture cap;
        if ((st = capture_begin(c, &cap))) return st;
        struct scope *saved = c->cur;
        c->cur = f->loop->scope;
        c->depth++;
        st = run_for(c, f->loop->node, seq, f->loop->depth0 + 1);
        c->depth--;
        c->cur = saved;
        enum tern_status st2 = capture_end(c, &cap, st ? NULL : out);
        return st ? st : st2;
    }
    default: return tern_errorf(TERN_ERR_INTERNAL, "bad function type %d", f->type);
    }
}

/* The marking of a filter's, method's or builtin's result from self and the arguments. */
static void derive_call(struct ctx *c, const struct val *self, const struct argv *a, struct val *out) {
    if (!tpl_marking(c)) return;
    struct val small[SMALL_ARGS * 2 + 1];
    size_t n = 1 + a->n_pos + a->n_kw;
    struct val *in = n <= TERN_ARRAY_LEN(small) ? small : tern_arena_alloc(&c->ar, n * sizeof *in);
    if (!in) {
        if (out->kind == V_STR && !out->taint) out->taint = TAINT_ALL; /* cannot tell: mark it */
        return;
    }
    size_t k = 0;
    in[k++] = self ? *self : v_none();
    for (uint32_t i = 0; i < a->n_pos; i++) in[k++] = a->pos[i];
    for (uint32_t i = 0; i < a->n_kw; i++) in[k++] = a->kw[i];
    tpl_taint_derive(c, in, k, out);
}

static enum tern_status eval_call(struct ctx *c, const struct node *n, const struct val *caller, struct val *out) {
    enum tern_status st;
    const struct node *fnode = n->u.call.fn;
    struct val pos_buf[SMALL_ARGS], kw_buf[SMALL_ARGS + 1];
    struct argv av;
    /* obj.method(...): dispatch directly without materialising a bound method */
    if (fnode->type == N_GETATTR && fnode->u.attr.method >= 0 && !caller) {
        struct val obj;
        if ((st = eval(c, fnode->u.attr.obj, &obj))) return st;
        bool safe;
        if (obj.kind != V_UNDEF && obj.kind != V_NS && obj.kind != V_LOOP &&
            tpl_has_method(obj, fnode->u.attr.method, &safe) && safe) {
            if ((st = eval_args(c, &n->u.call.a, &av, pos_buf, kw_buf))) return st;
            st = locate(c, fnode->pos, tpl_call_method(c, obj, fnode->u.attr.method, fnode->u.attr.name, &av, out));
            if (!st) derive_call(c, &obj, &av, out);
            return st;
        }
        struct val fn;
        if ((st = tpl_getattr(c, obj, fnode->u.attr.name, fnode->u.attr.len, fnode->u.attr.method, &fn)))
            return locate(c, fnode->pos, st);
        if ((st = eval_args(c, &n->u.call.a, &av, pos_buf, kw_buf))) return st;
        if ((st = tpl_call_value(c, fn, &av, out))) return st;
        if (fn.kind == V_FUNC && (fn.u.fn->type == F_METHOD || fn.u.fn->type == F_BUILTIN))
            derive_call(c, fn.u.fn->type == F_METHOD ? &fn.u.fn->self : NULL, &av, out);
        return TERN_OK;
    }
    struct val fn;
    if ((st = eval(c, fnode, &fn))) return st;
    if ((st = eval_args(c, &n->u.call.a, &av, pos_buf, kw_buf))) return st;
    if (caller) {
        /* {% call %}: the macro gets caller= as an extra keyword argument */
        struct args a2 = n->u.call.a;
        const char **names = tern_arena_alloc(&c->ar, (a2.n_kw + 1) * sizeof *names);
        size_t *lens = tern_arena_alloc(&c->ar, (a2.n_kw + 1) * sizeof *lens);
        struct val *kws = tern_arena_alloc(&c->ar, (a2.n_kw + 1) * sizeof *kws);
        if (!names || !lens || !kws) return tpl_oom(c);
        for (uint32_t i = 0; i < a2.n_kw; i++) {
            names[i] = av.kw_names[i];
            lens[i] = av.kw_lens[i];
            kws[i] = av.kw[i];
        }
        names[a2.n_kw] = "caller";
        lens[a2.n_kw] = 6;
        kws[a2.n_kw] = *caller;
        av.kw_names = names;
        av.kw_lens = lens;
        av.kw = kws;
        av.n_kw = a2.n_kw + 1;
    }
    if ((st = tpl_call_value(c, fn, &av, out))) return st;
    /* a macro's result is its captured output, marked byte by byte already */
    if (fn.kind == V_FUNC && (fn.u.fn->type == F_METHOD || fn.u.fn->type == F_BUILTIN))
        derive_call(c, fn.u.fn->type == F_METHOD ? &fn.u.fn->self : NULL, &av, out);
    return TERN_OK;
}

/* ---- expressions ------------------------------------------------------------------ */

static enum tern_status apply_filter_node(struct ctx *c, const struct node *f, struct val in, struct val *out) {
    enum tern_status st;
    struct val pos_buf[SMALL_ARGS], kw_buf[SMALL_ARGS];
    struct argv av;
    if ((st = eval_args(c, &f->u.filter.a, &av, pos_buf, kw_buf))) return st;
    if ((st = locate(c, f->pos, tpl_apply_filter(c, f->u.filter.id, f->u.filter.name, in, &av, out)))) return st;
    derive_call(c, &in, &av, out);
    return TERN_OK;
}

/* A filter chain whose innermost argument is `base` (filter blocks, set blocks). */
static enum tern_status apply_chain(struct ctx *c, const struct node *f, struct val base, struct val *out) {
    struct val in = base;
    enum tern_status st;
    if (f->u.filter.arg && (st = apply_chain(c, f->u.filter.arg, base, &in))) return st;
    return apply_filter_node(c, f, in, out);
}

static enum tern_status eval_compare(struct ctx *c, const struct node *n, struct val *out) {
    enum tern_status st;
    struct val left;
    if ((st = eval(c, n->u.cmp.first, &left))) return st;
    bool res = true;
    for (uint32_t i = 0; i < n->u.cmp.n; i++) {
        struct val right;
        if ((st = eval(c, n->u.cmp.rhs[i], &right))) return st;
        int op = n->u.cmp.ops[i];
        switch (op) {
        case OP_EQ:
        case OP_NE:
            if ((st = tpl_eq(c, left, right, &res, 0))) return st;
            if (op == OP_NE) res = !res;
            break;
        case OP_IN:
        case OP_NOTIN:
            if ((st = tpl_contains(c, right, left, &res))) return st;
            if (op == OP_NOTIN) res = !res;
            break;
        default:
            if ((st = tpl_compare_op(c, op, left, right, &res))) return st;
            break;
        }
        if (!res) break;
        left = right;
    }
    *out = v_bool(res);
    return TERN_OK;
}

static enum tern_status eval_concat(struct ctx *c, const struct node *n, struct val *out) {
    enum tern_status st;
    struct tern_buf *b = &c->scratch;
    struct val parts[16];
    struct val *vals = parts;
    if (n->u.seq.n > 16) {
        vals = tern_arena_alloc(&c->ar, n->u.seq.n * sizeof *vals);
        if (!vals) return tpl_oom(c);
    }
    for (uint32_t i = 0; i < n->u.seq.n; i++)
        if ((st = eval(c, n->u.seq.items[i], &vals[i]))) return st;
    tern_buf_clear(b);
    bool mark = tpl_marking(c);
    if (mark) c->tmp.n = 0;
    for (uint32_t i = 0; i < n->u.seq.n; i++) {
        size_t at = b->len;
        if ((st = tpl_fmt_str(c, b, vals[i], 0))) return st;
        if (!mark) continue;
        if (vals[i].kind == V_STR) st = tpl_str_spans(c, vals[i], at, &c->tmp);
        else if (tpl_tainted(c, vals[i])) st = tpl_spans_add(&c->tmp, at, b->len);
        if (st) return st;
    }
    if ((st = tpl_new_str(c, b->data ? b->data : "", b->len, out))) return st;
    return mark ? tpl_taint_from_spans(c, out->u.s.p, out->u.s.n, &c->tmp, &out->taint) : TERN_OK;
}

static enum tern_status eval_inner(struct ctx *c, const struct node *n, struct val *out) {
    enum tern_status st;
    switch (n->type) {
    case N_CONST: *out = n->u.cval; return TERN_OK;
    case N_NAME: return lookup(c, n->u.name.sym, out);
    case N_GETATTR: {
        struct val obj;
        if ((st = eval(c, n->u.attr.obj, &obj))) return st;
        return tpl_getattr(c, obj, n->u.attr.name, n->u.attr.len, n->u.attr.method, out);
    }
    case N_GETITEM: {
        struct val obj, key;
        if ((st = eval(c, n->u.item.obj, &obj)) || (st = eval(c, n->u.item.key, &key))) return st;
        if ((st = tpl_getitem(c, obj, key, out))) return st;
        tpl_taint_derive(c, &obj, 1, out);
        return TERN_OK;
    }
    case N_SLICE: {
        struct val obj, a = v_none(), b = v_none(), s = v_none();
        if ((st = eval(c, n->u.slice.obj, &obj))) return st;
        if (n->u.slice.start && (st = eval(c, n->u.slice.start, &a))) return st;
        if (n->u.slice.stop && (st = eval(c, n->u.slice.stop, &b))) return st;
        if (n->u.slice.step && (st = eval(c, n->u.slice.step, &s))) return st;
        if ((st = tpl_slice(c, obj, a, b, s, out))) return st;
        tpl_taint_derive(c, &obj, 1, out);
        return TERN_OK;
    }
    case N_CALL: return eval_call(c, n, NULL, out);
    case N_FILTER: {
        struct val in;
        if ((st = eval(c, n->u.filter.arg, &in))) return st;
        return apply_filter_node(c, n, in, out);
    }
    case N_TEST: {
        struct val in;
        if ((st = eval(c, n->u.filter.arg, &in))) return st;
        struct val pos_buf[SMALL_ARGS], kw_buf[SMALL_ARGS];
        struct argv av;
        if ((st = eval_args(c, &n->u.filter.a, &av, pos_buf, kw_buf))) return st;
        bool r;
        if ((st = tpl_apply_test(c, n->u.filter.id, n->u.filter.name, in, &av, &r))) return st;
        *out = v_bool(n->flag ? !r : r);
        return TERN_OK;
    }
    case N_UNARY: {
        struct val a;
        if ((st = eval(c, n->u.bin.a, &a))) return st;
        if (n->op == OP_NOT) {
            *out = v_bool(!v_truthy(a));
            return TERN_OK;
        }
        return tpl_unop(c, n->op, a, out);
    }
    case N_BINARY: {
        struct val a, b;
        if ((st = eval(c, n->u.bin.a, &a))) return st;
        if (n->op == OP_AND || n->op == OP_OR) {
            bool t = v_truthy(a);
            if ((n->op == OP_AND) != t) {
                *out = a;
                return TERN_OK;
            }
            return eval(c, n->u.bin.b, out);
        }
        if ((st = eval(c, n->u.bin.b, &b))) return st;
        if ((st = tpl_binop(c, n->op, a, b, out))) return st;
        if (n->op == OP_ADD && a.kind == V_STR && b.kind == V_STR) return tpl_taint_concat(c, a, b, out);
        struct val ab[2] = {a, b};
        tpl_taint_derive(c, ab, 2, out);
        return TERN_OK;
    }
    case N_COMPARE: return eval_compare(c, n, out);
    case N_COND: {
        struct val cond;
        if ((st = eval(c, n->u.cond.cond, &cond))) return st;
        if (v_truthy(cond)) return eval(c, n->u.cond.a, out);
        if (n->u.cond.b) return eval(c, n->u.cond.b, out);
        *out = v_undef_hint("the inline if-expression evaluated to false and no else section was defined");
        return TERN_OK;
    }
    case N_CONCAT: return eval_concat(c, n, out);
    case N_LIST:
    case N_TUPLE: {
        struct tpl_list *l = tpl_list_new(c, n->u.seq.n);
        if (!l) return tpl_oom(c);
        for (uint32_t i = 0; i < n->u.seq.n; i++)
            if ((st = eval(c, n->u.seq.items[i], &l->items[i]))) return st;
        *out = v_list(l, n->type == N_TUPLE);
        return TERN_OK;
    }
    case N_DICT: {
        struct tpl_dict *d = tpl_dict_new(c, n->u.seq.n);
        if (!d) return tpl_oom(c);
        for (uint32_t i = 0; i < n->u.seq.n; i++) {
            struct val k, v;
            if ((st = eval(c, n->u.seq.items[i], &k)) || (st = eval(c, n->u.seq.vals[i], &v))) return st;
            if ((st = tpl_dict_set(c, d, k, v))) return st;
        }
        out->kind = V_DICT;
        out->rep = REP_NATIVE;
        out->flags = 0;
        out->u.d = d;
        return TERN_OK;
    }
    default: return tern_errorf(TERN_ERR_INTERNAL, "unexpected node type %d in an expression", n->type);
    }
}

static enum tern_status eval(struct ctx *c, const struct node *n, struct val *out) {
    enum tern_status st;
    if ((st = tpl_step(c, 1)) || (st = tpl_stack_check(c))) return locate(c, n->pos, st);
    st = eval_inner(c, n, out);
    return st < 0 ? locate(c, n->pos, st) : st;
}

/* ---- statements ------------------------------------------------------------------- */

/* {{ a + b + c }} with strings: write the pieces without building the sum. Anything
 * else falls back to evaluating the sum left to right. */
static enum tern_status output_sum(struct ctx *c, const struct node *n) {
    const struct node *leaves[32];
    uint32_t k = 0;
    const struct node *x = n;
    while (x->type == N_BINARY && x->op == OP_ADD && k < 31) {
        leaves[k++] = x->u.bin.b;
        x = x->u.bin.a;
    }
    if (x->type == N_BINARY && x->op == OP_ADD) {
        struct val v;
        enum tern_status st = eval(c, n, &v);
        return st ? st : emit_val(c, v);
    }
    leaves[k++] = x; /* leaves[k-1] is the leftmost */
    struct val vals[32];
    enum tern_status st;
    bool plain = true;
    for (uint32_t i = 0; i < k; i++) {
        if ((st = eval(c, leaves[k - 1 - i], &vals[i]))) return st;
        if (vals[i].kind != V_STR || (vals[i].flags & VF_SAFE)) plain = false;
    }
    if (plain) {
        for (uint32_t i = 0; i < k; i++)
            if ((st = emit_str(c, vals[i]))) return st;
        return TERN_OK;
    }
    struct val acc = vals[0];
    for (uint32_t i = 1; i < k; i++) {
        struct val prev = acc;
        if ((st = tpl_binop(c, OP_ADD, prev, vals[i], &acc))) return locate(c, n->pos, st);
        if (prev.kind == V_STR && vals[i].kind == V_STR) {
            st = tpl_taint_concat(c, prev, vals[i], &acc);
        } else {
            struct val pv[2] = {prev, vals[i]};
            tpl_taint_derive(c, pv, 2, &acc);
        }
        if (st || (st = tpl_step(c, 1))) return st;
    }
    return emit_val(c, acc);
}

static enum tern_status exec_output(struct ctx *c, const struct node *e) {
    enum tern_status st;
    if (e->type == N_BINARY && e->op == OP_ADD) return output_sum(c, e);
    if (e->type == N_CONCAT) {
        for (uint32_t i = 0; i < e->u.seq.n; i++) {
            struct val v;
            if ((st = eval(c, e->u.seq.items[i], &v))) return st;
            if ((st = emit_val(c, v))) return st;
        }
        return TERN_OK;
    }
    struct val v;
    if ((st = eval(c, e, &v))) return st;
    return emit_val(c, v);
}

static enum tern_status run_for(struct ctx *c, const struct node *n, struct val seq, int64_t depth0) {
    enum tern_status st;
    struct scope *outer = c->cur;
    struct scope *s = scope_new(c, outer);
    if (!s) return tpl_oom(c);
    if (n->u.for_.filter) {
        /* `for x in xs if cond`: the loop only sees (and counts) the items that pass */
        size_t n_in = v_len_list(seq);
        struct tpl_list *l = tpl_list_new(c, n_in);
        if (!l) return tpl_oom(c);
        size_t k = 0;
        c->cur = s;
        for (size_t i = 0; i < n_in; i++) {
            struct val item = v_list_at(seq, i), keep;
            scope_reset(s);
            if ((st = assign(c, n->u.for_.target, item)) || (st = eval(c, n->u.for_.filter, &keep))) {
                c->cur = outer;
                return st;
            }
            if (v_truthy(keep)) l->items[k++] = item;
        }
        c->cur = outer;
        l->n = k;
        seq = v_list(l, false);
    }
    size_t len = v_len_list(seq);
    if (len == 0) {
        if (!n->u.for_.else_.n) return TERN_OK;
        c->cur = s;
        st = exec_body(c, &n->u.for_.else_);
        c->cur = outer;
        return st;
    }
    struct tpl_loop *loop = tern_arena_calloc(&c->ar, 1, sizeof *loop);
    if (!loop) return tpl_oom(c);
    loop->length = (int64_t)len;
    loop->seq = seq;
    loop->depth0 = depth0;
    loop->node = n;
    loop->scope = outer;
    struct val lv = {0};
    lv.kind = V_LOOP;
    lv.u.loop = loop;
    c->cur = s;
    st = TERN_OK;
    for (size_t i = 0; i < len; i++) {
        if ((st = tpl_step(c, 1))) break;
        loop->index0 = (int64_t)i;
        scope_reset(s); /* each iteration starts with a fresh scope */
        if ((st = assign(c, n->u.for_.target, v_list_at(seq, i)))) break;
        if ((st = bind(c, s, SYM_LOOP, lv))) break;
        st = exec_body(c, &n->u.for_.body);
        if (st == ST_CONTINUE) {
            st = TERN_OK;
            continue;
        }
        if (st == ST_BREAK) {
            st = TERN_OK;
            break;
        }
        if (st) break;
    }
    c->cur = outer;
    return st;
}

static enum tern_status exec(struct ctx *c, const struct node *n) {
    enum tern_status st;
    if ((st = tpl_step(c, 1))) return locate(c, n->pos, st);
    switch (n->type) {
    case S_TEXT: return emit(c, n->u.text.p, n->u.text.n);
    case S_OUTPUT: return exec_output(c, n->u.expr);
    case S_IF:
        for (uint32_t i = 0; i < n->u.if_.n; i++) {
            struct val cond;
            if ((st = eval(c, n->u.if_.conds[i], &cond))) return st;
            if (v_truthy(cond)) return exec_body(c, &n->u.if_.bodies[i]);
        }
        return exec_body(c, &n->u.if_.else_);
    case S_FOR: {
        struct val it, seq;
        if ((st = eval(c, n->u.for_.iter, &it))) return st;
        if ((st = tpl_iterable(c, it, &seq))) return locate(c, n->u.for_.iter->pos, st);
        return run_for(c, n, seq, 0);
    }
    case S_SET: {
        struct val v;
        if ((st = eval(c, n->u.set.expr, &v))) return st;
        return locate(c, n->pos, assign(c, n->u.set.target, v));
    }
    case S_SET_BLOCK: {
        struct capture cap;
        struct val v;
        if ((st = capture_begin(c, &cap))) return st;
        st = exec_body(c, &n->u.set.body);
        enum tern_status st2 = capture_end(c, &cap, st ? NULL : &v);
        if (st || (st = st2)) return st;
        if (n->u.set.filters && (st = apply_chain(c, n->u.set.filters, v, &v))) return st;
        return locate(c, n->pos, assign(c, n->u.set.target, v));
    }
    case S_MACRO: {
        struct tpl_func *fn = tern_arena_calloc(&c->ar, 1, sizeof *fn);
        if (!fn) return tpl_oom(c);
        fn->type = F_MACRO;
        fn->node = n;
        fn->closure = c->cur;
        fn->name = n->u.macro.name;
        struct val v = {0};
        v.kind = V_FUNC;
        v.u.fn = fn;
        return bind(c, c->cur, n->u.macro.sym, v);
    }
    case S_CALL_BLOCK: {
        struct tpl_func *fn = tern_arena_calloc(&c->ar, 1, sizeof *fn);
        if (!fn) return tpl_oom(c);
        fn->type = F_CALLER;
        fn->node = n;
        fn->closure = c->cur;
        fn->name = "caller";
        struct val callerv = {0}, v;
        callerv.kind = V_FUNC;
        callerv.u.fn = fn;
        if ((st = eval_call(c, n->u.macro.call, &callerv, &v))) return locate(c, n->pos, st);
        return emit_val(c, v);
    }
    case S_FILTER_BLOCK: {
        struct capture cap;
        struct val v;
        struct scope *outer = c->cur;
        struct scope *s = scope_new(c, outer);
        if (!s) return tpl_oom(c);
        if ((st = capture_begin(c, &cap))) return st;
        c->cur = s;
        st = exec_body(c, &n->u.fblock.body);
        c->cur = outer;
        enum tern_status st2 = capture_end(c, &cap, st ? NULL : &v);
        if (st || (st = st2)) return st;
        if ((st = apply_chain(c, n->u.fblock.filters, v, &v))) return st;
        return emit_val(c, v);
    }
    case S_WITH: {
        struct scope *outer = c->cur;
        struct scope *s = scope_new(c, outer);
        if (!s) return tpl_oom(c);
        struct val *vals = tern_arena_alloc(&c->ar, (n->u.with.n + 1) * sizeof *vals);
        if (!vals) return tpl_oom(c);
        for (uint32_t i = 0; i < n->u.with.n; i++)
            if ((st = eval(c, n->u.with.vals[i], &vals[i]))) return st;
        c->cur = s;
        for (uint32_t i = 0; i < n->u.with.n; i++) {
            if ((st = assign(c, n->u.with.targets[i], vals[i]))) {
                c->cur = outer;
                return st;
            }
        }
        st = exec_body(c, &n->u.with.body);
        c->cur = outer;
        return st;
    }
    case S_BREAK: return ST_BREAK;
    case S_CONTINUE: return ST_CONTINUE;
    default: return tern_errorf(TERN_ERR_INTERNAL, "unexpected node type %d in a statement", n->type);
    }
}

static enum tern_status exec_body(struct ctx *c, const struct body *b) {
    enum tern_status st;
    if ((st = tpl_stack_check(c))) return st;
    for (uint32_t i = 0; i < b->n; i++) {
        st = exec(c, b->stmts[i]);
        if (st) return st < 0 ? locate(c, b->stmts[i]->pos, st) : st;
    }
    return TERN_OK;
}

enum tern_status tpl_render(struct ctx *c) {
    char base;
    c->stack_base = &base;
    c->cur = c->root;
    enum tern_status st = exec_body(c, &c->t->body);
    return st > 0 ? TERN_OK : st;
}

/* The loop object handed to recursive loops: loop(items). */
enum tern_status tpl_loop_call_value(struct ctx *c, struct tpl_loop *loop, struct val *out) {
    if (!loop->node->flag) {
        *out = v_undef_hint("the loop is not recursive: add 'recursive' to the for tag to call loop()");
        return TERN_OK;
    }
    struct tpl_func *fn = tern_arena_calloc(&c->ar, 1, sizeof *fn);
    if (!fn) return tpl_oom(c);
    fn->type = F_LOOPCALL;
    fn->loop = loop;
    fn->name = "loop";
    out->kind = V_FUNC;
    out->u.fn = fn;
    return TERN_OK;
}
