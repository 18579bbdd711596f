/* The HTTP server: libmicrohttpd, routing, auth, limits, one engine worker behind a
 * bounded queue, SSE streaming, cancellation on disconnect, metrics, request log.
 *
 * The server knows HTTP and scheduling; what a request *does* is a backend (the engine
 * backend in engine.h; tests plug in their own). The HTTP side and the engine meet at
 * one queue (STYLE.md): a prepare thread parses and prepares a job (validation,
 * template, tokens — all 4xx decided here, before any byte of the response), the
 * single worker thread runs the jobs (several at once, a step at a time, with a batched
 * backend), and the job's output buffer carries the bytes back. No thread belongs to a connection: a connection waiting for its job
 * is suspended and resumed by the job's output. A client that goes away sets the job's
 * cancel flag, which the engine checks between chunks and between tokens. */
#ifndef TERN_SERVER_SERVER_H
#define TERN_SERVER_SERVER_H

#include "server/request.h"
#include "util/buf.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The slowest average rate a request body may arrive at once its grace (body_timeout_s)
 * is spent: a body sent a byte every few seconds holds a connection for the grace, not
 * for ever. */
#define SRV_MIN_BODY_RATE 4096 /* bytes per second */

struct srv_params {
    const char *host;            /* "127.0.0.1"; an IPv6 literal works too */
    int port;                    /* 0: pick a free port (see srv_port) */
    uint32_t n_queue;            /* requests waiting beyond the running ones; full -> 429 */
    size_t max_body;             /* bytes; larger bodies -> 413 */
    const char *const *api_keys; /* when n_api_keys > 0 every route but /health needs one */
    size_t n_api_keys;
    bool allow_forced_output;    /* test-only request field tern_forced_output */
    const char *forced_reply;    /* test-only: srv_parse_opts.forced_reply */
    uint32_t max_connections;    /* open connections in all; 0 = 4096 (lowered to what RLIMIT_NOFILE allows) */
    uint32_t max_conn_per_ip;    /* open connections per client address; 0 = no cap */
    uint32_t header_timeout_s;   /* a connection must send a complete request header within this (408) */
    uint32_t idle_timeout_s;     /* an idle keep-alive connection (or a stalled upload) is closed after this */
    uint32_t body_timeout_s;     /* a request body must be whole this long after its header (0 = 30), plus
                                    1 s per SRV_MIN_BODY_RATE bytes received: else 408 */
    uint32_t n_http_threads;     /* libmicrohttpd's polling threads (0 = 2) */
    uint32_t n_prep_threads;     /* threads that parse, render and tokenize request bodies (0 = 2) */
};

void srv_params_default(struct srv_params *p);

/* The tenant name of an API key (what srv_job.tenant starts with): "key-" and 32 hex
 * digits of a hash of the key, never the key; the same whatever the key's position in
 * --api-key. Writes at most size bytes (NUL included; 37 are needed). */
#define SRV_TENANT_LEN 36
void srv_tenant_of_key(const char *key, char *out, size_t size);

/* One request on its way through the server. Fields marked (http) are set before the
 * job is queued and read-only afterwards; (backend) fields belong to the backend. */
struct srv_job {
    /* (http) */
    uint64_t seq;
    char id[48];                 /* "chatcmpl-<seq>-<random>" / "cmpl-..." */
    enum srv_endpoint ep;
    const char *path;
    int route;                   /* the route it came in by (for /metrics) */
    struct srv_request req;
    char *tenant;                /* hash of the API key used and/or cache_salt; "" = default */
    char *key;                   /* session key (body beats header x-session-id); NULL = none */
    int64_t created;
    double t_arrive;             /* tern_now_s() */

    /* (backend, set in prepare) */
    int32_t *prompt;             /* tern_malloc'd; freed by the server */
    size_t n_prompt;
    void *priv;                  /* freed through backend->job_free */

    /* set by the connection when the client goes away; read by the engine */
    atomic_int cancel;

    /* (backend) figures for the log line */
    uint32_t n_cached, n_read, n_generated;
    uint32_t n_drafted, n_accepted; /* speculative decoding: drafted tokens verified, accepted */
    double t_first;              /* first token out (0 = none) */
    double t_prime;              /* seconds spent reading the prompt's tokens (checkpoint captures included) */
    /* (server) the job was queued while the worker did idle work (predictive priming):
     * when it was queued and when the worker took it, i.e. what the pre-emption cost */
    double t_preempt_from, t_preempt_wait;
    char note[160];              /* error message for the log, if any */

    /* output channel (locked) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct tern_buf out;         /* response body bytes (SSE when streaming) */
    size_t out_read;             /* consumed by the connection (streaming) */
    bool done;
    int status;                  /* HTTP status of a non-streamed response */
    int refs;

    /* (server internal) */
    void *priv_server;
    int fd;                      /* the client's socket, polled for a hang-up */
    void *conn;                  /* its struct MHD_Connection */
    bool big_body;               /* its body was large: trim the allocator when it is freed */
    bool parked;                 /* (mu) the connection is suspended until output, the end or a hang-up */
    double t_out;                /* (mu) when bytes last went to the client (streaming keep-alive comments) */
};

/* Backend helpers: append response bytes / end the response. For a non-streamed job
 * the bytes are the whole body and status is its HTTP status. */
void srv_job_write(struct srv_job *j, const char *data, size_t n);
void srv_job_finish(struct srv_job *j, int status);
/* Streaming jobs only: true when the client is still there. */
static inline bool srv_job_cancelled(struct srv_job *j) { return atomic_load(&j->cancel) != 0; }

struct srv_backend {
    void *self;
    /* a prepare thread, concurrently with the worker and each other: validate beyond the JSON
     * (template, tokens, context length) and fill job->prompt. false + *err = reject. */
    bool (*prepare)(void *self, struct srv_job *job, struct srv_error *err);
    /* the worker thread: run the job, write its output, call srv_job_finish. */
    void (*run)(void *self, struct srv_job *job);
    /* Instead of run, a batched backend (continuous batching, DESIGN.md §8): the worker
     * hands a job to start when fewer than max_running are running (the rest wait in
     * the queue), then calls step while any is running. A step advances every running
     * job and returns those that ended in it (srv_job_finish called) in ended[0..k),
     * k <= cap; cap >= max_running. start returns false when the job ended at once
     * (finished: it never comes back from a step). */
    bool (*start)(void *self, struct srv_job *job);
    size_t (*step)(void *self, struct srv_job **ended, size_t cap);
    uint32_t max_running;
    void (*job_free)(void *self, struct srv_job *job);
    /* POST /tokenize and /detokenize bodies -> response object (new ref) or NULL + err */
    json_t *(*tokenize)(void *self, const json_t *body, struct srv_error *err);
    json_t *(*detokenize)(void *self, const json_t *body, struct srv_error *err);
    /* one entry of GET /v1/models' data (new ref) */
    json_t *(*model_entry)(void *self);
    /* extra Prometheus lines for /metrics */
    void (*metrics)(void *self, struct tern_buf *out);
    /* Optional, the worker thread, only while no request is queued: a step of
     * background work (predictive priming) after the jobs run so far. It must watch
     * *preempt, which the server sets when a request is queued, and return soon after
     * it is set (the next chunk boundary). Returns true when there is more to do; the
     * worker calls it again while the queue stays empty, and again after the next job. */
    bool (*idle)(void *self, const atomic_int *preempt);
};

struct srv_server;

/* Binds and starts serving (routes answer 503 until a backend is set). On error *out
 * is NULL and the message names the address. */
enum tern_status srv_start(const struct srv_params *p, struct srv_server **out);
/* The model is loaded: requests are served from now on. The backend must outlive the
 * server (srv_stop before freeing it). */
void srv_set_backend(struct srv_server *s, const struct srv_backend *b);
int srv_port(const struct srv_server *s);
/* Cancels what is running and queued, closes connections, joins threads, frees. */
void srv_stop(struct srv_server *s);
/* srv_stop, unless the worker is still inside a step (a long prefill or priming chunk
 * that cannot stop midway) ms after everything was cancelled: then false, and nothing
 * is freed or joined — the caller flushes what must be flushed and exits without it. */
bool srv_stop_within(struct srv_server *s, unsigned ms);

#endif
