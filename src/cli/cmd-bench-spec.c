/* tern bench spec: decode speed with and without speculative decoding, side by side in
 * one run (plain and each configuration take turns, repetition by repetition), greedy,
 * with a check that every speculative run produced the plain run's tokens. Sources:
 * prompt lookup (the acceptance it reaches on this prompt) and the oracle (the plain
 * run's own tokens, each made wrong with a given probability: the upper bound the
 * verification machinery allows, and how it degrades). For hybrid models the oracle
 * runs with both ways of bringing the recurrent state back to the accepted position
 * (the state trail recorded during the verify chunk, and a checkpoint before the chunk +
 * re-reading the accepted tokens) and says what that cost (docs/spec.md). */
#include "cli/cli.h"
#include "cli/opts.h"

#include "model/mtp.h"
#include "server/spec.h"
#include "tokenizer/tokenizer.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_CFG 32
#define MAX_REP 32

static const struct cli_spec spec_cli = {
    "bench spec",
    "usage: tern bench spec --model FILE [--prompt TEXT] [options]\n"
    "\n"
    "Greedy decode tokens/s, plain vs speculative, measured side by side (plain and each\n"
    "configuration alternate in every repetition; medians), with a check that every run\n"
    "produced the plain run's tokens.\n"
    "\n",
    NULL,
};

static bool parse_list(const char *s, long lo, long hi, long *out, int *n, int cap) {
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < lo || v > hi || *n == cap) return false;
        out[(*n)++] = v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return false;
    }
    return *n > 0;
}

struct cfg {
    struct spec_params p;
    struct spec_oracle o;
    double tps[MAX_REP];
    struct spec_stats st; /* of the last repetition */
    bool identical;
};

/* One greedy run from a fork of the primed base session; returns decode seconds. */
static double run_once(struct tern_session *base, const struct spec_params *p, size_t n_gen, int32_t *toks,
                       struct spec_stats *st) {
    struct tern_session *s = NULL;
    struct tern_sampler *smp = NULL;
    struct tern_sampler_params sp;
    tern_sampler_params_default(&sp);
    sp.temperature = 0.0f;
    if (tern_session_fork(base, tern_session_n_past(base), NULL, &s) ||
        tern_sampler_new(&sp, tern_model_info(tern_session_model(base))->n_vocab, &smp)) {
        cli_fail("bench spec", "%s", tern_last_error());
        exit(1);
    }
    struct spec_dec d;
    if (spec_dec_init(&d, s, smp, p, NULL)) {
        cli_fail("bench spec", "%s", tern_last_error());
        exit(1);
    }
    const double t0 = tern_now_s();
    for (size_t i = 0; i < n_gen; i++) {
        toks[i] = spec_next(&d);
        if (i + 1 == n_gen) break;
        if (spec_accept(&d, toks[i], n_gen - i - 1)) {
            cli_fail("bench spec", "%s", tern_last_error());
            exit(1);
        }
    }
    if (spec_finish(&d)) {
        cli_fail("bench spec", "%s", tern_last_error());
        exit(1);
    }
    const double dt = tern_now_s() - t0;
    *st = d.st;
    spec_dec_free(&d);
    tern_sampler_free(smp);
    tern_session_free(s);
    return dt;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n) {
    double t[MAX_REP];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void machine_line(void) {
    char model[128] = "?";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                if (c) snprintf(model, sizeof model, "%s", c + 2);
                model[strcspn(model, "\n")] = 0;
                break;
            }
        fclose(f);
    }
    double load = -1;
    f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &load) != 1) load = -1;
        fclose(f);
    }
    printf("machine: %s, %ld online cpus, load %.1f at start\n", model, sysconf(_SC_NPROCESSORS_ONLN), load);
}

/* --lens and --reject: up to 8 integers, comma separated */
struct int_list {
    long v[8];
    int n;
};
static bool parse_lens(const char *v, void *dst) {
    struct int_list *l = dst;
    return parse_list(v, 1, SPEC_MAX_DRAFT, l->v, &l->n, 8);
}
static bool parse_rejects(const char *v, void *dst) {
    struct int_list *l = dst;
    return parse_list(v, 0, 100, l->v, &l->n, 8);
}

static const char *const sources[] = {"ngram", "oracle", "mtp", "both", NULL};

static int bench_spec_main(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL;
    long n_prompt = 32, n_gen = 64, reps = 3, threads = 0;
    struct int_list lens_l = {{2, 4, 8}, 3}, rej_l = {{0, 50}, 2};
    int src = 3; /* both */
    const struct cli_opt opts[] = {
        CLI_STR1("m|model", &model, "FILE", "the GGUF model"),
        CLI_STR1("prompt", &prompt, "TEXT", "the prompt (default: -p random token ids)"),
        CLI_INT("p|n-prompt", &n_prompt, 1, 1 << 16, "N", "random prompt tokens when no --prompt (default 32)"),
        CLI_INT("n|n-gen", &n_gen, 2, 1 << 16, "N", "tokens generated per run (default 64)"),
        CLI_INT("r|repetitions", &reps, 1, MAX_REP, "N", "(default 3)"),
        CLI_INT("t|threads", &threads, 1, 1024, "N", "compute threads (default: online cores)"),
        CLI_CHOICE("source", &src, sources, "S",
                   "ngram, oracle, mtp (the model's MTP head, trail and refeed on a hybrid) or both (ngram and "
                   "oracle; default)"),
        CLI_FN("lens", &lens_l, parse_lens, "1-32, comma separated", "L,L,...", "draft lengths (default 2,4,8)"),
        CLI_FN("reject", &rej_l, parse_rejects, "0-100, comma separated", "P,P,...",
               "oracle: percent of drafted tokens made wrong (default 0,50)"),
        CLI_END,
    };
    int c = cli_parse(&spec_cli, opts, argc, argv, NULL);
    if (c >= 0) return c;
    const char *source = sources[src];
    const long *lens = lens_l.v, *rejects = rej_l.v;
    const int n_lens = lens_l.n, n_rej = rej_l.n;
    if (!model) return cli_usage_error("bench spec", "--model is required");

    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = model;
    mp.n_threads = (int)threads;
    struct tern_model *m = NULL;
    if (tern_model_load(&mp, &m)) return cli_fail("bench spec", "%s", tern_last_error());
    const struct tern_model_info *info = tern_model_info(m);
    int32_t *ids = NULL;
    size_t n_ids = 0, cap = 0;
    if (prompt) {
        const struct tern_tokenizer *tok = tern_model_tokenizer(m);
        if (!tok || tern_tokenize(tok, prompt, strlen(prompt), TERN_TOK_ADD_SPECIAL | TERN_TOK_PARSE_SPECIAL, &ids,
                                  &n_ids, &cap) || !n_ids) {
            tern_model_free(m);
            return cli_fail("bench spec", "cannot tokenize the prompt: %s", tern_last_error());
        }
    } else {
        n_ids = (size_t)n_prompt;
        ids = tern_malloc(n_ids * sizeof *ids);
        uint64_t x = 12345;
        for (size_t i = 0; i < n_ids; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((x >> 33) % info->n_vocab);
        }
    }
    struct tern_session_params sep;
    tern_session_params_default(&sep);
    sep.n_ctx = (uint32_t)(n_ids + (size_t)n_gen + SPEC_MAX_DRAFT + 8);
    struct tern_session *base = NULL;
    /* --source mtp: the prompt's hidden states, which the MTP head reads first */
    float *prompt_hidden = NULL;
    if (!strcmp(source, "mtp") && info->has_mtp && !(prompt_hidden = tern_malloc(n_ids * info->n_embd * sizeof(float)))) {
        free(ids);
        tern_model_free(m);
        return cli_fail("bench spec", "out of memory for the prompt's hidden states");
    }
    enum tern_status pst = tern_session_new(m, &sep, &base);
    if (!pst) {
        tern_session_capture_hidden(base, prompt_hidden, 0);
        pst = tern_session_eval(base, ids, n_ids, NULL);
        tern_session_capture_hidden(base, NULL, 0);
    }
    if (pst) {
        free(ids);
        free(prompt_hidden);
        tern_session_free(base);
        tern_model_free(m);
        return cli_fail("bench spec", "%s", tern_last_error());
    }

    machine_line();
    printf("model: %s (%s%s), %u threads, prompt %zu tokens, %ld generated per run, %ld repetitions\n", info->name,
           info->arch, info->hybrid ? ", hybrid" : "", info->n_threads, n_ids, n_gen, reps);

    int32_t *plain_toks = tern_malloc((size_t)n_gen * sizeof(int32_t));
    int32_t *toks = tern_malloc((size_t)n_gen * sizeof(int32_t));
    struct spec_stats st;
    const struct spec_params off = {.mode = SPEC_OFF};
    run_once(base, &off, (size_t)n_gen, plain_toks, &st); /* warm-up, and the reference tokens */

    static struct cfg cfgs[MAX_CFG];
    int n_cfg = 0;
    const bool mtp = !strcmp(source, "mtp");
    const bool ngram = !mtp && strcmp(source, "oracle") != 0, oracle = !mtp && strcmp(source, "ngram") != 0;
    if (mtp && !info->has_mtp) {
        free(plain_toks);
        free(toks);
        free(ids);
        tern_session_free(base);
        tern_model_free(m);
        return cli_fail("bench spec", "--source mtp: the model has no MTP head (tern mkmodel --mtp 1 writes one)");
    }
    for (int refeed = 0; mtp && refeed <= (int)info->hybrid; refeed++)
        for (int il = 0; il < n_lens && n_cfg < MAX_CFG; il++)
            cfgs[n_cfg++] = (struct cfg){.p = {.mode = SPEC_MTP, .max = (uint32_t)lens[il], .refeed = refeed,
                                               .prompt_hidden = prompt_hidden},
                                         .identical = true};
    for (int il = 0; il < n_lens && ngram && n_cfg < MAX_CFG; il++)
        cfgs[n_cfg++] = (struct cfg){.p = {.mode = SPEC_NGRAM, .max = (uint32_t)lens[il]}, .identical = true};
    for (int ir = 0; ir < n_rej && oracle; ir++)
        for (int refeed = 0; refeed <= (int)info->hybrid; refeed++)
            for (int il = 0; il < n_lens && n_cfg < MAX_CFG; il++) {
                struct cfg *k = &cfgs[n_cfg++];
                *k = (struct cfg){.p = {.mode = SPEC_ORACLE, .max = (uint32_t)lens[il], .refeed = refeed},
                                  .identical = true};
                k->o = (struct spec_oracle){.toks = plain_toks, .n = (size_t)n_gen,
                                            .reject_pct = (uint32_t)rejects[ir], .seed = 1};
            }
    for (int i = 0; i < n_cfg; i++) cfgs[i].p.oracle = &cfgs[i].o;

    double plain_tps[MAX_REP];
    for (int r = 0; r < reps; r++) {
        plain_tps[r] = (double)(n_gen - 1) / run_once(base, &off, (size_t)n_gen, toks, &st);
        for (int i = 0; i < n_cfg; i++) {
            struct cfg *k = &cfgs[i];
            k->tps[r] = (double)(n_gen - 1) / run_once(base, &k->p, (size_t)n_gen, toks, &k->st);
            if (memcmp(toks, plain_toks, (size_t)n_gen * sizeof *toks)) k->identical = false;
        }
    }

    const double pm = median(plain_tps, (int)reps);
    printf("\n%-30s %9s %7s %8s %8s %7s %7s %s\n", "configuration", "tok/s", "x plain", "drafted", "accepted", "accept",
           "tok/rnd", info->hybrid ? "state restore: % of decode time (tokens re-read)" : "");
    printf("%-30s %9.2f %7.2f\n", "plain", pm, 1.0);
    for (int i = 0; i < n_cfg; i++) {
        const struct cfg *k = &cfgs[i];
        char name[48];
        if (k->p.mode == SPEC_NGRAM) snprintf(name, sizeof name, "ngram max %u", k->p.max);
        else if (k->p.mode == SPEC_MTP)
            snprintf(name, sizeof name, "mtp max %u%s", k->p.max, !info->hybrid ? "" : k->p.refeed ? " refeed" : " trail");
        else snprintf(name, sizeof name, "oracle %u%% wrong max %u%s", k->o.reject_pct, k->p.max,
                      !info->hybrid ? "" : k->p.refeed ? " refeed" : " trail");
        const double km = median(k->tps, (int)reps);
        const double t_dec = (double)(n_gen - 1) / k->tps[reps - 1];
        char extra[128] = "";
        if (info->hybrid)
            snprintf(extra, sizeof extra, "%5.1f%% (%llu)", 100 * (k->st.t_ckpt + k->st.t_settle) / t_dec,
                     (unsigned long long)k->st.refed);
        if (k->p.mode == SPEC_MTP) {
            const size_t used = strlen(extra);
            snprintf(extra + used, sizeof extra - used, "%sMTP head %.1f%%", used ? "; " : "",
                     100 * k->st.t_draft / t_dec);
        }
        printf("%-30s %9.2f %7.2f %8llu %8llu %6.1f%% %7.2f %s%s\n", name, km, km / pm,
               (unsigned long long)k->st.drafted, (unsigned long long)k->st.accepted,
               k->st.drafted ? 100.0 * (double)k->st.accepted / (double)k->st.drafted : 0.0,
               k->st.rounds ? (double)(k->st.accepted + k->st.rounds) / (double)k->st.rounds : 0.0, extra,
               k->identical ? "" : "  OUTPUT DIFFERS FROM PLAIN");
    }
    bool all_same = true;
    for (int i = 0; i < n_cfg; i++) all_same = all_same && cfgs[i].identical;
    printf("\ntokens identical to the plain run in every repetition: %s\n", all_same ? "yes" : "NO");
    free(plain_toks);
    free(toks);
    free(ids);
    free(prompt_hidden);
    tern_session_free(base);
    tern_model_free(m);
    return all_same ? 0 : 1;
}

TERN_BENCH("spec", "speculative decoding: tokens/s plain vs prompt lookup / oracle drafts", bench_spec_main)
