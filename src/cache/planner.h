/* The reuse planner's pure decisions (DESIGN.md §4): resume points from bytes, the
 * checkpoint plan for the tokens about to be read, and which checkpoints a session
 * keeps. No model, no I/O: everything here is unit-tested on token arrays. */
#ifndef TERN_CACHE_PLANNER_H
#define TERN_CACHE_PLANNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest common prefix of a[0..na) and b[0..nb). */
size_t plan_lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb);

/* What a candidate offers: its tokens T[0..n) (the live end n), whether any position
 * <= n is resumable (attention-only), and otherwise its checkpoint positions. */
struct plan_candidate {
    const int32_t *tokens;
    uint32_t n;
    bool any_position;          /* attention-only: every p <= n is a resume point */
    const uint32_t *ckpt_pos;   /* ascending */
    size_t n_ckpt;
};

struct plan_resume {
    uint32_t r;         /* resume point: tokens not read again (0 = cold) */
    uint32_t lcp;       /* longest common prefix with the prompt */
    int ckpt_index;     /* index into ckpt_pos when r is a checkpoint; -1 otherwise */
    bool live;          /* r == n: the live end */
    /* When the candidate offered nothing useful: the first checkpoint at or above the
     * divergence, for the "declined" explanation (0 if none). */
    uint32_t first_unusable_ckpt;
};

/* The largest r with r <= LCP, r < m (at least one token left to prime), r resumable.
 * r = 0 means nothing usable. */
struct plan_resume plan_resume_point(const struct plan_candidate *c, const int32_t *prompt, size_t m);

/* Checkpoint kinds, in decreasing order of what retention protects. */
enum plan_ckpt_kind {
    PLAN_CKPT_USER = 1 << 0,      /* the turn start right after the latest real user message */
    PLAN_CKPT_BOUNDARY = 1 << 1,  /* the last turn start of a prompt (the generation header) */
    PLAN_CKPT_END = 1 << 2,       /* the end of a prompt, just before the first generated token */
    PLAN_CKPT_SYSTEM = 1 << 3,    /* the end of the first turn (shared system prompt) */
    PLAN_CKPT_PERIODIC = 1 << 4,  /* every ckpt_every freshly read tokens */
    PLAN_CKPT_PREDICTED = 1 << 5, /* primed ahead of time (predictive priming) */
};

/* Roles of the turns of a prompt, found by the caller from the tokens after each
 * turn-start token. */
enum plan_role { PLAN_ROLE_OTHER = 0, PLAN_ROLE_SYSTEM, PLAN_ROLE_USER, PLAN_ROLE_ASSISTANT, PLAN_ROLE_TOOL };

struct plan_turn {
    uint32_t pos;         /* position of the turn-start token */
    enum plan_role role;
};

struct plan_point {
    uint32_t pos;
    uint32_t kinds;       /* PLAN_CKPT_* bits (one position can serve several purposes) */
};

/* The checkpoint plan for priming prompt[r..m): positions p with r < p <= m.
 * turns: the prompt's turn starts (ascending). Writes at most cap points (ascending,
 * unique) and returns how many. */
size_t plan_checkpoints(uint32_t r, uint32_t m, const struct plan_turn *turns, size_t n_turns,
                        uint32_t ckpt_every, struct plan_point *out, size_t cap);

/* Retention: given a session's checkpoints (ascending positions with kinds and a
 * "newest" stamp), choose which to drop so that at most max remain. Protected, in
 * order: the newest USER point, the newest BOUNDARY and END points; then periodic and
 * other points are dropped where they are closest to a neighbour (keeping the spacing
 * even), older first on ties. Sets drop[i] = true for the dropped ones and returns
 * how many were dropped. */
struct plan_kept {
    uint32_t pos;
    uint32_t kinds;
    uint64_t stamp;   /* larger = newer */
};
size_t plan_retain(const struct plan_kept *pts, size_t n, size_t max, bool *drop);

/* The sorted insert of every ascending position list in the cache (checkpoint plans,
 * a session's checkpoints): base[0..n) holds elements of elem_size bytes, ascending by
 * the uint32_t at key_off, with room for one more. Shifts the elements above pos up by
 * one and returns the index of the slot opened for pos (after any equal keys). */
size_t plan_insert_slot(void *base, size_t n, size_t elem_size, size_t key_off, uint32_t pos);

#endif
