/* Test helper: checks candidate logits against a reference record of the conformance
 * kit (shared/conformance/logits/<model>/<prompt>.json + .f32) with the rules of
 * shared/conformance/README.md §4, as check_logits.py applies them. The numbers each
 * rule uses come from the record's "tolerance" object.
 *
 *   F32 records:   every position p: max_v |cand - ref| <= T * max_v |ref|; top-1 agrees
 *                  wherever the reference margin >= 2 T max|ref|; greedy prefix.
 *   quant records: RMS(cand - ref) / RMS(ref) <= rms_rel_max (rms_rel_strict with
 *                  strict); top-1 agrees where the reference margin >= top1_margin;
 *                  top-1 fraction >= top1_min_frac for prompts of >= 100 tokens;
 *                  greedy prefix. Without a shipped .f32 the comparison uses the
 *                  reference top-5 entries of each position. */
#ifndef TERN_TEST_LOGITS_CHECK_H
#define TERN_TEST_LOGITS_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct lc_ref;

/* Loads a record (and its .f32 when one is shipped). NULL with a message on stderr on
 * error. */
struct lc_ref *lc_ref_load(const char *json_path);
void lc_ref_free(struct lc_ref *r);

const char *lc_ref_name(const struct lc_ref *r); /* "model:prompt" */
size_t lc_ref_n_tokens(const struct lc_ref *r);
size_t lc_ref_n_vocab(const struct lc_ref *r);
const int32_t *lc_ref_prompt(const struct lc_ref *r);      /* [n_tokens] */
size_t lc_ref_n_greedy(const struct lc_ref *r);
const int32_t *lc_ref_greedy(const struct lc_ref *r);      /* [n_greedy] */
bool lc_ref_is_f32(const struct lc_ref *r);

struct lc_result {
    bool pass;
    double max_abs;        /* max |diff| over the compared entries */
    double max_rel;        /* worst per-position max|diff| / max|ref| */
    size_t worst_pos;
    double rms_rel;        /* RMS(diff) / RMS(ref) */
    double top1_frac;
    size_t n_top1_bad;     /* top-1 disagreements where the rule requires agreement */
    size_t greedy_agree;   /* leading greedy ids equal to the reference */
    size_t greedy_required;
    char summary[512];     /* one line with the numbers and the verdict */
};

/* cand: [n_tokens][n_vocab]; greedy: the candidate's greedy continuation (NULL: not
 * checked). */
void lc_check(const struct lc_ref *r, const float *cand, const int32_t *greedy, size_t n_greedy, bool strict,
              struct lc_result *res);

#endif
