/* Internal to the HTTP server (server.h): what its files share.
 *
 *   http.c     routing, auth, limits, reading requests, answers and streams; start, stop
 *   jobs.c     jobs, the queue, the worker that runs them on the backend, the metrics
 *              and the log line of each request
 *   guard.c    the first bytes of a connection (refused before libmicrohttpd reads
 *              them) and shedding the longest-waiting connection when the table is full
 *   watcher.c  the watcher thread: parked jobs' sockets, header and body deadlines,
 *              keep-alive comments
 *
 * The design (threads, suspension, lock order) is described at the top of http.c. */
#ifndef TERN_SERVER_HTTP_IMPL_H
#define TERN_SERVER_HTTP_IMPL_H

#include "server/server.h"
#include "server/metrics.h"

#include "server/api/api.h"

#include "server/respond.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#if MHD_VERSION < 0x00097002
typedef int MHD_Result;
#else
typedef enum MHD_Result MHD_Result;
#endif

#define WAIT_SLICE_MS 100
#define KEEPALIVE_S 10.0
#define FD_RESERVE 64            /* descriptors kept for the model, logs, the disk tier */
/* A body refused before it was read (413, 401) is read and discarded up to these bounds
 * before the answer goes out, so that a client that sends it all before reading (Node's
 * fetch) reads the answer instead of a connection reset. */
#define DRAIN_MAX_BYTES ((uint64_t)256 << 20)
#define DRAIN_MAX_S 30.0
#define BIG_BODY ((size_t)1 << 20) /* after a body this large, or of this many values, malloc_trim */
#define BIG_VALUES 65536
/* A streamed job whose client stops reading is cancelled past this much unread output. */
#define MAX_UNREAD_OUTPUT ((size_t)64 << 20)
/* libmicrohttpd's block size for a streamed response (what stream_reader fills at most). */
#define STREAM_BLOCK 16384
/* MHD's own inactivity timeout is this much after the later of the watcher's deadlines. */
#define MHD_TIMEOUT_SLACK_S 2

/* The first bytes of a connection are checked before libmicrohttpd reads them (see
 * first_bytes_refused): the kernel hands a connection over only once its first bytes
 * are there, or after this long (an idle socket is then accepted as before). */
#define DEFER_ACCEPT_S 1
#define FIRST_BYTES_MAX 4096     /* how much of them is looked at */
#define MAX_METHOD_LEN 32

/* Defaults of srv_params (also what a 0 in them means). */
#define DEFAULT_MAX_CONNECTIONS 4096
#define DEFAULT_MAX_BODY ((size_t)16 << 20)
#define DEFAULT_HEADER_TIMEOUT_S 10
#define DEFAULT_IDLE_TIMEOUT_S 30
#define DEFAULT_BODY_TIMEOUT_S 30
#define DEFAULT_HTTP_THREADS 2
#define DEFAULT_PREP_THREADS 2

enum route {
    R_NONE = 0, R_HEALTH, R_METRICS, R_MODELS,
    R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE, R_MESSAGES, R_COUNT_TOKENS, R_RESPONSES, /* POST */
    R_COUNT
};

extern const char *const http_route_names[R_COUNT]; /* http.c */

static inline bool route_is_post(enum route r) { return r >= R_CHAT; }

/* The routes that run a request through the template and the engine (a job). */
static inline bool route_generates(int r) {
    return r == R_CHAT || r == R_COMPLETIONS || r == R_MESSAGES || r == R_COUNT_TOKENS || r == R_RESPONSES;
}

/* The protocol a route speaks (its errors' shape, its adapter). */
static inline enum srv_proto route_proto(int r) {
    return r == R_MESSAGES || r == R_COUNT_TOKENS ? SRV_PROTO_MESSAGES
           : r == R_RESPONSES                     ? SRV_PROTO_RESPONSES
                                                  : SRV_PROTO_CHAT;
}

/* status classes counted per route for /metrics */
#define N_COUNTED 11
extern const int http_counted_status[N_COUNTED]; /* jobs.c */

struct srv_server {
    struct srv_params p;
    char **api_keys;
    struct MHD_Daemon *mhd;
    int port;
    _Atomic(const struct srv_backend *) backend;
    atomic_bool stopping;
    atomic_uint_fast64_t seq;

    /* the queue and the worker */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    struct srv_job **queue;      /* ring of n_queue */
    uint32_t q_head, q_len;
    uint32_t n_running;          /* jobs the worker is running */
    /* /tokenize and /detokenize requests admitted and not yet answered: each takes a
     * place of the queue while it runs (one budget of admitted work, see admit_simple) */
    uint32_t n_simple;
    pthread_t worker;
    bool worker_started;
    /* idle work (backend->idle): pending after a job ran; running while the worker is
     * in it; preempt is set (under qmu) by every enqueue and by srv_stop, and read by
     * the idle work between chunks */
    bool idle_pending, idle_running;
    atomic_int preempt;

    /* live jobs, to cancel them all at shutdown and for the watcher */
    pthread_mutex_t jmu;
    struct srv_job **live;
    size_t n_live, cap_live;

    /* open connections (MHD socket contexts), for the header deadline */
    pthread_mutex_t smu;
    pthread_cond_t scv;          /* wakes the watcher at shutdown */
    struct sock *socks;
    pthread_t watcher;
    bool watcher_started;

    /* the prepare threads and their queue of suspended connections */
    pthread_mutex_t pmu;
    pthread_cond_t pcv;
    struct conn *prep_head, *prep_tail;
    bool prep_stopping;
    pthread_t *prep;
    uint32_t n_prep;

    /* metrics */
    atomic_uint_fast64_t requests[R_COUNT][N_COUNTED + 1];
    atomic_uint_fast64_t prompt_tokens, cached_tokens, read_tokens, generated_tokens, cancelled;
    atomic_uint_fast64_t ttft_us_sum, ttft_count, overhead_us_sum;
    atomic_uint_fast64_t preempt_us_sum, preempt_count;
    atomic_uint_fast64_t conns_total, header_timeouts, body_timeouts, conns_shed, client_gone;
    atomic_int conns_open;
    double t_start;
};

/* ---- connections (http.c) ---- */

/* One per TCP connection (MHD's socket context). */
enum sock_wait { W_HEADER = 0, W_BODY };

struct sock {
    int fd;
    double deadline;             /* (smu) a complete request header (or body: wait) is due by then; 0 = not waiting */
    enum sock_wait wait;         /* (smu) what the deadline is for */
    struct sock *prev, *next;
};

enum conn_state {
    C_BODY = 0,                  /* reading the header and the body (polling thread) */
    C_PREP,                      /* suspended; a prepare thread has it */
    C_REPLY,                     /* the answer is in reply (an error, tokenize's result) */
    C_STREAM,                    /* job queued; its SSE response is to be started */
    C_WAIT,                      /* job queued, not streamed; parked until it is done */
    C_SENT,
};

/* One per request. */
struct conn {
    enum route route;
    enum conn_state state;
    struct MHD_Connection *c;
    struct tern_buf body;
    bool too_large;
    bool drain;                  /* discard the body, then answer derr */
    struct srv_error derr;
    const char *dhdr, *dval;
    uint64_t n_discarded;
    uint64_t n_received;         /* body bytes read so far, kept or discarded (for the body deadline) */
    size_t body_len;             /* of the body handed to a prepare thread */
    double t_start;
    int fd;
    char tenant[SRV_MAX_KEY_LEN + 8];
    char *session_hdr;           /* x-session-id, copied (the prepare thread cannot ask MHD) */
    struct srv_job *job;         /* C_STREAM, C_WAIT: one reference */
    /* C_REPLY */
    int status;
    char *reply;
    size_t reply_len;
    const char *ctype, *hdr, *val;
    struct conn *next_prep;
};

/* ---- across the files ---- */

/* guard.c: the 408s, written once at start */
extern char http_timeout_reply[512], http_body_timeout_reply[512];
extern size_t http_timeout_reply_len, http_body_timeout_reply_len;
void http_timeouts_init(void);
/* http.c: a parked job's connection back to MHD's polling (j->mu held); whether poll's
 * revents on fd mean the client has gone; the route of a URL */
bool http_peer_gone_revents(int fd, short revents);
void http_job_wake(struct srv_job *j);
enum route http_find_route(const char *url);
/* jobs.c: a request counted for /metrics; the worker thread; the server's /metrics lines;
 * jobs made, released and queued (false: the queue is full) */
void http_count_request(struct srv_server *s, enum route r, int status);
void *http_worker_main(void *arg);
void http_render_metrics(struct srv_server *s, struct tern_buf *b);
struct srv_job *http_job_new(struct srv_server *s);
void http_job_unref(struct srv_server *s, struct srv_job *j);
bool http_enqueue(struct srv_server *s, struct srv_job *j);
/* guard.c: MHD's connection notifier (first bytes, shedding, the socket list) */
void http_notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                       enum MHD_ConnectionNotificationCode code);
/* watcher.c: the watcher thread */
void *http_watch_main(void *arg);

#endif
