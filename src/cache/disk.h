/* The disk tier under the RAM pool (DESIGN.md §9): parked conversations in a directory,
 * so that they survive a restart and replicas that share the directory resume each
 * other's conversations.
 *
 * One file per conversation: a header bound to the model (identity hash) and to tern's
 * state layout, with the tenant and session key, then versions: the exact token list
 * and checkpoint positions, the recurrent state at the end, each checkpoint's recurrent
 * state, and the KV rows page by page. Every block carries an xxh3 checksum. The next
 * turn of a conversation appends only the blocks its file does not hold and makes them
 * a version through a checksummed slot after an fsync, so a reader sees a complete
 * version or the one before; a new file is written to a temporary name, fsync'd and
 * renamed. A file that does not verify (another model or layout, torn,
 * truncated, a flipped byte, a name that does not match its tenant and key) is logged,
 * deleted and never used: it costs a cold prime, never a wrong resume.
 *
 * File names are a keyed hash (a per-directory random secret, created 0600 on first
 * use) of tenant + key (named sessions) or tenant + a random nonce (unnamed ones): they
 * reveal neither. Files are 0600.
 *
 * Several processes may share a directory: writers hold an advisory lock (flock on
 * DIR/.lock) while they enforce the byte budget and rename, and bump a generation
 * counter (DIR/.gen) that readers poll to pick up entries written by a peer.
 *
 * The index (what is on disk: tenant, key, token list, checkpoint positions,
 * fingerprint) lives in memory and is rebuilt from the directory at open. The decision
 * to resume from a file is made by cache.c on the index's token list, the same rule as
 * in RAM; disk_load re-verifies that the file still holds those tokens.
 *
 * Threads: the engine worker (decisions, loads, and writes when the writer's queue is
 * full) and the cache's writer thread (disk_put_io with a disk_io of its own). The index
 * is guarded by a mutex that a write holds only for its index work (the refresh and the
 * budget before it, the new entry after it), never while it writes or fsyncs, so that
 * the worker's decisions go on meanwhile. Index entries (disk_at) stay valid while the
 * caller holds disk_lock; a choice made by index position must be loaded under the same
 * hold (the writer may add or evict entries in between otherwise). */
#ifndef TERN_CACHE_DISK_H
#define TERN_CACHE_DISK_H

#include "tern.h"
#include "cache/fingerprint.h"
#include "util/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DISK_NONCE_BYTES 16
#define DISK_NAME_LEN 32 /* hex digits of the 128-bit keyed hash */
#define DISK_FILE_SUFFIX ".tern"

struct disk;
struct tern_mtp;

struct disk_params {
    const char *dir;                       /* created (0700) when missing */
    uint64_t max_bytes;                    /* budget over the directory's entry files */
    struct tern_model *model;
    struct tern_session_params session;    /* for the sessions disk_load creates */
    const struct fp_separators *sep;       /* fingerprints of stored token lists (may be NULL) */
    unsigned test_block_delay_ms;          /* tests only (TERN_TEST_DISK_DELAY_MS): a pause after
                                            * each block written, so a test can kill a write */
};

/* Opens (creating) the directory and rebuilds the index from it; invalid files found
 * on the way are deleted. Errors name the path and the reason. */
enum tern_status disk_open(const struct disk_params *p, struct disk **out);
void disk_free(struct disk *d);

/* An index entry (read-only for callers; valid until the next disk_* call that may
 * change the index: disk_refresh, disk_put, disk_load, and, unless the caller holds
 * disk_lock, any write of the writer thread). */
struct disk_entry {
    char name[DISK_NAME_LEN + 1];
    char *tenant;
    char *key;                  /* NULL: unnamed */
    uint8_t nonce[DISK_NONCE_BYTES];
    int32_t *tokens;            /* [n] */
    uint32_t n;
    uint32_t *ckpt_pos;         /* [n_ckpt] ascending, each <= n */
    uint32_t *ckpt_kinds;       /* [n_ckpt] the cache's PLAN_CKPT_* bits (opaque here) */
    uint32_t n_ckpt;
    struct fingerprint fp;
    uint64_t bytes;             /* the file's size */
    uint64_t last_used;         /* ns: max(mtime, atime); a load touches atime */
    uint64_t tok_sum;           /* checksum of the token block (what the decision saw) */
    /* what identifies the file version that was indexed */
    uint64_t ino, mtime_ns;
    bool seen;                  /* scratch of a directory scan */
};

/* The index lock (recursive; every call below takes it too): hold it from a look at the
 * index (disk_count, disk_at) to the disk_load of what was chosen there. Never across a
 * disk_put (lock order: the directory's lock, then this). */
void disk_lock(struct disk *d);
void disk_unlock(struct disk *d);

/* Picks up a peer's changes (cheap when the generation counter did not move). */
void disk_refresh(struct disk *d);
size_t disk_count(struct disk *d);
/* Entries in recency order, most recently used first. */
const struct disk_entry *disk_at(struct disk *d, size_t i);

/* The MTP head kept with a conversation (model/mtp.h; the speculative decoder's): its
 * row 0 is at main position base. */
struct disk_mtp {
    struct tern_mtp *h;
    uint32_t base;
};

/* Writes a conversation's state: its tokens, KV rows and recurrent state at n_past and
 * the given checkpoints (hybrid models; cks[i] at ascending positions <= n_past, NULL
 * entries skipped), and its MTP head when mtp is not NULL (its rows [0, n_past)). The file name comes from tenant + key, or for an unnamed entry
 * from tenant + *nonce (generated when *has_nonce is false). Replaces the file of the
 * same name. Evicts least recently used files to stay within the budget; a state
 * larger than the whole budget is not written (TERN_ERR_RANGE). On error nothing under
 * the final name changed and the message says why (e.g. no space left on device). */
enum tern_status disk_put(struct disk *d, const char *tenant, const char *key, uint8_t nonce[DISK_NONCE_BYTES],
                          bool *has_nonce, const struct tern_session *s, struct tern_checkpoint *const *cks,
                          const uint32_t *kinds, size_t n_cks, const struct disk_mtp *mtp);

/* What a thread other than the worker needs to write: a descriptor of the directory's
 * lock of its own (the worker's and the writer's exclude each other like peers do) and
 * its KV export buffer. Freed before the disk. */
struct disk_io;
enum tern_status disk_io_new(struct disk *d, struct disk_io **out);
void disk_io_free(struct disk_io *io);
/* A fresh random nonce (an unnamed conversation's file name). */
enum tern_status disk_nonce_new(uint8_t nonce[DISK_NONCE_BYTES]);
/* disk_put through io, from any thread, with the nonce already chosen (unnamed entries).
 * It reads s (tokens, KV rows [0, n_past), recurrent state), the checkpoints and the head
 * while it writes, without a copy: the caller keeps them unchanged and alive until it
 * returns. */
enum tern_status disk_put_io(struct disk *d, struct disk_io *io, const char *tenant, const char *key,
                             const uint8_t nonce[DISK_NONCE_BYTES], const struct tern_session *s,
                             struct tern_checkpoint *const *cks, const uint32_t *kinds, size_t n_cks,
                             const struct disk_mtp *mtp);

/* Loads entry i's state at resume point r (r == its n, a checkpoint position, or for
 * attention-only models any r <= n) as a new session positioned at r, with the
 * checkpoints at positions <= r (caller frees: *cks and each element). tenant must be
 * the entry's (checked against the file's header again). The file must still hold the
 * token list the index had (else TERN_ERR_STATE: it changed under us, nothing is
 * deleted). A file that does not verify is deleted (TERN_ERR_FORMAT). With mtp set (NULL:
 * not wanted), the MTP head the file holds comes back in it (mtp->h NULL: none) with its
 * rows of main positions below r - 1 (the row of p was fed the token at p + 1); a head
 * that cannot be rebuilt (memory) is left out, logged, not an error. */
enum tern_status disk_load(struct disk *d, size_t i, uint32_t r, const char *tenant, struct tern_session **out,
                           struct tern_checkpoint ***cks, uint32_t **kinds, size_t *n_cks, struct disk_mtp *mtp);

/* ---- writes in flight (replicas) -------------------------------------------------------
 * An agent's next turn may reach a peer while this replica is still writing the turn
 * before. So a write is announced before the response's last byte: a marker DIR/NAME.wip
 * with the new version's token list, locked by the writer for as long as it lives
 * (flock: a writer that dies, kill -9 included, leaves a marker no one waits for). A
 * peer whose best resume point would be that version waits for the file (the caller
 * decides how long) instead of resuming from less. */
struct disk_mark;
/* Announces the write of (tenant, key | nonce) at tokens[0..n) with checkpoints at
 * ck_pos (ascending, <= n; hybrid models only). The marker lives until disk_mark_end
 * (from any thread), which the caller calls once the write is done or given up. */
enum tern_status disk_announce(struct disk *d, const char *tenant, const char *key,
                               const uint8_t nonce[DISK_NONCE_BYTES], const int32_t *toks, uint32_t n,
                               const uint32_t *ck_pos, const uint32_t *ck_kinds, uint32_t n_ck,
                               struct disk_mark **out);
void disk_mark_end(struct disk *d, struct disk_mark *m);
/* Peers' writes in flight, as index entries (the token list of the version being
 * written; bytes is the marker's size), as of the last disk_refresh. Entries are valid
 * as disk_at's are. disk_wip_check re-checks entry i (the marker is still there and its
 * writer lives); one that fails is dropped from the list (stale markers are removed). */
size_t disk_wip_count(struct disk *d);
const struct disk_entry *disk_wip_at(struct disk *d, size_t i);
bool disk_wip_check(struct disk *d, size_t i);

/* Deletes a file by name (its index entry goes too). */
void disk_remove(struct disk *d, const char *name);

struct disk_stats {
    uint64_t writes, write_bytes, write_errors;
    uint64_t loads, load_bytes;
    uint64_t invalid;           /* files found invalid and deleted */
    uint64_t evictions;         /* files deleted for the budget */
    uint64_t bytes;             /* entry files' bytes now */
    uint32_t entries;
};
void disk_get_stats(struct disk *d, struct disk_stats *out);

/* ---- inspection (tern cache ls|rm), no model needed ---------------------------------- */

struct disk_file_info {
    char name[DISK_NAME_LEN + 1];
    bool valid;                 /* the header and token block verify */
    char why[128];              /* when !valid */
    char tenant[64];            /* truncated for display */
    char key[64];
    bool named;
    uint32_t n_tokens, n_ckpt;
    uint64_t model_id, layout;
    uint64_t bytes, last_used;
};
/* Calls fn for every entry file of dir. */
enum tern_status disk_scan_dir(const char *dir, void (*fn)(void *user, const struct disk_file_info *fi), void *user);
/* Deletes the entry file `name` (32 hex digits, with or without the suffix) of dir under
 * the directory's lock, so that serving replicas pick the change up. */
enum tern_status disk_unlink(const char *dir, const char *name);

#endif
