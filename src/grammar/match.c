/* The matcher: a compiled grammar run as a pushdown automaton, and token masks.
 *
 * A configuration is a grammar position that expects a character (a GE_CHAR element)
 * and a return stack; it is packed into 64 bits: position << 32 | stack id. Stacks are
 * interned as (return position, parent) nodes, so equal stacks have equal ids and a
 * state (a sorted set of configurations plus a pending partial code point) can be
 * compared and hashed as bytes. A rule call whose return position is the end of an
 * alternative pushes nothing (a tail call): right-recursive repetitions run in
 * constant stack, and the states of a loop repeat exactly, which is what makes the
 * mask cache hit.
 *
 * Masks: the vocabulary is a byte trie in preorder; a depth-first walk advances the
 * state one byte per trie edge and skips a whole subtree as soon as the state dies, so
 * the cost is the number of viable prefixes, not the vocabulary size. The walk's states
 * are interned and their byte transitions memoised, so inside a loop (a string's
 * characters) a step is a table lookup. Masks are cached per state (compared in full,
 * never by hash alone), LRU, a bounded number of entries. */
#include "grammar/grammar-impl.h"

#include "tokenizer/tokenizer.h"
#include "util/buf.h"
#include "util/hash.h"
#include "util/mem.h"
#include "util/status.h"

#include <stdlib.h>
#include <string.h>

#define POS_ACCEPT UINT32_MAX
#define STK_HOLE 1u /* the stack below a cut (see "context-independent masks") */
#define CFG(pos, stk) (((uint64_t)(pos) << 32) | (uint64_t)(stk))
#define CFG_POS(c) ((uint32_t)((c) >> 32))
#define CFG_STK(c) ((uint32_t)(c))
#define MAX_STACK_NODES (1u << 24)
#define CACHE_BYTES_DEFAULT (16u << 20) /* cached masks per matcher (19 KiB each on a 151K vocabulary) */
#define CACHE_MAX_ENTRIES 1024

/* ---- vocabulary trie --------------------------------------------------------------- */

struct tern_gvocab {
    uint32_t n_vocab;
    size_t n_nodes;
    uint8_t *byte;     /* (n_nodes) the edge into the node */
    uint16_t *depth;   /* (n_nodes) 1 for the root's children */
    uint32_t *skip;    /* (n_nodes) the index just past the node's subtree */
    uint32_t *tok_at;  /* (n_nodes) first index into toks[] of tokens ending here */
    uint16_t *tok_n;   /* (n_nodes) how many */
    uint32_t *parent;  /* (n_nodes) the parent node, UINT32_MAX for the root's children */
    int32_t *toks;     /* token ids in piece order */
    uint8_t **piece;   /* (n_vocab) bytes of each token (NULL: never allowed) */
    uint32_t *plen;
    int32_t *eog;      /* end-of-generation ids */
    size_t n_eog;
    int32_t *spec;     /* special tokens: allowed only where the grammar spells them literally */
    size_t n_spec;
};

static const struct tern_gvocab *sort_v;
static int cmp_piece(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = sort_v->plen[x], ly = sort_v->plen[y];
    int c = memcmp(sort_v->piece[x], sort_v->piece[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return (x > y) - (x < y);
}

void tern_gvocab_free(struct tern_gvocab *v) {
    if (!v) return;
    if (v->piece)
        for (uint32_t i = 0; i < v->n_vocab; i++) free(v->piece[i]);
    free(v->piece);
    free(v->plen);
    free(v->byte);
    free(v->depth);
    free(v->skip);
    free(v->tok_at);
    free(v->tok_n);
    free(v->parent);
    free(v->toks);
    free(v->eog);
    free(v->spec);
    free(v);
}

uint32_t tern_gvocab_n_vocab(const struct tern_gvocab *v) { return v->n_vocab; }
size_t tern_gvocab_n_nodes(const struct tern_gvocab *v) { return v->n_nodes; }

enum tern_status tern_gvocab_new(uint32_t n_vocab, const char *const *pieces, const uint32_t *lens, const bool *eog,
                                 const bool *special, struct tern_gvocab **out) {
    *out = NULL;
    struct tern_gvocab *v = tern_calloc(1, sizeof *v);
    if (!v) return tern_errorf(TERN_ERR_NOMEM, "grammar vocabulary: out of memory");
    v->n_vocab = n_vocab;
    v->piece = tern_calloc(n_vocab ? n_vocab : 1, sizeof *v->piece);
    v->plen = tern_calloc(n_vocab ? n_vocab : 1, sizeof *v->plen);
    v->eog = tern_malloc((n_vocab ? n_vocab : 1) * sizeof *v->eog);
    v->spec = tern_malloc((n_vocab ? n_vocab : 1) * sizeof *v->spec);
    int32_t *ids = tern_malloc((n_vocab ? n_vocab : 1) * sizeof *ids);
    if (!v->piece || !v->plen || !v->eog || !v->spec || !ids) goto nomem;
    size_t n_ids = 0, total = 0;
    for (uint32_t i = 0; i < n_vocab; i++) {
        if (eog && eog[i]) {
            v->eog[v->n_eog++] = (int32_t)i;
            continue;
        }
        if (!pieces[i] || lens[i] == 0 || lens[i] > TERN_GRAMMAR_MAX_TOKEN_BYTES) continue;
        v->piece[i] = tern_malloc(lens[i]);
        if (!v->piece[i]) goto nomem;
        memcpy(v->piece[i], pieces[i], lens[i]);
        v->plen[i] = lens[i];
        if (special && special[i]) {
            v->spec[v->n_spec++] = (int32_t)i;
            continue;
        }
        ids[n_ids++] = (int32_t)i;
        total += lens[i];
    }
    sort_v = v; /* qsort has no user pointer; vocabularies are built once, at start-up */
    qsort(ids, n_ids, sizeof *ids, cmp_piece);
    sort_v = NULL;
    size_t cap = total + 1;
    v->byte = tern_malloc(cap);
    v->depth = tern_malloc(cap * sizeof *v->depth);
    v->skip = tern_malloc(cap * sizeof *v->skip);
    v->tok_at = tern_malloc(cap * sizeof *v->tok_at);
    v->tok_n = tern_calloc(cap, sizeof *v->tok_n);
    v->parent = tern_malloc(cap * sizeof *v->parent);
    v->toks = ids;
    ids = NULL;
    uint32_t *path = tern_malloc((TERN_GRAMMAR_MAX_TOKEN_BYTES + 1) * sizeof *path);
    if (!v->byte || !v->depth || !v->skip || !v->tok_at || !v->tok_n || !v->parent || !path) {
        free(path);
        goto nomem;
    }
    /* preorder from the sorted pieces: path[d] is the node at depth d+1 on the current
     * branch; a node's subtree ends where a later piece leaves its prefix */
    size_t n = 0, plen_cur = 0;
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0;
    for (size_t k = 0; k < n_ids; k++) {
        int32_t id = v->toks[k];
        const uint8_t *s = v->piece[id];
        uint32_t len = v->plen[id];
        uint32_t lcp = 0;
        if (prev)
            while (lcp < len && lcp < prev_len && s[lcp] == prev[lcp]) lcp++;
        while (plen_cur > lcp) v->skip[path[--plen_cur]] = (uint32_t)n;
        for (uint32_t d = lcp; d < len; d++) {
            v->byte[n] = s[d];
            v->depth[n] = (uint16_t)(d + 1);
            v->tok_n[n] = 0;
            v->tok_at[n] = 0;
            v->parent[n] = plen_cur ? path[plen_cur - 1] : UINT32_MAX;
            path[plen_cur++] = (uint32_t)n;
            n++;
        }
        uint32_t node = path[len - 1];
        if (v->tok_n[node] == 0) v->tok_at[node] = (uint32_t)k;
        if (v->tok_n[node] < UINT16_MAX) v->tok_n[node]++;
        prev = s;
        prev_len = len;
    }
    while (plen_cur > 0) v->skip[path[--plen_cur]] = (uint32_t)n;
    free(path);
    v->n_nodes = n;
    *out = v;
    return TERN_OK;
nomem:
    free(ids);
    tern_gvocab_free(v);
    return tern_errorf(TERN_ERR_NOMEM, "grammar vocabulary: out of memory");
}

enum tern_status tern_gvocab_from_tokenizer(const struct tern_tokenizer *t, struct tern_gvocab **out) {
    *out = NULL;
    uint32_t nv = tern_tokenizer_n_vocab(t);
    char **pieces = tern_calloc(nv ? nv : 1, sizeof *pieces);
    uint32_t *lens = tern_calloc(nv ? nv : 1, sizeof *lens);
    bool *eog = tern_calloc(nv ? nv : 1, sizeof *eog);
    bool *spec = tern_calloc(nv ? nv : 1, sizeof *spec);
    struct tern_buf b = TERN_BUF_INIT;
    enum tern_status st = TERN_OK;
    if (!pieces || !lens || !eog || !spec) {
        st = tern_errorf(TERN_ERR_NOMEM, "grammar vocabulary: out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < nv; i++) {
        if (tern_token_is_eog(t, (int32_t)i)) {
            eog[i] = true;
            continue;
        }
        tern_buf_clear(&b);
        if (tern_token_piece(t, (int32_t)i, TERN_TOK_PARSE_SPECIAL, &b)) continue;
        if (!b.len) continue;
        if (tern_token_is_control(t, (int32_t)i) && b.len >= 4 && !memcmp(b.data, "<|", 2) &&
            !memcmp(b.data + b.len - 2, "|>", 2))
            continue;
        pieces[i] = tern_strndup(b.data, b.len);
        if (!pieces[i]) {
            st = tern_errorf(TERN_ERR_NOMEM, "grammar vocabulary: out of memory");
            goto out;
        }
        lens[i] = (uint32_t)b.len;
        int32_t type = tern_token_type(t, (int32_t)i);
        spec[i] = tern_token_is_control(t, (int32_t)i) || type == TERN_TOKEN_TYPE_USER_DEFINED;
    }
    st = tern_gvocab_new(nv, (const char *const *)pieces, lens, eog, spec, out);
out:
    if (pieces)
        for (uint32_t i = 0; i < nv; i++) free(pieces[i]);
    free(pieces);
    free(lens);
    free(eog);
    free(spec);
    tern_buf_free(&b);
    return st;
}

/* ---- the matcher ------------------------------------------------------------------- */

/* A pending partial code point: the bytes so far and how many the sequence has. */
struct partial {
    uint8_t have, need;  /* need == 0: none pending */
    uint32_t cp;         /* bits so far */
};

struct snode {
    uint32_t ret, parent;
    uint32_t depth;
};

struct centry {
    uint64_t *cfg;
    size_t n_cfg;
    struct partial part;
    uint64_t hash;
    uint32_t *mask;
    size_t count;
    uint64_t used;
};

struct tern_gmatch {
    const struct tern_grammar *g;
    const struct tern_gvocab *v;

    /* the live state */
    uint64_t *cfg;
    size_t n_cfg, cap_cfg;
    struct partial part;

    /* interned stacks: nodes[0] is the empty stack */
    struct snode *nodes;
    size_t n_nodes, cap_nodes;
    uint32_t *ntab;      /* open addressing: node id + 1, 0 = free */
    size_t ntab_cap;

    /* closure scratch */
    uint64_t *work;
    size_t n_work, cap_work;
    uint64_t *seen;      /* visited set of one closure (generation-stamped) */
    uint32_t *seen_gen;
    size_t seen_cap;
    uint32_t gen;
    bool overflow;       /* a stack passed TERN_GRAMMAR_MAX_STACK or the node limit */
    bool hole_pop;       /* a closure popped into STK_HOLE */

    /* scratch of the walk's steps */
    uint64_t *buf;
    size_t n_buf, cap_buf;

    /* accept_bytes scratch */
    uint64_t *tmp, *tmp2;
    size_t cap_tmp, cap_tmp2;

    /* the walk's memo: states interned (configurations + partial) and their transitions
     * by byte, so that a walk through a loop (a string's characters) is table lookups */
    struct mstate {
        size_t off;      /* in mpool */
        uint32_t n;
        struct partial part;
    } *ms;
    size_t n_ms, cap_ms;
    uint64_t *mpool;
    size_t n_mpool, cap_mpool;
    uint32_t *mtab;      /* open addressing: state id + 1 */
    size_t mtab_cap;
    uint64_t *tkey;      /* transitions: (state << 8 | byte) + 1, 0 = free */
    int32_t *tval;       /* the next state, -1 = dead */
    size_t n_t, tcap;
    int32_t *d_sid;      /* the walk's state at each depth */
    bool *d_taint;       /* and whether a path popped into the hole on the way */
    bool no_cut;         /* tern_gmatch_set_cut(false): always the full walk */
    struct ci_entry {
        uint64_t *cfg;
        size_t n_cfg;
        struct partial part;
        uint64_t hash;
        uint32_t *acc;   /* tokens allowed in every context */
        size_t count;
        uint32_t *roots; /* trie nodes whose subtrees depend on the context */
        size_t n_roots;
        uint64_t used;
    } *ci;
    size_t n_ci, cap_ci;

    struct centry *cache;
    size_t n_cache, cache_cap;
    size_t cache_bytes, cache_budget;
    uint64_t tick;
    struct tern_gmatch_stats stats;
};

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *np = tern_reallocarray(*p, nc, elem);
    if (!np) return false;
    *p = np;
    *cap = nc;
    return true;
}

/* The node (ret, parent), interned; 0 on overflow (the caller drops the configuration). */
static uint32_t intern(struct tern_gmatch *m, uint32_t ret, uint32_t parent) {
    if (m->nodes[parent].depth + 1 > TERN_GRAMMAR_MAX_STACK) {
        m->overflow = true;
        return 0;
    }
    if (m->n_nodes * 2 >= m->ntab_cap) {
        size_t nc = m->ntab_cap ? m->ntab_cap * 2 : 1024;
        uint32_t *nt = tern_calloc(nc, sizeof *nt);
        if (!nt) {
            m->overflow = true;
            return 0;
        }
        for (size_t i = 2; i < m->n_nodes; i++) {
            size_t h = mix(((uint64_t)m->nodes[i].ret << 32) | m->nodes[i].parent) & (nc - 1);
            while (nt[h]) h = (h + 1) & (nc - 1);
            nt[h] = (uint32_t)i + 1;
        }
        free(m->ntab);
        m->ntab = nt;
        m->ntab_cap = nc;
    }
    size_t h = mix(((uint64_t)ret << 32) | parent) & (m->ntab_cap - 1);
    while (m->ntab[h]) {
        const struct snode *n = &m->nodes[m->ntab[h] - 1];
        if (n->ret == ret && n->parent == parent) return m->ntab[h] - 1;
        h = (h + 1) & (m->ntab_cap - 1);
    }
    if (m->n_nodes >= MAX_STACK_NODES || !grow((void **)&m->nodes, &m->cap_nodes, m->n_nodes + 1, sizeof *m->nodes)) {
        m->overflow = true;
        return 0;
    }
    uint32_t id = (uint32_t)m->n_nodes++;
    m->nodes[id] = (struct snode){ret, parent, m->nodes[parent].depth + 1};
    m->ntab[h] = id + 1;
    return id;
}

/* Adds (pos, stk) to the closure's worklist unless seen in this closure. */
static bool work_add(struct tern_gmatch *m, uint32_t pos, uint32_t stk) {
    uint64_t key = CFG(pos, stk);
    if (m->n_work >= TERN_GRAMMAR_MAX_EXPANSION) {
        m->overflow = true; /* nested repetitions of empty-able items can multiply paths */
        return false;
    }
    if (m->n_work * 2 + 2 >= m->seen_cap) {
        /* grow the seen table; the current generation's entries are re-inserted */
        size_t nc = m->seen_cap ? m->seen_cap * 2 : 256;
        uint64_t *ns = tern_malloc(nc * sizeof *ns);
        uint32_t *ng = tern_calloc(nc, sizeof *ng);
        if (!ns || !ng) {
            free(ns);
            free(ng);
            m->overflow = true;
            return false;
        }
        for (size_t i = 0; i < m->seen_cap; i++) {
            if (m->seen_gen[i] != m->gen) continue;
            size_t h = mix(m->seen[i]) & (nc - 1);
            while (ng[h] == m->gen) h = (h + 1) & (nc - 1);
            ng[h] = m->gen;
            ns[h] = m->seen[i];
        }
        free(m->seen);
        free(m->seen_gen);
        m->seen = ns;
        m->seen_gen = ng;
        m->seen_cap = nc;
    }
    size_t h = mix(key) & (m->seen_cap - 1);
    while (m->seen_gen[h] == m->gen) {
        if (m->seen[h] == key) return true;
        h = (h + 1) & (m->seen_cap - 1);
    }
    m->seen_gen[h] = m->gen;
    m->seen[h] = key;
    if (!grow((void **)&m->work, &m->cap_work, m->n_work + 1, sizeof *m->work)) {
        m->overflow = true;
        return false;
    }
    m->work[m->n_work++] = key;
    return true;
}

static void closure_begin(struct tern_gmatch *m) {
    m->n_work = 0;
    if (++m->gen == 0) { /* wrapped: clear the stamps */
        if (m->seen_gen) memset(m->seen_gen, 0, m->seen_cap * sizeof *m->seen_gen);
        m->gen = 1;
    }
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static size_t sort_unique(uint64_t *a, size_t n) {
    if (n < 2) return n;
    if (n <= 16) {
        for (size_t i = 1; i < n; i++) {
            uint64_t x = a[i];
            size_t j = i;
            while (j > 0 && a[j - 1] > x) {
                a[j] = a[j - 1];
                j--;
            }
            a[j] = x;
        }
    } else {
        qsort(a, n, sizeof *a, cmp_u64);
    }
    size_t w = 1;
    for (size_t i = 1; i < n; i++)
        if (a[i] != a[w - 1]) a[w++] = a[i];
    return w;
}

/* Runs the worklist to its character configurations, appended to *out (a growable
 * array at *out with *n used and *cap allocated), sorted and unique. */
static bool closure_run(struct tern_gmatch *m, uint64_t **out, size_t *n, size_t *cap) {
    const struct tern_grammar *g = m->g;
    size_t start = *n;
    for (size_t wi = 0; wi < m->n_work; wi++) {
        uint64_t c = m->work[wi];
        uint32_t pos = CFG_POS(c), stk = CFG_STK(c);
        const struct gel *e = &g->el[pos];
        if (e->type == GE_CHAR) {
            if (!grow((void **)out, cap, *n + 1, sizeof **out)) return false;
            (*out)[(*n)++] = c;
        } else if (e->type == GE_RULE) {
            uint32_t ret = pos + 1;
            uint32_t nstk = stk;
            if (!gel_is_end(&g->el[ret])) {
                nstk = intern(m, ret, stk);
                if (nstk == 0) continue; /* too deep: this path is dropped */
            }
            for (uint32_t a = g->alt_first[e->a]; a < g->alt_first[e->a + 1]; a++)
                if (!work_add(m, g->alts[a], nstk)) return false;
        } else if (stk == 0) {
            if (!grow((void **)out, cap, *n + 1, sizeof **out)) return false;
            (*out)[(*n)++] = CFG(POS_ACCEPT, 0);
        } else if (stk == STK_HOLE) {
            m->hole_pop = true; /* the path leaves what the cut state knows: dropped, noted */
        } else {
            const struct snode *sn = &m->nodes[stk];
            if (!work_add(m, sn->ret, sn->parent)) return false;
        }
    }
    *n = start + sort_unique(*out + start, *n - start);
    return true;
}

/* Advances cfg[0..n) by code point cp into *out (appended). Returns the count added. */
static size_t advance_cp(struct tern_gmatch *m, const uint64_t *cfg, size_t n, uint32_t cp, uint64_t **out,
                         size_t *n_out, size_t *cap) {
    const struct tern_grammar *g = m->g;
    closure_begin(m);
    for (size_t i = 0; i < n; i++) {
        uint32_t pos = CFG_POS(cfg[i]);
        if (pos == POS_ACCEPT) continue;
        if (gel_match(g, &g->el[pos], cp) && !work_add(m, pos + 1, CFG_STK(cfg[i]))) return 0;
    }
    size_t before = *n_out;
    if (!m->n_work) return 0;
    if (!closure_run(m, out, n_out, cap)) {
        *n_out = before;
        return 0;
    }
    return *n_out - before;
}

static const uint32_t utf8_min[5] = {0, 0, 0x80, 0x800, 0x10000};

/* Can some configuration match a code point that completes the partial part? */
static bool partial_viable(const struct tern_grammar *g, const uint64_t *cfg, size_t n, struct partial pt) {
    unsigned rem = pt.need - pt.have;
    uint32_t lo = pt.cp << (6 * rem), hi = lo | ((1u << (6 * rem)) - 1);
    if (lo < utf8_min[pt.need]) lo = utf8_min[pt.need];
    if (hi > 0x10ffff) hi = 0x10ffff;
    if (lo > hi) return false;
    /* surrogates are not code points: [lo, hi] minus [D800, DFFF] */
    uint32_t a[2] = {lo, 0xe000 > lo ? 0xe000 : lo}, b[2] = {hi < 0xd7ff ? hi : 0xd7ff, hi};
    for (int k = 0; k < 2; k++) {
        if (a[k] > b[k]) continue;
        for (size_t i = 0; i < n; i++) {
            uint32_t pos = CFG_POS(cfg[i]);
            if (pos != POS_ACCEPT && gel_match_any(g, &g->el[pos], a[k], b[k])) return true;
        }
    }
    return false;
}

/* One byte. in: cfg[0..n) with part; out: either the same configurations (*same set,
 * only the partial changed) or new ones appended to *out. Returns false when dead. */
static bool step_byte(struct tern_gmatch *m, const uint64_t *cfg, size_t n, struct partial part, uint8_t b,
                      struct partial *npart, bool *same, uint64_t **out, size_t *n_out, size_t *cap) {
    *same = false;
    if (part.need) {
        if ((b & 0xc0) != 0x80) return false;
        struct partial p2 = {(uint8_t)(part.have + 1), part.need, (part.cp << 6) | (b & 0x3fu)};
        if (p2.have < p2.need) {
            if (!partial_viable(m->g, cfg, n, p2)) return false;
            *npart = p2;
            *same = true;
            return true;
        }
        uint32_t cp = p2.cp;
        if (cp < utf8_min[p2.need] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        *npart = (struct partial){0, 0, 0};
        return advance_cp(m, cfg, n, cp, out, n_out, cap) > 0;
    }
    if (b < 0x80) {
        *npart = (struct partial){0, 0, 0};
        return advance_cp(m, cfg, n, b, out, n_out, cap) > 0;
    }
    struct partial p2;
    if (b >= 0xc2 && b <= 0xdf) p2 = (struct partial){1, 2, b & 0x1fu};
    else if (b >= 0xe0 && b <= 0xef) p2 = (struct partial){1, 3, b & 0x0fu};
    else if (b >= 0xf0 && b <= 0xf4) p2 = (struct partial){1, 4, b & 0x07u};
    else return false;
    if (!partial_viable(m->g, cfg, n, p2)) return false;
    *npart = p2;
    *same = true;
    return true;
}

static void ci_free(struct ci_entry *e) {
    free(e->cfg);
    free(e->acc);
    free(e->roots);
}

enum tern_status tern_gmatch_new(const struct tern_grammar *g, const struct tern_gvocab *v, struct tern_gmatch **out) {
    *out = NULL;
    struct tern_gmatch *m = tern_calloc(1, sizeof *m);
    if (!m) return tern_errorf(TERN_ERR_NOMEM, "grammar: out of memory");
    m->g = g;
    m->v = v;
    m->cache_budget = CACHE_BYTES_DEFAULT;
    size_t depth = TERN_GRAMMAR_MAX_TOKEN_BYTES + 2;
    m->d_sid = tern_calloc(depth, sizeof *m->d_sid);
    m->d_taint = tern_calloc(depth, sizeof *m->d_taint);
    if (!m->d_sid || !m->d_taint ||
        !grow((void **)&m->nodes, &m->cap_nodes, 1024, sizeof *m->nodes)) {
        tern_gmatch_free(m);
        return tern_errorf(TERN_ERR_NOMEM, "grammar: out of memory");
    }
    m->nodes[0] = (struct snode){0, 0, 0};
    m->nodes[1] = (struct snode){UINT32_MAX, 0, 0}; /* STK_HOLE */
    m->n_nodes = 2;
    tern_gmatch_reset(m);
    if (m->overflow || m->n_cfg == 0) {
        tern_gmatch_free(m);
        return tern_errorf(TERN_ERR_LIMIT, "grammar: the start state expands to more than %u configurations (or "
                           "stacks deeper than %u)", TERN_GRAMMAR_MAX_EXPANSION, TERN_GRAMMAR_MAX_STACK);
    }
    *out = m;
    return TERN_OK;
}

void tern_gmatch_reset(struct tern_gmatch *m) {
    const struct tern_grammar *g = m->g;
    m->n_cfg = 0;
    m->part = (struct partial){0, 0, 0};
    closure_begin(m);
    for (uint32_t a = g->alt_first[g->root]; a < g->alt_first[g->root + 1]; a++) work_add(m, g->alts[a], 0);
    closure_run(m, &m->cfg, &m->n_cfg, &m->cap_cfg);
}

void tern_gmatch_free(struct tern_gmatch *m) {
    if (!m) return;
    free(m->cfg);
    free(m->nodes);
    free(m->ntab);
    free(m->work);
    free(m->seen);
    free(m->seen_gen);
    free(m->buf);
    free(m->tmp);
    free(m->tmp2);
    free(m->ms);
    free(m->mpool);
    free(m->mtab);
    free(m->tkey);
    free(m->tval);
    free(m->d_sid);
    free(m->d_taint);
    for (size_t i = 0; i < m->n_ci; i++) ci_free(&m->ci[i]);
    free(m->ci);
    for (size_t i = 0; i < m->n_cache; i++) {
        free(m->cache[i].cfg);
        free(m->cache[i].mask);
    }
    free(m->cache);
    free(m);
}

bool tern_gmatch_can_end(const struct tern_gmatch *m) {
    return m->part.need == 0 && m->n_cfg > 0 && CFG_POS(m->cfg[m->n_cfg - 1]) == POS_ACCEPT;
}

bool tern_gmatch_done(const struct tern_gmatch *m) { return tern_gmatch_can_end(m) && m->n_cfg == 1; }

/* Runs bytes from the live state; the result is in m->tmp[0..return) (0 = rejected) with
 * the final partial in *fpart. The live state is unchanged. */
static size_t run_bytes(struct tern_gmatch *m, const uint8_t *s, size_t n, struct partial *fpart) {
    size_t cur_n = m->n_cfg;
    if (!grow((void **)&m->tmp, &m->cap_tmp, cur_n ? cur_n : 1, sizeof *m->tmp)) return 0;
    memcpy(m->tmp, m->cfg, cur_n * sizeof *m->cfg);
    struct partial part = m->part;
    for (size_t i = 0; i < n; i++) {
        size_t nn = 0;
        bool same;
        struct partial np;
        if (!step_byte(m, m->tmp, cur_n, part, s[i], &np, &same, &m->tmp2, &nn, &m->cap_tmp2)) return 0;
        part = np;
        if (!same) {
            uint64_t *t = m->tmp;
            size_t tc = m->cap_tmp;
            m->tmp = m->tmp2;
            m->cap_tmp = m->cap_tmp2;
            m->tmp2 = t;
            m->cap_tmp2 = tc;
            cur_n = nn;
        }
    }
    *fpart = part;
    return cur_n;
}

bool tern_gmatch_accept_bytes(struct tern_gmatch *m, const void *bytes, size_t n) {
    if (n == 0) return true;
    struct partial part;
    size_t k = run_bytes(m, bytes, n, &part);
    if (!k) return false;
    uint64_t *t = m->cfg;
    size_t tc = m->cap_cfg;
    m->cfg = m->tmp;
    m->cap_cfg = m->cap_tmp;
    m->n_cfg = k;
    m->tmp = t;
    m->cap_tmp = tc;
    m->part = part;
    return true;
}

bool tern_gmatch_matches(struct tern_gmatch *m, const void *bytes, size_t n) {
    struct partial part = m->part;
    if (n == 0) return tern_gmatch_can_end(m);
    size_t k = run_bytes(m, bytes, n, &part);
    return k > 0 && part.need == 0 && CFG_POS(m->tmp[k - 1]) == POS_ACCEPT;
}

bool tern_gmatch_accept_token(struct tern_gmatch *m, int32_t id) {
    const struct tern_gvocab *v = m->v;
    if (!v || id < 0 || (uint32_t)id >= v->n_vocab) return false;
    for (size_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id) return tern_gmatch_can_end(m);
    if (!v->piece[id]) return false;
    return tern_gmatch_accept_bytes(m, v->piece[id], v->plen[id]);
}

/* ---- masks ------------------------------------------------------------------------- */

static uint64_t state_hash(const uint64_t *cfg, size_t n, struct partial p) {
    uint64_t h = tern_hash64(cfg, n * sizeof *cfg);
    return h ^ mix(((uint64_t)p.have << 40) | ((uint64_t)p.need << 32) | p.cp);
}

static struct centry *cache_find(struct tern_gmatch *m, uint64_t h) {
    for (size_t i = 0; i < m->n_cache; i++) {
        struct centry *e = &m->cache[i];
        if (e->hash == h && e->n_cfg == m->n_cfg && e->part.have == m->part.have && e->part.need == m->part.need &&
            e->part.cp == m->part.cp &&
            !memcmp(e->cfg, m->cfg, m->n_cfg * sizeof *m->cfg))
            return e;
    }
    return NULL;
}

static void cache_put(struct tern_gmatch *m, uint64_t h, const uint32_t *mask, size_t words, size_t count) {
    size_t bytes = words * sizeof *mask + m->n_cfg * sizeof *m->cfg;
    if (bytes > m->cache_budget) return;
    while (m->n_cache && (m->cache_bytes + bytes > m->cache_budget || m->n_cache >= CACHE_MAX_ENTRIES)) {
        size_t lru = 0;
        for (size_t i = 1; i < m->n_cache; i++)
            if (m->cache[i].used < m->cache[lru].used) lru = i;
        m->cache_bytes -= words * sizeof *mask + m->cache[lru].n_cfg * sizeof *m->cfg;
        free(m->cache[lru].cfg);
        free(m->cache[lru].mask);
        m->cache[lru] = m->cache[--m->n_cache];
    }
    if (!grow((void **)&m->cache, &m->cache_cap, m->n_cache + 1, sizeof *m->cache)) return;
    struct centry e = {.n_cfg = m->n_cfg, .part = m->part, .hash = h, .count = count, .used = ++m->tick};
    e.cfg = tern_malloc(m->n_cfg * sizeof *e.cfg + 1);
    e.mask = tern_malloc(words * sizeof *mask);
    if (!e.cfg || !e.mask) {
        free(e.cfg);
        free(e.mask);
        return;
    }
    memcpy(e.cfg, m->cfg, m->n_cfg * sizeof *m->cfg);
    memcpy(e.mask, mask, words * sizeof *mask);
    m->cache[m->n_cache++] = e;
    m->cache_bytes += bytes;
}

#define MEMO_MAX_STATES (1u << 16)
#define MEMO_MAX_CFGS (1u << 20)
#define MEMO_MAX_TRANS (1u << 21)

static void memo_flush(struct tern_gmatch *m) {
    m->n_ms = 0;
    m->n_mpool = 0;
    m->n_t = 0;
    if (m->mtab) memset(m->mtab, 0, m->mtab_cap * sizeof *m->mtab);
    if (m->tkey) memset(m->tkey, 0, m->tcap * sizeof *m->tkey);
}

static bool mstate_eq(const struct tern_gmatch *m, uint32_t id, const uint64_t *cfg, size_t n, struct partial p) {
    const struct mstate *x = &m->ms[id];
    return x->n == n && x->part.have == p.have && x->part.need == p.need && x->part.cp == p.cp &&
           !memcmp(m->mpool + x->off, cfg, n * sizeof *cfg);
}

/* The id of state (cfg, part); shared_off: cfg already lies at mpool + shared_off
 * (SIZE_MAX: copy it in). -1 when out of memory. */
static int32_t mstate_intern(struct tern_gmatch *m, const uint64_t *cfg, size_t n, struct partial part,
                             size_t shared_off) {
    if (m->n_ms * 2 >= m->mtab_cap) {
        size_t nc = m->mtab_cap ? m->mtab_cap * 2 : 1024;
        uint32_t *nt = tern_calloc(nc, sizeof *nt);
        if (!nt) return -1;
        for (size_t i = 0; i < m->n_ms; i++) {
            const struct mstate *x = &m->ms[i];
            size_t h = state_hash(m->mpool + x->off, x->n, x->part) & (nc - 1);
            while (nt[h]) h = (h + 1) & (nc - 1);
            nt[h] = (uint32_t)i + 1;
        }
        free(m->mtab);
        m->mtab = nt;
        m->mtab_cap = nc;
    }
    size_t h = state_hash(cfg, n, part) & (m->mtab_cap - 1);
    while (m->mtab[h]) {
        if (mstate_eq(m, m->mtab[h] - 1, cfg, n, part)) return (int32_t)(m->mtab[h] - 1);
        h = (h + 1) & (m->mtab_cap - 1);
    }
    if (!grow((void **)&m->ms, &m->cap_ms, m->n_ms + 1, sizeof *m->ms)) return -1;
    size_t off = shared_off;
    if (off == SIZE_MAX) {
        if (!grow((void **)&m->mpool, &m->cap_mpool, m->n_mpool + n + 1, sizeof *m->mpool)) return -1;
        off = m->n_mpool;
        memcpy(m->mpool + off, cfg, n * sizeof *cfg);
        m->n_mpool += n;
    }
    m->ms[m->n_ms] = (struct mstate){off, (uint32_t)n, part};
    m->mtab[h] = (uint32_t)m->n_ms + 1;
    return (int32_t)m->n_ms++;
}

/* The state after byte b from state sid: an id, -1 dead, -2 out of memory or a limit;
 * *taint: a path popped into STK_HOLE on the way (only cut states have holes). */
static int32_t memo_step(struct tern_gmatch *m, int32_t sid, uint8_t b, bool *taint) {
    uint64_t key = (((uint64_t)sid << 8) | b) + 1;
    if (m->n_t * 2 >= m->tcap) {
        size_t nc = m->tcap ? m->tcap * 2 : 4096;
        uint64_t *nk = tern_calloc(nc, sizeof *nk);
        int32_t *nv = tern_malloc(nc * sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return -2;
        }
        for (size_t i = 0; i < m->tcap; i++) {
            if (!m->tkey[i]) continue;
            size_t h = mix(m->tkey[i]) & (nc - 1);
            while (nk[h]) h = (h + 1) & (nc - 1);
            nk[h] = m->tkey[i];
            nv[h] = m->tval[i];
        }
        free(m->tkey);
        free(m->tval);
        m->tkey = nk;
        m->tval = nv;
        m->tcap = nc;
    }
    size_t h = mix(key) & (m->tcap - 1);
    while (m->tkey[h]) {
        if (m->tkey[h] == key) {
            *taint = m->tval[h] & 1;
            return (m->tval[h] >> 1) - 1;
        }
        h = (h + 1) & (m->tcap - 1);
    }
    struct mstate x = m->ms[sid];
    m->hole_pop = false;
    size_t nn = 0;
    bool same;
    struct partial np;
    bool ok = step_byte(m, m->mpool + x.off, x.n, x.part, b, &np, &same, &m->buf, &nn, &m->cap_buf);
    if (m->overflow) return -2;
    int32_t next = -1;
    if (ok) {
        next = same ? mstate_intern(m, m->mpool + x.off, x.n, np, x.off) : mstate_intern(m, m->buf, nn, np, SIZE_MAX);
        if (next < 0) return -2;
    }
    /* the intern may have grown the tables, not this one: h is still the free slot */
    *taint = m->hole_pop;
    m->tkey[h] = key;
    m->tval[h] = (next + 1) * 2 + (m->hole_pop ? 1 : 0);
    m->n_t++;
    return next;
}

/* ---- context-independent masks ------------------------------------------------------
 *
 * A string's state differs from every other string's only below the string: in the
 * return stack of the configurations. Cut every stack at the shallowest one's depth
 * (what is below becomes STK_HOLE) and walk the vocabulary with the cut state: a token
 * whose walk never pops into the hole has the same fate in every context; a token that
 * is alive in the cut walk is alive in the real one (its surviving paths exist there
 * too); only the subtrees where the cut walk died after a pop into the hole are unknown.
 * The cut state's walk (allowed bits + unknown subtree roots) is cached by the cut
 * state, so a new context costs the walk of the unknown subtrees only. */

#define CI_MAX_ENTRIES 64

/* The memo id of the cut live state; -1 when nothing is cut (some configuration is at
 * the top level), -2 out of memory. */
static int32_t cut_state(struct tern_gmatch *m) {
    uint32_t base = UINT32_MAX;
    for (size_t i = 0; i < m->n_cfg; i++) {
        uint32_t d = m->nodes[CFG_STK(m->cfg[i])].depth;
        if (CFG_STK(m->cfg[i]) == STK_HOLE) return -1;
        if (d < base) base = d;
    }
    if (base == 0 || base == UINT32_MAX) return -1;
    if (!grow((void **)&m->tmp, &m->cap_tmp, m->n_cfg, sizeof *m->tmp)) return -2;
    for (size_t i = 0; i < m->n_cfg; i++) {
        uint32_t stk = CFG_STK(m->cfg[i]);
        uint32_t keep = m->nodes[stk].depth - base;
        uint32_t rets[TERN_GRAMMAR_MAX_STACK + 1];
        for (uint32_t k = 0; k < keep; k++) {
            rets[k] = m->nodes[stk].ret;
            stk = m->nodes[stk].parent;
        }
        uint32_t ns = STK_HOLE;
        for (uint32_t k = keep; k-- > 0;) {
            ns = intern(m, rets[k], ns);
            if (ns == 0) return -2;
        }
        m->tmp[i] = CFG(CFG_POS(m->cfg[i]), ns);
    }
    size_t n = sort_unique(m->tmp, m->n_cfg);
    int32_t id = mstate_intern(m, m->tmp, n, m->part, SIZE_MAX);
    return id < 0 ? -2 : id;
}

/* Walks the trie from state sid: the whole trie (r == UINT32_MAX) or the subtree of node
 * r (the path to r is walked first). Allowed tokens go into mask; with roots given,
 * tainted dead ends are recorded there instead of being rejected. 0, or -1 on error. */
static int walk(struct tern_gmatch *m, int32_t sid, uint32_t r, uint32_t *mask, size_t *count, uint64_t *visited,
                uint32_t **roots, size_t *n_roots) {
    const struct tern_gvocab *v = m->v;
    size_t begin = 0, end = v->n_nodes;
    unsigned d0 = 1;
    if (r != UINT32_MAX) {
        /* the path to r's parent */
        uint32_t path[TERN_GRAMMAR_MAX_TOKEN_BYTES + 1];
        unsigned np = 0;
        for (uint32_t a = v->parent[r]; a != UINT32_MAX; a = v->parent[a]) path[np++] = a;
        int32_t s = sid;
        while (np > 0) {
            bool taint;
            s = memo_step(m, s, v->byte[path[--np]], &taint);
            (*visited)++;
            if (s == -2) return -1;
            if (s < 0) return 0; /* the whole subtree is rejected */
        }
        sid = s;
        begin = r;
        end = v->skip[r];
        d0 = v->depth[r];
    }
    m->d_sid[d0 - 1] = sid;
    m->d_taint[d0 - 1] = false;
    size_t cap_roots = roots && *roots ? *n_roots : 0;
    for (size_t i = begin; i < end;) {
        unsigned d = v->depth[i];
        (*visited)++;
        bool taint;
        int32_t t = memo_step(m, m->d_sid[d - 1], v->byte[i], &taint);
        if (t == -2) return -1;
        taint = taint || m->d_taint[d - 1];
        if (t < 0) {
            if (taint && roots) {
                if (!grow((void **)roots, &cap_roots, *n_roots + 1, sizeof **roots)) return -1;
                (*roots)[(*n_roots)++] = (uint32_t)i;
            }
            i = v->skip[i];
            continue;
        }
        m->d_sid[d] = t;
        m->d_taint[d] = taint;
        for (uint32_t k = 0; k < v->tok_n[i]; k++) {
            int32_t id = v->toks[v->tok_at[i] + k];
            mask[id / 32] |= 1u << (id % 32);
            (*count)++;
        }
        i++;
    }
    return 0;
}

/* The cut state's walk, cached. */
static struct ci_entry *ci_get(struct tern_gmatch *m, int32_t cut, size_t words, uint64_t *visited) {
    const struct mstate *x = &m->ms[cut];
    const uint64_t *cfg = m->mpool + x->off;
    uint64_t h = state_hash(cfg, x->n, x->part);
    for (size_t i = 0; i < m->n_ci; i++) {
        struct ci_entry *e = &m->ci[i];
        if (e->hash == h && e->n_cfg == x->n && e->part.have == x->part.have && e->part.need == x->part.need &&
            e->part.cp == x->part.cp && !memcmp(e->cfg, cfg, x->n * sizeof *cfg)) {
            e->used = ++m->tick;
            m->stats.ci_hits++;
            return e;
        }
    }
    struct ci_entry e = {.n_cfg = x->n, .part = x->part, .hash = h, .used = ++m->tick};
    e.cfg = tern_malloc(x->n * sizeof *e.cfg + 1);
    e.acc = tern_calloc(words, sizeof *e.acc);
    if (!e.cfg || !e.acc) {
        ci_free(&e);
        return NULL;
    }
    memcpy(e.cfg, cfg, x->n * sizeof *cfg);
    if (walk(m, cut, UINT32_MAX, e.acc, &e.count, visited, &e.roots, &e.n_roots)) {
        ci_free(&e);
        return NULL;
    }
    if (m->n_ci >= CI_MAX_ENTRIES) {
        size_t lru = 0;
        for (size_t i = 1; i < m->n_ci; i++)
            if (m->ci[i].used < m->ci[lru].used) lru = i;
        ci_free(&m->ci[lru]);
        m->ci[lru] = m->ci[--m->n_ci];
    }
    if (!grow((void **)&m->ci, &m->cap_ci, m->n_ci + 1, sizeof *m->ci)) {
        ci_free(&e);
        return NULL;
    }
    m->ci[m->n_ci] = e;
    return &m->ci[m->n_ci++];
}

void tern_gmatch_set_cut(struct tern_gmatch *m, bool on) { m->no_cut = !on; }

size_t tern_gmatch_mask(struct tern_gmatch *m, uint32_t *mask, enum tern_status *st) {
    const struct tern_gvocab *v = m->v;
    if (st) *st = TERN_OK;
    if (!v) return 0;
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    m->stats.masks++;
    uint64_t h = state_hash(m->cfg, m->n_cfg, m->part);
    struct centry *ce = cache_find(m, h);
    if (ce) {
        ce->used = ++m->tick;
        memcpy(mask, ce->mask, words * sizeof *mask);
        m->stats.cache_hits++;
        return ce->count;
    }
    memset(mask, 0, words * sizeof *mask);
    size_t count = 0;
    m->overflow = false;
    if (m->n_ms > MEMO_MAX_STATES || m->n_mpool > MEMO_MAX_CFGS || m->n_t > MEMO_MAX_TRANS) memo_flush(m);
    int32_t root = mstate_intern(m, m->cfg, m->n_cfg, m->part, SIZE_MAX);
    if (root < 0) goto nomem;
    uint64_t visited = 0;
    int32_t cut = m->no_cut ? -1 : cut_state(m);
    if (cut == -2) goto nomem;
    if (cut >= 0) {
        /* context-independent part from the cut state's cache, then the real state's
         * walk only below the nodes where the cut state did not know */
        struct ci_entry *ci = ci_get(m, cut, words, &visited);
        if (!ci) {
            if (m->overflow) goto limit;
            goto nomem;
        }
        memcpy(mask, ci->acc, words * sizeof *mask);
        count = ci->count;
        m->stats.ci_roots += ci->n_roots;
        for (size_t r = 0; r < ci->n_roots; r++) {
            int rc = walk(m, root, ci->roots[r], mask, &count, &visited, NULL, NULL);
            if (rc) {
                if (m->overflow) goto limit;
                goto nomem;
            }
        }
    } else if (walk(m, root, UINT32_MAX, mask, &count, &visited, NULL, NULL)) {
        if (m->overflow) goto limit;
        goto nomem;
    }
    /* special tokens: only where a configuration expects exactly their first character
     * (a literal in the grammar), never through a class such as a string's [^"] */
    for (size_t k = 0; k < v->n_spec; k++) {
        int32_t id = v->spec[k];
        const uint8_t *p = v->piece[id];
        if (m->part.need || p[0] >= 0x80) continue;
        bool literal = false;
        for (size_t c = 0; c < m->n_cfg && !literal; c++) {
            uint32_t pos = CFG_POS(m->cfg[c]);
            if (pos == POS_ACCEPT) continue;
            const struct gel *e = &m->g->el[pos];
            const uint32_t *r = m->g->ranges + 2 * (size_t)e->a;
            literal = !e->neg && e->n == 1 && r[0] == p[0] && r[1] == p[0];
        }
        struct partial fp;
        if (literal && run_bytes(m, p, v->plen[id], &fp)) {
            mask[id / 32] |= 1u << (id % 32);
            count++;
        }
    }
    if (m->overflow) goto limit;
    if (tern_gmatch_can_end(m)) {
        for (size_t k = 0; k < v->n_eog; k++) {
            int32_t id = v->eog[k];
            mask[id / 32] |= 1u << (id % 32);
            count++;
        }
    }
    m->stats.nodes_visited += visited;
    cache_put(m, h, mask, words, count);
    return count;
limit:
    if (st) *st = tern_errorf(TERN_ERR_LIMIT, "grammar: the state outgrew its limits (stack depth %u, %u stack "
                              "nodes or %u configurations in one step)", TERN_GRAMMAR_MAX_STACK, MAX_STACK_NODES,
                              TERN_GRAMMAR_MAX_EXPANSION);
    return 0;
nomem:
    if (st) *st = tern_errorf(TERN_ERR_NOMEM, "grammar: out of memory computing a mask");
    return 0;
}

void tern_gmatch_get_stats(const struct tern_gmatch *m, struct tern_gmatch_stats *s) {
    *s = m->stats;
    s->n_stack_nodes = m->n_nodes;
    s->n_cached = m->n_cache;
}
