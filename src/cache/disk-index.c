/* The disk tier's index of a directory (disk-impl.h): entries, scans, the directory's
 * lock and generation counter, open and close. */
#include "cache/disk-impl.h"
#include "model/mtp.h"

/* ---- the index ---------------------------------------------------------------------- */

void dk_entry_free(struct disk_entry *e) {
    if (!e) return;
    free(e->tenant);
    free(e->key);
    free(e->tokens);
    free(e->ckpt_pos);
    free(e->ckpt_kinds);
    fp_free(&e->fp);
    free(e);
}

long dk_find_entry(const struct disk *d, const char *name) {
    for (size_t i = 0; i < d->n; i++)
        if (!strcmp(d->e[i]->name, name)) return (long)i;
    return -1;
}

void dk_index_drop(struct disk *d, size_t i) {
    d->total_bytes -= d->e[i]->bytes;
    dk_entry_free(d->e[i]);
    memmove(d->e + i, d->e + i + 1, (d->n - i - 1) * sizeof *d->e);
    d->n--;
}

static int by_recency(const void *a, const void *b) {
    const struct disk_entry *x = *(struct disk_entry *const *)a, *y = *(struct disk_entry *const *)b;
    if (x->last_used != y->last_used) return x->last_used > y->last_used ? -1 : 1;
    return strcmp(x->name, y->name);
}

void dk_index_sort(struct disk *d) {
    if (d->n > 1) qsort(d->e, d->n, sizeof *d->e, by_recency);
}

/* Inserts e (replacing an entry of the same name when replace; a directory scan appends
 * and drops the replaced entry afterwards, as it was not seen). On allocation failure e
 * is freed: the file stays on disk and the next scan indexes it. */
void dk_index_put(struct disk *d, struct disk_entry *e, bool replace) {
    if (replace) {
        long i = dk_find_entry(d, e->name);
        if (i >= 0) dk_index_drop(d, (size_t)i);
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 64;
        struct disk_entry **p = tern_reallocarray(d->e, cap, sizeof *p);
        if (!p) {
            dk_entry_free(e);
            return;
        }
        d->e = p;
        d->cap = cap;
    }
    d->e[d->n++] = e;
    d->total_bytes += e->bytes;
}

/* The directory's advisory lock through io's descriptor: it excludes peers and the
 * other io of this process. Never taken with d->mu held (lock order). */
bool dk_dir_lock(struct disk_io *io) {
    while (flock(io->lock_fd, LOCK_EX)) {
        if (errno == EINTR) continue;
        return false;
    }
    return true;
}

void dk_dir_unlock(struct disk_io *io) { flock(io->lock_fd, LOCK_UN); }

/* The generation counter goes up by one per change, under the directory's lock (a lost
 * increment would hide a peer's change) and d->mu. One increment announces every change
 * since the last (peers re-read the directory on any change), so a change made without
 * the lock (gen_dirty) is counted by the next holder's. */
void dk_bump_gen_locked(struct disk *d) {
    uint64_t g = 0;
    if (pread(d->gen_fd, &g, sizeof g, 0) != (ssize_t)sizeof g) g = 0;
    g++;
    if (pwrite(d->gen_fd, &g, sizeof g, 0) != (ssize_t)sizeof g) {
        TERN_LOG_WARN("disk tier: updating %s/.gen: %s (peers may miss this change until their next scan)", d->dir,
                      strerror(errno));
        return;
    }
    if (d->gen + 1 == g) d->gen = g; /* only our own change since the last scan: nothing new to read */
    d->gen_dirty = false;
}

/* Counts the changes noted by gen_dirty when the lock is free now (the worker never
 * waits for it here: the writer may hold it for a whole write, and counts them then). */
void dk_gen_flush(struct disk *d) {
    if (!d->gen_dirty) return;
    if (flock(d->io.lock_fd, LOCK_EX | LOCK_NB)) return;
    pthread_mutex_lock(&d->mu);
    if (d->gen_dirty) dk_bump_gen_locked(d);
    pthread_mutex_unlock(&d->mu);
    flock(d->io.lock_fd, LOCK_UN);
}

uint64_t dk_read_gen(const struct disk *d) {
    uint64_t g = 0;
    if (pread(d->gen_fd, &g, sizeof g, 0) != (ssize_t)sizeof g) return 0;
    return g;
}

/* Deletes a file that did not verify: logged once (the file is gone afterwards). */
void dk_invalidate(struct disk *d, const char *name, const char *why) {
    char fn[DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX];
    dk_file_of(name, fn);
    TERN_LOG_WARN("disk tier: deleting %s/%s: %s (it costs a cold prime, never a wrong resume)", d->dir, fn, why);
    if (unlinkat(d->dir_fd, fn, 0) && errno != ENOENT)
        TERN_LOG_WARN("disk tier: cannot delete %s/%s: %s", d->dir, fn, strerror(errno));
    if (!d->scanning) {
        long i = dk_find_entry(d, name);
        if (i >= 0) dk_index_drop(d, (size_t)i);
    }
    d->st.invalid++;
    d->gen_dirty = true; /* counted in .gen by dk_gen_flush or the next write */
}

/* Indexes the file `name` (open as fd, stat st). Returns false when it was invalid
 * (and deleted). */
static bool index_file(struct disk *d, const char *name, int fd, const struct stat *st) {
    struct head hd;
    char why[192];
    if (!dk_read_head(fd, (uint64_t)st->st_size, false, &hd, why, sizeof why) || !dk_head_matches(d, name, &hd, why, sizeof why)) {
        dk_head_free(&hd);
        dk_invalidate(d, name, why);
        return false;
    }
    struct disk_entry *e = dk_entry_from_head(d, name, &hd, st);
    if (e) dk_index_put(d, e, false);
    return true; /* (without memory: not invalid, retried at the next scan) */
}

/* Temporary files: ".tmp-<host>-<pid>-<seq>". */
static void maybe_remove_tmp(struct disk *d, const char *fn, const struct stat *st) {
    char host[64];
    int pid = 0;
    unsigned seq = 0;
    if (sscanf(fn, ".tmp-%63[^-]-%d-%u", host, &pid, &seq) != 3) return;
    bool dead = false;
    if (!strcmp(host, d->host) && pid > 0 && pid != getpid()) dead = kill(pid, 0) && errno == ESRCH;
    if (dk_now_ns() - dk_ts_ns(&st->st_mtim) > STALE_TMP_NS) dead = true;
    if (!dead) return;
    TERN_LOG_INFO("disk tier: removing %s/%s (a write that never completed)", d->dir, fn);
    unlinkat(d->dir_fd, fn, 0);
}

/* openat() for the directory's files: non-blocking, so that a FIFO (or a device) put
 * where a file should be cannot block the engine in open() (a FIFO nobody writes
 * stalled every request for as long as it stayed there), and regular files only: any
 * other kind is closed and refused with errno EINVAL. The descriptor is then made
 * blocking again (reads of a regular file never wait on a peer anyway). */
int dk_open_regular(int dir_fd, const char *fn, int flags, mode_t mode) {
    int fd = openat(dir_fd, fn, flags | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

#define SCAN_BATCH 64

static void index_batch(struct disk *d, int *fds, char (*names)[DISK_NAME_LEN + 1], size_t *n) {
    for (size_t i = 0; i < *n; i++) {
        struct stat fst;
        if (!fstat(fds[i], &fst)) index_file(d, names[i], fds[i], &fst);
        close(fds[i]);
    }
    *n = 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(struct disk_entry *const *)a)->name, (*(struct disk_entry *const *)b)->name);
}

/* Re-reads the directory: new and replaced files are indexed, vanished ones dropped,
 * unchanged ones (same inode, size and mtime) kept as they are. Lookups go through a
 * sorted snapshot of the index, so that 10,000 entries cost 10,000 binary searches. */
void dk_scan(struct disk *d, bool at_open) {
    uint64_t gen = dk_read_gen(d);
    int fd = dup(d->dir_fd);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        if (fd >= 0) close(fd);
        TERN_LOG_WARN("disk tier: reading %s: %s", d->dir, strerror(errno));
        return;
    }
    rewinddir(dir);
    d->scanning = true;
    for (size_t i = 0; i < d->n; i++) d->e[i]->seen = false;
    size_t n_snap = d->n;
    struct disk_entry **snap = n_snap ? tern_malloc(n_snap * sizeof *snap) : NULL;
    if (snap) {
        memcpy(snap, d->e, n_snap * sizeof *snap);
        qsort(snap, n_snap, sizeof *snap, by_name);
    } else {
        n_snap = 0;
    }
    int batch_fd[SCAN_BATCH];
    char batch_name[SCAN_BATCH][DISK_NAME_LEN + 1];
    size_t n_batch = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        const char *fn = de->d_name;
        struct stat st;
        if (fn[0] == '.') {
            if (at_open && !strncmp(fn, ".tmp-", 5) && !fstatat(d->dir_fd, fn, &st, AT_SYMLINK_NOFOLLOW))
                maybe_remove_tmp(d, fn, &st);
            continue;
        }
        if (!dk_is_entry_name(fn)) continue;
        if (fstatat(d->dir_fd, fn, &st, AT_SYMLINK_NOFOLLOW)) continue; /* deleted meanwhile */
        char name[DISK_NAME_LEN + 1];
        memcpy(name, fn, DISK_NAME_LEN);
        name[DISK_NAME_LEN] = 0;
        if (!S_ISREG(st.st_mode)) {
            dk_invalidate(d, name, "not a regular file");
            continue;
        }
        struct disk_entry key_e, *key_p = &key_e, **hit = NULL;
        memcpy(key_e.name, name, sizeof name);
        if (n_snap) hit = bsearch(&key_p, snap, n_snap, sizeof *snap, by_name);
        if (hit) {
            struct disk_entry *e = *hit;
            if (e->ino == (uint64_t)st.st_ino && e->bytes == (uint64_t)st.st_size &&
                e->mtime_ns == dk_ts_ns(&st.st_mtim)) {
                uint64_t at = dk_ts_ns(&st.st_atim);
                if (at > e->last_used) e->last_used = at; /* a peer used it */
                e->seen = true;
                continue;
            }
        }
        int ffd = dk_open_regular(d->dir_fd, fn, O_RDONLY, 0);
        if (ffd < 0) continue;
        /* Files are read in batches whose first pages were all asked for at once: from a
         * cold cache the device then serves them in parallel, not one seek at a time. */
        posix_fadvise(ffd, 0, HEAD_READ, POSIX_FADV_WILLNEED);
        batch_fd[n_batch] = ffd;
        memcpy(batch_name[n_batch++], name, sizeof name);
        if (n_batch == SCAN_BATCH) index_batch(d, batch_fd, batch_name, &n_batch);
    }
    index_batch(d, batch_fd, batch_name, &n_batch);
    closedir(dir);
    free(snap);
    d->scanning = false;
    /* vanished files, and the old versions of replaced ones */
    size_t k = 0;
    for (size_t i = 0; i < d->n; i++) {
        if (d->e[i]->seen) {
            d->e[k++] = d->e[i];
        } else {
            d->total_bytes -= d->e[i]->bytes;
            dk_entry_free(d->e[i]);
        }
    }
    d->n = k;
    dk_index_sort(d);
    d->gen = gen;
    d->scanned = true;
}

void disk_lock(struct disk *d) { pthread_mutex_lock(&d->mu); }
void disk_unlock(struct disk *d) { pthread_mutex_unlock(&d->mu); }

void disk_refresh(struct disk *d) {
    pthread_mutex_lock(&d->mu);
    if (!d->scanned || dk_read_gen(d) != d->gen) dk_scan(d, false);
    if (!d->wscanned || dk_read_wgen(d) != d->wgen) dk_scan_wip(d);
    pthread_mutex_unlock(&d->mu);
    dk_gen_flush(d);
}

size_t disk_count(struct disk *d) {
    pthread_mutex_lock(&d->mu);
    size_t n = d->n;
    pthread_mutex_unlock(&d->mu);
    return n;
}

const struct disk_entry *disk_at(struct disk *d, size_t i) {
    pthread_mutex_lock(&d->mu);
    const struct disk_entry *e = i < d->n ? d->e[i] : NULL;
    pthread_mutex_unlock(&d->mu);
    return e;
}

void disk_get_stats(struct disk *d, struct disk_stats *out) {
    pthread_mutex_lock(&d->mu);
    *out = d->st;
    out->bytes = d->total_bytes;
    out->entries = (uint32_t)d->n;
    pthread_mutex_unlock(&d->mu);
}

/* ---- open ---------------------------------------------------------------------------- */

static enum tern_status load_secret(struct disk *d) {
    int fd = dk_open_regular(d->dir_fd, ".secret", O_RDONLY, 0);
    if (fd < 0 && errno == ENOENT) {
        /* First use: create it under the lock, so that two replicas starting together
         * agree on one secret (the second finds the first's). */
        if (flock(d->io.lock_fd, LOCK_EX)) return tern_errorf(TERN_ERR_IO, "disk tier: locking %s/.lock: %s", d->dir, strerror(errno));
        fd = dk_open_regular(d->dir_fd, ".secret", O_RDONLY, 0);
        if (fd < 0 && errno == ENOENT) {
            uint8_t s[SECRET_BYTES];
            size_t got = 0;
            while (got < sizeof s) {
                ssize_t r = getrandom(s + got, sizeof s - got, 0);
                if (r < 0 && errno == EINTR) continue;
                if (r < 0) {
                    flock(d->io.lock_fd, LOCK_UN);
                    return tern_errorf(TERN_ERR_IO, "disk tier: getrandom: %s", strerror(errno));
                }
                got += (size_t)r;
            }
            int w = dk_open_regular(d->dir_fd, ".secret.tmp", O_WRONLY | O_CREAT | O_TRUNC, 0600);
            enum tern_status st = w < 0 ? tern_errorf(TERN_ERR_IO, "creating %s/.secret: %s", d->dir, strerror(errno))
                                        : dk_write_all(w, s, sizeof s, ".secret");
            if (!st && fsync(w)) st = tern_errorf(TERN_ERR_IO, "fsync %s/.secret: %s", d->dir, strerror(errno));
            if (w >= 0) close(w);
            if (!st && renameat(d->dir_fd, ".secret.tmp", d->dir_fd, ".secret"))
                st = tern_errorf(TERN_ERR_IO, "renaming %s/.secret: %s", d->dir, strerror(errno));
            if (!st) fsync(d->dir_fd);
            flock(d->io.lock_fd, LOCK_UN);
            if (st) return tern_error_prefix(st, "disk tier");
            memcpy(d->secret, s, sizeof s);
            TERN_LOG_INFO("disk tier: created the name secret %s/.secret (0600)", d->dir);
            return TERN_OK;
        }
        flock(d->io.lock_fd, LOCK_UN);
    }
    if (fd < 0)
        return tern_errorf(TERN_ERR_IO, "disk tier: opening %s/.secret: %s", d->dir,
                           errno == EINVAL ? "not a regular file" : strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || st.st_size != SECRET_BYTES) {
        close(fd);
        return tern_errorf(TERN_ERR_FORMAT, "disk tier: %s/.secret is not %d bytes: remove the directory's files to start over",
                           d->dir, SECRET_BYTES);
    }
    if (st.st_mode & 077)
        TERN_LOG_WARN("disk tier: %s/.secret is readable by others (mode %03o): file names can be linked to keys",
                      d->dir, (unsigned)(st.st_mode & 0777));
    int r = dk_read_at(fd, d->secret, SECRET_BYTES, 0);
    close(fd);
    if (r != 1) return tern_errorf(TERN_ERR_IO, "disk tier: reading %s/.secret", d->dir);
    return TERN_OK;
}

/* The layout of this server's files: the state layout and the device that computes the
 * states. Resumed equals cold within a backend, bit for bit (DESIGN.md §7), not across
 * them (nor across two GPUs), so a file written on another device reads as another layout:
 * a directory serves replicas of one model on one kind of device. "cpu" is one device
 * (every CPU path gives the same bits); a Vulkan device is named by its name, not its
 * index ("vulkan:N 'name'"). */
static uint64_t device_layout(uint64_t layout, const char *device) {
    if (!strncmp(device, "vulkan:", 7)) {
        device += 7;
        while (*device >= '0' && *device <= '9') device++;
    }
    if (!strcmp(device, "cpu")) return layout; /* the files CPU servers wrote before stay valid */
    return XXH3_64bits_withSeed(device, strlen(device), layout);
}

enum tern_status disk_open(const struct disk_params *p, struct disk **out) {
    *out = NULL;
    if (!p->dir || !*p->dir) return tern_errorf(TERN_ERR_INVALID, "disk tier: no directory given");
    struct disk *d = tern_calloc(1, sizeof *d);
    if (!d) return tern_errorf(TERN_ERR_NOMEM, "disk tier: out of memory");
    d->dir_fd = d->io.lock_fd = d->gen_fd = d->wlock_fd = -1;
    pthread_mutex_init(&d->wmu, NULL);
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&d->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    d->dir = tern_strdup(p->dir);
    d->max_bytes = p->max_bytes;
    d->model = p->model;
    d->sp = p->session;
    d->sep = p->sep;
    d->test_delay_ms = p->test_block_delay_ms;
    enum tern_status st = TERN_OK;
    if (!d->dir) {
        st = tern_errorf(TERN_ERR_NOMEM, "disk tier: out of memory");
        goto fail;
    }
    if (mkdir(d->dir, 0700) && errno != EEXIST) {
        st = tern_errorf(TERN_ERR_IO, "disk tier: creating %s: %s", d->dir, strerror(errno));
        goto fail;
    }
    d->dir_fd = open(d->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d->dir_fd < 0) {
        st = tern_errorf(TERN_ERR_IO, "disk tier: opening %s: %s", d->dir, strerror(errno));
        goto fail;
    }
    {
        /* whoever may write the directory may put a FIFO or a forged file in it */
        struct stat dst;
        if (!fstat(d->dir_fd, &dst) && (dst.st_mode & (S_IWGRP | S_IWOTH)))
            TERN_LOG_WARN("disk tier: %s is writable by %s (mode %03o): other users can replace its files; "
                          "chmod 700 it", d->dir, dst.st_mode & S_IWOTH ? "everyone" : "its group",
                          (unsigned)(dst.st_mode & 0777));
    }
    d->io.lock_fd = dk_open_regular(d->dir_fd, ".lock", O_RDWR | O_CREAT, 0600);
    d->gen_fd = dk_open_regular(d->dir_fd, ".gen", O_RDWR | O_CREAT, 0600);
    d->wlock_fd = dk_open_regular(d->dir_fd, ".wiplock", O_RDWR | O_CREAT, 0600);
    if (d->io.lock_fd < 0 || d->gen_fd < 0 || d->wlock_fd < 0) {
        st = tern_errorf(TERN_ERR_IO, "disk tier: opening %s/.lock, .gen and .wiplock: %s", d->dir,
                         errno == EINVAL ? "not a regular file" : strerror(errno));
        goto fail;
    }
    if ((st = load_secret(d))) goto fail;
    if (gethostname(d->host, sizeof d->host)) snprintf(d->host, sizeof d->host, "host");
    d->host[sizeof d->host - 1] = 0;
    for (char *c = d->host; *c; c++)
        if (*c == '-' || *c == '/') *c = '_';
    d->model_id = tern_model_identity(p->model);
    d->layout = device_layout(tern_state_layout(p->model, p->session.kv_type), tern_model_device(p->model));
    d->rec_bytes = tern_model_info(p->model)->recurrent_bytes;
    d->hybrid = tern_model_info(p->model)->hybrid;
    d->kv_row_bytes = tern_state_kv_row_bytes(p->model, p->session.kv_type);
    d->mtp_row_bytes = tern_mtp_kv_row_bytes(p->model, p->session.kv_type);
    uint64_t t0 = tern_now_ns();
    pthread_mutex_lock(&d->mu);
    dk_scan(d, true);
    dk_scan_wip(d);
    pthread_mutex_unlock(&d->mu);
    dk_gen_flush(d);
    TERN_LOG_INFO("disk tier: %s: %zu conversations, %.1f MiB of %.1f MiB, indexed in %.1f ms", d->dir, d->n,
                  (double)d->total_bytes / (1 << 20), (double)d->max_bytes / (1 << 20),
                  (double)(tern_now_ns() - t0) * 1e-6);
    *out = d;
    return TERN_OK;
fail:
    disk_free(d);
    return st;
}

void disk_free(struct disk *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n; i++) dk_entry_free(d->e[i]);
    free(d->e);
    while (d->own) disk_mark_end(d, d->own); /* (the cache ends its own first) */
    dk_wip_clear(d);
    free(d->w);
    if (d->wlock_fd >= 0) close(d->wlock_fd);
    if (d->dir_fd >= 0) close(d->dir_fd);
    if (d->io.lock_fd >= 0) close(d->io.lock_fd);
    if (d->gen_fd >= 0) close(d->gen_fd);
    tern_aligned_free(d->io.buf);
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->wmu);
    free(d->dir);
    free(d);
}

enum tern_status disk_io_new(struct disk *d, struct disk_io **out) {
    *out = NULL;
    struct disk_io *io = tern_calloc(1, sizeof *io);
    if (!io) return tern_errorf(TERN_ERR_NOMEM, "disk tier: out of memory");
    io->lock_fd = dk_open_regular(d->dir_fd, ".lock", O_RDWR | O_CREAT, 0600);
    if (io->lock_fd < 0) {
        enum tern_status st = tern_errorf(TERN_ERR_IO, "disk tier: opening %s/.lock: %s", d->dir, strerror(errno));
        free(io);
        return st;
    }
    *out = io;
    return TERN_OK;
}

void disk_io_free(struct disk_io *io) {
    if (!io) return;
    close(io->lock_fd);
    tern_aligned_free(io->buf);
    free(io);
}

enum tern_status disk_nonce_new(uint8_t nonce[DISK_NONCE_BYTES]) {
    size_t got = 0;
    while (got < DISK_NONCE_BYTES) {
        ssize_t r = getrandom(nonce + got, DISK_NONCE_BYTES - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return tern_errorf(TERN_ERR_IO, "disk tier: getrandom: %s", strerror(errno));
        got += (size_t)r;
    }
    return TERN_OK;
}

void dk_remove_file(struct disk *d, size_t i, const char *why) {
    char fn[DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX];
    dk_file_of(d->e[i]->name, fn);
    TERN_LOG_INFO("disk tier: removed %s (%u tokens, %llu bytes): %s", fn, d->e[i]->n,
                  (unsigned long long)d->e[i]->bytes, why);
    if (unlinkat(d->dir_fd, fn, 0) && errno != ENOENT)
        TERN_LOG_WARN("disk tier: cannot delete %s/%s: %s", d->dir, fn, strerror(errno));
    dk_index_drop(d, i);
}

void disk_remove(struct disk *d, const char *name) {
    if (!dk_dir_lock(&d->io)) return;
    pthread_mutex_lock(&d->mu);
    long i = dk_find_entry(d, name);
    if (i >= 0) {
        dk_remove_file(d, (size_t)i, "removed");
        dk_bump_gen_locked(d);
    }
    pthread_mutex_unlock(&d->mu);
    dk_dir_unlock(&d->io);
}

