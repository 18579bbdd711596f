/* The disk tier's I/O (disk-impl.h): a conversation written (appended as a version)
 * and read back, writes in flight announced to peers, inspection. */
#include "cache/disk-impl.h"
#include "model/mtp.h"

/* ---- write ------------------------------------------------------------------------------ */

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
    h->created_ns = dk_now_ns();
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
    ref->sum = dk_block_sum(p, n, hdr_sum, no);
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
                          const uint32_t *kinds, size_t n_cks, const struct disk_mtp *mtp) {
    if (!(key && *key) && !*has_nonce) {
        enum tern_status st = disk_nonce_new(nonce);
        if (st) return st;
        *has_nonce = true;
    }
    return disk_put_io(d, &d->io, tenant, key, nonce, s, cks, kinds, n_cks, mtp);
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
    const size_t n_refs = dk_n_refs_of(n, n_ck, d->rec_bytes != 0);
    memset(refs, 0, n_refs * sizeof *refs);
    uint32_t lcp = 0;
    if (base) {
        const uint32_t lim = n < base->n ? n : base->n;
        while (lcp < lim && toks[lcp] == base->tokens[lcp]) lcp++;
    }
    uint64_t bytes = dk_dir_bytes(n, n_ck, d->rec_bytes != 0) + 8 + sizeof(struct slot);
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
        else bytes += dk_ref_len(h, n, n_ck, i) + 8;
    }
    return bytes;
}

/* Which of the MTP head's pages (hn rows, row 0 at main position hbase) the file's
 * current version holds: a page of the same place whose bytes are these (the head's
 * rows depend on where its rows were fed as well as on the tokens, so the bytes decide:
 * each candidate page is exported into io's buffer and its checksum compared with the
 * one the file holds). hrefs[pg].off = 0: to be written. Returns the bytes to write. */
static uint64_t plan_head_reuse(const struct disk *d, struct disk_io *io, const struct head *base,
                                const struct tern_mtp *h, uint32_t hbase, uint32_t hn, struct ref *hrefs) {
    const uint32_t pages = (hn + KV_BLOCK - 1) / KV_BLOCK;
    memset(hrefs, 0, pages * sizeof *hrefs);
    uint64_t bytes = head_dir_bytes(hn);
    for (uint32_t pg = 0; pg < pages; pg++) {
        const uint32_t rows = page_rows(hn, pg);
        const size_t len = (size_t)rows * d->mtp_row_bytes;
        if (base && base->mtp.n && base->mtp.base == hbase && pg * KV_BLOCK < base->mtp.n &&
            page_rows(base->mtp.n, pg) == rows &&
            !tern_mtp_kv_export(h, pg * KV_BLOCK, pg * KV_BLOCK + rows, io->buf) &&
            dk_block_sum(io->buf, len, base->hdr_sum, blk_head(hbase, pg, rows)) == base->mtp.refs[pg].sum)
            hrefs[pg] = base->mtp.refs[pg];
        else
            bytes += len + 8;
    }
    return bytes;
}

/* The file's current version, when it is this conversation's and this model's: opened
 * for appending (*fd), read into base. */
static bool open_base(struct disk *d, const char *fn, const char *name, const char *tenant, struct head *base,
                      int *fd, uint64_t *size) {
    *fd = dk_open_regular(d->dir_fd, fn, O_RDWR, 0);
    if (*fd < 0) return false;
    struct stat st;
    char why[192];
    if (!fstat(*fd, &st) && dk_read_head(*fd, (uint64_t)st.st_size, false, base, why, sizeof why)) {
        if (dk_head_matches(d, name, base, why, sizeof why) && !strcmp(base->tenant, tenant)) {
            *size = (uint64_t)st.st_size;
            return true;
        }
        dk_head_free(base);
    }
    close(*fd);
    *fd = -1;
    return false;
}

/* The checkpoints a version holds: those at positions in (previous, n], in order, whose
 * bytes can be read (a checkpoint kept on the device is read back here; one whose bytes
 * cannot be, a lost device, logged, is left out of the file). Returns how many. */
static uint32_t put_checkpoints(uint32_t n, struct tern_checkpoint *const *cks, const uint32_t *kinds, size_t n_cks,
                                uint32_t *pos, uint32_t *knd, const void **recs) {
    uint32_t n_ck = 0;
    for (size_t i = 0; i < n_cks && n_ck < MAX_CKPT; i++) {
        if (!cks[i]) continue;
        uint32_t p = tern_checkpoint_pos(cks[i]);
        if (p > n || (n_ck && p <= pos[n_ck - 1])) continue;
        const void *rec = tern_checkpoint_data(cks[i]);
        if (!rec) continue;
        pos[n_ck] = p;
        knd[n_ck] = kinds ? kinds[i] : 0;
        recs[n_ck++] = rec;
    }
    return n_ck;
}

/* The budget holds over the directory, peers' files included: the index brought up to
 * date, then the least recently used files but `name` removed until `need` more bytes fit
 * (d->mu and the directory's lock held). */
static void put_make_room(struct disk *d, const char *name, uint64_t need) {
    if (!d->scanned || dk_read_gen(d) != d->gen) dk_scan(d, false);
    long same = dk_find_entry(d, name);
    uint64_t have = d->total_bytes - (same >= 0 ? d->e[same]->bytes : 0);
    dk_index_sort(d);
    for (size_t i = d->n; have + need > d->max_bytes && i-- > 0;) {
        if (!strcmp(d->e[i]->name, name)) continue;
        have -= d->e[i]->bytes;
        dk_remove_file(d, i, "least recently used, for the --cache-disk budget");
        d->st.evictions++;
        d->gen_dirty = true;
    }
    if (d->gen_dirty) dk_bump_gen_locked(d);
}

/* The version's blocks the file lacks (refs[i].off 0) appended at *off: the recurrent
 * states (s's at its end, the checkpoints') and the KV pages, exported a page at a time
 * into io's buffer. No index lock: s and the checkpoints are the caller's to keep
 * unchanged until this returns. */
static enum tern_status put_blocks(struct disk *d, struct disk_io *io, int fd, uint64_t *off, const struct file_hdr *h,
                                   uint64_t hdr_sum, const struct tern_session *s, uint32_t n, const uint32_t *pos,
                                   const void *const *recs, uint32_t n_ck, struct ref *refs) {
    const bool rec = d->rec_bytes != 0;
    const size_t n_refs = dk_n_refs_of(n, n_ck, rec);
    enum tern_status st = TERN_OK;
    for (size_t i = 0; !st && i < n_refs; i++) {
        if (refs[i].off) continue; /* held by the file already */
        if (rec && i <= n_ck) {
            const void *rb = i == 0 ? tern_session_rec_data(s) : recs[i - 1]; /* NULL: a device's download failed */
            st = rb ? put_block(d, fd, off, rb, d->rec_bytes, hdr_sum, blk_rec(i == 0 ? n : pos[i - 1]), &refs[i])
                    : TERN_ERR_IO;
        } else {
            const uint32_t pg = (uint32_t)(i - ref_kv(h, n_ck, 0)), rows = page_rows(n, pg);
            st = tern_session_kv_export(s, pg * KV_BLOCK, pg * KV_BLOCK + rows, io->buf);
            if (!st)
                st = put_block(d, fd, off, io->buf, (size_t)rows * d->kv_row_bytes, hdr_sum, blk_kv(pg, rows), &refs[i]);
        }
    }
    return st;
}

/* The MTP head's pages the file lacks (hrefs[pg].off 0), as put_blocks. */
static enum tern_status put_head_blocks(struct disk *d, struct disk_io *io, int fd, uint64_t *off, uint64_t hdr_sum,
                                        const struct tern_mtp *h, uint32_t hbase, uint32_t hn, struct ref *hrefs) {
    enum tern_status st = TERN_OK;
    for (uint32_t pg = 0; !st && pg * KV_BLOCK < hn; pg++) {
        if (hrefs[pg].off) continue;
        const uint32_t rows = page_rows(hn, pg);
        st = tern_mtp_kv_export(h, pg * KV_BLOCK, pg * KV_BLOCK + rows, io->buf);
        if (!st)
            st = put_block(d, fd, off, io->buf, (size_t)rows * d->mtp_row_bytes, hdr_sum, blk_head(hbase, pg, rows),
                           &hrefs[pg]);
    }
    return st;
}

/* The written version into the index as ne (taken: indexed or freed); without memory for
 * it the file is left for the next scan to index (d->mu held). */
static void put_index(struct disk *d, struct disk_entry *ne, const char *name, const char *tenant, const char *key,
                      const uint8_t *nonce, const int32_t *toks, uint32_t n, const uint32_t *pos,
                      const uint32_t *knd, uint32_t n_ck, const struct stat *fst, uint64_t tok_sum) {
    memcpy(ne->name, name, DISK_NAME_LEN + 1);
    ne->tenant = tern_strdup(tenant);
    ne->key = key ? tern_strdup(key) : NULL;
    ne->tokens = tern_malloc((size_t)n * 4 + 4);
    ne->ckpt_pos = tern_malloc((size_t)n_ck * 4 + 4);
    ne->ckpt_kinds = tern_malloc((size_t)n_ck * 4 + 4);
    if (!ne->tenant || (key && !ne->key) || !ne->tokens || !ne->ckpt_pos || !ne->ckpt_kinds) {
        dk_entry_free(ne); /* the file is complete; the next scan indexes it */
        long i = dk_find_entry(d, name);
        if (i >= 0) dk_index_drop(d, (size_t)i);
        d->scanned = false;
    } else {
        memcpy(ne->tokens, toks, (size_t)n * 4);
        memcpy(ne->ckpt_pos, pos, (size_t)n_ck * 4);
        memcpy(ne->ckpt_kinds, knd, (size_t)n_ck * 4);
        memcpy(ne->nonce, nonce, DISK_NONCE_BYTES);
        ne->n = n;
        ne->n_ckpt = n_ck;
        ne->bytes = (uint64_t)fst->st_size;
        ne->tok_sum = tok_sum;
        ne->ino = (uint64_t)fst->st_ino;
        ne->mtime_ns = dk_ts_ns(&fst->st_mtim);
        ne->last_used = dk_now_ns();
        if (ne->last_used < ne->mtime_ns) ne->last_used = ne->mtime_ns;
        if (d->sep && fp_compute(d->sep, ne->tokens, n, &ne->fp) != TERN_OK) ne->fp.n = 0;
        dk_index_put(d, ne, true);
        dk_index_sort(d);
    }
}

/* The write holds the directory's lock (through io's descriptor) from the budget to the
 * new version's slot (or the rename), as every writer does, so that peers' budgets see a
 * consistent directory and no two writers append to one file; it holds d->mu only for
 * the index work, so that the worker's decisions and loads go on while it writes. */
enum tern_status disk_put_io(struct disk *d, struct disk_io *io, const char *tenant, const char *key,
                             const uint8_t nonce[DISK_NONCE_BYTES], const struct tern_session *s,
                             struct tern_checkpoint *const *cks, const uint32_t *kinds, size_t n_cks,
                             const struct disk_mtp *mtp) {
    tenant = tenant ? tenant : "";
    if (key && !*key) key = NULL;
    if (strlen(tenant) > MAX_STR || (key && strlen(key) > MAX_STR))
        return tern_errorf(TERN_ERR_LIMIT, "disk tier: tenant or key longer than %u bytes", MAX_STR);
    const uint32_t n = tern_session_n_past(s);
    const int32_t *toks = tern_session_tokens(s);
    if (n > MAX_TOKENS) return tern_errorf(TERN_ERR_LIMIT, "disk tier: %u tokens exceed the file format's limit", n);
    uint32_t pos[MAX_CKPT], knd[MAX_CKPT];
    const void *recs[MAX_CKPT];
    const uint32_t n_ck = d->hybrid ? put_checkpoints(n, cks, kinds, n_cks, pos, knd, recs) : 0;
    struct file_hdr h;
    header_of(d, tenant, key, nonce, 0, 0, &h);
    const bool rec = d->rec_bytes != 0;
    const size_t n_refs = dk_n_refs_of(n, n_ck, rec);
    /* the MTP head: its rows as far as the format and its tokens reach */
    const struct tern_mtp *hm = mtp && mtp->h && d->mtp_row_bytes ? mtp->h : NULL;
    const uint32_t hbase = hm ? mtp->base : 0;
    uint32_t hn = hm ? tern_mtp_n_past(hm) : 0;
    if ((uint64_t)hbase + hn > MAX_TOKENS) hn = 0;
    const uint32_t h_pages = (hn + KV_BLOCK - 1) / KV_BLOCK;
    const uint64_t dlen = dk_dir_bytes(n, n_ck, rec) + head_dir_bytes(hn);
    /* the whole version, as a new file writes it */
    const uint64_t live = blocks_off(&h) + dlen + 8 + (rec ? (1ull + n_ck) * (d->rec_bytes + 8) : 0) +
                          (uint64_t)n * d->kv_row_bytes + (uint64_t)((n + KV_BLOCK - 1) / KV_BLOCK) * 8 +
                          (uint64_t)hn * d->mtp_row_bytes + (uint64_t)h_pages * 8;
    if (live > d->max_bytes)
        return tern_errorf(TERN_ERR_RANGE, "disk tier: the conversation's %llu bytes exceed the whole --cache-disk budget (%llu)",
                           (unsigned long long)live, (unsigned long long)d->max_bytes);
    char name[DISK_NAME_LEN + 1];
    dk_entry_name(d->secret, tenant, key, h.nonce, name);

    uint8_t *hbuf = tern_malloc((size_t)blocks_off(&h));
    struct disk_entry *ne = tern_calloc(1, sizeof *ne);
    uint8_t *dir = tern_malloc((size_t)dlen + 8);
    struct ref *refs = tern_malloc(n_refs * sizeof *refs + sizeof *refs);
    struct ref *hrefs = tern_malloc(h_pages * sizeof *hrefs + sizeof *hrefs);
    const size_t row_max = d->kv_row_bytes > d->mtp_row_bytes ? d->kv_row_bytes : d->mtp_row_bytes;
    enum tern_status st = dk_buf_reserve(io, (size_t)KV_BLOCK * row_max + 64);
    if (!st && (!hbuf || !ne || !dir || !refs || !hrefs)) st = tern_errorf(TERN_ERR_NOMEM, "disk tier: out of memory");
    if (st) {
        free(hbuf);
        free(ne);
        free(dir);
        free(refs);
        free(hrefs);
        return st;
    }
    memcpy(dir, toks, (size_t)n * 4);
    memcpy(dir + (size_t)n * 4, pos, (size_t)n_ck * 4);
    memcpy(dir + ((size_t)n + n_ck) * 4, knd, (size_t)n_ck * 4);
    /* (the head's part of the directory: its row bytes and tokens now, its refs below) */
    uint8_t *hdir = dir + dk_dir_bytes(n, n_ck, rec);
    if (hn) {
        const uint64_t rb = d->mtp_row_bytes;
        memcpy(hdir, &rb, 8);
        memcpy(hdir + 8, tern_mtp_tokens(hm), (size_t)hn * 4);
    }

    char tmp[128];
    char fn[DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX];
    dk_file_of(name, fn);
    const uint64_t t0 = tern_now_ns();
    struct head base = {0};
    int fd = -1;
    uint64_t base_size = 0, add = 0, wrote = 0;
    bool append = false;
    if (!dk_dir_lock(io)) {
        st = tern_errorf(TERN_ERR_IO, "disk tier: locking %s/.lock: %s", d->dir, strerror(errno));
        pthread_mutex_lock(&d->mu);
        goto out_nolock;
    }
    /* What the file holds already (under the directory's lock: no one else writes it
     * meanwhile): appended to unless the superseded bytes would outweigh half the live. */
    if (open_base(d, fn, name, tenant, &base, &fd, &base_size)) {
        add = plan_reuse(d, &base, &h, toks, n, pos, n_ck, refs) + plan_head_reuse(d, io, &base, hm, hbase, hn, hrefs);
        /* (a version 2 file is not appended to: its header says it holds no heads) */
        append = base_size + add <= live + live / 2 && base.h.version == FILE_VERSION;
        if (!append) {
            close(fd);
            fd = -1;
        }
    }
    if (!append) {
        memset(refs, 0, n_refs * sizeof *refs);
        memset(hrefs, 0, h_pages * sizeof *hrefs);
    }
    const uint64_t hdr_sum = append ? base.hdr_sum : header_bytes(&h, tenant, key, hbuf);
    pthread_mutex_lock(&d->mu);
    snprintf(tmp, sizeof tmp, ".tmp-%s-%d-%u", d->host, (int)getpid(), ++d->tmp_seq);
    put_make_room(d, name, append ? base_size + add : live);
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
    if (!st) st = put_blocks(d, io, fd, &off, &h, hdr_sum, s, n, pos, recs, n_ck, refs);
    if (!st && hn) st = put_head_blocks(d, io, fd, &off, hdr_sum, hm, hbase, hn, hrefs);
    struct ref dref = {0};
    memcpy(dir + ((size_t)n + 2u * n_ck) * 4, refs, n_refs * sizeof *refs);
    if (hn) memcpy(hdir + 8 + (size_t)hn * 4, hrefs, h_pages * sizeof *hrefs);
    if (!st) st = put_block(d, fd, &off, dir, (size_t)dlen, hdr_sum, BLK_DIR, &dref);
    /* the version's blocks are on disk before the slot that names them */
    if (!st && fsync(fd)) st = tern_errorf(TERN_ERR_IO, "fsync: %s", strerror(errno));
    const int si = append ? 1 - base.slot_i : 0;
    struct slot sl = {.seq = append ? base.sl.seq + 1 : 1, .n_tokens = n, .n_ckpt = n_ck, .dir_off = dref.off,
                      .dir_len = dlen, .dir_sum = dref.sum, .total = off,
                      .head = hn ? (uint64_t)hbase << 32 | hn : 0};
    sl.sum = dk_slot_sum(&sl, hdr_sum, si);
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
    dk_bump_gen_locked(d);
    put_index(d, ne, name, tenant, key, h.nonce, toks, n, pos, knd, n_ck, &fst, dref.sum);
    ne = NULL;
    d->st.writes++;
    d->st.write_bytes += wrote;
    TERN_LOG_DEBUG("disk tier: wrote %s (%u tokens, %u checkpoints, %u MTP head rows, %llu of its %llu bytes%s) in %.1f ms",
                   fn, n, n_ck, hn, (unsigned long long)wrote, (unsigned long long)fst.st_size, append ? ", appended" : "",
                   (double)(tern_now_ns() - t0) * 1e-6);
out:
    /* (d->mu held from here) */
    dk_dir_unlock(io);
out_nolock:
    if (st) d->st.write_errors++;
    pthread_mutex_unlock(&d->mu);
    dk_head_free(&base);
    free(ne);
    free(hbuf);
    free(dir);
    free(refs);
    free(hrefs);
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

uint64_t dk_read_wgen(const struct disk *d) {
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
    uint64_t g = dk_read_wgen(d) + 1;
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
    int fd = dk_open_regular(d->dir_fd, fn, O_RDONLY, 0);
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

void dk_wip_clear(struct disk *d) {
    for (size_t i = 0; i < d->n_w; i++) dk_entry_free(d->w[i]);
    d->n_w = 0;
}

/* Re-reads the markers of peers' writes in flight (under mu). */
void dk_scan_wip(struct disk *d) {
    const uint64_t g = dk_read_wgen(d);
    dk_wip_clear(d);
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
        bool ok = !own_mark(d, name, (uint64_t)st.st_ino) && dk_read_head(wfd, (uint64_t)st.st_size, true, &hd, why, sizeof why);
        if (ok && !dk_head_matches(d, name, &hd, why, sizeof why)) {
            dk_head_free(&hd);
            ok = false;
        }
        close(wfd);
        if (!ok) continue;
        struct disk_entry *e = dk_entry_from_head(d, name, &hd, &st);
        if (!e) continue;
        if (d->n_w == d->cap_w) {
            size_t cap = d->cap_w ? d->cap_w * 2 : 8;
            struct disk_entry **p = tern_reallocarray(d->w, cap, sizeof *p);
            if (!p) {
                dk_entry_free(e);
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
            dk_entry_free(d->w[i]);
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
    dk_layout_of(&h, &l);
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
    const uint64_t ts = dk_block_sum(buf + l.tok_off, (size_t)l.tok_len, hs, 0);
    memcpy(buf + l.tok_off + l.tok_len, &ts, 8);
    dk_entry_name(d->secret, tenant, key, h.nonce, m->name);
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
    if (!st) st = dk_write_all(m->fd, buf, len, "a marker");
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
    if (dk_buf_reserve(&d->io, n + 8)) {
        snprintf(why, why_len, "out of memory");
        return false;
    }
    int r = dk_read_at(fd, d->io.buf, n + 8, off);
    if (r != 1) {
        snprintf(why, why_len, "reading block %llu: %s", (unsigned long long)no, r < 0 ? strerror(errno) : "short");
        return false;
    }
    uint64_t sum;
    memcpy(&sum, d->io.buf + n, 8);
    if (sum != ref.sum || dk_block_sum(d->io.buf, n, hdr_sum, no) != sum) {
        snprintf(why, why_len, "checksum mismatch in block %llx (offset %llu)", (unsigned long long)no,
                 (unsigned long long)off);
        return false;
    }
    d->st.load_bytes += n + 8;
    return true;
}

static enum tern_status load(struct disk *d, size_t idx, uint32_t r, const char *tenant, struct tern_session **out,
                             struct tern_checkpoint ***cks_out, uint32_t **kinds_out, size_t *n_cks_out,
                             struct disk_mtp *mtp);

/* The index lock is held throughout (the worker's buffer; the entry stays where it is):
 * the writer thread waits for it only at the start and the end of a write. */
enum tern_status disk_load(struct disk *d, size_t idx, uint32_t r, const char *tenant, struct tern_session **out,
                           struct tern_checkpoint ***cks_out, uint32_t **kinds_out, size_t *n_cks_out,
                           struct disk_mtp *mtp) {
    pthread_mutex_lock(&d->mu);
    enum tern_status st = load(d, idx, r, tenant, out, cks_out, kinds_out, n_cks_out, mtp);
    pthread_mutex_unlock(&d->mu);
    dk_gen_flush(d);
    return st;
}

/* The head's rows of main positions below r - 1 from hd into a new head for s (*out
 * NULL when there are none). false: a block did not verify (why says which). */
static bool load_head(struct disk *d, int fd, const struct head *hd, uint32_t r, struct tern_session *s,
                      struct tern_mtp **out, char *why, size_t why_len) {
    *out = NULL;
    const struct head_part *mh = &hd->mtp;
    const uint32_t keep = r > mh->base + 1 ? (r - 1 - mh->base < mh->n ? r - 1 - mh->base : mh->n) : 0;
    if (!keep || !d->mtp_row_bytes) return true;
    struct tern_mtp *h = NULL;
    enum tern_status st = tern_mtp_import(s, mh->tokens, keep, &h);
    for (uint32_t pg = 0; !st && pg * KV_BLOCK < keep; pg++) {
        const uint32_t rows = page_rows(mh->n, pg);
        if (!get_block(d, fd, mh->refs[pg], (size_t)rows * d->mtp_row_bytes, hd->hdr_sum, blk_head(mh->base, pg, rows),
                       why, why_len)) {
            tern_mtp_free(h);
            return false;
        }
        const uint32_t p1 = keep < pg * KV_BLOCK + rows ? keep : pg * KV_BLOCK + rows;
        st = tern_mtp_kv_import(h, pg * KV_BLOCK, p1, d->io.buf, rows);
    }
    if (st) {
        TERN_LOG_WARN("disk tier: the MTP head left out (it starts afresh): %s", tern_last_error());
        tern_mtp_free(h);
        return true;
    }
    *out = h;
    return true;
}

static enum tern_status load(struct disk *d, size_t idx, uint32_t r, const char *tenant, struct tern_session **out,
                             struct tern_checkpoint ***cks_out, uint32_t **kinds_out, size_t *n_cks_out,
                             struct disk_mtp *mtp) {
    if (mtp) *mtp = (struct disk_mtp){0};
    *out = NULL;
    *cks_out = NULL;
    *kinds_out = NULL;
    *n_cks_out = 0;
    if (idx >= d->n) return tern_errorf(TERN_ERR_INVALID, "disk tier: no entry %zu", idx);
    struct disk_entry *e = d->e[idx];
    char name[DISK_NAME_LEN + 1];
    memcpy(name, e->name, sizeof name);
    char fn[DISK_NAME_LEN + sizeof DISK_FILE_SUFFIX];
    dk_file_of(name, fn);
    tenant = tenant ? tenant : "";
    if (strcmp(e->tenant, tenant)) return tern_errorf(TERN_ERR_STATE, "disk tier: %s belongs to another tenant", fn);
    int fd = dk_open_regular(d->dir_fd, fn, O_RDONLY, 0);
    if (fd < 0) {
        dk_index_drop(d, idx); /* a peer removed it (or put something other than a file there) */
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
    if (!dk_read_head(fd, (uint64_t)fst.st_size, false, &hd, why, sizeof why) || !dk_head_matches(d, name, &hd, why, sizeof why))
        goto invalid;
    /* The decision was made on the index's token list: the file must still hold it (a
     * peer may have replaced it since). The tenant inside the checksummed header must be
     * the request's. */
    if (hd.tok_sum != e->tok_sum || hd.n != e->n) {
        dk_head_free(&hd);
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
    /* The MTP head's rows below the resume point */
    if (mtp && hd.mtp.n) {
        if (!load_head(d, fd, &hd, r, s, &mtp->h, why, sizeof why)) goto invalid;
        mtp->base = hd.mtp.base;
    }
    /* Recency for the budget (shared with peers through atime). */
    struct timespec ts[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
    futimens(fd, ts);
    e->last_used = dk_now_ns();
    dk_index_sort(d);
    d->st.loads++;
    dk_head_free(&hd);
    close(fd);
    *out = s;
    *cks_out = cks;
    *kinds_out = kinds;
    *n_cks_out = n_cks;
    return TERN_OK;
invalid:
    st = tern_errorf(TERN_ERR_FORMAT, "disk tier: %s/%s is invalid: %s", d->dir, fn, why);
    dk_invalidate(d, name, why);
fail:
    for (size_t i = 0; i < n_cks; i++) tern_checkpoint_free(cks[i]);
    free(cks);
    free(kinds);
    tern_session_free(s);
    dk_head_free(&hd);
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
        if (!dk_is_entry_name(de->d_name)) continue;
        struct disk_file_info fi = {0};
        memcpy(fi.name, de->d_name, DISK_NAME_LEN);
        int fd = dk_open_regular(dfd, de->d_name, O_RDONLY, 0);
        struct stat st;
        if (fd < 0 || fstat(fd, &st)) {
            if (fd >= 0) close(fd);
            continue;
        }
        fi.bytes = (uint64_t)st.st_size;
        uint64_t at = dk_ts_ns(&st.st_atim), mt = dk_ts_ns(&st.st_mtim);
        fi.last_used = at > mt ? at : mt;
        struct head hd;
        if (dk_read_head(fd, (uint64_t)st.st_size, false, &hd, fi.why, sizeof fi.why)) {
            fi.valid = true;
            snprintf(fi.tenant, sizeof fi.tenant, "%s", hd.tenant);
            fi.named = hd.key != NULL;
            snprintf(fi.key, sizeof fi.key, "%s", hd.key ? hd.key : "");
            fi.n_tokens = hd.n;
            fi.n_ckpt = hd.n_ck;
            fi.model_id = hd.h.model_id;
            fi.layout = hd.h.layout;
            dk_head_free(&hd);
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
    if (!dk_is_entry_name(fn) || (strlen(name) != DISK_NAME_LEN && strcmp(name, fn)))
        return tern_errorf(TERN_ERR_INVALID, "'%s' is not an entry name (32 hex digits)", name);
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return tern_errorf(TERN_ERR_IO, "opening %s: %s", path, strerror(errno));
    int lfd = dk_open_regular(dfd, ".lock", O_RDWR | O_CREAT, 0600);
    int gfd = dk_open_regular(dfd, ".gen", O_RDWR | O_CREAT, 0600);
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
