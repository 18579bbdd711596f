/* Globals (range, dict, namespace, raise_exception, strftime_now), Python methods of
 * str / dict / list (reached through attribute lookup: message.content.split('x')),
 * the `loop` object, and Python's %-formatting and str.format. */
#include "template/tpl.h"

#include "util/mem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- argument binding ------------------------------------------------------------- */

/* Binds arguments to the named parameters names[0..n): vals[i] / set[i]. */
enum tern_status tpl_bind_args(const char *fname, const struct argv *a, const char *const *names, uint32_t n,
                               struct val *vals, bool *set) {
    for (uint32_t i = 0; i < n; i++) set[i] = false;
    if (a->n_pos > n)
        return tern_errorf(TERN_ERR_TEMPLATE, "%s() takes at most %u argument(s) (%u given)", fname, n, a->n_pos);
    for (uint32_t i = 0; i < a->n_pos; i++) {
        vals[i] = a->pos[i];
        set[i] = true;
    }
    for (uint32_t k = 0; k < a->n_kw; k++) {
        uint32_t i;
        for (i = 0; i < n; i++)
            if (!strcmp(names[i], a->kw_names[k])) break;
        if (i == n)
            return tern_errorf(TERN_ERR_TEMPLATE, "%s() got an unexpected keyword argument '%s'", fname, a->kw_names[k]);
        if (set[i])
            return tern_errorf(TERN_ERR_TEMPLATE, "%s() got multiple values for argument '%s'", fname, a->kw_names[k]);
        vals[i] = a->kw[k];
        set[i] = true;
    }
    return TERN_OK;
}

static enum tern_status need_str(const char *what, struct val v) {
    if (v.kind == V_STR) return TERN_OK;
    return tern_errorf(TERN_ERR_TEMPLATE, "%s: expected a string, not '%s'", what, v_type_name(v));
}

static enum tern_status need_int(const char *what, struct val v, int64_t *out) {
    if (v.kind == V_INT || v.kind == V_BOOL) {
        *out = v.kind == V_BOOL ? v.u.b : v.u.i;
        return TERN_OK;
    }
    if (v.kind == V_UNDEF) return tpl_undef_error(v);
    return tern_errorf(TERN_ERR_TEMPLATE, "%s: '%s' object cannot be interpreted as an integer", what, v_type_name(v));
}

/* ---- methods ---------------------------------------------------------------------- */

enum method {
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_SPLITLINES, M_STARTSWITH, M_ENDSWITH, M_UPPER, M_LOWER,
    M_TITLE, M_CAPITALIZE, M_SWAPCASE, M_CASEFOLD, M_REPLACE, M_FIND, M_RFIND, M_INDEX, M_RINDEX, M_COUNT,
    M_JOIN, M_FORMAT, M_CENTER, M_LJUST, M_RJUST, M_ZFILL, M_PARTITION, M_RPARTITION, M_REMOVEPREFIX,
    M_REMOVESUFFIX, M_EXPANDTABS, M_ISALPHA, M_ISDIGIT, M_ISSPACE, M_ISUPPER, M_ISLOWER, M_ISALNUM, M_ISNUMERIC,
    M_ISDECIMAL, M_ISTITLE, M_ISIDENTIFIER, M_ISASCII, M_ISPRINTABLE,
    M_ITEMS, M_KEYS, M_VALUES, M_GET, M_COPY, M_POP, M_POPITEM, M_UPDATE, M_CLEAR, M_SETDEFAULT,
    M_APPEND, M_EXTEND, M_INSERT, M_REMOVE, M_REVERSE, M_SORT,
    M_CYCLE, M_CHANGED,
    M_N
};

static const char *const method_names[M_N] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower",
    "title", "capitalize", "swapcase", "casefold", "replace", "find", "rfind", "index", "rindex", "count",
    "join", "format", "center", "ljust", "rjust", "zfill", "partition", "rpartition", "removeprefix",
    "removesuffix", "expandtabs", "isalpha", "isdigit", "isspace", "isupper", "islower", "isalnum", "isnumeric",
    "isdecimal", "istitle", "isidentifier", "isascii", "isprintable",
    "items", "keys", "values", "get", "copy", "pop", "popitem", "update", "clear", "setdefault",
    "append", "extend", "insert", "remove", "reverse", "sort",
    "cycle", "changed",
};

int tpl_method_id(const char *name, size_t n) {
    for (int i = 0; i < M_N; i++)
        if (strlen(method_names[i]) == n && memcmp(method_names[i], name, n) == 0) return i;
    return -1;
}

bool tpl_has_method(struct val self, int m, bool *is_safe) {
    *is_safe = true;
    if (m < 0) return false;
    switch (self.kind) {
    case V_STR: return m <= M_ISPRINTABLE;
    case V_DICT:
        if (m == M_ITEMS || m == M_KEYS || m == M_VALUES || m == M_GET || m == M_COPY) return true;
        if (m == M_POP || m == M_POPITEM || m == M_UPDATE || m == M_CLEAR || m == M_SETDEFAULT) {
            *is_safe = false;
            return true;
        }
        return false;
    case V_LIST:
        if (self.flags & VF_VIEW) return false;
        if (m == M_COUNT || m == M_INDEX) return true;
        if (self.rep == REP_RANGE || (self.flags & VF_TUPLE)) return false;
        if (m == M_COPY) return true;
        if (m == M_APPEND || m == M_EXTEND || m == M_INSERT || m == M_POP || m == M_REMOVE || m == M_REVERSE ||
            m == M_SORT || m == M_CLEAR) {
            *is_safe = false;
            return true;
        }
        return false;
    case V_LOOP: return m == M_CYCLE || m == M_CHANGED;
    default: return false;
    }
}

/* Decodes a string into code points (arena). */
static enum tern_status to_cps(struct ctx *c, struct val s, uint32_t **out, size_t *n) {
    size_t cnt = utf8_count(s.u.s.p, s.u.s.n);
    uint32_t *cps = tern_arena_alloc(&c->ar, (cnt ? cnt : 1) * sizeof *cps);
    if (!cps) return tpl_oom(c);
    size_t k = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t len;
        cps[k++] = utf8_decode(s.u.s.p + i, s.u.s.n - i, &len);
        i += len;
    }
    *out = cps;
    *n = k;
    return TERN_OK;
}

static bool cp_in(uint32_t cp, const uint32_t *set, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (set[i] == cp) return true;
    return false;
}

/* Python str.strip family: mode 1 = left, 2 = right, 3 = both. chars NULL: whitespace. */
enum tern_status tpl_strip(struct ctx *c, struct val s, const struct val *chars, int mode, struct val *out) {
    uint32_t *set = NULL;
    size_t nset = 0;
    enum tern_status st;
    if (chars && chars->kind != V_NONE) {
        if ((st = need_str("strip", *chars))) return st;
        if ((st = to_cps(c, *chars, &set, &nset))) return st;
    }
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n;
    if (mode & 1) {
        while (a < b) {
            size_t len;
            uint32_t cp = utf8_decode(p + a, b - a, &len);
            if (set ? !cp_in(cp, set, nset) : !uc_isspace(cp)) break;
            a += len;
        }
    }
    if (mode & 2) {
        while (b > a) {
            size_t q = b - 1;
            while (q > a && ((unsigned char)p[q] & 0xC0) == 0x80) q--;
            size_t len;
            uint32_t cp = utf8_decode(p + q, b - q, &len);
            if (set ? !cp_in(cp, set, nset) : !uc_isspace(cp)) break;
            b = q;
        }
    }
    *out = v_str(p + a, b - a);
    out->flags = s.flags & VF_SAFE;
    return TERN_OK;
}


/* Σ lowercases to final ς after a cased letter when no cased letter follows
 * (case-ignorable characters skipped both ways), as Python's str.lower() does. */
static bool final_sigma(const char *p, size_t n, size_t at, size_t len) {
    size_t i = at;
    bool before = false;
    while (i > 0) {
        size_t q = i - 1;
        while (q > 0 && ((unsigned char)p[q] & 0xC0) == 0x80) q--;
        size_t l;
        uint32_t cp = utf8_decode(p + q, n - q, &l);
        i = q;
        if (uc_is_case_ignorable(cp)) continue;
        before = uc_iscased(cp);
        break;
    }
    if (!before) return false;
    for (i = at + len; i < n;) {
        size_t l;
        uint32_t cp = utf8_decode(p + i, n - i, &l);
        i += l;
        if (uc_is_case_ignorable(cp)) continue;
        return !uc_iscased(cp);
    }
    return true;
}

enum tern_status tpl_case(struct ctx *c, struct val s, int mode, struct val *out) {
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    bool ascii = true;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] >= 0x80) {
            ascii = false;
            break;
        }
    enum tern_status st;
    if (ascii) {
        char *q = tpl_alloc_str(c, n);
        if (!q) return tpl_oom(c);
        bool prev_cased = false;
        for (size_t i = 0; i < n; i++) {
            char ch = p[i];
            bool lower = ch >= 'a' && ch <= 'z', upper = ch >= 'A' && ch <= 'Z';
            bool to_upper;
            switch (mode) {
            case CM_UPPER: to_upper = true; break;
            case CM_LOWER: to_upper = false; break;
            case CM_TITLE: to_upper = !prev_cased; break;
            case CM_CAPITALIZE: to_upper = i == 0; break;
            default: to_upper = lower; break;
            }
            if (to_upper && lower) ch = (char)(ch - 32);
            else if (!to_upper && upper) ch = (char)(ch + 32);
            q[i] = ch;
            prev_cased = lower || upper;
        }
        *out = v_str(q, n);
        out->flags = s.flags & VF_SAFE;
        return TERN_OK;
    }
    struct tern_buf *b = &c->scratch;
    tern_buf_clear(b);
    bool prev_cased = false;
    size_t idx = 0;
    for (size_t i = 0; i < n; idx++) {
        size_t len;
        uint32_t cp = utf8_decode(p + i, n - i, &len), o[3];
        int k;
        bool to_lower_sigma = false;
        switch (mode) {
        case CM_UPPER: k = uc_toupper(cp, o); break;
        case CM_LOWER: k = uc_tolower(cp, o); to_lower_sigma = true; break;
        case CM_TITLE:
            if (prev_cased) {
                k = uc_tolower(cp, o);
                to_lower_sigma = true;
            } else {
                k = uc_totitle(cp, o);
            }
            break;
        case CM_CAPITALIZE:
            if (idx == 0) {
                k = uc_totitle(cp, o);
            } else {
                k = uc_tolower(cp, o);
                to_lower_sigma = true;
            }
            break;
        default:
            if (uc_isupper(cp)) {
                k = uc_tolower(cp, o);
                to_lower_sigma = true;
            } else if (uc_islower(cp)) {
                k = uc_toupper(cp, o);
            } else {
                o[0] = cp;
                k = 1;
            }
            break;
        }
        if (to_lower_sigma && cp == 0x3A3 && final_sigma(p, n, i, len)) o[0] = 0x3C2;
        for (int j = 0; j < k; j++) {
            char enc[4];
            size_t el = utf8_encode(o[j], enc);
            if ((st = tern_buf_append(b, enc, el))) return st;
        }
        prev_cased = uc_iscased(cp);
        i += len;
    }
    if ((st = tpl_new_str(c, b->data ? b->data : "", b->len, out))) return st;
    out->flags = s.flags & VF_SAFE;
    return TERN_OK;
}

/* Python's slice clamping of optional start/end code point indices over s: the byte
 * range [*pa, *pb) and the code point index of *pa. */
static enum tern_status cp_range(struct val s, const struct val *start, const struct val *end, size_t *pa, size_t *pb,
                                 size_t *cp_a, bool *empty) {
    size_t n = utf8_count(s.u.s.p, s.u.s.n);
    int64_t a = 0, b = (int64_t)n;
    enum tern_status st;
    if (start && start->kind != V_NONE) {
        if ((st = need_int("slice index", *start, &a))) return st;
        if (a < 0) a = a + (int64_t)n < 0 ? 0 : a + (int64_t)n;
    }
    if (end && end->kind != V_NONE) {
        if ((st = need_int("slice index", *end, &b))) return st;
        if (b < 0) b = b + (int64_t)n < 0 ? 0 : b + (int64_t)n;
        if (b > (int64_t)n) b = (int64_t)n;
    }
    *empty = a > (int64_t)n;
    if (a > (int64_t)n) a = (int64_t)n;
    if (b < a) b = a;
    size_t k = 0, i = 0;
    while (i < s.u.s.n && k < (size_t)a) {
        i += utf8_seqlen((unsigned char)s.u.s.p[i]);
        k++;
    }
    *pa = i;
    *cp_a = (size_t)a;
    while (i < s.u.s.n && k < (size_t)b) {
        i += utf8_seqlen((unsigned char)s.u.s.p[i]);
        k++;
    }
    *pb = i;
    return TERN_OK;
}

static const char *rmemmem(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

static enum tern_status list_push(struct ctx *c, struct tpl_list *l, size_t *cap, struct val v) {
    if (l->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        struct val *items = tern_arena_grow(&c->ar, l->items, *cap * sizeof *items, nc * sizeof *items);
        if (!items) return tpl_oom(c);
        l->items = items;
        *cap = nc;
    }
    l->items[l->n++] = v;
    return TERN_OK;
}

static struct val sub(struct val s, size_t a, size_t b) {
    struct val v = v_str(s.u.s.p + a, b - a);
    v.flags = s.flags & VF_SAFE;
    return v;
}

static bool ws_at(const char *p, size_t n, size_t i, size_t *len) {
    uint32_t cp = utf8_decode(p + i, n - i, len);
    return uc_isspace(cp);
}

/* Python str.split / str.rsplit. */
static enum tern_status str_split(struct ctx *c, struct val s, const struct val *sepv, int64_t maxsplit, bool right,
                                  struct val *out) {
    enum tern_status st;
    struct tpl_list *l = tpl_list_new(c, 0);
    if (!l) return tpl_oom(c);
    size_t cap = 0;
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (!sepv || sepv->kind == V_NONE) {
        if (!right) {
            size_t i = 0, len;
            while (maxsplit != 0) {
                while (i < n && ws_at(p, n, i, &len)) i += len;
                if (i >= n) break;
                size_t j = i;
                while (j < n && !ws_at(p, n, j, &len)) j += len;
                if ((st = list_push(c, l, &cap, sub(s, i, j)))) return st;
                i = j;
                if (maxsplit > 0) maxsplit--;
            }
            if (i < n) {
                while (i < n && ws_at(p, n, i, &len)) i += len;
                if (i < n && (st = list_push(c, l, &cap, sub(s, i, n)))) return st;
            }
        } else {
            size_t j = n;
            while (maxsplit != 0) {
                /* skip whitespace backwards */
                while (j > 0) {
                    size_t q = j - 1, len;
                    while (q > 0 && ((unsigned char)p[q] & 0xC0) == 0x80) q--;
                    if (!ws_at(p, n, q, &len)) break;
                    j = q;
                }
                if (j == 0) break;
                size_t i = j;
                while (i > 0) {
                    size_t q = i - 1, len;
                    while (q > 0 && ((unsigned char)p[q] & 0xC0) == 0x80) q--;
                    if (ws_at(p, n, q, &len)) break;
                    i = q;
                }
                if ((st = list_push(c, l, &cap, sub(s, i, j)))) return st;
                j = i;
                if (maxsplit > 0) maxsplit--;
            }
            if (j > 0) {
                while (j > 0) {
                    size_t q = j - 1, len;
                    while (q > 0 && ((unsigned char)p[q] & 0xC0) == 0x80) q--;
                    if (!ws_at(p, n, q, &len)) break;
                    j = q;
                }
                if (j > 0 && (st = list_push(c, l, &cap, sub(s, 0, j)))) return st;
            }
            for (size_t i = 0; i < l->n / 2; i++) {
                struct val t = l->items[i];
                l->items[i] = l->items[l->n - 1 - i];
                l->items[l->n - 1 - i] = t;
            }
        }
    } else {
        if ((st = need_str("split", *sepv))) return st;
        const char *sp = sepv->u.s.p;
        size_t sn = sepv->u.s.n;
        if (sn == 0) return tern_errorf(TERN_ERR_TEMPLATE, "empty separator");
        if (!right) {
            size_t i = 0;
            while (maxsplit != 0) {
                const char *f = i <= n ? memmem(p + i, n - i, sp, sn) : NULL;
                if (!f) break;
                size_t at = (size_t)(f - p);
                if ((st = list_push(c, l, &cap, sub(s, i, at)))) return st;
                i = at + sn;
                if (maxsplit > 0) maxsplit--;
                if ((st = tpl_step(c, 1))) return st;
            }
            if ((st = list_push(c, l, &cap, sub(s, i, n)))) return st;
        } else {
            size_t j = n;
            while (maxsplit != 0) {
                const char *f = rmemmem(p, j, sp, sn);
                if (!f) break;
                size_t at = (size_t)(f - p);
                if ((st = list_push(c, l, &cap, sub(s, at + sn, j)))) return st;
                j = at;
                if (maxsplit > 0) maxsplit--;
                if ((st = tpl_step(c, 1))) return st;
            }
            if ((st = list_push(c, l, &cap, sub(s, 0, j)))) return st;
            for (size_t i = 0; i < l->n / 2; i++) {
                struct val t = l->items[i];
                l->items[i] = l->items[l->n - 1 - i];
                l->items[l->n - 1 - i] = t;
            }
        }
    }
    if ((st = tpl_step(c, l->n))) return st;
    *out = v_list(l, false);
    return TERN_OK;
}

static bool is_linebreak(uint32_t cp) {
    return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

enum tern_status tpl_splitlines(struct ctx *c, struct val s, bool keepends, struct val *out) {
    enum tern_status st;
    struct tpl_list *l = tpl_list_new(c, 0);
    if (!l) return tpl_oom(c);
    size_t cap = 0, start = 0, i = 0, n = s.u.s.n;
    const char *p = s.u.s.p;
    while (i < n) {
        size_t len;
        uint32_t cp = utf8_decode(p + i, n - i, &len);
        if (is_linebreak(cp)) {
            size_t eol = i + len;
            if (cp == '\r' && eol < n && p[eol] == '\n') eol++;
            if ((st = list_push(c, l, &cap, sub(s, start, keepends ? eol : i)))) return st;
            start = i = eol;
        } else {
            i += len;
        }
    }
    if (start < n && (st = list_push(c, l, &cap, sub(s, start, n)))) return st;
    *out = v_list(l, false);
    return TERN_OK;
}

enum tern_status tpl_replace(struct ctx *c, struct val s, struct val old, struct val new_, int64_t count,
                             struct val *out) {
    enum tern_status st;
    struct tern_buf *b = &c->scratch;
    tern_buf_clear(b);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (old.u.s.n == 0) {
        /* '' matches before every character and at the end */
        size_t i = 0;
        int64_t done = 0;
        while (count < 0 || done < count) {
            if ((st = tern_buf_append(b, new_.u.s.p, new_.u.s.n))) return st;
            done++;
            if (i >= n) break;
            size_t len = utf8_seqlen((unsigned char)p[i]);
            if ((st = tern_buf_append(b, p + i, len))) return st;
            i += len;
            if ((st = tpl_step(c, 1))) return st;
        }
        if (i < n && (st = tern_buf_append(b, p + i, n - i))) return st;
    } else {
        size_t i = 0;
        int64_t done = 0;
        while (count < 0 || done < count) {
            const char *f = memmem(p + i, n - i, old.u.s.p, old.u.s.n);
            if (!f) break;
            size_t at = (size_t)(f - p);
            if ((st = tern_buf_append(b, p + i, at - i)) || (st = tern_buf_append(b, new_.u.s.p, new_.u.s.n)))
                return st;
            i = at + old.u.s.n;
            done++;
            if ((st = tpl_step(c, 1))) return st;
        }
        if ((st = tern_buf_append(b, p + i, n - i))) return st;
    }
    if (b->len > c->max_output)
        return tern_errorf(TERN_ERR_LIMIT, "a string of %zu bytes exceeds max_output (%zu bytes)", b->len, c->max_output);
    return tpl_new_str(c, b->data ? b->data : "", b->len, out);
}

static enum tern_status pad_str(struct ctx *c, struct val s, int64_t width, uint32_t fill, int align,
                                struct val *out) {
    /* align: -1 left (ljust), 0 center, 1 right (rjust) */
    size_t len = utf8_count(s.u.s.p, s.u.s.n);
    if (width <= (int64_t)len) {
        *out = s;
        return TERN_OK;
    }
    size_t marg = (size_t)width - len, left;
    if (align < 0) left = 0;
    else if (align > 0) left = marg;
    else left = marg / 2 + (marg & (size_t)width & 1);
    char enc[4];
    size_t el = utf8_encode(fill, enc);
    size_t total;
    if (tern_mul_overflow(marg, el, &total) || total > c->max_output)
        return tern_errorf(TERN_ERR_LIMIT, "padding to width %lld exceeds max_output", (long long)width);
    char *q = tpl_alloc_str(c, total + s.u.s.n);
    if (!q) return tpl_oom(c);
    size_t k = 0;
    for (size_t i = 0; i < left; i++, k += el) memcpy(q + k, enc, el);
    memcpy(q + k, s.u.s.p, s.u.s.n);
    k += s.u.s.n;
    for (size_t i = left; i < marg; i++, k += el) memcpy(q + k, enc, el);
    *out = v_str(q, k);
    return TERN_OK;
}

static enum tern_status str_pred(struct val s, int m, struct val *out) {
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    bool r = n > 0;
    bool any_cased = false, prev_cased = false, title_ok = true;
    if (m == M_ISASCII) {
        r = true;
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)p[i] >= 0x80) r = false;
        *out = v_bool(r);
        return TERN_OK;
    }
    if (m == M_ISPRINTABLE) r = true;
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t cp = utf8_decode(p + i, n - i, &len);
        bool first = i == 0;
        i += len;
        switch (m) {
        case M_ISALPHA: r = r && uc_isalpha(cp); break;
        case M_ISDIGIT: r = r && uc_isdigit(cp); break;
        case M_ISDECIMAL: r = r && uc_isdecimal(cp); break;
        case M_ISNUMERIC: r = r && uc_isnumeric(cp); break;
        case M_ISALNUM: r = r && (uc_isalpha(cp) || uc_isnumeric(cp) || uc_isdigit(cp) || uc_isdecimal(cp)); break;
        case M_ISSPACE: r = r && uc_isspace(cp); break;
        case M_ISPRINTABLE: r = r && uc_isprintable(cp); break;
        case M_ISUPPER:
            if (uc_islower(cp)) r = false;
            if (uc_isupper(cp)) any_cased = true;
            break;
        case M_ISLOWER:
            if (uc_isupper(cp)) r = false;
            if (uc_islower(cp)) any_cased = true;
            break;
        case M_ISTITLE:
            if (uc_isupper(cp)) {
                if (prev_cased) title_ok = false;
                prev_cased = true;
                any_cased = true;
            } else if (uc_islower(cp)) {
                if (!prev_cased) title_ok = false;
                prev_cased = true;
                any_cased = true;
            } else {
                prev_cased = false;
            }
            break;
        case M_ISIDENTIFIER:
            if (first) r = r && (cp == '_' || uc_isalpha(cp));
            else r = r && (cp == '_' || uc_isalpha(cp) || uc_isdigit(cp));
            break;
        default: break;
        }
    }
    if (m == M_ISUPPER || m == M_ISLOWER) r = r && any_cased;
    if (m == M_ISTITLE) r = any_cased && title_ok;
    *out = v_bool(r);
    return TERN_OK;
}

static enum tern_status prefix_test(struct ctx *c, struct val s, const struct val *args, const bool *set, bool suffix,
                                    struct val *out) {
    enum tern_status st;
    size_t a, b, cpa;
    bool empty;
    if ((st = cp_range(s, set[1] ? &args[1] : NULL, set[2] ? &args[2] : NULL, &a, &b, &cpa, &empty))) return st;
    struct val pre = args[0];
    size_t n_alt = 1;
    if (pre.kind == V_LIST && (pre.flags & VF_TUPLE)) n_alt = v_len_list(pre);
    else if (pre.kind != V_STR)
        return tern_errorf(TERN_ERR_TEMPLATE, "%s first arg must be str or a tuple of str, not %s",
                           suffix ? "endswith" : "startswith", v_type_name(pre));
    bool r = false;
    for (size_t i = 0; i < n_alt && !r && !empty; i++) {
        struct val x = pre.kind == V_STR ? pre : v_list_at(pre, i);
        if ((st = need_str(suffix ? "endswith" : "startswith", x))) return st;
        if (x.u.s.n <= b - a)
            r = suffix ? memcmp(s.u.s.p + b - x.u.s.n, x.u.s.p, x.u.s.n) == 0 : memcmp(s.u.s.p + a, x.u.s.p, x.u.s.n) == 0;
    }
    (void)c;
    *out = v_bool(r);
    return TERN_OK;
}

/* ---- str methods, one function each ---- */

static enum tern_status sm_strip(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                 struct val *out) {
    enum tern_status st;
    struct val v[4];
    bool set[4];
    static const char *const nm[] = {"chars"};
    if ((st = tpl_bind_args(name, a, nm, 1, v, set))) return st;
    return tpl_strip(c, s, set[0] ? &v[0] : NULL, m == M_STRIP ? 3 : m == M_LSTRIP ? 1 : 2, out);
}

static enum tern_status sm_split(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                 struct val *out) {
    enum tern_status st;
    struct val v[4];
    bool set[4];
    static const char *const nm[] = {"sep", "maxsplit"};
    if ((st = tpl_bind_args(name, a, nm, 2, v, set))) return st;
    int64_t maxsplit = -1;
    if (set[1] && (st = need_int(name, v[1], &maxsplit))) return st;
    return str_split(c, s, set[0] ? &v[0] : NULL, maxsplit, m == M_RSPLIT, out);
}

static enum tern_status sm_splitlines(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                      struct val *out) {
    (void)m;
    enum tern_status st;
    struct val v[4];
    bool set[4];
    static const char *const nm[] = {"keepends"};
    if ((st = tpl_bind_args(name, a, nm, 1, v, set))) return st;
    return tpl_splitlines(c, s, set[0] && v_truthy(v[0]), out);
}

static enum tern_status sm_startswith(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                      struct val *out) {
    enum tern_status st;
    struct val v[4];
    bool set[4];
    static const char *const nm[] = {"prefix", "start", "end"};
    if ((st = tpl_bind_args(name, a, nm, 3, v, set))) return st;
    if (!set[0]) return tern_errorf(TERN_ERR_TEMPLATE, "%s() takes at least 1 argument (0 given)", name);
    return prefix_test(c, s, v, set, m == M_ENDSWITH, out);
}

static enum tern_status sm_upper(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                 struct val *out) {
    if (a->n_pos || a->n_kw) return tern_errorf(TERN_ERR_TEMPLATE, "%s() takes no arguments", name);
    return tpl_case(c, s,
                    m == M_UPPER ? CM_UPPER : m == M_TITLE ? CM_TITLE : m == M_CAPITALIZE ? CM_CAPITALIZE
                                          : m == M_SWAPCASE ? CM_SWAPCASE : CM_LOWER,
                    out);
}

static enum tern_status sm_replace(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                   struct val *out) {
    (void)m;
    enum tern_status st;
    struct val v[4];
    bool set[4];
    static const char *const nm[] = {"old", "new", "count"};
    if ((st = tpl_bind_args(name, a, nm, 3, v, set))) return st;
    if (!set[0] || !set[1]) return tern_errorf(TERN_ERR_TEMPLATE, "replace() takes at least 2 arguments");
    if ((st = need_str("replace", v[0])) || (st = need_str("replace", v[1]))) return st;
    int64_t count = -1;
    if (set[2] && (st = need_int("replace", v[2], &count))) return st;
    return tpl_replace(c, s, v[0], v[1], count, out);
}

static enum tern_status sm_find(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                struct val *out) {
    (void)c;
    enum tern_status st;
    struct val v[4];
    bool set[4];
    static const char *const nm[] = {"sub", "start", "end"};
    if ((st = tpl_bind_args(name, a, nm, 3, v, set))) return st;
    if (!set[0]) return tern_errorf(TERN_ERR_TEMPLATE, "%s() takes at least 1 argument (0 given)", name);
    if ((st = need_str(name, v[0]))) return st;
    size_t pa, pb, cpa;
    bool empty;
    if ((st = cp_range(s, set[1] ? &v[1] : NULL, set[2] ? &v[2] : NULL, &pa, &pb, &cpa, &empty))) return st;
    const char *h = s.u.s.p + pa;
    size_t hn = pb - pa;
    if (m == M_COUNT) {
        int64_t cnt = 0;
        if (!empty) {
            if (v[0].u.s.n == 0) {
                cnt = (int64_t)utf8_count(h, hn) + 1;
            } else {
                size_t i = 0;
                const char *f;
                while (i <= hn && (f = memmem(h + i, hn - i, v[0].u.s.p, v[0].u.s.n))) {
                    cnt++;
                    i = (size_t)(f - h) + v[0].u.s.n;
                }
            }
        }
        *out = v_int(cnt);
        return TERN_OK;
    }
    const char *f = NULL;
    if (!empty) {
        if (m == M_FIND || m == M_INDEX) f = v[0].u.s.n == 0 ? h : memmem(h, hn, v[0].u.s.p, v[0].u.s.n);
        else f = v[0].u.s.n == 0 ? h + hn : rmemmem(h, hn, v[0].u.s.p, v[0].u.s.n);
    }
    if (!f) {
        if (m == M_INDEX || m == M_RINDEX) return tern_errorf(TERN_ERR_TEMPLATE, "substring not found");
        *out = v_int(-1);
        return TERN_OK;
    }
    *out = v_int((int64_t)(cpa + utf8_count(h, (size_t)(f - h))));
    return TERN_OK;
}

static enum tern_status sm_join(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                struct val *out) {
    (void)m, (void)name;
    enum tern_status st;
    if (a->n_pos != 1 || a->n_kw) return tern_errorf(TERN_ERR_TEMPLATE, "join() takes exactly one argument");
    struct val seq;
    if ((st = tpl_iterable(c, a->pos[0], &seq))) return st;
    size_t n = v_len_list(seq);
    if ((st = tpl_step(c, n))) return st;
    struct tern_buf *b = &c->scratch;
    tern_buf_clear(b);
    for (size_t i = 0; i < n; i++) {
        struct val x = v_list_at(seq, i);
        if (x.kind != V_STR)
            return tern_errorf(TERN_ERR_TEMPLATE, "sequence item %zu: expected str instance, %s found", i,
                               v_type_name(x));
        if (i && (st = tern_buf_append(b, s.u.s.p, s.u.s.n))) return st;
        if ((st = tern_buf_append(b, x.u.s.p, x.u.s.n))) return st;
    }
    return tpl_new_str(c, b->data ? b->data : "", b->len, out);
}

static enum tern_status sm_format(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                  struct val *out) {
    (void)m, (void)name;
    return tpl_str_format(c, s, a, out);
}

static enum tern_status sm_center(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                  struct val *out) {
    enum tern_status st;
    struct val v[4];
    bool set[4];
    static const char *const nm[] = {"width", "fillchar"};
    if ((st = tpl_bind_args(name, a, nm, 2, v, set))) return st;
    int64_t w;
    if (!set[0]) return tern_errorf(TERN_ERR_TEMPLATE, "%s() takes at least 1 argument (0 given)", name);
    if ((st = need_int(name, v[0], &w))) return st;
    uint32_t fill = ' ';
    if (set[1]) {
        if ((st = need_str(name, v[1]))) return st;
        if (utf8_count(v[1].u.s.p, v[1].u.s.n) != 1)
            return tern_errorf(TERN_ERR_TEMPLATE, "The fill character must be exactly one character long");
        size_t len;
        fill = utf8_decode(v[1].u.s.p, v[1].u.s.n, &len);
    }
    return pad_str(c, s, w, fill, m == M_LJUST ? -1 : m == M_RJUST ? 1 : 0, out);
}

static enum tern_status sm_zfill(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                 struct val *out) {
    (void)m;
    enum tern_status st;
    int64_t w;
    if (a->n_pos != 1) return tern_errorf(TERN_ERR_TEMPLATE, "zfill() takes exactly one argument");
    if ((st = need_int(name, a->pos[0], &w))) return st;
    size_t len = utf8_count(s.u.s.p, s.u.s.n);
    if (w <= (int64_t)len) {
        *out = s;
        return TERN_OK;
    }
    size_t fill = (size_t)w - len;
    if (fill > c->max_output) return tern_errorf(TERN_ERR_LIMIT, "zfill width exceeds max_output");
    char *q = tpl_alloc_str(c, fill + s.u.s.n);
    if (!q) return tpl_oom(c);
    size_t k = 0;
    size_t body = 0;
    if (s.u.s.n && (s.u.s.p[0] == '+' || s.u.s.p[0] == '-')) {
        q[k++] = s.u.s.p[0];
        body = 1;
    }
    memset(q + k, '0', fill);
    k += fill;
    memcpy(q + k, s.u.s.p + body, s.u.s.n - body);
    *out = v_str(q, fill + s.u.s.n);
    return TERN_OK;
}

static enum tern_status sm_partition(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                     struct val *out) {
    enum tern_status st;
    if (a->n_pos != 1 || a->n_kw) return tern_errorf(TERN_ERR_TEMPLATE, "%s() takes exactly one argument", name);
    if ((st = need_str(name, a->pos[0]))) return st;
    struct val sep = a->pos[0];
    if (!sep.u.s.n) return tern_errorf(TERN_ERR_TEMPLATE, "empty separator");
    const char *f = m == M_PARTITION ? memmem(s.u.s.p, s.u.s.n, sep.u.s.p, sep.u.s.n)
                                     : rmemmem(s.u.s.p, s.u.s.n, sep.u.s.p, sep.u.s.n);
    struct tpl_list *l = tpl_list_new(c, 3);
    if (!l) return tpl_oom(c);
    if (!f) {
        struct val e = v_str("", 0);
        l->items[0] = m == M_PARTITION ? s : e;
        l->items[1] = e;
        l->items[2] = m == M_PARTITION ? e : s;
    } else {
        size_t at = (size_t)(f - s.u.s.p);
        l->items[0] = sub(s, 0, at);
        l->items[1] = sep;
        l->items[2] = sub(s, at + sep.u.s.n, s.u.s.n);
    }
    *out = v_list(l, true);
    return TERN_OK;
}

static enum tern_status sm_removeprefix(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                        struct val *out) {
    (void)c;
    enum tern_status st;
    if (a->n_pos != 1 || a->n_kw) return tern_errorf(TERN_ERR_TEMPLATE, "%s() takes exactly one argument", name);
    if ((st = need_str(name, a->pos[0]))) return st;
    struct val x = a->pos[0];
    *out = s;
    if (x.u.s.n <= s.u.s.n) {
        if (m == M_REMOVEPREFIX && memcmp(s.u.s.p, x.u.s.p, x.u.s.n) == 0) *out = sub(s, x.u.s.n, s.u.s.n);
        if (m == M_REMOVESUFFIX && x.u.s.n && memcmp(s.u.s.p + s.u.s.n - x.u.s.n, x.u.s.p, x.u.s.n) == 0)
            *out = sub(s, 0, s.u.s.n - x.u.s.n);
    }
    return TERN_OK;
}

static enum tern_status sm_expandtabs(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                      struct val *out) {
    (void)m;
    enum tern_status st;
    struct val v[4];
    bool set[4];
    static const char *const nm[] = {"tabsize"};
    if ((st = tpl_bind_args(name, a, nm, 1, v, set))) return st;
    int64_t ts = 8;
    if (set[0] && (st = need_int(name, v[0], &ts))) return st;
    struct tern_buf *b = &c->scratch;
    tern_buf_clear(b);
    int64_t col = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t len = utf8_seqlen((unsigned char)s.u.s.p[i]);
        char ch = s.u.s.p[i];
        if (ch == '\t') {
            if (ts > 0) {
                int64_t sp = ts - col % ts;
                if ((uint64_t)(b->len + (size_t)sp) > c->max_output)
                    return tern_errorf(TERN_ERR_LIMIT, "expandtabs result exceeds max_output");
                for (int64_t k = 0; k < sp; k++)
                    if ((st = tern_buf_putc(b, ' '))) return st;
                col += sp;
            }
        } else {
            if ((st = tern_buf_append(b, s.u.s.p + i, len))) return st;
            col = (ch == '\n' || ch == '\r') ? 0 : col + 1;
        }
        i += len;
    }
    return tpl_new_str(c, b->data ? b->data : "", b->len, out);
}

/* isalpha() ... isprintable(): no arguments, one predicate over the characters. */
static enum tern_status sm_is(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                              struct val *out) {
    (void)c;
    if (a->n_pos || a->n_kw) return tern_errorf(TERN_ERR_TEMPLATE, "%s() takes no arguments", name);
    return str_pred(s, m, out);
}

typedef enum tern_status (*str_method_fn)(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                             struct val *out);

/* The string methods by id (the ids up to M_ISPRINTABLE are str's). */
static const str_method_fn str_methods[M_ISPRINTABLE + 1] = {
    [M_STRIP] = sm_strip,
    [M_LSTRIP] = sm_strip,
    [M_RSTRIP] = sm_strip,
    [M_SPLIT] = sm_split,
    [M_RSPLIT] = sm_split,
    [M_SPLITLINES] = sm_splitlines,
    [M_STARTSWITH] = sm_startswith,
    [M_ENDSWITH] = sm_startswith,
    [M_UPPER] = sm_upper,
    [M_LOWER] = sm_upper,
    [M_TITLE] = sm_upper,
    [M_CAPITALIZE] = sm_upper,
    [M_SWAPCASE] = sm_upper,
    [M_CASEFOLD] = sm_upper,
    [M_REPLACE] = sm_replace,
    [M_FIND] = sm_find,
    [M_RFIND] = sm_find,
    [M_INDEX] = sm_find,
    [M_RINDEX] = sm_find,
    [M_COUNT] = sm_find,
    [M_JOIN] = sm_join,
    [M_FORMAT] = sm_format,
    [M_CENTER] = sm_center,
    [M_LJUST] = sm_center,
    [M_RJUST] = sm_center,
    [M_ZFILL] = sm_zfill,
    [M_PARTITION] = sm_partition,
    [M_RPARTITION] = sm_partition,
    [M_REMOVEPREFIX] = sm_removeprefix,
    [M_REMOVESUFFIX] = sm_removeprefix,
    [M_EXPANDTABS] = sm_expandtabs,
    [M_ISALPHA] = sm_is,
    [M_ISDIGIT] = sm_is,
    [M_ISSPACE] = sm_is,
    [M_ISUPPER] = sm_is,
    [M_ISLOWER] = sm_is,
    [M_ISALNUM] = sm_is,
    [M_ISNUMERIC] = sm_is,
    [M_ISDECIMAL] = sm_is,
    [M_ISTITLE] = sm_is,
    [M_ISIDENTIFIER] = sm_is,
    [M_ISASCII] = sm_is,
    [M_ISPRINTABLE] = sm_is,
};

static enum tern_status str_method(struct ctx *c, struct val s, int m, const char *name, const struct argv *a,
                                   struct val *out) {
    enum tern_status st;
    if ((st = tpl_charge(c, s.u.s.n))) return st;
    if (m < 0 || m > M_ISPRINTABLE) return tern_errorf(TERN_ERR_TEMPLATE, "'str' object has no method '%s'", name);
    return str_methods[m](c, s, m, name, a, out);
}

/* dict.items() / keys() / values(): lists (tuples for items). */
enum tern_status tpl_dict_items(struct ctx *c, struct val d, int which, struct val *out) {
    enum tern_status st;
    size_t n = v_dict_len(d);
    if ((st = tpl_step(c, n))) return st;
    struct tpl_list *l = tpl_list_new(c, n);
    if (!l) return tpl_oom(c);
    struct dict_iter it = {0};
    struct val k, v;
    size_t i = 0;
    while (i < n && v_dict_next(d, &it, &k, &v)) {
        if (which == 0) {
            struct tpl_list *pair = tpl_list_new(c, 2);
            if (!pair) return tpl_oom(c);
            pair->items[0] = k;
            pair->items[1] = v;
            l->items[i++] = v_list(pair, true);
        } else {
            l->items[i++] = which == 1 ? k : v;
        }
    }
    l->n = i;
    *out = v_list(l, false);
    return TERN_OK;
}

static enum tern_status loop_method(struct ctx *c, struct tpl_loop *loop, int m, const struct argv *a, struct val *out) {
    enum tern_status st;
    if (m == M_CYCLE) {
        if (a->n_pos == 0) return tern_errorf(TERN_ERR_TEMPLATE, "no items for cycling given");
        *out = a->pos[loop->index0 % a->n_pos];
        return TERN_OK;
    }
    /* changed(*values): true when the values differ from the previous call's */
    struct tpl_list *l = tpl_list_new(c, a->n_pos);
    if (!l) return tpl_oom(c);
    for (uint32_t i = 0; i < a->n_pos; i++) l->items[i] = a->pos[i];
    struct val now = v_list(l, false);
    bool same = false;
    if (loop->has_changed && (st = tpl_eq(c, loop->last_changed, now, &same, 0))) return st;
    loop->last_changed = now;
    loop->has_changed = true;
    *out = v_bool(!same);
    return TERN_OK;
}

enum tern_status tpl_call_method(struct ctx *c, struct val self, int m, const char *name, const struct argv *a,
                                 struct val *out) {
    enum tern_status st;
    struct val v[2];
    bool set[2];
    bool safe;
    if (!tpl_has_method(self, m, &safe))
        return tern_errorf(TERN_ERR_TEMPLATE, "'%s' object has no attribute '%s'", v_type_name(self), name);
    if (!safe)
        return tern_errorf(TERN_ERR_TEMPLATE, "access to attribute '%s' of '%s' object is unsafe (the sandbox forbids changing lists and dicts; use namespace())",
                           name, v_type_name(self));
    switch (self.kind) {
    case V_STR: return str_method(c, self, m, name, a, out);
    case V_LOOP: return loop_method(c, self.u.loop, m, a, out);
    case V_DICT:
        switch (m) {
        case M_ITEMS:
        case M_KEYS:
        case M_VALUES:
            if (a->n_pos || a->n_kw) return tern_errorf(TERN_ERR_TEMPLATE, "%s() takes no arguments", name);
            if ((st = tpl_dict_items(c, self, m == M_ITEMS ? 0 : m == M_KEYS ? 1 : 2, out))) return st;
            out->flags |= VF_VIEW;
            out->aux = m == M_ITEMS ? VIEW_ITEMS : m == M_KEYS ? VIEW_KEYS : VIEW_VALUES;
            return TERN_OK;
        case M_GET: {
            static const char *const nm[] = {"key", "default"};
            if ((st = tpl_bind_args(name, a, nm, 2, v, set))) return st;
            if (!set[0]) return tern_errorf(TERN_ERR_TEMPLATE, "get expected at least 1 argument, got 0");
            if (v[0].kind == V_LIST && !(v[0].flags & VF_TUPLE))
                return tern_errorf(TERN_ERR_TEMPLATE, "unhashable type: 'list'");
            if (!v_dict_get(c, self, v[0], out)) *out = set[1] ? v[1] : v_none();
            return TERN_OK;
        }
        case M_COPY: {
            size_t n = v_dict_len(self);
            struct tpl_dict *d = tpl_dict_new(c, n);
            if (!d) return tpl_oom(c);
            struct dict_iter it = {0};
            struct val k, x;
            while (v_dict_next(self, &it, &k, &x))
                if ((st = tpl_dict_set(c, d, k, x))) return st;
            out->kind = V_DICT;
            out->rep = REP_NATIVE;
            out->flags = 0;
            out->u.d = d;
            return TERN_OK;
        }
        default: break;
        }
        break;
    case V_LIST:
        switch (m) {
        case M_COUNT:
        case M_INDEX: {
            if (a->n_pos < 1) return tern_errorf(TERN_ERR_TEMPLATE, "%s() takes at least 1 argument", name);
            size_t n = v_len_list(self);
            if ((st = tpl_step(c, n))) return st;
            int64_t cnt = 0;
            for (size_t i = 0; i < n; i++) {
                bool e;
                if ((st = tpl_eq(c, v_list_at(self, i), a->pos[0], &e, 0))) return st;
                if (e) {
                    if (m == M_INDEX) {
                        *out = v_int((int64_t)i);
                        return TERN_OK;
                    }
                    cnt++;
                }
            }
            if (m == M_INDEX) return tern_errorf(TERN_ERR_TEMPLATE, "value is not in list");
            *out = v_int(cnt);
            return TERN_OK;
        }
        case M_COPY: {
            size_t n = v_len_list(self);
            struct tpl_list *l = tpl_list_new(c, n);
            if (!l) return tpl_oom(c);
            for (size_t i = 0; i < n; i++) l->items[i] = v_list_at(self, i);
            *out = v_list(l, false);
            return TERN_OK;
        }
        default: break;
        }
        break;
    default: break;
    }
    return tern_errorf(TERN_ERR_TEMPLATE, "'%s' object has no attribute '%s'", v_type_name(self), name);
}

/* ---- loop ------------------------------------------------------------------------- */

enum tern_status tpl_loop_attr(struct ctx *c, struct val lv, const char *name, size_t n, struct val *out) {
    struct tpl_loop *l = lv.u.loop;
#define IS(s) (n == sizeof(s) - 1 && memcmp(name, s, n) == 0)
    if (IS("index")) *out = v_int(l->index0 + 1);
    else if (IS("index0")) *out = v_int(l->index0);
    else if (IS("revindex")) *out = v_int(l->length - l->index0);
    else if (IS("revindex0")) *out = v_int(l->length - l->index0 - 1);
    else if (IS("first")) *out = v_bool(l->index0 == 0);
    else if (IS("last")) *out = v_bool(l->index0 == l->length - 1);
    else if (IS("length")) *out = v_int(l->length);
    else if (IS("depth")) *out = v_int(l->depth0 + 1);
    else if (IS("depth0")) *out = v_int(l->depth0);
    else if (IS("previtem")) {
        if (l->index0 > 0) *out = v_list_at(l->seq, (size_t)l->index0 - 1);
        else *out = v_undef_hint("there is no previous item");
    } else if (IS("nextitem")) {
        if (l->index0 + 1 < l->length) *out = v_list_at(l->seq, (size_t)l->index0 + 1);
        else *out = v_undef_hint("there is no next item");
    } else if (IS("cycle") || IS("changed")) {
        struct tpl_func *fn = tern_arena_calloc(&c->ar, 1, sizeof *fn);
        if (!fn) return tpl_oom(c);
        fn->type = F_METHOD;
        fn->id = IS("cycle") ? M_CYCLE : M_CHANGED;
        fn->self = lv;
        fn->name = IS("cycle") ? "cycle" : "changed";
        out->kind = V_FUNC;
        out->u.fn = fn;
    } else {
        *out = v_undef_attr(lv, name, n);
    }
#undef IS
    return TERN_OK;
}

/* ---- globals ---------------------------------------------------------------------- */

static const char *const builtin_names[B_COUNT] = {"range", "dict", "namespace", "raise_exception", "strftime_now"};

int tpl_builtin_id(const char *name) {
    for (int i = 0; i < B_COUNT; i++)
        if (!strcmp(builtin_names[i], name)) return i;
    return -1;
}

#define MAX_RANGE 100000

static enum tern_status dict_from_args(struct ctx *c, const char *fname, const struct argv *a, struct tpl_dict **out) {
    enum tern_status st;
    if (a->n_pos > 1) return tern_errorf(TERN_ERR_TEMPLATE, "%s expected at most 1 positional argument, got %u", fname, a->n_pos);
    struct tpl_dict *d = tpl_dict_new(c, a->n_kw);
    if (!d) return tpl_oom(c);
    if (a->n_pos == 1) {
        struct val src = a->pos[0];
        if (src.kind == V_DICT || src.kind == V_NS) {
            struct val dv = src;
            dv.kind = V_DICT;
            struct dict_iter it = {0};
            struct val k, x;
            while (v_dict_next(dv, &it, &k, &x))
                if ((st = tpl_dict_set(c, d, k, x))) return st;
        } else {
            struct val seq;
            if ((st = tpl_iterable(c, src, &seq))) return st;
            for (size_t i = 0, n = v_len_list(seq); i < n; i++) {
                struct val pair = v_list_at(seq, i), ps;
                if ((st = tpl_iterable(c, pair, &ps))) return st;
                if (v_len_list(ps) != 2)
                    return tern_errorf(TERN_ERR_TEMPLATE, "%s update sequence element #%zu has length %zu; 2 is required",
                                       fname, i, v_len_list(ps));
                if ((st = tpl_dict_set(c, d, v_list_at(ps, 0), v_list_at(ps, 1)))) return st;
            }
        }
    }
    for (uint32_t i = 0; i < a->n_kw; i++)
        if ((st = tpl_dict_set(c, d, v_str(a->kw_names[i], a->kw_lens[i]), a->kw[i]))) return st;
    *out = d;
    return TERN_OK;
}

enum tern_status tpl_call_builtin(struct ctx *c, int id, const struct argv *a, struct val *out) {
    enum tern_status st;
    switch (id) {
    case B_RANGE: {
        if (a->n_kw) return tern_errorf(TERN_ERR_TEMPLATE, "range() takes no keyword arguments");
        if (a->n_pos < 1 || a->n_pos > 3)
            return tern_errorf(TERN_ERR_TEMPLATE, "range expected 1 to 3 arguments, got %u", a->n_pos);
        int64_t x[3] = {0, 0, 1};
        for (uint32_t i = 0; i < a->n_pos; i++)
            if ((st = need_int("range", a->pos[i], &x[i]))) return st;
        int64_t start = 0, stop, step = 1;
        if (a->n_pos == 1) {
            stop = x[0];
        } else {
            start = x[0];
            stop = x[1];
            if (a->n_pos == 3) step = x[2];
        }
        if (step == 0) return tern_errorf(TERN_ERR_TEMPLATE, "range() arg 3 must not be zero");
        long double cnt = step > 0 ? (start < stop ? ((long double)stop - start - 1) / step + 1 : 0)
                                   : (start > stop ? ((long double)start - stop - 1) / (-(long double)step) + 1 : 0);
        if (cnt > MAX_RANGE)
            return tern_errorf(TERN_ERR_TEMPLATE, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).",
                               MAX_RANGE);
        struct tpl_range *r = tern_arena_alloc(&c->ar, sizeof *r);
        if (!r) return tpl_oom(c);
        r->start = start;
        r->stop = stop;
        r->step = step;
        r->n = (int64_t)cnt;
        *out = v_undef();
        out->kind = V_LIST;
        out->rep = REP_RANGE;
        out->flags = 0;
        out->u.r = r;
        return TERN_OK;
    }
    case B_DICT:
    case B_NAMESPACE: {
        struct tpl_dict *d = NULL;
        if ((st = dict_from_args(c, id == B_DICT ? "dict" : "namespace", a, &d))) return st;
        *out = v_undef();
        out->kind = id == B_DICT ? V_DICT : V_NS;
        out->rep = REP_NATIVE;
        out->flags = 0;
        out->u.d = d;
        return TERN_OK;
    }
    case B_RAISE_EXCEPTION: {
        struct val msg = a->n_pos ? a->pos[0] : v_str("", 0);
        struct val s;
        if ((st = tpl_to_str(c, msg, &s))) return st;
        c->located = true; /* the message is the template's own, exactly */
        /* error messages hold about 1 KB: longer ones are cut on a character boundary */
        return tern_errorf(TERN_ERR_TEMPLATE, "%.*s", (int)utf8_clip(s.u.s.p, s.u.s.n, 1000), s.u.s.p);
    }
    case B_STRFTIME_NOW: {
        if (a->n_pos != 1 || a->pos[0].kind != V_STR)
            return tern_errorf(TERN_ERR_TEMPLATE, "strftime_now() takes one string argument (a format)");
        struct val f = a->pos[0];
        if (memchr(f.u.s.p, 0, f.u.s.n)) return tern_errorf(TERN_ERR_TEMPLATE, "strftime_now: embedded null character");
        if (f.u.s.n > 4096) return tern_errorf(TERN_ERR_TEMPLATE, "strftime_now: format longer than 4096 bytes");
        char fmt[4100];
        memcpy(fmt, f.u.s.p, f.u.s.n);
        fmt[f.u.s.n] = 0;
        time_t now = c->clock ? c->clock(c->clock_user) : time(NULL);
        struct tm tm;
        if (!gmtime_r(&now, &tm)) return tern_errorf(TERN_ERR_TEMPLATE, "strftime_now: the clock is out of range");
        for (size_t size = 256; size <= (1u << 20) && size <= c->max_output * 2 + 256; size *= 8) {
            char *buf = tern_arena_alloc(&c->ar, size);
            if (!buf) return tpl_oom(c);
            size_t k = strftime(buf, size, fmt, &tm);
            if (k > 0 || f.u.s.n == 0) return tpl_new_str(c, buf, k, out);
        }
        *out = v_str("", 0);
        return TERN_OK;
    }
    default: return tern_errorf(TERN_ERR_INTERNAL, "unknown builtin %d", id);
    }
}

/* ---- %-formatting ----------------------------------------------------------------- */

/* c is one of the characters of set (strchr would also accept the terminating NUL). */
static bool in_set(char c, const char *set) { return c != 0 && strchr(set, c) != NULL; }

struct spec {
    bool minus, plus, space, alt, zero;
    int64_t width;  /* -1: none */
    int64_t prec;   /* -1: none */
    char conv;
};

/* Pads s (code points) to spec width. */
static enum tern_status put_padded(struct tern_buf *b, const char *s, size_t n, const struct spec *sp, bool numeric) {
    enum tern_status st;
    size_t len = utf8_count(s, n);
    size_t pad = sp->width > (int64_t)len ? (size_t)sp->width - len : 0;
    if (pad > (1u << 24)) return tern_errorf(TERN_ERR_LIMIT, "format width %lld is too large", (long long)sp->width);
    if (sp->minus) {
        if ((st = tern_buf_append(b, s, n))) return st;
        for (size_t i = 0; i < pad; i++)
            if ((st = tern_buf_putc(b, ' '))) return st;
        return TERN_OK;
    }
    if (numeric && sp->zero && n && (s[0] == '-' || s[0] == '+' || s[0] == ' ')) {
        if ((st = tern_buf_putc(b, s[0]))) return st;
        s++;
        n--;
    }
    for (size_t i = 0; i < pad; i++)
        if ((st = tern_buf_putc(b, numeric && sp->zero ? '0' : ' '))) return st;
    return tern_buf_append(b, s, n);
}

static enum tern_status fmt_number(struct ctx *c, struct tern_buf *b, struct val v, const struct spec *sp) {
    char fmt[32], out[512];
    int k = 0;
    fmt[k++] = '%';
    if (sp->plus) fmt[k++] = '+';
    if (sp->space) fmt[k++] = ' ';
    if (sp->alt && sp->conv != 'o') fmt[k++] = '#';
    int64_t prec = sp->prec > 100 ? 100 : sp->prec;
    char conv = sp->conv;
    enum tern_status st;
    (void)c;
    if (conv == 'd' || conv == 'i' || conv == 'u' || conv == 'x' || conv == 'X' || conv == 'o') {
        int64_t i;
        if (v.kind == V_FLOAT) {
            if (conv == 'x' || conv == 'X' || conv == 'o')
                return tern_errorf(TERN_ERR_TEMPLATE, "%%%c format: an integer is required, not float", conv);
            if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18)
                return tern_errorf(TERN_ERR_TEMPLATE, "%%%c format: float out of integer range", conv);
            i = (int64_t)v.u.f;
        } else if (v.kind == V_INT || v.kind == V_BOOL) {
            i = v.kind == V_BOOL ? v.u.b : v.u.i;
        } else {
            return tern_errorf(TERN_ERR_TEMPLATE, "%%%c format: a real number is required, not %s", conv, v_type_name(v));
        }
        unsigned long long u = i < 0 ? (unsigned long long)(-(i + 1)) + 1 : (unsigned long long)i;
        char digits[80];
        snprintf(digits, sizeof digits, conv == 'x' ? "%llx" : conv == 'X' ? "%llX" : conv == 'o' ? "%llo" : "%llu", u);
        size_t nd = strlen(digits);
        int n = snprintf(out, sizeof out, "%s%s", i < 0 ? "-" : sp->plus ? "+" : sp->space ? " " : "",
                         sp->alt && conv != 'd' && conv != 'i' && conv != 'u' ? (conv == 'o' ? "0o" : conv == 'x' ? "0x" : "0X") : "");
        for (int64_t z = (int64_t)nd; z < prec && n < 300; z++) out[n++] = '0';
        n += snprintf(out + n, sizeof out - (size_t)n, "%s", digits);
        if ((st = put_padded(b, out, (size_t)n, sp, true))) return st;
        return TERN_OK;
    }
    double f;
    if (v.kind == V_FLOAT) f = v.u.f;
    else if (v.kind == V_INT) f = (double)v.u.i;
    else if (v.kind == V_BOOL) f = v.u.b;
    else return tern_errorf(TERN_ERR_TEMPLATE, "must be real number, not %s", v_type_name(v));
    k += snprintf(fmt + k, sizeof fmt - (size_t)k, ".%d", (int)(prec >= 0 ? prec : 6));
    fmt[k++] = conv;
    fmt[k] = 0;
    int n;
    if (isinf(f) || isnan(f)) {
        bool upper = conv == 'F' || conv == 'E' || conv == 'G';
        n = snprintf(out, sizeof out, "%s%s", f < 0 ? "-" : sp->plus ? "+" : sp->space ? " " : "",
                     isnan(f) ? (upper ? "NAN" : "nan") : (upper ? "INF" : "inf"));
        struct spec s2 = *sp;
        s2.zero = false;
        return put_padded(b, out, (size_t)n, &s2, true);
    }
    if (fabs(f) >= 1e50 && (conv == 'f' || conv == 'F'))
        return tern_errorf(TERN_ERR_TEMPLATE, "formatting %g with %%f is not supported", f);
    n = snprintf(out, sizeof out, fmt, f);
    return put_padded(b, out, (size_t)n, sp, true);
}

static enum tern_status fmt_one(struct ctx *c, struct tern_buf *b, struct val v, const struct spec *sp) {
    enum tern_status st;
    switch (sp->conv) {
    case 's':
    case 'r':
    case 'a': {
        struct tern_buf t = TERN_BUF_INIT;
        t.limit = c->max_output;
        st = sp->conv == 's' ? tpl_fmt_str(c, &t, v, 0) : tpl_fmt_repr(c, &t, v, 0);
        if (!st) {
            size_t n = t.len;
            if (sp->prec >= 0) {
                size_t k = 0, i = 0;
                while (i < n && k < (size_t)sp->prec) {
                    i += utf8_seqlen((unsigned char)t.data[i]);
                    k++;
                }
                n = i;
            }
            st = put_padded(b, t.data ? t.data : "", n, sp, false);
        }
        tern_buf_free(&t);
        return st;
    }
    case 'c': {
        char enc[4];
        size_t n;
        if (v.kind == V_INT) {
            if (v.u.i < 0 || v.u.i > 0x10FFFF || (v.u.i >= 0xD800 && v.u.i <= 0xDFFF))
                return tern_errorf(TERN_ERR_TEMPLATE, "%%c arg not in range(0x110000)");
            n = utf8_encode((uint32_t)v.u.i, enc);
        } else if (v.kind == V_STR && utf8_count(v.u.s.p, v.u.s.n) == 1) {
            n = v.u.s.n;
            memcpy(enc, v.u.s.p, n);
        } else {
            return tern_errorf(TERN_ERR_TEMPLATE, "%%c requires int or char");
        }
        return put_padded(b, enc, n, sp, false);
    }
    default: return fmt_number(c, b, v, sp);
    }
}

enum tern_status tpl_str_percent(struct ctx *c, struct val fmt, struct val args, struct val *out) {
    enum tern_status st;
    struct tern_buf b = TERN_BUF_INIT;
    b.limit = c->max_output;
    const char *p = fmt.u.s.p;
    size_t n = fmt.u.s.n, i = 0, argi = 0;
    bool tuple = args.kind == V_LIST && (args.flags & VF_TUPLE);
    bool mapping = args.kind == V_DICT;
    /* Python never complains about unused arguments when they support item access */
    bool itemable = mapping || (args.kind == V_LIST && !tuple) || args.kind == V_UNDEF;
    size_t nargs = tuple ? v_len_list(args) : 1;
    bool used_mapping = false;
    st = TERN_OK;
    while (i < n && !st) {
        const char *pct = memchr(p + i, '%', n - i);
        size_t upto = pct ? (size_t)(pct - p) : n;
        if ((st = tern_buf_append(&b, p + i, upto - i))) break;
        i = upto;
        if (!pct) break;
        i++;
        if (i >= n) {
            st = tern_errorf(TERN_ERR_TEMPLATE, "incomplete format");
            break;
        }
        struct val key = {0};
        bool have_key = false;
        if (p[i] == '(') {
            size_t depth = 1, j = i + 1;
            while (j < n && depth) {
                if (p[j] == '(') depth++;
                else if (p[j] == ')') depth--;
                j++;
            }
            if (depth) {
                st = tern_errorf(TERN_ERR_TEMPLATE, "incomplete format key");
                break;
            }
            if (!mapping) {
                st = tern_errorf(TERN_ERR_TEMPLATE, "format requires a mapping");
                break;
            }
            key = v_str(p + i + 1, j - i - 2);
            have_key = true;
            used_mapping = true;
            i = j;
        }
        struct spec sp = {0};
        sp.width = sp.prec = -1;
        for (; i < n; i++) {
            char ch = p[i];
            if (ch == '-') sp.minus = true;
            else if (ch == '+') sp.plus = true;
            else if (ch == ' ') sp.space = true;
            else if (ch == '#') sp.alt = true;
            else if (ch == '0') sp.zero = true;
            else break;
        }
        struct val arg;
        if (i < n && p[i] == '*') {
            if (argi >= nargs) {
                st = tern_errorf(TERN_ERR_TEMPLATE, "not enough arguments for format string");
                break;
            }
            arg = tuple ? v_list_at(args, argi) : args;
            argi++;
            if ((st = need_int("* wants int", arg, &sp.width))) break;
            if (sp.width < 0) {
                sp.minus = true;
                sp.width = -sp.width;
            }
            i++;
        } else {
            while (i < n && p[i] >= '0' && p[i] <= '9') {
                sp.width = (sp.width < 0 ? 0 : sp.width) * 10 + (p[i] - '0');
                if (sp.width > 1000000) sp.width = 1000000;
                i++;
            }
        }
        if (i < n && p[i] == '.') {
            i++;
            sp.prec = 0;
            if (i < n && p[i] == '*') {
                if (argi >= nargs) {
                    st = tern_errorf(TERN_ERR_TEMPLATE, "not enough arguments for format string");
                    break;
                }
                arg = tuple ? v_list_at(args, argi) : args;
                argi++;
                if ((st = need_int("* wants int", arg, &sp.prec))) break;
                i++;
            } else {
                while (i < n && p[i] >= '0' && p[i] <= '9') {
                    sp.prec = sp.prec * 10 + (p[i] - '0');
                    if (sp.prec > 1000000) sp.prec = 1000000;
                    i++;
                }
            }
        }
        while (i < n && (p[i] == 'h' || p[i] == 'l' || p[i] == 'L')) i++;
        if (i >= n) {
            st = tern_errorf(TERN_ERR_TEMPLATE, "incomplete format");
            break;
        }
        sp.conv = p[i++];
        if (sp.conv == '%') {
            st = tern_buf_putc(&b, '%');
            continue;
        }
        if (!in_set(sp.conv, "sradiuoxXeEfFgGc")) {
            st = tern_errorf(TERN_ERR_TEMPLATE, "unsupported format character '%c' (0x%x)", sp.conv,
                             (unsigned char)sp.conv);
            break;
        }
        if (have_key) {
            if (!v_dict_get(c, args, key, &arg)) {
                st = tern_errorf(TERN_ERR_TEMPLATE, "KeyError: '%.*s'", (int)utf8_clip(key.u.s.p, key.u.s.n, 200),
                                 key.u.s.p);
                break;
            }
        } else if (mapping && !tuple) {
            arg = args;
            argi++;
        } else {
            if (argi >= nargs) {
                st = tern_errorf(TERN_ERR_TEMPLATE, "not enough arguments for format string");
                break;
            }
            arg = tuple ? v_list_at(args, argi) : args;
            argi++;
        }
        st = fmt_one(c, &b, arg, &sp);
    }
    if (!st && !used_mapping && !itemable && argi < nargs)
        st = tern_errorf(TERN_ERR_TEMPLATE, "not all arguments converted during string formatting");
    if (!st) st = tpl_new_str(c, b.data ? b.data : "", b.len, out);
    tern_buf_free(&b);
    return st;
}

/* ---- str.format ------------------------------------------------------------------- */

/* Python's format spec mini-language for one value. */
static enum tern_status format_spec(struct ctx *c, struct tern_buf *b, struct val v, const char *s, size_t n) {
    enum tern_status st = TERN_OK;
    if (n == 0) return tpl_fmt_str(c, b, v, 0);
    uint32_t fill = ' ';
    char align = 0;
    size_t i = 0;
    size_t l0;
    uint32_t cp0 = utf8_decode(s, n, &l0);
    if (l0 < n && in_set(s[l0], "<>=^")) {
        fill = cp0;
        align = s[l0];
        i = l0 + 1;
    } else if (in_set(s[0], "<>=^")) {
        align = s[0];
        i = 1;
    }
    char sign = 0;
    if (i < n && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) sign = s[i++];
    bool alt = false, zero = false;
    if (i < n && s[i] == '#') {
        alt = true;
        i++;
    }
    if (i < n && s[i] == '0') {
        zero = true;
        i++;
    }
    int64_t width = -1, prec = -1;
    while (i < n && s[i] >= '0' && s[i] <= '9') {
        width = (width < 0 ? 0 : width) * 10 + (s[i++] - '0');
        if (width > 1000000) return tern_errorf(TERN_ERR_LIMIT, "format width too large");
    }
    char group = 0;
    if (i < n && (s[i] == ',' || s[i] == '_')) group = s[i++];
    if (i < n && s[i] == '.') {
        i++;
        prec = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            prec = prec * 10 + (s[i++] - '0');
            if (prec > 1000) return tern_errorf(TERN_ERR_LIMIT, "format precision too large");
        }
    }
    char type = 0;
    if (i < n) type = s[i++];
    if (i != n) return tern_errorf(TERN_ERR_TEMPLATE, "Invalid format specifier '%.*s'", (int)utf8_clip(s, n, 200), s);
    struct tern_buf t = TERN_BUF_INIT;
    t.limit = c->max_output;
    bool numeric = false;
    if (v.kind == V_STR && (type == 0 || type == 's')) {
        size_t len = v.u.s.n;
        if (prec >= 0) {
            size_t k = 0, j = 0;
            while (j < len && k < (size_t)prec) {
                j += utf8_seqlen((unsigned char)v.u.s.p[j]);
                k++;
            }
            len = j;
        }
        st = tern_buf_append(&t, v.u.s.p, len);
        if (!align) align = '<';
    } else if ((v.kind == V_INT || v.kind == V_BOOL) && (type == 0 || in_set(type, "dnbcoxX"))) {
        int64_t x = v.kind == V_BOOL ? v.u.b : v.u.i;
        numeric = true;
        char digits[80];
        unsigned long long u = x < 0 ? (unsigned long long)(-(x + 1)) + 1 : (unsigned long long)x;
        int k = 0;
        if (type == 'c') {
            char enc[4];
            size_t el = utf8_encode((uint32_t)(x & 0x1FFFFF), enc);
            st = tern_buf_append(&t, enc, el);
            numeric = false;
            goto pad;
        }
        int base = type == 'b' ? 2 : type == 'o' ? 8 : (type == 'x' || type == 'X') ? 16 : 10;
        const char *dg = type == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
        char rev[80];
        int r = 0, cnt = 0;
        do {
            if (group && base == 10 && cnt && cnt % 3 == 0) rev[r++] = group;
            rev[r++] = dg[u % (unsigned)base];
            u /= (unsigned)base;
            cnt++;
        } while (u);
        if (x < 0) digits[k++] = '-';
        else if (sign == '+') digits[k++] = '+';
        else if (sign == ' ') digits[k++] = ' ';
        if (alt && base != 10) {
            digits[k++] = '0';
            digits[k++] = type == 'b' ? 'b' : type == 'o' ? 'o' : type;
        }
        while (r) digits[k++] = rev[--r];
        st = tern_buf_append(&t, digits, (size_t)k);
    } else if (v_is_num(v) && (type == 0 || in_set(type, "eEfFgG%n"))) {
        numeric = true;
        double f = v.kind == V_FLOAT ? v.u.f : v.kind == V_BOOL ? v.u.b : (double)v.u.i;
        char buf[600];
        if (type == 0 && prec < 0) {
            tpl_fmt_float(buf, sizeof buf, f);
            if (sign == '+' && f >= 0) st = tern_buf_putc(&t, '+');
            else if (sign == ' ' && f >= 0) st = tern_buf_putc(&t, ' ');
            if (!st) st = tern_buf_puts(&t, buf);
        } else {
            char ty = type == 0 ? 'g' : type == 'n' ? 'g' : type == '%' ? 'f' : type;
            double x = type == '%' ? f * 100 : f;
            if (fabs(x) >= 1e50 && (ty == 'f' || ty == 'F')) {
                tern_buf_free(&t);
                return tern_errorf(TERN_ERR_TEMPLATE, "formatting %g with 'f' is not supported", x);
            }
            char fm[16];
            snprintf(fm, sizeof fm, "%%%s%s.%d%c", sign == '+' ? "+" : sign == ' ' ? " " : "", alt ? "#" : "",
                     (int)(prec >= 0 ? prec : 6), ty);
            snprintf(buf, sizeof buf, fm, x);
            st = tern_buf_puts(&t, buf);
            if (!st && type == '%') st = tern_buf_putc(&t, '%');
        }
    } else if (type == 0 && !v_is_num(v) && v.kind != V_STR) {
        st = tpl_fmt_str(c, &t, v, 0);
        if (!align) align = '<';
    } else {
        tern_buf_free(&t);
        return tern_errorf(TERN_ERR_TEMPLATE, "Unknown format code '%c' for object of type '%s'", type ? type : ' ',
                           v_type_name(v));
    }
pad:
    if (!st) {
        if (zero && numeric && !align) {
            fill = '0';
            align = '=';
        }
        if (!align) align = numeric ? '>' : '<';
        size_t len = utf8_count(t.data ? t.data : "", t.len);
        size_t pad = width > (int64_t)len ? (size_t)width - len : 0;
        size_t left = align == '<' ? 0 : align == '^' ? pad / 2 : pad;
        char enc[4];
        size_t el = utf8_encode(fill, enc);
        const char *body = t.data ? t.data : "";
        size_t bn = t.len;
        if (align == '=' && bn && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) {
            st = tern_buf_putc(b, body[0]);
            body++;
            bn--;
        }
        for (size_t k = 0; k < left && !st; k++) st = tern_buf_append(b, enc, el);
        if (!st) st = tern_buf_append(b, body, bn);
        for (size_t k = left; k < pad && !st; k++) st = tern_buf_append(b, enc, el);
    }
    tern_buf_free(&t);
    return st;
}

/* A field name that is an index: digits only, small enough. */
static bool all_digits(const char *s, size_t n) {
    if (n == 0 || n > 9) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

enum tern_status tpl_str_format(struct ctx *c, struct val fmt, const struct argv *a, struct val *out) {
    enum tern_status st = TERN_OK;
    struct tern_buf b = TERN_BUF_INIT;
    b.limit = c->max_output;
    const char *p = fmt.u.s.p;
    size_t n = fmt.u.s.n, i = 0;
    int64_t auto_idx = 0;
    while (i < n && !st) {
        char ch = p[i];
        if (ch == '{' && i + 1 < n && p[i + 1] == '{') {
            st = tern_buf_putc(&b, '{');
            i += 2;
            continue;
        }
        if (ch == '}' && i + 1 < n && p[i + 1] == '}') {
            st = tern_buf_putc(&b, '}');
            i += 2;
            continue;
        }
        if (ch == '}') {
            st = tern_errorf(TERN_ERR_TEMPLATE, "Single '}' encountered in format string");
            break;
        }
        if (ch != '{') {
            st = tern_buf_putc(&b, ch);
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < n && p[j] != '}' && p[j] != '{') j++;
        if (j >= n || p[j] != '}') {
            st = tern_errorf(TERN_ERR_TEMPLATE, "expected '}' before end of string (nested fields are not supported)");
            break;
        }
        /* field: name[.attr|[key]]...[!conv][:spec] */
        const char *f = p + i + 1;
        size_t fn = j - i - 1;
        const char *colon = memchr(f, ':', fn);
        size_t head = colon ? (size_t)(colon - f) : fn;
        const char *spec = colon ? colon + 1 : "";
        size_t spec_n = colon ? fn - head - 1 : 0;
        char conv = 0;
        if (head >= 2 && f[head - 2] == '!') {
            conv = f[head - 1];
            head -= 2;
        }
        size_t k = 0;
        while (k < head && f[k] != '.' && f[k] != '[') k++;
        struct val v;
        if (k == 0) {
            if (auto_idx >= a->n_pos) {
                st = tern_errorf(TERN_ERR_TEMPLATE, "Replacement index %lld out of range for positional args tuple",
                                 (long long)auto_idx);
                break;
            }
            v = a->pos[auto_idx++];
        } else if (all_digits(f, k)) {
            int64_t idx = 0;
            for (size_t q = 0; q < k; q++) idx = idx * 10 + (f[q] - '0');
            if (idx >= a->n_pos) {
                st = tern_errorf(TERN_ERR_TEMPLATE, "Replacement index %lld out of range for positional args tuple",
                                 (long long)idx);
                break;
            }
            v = a->pos[idx];
        } else {
            uint32_t q;
            for (q = 0; q < a->n_kw; q++)
                if (a->kw_lens[q] == k && !memcmp(a->kw_names[q], f, k)) break;
            if (q == a->n_kw) {
                st = tern_errorf(TERN_ERR_TEMPLATE, "KeyError: '%.*s'", (int)utf8_clip(f, k, 200), f);
                break;
            }
            v = a->kw[q];
        }
        while (k < head && !st) {
            if (f[k] == '.') {
                size_t e = k + 1;
                while (e < head && f[e] != '.' && f[e] != '[') e++;
                st = tpl_getattr(c, v, f + k + 1, e - k - 1, tpl_method_id(f + k + 1, e - k - 1), &v);
                k = e;
            } else {
                size_t e = k + 1;
                while (e < head && f[e] != ']') e++;
                struct val key = v_str(f + k + 1, e - k - 1);
                bool digits = all_digits(f + k + 1, e - k - 1);
                int64_t idx = 0;
                for (size_t q = k + 1; digits && q < e; q++) idx = idx * 10 + (f[q] - '0');
                st = tpl_getitem(c, v, digits ? v_int(idx) : key, &v);
                k = e + 1;
            }
            if (!st && v.kind == V_UNDEF) st = tpl_undef_error(v);
        }
        if (st) break;
        if (conv == 'r' || conv == 'a') {
            struct tern_buf t = TERN_BUF_INIT;
            t.limit = c->max_output;
            st = tpl_fmt_repr(c, &t, v, 0);
            if (!st) st = tpl_new_str(c, t.data ? t.data : "", t.len, &v);
            tern_buf_free(&t);
        } else if (conv == 's') {
            st = tpl_to_str(c, v, &v);
        }
        if (!st) st = format_spec(c, &b, v, spec, spec_n);
        i = j + 1;
    }
    if (!st) st = tpl_new_str(c, b.data ? b.data : "", b.len, out);
    tern_buf_free(&b);
    return st;
}
