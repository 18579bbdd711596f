/* The disk tier's files (disk.h, DESIGN.md §9), internal to disk-format.c (the file
 * format: names, headers, versions, reading a head), disk-index.c (the index of a
 * directory, its locks and counters, open and close) and disk.c (writing and reading
 * conversations, writes in flight, inspection).
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
#ifndef TERN_CACHE_DISK_IMPL_H
#define TERN_CACHE_DISK_IMPL_H
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
#define FILE_VERSION 3u /* 3: a version may hold the MTP head (2 is read, never appended to) */
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
     * (refresh, budget, dk_index_put), never while it writes, fsyncs or waits for the
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
    size_t mtp_row_bytes;      /* a row of the model's MTP head (0: the model has none) */
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


/* ---- the format ---- */

struct layout {
    uint64_t tok_off, tok_len;   /* payload offset and length of the token block */
    uint64_t rec_off;            /* first recurrent block (live), then one per checkpoint */
    uint64_t kv_off;             /* first KV page block */
    uint64_t total;
    uint32_t n_pages;
};

static inline uint32_t page_rows(uint32_t n, uint32_t pg) {
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
    uint64_t head;              /* the MTP head's rows (low 32 bits) and base (high 32); 0: none */
    uint64_t sum;               /* of the above, seeded with the header's and the slot's index */
};
_Static_assert(sizeof(struct slot) == 64, "a version slot is 64 bytes on disk");

struct ref {
    uint64_t off, sum;
};

#define BLK_DIR 0ull
static inline uint64_t blk_rec(uint32_t pos) { return (1ull << 40) | pos; }
static inline uint64_t blk_kv(uint32_t pg, uint32_t rows) { return (2ull << 40) | ((uint64_t)pg << 12) | rows; }
/* the MTP head's KV page pg of rows rows, its row 0 at main position base */
static inline uint64_t blk_head(uint32_t base, uint32_t pg, uint32_t rows) {
    return (3ull << 60) | ((uint64_t)base << 28) | ((uint64_t)pg << 12) | rows;
}

static inline uint64_t slots_off(const struct file_hdr *h) { return ((uint64_t)h->hdr_bytes + 8 + 7) & ~7ull; }
static inline uint64_t blocks_off(const struct file_hdr *h) { return slots_off(h) + 2 * sizeof(struct slot); }

/* Reference i of a version: 0 the state at its end, 1 + c checkpoint c's (models with a
 * recurrent state), then the KV pages. */
static inline size_t ref_kv(const struct file_hdr *h, uint32_t n_ck, uint32_t pg) {
    return (h->rec_bytes ? 1u + n_ck : 0u) + pg;
}

/* The MTP head a version holds (DESIGN.md §9; model/mtp.h): at the end of the
 * directory, when the slot's head field is not 0, its row bytes (u64), its tokens
 * ([n] i32) and a reference to each of its KV pages (KV_BLOCK rows each). Row i is the
 * main position base + i (the speculative decoder's numbering). */
struct head_part {
    uint32_t n, base;
    uint64_t row_bytes;
    int32_t *tokens;
    struct ref *refs;
};
static inline uint64_t head_dir_bytes(uint32_t n) {
    return n ? 8 + (uint64_t)n * 4 + (uint64_t)((n + KV_BLOCK - 1) / KV_BLOCK) * sizeof(struct ref) : 0;
}

/* A file's head, read and verified (dk_read_head). */
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
    struct head_part mtp;       /* entry files: the version's MTP head (mtp.n 0: none) */
};

/* ---- across the files: each function where it lives ---- */

/* disk-format.c */
uint64_t dk_now_ns(void);
uint64_t dk_ts_ns(const struct timespec *ts);
uint64_t dk_block_sum(const void *p, size_t n, uint64_t hdr_sum, uint64_t block_no);
enum tern_status dk_write_all(int fd, const void *p, size_t n, const char *what);
int dk_read_at(int fd, void *p, size_t n, uint64_t off);
enum tern_status dk_buf_reserve(struct disk_io *io, size_t n);
void dk_entry_name(const uint8_t *secret, const char *tenant, const char *key, const uint8_t *nonce,
                   char out[DISK_NAME_LEN + 1]);
bool dk_is_entry_name(const char *s);
void dk_file_of(const char *name, char out[DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX]);
uint64_t dk_slot_sum(const struct slot *v, uint64_t hdr_sum, int i);
size_t dk_n_refs_of(uint32_t n, uint32_t n_ck, bool rec);
uint64_t dk_dir_bytes(uint32_t n, uint32_t n_ck, bool rec);
uint64_t dk_ref_len(const struct file_hdr *h, uint32_t n, uint32_t n_ck, size_t i);
bool dk_layout_of(const struct file_hdr *h, struct layout *l);
void dk_head_free(struct head *hd);
bool dk_read_head(int fd, uint64_t file_size, bool marker, struct head *hd, char *why, size_t why_len);
bool dk_head_matches(const struct disk *d, const char *name, const struct head *hd, char *why, size_t why_len);
struct disk_entry *dk_entry_from_head(const struct disk *d, const char *name, struct head *hd0, const struct stat *st);
/* disk-index.c */
void dk_entry_free(struct disk_entry *e);
long dk_find_entry(const struct disk *d, const char *name);
void dk_index_drop(struct disk *d, size_t i);
void dk_index_sort(struct disk *d);
void dk_index_put(struct disk *d, struct disk_entry *e, bool replace);
bool dk_dir_lock(struct disk_io *io);
void dk_dir_unlock(struct disk_io *io);
void dk_bump_gen_locked(struct disk *d);
void dk_gen_flush(struct disk *d);
uint64_t dk_read_gen(const struct disk *d);
void dk_invalidate(struct disk *d, const char *name, const char *why);
int dk_open_regular(int dir_fd, const char *fn, int flags, mode_t mode);
void dk_scan(struct disk *d, bool at_open);
void dk_remove_file(struct disk *d, size_t i, const char *why);
/* disk.c */
uint64_t dk_read_wgen(const struct disk *d);
void dk_wip_clear(struct disk *d);
void dk_scan_wip(struct disk *d);
#endif
