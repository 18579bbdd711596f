/* The engine backend of the server: a loaded model, its chat format, the reuse cache,
 * and the worker's step scheduler (DESIGN.md §2, §8):
 *
 *   prepare (a prepare thread)   template render -> tokens; 4xx decided here
 *   start (the worker thread)    cache_acquire: the request joins the running set (up
 *                                to --parallel of them)
 *   step (the worker thread)     one forward over a batch: a decode row for every
 *                                running request that has its logits (after sampling its
 *                                next token: stop strings, reasoning / tool-call parsing,
 *                                SSE), then prefill chunks of the others in arrival order
 *                                within --batch-tokens (keep-alive comments, checkpoints,
 *                                cancel between steps); a request that ends is committed
 *                                with cache_release.
 *   idle (the worker, queue empty) predictive priming of the most recent conversation
 *                                (predict.h): cache_predict_begin -> prime in small
 *                                chunks, yielding to the next request at a chunk
 *                                boundary -> cache_predict_end. */
#ifndef TERN_SERVER_ENGINE_H
#define TERN_SERVER_ENGINE_H

#include "cache/cache.h"
#include "server/predict.h"
#include "server/server.h"
#include "server/spec.h"
#include "tern.h"

struct srv_engine;

struct srv_engine_params {
    struct tern_model *model;        /* borrowed; outlives the engine */
    const char *model_id;            /* id in /v1/models and responses */
    const char *chat_template;       /* --chat-template source, or NULL for the model's */
    size_t chat_template_len;
    struct cache_params cache;       /* session params included (n_ctx, kv type, chunk) */
    bool state_hash;                 /* TERN_STATE_HASH=1: log state hashes after each request */
    enum predict_mode predict;       /* --predict (TERN_PREDICT=0: off) */
    uint32_t predict_chunk;          /* --predict-chunk: tokens per idle priming step (0 = 128) */
    uint32_t predict_test_delay_ms;  /* TERN_TEST_PREDICT_DELAY_MS: tests only, a pause per step */
    uint32_t max_tokens;             /* --max-tokens: most tokens generated per request (0 = no cap) */
    const char *demo_note;           /* non-NULL: this is the demo model; say so */
    enum spec_mode spec;             /* --spec: speculative decoding's draft source */
    uint32_t spec_max;               /* --spec-max: tokens per draft (0 = SPEC_DEFAULT_MAX) */
    size_t spec_trail_bytes;         /* --spec-trail: a hybrid request's state trail bound (0: default) */
    uint32_t parallel;               /* --parallel: requests running at once (0 = what the memory budget fits, 4..8) */
    uint32_t batch_tokens;           /* --batch-tokens: rows per engine step (0 = the session chunk) */
    bool parse_special_in_content;   /* --parse-special-in-content: the request's text may hold control tokens */
};

enum tern_status srv_engine_new(const struct srv_engine_params *p, struct srv_engine **out);
const struct srv_backend *srv_engine_backend(struct srv_engine *e);
void srv_engine_free(struct srv_engine *e);
/* Waits for the disk tier's queued writes (safe beside a worker still in a step: the
 * writer's queue has its own lock). */
void srv_engine_flush(struct srv_engine *e);

#endif
