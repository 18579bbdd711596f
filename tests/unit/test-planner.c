/* cache planner and fingerprints: pure decisions on token arrays. */
#include "harness.h"

#include "cache/fingerprint.h"
#include "cache/planner.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum { IM_START = 900, IM_END = 901, N_VOCAB = 1000 };

static uint8_t sep_bits[N_VOCAB / 8 + 1];
static const struct fp_separators sep = {sep_bits, N_VOCAB};

static int setup(void **state) {
    (void)state;
    memset(sep_bits, 0, sizeof sep_bits);
    sep_bits[IM_START >> 3] |= (uint8_t)(1 << (IM_START & 7));
    sep_bits[IM_END >> 3] |= (uint8_t)(1 << (IM_END & 7));
    return 0;
}

/* Appends a turn: IM_START role body... IM_END 10 */
static size_t turn(int32_t *t, size_t n, int32_t role, const int32_t *body, size_t nb) {
    t[n++] = IM_START;
    t[n++] = role;
    for (size_t i = 0; i < nb; i++) t[n++] = body[i];
    t[n++] = IM_END;
    t[n++] = 10;
    return n;
}

static void test_lcp(void **state) {
    (void)state;
    int32_t a[1000], b[1000];
    for (int i = 0; i < 1000; i++) a[i] = b[i] = i;
    assert_int_equal(plan_lcp(a, 1000, b, 1000), 1000);
    b[700] = -1;
    assert_int_equal(plan_lcp(a, 1000, b, 1000), 700);
    assert_int_equal(plan_lcp(a, 10, b, 1000), 10);
    b[0] = -1;
    assert_int_equal(plan_lcp(a, 1000, b, 1000), 0);
}

/* The one sorted insert: ascending by a key inside a larger element, after equal keys. */
static void test_insert_slot(void **state) {
    (void)state;
    struct el {
        uint64_t tag;
        uint32_t pos;
    } a[8] = {{1, 10}, {2, 20}, {3, 30}};
    size_t n = 3;
    const uint32_t add[] = {25, 5, 40, 20};
    for (size_t i = 0; i < 4; i++) {
        size_t j = plan_insert_slot(a, n, sizeof *a, offsetof(struct el, pos), add[i]);
        a[j] = (struct el){100 + i, add[i]};
        n++;
    }
    const uint32_t want_pos[] = {5, 10, 20, 20, 25, 30, 40};
    const uint64_t want_tag[] = {101, 1, 2, 103, 100, 3, 102};
    assert_int_equal(n, 7);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(a[i].pos, want_pos[i]);
        assert_int_equal(a[i].tag, want_tag[i]);
    }
}

static void test_resume_point_rules(void **state) {
    (void)state;
    int32_t sess[100], prompt[120];
    for (int i = 0; i < 100; i++) sess[i] = i;
    for (int i = 0; i < 120; i++) prompt[i] = i;
    uint32_t ck[] = {10, 40, 80};
    struct plan_candidate c = {sess, 100, false, ck, 3};
    /* pure extension: the live end */
    struct plan_resume r = plan_resume_point(&c, prompt, 120);
    assert_int_equal(r.r, 100);
    assert_true(r.live);
    /* divergence at 60 on a hybrid: the checkpoint at 40, never above the divergence */
    prompt[60] = -5;
    r = plan_resume_point(&c, prompt, 120);
    assert_int_equal(r.lcp, 60);
    assert_int_equal(r.r, 40);
    assert_int_equal(r.ckpt_index, 1);
    assert_false(r.live);
    assert_int_equal(r.first_unusable_ckpt, 80);
    /* attention-only: any position */
    c.any_position = true;
    r = plan_resume_point(&c, prompt, 120);
    assert_int_equal(r.r, 60);
    /* r < m: the same prompt again must leave one token to read */
    c.any_position = false;
    uint32_t ck2[] = {10, 99, 100};
    c.ckpt_pos = ck2;
    r = plan_resume_point(&c, sess, 100);
    assert_int_equal(r.r, 99);
    /* divergence at 0: cold */
    prompt[0] = -1;
    r = plan_resume_point(&c, prompt, 120);
    assert_int_equal(r.r, 0);
    /* divergence below the first checkpoint: cold, with the explanation */
    for (int i = 0; i < 120; i++) prompt[i] = i;
    prompt[5] = -1;
    r = plan_resume_point(&c, prompt, 120);
    assert_int_equal(r.r, 0);
    assert_int_equal(r.first_unusable_ckpt, 10);
}

static void test_checkpoint_plan(void **state) {
    (void)state;
    /* system @0, user @20, assistant @50, tool(user role) @70 ... generation header @100, m = 103 */
    struct plan_turn turns[] = {
        {0, PLAN_ROLE_SYSTEM}, {20, PLAN_ROLE_USER}, {50, PLAN_ROLE_ASSISTANT}, {70, PLAN_ROLE_TOOL}, {100, PLAN_ROLE_ASSISTANT}};
    struct plan_point pts[16];
    size_t n = plan_checkpoints(0, 103, turns, 5, 32, pts, 16);
    /* END 103, BOUNDARY 100, USER 50 (turn after the last user message), SYSTEM 20,
     * PERIODIC 32, 64, 96 */
    uint32_t want[] = {20, 32, 50, 64, 96, 100, 103};
    assert_int_equal(n, 7);
    for (size_t i = 0; i < n; i++) assert_int_equal(pts[i].pos, want[i]);
    assert_true(pts[2].kinds & PLAN_CKPT_USER);
    assert_true(pts[5].kinds & PLAN_CKPT_BOUNDARY);
    assert_true(pts[6].kinds & PLAN_CKPT_END);
    /* resuming at 60: only points above r */
    n = plan_checkpoints(60, 103, turns, 5, 0, pts, 16);
    assert_int_equal(n, 2);
    assert_int_equal(pts[0].pos, 100);
    assert_int_equal(pts[1].pos, 103);
    /* periodic spacing counts from r (freshly read tokens) */
    n = plan_checkpoints(60, 103, NULL, 0, 16, pts, 16);
    assert_int_equal(n, 3);
    assert_int_equal(pts[0].pos, 76);
    assert_int_equal(pts[1].pos, 92);
}

static void test_retention_protects_user_boundary(void **state) {
    (void)state;
    /* An agent loop: the USER point was made long ago (stamp 1); later extension turns
     * added boundaries/ends and periodic points. With max 4, the USER point, newest END
     * and BOUNDARY stay; one periodic point survives. */
    struct plan_kept k[] = {
        {100, PLAN_CKPT_USER, 1},     {900, PLAN_CKPT_PERIODIC, 2}, {1000, PLAN_CKPT_BOUNDARY, 2},
        {1003, PLAN_CKPT_END, 2},     {1900, PLAN_CKPT_PERIODIC, 3}, {2000, PLAN_CKPT_BOUNDARY, 3},
        {2003, PLAN_CKPT_END, 3},
    };
    bool drop[7];
    size_t d = plan_retain(k, 7, 4, drop);
    assert_int_equal(d, 3);
    assert_false(drop[0]); /* user */
    assert_false(drop[5]); /* newest boundary */
    assert_false(drop[6]); /* newest end */
    int kept = 0;
    for (int i = 0; i < 7; i++) kept += !drop[i];
    assert_int_equal(kept, 4);
    /* the survivor among the rest is far from its neighbours: 900 (the 1000/1003 and
     * 1900 points crowd each other) */
    assert_false(drop[1]);
    /* under the limit: nothing dropped */
    assert_int_equal(plan_retain(k, 3, 8, drop), 0);
}

static void test_fingerprint_nominates_rewritten_history(void **state) {
    (void)state;
    int32_t sys[40], u1[30], think[200], ans[20], u2[25];
    for (int i = 0; i < 40; i++) sys[i] = 100 + i;
    for (int i = 0; i < 30; i++) u1[i] = 200 + i;
    for (int i = 0; i < 200; i++) think[i] = 300 + (i % 50);
    for (int i = 0; i < 20; i++) ans[i] = 400 + i;
    for (int i = 0; i < 25; i++) u2[i] = 500 + i;
    enum { SYS = 1, USER = 2, ASST = 3 };
    /* conversation A as parked: sys, u1, assistant with head + think + tail */
    int32_t a[1000], b[1000];
    size_t na = 0;
    na = turn(a, na, SYS, sys, 40);
    na = turn(a, na, USER, u1, 30);
    int32_t asst_full[20 + 200 + 20];
    memcpy(asst_full, ans, 10 * sizeof(int32_t));
    memcpy(asst_full + 10, think, 200 * sizeof(int32_t));
    memcpy(asst_full + 210, ans + 10, 10 * sizeof(int32_t));
    na = turn(a, na, ASST, asst_full, 220);
    /* the next request: same, but the reasoning stripped from the middle, plus u2 */
    size_t nb = 0;
    nb = turn(b, nb, SYS, sys, 40);
    nb = turn(b, nb, USER, u1, 30);
    nb = turn(b, nb, ASST, ans, 20);
    nb = turn(b, nb, USER, u2, 25);
    struct fingerprint fa = {0}, fb = {0};
    assert_int_equal(fp_compute(&sep, a, na, &fa), TERN_OK);
    assert_int_equal(fp_compute(&sep, b, nb, &fb), TERN_OK);
    /* segments: [sys turn][end][user turn][end][asst turn][end][...]; the assistant
     * turn's edges are unchanged by the stripped middle */
    assert_true(fp_shared(&fa, &fb) >= 5);
    assert_true(fp_shared(&fa, &fb) >= FP_MIN_SHARED);
    /* a different conversation with the same system prompt shares only 2 */
    int32_t c[1000];
    size_t nc = 0;
    nc = turn(c, nc, SYS, sys, 40);
    nc = turn(c, nc, USER, u2, 25);
    struct fingerprint fc = {0};
    assert_int_equal(fp_compute(&sep, c, nc, &fc), TERN_OK);
    assert_int_equal(fp_shared(&fa, &fc), 2);
    assert_true(fp_shared(&fa, &fc) < FP_MIN_SHARED);
    /* a markerless raw prompt has no complete segment: never nominated */
    int32_t raw[50];
    for (int i = 0; i < 50; i++) raw[i] = i;
    struct fingerprint fr = {0};
    assert_int_equal(fp_compute(&sep, raw, 50, &fr), TERN_OK);
    assert_int_equal(fr.n, 0);
    fp_free(&fa);
    fp_free(&fb);
    fp_free(&fc);
    fp_free(&fr);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lcp),
        cmocka_unit_test(test_insert_slot),
        cmocka_unit_test(test_resume_point_rules),
        cmocka_unit_test(test_checkpoint_plan),
        cmocka_unit_test(test_retention_protects_user_boundary),
        cmocka_unit_test(test_fingerprint_nominates_rewritten_history),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
