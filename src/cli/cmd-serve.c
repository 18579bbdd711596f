/* tern serve: the OpenAI-compatible HTTP server (docs/SERVING.md). */
#include "cli/cli.h"

#include "cache/cache.h"
#include "server/chat.h"
#include "gguf/gguf.h"
#include "server/demo.h"
#include "server/engine.h"
#include "server/predict.h"
#include "server/server.h"
#include "util/testhook.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/notify.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_API_KEYS 64

static void usage(FILE *out) {
    fprintf(out,
            "usage: tern serve [--model FILE] [options]\n"
            "\n"
            "Serves a GGUF model over HTTP with the OpenAI API (/v1/chat/completions,\n"
            "/v1/completions, /v1/models) plus /health, /metrics, /tokenize, /detokenize.\n"
            "Without --model it serves a small built-in demo model whose output is noise.\n"
            "\n"
            "options:\n"
            "  --model FILE            GGUF model to serve\n"
            "  --host ADDR             address to listen on (default 127.0.0.1)\n"
            "  --port N                port (default 8080; 0 picks a free one)\n"
            "  --threads N             compute threads (default: all cores)\n"
            "  --ctx-size N            context length per session (default min(model, 32768))\n"
            "  --api-key KEY           require 'Authorization: Bearer KEY' (repeatable)\n"
            "  --parallel N            requests running at once, batched a step at a time (default: as many\n"
            "                          full contexts as --cache-ram holds, 4 to 8)\n"
            "  --batch-tokens N        rows per engine step: a token of every decoding request, then prompt\n"
            "                          chunks of the others (default: --chunk)\n"
            "  --queue N               requests that may wait for a place beyond --parallel (default 16;\n"
            "                          more -> 429)\n"
            "  --max-body BYTES        largest request body (default 16777216; more -> 413)\n"
            "  --max-tokens N          most tokens generated per request, whatever max_tokens asks\n"
            "                          (default 4096; finish_reason \"length\"; 0 = until the context is full)\n"
            "  --max-connections N     open connections in all (default 4096)\n"
            "  --max-conn-per-ip N     open connections per client address (default 128; 0 = no cap)\n"
            "  --header-timeout S      a request header must be complete S seconds after the connection\n"
            "                          opens (default 10; then 408 and close)\n"
            "  --idle-timeout S        close a keep-alive connection idle for S seconds, and a stalled\n"
            "                          upload (default 30)\n"
            "  --body-timeout S        a request body must be whole S seconds after its header, plus a\n"
            "                          second per 4096 bytes received (default 30; then 408 and close)\n"
            "  --chat-template FILE    Jinja chat template to use instead of the model's\n"
            "  --parse-special-in-content  let control-token text in messages (<|im_start|> ...) become\n"
            "                          control tokens, as other engines do (default: only the template's\n"
            "                          own text makes control tokens; the request's is plain text)\n"
            "  --chunk N               tokens per priming chunk (default 512)\n"
            "  --kv-type f16|f32       KV cache type (default f16)\n"
            "  --cache-ram MiB         memory budget of parked sessions + checkpoints (default 4096)\n"
            "  --cache-vram MiB        with --device: checkpoints kept in device memory, up to MiB of them;\n"
            "                          the oldest spill to host memory (default 0: all in host memory)\n"
            "  --cache-dir DIR         disk tier: parked conversations survive restarts and are shared by\n"
            "                          replicas pointing at the same directory (default: off)\n"
            "  --cache-disk GiB        byte budget of --cache-dir, LRU (default 16; fractions allowed)\n"
            "  --cache-peer-wait MS|auto  how long a request waits for a replica's write in flight of\n"
            "                          the turn it continues (default auto: while that costs less than\n"
            "                          reading the tokens it saves, at least 100 ms, at most 30 s)\n"
            "  --cache-ram-per-key MiB an API key's fair share of --cache-ram: when the budget is full, a\n"
            "                          key over its share is evicted first (default: --cache-ram / the\n"
            "                          number of --api-key; 0 = none)\n"
            "  --prompt-cache N        checkpoints per session (default 8; 0 = none)\n"
            "  --prompt-cache-every N  periodic checkpoint spacing in tokens (default 4096)\n"
            "  --turn-token ID         turn-start token id (default: <|im_start|> if the vocabulary has it)\n"
            "  --predict off|user|all  predictive priming in idle time: the next prompt's prefix after a\n"
            "                          new user message (user), and after tool results too (all; default)\n"
            "  --predict-chunk N       tokens per idle priming step; a request waits at most one (default 128)\n"
            "  --spec off|ngram|mtp    speculative decoding: draft by prompt lookup (ngram) or the model's\n"
            "                          MTP head (mtp: Qwen3.5 nextn) and verify the draft in one forward;\n"
            "                          output unchanged (default off; docs/spec.md)\n"
            "  --spec-max N            tokens per draft, 1-32 (default 8)\n"
            "  --spec-trail MiB        hybrid models: the most a request's speculative state trail may\n"
            "                          take (one recurrent state per draft token); drafts shrink to fit,\n"
            "                          and below two states a checkpoint + re-read is used (default 128)\n"
            "  --device D              where sessions run: cpu (default; or $TERN_DEVICE), vulkan (the\n"
            "                          first GPU, else device 0), vulkan:N (see tern devices), auto (a\n"
            "                          GPU when there is one and the model runs on it; says which and\n"
            "                          why). On a device every session keeps its KV cache (pages of 256\n"
            "                          positions, taken as it grows; a whole --ctx-size must fit at\n"
            "                          start) and state there, --spec included\n"
            "  --no-mmap / --mmap      read the weights into memory / map the file (default: read when\n"
            "                          the file takes at most half of the available memory, else map)\n"
            "  --mlock                 pin the weights in memory\n"
            "  -h, --help              this help\n"
            "\n"
            "environment: TERN_AFFINITY=0 (no fingerprint nomination), TERN_REUSE_POOL=0 (live session only),\n"
            "TERN_CKPT_REREAD=1 (re-read instead of restoring checkpoints), TERN_STATE_HASH=1 (log state\n"
            "hashes after each request), TERN_PREDICT=0 (no predictive priming), TERN_LOG=debug|info|warn|error.\n");
}

static bool env_flag(const char *name, bool def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    return strcmp(v, "0") != 0 && strcasecmp(v, "false") != 0 && strcasecmp(v, "off") != 0;
}

/* A test hook's on/off (util/testhook.h): off when unset or not built. */
static bool test_hook_flag(const char *name) {
    const char *v = tern_test_hook(name);
    return v && *v && strcmp(v, "0") != 0 && strcasecmp(v, "false") != 0 && strcasecmp(v, "off") != 0;
}

static char *read_text_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct tern_buf b = TERN_BUF_INIT;
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) {
        if (tern_buf_append(&b, tmp, n)) {
            fclose(f);
            tern_buf_free(&b);
            return NULL;
        }
    }
    fclose(f);
    if (!b.data && tern_buf_puts(&b, "")) return NULL;
    return tern_buf_detach(&b, len);
}

/* After the first signal: a second one exits at once, whatever the stop is waiting for
 * (a flush, a request that will not end). Only async-signal-safe calls. */
static void *second_signal(void *arg) {
    int sig = 0;
    if (sigwait((const sigset_t *)arg, &sig) == 0) {
        static const char msg[] = "tern serve: a second signal: exiting now\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(128 + sig);
    }
    return NULL;
}

/* How long a stop waits for the step in progress before it leaves it (cmd_serve). */
#define SERVE_STOP_GRACE_MS 500u

static int cmd_serve(int argc, char **argv) {
    enum { O_HOST = 256, O_PORT, O_THREADS, O_CTX, O_KEY, O_QUEUE, O_BODY, O_TMPL, O_CHUNK, O_KV, O_RAM, O_PC,
           O_PCE, O_TURN, O_NOMMAP, O_MMAP, O_MLOCK, O_MODEL, O_PREDICT, O_PCHUNK, O_CDIR, O_CDISK, O_MAXTOK, O_MAXCONN,
           O_PERIP, O_HDRTO, O_IDLETO, O_BODYTO, O_RAMKEY, O_SPEC, O_SPECMAX, O_PARALLEL, O_BATCHTOK, O_PSPECIAL,
           O_DEVICE, O_VRAM, O_PEERWAIT, O_SPECTRAIL };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},     {"host", required_argument, 0, O_HOST},
        {"port", required_argument, 0, O_PORT},       {"threads", required_argument, 0, O_THREADS},
        {"ctx-size", required_argument, 0, O_CTX},    {"api-key", required_argument, 0, O_KEY},
        {"queue", required_argument, 0, O_QUEUE},     {"max-body", required_argument, 0, O_BODY},
        {"chat-template", required_argument, 0, O_TMPL}, {"chunk", required_argument, 0, O_CHUNK},
        {"kv-type", required_argument, 0, O_KV},      {"cache-ram", required_argument, 0, O_RAM},
        {"prompt-cache", required_argument, 0, O_PC}, {"prompt-cache-every", required_argument, 0, O_PCE},
        {"turn-token", required_argument, 0, O_TURN}, {"no-mmap", no_argument, 0, O_NOMMAP}, {"mmap", no_argument, 0, O_MMAP},
        {"mlock", no_argument, 0, O_MLOCK},           {"help", no_argument, 0, 'h'},
        {"predict", required_argument, 0, O_PREDICT}, {"predict-chunk", required_argument, 0, O_PCHUNK},
        {"cache-dir", required_argument, 0, O_CDIR},  {"cache-disk", required_argument, 0, O_CDISK},
        {"max-tokens", required_argument, 0, O_MAXTOK}, {"max-connections", required_argument, 0, O_MAXCONN},
        {"max-conn-per-ip", required_argument, 0, O_PERIP}, {"header-timeout", required_argument, 0, O_HDRTO},
        {"idle-timeout", required_argument, 0, O_IDLETO},
        {"body-timeout", required_argument, 0, O_BODYTO}, {"cache-ram-per-key", required_argument, 0, O_RAMKEY},
        {"spec", required_argument, 0, O_SPEC},       {"spec-max", required_argument, 0, O_SPECMAX},
        {"parallel", required_argument, 0, O_PARALLEL}, {"batch-tokens", required_argument, 0, O_BATCHTOK},
        {"parse-special-in-content", no_argument, 0, O_PSPECIAL},
        {"device", required_argument, 0, O_DEVICE},
        {"cache-vram", required_argument, 0, O_VRAM},
        {"cache-peer-wait", required_argument, 0, O_PEERWAIT},
        {"spec-trail", required_argument, 0, O_SPECTRAIL},
        {0, 0, 0, 0},
    };
    const char *model_path = NULL, *tmpl_path = NULL;
    const char *keys[MAX_API_KEYS];
    size_t n_keys = 0;
    struct srv_params sp;
    srv_params_default(&sp);
    struct tern_model_params mp;
    int mmap_mode = -1; /* -1: read when it fits (gguf_read_fits_memory), 0: read, 1: map */
    tern_model_params_default(&mp);
    struct cache_params cp;
    cache_params_default(&cp);
    enum predict_mode predict = PREDICT_ALL;
    uint32_t predict_chunk = 0;
    uint32_t max_tokens = 4096;
    long long ram_per_key = -1; /* -1: the default, a fair share */
    enum spec_mode spec = SPEC_OFF;
    uint32_t spec_max = 0;
    size_t spec_trail = 0;
    uint32_t parallel = 0, batch_tokens = 0;
    bool parse_special_in_content = false;
    const char *device = getenv("TERN_DEVICE");
    size_t vram_bytes = 0; /* --cache-vram */
    long v;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'h': usage(stdout); return 0;
        case O_MODEL: model_path = optarg; break;
        case O_HOST: sp.host = optarg; break;
        case O_PORT:
            if (!cli_parse_int(optarg, 0, 65535, &v)) return cli_usage_error("serve", "--port '%s' is not 0-65535", optarg);
            sp.port = (int)v;
            break;
        case O_THREADS:
            if (!cli_parse_int(optarg, 1, 1024, &v)) return cli_usage_error("serve", "--threads '%s' is not 1-1024", optarg);
            mp.n_threads = (int)v;
            break;
        case O_CTX:
            if (!cli_parse_int(optarg, 16, 1 << 24, &v))
                return cli_usage_error("serve", "--ctx-size '%s' is not %d-%d", optarg, 16, 1 << 24);
            cp.session.n_ctx = (uint32_t)v;
            break;
        case O_KEY:
            if (n_keys == MAX_API_KEYS) return cli_usage_error("serve", "at most %d --api-key", MAX_API_KEYS);
            if (!*optarg) return cli_usage_error("serve", "--api-key must not be empty");
            keys[n_keys++] = optarg;
            break;
        case O_QUEUE:
            if (!cli_parse_int(optarg, 1, 100000, &v)) return cli_usage_error("serve", "--queue '%s' is not 1-100000", optarg);
            sp.n_queue = (uint32_t)v;
            break;
        case O_BODY:
            if (!cli_parse_int(optarg, 1024, 1L << 32, &v))
                return cli_usage_error("serve", "--max-body '%s' is not 1024-4294967296", optarg);
            sp.max_body = (size_t)v;
            break;
        case O_TMPL: tmpl_path = optarg; break;
        case O_CHUNK:
            if (!cli_parse_int(optarg, 1, 1 << 16, &v)) return cli_usage_error("serve", "--chunk '%s' is not 1-65536", optarg);
            cp.session.n_chunk = (uint32_t)v;
            break;
        case O_KV:
            if (!strcmp(optarg, "f16")) cp.session.kv_type = TERN_KV_F16;
            else if (!strcmp(optarg, "f32")) cp.session.kv_type = TERN_KV_F32;
            else return cli_usage_error("serve", "--kv-type '%s' is not f16 or f32", optarg);
            break;
        case O_RAM:
            if (!cli_parse_int(optarg, 0, 1L << 24, &v)) return cli_usage_error("serve", "--cache-ram '%s' is not 0-16777216 MiB", optarg);
            cp.ram_bytes = (size_t)v << 20;
            break;
        case O_VRAM:
            if (!cli_parse_int(optarg, 0, 1L << 24, &v))
                return cli_usage_error("serve", "--cache-vram '%s' is not 0-16777216 MiB", optarg);
            vram_bytes = (size_t)v << 20;
            break;
        case O_PEERWAIT:
            if (!strcmp(optarg, "auto")) {
                cp.peer_wait_ms = 0;
                break;
            }
            if (!cli_parse_int(optarg, 1, 30000, &v))
                return cli_usage_error("serve", "--cache-peer-wait '%s' is not auto or 1-30000 ms", optarg);
            cp.peer_wait_ms = (uint32_t)v;
            break;
        case O_CDIR:
            if (!*optarg) return cli_usage_error("serve", "--cache-dir needs a directory");
            cp.disk_dir = optarg;
            break;
        case O_CDISK: {
            char *end = NULL;
            errno = 0;
            double g = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(g > 0) || g > 1048576)
                return cli_usage_error("serve", "--cache-disk '%s' is not a size in GiB in (0, 1048576]", optarg);
            cp.disk_bytes = (uint64_t)(g * (double)(1ull << 30));
            if (cp.disk_bytes < 4096) cp.disk_bytes = 4096;
            break;
        }
        case O_PC:
            if (!cli_parse_int(optarg, 0, 1024, &v)) return cli_usage_error("serve", "--prompt-cache '%s' is not 0-1024", optarg);
            cp.max_ckpts = (uint32_t)v;
            break;
        case O_PCE:
            if (!cli_parse_int(optarg, 1, 1 << 24, &v))
                return cli_usage_error("serve", "--prompt-cache-every '%s' is not 1-16777216", optarg);
            cp.ckpt_every = (uint32_t)v;
            break;
        case O_TURN:
            if (!cli_parse_int(optarg, 0, INT32_MAX, &v)) return cli_usage_error("serve", "--turn-token '%s' is not a token id", optarg);
            cp.turn_token = (int32_t)v;
            break;
        case O_PREDICT:
            if (!predict_mode_parse(optarg, &predict))
                return cli_usage_error("serve", "--predict '%s' is not off, user or all", optarg);
            break;
        case O_PCHUNK:
            if (!cli_parse_int(optarg, 1, 1 << 16, &v))
                return cli_usage_error("serve", "--predict-chunk '%s' is not 1-65536", optarg);
            predict_chunk = (uint32_t)v;
            break;
        case O_PSPECIAL: parse_special_in_content = true; break;
        case O_MAXTOK:
            if (!cli_parse_int(optarg, 0, 1 << 24, &v))
                return cli_usage_error("serve", "--max-tokens '%s' is not 0-16777216", optarg);
            max_tokens = (uint32_t)v;
            break;
        case O_MAXCONN:
            if (!cli_parse_int(optarg, 4, 1 << 20, &v))
                return cli_usage_error("serve", "--max-connections '%s' is not 4-1048576", optarg);
            sp.max_connections = (uint32_t)v;
            break;
        case O_PERIP:
            if (!cli_parse_int(optarg, 0, 1 << 20, &v))
                return cli_usage_error("serve", "--max-conn-per-ip '%s' is not 0-1048576", optarg);
            sp.max_conn_per_ip = (uint32_t)v;
            break;
        case O_HDRTO:
            if (!cli_parse_int(optarg, 1, 3600, &v))
                return cli_usage_error("serve", "--header-timeout '%s' is not 1-3600 seconds", optarg);
            sp.header_timeout_s = (uint32_t)v;
            break;
        case O_IDLETO:
            if (!cli_parse_int(optarg, 1, 3600, &v))
                return cli_usage_error("serve", "--idle-timeout '%s' is not 1-3600 seconds", optarg);
            sp.idle_timeout_s = (uint32_t)v;
            break;
        case O_BODYTO:
            if (!cli_parse_int(optarg, 1, 3600, &v))
                return cli_usage_error("serve", "--body-timeout '%s' is not 1-3600 seconds", optarg);
            sp.body_timeout_s = (uint32_t)v;
            break;
        case O_RAMKEY:
            if (!cli_parse_int(optarg, 0, 1L << 24, &v))
                return cli_usage_error("serve", "--cache-ram-per-key '%s' is not 0-16777216 MiB", optarg);
            ram_per_key = (long long)v << 20;
            break;
        case O_SPEC:
            if (!spec_mode_parse(optarg, &spec)) return cli_usage_error("serve", "--spec '%s' is not off, ngram or mtp", optarg);
            break;
        case O_SPECTRAIL:
            if (!cli_parse_int(optarg, 1, 1 << 20, &v))
                return cli_usage_error("serve", "--spec-trail '%s' is not 1-1048576 MiB", optarg);
            spec_trail = (size_t)v << 20;
            break;
        case O_SPECMAX:
            if (!cli_parse_int(optarg, 1, SPEC_MAX_DRAFT, &v))
                return cli_usage_error("serve", "--spec-max '%s' is not 1-%d", optarg, SPEC_MAX_DRAFT);
            spec_max = (uint32_t)v;
            break;
        case O_PARALLEL:
            if (!cli_parse_int(optarg, 1, 256, &v)) return cli_usage_error("serve", "--parallel '%s' is not 1-256", optarg);
            parallel = (uint32_t)v;
            break;
        case O_BATCHTOK:
            if (!cli_parse_int(optarg, 1, 65536, &v))
                return cli_usage_error("serve", "--batch-tokens '%s' is not 1-65536", optarg);
            batch_tokens = (uint32_t)v;
            break;
        case O_NOMMAP: mmap_mode = 0; break;
        case O_MMAP: mmap_mode = 1; break;
        case O_MLOCK: mp.mlock = true; break;
        case O_DEVICE: device = optarg; break;
        default:
            return cli_usage_error("serve", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_usage_error("serve", "unexpected argument '%s'", argv[optind]);
    int dev = -1;
    bool dev_auto = false;
    if ((c = cli_device_resolve("serve", device, &dev, &dev_auto))) return c;
    cp.affinity = env_flag("TERN_AFFINITY", true);
    cp.pool = env_flag("TERN_REUSE_POOL", true);
    cp.ckpt_reread = env_flag("TERN_CKPT_REREAD", false);
    if (!tern_test_hooks_built() && getenv("TERN_TEST_FORCED_OUTPUT"))
        TERN_LOG_WARN("TERN_TEST_* ignored: this build has no test hooks (configure with -DTERN_TEST_HOOKS=ON)");
    sp.allow_forced_output = test_hook_flag("TERN_TEST_FORCED_OUTPUT");
    sp.forced_reply = sp.allow_forced_output ? tern_test_hook("TERN_TEST_FORCED_REPLY") : NULL;
    if (!env_flag("TERN_PREDICT", true)) predict = PREDICT_OFF;
    uint32_t predict_delay = 0;
    const char *pd = tern_test_hook("TERN_TEST_PREDICT_DELAY_MS");
    if (pd && *pd) {
        if (!cli_parse_int(pd, 0, 60000, &v))
            return cli_usage_error("serve", "TERN_TEST_PREDICT_DELAY_MS '%s' is not 0-60000", pd);
        predict_delay = (uint32_t)v;
    }
    uint32_t stop_delay_ms = 0; /* tests: wait this long after the first signal before stopping */
    const char *sd = tern_test_hook("TERN_TEST_STOP_DELAY_MS");
    if (sd && *sd) {
        if (!cli_parse_int(sd, 0, 60000, &v))
            return cli_usage_error("serve", "TERN_TEST_STOP_DELAY_MS '%s' is not 0-60000", sd);
        stop_delay_ms = (uint32_t)v;
    }
    sp.api_keys = keys;
    sp.n_api_keys = n_keys;
    cp.ram_per_tenant = ram_per_key >= 0 ? (size_t)ram_per_key : n_keys > 1 ? cp.ram_bytes / n_keys : 0;

    char *tmpl_src = NULL;
    size_t tmpl_len = 0;
    if (tmpl_path && !(tmpl_src = read_text_file(tmpl_path, &tmpl_len)))
        return cli_fail("serve", "cannot read --chat-template '%s'", tmpl_path);

    /* Signals go to the main thread only (sigwait below): block them before any
     * thread starts, so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP); /* stops gracefully too (it used to kill the process outright) */
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct srv_server *srv = NULL;
    if (srv_start(&sp, &srv)) {
        free(tmpl_src);
        return cli_fail("serve", "%s", tern_last_error());
    }
    TERN_LOG_INFO("listening on http://%s:%d (OpenAI API at /v1; /health says 503 until the model is loaded)",
                  sp.host, srv_port(srv));
    if (sp.allow_forced_output)
        TERN_LOG_WARN("TERN_TEST_FORCED_OUTPUT=1: requests may dictate the output (test-only; never in production)");

    char demo_path[4096];
    const char *demo_note = NULL;
    if (!model_path) {
        if (srv_demo_model(demo_path, sizeof demo_path)) {
            srv_stop(srv);
            free(tmpl_src);
            return cli_fail("serve", "cannot make the demo model: %s", tern_last_error());
        }
        model_path = demo_path;
        demo_note = srv_demo_note();
        TERN_LOG_WARN("%s", demo_note);
    }
    mp.path = model_path;
    uint64_t fsz, avail;
    const bool fits = gguf_read_fits_memory(model_path, &fsz, &avail);
    mp.no_mmap = mmap_mode == 0 || (mmap_mode < 0 && fits);
    TERN_LOG_INFO("weights: %s (%.2f GB file, %.2f GB available%s)", mp.no_mmap ? "read into memory" : "mapped",
                  (double)fsz / 1e9, (double)avail / 1e9, mmap_mode < 0 ? "; --mmap / --no-mmap to choose" : "");
    struct tern_model *model = NULL;
    struct srv_engine *eng = NULL;
    enum tern_status st = tern_model_load(&mp, &model);
    /* the device's chunk: --chunk, at most 1024 (its scratch holds one chunk's activations
     * and logits; the bits do not depend on it) */
    const uint32_t dev_chunk = !cp.session.n_chunk ? TERN_DEFAULT_CHUNK : TERN_MIN(cp.session.n_chunk, 1024u);
    if (!st && dev >= 0 && cli_device_use("serve", model, &dev, dev_auto, dev_chunk, &cp.session)) {
        srv_stop(srv);
        tern_model_free(model);
        free(tmpl_src);
        return 1;
    }
    if (!st && strcmp(tern_model_device(model), "cpu")) {
        tern_model_set_ckpt_vram(model, vram_bytes);
        if (vram_bytes)
            TERN_LOG_INFO("cache-vram: checkpoints kept in device memory on %s, up to %zu MiB; the oldest spill to "
                          "host memory (--cache-ram)", tern_model_device(model), vram_bytes >> 20);
        else if (tern_model_info(model)->hybrid)
            TERN_LOG_INFO("cache-vram: 0, checkpoints in host memory (--cache-vram MiB keeps them on the device)");
    } else if (!st && vram_bytes) {
        TERN_LOG_WARN("cache-vram: %zu MiB ignored: the sessions run on the CPU (--device)", vram_bytes >> 20);
    }
    /* the cache's role map: which turn headers the chat template writes (server/chat.h) */
    if (!st) st = chat_role_map(tern_model_tokenizer(model), &cp);
    if (!st) {
        struct srv_engine_params ep = {
            .model = model,
            .model_id = demo_note ? "tern-demo" : NULL,
            .chat_template = tmpl_src,
            .chat_template_len = tmpl_len,
            .cache = cp,
            .state_hash = env_flag("TERN_STATE_HASH", false),
            .predict = predict,
            .predict_chunk = predict_chunk,
            .predict_test_delay_ms = predict_delay,
            .max_tokens = max_tokens,
            .demo_note = demo_note,
            .spec = spec,
            .spec_max = spec_max,
            .spec_trail_bytes = spec_trail,
            .parallel = parallel,
            .batch_tokens = batch_tokens,
            .parse_special_in_content = parse_special_in_content,
        };
        st = srv_engine_new(&ep, &eng);
    }
    free(tmpl_src);
    if (st) {
        int rc = cli_fail("serve", "%s: %s", model_path, tern_last_error());
        srv_stop(srv);
        tern_model_free(model);
        return rc;
    }
    const struct tern_model_info *mi = tern_model_info(model);
    TERN_LOG_INFO("model %s loaded (%s, %u layers, %.1fM params%s; sessions on %s); ready on http://%s:%d/v1",
                  mi->name, mi->arch, mi->n_layer, (double)mi->n_params / 1e6, mi->hybrid ? ", hybrid" : "",
                  tern_model_device(model), sp.host, srv_port(srv));
    srv_set_backend(srv, srv_engine_backend(eng));
    char status[512];
    snprintf(status, sizeof status, "READY=1\nSTATUS=serving %s on http://%s:%d/v1", mi->name, sp.host,
             srv_port(srv));
    tern_sd_notify(status);

    int sig = 0;
    sigwait(&sigs, &sig);
    TERN_LOG_INFO("signal %d: stopping (in-flight requests are cancelled; a second signal exits at once)", sig);
    tern_sd_notify("STOPPING=1");
    static sigset_t again;
    again = sigs;
    pthread_t t2;
    if (!pthread_create(&t2, NULL, second_signal, &again)) pthread_detach(t2);
    if (stop_delay_ms) usleep(stop_delay_ms * 1000u); /* tests: a stop that takes its time */
    /* A step cannot stop midway (a recurrent state would be half updated): one that is
     * still running a moment after everything was cancelled (a long prefill or priming
     * chunk) is not waited for. Its sessions are leased, never parked or written; the
     * disk tier's queued writes are (the write-ahead of finished turns), and a file is
     * never corrupt for a write cut short (docs/SERVING.md, Disk tier). */
    if (!srv_stop_within(srv, SERVE_STOP_GRACE_MS)) {
        TERN_LOG_INFO("stopping: a step is still running after %u ms; finishing the disk writes and exiting "
                      "without it", SERVE_STOP_GRACE_MS);
        srv_engine_flush(eng);
        TERN_LOG_INFO("stopped");
        fflush(NULL);
        _exit(0);
    }
    srv_engine_free(eng);
    tern_model_free(model);
    return 0;
}

TERN_COMMAND("serve", "serve a model over HTTP (OpenAI-compatible API)", cmd_serve)
