/* tern bench (model): prompt processing and decode speed, as llama-bench measures them
 * (pp: one prompt of -p random tokens; tg: -n tokens decoded one by one from an empty
 * context), with the decode's effective weight bandwidth and the prompt's GFLOP/s. For
 * hybrid models also the checkpoint: its size and save / restore speed after the prompt. */
#include "cli/cli.h"
#include "cli/opts.h"

#include "gguf/gguf.h"
#include "util/timeutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const struct cli_spec bench_cli = {
    "bench",
    "usage: tern bench [model] --model FILE [-p N] [-n N] [-r N] [--threads N] [--ctx-fill N] [--no-mmap]\n"
    "                         [--json]\n"
    "\n"
    "Measures prompt processing (pp: one prompt of N random tokens) and decoding (tg:\n"
    "N tokens one by one from an empty context), mean +- sd over repetitions, after a\n"
    "warm-up run. Also: the weight bytes read per decoded token times tg t/s (the\n"
    "decode's effective bandwidth) and the prompt's GFLOP/s; for hybrid models the\n"
    "size of a checkpoint and its save / restore speed (after the prompt).\n"
    "\n",
    NULL,
};

/* Weight figures from the file: bytes read per decoded token (every matrix, one row of
 * the embedding table unless it is also the output; of a stacked expert tensor only the
 * expert_used_count experts a token is routed to), and the multiply-adds per token in
 * the layers and in the output projection. */
struct weight_stats {
    uint64_t read_per_token;
    uint64_t layer_macs;  /* per token, all blk.* matrices */
    uint64_t output_macs; /* the output projection */
};

static enum tern_status weight_stats(const char *path, struct weight_stats *ws) {
    memset(ws, 0, sizeof *ws);
    struct gguf_open_opts oo = {.no_data = true};
    struct gguf_file *f;
    enum tern_status st = gguf_open(path, &oo, &f);
    if (st) return st;
    const struct gguf_tensor *embd = gguf_find_tensor(f, "token_embd.weight");
    const bool tied = !gguf_find_tensor(f, "output.weight");
    /* Mixture of experts: a token reads n_used of the n_expert slices of each stacked
     * expert tensor (ne[2] = n_expert), the router and the shared expert in full. */
    uint32_t n_used = 0;
    const struct gguf_str *arch = NULL;
    if (gguf_find_kv(f, "general.architecture") && !gguf_get_str(f, "general.architecture", &arch)) {
        char key[160];
        snprintf(key, sizeof key, "%s.expert_used_count", arch->ptr);
        if (gguf_find_kv(f, key) && gguf_get_u32(f, key, &n_used)) n_used = 0;
    }
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        const char *name = t->name.ptr;
        if (t == embd) {
            if (tied) {
                ws->read_per_token += t->size;
                ws->output_macs += t->n_elements;
            } else {
                ws->read_per_token += t->ne[1] ? t->size / t->ne[1] : 0;
            }
            continue;
        }
        if (t->n_dims == 3 && n_used && t->ne[2] >= n_used) {
            ws->read_per_token += t->size / t->ne[2] * n_used;
            ws->layer_macs += t->n_elements / t->ne[2] * n_used;
            continue;
        }
        ws->read_per_token += t->size;
        if (t->n_dims < 2) continue;
        if (!strcmp(name, "output.weight")) ws->output_macs += t->n_elements;
        else if (!strncmp(name, "blk.", 4)) ws->layer_macs += t->n_elements;
    }
    gguf_close(f);
    return TERN_OK;
}

/* CPU seconds this process has used (all threads). */
static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) * 1e-6;
}

static void random_tokens(int32_t *t, size_t n, uint32_t n_vocab, uint64_t *x) {
    for (size_t i = 0; i < n; i++) {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        t[i] = (int32_t)(*x % n_vocab);
    }
}

static void mean_sd(const double *v, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) q += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0.0;
}

static int bench_model_main(int argc, char **argv) {
    const char *model = NULL;
    long n_prompt = 512, n_gen = 128, reps = 3, threads = 0, chunk = 0, ctx_fill = 0;
    bool no_mmap = false, mlock = false, json = false;
    int kv = TERN_KV_F16;
    const char *device = getenv("TERN_DEVICE");
    bool cpu_moe_all = false;
    const char *n_cpu_moe = NULL, *gpu_layers_s = NULL;
    const struct cli_opt opts[] = {
        CLI_STR1("m|model", &model, "FILE", "the GGUF model"),
        CLI_INT("p|n-prompt", &n_prompt, 0, 1 << 20, "N", "prompt tokens (default 512; 0 = skip)"),
        CLI_INT("n|n-gen", &n_gen, 0, 1 << 20, "N", "generated tokens (default 128; 0 = skip)"),
        CLI_INT("r|repetitions", &reps, 1, 1000, "N", "(default 3)"),
        CLI_INT("t|threads", &threads, 1, 1024, "N", "compute threads (default: online cores)"),
        CLI_INT("chunk", &chunk, 1, 1 << 20, "N", "prompt chunk size (default: the whole prompt)"),
        CLI_INT("d|ctx-fill", &ctx_fill, 0, 1 << 22, "N",
                "run pp and tg on a context already holding N tokens (random, read once, untimed, and restored "
                "from a checkpoint before each run), as llama-bench -d N does (default 0)"),
        CLI_CHOICE("kv-type", &kv, cli_kv_types, "f16|f32", "KV cache type (default f16)"),
        CLI_FLAG("no-mmap", &no_mmap, "read the weights into memory instead of mapping them"),
        CLI_FLAG("mlock", &mlock, "pin the weights"),
        CLI_FLAG("json", &json, "print one JSON object instead of a table"),
        CLI_STR("device", &device, "D",
                "cpu (default; or $TERN_DEVICE), vulkan[:N] (the Vulkan backend, every architecture: docs/gpu.md), "
                "auto (a GPU when there is one)"),
        CLI_OFFLOAD_OPTS(&cpu_moe_all, &n_cpu_moe, &gpu_layers_s),
        CLI_END,
    };
    int c = cli_parse(&bench_cli, opts, argc, argv, NULL);
    if (c >= 0) return c;
    if (!model) return cli_usage_error("bench", "--model is required");
    if (n_prompt == 0 && n_gen == 0) return cli_usage_error("bench", "nothing to measure (-p 0 and -n 0)");
    int dev = -1;
    bool dev_auto = false;
    if ((c = cli_device_resolve("bench", device, &dev, &dev_auto))) return c;
    uint32_t cpu_moe, gpu_layers;
    if ((c = cli_cpu_moe_parse("bench", cpu_moe_all, n_cpu_moe, &cpu_moe)) ||
        (c = cli_gpu_layers_parse("bench", gpu_layers_s, cpu_moe, &gpu_layers)))
        return c;

    struct weight_stats ws;
    if (weight_stats(model, &ws)) return cli_fail("bench", "%s", tern_last_error());
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = model;
    mp.no_mmap = no_mmap;
    mp.mlock = mlock;
    mp.n_threads = (int)threads;
    struct tern_model *m;
    const double t_load = tern_now_s();
    if (tern_model_load(&mp, &m)) return cli_fail("bench", "%s", tern_last_error());
    const double load_s = tern_now_s() - t_load;
    const struct tern_model_info *info = tern_model_info(m);
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.kv_type = (enum tern_kv_type)kv;
    sp.n_chunk = (uint32_t)(chunk ? chunk : (n_prompt ? n_prompt : 1));
    sp.n_ctx = (uint32_t)(ctx_fill + (n_prompt > n_gen ? n_prompt : n_gen) + 8);
    /* --device: the same runs in a session on the device (the weights uploaded once; each
     * token's logits read back, as a server would) */
    const double t_up = tern_now_s();
    if (cli_device_use("bench", m, &dev, dev_auto, sp.n_chunk, &sp, cpu_moe, gpu_layers)) {
        tern_model_free(m);
        return 1;
    }
    const double up_s = tern_now_s() - t_up;
    const bool on_dev = dev >= 0;
    struct tern_session *s;
    if (tern_session_new(m, &sp, &s)) {
        tern_model_free(m);
        return cli_fail("bench", "%s", tern_last_error());
    }
    const size_t n_toks = (size_t)(n_prompt + n_gen + 1) > (size_t)ctx_fill ? (size_t)(n_prompt + n_gen + 1) : (size_t)ctx_fill;
    int32_t *toks = malloc(sizeof(int32_t) * n_toks);
    double *pp = calloc((size_t)reps, sizeof(double)), *tg = calloc((size_t)reps, sizeof(double));
    double *ck_save = calloc((size_t)reps, sizeof(double)), *ck_restore = calloc((size_t)reps, sizeof(double));
    size_t ck_bytes = 0;
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    int rc = 0;
    /* CPU time against wall time x threads: how much of the cores the run really had
     * (spinning workers count as busy, so this overstates a little). */
    double pp_wall = 0, pp_cpu = 0, tg_wall = 0, tg_cpu = 0;
    /* Each run starts from an empty context: restoring the checkpoint at position 0
     * (a hybrid model's session cannot be rewound, DESIGN.md §3). */
    struct tern_checkpoint *ck0 = NULL;
    double fill_s = 0;
    if (!toks || !pp || !tg || !ck_save || !ck_restore) {
        tern_session_free(s);
        tern_model_free(m);
        free(toks), free(pp), free(tg), free(ck_save), free(ck_restore);
        return cli_fail("bench", "out of memory");
    }
    /* --ctx-fill: the context every run starts from holds ctx_fill random tokens, read once
     * here (in chunks of the session's size); the runs restore the checkpoint taken after it. */
    if (ctx_fill) {
        random_tokens(toks, (size_t)ctx_fill, info->n_vocab, &rng);
        const double f0 = tern_now_s();
        if (tern_session_eval(s, toks, (size_t)ctx_fill, NULL)) rc = 1;
        fill_s = tern_now_s() - f0;
    }
    if (!rc && tern_session_checkpoint(s, &ck0)) rc = 1;
    /* r = -1 is the warm-up (pages the weights in, grows the workspace) */
    for (long r = -1; r < reps && !rc; r++) {
        if (n_prompt) {
            random_tokens(toks, (size_t)n_prompt, info->n_vocab, &rng);
            if (tern_session_restore(s, ck0)) rc = 1;
            const double t0 = tern_now_s(), cp0 = cpu_s();
            if (!rc && tern_session_eval(s, toks, (size_t)(r < 0 ? (n_prompt < 16 ? n_prompt : 16) : n_prompt), NULL))
                rc = 1;
            if (r >= 0) {
                pp[r] = (double)n_prompt / (tern_now_s() - t0);
                pp_wall += tern_now_s() - t0;
                pp_cpu += cpu_s() - cp0;
            }
            if (r >= 0 && info->hybrid && !rc) {
                struct tern_checkpoint *ck = NULL;
                const double c0 = tern_now_s();
                if (tern_session_checkpoint(s, &ck)) rc = 1;
                const double c1 = tern_now_s();
                if (!rc && tern_session_restore(s, ck)) rc = 1;
                const double c2 = tern_now_s();
                if (ck) ck_bytes = tern_checkpoint_bytes(ck);
                tern_checkpoint_free(ck);
                ck_save[r] = c1 - c0;
                ck_restore[r] = c2 - c1;
            }
        }
        if (n_gen && !rc) {
            random_tokens(toks, (size_t)n_gen, info->n_vocab, &rng);
            if (tern_session_restore(s, ck0)) rc = 1;
            const long n = r < 0 ? (n_gen < 4 ? n_gen : 4) : n_gen;
            const double t0 = tern_now_s(), c0 = cpu_s();
            for (long i = 0; i < n && !rc; i++)
                if (tern_session_eval(s, &toks[i], 1, NULL)) rc = 1;
            if (r >= 0) {
                tg[r] = (double)n_gen / (tern_now_s() - t0);
                tg_wall += tern_now_s() - t0;
                tg_cpu += cpu_s() - c0;
            }
        }
    }
    if (rc) {
        cli_fail("bench", "%s", tern_last_error());
    } else {
        double pp_m = 0, pp_sd = 0, tg_m = 0, tg_sd = 0;
        if (n_prompt) mean_sd(pp, (int)reps, &pp_m, &pp_sd);
        if (n_gen) mean_sd(tg, (int)reps, &tg_m, &tg_sd);
        /* Prompt FLOPs: every layer matrix per token, the output projection once (only the
         * last position's logits); attention over positions is not counted. */
        const double pp_flop = 2.0 * ((double)ws.layer_macs * (double)n_prompt + (double)ws.output_macs);
        const double gflops = n_prompt ? pp_flop * pp_m / (double)n_prompt * 1e-9 : 0.0;
        const double gbps = (double)ws.read_per_token * tg_m * 1e-9;
        /* checkpoint: the best of the repetitions (a copy of a few MB is noise-prone) */
        const bool ck = info->hybrid && n_prompt;
        double save_s = 0, restore_s = 0;
        for (long i = 0; ck && i < reps; i++) {
            if (i == 0 || ck_save[i] < save_s) save_s = ck_save[i];
            if (i == 0 || ck_restore[i] < restore_s) restore_s = ck_restore[i];
        }
        const double nth = info->n_threads;
        const double pp_util = pp_wall > 0 ? pp_cpu / (pp_wall * nth) : 0;
        const double tg_util = tg_wall > 0 ? tg_cpu / (tg_wall * nth) : 0;
        const char *mode = no_mmap ? "read into memory (--no-mmap)" : mlock ? "mmap + mlock" : "mmap";
        if (json) {
            printf("{\"model\":\"%s\",\"arch\":\"%s\",\"n_params\":%llu,\"weight_bytes\":%llu,"
                   "\"weight_bytes_per_token\":%llu,\"threads\":%d,\"mmap\":%s,\"mlock\":%s,\"kv_type\":\"%s\","
                   "\"repetitions\":%ld,\"load_s\":%.3f,\"n_prompt\":%ld,\"pp_tps\":%.3f,\"pp_tps_sd\":%.3f,"
                   "\"pp_gflops\":%.3f,\"pp_cpu_util\":%.3f,\"n_gen\":%ld,\"tg_tps\":%.3f,\"tg_tps_sd\":%.3f,"
                   "\"tg_gbps\":%.3f,\"tg_cpu_util\":%.3f,\"ctx_fill\":%ld,\"ctx_fill_s\":%.3f",
                   info->name, info->arch, (unsigned long long)info->n_params,
                   (unsigned long long)info->weight_bytes, (unsigned long long)ws.read_per_token, info->n_threads,
                   no_mmap ? "false" : "true", mlock ? "true" : "false", kv == TERN_KV_F16 ? "f16" : "f32", reps,
                   load_s, n_prompt, pp_m, pp_sd, gflops, pp_util, n_gen, tg_m, tg_sd, gbps, tg_util, ctx_fill, fill_s);
            if (ck)
                printf(",\"ckpt_bytes\":%zu,\"ckpt_save_s\":%.6f,\"ckpt_restore_s\":%.6f", ck_bytes, save_s,
                       restore_s);
            json_t *dj = json_string(tern_model_device(m));
            char *ds = dj ? json_dumps(dj, JSON_ENCODE_ANY) : NULL;
            printf(",\"device\":%s,\"upload_s\":%.3f}\n", ds ? ds : "null", on_dev ? up_s : 0.0);
            free(ds);
            json_decref(dj);
        } else {
            printf("model: %s (%s), %.1f M params, %.1f MB of weights, %.1f MB read per decoded token\n",
                   info->name, info->arch, (double)info->n_params / 1e6, (double)info->weight_bytes / 1e6,
                   (double)ws.read_per_token / 1e6);
            if (on_dev)
                printf("weights: %s, loaded in %.2f s; device: %s, weights uploaded in %.2f s; KV %s; %ld repetitions "
                       "after a warm-up\n",
                       mode, load_s, tern_model_device(m), up_s, kv == TERN_KV_F16 ? "f16" : "f32", reps);
            else
                printf("weights: %s, loaded in %.2f s; %d threads; KV %s; %ld repetitions after a warm-up\n", mode,
                       load_s, info->n_threads, kv == TERN_KV_F16 ? "f16" : "f32", reps);
            if (ctx_fill)
                printf("context: %ld tokens before each run (read once in %.1f s, %.1f t/s)\n", ctx_fill, fill_s,
                       (double)ctx_fill / fill_s);
            /* the CPU's share of the wall time says nothing of a device's */
            char pu[32] = "", tu[32] = "";
            if (!on_dev) snprintf(pu, sizeof pu, "   cpu %3.0f%%", 100 * pp_util);
            if (!on_dev) snprintf(tu, sizeof tu, "      cpu %3.0f%%", 100 * tg_util);
            if (n_prompt)
                printf("pp%-5ld %8.2f +- %6.2f t/s   %7.2f GFLOP/s (matmuls)%s\n", n_prompt, pp_m, pp_sd, gflops, pu);
            if (n_gen) printf("tg%-5ld %8.2f +- %6.2f t/s   %7.2f GB/s of weights%s\n", n_gen, tg_m, tg_sd, gbps, tu);
            if (!on_dev && ((n_prompt && pp_util < 0.85) || (n_gen && tg_util < 0.85)))
                printf("note: the threads had the CPU only part of the time (another load?): the figures are low\n");
            if (ck)
                printf("checkpoint %.2f MB: save %.3f ms (%.2f GB/s), restore %.3f ms (%.2f GB/s); "
                       "re-reading the prompt instead: %.0f ms\n",
                       (double)ck_bytes / 1e6, save_s * 1e3, (double)ck_bytes / save_s * 1e-9, restore_s * 1e3,
                       (double)ck_bytes / restore_s * 1e-9, (double)n_prompt / pp_m * 1e3);
        }
    }
    tern_checkpoint_free(ck0);
    free(toks), free(pp), free(tg), free(ck_save), free(ck_restore);
    tern_session_free(s);
    tern_model_free(m);
    return rc;
}

TERN_BENCH("model", "prompt and decode speed of a model (pp/tg t/s, bandwidth, GFLOP/s)", bench_model_main)
