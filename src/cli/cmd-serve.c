/* tern serve: the OpenAI-compatible HTTP server (docs/SERVING.md). */
#include "cli/cli.h"
#include "cli/opts.h"

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
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_API_KEYS 64

static const struct cli_spec serve_cli = {
    "serve",
    "usage: tern serve [--model FILE] [options]\n"
    "\n"
    "Serves a GGUF model over HTTP with the OpenAI API (/v1/chat/completions,\n"
    "/v1/completions, /v1/models), Anthropic's /v1/messages and OpenAI's /v1/responses, plus\n"
    "/health, /metrics, /tokenize, /detokenize. Without --model it serves a small built-in demo\n"
    "model whose output is noise.\n"
    "\n",
    "environment: TERN_AFFINITY=0 (no fingerprint nomination), TERN_REUSE_POOL=0 (live session only),\n"
    "TERN_CKPT_REREAD=1 (re-read instead of restoring checkpoints), TERN_STATE_HASH=1 (log state\n"
    "hashes after each request), TERN_PREDICT=0 (no predictive priming), TERN_LOG=debug|info|warn|error.\n",
};

static bool parse_predict(const char *v, void *dst) { return predict_mode_parse(v, dst); }
/* --cache-peer-wait: auto (0) or 1-30000 ms */
static bool parse_peer_wait(const char *v, void *dst) {
    long ms;
    if (!strcmp(v, "auto")) ms = 0;
    else if (!cli_parse_int(v, 1, 30000, &ms)) return false;
    *(uint32_t *)dst = (uint32_t)ms;
    return true;
}

/* --cache-disk: GiB, fractions allowed, into bytes (at least 4096) */
static bool parse_gib(const char *v, void *dst) {
    double g;
    if (!cli_parse_float(v, 0, 1048576, &g) || !(g > 0)) return false;
    uint64_t bytes = (uint64_t)(g * (double)(1ull << 30));
    *(uint64_t *)dst = bytes < 4096 ? 4096 : bytes;
    return true;
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
    const char *model_path = NULL, *tmpl_path = NULL;
    const char *key_v[MAX_API_KEYS];
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
    bool cpu_moe_all = false;
    const char *n_cpu_moe = NULL, *gpu_layers_s = NULL;
    size_t vram_bytes = 0; /* --cache-vram */
    int kv = TERN_KV_F16;
    struct cli_list keys = {key_v, 0, MAX_API_KEYS};
    const struct cli_opt opts[] = {
        CLI_STR("model", &model_path, "FILE", "GGUF model to serve"),
        CLI_STR1("host", &sp.host, "ADDR", "address to listen on (default 127.0.0.1)"),
        CLI_INT("port", &sp.port, 0, 65535, "N", "port (default 8080; 0 picks a free one)"),
        CLI_INT("threads", &mp.n_threads, 1, 1024, "N", "compute threads (default: all cores)"),
        CLI_INT("ctx-size", &cp.session.n_ctx, 16, 1 << 24, "N", "context length per session (default min(model, 32768))"),
        CLI_LIST("api-key", &keys, "KEY", "require 'Authorization: Bearer KEY' (repeatable)"),
        CLI_INT("parallel", &parallel, 1, 256, "N",
                "requests running at once, batched a step at a time (default: as many full contexts as --cache-ram "
                "holds, 4 to 8)"),
        CLI_INT("batch-tokens", &batch_tokens, 1, 65536, "N",
                "rows per engine step: a token of every decoding request, then prompt chunks of the others "
                "(default: --chunk)"),
        CLI_INT("queue", &sp.n_queue, 1, 100000, "N",
                "requests that may wait for a place beyond --parallel (default 16; more -> 429)"),
        CLI_INT("max-body", &sp.max_body, 1024, 1L << 32, "BYTES", "largest request body (default 16777216; more -> 413)"),
        CLI_INT("max-tokens", &max_tokens, 0, 1 << 24, "N",
                "most tokens generated per request, whatever max_tokens asks (default 4096; finish_reason \"length\"; "
                "0 = until the context is full)"),
        CLI_INT("max-connections", &sp.max_connections, 4, 1 << 20, "N", "open connections in all (default 4096)"),
        CLI_INT("max-conn-per-ip", &sp.max_conn_per_ip, 0, 1 << 20, "N",
                "open connections per client address (default 128; 0 = no cap)"),
        CLI_INTU("header-timeout", &sp.header_timeout_s, 1, 3600, "seconds", "S",
                 "a request header must be complete S seconds after the connection opens (default 10; then 408 and "
                 "close)"),
        CLI_INTU("idle-timeout", &sp.idle_timeout_s, 1, 3600, "seconds", "S",
                 "close a keep-alive connection idle for S seconds, and a stalled upload (default 30)"),
        CLI_INTU("body-timeout", &sp.body_timeout_s, 1, 3600, "seconds", "S",
                 "a request body must be whole S seconds after its header, plus a second per 4096 bytes received "
                 "(default 30; then 408 and close)"),
        CLI_STR1("chat-template", &tmpl_path, "FILE", "Jinja chat template to use instead of the model's"),
        CLI_FLAG("parse-special-in-content", &parse_special_in_content,
                 "let control-token text in messages (<|im_start|> ...) become control tokens, as other engines do "
                 "(default: only the template's own text makes control tokens; the request's is plain text)"),
        CLI_INT("chunk", &cp.session.n_chunk, 1, 1 << 16, "N", "tokens per priming chunk (default 512)"),
        CLI_CHOICE("kv-type", &kv, cli_kv_types, "f16|f32", "KV cache type (default f16)"),
        CLI_MIB("cache-ram", &cp.ram_bytes, 0, 1 << 24, "MiB",
                "memory budget of parked sessions + checkpoints (default 4096)"),
        CLI_MIB("cache-vram", &vram_bytes, 0, 1 << 24, "MiB",
                "with --device: checkpoints kept in device memory, up to MiB of them; the oldest spill to host memory "
                "(default 0: all in host memory)"),
        CLI_STR1("cache-dir", &cp.disk_dir, "DIR",
                 "disk tier: parked conversations survive restarts and are shared by replicas pointing at the same "
                 "directory (default: off)"),
        CLI_FN("cache-disk", &cp.disk_bytes, parse_gib, "a size in GiB in (0, 1048576]", "GiB",
               "byte budget of --cache-dir, LRU (default 16; fractions allowed)"),
        CLI_FN("cache-peer-wait", &cp.peer_wait_ms, parse_peer_wait, "auto or 1-30000 ms", "MS|auto",
               "how long a request waits for a replica's write in flight of the turn it continues (default auto: "
               "while that costs less than reading the tokens it saves, at least 100 ms, at most 30 s)"),
        CLI_MIB("cache-ram-per-key", &ram_per_key, 0, 1 << 24, "MiB",
                "an API key's fair share of --cache-ram: when the budget is full, a key over its share is evicted "
                "first (default: --cache-ram / the number of --api-key; 0 = none)"),
        CLI_INT("prompt-cache", &cp.max_ckpts, 0, 1024, "N", "checkpoints per session (default 8; 0 = none)"),
        CLI_INT("prompt-cache-every", &cp.ckpt_every, 1, 1 << 24, "N",
                "periodic checkpoint spacing in tokens (default 4096)"),
        {.name = "turn-token", .kind = CLI_K_INT, .store = CLI_S_INT, .dst = &cp.turn_token, .max = INT32_MAX,
         .expect = "a token id", .arg = "ID",
         .help = "turn-start token id (default: <|im_start|> if the vocabulary has it)"},
        CLI_FN("predict", &predict, parse_predict, "off, user or all", "off|user|all",
               "predictive priming in idle time: the next prompt's prefix after a new user message (user), and "
               "after tool results too (all; default)"),
        CLI_INT("predict-chunk", &predict_chunk, 1, 1 << 16, "N",
                "tokens per idle priming step; a request waits at most one (default 128)"),
        CLI_SPEC(&spec, "speculative decoding: draft by prompt lookup (ngram) or the model's MTP head (mtp: "
                        "Qwen3.5 nextn) and verify the draft in one forward; output unchanged (default off; "
                        "docs/spec.md)"),
        CLI_INT("spec-max", &spec_max, 1, SPEC_MAX_DRAFT, "N", "tokens per draft, 1-32 (default 8)"),
        CLI_MIB("spec-trail", &spec_trail, 1, 1 << 20, "MiB",
                "hybrid models: the most a request's speculative state trail may take (one recurrent state per "
                "draft token); drafts shrink to fit, and below two states a checkpoint + re-read is used "
                "(default 128)"),
        CLI_STR("device", &device, "D",
                 "where sessions run: cpu (default; or $TERN_DEVICE), vulkan (the first GPU, else device 0), "
                 "vulkan:N (see tern devices), auto (a GPU when there is one and the model runs on it; says which "
                 "and why). On a device every session keeps its KV cache (pages of 256 positions, taken as it "
                 "grows; a whole --ctx-size must fit at start) and state there, --spec included"),
        CLI_OFFLOAD_OPTS(&cpu_moe_all, &n_cpu_moe, &gpu_layers_s),
        CLI_SET("no-mmap", &mmap_mode, 0,
                "read the weights into memory (default: read when the file takes at most half of the available "
                "memory, else map)"),
        CLI_SET("mmap", &mmap_mode, 1, "map the weights file instead of reading it"),
        CLI_FLAG("mlock", &mp.mlock, "pin the weights in memory"),
        CLI_END,
    };
    int c = cli_parse(&serve_cli, opts, argc, argv, NULL);
    if (c >= 0) return c;
    cp.session.kv_type = (enum tern_kv_type)kv;
    const size_t n_keys = keys.n;
    long v;
    int dev = -1;
    bool dev_auto = false;
    if ((c = cli_device_resolve("serve", device, &dev, &dev_auto))) return c;
    uint32_t cpu_moe, gpu_layers;
    if ((c = cli_cpu_moe_parse("serve", cpu_moe_all, n_cpu_moe, &cpu_moe)) ||
        (c = cli_gpu_layers_parse("serve", gpu_layers_s, cpu_moe, &gpu_layers)))
        return c;
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
    sp.api_keys = key_v;
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
    if (!st && dev >= 0 && cli_device_use("serve", model, &dev, dev_auto, dev_chunk, &cp.session, cpu_moe, gpu_layers)) {
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
