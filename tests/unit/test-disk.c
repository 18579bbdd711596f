/* cache/disk: the disk tier's file format and index on generated models. A stored
 * conversation restored at any resume point has the state hash of a cold run over the
 * same tokens; a file with any byte flipped, truncated, renamed, of another tenant or
 * state layout is refused (and deleted) or, where the flipped byte is in a block that
 * resume does not read, restores the exact state: never a wrong one, never a crash. */
#include "harness.h"

#include "cache/disk.h"
#include "model/mtp.h"
#include "util/mem.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_TOK 700u
#define KV_PAGE_ROWS 256u /* the disk format's KV_BLOCK */

struct fixture {
    const char *arch;
    const char *flags; /* more mkmodel options */
    char path[512];
    struct tern_model *m;
    bool hybrid;
    int32_t toks[N_TOK];
};

static struct fixture fx_q3 = {.arch = "tiny-qwen3"};
static struct fixture fx_q35 = {.arch = "tiny-qwen35"};
static struct fixture fx_mtp = {.arch = "tiny-qwen35", .flags = "--mtp 1"};

static int fixture_setup(struct fixture *f) {
    snprintf(f->path, sizeof f->path, "%s/%s%s.gguf", th_tmpdir(), f->arch, f->flags ? "-mtp" : "");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' mkmodel --preset %s --n-layer 4 %s --out '%s' >/dev/null", th_tern_bin(), f->arch,
             f->flags ? f->flags : "", f->path);
    if (system(cmd) != 0) return -1;
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = f->path;
    mp.n_threads = 2;
    if (tern_model_load(&mp, &f->m) != TERN_OK) return -1;
    f->hybrid = tern_model_info(f->m)->hybrid;
    uint32_t n_vocab = tern_model_info(f->m)->n_vocab;
    for (uint32_t i = 0; i < N_TOK; i++) f->toks[i] = (int32_t)((i * 2654435761u + 17) % n_vocab);
    return 0;
}

static int setup_q3(void **state) {
    *state = &fx_q3;
    return fx_q3.m ? 0 : fixture_setup(&fx_q3);
}
static int setup_q35(void **state) {
    *state = &fx_q35;
    return fx_q35.m ? 0 : fixture_setup(&fx_q35);
}
static int setup_mtp(void **state) {
    *state = &fx_mtp;
    return fx_mtp.m ? 0 : fixture_setup(&fx_mtp);
}

static struct tern_session_params sparams(void) {
    struct tern_session_params p;
    tern_session_params_default(&p);
    p.n_ctx = 2048;
    p.n_chunk = 64;
    return p;
}

static const uint32_t CK_POS[] = {100, 300, 600};

struct ck_sink {
    struct tern_checkpoint *ck[8];
    size_t n;
};
static void on_ck(void *user, struct tern_checkpoint *c) {
    struct ck_sink *s = user;
    s->ck[s->n++] = c;
}

/* A session over toks[0..N_TOK) with checkpoints at CK_POS (hybrid). */
static struct tern_session *primed(struct fixture *f, struct ck_sink *sink) {
    struct tern_session_params sp = sparams();
    struct tern_session *s;
    assert_int_equal(tern_session_new(f->m, &sp, &s), TERN_OK);
    struct tern_eval_opts o = {.ckpt_pos = CK_POS, .n_ckpt = f->hybrid ? 3 : 0, .on_ckpt = on_ck, .user = sink};
    assert_int_equal(tern_session_eval(s, f->toks, N_TOK, &o), TERN_OK);
    return s;
}

static uint64_t cold_hash(struct fixture *f, uint32_t r) {
    struct tern_session_params sp = sparams();
    struct tern_session *s;
    assert_int_equal(tern_session_new(f->m, &sp, &s), TERN_OK);
    assert_int_equal(tern_session_eval(s, f->toks, r, NULL), TERN_OK);
    uint64_t h = tern_session_hash(s);
    tern_session_free(s);
    return h;
}

static struct disk *open_dir(struct fixture *f, const char *dir, uint64_t max_bytes, enum tern_kv_type kv) {
    struct disk_params p = {.dir = dir, .max_bytes = max_bytes, .model = f->m, .session = sparams()};
    p.session.kv_type = kv;
    struct disk *d = NULL;
    enum tern_status st = disk_open(&p, &d);
    if (st) fail_msg("disk_open %s: %s", dir, tern_last_error());
    return d;
}

static void put(struct disk *d, const char *tenant, const char *key, struct tern_session *s, struct ck_sink *sink) {
    uint8_t nonce[DISK_NONCE_BYTES];
    bool has = false;
    uint32_t kinds[8] = {1, 2, 4};
    enum tern_status st = disk_put(d, tenant, key, nonce, &has, s, sink->ck, kinds, sink->n, NULL);
    if (st) fail_msg("disk_put: %s", tern_last_error());
}

static long find(struct disk *d, const char *key) {
    for (size_t i = 0; i < disk_count(d); i++) {
        const struct disk_entry *e = disk_at(d, i);
        if ((key && e->key && !strcmp(e->key, key)) || (!key && !e->key)) return (long)i;
    }
    return -1;
}

/* Loads entry `key` at r; on success checks the state against a cold run (and that a
 * continuation gives the same state too) and returns true. */
static bool load_check(struct fixture *f, struct disk *d, const char *key, uint32_t r, const char *tenant) {
    long i = find(d, key);
    if (i < 0) return false;
    struct tern_session *s;
    struct tern_checkpoint **cks;
    uint32_t *kinds;
    size_t n;
    if (disk_load(d, (size_t)i, r, tenant, &s, &cks, &kinds, &n, NULL) != TERN_OK) return false;
    assert_int_equal(tern_session_n_past(s), r);
    assert_memory_equal(tern_session_tokens(s), f->toks, r * sizeof(int32_t));
    assert_true(tern_session_hash(s) == cold_hash(f, r));
    for (size_t k = 0; k < n; k++) {
        assert_true(tern_checkpoint_pos(cks[k]) <= r);
        assert_int_equal(kinds[k], 1u << k);
    }
    if (f->hybrid) {
        size_t expect = 0;
        for (size_t k = 0; k < 3; k++) expect += CK_POS[k] <= r;
        assert_int_equal(n, expect);
        /* a checkpoint restored from disk restores like the original */
        if (n) assert_int_equal(tern_session_restore(s, cks[0]), TERN_OK);
        if (n) assert_true(tern_session_hash(s) == cold_hash(f, CK_POS[0]));
    }
    for (size_t k = 0; k < n; k++) tern_checkpoint_free(cks[k]);
    free(cks);
    free(kinds);
    tern_session_free(s);
    return true;
}

static size_t n_entry_files(const char *dir) {
    DIR *dd = opendir(dir);
    if (!dd) return 0;
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(dd)))
        if (strlen(de->d_name) == DISK_NAME_LEN + strlen(DISK_FILE_SUFFIX) && de->d_name[0] != '.') n++;
    closedir(dd);
    return n;
}

static void entry_file(const char *dir, char *out, size_t cap) {
    DIR *dd = opendir(dir);
    assert_non_null(dd);
    struct dirent *de;
    out[0] = 0;
    while ((de = readdir(dd)))
        if (strlen(de->d_name) == DISK_NAME_LEN + strlen(DISK_FILE_SUFFIX) && de->d_name[0] != '.')
            snprintf(out, cap, "%s/%s", dir, de->d_name);
    closedir(dd);
    assert_true(out[0]);
}

static void copy_file(const char *from, const char *to) {
    size_t len;
    char *b = th_read_file(from, &len);
    assert_non_null(b);
    int fd = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b, len), (ssize_t)len);
    close(fd);
    free(b);
}

static void free_sink(struct ck_sink *k) {
    for (size_t i = 0; i < k->n; i++) tern_checkpoint_free(k->ck[i]);
}

static void test_roundtrip(void **state) {
    struct fixture *f = *state;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/rt-%s", th_tmpdir(), f->arch);
    struct ck_sink sink = {0};
    struct tern_session *s = primed(f, &sink);
    struct disk *d = open_dir(f, dir, 1ull << 30, TERN_KV_F16);
    put(d, "tenant-a", "conv", s, &sink);
    disk_free(d);
    /* a restart: the index is rebuilt from the directory */
    d = open_dir(f, dir, 1ull << 30, TERN_KV_F16);
    assert_int_equal(disk_count(d), 1);
    const struct disk_entry *e = disk_at(d, 0);
    assert_string_equal(e->tenant, "tenant-a");
    assert_string_equal(e->key, "conv");
    assert_int_equal(e->n, N_TOK);
    assert_memory_equal(e->tokens, f->toks, sizeof f->toks);
    assert_int_equal(e->n_ckpt, f->hybrid ? 3 : 0);
    /* the live end, every checkpoint, and (attention-only) positions inside a block */
    assert_true(load_check(f, d, "conv", N_TOK, "tenant-a"));
    for (size_t k = 0; f->hybrid && k < 3; k++) assert_true(load_check(f, d, "conv", CK_POS[k], "tenant-a"));
    if (!f->hybrid) {
        assert_true(load_check(f, d, "conv", 333, "tenant-a"));
        assert_true(load_check(f, d, "conv", 256, "tenant-a"));
        assert_true(load_check(f, d, "conv", 1, "tenant-a"));
    } else {
        /* not a resume point of a hybrid file */
        long i = find(d, "conv");
        struct tern_session *x;
        struct tern_checkpoint **c;
        uint32_t *kd;
        size_t n;
        assert_int_equal(disk_load(d, (size_t)i, 333, "tenant-a", &x, &c, &kd, &n, NULL), TERN_ERR_STATE);
    }
    /* another tenant never loads it */
    {
        long i = find(d, "conv");
        struct tern_session *x;
        struct tern_checkpoint **c;
        uint32_t *kd;
        size_t n;
        assert_int_equal(disk_load(d, (size_t)i, N_TOK, "tenant-b", &x, &c, &kd, &n, NULL), TERN_ERR_STATE);
        assert_null(x);
    }
    /* replacing: the same tenant + key is one file */
    put(d, "tenant-a", "conv", s, &sink);
    assert_int_equal(n_entry_files(dir), 1);
    /* an unnamed conversation gets its own (nonce) file */
    put(d, "tenant-a", NULL, s, &sink);
    assert_int_equal(n_entry_files(dir), 2);
    /* a long key: the header outgrows the first read */
    static char longkey[3001];
    memset(longkey, 'k', 3000);
    put(d, "tenant-a", longkey, s, &sink);
    struct disk_stats ds;
    disk_get_stats(d, &ds);
    assert_int_equal(ds.entries, 3);
    assert_int_equal(ds.invalid, 0);
    disk_free(d);
    d = open_dir(f, dir, 1ull << 30, TERN_KV_F16);
    assert_int_equal(disk_count(d), 3);
    assert_true(load_check(f, d, longkey, N_TOK, "tenant-a"));
    disk_free(d);
    /* another KV type is another state layout: refused and deleted */
    d = open_dir(f, dir, 1ull << 30, TERN_KV_F32);
    assert_int_equal(disk_count(d), 0);
    assert_int_equal(n_entry_files(dir), 0);
    disk_get_stats(d, &ds);
    assert_int_equal(ds.invalid, 3);
    disk_free(d);
    free_sink(&sink);
    tern_session_free(s);
}

/* Every sampled byte of a file flipped, every sampled length cut: refused, or (a byte in
 * a block that resume does not read) the exact state. */
static void test_corruption(void **state) {
    struct fixture *f = *state;
    char dir[600], master[700];
    snprintf(dir, sizeof dir, "%s/cor-%s", th_tmpdir(), f->arch);
    struct ck_sink sink = {0};
    struct tern_session *s = primed(f, &sink);
    struct disk *d = open_dir(f, dir, 1ull << 30, TERN_KV_F16);
    put(d, "t", "k", s, &sink);
    disk_free(d);
    free_sink(&sink);
    tern_session_free(s);
    entry_file(dir, master, sizeof master);
    size_t len;
    char *orig = th_read_file(master, &len);
    assert_non_null(orig);
    const char *base = strrchr(master, '/') + 1;
    char secret[700];
    snprintf(secret, sizeof secret, "%s/.secret", dir);
    /* fewest blocks read first: a refused load deletes the file */
    const uint32_t rs_h[] = {300, 600, N_TOK}, rs_a[] = {300, N_TOK};
    const uint32_t *rs = f->hybrid ? rs_h : rs_a;
    size_t n_refused = 0, n_ok = 0;
    for (int round = 0; round < 2; round++) {
        /* round 0: flips at 160 offsets (the whole header byte by byte, then spread);
         * round 1: truncations */
        size_t n_cases = round == 0 ? 160 : 24;
        for (size_t c = 0; c < n_cases; c++) {
            char cdir[700], file[800], sec[800];
            snprintf(cdir, sizeof cdir, "%s/case-%d-%zu", dir, round, c);
            mkdir(cdir, 0700);
            snprintf(sec, sizeof sec, "%s/.secret", cdir);
            copy_file(secret, sec);
            snprintf(file, sizeof file, "%s/%s", cdir, base);
            copy_file(master, file);
            int fd = open(file, O_RDWR);
            assert_true(fd >= 0);
            if (round == 0) {
                size_t off = c < 120 ? c : 120 + (c - 120) * (len - 120) / 40;
                if (off >= len) off = len - 1;
                unsigned char b = (unsigned char)orig[off] ^ 0x10;
                assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
            } else {
                assert_int_equal(ftruncate(fd, (off_t)(c * len / 24)), 0);
            }
            close(fd);
            struct disk *cd = open_dir(f, cdir, 1ull << 30, TERN_KV_F16);
            for (size_t k = 0; k < (f->hybrid ? 3u : 2u); k++) {
                if (load_check(f, cd, "k", rs[k], "t")) n_ok++;
                else n_refused++;
            }
            /* refused files are gone: no second chance, no second log line */
            if (disk_count(cd) == 0) assert_int_equal(n_entry_files(cdir), 0);
            disk_free(cd);
        }
    }
    fprintf(stderr, "%s: %zu loads refused, %zu restored the exact state (bytes a resume does not read)\n", f->arch,
            n_refused, n_ok);
    assert_true(n_refused > 0);
    assert_true(n_ok > 0); /* flips in blocks that a resume at 300 does not read */
    free(orig);
}

/* A file moved under another name (another conversation's, another tenant's): refused. */
static void test_renamed(void **state) {
    struct fixture *f = *state;
    char dir[600], file[700], moved[800];
    snprintf(dir, sizeof dir, "%s/mv-%s", th_tmpdir(), f->arch);
    struct ck_sink sink = {0};
    struct tern_session *s = primed(f, &sink);
    struct disk *d = open_dir(f, dir, 1ull << 30, TERN_KV_F16);
    put(d, "tenant-b", "same-key", s, &sink);
    disk_free(d);
    entry_file(dir, file, sizeof file);
    snprintf(moved, sizeof moved, "%s/%s%s", dir, "0123456789abcdef0123456789abcdef", DISK_FILE_SUFFIX);
    assert_int_equal(rename(file, moved), 0);
    d = open_dir(f, dir, 1ull << 30, TERN_KV_F16);
    assert_int_equal(disk_count(d), 0);
    assert_int_equal(n_entry_files(dir), 0);
    disk_free(d);
    free_sink(&sink);
    tern_session_free(s);
}

/* The budget (LRU over the directory) and two processes' views of one directory. */
static void test_budget_and_peers(void **state) {
    struct fixture *f = *state;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/peers-%s", th_tmpdir(), f->arch);
    struct ck_sink sink = {0};
    struct tern_session *s = primed(f, &sink);
    struct disk *a = open_dir(f, dir, 1ull << 30, TERN_KV_F16);
    put(a, "", "one", s, &sink);
    uint64_t one = disk_at(a, 0)->bytes;
    disk_free(a);
    a = open_dir(f, dir, one * 5 / 2, TERN_KV_F16);
    struct disk *b = open_dir(f, dir, one * 5 / 2, TERN_KV_F16);
    assert_int_equal(disk_count(b), 1);
    put(a, "", "two", s, &sink);
    disk_refresh(b);
    assert_int_equal(disk_count(b), 2);
    assert_true(load_check(f, b, "two", N_TOK, "")); /* b uses a's file; "one" is now the LRU */
    put(b, "", "three", s, &sink);                   /* evicts "one" */
    assert_int_equal(n_entry_files(dir), 2);
    disk_refresh(a);
    assert_int_equal(disk_count(a), 2);
    assert_true(find(a, "one") < 0);
    assert_true(find(a, "two") >= 0 && find(a, "three") >= 0);
    struct disk_stats ds;
    disk_get_stats(b, &ds);
    assert_int_equal(ds.evictions, 1);
    /* a state larger than the whole budget is not written */
    disk_free(a);
    a = open_dir(f, dir, one / 2, TERN_KV_F16);
    uint8_t nonce[DISK_NONCE_BYTES];
    bool has = false;
    assert_int_equal(disk_put(a, "", "big", nonce, &has, s, sink.ck, NULL, sink.n, NULL), TERN_ERR_RANGE);
    disk_free(a);
    disk_free(b);
    free_sink(&sink);
    tern_session_free(s);
}

/* An entry replaced by a FIFO blocked the engine in open() for as long as nobody wrote
 * it (every request stalled): a load now refuses it at once and drops the entry. The
 * load runs on a thread; if it is still blocked after a bounded wait the test opens the
 * FIFO's other end (which frees it) and fails. */
struct fifo_load {
    struct fixture *f;
    struct disk *d;
    long idx;
    atomic_int done;
    enum tern_status st;
    char msg[256]; /* the error message (it is the thread's own) */
};

static void *fifo_load_main(void *arg) {
    struct fifo_load *fl = arg;
    struct tern_session *s = NULL;
    struct tern_checkpoint **cks = NULL;
    uint32_t *kinds = NULL;
    size_t n = 0;
    fl->st = disk_load(fl->d, (size_t)fl->idx, N_TOK, "", &s, &cks, &kinds, &n, NULL);
    if (fl->st) snprintf(fl->msg, sizeof fl->msg, "%s", tern_last_error());
    for (size_t k = 0; k < n; k++) tern_checkpoint_free(cks[k]);
    free(cks);
    free(kinds);
    tern_session_free(s);
    atomic_store(&fl->done, 1);
    return NULL;
}

static void test_fifo_entry(void **state) {
    struct fixture *f = *state;
    char dir[600], file[700];
    snprintf(dir, sizeof dir, "%s/fifo-%s", th_tmpdir(), f->arch);
    struct ck_sink sink = {0};
    struct tern_session *s = primed(f, &sink);
    struct disk *d = open_dir(f, dir, 1ull << 30, TERN_KV_F16);
    put(d, "", "conv", s, &sink);
    entry_file(dir, file, sizeof file);
    assert_int_equal(unlink(file), 0);
    assert_int_equal(mkfifo(file, 0600), 0);
    struct fifo_load fl = {.f = f, .d = d, .idx = find(d, "conv")};
    assert_true(fl.idx >= 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fifo_load_main, &fl), 0);
    for (int i = 0; i < 2000 && !atomic_load(&fl.done); i++) usleep(10000);
    bool blocked = !atomic_load(&fl.done);
    if (blocked) {
        int w = open(file, O_WRONLY | O_NONBLOCK); /* frees the blocked open() */
        pthread_join(t, NULL);
        if (w >= 0) close(w);
        fail_msg("disk_load blocked opening a FIFO");
    }
    pthread_join(t, NULL);
    assert_int_not_equal(fl.st, TERN_OK);
    if (!strstr(fl.msg, "not a regular file")) fail_msg("unexpected error: %s", fl.msg);
    assert_true(find(d, "conv") < 0); /* the entry is dropped */
    disk_free(d);
    /* reopening the directory with the FIFO in it does not block either, and skips it */
    d = open_dir(f, dir, 1ull << 30, TERN_KV_F16);
    assert_int_equal(disk_count(d), 0);
    disk_free(d);
    unlink(file);
    free_sink(&sink);
    tern_session_free(s);
}

static uint64_t write_bytes(struct disk *d) {
    struct disk_stats ds;
    disk_get_stats(d, &ds);
    return ds.write_bytes;
}

/* The next turn of a conversation appends to its file only what the file does not hold:
 * the KV pages and recurrent states past the part both turns share, and a directory. The
 * newest version restores the cold state at every resume point; a torn newest slot or a
 * file cut inside the newest version's blocks restores the version before, exactly; a
 * turn that shares little with the file (a rewrite) writes the file anew. */
static void test_append(void **state) {
    struct fixture *f = *state;
    char dir[600], file[700];
    snprintf(dir, sizeof dir, "%s/app-%s", th_tmpdir(), f->arch);
    const uint32_t n1 = 400;
    struct tern_session_params sp = sparams();
    struct tern_session *s;
    assert_int_equal(tern_session_new(f->m, &sp, &s), TERN_OK);
    struct ck_sink sink = {0};
    struct tern_eval_opts o = {.ckpt_pos = CK_POS, .n_ckpt = f->hybrid ? 2 : 0, .on_ckpt = on_ck, .user = &sink};
    assert_int_equal(tern_session_eval(s, f->toks, n1, &o), TERN_OK);
    struct disk *d = open_dir(f, dir, 1ull << 30, TERN_KV_F16);
    put(d, "t", "k", s, &sink);
    const uint64_t w1 = write_bytes(d);
    entry_file(dir, file, sizeof file);
    struct stat st1;
    assert_int_equal(stat(file, &st1), 0);
    assert_int_equal(w1, (uint64_t)st1.st_size); /* the first version is the whole file */
    /* turn 2: 300 more tokens and (hybrid) a checkpoint at 600 */
    o = (struct tern_eval_opts){.ckpt_pos = CK_POS + 2, .n_ckpt = f->hybrid ? 1 : 0, .on_ckpt = on_ck, .user = &sink};
    assert_int_equal(tern_session_eval(s, f->toks + n1, N_TOK - n1, &o), TERN_OK);
    put(d, "t", "k", s, &sink);
    const uint64_t w2 = write_bytes(d) - w1;
    struct stat st2;
    assert_int_equal(stat(file, &st2), 0);
    assert_true(st2.st_ino == st1.st_ino); /* appended, not replaced */
    /* a fresh file of the same state, for comparison */
    char dir2[700];
    snprintf(dir2, sizeof dir2, "%s/app-full-%s", th_tmpdir(), f->arch);
    struct disk *d2 = open_dir(f, dir2, 1ull << 30, TERN_KV_F16);
    put(d2, "t", "k", s, &sink);
    const uint64_t full = write_bytes(d2);
    disk_free(d2);
    /* it reuses page 0 (256 rows) and the states at 100 and 300 (hybrid) */
    const uint64_t reused = 256ull * tern_state_kv_row_bytes(f->m, TERN_KV_F16) +
                            (f->hybrid ? 2ull * tern_model_info(f->m)->recurrent_bytes : 0);
    fprintf(stderr, "%s: turn 2 wrote %llu bytes, a new file %llu (reused %llu)\n", f->arch, (unsigned long long)w2,
            (unsigned long long)full, (unsigned long long)reused);
    assert_true(w2 + reused <= full);
    const uint32_t rs_h[] = {N_TOK, 600, 300, 100}, rs_a[] = {N_TOK, 450, 300, 1};
    for (size_t k = 0; k < 4; k++) assert_true(load_check(f, d, "k", f->hybrid ? rs_h[k] : rs_a[k], "t"));
    disk_free(d);

    /* the newest slot torn (its seq is the larger: the second slot): the version before */
    char saved[800];
    snprintf(saved, sizeof saved, "%s.saved", file);
    copy_file(file, saved);
    size_t len;
    char *orig = th_read_file(file, &len);
    assert_non_null(orig);
    uint32_t hdr_bytes;
    memcpy(&hdr_bytes, orig + 12, 4);
    const uint64_t slot1 = ((hdr_bytes + 8 + 7) & ~7ull) + 64;
    int fd = open(file, O_RDWR);
    unsigned char b = (unsigned char)orig[slot1 + 9] ^ 0x40;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)(slot1 + 9)), 1);
    close(fd);
    d = open_dir(f, dir, 1ull << 30, TERN_KV_F16);
    assert_true(find(d, "k") >= 0);
    assert_int_equal(disk_at(d, (size_t)find(d, "k"))->n, n1);
    assert_true(load_check(f, d, "k", f->hybrid ? 300 : n1, "t"));
    disk_free(d);
    /* cut inside the newest version's blocks: the version before */
    copy_file(saved, file);
    assert_int_equal(truncate(file, (off_t)(len - 1)), 0);
    d = open_dir(f, dir, 1ull << 30, TERN_KV_F16);
    assert_int_equal(disk_at(d, (size_t)find(d, "k"))->n, n1);
    assert_true(load_check(f, d, "k", f->hybrid ? 100 : 200, "t"));
    /* a rewrite that shares 50 tokens with the file: written anew */
    const uint64_t w_before = write_bytes(d);
    struct tern_session *r;
    assert_int_equal(tern_session_new(f->m, &sp, &r), TERN_OK);
    int32_t other[N_TOK];
    memcpy(other, f->toks, sizeof other);
    for (uint32_t i = 50; i < N_TOK; i++) other[i] = f->toks[N_TOK - 1 - i];
    assert_int_equal(tern_session_eval(r, other, N_TOK, NULL), TERN_OK);
    put(d, "t", "k", r, &(struct ck_sink){0});
    struct stat st3;
    assert_int_equal(stat(file, &st3), 0);
    assert_true(st3.st_ino != st2.st_ino);
    assert_int_equal(write_bytes(d) - w_before, (uint64_t)st3.st_size);
    disk_free(d);
    tern_session_free(r);
    unlink(saved);
    free(orig);
    free_sink(&sink);
    tern_session_free(s);
}

/* The MTP head kept with its conversation: written with it, read back at a resume point
 * with exactly the rows below it (the hash of the head it was written from, rewound
 * there), its pages appended only where their bytes changed. */
static struct tern_mtp *head_over(struct fixture *f, const float *hid, uint32_t base, uint32_t rows, uint32_t shift) {
    struct tern_session_params sp = sparams();
    struct tern_session *ms;
    assert_int_equal(tern_session_new(f->m, &sp, &ms), TERN_OK);
    struct tern_mtp *h = NULL;
    assert_int_equal(tern_mtp_new(ms, &h), TERN_OK);
    const uint32_t n_embd = tern_model_info(f->m)->n_embd;
    /* (shift: fed the hidden states of the positions shift before, as after a resume's gap) */
    assert_int_equal(tern_mtp_eval(h, hid + (size_t)(base - shift) * n_embd, f->toks + base + 1, rows, NULL, NULL),
                     TERN_OK);
    tern_session_free(ms);
    return h;
}

static struct tern_mtp *load_head(struct fixture *f, struct disk *d, uint32_t r, uint32_t *base) {
    struct tern_session *s;
    struct tern_checkpoint **cks;
    uint32_t *kinds;
    size_t n;
    struct disk_mtp hm = {0};
    assert_int_equal(disk_load(d, (size_t)find(d, "k"), r, "t", &s, &cks, &kinds, &n, &hm), TERN_OK);
    assert_true(tern_session_hash(s) == cold_hash(f, r));
    for (size_t k = 0; k < n; k++) tern_checkpoint_free(cks[k]);
    free(cks);
    free(kinds);
    tern_session_free(s);
    *base = hm.base;
    return hm.h;
}

static void test_mtp_head(void **state) {
    struct fixture *f = *state;
    const uint32_t n_embd = tern_model_info(f->m)->n_embd;
    const size_t row = tern_mtp_kv_row_bytes(f->m, TERN_KV_F16);
    assert_true(row > 0);
    /* the main model's hidden states over the whole token list */
    float *hid = tern_malloc((size_t)N_TOK * n_embd * sizeof(float));
    assert_non_null(hid);
    struct tern_session_params sp = sparams();
    struct ck_sink sink = {0};
    struct tern_session *s;
    assert_int_equal(tern_session_new(f->m, &sp, &s), TERN_OK);
    tern_session_capture_hidden(s, hid, 0);
    struct tern_eval_opts o = {.ckpt_pos = CK_POS, .n_ckpt = 3, .on_ckpt = on_ck, .user = &sink};
    assert_int_equal(tern_session_eval(s, f->toks, N_TOK, &o), TERN_OK);
    tern_session_capture_hidden(s, NULL, 0);

    char dir[600];
    snprintf(dir, sizeof dir, "%s/mtp-%s", th_tmpdir(), f->arch);
    struct disk *d = open_dir(f, dir, 1ull << 30, TERN_KV_F16);
    const uint32_t base = 5, rows1 = 400, rows2 = N_TOK - 1 - base; /* 694: pages of 256, 256, 182 */
    struct tern_mtp *h1 = head_over(f, hid, base, rows1, 0);
    uint8_t nonce[DISK_NONCE_BYTES];
    bool has = false;
    uint32_t kinds[8] = {1, 2, 4};
    assert_int_equal(disk_put(d, "t", "k", nonce, &has, s, sink.ck, kinds, sink.n, &(struct disk_mtp){h1, base}),
                     TERN_OK);
    uint32_t b = 0;
    struct tern_mtp *got = load_head(f, d, N_TOK, &b);
    assert_non_null(got);
    assert_int_equal(b, base);
    assert_int_equal(tern_mtp_n_past(got), rows1);
    assert_true(tern_mtp_hash(got) == tern_mtp_hash(h1));
    tern_mtp_free(got);

    /* the next version: the head's first page is the file's already, the rest is appended */
    struct tern_mtp *h2 = head_over(f, hid, base, rows2, 0);
    const uint64_t w0 = write_bytes(d);
    assert_int_equal(disk_put(d, "t", "k", nonce, &has, s, sink.ck, kinds, sink.n, &(struct disk_mtp){h2, base}),
                     TERN_OK);
    const uint64_t wrote = write_bytes(d) - w0;
    assert_true(wrote >= (uint64_t)(rows2 - KV_PAGE_ROWS) * row);
    assert_true(wrote < (uint64_t)rows2 * row);
    got = load_head(f, d, N_TOK, &b);
    assert_non_null(got);
    assert_int_equal(tern_mtp_n_past(got), rows2);
    assert_true(tern_mtp_hash(got) == tern_mtp_hash(h2));
    /* ... and it goes on like the head it was written from */
    int32_t t1[2] = {f->toks[3], f->toks[9]};
    assert_int_equal(tern_mtp_eval(got, hid, t1, 2, NULL, NULL), TERN_OK);
    assert_int_equal(tern_mtp_eval(h2, hid, t1, 2, NULL, NULL), TERN_OK);
    assert_true(tern_mtp_hash(got) == tern_mtp_hash(h2));
    assert_memory_equal(tern_mtp_logits(got), tern_mtp_logits(h2), tern_model_info(f->m)->n_vocab * sizeof(float));
    tern_mtp_free(got);

    /* at a checkpoint: the rows of main positions below r - 1 */
    got = load_head(f, d, 300, &b);
    assert_non_null(got);
    assert_int_equal(tern_mtp_n_past(got), 300 - 1 - base);
    assert_int_equal(tern_mtp_rewind(h2, 300 - 1 - base), TERN_OK);
    assert_true(tern_mtp_hash(got) == tern_mtp_hash(h2));
    tern_mtp_free(got);

    /* a version without a head, then one whose head starts elsewhere: nothing stale comes back */
    assert_int_equal(disk_put(d, "t", "k", nonce, &has, s, sink.ck, kinds, sink.n, NULL), TERN_OK);
    assert_null(load_head(f, d, N_TOK, &b));
    struct tern_mtp *h3 = head_over(f, hid, base + 1, rows2 - 1, 0);
    assert_int_equal(disk_put(d, "t", "k", nonce, &has, s, sink.ck, kinds, sink.n, &(struct disk_mtp){h3, base + 1}),
                     TERN_OK);
    got = load_head(f, d, N_TOK, &b);
    assert_int_equal(b, base + 1);
    assert_true(tern_mtp_hash(got) == tern_mtp_hash(h3));
    tern_mtp_free(got);
    /* the same place and tokens, other rows (fed other hidden states): its bytes decide */
    struct tern_mtp *h4 = head_over(f, hid, base + 1, rows2 - 1, 1);
    assert_true(tern_mtp_hash(h4) != tern_mtp_hash(h3));
    assert_int_equal(disk_put(d, "t", "k", nonce, &has, s, sink.ck, kinds, sink.n, &(struct disk_mtp){h4, base + 1}),
                     TERN_OK);
    got = load_head(f, d, N_TOK, &b);
    assert_true(tern_mtp_hash(got) == tern_mtp_hash(h4));
    tern_mtp_free(got);
    tern_mtp_free(h4);
    /* a reader that does not ask for the head is served as before */
    assert_true(load_check(f, d, "k", 600, "t"));
    disk_free(d);
    tern_mtp_free(h1);
    tern_mtp_free(h2);
    tern_mtp_free(h3);
    free_sink(&sink);
    tern_session_free(s);
    free(hid);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_roundtrip, setup_q35),
        cmocka_unit_test_setup(test_roundtrip, setup_q3),
        cmocka_unit_test_setup(test_corruption, setup_q35),
        cmocka_unit_test_setup(test_corruption, setup_q3),
        cmocka_unit_test_setup(test_renamed, setup_q35),
        cmocka_unit_test_setup(test_budget_and_peers, setup_q3),
        cmocka_unit_test_setup(test_fifo_entry, setup_q3),
        cmocka_unit_test_setup(test_append, setup_q35),
        cmocka_unit_test_setup(test_append, setup_q3),
        cmocka_unit_test_setup(test_mtp_head, setup_mtp),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tern_model_free(fx_q3.m);
    tern_model_free(fx_q35.m);
    tern_model_free(fx_mtp.m);
    return rc;
}
