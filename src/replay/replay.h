/* The replay harness (DESIGN.md §6, docs/replay.md): sends a recorded agent session
 * turn by turn to one or two OpenAI-compatible servers ("arms"), measures time to
 * first token and usage per turn, checks that the comparison is honest, and writes
 * turns.jsonl, RESULTS.md and ttft.svg.
 *
 * Protocol (why: docs/replay.md). A repetition replays the whole conversation; within
 * it, each turn goes to every arm before the next turn starts, the arm that goes first
 * alternating from turn to turn and rep to rep. Repetitions never share server state:
 * managed servers are restarted for every repetition (isolate=restart), or every
 * request of a repetition carries that repetition's own cache_salt (isolate=salt).
 * Within a repetition the turns do share state: that is the conversation. */
#ifndef TERN_REPLAY_REPLAY_H
#define TERN_REPLAY_REPLAY_H

#include "replay/http-client.h"
#include "replay/transcript.h"
#include "util/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define TERN_REPLAY_MAX_ARMS 2
#define TERN_REPLAY_MAX_REPS 100

enum tern_replay_isolate {
    TERN_ISOLATE_RESTART = 0, /* fresh server processes for every repetition (managed arms only) */
    TERN_ISOLATE_SALT = 1,    /* a per-repetition cache_salt in every request */
    TERN_ISOLATE_NONE = 2,    /* nothing: later reps may reuse earlier ones (reported) */
};
const char *tern_replay_isolate_name(enum tern_replay_isolate i);

/* One measured request. */
struct tern_replay_meas {
    bool done;               /* measured (the run may have stopped early) */
    size_t turn;
    int rep;
    int arm;
    double t_start_s;        /* request start, seconds since the run began */
    double gap_before_s;     /* quiet time the harness waited right before it */
    double ttft_s;           /* to the first chunk carrying output; NAN if none came */
    const char *ttft_at;     /* "text" (content/reasoning), "tool_call", "finish" (no output
                                at all: the finish chunk), or "none" */
    double first_byte_s;     /* to the first body byte (role chunks, comments included) */
    double total_s;          /* to the end of the stream */
    long prompt_tokens;      /* usage; -1 when absent */
    long cached_tokens;      /* usage.prompt_tokens_details.cached_tokens; -1 when absent */
    long completion_tokens;  /* -1 when absent */
    bool usage_seen;
    char finish_reason[24];
    uint64_t out_hash;       /* xxh3 of reasoning \0 content \0 (name \0 args \0)* */
    char *out_content;       /* owned; out_content_len bytes (may hold NULs) + a NUL */
    size_t out_content_len;
    char *out_reasoning;     /* owned; out_reasoning_len bytes + a NUL */
    size_t out_reasoning_len;
    char *out_tool_calls;    /* owned: "name(args);..." */
    char *reuse_json;        /* owned: the response's tern.reuse object (compact JSON), or NULL */
    size_t n_comments;       /* SSE comment lines (keep-alives) seen */
    uint64_t body_hash;      /* xxh3 of the exact bytes POSTed */
    size_t body_len;
    struct tern_body_edits edits;
};

void tern_replay_meas_clear(struct tern_replay_meas *m); /* frees the owned strings */

/* ---- the response stream --------------------------------------------------------------
 * Consumes one streamed chat-completions response (SSE) into a measurement, clocking
 * each event at its arrival. Exposed for tests. */
struct tern_chat_stream;
enum tern_status tern_chat_stream_new(struct tern_replay_meas *m, uint64_t t0_ns, struct tern_chat_stream **out);
/* Feed body bytes as they arrive; the arrival time is read inside. */
enum tern_status tern_chat_stream_feed(struct tern_chat_stream *cs, const char *data, size_t n);
/* After the body ended: TERN_ERR_FORMAT if the stream never finished ([DONE] or a
 * finish_reason), or carried an error event (its message quoted). Sets total_s. */
enum tern_status tern_chat_stream_finish(struct tern_chat_stream *cs, uint64_t t_end_ns);
void tern_chat_stream_free(struct tern_chat_stream *cs);

/* ---- integrity checks (each a clear error naming turn, arm, rep and the numbers) ----- */

/* Usage present and consistent: prompt_tokens > 0, 0 <= cached <= prompt. */
enum tern_status tern_replay_check_usage(const struct tern_replay_meas *m, const char *arm_label);
/* Across the measurements of one turn (all arms, all reps so far): the bytes POSTed
 * to every arm within a rep are identical, and prompt_tokens agree everywhere. */
/* The same with prompt_tokens allowed to differ by up to slack between arms (two servers
 * whose adapters render a protocol's request differently: tern drops Claude Code's
 * billing block, llama-server keeps it). */
enum tern_status tern_replay_check_turn_slack(const struct tern_replay_meas *const *ms, size_t n,
                                              const char *const *arm_labels, long slack);
enum tern_status tern_replay_check_turn(const struct tern_replay_meas *const *ms, size_t n,
                                        const char *const *arm_labels);

/* ---- arms and configuration ------------------------------------------------------------ */

struct tern_replay_arm {
    char label[32];          /* "on", "off", "A", "B" */
    char url[600];           /* base URL (for managed arms: set once the server is up) */
    bool managed;            /* started by the harness */
    bool reuse;              /* managed: reuse on (else the off switches) */
    bool no_predict;         /* managed, reuse on: TERN_PREDICT=0 (predictive priming off) */
    char settings[512];      /* a description for RESULTS.md */
};

struct tern_replay_progress {
    const struct tern_replay_meas *m; /* the measurement just taken */
    const char *arm_label;
    size_t n_turns;
    int n_reps;
    enum tern_turn_kind kind;
};
typedef void (*tern_replay_progress_fn)(void *user, const struct tern_replay_progress *p);
/* Status lines ("starting servers", "rep 2: restarting servers") for the user. */
typedef void (*tern_replay_note_fn)(void *user, const char *line);

/* The door a replay goes through (proto.c): each turn's chat-completions body is sent
 * as is, or converted into what a client of the Messages or Responses API would send. */
enum tern_replay_protocol { TERN_REPLAY_CHAT = 0, TERN_REPLAY_MESSAGES, TERN_REPLAY_RESPONSES };
bool tern_replay_protocol_parse(const char *s, enum tern_replay_protocol *out);
const char *tern_replay_protocol_path(enum tern_replay_protocol p);
/* Rewrites body (a chat-completions request) for protocol p; shape: a request body a
 * real client of p sent (NULL: none), whose system prompt / instructions and tools
 * replace the transcript's. Deterministic. */
enum tern_status tern_replay_to_protocol(enum tern_replay_protocol p, const json_t *shape, struct tern_buf *body);

struct tern_replay_config {
    const struct tern_replay_transcript *tr;
    enum tern_replay_protocol protocol;
    long prompt_slack;           /* prompt tokens the arms may differ by (0: none) */
    int pause_pid[TERN_REPLAY_MAX_ARMS]; /* URL arms: the servers' processes, paused (SIGSTOP) while
                                            the other arm is measured, as managed arms are (0: none) */
    const json_t *shape;         /* borrowed; NULL: the transcript's system prompt and tools */
    size_t n_turns;              /* turns replayed: the first n_turns (0 = all) */
    int n_reps;                  /* >= 1 */
    double gap_s;                /* quiet time after a turn whose reply made tool calls */
    double user_gap_s;           /* quiet time after a turn whose reply was a final answer */
    long max_tokens;             /* >= 0 overrides the recorded max_tokens */
    enum tern_replay_isolate isolate;
    bool warmup;                 /* one short unrelated request per server before each rep */
    bool no_pause;               /* managed: do not pause the other arm's server (SIGSTOP)
                                    while one arm is measured and during its quiet time */
    bool trust_kinds;            /* use the transcript's labels without deriving them */
    double timeout_s;            /* idle timeout of a request */
    int n_arms;                  /* 1 or 2 */
    struct tern_replay_arm arms[TERN_REPLAY_MAX_ARMS];

    /* Managed servers (--model): `server_bin serve --model model_path --host 127.0.0.1
     * --port P server_args...`, the off arm with TERN_AFFINITY=0 TERN_REUSE_POOL=0
     * TERN_PREDICT=0 and --prompt-cache 0. */
    const char *server_bin;      /* default /proc/self/exe */
    const char *model_path;      /* NULL: no --model, the server's built-in demo model */
    char **server_args;
    int n_server_args;
    double start_timeout_s;      /* for /health to answer 200 */

    const char *out_dir;         /* created if missing; server logs go here too */
    const char *command_line;    /* recorded in RESULTS.md */
    const volatile int *cancel;  /* set by a signal handler: stop, clean up, return CANCELLED */
    tern_replay_progress_fn on_progress;
    tern_replay_note_fn on_note;
    void *user;
};

void tern_replay_config_default(struct tern_replay_config *c);

/* The run: every measurement plus what is needed to report it. */
struct tern_replay_run {
    const struct tern_replay_config *cfg;
    size_t n_turns;
    struct tern_replay_meas *meas; /* [rep][turn][arm] */
    size_t n_meas;                 /* n_reps * n_turns * n_arms; each says whether it was taken */
    double wall_s;                 /* first request to last response, servers' start excluded */
    double wall_total_s;           /* the whole run, server starts included */
    char arm_url[TERN_REPLAY_MAX_ARMS][600];  /* where each arm was reached */
    char model_id[TERN_REPLAY_MAX_ARMS][128]; /* from GET /v1/models, "" if unknown */
    char run_id[32];
    char started_at[32];           /* UTC, ISO 8601 */
    bool isolation_leak;           /* a later rep's cold turn reported cached tokens */
    long leak_cached;
    int leak_rep;
};

static inline struct tern_replay_meas *tern_replay_meas_at(const struct tern_replay_run *r, int rep, size_t turn,
                                                           int arm) {
    return &r->meas[((size_t)rep * r->n_turns + turn) * (size_t)r->cfg->n_arms + (size_t)arm];
}

/* Runs the replay and writes out_dir/turns.jsonl as it goes. On error (a failed
 * request, a failed check, cancellation) the servers it started are stopped, the
 * measurements so far stay in turns.jsonl and *out is NULL. */
enum tern_status tern_replay_run(const struct tern_replay_config *cfg, struct tern_replay_run **out);
void tern_replay_run_free(struct tern_replay_run *r);

/* ---- results (stats.c, report.c, plot.c) ----------------------------------------------- */

/* The median of the finite values in v[0..n) (NAN values skipped); NAN if none. */
double tern_stats_median(const double *v, size_t n);
/* Smallest and largest finite values; both NAN if none. */
void tern_stats_range(const double *v, size_t n, double *lo, double *hi);

struct tern_turn_summary {
    enum tern_turn_kind kind;
    long prompt_tokens;                        /* -1 if unknown */
    double ttft[TERN_REPLAY_MAX_ARMS];         /* median over reps */
    double ttft_lo[TERN_REPLAY_MAX_ARMS], ttft_hi[TERN_REPLAY_MAX_ARMS];
    double total[TERN_REPLAY_MAX_ARMS];        /* median */
    double cached[TERN_REPLAY_MAX_ARMS];       /* median */
    double read[TERN_REPLAY_MAX_ARMS];         /* median of prompt - cached */
    double ratio;                              /* ttft[1] / ttft[0]; NAN with one arm */
    bool output_identical;                     /* every measurement's output hash equal */
    /* A rewrite turn: ttft over the mean of the nearest extension turn before and the
     * nearest after (either alone at an end); NAN otherwise. Extension turns at about the
     * same context length are the yardstick of "no class of turn left behind". */
    double vs_ext[TERN_REPLAY_MAX_ARMS];
};

struct tern_class_summary {
    size_t n_turns;
    double med[TERN_REPLAY_MAX_ARMS], lo[TERN_REPLAY_MAX_ARMS], hi[TERN_REPLAY_MAX_ARMS];
    double ratio_med, ratio_lo, ratio_hi;
};

struct tern_replay_summary {
    size_t n_turns;
    int n_arms;
    struct tern_turn_summary *turns;                     /* owned */
    struct tern_class_summary classes[TERN_TURN_KIND_COUNT];
    double sum_ttft[TERN_REPLAY_MAX_ARMS];                /* sum of per-turn medians */
    double sum_total[TERN_REPLAY_MAX_ARMS];
    size_t n_identical;                                  /* turns whose output is identical */
    /* The flat line: first and last rewrite turns. */
    long first_rewrite, last_rewrite;                    /* -1 if none */
    /* Range of turns[].vs_ext per arm over the rewrite turns that have one; n_vs_ext = 0
     * when no rewrite turn has an extension neighbour. */
    size_t n_vs_ext;
    double vs_ext_lo[TERN_REPLAY_MAX_ARMS], vs_ext_hi[TERN_REPLAY_MAX_ARMS];
};

/* Per-turn medians (per arm) and class tables from the measurements in r. */
enum tern_status tern_replay_summarize(const struct tern_replay_run *r, struct tern_replay_summary *s);
/* The same from plain arrays (for tests): ttft/total/cached/prompt [rep][turn][arm],
 * hashes likewise; NAN / -1 for missing. */
enum tern_status tern_replay_summarize_arrays(size_t n_turns, int n_reps, int n_arms, const enum tern_turn_kind *kinds,
                                              const double *ttft, const double *total, const long *prompt,
                                              const long *cached, const uint64_t *hash,
                                              struct tern_replay_summary *s);
void tern_replay_summary_free(struct tern_replay_summary *s);

/* One turns.jsonl line (no trailing newline) for a measurement. Caller frees. */
char *tern_replay_meas_json(const struct tern_replay_run *r, const struct tern_replay_meas *m);

/* RESULTS.md into out. */
enum tern_status tern_replay_write_results(const struct tern_replay_run *r, const struct tern_replay_summary *s,
                                           FILE *out);
/* RESULTS.md and ttft.svg into cfg->out_dir. */
enum tern_status tern_replay_write_outputs(const struct tern_replay_run *r, const struct tern_replay_summary *s);
/* The machine, one line: "Intel(R) Xeon(R) ... , 2 cores, 7.6 GiB RAM, Linux 6.1". */
void tern_replay_machine(char *out, size_t cap);

/* ---- the plot -------------------------------------------------------------------------- */

struct tern_plot_series {
    const char *label;
    const double *y;        /* [n] median TTFT in seconds; NAN = no point */
    const double *y_lo;     /* [n] or NULL: range over reps, drawn as a whisker */
    const double *y_hi;
};

struct tern_plot {
    const char *title;
    const char *subtitle;
    size_t n;                           /* turns */
    const enum tern_turn_kind *kinds;   /* [n] */
    const double *prompt_tokens;        /* [n] or NULL (right axis) */
    const double *read_tokens;          /* [n] or NULL: tokens read by series 0 (right axis) */
    const char *read_label;
    int n_series;                       /* 1 or 2 */
    struct tern_plot_series series[TERN_REPLAY_MAX_ARMS];
};

/* Writes the SVG document (a complete, standalone file) into out. */
enum tern_status tern_plot_svg(const struct tern_plot *p, struct tern_buf *out);
/* "Nice" axis ticks covering [lo, hi]: about `target` steps of 1, 2 or 5 x 10^k.
 * Returns the number of ticks written to ticks (at most cap). */
size_t tern_plot_ticks(double lo, double hi, int target, double *ticks, size_t cap);

/* ---- managed servers (server-proc.c) ---------------------------------------------------- */

struct tern_server_proc {
    pid_t pid;           /* 0 when not running */
    uint16_t port;
    char url[64];
    char log_path[1024];
    bool paused;         /* SIGSTOPped by tern_server_pause */
};

struct tern_server_spec {
    const char *bin;             /* executable */
    char *const *argv;           /* full argv (argv[0] included), NULL-terminated */
    char *const *env_add;        /* "NAME=value" entries added to the environment, NULL-terminated */
    const char *log_path;        /* stdout+stderr of the server (appended) */
    double start_timeout_s;
    const volatile int *cancel;
};

/* A loopback TCP port that was free a moment ago. */
enum tern_status tern_server_free_port(uint16_t *port);
/* Forks and execs the server (its own process group; it gets SIGTERM if the harness
 * dies), then polls GET /health until 200. `port` must match the port in argv. On
 * error the child is stopped and the message ends with the tail of its log. */
enum tern_status tern_server_start(const struct tern_server_spec *spec, uint16_t port, struct tern_server_proc *p);
/* SIGTERM (and SIGCONT), up to 10 s to exit, then SIGKILL; always reaps. No-op when
 * not running. */
void tern_server_stop(struct tern_server_proc *p);
/* Pauses (SIGSTOP) or resumes (SIGCONT) the server's process group, so that a server
 * gets no CPU time while another arm is measured. No-op when not running or already
 * in that state. */
void tern_server_pause(struct tern_server_proc *p, bool pause);

/* ---- synthetic transcripts (synth.c) ----------------------------------------------------- */

enum tern_synth_kind { TERN_SYNTH_AGENT = 0, TERN_SYNTH_COMPACTION = 1 };

struct tern_synth_opts {
    enum tern_synth_kind kind;
    size_t n_turns;          /* >= 2 */
    uint64_t seed;
    bool strip;              /* the client strips reasoning from prior assistant messages */
};

/* Writes the transcript (JSONL, the bench format, kinds derived by the same rules as
 * tern_transcript_classify) into out. Deterministic in opts. */
enum tern_status tern_synth_transcript(const struct tern_synth_opts *o, struct tern_buf *out);

#endif
