/* tern replay: the flat-line benchmark (docs/replay.md). */
#include "cli/cli.h"
#include "cli/opts.h"

#include "replay/replay.h"
#include "util/mem.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig) {
    (void)sig;
    if (stop_flag) _exit(130); /* a second Ctrl-C: the servers get SIGTERM from the kernel */
    stop_flag = 1;
}

static const struct cli_spec replay_cli = {
    "replay",
    "usage: tern replay --transcript FILE.jsonl (--model FILE | --demo) [--arms on,off] [options]\n"
    "       tern replay --transcript FILE.jsonl --url URL [--url-b URL2] [options]\n"
    "       tern replay --make-transcript agent|compaction --out FILE [--turns N] [--seed S] [--strip]\n"
    "\n"
    "Replays a recorded agent session turn by turn against one or two OpenAI-compatible servers and\n"
    "measures time to first token per turn (docs/replay.md). Each turn's request is sent as recorded;\n"
    "what the server generates is never fed back. Writes DIR/turns.jsonl, DIR/RESULTS.md, DIR/ttft.svg.\n"
    "\n",
    NULL,
};

static bool parse_protocol(const char *v, void *dst) { return tern_replay_protocol_parse(v, dst); }

/* --pause-pids PA,PB: two process ids */
static bool parse_pids(const char *v, void *dst) {
    int *p = dst;
    char tail;
    return sscanf(v, "%d,%d%c", &p[0], &p[1], &tail) == 2 && p[0] > 0 && p[1] > 0;
}

/* Splits a command string into words: whitespace separates, '...' and "..." quote,
 * backslash escapes outside single quotes. */
static int split_args(const char *s, char ***out, int *n_out) {
    char **v = NULL;
    int n = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *w = tern_malloc(strlen(p) + 1);
        if (!w) return -1;
        size_t k = 0;
        char q = 0;
        while (*p && (q || (*p != ' ' && *p != '\t' && *p != '\n'))) {
            if (q) {
                if (*p == q) q = 0;
                else if (*p == '\\' && q == '"' && p[1]) w[k++] = *++p;
                else w[k++] = *p;
            } else if (*p == '\'' || *p == '"') {
                q = *p;
            } else if (*p == '\\' && p[1]) {
                w[k++] = *++p;
            } else {
                w[k++] = *p;
            }
            p++;
        }
        if (q) {
            free(w);
            for (int i = 0; i < n; i++) free(v[i]);
            free(v);
            return -2;
        }
        w[k] = 0;
        char **nv = tern_reallocarray(v, (size_t)n + 1, sizeof *v);
        if (!nv) {
            free(w);
            return -1;
        }
        v = nv;
        v[n++] = w;
    }
    *out = v;
    *n_out = n;
    return 0;
}

static void progress(void *user, const struct tern_replay_progress *p) {
    (void)user;
    const struct tern_replay_meas *m = p->m;
    char ttft[32];
    if (isfinite(m->ttft_s)) snprintf(ttft, sizeof ttft, "%8.3f s", m->ttft_s);
    else snprintf(ttft, sizeof ttft, "%10s", "none");
    fprintf(stderr, "[rep %d/%d] turn %3zu/%zu %-9s %-4s TTFT %s  total %7.3f s  prompt %6ld  cached %6ld\n",
            m->rep + 1, p->n_reps, m->turn, p->n_turns, tern_turn_kind_name(p->kind), p->arm_label, ttft, m->total_s,
            m->prompt_tokens, m->cached_tokens);
}

static void note(void *user, const char *line) {
    (void)user;
    fprintf(stderr, "tern replay: %s\n", line);
}

/* The class table, for the terminal. */
static void print_summary(const struct tern_replay_config *cfg, const struct tern_replay_summary *s) {
    int na = cfg->n_arms;
    printf("\n%-10s %5s", "class", "turns");
    for (int a = 0; a < na; a++) printf("  %22s", cfg->arms[a].label);
    if (na == 2) printf("  %8s/%-8s", cfg->arms[1].label, cfg->arms[0].label);
    printf("\n");
    for (int k = 0; k < TERN_TURN_KIND_COUNT; k++) {
        const struct tern_class_summary *c = &s->classes[k];
        if (!c->n_turns) continue;
        printf("%-10s %5zu", tern_turn_kind_name((enum tern_turn_kind)k), c->n_turns);
        for (int a = 0; a < na; a++) {
            char b[64];
            snprintf(b, sizeof b, "%.3f s (%.3f-%.3f)", c->med[a], c->lo[a], c->hi[a]);
            printf("  %22s", b);
        }
        if (na == 2) printf("  %7.2fx (%.2f-%.2f)", c->ratio_med, c->ratio_lo, c->ratio_hi);
        printf("\n");
    }
    printf("%-10s %5zu", "sum", s->n_turns);
    for (int a = 0; a < na; a++) printf("  %20.3f s", s->sum_ttft[a]);
    if (na == 2 && s->sum_ttft[0] > 0) printf("  %7.2fx", s->sum_ttft[1] / s->sum_ttft[0]);
    printf("\noutput identical across arms on %zu of %zu turns\n", s->n_identical, s->n_turns);
    if (s->n_vs_ext > 0) {
        printf("rewrite turns vs the extension turns around them:");
        for (int a = 0; a < na; a++)
            printf("%s %s %.2f-%.2fx", a ? ";" : "", cfg->arms[a].label, s->vs_ext_lo[a], s->vs_ext_hi[a]);
        printf("\n");
    }
}

static char *join_argv(int argc, char **argv) {
    struct tern_buf b = TERN_BUF_INIT;
    tern_buf_puts(&b, "tern");
    for (int i = 0; i < argc; i++) {
        const char *a = i == 0 ? "replay" : argv[i];
        bool plain = *a && strspn(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./,:+@%") == strlen(a);
        if (plain) tern_buf_printf(&b, " %s", a);
        else {
            tern_buf_puts(&b, " '");
            for (const char *p = a; *p; p++) {
                if (*p == '\'') tern_buf_puts(&b, "'\\''");
                else tern_buf_putc(&b, *p);
            }
            tern_buf_puts(&b, "'");
        }
    }
    return tern_buf_detach(&b, NULL);
}

static int make_transcript(const char *kind, const char *out, long turns, long seed, bool strip) {
    struct tern_synth_opts o = {.n_turns = (size_t)turns, .seed = (uint64_t)seed, .strip = strip};
    if (!strcmp(kind, "agent")) o.kind = TERN_SYNTH_AGENT;
    else if (!strcmp(kind, "compaction")) o.kind = TERN_SYNTH_COMPACTION;
    else return cli_usage_error("replay", "--make-transcript '%s': use agent or compaction", kind);
    if (!out) return cli_usage_error("replay", "--make-transcript needs --out FILE");
    struct tern_buf b = TERN_BUF_INIT;
    enum tern_status st = tern_synth_transcript(&o, &b);
    if (st != TERN_OK) {
        tern_buf_free(&b);
        return cli_fail("replay", "%s", tern_last_error());
    }
    FILE *f = fopen(out, "wb");
    if (!f) {
        tern_buf_free(&b);
        return cli_fail("replay", "cannot write '%s': %s", out, strerror(errno));
    }
    size_t w = fwrite(b.data, 1, b.len, f);
    int bad = fclose(f) != 0 || w != b.len;
    tern_buf_free(&b);
    if (bad) return cli_fail("replay", "writing '%s' failed", out);
    struct tern_replay_transcript *tr = NULL;
    st = tern_transcript_load(out, &tr);
    if (st != TERN_OK) return cli_fail("replay", "the generated transcript does not load: %s", tern_last_error());
    char *k = tern_transcript_kinds_string(tr, tr->n_turns);
    fprintf(stderr, "tern replay: wrote %s: %zu turns, kinds %s\n", out, tr->n_turns, k ? k : "?");
    free(k);
    tern_transcript_free(tr);
    return 0;
}

static int replay_main(int argc, char **argv) {
    struct tern_replay_config cfg;
    tern_replay_config_default(&cfg);
    const char *transcript = NULL, *url = NULL, *url_b = NULL, *model = NULL, *arms = NULL, *out = NULL;
    const char *server_args = NULL, *server_bin = NULL, *isolate = NULL, *labels = NULL, *make = NULL;
    long reps = 3, turns = -1, max_tokens = -1, seed = 1;
    double gap = 0, user_gap = -1, timeout = 600, start_timeout = 300;
    bool no_warmup = false, no_pause = false, trust = false, strip = false, quiet = false, demo = false;
    enum tern_replay_protocol protocol = TERN_REPLAY_CHAT;
    const char *shape_path = NULL;
    int pause_pids[2] = {0, 0};
    long prompt_slack = 0;
    const struct cli_opt opts[] = {
        CLI_SECTION("input"),
        CLI_STR1("transcript", &transcript, "FILE.jsonl", "the recorded session (docs/replay.md)"),
        CLI_SECTION("arms"),
        CLI_STR1("model", &model, "FILE", "start `tern serve` on FILE for each arm (loopback, free ports)"),
        CLI_FLAG("demo", &demo, "the same with `tern serve`'s built-in demo model"),
        CLI_STR1("arms", &arms, "on,off",
                 "managed arms: 'on' = reuse on; 'off' = --prompt-cache 0 and TERN_AFFINITY=0 TERN_REUSE_POOL=0 "
                 "TERN_PREDICT=0 (default on,off); 'nopredict' = reuse on, predictive priming off (TERN_PREDICT=0)"),
        CLI_STR("server-args", &server_args, "\"...\"",
                "extra `tern serve` arguments for both arms (e.g. \"--threads 2\")"),
        CLI_STR1("server-bin", &server_bin, "FILE", "the server executable (default: this tern); run as FILE serve ..."),
        CLI_STR1("url", &url, "URL", "an already running server (arm A)"),
        CLI_STR1("url-b", &url_b, "URL", "a second one (arm B), compared with A"),
        CLI_STR1("labels", &labels, "A,B", "names of the URL arms in the report (default A,B)"),
        CLI_FN("pause-pids", pause_pids, parse_pids, "two process ids, PA,PB", "PA,PB",
               "the URL arms' server processes: each is paused (SIGSTOP) while the other arm is measured, as "
               "managed arms are"),
        CLI_SECTION("doors"),
        CLI_FN("protocol", &protocol, parse_protocol, "chat, messages or responses", "P",
               "chat (default), messages (the Anthropic Messages API) or responses (the OpenAI Responses API): each "
               "turn converted as that API's client would send it, to /v1/messages or /v1/responses of both arms"),
        CLI_STR1("shape", &shape_path, "FILE",
                 "a request body a real client of --protocol sent (bench/agent-shape.mjs): its system prompt "
                 "(instructions) and tools replace the transcript's"),
        CLI_INT("prompt-slack", &prompt_slack, 0, 1000000, "N",
                "the arms' prompt token counts may differ by up to N (servers whose adapters render the same "
                "request differently; default 0)"),
        CLI_SECTION("protocol"),
        CLI_INT("reps", &reps, 1, TERN_REPLAY_MAX_REPS, "N",
                "repetitions, each replaying the whole conversation (default 3)"),
        CLI_STR1("isolate", &isolate, "MODE",
                 "keep repetitions independent: restart (fresh servers per rep; the default with --model), salt (a "
                 "per-rep cache_salt; default with --url), none"),
        CLI_INT("turns", &turns, 1, 100000, "N",
                "replay only the first N turns (with --make-transcript: the turns to make, default 25)"),
        CLI_NUM("gap", &gap, 0, 3600, "S", "seconds of quiet after a turn whose reply made tool calls (default 0)"),
        CLI_NUM("user-gap", &user_gap, 0, 3600, "S",
                "seconds of quiet after a turn that ended with an answer (default: --gap)"),
        CLI_INT("max-tokens", &max_tokens, 1, 1000000, "N", "override the recorded max_tokens"),
        CLI_FLAG("no-warmup", &no_warmup, "skip the short warm-up request per server before each repetition"),
        CLI_FLAG("no-pause", &no_pause,
                 "managed arms: do not pause (SIGSTOP) the other arm's server while one arm's request and quiet "
                 "time run"),
        CLI_FLAG("trust-kinds", &trust, "use the transcript's kind labels without checking them"),
        CLI_NUM("timeout", &timeout, 1, 86400, "S", "longest silence from a server during a request (default 600)"),
        CLI_NUM("start-timeout", &start_timeout, 1, 86400, "S",
                "how long a started server may take to become healthy (default 300)"),
        CLI_STR1("out", &out, "DIR", "output directory (default replay-out)"),
        CLI_FLAG("quiet", &quiet, "no progress lines"),
        CLI_SECTION("synthetic transcripts"),
        CLI_STR1("make-transcript", &make, "KIND", "agent or compaction; writes --out FILE and exits"),
        CLI_INT("seed", &seed, 0, 2147483647L, "S", "generator seed (default 1)"),
        CLI_FLAG("strip", &strip, "the client strips reasoning from earlier replies (every turn a rewrite)"),
        CLI_END,
    };
    int c = cli_parse(&replay_cli, opts, argc, argv, NULL);
    if (c >= 0) return c;

    if (make) {
        if (transcript || url || model || demo)
            return cli_usage_error("replay", "--make-transcript writes a transcript; it takes no --transcript, --url or --model");
        return make_transcript(make, out, turns > 0 ? turns : 25, seed, strip);
    }
    if (!transcript) return cli_usage_error("replay", "missing --transcript FILE.jsonl");
    if (!!url + !!model + demo != 1)
        return cli_usage_error("replay", "give exactly one of --model FILE, --demo and --url URL");
    bool managed = model || demo;
    if (url_b && !url) return cli_usage_error("replay", "--url-b needs --url");
    if (arms && !managed) return cli_usage_error("replay", "--arms needs --model or --demo (with --url, use --url-b)");
    if (labels && !url) return cli_usage_error("replay", "--labels names URL arms; managed arms are 'on' and 'off'");
    if ((server_args || server_bin) && !managed)
        return cli_usage_error("replay", "--server-args and --server-bin need --model or --demo");
    if (strip) return cli_usage_error("replay", "--strip goes with --make-transcript");

    if (managed) {
        const char *spec = arms ? arms : "on,off";
        char buf[64];
        snprintf(buf, sizeof buf, "%s", spec);
        int n = 0;
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            if (n == TERN_REPLAY_MAX_ARMS) return cli_usage_error("replay", "--arms '%s': at most two arms", spec);
            if (strcmp(tok, "on") && strcmp(tok, "off") && strcmp(tok, "nopredict"))
                return cli_usage_error("replay", "--arms '%s': each arm is 'on', 'off' or 'nopredict'", spec);
            struct tern_replay_arm *a = &cfg.arms[n++];
            snprintf(a->label, sizeof a->label, "%s", tok);
            a->managed = true;
            a->reuse = strcmp(tok, "off") != 0;
            a->no_predict = !strcmp(tok, "nopredict");
        }
        if (n == 0) return cli_usage_error("replay", "--arms '%s': name one or two arms", spec);
        if (n == 2 && !strcmp(cfg.arms[0].label, cfg.arms[1].label))
            return cli_usage_error("replay", "--arms '%s': the two arms must differ", spec);
        cfg.n_arms = n;
        if (model && access(model, R_OK) != 0) return cli_fail("replay", "cannot read model '%s': %s", model, strerror(errno));
    } else {
        char l0[32] = "A", l1[32] = "B";
        if (labels) {
            const char *comma = strchr(labels, ',');
            if (!comma || comma == labels || !comma[1] || strchr(comma + 1, ',') || (size_t)(comma - labels) >= sizeof l0 ||
                strlen(comma + 1) >= sizeof l1)
                return cli_usage_error("replay", "--labels '%s': give two short names, e.g. tern,llama.cpp", labels);
            snprintf(l0, sizeof l0, "%.*s", (int)(comma - labels), labels);
            snprintf(l1, sizeof l1, "%s", comma + 1);
            if (!strcmp(l0, l1)) return cli_usage_error("replay", "--labels '%s': the names must differ", labels);
        }
        const char *urls[2] = {url, url_b};
        cfg.n_arms = url_b ? 2 : 1;
        for (int a = 0; a < cfg.n_arms; a++) {
            struct tern_http_url u;
            if (tern_http_url_parse(urls[a], &u) != TERN_OK)
                return cli_usage_error("replay", "%s", tern_last_error());
            struct tern_replay_arm *arm = &cfg.arms[a];
            snprintf(arm->label, sizeof arm->label, "%s", a ? l1 : l0);
            snprintf(arm->url, sizeof arm->url, "%s", urls[a]);
            snprintf(arm->settings, sizeof arm->settings, "the server at %s", urls[a]);
        }
    }
    if (isolate) {
        if (!strcmp(isolate, "restart")) cfg.isolate = TERN_ISOLATE_RESTART;
        else if (!strcmp(isolate, "salt")) cfg.isolate = TERN_ISOLATE_SALT;
        else if (!strcmp(isolate, "none")) cfg.isolate = TERN_ISOLATE_NONE;
        else return cli_usage_error("replay", "--isolate '%s': use restart, salt or none", isolate);
        if (url && cfg.isolate == TERN_ISOLATE_RESTART)
            return cli_usage_error("replay", "--isolate restart needs --model (the harness cannot restart a server at a URL)");
    } else {
        cfg.isolate = managed ? TERN_ISOLATE_RESTART : TERN_ISOLATE_SALT;
    }

    char **sargs = NULL;
    int n_sargs = 0;
    if (server_args) {
        int rc = split_args(server_args, &sargs, &n_sargs);
        if (rc == -2) return cli_usage_error("replay", "--server-args: unbalanced quote in '%s'", server_args);
        if (rc != 0) return cli_fail("replay", "out of memory");
    }
    char self[4096];
    if (managed && !server_bin) {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) return cli_fail("replay", "cannot find this executable (/proc/self/exe): %s", strerror(errno));
        self[n] = 0;
        server_bin = self;
    }
    if (managed) {
        struct tern_buf extra = TERN_BUF_INIT;
        char model_arg[4200] = "";
        if (model) snprintf(model_arg, sizeof model_arg, " --model %s", model);
        for (int i = 0; i < n_sargs; i++) tern_buf_printf(&extra, " %s", sargs[i]);
        for (int a = 0; a < cfg.n_arms; a++) {
            struct tern_replay_arm *arm = &cfg.arms[a];
            struct tern_buf d = TERN_BUF_INIT;
            if (arm->reuse)
                tern_buf_printf(&d, "`%s%s serve%s%s` (reuse on%s)", arm->no_predict ? "TERN_PREDICT=0 " : "",
                                server_bin == self ? "tern" : server_bin, model_arg, extra.data ? extra.data : "",
                                arm->no_predict ? ", predictive priming off" : "");
            else
                tern_buf_printf(&d,
                                "`TERN_AFFINITY=0 TERN_REUSE_POOL=0 TERN_PREDICT=0 %s serve%s%s "
                                "--prompt-cache 0` (reuse off)",
                                server_bin == self ? "tern" : server_bin, model_arg, extra.data ? extra.data : "");
            size_t n = d.len < sizeof arm->settings ? d.len : sizeof arm->settings - 1;
            if (d.data) memcpy(arm->settings, d.data, n);
            arm->settings[n] = 0;
            tern_buf_free(&d);
        }
        tern_buf_free(&extra);
    }

    struct tern_replay_transcript *tr = NULL;
    enum tern_status st = tern_transcript_load(transcript, &tr);
    if (st != TERN_OK) {
        for (int i = 0; i < n_sargs; i++) free(sargs[i]);
        free(sargs);
        return cli_fail("replay", "%s", tern_last_error());
    }
    json_t *shape = NULL;
    if (shape_path) {
        json_error_t jerr;
        shape = json_load_file(shape_path, 0, &jerr);
        if (!json_is_object(shape)) {
            json_decref(shape);
            tern_transcript_free(tr);
            for (int i = 0; i < n_sargs; i++) free(sargs[i]);
            free(sargs);
            return cli_fail("replay", "--shape %s: not a JSON object (%s, line %d)", shape_path, jerr.text, jerr.line);
        }
    }
    char *cmdline = join_argv(argc, argv);
    cfg.tr = tr;
    cfg.protocol = protocol;
    cfg.prompt_slack = prompt_slack;
    cfg.pause_pid[0] = pause_pids[0];
    cfg.pause_pid[1] = pause_pids[1];
    cfg.shape = shape;
    cfg.n_turns = turns > 0 ? (size_t)turns : 0;
    cfg.n_reps = (int)reps;
    cfg.gap_s = gap;
    cfg.user_gap_s = user_gap >= 0 ? user_gap : gap;
    cfg.max_tokens = max_tokens;
    cfg.warmup = !no_warmup;
    cfg.no_pause = no_pause;
    cfg.trust_kinds = trust;
    cfg.timeout_s = timeout;
    cfg.start_timeout_s = start_timeout;
    cfg.server_bin = server_bin;
    cfg.model_path = model;
    cfg.server_args = sargs;
    cfg.n_server_args = n_sargs;
    cfg.out_dir = out ? out : "replay-out";
    cfg.command_line = cmdline;
    cfg.cancel = (const volatile int *)&stop_flag;
    cfg.on_progress = quiet ? NULL : progress;
    cfg.on_note = quiet ? NULL : note;

    struct sigaction sa = {0}, old_int, old_term, old_hup;
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);

    struct tern_replay_run *run = NULL;
    st = tern_replay_run(&cfg, &run);
    int rc = 0;
    if (st == TERN_ERR_CANCELLED) {
        fprintf(stderr, "tern replay: interrupted; servers stopped; measurements so far are in %s/turns.jsonl\n",
                cfg.out_dir);
        rc = 130;
    } else if (st != TERN_OK) {
        rc = cli_fail("replay", "%s", tern_last_error());
        fprintf(stderr, "tern replay: measurements so far are in %s/turns.jsonl\n", cfg.out_dir);
    } else {
        struct tern_replay_summary sum;
        st = tern_replay_summarize(run, &sum);
        if (st == TERN_OK) {
            st = tern_replay_write_outputs(run, &sum);
            if (st == TERN_OK) {
                print_summary(&cfg, &sum);
                printf("\nresults: %s/RESULTS.md\nplot:    %s/ttft.svg\nall measurements: %s/turns.jsonl\n",
                       cfg.out_dir, cfg.out_dir, cfg.out_dir);
            }
            tern_replay_summary_free(&sum);
        }
        if (st != TERN_OK) rc = cli_fail("replay", "%s", tern_last_error());
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    tern_replay_run_free(run);
    tern_transcript_free(tr);
    json_decref(shape);
    free(cmdline);
    for (int i = 0; i < n_sargs; i++) free(sargs[i]);
    free(sargs);
    return rc;
}

TERN_COMMAND("replay", "replay an agent session against servers: TTFT per turn, reuse on vs off", replay_main)
