/* Speculative decoding: drafting and verification (see spec.h, docs/spec.md). */
#include "server/spec.h"

#include "grammar/grammar.h"
#include "model/mtp.h"

#include "util/log.h"
#include "util/mem.h"
#include "util/rng.h"
#include "util/status.h"
#include "util/timeutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *spec_mode_name(enum spec_mode m) {
    switch (m) {
    case SPEC_OFF: return "off";
    case SPEC_NGRAM: return "ngram";
    case SPEC_ORACLE: return "oracle";
    case SPEC_MTP: return "mtp";
    }
    return "?";
}

bool spec_mode_parse(const char *s, enum spec_mode *out) {
    if (!strcmp(s, "off")) *out = SPEC_OFF;
    else if (!strcmp(s, "ngram")) *out = SPEC_NGRAM;
    else if (!strcmp(s, "mtp")) *out = SPEC_MTP;
    else return false;
    return true;
}

/* ---- drafting ------------------------------------------------------------------- */

/* ctx[0..n) followed by last, read as one sequence. */
static inline int32_t at(const int32_t *ctx, size_t n, int32_t last, size_t i) { return i < n ? ctx[i] : last; }

size_t spec_ngram_draft(const int32_t *ctx, size_t n_ctx, int32_t last, uint32_t max, int32_t *out) {
    const size_t L = n_ctx + 1;
    if (max == 0) return 0;
    for (size_t n = 3; n >= 1; n--) {
        if (L < n + 1) continue;
        /* the pattern is [L - n, L); a match at i < L - n leaves at least one token after it */
        for (size_t i = L - n; i-- > 0;) {
            size_t k = 0;
            while (k < n && at(ctx, n_ctx, last, i + k) == at(ctx, n_ctx, last, L - n + k)) k++;
            if (k < n) continue;
            size_t m = 0;
            for (size_t j = i + n; j < L && m < max; j++) out[m++] = at(ctx, n_ctx, last, j);
            return m;
        }
    }
    return 0;
}

/* The head's guess: the largest logit (the lowest id on a tie). */
static int32_t argmax(const float *l, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return (int32_t)best;
}

/* MTP: the head is fed the rows it lacks — main positions [hid_pos0, n_commit), each
 * the main model's hidden state there and the token after it (tok for the last) — so
 * that its rows match the accepted tokens; its guess after the last is the first draft
 * token. Each further one is a chained row at the next position from the head's own
 * hidden state and the token just guessed; those rows are dropped again afterwards (the
 * verify chunk gives the main model's hidden states for them). */
static enum tern_status mtp_draft(struct spec_dec *d, int32_t tok, size_t max, int32_t *out, size_t *n_out) {
    *n_out = 0;
    const uint32_t n = d->n_commit;
    /* no hidden state of position n - 1 (the first token after the prompt; docs/spec.md) */
    if (d->hid_n == 0 || d->hid_pos0 + d->hid_n != n) return TERN_OK;
    enum tern_status st;
    const uint32_t have = tern_mtp_n_past(d->mtp);
    if (have == 0 || d->mtp_base + have != d->hid_pos0) {
        /* the head's rows do not end where the new ones start (an aborted chunk): start over */
        if (have && (st = tern_mtp_rewind(d->mtp, 0))) return st;
        d->mtp_base = d->hid_pos0;
    }
    int32_t toks[SPEC_MAX_DRAFT + 1];
    const int32_t *T = tern_session_tokens(d->s);
    for (uint32_t i = 0; i < d->hid_n; i++) {
        const uint32_t p = d->hid_pos0 + i;
        toks[i] = p + 1 < n ? T[p + 1] : tok;
    }
    const uint32_t rows = d->hid_n;
    d->hid_n = 0;
    if ((st = tern_mtp_eval(d->mtp, d->hid, toks, rows, NULL, d->mtp_h))) return st;
    if (max == 0) return TERN_OK;
    const uint32_t keep = tern_mtp_n_past(d->mtp);
    const float *h = d->mtp_h + (size_t)(rows - 1) * d->n_embd;
    size_t m = 0;
    out[m++] = argmax(tern_mtp_logits(d->mtp), d->n_vocab);
    while (m < max) {
        /* the input row is read before the output row is written: in place */
        if ((st = tern_mtp_eval(d->mtp, h, &out[m - 1], 1, NULL, d->mtp_h))) return st;
        h = d->mtp_h;
        out[m++] = argmax(tern_mtp_logits(d->mtp), d->n_vocab);
    }
    if (tern_mtp_n_past(d->mtp) > keep && (st = tern_mtp_rewind(d->mtp, keep))) return st;
    *n_out = m;
    return TERN_OK;
}

/* The prompt's rows: positions [pos0, n - 1) with the tokens after them; the hidden
 * state of n - 1 waits for the first generated token. */
static enum tern_status mtp_feed_prompt(struct spec_dec *d, const struct spec_params *p) {
    const uint32_t n = d->n_commit, pos0 = p->prompt_hidden_pos0;
    if (!p->prompt_hidden || n == 0 || pos0 >= n) return TERN_OK;
    const int32_t *T = tern_session_tokens(d->s);
    /* a resumed head's rows go on where they end (a row or more between them is not
     * there: the hidden state of the resume point's last position was not kept) */
    const uint32_t have = tern_mtp_n_past(d->mtp);
    if (have > pos0) {
        enum tern_status st = tern_mtp_rewind(d->mtp, 0);
        if (st) return st;
    }
    d->mtp_base = pos0 - tern_mtp_n_past(d->mtp);
    if (n - 1 > pos0) {
        const enum tern_status st = tern_mtp_eval(d->mtp, p->prompt_hidden, T + pos0 + 1, n - 1 - pos0, NULL, NULL);
        if (st) return st;
    }
    memcpy(d->hid, p->prompt_hidden + (size_t)(n - 1 - pos0) * d->n_embd, d->n_embd * sizeof(float));
    d->hid_pos0 = n - 1;
    d->hid_n = 1;
    return TERN_OK;
}

/* Up to max drafted tokens after tok (the gen-th generated token is tok). */
static size_t draft(struct spec_dec *d, int32_t tok, size_t max, int32_t *out) {
    if (max == 0) return 0;
    if (d->mode == SPEC_NGRAM)
        return spec_ngram_draft(tern_session_tokens(d->s), d->n_commit, tok, (uint32_t)max, out);
    /* SPEC_ORACLE: the token at generated index n_gen onwards */
    const struct spec_oracle *o = d->oracle;
    size_t m = 0;
    for (size_t i = d->n_gen; i < o->n && m < max; i++) {
        int32_t t = o->toks[i];
        uint64_t x = o->seed ^ (uint64_t)i * UINT64_C(0xd1b54a32d192ed03);
        const uint64_t h = tern_splitmix64(&x);
        if (o->reject_pct && h % 100 < o->reject_pct) t = (int32_t)(((uint32_t)t + 1) % d->n_vocab);
        out[m++] = t;
    }
    return m;
}

/* ---- the decoder ---------------------------------------------------------------- */

static enum tern_status dec_init(struct spec_dec *d, struct tern_session *s, struct tern_sampler *smp,
                                 const struct spec_params *p, const atomic_int *cancel);

enum tern_status spec_dec_init(struct spec_dec *d, struct tern_session *s, struct tern_sampler *smp,
                               const struct spec_params *p, const atomic_int *cancel) {
    const enum tern_status st = dec_init(d, s, smp, p, cancel);
    /* a resumed head is the decoder's from here: freed when it did not take it */
    if (p && p->head && !d->took_head) tern_mtp_free(p->head);
    return st;
}

static enum tern_status dec_init(struct spec_dec *d, struct tern_session *s, struct tern_sampler *smp,
                                 const struct spec_params *p, const atomic_int *cancel) {
    memset(d, 0, sizeof *d);
    d->s = s;
    d->smp = smp;
    d->cancel = cancel;
    d->mode = p ? p->mode : SPEC_OFF;
    d->max = p && p->max ? p->max : SPEC_DEFAULT_MAX;
    d->cur = d->max;
    d->oracle = p ? p->oracle : NULL;
    const struct tern_model_info *info = tern_model_info(tern_session_model(s));
    d->n_vocab = info->n_vocab;
    d->hybrid = info->hybrid;
    d->n_commit = tern_session_n_past(s);
    if (d->max > SPEC_MAX_DRAFT)
        return tern_errorf(TERN_ERR_RANGE, "spec: a draft of %u tokens exceeds the limit %d", d->max, SPEC_MAX_DRAFT);
    if (d->mode == SPEC_ORACLE && !d->oracle)
        return tern_errorf(TERN_ERR_INVALID, "spec: the oracle source needs its tokens");
    struct tern_mtp *head = p ? p->head : NULL;
    if (d->mode == SPEC_OFF) return TERN_OK;
    d->refeed = p->refeed;
    /* the state trail: a recurrent state per token of a verify chunk, within its bound */
    if (d->hybrid && !d->refeed && info->recurrent_bytes) {
        const size_t cap = p->trail_bytes ? p->trail_bytes : (size_t)SPEC_TRAIL_DEFAULT_MIB << 20;
        const size_t slots = cap / info->recurrent_bytes;
        if (slots < 2) d->refeed = true; /* not room for one drafted token: a checkpoint and a re-read */
        else if (slots - 1 < d->max) d->max = d->cur = (uint32_t)(slots - 1);
    }
    if (d->mode == SPEC_MTP) {
        enum tern_status st = TERN_OK;
        if (head) {
            /* the rows of the positions below the resume point stay */
            const uint32_t keep = p->head_upto > p->head_base ? p->head_upto - p->head_base : 0;
            d->mtp = head;
            d->took_head = true;
            if (tern_mtp_n_past(head) > keep && tern_mtp_rewind(head, keep)) tern_mtp_rewind(head, 0);
        } else {
            st = tern_mtp_new(s, &d->mtp);
        }
        if (st == TERN_ERR_UNSUPPORTED) {
            char why[256];
            snprintf(why, sizeof why, "%s", tern_last_error());
            return tern_errorf(st, "spec: mtp drafting needs the model's multi-token-prediction head: %s", why);
        }
        if (st) return st;
        d->n_embd = info->n_embd;
        d->hid = tern_malloc((size_t)(d->max + 1) * d->n_embd * sizeof(float));
        d->mtp_h = tern_malloc((size_t)(d->max + 1) * d->n_embd * sizeof(float));
        if (!d->hid || !d->mtp_h) {
            spec_dec_free(d);
            return tern_errorf(TERN_ERR_NOMEM, "spec: out of memory for %u hidden states of %u", d->max + 1,
                               d->n_embd);
        }
        if ((st = mtp_feed_prompt(d, p))) {
            spec_dec_free(d);
            return st;
        }
    }
    d->logits = tern_malloc((size_t)(d->max + 1) * d->n_vocab * sizeof(float));
    if (!d->logits)
        return tern_errorf(TERN_ERR_NOMEM, "spec: out of memory for %u x %u logits", d->max + 1, d->n_vocab);
    if (d->hybrid && !d->refeed) {
        d->trail = tern_aligned_alloc((size_t)(d->max + 1) * info->recurrent_bytes);
        if (!d->trail)
            return tern_errorf(TERN_ERR_NOMEM, "spec: out of memory for %u recurrent states of %zu bytes", d->max + 1,
                               info->recurrent_bytes);
    }
    return TERN_OK;
}

struct tern_mtp *spec_take_head(struct spec_dec *d, uint32_t *base) {
    struct tern_mtp *h = d->mtp;
    if (!h) return NULL;
    tern_session_capture_hidden(d->s, NULL, 0);
    *base = d->mtp_base;
    d->mtp = NULL;
    return h;
}

void spec_dec_free(struct spec_dec *d) {
    if (d->mtp) tern_session_capture_hidden(d->s, NULL, 0);
    tern_mtp_free(d->mtp);
    free(d->hid);
    free(d->mtp_h);
    d->mtp = NULL;
    d->hid = d->mtp_h = NULL;
    free(d->logits);
    tern_aligned_free(d->trail);
    d->trail = NULL;
    tern_checkpoint_free(d->ck);
    d->logits = NULL;
    d->ck = NULL;
}

uint32_t spec_n_past(const struct spec_dec *d) { return d->n_commit; }

void spec_set_grammar(struct spec_dec *d, struct tern_gmatch *gm, uint32_t *gmask, double *t_mask) {
    d->gm = gm;
    d->gmask = gmask;
    d->t_mask = t_mask;
    d->gst = TERN_OK;
    if (d->nq > d->iq) {
        d->nq = d->iq; /* decided without the grammar: decided again under it */
        /* the head's pending rows end at the last token taken (q[i] follows row i) */
        if (d->mtp && d->hid_n > d->iq) d->hid_n = d->iq;
    }
}

/* The grammar's mask for its current state into d->gmask; false when it allows nothing. */
static bool grammar_mask(struct spec_dec *d) {
    const double t0 = tern_now_s();
    const size_t n = tern_gmatch_mask(d->gm, d->gmask, &d->gst);
    if (d->t_mask) *d->t_mask += tern_now_s() - t0;
    return n > 0;
}

/* Takes y into the grammar (y < 0: nothing was allowed); -1 when it refuses. */
static int32_t grammar_take(struct spec_dec *d, int32_t y) {
    return y >= 0 && tern_gmatch_accept_token(d->gm, y) ? y : -1;
}

/* The logits after the accepted tokens: the session's, or when it ran ahead (decisions
 * spec_set_grammar dropped) the last verify chunk's row for that position. */
static const float *next_logits(const struct spec_dec *d) {
    if (tern_session_n_past(d->s) == d->n_commit) return tern_session_logits(d->s);
    TERN_ASSERT(d->n_commit > d->v0 && d->n_commit <= tern_session_n_past(d->s));
    return d->logits + (size_t)(d->n_commit - 1 - d->v0) * d->n_vocab;
}

int32_t spec_next(struct spec_dec *d) {
    int32_t tok;
    if (d->iq < d->nq) tok = d->q[d->iq++];
    else if (d->gm)
        tok = grammar_mask(d) ? grammar_take(d, tern_sampler_sample_masked(d->smp, next_logits(d), d->gmask,
                                                                           tern_session_tokens(d->s), d->n_commit))
                              : -1;
    else tok = tern_sampler_sample(d->smp, next_logits(d), tern_session_tokens(d->s), d->n_commit);
    d->n_gen++;
    return tok;
}

/* Brings the session back from its speculative end to n_commit. */
static enum tern_status settle_now(struct spec_dec *d);

static enum tern_status settle(struct spec_dec *d) {
    if (tern_session_n_past(d->s) == d->n_commit) return TERN_OK;
    const double t0 = tern_now_s();
    enum tern_status st = settle_now(d);
    d->st.t_settle += tern_now_s() - t0;
    return st;
}

static enum tern_status settle_now(struct spec_dec *d) {
    struct tern_session *s = d->s;
    const uint32_t n = tern_session_n_past(s);
    TERN_ASSERT(n > d->n_commit);
    if (!d->hybrid || !d->refeed) return tern_session_rewind(s, d->n_commit); /* KV rows, and the trail */
    /* The recurrent state has folded in the rejected tokens: back to the state before
     * the verify chunk, then the accepted tokens again (copied out: eval writes the
     * session's token array). */
    const uint32_t p = tern_checkpoint_pos(d->ck);
    const uint32_t k = d->n_commit - p;
    TERN_ASSERT(d->n_commit >= p && k <= SPEC_MAX_DRAFT + 1);
    memcpy(d->buf, tern_session_tokens(s) + p, (size_t)k * sizeof *d->buf);
    enum tern_status st = tern_session_restore(s, d->ck);
    if (st) return st;
    if (!k) return TERN_OK;
    struct tern_eval_opts eo = {.n_chunk = k};
    st = tern_session_eval(s, d->buf, k, &eo);
    d->st.refed += k;
    return st;
}

enum tern_status spec_prepare(struct spec_dec *d, int32_t tok, size_t want, struct spec_rows *out) {
    struct tern_session *s = d->s;
    memset(out, 0, sizeof *out);
    /* An accepted draft token that the session has consumed already. */
    if (d->iq < d->nq) {
        TERN_ASSERT(tok == d->q[d->iq - 1]);
        d->n_commit++;
        return TERN_OK;
    }
    d->nq = d->iq = 0;
    enum tern_status st = settle(d);
    if (st) return st;

    const uint32_t n_ctx = tern_session_n_ctx(s);
    /* Prompt lookup adapts its length (a draft that is mostly rejected costs a longer
     * chunk for nothing); the oracle keeps its fixed length, the bound it measures. */
    size_t max = d->mode == SPEC_OFF ? 0 : d->mode == SPEC_ORACLE ? d->max : d->cur;
    if (want < 1) max = 0;
    else if (max > want - 1) max = want - 1; /* tok's chunk yields up to k + 1 tokens */
    if (d->n_commit + 1 >= n_ctx) max = 0;
    else if (max > n_ctx - d->n_commit - 1) max = n_ctx - d->n_commit - 1;
    size_t k = 0;
    if (d->mode != SPEC_MTP) {
        k = draft(d, tok, max, d->buf + 1);
    } else {
        const double t0 = tern_now_s();
        st = mtp_draft(d, tok, max, d->buf + 1, &k);
        d->st.t_draft += tern_now_s() - t0;
        if (st) return st;
    }
    d->buf[0] = tok;
    if (k > 0 && d->hybrid && d->refeed) {
        const double t0 = tern_now_s();
        if (!d->ck) st = tern_session_checkpoint(s, &d->ck);
        else st = tern_session_checkpoint_update(s, d->ck);
        d->st.t_ckpt += tern_now_s() - t0;
        if (st) return st;
    }
    d->v0 = d->n_commit;
    /* the chunk's hidden states: the head's next rows (spec_commit / spec_abort stop it) */
    if (d->mtp) tern_session_capture_hidden(s, d->hid, d->n_commit);
    out->toks = d->buf;
    out->n = (uint32_t)(k + 1);
    out->logits_all = k ? d->logits : NULL;
    out->rec_trail = k ? d->trail : NULL;
    return TERN_OK;
}

void spec_commit(struct spec_dec *d, const struct spec_rows *r) {
    if (d->mtp) {
        tern_session_capture_hidden(d->s, NULL, 0);
        d->hid_pos0 = d->n_commit;
        d->hid_n = 1;
    }
    d->n_commit++; /* tok */
    const size_t k = r->n - 1;
    if (k == 0) return;
    d->st.rounds++;
    d->st.drafted += k;
    /* Each position decides with the same sampler and history a plain run would have. */
    const int32_t *hist = tern_session_tokens(d->s);
    size_t j = 0;
    for (;; j++) {
        bool acc = false;
        const int32_t want_tok = j < k ? d->buf[j + 1] : -1;
        const float *lg = d->logits + j * d->n_vocab;
        int32_t y;
        if (!d->gm) y = tern_sampler_sample_draft(d->smp, lg, hist, d->n_commit + j, want_tok, &acc);
        else if (!grammar_mask(d)) y = -1;
        else y = grammar_take(d, tern_sampler_sample_draft_masked(d->smp, lg, d->gmask, hist, d->n_commit + j,
                                                                   want_tok, &acc));
        if (y < 0) acc = false; /* the grammar stopped here: spec_next returns -1 */
        if (j < k && acc) {
            d->q[j] = y;
            continue;
        }
        d->q[j] = y;
        break;
    }
    d->nq = (uint32_t)(j + 1);
    d->st.accepted += j;
    if (d->mtp) d->hid_n = (uint32_t)j + 1; /* the rows of tok and the accepted drafts */
    /* all accepted: try twice as long; else one more than what was accepted */
    if (j == k) d->cur = d->cur * 2 < d->max ? d->cur * 2 : d->max;
    else d->cur = (uint32_t)j + 1;
}

void spec_abort(struct spec_dec *d) {
    if (d->mtp) {
        tern_session_capture_hidden(d->s, NULL, 0);
        d->hid_n = 0;
    }
    /* a failure after the chunk started leaves the session at an unknown end */
    if (tern_session_n_past(d->s) > d->n_commit && settle(d)) TERN_LOG_WARN("spec: %s", tern_last_error());
}

enum tern_status spec_accept(struct spec_dec *d, int32_t tok, size_t want) {
    struct spec_rows r;
    enum tern_status st = spec_prepare(d, tok, want, &r);
    if (st || r.n == 0) return st;
    /* One chunk: a cancel is only seen before it, so a cancelled verify changes nothing. */
    struct tern_eval_opts eo = {.n_chunk = r.n, .logits_all = r.logits_all, .cancel = d->cancel,
                                .rec_trail = r.rec_trail};
    st = tern_session_eval(d->s, r.toks, r.n, &eo);
    if (st) {
        if (st != TERN_ERR_CANCELLED) {
            spec_abort(d);
        } else if (d->mtp) {
            tern_session_capture_hidden(d->s, NULL, 0);
            d->hid_n = 0;
        }
        return st;
    }
    spec_commit(d, &r);
    return TERN_OK;
}

enum tern_status spec_finish(struct spec_dec *d) {
    /* accepted drafts the caller did not take are dropped with the rest */
    d->nq = d->iq = 0;
    if (d->mtp) tern_session_capture_hidden(d->s, NULL, 0);
    enum tern_status st = settle(d);
    /* the session outlives the trail buffer (it is parked, hashed, resumed) */
    tern_session_drop_trail(d->s);
    return st;
}
