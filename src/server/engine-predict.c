/* Predictive priming of the most recent conversation, in the worker's idle steps
 * (predict.h has what is predicted; engine-impl.h the files of the engine). */
#include "server/engine-impl.h"

#include "server/reply.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <malloc.h>
#include <string.h>
#include <time.h>

/* ---- predictive priming (the worker, idle) ---------------------------------------------- */

void pred_clear(struct eng_predict *p) {
    free(p->tenant);
    free(p->key);
    json_decref(p->messages);
    json_decref(p->tools);
    json_decref(p->kwargs);
    json_decref(p->reply);
    predict_set_free(&p->set);
    bool big = p->big;
    memset(p, 0, sizeof *p);
    if (big) malloc_trim(0); /* its JSON copy was many small allocations */
}

/* Records the conversation a response just completed, for the idle steps. */
void predict_follow(struct srv_engine *e, struct srv_job *j, const struct reply_parser *parser) {
    struct eng_predict *p = &e->pred;
    if (p->messages && (!p->built || p->next < p->set.n))
        TERN_LOG_DEBUG("predict: the rest of %s's predictions gives way to %s's", p->id, j->id);
    pred_clear(p);
    p->reply = predict_reply_message(parser);
    p->tenant = tern_strdup(j->tenant ? j->tenant : "");
    p->key = j->key ? tern_strdup(j->key) : NULL;
    if (!p->reply || !p->tenant || (j->key && !p->key) || !j->req.messages) {
        pred_clear(p);
        return;
    }
    /* Copies, not references: the request's JSON is freed by whichever thread drops the
     * job last (often a connection's), while these are read and freed by the worker.
     * jansson's reference counts do not order those reads before that free (TSan). */
    p->big = j->big_body;
    p->messages = json_deep_copy(j->req.messages);
    p->tools = j->req.tools ? json_deep_copy(j->req.tools) : NULL;
    p->kwargs = j->req.template_kwargs ? json_deep_copy(j->req.template_kwargs) : NULL;
    if (!p->messages || (j->req.tools && !p->tools) || (j->req.template_kwargs && !p->kwargs)) {
        pred_clear(p);
        return;
    }
    snprintf(p->id, sizeof p->id, "%s", j->id);
    atomic_store(&e->pred_active, 1);
}

struct pred_ctx {
    struct cache_lease lease;
    const atomic_int *preempt;
    uint32_t delay_ms;
};

/* Tests only (TERN_TEST_PREDICT_DELAY_MS): a pause after every chunk, cut short by a
 * request, so that a test can be sure to send one mid-prediction. */
static int pred_progress(void *user, size_t done, size_t total) {
    struct pred_ctx *pc = user;
    (void)done;
    (void)total;
    for (uint32_t t = 0; t < pc->delay_ms && !atomic_load(pc->preempt); t += 5) {
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return atomic_load(pc->preempt) ? 1 : 0;
}

static bool prime_one(struct srv_engine *e, struct eng_predict *p, const struct predict_item *it,
                      const atomic_int *preempt);

/* One idle step: renders the predictions, or primes the next one. */
bool engine_idle(void *self, const atomic_int *preempt) {
    struct srv_engine *e = self;
    struct eng_predict *p = &e->pred;
    if (!p->messages) {
        atomic_store(&e->pred_active, 0);
        return false;
    }
    if (!p->built) {
        double t0 = tern_now_s();
        enum tern_status st = predict_build(&e->chat, e->turn_token, p->messages, p->tools, p->kwargs, p->reply,
                                            e->predict, &p->set);
        p->built = true;
        p->next = 0;
        if (st) TERN_LOG_WARN("predict: after %s: %s", p->id, tern_last_error());
        else TERN_LOG_DEBUG("predict: after %s: %zu predictions rendered in %.3fs", p->id, p->set.n,
                            tern_now_s() - t0);
        atomic_fetch_add(&e->pred_us, (uint64_t)((tern_now_s() - t0) * 1e6));
        /* the JSON is not needed any more */
        json_decref(p->reply);
        p->reply = NULL;
        return true;
    }
    if (p->next >= p->set.n) {
        pred_clear(p);
        atomic_store(&e->pred_active, 0);
        return false;
    }
    const struct predict_item *it = &p->set.items[p->next++];
    bool more = prime_one(e, p, it, preempt);
    if (!more) {
        pred_clear(p);
        atomic_store(&e->pred_active, 0);
    }
    return more;
}

/* Primes one prediction; returns whether more are left. */
static bool prime_one(struct srv_engine *e, struct eng_predict *p, const struct predict_item *it,
                      const atomic_int *preempt) {
    bool more = p->next < p->set.n;
    if (it->n >= e->n_ctx) {
        atomic_fetch_add(&e->pred_skipped, 1);
        return more;
    }
    struct cache_ident ident = {.tenant = p->tenant, .key = p->key};
    struct pred_ctx pc = {.preempt = preempt, .delay_ms = e->predict_delay_ms};
    double t0 = tern_now_s();
    enum tern_status st = cache_predict_begin_flags(e->cache, &ident, it->toks, it->n, it->marks, it->n_marks,
                                                    it->keep ? CACHE_PREDICT_KEEP : 0, &pc.lease);
    if (st) {
        /* nothing to build on, or already covered: not an error */
        if (st == TERN_ERR_STATE) TERN_LOG_DEBUG("predict: %s after %s: %s", it->variant, p->id, tern_last_error());
        else TERN_LOG_WARN("predict: %s after %s: %s", it->variant, p->id, tern_last_error());
        atomic_fetch_add(&e->pred_skipped, 1);
        return more;
    }
    uint32_t r = pc.lease.decision.cached;
    struct tern_eval_opts eo = {
        .n_chunk = e->predict_chunk,
        .cancel = preempt,
        .progress = e->predict_delay_ms ? pred_progress : NULL,
        .user = &pc,
        .ckpt_pos = pc.lease.ckpt_pos,
        .n_ckpt = pc.lease.n_ckpt,
        .on_ckpt = cache_on_checkpoint,
        .ckpt_user = &pc.lease,
    };
    st = tern_session_eval(pc.lease.session, it->toks + r, it->n - r, &eo);
    uint32_t primed = tern_session_n_past(pc.lease.session) - r;
    bool preempted = st == TERN_ERR_CANCELLED;
    if (st && !preempted) TERN_LOG_WARN("predict: %s after %s: %s", it->variant, p->id, tern_last_error());
    cache_predict_end(e->cache, &pc.lease, !st || preempted);
    double dt = tern_now_s() - t0;
    atomic_fetch_add(&e->pred_us, (uint64_t)(dt * 1e6));
    atomic_fetch_add(&e->pred_runs, 1);
    if (preempted) atomic_fetch_add(&e->pred_preempted, 1);
    TERN_LOG_INFO("predict: %s after %s: %zu tokens, resumed at %u, primed %u in %.3fs%s", it->variant, p->id, it->n, r,
                  primed, dt, preempted ? " (pre-empted by a request; kept up to there)" : "");
    return more;
}

