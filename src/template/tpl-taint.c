/* Marking: which bytes of a render came from the caller's variables (see
 * tern_template_render_spans in template.h for what is and is not tracked).
 *
 * A string value carries its marking in val.taint: none, all of it, or a tmap (the
 * marked ranges of a buffer that a concatenation or a capture built). A tmap is found
 * by the string's pointer: a view into the same buffer (a slice, a strip) keeps exact
 * marks; a string that carries a tmap index but points elsewhere counts as wholly
 * marked. Every doubt resolves towards marking, which only ever costs a control token
 * that then reads as plain text — never a forged one. */
#include "template/tpl.h"

#include "util/mem.h"

#include <stdlib.h>
#include <string.h>

#define TAINT_SCAN_DEPTH 16 /* containers nested deeper than this count as marked */

void tern_template_spans_free(struct tern_template_spans *s) {
    if (!s) return;
    free(s->v);
    memset(s, 0, sizeof *s);
}

enum tern_status tpl_spans_add(struct tern_template_spans *l, size_t a, size_t b) {
    if (b <= a) return TERN_OK;
    if (l->n && l->v[l->n - 1].end >= a) {
        if (b > l->v[l->n - 1].end) l->v[l->n - 1].end = b;
        return TERN_OK;
    }
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 16;
        struct tern_template_span *v = tern_reallocarray(l->v, nc, sizeof *v);
        if (!v) return tern_errorf(TERN_ERR_NOMEM, "cannot allocate the marks of a render");
        l->v = v;
        l->cap = nc;
    }
    l->v[l->n++] = (struct tern_template_span){a, b};
    return TERN_OK;
}

static const struct tmap *tmap_of(const struct ctx *c, struct val v) {
    if (v.taint == 0 || v.taint == TAINT_ALL || v.taint > c->n_tmaps) return NULL;
    const struct tmap *m = &c->tmaps[v.taint - 1];
    if (v.u.s.p < m->base || v.u.s.n > m->n || (size_t)(v.u.s.p - m->base) > m->n - v.u.s.n) return NULL;
    return m;
}

enum tern_status tpl_str_spans(struct ctx *c, struct val v, size_t at, struct tern_template_spans *l) {
    if (v.kind != V_STR || v.taint == 0 || v.u.s.n == 0) return TERN_OK;
    const struct tmap *m = tmap_of(c, v);
    if (!m) return tpl_spans_add(l, at, at + v.u.s.n);
    size_t off = (size_t)(v.u.s.p - m->base), end = off + v.u.s.n;
    enum tern_status st = TERN_OK;
    for (size_t i = 0; i < m->n_spans && !st; i++) {
        size_t a = m->spans[i].start > off ? m->spans[i].start : off;
        size_t b = m->spans[i].end < end ? m->spans[i].end : end;
        if (a < b) st = tpl_spans_add(l, at + (a - off), at + (b - off));
    }
    return st;
}

static bool tainted_at(struct ctx *c, struct val v, uint32_t depth) {
    if (depth > TAINT_SCAN_DEPTH) return true;
    switch (v.kind) {
    case V_STR: return v.taint != 0;
    case V_LIST:
        if (v.rep == REP_JSON) return true;
        if (v.rep != REP_NATIVE) return false;
        for (size_t i = 0; i < v.u.l->n; i++)
            if (tainted_at(c, v.u.l->items[i], depth + 1)) return true;
        return false;
    case V_DICT:
    case V_NS:
        if (v.kind == V_DICT && v.rep == REP_JSON) return true;
        for (size_t i = 0; i < v.u.d->n; i++)
            if (tainted_at(c, v.u.d->keys[i], depth + 1) || tainted_at(c, v.u.d->vals[i], depth + 1)) return true;
        return false;
    case V_GEN: return tainted_at(c, v.u.gen->input, depth + 1) || tainted_at(c, v.u.gen->items, depth + 1);
    case V_FUNC: return v.u.fn->type == F_METHOD && tainted_at(c, v.u.fn->self, depth + 1);
    default: return false;
    }
}

bool tpl_tainted(struct ctx *c, struct val v) { return tainted_at(c, v, 0); }

enum tern_status tpl_taint_from_spans(struct ctx *c, const char *p, size_t n, const struct tern_template_spans *l,
                                      uint32_t *taint) {
    *taint = 0;
    if (!l->n || !n) return TERN_OK;
    if (l->n == 1 && l->v[0].start == 0 && l->v[0].end >= n) {
        *taint = TAINT_ALL;
        return TERN_OK;
    }
    if (c->n_tmaps == c->cap_tmaps) {
        if (c->cap_tmaps >= TAINT_ALL / 2) {
            *taint = TAINT_ALL; /* no index left: mark it all */
            return TERN_OK;
        }
        uint32_t nc = c->cap_tmaps ? c->cap_tmaps * 2 : 64;
        struct tmap *m = tern_arena_alloc(&c->ar, nc * sizeof *m);
        if (!m) return tpl_oom(c);
        if (c->n_tmaps) memcpy(m, c->tmaps, c->n_tmaps * sizeof *m);
        c->tmaps = m;
        c->cap_tmaps = nc;
    }
    struct tern_template_span *sp = tern_arena_alloc(&c->ar, l->n * sizeof *sp);
    if (!sp) return tpl_oom(c);
    memcpy(sp, l->v, l->n * sizeof *sp);
    c->tmaps[c->n_tmaps++] = (struct tmap){.base = p, .n = n, .spans = sp, .n_spans = l->n};
    *taint = c->n_tmaps;
    return TERN_OK;
}

/* The marking a fresh string result s gets from marked inputs. */
static uint32_t derived_taint(struct ctx *c, const struct val *in, size_t n, struct val s) {
    for (size_t i = 0; i < n; i++) {
        struct val v = in[i];
        if (v.kind != V_STR || v.taint == 0) continue;
        const char *b = v.u.s.p, *e = v.u.s.p + v.u.s.n;
        if (s.u.s.p >= b && s.u.s.p + s.u.s.n <= e && (s.u.s.n || s.u.s.p < e)) return v.taint; /* a view */
    }
    return TAINT_ALL;
}

void tpl_taint_derive(struct ctx *c, const struct val *in, size_t n, struct val *out) {
    if (!tpl_marking(c)) return;
    if (out->kind != V_STR && !(out->kind == V_LIST && out->rep == REP_NATIVE)) return;
    bool any = false;
    for (size_t i = 0; i < n && !any; i++) any = tpl_tainted(c, in[i]);
    if (!any) return;
    if (out->kind == V_STR) {
        if (out->taint == 0) out->taint = derived_taint(c, in, n, *out);
        return;
    }
    for (size_t i = 0; i < out->u.l->n; i++) {
        struct val *it = &out->u.l->items[i];
        if (it->kind == V_STR && it->taint == 0) it->taint = derived_taint(c, in, n, *it);
    }
}

enum tern_status tpl_taint_concat(struct ctx *c, struct val a, struct val b, struct val *out) {
    if (!tpl_marking(c) || out->kind != V_STR || (!a.taint && !b.taint)) return TERN_OK;
    if (a.kind != V_STR || b.kind != V_STR || out->u.s.n != a.u.s.n + b.u.s.n) {
        out->taint = TAINT_ALL;
        return TERN_OK;
    }
    c->tmp.n = 0;
    enum tern_status st = tpl_str_spans(c, a, 0, &c->tmp);
    if (!st) st = tpl_str_spans(c, b, a.u.s.n, &c->tmp);
    if (!st) st = tpl_taint_from_spans(c, out->u.s.p, out->u.s.n, &c->tmp, &out->taint);
    return st;
}
