/* Who may be resumed (DESIGN.md §4, candidates): one rule and one walk, for requests and
 * predictions alike, over the RAM pool and the disk tier. Identity only nominates;
 * bytes decide (planner.c), so a wrong nomination costs one comparison. */
#include "cache/cache-impl.h"

#include "util/mem.h"

/* The rule. Tenants never mix, named and unnamed never mix; a named caller sees its
 * key's sessions; an unnamed one sees the sessions its fingerprint nominates (not with
 * TERN_AFFINITY=0) and the PROBE_RECENT most recent unnamed ones (*n_probe counts
 * them). c->req_fp is the fingerprint of the tokens being placed. */
static bool nominate(const struct cache *c, const char *tenant, const char *key, const struct fingerprint *fp,
                     const struct cache_ident *id, size_t *n_probe, struct nomination *out) {
    memset(out, 0, sizeof *out);
    const bool named = id->key && *id->key;
    if (!cache_same_str(tenant, id->tenant)) return false; /* tenants never mix */
    if (named != (key != NULL)) return false;               /* named and unnamed never mix */
    if (named) {
        if (strcmp(key, id->key)) return false;
        out->by_key = true;
        return true;
    }
    if (c->p.affinity && fp_shared(fp, &c->req_fp) >= FP_MIN_SHARED) out->by_fp = true;
    if (*n_probe < PROBE_RECENT) {
        out->by_probe = true;
        (*n_probe)++;
    }
    return out->by_fp || out->by_probe;
}

static struct plan_resume evaluate(const struct cache *c, const struct entry *e, const int32_t *toks, size_t n) {
    uint32_t pos[MAX_PLAN * 4];
    size_t n_pos = 0;
    for (size_t i = 0; i < e->n_ck && n_pos < TERN_ARRAY_LEN(pos); i++) pos[n_pos++] = e->ck[i].pos;
    struct plan_candidate cand = {
        .tokens = tern_session_tokens(e->s),
        .n = tern_session_n_past(e->s),
        .any_position = !c->hybrid,
        .ckpt_pos = pos,
        .n_ckpt = n_pos,
    };
    return plan_resume_point(&cand, toks, n);
}

size_t cache_candidates(struct cache *c, const struct cache_ident *id, const int32_t *toks, size_t n,
                        cache_candidate_fn visit, void *ctx) {
    size_t n_probe = 0, n_compared = 0;
    for (struct entry *e = c->head; e; e = e->next) {
        struct candidate cand = {.e = e};
        if (e->leased || (c->skip_pinned && cache_entry_pinned(c, e))) continue;
        if (!nominate(c, e->tenant, e->key, &e->fp, id, &n_probe, &cand.nom)) continue;
        cand.res = evaluate(c, e, toks, n);
        n_compared++;
        if (!visit(ctx, &cand)) break;
    }
    return n_compared;
}

/* The best of a list of disk entries (the index, or peers' writes in flight). */
static struct disk_choice disk_best_of(struct cache *c, const struct cache_ident *id, const int32_t *toks, size_t n,
                                       size_t count, const struct disk_entry *(*at)(struct disk *, size_t),
                                       size_t *n_compared) {
    struct disk_choice best = {.idx = -1};
    size_t n_probe = 0;
    for (size_t i = 0; i < count; i++) {
        const struct disk_entry *de = at(c->disk, i);
        struct nomination nom;
        if (!nominate(c, de->tenant, de->key, &de->fp, id, &n_probe, &nom)) continue;
        struct plan_candidate cand = {
            .tokens = de->tokens,
            .n = de->n,
            .any_position = !c->hybrid,
            .ckpt_pos = de->ckpt_pos,
            .n_ckpt = de->n_ckpt,
        };
        struct plan_resume r = plan_resume_point(&cand, toks, n);
        (*n_compared)++;
        if (r.r > best.res.r) {
            best.idx = (long)i;
            best.res = r;
            best.by_fp = nom.by_fp;
        }
    }
    return best;
}

struct disk_choice cache_disk_best(struct cache *c, const struct cache_ident *id, const int32_t *toks, size_t n) {
    if (!c->disk) return (struct disk_choice){.idx = -1};
    disk_refresh(c->disk);
    size_t n_compared = 0;
    struct disk_choice best = disk_best_of(c, id, toks, n, disk_count(c->disk), disk_at, &n_compared);
    STAT_ADD(c, candidates, n_compared);
    return best;
}

struct disk_choice cache_disk_wip_best(struct cache *c, const struct cache_ident *id, const int32_t *toks, size_t n) {
    if (!c->disk) return (struct disk_choice){.idx = -1};
    size_t n_compared = 0;
    return disk_best_of(c, id, toks, n, disk_wip_count(c->disk), disk_wip_at, &n_compared);
}
