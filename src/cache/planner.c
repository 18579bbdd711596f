#include "cache/planner.h"

#include <stddef.h>
#include <string.h>

size_t plan_lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t n = na < nb ? na : nb, i = 0;
    /* Compare in blocks with memcmp first: prompts share long prefixes. */
    const size_t B = 256;
    while (i + B <= n && !memcmp(a + i, b + i, B * sizeof *a)) i += B;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

struct plan_resume plan_resume_point(const struct plan_candidate *c, const int32_t *prompt, size_t m) {
    struct plan_resume res = {.r = 0, .lcp = 0, .ckpt_index = -1, .live = false, .first_unusable_ckpt = 0};
    if (m == 0) return res;
    size_t lcp = plan_lcp(c->tokens, c->n, prompt, m);
    res.lcp = (uint32_t)lcp;
    size_t limit = lcp < m ? lcp : m - 1; /* r <= LCP and r < m */
    if (limit == c->n && c->n > 0) {
        res.r = c->n;
        res.live = true;
        return res;
    }
    if (c->any_position) {
        res.r = (uint32_t)limit;
        return res;
    }
    /* Hybrid: the largest checkpoint position <= limit. */
    for (size_t i = c->n_ckpt; i-- > 0;) {
        if (c->ckpt_pos[i] <= limit) {
            if (c->ckpt_pos[i] > 0) {
                res.r = c->ckpt_pos[i];
                res.ckpt_index = (int)i;
            }
            break;
        }
        res.first_unusable_ckpt = c->ckpt_pos[i];
    }
    return res;
}

size_t plan_insert_slot(void *base, size_t n, size_t elem_size, size_t key_off, uint32_t pos) {
    uint8_t *b = base;
    size_t j = n;
    for (uint32_t key; j > 0; j--) {
        memcpy(&key, b + (j - 1) * elem_size + key_off, sizeof key);
        if (key <= pos) break;
    }
    memmove(b + (j + 1) * elem_size, b + j * elem_size, (n - j) * elem_size);
    return j;
}

static size_t add_point(struct plan_point *out, size_t n, size_t cap, uint32_t pos, uint32_t kind) {
    for (size_t i = 0; i < n; i++) {
        if (out[i].pos == pos) {
            out[i].kinds |= kind;
            return n;
        }
    }
    if (n == cap) return n;
    size_t j = plan_insert_slot(out, n, sizeof *out, offsetof(struct plan_point, pos), pos);
    out[j] = (struct plan_point){.pos = pos, .kinds = kind};
    return n + 1;
}

size_t plan_checkpoints(uint32_t r, uint32_t m, const struct plan_turn *turns, size_t n_turns,
                        uint32_t ckpt_every, struct plan_point *out, size_t cap) {
    size_t n = 0;
    if (m <= r || cap == 0) return 0;
    /* The end of the prompt: a client that replays its own record of the reply, or
     * strips its reasoning, diverges right after it. */
    n = add_point(out, n, cap, m, PLAN_CKPT_END);
    if (n_turns > 0) {
        /* The last turn start: the generation header. Where the next request's
         * re-rendered history still matches when the end does not (a tokenization that
         * merges across the header). */
        uint32_t last = turns[n_turns - 1].pos;
        if (last > r && last < m) n = add_point(out, n, cap, last, PLAN_CKPT_BOUNDARY);
        /* The turn start right after the latest real user message: a Qwen-style
         * template drops the reasoning of every assistant turn since then when the next
         * user message arrives, so that is where the next rewrite lands. */
        for (size_t i = n_turns; i-- > 0;) {
            if (turns[i].role == PLAN_ROLE_USER) {
                if (i + 1 < n_turns) {
                    uint32_t p = turns[i + 1].pos;
                    if (p > r && p <= m) n = add_point(out, n, cap, p, PLAN_CKPT_USER);
                }
                break;
            }
        }
        /* The end of the first turn (a system prompt shared by subagents). */
        if (n_turns > 1 && turns[0].role == PLAN_ROLE_SYSTEM) {
            uint32_t p = turns[1].pos;
            if (p > r && p < m) n = add_point(out, n, cap, p, PLAN_CKPT_SYSTEM);
        }
    }
    if (ckpt_every > 0) {
        for (uint64_t p = (uint64_t)r + ckpt_every; p < m; p += ckpt_every)
            n = add_point(out, n, cap, (uint32_t)p, PLAN_CKPT_PERIODIC);
    }
    return n;
}

size_t plan_retain(const struct plan_kept *pts, size_t n, size_t max, bool *drop) {
    for (size_t i = 0; i < n; i++) drop[i] = false;
    if (n <= max) return 0;
    /* Protected: newest of each of USER, BOUNDARY, END. */
    bool prot[n];
    memset(prot, 0, sizeof prot);
    const uint32_t kinds[] = {PLAN_CKPT_USER, PLAN_CKPT_END, PLAN_CKPT_BOUNDARY};
    size_t n_prot = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        long best = -1;
        for (size_t i = 0; i < n; i++)
            if ((pts[i].kinds & kinds[k]) && (best < 0 || pts[i].stamp > pts[(size_t)best].stamp ||
                                               (pts[i].stamp == pts[(size_t)best].stamp && pts[i].pos > pts[(size_t)best].pos)))
                best = (long)i;
        if (best >= 0 && !prot[best] && n_prot < max) {
            prot[best] = true;
            n_prot++;
        }
    }
    size_t alive = n, dropped = 0;
    while (alive > max) {
        /* Among unprotected points, drop the one whose gap to its nearest kept neighbour
         * is smallest (keeps the spacing even); older first on ties. */
        long victim = -1;
        uint64_t victim_gap = 0;
        for (size_t i = 0; i < n; i++) {
            if (drop[i] || prot[i]) continue;
            uint64_t gap = UINT64_MAX;
            for (long j = (long)i - 1; j >= 0; j--)
                if (!drop[j]) {
                    gap = pts[i].pos - pts[j].pos;
                    break;
                }
            for (size_t j = i + 1; j < n; j++)
                if (!drop[j]) {
                    uint64_t g = pts[j].pos - pts[i].pos;
                    if (g < gap) gap = g;
                    break;
                }
            bool better = victim < 0 || gap < victim_gap;
            if (!better && gap == victim_gap) {
                const struct plan_kept *v = &pts[(size_t)victim];
                /* ties: older first; then old boundaries before spaced periodic points */
                better = pts[i].stamp < v->stamp ||
                         (pts[i].stamp == v->stamp && !(pts[i].kinds & PLAN_CKPT_PERIODIC) &&
                          (v->kinds & PLAN_CKPT_PERIODIC));
            }
            if (better) {
                victim = (long)i;
                victim_gap = gap;
            }
        }
        if (victim < 0) break; /* everything left is protected */
        drop[victim] = true;
        alive--;
        dropped++;
    }
    return dropped;
}
