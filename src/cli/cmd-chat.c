/* tern chat (also `tern run --chat`): an interactive terminal chat. The conversation is
 * kept as OpenAI messages and rendered with the model's own template every turn (the
 * server's normalisation, rendering and output parsing); the session is kept through
 * the reuse cache, so each turn reads only what the render added or changed. */
#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/cmd-chat.h"

#include "cache/cache.h"
#include "server/chat.h"
#include "template/template.h"
#include "server/reply.h"
#include "server/request.h"
#include "server/spec.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timeutil.h"
#include "util/utf8.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static atomic_int interrupted; /* set by the SIGINT handler (lock-free: async-signal-safe) */
static void on_sigint(int sig) {
    (void)sig;
    atomic_store(&interrupted, 1);
}

static const struct cli_spec chat_cli = {
    "chat",
    "usage: tern chat --model FILE [options]      (also: tern run --chat --model FILE)\n"
    "\n"
    "An interactive chat in the terminal, rendered with the model's chat template.\n"
    "Type a message and Enter; /reset starts over, /exit (or Ctrl-D) quits; Ctrl-C\n"
    "stops the current answer.\n"
    "\n",
    NULL,
};

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct tern_buf b = TERN_BUF_INIT;
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) tern_buf_append(&b, tmp, n);
    fclose(f);
    if (!b.data) tern_buf_puts(&b, "");
    return tern_buf_detach(&b, len);
}

struct chat_state {
    struct tern_model *model;
    struct chat_fmt cf;
    struct cache *cache;
    json_t *messages;
    json_t *kwargs;
    struct tern_sampler_params sp;
    int64_t max_tokens;
    struct spec_params spec;
};

static int prime_progress(void *user, size_t done, size_t total) {
    (void)user;
    if (total > 2048) fprintf(stderr, "\r[reading %zu/%zu]", done, total);
    return atomic_load(&interrupted);
}

/* One assistant turn: render, acquire, prime, decode, print, append the reply. */
static enum tern_status chat_turn(struct chat_state *cs) {
    struct srv_request req = {.ep = SRV_EP_CHAT, .messages = cs->messages, .template_kwargs = cs->kwargs};
    json_t *vars = srv_template_vars(&req, cs->cf.bos_text, cs->cf.eos_text);
    if (!vars) return tern_errorf(TERN_ERR_NOMEM, "out of memory");
    struct tern_buf text = TERN_BUF_INIT;
    struct tern_template_spans marks = {0};
    enum tern_status st = chat_fmt_render(&cs->cf, vars, &text, &marks);
    json_decref(vars);
    int32_t *prompt = NULL;
    size_t n_prompt = 0, cap = 0;
    if (!st) st = chat_fmt_tokenize(&cs->cf, text.data ? text.data : "", text.len, &marks, &prompt, &n_prompt, &cap);
    tern_template_spans_free(&marks);
    bool in_think = !st && reply_prompt_opens_think(cs->cf.fmt, text.data, text.len);
    tern_buf_free(&text);
    if (st) {
        free(prompt);
        return st;
    }
    struct cache_ident id = {.tenant = "", .key = "chat"};
    struct cache_lease lease;
    if ((st = cache_acquire(cs->cache, &id, prompt, n_prompt, &lease))) {
        free(prompt);
        return st;
    }
    struct tern_session *s = lease.session;
    uint32_t r = lease.decision.cached;
    if (tern_session_n_ctx(s) <= n_prompt) {
        cache_release(cs->cache, &lease, true);
        free(prompt);
        return tern_errorf(TERN_ERR_RANGE, "the conversation is %zu tokens; the context holds %u: /reset to start over",
                           n_prompt, tern_session_n_ctx(s));
    }
    struct tern_eval_opts eo = {.cancel = &interrupted, .progress = prime_progress, .user = &lease,
                                .ckpt_pos = lease.ckpt_pos, .n_ckpt = lease.n_ckpt, .on_ckpt = cache_on_checkpoint,
                                .ckpt_user = &lease};
    double t0 = tern_now_s();
    st = tern_session_eval(s, prompt + r, n_prompt - r, &eo);
    if (n_prompt - r > 2048) fprintf(stderr, "\r\033[K");
    free(prompt);
    struct reply_parser p;
    reply_parser_init(&p, cs->cf.fmt, false, in_think, 1);
    struct tern_sampler *smp = NULL;
    struct tern_detok *dt = NULL;
    struct tern_buf piece = TERN_BUF_INIT;
    struct spec_dec sd = {0};
    uint32_t n_gen = 0;
    double t1 = tern_now_s();
    bool in_reasoning = false;
    if (!st) st = tern_sampler_new(&cs->sp, tern_model_info(cs->model)->n_vocab, &smp);
    if (!st) st = tern_detok_new(cs->cf.tok, TERN_TOK_PARSE_SPECIAL, &dt);
    if (!st) st = spec_dec_init(&sd, s, smp, &cs->spec, NULL);
    for (int64_t i = 0; !st && i < cs->max_tokens && !atomic_load(&interrupted); i++) {
        int32_t tok = spec_next(&sd);
        if (tern_token_is_eog(cs->cf.tok, tok)) break;
        n_gen++;
        tern_buf_clear(&piece);
        if ((st = tern_detok_push(dt, tok, &piece))) break;
        if ((st = reply_parser_feed(&p, piece.data ? piece.data : "", piece.len))) break;
        struct reply_delta *d = reply_parser_delta(&p);
        if (d->reasoning.len) {
            if (!in_reasoning && isatty(1)) fputs("\033[2m", stdout);
            in_reasoning = true;
            fwrite(d->reasoning.data, 1, d->reasoning.len, stdout);
        }
        if (d->content.len) {
            if (in_reasoning) fputs(isatty(1) ? "\033[0m\n\n" : "\n\n", stdout);
            in_reasoning = false;
            fwrite(d->content.data, 1, d->content.len, stdout);
        }
        fflush(stdout);
        reply_delta_reset(d);
        if (spec_n_past(&sd) + 1 >= tern_session_n_ctx(s)) break;
        st = spec_accept(&sd, tok, (size_t)(cs->max_tokens - i - 1));
    }
    /* the session holds exactly the tokens taken before it goes back to the cache */
    if (sd.s) {
        enum tern_status st2 = spec_finish(&sd);
        if (!st) st = st2;
    }
    if (st == TERN_ERR_CANCELLED) st = TERN_OK;
    tern_buf_clear(&piece);
    if (dt) tern_detok_flush(dt, &piece);
    if (piece.len) reply_parser_feed(&p, piece.data, piece.len);
    reply_parser_finish(&p);
    struct reply_delta *d = reply_parser_delta(&p);
    if (d->content.len) fwrite(d->content.data, 1, d->content.len, stdout);
    if (in_reasoning && isatty(1)) fputs("\033[0m", stdout);
    double t2 = tern_now_s();
    fprintf(stdout, "\n");
    char spec_s[64] = "";
    if (sd.mode != SPEC_OFF)
        snprintf(spec_s, sizeof spec_s, "; drafted=%llu accepted=%llu", (unsigned long long)sd.st.drafted,
                 (unsigned long long)sd.st.accepted);
    spec_dec_free(&sd);
    fprintf(stderr, "[%u read, %u reused, %u generated; %.2fs to first token, %.1f tok/s%s]\n", lease.decision.read,
            lease.decision.cached, n_gen, t1 - t0, n_gen > 0 && t2 > t1 ? n_gen / (t2 - t1) : 0.0, spec_s);
    if (!st) {
        json_t *msg = json_pack("{s:s,s:s%}", "role", "assistant", "content", p.content.data ? p.content.data : "",
                                p.content.len);
        if (msg && p.reasoning.len) json_object_set_new(msg, "reasoning_content", json_stringn(p.reasoning.data, p.reasoning.len));
        if (msg) json_array_append_new(cs->messages, msg);
    }
    cache_release(cs->cache, &lease, st == TERN_OK);
    tern_sampler_free(smp);
    tern_detok_free(dt);
    tern_buf_free(&piece);
    reply_parser_free(&p);
    return st;
}

int cli_chat_main(int argc, char **argv) {
    struct chat_state cs = {.max_tokens = 1024};
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    struct cache_params cp;
    cache_params_default(&cp);
    tern_sampler_params_default(&cs.sp);
    const char *model_path = NULL, *system = NULL, *tmpl = NULL;
    bool no_think = false, seed_set = false, chat = false;
    const char *device = getenv("TERN_DEVICE");
    bool cpu_moe_all = false;
    const char *n_cpu_moe = NULL, *gpu_layers_s = NULL;
    int kv = TERN_KV_F16;
    /* tern run --chat hands its arguments over unchanged: run's names where they mean
     * the same */
    const struct cli_opt opts[] = {
        CLI_STR1("m|model", &model_path, "FILE", "GGUF model"),
        CLI_STR("system", &system, "TEXT", "system prompt"),
        CLI_INT("n|n-predict", &cs.max_tokens, 1, INT32_MAX, "N", "tokens per answer (default 1024)"),
        CLI_INT("max-tokens", &cs.max_tokens, 1, INT32_MAX, "N", "the same as --n-predict"),
        CLI_SAMPLER_OPTS(&cs.sp, &seed_set),
        CLI_INT("t|threads", &mp.n_threads, 1, 1024, "N", "compute threads (default: online cores)"),
        CLI_INT("c|ctx-size", &cp.session.n_ctx, 16, 1 << 24, "N", "context length (default min(model, 32768))"),
        CLI_INT("chunk", &cp.session.n_chunk, 1, 1 << 16, "N", "prompt tokens per chunk (default 512)"),
        CLI_CHOICE("kv-type", &kv, cli_kv_types, "f16|f32", "KV cache type (default f16)"),
        CLI_FLAG("no-mmap", &mp.no_mmap, "read the weights into memory instead of mapping them"),
        CLI_FLAG("mlock", &mp.mlock, "pin the weights in memory"),
        CLI_STR1("chat-template", &tmpl, "FILE", "template to use instead of the model's"),
        CLI_FLAG("no-think", &no_think, "chat_template_kwargs.enable_thinking = false"),
        CLI_FLAG("chat", &chat, NULL), /* tern run --chat */
        CLI_SPEC(&cs.spec.mode,
                 "speculative decoding by prompt lookup or the MTP head (default off; same output)"),
        CLI_INT("spec-max", &cs.spec.max, 1, SPEC_MAX_DRAFT, "N", "tokens per draft, 1-32 (default 8)"),
        CLI_STR("device", &device, "D", "cpu (default; or $TERN_DEVICE), vulkan, vulkan:N or auto, as for tern serve"),
        CLI_OFFLOAD_OPTS(&cpu_moe_all, &n_cpu_moe, &gpu_layers_s),
        CLI_END,
    };
    int c = cli_parse(&chat_cli, opts, argc, argv, NULL);
    if (c >= 0) return c;
    cp.session.kv_type = (enum tern_kv_type)kv;
    if (!seed_set) cs.sp.seed = tern_now_ns();
    if (!model_path) return cli_usage_error("chat", "--model FILE is required");
    int dev = -1;
    bool dev_auto = false;
    if ((c = cli_device_resolve("chat", device, &dev, &dev_auto))) return c;
    uint32_t cpu_moe, gpu_layers;
    if ((c = cli_cpu_moe_parse("chat", cpu_moe_all, n_cpu_moe, &cpu_moe)) ||
        (c = cli_gpu_layers_parse("chat", gpu_layers_s, cpu_moe, &gpu_layers)))
        return c;
    char *tsrc = NULL;
    size_t tlen = 0;
    if (tmpl && !(tsrc = slurp(tmpl, &tlen))) return cli_fail("chat", "cannot read --chat-template '%s'", tmpl);
    mp.path = model_path;
    enum tern_status st = tern_model_load(&mp, &cs.model);
    /* the device's chunk: --chunk, at most 1024 (its scratch holds one chunk's activations
     * and logits; the bits do not depend on it) */
    const uint32_t dev_chunk = !cp.session.n_chunk ? TERN_DEFAULT_CHUNK : TERN_MIN(cp.session.n_chunk, 1024u);
    if (!st && dev >= 0 && cli_device_use("chat", cs.model, &dev, dev_auto, dev_chunk, &cp.session, cpu_moe, gpu_layers)) {
        free(tsrc);
        tern_model_free(cs.model);
        return 1;
    }
    if (!st) st = chat_fmt_init(&cs.cf, cs.model, tsrc, tlen);
    free(tsrc);
    if (!st) {
        cp.turn_token = chat_turn_token(&cs.cf);
        st = chat_role_map(cs.cf.tok, &cp);
        if (!st) st = cache_new(cs.model, &cp, &cs.cache);
    }
    if (st) {
        int rc = cli_fail("chat", "%s: %s", model_path, tern_last_error());
        chat_fmt_free(&cs.cf);
        tern_model_free(cs.model);
        return rc;
    }
    cs.messages = json_array();
    if (system) json_array_append_new(cs.messages, json_pack("{s:s,s:s}", "role", "system", "content", system));
    cs.kwargs = no_think ? json_pack("{s:b}", "enable_thinking", 0) : NULL;
    /* the cache's per-turn decision lines would interleave with the chat */
    if (!getenv("TERN_LOG")) tern_log_set_level(TERN_LOG_WARN);
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    fprintf(stderr, "tern chat: %s (%s template). /reset starts over, /exit quits.\n", tern_model_info(cs.model)->name,
            cs.cf.source);
    char *line = NULL;
    size_t lcap = 0;
    int rc = 0;
    for (;;) {
        if (isatty(0)) fputs("> ", stdout);
        fflush(stdout);
        atomic_store(&interrupted, 0);
        ssize_t n = getline(&line, &lcap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n == 0) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(cs.messages);
            if (system) json_array_append_new(cs.messages, json_pack("{s:s,s:s}", "role", "system", "content", system));
            fprintf(stderr, "[conversation reset]\n");
            continue;
        }
        if (!tern_utf8_valid(line, (size_t)n)) {
            fprintf(stderr, "[the input is not valid UTF-8; ignored]\n");
            continue;
        }
        json_array_append_new(cs.messages, json_pack("{s:s,s:s%}", "role", "user", "content", line, (size_t)n));
        if ((st = chat_turn(&cs))) {
            fprintf(stderr, "tern chat: %s\n", tern_last_error());
            json_array_remove(cs.messages, json_array_size(cs.messages) - 1);
            if (st != TERN_ERR_RANGE && st != TERN_ERR_TEMPLATE) {
                rc = 1;
                break;
            }
        }
    }
    free(line);
    json_decref(cs.messages);
    json_decref(cs.kwargs);
    cache_free(cs.cache);
    chat_fmt_free(&cs.cf);
    tern_model_free(cs.model);
    return rc;
}

TERN_COMMAND("chat", "interactive chat with a model in the terminal", cli_chat_main)
