/* bench-disk: the disk tier's speed (docs/SERVING.md "Disk tier").
 *
 *   bench-disk state MODEL N_TOK N_CKPT DIR [reread]
 *       write and restore GB/s of a conversation of N_TOK tokens with N_CKPT
 *       checkpoints (its KV rows and recurrent state filled from a real prime of the
 *       first min(N_TOK, 512) tokens, the rest imported: the bytes are what count),
 *       restored warm (page cache) and cold (the file's pages dropped first); with
 *       "reread", the time to prime the N_TOK tokens instead, for comparison.
 *   bench-disk turn MODEL N_TOK N_ADD DIR
 *       the write of a conversation's next turn: N_TOK tokens written, then the same
 *       conversation with N_ADD more tokens (the next turn) written again, which appends
 *       what the file does not hold; against a new file of the N_TOK + N_ADD tokens.
 *   bench-disk index MODEL N_ENTRIES N_TOK DIR
 *       index rebuild time of a directory of N_ENTRIES conversations of N_TOK tokens,
 *       warm and with every file's pages dropped.
 *
 * Timings only; never part of the test run. */
#include "cache/disk.h"
#include "util/timeutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void drop_pages(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' && strcmp(de->d_name, ".gen")) continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        int fd = open(p, O_RDONLY);
        if (fd < 0) continue;
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    closedir(d);
}

static struct tern_model *load(const char *path) {
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = path;
    struct tern_model *m;
    if (tern_model_load(&mp, &m)) {
        fprintf(stderr, "%s\n", tern_last_error());
        exit(1);
    }
    return m;
}

static struct tern_session_params sparams(uint32_t n_tok) {
    struct tern_session_params p;
    tern_session_params_default(&p);
    p.n_ctx = n_tok + 16;
    return p;
}

/* A session of n tokens: the first up to 512 primed for real, the rest's KV rows
 * copied from those (the disk tier moves bytes; their values do not matter here). */
static struct tern_session *make_session(struct tern_model *m, uint32_t n) {
    uint32_t n_vocab = tern_model_info(m)->n_vocab;
    int32_t *toks = malloc((size_t)n * sizeof *toks);
    for (uint32_t i = 0; i < n; i++) toks[i] = (int32_t)((i * 2654435761u + 7) % n_vocab);
    struct tern_session_params sp = sparams(n);
    uint32_t real = n < 512 ? n : 512;
    struct tern_session *s0, *s;
    if (tern_session_new(m, &sp, &s0) || tern_session_eval(s0, toks, real, NULL)) {
        fprintf(stderr, "%s\n", tern_last_error());
        exit(1);
    }
    if (tern_session_import(m, &sp, toks, n, tern_session_rec_data(s0), &s)) {
        fprintf(stderr, "%s\n", tern_last_error());
        exit(1);
    }
    size_t row = tern_state_kv_row_bytes(m, sp.kv_type);
    uint8_t *buf = malloc((size_t)real * row);
    tern_session_kv_export(s0, 0, real, buf);
    for (uint32_t p = 0; p < n; p += real) {
        uint32_t k = n - p < real ? n - p : real;
        tern_session_kv_import(s, p, p + k, buf, real);
    }
    free(buf);
    free(toks);
    tern_session_free(s0);
    return s;
}

static int bench_state(int argc, char **argv) {
    if (argc < 6) return 2;
    struct tern_model *m = load(argv[2]);
    uint32_t n = (uint32_t)atol(argv[3]), n_ck = (uint32_t)atol(argv[4]);
    const char *dir = argv[5];
    bool reread = argc > 6 && !strcmp(argv[6], "reread");
    const struct tern_model_info *mi = tern_model_info(m);
    struct tern_session *s = make_session(m, n);
    struct tern_checkpoint *cks[64] = {0};
    if (n_ck > 64) n_ck = 64;
    if (!mi->hybrid) n_ck = 0;
    /* checkpoints at evenly spaced positions: fork a session per position would cost a
     * prime; a checkpoint's bytes are the recurrent state, so the live state stands in */
    for (uint32_t i = 0; i < n_ck; i++) {
        struct tern_session *t;
        struct tern_session_params sp = sparams(n);
        uint32_t pos = (uint32_t)((uint64_t)n * (i + 1) / (n_ck + 1));
        tern_session_import(m, &sp, tern_session_tokens(s), pos, tern_session_rec_data(s), &t);
        tern_session_checkpoint(t, &cks[i]);
        tern_session_free(t);
    }
    struct disk_params dp = {.dir = dir, .max_bytes = 1ull << 40, .model = m, .session = sparams(n)};
    struct disk *d;
    if (disk_open(&dp, &d)) {
        fprintf(stderr, "%s\n", tern_last_error());
        return 1;
    }
    uint8_t nonce[DISK_NONCE_BYTES];
    bool has = false;
    double best_w = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        uint64_t t0 = tern_now_ns();
        /* (a key each: a write of a file that holds the state already appends nothing) */
        char key[16];
        snprintf(key, sizeof key, "bench-%d", rep);
        if (disk_put(d, "", key, nonce, &has, s, cks, NULL, n_ck, NULL)) {
            fprintf(stderr, "%s\n", tern_last_error());
            return 1;
        }
        double t = (double)(tern_now_ns() - t0) * 1e-9;
        if (t < best_w) best_w = t;
    }
    uint64_t bytes = disk_at(d, 0)->bytes;
    printf("model %s: %u tokens, %u checkpoints of %.1f MiB, KV %.1f KiB/token: file %.1f MiB\n", mi->name, n, n_ck,
           (double)mi->recurrent_bytes / (1 << 20), (double)tern_state_kv_row_bytes(m, TERN_KV_F16) / 1024,
           (double)bytes / (1 << 20));
    printf("  write (temp + fsync + rename), best of 3: %.3f s, %.2f GB/s\n", best_w, (double)bytes / best_w * 1e-9);
    for (int cold = 0; cold < 2; cold++) {
        double best = 1e9;
        uint32_t r = n;
        for (int rep = 0; rep < 3; rep++) {
            if (cold) drop_pages(dir);
            struct tern_session *x;
            struct tern_checkpoint **lc;
            uint32_t *kinds;
            size_t nl;
            disk_refresh(d);
            uint64_t t0 = tern_now_ns();
            if (disk_load(d, 0, r, "", &x, &lc, &kinds, &nl, NULL)) {
                fprintf(stderr, "%s\n", tern_last_error());
                return 1;
            }
            double t = (double)(tern_now_ns() - t0) * 1e-9;
            if (t < best) best = t;
            for (size_t i = 0; i < nl; i++) tern_checkpoint_free(lc[i]);
            free(lc);
            free(kinds);
            tern_session_free(x);
        }
        printf("  restore at the live end (%s), best of 3: %.3f s, %.2f GB/s\n",
               cold ? "cold: the file's pages dropped" : "warm: page cache", best, (double)bytes / best * 1e-9);
    }
    if (reread) {
        struct tern_session *x;
        struct tern_session_params sp = sparams(n);
        tern_session_new(m, &sp, &x);
        uint64_t t0 = tern_now_ns();
        if (tern_session_eval(x, tern_session_tokens(s), n, NULL)) {
            fprintf(stderr, "%s\n", tern_last_error());
            return 1;
        }
        double t = (double)(tern_now_ns() - t0) * 1e-9;
        printf("  re-reading the %u tokens instead: %.2f s (%.0f tok/s, %d threads)\n", n, t, n / t, mi->n_threads);
        tern_session_free(x);
    }
    for (uint32_t i = 0; i < n_ck; i++) tern_checkpoint_free(cks[i]);
    disk_free(d);
    tern_session_free(s);
    tern_model_free(m);
    return 0;
}

static int bench_turn(int argc, char **argv) {
    if (argc < 6) return 2;
    struct tern_model *m = load(argv[2]);
    const uint32_t n = (uint32_t)atol(argv[3]), add = (uint32_t)atol(argv[4]);
    const char *dir = argv[5];
    struct tern_session *s1 = make_session(m, n), *s2 = make_session(m, n + add);
    struct disk_params dp = {.dir = dir, .max_bytes = 1ull << 40, .model = m, .session = sparams(n + add)};
    struct disk *d;
    if (disk_open(&dp, &d)) {
        fprintf(stderr, "%s\n", tern_last_error());
        return 1;
    }
    double best_turn = 1e9, best_new = 1e9;
    uint64_t turn_bytes = 0, new_bytes = 0;
    struct disk_stats st0, st1;
    for (int rep = 0; rep < 3; rep++) {
        char key[32];
        uint8_t nonce[DISK_NONCE_BYTES];
        bool has = false;
        snprintf(key, sizeof key, "turn-%d", rep);
        if (disk_put(d, "", key, nonce, &has, s1, NULL, NULL, 0, NULL)) goto fail;
        disk_get_stats(d, &st0);
        uint64_t t0 = tern_now_ns();
        if (disk_put(d, "", key, nonce, &has, s2, NULL, NULL, 0, NULL)) goto fail;
        double t = (double)(tern_now_ns() - t0) * 1e-9;
        disk_get_stats(d, &st1);
        if (t < best_turn) best_turn = t;
        turn_bytes = st1.write_bytes - st0.write_bytes;
        snprintf(key, sizeof key, "new-%d", rep);
        t0 = tern_now_ns();
        if (disk_put(d, "", key, nonce, &has, s2, NULL, NULL, 0, NULL)) goto fail;
        t = (double)(tern_now_ns() - t0) * 1e-9;
        disk_get_stats(d, &st0);
        if (t < best_new) best_new = t;
        new_bytes = st0.write_bytes - st1.write_bytes;
    }
    printf("model %s: a conversation of %u tokens, the next turn adds %u (KV %.1f KiB/token)\n", tern_model_info(m)->name,
           n, add, (double)tern_state_kv_row_bytes(m, TERN_KV_F16) / 1024);
    printf("  the turn's write (appended), best of 3: %.1f MiB in %.3f s\n", (double)turn_bytes / (1 << 20), best_turn);
    printf("  a new file of the same state, best of 3: %.1f MiB in %.3f s\n", (double)new_bytes / (1 << 20), best_new);
    disk_free(d);
    tern_session_free(s1);
    tern_session_free(s2);
    tern_model_free(m);
    return 0;
fail:
    fprintf(stderr, "%s\n", tern_last_error());
    return 1;
}

static int bench_index(int argc, char **argv) {
    if (argc < 6) return 2;
    struct tern_model *m = load(argv[2]);
    uint32_t n_e = (uint32_t)atol(argv[3]), n = (uint32_t)atol(argv[4]);
    const char *dir = argv[5];
    struct tern_session *s = make_session(m, n);
    struct disk_params dp = {.dir = dir, .max_bytes = 1ull << 40, .model = m, .session = sparams(n)};
    struct disk *d;
    if (disk_open(&dp, &d)) {
        fprintf(stderr, "%s\n", tern_last_error());
        return 1;
    }
    uint64_t t0 = tern_now_ns();
    for (uint32_t i = disk_count(d); i < n_e; i++) {
        char key[32];
        snprintf(key, sizeof key, "conversation-%u", i);
        uint8_t nonce[DISK_NONCE_BYTES];
        bool has = false;
        if (disk_put(d, "", key, nonce, &has, s, NULL, NULL, 0, NULL)) {
            fprintf(stderr, "%s\n", tern_last_error());
            return 1;
        }
    }
    fprintf(stderr, "wrote %u entries in %.1f s\n", n_e, (double)(tern_now_ns() - t0) * 1e-9);
    uint64_t bytes = 0;
    for (size_t i = 0; i < disk_count(d); i++) bytes += disk_at(d, i)->bytes;
    disk_free(d);
    for (int cold = 0; cold < 2; cold++) {
        double best = 1e9;
        for (int rep = 0; rep < 3; rep++) {
            if (cold) drop_pages(dir);
            uint64_t t1 = tern_now_ns();
            if (disk_open(&dp, &d)) return 1;
            double t = (double)(tern_now_ns() - t1) * 1e-9;
            if (t < best) best = t;
            if (disk_count(d) != n_e) {
                fprintf(stderr, "indexed %zu of %u\n", disk_count(d), n_e);
                return 1;
            }
            disk_free(d);
        }
        printf("index rebuild, %u entries of %u tokens (%.1f MiB), %s: best of 3 %.1f ms\n", n_e, n,
               (double)bytes / (1 << 20), cold ? "cold (pages dropped)" : "warm", best * 1e3);
    }
    tern_session_free(s);
    tern_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    int rc = 2;
    if (argc > 1 && !strcmp(argv[1], "state")) rc = bench_state(argc, argv);
    else if (argc > 1 && !strcmp(argv[1], "turn")) rc = bench_turn(argc, argv);
    else if (argc > 1 && !strcmp(argv[1], "index")) rc = bench_index(argc, argv);
    if (rc == 2)
        fprintf(stderr, "usage: bench-disk state MODEL N_TOK N_CKPT DIR [reread]\n"
                        "       bench-disk turn MODEL N_TOK N_ADD DIR\n"
                        "       bench-disk index MODEL N_ENTRIES N_TOK DIR\n");
    return rc;
}
