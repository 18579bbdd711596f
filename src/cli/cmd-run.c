/* tern run: primes a prompt and generates text (or ids) with a model, in a session on the
 * CPU or (--device vulkan[:N] | auto) on a Vulkan device (tern_model_use_device). */
#include "cli/cli.h"
#include "cli/cmd-chat.h"

#include "model/mtp.h"
#include "server/spec.h"

#include "tokenizer/tokenizer.h"
#include "util/buf.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STOPS 16

static void usage(FILE *f) {
    fprintf(f,
            "usage: tern run --model FILE (--prompt TEXT | --ids \"ID ID ...\") [options]\n"
            "\n"
            "Primes the prompt and generates up to -n tokens, streaming the text to stdout.\n"
            "Prompt and decode speed go to stderr.\n"
            "\n"
            "  -m, --model FILE          the GGUF model\n"
            "  -p, --prompt TEXT         the prompt text (BOS as the model says; special-token\n"
            "                            text such as <|im_start|> is recognised)\n"
            "      --ids \"ID ...\"        the prompt as token ids (space or comma separated)\n"
            "  -n, --n-predict N         tokens to generate (default 128; 0 = prime only)\n"
            "      --temp T              temperature (default 0.8; 0 = greedy)\n"
            "      --top-k K             (default 40; 0 = off)\n"
            "      --top-p P             (default 0.95; 1 = off)\n"
            "      --min-p P             (default 0.05; 0 = off)\n"
            "      --repeat-penalty R    (default 1 = off)\n"
            "      --repeat-last-n N     penalty window (default 64; 0 = all tokens)\n"
            "      --presence-penalty P  (default 0)\n"
            "      --frequency-penalty P (default 0)\n"
            "      --seed S              sampling seed (default: from the clock)\n"
            "      --stop STR            stop when the text contains STR (repeatable)\n"
            "      --spec off|ngram|mtp  speculative decoding by prompt lookup or the model's MTP head\n"
            "                            (Qwen3.5 nextn; default off; the output is the same, docs/spec.md)\n"
            "      --spec-max N          tokens per draft, 1-32 (default 8)\n"
            "  -t, --threads N           compute threads (default: online cores)\n"
            "      --chunk N             prompt tokens per chunk (default 512)\n"
            "  -c, --ctx-size N          context size (default min(model context, 32768))\n"
            "      --kv-type f16|f32     KV cache type (default f16)\n"
            "      --no-mmap             read the weights into memory instead of mapping them\n"
            "      --mlock               pin the weights in memory\n"
            "      --print-ids           print the generated ids (one line) instead of text\n"
            "      --dump-logits FILE    write the prompt's logits, float32 [n_prompt][n_vocab]\n"
            "      --device D            cpu (default; or $TERN_DEVICE), vulkan (the first GPU, else\n"
            "                            device 0), vulkan:N (Vulkan device N, see tern devices) or\n"
            "                            auto (a discrete or integrated GPU when there is one and the\n"
            "                            model runs on it, else the CPU; says which and why). On a\n"
            "                            GPU the whole forward pass runs there (--spec too)\n"
            "      --chat                an interactive chat instead (see tern chat --help)\n"
            "  -h, --help                this help\n");
}

enum {
    OPT_IDS = 256, OPT_TEMP, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REP, OPT_REPN, OPT_PRES, OPT_FREQ, OPT_SEED,
    OPT_STOP, OPT_CHUNK, OPT_KV, OPT_NOMMAP, OPT_MLOCK, OPT_PRINTIDS, OPT_DUMP, OPT_SPEC, OPT_SPECMAX,
    OPT_ORACLE, OPT_DEVICE,
};

static const struct option long_opts[] = {
    {"model", required_argument, 0, 'm'},
    {"prompt", required_argument, 0, 'p'},
    {"ids", required_argument, 0, OPT_IDS},
    {"n-predict", required_argument, 0, 'n'},
    {"temp", required_argument, 0, OPT_TEMP},
    {"top-k", required_argument, 0, OPT_TOPK},
    {"top-p", required_argument, 0, OPT_TOPP},
    {"min-p", required_argument, 0, OPT_MINP},
    {"repeat-penalty", required_argument, 0, OPT_REP},
    {"repeat-last-n", required_argument, 0, OPT_REPN},
    {"presence-penalty", required_argument, 0, OPT_PRES},
    {"frequency-penalty", required_argument, 0, OPT_FREQ},
    {"seed", required_argument, 0, OPT_SEED},
    {"stop", required_argument, 0, OPT_STOP},
    {"threads", required_argument, 0, 't'},
    {"chunk", required_argument, 0, OPT_CHUNK},
    {"ctx-size", required_argument, 0, 'c'},
    {"kv-type", required_argument, 0, OPT_KV},
    {"no-mmap", no_argument, 0, OPT_NOMMAP},
    {"mlock", no_argument, 0, OPT_MLOCK},
    {"print-ids", no_argument, 0, OPT_PRINTIDS},
    {"dump-logits", required_argument, 0, OPT_DUMP},
    {"spec", required_argument, 0, OPT_SPEC},
    {"spec-max", required_argument, 0, OPT_SPECMAX},
    {"spec-oracle", required_argument, 0, OPT_ORACLE},
    {"device", required_argument, 0, OPT_DEVICE}, /* tests: "PCT:ID ID ..." drafts from known tokens */
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* Parses "1 2 3" or "1,2,3". */
static bool parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return false;
    while (*s) {
        while (*s == ' ' || *s == ',' || *s == '\t' || *s == '\n') s++;
        if (!*s) break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < INT32_MIN || v > INT32_MAX) return false;
        if (*n == cap) {
            int32_t *p = tern_reallocarray(*ids, cap *= 2, sizeof **ids);
            if (!p) return false;
            *ids = p;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = end;
        if (*s && *s != ' ' && *s != ',' && *s != '\t' && *s != '\n') return false;
    }
    return true;
}

struct progress {
    size_t total;
    uint32_t chunk;
    double t0;
};

static int on_progress(void *user, size_t done, size_t total) {
    struct progress *p = user;
    if (total > p->chunk) {
        const double dt = tern_now_s() - p->t0;
        fprintf(stderr, "\rprompt: %zu/%zu tokens (%.1f t/s)", done, total, dt > 0 ? (double)done / dt : 0.0);
        if (done == total) fputc('\n', stderr);
        fflush(stderr);
    }
    return 0;
}

/* Text output with stop strings: text that could still become a stop string is held
 * back until it cannot. Returns true when a stop string was found (the text before it
 * is printed). */
struct out_text {
    struct tern_buf text;
    size_t printed;
    const char *stops[MAX_STOPS];
    int n_stops;
};

static bool emit(struct out_text *o, bool final) {
    const char *t = o->text.data ? o->text.data : "";
    size_t len = o->text.len, cut = len;
    bool stop = false;
    for (int i = 0; i < o->n_stops; i++) {
        const char *hit = memmem(t, len, o->stops[i], strlen(o->stops[i]));
        if (hit && (size_t)(hit - t) < cut) cut = (size_t)(hit - t), stop = true;
    }
    size_t safe = cut;
    if (!stop && !final) {
        /* hold back a suffix that is a proper prefix of a stop string */
        for (int i = 0; i < o->n_stops; i++) {
            const size_t sl = strlen(o->stops[i]);
            for (size_t k = sl - 1; k > 0; k--)
                if (k <= len && !memcmp(t + len - k, o->stops[i], k)) {
                    if (len - k < safe) safe = len - k;
                    break;
                }
        }
    }
    if (safe > o->printed) {
        fwrite(t + o->printed, 1, safe - o->printed, stdout);
        fflush(stdout);
        o->printed = safe;
    }
    return stop;
}

static int write_logits(const char *path, const float *l, size_t n, uint32_t nv) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(l, sizeof(float) * nv, n, f) != n || fclose(f) != 0)
        return cli_fail("run", "cannot write %s: %s", path, strerror(errno));
    return 0;
}

static int run_main(int argc, char **argv) {
    /* --chat: the interactive chat (cmd-chat.c) takes the same options */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--chat")) return cli_chat_main(argc, argv);
    const char *model = NULL, *prompt = NULL, *ids_str = NULL, *dump = NULL;
    long n_predict = 128, threads = 0, chunk = 512, ctx = 0;
    struct tern_sampler_params sp;
    tern_sampler_params_default(&sp);
    bool seed_set = false, no_mmap = false, mlock = false, print_ids = false;
    enum tern_kv_type kv = TERN_KV_F16;
    struct out_text out = {0};
    struct spec_params spp = {.mode = SPEC_OFF};
    struct spec_oracle oracle = {0};
    int32_t *oracle_ids = NULL;
    const char *oracle_str = NULL;
    const char *device = getenv("TERN_DEVICE");
    long lv;
    double dv;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:t:c:h", long_opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': prompt = optarg; break;
        case OPT_IDS: ids_str = optarg; break;
        case 'n':
            if (!cli_parse_int(optarg, 0, 1 << 24, &n_predict)) return cli_usage_error("run", "bad -n '%s'", optarg);
            break;
        case OPT_TEMP:
            if (!cli_parse_float(optarg, 0, 100, &dv)) return cli_usage_error("run", "bad --temp '%s' (0..100)", optarg);
            sp.temperature = (float)dv;
            break;
        case OPT_TOPK:
            if (!cli_parse_int(optarg, 0, 1 << 24, &lv)) return cli_usage_error("run", "bad --top-k '%s'", optarg);
            sp.top_k = (int32_t)lv;
            break;
        case OPT_TOPP:
            if (!cli_parse_float(optarg, 0, 1, &dv)) return cli_usage_error("run", "bad --top-p '%s' (0..1)", optarg);
            sp.top_p = (float)dv;
            break;
        case OPT_MINP:
            if (!cli_parse_float(optarg, 0, 1, &dv)) return cli_usage_error("run", "bad --min-p '%s' (0..1)", optarg);
            sp.min_p = (float)dv;
            break;
        case OPT_REP:
            if (!cli_parse_float(optarg, 0.01, 100, &dv))
                return cli_usage_error("run", "bad --repeat-penalty '%s' (0.01..100)", optarg);
            sp.repeat_penalty = (float)dv;
            break;
        case OPT_REPN:
            if (!cli_parse_int(optarg, 0, 1 << 24, &lv)) return cli_usage_error("run", "bad --repeat-last-n '%s'", optarg);
            sp.repeat_last_n = (int32_t)lv;
            break;
        case OPT_PRES:
            if (!cli_parse_float(optarg, -100, 100, &dv))
                return cli_usage_error("run", "bad --presence-penalty '%s'", optarg);
            sp.presence_penalty = (float)dv;
            break;
        case OPT_FREQ:
            if (!cli_parse_float(optarg, -100, 100, &dv))
                return cli_usage_error("run", "bad --frequency-penalty '%s'", optarg);
            sp.frequency_penalty = (float)dv;
            break;
        case OPT_SEED: {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (!*optarg || *end || errno || optarg[0] == '-') return cli_usage_error("run", "bad --seed '%s'", optarg);
            sp.seed = v;
            seed_set = true;
            break;
        }
        case OPT_STOP:
            if (!*optarg) return cli_usage_error("run", "--stop needs a non-empty string");
            if (out.n_stops == MAX_STOPS) return cli_usage_error("run", "at most %d --stop strings", MAX_STOPS);
            out.stops[out.n_stops++] = optarg;
            break;
        case 't':
            if (!cli_parse_int(optarg, 1, 1024, &threads)) return cli_usage_error("run", "bad --threads '%s' (1..1024)", optarg);
            break;
        case OPT_CHUNK:
            if (!cli_parse_int(optarg, 1, 1 << 16, &chunk)) return cli_usage_error("run", "bad --chunk '%s' (1..65536)", optarg);
            break;
        case 'c':
            if (!cli_parse_int(optarg, 1, 1 << 24, &ctx)) return cli_usage_error("run", "bad --ctx-size '%s'", optarg);
            break;
        case OPT_KV:
            if (!strcmp(optarg, "f16")) kv = TERN_KV_F16;
            else if (!strcmp(optarg, "f32")) kv = TERN_KV_F32;
            else return cli_usage_error("run", "bad --kv-type '%s' (f16 or f32)", optarg);
            break;
        case OPT_NOMMAP: no_mmap = true; break;
        case OPT_MLOCK: mlock = true; break;
        case OPT_PRINTIDS: print_ids = true; break;
        case OPT_DUMP: dump = optarg; break;
        case OPT_SPEC:
            if (!spec_mode_parse(optarg, &spp.mode)) return cli_usage_error("run", "bad --spec '%s' (off, ngram or mtp)", optarg);
            break;
        case OPT_SPECMAX:
            if (!cli_parse_int(optarg, 1, SPEC_MAX_DRAFT, &lv))
                return cli_usage_error("run", "bad --spec-max '%s' (1..%d)", optarg, SPEC_MAX_DRAFT);
            spp.max = (uint32_t)lv;
            break;
        case OPT_ORACLE: oracle_str = optarg; break;
        case OPT_DEVICE: device = optarg; break;
        case 'h': usage(stdout); return 0;
        default: return cli_usage_error("run", "unknown option");
        }
    }
    if (optind < argc) return cli_usage_error("run", "unexpected argument '%s'", argv[optind]);
    if (!model) return cli_usage_error("run", "--model is required");
    if (!prompt == !ids_str) return cli_usage_error("run", "give exactly one of --prompt and --ids");
    if (!seed_set) sp.seed = (uint64_t)time(NULL) ^ tern_now_ns();
    if (oracle_str) {
        /* "PCT:IDS": the oracle proposes IDS, each replaced by a wrong token with PCT % */
        char *end;
        errno = 0;
        long pct = strtol(oracle_str, &end, 10);
        if (end == oracle_str || *end != ':' || errno || pct < 0 || pct > 100 ||
            !parse_ids(end + 1, &oracle_ids, &oracle.n)) {
            free(oracle_ids);
            return cli_usage_error("run", "bad --spec-oracle '%s' (PCT:ID ID ...)", oracle_str);
        }
        oracle.toks = oracle_ids;
        oracle.reject_pct = (uint32_t)pct;
        oracle.seed = sp.seed;
        spp.mode = SPEC_ORACLE;
        spp.oracle = &oracle;
    }

    int dev = -1;
    bool dev_auto = false;
    if ((c = cli_device_resolve("run", device, &dev, &dev_auto))) {
        free(oracle_ids);
        return c;
    }

    int rc = 1;
    struct tern_model *m = NULL;
    struct tern_session *s = NULL;
    struct tern_sampler *smp = NULL;
    struct tern_detok *dt = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0, cap = 0;
    float *logits_all = NULL;
    struct spec_dec sd = {0};
    float *prompt_hidden = NULL; /* --spec mtp: (n_ids, n_embd) while the prompt is read */

    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = model;
    mp.no_mmap = no_mmap;
    mp.mlock = mlock;
    mp.n_threads = (int)threads;
    const double t_load = tern_now_s();
    if (tern_model_load(&mp, &m)) {
        cli_fail("run", "%s", tern_last_error());
        goto done;
    }
    const struct tern_model_info *info = tern_model_info(m);
    const struct tern_tokenizer *tok = tern_model_tokenizer(m);
    if (ids_str) {
        if (!parse_ids(ids_str, &ids, &n_ids)) {
            rc = cli_usage_error("run", "bad --ids '%s' (token ids separated by spaces or commas)", ids_str);
            goto done;
        }
    } else {
        if (!tok) {
            cli_fail("run", "%s has no tokenizer: use --ids", model);
            goto done;
        }
        if (tern_tokenize(tok, prompt, strlen(prompt), TERN_TOK_ADD_SPECIAL | TERN_TOK_PARSE_SPECIAL, &ids, &n_ids,
                          &cap)) {
            cli_fail("run", "%s", tern_last_error());
            goto done;
        }
    }
    if (n_ids == 0) {
        cli_fail("run", "the prompt has no tokens");
        goto done;
    }
    /* --device: the model's sessions on the device (tern_model_use_device), through the same
     * decoder as on the CPU; one session's whole context must fit there at start, as for
     * the server */
    struct tern_session_params sep;
    tern_session_params_default(&sep);
    sep.n_ctx = (uint32_t)ctx;
    sep.kv_type = kv;
    sep.n_chunk = (uint32_t)chunk;
    if (cli_device_use("run", m, &dev, dev_auto, (uint32_t)chunk, &sep)) goto done;
    if (tern_session_new(m, &sep, &s) || tern_sampler_new(&sp, info->n_vocab, &smp)) {
        cli_fail("run", "%s", tern_last_error());
        goto done;
    }
    if (tok && !print_ids && tern_detok_new(tok, 0, &dt)) {
        cli_fail("run", "%s", tern_last_error());
        goto done;
    }
    if (dump) {
        logits_all = tern_calloc(n_ids, (size_t)info->n_vocab * sizeof(float));
        if (!logits_all) {
            cli_fail("run", "out of memory for %zu x %u logits", n_ids, info->n_vocab);
            goto done;
        }
    }
    if (strcmp(tern_model_device(m), "cpu"))
        fprintf(stderr, "model: %s (%s), %u layers, sessions on %s, loaded in %.2f s\n", info->name, info->arch,
                info->n_layer, tern_model_device(m), tern_now_s() - t_load);
    else
        fprintf(stderr, "model: %s (%s), %u layers, %d threads, %s weights, loaded in %.2f s\n", info->name,
                info->arch, info->n_layer, info->n_threads, no_mmap ? "read" : "mapped", tern_now_s() - t_load);

    /* prime */
    struct progress pr = {n_ids, (uint32_t)chunk, tern_now_s()};
    struct tern_eval_opts eo = {.logits_all = logits_all, .progress = on_progress, .user = &pr};
    const double t0 = tern_now_s();
    /* --spec mtp: the prompt's hidden states, so that the MTP head reads the prompt too */
    if (spp.mode == SPEC_MTP && info->has_mtp) {
        prompt_hidden = tern_malloc(n_ids * info->n_embd * sizeof(float));
        if (!prompt_hidden) {
            cli_fail("run", "out of memory for the prompt's %zu hidden states", n_ids);
            goto done;
        }
        tern_session_capture_hidden(s, prompt_hidden, 0);
        spp.prompt_hidden = prompt_hidden;
    }
    const enum tern_status pst = tern_session_eval(s, ids, n_ids, &eo);
    tern_session_capture_hidden(s, NULL, 0);
    if (pst) {
        cli_fail("run", "%s", tern_last_error());
        goto done;
    }
    const double t_prompt = tern_now_s() - t0;
    if (dump && write_logits(dump, logits_all, n_ids, info->n_vocab)) goto done;

    /* generate (through the speculative decoder: with --spec off it samples and
     * evaluates one token at a time) */
    const enum tern_status sst = spec_dec_init(&sd, s, smp, &spp, NULL);
    free(prompt_hidden);
    prompt_hidden = NULL;
    if (sst) {
        cli_fail("run", "%s", tern_last_error());
        goto done;
    }
    const double t1 = tern_now_s();
    long n_gen = 0, n_eval = 0;
    bool stopped = false;
    while (n_gen < n_predict && !stopped) {
        const int32_t id = spec_next(&sd);
        n_gen++;
        if (tok && tern_token_is_eog(tok, id)) break;
        if (print_ids) printf("%s%d", n_gen > 1 ? " " : "", id);
        if (dt) {
            if (tern_detok_push(dt, id, &out.text)) {
                cli_fail("run", "%s", tern_last_error());
                goto done;
            }
            stopped = emit(&out, false);
        }
        if (stopped || n_gen == n_predict) break;
        if (spec_n_past(&sd) >= tern_session_n_ctx(s)) {
            fprintf(stderr, "\nrun: the context of %u tokens is full\n", tern_session_n_ctx(s));
            break;
        }
        if (spec_accept(&sd, id, (size_t)(n_predict - n_gen))) {
            cli_fail("run", "%s", tern_last_error());
            goto done;
        }
        n_eval++;
    }
    if (spec_finish(&sd)) {
        cli_fail("run", "%s", tern_last_error());
        goto done;
    }
    if (dt && !stopped) {
        tern_detok_flush(dt, &out.text);
        emit(&out, true);
    }
    if (print_ids || dt) putchar('\n');
    const double t_gen = tern_now_s() - t1;
    char spec_s[96] = "";
    if (sd.mode != SPEC_OFF)
        snprintf(spec_s, sizeof spec_s, "; spec %s: drafted=%llu accepted=%llu", spec_mode_name(sd.mode),
                 (unsigned long long)sd.st.drafted, (unsigned long long)sd.st.accepted);
    fprintf(stderr, "prompt: %zu tokens in %.3f s (%.2f t/s); decode: %ld tokens in %.3f s (%.2f t/s)%s\n", n_ids,
            t_prompt, t_prompt > 0 ? (double)n_ids / t_prompt : 0.0, n_eval, t_gen,
            t_gen > 0 ? (double)n_eval / t_gen : 0.0, spec_s);
    if (getenv("TERN_STATE_HASH") && strcmp(getenv("TERN_STATE_HASH"), "0"))
        fprintf(stderr, "state-hash n_past=%u total=%016llx\n", tern_session_n_past(s),
                (unsigned long long)tern_session_hash(s));
    rc = 0;
done:
    spec_dec_free(&sd);
    free(oracle_ids);
    tern_buf_free(&out.text);
    tern_detok_free(dt);
    tern_sampler_free(smp);
    tern_session_free(s);
    tern_model_free(m);
    free(ids);
    free(prompt_hidden);
    free(logits_all);
    return rc;
}

TERN_COMMAND("run", "prime a prompt and generate text with a model", run_main)
