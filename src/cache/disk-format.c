/* The disk tier's file format (disk-impl.h): names, headers, versions, reading and
 * verifying a file's head. */
#include "cache/disk-impl.h"

/* ---- small helpers --------------------------------------------------------------------- */

uint64_t dk_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t dk_ts_ns(const struct timespec *ts) { return (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec; }

uint64_t dk_block_sum(const void *p, size_t n, uint64_t hdr_sum, uint64_t block_no) {
    return XXH3_64bits_withSeed(p, n, hdr_sum ^ (0x9E3779B97F4A7C15ull * (block_no + 1)));
}

enum tern_status dk_write_all(int fd, const void *p, size_t n, const char *what) {
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
int dk_read_at(int fd, void *p, size_t n, uint64_t off) {
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

enum tern_status dk_buf_reserve(struct disk_io *io, size_t n) {
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
void dk_entry_name(const uint8_t *secret, const char *tenant, const char *key, const uint8_t *nonce,
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

bool dk_is_entry_name(const char *s) {
    for (int i = 0; i < DISK_NAME_LEN; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return !strcmp(s + DISK_NAME_LEN, DISK_FILE_SUFFIX);
}

void dk_file_of(const char *name, char out[DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX]) {
    snprintf(out, DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX, "%s%s", name, DISK_FILE_SUFFIX);
}

/* ---- layout ------------------------------------------------------------------------- */






uint64_t dk_slot_sum(const struct slot *v, uint64_t hdr_sum, int i) {
    return XXH3_64bits_withSeed(v, offsetof(struct slot, sum), hdr_sum ^ (0xC2B2AE3D27D4EB4Full * (uint64_t)(i + 1)));
}

size_t dk_n_refs_of(uint32_t n, uint32_t n_ck, bool rec) {
    return (rec ? 1u + n_ck : 0u) + (n + KV_BLOCK - 1) / KV_BLOCK;
}

uint64_t dk_dir_bytes(uint32_t n, uint32_t n_ck, bool rec) {
    return ((uint64_t)n + 2ull * n_ck) * 4 + dk_n_refs_of(n, n_ck, rec) * sizeof(struct ref);
}


uint64_t dk_ref_len(const struct file_hdr *h, uint32_t n, uint32_t n_ck, size_t i) {
    if (h->rec_bytes && i <= n_ck) return h->rec_bytes;
    return (uint64_t)page_rows(n, (uint32_t)(i - ref_kv(h, n_ck, 0))) * h->kv_row_bytes;
}

/* The header's counts are bounded before anything is multiplied. */
bool dk_layout_of(const struct file_hdr *h, struct layout *l) {
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

static bool read_marker_tokens(int fd, uint64_t file_size, const uint8_t *first, size_t got, struct head *hd,
                               char *why, size_t why_len);
static bool read_version(int fd, uint64_t file_size, const uint8_t *first, size_t got, struct head *hd, char *why,
                         size_t why_len);

void dk_head_free(struct head *hd) {
    free(hd->tenant);
    free(hd->key);
    free(hd->tokens);
    free(hd->ckpt_pos);
    free(hd->ckpt_kinds);
    free(hd->refs);
    free(hd->mtp.tokens);
    free(hd->mtp.refs);
    memset(hd, 0, sizeof *hd);
}

/* Reads and verifies the header and the token block of an open file. On success *out
 * is a new index entry (without name/ino/times). why: the reason when it is invalid;
 * returns false then. Does not need a model when d is NULL-like (inspection): model
 * checks happen only when expect_model. */
bool dk_read_head(int fd, uint64_t file_size, bool marker, struct head *hd, char *why, size_t why_len) {
    memset(hd, 0, sizeof *hd);
    /* room for the largest header; the first read takes HEAD_READ bytes */
    uint8_t first[HEAD_READ + sizeof(struct file_hdr) + 2 * MAX_STR + 8];
    size_t got = file_size < HEAD_READ ? (size_t)file_size : HEAD_READ;
    if (got < sizeof hd->h + 8) {
        snprintf(why, why_len, "%llu bytes is too short for a header", (unsigned long long)file_size);
        return false;
    }
    if (dk_read_at(fd, first, got, 0) != 1) {
        snprintf(why, why_len, "reading the header: %s", strerror(errno));
        return false;
    }
    memcpy(&hd->h, first, sizeof hd->h);
    const struct file_hdr *h = &hd->h;
    if (memcmp(h->magic, FILE_MAGIC, 8)) {
        snprintf(why, why_len, "not a tern disk-tier file (bad magic)");
        return false;
    }
    if (h->version != FILE_VERSION && h->version != 2) { /* (2: the same, without MTP heads) */
        snprintf(why, why_len, "file format version %u, this tern reads 2 and %u", h->version, FILE_VERSION);
        return false;
    }
    if (h->tenant_len <= MAX_STR && h->key_len <= MAX_STR && h->hdr_bytes == sizeof *h + h->tenant_len + h->key_len &&
        h->hdr_bytes + 8 > got && h->hdr_bytes + 8 <= file_size) {
        /* a long tenant or key: the rest of the header */
        if (dk_read_at(fd, first + got, h->hdr_bytes + 8 - got, got) != 1) {
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
        dk_head_free(hd);
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
        dk_head_free(hd);
        snprintf(why, why_len, "tenant or key contains a NUL byte");
        return false;
    }
    if ((h->reserved == HDR_WIP) != marker) {
        dk_head_free(hd);
        snprintf(why, why_len, "%s", marker ? "not a marker" : "a marker where a file should be");
        return false;
    }
    if (h->rec_bytes > (1ull << 36) || h->kv_row_bytes > (1ull << 26)) {
        dk_head_free(hd);
        snprintf(why, why_len, "state sizes out of range");
        return false;
    }
    const bool ok = marker ? read_marker_tokens(fd, file_size, first, got, hd, why, why_len)
                           : read_version(fd, file_size, first, got, hd, why, why_len);
    if (!ok) {
        dk_head_free(hd);
        return false;
    }
    for (uint32_t i = 0; i < hd->n_ck; i++) {
        if (hd->ckpt_pos[i] > hd->n || (i && hd->ckpt_pos[i] <= hd->ckpt_pos[i - 1])) {
            snprintf(why, why_len, "checkpoint position %u (index %u) is not ascending within %u tokens",
                     hd->ckpt_pos[i], i, hd->n);
            dk_head_free(hd);
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
    return dk_read_at(fd, p, n, off);
}

/* A marker's token block (the header's counts, right after the header). */
static bool read_marker_tokens(int fd, uint64_t file_size, const uint8_t *first, size_t got, struct head *hd,
                               char *why, size_t why_len) {
    const struct file_hdr *h = &hd->h;
    if (!dk_layout_of(h, &hd->l)) {
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
    if (dk_block_sum(blk, (size_t)hd->l.tok_len, hd->hdr_sum, BLK_DIR) != hd->tok_sum) {
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
        if (v->seq == 0 || v->sum != dk_slot_sum(v, hd->hdr_sum, i)) continue;
        const uint32_t hn = (uint32_t)v->head;
        if (v->n_tokens > MAX_TOKENS || v->n_ckpt > MAX_CKPT || hn > MAX_TOKENS || (hn && h->version < 3) ||
            v->dir_len != dk_dir_bytes(v->n_tokens, v->n_ckpt, h->rec_bytes != 0) + head_dir_bytes(hn) ||
            v->dir_off < bo || v->dir_off + v->dir_len + 8 > v->total)
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
    const size_t n_refs = dk_n_refs_of(hd->n, hd->n_ck, h->rec_bytes != 0);
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
    if (sum != v->dir_sum || dk_block_sum(dir, (size_t)v->dir_len, hd->hdr_sum, BLK_DIR) != sum) {
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
    o += n_refs * sizeof *hd->refs;
    hd->mtp = (struct head_part){.n = (uint32_t)v->head, .base = (uint32_t)(v->head >> 32)};
    struct head_part *mh = &hd->mtp;
    const size_t mh_pages = (mh->n + KV_BLOCK - 1) / KV_BLOCK;
    if (mh->n) {
        memcpy(&mh->row_bytes, dir + o, 8);
        mh->tokens = tern_malloc((size_t)mh->n * 4);
        mh->refs = tern_malloc(mh_pages * sizeof *mh->refs);
        if (!mh->tokens || !mh->refs) {
            free(dir);
            snprintf(why, why_len, "out of memory");
            return false;
        }
        memcpy(mh->tokens, dir + o + 8, (size_t)mh->n * 4);
        memcpy(mh->refs, dir + o + 8 + (size_t)mh->n * 4, mh_pages * sizeof *mh->refs);
        if (mh->row_bytes == 0 || mh->row_bytes > (1ull << 26) || (uint64_t)mh->base + mh->n > MAX_TOKENS) {
            free(dir);
            snprintf(why, why_len, "its MTP head's geometry is out of range");
            return false;
        }
    }
    free(dir);
    for (size_t pg = 0; pg < mh_pages; pg++) {
        const uint64_t len = (uint64_t)page_rows(mh->n, (uint32_t)pg) * mh->row_bytes + 8;
        if (mh->refs[pg].off < bo || mh->refs[pg].off > v->total || len > v->total - mh->refs[pg].off) {
            snprintf(why, why_len, "MTP head block %zu lies outside the file", pg);
            return false;
        }
    }
    /* every block inside the version's extent */
    for (size_t i = 0; i < n_refs; i++) {
        const uint64_t len = dk_ref_len(h, hd->n, hd->n_ck, i) + 8;
        if (hd->refs[i].off < bo || hd->refs[i].off > v->total || len > v->total - hd->refs[i].off) {
            snprintf(why, why_len, "block %zu lies outside the file", i);
            return false;
        }
    }
    return true;
}

/* The checks that need this directory's model and secret. */
bool dk_head_matches(const struct disk *d, const char *name, const struct head *hd, char *why, size_t why_len) {
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
    if (hd->mtp.n && hd->mtp.row_bytes != d->mtp_row_bytes) {
        snprintf(why, why_len, "its MTP head's rows are of %llu bytes, this model's %zu",
                 (unsigned long long)hd->mtp.row_bytes, d->mtp_row_bytes);
        return false;
    }
    if (!d->hybrid && hd->n_ck) {
        snprintf(why, why_len, "checkpoints in a file of an attention-only model");
        return false;
    }
    char expect[DISK_NAME_LEN + 1];
    dk_entry_name(d->secret, hd->tenant, hd->key, h->nonce, expect);
    if (strcmp(expect, name)) {
        snprintf(why, why_len, "its name does not match the tenant and key inside it (moved or copied)");
        return false;
    }
    return true;
}

/* An index entry of the verified head hd (taken over) of the file `name` (stat st). */
struct disk_entry *dk_entry_from_head(const struct disk *d, const char *name, struct head *hd0,
                                          const struct stat *st) {
    struct head hd = *hd0;
    memset(hd0, 0, sizeof *hd0);
    struct disk_entry *e = tern_calloc(1, sizeof *e);
    if (!e) {
        dk_head_free(&hd);
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
    e->mtime_ns = dk_ts_ns(&st->st_mtim);
    uint64_t at = dk_ts_ns(&st->st_atim);
    e->last_used = at > e->mtime_ns ? at : e->mtime_ns;
    if (d->sep && fp_compute(d->sep, e->tokens, e->n, &e->fp) != TERN_OK) e->fp.n = 0;
    e->seen = true;
    dk_head_free(&hd);
    return e;
}

