/* tern run: primes a prompt and generates text (or ids) with a model, in a session on the
 * CPU or (--device vulkan[:N] | auto) on a Vulkan device (tern_model_use_device). */
#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/cmd-chat.h"

#include "model/mtp.h"
#include "server/spec.h"

#include "tokenizer/tokenizer.h"
#include "util/buf.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STOPS 16

static const struct cli_spec run_cli = {
    "run",
    "usage: tern run --model FILE (--prompt TEXT | --ids \"ID ID ...\") [options]\n"
    "\n"
    "Primes the prompt and generates up to -n tokens, streaming the text to stdout.\n"
    "Prompt and decode speed go to stderr.\n"
    "\n",
    NULL,
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
    int kv = TERN_KV_F16;
    struct out_text out = {0};
    struct cli_list stops = {out.stops, 0, MAX_STOPS};
    struct spec_params spp = {.mode = SPEC_OFF};
    struct spec_oracle oracle = {0};
    int32_t *oracle_ids = NULL;
    const char *oracle_str = NULL;
    const char *device = getenv("TERN_DEVICE");
    bool cpu_moe_all = false;
    const char *n_cpu_moe = NULL, *gpu_layers_s = NULL;
    bool chat = false;
    const struct cli_opt opts[] = {
        CLI_STR1("m|model", &model, "FILE", "the GGUF model"),
        CLI_STR("p|prompt", &prompt, "TEXT",
                "the prompt text (BOS as the model says; special-token text such as <|im_start|> is recognised)"),
        CLI_STR1("ids", &ids_str, "\"ID ...\"", "the prompt as token ids (space or comma separated)"),
        CLI_INT("n|n-predict", &n_predict, 0, 1 << 24, "N", "tokens to generate (default 128; 0 = prime only)"),
        CLI_SAMPLER_OPTS(&sp, &seed_set),
        CLI_LIST("stop", &stops, "STR", "stop when the text contains STR (repeatable)"),
        CLI_SPEC(&spp.mode, "speculative decoding by prompt lookup or the model's MTP head (Qwen3.5 nextn; "
                            "default off; the output is the same, docs/spec.md)"),
        CLI_INT("spec-max", &spp.max, 1, SPEC_MAX_DRAFT, "N", "tokens per draft, 1-32 (default 8)"),
        CLI_STR1("spec-oracle", &oracle_str, "PCT:IDS", NULL), /* tests: drafts from known tokens */
        CLI_INT("t|threads", &threads, 1, 1024, "N", "compute threads (default: online cores)"),
        CLI_INT("chunk", &chunk, 1, 1 << 16, "N", "prompt tokens per chunk (default 512)"),
        CLI_INT("c|ctx-size", &ctx, 1, 1 << 24, "N", "context size (default min(model context, 32768))"),
        CLI_CHOICE("kv-type", &kv, cli_kv_types, "f16|f32", "KV cache type (default f16)"),
        CLI_FLAG("no-mmap", &no_mmap, "read the weights into memory instead of mapping them"),
        CLI_FLAG("mlock", &mlock, "pin the weights in memory"),
        CLI_FLAG("print-ids", &print_ids, "print the generated ids (one line) instead of text"),
        CLI_STR1("dump-logits", &dump, "FILE", "write the prompt's logits, float32 [n_prompt][n_vocab]"),
        CLI_STR("device", &device, "D",
                "cpu (default; or $TERN_DEVICE), vulkan (the first GPU, else device 0), vulkan:N (Vulkan device N, "
                "see tern devices) or auto (a discrete or integrated GPU when there is one and the model runs on "
                "it, else the CPU; says which and why). On a GPU the whole forward pass runs there (--spec too)"),
        CLI_OFFLOAD_OPTS(&cpu_moe_all, &n_cpu_moe, &gpu_layers_s),
        CLI_FLAG("chat", &chat, "an interactive chat instead (see tern chat --help)"),
        CLI_END,
    };
    int c = cli_parse(&run_cli, opts, argc, argv, NULL);
    if (c >= 0) return c;
    out.n_stops = (int)stops.n;
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
    uint32_t cpu_moe = 0, gpu_layers = TERN_GPU_LAYERS_ALL;
    if ((c = cli_device_resolve("run", device, &dev, &dev_auto)) ||
        (c = cli_cpu_moe_parse("run", cpu_moe_all, n_cpu_moe, &cpu_moe)) ||
        (c = cli_gpu_layers_parse("run", gpu_layers_s, cpu_moe, &gpu_layers))) {
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
    sep.kv_type = (enum tern_kv_type)kv;
    sep.n_chunk = (uint32_t)chunk;
    if (cli_device_use("run", m, &dev, dev_auto, (uint32_t)chunk, &sep, cpu_moe, gpu_layers)) goto done;
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
