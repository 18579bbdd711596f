/* The engine backend's internals, shared by its files (engine.h has the overview):
 *
 *   engine.c          lifecycle, prepare (template -> tokens, 4xx), the model entry
 *   engine-run.c      the step scheduler: requests admitted, primed in chunks and
 *                     decoded a token per step, all running requests in one batch
 *   engine-predict.c  predictive priming in idle steps
 *   engine-routes.c   /tokenize, /detokenize, the Prometheus lines */
#ifndef TERN_SERVER_ENGINE_IMPL_H
#define TERN_SERVER_ENGINE_IMPL_H

#include "server/engine.h"

#include "grammar/grammar.h"
#include "server/chat.h"

#include <stdatomic.h>

#define PREDICT_CHUNK_DEFAULT 128
#define ENG_GRAMMARS 16             /* matchers kept for grammars that come again (and held by running requests) */
#define ENG_GRAMMAR_MAX_NODES (1u << 20) /* a kept matcher with more interned stacks starts afresh */
/* The most requests --parallel runs at once (a step batches one row set per request). */
#define MODEL_MAX_PARALLEL 256
#define ENG_STEP_HIST 6             /* buckets of the step batch-size histogram: <=1, 2, 4, 8, 16, more */

struct eng_req;

/* Predictive priming of the most recent conversation (worker thread only). The
 * predictions are rendered lazily, in the first idle step, so that a request that
 * follows at once does not wait for the rendering. */
struct eng_predict {
    char *tenant, *key;
    json_t *messages, *tools, *kwargs, *reply;
    bool built;
    struct predict_set set;
    size_t next;                 /* the next item to prime */
    char id[48];                 /* the request the predictions follow */
    bool big;                    /* copied from a large request: trim the allocator when freed */
};

struct srv_engine {
    double prime_s_per_tok;      /* the prompt reading speed, averaged (0: none measured yet) */
    uint32_t peer_wait_ms;       /* --cache-peer-wait (0: auto) */
    /* Admission by memory: a running request holds the bytes its session can grow to
     * (its prompt and max_tokens within the context, the recurrent state, a hybrid's
     * speculative trail); the sum stays within --cache-ram, except for one request
     * alone. Engine thread only. */
    size_t admit_budget, admitted_bytes;
    size_t kv_per_token;
    struct tern_model *model;
    const struct tern_model_info *info;
    const struct tern_tokenizer *tok;
    struct chat_fmt chat;
    struct cache *cache;
    uint32_t n_ctx;
    char *model_id;
    char *demo_note;
    bool state_hash;
    int64_t created;
    struct srv_backend backend;

    enum predict_mode predict;
    uint32_t predict_chunk;
    uint32_t predict_delay_ms;   /* tests only */
    uint32_t max_tokens;         /* --max-tokens (0 = no cap) */
    int32_t turn_token;
    struct eng_predict pred;
    struct tern_gvocab *gvocab;  /* token pieces for grammar masks (built on first use, worker only) */
    /* matchers of the grammars used last (worker only): a grammar that comes again
     * (an agent's tools, every turn) finds its mask cache warm */
    struct eng_gram {
        struct tern_grammar *g;  /* owned */
        struct tern_gmatch *m;
        uint64_t used;
    } gram[ENG_GRAMMARS];
    uint64_t gram_tick;
    /* figures for /metrics (read from other threads) */
    atomic_uint_fast64_t pred_us, pred_runs, pred_preempted, pred_skipped;
    atomic_int pred_active;

    enum spec_mode spec;
    uint32_t spec_max;
    size_t spec_trail_bytes;
    atomic_uint_fast64_t spec_drafted, spec_accepted, spec_rounds, spec_refed;

    /* the step scheduler (worker only, but the figures) */
    uint32_t parallel;           /* --parallel: requests running at once */
    uint32_t batch_tokens;       /* --batch-tokens: rows per step (decode rows first, then prefill chunks) */
    struct eng_req *run_head, *run_tail; /* running requests, in admission order */
    struct tern_batch_item *step_items;  /* (parallel) a step's batch */
    struct eng_req **step_owner;         /* (parallel) the request of each item */
    atomic_uint n_running, n_priming;    /* gauges */
    atomic_uint_fast64_t steps, step_seqs, step_decode_rows, step_prefill_rows;
    atomic_uint_fast64_t step_hist[ENG_STEP_HIST]; /* steps by the number of sequences in them */
    atomic_uint_fast64_t step_us;
};

/* What prepare found out, for run. */
struct eng_job {
    bool in_think;               /* the prompt opened <think> */
    int32_t *forced;             /* test-only forced output tokens */
    size_t n_forced;
    struct tern_grammar *tool_grammar; /* tool_choice required / named (owned) */
    struct tern_grammar *lazy_grammar; /* tool_choice auto: the calls, from the trigger on (owned) */
    int32_t *prefix;             /* test-only forced prefix tokens */
    size_t n_prefix;
};

/* engine.c */
bool engine_prepare(void *self, struct srv_job *j, struct srv_error *err);
void engine_job_free(void *self, struct srv_job *j);
json_t *engine_model_entry(void *self);

/* engine-run.c: the worker's batched interface (server.h) */
bool engine_start(void *self, struct srv_job *j);
size_t engine_step(void *self, struct srv_job **ended, size_t cap);
void engine_run_free(struct srv_engine *e); /* requests still running (at shutdown) */

/* engine-predict.c */
bool engine_idle(void *self, const atomic_int *preempt);
void predict_follow(struct srv_engine *e, struct srv_job *j, const struct reply_parser *parser);
void pred_clear(struct eng_predict *p);

/* engine-routes.c */
json_t *engine_tokenize(void *self, const json_t *body, struct srv_error *err);
json_t *engine_detokenize(void *self, const json_t *body, struct srv_error *err);
void engine_metrics(void *self, struct tern_buf *b);

#endif
