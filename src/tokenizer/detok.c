/* Token ids back to text: pieces (precomputed at load), whole sequences, and the
 * streaming detokenizer that never hands out a broken UTF-8 sequence. */
#include "tokenizer/tok-internal.h"

#include "util/mem.h"
#include "util/utf8.h"

#include <stdlib.h>
#include <string.h>

static enum tern_status bad_id(const struct tern_tokenizer *t, int32_t id) {
    return tern_errorf(TERN_ERR_RANGE, "token id %d is outside the vocabulary (%u tokens)", id, t->n_vocab);
}

const char *tern_token_piece_ref(const struct tern_tokenizer *t, int32_t id, int flags, size_t *len) {
    if (id < 0 || (uint32_t)id >= t->n_vocab) {
        *len = 0;
        return NULL;
    }
    uint8_t kind = t->piece_kind[id];
    if (kind == PIECE_NONE || (kind == PIECE_SPECIAL && !(flags & TERN_TOK_PARSE_SPECIAL))) {
        *len = 0;
        return t->piece_pool + t->piece_off[id];
    }
    *len = t->piece_len[id];
    return t->piece_pool + t->piece_off[id];
}

enum tern_status tern_token_piece(const struct tern_tokenizer *t, int32_t id, int flags, struct tern_buf *out) {
    size_t len;
    const char *p = tern_token_piece_ref(t, id, flags, &len);
    if (!p) return bad_id(t, id);
    return tern_buf_append(out, p, len);
}

enum tern_status tern_detokenize(const struct tern_tokenizer *t, const int32_t *ids, size_t n, int flags,
                                 struct tern_buf *out) {
    if (!t || !out || (!ids && n)) return tern_errorf(TERN_ERR_INVALID, "tern_detokenize: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_vocab) return bad_id(t, ids[i]);
    size_t begin = 0, end = n;
    if (flags & TERN_TOK_ADD_SPECIAL) {
        if (t->add_bos && end > begin && ids[begin] == t->bos) begin++;
        if (t->add_eos && end > begin && ids[end - 1] == t->eos) end--;
    }
    size_t len0 = out->len;
    bool strip = t->add_space_prefix;
    for (size_t i = begin; i < end; i++) {
        size_t len;
        const char *p = tern_token_piece_ref(t, ids[i], flags, &len);
        if (!len) continue;
        if (strip) {
            /* The dummy prefix tokenize added to the first text fragment. */
            strip = false;
            if (*p == ' ') {
                p++;
                len--;
            }
        }
        enum tern_status st = tern_buf_append(out, p, len);
        if (st) {
            out->len = len0;
            if (out->data) out->data[len0] = 0;
            return st;
        }
    }
    return TERN_OK;
}

/* ---- streaming ------------------------------------------------------------------------ */

struct tern_detok {
    const struct tern_tokenizer *t;
    int flags;
    uint8_t pend[4]; /* a proper prefix of a well-formed sequence (at most 3 bytes) */
    size_t n_pend;
};

enum tern_status tern_detok_new(const struct tern_tokenizer *t, int flags, struct tern_detok **out) {
    if (!out) return tern_errorf(TERN_ERR_INVALID, "tern_detok_new: out is NULL");
    *out = NULL;
    if (!t) return tern_errorf(TERN_ERR_INVALID, "tern_detok_new: no tokenizer");
    struct tern_detok *d = tern_calloc(1, sizeof *d);
    if (!d) return tern_errorf(TERN_ERR_NOMEM, "no memory for a detokenizer");
    d->t = t;
    d->flags = flags;
    *out = d;
    return TERN_OK;
}

/* Appends p[0..n) to out: well-formed sequences as they are, each ill-formed maximal
 * subpart as U+FFFD; a trailing proper prefix goes to d->pend. */
static enum tern_status feed(struct tern_detok *d, const uint8_t *p, size_t n, struct tern_buf *out) {
    enum tern_status st;
    size_t i = 0;
    /* First complete (or give up on) what was held back, a byte at a time: the held
     * bytes are a valid prefix, so a new byte completes it, extends it, or breaks it
     * (then the held bytes are one maximal subpart and the new byte starts afresh). */
    while (d->n_pend && i < n) {
        d->pend[d->n_pend++] = p[i++];
        size_t bad, k = tern_utf8_seq(d->pend, d->n_pend, &bad);
        if (k) {
            if ((st = tern_buf_append(out, d->pend, k))) return st;
            d->n_pend = 0;
        } else if (bad) {
            if ((st = tern_buf_append(out, TERN_UTF8_REPLACEMENT, 3))) return st;
            d->n_pend = 0;
            i--;
        }
    }
    if (i == n) return TERN_OK; /* (all of p went to the held bytes, which may still wait) */
    /* the rest by util/utf8.h's sanitiser; an incomplete sequence at the end is held back */
    size_t held;
    if ((st = tern_utf8_sanitize_stream(out, (const char *)p + i, n - i, &held))) return st;
    memcpy(d->pend, p + n - held, held);
    d->n_pend = held;
    return TERN_OK;
}

enum tern_status tern_detok_push(struct tern_detok *d, int32_t id, struct tern_buf *out) {
    size_t len;
    const char *p = tern_token_piece_ref(d->t, id, d->flags, &len);
    if (!p) return bad_id(d->t, id);
    if (!len) return TERN_OK;
    size_t len0 = out->len, n_pend0 = d->n_pend;
    uint8_t pend0[4];
    memcpy(pend0, d->pend, sizeof pend0);
    enum tern_status st = feed(d, (const uint8_t *)p, len, out);
    if (st) {
        out->len = len0;
        if (out->data) out->data[len0] = 0;
        memcpy(d->pend, pend0, sizeof pend0);
        d->n_pend = n_pend0;
    }
    return st;
}

enum tern_status tern_detok_flush(struct tern_detok *d, struct tern_buf *out) {
    if (!d->n_pend) return TERN_OK;
    enum tern_status st = tern_buf_append(out, TERN_UTF8_REPLACEMENT, 3);
    if (!st) d->n_pend = 0;
    return st;
}

size_t tern_detok_pending(const struct tern_detok *d) { return d->n_pend; }

void tern_detok_free(struct tern_detok *d) { free(d); }
