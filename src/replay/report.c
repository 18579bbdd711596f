/* turns.jsonl lines, RESULTS.md and ttft.svg. */
#include "replay/replay.h"

#include "util/mem.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

/* ---- turns.jsonl ------------------------------------------------------------------------ */

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(round(v * 1e6) / 1e6) : json_null(); }
static json_t *int_or_null(long v) { return v >= 0 ? json_integer(v) : json_null(); }
/* Generated text may hold NUL bytes (JSON writes them as \u0000) or invalid UTF-8 (null). */
static json_t *text_or_null(const char *s, size_t n) {
    json_t *j = s ? json_stringn(s, n) : NULL;
    return j ? j : json_null();
}

char *tern_replay_meas_json(const struct tern_replay_run *r, const struct tern_replay_meas *m) {
    const struct tern_replay_config *cfg = r->cfg;
    const struct tern_replay_turn *tu = &cfg->tr->turns[m->turn];
    char hash[24], bhash[24];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)m->out_hash);
    snprintf(bhash, sizeof bhash, "%016llx", (unsigned long long)m->body_hash);
    json_t *edits = json_array();
    for (size_t i = 0; edits && i < m->edits.n; i++) json_array_append_new(edits, json_string(m->edits.what[i]));
    long read = m->prompt_tokens >= 0 && m->cached_tokens >= 0 ? m->prompt_tokens - m->cached_tokens : -1;
    json_t *reuse = m->reuse_json ? json_loads(m->reuse_json, 0, NULL) : NULL;
    json_t *o = json_pack(
        "{s:i,s:i,s:s,s:s,s:s?,s:o,s:o,s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:s,s:s,s:o,s:o,s:s?,s:o,s:i,s:s,s:I,"
        "s:o,s:o}",
        "rep", m->rep + 1, "turn", (int)m->turn, "arm", cfg->arms[m->arm].label, "kind", tern_turn_kind_name(tu->kind),
        "rewrite_by", tu->rewrite_by[0] ? tu->rewrite_by : NULL, "t_start_s", num_or_null(m->t_start_s),
        "ttft_s", num_or_null(m->ttft_s), "ttft_at", m->ttft_at, "first_byte_s", num_or_null(m->first_byte_s),
        "total_s", num_or_null(m->total_s), "prompt_tokens", int_or_null(m->prompt_tokens), "cached_tokens",
        int_or_null(m->cached_tokens), "read_tokens", int_or_null(read), "completion_tokens",
        int_or_null(m->completion_tokens), "gap_before_s", num_or_null(m->gap_before_s), "finish_reason",
        m->finish_reason, "output_xxh3", hash, "content", text_or_null(m->out_content, m->out_content_len), "reasoning",
        text_or_null(m->out_reasoning, m->out_reasoning_len),
        "tool_calls", m->out_tool_calls && m->out_tool_calls[0] ? m->out_tool_calls : NULL, "tern_reuse",
        reuse ? reuse : json_null(), "sse_comments", (int)m->n_comments, "body_xxh3", bhash, "body_bytes",
        (json_int_t)m->body_len, "body_edits", edits ? edits : json_null(), "line", json_integer((json_int_t)tu->line_no));
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(o);
    return s;
}

/* ---- the machine -------------------------------------------------------------------------- */

void tern_replay_machine(char *out, size_t cap) {
    char model[256] = "unknown CPU";
    int n_proc = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (!strncmp(line, "processor", 9)) n_proc++;
            if (!strncmp(line, "model name", 10) && !strcmp(model, "unknown CPU")) {
                char *c = strchr(line, ':');
                if (c) {
                    c++;
                    while (*c == ' ' || *c == '\t') c++;
                    c[strcspn(c, "\n")] = 0;
                    snprintf(model, sizeof model, "%s", c);
                }
            }
        }
        fclose(f);
    }
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    double gib = 0;
    f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            unsigned long long kb;
            if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) gib = (double)kb / (1024.0 * 1024.0);
        }
        fclose(f);
    }
    struct utsname u;
    char kernel[160] = "";
    if (uname(&u) == 0) snprintf(kernel, sizeof kernel, ", %s %s", u.sysname, u.release);
    snprintf(out, cap, "%s, %d logical CPUs in /proc/cpuinfo (%ld online), %.1f GiB RAM%s", model, n_proc, online,
             gib, kernel);
}

/* "Intel(R) Xeon(R) Processor @ 2.50GHz, 2 CPUs", for the plot. */
static void machine_short(char *out, size_t cap) {
    char m[512];
    tern_replay_machine(m, sizeof m);
    char *comma = strstr(m, " logical CPUs");
    if (comma) {
        snprintf(comma, sizeof m - (size_t)(comma - m), " CPUs");
    }
    snprintf(out, cap, "%s", m);
}

/* ---- RESULTS.md ------------------------------------------------------------------------------ */

static void fs(char *out, size_t cap, double v) {
    if (!isfinite(v)) snprintf(out, cap, "n/a");
    else if (v < 10) snprintf(out, cap, "%.3f", v);
    else snprintf(out, cap, "%.2f", v);
}

static void fx(char *out, size_t cap, double v) {
    if (!isfinite(v)) snprintf(out, cap, "n/a");
    else snprintf(out, cap, "%.2fx", v);
}

static void ftok(char *out, size_t cap, double v) {
    if (!isfinite(v) || v < 0) {
        snprintf(out, cap, "n/a");
        return;
    }
    long long n = llround(v);
    if (n >= 1000) snprintf(out, cap, "%lld,%03lld", n / 1000, n % 1000);
    else snprintf(out, cap, "%lld", n);
}

static void range_str(char *out, size_t cap, double med, double lo, double hi, bool ratio) {
    char a[24], b[24], c[24];
    if (ratio) {
        fx(a, sizeof a, med), fx(b, sizeof b, lo), fx(c, sizeof c, hi);
    } else {
        fs(a, sizeof a, med), fs(b, sizeof b, lo), fs(c, sizeof c, hi);
    }
    if (!isfinite(med)) snprintf(out, cap, "n/a");
    else if (!strcmp(b, c)) snprintf(out, cap, "%s", a); /* equal as printed: no range to show */
    else snprintf(out, cap, "%s (%s – %s)", a, b, c);
}

/* tern.reuse.tier of a measurement, "-" when the server sent none. */
static void reuse_tier(const struct tern_replay_meas *m, char *out, size_t cap) {
    snprintf(out, cap, "-");
    if (!m->done || !m->reuse_json) return;
    json_t *j = json_loads(m->reuse_json, 0, NULL);
    const char *t = json_string_value(json_object_get(j, "tier"));
    if (t) snprintf(out, cap, "%s", t);
    json_decref(j);
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

enum tern_status tern_replay_write_results(const struct tern_replay_run *r, const struct tern_replay_summary *s,
                                           FILE *f) {
    const struct tern_replay_config *cfg = r->cfg;
    const struct tern_replay_transcript *tr = cfg->tr;
    int na = cfg->n_arms;
    const char *L0 = cfg->arms[0].label, *L1 = na > 1 ? cfg->arms[1].label : "";
    char a[128], b[128], c[128], d[128], e[128];
    size_t n_kind[TERN_TURN_KIND_COUNT] = {0};
    for (size_t t = 0; t < s->n_turns; t++) n_kind[s->turns[t].kind]++;
    char *kinds = tern_transcript_kinds_string(tr, s->n_turns);

    fprintf(f, "# tern replay: %s\n\n", base_name(tr->path));

    /* The headline: the flat line. */
    if (s->first_rewrite >= 0) {
        const struct tern_turn_summary *t0 = &s->turns[s->first_rewrite], *t1 = &s->turns[s->last_rewrite];
        double grow = t0->prompt_tokens > 0 && t1->prompt_tokens > 0 ? (double)t1->prompt_tokens / (double)t0->prompt_tokens : NAN;
        fprintf(f, "**The flat line.** ");
        for (int arm = 0; arm < na; arm++) {
            fs(a, sizeof a, t1->ttft[arm]), fs(b, sizeof b, t0->ttft[arm]);
            fx(c, sizeof c, t0->ttft[arm] > 0 ? t1->ttft[arm] / t0->ttft[arm] : NAN);
            fprintf(f, "Arm `%s`: TTFT on the last rewrite turn (turn %ld) is %s s against %s s on the first (turn %ld): "
                       "%s. ",
                    cfg->arms[arm].label, s->last_rewrite, a, b, s->first_rewrite, c);
        }
        ftok(a, sizeof a, (double)t0->prompt_tokens), ftok(b, sizeof b, (double)t1->prompt_tokens);
        fx(c, sizeof c, grow);
        fprintf(f, "Meanwhile the prompt grew from %s to %s tokens (%s).\n\n", a, b, c);
        fprintf(f, "Tokens read per turn after the first (prompt − cached, median over repetitions):");
        for (int arm = 0; arm < na; arm++) {
            double rd[4096];
            size_t m = 0;
            for (size_t t = 1; t < s->n_turns && m < 4096; t++) rd[m++] = s->turns[t].read[arm];
            double lo, hi;
            tern_stats_range(rd, m, &lo, &hi);
            ftok(a, sizeof a, lo), ftok(b, sizeof b, hi);
            fprintf(f, "%s `%s` %s – %s", arm ? ";" : "", cfg->arms[arm].label, a, b);
        }
        fprintf(f, ".\n\n");
    }
    if (s->n_vs_ext > 0) {
        fprintf(f, "**No class of turn left behind.** A rewrite turn's TTFT against the mean of the extension turns "
                   "just before and after it (same context length):");
        for (int arm = 0; arm < na; arm++) {
            fx(a, sizeof a, s->vs_ext_lo[arm]), fx(b, sizeof b, s->vs_ext_hi[arm]);
            fprintf(f, "%s `%s` %s – %s", arm ? ";" : "", cfg->arms[arm].label, a, b);
        }
        fprintf(f, " (per turn:");
        bool first = true;
        for (size_t t = 0; t < s->n_turns; t++) {
            const struct tern_turn_summary *ts = &s->turns[t];
            if (ts->kind != TERN_TURN_REWRITE || !isfinite(ts->vs_ext[0])) continue;
            fprintf(f, "%s turn %zu", first ? "" : ";", t);
            first = false;
            for (int arm = 0; arm < na; arm++) {
                fx(a, sizeof a, ts->vs_ext[arm]);
                fprintf(f, "%s %s", arm ? " /" : "", a);
            }
        }
        fprintf(f, ").\n\n");
    }
    if (r->isolation_leak)
        fprintf(f, "> **Warning:** repetition %d's cold turn reported %ld cached tokens: the server kept state from an "
                   "earlier repetition (isolation `%s`), so later repetitions are not independent. Use `--model` "
                   "(isolation by restart) or a server that honours `cache_salt`.\n\n",
                r->leak_rep + 1, r->leak_cached, tern_replay_isolate_name(cfg->isolate));

    fprintf(f, "![TTFT per turn](ttft.svg)\n\n## Setup\n\n| | |\n|---|---|\n");
    fprintf(f, "| transcript | `%s`: turns 0–%zu of %zu, kinds `%s` (%zu cold, %zu extension, %zu rewrite)%s |\n",
            tr->path, s->n_turns - 1, tr->n_turns, kinds ? kinds : "?", n_kind[0], n_kind[1], n_kind[2],
            cfg->trust_kinds ? "; kinds as labeled (--trust-kinds)" : "; kinds checked against the messages");
    for (int arm = 0; arm < na; arm++)
        fprintf(f, "| arm `%s` | %s%s%s%s |\n", cfg->arms[arm].label, cfg->arms[arm].settings,
                r->model_id[arm][0] ? "; serves model `" : "", r->model_id[arm], r->model_id[arm][0] ? "`" : "");
    if (cfg->model_path) {
        struct stat st;
        double mib = stat(cfg->model_path, &st) == 0 ? (double)st.st_size / (1024.0 * 1024.0) : NAN;
        fprintf(f, "| model | `%s` (%.1f MiB) |\n", cfg->model_path, mib);
    } else if (cfg->arms[0].managed) {
        fprintf(f, "| model | the built-in demo model of `tern serve` (random weights: timing is real, the output "
                   "is noise) |\n");
    }
    fprintf(f, "| protocol | %d repetition%s, each replaying the whole conversation; within a repetition every turn "
               "goes to %s before the next turn, the arm that goes first alternating by turn and repetition; "
               "isolation between repetitions: %s%s |\n",
            cfg->n_reps, cfg->n_reps == 1 ? "" : "s", na == 2 ? "both arms" : "the arm",
            cfg->isolate == TERN_ISOLATE_RESTART ? "fresh server processes for every repetition"
            : cfg->isolate == TERN_ISOLATE_SALT  ? "a per-repetition `cache_salt` in every request"
                                                 : "none (later repetitions may reuse earlier ones)",
            cfg->warmup ? "; one short unrelated warm-up request per server before each repetition" : "");
    bool paused = cfg->arms[0].managed && na == 2 && !cfg->no_pause;
    if (paused)
        fprintf(f, "| taking turns | the other arm's server is paused (SIGSTOP) during each request and the quiet "
                   "time after it: a server computes only during its own requests and its own quiet time |\n");
    fprintf(f, "| think time | %.3g s of quiet after a turn whose reply made tool calls, %.3g s after a final answer "
               "(no request is sent meanwhile; %s) |\n",
            cfg->gap_s, cfg->user_gap_s,
            paused ? "only the server that just answered may compute" : "idle work of a server may overlap the other arm");
    const struct tern_replay_meas *m0 = NULL;
    for (size_t i = 0; i < r->n_meas && !m0; i++)
        if (r->meas[i].done) m0 = &r->meas[i];
    fprintf(f, "| requests | ");
    if (cfg->max_tokens >= 0) fprintf(f, "max_tokens overridden to %ld; ", cfg->max_tokens);
    else fprintf(f, "max_tokens as recorded (%ld on turn 0); ", tr->turns[0].max_tokens);
    if (m0 && m0->edits.n) {
        fprintf(f, "body edits, top-level keys only and the same in every arm:");
        for (size_t i = 0; i < m0->edits.n; i++) fprintf(f, "%s %s", i ? ";" : "", m0->edits.what[i]);
        fprintf(f, " (messages and tools keep their recorded bytes) |\n");
    } else {
        fprintf(f, "bodies sent exactly as recorded |\n");
    }
    size_t n_finish = 0, n_tool = 0;
    for (size_t i = 0; i < r->n_meas; i++) {
        if (!r->meas[i].done) continue;
        n_finish += !strcmp(r->meas[i].ttft_at, "finish");
        n_tool += !strcmp(r->meas[i].ttft_at, "tool_call");
    }
    fprintf(f, "| TTFT | from the request's start (before connecting) to the first SSE chunk carrying output: "
               "content or reasoning_content text");
    if (n_tool) fprintf(f, ", or a tool-call delta (%zu requests)", n_tool);
    if (n_finish) fprintf(f, "; %zu requests produced no output at all and are clocked at their finish chunk", n_finish);
    fprintf(f, " |\n");
    char machine[512];
    tern_replay_machine(machine, sizeof machine);
    fprintf(f, "| machine | %s%s |\n", machine, cfg->arms[0].managed ? "" : " (the client's; the servers may be elsewhere)");
    fprintf(f, "| started | %s (run %s) |\n", r->started_at, r->run_id);
    if (cfg->command_line) fprintf(f, "| command | `%s` |\n", cfg->command_line);

    fprintf(f, "\n## By turn class\n\nMedians and ranges of the per-turn medians; the ratio is %s.\n\n",
            na == 2 ? "per turn, then summarized" : "absent with one arm");
    if (na == 2)
        fprintf(f, "| class | turns | `%s` TTFT (s) | `%s` TTFT (s) | %s/%s |\n|---|---:|---:|---:|---:|\n", L0, L1, L1,
                L0);
    else
        fprintf(f, "| class | turns | `%s` TTFT (s) |\n|---|---:|---:|\n", L0);
    for (int k = 0; k < TERN_TURN_KIND_COUNT; k++) {
        const struct tern_class_summary *cs = &s->classes[k];
        if (!cs->n_turns) continue;
        range_str(a, sizeof a, cs->med[0], cs->lo[0], cs->hi[0], false);
        fprintf(f, "| %s | %zu | %s", tern_turn_kind_name((enum tern_turn_kind)k), cs->n_turns, a);
        if (na == 2) {
            range_str(b, sizeof b, cs->med[1], cs->lo[1], cs->hi[1], false);
            range_str(c, sizeof c, cs->ratio_med, cs->ratio_lo, cs->ratio_hi, true);
            fprintf(f, " | %s | %s", b, c);
        }
        fprintf(f, " |\n");
    }
    fs(a, sizeof a, s->sum_ttft[0]);
    fprintf(f, "| **sum of per-turn medians** | %zu | %s", s->n_turns, a);
    if (na == 2) {
        fs(b, sizeof b, s->sum_ttft[1]);
        fx(c, sizeof c, s->sum_ttft[0] > 0 ? s->sum_ttft[1] / s->sum_ttft[0] : NAN);
        fprintf(f, " | %s | %s", b, c);
    }
    fprintf(f, " |\n");

    fprintf(f, "\n## Per turn\n\nMedians over repetitions, with the TTFT range over repetitions in parentheses "
               "where they differ; read = prompt − cached tokens.\n\n");
    /* The servers' own account of each decision (tern.reuse.tier), when they give one. */
    bool tiers = false;
    for (size_t i = 0; i < r->n_meas && !tiers; i++) tiers = r->meas[i].done && r->meas[i].reuse_json;
    fprintf(f, "| turn | kind | prompt | `%s` cached | `%s` read | `%s` TTFT (s) |", L0, L0, L0);
    if (na == 2) fprintf(f, " `%s` cached | `%s` read | `%s` TTFT (s) | %s/%s |", L1, L1, L1, L1, L0);
    if (tiers) fprintf(f, " reuse tier |");
    fprintf(f, " output |\n|---:|---|---:|---:|---:|---:|%s%s---|\n", na == 2 ? "---:|---:|---:|---:|" : "",
            tiers ? "---|" : "");
    for (size_t t = 0; t < s->n_turns; t++) {
        const struct tern_turn_summary *ts = &s->turns[t];
        const struct tern_replay_turn *tu = &tr->turns[t];
        ftok(a, sizeof a, (double)ts->prompt_tokens);
        fprintf(f, "| %zu | %s%s%s | %s |", t, tern_turn_kind_name(ts->kind), tu->rewrite_by[0] ? " by " : "",
                tu->rewrite_by, a);
        for (int arm = 0; arm < na; arm++) {
            ftok(b, sizeof b, ts->cached[arm]);
            ftok(c, sizeof c, ts->read[arm]);
            range_str(d, sizeof d, ts->ttft[arm], ts->ttft_lo[arm], ts->ttft_hi[arm], false);
            fprintf(f, " %s | %s | %s |", b, c, d);
        }
        if (na == 2) {
            fx(e, sizeof e, ts->ratio);
            fprintf(f, " %s |", e);
        }
        if (tiers) {
            fprintf(f, " ");
            for (int arm = 0; arm < na; arm++) {
                char tier[32];
                reuse_tier(tern_replay_meas_at(r, 0, t, arm), tier, sizeof tier);
                fprintf(f, "%s%s", arm ? " / " : "", tier);
            }
            fprintf(f, " |");
        }
        fprintf(f, " %s |\n", ts->output_identical ? "identical" : "**differs**");
    }
    fs(a, sizeof a, s->sum_ttft[0]);
    fprintf(f, "| **sum** | | | | | %s |", a);
    if (na == 2) {
        fs(b, sizeof b, s->sum_ttft[1]);
        fx(c, sizeof c, s->sum_ttft[0] > 0 ? s->sum_ttft[1] / s->sum_ttft[0] : NAN);
        fprintf(f, " | | %s | %s |", b, c);
    }
    fprintf(f, "%s |\n", tiers ? " |" : "");
    if (tiers)
        fprintf(f, "\nThe reuse tier is the server's `tern.reuse.tier` in repetition 1 (arms in the order above); "
                   "turns.jsonl has the whole object for every request.\n");

    fprintf(f, "\n## Wall clock\n\n");
    fs(a, sizeof a, r->wall_s), fs(b, sizeof b, r->wall_total_s);
    fprintf(f, "- The replay took %s s from the first request to the last response (%s s including server start-up, "
               "warm-ups and think time).\n", a, b);
    for (int arm = 0; arm < na; arm++) {
        double per_rep[TERN_REPLAY_MAX_REPS];
        for (int rep = 0; rep < cfg->n_reps; rep++) {
            double sum = 0;
            for (size_t t = 0; t < s->n_turns; t++) {
                const struct tern_replay_meas *m = tern_replay_meas_at(r, rep, t, arm);
                if (m->done && isfinite(m->total_s)) sum += m->total_s;
            }
            per_rep[rep] = sum;
        }
        fs(a, sizeof a, tern_stats_median(per_rep, (size_t)cfg->n_reps));
        fs(b, sizeof b, s->sum_total[arm]);
        fprintf(f, "- Arm `%s`: the conversation spent %s s waiting on the server (sum of request times per "
                   "repetition, median over repetitions; sum of per-turn medians %s s).\n",
                cfg->arms[arm].label, a, b);
    }

    fprintf(f, "\n## Integrity\n\n");
    fprintf(f, "- Request bytes: every turn's body was %s (its xxh3 is in turns.jsonl as `body_xxh3`).\n",
            na == 2 ? "byte-identical in both arms, checked on what was sent" : "sent as built (one arm)");
    fprintf(f, "- History rewritten: %zu rewrite turn%s (", n_kind[2], n_kind[2] == 1 ? "" : "s");
    bool first = true;
    for (size_t t = 0; t < s->n_turns; t++) {
        if (s->turns[t].kind != TERN_TURN_REWRITE) continue;
        fprintf(f, "%s%zu%s%s", first ? "turns " : ", ", t, tr->turns[t].rewrite_by[0] ? " by " : "",
                tr->turns[t].rewrite_by);
        first = false;
    }
    fprintf(f, "); a replay without one is refused.\n");
    fprintf(f, "- Usage: present on every response, 0 ≤ cached ≤ prompt, and prompt tokens equal across arms and "
               "repetitions on every turn.\n");
    fprintf(f, "- Output: byte-identical across %s on %zu of %zu turns", na == 2 ? "arms and repetitions" : "repetitions",
            s->n_identical, s->n_turns);
    if (s->n_identical < s->n_turns) {
        fprintf(f, " (differs on turn");
        size_t shown = 0;
        for (size_t t = 0; t < s->n_turns && shown < 40; t++)
            if (!s->turns[t].output_identical) fprintf(f, "%s %zu", shown++ ? "," : "", t);
        fprintf(f, "; greedy decoding with resumed = cold should make them equal)");
    }
    fprintf(f, ".\n");
    fprintf(f, "- Repetitions independent: %s.\n",
            r->isolation_leak ? "**no** (see the warning above)"
            : cfg->n_reps == 1 ? "one repetition"
            : cfg->isolate == TERN_ISOLATE_NONE ? "not enforced (isolation none)"
                                                : "yes (no later cold turn reused anything)");
    free(kinds);
    return ferror(f) ? tern_errorf(TERN_ERR_IO, "writing RESULTS.md failed") : TERN_OK;
}

enum tern_status tern_replay_write_outputs(const struct tern_replay_run *r, const struct tern_replay_summary *s) {
    const struct tern_replay_config *cfg = r->cfg;
    char path[4096];
    snprintf(path, sizeof path, "%s/RESULTS.md", cfg->out_dir);
    FILE *f = fopen(path, "w");
    if (!f) return tern_errorf(TERN_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    enum tern_status st = tern_replay_write_results(r, s, f);
    if (fclose(f) != 0 && st == TERN_OK) st = tern_errorf(TERN_ERR_IO, "writing '%s' failed", path);
    if (st != TERN_OK) return st;

    size_t n = s->n_turns;
    enum tern_turn_kind *kinds = tern_calloc(n, sizeof *kinds);
    double *prompt = tern_calloc(n, sizeof *prompt), *read = tern_calloc(n, sizeof *read);
    double *y = tern_calloc(n * 3 * TERN_REPLAY_MAX_ARMS, sizeof *y);
    if (!kinds || !prompt || !read || !y) {
        free(kinds), free(prompt), free(read), free(y);
        return tern_errorf(TERN_ERR_NOMEM, "out of memory for the plot");
    }
    struct tern_plot p = {.n = n, .kinds = kinds, .prompt_tokens = prompt, .read_tokens = read,
                          .n_series = cfg->n_arms};
    for (size_t t = 0; t < n; t++) {
        kinds[t] = s->turns[t].kind;
        prompt[t] = s->turns[t].prompt_tokens >= 0 ? (double)s->turns[t].prompt_tokens : NAN;
        read[t] = s->turns[t].read[0];
    }
    char read_label[64], title[256], sub[1400], machine[512];
    snprintf(read_label, sizeof read_label, "tokens read by %s", cfg->arms[0].label);
    p.read_label = read_label;
    for (int a = 0; a < cfg->n_arms; a++) {
        double *ya = y + (size_t)a * 3 * n;
        for (size_t t = 0; t < n; t++) {
            ya[t] = s->turns[t].ttft[a];
            ya[n + t] = s->turns[t].ttft_lo[a];
            ya[2 * n + t] = s->turns[t].ttft_hi[a];
        }
        p.series[a] = (struct tern_plot_series){.label = cfg->arms[a].label, .y = ya, .y_lo = ya + n, .y_hi = ya + 2 * n};
    }
    snprintf(title, sizeof title, "Time to first token per turn: %s", base_name(cfg->tr->path));
    machine_short(machine, sizeof machine);
    snprintf(sub, sizeof sub, "%s%s%s, median of %d repetition%s (bars: range), %s",
             cfg->model_path ? base_name(cfg->model_path) : r->model_id[0][0] ? r->model_id[0] : "demo model",
             ", ",
             cfg->n_arms == 2 ? "two arms" : "one arm", cfg->n_reps, cfg->n_reps == 1 ? "" : "s", machine);
    p.title = title;
    p.subtitle = sub;
    struct tern_buf svg = TERN_BUF_INIT;
    st = tern_plot_svg(&p, &svg);
    free(kinds), free(prompt), free(read), free(y);
    if (st == TERN_OK) {
        snprintf(path, sizeof path, "%s/ttft.svg", cfg->out_dir);
        f = fopen(path, "w");
        if (!f) st = tern_errorf(TERN_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
        else {
            fwrite(svg.data, 1, svg.len, f);
            if (fclose(f) != 0) st = tern_errorf(TERN_ERR_IO, "writing '%s' failed", path);
        }
    }
    tern_buf_free(&svg);
    return st;
}
