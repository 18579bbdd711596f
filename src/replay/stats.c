/* Per-turn medians, class tables and sums. Medians are taken per turn over the
 * repetitions (never a mean over turns: the turns differ by design). */
#include "replay/replay.h"

#include "util/mem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tern_stats_median(const double *v, size_t n) {
    double small[64];
    double *tmp = n <= 64 ? small : tern_malloc(n * sizeof *tmp);
    if (!tmp) return NAN;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(v[i])) tmp[k++] = v[i];
    double med = NAN;
    if (k > 0) {
        qsort(tmp, k, sizeof *tmp, cmp_double);
        med = k % 2 ? tmp[k / 2] : 0.5 * (tmp[k / 2 - 1] + tmp[k / 2]);
    }
    if (tmp != small) free(tmp);
    return med;
}

void tern_stats_range(const double *v, size_t n, double *lo, double *hi) {
    *lo = *hi = NAN;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i])) continue;
        if (!(v[i] >= *lo)) *lo = v[i];
        if (!(v[i] <= *hi)) *hi = v[i];
    }
}

void tern_replay_summary_free(struct tern_replay_summary *s) {
    if (!s) return;
    free(s->turns);
    s->turns = NULL;
}

enum tern_status tern_replay_summarize_arrays(size_t n_turns, int n_reps, int n_arms, const enum tern_turn_kind *kinds,
                                              const double *ttft, const double *total, const long *prompt,
                                              const long *cached, const uint64_t *hash,
                                              struct tern_replay_summary *s) {
    memset(s, 0, sizeof *s);
    if (n_arms < 1 || n_arms > TERN_REPLAY_MAX_ARMS || n_reps < 1)
        return tern_errorf(TERN_ERR_INVALID, "summary of %d arms x %d reps (arms 1..%d, reps >= 1)", n_arms, n_reps,
                           TERN_REPLAY_MAX_ARMS);
    s->n_turns = n_turns;
    s->n_arms = n_arms;
    s->first_rewrite = s->last_rewrite = -1;
    s->turns = tern_calloc(n_turns ? n_turns : 1, sizeof *s->turns);
    if (!s->turns) return tern_errorf(TERN_ERR_NOMEM, "out of memory for %zu turn summaries", n_turns);
    double *col = tern_calloc((size_t)n_reps, sizeof *col);
    double *rd = tern_calloc((size_t)n_reps, sizeof *rd);
    double *ch = tern_calloc((size_t)n_reps, sizeof *ch);
    double *tt = tern_calloc((size_t)n_reps, sizeof *tt);
    double *per_class = tern_calloc(n_turns ? n_turns : 1, sizeof *per_class);
    if (!col || !rd || !ch || !tt || !per_class) {
        free(col), free(rd), free(ch), free(tt), free(per_class);
        tern_replay_summary_free(s);
        return tern_errorf(TERN_ERR_NOMEM, "out of memory summarizing");
    }
#define AT(arr, r, t, a) (arr)[((size_t)(r) * n_turns + (t)) * (size_t)n_arms + (size_t)(a)]
    for (size_t t = 0; t < n_turns; t++) {
        struct tern_turn_summary *ts = &s->turns[t];
        ts->kind = kinds[t];
        ts->prompt_tokens = -1;
        bool have_hash = false, same = true;
        uint64_t h0 = 0;
        for (int a = 0; a < n_arms; a++) {
            for (int r = 0; r < n_reps; r++) {
                col[r] = AT(ttft, r, t, a);
                tt[r] = total ? AT(total, r, t, a) : NAN;
                long p = prompt ? AT(prompt, r, t, a) : -1;
                long c = cached ? AT(cached, r, t, a) : -1;
                ch[r] = c >= 0 ? (double)c : NAN;
                rd[r] = p >= 0 && c >= 0 ? (double)(p - c) : NAN;
                if (p >= 0 && ts->prompt_tokens < 0) ts->prompt_tokens = p;
                if (hash && isfinite(col[r])) {
                    uint64_t h = AT(hash, r, t, a);
                    if (!have_hash) h0 = h, have_hash = true;
                    else if (h != h0) same = false;
                }
            }
            ts->ttft[a] = tern_stats_median(col, (size_t)n_reps);
            tern_stats_range(col, (size_t)n_reps, &ts->ttft_lo[a], &ts->ttft_hi[a]);
            ts->total[a] = tern_stats_median(tt, (size_t)n_reps);
            ts->cached[a] = tern_stats_median(ch, (size_t)n_reps);
            ts->read[a] = tern_stats_median(rd, (size_t)n_reps);
            if (isfinite(ts->ttft[a])) s->sum_ttft[a] += ts->ttft[a];
            if (isfinite(ts->total[a])) s->sum_total[a] += ts->total[a];
        }
        ts->ratio = n_arms == 2 && ts->ttft[0] > 0 && isfinite(ts->ttft[1]) ? ts->ttft[1] / ts->ttft[0] : NAN;
        ts->output_identical = have_hash && same;
        if (ts->output_identical) s->n_identical++;
        if (ts->kind == TERN_TURN_REWRITE) {
            if (s->first_rewrite < 0) s->first_rewrite = (long)t;
            s->last_rewrite = (long)t;
        }
    }
#undef AT
    /* Rewrite turns against the extension turns around them. */
    for (int a = 0; a < n_arms; a++) s->vs_ext_lo[a] = s->vs_ext_hi[a] = NAN;
    for (size_t t = 0; t < n_turns; t++) {
        struct tern_turn_summary *ts = &s->turns[t];
        for (int a = 0; a < TERN_REPLAY_MAX_ARMS; a++) ts->vs_ext[a] = NAN;
        if (ts->kind != TERN_TURN_REWRITE) continue;
        long before = -1, after = -1;
        for (size_t b = t; b-- > 0;)
            if (s->turns[b].kind == TERN_TURN_EXTENSION) {
                before = (long)b;
                break;
            }
        for (size_t b = t + 1; b < n_turns; b++)
            if (s->turns[b].kind == TERN_TURN_EXTENSION) {
                after = (long)b;
                break;
            }
        if (before < 0 && after < 0) continue;
        bool any = false;
        for (int a = 0; a < n_arms; a++) {
            double sum = 0;
            int n = 0;
            if (before >= 0 && isfinite(s->turns[before].ttft[a])) sum += s->turns[before].ttft[a], n++;
            if (after >= 0 && isfinite(s->turns[after].ttft[a])) sum += s->turns[after].ttft[a], n++;
            if (n == 0 || sum <= 0 || !isfinite(ts->ttft[a])) continue;
            double v = ts->ttft[a] / (sum / n);
            ts->vs_ext[a] = v;
            any = true;
            if (!(v >= s->vs_ext_lo[a])) s->vs_ext_lo[a] = v;
            if (!(v <= s->vs_ext_hi[a])) s->vs_ext_hi[a] = v;
        }
        if (any) s->n_vs_ext++;
    }
    for (int k = 0; k < TERN_TURN_KIND_COUNT; k++) {
        struct tern_class_summary *cs = &s->classes[k];
        size_t m = 0;
        for (int a = 0; a < n_arms; a++) {
            m = 0;
            for (size_t t = 0; t < n_turns; t++)
                if (s->turns[t].kind == (enum tern_turn_kind)k) per_class[m++] = s->turns[t].ttft[a];
            cs->med[a] = tern_stats_median(per_class, m);
            tern_stats_range(per_class, m, &cs->lo[a], &cs->hi[a]);
        }
        cs->n_turns = m;
        m = 0;
        for (size_t t = 0; t < n_turns; t++)
            if (s->turns[t].kind == (enum tern_turn_kind)k) per_class[m++] = s->turns[t].ratio;
        cs->ratio_med = tern_stats_median(per_class, m);
        tern_stats_range(per_class, m, &cs->ratio_lo, &cs->ratio_hi);
    }
    free(col), free(rd), free(ch), free(tt), free(per_class);
    return TERN_OK;
}

enum tern_status tern_replay_summarize(const struct tern_replay_run *r, struct tern_replay_summary *s) {
    size_t n_turns = r->n_turns;
    int n_reps = r->cfg->n_reps, n_arms = r->cfg->n_arms;
    size_t n = n_turns * (size_t)n_reps * (size_t)n_arms;
    double *ttft = tern_calloc(n ? n : 1, sizeof *ttft);
    double *total = tern_calloc(n ? n : 1, sizeof *total);
    long *prompt = tern_calloc(n ? n : 1, sizeof *prompt);
    long *cached = tern_calloc(n ? n : 1, sizeof *cached);
    uint64_t *hash = tern_calloc(n ? n : 1, sizeof *hash);
    enum tern_turn_kind *kinds = tern_calloc(n_turns ? n_turns : 1, sizeof *kinds);
    enum tern_status st;
    if (!ttft || !total || !prompt || !cached || !hash || !kinds) {
        st = tern_errorf(TERN_ERR_NOMEM, "out of memory summarizing %zu measurements", n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (i < r->n_meas && r->meas[i].done) {
            const struct tern_replay_meas *m = &r->meas[i];
            ttft[i] = m->ttft_s;
            total[i] = m->total_s;
            prompt[i] = m->prompt_tokens;
            cached[i] = m->cached_tokens;
            hash[i] = m->out_hash;
        } else {
            ttft[i] = total[i] = NAN;
            prompt[i] = cached[i] = -1;
        }
    }
    for (size_t t = 0; t < n_turns; t++) kinds[t] = r->cfg->tr->turns[t].kind;
    st = tern_replay_summarize_arrays(n_turns, n_reps, n_arms, kinds, ttft, total, prompt, cached, hash, s);
out:
    free(ttft), free(total), free(prompt), free(cached), free(hash), free(kinds);
    return st;
}
