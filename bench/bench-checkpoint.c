/* bench-checkpoint: what a hybrid model's checkpoint costs, next to what it saves.
 *
 *   bench-checkpoint MODEL.gguf [--threads N] [--prompt N] [--gen N] [--reps N]
 *
 * Primes a prompt of N tokens (pp, tokens/s), decodes --gen tokens one at a time (tg,
 * tokens/s), then takes and restores checkpoints of the session --reps times and
 * reports their size and the copy speed (GB/s), against the time re-reading the prompt
 * would take. Timings are best of --reps (they are never a test's pass condition). */
#include "tern.h"
#include "util/timeutil.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(FILE *f) {
    fprintf(f, "usage: bench-checkpoint MODEL.gguf [--threads N] [--prompt N] [--gen N] [--reps N]\n");
    return f == stdout ? 0 : 2;
}

int main(int argc, char **argv) {
    int n_threads = 2, n_prompt = 512, n_gen = 128, reps = 3;
    static const struct option opts[] = {{"threads", required_argument, 0, 't'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"gen", required_argument, 0, 'n'},
                                         {"reps", required_argument, 0, 'r'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "t:p:n:r:h", opts, NULL)) != -1) {
        switch (c) {
        case 't': n_threads = atoi(optarg); break;
        case 'p': n_prompt = atoi(optarg); break;
        case 'n': n_gen = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'h': return usage(stdout);
        default: return usage(stderr);
        }
    }
    if (optind != argc - 1 || n_prompt < 1 || n_gen < 0 || reps < 1 || n_threads < 1) return usage(stderr);

    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = argv[optind];
    mp.n_threads = n_threads;
    mp.no_mmap = true; /* as the llama.cpp reference (-mmp 0): no page-cache eviction effects */
    struct tern_model *m = NULL;
    if (tern_model_load(&mp, &m)) {
        fprintf(stderr, "bench-checkpoint: %s\n", tern_last_error());
        return 1;
    }
    const struct tern_model_info *in = tern_model_info(m);
    printf("model: %s (%s), %u layers (%u attention, %u recurrent), %.1f MB weights, %d threads\n", in->name, in->arch,
           in->n_layer, in->n_attn_layers, in->n_recurrent_layers, (double)in->weight_bytes / 1e6, in->n_threads);

    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n_prompt + n_gen + 1));
    if (!toks) return 1;
    uint32_t x = 12345;
    for (int i = 0; i < n_prompt; i++) {
        x = x * 1664525u + 1013904223u;
        toks[i] = (int32_t)((x >> 8) % in->n_vocab);
    }
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.n_ctx = (uint32_t)(n_prompt + n_gen + 16);
    sp.n_chunk = 512;

    double best_pp = 1e30, best_tg = 1e30;
    struct tern_session *s = NULL;
    for (int r = 0; r < reps; r++) {
        tern_session_free(s);
        s = NULL;
        if (tern_session_new(m, &sp, &s)) {
            fprintf(stderr, "bench-checkpoint: %s\n", tern_last_error());
            return 1;
        }
        double t0 = tern_now_s();
        if (tern_session_eval(s, toks, (size_t)n_prompt, NULL)) {
            fprintf(stderr, "bench-checkpoint: %s\n", tern_last_error());
            return 1;
        }
        double t1 = tern_now_s();
        if (t1 - t0 < best_pp) best_pp = t1 - t0;
        if (n_gen > 0 && r == reps - 1) {
            /* decode: greedy is irrelevant to speed; feed a fixed token stream */
            double g0 = tern_now_s();
            for (int i = 0; i < n_gen; i++) tern_session_eval(s, &toks[i % n_prompt], 1, NULL);
            best_tg = tern_now_s() - g0;
        }
    }
    printf("pp%d: %.2f t/s (%.3f s)\n", n_prompt, n_prompt / best_pp, best_pp);
    if (n_gen > 0) printf("tg%d: %.2f t/s (one run)\n", n_gen, n_gen / best_tg);

    /* checkpoints of the session as it stands */
    double best_save = 1e30, best_restore = 1e30;
    size_t bytes = 0;
    for (int r = 0; r < reps; r++) {
        struct tern_checkpoint *ck = NULL;
        double t0 = tern_now_s();
        if (tern_session_checkpoint(s, &ck)) {
            fprintf(stderr, "bench-checkpoint: %s\n", tern_last_error());
            return 1;
        }
        double t1 = tern_now_s();
        if (tern_session_restore(s, ck)) {
            fprintf(stderr, "bench-checkpoint: %s\n", tern_last_error());
            return 1;
        }
        double t2 = tern_now_s();
        bytes = tern_checkpoint_bytes(ck);
        tern_checkpoint_free(ck);
        if (t1 - t0 < best_save) best_save = t1 - t0;
        if (t2 - t1 < best_restore) best_restore = t2 - t1;
    }
    printf("checkpoint: %.2f MB (recurrent state %.2f MB)\n", (double)bytes / 1e6, (double)in->recurrent_bytes / 1e6);
    printf("checkpoint save: %.3f ms (%.2f GB/s); restore: %.3f ms (%.2f GB/s)\n", best_save * 1e3,
           (double)bytes / best_save / 1e9, best_restore * 1e3, (double)bytes / best_restore / 1e9);
    printf("re-reading the %d-token prompt instead: %.3f s (%.0fx the restore)\n", n_prompt, best_pp,
           best_pp / best_restore);
    tern_session_free(s);
    tern_model_free(m);
    free(toks);
    return 0;
}
