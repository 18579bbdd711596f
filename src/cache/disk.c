/* The disk tier (disk.h, DESIGN.md §9).
 *
 * File layout (native byte order; the state layout hash covers the byte order):
 *
 *   struct file_hdr (96 bytes), tenant bytes, key bytes, u64 checksum   (never rewritten)
 *   two version slots (struct slot, 64 bytes each)
 *   blocks, appended: KV pages (KV_BLOCK positions each, as tern_session_kv_export
 *   writes them), recurrent states (hybrid models), and per version a directory: the
 *   token list, checkpoint positions and kinds, and a reference (offset, checksum) to
 *   each block the version uses
 *
 * Each block is its payload followed by a u64 xxh3 seeded with the header checksum
 * and what the block is, so that a block copied from another file or named as another
 * thing in this one does not verify. The versions section below says how a turn is
 * appended and how readers pick a version. A resume at r reads the header, the slots,
 * the directory, one recurrent block and the KV pages below r only.
 *
 * A write in flight is announced by a marker, NAME.wip: a header (reserved = 1, its
 * counts those of the version) and the token block right after it, nothing else. */
#define XXH_STATIC_LINKING_ONLY
#include "cache/disk.h"

#include "util/hash.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timeutil.h"

#include <dirent.h>
#include <stddef.h>
#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define FILE_MAGIC "TERNDSK1"
#define FILE_VERSION 2u
#define SECRET_BYTES 192 /* >= XXH3_SECRET_SIZE_MIN */
#define MAX_STR 4096u
#define MAX_TOKENS (1u << 24)
#define MAX_CKPT 4096u
#define HEAD_READ 4096u /* the first read: the header and a short token list; the rest of a longer one follows */
/* Positions per KV block: a resume at r reads the blocks below r only. */
#define KV_BLOCK 256u
/* A temporary file of a process that is not running (or of another host, older than
 * this) is a write that died: removed at open. */
#define STALE_TMP_NS (24ull * 3600 * 1000000000ull)
#define WIP_SUFFIX ".wip"
#define HDR_WIP 1u /* file_hdr.reserved of a marker */

struct file_hdr {
    char magic[8];
    uint32_t version;
    uint32_t hdr_bytes;   /* sizeof(struct file_hdr) + tenant_len + key_len */
    uint64_t model_id;
    uint64_t layout;
    uint64_t created_ns;
    uint32_t n_tokens;
    uint32_t n_ckpt;
    uint64_t rec_bytes;
    uint64_t kv_row_bytes;
    uint32_t named;
    uint32_t tenant_len;
    uint32_t key_len;
    uint32_t reserved;
    uint8_t nonce[DISK_NONCE_BYTES];
};
_Static_assert(sizeof(struct file_hdr) == 96, "the file header is 96 bytes on disk");

/* What one thread needs to write (disk.h): a descriptor of DIR/.lock of its own (flock
 * locks of two descriptors exclude each other, so the writer thread and the worker do
 * too, as peers do) and a KV page buffer. */
struct disk_io {
    int lock_fd;
    uint8_t *buf;              /* one KV page's rows / a recurrent block */
    size_t buf_cap;
};

struct disk {
    char *dir;
    int dir_fd, gen_fd;
    /* The index and everything below it but io: disk_put takes it only for index work
     * (refresh, budget, index_put), never while it writes, fsyncs or waits for the
     * directory's lock; the cache holds it (disk_lock) from its decision to the load.
     * Recursive: the public calls take it too. Lock order: DIR/.lock, then mu. */
    pthread_mutex_t mu;
    struct disk_io io;         /* the engine worker's: disk_load, disk_put, disk_remove */
    uint64_t max_bytes;
    struct tern_model *model;
    struct tern_session_params sp;
    const struct fp_separators *sep;
    unsigned test_delay_ms;
    uint64_t model_id, layout;
    size_t rec_bytes, kv_row_bytes;
    bool hybrid;
    uint8_t secret[SECRET_BYTES];
    uint64_t gen;              /* the generation counter at the last scan */
    /* Writes in flight (disk.h): peers' markers (and ours), rebuilt when the marker
     * counter (.gen's second word, bumped under DIR/.wiplock and wmu) moves. */
    int wlock_fd;
    pthread_mutex_t wmu;
    uint64_t wgen;
    bool wscanned;
    struct disk_entry **w;
    size_t n_w, cap_w;
    struct disk_mark *own;     /* this process's markers (wmu) */
    bool scanned;
    bool scanning;             /* the index is being rebuilt: entries are dropped at its end */
    bool gen_dirty;            /* a change (an invalid file deleted) not counted in .gen yet */
    struct disk_entry **e;     /* the index, most recently used first */
    size_t n, cap;
    uint64_t total_bytes;
    unsigned tmp_seq;
    char host[64];
    struct disk_stats st;
};

static void scan_wip(struct disk *d);
static void wip_clear(struct disk *d);
static uint64_t read_wgen(const struct disk *d);

/* ---- small helpers --------------------------------------------------------------------- */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t ts_ns(const struct timespec *ts) { return (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec; }

static uint64_t block_sum(const void *p, size_t n, uint64_t hdr_sum, uint64_t block_no) {
    return XXH3_64bits_withSeed(p, n, hdr_sum ^ (0x9E3779B97F4A7C15ull * (block_no + 1)));
}

static enum tern_status write_all(int fd, const void *p, size_t n, const char *what) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return tern_errorf(TERN_ERR_IO, "writing %s: %s", what, strerror(errno));
        }
        b += w;
        n -= (size_t)w;
    }
    return TERN_OK;
}

/* 1 = read n bytes, 0 = short (end of file), -1 = error (errno). */
static int read_at(int fd, void *p, size_t n, uint64_t off) {
    uint8_t *b = p;
    while (n) {
        ssize_t r = pread(fd, b, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) return 0;
        b += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 1;
}

static enum tern_status buf_reserve(struct disk_io *io, size_t n) {
    if (n <= io->buf_cap) return TERN_OK;
    uint8_t *b = tern_aligned_alloc(n);
    if (!b) return tern_errorf(TERN_ERR_NOMEM, "disk tier: out of memory for a %zu-byte block", n);
    tern_aligned_free(io->buf);
    io->buf = b;
    io->buf_cap = n;
    return TERN_OK;
}

static void hex(char *out, const uint8_t *p, size_t n) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = 0;
}

/* The file name of (tenant, key) or (tenant, nonce): a keyed hash, so that names
 * reveal neither tenant nor key, and a file moved under another conversation's name
 * does not verify. */
static void entry_name(const uint8_t *secret, const char *tenant, const char *key, const uint8_t *nonce,
                       char out[DISK_NAME_LEN + 1]) {
    size_t tl = strlen(tenant), kl = key ? strlen(key) : DISK_NONCE_BYTES;
    size_t n = 1 + 4 + tl + 1 + kl;
    uint8_t stackbuf[512];
    uint8_t *b = n <= sizeof stackbuf ? stackbuf : malloc(n);
    if (!b) { /* cannot happen for keys within MAX_STR on any real system; a fixed name */
        memset(out, '0', DISK_NAME_LEN);
        out[DISK_NAME_LEN] = 0;
        return;
    }
    size_t o = 0;
    b[o++] = 'T';
    uint32_t tl32 = (uint32_t)tl;
    memcpy(b + o, &tl32, 4);
    o += 4;
    memcpy(b + o, tenant, tl);
    o += tl;
    b[o++] = key ? 'K' : 'N';
    memcpy(b + o, key ? (const void *)key : (const void *)nonce, kl);
    o += kl;
    XXH128_hash_t h = XXH3_128bits_withSecret(b, o, secret, SECRET_BYTES);
    if (b != stackbuf) free(b);
    uint8_t raw[16];
    memcpy(raw, &h.high64, 8);
    memcpy(raw + 8, &h.low64, 8);
    hex(out, raw, 16);
}

static bool is_entry_name(const char *s) {
    for (int i = 0; i < DISK_NAME_LEN; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return !strcmp(s + DISK_NAME_LEN, DISK_FILE_SUFFIX);
}

static void file_of(const char *name, char out[DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX]) {
    snprintf(out, DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX, "%s%s", name, DISK_FILE_SUFFIX);
}

/* ---- layout ------------------------------------------------------------------------- */

struct layout {
    uint64_t tok_off, tok_len;   /* payload offset and length of the token block */
    uint64_t rec_off;            /* first recurrent block (live), then one per checkpoint */
    uint64_t kv_off;             /* first KV page block */
    uint64_t total;
    uint32_t n_pages;
};

static uint32_t page_rows(uint32_t n, uint32_t pg) {
    uint32_t left = n - pg * KV_BLOCK;
    return left < KV_BLOCK ? left : KV_BLOCK;
}

/* ---- versions (entry files) ------------------------------------------------------------
 *
 * An entry file is appended to, never rewritten in place: after the header come two
 * version slots, then blocks. A version is a directory block (the token list, the
 * checkpoint positions and kinds, and a reference — offset and checksum — to each of its
 * blocks: the recurrent state at its end, each checkpoint's, each KV page) and the blocks
 * it references, which earlier versions may have written: the next turn of a
 * conversation appends only its new KV pages, its new recurrent states and a directory,
 * fsyncs them, then writes its slot over the older of the two (seq + 1) and fsyncs
 * again. A reader takes the valid slot with the highest seq whose blocks the file holds:
 * a slot torn by a crash or read while it is written fails its checksum and the version
 * before stands, whose blocks nothing overwrote. Blocks are checksummed with a seed of
 * the header's checksum and what they are (the recurrent state at position p, KV page
 * pg of r rows), so a block is valid for any version of this file whose reference names
 * it that way, and for nothing else. When the superseded bytes would outweigh half the
 * live ones, the file is written anew (temporary name, rename). */
struct slot {
    uint64_t seq;               /* 0: empty */
    uint32_t n_tokens, n_ckpt;
    uint64_t dir_off, dir_len;  /* the directory's payload (its checksum follows it) */
    uint64_t dir_sum;
    uint64_t total;             /* the file's bytes this version needs */
    uint64_t reserved;
    uint64_t sum;               /* of the above, seeded with the header's and the slot's index */
};
_Static_assert(sizeof(struct slot) == 64, "a version slot is 64 bytes on disk");

struct ref {
    uint64_t off, sum;
};

#define BLK_DIR 0ull
static uint64_t blk_rec(uint32_t pos) { return (1ull << 40) | pos; }
static uint64_t blk_kv(uint32_t pg, uint32_t rows) { return (2ull << 40) | ((uint64_t)pg << 12) | rows; }

static uint64_t slots_off(const struct file_hdr *h) { return ((uint64_t)h->hdr_bytes + 8 + 7) & ~7ull; }
static uint64_t blocks_off(const struct file_hdr *h) { return slots_off(h) + 2 * sizeof(struct slot); }

static uint64_t slot_sum(const struct slot *v, uint64_t hdr_sum, int i) {
    return XXH3_64bits_withSeed(v, offsetof(struct slot, sum), hdr_sum ^ (0xC2B2AE3D27D4EB4Full * (uint64_t)(i + 1)));
}

static size_t n_refs_of(uint32_t n, uint32_t n_ck, bool rec) {
    return (rec ? 1u + n_ck : 0u) + (n + KV_BLOCK - 1) / KV_BLOCK;
}

static uint64_t dir_bytes(uint32_t n, uint32_t n_ck, bool rec) {
    return ((uint64_t)n + 2ull * n_ck) * 4 + n_refs_of(n, n_ck, rec) * sizeof(struct ref);
}

/* Reference i of a version: 0 the state at its end, 1 + c checkpoint c's (models with a
 * recurrent state), then the KV pages. */
static size_t ref_kv(const struct file_hdr *h, uint32_t n_ck, uint32_t pg) { return (h->rec_bytes ? 1u + n_ck : 0u) + pg; }

static uint64_t ref_len(const struct file_hdr *h, uint32_t n, uint32_t n_ck, size_t i) {
    if (h->rec_bytes && i <= n_ck) return h->rec_bytes;
    return (uint64_t)page_rows(n, (uint32_t)(i - ref_kv(h, n_ck, 0))) * h->kv_row_bytes;
}

/* The header's counts are bounded before anything is multiplied. */
static bool layout_of(const struct file_hdr *h, struct layout *l) {
    if (h->n_tokens > MAX_TOKENS || h->n_ckpt > MAX_CKPT || h->rec_bytes > (1ull << 36) ||
        h->kv_row_bytes > (1ull << 26))
        return false;
    l->tok_off = (uint64_t)h->hdr_bytes + 8;
    l->tok_len = ((uint64_t)h->n_tokens + 2ull * h->n_ckpt) * 4;
    l->rec_off = l->tok_off + l->tok_len + 8;
    uint64_t n_rec = h->rec_bytes ? 1ull + h->n_ckpt : 0;
    l->kv_off = l->rec_off + n_rec * (h->rec_bytes + 8);
    l->n_pages = (h->n_tokens + KV_BLOCK - 1) / KV_BLOCK;
    l->total = l->kv_off + (uint64_t)h->n_tokens * h->kv_row_bytes + (uint64_t)l->n_pages * 8;
    return true;
}

/* ---- the index ---------------------------------------------------------------------- */

static void entry_free(struct disk_entry *e) {
    if (!e) return;
    free(e->tenant);
    free(e->key);
    free(e->tokens);
    free(e->ckpt_pos);
    free(e->ckpt_kinds);
    fp_free(&e->fp);
    free(e);
}

static long find_entry(const struct disk *d, const char *name) {
    for (size_t i = 0; i < d->n; i++)
        if (!strcmp(d->e[i]->name, name)) return (long)i;
    return -1;
}

static void index_drop(struct disk *d, size_t i) {
    d->total_bytes -= d->e[i]->bytes;
    entry_free(d->e[i]);
    memmove(d->e + i, d->e + i + 1, (d->n - i - 1) * sizeof *d->e);
    d->n--;
}

static int by_recency(const void *a, const void *b) {
    const struct disk_entry *x = *(struct disk_entry *const *)a, *y = *(struct disk_entry *const *)b;
    if (x->last_used != y->last_used) return x->last_used > y->last_used ? -1 : 1;
    return strcmp(x->name, y->name);
}

static void index_sort(struct disk *d) {
    if (d->n > 1) qsort(d->e, d->n, sizeof *d->e, by_recency);
}

/* Inserts e (replacing an entry of the same name when replace; a directory scan appends
 * and drops the replaced entry afterwards, as it was not seen). On allocation failure e
 * is freed: the file stays on disk and the next scan indexes it. */
static void index_put(struct disk *d, struct disk_entry *e, bool replace) {
    if (replace) {
        long i = find_entry(d, e->name);
        if (i >= 0) index_drop(d, (size_t)i);
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 64;
        struct disk_entry **p = tern_reallocarray(d->e, cap, sizeof *p);
        if (!p) {
            entry_free(e);
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
static bool dir_lock(struct disk_io *io) {
    while (flock(io->lock_fd, LOCK_EX)) {
        if (errno == EINTR) continue;
        return false;
    }
    return true;
}

static void dir_unlock(struct disk_io *io) { flock(io->lock_fd, LOCK_UN); }

/* The generation counter goes up by one per change, under the directory's lock (a lost
 * increment would hide a peer's change) and d->mu. One increment announces every change
 * since the last (peers re-read the directory on any change), so a change made without
 * the lock (gen_dirty) is counted by the next holder's. */
static void bump_gen_locked(struct disk *d) {
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
static void gen_flush(struct disk *d) {
    if (!d->gen_dirty) return;
    if (flock(d->io.lock_fd, LOCK_EX | LOCK_NB)) return;
    pthread_mutex_lock(&d->mu);
    if (d->gen_dirty) bump_gen_locked(d);
    pthread_mutex_unlock(&d->mu);
    flock(d->io.lock_fd, LOCK_UN);
}

static uint64_t read_gen(const struct disk *d) {
    uint64_t g = 0;
    if (pread(d->gen_fd, &g, sizeof g, 0) != (ssize_t)sizeof g) return 0;
    return g;
}

/* Deletes a file that did not verify: logged once (the file is gone afterwards). */
static void invalidate(struct disk *d, const char *name, const char *why) {
    char fn[DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX];
    file_of(name, fn);
    TERN_LOG_WARN("disk tier: deleting %s/%s: %s (it costs a cold prime, never a wrong resume)", d->dir, fn, why);
    if (unlinkat(d->dir_fd, fn, 0) && errno != ENOENT)
        TERN_LOG_WARN("disk tier: cannot delete %s/%s: %s", d->dir, fn, strerror(errno));
    if (!d->scanning) {
        long i = find_entry(d, name);
        if (i >= 0) index_drop(d, (size_t)i);
    }
    d->st.invalid++;
    d->gen_dirty = true; /* counted in .gen by gen_flush or the next write */
}

/* Reads and verifies the header and the token block of an open file. On success *out
 * is a new index entry (without name/ino/times). why: the reason when it is invalid;
 * returns false then. Does not need a model when d is NULL-like (inspection): model
 * checks happen only when expect_model. */
struct head {
    struct file_hdr h;
    uint64_t hdr_sum;
    struct layout l;            /* markers */
    char *tenant, *key;
    uint32_t n, n_ck;           /* the version's counts (a marker's: the header's) */
    int32_t *tokens;
    uint32_t *ckpt_pos, *ckpt_kinds;
    uint64_t tok_sum;           /* the version's identity: its directory's checksum */
    struct ref *refs;           /* entry files: the version's blocks */
    struct slot sl;             /* entry files: the version's slot */
    int slot_i;
};

static bool read_marker_tokens(int fd, uint64_t file_size, const uint8_t *first, size_t got, struct head *hd,
                               char *why, size_t why_len);
static bool read_version(int fd, uint64_t file_size, const uint8_t *first, size_t got, struct head *hd, char *why,
                         size_t why_len);

static void head_free(struct head *hd) {
    free(hd->tenant);
    free(hd->key);
    free(hd->tokens);
    free(hd->ckpt_pos);
    free(hd->ckpt_kinds);
    free(hd->refs);
    memset(hd, 0, sizeof *hd);
}

static bool read_head(int fd, uint64_t file_size, bool marker, struct head *hd, char *why, size_t why_len) {
    memset(hd, 0, sizeof *hd);
    /* room for the largest header; the first read takes HEAD_READ bytes */
    uint8_t first[HEAD_READ + sizeof(struct file_hdr) + 2 * MAX_STR + 8];
    size_t got = file_size < HEAD_READ ? (size_t)file_size : HEAD_READ;
    if (got < sizeof hd->h + 8) {
        snprintf(why, why_len, "%llu bytes is too short for a header", (unsigned long long)file_size);
        return false;
    }
    if (read_at(fd, first, got, 0) != 1) {
        snprintf(why, why_len, "reading the header: %s", strerror(errno));
        return false;
    }
    memcpy(&hd->h, first, sizeof hd->h);
    const struct file_hdr *h = &hd->h;
    if (memcmp(h->magic, FILE_MAGIC, 8)) {
        snprintf(why, why_len, "not a tern disk-tier file (bad magic)");
        return false;
    }
    if (h->version != FILE_VERSION) {
        snprintf(why, why_len, "file format version %u, this tern writes %u", h->version, FILE_VERSION);
        return false;
    }
    if (h->tenant_len <= MAX_STR && h->key_len <= MAX_STR && h->hdr_bytes == sizeof *h + h->tenant_len + h->key_len &&
        h->hdr_bytes + 8 > got && h->hdr_bytes + 8 <= file_size) {
        /* a long tenant or key: the rest of the header */
        if (read_at(fd, first + got, h->hdr_bytes + 8 - got, got) != 1) {
            snprintf(why, why_len, "reading the header: %s", strerror(errno));
            return false;
        }
        got = h->hdr_bytes + 8;
    }
    if (h->tenant_len > MAX_STR || h->key_len > MAX_STR || h->named > 1 ||
        h->hdr_bytes != sizeof *h + h->tenant_len + h->key_len || h->hdr_bytes + 8 > got) {
        snprintf(why, why_len, "header sizes out of range (header %u bytes, tenant %u, key %u)", h->hdr_bytes,
                 h->tenant_len, h->key_len);
        return false;
    }
    uint64_t sum;
    memcpy(&sum, first + h->hdr_bytes, 8);
    if (XXH3_64bits(first, h->hdr_bytes) != sum) {
        snprintf(why, why_len, "header checksum mismatch");
        return false;
    }
    hd->hdr_sum = sum;
    hd->tenant = tern_malloc(h->tenant_len + 1);
    hd->key = h->named ? tern_malloc(h->key_len + 1) : NULL;
    if (!hd->tenant || (h->named && !hd->key)) {
        head_free(hd);
        snprintf(why, why_len, "out of memory");
        return false;
    }
    memcpy(hd->tenant, first + sizeof *h, h->tenant_len);
    hd->tenant[h->tenant_len] = 0;
    if (hd->key) {
        memcpy(hd->key, first + sizeof *h + h->tenant_len, h->key_len);
        hd->key[h->key_len] = 0;
    }
    if (strlen(hd->tenant) != h->tenant_len || (hd->key && strlen(hd->key) != h->key_len)) {
        head_free(hd);
        snprintf(why, why_len, "tenant or key contains a NUL byte");
        return false;
    }
    if ((h->reserved == HDR_WIP) != marker) {
        head_free(hd);
        snprintf(why, why_len, "%s", marker ? "not a marker" : "a marker where a file should be");
        return false;
    }
    if (h->rec_bytes > (1ull << 36) || h->kv_row_bytes > (1ull << 26)) {
        head_free(hd);
        snprintf(why, why_len, "state sizes out of range");
        return false;
    }
    const bool ok = marker ? read_marker_tokens(fd, file_size, first, got, hd, why, why_len)
                           : read_version(fd, file_size, first, got, hd, why, why_len);
    if (!ok) {
        head_free(hd);
        return false;
    }
    for (uint32_t i = 0; i < hd->n_ck; i++) {
        if (hd->ckpt_pos[i] > hd->n || (i && hd->ckpt_pos[i] <= hd->ckpt_pos[i - 1])) {
            snprintf(why, why_len, "checkpoint position %u (index %u) is not ascending within %u tokens",
                     hd->ckpt_pos[i], i, hd->n);
            head_free(hd);
            return false;
        }
    }
    return true;
}

/* Reads n bytes at off into p, from the first read when it holds them. 1, 0 (short) or -1. */
static int read_at_first(int fd, void *p, size_t n, uint64_t off, const uint8_t *first, size_t got) {
    if (off + n <= got) {
        memcpy(p, first + off, n);
        return 1;
    }
    return read_at(fd, p, n, off);
}

/* A marker's token block (the header's counts, right after the header). */
static bool read_marker_tokens(int fd, uint64_t file_size, const uint8_t *first, size_t got, struct head *hd,
                               char *why, size_t why_len) {
    const struct file_hdr *h = &hd->h;
    if (!layout_of(h, &hd->l)) {
        snprintf(why, why_len, "counts out of range (%u tokens, %u checkpoints)", h->n_tokens, h->n_ckpt);
        return false;
    }
    if (hd->l.tok_off + hd->l.tok_len + 8 != file_size) {
        snprintf(why, why_len, "%llu bytes where the header says %llu (truncated or torn)",
                 (unsigned long long)file_size, (unsigned long long)(hd->l.tok_off + hd->l.tok_len + 8));
        return false;
    }
    hd->n = h->n_tokens;
    hd->n_ck = h->n_ckpt;
    uint8_t *blk = tern_malloc((size_t)hd->l.tok_len + 8);
    hd->tokens = tern_malloc((size_t)hd->n * 4 + 4);
    hd->ckpt_pos = tern_malloc((size_t)hd->n_ck * 4 + 4);
    hd->ckpt_kinds = tern_malloc((size_t)hd->n_ck * 4 + 4);
    if (!blk || !hd->tokens || !hd->ckpt_pos || !hd->ckpt_kinds) {
        free(blk);
        snprintf(why, why_len, "out of memory");
        return false;
    }
    int rr = read_at_first(fd, blk, (size_t)hd->l.tok_len + 8, hd->l.tok_off, first, got);
    if (rr != 1) {
        free(blk);
        snprintf(why, why_len, "reading the token list: %s", rr < 0 ? strerror(errno) : "short");
        return false;
    }
    memcpy(&hd->tok_sum, blk + hd->l.tok_len, 8);
    if (block_sum(blk, (size_t)hd->l.tok_len, hd->hdr_sum, BLK_DIR) != hd->tok_sum) {
        free(blk);
        snprintf(why, why_len, "token list checksum mismatch");
        return false;
    }
    memcpy(hd->tokens, blk, (size_t)hd->n * 4);
    memcpy(hd->ckpt_pos, blk + (size_t)hd->n * 4, (size_t)hd->n_ck * 4);
    memcpy(hd->ckpt_kinds, blk + ((size_t)hd->n + hd->n_ck) * 4, (size_t)hd->n_ck * 4);
    free(blk);
    return true;
}

/* An entry file's newest complete version: the valid slot with the highest sequence
 * number whose blocks the file holds, and its directory (tokens, checkpoints, refs). */
static bool read_version(int fd, uint64_t file_size, const uint8_t *first, size_t got, struct head *hd, char *why,
                         size_t why_len) {
    const struct file_hdr *h = &hd->h;
    const uint64_t so = slots_off(h), bo = blocks_off(h);
    struct slot sl[2];
    int rr = file_size >= bo ? read_at_first(fd, sl, sizeof sl, so, first, got) : 0;
    if (rr != 1) {
        snprintf(why, why_len, "%s", rr < 0 ? strerror(errno) : "too short for its version slots");
        return false;
    }
    int best = -1;
    bool torn = false;
    for (int i = 0; i < 2; i++) {
        const struct slot *v = &sl[i];
        if (v->seq == 0 || v->sum != slot_sum(v, hd->hdr_sum, i)) continue;
        if (v->n_tokens > MAX_TOKENS || v->n_ckpt > MAX_CKPT ||
            v->dir_len != dir_bytes(v->n_tokens, v->n_ckpt, h->rec_bytes != 0) || v->dir_off < bo ||
            v->dir_off + v->dir_len + 8 > v->total)
            continue;
        if (v->total > file_size) {
            torn = true;
            continue;
        }
        if (best < 0 || v->seq > sl[best].seq) best = i;
    }
    if (best < 0) {
        snprintf(why, why_len, "%s", torn ? "its blocks are not all there (truncated or torn)" : "no valid version slot");
        return false;
    }
    hd->sl = sl[best];
    hd->slot_i = best;
    const struct slot *v = &hd->sl;
    hd->n = v->n_tokens;
    hd->n_ck = v->n_ckpt;
    uint8_t *dir = tern_malloc((size_t)v->dir_len + 8);
    const size_t n_refs = n_refs_of(hd->n, hd->n_ck, h->rec_bytes != 0);
    hd->tokens = tern_malloc((size_t)hd->n * 4 + 4);
    hd->ckpt_pos = tern_malloc((size_t)hd->n_ck * 4 + 4);
    hd->ckpt_kinds = tern_malloc((size_t)hd->n_ck * 4 + 4);
    hd->refs = tern_malloc(n_refs * sizeof *hd->refs + sizeof *hd->refs);
    if (!dir || !hd->tokens || !hd->ckpt_pos || !hd->ckpt_kinds || !hd->refs) {
        free(dir);
        snprintf(why, why_len, "out of memory");
        return false;
    }
    rr = read_at_first(fd, dir, (size_t)v->dir_len + 8, v->dir_off, first, got);
    if (rr != 1) {
        free(dir);
        snprintf(why, why_len, "reading the token list: %s", rr < 0 ? strerror(errno) : "short");
        return false;
    }
    uint64_t sum;
    memcpy(&sum, dir + v->dir_len, 8);
    if (sum != v->dir_sum || block_sum(dir, (size_t)v->dir_len, hd->hdr_sum, BLK_DIR) != sum) {
        free(dir);
        snprintf(why, why_len, "token list checksum mismatch");
        return false;
    }
    hd->tok_sum = sum;
    size_t o = 0;
    memcpy(hd->tokens, dir, (size_t)hd->n * 4);
    o += (size_t)hd->n * 4;
    memcpy(hd->ckpt_pos, dir + o, (size_t)hd->n_ck * 4);
    o += (size_t)hd->n_ck * 4;
    memcpy(hd->ckpt_kinds, dir + o, (size_t)hd->n_ck * 4);
    o += (size_t)hd->n_ck * 4;
    memcpy(hd->refs, dir + o, n_refs * sizeof *hd->refs);
    free(dir);
    /* every block inside the version's extent */
    for (size_t i = 0; i < n_refs; i++) {
        const uint64_t len = ref_len(h, hd->n, hd->n_ck, i) + 8;
        if (hd->refs[i].off < bo || hd->refs[i].off > v->total || len > v->total - hd->refs[i].off) {
            snprintf(why, why_len, "block %zu lies outside the file", i);
            return false;
        }
    }
    return true;
}

/* The checks that need this directory's model and secret. */
static bool head_matches(const struct disk *d, const char *name, const struct head *hd, char *why, size_t why_len) {
    const struct file_hdr *h = &hd->h;
    if (h->model_id != d->model_id) {
        snprintf(why, why_len, "written for another model (identity %016llx, this model's %016llx)",
                 (unsigned long long)h->model_id, (unsigned long long)d->model_id);
        return false;
    }
    if (h->layout != d->layout || h->rec_bytes != d->rec_bytes || h->kv_row_bytes != d->kv_row_bytes) {
        snprintf(why, why_len, "another state layout (%016llx, this server's %016llx: KV type or tern version)",
                 (unsigned long long)h->layout, (unsigned long long)d->layout);
        return false;
    }
    if (!d->hybrid && hd->n_ck) {
        snprintf(why, why_len, "checkpoints in a file of an attention-only model");
        return false;
    }
    char expect[DISK_NAME_LEN + 1];
    entry_name(d->secret, hd->tenant, hd->key, h->nonce, expect);
    if (strcmp(expect, name)) {
        snprintf(why, why_len, "its name does not match the tenant and key inside it (moved or copied)");
        return false;
    }
    return true;
}

/* An index entry of the verified head hd (taken over) of the file `name` (stat st). */
static struct disk_entry *entry_from_head(const struct disk *d, const char *name, struct head *hd0,
                                          const struct stat *st) {
    struct head hd = *hd0;
    memset(hd0, 0, sizeof *hd0);
    struct disk_entry *e = tern_calloc(1, sizeof *e);
    if (!e) {
        head_free(&hd);
        return NULL;
    }
    memcpy(e->name, name, DISK_NAME_LEN + 1);
    e->tenant = hd.tenant;
    e->key = hd.key;
    e->tokens = hd.tokens;
    e->ckpt_pos = hd.ckpt_pos;
    e->ckpt_kinds = hd.ckpt_kinds;
    hd.tenant = hd.key = NULL;
    hd.tokens = NULL;
    hd.ckpt_pos = hd.ckpt_kinds = NULL;
    memcpy(e->nonce, hd.h.nonce, DISK_NONCE_BYTES);
    e->n = hd.n;
    e->n_ckpt = hd.n_ck;
    e->bytes = (uint64_t)st->st_size;
    e->tok_sum = hd.tok_sum;
    e->ino = (uint64_t)st->st_ino;
    e->mtime_ns = ts_ns(&st->st_mtim);
    uint64_t at = ts_ns(&st->st_atim);
    e->last_used = at > e->mtime_ns ? at : e->mtime_ns;
    if (d->sep && fp_compute(d->sep, e->tokens, e->n, &e->fp) != TERN_OK) e->fp.n = 0;
    e->seen = true;
    head_free(&hd);
    return e;
}

/* Indexes the file `name` (open as fd, stat st). Returns false when it was invalid
 * (and deleted). */
static bool index_file(struct disk *d, const char *name, int fd, const struct stat *st) {
    struct head hd;
    char why[192];
    if (!read_head(fd, (uint64_t)st->st_size, false, &hd, why, sizeof why) || !head_matches(d, name, &hd, why, sizeof why)) {
        head_free(&hd);
        invalidate(d, name, why);
        return false;
    }
    struct disk_entry *e = entry_from_head(d, name, &hd, st);
    if (e) index_put(d, e, false);
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
    if (now_ns() - ts_ns(&st->st_mtim) > STALE_TMP_NS) dead = true;
    if (!dead) return;
    TERN_LOG_INFO("disk tier: removing %s/%s (a write that never completed)", d->dir, fn);
    unlinkat(d->dir_fd, fn, 0);
}

/* openat() for the directory's files: non-blocking, so that a FIFO (or a device) put
 * where a file should be cannot block the engine in open() (a FIFO nobody writes
 * stalled every request for as long as it stayed there), and regular files only: any
 * other kind is closed and refused with errno EINVAL. The descriptor is then made
 * blocking again (reads of a regular file never wait on a peer anyway). */
static int open_regular(int dir_fd, const char *fn, int flags, mode_t mode) {
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
static void scan(struct disk *d, bool at_open) {
    uint64_t gen = read_gen(d);
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
        if (!is_entry_name(fn)) continue;
        if (fstatat(d->dir_fd, fn, &st, AT_SYMLINK_NOFOLLOW)) continue; /* deleted meanwhile */
        char name[DISK_NAME_LEN + 1];
        memcpy(name, fn, DISK_NAME_LEN);
        name[DISK_NAME_LEN] = 0;
        if (!S_ISREG(st.st_mode)) {
            invalidate(d, name, "not a regular file");
            continue;
        }
        struct disk_entry key_e, *key_p = &key_e, **hit = NULL;
        memcpy(key_e.name, name, sizeof name);
        if (n_snap) hit = bsearch(&key_p, snap, n_snap, sizeof *snap, by_name);
        if (hit) {
            struct disk_entry *e = *hit;
            if (e->ino == (uint64_t)st.st_ino && e->bytes == (uint64_t)st.st_size &&
                e->mtime_ns == ts_ns(&st.st_mtim)) {
                uint64_t at = ts_ns(&st.st_atim);
                if (at > e->last_used) e->last_used = at; /* a peer used it */
                e->seen = true;
                continue;
            }
        }
        int ffd = open_regular(d->dir_fd, fn, O_RDONLY, 0);
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
            entry_free(d->e[i]);
        }
    }
    d->n = k;
    index_sort(d);
    d->gen = gen;
    d->scanned = true;
}

void disk_lock(struct disk *d) { pthread_mutex_lock(&d->mu); }
void disk_unlock(struct disk *d) { pthread_mutex_unlock(&d->mu); }

void disk_refresh(struct disk *d) {
    pthread_mutex_lock(&d->mu);
    if (!d->scanned || read_gen(d) != d->gen) scan(d, false);
    if (!d->wscanned || read_wgen(d) != d->wgen) scan_wip(d);
    pthread_mutex_unlock(&d->mu);
    gen_flush(d);
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
    int fd = open_regular(d->dir_fd, ".secret", O_RDONLY, 0);
    if (fd < 0 && errno == ENOENT) {
        /* First use: create it under the lock, so that two replicas starting together
         * agree on one secret (the second finds the first's). */
        if (flock(d->io.lock_fd, LOCK_EX)) return tern_errorf(TERN_ERR_IO, "disk tier: locking %s/.lock: %s", d->dir, strerror(errno));
        fd = open_regular(d->dir_fd, ".secret", O_RDONLY, 0);
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
            int w = open_regular(d->dir_fd, ".secret.tmp", O_WRONLY | O_CREAT | O_TRUNC, 0600);
            enum tern_status st = w < 0 ? tern_errorf(TERN_ERR_IO, "creating %s/.secret: %s", d->dir, strerror(errno))
                                        : write_all(w, s, sizeof s, ".secret");
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
    int r = read_at(fd, d->secret, SECRET_BYTES, 0);
    close(fd);
    if (r != 1) return tern_errorf(TERN_ERR_IO, "disk tier: reading %s/.secret", d->dir);
    return TERN_OK;
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
    d->io.lock_fd = open_regular(d->dir_fd, ".lock", O_RDWR | O_CREAT, 0600);
    d->gen_fd = open_regular(d->dir_fd, ".gen", O_RDWR | O_CREAT, 0600);
    d->wlock_fd = open_regular(d->dir_fd, ".wiplock", O_RDWR | O_CREAT, 0600);
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
    d->layout = tern_state_layout(p->model, p->session.kv_type);
    d->rec_bytes = tern_model_info(p->model)->recurrent_bytes;
    d->hybrid = tern_model_info(p->model)->hybrid;
    d->kv_row_bytes = tern_state_kv_row_bytes(p->model, p->session.kv_type);
    uint64_t t0 = tern_now_ns();
    pthread_mutex_lock(&d->mu);
    scan(d, true);
    scan_wip(d);
    pthread_mutex_unlock(&d->mu);
    gen_flush(d);
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
    for (size_t i = 0; i < d->n; i++) entry_free(d->e[i]);
    free(d->e);
    while (d->own) disk_mark_end(d, d->own); /* (the cache ends its own first) */
    wip_clear(d);
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
    io->lock_fd = open_regular(d->dir_fd, ".lock", O_RDWR | O_CREAT, 0600);
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

/* ---- write ------------------------------------------------------------------------------ */

static void remove_file(struct disk *d, size_t i, const char *why) {
    char fn[DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX];
    file_of(d->e[i]->name, fn);
    TERN_LOG_INFO("disk tier: removed %s (%u tokens, %llu bytes): %s", fn, d->e[i]->n,
                  (unsigned long long)d->e[i]->bytes, why);
    if (unlinkat(d->dir_fd, fn, 0) && errno != ENOENT)
        TERN_LOG_WARN("disk tier: cannot delete %s/%s: %s", d->dir, fn, strerror(errno));
    index_drop(d, i);
}

void disk_remove(struct disk *d, const char *name) {
    if (!dir_lock(&d->io)) return;
    pthread_mutex_lock(&d->mu);
    long i = find_entry(d, name);
    if (i >= 0) {
        remove_file(d, (size_t)i, "removed");
        bump_gen_locked(d);
    }
    pthread_mutex_unlock(&d->mu);
    dir_unlock(&d->io);
}

/* The header of a version of (tenant, key) or (tenant, nonce) with n tokens and n_ck
 * checkpoints. */
static void header_of(const struct disk *d, const char *tenant, const char *key, const uint8_t *nonce, uint32_t n,
                      uint32_t n_ck, struct file_hdr *h) {
    memset(h, 0, sizeof *h);
    memcpy(h->magic, FILE_MAGIC, 8);
    h->version = FILE_VERSION;
    h->tenant_len = (uint32_t)strlen(tenant);
    h->key_len = key ? (uint32_t)strlen(key) : 0;
    h->hdr_bytes = (uint32_t)sizeof *h + h->tenant_len + h->key_len;
    h->model_id = d->model_id;
    h->layout = d->layout;
    h->created_ns = now_ns();
    h->n_tokens = n;
    h->n_ckpt = n_ck;
    h->rec_bytes = d->rec_bytes;
    h->kv_row_bytes = d->kv_row_bytes;
    h->named = key != NULL;
    if (!key) memcpy(h->nonce, nonce, DISK_NONCE_BYTES);
}

/* The header as written (hdr_bytes + 8 bytes into out: the header, tenant, key, its
 * checksum); returns the checksum. */
static uint64_t header_bytes(const struct file_hdr *h, const char *tenant, const char *key, uint8_t *out) {
    memcpy(out, h, sizeof *h);
    memcpy(out + sizeof *h, tenant, h->tenant_len);
    if (key) memcpy(out + sizeof *h + h->tenant_len, key, h->key_len);
    const uint64_t sum = XXH3_64bits(out, h->hdr_bytes);
    memcpy(out + h->hdr_bytes, &sum, 8);
    return sum;
}

static enum tern_status pwrite_all(int fd, const void *p, size_t n, uint64_t off, const char *what) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = pwrite(fd, b, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return tern_errorf(TERN_ERR_IO, "writing %s: %s", what, strerror(errno));
        }
        b += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return TERN_OK;
}

/* Writes one block at *off (payload then its checksum), advancing *off; *ref names it. */
static enum tern_status put_block(const struct disk *d, int fd, uint64_t *off, const void *p, size_t n,
                                  uint64_t hdr_sum, uint64_t no, struct ref *ref) {
    ref->off = *off;
    ref->sum = block_sum(p, n, hdr_sum, no);
    enum tern_status st = pwrite_all(fd, p, n, *off, "a block");
    if (!st) st = pwrite_all(fd, &ref->sum, sizeof ref->sum, *off + n, "a checksum");
    *off += n + 8;
    if (d->test_delay_ms) {
        struct timespec ts = {d->test_delay_ms / 1000, (long)(d->test_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return st;
}

enum tern_status disk_put(struct disk *d, const char *tenant, const char *key, uint8_t nonce[DISK_NONCE_BYTES],
                          bool *has_nonce, const struct tern_session *s, struct tern_checkpoint *const *cks,
                          const uint32_t *kinds, size_t n_cks) {
    if (!(key && *key) && !*has_nonce) {
        enum tern_status st = disk_nonce_new(nonce);
        if (st) return st;
        *has_nonce = true;
    }
    return disk_put_io(d, &d->io, tenant, key, nonce, s, cks, kinds, n_cks);
}

/* The recurrent state a version holds at position p (its end or a checkpoint), or NULL. */
static const struct ref *version_rec(const struct head *v, uint32_t p) {
    if (!v->h.rec_bytes) return NULL;
    if (p == v->n) return &v->refs[0];
    for (uint32_t i = 0; i < v->n_ck; i++)
        if (v->ckpt_pos[i] == p) return &v->refs[1 + i];
    return NULL;
}

/* Which blocks of the new version (n tokens, checkpoints at pos) the file's current
 * version (base, NULL: none) already holds: the KV pages and recurrent states below the
 * two token lists' common prefix, which are the same bytes (tern's states are a function
 * of the tokens alone). refs[i].off = 0: to be written. Returns the bytes to write. */
static uint64_t plan_reuse(const struct disk *d, const struct head *base, const struct file_hdr *h,
                           const int32_t *toks, uint32_t n, const uint32_t *pos, uint32_t n_ck, struct ref *refs) {
    const size_t n_refs = n_refs_of(n, n_ck, d->rec_bytes != 0);
    memset(refs, 0, n_refs * sizeof *refs);
    uint32_t lcp = 0;
    if (base) {
        const uint32_t lim = n < base->n ? n : base->n;
        while (lcp < lim && toks[lcp] == base->tokens[lcp]) lcp++;
    }
    uint64_t bytes = dir_bytes(n, n_ck, d->rec_bytes != 0) + 8 + sizeof(struct slot);
    for (size_t i = 0; i < n_refs; i++) {
        const struct ref *have = NULL;
        if (base && d->rec_bytes && i <= n_ck) {
            const uint32_t p = i == 0 ? n : pos[i - 1];
            if (p <= lcp) have = version_rec(base, p);
        } else if (base) {
            const uint32_t pg = (uint32_t)(i - ref_kv(h, n_ck, 0)), rows = page_rows(n, pg);
            if (pg * KV_BLOCK + rows <= lcp && pg * KV_BLOCK < base->n && page_rows(base->n, pg) == rows)
                have = &base->refs[ref_kv(&base->h, base->n_ck, pg)];
        }
        if (have) refs[i] = *have;
        else bytes += ref_len(h, n, n_ck, i) + 8;
    }
    return bytes;
}

/* The file's current version, when it is this conversation's and this model's: opened
 * for appending (*fd), read into base. */
static bool open_base(struct disk *d, const char *fn, const char *name, const char *tenant, struct head *base,
                      int *fd, uint64_t *size) {
    *fd = open_regular(d->dir_fd, fn, O_RDWR, 0);
    if (*fd < 0) return false;
    struct stat st;
    char why[192];
    if (!fstat(*fd, &st) && read_head(*fd, (uint64_t)st.st_size, false, base, why, sizeof why)) {
        if (head_matches(d, name, base, why, sizeof why) && !strcmp(base->tenant, tenant)) {
            *size = (uint64_t)st.st_size;
            return true;
        }
        head_free(base);
    }
    close(*fd);
    *fd = -1;
    return false;
}

/* The write holds the directory's lock (through io's descriptor) from the budget to the
 * new version's slot (or the rename), as every writer does, so that peers' budgets see a
 * consistent directory and no two writers append to one file; it holds d->mu only for
 * the index work, so that the worker's decisions and loads go on while it writes. */
enum tern_status disk_put_io(struct disk *d, struct disk_io *io, const char *tenant, const char *key,
                             const uint8_t nonce[DISK_NONCE_BYTES], const struct tern_session *s,
                             struct tern_checkpoint *const *cks, const uint32_t *kinds, size_t n_cks) {
    tenant = tenant ? tenant : "";
    if (key && !*key) key = NULL;
    if (strlen(tenant) > MAX_STR || (key && strlen(key) > MAX_STR))
        return tern_errorf(TERN_ERR_LIMIT, "disk tier: tenant or key longer than %u bytes", MAX_STR);
    const uint32_t n = tern_session_n_past(s);
    const int32_t *toks = tern_session_tokens(s);
    if (n > MAX_TOKENS) return tern_errorf(TERN_ERR_LIMIT, "disk tier: %u tokens exceed the file format's limit", n);
    uint32_t pos[MAX_CKPT], knd[MAX_CKPT];
    const void *recs[MAX_CKPT];
    uint32_t n_ck = 0;
    if (d->hybrid) {
        for (size_t i = 0; i < n_cks && n_ck < MAX_CKPT; i++) {
            if (!cks[i]) continue;
            uint32_t p = tern_checkpoint_pos(cks[i]);
            if (p > n || (n_ck && p <= pos[n_ck - 1])) continue;
            /* a checkpoint kept on the device is read back here; one whose bytes cannot be
             * (a lost device: logged) is left out of the file */
            const void *rec = tern_checkpoint_data(cks[i]);
            if (!rec) continue;
            pos[n_ck] = p;
            knd[n_ck] = kinds ? kinds[i] : 0;
            recs[n_ck++] = rec;
        }
    }
    struct file_hdr h;
    header_of(d, tenant, key, nonce, 0, 0, &h);
    const bool rec = d->rec_bytes != 0;
    const size_t n_refs = n_refs_of(n, n_ck, rec);
    const uint64_t dlen = dir_bytes(n, n_ck, rec);
    /* the whole version, as a new file writes it */
    const uint64_t live = blocks_off(&h) + dlen + 8 + (rec ? (1ull + n_ck) * (d->rec_bytes + 8) : 0) +
                          (uint64_t)n * d->kv_row_bytes + (uint64_t)((n + KV_BLOCK - 1) / KV_BLOCK) * 8;
    if (live > d->max_bytes)
        return tern_errorf(TERN_ERR_RANGE, "disk tier: the conversation's %llu bytes exceed the whole --cache-disk budget (%llu)",
                           (unsigned long long)live, (unsigned long long)d->max_bytes);
    char name[DISK_NAME_LEN + 1];
    entry_name(d->secret, tenant, key, h.nonce, name);

    uint8_t *hbuf = tern_malloc((size_t)blocks_off(&h));
    struct disk_entry *ne = tern_calloc(1, sizeof *ne);
    uint8_t *dir = tern_malloc((size_t)dlen + 8);
    struct ref *refs = tern_malloc(n_refs * sizeof *refs + sizeof *refs);
    enum tern_status st = buf_reserve(io, (size_t)KV_BLOCK * d->kv_row_bytes + 64);
    if (!st && (!hbuf || !ne || !dir || !refs)) st = tern_errorf(TERN_ERR_NOMEM, "disk tier: out of memory");
    if (st) {
        free(hbuf);
        free(ne);
        free(dir);
        free(refs);
        return st;
    }
    memcpy(dir, toks, (size_t)n * 4);
    memcpy(dir + (size_t)n * 4, pos, (size_t)n_ck * 4);
    memcpy(dir + ((size_t)n + n_ck) * 4, knd, (size_t)n_ck * 4);

    char tmp[128];
    char fn[DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX];
    file_of(name, fn);
    const uint64_t t0 = tern_now_ns();
    struct head base = {0};
    int fd = -1;
    uint64_t base_size = 0, add = 0, wrote = 0;
    bool append = false;
    if (!dir_lock(io)) {
        st = tern_errorf(TERN_ERR_IO, "disk tier: locking %s/.lock: %s", d->dir, strerror(errno));
        pthread_mutex_lock(&d->mu);
        goto out_nolock;
    }
    /* What the file holds already (under the directory's lock: no one else writes it
     * meanwhile): appended to unless the superseded bytes would outweigh half the live. */
    if (open_base(d, fn, name, tenant, &base, &fd, &base_size)) {
        add = plan_reuse(d, &base, &h, toks, n, pos, n_ck, refs);
        append = base_size + add <= live + live / 2;
        if (!append) {
            close(fd);
            fd = -1;
        }
    }
    if (!append) memset(refs, 0, n_refs * sizeof *refs);
    const uint64_t hdr_sum = append ? base.hdr_sum : header_bytes(&h, tenant, key, hbuf);
    /* The budget holds over the directory, peers' files included: see what they did. */
    pthread_mutex_lock(&d->mu);
    snprintf(tmp, sizeof tmp, ".tmp-%s-%d-%u", d->host, (int)getpid(), ++d->tmp_seq);
    if (!d->scanned || read_gen(d) != d->gen) scan(d, false);
    {
        long same = find_entry(d, name);
        uint64_t have = d->total_bytes - (same >= 0 ? d->e[same]->bytes : 0);
        const uint64_t need = append ? base_size + add : live;
        index_sort(d);
        for (size_t i = d->n; have + need > d->max_bytes && i-- > 0;) {
            if (!strcmp(d->e[i]->name, name)) continue;
            have -= d->e[i]->bytes;
            remove_file(d, i, "least recently used, for the --cache-disk budget");
            d->st.evictions++;
            d->gen_dirty = true;
        }
    }
    if (d->gen_dirty) bump_gen_locked(d);
    pthread_mutex_unlock(&d->mu);
    /* the blocks: no index lock (the worker decides and loads meanwhile); s and the
     * checkpoints are the caller's to keep unchanged until this returns */
    uint64_t off;
    if (append) {
        off = base_size;
    } else {
        fd = openat(d->dir_fd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) {
            st = tern_errorf(TERN_ERR_IO, "disk tier: creating %s/%s: %s", d->dir, tmp, strerror(errno));
            pthread_mutex_lock(&d->mu);
            goto out;
        }
        memset(hbuf + h.hdr_bytes + 8, 0, (size_t)(blocks_off(&h) - h.hdr_bytes - 8)); /* empty slots */
        off = blocks_off(&h);
        st = pwrite_all(fd, hbuf, (size_t)off, 0, "the header");
    }
    const uint64_t off0 = off;
    for (size_t i = 0; !st && i < n_refs; i++) {
        if (refs[i].off) continue; /* held by the file already */
        if (rec && i <= n_ck) {
            const void *rb = i == 0 ? tern_session_rec_data(s) : recs[i - 1]; /* NULL: a device's download failed */
            st = rb ? put_block(d, fd, &off, rb, d->rec_bytes, hdr_sum, blk_rec(i == 0 ? n : pos[i - 1]), &refs[i])
                    : TERN_ERR_IO;
        } else {
            const uint32_t pg = (uint32_t)(i - ref_kv(&h, n_ck, 0)), rows = page_rows(n, pg);
            st = tern_session_kv_export(s, pg * KV_BLOCK, pg * KV_BLOCK + rows, io->buf);
            if (!st) st = put_block(d, fd, &off, io->buf, (size_t)rows * d->kv_row_bytes, hdr_sum, blk_kv(pg, rows), &refs[i]);
        }
    }
    struct ref dref = {0};
    memcpy(dir + ((size_t)n + 2u * n_ck) * 4, refs, n_refs * sizeof *refs);
    if (!st) st = put_block(d, fd, &off, dir, (size_t)dlen, hdr_sum, BLK_DIR, &dref);
    /* the version's blocks are on disk before the slot that names them */
    if (!st && fsync(fd)) st = tern_errorf(TERN_ERR_IO, "fsync: %s", strerror(errno));
    const int si = append ? 1 - base.slot_i : 0;
    struct slot sl = {.seq = append ? base.sl.seq + 1 : 1, .n_tokens = n, .n_ckpt = n_ck, .dir_off = dref.off,
                      .dir_len = dlen, .dir_sum = dref.sum, .total = off};
    sl.sum = slot_sum(&sl, hdr_sum, si);
    if (!st) st = pwrite_all(fd, &sl, sizeof sl, slots_off(append ? &base.h : &h) + (uint64_t)si * sizeof sl, "a version slot");
    if (!st && fsync(fd)) st = tern_errorf(TERN_ERR_IO, "fsync: %s", strerror(errno));
    wrote = append ? off - off0 + sizeof sl : off; /* (a new file: its header and slots included) */
    struct stat fst;
    if (!st && fstat(fd, &fst)) st = tern_errorf(TERN_ERR_IO, "fstat: %s", strerror(errno));
    if (st && append) {
        /* the version before stands; what was appended for this one goes */
        int rc = ftruncate(fd, (off_t)base_size);
        (void)rc;
    }
    close(fd);
    if (!st && !append && renameat(d->dir_fd, tmp, d->dir_fd, fn))
        st = tern_errorf(TERN_ERR_IO, "renaming to %s: %s", fn, strerror(errno));
    if (st) {
        if (!append) unlinkat(d->dir_fd, tmp, 0);
        st = tern_error_prefix(st, "disk tier: writing %s/%s (%llu bytes)", d->dir, fn, (unsigned long long)(off - off0));
        pthread_mutex_lock(&d->mu);
        goto out;
    }
    if (!append) fsync(d->dir_fd);
    pthread_mutex_lock(&d->mu);
    bump_gen_locked(d);
    memcpy(ne->name, name, sizeof name);
    ne->tenant = tern_strdup(tenant);
    ne->key = key ? tern_strdup(key) : NULL;
    ne->tokens = tern_malloc((size_t)n * 4 + 4);
    ne->ckpt_pos = tern_malloc((size_t)n_ck * 4 + 4);
    ne->ckpt_kinds = tern_malloc((size_t)n_ck * 4 + 4);
    if (!ne->tenant || (key && !ne->key) || !ne->tokens || !ne->ckpt_pos || !ne->ckpt_kinds) {
        entry_free(ne); /* the file is complete; the next scan indexes it */
        ne = NULL;
        long i = find_entry(d, name);
        if (i >= 0) index_drop(d, (size_t)i);
        d->scanned = false;
    } else {
        memcpy(ne->tokens, toks, (size_t)n * 4);
        memcpy(ne->ckpt_pos, pos, (size_t)n_ck * 4);
        memcpy(ne->ckpt_kinds, knd, (size_t)n_ck * 4);
        memcpy(ne->nonce, h.nonce, DISK_NONCE_BYTES);
        ne->n = n;
        ne->n_ckpt = n_ck;
        ne->bytes = (uint64_t)fst.st_size;
        ne->tok_sum = dref.sum;
        ne->ino = (uint64_t)fst.st_ino;
        ne->mtime_ns = ts_ns(&fst.st_mtim);
        ne->last_used = now_ns();
        if (ne->last_used < ne->mtime_ns) ne->last_used = ne->mtime_ns;
        if (d->sep && fp_compute(d->sep, ne->tokens, n, &ne->fp) != TERN_OK) ne->fp.n = 0;
        index_put(d, ne, true);
        ne = NULL;
        index_sort(d);
    }
    d->st.writes++;
    d->st.write_bytes += wrote;
    TERN_LOG_DEBUG("disk tier: wrote %s (%u tokens, %u checkpoints, %llu of its %llu bytes%s) in %.1f ms", fn, n, n_ck,
                   (unsigned long long)wrote, (unsigned long long)fst.st_size, append ? ", appended" : "",
                   (double)(tern_now_ns() - t0) * 1e-6);
out:
    /* (d->mu held from here) */
    dir_unlock(io);
out_nolock:
    if (st) d->st.write_errors++;
    pthread_mutex_unlock(&d->mu);
    head_free(&base);
    free(ne);
    free(hbuf);
    free(dir);
    free(refs);
    return st;
}

/* ---- writes in flight ------------------------------------------------------------------
 *
 * A marker NAME.wip announces that NAME.tern is being written: its header (reserved =
 * HDR_WIP) and the new version's token list. The writer makes it under a temporary name,
 * takes an exclusive flock on it, renames it into place and holds the lock until the
 * file is written and the marker removed (disk_mark_end). A peer that finds a marker
 * tries a shared lock: refused, the writer lives; granted, it died (kill -9, a crash, a
 * reboot: the kernel or the NFS lock manager dropped its lock) and the marker is stale,
 * removed and never waited for. Markers are counted in .gen's second word, so that a
 * peer re-reads them (and only them) when one appears or goes. */

struct disk_mark {
    int fd;                     /* holds the flock that says the writer lives */
    char name[DISK_NAME_LEN + 1];
    uint64_t ino;
    struct disk_mark *next;     /* this process's markers (wmu) */
};

static void wip_file(const char *name, char out[DISK_NAME_LEN + sizeof WIP_SUFFIX]) {
    snprintf(out, DISK_NAME_LEN + sizeof WIP_SUFFIX, "%s%s", name, WIP_SUFFIX);
}

static bool is_wip_name(const char *s) {
    for (int i = 0; i < DISK_NAME_LEN; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return !strcmp(s + DISK_NAME_LEN, WIP_SUFFIX);
}

static uint64_t read_wgen(const struct disk *d) {
    uint64_t g = 0;
    if (pread(d->gen_fd, &g, sizeof g, 8) != (ssize_t)sizeof g) return 0;
    return g;
}

/* One more marker made or removed: under DIR/.wiplock (peers; held for a read and a
 * write, never longer) and wmu (this process's threads share the descriptor, and a
 * descriptor's flock does not exclude itself). */
static void bump_wgen(struct disk *d) {
    pthread_mutex_lock(&d->wmu);
    while (flock(d->wlock_fd, LOCK_EX) && errno == EINTR) {
    }
    uint64_t g = read_wgen(d) + 1;
    if (pwrite(d->gen_fd, &g, sizeof g, 8) != (ssize_t)sizeof g)
        TERN_LOG_WARN("disk tier: updating %s/.gen: %s (peers may not see a write in flight)", d->dir, strerror(errno));
    flock(d->wlock_fd, LOCK_UN);
    pthread_mutex_unlock(&d->wmu);
}

/* Does the writer of the marker open as fd still live? */
static bool wip_alive(int fd) {
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
        flock(fd, LOCK_UN);
        return false;
    }
    return errno != EBADF;
}

static bool own_mark(struct disk *d, const char *name, uint64_t ino) {
    pthread_mutex_lock(&d->wmu);
    const struct disk_mark *m = d->own;
    while (m && (m->ino != ino || strcmp(m->name, name))) m = m->next;
    pthread_mutex_unlock(&d->wmu);
    return m != NULL;
}

/* A marker whose writer is gone: removed, unless its name now holds another one. */
static void wip_remove_stale(struct disk *d, const char *fn, uint64_t ino) {
    struct stat st;
    if (fstatat(d->dir_fd, fn, &st, AT_SYMLINK_NOFOLLOW) || (uint64_t)st.st_ino != ino) return;
    TERN_LOG_INFO("disk tier: removing %s/%s (a write announced by a process that is gone)", d->dir, fn);
    unlinkat(d->dir_fd, fn, 0);
}

/* Opens the marker of `name` and checks that it is the version ino and that its writer
 * lives. Returns the descriptor (the caller closes it) or -1. */
static int wip_open_alive(struct disk *d, const char *name, uint64_t ino, struct stat *st) {
    char fn[DISK_NAME_LEN + sizeof WIP_SUFFIX];
    wip_file(name, fn);
    int fd = open_regular(d->dir_fd, fn, O_RDONLY, 0);
    if (fd < 0) return -1;
    if (fstat(fd, st) || (ino && (uint64_t)st->st_ino != ino)) {
        close(fd);
        return -1;
    }
    if (!wip_alive(fd)) {
        wip_remove_stale(d, fn, (uint64_t)st->st_ino);
        close(fd);
        return -1;
    }
    return fd;
}

static void wip_clear(struct disk *d) {
    for (size_t i = 0; i < d->n_w; i++) entry_free(d->w[i]);
    d->n_w = 0;
}

/* Re-reads the markers of peers' writes in flight (under mu). */
static void scan_wip(struct disk *d) {
    const uint64_t g = read_wgen(d);
    wip_clear(d);
    int fd = dup(d->dir_fd);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        if (fd >= 0) close(fd);
        return;
    }
    rewinddir(dir);
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (!is_wip_name(de->d_name)) continue;
        char name[DISK_NAME_LEN + 1];
        memcpy(name, de->d_name, DISK_NAME_LEN);
        name[DISK_NAME_LEN] = 0;
        struct stat st;
        int wfd = wip_open_alive(d, name, 0, &st);
        if (wfd < 0) continue;
        struct head hd;
        char why[192];
        /* another model's or layout's marker is not this server's to judge: its writer
         * removes it */
        bool ok = !own_mark(d, name, (uint64_t)st.st_ino) && read_head(wfd, (uint64_t)st.st_size, true, &hd, why, sizeof why);
        if (ok && !head_matches(d, name, &hd, why, sizeof why)) {
            head_free(&hd);
            ok = false;
        }
        close(wfd);
        if (!ok) continue;
        struct disk_entry *e = entry_from_head(d, name, &hd, &st);
        if (!e) continue;
        if (d->n_w == d->cap_w) {
            size_t cap = d->cap_w ? d->cap_w * 2 : 8;
            struct disk_entry **p = tern_reallocarray(d->w, cap, sizeof *p);
            if (!p) {
                entry_free(e);
                continue;
            }
            d->w = p;
            d->cap_w = cap;
        }
        d->w[d->n_w++] = e;
    }
    closedir(dir);
    d->wgen = g;
    d->wscanned = true;
}

size_t disk_wip_count(struct disk *d) {
    pthread_mutex_lock(&d->mu);
    size_t n = d->n_w;
    pthread_mutex_unlock(&d->mu);
    return n;
}

const struct disk_entry *disk_wip_at(struct disk *d, size_t i) {
    pthread_mutex_lock(&d->mu);
    const struct disk_entry *e = i < d->n_w ? d->w[i] : NULL;
    pthread_mutex_unlock(&d->mu);
    return e;
}

bool disk_wip_check(struct disk *d, size_t i) {
    pthread_mutex_lock(&d->mu);
    bool alive = false;
    if (i < d->n_w) {
        struct stat st;
        int fd = wip_open_alive(d, d->w[i]->name, d->w[i]->ino, &st);
        alive = fd >= 0;
        if (alive) close(fd);
        else {
            entry_free(d->w[i]);
            memmove(d->w + i, d->w + i + 1, (d->n_w - i - 1) * sizeof *d->w);
            d->n_w--;
        }
    }
    pthread_mutex_unlock(&d->mu);
    return alive;
}

enum tern_status disk_announce(struct disk *d, const char *tenant, const char *key,
                               const uint8_t nonce[DISK_NONCE_BYTES], const int32_t *toks, uint32_t n,
                               const uint32_t *ck_pos, const uint32_t *ck_kinds, uint32_t n_ck,
                               struct disk_mark **out) {
    *out = NULL;
    tenant = tenant ? tenant : "";
    if (key && !*key) key = NULL;
    if (!d->hybrid) n_ck = 0;
    if (strlen(tenant) > MAX_STR || (key && strlen(key) > MAX_STR) || n > MAX_TOKENS || n_ck > MAX_CKPT)
        return tern_errorf(TERN_ERR_LIMIT, "disk tier: a marker of %u tokens is beyond the format's limits", n);
    for (uint32_t i = 0; i < n_ck; i++)
        if (ck_pos[i] > n || (i && ck_pos[i] <= ck_pos[i - 1]))
            return tern_errorf(TERN_ERR_INVALID, "disk tier: checkpoint positions of a marker not ascending within %u", n);
    struct file_hdr h;
    header_of(d, tenant, key, nonce, n, n_ck, &h);
    h.reserved = HDR_WIP;
    struct layout l;
    layout_of(&h, &l);
    const size_t len = (size_t)(l.tok_off + l.tok_len + 8);
    uint8_t *buf = tern_malloc(len);
    struct disk_mark *m = tern_calloc(1, sizeof *m);
    if (!buf || !m) {
        free(buf);
        free(m);
        return tern_errorf(TERN_ERR_NOMEM, "disk tier: out of memory for a marker");
    }
    const uint64_t hs = header_bytes(&h, tenant, key, buf);
    memcpy(buf + l.tok_off, toks, (size_t)n * 4);
    if (n_ck) {
        memcpy(buf + l.tok_off + (size_t)n * 4, ck_pos, (size_t)n_ck * 4);
        memcpy(buf + l.tok_off + ((size_t)n + n_ck) * 4, ck_kinds, (size_t)n_ck * 4);
    }
    const uint64_t ts = block_sum(buf + l.tok_off, (size_t)l.tok_len, hs, 0);
    memcpy(buf + l.tok_off + l.tok_len, &ts, 8);
    entry_name(d->secret, tenant, key, h.nonce, m->name);
    char tmp[128], fn[DISK_NAME_LEN + sizeof WIP_SUFFIX];
    wip_file(m->name, fn);
    pthread_mutex_lock(&d->mu);
    snprintf(tmp, sizeof tmp, ".tmp-%s-%d-%u", d->host, (int)getpid(), ++d->tmp_seq);
    pthread_mutex_unlock(&d->mu);
    enum tern_status st = TERN_OK;
    struct stat fst;
    m->fd = openat(d->dir_fd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (m->fd < 0) st = tern_errorf(TERN_ERR_IO, "disk tier: creating %s/%s: %s", d->dir, tmp, strerror(errno));
    /* locked before it has its name: no one sees it unlocked while the writer lives */
    if (!st && flock(m->fd, LOCK_EX | LOCK_NB))
        st = tern_errorf(TERN_ERR_IO, "disk tier: locking %s/%s: %s", d->dir, tmp, strerror(errno));
    if (!st) st = write_all(m->fd, buf, len, "a marker");
    if (!st && fstat(m->fd, &fst)) st = tern_errorf(TERN_ERR_IO, "disk tier: fstat: %s", strerror(errno));
    if (!st && renameat(d->dir_fd, tmp, d->dir_fd, fn))
        st = tern_errorf(TERN_ERR_IO, "disk tier: renaming to %s/%s: %s", d->dir, fn, strerror(errno));
    free(buf);
    if (st) {
        if (m->fd >= 0) {
            unlinkat(d->dir_fd, tmp, 0);
            close(m->fd);
        }
        free(m);
        return st;
    }
    m->ino = (uint64_t)fst.st_ino;
    pthread_mutex_lock(&d->wmu);
    m->next = d->own;
    d->own = m;
    pthread_mutex_unlock(&d->wmu);
    bump_wgen(d);
    *out = m;
    return TERN_OK;
}

void disk_mark_end(struct disk *d, struct disk_mark *m) {
    if (!m) return;
    char fn[DISK_NAME_LEN + sizeof WIP_SUFFIX];
    wip_file(m->name, fn);
    struct stat st;
    /* (its name may hold a newer marker of the same conversation by now: left alone) */
    if (!fstatat(d->dir_fd, fn, &st, AT_SYMLINK_NOFOLLOW) && (uint64_t)st.st_ino == m->ino) unlinkat(d->dir_fd, fn, 0);
    pthread_mutex_lock(&d->wmu);
    struct disk_mark **pp = &d->own;
    while (*pp && *pp != m) pp = &(*pp)->next;
    if (*pp) *pp = m->next;
    pthread_mutex_unlock(&d->wmu);
    close(m->fd); /* the lock goes with it */
    free(m);
    bump_wgen(d);
}

/* ---- read --------------------------------------------------------------------------------- */

/* Reads block no at off (payload n bytes) into d->io.buf and verifies it. */
/* Reads the block that ref names (what: no, n payload bytes) into d->io.buf and
 * verifies it against its own checksum and the one the version's directory holds. */
static bool get_block(struct disk *d, int fd, struct ref ref, size_t n, uint64_t hdr_sum, uint64_t no, char *why,
                      size_t why_len) {
    const uint64_t off = ref.off;
    if (buf_reserve(&d->io, n + 8)) {
        snprintf(why, why_len, "out of memory");
        return false;
    }
    int r = read_at(fd, d->io.buf, n + 8, off);
    if (r != 1) {
        snprintf(why, why_len, "reading block %llu: %s", (unsigned long long)no, r < 0 ? strerror(errno) : "short");
        return false;
    }
    uint64_t sum;
    memcpy(&sum, d->io.buf + n, 8);
    if (sum != ref.sum || block_sum(d->io.buf, n, hdr_sum, no) != sum) {
        snprintf(why, why_len, "checksum mismatch in block %llx (offset %llu)", (unsigned long long)no,
                 (unsigned long long)off);
        return false;
    }
    d->st.load_bytes += n + 8;
    return true;
}

static enum tern_status load(struct disk *d, size_t idx, uint32_t r, const char *tenant, struct tern_session **out,
                             struct tern_checkpoint ***cks_out, uint32_t **kinds_out, size_t *n_cks_out);

/* The index lock is held throughout (the worker's buffer; the entry stays where it is):
 * the writer thread waits for it only at the start and the end of a write. */
enum tern_status disk_load(struct disk *d, size_t idx, uint32_t r, const char *tenant, struct tern_session **out,
                           struct tern_checkpoint ***cks_out, uint32_t **kinds_out, size_t *n_cks_out) {
    pthread_mutex_lock(&d->mu);
    enum tern_status st = load(d, idx, r, tenant, out, cks_out, kinds_out, n_cks_out);
    pthread_mutex_unlock(&d->mu);
    gen_flush(d);
    return st;
}

static enum tern_status load(struct disk *d, size_t idx, uint32_t r, const char *tenant, struct tern_session **out,
                             struct tern_checkpoint ***cks_out, uint32_t **kinds_out, size_t *n_cks_out) {
    *out = NULL;
    *cks_out = NULL;
    *kinds_out = NULL;
    *n_cks_out = 0;
    if (idx >= d->n) return tern_errorf(TERN_ERR_INVALID, "disk tier: no entry %zu", idx);
    struct disk_entry *e = d->e[idx];
    char name[DISK_NAME_LEN + 1];
    memcpy(name, e->name, sizeof name);
    char fn[DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX];
    file_of(name, fn);
    tenant = tenant ? tenant : "";
    if (strcmp(e->tenant, tenant)) return tern_errorf(TERN_ERR_STATE, "disk tier: %s belongs to another tenant", fn);
    int fd = open_regular(d->dir_fd, fn, O_RDONLY, 0);
    if (fd < 0) {
        index_drop(d, idx); /* a peer removed it (or put something other than a file there) */
        return tern_errorf(TERN_ERR_STATE, "disk tier: %s is gone (%s)", fn,
                           errno == EINVAL ? "not a regular file" : strerror(errno));
    }
    char why[192] = "";
    struct head hd = {0};
    struct tern_session *s = NULL;
    struct tern_checkpoint **cks = NULL;
    uint32_t *kinds = NULL;
    size_t n_cks = 0;
    enum tern_status st = TERN_OK;
    struct stat fst;
    if (fstat(fd, &fst)) {
        close(fd);
        return tern_errorf(TERN_ERR_IO, "disk tier: fstat %s: %s", fn, strerror(errno));
    }
    if (!read_head(fd, (uint64_t)fst.st_size, false, &hd, why, sizeof why) || !head_matches(d, name, &hd, why, sizeof why))
        goto invalid;
    /* The decision was made on the index's token list: the file must still hold it (a
     * peer may have replaced it since). The tenant inside the checksummed header must be
     * the request's. */
    if (hd.tok_sum != e->tok_sum || hd.n != e->n) {
        head_free(&hd);
        close(fd);
        d->scanned = false; /* re-read at the next refresh */
        return tern_errorf(TERN_ERR_STATE, "disk tier: %s changed since it was indexed", fn);
    }
    if (strcmp(hd.tenant, tenant)) {
        snprintf(why, sizeof why, "the tenant inside it is not the one its index entry had");
        goto invalid;
    }
    if (r > hd.n) {
        st = tern_errorf(TERN_ERR_RANGE, "disk tier: resume point %u beyond the file's %u tokens", r, hd.n);
        goto fail;
    }
    /* The recurrent state at r: the live one at n, else checkpoint r. */
    const void *rec = NULL;
    if (d->rec_bytes) {
        uint32_t blk = 0;
        if (r != hd.n) {
            uint32_t i = 0;
            while (i < hd.n_ck && hd.ckpt_pos[i] != r) i++;
            if (i == hd.n_ck) {
                st = tern_errorf(TERN_ERR_STATE, "disk tier: %s has no checkpoint at %u", fn, r);
                goto fail;
            }
            blk = 1 + i;
        }
        if (!get_block(d, fd, hd.refs[blk], d->rec_bytes, hd.hdr_sum, blk_rec(r), why, sizeof why)) goto invalid;
        rec = d->io.buf;
    }
    st = tern_session_import(d->model, &d->sp, hd.tokens, r, rec, &s);
    if (st) {
        if (st == TERN_ERR_FORMAT) {
            snprintf(why, sizeof why, "%s", tern_last_error());
            goto invalid;
        }
        goto fail;
    }
    for (uint32_t pg = 0; pg * KV_BLOCK < r; pg++) {
        uint32_t rows = page_rows(hd.n, pg);
        if (!get_block(d, fd, hd.refs[ref_kv(&hd.h, hd.n_ck, pg)], (size_t)rows * d->kv_row_bytes, hd.hdr_sum,
                       blk_kv(pg, rows), why, sizeof why))
            goto invalid;
        uint32_t p1 = r < pg * KV_BLOCK + rows ? r : pg * KV_BLOCK + rows;
        if ((st = tern_session_kv_import(s, pg * KV_BLOCK, p1, d->io.buf, rows))) goto fail;
    }
    /* Checkpoints at or below r stay valid for the resumed conversation. */
    if (d->rec_bytes && hd.n_ck) {
        cks = tern_calloc(hd.n_ck, sizeof *cks);
        kinds = tern_calloc(hd.n_ck, sizeof *kinds);
        if (!cks || !kinds) {
            st = tern_errorf(TERN_ERR_NOMEM, "disk tier: out of memory");
            goto fail;
        }
        for (uint32_t i = 0; i < hd.n_ck && hd.ckpt_pos[i] <= r; i++) {
            if (!get_block(d, fd, hd.refs[1 + i], d->rec_bytes, hd.hdr_sum, blk_rec(hd.ckpt_pos[i]), why, sizeof why))
                goto invalid;
            if ((st = tern_checkpoint_import(s, hd.ckpt_pos[i], d->io.buf, d->rec_bytes, &cks[n_cks]))) goto fail;
            kinds[n_cks++] = hd.ckpt_kinds[i];
        }
    }
    /* Recency for the budget (shared with peers through atime). */
    struct timespec ts[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
    futimens(fd, ts);
    e->last_used = now_ns();
    index_sort(d);
    d->st.loads++;
    head_free(&hd);
    close(fd);
    *out = s;
    *cks_out = cks;
    *kinds_out = kinds;
    *n_cks_out = n_cks;
    return TERN_OK;
invalid:
    st = tern_errorf(TERN_ERR_FORMAT, "disk tier: %s/%s is invalid: %s", d->dir, fn, why);
    invalidate(d, name, why);
fail:
    for (size_t i = 0; i < n_cks; i++) tern_checkpoint_free(cks[i]);
    free(cks);
    free(kinds);
    tern_session_free(s);
    head_free(&hd);
    close(fd);
    return st;
}

/* ---- inspection ------------------------------------------------------------------------ */

enum tern_status disk_scan_dir(const char *path, void (*fn)(void *user, const struct disk_file_info *fi), void *user) {
    DIR *dir = opendir(path);
    if (!dir) return tern_errorf(TERN_ERR_IO, "opening %s: %s", path, strerror(errno));
    int dfd = dirfd(dir);
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (!is_entry_name(de->d_name)) continue;
        struct disk_file_info fi = {0};
        memcpy(fi.name, de->d_name, DISK_NAME_LEN);
        int fd = open_regular(dfd, de->d_name, O_RDONLY, 0);
        struct stat st;
        if (fd < 0 || fstat(fd, &st)) {
            if (fd >= 0) close(fd);
            continue;
        }
        fi.bytes = (uint64_t)st.st_size;
        uint64_t at = ts_ns(&st.st_atim), mt = ts_ns(&st.st_mtim);
        fi.last_used = at > mt ? at : mt;
        struct head hd;
        if (read_head(fd, (uint64_t)st.st_size, false, &hd, fi.why, sizeof fi.why)) {
            fi.valid = true;
            snprintf(fi.tenant, sizeof fi.tenant, "%s", hd.tenant);
            fi.named = hd.key != NULL;
            snprintf(fi.key, sizeof fi.key, "%s", hd.key ? hd.key : "");
            fi.n_tokens = hd.n;
            fi.n_ckpt = hd.n_ck;
            fi.model_id = hd.h.model_id;
            fi.layout = hd.h.layout;
            head_free(&hd);
        }
        close(fd);
        fn(user, &fi);
    }
    closedir(dir);
    return TERN_OK;
}

enum tern_status disk_unlink(const char *path, const char *name) {
    char fn[DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX];
    snprintf(fn, sizeof fn, "%.*s%s", DISK_NAME_LEN, name, DISK_FILE_SUFFIX);
    if (!is_entry_name(fn) || (strlen(name) != DISK_NAME_LEN && strcmp(name, fn)))
        return tern_errorf(TERN_ERR_INVALID, "'%s' is not an entry name (32 hex digits)", name);
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return tern_errorf(TERN_ERR_IO, "opening %s: %s", path, strerror(errno));
    int lfd = open_regular(dfd, ".lock", O_RDWR | O_CREAT, 0600);
    int gfd = open_regular(dfd, ".gen", O_RDWR | O_CREAT, 0600);
    enum tern_status st = TERN_OK;
    if (lfd < 0 || gfd < 0 || flock(lfd, LOCK_EX)) {
        st = tern_errorf(TERN_ERR_IO, "locking %s/.lock: %s", path, strerror(errno));
    } else {
        if (unlinkat(dfd, fn, 0)) st = tern_errorf(TERN_ERR_IO, "deleting %s/%s: %s", path, fn, strerror(errno));
        uint64_t g = 0;
        if (pread(gfd, &g, sizeof g, 0) != (ssize_t)sizeof g) g = 0;
        g++;
        if (pwrite(gfd, &g, sizeof g, 0) != (ssize_t)sizeof g && !st)
            st = tern_errorf(TERN_ERR_IO, "updating %s/.gen: %s", path, strerror(errno));
        flock(lfd, LOCK_UN);
    }
    if (lfd >= 0) close(lfd);
    if (gfd >= 0) close(gfd);
    close(dfd);
    return st;
}
